/*
 * layers.cu - the per-layer kernels that are not GEMMs or attention:
 * vocab-parallel embedding and learned positions, LayerNorm and RMSNorm,
 * rotary embedding, the QKV split, and the vocab-parallel cross-entropy
 * steps. Each follows its CPU twin in kern/cpu (same formulas, row
 * statistics and softmax sums in double), deterministic without float
 * atomics (doc/ARCHITECTURE.md, "Kernels").
 */
#include <math.h>
#include <cub/device/device_radix_sort.cuh>
#include "kern/cuda/internal.cuh"

#define TPB 256
#define ROWS_PER_CHUNK 128 /* rows per partial sum of the column reductions */
#define WARPS 8            /* warps per block in the row kernels */

/* ---------------------------------------------------- embedding */

/* out[i,:] = wte[ids[i]-v0,:] in range, else 0 */
__global__ void k_embed_fwd(float *out, const int32_t *ids, size_t N, const float *wte, int64_t v0,
                            int64_t vl, size_t C)
{
    GRID_STRIDE(k, N * C)
    {
        size_t i = k / C, c = k % C;
        int64_t r = (int64_t)ids[i] - v0;
        out[k] = r >= 0 && r < vl ? wte[(size_t)r * C + c] : 0.0f;
    }
}

extern "C" void mc_cuda_embed_fwd(mc_cuda *cu, float *out, const int32_t *ids, size_t N,
                                  const float *wte, int64_t v0, int64_t vl, size_t C)
{
    if (!N || !C) return;
    k_embed_fwd<<<mc_cu_blocks(N * C, TPB), TPB, 0, cu->stream>>>(out, ids, N, wte, v0, vl, C);
    KCHECK();
}

__global__ void k_iota(int32_t *x, size_t n) { GRID_STRIDE(i, n) x[i] = (int32_t)i; }

/* One thread per (sorted position s, column c); the first position of each
 * run of equal ids adds the run's rows, in their original order, into the
 * table row: acc = dwte[r,c]; acc += dout[i,c] for each i; store. */
__global__ void k_embed_bwd_runs(float *dwte, const float *dout, const int32_t *keys,
                                 const int32_t *rows, size_t N, int64_t v0, int64_t vl, size_t C)
{
    size_t s = blockIdx.x, c = (size_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int32_t id = keys[s];
    if (s > 0 && keys[s - 1] == id) return;
    int64_t r = (int64_t)id - v0;
    if (r < 0 || r >= vl) return;
    float *d = dwte + (size_t)r * C + c;
    float acc = *d;
    for (size_t j = s; j < N && keys[j] == id; j++) acc += dout[(size_t)rows[j] * C + c];
    *d = acc;
}

/* The token ids are sorted with a stable radix sort (cub), so each table row
 * adds its tokens' gradients in row order, exactly as the CPU does. */
extern "C" void mc_cuda_embed_bwd(mc_cuda *cu, float *dwte, const float *dout, const int32_t *ids,
                                  size_t N, int64_t v0, int64_t vl, size_t C)
{
    if (!N || !C) return;
    size_t tmp = 0;
    CU_CHECK(cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int32_t *)NULL, (int32_t *)NULL,
                                             (const int32_t *)NULL, (int32_t *)NULL, (int)N, 0, 32,
                                             cu->stream));
    size_t a = (N * sizeof(int32_t) + 255) & ~(size_t)255;
    char *base = (char *)mc_cuda_scratch(cu, MC_CU_SCRATCH_SORT, 3 * a + tmp);
    int32_t *pos = (int32_t *)base, *keys = (int32_t *)(base + a),
            *rows = (int32_t *)(base + 2 * a);
    k_iota<<<mc_cu_blocks(N, TPB), TPB, 0, cu->stream>>>(pos, N);
    KCHECK();
    CU_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * a, tmp, ids, keys, pos, rows, (int)N, 0, 32,
                                             cu->stream));
    dim3 grid((unsigned)N, (unsigned)((C + TPB - 1) / TPB));
    k_embed_bwd_runs<<<grid, TPB, 0, cu->stream>>>(dwte, dout, keys, rows, N, v0, vl, C);
    KCHECK();
}

/* out[b,t,:] += wpe[pos0+t,:], or wpe[pos[b T + t],:] */
__global__ void k_posemb_fwd(float *out, const float *wpe, size_t BT, size_t T, size_t C,
                             size_t pos0, const int32_t *pos)
{
    GRID_STRIDE(k, BT * C)
    {
        size_t bt = k / C, c = k % C;
        out[k] += wpe[(pos ? (size_t)pos[bt] : pos0 + bt % T) * C + c];
    }
}

/* dwpe[pos0+t,c] += sum_b dout[b,t,c], b in order */
__global__ void k_posemb_bwd(float *dwpe, const float *dout, size_t B, size_t T, size_t C,
                             size_t pos0)
{
    GRID_STRIDE(k, T * C)
    {
        size_t t = k / C, c = k % C;
        float *d = dwpe + (pos0 + t) * C + c;
        float acc = *d;
        for (size_t b = 0; b < B; b++) acc += dout[(b * T + t) * C + c];
        *d = acc;
    }
}

extern "C" void mc_cuda_posemb_fwd(mc_cuda *cu, float *out, const float *wpe, size_t B, size_t T,
                                   size_t C, size_t pos0, const int32_t *pos)
{
    if (!B || !T || !C) return;
    k_posemb_fwd<<<mc_cu_blocks(B * T * C, TPB), TPB, 0, cu->stream>>>(out, wpe, B * T, T, C, pos0,
                                                                       pos);
    KCHECK();
}
/* Per-token positions: the embedding's backward with the positions as ids
 * (each row of the table adds its tokens in (b, t) order, as the CPU). */
extern "C" void mc_cuda_posemb_bwd(mc_cuda *cu, float *dwpe, const float *dout, size_t B, size_t T,
                                   size_t C, size_t pos0, const int32_t *pos)
{
    if (!B || !T || !C) return;
    if (pos) {
        mc_cuda_embed_bwd(cu, dwpe, dout, pos, B * T, 0, INT64_MAX, C);
        return;
    }
    k_posemb_bwd<<<mc_cu_blocks(T * C, TPB), TPB, 0, cu->stream>>>(dwpe, dout, B, T, C, pos0);
    KCHECK();
}

/* ---------------------------------------------------- norms */

/* One warp per row. mean = sum x / C, rstd = 1/sqrt(sum (x-mean)^2 / C + eps)
 * in double; out = (x - mean) rstd w + b */
__global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x,
                                const float *w, const float *b, size_t N, size_t C, float eps)
{
    size_t i = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    unsigned lane = threadIdx.x % 32;
    if (i >= N) return;
    const float *xi = x + i * C;
    double s = 0.0;
    for (size_t c = lane; c < C; c += 32) s += xi[c];
    double mu = mc_warp_sum_d(s) / (double)C, var = 0.0;
    for (size_t c = lane; c < C; c += 32) {
        double d = xi[c] - mu;
        var += d * d;
    }
    var = mc_warp_sum_d(var);
    float m = (float)mu, r = (float)(1.0 / sqrt(var / (double)C + (double)eps));
    float *o = out + i * C;
    for (size_t c = lane; c < C; c += 32) o[c] = (xi[c] - m) * r * w[c] + (b ? b[c] : 0.0f);
    if (lane == 0) {
        mean[i] = m;
        rstd[i] = r;
    }
}

/* dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dout w, sums in double */
__global__ void k_layernorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                                   const float *mean, const float *rstd, size_t N, size_t C)
{
    size_t i = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    unsigned lane = threadIdx.x % 32;
    if (i >= N) return;
    const float *xi = x + i * C, *gi = dout + i * C;
    float m = mean[i], r = rstd[i];
    double sg = 0.0, sgx = 0.0;
    for (size_t c = lane; c < C; c += 32) {
        double g = (double)gi[c] * w[c];
        sg += g;
        sgx += g * ((xi[c] - m) * r);
    }
    sg = mc_warp_sum_d(sg);
    sgx = mc_warp_sum_d(sgx);
    float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
    float *d = dx + i * C;
    for (size_t c = lane; c < C; c += 32) {
        float xhat = (xi[c] - m) * r;
        d[c] += r * (gi[c] * w[c] - mg - xhat * mgx);
    }
}

/* Partial column sums over chunk blockIdx.y of ROWS_PER_CHUNK rows:
 * pw[ch,c] = sum dout xhat (LayerNorm: xhat = (x - mean) rstd; RMSNorm, mean
 * NULL: x rstd), pb[ch,c] = sum dout (when pb) */
__global__ void k_norm_dw_part(float *pw, float *pb, const float *dout, const float *x,
                               const float *mean, const float *rstd, size_t N, size_t C)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (c >= C) return;
    size_t i0 = ch * ROWS_PER_CHUNK, i1 = i0 + ROWS_PER_CHUNK < N ? i0 + ROWS_PER_CHUNK : N;
    float aw = 0.0f, ab = 0.0f;
    for (size_t i = i0; i < i1; i++) {
        float g = dout[i * C + c], xv = x[i * C + c];
        aw += mean ? g * ((xv - mean[i]) * rstd[i]) : g * xv * rstd[i];
        ab += g;
    }
    pw[ch * C + c] = aw;
    if (pb) pb[ch * C + c] = ab;
}

/* dw[c] += sum over chunks in order (db likewise) */
__global__ void k_norm_dw_final(float *dw, float *db, const float *pw, const float *pb, size_t nch,
                                size_t C)
{
    GRID_STRIDE(c, C)
    {
        if (dw) {
            float a = 0.0f;
            for (size_t k = 0; k < nch; k++) a += pw[k * C + c];
            dw[c] += a;
        }
        if (db) {
            float a = 0.0f;
            for (size_t k = 0; k < nch; k++) a += pb[k * C + c];
            db[c] += a;
        }
    }
}

static void norm_dw(mc_cuda *cu, float *dw, float *db, const float *dout, const float *x,
                    const float *mean, const float *rstd, size_t N, size_t C)
{
    size_t nch = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
    float *pw = (float *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, 2 * nch * C * sizeof(float));
    float *pb = db ? pw + nch * C : NULL;
    dim3 grid((unsigned)((C + TPB - 1) / TPB), (unsigned)nch);
    k_norm_dw_part<<<grid, TPB, 0, cu->stream>>>(pw, pb, dout, x, mean, rstd, N, C);
    KCHECK();
    k_norm_dw_final<<<mc_cu_blocks(C, TPB), TPB, 0, cu->stream>>>(dw, db, pw, pb, nch, C);
    KCHECK();
}

static unsigned row_blocks(size_t N) { return (unsigned)((N + WARPS - 1) / WARPS); }

extern "C" void mc_cuda_layernorm_fwd(mc_cuda *cu, float *out, float *mean, float *rstd,
                                      const float *x, const float *w, const float *b, size_t N,
                                      size_t C, float eps, mc_prec round)
{
    if (!N) return;
    k_layernorm_fwd<<<row_blocks(N), WARPS * 32, 0, cu->stream>>>(out, mean, rstd, x, w, b, N, C,
                                                                  eps);
    KCHECK();
    if (round != MC_PREC_FP32) mc_cuda_round(cu, out, N * C, round);
}

extern "C" void mc_cuda_layernorm_bwd(mc_cuda *cu, float *dx, float *dw, float *db,
                                      const float *dout, const float *x, const float *w,
                                      const float *mean, const float *rstd, size_t N, size_t C)
{
    if (!N) return;
    if (dx) {
        k_layernorm_bwd_dx<<<row_blocks(N), WARPS * 32, 0, cu->stream>>>(dx, dout, x, w, mean, rstd,
                                                                         N, C);
        KCHECK();
    }
    if (dw || db) norm_dw(cu, dw, db, dout, x, mean, rstd, N, C);
}

/* rstd = 1/sqrt(sum x^2 / C + eps) in double; out = x rstd w */
__global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, size_t N,
                              size_t C, float eps)
{
    size_t i = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    unsigned lane = threadIdx.x % 32;
    if (i >= N) return;
    const float *xi = x + i * C;
    double ss = 0.0;
    for (size_t c = lane; c < C; c += 32) ss += (double)xi[c] * xi[c];
    ss = mc_warp_sum_d(ss);
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    float *o = out + i * C;
    for (size_t c = lane; c < C; c += 32) o[c] = xi[c] * r * w[c];
    if (lane == 0) rstd[i] = r;
}

/* dx += rstd (g - x rstd^2 mean(g x)), g = dout w */
__global__ void k_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                                 const float *rstd, size_t N, size_t C)
{
    size_t i = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    unsigned lane = threadIdx.x % 32;
    if (i >= N) return;
    const float *xi = x + i * C, *gi = dout + i * C;
    float r = rstd[i];
    double sgx = 0.0;
    for (size_t c = lane; c < C; c += 32) sgx += (double)gi[c] * w[c] * xi[c];
    sgx = mc_warp_sum_d(sgx);
    float k = (float)(sgx / (double)C) * r * r;
    float *d = dx + i * C;
    for (size_t c = lane; c < C; c += 32) d[c] += r * (gi[c] * w[c] - xi[c] * k);
}

extern "C" void mc_cuda_rmsnorm_fwd(mc_cuda *cu, float *out, float *rstd, const float *x,
                                    const float *w, size_t N, size_t C, float eps, mc_prec round)
{
    if (!N) return;
    k_rmsnorm_fwd<<<row_blocks(N), WARPS * 32, 0, cu->stream>>>(out, rstd, x, w, N, C, eps);
    KCHECK();
    if (round != MC_PREC_FP32) mc_cuda_round(cu, out, N * C, round);
}

extern "C" void mc_cuda_rmsnorm_bwd(mc_cuda *cu, float *dx, float *dw, const float *dout,
                                    const float *x, const float *w, const float *rstd, size_t N,
                                    size_t C)
{
    if (!N) return;
    if (dx) {
        k_rmsnorm_bwd_dx<<<row_blocks(N), WARPS * 32, 0, cu->stream>>>(dx, dout, x, w, rstd, N, C);
        KCHECK();
    }
    if (dw) norm_dw(cu, dw, NULL, dout, x, NULL, rstd, N, C);
}

/* ---------------------------------------------------- RoPE */

/* tab[t,i] = (cos, sign sin) of p inv[i] (mc_rope_inv_freq, computed on
 * the host in double), in double, for the rows t < T of the table: p =
 * pos0 + t, or pos[t] (per-token positions) */
__global__ void k_rope_table(float *tab, size_t T, size_t half, const double *inv, size_t pos0,
                             const int32_t *pos, float sign)
{
    GRID_STRIDE(k, T * half)
    {
        size_t t = k / half, i = k % half;
        double a = (double)(pos ? (size_t)pos[t] : pos0 + t) * inv[i];
        tab[2 * k] = (float)cos(a);
        tab[2 * k + 1] = sign * (float)sin(a);
    }
}

/* x1' = x1 cos - x2 sin; x2' = x2 cos + x1 sin over the pairs (i, i + half)
 * of each head's first 2 half dims (of D) */
__global__ void k_rope_apply(float *x, const float *tab, size_t BT, size_t T, size_t H, size_t half,
                             size_t D)
{
    GRID_STRIDE(k, BT * H * half)
    {
        size_t i = k % half, bth = k / half, bt = bth / H;
        const float *cs = tab + ((bt % T) * half + i) * 2;
        float *x1 = x + bth * D + i, *x2 = x1 + half;
        float c = cs[0], s = cs[1], a = *x1, b = *x2;
        *x1 = a * c - b * s;
        *x2 = b * c + a * s;
    }
}

/* The table has a row per position t < T shared by the B sequences, or with
 * per-token positions a row per token (B T rows); the frequencies follow it
 * in the same scratch. */
static void rope(mc_cuda *cu, float *x, size_t B, size_t T, size_t H, size_t D, const mc_rope *r,
                 size_t pos0, const int32_t *pos, float sign)
{
    size_t R = r->rot_dim > 0 ? (size_t)r->rot_dim : D;
    if (R % 2 || R > D) mc_cu_die(__FILE__, __LINE__, "rope", "odd or oversized rotary dimension");
    if (!B || !T || !H || !D) return;
    size_t half = R / 2, rows = pos ? B * T : T;
    size_t tab_bytes = (rows * half * 2 * sizeof(float) + 15) & ~(size_t)15;
    char *scr = (char *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, tab_bytes + half * sizeof(double));
    float *tab = (float *)scr;
    double *inv = (double *)(scr + tab_bytes);
    double host[1024];
    if (half > 1024) mc_cu_die(__FILE__, __LINE__, "rope", "head dimension above 2048");
    for (size_t i = 0; i < half; i++) host[i] = mc_rope_inv_freq(r, D, i);
    mc_cuda_bcopy_from_host(cu, inv, host, half * sizeof(double));
    k_rope_table<<<mc_cu_blocks(rows * half, TPB), TPB, 0, cu->stream>>>(tab, rows, half, inv,
                                                                         pos0, pos, sign);
    KCHECK();
    k_rope_apply<<<mc_cu_blocks(B * T * H * half, TPB), TPB, 0, cu->stream>>>(x, tab, B * T, rows,
                                                                              H, half, D);
    KCHECK();
}

extern "C" void mc_cuda_rope_fwd(mc_cuda *cu, float *x, size_t B, size_t T, size_t H, size_t D,
                                 const mc_rope *r, size_t pos0, const int32_t *pos)
{
    rope(cu, x, B, T, H, D, r, pos0, pos, 1.0f);
}
extern "C" void mc_cuda_rope_bwd(mc_cuda *cu, float *dx, size_t B, size_t T, size_t H, size_t D,
                                 const mc_rope *r, size_t pos0, const int32_t *pos)
{
    rope(cu, dx, B, T, H, D, r, pos0, pos, -1.0f);
}

/* ---------------------------------------------------- QKV split */

/* Group g of row n of qkv [N, G, (hpg+2) D] (one block per (n, g), its
 * threads along the group's (hpg+2) D elements) goes to q, k and v; bwd
 * adds the other way (a NULL part adds nothing). One division per block:
 * 64-bit divisions per element made the flat version 4x slower than the
 * memory (H200 profile, session 11). */
__global__ void k_qkv(float *q, float *k, float *v, float *qkv, unsigned hpg, unsigned D, int bwd)
{
    const size_t ng = blockIdx.x; /* n G + g: q's rows of the group start at ng hpg */
    const unsigned qw = hpg * D, gw = (hpg + 2) * D;
    float *src = qkv + ng * gw;
    float *qd = q ? q + ng * qw : NULL, *kd = k ? k + ng * D : NULL, *vd = v ? v + ng * D : NULL;
    for (unsigned w = threadIdx.x; w < gw; w += blockDim.x) {
        float *p = w < qw ? (qd ? qd + w : NULL)
                   : w < qw + D ? (kd ? kd + (w - qw) : NULL)
                                : (vd ? vd + (w - qw - D) : NULL);
        if (!bwd)
            *p = src[w];
        else if (p)
            src[w] += *p;
    }
}

static void qkv_launch(mc_cuda *cu, float *q, float *k, float *v, float *qkv, size_t N, size_t Q,
                       size_t G, size_t D, int bwd)
{
    size_t gw = (Q / G + 2) * D, blocks = N * G;
    if (gw > UINT32_MAX || blocks > INT32_MAX)
        mc_cu_die(__FILE__, __LINE__, "qkv_split", "tensor too large");
    unsigned threads = gw >= TPB ? TPB : (unsigned)((gw + 31) / 32 * 32);
    k_qkv<<<(unsigned)blocks, threads, 0, cu->stream>>>(q, k, v, qkv, (unsigned)(Q / G),
                                                        (unsigned)D, bwd);
    KCHECK();
}

extern "C" void mc_cuda_qkv_split(mc_cuda *cu, float *q, float *k, float *v, const float *qkv,
                                  size_t N, size_t Q, size_t G, size_t D)
{
    if (!G || Q % G) mc_cu_die(__FILE__, __LINE__, "qkv_split", "Q is not a multiple of G");
    if (!N || !D) return;
    qkv_launch(cu, q, k, v, (float *)qkv, N, Q, G, D, 0);
}

extern "C" void mc_cuda_qkv_split_bwd(mc_cuda *cu, float *dqkv, const float *dq, const float *dk,
                                      const float *dv, size_t N, size_t Q, size_t G, size_t D)
{
    if (!G || Q % G) mc_cu_die(__FILE__, __LINE__, "qkv_split_bwd", "Q is not a multiple of G");
    if (!N || !D) return;
    qkv_launch(cu, (float *)dq, (float *)dk, (float *)dv, dqkv, N, Q, G, D, 1);
}

/* ---------------------------------------------------- cross-entropy */

/* one block per row; fixed-tree reductions */
__global__ void k_xent_max(float *rowmax, const float *logits, size_t vl)
{
    __shared__ float sh[TPB];
    const float *l = logits + (size_t)blockIdx.x * vl;
    float m = -INFINITY;
    for (size_t j = threadIdx.x; j < vl; j += TPB) m = l[j] > m ? l[j] : m;
    sh[threadIdx.x] = m;
    __syncthreads();
    for (unsigned s = TPB / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) rowmax[blockIdx.x] = sh[0];
}

__global__ void k_xent_sumexp(float *sumexp, float *tlogit, const float *logits,
                              const float *rowmax, const int32_t *targets, int64_t v0, size_t vl)
{
    __shared__ double sh[TPB];
    size_t i = blockIdx.x;
    const float *l = logits + i * vl;
    float m = rowmax[i];
    double s = 0.0;
    for (size_t j = threadIdx.x; j < vl; j += TPB) s += expf(l[j] - m);
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned k = TPB / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        sumexp[i] = (float)sh[0];
        int64_t t = (int64_t)targets[i] - v0;
        tlogit[i] = targets[i] >= 0 && t >= 0 && t < (int64_t)vl ? l[t] : 0.0f;
    }
}

__global__ void k_xent_loss(float *loss, const float *rowmax, const float *sumexp,
                            const float *tlogit, const int32_t *targets, size_t N)
{
    GRID_STRIDE(i, N) loss[i] = targets[i] < 0 ? 0.0f : logf(sumexp[i]) + rowmax[i] - tlogit[i];
}

/* d = w (exp(l - m) / sumexp - [j == target]); in place allowed (read, then write) */
__global__ void k_xent_bwd(float *dlogits, const float *logits, const float *rowmax,
                           const float *sumexp, const int32_t *targets, int64_t v0, size_t vl,
                           const float *dloss, float scale)
{
    size_t i = blockIdx.x;
    const float *l = logits + i * vl;
    float *d = dlogits + i * vl;
    int32_t tg = targets[i];
    if (tg < 0) {
        for (size_t j = threadIdx.x; j < vl; j += TPB) d[j] = 0.0f;
        return;
    }
    float w = dloss ? dloss[i] : scale, m = rowmax[i], inv = 1.0f / sumexp[i];
    int64_t t = (int64_t)tg - v0;
    for (size_t j = threadIdx.x; j < vl; j += TPB) {
        float p = w * (expf(l[j] - m) * inv);
        d[j] = (int64_t)j == t ? p - w : p;
    }
}

extern "C" void mc_cuda_xent_max(mc_cuda *cu, float *rowmax, const float *logits, size_t N,
                                 size_t vl)
{
    if (!N) return;
    k_xent_max<<<(unsigned)N, TPB, 0, cu->stream>>>(rowmax, logits, vl);
    KCHECK();
}

extern "C" void mc_cuda_xent_sumexp(mc_cuda *cu, float *sumexp, float *tlogit, const float *logits,
                                    const float *rowmax, const int32_t *targets, int64_t v0,
                                    size_t N, size_t vl)
{
    if (!N) return;
    k_xent_sumexp<<<(unsigned)N, TPB, 0, cu->stream>>>(sumexp, tlogit, logits, rowmax, targets, v0,
                                                       vl);
    KCHECK();
}

extern "C" void mc_cuda_xent_loss(mc_cuda *cu, float *loss, const float *rowmax,
                                  const float *sumexp, const float *tlogit, const int32_t *targets,
                                  size_t N)
{
    if (!N) return;
    k_xent_loss<<<mc_cu_blocks(N, TPB), TPB, 0, cu->stream>>>(loss, rowmax, sumexp, tlogit, targets,
                                                              N);
    KCHECK();
}

extern "C" void mc_cuda_xent_bwd(mc_cuda *cu, float *dlogits, const float *logits,
                                 const float *rowmax, const float *sumexp, const int32_t *targets,
                                 int64_t v0, size_t N, size_t vl, const float *dloss, float scale,
                                 mc_prec round)
{
    if (!N) return;
    k_xent_bwd<<<(unsigned)N, TPB, 0, cu->stream>>>(dlogits, logits, rowmax, sumexp, targets, v0,
                                                    vl, dloss, scale);
    KCHECK();
    if (round != MC_PREC_FP32) mc_cuda_round(cu, dlogits, N * vl, round);
}
