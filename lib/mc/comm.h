/*
 * comm.h - the parallel grid and its collectives.
 *
 * Ranks map to coordinates as in Megatron's parallel_state, tp fastest:
 *   rank = tp + TP * (cp + CP * (dp + DP * pp)),  dp = ep + EP * edp
 * The data-parallel coordinate dp (size DP, Megatron's data-parallel size)
 * holds the expert axis: ep (size EP, --expert-model-parallel-size) varies
 * fastest inside it and edp (size DP / EP, the expert-data-parallel rank)
 * slowest, which is the order tp-cp-ep-dp-pp. Dense parameters are
 * replicated over all DP ranks; a MoE layer's experts are split over the
 * ep ranks and replicated over the edp ranks. Model code calls the
 * collectives below on a group; with a group of size 1 each is a no-op (no
 * MPI call at all), so one process is simply the grid 1x1x1x1 from
 * mc_grid_single and runs the same code path without MPI_Init.
 *
 * Many processes: mc_grid_init_mpi builds the grid over MPI (lib/comm/mpi.c),
 * one MPI communicator per group. Collectives move backend memory with MPI
 * (CPU backend memory is host memory) or, for a CUDA backend's device
 * memory, NCCL (lib/comm/nccl.c). Sums are deterministic and the same bits
 * on every member: each element is summed in group-rank order,
 * ((x0 + x1) + x2) + ..., whatever MPI's own algorithms would choose
 * (lib/comm/reduce.c). Collectives are called from one thread, in the same
 * order on every member of a group.
 *
 * Faults: every blocking call runs under a deadline
 * (--distributed-timeout-minutes, default 10). A watchdog thread that sees a
 * call exceed it writes one line to stderr ("PROG: error: rank 3: all-reduce
 * on the data-parallel group did not complete within 1.0 minutes; a rank may
 * have died") and calls MPI_Abort, so a job with a dead or stuck rank never
 * hangs. It is the one place in libmc that prints: no caller is left to.
 */
#ifndef MC_COMM_H
#define MC_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/kern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_group_kind {
    MC_GROUP_WORLD = 0,
    MC_GROUP_TP,       /* tensor parallel */
    MC_GROUP_PP,       /* pipeline parallel */
    MC_GROUP_DP,       /* data parallel */
    MC_GROUP_CP,       /* context parallel */
    MC_GROUP_DP_CP,    /* data x context: gradient reduction */
    MC_GROUP_MP,       /* model parallel: tp x pp */
    MC_GROUP_EMBD,     /* first and last pipeline stage: tied embeddings */
    MC_GROUP_POS_EMBD, /* first pipeline stage: learned position embeddings */
    MC_GROUP_EP,       /* expert parallel: the ranks that split the experts */
    MC_GROUP_EDP,      /* expert data parallel: the replicas of this rank's experts
                        * (dp / ep x cp: the context-parallel ranks too) */
    MC_GROUP_MP_EP,    /* tp x ep x pp: the plain optimizer's gradient statistics */
    MC_GROUP_ETP,      /* expert tensor parallel: etp consecutive ranks of a TP group, which
                        * split the experts (the TP group itself unless mc_grid_set_etp) */
    MC_GROUP_ETP_REP,  /* the TP group's ranks with this rank's rank in MC_GROUP_ETP: the
                        * tp / etp replicas of its expert slices */
    MC_GROUP_COUNT
} mc_group_kind;

typedef struct mc_grid {
    int world, rank;
    int tp, cp, ep, dp, pp; /* sizes; ep divides dp */
    int tp_rank, cp_rank, dp_rank, pp_rank;
    int local_rank; /* rank within the node */
    void *impl;     /* the transport's state (NULL: one process) */
    int ep_rank;    /* dp_rank % ep (the expert-data-parallel rank is dp_rank / ep) */
    int etp;        /* expert tensor-parallel size, a divisor of tp (mc_grid_set_etp; tp by
                     * default; 0, the single grid's, read as tp) */
} mc_grid;

/* The grid of one process: every size 1. */
void mc_grid_single(mc_grid *g);
int mc_grid_group_size(const mc_grid *g, mc_group_kind k);
/* This rank's rank in group k; -1 where it is not a member (the embedding
 * groups hold only the first and last pipeline stages). */
int mc_grid_group_rank(const mc_grid *g, mc_group_kind k);
/* 1 when this rank belongs to group k (always, except the embedding groups). */
int mc_grid_in_group(const mc_grid *g, mc_group_kind k);
/* World rank of group rank r in this rank's group k (r in [0, size)); -1 if
 * this rank is not in k or r is out of range. From the formula, no MPI. */
int mc_grid_group_world_rank(const mc_grid *g, mc_group_kind k, int r);
/* "data-parallel group", "tensor-parallel group", ... for messages. */
const char *mc_group_name(mc_group_kind k);

/* ------------------------------------------------------------ MPI grid */

/* 1 when the environment says an MPI launcher started this process
 * (mpirun/mpiexec of Open MPI, PMIx, srun): then mc_grid_init_mpi, else
 * mc_grid_single is the grid. */
int mc_grid_launched_by_mpi(void);

/* MPI_Init_thread (MPI_THREAD_MULTIPLE: the watchdog and the non-blocking
 * collectives' worker call MPI beside the main thread; unless MPI is
 * already initialized), then the grid of world = TP*PP*CP*DP ranks, DP a
 * multiple of ep. On failure every rank returns the SAME error (so rank 0
 * alone reports it) with g usable for mc_grid_fail(g, 1): world not
 * divisible by tp*pp*cp*ep (the numbers are in the message), sizes < 1. The watchdog runs
 * with the default 10 minutes. */
mc_status mc_grid_init_mpi(int *argc, char ***argv, int tp, int pp, int cp, int ep, mc_grid *g,
                           mc_error *err);
/* The grid of a tool that runs one tensor-parallel group of tp ranks, ep
 * times over (mc-eval, mc-serve: expert parallelism splits the experts over
 * ep replicas of the group, which run the same tokens; tool names it in
 * messages): under an MPI launcher, mc_grid_init_mpi(tp, 1, 1, ep), and a
 * world of other than tp x ep ranks is a usage error; otherwise the single
 * grid, and tp x ep > 1 is a usage error. st is the caller's status so far:
 * after an error every rank still starts MPI, so that rank 0 alone reports
 * it, and st is returned as it is. *grid_error is set when the failure is
 * MPI's (the exit status is then 1; a grid that does not fit the world is
 * MC_ERR_USAGE, exit 2). */
mc_status mc_grid_init_tp_group(int *argc, char ***argv, mc_status st, int64_t tp, int64_t ep,
                                const char *tool, mc_grid *g, int *grid_error, mc_error *err);
/* Expert tensor parallelism of size etp (a divisor of tp): the ETP groups
 * become etp consecutive ranks of each TP group and MC_GROUP_ETP_REP their
 * tp / etp replicas. Collective over the world (communicators split again);
 * on the single grid etp must be 1. */
mc_status mc_grid_set_etp(mc_grid *g, int etp, mc_error *err);
/* Frees the communicators, stops the watchdog and finalizes MPI (when
 * mc_grid_init_mpi initialized it). Collective: every rank calls it. No-op
 * for mc_grid_single. The collectives' staging memory is freed here
 * through the backend it came from: free the backends used with g after
 * this, never before (ASan's heap-use-after-free otherwise). */
void mc_grid_finalize(mc_grid *g);
/* A copy of g whose world is a communicator of its own (MPI_Comm_dup of
 * g's), watched by a watchdog of its own under the same deadline: the
 * world protocols below (mc_grid_status_all, ..., the collective checkpoint
 * writer) may run on it from a second thread while the first goes on with
 * g's collectives (--async-save's writer). It has no other groups. Needs
 * MPI_THREAD_MULTIPLE (else MC_ERR_USAGE saying so). Collective over the
 * world, from the thread of g's collectives. g of one process: a plain copy.
 * mc_grid_free_dup frees it (before mc_grid_finalize of g; the thread
 * that used it done). */
mc_status mc_grid_dup_world(const mc_grid *g, mc_grid *out, mc_error *err);
void mc_grid_free_dup(mc_grid *g);
/* Leave the job after an error; the caller has printed it. agreed != 0:
 * every rank has this same error (mc_grid_init_mpi, mc_grid_check_config),
 * so print it on rank 0 only; every rank finalizes and gets 1. agreed == 0:
 * this rank alone failed: MPI_Abort(MPI_COMM_WORLD, 1) ends the job at once
 * rather than leaving the others to wait for the watchdog (returns only for
 * a grid without MPI, with 1). Returns the exit status. */
int mc_grid_fail(mc_grid *g, int agreed);
/* --distributed-timeout-minutes: the deadline of every blocking collective,
 * point-to-point and mc_wait (fractions allowed: 0.05 is 3 s). prog names
 * the program in the watchdog's line (NULL: the executable's name). */
mc_status mc_grid_set_timeout(mc_grid *g, double minutes, const char *prog, mc_error *err);
/* Every rank hashes its configuration (FNV-1a 64 of the bytes, e.g. the
 * canonical JSON of the options) and all ranks compare (collective, world).
 * On disagreement every rank returns the same MC_ERR_USAGE naming the ranks
 * whose configuration differs from rank 0's. */
mc_status mc_grid_check_config(const mc_grid *g, const void *bytes, size_t n, mc_error *err);

/* ------------------------------------------------------------ control over the world */

/* Collectives on host bytes over the world for the library's own protocols
 * (the collective checkpoint writer, agreeing on a load; lib/comm/world.c).
 * Every rank calls them in the same order, from the thread that calls the
 * other collectives. Each blocking MPI call runs under the deadline, op (a
 * string that outlives the call) naming it in the watchdog's line and in
 * MPI's errors ("OP on the world: ..."). Not counted in mc/comm_stats.h.
 * g NULL or a grid of one process: no MPI call. */

/* Every rank passes its status st of some step, with err holding its
 * message when st failed; all return MC_OK, or all the status of the lowest
 * failing rank with its message as "rank R: MESSAGE". One process: returns
 * st as it is. */
mc_status mc_grid_status_all(const mc_grid *g, mc_status st, const char *op, mc_error *err);
/* Every rank's n bytes of in (n may differ from rank to rank), in rank
 * order: *all (malloc'd) holds rank r's at [(*off)[r], (*off)[r + 1]), *off
 * (malloc'd) has world + 1 entries. Every rank returns the same status: out
 * of memory on one rank, or more than 2 GiB together (MPI's limit), fails
 * all. */
mc_status mc_grid_allgather_bytes(const mc_grid *g, const void *in, size_t n, const char *op,
                                  unsigned char **all, size_t **off, mc_error *err);
/* x[0..n) of world rank root to every rank (n the same everywhere). */
mc_status mc_grid_broadcast_bytes(const mc_grid *g, void *x, size_t n, int root, const char *op,
                                  mc_error *err);
/* mc_grid_broadcast_bytes for a rank that may wait long for the root (a
 * server's follower between requests): no deadline, and the wait sleeps
 * in short naps instead of spinning on a core. */
mc_status mc_grid_broadcast_idle(const mc_grid *g, void *x, size_t n, int root, const char *op,
                                 mc_error *err);
/* Collective calls made outside lib/comm on the world's communicator
 * (mc/comm_mpi.h: parallel HDF5's I/O) under the deadline: the watchdog ends
 * the job when more than --distributed-timeout-minutes pass between begin
 * and end. Not nested, nor around the calls above. */
void mc_grid_deadline_begin(const mc_grid *g, const char *op);
void mc_grid_deadline_end(const mc_grid *g);

/* Collectives on backend memory, in place. Every member of the group must
 * call them in the same order. */
mc_status mc_allreduce_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err);
mc_status mc_allreduce_max(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err);
/* Host scalars (losses, norms, counters), reduced in double. */
mc_status mc_allreduce_sum_f64(const mc_grid *g, mc_group_kind k, double *x, size_t n,
                               mc_error *err);
/* out[r*n .. (r+1)*n) = member r's in[0..n), for every group rank r; in may
 * be out + rank*n (in place). */
mc_status mc_allgather(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                       float *out, size_t n, mc_error *err);
/* out[0..n) = sum over members of their in[rank*n .. (rank+1)*n), in is size*n;
 * out may be in + rank*n (in place). */
mc_status mc_reduce_scatter_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                                float *out, size_t n, mc_error *err);
/* x[0..n) of group rank root to every member. */
mc_status mc_broadcast(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                       int root, mc_error *err);
/* All-to-all of variable sizes (the MoE token dispatch): member i's
 * send[sdispl[j], sdispl[j] + scount[j]) lands in member j's
 * recv[rdispl[i], rdispl[i] + rcount[i]), counts in floats; every member's
 * scount[j] must be member j's rcount[i] (exchange them first with
 * mc_alltoall_i64). CPU backend memory only. Counted as MC_COLL_ALLTOALL:
 * bytes the floats this rank sends (its own chunk included), wire those to
 * the others. */
mc_status mc_alltoallv(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *send,
                       const size_t *scount, const size_t *sdispl, float *recv,
                       const size_t *rcount, const size_t *rdispl, mc_error *err);
/* Host integers, n per member: recv[i n .. (i+1) n) = member i's
 * send[me n .. (me+1) n). Counted as MC_COLL_SCALAR (metadata, not tensor
 * traffic). */
mc_status mc_alltoall_i64(const mc_grid *g, mc_group_kind k, const int64_t *send, int64_t *recv,
                          size_t n, mc_error *err);
/* Rank 0's text to every rank of the world (what a tool read from stdin,
 * which mpirun gives to rank 0 alone). Rank 0 passes st, its status of
 * producing *s; on success every rank returns with *s a malloc'd copy (rank
 * 0 keeps its own); when st failed, rank 0 returns st and the others
 * MC_ERR_USAGE "rank 0 could not read its input". One process: returns st. */
mc_status mc_broadcast_text(const mc_grid *g, mc_status st, char **s, mc_error *err);
/* Point to point with group rank peer of group k (the pipeline: MC_GROUP_PP,
 * pp_rank +- 1). Messages between two ranks arrive in the order sent. */
mc_status mc_send(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *x, size_t n,
                  int peer, mc_error *err);
mc_status mc_recv(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n, int peer,
                  mc_error *err);

/* Non-blocking variants: they return at once with *req (NULL when there was
 * nothing to do: a group of size 1); the buffers belong to the operation
 * until mc_wait(req), which frees req. Collectives run on a worker thread in
 * issue order, so the data-parallel reduction overlaps the backward pass;
 * they give the same bits as the blocking calls. A blocking collective on a
 * group with non-blocking work still queued runs after it. The deadline of
 * a non-blocking call counts from mc_wait (time spent computing before the
 * wait is not a hang). */
typedef struct mc_request mc_request;
mc_status mc_iallreduce_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                            mc_request **req, mc_error *err);
mc_status mc_ireduce_scatter_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                                 float *out, size_t n, mc_request **req, mc_error *err);
mc_status mc_iallgather(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                        float *out, size_t n, mc_request **req, mc_error *err);
mc_status mc_isend(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *x, size_t n,
                   int peer, mc_request **req, mc_error *err);
mc_status mc_irecv(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n, int peer,
                   mc_request **req, mc_error *err);
/* Wait for req and free it; NULL is done already. */
mc_status mc_wait(const mc_grid *g, mc_request *req, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
