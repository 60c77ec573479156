/*
 * kern_test.h - shared helpers of the kernel tests (test_kern_*.c): a seeded
 * random generator, conversions between float and double arrays, error
 * metrics, and central finite differences of a float64 reference loss.
 *
 * Error metric used throughout ("normwise relative error"):
 *   err(got, ref) = max_i |got_i - ref_i| / max_i |ref_i|
 * It is scale-free, and unlike an elementwise relative error it does not
 * blow up on entries that happen to be near zero.
 */
#ifndef MC_KERN_TEST_H
#define MC_KERN_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "mc/kern.h"
#include "tap.h"

typedef struct {
    uint64_t s;
} kt_rng;

static inline uint64_t kt_next(kt_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [lo, hi) */
static inline double kt_unif(kt_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(kt_next(r) >> 11) * 0x1p-53);
}
static inline void kt_fill(kt_rng *r, float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)kt_unif(r, lo, hi);
}

static inline float *kt_falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) abort();
    return p;
}
static inline double *kt_dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) abort();
    return p;
}
static inline double *kt_todouble(const float *x, size_t n)
{
    double *d = kt_dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static inline float *kt_copy(const float *x, size_t n)
{
    float *p = kt_falloc(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}

/* max_i |got_i - ref_i| / max_i |ref_i| (see the top of the file) */
static inline double kt_err(const float *got, const double *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}
/* the same for got - base (a gradient added onto known contents) */
static inline double kt_err_added(const float *got, const float *base, const double *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(((double)got[i] - (double)base[i]) - ref[i]);
        if (!(d <= md)) md = d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}

/* A float64 reference loss L = sum(dout * f(inputs)) evaluated on ctx. */
typedef double (*kt_loss_fn)(void *ctx);

/* Central difference dL/dx[i] with step h (double precision). */
static inline double kt_fd(kt_loss_fn f, void *ctx, double *x, size_t i, double h)
{
    double s = x[i];
    x[i] = s + h;
    double lp = f(ctx);
    x[i] = s - h;
    double lm = f(ctx);
    x[i] = s;
    return (lp - lm) / (2 * h);
}

/* Finite-difference check of an analytic gradient for `count` elements of x
 * (all of them when count >= n, else a seeded random sample): returns the
 * normwise relative error of (grad - base) against the FD values. */
static inline double kt_fd_check(kt_loss_fn f, void *ctx, double *x, size_t n, const float *grad,
                                 const float *base, size_t count, uint64_t seed)
{
    kt_rng r = {seed};
    size_t m = count < n ? count : n;
    double md = 0, mr = 0;
    for (size_t k = 0; k < m; k++) {
        size_t i = count < n ? (size_t)(kt_next(&r) % n) : k;
        double fd = kt_fd(f, ctx, x, i, 1e-6);
        double g = (double)grad[i] - (base ? (double)base[i] : 0.0);
        double d = fabs(g - fd);
        if (!(d <= md)) md = d;
        if (fabs(fd) > mr) mr = fabs(fd);
    }
    return mr > 0 ? md / mr : md;
}

static inline double kt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline mc_backend *kt_backend(int threads)
{
    mc_backend *be = NULL;
    mc_error err;
    if (mc_backend_cpu_new(threads, &be, &err) != MC_OK) {
        printf("Bail out! backend: %s\n", err.msg);
        exit(1);
    }
    return be;
}

/* out[i,h,:] for the rows at positions pos0 + i, keys 0..pos0+i of the
 * cache kc, vc [L,G,D] (float64): the attention kernels' reference (test_kern_attn_kv,
 * test_kern_attn_paged). */
static inline void kt_ref_kv(double *out, const double *q, const double *kc, const double *vc,
                             size_t n, size_t pos0, size_t Q, size_t G, size_t D, double scale)
{
    size_t hpg = Q / G, L = pos0 + n;
    double *s = kt_dalloc(L);
    for (size_t i = 0; i < n; i++)
        for (size_t h = 0; h < Q; h++) {
            size_t g = h / hpg, p = pos0 + i;
            const double *qr = q + (i * Q + h) * D;
            double mx = -INFINITY, sum = 0;
            for (size_t j = 0; j <= p; j++) {
                double d = 0;
                for (size_t e = 0; e < D; e++) d += qr[e] * kc[(j * G + g) * D + e];
                s[j] = d * scale;
                if (s[j] > mx) mx = s[j];
            }
            for (size_t j = 0; j <= p; j++) sum += exp(s[j] - mx);
            double *o = out + (i * Q + h) * D;
            for (size_t e = 0; e < D; e++) o[e] = 0;
            for (size_t j = 0; j <= p; j++)
                for (size_t e = 0; e < D; e++)
                    o[e] += exp(s[j] - mx) / sum * vc[(j * G + g) * D + e];
        }
    free(s);
}

#endif
