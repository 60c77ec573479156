/*
 * linear.cu - the linear layer through cuBLASLt, forward and backward, in
 * kern.h's four precisions (above gemm; doc/ARCHITECTURE.md, "Kernels"). The
 * forward's bias rides in the GEMM's epilogue where cuBLASLt has an algorithm
 * for it; the bias gradient is a deterministic column sum. Descriptors and
 * the heuristic's algorithm are cached per shape, so a training step does no
 * heuristic search after its first one.
 */
#include <map>
#include <tuple>
#include "kern/cuda/internal.cuh"

#define TPB 256
#define ROWS_PER_CHUNK 128

typedef std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                   int>
    plan_key;

struct plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int epilogue_bias; /* 1 when the bias is added by the epilogue */
    int none;          /* fp8_plan: cuBLASLt has no FP8 algorithm for this shape */
};

/* one cache per process: plans hold no pointers, only shapes */
static std::map<plan_key, plan> *plans;

static int align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 4 && (a % (uintptr_t)al)) al /= 2;
    return al;
}

/* Build (or find) the plan for C(m x n) = op(A) op(B) (+ bias); false when
 * cuBLASLt has no algorithm with the bias epilogue (the caller then adds it). */
static plan *get_plan(mc_cuda *cu, cudaDataType_t ab, cublasComputeType_t ct, int ta, int tb,
                      int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                      int bias, int al)
{
    if (!plans) plans = new std::map<plan_key, plan>();
    plan_key key((int)ab, (int)ct, ta * 2 + tb, m, n, k, lda, ldb, ldc, bias, al, cu->device);
    auto it = plans->find(key);
    if (it != plans->end()) return &it->second;
    plan p = {};
    LT_CHECK(cublasLtMatmulDescCreate(&p.desc, ct, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, ta ? k : m, ta ? m : k, lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, tb ? n : k, tb ? k : n, ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &cu->lt_ws_bytes, sizeof cu->lt_ws_bytes));
    /* the heuristic assumes 256-byte aligned pointers unless told */
    uint32_t a32 = (uint32_t)al;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &a32, sizeof a32));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &a32, sizeof a32));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &a32, sizeof a32));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &a32, sizeof a32));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof epi));
        LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                sizeof bt));
        if (cublasLtMatmulAlgoGetHeuristic(cu->lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res,
                                           &found) != CUBLAS_STATUS_SUCCESS)
            found = 0;
        p.epilogue_bias = found > 0;
        if (!found) {
            epi = CUBLASLT_EPILOGUE_DEFAULT;
            LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof epi));
        }
    }
    if (!found && (cublasLtMatmulAlgoGetHeuristic(cu->lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res,
                                                  &found) != CUBLAS_STATUS_SUCCESS ||
                   !found))
        mc_cu_die(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic",
                  "no algorithm for this GEMM");
    cublasLtMatmulPreferenceDestroy(pref);
    p.algo = res.algo;
    plan &slot = (*plans)[key];
    slot = p;
    return &slot;
}

/* Row-major to cuBLAS's column-major: a row-major [R, C] matrix is a
 * column-major C x R one with the same leading dimension, so
 *   out[N,O] = x[N,I] W[O,I]^T     is  out_cm(O x N) = W_cm^T(O x I) x_cm(I x N)
 *   dx[N,I] += dout[N,O] W[O,I]    is  dx_cm(I x N) += W_cm(I x O) dout_cm(O x N)
 *   dW[O,I] += dout^T[O,N] x[N,I]  is  dW_cm(I x O) += x_cm(I x N) dout_cm^T(N x O)
 * FP32 computes with CUBLAS_COMPUTE_32F (the CPU's sgemm to fp32 rounding),
 * TF32 with CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores), BF16/FP16 on the
 * tensor cores with fp32 accumulation into an fp32 output.
 *
 * C(m x n, ldc) = op(A) op(B) + beta C (+ bias[m]) in column-major terms;
 * returns 1 when the bias was added (by the epilogue), 0 when the caller must */
static int gemm(mc_cuda *cu, mc_prec prec, int ta, int tb, int64_t m, int64_t n, int64_t k,
                const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C,
                int64_t ldc, const float *bias)
{
    cudaDataType_t ab = prec == MC_PREC_BF16   ? CUDA_R_16BF
                        : prec == MC_PREC_FP16 ? CUDA_R_16F
                                               : CUDA_R_32F;
    cublasComputeType_t ct = prec == MC_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                  : CUBLAS_COMPUTE_32F;
    int al = align_of(A);
    if (align_of(B) < al) al = align_of(B);
    if (align_of(C) < al) al = align_of(C);
    plan *p = get_plan(cu, ab, ct, ta, tb, m, n, k, lda, ldb, ldc, bias != NULL, al);
    if (bias && p->epilogue_bias)
        LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
    const float one = 1.0f;
    LT_CHECK(cublasLtMatmul(cu->lt, p->desc, &one, A, p->a, B, p->b, &beta, C, p->c, C, p->c,
                            &p->algo, cu->lt_ws, cu->lt_ws_bytes, cu->stream));
    return bias && p->epilogue_bias;
}

__global__ void k_round_to16(uint16_t *o, const float *x, size_t n, int bf16)
{
    GRID_STRIDE(i, n) o[i] = bf16 ? mc_f32_to_bf16(x[i]) : mc_f32_to_fp16(x[i]);
}

/* The operand as the GEMM reads it: x itself (fp32, tf32) or its bf16/fp16
 * copy in scratch slot `slot`, rounded to nearest even (the CPU's rounding):
 * activations and weights are fp32 in memory (kern.h). */
static const void *operand(mc_cuda *cu, mc_prec prec, const float *x, size_t n, int slot)
{
    if (prec != MC_PREC_BF16 && prec != MC_PREC_FP16) return x;
    uint16_t *o = (uint16_t *)mc_cuda_scratch(cu, slot, n * sizeof(uint16_t));
    k_round_to16<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(o, x, n, prec == MC_PREC_BF16);
    KCHECK();
    return o;
}

__global__ void k_bias_add(float *out, const float *b, size_t N, size_t O)
{
    GRID_STRIDE(k, N * O) out[k] += b[k % O];
}

/* out[n,o] = beta out[n,o] + sum_i x[n,i] W[o,i] + b[o] */
extern "C" void mc_cuda_linear_fwd(mc_cuda *cu, mc_prec prec, float *out, const float *x,
                                   const float *W, const void *Wp, const float *b, size_t N,
                                   size_t I, size_t O, float beta, unsigned exact)
{
    /* prepared weights and pre-rounded operands are the CPU backend's (the
     * GPU's operands are converted to bf16 either way: the same bits) */
    (void)Wp;
    (void)exact;
    if (!N || !O) return;
    if (!I) { /* empty product: out = beta out + b */
        if (beta == 0.0f) CU_CHECK(cudaMemsetAsync(out, 0, N * O * sizeof(float), cu->stream));
        if (b) k_bias_add<<<mc_cu_blocks(N * O, TPB), TPB, 0, cu->stream>>>(out, b, N, O);
        return;
    }
    const void *w = operand(cu, prec, W, O * I, MC_CU_SCRATCH_GEMM_B);
    const void *a = operand(cu, prec, x, N * I, MC_CU_SCRATCH_GEMM_A);
    int done = gemm(cu, prec, 1, 0, (int64_t)O, (int64_t)N, (int64_t)I, w, (int64_t)I, a,
                    (int64_t)I, beta, out, (int64_t)O, b);
    if (b && !done) {
        k_bias_add<<<mc_cu_blocks(N * O, TPB), TPB, 0, cu->stream>>>(out, b, N, O);
        KCHECK();
    }
}

/* partial column sums of dout[N,O] over chunks of rows, then the chunks in order */
__global__ void k_colsum_part(float *part, const float *g, size_t N, size_t O)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (c >= O) return;
    size_t i0 = ch * ROWS_PER_CHUNK, i1 = i0 + ROWS_PER_CHUNK < N ? i0 + ROWS_PER_CHUNK : N;
    float a = 0.0f;
    for (size_t i = i0; i < i1; i++) a += g[i * O + c];
    part[ch * O + c] = a;
}

__global__ void k_colsum_final(float *db, const float *part, size_t nch, size_t O)
{
    GRID_STRIDE(c, O)
    {
        float a = 0.0f;
        for (size_t k = 0; k < nch; k++) a += part[k * O + c];
        db[c] += a;
    }
}

/* dx += dout W;  dW += dout^T x;  db += column sums of dout */
extern "C" void mc_cuda_linear_bwd(mc_cuda *cu, mc_prec prec, float *dx, float *dW, float *db,
                                   const float *dout, const float *x, const float *W,
                                   const void *Wp, size_t N, size_t I, size_t O, unsigned exact)
{
    (void)Wp; /* see mc_cuda_linear_fwd */
    if (!N) return;
    if (!O) { /* no products: a written dx is zero */
        if (dx && I && (exact & MC_LIN_DX_WRITE))
            CU_CHECK(cudaMemsetAsync(dx, 0, N * I * sizeof(float), cu->stream));
        return;
    }
    if (I && (dx || dW)) {
        const void *g = operand(cu, prec, dout, N * O, MC_CU_SCRATCH_GEMM_C);
        /* dW first: dx may be x itself (MC_LIN_DX_WRITE; the stream orders them) */
        if (dW) {
            const void *a = operand(cu, prec, x, N * I, MC_CU_SCRATCH_GEMM_A);
            gemm(cu, prec, 0, 1, (int64_t)I, (int64_t)O, (int64_t)N, a, (int64_t)I, g, (int64_t)O,
                 1.0f, dW, (int64_t)I, NULL);
        }
        if (dx) {
            const void *w = operand(cu, prec, W, O * I, MC_CU_SCRATCH_GEMM_B);
            gemm(cu, prec, 0, 0, (int64_t)I, (int64_t)N, (int64_t)O, w, (int64_t)I, g, (int64_t)O,
                 exact & MC_LIN_DX_WRITE ? 0.0f : 1.0f, dx, (int64_t)I, NULL);
        }
    }
    if (!db) return;
    size_t nch = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
    float *part = (float *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, nch * O * sizeof(float));
    dim3 grid((unsigned)((O + TPB - 1) / TPB), (unsigned)nch);
    k_colsum_part<<<grid, TPB, 0, cu->stream>>>(part, dout, N, O);
    KCHECK();
    k_colsum_final<<<mc_cu_blocks(O, TPB), TPB, 0, cu->stream>>>(db, part, nch, O);
    KCHECK();
}

/* ------------------------------------------------------------ FP8 GEMMs */

/* The plan of cuBLASLt's FP8 GEMM C(m x n) = A^T B in column-major terms
 * (Hopper's FP8 kernels take A transposed and B not), A of type at, B of
 * bt (E4M3 or E5M2, not both E5M2), fp32 accumulation (not the fast
 * accumulation), C and D fp32; NULL where cuBLASLt offers no algorithm
 * (remembered, so it is asked once per shape). */
static plan *fp8_plan(mc_cuda *cu, cudaDataType_t at, cudaDataType_t bt, int64_t m, int64_t n,
                      int64_t k, int64_t lda, int64_t ldb, int64_t ldc)
{
    if (!plans) plans = new std::map<plan_key, plan>();
    plan_key key((int)at + 1000, (int)bt + 1000, 2, m, n, k, lda, ldb, ldc, 0, 16, cu->device);
    auto it = plans->find(key);
    if (it != plans->end()) return it->second.none ? NULL : &it->second;
    plan p = {};
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    cudaDataType_t st = CUDA_R_32F;
    uint32_t a16 = 16;
    bool ok = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, st) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                             sizeof opa) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                             sizeof opb) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p.a, at, k, m, lda) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p.b, bt, k, n, ldb) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, m, n, ldc) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &cu->lt_ws_bytes, sizeof cu->lt_ws_bytes) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                   &a16, sizeof a16) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &a16, sizeof a16) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &a16, sizeof a16) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &a16, sizeof a16) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoGetHeuristic(cu->lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res,
                                             &found) == CUBLAS_STATUS_SUCCESS &&
              found > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    plan &slot = (*plans)[key];
    if (!ok) {
        if (p.a) cublasLtMatrixLayoutDestroy(p.a);
        if (p.b) cublasLtMatrixLayoutDestroy(p.b);
        if (p.c) cublasLtMatrixLayoutDestroy(p.c);
        if (p.desc) cublasLtMatmulDescDestroy(p.desc);
        slot = plan{};
        slot.none = 1;
        return NULL;
    }
    p.algo = res.algo;
    slot = p;
    return &slot;
}

extern "C" void mc_cuda_fp8_gemm_stats(mc_cuda *cu, size_t *fp8, size_t *fallback)
{
    *fp8 = cu->fp8_gemms;
    *fallback = cu->fp8_fallbacks;
}

/* kern_ops.def's fp8_gemm. Row-major to column-major as gemm() above:
 *   0: out_cm(O x N) = W_cm^T x_cm: A = W [O,I] as stored (k x m = I x O,
 *      lda I), B = x [N,I] as stored (I x N, ldb I);
 *   1: dx_cm(I x N) = W_cm dy_cm: A = W^T bytes [I,O] (O x I, lda O),
 *      B = dy [N,O] as stored (O x N, ldb O);
 *   2: dW_cm(I x O) = x_cm dy_cm^T: A = x^T bytes [I,N] (N x I, lda N),
 *      B = dy^T bytes [O,N] (N x O, ldb N).
 * The transposes are made while converting to bytes (mc_cuda_fp8_bytes).
 * FP8 operands need 16-byte aligned rows: a leading dimension that is not
 * a multiple of 16, an output not 16-byte aligned, or a shape cuBLASLt has
 * no algorithm for, runs the fp32 GEMM on the same values (the CPU's
 * computation). */
extern "C" void mc_cuda_fp8_gemm(mc_cuda *cu, int which, float *out, const float *a, const float *b,
                                 size_t N, size_t I, size_t O, int a_e5m2)
{
    size_t rows = which == 0 ? N : which == 1 ? N : O, cols = which == 0 ? O : I;
    if (!rows || !cols) return;
    int64_t m, n, k, lda, ldb;
    const float *A, *B;
    size_t Ar, Ac, Br, Bc;
    int At, Bt, Ae5, Be5;
    switch (which) {
    case 0:
        m = O, n = N, k = I, A = b, Ar = O, Ac = I, At = 0, Ae5 = 0, B = a, Br = N, Bc = I, Bt = 0,
        Be5 = 0;
        break;
    case 1:
        m = I, n = N, k = O, A = b, Ar = O, Ac = I, At = 1, Ae5 = 0, B = a, Br = N, Bc = O, Bt = 0,
        Be5 = a_e5m2;
        break;
    default:
        m = I, n = O, k = N, A = b, Ar = N, Ac = I, At = 1, Ae5 = 0, B = a, Br = N, Bc = O, Bt = 1,
        Be5 = a_e5m2;
    }
    lda = k, ldb = k;
    plan *p = NULL;
    /* the plan promises cuBLASLt 16-byte aligned pointers (the byte copies
     * are scratch, 256-aligned; out is the caller's) */
    if (!cu->fp8_gemm_off && k > 0 && k % 16 == 0 && align_of(out) >= 16)
        p = fp8_plan(cu, Ae5 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3,
                     Be5 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, m, n, k, lda, ldb, m);
    if (!p) {
        cu->fp8_fallbacks++;
        if (which == 0) {
            mc_cuda_linear_fwd(cu, MC_PREC_FP32, out, a, b, NULL, NULL, N, I, O, 0.0f, 0);
        } else {
            CU_CHECK(cudaMemsetAsync(out, 0, rows * cols * sizeof(float), cu->stream));
            if (which == 1)
                mc_cuda_linear_bwd(cu, MC_PREC_FP32, out, NULL, NULL, a, NULL, b, NULL, N, I, O, 0);
            else
                mc_cuda_linear_bwd(cu, MC_PREC_FP32, NULL, out, NULL, a, b, NULL, NULL, N, I, O, 0);
        }
        return;
    }
    cu->fp8_gemms++;
    uint8_t *ab = (uint8_t *)mc_cuda_scratch(cu, MC_CU_SCRATCH_GEMM_A, Ar * Ac);
    uint8_t *bb = (uint8_t *)mc_cuda_scratch(cu, MC_CU_SCRATCH_GEMM_B, Br * Bc);
    mc_cuda_fp8_bytes(cu, ab, A, Ar, Ac, At, Ae5);
    mc_cuda_fp8_bytes(cu, bb, B, Br, Bc, Bt, Be5);
    const float one = 1.0f, zero = 0.0f;
    LT_CHECK(cublasLtMatmul(cu->lt, p->desc, &one, ab, p->a, bb, p->b, &zero, out, p->c, out, p->c,
                            &p->algo, cu->lt_ws, cu->lt_ws_bytes, cu->stream));
}
