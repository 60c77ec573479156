/*
 * bench/avx2/fma_peak.c - the AVX2 FMA ceiling of this machine: every
 * thread runs 12 independent chains of 256-bit fused multiply-adds held in
 * registers (no loads, no stores), enough to cover the FMA latency on every
 * x86 core with two FMA pipes. An sgemm can approach this rate, never pass
 * it; bench/avx2/gemm_calls.sh prints OpenBLAS's rate against it.
 * Threads: OMP_NUM_THREADS. Prints the best of 5 runs in GFLOP/s.
 * Usage: fma_peak [ITERATIONS] (default 1e8 per thread and run)
 * Built by bench/avx2/gemm_calls.sh (-O2 -fopenmp). Not part of mc.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define CHAIN(i) a##i = _mm256_fmadd_ps(a##i, x, y)

__attribute__((target("avx2,fma"))) static float chains(long n)
{
    __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
    __m256 a0 = _mm256_set1_ps(0.0f), a1 = _mm256_set1_ps(1.0f), a2 = _mm256_set1_ps(2.0f),
           a3 = _mm256_set1_ps(3.0f), a4 = _mm256_set1_ps(4.0f), a5 = _mm256_set1_ps(5.0f),
           a6 = _mm256_set1_ps(6.0f), a7 = _mm256_set1_ps(7.0f), a8 = _mm256_set1_ps(8.0f),
           a9 = _mm256_set1_ps(9.0f), a10 = _mm256_set1_ps(10.0f), a11 = _mm256_set1_ps(11.0f);
    for (long k = 0; k < n; k++) {
        CHAIN(0), CHAIN(1), CHAIN(2), CHAIN(3), CHAIN(4), CHAIN(5);
        CHAIN(6), CHAIN(7), CHAIN(8), CHAIN(9), CHAIN(10), CHAIN(11);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float f[8];
    _mm256_storeu_ps(f, s);
    return f[0];
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000000L;
    if (n <= 0) {
        fprintf(stderr, "fma_peak: bad ITERATIONS\n");
        return 2;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "fma_peak: this CPU has no AVX2 and FMA\n");
        return 1;
    }
    int threads = omp_get_max_threads();
    double best = 0.0;
    float sink = 0.0f;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        float s = 0.0f;
#pragma omp parallel reduction(+ : s)
        s += chains(n);
        double g = 2.0 * 8 * 12 * (double)n * threads / (now() - t0) / 1e9;
        sink += s;
        if (g > best) best = g;
    }
    printf("AVX2 FMA peak, %d threads: %.1f GFLOP/s (best of 5; %g)\n", threads, best, sink);
    return 0;
}
