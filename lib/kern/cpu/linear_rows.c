/*
 * linear_rows.c - the row-invariant linear of batched inference (kern.h
 * mc_k_linear_rows_fwd): every output element is one dot product in a fixed
 * order that depends on the input width alone, so a sequence decoded in a
 * batch of any size gets the bits it gets alone (mc-serve's batch
 * invariance). fp32 weights, bf16 weights (widened exactly in registers:
 * the bits of fp32 weights rounded to bf16) or int8 codes with one scale
 * per row.
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

/* The 16 lanes are held as 16 / W vectors of W floats, W the path's
 * register width (a vector wider than the registers would live in memory:
 * 8-16x slower on the avx2 path); lane j is element j % W of vector j / W. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
/* unaligned loads of them straight from the arrays (a copy through the
 * stack stalls store forwarding) */
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef float v4u __attribute__((vector_size(16), aligned(4), may_alias));

/* outputs per parallel work item */
#define ROWS_BLOCK 16

/* W codes widened to floats: one instruction pair per path (GCC's own
 * vector conversion goes element by element); exact on every path.
 * (Vectors go through pointers: a vector argument or return value wider
 * than the baseline's registers would have another ABI on each path.) */
MC_TARGET_AVX512 static inline void load_q16(v16 *v, const int8_t *p)
{
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    memcpy(v, &f, sizeof f);
}

MC_TARGET_AVX2 static inline void load_q8(v8 *v, const int8_t *p)
{
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    memcpy(v, &f, sizeof f);
}

static inline __attribute__((always_inline)) void load_q4(v4 *v, const int8_t *p)
{
    float f[4] = {(float)p[0], (float)p[1], (float)p[2], (float)p[3]};
    memcpy(v, f, sizeof f);
}

/* W bf16 values widened to floats (the bits shifted into the high half) */
MC_TARGET_AVX512 static inline void load_b16(v16 *v, const uint16_t *p)
{
    __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)),
                                  16);
    memcpy(v, &w, sizeof w);
}

MC_TARGET_AVX2 static inline void load_b8(v8 *v, const uint16_t *p)
{
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
    memcpy(v, &w, sizeof w);
}

static inline float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) void load_b4(v4 *v, const uint16_t *p)
{
    float f[4] = {bf16_value(p[0]), bf16_value(p[1]), bf16_value(p[2]), bf16_value(p[3])};
    memcpy(v, f, sizeof f);
}

/* the weight types of a tile */
enum { WT_F32 = 0, WT_Q8 = 1, WT_B16 = 2 };

/* out[i, o] for RT rows and OT outputs (RT, OT constants after inlining):
 * lanes, the pairwise sum of the lanes, the tail in order, the scale, the
 * bias. */
#define DEFINE_TILE(NAME, VT, VTU, W, LOADQ, LOADB)                                            \
    static inline __attribute__((always_inline)) void NAME(                                    \
        float *out, size_t ldo, const float *x, size_t ldx, const float *Wf, const int8_t *Wq, \
        const uint16_t *Wb, const float *scale, const float *b, size_t Cin, int RT, int OT,    \
        int wt)                                                                                \
    {                                                                                          \
        const int q8 = wt == WT_Q8;                                                            \
        enum { P = 16 / W };                                                                   \
        VT acc[4][4][P];                                                                       \
        _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++)                                   \
            _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)                               \
                _Pragma("GCC unroll 4") for (int p = 0; p < P; p++) acc[i][o][p] = (VT){0};    \
        size_t k = 0;                                                                          \
        for (; k + 16 <= Cin; k += 16) {                                                       \
            VT w[4][P];                                                                        \
            _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)                               \
                _Pragma("GCC unroll 4") for (int p = 0; p < P; p++)                            \
            {                                                                                  \
                if (q8)                                                                        \
                    LOADQ(&w[o][p], Wq + (size_t)o * Cin + k + (size_t)p * W);                 \
                else if (wt == WT_B16)                                                         \
                    LOADB(&w[o][p], Wb + (size_t)o * Cin + k + (size_t)p * W);                 \
                else                                                                           \
                    w[o][p] = *(const VTU *)(Wf + (size_t)o * Cin + k + (size_t)p * W);        \
            }                                                                                  \
            _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++)                               \
            {                                                                                  \
                VT xv[P];                                                                      \
                _Pragma("GCC unroll 4") for (int p = 0; p < P; p++)                            \
                    xv[p] = *(const VTU *)(x + (size_t)i * ldx + k + (size_t)p * W);           \
                _Pragma("GCC unroll 4") for (int o = 0; o < OT; o++)                           \
                    _Pragma("GCC unroll 4") for (int p = 0; p < P; p++)                        \
                        acc[i][o][p] = acc[i][o][p] + xv[p] * w[o][p];                         \
            }                                                                                  \
        }                                                                                      \
        for (int i = 0; i < RT; i++)                                                           \
            for (int o = 0; o < OT; o++) {                                                     \
                float r[16];                                                                   \
                for (int p = 0; p < P; p++)                                                    \
                    for (int e = 0; e < W; e++) r[p * W + e] = acc[i][o][p][e];                \
                for (int h = 8; h >= 1; h /= 2)                                                \
                    for (int j = 0; j < h; j++) r[j] += r[j + h];                              \
                float t = r[0];                                                                \
                for (size_t kk = k; kk < Cin; kk++)                                            \
                    t += x[(size_t)i * ldx + kk] * (q8 ? (float)Wq[(size_t)o * Cin + kk]       \
                                                    : wt == WT_B16                             \
                                                        ? bf16_value(Wb[(size_t)o * Cin + kk]) \
                                                        : Wf[(size_t)o * Cin + kk]);           \
                if (q8) t *= scale[o];                                                         \
                if (b) t += b[o];                                                              \
                out[(size_t)i * ldo + o] = t;                                                  \
            }                                                                                  \
    }

DEFINE_TILE(tile16, v16, v16u, 16, load_q16, load_b16)
DEFINE_TILE(tile8, v8, v8u, 8, load_q8, load_b8)
DEFINE_TILE(tile4, v4, v4u, 4, load_q4, load_b4)

/* the path's tile */
#define tile(out, ldo, x, ldx, Wf, Wq, Wb, scale, b, Cin, RT, OT, wt, isa)   \
    do {                                                                     \
        if ((isa) >= MC_ISA_AVX512)                                          \
            tile16(out, ldo, x, ldx, Wf, Wq, Wb, scale, b, Cin, RT, OT, wt); \
        else if ((isa) >= MC_ISA_AVX2)                                       \
            tile8(out, ldo, x, ldx, Wf, Wq, Wb, scale, b, Cin, RT, OT, wt);  \
        else                                                                 \
            tile4(out, ldo, x, ldx, Wf, Wq, Wb, scale, b, Cin, RT, OT, wt);  \
    } while (0)

/* outputs [r0, r1) of every row; the weights are W (fp32), Wq with scale
 * (int8) or Wb (bf16), whichever is not NULL */
MC_ISA_BODY void rows_block_body(float *out, const float *x, const float *W, const int8_t *Wq,
                                 const uint16_t *Wb, const float *scale, const float *b, size_t N,
                                 size_t Cin, size_t Cout, size_t r0, size_t r1, int isa)
{
    /* accumulators: 4x4 zmm of 32; 2x2 (8 ymm) of 16; 1x2 (8 xmm) of 16 */
    const int OT1 = isa >= MC_ISA_AVX2 ? 4 : 2; /* outputs of a one-row tile */
    const int RT = isa >= MC_ISA_AVX512 ? 4 : isa >= MC_ISA_AVX2 ? 2 : 1;
    const int OT = isa >= MC_ISA_AVX512 ? 4 : 2;
    const int wt = Wq ? WT_Q8 : Wb ? WT_B16 : WT_F32;
/* rows n.. (RT_ of them), outputs r.. (OT_ of them); the weight type a
 * constant in each branch, so the compiler drops the other loads */
#define TILE_AT(RT_, OT_)                                                                          \
    do {                                                                                           \
        float *o_ = out + n * Cout + r;                                                            \
        const float *x_ = x + n * Cin, *b_ = b ? b + r : NULL;                                     \
        if (wt == WT_Q8)                                                                           \
            tile(o_, Cout, x_, Cin, NULL, Wq + r * Cin, NULL, scale + r, b_, Cin, RT_, OT_, WT_Q8, \
                 isa);                                                                             \
        else if (wt == WT_B16)                                                                     \
            tile(o_, Cout, x_, Cin, NULL, NULL, Wb + r * Cin, NULL, b_, Cin, RT_, OT_, WT_B16,     \
                 isa);                                                                             \
        else                                                                                       \
            tile(o_, Cout, x_, Cin, W + r * Cin, NULL, NULL, NULL, b_, Cin, RT_, OT_, WT_F32,      \
                 isa);                                                                             \
    } while (0)
    size_t n = 0;
    for (; n + (size_t)RT <= N; n += (size_t)RT) {
        size_t r = r0;
        for (; r + (size_t)OT <= r1; r += (size_t)OT) TILE_AT(RT, OT);
        for (; r < r1; r++) TILE_AT(RT, 1);
    }
    /* rows past the last whole tile: one at a time, OT1 outputs a tile (independent
     * sums, so one row is not bound by one chain's latency) */
    for (; n < N; n++) {
        size_t r = r0;
        for (; r + (size_t)OT1 <= r1; r += (size_t)OT1) TILE_AT(1, OT1);
        for (; r < r1; r++) TILE_AT(1, 1);
    }
#undef TILE_AT
}

MC_ISA_VARIANTS_VOID(rows_block,
                     (float *out, const float *x, const float *W, const int8_t *Wq,
                      const uint16_t *Wb, const float *scale, const float *b, size_t N, size_t Cin,
                      size_t Cout, size_t r0, size_t r1),
                     (out, x, W, Wq, Wb, scale, b, N, Cin, Cout, r0, r1))

static void rows_fwd(mc_backend *be, float *out, const float *x, const float *W, const int8_t *Wq,
                     const uint16_t *Wb, const float *scale, const float *b, size_t N, size_t Cin,
                     size_t Cout)
{
    rows_block_fn f = rows_block_for(be->isa);
    size_t blocks = (Cout + ROWS_BLOCK - 1) / ROWS_BLOCK;
#pragma omp parallel for num_threads(be->threads) schedule(dynamic, 1)
    for (size_t k = 0; k < blocks; k++) {
        size_t r0 = k * ROWS_BLOCK, r1 = r0 + ROWS_BLOCK < Cout ? r0 + ROWS_BLOCK : Cout;
        f(out, x, W, Wq, Wb, scale, b, N, Cin, Cout, r0, r1);
    }
}

void mc_cpu_linear_rows_fwd(mc_backend *be, float *out, const float *x, const float *W,
                            const int8_t *Wq, const float *scale, const float *b, size_t N,
                            size_t Cin, size_t Cout)
{
    rows_fwd(be, out, x, W, Wq, NULL, scale, b, N, Cin, Cout);
}

void mc_cpu_linear_rows_bf16_fwd(mc_backend *be, float *out, const float *x, const uint16_t *Wb,
                                 const float *b, size_t N, size_t Cin, size_t Cout)
{
    rows_fwd(be, out, x, NULL, NULL, Wb, NULL, b, N, Cin, Cout);
}
