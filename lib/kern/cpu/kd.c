/*
 * kd.c - knowledge distillation's forward KL between a teacher's and a
 * student's vocab-parallel logits at a temperature (kern.h kd_sums, kd_loss,
 * kd_bwd), in the cross-entropy's manner (xent.c): row sums of exponentials
 * in double over LANES fixed lanes combined in lane order, so the bits depend
 * neither on the CPU nor on the thread count; the backward is written in
 * place over the student's logits, mixed with the cross-entropy's gradient.
 */
#include <math.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"
#include "kern/cpu/vexp.h"

#define PAR_MIN 16384
#define LANES 16

/* out = {zs, zt, x} of one row (kern_ops.def, kd_sums) */
MC_ISA_BODY void kd_row_sums_body(double *out, const float *s, const float *t, float sm, float tm,
                                  float it, size_t vl, int isa MC_ISA_UNUSED)
{
    double as[LANES] = {0}, at[LANES] = {0}, ax[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= vl; i += LANES) {
        float a[LANES], b[LANES], ea[LANES], eb[LANES];
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) {
            a[j] = (s[i + j] - sm) * it;
            b[j] = (t[i + j] - tm) * it;
        }
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) {
            ea[j] = mc_exp_fast(a[j]);
            eb[j] = mc_exp_fast(b[j]);
        }
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) {
            as[j] += (double)ea[j];
            at[j] += (double)eb[j];
            ax[j] += (double)eb[j] * (double)(b[j] - a[j]);
        }
    }
    for (size_t j = 0; i < vl; i++, j++) {
        float a = (s[i] - sm) * it, b = (t[i] - tm) * it, eb = mc_exp_fast(b);
        as[j] += (double)mc_exp_fast(a);
        at[j] += (double)eb;
        ax[j] += (double)eb * (double)(b - a);
    }
    double zs = 0.0, zt = 0.0, x = 0.0;
    for (size_t j = 0; j < LANES; j++) {
        zs += as[j];
        zt += at[j];
        x += ax[j];
    }
    out[0] = zs;
    out[1] = zt;
    out[2] = x;
}
MC_ISA_VARIANTS_VOID(kd_row_sums,
                     (double *out, const float *s, const float *t, float sm, float tm, float it,
                      size_t vl),
                     (out, s, t, sm, tm, it, vl))

void mc_cpu_kd_sums(mc_backend *be, float *sums, const float *s, const float *t, const float *smax,
                    const float *tmax, size_t N, size_t vl, float inv_tau)
{
#pragma omp parallel for num_threads(be->threads) if (N * vl > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        double r[3];
        kd_row_sums_for(be->isa)(r, s + i * vl, t + i * vl, smax[i], tmax[i], inv_tau, vl);
        sums[i] = (float)r[0];
        sums[N + i] = (float)r[1];
        sums[2 * N + i] = (float)r[2];
    }
}

void mc_cpu_kd_loss(mc_backend *be, float *kl, const float *sums, const int32_t *targets, size_t N)
{
    (void)be;
    for (size_t i = 0; i < N; i++) {
        float zs = sums[i], zt = sums[N + i], x = sums[2 * N + i];
        kl[i] = targets[i] < 0 ? 0.0f : x / zt - logf(zt) + logf(zs);
    }
}

MC_ISA_BODY void kd_row_grad_body(float *d, const float *s, const float *t, float sm, float tm,
                                  float it, float ce_w, float ce_inv, float kd_ws, float kd_wt,
                                  size_t vl, int isa MC_ISA_UNUSED)
{
    /* d may be s itself: each element is read before it is written */
#pragma omp simd
    for (size_t j = 0; j < vl; j++) {
        float a = s[j] - sm;
        d[j] = ce_w * (mc_exp_fast(a) * ce_inv) +
               (kd_ws * mc_exp_fast(a * it) - kd_wt * mc_exp_fast((t[j] - tm) * it));
    }
}
MC_ISA_VARIANTS_VOID(kd_row_grad,
                     (float *d, const float *s, const float *t, float sm, float tm, float it,
                      float ce_w, float ce_inv, float kd_ws, float kd_wt, size_t vl),
                     (d, s, t, sm, tm, it, ce_w, ce_inv, kd_ws, kd_wt, vl))

void mc_cpu_kd_bwd(mc_backend *be, float *d, const float *s, const float *t, const float *smax,
                   const float *sumexp, const float *tmax, const float *sums,
                   const int32_t *targets, int64_t v0, size_t N, size_t vl, float inv_tau,
                   float ce_scale, float kd_scale)
{
#pragma omp parallel for num_threads(be->threads) if (N * vl > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        float *di = d + i * vl;
        if (targets[i] < 0) {
            for (size_t j = 0; j < vl; j++) di[j] = 0.0f;
            continue;
        }
        kd_row_grad_for(be->isa)(di, s + i * vl, t + i * vl, smax[i], tmax[i], inv_tau, ce_scale,
                                 1.0f / sumexp[i], kd_scale / sums[i], kd_scale / sums[N + i], vl);
        int64_t tg = (int64_t)targets[i] - v0;
        if (tg >= 0 && tg < (int64_t)vl) di[tg] -= ce_scale;
    }
}
