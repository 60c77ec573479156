/*
 * att_tile.h - private to the CPU backend: the register-tiled inner
 * products of the attention kernels (attention_kv.c's forward,
 * attention.c's backward). A tile is RT = 4 query rows against a block of
 * BK = 64 keys, worked on in native vectors of the path (isa.h): 16 floats
 * (a zmm register) on avx512, 8 (ymm) on avx2, 4 (xmm) on the baseline, in
 * tiles of RT x J vectors so that the accumulators and the loads fit the
 * register file without spilling: 4 x 4 of the 32 zmm, 4 x 2 of the 16 ymm
 * or xmm (att_tile_impl.h is the code, included once per vector width).
 *
 * Every element sees the same operations in the same order in a tile, in a
 * vector or alone, at every width: each sum runs over its index in order,
 * multiplications and additions are separate (the build does not contract
 * them). So the tiles, the paths and the thread count change no bit.
 * Include only in functions compiled for a path (MC_ISA_VARIANTS): the
 * helpers are always inlined, and `isa` must be a constant there.
 */
#ifndef MC_KERN_CPU_ATT_TILE_H
#define MC_KERN_CPU_ATT_TILE_H

#include <stddef.h>
#include <string.h>
#include "kern/cpu/isa.h"

#define BK 64 /* keys per block */
#define RT 4  /* query rows per register tile */

/* GCC vector types of each path's native width. A vector wider than the
 * target's registers would be kept in memory, so each path uses its own. */
typedef float att_v16 __attribute__((vector_size(64)));
typedef float att_v8 __attribute__((vector_size(32)));
typedef float att_v4 __attribute__((vector_size(16)));

/* (macros, not functions: a function taking or returning a vector would
 * have a different ABI in each path) Unaligned loads and stores. */
#define vld(VT, p)                   \
    __extension__({                  \
        VT v_;                       \
        memcpy(&v_, (p), sizeof v_); \
        v_;                          \
    })
#define vst(p, v)                    \
    do {                             \
        __typeof__(v) t_ = (v);      \
        memcpy((p), &t_, sizeof t_); \
    } while (0)

#define ATT_INLINE static inline __attribute__((always_inline))

/* s[0] + ... + s[BK-1] in a fixed order: t_j = (s_j + s_{j+16}) + (s_{j+32}
 * + s_{j+48}) for the 16 lanes j, then the lanes added by halving (the same
 * order at every vector width, and a short dependency chain where a running
 * sum is 64 adds). */
ATT_INLINE float att_rowsum(const float *s)
{
    float t[16];
    for (int j = 0; j < 16; j++) t[j] = (s[j] + s[j + 16]) + (s[j + 32] + s[j + 48]);
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) t[j] += t[j + w];
    return t[0];
}

#define ATT_VT att_v16
#define ATT_L 16
#define ATT_J 4
#define ATT_SFX _v16
#include "kern/cpu/att_tile_impl.h"

#define ATT_VT att_v8
#define ATT_L 8
#define ATT_J 2
#define ATT_SFX _v8
#include "kern/cpu/att_tile_impl.h"

#define ATT_VT att_v4
#define ATT_L 4
#define ATT_J 2
#define ATT_SFX _v4
#include "kern/cpu/att_tile_impl.h"

/* The entry points: the width of path `isa` (a constant once inlined). */
#define ATT_PICK(isa, name, ...)       \
    do {                               \
        if ((isa) == MC_ISA_AVX512)    \
            name##_v16(__VA_ARGS__);   \
        else if ((isa) == MC_ISA_AVX2) \
            name##_v8(__VA_ARGS__);    \
        else                           \
            name##_v4(__VA_ARGS__);    \
    } while (0)

/* S[r][c] = sum_d q_r[d] Kt[d][c] (d in order) for the RT rows and BK keys */
#define att_scores(isa, S, qr, Kt, D) ATT_PICK(isa, att_scores, S, qr, Kt, D)
/* the same for one row: S[c] = sum_d q[d] Kt[d][c] */
#define att_scores1(isa, S, q, Kt, D) ATT_PICK(isa, att_scores1, S, q, Kt, D)
/* Kt[d][c] = kr[c][d] for the D dims and the nk keys of a block (rows kr,
 * anywhere), 0 for c >= nk: plain copies, so the layout changes no bit */
#define att_kt(isa, Kt, kr, nk, D) ATT_PICK(isa, att_kt, Kt, kr, nk, D)
/* o_r = o_r corr_r + sum_{c0 <= c < c1} P[r][c] v_c for rows r < nr */
#define att_rows(isa, ...) ATT_PICK(isa, att_rows, __VA_ARGS__)
/* X_c += sum_{r < nr} P[r][c] y_r for keys c in [c0, c1) */
#define att_cols(isa, ...) ATT_PICK(isa, att_cols, __VA_ARGS__)

#endif
