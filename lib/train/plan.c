/*
 * plan.c - mc-train --dry-run: the memory and communication of a run on a
 * grid, from its configuration alone (see mc/plan.h). Every figure mirrors
 * the code that allocates or moves the bytes (params.c, model.c, optim.c,
 * pipeline.c); keep them in step. What each figure counts is in
 * doc/ARCHITECTURE.md, "Training".
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/plan.h"

#define PARAM_ALIGN 16 /* floats: params.c */

static int64_t padded(int64_t n) { return (n + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN; }

/* The bytes carve() of model.c takes for n floats: rounded up to 64. */
static double carved(double n) { return (double)(((int64_t)n * 4 + 63) / 64 * 64); }

/* Add one parameter of `local` elements. */
static void param(mc_plan_stage *s, int64_t local)
{
    s->params += local;
    s->numel += padded(local);
}

static void stage_params(const mc_model_config *c, int tp, int pp, int ep, int rank,
                         mc_plan_stage *s)
{
    int64_t C = c->hidden_size, V = c->padded_vocab_size, Q = c->num_attention_heads;
    int64_t G = c->num_query_groups, D = c->kv_channels, F = c->ffn_hidden_size;
    int64_t fc1 = c->swiglu ? 2 * F : F;
    int ln = c->normalization == MC_NORM_LAYERNORM, bias = c->add_bias_linear;
    if (rank == 0) {
        param(s, V / tp * C);
        if (c->position_embedding_type == MC_POS_LEARNED) param(s, c->max_position_embeddings * C);
    }
    for (int l = s->first_layer; l < s->last_layer; l++) {
        param(s, C);
        if (ln) param(s, C);
        param(s, (Q + 2 * G) * D / tp * C);
        if (bias) param(s, (Q + 2 * G) * D / tp);
        if (c->qk_layernorm) /* q_layernorm, k_layernorm: [D] weights (and biases) */
            for (int j = 0; j < (ln ? 4 : 2); j++) param(s, D);
        param(s, C * (Q * D / tp));
        if (bias) param(s, C);
        if (mc_model_layer_is_moe(c, l)) {
            /* params.c's moe_layer: replicated over tensor parallelism, or
             * under expert tensor parallelism the experts' fc1 rows, fc2
             * columns and the shared experts split over it (et) */
            int64_t et = c->moe_expert_tensor_parallel > 1 ? c->moe_expert_tensor_parallel : 1;
            int64_t E = c->num_experts, Fm = c->moe_ffn_hidden_size / et;
            int64_t f1 = c->swiglu ? 2 * Fm : Fm;
            param(s, C);
            if (ln) param(s, C);
            param(s, E * C);
            if (bias) param(s, E);
            if (c->moe_router_enable_expert_bias) param(s, E);
            /* the experts: E / ep of them on this rank */
            int64_t before = s->numel, El = E / ep;
            param(s, El * f1 * C);
            if (bias) param(s, El * f1);
            param(s, El * C * Fm);
            if (bias) param(s, El * C);
            s->numel_expert += s->numel - before;
            int64_t S = c->moe_shared_expert_intermediate_size / et;
            if (S) param(s, (c->swiglu ? 2 : 1) * S * C), param(s, C * S);
            continue;
        }
        param(s, C);
        if (ln) param(s, C);
        param(s, fc1 / tp * C);
        if (bias) param(s, fc1 / tp);
        param(s, C * (F / tp));
        if (bias) param(s, C);
    }
    if (rank == pp - 1) {
        param(s, C);
        if (ln) param(s, C);
        if (c->untie_embeddings_and_output_weights || pp > 1) param(s, V / tp * C);
    }
}

/* moe.c's moe_grad_span: one MoE layer's parameters from the router's
 * weight to the end of the last (each padded in the buffer but the last);
 * under expert tensor parallelism the router's alone, and with ETP < TP
 * (et < tp) the experts' block too (summed over the ETP replicas). */
static int64_t moe_span(const mc_model_config *c, int ep, int tp)
{
    int64_t C = c->hidden_size, E = c->num_experts, El = E / ep;
    int64_t et = c->moe_expert_tensor_parallel > 1 ? c->moe_expert_tensor_parallel : 1;
    int64_t Fm = c->moe_ffn_hidden_size / et, f1 = c->swiglu ? 2 * Fm : Fm;
    int64_t S = c->moe_shared_expert_intermediate_size / et;
    int bias = c->add_bias_linear;
    int64_t sizes[9], n = 0, total = 0, r = 0;
    sizes[n++] = E * C;
    if (bias) sizes[n++] = E;
    if (c->moe_router_enable_expert_bias) sizes[n++] = E;
    if (et > 1) { /* the router's block, then (et < tp) the experts' */
        for (int64_t i = 0; i < n; i++) r += i + 1 < n ? padded(sizes[i]) : sizes[i];
        if (et == tp) return r;
        n = 0;
    }
    sizes[n++] = El * f1 * C;
    if (bias) sizes[n++] = El * f1;
    sizes[n++] = El * C * Fm;
    if (bias) sizes[n++] = El * C;
    if (S) sizes[n++] = (c->swiglu ? 2 : 1) * S * C, sizes[n++] = C * S;
    for (int64_t i = 0; i < n; i++) total += i + 1 < n ? padded(sizes[i]) : sizes[i];
    return r + total;
}

typedef struct act_dims {
    double N, Nl, C, D, Ql, Gl, Fl, fc1;
    int ln, qkn; /* qkn: --qk-layernorm */
    /* a MoE layer's parts (moe.c's mc_moe_layout): router to experts, the
     * experts' activation, the shared experts */
    double moe_route, moe_act, moe_shared;
} act_dims;

static double layer_bytes(const act_dims *d, unsigned bits)
{
    double b = 0, norm = carved(d->Nl * d->C) + (d->ln ? 2 : 1) * carved(d->Nl);
    if (bits & MC_ACT_RES) b += carved(d->Nl * d->C);
    if (bits & MC_ACT_LN1) b += norm;
    if (bits & MC_ACT_QKV) b += carved(d->N * d->Ql * d->D) + 2 * carved(d->N * d->Gl * d->D);
    if ((bits & MC_ACT_QKV) && d->qkn) /* q and k before their norm, its statistics */
        b += carved(d->N * d->Ql * d->D) + carved(d->N * d->Gl * d->D) +
             (d->ln ? 2 : 1) * (carved(d->N * d->Ql) + carved(d->N * d->Gl));
    if (bits & MC_ACT_ATT) b += carved(d->N * d->Ql * d->D) + carved(d->N * d->Ql);
    if (bits & MC_ACT_RES2) b += carved(d->Nl * d->C);
    if (bits & MC_ACT_LN2) b += norm;
    if (bits & MC_ACT_FC1) b += carved(d->N * d->fc1);
    if (bits & MC_ACT_ACT) b += carved(d->N * d->Fl);
    if (bits & MC_ACT_MOE) b += d->moe_route;
    if (bits & MC_ACT_MOE_ACT) b += d->moe_act;
    if (bits & MC_ACT_SHARED) b += d->moe_shared;
    return b;
}

/* Whether the attention backward's four gradients fit in a dense layer's
 * fc1 and act tensors (model.c's place_attn_grads, the same test): then
 * they need no scratch. */
static int attn_grads_fit(const act_dims *d, int fc1_alone)
{
    double nq = d->N * d->Ql * d->D, nk = d->N * d->Gl * d->D;
    double sz[4] = {nq, nq, nk, nk}, cap[2] = {d->N * d->fc1, fc1_alone ? 0 : d->N * d->Fl};
    double used[2] = {0, 0};
    int r = 0;
    for (int i = 0; i < 4; i++) {
        while (r < 2 && used[r] + sz[i] > cap[r]) r++;
        if (r == 2) return 0;
        used[r] += ceil(sz[i] / 16) * 16;
    }
    return 1;
}

/* Layer i of a chunk of nl layers from global layer l0 under c's
 * recomputation (model.c's plan_recompute): what it keeps, its workspace
 * layer (*j), and whether full recomputation runs its forward again
 * (*again: 1, or 2 for a group's last layer, which skips fc2; 0: not). */
static unsigned layer_keep(const mc_model_config *c, int l0, int i, int nl, int *j, int *again)
{
    int moe = mc_model_layer_is_moe(c, l0 + i), N = c->recompute_num_layers;
    unsigned has = mc_recompute_layer_has(moe);
    *j = 0, *again = 0;
    if (c->recompute_granularity == MC_RECOMPUTE_SELECTIVE)
        return has & ~mc_recompute_dropped(c->recompute_modules, moe);
    if (c->recompute_granularity != MC_RECOMPUTE_FULL ||
        (c->recompute_method == MC_RECOMPUTE_BLOCK && i >= N))
        return has;
    int g0 = c->recompute_method == MC_RECOMPUTE_BLOCK ? i : i / N * N;
    int g1 = c->recompute_method == MC_RECOMPUTE_BLOCK ? i + 1 : g0 + N;
    if (g1 > nl) g1 = nl;
    *j = i - g0;
    *again = i == g1 - 1 ? 2 : 1;
    return i == g0 ? MC_ACT_RES : 0u;
}

/* model.c's compact workspace of full recomputation (plan_recompute,
 * compact_fits): every layer recomputed on its own, dense, no context
 * parallelism, and the shapes fit (the same test). */
static int compact_fits(const mc_model_config *c, const act_dims *d, double qkv, int l0, int nl,
                        int cp)
{
    if (c->recompute_granularity != MC_RECOMPUTE_FULL || c->num_experts > 0 || cp != 1) return 0;
    for (int i = 0; i < nl; i++) {
        int j, again;
        layer_keep(c, l0, i, nl, &j, &again);
        if (again != 2 || j != 0) return 0; /* not a group of one */
    }
    double f1 = d->N * d->fc1 * 4, fa = d->N * d->Fl * 4;
    double ln_dln = carved(d->Nl * d->C) + carved(d->N * d->C), q = carved(d->N * qkv);
    return ln_dln <= fa && ln_dln <= f1 && q <= fa && q <= f1 && attn_grads_fit(d, 1);
}

/* The layers' part of a slot (*kept) and the recomputation workspace (*ws)
 * of a chunk of nl layers from global layer l0 under c's recomputation
 * (model.c's plan_recompute and layout_acts: workspace layer j holds what
 * any layer running there does not keep). */
static void layers_acts(const mc_model_config *c, const act_dims *d, int l0, int nl, double *kept,
                        double *ws)
{
    unsigned *wb = calloc((size_t)nl + 1, sizeof *wb);
    *kept = *ws = 0;
    for (int i = 0; i < nl; i++) {
        int j, again;
        unsigned keep = layer_keep(c, l0, i, nl, &j, &again);
        *kept += layer_bytes(d, keep);
        if (wb && c->recompute_granularity != MC_RECOMPUTE_NONE)
            wb[j] |= mc_recompute_layer_has(mc_model_layer_is_moe(c, l0 + i)) & ~keep;
    }
    for (int j = 0; j < nl && wb; j++) *ws += layer_bytes(d, wb[j]);
    free(wb);
}

/* What recomputation runs again in a stage's backward, per micro-batch:
 * the layers whose attention runs again (over the CP group), the MoE
 * layers routed and dispatched again (the router's gathers over TP with
 * sequence parallelism and over CP, EP's exchanges), and the tensor-
 * parallel collectives of [N, C] (all-reduces, or with sequence
 * parallelism gathers and reduce-scatters): a full layer's proj and fc2
 * (fc2 not for a group's last layer; a MoE layer has none), with sequence
 * parallelism also the gathers of both norms' outputs (one for a MoE
 * layer); selective mlp, the gather of norm2's output (mlp_act, no GEMM:
 * nothing); attn_proj, proj's all-reduce (with sequence parallelism its
 * reduce-scatter). */
typedef struct replays {
    double att, moe, tp;
    double shared; /* the shared experts alone run again (their input gathered under ETP, SP) */
} replays;

static void stage_replays(const mc_model_config *c, int l0, int nl, int sp, replays *r)
{
    r->att = r->moe = r->tp = r->shared = 0;
    for (int i = 0; i < nl; i++) {
        int j, again, moe = mc_model_layer_is_moe(c, l0 + i);
        unsigned drop = mc_recompute_layer_has(moe) & ~layer_keep(c, l0, i, nl, &j, &again);
        if (again) {
            r->att++;
            r->moe += moe;
            r->tp += moe ? (sp ? 2 : 1) : (sp ? 4 : 2) - (again == 2);
            continue;
        }
        r->att += !!(drop & MC_ACT_ATT);
        r->moe += !!(drop & MC_ACT_MOE);
        r->shared += !(drop & MC_ACT_MOE) && (drop & MC_ACT_SHARED);
        r->tp += sp && (drop & MC_ACT_FC1); /* mlp: norm2's output gathered for fc1 */
        r->tp += !!(drop & MC_ACT_RES2);    /* attn_proj: proj's sum (or scatter) */
    }
}

/* model.c's activation block for this stage and its slots: into s's
 * act_kept (per slot), act_workspace, act_scratch and act_pipe (pipeline.c's
 * gradient buffer); returns the sum. */
static double stage_acts(const mc_model_config *c, int tp, int sp, int ep, int cp, int64_t B,
                         int first_layer, int first, int last, int nl, int slots, mc_plan_stage *s)
{
    double T = c->seq_length, N = (double)B * T, C = c->hidden_size, D = c->kv_channels;
    double Ql = c->num_attention_heads / tp, Gl = c->num_query_groups / tp;
    double Fl = c->ffn_hidden_size / tp, fc1 = c->swiglu ? 2 * Fl : Fl;
    double qkv = (Ql + 2 * Gl) * D, vl = (double)(c->padded_vocab_size / tp);
    double Nl = sp ? N / tp : N, chunk = N < 256 ? N : 256;
    int ln = c->normalization == MC_NORM_LAYERNORM;
    act_dims d = {N, Nl, C, D, Ql, Gl, Fl, fc1, ln, c->qk_layernorm, 0, 0, 0};
    (void)first;
    double moe_scratch = 0;
    if (c->num_experts > 0) {
        /* model.c/moe.c: a MoE layer carves its own block instead of the
         * MLP's fc1 and act (R = N K permuted rows; the router's side is
         * the micro-batch's Nt tokens, gathered under context parallelism) */
        double E = c->num_experts, K = c->moe_router_topk, R = N * K, Nt = N * cp;
        int split = sp || cp > 1;
        if (c->moe_pad_expert_input_to_capacity && c->moe_expert_capacity_factor > 0) {
            /* moe.c's pad_block: every expert's rows its capacity */
            double cap = ceil(Nt * K / E * (double)c->moe_expert_capacity_factor);
            if (cap > Nt) cap = Nt;
            if (E * cap > R) R = E * cap;
        }
        /* expert tensor parallelism: the experts' and shared experts'
         * hidden widths split over TP */
        double et = c->moe_expert_tensor_parallel > 1 ? c->moe_expert_tensor_parallel : 1;
        double Fm = c->moe_ffn_hidden_size / et, f1 = c->swiglu ? 2 * Fm : Fm;
        double S = c->moe_shared_expert_intermediate_size / et, s1 = c->swiglu ? 2 * S : S;
        /* the experts' side: every EP rank's rows at most (moe.c's Rx) */
        double Rx = ep * R, G = c->moe_token_dispatcher_allgather && ep > 1 ? ep * N * K : 0;
        d.moe_route = carved(Nt * E) + 3 * carved(Nt * K) + carved(N * K) + 2 * carved(Rx * C) +
                      carved(Rx * f1) + (G ? 2 * carved(G) : 0) + (split ? carved(N * K) : 0);
        d.moe_act = carved(Rx * Fm);
        d.moe_shared = S ? carved(N * s1) + carved(N * S) : 0;
        moe_scratch = carved(Nt * E) + carved(Nt * K) + 2 * carved(Rx * C) + carved(Rx * Fm) +
                      carved(Rx * f1) + carved(E) + (S ? carved(N * S) + carved(N * s1) : 0) +
                      (ep > 1 ? carved(Rx * C) : 0) + (G ? 2 * carved(G) : 0) +
                      (split ? carved((N + Nt) * E) : 0) +
                      (sp ? carved((double)moe_span(c, ep, tp)) : 0);
    }
    double layers, ws;
    layers_acts(c, &d, first_layer, nl, &layers, &ws);
    /* model.c's compact workspace: no norm outputs (their statistics
     * stay); the head's overlay on it (a last stage with one slot, where
     * the last layer's output fits in the dead q ... lse and the whole in
     * the workspace) */
    int compact = compact_fits(c, &d, qkv, first_layer, nl, cp), overlay = 0;
    if (compact) {
        ws -= 2 * carved(Nl * C);
        double ov = 3 * carved(Nl * C) + (ln ? 2 : 1) * carved(Nl) + carved(chunk * vl) +
                    carved(N * C);
        overlay = last && slots == 1 &&
                  carved(Nl * C) <= layer_bytes(&d, MC_ACT_QKV | MC_ACT_ATT) && ov <= ws;
    }
    double slot = layers + (overlay ? 0 : carved(Nl * C)) + 4 * carved(N) + carved(Nl);
    if (last && !overlay) slot += 2 * carved(Nl * C) + (ln ? carved(Nl) : 0) + carved(Nl);
    /* model.c's scratch: qkv (d(fc1) is made in fc1's place, d(act) in
     * act's) and tmp, both in the compact workspace, dres, dln, the
     * attention's gradients unless they fit in a dense layer's fc1 and act,
     * the head's logits chunk (dln and the chunk in the overlay) and row
     * statistics */
    double shared = (compact ? 0 : carved(N * qkv) + carved(N * C)) + carved(Nl * C) +
                    (overlay ? 0 : carved(N * C) + carved(chunk * vl)) + 4 * carved(N);
    if (c->num_experts > 0 || !attn_grads_fit(&d, 0))
        shared += 2 * carved(N * Ql * D) + 2 * carved(N * Gl * D);
    if (sp) shared += 2 * carved(N * C) + carved(Nl * C) + carved(2 * C);
    if (c->qk_layernorm) shared += carved(N * Gl * D) + carved(4 * D);
    shared += moe_scratch;
    s->act_kept = slot;
    s->act_workspace = ws;
    s->act_scratch = shared;
    s->act_pipe = last ? 0 : Nl * C * 4; /* pipeline.c's gradient buffer */
    return slots * slot + ws + shared + s->act_pipe;
}

/* The other settings --dry-run shows beside the run's (mc_plan_stage.act_by). */
static const struct {
    const char *name;
    int granularity, method, num_layers;
    unsigned modules;
} settings[MC_PLAN_RECOMPUTE_SETTINGS] = {
    {"none", MC_RECOMPUTE_NONE, 0, 0, 0},
    {"selective core_attn", MC_RECOMPUTE_SELECTIVE, 0, 0, MC_RECOMPUTE_CORE_ATTN},
    {"selective core_attn,layernorm,mlp", MC_RECOMPUTE_SELECTIVE, 0, 0,
     MC_RECOMPUTE_CORE_ATTN | MC_RECOMPUTE_LAYERNORM | MC_RECOMPUTE_MLP},
    {"full uniform 1", MC_RECOMPUTE_FULL, MC_RECOMPUTE_UNIFORM, 1, 0},
};

mc_status mc_plan_compute(const mc_model_config *cfg, int world, int tp, int pp,
                          int64_t micro_batch, int64_t global_batch, int distributed_optimizer,
                          mc_plan *out, mc_error *err)
{
    return mc_plan_compute_cp(cfg, world, tp, pp, 1, micro_batch, global_batch,
                              distributed_optimizer, out, err);
}

/* Context parallelism's scratch (cp_attn.c) and traffic per layer and
 * micro-batch; c is the configuration with this rank's rows as its
 * seq_length (Tg / cp). Ring (p2p): the key/value blocks [k | v] of
 * 2 B T Gl D floats go round cp - 1 times forward and backward, and their
 * gradient cp times backward: one send and one receive each. Ulysses
 * (a2a): an exchange of a tensor of H heads sends and receives cp - 1
 * messages of B T (H/cp) D floats; forward q, k, v, out (2 Ql + 2 Gl
 * heads), backward q, k, v, out, dout and dq, dk, dv back (4 Ql + 4 Gl). */
static void cp_figures(const mc_model_config *c, int tp, int cp, int64_t B, int64_t Tg,
                       double *scratch, double *calls, double *bytes, double *wire, double *fcalls,
                       double *fbytes, double *fwire)
{
    double T = c->seq_length, D = c->kv_channels;
    double Ql = c->num_attention_heads / tp, Gl = c->num_query_groups / tp;
    double nkv = (double)B * T * Gl * D, nq = (double)B * T * Ql * D;
    if (c->cp_comm_type == MC_CP_A2A) {
        double big = nq > nkv ? nq : nkv;
        *scratch = 2 * (2 * carved(nq) + 2 * carved(nkv)) + carved((double)B * Ql * T) +
                   2 * carved(big) + carved((double)B * (double)Tg);
        double heads = 6 * Ql + 6 * Gl, msgs = 12.0 * (cp - 1);
        double sent = (cp - 1) * (double)B * T * D / cp * heads * 4;
        *calls = 2 * msgs, *bytes = 2 * sent, *wire = sent;
        /* the forward alone (recomputation's replay): q, k, v, out */
        double fsent = (cp - 1) * (double)B * T * D / cp * (2 * Ql + 2 * Gl) * 4;
        *fcalls = 8.0 * (cp - 1), *fbytes = 2 * fsent, *fwire = fsent;
    } else {
        *scratch = 4 * carved(2 * nkv) + carved(nq) + carved((double)B * Ql * T);
        double shifts = (cp - 1) + (cp - 1) + cp;
        *calls = 2 * shifts, *bytes = 2 * shifts * 2 * nkv * 4, *wire = shifts * 2 * nkv * 4;
        *fcalls = 2.0 * (cp - 1), *fbytes = 2.0 * (cp - 1) * 2 * nkv * 4;
        *fwire = (cp - 1) * 2 * nkv * 4;
    }
}

mc_status mc_plan_compute_cp(const mc_model_config *cfg, int world, int tp, int pp, int cp,
                             int64_t micro_batch, int64_t global_batch, int distributed_optimizer,
                             mc_plan *out, mc_error *err)
{
    return mc_plan_compute_grid(cfg, world, tp, pp, cp, 1, micro_batch, global_batch,
                                distributed_optimizer, out, err);
}

/* The MoE dispatch of one MoE layer and micro-batch over the EP group
 * (moe.c): calls, bytes handed (mc/comm_stats.h's count) and bytes sent. */
static void ep_figures(const mc_model_config *c, int ep, double Nt, double N, double *calls,
                       double *bytes, double *wire, double *fcalls, double *fbytes, double *fwire)
{
    /* Nt: the micro-batch's tokens (the capacity's), N: this rank's (its
     * sequence-parallel rows) */
    double E = c->num_experts, K = c->moe_router_topk, C = c->hidden_size, R = N * K;
    if (c->moe_token_dispatcher_allgather) {
        /* forward: all-gather the choices, probabilities and tokens,
         * reduce-scatter the outputs; backward: all-gather the output
         * gradient, reduce-scatter d probs and the tokens' gradient */
        double ag = 2 * N * K + N * C + N * C, rs = N * C + N * K + N * C;
        *calls = 7;
        *bytes = 4.0 * ep * (ag + rs);
        *wire = 4.0 * (ep - 1) * (ag + rs);
        /* the forward alone: three all-gathers, one reduce-scatter */
        *fcalls = 4;
        *fbytes = 4.0 * ep * (2 * N * K + 2 * N * C);
        *fwire = 4.0 * (ep - 1) * (2 * N * K + 2 * N * C);
        return;
    }
    if (c->moe_pad_expert_input_to_capacity && c->moe_expert_capacity_factor > 0) {
        double cap = ceil(Nt * K / E * (double)c->moe_expert_capacity_factor);
        R = E * (cap > Nt ? Nt : cap);
    }
    /* dispatch and combine, forward and backward: R rows each way with
     * balanced routing (exactly so with padding), 1 / ep of them kept */
    *calls = 4;
    *bytes = 4 * R * C * 4;
    *wire = 4 * R * C * 4 * (ep - 1) / ep;
    *fcalls = 2, *fbytes = *bytes / 2, *fwire = *wire / 2;
}

mc_status mc_plan_compute_grid(const mc_model_config *cfg, int world, int tp, int pp, int cp,
                               int ep, int64_t micro_batch, int64_t global_batch,
                               int distributed_optimizer, mc_plan *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (ep < 1 || (ep > 1 && (cfg->num_experts <= 0 || cfg->num_experts % ep)))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dry-run: expert-parallel size %d must divide the %d experts", ep,
                            cfg->num_experts);
    if (ep > 1 && world % (tp * pp * cp * ep))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dry-run: %d ranks do not divide into tensor-parallel %d x "
                            "pipeline-parallel %d x context-parallel %d x expert-parallel %d",
                            world, tp, pp, cp, ep);

    if (world < 1 || tp < 1 || pp < 1 || cp < 1 || micro_batch < 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dry-run: world %d, tensor %d, pipeline %d and micro-batch %lld "
                            "must be at least 1",
                            world, tp, pp, (long long)micro_batch);
    if (world % (tp * pp * cp))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dry-run: %d ranks do not divide into tensor-parallel %d x "
                            "pipeline-parallel %d x context-parallel %d",
                            world, tp, pp, cp);
    mc_model_config c = *cfg;
    mc_status st = mc_model_config_finish(&c, tp, err);
    if (!st) st = mc_model_check_cp(&c, tp, cp, err);
    if (!st) st = mc_model_check_recompute(&c, pp, err);
    if (st) return st;
    int dp = world / (tp * pp * cp);
    /* context parallelism: every figure below is of this rank's rows */
    int64_t Tg = c.seq_length;
    c.seq_length /= cp;
    /* the gradients are reduced (and Adam sharded) over data x context */
    int dpc = dp * cp;
    if (!global_batch) global_batch = micro_batch * dp;
    if (global_batch % (micro_batch * dp))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dry-run: global batch %lld is not a multiple of micro-batch %lld x "
                            "data-parallel %d",
                            (long long)global_batch, (long long)micro_batch, dp);
    if (c.num_layers_per_virtual_pipeline_stage > 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dry-run does not model the interleaved schedule "
                            "(--num-layers-per-virtual-pipeline-stage) yet");
    out->world = world, out->tp = tp, out->pp = pp, out->cp = cp, out->dp = dp, out->ep = ep;
    out->moe_allgather = ep > 1 && c.moe_token_dispatcher_allgather;
    out->etp = c.moe_expert_tensor_parallel > 1 ? c.moe_expert_tensor_parallel : 1;
    out->cp_comm_type = c.cp_comm_type;
    out->sequence_parallel = c.sequence_parallel && tp > 1;
    out->distributed_optimizer = distributed_optimizer;
    out->micro_batch = micro_batch, out->global_batch = global_batch;
    out->num_micro = global_batch / (micro_batch * dp);
    out->nstages = pp;
    mc_recompute_describe(&c, out->recompute, sizeof out->recompute);
    out->stage = calloc((size_t)pp, sizeof *out->stage);
    if (!out->stage) return mc_error_set(err, MC_ERR_NOMEM, "--dry-run: out of memory");

    int sp = out->sequence_parallel, ln = c.normalization == MC_NORM_LAYERNORM;
    double N = (double)micro_batch * c.seq_length, C = c.hidden_size;
    double X = N * C * 4, Nl = sp ? N / tp : N, M = (double)out->num_micro;
    double ar = 2.0 * (tp - 1) / tp, ag = (double)(tp - 1) / tp;
    for (int r = 0; r < pp; r++) {
        mc_plan_stage *s = &out->stage[r];
        if ((st = mc_model_stage_layers(&c, pp, r, &s->first_layer, &s->last_layer, err))) {
            mc_plan_free(out);
            return st;
        }
        stage_params(&c, tp, pp, ep, r, s);
        s->param_bytes = s->grad_bytes = (double)s->numel * 4;
        /* distopt.c: the shard is over the expert-data-parallel group under EP */
        int shard = ep > 1 ? dp / ep * cp : dpc;
        double mom = distributed_optimizer ? (double)((s->numel + shard - 1) / shard + 1)
                                           : (double)s->params;
        s->optim_bytes = 2 * mom * 4;
        int64_t slots = pp - r < out->num_micro ? pp - r : out->num_micro;
        s->slots = (int)(slots > 0 ? slots : 1);
        int first = r == 0, last = r == pp - 1, nl = s->last_layer - s->first_layer;
        for (int k = 0; k < MC_PLAN_RECOMPUTE_SETTINGS; k++) {
            mc_model_config ck = c;
            mc_plan_stage tmp = {0};
            ck.recompute_granularity = settings[k].granularity;
            ck.recompute_method = settings[k].method;
            ck.recompute_num_layers = settings[k].num_layers;
            ck.recompute_modules = settings[k].modules;
            s->act_by[k] = stage_acts(&ck, tp, sp, ep, cp, micro_batch, s->first_layer, first, last,
                                      nl, s->slots, &tmp);
        }
        s->act_bytes = stage_acts(&c, tp, sp, ep, cp, micro_batch, s->first_layer, first, last, nl,
                                  s->slots, s);
        replays rp;
        stage_replays(&c, s->first_layer, nl, sp, &rp);
        if (cp > 1) {
            double scratch, calls, bytes, wire, fcalls, fbytes, fwire;
            cp_figures(&c, tp, cp, micro_batch, Tg, &scratch, &calls, &bytes, &wire, &fcalls,
                       &fbytes, &fwire);
            s->act_bytes += scratch;
            for (int k = 0; k < MC_PLAN_RECOMPUTE_SETTINGS; k++) s->act_by[k] += scratch;
            /* and each MoE layer's all-gather of the router's logits
             * (moe.c, [N, E] per rank), per forward and replay */
            int nmoe = 0;
            for (int l = s->first_layer; l < s->last_layer; l++)
                nmoe += mc_model_layer_is_moe(&c, l);
            double gl = nmoe + rp.moe, lg = N * c.num_experts * 4;
            s->cp_calls = (int64_t)(M * (nl * calls + rp.att * fcalls + gl));
            s->cp_bytes = M * (nl * bytes + rp.att * fbytes + gl * cp * lg);
            s->cp_wire = M * (nl * wire + rp.att * fwire + gl * (cp - 1) * lg);
        }

        if (tp > 1) {
            /* per micro-batch: calls and bytes of all-reduce (a) and gather/scatter (g) */
            double a_calls = 0, a_bytes = 0, g_calls = 0, g_bytes = 0;
            /* expert tensor parallelism (moe.c): per MoE layer the partial
             * outputs summed (all-reduce, or with SP the input gathered and
             * the output reduce-scattered), backward d probs all-reduced
             * [N, K] and d h summed (with SP: the output gradient and, for
             * the shared experts, the input gathered again, d h
             * reduce-scattered); a replay of the block its forward's */
            int etp = c.moe_expert_tensor_parallel > 1, et = etp ? c.moe_expert_tensor_parallel : 1;
            double S = c.moe_shared_expert_intermediate_size > 0, dpk = N * c.moe_router_topk * 4;
            int nmoe = 0;
            for (int l = s->first_layer; l < s->last_layer; l++)
                nmoe += mc_model_layer_is_moe(&c, l);
            if (etp && et < tp) {
                /* ETP < TP: the same over the ETP group, whose rows with SP
                 * are et / tp of the TP group's (Xe); the experts' gradient
                 * block (after the router's) summed over the replicas */
                double f = sp ? (double)et / tp : 1, Xe = X * f, ea = nmoe, eab = nmoe * dpk * f;
                double eg = 0, egb = 0;
                if (!sp) {
                    ea += 2.0 * nmoe + rp.moe, eab += (2.0 * nmoe + rp.moe) * X;
                } else {
                    eg = (4.0 + S) * nmoe + 2.0 * rp.moe + S * rp.shared, egb = eg * Xe;
                    double xb = (double)(moe_span(&c, ep, tp) - moe_span(&c, ep, et)) * 4;
                    int r = tp / et;
                    s->etprep_calls = (int64_t)(M * nmoe);
                    s->etprep_bytes = M * nmoe * xb;
                    s->etprep_wire = M * nmoe * xb * 2.0 * (r - 1) / r;
                }
                s->etp_calls = (int64_t)(M * (ea + eg));
                s->etp_bytes = M * (eab + egb);
                s->etp_wire = M * (2.0 * (et - 1) / et * eab + (double)(et - 1) / et * egb);
            } else if (etp) {
                a_calls += nmoe, a_bytes += nmoe * dpk;
                if (!sp) {
                    a_calls += 2.0 * nmoe + rp.moe, a_bytes += (2.0 * nmoe + rp.moe) * X;
                } else {
                    double g = (4.0 + S) * nmoe + 2.0 * rp.moe + S * rp.shared;
                    g_calls += g, g_bytes += g * X;
                }
            }
            if (!sp) {
                /* a MoE layer's block is replicated: no sums of its own */
                a_calls += 4.0 * nl - 2.0 * nmoe, a_bytes += (4.0 * nl - 2.0 * nmoe) * X;
                if (first) a_calls += 1, a_bytes += X;            /* embedding */
                if (last) a_calls += 4, a_bytes += X + 3 * N * 4; /* head dX, CE stats */
            } else {
                /* a MoE layer has no MLP gathers and scatters (5 of the 10):
                 * it gathers the router's logits and sums its gradients */
                g_calls += 10.0 * nl - 5.0 * nmoe, g_bytes += (10.0 * nl - 5.0 * nmoe) * X;
                g_calls += nmoe, g_bytes += nmoe * N * c.num_experts * 4;
                a_calls += nmoe, a_bytes += nmoe * (double)moe_span(&c, ep, etp ? et : tp) * 4;
                /* norm weight gradients: one all-reduce per norm, two per layer */
                a_calls += 2.0 * nl, a_bytes += nl * (ln ? 4 : 2) * C * 4;
                if (first) g_calls += 2, g_bytes += 2 * X; /* RS fwd, AG bwd */
                if (last) {
                    /* AG of the final norm's output, RS of its gradient: the
                     * head runs forward and backward together (model.c),
                     * so nothing is gathered again (bench/comm measured) */
                    g_calls += 2, g_bytes += 2 * X;
                    a_calls += 4, a_bytes += 3 * N * 4 + (ln ? 2 : 1) * C * 4;
                }
            }
            /* --qk-layernorm: the q/k norms' weight (and bias) gradients,
             * partial over the heads, one all-reduce of [4 D] per layer */
            if (c.qk_layernorm) a_calls += nl, a_bytes += nl * 4.0 * c.kv_channels * 4;
            /* recomputation runs forward collectives again in the
             * backward (replays) */
            if (!sp) {
                a_calls += rp.tp, a_bytes += rp.tp * X;
            } else {
                g_calls += rp.tp, g_bytes += rp.tp * X;
                g_calls += rp.moe, g_bytes += rp.moe * N * c.num_experts * 4;
            }
            s->tp_calls = (int64_t)(M * (a_calls + g_calls));
            s->tp_bytes = M * (a_bytes + g_bytes);
            s->tp_wire = M * (ar * a_bytes + ag * g_bytes);
        }
        /* under expert parallelism the experts' gradients are reduced over
         * the expert-data-parallel group (grad_buckets.c), the rest over dp */
        int64_t dense = ep > 1 ? s->numel - s->numel_expert : s->numel;
        if (dpc > 1) {
            double gbytes = (double)dense * 4;
            s->dp_calls = distributed_optimizer ? 2 : 1;
            s->dp_bytes = distributed_optimizer ? 2 * gbytes : gbytes;
            s->dp_wire = 2.0 * (dpc - 1) / dpc * gbytes;
        }
        int edp = dp / ep * cp; /* the replicas of the experts: dp / ep x cp */
        if (ep > 1 && distributed_optimizer) {
            /* distopt.c: the dense gradients all-reduced over EP, then the
             * whole buffer reduce-scattered over EDP and the parameters
             * all-gathered there */
            double gbytes = (double)s->numel * 4;
            s->dp_calls = 0, s->dp_bytes = s->dp_wire = 0;
            if (edp > 1) {
                s->edp_calls = 2;
                s->edp_bytes = 2 * gbytes;
                s->edp_wire = 2.0 * (edp - 1) / edp * gbytes;
            }
        } else if (ep > 1 && edp > 1 && s->numel_expert > 0) {
            double gbytes = (double)s->numel_expert * 4;
            s->edp_calls = 1;
            s->edp_bytes = gbytes;
            s->edp_wire = 2.0 * (edp - 1) / edp * gbytes;
        }
        if (ep > 1) {
            int nmoe = 0;
            for (int l = s->first_layer; l < s->last_layer; l++)
                nmoe += mc_model_layer_is_moe(&c, l);
            double calls, bytes, wire, fcalls, fbytes, fwire;
            /* the tokens this rank dispatches: its rows, or under ETP its ETP
             * group's (with SP et of the TP group's tp rows) */
            double et = c.moe_expert_tensor_parallel > 1 ? c.moe_expert_tensor_parallel : 1;
            double Ne = sp ? Nl * et : N;
            ep_figures(&c, ep, N * cp, Ne, &calls, &bytes, &wire, &fcalls, &fbytes, &fwire);
            s->ep_calls = (int64_t)(M * (nmoe * calls + rp.moe * fcalls));
            s->ep_bytes = M * (nmoe * bytes + rp.moe * fbytes);
            s->ep_wire = M * (nmoe * wire + rp.moe * fwire);
            if (distributed_optimizer) {
                /* the dense gradients' all-reduce over EP, one call per run
                 * of dense parameters in the buffer */
                double d = (double)(s->numel - s->numel_expert) * 4;
                s->ep_calls += nmoe + 1;
                s->ep_bytes += d;
                s->ep_wire += 2.0 * (ep - 1) / ep * d;
            }
        }
        if (pp > 1) {
            double act = Nl * C * 4;
            s->pp_calls = (int64_t)(M * (!last + !first));
            s->pp_bytes = s->pp_wire = M * act * (!last + !first);
            if (!c.untie_embeddings_and_output_weights && (first || last)) {
                double e = (double)(c.padded_vocab_size / tp) * C * 4;
                s->embd_calls = 1, s->embd_bytes = e, s->embd_wire = e; /* 2(n-1)/n, n = 2 */
            }
        }
    }
    /* The model's own count: params.c's global_numel (tied copy excluded). */
    mc_plan_stage whole = {0};
    whole.first_layer = 0, whole.last_layer = c.num_layers;
    mc_model_config c1 = c;
    c1.moe_expert_tensor_parallel = 0;
    if (!mc_model_config_finish(&c1, 1, err)) {
        stage_params(&c1, 1, 1, 1, 0, &whole);
        out->global_params = whole.params;
        /* active per token: each MoE layer's top-k experts of E */
        int64_t Fm = c1.moe_ffn_hidden_size, f1 = c1.swiglu ? 2 * Fm : Fm;
        int64_t expert = f1 * c1.hidden_size + c1.hidden_size * Fm +
                         (c1.add_bias_linear ? f1 + c1.hidden_size : 0);
        out->active_params = out->global_params - (int64_t)mc_model_num_moe_layers(&c1) *
                                                      (c1.num_experts - c1.moe_router_topk) *
                                                      expert;
    }
    return MC_OK;
}

void mc_plan_free(mc_plan *p)
{
    free(p->stage);
    p->stage = NULL;
}

static void line(void (*print)(void *, const char *), void *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void line(void (*print)(void *, const char *), void *ctx, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    print(ctx, buf);
}

static double mib(double b) { return b / (1024.0 * 1024.0); }

void mc_plan_print(const mc_plan *p, void (*print)(void *ctx, const char *line), void *ctx)
{
    char epn[64] = "";
    if (p->ep > 1) snprintf(epn, sizeof epn, " (expert %d x expert-data %d)", p->ep, p->dp / p->ep);
    char etp[64] = "";
    if (p->etp > 1) snprintf(etp, sizeof etp, "; experts split over tensor %d", p->etp);
    line(print, ctx,
         "dry run: %d ranks = tensor %d x pipeline %d x context %d x data %d%s%s; micro-batch "
         "%lld, global batch %lld: %lld micro-batches per data-parallel rank per iteration",
         p->world, p->tp, p->pp, p->cp, p->dp, epn, etp, (long long)p->micro_batch,
         (long long)p->global_batch, (long long)p->num_micro);
    char active[96] = "";
    if (p->active_params != p->global_params)
        snprintf(active, sizeof active, " (%lld active per token: the router's top-k experts)",
                 (long long)p->active_params);
    line(print, ctx, "model: %lld parameters%s; sequence parallel %s, distributed optimizer %s",
         (long long)p->global_params, active, p->sequence_parallel ? "on" : "off",
         p->distributed_optimizer ? "on" : "off");
    for (int r = 0; r < p->nstages; r++) {
        const mc_plan_stage *s = &p->stage[r];
        double total = s->param_bytes + s->grad_bytes + s->optim_bytes + s->act_bytes;
        line(print, ctx, "stage %d (every rank with pipeline rank %d, %d ranks): layers %d-%d", r,
             r, p->tp * p->cp * p->dp, s->first_layer, s->last_layer - 1);
        line(print, ctx, "  parameters: %lld elements, %.0f bytes (%.1f MiB, fp32)",
             (long long)s->params, s->param_bytes, mib(s->param_bytes));
        line(print, ctx, "  gradients: %.0f bytes (%.1f MiB, fp32)", s->grad_bytes,
             mib(s->grad_bytes));
        line(print, ctx, "  optimizer: %.0f bytes (%.1f MiB: Adam m and v in fp32%s)",
             s->optim_bytes, mib(s->optim_bytes),
             !p->distributed_optimizer ? ""
             : p->ep > 1               ? ", sharded over expert-data-parallel ranks"
                                       : ", sharded over data-parallel ranks");
        line(print, ctx,
             "  activations: %.0f bytes (%.1f MiB) = %d micro-batch%s in flight x %.0f kept + "
             "%.0f recomputation workspace + %.0f scratch + %.0f pipeline buffer; recomputation "
             "%s",
             s->act_bytes, mib(s->act_bytes), s->slots, s->slots == 1 ? "" : "es", s->act_kept,
             s->act_workspace, s->act_scratch, s->act_pipe, p->recompute);
        line(print, ctx,
             "  activations by recomputation: %s %.1f MiB, %s %.1f MiB, %s %.1f MiB, %s %.1f MiB",
             settings[0].name, mib(s->act_by[0]), settings[1].name, mib(s->act_by[1]),
             settings[2].name, mib(s->act_by[2]), settings[3].name, mib(s->act_by[3]));
        line(print, ctx, "  total: %.0f bytes (%.1f MiB)", total, mib(total));
        line(print, ctx,
             "  communication per iteration (bytes into collectives / ring wire bytes, calls):");
        line(print, ctx, "    tensor-parallel group: %.0f / %.0f bytes, %lld calls", s->tp_bytes,
             s->tp_wire, (long long)s->tp_calls);
        line(print, ctx, "    data-parallel group: %.0f / %.0f bytes, %lld calls (%s%s)",
             s->dp_bytes, s->dp_wire, (long long)s->dp_calls,
             p->distributed_optimizer ? "reduce-scatter of gradients + all-gather of parameters"
                                      : "all-reduce of gradients",
             p->cp > 1 ? ", over data x context" : "");
        line(print, ctx, "    context-parallel group: %.0f / %.0f bytes, %lld calls (%s)",
             s->cp_bytes, s->cp_wire, (long long)s->cp_calls,
             p->cp_comm_type == MC_CP_A2A
                 ? "a2a: all-to-all of q, k, v and the output, sends and receives"
                 : "p2p: key/value blocks and their gradients round the ring, sends and receives");
        line(print, ctx, "    pipeline-parallel group: %.0f / %.0f bytes, %lld sends", s->pp_bytes,
             s->pp_wire, (long long)s->pp_calls);
        line(print, ctx, "    embedding group: %.0f / %.0f bytes, %lld calls", s->embd_bytes,
             s->embd_wire, (long long)s->embd_calls);
        if (p->etp > 1 && p->etp < p->tp) {
            line(print, ctx,
                 "    expert-tensor-parallel group: %.0f / %.0f bytes, %lld calls (the experts' "
                 "partial sums%s)",
                 s->etp_bytes, s->etp_wire, (long long)s->etp_calls,
                 p->sequence_parallel ? ", gathers and reduce-scatters" : "");
            line(print, ctx,
                 "    expert-tensor-parallel replica group: %.0f / %.0f bytes, %lld calls (%s)",
                 s->etprep_bytes, s->etprep_wire, (long long)s->etprep_calls,
                 p->sequence_parallel ? "all-reduce of the experts' gradients"
                                      : "none: every replica ran every token");
        }
        if (p->ep > 1) {
            line(print, ctx, "    expert-parallel group: %.0f / %.0f bytes, %lld calls (%s)",
                 s->ep_bytes, s->ep_wire, (long long)s->ep_calls,
                 p->moe_allgather ? "allgather dispatcher: all-gathers and reduce-scatters"
                                  : "all-to-all of the routed rows, balanced routing");
            line(print, ctx, "    expert-data-parallel group: %.0f / %.0f bytes, %lld calls (%s)",
                 s->edp_bytes, s->edp_wire, (long long)s->edp_calls,
                 p->distributed_optimizer
                     ? "the distributed optimizer: reduce-scatter of every gradient (the dense "
                       "ones summed over EP first) + all-gather of the parameters"
                     : "all-reduce of the experts' gradients");
        }
    }
}

mc_status mc_plan_check_fit(const mc_plan *p, int stage, int training, const mc_backend *be,
                            mc_error *err)
{
    const mc_plan_stage *s = &p->stage[stage >= 0 && stage < p->nstages ? stage : 0];
    double tr = training ? s->grad_bytes + s->optim_bytes : 0.0;
    double need = s->param_bytes + tr + s->act_bytes, G = 1024.0 * 1024.0 * 1024.0;
    char what[160], parts[160];
    double avail = mc_backend_mem_available(be, what, sizeof what);
    if (!(avail > 0) || need <= avail) return MC_OK;
    if (training)
        snprintf(parts, sizeof parts,
                 "parameters %.1f, gradients %.1f, optimizer %.1f, activations %.1f",
                 s->param_bytes / G, s->grad_bytes / G, s->optim_bytes / G, s->act_bytes / G);
    else
        snprintf(parts, sizeof parts, "parameters %.1f, activations %.1f", s->param_bytes / G,
                 s->act_bytes / G);
    return mc_error_set(err, MC_ERR_NOMEM,
                        "the model does not fit: pipeline stage %d needs %.0f bytes on each of "
                        "its ranks (%.1f GiB: %s; mc-train --dry-run shows the plan) and %s has "
                        "%.0f bytes (%.1f GiB)",
                        stage, need, need / G, parts, what, avail, avail / G);
}
