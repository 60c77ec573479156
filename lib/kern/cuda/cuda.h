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

/* The kernels: kern.h documents each under its mc_k_ name. */
void mc_cuda_fill(mc_cuda *cu, float *x, float v, size_t n);
void mc_cuda_scale(mc_cuda *cu, float *x, float s, size_t n);
void mc_cuda_add(mc_cuda *cu, float *out, const float *a, const float *b, size_t n);
void mc_cuda_acc(mc_cuda *cu, float *acc, const float *x, size_t n);
double mc_cuda_sumsq(mc_cuda *cu, const float *x, size_t n);
int mc_cuda_all_finite(mc_cuda *cu, const float *x, size_t n);
double mc_cuda_mean(mc_cuda *cu, const float *x, size_t n);
void mc_cuda_round(mc_cuda *cu, float *x, size_t n, mc_prec prec);
void mc_cuda_cast_to_bf16(mc_cuda *cu, uint16_t *out, const float *x, size_t n);
void mc_cuda_cast_from_bf16(mc_cuda *cu, float *out, const uint16_t *x, size_t n);
void mc_cuda_cast_to_fp16(mc_cuda *cu, uint16_t *out, const float *x, size_t n);
void mc_cuda_cast_from_fp16(mc_cuda *cu, float *out, const uint16_t *x, size_t n);
void mc_cuda_init_normal(mc_cuda *cu, float *x, size_t rows, size_t cols, uint64_t global_cols, uint64_t row0, uint64_t col0, uint64_t seed, uint64_t key, float std);
void mc_cuda_embed_fwd(mc_cuda *cu, float *out, const int32_t *ids, size_t N, const float *wte, int64_t v0, int64_t vl, size_t C);
void mc_cuda_embed_bwd(mc_cuda *cu, float *dwte, const float *dout, const int32_t *ids, size_t N, int64_t v0, int64_t vl, size_t C);
void mc_cuda_posemb_fwd(mc_cuda *cu, float *out, const float *wpe, size_t B, size_t T, size_t C, size_t pos0);
void mc_cuda_posemb_bwd(mc_cuda *cu, float *dwpe, const float *dout, size_t B, size_t T, size_t C, size_t pos0);
void mc_cuda_layernorm_fwd(mc_cuda *cu, float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, size_t N, size_t C, float eps);
void mc_cuda_layernorm_bwd(mc_cuda *cu, float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, const float *mean, const float *rstd, size_t N, size_t C);
void mc_cuda_rmsnorm_fwd(mc_cuda *cu, float *out, float *rstd, const float *x, const float *w, size_t N, size_t C, float eps);
void mc_cuda_rmsnorm_bwd(mc_cuda *cu, float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, size_t N, size_t C);
void mc_cuda_linear_fwd(mc_cuda *cu, mc_prec prec, float *out, const float *x, const float *W, const uint16_t *Wb, const float *b, size_t N, size_t Cin, size_t Cout, float beta);
void mc_cuda_linear_bwd(mc_cuda *cu, mc_prec prec, float *dx, float *dW, float *db, const float *dout, const float *x, const float *W, const uint16_t *Wb, size_t N, size_t Cin, size_t Cout);
void mc_cuda_gelu_fwd(mc_cuda *cu, float *out, const float *x, size_t n);
void mc_cuda_gelu_bwd(mc_cuda *cu, float *dx, const float *dout, const float *x, size_t n);
void mc_cuda_swiglu_fwd(mc_cuda *cu, float *out, const float *x, size_t N, size_t F);
void mc_cuda_swiglu_bwd(mc_cuda *cu, float *dx, const float *dout, const float *x, size_t N, size_t F);
void mc_cuda_qkv_split(mc_cuda *cu, float *q, float *k, float *v, const float *qkv, size_t N, size_t Q, size_t G, size_t D);
void mc_cuda_qkv_split_bwd(mc_cuda *cu, float *dqkv, const float *dq, const float *dk, const float *dv, size_t N, size_t Q, size_t G, size_t D);
void mc_cuda_rope_fwd(mc_cuda *cu, float *x, size_t B, size_t T, size_t H, size_t D, float base, size_t pos0);
void mc_cuda_rope_bwd(mc_cuda *cu, float *dx, size_t B, size_t T, size_t H, size_t D, float base, size_t pos0);
void mc_cuda_attention_fwd(mc_cuda *cu, float *out, float *lse, const float *q, const float *k, const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale);
void mc_cuda_attention_bwd(mc_cuda *cu, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *out, const float *lse, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale);
void mc_cuda_xent_max(mc_cuda *cu, float *rowmax, const float *logits, size_t N, size_t vl);
void mc_cuda_xent_sumexp(mc_cuda *cu, float *sumexp, float *tlogit, const float *logits, const float *rowmax, const int32_t *targets, int64_t v0, size_t N, size_t vl);
void mc_cuda_xent_loss(mc_cuda *cu, float *loss, const float *rowmax, const float *sumexp, const float *tlogit, const int32_t *targets, size_t N);
void mc_cuda_xent_bwd(mc_cuda *cu, float *dlogits, const float *logits, const float *rowmax, const float *sumexp, const int32_t *targets, int64_t v0, size_t N, size_t vl, const float *dloss, float scale);
void mc_cuda_adamw(mc_cuda *cu, float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale);

#ifdef __cplusplus
}
#endif
#endif
