/*
 * infer.c - forward-only evaluation of one sequence with a key/value cache
 * (model.h, "inference"): what mc-eval's perplexity, log-likelihoods and
 * generation run on. The context (mc_infer) borrows the model's parameters
 * and owns the caches and scratch; mc_infer_extend runs new tokens and scores
 * their targets, on fp32 or int8 weights. See doc/ARCHITECTURE.md, "Inference".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* LM-head rows per chunk when scoring: logits of HEAD_ROWS x V/tp floats. */
#define HEAD_ROWS 128

struct mc_infer {
    mc_model *m;
    mc_backend *be;
    int max_len, max_rows, len;
    size_t C, D, Ql, Gl, Fl, fc1_out, qkv_out, hr;
    int64_t v0, vl;
    float **kc, **vc; /* [nlocal] caches, [max_len, Gl, D] each */
    void *block;      /* everything below, one allocation */
    float *x, *h, *qkv, *q, *att, *tmp, *fc1, *act, *mean, *rstd, *lnf;
    float *last; /* [C] normed state of the last row run */
    /* --qk-layernorm: q and k before their norm, and its statistics
     * (empty without) */
    float *qp, *kp, *qn_mean, *qn_rstd;
    float *hrows, *logits, *rowmax, *sumexp, *tlogit, *loss; /* head scratch */
    float *gathered;                                         /* [tp * vl] */
    int32_t *dtok, *dtgt;
    int32_t *dpos, *dseg; /* [max_rows] the chunk's positions and segment starts */
    int have_last;
    mc_moe_infer_scratch moe; /* MoE layers' scratch for max_rows rows */
    /* packed documents (the model's mc_doc_resets): per cache position the
     * first position of its document and whether its token is the eod;
     * host scratch for the chunk's positions and segment starts */
    int32_t *hdoc, *hpos, *hseg;
    unsigned char *heod;
    /* int8: packed codes (mc_k_pack_q8a8) and row scales per parameter
     * index (NULL: fp32), see mc_infer_use_int8 */
    uint8_t **q8w;
    float **q8s;
    /* host scratch of the scoring */
    int32_t *htgt;
    int *hrow;
    float *hloss, *hmax, *htl;
};

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

/* Parameter i's values (NULL when the parameter is absent). */

/* out[n, O] = in[n, I] W^T (+ b) for the weight of parameter w: int8 codes
 * when mc_infer_use_int8 made them (the activations quantized per row,
 * mc_k_linear_q8a8_fwd: mc-serve's kernel, so both give the same bits for
 * a row), the fp32 weights otherwise. */
static void linear(mc_infer *f, float *out, const float *in, int w, const float *b, size_t n,
                   size_t I, size_t O)
{
    mc_model *m = f->m;
    if (f->q8w && f->q8w[w])
        mc_k_linear_q8a8_fwd(f->be, out, in, f->q8w[w], f->q8s[w], b, n, I, O);
    else
        mc_k_linear_fwd(f->be, m->prec, out, in, param_val(m, w), param_prep(m, w), b, n, I, O,
                        0.0f, 0);
}

/* The MoE block's linears (moe_infer.c): expert e's rows of parameter w,
 * as int8 codes when mc_infer_use_int8 made them, else the training
 * forward's kernels (the router in fp32, the experts in the model's
 * precision, as mc_moe_fwd's grouped GEMM runs them). */
static void moe_linear(void *ctx, float *out, const float *in, int w, size_t e, const float *b,
                       size_t n, size_t I, size_t O, int fp32)
{
    mc_infer *f = ctx;
    mc_model *m = f->m;
    size_t off = e * O * I;
    if (f->q8w && f->q8w[w])
        mc_k_linear_q8a8_fwd(f->be, out, in, f->q8w[w] + e * mc_k_q8a8_packed_bytes(O, I),
                             f->q8s[w] + e * O, b, n, I, O);
    else
        mc_k_linear_fwd(f->be, fp32 ? MC_PREC_FP32 : m->prec, out, in, param_val(m, w) + off, NULL,
                        b, n, I, O, 0.0f, 0);
}

static void layout(mc_infer *f, carver *cv)
{
    mc_model *m = f->m;
    size_t R = (size_t)f->max_rows, L = (size_t)f->max_len, C = f->C;
    for (int l = 0; l < m->nlocal; l++) {
        f->kc[l] = carve(cv, L * f->Gl * f->D);
        f->vc[l] = carve(cv, L * f->Gl * f->D);
    }
    f->x = carve(cv, R * C);
    f->h = carve(cv, R * C);
    f->qkv = carve(cv, R * f->qkv_out);
    f->q = carve(cv, R * f->Ql * f->D);
    f->att = carve(cv, R * f->Ql * f->D);
    f->tmp = carve(cv, R * C);
    f->fc1 = carve(cv, R * f->fc1_out);
    f->act = carve(cv, R * f->Fl);
    f->mean = carve(cv, R);
    f->rstd = carve(cv, R);
    f->lnf = carve(cv, R * C);
    f->last = carve(cv, C);
    f->hrows = carve(cv, f->hr * C);
    f->logits = carve(cv, f->hr * (size_t)f->vl);
    f->rowmax = carve(cv, f->hr);
    f->sumexp = carve(cv, f->hr);
    f->tlogit = carve(cv, f->hr);
    f->loss = carve(cv, f->hr);
    f->gathered = carve(cv, (size_t)m->grid.tp * (size_t)f->vl);
    f->dtok = (int32_t *)carve(cv, R);
    f->dtgt = (int32_t *)carve(cv, f->hr);
    f->dpos = (int32_t *)carve(cv, R);
    f->dseg = (int32_t *)carve(cv, R);
    size_t qk = m->cfg.qk_layernorm ? R : 0, H = f->Ql > f->Gl ? f->Ql : f->Gl;
    f->qp = carve(cv, qk * f->Ql * f->D);
    f->kp = carve(cv, qk * f->Gl * f->D);
    f->qn_mean = carve(cv, qk * H);
    f->qn_rstd = carve(cv, qk * H);
    mc_moe_infer_layout(m, cv, &f->moe, R);
}

mc_status mc_infer_new(mc_model *m, int max_len, int max_rows, mc_infer **out, mc_error *err)
{
    *out = NULL;
    const mc_model_config *c = &m->cfg;
    if (m->grid.pp > 1 || m->nchunks != 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "evaluation runs on one pipeline stage: pipeline parallelism (%d "
                            "stages) is not supported; use --tensor-model-parallel-size",
                            m->grid.pp);
    if (max_len < 1 || max_rows < 1)
        return mc_error_set(err, MC_ERR_USAGE, "inference context of %d positions, %d rows",
                            max_len, max_rows);
    if (c->position_embedding_type == MC_POS_LEARNED && max_len > c->max_position_embeddings)
        return mc_error_set(err, MC_ERR_USAGE,
                            "a context of %d positions exceeds the model's %d learned positions",
                            max_len, c->max_position_embeddings);
    if (max_rows > max_len) max_rows = max_len;
    mc_infer *f = calloc(1, sizeof *f);
    if (!f) return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    f->m = m;
    f->be = m->be;
    f->max_len = max_len;
    f->max_rows = max_rows;
    f->C = m->C;
    f->D = m->D;
    f->Ql = m->Ql;
    f->Gl = m->Gl;
    f->Fl = m->Fl;
    f->fc1_out = m->fc1_out;
    f->qkv_out = m->qkv_out;
    f->v0 = m->v0;
    f->vl = m->vl;
    f->hr = (size_t)(max_rows < HEAD_ROWS ? max_rows : HEAD_ROWS);
    size_t nl = (size_t)m->nlocal + 1;
    f->kc = calloc(nl, sizeof *f->kc);
    f->vc = calloc(nl, sizeof *f->vc);
    f->htgt = malloc(f->hr * sizeof *f->htgt);
    f->hrow = malloc(f->hr * sizeof *f->hrow);
    f->hloss = malloc(f->hr * sizeof *f->hloss);
    f->hmax = malloc(f->hr * sizeof *f->hmax);
    f->htl = malloc(f->hr * sizeof *f->htl);
    f->hdoc = malloc((size_t)max_len * sizeof *f->hdoc);
    f->heod = malloc((size_t)max_len);
    f->hpos = malloc((size_t)max_rows * sizeof *f->hpos);
    f->hseg = malloc((size_t)max_rows * sizeof *f->hseg);
    if (!f->kc || !f->vc || !f->htgt || !f->hrow || !f->hloss || !f->hmax || !f->htl || !f->hdoc ||
        !f->heod || !f->hpos || !f->hseg) {
        mc_infer_free(f);
        return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    }
    carver cv = {NULL, 0};
    layout(f, &cv);
    f->block = mc_balloc(f->be, cv.off, err);
    if (!f->block) {
        mc_status st = err ? err->code : MC_ERR_NOMEM;
        mc_error_prefix(err, "inference context of %d positions (%.1f MiB)", max_len,
                        (double)cv.off / 1048576.0);
        mc_infer_free(f);
        return st;
    }
    cv.base = f->block;
    cv.off = 0;
    layout(f, &cv);
    /* weights do not change under inference: prepare them once for every
     * GEMM (model.c remakes them per forward pass) */
    model_prepare_weights(m);
    *out = f;
    return MC_OK;
}

void mc_infer_free(mc_infer *f)
{
    if (!f) return;
    if (f->block) mc_bfree(f->be, f->block);
    for (size_t i = 0; f->q8w && i < f->m->nparams; i++) {
        if (f->q8w[i]) mc_bfree(f->be, f->q8w[i]);
        if (f->q8s[i]) mc_bfree(f->be, f->q8s[i]);
    }
    free(f->q8w);
    free(f->q8s);
    free(f->kc);
    free(f->vc);
    free(f->htgt);
    free(f->hrow);
    free(f->hloss);
    free(f->hmax);
    free(f->htl);
    free(f->hdoc);
    free(f->heod);
    free(f->hpos);
    free(f->hseg);
    free(f);
}

int mc_infer_capacity(const mc_infer *f) { return f->max_len; }
int mc_infer_length(const mc_infer *f) { return f->len; }
int64_t mc_infer_padded_vocab(const mc_infer *f) { return f->m->cfg.padded_vocab_size; }

void mc_infer_truncate(mc_infer *f, int len)
{
    if (len < 0) len = 0;
    if (len < f->len) {
        f->len = len;
        f->have_last = 0;
    }
}

static void norm(mc_infer *f, float *out, const float *x, int w, int b, size_t n)
{
    mc_model *m = f->m;
    if (m->cfg.normalization == MC_NORM_LAYERNORM)
        mc_k_layernorm_fwd(f->be, out, f->mean, f->rstd, x, param_val(m, w), param_val(m, b), n,
                           f->C, m->cfg.norm_epsilon, MC_PREC_FP32);
    else
        mc_k_rmsnorm_fwd(f->be, out, f->rstd, x, param_val(m, w), n, f->C, m->cfg.norm_epsilon,
                         MC_PREC_FP32);
}

/* x += (in W^T, summed over the tensor-parallel group) + b, for a
 * row-parallel linear of input width I. */
static mc_status row_parallel(mc_infer *f, const float *in, int w, int b, size_t I, size_t n,
                              mc_error *err)
{
    mc_model *m = f->m;
    const float *bias = m->grid.tp_rank == 0 ? param_val(m, b) : NULL;
    linear(f, f->tmp, in, w, bias, n, I, f->C);
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, f->be, f->tmp, n * f->C, err));
    mc_k_acc(f->be, f->x, f->tmp, n * f->C);
    return MC_OK;
}

/* Packed documents: the positions and segment starts of the chunk's n
 * tokens at cache positions len .., into f->dpos and f->dseg; *pos and
 * *seg get them, or NULL where the model's reset is off. A document starts
 * at 0 and after each eod, as mc_doc_layout's; the cache remembers where,
 * so a chunk continues the documents of the one before. */
static void doc_layout(mc_infer *f, const int32_t *tokens, size_t n, const int32_t **pos,
                       const int32_t **seg)
{
    const mc_model *m = f->m;
    *pos = *seg = NULL;
    if (!m->docs_on) return;
    size_t len = (size_t)f->len;
    for (size_t i = 0; i < n; i++) {
        size_t p = len + i;
        int32_t doc = p == 0 ? 0 : f->heod[p - 1] ? (int32_t)p : f->hdoc[p - 1];
        f->hdoc[p] = doc;
        f->heod[p] = tokens[i] == m->docs.eod;
        f->hpos[i] = m->docs.reset_position_ids ? (int32_t)p - doc : (int32_t)p;
        f->hseg[i] = m->docs.reset_attention_mask ? doc : 0;
    }
    if (m->docs.reset_position_ids) {
        mc_bcopy_from_host(f->be, f->dpos, f->hpos, n * sizeof(int32_t));
        *pos = f->dpos;
    }
    if (m->docs.reset_attention_mask) {
        mc_bcopy_from_host(f->be, f->dseg, f->hseg, n * sizeof(int32_t));
        *seg = f->dseg;
    }
}

/* One chunk of n <= max_rows tokens at positions f->len .. f->len + n - 1;
 * f->lnf gets the final norm's output. */
static mc_status forward_chunk(mc_infer *f, const int32_t *tokens, size_t n, mc_error *err)
{
    mc_model *m = f->m;
    const mc_model_config *c = &m->cfg;
    mc_backend *be = f->be;
    size_t C = f->C, D = f->D, pos0 = (size_t)f->len;
    float scale = 1.0f / sqrtf((float)D);

    const int32_t *pos, *seg;
    doc_layout(f, tokens, n, &pos, &seg);
    mc_bcopy_from_host(be, f->dtok, tokens, n * sizeof(int32_t));
    mc_k_embed_fwd(be, f->x, f->dtok, n, param_val(m, m->wte), f->v0, f->vl, C);
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, f->x, n * C, err));
    if (m->wpe >= 0) mc_k_posemb_fwd(be, f->x, param_val(m, m->wpe), 1, n, C, pos0, pos);

    for (int l = m->cl0[0]; l < m->cl1[0]; l++) {
        const mc_layer_params *lp = &m->lp[l];
        float *kc = f->kc[m->lidx[l]], *vc = f->vc[m->lidx[l]];
        float *kn = kc + pos0 * f->Gl * D, *vn = vc + pos0 * f->Gl * D;
        norm(f, f->h, f->x, lp->ln1_w, lp->ln1_b, n);
        linear(f, f->qkv, f->h, lp->qkv_w, param_val(m, lp->qkv_b), n, C, f->qkv_out);
        if (c->qk_layernorm) { /* keys cached after their norm and RoPE */
            mc_k_qkv_split(be, f->qp, f->kp, vn, f->qkv, n, f->Ql, f->Gl, D);
            mc_model_qk_norm(m, f->q, f->qn_mean, f->qn_rstd, f->qp, n * f->Ql, lp->qn_w, lp->qn_b);
            mc_model_qk_norm(m, kn, f->qn_mean, f->qn_rstd, f->kp, n * f->Gl, lp->kn_w, lp->kn_b);
        } else {
            mc_k_qkv_split(be, f->q, kn, vn, f->qkv, n, f->Ql, f->Gl, D);
        }
        if (c->position_embedding_type == MC_POS_ROPE) {
            mc_rope rp = mc_rope_of(c);
            mc_k_rope_fwd(be, f->q, 1, n, f->Ql, D, &rp, pos0, pos);
            mc_k_rope_fwd(be, kn, 1, n, f->Gl, D, &rp, pos0, pos);
        }
        mc_k_attention_kv_fwd(be, f->att, f->q, kc, vc, n, pos0, f->Ql, f->Gl, D, scale, seg);
        TRY(row_parallel(f, f->att, lp->proj_w, lp->proj_b, f->Ql * D, n, err));

        norm(f, f->h, f->x, lp->ln2_w, lp->ln2_b, n);
        if (lp->moe) { /* replicated over tensor parallelism: no sums */
            TRY(mc_moe_infer_fwd(m, l, &f->moe, f->h, f->x, n, 1, moe_linear, f, err));
            continue;
        }
        linear(f, f->fc1, f->h, lp->fc1_w, param_val(m, lp->fc1_b), n, C, f->fc1_out);
        if (c->swiglu)
            mc_k_swiglu_fwd(be, f->act, f->fc1, n, f->Fl, MC_PREC_FP32);
        else
            mc_k_gelu_fwd(be, f->act, f->fc1, n * f->Fl, MC_PREC_FP32);
        TRY(row_parallel(f, f->act, lp->fc2_w, lp->fc2_b, f->Fl, n, err));
    }
    norm(f, f->lnf, f->x, m->lnf_w, m->lnf_b, n);
    mc_bcopy(be, f->last, f->lnf + (n - 1) * C, C * sizeof(float));
    f->have_last = 1;
    f->len += (int)n;
    return MC_OK;
}

static int head_weight(mc_infer *f)
{
    mc_model *m = f->m;
    return m->out_w >= 0 ? m->out_w : m->wte;
}

/* Score the k rows f->hrow[0..k) of f->lnf against f->htgt[0..k). */
static mc_status score_rows(mc_infer *f, size_t k, float *logprob, int *greedy, mc_error *err)
{
    mc_model *m = f->m;
    mc_backend *be = f->be;
    size_t C = f->C, vl = (size_t)f->vl;
    for (size_t i = 0; i < k; i++)
        mc_bcopy(be, f->hrows + i * C, f->lnf + (size_t)f->hrow[i] * C, C * sizeof(float));
    mc_bcopy_from_host(be, f->dtgt, f->htgt, k * sizeof(int32_t));
    linear(f, f->logits, f->hrows, head_weight(f), NULL, k, C, vl);
    mc_k_xent_max(be, f->rowmax, f->logits, k, vl);
    TRY(mc_allreduce_max(&m->grid, MC_GROUP_TP, be, f->rowmax, k, err));
    mc_k_xent_sumexp(be, f->sumexp, f->tlogit, f->logits, f->rowmax, f->dtgt, f->v0, k, vl);
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, f->sumexp, k, err));
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, f->tlogit, k, err));
    mc_k_xent_loss(be, f->loss, f->rowmax, f->sumexp, f->tlogit, f->dtgt, k);
    mc_bcopy_to_host(be, f->hloss, f->loss, k * sizeof(float));
    mc_bcopy_to_host(be, f->hmax, f->rowmax, k * sizeof(float));
    mc_bcopy_to_host(be, f->htl, f->tlogit, k * sizeof(float));
    for (size_t i = 0; i < k; i++) {
        if (logprob) logprob[f->hrow[i]] = -f->hloss[i];
        if (greedy) greedy[f->hrow[i]] = f->htl[i] >= f->hmax[i];
    }
    return MC_OK;
}

mc_status mc_infer_extend(mc_infer *f, const int32_t *tokens, int n, const int32_t *targets,
                          float *logprob, int *greedy, mc_error *err)
{
    int64_t V = f->m->cfg.padded_vocab_size;
    if (n < 0 || f->len + n > f->max_len)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "%d more positions do not fit the context of %d (%d in use)", n,
                            f->max_len, f->len);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "token id %d at position %d is outside the vocabulary [0, %lld)",
                                tokens[i], f->len + i, (long long)V);
        if (targets && targets[i] >= V)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "target id %d at position %d is outside the vocabulary [0, %lld)",
                                targets[i], f->len + i, (long long)V);
    }
    for (int i0 = 0; i0 < n; i0 += f->max_rows) {
        size_t c = (size_t)(n - i0 < f->max_rows ? n - i0 : f->max_rows);
        TRY(forward_chunk(f, tokens + i0, c, err));
        if (!targets) continue;
        /* the chunk's scored rows, HEAD_ROWS at a time */
        size_t k = 0;
        for (size_t i = 0; i < c; i++) {
            if (logprob) logprob[i0 + i] = 0.0f;
            if (greedy) greedy[i0 + i] = 0;
            if (targets[i0 + i] < 0) continue;
            f->hrow[k] = (int)i;
            f->htgt[k++] = targets[i0 + i];
            if (k == f->hr) {
                TRY(score_rows(f, k, logprob ? logprob + i0 : NULL, greedy ? greedy + i0 : NULL,
                               err));
                k = 0;
            }
        }
        if (k)
            TRY(score_rows(f, k, logprob ? logprob + i0 : NULL, greedy ? greedy + i0 : NULL, err));
    }
    return MC_OK;
}

mc_status mc_infer_logits(mc_infer *f, float *host, mc_error *err)
{
    mc_model *m = f->m;
    if (!f->have_last)
        return mc_error_set(err, MC_ERR_INTERNAL, "inference: no position has been run");
    size_t vl = (size_t)f->vl;
    linear(f, f->logits, f->last, head_weight(f), NULL, 1, f->C, vl);
    TRY(mc_allgather(&m->grid, MC_GROUP_TP, f->be, f->logits, f->gathered, vl, err));
    mc_bcopy_to_host(f->be, host, f->gathered, (size_t)m->grid.tp * vl * sizeof(float));
    return MC_OK;
}

mc_status mc_infer_use_int8(mc_infer *f, mc_error *err)
{
    mc_model *m = f->m;
    if (f->q8w) return MC_OK;
    f->q8w = calloc(m->nparams, sizeof *f->q8w);
    f->q8s = calloc(m->nparams, sizeof *f->q8s);
    if (!f->q8w || !f->q8s) return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    int n = 0, want[6 * 1024 + 1];
    for (int l = m->cl0[0]; l < m->cl1[0] && n < 6 * 1024; l++) {
        const mc_layer_params *lp = &m->lp[l];
        want[n++] = lp->qkv_w;
        want[n++] = lp->proj_w;
        if (lp->moe) {
            n += mc_moe_infer_weights(m, l, want + n);
            continue;
        }
        want[n++] = lp->fc1_w;
        want[n++] = lp->fc2_w;
    }
    want[n++] = head_weight(f);
    for (int i = 0; i < n; i++) {
        const mc_param *p = &m->params[want[i]];
        size_t rows = (size_t)p->local_rows, cols = (size_t)p->local_cols;
        if (want[i] == m->wte) rows = (size_t)f->vl; /* the head's rows: this rank's vocab */
        size_t g = mc_infer_q8a8_groups(m, want[i]);
        if (mc_infer_q8a8_weight(f->be, param_val(m, want[i]), g, rows / g, cols, &f->q8w[want[i]],
                                 &f->q8s[want[i]], err))
            return mc_error_prefix(err, "inference: int8 copy of %s", p->name);
    }
    return MC_OK;
}

size_t mc_infer_q8a8_groups(const mc_model *m, int w)
{
    for (int l = m->cl0[0]; l < m->cl1[0]; l++)
        if (m->lp[l].moe && (w == m->lp[l].efc1_w || w == m->lp[l].efc2_w))
            /* this rank's experts: E / EP under expert parallelism */
            return (size_t)m->cfg.num_experts / (size_t)(m->grid.ep > 1 ? m->grid.ep : 1);
    return 1;
}

mc_status mc_infer_q8a8_weight(mc_backend *be, const float *src, size_t groups, size_t rows,
                               size_t cols, uint8_t **packed, float **scale, mc_error *err)
{
    size_t pb = mc_k_q8a8_packed_bytes(rows, cols);
    *packed = mc_balloc(be, groups * pb, err);
    *scale = *packed ? mc_balloc(be, groups * rows * sizeof(float), err) : NULL;
    int8_t *codes = *scale ? mc_balloc(be, groups * rows * cols, err) : NULL;
    if (!codes) return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    mc_k_quantize_q8_rows(be, codes, *scale, src, groups * rows, cols);
    for (size_t g = 0; g < groups; g++)
        mc_k_pack_q8a8(be, *packed + g * pb, codes + g * rows * cols, rows, cols);
    mc_bfree(be, codes);
    return MC_OK;
}
