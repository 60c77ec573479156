/*
 * test_kern_layers.c - the CPU backend's per-row layers: vocab-parallel
 * embedding, learned positions, LayerNorm, RMSNorm, GELU, SwiGLU, RoPE and
 * the vocab-parallel cross-entropy. Each forward is compared with a float64
 * reference written here, each backward with central finite differences of
 * that reference (L = sum(dout * f(x)), h = 1e-6), gradients are added onto
 * pre-filled buffers, and reruns give identical bytes.
 */
#include "kern_test.h"

static const mc_rope rope10k = {10000.0f, 0, 0, 0, 0, 0, 0}; /* plain RoPE, base 10000 */

/* ------------------------------------------------------------ embedding */

typedef struct {
    size_t N, C, T, B, pos0;
    int64_t v0, vl;
    const int32_t *ids;
    double *wte, *dout;
} emb_ctx;

static double emb_loss(void *p)
{
    emb_ctx *e = p;
    double L = 0;
    for (size_t i = 0; i < e->N; i++) {
        int64_t r = e->ids[i] - e->v0;
        if (r < 0 || r >= e->vl) continue;
        for (size_t c = 0; c < e->C; c++) L += e->dout[i * e->C + c] * e->wte[r * e->C + c];
    }
    return L;
}

/* posemb: out[b,t,:] += wpe[pos0+t,:]; L = sum dout * wpe[pos0+t] */
static double pos_loss(void *p)
{
    emb_ctx *e = p;
    double L = 0;
    for (size_t b = 0; b < e->B; b++)
        for (size_t t = 0; t < e->T; t++)
            for (size_t c = 0; c < e->C; c++)
                L += e->dout[(b * e->T + t) * e->C + c] * e->wte[(e->pos0 + t) * e->C + c];
    return L;
}

static void check_embed(mc_backend *be)
{
    size_t N = 9, C = 70, V = 10;
    int32_t ids[9] = {0, 3, 4, 6, 7, 3, 9, 6, 3}; /* rank holds [3, 7) */
    int64_t v0 = 3, vl = 4;
    kt_rng r = {11};
    float *wte = kt_falloc(vl * C), *out = kt_falloc(N * C), *dout = kt_falloc(N * C);
    kt_fill(&r, wte, vl * C, -1, 1), kt_fill(&r, out, N * C, 5, 6), kt_fill(&r, dout, N * C, -1, 1);
    mc_k_embed_fwd(be, out, ids, N, wte, v0, vl, C);
    int ok = 1;
    for (size_t i = 0; i < N; i++)
        for (size_t c = 0; c < C; c++) {
            int64_t rr = ids[i] - v0;
            ok &= out[i * C + c] == (rr >= 0 && rr < vl ? wte[rr * C + c] : 0.0f);
        }
    TAP_OK(ok, "embed fwd: rows in [v0, v0+vl) copied, others zero (V=%zu, shard [3,7))", V);
    float *dw = kt_falloc(vl * C);
    kt_fill(&r, dw, vl * C, -1, 1);
    float *dw0 = kt_copy(dw, vl * C);
    mc_k_embed_bwd(be, dw, dout, ids, N, v0, vl, C);
    emb_ctx e = {N, C, 0, 0, 0, v0, vl, ids, kt_todouble(wte, vl * C), kt_todouble(dout, N * C)};
    double err = kt_fd_check(emb_loss, &e, e.wte, vl * C, dw, dw0, SIZE_MAX, 1);
    TAP_OK(err < 1e-6, "embed bwd vs FD, repeated ids, += onto prefill: err %.2e < 1e-6", err);
    float *dw2 = kt_copy(dw0, vl * C);
    mc_k_embed_bwd(be, dw2, dout, ids, N, v0, vl, C);
    TAP_OK(!memcmp(dw, dw2, vl * C * 4), "embed bwd: rerun gives identical bytes");
    free(e.wte), free(e.dout);

    /* positions: B=2, T=5, pos0=3 of a 10-row table */
    size_t B = 2, T = 5, P = 10, pos0 = 3;
    float *wpe = kt_falloc(P * C), *x = kt_falloc(B * T * C), *x0;
    kt_fill(&r, wpe, P * C, -1, 1), kt_fill(&r, x, B * T * C, -1, 1);
    x0 = kt_copy(x, B * T * C);
    mc_k_posemb_fwd(be, x, wpe, B, T, C, pos0, NULL);
    ok = 1;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < C; c++)
                ok &= x[(b * T + t) * C + c] == x0[(b * T + t) * C + c] + wpe[(pos0 + t) * C + c];
    TAP_OK(ok, "posemb fwd: out[b,t] += wpe[pos0+t]");
    float *dwpe = kt_falloc(P * C), *g = kt_falloc(B * T * C);
    kt_fill(&r, dwpe, P * C, -1, 1), kt_fill(&r, g, B * T * C, -1, 1);
    float *dwpe0 = kt_copy(dwpe, P * C);
    mc_k_posemb_bwd(be, dwpe, g, B, T, C, pos0, NULL);
    emb_ctx pe = {0, C, T, B, pos0, 0, 0, NULL, kt_todouble(wpe, P * C), kt_todouble(g, B * T * C)};
    err = kt_fd_check(pos_loss, &pe, pe.wte, P * C, dwpe, dwpe0, SIZE_MAX, 2);
    TAP_OK(err < 1e-6,
           "posemb bwd vs FD (+= onto prefill, rows outside [pos0, pos0+T) "
           "untouched): err %.2e < 1e-6",
           err);
    free(pe.wte), free(pe.dout), free(wpe), free(x), free(x0), free(dwpe), free(g), free(dwpe0);
    free(wte), free(out), free(dout), free(dw), free(dw0), free(dw2);
}

/* ------------------------------------------------------------ norms */

typedef struct {
    size_t N, C;
    int rms, has_b;
    double eps;
    double *x, *w, *b, *dout;
} norm_ctx;

static void ref_norm(const norm_ctx *n, double *out, double *mean, double *rstd)
{
    for (size_t i = 0; i < n->N; i++) {
        const double *x = n->x + i * n->C;
        double mu = 0, var = 0;
        if (!n->rms) {
            for (size_t c = 0; c < n->C; c++) mu += x[c];
            mu /= n->C;
        }
        for (size_t c = 0; c < n->C; c++) var += (x[c] - mu) * (x[c] - mu);
        double rs = 1 / sqrt(var / n->C + n->eps);
        for (size_t c = 0; c < n->C; c++)
            out[i * n->C + c] = (x[c] - mu) * rs * n->w[c] + (n->has_b ? n->b[c] : 0);
        if (mean) mean[i] = mu;
        if (rstd) rstd[i] = rs;
    }
}

static double norm_loss(void *p)
{
    norm_ctx *n = p;
    double *out = kt_dalloc(n->N * n->C), L = 0;
    ref_norm(n, out, NULL, NULL);
    for (size_t i = 0; i < n->N * n->C; i++) L += n->dout[i] * out[i];
    free(out);
    return L;
}

static void check_norm(mc_backend *be, int rms, int has_b, size_t N, size_t C)
{
    const char *nm = rms ? "rmsnorm" : has_b ? "layernorm" : "layernorm (no bias)";
    kt_rng r = {N * 100 + C + (uint64_t)rms};
    float *x = kt_falloc(N * C), *w = kt_falloc(C), *b = kt_falloc(C), *g = kt_falloc(N * C);
    kt_fill(&r, x, N * C, -2, 3), kt_fill(&r, w, C, 0.5, 1.5), kt_fill(&r, b, C, -1, 1);
    kt_fill(&r, g, N * C, -1, 1);
    float *out = kt_falloc(N * C), *mean = kt_falloc(N), *rstd = kt_falloc(N), eps = 1e-5f;
    if (rms)
        mc_k_rmsnorm_fwd(be, out, rstd, x, w, N, C, eps, MC_PREC_FP32);
    else
        mc_k_layernorm_fwd(be, out, mean, rstd, x, w, has_b ? b : NULL, N, C, eps, MC_PREC_FP32);
    norm_ctx n = {N,
                  C,
                  rms,
                  has_b,
                  eps,
                  kt_todouble(x, N * C),
                  kt_todouble(w, C),
                  kt_todouble(b, C),
                  kt_todouble(g, N * C)};
    double *ro = kt_dalloc(N * C), *rm = kt_dalloc(N), *rr = kt_dalloc(N);
    ref_norm(&n, ro, rm, rr);
    double eo = kt_err(out, ro, N * C), es = kt_err(rstd, rr, N);
    double em = rms ? 0 : kt_err(mean, rm, N);
    TAP_OK(eo < 1e-6 && es < 1e-6 && em < 1e-6,
           "%s fwd N=%zu C=%zu: out %.2e, rstd %.2e, mean %.2e < 1e-6", nm, N, C, eo, es, em);

    float *dx = kt_falloc(N * C), *dw = kt_falloc(C), *db = kt_falloc(C);
    kt_fill(&r, dx, N * C, -1, 1), kt_fill(&r, dw, C, -1, 1), kt_fill(&r, db, C, -1, 1);
    float *dx0 = kt_copy(dx, N * C), *dw0 = kt_copy(dw, C), *db0 = kt_copy(db, C);
    if (rms)
        mc_k_rmsnorm_bwd(be, dx, dw, g, x, w, rstd, N, C);
    else
        mc_k_layernorm_bwd(be, dx, dw, has_b ? db : NULL, g, x, w, mean, rstd, N, C);
    double ex = kt_fd_check(norm_loss, &n, n.x, N * C, dx, dx0, 300, 1);
    double ew = kt_fd_check(norm_loss, &n, n.w, C, dw, dw0, 300, 2);
    double eb = has_b ? kt_fd_check(norm_loss, &n, n.b, C, db, db0, 300, 3) : 0;
    TAP_OK(ex < 1e-5 && ew < 1e-5 && eb < 1e-5,
           "%s bwd N=%zu C=%zu vs FD (+= onto prefill): dx %.2e dw %.2e db %.2e < 1e-5", nm, N, C,
           ex, ew, eb);
    if (!has_b && !rms) TAP_OK(!memcmp(db, db0, C * 4), "layernorm bwd: db = NULL is skipped");
    float *dx2 = kt_copy(dx0, N * C), *dw2 = kt_copy(dw0, C), *db2 = kt_copy(db0, C);
    mc_backend *b1 = kt_backend(1);
    if (rms)
        mc_k_rmsnorm_bwd(b1, dx2, dw2, g, x, w, rstd, N, C);
    else
        mc_k_layernorm_bwd(b1, dx2, dw2, has_b ? db2 : NULL, g, x, w, mean, rstd, N, C);
    mc_backend_free(b1);
    TAP_OK(!memcmp(dx, dx2, N * C * 4) && !memcmp(dw, dw2, C * 4) && !memcmp(db, db2, C * 4),
           "%s bwd: 1 thread gives the same bytes", nm);
    free(x), free(w), free(b), free(g), free(out), free(mean), free(rstd), free(n.x), free(n.w);
    free(n.b), free(n.dout), free(ro), free(rm), free(rr), free(dx), free(dw), free(db);
    free(dx0), free(dw0), free(db0), free(dx2), free(dw2), free(db2);
}

/* ------------------------------------------------------------ activations */

typedef struct {
    size_t n, F;
    int swiglu;
    double *x, *dout;
} act_ctx;

static double gelu_ref(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void ref_act(const act_ctx *a, double *out)
{
    if (!a->swiglu) {
        for (size_t i = 0; i < a->n; i++) out[i] = gelu_ref(a->x[i]);
        return;
    }
    for (size_t i = 0; i < a->n; i++)
        for (size_t j = 0; j < a->F; j++) {
            double u = a->x[i * 2 * a->F + j], v = a->x[i * 2 * a->F + a->F + j];
            out[i * a->F + j] = u / (1 + exp(-u)) * v;
        }
}

static double act_loss(void *p)
{
    act_ctx *a = p;
    size_t m = a->swiglu ? a->n * a->F : a->n;
    double *out = kt_dalloc(m), L = 0;
    ref_act(a, out);
    for (size_t i = 0; i < m; i++) L += a->dout[i] * out[i];
    free(out);
    return L;
}

static void check_act(mc_backend *be, int swiglu)
{
    size_t N = 40, F = 33, nin = swiglu ? N * 2 * F : N * F, nout = N * F;
    kt_rng r = {20 + (uint64_t)swiglu};
    float *x = kt_falloc(nin), *g = kt_falloc(nout), *out = kt_falloc(nout);
    kt_fill(&r, x, nin, -5, 5), kt_fill(&r, g, nout, -1, 1);
    if (swiglu)
        mc_k_swiglu_fwd(be, out, x, N, F, MC_PREC_FP32);
    else
        mc_k_gelu_fwd(be, out, x, nin, MC_PREC_FP32);
    act_ctx a = {swiglu ? N : nin, F, swiglu, kt_todouble(x, nin), kt_todouble(g, nout)};
    double *ro = kt_dalloc(nout);
    ref_act(&a, ro);
    double eo = kt_err(out, ro, nout);
    float *dx = kt_falloc(nin);
    kt_fill(&r, dx, nin, -1, 1);
    float *dx0 = kt_copy(dx, nin);
    if (swiglu)
        mc_k_swiglu_bwd(be, dx, g, x, N, F);
    else
        mc_k_gelu_bwd(be, dx, g, x, nin);
    double ex = kt_fd_check(act_loss, &a, a.x, nin, dx, dx0, SIZE_MAX, 1);
    TAP_OK(eo < 1e-6 && ex < 1e-5,
           "%s fwd err %.2e < 1e-6, bwd vs FD (+= onto prefill) %.2e < 1e-5",
           swiglu ? "swiglu" : "gelu", eo, ex);
    /* in place: x becomes d(x), the bits of the accumulating kernel onto a
     * zeroed dx (model.c's d(fc1) in fc1's memory); -0 and 0 products
     * included (g's first elements) */
    for (size_t i = 0; i < 4; i++) g[i] = i % 2 ? -0.0f : 0.0f;
    float *dz = kt_falloc(nin), *xi = kt_copy(x, nin);
    mc_k_fill(be, dz, 0.0f, nin);
    if (swiglu) {
        mc_k_swiglu_bwd(be, dz, g, x, N, F);
        mc_k_swiglu_bwd_inplace(be, xi, g, N, F);
    } else {
        mc_k_gelu_bwd(be, dz, g, x, nin);
        mc_k_gelu_bwd_inplace(be, xi, g, nin);
    }
    TAP_OK(!memcmp(dz, xi, nin * sizeof(float)), "%s bwd in place: the bits of += onto zeros",
           swiglu ? "swiglu" : "gelu");
    free(dz), free(xi);
    free(x), free(g), free(out), free(a.x), free(a.dout), free(ro), free(dx), free(dx0);
}

/* ------------------------------------------------------------ rope */

typedef struct {
    size_t B, T, H, D, pos0;
    double base;
    double *x, *dout;
    size_t rot;  /* dims rotated (0: D) */
    int scaling; /* Llama 3.1's, with factor 8, low 1, high 4, original 8192 */
} rope_ctx;

/* transformers' _compute_llama3_parameters, as written there: wavelengths
 * longer than the original context / low_freq_factor are slowed by the
 * factor, those between the two bounds blended */
static double llama3_inv(double inv)
{
    double factor = 8, low = 1, high = 4, old = 8192;
    double low_wavelen = old / low, high_wavelen = old / high, wavelen = 2 * M_PI / inv;
    double scaled = wavelen > low_wavelen ? inv / factor : inv;
    double smooth = (old / wavelen - low) / (high - low);
    double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    return medium ? smoothed : scaled;
}

static void ref_rope(const rope_ctx *c, double *out)
{
    size_t R = c->rot ? c->rot : c->D, half = R / 2;
    for (size_t b = 0; b < c->B; b++)
        for (size_t t = 0; t < c->T; t++)
            for (size_t h = 0; h < c->H; h++) {
                const double *x = c->x + ((b * c->T + t) * c->H + h) * c->D;
                double *o = out + ((b * c->T + t) * c->H + h) * c->D;
                for (size_t i = R; i < c->D; i++) o[i] = x[i]; /* not rotated */
                for (size_t i = 0; i < half; i++) {
                    double inv = pow(c->base, -2.0 * i / R);
                    if (c->scaling) inv = llama3_inv(inv);
                    double ang = (double)(c->pos0 + t) * inv;
                    o[i] = x[i] * cos(ang) - x[i + half] * sin(ang);
                    o[i + half] = x[i + half] * cos(ang) + x[i] * sin(ang);
                }
            }
}

static double rope_loss(void *p)
{
    rope_ctx *c = p;
    size_t n = c->B * c->T * c->H * c->D;
    double *out = kt_dalloc(n), L = 0;
    ref_rope(c, out);
    for (size_t i = 0; i < n; i++) L += c->dout[i] * out[i];
    free(out);
    return L;
}

static void check_rope(mc_backend *be)
{
    size_t B = 2, T = 9, H = 3, D = 16, pos0 = 1000, n = B * T * H * D;
    kt_rng r = {30};
    float *x = kt_falloc(n), *g = kt_falloc(n);
    kt_fill(&r, x, n, -1, 1), kt_fill(&r, g, n, -1, 1);
    rope_ctx c = {B, T, H, D, pos0, 10000.0, kt_todouble(x, n), kt_todouble(g, n), 0, 0};
    double *ro = kt_dalloc(n);
    ref_rope(&c, ro);
    float *y = kt_copy(x, n);
    mc_k_rope_fwd(be, y, B, T, H, D, &rope10k, pos0, NULL);
    double eo = kt_err(y, ro, n);
    TAP_OK(eo < 1e-6, "rope fwd (rotate half, base 1e4, pos0 %zu) vs float64: %.2e < 1e-6", pos0,
           eo);
    /* the backward rewrites dx in place: dx = R^T dout */
    float *dx = kt_copy(g, n);
    mc_k_rope_bwd(be, dx, B, T, H, D, &rope10k, pos0, NULL);
    double ex = kt_fd_check(rope_loss, &c, c.x, n, dx, NULL, SIZE_MAX, 1);
    TAP_OK(ex < 1e-6, "rope bwd (in place) vs FD: %.2e < 1e-6", ex);
    mc_k_rope_bwd(be, y, B, T, H, D, &rope10k, pos0, NULL);
    double rt = 0;
    for (size_t i = 0; i < n; i++) rt = fmax(rt, fabs(y[i] - x[i]));
    TAP_OK(rt < 1e-6, "rope bwd undoes rope fwd: max diff %.2e < 1e-6", rt);
    free(x), free(g), free(c.x), free(c.dout), free(ro), free(y), free(dx);
}

/* Partial rotation (--rotary-percent) and Llama 3.1's frequency scaling at
 * long positions (--use-rope-scaling), each and both, against float64 and
 * finite differences; base 500000 as Llama 3's. */
static void check_rope_variants(mc_backend *be)
{
    size_t B = 1, T = 5, H = 2, D = 32, n = B * T * H * D;
    struct {
        size_t rot;
        int scaling;
        size_t pos0;
    } v[] = {{16, 0, 7}, {0, 1, 20000}, {16, 1, 100000}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        kt_rng r = {31 + k};
        float *x = kt_falloc(n), *g = kt_falloc(n);
        kt_fill(&r, x, n, -1, 1), kt_fill(&r, g, n, -1, 1);
        rope_ctx c = {
            B,        T,           H, D, v[k].pos0, 500000.0, kt_todouble(x, n), kt_todouble(g, n),
            v[k].rot, v[k].scaling};
        mc_rope rp = {500000.0f, (int)v[k].rot, v[k].scaling, 8.0f, 1.0f, 4.0f, 8192};
        double *ro = kt_dalloc(n);
        ref_rope(&c, ro);
        float *y = kt_copy(x, n);
        mc_k_rope_fwd(be, y, B, T, H, D, &rp, v[k].pos0, NULL);
        double eo = kt_err(y, ro, n);
        TAP_OK(eo < 2e-6, "rope fwd, %zu of %zu dims rotated%s, pos0 %zu, vs float64: %.2e < 2e-6",
               v[k].rot ? v[k].rot : D, D, v[k].scaling ? ", Llama 3.1 scaling" : "", v[k].pos0,
               eo);
        float *dx = kt_copy(g, n);
        mc_k_rope_bwd(be, dx, B, T, H, D, &rp, v[k].pos0, NULL);
        double ex = kt_fd_check(rope_loss, &c, c.x, n, dx, NULL, SIZE_MAX, 1);
        TAP_OK(ex < 1e-6, "rope bwd of the same vs FD: %.2e < 1e-6", ex);
        free(x), free(g), free(c.x), free(c.dout), free(ro), free(y), free(dx);
    }
    /* scaling changes only the low and middle frequencies */
    mc_rope plain = {500000.0f, 0, 0, 8, 1, 4, 8192}, sc = plain;
    sc.scaling = 1;
    double f0 = mc_rope_inv_freq(&sc, 128, 0) / mc_rope_inv_freq(&plain, 128, 0);
    double f63 = mc_rope_inv_freq(&sc, 128, 63) / mc_rope_inv_freq(&plain, 128, 63);
    TAP_OK(f0 == 1.0 && fabs(f63 - 0.125) < 1e-15,
           "Llama 3.1 scaling keeps the highest frequency (x%g), divides the lowest by 8 (x%g)", f0,
           f63);
}

/* ------------------------------------------------------------ cross-entropy */

typedef struct {
    size_t N, V;
    const int32_t *tg;
    double *logits, *dloss;
} xent_ctx;

/* loss_i = logsumexp_j l_ij - l_i,t (0 for t < 0) */
static void ref_xent(const xent_ctx *c, double *loss)
{
    for (size_t i = 0; i < c->N; i++) {
        const double *l = c->logits + i * c->V;
        double m = -INFINITY, s = 0;
        for (size_t j = 0; j < c->V; j++) m = fmax(m, l[j]);
        for (size_t j = 0; j < c->V; j++) s += exp(l[j] - m);
        loss[i] = c->tg[i] < 0 ? 0 : log(s) + m - l[c->tg[i]];
    }
}

static double xent_loss(void *p)
{
    xent_ctx *c = p;
    double *loss = kt_dalloc(c->N), L = 0;
    ref_xent(c, loss);
    for (size_t i = 0; i < c->N; i++) L += c->dloss[i] * loss[i];
    free(loss);
    return L;
}

static void check_xent(mc_backend *be)
{
    size_t N = 7, V = 50, H = V / 2;
    int32_t tg[7] = {3, 49, -1, 25, 24, 0, 30};
    kt_rng r = {40};
    float *lg = kt_falloc(N * V), *dl = kt_falloc(N);
    kt_fill(&r, lg, N * V, -8, 8), kt_fill(&r, dl, N, 0.5, 2);
    float *mx = kt_falloc(N), *se = kt_falloc(N), *tl = kt_falloc(N), *loss = kt_falloc(N);
    mc_k_xent_max(be, mx, lg, N, V);
    mc_k_xent_sumexp(be, se, tl, lg, mx, tg, 0, N, V);
    mc_k_xent_loss(be, loss, mx, se, tl, tg, N);
    xent_ctx c = {N, V, tg, kt_todouble(lg, N * V), kt_todouble(dl, N)};
    double *rl = kt_dalloc(N);
    ref_xent(&c, rl);
    double el = kt_err(loss, rl, N);
    TAP_OK(el < 1e-6 && loss[2] == 0,
           "xent loss vs float64 log-softmax: %.2e < 1e-6; ignored "
           "target (-1) has loss 0",
           el);

    /* TP = 2: each half of the vocabulary on its own "rank", combined with
     * MAX and SUM as the all-reduces would */
    float *h0 = kt_falloc(N * H), *h1 = kt_falloc(N * H);
    for (size_t i = 0; i < N; i++) {
        memcpy(h0 + i * H, lg + i * V, H * 4);
        memcpy(h1 + i * H, lg + i * V + H, H * 4);
    }
    float m0[7], m1[7], gm[7], s0[7], s1[7], t0[7], t1[7], gs[7], gt[7], l2[7];
    mc_k_xent_max(be, m0, h0, N, H);
    mc_k_xent_max(be, m1, h1, N, H);
    for (size_t i = 0; i < N; i++) gm[i] = fmaxf(m0[i], m1[i]);
    mc_k_xent_sumexp(be, s0, t0, h0, gm, tg, 0, N, H);
    mc_k_xent_sumexp(be, s1, t1, h1, gm, tg, (int64_t)H, N, H);
    for (size_t i = 0; i < N; i++) gs[i] = s0[i] + s1[i], gt[i] = t0[i] + t1[i];
    mc_k_xent_loss(be, l2, gm, gs, gt, tg, N);
    double e2 = kt_err(l2, rl, N), d12 = 0;
    for (size_t i = 0; i < N; i++) d12 = fmax(d12, fabs(l2[i] - loss[i]));
    TAP_OK(e2 < 1e-6 && d12 < 1e-5,
           "xent split over 2 vocab shards: err vs float64 %.2e < 1e-6, "
           "max diff vs unsplit %.2e < 1e-5",
           e2, d12);

    /* backward, weights dloss: vs FD of sum_i dloss_i loss_i */
    float *dlg = kt_falloc(N * V);
    mc_k_xent_bwd(be, dlg, lg, mx, se, tg, 0, N, V, dl, 0.0f, MC_PREC_FP32);
    double eg = kt_fd_check(xent_loss, &c, c.logits, N * V, dlg, NULL, SIZE_MAX, 1);
    int zero = 1;
    for (size_t j = 0; j < V; j++) zero &= dlg[2 * V + j] == 0;
    TAP_OK(eg < 1e-5 && zero, "xent bwd vs FD: %.2e < 1e-5; ignored row has zero gradient", eg);
    /* in place over the logits gives the same bytes */
    float *inplace = kt_copy(lg, N * V);
    mc_k_xent_bwd(be, inplace, inplace, mx, se, tg, 0, N, V, dl, 0.0f, MC_PREC_FP32);
    TAP_OK(!memcmp(inplace, dlg, N * V * 4), "xent bwd in place over the logits: same bytes");
    /* dloss == NULL: every row weighted by scale */
    float *ds = kt_falloc(N * V), *dd = kt_falloc(N * V), ones[7];
    for (size_t i = 0; i < N; i++) ones[i] = 0.25f;
    mc_k_xent_bwd(be, ds, lg, mx, se, tg, 0, N, V, NULL, 0.25f, MC_PREC_FP32);
    mc_k_xent_bwd(be, dd, lg, mx, se, tg, 0, N, V, ones, 0.0f, MC_PREC_FP32);
    TAP_OK(!memcmp(ds, dd, N * V * 4), "xent bwd with dloss NULL equals dloss = scale everywhere");
    /* sharded backward equals the matching columns of the whole */
    float *g0 = kt_falloc(N * H), *g1 = kt_falloc(N * H);
    mc_k_xent_bwd(be, g0, h0, gm, gs, tg, 0, N, H, dl, 0.0f, MC_PREC_FP32);
    mc_k_xent_bwd(be, g1, h1, gm, gs, tg, (int64_t)H, N, H, dl, 0.0f, MC_PREC_FP32);
    double es = 0;
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < H; j++) {
            es = fmax(es, fabs(g0[i * H + j] - dlg[i * V + j]));
            es = fmax(es, fabs(g1[i * H + j] - dlg[i * V + H + j]));
        }
    TAP_OK(es < 1e-6, "xent bwd over 2 shards matches the unsplit gradient: %.2e < 1e-6", es);
    free(lg), free(dl), free(mx), free(se), free(tl), free(loss), free(c.logits), free(c.dloss);
    free(rl), free(h0), free(h1), free(dlg), free(inplace), free(ds), free(dd), free(g0), free(g1);
}

/* The producers' round argument: the output rounded in the same pass equals
 * the FP32 output rounded afterwards by mc_k_round, byte for byte, for each
 * reduced precision (threaded sizes: several rows and spans a thread), and
 * differs from the unrounded output. */
static void check_round_out(mc_backend *be)
{
    static const mc_prec precs[] = {MC_PREC_BF16, MC_PREC_FP16, MC_PREC_TF32};
    static const char *names[] = {"bf16", "fp16", "tf32"};
    kt_rng r = {99};
    size_t N = 300, C = 150, F = 1500, NF = 40, V = 5000, NV = 7;
    float *x = kt_falloc(N * C), *w = kt_falloc(C), *b = kt_falloc(C);
    float *a = kt_falloc(NF * 2 * F), *lg = kt_falloc(NV * V), mean[300], rstd[300];
    kt_fill(&r, x, N * C, -2, 2);
    kt_fill(&r, w, C, 0.5, 1.5);
    kt_fill(&r, b, C, -0.5, 0.5);
    kt_fill(&r, a, NF * 2 * F, -3, 3);
    kt_fill(&r, lg, NV * V, -4, 4);
    float mx[7], se[7], tl[7];
    int32_t tg[7] = {3, 4999, -1, 0, 17, 2500, 1};
    mc_k_xent_max(be, mx, lg, NV, V);
    mc_k_xent_sumexp(be, se, tl, lg, mx, tg, 0, NV, V);
    size_t big = NF * 2 * F > N * C ? NF * 2 * F : N * C;
    float *ref = kt_falloc(big), *got = kt_falloc(big);
    for (int k = 0; k < 3; k++) {
        mc_prec pr = precs[k];
        int ok[5], diff[5];
        size_t n[5] = {N * C, N * C, NF * 2 * F, NF * F, NV * V};
        for (int which = 0; which < 5; which++) {
            for (int pass = 0; pass < 2; pass++) {
                float *o = pass ? got : ref;
                mc_prec rd = pass ? pr : MC_PREC_FP32;
                switch (which) {
                case 0: mc_k_layernorm_fwd(be, o, mean, rstd, x, w, b, N, C, 1e-5f, rd); break;
                case 1: mc_k_rmsnorm_fwd(be, o, rstd, x, w, N, C, 1e-5f, rd); break;
                case 2: mc_k_gelu_fwd(be, o, a, NF * 2 * F, rd); break;
                case 3: mc_k_swiglu_fwd(be, o, a, NF, F, rd); break;
                default: mc_k_xent_bwd(be, o, lg, mx, se, tg, 0, NV, V, NULL, 0.5f, rd);
                }
            }
            diff[which] = memcmp(ref, got, n[which] * 4) != 0;
            mc_k_round(be, ref, n[which], pr);
            ok[which] = !memcmp(ref, got, n[which] * 4);
        }
        TAP_OK(
            ok[0] && ok[1] && ok[2] && ok[3] && ok[4] && diff[0] && diff[1] && diff[2] && diff[3] &&
                diff[4],
            "%s: layernorm, rmsnorm, gelu, swiglu forward and xent backward with round = the "
            "output rounded after by mc_k_round, same bytes (%d%d%d%d%d), and rounded (%d%d%d%d%d)",
            names[k], ok[0], ok[1], ok[2], ok[3], ok[4], diff[0], diff[1], diff[2], diff[3],
            diff[4]);
    }
    free(x), free(w), free(b), free(a), free(lg), free(ref), free(got);
}

int main(void)
{
    mc_backend *be = kt_backend(0);
    check_embed(be);
    check_norm(be, 0, 1, 6, 37);
    check_norm(be, 0, 1, 5, 150); /* more than one 64-column block */
    check_norm(be, 0, 0, 4, 20);
    check_norm(be, 1, 0, 6, 37);
    check_norm(be, 1, 0, 5, 150);
    check_act(be, 0);
    check_act(be, 1);
    check_rope(be);
    check_rope_variants(be);
    check_xent(be);
    check_round_out(be);
    mc_backend_free(be);
    return tap_done();
}
