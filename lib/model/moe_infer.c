/*
 * moe_infer.c - the mixture-of-experts block of inference: what infer.c
 * (mc-eval, one sequence with a key/value cache) and infer_batch.c
 * (mc-serve, many sequences in one pass) run in a MoE layer's place of the
 * MLP. The training forward's steps (moe.c, mc_moe_fwd: router in fp32,
 * routing with the expert bias for the choice, the permutation, the
 * experts over the rows each one received, the weighted unpermutation, the
 * shared experts), on n rows of a forward pass, with no saved activations,
 * no balancing losses and no expert-bias counts. The linears go through the
 * caller's function, so each caller keeps its own kernels and weight forms
 * (mc_k_linear_fwd for mc-eval, the row-invariant mc_k_linear_rows_fwd
 * for mc-serve; int8 weights mc_k_linear_q8a8_fwd for both). Under expert
 * parallelism every EP rank runs the same tokens and routes them alike,
 * computes the rows of its own E / EP experts and all-gathers the others'
 * rows (the expert outputs in one process's order, each expert's rows from
 * the rank that holds it), so the weighted unpermutation adds one process's
 * values in its order. See doc/ARCHITECTURE.md, "Inference".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

static size_t fc1_width(const mc_model_config *c)
{
    return (size_t)(c->swiglu ? 2 : 1) * (size_t)c->moe_ffn_hidden_size;
}

void mc_moe_infer_layout(const mc_model *m, carver *cv, mc_moe_infer_scratch *s, size_t rows)
{
    const mc_model_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    if (c->num_experts <= 0) return;
    size_t E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk, C = m->C;
    size_t R = rows * K, F = (size_t)c->moe_ffn_hidden_size;
    size_t S = (size_t)c->moe_shared_expert_intermediate_size;
    s->logits = carve(cv, rows * E);
    s->probs = carve(cv, rows * K);
    s->idx = (int32_t *)carve(cv, rows * K);
    s->kept = (int32_t *)carve(cv, rows * K);
    s->perm = (int32_t *)carve(cv, rows * K);
    s->counts = (int32_t *)carve(cv, E);
    s->xp = carve(cv, R * C);
    s->fc1 = carve(cv, R * fc1_width(c));
    s->act = carve(cv, R * F);
    s->yp = carve(cv, R * C);
    s->yg = m->grid.ep > 1 ? carve(cv, R * C) : NULL;
    s->y = carve(cv, rows * C);
    s->sfc1 = S ? carve(cv, rows * S * (c->swiglu ? 2 : 1)) : NULL;
    s->sact = S ? carve(cv, rows * S) : NULL;
    s->stmp = S ? carve(cv, rows * C) : NULL;
}

static void act_fwd(mc_model *m, float *out, const float *in, size_t n, size_t F)
{
    if (m->cfg.swiglu)
        mc_k_swiglu_fwd(m->be, out, in, n, F, MC_PREC_FP32);
    else
        mc_k_gelu_fwd(m->be, out, in, n * F, MC_PREC_FP32);
}

size_t mc_moe_infer_capacity(const mc_model_config *c, size_t n)
{
    if (!(c->moe_expert_capacity_factor > 0)) return 0;
    double nk = (double)n * (double)c->moe_router_topk;
    size_t cap = (size_t)ceil(nk / (double)c->num_experts * (double)c->moe_expert_capacity_factor);
    return cap > n ? 0 : cap;
}

mc_status mc_moe_infer_fwd(mc_model *m, int l, const mc_moe_infer_scratch *s, const float *h,
                           float *x, size_t n, int drop, mc_moe_linear_fn lin, void *ctx,
                           mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    const mc_layer_params *lp = &m->lp[l];
    mc_backend *be = m->be;
    size_t C = m->C, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk;
    size_t F = (size_t)c->moe_ffn_hidden_size, fc1 = fc1_width(c);
    mc_moe_route r = {c->moe_router_topk,        c->moe_router_score_sigmoid,
                      c->moe_router_pre_softmax, c->moe_router_topk_scaling_factor,
                      c->moe_router_num_groups,  c->moe_router_group_topk};
    if (!n) return MC_OK;

    /* the router (fp32 whatever the linears' precision), the choice */
    lin(ctx, s->logits, h, lp->router_w, 0, param_val(m, lp->router_b), n, C, E, 1);
    mc_k_moe_route_fwd(be, s->probs, s->idx, s->logits, param_val(m, lp->expert_bias), n, E, &r);
    const int32_t *use = s->idx;
    size_t cap = drop ? mc_moe_infer_capacity(c, n) : 0;
    if (cap) {
        mc_k_moe_capacity_drop(be, s->kept, s->idx, s->probs, n, E, K, cap,
                               c->moe_token_drop_position);
        use = s->kept;
    }
    /* experts in order, each one's rows in row order (no padding: padding
     * rows are zeros whose outputs nobody reads) */
    mc_k_moe_permute_map(be, s->perm, s->counts, use, n, E, K, 0);
    int32_t counts[MC_MOE_MAX_EXPERTS];
    mc_bcopy_to_host(be, counts, s->counts, E * sizeof(int32_t));
    mc_k_moe_permute(be, s->xp, h, s->perm, n, K, C);
    /* this rank's experts [e0, e1) (all of them in one process): their
     * rows [r0, r1) of the permuted rows, expert e at local index e - e0 of
     * the rank's block of the global [E O, I] weights and [E, O] biases */
    size_t ep = (size_t)m->grid.ep, El = E / ep, e0 = (size_t)m->grid.ep_rank * El, e1 = e0 + El;
    size_t first[MC_MOE_MAX_EXPERTS + 1];
    first[0] = 0;
    for (size_t e = 0; e < E; e++) first[e + 1] = first[e] + (size_t)counts[e];
    size_t r0 = first[e0], r1 = first[e1];
    const float *b1 = param_val(m, lp->efc1_b), *b2 = param_val(m, lp->efc2_b);
    for (size_t e = e0; e < e1; e++) {
        size_t k = (size_t)counts[e], R = first[e];
        if (k)
            lin(ctx, s->fc1 + R * fc1, s->xp + R * C, lp->efc1_w, e - e0,
                b1 ? b1 + (e - e0) * fc1 : NULL, k, C, fc1, 0);
    }
    act_fwd(m, s->act + r0 * F, s->fc1 + r0 * fc1, r1 - r0, F);
    for (size_t e = e0; e < e1; e++) {
        size_t k = (size_t)counts[e], R = first[e];
        if (k)
            lin(ctx, s->yp + R * C, s->act + R * F, lp->efc2_w, e - e0,
                b2 ? b2 + (e - e0) * C : NULL, k, F, C, 0);
    }
    const float *yp = s->yp;
    if (ep > 1) { /* every rank's block of rows to every rank: an all-gather */
        size_t v[4 * MC_MOE_MAX_EXPERTS];
        size_t *sc = v, *sd = v + ep, *rc = v + 2 * ep, *rd = v + 3 * ep;
        for (size_t j = 0; j < ep; j++) {
            sc[j] = (r1 - r0) * C, sd[j] = r0 * C;
            rc[j] = (first[(j + 1) * El] - first[j * El]) * C, rd[j] = first[j * El] * C;
        }
        mc_status st = mc_alltoallv(&m->grid, MC_GROUP_EP, be, s->yp, sc, sd, s->yg, rc, rd, err);
        if (st) return st;
        yp = s->yg;
    }
    mc_k_moe_unpermute(be, s->y, yp, s->probs, s->perm, n, K, C);
    if (lp->sfc1_w >= 0) {
        size_t S = (size_t)c->moe_shared_expert_intermediate_size;
        size_t sw = S * (c->swiglu ? 2 : 1);
        lin(ctx, s->sfc1, h, lp->sfc1_w, 0, NULL, n, C, sw, 0);
        act_fwd(m, s->sact, s->sfc1, n, S);
        lin(ctx, s->stmp, s->sact, lp->sfc2_w, 0, NULL, n, S, C, 0);
        mc_k_acc(be, s->y, s->stmp, n * C);
    }
    mc_k_acc(be, x, s->y, n * C);
    return MC_OK;
}

mc_status mc_model_check_ep(const mc_model_config *c, int ep, const char *file, mc_error *err)
{
    if (ep <= 1) return MC_OK;
    if (c->num_experts <= 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: --expert-model-parallel-size %d needs a mixture of experts, and "
                            "this model has no experts",
                            file, ep);
    if (c->num_experts % ep)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: the model's %d experts are not divisible by "
                            "--expert-model-parallel-size %d",
                            file, c->num_experts, ep);
    return MC_OK;
}

int mc_moe_infer_weights(const mc_model *m, int l, int *out)
{
    const mc_layer_params *lp = &m->lp[l];
    int n = 0;
    if (!lp->moe) return 0;
    out[n++] = lp->efc1_w;
    out[n++] = lp->efc2_w;
    if (lp->sfc1_w >= 0) {
        out[n++] = lp->sfc1_w;
        out[n++] = lp->sfc2_w;
    }
    return n;
}
