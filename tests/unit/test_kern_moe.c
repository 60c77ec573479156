/*
 * test_kern_moe.c - the mixture-of-experts kernels against float64: the
 * router's choice and probabilities in every mode (softmax, pre-softmax,
 * sigmoid with an expert bias, group-limited, scaled) and their backward,
 * the aux (micro-batch and per-sequence) and z losses and their gradients,
 * the permutation by expert and the weighted unpermutation, the grouped
 * GEMM (an expert with no rows included): every backward against central
 * finite differences of a float64 reference, and the same bits for 1 and
 * 2 threads. The grouped GEMM in bf16 (native, and emulated where the CPU
 * has it native) against float64 products of the bf16-rounded operands,
 * with and without the prepared weight, on both of its backward schedules.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_test.h"
#include "kern/backend.h" /* dnnl_bf16: the emulated bf16 form on a native CPU */
#include "kern/fpconv.h"
#include "tap.h"

#define N 12
#define E 8
#define C 5

/* ------------------------------------------------------------ routing reference */

typedef struct {
    const mc_moe_route *r;
    double *l;         /* [N, E] logits */
    const double *eb;  /* expert bias or NULL */
    const int32_t *fx; /* a fixed choice [N, K] (the backward's), or NULL */
    double *w;         /* [N, K] weights of the loss */
} route_ctx;

static double dsig(double x) { return 1.0 / (1.0 + exp(-x)); }

static void dsoftmax(double *o, const double *l, int n)
{
    double m = -INFINITY, z = 0;
    for (int e = 0; e < n; e++) m = fmax(m, l[e]);
    for (int e = 0; e < n; e++) z += (o[e] = exp(l[e] - m));
    for (int e = 0; e < n; e++) o[e] /= z;
}

/* the k best of s among allowed, descending, ties to the lower index */
static void dtopk(int32_t *sel, const double *s, const int *allowed, int n, int k)
{
    int taken[64] = {0};
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int e = 0; e < n; e++)
            if (!taken[e] && (!allowed || allowed[e]) && (b < 0 || s[e] > s[b])) b = e;
        sel[j] = b;
        taken[b] = 1;
    }
}

static void ref_route(const route_ctx *c, double *probs, int32_t *idx)
{
    const mc_moe_route *r = c->r;
    int K = r->topk;
    for (int t = 0; t < N; t++) {
        const double *l = c->l + t * E;
        double sc[E], rs[E];
        int32_t *sel = idx + t * K;
        if (r->sigmoid)
            for (int e = 0; e < E; e++) sc[e] = dsig(l[e]), rs[e] = sc[e] + (c->eb ? c->eb[e] : 0);
        else if (r->pre_softmax)
            dsoftmax(sc, l, E), memcpy(rs, sc, sizeof rs);
        else
            for (int e = 0; e < E; e++) sc[e] = rs[e] = l[e];
        int allowed[E];
        if (r->num_groups) {
            int per = E / r->num_groups, kk = K / r->group_topk;
            double gs[E];
            int32_t gsel[E];
            for (int g = 0; g < r->num_groups; g++) {
                dtopk(gsel, rs + g * per, NULL, per, kk);
                gs[g] = 0;
                for (int j = 0; j < kk; j++) gs[g] += rs[g * per + gsel[j]];
            }
            dtopk(gsel, gs, NULL, r->num_groups, r->group_topk);
            for (int e = 0; e < E; e++) allowed[e] = 0;
            for (int j = 0; j < r->group_topk; j++)
                for (int e = 0; e < per; e++) allowed[gsel[j] * per + e] = 1;
        }
        if (c->fx)
            memcpy(sel, c->fx + t * K, (size_t)K * sizeof *sel);
        else
            dtopk(sel, rs, r->num_groups ? allowed : NULL, E, K);
        double v[E], sum = 0;
        if (r->sigmoid) {
            for (int k = 0; k < K; k++) sum += (v[k] = sc[sel[k]]);
            if (K > 1)
                for (int k = 0; k < K; k++) v[k] /= sum + 1e-20;
        } else if (r->pre_softmax) {
            for (int k = 0; k < K; k++) v[k] = sc[sel[k]];
        } else {
            double ls[E];
            for (int k = 0; k < K; k++) ls[k] = l[sel[k]];
            dsoftmax(v, ls, K);
        }
        for (int k = 0; k < K; k++)
            probs[t * K + k] = v[k] * (r->scaling_factor > 0 ? r->scaling_factor : 1.0);
    }
}

static double route_loss(void *p)
{
    route_ctx *c = p;
    double probs[N * E];
    int32_t idx[N * E];
    ref_route(c, probs, idx);
    double L = 0;
    for (int i = 0; i < N * c->r->topk; i++) L += c->w[i] * probs[i];
    return L;
}

static void test_route(mc_backend *be, mc_backend *be2, const char *name, mc_moe_route r, int bias)
{
    kt_rng g = {1234 + (uint64_t)r.topk * 7 + (uint64_t)r.sigmoid};
    int K = r.topk;
    float lg[N * E], eb[E], probs[N * E], probs2[N * E], w[N * E], dl[N * E] = {0};
    int32_t idx[N * E], idx2[N * E];
    kt_fill(&g, lg, N * E, -2, 2);
    kt_fill(&g, eb, E, -0.3, 0.3);
    kt_fill(&g, w, (size_t)N * K, -1, 1);
    mc_k_moe_route_fwd(be, probs, idx, lg, bias ? eb : NULL, N, E, &r);
    mc_k_moe_route_fwd(be2, probs2, idx2, lg, bias ? eb : NULL, N, E, &r);
    double *dlog = kt_todouble(lg, N * E), *deb = kt_todouble(eb, E), *dw = kt_todouble(w, N * K);
    route_ctx c = {&r, dlog, bias ? deb : NULL, NULL, dw};
    double rp[N * E];
    int32_t ri[N * E];
    ref_route(&c, rp, ri);
    TAP_OK(!memcmp(idx, ri, sizeof(int32_t) * N * (size_t)K), "%s: the reference's choice", name);
    TAP_OK(kt_err(probs, rp, (size_t)N * K) < 1e-6, "%s: probabilities within 1e-6 (%.2e)", name,
           kt_err(probs, rp, (size_t)N * K));
    TAP_OK(!memcmp(probs, probs2, sizeof(float) * N * (size_t)K) &&
               !memcmp(idx, idx2, sizeof(int32_t) * N * (size_t)K),
           "%s: same bits on 2 threads", name);
    mc_k_moe_route_bwd(be, dl, w, lg, idx, N, E, &r);
    c.fx = idx; /* the choice is a constant of the backward */
    double e = kt_fd_check(route_loss, &c, dlog, N * E, dl, NULL, N * E, 5);
    TAP_OK(e < 1e-6, "%s: d(logits) against finite differences (%.2e)", name, e);
    free(dlog), free(deb), free(dw);
}

/* ------------------------------------------------------------ losses */

typedef struct {
    double *l;
    int G, T, K, sig;
} aux_ctx;

static double aux_ref(void *p)
{
    aux_ctx *c = p;
    double total = 0;
    for (int g = 0; g < c->G; g++) {
        double P[E] = {0}, cnt[E] = {0};
        for (int t = g * c->T; t < (g + 1) * c->T; t++) {
            double s[E];
            const double *l = c->l + t * E;
            if (c->sig) {
                double S = 0;
                for (int e = 0; e < E; e++) S += (s[e] = dsig(l[e]));
                for (int e = 0; e < E; e++) s[e] /= S + 1e-20;
            } else {
                dsoftmax(s, l, E);
            }
            int32_t sel[E];
            dtopk(sel, s, NULL, E, c->K);
            for (int k = 0; k < c->K; k++) cnt[sel[k]] += 1;
            for (int e = 0; e < E; e++) P[e] += s[e];
        }
        double sum = 0;
        for (int e = 0; e < E; e++) sum += P[e] * cnt[e];
        total += sum * E / ((double)c->K * c->T * c->T);
    }
    return total / c->G;
}

static void test_aux(mc_backend *be, int G, int sig)
{
    kt_rng g = {99 + (uint64_t)G + 10 * (uint64_t)sig};
    float lg[N * E], dl[N * E] = {0};
    kt_fill(&g, lg, N * E, -2, 2);
    double *d = kt_todouble(lg, N * E);
    aux_ctx c = {d, G, N / G, 2, sig};
    double v = mc_k_moe_aux_loss(be, dl, lg, (size_t)G, (size_t)(N / G), E, 2, sig, 0.5f);
    double ref = aux_ref(&c);
    TAP_OK(fabs(v - ref) < 1e-9 * fabs(ref), "aux loss, %d group(s), %s: %.9f = %.9f", G,
           sig ? "sigmoid" : "softmax", v, ref);
    for (size_t i = 0; i < N * E; i++) dl[i] *= 2.0f; /* grad 0.5 */
    double e = kt_fd_check(aux_ref, &c, d, N * E, dl, NULL, N * E, 3);
    TAP_OK(e < 1e-5, "aux loss, %d group(s), %s: gradient against finite differences (%.2e)", G,
           sig ? "sigmoid" : "softmax", e);
    free(d);
}

typedef struct {
    double *l;
} z_ctx;

static double z_ref(void *p)
{
    z_ctx *c = p;
    double s = 0;
    for (int t = 0; t < N; t++) {
        double m = -INFINITY, z = 0;
        for (int e = 0; e < E; e++) m = fmax(m, c->l[t * E + e]);
        for (int e = 0; e < E; e++) z += exp(c->l[t * E + e] - m);
        s += (m + log(z)) * (m + log(z));
    }
    return s / N;
}

static void test_z(mc_backend *be)
{
    kt_rng g = {7};
    float lg[N * E], dl[N * E] = {0};
    kt_fill(&g, lg, N * E, -3, 3);
    double *d = kt_todouble(lg, N * E);
    z_ctx c = {d};
    double v = mc_k_moe_z_loss(be, dl, lg, N, E, 1.0f);
    TAP_OK(fabs(v - z_ref(&c)) < 1e-9 * z_ref(&c), "z loss %.9f", v);
    double e = kt_fd_check(z_ref, &c, d, N * E, dl, NULL, N * E, 3);
    TAP_OK(e < 1e-6, "z loss: gradient against finite differences (%.2e)", e);
    free(d);
}

/* ------------------------------------------------------------ permutation */

#define K2 2
typedef struct {
    double *x;  /* [N, C] */
    double *yp; /* [N K2, C] */
    double *p;  /* [N, K2] */
    double *R;  /* [N, C] weights of y, or [N K2, C] of xp */
    const int32_t *perm;
    int which; /* 0: L = sum R y(yp, p); 1: L = sum R xp(x) */
} perm_ctx;

static double perm_loss(void *q)
{
    perm_ctx *c = q;
    double L = 0;
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K2; k++) {
            int row = c->perm[t * K2 + k];
            if (row < 0) continue;
            for (int j = 0; j < C; j++)
                L += c->which ? c->R[row * C + j] * c->x[t * C + j]
                              : c->R[t * C + j] * c->p[t * K2 + k] * c->yp[row * C + j];
        }
    return L;
}

static void test_permute(mc_backend *be)
{
    kt_rng g = {5};
    int32_t idx[N * K2], perm[N * K2], cnt[E];
    for (int t = 0; t < N; t++) {
        idx[t * K2] = (t * 3) % E;
        idx[t * K2 + 1] = (t * 3 + 1 + t % 2) % E;
    }
    idx[5] = -1; /* a dropped choice */
    mc_k_moe_permute_map(be, perm, cnt, idx, N, E, K2, 0);
    int good = 1, tot = 0;
    int64_t off[E + 1];
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e], tot += cnt[e];
    /* each expert's rows: its tokens in order */
    for (int e = 0; e < E; e++) {
        int64_t next = off[e];
        for (int t = 0; t < N; t++)
            for (int k = 0; k < K2; k++)
                if (idx[t * K2 + k] == e) good &= perm[t * K2 + k] == next++;
        good &= next == off[e + 1];
    }
    good &= perm[5] == -1 && tot == N * K2 - 1;
    TAP_OK(good, "permute map: experts in order, tokens in order, the dropped choice -1");

    float x[N * C], xp[N * K2 * C], yp[N * K2 * C], p[N * K2], y[N * C], R[N * K2 * C];
    kt_fill(&g, x, N * C, -1, 1), kt_fill(&g, yp, N * K2 * C, -1, 1);
    kt_fill(&g, p, N * K2, 0, 1), kt_fill(&g, R, N * K2 * C, -1, 1);
    mc_k_moe_permute(be, xp, x, perm, N, K2, C);
    good = 1;
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K2; k++)
            if (perm[t * K2 + k] >= 0) good &= !memcmp(xp + perm[t * K2 + k] * C, x + t * C, 4 * C);
    TAP_OK(good, "permute: every token's rows copied");
    mc_k_moe_unpermute(be, y, yp, p, perm, N, K2, C);
    double ym = 0;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < C; j++) {
            double s = 0;
            for (int k = 0; k < K2; k++)
                if (perm[t * K2 + k] >= 0)
                    s += (double)p[t * K2 + k] * yp[perm[t * K2 + k] * C + j];
            ym = fmax(ym, fabs(s - y[t * C + j]));
        }
    TAP_OK(ym < 1e-6, "unpermute: the weighted sum (%.2e)", ym);

    /* backward of the unpermutation */
    float dyp[N * K2 * C] = {0}, dp[N * K2];
    mc_k_moe_unpermute_bwd(be, dyp, dp, R, yp, p, perm, N, K2, C);
    double *dx = kt_todouble(x, N * C), *dy = kt_todouble(yp, N * K2 * C),
           *dpp = kt_todouble(p, N * K2), *dR = kt_todouble(R, N * K2 * C);
    perm_ctx c = {dx, dy, dpp, dR, perm, 0};
    double e1 = kt_fd_check(perm_loss, &c, dpp, N * K2, dp, NULL, N * K2, 1);
    double e2 = kt_fd_check(perm_loss, &c, dy, (size_t)tot * C, dyp, NULL, (size_t)tot * C, 1);
    TAP_OK(e1 < 1e-7 && e2 < 1e-7, "unpermute backward: d(probs) %.2e, d(rows) %.2e", e1, e2);
    /* backward of the permutation: adds */
    float gx[N * C], base[N * C];
    kt_fill(&g, gx, N * C, -1, 1);
    memcpy(base, gx, sizeof gx);
    mc_k_moe_permute_bwd(be, gx, R, perm, N, K2, C);
    c.which = 1;
    double e3 = kt_fd_check(perm_loss, &c, dx, N * C, gx, base, N * C, 1);
    TAP_OK(e3 < 1e-7, "permute backward adds d(x) (%.2e)", e3);
    free(dx), free(dy), free(dpp), free(dR);
}

/* ------------------------------------------------------------ capacity, padding, bias */

static void test_capacity(mc_backend *be)
{
    /* 6 tokens, top-2 of 3 experts; expert 0 is chosen by tokens 0..4 */
    enum { T6 = 6, E3 = 3 };
    const int32_t idx[T6 * 2] = {0, 1, 1, 0, 0, 2, 2, 0, 0, 1, 1, 2};
    const float p[T6 * 2] = {0.6f, 0.4f, 0.7f, 0.3f, 0.5f, 0.5f,
                             0.9f, 0.1f, 0.8f, 0.2f, 0.6f, 0.4f};
    int32_t kept[T6 * 2];
    /* capacity 3: expert 0 (5 tokens: probs .6 .3 .5 .1 .8) keeps .8 .6 .5,
     * expert 1 (4: .4 .7 .2 .6) drops .2, expert 2 (3) keeps all */
    mc_k_moe_capacity_drop(be, kept, idx, p, T6, E3, 2, 3, 0);
    const int32_t want_p[T6 * 2] = {0, 1, 1, -1, 0, 2, 2, -1, 0, -1, 1, 2};
    TAP_OK(!memcmp(kept, want_p, sizeof kept), "capacity 3, drop policy probs: the lowest "
                                               "probabilities of experts 0 and 1 dropped");
    mc_k_moe_capacity_drop(be, kept, idx, p, T6, E3, 2, 3, 1);
    const int32_t want_q[T6 * 2] = {0, 1, 1, 0, 0, 2, 2, -1, -1, 1, -1, 2};
    TAP_OK(!memcmp(kept, want_q, sizeof kept), "capacity 3, drop policy position: the latest "
                                               "tokens of experts 0 and 1 dropped");
    /* equal probabilities: the earlier token is kept */
    const float eq[T6 * 2] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,
                              0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    mc_k_moe_capacity_drop(be, kept, idx, eq, T6, E3, 2, 3, 0);
    TAP_OK(!memcmp(kept, want_q, sizeof kept), "capacity with equal probabilities keeps the "
                                               "earliest tokens");
    mc_k_moe_capacity_drop(be, kept, idx, p, T6, E3, 2, 5, 0);
    TAP_OK(!memcmp(kept, idx, sizeof kept), "capacity 5: nothing dropped");

    /* padded blocks of 4 rows: expert e's rows from 4 e */
    int32_t perm[T6 * 2], cnt[E3];
    mc_k_moe_permute_map(be, perm, cnt, want_q, T6, E3, 2, 4);
    int good = cnt[0] == 3 && cnt[1] == 3 && cnt[2] == 3;
    int next[E3] = {0, 4, 8};
    for (int i = 0; i < T6 * 2; i++)
        good &= want_q[i] < 0 ? perm[i] == -1 : perm[i] == next[want_q[i]]++;
    TAP_OK(good, "permute map padded to blocks of 4: expert e's tokens from row 4 e, in order");

    float bias[4] = {0.5f, 0.0f, -0.25f, 1.0f}, tok[4] = {10, 2, 6, 6};
    mc_k_moe_expert_bias_update(be, bias, tok, 4, 0.125f);
    /* mean 6: over-loaded expert 0 down, under-loaded 1 up, the others kept */
    TAP_OK(bias[0] == 0.375f && bias[1] == 0.125f && bias[2] == -0.25f && bias[3] == 1.0f,
           "expert bias update: sign(mean - tokens) x rate (%g %g %g %g)", bias[0], bias[1],
           bias[2], bias[3]);
}

/* ------------------------------------------------------------ grouped GEMM */

#define GE 3
#define CI 7
#define CO 6
static const int64_t ROWS[GE] = {4, 0, 5};
#define GR 9

typedef struct {
    double *x, *W, *b, *R;
} gl_ctx;

static double gl_loss(void *p)
{
    gl_ctx *c = p;
    double L = 0;
    int r0 = 0;
    for (int e = 0; e < GE; e++) {
        for (int i = r0; i < r0 + ROWS[e]; i++)
            for (int o = 0; o < CO; o++) {
                double s = c->b[e * CO + o];
                for (int j = 0; j < CI; j++) s += c->x[i * CI + j] * c->W[(e * CO + o) * CI + j];
                L += c->R[i * CO + o] * s;
            }
        r0 += (int)ROWS[e];
    }
    return L;
}

static void test_grouped(mc_backend *be)
{
    kt_rng g = {11};
    float x[GR * CI], W[GE * CO * CI], b[GE * CO], out[GR * CO], R[GR * CO];
    kt_fill(&g, x, sizeof x / 4, -1, 1), kt_fill(&g, W, sizeof W / 4, -1, 1);
    kt_fill(&g, b, sizeof b / 4, -1, 1), kt_fill(&g, R, sizeof R / 4, -1, 1);
    mc_k_grouped_linear_fwd(be, MC_PREC_FP32, out, x, W, NULL, b, ROWS, GE, CI, CO);
    gl_ctx c = {kt_todouble(x, sizeof x / 4), kt_todouble(W, sizeof W / 4),
                kt_todouble(b, sizeof b / 4), kt_todouble(R, sizeof R / 4)};
    double ref[GR * CO];
    int r0 = 0;
    for (int e = 0; e < GE; e++) {
        for (int i = r0; i < r0 + ROWS[e]; i++)
            for (int o = 0; o < CO; o++) {
                double s = c.b[e * CO + o];
                for (int j = 0; j < CI; j++) s += c.x[i * CI + j] * c.W[(e * CO + o) * CI + j];
                ref[i * CO + o] = s;
            }
        r0 += (int)ROWS[e];
    }
    TAP_OK(kt_err(out, ref, GR * CO) < 1e-6, "grouped GEMM forward (%.2e)",
           kt_err(out, ref, GR * CO));
    float dx[GR * CI], dW[GE * CO * CI], db[GE * CO], bx[GR * CI], bW[GE * CO * CI], bb[GE * CO];
    kt_fill(&g, dx, sizeof dx / 4, -1, 1), kt_fill(&g, dW, sizeof dW / 4, -1, 1);
    kt_fill(&g, db, sizeof db / 4, -1, 1);
    memcpy(bx, dx, sizeof dx), memcpy(bW, dW, sizeof dW), memcpy(bb, db, sizeof db);
    mc_k_grouped_linear_bwd(be, MC_PREC_FP32, dx, dW, db, R, x, W, NULL, ROWS, GE, CI, CO);
    double ex = kt_fd_check(gl_loss, &c, c.x, GR * CI, dx, bx, GR * CI, 1);
    double ew = kt_fd_check(gl_loss, &c, c.W, GE * CO * CI, dW, bW, GE * CO * CI, 1);
    double eb = kt_fd_check(gl_loss, &c, c.b, GE * CO, db, bb, GE * CO, 1);
    TAP_OK(ex < 1e-6 && ew < 1e-6 && eb < 1e-6,
           "grouped GEMM backward adds dx %.2e, dW %.2e, db %.2e (expert 1 has no rows)", ex, ew,
           eb);
    int untouched = 1;
    for (int i = CO * CI; i < 2 * CO * CI; i++) untouched &= dW[i] == bW[i];
    TAP_OK(untouched, "grouped GEMM: the expert with no rows gets no gradient");
    free(c.x), free(c.W), free(c.b), free(c.R);
}

/* ------------------------------------------------------------ grouped GEMM in bf16 */

static double bf(float v) { return (double)mc_bf16_to_f32(mc_f32_to_bf16(v)); }

/* out, dx, dW (added onto base) and db of bf16 grouped GEMM calls */
typedef struct {
    float *out, *dx, *dW, *db;
} gb_res;

static size_t sum_rows(const int64_t *rows, size_t E_)
{
    size_t R = 0;
    for (size_t e = 0; e < E_; e++) R += (size_t)rows[e];
    return R;
}

static gb_res gb_run(mc_backend *be, const float *x, const float *W, const void *Wp, const float *b,
                     const float *dy, const float *bx, const float *bW, const float *bb,
                     const int64_t *rows, size_t E_, size_t Ci, size_t Co)
{
    size_t R = sum_rows(rows, E_);
    gb_res r = {kt_falloc(R * Co), kt_copy(bx, R * Ci), kt_copy(bW, E_ * Co * Ci),
                kt_copy(bb, E_ * Co)};
    mc_k_grouped_linear_fwd(be, MC_PREC_BF16, r.out, x, W, Wp, b, rows, E_, Ci, Co);
    mc_k_grouped_linear_bwd(be, MC_PREC_BF16, r.dx, r.dW, r.db, dy, x, W, Wp, rows, E_, Ci, Co);
    return r;
}

static int gb_same(const gb_res *a, const gb_res *b, size_t R, size_t E_, size_t Ci, size_t Co)
{
    return !memcmp(a->out, b->out, R * Co * 4) && !memcmp(a->dx, b->dx, R * Ci * 4) &&
           !memcmp(a->dW, b->dW, E_ * Co * Ci * 4) && !memcmp(a->db, b->db, E_ * Co * 4);
}

static void gb_free(gb_res *r) { free(r->out), free(r->dx), free(r->dW), free(r->db); }

/* rows[] per expert; Co > 512 splits d W into column blocks, an expert of
 * more than 256 rows makes the backward round d out and x once for all */
static void test_grouped_bf16(mc_backend *be2, const int64_t *rows, size_t E_, size_t Ci, size_t Co,
                              const char *what)
{
    /* a 1-thread backend made last: OpenBLAS's thread count is the process's,
     * set by the backend made last (the 2-thread backend's calls run inside
     * its own parallel region, where OpenBLAS runs single-threaded) */
    mc_backend *be1 = kt_backend(1);
    size_t R = sum_rows(rows, E_);
    kt_rng g = {23};
    float *x = kt_falloc(R * Ci), *W = kt_falloc(E_ * Co * Ci), *b = kt_falloc(E_ * Co),
          *dy = kt_falloc(R * Co), *bx = kt_falloc(R * Ci), *bW = kt_falloc(E_ * Co * Ci),
          *bb = kt_falloc(E_ * Co);
    kt_fill(&g, x, R * Ci, -1, 1), kt_fill(&g, W, E_ * Co * Ci, -1, 1);
    kt_fill(&g, b, E_ * Co, -1, 1), kt_fill(&g, dy, R * Co, -1, 1);
    kt_fill(&g, bx, R * Ci, -1, 1), kt_fill(&g, bW, E_ * Co * Ci, -1, 1);
    kt_fill(&g, bb, E_ * Co, -1, 1);
    /* float64 products of the bf16-rounded operands (the bias and d b in
     * fp32: they are not GEMM operands) */
    double *ro = malloc(R * Co * sizeof *ro), *rx = calloc(R * Ci, sizeof *rx),
           *rw = calloc(E_ * Co * Ci, sizeof *rw), *rb = calloc(E_ * Co, sizeof *rb);
    size_t r0 = 0;
    for (size_t e = 0; e < E_; e++) {
        for (size_t i = r0; i < r0 + (size_t)rows[e]; i++)
            for (size_t o = 0; o < Co; o++) {
                double s = 0, d = bf(dy[i * Co + o]);
                for (size_t j = 0; j < Ci; j++) {
                    s += bf(x[i * Ci + j]) * bf(W[(e * Co + o) * Ci + j]);
                    rx[i * Ci + j] += d * bf(W[(e * Co + o) * Ci + j]);
                    rw[(e * Co + o) * Ci + j] += d * bf(x[i * Ci + j]);
                }
                ro[i * Co + o] = s + b[e * Co + o];
                rb[e * Co + o] += dy[i * Co + o];
            }
        r0 += (size_t)rows[e];
    }
    const int native = be1->dnnl_bf16;
    for (int emu = 0; emu <= native; emu++) {
        be1->dnnl_bf16 = be2->dnnl_bf16 = native && !emu;
        const char *form = be1->dnnl_bf16 ? "native" : "emulated";
        size_t wb = mc_backend_weight_bytes(be1, MC_PREC_BF16);
        void *Wp = malloc(E_ * Co * Ci * wb);
        mc_k_prepare_weight(be1, MC_PREC_BF16, Wp, W, E_ * Co * Ci, 0);
        gb_res a = gb_run(be1, x, W, NULL, b, dy, bx, bW, bb, rows, E_, Ci, Co);
        double eo = kt_err(a.out, ro, R * Co), ex = kt_err_added(a.dx, bx, rx, R * Ci),
               ew = kt_err_added(a.dW, bW, rw, E_ * Co * Ci),
               eb = kt_err_added(a.db, bb, rb, E_ * Co);
        TAP_OK(eo < 1e-5 && ex < 1e-5 && ew < 1e-5 && eb < 1e-5,
               "grouped GEMM bf16 %s, %s: out %.2e, dx %.2e, dW %.2e, db %.2e against float64 "
               "products of the rounded operands",
               form, what, eo, ex, ew, eb);
        gb_res p = gb_run(be1, x, W, Wp, b, dy, bx, bW, bb, rows, E_, Ci, Co);
        gb_res t = gb_run(be2, x, W, Wp, b, dy, bx, bW, bb, rows, E_, Ci, Co);
        TAP_OK(gb_same(&a, &p, R, E_, Ci, Co) && gb_same(&a, &t, R, E_, Ci, Co),
               "grouped GEMM bf16 %s, %s: the same bits with the prepared weight and on 2 threads",
               form, what);
        gb_free(&a), gb_free(&p), gb_free(&t);
        free(Wp);
    }
    be2->dnnl_bf16 = native;
    mc_backend_free(be1);
    free(x), free(W), free(b), free(dy), free(bx), free(bW), free(bb);
    free(ro), free(rx), free(rw), free(rb);
}

/* The two backward schedules give the same bits: experts 0-2 alone (each
 * at most 256 rows: one item per expert rounds its own rows), and with an
 * expert of 300 rows after them (d out and x rounded once for all). */
static void test_grouped_schedules(mc_backend *be)
{
    const int64_t rows[4] = {40, 0, 256, 300};
    size_t Ci = 24, Co = 40, Ra = 296, Rb = 596;
    kt_rng g = {29};
    float *x = kt_falloc(Rb * Ci), *W = kt_falloc(4 * Co * Ci), *dy = kt_falloc(Rb * Co);
    kt_fill(&g, x, Rb * Ci, -1, 1), kt_fill(&g, W, 4 * Co * Ci, -1, 1);
    kt_fill(&g, dy, Rb * Co, -1, 1);
    float *bx = kt_falloc(Rb * Ci), *bW = kt_falloc(4 * Co * Ci), *bb = kt_falloc(4 * Co);
    memset(bx, 0, Rb * Ci * 4), memset(bW, 0, 4 * Co * Ci * 4), memset(bb, 0, 4 * Co * 4);
    const int native = be->dnnl_bf16;
    for (int emu = 0; emu <= native; emu++) {
        be->dnnl_bf16 = native && !emu;
        gb_res a = gb_run(be, x, W, NULL, NULL, dy, bx, bW, bb, rows, 3, Ci, Co);
        gb_res b = gb_run(be, x, W, NULL, NULL, dy, bx, bW, bb, rows, 4, Ci, Co);
        TAP_OK(gb_same(&a, &b, Ra, 3, Ci, Co),
               "grouped GEMM bf16 %s: the backward's two schedules give the same bits",
               be->dnnl_bf16 ? "native" : "emulated");
        gb_free(&a), gb_free(&b);
    }
    be->dnnl_bf16 = native;
    free(x), free(W), free(dy), free(bx), free(bW), free(bb);
}

int main(void)
{
    mc_backend *be = kt_backend(1), *be2 = kt_backend(2);
    mc_moe_route r = {2, 0, 0, 0.0f, 0, 0};
    test_route(be, be2, "softmax top-2", r, 0);
    r.pre_softmax = 1;
    test_route(be, be2, "pre-softmax top-2", r, 0);
    r = (mc_moe_route){3, 0, 0, 2.5f, 0, 0};
    test_route(be, be2, "softmax top-3 scaled 2.5", r, 0);
    r = (mc_moe_route){2, 1, 0, 0.0f, 0, 0};
    test_route(be, be2, "sigmoid top-2 with expert bias", r, 1);
    r = (mc_moe_route){1, 1, 0, 0.0f, 0, 0};
    test_route(be, be2, "sigmoid top-1", r, 0);
    r = (mc_moe_route){4, 1, 0, 1.5f, 4, 2};
    test_route(be, be2, "sigmoid top-4, 4 groups, group top-2, bias", r, 1);
    r = (mc_moe_route){2, 0, 0, 0.0f, 2, 1};
    test_route(be, be2, "softmax top-2, 2 groups, group top-1", r, 0);
    test_aux(be, 1, 0);
    test_aux(be, 3, 0);
    test_aux(be, 1, 1);
    test_z(be);
    test_permute(be);
    test_grouped(be);
    static const int64_t fine[5] = {37, 0, 130, 256, 5}, big[3] = {300, 17, 0};
    test_grouped_bf16(be2, fine, 5, 40, 24, "experts of at most 256 rows");
    test_grouped_bf16(be2, big, 3, 24, 600, "an expert of 300 rows, 600 outputs");
    test_grouped_schedules(be);
    test_capacity(be);
    mc_backend_free(be);
    mc_backend_free(be2);
    return tap_done();
}
