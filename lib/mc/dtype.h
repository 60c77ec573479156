/*
 * dtype.h - element types, numbered as Megatron's indexed dataset numbers them
 * (megatron/core/datasets/indexed_dataset.py, DType), so the codes written in
 * a .idx file are these values. Also the conversions of fp32 to and from
 * the 16-bit floats that files store (checkpoints, safetensors, llm.c).
 */
#ifndef MC_DTYPE_H
#define MC_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_dtype {
    MC_DTYPE_U8 = 1,
    MC_DTYPE_I8 = 2,
    MC_DTYPE_I16 = 3,
    MC_DTYPE_I32 = 4,
    MC_DTYPE_I64 = 5,
    MC_DTYPE_F64 = 6,
    MC_DTYPE_F32 = 7,
    MC_DTYPE_U16 = 8
} mc_dtype;

/* Size in bytes of one element; 0 for an unknown code. */
size_t mc_dtype_size(int code);
/* numpy's name ("uint16"); NULL for an unknown code. */
const char *mc_dtype_name(int code);

/* fp32 <-> bfloat16 and IEEE binary16 (float16) as files store them,
 * rounding to nearest even, NaNs kept (quiet) NaNs; inline, for loops that
 * convert an element at a time. The kernels' own (lib/kern/fpconv.h) give
 * the same bits. */

/* bf16 = the top 16 bits of the fp32 pattern, rounded to nearest even:
 * adding 0x7fff plus the lowest kept bit carries into the kept half exactly
 * when the dropped half is above one half, or equal with an odd kept half.
 * NaNs stay (quiet) NaNs instead of rounding into infinities. */
static inline uint16_t mc_dtype_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mc_dtype_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> binary16, round to nearest even.
 *   normal half:    exponent rebias 127 -> 15, keep 10 of 23 mantissa bits,
 *                   round on the 13 dropped bits (a carry may reach inf);
 *   subnormal half: value = q * 2^-24 with q = round(|x| * 2^24).  */
static inline uint16_t mc_dtype_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, NaN (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14 */
        int e = (int)(a >> 23);
        if (e < 102) /* below 2^-25: rounds to zero */
            return (uint16_t)sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u; /* |x| = m * 2^(e-150) */
        int shift = 126 - e;                      /* q = m * 2^(e-126) */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

#ifdef __cplusplus
}
#endif
#endif
