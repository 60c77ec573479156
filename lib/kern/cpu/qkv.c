/*
 * qkv.c - split Megatron's fused QKV projection output into q, k, v and the
 * backward that gathers their gradients back. Megatron lays the fused output
 * out per query group: [N, G, (Q/G + 2) * D] = for each group, its Q/G query
 * heads, then the group's key head, then its value head.
 */
#include <assert.h>
#include "kern/cpu/cpu.h"

void mc_cpu_qkv_split(mc_backend *be, float *q, float *k, float *v, const float *qkv, size_t N,
                      size_t Q, size_t G, size_t D)
{
    assert(G > 0 && Q % G == 0);
    size_t hpg = Q / G, row = G * (hpg + 2) * D;
#pragma omp parallel for num_threads(be->threads) if (N * row > 16384) schedule(static)
    for (size_t n = 0; n < N; n++) {
        for (size_t g = 0; g < G; g++) {
            const float *src = qkv + n * row + g * (hpg + 2) * D;
            memcpy(q + (n * Q + g * hpg) * D, src, hpg * D * sizeof(float));
            memcpy(k + (n * G + g) * D, src + hpg * D, D * sizeof(float));
            memcpy(v + (n * G + g) * D, src + (hpg + 1) * D, D * sizeof(float));
        }
    }
}

/* dqkv += the inverse gather of (dq, dk, dv); a NULL part adds nothing */
void mc_cpu_qkv_split_bwd(mc_backend *be, float *dqkv, const float *dq, const float *dk,
                          const float *dv, size_t N, size_t Q, size_t G, size_t D)
{
    assert(G > 0 && Q % G == 0);
    size_t hpg = Q / G, row = G * (hpg + 2) * D;
#pragma omp parallel for num_threads(be->threads) if (N * row > 16384) schedule(static)
    for (size_t n = 0; n < N; n++) {
        for (size_t g = 0; g < G; g++) {
            float *dst = dqkv + n * row + g * (hpg + 2) * D;
            if (dq) {
                const float *s = dq + (n * Q + g * hpg) * D;
                for (size_t i = 0; i < hpg * D; i++) dst[i] += s[i];
            }
            if (dk) {
                const float *s = dk + (n * G + g) * D;
                for (size_t i = 0; i < D; i++) dst[hpg * D + i] += s[i];
            }
            if (dv) {
                const float *s = dv + (n * G + g) * D;
                for (size_t i = 0; i < D; i++) dst[(hpg + 1) * D + i] += s[i];
            }
        }
    }
}
