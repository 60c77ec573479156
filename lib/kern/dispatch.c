/*
 * dispatch.c - the public kern.h functions: each routes on the backend's kind
 * (kern/backend.h) to the CPU implementation (kern/cpu, mc_cpu_*) or the CUDA
 * one (kern/cuda, mc_cuda_*, compiled in when configure found the toolkit:
 * Makefile.am then defines MC_CUDA_BACKEND). Model and training code call
 * only kern.h, so the same code runs on either backend.
 *
 * Adding a kernel mc_k_foo:
 *   1. declare it in lib/mc/kern.h (mc_backend *be first, then its arguments);
 *   2. CPU: write mc_cpu_foo(mc_backend *be, ...same arguments) in
 *      lib/kern/cpu/<family>.c and declare it in lib/kern/cpu/cpu.h;
 *   3. CUDA: write mc_cuda_foo(mc_cuda *cu, ...same arguments) in
 *      lib/kern/cuda/<family>.cu and declare it in lib/kern/cuda/cuda.h;
 *   4. here, one wrapper:
 *        void mc_k_foo(mc_backend *be, float *x, size_t n) { ROUTE(foo, x, n); }
 *      (ROUTE_RET for a kernel that returns a value). Until the CUDA kernel
 *      exists, use ROUTE_CPU_ONLY(foo, x, n): a CUDA backend then aborts
 *      naming the kernel, and the CPU build is unaffected;
 *   5. tests/cuda/check_kern.c compares the two on a GPU machine.
 * The CPU backend is the reference: a CUDA kernel must give the same result
 * within the tolerance of its precision (tests/cuda/run.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include "kern/backend.h"
#include "kern/cpu/cpu.h"
#ifdef MC_CUDA_BACKEND
#include "kern/cuda/cuda.h"
#endif

#ifdef MC_CUDA_BACKEND
#define IS_CUDA(be) ((be)->kind == MC_BACKEND_CUDA)
#define ROUTE(fn, ...)                                                                     \
    do {                                                                                   \
        if (IS_CUDA(be))                                                                   \
            mc_cuda_##fn(be->cuda, __VA_ARGS__);                                           \
        else                                                                               \
            mc_cpu_##fn(be, __VA_ARGS__);                                                  \
    } while (0)
#define ROUTE_RET(fn, ...)                                                                 \
    return IS_CUDA(be) ? mc_cuda_##fn(be->cuda, __VA_ARGS__) : mc_cpu_##fn(be, __VA_ARGS__)
#else
#define IS_CUDA(be) 0
#define ROUTE(fn, ...) mc_cpu_##fn(be, __VA_ARGS__)
#define ROUTE_RET(fn, ...) return mc_cpu_##fn(be, __VA_ARGS__)
#endif

/* A kernel with no CUDA implementation yet: a bug to reach on a GPU, so it
 * aborts (kernels cannot return a status, kern.h) with the kernel's name. */
#define ROUTE_CPU_ONLY(fn, ...)                                                            \
    do {                                                                                   \
        if (IS_CUDA(be)) no_cuda_kernel(#fn);                                              \
        mc_cpu_##fn(be, __VA_ARGS__);                                                      \
    } while (0)

static void no_cuda_kernel(const char *fn) __attribute__((noreturn, unused));
static void no_cuda_kernel(const char *fn) {
    fprintf(stderr, "mc: kern: mc_k_%s has no CUDA implementation\n", fn);
    abort();
}

/* ------------------------------------------------------------ backend */

#ifndef MC_CUDA_BACKEND
mc_status mc_backend_cuda_new(int device, mc_backend **out, mc_error *err) {
    (void)device;
    *out = NULL;
    return mc_error_set(err, MC_ERR_IO, "this mc was built without the CUDA backend");
}

int mc_backend_cuda_devices(void) { return 0; }
#else
mc_status mc_backend_cuda_new(int device, mc_backend **out, mc_error *err) {
    *out = NULL;
    mc_backend *be = calloc(1, sizeof *be);
    if (!be) return mc_error_set(err, MC_ERR_NOMEM, "kern/cuda: out of memory creating the backend");
    be->kind = MC_BACKEND_CUDA;
    be->name = "cuda";
    be->threads = 1;
    mc_status st = mc_cuda_new(device, &be->cuda, err);
    if (st) {
        free(be);
        return st;
    }
    *out = be;
    return MC_OK;
}

int mc_backend_cuda_devices(void) { return mc_cuda_device_count(); }
#endif

void mc_backend_free(mc_backend *be) {
    if (!be) return;
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) {
        mc_cuda_free(be->cuda);
        free(be);
        return;
    }
#endif
    mc_cpu_backend_free(be);
}

const char *mc_backend_name(const mc_backend *be) { return be->name; }

int mc_backend_threads(const mc_backend *be) { return be->threads; }

void *mc_balloc(mc_backend *be, size_t bytes, mc_error *err) { ROUTE_RET(balloc, bytes, err); }

void mc_bfree(mc_backend *be, void *p) { ROUTE(bfree, p); }

void mc_bcopy_from_host(mc_backend *be, void *dst, const void *host, size_t bytes) {
    ROUTE(bcopy_from_host, dst, host, bytes);
}

void mc_bcopy_to_host(mc_backend *be, void *host, const void *src, size_t bytes) {
    ROUTE(bcopy_to_host, host, src, bytes);
}

void mc_bcopy(mc_backend *be, void *dst, const void *src, size_t bytes) {
    ROUTE(bcopy, dst, src, bytes);
}

void mc_bsync(mc_backend *be) {
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) {
        mc_cuda_bsync(be->cuda);
        return;
    }
#endif
    mc_cpu_bsync(be);
}

/* ------------------------------------------------------------ kernels */

void mc_k_fill(mc_backend *be, float *x, float v, size_t n) {
    ROUTE(fill, x, v, n);
}

void mc_k_scale(mc_backend *be, float *x, float s, size_t n) {
    ROUTE(scale, x, s, n);
}

void mc_k_add(mc_backend *be, float *out, const float *a, const float *b, size_t n) {
    ROUTE(add, out, a, b, n);
}

void mc_k_acc(mc_backend *be, float *acc, const float *x, size_t n) {
    ROUTE(acc, acc, x, n);
}

double mc_k_sumsq(mc_backend *be, const float *x, size_t n) {
    ROUTE_RET(sumsq, x, n);
}

int mc_k_all_finite(mc_backend *be, const float *x, size_t n) {
    ROUTE_RET(all_finite, x, n);
}

double mc_k_mean(mc_backend *be, const float *x, size_t n) {
    ROUTE_RET(mean, x, n);
}

void mc_k_round(mc_backend *be, float *x, size_t n, mc_prec prec) {
    ROUTE(round, x, n, prec);
}

void mc_k_cast_to_bf16(mc_backend *be, uint16_t *out, const float *x, size_t n) {
    ROUTE(cast_to_bf16, out, x, n);
}

void mc_k_cast_from_bf16(mc_backend *be, float *out, const uint16_t *x, size_t n) {
    ROUTE(cast_from_bf16, out, x, n);
}

void mc_k_cast_to_fp16(mc_backend *be, uint16_t *out, const float *x, size_t n) {
    ROUTE(cast_to_fp16, out, x, n);
}

void mc_k_cast_from_fp16(mc_backend *be, float *out, const uint16_t *x, size_t n) {
    ROUTE(cast_from_fp16, out, x, n);
}

void mc_k_init_normal(mc_backend *be, float *x, size_t rows, size_t cols, uint64_t global_cols, uint64_t row0, uint64_t col0, uint64_t seed, uint64_t key, float std) {
    ROUTE(init_normal, x, rows, cols, global_cols, row0, col0, seed, key, std);
}

void mc_k_embed_fwd(mc_backend *be, float *out, const int32_t *ids, size_t N, const float *wte, int64_t v0, int64_t vl, size_t C) {
    ROUTE(embed_fwd, out, ids, N, wte, v0, vl, C);
}

void mc_k_embed_bwd(mc_backend *be, float *dwte, const float *dout, const int32_t *ids, size_t N, int64_t v0, int64_t vl, size_t C) {
    ROUTE(embed_bwd, dwte, dout, ids, N, v0, vl, C);
}

void mc_k_posemb_fwd(mc_backend *be, float *out, const float *wpe, size_t B, size_t T, size_t C, size_t pos0) {
    ROUTE(posemb_fwd, out, wpe, B, T, C, pos0);
}

void mc_k_posemb_bwd(mc_backend *be, float *dwpe, const float *dout, size_t B, size_t T, size_t C, size_t pos0) {
    ROUTE(posemb_bwd, dwpe, dout, B, T, C, pos0);
}

void mc_k_layernorm_fwd(mc_backend *be, float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, size_t N, size_t C, float eps) {
    ROUTE(layernorm_fwd, out, mean, rstd, x, w, b, N, C, eps);
}

void mc_k_layernorm_bwd(mc_backend *be, float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, const float *mean, const float *rstd, size_t N, size_t C) {
    ROUTE(layernorm_bwd, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

void mc_k_rmsnorm_fwd(mc_backend *be, float *out, float *rstd, const float *x, const float *w, size_t N, size_t C, float eps) {
    ROUTE(rmsnorm_fwd, out, rstd, x, w, N, C, eps);
}

void mc_k_rmsnorm_bwd(mc_backend *be, float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, size_t N, size_t C) {
    ROUTE(rmsnorm_bwd, dx, dw, dout, x, w, rstd, N, C);
}

void mc_k_linear_fwd(mc_backend *be, mc_prec prec, float *out, const float *x, const float *W, const uint16_t *Wb, const float *b, size_t N, size_t Cin, size_t Cout, float beta) {
    ROUTE(linear_fwd, prec, out, x, W, Wb, b, N, Cin, Cout, beta);
}

void mc_k_quantize_q8_rows(mc_backend *be, int8_t *Wq, float *scale, const float *W, size_t rows, size_t cols) {
    ROUTE_CPU_ONLY(quantize_q8_rows, Wq, scale, W, rows, cols);
}

void mc_k_linear_q8_fwd(mc_backend *be, float *out, const float *x, const int8_t *Wq, const float *scale, const float *b, size_t N, size_t Cin, size_t Cout, float beta) {
    ROUTE_CPU_ONLY(linear_q8_fwd, out, x, Wq, scale, b, N, Cin, Cout, beta);
}

void mc_k_linear_bwd(mc_backend *be, mc_prec prec, float *dx, float *dW, float *db, const float *dout, const float *x, const float *W, const uint16_t *Wb, size_t N, size_t Cin, size_t Cout) {
    ROUTE(linear_bwd, prec, dx, dW, db, dout, x, W, Wb, N, Cin, Cout);
}

void mc_k_gelu_fwd(mc_backend *be, float *out, const float *x, size_t n) {
    ROUTE(gelu_fwd, out, x, n);
}

void mc_k_gelu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t n) {
    ROUTE(gelu_bwd, dx, dout, x, n);
}

void mc_k_swiglu_fwd(mc_backend *be, float *out, const float *x, size_t N, size_t F) {
    ROUTE(swiglu_fwd, out, x, N, F);
}

void mc_k_swiglu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t N, size_t F) {
    ROUTE(swiglu_bwd, dx, dout, x, N, F);
}

void mc_k_qkv_split(mc_backend *be, float *q, float *k, float *v, const float *qkv, size_t N, size_t Q, size_t G, size_t D) {
    ROUTE(qkv_split, q, k, v, qkv, N, Q, G, D);
}

void mc_k_qkv_split_bwd(mc_backend *be, float *dqkv, const float *dq, const float *dk, const float *dv, size_t N, size_t Q, size_t G, size_t D) {
    ROUTE(qkv_split_bwd, dqkv, dq, dk, dv, N, Q, G, D);
}

void mc_k_rope_fwd(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D, float base, size_t pos0) {
    ROUTE(rope_fwd, x, B, T, H, D, base, pos0);
}

void mc_k_rope_bwd(mc_backend *be, float *dx, size_t B, size_t T, size_t H, size_t D, float base, size_t pos0) {
    ROUTE(rope_bwd, dx, B, T, H, D, base, pos0);
}

void mc_k_attention_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *k, const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale) {
    ROUTE(attention_fwd, out, lse, q, k, v, B, T, Q, G, D, scale);
}

void mc_k_attention_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *out, const float *lse, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale) {
    ROUTE(attention_bwd, dq, dk, dv, dout, q, k, v, out, lse, B, T, Q, G, D, scale);
}

void mc_k_attention_kv_fwd(mc_backend *be, float *out, const float *q, const float *kc, const float *vc, size_t n, size_t pos0, size_t Q, size_t G, size_t D, float scale) {
    ROUTE_CPU_ONLY(attention_kv_fwd, out, q, kc, vc, n, pos0, Q, G, D, scale);
}

void mc_k_xent_max(mc_backend *be, float *rowmax, const float *logits, size_t N, size_t vl) {
    ROUTE(xent_max, rowmax, logits, N, vl);
}

void mc_k_xent_sumexp(mc_backend *be, float *sumexp, float *tlogit, const float *logits, const float *rowmax, const int32_t *targets, int64_t v0, size_t N, size_t vl) {
    ROUTE(xent_sumexp, sumexp, tlogit, logits, rowmax, targets, v0, N, vl);
}

void mc_k_xent_loss(mc_backend *be, float *loss, const float *rowmax, const float *sumexp, const float *tlogit, const int32_t *targets, size_t N) {
    ROUTE(xent_loss, loss, rowmax, sumexp, tlogit, targets, N);
}

void mc_k_xent_bwd(mc_backend *be, float *dlogits, const float *logits, const float *rowmax, const float *sumexp, const int32_t *targets, int64_t v0, size_t N, size_t vl, const float *dloss, float scale) {
    ROUTE(xent_bwd, dlogits, logits, rowmax, sumexp, targets, v0, N, vl, dloss, scale);
}

void mc_k_adamw(mc_backend *be, float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale) {
    ROUTE(adamw, p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale);
}
