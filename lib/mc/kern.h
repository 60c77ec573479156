/*
 * kern.h - the kernel interface: the only code that reads or writes tensor
 * elements. Model and training code call these; a backend (kern/cpu,
 * kern/cuda) implements them, and kern/dispatch.c routes each call to the
 * backend it was given. All tensor pointers are backend memory from
 * mc_balloc; the host moves bytes in and out only with mc_bcopy_*.
 *
 * Conventions (every kernel):
 * - Row-major. N = number of token rows (B*T), C = hidden size.
 * - Activations and parameters are fp32 in memory. `prec` on GEMM kernels
 *   says how the multiplication is computed: MC_PREC_FP32 exactly in fp32;
 *   MC_PREC_BF16 / MC_PREC_FP16 with both operands rounded to that type
 *   (round to nearest even) and products accumulated in fp32, as a bf16/fp16
 *   GEMM with fp32 accumulation does on a GPU; MC_PREC_TF32 likewise with
 *   operands rounded to TF32 (on the GPU: cuBLAS's TF32 tensor-core mode,
 *   whose operand rounding may differ in the last TF32 bit).
 * - Backward kernels ADD into every gradient output (dx, dW, db: +=), so
 *   gradients accumulate over micro-batches and over residual branches; the
 *   caller zeroes what must start at zero. A NULL gradient output is skipped.
 * - Kernels cannot fail for valid arguments; argument errors are bugs of the
 *   caller and are checked with assertions, not statuses. Allocation and
 *   backend creation return statuses.
 * - Determinism: for the same inputs and thread count, every kernel gives
 *   bit-identical results run after run (no atomics-order dependence).
 */
#ifndef MC_KERN_H
#define MC_KERN_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_prec {
    MC_PREC_FP32 = 0,
    MC_PREC_BF16 = 1,
    MC_PREC_FP16 = 2,
    MC_PREC_TF32 = 3 /* fp32 operands rounded to 10 mantissa bits (tensor cores' TF32) */
} mc_prec;

typedef struct mc_backend mc_backend;

/* ------------------------------------------------------------ backend */

/* CPU backend; threads <= 0 means the cores present (OpenMP and BLAS). */
mc_status mc_backend_cpu_new(int threads, mc_backend **out, mc_error *err);
/* CUDA backend on GPU `device`; device < 0 picks this process's GPU from its
 * local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID or
 * LOCAL_RANK, modulo the GPUs visible). Fails with one clear message when mc
 * was built without CUDA or there is no usable GPU. */
mc_status mc_backend_cuda_new(int device, mc_backend **out, mc_error *err);
/* GPUs the CUDA backend can use: 0 when built without it or none present. */
int mc_backend_cuda_devices(void);
void mc_backend_free(mc_backend *be);
const char *mc_backend_name(const mc_backend *be); /* "cpu", "cuda" */
int mc_backend_threads(const mc_backend *be);

/* Backend memory: 64-byte aligned, zero-filled. NULL on failure (err set). */
void *mc_balloc(mc_backend *be, size_t bytes, mc_error *err);
void mc_bfree(mc_backend *be, void *p);
void mc_bcopy_from_host(mc_backend *be, void *dst, const void *host, size_t bytes);
void mc_bcopy_to_host(mc_backend *be, void *host, const void *src, size_t bytes);
void mc_bcopy(mc_backend *be, void *dst, const void *src, size_t bytes);
/* Wait until every kernel queued so far has finished (no-op on the CPU). */
void mc_bsync(mc_backend *be);

/* ------------------------------------------------------------ elementwise */

void mc_k_fill(mc_backend *be, float *x, float v, size_t n);
void mc_k_scale(mc_backend *be, float *x, float s, size_t n);            /* x *= s */
void mc_k_add(mc_backend *be, float *out, const float *a, const float *b, size_t n); /* out = a + b */
void mc_k_acc(mc_backend *be, float *acc, const float *x, size_t n);     /* acc += x */
/* Sum of squares accumulated in double, returned to the host. */
double mc_k_sumsq(mc_backend *be, const float *x, size_t n);
/* 1 when every element is finite. */
int mc_k_all_finite(mc_backend *be, const float *x, size_t n);
/* Mean of x[0..n), accumulated in double. */
double mc_k_mean(mc_backend *be, const float *x, size_t n);

/* Round every element to bf16 or fp16 and back (what storing in that type
 * loses); used for bf16 checkpoints and tests. */
void mc_k_round(mc_backend *be, float *x, size_t n, mc_prec prec);
void mc_k_cast_to_bf16(mc_backend *be, uint16_t *out, const float *x, size_t n);
void mc_k_cast_from_bf16(mc_backend *be, float *out, const uint16_t *x, size_t n);
void mc_k_cast_to_fp16(mc_backend *be, uint16_t *out, const float *x, size_t n);
void mc_k_cast_from_fp16(mc_backend *be, float *out, const uint16_t *x, size_t n);

/* ------------------------------------------------------------ init */

/* Counter-based normal initialization of a 2-D block of a global matrix:
 * x[r*cols + c] = std * N(0,1) drawn from (seed, key, global index g) with
 * g = (row0 + r) * global_cols + (col0 + c). key identifies the parameter
 * (a hash of its name). The same (seed, key, g) always gives the same value,
 * whatever the block, so a TP-split parameter equals a slice of the whole. */
void mc_k_init_normal(mc_backend *be, float *x, size_t rows, size_t cols, uint64_t global_cols,
                      uint64_t row0, uint64_t col0, uint64_t seed, uint64_t key, float std);
/* 64-bit key of a parameter name (FNV-1a), for mc_k_init_normal. */
uint64_t mc_k_name_key(const char *name);

/* ------------------------------------------------------------ embedding */

/* Vocab-parallel embedding: this rank holds rows [v0, v0+vl) of the table.
 * out[i,:] = wte[ids[i]-v0,:] when ids[i] is in range, else 0 (the tensor-
 * parallel all-reduce then completes the lookup). */
void mc_k_embed_fwd(mc_backend *be, float *out, const int32_t *ids, size_t N, const float *wte,
                    int64_t v0, int64_t vl, size_t C);
void mc_k_embed_bwd(mc_backend *be, float *dwte, const float *dout, const int32_t *ids, size_t N,
                    int64_t v0, int64_t vl, size_t C);
/* Learned absolute positions: out[b,t,:] += wpe[pos0+t,:] for t < T. */
void mc_k_posemb_fwd(mc_backend *be, float *out, const float *wpe, size_t B, size_t T, size_t C,
                     size_t pos0);
void mc_k_posemb_bwd(mc_backend *be, float *dwpe, const float *dout, size_t B, size_t T, size_t C,
                     size_t pos0);

/* ------------------------------------------------------------ norms */

/* LayerNorm over the last dim: out = (x - mean) * rstd * w + b (b may be NULL);
 * saves mean[N], rstd[N] for the backward. */
void mc_k_layernorm_fwd(mc_backend *be, float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, size_t N, size_t C, float eps);
void mc_k_layernorm_bwd(mc_backend *be, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *w, const float *mean, const float *rstd,
                        size_t N, size_t C);
/* RMSNorm: out = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps). */
void mc_k_rmsnorm_fwd(mc_backend *be, float *out, float *rstd, const float *x, const float *w,
                      size_t N, size_t C, float eps);
void mc_k_rmsnorm_bwd(mc_backend *be, float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, size_t N, size_t C);

/* ------------------------------------------------------------ linear */

/* out[N,Cout] = x[N,Cin] . W[Cout,Cin]^T (+ b[Cout]); W is stored as Megatron
 * stores it, [output, input]. beta = 0 overwrites out, 1 adds to it.
 * Wb: NULL, or W already rounded to bf16 (mc_k_cast_to_bf16's bits, same
 * layout), which a backend may use instead of rounding W itself when prec is
 * MC_PREC_BF16: the caller rounds a weight once for all the products that
 * use it (the model: once per forward pass, not per GEMM). The result is
 * the same bits either way. */
void mc_k_linear_fwd(mc_backend *be, mc_prec prec, float *out, const float *x, const float *W,
                     const uint16_t *Wb, const float *b, size_t N, size_t Cin, size_t Cout,
                     float beta);
/* dx[N,Cin] += dout . W; dW[Cout,Cin] += dout^T . x; db[Cout] += sum_rows dout.
 * Wb as for mc_k_linear_fwd. */
void mc_k_linear_bwd(mc_backend *be, mc_prec prec, float *dx, float *dW, float *db,
                     const float *dout, const float *x, const float *W, const uint16_t *Wb,
                     size_t N, size_t Cin, size_t Cout);

/* Weight-only int8 linear for inference. W is held as int8 codes Wq[Cout,Cin]
 * with one fp32 scale per output row: mc_k_quantize_q8_rows makes them from
 * fp32 W (scale = absmax / 127, code = round-half-even(w / scale), the int8
 * quantization of mc-formats(5)), and mc_k_linear_q8_fwd computes
 * out[N,Cout] = beta * out + x . (Wq * scale)^T (+ b), fp32 activations and
 * accumulation. Wq and scale are backend memory (Wq from mc_balloc too). */
void mc_k_quantize_q8_rows(mc_backend *be, int8_t *Wq, float *scale, const float *W, size_t rows,
                           size_t cols);
void mc_k_linear_q8_fwd(mc_backend *be, float *out, const float *x, const int8_t *Wq,
                        const float *scale, const float *b, size_t N, size_t Cin, size_t Cout,
                        float beta);

/* ------------------------------------------------------------ activations */

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void mc_k_gelu_fwd(mc_backend *be, float *out, const float *x, size_t n);
void mc_k_gelu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t n);
/* SwiGLU as Megatron: x[N, 2F] holds (a | b) along the last dim;
 * out[N,F] = silu(a) * b. */
void mc_k_swiglu_fwd(mc_backend *be, float *out, const float *x, size_t N, size_t F);
void mc_k_swiglu_bwd(mc_backend *be, float *dx, const float *dout, const float *x, size_t N,
                     size_t F);

/* ------------------------------------------------------------ attention */

/* Split Megatron's fused QKV output [N, G, (Q/G + 2) * D] (per query group:
 * its Q/G query heads, then one key head, then one value head) into
 * q[N, Q, D], k[N, G, D], v[N, G, D]. G = query groups, Q = query heads
 * (local to this rank). The backward adds into dqkv. */
void mc_k_qkv_split(mc_backend *be, float *q, float *k, float *v, const float *qkv, size_t N,
                    size_t Q, size_t G, size_t D);
void mc_k_qkv_split_bwd(mc_backend *be, float *dqkv, const float *dq, const float *dk,
                        const float *dv, size_t N, size_t Q, size_t G, size_t D);

/* Rotary embedding in place on x[B, T, H, D] (Megatron/HF "rotate half":
 * pairs (i, i + D/2), inv_freq_i = base^(-2i/D), angle = (pos0 + t) inv_freq_i).
 * The backward applies the inverse rotation to the gradient in place. */
void mc_k_rope_fwd(mc_backend *be, float *x, size_t B, size_t T, size_t H, size_t D, float base,
                   size_t pos0);
void mc_k_rope_bwd(mc_backend *be, float *dx, size_t B, size_t T, size_t H, size_t D, float base,
                   size_t pos0);

/* Causal attention with grouped queries, tiled with an online softmax so no
 * T x T matrix is ever stored: q[B,T,Q,D], k,v[B,T,G,D] (query head h uses
 * group h / (Q/G)); out[B,T,Q,D]; lse[B,Q,T] = log-sum-exp of each row's
 * scaled scores, kept for the backward. scale is usually 1/sqrt(D). */
void mc_k_attention_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *k,
                        const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D,
                        float scale);
void mc_k_attention_bwd(mc_backend *be, float *dq, float *dk, float *dv, const float *dout,
                        const float *q, const float *k, const float *v, const float *out,
                        const float *lse, size_t B, size_t T, size_t Q, size_t G, size_t D,
                        float scale);
/* Inference: n new query rows q[n,Q,D] at positions pos0 .. pos0+n-1 of one
 * sequence against the key/value cache kc, vc[L,G,D] that already holds
 * positions 0 .. pos0+n-1 (the new rows' own keys included; L is the cache's
 * capacity). Row i attends keys 0 .. pos0+i; out[n,Q,D]. No lse (there is no
 * backward). pos0 = 0, n = T is mc_k_attention_fwd's forward for B = 1. */
void mc_k_attention_kv_fwd(mc_backend *be, float *out, const float *q, const float *kc,
                           const float *vc, size_t n, size_t pos0, size_t Q, size_t G, size_t D,
                           float scale);

/* ------------------------------------------------------------ cross-entropy */

/* Vocab-parallel softmax cross-entropy in three steps, so a tensor-parallel
 * caller can all-reduce between them: logits[N, vl] are this rank's columns
 * [v0, v0+vl) of the vocabulary.
 *   1. rowmax[i] = max_j logits[i,j]                       (then all-reduce MAX)
 *   2. sumexp[i] = sum_j exp(logits[i,j] - rowmax[i]);
 *      tlogit[i] = logits[i, targets[i]-v0] if in range else 0  (all-reduce SUM both)
 *   3. loss[i] = log(sumexp[i]) + rowmax[i] - tlogit[i]
 * Targets < 0 are ignored (loss 0, no gradient). */
void mc_k_xent_max(mc_backend *be, float *rowmax, const float *logits, size_t N, size_t vl);
void mc_k_xent_sumexp(mc_backend *be, float *sumexp, float *tlogit, const float *logits,
                      const float *rowmax, const int32_t *targets, int64_t v0, size_t N,
                      size_t vl);
void mc_k_xent_loss(mc_backend *be, float *loss, const float *rowmax, const float *sumexp,
                    const float *tlogit, const int32_t *targets, size_t N);
/* dlogits = dloss[i] * (softmax - onehot), WRITTEN (not added), and may alias
 * logits (in place), so the probabilities are never stored separately.
 * dloss == NULL means every row's weight is `scale`. */
void mc_k_xent_bwd(mc_backend *be, float *dlogits, const float *logits, const float *rowmax,
                   const float *sumexp, const int32_t *targets, int64_t v0, size_t N, size_t vl,
                   const float *dloss, float scale);

/* ------------------------------------------------------------ optimizer */

/* AdamW on one contiguous span, decoupled weight decay:
 *   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * p)
 * bc1 = 1 - b1^step, bc2 = 1 - b2^step (computed by the caller). */
void mc_k_adamw(mc_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                float grad_scale);

#ifdef __cplusplus
}
#endif
#endif
