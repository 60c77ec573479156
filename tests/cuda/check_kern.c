/*
 * check_kern.c - every CUDA kernel against the CPU backend (the reference),
 * on fresh random inputs of several shapes, through kern.h only.
 *
 * Forward outputs are poisoned (NaN) on both backends before each call, so
 * an element the CUDA kernel does not write fails; backward outputs, which
 * kernels add into, start from the same random values on both. The error of
 * an output is ||gpu - cpu|| / ||cpu|| (a NaN or infinity where the CPU has a
 * finite value fails outright), bounded by the precision of the computation:
 * fp32 1e-5, tf32 1e-3 (cuBLAS may round operands to TF32 differently from
 * the CPU's nearest-even), bf16/fp16 operands 1e-2; conversions and data
 * movement must be exact. Kernels that promise determinism run twice on the
 * GPU and must give the same bytes.
 *
 * Prints TAP ("ok N - ..."), then a table of the worst error per kernel.
 * Without a GPU (or an mc built without CUDA) it prints "no GPU: skipped"
 * and exits 77. --devices prints the number of GPUs and exits. --rehearse
 * runs every check with a second CPU backend in the GPU's place (no GPU
 * needed; every error must be 0), so the harness itself is tried before
 * GPU time is spent on it.
 * Usage: check_kern [--devices] [--rehearse] [--seed N]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mc/kern.h"

static const mc_rope rope10k = {10000.0f, 0, 0, 0, 0, 0, 0}; /* plain RoPE, base 10000 */

typedef struct {
    mc_backend *c, *g;
    uint64_t rng;
    int n, fails;
    /* worst error per kernel name, for the closing table */
    char names[96][32];
    double worst[96], tol[96];
    int nnames;
} ctx;

static uint64_t next(ctx *x)
{
    x->rng += 0x9e3779b97f4a7c15ull;
    uint64_t z = x->rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float unif(ctx *x) { return (float)((next(x) >> 40) * 0x1p-24) * 2.0f - 1.0f; }

/* one tensor on both backends */
typedef struct {
    float *c, *g;
    size_t n;
} pair;

static void *alloc(mc_backend *be, size_t bytes)
{
    mc_error err;
    void *p = mc_balloc(be, bytes, &err);
    if (!p) {
        printf("Bail out! %s\n", err.msg);
        exit(1);
    }
    return p;
}

static pair mk(ctx *x, size_t n)
{
    pair p = {alloc(x->c, n * 4 + 4), alloc(x->g, n * 4 + 4), n};
    return p;
}
static void put(ctx *x, pair p, const float *h)
{
    mc_bcopy_from_host(x->c, p.c, h, p.n * 4);
    mc_bcopy_from_host(x->g, p.g, h, p.n * 4);
}
/* uniform in [-s, s) */
static pair rnd(ctx *x, size_t n, float s)
{
    pair p = mk(x, n);
    float *h = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = s * unif(x);
    put(x, p, h);
    free(h);
    return p;
}
static pair poisoned(ctx *x, size_t n)
{
    pair p = mk(x, n);
    mc_k_fill(x->c, p.c, NAN, n);
    mc_k_fill(x->g, p.g, NAN, n);
    return p;
}
static void drop(ctx *x, pair p)
{
    mc_bfree(x->c, p.c);
    mc_bfree(x->g, p.g);
}

typedef struct {
    int32_t *c, *g;
} ipair;
static ipair ids(ctx *x, size_t n, int64_t lo, int64_t hi)
{
    ipair p = {alloc(x->c, n * 4 + 4), alloc(x->g, n * 4 + 4)};
    int32_t *h = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = (int32_t)(lo + (int64_t)(next(x) % (uint64_t)(hi - lo)));
    mc_bcopy_from_host(x->c, p.c, h, n * 4);
    mc_bcopy_from_host(x->g, p.g, h, n * 4);
    free(h);
    return p;
}
static void idrop(ctx *x, ipair p)
{
    mc_bfree(x->c, p.c);
    mc_bfree(x->g, p.g);
}
static ipair iput(ctx *x, const int32_t *h, size_t n)
{
    ipair p = {alloc(x->c, n * 4 + 4), alloc(x->g, n * 4 + 4)};
    mc_bcopy_from_host(x->c, p.c, h, n * 4);
    mc_bcopy_from_host(x->g, p.g, h, n * 4);
    return p;
}
/* Packed documents in B sequences of T tokens: documents of 1 .. T/3 + 1
 * tokens (the last cut at T); *seg gets each token's document start and
 * *pos its position in its document (mc_doc_layout's arrays). */
static void packed_docs(ctx *x, size_t B, size_t T, ipair *seg, ipair *pos)
{
    int32_t *hs = malloc(B * T * 4 + 4), *hp = malloc(B * T * 4 + 4);
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T;) {
            size_t len = 1 + next(x) % (T / 3 + 1);
            for (size_t i = 0; i < len && t < T; i++, t++) {
                hs[b * T + t] = (int32_t)(t - i);
                hp[b * T + t] = (int32_t)i;
            }
        }
    *seg = iput(x, hs, B * T);
    *pos = iput(x, hp, B * T);
    free(hs);
    free(hp);
}

static void record(ctx *x, const char *kernel, double e, double tol)
{
    int k = 0;
    while (k < x->nnames && strcmp(x->names[k], kernel)) k++;
    if (k == x->nnames && k < 96) {
        snprintf(x->names[k], sizeof x->names[k], "%s", kernel);
        x->worst[k] = 0;
        x->tol[k] = tol;
        x->nnames++;
    }
    if (k < 96 && !(e <= x->worst[k])) x->worst[k] = e;
}

/* relative error of p's GPU copy against its CPU copy */
static int cmp(ctx *x, const char *kernel, const char *what, pair p, double tol)
{
    float *a = malloc(p.n * 4 + 4), *b = malloc(p.n * 4 + 4);
    mc_bcopy_to_host(x->c, a, p.c, p.n * 4);
    mc_bcopy_to_host(x->g, b, p.g, p.n * 4);
    double num = 0, den = 0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < p.n; i++) {
        if (isfinite(a[i]) != isfinite(b[i]) ||
            (!isfinite(a[i]) && memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i])))) {
            if (!bad++) first = i;
            continue;
        }
        if (!isfinite(a[i])) continue;
        double d = (double)b[i] - a[i];
        num += d * d;
        den += (double)a[i] * a[i];
    }
    double e = bad ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = e <= tol;
    x->n++;
    if (!ok) x->fails++;
    if (bad)
        printf("%s %d - %s %s: %zu non-finite mismatches, first at %zu (cpu %g, gpu %g)\n",
               ok ? "ok" : "not ok", x->n, kernel, what, bad, first, a[first], b[first]);
    else
        printf("%s %d - %s %s: rel err %.2e <= %.0e\n", ok ? "ok" : "not ok", x->n, kernel, what, e,
               tol);
    record(x, kernel, e, tol);
    free(a);
    free(b);
    return ok;
}

static void check(ctx *x, const char *kernel, int ok, const char *what)
{
    x->n++;
    if (!ok) x->fails++;
    printf("%s %d - %s %s\n", ok ? "ok" : "not ok", x->n, kernel, what);
    record(x, kernel, ok ? 0 : INFINITY, 0);
}

/* the GPU copy's bytes, for determinism checks */
static void *gbytes(ctx *x, pair p)
{
    void *h = malloc(p.n * 4 + 4);
    mc_bcopy_to_host(x->g, h, p.g, p.n * 4);
    return h;
}

#define FP32 1e-5
#define TF32 1e-3
#define HALF 1e-2

/* S(p) picks the side of a pair; the kernel call is written once and run twice */
#define S(p) (side ? (p).g : (p).c)
#define ON_BOTH(stmt)                        \
    for (int side = 0; side < 2; side++) {   \
        mc_backend *be = side ? x->g : x->c; \
        stmt;                                \
    }

static void check_elementwise(ctx *x, size_t n)
{
    char w[64];
    snprintf(w, sizeof w, "n=%zu", n);
    pair a = rnd(x, n, 2), b = rnd(x, n, 2), o = poisoned(x, n);
    ON_BOTH(mc_k_fill(be, S(o), 0.25f, n));
    cmp(x, "fill", w, o, 0);
    ON_BOTH(mc_k_add(be, S(o), S(a), S(b), n));
    cmp(x, "add", w, o, FP32);
    ON_BOTH(mc_k_acc(be, S(o), S(a), n));
    cmp(x, "acc", w, o, FP32);
    ON_BOTH(mc_k_scale(be, S(o), -1.5f, n));
    cmp(x, "scale", w, o, FP32);
    double sc = mc_k_sumsq(x->c, a.c, n), sg = mc_k_sumsq(x->g, a.g, n);
    double mc_ = mc_k_mean(x->c, a.c, n), mg = mc_k_mean(x->g, a.g, n);
    double sg2 = mc_k_sumsq(x->g, a.g, n);
    char m[160];
    snprintf(m, sizeof m, "%s: cpu %.17g gpu %.17g", w, sc, sg);
    check(x, "sumsq", fabs(sg - sc) <= 1e-12 * sc && sg2 == sg, m);
    snprintf(m, sizeof m, "%s: cpu %.17g gpu %.17g", w, mc_, mg);
    check(x, "mean", fabs(mg - mc_) <= 1e-12 * (fabs(mc_) + 1e-3), m);
    check(x, "all_finite", mc_k_all_finite(x->g, a.g, n) == 1, "finite input");
    float inf = INFINITY;
    mc_bcopy_from_host(x->g, a.g + n / 2, &inf, 4);
    check(x, "all_finite", mc_k_all_finite(x->g, a.g, n) == 0, "one infinity in the middle");
    drop(x, a);
    /* rounding and casts: exact */
    a = rnd(x, n, 3e4f);
    for (int prec = 1; prec <= 3; prec++) {
        pair r = rnd(x, n, 1);
        ON_BOTH(mc_bcopy(be, S(r), S(a), n * 4));
        ON_BOTH(mc_k_round(be, S(r), n, (mc_prec)prec));
        cmp(x, prec == 1 ? "round bf16" : prec == 2 ? "round fp16" : "round tf32", w, r, 0);
        drop(x, r);
    }
    pair h = poisoned(x, (n + 1) / 2); /* n uint16 */
    ON_BOTH(mc_k_cast_to_bf16(be, (uint16_t *)S(h), S(a), n));
    cmp(x, "cast_to_bf16", w, h, 0);
    ON_BOTH(mc_k_cast_from_bf16(be, S(o), (uint16_t *)S(h), n));
    cmp(x, "cast_from_bf16", w, o, 0);
    ON_BOTH(mc_k_cast_to_fp16(be, (uint16_t *)S(h), S(a), n));
    cmp(x, "cast_to_fp16", w, h, 0);
    ON_BOTH(mc_k_cast_from_fp16(be, S(o), (uint16_t *)S(h), n));
    cmp(x, "cast_from_fp16", w, o, 0);
    drop(x, h);
    /* activations */
    ON_BOTH(mc_k_gelu_fwd(be, S(o), S(b), n, MC_PREC_FP32));
    cmp(x, "gelu_fwd", w, o, FP32);
    /* the producers' round argument (emulated precisions' activations) */
    ON_BOTH(mc_k_gelu_fwd(be, S(o), S(b), n, MC_PREC_BF16));
    cmp(x, "gelu_fwd", "round bf16", o, HALF);
    pair d = rnd(x, n, 1), g = rnd(x, n, 1);
    ON_BOTH(mc_k_gelu_bwd(be, S(d), S(g), S(b), n));
    cmp(x, "gelu_bwd", w, d, FP32);
    {
        pair xi = mk(x, n); /* in place: b becomes d(b) */
        ON_BOTH(mc_bcopy(be, S(xi), S(b), n * 4));
        ON_BOTH(mc_k_gelu_bwd_inplace(be, S(xi), S(g), n));
        cmp(x, "gelu_bwd_inplace", w, xi, FP32);
        drop(x, xi);
    }
    /* AdamW on one span */
    pair p = rnd(x, n, 1), mm = rnd(x, n, 0.1f), v = mk(x, n);
    float *hv = malloc(n * 4 + 4); /* the second moment is >= 0 */
    for (size_t i = 0; i < n; i++) hv[i] = 0.01f * (unif(x) + 1.0f);
    put(x, v, hv);
    free(hv);
    ON_BOTH(mc_k_adamw(be, S(p), S(g), S(mm), S(v), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f,
                       0.0975f, 0.5f));
    cmp(x, "adamw", "p", p, FP32);
    cmp(x, "adamw", "m", mm, FP32);
    cmp(x, "adamw", "v", v, FP32);
    drop(x, p);
    drop(x, mm);
    drop(x, v);
    drop(x, d);
    drop(x, g);
    drop(x, a);
    drop(x, b);
    drop(x, o);
}

static void check_layers(ctx *x, size_t N, size_t C, size_t V)
{
    char w[64];
    snprintf(w, sizeof w, "N=%zu C=%zu V=%zu", N, C, V);
    /* init: a block of a global matrix */
    pair o = poisoned(x, N * C);
    ON_BOTH(mc_k_init_normal(be, S(o), N, C, C + 7, 3, 5, 1234, mc_k_name_key("w"), 0.02f));
    cmp(x, "init_normal", w, o, 1e-6);
    /* embedding over the shard [V/3, V/3 + V/2) with ids across the whole vocabulary */
    int64_t v0 = (int64_t)V / 3, vl = (int64_t)V / 2;
    ipair id = ids(x, N, 0, (int64_t)V);
    pair wte = rnd(x, (size_t)vl * C, 1), dwte = rnd(x, (size_t)vl * C, 1), g = rnd(x, N * C, 1);
    ON_BOTH(mc_k_embed_fwd(be, S(o), side ? id.g : id.c, N, S(wte), v0, vl, C));
    cmp(x, "embed_fwd", w, o, 0);
    ON_BOTH(mc_k_embed_bwd(be, S(dwte), S(g), side ? id.g : id.c, N, v0, vl, C));
    cmp(x, "embed_bwd", w, dwte, FP32);
    {
        pair d2 = rnd(x, (size_t)vl * C, 1);
        mc_bcopy(x->g, d2.g, dwte.g, d2.n * 4);
        void *before = gbytes(x, d2);
        mc_k_embed_bwd(x->g, dwte.g, g.g, id.g, N, v0, vl, C);
        mc_k_embed_bwd(x->g, d2.g, g.g, id.g, N, v0, vl, C);
        void *a1 = gbytes(x, dwte), *a2 = gbytes(x, d2);
        check(x, "embed_bwd", !memcmp(a1, a2, d2.n * 4), "deterministic (same bytes twice)");
        free(before);
        free(a1);
        free(a2);
        drop(x, d2);
    }
    /* positions: B = 2 sequences of N/2 */
    size_t B = 2, T = N / 2;
    pair wpe = rnd(x, (T + 3) * C, 1), dwpe = rnd(x, (T + 3) * C, 1);
    ON_BOTH(mc_k_posemb_fwd(be, S(o), S(wpe), B, T, C, 2, NULL));
    cmp(x, "posemb_fwd", w, o, FP32);
    ON_BOTH(mc_k_posemb_bwd(be, S(dwpe), S(g), B, T, C, 2, NULL));
    cmp(x, "posemb_bwd", w, dwpe, FP32);
    /* norms */
    pair xx = rnd(x, N * C, 2), nw = rnd(x, C, 1), nb = rnd(x, C, 1);
    pair mean = poisoned(x, N), rstd = poisoned(x, N);
    for (int bias = 0; bias < 2; bias++) {
        ON_BOTH(mc_k_layernorm_fwd(be, S(o), S(mean), S(rstd), S(xx), S(nw), bias ? S(nb) : NULL, N,
                                   C, 1e-5f, MC_PREC_FP32));
        cmp(x, "layernorm_fwd", w, o, FP32);
        cmp(x, "layernorm_fwd", "mean", mean, FP32);
        cmp(x, "layernorm_fwd", "rstd", rstd, FP32);
        pair dx = rnd(x, N * C, 1), dw = rnd(x, C, 1), db = rnd(x, C, 1);
        ON_BOTH(mc_k_layernorm_bwd(be, S(dx), S(dw), bias ? S(db) : NULL, S(g), S(xx), S(nw),
                                   S(mean), S(rstd), N, C));
        cmp(x, "layernorm_bwd", "dx", dx, FP32);
        cmp(x, "layernorm_bwd", "dw", dw, FP32);
        cmp(x, "layernorm_bwd", "db", db, FP32);
        drop(x, dx);
        drop(x, dw);
        drop(x, db);
    }
    ON_BOTH(mc_k_rmsnorm_fwd(be, S(o), S(rstd), S(xx), S(nw), N, C, 1e-6f, MC_PREC_FP32));
    cmp(x, "rmsnorm_fwd", w, o, FP32);
    cmp(x, "rmsnorm_fwd", "rstd", rstd, FP32);
    ON_BOTH(mc_k_layernorm_fwd(be, S(o), S(mean), S(rstd), S(xx), S(nw), S(nb), N, C, 1e-5f,
                               MC_PREC_BF16));
    cmp(x, "layernorm_fwd", "round bf16", o, HALF);
    ON_BOTH(mc_k_rmsnorm_fwd(be, S(o), S(rstd), S(xx), S(nw), N, C, 1e-6f, MC_PREC_FP16));
    cmp(x, "rmsnorm_fwd", "round fp16", o, HALF);
    {
        pair dx = rnd(x, N * C, 1), dw = rnd(x, C, 1);
        ON_BOTH(mc_k_rmsnorm_bwd(be, S(dx), S(dw), S(g), S(xx), S(nw), S(rstd), N, C));
        cmp(x, "rmsnorm_bwd", "dx", dx, FP32);
        cmp(x, "rmsnorm_bwd", "dw", dw, FP32);
        drop(x, dx);
        drop(x, dw);
    }
    /* SwiGLU: x[N, 2F] with F = C/2 */
    size_t F = C / 2;
    pair sw = poisoned(x, N * F), gs = rnd(x, N * F, 1), dxx = rnd(x, N * C, 1);
    ON_BOTH(mc_k_swiglu_fwd(be, S(sw), S(xx), N, F, MC_PREC_FP32));
    cmp(x, "swiglu_fwd", w, sw, FP32);
    ON_BOTH(mc_k_swiglu_fwd(be, S(sw), S(xx), N, F, MC_PREC_BF16));
    cmp(x, "swiglu_fwd", "round bf16", sw, HALF);
    ON_BOTH(mc_k_swiglu_bwd(be, S(dxx), S(gs), S(xx), N, F));
    cmp(x, "swiglu_bwd", w, dxx, FP32);
    {
        pair xi = mk(x, N * C); /* in place: xx becomes d(xx) */
        ON_BOTH(mc_bcopy(be, S(xi), S(xx), N * C * 4));
        ON_BOTH(mc_k_swiglu_bwd_inplace(be, S(xi), S(gs), N, F));
        cmp(x, "swiglu_bwd_inplace", w, xi, FP32);
        drop(x, xi);
    }
    drop(x, sw);
    drop(x, gs);
    drop(x, dxx);
    /* cross-entropy over this rank's vl columns of V, targets anywhere, some ignored */
    pair logits = rnd(x, N * (size_t)vl, 8), rowmax = poisoned(x, N), sumexp = poisoned(x, N);
    pair tlogit = poisoned(x, N), loss = poisoned(x, N), dloss = rnd(x, N, 1);
    ipair tg = ids(x, N, -1, (int64_t)V);
    ON_BOTH(mc_k_xent_max(be, S(rowmax), S(logits), N, (size_t)vl));
    cmp(x, "xent_max", w, rowmax, 0);
    ON_BOTH(mc_k_xent_sumexp(be, S(sumexp), S(tlogit), S(logits), S(rowmax), side ? tg.g : tg.c, v0,
                             N, (size_t)vl));
    cmp(x, "xent_sumexp", "sumexp", sumexp, FP32);
    cmp(x, "xent_sumexp", "tlogit", tlogit, 0);
    ON_BOTH(mc_k_xent_loss(be, S(loss), S(rowmax), S(sumexp), S(tlogit), side ? tg.g : tg.c, N));
    cmp(x, "xent_loss", w, loss, FP32);
    pair dl = poisoned(x, N * (size_t)vl);
    ON_BOTH(mc_k_xent_bwd(be, S(dl), S(logits), S(rowmax), S(sumexp), side ? tg.g : tg.c, v0, N,
                          (size_t)vl, S(dloss), 0, MC_PREC_FP32));
    cmp(x, "xent_bwd", "dloss", dl, FP32);
    ON_BOTH(mc_k_xent_bwd(be, S(dl), S(logits), S(rowmax), S(sumexp), side ? tg.g : tg.c, v0, N,
                          (size_t)vl, S(dloss), 0, MC_PREC_BF16));
    cmp(x, "xent_bwd", "round bf16", dl, HALF);
    /* knowledge distillation at tau = 2 against a teacher's logits: the
     * sums, the KL and the mixed gradient (written, then in place) */
    {
        pair t = rnd(x, N * (size_t)vl, 8), tmax = poisoned(x, N), sums = poisoned(x, 3 * N);
        pair kl = poisoned(x, N), d = poisoned(x, N * (size_t)vl);
        ON_BOTH(mc_k_xent_max(be, S(tmax), S(t), N, (size_t)vl));
        ON_BOTH(
            mc_k_kd_sums(be, S(sums), S(logits), S(t), S(rowmax), S(tmax), N, (size_t)vl, 0.5f));
        cmp(x, "kd_sums", w, sums, FP32);
        ON_BOTH(mc_k_kd_loss(be, S(kl), S(sums), side ? tg.g : tg.c, N));
        cmp(x, "kd_loss", w, kl, FP32);
        ON_BOTH(mc_k_kd_bwd(be, S(d), S(logits), S(t), S(rowmax), S(sumexp), S(tmax), S(sums),
                            side ? tg.g : tg.c, v0, N, (size_t)vl, 0.5f, 0.25f, 0.75f));
        cmp(x, "kd_bwd", w, d, FP32);
        pair s2 = rnd(x, N * (size_t)vl, 1);
        mc_bcopy(x->c, s2.c, logits.c, s2.n * 4);
        mc_bcopy(x->g, s2.g, logits.g, s2.n * 4);
        ON_BOTH(mc_k_kd_bwd(be, S(s2), S(s2), S(t), S(rowmax), S(sumexp), S(tmax), S(sums),
                            side ? tg.g : tg.c, v0, N, (size_t)vl, 0.5f, 0.25f, 0.75f));
        cmp(x, "kd_bwd", "in place", s2, FP32);
        drop(x, s2);
        drop(x, t);
        drop(x, tmax);
        drop(x, sums);
        drop(x, kl);
        drop(x, d);
    }
    /* in place, with a scale instead of dloss */
    ON_BOTH(mc_k_xent_bwd(be, S(logits), S(logits), S(rowmax), S(sumexp), side ? tg.g : tg.c, v0, N,
                          (size_t)vl, NULL, 0.125f, MC_PREC_FP32));
    cmp(x, "xent_bwd", "in place", logits, FP32);
    drop(x, dl);
    drop(x, logits);
    drop(x, rowmax);
    drop(x, sumexp);
    drop(x, tlogit);
    drop(x, loss);
    drop(x, dloss);
    idrop(x, tg);
    drop(x, xx);
    drop(x, nw);
    drop(x, nb);
    drop(x, mean);
    drop(x, rstd);
    drop(x, wpe);
    drop(x, dwpe);
    drop(x, wte);
    drop(x, dwte);
    drop(x, g);
    drop(x, o);
    idrop(x, id);
}

static void check_linear(ctx *x, size_t N, size_t I, size_t O)
{
    static const char *pn[] = {"fp32", "bf16", "fp16", "tf32"};
    static const double tol[] = {FP32, HALF, HALF, TF32};
    pair xx = rnd(x, N * I, 1), W = rnd(x, O * I, 0.5f), b = rnd(x, O, 1), g = rnd(x, N * O, 1);
    for (int prec = 0; prec < 4; prec++) {
        char w[96], k[32];
        snprintf(w, sizeof w, "N=%zu I=%zu O=%zu", N, I, O);
        snprintf(k, sizeof k, "linear %s", pn[prec]);
        pair o = poisoned(x, N * O);
        ON_BOTH(
            mc_k_linear_fwd(be, (mc_prec)prec, S(o), S(xx), S(W), NULL, S(b), N, I, O, 0.0f, 0));
        cmp(x, k, w, o, tol[prec]);
        ON_BOTH(
            mc_k_linear_fwd(be, (mc_prec)prec, S(o), S(xx), S(W), NULL, NULL, N, I, O, 1.0f, 0));
        cmp(x, k, "beta=1, no bias", o, tol[prec]);
        pair dx = rnd(x, N * I, 1), dW = rnd(x, O * I, 1), db = rnd(x, O, 1);
        ON_BOTH(mc_k_linear_bwd(be, (mc_prec)prec, S(dx), S(dW), S(db), S(g), S(xx), S(W), NULL, N,
                                I, O, 0));
        cmp(x, k, "bwd dx", dx, tol[prec]);
        cmp(x, k, "bwd dW", dW, tol[prec]);
        cmp(x, k, "bwd db", db, FP32);
        /* MC_LIN_DX_WRITE: dx written over poison; and over x itself (dW,
         * made first, reads x before dx replaces it) */
        pair dxw = poisoned(x, N * I), dW2 = rnd(x, O * I, 1), xa = rnd(x, N * I, 1),
             dW3 = rnd(x, O * I, 1);
        ON_BOTH(mc_k_linear_bwd(be, (mc_prec)prec, S(dxw), S(dW2), NULL, S(g), S(xx), S(W), NULL,
                                N, I, O, MC_LIN_DX_WRITE));
        cmp(x, k, "bwd dx written (MC_LIN_DX_WRITE)", dxw, tol[prec]);
        cmp(x, k, "bwd dW beside a written dx", dW2, tol[prec]);
        ON_BOTH(mc_k_linear_bwd(be, (mc_prec)prec, S(xa), S(dW3), NULL, S(g), S(xa), S(W), NULL, N,
                                I, O, MC_LIN_DX_WRITE));
        cmp(x, k, "bwd dx written over x", xa, tol[prec]);
        cmp(x, k, "bwd dW of the x it replaced", dW3, tol[prec]);
        drop(x, o);
        drop(x, dx);
        drop(x, dW);
        drop(x, db);
        drop(x, dxw);
        drop(x, dW2);
        drop(x, xa);
        drop(x, dW3);
    }
    drop(x, xx);
    drop(x, W);
    drop(x, b);
    drop(x, g);
}

/* FP8 (lib/model/fp8.c's use): operands quantized on each side (the same
 * bits, fp8_emu.cc), then the three GEMMs of an FP8 linear; the GPU's are
 * cuBLASLt's FP8 GEMMs where the shape allows (every dimension the GEMM
 * reduces over a multiple of 16) and its fp32 GEMM otherwise, against the
 * CPU's fp32 GEMM on the same values: bf16 tolerance (issue 11, section 4;
 * the products are exact, only the accumulation differs). amax_into's
 * running maximum, exactly. */
static void check_fp8(ctx *x, size_t N, size_t I, size_t O)
{
    char w[96];
    snprintf(w, sizeof w, "N=%zu I=%zu O=%zu", N, I, O);
    pair xx = rnd(x, N * I, 3), W = rnd(x, O * I, 0.05f), g = rnd(x, N * O, 1e-4f);
    pair qx = poisoned(x, N * I), qw = poisoned(x, O * I), qg = poisoned(x, N * O);
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        ON_BOTH(mc_k_fp8_quantize(be, S(qx), S(xx), N * I, 448.0f / 3, 0));
        ON_BOTH(mc_k_fp8_quantize(be, S(qw), S(W), O * I, 448.0f / 0.05f, 0));
        ON_BOTH(mc_k_fp8_quantize(be, S(qg), S(g), N * O, e5m2 ? 57344.0f / 1e-4f : 448.0f / 1e-4f,
                                  e5m2));
        cmp(x, "fp8_quantize", e5m2 ? "dy E5M2" : "dy E4M3", qg, 0);
        char k[40];
        snprintf(k, sizeof k, "fp8_gemm %s", e5m2 ? "hybrid" : "e4m3");
        pair o = poisoned(x, N * O), dx = poisoned(x, N * I), dW = poisoned(x, O * I);
        ON_BOTH(mc_k_fp8_gemm(be, 0, S(o), S(qx), S(qw), N, I, O, 0));
        cmp(x, k, "fwd", o, HALF);
        ON_BOTH(mc_k_fp8_gemm(be, 1, S(dx), S(qg), S(qw), N, I, O, e5m2));
        cmp(x, k, "dgrad", dx, HALF);
        ON_BOTH(mc_k_fp8_gemm(be, 2, S(dW), S(qg), S(qx), N, I, O, e5m2));
        snprintf(w, sizeof w, "wgrad N=%zu I=%zu O=%zu", N, I, O);
        cmp(x, k, w, dW, HALF);
        drop(x, o);
        drop(x, dx);
        drop(x, dW);
    }
    pair m = mk(x, 1);
    float half = 0.5f;
    put(x, m, &half);
    ON_BOTH(mc_k_amax_into(be, S(m), S(xx), N * I));
    ON_BOTH(mc_k_amax_into(be, S(m), S(qg), 0));
    snprintf(w, sizeof w, "max of 0.5 and |x| (N x I = %zu)", N * I);
    cmp(x, "amax_into", w, m, 0);
    drop(x, m);
    drop(x, xx);
    drop(x, W);
    drop(x, g);
    drop(x, qx);
    drop(x, qw);
    drop(x, qg);
}

/* the int32 array of a pair's sides equal */
static void icmp(ctx *x, const char *kernel, const char *what, ipair p, size_t n)
{
    int32_t *a = malloc(n * 4 + 4), *b = malloc(n * 4 + 4);
    mc_bcopy_to_host(x->c, a, p.c, n * 4);
    mc_bcopy_to_host(x->g, b, p.g, n * 4);
    check(x, kernel, !memcmp(a, b, n * 4), what);
    free(a);
    free(b);
}

/* The mixture-of-experts kernels (kern/cuda/moe.cu), N tokens, E experts,
 * top-K: the GPU's choices, counts and permutations equal the CPU's, its
 * floats within fp32 rounding (1e-5), the grouped GEMM at its precision. */
#define SJ(p) (side ? (p).g : (p).c)
static void check_moe(ctx *x, size_t N, size_t E, int K, int sigmoid, int groups)
{
    char w[96];
    snprintf(w, sizeof w, "N=%zu E=%zu K=%d %s%s", N, E, K, sigmoid ? "sigmoid" : "softmax",
             groups ? " groups" : "");
    mc_moe_route r = {K, sigmoid, 0, sigmoid ? 2.5f : 0.0f, groups ? 4 : 0, groups ? 2 : 0};
    pair logits = rnd(x, N * E, 2), bias = rnd(x, E, 0.3f);
    pair probs = poisoned(x, N * (size_t)K);
    ipair idx = ids(x, N * (size_t)K, 0, 1);
    ON_BOTH(
        mc_k_moe_route_fwd(be, S(probs), SJ(idx), S(logits), sigmoid ? S(bias) : NULL, N, E, &r));
    icmp(x, "moe_route_fwd_idx", w, idx, N * (size_t)K);
    cmp(x, "moe_route_fwd", "probs", probs, FP32);
    pair dprobs = rnd(x, N * (size_t)K, 1), dl = rnd(x, N * E, 1);
    ON_BOTH(mc_k_moe_route_bwd(be, S(dl), S(dprobs), S(logits), idx.c, N, E, &r));
    cmp(x, "moe_route_bwd", w, dl, FP32);
    double a[2], z[2];
    ON_BOTH(
        a[side] = mc_k_moe_aux_loss(be, S(dl), S(logits), 2, N / 2, E, (size_t)K, sigmoid, 0.3f));
    record(x, "moe_aux_loss", fabs(a[1] - a[0]) / fabs(a[0]), FP32);
    check(x, "moe_aux_loss", fabs(a[1] - a[0]) <= FP32 * fabs(a[0]), w);
    cmp(x, "moe_aux_loss", "dlogits", dl, FP32);
    ON_BOTH(z[side] = mc_k_moe_z_loss(be, S(dl), S(logits), N, E, 0.2f));
    record(x, "moe_z_loss", fabs(z[1] - z[0]) / fabs(z[0]), FP32);
    check(x, "moe_z_loss", fabs(z[1] - z[0]) <= FP32 * fabs(z[0]), w);
    cmp(x, "moe_z_loss", "dlogits", dl, FP32);
    /* the CPU's choices on both sides from here: the same permutation */
    {
        int32_t *h = malloc(N * (size_t)K * 4);
        mc_bcopy_to_host(x->c, h, idx.c, N * (size_t)K * 4);
        for (size_t i = 0; i < N * (size_t)K; i += 11) h[i] = -1; /* some dropped */
        mc_bcopy_from_host(x->c, idx.c, h, N * (size_t)K * 4);
        mc_bcopy_from_host(x->g, idx.g, h, N * (size_t)K * 4);
        free(h);
    }
    ipair kept = ids(x, N * (size_t)K, 0, 1);
    for (int pos = 0; pos < 2; pos++) {
        ON_BOTH(mc_k_moe_capacity_drop(be, SJ(kept), SJ(idx), S(probs), N, E, (size_t)K,
                                       N * (size_t)K / E * 3 / 4, pos));
        icmp(x, "moe_capacity_drop", pos ? "position" : "probs", kept, N * (size_t)K);
    }
    idrop(x, kept);
    ipair perm = ids(x, N * (size_t)K, 0, 1), counts = ids(x, E, 0, 1);
    ON_BOTH(mc_k_moe_permute_map(be, SJ(perm), SJ(counts), SJ(idx), N, E, (size_t)K, 0));
    icmp(x, "moe_permute_map", w, perm, N * (size_t)K);
    icmp(x, "moe_permute_map", "counts", counts, E);
    int32_t *cnt = malloc(E * 4);
    mc_bcopy_to_host(x->c, cnt, counts.c, E * 4);
    int64_t *rows = malloc(E * sizeof *rows);
    size_t R = 0;
    for (size_t e = 0; e < E; e++) R += (size_t)(rows[e] = cnt[e]);
    const size_t C = 96, F = 80;
    pair h = rnd(x, N * C, 1), xp = poisoned(x, R * C);
    ON_BOTH(mc_k_moe_permute(be, S(xp), S(h), SJ(perm), N, (size_t)K, C));
    cmp(x, "moe_permute", w, xp, 0);
    pair W1 = rnd(x, E * F * C, 0.1f), b1 = rnd(x, E * F, 0.1f), hid = poisoned(x, R * F);
    for (int prec = 0; prec < 2; prec++) {
        mc_prec pr = prec ? MC_PREC_BF16 : MC_PREC_FP32;
        ON_BOTH(mc_k_grouped_linear_fwd(be, pr, S(hid), S(xp), S(W1), NULL, S(b1), rows, E, C, F));
        cmp(x, "grouped_linear_fwd", prec ? "bf16" : w, hid, prec ? HALF : FP32);
        pair dh = rnd(x, R * F, 1), dxp = rnd(x, R * C, 1), dW = rnd(x, E * F * C, 1),
             db = rnd(x, E * F, 1);
        ON_BOTH(mc_k_grouped_linear_bwd(be, pr, S(dxp), S(dW), S(db), S(dh), S(xp), S(W1), NULL,
                                        rows, E, C, F));
        cmp(x, "grouped_linear_bwd", prec ? "dx bf16" : "dx", dxp, prec ? HALF : FP32);
        cmp(x, "grouped_linear_bwd", prec ? "dW bf16" : "dW", dW, prec ? HALF : FP32);
        cmp(x, "grouped_linear_bwd", "db", db, FP32);
        drop(x, dh);
        drop(x, dxp);
        drop(x, dW);
        drop(x, db);
    }
    pair yp = rnd(x, R * C, 1), y = poisoned(x, N * C), dy = rnd(x, N * C, 1);
    ON_BOTH(mc_k_moe_unpermute(be, S(y), S(yp), S(probs), SJ(perm), N, (size_t)K, C));
    cmp(x, "moe_unpermute", w, y, FP32);
    pair dyp = rnd(x, R * C, 1), dpr = poisoned(x, N * (size_t)K), dh2 = rnd(x, N * C, 1);
    ON_BOTH(mc_k_moe_unpermute_bwd(be, S(dyp), S(dpr), S(dy), S(yp), S(probs), SJ(perm), N,
                                   (size_t)K, C));
    cmp(x, "moe_unpermute_bwd", "dyp", dyp, FP32);
    cmp(x, "moe_unpermute_bwd", "dprobs", dpr, FP32);
    ON_BOTH(mc_k_moe_permute_bwd(be, S(dh2), S(dyp), SJ(perm), N, (size_t)K, C));
    cmp(x, "moe_permute_bwd", w, dh2, FP32);
    pair tok = rnd(x, E, 50), eb = rnd(x, E, 1);
    ON_BOTH(mc_k_moe_expert_bias_update(be, S(eb), S(tok), E, 1e-3f));
    cmp(x, "moe_expert_bias_update", w, eb, 0);
    free(cnt);
    free(rows);
    drop(x, logits);
    drop(x, bias);
    drop(x, probs);
    drop(x, dprobs);
    drop(x, dl);
    drop(x, h);
    drop(x, xp);
    drop(x, W1);
    drop(x, b1);
    drop(x, hid);
    drop(x, yp);
    drop(x, y);
    drop(x, dy);
    drop(x, dyp);
    drop(x, dpr);
    drop(x, dh2);
    drop(x, tok);
    drop(x, eb);
    idrop(x, idx);
    idrop(x, perm);
    idrop(x, counts);
}
#undef SJ

/* packed: documents packed in each sequence (segment starts for the
 * attention, positions for RoPE), with the kernels' names suffixed "_docs" */
static void check_attention(ctx *x, size_t B, size_t T, size_t Q, size_t G, size_t D, int packed)
{
    char w[96];
    snprintf(w, sizeof w, "B=%zu T=%zu Q=%zu G=%zu D=%zu%s", B, T, Q, G, D,
             packed ? " packed" : "");
    ipair sg = {NULL, NULL}, ps = {NULL, NULL};
    if (packed) packed_docs(x, B, T, &sg, &ps);
#define SI(p) (side ? (p).g : (p).c)
#define K(name) (packed ? name "_docs" : name)
    size_t N = B * T, hpg = Q / G;
    /* the fused QKV projection output, split */
    pair qkv = rnd(x, N * G * (hpg + 2) * D, 1);
    pair q = poisoned(x, N * Q * D), k = poisoned(x, N * G * D), v = poisoned(x, N * G * D);
    ON_BOTH(mc_k_qkv_split(be, S(q), S(k), S(v), S(qkv), N, Q, G, D));
    cmp(x, "qkv_split", w, q, 0);
    cmp(x, "qkv_split", "k", k, 0);
    cmp(x, "qkv_split", "v", v, 0);
    ON_BOTH(mc_k_rope_fwd(be, S(q), B, T, Q, D, &rope10k, 3, SI(ps)));
    cmp(x, K("rope_fwd"), w, q, FP32);
    ON_BOTH(mc_k_rope_fwd(be, S(k), B, T, G, D, &rope10k, 3, SI(ps)));
    pair out = poisoned(x, N * Q * D), lse = poisoned(x, B * Q * T);
    float scale = 1.0f / sqrtf((float)D);
    ON_BOTH(mc_k_attention_fwd(be, S(out), S(lse), S(q), S(k), S(v), B, T, Q, G, D, scale, SI(sg)));
    cmp(x, K("attention_fwd"), w, out, FP32);
    cmp(x, K("attention_fwd"), "lse", lse, FP32);
    pair dout = rnd(x, N * Q * D, 1), dq = rnd(x, N * Q * D, 1), dk = rnd(x, N * G * D, 1),
         dv = rnd(x, N * G * D, 1);
    ON_BOTH(mc_k_attention_bwd(be, S(dq), S(dk), S(dv), S(dout), S(q), S(k), S(v), S(out), S(lse),
                               B, T, Q, G, D, scale, SI(sg)));
    cmp(x, K("attention_bwd"), "dq", dq, FP32);
    cmp(x, K("attention_bwd"), "dk", dk, FP32);
    cmp(x, K("attention_bwd"), "dv", dv, FP32);
    ON_BOTH(mc_k_rope_bwd(be, S(dq), B, T, Q, D, &rope10k, 3, SI(ps)));
    cmp(x, K("rope_bwd"), w, dq, FP32);
    if (packed) { /* learned positions at the documents' positions */
        pair wpe = rnd(x, T * D, 1), o = rnd(x, N * D, 1), dwpe = rnd(x, T * D, 1);
        ON_BOTH(mc_k_posemb_fwd(be, S(o), S(wpe), B, T, D, 0, SI(ps)));
        cmp(x, K("posemb_fwd"), w, o, FP32);
        ON_BOTH(mc_k_posemb_bwd(be, S(dwpe), S(o), B, T, D, 0, SI(ps)));
        cmp(x, K("posemb_bwd"), w, dwpe, FP32);
        drop(x, wpe);
        drop(x, o);
        drop(x, dwpe);
    }
    /* a bf16 model's attention: the GPU on the tensor cores (flash.cu,
     * bf16 operands), the CPU still fp32 */
    if (D % 16 == 0) {
        char wb[112];
        snprintf(wb, sizeof wb, "%s bf16", w);
        pair o16 = poisoned(x, N * Q * D), l16 = poisoned(x, B * Q * T);
        pair dq16 = rnd(x, N * Q * D, 1), dk16 = rnd(x, N * G * D, 1), dv16 = rnd(x, N * G * D, 1);
        ON_BOTH(mc_backend_set_attention_prec(be, MC_PREC_BF16));
        ON_BOTH(
            mc_k_attention_fwd(be, S(o16), S(l16), S(q), S(k), S(v), B, T, Q, G, D, scale, SI(sg)));
        cmp(x, K("attention_fwd_bf16"), wb, o16, HALF);
        cmp(x, K("attention_fwd_bf16"), "lse", l16, HALF);
        ON_BOTH(mc_k_attention_bwd(be, S(dq16), S(dk16), S(dv16), S(dout), S(q), S(k), S(v), S(o16),
                                   S(l16), B, T, Q, G, D, scale, SI(sg)));
        cmp(x, K("attention_bwd_bf16"), "dq", dq16, HALF);
        cmp(x, K("attention_bwd_bf16"), "dk", dk16, HALF);
        cmp(x, K("attention_bwd_bf16"), "dv", dv16, HALF);
        void *a1 = gbytes(x, dk16);
        mc_k_attention_bwd(x->g, NULL, dk16.g, NULL, dout.g, q.g, k.g, v.g, o16.g, l16.g, B, T, Q,
                           G, D, scale, sg.g);
        pair again = mk(x, dk16.n);
        mc_bcopy_from_host(x->g, again.g, a1, dk16.n * 4);
        mc_k_attention_bwd(x->g, NULL, again.g, NULL, dout.g, q.g, k.g, v.g, o16.g, l16.g, B, T, Q,
                           G, D, scale, sg.g);
        void *a2 = gbytes(x, dk16), *a3 = gbytes(x, again);
        check(x, K("attention_bwd_bf16"), !memcmp(a2, a3, dk16.n * 4),
              "deterministic (same bytes twice)");
        free(a1);
        free(a2);
        free(a3);
        drop(x, again);
        ON_BOTH(mc_backend_set_attention_prec(be, MC_PREC_FP32));
        drop(x, o16);
        drop(x, l16);
        drop(x, dq16);
        drop(x, dk16);
        drop(x, dv16);
    }
    /* inference: the last rows as new ones against the whole cache (B = 1:
     * the first sequence's keys and values are its cache) */
    {
        size_t nn = T < 5 ? T : 5, p0 = T - nn;
        pair okv = poisoned(x, nn * Q * D);
        ON_BOTH(mc_k_attention_kv_fwd(be, S(okv), S(q) + p0 * Q * D, S(k), S(v), nn, p0, Q, G, D,
                                      scale, SI(sg) ? SI(sg) + p0 : NULL));
        cmp(x, K("attention_kv_fwd"), w, okv, FP32);
        drop(x, okv);
    }
    pair dqkv = rnd(x, qkv.n, 1);
    ON_BOTH(mc_k_qkv_split_bwd(be, S(dqkv), S(dq), S(dk), S(dv), N, Q, G, D));
    cmp(x, "qkv_split_bwd", w, dqkv, FP32);
    /* determinism, and dk not depending on dq/dv being asked for: from the
     * same start, (dq, dk, dv) and (NULL, dk, NULL) add the same bytes */
    {
        void *a1 = gbytes(x, dk);
        mc_k_attention_bwd(x->g, dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, out.g, lse.g, B, T, Q, G,
                           D, scale, sg.g);
        pair again = mk(x, dk.n);
        mc_bcopy_from_host(x->g, again.g, a1, dk.n * 4);
        mc_k_attention_bwd(x->g, NULL, again.g, NULL, dout.g, q.g, k.g, v.g, out.g, lse.g, B, T, Q,
                           G, D, scale, sg.g);
        void *a2 = gbytes(x, dk), *a3 = gbytes(x, again);
        check(x, K("attention_bwd"), !memcmp(a2, a3, dk.n * 4), "deterministic (same bytes twice)");
        free(a1);
        free(a2);
        free(a3);
        drop(x, again);
    }
    drop(x, qkv);
    drop(x, q);
    drop(x, k);
    drop(x, v);
    drop(x, out);
    drop(x, lse);
    drop(x, dout);
    drop(x, dq);
    drop(x, dk);
    drop(x, dv);
    drop(x, dqkv);
    if (packed) {
        idrop(x, sg);
        idrop(x, ps);
    }
#undef SI
#undef K
}

int main(int argc, char **argv)
{
    ctx x = {0};
    x.rng = 20261122;
    int devices = mc_backend_cuda_devices(), rehearse = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--devices")) {
            printf("%d\n", devices);
            return 0;
        } else if (!strcmp(argv[i], "--rehearse")) {
            rehearse = 1;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            x.rng = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: check_kern [--devices] [--rehearse] [--seed N]\n");
            return 2;
        }
    }
    mc_error err;
    if (rehearse) {
        if (mc_backend_cpu_new(0, &x.g, &err)) {
            printf("Bail out! %s\n", err.msg);
            return 1;
        }
        printf("# rehearsal: a second CPU backend in the GPU's place\n");
    } else if (devices == 0 || mc_backend_cuda_new(-1, &x.g, &err)) {
        printf("no GPU: skipped\n");
        return 77;
    }
    if (mc_backend_cpu_new(0, &x.c, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    printf("# seed %llu\n", (unsigned long long)x.rng);
    size_t en[] = {1, 1000, 4097, (size_t)1 << 20};
    for (size_t i = 0; i < sizeof en / sizeof en[0]; i++) check_elementwise(&x, en[i]);
    check_layers(&x, 6, 37, 50);
    check_layers(&x, 256, 768, 1000);
    check_layers(&x, 2048, 256, 50304);
    check_linear(&x, 7, 5, 3);
    check_linear(&x, 256, 768, 2304);
    check_linear(&x, 1000, 300, 517);
    check_fp8(&x, 7, 5, 3);        /* the fp32 fallback */
    check_fp8(&x, 256, 768, 2304); /* cuBLASLt's FP8 GEMMs */
    check_fp8(&x, 1000, 320, 528); /* FP8 forward and dgrad; wgrad over 1000 rows: fallback */
    size_t f8, fb;
    mc_backend_fp8_gemm_stats(x.g, &f8, &fb);
    printf("# fp8_gemm: %zu calls on cuBLASLt's FP8 GEMMs, %zu on the fp32 fallback\n", f8, fb);
    if (!rehearse)
        check(&x, "fp8_gemm", f8 > 0, "cuBLASLt's FP8 GEMMs ran (not only the fallback)");
    for (int packed = 0; packed < 2; packed++) {
        check_attention(&x, 1, 1, 1, 1, 8, packed);
        check_attention(&x, 2, 37, 4, 2, 16, packed);
        check_attention(&x, 1, 130, 2, 2, 64, packed);
        check_attention(&x, 2, 256, 8, 2, 128, packed);
        check_attention(&x, 1, 1024, 12, 12, 64, packed);
    }
    check_moe(&x, 64, 8, 2, 0, 0);
    check_moe(&x, 300, 16, 4, 1, 1);
    check_moe(&x, 2500, 64, 8, 0, 0); /* 20000 choices: several chunks of the map */
    printf("1..%d\n", x.n);
    printf("# %-22s %10s %8s\n", "kernel", "worst err", "bound");
    for (int k = 0; k < x.nnames; k++)
        printf("# %-22s %10.2e %8.0e %s\n", x.names[k], x.worst[k], x.tol[k],
               x.worst[k] <= x.tol[k] ? "ok" : "FAIL");
    printf("# %d of %d checks failed\n", x.fails, x.n);
    mc_backend_free(x.g);
    mc_backend_free(x.c);
    return x.fails ? 1 : 0;
}
