/*
 * elementwise.cu - kernels that treat tensors as flat arrays: fill, scale,
 * add, accumulate; the host-bound reductions (sum of squares, mean,
 * finiteness); rounding and casts to bf16/fp16; the counter-based normal
 * initialization; GELU, SwiGLU and the AdamW update.
 *
 * Reductions are deterministic: the split into blocks depends only on n
 * (never on the GPU), each thread sums its strided elements in order in
 * double, blocks reduce in a fixed tree, and one block adds the block sums in
 * a fixed tree. No floating-point atomics anywhere.
 */
#include <math.h>
#include "kern/cuda/internal.cuh"

#define TPB 256
#define RED_THREADS 256
#define RED_MAX_BLOCKS 1024

__global__ void k_fill(float *x, float v, size_t n) { GRID_STRIDE(i, n) x[i] = v; }
__global__ void k_scale(float *x, float s, size_t n) { GRID_STRIDE(i, n) x[i] *= s; }
__global__ void k_add(float *o, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}
__global__ void k_acc(float *acc, const float *x, size_t n) { GRID_STRIDE(i, n) acc[i] += x[i]; }

extern "C" void mc_cuda_fill(mc_cuda *cu, float *x, float v, size_t n)
{
    if (!n) return;
    k_fill<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(x, v, n);
    KCHECK();
}
extern "C" void mc_cuda_scale(mc_cuda *cu, float *x, float s, size_t n)
{
    if (!n) return;
    k_scale<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(x, s, n);
    KCHECK();
}
extern "C" void mc_cuda_add(mc_cuda *cu, float *out, const float *a, const float *b, size_t n)
{
    if (!n) return;
    k_add<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(out, a, b, n);
    KCHECK();
}
extern "C" void mc_cuda_acc(mc_cuda *cu, float *acc, const float *x, size_t n)
{
    if (!n) return;
    k_acc<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(acc, x, n);
    KCHECK();
}

/* ---------------------------------------------------- reductions */

/* Fixed tree over a block's RED_THREADS values (in shared memory). */
__device__ double block_sum_d(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* part[b] = sum over i = b*T + t + k*P*T of f(x[i]); f = x^2 (mode 1), x (0),
 * or "is not finite" (2) */
__global__ void k_reduce_part(double *part, const float *x, size_t n, int mode)
{
    __shared__ double sh[RED_THREADS];
    double s = 0.0;
    size_t stride = (size_t)gridDim.x * RED_THREADS;
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        if (mode == 1)
            s += (double)v * (double)v;
        else if (mode == 0)
            s += (double)v;
        else
            s += (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0;
    }
    double t = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

__global__ void k_reduce_final(double *out, const double *part, unsigned np)
{
    __shared__ double sh[RED_THREADS];
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < np; i += RED_THREADS) s += part[i];
    double t = block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = t;
}

static double reduce_to_host(mc_cuda *cu, const float *x, size_t n, int mode)
{
    if (!n) return 0.0;
    size_t nb = (n + 4095) / 4096;
    unsigned P = nb > RED_MAX_BLOCKS ? RED_MAX_BLOCKS : (unsigned)nb;
    double *part = (double *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, (P + 1) * sizeof(double));
    k_reduce_part<<<P, RED_THREADS, 0, cu->stream>>>(part + 1, x, n, mode);
    KCHECK();
    k_reduce_final<<<1, RED_THREADS, 0, cu->stream>>>(part, part + 1, P);
    KCHECK();
    CU_CHECK(
        cudaMemcpyAsync(cu->host_red, part, sizeof(double), cudaMemcpyDeviceToHost, cu->stream));
    CU_CHECK(cudaStreamSynchronize(cu->stream));
    return cu->host_red[0];
}

extern "C" double mc_cuda_sumsq(mc_cuda *cu, const float *x, size_t n)
{
    return reduce_to_host(cu, x, n, 1);
}
extern "C" double mc_cuda_mean(mc_cuda *cu, const float *x, size_t n)
{
    return n ? reduce_to_host(cu, x, n, 0) / (double)n : 0.0;
}
extern "C" int mc_cuda_all_finite(mc_cuda *cu, const float *x, size_t n)
{
    return reduce_to_host(cu, x, n, 2) == 0.0;
}

/* ---------------------------------------------------- rounding and casts */

__global__ void k_round(float *x, size_t n, int prec)
{
    GRID_STRIDE(i, n)
    {
        x[i] = prec == MC_PREC_BF16   ? mc_bf16_to_f32(mc_f32_to_bf16(x[i]))
               : prec == MC_PREC_FP16 ? mc_fp16_to_f32(mc_f32_to_fp16(x[i]))
                                      : mc_round_tf32(x[i]);
    }
}
__global__ void k_to_bf16(uint16_t *o, const float *x, size_t n)
{
    GRID_STRIDE(i, n) o[i] = mc_f32_to_bf16(x[i]);
}
__global__ void k_from_bf16(float *o, const uint16_t *x, size_t n)
{
    GRID_STRIDE(i, n) o[i] = mc_bf16_to_f32(x[i]);
}
__global__ void k_to_fp16(uint16_t *o, const float *x, size_t n)
{
    GRID_STRIDE(i, n) o[i] = mc_f32_to_fp16(x[i]);
}
__global__ void k_from_fp16(float *o, const uint16_t *x, size_t n)
{
    GRID_STRIDE(i, n) o[i] = mc_fp16_to_f32(x[i]);
}

extern "C" void mc_cuda_round(mc_cuda *cu, float *x, size_t n, mc_prec prec)
{
    if (!n || prec == MC_PREC_FP32) return;
    k_round<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(x, n, (int)prec);
    KCHECK();
}
extern "C" void mc_cuda_cast_to_bf16(mc_cuda *cu, uint16_t *out, const float *x, size_t n)
{
    if (!n) return;
    k_to_bf16<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(out, x, n);
    KCHECK();
}
extern "C" void mc_cuda_cast_from_bf16(mc_cuda *cu, float *out, const uint16_t *x, size_t n)
{
    if (!n) return;
    k_from_bf16<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(out, x, n);
    KCHECK();
}
extern "C" void mc_cuda_cast_to_fp16(mc_cuda *cu, uint16_t *out, const float *x, size_t n)
{
    if (!n) return;
    k_to_fp16<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(out, x, n);
    KCHECK();
}
extern "C" void mc_cuda_cast_from_fp16(mc_cuda *cu, float *out, const uint16_t *x, size_t n)
{
    if (!n) return;
    k_from_fp16<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(out, x, n);
    KCHECK();
}

/* ---------------------------------------------------- init (kern/cpu/init.c) */

#define GOLDEN 0x9e3779b97f4a7c15ull

__host__ __device__ static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* the algorithm of init.c: Box-Muller in double from (stream, g), rounded once */
__global__ void k_init_normal(float *x, size_t rows, size_t cols, uint64_t global_cols,
                              uint64_t row0, uint64_t col0, uint64_t stream, float std)
{
    const double two_pi = 6.283185307179586476925286766559;
    GRID_STRIDE(i, rows * cols)
    {
        size_t r = i / cols, c = i % cols;
        uint64_t g = (row0 + r) * global_cols + col0 + c;
        uint64_t z = mix64(stream + (g + 1) * GOLDEN);
        double u1 = ((double)(z >> 32) + 0.5) * 0x1p-32;
        double u2 = (double)(z & 0xffffffffull) * 0x1p-32;
        x[i] = (float)((double)std * sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}

extern "C" void mc_cuda_init_normal(mc_cuda *cu, float *x, size_t rows, size_t cols,
                                    uint64_t global_cols, uint64_t row0, uint64_t col0,
                                    uint64_t seed, uint64_t key, float std)
{
    if (!rows || !cols) return;
    const uint64_t stream = mix64(seed * GOLDEN + mix64(key ^ 0x6a09e667f3bcc909ull));
    k_init_normal<<<mc_cu_blocks(rows * cols, TPB), TPB, 0, cu->stream>>>(
        x, rows, cols, global_cols, row0, col0, stream, std);
    KCHECK();
}

/* ---------------------------------------------------- activations (kern/cpu/act.c) */

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

/* y = x sigma(2u) = x / (1 + exp(-2u)),  u = k (x + c x^3) */
__global__ void k_gelu_fwd(float *out, const float *x, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float v = x[i];
        float u = GELU_K * (v + GELU_C * v * v * v);
        out[i] = v / (1.0f + expf(-2.0f * u));
    }
}

/* s + 2 x e s^2 k (1 + 3c x^2),  s = sigma(2u), e = exp(-2u): GELU's
 * derivative, one expression for both backward kernels (the same bits) */
__device__ __forceinline__ float gelu_dydx(float v)
{
    float u = GELU_K * (v + GELU_C * v * v * v);
    float e = expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    return s + 2.0f * v * (e * s * s) * GELU_K * (1.0f + 3.0f * GELU_C * v * v);
}

/* dx += dout gelu'(x) */
__global__ void k_gelu_bwd(float *dx, const float *dout, const float *x, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float d = gelu_dydx(x[i]);
        dx[i] += dout[i] * d;
    }
}

extern "C" void mc_cuda_gelu_fwd(mc_cuda *cu, float *out, const float *x, size_t n, mc_prec round)
{
    if (!n) return;
    k_gelu_fwd<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(out, x, n);
    KCHECK();
    if (round != MC_PREC_FP32) mc_cuda_round(cu, out, n, round);
}
extern "C" void mc_cuda_gelu_bwd(mc_cuda *cu, float *dx, const float *dout, const float *x,
                                 size_t n)
{
    if (!n) return;
    k_gelu_bwd<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(dx, dout, x, n);
    KCHECK();
}

/* out[i,j] = silu(a) b,  a = x[i,j], b = x[i,F+j] */
__global__ void k_swiglu_fwd(float *out, const float *x, size_t N, size_t F)
{
    GRID_STRIDE(k, N * F)
    {
        size_t i = k / F, j = k % F;
        float a = x[i * 2 * F + j], b = x[i * 2 * F + F + j];
        out[k] = a / (1.0f + expf(-a)) * b;
    }
}

/* da += g b s (1 + a e s);  db += g a s,  s = sigma(a), e = exp(-a) */
__global__ void k_swiglu_bwd(float *dx, const float *dout, const float *x, size_t N, size_t F)
{
    GRID_STRIDE(k, N * F)
    {
        size_t i = k / F, j = k % F;
        size_t ia = i * 2 * F + j, ib = ia + F;
        float a = x[ia], b = x[ib], g = dout[k];
        float e = expf(-a), s = 1.0f / (1.0f + e);
        dx[ia] += g * b * s * (1.0f + a * e * s);
        dx[ib] += g * a * s;
    }
}

/* in place: x := 0 + the accumulating kernels' terms (the same bits onto a zeroed dx) */
__global__ void k_gelu_bwd_inplace(float *x, const float *dout, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float d = gelu_dydx(x[i]);
        x[i] = 0.0f + dout[i] * d;
    }
}

__global__ void k_swiglu_bwd_inplace(float *x, const float *dout, size_t N, size_t F)
{
    GRID_STRIDE(k, N * F)
    {
        size_t i = k / F, j = k % F;
        size_t ia = i * 2 * F + j, ib = ia + F;
        float a = x[ia], b = x[ib], g = dout[k];
        float e = expf(-a), s = 1.0f / (1.0f + e);
        x[ia] = 0.0f + g * b * s * (1.0f + a * e * s);
        x[ib] = 0.0f + g * a * s;
    }
}

extern "C" void mc_cuda_gelu_bwd_inplace(mc_cuda *cu, float *x, const float *dout, size_t n)
{
    if (!n) return;
    k_gelu_bwd_inplace<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(x, dout, n);
    KCHECK();
}
extern "C" void mc_cuda_swiglu_bwd_inplace(mc_cuda *cu, float *x, const float *dout, size_t N,
                                           size_t F)
{
    if (!N || !F) return;
    k_swiglu_bwd_inplace<<<mc_cu_blocks(N * F, TPB), TPB, 0, cu->stream>>>(x, dout, N, F);
    KCHECK();
}

extern "C" void mc_cuda_swiglu_fwd(mc_cuda *cu, float *out, const float *x, size_t N, size_t F,
                                   mc_prec round)
{
    if (!N || !F) return;
    k_swiglu_fwd<<<mc_cu_blocks(N * F, TPB), TPB, 0, cu->stream>>>(out, x, N, F);
    KCHECK();
    if (round != MC_PREC_FP32) mc_cuda_round(cu, out, N * F, round);
}
extern "C" void mc_cuda_swiglu_bwd(mc_cuda *cu, float *dx, const float *dout, const float *x,
                                   size_t N, size_t F)
{
    if (!N || !F) return;
    k_swiglu_bwd<<<mc_cu_blocks(N * F, TPB), TPB, 0, cu->stream>>>(dx, dout, x, N, F);
    KCHECK();
}

/* ---------------------------------------------------- AdamW (kern/cpu/adamw.c) */

/* g = grad gs; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p).  Division and sqrt are
 * IEEE-rounded (nvcc's default -prec-div/-prec-sqrt); the fused multiply-adds
 * the compiler forms make the bits differ from the CPU's in the last place. */
__global__ void k_adamw(float *p, const float *grad, float *m, float *v, size_t n, float lr,
                        float b1, float b2, float eps, float wd, float bc1, float bc2, float gs)
{
    GRID_STRIDE(i, n)
    {
        float g = grad[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * p[i]);
    }
}

extern "C" void mc_cuda_adamw(mc_cuda *cu, float *p, const float *grad, float *m, float *v,
                              size_t n, float lr, float b1, float b2, float eps, float wd,
                              float bc1, float bc2, float grad_scale)
{
    if (!n) return;
    k_adamw<<<mc_cu_blocks(n, TPB), TPB, 0, cu->stream>>>(p, grad, m, v, n, lr, b1, b2, eps, wd,
                                                          bc1, bc2, grad_scale);
    KCHECK();
}
