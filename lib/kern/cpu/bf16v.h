/*
 * bf16v.h - private to the CPU backend: fpconv.h's bf16 rounding (nearest
 * even, NaN quieted) of 8 floats in an AVX2 register, the bits one a
 * 32-bit lane, for the files that round on the AVX2 path in vectors
 * (elementwise.c's streamed copies, b16gemm.c's panels). x86-64 only.
 */
#ifndef MC_KERN_CPU_BF16V_H
#define MC_KERN_CPU_BF16V_H

#include <immintrin.h>
#include "kern/cpu/isa.h"

MC_TARGET_AVX2 static inline __m256i mc_bf16_bits8(__m256i u)
{
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(r, quiet, nan);
}

#endif
