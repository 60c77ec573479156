/*
 * attention_kv.c - causal attention of new query rows against a key/value
 * cache, for inference (lib/model/infer.c): n queries at positions
 * pos0 .. pos0 + n - 1 of one sequence, keys and values of positions
 * 0 .. pos0 + n - 1 already in the cache (the new rows' own keys included).
 * Prefill is pos0 = 0, n = prompt length; each generated token is n = 1.
 *
 * Layout: q[n,Q,D], kc,vc[L,G,D] (L >= pos0 + n: the cache's capacity, only
 * the first pos0 + n positions read), out[n,Q,D]. Query head h reads group
 * h / (Q/G). Query row i sees keys j <= pos0 + i:
 *   s_j = scale q_i . k_j;  out_i = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)
 * with m = max_j s_j, computed blockwise with the online softmax of
 * attention.c (running max, rescaled sum and output), so no row of scores
 * longer than a key block is stored.
 *
 * One work item = (head, block of BQ query rows); items go to threads
 * dynamically and each owns its output rows, so the schedule changes no bit.
 * Dot products and sums run in index order, and the exp is vexp.h's, so
 * every vector width gives the same bits.
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/vexp.h"

#define BQ 32 /* query rows per work item */
#define BK 64 /* keys per block */

static inline void kv_axpy(float *restrict y, float a, const float *restrict x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

static size_t kv_round16(size_t n) { return (n + 15) & ~(size_t)15; }

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KV_CLONES
#endif

typedef struct {
    float *out;
    const float *q, *kc, *vc;
    size_t n, pos0, Q, G, D, hpg, nqb;
    float scale;
} kv_args;

/* Workspace per thread: Kt[D*BK] (a key block transposed), s[BK], o[BQ*D],
 * m[BQ], l[BQ]. */
static size_t kv_slab(size_t D) {
    return kv_round16(D * BK) + kv_round16(BK) + kv_round16(BQ * D) + 2 * kv_round16(BQ);
}

KV_CLONES static void kv_item(const kv_args *A, size_t it, float *ws) {
    const size_t Q = A->Q, G = A->G, D = A->D, pos0 = A->pos0, n = A->n;
    float *Kt = ws, *s = Kt + kv_round16(D * BK), *o = s + kv_round16(BK);
    float *m = o + kv_round16(BQ * D), *l = m + kv_round16(BQ);
    size_t h = it / A->nqb, qb = it % A->nqb, g = h / A->hpg;
    size_t i0 = qb * BQ, i1 = i0 + BQ < n ? i0 + BQ : n, nq = i1 - i0;
    size_t kend = pos0 + i1; /* keys this block of rows may see */
    for (size_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, nq * D * sizeof(float));
    for (size_t j0 = 0; j0 < kend; j0 += BK) {
        size_t nk = j0 + BK < kend ? BK : kend - j0;
        for (size_t c = 0; c < nk; c++)
            for (size_t d = 0; d < D; d++) Kt[d * BK + c] = A->kc[((j0 + c) * G + g) * D + d];
        for (size_t r = 0; r < nq; r++) {
            size_t p = pos0 + i0 + r; /* this row's position: keys 0..p */
            if (j0 > p) continue; /* rows are not block-aligned: later rows may see it */
            size_t nc = p - j0 + 1 < nk ? p - j0 + 1 : nk;
            const float *qr = A->q + ((i0 + r) * Q + h) * D;
            for (size_t c = 0; c < nc; c++) s[c] = 0.0f;
            for (size_t d = 0; d < D; d++) kv_axpy(s, qr[d], Kt + d * BK, nc);
            float mx = m[r];
            for (size_t c = 0; c < nc; c++) {
                s[c] *= A->scale;
                mx = s[c] > mx ? s[c] : mx;
            }
            float corr = mc_exp_fast(m[r] - mx); /* 0 on the first block: m = -inf */
            if (m[r] == -INFINITY) corr = 0.0f;
            float sum = 0.0f;
#pragma omp simd
            for (size_t c = 0; c < nc; c++) s[c] = mc_exp_fast(s[c] - mx);
            for (size_t c = 0; c < nc; c++) sum += s[c];
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            float *orow = o + r * D;
            for (size_t d = 0; d < D; d++) orow[d] *= corr;
            for (size_t c = 0; c < nc; c++)
                kv_axpy(orow, s[c], A->vc + ((j0 + c) * G + g) * D, D);
        }
    }
    for (size_t r = 0; r < nq; r++) {
        float inv = 1.0f / l[r];
        float *dst = A->out + ((i0 + r) * Q + h) * D;
        for (size_t d = 0; d < D; d++) dst[d] = o[r * D + d] * inv;
    }
}

void mc_cpu_attention_kv_fwd(mc_backend *be, float *out, const float *q, const float *kc,
                             const float *vc, size_t n, size_t pos0, size_t Q, size_t G, size_t D,
                             float scale) {
    assert(G > 0 && Q % G == 0 && D > 0);
    if (n == 0) return;
    kv_args A = {out, q, kc, vc, n, pos0, Q, G, D, Q / G, (n + BQ - 1) / BQ, scale};
    size_t items = Q * A.nqb, slab = kv_slab(D);
    int nt = be->threads;
    if ((size_t)nt > items) nt = (int)items;
    float *ws = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, (size_t)nt * slab * sizeof(float));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t it = 0; it < items; it++)
        kv_item(&A, it, ws + (size_t)omp_get_thread_num() * slab);
}
