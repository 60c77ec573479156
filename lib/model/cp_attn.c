/*
 * cp_attn.c - context parallelism in the model: the sequence of every
 * micro-batch split over the context-parallel group (Megatron's load
 * balancing: 2 CP chunks, rank r holding chunks r and 2CP-1-r), the
 * positions and segment starts of a rank's rows, the micro-batch's tokens
 * and targets cut to them, and attention across the group: ring attention
 * (p2p: key/value blocks passed around the group, partials merged by their
 * log-sum-exp, dK/dV passed around in the backward) or Ulysses' all-to-all
 * (a2a: heads exchanged for the sequence). See doc/ARCHITECTURE.md,
 * "Context parallelism".
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

struct mc_cp_attn {
    int type;           /* MC_CP_P2P or MC_CP_A2A */
    size_t Tg, c;       /* the whole sequence, a chunk: Tg / (2 cp) */
    void *block;        /* the backend block below */
    float *kv[2];       /* p2p: [2][k | v] key/value blocks in flight, 2 B T Gl D each */
    float *dkv[2];      /* p2p: their gradients passed around in the backward */
    float *pout;        /* [B, T, Ql, D] a block's partial output */
    float *plse;        /* [B, Ql, T] its log-sum-exp */
    float *a2a[4];      /* a2a: q, k, v, out in the heads' layout, [B, Tg, Ql/cp or Gl/cp, D] */
    float *a2a_d[4];    /* a2a: their gradients (dq, dk, dv) and dout */
    float *a2a_lse;     /* a2a: [B, Ql/cp, Tg] */
    float *send, *recv; /* a2a: staging of an exchange, [cp][message] each */
    int32_t *seg_g;     /* a2a: [B Tg] segment starts of the whole sequences (backend) */
    /* host: the layout of one whole sequence, and the cut tokens and targets */
    int32_t *hpos, *hseg, *htok, *htgt;
    /* a2a: each slot's segment starts of the whole sequences [nslots][B Tg] */
    int32_t *hseg_g;
    int nslots_g;
};

/* Chunk of this rank's half h (0: the first, r; 1: the second, 2CP-1-r). */
static size_t chunk_of(const mc_model *m, int rank, int h)
{
    return h == 0 ? (size_t)rank : (size_t)(2 * m->grid.cp - 1 - rank);
}

mc_status mc_model_check_cp(const mc_model_config *c, int tp, int cp, mc_error *err)
{
    if (cp <= 1) return MC_OK;
    int64_t Tg = c->seq_length;
    if (Tg % (2 * cp))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--seq-length %lld is not divisible by 2 x --context-parallel-size "
                            "= %d (each rank holds two chunks of every sequence)",
                            (long long)Tg, 2 * cp);
    if (c->sequence_parallel && tp > 1 && Tg % ((int64_t)cp * tp))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--seq-length %lld is not divisible by --context-parallel-size x "
                            "--tensor-model-parallel-size = %d (--sequence-parallel splits each "
                            "rank's rows over the tensor-parallel group)",
                            (long long)Tg, cp * tp);
    if (c->cp_comm_type == MC_CP_A2A) {
        int heads = c->num_attention_heads / tp;
        int groups = (c->num_query_groups ? c->num_query_groups : c->num_attention_heads) / tp;
        if (heads % cp || groups % cp)
            return mc_error_set(err, MC_ERR_USAGE,
                                "--cp-comm-type a2a: %d attention heads and %d query groups per "
                                "tensor-parallel rank cannot be split over "
                                "--context-parallel-size %d (both must be multiples of it); use "
                                "--cp-comm-type p2p",
                                heads, groups, cp);
    }
    return MC_OK;
}

mc_status mc_model_cp_new(mc_model *m, int type, mc_error *err)
{
    int cp = m->grid.cp;
    size_t Tg = (size_t)m->cfg.seq_length, B = (size_t)m->B;
    TRY(mc_model_check_cp(&m->cfg, m->grid.tp, cp, err));
    mc_cp_attn *a = calloc(1, sizeof *a);
    if (!a) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    m->cpa = a;
    a->type = type;
    a->Tg = Tg;
    a->c = Tg / (size_t)(2 * cp);
    a->hpos = malloc(Tg * sizeof(int32_t));
    a->hseg = malloc(Tg * sizeof(int32_t));
    a->htok = malloc(B * Tg * sizeof(int32_t));
    a->htgt = malloc(B * Tg * sizeof(int32_t));
    if (!a->hpos || !a->hseg || !a->htok || !a->htgt)
        return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    size_t T = m->T, D = m->D, nkv = B * T * m->Gl * D, nq = B * T * m->Ql * D;
    for (int pass = 0; pass < 2; pass++) {
        carver cv = {pass ? a->block : NULL, 0};
        if (type == MC_CP_P2P) {
            for (int i = 0; i < 2; i++) a->kv[i] = carve(&cv, 2 * nkv);
            for (int i = 0; i < 2; i++) a->dkv[i] = carve(&cv, 2 * nkv);
            a->pout = carve(&cv, nq);
            a->plse = carve(&cv, B * m->Ql * T);
        } else {
            /* the heads' layout holds as many numbers as the rows' */
            for (int i = 0; i < 4; i++) a->a2a[i] = carve(&cv, i == 1 || i == 2 ? nkv : nq);
            for (int i = 0; i < 4; i++) a->a2a_d[i] = carve(&cv, i == 1 || i == 2 ? nkv : nq);
            a->a2a_lse = carve(&cv, B * m->Ql * T);
            a->send = carve(&cv, nq > nkv ? nq : nkv);
            a->recv = carve(&cv, nq > nkv ? nq : nkv);
            a->seg_g = (int32_t *)carve(&cv, B * Tg);
        }
        if (!pass) {
            a->block = mc_balloc(m->be, cv.off, err);
            if (!a->block) return err ? err->code : MC_ERR_NOMEM;
        }
    }
    return MC_OK;
}

void mc_model_cp_free(mc_model *m)
{
    mc_cp_attn *a = m->cpa;
    if (!a) return;
    if (a->block) mc_bfree(m->be, a->block);
    free(a->hpos);
    free(a->hseg);
    free(a->htok);
    free(a->htgt);
    free(a->hseg_g);
    free(a);
    m->cpa = NULL;
}

/* rows of this rank's chunks of one whole sequence x[Tg] into y[2c] */
static void cut(const mc_model *m, int32_t *y, const int32_t *x)
{
    size_t c = m->cpa->c;
    for (int h = 0; h < 2; h++)
        memcpy(y + (size_t)h * c, x + chunk_of(m, m->grid.cp_rank, h) * c, c * sizeof(int32_t));
}

mc_status mc_model_cp_cut(mc_model *m, const int32_t **tokens, const int32_t **targets,
                          int64_t *count, mc_error *err)
{
    (void)err;
    mc_cp_attn *a = m->cpa;
    size_t B = (size_t)m->B, Tg = a->Tg, T = m->T;
    int64_t n = 0;
    if (*tokens) {
        for (size_t b = 0; b < B; b++) cut(m, a->htok + b * T, *tokens + b * Tg);
        *tokens = a->htok;
    }
    if (*targets) {
        for (size_t i = 0; i < B * Tg; i++) n += (*targets)[i] >= 0;
        for (size_t b = 0; b < B; b++) cut(m, a->htgt + b * T, *targets + b * Tg);
        *targets = a->htgt;
    }
    *count = n;
    return MC_OK;
}

mc_status mc_model_cp_layout(mc_model *m, int slot, size_t b, const int32_t *tokens, int32_t *pos,
                             int32_t *seg, mc_error *err)
{
    mc_cp_attn *a = m->cpa;
    size_t Tg = a->Tg, n = (size_t)m->B * Tg;
    int32_t *seg_whole = NULL;
    if (a->type == MC_CP_A2A) {
        if (slot >= a->nslots_g) {
            int32_t *p = realloc(a->hseg_g, (size_t)(slot + 1) * n * sizeof(int32_t));
            if (!p) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
            a->hseg_g = p;
            a->nslots_g = slot + 1;
        }
        seg_whole = a->hseg_g + (size_t)slot * n + b * Tg;
    }
    if (tokens) {
        mc_doc_layout(&m->docs, tokens, Tg, 0, a->hpos, a->hseg);
    } else { /* no resets: positions are the rows' places in the sequence */
        for (size_t t = 0; t < Tg; t++) a->hpos[t] = (int32_t)t, a->hseg[t] = 0;
    }
    if (seg_whole) memcpy(seg_whole, a->hseg, Tg * sizeof(int32_t));
    cut(m, pos, a->hpos);
    cut(m, seg, a->hseg);
    return MC_OK;
}

/* --------------------------------------------------------------- ring (p2p) */

/* This rank's query chunks against the key/value chunks kv ([k | v], each
 * [B, T, Gl, D]) of rank src: every pair whose key chunk is at or before the
 * query chunk (the same chunk: causal; an earlier one: whole), forward
 * (partials merged into out/lse) or backward (dq added, dk/dv into dkv). */
static void ring_blocks(mc_model *m, mc_layer_acts *L, const float *kv, float *dkv, int src,
                        const int32_t *seg, int backward)
{
    mc_cp_attn *a = m->cpa;
    mc_backend *be = m->be;
    size_t B = (size_t)m->B, T = m->T, c = a->c, Q = m->Ql, G = m->Gl, D = m->D;
    size_t nkv = B * T * G * D;
    float scale = 1.0f / sqrtf((float)D);
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
            size_t qc = chunk_of(m, m->grid.cp_rank, qh), kc = chunk_of(m, src, kh);
            if (kc > qc) continue; /* wholly in the future */
            size_t qo = (size_t)qh * c, ko = (size_t)kh * c;
            const float *k = kv + ko * G * D, *v = kv + nkv + ko * G * D;
            const int32_t *sg = seg ? seg + qo : NULL;
            if (!backward) {
                mc_k_attention_block_fwd(be, a->pout + qo * Q * D, a->plse + qo, L->q + qo * Q * D,
                                         k, v, B, c, T, c, T, Q, G, D, scale, qc * c, kc * c, sg);
                mc_k_attention_merge(be, L->att + qo * Q * D, L->lse + qo, a->pout + qo * Q * D,
                                     a->plse + qo, B, c, T, Q, D);
            } else {
                mc_k_attention_block_bwd(be, m->dq + qo * Q * D, dkv + ko * G * D,
                                         dkv + nkv + ko * G * D, m->datt + qo * Q * D,
                                         L->q + qo * Q * D, k, v, L->att + qo * Q * D, L->lse + qo,
                                         B, c, T, c, T, Q, G, D, scale, qc * c, kc * c, sg);
            }
        }
}

/* Send x to the next rank of the ring and receive y from the previous,
 * n floats each; *rs and *rr the requests. */
static mc_status ring_shift(mc_model *m, const float *x, float *y, size_t n, mc_request **rs,
                            mc_request **rr, mc_error *err)
{
    int cp = m->grid.cp, r = m->grid.cp_rank;
    TRY(mc_irecv(&m->grid, MC_GROUP_CP, m->be, y, n, (r + cp - 1) % cp, rr, err));
    return mc_isend(&m->grid, MC_GROUP_CP, m->be, x, n, (r + 1) % cp, rs, err);
}

static mc_status wait2(mc_model *m, mc_request *a, mc_request *b, mc_error *err)
{
    mc_status st = mc_wait(&m->grid, a, err);
    mc_status st2 = mc_wait(&m->grid, b, st ? NULL : err);
    return st ? st : st2;
}

/* Forward: step s computes with the blocks of rank r - s while those of
 * rank r - s - 1 arrive. */
static mc_status ring_fwd(mc_model *m, mc_layer_acts *L, const int32_t *seg, mc_error *err)
{
    mc_cp_attn *a = m->cpa;
    mc_backend *be = m->be;
    int cp = m->grid.cp, r = m->grid.cp_rank;
    size_t B = (size_t)m->B, T = m->T, nkv = B * T * m->Gl * m->D;
    mc_bcopy(be, a->kv[0], L->k, nkv * sizeof(float));
    mc_bcopy(be, a->kv[0] + nkv, L->v, nkv * sizeof(float));
    mc_k_fill(be, L->att, 0.0f, B * T * m->Ql * m->D);
    mc_k_fill(be, L->lse, -INFINITY, B * m->Ql * T);
    for (int s = 0; s < cp; s++) {
        mc_request *rs = NULL, *rr = NULL;
        float *cur = a->kv[s & 1];
        if (s + 1 < cp) TRY(ring_shift(m, cur, a->kv[(s + 1) & 1], 2 * nkv, &rs, &rr, err));
        ring_blocks(m, L, cur, NULL, (r + cp - s) % cp, seg, 0);
        TRY(wait2(m, rs, rr, err));
    }
    return MC_OK;
}

/* Backward: the key/value blocks go round again, ahead of the compute; the
 * gradient of each block follows it, every rank adding its terms, and after
 * the last step reaches the block's owner. */
static mc_status ring_bwd(mc_model *m, mc_layer_acts *L, const int32_t *seg, mc_error *err)
{
    mc_cp_attn *a = m->cpa;
    mc_backend *be = m->be;
    int cp = m->grid.cp, r = m->grid.cp_rank;
    size_t B = (size_t)m->B, T = m->T, nkv = B * T * m->Gl * m->D;
    mc_bcopy(be, a->kv[0], L->k, nkv * sizeof(float));
    mc_bcopy(be, a->kv[0] + nkv, L->v, nkv * sizeof(float));
    mc_k_fill(be, a->dkv[0], 0.0f, 2 * nkv);
    for (int s = 0; s < cp; s++) {
        mc_request *rs = NULL, *rr = NULL;
        float *cur = a->kv[s & 1], *dcur = a->dkv[s & 1];
        if (s + 1 < cp) TRY(ring_shift(m, cur, a->kv[(s + 1) & 1], 2 * nkv, &rs, &rr, err));
        ring_blocks(m, L, cur, dcur, (r + cp - s) % cp, seg, 1);
        TRY(wait2(m, rs, rr, err));
        TRY(ring_shift(m, dcur, a->dkv[(s + 1) & 1], 2 * nkv, &rs, &rr, err));
        TRY(wait2(m, rs, rr, err));
    }
    /* after cp steps this rank's own blocks' gradient is back */
    const float *own = a->dkv[cp & 1];
    mc_k_acc(be, m->dk, own, nkv);
    mc_k_acc(be, m->dv, own + nkv, nkv);
    return MC_OK;
}

/* ----------------------------------------------------------- Ulysses (a2a) */

/* The all-to-all between the rows' layout x [B, T, H, D] (this rank's two
 * chunks of every sequence, all H local heads) and the heads' layout y
 * [B, Tg, H/cp, D] (every position of the sequences, this rank's share of
 * the heads: group rank j holds heads [j H/cp, (j+1) H/cp)). to_heads 1:
 * x -> y; 0: y -> x. The message between this rank and rank j is
 * [B][2][c][H/cp][D]: the rows of the rows-side rank's chunks, the heads of
 * the heads-side rank. */
static mc_status a2a(mc_model *m, float *x, float *y, size_t H, int to_heads, mc_error *err)
{
    mc_cp_attn *a = m->cpa;
    mc_backend *be = m->be;
    int cp = m->grid.cp, r = m->grid.cp_rank;
    size_t B = (size_t)m->B, T = m->T, Tg = a->Tg, c = a->c, D = m->D, Hs = H / (size_t)cp;
    size_t msg = B * T * Hs * D, sz = Hs * D * sizeof(float);
    float *snd = a->send, *rcv = a->recv; /* [cp][msg]: to, and from, each rank */
    if (to_heads)                         /* rank j gets its heads of this rank's rows */
        for (int j = 0; j < cp; j++)
            for (size_t row = 0; row < B * T; row++)
                mc_bcopy(be, snd + (size_t)j * msg + row * Hs * D,
                         x + (row * H + (size_t)j * Hs) * D, sz);
    else /* rank j gets its rows of this rank's heads */
        for (int j = 0; j < cp; j++)
            for (size_t b = 0; b < B; b++)
                for (int h = 0; h < 2; h++)
                    mc_bcopy(be, snd + (size_t)j * msg + (b * 2 + (size_t)h) * c * Hs * D,
                             y + (b * Tg + chunk_of(m, j, h) * c) * Hs * D, c * sz);
    mc_bcopy(be, rcv + (size_t)r * msg, snd + (size_t)r * msg, msg * sizeof(float));
    for (int d = 1; d < cp; d++) {
        int to = (r + d) % cp, from = (r + cp - d) % cp;
        mc_request *rs = NULL, *rr = NULL;
        TRY(mc_irecv(&m->grid, MC_GROUP_CP, be, rcv + (size_t)from * msg, msg, from, &rr, err));
        TRY(mc_isend(&m->grid, MC_GROUP_CP, be, snd + (size_t)to * msg, msg, to, &rs, err));
        TRY(wait2(m, rs, rr, err));
    }
    if (to_heads) /* rank j's rows: its chunks, in position order */
        for (int j = 0; j < cp; j++)
            for (size_t b = 0; b < B; b++)
                for (int h = 0; h < 2; h++)
                    mc_bcopy(be, y + (b * Tg + chunk_of(m, j, h) * c) * Hs * D,
                             rcv + (size_t)j * msg + (b * 2 + (size_t)h) * c * Hs * D, c * sz);
    else /* rank j's heads of this rank's rows */
        for (int j = 0; j < cp; j++)
            for (size_t row = 0; row < B * T; row++)
                mc_bcopy(be, x + (row * H + (size_t)j * Hs) * D,
                         rcv + (size_t)j * msg + row * Hs * D, sz);
    return MC_OK;
}

/* The slot's segment starts of the whole sequences to the backend (NULL
 * without segments). */
static const int32_t *a2a_segments(mc_model *m, const mc_slot *sl, const int32_t *seg)
{
    mc_cp_attn *a = m->cpa;
    if (!seg) return NULL;
    size_t n = (size_t)m->B * a->Tg, slot = (size_t)(sl - m->slots);
    mc_bcopy_from_host(m->be, a->seg_g, a->hseg_g + slot * n, n * sizeof(int32_t));
    return a->seg_g;
}

static mc_status a2a_fwd(mc_model *m, const mc_slot *sl, mc_layer_acts *L, const int32_t *seg,
                         mc_error *err)
{
    mc_cp_attn *a = m->cpa;
    size_t B = (size_t)m->B, Tg = a->Tg, D = m->D, cp = (size_t)m->grid.cp;
    size_t Qs = m->Ql / cp, Gs = m->Gl / cp;
    TRY(a2a(m, L->q, a->a2a[0], m->Ql, 1, err));
    TRY(a2a(m, L->k, a->a2a[1], m->Gl, 1, err));
    TRY(a2a(m, L->v, a->a2a[2], m->Gl, 1, err));
    /* the whole sequences: the single process's attention on this rank's
     * heads (segment starts of the whole sequences) */
    mc_backend_set_attention_prec(m->be, m->prec);
    mc_k_attention_fwd(m->be, a->a2a[3], a->a2a_lse, a->a2a[0], a->a2a[1], a->a2a[2], B, Tg, Qs, Gs,
                       D, 1.0f / sqrtf((float)D), a2a_segments(m, sl, seg));
    /* keep lse in the layer's slot (same size): the backward's */
    mc_bcopy(m->be, L->lse, a->a2a_lse, B * Qs * Tg * sizeof(float));
    return a2a(m, L->att, a->a2a[3], m->Ql, 0, err);
}

static mc_status a2a_bwd(mc_model *m, const mc_slot *sl, mc_layer_acts *L, const int32_t *seg,
                         mc_error *err)
{
    mc_cp_attn *a = m->cpa;
    mc_backend *be = m->be;
    size_t B = (size_t)m->B, Tg = a->Tg, D = m->D, cp = (size_t)m->grid.cp;
    size_t Qs = m->Ql / cp, Gs = m->Gl / cp, nq = B * Tg * Qs * D, nk = B * Tg * Gs * D;
    /* q, k, v and out again in the heads' layout (recomputed by exchange
     * rather than kept: the layer's slot keeps the rows' layout) */
    TRY(a2a(m, L->q, a->a2a[0], m->Ql, 1, err));
    TRY(a2a(m, L->k, a->a2a[1], m->Gl, 1, err));
    TRY(a2a(m, L->v, a->a2a[2], m->Gl, 1, err));
    TRY(a2a(m, L->att, a->a2a[3], m->Ql, 1, err));
    TRY(a2a(m, m->datt, a->a2a_d[3], m->Ql, 1, err));
    mc_k_fill(be, a->a2a_d[0], 0.0f, nq);
    mc_k_fill(be, a->a2a_d[1], 0.0f, nk);
    mc_k_fill(be, a->a2a_d[2], 0.0f, nk);
    mc_backend_set_attention_prec(be, m->prec);
    mc_k_attention_bwd(be, a->a2a_d[0], a->a2a_d[1], a->a2a_d[2], a->a2a_d[3], a->a2a[0], a->a2a[1],
                       a->a2a[2], a->a2a[3], L->lse, B, Tg, Qs, Gs, D, 1.0f / sqrtf((float)D),
                       a2a_segments(m, sl, seg));
    /* back to the rows' layout: dq, dk, dv (zero on entry, overwritten) */
    TRY(a2a(m, m->dq, a->a2a_d[0], m->Ql, 0, err));
    TRY(a2a(m, m->dk, a->a2a_d[1], m->Gl, 0, err));
    return a2a(m, m->dv, a->a2a_d[2], m->Gl, 0, err);
}

mc_status mc_model_cp_attention_fwd(mc_model *m, const mc_slot *sl, mc_layer_acts *L,
                                    const int32_t *seg, mc_error *err)
{
    return m->cpa->type == MC_CP_A2A ? a2a_fwd(m, sl, L, seg, err) : ring_fwd(m, L, seg, err);
}

mc_status mc_model_cp_attention_bwd(mc_model *m, const mc_slot *sl, mc_layer_acts *L,
                                    const int32_t *seg, mc_error *err)
{
    return m->cpa->type == MC_CP_A2A ? a2a_bwd(m, sl, L, seg, err) : ring_bwd(m, L, seg, err);
}
