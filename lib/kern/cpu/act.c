/*
 * act.c - activations: GELU (tanh approximation, GPT-2) and SwiGLU (Llama,
 * Megatron's layout: the fc1 output holds (a | b) along the last dim).
 */
#include <math.h>
#include "kern/cpu/cpu.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define PAR_MIN 16384

/* y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))) */
void mc_k_gelu_fwd(mc_backend *be, float *out, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + 0.044715f * v * v * v)));
    }
}

/* u = k (x + 0.044715 x^3), t = tanh u:
 * dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2);  dx += dout dy/dx */
void mc_k_gelu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->threads) if (n > PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float t = tanhf(GELU_K * (v + 0.044715f * v * v * v));
        float d = 0.5f * (1.0f + t) +
                  0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] += dout[i] * d;
    }
}

/* out[i,j] = silu(a) b with a = x[i,j], b = x[i,F+j], silu(a) = a sigmoid(a) */
void mc_k_swiglu_fwd(mc_backend *be, float *out, const float *x, size_t N, size_t F) {
#pragma omp parallel for num_threads(be->threads) if (N * F > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *a = x + i * 2 * F, *b = a + F;
        float *o = out + i * F;
        for (size_t j = 0; j < F; j++) o[j] = a[j] / (1.0f + expf(-a[j])) * b[j];
    }
}

/* s = sigmoid(a): da += dout b s (1 + a (1 - s)); db += dout a s */
void mc_k_swiglu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t N,
                     size_t F) {
#pragma omp parallel for num_threads(be->threads) if (N * F > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *a = x + i * 2 * F, *b = a + F, *g = dout + i * F;
        float *da = dx + i * 2 * F, *db = da + F;
        for (size_t j = 0; j < F; j++) {
            float s = 1.0f / (1.0f + expf(-a[j]));
            da[j] += g[j] * b[j] * s * (1.0f + a[j] * (1.0f - s));
            db[j] += g[j] * a[j] * s;
        }
    }
}
