/*
 * elementwise.c - CPU kernels that treat a tensor as a flat array: fill,
 * scale, add, accumulate, the reductions the trainer needs on the host
 * (sum of squares for the gradient norm, finiteness, mean), and rounding /
 * conversion to bf16 and fp16. The streaming loops are compiled for each
 * code path (isa.h) and give the same bits on every path.
 *
 * Reductions are split into fixed chunks of REDUCE_CHUNK elements whatever
 * the thread count; each chunk is summed in a fixed order (chunk_sum) and
 * the chunk sums are added in order, so the result is the same bits for any
 * thread count.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define REDUCE_CHUNK ((size_t)1 << 15)
#define PAR_MIN ((size_t)1 << 14) /* below this, threads cost more than they save */
#define SPAN ((size_t)4096)       /* elements per parallel work item */

/* The streaming kernels run in spans of SPAN elements, each span a function
 * compiled for every path (isa.h): at -O2 GCC vectorizes a loop of unknown
 * length only when told (omp simd), and only for the path's width when
 * compiled for it. */
// clang-format off
#define FOR_SPANS(be, n, i0, m, body)                                                      \
    do {                                                                                   \
        size_t nspan_ = ((n) + SPAN - 1) / SPAN;                                           \
        _Pragma("omp parallel for num_threads(be->threads) if (nspan_ > 4) schedule(static)") \
        for (size_t s_ = 0; s_ < nspan_; s_++) {                                           \
            size_t i0 = s_ * SPAN, m = (n) - i0 < SPAN ? (n) - i0 : SPAN;                  \
            body;                                                                          \
        }                                                                                  \
    } while (0)
// clang-format on

MC_ISA_BODY void fill_span_body(float *restrict x, float v, size_t n, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) x[i] = v;
}
MC_ISA_VARIANTS_VOID(fill_span, (float *restrict x, float v, size_t n), (x, v, n))

MC_ISA_BODY void scale_span_body(float *restrict x, float a, size_t n, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) x[i] *= a;
}
MC_ISA_VARIANTS_VOID(scale_span, (float *restrict x, float a, size_t n), (x, a, n))

/* out = a + b; out may be a or b (so no restrict: the loop is elementwise) */
MC_ISA_BODY void add_span_body(float *out, const float *a, const float *b, size_t n,
                               int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
MC_ISA_VARIANTS_VOID(add_span, (float *out, const float *a, const float *b, size_t n),
                     (out, a, b, n))

void mc_cpu_fill(mc_backend *be, float *x, float v, size_t n)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if (bits == 0) {
        /* +0.0 is all zero bytes (zeroing gradients): memset, in one piece
         * a thread, so that glibc's non-temporal stores (large sizes) write
         * without first reading every line */
        int nt = n > PAR_MIN ? be->threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int t = 0; t < nt; t++) {
            size_t lo = n * (size_t)t / (size_t)nt, hi = n * (size_t)(t + 1) / (size_t)nt;
            memset(x + lo, 0, (hi - lo) * sizeof *x);
        }
        return;
    }
    fill_span_fn f = fill_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(x + i0, v, m));
}

void mc_cpu_scale(mc_backend *be, float *x, float s, size_t n)
{
    scale_span_fn f = scale_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(x + i0, s, m));
}

void mc_cpu_add(mc_backend *be, float *out, const float *a, const float *b, size_t n)
{
    add_span_fn f = add_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(out + i0, a + i0, b + i0, m));
}

void mc_cpu_acc(mc_backend *be, float *acc, const float *x, size_t n)
{
    add_span_fn f = add_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(acc + i0, acc + i0, x + i0, m));
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

/* mc_f32_to_bf16's bits (nearest even; a NaN keeps its upper bits and
 * becomes quiet) in a branch-free form the vectorizer takes, so every path
 * gives the same bits as the scalar conversion. */
static inline uint32_t bf16_bits(uint32_t x)
{
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, quiet = (x >> 16) | 0x40u;
    return (int32_t)(x & 0x7fffffffu) > 0x7f800000 ? quiet : r;
}

/* dst = round_prec(src) as fp32 (dst may be src) */
MC_ISA_BODY void round_span_body(float *dst, const float *src, size_t n, mc_prec prec,
                                 int isa MC_ISA_UNUSED)
{
    if (prec == MC_PREC_BF16) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &src[i], 4);
            u = bf16_bits(u) << 16;
            memcpy(&dst[i], &u, 4);
        }
    } else if (prec == MC_PREC_TF32) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = mc_round_tf32(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = mc_round_prec(src[i], prec);
    }
}
MC_ISA_VARIANTS_VOID(round_span, (float *dst, const float *src, size_t n, mc_prec prec),
                     (dst, src, n, prec))

void mc_cpu_round_into(mc_backend *be, float *dst, const float *src, size_t n, mc_prec prec)
{
    if (prec == MC_PREC_FP32) {
        if (dst != src) memcpy(dst, src, n * sizeof(float));
        return;
    }
    round_span_fn f = round_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(dst + i0, src + i0, m, prec));
}

void mc_cpu_round_here(const mc_backend *be, float *x, size_t n, mc_prec prec)
{
    if (prec != MC_PREC_FP32) round_span_for(be->isa)(x, x, n, prec);
}

void mc_cpu_round(mc_backend *be, float *x, size_t n, mc_prec prec)
{
    mc_cpu_round_into(be, x, x, n, prec);
}

MC_ISA_BODY void bf16_span_body(uint16_t *restrict dst, const float *restrict src, size_t n,
                                int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        dst[i] = (uint16_t)bf16_bits(u);
    }
}
MC_ISA_VARIANTS_VOID(bf16_span, (uint16_t *restrict dst, const float *restrict src, size_t n),
                     (dst, src, n))

void mc_cpu_prepare_here(const mc_backend *be, mc_prec prec, void *out, const float *W, size_t n)
{
    if (prec == MC_PREC_BF16 && be->dnnl_bf16)
        bf16_span_for(be->isa)(out, W, n);
    else
        round_span_for(be->isa)(out, W, n, prec);
}

/* The weights' bf16 form written with non-temporal stores. A whole model's
 * copy is far larger than the caches and is not read again before the next
 * forward pass, so storing past the cache saves the read of every line that
 * an ordinary store does first (a quarter to a third of the traffic). The bits
 * are bf16_bits's: the integer steps below are the same expression. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#include "kern/cpu/bf16v.h"
#define MC_HAVE_NT_PREPARE 1

MC_TARGET_AVX512 static __m512i bf16_bits16(__m512i u)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, quiet);
}


/* n elements from dst's first 64-byte boundary on: the scalar head and tail
 * go through bf16_bits */
static size_t nt_head(const void *dst, size_t es, size_t n)
{
    size_t mis = (uintptr_t)dst % 64, h = mis ? (64 - mis) / es : 0;
    return (uintptr_t)dst % es ? n : h < n ? h : n; /* unaligned elements: all scalar */
}

MC_TARGET_AVX512 static void round_bf16_nt_avx512(float *dst, const float *src, size_t n)
{
    size_t i = nt_head(dst, 4, n);
    round_span_baseline(dst, src, i, MC_PREC_BF16);
    for (; i + 16 <= n; i += 16) {
        __m512i b = bf16_bits16(_mm512_loadu_si512(src + i));
        _mm512_stream_si512((void *)(dst + i), _mm512_slli_epi32(b, 16));
    }
    round_span_baseline(dst + i, src + i, n - i, MC_PREC_BF16);
    _mm_sfence();
}

MC_TARGET_AVX512 static void bf16_nt_avx512(uint16_t *dst, const float *src, size_t n)
{
    size_t i = nt_head(dst, 2, n);
    bf16_span_baseline(dst, src, i);
    for (; i + 32 <= n; i += 32) {
        __m256i lo = _mm512_cvtepi32_epi16(bf16_bits16(_mm512_loadu_si512(src + i)));
        __m256i hi = _mm512_cvtepi32_epi16(bf16_bits16(_mm512_loadu_si512(src + i + 16)));
        _mm512_stream_si512((void *)(dst + i),
                            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    bf16_span_baseline(dst + i, src + i, n - i);
    _mm_sfence();
}

MC_TARGET_AVX2 static void round_bf16_nt_avx2(float *dst, const float *src, size_t n)
{
    size_t i = nt_head(dst, 4, n);
    round_span_baseline(dst, src, i, MC_PREC_BF16);
    for (; i + 8 <= n; i += 8) {
        __m256i b = mc_bf16_bits8(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm256_stream_si256((__m256i *)(dst + i), _mm256_slli_epi32(b, 16));
    }
    round_span_baseline(dst + i, src + i, n - i, MC_PREC_BF16);
    _mm_sfence();
}
#endif

void mc_cpu_prepare_part(const mc_backend *be, mc_prec prec, void *out, const float *W, size_t n,
                         size_t whole)
{
#ifdef MC_HAVE_NT_PREPARE
    if (whole >= MC_CPU_STREAM_MIN && prec == MC_PREC_BF16 && be->isa >= MC_ISA_AVX512) {
        if (be->dnnl_bf16)
            bf16_nt_avx512(out, W, n);
        else
            round_bf16_nt_avx512(out, W, n);
        return;
    }
    if (whole >= MC_CPU_STREAM_MIN && prec == MC_PREC_BF16 && be->isa >= MC_ISA_AVX2 &&
        !be->dnnl_bf16) {
        round_bf16_nt_avx2(out, W, n);
        return;
    }
#else
    (void)whole;
#endif
    mc_cpu_prepare_here(be, prec, out, W, n);
}

/* the same over threads (kern_ops.def prepare_weight) */
void mc_cpu_prepare_weight(mc_backend *be, mc_prec prec, void *out, const float *W, size_t n,
                           size_t cols)
{
    assert(prec != MC_PREC_FP32);
    if (cols && mc_cpu_b16_panels(be, prec)) {
        assert(n % cols == 0);
        size_t O = n / cols, nb = (O + 15) / 16;
        int nt = mc_cpu_b16_stream(out, O, cols);
#pragma omp parallel for num_threads(be->threads) if (n > 65536) schedule(static)
        for (size_t b = 0; b < nb; b++) mc_cpu_b16_pack_rows(out, W, b * 16, O, cols, nt);
        return;
    }
    size_t es = mc_backend_weight_bytes(be, prec);
    FOR_SPANS(be, n, i0, m, mc_cpu_prepare_part(be, prec, (char *)out + i0 * es, W + i0, m, n));
}

MC_ISA_BODY void from_bf16_span_body(float *restrict dst, const uint16_t *restrict src, size_t n,
                                     int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}
MC_ISA_VARIANTS_VOID(from_bf16_span, (float *restrict dst, const uint16_t *restrict src, size_t n),
                     (dst, src, n))

void mc_cpu_cast_to_bf16(mc_backend *be, uint16_t *out, const float *x, size_t n)
{
    bf16_span_fn f = bf16_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(out + i0, x + i0, m));
}

void mc_cpu_cast_from_bf16(mc_backend *be, float *out, const uint16_t *x, size_t n)
{
    from_bf16_span_fn f = from_bf16_span_for(be->isa);
    FOR_SPANS(be, n, i0, m, f(out + i0, x + i0, m));
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
