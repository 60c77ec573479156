/*
 * grouped.c - the MoE layer's expert computation alone, through the kernels
 * mc_moe_fwd/_bwd call (kern.h), against the sgemm peak measured by the same
 * BLAS call (mc_k_linear_fwd, i.e. cblas_sgemm or oneDNN's bf16 GEMM) on a
 * square matrix in the same process, interleaved round by round so that
 * the machine's load weighs on both alike.
 *
 * A micro-batch of N tokens of width C is routed uniformly at random (a
 * fixed seed) to K of E experts; the expert rows come from
 * mc_k_moe_permute_map as in training. Timed per round:
 *   gemm: the four grouped GEMM calls of one forward and backward
 *         (fc1 C -> R1, fc2 F -> C; R1 = 2F with SwiGLU), 6 R (C R1 + F C)
 *         FLOPs with R = N K rows;
 *   perm: permute + unpermute and their backwards;
 *   peak: mc_k_linear_fwd on [P, P] x [P, P] (2 P^3 FLOPs).
 * The weights are passed prepared (mc_k_prepare_weight, once, as the
 * optimizer prepares them once an iteration in training); the activations
 * and gradients are rounded by the calls, as in training.
 * Prints the medians (GFLOP/s, ms) and the efficiency gemm / peak.
 *
 *   grouped THREADS fp32|bf16 N C E K F SWIGLU(0|1) [ROUNDS] [P]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc/kern.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint32_t rng = 12345;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u; }

static float *randn(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "grouped: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = scale * ((float)(next() >> 8) / 16777216.0f - 0.5f);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 9) {
        fprintf(stderr, "usage: %s THREADS fp32|bf16 N C E K F SWIGLU [ROUNDS] [P]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    mc_prec prec = strcmp(argv[2], "bf16") ? MC_PREC_FP32 : MC_PREC_BF16;
    size_t N = (size_t)atol(argv[3]), C = (size_t)atol(argv[4]), E = (size_t)atol(argv[5]),
           K = (size_t)atol(argv[6]), F = (size_t)atol(argv[7]);
    int swiglu = atoi(argv[8]), rounds = argc > 9 ? atoi(argv[9]) : 5;
    size_t P = argc > 10 ? (size_t)atol(argv[10]) : 2048;
    if (!threads || !N || !C || !E || !K || K > E || E > MC_MOE_MAX_EXPERTS || !F || rounds < 1 ||
        rounds > 100 || !P) {
        fprintf(stderr, "grouped: bad arguments\n");
        return 2;
    }
    mc_backend *be;
    mc_error err;
    if (mc_backend_cpu_new(threads, &be, &err)) {
        fprintf(stderr, "grouped: %s\n", err.msg);
        return 1;
    }
    size_t R1 = (swiglu ? 2 : 1) * F, R = N * K;
    /* the routing: K distinct experts per token, uniformly at random */
    int32_t *idx = malloc(R * sizeof *idx), *perm = malloc(R * sizeof *perm),
            *counts = malloc(E * sizeof *counts);
    int64_t *rows = malloc(E * sizeof *rows);
    for (size_t t = 0; t < N; t++)
        for (size_t k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)((next() >> 12) % E);
                dup = 0;
                for (size_t j = 0; j < k; j++) dup |= idx[t * K + j] == e;
            } while (dup);
            idx[t * K + k] = e;
        }
    mc_k_moe_permute_map(be, perm, counts, idx, N, E, K, 0);
    size_t rmin = R, rmax = 0;
    for (size_t e = 0; e < E; e++) {
        rows[e] = counts[e];
        rmin = (size_t)counts[e] < rmin ? (size_t)counts[e] : rmin;
        rmax = (size_t)counts[e] > rmax ? (size_t)counts[e] : rmax;
    }
    float *x = randn(N * C, 2), *probs = randn(R, 1), *xp = randn(R * C, 1),
          *W1 = randn(E * R1 * C, 0.05f), *W2 = randn(E * C * F, 0.05f), *u = randn(R * R1, 1),
          *a = randn(R * F, 1), *yp = randn(R * C, 1), *y = randn(N * C, 1),
          *dy = randn(N * C, 1), *dyp = randn(R * C, 1), *dprobs = randn(R, 1),
          *da = randn(R * F, 1), *du = randn(R * R1, 1), *dxp = randn(R * C, 1),
          *dx = randn(N * C, 1), *dW1 = randn(E * R1 * C, 1), *dW2 = randn(E * C * F, 1),
          *pa = randn(P * P, 1), *pb = randn(P * P, 1), *pc = randn(P * P, 1);
    /* the weights in the form the GEMMs multiply, made once as training's
     * optimizer does for each iteration (NULL for fp32) */
    size_t wb = mc_backend_weight_bytes(be, prec);
    void *W1p = wb ? malloc(E * R1 * C * wb) : NULL, *W2p = wb ? malloc(E * C * F * wb) : NULL,
         *pbp = wb ? malloc(P * P * wb) : NULL;
    if (wb && (!W1p || !W2p || !pbp)) {
        fprintf(stderr, "grouped: out of memory\n");
        return 1;
    }
    if (wb) {
        mc_k_prepare_weight(be, prec, W1p, W1, E * R1 * C, 0);
        mc_k_prepare_weight(be, prec, W2p, W2, E * C * F, 0);
        mc_k_prepare_weight(be, prec, pbp, pb, P * P, P);
    }
    double *tg = malloc((size_t)rounds * sizeof *tg), *tp = malloc((size_t)rounds * sizeof *tp),
           *tk = malloc((size_t)rounds * sizeof *tk);
    for (int r = -1; r < rounds; r++) { /* round -1: warm-up */
        double t0 = now();
        mc_k_linear_fwd(be, prec, pc, pa, pb, pbp, NULL, P, P, P, 0.0f, 0);
        double t1 = now();
        mc_k_grouped_linear_fwd(be, prec, u, xp, W1, W1p, NULL, rows, E, C, R1);
        mc_k_grouped_linear_fwd(be, prec, yp, a, W2, W2p, NULL, rows, E, F, C);
        mc_k_grouped_linear_bwd(be, prec, da, dW2, NULL, dyp, a, W2, W2p, rows, E, F, C);
        mc_k_grouped_linear_bwd(be, prec, dxp, dW1, NULL, du, xp, W1, W1p, rows, E, C, R1);
        double t2 = now();
        mc_k_moe_permute(be, xp, x, perm, N, K, C);
        mc_k_moe_unpermute(be, y, yp, probs, perm, N, K, C);
        mc_k_moe_unpermute_bwd(be, dyp, dprobs, dy, yp, probs, perm, N, K, C);
        mc_k_moe_permute_bwd(be, dx, dxp, perm, N, K, C);
        double t3 = now();
        if (r >= 0) tp[r] = t1 - t0, tg[r] = t2 - t1, tk[r] = t3 - t2;
    }
    double fl_g = 6.0 * (double)R * ((double)C * (double)R1 + (double)F * (double)C),
           fl_p = 2.0 * (double)P * (double)P * (double)P;
    double g = fl_g / median(tg, rounds) / 1e9, p = fl_p / median(tp, rounds) / 1e9;
    printf("grouped %s threads=%d N=%zu C=%zu E=%zu K=%zu F=%zu swiglu=%d rows/expert %zu..%zu:"
           " gemm %.1f GFLOP/s (%.2f ms fwd+bwd), peak %zu^3 %.1f GFLOP/s, efficiency %.1f%%;"
           " permute+unpermute fwd+bwd %.2f ms\n",
           argv[2], threads, N, C, E, K, F, swiglu, rmin, rmax, g, 1e3 * median(tg, rounds), P,
           p, 100.0 * g / p, 1e3 * median(tk, rounds));
    mc_backend_free(be);
    return 0;
}
