/*
 * init.c - counter-based normal initialization and parameter-name keys: the
 * value of global element g of a parameter is a pure function of (seed, key,
 * g), so any block of a matrix (a tensor-parallel shard) holds exactly the
 * elements of the whole matrix. The algorithm is above mc_cpu_init_normal.
 */
#include <math.h>
#include <string.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ln u for u in (0, 1), from +, -, *, / alone, so that every path
 * (scalar, AVX2, AVX-512) gives the same bits and the loop vectorizes:
 * u = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
 * s = (m - 1) / (m + 1), |s| <= 0.1716, by its Taylor series to s^23
 * (the next term is below 2^-60 of the sum), and e ln 2 with ln 2 split
 * so that e ln2_hi is exact. Within about 2 units in the last place of
 * the double result. */
static inline double log_unit(double u)
{
    uint64_t b;
    memcpy(&b, &u, 8);
    int64_t e = (int64_t)((b >> 52) & 0x7ff) - 1023;
    uint64_t mb = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* m in [1, 2) */
    int up = mb > 0x3ff6a09e667f3bcdull;                                 /* m > sqrt(2) */
    mb -= up ? 0x0010000000000000ull : 0;                                /* m / 2, exact */
    e += up;
    double m;
    memcpy(&m, &mb, 8);
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 23.0;
    p = 1.0 / 21.0 + s2 * p;
    p = 1.0 / 19.0 + s2 * p;
    p = 1.0 / 17.0 + s2 * p;
    p = 1.0 / 15.0 + s2 * p;
    p = 1.0 / 13.0 + s2 * p;
    p = 1.0 / 11.0 + s2 * p;
    p = 1.0 / 9.0 + s2 * p;
    p = 1.0 / 7.0 + s2 * p;
    p = 1.0 / 5.0 + s2 * p;
    p = 1.0 / 3.0 + s2 * p;
    double lnm = 2.0 * s + 2.0 * s * (s2 * p);
    const double ln2_hi = 0x1.62e42fefa3800p-1, ln2_lo = 0x1.ef35793c76730p-45;
    double de = (double)(int32_t)e; /* |e| <= 33 */
    return de * ln2_hi + (lnm + de * ln2_lo);
}

/* cos(2 pi t) for t = k / 2^32 in [0, 1), from the same operations: the
 * symmetries of the circle bring t into [0, 1/8] exactly (t has 32
 * significant bits), then x = 2 pi t (2 pi split so that t * hi is exact)
 * in [0, pi/4], and cos x or sin x by Taylor series to x^18 / x^19 (the
 * next term is below 2^-55 of the result). */
static inline double cos_2pi_unit(double t)
{
    t = t <= 0.5 ? t : 1.0 - t;          /* cos(2 pi (1 - t)) = cos(2 pi t) */
    double sign = t <= 0.25 ? 1.0 : -1.0; /* cos(2 pi (1/2 - t)) = -cos(2 pi t) */
    t = t <= 0.25 ? t : 0.5 - t;
    int use_sin = t > 0.125; /* cos(2 pi t) = sin(2 pi (1/4 - t)) */
    t = use_sin ? 0.25 - t : t;
    const double pi2_hi = 0x1.921fbp+2, pi2_lo = 0x1.5110b4611a626p-20;
    double x = t * pi2_hi + t * pi2_lo, x2 = x * x;
    double c = -1.0 / 6402373705728000.0; /* -1/18! */
    c = 1.0 / 20922789888000.0 + x2 * c;     /* 1/16! */
    c = -1.0 / 87178291200.0 + x2 * c;       /* -1/14! */
    c = 1.0 / 479001600.0 + x2 * c;          /* 1/12! */
    c = -1.0 / 3628800.0 + x2 * c;           /* -1/10! */
    c = 1.0 / 40320.0 + x2 * c;
    c = -1.0 / 720.0 + x2 * c;
    c = 1.0 / 24.0 + x2 * c;
    c = -0.5 + x2 * c;
    double cosx = 1.0 + x2 * c;
    double q = -1.0 / 121645100408832000.0; /* -1/19! */
    q = 1.0 / 355687428096000.0 + x2 * q;     /* 1/17! */
    q = -1.0 / 1307674368000.0 + x2 * q;      /* -1/15! */
    q = 1.0 / 6227020800.0 + x2 * q;          /* 1/13! */
    q = -1.0 / 39916800.0 + x2 * q;           /* -1/11! */
    q = 1.0 / 362880.0 + x2 * q;
    q = -1.0 / 5040.0 + x2 * q;
    q = 1.0 / 120.0 + x2 * q;
    q = -1.0 / 6.0 + x2 * q;
    double sinx = x + x * (x2 * q);
    return sign * (use_sin ? sinx : cosx);
}

double mc_cpu_init_log(double u) { return log_unit(u); }
double mc_cpu_init_cos_2pi(double t) { return cos_2pi_unit(t); }

/* a 32-bit unsigned value as a double, through the signed conversion every
 * path has */
static inline double u32_double(uint32_t v)
{
    return (double)(int32_t)(v ^ 0x80000000u) + 2147483648.0;
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
 *             rounded once to fp32)
 *
 * ln and cos are log_unit and cos_2pi_unit above, not libm's: the loop is
 * vectorized on each path (isa.h) with the same bits on every path and
 * every thread count. (They agree with libm's log and cos to about 2 units
 * in the last place of a double, so the fp32 results are libm's but for
 * the rare value within that of a rounding boundary of fp32.) */
MC_ISA_BODY void init_span_body(float *restrict x, size_t n, uint64_t stream, uint64_t g0,
                                double std, int isa MC_ISA_UNUSED)
{
#pragma omp simd
    for (size_t c = 0; c < n; c++) {
        uint64_t z = mix64(stream + (g0 + c + 1) * GOLDEN);
        double u1 = (u32_double((uint32_t)(z >> 32)) + 0.5) * 0x1p-32;
        double u2 = u32_double((uint32_t)z) * 0x1p-32;
        x[c] = (float)(std * sqrt(-2.0 * log_unit(u1)) * cos_2pi_unit(u2));
    }
}
MC_ISA_VARIANTS_VOID(init_span,
                     (float *restrict x, size_t n, uint64_t stream, uint64_t g0, double std),
                     (x, n, stream, g0, std))

void mc_cpu_init_normal(mc_backend *be, float *x, size_t rows, size_t cols, uint64_t global_cols,
                        uint64_t row0, uint64_t col0, uint64_t seed, uint64_t key, float std)
{
    const uint64_t stream = mix64(seed * GOLDEN + mix64(key ^ 0x6a09e667f3bcc909ull));
    init_span_fn f = init_span_for(be->isa);
#pragma omp parallel for num_threads(be->threads) if (rows * cols > 4096) schedule(static)
    for (size_t r = 0; r < rows; r++)
        f(x + r * cols, cols, stream, (row0 + r) * global_cols + col0, (double)std);
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
