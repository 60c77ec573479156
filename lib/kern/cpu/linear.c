/*
 * linear.c - the linear layer y = x W^T + b with W stored [out, in] as
 * Megatron stores it, forward and backward, in kern.h's four precisions:
 * FP32 through OpenBLAS's sgemm, BF16 through oneDNN's bf16 GEMM, FP16 and
 * TF32 through sgemm on rounded operands (the details above gemm). BF16
 * without oneDNN's GEMM: on the AVX2 and AVX-512 paths the products with
 * the weight (the forward and d x) through b16gemm.c's GEMM on the
 * weight's bf16 panels, d W through the same GEMM on x packed per call; on
 * the baseline path all three as FP16's. Bias add and the bias-gradient
 * reduction are OpenMP loops.
 */
#include <assert.h>
#include "kern/cpu/blas.h"
#include "kern/cpu/cpu.h"
#include "kern/cpu/dnnl_bf16.h"
#include "kern/cpu/isa.h"

#define PAR_MIN 16384
#define COL_BLOCK_MAX 512 /* the widest column block of the bias pass */

/* src rounded to bf16 into scratch slot `slot` */
static const uint16_t *to_bf16(mc_backend *be, int slot, const float *src, size_t n)
{
    uint16_t *dst = mc_cpu_scratch(be, slot, n * sizeof(uint16_t));
    mc_cpu_cast_to_bf16(be, dst, src, n);
    return dst;
}

/* dst[i] = round_prec(src[i]) as fp32 */
static const float *to_rounded(mc_backend *be, int slot, const float *src, size_t n, mc_prec prec)
{
    float *dst = mc_cpu_scratch(be, slot, n * sizeof(float));
    mc_cpu_round_into(be, dst, src, n, prec);
    return dst;
}

/* A GEMM operand: its fp32 values and, once made, their rounding to the
 * GEMM's precision (bf16 bits, or fp16/tf32 values held in fp32), made in
 * scratch slot `slot` the first time a product needs it. */
typedef struct operand {
    const float *f;
    size_t n;
    int slot;
    const uint16_t *b16; /* bf16 rounding (given by the caller, or made here) */
    const float *rnd;    /* fp16 / tf32 / bf16-without-oneDNN rounding (likewise) */
} operand;

/* The operand of weight W with its prepared form Wp (mc_k_prepare_weight:
 * bf16 bits where the bf16 GEMM is native, rounded fp32 otherwise). */
static operand weight_operand(mc_backend *be, mc_prec prec, const float *W, const void *Wp,
                              size_t n)
{
    operand o = {W, n, MC_CPU_SCRATCH_GEMM_B, NULL, NULL};
    if (Wp && prec == MC_PREC_BF16 && be->dnnl_bf16)
        o.b16 = Wp;
    else if (Wp && prec != MC_PREC_FP32 && !mc_cpu_b16_panels(be, prec))
        o.rnd = Wp;
    return o;
}

/* The panels (b16gemm.c) of weight W [O, I] for the forward (bwd 0) or the
 * d x product (bwd 1): in its prepared form Wp (the forward's, then the
 * backward's) or, without one, made here in scratch */
static const uint16_t *weight_panels(mc_backend *be, const float *W, const void *Wp, size_t O,
                                     size_t I, int bwd)
{
    if (Wp) return (const uint16_t *)Wp + (bwd ? O * I : 0);
    uint16_t *P = mc_cpu_scratch(be, MC_CPU_SCRATCH_PANEL_B, O * I * sizeof(uint16_t));
    mc_cpu_b16_pack(be, bwd ? NULL : P, bwd ? P : NULL, W, O, I);
    return P;
}

/* An activation operand; exact: its values are already prec's (the
 * caller's MC_LIN_EXACT_*), so the fp32 GEMM of an emulated precision
 * multiplies it as it is (the native bf16 GEMM still takes its bf16 bits,
 * the same values) */
static operand act_operand(const float *f, size_t n, int slot, unsigned exact)
{
    operand o = {f, n, slot, NULL, exact ? f : NULL};
    return o;
}

/* C[M,N] = op(A)[M,K] op(B)[K,N] + beta C, row-major, in precision prec:
 *   FP32: OpenBLAS sgemm.
 *   BF16: both operands rounded to bf16 (nearest even) into backend scratch
 *         (the weight not at all when the caller passes it prepared, Wp;
 *         dout once for both backward products), then oneDNN's bf16 GEMM
 *         with fp32 accumulation (AVX512-BF16/AMX where the CPU has them).
 *   BF16 emulated (oneDNN has no bf16 GEMM for this CPU or path), FP16,
 *         TF32: the operands rounded to bf16 / fp16 / tf32 values held in
 *         fp32 (the weight once per forward pass by the caller, Wp), then
 *         sgemm: a product of two such values is exact in fp32, so this is
 *         the same computation, at sgemm's speed plus one rounding pass over
 *         the activations. */
static void gemm(mc_backend *be, mc_prec prec, int ta, int tb, size_t M, size_t N, size_t K,
                 operand *A, operand *B, float beta, float *C)
{
    size_t lda = ta ? M : K, ldb = tb ? K : N;
    if (prec == MC_PREC_BF16 && be->dnnl_bf16) {
        if (!A->b16) A->b16 = to_bf16(be, A->slot, A->f, A->n);
        if (!B->b16) B->b16 = to_bf16(be, B->slot, B->f, B->n);
        dnnl_status_t st = dnnl_gemm_bf16bf16f32(
            ta ? 'T' : 'N', tb ? 'T' : 'N', (dnnl_dim_t)M, (dnnl_dim_t)N, (dnnl_dim_t)K, 1.0f,
            A->b16, (dnnl_dim_t)lda, B->b16, (dnnl_dim_t)ldb, beta, C, (dnnl_dim_t)N);
        assert(st == dnnl_success); /* the creation probe ran the same routine */
        (void)st;
        return;
    }
    const float *a = A->f, *b = B->f;
    if (prec != MC_PREC_FP32) {
        if (!A->rnd) A->rnd = to_rounded(be, A->slot, A->f, A->n, prec);
        if (!B->rnd) B->rnd = to_rounded(be, B->slot, B->f, B->n, prec);
        a = A->rnd;
        b = B->rnd;
    }
    mc_cpu_blas_.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                       tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b,
                       (int)ldb, beta, C, (int)N);
}

/* A GEMM operand of n values in the form prec multiplies (cpu.h): src
 * itself (FP32), its bf16 bits (native bf16) or its rounded fp32 values
 * (emulated bf16, FP16, TF32), made in scratch slot `slot`. */
mc_cpu_gemm_op mc_cpu_gemm_operand(mc_backend *be, mc_prec prec, int slot, const float *src,
                                   size_t n)
{
    mc_cpu_gemm_op o = {src, sizeof(float)};
    if (prec == MC_PREC_BF16 && be->dnnl_bf16)
        o.p = to_bf16(be, slot, src, n), o.es = sizeof(uint16_t);
    else if (prec != MC_PREC_FP32)
        o.p = to_rounded(be, slot, src, n, prec);
    return o;
}

/* C[M,N] (leading dimension ldc) = op(A) op(B) + beta C on operands made by
 * mc_cpu_gemm_operand; element offsets through mc_cpu_gemm_at. Called
 * inside an OpenMP parallel region, OpenBLAS (OpenMP build) and oneDNN run
 * it on the calling thread alone. */
void mc_cpu_gemm_ld(mc_backend *be, mc_prec prec, int ta, int tb, size_t M, size_t N, size_t K,
                    const void *A, size_t lda, const void *B, size_t ldb, float beta, float *C,
                    size_t ldc)
{
    if (prec == MC_PREC_BF16 && be->dnnl_bf16) {
        dnnl_status_t st = dnnl_gemm_bf16bf16f32(
            ta ? 'T' : 'N', tb ? 'T' : 'N', (dnnl_dim_t)M, (dnnl_dim_t)N, (dnnl_dim_t)K, 1.0f, A,
            (dnnl_dim_t)lda, B, (dnnl_dim_t)ldb, beta, C, (dnnl_dim_t)ldc);
        assert(st == dnnl_success);
        (void)st;
        return;
    }
    mc_cpu_blas_.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                       tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B,
                       (int)ldb, beta, C, (int)ldc);
}

/* out[n,o] = beta out[n,o] + sum_i x[n,i] W[o,i] + b[o] */
void mc_cpu_linear_fwd(mc_backend *be, mc_prec prec, float *out, const float *x, const float *W,
                       const void *Wp, const float *b, size_t N, size_t I, size_t O, float beta,
                       unsigned exact)
{
    assert(beta == 0.0f || beta == 1.0f);
    operand ox = act_operand(x, N * I, MC_CPU_SCRATCH_GEMM_A, exact & MC_LIN_EXACT_X);
    operand ow = weight_operand(be, prec, W, Wp, O * I);
    if (mc_cpu_b16_panels(be, prec))
        mc_cpu_b16_gemm(be, N, O, I, ox.rnd ? 0 : MC_CPU_B16_ROUND_A, ox.rnd ? ox.rnd : x, I,
                        weight_panels(be, W, Wp, O, I, 0), beta, out, O);
    else if (N == 1 && prec == MC_PREC_FP32)
        /* one row (generation): a matrix-vector product streams W once,
         * where sgemm would first copy it into its packed layout */
        mc_cpu_blas_.sgemv(CblasRowMajor, CblasNoTrans, (int)O, (int)I, 1.0f, W, (int)I, x, 1, beta,
                           out, 1);
    else
        gemm(be, prec, 0, 1, N, O, I, &ox, &ow, beta, out);
    if (!b) return;
#pragma omp parallel for num_threads(be->threads) if (N * O > PAR_MIN) schedule(static)
    for (size_t n = 0; n < N; n++) {
        float *o = out + n * O;
#pragma omp simd
        for (size_t j = 0; j < O; j++) o[j] += b[j];
    }
}

/* What the bias pass writes besides the sums: nothing, bf16 bits, fp32
 * values rounded to bf16, or another precision's form (mc_cpu_prepare_here) */
enum { BIAS_SUM, BIAS_BF16_BITS, BIAS_BF16_ROUNDED, BIAS_OTHER };

/* acc[c - c0] = sum over the N rows, in order, of dout[n, c] for c in
 * [c0, c1), and dout's GEMM form (form) written into dr as each row
 * segment is read. dr may be dout itself (rounded in place: each element
 * is read before it is written). The rounding is fpconv.h's bf16
 * conversion, the same bits as mc_cpu_prepare_here. */
MC_ISA_BODY void bias_block_body(float *restrict acc, const float *dout, char *dr, size_t N,
                                 size_t O, size_t c0, size_t c1, int form, const mc_backend *be,
                                 mc_prec prec, int isa MC_ISA_UNUSED)
{
    size_t w = c1 - c0;
    for (size_t c = 0; c < w; c++) acc[c] = 0.0f;
    for (size_t n = 0; n < N; n++) {
        const float *g = dout + n * O + c0;
#pragma omp simd
        for (size_t c = 0; c < w; c++) acc[c] += g[c];
        if (form == BIAS_BF16_BITS) {
            uint16_t *h = (uint16_t *)dr + n * O + c0;
#pragma omp simd
            for (size_t c = 0; c < w; c++) h[c] = mc_f32_to_bf16(g[c]);
        } else if (form == BIAS_BF16_ROUNDED) {
            float *r = (float *)dr + n * O + c0;
#pragma omp simd
            for (size_t c = 0; c < w; c++) r[c] = mc_bf16_to_f32(mc_f32_to_bf16(g[c]));
        } else if (form == BIAS_OTHER) {
            mc_cpu_prepare_here(be, prec, dr + (n * O + c0) * sizeof(float), g, w);
        }
    }
}
MC_ISA_VARIANTS_VOID(bias_block,
                     (float *restrict acc, const float *dout, char *dr, size_t N, size_t O,
                      size_t c0, size_t c1, int form, const mc_backend *be, mc_prec prec),
                     (acc, dout, dr, N, O, c0, c1, form, be, prec))

/* dx[n,i] += sum_o dout[n,o] W[o,i];  dW[o,i] += sum_n dout[n,o] x[n,i];
 * db[o] += sum_n dout[n,o] */
void mc_cpu_linear_bwd(mc_backend *be, mc_prec prec, float *dx, float *dW, float *db,
                       const float *dout, const float *x, const float *W, const void *Wp, size_t N,
                       size_t I, size_t O, unsigned exact)
{
    /* dout is rounded once for both products (not at all when the caller
     * says it is exact); W not at all when the caller gave Wp */
    operand od = act_operand(dout, N * O, MC_CPU_SCRATCH_GEMM_C, exact & MC_LIN_EXACT_DOUT);
    operand ow = weight_operand(be, prec, W, Wp, O * I);
    operand ox = act_operand(x, N * I, MC_CPU_SCRATCH_GEMM_A, exact & MC_LIN_EXACT_X);
    /* With a bias gradient and a product that rounds dout, the bias pass
     * writes dout's GEMM form (mc_cpu_prepare_here's: bf16 bits or rounded
     * fp32) as it sums the unrounded values, so dout is read once for both.
     * Rounded fp32 goes back into dout itself when the caller allows it
     * (MC_LIN_DOUT_SCRATCH): the lines just read are written back, where a
     * separate copy would first read each of its lines. */
    char *dr = NULL;
    size_t es = mc_backend_weight_bytes(be, prec);
    int inplace = (exact & MC_LIN_DOUT_SCRATCH) && es == sizeof(float);
    /* the bf16-panel GEMM rounds dout as it packs it: no rounded copy */
    int panels = mc_cpu_b16_panels(be, prec);
    if ((dx || dW) && prec != MC_PREC_FP32 && !(exact & MC_LIN_EXACT_DOUT) && !panels) {
        if (inplace)
            dr = (char *)(uintptr_t)dout; /* the caller's scratch (kern.h) */
        else if (db)
            dr = mc_cpu_scratch(be, MC_CPU_SCRATCH_GEMM_C, N * O * es);
        if (dr && es == sizeof(uint16_t))
            od.b16 = (const uint16_t *)dr;
        else if (dr)
            od.rnd = (const float *)dr;
        if (dr && !db) /* no bias pass to round it in: in place, at once */
            mc_cpu_round_into(be, (float *)dr, dout, N * O, prec);
    }
    if (db) {
        /* column blocks, about two a thread: each sums its rows in order,
         * so the bits depend on neither the blocks nor the threads */
        size_t per = (O + (size_t)be->threads * COL_BLOCK_MAX - 1) /
                     ((size_t)be->threads * COL_BLOCK_MAX);
        size_t nb = (size_t)be->threads * per, w = ((O + nb - 1) / nb + 15) & ~(size_t)15;
        size_t nblk = (O + w - 1) / w;
        int form = !dr                      ? BIAS_SUM
                   : es == sizeof(uint16_t) ? BIAS_BF16_BITS
                   : prec == MC_PREC_BF16   ? BIAS_BF16_ROUNDED
                                            : BIAS_OTHER;
        bias_block_fn f = bias_block_for(be->isa);
#pragma omp parallel for num_threads(be->threads) if (N * O > PAR_MIN) schedule(static)
        for (size_t cb = 0; cb < nblk; cb++) {
            size_t c0 = cb * w, c1 = c0 + w < O ? c0 + w : O;
            float acc[COL_BLOCK_MAX];
            f(acc, dout, dr, N, O, c0, c1, form, be, prec);
            for (size_t c = c0; c < c1; c++) db[c] += acc[c - c0];
        }
    }
    /* dW first: dx may be x itself (MC_LIN_DX_WRITE) */
    if (dW && panels) {
        /* x [N, I] packed as B (K = N) rounds it on the way */
        uint16_t *P = mc_cpu_scratch(be, MC_CPU_SCRATCH_PANEL_B, N * I * sizeof(uint16_t));
        mc_cpu_b16_pack(be, NULL, P, ox.rnd ? ox.rnd : x, N, I);
        mc_cpu_b16_gemm(be, O, I, N, MC_CPU_B16_AT | (od.rnd ? 0 : MC_CPU_B16_ROUND_A),
                        od.rnd ? od.rnd : dout, O, P, 1.0f, dW, I);
    } else if (dW)
        gemm(be, prec, 1, 0, O, I, N, &od, &ox, 1.0f, dW);
    float bx = exact & MC_LIN_DX_WRITE ? 0.0f : 1.0f;
    if (dx && panels)
        mc_cpu_b16_gemm(be, N, I, O, od.rnd ? 0 : MC_CPU_B16_ROUND_A, od.rnd ? od.rnd : dout, O,
                        weight_panels(be, W, Wp, O, I, 1), bx, dx, I);
    else if (dx)
        gemm(be, prec, 0, 0, N, I, O, &od, &ow, bx, dx);
}
