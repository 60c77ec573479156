/*
 * flash_emu.cc - runs lib/kern/cuda/flash.cu's tensor-core attention kernels
 * on the CPU, without a GPU: every CUDA thread of a block is a host thread,
 * __syncthreads and the warp's shuffles are barriers, and mma.sync
 * m16n8k16 is emulated from the PTX ISA's fragment tables (written here
 * independently of the kernels: the A/B/C element each lane's register
 * holds). The kernels' outputs are compared with a float64 attention on the
 * same bf16-rounded inputs: forward out, lse; backward dq, dk, dv; causal and
 * packed documents (segment starts), grouped queries, lengths that are not
 * multiples of the tiles, head dimensions 16, 64 and 128.
 *
 * What this checks: the fragment bookkeeping, the masks, the online softmax,
 * the tile loops and the indexing. What it cannot: the hardware itself
 * (timing, shared-memory banks, the real mma); tests/cuda/run.sh checks the
 * kernels on a GPU.
 *
 * Build and run: tests/cuda/emu.sh flash (a C++20 compiler; no CUDA).
 * Exit 0 when every comparison is within its bound.
 */
#include "emu.h"

#include "kern/cuda/flash.cu"

/* ------------------------------------------------ the reference */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float r16(float f) { return bf16_f(bf16_rne(f)); }

static int fails = 0, checks = 0;
static void cmp(const char *what, const char *name, const std::vector<float> &got,
                const std::vector<double> &want, double tol)
{
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); i++) {
        if (!std::isfinite(got[i])) {
            bad++;
            continue;
        }
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    const double e = bad ? INFINITY : std::sqrt(num / (den > 0 ? den : 1));
    checks++;
    const bool ok = e <= tol;
    if (!ok) fails++;
    printf("%s %d - %s %s: relative error %.2e (bound %.0e)%s\n", ok ? "ok" : "not ok", checks,
           what, name, e, tol, bad ? " NON-FINITE" : "");
}

/* float64 attention on the bf16 values: the kernels' inputs */
static void check(int B, int T, int Q, int G, int D, bool packed)
{
    char what[96];
    snprintf(what, sizeof what, "B=%d T=%d Q=%d G=%d D=%d%s", B, T, Q, G, D,
             packed ? " packed" : "");
    const size_t nq = (size_t)B * T * Q * D, nk = (size_t)B * T * G * D;
    std::vector<float> q(nq), k(nk), v(nk), dout(nq);
    for (auto &x : q) x = urand() * 2;
    for (auto &x : k) x = urand() * 2;
    for (auto &x : v) x = urand();
    for (auto &x : dout) x = urand();
    std::vector<int32_t> seg((size_t)B * T, 0);
    if (packed) /* documents of 1..T/3+1 tokens */
        for (int b = 0; b < B; b++)
            for (int t = 0, s = 0, left = 0; t < T; t++) {
                if (left == 0) {
                    s = t;
                    left = 1 + (int)((urand() + 1) * 0.5f * (T / 3));
                }
                seg[(size_t)b * T + t] = s;
                left--;
            }
    const int hpg = Q / G;
    const double scale = 1.0 / std::sqrt((double)D);
    std::vector<double> out(nq, 0), lse((size_t)B * Q * T), dq(nq, 0), dk(nk, 0), dv(nk, 0);
    auto Qi = [&](int b, int t, int h) { return (((size_t)b * T + t) * Q + h) * D; };
    auto Ki = [&](int b, int t, int gg) { return (((size_t)b * T + t) * G + gg) * D; };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Q; h++) {
            const int gg = h / hpg;
            for (int t = 0; t < T; t++) {
                const int s0 = seg[(size_t)b * T + t];
                std::vector<double> p(T, 0);
                double mx = -INFINITY;
                for (int j = s0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++) s += (double)r16(q[Qi(b, t, h) + d]) * r16(k[Ki(b, j, gg) + d]);
                    p[j] = s * scale;
                    mx = std::max(mx, p[j]);
                }
                double l = 0;
                for (int j = s0; j <= t; j++) l += (p[j] = std::exp(p[j] - mx));
                lse[((size_t)b * Q + h) * T + t] = mx + std::log(l);
                for (int j = s0; j <= t; j++) p[j] /= l;
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int j = s0; j <= t; j++) o += p[j] * r16(v[Ki(b, j, gg) + d]);
                    out[Qi(b, t, h) + d] = o;
                }
                /* backward: dP = dout . v, Dr = dout . out, dS = P (dP - Dr) */
                double Dr = 0;
                for (int d = 0; d < D; d++) Dr += (double)dout[Qi(b, t, h) + d] * out[Qi(b, t, h) + d];
                for (int j = s0; j <= t; j++) {
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += (double)r16(dout[Qi(b, t, h) + d]) * r16(v[Ki(b, j, gg) + d]);
                    const double ds = p[j] * (dp - Dr);
                    for (int d = 0; d < D; d++) {
                        dq[Qi(b, t, h) + d] += scale * ds * r16(k[Ki(b, j, gg) + d]);
                        dk[Ki(b, j, gg) + d] += scale * ds * r16(q[Qi(b, t, h) + d]);
                        dv[Ki(b, j, gg) + d] += p[j] * r16(dout[Qi(b, t, h) + d]);
                    }
                }
            }
        }
    /* the kernels: out and lse poisoned; dq, dk, dv start from a base they add to */
    mc_cuda cu{};
    std::vector<float> gout(nq, NAN), glse((size_t)B * Q * T, NAN);
    const int32_t *sg = packed ? seg.data() : nullptr;
    if (!mc_cuda_flash_fwd(&cu, gout.data(), glse.data(), q.data(), k.data(), v.data(), B, T, Q,
                           G, D, (float)scale, sg)) {
        printf("not ok - %s: D=%d not supported\n", what, D);
        fails++;
        return;
    }
    cmp(what, "out", gout, out, 4e-3);
    cmp(what, "lse", glse, lse, 1e-5);
    /* D_r from the kernel's own out, as attention.cu's rowdot gives it */
    std::vector<float> Dr((size_t)B * Q * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Q; h++)
            for (int t = 0; t < T; t++) {
                double a = 0;
                for (int d = 0; d < D; d++) a += (double)dout[Qi(b, t, h) + d] * gout[Qi(b, t, h) + d];
                Dr[((size_t)b * Q + h) * T + t] = (float)a;
            }
    std::vector<float> gdq(nq), gdk(nk), gdv(nk);
    std::vector<double> wdq(nq), wdk(nk), wdv(nk);
    for (size_t i = 0; i < nq; i++) wdq[i] = dq[i] + (gdq[i] = 0.25f * urand());
    for (size_t i = 0; i < nk; i++) wdk[i] = dk[i] + (gdk[i] = 0.25f * urand());
    for (size_t i = 0; i < nk; i++) wdv[i] = dv[i] + (gdv[i] = 0.25f * urand());
    mc_cuda_flash_bwd(&cu, gdq.data(), gdk.data(), gdv.data(), dout.data(), q.data(), k.data(),
                      v.data(), glse.data(), Dr.data(), B, T, Q, G, D, (float)scale, sg);
    cmp(what, "dq", gdq, wdq, 1e-2);
    cmp(what, "dk", gdk, wdk, 1e-2);
    cmp(what, "dv", gdv, wdv, 1e-2);
    /* dk alone (dq and dv NULL) adds the same bytes */
    std::vector<float> again(nk);
    for (size_t i = 0; i < nk; i++) again[i] = (float)(wdk[i] - dk[i]);
    mc_cuda_flash_bwd(&cu, nullptr, again.data(), nullptr, dout.data(), q.data(), k.data(),
                      v.data(), glse.data(), Dr.data(), B, T, Q, G, D, (float)scale, sg);
    checks++;
    const bool same = !memcmp(again.data(), gdk.data(), nk * 4);
    if (!same) fails++;
    printf("%s %d - %s dk alone: the same bytes\n", same ? "ok" : "not ok", checks, what);
}

int main(int argc, char **argv)
{
    (void)argv;
    const bool quick = argc > 1; /* any argument: the small shapes only */
    for (int packed = 0; packed < 2; packed++) {
        check(1, 1, 1, 1, 16, packed);
        check(2, 37, 4, 2, 16, packed);
        check(1, 130, 2, 1, 64, packed);
        if (!quick) check(1, 70, 2, 2, 128, packed);
    }
    printf("1..%d\n# %d of %d checks failed\n", checks, fails, checks);
    return fails ? 1 : 0;
}
