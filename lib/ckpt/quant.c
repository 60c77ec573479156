/*
 * quant.c - the quantizers of mc checkpoints: int8 per row, fp8 (E4M3FN)
 * per tensor, int4 per group of a row; the E4M3FN conversions and the
 * int4 packing (formats and bounds in quant.h and mc-formats(5)).
 *
 * Each level is chosen in double from the scale as it will be stored
 * (fp32), so the stored pair (q, scale) is the best one for that scale and
 * the documented bound holds whatever rounding the scale itself took.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "mc/quant.h"

/* E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 15
 * with mantissa 7 is NaN, there is no infinity. Normal values
 * (8 + m) * 2^(e - 10), subnormal m * 2^-9. */
static uint8_t fp8_from_double(double y)
{
    uint8_t s = signbit(y) ? 0x80 : 0;
    double a = fabs(y);
    if (a >= 448.0) return s | 0x7e; /* saturate: 1.75 * 2^8 */
    if (a < 0x1p-6) {
        /* m * 2^-9; m = 8 is 2^-6, the smallest normal, which is exactly
         * the bit pattern of exponent 1, mantissa 0. */
        return s | (uint8_t)nearbyint(a * 512.0);
    }
    int e;
    double f = frexp(a, &e);                       /* a = f * 2^e, f in [0.5, 1) */
    int m = (int)nearbyint((2.0 * f - 1.0) * 8.0); /* exact product: ties to even */
    int E = e - 1 + 7;
    if (m == 8) {
        m = 0;
        E++;
    }
    if (E > 15 || (E == 15 && m > 6)) return s | 0x7e;
    return (uint8_t)(s | (E << 3) | m);
}

uint8_t mc_fp8_e4m3_from_f32(float x)
{
    if (isnan(x)) return (uint8_t)((signbit(x) ? 0x80 : 0) | 0x7f);
    return fp8_from_double((double)x);
}

float mc_fp8_e4m3_to_f32(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), e - 10);
    return (b & 0x80) ? -v : v;
}

/* Largest |x| of n values; the index of the first non-finite one, or -1. */
static int64_t absmax(const float *x, int64_t n, float *out)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return i;
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    *out = m;
    return -1;
}

/* round(x / scale) clamped to [-lim, lim]; 0 for a zero scale. */
static int level(float x, float scale, int lim)
{
    if (scale == 0.0f) return 0;
    double q = round((double)x / (double)scale);
    if (q > lim) q = lim;
    if (q < -lim) q = -lim;
    return (int)q;
}

int64_t mc_quant_int8(const float *x, int64_t rows, int64_t cols, int8_t *q, float *scale)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float m;
        int64_t bad = absmax(xr, cols, &m);
        if (bad >= 0) return r * cols + bad;
        float s = (float)((double)m / 127.0);
        scale[r] = s;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = (int8_t)level(xr[c], s, 127);
    }
    return -1;
}

int64_t mc_quant_fp8(const float *x, int64_t n, uint8_t *q, float *scale)
{
    float m;
    int64_t bad = absmax(x, n, &m);
    if (bad >= 0) return bad;
    float s = (float)((double)m / 448.0);
    *scale = s;
    for (int64_t i = 0; i < n; i++)
        q[i] = s == 0.0f ? 0 : fp8_from_double((double)x[i] / (double)s);
    return -1;
}

int64_t mc_quant_int4_groups(int64_t cols, int64_t group_size)
{
    return (cols + group_size - 1) / group_size;
}

int64_t mc_quant_int4(const float *x, int64_t rows, int64_t cols, int64_t group_size, int8_t *q,
                      float *scale)
{
    int64_t ng = mc_quant_int4_groups(cols, group_size);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t c0 = g * group_size, n = cols - c0 < group_size ? cols - c0 : group_size;
            const float *xg = x + r * cols + c0;
            float m;
            int64_t bad = absmax(xg, n, &m);
            if (bad >= 0) return r * cols + c0 + bad;
            float s = (float)((double)m / 7.0);
            scale[r * ng + g] = s;
            for (int64_t c = 0; c < n; c++) q[r * cols + c0 + c] = (int8_t)level(xg[c], s, 7);
        }
    return -1;
}

void mc_int4_pack(const int8_t *q, int64_t rows, int64_t cols, uint8_t *packed)
{
    int64_t rb = (cols + 1) / 2;
    memset(packed, 0, (size_t)(rows * rb));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            unsigned nib = (unsigned)q[r * cols + c] & 15u;
            packed[r * rb + c / 2] |= (uint8_t)((c & 1) ? nib << 4 : nib);
        }
}
