/*
 * init.c - counter-based normal initialization and parameter-name keys: the
 * value of global element g of a parameter is a pure function of (seed, key,
 * g), so any block of a matrix (a tensor-parallel shard) holds exactly the
 * elements of the whole matrix. The algorithm is above mc_cpu_init_normal.
 */
#include <math.h>
#include "kern/cpu/cpu.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The value of global element g of the parameter with key `key` under `seed`
 * (stable: changing it changes every model's initial weights):
 *
 *   mix(z)  = SplitMix64's finalizer: z ^= z>>30; z *= 0xbf58476d1ce4e5b9;
 *             z ^= z>>27; z *= 0x94d049bb133111eb; z ^= z>>31   (mod 2^64)
 *   stream  = mix(seed * 0x9e3779b97f4a7c15 + mix(key ^ 0x6a09e667f3bcc909))
 *   z       = mix(stream + (g + 1) * 0x9e3779b97f4a7c15)
 *   u1      = ((z >> 32) + 0.5) / 2^32        in (0, 1)
 *   u2      = (z & 0xffffffff) / 2^32         in [0, 1)
 *   x       = std * sqrt(-2 ln u1) * cos(2 pi u2)     (Box-Muller, in double,
 *             rounded once to fp32) */
void mc_cpu_init_normal(mc_backend *be, float *x, size_t rows, size_t cols, uint64_t global_cols,
                        uint64_t row0, uint64_t col0, uint64_t seed, uint64_t key, float std)
{
    const uint64_t stream = mix64(seed * GOLDEN + mix64(key ^ 0x6a09e667f3bcc909ull));
    const double two_pi = 6.283185307179586476925286766559;
#pragma omp parallel for num_threads(be->threads) if (rows * cols > 4096) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        uint64_t g0 = (row0 + r) * global_cols + col0;
        for (size_t c = 0; c < cols; c++) {
            uint64_t z = mix64(stream + (g0 + c + 1) * GOLDEN);
            double u1 = ((double)(z >> 32) + 0.5) * 0x1p-32;
            double u2 = (double)(z & 0xffffffffull) * 0x1p-32;
            x[r * cols + c] = (float)((double)std * sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
        }
    }
}

/* 64-bit FNV-1a over the name's bytes. */
uint64_t mc_k_name_key(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}
