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
};

/* A failed CUDA call inside a kernel wrapper is a broken device or a bug:
 * kernels cannot return a status (kern.h), so say where and abort. */
#define CU_CHECK(call)                                                                       \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) mc_cu_die(__FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#define LT_CHECK(call)                                                                       \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) mc_cu_die(__FILE__, __LINE__, #call, "cuBLAS error"); \
    } while (0)
/* After every launch: a bad configuration is reported here, not later. */
#define KCHECK() CU_CHECK(cudaGetLastError())

static inline void mc_cu_die(const char *file, int line, const char *what, const char *msg) {
    fprintf(stderr, "mc: kern/cuda: %s:%d: %s: %s\n", file, line, what, msg);
    abort();
}

void *mc_cuda_scratch(mc_cuda *cu, int slot, size_t bytes);

/* Blocks of `threads` for n elements with a grid-stride loop, capped. */
static inline unsigned mc_cu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return b ? (unsigned)b : 1u;
}

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------- conversions (cpu.h) */

__device__ __forceinline__ uint16_t mc_d_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float mc_d_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t mc_d_f32_to_fp16(float f) {
    uint32_t x = __float_as_uint(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) {
        if (x <= 0x33000000u) return sign;
        uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e, h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (x - 0x38000000u) >> 13, rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

__device__ __forceinline__ float mc_d_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else {
        x = __float_as_uint((float)m * 0x1p-24f) | sign;
    }
    return __uint_as_float(x);
}

__device__ __forceinline__ float mc_d_round_tf32(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7f800000u) != 0x7f800000u) {
        x += 0xfffu + ((x >> 13) & 1u);
        x &= 0xffffe000u;
    }
    return __uint_as_float(x);
}

/* ---------------------------------------------------- warp reductions */

__device__ __forceinline__ float mc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float mc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double mc_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
