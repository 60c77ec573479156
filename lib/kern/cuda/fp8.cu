/*
 * fp8.cu - the FP8 emulation kernels of kern_ops.def (amax, fp8_quantize,
 * fp8_out, axpy) on the GPU, with kern/cpu/fp8.c's arithmetic: the same
 * rounding to the E4M3/E5M2 grid (the add-and-subtract of a power of two,
 * saturating), products and sums without contraction (__fmul_rn,
 * __fadd_rn), so every element equals the CPU's bit for bit; amax is a max,
 * which no order changes. tests/cuda/fp8_emu.cc checks them on the CPU
 * against the CPU backend; check_kern on a GPU.
 */
#ifndef MC_CUDA_EMULATE
#include <math.h>
#include <stdint.h>
#include "kern/cuda/internal.cuh"
#define RN_MUL(a, b) __fmul_rn((a), (b))
#define RN_ADD(a, b) __fadd_rn((a), (b))
#else
#define RN_MUL(a, b) ((a) * (b))
#define RN_ADD(a, b) ((a) + (b))
#endif

namespace {

constexpr unsigned FT = 256;

__device__ __forceinline__ float fp8_round(float v, int mb, int emin, float vmax)
{
    uint32_t u = __float_as_uint(v);
    uint32_t sign = u & 0x80000000u, au = u & 0x7fffffffu;
    float a = __uint_as_float(au);
    if (!(a < vmax)) {
        if (a != a) return v;
        a = vmax;
    } else {
        int e = (int)(au >> 23) - 127;
        if (e < emin) e = emin;
        float c = __uint_as_float((uint32_t)(e - mb + 23 + 127) << 23);
        a = RN_ADD(RN_ADD(a, c), -c);
        if (a > vmax) a = vmax;
    }
    return __uint_as_float(__float_as_uint(a) | sign);
}

/* max |x| as the bits of a non-negative float (ordered as unsigned), NaN
 * flagged apart */
__global__ void k_amax(unsigned *out, const float *x, size_t n)
{
    __shared__ unsigned sm[FT];
    unsigned m = 0, nan = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float a = fabsf(x[i]);
        if (a != a)
            nan = 1;
        else if (__float_as_uint(a) > m)
            m = __float_as_uint(a);
    }
    sm[threadIdx.x] = m;
    __syncthreads();
    for (unsigned s = FT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && sm[threadIdx.x + s] > sm[threadIdx.x]) sm[threadIdx.x] = sm[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicMax(&out[0], sm[0]);
    if (nan) atomicOr(&out[1], 1u);
}

__global__ void k_fp8_quantize(float *q, const float *x, size_t n, float scale, int e5m2)
{
    const int mb = e5m2 ? 2 : 3, emin = e5m2 ? -14 : -6;
    const float vmax = e5m2 ? 57344.0f : 448.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        q[i] = fp8_round(RN_MUL(x[i], scale), mb, emin, vmax);
}

__global__ void k_fp8_out(float *out, size_t N, size_t O, float s, const float *b)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * O;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = RN_MUL(out[i], s);
        out[i] = b ? RN_ADD(v, b[i % O]) : v;
    }
}

__global__ void k_axpy(float *y, const float *x, size_t n, float a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = RN_ADD(y[i], RN_MUL(a, x[i]));
}

unsigned blocks_for(size_t n)
{
    size_t b = (n + FT - 1) / FT;
    return b < 1 ? 1u : b > 4096 ? 4096u : (unsigned)b;
}

#ifndef MC_CUDA_EMULATE
void amax_to_host(mc_cuda *cu, unsigned *d, unsigned *h)
{
    CU_CHECK(cudaMemcpyAsync(h, d, 2 * sizeof(unsigned), cudaMemcpyDeviceToHost, cu->stream));
    CU_CHECK(cudaStreamSynchronize(cu->stream));
}
void amax_zero(mc_cuda *cu, unsigned *d)
{
    CU_CHECK(cudaMemsetAsync(d, 0, 2 * sizeof(unsigned), cu->stream));
}
#else
void amax_to_host(mc_cuda *, unsigned *d, unsigned *h) { h[0] = d[0], h[1] = d[1]; }
void amax_zero(mc_cuda *, unsigned *d) { d[0] = d[1] = 0; }
#endif

} // namespace

extern "C" float mc_cuda_amax(mc_cuda *cu, const float *x, size_t n)
{
    if (!n) return 0.0f;
    unsigned *d = (unsigned *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, 2 * sizeof(unsigned)), h[2];
    amax_zero(cu, d);
    MC_LAUNCH(k_amax, blocks_for(n), FT, (size_t)0, d, x, n);
    amax_to_host(cu, d, h);
    if (h[1]) return NAN;
    float r;
    memcpy(&r, &h[0], sizeof r);
    return r;
}

extern "C" void mc_cuda_fp8_quantize(mc_cuda *cu, float *q, const float *x, size_t n, float scale,
                                     int e5m2)
{
    if (n) MC_LAUNCH(k_fp8_quantize, blocks_for(n), FT, (size_t)0, q, x, n, scale, e5m2);
}

extern "C" void mc_cuda_fp8_out(mc_cuda *cu, float *out, size_t N, size_t O, float s, const float *b)
{
    if (N && O) MC_LAUNCH(k_fp8_out, blocks_for(N * O), FT, (size_t)0, out, N, O, s, b);
}

extern "C" void mc_cuda_axpy(mc_cuda *cu, float *y, const float *x, size_t n, float a)
{
    if (n) MC_LAUNCH(k_axpy, blocks_for(n), FT, (size_t)0, y, x, n, a);
}
