/*
 * cuda.h - the CUDA backend's C interface, private to lib/kern: the mc_cuda_*
 * kernels are kern.h's mc_k_* with the same arguments after the backend state
 * (mc_cuda instead of mc_backend), called by lib/kern/dispatch.c; comm/nccl.c
 * takes the streams from here. Compiled only when configure found the CUDA
 * toolkit (MC_CUDA_BACKEND).
 */
#ifndef MC_KERN_CUDA_H
#define MC_KERN_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "mc/kern.h"
#include "kern/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backend state on GPU `device` (< 0: from the local rank). */
mc_status mc_cuda_new(int device, mc_cuda **out, mc_error *err);
void mc_cuda_free(mc_cuda *cu);
int mc_cuda_device_count(void);
int mc_cuda_device(const mc_cuda *cu);
/* The compute stream and the communication stream, as cudaStream_t. */
void *mc_cuda_stream(mc_cuda *cu);
void *mc_cuda_comm_stream(mc_cuda *cu);
/* Make `waiter` wait for the work queued so far on `signaler` (0 = compute,
 * 1 = communication) without blocking the host. */
void mc_cuda_stream_wait(mc_cuda *cu, int waiter, int signaler);

/* Memory: a caching allocator (freed blocks are kept for reuse, so the
 * steady-state training loop never calls cudaMalloc). */
void *mc_cuda_balloc(mc_cuda *cu, size_t bytes, mc_error *err);
void mc_cuda_bfree(mc_cuda *cu, void *p);
void mc_cuda_bcopy_from_host(mc_cuda *cu, void *dst, const void *host, size_t bytes);
void mc_cuda_bcopy_to_host(mc_cuda *cu, void *host, const void *src, size_t bytes);
void mc_cuda_bcopy(mc_cuda *cu, void *dst, const void *src, size_t bytes);
void mc_cuda_bsync(mc_cuda *cu);
/* Allocator counters, for tests: cudaMalloc calls so far, bytes cached. */
void mc_cuda_alloc_stats(mc_cuda *cu, size_t *mallocs, size_t *cached_bytes);
/* Bytes free on the device plus those the allocator caches; what: "GPU N
 * (its name)" (mc_backend_mem_available). */
double mc_cuda_mem_available(mc_cuda *cu, char *what, size_t cap);
/* fp8_gemm calls so far that ran cuBLASLt's FP8 GEMM, and those that fell
 * back to the fp32 GEMM (no FP8 algorithm for the shape, or
 * MC_CUDA_FP8_GEMM=0), for check_kern and the benchmarks. */
void mc_cuda_fp8_gemm_stats(mc_cuda *cu, size_t *fp8, size_t *fallback);

/* The attention's precision (mc_backend_set_attention_prec): MC_PREC_BF16
 * runs it on the tensor cores (flash.cu) unless MC_CUDA_FLASH=0 was set
 * when the backend was created. */
void mc_cuda_set_attention_prec(mc_cuda *cu, mc_prec prec);

/* The kernels: mc_cuda_NAME(cu, ...) for each entry of mc/kern_ops.def that
 * has a CUDA implementation (backends CPU_CUDA); kern_ops.def documents
 * each under its mc_k_ name. */
#define MC_KERNEL(name, ret, params, args, backends) MC_CUDA_DECLARE_##backends(ret, name, params)
#define MC_CUDA_DECLARE_CPU_CUDA(ret, name, params) \
    ret mc_cuda_##name(mc_cuda *cu, MC_KERN_UNPAREN params);
#define MC_CUDA_DECLARE_CPU_ONLY(ret, name, params)
#include "mc/kern_ops.def"
#undef MC_CUDA_DECLARE_CPU_CUDA
#undef MC_CUDA_DECLARE_CPU_ONLY

#ifdef __cplusplus
}
#endif
#endif
