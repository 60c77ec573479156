/*
 * test_kern_kd.c - the distillation kernels (kd_sums, kd_loss, kd_bwd)
 * against float64: the KL at a temperature, the gradient of the mixed loss
 * (1 - alpha) CE + alpha tau^2 KL against finite differences, the
 * vocabulary split over 2 "ranks" combined as the all-reduces would, in
 * place over the logits, and the same bits for 1 and 2 threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_test.h"
#include "tap.h"

#define N 7
#define V 300 /* more than one 16-lane block, with a tail */
#define TAU 2.0
#define ALPHA 0.3

typedef struct {
    const int32_t *tg;
    double *s, *t; /* [N, V] */
    double w[N];   /* per-row weights of the loss */
} kd_ctx;

static void ref_row(const double *l, double tau, double *logp)
{
    double m = -INFINITY, z = 0;
    for (size_t j = 0; j < V; j++) m = fmax(m, l[j] / tau);
    for (size_t j = 0; j < V; j++) z += exp(l[j] / tau - m);
    for (size_t j = 0; j < V; j++) logp[j] = l[j] / tau - m - log(z);
}

/* per row: KL(p_t || p_s) at TAU, and the cross-entropy at 1 */
static void ref_kd(const kd_ctx *c, double *kl, double *ce)
{
    double lt[V], ls[V], l1[V];
    for (size_t i = 0; i < N; i++) {
        ref_row(c->t + i * V, TAU, lt);
        ref_row(c->s + i * V, TAU, ls);
        ref_row(c->s + i * V, 1.0, l1);
        double k = 0;
        for (size_t j = 0; j < V; j++) k += exp(lt[j]) * (lt[j] - ls[j]);
        kl[i] = c->tg[i] < 0 ? 0 : k;
        ce[i] = c->tg[i] < 0 ? 0 : -l1[c->tg[i]];
    }
}

static double mixed_loss(void *p)
{
    kd_ctx *c = p;
    double kl[N], ce[N], L = 0;
    ref_kd(c, kl, ce);
    for (size_t i = 0; i < N; i++) L += c->w[i] * ((1 - ALPHA) * ce[i] + ALPHA * TAU * TAU * kl[i]);
    return L;
}

/* the forward steps on columns [v0, v0 + vl) of s and t, maxima given */
static void sums_of(mc_backend *be, float *sums, const float *s, const float *t, const float *sm,
                    const float *tm, size_t v0, size_t vl)
{
    float *a = kt_falloc(N * vl), *b = kt_falloc(N * vl);
    for (size_t i = 0; i < N; i++) {
        memcpy(a + i * vl, s + i * V + v0, vl * 4);
        memcpy(b + i * vl, t + i * V + v0, vl * 4);
    }
    mc_k_kd_sums(be, sums, a, b, sm, tm, N, vl, (float)(1.0 / TAU));
    free(a), free(b);
}

int main(void)
{
    mc_backend *be = kt_backend(1), *be2 = kt_backend(2);
    int32_t tg[N] = {3, 299, -1, 150, 149, 0, 42};
    kt_rng r = {77};
    float *s = kt_falloc(N * V), *t = kt_falloc(N * V);
    kt_fill(&r, s, N * V, -6, 6), kt_fill(&r, t, N * V, -6, 6);
    float sm[N], tm[N], se[N], tl[N], sums[3 * N], kl[N];
    mc_k_xent_max(be, sm, s, N, V);
    mc_k_xent_max(be, tm, t, N, V);
    mc_k_xent_sumexp(be, se, tl, s, sm, tg, 0, N, V);
    mc_k_kd_sums(be, sums, s, t, sm, tm, N, V, (float)(1.0 / TAU));
    mc_k_kd_loss(be, kl, sums, tg, N);
    kd_ctx c = {tg, kt_todouble(s, N * V), kt_todouble(t, N * V), {0}};
    double rkl[N], rce[N];
    ref_kd(&c, rkl, rce);
    double ek = kt_err(kl, rkl, N);
    TAP_OK(ek < 1e-5 && kl[2] == 0,
           "kd KL at tau 2 vs float64: %.2e < 1e-5 (of the largest KL); an ignored row is 0", ek);

    /* TP = 2: the halves' maxima combined with MAX, their sums with SUM */
    size_t H = V / 2;
    float m0[N], m1[N], gsm[N], gtm[N], s0[3 * N], s1[3 * N], gs[3 * N], kl2[N];
    float *h = kt_falloc(N * H);
    for (int side = 0; side < 2; side++) {
        for (size_t i = 0; i < N; i++) memcpy(h + i * H, s + i * V + side * H, H * 4);
        mc_k_xent_max(be, side ? m1 : m0, h, N, H);
    }
    for (size_t i = 0; i < N; i++) gsm[i] = fmaxf(m0[i], m1[i]);
    for (int side = 0; side < 2; side++) {
        for (size_t i = 0; i < N; i++) memcpy(h + i * H, t + i * V + side * H, H * 4);
        mc_k_xent_max(be, side ? m1 : m0, h, N, H);
    }
    for (size_t i = 0; i < N; i++) gtm[i] = fmaxf(m0[i], m1[i]);
    sums_of(be, s0, s, t, gsm, gtm, 0, H);
    sums_of(be, s1, s, t, gsm, gtm, H, H);
    for (size_t i = 0; i < 3 * N; i++) gs[i] = s0[i] + s1[i];
    mc_k_kd_loss(be, kl2, gs, tg, N);
    double e2 = kt_err(kl2, rkl, N);
    TAP_OK(e2 < 1e-5, "kd KL over 2 vocab shards vs float64: %.2e < 1e-5", e2);

    /* backward: scale 1 per row (w = 1), vs FD of the mixed loss */
    for (size_t i = 0; i < N; i++) c.w[i] = 1.0;
    float *d = kt_falloc(N * V);
    mc_k_kd_bwd(be, d, s, t, sm, se, tm, sums, tg, 0, N, V, (float)(1.0 / TAU), (float)(1 - ALPHA),
                (float)(ALPHA * TAU));
    double eg = kt_fd_check(mixed_loss, &c, c.s, N * V, d, NULL, SIZE_MAX, 1);
    int zero = 1;
    for (size_t j = 0; j < V; j++) zero &= d[2 * V + j] == 0;
    TAP_OK(eg < 1e-5 && zero,
           "kd bwd of (1-a) CE + a tau^2 KL vs FD: %.2e < 1e-5; ignored row has zero gradient", eg);
    float *in = kt_copy(s, N * V);
    mc_k_kd_bwd(be, in, in, t, sm, se, tm, sums, tg, 0, N, V, (float)(1.0 / TAU),
                (float)(1 - ALPHA), (float)(ALPHA * TAU));
    TAP_OK(!memcmp(in, d, N * V * 4), "kd bwd in place over the logits: same bytes");
    /* sharded backward: the matching columns of the whole */
    float *g = kt_falloc(N * H), *hb = kt_falloc(N * H);
    double es = 0;
    for (int side = 0; side < 2; side++) {
        for (size_t i = 0; i < N; i++) {
            memcpy(h + i * H, s + i * V + side * H, H * 4);
            memcpy(hb + i * H, t + i * V + side * H, H * 4);
        }
        float gse[N], gtl[N], ose[N], otl[N];
        mc_k_xent_sumexp(be, gse, gtl, h, gsm, tg, (int64_t)(side * H), N, H);
        for (size_t i = 0; i < N; i++) memcpy(h + i * H, s + i * V + (1 - side) * H, H * 4);
        mc_k_xent_sumexp(be, ose, otl, h, gsm, tg, (int64_t)((1 - side) * H), N, H);
        for (size_t i = 0; i < N; i++) gse[i] += ose[i];
        for (size_t i = 0; i < N; i++) memcpy(h + i * H, s + i * V + side * H, H * 4);
        mc_k_kd_bwd(be, g, h, hb, gsm, gse, gtm, gs, tg, (int64_t)(side * H), N, H,
                    (float)(1.0 / TAU), (float)(1 - ALPHA), (float)(ALPHA * TAU));
        for (size_t i = 0; i < N; i++)
            for (size_t j = 0; j < H; j++)
                es = fmax(es, fabs(g[i * H + j] - d[i * V + side * H + j]));
    }
    TAP_OK(es < 1e-6, "kd bwd over 2 shards matches the unsplit gradient: %.2e < 1e-6", es);

    /* threads: the same bits (large enough for the parallel loops) */
    size_t Nb = 64, Vb = 1000;
    float *bs = kt_falloc(Nb * Vb), *bt = kt_falloc(Nb * Vb), bm[64], btm[64], bse[64], btl[64];
    int32_t btg[64];
    kt_fill(&r, bs, Nb * Vb, -5, 5), kt_fill(&r, bt, Nb * Vb, -5, 5);
    for (size_t i = 0; i < Nb; i++) btg[i] = (int32_t)(i * 13 % Vb);
    mc_k_xent_max(be, bm, bs, Nb, Vb);
    mc_k_xent_max(be, btm, bt, Nb, Vb);
    mc_k_xent_sumexp(be, bse, btl, bs, bm, btg, 0, Nb, Vb);
    float bsum1[192], bsum2[192], *bd1 = kt_falloc(Nb * Vb), *bd2 = kt_falloc(Nb * Vb);
    mc_k_kd_sums(be, bsum1, bs, bt, bm, btm, Nb, Vb, 0.5f);
    mc_k_kd_sums(be2, bsum2, bs, bt, bm, btm, Nb, Vb, 0.5f);
    mc_k_kd_bwd(be, bd1, bs, bt, bm, bse, btm, bsum1, btg, 0, Nb, Vb, 0.5f, 0.5f, 1.0f);
    mc_k_kd_bwd(be2, bd2, bs, bt, bm, bse, btm, bsum1, btg, 0, Nb, Vb, 0.5f, 0.5f, 1.0f);
    TAP_OK(!memcmp(bsum1, bsum2, sizeof bsum1) && !memcmp(bd1, bd2, Nb * Vb * 4),
           "kd sums and bwd: the same bits on 1 and 2 threads");

    free(s), free(t), free(c.s), free(c.t), free(h), free(d), free(in), free(g), free(hb);
    free(bs), free(bt), free(bd1), free(bd2);
    mc_backend_free(be);
    mc_backend_free(be2);
    return tap_done();
}
