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
#include <math.h>
#include <stdlib.h>
#include "kern/cpu/cpu.h"

#define REDUCE_CHUNK ((size_t)1 << 15)
#define PAR_MIN ((size_t)1 << 14) /* below this, threads cost more than they save */

void mc_cpu_fill(mc_backend *be, float *x, float v, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = v;
}

void mc_cpu_scale(mc_backend *be, float *x, float s, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void mc_cpu_add(mc_backend *be, float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void mc_cpu_acc(mc_backend *be, float *acc, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

/* One chunk's sum of x (square = 0) or x^2 (square = 1) in double. LANES
 * independent accumulators, lane j taking the elements lo + j, lo + j +
 * LANES, ..., then added in lane order: a fixed order (so the same bits on
 * every CPU and thread count) that the compiler can keep in vector
 * registers, where a single running sum waits on each add's latency. */
#define LANES 16
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) static double
chunk_sum(const float *x, size_t n, int square) {
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

/* sum_i f(x_i) in double: chunk sums in parallel, then the chunks in order. */
static double chunked_sum(mc_backend *be, const float *x, size_t n, int square) {
    size_t nch = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    if (nch == 0) return 0.0;
    double *part = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, nch * sizeof(double));
#pragma omp parallel for num_threads(be->threads) if (nch > 1) schedule(static)
    for (size_t c = 0; c < nch; c++) {
        size_t lo = c * REDUCE_CHUNK, hi = lo + REDUCE_CHUNK < n ? lo + REDUCE_CHUNK : n;
        part[c] = chunk_sum(x + lo, hi - lo, square);
    }
    double s = 0.0;
    for (size_t c = 0; c < nch; c++) s += part[c];
    return s;
}

double mc_cpu_sumsq(mc_backend *be, const float *x, size_t n) { return chunked_sum(be, x, n, 1); }

double mc_cpu_mean(mc_backend *be, const float *x, size_t n) {
    return n ? chunked_sum(be, x, n, 0) / (double)n : 0.0;
}

int mc_cpu_all_finite(mc_backend *be, const float *x, size_t n) {
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

void mc_cpu_round(mc_backend *be, float *x, size_t n, mc_prec prec) {
    if (prec == MC_PREC_FP32) return;
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = mc_round_prec(x[i], prec);
}

void mc_cpu_cast_to_bf16(mc_backend *be, uint16_t *out, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_f32_to_bf16(x[i]);
}

void mc_cpu_cast_from_bf16(mc_backend *be, float *out, const uint16_t *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_bf16_to_f32(x[i]);
}

void mc_cpu_cast_to_fp16(mc_backend *be, uint16_t *out, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_f32_to_fp16(x[i]);
}

void mc_cpu_cast_from_fp16(mc_backend *be, float *out, const uint16_t *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = mc_fp16_to_f32(x[i]);
}
