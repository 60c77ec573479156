/*
 * elementwise.c - CPU kernels that treat a tensor as a flat array: fill,
 * scale, add, accumulate, the reductions the trainer needs on the host
 * (sum of squares for the gradient norm, finiteness, mean), and rounding /
 * conversion to bf16 and fp16.
 *
 * Reductions are split into fixed chunks of REDUCE_CHUNK elements whatever
 * the thread count; each chunk is summed in a fixed order (chunk_sum) and
 * the chunk sums are added in order, so the result is the same bits for any
 * thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define REDUCE_CHUNK ((size_t)1 << 15)
#define PAR_MIN ((size_t)1 << 14) /* below this, threads cost more than they save */

void mc_cpu_fill(mc_backend *be, float *x, float v, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = v;
}

void mc_cpu_scale(mc_backend *be, float *x, float s, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void mc_cpu_add(mc_backend *be, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void mc_cpu_acc(mc_backend *be, float *acc, const float *x, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

/* One chunk's sum of x (square = 0) or x^2 (square = 1) in double. LANES
 * independent accumulators, lane j taking the elements lo + j, lo + j +
 * LANES, ..., then added in lane order: a fixed order (so the same bits on
 * every CPU and thread count) that the compiler can keep in vector
 * registers, where a single running sum waits on each add's latency. */
#define LANES 16
MC_ISA_BODY double chunk_sum_body(const float *x, size_t n, int square, int isa MC_ISA_UNUSED)
{
    double acc[LANES] = {0};
    size_t i = 0;
    if (square)
        for (; i + LANES <= n; i += LANES)
#pragma omp simd
            for (size_t j = 0; j < LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    else
        for (; i + LANES <= n; i += LANES)
#pragma omp simd
            for (size_t j = 0; j < LANES; j++) acc[j] += (double)x[i + j];
    for (size_t j = 0; i < n; i++, j++) acc[j] += square ? (double)x[i] * (double)x[i] : x[i];
    double s = 0.0;
    for (size_t j = 0; j < LANES; j++) s += acc[j];
    return s;
}
MC_ISA_VARIANTS(double, chunk_sum, (const float *x, size_t n, int square), (x, n, square))

/* sum_i f(x_i) in double: chunk sums in parallel, then the chunks in order. */
static double chunked_sum(mc_backend *be, const float *x, size_t n, int square)
{
    size_t nch = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    if (nch == 0) return 0.0;
    double *part = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, nch * sizeof(double));
#pragma omp parallel for num_threads(be->threads) if (nch > 1) schedule(static)
    for (size_t c = 0; c < nch; c++) {
        size_t lo = c * REDUCE_CHUNK, hi = lo + REDUCE_CHUNK < n ? lo + REDUCE_CHUNK : n;
        part[c] = chunk_sum_for(be->isa)(x + lo, hi - lo, square);
    }
    double s = 0.0;
    for (size_t c = 0; c < nch; c++) s += part[c];
    return s;
}

double mc_cpu_sumsq(mc_backend *be, const float *x, size_t n) { return chunked_sum(be, x, n, 1); }

double mc_cpu_mean(mc_backend *be, const float *x, size_t n)
{
    return n ? chunked_sum(be, x, n, 0) / (double)n : 0.0;
}

int mc_cpu_all_finite(mc_backend *be, const float *x, size_t n)
{
    /* an fp32 is finite iff its exponent bits are not all ones; counting the
     * non-finite ones is branch-free and order-independent */
    size_t bad = 0;
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) reduction(+ : bad)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        bad += (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad == 0;
}

void mc_cpu_round(mc_backend *be, float *x, size_t n, mc_prec prec)
{
    if (prec == MC_PREC_FP32) return;
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = mc_round_prec(x[i], prec);
}

/* dst[i] = bf16(src[i]) for i in [0, n): 16 at a time with AVX-512, the
 * same integer rounding as mc_f32_to_bf16 (nearest even; a NaN keeps its
 * upper bits and becomes quiet), so the bits do not depend on the path. */
__attribute__((target("avx512f,avx512bw"))) static void bf16_span_avx512(uint16_t *dst,
                                                                         const float *src, size_t n)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_loadu_si512((const void *)(src + i));
        __m512i r = _mm512_add_epi32(
            x, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(x, 16), one)));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs), inf);
        r = _mm512_mask_or_epi32(r, nan, _mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)),
                                 _mm512_slli_epi32(quiet, 16));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) dst[i] = mc_f32_to_bf16(src[i]);
}

static void bf16_span(uint16_t *dst, const float *src, size_t n)
{
    static int avx512 = -1;
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    }
    if (avx512) {
        bf16_span_avx512(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = mc_f32_to_bf16(src[i]);
}

void mc_cpu_cast_to_bf16(mc_backend *be, uint16_t *out, const float *x, size_t n)
{
    size_t nb = (n + 4095) / 4096;
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * 4096;
        bf16_span(out + i0, x + i0, n - i0 < 4096 ? n - i0 : 4096);
    }
}

void mc_cpu_cast_from_bf16(mc_backend *be, float *out, const uint16_t *x, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_bf16_to_f32(x[i]);
}

void mc_cpu_cast_to_fp16(mc_backend *be, uint16_t *out, const float *x, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_f32_to_fp16(x[i]);
}

void mc_cpu_cast_from_fp16(mc_backend *be, float *out, const uint16_t *x, size_t n)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_fp16_to_f32(x[i]);
}
