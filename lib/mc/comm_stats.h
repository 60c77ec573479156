/*
 * comm_stats.h - what the collectives of a grid have moved and how long they
 * took (mc-train --log-comm, bench/comm).
 *
 * Every collective and point-to-point call of lib/comm on a group of more
 * than one member is counted, per group kind and collective kind, in the
 * grid's transport state (mc_grid.impl; nothing for one process), but for
 * the control over the world (mc_grid_check_config, mc_grid_status_all and
 * the other calls of that section of comm.h), which is no training traffic:
 *   calls    calls completed (non-blocking ones when mc_wait returns)
 *   bytes    the tensor handed to the call: all-reduce and broadcast n
 *            elements, all-gather the full output (size x n), reduce-scatter
 *            the full input (size x n), send and receive n each
 *   wire     bytes this rank itself sends. mc's all-reduce is an all-to-all
 *            then an all-gather of chunks (reduce.c): n - c_me + (P-1) c_me
 *            for its chunk c_me, 2(P-1)/P n when P divides n (a ring's
 *            figure); reduce-scatter and all-gather (P-1) n; a broadcast's
 *            root (P-1) n (every member's copy leaves it), the others 0;
 *            a send n, a receive 0; MPI's own all-reduce (maximum) counted
 *            as a ring, 2(P-1)/P n
 *   seconds  time the caller was blocked: the whole of a blocking call, the
 *            mc_wait of a non-blocking one
 *   async_calls, elapsed, waited  the non-blocking calls alone: elapsed from
 *            issue to completion (the worker's end for collectives; the end
 *            of mc_wait for point to point) and the time mc_wait blocked, so
 *            the overlap achieved is 1 - waited / elapsed
 * Host scalars (mc_allreduce_sum_f64: losses, norms, flags) are a kind of
 * their own so that the tensor traffic compares exactly with the plan's.
 * Counting happens on the calling thread only (the worker stamps times in
 * the request), so it needs no lock; read and reset from that thread.
 */
#ifndef MC_COMM_STATS_H
#define MC_COMM_STATS_H

#include <stdint.h>
#include "mc/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_coll_kind {
    MC_COLL_ALLREDUCE = 0,
    MC_COLL_ALLGATHER,
    MC_COLL_REDUCE_SCATTER,
    MC_COLL_BROADCAST,
    MC_COLL_SENDRECV,
    MC_COLL_SCALAR,   /* host doubles: mc_allreduce_sum_f64 */
    MC_COLL_ALLTOALL, /* mc_alltoallv: the MoE token dispatch */
    MC_COLL_COUNT
} mc_coll_kind;

typedef struct mc_comm_stat {
    int64_t calls, async_calls;
    double bytes, wire;     /* bytes */
    double seconds;         /* blocked */
    double elapsed, waited; /* non-blocking: issue to completion, in mc_wait */
} mc_comm_stat;

/* "all-reduce", "all-gather", "reduce-scatter", "broadcast", "send/recv",
 * "scalar", "all-to-all". */
const char *mc_coll_name(mc_coll_kind c);
/* "tp", "pp", "dp", "cp", "dp-cp", "mp", "embd", "pos-embd", "world", "ep",
 * "edp", "mp-ep". */
const char *mc_group_short_name(mc_group_kind k);
/* The counters of group k, kind c since the last reset; zeros for a grid of
 * one process or kinds out of range. */
void mc_comm_stats_get(const mc_grid *g, mc_group_kind k, mc_coll_kind c, mc_comm_stat *out);
/* Zero every counter (the grid's state is behind impl: const is fine). */
void mc_comm_stats_reset(const mc_grid *g);
/* a += b, field by field. */
void mc_comm_stat_add(mc_comm_stat *a, const mc_comm_stat *b);

#ifdef __cplusplus
}
#endif
#endif
