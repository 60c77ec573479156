/*
 * adamw.c - the fused AdamW update over one contiguous span of parameters.
 *
 * The update is memory-bound (28 bytes a parameter), so the loop must be
 * vectorized to run at memory speed: the span body has restrict pointers and
 * `omp simd` (GCC's -O2 cost model will not vectorize a loop that needs a
 * scalar tail or alias checks) and is compiled for each path (isa.h). Division
 * and sqrt are correctly rounded in every width and FP contraction is off, so
 * the bits equal the scalar loop's for any path and thread split.
 */
#include <assert.h>
#include <math.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define SPAN 8192 /* parameters per parallel work item */

/* g = grad * grad_scale
 * m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 * p -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)   (decoupled weight decay) */
MC_ISA_BODY void adamw_span_body(float *restrict p, const float *restrict grad, float *restrict m,
                                 float *restrict v, size_t n, float lr, float b1, float b2,
                                 float eps, float wd, float bc1, float bc2, float grad_scale,
                                 int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * p[i]);
    }
}
MC_ISA_VARIANTS_VOID(adamw_span,
                     (float *restrict p, const float *restrict grad, float *restrict m,
                      float *restrict v, size_t n, float lr, float b1, float b2, float eps,
                      float wd, float bc1, float bc2, float grad_scale),
                     (p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale))

void mc_cpu_adamw(mc_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                  float grad_scale)
{
    size_t items = (n + SPAN - 1) / SPAN;
#pragma omp parallel for num_threads(be->threads) if (items > 2) schedule(static)
    for (size_t it = 0; it < items; it++) {
        size_t i0 = it * SPAN, k = n - i0 < SPAN ? n - i0 : SPAN;
        adamw_span_for(be->isa)(p + i0, grad + i0, m + i0, v + i0, k, lr, b1, b2, eps, wd, bc1, bc2,
                                grad_scale);
    }
}

void mc_cpu_adamw_prepare(mc_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                          float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                          float grad_scale, mc_prec prec, void *pw, size_t cols)
{
    if (cols && mc_cpu_b16_panels(be, prec)) {
        /* a linear weight's panels: 16 rows at a time, packed while their
         * new values are in cache */
        assert(n % cols == 0);
        size_t O = n / cols, nb = (O + 15) / 16;
        int nt = mc_cpu_b16_stream(pw, O, cols);
#pragma omp parallel for num_threads(be->threads) if (nb > 1) schedule(static)
        for (size_t b = 0; b < nb; b++) {
            size_t i0 = b * 16 * cols, k = (O - b * 16 < 16 ? O - b * 16 : 16) * cols;
            adamw_span_for(be->isa)(p + i0, grad + i0, m + i0, v + i0, k, lr, b1, b2, eps, wd, bc1,
                                    bc2, grad_scale);
            mc_cpu_b16_pack_rows(pw, p, b * 16, O, cols, nt);
        }
        return;
    }
    size_t items = (n + SPAN - 1) / SPAN, es = mc_backend_weight_bytes(be, prec);
#pragma omp parallel for num_threads(be->threads) if (items > 2) schedule(static)
    for (size_t it = 0; it < items; it++) {
        size_t i0 = it * SPAN, k = n - i0 < SPAN ? n - i0 : SPAN;
        adamw_span_for(be->isa)(p + i0, grad + i0, m + i0, v + i0, k, lr, b1, b2, eps, wd, bc1, bc2,
                                grad_scale);
        mc_cpu_prepare_part(be, prec, (char *)pw + i0 * es, p + i0, k, n);
    }
}
