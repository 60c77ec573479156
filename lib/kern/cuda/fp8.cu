/*
 * fp8.cu - the FP8 emulation kernels of kern_ops.def (amax, amax_into,
 * fp8_quantize, fp8_out, axpy) on the GPU, and the conversion of quantized
 * operands to FP8 bytes for cuBLASLt's FP8 GEMMs (mc_cuda_fp8_bytes,
 * linear.cu's fp8_gemm), with kern/cpu/fp8.c's arithmetic: the same
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

namespace
{

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
        if (threadIdx.x < s && sm[threadIdx.x + s] > sm[threadIdx.x])
            sm[threadIdx.x] = sm[threadIdx.x + s];
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

/* *m = a where !(a <= *m), a = the amax k_amax left in d (bits, NaN flag) */
__global__ void k_amax_fold(float *m, const unsigned *d)
{
    if (threadIdx.x || blockIdx.x) return;
    float a = d[1] ? __uint_as_float(0x7fc00000u) : __uint_as_float(d[0]);
    if (!(a <= *m)) *m = a;
}

/* The FP8 byte of v, a value on the grid (fp8_round's output: exact, so no
 * rounding here), as the OCP formats encode it: E4M3 bias 7, 3 mantissa
 * bits, subnormals below 2^-6 in steps of 2^-9, NaN 0x7f; E5M2 bias 15, 2
 * bits, subnormals below 2^-14 in steps of 2^-16, NaN 0x7f. */
__device__ __forceinline__ uint8_t fp8_byte(float v, int e5m2)
{
    uint32_t u = __float_as_uint(v);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return 0x7f;
    if (au == 0) return sign;
    const int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    int e = (int)(au >> 23) - 127;
    if (e < 1 - bias) { /* subnormal: a multiple of 2^(1 - bias - mb) */
        float k = __uint_as_float(au) * __uint_as_float((uint32_t)(bias - 1 + mb + 127) << 23);
        return (uint8_t)(sign | (uint8_t)k);
    }
    return (uint8_t)(sign | (uint8_t)((e + bias) << mb) |
                     (uint8_t)((au >> (23 - mb)) & ((1u << mb) - 1u)));
}

/* o = the FP8 bytes of x[rows, cols] (row-major), or of its transpose
 * (o[cols, rows]) through 32 x 32 tiles in shared memory; blocks of 256
 * threads, 8 rows of the tile a pass */
constexpr unsigned TT = 32, TTH = 256;
__global__ void k_fp8_bytes(uint8_t *o, const float *x, size_t rows, size_t cols, int transpose,
                            int e5m2)
{
    __shared__ uint8_t t[TT][TT + 1];
    const unsigned tx = threadIdx.x % TT, ty = threadIdx.x / TT;
    size_t c0 = (size_t)blockIdx.x * TT, r0 = (size_t)blockIdx.y * TT;
    for (unsigned j = ty; j < TT; j += TTH / TT) {
        size_t r = r0 + j, c = c0 + tx;
        if (r < rows && c < cols) {
            uint8_t b = fp8_byte(x[r * cols + c], e5m2);
            if (transpose)
                t[j][tx] = b;
            else
                o[r * cols + c] = b;
        }
    }
    if (!transpose) return;
    __syncthreads();
    for (unsigned j = ty; j < TT; j += TTH / TT) {
        size_t c = c0 + j, r = r0 + tx; /* o[c, r] = x[r, c] */
        if (r < rows && c < cols) o[c * rows + r] = t[tx][j];
    }
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

extern "C" void mc_cuda_fp8_out(mc_cuda *cu, float *out, size_t N, size_t O, float s,
                                const float *b)
{
    if (N && O) MC_LAUNCH(k_fp8_out, blocks_for(N * O), FT, (size_t)0, out, N, O, s, b);
}

extern "C" void mc_cuda_axpy(mc_cuda *cu, float *y, const float *x, size_t n, float a)
{
    if (n) MC_LAUNCH(k_axpy, blocks_for(n), FT, (size_t)0, y, x, n, a);
}

extern "C" void mc_cuda_amax_into(mc_cuda *cu, float *m, const float *x, size_t n)
{
    unsigned *d = (unsigned *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, 2 * sizeof(unsigned));
    amax_zero(cu, d);
    if (n) MC_LAUNCH(k_amax, blocks_for(n), FT, (size_t)0, d, x, n);
    MC_LAUNCH(k_amax_fold, 1u, 1u, (size_t)0, m, d);
}

void mc_cuda_fp8_bytes(mc_cuda *cu, uint8_t *o, const float *x, size_t rows, size_t cols,
                       int transpose, int e5m2)
{
    if (!rows || !cols) return;
    dim3 grid((unsigned)((cols + TT - 1) / TT), (unsigned)((rows + TT - 1) / TT));
    MC_LAUNCH(k_fp8_bytes, grid, TTH, (size_t)0, o, x, rows, cols, transpose, e5m2);
}
