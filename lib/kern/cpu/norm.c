/*
 * norm.c - LayerNorm and RMSNorm over the last dimension, forward and
 * backward. Row statistics are accumulated in double (cheap next to the
 * GEMMs, and it keeps large C accurate).
 *
 * The backward runs in two passes: dx row by row (rows split over threads),
 * then dw/db column block by column block, each block summing over the rows
 * in order, so the parameter gradients need no atomics and their bits do not
 * depend on the thread count.
 */
#include <math.h>
#include "kern/cpu/cpu.h"

#define COL_BLOCK 64
#define PAR_MIN 16384

/* mean = sum_c x / C;  rstd = 1 / sqrt(sum_c (x - mean)^2 / C + eps)
 * out = (x - mean) rstd w + b */
void mc_cpu_layernorm_fwd(mc_backend *be, float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, size_t N, size_t C, float eps) {
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *xi = x + i * C;
        double s = 0.0;
        for (size_t c = 0; c < C; c++) s += xi[c];
        double mu = s / (double)C, var = 0.0;
        for (size_t c = 0; c < C; c++) {
            double d = xi[c] - mu;
            var += d * d;
        }
        float m = (float)mu, r = (float)(1.0 / sqrt(var / (double)C + (double)eps));
        float *o = out + i * C;
        for (size_t c = 0; c < C; c++) o[c] = (xi[c] - m) * r * w[c] + (b ? b[c] : 0.0f);
        mean[i] = m;
        rstd[i] = r;
    }
}

/* xhat = (x - mean) rstd, g = dout w:
 * dx += rstd (g - mean_c(g) - xhat mean_c(g xhat));  dw += sum_rows dout xhat;
 * db += sum_rows dout */
void mc_cpu_layernorm_bwd(mc_backend *be, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *w, const float *mean, const float *rstd,
                        size_t N, size_t C) {
    if (dx) {
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
        for (size_t i = 0; i < N; i++) {
            const float *xi = x + i * C, *gi = dout + i * C;
            float m = mean[i], r = rstd[i];
            double sg = 0.0, sgx = 0.0;
            for (size_t c = 0; c < C; c++) {
                double g = (double)gi[c] * w[c];
                sg += g;
                sgx += g * ((xi[c] - m) * r);
            }
            float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
            float *d = dx + i * C;
            for (size_t c = 0; c < C; c++) {
                float xhat = (xi[c] - m) * r;
                d[c] += r * (gi[c] * w[c] - mg - xhat * mgx);
            }
        }
    }
    if (!dw && !db) return;
    size_t nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t cb = 0; cb < nblk; cb++) {
        size_t c0 = cb * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        float aw[COL_BLOCK] = {0}, ab[COL_BLOCK] = {0};
        for (size_t i = 0; i < N; i++) {
            const float *xi = x + i * C, *gi = dout + i * C;
            float m = mean[i], r = rstd[i];
            for (size_t c = c0; c < c1; c++) {
                aw[c - c0] += gi[c] * ((xi[c] - m) * r);
                ab[c - c0] += gi[c];
            }
        }
        for (size_t c = c0; c < c1; c++) {
            if (dw) dw[c] += aw[c - c0];
            if (db) db[c] += ab[c - c0];
        }
    }
}

/* rstd = 1 / sqrt(sum_c x^2 / C + eps);  out = x rstd w */
void mc_cpu_rmsnorm_fwd(mc_backend *be, float *out, float *rstd, const float *x, const float *w,
                      size_t N, size_t C, float eps) {
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *xi = x + i * C;
        double ss = 0.0;
        for (size_t c = 0; c < C; c++) ss += (double)xi[c] * xi[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        float *o = out + i * C;
        for (size_t c = 0; c < C; c++) o[c] = xi[c] * r * w[c];
        rstd[i] = r;
    }
}

/* g = dout w:  dx += rstd (g - x rstd^2 mean_c(g x));  dw += sum_rows dout x rstd */
void mc_cpu_rmsnorm_bwd(mc_backend *be, float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, size_t N, size_t C) {
    if (dx) {
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
        for (size_t i = 0; i < N; i++) {
            const float *xi = x + i * C, *gi = dout + i * C;
            float r = rstd[i];
            double sgx = 0.0;
            for (size_t c = 0; c < C; c++) sgx += (double)gi[c] * w[c] * xi[c];
            float k = (float)(sgx / (double)C) * r * r;
            float *d = dx + i * C;
            for (size_t c = 0; c < C; c++) d[c] += r * (gi[c] * w[c] - xi[c] * k);
        }
    }
    if (!dw) return;
    size_t nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t cb = 0; cb < nblk; cb++) {
        size_t c0 = cb * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        float aw[COL_BLOCK] = {0};
        for (size_t i = 0; i < N; i++) {
            const float *xi = x + i * C, *gi = dout + i * C;
            float r = rstd[i];
            for (size_t c = c0; c < c1; c++) aw[c - c0] += gi[c] * xi[c] * r;
        }
        for (size_t c = c0; c < c1; c++) dw[c] += aw[c - c0];
    }
}
