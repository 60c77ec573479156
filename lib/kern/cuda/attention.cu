/*
 * attention.cu - causal grouped-query attention, flash style (FlashAttention-2
 * order): tiles of queries and keys in shared memory, an online softmax in
 * registers, no T x T matrix anywhere; extra memory is the lse row kept for
 * the backward and one float per query row in the backward (D_r). fp32
 * throughout, as kern.h's attention is (no prec argument), so it matches the
 * CPU backend (kern/cpu/attention.c) to fp32 rounding. With segment starts
 * (packed documents, kern_ops.def attention_fwd) a row's keys before its
 * start are masked like the keys after it, and key tiles wholly outside
 * every row's segment of a block are skipped.
 *
 * When the model is bf16 (mc_backend_set_attention_prec) the same contract
 * runs on the tensor cores instead (flash.cu); these kernels stay for fp32
 * models, the head dimensions flash.cu has no tiles for, and MC_CUDA_FLASH=0.
 */
#include <math.h>
#include "kern/cuda/internal.cuh"

/* Layout: q[B,T,Q,D], k,v[B,T,G,D], out[B,T,Q,D], lse[B,Q,T]; query head h
 * reads group h / (Q/G). Head dimension D <= 128: each lane of a warp holds
 * D/32 <= 4 output elements of a row. */
#define MAXD 128
#define DPL (MAXD / 32) /* output elements per lane */
#define BQ 32           /* query rows per block */
#define BK 32           /* keys per tile (one per lane) */
#define NWARP 4
#define RPW (BQ / NWARP) /* rows (or keys) per warp */

struct att_args {
    float *out, *lse, *dq, *dk, *dv, *Dr;
    const float *q, *k, *v, *dout, *o, *lse_in;
    int B, T, Q, G, D, hpg;
    float scale;
    const int32_t *seg; /* [B*T] segment starts, or NULL */
};

/* row t of sequence b attends keys seg_start(A, b, t) .. t */
__device__ __forceinline__ int seg_start(const att_args &A, int b, int t)
{
    return A.seg ? A.seg[(size_t)b * A.T + t] : 0;
}

/* The first key tile a block of rows starting at i0 needs: the tile of the
 * first row's segment start (starts do not decrease along the rows). */
__device__ __forceinline__ int first_tile(const att_args &A, int b, int i0)
{
    return A.seg ? seg_start(A, b, i0) / BK * BK : 0;
}

/* rows [t0, t0+n) of head `hd` of x[B,T,H,D] into sm (row stride ld), zeros past T */
__device__ void load_rows(float *sm, int ld, const float *x, int b, int t0, int n, int H, int hd,
                          int T, int D)
{
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
        int r = e / D, d = e % D, t = t0 + r;
        sm[r * ld + d] = t < T ? x[(((size_t)b * T + t) * H + hd) * D + d] : 0.0f;
    }
}

/* Forward, block = (b, h, 32 query rows), 4 warps of 8 rows each. Per key
 * tile of 32 (each lane one key):
 *   s = scale q_r . k_lane (masked to seg_t <= key <= t);  m' = max(m, max s)
 *   p = exp(s - m');  l = l exp(m - m') + sum p;  o = o exp(m - m') + sum_j p_j v_j
 * then out = o / l, lse = m + log l. */
__global__ void __launch_bounds__(NWARP * 32) k_att_fwd(att_args A)
{
    extern __shared__ float sm[];
    const int D = A.D, T = A.T, ldk = D + 1;
    float *Qs = sm, *Ks = Qs + BQ * D, *Vs = Ks + BK * ldk;
    const int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / A.hpg;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i0 = qb * BQ;
    load_rows(Qs, D, A.q, b, i0, BQ, A.Q, h, T, D);
    float o[RPW][DPL], m[RPW], l[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) o[r][k] = 0.0f;
    }
    int sg[RPW]; /* the rows' segment starts */
#pragma unroll
    for (int r = 0; r < RPW; r++) sg[r] = seg_start(A, b, min(i0 + warp * RPW + r, T - 1));
    const int jend = min(i0 + BQ, T);
    for (int j0 = first_tile(A, b, i0); j0 < jend; j0 += BK) {
        __syncthreads(); /* the previous tile is consumed */
        load_rows(Ks, ldk, A.k, b, j0, BK, A.G, g, T, D);
        load_rows(Vs, D, A.v, b, j0, BK, A.G, g, T, D);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = warp * RPW + r, t = i0 + row;
            /* warp-uniform; a tile that is processed holds a key of the row */
            if (t >= T || j0 > t || j0 + BK <= sg[r]) continue;
            const int key = j0 + lane;
            const bool valid = key <= t && key >= sg[r]; /* also < T, since t < T */
            const float *qr = Qs + row * D, *kr = Ks + lane * ldk;
            float s = 0.0f;
#pragma unroll 4
            for (int d = 0; d < D; d++) s += qr[d] * kr[d];
            s = valid ? s * A.scale : -INFINITY;
            const float mnew = fmaxf(m[r], mc_warp_max(s));
            const float p = valid ? expf(s - mnew) : 0.0f;
            const float corr = expf(m[r] - mnew);
            l[r] = l[r] * corr + mc_warp_sum(p);
            m[r] = mnew;
#pragma unroll
            for (int k = 0; k < DPL; k++) o[r][k] *= corr;
#pragma unroll 2
            for (int j = 0; j < BK; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                const float *vr = Vs + j * D;
#pragma unroll
                for (int k = 0; k < DPL; k++) {
                    const int d = lane + 32 * k;
                    if (d < D) o[r][k] += pj * vr[d];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int t = i0 + warp * RPW + r;
        if (t >= T) continue;
        const float inv = 1.0f / l[r];
        float *dst = A.out + (((size_t)b * T + t) * A.Q + h) * D;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + 32 * k;
            if (d < D) dst[d] = o[r][k] * inv;
        }
        if (lane == 0) A.lse[((size_t)b * A.Q + h) * T + t] = m[r] + logf(l[r]);
    }
}

/* Backward (D_r = dout_r . out_r first, P recomputed from lse), without
 * atomics, in two kernels that each own their outputs (dQ; dK and dV), with
 * dS_rc = P_rc (dout_r . v_c - D_r). Scores are computed twice (once per
 * kernel): the price of a fixed summation order.
 *
 * D_r = dout_r . out_r, one warp per (b, t, h) row, stored [B, Q, T] */
__global__ void k_att_rowdot(att_args A)
{
    const size_t row = (size_t)blockIdx.x * NWARP + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, D = A.D;
    if (row >= (size_t)A.B * A.T * A.Q) return;
    const float *go = A.dout + row * D, *oo = A.o + row * D;
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += go[d] * oo[d];
    acc = mc_warp_sum(acc);
    const size_t h = row % A.Q, bt = row / A.Q, t = bt % A.T, b = bt / A.T;
    if (lane == 0) A.Dr[(b * A.Q + h) * A.T + t] = acc;
}

/* dQ: block = (b, h, 32 query rows): dq_r += scale sum_c dS_rc k_c */
__global__ void __launch_bounds__(NWARP * 32) k_att_bwd_dq(att_args A)
{
    extern __shared__ float sm[];
    const int D = A.D, T = A.T, ldk = D + 1;
    float *Qs = sm, *Gs = Qs + BQ * D, *Ks = Gs + BQ * D, *Vs = Ks + BK * ldk;
    const int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / A.hpg;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i0 = qb * BQ;
    load_rows(Qs, D, A.q, b, i0, BQ, A.Q, h, T, D);
    load_rows(Gs, D, A.dout, b, i0, BQ, A.Q, h, T, D);
    float acc[RPW][DPL], lse[RPW], Dr[RPW];
    int sg[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int t = min(i0 + warp * RPW + r, T - 1);
        lse[r] = A.lse_in[((size_t)b * A.Q + h) * T + t];
        Dr[r] = A.Dr[((size_t)b * A.Q + h) * T + t];
        sg[r] = seg_start(A, b, t);
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[r][k] = 0.0f;
    }
    const int jend = min(i0 + BQ, T);
    for (int j0 = first_tile(A, b, i0); j0 < jend; j0 += BK) {
        __syncthreads();
        load_rows(Ks, ldk, A.k, b, j0, BK, A.G, g, T, D);
        load_rows(Vs, ldk, A.v, b, j0, BK, A.G, g, T, D);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = warp * RPW + r, t = i0 + row;
            if (t >= T || j0 > t || j0 + BK <= sg[r]) continue;
            const bool valid = j0 + lane <= t && j0 + lane >= sg[r];
            const float *qr = Qs + row * D, *gr = Gs + row * D;
            const float *kr = Ks + lane * ldk, *vr = Vs + lane * ldk;
            float s = 0.0f, dp = 0.0f;
#pragma unroll 4
            for (int d = 0; d < D; d++) {
                s += qr[d] * kr[d];
                dp += gr[d] * vr[d];
            }
            const float p = valid ? expf(s * A.scale - lse[r]) : 0.0f;
            const float ds = p * (dp - Dr[r]);
#pragma unroll 2
            for (int j = 0; j < BK; j++) {
                const float dsj = __shfl_sync(0xffffffffu, ds, j);
                const float *kj = Ks + j * ldk;
#pragma unroll
                for (int k = 0; k < DPL; k++) {
                    const int d = lane + 32 * k;
                    if (d < D) acc[r][k] += dsj * kj[d];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int t = i0 + warp * RPW + r;
        if (t >= T) continue;
        float *dst = A.dq + (((size_t)b * T + t) * A.Q + h) * D;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + 32 * k;
            if (d < D) dst[d] += A.scale * acc[r][k];
        }
    }
}

/* dKV: block = (b, g, 32 keys), looping over the group's heads and the query
 * tiles at or after the keys: dv_c += sum_r P_rc dout_r,
 * dk_c += scale sum_r dS_rc q_r. With segments the query tiles end at the
 * first whose rows all start after the block's keys. */
__global__ void __launch_bounds__(NWARP * 32) k_att_bwd_dkv(att_args A)
{
    extern __shared__ float sm[];
    const int D = A.D, T = A.T, ldq = D + 1;
    float *Qs = sm, *Gs = Qs + BQ * ldq, *Ks = Gs + BQ * ldq, *Vs = Ks + BK * D;
    float *Ls = Vs + BK * D, *Ds = Ls + BQ;
    const int kb = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j0 = kb * BK;
    load_rows(Ks, D, A.k, b, j0, BK, A.G, g, T, D);
    load_rows(Vs, D, A.v, b, j0, BK, A.G, g, T, D);
    float dk[RPW][DPL], dv[RPW][DPL];
#pragma unroll
    for (int c = 0; c < RPW; c++)
#pragma unroll
        for (int k = 0; k < DPL; k++) dk[c][k] = dv[c][k] = 0.0f;
    for (int hh = 0; hh < A.hpg; hh++) {
        const int h = g * A.hpg + hh;
        /* BQ == BK: tiles start at the keys */
        for (int i0 = j0; i0 < T && seg_start(A, b, i0) < j0 + BK; i0 += BQ) {
            __syncthreads();
            load_rows(Qs, ldq, A.q, b, i0, BQ, A.Q, h, T, D);
            load_rows(Gs, ldq, A.dout, b, i0, BQ, A.Q, h, T, D);
            for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
                const int t = min(i0 + r, T - 1);
                Ls[r] = A.lse_in[((size_t)b * A.Q + h) * T + t];
                Ds[r] = A.Dr[((size_t)b * A.Q + h) * T + t];
            }
            __syncthreads();
            const int t = i0 + lane; /* this lane's query row */
            const int sg = seg_start(A, b, min(t, T - 1));
#pragma unroll
            for (int c = 0; c < RPW; c++) {
                const int key = j0 + warp * RPW + c;
                if (key >= T) continue; /* warp-uniform */
                const bool valid = t < T && t >= key && key >= sg;
                const float *qr = Qs + lane * ldq, *gr = Gs + lane * ldq;
                const float *kc = Ks + (warp * RPW + c) * D, *vc = Vs + (warp * RPW + c) * D;
                float s = 0.0f, dp = 0.0f;
#pragma unroll 4
                for (int d = 0; d < D; d++) {
                    s += qr[d] * kc[d];
                    dp += gr[d] * vc[d];
                }
                const float p = valid ? expf(s * A.scale - Ls[lane]) : 0.0f;
                const float ds = p * (dp - Ds[lane]);
#pragma unroll 2
                for (int j = 0; j < BQ; j++) {
                    const float pj = __shfl_sync(0xffffffffu, p, j);
                    const float dsj = __shfl_sync(0xffffffffu, ds, j);
                    const float *gj = Gs + j * ldq, *qj = Qs + j * ldq;
#pragma unroll
                    for (int k = 0; k < DPL; k++) {
                        const int d = lane + 32 * k;
                        if (d < D) {
                            dv[c][k] += pj * gj[d];
                            dk[c][k] += dsj * qj[d];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < RPW; c++) {
        const int key = j0 + warp * RPW + c;
        if (key >= T) continue;
        const size_t off = (((size_t)b * T + key) * A.G + g) * D;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + 32 * k;
            if (d >= D) continue;
            if (A.dk) A.dk[off + d] += A.scale * dk[c][k];
            if (A.dv) A.dv[off + d] += dv[c][k];
        }
    }
}

static void check_shape(size_t G, size_t Q, size_t D, size_t T)
{
    if (!G || Q % G) mc_cu_die(__FILE__, __LINE__, "attention", "Q is not a multiple of G");
    if (D == 0 || D > MAXD) mc_cu_die(__FILE__, __LINE__, "attention", "head dimension over 128");
    if (T > (size_t)1 << 30) mc_cu_die(__FILE__, __LINE__, "attention", "sequence too long");
}

/* a kernel that needs more than 48 KiB of shared memory must say so first */
static void smem_limit(const void *k, size_t bytes)
{
    CU_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

extern "C" void mc_cuda_set_attention_prec(mc_cuda *cu, mc_prec prec)
{
    cu->att_bf16 = prec == MC_PREC_BF16 && !cu->flash_off;
}

extern "C" void mc_cuda_attention_fwd(mc_cuda *cu, float *out, float *lse, const float *q,
                                      const float *k, const float *v, size_t B, size_t T, size_t Q,
                                      size_t G, size_t D, float scale, const int32_t *seg)
{
    check_shape(G, Q, D, T);
    if (!B || !T) return;
    if (cu->att_bf16 && mc_cuda_flash_fwd(cu, out, lse, q, k, v, B, T, Q, G, D, scale, seg)) return;
    att_args A = {out,    lse,    NULL,   NULL,         NULL,  NULL,   q,
                  k,      v,      NULL,   NULL,         NULL,  (int)B, (int)T,
                  (int)Q, (int)G, (int)D, (int)(Q / G), scale, seg};
    size_t smem = (BQ * D + BK * (D + 1) + BK * D) * sizeof(float);
    smem_limit((const void *)k_att_fwd, smem);
    dim3 grid((unsigned)((T + BQ - 1) / BQ), (unsigned)Q, (unsigned)B);
    k_att_fwd<<<grid, NWARP * 32, smem, cu->stream>>>(A);
    KCHECK();
}

extern "C" void mc_cuda_attention_bwd(mc_cuda *cu, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse, size_t B,
                                      size_t T, size_t Q, size_t G, size_t D, float scale,
                                      const int32_t *seg)
{
    check_shape(G, Q, D, T);
    if (!B || !T || (!dq && !dk && !dv)) return;
    float *Dr = (float *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, B * Q * T * sizeof(float));
    att_args A = {NULL,   NULL,   dq,     dk,           dv,    Dr,     q,
                  k,      v,      dout,   out,          lse,   (int)B, (int)T,
                  (int)Q, (int)G, (int)D, (int)(Q / G), scale, seg};
    size_t rows = B * T * Q;
    k_att_rowdot<<<(unsigned)((rows + NWARP - 1) / NWARP), NWARP * 32, 0, cu->stream>>>(A);
    KCHECK();
    if (cu->att_bf16 &&
        mc_cuda_flash_bwd(cu, dq, dk, dv, dout, q, k, v, lse, Dr, B, T, Q, G, D, scale, seg))
        return;
    if (dq) {
        size_t smem = (2 * BQ * D + 2 * BK * (D + 1)) * sizeof(float);
        smem_limit((const void *)k_att_bwd_dq, smem);
        dim3 grid((unsigned)((T + BQ - 1) / BQ), (unsigned)Q, (unsigned)B);
        k_att_bwd_dq<<<grid, NWARP * 32, smem, cu->stream>>>(A);
        KCHECK();
    }
    if (dk || dv) {
        size_t smem = (2 * BQ * (D + 1) + 2 * BK * D + 2 * BQ) * sizeof(float);
        smem_limit((const void *)k_att_bwd_dkv, smem);
        dim3 grid((unsigned)((T + BK - 1) / BK), (unsigned)G, (unsigned)B);
        k_att_bwd_dkv<<<grid, NWARP * 32, smem, cu->stream>>>(A);
        KCHECK();
    }
}
