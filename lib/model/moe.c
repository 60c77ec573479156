/*
 * moe.c - the mixture-of-experts block that replaces a MoE layer's MLP:
 * the router, the permutation of tokens by expert, the experts as grouped
 * GEMMs over the rows each one received (no padding), the unpermutation
 * weighted by the router's probabilities, Megatron's load-balancing and z
 * losses, and the backward of all of it. Every tensor operation is a kern.h
 * call. See doc/ARCHITECTURE.md, "The MoE layer".
 */
#include <math.h>
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

/* The tokens the router sees: the micro-batch's B x seq_length, on every
 * rank of the tensor- and context-parallel groups (m->N is a context-
 * parallel rank's share). */
static size_t tokens_routed(const mc_model *m) { return m->N * (size_t)m->grid.cp; }

/* The router's logits are gathered over the sequence's split (sequence
 * and context parallelism) so that routing, dropping and the balancing
 * losses see the micro-batch's tokens in one process's order. */
static int seq_split(const mc_model *m) { return m->sp || m->cpa; }

/* Expert tensor parallelism (m->etp, of size m->etpn; ETP = TP here, ETP
 * < TP below): every TP rank holds 1 / tp of each
 * expert's fc1 rows (SwiGLU's gate and up alike) and of its fc1 bias (its
 * row [gate slice | up slice], params.c), and of fc2's columns, and of
 * the shared experts', as the dense MLP does; the TP group's ranks run
 * the same tokens (with sequence parallelism gathered first) through their
 * slices, and the partial outputs are summed over TP. Without it the
 * experts are replicated and each TP rank runs its own rows. */
static size_t etp_div(const mc_model *m) { return m->etp ? (size_t)m->etpn : 1; }

/* ETP smaller than TP (m->etpn < tp): each TP group is tp / etpn ETP groups
 * of etpn consecutive ranks (MC_GROUP_ETP), each splitting every expert
 * the way ETP = TP splits it over the whole group, and replicas of each
 * other for the experts (MC_GROUP_ETP_REP: the ranks with the same rank in
 * their ETP group). With sequence parallelism an ETP group runs its
 * members' rows (its gathers and reduce-scatters are the TP-wide ones of
 * ETP = TP over the smaller group) and the experts' gradients, each from
 * its group's tokens, are summed over the replicas; without it every ETP
 * group runs every token, as ETP = 1 does on every TP rank. */
static int etp_sub(const mc_model *m) { return m->etp && m->etpn < m->grid.tp; }

/* The group the experts' slices' partial sums are summed over. */
static mc_group_kind etp_group(const mc_model *m)
{
    return etp_sub(m) ? MC_GROUP_ETP : MC_GROUP_TP;
}

/* ETP: the experts' input, the rows of the rank's ETP group ([B, etpn Tl]
 * in position order, in m->gath) from its own [B Tl] rows with sequence
 * parallelism; without it the rows as they are. */
static mc_status etp_gather(mc_model *m, const float *local, const float **full, mc_error *err)
{
    if (!etp_sub(m) || !m->sp) return mc_model_tp_gather(m, local, full, err);
    size_t B = (size_t)m->B, C = m->C, Tl = m->Tl, Te = Tl * (size_t)m->etpn, n = m->Nl * C;
    *full = m->gath;
    if (B == 1) return mc_allgather(&m->grid, MC_GROUP_ETP, m->be, local, m->gath, n, err);
    TRY(mc_allgather(&m->grid, MC_GROUP_ETP, m->be, local, m->sp_buf, n, err));
    /* member u's sequence b, [u][b][Tl][C], goes to rows b Te + u Tl */
    for (int u = 0; u < m->etpn; u++)
        for (size_t b = 0; b < B; b++)
            mc_bcopy(m->be, m->gath + (b * Te + (size_t)u * Tl) * C,
                     m->sp_buf + ((size_t)u * B + b) * Tl * C, Tl * C * sizeof(float));
    return MC_OK;
}

/* ETP: the slices' partial [rows, C] summed over the ETP group (full is
 * overwritten): an all-reduce in place (*out = full), or with sequence
 * parallelism a reduce-scatter to the rank's [Nl, C] in local. */
static mc_status etp_reduce(mc_model *m, float *full, float *local, float **out, mc_error *err)
{
    if (!etp_sub(m)) return mc_model_tp_reduce(m, full, local, out, err);
    if (!m->sp) {
        *out = full;
        return mc_allreduce_sum(&m->grid, MC_GROUP_ETP, m->be, full, m->N * m->C, err);
    }
    size_t B = (size_t)m->B, C = m->C, Tl = m->Tl, Te = Tl * (size_t)m->etpn, n = m->Nl * C;
    *out = local;
    if (B == 1) return mc_reduce_scatter_sum(&m->grid, MC_GROUP_ETP, m->be, full, local, n, err);
    for (int u = 0; u < m->etpn; u++)
        for (size_t b = 0; b < B; b++)
            mc_bcopy(m->be, m->sp_buf + ((size_t)u * B + b) * Tl * C,
                     full + (b * Te + (size_t)u * Tl) * C, Tl * C * sizeof(float));
    return mc_reduce_scatter_sum(&m->grid, MC_GROUP_ETP, m->be, m->sp_buf, local, n, err);
}

/* An expert's hidden width on this rank. */
static size_t ffn_local(const mc_model *m)
{
    return (size_t)m->cfg.moe_ffn_hidden_size / etp_div(m);
}

static size_t fc1_width(const mc_model *m)
{
    return (size_t)(m->cfg.swiglu ? 2 : 1) * ffn_local(m);
}

/* The shared experts' hidden width on this rank. */
static size_t shared_local(const mc_model *m)
{
    return (size_t)m->cfg.moe_shared_expert_intermediate_size / etp_div(m);
}

/* The tokens the experts run on this rank: with sequence parallelism its
 * own rows, or under ETP its ETP group's (all of m->N when ETP = TP);
 * without it all of m->N. */
static size_t expert_tokens(const mc_model *m) { return m->sp ? m->Nl * etp_div(m) : m->N; }

/* The experts' tokens are a part of the router's (Nt): their choices and
 * probabilities are copied out (seq_xlocal), their gradients put back. */
static int own_rows(const mc_model *m) { return expert_tokens(m) < tokens_routed(m); }

/* Megatron's get_capacity over the micro-batch's N K choices: ceil(N K / E
 * x factor); 0 without a capacity factor or when it exceeds N (nothing can
 * be dropped then). */
static size_t capacity_of(const mc_model *m)
{
    const mc_model_config *c = &m->cfg;
    if (!(c->moe_expert_capacity_factor > 0)) return 0;
    size_t Nt = tokens_routed(m);
    double nk = (double)Nt * (double)c->moe_router_topk;
    size_t cap = (size_t)ceil(nk / (double)c->num_experts * (double)c->moe_expert_capacity_factor);
    return cap > Nt ? 0 : cap;
}

/* With --moe-pad-expert-input-to-capacity, every expert's rows: its
 * capacity (every token when the capacity exceeds them); else 0. */
static size_t pad_block(const mc_model *m)
{
    if (!m->cfg.moe_pad_expert_input_to_capacity) return 0;
    size_t cap = capacity_of(m);
    return cap ? cap : tokens_routed(m);
}

size_t mc_moe_rows_max(const mc_model *m)
{
    size_t nk = m->N * (size_t)m->cfg.moe_router_topk;
    size_t padded = pad_block(m) * (size_t)m->cfg.num_experts;
    return padded > nk ? padded : nk;
}

/* The rows this rank's experts may receive: its own permuted rows (one
 * process), or under expert parallelism every EP rank's rows at most. */
size_t mc_moe_expert_rows_max(const mc_model *m) { return (size_t)m->grid.ep * mc_moe_rows_max(m); }

static size_t moe_grad_span_max(const mc_model *m);

void mc_moe_layout(mc_model *m, carver *cv, mc_layer_acts *a, unsigned parts)
{
    const mc_model_config *c = &m->cfg;
    size_t N = m->N, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk, C = m->C;
    size_t R = mc_moe_rows_max(m), Rx = mc_moe_expert_rows_max(m), Nt = tokens_routed(m);
    size_t F = ffn_local(m);
    mc_moe_acts *x = &a->moe;
    (void)R;
    if (parts & MC_MOE_ACTS_ROUTE) {
        /* the router's side: every token of the micro-batch (Nt) */
        x->logits = carve(cv, Nt * E);
        x->probs = carve(cv, Nt * K);
        x->idx = (int32_t *)carve(cv, Nt * K);
        x->kept = (int32_t *)carve(cv, Nt * K);
        x->perm = (int32_t *)carve(cv, N * K);
        x->xp = carve(cv, Rx * C);
        x->fc1 = carve(cv, Rx * fc1_width(m));
        x->yp = carve(cv, Rx * C);
        int gather = m->grid.ep > 1 && c->moe_token_dispatcher_allgather;
        x->gperm = gather ? (int32_t *)carve(cv, (size_t)m->grid.ep * N * K) : NULL;
        x->lprobs = seq_split(m) ? carve(cv, N * K) : NULL;
        x->gprobs = gather ? carve(cv, (size_t)m->grid.ep * N * K) : NULL;
    }
    if (parts & MC_MOE_ACTS_ACT) x->act = carve(cv, Rx * F);
    size_t S = shared_local(m);
    if (S && (parts & MC_MOE_ACTS_SHARED)) {
        x->sfc1 = carve(cv, N * S * (c->swiglu ? 2 : 1));
        x->sact = carve(cv, N * S);
    }
}

void mc_moe_layout_scratch(mc_model *m, carver *cv)
{
    const mc_model_config *c = &m->cfg;
    size_t N = m->N, E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk, C = m->C;
    size_t Rx = mc_moe_expert_rows_max(m), F = ffn_local(m);
    size_t Nt = tokens_routed(m);
    m->moe_dlogits = carve(cv, Nt * E);
    m->moe_dprobs = carve(cv, Nt * K);
    m->moe_dyp = carve(cv, Rx * C);
    m->moe_dxp = carve(cv, Rx * C);
    m->moe_dact = carve(cv, Rx * F);
    m->moe_dfc1 = carve(cv, Rx * fc1_width(m));
    m->moe_counts = (int32_t *)carve(cv, E);
    size_t S = shared_local(m);
    m->moe_dsact = S ? carve(cv, N * S) : NULL;
    m->moe_dsfc1 = S ? carve(cv, N * S * (c->swiglu ? 2 : 1)) : NULL;
    m->moe_a2a = m->grid.ep > 1 ? carve(cv, Rx * C) : NULL;
    int gather = m->grid.ep > 1 && c->moe_token_dispatcher_allgather;
    m->moe_gidx = gather ? (int32_t *)carve(cv, (size_t)m->grid.ep * N * K) : NULL;
    m->moe_gdprobs = gather ? carve(cv, (size_t)m->grid.ep * N * K) : NULL;
    /* sequence or context parallelism: [N, E] rows plus the gathers'
     * staging [Nt, E]; sequence parallelism: one layer's MoE gradients */
    m->moe_sp = seq_split(m) ? carve(cv, (N + Nt) * E) : NULL;
    m->moe_gsp = m->sp ? carve(cv, moe_grad_span_max(m)) : NULL;
}

/* ------------------------------------------------------------ expert parallelism
 *
 * EP ranks hold E / EP experts each (rank i: experts [i El, (i+1) El)) and
 * different tokens. A rank's permuted rows are in expert order, so the
 * rows for EP rank j's experts are one block: the all-to-all sends block
 * j to rank j (the per-expert counts first), and rank j holds what it got
 * source by source, [i][expert] ("source-major"). The grouped GEMM wants
 * [expert][i] ("expert-major"): ep_reorder swaps the two with block
 * copies, and the results go back the same way. */

/* Copy the blocks of xrows[i El + j] rows of C floats between the
 * source-major and the expert-major layouts (to_expert: source-major in). */
static void ep_reorder(mc_model *m, float *dst, const float *src, const int64_t *xrows, size_t El,
                       int to_expert)
{
    size_t ep = (size_t)m->grid.ep, C = m->C, off_e[MC_MOE_MAX_EXPERTS];
    size_t o = 0;
    for (size_t j = 0; j < El; j++)
        for (size_t i = 0; i < ep; i++) off_e[i * El + j] = o, o += (size_t)xrows[i * El + j];
    o = 0;
    for (size_t i = 0; i < ep; i++)
        for (size_t j = 0; j < El; j++) {
            size_t n = (size_t)xrows[i * El + j] * C, e = off_e[i * El + j] * C;
            if (n) {
                if (to_expert)
                    mc_bcopy(m->be, dst + e, src + o, n * sizeof(float));
                else
                    mc_bcopy(m->be, dst + o, src + e, n * sizeof(float));
            }
            o += n;
        }
}

/* The all-to-all of rows between this rank's permuted rows (in expert
 * order, A->rows per expert) and the experts' source-major rows
 * (A->xrows): forward (to the experts) or back. */
static mc_status ep_exchange(mc_model *m, const mc_moe_acts *A, const float *in, float *out,
                             int to_experts, mc_error *err)
{
    size_t ep = (size_t)m->grid.ep, El = (size_t)m->cfg.num_experts / ep, C = m->C;
    size_t *v = malloc(4 * ep * sizeof *v);
    if (!v) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    size_t *mine = v, *mdispl = v + ep, *theirs = v + 2 * ep, *tdispl = v + 3 * ep;
    size_t a = 0, b = 0;
    for (size_t j = 0; j < ep; j++) {
        size_t rm = 0, rt = 0;
        for (size_t e = 0; e < El; e++) rm += (size_t)A->rows[j * El + e];
        for (size_t e = 0; e < El; e++) rt += (size_t)A->xrows[j * El + e];
        mine[j] = rm * C, mdispl[j] = a, a += rm * C;
        theirs[j] = rt * C, tdispl[j] = b, b += rt * C;
    }
    mc_status st = to_experts ? mc_alltoallv(&m->grid, MC_GROUP_EP, m->be, in, mine, mdispl, out,
                                             theirs, tdispl, err)
                              : mc_alltoallv(&m->grid, MC_GROUP_EP, m->be, in, theirs, tdispl, out,
                                             mine, mdispl, err);
    free(v);
    return st;
}

/* The rows of each of this rank's experts, over every source. */
static size_t ep_local_rows(const mc_model *m, const mc_moe_acts *A, int64_t *lrows)
{
    size_t ep = (size_t)m->grid.ep, El = (size_t)m->cfg.num_experts / ep, R = 0;
    for (size_t j = 0; j < El; j++) {
        lrows[j] = 0;
        for (size_t i = 0; i < ep; i++) lrows[j] += A->xrows[i * El + j];
        R += (size_t)lrows[j];
    }
    return R;
}

/* The allgather dispatcher (Megatron's MoEAllGatherTokenDispatcher): every
 * EP rank gathers the tokens, choices and probabilities of all EP ranks
 * ([ep][N] in rank order), permutes them all by expert (rows [lo, hi) are
 * this rank's experts'), runs its experts on those rows, unpermutes the
 * whole gathered batch with the other experts' rows zero, and the partial
 * outputs are reduce-scattered back to their ranks. The backward gathers
 * the output gradient and reduce-scatters the tokens' and probabilities'
 * gradients. Simple rather than lean: the permuted rows of all EP ranks
 * are held, though only this rank's experts' are computed. */
static size_t ag_range(const mc_model *m, const mc_moe_acts *A, size_t *lo, int64_t *lrows)
{
    size_t E = (size_t)m->cfg.num_experts, El = E / (size_t)m->grid.ep;
    size_t e0 = (size_t)m->grid.ep_rank * El, o = 0, R = 0;
    for (size_t e = 0; e < e0; e++) o += (size_t)A->xrows[e];
    for (size_t j = 0; j < El; j++) R += (size_t)(lrows[j] = A->xrows[e0 + j]);
    *lo = o;
    return R;
}

/* ------------------------------------------------ sequence and context parallelism
 *
 * Each tensor-parallel rank holds Tl = T / tp positions of every sequence
 * ([B, Tl] rows, model.c), and each context-parallel rank two chunks of
 * 2 cp (T = seq_length / cp rows, cp_attn.c); a rank runs the experts on
 * its own rows. The router's logits are gathered (over TP, then over CP)
 * so that every rank routes, drops and computes the balancing losses over
 * the whole micro-batch, [B, seq_length] in position order, as one
 * process does. */

/* The chunk of the whole sequence that half h of context-parallel rank
 * j's rows holds (cp_attn.c's load balancing). */
static size_t cp_chunk(const mc_model *m, int j, int h)
{
    return h == 0 ? (size_t)j : (size_t)(2 * m->grid.cp - 1 - j);
}

/* full [B Tg, w] (position order) from every rank's [B Tl, w] (local =
 * m->moe_sp's head; staged through its tail). */
static mc_status seq_gather(mc_model *m, float *full, const float *local, size_t w, mc_error *err)
{
    size_t B = (size_t)m->B, T = m->T, Tl = m->Tl, N = m->N;
    float *stage = m->moe_sp + N * w;
    /* this context-parallel rank's [B T, w] */
    float *mine = m->cpa ? m->moe_sp : full;
    if (m->sp) {
        int tp = m->grid.tp;
        TRY(mc_allgather(&m->grid, MC_GROUP_TP, m->be, local, stage, m->Nl * w, err));
        for (int q = 0; q < tp; q++)
            for (size_t b = 0; b < B; b++)
                mc_bcopy(m->be, mine + (b * T + (size_t)q * Tl) * w,
                         stage + ((size_t)q * B + b) * Tl * w, Tl * w * sizeof(float));
    }
    if (!m->cpa) return MC_OK;
    /* [cp][B][2][c] to [B][Tg]: rank j's halves are chunks j and 2cp-1-j */
    size_t c = T / 2, Tg = T * (size_t)m->grid.cp;
    TRY(mc_allgather(&m->grid, MC_GROUP_CP, m->be, mine, stage, N * w, err));
    for (int j = 0; j < m->grid.cp; j++)
        for (size_t b = 0; b < B; b++)
            for (int h = 0; h < 2; h++)
                mc_bcopy(m->be, full + (b * Tg + cp_chunk(m, j, h) * c) * w,
                         stage + (((size_t)j * B + b) * T + (size_t)h * c) * w,
                         c * w * sizeof(float));
    return MC_OK;
}

/* Copy this rank's rows [B Tl, w] out of full [B Tg, w] (4-byte
 * elements; back: into it); group: its ETP group's rows [B etpn Tl, w]
 * instead (the experts' tokens under ETP; its TP group's [B T] when ETP =
 * TP). */
static void seq_copy(mc_model *m, void *local, void *full, size_t w, int back, int group)
{
    size_t span = group ? etp_div(m) : 1; /* the TP ranks whose rows */
    size_t B = (size_t)m->B, T = m->T, Tl = m->sp ? m->Tl * span : m->T;
    size_t Tg = T * (size_t)m->grid.cp;
    size_t c = T / 2, r0 = m->sp ? (size_t)m->grid.tp_rank / span * Tl : 0;
    for (size_t b = 0; b < B; b++)
        for (size_t t = r0; t < r0 + Tl;) {
            /* a run of rows of one chunk */
            size_t g = t, n = r0 + Tl - t;
            if (m->cpa) {
                size_t h = t / c, end = (h + 1) * c;
                g = cp_chunk(m, m->grid.cp_rank, (int)h) * c + t % c;
                if (n > end - t) n = end - t;
            }
            float *l = (float *)local + (b * Tl + t - r0) * w,
                  *f = (float *)full + (b * Tg + g) * w;
            if (back)
                mc_bcopy(m->be, f, l, n * w * sizeof(float));
            else
                mc_bcopy(m->be, l, f, n * w * sizeof(float));
            t += n;
        }
}

static void seq_local(mc_model *m, void *local, const void *full, size_t w)
{
    seq_copy(m, local, (void *)full, w, 0, 0);
}

/* The experts' tokens' rows (own_rows): this rank's, or its TP group's. */
static void seq_xlocal(mc_model *m, void *local, const void *full, size_t w)
{
    seq_copy(m, local, (void *)full, w, 0, m->etp);
}

static void seq_xunlocal(mc_model *m, void *full, const void *local, size_t w)
{
    seq_copy(m, (void *)local, full, w, 1, m->etp);
}

/* The block of the buffer from layer l's router to its last MoE
 * parameter (*g0, *gn elements), summed over TP with sequence parallelism;
 * experts: the block of its experts' and shared experts' parameters
 * instead, summed over the ETP replicas (etp_sub; empty otherwise). */
static void moe_grad_span_of(const mc_model *m, const mc_layer_params *lp, int experts, size_t *g0,
                             size_t *gn)
{
    int ids[] = {lp->router_w, lp->router_b, lp->expert_bias, lp->efc1_w, lp->efc1_b,
                 lp->efc2_w,   lp->efc2_b,   lp->sfc1_w,      lp->sfc2_w};
    /* under ETP only the router's: the experts' slices see every token of
     * their ETP group */
    size_t i0 = experts ? 3 : 0, n = m->etp ? 3 : sizeof ids / sizeof ids[0];
    if (experts) n = etp_sub(m) ? sizeof ids / sizeof ids[0] : 3;
    size_t lo = SIZE_MAX, hi = 0;
    for (size_t i = i0; i < n; i++) {
        if (ids[i] < 0) continue;
        const mc_param *p = &m->params[ids[i]];
        if (p->offset < lo) lo = p->offset;
        if (p->offset + p->numel > hi) hi = p->offset + p->numel;
    }
    *g0 = hi > lo ? lo : 0;
    *gn = hi > lo ? hi - lo : 0;
}

static void moe_grad_span(const mc_model *m, const mc_layer_params *lp, size_t *g0, size_t *gn)
{
    moe_grad_span_of(m, lp, 0, g0, gn);
}

/* The largest such blocks over the model's MoE layers, both together (the
 * experts' block after the router's in m->moe_gsp). */
static size_t moe_grad_span_max(const mc_model *m)
{
    size_t mx = 0, mx2 = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        if (!m->lp[l].moe || m->lp[l].router_w < 0) continue;
        size_t g0, gn;
        moe_grad_span_of(m, &m->lp[l], 0, &g0, &gn);
        if (gn > mx) mx = gn;
        moe_grad_span_of(m, &m->lp[l], 1, &g0, &gn);
        if (gn > mx2) mx2 = gn;
    }
    return mx + mx2;
}

/* The activation of the experts (SwiGLU or GELU) on n rows of width F. */
static void act_fwd(mc_model *m, float *out, const float *in, size_t n, size_t F)
{
    if (m->cfg.swiglu)
        mc_k_swiglu_fwd(m->be, out, in, n, F, MC_PREC_FP32);
    else
        mc_k_gelu_fwd(m->be, out, in, n * F, MC_PREC_FP32);
}

/* The shared experts' fc1 and activation on the block's input h [N, C]. */
static void shared_fc1_act(mc_model *m, const mc_layer_params *lp, mc_moe_acts *A, const float *h,
                           size_t N)
{
    const mc_model_config *c = &m->cfg;
    size_t S = shared_local(m);
    mc_k_linear_fwd(m->be, m->prec, A->sfc1, h, param_val(m, lp->sfc1_w), param_prep(m, lp->sfc1_w),
                    NULL, N, m->C, S * (c->swiglu ? 2 : 1), 0.0f, 0);
    act_fwd(m, A->sact, A->sfc1, N, S);
}

static size_t ep_local_rows(const mc_model *m, const mc_moe_acts *A, int64_t *lrows);
static size_t ag_range(const mc_model *m, const mc_moe_acts *A, size_t *lo, int64_t *lrows);

mc_status mc_moe_recompute(mc_model *m, mc_slot *sl, int l, const float *h, int act, int shared,
                           mc_error *err)
{
    const mc_layer_params *lp = &m->lp[l];
    mc_moe_acts *A = &sl->acts[m->lidx[l]].moe;
    if (act) {
        /* the rows this rank's experts ran (the forward's count) */
        size_t R = 0, E = (size_t)m->cfg.num_experts, lo;
        int64_t lrows[MC_MOE_MAX_EXPERTS];
        if (m->grid.ep == 1)
            for (size_t e = 0; e < E; e++) R += (size_t)A->rows[e];
        else if (m->cfg.moe_token_dispatcher_allgather)
            R = ag_range(m, A, &lo, lrows);
        else
            R = ep_local_rows(m, A, lrows);
        act_fwd(m, A->act, A->fc1, R, ffn_local(m));
    }
    if (shared && lp->sfc1_w >= 0) {
        const float *hx = h;
        if (m->etp) TRY(etp_gather(m, h, &hx, err)); /* the ETP group's tokens */
        shared_fc1_act(m, lp, A, hx, expert_tokens(m));
    }
    return MC_OK;
}

static void act_bwd(mc_model *m, float *din, const float *dout, const float *in, size_t n, size_t F)
{
    mc_k_fill(m->be, din, 0.0f, n * F * (m->cfg.swiglu ? 2 : 1));
    if (m->cfg.swiglu)
        mc_k_swiglu_bwd(m->be, din, dout, in, n, F);
    else
        mc_k_gelu_bwd(m->be, din, dout, in, n * F);
}

/* The balancing loss's groups: the micro-batch (aux_loss) or each sequence
 * (seq_aux_loss). */
static void lb_groups(const mc_model *m, size_t *G, size_t *T)
{
    int seq = m->cfg.moe_load_balancing == MC_MOE_LB_SEQ_AUX;
    *G = seq ? (size_t)m->B : 1;
    *T = (seq ? m->T : m->N) * (size_t)m->grid.cp; /* the whole sequences under CP */
}

static int lb_on(const mc_model_config *c)
{
    return c->moe_load_balancing != MC_MOE_LB_NONE && c->moe_aux_loss_coeff > 0;
}

mc_status mc_moe_fwd(mc_model *m, mc_slot *sl, int l, const float *h, float *y, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    const mc_layer_params *lp = &m->lp[l];
    mc_moe_acts *A = &sl->acts[m->lidx[l]].moe;
    mc_backend *be = m->be;
    /* Nt: the micro-batch's tokens, routed alike on every rank of the
     * tensor- and context-parallel groups; Nr: this rank's rows (h); N:
     * the tokens the experts run (expert_tokens) */
    size_t Nt = tokens_routed(m), Nr = m->sp ? m->Nl : m->N, N = expert_tokens(m), C = m->C;
    size_t E = (size_t)c->num_experts;
    int split = seq_split(m);
    size_t K = (size_t)c->moe_router_topk;
    size_t F = ffn_local(m), fc1 = fc1_width(m);
    mc_moe_route r = route_of(c);
    /* ETP: the experts' input is the TP group's tokens (gathered with
     * sequence parallelism, m->gath), their output partial sums (yf), the
     * fc2 bias added by TP rank 0 alone */
    const float *hx = h;
    if (m->etp) TRY(etp_gather(m, h, &hx, err));
    float *yf = m->etp && m->sp ? m->moe_dyp : y;
    const float *b2 = m->etp && m->grid.tp_rank % m->etpn
                          ? NULL
                          : param_val(m, lp->efc2_b); /* once a group */

    /* the router, in fp32 (Megatron's --moe-router-dtype fp32); with
     * sequence or context parallelism each rank's rows, gathered */
    mc_k_linear_fwd(be, MC_PREC_FP32, split ? m->moe_sp : A->logits, h, param_val(m, lp->router_w),
                    NULL, param_val(m, lp->router_b), Nr, C, E, 0.0f, 0);
    if (split) TRY(seq_gather(m, A->logits, m->moe_sp, E, err));
    mc_k_moe_route_fwd(be, A->probs, A->idx, A->logits, param_val(m, lp->expert_bias), Nt, E, &r);
    /* expert capacity: the choices over it dropped (their probabilities
     * still normalize the others, as Megatron's masked probs do) */
    const int32_t *use = A->idx;
    const float *P = A->probs;
    size_t cap = capacity_of(m), block = pad_block(m);
    if (cap) {
        mc_k_moe_capacity_drop(be, A->kept, A->idx, A->probs, Nt, E, K, cap,
                               c->moe_token_drop_position);
        use = A->kept;
    }
    if (own_rows(m)) {
        /* the experts' tokens' choices and probabilities */
        seq_xlocal(m, m->moe_sp, use, K);
        seq_xlocal(m, A->lprobs, A->probs, K);
        use = (const int32_t *)m->moe_sp;
        P = A->lprobs;
    }
    mc_k_moe_permute_map(be, A->perm, m->moe_counts, use, N, E, K, block);
    int32_t counts[MC_MOE_MAX_EXPERTS];
    mc_bcopy_to_host(be, counts, m->moe_counts, E * sizeof(int32_t));
    size_t R = 0;
    for (size_t e = 0; e < E; e++) R += (size_t)(A->rows[e] = block ? (int64_t)block : counts[e]);
    if (m->grid.ep == 1) {
        if (block) mc_k_fill(be, A->xp, 0.0f, R * C); /* the padding rows: zeros, never read back */
        mc_k_moe_permute(be, A->xp, hx, A->perm, N, K, C);
        mc_k_grouped_linear_fwd(be, m->prec, A->fc1, A->xp, param_val(m, lp->efc1_w),
                                param_prep(m, lp->efc1_w), param_val(m, lp->efc1_b), A->rows, E, C,
                                fc1);
        act_fwd(m, A->act, A->fc1, R, F);
        mc_k_grouped_linear_fwd(be, m->prec, A->yp, A->act, param_val(m, lp->efc2_w),
                                param_prep(m, lp->efc2_w), b2, A->rows, E, F, C);
        mc_k_moe_unpermute(be, yf, A->yp, P, A->perm, N, K, C);
    } else if (c->moe_token_dispatcher_allgather) {
        size_t ep = (size_t)m->grid.ep, El = E / ep, G = ep * N, lo;
        int64_t lrows[MC_MOE_MAX_EXPERTS];
        /* int32 choices moved as 4-byte floats: MPI copies the bits */
        TRY(mc_allgather(&m->grid, MC_GROUP_EP, be, (const float *)use, (float *)m->moe_gidx, N * K,
                         err));
        TRY(mc_allgather(&m->grid, MC_GROUP_EP, be, P, A->gprobs, N * K, err));
        TRY(mc_allgather(&m->grid, MC_GROUP_EP, be, hx, m->moe_a2a, N * C, err));
        size_t gblock = block * ep; /* each rank's tokens padded to its capacity */
        mc_k_moe_permute_map(be, A->gperm, m->moe_counts, m->moe_gidx, G, E, K, gblock);
        mc_bcopy_to_host(be, counts, m->moe_counts, E * sizeof(int32_t));
        size_t Rg = 0;
        for (size_t e = 0; e < E; e++)
            Rg += (size_t)(A->xrows[e] = gblock ? (int64_t)gblock : counts[e]);
        size_t Rl = ag_range(m, A, &lo, lrows);
        if (block) mc_k_fill(be, A->xp, 0.0f, Rg * C);
        mc_k_moe_permute(be, A->xp, m->moe_a2a, A->gperm, G, K, C);
        mc_k_grouped_linear_fwd(be, m->prec, A->fc1, A->xp + lo * C, param_val(m, lp->efc1_w),
                                param_prep(m, lp->efc1_w), param_val(m, lp->efc1_b), lrows, El, C,
                                fc1);
        act_fwd(m, A->act, A->fc1, Rl, F);
        mc_k_fill(be, A->yp, 0.0f, Rg * C);
        mc_k_grouped_linear_fwd(be, m->prec, A->yp + lo * C, A->act, param_val(m, lp->efc2_w),
                                param_prep(m, lp->efc2_w), b2, lrows, El, F, C);
        mc_k_moe_unpermute(be, m->moe_dxp, A->yp, A->gprobs, A->gperm, G, K, C);
        TRY(mc_reduce_scatter_sum(&m->grid, MC_GROUP_EP, be, m->moe_dxp, yf, N * C, err));
    } else {
        /* expert parallelism: the rows travel to their experts' ranks and back */
        size_t El = E / (size_t)m->grid.ep;
        int64_t lrows[MC_MOE_MAX_EXPERTS];
        if (block) mc_k_fill(be, m->moe_dxp, 0.0f, R * C);
        mc_k_moe_permute(be, m->moe_dxp, hx, A->perm, N, K, C);
        TRY(mc_alltoall_i64(&m->grid, MC_GROUP_EP, A->rows, A->xrows, El, err));
        size_t Rx = ep_local_rows(m, A, lrows);
        TRY(ep_exchange(m, A, m->moe_dxp, m->moe_a2a, 1, err));
        ep_reorder(m, A->xp, m->moe_a2a, A->xrows, El, 1);
        mc_k_grouped_linear_fwd(be, m->prec, A->fc1, A->xp, param_val(m, lp->efc1_w),
                                param_prep(m, lp->efc1_w), param_val(m, lp->efc1_b), lrows, El, C,
                                fc1);
        act_fwd(m, A->act, A->fc1, Rx, F);
        mc_k_grouped_linear_fwd(be, m->prec, m->moe_dyp, A->act, param_val(m, lp->efc2_w),
                                param_prep(m, lp->efc2_w), b2, lrows, El, F, C);
        ep_reorder(m, m->moe_a2a, m->moe_dyp, A->xrows, El, 0);
        TRY(ep_exchange(m, A, m->moe_a2a, A->yp, 0, err));
    }
    if (m->grid.ep > 1 && !c->moe_token_dispatcher_allgather)
        mc_k_moe_unpermute(be, yf, A->yp, P, A->perm, N, K, C);
    if (lp->sfc1_w >= 0) {
        /* the shared experts on every token, added (Megatron's MoELayer) */
        size_t S = shared_local(m);
        shared_fc1_act(m, lp, A, hx, N);
        mc_k_linear_fwd(be, m->prec, yf, A->sact, param_val(m, lp->sfc2_w),
                        param_prep(m, lp->sfc2_w), NULL, N, S, C, 1.0f, 0);
    }
    if (m->etp) { /* the slices' partial outputs summed over ETP (scattered with SP) */
        float *out;
        TRY(etp_reduce(m, yf, y, &out, err));
    }

    /* Megatron computes the balancing losses in training only */
    A->train = sl->train;
    A->grad_scale = sl->grad_scale;
    if (m->rc_replay) return MC_OK; /* recomputation: counted by the forward already */
    if (sl->train) {
        /* the tokens each expert received, for the iteration's bias update
         * and the log (mc_model_moe_tokens_per_expert) */
        if (!m->moe_tpe) {
            m->moe_tpe = calloc(2 * (size_t)c->num_layers * E, sizeof *m->moe_tpe);
            if (!m->moe_tpe) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
        }
        /* with padding Megatron counts the padded rows too (its routing map) */
        for (size_t e = 0; e < E; e++) m->moe_tpe[(size_t)l * E + e] += (double)A->rows[e];
    }
    if (sl->train && (lb_on(c) || c->moe_z_loss_coeff > 0)) {
        size_t G, T, L = (size_t)c->num_layers;
        if (!m->moe_lb_layer) {
            m->moe_lb_layer = calloc(2 * L, sizeof *m->moe_lb_layer);
            if (!m->moe_lb_layer) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
            m->moe_z_layer = m->moe_lb_layer + L;
        }
        lb_groups(m, &G, &T);
        if (lb_on(c))
            m->moe_lb_layer[l] += mc_k_moe_aux_loss(be, NULL, A->logits, G, T, E, K,
                                                    c->moe_router_score_sigmoid, 0.0f);
        if (c->moe_z_loss_coeff > 0)
            m->moe_z_layer[l] += mc_k_moe_z_loss(be, NULL, A->logits, Nt, E, 0);
    }
    return MC_OK;
}

mc_status mc_moe_bwd(mc_model *m, mc_slot *sl, int l, const float *dy, const float *h,
                     mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    const mc_layer_params *lp = &m->lp[l];
    mc_moe_acts *A = &sl->acts[m->lidx[l]].moe;
    mc_backend *be = m->be;
    size_t Nt = tokens_routed(m), Nr = m->sp ? m->Nl : m->N, N = expert_tokens(m), C = m->C;
    size_t E = (size_t)c->num_experts, K = (size_t)c->moe_router_topk;
    size_t F = ffn_local(m), fc1 = fc1_width(m), R = 0;
    int split = seq_split(m);
    const float *P = own_rows(m) ? A->lprobs : A->probs;
    /* sequence parallelism: this micro-batch's gradients of the layer's
     * MoE parameters (router to shared experts, one block of the buffer;
     * under ETP the router's alone) into scratch, summed over the tensor-
     * parallel ranks (each saw its own rows), then added (the grad macro
     * below picks the pointer) */
    size_t g0 = 0, gn = 0, x0 = 0, xn = 0;
    if (m->sp) {
        moe_grad_span(m, lp, &g0, &gn);
        /* ETP < TP: the experts' block after it, summed over the replicas */
        moe_grad_span_of(m, lp, 1, &x0, &xn);
        mc_k_fill(be, m->moe_gsp, 0.0f, gn + xn);
    }
#define GRAD(i)                                                                  \
    ((i) < 0 ? NULL                                                              \
     : m->sp && m->params[i].offset >= g0 && m->params[i].offset < g0 + gn       \
         ? m->moe_gsp + (m->params[i].offset - g0)                               \
     : m->sp && xn && m->params[i].offset >= x0 && m->params[i].offset < x0 + xn \
         ? m->moe_gsp + gn + (m->params[i].offset - x0)                          \
         : param_grad(m, i))
    /* ETP: the output's gradient of the TP group's tokens (gathered with
     * sequence parallelism); the slices' d h are partial sums */
    const float *dyx = dy;
    if (m->etp) TRY(etp_gather(m, dy, &dyx, err));
    for (size_t e = 0; e < E; e++) R += (size_t)A->rows[e];
    mc_moe_route r = route_of(c);

    if (m->grid.ep == 1) {
        if (pad_block(m)) mc_k_fill(be, m->moe_dyp, 0.0f, R * C); /* padding rows: no gradient */
        mc_k_moe_unpermute_bwd(be, m->moe_dyp, m->moe_dprobs, dyx, A->yp, P, A->perm, N, K, C);
        mc_k_fill(be, m->moe_dact, 0.0f, R * F);
        mc_k_grouped_linear_bwd(be, m->prec, m->moe_dact, GRAD(lp->efc2_w), GRAD(lp->efc2_b),
                                m->moe_dyp, A->act, param_val(m, lp->efc2_w),
                                param_prep(m, lp->efc2_w), A->rows, E, F, C);
        act_bwd(m, m->moe_dfc1, m->moe_dact, A->fc1, R, F);
        mc_k_fill(be, m->moe_dxp, 0.0f, R * C);
        mc_k_grouped_linear_bwd(be, m->prec, m->moe_dxp, GRAD(lp->efc1_w), GRAD(lp->efc1_b),
                                m->moe_dfc1, A->xp, param_val(m, lp->efc1_w),
                                param_prep(m, lp->efc1_w), A->rows, E, C, fc1);
        mc_k_fill(be, m->dln, 0.0f, N * C);
        mc_k_moe_permute_bwd(be, m->dln, m->moe_dxp, A->perm, N, K, C);
    } else if (c->moe_token_dispatcher_allgather) {
        size_t ep = (size_t)m->grid.ep, El = E / ep, G = ep * N, lo, Rg = 0;
        int64_t lrows[MC_MOE_MAX_EXPERTS];
        for (size_t e = 0; e < E; e++) Rg += (size_t)A->xrows[e];
        size_t Rl = ag_range(m, A, &lo, lrows);
        TRY(mc_allgather(&m->grid, MC_GROUP_EP, be, dyx, m->moe_a2a, N * C, err));
        if (pad_block(m)) mc_k_fill(be, m->moe_dyp, 0.0f, Rg * C);
        mc_k_moe_unpermute_bwd(be, m->moe_dyp, m->moe_gdprobs, m->moe_a2a, A->yp, A->gprobs,
                               A->gperm, G, K, C);
        TRY(mc_reduce_scatter_sum(&m->grid, MC_GROUP_EP, be, m->moe_gdprobs, m->moe_dprobs, N * K,
                                  err));
        mc_k_fill(be, m->moe_dact, 0.0f, Rl * F);
        mc_k_grouped_linear_bwd(be, m->prec, m->moe_dact, GRAD(lp->efc2_w), GRAD(lp->efc2_b),
                                m->moe_dyp + lo * C, A->act, param_val(m, lp->efc2_w),
                                param_prep(m, lp->efc2_w), lrows, El, F, C);
        act_bwd(m, m->moe_dfc1, m->moe_dact, A->fc1, Rl, F);
        mc_k_fill(be, m->moe_dxp, 0.0f, Rg * C);
        mc_k_grouped_linear_bwd(
            be, m->prec, m->moe_dxp + lo * C, GRAD(lp->efc1_w), GRAD(lp->efc1_b), m->moe_dfc1,
            A->xp + lo * C, param_val(m, lp->efc1_w), param_prep(m, lp->efc1_w), lrows, El, C, fc1);
        mc_k_fill(be, m->moe_a2a, 0.0f, G * C);
        mc_k_moe_permute_bwd(be, m->moe_a2a, m->moe_dxp, A->gperm, G, K, C);
        TRY(mc_reduce_scatter_sum(&m->grid, MC_GROUP_EP, be, m->moe_a2a, m->dln, N * C, err));
    } else {
        /* expert parallelism: the rows' gradients to the experts' ranks and back */
        size_t El = E / (size_t)m->grid.ep;
        int64_t lrows[MC_MOE_MAX_EXPERTS];
        size_t Rx = ep_local_rows(m, A, lrows);
        if (pad_block(m)) mc_k_fill(be, m->moe_dxp, 0.0f, R * C);
        mc_k_moe_unpermute_bwd(be, m->moe_dxp, m->moe_dprobs, dyx, A->yp, P, A->perm, N, K, C);
        TRY(ep_exchange(m, A, m->moe_dxp, m->moe_a2a, 1, err));
        ep_reorder(m, m->moe_dyp, m->moe_a2a, A->xrows, El, 1);
        mc_k_fill(be, m->moe_dact, 0.0f, Rx * F);
        mc_k_grouped_linear_bwd(be, m->prec, m->moe_dact, GRAD(lp->efc2_w), GRAD(lp->efc2_b),
                                m->moe_dyp, A->act, param_val(m, lp->efc2_w),
                                param_prep(m, lp->efc2_w), lrows, El, F, C);
        act_bwd(m, m->moe_dfc1, m->moe_dact, A->fc1, Rx, F);
        mc_k_fill(be, m->moe_dxp, 0.0f, Rx * C);
        mc_k_grouped_linear_bwd(be, m->prec, m->moe_dxp, GRAD(lp->efc1_w), GRAD(lp->efc1_b),
                                m->moe_dfc1, A->xp, param_val(m, lp->efc1_w),
                                param_prep(m, lp->efc1_w), lrows, El, C, fc1);
        ep_reorder(m, m->moe_a2a, m->moe_dxp, A->xrows, El, 0);
        TRY(ep_exchange(m, A, m->moe_a2a, m->moe_dyp, 0, err));
        mc_k_fill(be, m->dln, 0.0f, N * C);
        mc_k_moe_permute_bwd(be, m->dln, m->moe_dyp, A->perm, N, K, C);
    }
    if (lp->sfc1_w >= 0) {
        size_t S = shared_local(m);
        mc_k_fill(be, m->moe_dsact, 0.0f, N * S);
        mc_k_linear_bwd(be, m->prec, m->moe_dsact, GRAD(lp->sfc2_w), NULL, dyx, A->sact,
                        param_val(m, lp->sfc2_w), param_prep(m, lp->sfc2_w), N, S, C, 0);
        act_bwd(m, m->moe_dsfc1, m->moe_dsact, A->sfc1, N, S);
        const float *hx = h; /* (m->gath: d y's gather is read no more) */
        if (m->etp) TRY(etp_gather(m, h, &hx, err));
        mc_k_linear_bwd(be, m->prec, m->dln, GRAD(lp->sfc1_w), NULL, m->moe_dsfc1, hx,
                        param_val(m, lp->sfc1_w), param_prep(m, lp->sfc1_w), N, C,
                        S * (c->swiglu ? 2 : 1), 0);
    }
    if (m->etp) {
        /* d probs: each slice's share of every output row's dot products;
         * d h: the slices' sums (this rank's rows with sequence
         * parallelism), to which the router's part is added below */
        float *out;
        TRY(mc_allreduce_sum(&m->grid, etp_group(m), be, m->moe_dprobs, N * K, err));
        TRY(etp_reduce(m, m->dln, m->loc, &out, err));
        if (out != m->dln) mc_bcopy(be, m->dln, out, Nr * C * sizeof(float));
    }

    /* the router: the probabilities' gradient, then the balancing losses
     * (Megatron's MoEAuxLossAutoScaler: their gradient weighted like the
     * main loss's, grad_scale) */
    if (own_rows(m)) {
        /* the router's backward over every token, with d probs of the
         * experts' tokens (the others' 0: their rows are not used below) */
        mc_bcopy(be, m->moe_sp, m->moe_dprobs, N * K * sizeof(float));
        mc_k_fill(be, m->moe_dprobs, 0.0f, Nt * K);
        seq_xunlocal(m, m->moe_dprobs, m->moe_sp, K);
    }
    mc_k_fill(be, m->moe_dlogits, 0.0f, Nt * E);
    mc_k_moe_route_bwd(be, m->moe_dlogits, m->moe_dprobs, A->logits, A->idx, Nt, E, &r);
    if (A->train) {
        size_t G, T;
        lb_groups(m, &G, &T);
        if (lb_on(c))
            mc_k_moe_aux_loss(be, m->moe_dlogits, A->logits, G, T, E, K,
                              c->moe_router_score_sigmoid, c->moe_aux_loss_coeff * A->grad_scale);
        if (c->moe_z_loss_coeff > 0)
            mc_k_moe_z_loss(be, m->moe_dlogits, A->logits, Nt, E,
                            c->moe_z_loss_coeff * A->grad_scale);
    }
    const float *dl = m->moe_dlogits;
    if (split) {
        seq_local(m, m->moe_sp, m->moe_dlogits, E); /* this rank's rows */
        dl = m->moe_sp;
    }
    mc_k_linear_bwd(be, MC_PREC_FP32, m->dln, GRAD(lp->router_w), GRAD(lp->router_b), dl, h,
                    param_val(m, lp->router_w), NULL, Nr, C, E, 0);
    if (m->sp) {
        TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, m->moe_gsp, gn, err));
        mc_k_acc(be, m->g + g0, m->moe_gsp, gn);
        if (xn) {
            TRY(mc_allreduce_sum(&m->grid, MC_GROUP_ETP_REP, be, m->moe_gsp + gn, xn, err));
            mc_k_acc(be, m->g + x0, m->moe_gsp + gn, xn);
        }
    }
#undef GRAD
    return MC_OK;
}

mc_status mc_model_moe_update_expert_bias(mc_model *m, int keep_counts, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    if (c->num_experts <= 0) return MC_OK;
    size_t E = (size_t)c->num_experts, L = (size_t)c->num_layers;
    if (!m->moe_tpe) {
        m->moe_tpe = calloc(2 * L * E, sizeof *m->moe_tpe);
        if (!m->moe_tpe) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    }
    /* nobody reads the counts: no collective, they restart */
    if (!c->moe_router_enable_expert_bias && !keep_counts) {
        memset(m->moe_tpe, 0, L * E * sizeof *m->moe_tpe);
        return MC_OK;
    }
    /* every data-parallel rank's tokens (tensor-parallel ranks saw the same
     * ones: the experts are replicated) */
    /* with sequence parallelism each tensor-parallel rank counted its rows
     * (under ETP = TP every rank counted the TP group's; under ETP < TP
     * every member of an ETP group its group's, and its rank 0 alone adds
     * them to the TP sum) */
    if (m->sp && etp_sub(m) && m->grid.tp_rank % m->etpn)
        memset(m->moe_tpe, 0, L * E * sizeof *m->moe_tpe);
    mc_status st = m->sp && (!m->etp || etp_sub(m))
                       ? mc_allreduce_sum_f64(&m->grid, MC_GROUP_TP, m->moe_tpe, L * E, err)
                       : MC_OK;
    /* and each context-parallel rank its chunks' rows */
    if (!st && m->grid.cp > 1)
        st = mc_allreduce_sum_f64(&m->grid, MC_GROUP_CP, m->moe_tpe, L * E, err);
    if (!st) st = mc_allreduce_sum_f64(&m->grid, MC_GROUP_DP, m->moe_tpe, L * E, err);
    if (st) return st;
    memcpy(m->moe_tpe + L * E, m->moe_tpe, L * E * sizeof *m->moe_tpe);
    if (!c->moe_router_enable_expert_bias) {
        memset(m->moe_tpe, 0, L * E * sizeof *m->moe_tpe);
        return MC_OK;
    }
    float tokens[MC_MOE_MAX_EXPERTS];
    for (size_t l = 0; l < L; l++) {
        int b = m->lp[l].expert_bias;
        if (b < 0) continue;
        for (size_t e = 0; e < E; e++) tokens[e] = (float)m->moe_tpe[l * E + e];
        mc_bcopy_from_host(m->be, m->moe_dlogits, tokens, E * sizeof(float));
        mc_k_moe_expert_bias_update(m->be, param_val(m, b), m->moe_dlogits, E,
                                    c->moe_router_bias_update_rate);
    }
    memset(m->moe_tpe, 0, L * E * sizeof *m->moe_tpe);
    return MC_OK;
}

const double *mc_model_moe_tokens_per_expert(const mc_model *m)
{
    return m->moe_tpe ? m->moe_tpe + (size_t)m->cfg.num_layers * (size_t)m->cfg.num_experts : NULL;
}

void mc_model_moe_losses(mc_model *m, double *load_balancing, double *z)
{
    size_t L = (size_t)m->cfg.num_layers;
    *load_balancing = *z = 0;
    if (!m->moe_lb_layer) return;
    for (size_t l = 0; l < L; l++) {
        *load_balancing += m->moe_lb_layer[l];
        *z += m->moe_z_layer[l];
    }
}

void mc_model_moe_layer_losses(mc_model *m, double *load_balancing, double *z)
{
    size_t L = (size_t)m->cfg.num_layers;
    for (size_t l = 0; l < L; l++) {
        load_balancing[l] = m->moe_lb_layer ? m->moe_lb_layer[l] : 0.0;
        z[l] = m->moe_lb_layer ? m->moe_z_layer[l] : 0.0;
    }
    if (m->moe_lb_layer) memset(m->moe_lb_layer, 0, 2 * L * sizeof *m->moe_lb_layer);
}
