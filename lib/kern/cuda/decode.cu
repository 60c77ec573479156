/*
 * decode.cu - inference attention on the GPU (kern_ops.def attention_kv_fwd):
 * n new query rows at positions pos0 .. pos0+n-1 against the key/value cache
 * kc, vc [L, G, D], row i seeing keys seg[i] (or 0) .. pos0+i. fp32, as the
 * CPU backend's. One block per (row, head), four warps: warp w takes the key
 * tiles of 32 starting at seg + 32 w, 128 apart (a lane a key: its score,
 * then the tile's probabilities broadcast lane by lane against the values,
 * each lane holding D/32 <= 4 output elements), with an online softmax; the
 * four partial results are merged by warp 0 in warp order, so the bits are
 * fixed. Head dimension D <= 128.
 *
 * tests/cuda/decode_emu.cc runs it on the CPU (tests/cuda/emu.h) against the
 * CPU backend; tests/cuda/check_kern and run.sh (mc-eval GPU vs CPU) on a GPU.
 */
#ifndef MC_CUDA_EMULATE
#include <math.h>
#include <stdint.h>
#include "kern/cuda/internal.cuh"
#else
#include "kern/cuda/warp.cuh"
#endif

namespace {

constexpr unsigned KT = 128; /* threads: 4 warps */
constexpr unsigned KW = KT / 32;
constexpr unsigned KMAXD = 128, KDPL = KMAXD / 32;

__global__ void k_kv_fwd(float *out, const float *q, const float *kc, const float *vc, size_t pos0,
                         unsigned Q, unsigned G, unsigned D, float scale, const int32_t *seg)
{
    __shared__ float qs[KMAXD], wm[KW], wl[KW], wo[KW][KMAXD];
    const size_t i = blockIdx.x;
    const unsigned h = blockIdx.y, g = h / (Q / G);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *qr = q + (i * Q + h) * D;
    for (unsigned d = threadIdx.x; d < D; d += KT) qs[d] = qr[d];
    __syncthreads();
    const size_t t = pos0 + i, k0 = seg ? (size_t)seg[i] : 0;
    float m = -INFINITY, l = 0.0f, o[KDPL];
    for (unsigned k = 0; k < KDPL; k++) o[k] = 0.0f;
    for (size_t j0 = k0 + 32 * warp; j0 <= t; j0 += KT) { /* warp-uniform */
        const size_t key = j0 + lane;
        const bool valid = key <= t;
        float s = -INFINITY;
        if (valid) {
            const float *kr = kc + (key * G + g) * D;
            float acc = 0.0f;
            for (unsigned d = 0; d < D; d++) acc += qs[d] * kr[d];
            s = acc * scale;
        }
        const float mn = fmaxf(m, mc_warp_max(s)); /* finite: lane 0's key is valid */
        const float p = valid ? expf(s - mn) : 0.0f;
        const float corr = expf(m - mn);
        l = l * corr + mc_warp_sum(p);
        m = mn;
        for (unsigned k = 0; k < KDPL; k++) o[k] *= corr;
        const unsigned cnt = t - j0 + 1 < 32 ? (unsigned)(t - j0 + 1) : 32u;
        for (unsigned jj = 0; jj < cnt; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, (int)jj);
            const float *vr = vc + ((j0 + jj) * G + g) * D;
            for (unsigned k = 0; k < KDPL; k++) {
                const unsigned d = lane + 32 * k;
                if (d < D) o[k] += pj * vr[d];
            }
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    for (unsigned k = 0; k < KDPL; k++) {
        const unsigned d = lane + 32 * k;
        if (d < D) wo[warp][d] = o[k];
    }
    __syncthreads();
    if (warp) return;
    float M = -INFINITY, L = 0.0f;
    for (unsigned w = 0; w < KW; w++) M = fmaxf(M, wm[w]);
    for (unsigned w = 0; w < KW; w++)
        if (wm[w] > -INFINITY) L += wl[w] * expf(wm[w] - M);
    for (unsigned d = lane; d < D; d += 32) {
        float acc = 0.0f;
        for (unsigned w = 0; w < KW; w++)
            if (wm[w] > -INFINITY) acc += wo[w][d] * expf(wm[w] - M);
        out[(i * Q + h) * D + d] = acc / L;
    }
}

} // namespace

extern "C" void mc_cuda_attention_kv_fwd(mc_cuda *cu, float *out, const float *q, const float *kc,
                                         const float *vc, size_t n, size_t pos0, size_t Q, size_t G,
                                         size_t D, float scale, const int32_t *seg)
{
    if (!n) return;
    if (!G || Q % G || D == 0 || D > KMAXD || Q > 65535 || n > 0x7fffffffu) {
        fprintf(stderr, "mc: kern/cuda: attention_kv_fwd: unsupported shape (Q %zu, G %zu, D %zu)\n",
                Q, G, D);
        abort();
    }
    dim3 grid((unsigned)n, (unsigned)Q);
    MC_LAUNCH(k_kv_fwd, grid, KT, (size_t)0, out, q, kc, vc, pos0, (unsigned)Q, (unsigned)G,
              (unsigned)D, scale, seg);
}
