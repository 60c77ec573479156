/*
 * rope.c - rotary position embedding ("rotate half", as Megatron and HF):
 * the pair (x_i, x_{i+D/2}) of every head is rotated by the angle
 * (pos0 + t) * base^(-2i/D). Angles, cos and sin are computed in double and
 * rounded once, so long positions (T = 4096 and beyond) lose no accuracy.
 */
#include <assert.h>
#include <math.h>
#include "kern/cpu/cpu.h"

/* Rotate by +angle (forward) or -angle (backward: the transpose of a
 * rotation is its inverse, so dx = R^T dy rotates dy back). */
static void rope(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D, float base,
                 size_t pos0, float sign)
{
    assert(D % 2 == 0);
    size_t half = D / 2;
    /* table[t][i] = (cos, sin) of (pos0 + t) inv_freq_i, shared by B and H */
    float *tab = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, T * half * 2 * sizeof(float));
#pragma omp parallel for num_threads(be->threads) if (T * half > 4096) schedule(static)
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < half; i++) {
            double inv = pow((double)base, -2.0 * (double)i / (double)D);
            double a = (double)(pos0 + t) * inv;
            tab[(t * half + i) * 2] = (float)cos(a);
            tab[(t * half + i) * 2 + 1] = sign * (float)sin(a);
        }
    }
    /* x1' = x1 cos - x2 sin;  x2' = x2 cos + x1 sin */
#pragma omp parallel for num_threads(be->threads) if (B * T * H * D > 16384) schedule(static)
    for (size_t bt = 0; bt < B * T; bt++) {
        const float *cs = tab + (bt % T) * half * 2;
        for (size_t h = 0; h < H; h++) {
            float *x1 = x + (bt * H + h) * D, *x2 = x1 + half;
            for (size_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1], a = x1[i], b = x2[i];
                x1[i] = a * c - b * s;
                x2[i] = b * c + a * s;
            }
        }
    }
}

void mc_cpu_rope_fwd(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D, float base,
                     size_t pos0)
{
    rope(be, x, B, T, H, D, base, pos0, 1.0f);
}

void mc_cpu_rope_bwd(mc_backend *be, float *dx, size_t B, size_t T, size_t H, size_t D, float base,
                     size_t pos0)
{
    rope(be, dx, B, T, H, D, base, pos0, -1.0f);
}
