/*
 * moe.cu - the mixture-of-experts kernels of mc/kern_ops.def on the GPU:
 * routing (softmax or sigmoid scores, pre-softmax, group-limited, expert
 * bias, scaling) and its backward, expert capacity (token dropping), the load-balancing and z losses with
 * their gradients, the permutation by expert and back, the expert-bias
 * update and the grouped GEMM (cuBLASLt per expert). Same contracts and the
 * same arithmetic as kern/cpu/moe.c: per-token work is one thread running
 * the CPU's loop in double (its scratch in shared memory), sums run in the
 * CPU's order, and nothing depends on scheduling (no float atomics), so a
 * routing decision, a count or a permutation is the CPU's exactly and the
 * floats agree to rounding. Capacity dropping ranks each choice among its
 * expert's by a scan of all the choices (one thread a choice).
 *
 * tests/cuda/moe_emu.cc runs these kernels on the CPU (tests/cuda/emu.h)
 * against the CPU backend's; tests/cuda/check_kern compares them on a GPU.
 */
#ifndef MC_CUDA_EMULATE
#include <math.h>
#include <stdint.h>
#include "kern/cuda/internal.cuh"
#define MC_RN_MUL(a, b) __fmul_rn((a), (b))
#define MC_RN_ADD(a, b) __fadd_rn((a), (b))
#else
#define MC_RN_MUL(a, b) ((a) * (b))
#define MC_RN_ADD(a, b) ((a) + (b))
#endif

namespace {

constexpr unsigned MAX_TPB = 32;         /* tokens per block of the per-token kernels */
constexpr size_t SMEM_BUDGET = 40 << 10; /* their shared memory per block */
constexpr unsigned CT = 128;             /* threads along a row (permutations) */
#ifndef MC_MOE_CHUNK
#define MC_MOE_CHUNK 2048 /* tests/cuda/moe_emu.cc: 64, for several chunks at small sizes */
#endif
constexpr size_t CHUNK = MC_MOE_CHUNK; /* choices per block of the permutation map */

/* Tokens per block for `bytes` of scratch each, and the grid. */
struct per_token {
    unsigned tpb;
    size_t bytes; /* one token's, 8-byte aligned */
    unsigned blocks;
};
per_token plan(size_t N, size_t bytes)
{
    per_token p;
    p.bytes = (bytes + 7) / 8 * 8;
    size_t t = SMEM_BUDGET / p.bytes;
    p.tpb = t < 1 ? 1 : t > MAX_TPB ? MAX_TPB : (unsigned)t;
    p.blocks = (unsigned)((N + p.tpb - 1) / p.tpb);
    return p;
}

__device__ double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

__device__ void softmax_row(double *out, const float *l, size_t E)
{
    double m = -INFINITY, z = 0;
    for (size_t e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    for (size_t e = 0; e < E; e++) z += (out[e] = exp((double)l[e] - m));
    for (size_t e = 0; e < E; e++) out[e] /= z;
}

/* sel[0..K): the K largest s[e] with allowed[e] (NULL: all), descending,
 * ties to the lower index (taken: E bytes of scratch) */
__device__ void top_k(int32_t *sel, const double *s, const unsigned char *allowed,
                      unsigned char *taken, size_t E, int K)
{
    for (size_t e = 0; e < E; e++) taken[e] = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (size_t e = 0; e < E; e++) {
            if (taken[e] || (allowed && !allowed[e])) continue;
            if (best < 0 || s[e] > s[best]) best = (int)e;
        }
        sel[k] = best;
        if (best >= 0) taken[best] = 1;
    }
}

/* group-limited routing (kern/cpu/moe.c group_mask); gs: E doubles, sel: E
 * ints, taken: E bytes of scratch */
__device__ void group_mask(unsigned char *allowed, const double *s, size_t E,
                           const mc_moe_route &r, double *gs, int32_t *sel, unsigned char *taken)
{
    size_t G = (size_t)r.num_groups, per = E / G;
    int k = r.topk / r.group_topk;
    for (size_t g = 0; g < G; g++) {
        top_k(sel, s + g * per, NULL, taken, per, k);
        double sum = 0;
        for (int j = 0; j < k; j++) sum += s[g * per + (size_t)sel[j]];
        gs[g] = sum;
    }
    top_k(sel, gs, NULL, taken, G, r.group_topk);
    for (size_t e = 0; e < E; e++) allowed[e] = 0;
    for (int j = 0; j < r.group_topk; j++)
        for (size_t e = 0; e < per; e++) allowed[(size_t)sel[j] * per + e] = 1;
}

/* ------------------------------------------------------------ routing */

/* scratch per token: sc, rs, gs [E] doubles, sel [E] ints, allowed and
 * taken [E] bytes */
size_t route_bytes(size_t E) { return 3 * E * sizeof(double) + E * sizeof(int32_t) + 2 * E; }

__global__ void k_route_fwd(float *probs, int32_t *idx, const float *logits,
                            const float *expert_bias, size_t N, size_t E, mc_moe_route r,
                            size_t bytes)
{
    MC_DYN_SMEM(sm);
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    double *sc = reinterpret_cast<double *>(sm + threadIdx.x * bytes), *rs = sc + E, *gs = rs + E;
    int32_t *tmp = reinterpret_cast<int32_t *>(gs + E);
    unsigned char *allowed = reinterpret_cast<unsigned char *>(tmp + E), *taken = allowed + E;
    const int K = r.topk;
    const float *l = logits + t * E;
    int32_t *sel = idx + t * (size_t)K;
    float *p = probs + t * (size_t)K;
    if (r.sigmoid) {
        for (size_t e = 0; e < E; e++) {
            sc[e] = sigm(l[e]);
            rs[e] = sc[e] + (expert_bias ? (double)expert_bias[e] : 0.0);
        }
    } else if (r.pre_softmax) {
        softmax_row(sc, l, E);
        for (size_t e = 0; e < E; e++) rs[e] = sc[e];
    } else {
        for (size_t e = 0; e < E; e++) rs[e] = sc[e] = l[e];
    }
    if (r.num_groups > 0) group_mask(allowed, rs, E, r, gs, tmp, taken);
    top_k(sel, rs, r.num_groups > 0 ? allowed : NULL, taken, E, K);
    double *v = gs, sum = 0, m = -INFINITY; /* gs is free again: K <= E */
    if (r.sigmoid) {
        for (int k = 0; k < K; k++) sum += (v[k] = sc[sel[k]]);
        if (K > 1)
            for (int k = 0; k < K; k++) v[k] /= sum + 1e-20;
    } else if (r.pre_softmax) {
        for (int k = 0; k < K; k++) v[k] = sc[sel[k]];
    } else {
        for (int k = 0; k < K; k++) m = sc[sel[k]] > m ? sc[sel[k]] : m;
        for (int k = 0; k < K; k++) sum += (v[k] = exp(sc[sel[k]] - m));
        for (int k = 0; k < K; k++) v[k] /= sum;
    }
    const double f = r.scaling_factor > 0 ? r.scaling_factor : 1.0;
    for (int k = 0; k < K; k++) p[k] = (float)(v[k] * f);
}

/* scratch per token: sm, ds [E], dp, v [E] doubles */
size_t route_bwd_bytes(size_t E) { return 4 * E * sizeof(double); }

__global__ void k_route_bwd(float *dlogits, const float *dprobs, const float *logits,
                            const int32_t *idx, size_t N, size_t E, mc_moe_route r, size_t bytes)
{
    MC_DYN_SMEM(smem);
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    double *sm = reinterpret_cast<double *>(smem + threadIdx.x * bytes), *ds = sm + E,
           *dp = ds + E, *v = dp + E;
    const int K = r.topk;
    const double f = r.scaling_factor > 0 ? r.scaling_factor : 1.0;
    const float *l = logits + t * E;
    const int32_t *sel = idx + t * (size_t)K;
    float *dl = dlogits + t * E;
    for (int k = 0; k < K; k++) dp[k] = (double)dprobs[t * (size_t)K + (size_t)k] * f;
    if (r.sigmoid) {
        double S = 0, dot = 0;
        for (int k = 0; k < K; k++) S += (v[k] = sigm(l[sel[k]]));
        S += 1e-20;
        for (int k = 0; k < K; k++) dot += dp[k] * v[k];
        for (int k = 0; k < K; k++) {
            double d = K > 1 ? dp[k] / S - dot / (S * S) : dp[k];
            dl[sel[k]] += (float)(d * v[k] * (1.0 - v[k]));
        }
    } else if (r.pre_softmax) {
        double dot = 0;
        softmax_row(sm, l, E);
        for (int k = 0; k < K; k++) dot += dp[k] * sm[sel[k]];
        for (size_t e = 0; e < E; e++) ds[e] = 0;
        for (int k = 0; k < K; k++) ds[sel[k]] = dp[k];
        for (size_t e = 0; e < E; e++) dl[e] += (float)(sm[e] * (ds[e] - dot));
    } else {
        double m = -INFINITY, sum = 0, dot = 0;
        for (int k = 0; k < K; k++) m = l[sel[k]] > m ? l[sel[k]] : m;
        for (int k = 0; k < K; k++) sum += (v[k] = exp((double)l[sel[k]] - m));
        for (int k = 0; k < K; k++) v[k] /= sum;
        for (int k = 0; k < K; k++) dot += dp[k] * v[k];
        for (int k = 0; k < K; k++) dl[sel[k]] += (float)(v[k] * (dp[k] - dot));
    }
}

/* ------------------------------------------------------------ losses */

/* the aux loss's scores of one token (softmax, or sigmoid over its sum) */
__device__ void aux_scores(double *s, double *sg, const float *l, size_t E, int sig)
{
    if (!sig) {
        softmax_row(s, l, E);
        return;
    }
    double S = 0;
    for (size_t e = 0; e < E; e++) S += (sg[e] = sigm(l[e]));
    for (size_t e = 0; e < E; e++) s[e] = sg[e] / (S + 1e-20);
}

/* per token: its scores S[t, :] (global) and top-K sel[t, :] (scratch per
 * token: sg [E] doubles, taken [E] bytes) */
__global__ void k_aux_scores(double *S, int32_t *sel, const float *logits, size_t N, size_t E,
                             int K, int sig, size_t bytes)
{
    MC_DYN_SMEM(sm);
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    double *sg = reinterpret_cast<double *>(sm + threadIdx.x * bytes);
    unsigned char *taken = reinterpret_cast<unsigned char *>(sg + E);
    aux_scores(S + t * E, sg, logits + t * E, E, sig);
    top_k(sel + t * (size_t)K, S + t * E, NULL, taken, E, K);
}

/* one block: P[g, e] (scores summed in token order), c[g, e] (the tokens
 * that chose e), then thread 0 the loss in the CPU's order into out[0] */
__global__ void k_aux_sum(double *out, double *c, const double *S, const int32_t *sel, size_t G,
                          size_t T, size_t E, size_t K)
{
    for (size_t e = threadIdx.x; e < E; e += blockDim.x)
        for (size_t g = 0; g < G; g++) {
            double P = 0, n = 0;
            for (size_t t = g * T; t < (g + 1) * T; t++) P += S[t * E + e];
            for (size_t t = g * T; t < (g + 1) * T; t++)
                for (size_t k = 0; k < K; k++) n += sel[t * K + k] == (int32_t)e ? 1.0 : 0.0;
            c[g * E + e] = n;
            c[(G + g) * E + e] = P * n; /* the term of the loss */
        }
    __syncthreads();
    if (threadIdx.x) return;
    const double w = (double)E / ((double)K * (double)T * (double)T);
    double total = 0;
    for (size_t g = 0; g < G; g++) {
        double sum = 0;
        for (size_t e = 0; e < E; e++) sum += c[(G + g) * E + e];
        total += w * sum;
    }
    out[0] = total / (double)G;
}

/* per token: dlogits += the gradient (scratch per token: sg, ds [E]) */
__global__ void k_aux_grad(float *dlogits, const float *logits, const double *S, const double *c,
                           size_t N, size_t G, size_t T, size_t E, size_t K, int sig, float grad,
                           size_t bytes)
{
    MC_DYN_SMEM(sm);
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    double *sg = reinterpret_cast<double *>(sm + threadIdx.x * bytes), *ds = sg + E;
    const size_t g = t / T;
    const double w = (double)E / ((double)K * (double)T * (double)T);
    const float *l = logits + t * E;
    float *dl = dlogits + t * E;
    const double *s = S + t * E;
    double dot = 0;
    for (size_t e = 0; e < E; e++) ds[e] = (double)grad * w * c[g * E + e] / (double)G;
    if (!sig) {
        for (size_t e = 0; e < E; e++) dot += ds[e] * s[e];
        for (size_t e = 0; e < E; e++) dl[e] += (float)(s[e] * (ds[e] - dot));
    } else {
        double Ssum = 0;
        for (size_t e = 0; e < E; e++) Ssum += (sg[e] = sigm(l[e]));
        Ssum += 1e-20;
        for (size_t e = 0; e < E; e++) dot += ds[e] * sg[e];
        for (size_t e = 0; e < E; e++) {
            double dsg = ds[e] / Ssum - dot / (Ssum * Ssum);
            dl[e] += (float)(dsg * sg[e] * (1.0 - sg[e]));
        }
    }
}

/* per token: Z[t] = logsumexp, and with dlogits its gradient added */
__global__ void k_z_tok(double *Z, float *dlogits, const float *logits, size_t N, size_t E,
                        float grad)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float *l = logits + t * E;
    double m = -INFINITY, z = 0;
    for (size_t e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    for (size_t e = 0; e < E; e++) z += exp((double)l[e] - m);
    const double lse = m + log(z);
    Z[t] = lse;
    if (!dlogits) return;
    const double a = (double)grad * 2.0 * lse / (double)N;
    for (size_t e = 0; e < E; e++) dlogits[t * E + e] += (float)(a * exp((double)l[e] - m) / z);
}

/* one thread: mean of Z^2 in token order */
__global__ void k_z_sum(double *out, const double *Z, size_t N)
{
    double sum = 0;
    for (size_t t = 0; t < N; t++) sum += Z[t] * Z[t];
    out[0] = sum / (double)N;
}

/* ------------------------------------------------------------ permutation map */

/* chunk p's choices counted by expert: cnt[p, e] */
__global__ void k_pm_hist(int32_t *cnt, const int32_t *idx, size_t NK, size_t E)
{
    MC_DYN_SMEM(sm);
    int *h = reinterpret_cast<int *>(sm);
    for (size_t e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
    __syncthreads();
    const size_t i0 = (size_t)blockIdx.x * CHUNK, i1 = i0 + CHUNK < NK ? i0 + CHUNK : NK;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
        if (idx[i] >= 0) atomicAdd(&h[idx[i]], 1); /* integers: the order does not matter */
    __syncthreads();
    for (size_t e = threadIdx.x; e < E; e += blockDim.x) cnt[blockIdx.x * E + e] = h[e];
}

/* one block: counts[e], each chunk's first row for expert e (base[p, e],
 * in place of cnt), experts' first rows (unpadded, or e block) */
__global__ void k_pm_scan(int32_t *counts, int32_t *cnt, int32_t *off, size_t P, size_t E,
                          size_t block)
{
    for (size_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = 0;
        for (size_t p = 0; p < P; p++) {
            int32_t n = cnt[p * E + e];
            cnt[p * E + e] = run;
            run += n;
        }
        counts[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t o = 0;
        for (size_t e = 0; e < E; e++) {
            off[e] = (int32_t)(block ? (int64_t)(e * block) : o);
            o += counts[e];
        }
    }
    __syncthreads();
    for (size_t e = threadIdx.x; e < E; e += blockDim.x)
        for (size_t p = 0; p < P; p++) cnt[p * E + e] += off[e];
}

/* chunk p's choices in order: perm[i] = the next row of its expert */
__global__ void k_pm_assign(int32_t *perm, const int32_t *idx, const int32_t *base, size_t NK,
                            size_t E)
{
    MC_DYN_SMEM(sm);
    int32_t *run = reinterpret_cast<int32_t *>(sm);
    for (size_t e = threadIdx.x; e < E; e += blockDim.x) run[e] = base[blockIdx.x * E + e];
    __syncthreads();
    if (threadIdx.x) return;
    const size_t i0 = (size_t)blockIdx.x * CHUNK, i1 = i0 + CHUNK < NK ? i0 + CHUNK : NK;
    for (size_t i = i0; i < i1; i++) {
        int32_t e = idx[i];
        perm[i] = e < 0 ? -1 : run[e]++;
    }
}

/* ------------------------------------------------------------ capacity */

/* one thread per choice i of expert e = idx[i]: its rank among e's choices
 * (position: those before it; probs: those with a higher probability, or
 * an equal one and before it), dropped at rank >= capacity. counts[e]: e's
 * choices (an expert within its capacity keeps all without a scan). O(N K)
 * a choice of an expert over capacity; no atomics. */
__global__ void k_capacity(int32_t *kept, const int32_t *idx, const float *probs,
                           const int32_t *counts, size_t NK, size_t capacity, int position)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= NK) return;
    const int32_t e = idx[i];
    kept[i] = e;
    if (e < 0 || (size_t)counts[e] <= capacity) return;
    size_t rank = 0;
    if (position) {
        for (size_t j = 0; j < i && rank < capacity; j++) rank += idx[j] == e;
    } else {
        const float p = probs[i];
        for (size_t j = 0; j < NK && rank < capacity; j++)
            rank += idx[j] == e && (probs[j] > p || (probs[j] == p && j < i));
    }
    if (rank >= capacity) kept[i] = -1;
}

/* ------------------------------------------------------------ the rest */

__global__ void k_bias_update(float *bias, const float *tokens, size_t E, float rate)
{
    float sum = 0.0f;
    for (size_t e = 0; e < E; e++) sum = MC_RN_ADD(sum, tokens[e]);
    float mean = sum / (float)E;
    for (size_t e = 0; e < E; e++) {
        float off = mean - tokens[e];
        bias[e] = MC_RN_ADD(bias[e], MC_RN_MUL((float)((off > 0) - (off < 0)), rate));
    }
}

/* block (t K + k): row t of x to its permuted row */
__global__ void k_permute(float *xp, const float *x, const int32_t *perm, size_t K, size_t C)
{
    const size_t i = blockIdx.x, t = i / K;
    const int32_t row = perm[i];
    if (row < 0) return;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) xp[(size_t)row * C + c] = x[t * C + c];
}

/* block t: dx[t] += dxp[perm[t K + k]] for k in order */
__global__ void k_permute_bwd(float *dx, const float *dxp, const int32_t *perm, size_t K, size_t C)
{
    const size_t t = blockIdx.x;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float d = dx[t * C + c];
        for (size_t k = 0; k < K; k++) {
            const int32_t row = perm[t * K + k];
            if (row >= 0) d = MC_RN_ADD(d, dxp[(size_t)row * C + c]);
        }
        dx[t * C + c] = d;
    }
}

/* block t: y[t] = sum_k probs p yp[perm], k in order */
__global__ void k_unpermute(float *y, const float *yp, const float *probs, const int32_t *perm,
                            size_t K, size_t C)
{
    const size_t t = blockIdx.x;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float o = 0.0f;
        for (size_t k = 0; k < K; k++) {
            const int32_t row = perm[t * K + k];
            if (row >= 0) o = MC_RN_ADD(o, MC_RN_MUL(probs[t * K + k], yp[(size_t)row * C + c]));
        }
        y[t * C + c] = o;
    }
}

/* block t: dyp[perm] = p dy[t]; dprobs = <yp[perm], dy[t]> in double (a
 * fixed tree over the block's threads) */
__global__ void k_unpermute_bwd(float *dyp, float *dprobs, const float *dy, const float *yp,
                                const float *probs, const int32_t *perm, size_t K, size_t C)
{
    __shared__ double red[CT];
    const size_t t = blockIdx.x;
    const float *g = dy + t * C;
    for (size_t k = 0; k < K; k++) {
        const int32_t row = perm[t * K + k]; /* the same for every thread */
        if (row < 0) {
            if (threadIdx.x == 0) dprobs[t * K + k] = 0.0f;
            continue;
        }
        const float *v = yp + (size_t)row * C;
        float *d = dyp + (size_t)row * C;
        const float p = probs[t * K + k];
        double acc = 0;
        for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
            d[c] = MC_RN_MUL(p, g[c]);
            acc += (double)v[c] * (double)g[c];
        }
        red[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned s = CT / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0) dprobs[t * K + k] = (float)red[0];
        __syncthreads(); /* red is read before the next k writes it */
    }
}

#ifndef MC_CUDA_EMULATE
double to_host(mc_cuda *cu, const double *d)
{
    CU_CHECK(cudaMemcpyAsync(cu->host_red, d, sizeof(double), cudaMemcpyDeviceToHost, cu->stream));
    CU_CHECK(cudaStreamSynchronize(cu->stream));
    return cu->host_red[0];
}
#else
double to_host(mc_cuda *, const double *d) { return *d; }
#endif

/* the shared memory per-token kernels ask for, over 48 KiB allowed */
template <class F> void per_token_smem(F kernel, size_t bytes)
{
    if (bytes > (48u << 10)) MC_SMEM_LIMIT(kernel, bytes);
}

} // namespace

extern "C" void mc_cuda_moe_route_fwd(mc_cuda *cu, float *probs, int32_t *idx, const float *logits,
                                      const float *expert_bias, size_t N, size_t E,
                                      const mc_moe_route *route)
{
    if (!N) return;
    per_token p = plan(N, route_bytes(E));
    size_t smem = p.tpb * p.bytes;
    per_token_smem(k_route_fwd, smem);
    MC_LAUNCH(k_route_fwd, p.blocks, p.tpb, smem, probs, idx, logits, expert_bias, N, E, *route,
              p.bytes);
}

extern "C" void mc_cuda_moe_route_bwd(mc_cuda *cu, float *dlogits, const float *dprobs,
                                      const float *logits, const int32_t *idx, size_t N, size_t E,
                                      const mc_moe_route *route)
{
    if (!N) return;
    per_token p = plan(N, route_bwd_bytes(E));
    size_t smem = p.tpb * p.bytes;
    per_token_smem(k_route_bwd, smem);
    MC_LAUNCH(k_route_bwd, p.blocks, p.tpb, smem, dlogits, dprobs, logits, idx, N, E, *route,
              p.bytes);
}

extern "C" double mc_cuda_moe_aux_loss(mc_cuda *cu, float *dlogits, const float *logits, size_t G,
                                       size_t T, size_t E, size_t K, int sigmoid, float grad)
{
    const size_t N = G * T;
    if (!N) return 0.0;
    /* scratch: out, c [2 G E], S [N E] doubles, sel [N K] ints */
    size_t nd = 1 + 2 * G * E + N * E;
    double *out = (double *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK,
                                            nd * sizeof(double) + N * K * sizeof(int32_t));
    double *c = out + 1, *S = c + 2 * G * E;
    int32_t *sel = reinterpret_cast<int32_t *>(S + N * E);
    per_token p = plan(N, E * sizeof(double) + E);
    per_token_smem(k_aux_scores, p.tpb * p.bytes);
    MC_LAUNCH(k_aux_scores, p.blocks, p.tpb, p.tpb * p.bytes, S, sel, logits, N, E, (int)K, sigmoid,
              p.bytes);
    unsigned th = E >= 1024 ? 1024u : (unsigned)((E + 31) / 32 * 32);
    MC_LAUNCH(k_aux_sum, 1u, th, (size_t)0, out, c, S, sel, G, T, E, K);
    double loss = to_host(cu, out);
    if (dlogits) {
        per_token q = plan(N, 2 * E * sizeof(double));
        per_token_smem(k_aux_grad, q.tpb * q.bytes);
        MC_LAUNCH(k_aux_grad, q.blocks, q.tpb, q.tpb * q.bytes, dlogits, logits, S, c, N, G, T, E,
                  K, sigmoid, grad, q.bytes);
    }
    return loss;
}

extern "C" double mc_cuda_moe_z_loss(mc_cuda *cu, float *dlogits, const float *logits, size_t N,
                                     size_t E, float grad)
{
    if (!N) return 0.0;
    double *out = (double *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, (N + 1) * sizeof(double));
    MC_LAUNCH(k_z_tok, (unsigned)((N + 127) / 128), 128u, (size_t)0, out + 1, dlogits, logits, N, E,
              grad);
    MC_LAUNCH(k_z_sum, 1u, 1u, (size_t)0, out, out + 1, N);
    return to_host(cu, out);
}

extern "C" void mc_cuda_moe_permute_map(mc_cuda *cu, int32_t *perm, int32_t *counts,
                                        const int32_t *idx, size_t N, size_t E, size_t K,
                                        size_t block)
{
    const size_t NK = N * K, P = NK ? (NK + CHUNK - 1) / CHUNK : 0;
    int32_t *cnt = (int32_t *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK, (P * E + E) * sizeof(int32_t));
    int32_t *off = cnt + P * E;
    unsigned th = E >= 256 ? 256u : (unsigned)((E + 31) / 32 * 32);
    if (P) MC_LAUNCH(k_pm_hist, (unsigned)P, 256u, E * sizeof(int), cnt, idx, NK, E);
    MC_LAUNCH(k_pm_scan, 1u, th, (size_t)0, counts, cnt, off, P, E, block);
    if (P) MC_LAUNCH(k_pm_assign, (unsigned)P, th, E * sizeof(int32_t), perm, idx, cnt, NK, E);
}

extern "C" void mc_cuda_moe_capacity_drop(mc_cuda *cu, int32_t *kept, const int32_t *idx,
                                          const float *probs, size_t N, size_t E, size_t K,
                                          size_t capacity, int position)
{
    const size_t NK = N * K, P = NK ? (NK + CHUNK - 1) / CHUNK : 0;
    if (!NK) return;
    /* the experts' counts: the permutation map's histogram and scan */
    int32_t *cnt = (int32_t *)mc_cuda_scratch(cu, MC_CU_SCRATCH_WORK,
                                              (P * E + 2 * E) * sizeof(int32_t));
    int32_t *off = cnt + P * E, *counts = off + E;
    unsigned th = E >= 256 ? 256u : (unsigned)((E + 31) / 32 * 32);
    MC_LAUNCH(k_pm_hist, (unsigned)P, 256u, E * sizeof(int), cnt, idx, NK, E);
    MC_LAUNCH(k_pm_scan, 1u, th, (size_t)0, counts, cnt, off, P, E, (size_t)0);
    MC_LAUNCH(k_capacity, (unsigned)((NK + 127) / 128), 128u, (size_t)0, kept, idx, probs, counts, NK,
              capacity, position);
}

extern "C" void mc_cuda_moe_expert_bias_update(mc_cuda *cu, float *bias, const float *tokens,
                                               size_t E, float rate)
{
    if (!E) return;
    MC_LAUNCH(k_bias_update, 1u, 1u, (size_t)0, bias, tokens, E, rate);
}

extern "C" void mc_cuda_moe_permute(mc_cuda *cu, float *xp, const float *x, const int32_t *perm,
                                    size_t N, size_t K, size_t C)
{
    if (!N || !K || !C) return;
    MC_LAUNCH(k_permute, (unsigned)(N * K), CT, (size_t)0, xp, x, perm, K, C);
}

extern "C" void mc_cuda_moe_permute_bwd(mc_cuda *cu, float *dx, const float *dxp,
                                        const int32_t *perm, size_t N, size_t K, size_t C)
{
    if (!N || !K || !C) return;
    MC_LAUNCH(k_permute_bwd, (unsigned)N, CT, (size_t)0, dx, dxp, perm, K, C);
}

extern "C" void mc_cuda_moe_unpermute(mc_cuda *cu, float *y, const float *yp, const float *probs,
                                      const int32_t *perm, size_t N, size_t K, size_t C)
{
    if (!N || !C) return;
    MC_LAUNCH(k_unpermute, (unsigned)N, CT, (size_t)0, y, yp, probs, perm, K, C);
}

extern "C" void mc_cuda_moe_unpermute_bwd(mc_cuda *cu, float *dyp, float *dprobs, const float *dy,
                                          const float *yp, const float *probs,
                                          const int32_t *perm, size_t N, size_t K, size_t C)
{
    if (!N || !K) return;
    MC_LAUNCH(k_unpermute_bwd, (unsigned)N, CT, (size_t)0, dyp, dprobs, dy, yp, probs, perm, K, C);
}

#ifndef MC_CUDA_EMULATE
/* The grouped GEMM: the experts' row blocks through cuBLASLt one by one
 * (linear.cu's GEMMs; an expert with no rows costs nothing). */
extern "C" void mc_cuda_grouped_linear_fwd(mc_cuda *cu, mc_prec prec, float *out, const float *x,
                                           const float *W, const void *Wp, const float *b,
                                           const int64_t *rows, size_t E, size_t Cin, size_t Cout)
{
    (void)Wp; /* see mc_cuda_linear_fwd */
    size_t r0 = 0;
    for (size_t e = 0; e < E; e++) {
        size_t n = (size_t)rows[e];
        if (n)
            mc_cuda_linear_fwd(cu, prec, out + r0 * Cout, x + r0 * Cin, W + e * Cout * Cin, NULL,
                               b ? b + e * Cout : NULL, n, Cin, Cout, 0.0f, 0);
        r0 += n;
    }
}

extern "C" void mc_cuda_grouped_linear_bwd(mc_cuda *cu, mc_prec prec, float *dx, float *dW,
                                           float *db, const float *dout, const float *x,
                                           const float *W, const void *Wp, const int64_t *rows,
                                           size_t E, size_t Cin, size_t Cout)
{
    (void)Wp;
    size_t r0 = 0;
    for (size_t e = 0; e < E; e++) {
        size_t n = (size_t)rows[e];
        if (n)
            mc_cuda_linear_bwd(cu, prec, dx ? dx + r0 * Cin : NULL, dW ? dW + e * Cout * Cin : NULL,
                               db ? db + e * Cout : NULL, dout + r0 * Cout, x + r0 * Cin,
                               W + e * Cout * Cin, NULL, n, Cin, Cout, 0);
        r0 += n;
    }
}
#endif
