/*
 * linear_rows.c - the row-invariant linear of batched inference (kern.h
 * mc_k_linear_rows_fwd): every output element is one dot product in a fixed
 * order that depends on the input width alone, so a sequence decoded in a
 * batch of any size gets the bits it gets alone (mc-serve's batch
 * invariance). fp32 weights or int8 codes with one scale per row.
 *
 * The order: 16 lanes, lane j summing the products of the positions
 * k = 16 i + j in increasing i; the lanes added pairwise (j += j + 8, then
 * + 4, + 2, + 1); the tail positions past the last whole 16 in order; for
 * int8, times the row's scale; then the bias. The lanes are a 16-float GCC
 * vector (one zmm, two ymm or four xmm), register tiles of rows x outputs
 * sized per path; the tiles change which elements are computed together,
 * never an element's sum.
 */
#include <string.h>

#include <immintrin.h>

#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

typedef float v16 __attribute__((vector_size(64)));

/* outputs per parallel work item */
#define ROWS_BLOCK 16

/* (vectors go through pointers: a 64-byte vector argument or return value
 * would have another ABI on each path) */
static inline __attribute__((always_inline)) void load_f(v16 *v, const float *p)
{
    memcpy(v, p, sizeof *v);
}

/* 16 codes widened to floats: one instruction pair per path (GCC's own
 * vector conversion goes element by element); exact on every path */
MC_TARGET_AVX512 static inline void load_q_avx512(v16 *v, const int8_t *p)
{
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    memcpy(v, &f, sizeof f);
}

MC_TARGET_AVX2 static inline void load_q_avx2(v16 *v, const int8_t *p)
{
    __m256 f[2] = {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
    memcpy(v, f, sizeof f);
}

static inline __attribute__((always_inline)) void load_q(v16 *v, const int8_t *p, int isa)
{
    if (isa >= MC_ISA_AVX512) {
        load_q_avx512(v, p);
    } else if (isa >= MC_ISA_AVX2) {
        load_q_avx2(v, p);
    } else {
        float f[16];
        for (int j = 0; j < 16; j++) f[j] = (float)p[j];
        memcpy(v, f, sizeof f);
    }
}

static inline __attribute__((always_inline)) float lanes_sum(const v16 *a)
{
    float r[16];
    memcpy(r, a, sizeof r);
    for (int h = 8; h >= 1; h /= 2)
        for (int j = 0; j < h; j++) r[j] += r[j + h];
    return r[0];
}

/* out[i, o] for RT rows and OT outputs (RT, OT constants after inlining) */
static inline __attribute__((always_inline)) void tile(float *out, size_t ldo, const float *x,
                                                       size_t ldx, const float *W, const int8_t *Wq,
                                                       const float *scale, const float *b,
                                                       size_t Cin, int RT, int OT, int q8, int isa)
{
    v16 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int o = 0; o < OT; o++) acc[i][o] = (v16){0};
    size_t k = 0;
    for (; k + 16 <= Cin; k += 16) {
        v16 w[4];
#pragma GCC unroll 4
        for (int o = 0; o < OT; o++)
            if (q8)
                load_q(&w[o], Wq + (size_t)o * Cin + k, isa);
            else
                load_f(&w[o], W + (size_t)o * Cin + k);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            v16 xv;
            load_f(&xv, x + (size_t)i * ldx + k);
#pragma GCC unroll 4
            for (int o = 0; o < OT; o++) acc[i][o] = acc[i][o] + xv * w[o];
        }
    }
    for (int i = 0; i < RT; i++)
        for (int o = 0; o < OT; o++) {
            float t = lanes_sum(&acc[i][o]);
            for (size_t kk = k; kk < Cin; kk++)
                t += x[(size_t)i * ldx + kk] *
                     (q8 ? (float)Wq[(size_t)o * Cin + kk] : W[(size_t)o * Cin + kk]);
            if (q8) t *= scale[o];
            if (b) t += b[o];
            out[(size_t)i * ldo + o] = t;
        }
}

/* outputs [r0, r1) of every row */
MC_ISA_BODY void rows_block_body(float *out, const float *x, const float *W, const int8_t *Wq,
                                 const float *scale, const float *b, size_t N, size_t Cin,
                                 size_t Cout, size_t r0, size_t r1, int isa)
{
    /* accumulators: 4x4 zmm of 32; 2x2 (8 ymm) of 16; 1x2 (8 xmm) of 16 */
    const int RT = isa >= MC_ISA_AVX512 ? 4 : isa >= MC_ISA_AVX2 ? 2 : 1;
    const int OT = isa >= MC_ISA_AVX512 ? 4 : 2;
    int q8 = Wq != NULL;
    size_t n = 0;
    for (; n + (size_t)RT <= N; n += (size_t)RT) {
        size_t r = r0;
        for (; r + (size_t)OT <= r1; r += (size_t)OT) {
            if (q8)
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, NULL, Wq + r * Cin, scale + r,
                     b ? b + r : NULL, Cin, RT, OT, 1, isa);
            else
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, W + r * Cin, NULL, NULL,
                     b ? b + r : NULL, Cin, RT, OT, 0, isa);
        }
        for (; r < r1; r++) {
            if (q8)
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, NULL, Wq + r * Cin, scale + r,
                     b ? b + r : NULL, Cin, RT, 1, 1, isa);
            else
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, W + r * Cin, NULL, NULL,
                     b ? b + r : NULL, Cin, RT, 1, 0, isa);
        }
    }
    /* rows past the last whole tile: one at a time, 4 outputs a tile (four
     * independent sums, so one row is not bound by one chain's latency) */
    for (; n < N; n++) {
        size_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            if (q8)
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, NULL, Wq + r * Cin, scale + r,
                     b ? b + r : NULL, Cin, 1, 4, 1, isa);
            else
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, W + r * Cin, NULL, NULL,
                     b ? b + r : NULL, Cin, 1, 4, 0, isa);
        }
        for (; r < r1; r++) {
            if (q8)
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, NULL, Wq + r * Cin, scale + r,
                     b ? b + r : NULL, Cin, 1, 1, 1, isa);
            else
                tile(out + n * Cout + r, Cout, x + n * Cin, Cin, W + r * Cin, NULL, NULL,
                     b ? b + r : NULL, Cin, 1, 1, 0, isa);
        }
    }
}

MC_ISA_VARIANTS_VOID(rows_block,
                     (float *out, const float *x, const float *W, const int8_t *Wq,
                      const float *scale, const float *b, size_t N, size_t Cin, size_t Cout,
                      size_t r0, size_t r1),
                     (out, x, W, Wq, scale, b, N, Cin, Cout, r0, r1))

void mc_cpu_linear_rows_fwd(mc_backend *be, float *out, const float *x, const float *W,
                            const int8_t *Wq, const float *scale, const float *b, size_t N,
                            size_t Cin, size_t Cout)
{
    rows_block_fn f = rows_block_for(be->isa);
    size_t blocks = (Cout + ROWS_BLOCK - 1) / ROWS_BLOCK;
#pragma omp parallel for num_threads(be->threads) schedule(dynamic, 1)
    for (size_t k = 0; k < blocks; k++) {
        size_t r0 = k * ROWS_BLOCK, r1 = r0 + ROWS_BLOCK < Cout ? r0 + ROWS_BLOCK : Cout;
        f(out, x, W, Wq, scale, b, N, Cin, Cout, r0, r1);
    }
}
