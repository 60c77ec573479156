/*
 * decode_emu.cc - runs lib/kern/cuda/decode.cu's inference attention
 * (attention_kv_fwd) on the CPU (tests/cuda/emu.h) and compares it with the
 * CPU backend's (libmc) on random queries and caches: one new row and
 * chunks of rows, at the start and deep into the cache, grouped queries,
 * packed documents (segment starts), head dimensions 8 to 128; fp32 on
 * both sides, so within 1e-5 relative (rms).
 *
 * Build and run: tests/cuda/emu.sh decode WORKDIR BUILD-DIR.
 */
#include "emu.h"

#include "mc/kern.h"

#include "kern/cuda/decode.cu"

static uint64_t rng = 0x452821e638d01377ull;
static float urand()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static int fails = 0, checks = 0;
static mc_backend *cpu;
static mc_cuda cu;

static void check(size_t n, size_t pos0, size_t Q, size_t G, size_t D, bool packed)
{
    const size_t L = pos0 + n + 5; /* the cache's capacity, a few positions unused */
    std::vector<float> q(n * Q * D), kc(L * G * D), vc(L * G * D);
    for (auto &x : q) x = urand() * 2;
    for (auto &x : kc) x = urand() * 2;
    for (auto &x : vc) x = urand();
    for (size_t i = (pos0 + n) * G * D; i < L * G * D; i++) kc[i] = vc[i] = NAN; /* never read */
    std::vector<int32_t> seg(n);
    for (size_t i = 0, s = 0; i < n; i++) { /* non-decreasing starts at or before each row */
        size_t p = pos0 + i;
        if (urand() > 0.6f) s = p - (size_t)((urand() + 1) * 0.5f * (float)(p - s));
        seg[i] = (int32_t)s;
    }
    const float scale = 1.0f / std::sqrt((float)D);
    std::vector<float> o1(n * Q * D, NAN), o2(n * Q * D, NAN);
    const int32_t *sg = packed ? seg.data() : nullptr;
    mc_k_attention_kv_fwd(cpu, o1.data(), q.data(), kc.data(), vc.data(), n, pos0, Q, G, D, scale, sg);
    mc_cuda_attention_kv_fwd(&cu, o2.data(), q.data(), kc.data(), vc.data(), n, pos0, Q, G, D, scale, sg);
    double num = 0, den = 0;
    bool bad = false;
    for (size_t i = 0; i < o1.size(); i++) {
        if (!std::isfinite(o2[i]) || !std::isfinite(o1[i])) bad = true;
        num += ((double)o2[i] - o1[i]) * ((double)o2[i] - o1[i]);
        den += (double)o1[i] * o1[i];
    }
    double e = bad ? INFINITY : std::sqrt(num / den);
    checks++;
    const bool ok = e <= 1e-5;
    if (!ok) fails++;
    printf("%s %d - attention_kv_fwd n=%zu pos0=%zu Q=%zu G=%zu D=%zu%s: relative error %.2e (bound 1e-05)\n",
           ok ? "ok" : "not ok", checks, n, pos0, Q, G, D, packed ? " packed" : "", e);
}

int main()
{
    mc_error err;
    if (mc_backend_cpu_new(1, &cpu, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    for (int packed = 0; packed < 2; packed++) {
        check(1, 0, 1, 1, 8, packed);       /* the first token */
        check(1, 300, 4, 2, 64, packed);    /* one decode step deep in the cache */
        check(7, 130, 6, 3, 40, packed);    /* a chunk, D not a multiple of 32 */
        check(33, 0, 2, 1, 128, packed);    /* a prompt from the start */
        check(3, 517, 8, 8, 16, packed);    /* keys over several 128-key rounds */
    }
    printf("1..%d\n# %d of %d checks failed\n", checks, fails, checks);
    mc_backend_free(cpu);
    return fails ? 1 : 0;
}
