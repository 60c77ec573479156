/*
 * fp8.c - the FP8 emulation kernels (kern_ops.def amax, fp8_quantize,
 * fp8_out, axpy): values rounded to the E4M3 (OCP "fn": bias 7, 3 mantissa
 * bits, largest 448, no infinities) or E5M2 (bias 15, 2 mantissa bits,
 * largest 57344) grid after scaling, round to nearest even, saturating at
 * the largest finite value (Transformer Engine's cast), subnormals kept;
 * held in fp32, where a product of two is exact. Plain loops the compiler
 * vectorizes; every output element depends on its own inputs only, so the
 * bits do not depend on the thread count.
 */
#include <math.h>
#include <string.h>
#include "kern/cpu/cpu.h"

#define PAR_MIN 65536

/* v rounded to the FP8 grid: mantissa bits mb, smallest normal exponent
 * emin, largest value vmax (saturating; NaN stays NaN) */
static inline float fp8_round(float v, int mb, int emin, float vmax)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    uint32_t sign = u & 0x80000000u, au = u & 0x7fffffffu;
    float a;
    memcpy(&a, &au, 4);
    if (!(a < vmax)) { /* NaN stays, the rest saturates */
        if (a != a) return v;
        a = vmax;
    } else {
        int e = (int)(au >> 23) - 127; /* floor(log2 a) for a normal float */
        if (e < emin) e = emin;        /* subnormal FP8: a fixed quantum */
        /* (a + c) - c rounds a to a multiple of 2^(e - mb), nearest even,
         * for c = 2^(e - mb + 23) > a */
        uint32_t cb = (uint32_t)(e - mb + 23 + 127) << 23;
        float c;
        memcpy(&c, &cb, 4);
        volatile float t = a + c; /* no reassociation */
        a = t - c;
        if (a > vmax) a = vmax;
    }
    uint32_t r;
    memcpy(&r, &a, 4);
    r |= sign;
    memcpy(&a, &r, 4);
    return a;
}

float mc_cpu_amax(mc_backend *be, const float *x, size_t n)
{
    float m = 0.0f;
    int nan = 0;
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) reduction(max                   \
                                                                             : m) reduction(|      \
                                                                                            : nan) \
    schedule(static)
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        nan |= a != a;
        m = a > m ? a : m;
    }
    return nan ? NAN : m;
}

void mc_cpu_fp8_quantize(mc_backend *be, float *q, const float *x, size_t n, float scale, int e5m2)
{
    const int mb = e5m2 ? 2 : 3, emin = e5m2 ? -14 : -6;
    const float vmax = e5m2 ? 57344.0f : 448.0f;
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) q[i] = fp8_round(x[i] * scale, mb, emin, vmax);
}

void mc_cpu_fp8_out(mc_backend *be, float *out, size_t N, size_t O, float s, const float *b)
{
#pragma omp parallel for num_threads(be->threads) if (N * O > PAR_MIN) schedule(static)
    for (size_t r = 0; r < N; r++) {
        float *o = out + r * O;
        if (b)
            for (size_t j = 0; j < O; j++) o[j] = o[j] * s + b[j];
        else
            for (size_t j = 0; j < O; j++) o[j] *= s;
    }
}

void mc_cpu_axpy(mc_backend *be, float *y, const float *x, size_t n, float a)
{
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

void mc_cpu_amax_into(mc_backend *be, float *m, const float *x, size_t n)
{
    float a = mc_cpu_amax(be, x, n);
    if (!(a <= *m)) *m = a;
}

void mc_cpu_fp8_gemm(mc_backend *be, int which, float *out, const float *a, const float *b,
                     size_t N, size_t I, size_t O, int a_e5m2)
{
    (void)a_e5m2; /* the values carry their format */
    switch (which) {
    case 0: mc_cpu_linear_fwd(be, MC_PREC_FP32, out, a, b, NULL, NULL, N, I, O, 0.0f, 0); break;
    case 1:
        mc_cpu_fill(be, out, 0.0f, N * I);
        mc_cpu_linear_bwd(be, MC_PREC_FP32, out, NULL, NULL, a, NULL, b, NULL, N, I, O, 0);
        break;
    default:
        mc_cpu_fill(be, out, 0.0f, O * I);
        mc_cpu_linear_bwd(be, MC_PREC_FP32, NULL, out, NULL, a, b, NULL, NULL, N, I, O, 0);
    }
}
