/*
 * moe.c - the mixture-of-experts kernels: the router's top-k choice and
 * probabilities (softmax or sigmoid scores, pre-softmax, group-limited,
 * expert bias, scaling) and their backward, Megatron's load-balancing and
 * z losses with their gradients, the permutation of tokens by expert and
 * back (weighted by the probabilities), and the grouped GEMM over the rows
 * each expert received. Per-token arithmetic is in double; every loop that
 * adds into a row adds in a fixed order (k, then tokens), so the bits do not
 * depend on the thread count.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include "kern/cpu/cpu.h"

#define PAR_MIN 4096 /* rows x width below which threads cost more than they save */

/* Largest expert count the kernels take (stack arrays of E doubles). */
#define MAX_E MC_MOE_MAX_EXPERTS

static void softmax_row(double *out, const float *l, size_t E)
{
    double m = -INFINITY, z = 0;
    for (size_t e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    for (size_t e = 0; e < E; e++) z += (out[e] = exp((double)l[e] - m));
    for (size_t e = 0; e < E; e++) out[e] /= z;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* sel[0..K): the K largest s[e] with allowed[e] (NULL: all), descending,
 * ties to the lower index. */
static void top_k(int32_t *sel, const double *s, const unsigned char *allowed, size_t E, int K)
{
    unsigned char taken[MAX_E];
    memset(taken, 0, E);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (size_t e = 0; e < E; e++) {
            if (taken[e] || (allowed && !allowed[e])) continue;
            if (best < 0 || s[e] > s[best]) best = (int)e;
        }
        sel[k] = best;
        if (best >= 0) taken[best] = 1;
    }
}

/* Group-limited routing: allowed[e] = 1 for the experts of the token's best
 * group_topk groups, groups ranked by the sum of their top (topk /
 * group_topk) scores. */
static void group_mask(unsigned char *allowed, const double *s, size_t E, const mc_moe_route *r)
{
    size_t G = (size_t)r->num_groups, per = E / G;
    int k = r->topk / r->group_topk;
    double gs[MAX_E];
    int32_t sel[MAX_E];
    for (size_t g = 0; g < G; g++) {
        top_k(sel, s + g * per, NULL, per, k);
        double sum = 0;
        for (int j = 0; j < k; j++) sum += s[g * per + (size_t)sel[j]];
        gs[g] = sum;
    }
    top_k(sel, gs, NULL, G, r->group_topk);
    memset(allowed, 0, E);
    for (int j = 0; j < r->group_topk; j++) memset(allowed + (size_t)sel[j] * per, 1, per);
}

void mc_cpu_moe_route_fwd(mc_backend *be, float *probs, int32_t *idx, const float *logits,
                          const float *expert_bias, size_t N, size_t E, const mc_moe_route *r)
{
    int K = r->topk;
#pragma omp parallel for num_threads(be->threads) if (N * E > PAR_MIN) schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *l = logits + t * E;
        double sc[MAX_E], rs[MAX_E];
        unsigned char allowed[MAX_E];
        int32_t *sel = idx + t * (size_t)K;
        float *p = probs + t * (size_t)K;
        if (r->sigmoid) {
            for (size_t e = 0; e < E; e++) {
                sc[e] = sigmoid(l[e]);
                rs[e] = sc[e] + (expert_bias ? (double)expert_bias[e] : 0.0);
            }
        } else if (r->pre_softmax) {
            softmax_row(sc, l, E);
            memcpy(rs, sc, E * sizeof *rs);
        } else {
            for (size_t e = 0; e < E; e++) rs[e] = sc[e] = l[e];
        }
        if (r->num_groups > 0) group_mask(allowed, rs, E, r);
        top_k(sel, rs, r->num_groups > 0 ? allowed : NULL, E, K);
        double v[MAX_E], sum = 0, m = -INFINITY;
        if (r->sigmoid) {
            for (int k = 0; k < K; k++) sum += (v[k] = sc[sel[k]]);
            if (K > 1)
                for (int k = 0; k < K; k++) v[k] /= sum + 1e-20;
        } else if (r->pre_softmax) {
            for (int k = 0; k < K; k++) v[k] = sc[sel[k]];
        } else {
            for (int k = 0; k < K; k++) m = sc[sel[k]] > m ? sc[sel[k]] : m;
            for (int k = 0; k < K; k++) sum += (v[k] = exp(sc[sel[k]] - m));
            for (int k = 0; k < K; k++) v[k] /= sum;
        }
        double f = r->scaling_factor > 0 ? r->scaling_factor : 1.0;
        for (int k = 0; k < K; k++) p[k] = (float)(v[k] * f);
    }
}

void mc_cpu_moe_route_bwd(mc_backend *be, float *dlogits, const float *dprobs, const float *logits,
                          const int32_t *idx, size_t N, size_t E, const mc_moe_route *r)
{
    int K = r->topk;
    double f = r->scaling_factor > 0 ? r->scaling_factor : 1.0;
#pragma omp parallel for num_threads(be->threads) if (N * E > PAR_MIN) schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *l = logits + t * E;
        const int32_t *sel = idx + t * (size_t)K;
        float *dl = dlogits + t * E;
        double dp[MAX_E], v[MAX_E];
        for (int k = 0; k < K; k++) dp[k] = (double)dprobs[t * (size_t)K + (size_t)k] * f;
        if (r->sigmoid) {
            double S = 0, dot = 0;
            for (int k = 0; k < K; k++) S += (v[k] = sigmoid(l[sel[k]]));
            S += 1e-20;
            for (int k = 0; k < K; k++) dot += dp[k] * v[k];
            for (int k = 0; k < K; k++) {
                double ds = K > 1 ? dp[k] / S - dot / (S * S) : dp[k];
                dl[sel[k]] += (float)(ds * v[k] * (1.0 - v[k]));
            }
        } else if (r->pre_softmax) {
            double sm[MAX_E], dot = 0;
            softmax_row(sm, l, E);
            for (int k = 0; k < K; k++) dot += dp[k] * sm[sel[k]];
            double ds[MAX_E];
            for (size_t e = 0; e < E; e++) ds[e] = 0;
            for (int k = 0; k < K; k++) ds[sel[k]] = dp[k];
            for (size_t e = 0; e < E; e++) dl[e] += (float)(sm[e] * (ds[e] - dot));
        } else {
            double m = -INFINITY, sum = 0, dot = 0;
            for (int k = 0; k < K; k++) m = l[sel[k]] > m ? l[sel[k]] : m;
            for (int k = 0; k < K; k++) sum += (v[k] = exp((double)l[sel[k]] - m));
            for (int k = 0; k < K; k++) v[k] /= sum;
            for (int k = 0; k < K; k++) dot += dp[k] * v[k];
            for (int k = 0; k < K; k++) dl[sel[k]] += (float)(v[k] * (dp[k] - dot));
        }
    }
}

/* The aux loss's scores of one token: softmax, or sigmoid over its sum. */
static void aux_scores(double *s, double *sg, const float *l, size_t E, int sig)
{
    if (!sig) {
        softmax_row(s, l, E);
        return;
    }
    double S = 0;
    for (size_t e = 0; e < E; e++) S += (sg[e] = sigmoid(l[e]));
    for (size_t e = 0; e < E; e++) s[e] = sg[e] / (S + 1e-20);
}

double mc_cpu_moe_aux_loss(mc_backend *be, float *dlogits, const float *logits, size_t G, size_t T,
                           size_t E, size_t K, int sig, float grad)
{
    (void)be;
    double total = 0;
    for (size_t g = 0; g < G; g++) {
        double P[MAX_E], c[MAX_E], s[MAX_E], sg[MAX_E];
        int32_t sel[MAX_E];
        for (size_t e = 0; e < E; e++) P[e] = c[e] = 0;
        for (size_t t = g * T; t < (g + 1) * T; t++) {
            aux_scores(s, sg, logits + t * E, E, sig);
            top_k(sel, s, NULL, E, (int)K);
            for (size_t k = 0; k < K; k++) c[sel[k]] += 1;
            for (size_t e = 0; e < E; e++) P[e] += s[e];
        }
        double w = (double)E / ((double)K * (double)T * (double)T), sum = 0;
        for (size_t e = 0; e < E; e++) sum += P[e] * c[e];
        total += w * sum;
        if (!dlogits) continue;
        /* d/ds[t, e] = grad w c[e] / G, through the score function */
        for (size_t t = g * T; t < (g + 1) * T; t++) {
            const float *l = logits + t * E;
            float *dl = dlogits + t * E;
            double ds[MAX_E], dot = 0;
            aux_scores(s, sg, l, E, sig);
            for (size_t e = 0; e < E; e++) ds[e] = (double)grad * w * c[e] / (double)G;
            if (!sig) {
                for (size_t e = 0; e < E; e++) dot += ds[e] * s[e];
                for (size_t e = 0; e < E; e++) dl[e] += (float)(s[e] * (ds[e] - dot));
            } else {
                double S = 0;
                for (size_t e = 0; e < E; e++) S += sg[e];
                S += 1e-20;
                for (size_t e = 0; e < E; e++) dot += ds[e] * sg[e];
                for (size_t e = 0; e < E; e++) {
                    double dsg = ds[e] / S - dot / (S * S);
                    dl[e] += (float)(dsg * sg[e] * (1.0 - sg[e]));
                }
            }
        }
    }
    return total / (double)G;
}

double mc_cpu_moe_z_loss(mc_backend *be, float *dlogits, const float *logits, size_t N, size_t E,
                         float grad)
{
    (void)be;
    double sum = 0;
    for (size_t t = 0; t < N; t++) {
        const float *l = logits + t * E;
        double m = -INFINITY, z = 0;
        for (size_t e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
        for (size_t e = 0; e < E; e++) z += exp((double)l[e] - m);
        double lse = m + log(z);
        sum += lse * lse;
        if (!dlogits) continue;
        double a = (double)grad * 2.0 * lse / (double)N;
        for (size_t e = 0; e < E; e++) dlogits[t * E + e] += (float)(a * exp((double)l[e] - m) / z);
    }
    return sum / (double)N;
}

void mc_cpu_moe_permute_map(mc_backend *be, int32_t *perm, int32_t *counts, const int32_t *idx,
                            size_t N, size_t E, size_t K, size_t block)
{
    (void)be;
    int64_t off[MAX_E + 1];
    for (size_t e = 0; e < E; e++) counts[e] = 0;
    for (size_t i = 0; i < N * K; i++)
        if (idx[i] >= 0) counts[idx[i]]++;
    off[0] = 0;
    for (size_t e = 0; e < E; e++)
        off[e + 1] = block ? (int64_t)((e + 1) * block) : off[e] + counts[e];
    for (size_t t = 0; t < N; t++)
        for (size_t k = 0; k < K; k++) {
            int32_t e = idx[t * K + k];
            perm[t * K + k] = e < 0 ? -1 : (int32_t)off[e]++;
        }
}

void mc_cpu_moe_capacity_drop(mc_backend *be, int32_t *kept, const int32_t *idx, const float *probs,
                              size_t N, size_t E, size_t K, size_t capacity, int position)
{
    (void)be;
    memcpy(kept, idx, N * K * sizeof *kept);
    /* per expert: its choices in token order; over capacity, drop the
     * lowest probabilities (the latest of equals) or the latest tokens */
    size_t *rows = malloc(N * sizeof *rows);
    if (!rows) abort();
    for (size_t e = 0; e < E; e++) {
        size_t n = 0;
        for (size_t i = 0; i < N * K; i++)
            if (idx[i] == (int32_t)e) rows[n++] = i;
        if (n <= capacity) continue;
        if (position) {
            for (size_t j = capacity; j < n; j++) kept[rows[j]] = -1;
            continue;
        }
        /* keep the capacity best: a choice is kept when fewer than
         * capacity others beat it (higher prob, or equal and earlier) */
        for (size_t j = 0; j < n; j++) {
            float p = probs[rows[j]];
            size_t better = 0;
            for (size_t i = 0; i < n && better < capacity; i++)
                better += probs[rows[i]] > p || (probs[rows[i]] == p && i < j);
            if (better >= capacity) kept[rows[j]] = -1;
        }
    }
    free(rows);
}

void mc_cpu_moe_expert_bias_update(mc_backend *be, float *bias, const float *tokens, size_t E,
                                   float rate)
{
    (void)be;
    float sum = 0.0f;
    for (size_t e = 0; e < E; e++) sum += tokens[e];
    float mean = sum / (float)E;
    for (size_t e = 0; e < E; e++) {
        float off = mean - tokens[e];
        bias[e] += (float)((off > 0) - (off < 0)) * rate;
    }
}

void mc_cpu_moe_permute(mc_backend *be, float *xp, const float *x, const int32_t *perm, size_t N,
                        size_t K, size_t C)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t t = 0; t < N; t++)
        for (size_t k = 0; k < K; k++)
            if (perm[t * K + k] >= 0)
                memcpy(xp + (size_t)perm[t * K + k] * C, x + t * C, C * sizeof(float));
}

void mc_cpu_moe_permute_bwd(mc_backend *be, float *dx, const float *dxp, const int32_t *perm,
                            size_t N, size_t K, size_t C)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t t = 0; t < N; t++)
        for (size_t k = 0; k < K; k++) {
            if (perm[t * K + k] < 0) continue;
            const float *g = dxp + (size_t)perm[t * K + k] * C;
            float *d = dx + t * C;
#pragma omp simd
            for (size_t c = 0; c < C; c++) d[c] += g[c];
        }
}

void mc_cpu_moe_unpermute(mc_backend *be, float *y, const float *yp, const float *probs,
                          const int32_t *perm, size_t N, size_t K, size_t C)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *o = y + t * C;
        memset(o, 0, C * sizeof(float));
        for (size_t k = 0; k < K; k++) {
            if (perm[t * K + k] < 0) continue;
            const float *v = yp + (size_t)perm[t * K + k] * C;
            float p = probs[t * K + k];
#pragma omp simd
            for (size_t c = 0; c < C; c++) o[c] += p * v[c];
        }
    }
}

/* sum_c a[c] b[c] in double (each product exact), in DOT_LANES partial
 * sums, lane c % DOT_LANES, added in a fixed tree at the end: the same bits
 * on every code path, and a loop the compiler vectorizes. */
#define DOT_LANES 8
static double dot_lanes(const float *a, const float *b, size_t n)
{
    double acc[DOT_LANES] = {0};
    size_t c = 0;
    for (; c + DOT_LANES <= n; c += DOT_LANES)
        for (size_t j = 0; j < DOT_LANES; j++) acc[j] += (double)a[c + j] * (double)b[c + j];
    for (; c < n; c++) acc[c % DOT_LANES] += (double)a[c] * (double)b[c];
    for (size_t w = DOT_LANES / 2; w; w /= 2)
        for (size_t j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

void mc_cpu_moe_unpermute_bwd(mc_backend *be, float *dyp, float *dprobs, const float *dy,
                              const float *yp, const float *probs, const int32_t *perm, size_t N,
                              size_t K, size_t C)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *g = dy + t * C;
        for (size_t k = 0; k < K; k++) {
            int32_t row = perm[t * K + k];
            if (row < 0) {
                dprobs[t * K + k] = 0.0f;
                continue;
            }
            const float *v = yp + (size_t)row * C;
            float *d = dyp + (size_t)row * C, p = probs[t * K + k];
#pragma omp simd
            for (size_t c = 0; c < C; c++) d[c] = p * g[c];
            dprobs[t * K + k] = (float)dot_lanes(v, g, C);
        }
    }
}

/* The grouped GEMM. Its work is cut into items that depend on the rows
 * alone, never on the thread count: expert e's n rows in ceil(n /
 * GROUP_ROWS) near-equal blocks (the forward and d x), and its weight's
 * Cout output rows in ceil(Cout / GROUP_COLS) blocks (d W, d b, over all
 * of its n rows at once). Threads take items dynamically, each item one
 * GEMM on the calling thread (inside the parallel region OpenBLAS and
 * oneDNN run single-threaded), so small experts (fine-grained MoE: many
 * experts of few rows each) keep both cores busy without a barrier per
 * GEMM, and the bits do not depend on the thread count.
 *
 * Below fp32 the operands are multiplied in the GEMM's form (bf16 bits, or
 * rounded fp32; mc_cpu_gemm_operand). The weights come prepared (Wp) or are
 * rounded once per call for all the experts. An activation's rows are
 * rounded by the item that multiplies them, into that thread's work space,
 * just before its GEMM reads them from the cache: the forward's x rows of a
 * block, and in the backward, when every expert has at most GROUP_ROWS rows
 * and the weight at most GROUP_COLS output rows (fine-grained experts), one
 * item per expert rounds its d out and x rows once for both of its products
 * (d W and d x). Otherwise the backward rounds d out and x once per call for
 * all the experts, as they are read by several items. The same values are
 * multiplied either way, by the same GEMM calls: the bits do not depend on
 * where the rounding happens. */
#define GROUP_ROWS 256
#define GROUP_COLS 512

static size_t parts(size_t n, size_t blk) { return (n + blk - 1) / blk; }

/* the e with first[e] <= i < first[e + 1] (first[] non-decreasing) */
static size_t item_owner(const size_t *first, size_t E, size_t i)
{
    size_t lo = 0, hi = E;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (first[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* W's operand: its prepared form Wp (bf16 bits where the bf16 GEMM is
 * native, rounded fp32 otherwise; mc_k_prepare_weight) when the caller has
 * one, else W rounded here */
static mc_cpu_gemm_op weight_op(mc_backend *be, mc_prec prec, const float *W, const void *Wp,
                                size_t n)
{
    if (!Wp || prec == MC_PREC_FP32)
        return mc_cpu_gemm_operand(be, prec, MC_CPU_SCRATCH_GEMM_B, W, n);
    mc_cpu_gemm_op o = {Wp, mc_backend_weight_bytes(be, prec)};
    return o;
}

/* src's n values in the GEMM's form in buf (by this thread alone) */
static mc_cpu_gemm_op local_op(const mc_backend *be, mc_prec prec, void *buf, size_t es,
                               const float *src, size_t n)
{
    mc_cpu_prepare_here(be, prec, buf, src, n);
    mc_cpu_gemm_op o = {buf, es};
    return o;
}

void mc_cpu_grouped_linear_fwd(mc_backend *be, mc_prec prec, float *out, const float *x,
                               const float *W, const void *Wp, const float *b, const int64_t *rows,
                               size_t E, size_t Cin, size_t Cout)
{
    size_t off[MAX_E + 1], first[MAX_E + 1];
    off[0] = first[0] = 0;
    for (size_t e = 0; e < E; e++) {
        off[e + 1] = off[e] + (size_t)rows[e];
        first[e + 1] = first[e] + parts((size_t)rows[e], GROUP_ROWS);
    }
    size_t items = first[E], es = mc_backend_weight_bytes(be, prec), slab = GROUP_ROWS * Cin * es;
    if (!items) return;
    char *ws = es ? mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, (size_t)be->threads * slab) : NULL;
    mc_cpu_gemm_op ow = weight_op(be, prec, W, Wp, E * Cout * Cin);
#pragma omp parallel for num_threads(be->threads) schedule(dynamic, 1)
    for (size_t i = 0; i < items; i++) {
        size_t e = item_owner(first, E, i), p = first[e + 1] - first[e], j = i - first[e];
        size_t n = (size_t)rows[e], r0 = off[e] + j * n / p, r1 = off[e] + (j + 1) * n / p;
        mc_cpu_gemm_op ox = {x + r0 * Cin, sizeof(float)};
        if (es)
            ox = local_op(be, prec, ws + slab * (size_t)omp_get_thread_num(), es, x + r0 * Cin,
                          (r1 - r0) * Cin);
        mc_cpu_gemm_ld(be, prec, 0, 1, r1 - r0, Cout, Cin, ox.p, Cin,
                       mc_cpu_gemm_at(ow, e * Cout * Cin), Cin, 0.0f, out + r0 * Cout, Cout);
        if (!b) continue;
        for (size_t r = r0; r < r1; r++) {
            float *o = out + r * Cout;
            const float *be_ = b + e * Cout;
#pragma omp simd
            for (size_t c = 0; c < Cout; c++) o[c] += be_[c];
        }
    }
}

/* db[e][o0:o1] += the sum over expert e's rows [r0, r1) of dout, each
 * column's rows in order */
static void grouped_db(float *db, const float *dout, size_t r0, size_t r1, size_t o0, size_t o1,
                       size_t Cout)
{
    for (size_t c0 = o0; c0 < o1; c0 += 64) {
        size_t c1 = c0 + 64 < o1 ? c0 + 64 : o1;
        float acc[64] = {0};
        for (size_t r = r0; r < r1; r++) {
            const float *g = dout + r * Cout;
#pragma omp simd
            for (size_t c = c0; c < c1; c++) acc[c - c0] += g[c];
        }
        for (size_t c = c0; c < c1; c++) db[c] += acc[c - c0];
    }
}

void mc_cpu_grouped_linear_bwd(mc_backend *be, mc_prec prec, float *dx, float *dW, float *db,
                               const float *dout, const float *x, const float *W, const void *Wp,
                               const int64_t *rows, size_t E, size_t Cin, size_t Cout)
{
    /* items [0, nw): d W / d b blocks of the experts with rows; [nw,
     * nw + nx): d x row blocks */
    size_t off[MAX_E + 1], fx[MAX_E + 1], fw[MAX_E + 1], pc = parts(Cout, GROUP_COLS);
    size_t es = mc_backend_weight_bytes(be, prec), nmax = 0;
    off[0] = fx[0] = fw[0] = 0;
    for (size_t e = 0; e < E; e++) {
        size_t n = (size_t)rows[e];
        off[e + 1] = off[e] + n;
        fx[e + 1] = fx[e] + (dx ? parts(n, GROUP_ROWS) : 0);
        fw[e + 1] = fw[e] + ((dW || db) && n ? pc : 0);
        nmax = n > nmax ? n : nmax;
    }
    size_t nx = fx[E], nw = fw[E], R = off[E];
    if (!nx && !nw) return;
    mc_cpu_gemm_op ow = {NULL, 0};
    if (dx) ow = weight_op(be, prec, W, Wp, E * Cout * Cin);
    if (es && pc == 1 && nmax <= GROUP_ROWS) {
        /* one item per expert with rows: its d out (and x) rows rounded
         * once, then d W, d b and d x */
        size_t slab = nmax * (Cout + (dW ? Cin : 0)) * es;
        char *ws = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, (size_t)be->threads * slab);
#pragma omp parallel for num_threads(be->threads) schedule(dynamic, 1)
        for (size_t e = 0; e < E; e++) {
            size_t n = (size_t)rows[e], r0 = off[e];
            if (!n) continue;
            char *buf = ws + slab * (size_t)omp_get_thread_num();
            mc_cpu_gemm_op od = local_op(be, prec, buf, es, dout + r0 * Cout, n * Cout);
            if (dW) {
                mc_cpu_gemm_op ox = local_op(be, prec, buf + n * Cout * es, es, x + r0 * Cin,
                                             n * Cin);
                mc_cpu_gemm_ld(be, prec, 1, 0, Cout, Cin, n, od.p, Cout, ox.p, Cin, 1.0f,
                               dW + e * Cout * Cin, Cin);
            }
            if (db) grouped_db(db + e * Cout, dout, r0, r0 + n, 0, Cout, Cout);
            if (dx)
                mc_cpu_gemm_ld(be, prec, 0, 0, n, Cin, Cout, od.p, Cout,
                               mc_cpu_gemm_at(ow, e * Cout * Cin), Cin, 1.0f, dx + r0 * Cin, Cin);
        }
        return;
    }
    mc_cpu_gemm_op od = mc_cpu_gemm_operand(be, prec, MC_CPU_SCRATCH_GEMM_C, dout, R * Cout);
    mc_cpu_gemm_op ox = {NULL, 0};
    if (dW && nw) ox = mc_cpu_gemm_operand(be, prec, MC_CPU_SCRATCH_GEMM_A, x, R * Cin);
#pragma omp parallel for num_threads(be->threads) schedule(dynamic, 1)
    for (size_t i = 0; i < nw + nx; i++) {
        if (i >= nw) { /* dx[r0:r1] += dout[r0:r1] W[e] */
            size_t e = item_owner(fx, E, i - nw), p = fx[e + 1] - fx[e], j = i - nw - fx[e];
            size_t n = (size_t)rows[e], r0 = off[e] + j * n / p, r1 = off[e] + (j + 1) * n / p;
            mc_cpu_gemm_ld(be, prec, 0, 0, r1 - r0, Cin, Cout, mc_cpu_gemm_at(od, r0 * Cout), Cout,
                           mc_cpu_gemm_at(ow, e * Cout * Cin), Cin, 1.0f, dx + r0 * Cin, Cin);
            continue;
        }
        /* dW[e][o0:o1] += dout[e rows][:, o0:o1]^T x[e rows]; db likewise */
        size_t e = item_owner(fw, E, i), j = i - fw[e], n = (size_t)rows[e];
        size_t o0 = j * Cout / pc, o1 = (j + 1) * Cout / pc;
        if (dW)
            mc_cpu_gemm_ld(be, prec, 1, 0, o1 - o0, Cin, n, mc_cpu_gemm_at(od, off[e] * Cout + o0),
                           Cout, mc_cpu_gemm_at(ox, off[e] * Cin), Cin, 1.0f,
                           dW + e * Cout * Cin + o0 * Cin, Cin);
        if (db) grouped_db(db + e * Cout, dout, off[e], off[e + 1], o0, o1, Cout);
    }
}
