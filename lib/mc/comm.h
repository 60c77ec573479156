/*
 * comm.h - the parallel grid and its collectives.
 *
 * Ranks map to coordinates as in Megatron's parallel_state, tp fastest:
 *   rank = tp + TP * (cp + CP * (dp + DP * pp))
 * (the expert axis folds into dp while EP = 1). Model code calls the
 * collectives below on a group; with a group of size 1 each is a no-op, so
 * one process is simply the grid 1x1x1x1 and runs the same code path.
 * The multi-process implementation (MPI for host memory, NCCL for device
 * memory) belongs to the parallel-grid work; this header is its contract.
 */
#ifndef MC_COMM_H
#define MC_COMM_H

#include <stddef.h>
#include "mc/status.h"
#include "mc/kern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_group_kind {
    MC_GROUP_WORLD = 0,
    MC_GROUP_TP,     /* tensor parallel */
    MC_GROUP_PP,     /* pipeline parallel */
    MC_GROUP_DP,     /* data parallel */
    MC_GROUP_CP,     /* context parallel */
    MC_GROUP_DP_CP,  /* data x context: gradient reduction */
    MC_GROUP_MP,     /* model parallel: tp x pp */
    MC_GROUP_EMBD,   /* first and last pipeline stage: tied embeddings */
    MC_GROUP_COUNT
} mc_group_kind;

typedef struct mc_grid {
    int world, rank;
    int tp, cp, ep, dp, pp;          /* sizes */
    int tp_rank, cp_rank, dp_rank, pp_rank;
    int local_rank;                  /* rank within the node */
    void *impl;                      /* the transport's state (NULL: one process) */
} mc_grid;

/* The grid of one process: every size 1. */
void mc_grid_single(mc_grid *g);
int mc_grid_group_size(const mc_grid *g, mc_group_kind k);
int mc_grid_group_rank(const mc_grid *g, mc_group_kind k);

/* Collectives on backend memory, in place. Every member of the group must
 * call them in the same order. */
mc_status mc_allreduce_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err);
mc_status mc_allreduce_max(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err);
/* Host scalars (losses, norms, counters), reduced in double. */
mc_status mc_allreduce_sum_f64(const mc_grid *g, mc_group_kind k, double *x, size_t n,
                               mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
