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
 * Build and run: tests/cuda/flash_emu.sh (a C++20 compiler; no CUDA).
 * Exit 0 when every comparison is within its bound.
 */
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

/* ------------------------------------------------ the CUDA built-ins */
#define MC_FLASH_EMULATE 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__
#define __align__(x)
struct mc_cuda {
    int unused;
};
struct uint3e {
    int x, y, z;
};
static thread_local uint3e threadIdx;
static uint3e blockIdx;
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
using std::min;
using std::max;

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y; /* x in the low half */
};
static inline uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float bf16_f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{bf16_rne(f)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

/* One block at a time: NT threads, 4 warps. */
static std::barrier<> *block_bar;
static std::barrier<> *warp_bar[4];
struct warp_slots {
    float f[32];
    uint32_t a[32][4], b[32][2];
};
static warp_slots slots[4];

static void __syncthreads() { block_bar->arrive_and_wait(); }

static float __shfl_xor_sync(unsigned mask, float v, int o)
{
    (void)mask;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    slots[w].f[lane] = v;
    warp_bar[w]->arrive_and_wait();
    const float r = slots[w].f[lane ^ o];
    warp_bar[w]->arrive_and_wait();
    return r;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, from the PTX ISA's
 * tables: lane = 4 g + c holds
 *   A: reg 0 = (row g, cols 2c, 2c+1), reg 1 = row g+8, reg 2 = row g cols
 *      2c+8, 2c+9, reg 3 = row g+8 cols 2c+8, 2c+9 (low half first);
 *   B: reg 0 = (k 2c, 2c+1; col g), reg 1 = (k 2c+8, 2c+9; col g);
 *   C: c0, c1 = row g cols 2c, 2c+1; c2, c3 = row g+8. */
static float A_at(const warp_slots &s, int r, int k)
{
    const int lane = 4 * (r % 8) + (k % 8) / 2, reg = (r / 8) + 2 * (k / 8);
    const uint32_t v = s.a[lane][reg];
    return bf16_f((uint16_t)(k % 2 ? v >> 16 : v & 0xffffu));
}
static float B_at(const warp_slots &s, int k, int n)
{
    const int lane = 4 * n + (k % 8) / 2, reg = k / 8;
    const uint32_t v = s.b[lane][reg];
    return bf16_f((uint16_t)(k % 2 ? v >> 16 : v & 0xffffu));
}
static void mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                uint32_t b1)
{
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, cc = lane % 4;
    warp_slots &s = slots[w];
    s.a[lane][0] = a0;
    s.a[lane][1] = a1;
    s.a[lane][2] = a2;
    s.a[lane][3] = a3;
    s.b[lane][0] = b0;
    s.b[lane][1] = b1;
    warp_bar[w]->arrive_and_wait();
    for (int e = 0; e < 4; e++) {
        const int r = g + (e >= 2 ? 8 : 0), n = 2 * cc + (e & 1);
        double acc = 0;
        for (int k = 0; k < 16; k++) acc += (double)A_at(s, r, k) * B_at(s, k, n);
        c[e] = (float)((double)c[e] + acc);
    }
    warp_bar[w]->arrive_and_wait();
}

/* the launches: flash.cu's launch_fwd / launch_bwd, one block at a time */
template <int D, class Args> void launch_fwd(mc_cuda *cu, const Args &A);
template <int D, class Args> void launch_bwd(mc_cuda *cu, const Args &A);

/* the blocks' shared memory (flash.cu declares it in its anonymous namespace) */
namespace {
unsigned char smraw[1 << 20];
}

#include "kern/cuda/flash.cu"

static void run_grid(int gx, int gy, int gz, const std::function<void()> &kernel)
{
    for (int z = 0; z < gz; z++)
        for (int y = 0; y < gy; y++)
            for (int x = 0; x < gx; x++) {
                blockIdx = uint3e{x, y, z};
                memset(smraw, 0xff, sizeof smraw); /* poisoned: NaN bf16 and float */
                std::barrier<> bb(NT);
                std::barrier<> w0(32), w1(32), w2(32), w3(32);
                block_bar = &bb;
                warp_bar[0] = &w0;
                warp_bar[1] = &w1;
                warp_bar[2] = &w2;
                warp_bar[3] = &w3;
                std::vector<std::thread> th;
                for (int t = 0; t < NT; t++)
                    th.emplace_back([t, &kernel] {
                        threadIdx = uint3e{t, 0, 0};
                        kernel();
                    });
                for (auto &t : th) t.join();
            }
}

template <int D, class Args> void launch_fwd(mc_cuda *, const Args &A)
{
    run_grid((A.T + FQ - 1) / FQ, A.Q, A.B, [&A] { k_flash_fwd<D>(A); });
}

template <int D, class Args> void launch_bwd(mc_cuda *, const Args &A)
{
    if (A.dq) run_grid((A.T + DQ - 1) / DQ, A.Q, A.B, [&A] { k_flash_bwd_dq<D>(A); });
    if (A.dk || A.dv) run_grid((A.T + KK - 1) / KK, A.G, A.B, [&A] { k_flash_bwd_dkv<D>(A); });
}

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
