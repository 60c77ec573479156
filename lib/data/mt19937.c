/*
 * mt19937.c - numpy's legacy RandomState, as far as Megatron's GPTDataset
 * uses it: seeding from an integer, and shuffle() of a 1-D array. Same seed,
 * same permutation as numpy, element for element (the generator is numpy's
 * random/src/mt19937; the seeding and the shuffle name their numpy source).
 */
#include "gpt_internal.h"

#include <string.h>

#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfU
#define MT_UPPER 0x80000000U
#define MT_LOWER 0x7fffffffU

/* An integer seed, as numpy's random/_mt19937.pyx _legacy_seeding: it goes
 * through init_genrand (Knuth's multiplier 1812433253), and the first draw
 * regenerates the whole state. */
void mc_mt_seed(mc_mt19937 *s, uint32_t seed)
{
    /* key[i] = 1812433253 * (key[i-1] ^ (key[i-1] >> 30)) + i  (mod 2^32) */
    s->key[0] = seed;
    for (int i = 1; i < MC_MT_N; i++)
        s->key[i] = 1812433253U * (s->key[i - 1] ^ (s->key[i - 1] >> 30)) + (uint32_t)i;
    s->pos = MC_MT_N;
}

static uint32_t twist(uint32_t a, uint32_t b, uint32_t m)
{
    uint32_t y = (a & MT_UPPER) | (b & MT_LOWER);
    return m ^ (y >> 1) ^ ((0U - (y & 1U)) & MT_MATRIX_A);
}

static void regenerate(mc_mt19937 *s)
{
    uint32_t *k = s->key;
    int i;
    for (i = 0; i < MC_MT_N - MT_M; i++) k[i] = twist(k[i], k[i + 1], k[i + MT_M]);
    for (; i < MC_MT_N - 1; i++) k[i] = twist(k[i], k[i + 1], k[i + MT_M - MC_MT_N]);
    k[MC_MT_N - 1] = twist(k[MC_MT_N - 1], k[0], k[MT_M - 1]);
    s->pos = 0;
}

uint32_t mc_mt_next32(mc_mt19937 *s)
{
    if (s->pos >= MC_MT_N) regenerate(s);
    uint32_t y = s->key[s->pos++];
    /* tempering */
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= y >> 18;
    return y;
}

/* numpy's random_interval (random/src/distributions): draws are masked to
 * the smallest all-ones mask >= max and values above max rejected; 32-bit
 * draws while max fits in 32 bits, else 64-bit draws made of two 32-bit ones
 * (high word first). */
uint64_t mc_mt_interval(mc_mt19937 *s, uint64_t max)
{
    if (max == 0) return 0;
    uint64_t mask = max, v;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xffffffffULL) {
        while ((v = (mc_mt_next32(s) & mask)) > max) {}
    } else {
        for (;;) {
            uint64_t hi = mc_mt_next32(s);
            v = ((hi << 32) | mc_mt_next32(s)) & mask;
            if (v <= max) break;
        }
    }
    return v;
}

/* numpy's shuffle (random/mtrand.pyx _shuffle_raw): walk i = n-1 .. 1 and
 * swap x[i] with x[j], j = random_interval(i). */
void mc_mt_shuffle(mc_mt19937 *s, void *data, int64_t n, size_t size)
{
    unsigned char *p = data, tmp[8];
    for (int64_t i = n - 1; i >= 1; i--) {
        uint64_t j = mc_mt_interval(s, (uint64_t)i);
        memcpy(tmp, p + j * size, size);
        memcpy(p + j * size, p + (uint64_t)i * size, size);
        memcpy(p + (uint64_t)i * size, tmp, size);
    }
}
