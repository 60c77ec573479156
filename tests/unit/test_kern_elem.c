/*
 * test_kern_elem.c - the CPU backend's flat kernels: backend memory, fill /
 * scale / add / acc, the double reductions, finiteness, bf16 and fp16
 * rounding and casts (hand-picked values, exhaustive round trips, and the
 * CPU's own F16C conversion where present), counter-based initialization
 * (block = slice of the whole, statistics, keys and seeds), parameter-name
 * keys, AdamW against a float64 reference, and identical reruns.
 */
#include "kern_test.h"
#include "kern/backend.h" /* dnnl_bf16: the emulated bf16 form on a native CPU */
#include "kern/cpu/cpu.h"     /* init's own ln and cos */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void check_memory(mc_backend *be)
{
    mc_error err;
    TAP_OK(!strcmp(mc_backend_name(be), "cpu") && mc_backend_threads(be) >= 1,
           "backend is \"cpu\" with %d threads", mc_backend_threads(be));
    unsigned char *p = mc_balloc(be, 1000, &err);
    int zero = p != NULL && ((uintptr_t)p & 63) == 0;
    for (size_t i = 0; p && i < 1000; i++) zero &= p[i] == 0;
    TAP_OK(zero, "mc_balloc: 64-byte aligned and zero-filled");
    unsigned char src[1000], back[1000];
    for (int i = 0; i < 1000; i++) src[i] = (unsigned char)(i * 7);
    mc_bcopy_from_host(be, p, src, 1000);
    unsigned char *q = mc_balloc(be, 1000, &err);
    mc_bcopy(be, q, p, 1000);
    mc_bcopy_to_host(be, back, q, 1000);
    mc_bsync(be);
    TAP_OK(!memcmp(src, back, 1000), "host -> backend -> backend -> host copies keep the bytes");
    mc_bfree(be, p);
    mc_bfree(be, q);
    err.msg[0] = 0;
    void *huge = mc_balloc(be, SIZE_MAX - 10, &err);
    TAP_OK(huge == NULL && err.code == MC_ERR_NOMEM && strstr(err.msg, "kern/cpu"),
           "mc_balloc of SIZE_MAX-10 bytes fails with: %s", err.msg);
    mc_backend *b1 = NULL;
    TAP_OK(mc_backend_cpu_new(3, &b1, &err) == MC_OK && mc_backend_threads(b1) == 3,
           "mc_backend_cpu_new(3) keeps 3 threads");
    mc_backend_free(b1);
    mc_backend_free(NULL);
}

static void check_flat(mc_backend *be)
{
    size_t n = 100003;
    kt_rng r = {3};
    float *a = kt_falloc(n), *b = kt_falloc(n), *o = kt_falloc(n);
    kt_fill(&r, a, n, -2, 2), kt_fill(&r, b, n, -2, 2);
    int ok = 1;
    mc_k_fill(be, o, 0.375f, n);
    for (size_t i = 0; i < n; i++) ok &= o[i] == 0.375f;
    TAP_OK(ok, "fill");
    /* zero (its own memset path) and negative zero (the vector path) */
    mc_k_fill(be, o, 0.0f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &o[i], 4);
        ok &= u == 0;
    }
    mc_k_fill(be, o, -0.0f, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &o[i], 4);
        ok &= u == 0x80000000u;
    }
    TAP_OK(ok, "fill with +0 and -0: every element's bits");
    mc_k_add(be, o, a, b, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= o[i] == a[i] + b[i];
    TAP_OK(ok, "add: out = a + b");
    mc_k_acc(be, o, a, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= o[i] == (a[i] + b[i]) + a[i];
    TAP_OK(ok, "acc: acc += x");
    mc_k_scale(be, o, -0.5f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= o[i] == ((a[i] + b[i]) + a[i]) * -0.5f;
    TAP_OK(ok, "scale: x *= s");

    double ss = 0, sm = 0;
    for (size_t i = 0; i < n; i++) ss += (double)a[i] * a[i], sm += a[i];
    double ks = mc_k_sumsq(be, a, n), km = mc_k_mean(be, a, n);
    TAP_OK(fabs(ks - ss) <= 1e-12 * ss && fabs(km - sm / n) <= 1e-12 * fabs(sm / n) + 1e-15,
           "sumsq %.17g and mean %.3g in double (rel err vs naive double sum <= 1e-12)", ks, km);
    mc_backend *b1 = kt_backend(1);
    double ks1 = mc_k_sumsq(b1, a, n), km1 = mc_k_mean(b1, a, n);
    mc_backend_free(b1);
    TAP_OK(ks1 == ks && km1 == km && mc_k_sumsq(be, a, n) == ks,
           "sumsq and mean: same bits for a rerun and for 1 thread (fixed chunks)");
    TAP_OK(mc_k_sumsq(be, a, 0) == 0 && mc_k_mean(be, a, 0) == 0, "sumsq and mean of nothing: 0");

    TAP_OK(mc_k_all_finite(be, a, n), "all_finite on finite data");
    a[n - 1] = INFINITY;
    TAP_OK(!mc_k_all_finite(be, a, n), "all_finite sees +inf in the last element");
    a[n - 1] = 0, a[12345] = NAN;
    TAP_OK(!mc_k_all_finite(be, a, n), "all_finite sees a NaN");
    a[12345] = -INFINITY;
    TAP_OK(!mc_k_all_finite(be, a, n), "all_finite sees -inf");
    a[12345] = 3.4e38f;
    TAP_OK(mc_k_all_finite(be, a, n), "FLT_MAX-sized values are finite");
    free(a), free(b), free(o);
}

/* how many of f[0..n) are not the bf16 bits h[i] widened to fp32 */
static size_t widened_differ(const float *f, const uint16_t *h, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        bad += u != (uint32_t)h[i] << 16;
    }
    return bad;
}

/* values -> expected bf16 bits */
static void check_bf16(mc_backend *be)
{
    struct {
        uint32_t in;
        uint16_t want;
        const char *what;
    } c[] = {
        {0x3f800000, 0x3f80, "1.0"},
        {0x3f808000, 0x3f80, "1 + 2^-8: tie, to even (down)"},
        {0x3f818000, 0x3f82, "1 + 3*2^-8: tie, to even (up)"},
        {0x3f808001, 0x3f81, "just above the tie: up"},
        {0x3f807fff, 0x3f80, "just below the tie: down"},
        {0xbf818000, 0xbf82, "negative tie, to even"},
        {0x7f7fffff, 0x7f80, "FLT_MAX rounds to +inf"},
        {0x7f800000, 0x7f80, "+inf"},
        {0xff800000, 0xff80, "-inf"},
        {0x7fc00000, 0x7fc0, "quiet NaN"},
        {0x7f800001, 0x7fc0, "signalling NaN with low payload stays NaN (quiet)"},
        {0xffffffff, 0xffff, "negative NaN with all-ones payload"},
        {0x80000000, 0x8000, "-0"},
        {0x000116c2, 0x0001, "subnormal 1e-40 -> nearest bf16 subnormal"},
        {0x00008000, 0x0000, "tie at the smallest subnormal, to even (0)"},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint16_t h;
        float f = bits_f(c[i].in), back;
        mc_k_cast_to_bf16(be, &h, &f, 1);
        mc_k_cast_from_bf16(be, &back, &h, 1);
        float rr = f;
        mc_k_round(be, &rr, 1, MC_PREC_BF16);
        int good = h == c[i].want && f_bits(back) == (uint32_t)c[i].want << 16 &&
                   f_bits(rr) == f_bits(back);
        if (!good) TAP_DIAG("bf16 %s: got 0x%04x want 0x%04x", c[i].what, h, c[i].want);
        ok &= good;
    }
    TAP_OK(ok, "bf16: %zu hand-picked values (ties to even, NaN, inf, overflow, subnormals)",
           sizeof c / sizeof c[0]);
    /* every bf16 value survives float -> bf16 unchanged */
    ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f;
        uint16_t hh = (uint16_t)h, back;
        mc_k_cast_from_bf16(be, &f, &hh, 1);
        mc_k_cast_to_bf16(be, &back, &f, 1);
        int nan = ((h & 0x7f80) == 0x7f80) && (h & 0x7f);
        ok &= nan ? (isnan(f) && back == (hh | 0x40)) : back == hh;
    }
    TAP_OK(ok, "bf16: all 65536 patterns round-trip (NaNs come back quiet)");
    /* the same in one call over arrays (the 16-wide vector path where the
     * CPU has AVX-512; n is not a multiple of 16, so the tail runs too):
     * each hand-picked value at every position mod 16, and every pattern
     * plus the next float above it (a tie or just past one) */
    size_t nc = sizeof c / sizeof c[0], n = 2 * 65536 + 16 * nc + 7;
    float *f = malloc(n * sizeof *f);
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < 16 * nc + 7; i++) f[i] = bits_f(c[(i / 16 + i) % nc].in);
    for (uint32_t p = 0; p < 65536; p++) {
        f[16 * nc + 7 + 2 * p] = bits_f(p << 16);
        f[16 * nc + 7 + 2 * p + 1] = bits_f((p << 16) | 0x8000u);
    }
    mc_k_cast_to_bf16(be, h, f, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t one;
        mc_k_cast_to_bf16(be, &one, &f[i], 1);
        bad += one != h[i];
    }
    TAP_OK(bad == 0, "bf16: %zu values cast in one call = one at a time: %zu differ", n, bad);
    /* mc_k_round to bf16 over the same array (its own vector loop): the
     * cast's bits, widened */
    float *r = malloc(n * sizeof *r);
    memcpy(r, f, n * sizeof *r);
    mc_k_round(be, r, n, MC_PREC_BF16);
    bad = widened_differ(r, h, n);
    TAP_OK(bad == 0, "bf16: mc_k_round over %zu values = the cast's bits: %zu differ", n, bad);
    /* and back: mc_k_cast_from_bf16 over the array widens exactly */
    mc_k_cast_from_bf16(be, r, h, n);
    bad = widened_differ(r, h, n);
    TAP_OK(bad == 0, "bf16: mc_k_cast_from_bf16 over %zu values widens exactly: %zu differ", n,
           bad);

    /* prepare_weight's form of a copy large enough to go past the caches
     * (non-temporal stores from 2^20 elements on, where the path has them),
     * the values above repeated, written from an odd element so that the
     * scalar head and tail run too: the cast's bits, as bf16 where the bf16
     * GEMM is native and widened to fp32 otherwise */
    size_t big = ((size_t)1 << 20) + 4099;
    float *src = malloc(big * sizeof *src);
    unsigned char *out = malloc((big + 3) * 4);
    for (size_t i = 0; i < big; i++) src[i] = f[i % n];
    /* where the bf16 GEMM is native, the emulated form too (the backend
     * told that it is not) */
    const int native = be->dnnl_bf16;
    for (int emu = 0; emu <= native; emu++) {
        be->dnnl_bf16 = native && !emu;
        size_t es = mc_backend_weight_bytes(be, MC_PREC_BF16);
        mc_k_prepare_weight(be, MC_PREC_BF16, out + 3 * es, src, big, 0);
        bad = 0;
        for (size_t i = 0; i < big; i++) {
            uint16_t want = h[i % n];
            uint32_t got32 = 0;
            uint16_t got16 = 0;
            if (es == 2) memcpy(&got16, out + (3 + i) * 2, 2);
            else memcpy(&got32, out + (3 + i) * 4, 4);
            bad += es == 2 ? got16 != want : got32 != (uint32_t)want << 16;
        }
        TAP_OK(bad == 0 && (es == 2 || es == 4),
               "bf16: prepare_weight over %zu values from an odd element (%zu bytes each%s) = "
               "the cast's bits: %zu differ",
               big, es, emu ? ", emulated on a native CPU" : "", bad);
    }
    be->dnnl_bf16 = native;
    free(src), free(out);
    free(f), free(h), free(r);
}

static void check_fp16(mc_backend *be)
{
    struct {
        float in;
        uint16_t want;
        const char *what;
    } c[] = {
        {1.0f, 0x3c00, "1.0"},
        {1.0f + 0x1p-11f, 0x3c00, "1 + 2^-11: tie, to even (down)"},
        {1.0f + 3 * 0x1p-11f, 0x3c02, "1 + 3*2^-11: tie, to even (up)"},
        {0.1f, 0x2e66, "0.1"},
        {-2.5f, 0xc100, "-2.5"},
        {65504.0f, 0x7bff, "65504 = max"},
        {65519.0f, 0x7bff, "65519 rounds down to max"},
        {65520.0f, 0x7c00, "65520 overflows to inf (tie, to even)"},
        {1e6f, 0x7c00, "1e6 overflows to inf"},
        {-1e6f, 0xfc00, "-1e6 overflows to -inf"},
        {INFINITY, 0x7c00, "+inf"},
        {0x1p-14f, 0x0400, "2^-14, smallest normal"},
        {0x1p-24f, 0x0001, "2^-24, smallest subnormal"},
        {0x1p-25f, 0x0000, "2^-25: tie, to even (0)"},
        {1.5f * 0x1p-25f, 0x0001, "1.5*2^-25 rounds up to 2^-24"},
        {3 * 0x1p-25f, 0x0002, "3*2^-25: tie, to even (2 units)"},
        {1023 * 0x1p-24f, 0x03ff, "largest subnormal"},
        {1023.5f * 0x1p-24f, 0x0400, "between largest subnormal and 2^-14: tie, up to even"},
        {1e-10f, 0x0000, "1e-10 underflows to 0"},
        {-0.0f, 0x8000, "-0"},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint16_t h;
        mc_k_cast_to_fp16(be, &h, &c[i].in, 1);
        if (h != c[i].want) TAP_DIAG("fp16 %s: got 0x%04x want 0x%04x", c[i].what, h, c[i].want);
        ok &= h == c[i].want;
    }
    uint16_t hn;
    float nanv = NAN, f;
    mc_k_cast_to_fp16(be, &hn, &nanv, 1);
    ok &= (hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0;
    mc_k_cast_from_fp16(be, &f, &hn, 1);
    ok &= isnan(f);
    TAP_OK(ok, "fp16: %zu hand-picked values and NaN", sizeof c / sizeof c[0]);
    /* decoding: subnormals, inf, -0 */
    uint16_t hs[] = {0x0001, 0x03ff, 0x7c00, 0xfc00, 0x8000, 0x3555, 0xfbff};
    float want[] = {0x1p-24f, 1023 * 0x1p-24f, INFINITY, -INFINITY,
                    -0.0f,    0.333251953125f, -65504.0f};
    float got[7];
    mc_k_cast_from_fp16(be, got, hs, 7);
    ok = 1;
    for (int i = 0; i < 7; i++) ok &= f_bits(got[i]) == f_bits(want[i]);
    TAP_OK(ok, "fp16 decoding of subnormals, infinities, -0, normals");
    ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t hh = (uint16_t)h, back;
        float v;
        mc_k_cast_from_fp16(be, &v, &hh, 1);
        mc_k_cast_to_fp16(be, &back, &v, 1);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        ok &= nan ? (isnan(v) && back == (hh | 0x200)) : back == hh;
    }
    TAP_OK(ok, "fp16: all 65536 patterns round-trip (NaNs come back quiet)");
}

#ifdef HAVE_X86
/* the CPU's own conversion (F16C, round to nearest even) as a reference */
__attribute__((target("f16c"))) static uint16_t hw_fp16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((target("f16c"))) static float hw_fp16_back(uint16_t h) { return _cvtsh_ss(h); }

static void check_fp16_hw(mc_backend *be)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c")) {
        TAP_SKIP("this CPU has no F16C to compare fp16 conversion with");
        return;
    }
    size_t n = 1 << 20, bad = 0;
    kt_rng r = {16};
    float *x = kt_falloc(n), *y = kt_falloc(n);
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        /* random bit patterns, half of them in fp16's exponent range */
        uint32_t u = (uint32_t)kt_next(&r);
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(100 + kt_next(&r) % 46) << 23);
        x[i] = bits_f(u);
    }
    mc_k_cast_to_fp16(be, h, x, n);
    for (size_t i = 0; i < n; i++) bad += h[i] != hw_fp16(x[i]);
    mc_k_round(be, x, n, MC_PREC_FP16);
    memcpy(y, x, n * 4);
    for (size_t i = 0; i < n; i++) {
        float w = hw_fp16_back(h[i]);
        bad += !(f_bits(y[i]) == f_bits(w) || (isnan(y[i]) && isnan(w)));
    }
    TAP_OK(bad == 0, "fp16 cast and round equal the CPU's F16C on 2^20 random floats (%zu differ)",
           bad);
    free(x), free(y), free(h);
}

#else
static void check_fp16_hw(mc_backend *be)
{
    (void)be;
    TAP_SKIP("not an x86 CPU: no F16C to compare fp16 conversion with");
}
#endif

/* SplitMix64's finalizer (init.c's mix64, written out again for the
 * reference) */
static uint64_t ref_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* cos(2 pi t) in long double with the argument reduced exactly first (the
 * unreduced product loses all its digits next to the zeros) */
static long double ref_cos_2pi(long double t)
{
    t = t <= 0.5L ? t : 1.0L - t;
    long double sg = t <= 0.25L ? 1.0L : -1.0L;
    t = t <= 0.25L ? t : 0.5L - t;
    const long double pi2 = 6.283185307179586476925286766559005768L;
    return t > 0.125L ? sg * sinl(pi2 * (0.25L - t)) : sg * cosl(pi2 * t);
}

static void check_init(mc_backend *be)
{
    size_t R = 64, C = 48;
    uint64_t key = mc_k_name_key("decoder.layers.0.mlp.linear_fc1.weight");
    float *full = kt_falloc(R * C), *blk = kt_falloc(20 * 24), *again = kt_falloc(R * C);
    mc_k_init_normal(be, full, R, C, C, 0, 0, 1234, key, 0.02f);
    mc_k_init_normal(be, blk, 20, 24, C, 10, 16, 1234, key, 0.02f);
    int ok = 1;
    for (size_t r = 0; r < 20; r++)
        for (size_t c = 0; c < 24; c++) ok &= blk[r * 24 + c] == full[(10 + r) * C + 16 + c];
    TAP_OK(ok, "init: a 20x24 block at (10,16) equals that slice of the whole 64x48 matrix");
    mc_k_init_normal(be, again, R, C, C, 0, 0, 1234, key, 0.02f);
    TAP_OK(!memcmp(full, again, R * C * 4), "init: same (seed, key) gives identical bytes");
    mc_k_init_normal(be, again, R, C, C, 0, 0, 1235, key, 0.02f);
    size_t same = 0;
    for (size_t i = 0; i < R * C; i++) same += again[i] == full[i];
    TAP_OK(same == 0, "init: another seed changes every element (%zu equal)", same);
    mc_k_init_normal(be, again, R, C, C, 0, 0, 1234, key + 1, 0.02f);
    same = 0;
    for (size_t i = 0; i < R * C; i++) same += again[i] == full[i];
    TAP_OK(same == 0, "init: another key changes every element (%zu equal)", same);

    size_t n = 1000000;
    float *x = kt_falloc(n);
    mc_k_init_normal(be, x, 1000, 1000, 1000, 0, 0, 42, 7, 2.0f);
    double s = 0, s2 = 0, in1 = 0, s4 = 0;
    for (size_t i = 0; i < n; i++) {
        double v = x[i] / 2.0;
        s += v, s2 += v * v, s4 += v * v * v * v, in1 += fabs(v) < 1;
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean), kurt = s4 / n;
    /* standard errors at n = 1e6: mean 1e-3, sd 7e-4, P(|z|<1) 4.7e-4, E z^4 5e-3 */
    TAP_OK(fabs(mean) < 5e-3 && fabs(sd - 1) < 5e-3 && fabs(in1 / n - 0.682689) < 3e-3 &&
               fabs(kurt - 3) < 0.05,
           "init 1e6 samples of std 2: mean/std %.5f, sd/std %.5f (|.|<5e-3, |.-1|<5e-3), "
           "P(|z|<1) %.4f (0.6827 +- 3e-3), E z^4 %.3f (3 +- 0.05)",
           mean, sd, in1 / n, kurt);
    free(full), free(blk), free(again), free(x);

    /* init's own ln and cos(2 pi t) (same bits on every path, no libm)
     * against long double libm over 2^20 of the (u1, u2) pairs the
     * generator makes: within 2 units in the last place of a double; cos
     * against the long double cosine of the exactly reduced argument (the
     * unreduced one loses all its digits next to the zeros) */
    double worst_l = 0, worst_c = 0;
    uint64_t st = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < ((size_t)1 << 20); i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        uint32_t a = (uint32_t)(st >> 32), b = (uint32_t)st;
        double u1 = ((double)a + 0.5) * 0x1p-32, u2 = (double)b * 0x1p-32;
        long double L = logl((long double)u1), Cr = ref_cos_2pi(u2);
        double ul = nextafter(fabs((double)L), INFINITY) - fabs((double)L);
        double uc = nextafter(fabs((double)Cr), INFINITY) - fabs((double)Cr);
        double el = (double)(fabsl(mc_cpu_init_log(u1) - L) / ul);
        double ec = (double)(fabsl(mc_cpu_init_cos_2pi(u2) - Cr) / uc);
        worst_l = el > worst_l ? el : worst_l;
        worst_c = ec > worst_c ? ec : worst_c;
    }
    TAP_OK(worst_l <= 2.0 && worst_c <= 2.0,
           "init's ln and cos(2 pi t) vs long double libm, 2^20 pairs: worst %.2f and %.2f units "
           "in the last place of a double (<= 2)",
           worst_l, worst_c);
    /* and init's values: each the fp32 rounding of the long double formula,
     * but where that lies within the functions' error of an fp32 rounding
     * boundary (expected ~1e-8 of the values; at most 2 of these 2^20) */
    {
        size_t nn = (size_t)1 << 20, off = 0, far = 0;
        float *xs = kt_falloc(nn);
        const uint64_t seed = 1234, kk = mc_k_name_key("layers.0.mlp.fc1.weight");
        mc_k_init_normal(be, xs, 1024, 1024, 1024, 0, 0, seed, kk, 0.02f);
        for (size_t g = 0; g < nn; g++) {
            uint64_t sm = seed * 0x9e3779b97f4a7c15ull + ref_mix64(kk ^ 0x6a09e667f3bcc909ull);
            uint64_t z = ref_mix64(ref_mix64(sm) + (g + 1) * 0x9e3779b97f4a7c15ull);
            long double u1 = ((long double)(z >> 32) + 0.5L) * 0x1p-32L;
            long double c = ref_cos_2pi((long double)(z & 0xffffffffull) * 0x1p-32L);
            float want = (float)((long double)0.02f * sqrtl(-2.0L * logl(u1)) * c);
            off += xs[g] != want;
            far += fabsf(xs[g] - want) > nextafterf(fabsf(want), INFINITY) - fabsf(want);
        }
        TAP_OK(off <= 2 && far == 0,
               "init: 2^20 values = the fp32 rounding of Box-Muller in long double: %zu differ "
               "(<= 2), %zu by more than one fp32 unit (0)",
               off, far);
        free(xs);
    }

    TAP_OK(mc_k_name_key("") == 0xcbf29ce484222325ull &&
               mc_k_name_key("a") == 0xaf63dc4c8601ec8cull &&
               mc_k_name_key("foobar") == 0x85944171f73967e8ull,
           "name key is 64-bit FNV-1a (published test vectors)");
}

static void check_adamw(mc_backend *be)
{
    size_t n = 50000;
    kt_rng r = {8};
    float *p = kt_falloc(n), *g = kt_falloc(n), *m = kt_falloc(n), *v = kt_falloc(n);
    double *dp = kt_dalloc(n), *dm = kt_dalloc(n), *dv = kt_dalloc(n);
    kt_fill(&r, p, n, -1, 1);
    for (size_t i = 0; i < n; i++) dp[i] = p[i];
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    for (int step = 1; step <= 5; step++) {
        kt_fill(&r, g, n, -1, 1);
        float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
        mc_k_adamw(be, p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gs);
        for (size_t i = 0; i < n; i++) {
            double gg = (double)g[i] * gs;
            dm[i] = (double)b1 * dm[i] + (1 - (double)b1) * gg;
            dv[i] = (double)b2 * dv[i] + (1 - (double)b2) * gg * gg;
            dp[i] -= (double)lr * (dm[i] / bc1 / (sqrt(dv[i] / bc2) + eps) + (double)wd * dp[i]);
        }
    }
    double ep = kt_err(p, dp, n), em = kt_err(m, dm, n), ev = kt_err(v, dv, n);
    TAP_OK(ep < 1e-5 && em < 1e-5 && ev < 1e-5,
           "adamw 5 steps vs float64: p %.2e, m %.2e, v %.2e < 1e-5", ep, em, ev);

    /* adamw_prepare: adamw's bytes, and the updated p prepared as
     * mc_k_prepare_weight prepares it, for each reduced precision, at a
     * size below and one above 2^20 (from there the copy is written with
     * non-temporal stores where the path has them); bf16 also against the
     * one-element cast's bits */
    static const mc_prec precs[] = {MC_PREC_BF16, MC_PREC_FP16, MC_PREC_TF32};
    static const size_t sizes[] = {50000, ((size_t)1 << 20) + 3001};
    for (int z = 0; z < 2; z++)
        for (int k = 0; k < 3; k++) {
            size_t nz = sizes[z], es = mc_backend_weight_bytes(be, precs[k]);
            float *p1 = kt_falloc(nz), *g1 = kt_falloc(nz), *m1 = kt_falloc(nz);
            float *v1 = kt_falloc(nz);
            kt_fill(&r, p1, nz, -1, 1), kt_fill(&r, g1, nz, -1, 1), kt_fill(&r, m1, nz, -1, 1);
            kt_fill(&r, v1, nz, 0, 1);
            float *p2 = kt_copy(p1, nz), *m2 = kt_copy(m1, nz), *v2 = kt_copy(v1, nz);
            float *p3 = kt_copy(p1, nz), *m3 = kt_copy(m1, nz), *v3 = kt_copy(v1, nz);
            void *pw = calloc(nz, es), *ref = calloc(nz, es);
            mc_k_adamw(be, p2, g1, m2, v2, nz, lr, b1, b2, eps, wd, 0.5f, 0.6f, gs);
            mc_k_prepare_weight(be, precs[k], ref, p2, nz, 0);
            mc_k_adamw_prepare(be, p3, g1, m3, v3, nz, lr, b1, b2, eps, wd, 0.5f, 0.6f, gs,
                               precs[k], pw, 0);
            int same = !memcmp(p2, p3, nz * 4) && !memcmp(m2, m3, nz * 4) &&
                       !memcmp(v2, v3, nz * 4);
            int prep = !memcmp(pw, ref, nz * es), moved = memcmp(p2, p1, nz * 4) != 0;
            size_t bad = 0;
            for (size_t i = 0; k == 0 && i < nz; i++) {
                uint16_t want;
                mc_k_cast_to_bf16(be, &want, &p2[i], 1);
                uint32_t got = 0;
                memcpy(&got, (char *)pw + i * es, es);
                bad += es == 2 ? got != want : got != (uint32_t)want << 16;
            }
            TAP_OK(same && prep && moved && es > 0 && bad == 0,
                   "adamw_prepare (%s, %zu elements of %zu bytes): adamw's p, m, v (%d) and "
                   "prepare_weight's form of the new p (%d), byte for byte; bf16 = the cast's "
                   "bits (%zu differ)",
                   k == 0   ? "bf16"
                   : k == 1 ? "fp16"
                            : "tf32",
                   nz, es, same, prep, bad);
            free(p1), free(g1), free(m1), free(v1);
            free(p2), free(m2), free(v2), free(p3), free(m3), free(v3), free(pw), free(ref);
        }
    /* A linear weight [O, I] where bf16 goes through the bf16-panel GEMM
     * (b16gemm.c): prepare_weight with cols writes its panels, each value
     * where the layout puts it (the forward's panel of rows 16 q.. is
     * [I][w], then the backward's panel of columns 16 q.. is [O][w]), and
     * adamw_prepare with cols writes the same bytes after adamw's update;
     * a small shape with narrow panels both ways and one past 2^20
     * elements (streamed stores) */
    static const size_t mats[2][2] = {{37, 40}, {1040, 1024}};
    for (int z = 0; z < 2; z++) {
        size_t O = mats[z][0], I = mats[z][1], nz = O * I;
        if (!mc_backend_weight_panels(be, MC_PREC_BF16)) {
            TAP_SKIP("bf16 is not emulated through panels on this path");
            continue;
        }
        float *p1 = kt_falloc(nz), *g1 = kt_falloc(nz), *m1 = kt_falloc(nz), *v1 = kt_falloc(nz);
        kt_fill(&r, p1, nz, -1, 1), kt_fill(&r, g1, nz, -1, 1), kt_fill(&r, m1, nz, -1, 1);
        kt_fill(&r, v1, nz, 0, 1);
        float *p2 = kt_copy(p1, nz), *m2 = kt_copy(m1, nz), *v2 = kt_copy(v1, nz);
        size_t bytes = (nz * 4 + 63) / 64 * 64;
        uint16_t *pw = aligned_alloc(64, bytes), *ref = aligned_alloc(64, bytes);
        uint16_t *bits = malloc(nz * 2);
        mc_k_adamw(be, p2, g1, m2, v2, nz, lr, b1, b2, eps, wd, 0.5f, 0.6f, gs);
        mc_k_prepare_weight(be, MC_PREC_BF16, ref, p2, nz, I);
        mc_k_adamw_prepare(be, p1, g1, m1, v1, nz, lr, b1, b2, eps, wd, 0.5f, 0.6f, gs,
                           MC_PREC_BF16, pw, I);
        mc_k_cast_to_bf16(be, bits, p2, nz);
        size_t bad = 0;
        for (size_t o = 0; o < O; o++)
            for (size_t i = 0; i < I; i++) {
                size_t w = O - o / 16 * 16 < 16 ? O - o / 16 * 16 : 16;
                size_t wq = I - i / 16 * 16 < 16 ? I - i / 16 * 16 : 16;
                bad += ref[o / 16 * 16 * I + i * w + o % 16] != bits[o * I + i];
                bad += ref[nz + i / 16 * 16 * O + o * wq + i % 16] != bits[o * I + i];
            }
        int same = !memcmp(p1, p2, nz * 4) && !memcmp(m1, m2, nz * 4) && !memcmp(v1, v2, nz * 4);
        TAP_OK(bad == 0 && !memcmp(pw, ref, nz * 4) && same,
               "bf16 panels of a %zu x %zu weight: prepare_weight puts each value where the layout "
               "says (%zu misplaced); adamw_prepare: adamw's bytes and the same panels",
               O, I, bad);
        free(p1), free(g1), free(m1), free(v1), free(p2), free(m2), free(v2);
        free(pw), free(ref), free(bits);
    }
    free(p), free(g), free(m), free(v), free(dp), free(dm), free(dv);
}

/* The FP8 grid written out from the format: every finite non-negative
 * E4M3 (bias 7, 3 mantissa bits, 0x7f reserved for NaN: largest 448) or
 * E5M2 (bias 15, 2 mantissa bits, exponent 31 for inf/NaN: largest 57344)
 * value, ascending; returns the count. */
static int fp8_grid(double *v, int e5m2)
{
    int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, n = 0;
    int emax = e5m2 ? 30 : 15;
    for (int e = 0; e <= emax; e++)
        for (int m = 0; m < (1 << mb); m++) {
            if (!e5m2 && e == 15 && m == 7) continue; /* NaN */
            double f = e ? ldexp(1.0 + m / (double)(1 << mb), e - bias)
                         : ldexp(m / (double)(1 << mb), 1 - bias);
            v[n++] = f;
        }
    return n;
}

/* the FP8 value nearest to x (ties to the even code), saturating: a search
 * of the grid, independent of the kernel's bit arithmetic */
static double fp8_ref(double x, const double *g, int n)
{
    double a = fabs(x);
    if (a >= g[n - 1]) return copysign(g[n - 1], x);
    int i = 0;
    while (g[i + 1] <= a) i++;
    double lo = g[i], hi = g[i + 1], r;
    if (a - lo < hi - a)
        r = lo;
    else if (a - lo > hi - a)
        r = hi;
    else
        r = i % 2 ? hi : lo; /* the even code: codes ascend with the grid */
    return copysign(r, x);
}

static void check_fp8(mc_backend *be)
{
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        const char *name = e5m2 ? "E5M2" : "E4M3";
        double g[256];
        int n = fp8_grid(g, e5m2);
        /* every grid value, every midpoint and a point either side of it,
         * negatives, values past the largest, subnormals and zero */
        size_t m = 0, cap = (size_t)n * 8 + 16;
        float *x = malloc(cap * sizeof *x), *q = malloc(cap * sizeof *q);
        for (int i = 0; i < n; i++) {
            x[m++] = (float)g[i];
            x[m++] = (float)-g[i];
            if (i + 1 < n) {
                double mid = (g[i] + g[i + 1]) / 2;
                x[m++] = (float)mid;
                x[m++] = (float)-mid;
                x[m++] = nextafterf((float)mid, 0.0f);
                x[m++] = nextafterf((float)mid, INFINITY);
            }
        }
        x[m++] = (float)(g[n - 1] * 1.03);
        x[m++] = (float)(-g[n - 1] * 1000);
        x[m++] = 1e30f;
        x[m++] = INFINITY;
        x[m++] = -INFINITY;
        x[m++] = 1e-30f;
        x[m++] = (float)(g[1] / 2); /* half the smallest subnormal: a tie to 0 */
        x[m++] = 0.0f;
        mc_k_fp8_quantize(be, q, x, m, 1.0f, e5m2);
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            double want = isinf(x[i]) ? copysign(g[n - 1], x[i]) : fp8_ref(x[i], g, n);
            if ((double)q[i] != want) {
                if (!bad) TAP_DIAG("%s: %.9g -> %.9g, want %.9g", name, x[i], q[i], want);
                bad++;
            }
        }
        TAP_OK(bad == 0, "fp8_quantize %s: %zu values (the %d grid values, their midpoints "
               "and neighbours, saturation, subnormals) = nearest even: %zu differ",
               name, m, n, bad);
        /* the scale multiplies first; NaN stays NaN */
        float y[3] = {1.0f, NAN, -3.0f}, qy[3];
        mc_k_fp8_quantize(be, qy, y, 3, 0.1f, e5m2);
        TAP_OK(qy[0] == (float)fp8_ref(0.1f, g, n) && isnan(qy[1]) &&
                   qy[2] == (float)fp8_ref(-3.0f * 0.1f, g, n),
               "fp8_quantize %s: x scale rounded; NaN kept", name);
        free(x);
        free(q);
    }
    float a[5] = {0.5f, -7.0f, 3.0f, 0.0f, -0.0f};
    TAP_OK(mc_k_amax(be, a, 5) == 7.0f && mc_k_amax(be, a, 0) == 0.0f, "amax: max |x|; 0 of none");
    a[2] = NAN;
    TAP_OK(isnan(mc_k_amax(be, a, 5)), "amax: NaN when any element is");
    float o[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, 0, -1}, y2[6] = {1, 1, 1, 1, 1, 1};
    mc_k_fp8_out(be, o, 2, 3, 0.25f, b);
    TAP_OK(o[0] == 0.75f && o[2] == -0.25f && o[5] == 0.5f, "fp8_out: out s + b[column]");
    mc_k_axpy(be, y2, o, 6, 2.0f);
    TAP_OK(y2[0] == 2.5f && y2[5] == 2.0f, "axpy: y += a x");
}

int main(void)
{
    mc_backend *be = kt_backend(0);
    check_memory(be);
    check_flat(be);
    check_bf16(be);
    check_fp16(be);
    check_fp16_hw(be);
    check_init(be);
    check_adamw(be);
    check_fp8(be);
    mc_backend_free(be);
    return tap_done();
}
