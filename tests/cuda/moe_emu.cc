/*
 * moe_emu.cc - runs lib/kern/cuda/moe.cu's mixture-of-experts kernels on the
 * CPU (tests/cuda/emu.h: CUDA threads as host threads, the launches' grids
 * block by block) and compares each with the CPU backend's kernel (libmc,
 * kern/cpu/moe.c) on the same random inputs: routing (softmax, pre-softmax,
 * sigmoid with expert bias and scaling, group-limited) and its backward,
 * the load-balancing loss (aux and per-sequence, softmax and sigmoid) and
 * the z-loss with their gradients, the permutation map over several chunks
 * with dropped choices, expert capacity by position and by probability (ties),
 * (chunks of 64 choices here, 2048 on a GPU), unpadded
 * and padded, the permutations both ways and
 * the expert-bias update. Choices, counts and permutations must be equal;
 * floats within 1e-6 relative (rms), losses 1e-12.
 *
 * What this checks: the kernels' logic, indexing, scratch layout and launch
 * shapes. What it cannot: the GPU's own exp/log (the emulation uses the C
 * library's, as the CPU backend does) and the grouped GEMM (cuBLASLt);
 * tests/cuda/check_kern compares those on a GPU.
 *
 * Build and run: tests/cuda/moe_emu.sh BUILD-DIR (links BUILD-DIR's libmc).
 */
#include "emu.h"

#include "mc/kern.h"



#define MC_MOE_CHUNK 64
#include "kern/cuda/moe.cu"

static uint64_t rng = 0x243f6a8885a308d3ull;
static double urand()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static std::vector<float> rnd(size_t n, double scale)
{
    std::vector<float> v(n);
    for (auto &x : v) x = (float)((urand() * 2 - 1) * scale);
    return v;
}

static int fails = 0, checks = 0;
static void report(bool ok, const char *what, const char *detail)
{
    checks++;
    if (!ok) fails++;
    printf("%s %d - %s%s%s\n", ok ? "ok" : "not ok", checks, what, detail[0] ? ": " : "", detail);
}
static void cmpf(const char *what, const std::vector<float> &got, const std::vector<float> &want,
                 double tol)
{
    double num = 0, den = 0;
    bool bad = false;
    for (size_t i = 0; i < want.size(); i++) {
        if (!std::isfinite(got[i]) && !(std::isnan(got[i]) && std::isnan(want[i]))) bad = true;
        if (!std::isfinite(want[i])) continue;
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    double e = bad ? INFINITY : std::sqrt(num / (den > 0 ? den : 1));
    char d[96];
    snprintf(d, sizeof d, "relative error %.2e (bound %.0e)", e, tol);
    report(e <= tol, what, d);
}
template <class T> static void cmpx(const char *what, const std::vector<T> &got, const std::vector<T> &want)
{
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); i++) bad += got[i] != want[i];
    char d[64];
    snprintf(d, sizeof d, "%zu of %zu differ", bad, want.size());
    report(bad == 0, what, d);
}

static mc_backend *cpu;
static mc_cuda cu;

static void check_route(const char *name, size_t N, size_t E, mc_moe_route r, bool bias)
{
    char w[128];
    const size_t K = (size_t)r.topk;
    auto logits = rnd(N * E, 2.0), eb = rnd(E, 0.3);
    /* ties: some tokens repeat a logit */
    for (size_t t = 0; t < N; t += 5) logits[t * E + E - 1] = logits[t * E];
    std::vector<float> p1(N * K, NAN), p2(N * K, NAN);
    std::vector<int32_t> i1(N * K, -7), i2(N * K, -7);
    mc_k_moe_route_fwd(cpu, p1.data(), i1.data(), logits.data(), bias ? eb.data() : nullptr, N, E, &r);
    mc_cuda_moe_route_fwd(&cu, p2.data(), i2.data(), logits.data(), bias ? eb.data() : nullptr, N, E, &r);
    snprintf(w, sizeof w, "route_fwd %s idx", name);
    cmpx(w, i2, i1);
    snprintf(w, sizeof w, "route_fwd %s probs", name);
    cmpf(w, p2, p1, 1e-6);
    auto dp = rnd(N * K, 1.0), base = rnd(N * E, 0.5);
    std::vector<float> d1 = base, d2 = base;
    mc_k_moe_route_bwd(cpu, d1.data(), dp.data(), logits.data(), i1.data(), N, E, &r);
    mc_cuda_moe_route_bwd(&cu, d2.data(), dp.data(), logits.data(), i1.data(), N, E, &r);
    snprintf(w, sizeof w, "route_bwd %s dlogits (added)", name);
    cmpf(w, d2, d1, 1e-6);
}

static void check_losses(size_t G, size_t T, size_t E, size_t K, int sig)
{
    char w[128];
    const size_t N = G * T;
    auto logits = rnd(N * E, 2.0), base = rnd(N * E, 0.5);
    std::vector<float> d1 = base, d2 = base;
    double a1 = mc_k_moe_aux_loss(cpu, d1.data(), logits.data(), G, T, E, K, sig, 0.37f);
    double a2 = mc_cuda_moe_aux_loss(&cu, d2.data(), logits.data(), G, T, E, K, sig, 0.37f);
    char d[96];
    snprintf(d, sizeof d, "cpu %.17g gpu %.17g", a1, a2);
    snprintf(w, sizeof w, "aux_loss G=%zu T=%zu E=%zu K=%zu %s", G, T, E, K, sig ? "sigmoid" : "softmax");
    report(std::fabs(a1 - a2) <= 1e-12 * std::fabs(a1), w, d);
    snprintf(w, sizeof w, "aux_loss G=%zu T=%zu E=%zu K=%zu %s dlogits", G, T, E, K,
             sig ? "sigmoid" : "softmax");
    cmpf(w, d2, d1, 1e-6);
    double n1 = mc_k_moe_aux_loss(cpu, nullptr, logits.data(), G, T, E, K, sig, 0.0f);
    double n2 = mc_cuda_moe_aux_loss(&cu, nullptr, logits.data(), G, T, E, K, sig, 0.0f);
    snprintf(w, sizeof w, "aux_loss G=%zu T=%zu without dlogits", G, T);
    report(n1 == a1 && n2 == a2, w, "");
    d1 = base, d2 = base;
    double z1 = mc_k_moe_z_loss(cpu, d1.data(), logits.data(), N, E, 0.21f);
    double z2 = mc_cuda_moe_z_loss(&cu, d2.data(), logits.data(), N, E, 0.21f);
    snprintf(d, sizeof d, "cpu %.17g gpu %.17g", z1, z2);
    snprintf(w, sizeof w, "z_loss N=%zu E=%zu", N, E);
    report(std::fabs(z1 - z2) <= 1e-12 * std::fabs(z1), w, d);
    snprintf(w, sizeof w, "z_loss N=%zu E=%zu dlogits", N, E);
    cmpf(w, d2, d1, 1e-6);
}

static void check_permutations(size_t N, size_t E, size_t K, size_t block)
{
    char w[128];
    std::vector<int32_t> idx(N * K);
    for (size_t t = 0; t < N; t++)
        for (size_t k = 0; k < K; k++) /* distinct experts per token, some dropped */
            idx[t * K + k] = urand() < 0.1 ? -1 : (int32_t)((t * 7 + k * (E / K + 1) + (size_t)(urand() * 2)) % E);
    if (block) { /* padded: at most block rows an expert */
        std::vector<size_t> n(E, 0);
        for (auto &e : idx)
            if (e >= 0 && ++n[e] > block) e = -1;
    }
    std::vector<int32_t> pm1(N * K, -9), pm2(N * K, -9), c1(E, -9), c2(E, -9);
    mc_k_moe_permute_map(cpu, pm1.data(), c1.data(), idx.data(), N, E, K, block);
    mc_cuda_moe_permute_map(&cu, pm2.data(), c2.data(), idx.data(), N, E, K, block);
    snprintf(w, sizeof w, "permute_map N=%zu E=%zu K=%zu block=%zu perm", N, E, K, block);
    cmpx(w, pm2, pm1);
    snprintf(w, sizeof w, "permute_map N=%zu E=%zu K=%zu block=%zu counts", N, E, K, block);
    cmpx(w, c2, c1);
    const size_t C = 37;
    size_t R = block ? E * block : 0;
    if (!block)
        for (auto c : c1) R += (size_t)c;
    auto x = rnd(N * C, 1.0);
    std::vector<float> xp1(R * C, 0.5f), xp2(R * C, 0.5f);
    mc_k_moe_permute(cpu, xp1.data(), x.data(), pm1.data(), N, K, C);
    mc_cuda_moe_permute(&cu, xp2.data(), x.data(), pm1.data(), N, K, C);
    snprintf(w, sizeof w, "permute N=%zu K=%zu", N, K);
    cmpx(w, xp2, xp1);
    auto dxp = rnd(R * C, 1.0), dx0 = rnd(N * C, 1.0);
    std::vector<float> dx1 = dx0, dx2 = dx0;
    mc_k_moe_permute_bwd(cpu, dx1.data(), dxp.data(), pm1.data(), N, K, C);
    mc_cuda_moe_permute_bwd(&cu, dx2.data(), dxp.data(), pm1.data(), N, K, C);
    snprintf(w, sizeof w, "permute_bwd N=%zu K=%zu (added)", N, K);
    cmpf(w, dx2, dx1, 1e-6);
    auto probs = rnd(N * K, 1.0), yp = rnd(R * C, 1.0), dy = rnd(N * C, 1.0);
    std::vector<float> y1(N * C, NAN), y2(N * C, NAN);
    mc_k_moe_unpermute(cpu, y1.data(), yp.data(), probs.data(), pm1.data(), N, K, C);
    mc_cuda_moe_unpermute(&cu, y2.data(), yp.data(), probs.data(), pm1.data(), N, K, C);
    snprintf(w, sizeof w, "unpermute N=%zu K=%zu", N, K);
    cmpf(w, y2, y1, 1e-6);
    std::vector<float> dyp1(R * C, 0.25f), dyp2(R * C, 0.25f), dpr1(N * K, NAN), dpr2(N * K, NAN);
    mc_k_moe_unpermute_bwd(cpu, dyp1.data(), dpr1.data(), dy.data(), yp.data(), probs.data(), pm1.data(), N, K, C);
    mc_cuda_moe_unpermute_bwd(&cu, dyp2.data(), dpr2.data(), dy.data(), yp.data(), probs.data(), pm1.data(), N, K, C);
    snprintf(w, sizeof w, "unpermute_bwd N=%zu K=%zu dyp", N, K);
    cmpf(w, dyp2, dyp1, 1e-6);
    snprintf(w, sizeof w, "unpermute_bwd N=%zu K=%zu dprobs", N, K);
    cmpf(w, dpr2, dpr1, 1e-6);
}

static void check_capacity(size_t N, size_t E, size_t K, size_t cap, bool flat = false)
{
    std::vector<int32_t> idx(N * K);
    for (size_t t = 0; t < N; t++)
        for (size_t k = 0; k < K; k++) /* skewed: the low experts over capacity */
            idx[t * K + k] = urand() < 0.05 ? -1 : (int32_t)((k + (size_t)(urand() * urand() * (double)E)) % E);
    auto probs = rnd(N * K, 1.0);
    for (size_t i = 0; i + 7 < N * K; i += 7) probs[i + 3] = probs[i]; /* ties */
    if (flat) /* every probability tied: the order decides */
        for (auto &p : probs) p = 0.5f;
    for (int pos = 0; pos < 2; pos++) {
        std::vector<int32_t> k1(N * K, -9), k2(N * K, -9);
        mc_k_moe_capacity_drop(cpu, k1.data(), idx.data(), probs.data(), N, E, K, cap, pos);
        mc_cuda_moe_capacity_drop(&cu, k2.data(), idx.data(), probs.data(), N, E, K, cap, pos);
        size_t dropped = 0;
        for (size_t i = 0; i < N * K; i++) dropped += idx[i] >= 0 && k1[i] < 0;
        char w[128];
        snprintf(w, sizeof w, "capacity_drop N=%zu E=%zu K=%zu capacity %zu %s%s (%zu dropped)", N, E,
                 K, cap, pos ? "position" : "probs", flat ? " all tied" : "", dropped);
        cmpx(w, k2, k1);
    }
}

static void check_bias(size_t E)
{
    auto tokens = rnd(E, 100.0), b0 = rnd(E, 1.0);
    for (auto &t : tokens) t = std::fabs(t);
    tokens[E / 2] = 0;
    std::vector<float> b1 = b0, b2 = b0;
    mc_k_moe_expert_bias_update(cpu, b1.data(), tokens.data(), E, 1e-3f);
    mc_cuda_moe_expert_bias_update(&cu, b2.data(), tokens.data(), E, 1e-3f);
    char w[64];
    snprintf(w, sizeof w, "expert_bias_update E=%zu", E);
    cmpx(w, b2, b1);
}

int main()
{
    mc_error err;
    if (mc_backend_cpu_new(1, &cpu, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    mc_moe_route soft = {2, 0, 0, 0.0f, 0, 0}, pre = {2, 0, 1, 0.0f, 0, 0};
    mc_moe_route sig = {4, 1, 0, 2.5f, 0, 0}, grp = {4, 1, 0, 1.0f, 4, 2};
    mc_moe_route fine = {8, 0, 0, 0.0f, 0, 0}, one = {1, 1, 0, 0.0f, 0, 0};
    check_route("softmax top-2 E=8", 37, 8, soft, false);
    check_route("pre-softmax top-2 E=8", 37, 8, pre, false);
    check_route("sigmoid top-4 E=16 bias scaling 2.5", 37, 16, sig, true);
    check_route("sigmoid top-4 E=16 4 groups top-2 bias", 37, 16, grp, true);
    check_route("softmax top-8 E=64", 41, 64, fine, false);
    check_route("sigmoid top-1 E=8", 9, 8, one, false);
    check_route("softmax top-2 E=1024 (one token a block)", 3, 1024, soft, false);
    check_losses(1, 37, 8, 2, 0);
    check_losses(3, 13, 16, 4, 1);
    check_losses(2, 9, 64, 8, 0);
    check_permutations(150, 8, 3, 0);     /* 450 choices: 8 chunks of 64 */
    check_permutations(40, 64, 8, 0);     /* fine-grained: 5 chunks */
    check_permutations(90, 8, 2, 20);     /* padded to 20 rows an expert */
    check_permutations(1, 4, 1, 0);
    check_capacity(120, 8, 2, 24);       /* 2 chunks of 64 */
    check_capacity(50, 16, 4, 9);
    check_capacity(60, 4, 2, 10, true);
    check_bias(8);
    check_bias(64);
    printf("1..%d\n# %d of %d checks failed\n", checks, fails, checks);
    mc_backend_free(cpu);
    return fails ? 1 : 0;
}
