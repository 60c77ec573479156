/*
 * model_internal.h - the model object shared by params.c (the parameter
 * registry, buffers and initialization) and model.c (activations, forward
 * and backward). Private to lib/model.
 */
#ifndef MC_MODEL_INTERNAL_H
#define MC_MODEL_INTERNAL_H

#include "mc/model.h"

/* Indices into mc_model.params of one layer's parameters (-1: absent). */
typedef struct mc_layer_params {
    int ln1_w, ln1_b; /* self_attention.linear_qkv.layer_norm_{weight,bias} */
    int qkv_w, qkv_b;
    /* --qk-layernorm: self_attention.{q,k}_layernorm.{weight,bias} [D] (-1: absent) */
    int qn_w, qn_b, kn_w, kn_b;
    int proj_w, proj_b;
    int ln2_w, ln2_b; /* mlp.linear_fc1.layer_norm_{weight,bias} */
    int fc1_w, fc1_b;
    int fc2_w, fc2_b;
    /* A MoE layer (moe.c): fc1/fc2 are -1, ln2 is pre_mlp_layernorm, and
     * mlp.router.{weight,bias,expert_bias}, the experts' global [E, ...]
     * tensors mlp.experts.experts.linear_fc{1,2}.{weight,bias} */
    int moe;
    int router_w, router_b, expert_bias;
    int efc1_w, efc1_b, efc2_w, efc2_b;
    int sfc1_w, sfc2_w; /* mlp.shared_experts.linear_fc{1,2}.weight (-1: none) */
} mc_layer_params;

/* One MoE layer's saved activations (moe.c): N = B * T rows, R = N * K
 * permuted rows (each token once per chosen expert), E experts. */
typedef struct mc_moe_acts {
    float *logits;       /* [N, E] the router's */
    float *probs;        /* [N, K] */
    int32_t *idx, *perm; /* [N, K] the chosen experts, their rows in the permuted order */
    int32_t *kept;       /* [N, K] idx with the choices over capacity -1 */
    float *xp;           /* [Rx, C] the experts' input: the permuted input (ep 1), or the
                          * rows this rank's experts received, expert by expert */
    float *fc1, *act;    /* [Rx, fc1], [Rx, F] the experts' fc1 output and activation */
    float *yp;           /* [Rx, C] the experts' outputs for this rank's permuted rows
                          * (allgather: for every EP rank's, zero but this rank's experts') */
    int32_t *gperm;      /* allgather dispatcher: [ep N, K] the permutation of every EP
                          * rank's tokens */
    float *gprobs;       /* allgather dispatcher: [ep N, K] their probabilities */
    float *lprobs;       /* sequence or context parallelism: [N, K] the experts' tokens'
                          * probabilities (this rank's rows, or under ETP its TP group's) */
    float *sfc1, *sact;  /* [N, shared fc1], [N, shared F]: the shared experts' */
    int64_t *rows;       /* host [E]: the rows each expert received from this rank */
    int64_t *xrows;      /* host [ep, E / ep] (expert parallelism): the rows this rank's
                          * local expert j received from EP rank i, at [i E / ep + j] */
    int train;           /* the balancing losses' gradients go into the backward */
    float grad_scale;    /* their weight (the main loss's grad_scale) */
} mc_moe_acts;

/* One layer's saved activations (backend memory), N = B * T rows; the
 * residual stream and the norms hold Nl rows: N, or B * T / tp with
 * sequence parallelism (model.c). */
typedef struct mc_layer_acts {
    float *res;                 /* [Nl, C] the layer's input (residual stream) */
    float *ln1;                 /* [Nl, C] */
    float *ln1_mean, *ln1_rstd; /* [Nl] (mean only for LayerNorm) */
    float *q, *k, *v;           /* [N, Ql D], [N, Gl D], [N, Gl D], after RoPE */
    float *att;                 /* [N, Ql D] attention output */
    float *lse;                 /* [B, Ql, T] */
    float *res2;                /* [Nl, C] residual after attention */
    float *ln2;                 /* [Nl, C] */
    float *ln2_mean, *ln2_rstd;
    float *fc1;      /* [N, Fl] or [N, 2 Fl] with SwiGLU */
    float *act;      /* [N, Fl] */
    mc_moe_acts moe; /* a MoE layer's (moe.c); zeros for a dense layer */
    /* --qk-layernorm: q and k before their norm [N, Ql D], [N, Gl D], and
     * its statistics [N Ql], [N Gl] (the means only for LayerNorm); NULL
     * without */
    float *qp, *kp;
    float *qn_mean, *qn_rstd, *kn_mean, *kn_rstd;
} mc_layer_acts;

/* One micro-batch in flight on this stage: its saved activations. */
typedef struct mc_slot {
    mc_layer_acts *acts;              /* [nlocal]: the stage's layers, by loc[] */
    float *res_out;                   /* [nchunks][Nl, C] each chunk's last layer's output */
    float *lnf, *lnf_mean, *lnf_rstd; /* last stage: [Nl, C], [Nl] */
    float *dhead;                     /* last stage: d(final norm output), this rank's [Nl, C] */
    int32_t *tokens, *targets;        /* [N] backend copies */
    /* packed documents (mc_model_set_doc_resets), backend copies: each
     * token's position and segment start [N], and the positions of this
     * rank's [Nl] rows of the sequence-parallel regions */
    int32_t *pos, *seg, *pos_loc;
    int bwd; /* the forward ran the head's backward */
    /* this forward trains (MoE layers add their balancing losses, weighted
     * by grad_scale) */
    int train;
    float grad_scale;
} mc_slot;

/* The RoPE kernels' parameters of a configuration. */
static inline mc_rope mc_rope_of(const mc_model_config *c)
{
    int D = c->kv_channels;
    int R = c->rotary_percent > 0 && c->rotary_percent < 1 ? (int)(D * c->rotary_percent) : 0;
    mc_rope r = {c->rotary_base,
                 R,
                 c->use_rope_scaling,
                 c->rope_scaling_factor,
                 c->rope_low_freq_factor,
                 c->rope_high_freq_factor,
                 c->rope_original_max_position_embeddings};
    return r;
}

struct mc_model {
    mc_model_config cfg;
    mc_grid grid;
    mc_backend *be;
    int B;
    mc_prec prec;

    /* the registry (params.c) */
    mc_param *params;
    size_t nparams;
    size_t numel; /* local, with alignment gaps */
    int64_t global_numel;
    int wte, wpe, lnf_w, lnf_b, out_w; /* -1 when absent */
    mc_layer_params *lp;               /* [num_layers], global index; -1 off this stage */
    int nchunks;                       /* model chunks (virtual stages) on this rank; 1 without */
    int *cl0, *cl1;                    /* [nchunks]: chunk c holds global layers [cl0[c], cl1[c]) */
    int *lidx;                         /* [num_layers]: local index of a layer, -1 off this rank */
    int nlocal;                        /* layers on this rank */
    int first_stage, last_stage;
    float *p, *g; /* parameters and gradients, numel each */
    /* Where the backend keeps prepared weights (mc_backend_weight_bytes:
     * prec BF16, FP16 or TF32 on the CPU backend): the weight matrices of p
     * prepared for the GEMMs (bf16 bits, or rounded fp32 where bf16 is
     * emulated), pw_bytes an element at the same element offsets, remade
     * from p by each forward pass (its layers' and the head's; the backward
     * that follows uses them), so every GEMM of a pass shares one rounding
     * of its weight. NULL otherwise. */
    void *pw;
    size_t pw_bytes;
    /* 1 where the GEMMs multiply fp32 values rounded to prec (pw_bytes 4:
     * bf16 emulated, fp16, tf32) and FP8 is off: the activations that only
     * linear layers read (ln1, ln2 before a dense MLP, act, lnf, and
     * d(logits) outside distillation) are rounded by the kernel that makes
     * them (its round argument), once, and passed as exact
     * (MC_LIN_EXACT_X/DOUT), instead of rounded into scratch by each GEMM.
     * The same bits; MC_TEST_ROUND_PER_GEMM=1 turns it off to show it. */
    int round_acts;
    /* mc_model_hold_weights: while pw_hold, each weight is prepared by its
     * first use only (pw_ok[i] set), not by every forward pass; per_gemm:
     * MC_TEST_ROUND_PER_GEMM=1 (no holding, no optimizer-written copy,
     * nothing rounded where it is made) */
    int pw_hold, per_gemm;
    int pw_synced; /* mc_model_weights_prepared: pw equals p (the optimizer wrote both) */
    unsigned char *pw_ok;

    /* local sizes */
    size_t N, T, C, D, Ql, Gl, Fl, fc1_out, qkv_out;
    /* FP8 (fp8.c; cfg.fp8): per local layer 4 linears x 3 operands (x, W,
     * dy), index (lidx 4 + linear) 3 + operand: scales and this step's
     * amax (host), the amax histories (len each, newest first); backend
     * scratch for the quantized operands and the unscaled products. */
    float *fp8_scale, *fp8_cur, *fp8_hist;
    float *fp8_qx, *fp8_qw, *fp8_qd, *fp8_tmp, *fp8_red;
    int64_t v0, vl;    /* this rank's vocabulary rows */
    size_t chunk_rows; /* LM-head rows per chunk */
    int sp;            /* sequence parallelism on (and tp > 1) */
    int etp;           /* expert tensor parallelism (the experts split over TP, tp > 1) */
    int etpn;          /* its size (a divisor of tp; 1 without); etpn < tp: the TP group is
                        * tp / etpn ETP groups of etpn consecutive ranks (MC_GROUP_ETP) */
    size_t Tl, Nl;     /* positions and rows per rank in the sequence-parallel regions */

    /* activations and scratch (model.c), all carved from one block */
    void *act_block;
    int nslots;
    mc_slot *slots; /* [nslots], each with acts [nlocal] */
    /* Recomputation (cfg.recompute_*, model.c): per local layer, the global
     * layers [rc_g0, rc_g1) of its full-recomputation group (rc_g0 = -1: none;
     * the group's first layer keeps its input, the rest nothing), and what
     * the layer keeps (ACT_* bits of model.c); the workspace layers that
     * hold what is not kept while a layer runs, shared by every slot
     * (rc_nws of them: a group's layers, or 1); the block's parts. */
    int *rc_g0, *rc_g1;
    unsigned *rc_keep;
    mc_layer_acts *rc_ws;
    int rc_nws;
    unsigned *rc_wsbits; /* [rc_nws]: what workspace layer j holds (ACT_* bits) */
    int rc_replay;       /* a recomputation is running: MoE layers count no losses */
    /* full recomputation's compact workspace (model.c's layout_acts): no
     * norm outputs kept, no qkv or row-parallel scratch, the head's tensors
     * over it on a last stage with one slot */
    int rc_compact;
    size_t act_kept, act_ws, act_scratch; /* bytes: per slot, workspace, scratch */
    float *qkv;  /* [N, qkv_out] scratch; the backward's d(qkv) (compact: in the workspace) */
    float *tmp;  /* [N, C] row-parallel outputs before the all-reduce (compact: likewise) */
    float *dres; /* [Nl, C] */
    float *dln;  /* [N, C] */
    /* sequence parallelism only: a gathered [N, C] input, the [tp, B, Tl, C]
     * staging of a gather or reduce-scatter, its [Nl, C] result, and the
     * partial gradient of a norm's weight and bias [2C] */
    float *gath, *sp_buf, *loc, *nrm_g;
    /* the attention backward's d(att), d(q), d(k), d(v): a dense layer's
     * fc1 and act memory, set by each layer's backward (attn_grads_in_layer),
     * or scratch of their own (MoE models, or where they do not fit) */
    float *datt, *dq, *dk, *dv;
    int attn_grads_in_layer;
    /* --qk-layernorm: d(k before its norm) [N, Gl D], and the norms'
     * weight and bias gradients of this rank's heads [4 D] (q w, q b, k w, k b) */
    float *dkp, *qk_g;
    float *logits;                          /* [chunk_rows, vl] */
    float *rowmax, *sumexp, *tlogit, *loss; /* [N] */

    /* mc_model_set_doc_resets: the setting (docs_on: a reset is on), and
     * host scratch for the positions and segment starts of a micro-batch
     * ([N], [N], [Nl]) */
    mc_doc_resets docs;
    int docs_on;
    int32_t *hpos, *hseg, *hpos_loc;

    /* mc_model_set_logp_loss (NULL: the mean cross-entropy), and host
     * scratch for a micro-batch's log-probabilities and their weights [N] */
    mc_logp_loss_fn logp_loss;
    void *logp_loss_ctx;
    float *hlogp, *hdlogp;

    /* mc_model_set_grad_ready_hook (NULL: none) */
    mc_grad_ready_fn grad_ready;
    void *grad_ready_ctx;

    /* mc_model_set_teacher (kd.c; NULL: no distillation) */
    struct mc_kd *kd;

    /* context parallelism (cp_attn.c; NULL at cp = 1): T, N and the slots
     * are this rank's two chunks of every sequence, seq_length / cp rows */
    struct mc_cp_attn *cpa;
    /* MoE layers (moe.c): backend scratch of the backward (d logits [N, E],
     * d probs [N, K], d rows [R, C] twice, [R, F], [R, fc1]), the experts'
     * row counts [E] (int32), the host block of every slot's row counts,
     * and the balancing losses summed over forwards since the last
     * mc_model_moe_losses (the load-balancing loss without its coefficient,
     * the z-loss without its coefficient). */
    float *moe_dlogits, *moe_dprobs, *moe_dyp, *moe_dxp, *moe_dact, *moe_dfc1;
    float *moe_dsact, *moe_dsfc1; /* the shared experts' [N, F], [N, fc1] */
    float *moe_a2a;               /* expert parallelism: [Rx, C] the all-to-all's staging */
    int32_t *moe_gidx;            /* allgather dispatcher: [ep N K] the gathered choices */
    float *moe_gdprobs;           /* allgather dispatcher: [ep N K] d probs of every rank's */
    float *moe_sp;                /* sequence parallelism: [2 N E] rows and staging */
    float *moe_gsp;               /* sequence parallelism: one layer's MoE gradients */
    int32_t *moe_counts;
    int64_t *moe_rows_host;
    double *moe_lb_layer, *moe_z_layer; /* host [num_layers] each, by global layer */
    /* host [2, num_layers, E]: the tokens each expert received in this
     * iteration's training forwards, then the last iteration's summed over
     * data parallelism (NULL until the first) */
    double *moe_tpe;
};

/* Knowledge distillation (kd.c): the frozen teacher, the settings, and
 * backend scratch carved from one block: the teacher's logits of one head
 * chunk [chunk_rows, vl], their row maxima [N], the three KL sums of a chunk
 * [3, chunk_rows], and each row's KL [N]. */
typedef struct mc_kd {
    mc_model *teacher; /* borrowed */
    float inv_tau, tau, alpha;
    void *block;
    float *tlogits, *tmax, *sums, *kl;
    const float *t_lnf; /* the teacher's final-norm output [N, Ct] of this micro-batch */
    int on;             /* this forward runs the KL (training, counted targets) */
    double last_kl;     /* the last forward's mean KL over counted targets */
} mc_kd;

/* model.c: the teacher's side. Runs model t's forward over tokens (one
 * stage, slot 0) up to its final norm, gathered to all N rows; *lnf is in
 * t's buffers, valid until t runs again. Also prepares t's head weight. */
mc_status mc_model_final_hidden(mc_model *t, const int32_t *tokens, const float **lnf,
                                mc_error *err);
/* kd.c: the KL of head chunk rows [r0, r0 + R) of the student m whose
 * logits are in m->logits and whose cross-entropy statistics (m->rowmax,
 * m->sumexp) are reduced; with backward, m->logits becomes the mixed
 * gradient (scale as the cross-entropy's). tgt: the chunk's targets
 * (backend). */
mc_status mc_model_kd_chunk(mc_model *m, size_t r0, size_t R, const int32_t *tgt, int backward,
                            float scale, mc_error *err);
void mc_model_kd_free(mc_model *m);
/* fp8.c: the state (model creation, when cfg.fp8), and the transformer
 * layers' dense linears (which: 0 qkv, 1 proj, 2 fc1, 3 fc2) as
 * mc_k_linear_fwd/_bwd do them, in FP8 when cfg.fp8 */
enum { MC_LIN_QKV = 0, MC_LIN_PROJ, MC_LIN_FC1, MC_LIN_FC2 };
/* every parameter's prepared form made from its values (m->pw; nothing
 * without one): inference, whose weights do not change */
void model_prepare_weights(mc_model *m);
mc_status mc_model_fp8_new(mc_model *m, mc_error *err);
void mc_model_fp8_free(mc_model *m);
void mc_model_lin_fwd(mc_model *m, int l, int which, float *out, const float *x, int w,
                      const float *b, size_t N, size_t I, size_t O, unsigned exact);
void mc_model_lin_bwd(mc_model *m, mc_prec pr, int l, int which, float *dx, float *dW, float *db,
                      const float *dy, const float *x, int w, size_t N, size_t I, size_t O,
                      unsigned exact);

/* Context parallelism (cp_attn.c). mc_model_cp_new checks the sequence
 * length against the grid (MC_ERR_USAGE) and allocates the scratch of
 * type (MC_CP_P2P or MC_CP_A2A); m->T is already seq_length / cp. */
typedef struct mc_cp_attn mc_cp_attn;
mc_status mc_model_cp_new(mc_model *m, int type, mc_error *err);
void mc_model_cp_free(mc_model *m);
/* The micro-batch's whole sequences (host, B x seq_length; either may be
 * NULL) cut to this rank's rows; *count: the counted targets of the whole
 * micro-batch (the mean's denominator on every rank). */
mc_status mc_model_cp_cut(mc_model *m, const int32_t **tokens, const int32_t **targets,
                          int64_t *count, mc_error *err);
/* Sequence b of slot `slot`: the positions and segment starts (as positions
 * in the whole sequence) of this rank's rows, from the whole sequence's
 * tokens (NULL: no resets, plain positions). */
mc_status mc_model_cp_layout(mc_model *m, int slot, size_t b, const int32_t *tokens, int32_t *pos,
                             int32_t *seg, mc_error *err);
/* Attention of layer acts L over the group: L->att and L->lse from L->q,
 * k, v (forward); m->dq, dk, dv (zero on entry) from m->datt (backward).
 * seg: the slot's segment starts or NULL. */
mc_status mc_model_cp_attention_fwd(mc_model *m, const mc_slot *sl, mc_layer_acts *L,
                                    const int32_t *seg, mc_error *err);
mc_status mc_model_cp_attention_bwd(mc_model *m, const mc_slot *sl, mc_layer_acts *L,
                                    const int32_t *seg, mc_error *err);
/* recompute.c: Megatron's checks of the recomputation options (the
 * combinations; the default module), called by mc_model_config_finish. */
mc_status mc_model_recompute_finish(mc_model_config *c, mc_error *err);

/* Fill m->params, m->lp and the indices from m->cfg and m->grid (params.c). */
mc_status mc_model_build_registry(mc_model *m, mc_error *err);

/* Carving one backend block into 64-byte-aligned arrays (model.c's
 * activations, infer.c's context): a first pass with base NULL only counts
 * the bytes, a second with the allocated block hands out the pointers. */
typedef struct carver {
    char *base;
    size_t off;
} carver;

static inline float *carve(carver *cv, size_t n)
{
    float *p = cv->base ? (float *)(cv->base + cv->off) : NULL;
    cv->off += (n * sizeof(float) + 63) / 64 * 64;
    return p;
}

/* The per-token positions and segment starts of slot sl for the kernels
 * (NULL where the corresponding reset is off: plain positions, causal). */
static inline const int32_t *slot_pos(const mc_model *m, const mc_slot *sl)
{
    /* context parallelism: a rank's rows are two chunks, never 0 .. T-1 */
    return (m->docs_on && m->docs.reset_position_ids) || m->cpa ? sl->pos : NULL;
}
static inline const int32_t *slot_seg(const mc_model *m, const mc_slot *sl)
{
    return m->docs_on && m->docs.reset_attention_mask ? sl->seg : NULL;
}

/* Parameter i's values, and its form prepared for the GEMMs (m->pw; NULL
 * where the model keeps none); NULL when the parameter is absent (i < 0). */
static inline float *param_val(mc_model *m, int i)
{
    return i < 0 ? NULL : m->p + m->params[i].offset;
}
/* Parameter i's gradient (NULL when the parameter is absent). */
static inline float *param_grad(mc_model *m, int i)
{
    return i < 0 ? NULL : m->g + m->params[i].offset;
}
static inline const void *param_prep(mc_model *m, int i)
{
    return i < 0 || !m->pw ? NULL : (const char *)m->pw + m->params[i].offset * m->pw_bytes;
}

/* --qk-layernorm: out = norm(x) over rows [rows, D] (each head's query
 * or key), with the weights [D] of parameter w (and bias b) shared by the
 * heads, Megatron's q_layernorm and k_layernorm; mean [rows] is written
 * for LayerNorm only (NULL for RMSNorm). Training and inference share it. */
static inline void mc_model_qk_norm(mc_model *m, float *out, float *mean, float *rstd,
                                    const float *x, size_t rows, int w, int b)
{
    if (m->cfg.normalization == MC_NORM_LAYERNORM)
        mc_k_layernorm_fwd(m->be, out, mean, rstd, x, param_val(m, w), param_val(m, b), rows, m->D,
                           m->cfg.norm_epsilon, MC_PREC_FP32);
    else
        mc_k_rmsnorm_fwd(m->be, out, rstd, x, param_val(m, w), rows, m->D, m->cfg.norm_epsilon,
                         MC_PREC_FP32);
}

/* moe.c: the MoE block in place of a layer's MLP. Forward: h [N, C] the
 * pre-MLP norm's output, y [N, C] the block's output (WRITTEN). Backward:
 * dy [N, C] the output's gradient, m->dln gets d(h) (WRITTEN), the layer's
 * parameters their gradients (added). */
mc_status mc_moe_fwd(mc_model *m, mc_slot *sl, int l, const float *h, float *y, mc_error *err);
mc_status mc_moe_bwd(mc_model *m, mc_slot *sl, int l, const float *dy, const float *h,
                     mc_error *err);
/* moe.c: the MoE layers' part of the activation layout (carve: the parts
 * in `parts`, MC_MOE_ACTS_*; the others are left as they are) and scratch. */
enum {
    MC_MOE_ACTS_ROUTE = 1 << 0,  /* the router's, the dispatch's and the experts' but: */
    MC_MOE_ACTS_ACT = 1 << 1,    /* the experts' activation output */
    MC_MOE_ACTS_SHARED = 1 << 2, /* the shared experts' */
};
void mc_moe_layout(mc_model *m, carver *cv, mc_layer_acts *a, unsigned parts);
/* moe.c: recomputation of MoE layer l's experts' activation (act) and the
 * shared experts (shared; h the block's input) from what the forward
 * kept, by the forward's calls. */
mc_status mc_moe_recompute(mc_model *m, mc_slot *sl, int l, const float *h, int act, int shared,
                           mc_error *err);
/* model.c: the sequence-parallel gather of [Nl, C] rows to the micro-batch's
 * [N, C] (*full = m->gath; without sequence parallelism *full = local), and
 * the sum of partial [N, C] rows over TP (all-reduce in place, *out = full;
 * with sequence parallelism a reduce-scatter into local, *out = local). */
mc_status mc_model_tp_gather(mc_model *m, const float *local, const float **full, mc_error *err);
mc_status mc_model_tp_reduce(mc_model *m, float *full, float *local, float **out, mc_error *err);
void mc_moe_layout_scratch(mc_model *m, carver *cv);
size_t mc_moe_rows_max(const mc_model *m);
size_t mc_moe_expert_rows_max(const mc_model *m);

/* moe_infer.c: the MoE block of inference (infer.c, infer_batch.c), the
 * training forward's steps on n rows without saved activations or losses.
 * The linears run through the caller's function: out[n, O] = in[n, I]
 * W_e^T (+ b), W_e expert e's [O, I] block of parameter w's rows (e = 0
 * for the router and the shared experts); fp32 1 for the router, which
 * runs in fp32 whatever the experts' precision. */
typedef void (*mc_moe_linear_fn)(void *ctx, float *out, const float *in, int w, size_t e,
                                 const float *b, size_t n, size_t I, size_t O, int fp32);
typedef struct mc_moe_infer_scratch {
    float *logits, *probs;
    int32_t *idx, *kept, *perm, *counts;
    float *xp, *fc1, *act, *yp, *yg, *y, *sfc1, *sact, *stmp; /* yg: EP's gathered yp */
} mc_moe_infer_scratch;
/* Scratch for `rows` rows (nothing for a dense model). */
void mc_moe_infer_layout(const mc_model *m, carver *cv, mc_moe_infer_scratch *s, size_t rows);
/* x[n, C] += the block of layer l on h[n, C], the pre-MLP norm's output.
 * drop: apply the checkpoint's capacity factor over these n rows (Megatron
 * drops over the tokens of a forward pass); 0: never drop. */
mc_status mc_moe_infer_fwd(mc_model *m, int l, const mc_moe_infer_scratch *s, const float *h,
                           float *x, size_t n, int drop, mc_moe_linear_fn lin, void *ctx,
                           mc_error *err);
/* An expert's capacity over n tokens (0: no dropping), moe.c's rule. */
size_t mc_moe_infer_capacity(const mc_model_config *c, size_t n);
/* The weights of MoE layer l that inference may hold as int8 or bf16 (the
 * experts', the shared experts'; never the router's) into out[4]; their
 * number (0 for a dense layer). */
int mc_moe_infer_weights(const mc_model *m, int l, int *out);

/* The int8 copy of a linear's weight for mc_k_linear_q8a8_fwd (mc-eval's
 * and mc-serve's int8 weights, one kernel for both): src [groups x rows,
 * cols] fp32 quantized by rows (mc_k_quantize_q8_rows) into scale
 * [groups x rows], and each group's codes packed (mc_k_pack_q8a8), group g
 * at packed + g mc_k_q8a8_packed_bytes(rows, cols). groups: 1, or an MoE
 * layer's experts (mc_infer_q8a8_groups). Both outputs are backend memory
 * (NULL on failure; the caller frees what was allocated). */
mc_status mc_infer_q8a8_weight(mc_backend *be, const float *src, size_t groups, size_t rows,
                               size_t cols, uint8_t **packed, float **scale, mc_error *err);
/* The groups of parameter w's rows: this rank's experts (E, or E / EP
 * under expert parallelism) for an MoE layer's expert weights (one matrix
 * per expert), 1 otherwise. */
size_t mc_infer_q8a8_groups(const mc_model *m, int w);

#endif
