/*
 * moe.c - the mixture-of-experts block that replaces a MoE layer's MLP:
 * the router, the permutation of tokens by expert, the experts as grouped
 * GEMMs over the rows each one received (no padding), the unpermutation
 * weighted by the router's probabilities, Megatron's load-balancing and z
 * losses, and the backward of all of it. Every tensor operation is a kern.h
 * call. See doc/ARCHITECTURE.md, "The MoE layer".
 */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

static mc_moe_route route_of(const mc_model_config *c)
{
    mc_moe_route r = {c->moe_router_topk,        c->moe_router_score_sigmoid,
                      c->moe_router_pre_softmax, c->moe_router_topk_scaling_factor,
                      c->moe_router_num_groups,  c->moe_router_group_topk};
    return r;
}

static size_t fc1_width(const mc_model_config *c)
{
    return (size_t)(c->swiglu ? 2 : 1) * (size_t)c->moe_ffn_hidden_size;
}

size_t mc_moe_rows_max(const mc_model *m) { return m->N * (size_t)m->cfg.moe_router_topk; }

void mc_moe_layout(mc_model *m, carver *cv, mc_layer_acts *a)
{
    const mc_model_config *c = &m->cfg;
    size_t N = m->N, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk, C = m->C;
    size_t R = mc_moe_rows_max(m), F = (size_t)c->moe_ffn_hidden_size;
    mc_moe_acts *x = &a->moe;
    x->logits = carve(cv, N * E);
    x->probs = carve(cv, N * K);
    x->idx = (int32_t *)carve(cv, N * K);
    x->perm = (int32_t *)carve(cv, N * K);
    x->xp = carve(cv, R * C);
    x->fc1 = carve(cv, R * fc1_width(c));
    x->act = carve(cv, R * F);
    x->yp = carve(cv, R * C);
}

void mc_moe_layout_scratch(mc_model *m, carver *cv)
{
    const mc_model_config *c = &m->cfg;
    size_t N = m->N, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk, C = m->C;
    size_t R = mc_moe_rows_max(m), F = (size_t)c->moe_ffn_hidden_size;
    m->moe_dlogits = carve(cv, N * E);
    m->moe_dprobs = carve(cv, N * K);
    m->moe_dyp = carve(cv, R * C);
    m->moe_dxp = carve(cv, R * C);
    m->moe_dact = carve(cv, R * F);
    m->moe_dfc1 = carve(cv, R * fc1_width(c));
    m->moe_counts = (int32_t *)carve(cv, E);
}

/* The balancing loss's groups: the micro-batch (aux_loss) or each sequence
 * (seq_aux_loss). */
static void lb_groups(const mc_model *m, size_t *G, size_t *T)
{
    int seq = m->cfg.moe_load_balancing == MC_MOE_LB_SEQ_AUX;
    *G = seq ? (size_t)m->B : 1;
    *T = seq ? m->T : m->N;
}

static int lb_on(const mc_model_config *c)
{
    return c->moe_load_balancing != MC_MOE_LB_NONE && c->moe_aux_loss_coeff > 0;
}

mc_status mc_moe_fwd(mc_model *m, mc_slot *sl, int l, const float *h, float *y, mc_error *err)
{
    (void)err;
    const mc_model_config *c = &m->cfg;
    const mc_layer_params *lp = &m->lp[l];
    mc_moe_acts *A = &sl->acts[m->lidx[l]].moe;
    mc_backend *be = m->be;
    size_t N = m->N, C = m->C, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk;
    size_t F = (size_t)c->moe_ffn_hidden_size, fc1 = fc1_width(c);
    mc_moe_route r = route_of(c);

    /* the router, in fp32 (Megatron's --moe-router-dtype fp32) */
    mc_k_linear_fwd(be, MC_PREC_FP32, A->logits, h, param_val(m, lp->router_w), NULL,
                    param_val(m, lp->router_b), N, C, E, 0.0f);
    mc_k_moe_route_fwd(be, A->probs, A->idx, A->logits, param_val(m, lp->expert_bias), N, E, &r);
    mc_k_moe_permute_map(be, A->perm, m->moe_counts, A->idx, N, E, K);
    int32_t counts[MC_MOE_MAX_EXPERTS];
    mc_bcopy_to_host(be, counts, m->moe_counts, E * sizeof(int32_t));
    size_t R = 0;
    for (size_t e = 0; e < E; e++) R += (size_t)(A->rows[e] = counts[e]);
    mc_k_moe_permute(be, A->xp, h, A->perm, N, K, C);
    mc_k_grouped_linear_fwd(be, m->prec, A->fc1, A->xp, param_val(m, lp->efc1_w),
                            param_val(m, lp->efc1_b), A->rows, E, C, fc1);
    if (c->swiglu)
        mc_k_swiglu_fwd(be, A->act, A->fc1, R, F);
    else
        mc_k_gelu_fwd(be, A->act, A->fc1, R * F);
    mc_k_grouped_linear_fwd(be, m->prec, A->yp, A->act, param_val(m, lp->efc2_w),
                            param_val(m, lp->efc2_b), A->rows, E, F, C);
    mc_k_moe_unpermute(be, y, A->yp, A->probs, A->perm, N, K, C);

    /* Megatron computes the balancing losses in training only */
    A->train = sl->train;
    A->grad_scale = sl->grad_scale;
    if (sl->train) {
        size_t G, T;
        lb_groups(m, &G, &T);
        if (lb_on(c))
            m->moe_lb_sum += mc_k_moe_aux_loss(be, NULL, A->logits, G, T, E, K,
                                               c->moe_router_score_sigmoid, 0.0f);
        if (c->moe_z_loss_coeff > 0) m->moe_z_sum += mc_k_moe_z_loss(be, NULL, A->logits, N, E, 0);
    }
    return MC_OK;
}

mc_status mc_moe_bwd(mc_model *m, mc_slot *sl, int l, const float *dy, const float *h,
                     mc_error *err)
{
    (void)err;
    const mc_model_config *c = &m->cfg;
    const mc_layer_params *lp = &m->lp[l];
    mc_moe_acts *A = &sl->acts[m->lidx[l]].moe;
    mc_backend *be = m->be;
    size_t N = m->N, C = m->C, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk;
    size_t F = (size_t)c->moe_ffn_hidden_size, fc1 = fc1_width(c), R = 0;
    for (size_t e = 0; e < E; e++) R += (size_t)A->rows[e];
    mc_moe_route r = route_of(c);

    mc_k_moe_unpermute_bwd(be, m->moe_dyp, m->moe_dprobs, dy, A->yp, A->probs, A->perm, N, K, C);
    mc_k_fill(be, m->moe_dact, 0.0f, R * F);
    mc_k_grouped_linear_bwd(be, m->prec, m->moe_dact, param_grad(m, lp->efc2_w),
                            param_grad(m, lp->efc2_b), m->moe_dyp, A->act, param_val(m, lp->efc2_w),
                            A->rows, E, F, C);
    mc_k_fill(be, m->moe_dfc1, 0.0f, R * fc1);
    if (c->swiglu)
        mc_k_swiglu_bwd(be, m->moe_dfc1, m->moe_dact, A->fc1, R, F);
    else
        mc_k_gelu_bwd(be, m->moe_dfc1, m->moe_dact, A->fc1, R * F);
    mc_k_fill(be, m->moe_dxp, 0.0f, R * C);
    mc_k_grouped_linear_bwd(be, m->prec, m->moe_dxp, param_grad(m, lp->efc1_w),
                            param_grad(m, lp->efc1_b), m->moe_dfc1, A->xp, param_val(m, lp->efc1_w),
                            A->rows, E, C, fc1);
    mc_k_fill(be, m->dln, 0.0f, N * C);
    mc_k_moe_permute_bwd(be, m->dln, m->moe_dxp, A->perm, N, K, C);

    /* the router: the probabilities' gradient, then the balancing losses
     * (Megatron's MoEAuxLossAutoScaler: their gradient weighted like the
     * main loss's, grad_scale) */
    mc_k_fill(be, m->moe_dlogits, 0.0f, N * E);
    mc_k_moe_route_bwd(be, m->moe_dlogits, m->moe_dprobs, A->logits, A->idx, N, E, &r);
    if (A->train) {
        size_t G, T;
        lb_groups(m, &G, &T);
        if (lb_on(c))
            mc_k_moe_aux_loss(be, m->moe_dlogits, A->logits, G, T, E, K,
                              c->moe_router_score_sigmoid, c->moe_aux_loss_coeff * A->grad_scale);
        if (c->moe_z_loss_coeff > 0)
            mc_k_moe_z_loss(be, m->moe_dlogits, A->logits, N, E,
                            c->moe_z_loss_coeff * A->grad_scale);
    }
    mc_k_linear_bwd(be, MC_PREC_FP32, m->dln, param_grad(m, lp->router_w),
                    param_grad(m, lp->router_b), m->moe_dlogits, h, param_val(m, lp->router_w),
                    NULL, N, C, E);
    return MC_OK;
}

void mc_model_moe_losses(mc_model *m, double *load_balancing, double *z)
{
    *load_balancing = m->moe_lb_sum;
    *z = m->moe_z_sum;
    m->moe_lb_sum = m->moe_z_sum = 0;
}
