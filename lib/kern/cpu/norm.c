/*
 * norm.c - LayerNorm and RMSNorm over the last dimension, forward and
 * backward. Row statistics are accumulated in double (cheap next to the
 * GEMMs, and it keeps large C accurate), in 16 fixed lanes (lane_sums).
 *
 * The backward runs in two passes: dx row by row (rows split over threads),
 * then dw/db column block by column block, each block summing over the rows
 * in order, so the parameter gradients need no atomics and their bits do not
 * depend on the thread count.
 */
#include <math.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"

#define LANES 16
#define INLINE static inline __attribute__((always_inline))

/* Row sums in double over LANES independent accumulators (lane j takes the
 * elements j, j + LANES, ...), added in lane order at the end: a fixed
 * order, so the same bits on every CPU and thread count, that vectorizes,
 * where one running sum would wait on each add. */

/* sum_c (x_c - mu)^2 (mu = 0: sum of squares) and, through *sum, sum_c x_c */
INLINE double lane_sums(const float *x, double mu, size_t C, double *sum)
{
    double a[LANES] = {0}, q[LANES] = {0};
    size_t c = 0;
    for (; c + LANES <= C; c += LANES)
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) {
            double d = x[c + j] - mu;
            a[j] += x[c + j];
            q[j] += d * d;
        }
    for (size_t j = 0; c < C; c++, j++) {
        double d = x[c] - mu;
        a[j] += x[c];
        q[j] += d * d;
    }
    double s = 0.0, ss = 0.0;
    for (size_t j = 0; j < LANES; j++) s += a[j], ss += q[j];
    if (sum) *sum = s;
    return ss;
}

MC_ISA_BODY void ln_fwd_row_body(float *o, float *mean, float *rstd, const float *xi,
                                 const float *w, const float *b, size_t C, float eps,
                                 int isa MC_ISA_UNUSED)
{
    double s;
    lane_sums(xi, 0.0, C, &s);
    double mu = s / (double)C, var = lane_sums(xi, mu, C, NULL);
    float m = (float)mu, r = (float)(1.0 / sqrt(var / (double)C + (double)eps));
    if (b) {
#pragma omp simd
        for (size_t c = 0; c < C; c++) o[c] = (xi[c] - m) * r * w[c] + b[c];
    } else {
#pragma omp simd
        for (size_t c = 0; c < C; c++) o[c] = (xi[c] - m) * r * w[c] + 0.0f;
    }
    *mean = m;
    *rstd = r;
}
MC_ISA_VARIANTS_VOID(ln_fwd_row,
                     (float *o, float *mean, float *rstd, const float *xi, const float *w,
                      const float *b, size_t C, float eps),
                     (o, mean, rstd, xi, w, b, C, eps))

MC_ISA_BODY void ln_bwd_row_body(float *d, const float *xi, const float *gi, const float *w,
                                 float m, float r, size_t C, int isa MC_ISA_UNUSED)
{
    double a[LANES] = {0}, q[LANES] = {0};
    size_t c = 0;
    for (; c + LANES <= C; c += LANES)
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) {
            double g = (double)gi[c + j] * w[c + j];
            a[j] += g;
            q[j] += g * ((xi[c + j] - m) * r);
        }
    for (size_t j = 0; c < C; c++, j++) {
        double g = (double)gi[c] * w[c];
        a[j] += g;
        q[j] += g * ((xi[c] - m) * r);
    }
    double sg = 0.0, sgx = 0.0;
    for (size_t j = 0; j < LANES; j++) sg += a[j], sgx += q[j];
    float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
#pragma omp simd
    for (size_t e = 0; e < C; e++) {
        float xhat = (xi[e] - m) * r;
        d[e] += r * (gi[e] * w[e] - mg - xhat * mgx);
    }
}
MC_ISA_VARIANTS_VOID(ln_bwd_row,
                     (float *d, const float *xi, const float *gi, const float *w, float m, float r,
                      size_t C),
                     (d, xi, gi, w, m, r, C))

MC_ISA_BODY void rms_fwd_row_body(float *o, float *rstd, const float *xi, const float *w, size_t C,
                                  float eps, int isa MC_ISA_UNUSED)
{
    double ss = lane_sums(xi, 0.0, C, NULL);
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
#pragma omp simd
    for (size_t c = 0; c < C; c++) o[c] = xi[c] * r * w[c];
    *rstd = r;
}
MC_ISA_VARIANTS_VOID(rms_fwd_row,
                     (float *o, float *rstd, const float *xi, const float *w, size_t C, float eps),
                     (o, rstd, xi, w, C, eps))

MC_ISA_BODY void rms_bwd_row_body(float *d, const float *xi, const float *gi, const float *w,
                                  float r, size_t C, int isa MC_ISA_UNUSED)
{
    double q[LANES] = {0};
    size_t c = 0;
    for (; c + LANES <= C; c += LANES)
#pragma omp simd
        for (size_t j = 0; j < LANES; j++) q[j] += (double)gi[c + j] * w[c + j] * xi[c + j];
    for (size_t j = 0; c < C; c++, j++) q[j] += (double)gi[c] * w[c] * xi[c];
    double sgx = 0.0;
    for (size_t j = 0; j < LANES; j++) sgx += q[j];
    float k = (float)(sgx / (double)C) * r * r;
#pragma omp simd
    for (size_t e = 0; e < C; e++) d[e] += r * (gi[e] * w[e] - xi[e] * k);
}
MC_ISA_VARIANTS_VOID(rms_bwd_row,
                     (float *d, const float *xi, const float *gi, const float *w, float r,
                      size_t C),
                     (d, xi, gi, w, r, C))

#define COL_BLOCK 64
#define PAR_MIN 16384

/* mean = sum_c x / C;  rstd = 1 / sqrt(sum_c (x - mean)^2 / C + eps)
 * out = (x - mean) rstd w + b */
void mc_cpu_layernorm_fwd(mc_backend *be, float *out, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, size_t N, size_t C, float eps,
                          mc_prec round)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        ln_fwd_row_for(be->isa)(out + i * C, mean + i, rstd + i, x + i * C, w, b, C, eps);
        mc_cpu_round_here(be, out + i * C, C, round);
    }
}

/* xhat = (x - mean) rstd, g = dout w:
 * dx += rstd (g - mean_c(g) - xhat mean_c(g xhat));  dw += sum_rows dout xhat;
 * db += sum_rows dout */
void mc_cpu_layernorm_bwd(mc_backend *be, float *dx, float *dw, float *db, const float *dout,
                          const float *x, const float *w, const float *mean, const float *rstd,
                          size_t N, size_t C)
{
    if (dx) {
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
        for (size_t i = 0; i < N; i++)
            ln_bwd_row_for(be->isa)(dx + i * C, x + i * C, dout + i * C, w, mean[i], rstd[i], C);
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
#pragma omp simd
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
                        size_t N, size_t C, float eps, mc_prec round)
{
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
    for (size_t i = 0; i < N; i++) {
        rms_fwd_row_for(be->isa)(out + i * C, rstd + i, x + i * C, w, C, eps);
        mc_cpu_round_here(be, out + i * C, C, round);
    }
}

/* g = dout w:  dx += rstd (g - x rstd^2 mean_c(g x));  dw += sum_rows dout x rstd */
void mc_cpu_rmsnorm_bwd(mc_backend *be, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, size_t N, size_t C)
{
    if (dx) {
#pragma omp parallel for num_threads(be->threads) if (N * C > PAR_MIN) schedule(static)
        for (size_t i = 0; i < N; i++)
            rms_bwd_row_for(be->isa)(dx + i * C, x + i * C, dout + i * C, w, rstd[i], C);
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
#pragma omp simd
            for (size_t c = c0; c < c1; c++) aw[c - c0] += gi[c] * xi[c] * r;
        }
        for (size_t c = c0; c < c1; c++) dw[c] += aw[c - c0];
    }
}
