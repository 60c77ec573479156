/*
 * kern.h - the kernel interface: the only code that reads or writes tensor
 * elements. Model and training code call these; a backend (kern/cpu,
 * kern/cuda) implements them, and kern/dispatch.c routes each call to the
 * backend it was given. The kernels are listed once, in mc/kern_ops.def
 * (installed with this header), which declares them here. All tensor
 * pointers are backend memory from mc_balloc; the host moves bytes in and
 * out only with mc_bcopy_*.
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

/* The exact argument of mc_k_linear_fwd / mc_k_linear_bwd: which operands
 * already hold values of the GEMM's precision (rounded by mc_k_round or by
 * their producer), so the backend need not round them again. */
#define MC_LIN_EXACT_X 1u
#define MC_LIN_EXACT_DOUT 2u
/* mc_k_linear_bwd only: dout is the caller's scratch, read by nothing after
 * the call, so a backend whose GEMMs multiply rounded fp32 (emulated bf16,
 * fp16, tf32) may round it in place, where it would otherwise write the
 * rounded copy to its own scratch (the bias gradient still sums the values
 * as given). dout's contents after the call are undefined. */
#define MC_LIN_DOUT_SCRATCH 4u
/* mc_k_linear_bwd only: dx is written (dout . W), not added to, and may be
 * x itself: the weight gradient, which reads x, is made first. */
#define MC_LIN_DX_WRITE 8u

typedef struct mc_backend mc_backend;

/* ------------------------------------------------------------ backend */

/* CPU backend; threads <= 0 means the cores present (OpenMP and BLAS).
 * MC_CPU_ISA in the environment pins its kernels' path (mc_backend_isa);
 * a value that is no path or one the CPU lacks is MC_ERR_USAGE. */
mc_status mc_backend_cpu_new(int threads, mc_backend **out, mc_error *err);
/* That check of MC_CPU_ISA alone, for a tool to make before any work. */
mc_status mc_backend_cpu_check_env(mc_error *err);
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
/* The CPU kernels' code path: "avx512", "avx2" or "baseline" (the CPU's
 * best, or the one the environment variable MC_CPU_ISA pins); "cuda" for
 * the CUDA backend. */
const char *mc_backend_isa(const mc_backend *be);
/* 1 when MC_PREC_BF16 GEMMs are emulated: the CPU (or the pinned path) has
 * no bf16 GEMM, so the operands are rounded to bf16 values held in fp32
 * and multiplied in fp32 (the same numbers): by the fp32 GEMM on the
 * baseline path, by a GEMM that widens bf16 weights in registers on the
 * AVX2 and AVX-512 paths (mc_backend_weight_panels). */
int mc_backend_bf16_emulated(const mc_backend *be);
/* Bytes an element of a weight prepared for the GEMMs of precision prec
 * (mc_k_prepare_weight): 2 (native bf16), 4 (rounded fp32, or a linear
 * weight's two bf16 panel sets), or 0 where the backend keeps no prepared
 * copy (fp32; the CUDA backend). */
size_t mc_backend_weight_bytes(const mc_backend *be, mc_prec prec);
/* 1 when a linear weight's prepared form for prec depends on its shape
 * (emulated bf16 on the CPU's AVX2 and AVX-512 paths: bf16 panels of its
 * columns and of its rows, mc_k_prepare_weight with cols): it is made a
 * whole weight at a time, never in pieces. 0 otherwise. */
int mc_backend_weight_panels(const mc_backend *be, mc_prec prec);
/* The one line the tools print (start-up log, --dry-run) when bf16 GEMMs
 * are emulated on this backend, naming the path; NULL when they are not. */
const char *mc_backend_bf16_note(const mc_backend *be);
/* The CPU backend's OpenBLAS kernels by OpenBLAS's name ("SkylakeX",
 * "Haswell", ...; NULL for the CUDA backend), and the one line the tools
 * print when they are not at the level of the backend's path (OpenBLAS's
 * own choice on a CPU it does not know, or OPENBLAS_CORETYPE set by hand);
 * NULL when they are. mc's programs set OPENBLAS_CORETYPE before OpenBLAS
 * loads (mc/preinit.h). */
const char *mc_backend_blas_core(const mc_backend *be);
const char *mc_backend_blas_note(const mc_backend *be);

/* The precision the attention kernels (attention_fwd, attention_bwd) may
 * use for their products: MC_PREC_FP32 (the default) computes them in fp32;
 * MC_PREC_BF16 lets the CUDA backend run them on the tensor cores with bf16
 * operands (q, k, v, dout and the probabilities rounded to bf16) and fp32
 * accumulation, as FlashAttention does on bf16 tensors; other values mean
 * fp32. The CPU backend's attention stays fp32 whatever is set (it is not
 * where a CPU step's time goes). The models set it from their precision
 * before each attention call. */
void mc_backend_set_attention_prec(mc_backend *be, mc_prec prec);

/* The bytes this backend can still allocate, for the check that a model
 * fits before any allocation (mc-train, mc-eval): the CUDA backend's GPU's
 * free memory (cudaMemGetInfo) plus what its allocator holds cached; the
 * CPU backend's machine's RAM and swap together (sysinfo(2)), a ceiling,
 * since the page cache and other processes share it and Linux lends more
 * than it has. what (cap bytes) gets words naming it for a message ("GPU 0
 * (NVIDIA H100 80GB HBM3)", "this machine (RAM and swap)"). 0 when it
 * cannot be known. */
double mc_backend_mem_available(const mc_backend *be, char *what, size_t cap);

/* mc_k_fp8_gemm calls so far that ran cuBLASLt's FP8 GEMMs (*fp8) and that
 * fell back to the fp32 GEMM (*fallback: no FP8 algorithm for the shape,
 * or MC_CUDA_FP8_GEMM=0); both 0 on the CPU backend, whose FP8 GEMMs are
 * its fp32 GEMM by definition. */
void mc_backend_fp8_gemm_stats(const mc_backend *be, size_t *fp8, size_t *fallback);

/* Backend memory: 64-byte aligned, zero-filled. NULL on failure (err set). */
void *mc_balloc(mc_backend *be, size_t bytes, mc_error *err);
void mc_bfree(mc_backend *be, void *p);
void mc_bcopy_from_host(mc_backend *be, void *dst, const void *host, size_t bytes);
void mc_bcopy_to_host(mc_backend *be, void *host, const void *src, size_t bytes);
void mc_bcopy(mc_backend *be, void *dst, const void *src, size_t bytes);
/* Wait until every kernel queued so far has finished (no-op on the CPU). */
void mc_bsync(mc_backend *be);

/* Device streams, for the communication layer (comm/nccl.c) to queue its
 * collectives beside the kernels. MC_STREAM_COMPUTE runs the kernels,
 * MC_STREAM_COMM the collectives. */
typedef enum mc_stream { MC_STREAM_COMPUTE = 0, MC_STREAM_COMM = 1 } mc_stream;
/* 1 when the backend's memory is device memory (CUDA). */
int mc_backend_is_device(const mc_backend *be);
/* The stream as a cudaStream_t; NULL on the CPU backend. */
void *mc_backend_stream(mc_backend *be, mc_stream which);
/* Make `waiter` wait for the work queued so far on `signaler` without
 * blocking the host (no-op on the CPU backend). */
void mc_backend_stream_wait(mc_backend *be, mc_stream waiter, mc_stream signaler);

/* ------------------------------------------------------------ kernels */

/* RoPE's frequencies (rope_fwd and rope_bwd in mc/kern_ops.def): the pairs
 * (i, i + rot_dim/2), i < rot_dim/2, of each head's first rot_dim dims
 * (rot_dim 0: the whole head; the dims after are left as they are, as
 * Megatron's --rotary-percent) turn at inv_freq_i = base^(-2i/rot_dim),
 * and with `scaling` Llama 3.1's: with wavelength w_i = 2 pi / inv_freq_i
 * and L = original_max_position_embeddings, frequencies of w_i > L /
 * low_freq_factor are divided by factor, those of w_i < L /
 * high_freq_factor kept, and those between blended with s = (L / w_i -
 * low_freq_factor) / (high_freq_factor - low_freq_factor) as
 * (1 - s) inv / factor + s inv (transformers' "llama3" rope_type,
 * Megatron's --use-rope-scaling). */
typedef struct mc_rope {
    float base;
    int rot_dim;
    int scaling;
    float factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} mc_rope;
/* inv_freq_i of r for a head of d dims, in double. */
double mc_rope_inv_freq(const mc_rope *r, size_t d, size_t i);

/* Mixture-of-experts routing (moe_route_fwd/_bwd, moe_aux_loss in
 * mc/kern_ops.def), Megatron Core's topk_routing_with_score_function:
 * each token's top `topk` experts of E by its scores, with scores
 * softmax(logits) (`sigmoid` 0) or sigmoid(logits) (`sigmoid` 1).
 * Softmax: the top-k of the logits, their probabilities the softmax of
 * those k logits; with `pre_softmax` the top-k of softmax(logits) over all
 * E, their probabilities those scores. Sigmoid: the top-k of sigmoid(l)
 * (+ the expert bias when one is given, for the choice only), their
 * probabilities the k sigmoids divided by their sum (+ 1e-20) when k > 1.
 * Then times scaling_factor (0: none). Group-limited routing (num_groups
 * > 0): the experts are num_groups consecutive groups; a token's groups
 * are ranked by the sum of their top (topk / group_topk) routing scores,
 * the best group_topk kept, and the top-k taken among their experts.
 * Ties go to the lower index; the k choices are in descending order. */
/* The most experts the routing kernels take. */
#define MC_MOE_MAX_EXPERTS 1024

typedef struct mc_moe_route {
    int topk;
    int sigmoid;
    int pre_softmax;
    float scaling_factor;
    int num_groups, group_topk;
} mc_moe_route;

/* The kernels: mc_k_NAME(be, ...) for each entry MC_KERNEL(NAME, ...) of
 * mc/kern_ops.def, which documents each beside its entry. */
#define MC_KERN_UNPAREN(...) __VA_ARGS__
#define MC_KERNEL(name, ret, params, args, backends) \
    ret mc_k_##name(mc_backend *be, MC_KERN_UNPAREN params);
#include "mc/kern_ops.def"

/* Bytes of mc_k_pack_q8a8's packed copy of a [rows, cols] int8 matrix. */
size_t mc_k_q8a8_packed_bytes(size_t rows, size_t cols);

/* 64-bit key of a parameter name (FNV-1a), for mc_k_init_normal. */
uint64_t mc_k_name_key(const char *name);

#ifdef __cplusplus
}
#endif
#endif
