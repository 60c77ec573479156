/*
 * bench/avx2/bf16_panel.c - issue 18, section 2's first option measured: a
 * GEMM for emulated bf16 on AVX2 that keeps the weight as bf16 (half the
 * bytes of the rounded fp32 copy mc makes now) packed in 16-column panels
 * and widens it in registers, against OpenBLAS's sgemm on the same rounded
 * values. A spike, not part of mc: it covers the forward form only
 * (C = A B^T, B the weight [N, K] as mc stores it), has no tuning beyond
 * GotoBLAS's loop order and two block sizes (a 6 x 16 register tile,
 * KC = 512 deep, MC = 144 rows a block or all rows up to 264; threads
 * split the row blocks, or the columns where there are few rows), and
 * packs the weight once outside the timing, as the optimizer's update
 * would write it.
 *
 *   bf16_panel kernel         the 6 x 16 micro-kernel alone on L1-resident
 *                             panels: fp32 B against bf16 B widened
 *                             (vpmovzxwd + vpslld), best of 5
 *   bf16_panel gemm M N K     the whole GEMM against cblas_sgemm,
 *                             alternating 7 times, best of the last 6;
 *                             prints the largest difference (the sums run
 *                             in another order: about 1e-6 relative)
 *
 * Threads: OMP_NUM_THREADS (and OpenBLAS's). Built by hand:
 *   cc -O2 -fopenmp -o bf16_panel bench/avx2/bf16_panel.c \
 *      -I/usr/include/x86_64-linux-gnu/openblas-openmp -lopenblas
 */
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define KC 512 /* depth of a packed block */
#define MC 144 /* rows of a packed block (all of them up to MC_ALL) */
#define MC_ALL 264
#define KL 256 /* depth of the kernel mode's L1-resident panels */
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static uint16_t b16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float w16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The 6 x 16 register tile: c<row><half>, 12 ymm accumulators; a step is
 * one k: two 8-wide loads of B (B0, B1) against six broadcasts of A */
#define TILE_DECL __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51
#define TILE_ZERO \
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps()
#define TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TILE_LD(i) \
    c##i##0 = _mm256_loadu_ps(c + i * ldc), c##i##1 = _mm256_loadu_ps(c + i * ldc + 8);
#define TILE_ST(i) \
    _mm256_storeu_ps(c + i * ldc, c##i##0), _mm256_storeu_ps(c + i * ldc + 8, c##i##1);
#define TILE_FMA(i)                                \
    {                                              \
        __m256 x = _mm256_broadcast_ss(pa + i);    \
        c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0); \
        c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1); \
    }
/* 8 bf16 at p widened to fp32 in a register */
#define WIDEN(p)         \
    _mm256_castsi256_ps( \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))

/* C[6, 16] (row stride ldc) = (first ? 0 : C) + A panel pa [kc][6] x B
 * panel pb [kc][16] (bf16) */
__attribute__((target("avx2,fma"))) static inline void
kern(int kc, const float *pa, const uint16_t *pb, float *c, long ldc, int first)
{
    TILE_DECL;
    if (first)
        TILE_ZERO;
    else {
        TILE_ROWS(TILE_LD)
    }
    for (int k = 0; k < kc; k++, pa += 6, pb += 16) {
        __m256 b0 = WIDEN(pb), b1 = WIDEN(pb + 8);
        TILE_ROWS(TILE_FMA)
    }
    TILE_ROWS(TILE_ST)
}

/* Bp[(n/16)][K][16]: the weight W[N,K] (row n = output n) packed */
static void pack_b(uint16_t *Bp, const float *W, int N, int K)
{
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            Bp[((size_t)(n / 16) * K + k) * 16 + n % 16] = b16(W[(size_t)n * K + k]);
}

__attribute__((target("avx2,fma"))) static void gemm_nt(int M, int N, int K, const float *A,
                                                        const uint16_t *Bp, float *C)
{
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        /* few rows (an LM head chunk): one block of all of them, so each
         * thread streams its share of the weight once */
        int mcb = M <= MC_ALL ? M : MC;
        float *Ap = aligned_alloc(64, (size_t)(mcb + 6) * KC * 4), tmp[6 * 16];
        /* few row blocks: each thread takes a share of the columns instead */
        int bycol = M < 2 * nt * mcb;
        int j0 = 0, j1 = N;
        if (bycol) {
            int per = (N / 16 + nt - 1) / nt * 16;
            j0 = t * per;
            j1 = j0 + per < N ? j0 + per : N;
        }
        for (int ic = bycol ? 0 : t * mcb; ic < M; ic += bycol ? mcb : nt * mcb) {
            int mc = M - ic < mcb ? M - ic : mcb;
            for (int pc = 0; pc < K; pc += KC) {
                int kc = K - pc < KC ? K - pc : KC;
                /* A block into 6-row panels, zero rows past M */
                for (int ir = 0; ir < mc; ir += 6) {
                    float *p = Ap + (size_t)ir * kc;
                    for (int r = 0; r < 6; r++) {
                        const float *a = ir + r < mc ? A + (size_t)(ic + ir + r) * K + pc : NULL;
                        for (int k = 0; k < kc; k++) p[k * 6 + r] = a ? a[k] : 0.0f;
                    }
                }
                for (int jr = j0; jr < j1; jr += 16) {
                    const uint16_t *pb = Bp + ((size_t)(jr / 16) * K + pc) * 16;
                    for (int ir = 0; ir < mc; ir += 6) {
                        float *c = C + (size_t)(ic + ir) * N + jr;
                        if (ir + 6 <= mc)
                            kern(kc, Ap + (size_t)ir * kc, pb, c, N, pc == 0);
                        else {
                            int rows = mc - ir;
                            for (int r = 0; r < rows; r++)
                                memcpy(tmp + r * 16, c + (size_t)r * N, 64);
                            kern(kc, Ap + (size_t)ir * kc, pb, tmp, 16, pc == 0);
                            for (int r = 0; r < rows; r++)
                                memcpy(c + (size_t)r * N, tmp + r * 16, 64);
                        }
                    }
                }
            }
        }
        free(Ap);
    }
}

/* The kernel mode: reps passes of the tile over L1-resident panels of KL
 * steps, B as fp32 (k_f32) or as bf16 widened (k_b16); LOAD(p) gives 8
 * floats of B at p */
#define K_PASS(name, BT, LOAD)                                                                  \
    __attribute__((target("avx2,fma"), noinline)) static void name(const float *a, const BT *b, \
                                                                   float *c, long reps)         \
    {                                                                                           \
        const long ldc = 16;                                                                    \
        for (long r = 0; r < reps; r++) {                                                       \
            TILE_DECL;                                                                          \
            TILE_ROWS(TILE_LD)                                                                  \
            const float *pa = a;                                                                \
            const BT *pb = b;                                                                   \
            for (int k = 0; k < KL; k++, pa += 6, pb += 16) {                                   \
                __m256 b0 = LOAD(pb), b1 = LOAD(pb + 8);                                        \
                TILE_ROWS(TILE_FMA)                                                             \
            }                                                                                   \
            TILE_ROWS(TILE_ST)                                                                  \
        }                                                                                       \
    }
K_PASS(k_f32, float, _mm256_load_ps)
K_PASS(k_b16, uint16_t, WIDEN)
static int kernel_main(void)
{
    long reps = 200000;
    double best[2] = {0, 0};
    for (int round = 0; round < 5; round++)
        for (int w = 0; w < 2; w++) {
            double t0 = now();
#pragma omp parallel
            {
                float *a = aligned_alloc(64, 6 * KL * 4), *b = aligned_alloc(64, 16 * KL * 4),
                      *c = aligned_alloc(64, 96 * 4);
                uint16_t *bh = aligned_alloc(64, 16 * KL * 2);
                for (int i = 0; i < 6 * KL; i++) a[i] = 1e-3f * (i % 7);
                for (int i = 0; i < 16 * KL; i++) {
                    b[i] = 1e-3f * (i % 5);
                    uint32_t u;
                    memcpy(&u, &b[i], 4);
                    bh[i] = u >> 16;
                }
                memset(c, 0, 96 * 4);
                if (w)
                    k_b16(a, bh, c, reps);
                else
                    k_f32(a, b, c, reps);
                free(a), free(b), free(c), free(bh);
            }
            double g = 2.0 * 6 * 16 * KL * reps * omp_get_max_threads() / (now() - t0) / 1e9;
            if (g > best[w]) best[w] = g;
        }
    printf("in-L1 6x16 micro-kernel, %d threads: fp32 B %.1f GFLOP/s, bf16 B widened %.1f GFLOP/s "
           "(%.3f)\n",
           omp_get_max_threads(), best[0], best[1], best[1] / best[0]);
    return 0;
}
static int gemm_main(int M, int N, int K)
{
    float *A = malloc(4L * M * K), *W = malloc(4L * N * K), *Wr = malloc(4L * N * K),
          *C1 = malloc(4L * M * N), *C2 = malloc(4L * M * N);
    uint16_t *Bp = aligned_alloc(64, 2L * N * K);
    srand(3);
    for (long i = 0; i < (long)M * K; i++) A[i] = w16(b16(rand() / (float)RAND_MAX - 0.5f));
    for (long i = 0; i < (long)N * K; i++) {
        W[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.05f;
        Wr[i] = w16(b16(W[i]));
    }
    pack_b(Bp, W, N, K);
    double ts = 1e9, tp = 1e9;
    for (int r = 0; r < 7; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, A, K, Wr, K, 0, C1, N);
        double t1 = now();
        gemm_nt(M, N, K, A, Bp, C2);
        double t2 = now();
        if (r) {
            ts = t1 - t0 < ts ? t1 - t0 : ts;
            tp = t2 - t1 < tp ? t2 - t1 : tp;
        }
    }
    double err = 0;
    for (long i = 0; i < (long)M * N; i++) {
        double d = C1[i] - C2[i];
        if (d < 0) d = -d;
        if (d > err) err = d;
    }
    double fl = 2.0 * M * N * K;
    printf(
        "M=%d N=%d K=%d: sgemm %.1f GFLOP/s, bf16-panel %.1f GFLOP/s, ratio %.3f, max diff %.2e\n",
        M, N, K, fl / ts / 1e9, fl / tp / 1e9, ts / tp, err);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "kernel")) return kernel_main();
    if (argc == 5 && !strcmp(argv[1], "gemm")) {
        int M = atoi(argv[2]), N = atoi(argv[3]), K = atoi(argv[4]);
        if (M > 0 && N > 0 && K > 0 && N % 16 == 0) return gemm_main(M, N, K);
    }
    fprintf(stderr, "usage: bf16_panel kernel | bf16_panel gemm M N K (N a multiple of 16)\n");
    return 2;
}
