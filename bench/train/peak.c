/*
 * bench/train/peak.c - the machine's GEMM peak for the benchmark's MFU: a
 * large fp32 GEMM through OpenBLAS (cblas_sgemm) and a large bf16 GEMM with
 * fp32 accumulation through oneDNN (dnnl_gemm_bf16bf16f32, the call mc's
 * bf16 linear layers use). Threads come from the environment
 * (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS). Each GEMM runs once to warm up,
 * then REPS times; prints the median GFLOP/s = 2*N^3 / seconds / 1e9.
 * Usage: peak sgemm|bf16 [N] [REPS]
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dnnl_bf16.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "sgemm") && strcmp(argv[1], "bf16"))) {
        fprintf(stderr, "usage: %s sgemm|bf16 [N] [REPS]\n", argv[0]);
        return 2;
    }
    int bf16 = !strcmp(argv[1], "bf16");
    long n = argc > 2 ? atol(argv[2]) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (n <= 0 || reps <= 0 || reps > 100) {
        fprintf(stderr, "peak: bad N or REPS\n");
        return 2;
    }
    float *a = malloc(n * n * sizeof *a), *b = malloc(n * n * sizeof *b),
          *c = malloc(n * n * sizeof *c);
    uint16_t *ah = malloc(n * n * sizeof *ah), *bh = malloc(n * n * sizeof *bh);
    if (!a || !b || !c || !ah || !bh) {
        fprintf(stderr, "peak: out of memory\n");
        return 1;
    }
    /* Values in [-0.5, 0.5); bf16 is the top half of the fp32 bits. */
    uint32_t s = 12345;
    for (long i = 0; i < n * n; i++) {
        s = s * 1664525u + 1013904223u;
        a[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
        s = s * 1664525u + 1013904223u;
        b[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
        uint32_t u;
        memcpy(&u, &a[i], 4);
        ah[i] = (uint16_t)(u >> 16);
        memcpy(&u, &b[i], 4);
        bh[i] = (uint16_t)(u >> 16);
    }
    double t[101];
    for (int r = 0; r <= reps; r++) {
        double t0 = now();
        if (bf16) {
            if (dnnl_gemm_bf16bf16f32('N', 'N', n, n, n, 1.0f, ah, n, bh, n, 0.0f, c, n) !=
                dnnl_success) {
                fprintf(stderr, "peak: dnnl_gemm_bf16bf16f32 failed\n");
                return 1;
            }
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
        }
        t[r] = now() - t0;
    }
    qsort(t + 1, reps, sizeof *t, cmp);
    double med = t[1 + reps / 2];
    printf("%s N=%ld median of %d: %.1f GFLOP/s (%.3f s)\n", argv[1], n, reps,
           2.0 * n * n * n / med / 1e9, med);
    free(a), free(b), free(c), free(ah), free(bh);
    return 0;
}
