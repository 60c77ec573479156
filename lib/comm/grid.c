/*
 * grid.c - the grid's arithmetic: coordinates, groups and their members,
 * from Megatron's parallel_state formula alone (no MPI here), and the grid
 * of one process. Rank order tp-cp-ep-dp-pp, tp fastest:
 * rank = tp + TP*(cp + CP*(dp + DP*pp)) with dp = ep + EP*edp; a group holds the ranks that share
 * every coordinate outside it, ordered by world rank (Megatron's
 * RankGenerator). The groups: doc/ARCHITECTURE.md, "Communication".
 */
#include "mc/comm.h"

void mc_grid_single(mc_grid *g)
{
    g->world = 1;
    g->rank = 0;
    g->tp = g->cp = g->ep = g->dp = g->pp = 1;
    g->tp_rank = g->cp_rank = g->dp_rank = g->pp_rank = g->ep_rank = 0;
    g->local_rank = 0;
    g->impl = NULL;
    g->etp = 0; /* read as tp (etp_of): a copy given a larger tp keeps ETP = TP */
}

/* The expert tensor-parallel size (0, an unset grid's, reads as tp). */
static int etp_of(const mc_grid *g) { return g->etp > 0 && g->tp % g->etp == 0 ? g->etp : g->tp; }

const char *mc_group_name(mc_group_kind k)
{
    switch (k) {
    case MC_GROUP_WORLD: return "world";
    case MC_GROUP_TP: return "tensor-parallel group";
    case MC_GROUP_PP: return "pipeline-parallel group";
    case MC_GROUP_DP: return "data-parallel group";
    case MC_GROUP_CP: return "context-parallel group";
    case MC_GROUP_DP_CP: return "data-and-context-parallel group";
    case MC_GROUP_MP: return "model-parallel group";
    case MC_GROUP_EMBD: return "embedding group";
    case MC_GROUP_POS_EMBD: return "position-embedding group";
    case MC_GROUP_EP: return "expert-parallel group";
    case MC_GROUP_EDP: return "expert-data-parallel group";
    case MC_GROUP_MP_EP: return "model-and-expert-parallel group";
    case MC_GROUP_ETP: return "expert-tensor-parallel group";
    case MC_GROUP_ETP_REP: return "expert-tensor-parallel replica group";
    default: return "unknown group";
    }
}

int mc_grid_in_group(const mc_grid *g, mc_group_kind k)
{
    if (k == MC_GROUP_EMBD) return g->pp_rank == 0 || g->pp_rank == g->pp - 1;
    if (k == MC_GROUP_POS_EMBD) return g->pp_rank == 0;
    return k >= 0 && k < MC_GROUP_COUNT;
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
    case MC_GROUP_POS_EMBD: return 1;
    case MC_GROUP_EP: return g->ep;
    case MC_GROUP_EDP: return g->dp / g->ep * g->cp;
    case MC_GROUP_MP_EP: return g->tp * g->ep * g->pp;
    case MC_GROUP_ETP: return etp_of(g);
    case MC_GROUP_ETP_REP: return g->tp / etp_of(g);
    default: return 0;
    }
}

int mc_grid_group_rank(const mc_grid *g, mc_group_kind k)
{
    if (!mc_grid_in_group(g, k)) return -1;
    switch (k) {
    case MC_GROUP_WORLD: return g->rank;
    case MC_GROUP_TP: return g->tp_rank;
    case MC_GROUP_PP: return g->pp_rank;
    case MC_GROUP_DP: return g->dp_rank;
    case MC_GROUP_CP: return g->cp_rank;
    case MC_GROUP_DP_CP: return g->dp_rank * g->cp + g->cp_rank;
    case MC_GROUP_MP: return g->pp_rank * g->tp + g->tp_rank;
    case MC_GROUP_EMBD: return g->pp_rank == 0 ? 0 : 1;
    case MC_GROUP_POS_EMBD: return 0;
    case MC_GROUP_EP: return g->ep_rank;
    case MC_GROUP_EDP: return g->dp_rank / g->ep * g->cp + g->cp_rank;
    case MC_GROUP_MP_EP: return g->tp_rank + g->tp * (g->ep_rank + g->ep * g->pp_rank);
    case MC_GROUP_ETP: return g->tp_rank % etp_of(g);
    case MC_GROUP_ETP_REP: return g->tp_rank / etp_of(g);
    default: return -1;
    }
}

static int world_rank_of(const mc_grid *g, int tp, int cp, int dp, int pp)
{
    return tp + g->tp * (cp + g->cp * (dp + g->dp * pp));
}

int mc_grid_group_world_rank(const mc_grid *g, mc_group_kind k, int r)
{
    if (!mc_grid_in_group(g, k) || r < 0 || r >= mc_grid_group_size(g, k)) return -1;
    int tp = g->tp_rank, cp = g->cp_rank, dp = g->dp_rank, pp = g->pp_rank;
    switch (k) {
    case MC_GROUP_WORLD: return r;
    case MC_GROUP_TP: tp = r; break;
    case MC_GROUP_PP: pp = r; break;
    case MC_GROUP_DP: dp = r; break;
    case MC_GROUP_CP: cp = r; break;
    case MC_GROUP_DP_CP: cp = r % g->cp, dp = r / g->cp; break;
    case MC_GROUP_MP: tp = r % g->tp, pp = r / g->tp; break;
    case MC_GROUP_EMBD: pp = r == 0 ? 0 : g->pp - 1; break;
    case MC_GROUP_POS_EMBD: pp = 0; break;
    case MC_GROUP_EP: dp = r + g->ep * (dp / g->ep); break;
    case MC_GROUP_EDP: cp = r % g->cp, dp = dp % g->ep + g->ep * (r / g->cp); break;
    case MC_GROUP_MP_EP:
        tp = r % g->tp, r /= g->tp;
        dp = r % g->ep + g->ep * (dp / g->ep), pp = r / g->ep;
        break;
    case MC_GROUP_ETP: tp = tp / etp_of(g) * etp_of(g) + r; break;
    case MC_GROUP_ETP_REP: tp = r * etp_of(g) + tp % etp_of(g); break;
    default: return -1;
    }
    return world_rank_of(g, tp, cp, dp, pp);
}
