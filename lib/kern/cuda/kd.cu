/*
 * kd.cu - knowledge distillation's forward KL between a teacher's and a
 * student's vocab-parallel logits at a temperature (kern.h kd_sums, kd_loss,
 * kd_bwd). Follows its CPU twin kern/cpu/kd.c (same formulas, row sums in
 * double) with one block per row and fixed-tree reductions, deterministic
 * without float atomics, as the cross-entropy steps of layers.cu.
 */
#include <math.h>
#include "kern/cuda/internal.cuh"

#define TPB 256

__global__ void k_kd_sums(float *sums, const float *s, const float *t, const float *smax,
                          const float *tmax, size_t N, size_t vl, float it)
{
    __shared__ double sh[3][TPB];
    size_t i = blockIdx.x;
    const float *si = s + i * vl, *ti = t + i * vl;
    float sm = smax[i], tm = tmax[i];
    double zs = 0.0, zt = 0.0, x = 0.0;
    for (size_t j = threadIdx.x; j < vl; j += TPB) {
        float a = (si[j] - sm) * it, b = (ti[j] - tm) * it, eb = expf(b);
        zs += expf(a);
        zt += eb;
        x += (double)eb * (double)(b - a);
    }
    sh[0][threadIdx.x] = zs;
    sh[1][threadIdx.x] = zt;
    sh[2][threadIdx.x] = x;
    __syncthreads();
    for (unsigned k = TPB / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            for (int c = 0; c < 3; c++) sh[c][threadIdx.x] += sh[c][threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int c = 0; c < 3; c++) sums[(size_t)c * N + i] = (float)sh[c][0];
}

__global__ void k_kd_loss(float *kl, const float *sums, const int32_t *targets, size_t N)
{
    GRID_STRIDE(i, N)
    {
        float zs = sums[i], zt = sums[N + i], x = sums[2 * N + i];
        kl[i] = targets[i] < 0 ? 0.0f : x / zt - logf(zt) + logf(zs);
    }
}

/* in place allowed (each element read, then written) */
__global__ void k_kd_bwd(float *d, const float *s, const float *t, const float *smax,
                         const float *sumexp, const float *tmax, const float *sums,
                         const int32_t *targets, int64_t v0, size_t N, size_t vl, float it,
                         float ce_scale, float kd_scale)
{
    size_t i = blockIdx.x;
    const float *si = s + i * vl, *ti = t + i * vl;
    float *di = d + i * vl;
    int32_t tg = targets[i];
    if (tg < 0) {
        for (size_t j = threadIdx.x; j < vl; j += TPB) di[j] = 0.0f;
        return;
    }
    float sm = smax[i], tm = tmax[i], ce_inv = 1.0f / sumexp[i];
    float kd_ws = kd_scale / sums[i], kd_wt = kd_scale / sums[N + i];
    int64_t tl = (int64_t)tg - v0;
    for (size_t j = threadIdx.x; j < vl; j += TPB) {
        float a = si[j] - sm;
        float g = ce_scale * (expf(a) * ce_inv) +
                  (kd_ws * expf(a * it) - kd_wt * expf((ti[j] - tm) * it));
        di[j] = (int64_t)j == tl ? g - ce_scale : g;
    }
}

extern "C" void mc_cuda_kd_sums(mc_cuda *cu, float *sums, const float *s, const float *t,
                                const float *smax, const float *tmax, size_t N, size_t vl,
                                float inv_tau)
{
    if (!N) return;
    k_kd_sums<<<(unsigned)N, TPB, 0, cu->stream>>>(sums, s, t, smax, tmax, N, vl, inv_tau);
    KCHECK();
}

extern "C" void mc_cuda_kd_loss(mc_cuda *cu, float *kl, const float *sums, const int32_t *targets,
                                size_t N)
{
    if (!N) return;
    k_kd_loss<<<mc_cu_blocks(N, TPB), TPB, 0, cu->stream>>>(kl, sums, targets, N);
    KCHECK();
}

extern "C" void mc_cuda_kd_bwd(mc_cuda *cu, float *d, const float *s, const float *t,
                               const float *smax, const float *sumexp, const float *tmax,
                               const float *sums, const int32_t *targets, int64_t v0, size_t N,
                               size_t vl, float inv_tau, float ce_scale, float kd_scale)
{
    if (!N) return;
    k_kd_bwd<<<(unsigned)N, TPB, 0, cu->stream>>>(d, s, t, smax, sumexp, tmax, sums, targets, v0, N,
                                                  vl, inv_tau, ce_scale, kd_scale);
    KCHECK();
}
