/*
 * b16gemm.c - the GEMM of emulated bf16 (no bf16 GEMM in oneDNN for the
 * CPU or path) on the AVX2 and AVX-512 paths: C[M,N] = beta C + A[M,K] B,
 * A in fp32 (bf16 values), B in bf16 packed in panels of 16 columns and
 * widened in registers. It multiplies the same values as sgemm on the
 * rounded fp32 copy did, reads half the bytes of B, and finds B already
 * packed where the caller prepared the weight (mc_k_prepare_weight with
 * cols: the model's weights, written once a step).
 *
 * Panels: B [K, N] is ceil(N / 16) panels, panel q (columns 16 q onward,
 * w = min(16, N - 16 q) of them) at element 16 q K, its K rows of w bf16
 * values each. A linear weight W [O, I] (Megatron's [output, input]) is
 * two such matrices: the forward's B = W^T (K = I, N = O: panel q holds
 * rows 16 q.. of W, transposed) and the backward's B = W for d x (K = O,
 * N = I: panel q holds columns 16 q.. of W, row by row). Its prepared form
 * is the first, then the second: 4 bytes an element, as the rounded fp32
 * copy it replaces.
 *
 * The loops are GotoBLAS's: blocks of KC = 768 steps of K, A packed per
 * block into panels of 6 rows, a 6 x 16 register tile (12 ymm
 * accumulators) per panel pair. Each element of C is summed by one thread
 * in order of k, one fused multiply-add a step, so its bits depend on
 * neither the thread count nor the split: the rows are split among the
 * threads, or the column panels where the rows are few (an LM head chunk).
 */
#include <assert.h>
#include <omp.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#include "kern/cpu/bf16v.h"

#define KC 768      /* steps of K in a packed block */
#define MCB 144     /* rows of a packed block of A... */
#define MCB_ALL 264 /* ...or all of them, up to this many */

int mc_cpu_b16_panels(const mc_backend *be, mc_prec prec)
{
    return prec == MC_PREC_BF16 && !be->dnnl_bf16 && be->isa >= MC_ISA_AVX2 && be->b16_panels;
}

/* ---------------------------------------------------------------- packing */

/* bf16 bits (bf16v.h's rounding) of the 8 floats at p, one a lane */
MC_TARGET_AVX2 static inline __m256i bits8(const float *p)
{
    return mc_bf16_bits8(_mm256_loadu_si256((const __m256i *)p));
}

/* 16 bf16 values from two vectors of 8 (a: the first 8) */
MC_TARGET_AVX2 static inline __m256i pack16(__m256i a, __m256i b)
{
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}

/* r[0..8) transposed as an 8 x 8 matrix of 32-bit lanes */
MC_TARGET_AVX2 static inline void tr8(__m256i *r)
{
    __m256i t[8], s[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        s[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        s[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        s[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        s[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(s[k], s[k + 4], 0x20);
        r[k + 4] = _mm256_permute2x128_si256(s[k], s[k + 4], 0x31);
    }
}

/* a full 16-wide row of a panel: 32 bytes, streamed past the caches (nt:
 * the whole prepared copy, not read again before the next forward pass,
 * and 32-byte aligned) or stored */
MC_TARGET_AVX2 static inline void put16(uint16_t *dst, __m256i v, int nt)
{
    if (nt)
        _mm256_stream_si256((__m256i *)dst, v);
    else
        _mm256_storeu_si256((__m256i *)dst, v);
}

/* Rows [o0, o0 + w) of W [O, I] (o0 a multiple of 16, w <= 16) into the
 * forward's panel of those rows (fwd: [I][w] at o0 I) and row by row into
 * each of the backward's panels (bwd: panel q's rows o0.. at 16 q O + o0
 * wq); either NULL for none. A panel's 16 rows are 512 contiguous bytes,
 * written one after another, so whole lines leave the write combining. */
MC_TARGET_AVX2 static void pack_block(uint16_t *fwd, uint16_t *bwd, const float *W, size_t o0,
                                      size_t w, size_t O, size_t I, int nt)
{
    const float *Wb = W + o0 * I;
    if (fwd) {
        uint16_t *dst = fwd + o0 * I;
        size_t i = 0;
        if (w == 16)
            for (; i + 8 <= I; i += 8) {
                __m256i r[16];
                for (int k = 0; k < 16; k++) r[k] = bits8(Wb + k * I + i);
                tr8(r);
                tr8(r + 8);
                for (int j = 0; j < 8; j++) put16(dst + (i + j) * 16, pack16(r[j], r[8 + j]), nt);
            }
        for (; i < I; i++)
            for (size_t k = 0; k < w; k++) dst[i * w + k] = mc_f32_to_bf16(Wb[k * I + i]);
    }
    if (bwd) {
        size_t q = 0;
        for (; q + 16 <= I; q += 16) {
            uint16_t *dst = bwd + q * O + o0 * 16;
            for (size_t r = 0; r < w; r++)
                put16(dst + r * 16, pack16(bits8(Wb + r * I + q), bits8(Wb + r * I + q + 8)), nt);
        }
        size_t wq = I - q;
        for (size_t r = 0; r < w; r++)
            for (size_t c = 0; c < wq; c++)
                bwd[q * O + (o0 + r) * wq + c] = mc_f32_to_bf16(Wb[r * I + q + c]);
    }
    if (nt) _mm_sfence();
}

void mc_cpu_b16_pack(mc_backend *be, uint16_t *fwd, uint16_t *bwd, const float *W, size_t O,
                     size_t I)
{
    size_t nb = (O + 15) / 16;
#pragma omp parallel for num_threads(be->threads) if (O * I > 65536) schedule(static)
    for (size_t b = 0; b < nb; b++)
        pack_block(fwd, bwd, W, b * 16, O - b * 16 < 16 ? O - b * 16 : 16, O, I, 0);
}

int mc_cpu_b16_stream(const uint16_t *out, size_t O, size_t I)
{
    return O * I >= MC_CPU_STREAM_MIN && (uintptr_t)out % 32 == 0 && (O * I) % 16 == 0;
}

void mc_cpu_b16_pack_rows(uint16_t *out, const float *W, size_t o0, size_t O, size_t I, int nt)
{
    pack_block(out, out + O * I, W, o0, O - o0 < 16 ? O - o0 : 16, O, I, nt);
}

/* ---------------------------------------------------------------- GEMM */

/* The 6 x 16 register tile: c<row><half>; a step is one k: two 8-wide
 * loads of B widened from bf16 against six broadcasts of A */
#define TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TILE_ZERO(i) c##i##0 = c##i##1 = _mm256_setzero_ps();
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
#define WIDEN(p)         \
    _mm256_castsi256_ps( \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))

/* c[6][16] (row stride ldc) = (first ? 0 : c) + pa [kc][6] . pb [kc][16] */
MC_TARGET_AVX2 static inline void tile(size_t kc, const float *pa, const uint16_t *pb, float *c,
                                       size_t ldc, int first)
{
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (first) {
        TILE_ROWS(TILE_ZERO)
    } else {
        TILE_ROWS(TILE_LD)
    }
    for (size_t k = 0; k < kc; k++, pa += 6, pb += 16) {
        __m256 b0 = WIDEN(pb), b1 = WIDEN(pb + 8);
        TILE_ROWS(TILE_FMA)
    }
    TILE_ROWS(TILE_ST)
}

/* a value of A as packed: itself, or rounded to bf16 (rnd) */
static inline float a_val(float x, int rnd) { return rnd ? mc_bf16_to_f32(mc_f32_to_bf16(x)) : x; }

/* 6 rows of A (rows of them real, the rest zeros; row stride lda) as the
 * panel p [kc][6], rounded to bf16 on the way where rnd: 8 columns at a
 * time through an 8 x 8 transpose, each column of 6 stored as 8 floats
 * that the next column overwrites (p has 2 floats of slack past its end) */
MC_TARGET_AVX2 static void pack_a(float *p, const float *a, size_t lda, size_t rows, size_t kc,
                                  int rnd)
{
    size_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256i r[8];
        for (size_t i = 0; i < 8; i++) {
            r[i] = i < rows ? _mm256_loadu_si256((const __m256i *)(a + i * lda + k))
                            : _mm256_setzero_si256();
            if (rnd) r[i] = _mm256_slli_epi32(mc_bf16_bits8(r[i]), 16);
        }
        tr8(r);
        for (size_t j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(p + (k + j) * 6), r[j]);
    }
    for (; k < kc; k++)
        for (size_t i = 0; i < 6; i++) p[k * 6 + i] = i < rows ? a_val(a[i * lda + k], rnd) : 0.0f;
}

/* the same for A stored transposed (A(m, k) at a[k lda + m]): each k's 6
 * values are contiguous, loaded under a mask of the real ones (nothing
 * past them is read) and stored as 8 that the next k overwrites */
MC_TARGET_AVX2 static void pack_at(float *p, const float *a, size_t lda, size_t rows, size_t kc,
                                   int rnd)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows), lane);
    for (size_t k = 0; k < kc; k++) {
        __m256i v = _mm256_castps_si256(_mm256_maskload_ps(a + k * lda, mask));
        if (rnd) v = _mm256_slli_epi32(mc_bf16_bits8(v), 16);
        _mm256_storeu_si256((__m256i *)(p + k * 6), v);
    }
}

/* rows [r0, r1) of C, column panels [q0, q1): one thread's share */
MC_TARGET_AVX2 static void gemm_part(size_t r0, size_t r1, size_t q0, size_t q1, size_t mcb,
                                     size_t N, size_t K, unsigned af, const float *A, size_t lda,
                                     const uint16_t *P, float beta, float *C, size_t ldc, float *Ap)
{
    uint16_t edge[KC * 16]; /* a narrow panel's block, zero-padded to 16 wide */
    float tmp[6 * 16];      /* a tile at the edge of C */
    /* GotoBLAS's order: a block of K outermost, so its slab of B (kc x N,
     * bf16) is reread from the last-level cache by each block of rows, not
     * from memory; each C tile still sums its blocks of K in order */
    for (size_t pc = 0; pc < K; pc += KC) {
        size_t kc = K - pc < KC ? K - pc : KC;
        int first = pc == 0 && beta == 0.0f;
        for (size_t ic = r0; ic < r1; ic += mcb) {
            size_t mc = r1 - ic < mcb ? r1 - ic : mcb;
            for (size_t ir = 0; ir < mc; ir += 6)
                if (af & MC_CPU_B16_AT)
                    pack_at(Ap + ir * kc, A + pc * lda + ic + ir, lda, mc - ir < 6 ? mc - ir : 6,
                            kc, af & MC_CPU_B16_ROUND_A);
                else
                    pack_a(Ap + ir * kc, A + (ic + ir) * lda + pc, lda, mc - ir < 6 ? mc - ir : 6,
                           kc, af & MC_CPU_B16_ROUND_A);
            for (size_t q = q0; q < q1; q++) {
                size_t j0 = q * 16, w = N - j0 < 16 ? N - j0 : 16;
                const uint16_t *pb = P + j0 * K + pc * w;
                if (w < 16) {
                    for (size_t k = 0; k < kc; k++)
                        for (size_t j = 0; j < 16; j++)
                            edge[k * 16 + j] = j < w ? pb[k * w + j] : 0;
                    pb = edge;
                }
                for (size_t ir = 0; ir < mc; ir += 6) {
                    float *c = C + (ic + ir) * ldc + j0;
                    size_t rows = mc - ir < 6 ? mc - ir : 6;
                    if (rows == 6 && w == 16) {
                        tile(kc, Ap + ir * kc, pb, c, ldc, first);
                        continue;
                    }
                    if (!first)
                        for (size_t r = 0; r < rows; r++) memcpy(tmp + r * 16, c + r * ldc, w * 4);
                    tile(kc, Ap + ir * kc, pb, tmp, 16, first);
                    for (size_t r = 0; r < rows; r++) memcpy(c + r * ldc, tmp + r * 16, w * 4);
                }
            }
        }
    }
}

void mc_cpu_b16_gemm(mc_backend *be, size_t M, size_t N, size_t K, unsigned af, const float *A,
                     size_t lda, const uint16_t *P, float beta, float *C, size_t ldc)
{
    assert(beta == 0.0f || beta == 1.0f);
    if (!M || !N) return;
    if (!K) {
        if (beta == 0.0f)
            for (size_t r = 0; r < M; r++) memset(C + r * ldc, 0, N * sizeof(float));
        return;
    }
    size_t nt = (size_t)be->threads, np = (N + 15) / 16;
    size_t mcb = M <= MCB_ALL ? M : MCB;
    /* few rows (fewer than two blocks a thread): each thread takes a share
     * of the column panels, streaming its part of B once */
    int bycol = M < 2 * nt * mcb;
    if (nt > np && bycol) nt = np;
    if (!bycol) { /* whole 6-row panels a thread, at most nt blocks' worth */
        size_t per = (M + 6 * nt - 1) / (6 * nt) * 6;
        if ((M + per - 1) / per < nt) nt = (M + per - 1) / per;
    }
    size_t apn = ((mcb + 5) / 6 * 6) * KC + 8; /* 8: pack_a's slack */
    float *Ap = mc_cpu_scratch(be, MC_CPU_SCRATCH_PANEL_A, nt * apn * sizeof(float));
#pragma omp parallel num_threads((int)nt) if (nt > 1)
    {
        size_t t = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
        size_t r0 = 0, r1 = M, q0 = 0, q1 = np;
        if (bycol) {
            size_t per = (np + n - 1) / n;
            q0 = t * per < np ? t * per : np;
            q1 = q0 + per < np ? q0 + per : np;
        } else {
            size_t per = (M + 6 * n - 1) / (6 * n) * 6;
            r0 = t * per < M ? t * per : M;
            r1 = r0 + per < M ? r0 + per : M;
        }
        if (r0 < r1 && q0 < q1)
            gemm_part(r0, r1, q0, q1, mcb, N, K, af, A, lda, P, beta, C, ldc, Ap + t * apn);
    }
}

#else /* not x86-64 with GCC's vector extensions: the sgemm path everywhere */

int mc_cpu_b16_panels(const mc_backend *be, mc_prec prec)
{
    (void)be, (void)prec;
    return 0;
}
void mc_cpu_b16_pack(mc_backend *be, uint16_t *fwd, uint16_t *bwd, const float *W, size_t O,
                     size_t I)
{
    (void)be, (void)fwd, (void)bwd, (void)W, (void)O, (void)I;
    assert(0);
}
int mc_cpu_b16_stream(const uint16_t *out, size_t O, size_t I)
{
    (void)out, (void)O, (void)I;
    return 0;
}
void mc_cpu_b16_pack_rows(uint16_t *out, const float *W, size_t o0, size_t O, size_t I, int nt)
{
    (void)out, (void)W, (void)o0, (void)O, (void)I, (void)nt;
    assert(0);
}
void mc_cpu_b16_gemm(mc_backend *be, size_t M, size_t N, size_t K, unsigned af, const float *A,
                     size_t lda, const uint16_t *P, float beta, float *C, size_t ldc)
{
    (void)be, (void)M, (void)N, (void)K, (void)af, (void)A, (void)lda, (void)P, (void)beta, (void)C,
        (void)ldc;
    assert(0);
}
#endif
