/*
 * fpconv.h - the scalar conversions between fp32 and bf16, fp16 and tf32
 * that both backends use (the CPU kernels and, compiled by nvcc as host and
 * device functions, the CUDA ones), so the two round alike bit for bit.
 */
#ifndef MC_KERN_FPCONV_H
#define MC_KERN_FPCONV_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MC_FPCONV __host__ __device__ static inline
#else
#define MC_FPCONV static inline
#endif

/* bf16 = the top half of an fp32, rounded to nearest even; NaN stays NaN
 * (made quiet) instead of rounding into infinity. */
MC_FPCONV uint16_t mc_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

MC_FPCONV float mc_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* IEEE binary16, round to nearest even, with subnormals; |x| >= 65520
 * overflows to infinity; NaN keeps its top payload bits and is made quiet. */
MC_FPCONV uint16_t mc_f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to inf */
    if (x < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (x <= 0x33000000u) return sign;                   /* <= 2^-25 rounds to 0 */
        /* value = m 2^(e-150); in units of 2^-24 that is m >> (126 - e) */
        uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e, h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    /* normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits */
    uint32_t h = (x - 0x38000000u) >> 13, rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

MC_FPCONV float mc_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else { /* subnormal: m 2^-24, exact in fp32 */
        float f = (float)m * 0x1p-24f;
        memcpy(&x, &f, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* TF32 (8-bit exponent, 10-bit mantissa) held in an fp32: drop the low 13
 * mantissa bits, rounding to nearest even; inf and NaN pass through. */
MC_FPCONV float mc_round_tf32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7f800000u) != 0x7f800000u) {
        x += 0xfffu + ((x >> 13) & 1u);
        x &= 0xffffe000u;
    }
    memcpy(&f, &x, 4);
    return f;
}

#endif
