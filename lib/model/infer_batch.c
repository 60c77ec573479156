/*
 * infer_batch.c - batched inference over a pool of key/value blocks
 * (model.h, "batched inference"): what mc-serve's scheduler runs. Several
 * sequences advance in one forward pass, each by its own number of rows (a
 * newcomer's prompt chunk beside the others' one decoded token), their rows
 * stacked through the linear layers, norms and activations, and each
 * sequence's attention run alone against its own blocks.
 *
 * Batch invariance: a row's values never depend on the other rows. The
 * linear layers use mc_k_linear_rows_fwd (one fixed-order sum per element
 * whatever the number of rows; int8 weights mc_k_linear_q8a8_fwd, whose
 * activation scales are each row's own; BLAS's sgemm and mc's sgemv path
 * for one row do not promise it), norms, activations and RoPE are per row or per
 * element, and attention sees only the sequence's own keys, read in place
 * in its blocks (mc_k_attention_paged_fwd: the bits of the contiguous
 * kernel on the keys in position order, whatever the blocks; its rows do
 * not depend on how the sequence was cut into calls, nor on the other
 * sequences of the call). So a sequence gets the same bits alone or in any
 * batch. See
 * doc/ARCHITECTURE.md, "Inference".
 *
 * Under tensor parallelism every rank of the group makes the same call
 * (mc-serve's leader broadcasts each step) on its share of the heads and
 * columns, and gets one process's bits: the column-parallel linears (qkv,
 * fc1, the head) compute whole rows of the weight, so each output is the
 * sum one process computes, and the head's logits are gathered whole; the
 * embedding's sum over the group adds zeros to one rank's exact rows. The
 * row-parallel linears (proj, fc2) are not summed over the group: their
 * weights are re-split by output rows when the pool is made (each rank
 * holds C / tp whole rows instead of every row's I / tp columns, the same
 * memory), the inputs are all-gathered to their whole width, each rank
 * computes its outputs over the whole width, and the outputs are
 * all-gathered: every sum is one process's sum, in its order. (A sum of
 * the ranks' partial sums would round otherwise, and int8 row scales over
 * a rank's columns would not be one process's scales.)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

struct mc_kvpool {
    mc_model *m;
    mc_backend *be;
    int block_size, nblocks, max_rows, max_len, head_rows;
    size_t C, D, Ql, Gl, Fl, fc1_out, qkv_out, kv_row, block_floats;
    int64_t vl;
    float *kpool, *vpool; /* [nblocks][nlocal][block_size][Gl D] */
    int32_t *freelist;    /* free block ids, a stack */
    int nfree;
    void *block; /* the scratch below, one allocation */
    float *x, *h, *qkv, *q, *kn, *vn, *att, *tmp, *fc1, *act, *mean, *rstd;
    float *hrows, *logits, *gathered;
    float *qp, *kp, *qn_mean, *qn_rstd; /* --qk-layernorm: before the norm (empty without) */
    int32_t *dtok, *dpos; /* [max_rows] the rows' tokens and positions */
    /* host: the attention's sequences (rows, first position, block table of
     * tstride blocks) and the rows' positions */
    int32_t *hrows_n, *hpos0, *htab, *hrowpos;
    size_t tstride;
    float *hlogits;          /* host [head_rows, tp vl] */
    float *hgathered;        /* host [tp][head_rows vl] (tensor parallel) */
    int *hseq, *hpos, *hrow; /* host [max_rows]: the head's rows */
    uint8_t **q8w;           /* int8 packed codes and row scales per parameter (NULL: fp32) */
    float **q8s;
    uint16_t **b16w; /* weight-only bf16 values per parameter (NULL: fp32) */
    /* tensor parallel: the row-parallel weights re-split by output rows,
     * this rank's outputs [o0, o0 + no) of C over the whole input width
     * (per parameter, NULL for the others); the outputs are cut in tp
     * slices of so rows, the last one shorter */
    float **rpw;
    size_t so, o0, no, in_local; /* in_local: the widest local input, max(Ql D, Fl) */
    float *xin, *gin, *oslice, *gout;
    mc_moe_infer_scratch moe; /* MoE layers' scratch for max_rows rows */
};

static int head_weight(const mc_model *m) { return m->out_w >= 0 ? m->out_w : m->wte; }

static void layout(mc_kvpool *p, carver *cv)
{
    size_t R = (size_t)p->max_rows, C = p->C;
    p->x = carve(cv, R * C);
    p->h = carve(cv, R * C);
    p->qkv = carve(cv, R * p->qkv_out);
    p->q = carve(cv, R * p->Ql * p->D);
    p->kn = carve(cv, R * p->kv_row);
    p->vn = carve(cv, R * p->kv_row);
    p->att = carve(cv, R * p->Ql * p->D);
    p->tmp = carve(cv, R * C);
    p->fc1 = carve(cv, R * p->fc1_out);
    p->act = carve(cv, R * p->Fl);
    p->mean = carve(cv, R);
    p->rstd = carve(cv, R);
    p->hrows = carve(cv, (size_t)p->head_rows * C);
    p->logits = carve(cv, (size_t)p->head_rows * (size_t)p->vl);
    p->gathered = carve(cv, (size_t)p->m->grid.tp * (size_t)p->head_rows * (size_t)p->vl);
    p->dtok = (int32_t *)carve(cv, R);
    p->dpos = (int32_t *)carve(cv, R);
    if (p->m->grid.tp > 1) {
        size_t tp = (size_t)p->m->grid.tp;
        p->xin = carve(cv, R * tp * p->in_local);
        p->gin = carve(cv, R * tp * p->in_local);
        p->oslice = carve(cv, R * p->so);
        p->gout = carve(cv, R * tp * p->so);
    }
    size_t qk = p->m->cfg.qk_layernorm ? R : 0, H = p->Ql > p->Gl ? p->Ql : p->Gl;
    p->qp = carve(cv, qk * p->Ql * p->D);
    p->kp = carve(cv, qk * p->kv_row);
    p->qn_mean = carve(cv, qk * H);
    p->qn_rstd = carve(cv, qk * H);
    mc_moe_infer_layout(p->m, cv, &p->moe, R);
}

size_t mc_kvpool_block_bytes(const mc_model *m, int block_size)
{
    return 2 * (size_t)m->nlocal * (size_t)block_size * m->Gl * m->D * sizeof(float);
}

/* The linears' weights (and the head's, this rank's rows of the vocabulary)
 * as int8 codes with row scales, or as bf16 values. */
static mc_status use_weights(mc_kvpool *p, int kind, mc_error *err)
{
    mc_model *m = p->m;
    int bf16 = kind == MC_KV_WEIGHTS_BF16;
    if (bf16)
        p->b16w = calloc(m->nparams, sizeof *p->b16w);
    else
        p->q8w = calloc(m->nparams, sizeof *p->q8w), p->q8s = calloc(m->nparams, sizeof *p->q8s);
    if (bf16 ? !p->b16w : !p->q8w || !p->q8s)
        return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    for (int l = m->cl0[0]; l <= m->cl1[0]; l++) {
        int want[6], n = 0;
        if (l < m->cl1[0]) {
            const mc_layer_params *lp = &m->lp[l];
            want[n++] = lp->qkv_w;
            want[n++] = lp->proj_w;
            if (lp->moe) {
                n += mc_moe_infer_weights(m, l, want + n); /* the experts' (moe_infer.c) */
            } else {
                want[n++] = lp->fc1_w;
                want[n++] = lp->fc2_w;
            }
        } else {
            want[n++] = head_weight(m);
        }
        for (int i = 0; i < n; i++) {
            const mc_param *pa = &m->params[want[i]];
            size_t rows = (size_t)pa->local_rows, cols = (size_t)pa->local_cols;
            const float *src = param_val(m, want[i]);
            if (want[i] == m->wte) rows = (size_t)p->vl;
            if (p->rpw && p->rpw[want[i]]) /* re-split by output rows */
                src = p->rpw[want[i]], rows = p->no, cols = (size_t)pa->cols;
            if (bf16) {
                p->b16w[want[i]] = mc_balloc(p->be, rows * cols * sizeof(uint16_t), err);
                if (!p->b16w[want[i]])
                    return mc_error_prefix(err, "inference: bf16 copy of %s", pa->name);
                mc_k_cast_to_bf16(p->be, p->b16w[want[i]], src, rows * cols);
            } else {
                size_t g = mc_infer_q8a8_groups(m, want[i]);
                if (mc_infer_q8a8_weight(p->be, src, g, rows / g, cols, &p->q8w[want[i]],
                                         &p->q8s[want[i]], err))
                    return mc_error_prefix(err, "inference: int8 copy of %s", pa->name);
            }
            if (p->rpw && p->rpw[want[i]]) { /* the int8 or bf16 copy is what runs */
                mc_bfree(p->be, p->rpw[want[i]]);
                p->rpw[want[i]] = NULL;
            }
        }
    }
    return MC_OK;
}

/* Tensor parallel: each row-parallel weight (this rank's columns of every
 * row, [C, I / tp]) gathered over the group and re-split by output rows:
 * this rank's rows [o0, o0 + no) over the whole width I, in one process's
 * column order (rank r holds columns [r I / tp, (r + 1) I / tp)). */
static mc_status split_by_rows(mc_kvpool *p, mc_error *err)
{
    mc_model *m = p->m;
    const mc_grid *g = &m->grid;
    size_t tp = (size_t)g->tp, C = p->C, big = 0;
    p->rpw = calloc(m->nparams, sizeof *p->rpw);
    if (!p->rpw) return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    for (int l = m->cl0[0]; l < m->cl1[0]; l++) {
        const int ws[2] = {m->lp[l].proj_w, m->lp[l].fc2_w};
        for (int i = 0; i < 2; i++)
            if (ws[i] >= 0 && (size_t)m->params[ws[i]].cols * C > big)
                big = (size_t)m->params[ws[i]].cols * C;
    }
    float *all = big ? mc_balloc(p->be, big * sizeof(float), err) : NULL;
    if (big && !all)
        return mc_error_prefix(err, "inference: re-splitting the row-parallel weights");
    mc_status st = MC_OK;
    for (int l = m->cl0[0]; !st && l < m->cl1[0]; l++) {
        const int ws[2] = {m->lp[l].proj_w, m->lp[l].fc2_w};
        for (int i = 0; !st && i < 2; i++) {
            int w = ws[i];
            if (w < 0) continue;
            const mc_param *pa = &m->params[w];
            size_t Il = (size_t)pa->local_cols, I = (size_t)pa->cols;
            st = mc_allgather(g, MC_GROUP_TP, p->be, param_val(m, w), all, C * Il, err);
            if (st) break;
            p->rpw[w] = mc_balloc(p->be, (p->no ? p->no : 1) * I * sizeof(float), err);
            if (!p->rpw[w]) {
                st = mc_error_prefix(err, "inference: the rows of %s", pa->name);
                break;
            }
            for (size_t o = 0; o < p->no; o++)
                for (size_t r = 0; r < tp; r++)
                    mc_bcopy(p->be, p->rpw[w] + o * I + r * Il, all + (r * C + p->o0 + o) * Il,
                             Il * sizeof(float));
        }
    }
    if (all) mc_bfree(p->be, all);
    return st;
}

mc_status mc_kvpool_new(mc_model *m, const mc_kvpool_config *c, mc_kvpool **out, mc_error *err)
{
    *out = NULL;
    const mc_model_config *mc = &m->cfg;
    if (mc->num_experts > 0 && mc->moe_expert_capacity_factor > 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "batched inference of a mixture of experts with a capacity factor "
                            "(%g) is not supported: the tokens it drops depend on the other "
                            "rows of the batch",
                            (double)mc->moe_expert_capacity_factor);
    if (m->grid.pp > 1 || m->nchunks != 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "batched inference runs on one process or a tensor-parallel group: "
                            "pipeline parallelism is not supported");
    if (c->block_size < 1 || c->max_rows < 1 || c->max_len < 2)
        return mc_error_set(err, MC_ERR_USAGE,
                            "a pool of blocks of %d positions, %d rows, %d "
                            "positions a sequence",
                            c->block_size, c->max_rows, c->max_len);
    if (mc->position_embedding_type == MC_POS_LEARNED && c->max_len > mc->max_position_embeddings)
        return mc_error_set(err, MC_ERR_USAGE,
                            "a context of %d positions exceeds the model's %d learned positions",
                            c->max_len, mc->max_position_embeddings);
    size_t bb = mc_kvpool_block_bytes(m, c->block_size);
    size_t nb = c->bytes / bb;
    if (nb < 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%.2f MiB of key/value cache hold no block of %d positions (%.2f MiB "
                            "each)",
                            (double)c->bytes / 1048576.0, c->block_size, (double)bb / 1048576.0);
    if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
    mc_kvpool *p = calloc(1, sizeof *p);
    if (!p) return mc_error_set(err, MC_ERR_NOMEM, "inference: out of memory");
    p->m = m;
    p->be = m->be;
    p->block_size = c->block_size;
    p->nblocks = (int)nb;
    p->max_rows = c->max_rows;
    p->max_len = c->max_len;
    p->head_rows = c->max_rows < 64 ? c->max_rows : 64;
    p->C = m->C;
    p->D = m->D;
    p->Ql = m->Ql;
    p->Gl = m->Gl;
    p->Fl = m->Fl;
    p->fc1_out = m->fc1_out;
    p->qkv_out = m->qkv_out;
    p->kv_row = m->Gl * m->D;
    p->block_floats = (size_t)m->nlocal * (size_t)c->block_size * p->kv_row;
    p->vl = m->vl;
    if (m->grid.tp > 1) {
        size_t tp = (size_t)m->grid.tp, r = (size_t)m->grid.tp_rank;
        p->so = (p->C + tp - 1) / tp;
        p->o0 = r * p->so < p->C ? r * p->so : p->C;
        p->no = p->o0 + p->so < p->C ? p->so : p->C - p->o0;
        p->in_local = p->Ql * p->D > p->Fl ? p->Ql * p->D : p->Fl;
    }
    mc_status st = MC_OK;
    p->freelist = malloc(nb * sizeof *p->freelist);
    size_t hl = (size_t)p->head_rows * (size_t)p->vl * (size_t)m->grid.tp * sizeof(float);
    p->hlogits = malloc(hl);
    p->hgathered = malloc(hl);
    p->hseq = malloc((size_t)c->max_rows * sizeof(int));
    p->hpos = malloc((size_t)c->max_rows * sizeof(int));
    p->hrow = malloc((size_t)c->max_rows * sizeof(int));
    p->tstride = ((size_t)c->max_len + (size_t)c->block_size - 1) / (size_t)c->block_size;
    p->hrows_n = malloc((size_t)c->max_rows * sizeof(int32_t));
    p->hpos0 = malloc((size_t)c->max_rows * sizeof(int32_t));
    p->htab = malloc((size_t)c->max_rows * p->tstride * sizeof(int32_t));
    p->hrowpos = malloc((size_t)c->max_rows * sizeof(int32_t));
    if (!p->freelist || !p->hlogits || !p->hgathered || !p->hseq || !p->hpos || !p->hrow ||
        !p->hrows_n || !p->hpos0 || !p->htab || !p->hrowpos)
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (!st) {
        p->kpool = mc_balloc(p->be, nb * p->block_floats * sizeof(float), err);
        p->vpool = p->kpool ? mc_balloc(p->be, nb * p->block_floats * sizeof(float), err) : NULL;
        if (!p->vpool) st = mc_error_prefix(err, "key/value cache of %zu blocks", nb);
    }
    carver cv = {NULL, 0};
    layout(p, &cv);
    if (!st) {
        p->block = mc_balloc(p->be, cv.off, err);
        if (!p->block) st = mc_error_prefix(err, "inference scratch");
    }
    if (!st) {
        cv.base = p->block;
        cv.off = 0;
        layout(p, &cv);
        for (int i = 0; i < (int)nb; i++) p->freelist[i] = (int32_t)nb - 1 - i;
        p->nfree = (int)nb;
        if (m->grid.tp > 1) st = split_by_rows(p, err);
        if (!st && (c->weights == MC_KV_WEIGHTS_INT8 || c->weights == MC_KV_WEIGHTS_BF16))
            st = use_weights(p, c->weights, err);
    }
    if (st) {
        mc_kvpool_free(p);
        return st;
    }
    *out = p;
    return MC_OK;
}

void mc_kvpool_free(mc_kvpool *p)
{
    if (!p) return;
    if (p->kpool) mc_bfree(p->be, p->kpool);
    if (p->vpool) mc_bfree(p->be, p->vpool);
    if (p->block) mc_bfree(p->be, p->block);
    for (size_t i = 0; p->q8w && i < p->m->nparams; i++) {
        if (p->q8w[i]) mc_bfree(p->be, p->q8w[i]);
        if (p->q8s && p->q8s[i]) mc_bfree(p->be, p->q8s[i]);
    }
    for (size_t i = 0; p->b16w && i < p->m->nparams; i++)
        if (p->b16w[i]) mc_bfree(p->be, p->b16w[i]);
    for (size_t i = 0; p->rpw && i < p->m->nparams; i++)
        if (p->rpw[i]) mc_bfree(p->be, p->rpw[i]);
    free(p->rpw);
    free(p->q8w);
    free(p->q8s);
    free(p->b16w);
    free(p->freelist);
    free(p->hlogits);
    free(p->hgathered);
    free(p->hseq);
    free(p->hpos);
    free(p->hrow);
    free(p->hrows_n);
    free(p->hpos0);
    free(p->htab);
    free(p->hrowpos);
    free(p);
}

int mc_kvpool_blocks(const mc_kvpool *p) { return p->nblocks; }
int mc_kvpool_blocks_free(const mc_kvpool *p) { return p->nfree; }
int mc_kvpool_block_size(const mc_kvpool *p) { return p->block_size; }
int mc_kvpool_max_rows(const mc_kvpool *p) { return p->max_rows; }
int mc_kvpool_max_len(const mc_kvpool *p) { return p->max_len; }
int64_t mc_kvpool_padded_vocab(const mc_kvpool *p) { return p->m->cfg.padded_vocab_size; }

mc_status mc_kvpool_take(mc_kvpool *p, int n, int32_t *ids, mc_error *err)
{
    if (n > p->nfree)
        return mc_error_set(err, MC_ERR_LIMIT, "%d key/value blocks wanted, %d free of %d", n,
                            p->nfree, p->nblocks);
    for (int i = 0; i < n; i++) ids[i] = p->freelist[--p->nfree];
    return MC_OK;
}

void mc_kvpool_give(mc_kvpool *p, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++) p->freelist[p->nfree++] = ids[i];
}

double mc_logprob_at(const float *logits, int64_t V, int32_t t)
{
    float mx = logits[0];
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double s = 0;
    for (int64_t i = 0; i < V; i++) s += exp((double)logits[i] - (double)mx);
    return (double)logits[t] - (double)mx - log(s);
}

static void linear(mc_kvpool *p, float *out, const float *in, int w, const float *b, size_t n,
                   size_t I, size_t O)
{
    if (p->q8w && p->q8w[w])
        mc_k_linear_q8a8_fwd(p->be, out, in, p->q8w[w], p->q8s[w], b, n, I, O);
    else if (p->b16w && p->b16w[w])
        mc_k_linear_rows_bf16_fwd(p->be, out, in, p->b16w[w], b, n, I, O);
    else
        mc_k_linear_rows_fwd(p->be, out, in, p->rpw && p->rpw[w] ? p->rpw[w] : param_val(p->m, w),
                             NULL, NULL, b, n, I, O);
}

/* The MoE block's linears (moe_infer.c): expert e's rows of parameter w
 * through the same row-invariant kernels (int8 codes, bf16 values or fp32;
 * the router's weight is always fp32), so a row's experts give the same
 * bits whichever other rows went to them. */
static void moe_linear(void *ctx, float *out, const float *in, int w, size_t e, const float *b,
                       size_t n, size_t I, size_t O, int fp32)
{
    mc_kvpool *p = ctx;
    size_t off = e * O * I;
    (void)fp32;
    if (p->q8w && p->q8w[w])
        mc_k_linear_q8a8_fwd(p->be, out, in, p->q8w[w] + e * mc_k_q8a8_packed_bytes(O, I),
                             p->q8s[w] + e * O, b, n, I, O);
    else if (p->b16w && p->b16w[w])
        mc_k_linear_rows_bf16_fwd(p->be, out, in, p->b16w[w] + off, b, n, I, O);
    else
        mc_k_linear_rows_fwd(p->be, out, in, param_val(p->m, w) + off, NULL, NULL, b, n, I, O);
}

static void norm(mc_kvpool *p, float *out, const float *x, int w, int b, size_t n)
{
    mc_model *m = p->m;
    if (m->cfg.normalization == MC_NORM_LAYERNORM)
        mc_k_layernorm_fwd(p->be, out, p->mean, p->rstd, x, param_val(m, w), param_val(m, b), n,
                           p->C, m->cfg.norm_epsilon, MC_PREC_FP32);
    else
        mc_k_rmsnorm_fwd(p->be, out, p->rstd, x, param_val(m, w), n, p->C, m->cfg.norm_epsilon,
                         MC_PREC_FP32);
}

/* key (or value) row of position pos of a sequence, layer li */
static float *kv_at(const mc_kvpool *p, float *pool, const int32_t *blocks, int li, size_t pos)
{
    size_t bs = (size_t)p->block_size, blk = (size_t)blocks[pos / bs];
    return pool + blk * p->block_floats + ((size_t)li * bs + pos % bs) * p->kv_row;
}

/* The new rows' keys and values into their blocks (the attention reads
 * them there, mc_k_attention_paged_fwd). */
static void seq_kv(mc_kvpool *p, const mc_kvseq *s, size_t row0, int li)
{
    size_t bs = (size_t)p->block_size, kr = p->kv_row * sizeof(float);
    size_t len = (size_t)s->len, end = len + (size_t)s->n;
    for (size_t pos = len; pos < end;) {
        size_t run = bs - pos % bs;
        if (run > end - pos) run = end - pos;
        size_t j = pos - len;
        mc_bcopy(p->be, kv_at(p, p->kpool, s->blocks, li, pos), p->kn + (row0 + j) * p->kv_row,
                 run * kr);
        mc_bcopy(p->be, kv_at(p, p->vpool, s->blocks, li, pos), p->vn + (row0 + j) * p->kv_row,
                 run * kr);
        pos += run;
    }
}

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

/* x += in W^T + b, for a row-parallel linear of local input width I.
 * Tensor parallel: the inputs gathered whole, this rank's outputs over the
 * whole width (its rows of the weight re-split by split_by_rows), the
 * outputs gathered whole: one process's sums, never a sum of partial sums. */
static mc_status row_linear(mc_kvpool *p, const float *in, int w, int b, size_t I, size_t n,
                            mc_error *err)
{
    mc_model *m = p->m;
    mc_backend *be = p->be;
    size_t C = p->C, tp = (size_t)m->grid.tp;
    if (tp == 1) {
        linear(p, p->tmp, in, w, param_val(m, b), n, I, C);
        mc_k_acc(be, p->x, p->tmp, n * C);
        return MC_OK;
    }
    const mc_grid *g = &m->grid;
    size_t If = I * tp, so = p->so;
    TRY(mc_allgather(g, MC_GROUP_TP, be, in, p->gin, n * I, err));
    for (size_t i = 0; i < n; i++)
        for (size_t r = 0; r < tp; r++)
            mc_bcopy(be, p->xin + i * If + r * I, p->gin + (r * n + i) * I, I * sizeof(float));
    const float *bias = param_val(m, b);
    linear(p, p->oslice, p->xin, w, bias ? bias + p->o0 : NULL, n, If, p->no);
    TRY(mc_allgather(g, MC_GROUP_TP, be, p->oslice, p->gout, n * so, err));
    for (size_t r = 0; r < tp; r++) {
        size_t r0 = r * so < C ? r * so : C, nr = r0 + so < C ? so : C - r0;
        for (size_t i = 0; nr && i < n; i++)
            mc_bcopy(be, p->tmp + i * C + r0, p->gout + r * n * so + i * nr, nr * sizeof(float));
    }
    mc_k_acc(be, p->x, p->tmp, n * C);
    return MC_OK;
}

/* The head over the rows that want logits: each sequence's last row when
 * it asks for logits, and every row with a target; head_rows at a time,
 * each rank's columns gathered into whole rows. */
static mc_status run_head(mc_kvpool *p, const mc_kvseq *seqs, int nseq, const float *lnf,
                          mc_error *err)
{
    const mc_grid *g = &p->m->grid;
    size_t C = p->C, vl = (size_t)p->vl, k = 0, tp = (size_t)g->tp, V0 = tp * vl;
    int64_t V = p->m->cfg.padded_vocab_size;
    for (int s = 0, r0 = 0; s < nseq; r0 += seqs[s++].n)
        for (int j = 0; j < seqs[s].n; j++)
            if ((j == seqs[s].n - 1 && seqs[s].logits) ||
                (seqs[s].targets && seqs[s].targets[j] >= 0)) {
                p->hseq[k] = s;
                p->hpos[k] = j;
                p->hrow[k++] = r0 + j;
            }
    for (size_t k0 = 0; k0 < k; k0 += (size_t)p->head_rows) {
        size_t nk = k - k0 < (size_t)p->head_rows ? k - k0 : (size_t)p->head_rows;
        for (size_t i = 0; i < nk; i++)
            mc_bcopy(p->be, p->hrows + i * C, lnf + (size_t)p->hrow[k0 + i] * C, C * sizeof(float));
        linear(p, p->logits, p->hrows, head_weight(p->m), NULL, nk, C, vl);
        if (tp > 1) {
            TRY(mc_allgather(g, MC_GROUP_TP, p->be, p->logits, p->gathered, nk * vl, err));
            mc_bcopy_to_host(p->be, p->hgathered, p->gathered, tp * nk * vl * sizeof(float));
            for (size_t r = 0; r < tp; r++)
                for (size_t i = 0; i < nk; i++)
                    memcpy(p->hlogits + i * V0 + r * vl, p->hgathered + (r * nk + i) * vl,
                           vl * sizeof(float));
        } else {
            mc_bcopy_to_host(p->be, p->hlogits, p->logits, nk * vl * sizeof(float));
        }
        for (size_t i = 0; i < nk; i++) {
            const mc_kvseq *q = &seqs[p->hseq[k0 + i]];
            int j = p->hpos[k0 + i];
            const float *lg = p->hlogits + i * V0;
            if (q->targets && q->targets[j] >= 0 && q->logprobs)
                q->logprobs[j] = mc_logprob_at(lg, V, q->targets[j]);
            if (j == q->n - 1 && q->logits) memcpy(q->logits, lg, V0 * sizeof(float));
        }
    }
    return MC_OK;
}

mc_status mc_infer_batch(mc_kvpool *p, const mc_kvseq *seqs, int nseq, mc_error *err)
{
    mc_model *m = p->m;
    const mc_model_config *c = &m->cfg;
    mc_backend *be = p->be;
    int64_t V = c->padded_vocab_size;
    size_t C = p->C, D = p->D, R = 0;
    float scale = 1.0f / sqrtf((float)D);
    for (int s = 0; s < nseq; s++) {
        const mc_kvseq *q = &seqs[s];
        if (q->n < 1 || q->len < 0 || q->len + q->n > p->max_len)
            return mc_error_set(err, MC_ERR_LIMIT,
                                "sequence %d: %d positions after %d do not fit the context of %d",
                                s, q->n, q->len, p->max_len);
        for (int i = 0; i < q->n; i++)
            if (q->tokens[i] < 0 || q->tokens[i] >= V || (q->targets && q->targets[i] >= V))
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "sequence %d: token id %d at position %d is outside the "
                                    "vocabulary [0, %lld)",
                                    s, q->tokens[i], q->len + i, (long long)V);
        if (R + (size_t)q->n > (size_t)p->max_rows)
            return mc_error_set(err, MC_ERR_LIMIT, "a batch of more than %d rows", p->max_rows);
        mc_bcopy_from_host(be, p->dtok + R, q->tokens, (size_t)q->n * sizeof(int32_t));
        p->hrows_n[s] = q->n;
        p->hpos0[s] = q->len;
        size_t bs = (size_t)p->block_size, nb = ((size_t)q->len + (size_t)q->n + bs - 1) / bs;
        memcpy(p->htab + (size_t)s * p->tstride, q->blocks, nb * sizeof(int32_t));
        R += (size_t)q->n;
    }
    if (!R) return MC_OK;
    int rope = c->position_embedding_type == MC_POS_ROPE;
    if (rope || m->wpe >= 0) { /* each row's position: one call over the batch */
        for (int s = 0, r = 0; s < nseq; s++)
            for (int i = 0; i < seqs[s].n; i++) p->hrowpos[r++] = seqs[s].len + i;
        mc_bcopy_from_host(be, p->dpos, p->hrowpos, R * sizeof(int32_t));
    }
    mc_k_embed_fwd(be, p->x, p->dtok, R, param_val(m, m->wte), m->v0, p->vl, C);
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, p->x, R * C, err));
    if (m->wpe >= 0) mc_k_posemb_fwd(be, p->x, param_val(m, m->wpe), 1, R, C, 0, p->dpos);
    for (int l = m->cl0[0]; l < m->cl1[0]; l++) {
        const mc_layer_params *lp = &m->lp[l];
        int li = m->lidx[l];
        norm(p, p->h, p->x, lp->ln1_w, lp->ln1_b, R);
        linear(p, p->qkv, p->h, lp->qkv_w, param_val(m, lp->qkv_b), R, C, p->qkv_out);
        if (c->qk_layernorm) { /* per row: batch-invariant; keys cached normed */
            mc_k_qkv_split(be, p->qp, p->kp, p->vn, p->qkv, R, p->Ql, p->Gl, D);
            mc_model_qk_norm(m, p->q, p->qn_mean, p->qn_rstd, p->qp, R * p->Ql, lp->qn_w, lp->qn_b);
            mc_model_qk_norm(m, p->kn, p->qn_mean, p->qn_rstd, p->kp, R * p->Gl, lp->kn_w,
                             lp->kn_b);
        } else {
            mc_k_qkv_split(be, p->q, p->kn, p->vn, p->qkv, R, p->Ql, p->Gl, D);
        }
        if (rope) {
            mc_rope rp = mc_rope_of(c);
            mc_k_rope_fwd(be, p->q, 1, R, p->Ql, D, &rp, 0, p->dpos);
            mc_k_rope_fwd(be, p->kn, 1, R, p->Gl, D, &rp, 0, p->dpos);
        }
        for (int s = 0, r0 = 0; s < nseq; r0 += seqs[s++].n) seq_kv(p, &seqs[s], (size_t)r0, li);
        /* every sequence's rows against its own blocks, in place */
        size_t loff = (size_t)li * (size_t)p->block_size * p->kv_row;
        mc_k_attention_paged_fwd(be, p->att, p->q, p->kpool + loff, p->vpool + loff,
                                 (size_t)nseq, p->hrows_n, p->hpos0, p->htab, p->tstride,
                                 (size_t)p->block_size, p->block_floats, p->Ql, p->Gl, D, scale);
        TRY(row_linear(p, p->att, lp->proj_w, lp->proj_b, p->Ql * D, R, err));
        norm(p, p->h, p->x, lp->ln2_w, lp->ln2_b, R);
        if (lp->moe) { /* replicated over tensor parallelism: no sums */
            TRY(mc_moe_infer_fwd(m, l, &p->moe, p->h, p->x, R, 0, moe_linear, p, err));
            continue;
        }
        linear(p, p->fc1, p->h, lp->fc1_w, param_val(m, lp->fc1_b), R, C, p->fc1_out);
        if (c->swiglu)
            mc_k_swiglu_fwd(be, p->act, p->fc1, R, p->Fl, MC_PREC_FP32);
        else
            mc_k_gelu_fwd(be, p->act, p->fc1, R * p->Fl, MC_PREC_FP32);
        TRY(row_linear(p, p->act, lp->fc2_w, lp->fc2_b, p->Fl, R, err));
    }
    norm(p, p->h, p->x, m->lnf_w, m->lnf_b, R);
    return run_head(p, seqs, nseq, p->h, err);
}
