/*
 * act.c - activations: GELU (tanh approximation, GPT-2) and SwiGLU (Llama,
 * Megatron's layout: the fc1 output holds (a | b) along the last dim). Every
 * kernel is elementwise, on vexp.h's vectorizable exp, and gives the same
 * bits with every vector width and thread split (see below).
 */
/* No partial redundancy elimination in this file (GCC's -ftree-pre): it
 * translated `v / (1 + exp(x))` through the clamp inside mc_exp_fast (x
 * above 88 takes 88) into a second division v / (1 + exp(88)), which the
 * vectorizer then computes for every lane and blends away; that quotient
 * is subnormal for |v| < 1.9, and each vector paid a microcode assist:
 * the AVX2 GELU forward ran at 14 ns an element (11x the AVX-512 one, whose
 * masked division takes no assist). Removing an optimization changes no
 * result. Placed before the includes so that mc_exp_fast, inlined here,
 * carries the same options as its callers. */
#if defined(__GNUC__) && !defined(__clang__) /* a GCC pass: clang has no tree-PRE */
#pragma GCC optimize("no-tree-pre")
#endif

#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"
#include "kern/cpu/vexp.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f
#define SPAN 4096 /* elements per parallel work item (any split gives the same bits) */

/* The loops call the vectorizable exp of vexp.h instead of libm's tanhf/expf
 * (a call per element, which kept them scalar and made GELU ~9% of a GPT-2
 * step); tanh is rewritten through the logistic function,
 * sigma(z) = 1 / (1 + exp(-z)), which has no cancellation:
 *   0.5 (1 + tanh u) = sigma(2u),   1 - tanh^2 u = 4 sigma(2u) (1 - sigma(2u)),
 *   1 - sigma(z) = exp(-z) sigma(z).
 * Each span body is compiled for each path (isa.h, picked per backend); FP
 * contraction is off in this build, so every path, vector width and thread
 * split gives the same bits. */

/* y = 0.5 x (1 + tanh u) = x sigma(2u) = x / (1 + exp(-2u)),  u = k (x + c x^3) */
MC_ISA_BODY void gelu_fwd_span_body(float *restrict out, const float *restrict x, size_t n,
                                    int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_K * (v + GELU_C * v * v * v);
        out[i] = v / (1.0f + mc_exp_fast(-2.0f * u));
    }
}
MC_ISA_VARIANTS_VOID(gelu_fwd_span, (float *restrict out, const float *restrict x, size_t n),
                     (out, x, n))

/* dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3c x^2) with t = tanh u
 *       = s + 2 x s (1 - s) k (1 + 3c x^2),   s = sigma(2u), s (1 - s) = e s^2, e = exp(-2u)
 * (one expression for both backward kernels: the same bits) */
static inline __attribute__((always_inline)) float gelu_dydx(float v)
{
    float u = GELU_K * (v + GELU_C * v * v * v);
    float e = mc_exp_fast(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    return s + 2.0f * v * (e * s * s) * GELU_K * (1.0f + 3.0f * GELU_C * v * v);
}

/* dx += dout dy/dx */
MC_ISA_BODY void gelu_bwd_span_body(float *restrict dx, const float *restrict dout,
                                    const float *restrict x, size_t n, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float d = gelu_dydx(x[i]);
        dx[i] += dout[i] * d;
    }
}
MC_ISA_VARIANTS_VOID(gelu_bwd_span,
                     (float *restrict dx, const float *restrict dout, const float *restrict x,
                      size_t n),
                     (dx, dout, x, n))

/* In place (mc_k_gelu_bwd_inplace): x := 0 + dout dy/dx, the value the
 * accumulating kernel gives onto a zeroed dx (the same expression, so the
 * same bits; 0 + makes a -0 product +0 as it does there). */
MC_ISA_BODY void gelu_bwd_inplace_span_body(float *restrict x, const float *restrict dout,
                                            size_t n, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float d = gelu_dydx(x[i]);
        x[i] = 0.0f + dout[i] * d;
    }
}
MC_ISA_VARIANTS_VOID(gelu_bwd_inplace_span, (float *restrict x, const float *restrict dout, size_t n),
                     (x, dout, n))

void mc_cpu_gelu_fwd(mc_backend *be, float *out, const float *x, size_t n, mc_prec round)
{
    size_t items = (n + SPAN - 1) / SPAN;
#pragma omp parallel for num_threads(be->threads) if (items > 4) schedule(static)
    for (size_t it = 0; it < items; it++) {
        size_t i0 = it * SPAN, m = n - i0 < SPAN ? n - i0 : SPAN;
        gelu_fwd_span_for(be->isa)(out + i0, x + i0, m);
        mc_cpu_round_here(be, out + i0, m, round);
    }
}

void mc_cpu_gelu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t n)
{
    size_t items = (n + SPAN - 1) / SPAN;
#pragma omp parallel for num_threads(be->threads) if (items > 4) schedule(static)
    for (size_t it = 0; it < items; it++) {
        size_t i0 = it * SPAN, m = n - i0 < SPAN ? n - i0 : SPAN;
        gelu_bwd_span_for(be->isa)(dx + i0, dout + i0, x + i0, m);
    }
}

void mc_cpu_gelu_bwd_inplace(mc_backend *be, float *x, const float *dout, size_t n)
{
    size_t items = (n + SPAN - 1) / SPAN;
#pragma omp parallel for num_threads(be->threads) if (items > 4) schedule(static)
    for (size_t it = 0; it < items; it++) {
        size_t i0 = it * SPAN, m = n - i0 < SPAN ? n - i0 : SPAN;
        gelu_bwd_inplace_span_for(be->isa)(x + i0, dout + i0, m);
    }
}

/* o[j] = silu(a) b = a / (1 + exp(-a)) b,  a = x[i,j], b = x[i,F+j] */
MC_ISA_BODY void swiglu_fwd_row_body(float *restrict o, const float *restrict a,
                                     const float *restrict b, size_t F, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t j = 0; j < F; j++) o[j] = a[j] / (1.0f + mc_exp_fast(-a[j])) * b[j];
}
MC_ISA_VARIANTS_VOID(swiglu_fwd_row,
                     (float *restrict o, const float *restrict a, const float *restrict b,
                      size_t F),
                     (o, a, b, F))

/* s = sigma(a), 1 - s = e s with e = exp(-a):
 * da += dout b s (1 + a (1 - s)) = dout b s (1 + a e s);  db += dout a s */
MC_ISA_BODY void swiglu_bwd_row_body(float *restrict da, float *restrict db,
                                     const float *restrict g, const float *restrict a,
                                     const float *restrict b, size_t F, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t j = 0; j < F; j++) {
        float e = mc_exp_fast(-a[j]);
        float s = 1.0f / (1.0f + e);
        da[j] += g[j] * b[j] * s * (1.0f + a[j] * e * s);
        db[j] += g[j] * a[j] * s;
    }
}
MC_ISA_VARIANTS_VOID(swiglu_bwd_row,
                     (float *restrict da, float *restrict db, const float *restrict g,
                      const float *restrict a, const float *restrict b, size_t F),
                     (da, db, g, a, b, F))

/* In place: (a | b) := (da | db), each 0 + the accumulating kernel's term */
MC_ISA_BODY void swiglu_bwd_inplace_row_body(float *restrict a, float *restrict b,
                                             const float *restrict g, size_t F,
                                             int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t j = 0; j < F; j++) {
        float av = a[j], bv = b[j];
        float e = mc_exp_fast(-av);
        float s = 1.0f / (1.0f + e);
        a[j] = 0.0f + g[j] * bv * s * (1.0f + av * e * s);
        b[j] = 0.0f + g[j] * av * s;
    }
}
MC_ISA_VARIANTS_VOID(swiglu_bwd_inplace_row,
                     (float *restrict a, float *restrict b, const float *restrict g, size_t F),
                     (a, b, g, F))

void mc_cpu_swiglu_fwd(mc_backend *be, float *out, const float *x, size_t N, size_t F,
                       mc_prec round)
{
#pragma omp parallel for num_threads(be->threads) if (N * F > 4 * SPAN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *a = x + i * 2 * F;
        swiglu_fwd_row_for(be->isa)(out + i * F, a, a + F, F);
        mc_cpu_round_here(be, out + i * F, F, round);
    }
}

void mc_cpu_swiglu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t N,
                       size_t F)
{
#pragma omp parallel for num_threads(be->threads) if (N * F > 4 * SPAN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *a = x + i * 2 * F;
        float *da = dx + i * 2 * F;
        swiglu_bwd_row_for(be->isa)(da, da + F, dout + i * F, a, a + F, F);
    }
}

void mc_cpu_swiglu_bwd_inplace(mc_backend *be, float *x, const float *dout, size_t N, size_t F)
{
#pragma omp parallel for num_threads(be->threads) if (N * F > 4 * SPAN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        float *a = x + i * 2 * F;
        swiglu_bwd_inplace_row_for(be->isa)(a, a + F, dout + i * F, F);
    }
}
