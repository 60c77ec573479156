/*
 * attention.c - causal scaled-dot-product attention with grouped queries,
 * tiled flash-style (FlashAttention-2): no T x T matrix is stored, extra
 * memory is O(T) per head (the lse row kept for the backward) plus a fixed
 * block workspace per thread. The backward is here (its recurrence above
 * bwd_item), the forward attention_kv.c's. Layout: q[B,T,Q,D], k,v[B,T,G,D],
 * out[B,T,Q,D], lse[B,Q,T]; query head h reads key/value group h / (Q/G).
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"
#include "kern/cpu/vexp.h"
#include "kern/cpu/att_tile.h"

/* y[0..n) += a x[0..n) */
static inline void axpy(float *restrict y, float a, const float *restrict x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* exp_fast: the vectorizable exp of vexp.h (about 1 ulp on [-87, 88]; below
 * -87 it gives exp(-87) ~ 1.6e-38, zero next to the row's largest term, 1). */
#define exp_fast mc_exp_fast

/* Mt[d*BK + c] = M[c*stride + d] for c < n, 0 for n <= c < BK (att_scores
 * reads whole rows of BK) */
static void transpose_block(float *restrict Mt, const float *restrict M, size_t stride, size_t D,
                            size_t n)
{
    for (size_t c = 0; c < n; c++)
        for (size_t d = 0; d < D; d++) Mt[d * BK + c] = M[c * stride + d];
    for (size_t d = 0; d < D; d++)
        for (size_t c = n; c < BK; c++) Mt[d * BK + c] = 0.0f;
}

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Per-thread workspace of the backward: Kt[D*BK] Vt[D*BK] dK[BK*D]
 * dV[BK*D] S[RT*BK] DP[RT*BK] Dr[hpg*T] (T: the query rows). */
static size_t bwd_slab(size_t D, size_t hpg, size_t T)
{
    return 4 * round16(D * BK) + 2 * RT * BK + round16(hpg * T);
}

/* What one call works on; shared read-only by the threads. */
typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o;
    const float *lse_in;
    size_t B, T, Q, G, D, hpg, nqb;
    float scale;
    const int32_t *seg; /* [B*qs] segment starts, or NULL */
    /* context parallelism's blocks (mc_cpu_attention_block_bwd): rows
     * between sequences of q, dq, dout, out, lse and seg; the keys and the
     * rows between their sequences; the rows' positions among the keys
     * (row t is at key position pos0 + t); the segment starts' offset (a
     * start s is key max(s - seg0, 0)). T, T, T, T, 0, 0 otherwise. */
    size_t qs, nkeys, ks, pos0, seg0;
} att_args;

/* Row t's segment start in the block's key coordinates. */
static inline size_t att_seg(const att_args *A, const int32_t *seg, size_t t)
{
    size_t s = (size_t)seg[t];
    return s > A->seg0 ? s - A->seg0 : 0;
}

/* The per-item body is compiled for each path (isa.h) and picked by the
 * backend's: the variants differ in vector width and register tiles
 * (att_tile.h); no sum is reordered, so they give the same bits. */

/* One work item of the backward = (b, query group g): it owns dk and dv of
 * the group and dq of the group's query heads, so nothing is shared between
 * threads and the summation order is fixed. With D_r = dout_r . out_r and the
 * probabilities recomputed from lse, P_rc = exp(s_rc - lse_r):
 *   dv_c += sum_r P_rc dout_r
 *   dP_rc = dout_r . v_c;   dS_rc = P_rc (dP_rc - D_r)
 *   dq_r += scale sum_c dS_rc k_c;   dk_c += scale sum_r dS_rc q_r
 * The loop runs over key blocks outside (dk, dv of the block stay in the
 * workspace) and the group's heads and query rows r >= the block's first
 * key inside.
 *
 * Segments (packed documents): row r sees keys seg_r .. r; the others get
 * P_rc = dS_rc = 0 exactly, so they add nothing and every sum keeps the
 * order it has without segments (one document gives seg NULL's bits).
 * Starts do not decrease, so the rows that see a key block end at the first
 * row whose segment starts after it: the rows loop stops there, and a short
 * document costs only its own rows.
 *
 * The inner products run in register tiles of four query rows against a
 * block of keys (att_tile.h; keys transposed into the workspace), which
 * vectorize without reordering any sum: each dot product is accumulated in
 * index order, and each gradient row sums its terms in the order of rows
 * and keys whatever the tiling. */
MC_ISA_BODY void bwd_item_body(const att_args *A, size_t it, float *ws, int isa)
{
    const size_t T = A->T, Q = A->Q, G = A->G, D = A->D, hpg = A->hpg;
    const size_t qs = A->qs, ks = A->ks, nkeys = A->nkeys, pos0 = A->pos0;
    const float scale = A->scale, *q = A->q, *k = A->k, *v = A->v, *dout = A->dout;
    float *dq = A->dq, *dk = A->dk, *dv = A->dv;
    float *Kt = ws, *Vt = Kt + round16(D * BK), *dK = Vt + round16(D * BK);
    float *dV = dK + round16(BK * D), *S = dV + round16(BK * D), *DP = S + RT * BK;
    float *Dr = DP + RT * BK;
    static const float one[RT] = {1.0f, 1.0f, 1.0f, 1.0f};
    size_t b = it / G, g = it % G;
    const int32_t *seg = A->seg ? A->seg + b * qs : NULL;
    size_t t_end = 0; /* rows [t_begin, t_end) see the current key block */
    /* D_r = dout_r . out_r for every head of the group */
    for (size_t hh = 0; hh < hpg; hh++) {
        size_t h = g * hpg + hh;
        for (size_t t = 0; t < T; t++) {
            const float *go = dout + ((b * qs + t) * Q + h) * D;
            const float *oo = A->o + ((b * qs + t) * Q + h) * D;
            float acc = 0.0f;
            for (size_t d = 0; d < D; d++) acc += go[d] * oo[d];
            Dr[hh * T + t] = acc;
        }
    }
    for (size_t j0 = 0; j0 < nkeys; j0 += BK) {
        size_t nk = j0 + BK < nkeys ? BK : nkeys - j0;
        /* the first row at or past the block's first key */
        size_t t_begin = j0 > pos0 ? j0 - pos0 : 0;
        if (t_begin >= T) break;
        const float *kb = k + ((b * ks + j0) * G + g) * D;
        const float *vb = v + ((b * ks + j0) * G + g) * D;
        transpose_block(Kt, kb, G * D, D, nk);
        transpose_block(Vt, vb, G * D, D, nk);
        memset(dK, 0, nk * D * sizeof(float));
        memset(dV, 0, nk * D * sizeof(float));
        if (!seg)
            t_end = T;
        else /* the first row starting past the block (it grows with j0) */
            for (t_end = t_end > t_begin ? t_end : t_begin;
                 t_end < T && att_seg(A, seg, t_end) < j0 + nk; t_end++) {}
        for (size_t hh = 0; hh < hpg; hh++) {
            size_t h = g * hpg + hh;
            const float *lrow = A->lse_in + (b * Q + h) * qs;
            /* the rows that see the block, RT at a time */
            for (size_t t0 = t_begin; t0 < t_end; t0 += RT) {
                int nr = t_end - t0 < RT ? (int)(t_end - t0) : RT;
                const float *qr[RT], *gr[RT];
                for (int r = 0; r < RT; r++) {
                    size_t t = t0 + (size_t)(r < nr ? r : nr - 1);
                    qr[r] = q + ((b * qs + t) * Q + h) * D;
                    gr[r] = dout + ((b * qs + t) * Q + h) * D;
                }
                att_scores(isa, S, qr, Kt, D);
                att_scores(isa, DP, gr, Vt, D);
                size_t nc[RT];
                for (int r = 0; r < nr; r++) {
                    size_t t = t0 + (size_t)r;
                    size_t p = pos0 + t;                       /* its position among the keys */
                    nc[r] = p - j0 + 1 < nk ? p - j0 + 1 : nk; /* causal mask */
                    /* the segment's first key in the block (< nc[r]) */
                    size_t st = seg ? att_seg(A, seg, t) : 0;
                    size_t lo = st > j0 ? st - j0 : 0;
                    float lr = lrow[t], Dt = Dr[hh * T + t], *s = S + r * BK, *dp = DP + r * BK;
                    for (size_t c = 0; c < lo; c++) s[c] = dp[c] = 0.0f;
#pragma omp simd
                    for (size_t c = lo; c < nc[r]; c++) {
                        float p = exp_fast(s[c] * scale - lr);
                        s[c] = p;
                        dp[c] = p * (dp[c] - Dt) * scale; /* dS */
                    }
                }
                /* dV_c += P_rc dout_r, dK_c += dS_rc q_r, dq_r += dS_rc k_c:
                 * the keys all rows of a tile see as a tile, then each
                 * row's rest (rows in position order: nc[0] is the least),
                 * so every sum keeps the order of rows and keys */
                float *dq0 = dq ? dq + ((b * qs + t0) * Q + h) * D : NULL;
                int tile = nr == RT;
                int rows = tile ? 1 : nr;
                for (int r = 0; r < rows; r++) {
                    size_t c1 = nc[r];
                    int n = tile ? RT : 1;
                    att_cols(isa, dV, D, S + r * BK, gr + r, 0, c1, n);
                    att_cols(isa, dK, D, DP + r * BK, qr + r, 0, c1, n);
                    if (dq0)
                        att_rows(isa, dq0 + (size_t)r * Q * D, Q * D, D, DP + r * BK, one, kb,
                                 G * D, 0, c1, n);
                }
                if (tile)
                    for (int r = 1; r < RT; r++) {
                        if (nc[r] == nc[0]) continue;
                        att_cols(isa, dV, D, S + r * BK, gr + r, nc[0], nc[r], 1);
                        att_cols(isa, dK, D, DP + r * BK, qr + r, nc[0], nc[r], 1);
                        if (dq0)
                            att_rows(isa, dq0 + (size_t)r * Q * D, Q * D, D, DP + r * BK, one, kb,
                                     G * D, nc[0], nc[r], 1);
                    }
            }
        }
        for (size_t c = 0; c < nk; c++) {
            if (dk) axpy(dk + ((b * ks + j0 + c) * G + g) * D, 1.0f, dK + c * D, D);
            if (dv) axpy(dv + ((b * ks + j0 + c) * G + g) * D, 1.0f, dV + c * D, D);
        }
    }
}
MC_ISA_VARIANTS_VOID(bwd_item, (const att_args *A, size_t it, float *ws), (A, it, ws))

void mc_cpu_attention_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *k,
                          const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D,
                          float scale, const int32_t *seg)
{
    /* the forward is attention_kv.c's: queries at positions 0..T-1 against
     * the T keys of each sequence */
    mc_cpu_attention_rows_fwd(be, out, lse, q, k, v, B, T, 0, T, Q, G, D, scale, seg);
}

/* The general form (att_args): T query rows against nkeys keys. */
static void block_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout,
                      const float *q, const float *k, const float *v, const float *out,
                      const float *lse, size_t B, size_t T, size_t qs, size_t nkeys, size_t ks,
                      size_t Q, size_t G, size_t D, float scale, size_t pos0, size_t seg0,
                      const int32_t *seg)
{
    assert(G > 0 && Q % G == 0 && D > 0 && qs >= T && ks >= nkeys);
    if (B == 0 || T == 0 || nkeys == 0 || (!dq && !dk && !dv)) return;
    const size_t hpg = Q / G, items = B * G, slab = bwd_slab(D, hpg, T);
    att_args A = {NULL, NULL, dq, dk,  dv, q,     k,   v,  dout,  out, lse,  B,   T,
                  Q,    G,    D,  hpg, 0,  scale, seg, qs, nkeys, ks,  pos0, seg0};
    float *work = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK,
                                 slab * (size_t)be->threads * sizeof(float));
#pragma omp parallel num_threads(be->threads)
    {
        float *ws = work + slab * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < items; it++) bwd_item_for(be->isa)(&A, it, ws);
    }
}

void mc_cpu_attention_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v, const float *out,
                          const float *lse, size_t B, size_t T, size_t Q, size_t G, size_t D,
                          float scale, const int32_t *seg)
{
    block_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, T, T, T, Q, G, D, scale, 0, 0, seg);
}

void mc_cpu_attention_block_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                const float *q, const float *k, const float *v, const float *out,
                                const float *lse, size_t B, size_t n, size_t qs, size_t m,
                                size_t ks, size_t Q, size_t G, size_t D, float scale, size_t qpos0,
                                size_t kpos0, const int32_t *seg)
{
    assert(qpos0 >= kpos0);
    block_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, B, n, qs, m, ks, Q, G, D, scale,
              qpos0 - kpos0, kpos0, seg);
}

void mc_cpu_attention_merge(mc_backend *be, float *out, float *lse, const float *pout,
                            const float *plse, size_t B, size_t n, size_t qs, size_t Q, size_t D)
{
    const size_t rows = B * Q * n;
#pragma omp parallel for num_threads(be->threads) schedule(static)
    for (size_t i = 0; i < rows; i++) {
        size_t b = i / (Q * n), h = i / n % Q, t = i % n;
        float *l = lse + (b * Q + h) * qs + t;
        float pl = plse[(b * Q + h) * qs + t];
        if (pl == -INFINITY) continue;
        float *o = out + ((b * qs + t) * Q + h) * D;
        const float *po = pout + ((b * qs + t) * Q + h) * D;
        if (*l == -INFINITY) {
            for (size_t d = 0; d < D; d++) o[d] = po[d];
            *l = pl;
            continue;
        }
        /* L = max + log(1 + exp(min - max)), in double for the weights */
        double a = *l, c = pl, mx = a > c ? a : c;
        double L = mx + log(exp(a - mx) + exp(c - mx));
        float wa = (float)exp(a - L), wc = (float)exp(c - L);
        for (size_t d = 0; d < D; d++) o[d] = o[d] * wa + po[d] * wc;
        *l = (float)L;
    }
}
