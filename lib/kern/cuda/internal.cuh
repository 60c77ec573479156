/*
 * internal.cuh - private to the .cu files of lib/kern/cuda: the backend state
 * (struct mc_cuda), error checks, scratch memory, launch helpers, and the
 * device versions of the CPU backend's bf16/fp16 conversions (the same bit
 * algorithms as kern/cpu/cpu.h, so casts and rounding agree bit for bit).
 */
#ifndef MC_KERN_CUDA_INTERNAL_CUH
#define MC_KERN_CUDA_INTERNAL_CUH

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "kern/cuda/cuda.h"
#include "kern/fpconv.h"

/* Scratch slots, one per kernel family so live buffers never alias. */
enum {
    MC_CU_SCRATCH_GEMM_A = 0, /* bf16/fp16 copy of the first GEMM operand */
    MC_CU_SCRATCH_GEMM_B,     /* second operand */
    MC_CU_SCRATCH_GEMM_C,     /* dout of the backward */
    MC_CU_SCRATCH_WORK,       /* partial sums, rope tables, attention row terms */
    MC_CU_SCRATCH_SORT,       /* embedding backward: sorted ids and cub's space */
    MC_CU_SCRATCH_N
};

struct mc_cu_pool; /* the caching allocator (backend.cu) */

struct mc_cuda {
    int device;
    int sm_count;
    cudaStream_t stream;      /* every kernel, copy and GEMM */
    cudaStream_t comm_stream; /* NCCL collectives (comm/nccl.c) */
    cudaEvent_t ev[2];        /* stream-to-stream ordering */
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *scratch[MC_CU_SCRATCH_N];
    size_t scratch_cap[MC_CU_SCRATCH_N];
    double *host_red; /* pinned: reductions land here */
    struct mc_cu_pool *pool;
    int att_bf16;     /* attention on the tensor cores (flash.cu): the model is bf16 */
    int flash_off;    /* MC_CUDA_FLASH=0 at creation: always attention.cu's fp32 kernels */
    int fp8_gemm_off; /* MC_CUDA_FP8_GEMM=0 at creation: fp8_gemm in fp32 */
    size_t fp8_gemms, fp8_fallbacks; /* fp8_gemm calls on cuBLASLt's FP8 kernels, and not */
};

/* A failed CUDA call inside a kernel wrapper is a broken device or a bug:
 * kernels cannot return a status (kern.h), so say where and abort. */
#define CU_CHECK(call)                                                                       \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) mc_cu_die(__FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#define LT_CHECK(call)                                                                         \
    do {                                                                                       \
        cublasStatus_t s_ = (call);                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) mc_cu_die(__FILE__, __LINE__, #call, "cuBLAS error"); \
    } while (0)
/* After every launch: a bad configuration is reported here, not later. */
#define KCHECK() CU_CHECK(cudaGetLastError())

static inline void mc_cu_die(const char *file, int line, const char *what, const char *msg)
{
    fprintf(stderr, "mc: kern/cuda: %s:%d: %s: %s\n", file, line, what, msg);
    abort();
}

void *mc_cuda_scratch(mc_cuda *cu, int slot, size_t bytes);

/* fp8.cu: o = the FP8 bytes (E5M2 where e5m2, else E4M3) of x[rows, cols],
 * values already on that grid (fp8_quantize's), or of its transpose
 * (o[cols, rows]) where transpose. */
void mc_cuda_fp8_bytes(mc_cuda *cu, uint8_t *o, const float *x, size_t rows, size_t cols,
                       int transpose, int e5m2);

/* flash.cu: attention on the tensor cores in bf16 (attention.cu's contract,
 * bf16 operands); 0 when it does not apply (head dimension not a multiple
 * of 16 up to 128, or a tensor not 8-byte aligned): the caller then runs
 * the fp32 kernels. Dr: the backward's D_r rows [B, Q, T]. */
int mc_cuda_flash_supported(size_t D);
int mc_cuda_flash_fwd(mc_cuda *cu, float *out, float *lse, const float *q, const float *k,
                      const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale,
                      const int32_t *seg);
int mc_cuda_flash_bwd(mc_cuda *cu, float *dq, float *dk, float *dv, const float *dout,
                      const float *q, const float *k, const float *v, const float *lse,
                      const float *Dr, size_t B, size_t T, size_t Q, size_t G, size_t D,
                      float scale, const int32_t *seg);

/* A launch on the backend's stream, checked (tests/cuda/emu.h runs the same
 * macro's grid on the CPU); the dynamic shared memory a kernel declares; a
 * kernel's opt-in to more than 48 KiB of it. */
#define MC_LAUNCH(kernel, grid, threads, smem, ...)                     \
    do {                                                                \
        kernel<<<(grid), (threads), (smem), cu->stream>>>(__VA_ARGS__); \
        KCHECK();                                                       \
    } while (0)
#define MC_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define MC_SMEM_LIMIT(kernel, bytes)                      \
    CU_CHECK(cudaFuncSetAttribute((const void *)(kernel), \
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes)))

/* Blocks of `threads` for n elements with a grid-stride loop, capped. */
static inline unsigned mc_cu_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return b ? (unsigned)b : 1u;
}

#define GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------- warp reductions */

#include "kern/cuda/warp.cuh"
__device__ __forceinline__ double mc_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
