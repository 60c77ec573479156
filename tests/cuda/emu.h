/*
 * emu.h - the CUDA built-ins a kernel of lib/kern/cuda uses, on the CPU, for
 * the emulation tests (tests/cuda/flash_emu.cc, moe_emu.cc, decode_emu.cc): every CUDA thread of a block is
 * a host thread, __syncthreads and the warp's shuffles are barriers, shared
 * memory is one static array (blocks run one after another), and mma.sync
 * m16n8k16 (bf16, fp32 accumulation) is computed from the PTX ISA's
 * fragment tables. A .cu file written for it (MC_CUDA_EMULATE) launches
 * through MC_LAUNCH, which here runs the grid block by block.
 */
#ifndef MC_TESTS_CUDA_EMU_H
#define MC_TESTS_CUDA_EMU_H
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <memory>
#include <vector>

#include "mc/dtype.h"

/* ------------------------------------------------ the CUDA built-ins */
#define MC_CUDA_EMULATE 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
/* a kernel's static __shared__ array: one per kernel, blocks run in turn */
#define __shared__ static
#define __align__(x)
struct mc_cuda {
    int unused;
};
struct uint3e {
    unsigned x, y, z;
};
static thread_local uint3e threadIdx;
static uint3e blockIdx, blockDim, gridDim;
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
using std::min;
using std::max;

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y; /* x in the low half */
};
/* bf16 rounding: the CPU backend's (mc/dtype.h), the same round to nearest
 * even as the GPU's __float2bfloat16_rn */
static inline uint16_t bf16_rne(float f) { return mc_dtype_f32_to_bf16(f); }
static inline float bf16_f(uint16_t b) { return mc_dtype_bf16_to_f32(b); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{bf16_rne(f)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

/* One block at a time: up to 1024 threads, 32 warps. */
static std::barrier<> *block_bar;
static std::barrier<> *warp_bar[32];
struct warp_slots {
    float f[32];
    uint32_t a[32][4], b[32][2];
};
static warp_slots slots[32];

static void __syncthreads() { block_bar->arrive_and_wait(); }

/* the atomics and bit casts the kernels use */
static unsigned atomicMax(unsigned *p, unsigned v)
{
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* lane `src` of the warp's v, for every lane */
static float shuffle(float v, int src)
{
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    slots[w].f[lane] = v;
    warp_bar[w]->arrive_and_wait();
    const float r = slots[w].f[src & 31];
    warp_bar[w]->arrive_and_wait();
    return r;
}
static float __shfl_xor_sync(unsigned, float v, int o) { return shuffle(v, (int)(threadIdx.x % 32) ^ o); }
static float __shfl_sync(unsigned, float v, int src) { return shuffle(v, src); }

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, from the PTX ISA's
 * tables: lane = 4 g + c holds
 *   A: reg 0 = (row g, cols 2c, 2c+1), reg 1 = row g+8, reg 2 = row g cols
 *      2c+8, 2c+9, reg 3 = row g+8 cols 2c+8, 2c+9 (low half first);
 *   B: reg 0 = (k 2c, 2c+1; col g), reg 1 = (k 2c+8, 2c+9; col g);
 *   C: c0, c1 = row g cols 2c, 2c+1; c2, c3 = row g+8. */
static float A_at(const warp_slots &s, int r, int k)
{
    const int lane = 4 * (r % 8) + (k % 8) / 2, reg = (r / 8) + 2 * (k / 8);
    const uint32_t v = s.a[lane][reg];
    return bf16_f((uint16_t)(k % 2 ? v >> 16 : v & 0xffffu));
}
static float B_at(const warp_slots &s, int k, int n)
{
    const int lane = 4 * n + (k % 8) / 2, reg = k / 8;
    const uint32_t v = s.b[lane][reg];
    return bf16_f((uint16_t)(k % 2 ? v >> 16 : v & 0xffffu));
}
static void mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                uint32_t b1)
{
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, cc = lane % 4;
    warp_slots &s = slots[w];
    s.a[lane][0] = a0;
    s.a[lane][1] = a1;
    s.a[lane][2] = a2;
    s.a[lane][3] = a3;
    s.b[lane][0] = b0;
    s.b[lane][1] = b1;
    warp_bar[w]->arrive_and_wait();
    for (int e = 0; e < 4; e++) {
        const int r = g + (e >= 2 ? 8 : 0), n = 2 * cc + (e & 1);
        double acc = 0;
        for (int k = 0; k < 16; k++) acc += (double)A_at(s, r, k) * B_at(s, k, n);
        c[e] = (float)((double)c[e] + acc);
    }
    warp_bar[w]->arrive_and_wait();
}


/* The backend's scratch slot the kernel files take (internal.cuh's
 * mc_cuda_scratch): one host buffer, grown, poisoned when made. */
enum { MC_CU_SCRATCH_WORK = 3 };
static std::vector<unsigned char> emu_scratch;
static void *mc_cuda_scratch(mc_cuda *, int, size_t bytes)
{
    if (emu_scratch.size() < bytes) emu_scratch.assign(bytes, 0xff);
    return emu_scratch.data();
}

/* the blocks' shared memory: kernels declare `extern __shared__` arrays,
 * which name this one (a .cu file under MC_CUDA_EMULATE declares its
 * dynamic shared memory as emu_smem) */
static unsigned char emu_smem[1 << 20];

/* Run kernel() on a grid of blocks of `threads` (a multiple of 32, or
 * fewer than 32), one block at a time. */
static void emu_grid(dim3 grid, unsigned threads, const std::function<void()> &kernel)
{
    gridDim = uint3e{grid.x, grid.y, grid.z};
    blockDim = uint3e{threads, 1, 1};
    const unsigned warps = (threads + 31) / 32;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = uint3e{x, y, z};
                memset(emu_smem, 0xff, sizeof emu_smem); /* poisoned: NaN bf16 and float */
                std::barrier<> bb(threads);
                std::vector<std::unique_ptr<std::barrier<>>> wb;
                for (unsigned w = 0; w < warps; w++) {
                    unsigned n = threads - 32 * w < 32 ? threads - 32 * w : 32;
                    wb.emplace_back(new std::barrier<>(n));
                    warp_bar[w] = wb.back().get();
                }
                block_bar = &bb;
                std::vector<std::thread> th;
                for (unsigned t = 0; t < threads; t++)
                    th.emplace_back([t, &kernel] {
                        threadIdx = uint3e{t, 0, 0};
                        kernel();
                    });
                for (auto &t : th) t.join();
            }
}
/* a launch: the grid block by block; shared memory within Hopper's 227 KiB */
#define MC_LAUNCH(kernel, grid, threads, smem, ...)                                       \
    do {                                                                                  \
        if ((size_t)(smem) > 227 * 1024 || (threads) > 1024 || (threads) == 0) {            \
            fprintf(stderr, "emu: %s: %zu bytes of shared memory, %u threads\n", #kernel, \
                    (size_t)(smem), (unsigned)(threads));                                  \
            abort();                                                                      \
        }                                                                                 \
        emu_grid((grid), (threads), [&] { kernel(__VA_ARGS__); });                        \
    } while (0)
#define MC_DYN_SMEM(name) unsigned char *name = emu_smem
#define MC_SMEM_LIMIT(kernel, bytes) ((void)(bytes))
#define KCHECK() ((void)0)

#endif
