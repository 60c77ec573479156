/*
 * att_tile.h - private to the CPU backend: the register-tiled inner
 * products of the attention kernels (attention_kv.c's forward,
 * attention.c's backward). A tile is RT = 4 query rows against a block of
 * BK = 64 keys; GCC vector types hold 16 floats (a zmm register on
 * x86-64-v4, two ymm on v3, four xmm otherwise). Every element sees the
 * same operations in the same order in a tile as alone (one row at a time):
 * each sum runs over its index in order, multiplications and additions are
 * separate (the build does not contract them), so the tiles change no bit.
 * Include only in functions compiled as target clones (the helpers are
 * always inlined).
 */
#ifndef MC_KERN_CPU_ATT_TILE_H
#define MC_KERN_CPU_ATT_TILE_H

#include <stddef.h>
#include <string.h>

#define BK 64 /* keys per block (att_scores holds a row's 64 scores in 4 vectors) */
#define RT 4  /* query rows per register tile */

/* 16 floats as one value (GCC vector extension): a zmm register on
 * x86-64-v4, two ymm on v3, four xmm otherwise; the same operations on
 * each element whatever the width. Unaligned loads and stores through memcpy. */
typedef float vf16 __attribute__((vector_size(64)));
/* (macros, not functions: a function taking or returning a 64-byte vector
 * would have a different ABI in each clone) */
#define vld(p)                       \
    __extension__({                  \
        vf16 v_;                     \
        memcpy(&v_, (p), sizeof v_); \
        v_;                          \
    })
#define vst(p, v)                    \
    do {                             \
        vf16 t_ = (v);               \
        memcpy((p), &t_, sizeof t_); \
    } while (0)

#define ATT_INLINE static inline __attribute__((always_inline))

/* s[0] + ... + s[BK-1] in a fixed order: four 16-wide partial sums added
 * pairwise, then the 16 lanes by halving (the same order at every vector
 * width, and a short dependency chain where a running sum is 64 adds). */
ATT_INLINE float att_rowsum(const float *s)
{
    vf16 a = (vld(s) + vld(s + 16)) + (vld(s + 32) + vld(s + 48));
    float t[16];
    vst(t, a);
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) t[j] += t[j + w];
    return t[0];
}

/* S[r][c] = sum_d q_r[d] Kt[d][c] (d in order) for RT = 4 rows and the BK =
 * 64 keys of a block: 16 vector accumulators, each key-block row of Kt
 * loaded once for the four query rows. */
ATT_INLINE void att_scores(float *S, const float *const qr[RT], const float *Kt, size_t D)
{
    vf16 acc[RT][BK / 16];
#pragma GCC unroll 4
    for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
        for (int j = 0; j < BK / 16; j++) acc[r][j] = (vf16){0};
    for (size_t d = 0; d < D; d++) {
        vf16 k[BK / 16];
#pragma GCC unroll 4
        for (int j = 0; j < BK / 16; j++) k[j] = vld(Kt + d * BK + 16 * j);
#pragma GCC unroll 4
        for (int r = 0; r < RT; r++) {
            float x = qr[r][d];
#pragma GCC unroll 4
            for (int j = 0; j < BK / 16; j++) acc[r][j] += x * k[j];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
        for (int j = 0; j < BK / 16; j++) vst(S + r * BK + 16 * j, acc[r][j]);
}

/* The same for one row: S[c] = sum_d q[d] Kt[d][c]. */
ATT_INLINE void att_scores1(float *S, const float *q, const float *Kt, size_t D)
{
    vf16 acc[BK / 16];
#pragma GCC unroll 4
    for (int j = 0; j < BK / 16; j++) acc[j] = (vf16){0};
    for (size_t d = 0; d < D; d++) {
        float x = q[d];
#pragma GCC unroll 4
        for (int j = 0; j < BK / 16; j++) acc[j] += x * vld(Kt + d * BK + 16 * j);
    }
#pragma GCC unroll 4
    for (int j = 0; j < BK / 16; j++) vst(S + 16 * j, acc[j]);
}

/* For rows r < nr (nr = RT: a tile; otherwise one row at a time), o_r at
 * o + r ostride, v_c at v + c vstride:
 * o_r = o_r * corr_r + sum_{c0 <= c < c1} P[r][c] v_c, keys in order, the
 * columns of o in vectors of 64 and 16 and then one by one: each element
 * sees the same operations in the same order whichever path it takes. */
ATT_INLINE void att_rows(float *o, size_t ostride, size_t D, const float *P, const float *corr,
                         const float *v, size_t vstride, size_t c0, size_t c1, int nr)
{
    size_t d = 0;
    if (nr == RT) {
        for (; d + 64 <= D; d += 64) {
            vf16 acc[RT][4];
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) acc[r][j] = vld(o + r * ostride + d + 16 * j) * corr[r];
            for (size_t c = c0; c < c1; c++) {
                vf16 vv[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) vv[j] = vld(v + c * vstride + d + 16 * j);
#pragma GCC unroll 4
                for (int r = 0; r < RT; r++) {
                    float p = P[r * BK + c];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) acc[r][j] += p * vv[j];
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) vst(o + r * ostride + d + 16 * j, acc[r][j]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float *orow = o + r * ostride;
        const float *pr = P + r * BK;
        size_t e = d;
        for (; e + 64 <= D; e += 64) { /* four independent sums at a time */
            vf16 acc[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[j] = vld(orow + e + 16 * j) * corr[r];
            for (size_t c = c0; c < c1; c++) {
                float p = pr[c];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) acc[j] += p * vld(v + c * vstride + e + 16 * j);
            }
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) vst(orow + e + 16 * j, acc[j]);
        }
        for (; e + 16 <= D; e += 16) {
            vf16 acc = vld(orow + e) * corr[r];
            for (size_t c = c0; c < c1; c++) acc += pr[c] * vld(v + c * vstride + e);
            vst(orow + e, acc);
        }
        for (; e < D; e++) {
            float acc = orow[e] * corr[r];
            for (size_t c = c0; c < c1; c++) acc += pr[c] * v[c * vstride + e];
            orow[e] = acc;
        }
    }
}

/* For keys c in [c0, c1): X_c += sum_{r < nr} P[r][c] y_r (rows r in order;
 * X_c at X + c D, y_r at y[r]), columns in vectors of 64 and 16 and then one
 * by one. nr = RT: the y rows' columns are loaded once for all the keys. */
ATT_INLINE void att_cols(float *X, size_t D, const float *P, const float *const y[RT], size_t c0,
                         size_t c1, int nr)
{
    size_t d = 0;
    if (nr == RT) {
        for (; d + 64 <= D; d += 64) {
            vf16 yy[RT][4];
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) yy[r][j] = vld(y[r] + d + 16 * j);
            for (size_t c = c0; c < c1; c++) {
                vf16 acc[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) acc[j] = vld(X + c * D + d + 16 * j);
#pragma GCC unroll 4
                for (int r = 0; r < RT; r++) {
                    float p = P[r * BK + c];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) acc[j] += p * yy[r][j];
                }
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) vst(X + c * D + d + 16 * j, acc[j]);
            }
        }
    }
    for (; d + 16 <= D; d += 16)
        for (size_t c = c0; c < c1; c++) {
            vf16 acc = vld(X + c * D + d);
            for (int r = 0; r < nr; r++) acc += P[r * BK + c] * vld(y[r] + d);
            vst(X + c * D + d, acc);
        }
    for (; d < D; d++)
        for (size_t c = c0; c < c1; c++) {
            float acc = X[c * D + d];
            for (int r = 0; r < nr; r++) acc += P[r * BK + c] * y[r][d];
            X[c * D + d] = acc;
        }
}

#endif
