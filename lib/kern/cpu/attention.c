/*
 * attention.c - causal scaled-dot-product attention with grouped queries,
 * tiled flash-style (FlashAttention-2) so that no T x T matrix is stored:
 * extra memory is O(T) per head (the lse row kept for the backward) plus a
 * fixed block workspace per thread.
 *
 * Layout: q[B,T,Q,D], k,v[B,T,G,D], out[B,T,Q,D], lse[B,Q,T]. Query head h
 * reads key/value group h / (Q/G).
 *
 * Forward, one work item = (b, h, block of BQ query rows), items split
 * over threads dynamically (each item owns its output rows, so the schedule
 * cannot change any bit). For each key block up to the diagonal:
 *   s_rc = scale q_r . k_c                  (masked to c <= r)
 *   m'   = max(m, max_c s_rc);  P_rc = exp(s_rc - m')
 *   l    = l exp(m - m') + sum_c P_rc;  o_r = o_r exp(m - m') + sum_c P_rc v_c
 * and at the end out_r = o_r / l, lse_r = m + log l.
 *
 * Backward, one work item = (b, query group g): it owns dk and dv of the
 * group and dq of the group's query heads, so nothing is shared between
 * threads and the summation order is fixed. With D_r = dout_r . out_r and the
 * probabilities recomputed from lse, P_rc = exp(s_rc - lse_r):
 *   dv_c += sum_r P_rc dout_r
 *   dP_rc = dout_r . v_c;   dS_rc = P_rc (dP_rc - D_r)
 *   dq_r += scale sum_c dS_rc k_c;   dk_c += scale sum_r dS_rc q_r
 * The loop runs over key blocks outside (dk, dv of the block stay in the
 * workspace) and the group's heads and query rows r >= the block's first
 * key inside.
 *
 * The inner loops are written as axpy's over a contiguous dimension (keys
 * transposed into the workspace) so they vectorize without reordering any
 * sum: each dot product is accumulated in index order.
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/vexp.h"

#define BQ 64 /* query rows per forward work item */
#define BK 64 /* keys per block */

/* y[0..n) += a x[0..n) */
static inline void axpy(float *restrict y, float a, const float *restrict x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* exp_fast: the vectorizable exp of vexp.h (about 1 ulp on [-87, 88]; below
 * -87 it gives exp(-87) ~ 1.6e-38, zero next to the row's largest term, 1). */
#define exp_fast mc_exp_fast

/* sum of s[0..n) in a fixed order that does not depend on the vector width:
 * eight interleaved partial sums, then a fixed tree. s must have room up to
 * n rounded up to 8; the pad is zeroed here. */
static inline float sum8(float *restrict s, size_t n) {
    float part[8] = {0};
    size_t n8 = (n + 7) & ~(size_t)7;
    for (size_t c = n; c < n8; c++) s[c] = 0.0f;
    for (size_t c = 0; c < n8; c += 8)
        for (size_t j = 0; j < 8; j++) part[j] += s[c + j];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* s[c] = sum_d x[d] Mt[d*BK + c] for c < n (Mt: a key block transposed) */
static inline void rowdots(float *restrict s, const float *restrict x, const float *restrict Mt,
                           size_t D, size_t n) {
    for (size_t c = 0; c < n; c++) s[c] = 0.0f;
    for (size_t d = 0; d < D; d++) axpy(s, x[d], Mt + d * BK, n);
}

/* Mt[d*BK + c] = M[c*stride + d] for c < n */
static void transpose_block(float *restrict Mt, const float *restrict M, size_t stride, size_t D,
                            size_t n) {
    for (size_t c = 0; c < n; c++)
        for (size_t d = 0; d < D; d++) Mt[d * BK + c] = M[c * stride + d];
}

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Per-thread workspace: forward Kt[D*BK] s[BK] o[BQ*D] m[BQ] l[BQ];
 * backward Kt[D*BK] Vt[D*BK] dK[BK*D] dV[BK*D] s,p,dp[BK] Dr[hpg*T]. */
static size_t fwd_slab(size_t D) {
    return round16(D * BK) + round16(BK) + round16(BQ * D) + 2 * round16(BQ);
}
static size_t bwd_slab(size_t D, size_t hpg, size_t T) {
    return 4 * round16(D * BK) + 3 * round16(BK) + round16(hpg * T);
}

/* What one call works on; shared read-only by the threads. */
typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o;
    const float *lse_in;
    size_t B, T, Q, G, D, hpg, nqb;
    float scale;
} att_args;

/* The per-item bodies are compiled for AVX-512 and AVX2 as well as the
 * baseline, picked at load time: the axpy loops are most of the work. The
 * clones differ only in vector width; no sum is reordered, so they give the
 * same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define ATT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATT_CLONES
#endif

ATT_CLONES static void fwd_item(const att_args *A, size_t it, float *ws) {
    const size_t T = A->T, Q = A->Q, G = A->G, D = A->D, nqb = A->nqb;
    const float scale = A->scale, *q = A->q, *k = A->k, *v = A->v;
    float *Kt = ws, *s = Kt + round16(D * BK), *o = s + round16(BK);
    float *m = o + round16(BQ * D), *l = m + round16(BQ);
    /* the last query blocks have the most keys: hand them out first */
    size_t qb = nqb - 1 - it % nqb, bh = it / nqb, b = bh / Q, h = bh % Q, g = h / A->hpg;
    size_t i0 = qb * BQ, i1 = i0 + BQ < T ? i0 + BQ : T, nq = i1 - i0;
    for (size_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, nq * D * sizeof(float));
    for (size_t j0 = 0; j0 < i1; j0 += BK) {
        size_t nk = j0 + BK < i1 ? BK : i1 - j0;
        const float *kb = k + ((b * T + j0) * G + g) * D;
        const float *vb = v + ((b * T + j0) * G + g) * D;
        transpose_block(Kt, kb, G * D, D, nk);
        for (size_t r = 0; r < nq; r++) {
            size_t t = i0 + r;
            if (j0 > t) break; /* whole block is in this row's future */
            size_t nc = t - j0 + 1 < nk ? t - j0 + 1 : nk; /* causal mask */
            rowdots(s, q + ((b * T + t) * Q + h) * D, Kt, D, nc);
            float mx = m[r];
            /* max is exact in any order, so a vector reduction is safe */
#pragma omp simd reduction(max : mx)
            for (size_t c = 0; c < nc; c++) {
                s[c] *= scale;
                mx = s[c] > mx ? s[c] : mx;
            }
            float corr = expf(m[r] - mx);
#pragma omp simd
            for (size_t c = 0; c < nc; c++) s[c] = exp_fast(s[c] - mx);
            float sum = sum8(s, nc);
            m[r] = mx;
            l[r] = l[r] * corr + sum;
            float *orow = o + r * D;
            if (corr != 1.0f)
                for (size_t d = 0; d < D; d++) orow[d] *= corr;
            for (size_t c = 0; c < nc; c++) axpy(orow, s[c], vb + c * G * D, D);
        }
    }
    for (size_t r = 0; r < nq; r++) {
        size_t t = i0 + r;
        float inv = 1.0f / l[r], *dst = A->out + ((b * T + t) * Q + h) * D;
        for (size_t d = 0; d < D; d++) dst[d] = o[r * D + d] * inv;
        A->lse[(b * Q + h) * T + t] = m[r] + logf(l[r]);
    }
}

ATT_CLONES static void bwd_item(const att_args *A, size_t it, float *ws) {
    const size_t T = A->T, Q = A->Q, G = A->G, D = A->D, hpg = A->hpg;
    const float scale = A->scale, *q = A->q, *k = A->k, *v = A->v, *dout = A->dout;
    float *dq = A->dq, *dk = A->dk, *dv = A->dv;
    float *Kt = ws, *Vt = Kt + round16(D * BK), *dK = Vt + round16(D * BK);
    float *dV = dK + round16(BK * D), *s = dV + round16(BK * D), *dp = s + round16(BK);
    float *ds = dp + round16(BK), *Dr = ds + round16(BK);
    size_t b = it / G, g = it % G;
    /* D_r = dout_r . out_r for every head of the group */
    for (size_t hh = 0; hh < hpg; hh++) {
        size_t h = g * hpg + hh;
        for (size_t t = 0; t < T; t++) {
            const float *go = dout + ((b * T + t) * Q + h) * D;
            const float *oo = A->o + ((b * T + t) * Q + h) * D;
            float acc = 0.0f;
            for (size_t d = 0; d < D; d++) acc += go[d] * oo[d];
            Dr[hh * T + t] = acc;
        }
    }
    for (size_t j0 = 0; j0 < T; j0 += BK) {
        size_t nk = j0 + BK < T ? BK : T - j0;
        const float *kb = k + ((b * T + j0) * G + g) * D;
        const float *vb = v + ((b * T + j0) * G + g) * D;
        transpose_block(Kt, kb, G * D, D, nk);
        transpose_block(Vt, vb, G * D, D, nk);
        memset(dK, 0, nk * D * sizeof(float));
        memset(dV, 0, nk * D * sizeof(float));
        for (size_t hh = 0; hh < hpg; hh++) {
            size_t h = g * hpg + hh;
            const float *lrow = A->lse_in + (b * Q + h) * T;
            for (size_t t = j0; t < T; t++) {
                size_t nc = t - j0 + 1 < nk ? t - j0 + 1 : nk; /* causal mask */
                const float *qr = q + ((b * T + t) * Q + h) * D;
                const float *gr = dout + ((b * T + t) * Q + h) * D;
                rowdots(s, qr, Kt, D, nc);
                rowdots(dp, gr, Vt, D, nc);
                float lr = lrow[t], Dt = Dr[hh * T + t];
#pragma omp simd
                for (size_t c = 0; c < nc; c++) {
                    float p = exp_fast(s[c] * scale - lr);
                    s[c] = p;
                    ds[c] = p * (dp[c] - Dt) * scale;
                }
                for (size_t c = 0; c < nc; c++) {
                    axpy(dV + c * D, s[c], gr, D);
                    axpy(dK + c * D, ds[c], qr, D);
                }
                if (dq) {
                    float *dqr = dq + ((b * T + t) * Q + h) * D;
                    for (size_t c = 0; c < nc; c++) axpy(dqr, ds[c], kb + c * G * D, D);
                }
            }
        }
        for (size_t c = 0; c < nk; c++) {
            if (dk) axpy(dk + ((b * T + j0 + c) * G + g) * D, 1.0f, dK + c * D, D);
            if (dv) axpy(dv + ((b * T + j0 + c) * G + g) * D, 1.0f, dV + c * D, D);
        }
    }
}

void mc_cpu_attention_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *k,
                        const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D,
                        float scale) {
    assert(G > 0 && Q % G == 0 && D > 0);
    if (B == 0 || T == 0) return;
    const size_t nqb = (T + BQ - 1) / BQ, items = B * Q * nqb, slab = fwd_slab(D);
    att_args A = {out, lse, NULL, NULL, NULL, q, k, v, NULL, NULL, NULL, B, T, Q, G, D, Q / G,
                  nqb, scale};
    float *work = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK,
                                 slab * (size_t)be->threads * sizeof(float));
#pragma omp parallel num_threads(be->threads)
    {
        float *ws = work + slab * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < items; it++) fwd_item(&A, it, ws);
    }
}

void mc_cpu_attention_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout,
                        const float *q, const float *k, const float *v, const float *out,
                        const float *lse, size_t B, size_t T, size_t Q, size_t G, size_t D,
                        float scale) {
    assert(G > 0 && Q % G == 0 && D > 0);
    if (B == 0 || T == 0 || (!dq && !dk && !dv)) return;
    const size_t hpg = Q / G, items = B * G, slab = bwd_slab(D, hpg, T);
    att_args A = {NULL, NULL, dq, dk, dv, q, k, v, dout, out, lse, B, T, Q, G, D, hpg, 0, scale};
    float *work = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK,
                                 slab * (size_t)be->threads * sizeof(float));
#pragma omp parallel num_threads(be->threads)
    {
        float *ws = work + slab * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < items; it++) bwd_item(&A, it, ws);
    }
}
