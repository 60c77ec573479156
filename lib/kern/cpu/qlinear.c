/*
 * qlinear.c - weight-only int8 linear layers for inference (mc-eval's
 * generation and perplexity on int8 weights): W is stored as int8 codes
 * with one fp32 scale per output row (the "int8" quantization of
 * mc-formats(5): scale = absmax / 127, code = round-half-even(w / scale)),
 * activations stay fp32 and products accumulate in fp32.
 */
#include <assert.h>
#include <math.h>
#include <immintrin.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define Q8_DIRECT_ROWS 8
#ifndef Q8_PREFETCH
#define Q8_PREFETCH 4096 /* bytes of codes fetched ahead in generation */
#endif

void mc_cpu_quantize_q8_rows(mc_backend *be, int8_t *Wq, float *scale, const float *W, size_t rows,
                             size_t cols)
{
#pragma omp parallel for num_threads(be->threads) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float *w = W + r * cols;
        float amax = 0;
        for (size_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(w[c]));
        float s = amax / 127.0f;
        scale[r] = s;
        for (size_t c = 0; c < cols; c++) {
            float q = s > 0 ? nearbyintf(w[c] / s) : 0.0f;
            Wq[r * cols + c] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

/* dot of x[0..n) with the codes q[0..n), one row at a time for m rows of x */
__attribute__((target("avx512f,avx512bw"))) static void
dots_avx512(float *acc, const float *x, size_t ldx, size_t m, const int8_t *q, size_t n)
{
    __m512 s[Q8_DIRECT_ROWS];
    for (size_t i = 0; i < m; i++) s[i] = _mm512_setzero_ps();
    size_t c = 0;
    if (m == 1) {
        /* one input row (generation): four independent sums, so the loop
         * is not bound by the latency of one chain of FMAs */
        __m512 s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
        for (; c + 64 <= n; c += 64) {
            _mm_prefetch((const char *)(q + c + Q8_PREFETCH), _MM_HINT_T0);
            __m512 w0 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + c))));
            __m512 w1 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + c + 16))));
            __m512 w2 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + c + 32))));
            __m512 w3 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + c + 48))));
            s[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + c), s[0]);
            s1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + c + 16), s1);
            s2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x + c + 32), s2);
            s3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + c + 48), s3);
        }
        s[0] = _mm512_add_ps(_mm512_add_ps(s[0], s1), _mm512_add_ps(s2, s3));
    }
    for (; c + 16 <= n; c += 16) {
        __m512 w = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + c))));
        for (size_t i = 0; i < m; i++)
            s[i] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + i * ldx + c), s[i]);
    }
    for (size_t i = 0; i < m; i++) {
        float t = _mm512_reduce_add_ps(s[i]);
        for (size_t k = c; k < n; k++) t += x[i * ldx + k] * (float)q[k];
        acc[i] = t;
    }
}

__attribute__((target("avx2,fma"))) static void dots_avx2(float *acc, const float *x, size_t ldx,
                                                          size_t m, const int8_t *q, size_t n)
{
    __m256 s[Q8_DIRECT_ROWS];
    for (size_t i = 0; i < m; i++) s[i] = _mm256_setzero_ps();
    size_t c = 0;
    if (m == 1) {
        /* one input row (generation): four independent sums, as above */
        __m256 s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
        for (; c + 32 <= n; c += 32) {
            /* the rows are contiguous: fetch ahead into the next row */
            _mm_prefetch((const char *)(q + c + Q8_PREFETCH), _MM_HINT_T0);
            __m256 w0 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c))));
            __m256 w1 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c + 8))));
            __m256 w2 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c + 16))));
            __m256 w3 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c + 24))));
            s[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + c), s[0]);
            s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + c + 8), s1);
            s2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + c + 16), s2);
            s3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + c + 24), s3);
        }
        s[0] = _mm256_add_ps(_mm256_add_ps(s[0], s1), _mm256_add_ps(s2, s3));
    }
    for (; c + 8 <= n; c += 8) {
        __m256 w = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c))));
        for (size_t i = 0; i < m; i++)
            s[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i * ldx + c), s[i]);
    }
    for (size_t i = 0; i < m; i++) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s[i]), _mm256_extractf128_ps(s[i], 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        float t = _mm_cvtss_f32(h);
        for (size_t k = c; k < n; k++) t += x[i * ldx + k] * (float)q[k];
        acc[i] = t;
    }
}

static void dots_scalar(float *acc, const float *x, size_t ldx, size_t m, const int8_t *q, size_t n)
{
    for (size_t i = 0; i < m; i++) {
        float t = 0;
        for (size_t k = 0; k < n; k++) t += x[i * ldx + k] * (float)q[k];
        acc[i] = t;
    }
}

typedef void (*dots_fn)(float *, const float *, size_t, size_t, const int8_t *, size_t);

/* the backend's path (isa.h): x86-64-v4 has AVX-512 F/BW, v3 AVX2 and FMA */
static dots_fn pick_dots(const mc_backend *be)
{
    return be->isa == MC_ISA_AVX512 ? dots_avx512
           : be->isa == MC_ISA_AVX2 ? dots_avx2
                                    : dots_scalar;
}

/*   out[n, r] = beta * out[n, r] + scale[r] * sum_c x[n, c] * Wq[r, c] + b[r]
 *
 * Generation reads every weight once per token, so its speed is memory
 * bandwidth: int8 codes move a quarter of fp32's bytes. For a few rows
 * (N <= Q8_DIRECT_ROWS) each weight row is loaded once and dotted with
 * every input row, the codes widened to fp32 in registers (AVX-512 or AVX2
 * chosen at run time, a scalar loop elsewhere). Beyond that the product is
 * compute-bound: the weights are widened into fp32 scratch and the fp32
 * linear kernel (BLAS) does the GEMM. Deterministic: each output is one
 * fixed-order sum for a path (isa.h); the paths sum in different orders
 * (vector widths), so their results differ in the last bits. */
void mc_cpu_linear_q8_fwd(mc_backend *be, float *out, const float *x, const int8_t *Wq,
                          const float *scale, const float *b, size_t N, size_t Cin, size_t Cout,
                          float beta)
{
    assert(beta == 0.0f || beta == 1.0f);
    if (N > Q8_DIRECT_ROWS) {
        /* Compute-bound: widen the weights and let BLAS do the GEMM. */
        float *W = mc_cpu_scratch(be, MC_CPU_SCRATCH_GEMM_B, Cout * Cin * sizeof(float));
#pragma omp parallel for num_threads(be->threads) schedule(static)
        for (size_t r = 0; r < Cout; r++)
            for (size_t c = 0; c < Cin; c++) W[r * Cin + c] = (float)Wq[r * Cin + c] * scale[r];
        mc_cpu_linear_fwd(be, MC_PREC_FP32, out, x, W, NULL, b, N, Cin, Cout, beta, 0);
        return;
    }
    dots_fn dots = pick_dots(be);
#pragma omp parallel for num_threads(be->threads) schedule(static)
    for (size_t r = 0; r < Cout; r++) {
        float acc[Q8_DIRECT_ROWS];
        dots(acc, x, Cin, N, Wq + r * Cin, Cin);
        for (size_t n = 0; n < N; n++) {
            float v = acc[n] * scale[r] + (b ? b[r] : 0.0f);
            out[n * Cout + r] = beta != 0.0f ? out[n * Cout + r] + v : v;
        }
    }
}
