/*
 * warp.cuh - a warp's max and sum of one float per lane (butterfly
 * shuffles: every lane gets the result, in a fixed order). Included by
 * internal.cuh, and by kernel files that tests/cuda/emu.h runs on the CPU.
 */
#ifndef MC_KERN_CUDA_WARP_CUH
#define MC_KERN_CUDA_WARP_CUH

__device__ __forceinline__ float mc_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float mc_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
