/*
 * fp8_emu.cc - runs lib/kern/cuda/fp8.cu's FP8 emulation kernels on the CPU
 * (tests/cuda/emu.h) and compares each with the CPU backend's (libmc): the
 * quantized values bit for bit on random data at many scales (both formats,
 * saturation, subnormals, NaN), amax (with a NaN), fp8_out and axpy bit for
 * bit (no contraction on either side), amax_into's running maximum, and the
 * FP8 bytes cuBLASLt's FP8 GEMMs read (decoded, the quantized values; the
 * transposed copy, the same bytes).
 *
 * Build and run: tests/cuda/emu.sh fp8 WORKDIR BUILD-DIR.
 */
#include "emu.h"

#include "mc/kern.h"


#include "kern/cuda/fp8.cu"

static uint64_t rng = 0x13198a2e03707344ull;
static double urand()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static int fails = 0, checks = 0;
static void report(bool ok, const char *what)
{
    checks++;
    if (!ok) fails++;
    printf("%s %d - %s\n", ok ? "ok" : "not ok", checks, what);
}

int main()
{
    mc_backend *cpu;
    mc_error err;
    if (mc_backend_cpu_new(1, &cpu, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    mc_cuda cu{};
    const size_t n = 3000;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) /* magnitudes 2^-30 .. 2^20, both signs */
        x[i] = (float)((urand() < 0.5 ? -1 : 1) * std::ldexp(1.0 + urand(), (int)(urand() * 50) - 30));
    x[7] = NAN;
    x[8] = INFINITY;
    x[9] = 0.0f;
    for (int e5m2 = 0; e5m2 < 2; e5m2++)
        for (float s : {1.0f, 0.37f, 1024.0f, 3.1e-5f}) {
            std::vector<float> q1(n, -1), q2(n, -2);
            mc_k_fp8_quantize(cpu, q1.data(), x.data(), n, s, e5m2);
            mc_cuda_fp8_quantize(&cu, q2.data(), x.data(), n, s, e5m2);
            char w[96];
            snprintf(w, sizeof w, "fp8_quantize %s scale %g: the CPU's bits", e5m2 ? "E5M2" : "E4M3", s);
            report(!memcmp(q1.data(), q2.data(), n * 4), w);
        }
    std::vector<float> y(x.begin() + 10, x.end());
    report(mc_cuda_amax(&cu, y.data(), y.size()) == mc_k_amax(cpu, y.data(), y.size()),
           "amax: the CPU's value");
    report(std::isnan(mc_cuda_amax(&cu, x.data(), n)), "amax: NaN when an element is");
    report(mc_cuda_amax(&cu, x.data(), 0) == 0.0f, "amax of nothing: 0");
    const size_t N = 37, O = 29;
    std::vector<float> o1(y.begin(), y.begin() + N * O), o2 = o1, b(y.begin() + 1100, y.begin() + 1100 + O);
    mc_k_fp8_out(cpu, o1.data(), N, O, 0.013f, b.data());
    mc_cuda_fp8_out(&cu, o2.data(), N, O, 0.013f, b.data());
    report(!memcmp(o1.data(), o2.data(), N * O * 4), "fp8_out with a bias: the CPU's bits");
    mc_k_fp8_out(cpu, o1.data(), N, O, 3.0f, nullptr);
    mc_cuda_fp8_out(&cu, o2.data(), N, O, 3.0f, nullptr);
    report(!memcmp(o1.data(), o2.data(), N * O * 4), "fp8_out without: the CPU's bits");
    std::vector<float> a1(y.begin() + 200, y.begin() + 1200), a2 = a1;
    mc_k_axpy(cpu, a1.data(), y.data(), 1000, -0.7f);
    mc_cuda_axpy(&cu, a2.data(), y.data(), 1000, -0.7f);
    report(!memcmp(a1.data(), a2.data(), 1000 * 4), "axpy: the CPU's bits");
    /* amax_into: the running maximum in backend memory, as the CPU's */
    {
        /* amax 0.5 (kept), 0.1 (kept), 7 (taken), NaN (taken), 0.25
         * (replaces the NaN), 7 */
        float seq[][2] = {{0.5f, 0}, {0, 0}, {7.0f, 0}, {0, 1}, {0.25f, 0}, {7.0f, 0}};
        float mc = 0.5f, mg = 0.5f;
        bool same = true;
        for (auto &st : seq) {
            std::vector<float> v(300);
            for (size_t i = 0; i < v.size(); i++) v[i] = 0.1f * std::sin((float)i);
            if (st[0] != 0) v[17] = -st[0];
            if (st[1] != 0) v[5] = NAN;
            mc_k_amax_into(cpu, &mc, v.data(), v.size());
            mc_cuda_amax_into(&cu, &mg, v.data(), v.size());
            same = same && !memcmp(&mc, &mg, 4);
        }
        report(same && !std::isnan(mc) && mc == 7.0f,
               "amax_into: the CPU's running maximum, step by step, through a NaN");
    }
    /* the FP8 bytes of quantized values: decoded, the values; transposed,
     * the same bytes in the other order */
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        const size_t R = 37, C = 70;
        std::vector<float> q(R * C);
        mc_k_fp8_quantize(cpu, q.data(), x.data(), R * C, e5m2 ? 1024.0f : 0.37f, e5m2);
        std::vector<uint8_t> b1(R * C, 0xaa), b2(R * C, 0xaa);
        mc_cuda_fp8_bytes(&cu, b1.data(), q.data(), R, C, 0, e5m2);
        mc_cuda_fp8_bytes(&cu, b2.data(), q.data(), R, C, 1, e5m2);
        size_t bad = 0, badt = 0, nan = 0, sub = 0;
        for (size_t i = 0; i < R * C; i++) {
            unsigned v = b1[i], mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
            unsigned e = (v & 0x7f) >> mb, m = v & ((1u << mb) - 1);
            double d = e == 0 ? std::ldexp((double)m, 1 - (int)bias - (int)mb)
                              : std::ldexp(1.0 + (double)m / (1 << mb), (int)e - (int)bias);
            if ((v & 0x7f) == 0x7f) d = NAN;
            if (v & 0x80) d = -d;
            nan += std::isnan(q[i]);
            sub += e == 0 && m != 0;
            if (std::isnan(q[i]) ? !std::isnan(d) : (float)d != q[i] || std::signbit(d) != std::signbit(q[i])) bad++;
            size_t r = i / C, c = i % C;
            badt += b2[c * R + r] != b1[i];
        }
        char w[120];
        snprintf(w, sizeof w, "fp8 bytes %s: %zu values decode to themselves (%zu NaN, %zu subnormal)",
                 e5m2 ? "E5M2" : "E4M3", R * C, nan, sub);
        report(!bad && nan && sub, w);
        snprintf(w, sizeof w, "fp8 bytes %s transposed (37 x 70, tiles of 32): the same bytes",
                 e5m2 ? "E5M2" : "E4M3");
        report(!badt, w);
    }
    printf("1..%d\n# %d of %d checks failed\n", checks, fails, checks);
    mc_backend_free(cpu);
    return fails ? 1 : 0;
}
