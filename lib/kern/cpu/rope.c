/*
 * rope.c - rotary position embedding ("rotate half", as Megatron and HF):
 * the pair (x_i, x_{i+R/2}) of every head's first R dims is rotated by the
 * angle p * inv_freq_i (mc_rope: base^(-2i/R), or Llama 3.1's scaled
 * frequencies), p = pos0 + t or the token's own position (packed
 * documents). Angles, cos and sin are computed in double and rounded once,
 * so long positions (T = 4096 and beyond) lose no accuracy.
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include "kern/cpu/cpu.h"

/* Rotate by +angle (forward) or -angle (backward: the transpose of a
 * rotation is its inverse, so dx = R^T dy rotates dy back). */
/* (cos, sign sin) of p inv_freq_i for the pairs i < half into cs[2 half] */
static void rope_row(float *cs, double p, size_t half, size_t D, const mc_rope *r, float sign)
{
    for (size_t i = 0; i < half; i++) {
        double inv = mc_rope_inv_freq(r, D, i);
        double a = p * inv;
        cs[2 * i] = (float)cos(a);
        cs[2 * i + 1] = sign * (float)sin(a);
    }
}

/* x1' = x1 cos - x2 sin;  x2' = x2 cos + x1 sin for the H heads (of D
 * dims, the first 2 half turned) of one token */
static void rope_apply(float *x, const float *cs, size_t H, size_t half, size_t D)
{
    for (size_t h = 0; h < H; h++) {
        float *x1 = x + h * D, *x2 = x1 + half;
        for (size_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1], a = x1[i], b = x2[i];
            x1[i] = a * c - b * s;
            x2[i] = b * c + a * s;
        }
    }
}

static void rope(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D, const mc_rope *r,
                 size_t pos0, const int32_t *pos, float sign)
{
    size_t R = r->rot_dim > 0 ? (size_t)r->rot_dim : D;
    assert(R % 2 == 0 && R <= D);
    size_t half = R / 2;
    if (pos) {
        /* per-token positions: each token's row of the table on its own
         * (the same formula, so the same bits as the shared table) */
        float *tab = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK,
                                    (size_t)be->threads * half * 2 * sizeof(float));
#pragma omp parallel num_threads(be->threads) if (B * T * H * D > 16384)
        {
            float *cs = tab + (size_t)omp_get_thread_num() * half * 2;
#pragma omp for schedule(static)
            for (size_t bt = 0; bt < B * T; bt++) {
                rope_row(cs, (double)pos[bt], half, D, r, sign);
                rope_apply(x + bt * H * D, cs, H, half, D);
            }
        }
        return;
    }
    /* table[t][i] = (cos, sin) of (pos0 + t) inv_freq_i, shared by B and H */
    float *tab = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, T * half * 2 * sizeof(float));
#pragma omp parallel for num_threads(be->threads) if (T * half > 4096) schedule(static)
    for (size_t t = 0; t < T; t++)
        rope_row(tab + t * half * 2, (double)(pos0 + t), half, D, r, sign);
#pragma omp parallel for num_threads(be->threads) if (B * T * H * D > 16384) schedule(static)
    for (size_t bt = 0; bt < B * T; bt++)
        rope_apply(x + bt * H * D, tab + (bt % T) * half * 2, H, half, D);
}

void mc_cpu_rope_fwd(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D,
                     const mc_rope *r, size_t pos0, const int32_t *pos)
{
    rope(be, x, B, T, H, D, r, pos0, pos, 1.0f);
}

void mc_cpu_rope_bwd(mc_backend *be, float *dx, size_t B, size_t T, size_t H, size_t D,
                     const mc_rope *r, size_t pos0, const int32_t *pos)
{
    rope(be, dx, B, T, H, D, r, pos0, pos, -1.0f);
}
