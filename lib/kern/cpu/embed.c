/*
 * embed.c - vocab-parallel token embedding and learned absolute position
 * embedding, forward and backward.
 *
 * The backward of a lookup scatters rows of dout into the table; two tokens
 * with the same id hit the same row, so the work is split over columns (each
 * thread owns a slice of every row) and rows are visited in order: no races,
 * and the same sum order for any thread count.
 */
#include <assert.h>
#include <stdint.h>
#include "kern/cpu/cpu.h"

/* columns per work item of the backward: a cache line's worth and more */
#define COL_BLOCK 64

/* out[i,:] = wte[ids[i]-v0,:] if v0 <= ids[i] < v0+vl, else 0 */
void mc_cpu_embed_fwd(mc_backend *be, float *out, const int32_t *ids, size_t N, const float *wte,
                      int64_t v0, int64_t vl, size_t C)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > 16384) schedule(static)
    for (size_t i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        float *o = out + i * C;
        if (r >= 0 && r < vl)
            memcpy(o, wte + (size_t)r * C, C * sizeof(float));
        else
            memset(o, 0, C * sizeof(float));
    }
}

/* dwte[ids[i]-v0,:] += dout[i,:] for the ids in this rank's range */
void mc_cpu_embed_bwd(mc_backend *be, float *dwte, const float *dout, const int32_t *ids, size_t N,
                      int64_t v0, int64_t vl, size_t C)
{
    size_t nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(be->threads) if (N * C > 16384) schedule(static)
    for (size_t cb = 0; cb < nblk; cb++) {
        size_t c0 = cb * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (size_t i = 0; i < N; i++) {
            int64_t r = (int64_t)ids[i] - v0;
            if (r < 0 || r >= vl) continue;
            float *d = dwte + (size_t)r * C;
            const float *g = dout + i * C;
#pragma omp simd
            for (size_t c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

/* out[b,t,:] += wpe[pos0+t,:], or wpe[pos[b T + t],:] */
void mc_cpu_posemb_fwd(mc_backend *be, float *out, const float *wpe, size_t B, size_t T, size_t C,
                       size_t pos0, const int32_t *pos)
{
#pragma omp parallel for num_threads(be->threads) if (B * T * C > 16384) schedule(static)
    for (size_t bt = 0; bt < B * T; bt++) {
        const float *p = wpe + (pos ? (size_t)pos[bt] : pos0 + bt % T) * C;
        float *o = out + bt * C;
        for (size_t c = 0; c < C; c++) o[c] += p[c];
    }
}

/* dwpe[pos0+t,:] += sum_b dout[b,t,:]  (each t owned by one thread, b in order).
 * With per-token positions, the embedding's backward with the positions as
 * ids: rows in (b, t) order, which is the order above for pos = pos0 + t. */
void mc_cpu_posemb_bwd(mc_backend *be, float *dwpe, const float *dout, size_t B, size_t T, size_t C,
                       size_t pos0, const int32_t *pos)
{
    if (pos) {
        mc_cpu_embed_bwd(be, dwpe, dout, pos, B * T, 0, INT64_MAX, C);
        return;
    }
#pragma omp parallel for num_threads(be->threads) if (B * T * C > 16384) schedule(static)
    for (size_t t = 0; t < T; t++) {
        float *d = dwpe + (pos0 + t) * C;
        for (size_t b = 0; b < B; b++) {
            const float *g = dout + (b * T + t) * C;
            for (size_t c = 0; c < C; c++) d[c] += g[c];
        }
    }
}
