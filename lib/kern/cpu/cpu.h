/*
 * cpu.h - private to the CPU backend (the files of lib/kern/cpu) and the
 * dispatcher (lib/kern/dispatch.c): the mc_cpu_* kernels, which are kern.h's
 * mc_k_* with the same arguments, its scratch memory, and the scalar
 * bf16/fp16 conversions every file shares.
 */
#ifndef MC_KERN_CPU_H
#define MC_KERN_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "mc/kern.h"
#include "kern/backend.h"
#include "kern/fpconv.h"

/* Scratch slots: each kernel family uses its own so that one kernel's
 * buffers never alias another's while both are live. */
enum {
    MC_CPU_SCRATCH_GEMM_A = 0, /* rounded / converted first GEMM operand */
    MC_CPU_SCRATCH_GEMM_B,     /* second GEMM operand */
    MC_CPU_SCRATCH_GEMM_C,     /* third operand of the backward (dout) */
    MC_CPU_SCRATCH_WORK,       /* per-thread work space (attention, rope, norms) */
    MC_CPU_SCRATCH_N
};

_Static_assert(MC_CPU_SCRATCH_N <= MC_BACKEND_SCRATCH_SLOTS, "kern/backend.h: too few scratch slots");

/* Scratch buffer `slot` of at least `bytes` bytes (contents undefined). It is
 * reused across calls, so steady-state training allocates nothing. Kernels
 * cannot return a status: running out of memory here aborts (like any other
 * failed kernel precondition). */
void *mc_cpu_scratch(mc_backend *be, int slot, size_t bytes);

/* Backend object and memory (backend.c); the kern.h functions of the same
 * name without "cpu_" dispatch here for a CPU backend. */
void mc_cpu_backend_free(mc_backend *be);
void *mc_cpu_balloc(mc_backend *be, size_t bytes, mc_error *err);
void mc_cpu_bfree(mc_backend *be, void *p);
void mc_cpu_bcopy_from_host(mc_backend *be, void *dst, const void *host, size_t bytes);
void mc_cpu_bcopy_to_host(mc_backend *be, void *host, const void *src, size_t bytes);
void mc_cpu_bcopy(mc_backend *be, void *dst, const void *src, size_t bytes);
void mc_cpu_bsync(mc_backend *be);

/* The kernels: kern.h documents each under its mc_k_ name. */
void mc_cpu_fill(mc_backend *be, float *x, float v, size_t n);
void mc_cpu_scale(mc_backend *be, float *x, float s, size_t n);
void mc_cpu_add(mc_backend *be, float *out, const float *a, const float *b, size_t n);
void mc_cpu_acc(mc_backend *be, float *acc, const float *x, size_t n);
double mc_cpu_sumsq(mc_backend *be, const float *x, size_t n);
int mc_cpu_all_finite(mc_backend *be, const float *x, size_t n);
double mc_cpu_mean(mc_backend *be, const float *x, size_t n);
void mc_cpu_round(mc_backend *be, float *x, size_t n, mc_prec prec);
void mc_cpu_cast_to_bf16(mc_backend *be, uint16_t *out, const float *x, size_t n);
void mc_cpu_cast_from_bf16(mc_backend *be, float *out, const uint16_t *x, size_t n);
void mc_cpu_cast_to_fp16(mc_backend *be, uint16_t *out, const float *x, size_t n);
void mc_cpu_cast_from_fp16(mc_backend *be, float *out, const uint16_t *x, size_t n);
void mc_cpu_init_normal(mc_backend *be, float *x, size_t rows, size_t cols, uint64_t global_cols, uint64_t row0, uint64_t col0, uint64_t seed, uint64_t key, float std);
void mc_cpu_embed_fwd(mc_backend *be, float *out, const int32_t *ids, size_t N, const float *wte, int64_t v0, int64_t vl, size_t C);
void mc_cpu_embed_bwd(mc_backend *be, float *dwte, const float *dout, const int32_t *ids, size_t N, int64_t v0, int64_t vl, size_t C);
void mc_cpu_posemb_fwd(mc_backend *be, float *out, const float *wpe, size_t B, size_t T, size_t C, size_t pos0);
void mc_cpu_posemb_bwd(mc_backend *be, float *dwpe, const float *dout, size_t B, size_t T, size_t C, size_t pos0);
void mc_cpu_layernorm_fwd(mc_backend *be, float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, size_t N, size_t C, float eps);
void mc_cpu_layernorm_bwd(mc_backend *be, float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, const float *mean, const float *rstd, size_t N, size_t C);
void mc_cpu_rmsnorm_fwd(mc_backend *be, float *out, float *rstd, const float *x, const float *w, size_t N, size_t C, float eps);
void mc_cpu_rmsnorm_bwd(mc_backend *be, float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, size_t N, size_t C);
void mc_cpu_linear_fwd(mc_backend *be, mc_prec prec, float *out, const float *x, const float *W, const uint16_t *Wb, const float *b, size_t N, size_t Cin, size_t Cout, float beta);
void mc_cpu_quantize_q8_rows(mc_backend *be, int8_t *Wq, float *scale, const float *W, size_t rows, size_t cols);
void mc_cpu_linear_q8_fwd(mc_backend *be, float *out, const float *x, const int8_t *Wq, const float *scale, const float *b, size_t N, size_t Cin, size_t Cout, float beta);
void mc_cpu_linear_bwd(mc_backend *be, mc_prec prec, float *dx, float *dW, float *db, const float *dout, const float *x, const float *W, const uint16_t *Wb, size_t N, size_t Cin, size_t Cout);
void mc_cpu_gelu_fwd(mc_backend *be, float *out, const float *x, size_t n);
void mc_cpu_gelu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t n);
void mc_cpu_swiglu_fwd(mc_backend *be, float *out, const float *x, size_t N, size_t F);
void mc_cpu_swiglu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t N, size_t F);
void mc_cpu_qkv_split(mc_backend *be, float *q, float *k, float *v, const float *qkv, size_t N, size_t Q, size_t G, size_t D);
void mc_cpu_qkv_split_bwd(mc_backend *be, float *dqkv, const float *dq, const float *dk, const float *dv, size_t N, size_t Q, size_t G, size_t D);
void mc_cpu_rope_fwd(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D, float base, size_t pos0);
void mc_cpu_rope_bwd(mc_backend *be, float *dx, size_t B, size_t T, size_t H, size_t D, float base, size_t pos0);
void mc_cpu_attention_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *k, const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale);
void mc_cpu_attention_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *out, const float *lse, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale);
/* The causal attention forward of both (attention_kv.c): B sequences of n
 * query rows at positions pos0.., keys/values [B, L, G, D] (L >= pos0 + n),
 * out [B, n, Q, D], lse [B, Q, n] (log-sum-exp per row, NULL: not kept). */
void mc_cpu_attention_rows_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *kc, const float *vc, size_t B, size_t n, size_t pos0, size_t L, size_t Q, size_t G, size_t D, float scale);
void mc_cpu_attention_kv_fwd(mc_backend *be, float *out, const float *q, const float *kc, const float *vc, size_t n, size_t pos0, size_t Q, size_t G, size_t D, float scale);
void mc_cpu_xent_max(mc_backend *be, float *rowmax, const float *logits, size_t N, size_t vl);
void mc_cpu_xent_sumexp(mc_backend *be, float *sumexp, float *tlogit, const float *logits, const float *rowmax, const int32_t *targets, int64_t v0, size_t N, size_t vl);
void mc_cpu_xent_loss(mc_backend *be, float *loss, const float *rowmax, const float *sumexp, const float *tlogit, const int32_t *targets, size_t N);
void mc_cpu_xent_bwd(mc_backend *be, float *dlogits, const float *logits, const float *rowmax, const float *sumexp, const int32_t *targets, int64_t v0, size_t N, size_t vl, const float *dloss, float scale);
void mc_cpu_adamw(mc_backend *be, float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale);

/* Round to the nearest value of prec and back to fp32. */
static inline float mc_round_prec(float f, mc_prec prec) {
    if (prec == MC_PREC_BF16) return mc_bf16_to_f32(mc_f32_to_bf16(f));
    if (prec == MC_PREC_FP16) return mc_fp16_to_f32(mc_f32_to_fp16(f));
    if (prec == MC_PREC_TF32) return mc_round_tf32(f);
    return f;
}

#endif
