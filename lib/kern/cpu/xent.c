/*
 * xent.c - vocab-parallel softmax cross-entropy in three steps (kern.h), and
 * its backward written in place over the logits, so the [N, V] probability
 * matrix never exists beside the logits. Row sums of exponentials are
 * accumulated in double: a 50k-wide row summed in float loses digits.
 */
#include <math.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"
#include "kern/cpu/vexp.h"

#define PAR_MIN 16384
#define LANES 16

/* The row loops below keep LANES independent partial results (lane j takes
 * the elements j, j + LANES, ...) combined in lane order: a fixed order, so
 * the bits do not depend on the CPU or the thread count, that the compiler
 * keeps in vector registers. exp is vexp.h's polynomial (about 1 ulp). */

MC_ISA_BODY float row_max_body(const float *l, size_t vl, int isa MC_ISA_UNUSED)
{
    float acc[LANES];
    for (size_t j = 0; j < LANES; j++) acc[j] = -INFINITY;
    size_t i = 0;
    for (; i + LANES <= vl; i += LANES)
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) acc[j] = l[i + j] > acc[j] ? l[i + j] : acc[j];
    float m = -INFINITY;
    for (; i < vl; i++) m = l[i] > m ? l[i] : m;
    for (size_t j = 0; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}
MC_ISA_VARIANTS(float, row_max, (const float *l, size_t vl), (l, vl))

MC_ISA_BODY double row_sumexp_body(const float *l, float m, size_t vl, int isa MC_ISA_UNUSED)
{
    double acc[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= vl; i += LANES) {
        float e[LANES];
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) e[j] = mc_exp_fast(l[i + j] - m);
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) acc[j] += (double)e[j];
    }
    for (size_t j = 0; i < vl; i++, j++) acc[j] += (double)mc_exp_fast(l[i] - m);
    double s = 0.0;
    for (size_t j = 0; j < LANES; j++) s += acc[j];
    return s;
}
MC_ISA_VARIANTS(double, row_sumexp, (const float *l, float m, size_t vl), (l, m, vl))

MC_ISA_BODY void row_grad_body(float *d, const float *l, float m, float inv, float w, size_t vl,
                               int isa MC_ISA_UNUSED)
{
    /* d may be l itself: each element is read before it is written */
#pragma omp simd
    for (size_t j = 0; j < vl; j++) d[j] = w * (mc_exp_fast(l[j] - m) * inv);
}
MC_ISA_VARIANTS_VOID(row_grad, (float *d, const float *l, float m, float inv, float w, size_t vl),
                     (d, l, m, inv, w, vl))

/* rowmax[i] = max_j logits[i,j] */
void mc_cpu_xent_max(mc_backend *be, float *rowmax, const float *logits, size_t N, size_t vl)
{
#pragma omp parallel for num_threads(be->threads) if (N * vl > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        rowmax[i] = row_max_for(be->isa)(logits + i * vl, vl);
    }
}

/* sumexp[i] = sum_j exp(logits[i,j] - rowmax[i]);
 * tlogit[i] = logits[i, targets[i] - v0] when the target is in this shard */
void mc_cpu_xent_sumexp(mc_backend *be, float *sumexp, float *tlogit, const float *logits,
                        const float *rowmax, const int32_t *targets, int64_t v0, size_t N,
                        size_t vl)
{
#pragma omp parallel for num_threads(be->threads) if (N * vl > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *l = logits + i * vl;
        sumexp[i] = (float)row_sumexp_for(be->isa)(l, rowmax[i], vl);
        int64_t t = (int64_t)targets[i] - v0;
        tlogit[i] = targets[i] >= 0 && t >= 0 && t < (int64_t)vl ? l[t] : 0.0f;
    }
}

/* loss[i] = log(sumexp[i]) + rowmax[i] - tlogit[i], 0 for ignored targets */
void mc_cpu_xent_loss(mc_backend *be, float *loss, const float *rowmax, const float *sumexp,
                      const float *tlogit, const int32_t *targets, size_t N)
{
    (void)be;
    for (size_t i = 0; i < N; i++)
        loss[i] = targets[i] < 0 ? 0.0f : logf(sumexp[i]) + rowmax[i] - tlogit[i];
}

/* dlogits[i,j] = w_i (exp(logits[i,j] - rowmax[i]) / sumexp[i] - [j == targets[i] - v0])
 * with w_i = dloss[i] (or scale), 0 for ignored targets. Each element is read
 * before it is written, so dlogits may be logits. */
void mc_cpu_xent_bwd(mc_backend *be, float *dlogits, const float *logits, const float *rowmax,
                     const float *sumexp, const int32_t *targets, int64_t v0, size_t N, size_t vl,
                     const float *dloss, float scale, mc_prec round)
{
#pragma omp parallel for num_threads(be->threads) if (N * vl > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *l = logits + i * vl;
        float *d = dlogits + i * vl;
        if (targets[i] < 0) {
            for (size_t j = 0; j < vl; j++) d[j] = 0.0f;
            continue;
        }
        float w = dloss ? dloss[i] : scale, m = rowmax[i], inv = 1.0f / sumexp[i];
        row_grad_for(be->isa)(d, l, m, inv, w, vl);
        int64_t t = (int64_t)targets[i] - v0;
        if (t >= 0 && t < (int64_t)vl) d[t] -= w;
        mc_cpu_round_here(be, d, vl, round);
    }
}
