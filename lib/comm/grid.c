/*
 * grid.c - the grid of one process and its collectives.
 *
 * With every group of size 1 a collective has nothing to exchange, so each
 * returns at once. The multi-process transport (MPI, NCCL) replaces the
 * bodies behind the same calls when g->impl is set; until it exists a grid
 * with more than one rank is refused here rather than silently wrong.
 */
#include "mc/comm.h"

void mc_grid_single(mc_grid *g)
{
    g->world = 1;
    g->rank = 0;
    g->tp = g->cp = g->ep = g->dp = g->pp = 1;
    g->tp_rank = g->cp_rank = g->dp_rank = g->pp_rank = 0;
    g->local_rank = 0;
    g->impl = NULL;
}

int mc_grid_group_size(const mc_grid *g, mc_group_kind k)
{
    switch (k) {
    case MC_GROUP_WORLD: return g->world;
    case MC_GROUP_TP: return g->tp;
    case MC_GROUP_PP: return g->pp;
    case MC_GROUP_DP: return g->dp;
    case MC_GROUP_CP: return g->cp;
    case MC_GROUP_DP_CP: return g->dp * g->cp;
    case MC_GROUP_MP: return g->tp * g->pp;
    case MC_GROUP_EMBD: return g->pp > 1 ? 2 : 1;
    default: return 0;
    }
}

int mc_grid_group_rank(const mc_grid *g, mc_group_kind k)
{
    switch (k) {
    case MC_GROUP_WORLD: return g->rank;
    case MC_GROUP_TP: return g->tp_rank;
    case MC_GROUP_PP: return g->pp_rank;
    case MC_GROUP_DP: return g->dp_rank;
    case MC_GROUP_CP: return g->cp_rank;
    case MC_GROUP_DP_CP: return g->dp_rank * g->cp + g->cp_rank;
    case MC_GROUP_MP: return g->pp_rank * g->tp + g->tp_rank;
    case MC_GROUP_EMBD: return g->pp_rank == 0 ? 0 : 1;
    default: return -1;
    }
}

static mc_status single_only(const mc_grid *g, mc_group_kind k, mc_error *err)
{
    if (mc_grid_group_size(g, k) <= 1) return MC_OK;
    return mc_error_set(err, MC_ERR_USAGE,
                        "a grid of %d ranks needs the multi-process transport, not built yet",
                        g->world);
}

mc_status mc_allreduce_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err)
{
    (void)be, (void)x, (void)n;
    return single_only(g, k, err);
}

mc_status mc_allreduce_max(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err)
{
    (void)be, (void)x, (void)n;
    return single_only(g, k, err);
}

mc_status mc_allreduce_sum_f64(const mc_grid *g, mc_group_kind k, double *x, size_t n,
                               mc_error *err)
{
    (void)x, (void)n;
    return single_only(g, k, err);
}
