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
    MC_CPU_SCRATCH_PANEL_A,    /* b16gemm.c: each thread's packed block of A */
    MC_CPU_SCRATCH_PANEL_B,    /* b16gemm.c: a weight's panels made per call */
    MC_CPU_SCRATCH_N
};

_Static_assert(MC_CPU_SCRATCH_N <= MC_BACKEND_SCRATCH_SLOTS,
               "kern/backend.h: too few scratch slots");

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

/* The kernels: mc_cpu_NAME(be, ...) for each entry of mc/kern_ops.def, which
 * documents each under its mc_k_ name. */
#define MC_KERNEL(name, ret, params, args, backends) \
    ret mc_cpu_##name(mc_backend *be, MC_KERN_UNPAREN params);
#include "mc/kern_ops.def"

/* The causal attention forward of both (attention_kv.c): B sequences of n
 * query rows at positions pos0.., keys/values [B, L, G, D] (L >= pos0 + n),
 * out [B, n, Q, D], lse [B, Q, n] (log-sum-exp per row, NULL: not kept),
 * seg [B, n] the rows' segment starts as key indices (NULL: none; kern_ops.def
 * attention_fwd). */
void mc_cpu_attention_rows_fwd(mc_backend *be, float *out, float *lse, const float *q,
                               const float *kc, const float *vc, size_t B, size_t n, size_t pos0,
                               size_t L, size_t Q, size_t G, size_t D, float scale,
                               const int32_t *seg);

/* GEMMs on operands rounded once for many products (linear.c; the grouped
 * GEMM of moe.c): an operand is its values in the form prec multiplies,
 * es bytes an element (4: fp32 values, maybe rounded; 2: bf16 bits). */
typedef struct mc_cpu_gemm_op {
    const void *p;
    size_t es;
} mc_cpu_gemm_op;
mc_cpu_gemm_op mc_cpu_gemm_operand(mc_backend *be, mc_prec prec, int slot, const float *src,
                                   size_t n);
static inline const void *mc_cpu_gemm_at(mc_cpu_gemm_op o, size_t elem)
{
    return (const char *)o.p + elem * o.es;
}
void mc_cpu_gemm_ld(mc_backend *be, mc_prec prec, int ta, int tb, size_t M, size_t N, size_t K,
                    const void *A, size_t lda, const void *B, size_t ldb, float beta, float *C,
                    size_t ldc);

/* dst[i] = src[i] rounded to the nearest value of prec, held in fp32 (dst
 * may be src); vectorized on every path (elementwise.c). */
void mc_cpu_round_into(mc_backend *be, float *dst, const float *src, size_t n, mc_prec prec);
/* x[0..n) rounded to prec in place, on the calling thread and the backend's path:
 * a producing kernel's rows or spans while they are in cache (nothing for
 * MC_PREC_FP32) */
void mc_cpu_round_here(const mc_backend *be, float *x, size_t n, mc_prec prec);
/* out = W[0..n) prepared for the GEMMs of prec (mc_cpu_prepare_weight's
 * bytes) on the calling thread */
void mc_cpu_prepare_here(const mc_backend *be, mc_prec prec, void *out, const float *W, size_t n);
/* the same for a part of a copy of `whole` elements: a copy of at least
 * MC_CPU_STREAM_MIN (larger than the caches, not read again soon) is
 * written with stores that bypass the caches where the path has them */
void mc_cpu_prepare_part(const mc_backend *be, mc_prec prec, void *out, const float *W, size_t n,
                         size_t whole);
/* b16gemm.c, the GEMM of emulated bf16 on the AVX2 and AVX-512 paths: 1
 * where prec's GEMMs go through it (BF16 without oneDNN's bf16 GEMM, the
 * path AVX2 or above, MC_BF16_PANELS not 0), and then a linear weight's
 * prepared form (mc_k_prepare_weight with cols) is its two panel sets. */
int mc_cpu_b16_panels(const mc_backend *be, mc_prec prec);
/* W [O, I] as the forward's panels (B = W^T) into fwd and the d x
 * product's (B = W) into bwd, either NULL for none */
void mc_cpu_b16_pack(mc_backend *be, uint16_t *fwd, uint16_t *bwd, const float *W, size_t O,
                     size_t I);
/* the 16 rows [o0, o0 + 16) (fewer at the end) of W [O, I] into both
 * panel sets of the prepared form out (out: the forward's, out + O I: the
 * backward's) on the calling thread, streamed past the caches where nt
 * (mc_cpu_b16_stream: a large, aligned copy) */
void mc_cpu_b16_pack_rows(uint16_t *out, const float *W, size_t o0, size_t O, size_t I, int nt);
int mc_cpu_b16_stream(const uint16_t *out, size_t O, size_t I);
/* C[M,N] (row stride ldc) = beta C + op(A)[M,K] . B, B [K,N] in panels
 * (b16gemm.c); A row-major [M,K] (row stride lda), or with MC_CPU_B16_AT
 * in af its transpose stored [K,M]; its values taken as they are, or with
 * MC_CPU_B16_ROUND_A rounded to bf16 as they are packed (the same values
 * as mc_k_round's); beta 0 or 1. Bits independent of the threads. */
enum { MC_CPU_B16_AT = 1, MC_CPU_B16_ROUND_A = 2 };
void mc_cpu_b16_gemm(mc_backend *be, size_t M, size_t N, size_t K, unsigned af, const float *A,
                     size_t lda, const uint16_t *P, float beta, float *C, size_t ldc);
#define MC_CPU_STREAM_MIN ((size_t)1 << 20)

/* init.c's own ln u (u in (0, 1)) and cos(2 pi t) (t = k / 2^32 in
 * [0, 1)), the functions init_normal's vectorized loop inlines (for the
 * tests) */
double mc_cpu_init_log(double u);
double mc_cpu_init_cos_2pi(double t);

/* Round to the nearest value of prec and back to fp32. */
static inline float mc_round_prec(float f, mc_prec prec)
{
    if (prec == MC_PREC_BF16) return mc_bf16_to_f32(mc_f32_to_bf16(f));
    if (prec == MC_PREC_FP16) return mc_fp16_to_f32(mc_f32_to_fp16(f));
    if (prec == MC_PREC_TF32) return mc_round_tf32(f);
    return f;
}

#endif
