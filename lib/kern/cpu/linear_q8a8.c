/*
 * linear_q8a8.c - the int8 x int8 row-invariant linear of batched inference
 * (kern_ops.def mc_k_linear_q8a8_fwd): int8 weight codes with one scale per
 * output row, packed once (mc_k_pack_q8a8), times activations quantized
 * on the fly to int8 in blocks of 32 of their own row, multiplied as
 * integers (AVX-512 VNNI vpdpbusd; AVX2 vpmaddubsw/vpmaddwd; scalar C) and
 * the blocks' exact integer sums accumulated in float in block order.
 *
 * The arithmetic, the same on every path (so every path gives the same
 * bits, and a row's outputs never depend on the other rows, the number of
 * rows, the tiles or the threads):
 *
 *   activations, per row, per block b of QK = 32 positions (the last block
 *   zero-padded): amax = max |x|; d_b = amax / 127; codes
 *   q = rint(x * (127 / amax)) (round half to even), 0 where amax = 0; a
 *   block holding an infinity or a NaN has d_b = NaN (its row's outputs
 *   are NaN);
 *   s_b(o) = sum over the block of q * w(o) (exact, in int32);
 *   acc(o) = fma(d_b, (float)s_b(o), acc(o)) for b = 0, 1, ... (acc from 0);
 *   out(o) = acc(o) * scale(o), then + bias(o).
 *
 * The packed weights: panels of PANEL = 16 output rows (the last padded
 * with zero codes), each panel Kp = Cin rounded up to QK positions long
 * (zero codes past Cin); inside a panel, for each group of 4 positions
 * (k = 4 j .. 4 j + 3), 64 bytes: output o's 4 codes at bytes 4 o .. 4 o + 3,
 * each stored as code + 128 (an unsigned byte, what vpdpbusd multiplies).
 * The VNNI path multiplies those unsigned bytes by the signed activation
 * codes and starts each block's integer sum at -128 sum(q) (a per-row,
 * per-block constant computed with the codes); the AVX2 path flips the
 * bytes back to signed codes and uses the sign trick (|w| times q with w's
 * sign), never saturating since codes are within [-127, 127]; the scalar
 * path subtracts 128. All three give the exact s_b.
 *
 * Tiles: VNNI 4 rows x 2 panels (16 int32 and 16 float accumulators), one
 * row x 4 panels for a row alone (decoding one sequence: the weights
 * stream once); AVX2 2 rows x 1 panel, one row x 2 panels for a row alone (prefetched
 * PF_AHEAD bytes ahead); the scalar path a panel at a time.
 * The work is split in items of a few panels by chunks of 64 rows, items
 * shared among the threads (dynamic schedule); the tiles change which
 * elements are computed together, never an element's arithmetic.
 */
#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define QK 32         /* positions of an activation block */
#define PANEL 16      /* outputs of a packed panel */
#define CHUNK_ROWS 64 /* rows of a work item */
#define ITEM_PANELS 4 /* panels of a work item */
#define QUANT_SERIAL 8192 /* activations quantized by the calling thread alone */

#if defined(__GNUC__) && defined(__x86_64__)
#define MC_TARGET_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni")))
#else
#define MC_TARGET_VNNI
#endif

static size_t kpad(size_t cols) { return (cols + QK - 1) / QK * QK; }

size_t mc_k_q8a8_packed_bytes(size_t rows, size_t cols)
{
    return (rows + PANEL - 1) / PANEL * PANEL * kpad(cols);
}

void mc_cpu_pack_q8a8(mc_backend *be, uint8_t *Wp, const int8_t *Wq, size_t rows, size_t cols)
{
    size_t Kp = kpad(cols), panels = (rows + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(be->threads) schedule(static)
    for (size_t p = 0; p < panels; p++) {
        uint8_t *dst = Wp + p * PANEL * Kp;
        for (size_t j = 0; j < Kp / 4; j++)
            for (size_t o = 0; o < PANEL; o++)
                for (size_t t = 0; t < 4; t++) {
                    size_t r = p * PANEL + o, k = 4 * j + t;
                    int c = r < rows && k < cols ? Wq[r * cols + k] : 0;
                    dst[64 * j + 4 * o + t] = (uint8_t)(c + 128);
                }
    }
}

/* ------------------------------------------------ activation quantization */

/* one block's scale from its largest magnitude, and whether it is finite */
static inline float block_scale(float amax, int finite, float *inv)
{
    if (!finite) {
        *inv = 0.0f;
        return NAN;
    }
    if (amax == 0.0f) {
        *inv = 0.0f;
        return 0.0f;
    }
    *inv = 127.0f / amax;
    return amax / 127.0f;
}

static inline int32_t code_of(float v)
{
    int32_t c = _mm_cvtss_si32(_mm_set_ss(v)); /* round half to even (MXCSR's default) */
    return c > 127 ? 127 : c < -127 ? -127 : c;
}

/* row x [Cin] -> codes q [Kp], scales d [nb], -128 sum(q) per block c [nb] */
static void quant_row_scalar(int8_t *q, float *d, int32_t *c, const float *x, size_t Cin)
{
    size_t nb = kpad(Cin) / QK;
    for (size_t b = 0; b < nb; b++) {
        size_t k0 = b * QK, k1 = k0 + QK < Cin ? k0 + QK : Cin;
        float amax = 0.0f, z = 0.0f;
        for (size_t k = k0; k < k1; k++) {
            float a = fabsf(x[k]);
            amax = a > amax ? a : amax;
            z += x[k] * 0.0f; /* NaN once an infinity or a NaN is seen */
        }
        float inv;
        d[b] = block_scale(amax, z == z, &inv);
        int32_t s = 0;
        for (size_t k = k0; k < k0 + QK; k++) {
            int32_t v = k < k1 && inv != 0.0f ? code_of(x[k] * inv) : 0;
            q[k] = (int8_t)v;
            s += v;
        }
        c[b] = -128 * s;
    }
}

MC_TARGET_AVX2 static void quant_row_avx2(int8_t *q, float *d, int32_t *c, const float *x,
                                          size_t Cin)
{
    size_t nb = kpad(Cin) / QK;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (size_t b = 0; b < nb; b++) {
        size_t k0 = b * QK;
        if (k0 + QK > Cin) { /* the last, partial block */
            quant_row_scalar(q + k0, d + b, c + b, x + k0, Cin - k0);
            continue;
        }
        __m256 v[4], m = _mm256_setzero_ps(), z = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + k0 + 8 * i);
            m = _mm256_max_ps(m, _mm256_and_ps(v[i], absm));
            z = _mm256_add_ps(z, _mm256_mul_ps(v[i], _mm256_setzero_ps()));
        }
        float mm[8], zz[8], amax = 0.0f, zs = 0.0f;
        _mm256_storeu_ps(mm, m);
        _mm256_storeu_ps(zz, z);
        for (int i = 0; i < 8; i++) {
            amax = mm[i] > amax ? mm[i] : amax;
            zs += zz[i];
        }
        float inv;
        d[b] = block_scale(amax, zs == zs, &inv);
        __m256 iv = _mm256_set1_ps(inv);
        __m256i s = _mm256_setzero_si256(), w[4];
        for (int i = 0; i < 4; i++) {
            w[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv));
            w[i] = _mm256_min_epi32(_mm256_max_epi32(w[i], lo), hi);
            s = _mm256_add_epi32(s, w[i]);
        }
        /* 32 int32 -> 32 int8 in order */
        __m256i p01 = _mm256_packs_epi32(w[0], w[1]), p23 = _mm256_packs_epi32(w[2], w[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + k0), p);
        int32_t ss[8], t = 0;
        _mm256_storeu_si256((__m256i *)ss, s);
        for (int i = 0; i < 8; i++) t += ss[i];
        c[b] = -128 * t;
    }
}

MC_TARGET_AVX512 static void quant_row_avx512(int8_t *q, float *d, int32_t *c, const float *x,
                                              size_t Cin)
{
    size_t nb = kpad(Cin) / QK;
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (size_t b = 0; b < nb; b++) {
        size_t k0 = b * QK;
        if (k0 + QK > Cin) {
            quant_row_scalar(q + k0, d + b, c + b, x + k0, Cin - k0);
            continue;
        }
        __m512 v0 = _mm512_loadu_ps(x + k0), v1 = _mm512_loadu_ps(x + k0 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        __m512 z = _mm512_add_ps(_mm512_mul_ps(v0, _mm512_setzero_ps()),
                                 _mm512_mul_ps(v1, _mm512_setzero_ps()));
        float zs = _mm512_reduce_add_ps(z);
        float inv;
        d[b] = block_scale(amax < 0.0f ? 0.0f : amax, zs == zs, &inv);
        __m512 iv = _mm512_set1_ps(inv);
        __m512i w0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, iv));
        __m512i w1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, iv));
        w0 = _mm512_min_epi32(_mm512_max_epi32(w0, lo), hi);
        w1 = _mm512_min_epi32(_mm512_max_epi32(w1, lo), hi);
        _mm_storeu_si128((__m128i *)(q + k0), _mm512_cvtepi32_epi8(w0));
        _mm_storeu_si128((__m128i *)(q + k0 + 16), _mm512_cvtepi32_epi8(w1));
        c[b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(w0, w1));
    }
}

/* ------------------------------------------------------------------ tiles */

typedef struct {
    float *out;
    const int8_t *xq;  /* [N][Kp] */
    const float *xd;   /* [N][nb] */
    const int32_t *xc; /* [N][nb] */
    const uint8_t *Wp;
    const float *scale, *b;
    size_t N, Cin, Cout, Kp, nb, pb; /* pb: bytes of a panel */
} q8a8_args;

/* out[n.., panel p..]: RT rows, OT panels (constants after inlining) */
MC_TARGET_VNNI static inline __attribute__((always_inline)) void
tile_vnni(const q8a8_args *a, size_t n, size_t p, int RT, int OT)
{
    const size_t Kp = a->Kp, nb = a->nb;
    const int8_t *xq = a->xq + n * Kp;
    const float *xd = a->xd + n * nb;
    const int32_t *xc = a->xc + n * nb;
    const uint8_t *W = a->Wp + p * a->pb;
    __m512 f[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < RT; r++)
        _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++) f[r][o] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        __m512i s[4][4];
        _Pragma("GCC unroll 4") for (int r = 0; r < RT; r++)
        {
            __m512i c = _mm512_set1_epi32(xc[(size_t)r * nb + b]);
            _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++) s[r][o] = c;
        }
        const uint8_t *w = W + b * (QK * PANEL);
        const int8_t *x = xq + b * QK;
        _Pragma("GCC unroll 8") for (int j = 0; j < QK / 4; j++)
        {
            __m512i wv[4];
            _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)
                wv[o] = _mm512_loadu_si512((const void *)(w + (size_t)o * a->pb + 64 * j));
            _Pragma("GCC unroll 4") for (int r = 0; r < RT; r++)
            {
                int32_t v;
                memcpy(&v, x + (size_t)r * Kp + 4 * j, 4);
                __m512i xv = _mm512_set1_epi32(v);
                _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)
                    s[r][o] = _mm512_dpbusd_epi32(s[r][o], wv[o], xv);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < RT; r++)
        {
            __m512 dv = _mm512_set1_ps(xd[(size_t)r * nb + b]);
            _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)
                f[r][o] = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(s[r][o]), f[r][o]);
        }
    }
    _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)
    {
        size_t o0 = (p + (size_t)o) * PANEL;
        size_t left = a->Cout - o0;
        __mmask16 m = left >= PANEL ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 sc = _mm512_maskz_loadu_ps(m, a->scale + o0);
        __m512 bv = a->b ? _mm512_maskz_loadu_ps(m, a->b + o0) : _mm512_setzero_ps();
        _Pragma("GCC unroll 4") for (int r = 0; r < RT; r++)
        {
            __m512 t = _mm512_mul_ps(f[r][o], sc);
            if (a->b) t = _mm512_add_ps(t, bv);
            _mm512_mask_storeu_ps(a->out + (n + (size_t)r) * a->Cout + o0, m, t);
        }
    }
}

/* AVX2: the products as vpmaddubsw (unsigned bytes times signed bytes, pairs
 * summed in int16) and vpmaddwd with ones (int16 pairs summed in int32):
 * |q| times the weight code with q's sign, which never saturates (codes
 * within [-127, 127]: a pair is at most 2 * 127 * 127 = 32258). The packed
 * bytes are code + 128; xor 0x80 gives the signed code back. */

/* the AVX2 tiles' end: out = f * scale (+ bias), the panel's valid outputs */
MC_TARGET_AVX2 static inline __attribute__((always_inline)) void
store_avx2(const q8a8_args *a, size_t n, size_t p, __m256 f0, __m256 f1)
{
    size_t o0 = p * PANEL;
    size_t left = a->Cout - o0 < PANEL ? a->Cout - o0 : PANEL;
    float *dst = a->out + n * a->Cout + o0;
    if (left == PANEL) {
        __m256 t0 = _mm256_mul_ps(f0, _mm256_loadu_ps(a->scale + o0));
        __m256 t1 = _mm256_mul_ps(f1, _mm256_loadu_ps(a->scale + o0 + 8));
        if (a->b) {
            t0 = _mm256_add_ps(t0, _mm256_loadu_ps(a->b + o0));
            t1 = _mm256_add_ps(t1, _mm256_loadu_ps(a->b + o0 + 8));
        }
        _mm256_storeu_ps(dst, t0);
        _mm256_storeu_ps(dst + 8, t1);
        return;
    }
    float t[PANEL];
    _mm256_storeu_ps(t, f0);
    _mm256_storeu_ps(t + 8, f1);
    for (size_t i = 0; i < left; i++) {
        float v = t[i] * a->scale[o0 + i];
        if (a->b) v += a->b[o0 + i];
        dst[i] = v;
    }
}

/* how far ahead a row alone prefetches its panels' codes: the hardware
 * prefetcher stops at each 4 KiB page */
#define PF_AHEAD 2048

/* one row, OT (1 or 2) panels: the weights stream once. Per group of 4
 * positions: the row's 4 codes broadcast (q and |q|), then per 8 outputs
 * one load, xor, vpsignb, vpmaddubsw, vpmaddwd, add. 4 OT int32 and 4 OT
 * float accumulators. */
MC_TARGET_AVX2 static inline __attribute__((always_inline)) void
row_avx2(const q8a8_args *a, size_t n, size_t p, int OT)
{
    const size_t nb = a->nb, pb = a->pb;
    const int8_t *xq = a->xq + n * a->Kp;
    const float *xd = a->xd + n * nb;
    const uint8_t *W = a->Wp + p * pb;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256 f00 = _mm256_setzero_ps(), f01 = f00, f10 = f00, f11 = f00;
    for (size_t b = 0; b < nb; b++) {
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
        const uint8_t *w = W + b * (QK * PANEL);
        const int8_t *x = xq + b * QK;
        int8_t ax[QK] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i *)ax, _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)x)));
        for (int c = 0; c < QK * PANEL; c += 64) {
            _mm_prefetch((const char *)w + PF_AHEAD + c, _MM_HINT_T0);
            if (OT > 1) _mm_prefetch((const char *)w + pb + PF_AHEAD + c, _MM_HINT_T0);
        }
        _Pragma("GCC unroll 8") for (int j = 0; j < QK / 4; j++)
        {
            int32_t v, va;
            memcpy(&v, x + 4 * j, 4);
            memcpy(&va, ax + 4 * j, 4);
            __m256i xv = _mm256_set1_epi32(v), xa = _mm256_set1_epi32(va);
            const uint8_t *wj = w + 64 * j;
#define Q8A8_STEP(s, off)                                                                          \
    s = _mm256_add_epi32(                                                                          \
        s, _mm256_madd_epi16(                                                                      \
               _mm256_maddubs_epi16(                                                               \
                   xa, _mm256_sign_epi8(                                                           \
                           _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wj + (off))),    \
                                            flip),                                                 \
                           xv)),                                                                   \
               ones))
            Q8A8_STEP(s00, 0);
            Q8A8_STEP(s01, 32);
            if (OT > 1) {
                Q8A8_STEP(s10, pb);
                Q8A8_STEP(s11, pb + 32);
            }
        }
        __m256 dv = _mm256_set1_ps(xd[b]);
        f00 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s00), f00);
        f01 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s01), f01);
        if (OT > 1) {
            f10 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s10), f10);
            f11 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s11), f11);
        }
    }
    store_avx2(a, n, p, f00, f01);
    if (OT > 1) store_avx2(a, n, p + 1, f10, f11);
}

/* RT (1 or 2) rows, one panel: each weight vector's magnitudes and signs
 * computed once for the rows (|w| times q with w's sign). 4 RT int32 and
 * 4 RT float accumulators. */
MC_TARGET_AVX2 static inline __attribute__((always_inline)) void
tile_avx2(const q8a8_args *a, size_t n, size_t p, int RT)
{
    const size_t Kp = a->Kp, nb = a->nb;
    const int8_t *xq = a->xq + n * Kp;
    const float *xd = a->xd + n * nb;
    const uint8_t *W = a->Wp + p * a->pb;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256 f00 = _mm256_setzero_ps(), f01 = f00, f10 = f00, f11 = f00;
    for (size_t b = 0; b < nb; b++) {
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
        const uint8_t *w = W + b * (QK * PANEL);
        const int8_t *x = xq + b * QK;
        _Pragma("GCC unroll 2") for (int j = 0; j < QK / 4; j++)
        {
            __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 64 * j)), flip);
            __m256i w1 =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 64 * j + 32)), flip);
            __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
            int32_t v;
            memcpy(&v, x + 4 * j, 4);
            __m256i xv = _mm256_set1_epi32(v);
            s00 = _mm256_add_epi32(
                s00, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xv, w0)), ones));
            s01 = _mm256_add_epi32(
                s01, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xv, w1)), ones));
            if (RT > 1) {
                memcpy(&v, x + Kp + 4 * j, 4);
                xv = _mm256_set1_epi32(v);
                s10 = _mm256_add_epi32(
                    s10,
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xv, w0)), ones));
                s11 = _mm256_add_epi32(
                    s11,
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xv, w1)), ones));
            }
        }
        __m256 dv = _mm256_set1_ps(xd[b]);
        f00 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s00), f00);
        f01 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s01), f01);
        if (RT > 1) {
            dv = _mm256_set1_ps(xd[nb + b]);
            f10 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s10), f10);
            f11 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(s11), f11);
        }
    }
    store_avx2(a, n, p, f00, f01);
    if (RT > 1) store_avx2(a, n + 1, p, f10, f11);
}

static void tile_scalar(const q8a8_args *a, size_t n, size_t p)
{
    const size_t Kp = a->Kp, nb = a->nb;
    const int8_t *x = a->xq + n * Kp;
    const float *xd = a->xd + n * nb;
    const uint8_t *W = a->Wp + p * a->pb;
    float f[PANEL] = {0};
    for (size_t b = 0; b < nb; b++) {
        int32_t s[PANEL] = {0};
        for (size_t j = 0; j < QK / 4; j++)
            for (size_t t = 0; t < 4; t++) {
                int32_t xv = x[b * QK + 4 * j + t];
                const uint8_t *w = W + b * (QK * PANEL) + 64 * j + t;
                for (size_t o = 0; o < PANEL; o++) s[o] += xv * ((int32_t)w[4 * o] - 128);
            }
        for (size_t o = 0; o < PANEL; o++) f[o] = fmaf(xd[b], (float)s[o], f[o]);
    }
    size_t o0 = p * PANEL, left = a->Cout - o0 < PANEL ? a->Cout - o0 : PANEL;
    float *dst = a->out + n * a->Cout + o0;
    for (size_t i = 0; i < left; i++) {
        float v = f[i] * a->scale[o0 + i];
        if (a->b) v += a->b[o0 + i];
        dst[i] = v;
    }
}

/* rows [n0, n1) x panels [p0, p1), in tiles */
MC_TARGET_VNNI static void item_vnni(const q8a8_args *a, size_t n0, size_t n1, size_t p0, size_t p1)
{
    if (n1 - n0 == 1) { /* a row alone: 4 panels a tile, the weights stream once */
        size_t p = p0;
        for (; p + 4 <= p1; p += 4) tile_vnni(a, n0, p, 1, 4);
        for (; p + 2 <= p1; p += 2) tile_vnni(a, n0, p, 1, 2);
        for (; p < p1; p++) tile_vnni(a, n0, p, 1, 1);
        return;
    }
    for (size_t p = p0; p < p1; p += 2) {
        int two = p + 2 <= p1;
        size_t n = n0;
        for (; n + 4 <= n1; n += 4) two ? tile_vnni(a, n, p, 4, 2) : tile_vnni(a, n, p, 4, 1);
        switch (n1 - n) {
        case 3: two ? tile_vnni(a, n, p, 3, 2) : tile_vnni(a, n, p, 3, 1); break;
        case 2: two ? tile_vnni(a, n, p, 2, 2) : tile_vnni(a, n, p, 2, 1); break;
        case 1: two ? tile_vnni(a, n, p, 1, 2) : tile_vnni(a, n, p, 1, 1); break;
        default: break;
        }
    }
}

MC_TARGET_AVX2 static void item_avx2(const q8a8_args *a, size_t n0, size_t n1, size_t p0, size_t p1)
{
    if (n1 - n0 == 1) { /* a row alone: 2 panels a tile, the weights stream once */
        size_t p = p0;
        for (; p + 2 <= p1; p += 2) row_avx2(a, n0, p, 2);
        if (p < p1) row_avx2(a, n0, p, 1);
        return;
    }
    for (size_t p = p0; p < p1; p++) {
        size_t n = n0;
        for (; n + 2 <= n1; n += 2) tile_avx2(a, n, p, 2);
        if (n < n1) tile_avx2(a, n, p, 1);
    }
}

static void item_scalar(const q8a8_args *a, size_t n0, size_t n1, size_t p0, size_t p1)
{
    for (size_t p = p0; p < p1; p++)
        for (size_t n = n0; n < n1; n++) tile_scalar(a, n, p);
}

/* the path's functions: VNNI where the path is avx512 and the CPU has
 * AVX512_VNNI, else AVX2 where the path is avx2 or avx512, else scalar */
typedef void (*item_fn)(const q8a8_args *, size_t, size_t, size_t, size_t);
typedef void (*quant_fn)(int8_t *, float *, int32_t *, const float *, size_t);

static int cpu_has_vnni(void)
{
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

void mc_cpu_linear_q8a8_fwd(mc_backend *be, float *out, const float *x, const uint8_t *Wp,
                            const float *scale, const float *b, size_t N, size_t Cin, size_t Cout)
{
    if (!N || !Cout) return;
    int isa = be->isa;
    item_fn item = isa >= MC_ISA_AVX512 && cpu_has_vnni() ? item_vnni
                   : isa >= MC_ISA_AVX2                   ? item_avx2
                                                          : item_scalar;
    quant_fn quant = isa >= MC_ISA_AVX512 ? quant_row_avx512
                     : isa >= MC_ISA_AVX2 ? quant_row_avx2
                                          : quant_row_scalar;
    size_t Kp = kpad(Cin), nb = Kp / QK;
    /* the quantized rows: codes, then scales, then the -128 sum(q) terms */
    size_t qbytes = (N * Kp + 63) / 64 * 64;
    char *scr = mc_cpu_scratch(be, MC_CPU_SCRATCH_GEMM_A, qbytes + 2 * N * nb * sizeof(float));
    q8a8_args a = {.out = out,
                   .xq = (const int8_t *)scr,
                   .xd = (const float *)(scr + qbytes),
                   .xc = (const int32_t *)(scr + qbytes + N * nb * sizeof(float)),
                   .Wp = Wp,
                   .scale = scale,
                   .b = b,
                   .N = N,
                   .Cin = Cin,
                   .Cout = Cout,
                   .Kp = Kp,
                   .nb = nb,
                   .pb = PANEL * Kp};
    size_t panels = (Cout + PANEL - 1) / PANEL, groups = (panels + ITEM_PANELS - 1) / ITEM_PANELS;
    size_t chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    int threads = be->threads;
    if (N * Cout * Cin < ((size_t)1 << 16)) threads = 1; /* too small to share */
    /* a few rows (decoding) are quantized here, before the threads start:
     * one barrier less a call, which counts when the cores are shared */
    int serial_quant = N * Cin <= QUANT_SERIAL;
    if (serial_quant)
        for (size_t n = 0; n < N; n++)
            quant((int8_t *)a.xq + n * Kp, (float *)a.xd + n * nb, (int32_t *)a.xc + n * nb,
                  x + n * Cin, Cin);
#pragma omp parallel num_threads(threads)
    {
        if (!serial_quant) {
#pragma omp for schedule(static)
            for (size_t n = 0; n < N; n++)
                quant((int8_t *)a.xq + n * Kp, (float *)a.xd + n * nb, (int32_t *)a.xc + n * nb,
                      x + n * Cin, Cin);
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < chunks * groups; i++) {
            size_t c = i / groups, g = i % groups;
            size_t n0 = c * CHUNK_ROWS, n1 = n0 + CHUNK_ROWS < N ? n0 + CHUNK_ROWS : N;
            size_t p0 = g * ITEM_PANELS, p1 = p0 + ITEM_PANELS < panels ? p0 + ITEM_PANELS : panels;
            item(&a, n0, n1, p0, p1);
        }
    }
}
