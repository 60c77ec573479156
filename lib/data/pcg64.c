/*
 * pcg64.c - numpy.random.default_rng(seed) (numpy >= 1.17's Generator): the
 * SeedSequence that hashes an integer seed into PCG64's 128-bit state and
 * increment, PCG64's XSL-RR output (next_uint64, and next_uint32 taking the
 * low then the high half of one output), and Generator.integers' Lemire
 * method for 32-bit results. Written from numpy's documented algorithms
 * (NEP 19, the PCG paper, Lemire 2019); checked against numpy's own values
 * (tests/unit/test_pcg64.c, tests/golden/np_random.py). Megatron Core's
 * mock dataset draws its document lengths from this generator.
 */
#include "data/gpt_internal.h"

typedef unsigned __int128 u128;

/* SeedSequence's hash constants */
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u
#define XSHIFT 16
#define POOL 4

static uint32_t hashmix(uint32_t v, uint32_t *h)
{
    v ^= *h;
    *h *= MULT_A;
    v *= *h;
    return v ^ (v >> XSHIFT);
}

static uint32_t mix(uint32_t x, uint32_t y)
{
    uint32_t r = MIX_MULT_L * x - MIX_MULT_R * y;
    return r ^ (r >> XSHIFT);
}

void mc_seedseq_state(uint64_t seed, uint32_t *out, int nwords)
{
    /* the seed as little-endian 32-bit words (0 is one word) */
    uint32_t ent[2];
    int ne = 0;
    ent[ne++] = (uint32_t)seed;
    if (seed >> 32) ent[ne++] = (uint32_t)(seed >> 32);
    uint32_t pool[POOL], h = INIT_A;
    for (int i = 0; i < POOL; i++) pool[i] = hashmix(i < ne ? ent[i] : 0, &h);
    for (int s = 0; s < POOL; s++)
        for (int d = 0; d < POOL; d++)
            if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], &h));
    uint32_t hb = INIT_B;
    for (int i = 0; i < nwords; i++) {
        uint32_t v = pool[i % POOL] ^ hb;
        hb *= MULT_B;
        v *= hb;
        out[i] = v ^ (v >> XSHIFT);
    }
}

static const u128 PCG_MULT = ((u128)2549297995355413924ULL << 64) + 4865540595714422341ULL;

static void step(mc_pcg64 *g)
{
    u128 s = ((u128)g->state[0] << 64 | g->state[1]) * PCG_MULT +
             ((u128)g->inc[0] << 64 | g->inc[1]);
    g->state[0] = (uint64_t)(s >> 64);
    g->state[1] = (uint64_t)s;
}

void mc_pcg64_seed(mc_pcg64 *g, uint64_t seed)
{
    uint32_t w[8];
    mc_seedseq_state(seed, w, 8);
    uint64_t v[4];
    for (int i = 0; i < 4; i++) v[i] = (uint64_t)w[2 * i] | (uint64_t)w[2 * i + 1] << 32;
    /* pcg_setseq_128_srandom_r: state v[0..1], sequence v[2..3] */
    u128 inc = ((u128)v[2] << 64 | v[3]) << 1 | 1;
    g->inc[0] = (uint64_t)(inc >> 64);
    g->inc[1] = (uint64_t)inc;
    g->state[0] = g->state[1] = 0;
    step(g);
    u128 s = ((u128)g->state[0] << 64 | g->state[1]) + ((u128)v[0] << 64 | v[1]);
    g->state[0] = (uint64_t)(s >> 64);
    g->state[1] = (uint64_t)s;
    step(g);
    g->has32 = 0;
    g->hi32 = 0;
}

uint64_t mc_pcg64_next64(mc_pcg64 *g)
{
    step(g);
    uint64_t x = g->state[0] ^ g->state[1];
    unsigned rot = (unsigned)(g->state[0] >> 58);
    return (x >> rot) | (x << ((-rot) & 63));
}

uint32_t mc_pcg64_next32(mc_pcg64 *g)
{
    if (g->has32) {
        g->has32 = 0;
        return g->hi32;
    }
    uint64_t n = mc_pcg64_next64(g);
    g->has32 = 1;
    g->hi32 = (uint32_t)(n >> 32);
    return (uint32_t)n;
}

void mc_pcg64_integers32(mc_pcg64 *g, int32_t low, int32_t high, int32_t *out, size_t n)
{
    uint32_t range = (uint32_t)high - (uint32_t)low - 1u; /* inclusive span */
    for (size_t i = 0; i < n; i++) {
        if (range == 0) {
            out[i] = low;
            continue;
        }
        if (range == UINT32_MAX) {
            out[i] = (int32_t)((uint32_t)low + mc_pcg64_next32(g));
            continue;
        }
        uint32_t excl = range + 1u;
        uint64_t m = (uint64_t)mc_pcg64_next32(g) * excl;
        uint32_t left = (uint32_t)m;
        if (left < excl) {
            uint32_t threshold = (uint32_t)(-excl) % excl;
            while (left < threshold) {
                m = (uint64_t)mc_pcg64_next32(g) * excl;
                left = (uint32_t)m;
            }
        }
        out[i] = (int32_t)((uint32_t)low + (uint32_t)(m >> 32));
    }
}
