/*
 * adamw.c - the fused AdamW update over one contiguous span of parameters.
 */
#include <math.h>
#include "kern/cpu/cpu.h"

/* g = grad * grad_scale
 * m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 * p -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)   (decoupled weight decay) */
void mc_k_adamw(mc_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                float grad_scale) {
#pragma omp parallel for num_threads(be->threads) if (n > 16384) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * p[i]);
    }
}
