/*
 * comm_internal.h - the MPI transport's state behind mc_grid.impl, shared by
 * mpi.c (set-up), reduce.c (blocking collectives), async.c (requests and the
 * worker thread) and watchdog.c (deadlines).
 */
#ifndef MC_COMM_INTERNAL_H
#define MC_COMM_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include "mc/comm.h"
#include "mc/comm_stats.h"

/* Deadline keeper: the main thread marks the start and end of every blocking
 * call; the watchdog thread aborts the job when one lasts too long. */
typedef struct mc_watchdog mc_watchdog;
mc_status mc_watchdog_start(mc_watchdog **out, int rank, double minutes, mc_error *err);
void mc_watchdog_configure(mc_watchdog *wd, double minutes, const char *prog);
/* Another watchdog of the same rank, deadline and program name (and the
 * same MC_TEST_FAULT_COMM hook, counting its own calls), for a second
 * thread's calls (mc_grid_dup_world). */
mc_status mc_watchdog_start_like(const mc_watchdog *like, mc_watchdog **out, mc_error *err);
void mc_watchdog_enter(mc_watchdog *wd, const char *op, mc_group_kind k);
/* Point to point: peer is the other end's world rank, named on expiry. */
void mc_watchdog_enter_peer(mc_watchdog *wd, const char *op, mc_group_kind k, int peer);
/* The world rank of group rank peer of communicator c (-1 if none). */
int mc_comm_world_rank(MPI_Comm c, int peer);
void mc_watchdog_leave(mc_watchdog *wd);
void mc_watchdog_stop(mc_watchdog *wd);

/* Staging memory of the fixed-order reduction (backend memory, grown on
 * demand), one per thread that runs collectives. */
typedef struct mc_scratch {
    mc_backend *be;
    float *p;
    size_t cap; /* floats */
} mc_scratch;

typedef struct mc_async mc_async; /* async.c: queue and worker */
typedef struct mc_nccl mc_nccl;   /* nccl.c: NCCL communicators (CUDA builds) */

typedef struct mc_comm {
    MPI_Comm comm[MC_GROUP_COUNT]; /* MPI_COMM_NULL where this rank is no member */
    int own_mpi;                   /* we called MPI_Init: we finalize */
    int thread_level;              /* what MPI_Init_thread provided */
    mc_watchdog *wd;               /* NULL for a world of 1 */
    mc_scratch scratch;            /* the main thread's */
    mc_async *async;               /* NULL until the first non-blocking collective */
    mc_nccl *nccl;                 /* NULL until the first collective on device memory */
    int device_mpi;                /* MC_DEVICE_COMM=mpi: device memory staged through host
                                    * memory and MPI (reduce.c, "staged") instead of NCCL */
    mc_backend *host_be;           /* the staged path's sums: a one-thread CPU backend, made
                                    * on first use */
    mc_scratch host_scratch;       /* and its scratch (the main thread's) */
    float *stage;                  /* the staged path's host copy, grown (reduce.c) */
    size_t stage_cap;              /* floats */
    mc_comm_stat stats[MC_GROUP_COUNT][MC_COLL_COUNT]; /* stats.c; the calling thread's */
} mc_comm;

/* The blocking bodies (reduce.c), run by the caller's thread or the worker;
 * group of more than one member, communicator c. */
/* The host collectives' piece (reduce.c; 0: the default, 4 Mi floats); for
 * tests that want many pieces from small vectors. */
void mc_comm_set_piece_floats(size_t n);
mc_status mc_comm_allreduce_sum(MPI_Comm c, mc_group_kind k, mc_scratch *s, mc_backend *be,
                                float *x, size_t n, mc_error *err);
mc_status mc_comm_reduce_scatter_sum(MPI_Comm c, mc_group_kind k, mc_scratch *s, mc_backend *be,
                                     const float *in, float *out, size_t n, mc_error *err);
mc_status mc_comm_allgather(MPI_Comm c, mc_group_kind k, mc_backend *be, const float *in,
                            float *out, size_t n, mc_error *err);
void mc_scratch_free(mc_scratch *s);

/* For the collective entry points: checks membership and the backend, sets
 * *c; returns MC_OK with *c = MPI_COMM_NULL when there is nothing to do. */
mc_status mc_comm_group(const mc_grid *g, mc_group_kind k, mc_backend *be, const char *op,
                        MPI_Comm *c, mc_error *err);
/* Point to point: checks the peer (another member) and the count. */
mc_status mc_comm_peer(const mc_grid *g, mc_group_kind k, mc_backend *be, const char *op, int peer,
                       size_t n, MPI_Comm *c, mc_error *err);
/* How a backend's memory travels (reduce.c): host memory (no backend, or
 * the CPU backend's) through MPI; a device backend's through NCCL, or,
 * with MC_DEVICE_COMM=mpi (cm->device_mpi) or where NCCL is not built,
 * staged: copied to host memory, through the host path (the same bodies,
 * sums on cm->host_be, so the bits of a CPU run's sums), and back.
 * Point to point always stages device memory (mc_comm_stage). */
typedef enum { MC_PATH_HOST, MC_PATH_NCCL, MC_PATH_STAGED } mc_path;
mc_path mc_comm_path(const mc_comm *cm, const mc_backend *be);
/* For tests: 1 makes the CPU backend's memory take the staged path too, so
 * its copies and offsets are checked without a GPU (test_comm); 0 undoes. */
void mc_comm_set_staging(int on);
/* The staged collectives (reduce.c), for the blocking entry points and for
 * async.c, which runs them at issue: device memory in and out. */
mc_status mc_comm_staged_allreduce_sum(mc_comm *cm, MPI_Comm c, mc_group_kind k, mc_backend *be,
                                       float *x, size_t n, mc_error *err);
mc_status mc_comm_staged_reduce_scatter_sum(mc_comm *cm, MPI_Comm c, mc_group_kind k,
                                            mc_backend *be, const float *in, float *out, size_t n,
                                            mc_error *err);
mc_status mc_comm_staged_allgather(mc_comm *cm, MPI_Comm c, mc_group_kind k, mc_backend *be,
                                   const float *in, float *out, size_t n, mc_error *err);
/* Point to point stages device memory in host memory (reduce.c): the host
 * copy of x (malloc'ed; x itself for host memory; NULL when out of memory). */
float *mc_comm_stage(mc_comm *cm, mc_backend *be, const float *x, size_t n);
/* A receive of n floats from peer got exactly n. */
mc_status mc_comm_recv_status(const MPI_Status *s, size_t n, int peer, mc_group_kind k,
                              mc_error *err);
/* An MPI error code as one line: "OP on the GROUP: MPI's text". */
mc_status mc_comm_mpi_error(mc_error *err, int rc, const char *op, mc_group_kind k);

/* stats.c: counting, on the calling thread (see mc/comm_stats.h). */
double mc_comm_now(void); /* monotonic seconds */
/* A blocking call of group k, kind c done: bytes handed, bytes sent, seconds blocked. */
void mc_comm_count(mc_comm *cm, mc_group_kind k, mc_coll_kind c, double bytes, double wire,
                   double blocked);
/* A non-blocking one waited for: also issue-to-completion seconds. */
void mc_comm_count_async(mc_comm *cm, mc_group_kind k, mc_coll_kind c, double bytes, double wire,
                         double elapsed, double waited);
/* Bytes member me of P sends in reduce.c's all-reduce of n floats. */
double mc_comm_allreduce_wire(size_t n, int P, int me);

/* nccl.c: device memory of a CUDA backend goes through NCCL (MC_CUDA_BACKEND
 * builds; elsewhere mc_nccl_wanted is 0). mc_nccl_run enqueues one
 * operation on the backend's communication stream; with event NULL the
 * compute stream then waits for it (a blocking call), else *event is what
 * mc_nccl_wait makes the compute stream wait for. in/out/n as the MPI calls;
 * peer: the root of a broadcast. Point to point stays on MPI (reduce.c). */
typedef enum {
    MC_NCCL_ALLREDUCE_SUM,
    MC_NCCL_ALLREDUCE_MAX,
    MC_NCCL_REDUCE_SCATTER,
    MC_NCCL_ALLGATHER,
    MC_NCCL_BROADCAST
} mc_nccl_op;
#ifdef MC_CUDA_BACKEND
int mc_nccl_wanted(const mc_backend *be);
/* NCCL's all-to-all with counts and offsets in floats, as mc_alltoallv:
 * one grouped send and receive per member on the communication stream; the
 * compute stream waits for it. */
mc_status mc_nccl_alltoallv(mc_comm *cm, mc_group_kind k, mc_backend *be, const float *send,
                            const size_t *scount, const size_t *sdispl, float *recv,
                            const size_t *rcount, const size_t *rdispl, mc_error *err);
mc_status mc_nccl_run(mc_comm *cm, mc_group_kind k, mc_backend *be, mc_nccl_op op, const float *in,
                      float *out, size_t n, int peer, void **event, mc_error *err);
mc_status mc_nccl_wait(mc_backend *be, void *event, const char *op, mc_group_kind k, mc_error *err);
void mc_nccl_free(mc_nccl *nc);
#else
#define mc_nccl_wanted(be) 0
#define mc_nccl_run(cm, k, be, op, in, out, n, peer, event, err) ((void)(op), MC_ERR_INTERNAL)
#define mc_nccl_wait(be, event, op, k, err) MC_ERR_INTERNAL
#define mc_nccl_free(nc) ((void)(nc))
#define mc_nccl_alltoallv(cm, k, be, s, sc, sd, r, rc, rd, err) MC_ERR_INTERNAL
#endif

/* async.c */
void mc_async_free(mc_async *a);
/* 1 when non-blocking collectives on group k are still queued or running;
 * mc_async_drain waits (under the deadline, as op) until none is. */
int mc_async_busy(mc_comm *cm, mc_group_kind k);
mc_status mc_async_drain(mc_comm *cm, mc_group_kind k, const char *op, mc_error *err);
#endif
