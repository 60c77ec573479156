/*
 * fp8_emu.cc - runs lib/kern/cuda/fp8.cu's FP8 emulation kernels on the CPU
 * (tests/cuda/emu.h) and compares each with the CPU backend's (libmc): the
 * quantized values bit for bit on random data at many scales (both formats,
 * saturation, subnormals, NaN), amax (with a NaN), fp8_out and axpy bit for
 * bit (no contraction on either side).
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
    printf("1..%d\n# %d of %d checks failed\n", checks, fails, checks);
    mc_backend_free(cpu);
    return fails ? 1 : 0;
}
