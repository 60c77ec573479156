/*
 * flash.cu - causal grouped-query attention on the tensor cores, for models
 * whose precision is bf16 (mc_backend_set_attention_prec): FlashAttention-2's
 * order with mma.sync m16n8k16 (bf16 operands, fp32 accumulation; sm_80 and
 * later). q, k, v, dout stay fp32 in memory, as kern.h's attention takes
 * them; each tile is rounded to bf16 (round to nearest even) as it is copied
 * to shared memory, the probabilities P and dS are rounded to bf16 for their
 * products, and everything else (scores, the online softmax, l, the
 * accumulators, lse, D_r) is fp32. Same layouts, segment starts and
 * semantics as attention.cu's fp32 kernels, which stay the reference and
 * serve fp32 models and head dimensions these do not (D a multiple of 16, at
 * most 128).
 *
 * Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
 * lane = 4 g + c:
 *   A (16 x 16, rows x k):  a0 = A[g][2c..2c+1]    a1 = A[g+8][2c..2c+1]
 *                           a2 = A[g][2c+8..2c+9]  a3 = A[g+8][2c+8..2c+9]
 *   B (16 x 8, k x cols):   b0 = B[2c..2c+1][g]    b1 = B[2c+8..2c+9][g]
 *   C (16 x 8):             c0,c1 = C[g][2c..2c+1] c2,c3 = C[g+8][2c..2c+1]
 * (pairs packed low element first). Two adjacent C tiles of a 16 x 16 block
 * are exactly the A fragment of that block, so P goes from the QK^T product
 * to the PV product without leaving registers. A B operand whose pairs run
 * along the rows of a tile is read from a transposed copy in shared memory.
 *
 * No atomics: dQ and (dK, dV) are separate kernels that each own their
 * outputs, so the bits do not depend on scheduling.
 */
#ifndef MC_CUDA_EMULATE
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "kern/cuda/internal.cuh"
#endif
/* MC_CUDA_EMULATE: tests/cuda/flash_emu.cc includes this file after
 * tests/cuda/emu.h (the CUDA built-ins, the mma and MC_LAUNCH on the CPU)
 * and runs the kernels thread by thread: a check of the fragment
 * bookkeeping, the masks and the launch shapes that needs no GPU. */

namespace {

typedef __nv_bfloat16 bf16;

constexpr int NT = 128; /* 4 warps */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

struct fl_args {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *lse_in, *Dr;
    int B, T, Q, G, hpg;
    float scale;
    const int32_t *seg; /* [B*T] segment starts, or NULL */
};

__device__ __forceinline__ int seg_at(const fl_args &A, int b, int t)
{
    return A.seg ? A.seg[(size_t)b * A.T + min(t, A.T - 1)] : 0;
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (lo) in the low half */
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t ld2(const bf16 *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

#ifndef MC_CUDA_EMULATE
/* c += a b */
__device__ __forceinline__ void mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

/* the pair x[b, t, hd, d..d+1] of x[B,T,H,D] as bf16, zeros past T */
template <int D>
__device__ __forceinline__ uint32_t gpair(const float *x, int b, int t, int H, int hd, int d, int T)
{
    if (t >= T) return 0u;
    float2 f = *reinterpret_cast<const float2 *>(x + (((size_t)b * T + t) * H + hd) * D + d);
    return pack2(f.x, f.y);
}

/* Rows [t0, t0+n) of head hd of x[B,T,H,D] into shared memory as bf16, in
 * rows (rm[r * ldr + d]) and/or transposed (cm[d * ldc + r]); zeros past T. */
template <int D>
__device__ void tile(bf16 *rm, int ldr, bf16 *cm, int ldc, const float *x, int b, int t0, int n,
                     int H, int hd, int T)
{
    for (int e = threadIdx.x; e < n * (D / 2); e += NT) {
        const int r = e / (D / 2), d = (e % (D / 2)) * 2, t = t0 + r;
        float2 f = make_float2(0.0f, 0.0f);
        if (t < T) f = *reinterpret_cast<const float2 *>(x + (((size_t)b * T + t) * H + hd) * D + d);
        if (rm) *reinterpret_cast<uint32_t *>(rm + r * ldr + d) = pack2(f.x, f.y);
        if (cm) {
            cm[d * ldc + r] = __float2bfloat16_rn(f.x);
            cm[(d + 1) * ldc + r] = __float2bfloat16_rn(f.y);
        }
    }
}

/* ------------------------------------------------------------ forward */

/* Block = (64 query rows, head h, sequence b); warp w owns rows
 * i0 + 16 w .. + 15, this lane rows r0 = .. + g and r1 = r0 + 8. Per key
 * tile of 64: S = Q K^T (scores in log2 units), the online softmax, O += P V. */
constexpr int FQ = 64, FK = 64;

template <int D> constexpr size_t fwd_smem()
{
    return (size_t)(FK * (D + 8) + D * (FK + 8)) * sizeof(bf16);
}

template <int D> __global__ void __launch_bounds__(NT) k_flash_fwd(fl_args A)
{
    MC_DYN_SMEM(smraw);
    constexpr int LDK = D + 8, LDV = FK + 8;
    bf16 *Ks = reinterpret_cast<bf16 *>(smraw), *Vt = Ks + FK * LDK;
    const int T = A.T, h = blockIdx.y, b = blockIdx.z, grp = h / A.hpg;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int i0 = blockIdx.x * FQ, w0 = i0 + warp * 16, r0 = w0 + g, r1 = r0 + 8;
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const int d = ks * 16 + 2 * c;
        qa[ks][0] = gpair<D>(A.q, b, r0, A.Q, h, d, T);
        qa[ks][1] = gpair<D>(A.q, b, r1, A.Q, h, d, T);
        qa[ks][2] = gpair<D>(A.q, b, r0, A.Q, h, d + 8, T);
        qa[ks][3] = gpair<D>(A.q, b, r1, A.Q, h, d + 8, T);
    }
    const int sg0 = seg_at(A, b, r0), sg1 = seg_at(A, b, r1), sgw = seg_at(A, b, w0);
    const float sl2 = A.scale * LOG2E;
    float o[D / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const int jend = min(i0 + FQ, T);
    for (int j0 = seg_at(A, b, i0) / FK * FK; j0 < jend; j0 += FK) {
        __syncthreads(); /* the previous tile is consumed */
        tile<D>(Ks, LDK, NULL, 0, A.k, b, j0, FK, A.G, grp, T);
        tile<D>(NULL, 0, Vt, LDV, A.v, b, j0, FK, A.G, grp, T);
        __syncthreads();
        /* warp-uniform: no row of the warp sees a key of this tile */
        if (w0 >= T || sgw >= j0 + FK) continue;
        float s[FK / 8][4];
#pragma unroll
        for (int n = 0; n < FK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const bf16 *kr = Ks + (n * 8 + g) * LDK + 2 * c;
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++)
                mma(s[n], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], ld2(kr + ks * 16),
                    ld2(kr + ks * 16 + 8));
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < FK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j0 + n * 8 + 2 * c + (e & 1), row = e < 2 ? r0 : r1;
                const bool ok = row < T && key <= row && key >= (e < 2 ? sg0 : sg1);
                s[n][e] = ok ? s[n][e] * sl2 : -INFINITY;
                if (e < 2)
                    mx0 = fmaxf(mx0, s[n][e]);
                else
                    mx1 = fmaxf(mx1, s[n][e]);
            }
        /* the 4 lanes of a quad share a row */
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float cr0 = exp2f(m0 - b0), cr1 = exp2f(m1 - b1);
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int n = 0; n < FK / 8; n++) {
            s[n][0] = exp2f(s[n][0] - b0);
            s[n][1] = exp2f(s[n][1] - b0);
            s[n][2] = exp2f(s[n][2] - b1);
            s[n][3] = exp2f(s[n][3] - b1);
            ps0 += s[n][0] + s[n][1];
            ps1 += s[n][2] + s[n][3];
        }
        l0 = l0 * cr0 + ps0; /* this lane's part; the quad's sum at the end */
        l1 = l1 * cr1 + ps1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= cr0;
            o[n][1] *= cr0;
            o[n][2] *= cr1;
            o[n][3] *= cr1;
        }
#pragma unroll
        for (int kk = 0; kk < FK / 16; kk++) {
            const uint32_t a0 = pack2(s[2 * kk][0], s[2 * kk][1]);
            const uint32_t a1 = pack2(s[2 * kk][2], s[2 * kk][3]);
            const uint32_t a2 = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const uint32_t a3 = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const bf16 *vr = Vt + (n * 8 + g) * LDV + kk * 16 + 2 * c;
                mma(o[n], a0, a1, a2, a3, ld2(vr), ld2(vr + 8));
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (r0 < T) {
        const float inv = 1.0f / l0;
        float *dst = A.out + (((size_t)b * T + r0) * A.Q + h) * D + 2 * c;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(dst + n * 8) = make_float2(o[n][0] * inv, o[n][1] * inv);
        if (c == 0) A.lse[((size_t)b * A.Q + h) * T + r0] = (m0 + log2f(l0)) * LN2;
    }
    if (r1 < T) {
        const float inv = 1.0f / l1;
        float *dst = A.out + (((size_t)b * T + r1) * A.Q + h) * D + 2 * c;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(dst + n * 8) = make_float2(o[n][2] * inv, o[n][3] * inv);
        if (c == 0) A.lse[((size_t)b * A.Q + h) * T + r1] = (m1 + log2f(l1)) * LN2;
    }
}

/* ------------------------------------------------------------ backward */

/* dQ: block = (64 query rows, head h, sequence b), warps as the forward's;
 * per key tile of 32: S = Q K^T, P = exp(S - lse), dP = dO V^T,
 * dS = P (dP - D_r), dQ += dS K (scaled once at the end). */
constexpr int DQ = 64, DK = 32;

template <int D> constexpr size_t dq_smem()
{
    return (size_t)(2 * DK * (D + 8) + D * (DK + 8)) * sizeof(bf16);
}

template <int D> __global__ void __launch_bounds__(NT) k_flash_bwd_dq(fl_args A)
{
    MC_DYN_SMEM(smraw);
    constexpr int LDK = D + 8, LDT = DK + 8;
    bf16 *Ks = reinterpret_cast<bf16 *>(smraw), *Vs = Ks + DK * LDK, *Kt = Vs + DK * LDK;
    const int T = A.T, h = blockIdx.y, b = blockIdx.z, grp = h / A.hpg;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int i0 = blockIdx.x * DQ, w0 = i0 + warp * 16, r0 = w0 + g, r1 = r0 + 8;
    uint32_t qa[D / 16][4], ga[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const int d = ks * 16 + 2 * c;
        qa[ks][0] = gpair<D>(A.q, b, r0, A.Q, h, d, T);
        qa[ks][1] = gpair<D>(A.q, b, r1, A.Q, h, d, T);
        qa[ks][2] = gpair<D>(A.q, b, r0, A.Q, h, d + 8, T);
        qa[ks][3] = gpair<D>(A.q, b, r1, A.Q, h, d + 8, T);
        ga[ks][0] = gpair<D>(A.dout, b, r0, A.Q, h, d, T);
        ga[ks][1] = gpair<D>(A.dout, b, r1, A.Q, h, d, T);
        ga[ks][2] = gpair<D>(A.dout, b, r0, A.Q, h, d + 8, T);
        ga[ks][3] = gpair<D>(A.dout, b, r1, A.Q, h, d + 8, T);
    }
    const size_t lrow = ((size_t)b * A.Q + h) * T;
    const float L0 = r0 < T ? A.lse_in[lrow + r0] * LOG2E : 0.0f;
    const float L1 = r1 < T ? A.lse_in[lrow + r1] * LOG2E : 0.0f;
    const float D0 = r0 < T ? A.Dr[lrow + r0] : 0.0f, D1 = r1 < T ? A.Dr[lrow + r1] : 0.0f;
    const int sg0 = seg_at(A, b, r0), sg1 = seg_at(A, b, r1), sgw = seg_at(A, b, w0);
    const float sl2 = A.scale * LOG2E;
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const int jend = min(i0 + DQ, T);
    for (int j0 = seg_at(A, b, i0) / DK * DK; j0 < jend; j0 += DK) {
        __syncthreads();
        tile<D>(Ks, LDK, Kt, LDT, A.k, b, j0, DK, A.G, grp, T);
        tile<D>(Vs, LDK, NULL, 0, A.v, b, j0, DK, A.G, grp, T);
        __syncthreads();
        if (w0 >= T || j0 > w0 + 15 || sgw >= j0 + DK) continue; /* warp-uniform */
        float s[DK / 8][4], dp[DK / 8][4];
#pragma unroll
        for (int n = 0; n < DK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
            const bf16 *kr = Ks + (n * 8 + g) * LDK + 2 * c, *vr = Vs + (n * 8 + g) * LDK + 2 * c;
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) {
                mma(s[n], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], ld2(kr + ks * 16),
                    ld2(kr + ks * 16 + 8));
                mma(dp[n], ga[ks][0], ga[ks][1], ga[ks][2], ga[ks][3], ld2(vr + ks * 16),
                    ld2(vr + ks * 16 + 8));
            }
        }
#pragma unroll
        for (int n = 0; n < DK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j0 + n * 8 + 2 * c + (e & 1), row = e < 2 ? r0 : r1;
                const bool ok = row < T && key <= row && key >= (e < 2 ? sg0 : sg1);
                const float p = ok ? exp2f(s[n][e] * sl2 - (e < 2 ? L0 : L1)) : 0.0f;
                s[n][e] = p * (dp[n][e] - (e < 2 ? D0 : D1)); /* dS */
            }
#pragma unroll
        for (int kk = 0; kk < DK / 16; kk++) {
            const uint32_t a0 = pack2(s[2 * kk][0], s[2 * kk][1]);
            const uint32_t a1 = pack2(s[2 * kk][2], s[2 * kk][3]);
            const uint32_t a2 = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const uint32_t a3 = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const bf16 *kt = Kt + (n * 8 + g) * LDT + kk * 16 + 2 * c;
                mma(acc[n], a0, a1, a2, a3, ld2(kt), ld2(kt + 8));
            }
        }
    }
    if (r0 < T) {
        float *dst = A.dq + (((size_t)b * T + r0) * A.Q + h) * D + 2 * c;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            dst[n * 8] += A.scale * acc[n][0];
            dst[n * 8 + 1] += A.scale * acc[n][1];
        }
    }
    if (r1 < T) {
        float *dst = A.dq + (((size_t)b * T + r1) * A.Q + h) * D + 2 * c;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            dst[n * 8] += A.scale * acc[n][2];
            dst[n * 8 + 1] += A.scale * acc[n][3];
        }
    }
}

/* dK, dV: block = (64 keys, group grp, sequence b); warp w owns keys
 * j0 + 16 w .. + 15 (this lane k0 = .. + g, k1 = k0 + 8). For each head of
 * the group and each query tile of 32 at or after the keys (until the rows'
 * segments start after them), in the transposed problem:
 * S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D_r),
 * dV += P^T dO, dK += dS^T Q (scaled once at the end). */
constexpr int KK = 64, KQ = 32;

template <int D> constexpr size_t dkv_smem()
{
    return (size_t)(2 * KK * (D + 8) + 2 * KQ * (D + 8) + 2 * D * (KQ + 8)) * sizeof(bf16) +
           3 * KQ * sizeof(float);
}

template <int D> __global__ void __launch_bounds__(NT) k_flash_bwd_dkv(fl_args A)
{
    MC_DYN_SMEM(smraw);
    constexpr int LD = D + 8, LDT = KQ + 8;
    bf16 *Ks = reinterpret_cast<bf16 *>(smraw), *Vs = Ks + KK * LD, *Qs = Vs + KK * LD;
    bf16 *Gs = Qs + KQ * LD, *Qt = Gs + KQ * LD, *Gt = Qt + D * LDT;
    float *Ls = reinterpret_cast<float *>(Gt + D * LDT), *Ds = Ls + KQ;
    int *Sg = reinterpret_cast<int *>(Ds + KQ);
    const int T = A.T, grp = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int j0 = blockIdx.x * KK, w0 = j0 + warp * 16, k0 = w0 + g, k1 = k0 + 8;
    tile<D>(Ks, LD, NULL, 0, A.k, b, j0, KK, A.G, grp, T);
    tile<D>(Vs, LD, NULL, 0, A.v, b, j0, KK, A.G, grp, T);
    const float sl2 = A.scale * LOG2E;
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    const bf16 *ka = Ks + (warp * 16 + g) * LD + 2 * c, *va = Vs + (warp * 16 + g) * LD + 2 * c;
    for (int hh = 0; hh < A.hpg; hh++) {
        const int h = grp * A.hpg + hh;
        const size_t lrow = ((size_t)b * A.Q + h) * T;
        /* KK is a multiple of KQ: the tiles start at the keys */
        for (int i0 = j0; i0 < T && seg_at(A, b, i0) < j0 + KK; i0 += KQ) {
            __syncthreads(); /* the previous tile is consumed (and K, V are in) */
            tile<D>(Qs, LD, Qt, LDT, A.q, b, i0, KQ, A.Q, h, T);
            tile<D>(Gs, LD, Gt, LDT, A.dout, b, i0, KQ, A.Q, h, T);
            for (int r = threadIdx.x; r < KQ; r += NT) {
                const int t = i0 + r;
                Ls[r] = t < T ? A.lse_in[lrow + t] * LOG2E : 0.0f;
                Ds[r] = t < T ? A.Dr[lrow + t] : 0.0f;
                Sg[r] = seg_at(A, b, t);
            }
            __syncthreads();
            if (w0 >= T || i0 + KQ - 1 < w0) continue; /* warp-uniform: no row sees a key */
            float s[KQ / 8][4], dp[KQ / 8][4];
#pragma unroll
            for (int n = 0; n < KQ / 8; n++) {
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
                const bf16 *qr = Qs + (n * 8 + g) * LD + 2 * c, *gr = Gs + (n * 8 + g) * LD + 2 * c;
#pragma unroll
                for (int ks = 0; ks < D / 16; ks++) {
                    const int o = ks * 16;
                    mma(s[n], ld2(ka + o), ld2(ka + 8 * LD + o), ld2(ka + o + 8),
                        ld2(ka + 8 * LD + o + 8), ld2(qr + o), ld2(qr + o + 8));
                    mma(dp[n], ld2(va + o), ld2(va + 8 * LD + o), ld2(va + o + 8),
                        ld2(va + 8 * LD + o + 8), ld2(gr + o), ld2(gr + o + 8));
                }
            }
#pragma unroll
            for (int n = 0; n < KQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = n * 8 + 2 * c + (e & 1), t = i0 + r, key = e < 2 ? k0 : k1;
                    const bool ok = t < T && key <= t && key >= Sg[r];
                    const float p = ok ? exp2f(s[n][e] * sl2 - Ls[r]) : 0.0f;
                    s[n][e] = p;                   /* P^T */
                    dp[n][e] = p * (dp[n][e] - Ds[r]); /* dS^T */
                }
#pragma unroll
            for (int kk = 0; kk < KQ / 16; kk++) {
                const uint32_t p0 = pack2(s[2 * kk][0], s[2 * kk][1]);
                const uint32_t p1 = pack2(s[2 * kk][2], s[2 * kk][3]);
                const uint32_t p2 = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                const uint32_t p3 = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                const uint32_t d0 = pack2(dp[2 * kk][0], dp[2 * kk][1]);
                const uint32_t d1 = pack2(dp[2 * kk][2], dp[2 * kk][3]);
                const uint32_t d2 = pack2(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
                const uint32_t d3 = pack2(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    const bf16 *gt = Gt + (n * 8 + g) * LDT + kk * 16 + 2 * c;
                    const bf16 *qt = Qt + (n * 8 + g) * LDT + kk * 16 + 2 * c;
                    mma(dv[n], p0, p1, p2, p3, ld2(gt), ld2(gt + 8));
                    mma(dk[n], d0, d1, d2, d3, ld2(qt), ld2(qt + 8));
                }
            }
        }
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int key = half ? k1 : k0;
        if (key >= T) continue;
        const size_t off = (((size_t)b * T + key) * A.G + grp) * D + 2 * c;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            if (A.dk) {
                A.dk[off + n * 8] += A.scale * dk[n][2 * half];
                A.dk[off + n * 8 + 1] += A.scale * dk[n][2 * half + 1];
            }
            if (A.dv) {
                A.dv[off + n * 8] += dv[n][2 * half];
                A.dv[off + n * 8 + 1] += dv[n][2 * half + 1];
            }
        }
    }
}

template <int D> void launch_fwd(mc_cuda *cu, const fl_args &A)
{
    MC_SMEM_LIMIT(k_flash_fwd<D>, fwd_smem<D>());
    dim3 grid((unsigned)((A.T + FQ - 1) / FQ), (unsigned)A.Q, (unsigned)A.B);
    MC_LAUNCH(k_flash_fwd<D>, grid, NT, fwd_smem<D>(), A);
}

template <int D> void launch_bwd(mc_cuda *cu, const fl_args &A)
{
    if (A.dq) {
        MC_SMEM_LIMIT(k_flash_bwd_dq<D>, dq_smem<D>());
        dim3 grid((unsigned)((A.T + DQ - 1) / DQ), (unsigned)A.Q, (unsigned)A.B);
        MC_LAUNCH(k_flash_bwd_dq<D>, grid, NT, dq_smem<D>(), A);
    }
    if (A.dk || A.dv) {
        MC_SMEM_LIMIT(k_flash_bwd_dkv<D>, dkv_smem<D>());
        dim3 grid((unsigned)((A.T + KK - 1) / KK), (unsigned)A.G, (unsigned)A.B);
        MC_LAUNCH(k_flash_bwd_dkv<D>, grid, NT, dkv_smem<D>(), A);
    }
}

/* the head dimensions compiled: multiples of 16 up to 128 */
#define FLASH_SWITCH(D, fn, args)   \
    switch (D) {                    \
    case 16: fn<16> args; break;    \
    case 32: fn<32> args; break;    \
    case 48: fn<48> args; break;    \
    case 64: fn<64> args; break;    \
    case 80: fn<80> args; break;    \
    case 96: fn<96> args; break;    \
    case 128: fn<128> args; break;  \
    default: return 0;              \
    }

/* the arguments both directions share */
fl_args shape_args(const float *q, const float *k, const float *v, size_t B, size_t T, size_t Q,
                   size_t G, float scale, const int32_t *seg)
{
    fl_args A = {};
    A.q = q;
    A.k = k;
    A.v = v;
    A.B = (int)B;
    A.T = (int)T;
    A.Q = (int)Q;
    A.G = (int)G;
    A.hpg = (int)(Q / G);
    A.scale = scale;
    A.seg = seg;
    return A;
}

/* float2 loads: every tensor 8-byte aligned */
bool aligned8(const void *p) { return !p || ((uintptr_t)p & 7) == 0; }

} // namespace

int mc_cuda_flash_supported(size_t D)
{
    return D == 16 || D == 32 || D == 48 || D == 64 || D == 80 || D == 96 || D == 128;
}

int mc_cuda_flash_fwd(mc_cuda *cu, float *out, float *lse, const float *q, const float *k,
                      const float *v, size_t B, size_t T, size_t Q, size_t G, size_t D, float scale,
                      const int32_t *seg)
{
    if (!mc_cuda_flash_supported(D) || !aligned8(out) || !aligned8(q) || !aligned8(k) ||
        !aligned8(v))
        return 0;
    fl_args A = shape_args(q, k, v, B, T, Q, G, scale, seg);
    A.out = out;
    A.lse = lse;
    FLASH_SWITCH(D, launch_fwd, (cu, A))
    return 1;
}

int mc_cuda_flash_bwd(mc_cuda *cu, float *dq, float *dk, float *dv, const float *dout,
                      const float *q, const float *k, const float *v, const float *lse,
                      const float *Dr, size_t B, size_t T, size_t Q, size_t G, size_t D,
                      float scale, const int32_t *seg)
{
    if (!mc_cuda_flash_supported(D) || !aligned8(dq) || !aligned8(dk) || !aligned8(dv) ||
        !aligned8(dout) || !aligned8(q) || !aligned8(k) || !aligned8(v))
        return 0;
    fl_args A = shape_args(q, k, v, B, T, Q, G, scale, seg);
    A.dq = dq;
    A.dk = dk;
    A.dv = dv;
    A.dout = dout;
    A.lse_in = lse;
    A.Dr = Dr;
    FLASH_SWITCH(D, launch_bwd, (cu, A))
    return 1;
}
