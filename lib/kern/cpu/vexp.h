/*
 * vexp.h - private to the CPU backend: exp(x) in a form that vectorizes,
 * shared by the kernels that need one exp per element (the attention
 * softmax, GELU, SiLU). libm's expf/tanhf are a call per element and keep
 * those loops scalar.
 */
#ifndef MC_KERN_CPU_VEXP_H
#define MC_KERN_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

/* exp(x) for x in [-87, 88]: x = n ln2 + r with |r| <= ln2/2 (n rounded to
 * nearest by adding and subtracting 1.5*2^23, ln2 split in two so n ln2 is
 * exact), exp(r) by a degree-7 minimax polynomial (Cephes' expf
 * coefficients, about 1 ulp), times 2^n built in the exponent bits. Outside
 * the range x is clamped: below -87 the result is exp(-87) ~ 1.6e-38 (zero
 * next to any term of order 1), above 88 it is exp(88) ~ 1.7e38 (finite, so
 * 1 / (1 + exp(x)) goes to ~0 instead of NaN). Plain multiply-adds in a fixed
 * order (the build keeps FP contraction off): every vector width and every
 * path (isa.h) gives the same bits. */
static inline float mc_exp_fast(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n from t's bits: t = 1.5*2^23 + n lies in [2^23, 2^24), where a
     * float's low mantissa bits are n itself. Unsigned arithmetic, no
     * float-to-int conversion: a NaN x (diverged training) makes p NaN, and
     * the result stays NaN without the undefined (int32_t)NaN and the
     * left shift of a negative value UBSan reported here. */
    uint32_t tb, e;
    memcpy(&tb, &t, 4);
    e = (tb - 0x4B400000u + 127u) << 23;
    float two_n;
    memcpy(&two_n, &e, 4);
    return p * two_n;
}

#endif
