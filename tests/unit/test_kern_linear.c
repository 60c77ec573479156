/*
 * test_kern_linear.c - the CPU backend's linear layer y = x W^T + b in fp32,
 * bf16 and fp16 (operands rounded, fp32 accumulation): forward against
 * float64, backward against finite differences, += semantics, the reduced
 * precisions against a float64 product of the rounded operands, identical
 * reruns, and a GPT-2-sized timing (not asserted).
 */
#include "kern_test.h"
#include "kern/cpu/cpu.h" /* only to report which bf16 path the backend took */

typedef struct {
    size_t N, I, O;
    double *x, *W, *b, *dout;
} lin_ctx;

/* out[n,o] = sum_i x[n,i] W[o,i] + b[o] */
static void ref_linear(const lin_ctx *c, double *out)
{
    for (size_t n = 0; n < c->N; n++)
        for (size_t o = 0; o < c->O; o++) {
            double s = c->b ? c->b[o] : 0;
            for (size_t i = 0; i < c->I; i++) s += c->x[n * c->I + i] * c->W[o * c->I + i];
            out[n * c->O + o] = s;
        }
}

static double lin_loss(void *ctx)
{
    lin_ctx *c = ctx;
    double *out = kt_dalloc(c->N * c->O), L = 0;
    ref_linear(c, out);
    for (size_t i = 0; i < c->N * c->O; i++) L += c->dout[i] * out[i];
    free(out);
    return L;
}

/* MC_LIN_DX_WRITE: dx written, not added (its prefill ignored), and dx
 * may be x itself (dW, made first, reads x before dx replaces it); the
 * bytes of adding onto zeros */
static void check_dx_write(mc_backend *be, mc_prec prec, const char *pn, const float *g,
                           const float *x, const float *W, const float *dx0, const float *dW0,
                           const float *db0, size_t N, size_t I, size_t O)
{
    float *z = kt_falloc(N * I), *dWa = kt_copy(dW0, O * I), *dba = kt_copy(db0, O);
    memset(z, 0, N * I * 4);
    mc_k_linear_bwd(be, prec, z, dWa, dba, g, x, W, NULL, N, I, O, 0);
    float *dxw = kt_copy(dx0, N * I), *dWw = kt_copy(dW0, O * I), *dbw = kt_copy(db0, O);
    mc_k_linear_bwd(be, prec, dxw, dWw, dbw, g, x, W, NULL, N, I, O, MC_LIN_DX_WRITE);
    float *xa = kt_copy(x, N * I), *dWx = kt_copy(dW0, O * I), *dbx = kt_copy(db0, O);
    mc_k_linear_bwd(be, prec, xa, dWx, dbx, g, xa, W, NULL, N, I, O, MC_LIN_DX_WRITE);
    TAP_OK(!memcmp(z, dxw, N * I * 4) && !memcmp(dWa, dWw, O * I * 4) && !memcmp(dba, dbw, O * 4) &&
               !memcmp(z, xa, N * I * 4) && !memcmp(dWa, dWx, O * I * 4) &&
               !memcmp(dba, dbx, O * 4),
           "linear %s bwd with dx written (MC_LIN_DX_WRITE), also over x itself: the bytes of "
           "adding onto zeros",
           pn);
    free(z), free(dWa), free(dba), free(dxw), free(dWw), free(dbw), free(xa), free(dWx), free(dbx);
}

static void check_fp32(mc_backend *be, size_t N, size_t I, size_t O)
{
    kt_rng r = {N * 131 + I * 17 + O};
    float *x = kt_falloc(N * I), *W = kt_falloc(O * I), *b = kt_falloc(O), *g = kt_falloc(N * O);
    kt_fill(&r, x, N * I, -1, 1), kt_fill(&r, W, O * I, -1, 1), kt_fill(&r, b, O, -1, 1);
    kt_fill(&r, g, N * O, -1, 1);
    lin_ctx c = {N,
                 I,
                 O,
                 kt_todouble(x, N * I),
                 kt_todouble(W, O * I),
                 kt_todouble(b, O),
                 kt_todouble(g, N * O)};
    double *ref = kt_dalloc(N * O);
    ref_linear(&c, ref);
    float *out = kt_falloc(N * O);
    kt_fill(&r, out, N * O, 5, 6); /* beta = 0 must overwrite whatever is there */
    mc_k_linear_fwd(be, MC_PREC_FP32, out, x, W, NULL, b, N, I, O, 0.0f, 0);
    double e0 = kt_err(out, ref, N * O);
    float *acc = kt_falloc(N * O);
    kt_fill(&r, acc, N * O, -1, 1);
    float *acc0 = kt_copy(acc, N * O);
    mc_k_linear_fwd(be, MC_PREC_FP32, acc, x, W, NULL, b, N, I, O, 1.0f, 0);
    double e1 = kt_err_added(acc, acc0, ref, N * O);
    TAP_OK(e0 < 1e-5 && e1 < 1e-5,
           "linear fp32 fwd N=%zu I=%zu O=%zu: beta=0 err %.2e, beta=1 "
           "err %.2e < 1e-5",
           N, I, O, e0, e1);

    float *dx = kt_falloc(N * I), *dW = kt_falloc(O * I), *db = kt_falloc(O);
    kt_fill(&r, dx, N * I, -1, 1), kt_fill(&r, dW, O * I, -1, 1), kt_fill(&r, db, O, -1, 1);
    float *dx0 = kt_copy(dx, N * I), *dW0 = kt_copy(dW, O * I), *db0 = kt_copy(db, O);
    mc_k_linear_bwd(be, MC_PREC_FP32, dx, dW, db, g, x, W, NULL, N, I, O, 0);
    double ex = kt_fd_check(lin_loss, &c, c.x, N * I, dx, dx0, 400, 1);
    double ew = kt_fd_check(lin_loss, &c, c.W, O * I, dW, dW0, 400, 2);
    double eb = kt_fd_check(lin_loss, &c, c.b, O, db, db0, 400, 3);
    TAP_OK(ex < 1e-5 && ew < 1e-5 && eb < 1e-5,
           "linear fp32 bwd N=%zu I=%zu O=%zu vs FD (+= onto prefill): dx %.2e dW %.2e db %.2e "
           "< 1e-5",
           N, I, O, ex, ew, eb);

    /* NULL outputs are skipped; the rest are unchanged by the skipping */
    float *dx2 = kt_copy(dx0, N * I), *db2 = kt_copy(db0, O);
    mc_k_linear_bwd(be, MC_PREC_FP32, dx2, NULL, db2, g, x, W, NULL, N, I, O, 0);
    TAP_OK(!memcmp(dx, dx2, N * I * 4) && !memcmp(db, db2, O * 4),
           "linear bwd with dW = NULL: dx and db identical to the full call");
    check_dx_write(be, MC_PREC_FP32, "fp32", g, x, W, dx0, dW0, db0, N, I, O);
    free(x), free(W), free(b), free(g), free(c.x), free(c.W), free(c.b), free(c.dout);
    free(ref), free(out), free(acc), free(acc0), free(dx), free(dW), free(db);
    free(dx0), free(dW0), free(db0), free(dx2), free(db2);
}

/* max over elements of |got - ref| / (sum_k |a_k b_k|): the error relative
 * to the condition of each dot product; fp32 accumulation of K terms keeps
 * it below about K 2^-24 */
static double dot_err(const float *got, const float *base, const double *ref, const double *mag,
                      size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (base ? (double)base[i] : 0.0) - ref[i]) / mag[i];
        if (!(d <= m)) m = d;
    }
    return m;
}

/* C[M,N] = A[M,K] B[N,K]^T in double, and the magnitudes sum |a b| */
static void ref_abt(const double *A, const double *B, size_t M, size_t N, size_t K, size_t sa_m,
                    size_t sa_k, size_t sb_n, size_t sb_k, double *C, double *mag)
{
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
            double s = 0, a = 0;
            for (size_t k = 0; k < K; k++) {
                double p = A[i * sa_m + k * sa_k] * B[j * sb_n + k * sb_k];
                s += p, a += fabs(p);
            }
            C[i * N + j] = s;
            mag[i * N + j] = a > 0 ? a : 1;
        }
}

static void check_lowp(mc_backend *be, mc_prec prec, size_t N, size_t I, size_t O)
{
    const char *pn = prec == MC_PREC_BF16 ? "bf16" : "fp16";
    kt_rng r = {N * 7 + I * 3 + O + (uint64_t)prec};
    float *x = kt_falloc(N * I), *W = kt_falloc(O * I), *b = kt_falloc(O), *g = kt_falloc(N * O);
    kt_fill(&r, x, N * I, -1, 1), kt_fill(&r, W, O * I, -1, 1), kt_fill(&r, b, O, -1, 1);
    kt_fill(&r, g, N * O, -1, 1);
    /* the rounded operands, through mc_k_round (checked value by value in
     * test_kern_elem) */
    float *xr = kt_copy(x, N * I), *Wr = kt_copy(W, O * I), *gr = kt_copy(g, N * O);
    mc_k_round(be, xr, N * I, prec), mc_k_round(be, Wr, O * I, prec),
        mc_k_round(be, gr, N * O, prec);
    double *dx_ = kt_todouble(x, N * I), *dW_ = kt_todouble(W, O * I);
    double *dxr = kt_todouble(xr, N * I), *dWr = kt_todouble(Wr, O * I),
           *dgr = kt_todouble(gr, N * O);

    float *out = kt_falloc(N * O);
    mc_k_linear_fwd(be, prec, out, x, W, NULL, NULL, N, I, O, 0.0f, 0);
    double *ref = kt_dalloc(N * O), *mag = kt_dalloc(N * O), *ref32 = kt_dalloc(N * O);
    double *mag32 = kt_dalloc(N * O);
    ref_abt(dx_, dW_, N, O, I, I, 1, I, 1, ref32, mag32);
    ref_abt(dxr, dWr, N, O, I, I, 1, I, 1, ref, mag);
    double e_full = kt_err(out, ref32, N * O), e_exact = dot_err(out, NULL, ref, mag, N * O);
    double tol_full = prec == MC_PREC_BF16 ? 1e-2 : 2e-3, tol_exact = (double)I * 0x1p-24;
    TAP_OK(e_full < tol_full, "linear %s fwd N=%zu I=%zu O=%zu: err vs unrounded fp64 %.2e < %.0e",
           pn, N, I, O, e_full, tol_full);
    TAP_OK(
        e_exact < tol_exact,
        "linear %s fwd: vs fp64 on %s-rounded operands %.2e < I*2^-24 = %.1e (fp32 accumulation)",
        pn, pn, e_exact, tol_exact);
    /* bias is added in fp32 after the product */
    float *outb = kt_falloc(N * O);
    mc_k_linear_fwd(be, prec, outb, x, W, NULL, b, N, I, O, 0.0f, 0);
    int bias_ok = 1;
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < O; o++) bias_ok &= outb[n * O + o] == out[n * O + o] + b[o];
    TAP_OK(bias_ok, "linear %s fwd: bias added in fp32 onto the product", pn);

    float *dx = kt_falloc(N * I), *dW = kt_falloc(O * I), *db = kt_falloc(O);
    kt_fill(&r, dx, N * I, -1, 1), kt_fill(&r, dW, O * I, -1, 1), kt_fill(&r, db, O, -1, 1);
    float *dx0 = kt_copy(dx, N * I), *dW0 = kt_copy(dW, O * I), *db0 = kt_copy(db, O);
    mc_k_linear_bwd(be, prec, dx, dW, db, g, x, W, NULL, N, I, O, 0);
    double *rdx = kt_dalloc(N * I), *mdx = kt_dalloc(N * I), *rdW = kt_dalloc(O * I);
    double *mdW = kt_dalloc(O * I), *rdb = kt_dalloc(O);
    /* dx[n,i] = sum_o g[n,o] W[o,i];  dW[o,i] = sum_n g[n,o] x[n,i] */
    ref_abt(dgr, dWr, N, I, O, O, 1, 1, I, rdx, mdx);
    ref_abt(dgr, dxr, O, I, N, 1, O, 1, I, rdW, mdW);
    for (size_t o = 0; o < O; o++)
        for (size_t n = 0; n < N; n++) rdb[o] += g[n * O + o]; /* db from unrounded dout */
    double ex = dot_err(dx, dx0, rdx, mdx, N * I), ew = dot_err(dW, dW0, rdW, mdW, O * I);
    double eb = kt_err_added(db, db0, rdb, O);
    double tol_x = (double)O * 0x1p-24, tol_w = (double)N * 0x1p-24;
    TAP_OK(ex < tol_x && ew < tol_w && eb < 1e-5,
           "linear %s bwd (+= onto prefill) vs fp64 on rounded operands: dx %.2e < %.1e, dW %.2e "
           "< %.1e, db %.2e < 1e-5",
           pn, ex, tol_x, ew, tol_w, eb);

    /* identical bytes on a rerun */
    float *out2 = kt_falloc(N * O), *dx2 = kt_copy(dx0, N * I), *dW2 = kt_copy(dW0, O * I);
    mc_k_linear_fwd(be, prec, out2, x, W, NULL, NULL, N, I, O, 0.0f, 0);
    mc_k_linear_bwd(be, prec, dx2, dW2, NULL, g, x, W, NULL, N, I, O, 0);
    TAP_OK(!memcmp(out, out2, N * O * 4) && !memcmp(dx, dx2, N * I * 4) &&
               !memcmp(dW, dW2, O * I * 4),
           "linear %s: rerun gives identical bytes", pn);

    check_dx_write(be, prec, pn, g, x, W, dx0, dW0, db0, N, I, O);

    if (prec != MC_PREC_FP32) {
        /* the weight prepared by the caller (Wp): the same bytes */
        size_t wb = mc_backend_weight_bytes(be, prec);
        void *Wp = malloc(O * I * wb);
        mc_k_prepare_weight(be, prec, Wp, W, O * I, I);
        float *out3 = kt_falloc(N * O), *dx3 = kt_copy(dx0, N * I), *dW3 = kt_copy(dW0, O * I);
        mc_k_linear_fwd(be, prec, out3, x, W, Wp, NULL, N, I, O, 0.0f, 0);
        mc_k_linear_bwd(be, prec, dx3, dW3, NULL, g, x, W, Wp, N, I, O, 0);
        TAP_OK(!memcmp(out, out3, N * O * 4) && !memcmp(dx, dx3, N * I * 4) &&
                   !memcmp(dW, dW3, O * I * 4),
               "linear %s with the weight prepared by the caller (Wp, %zu bytes an element): "
               "identical bytes",
               pn, wb);
        /* and it is Wp that the GEMMs multiply, not a new rounding of W:
         * Wp of 2W gives exactly twice the products (scaling by 2 is exact) */
        float *W2 = kt_copy(W, O * I);
        mc_k_scale(be, W2, 2.0f, O * I);
        mc_k_prepare_weight(be, prec, Wp, W2, O * I, I);
        mc_k_linear_fwd(be, prec, out3, x, W, Wp, NULL, N, I, O, 0.0f, 0);
        float *dx4 = kt_falloc(N * I);
        mc_k_linear_bwd(be, prec, dx4, NULL, NULL, g, x, W, Wp, N, I, O, 0);
        float *dx5 = kt_falloc(N * I);
        mc_k_linear_bwd(be, prec, dx5, NULL, NULL, g, x, W, NULL, N, I, O, 0);
        int twice = 1;
        for (size_t i = 0; i < N * O; i++) twice &= out3[i] == 2.0f * out[i];
        for (size_t i = 0; i < N * I; i++) twice &= dx4[i] == 2.0f * dx5[i];
        TAP_OK(twice, "linear %s: the forward and dx products use Wp, not a new rounding of W",
               pn);
        free(W2), free(dx4), free(dx5);
        free(Wp), free(out3), free(dx3), free(dW3);

        /* dout as the caller's scratch (MC_LIN_DOUT_SCRATCH), with and
         * without the bias: the same bytes as a dout left alone; where the
         * GEMMs multiply rounded fp32, dout is then its rounding (in place,
         * not copied) */
        /* (the bf16-panel GEMM rounds dout as it packs it, and leaves it) */
        size_t es = mc_backend_weight_bytes(be, prec);
        int panels = mc_backend_weight_panels(be, prec), same = 1, rounded = 1;
        for (int withb = 0; withb <= 1; withb++) {
            float *gs = kt_copy(g, N * O), *dx6 = kt_copy(dx0, N * I), *dW6 = kt_copy(dW0, O * I),
                  *db6 = kt_copy(db0, O), *dx7 = kt_copy(dx0, N * I), *dW7 = kt_copy(dW0, O * I),
                  *db7 = kt_copy(db0, O);
            mc_k_linear_bwd(be, prec, dx6, dW6, withb ? db6 : NULL, g, x, W, NULL, N, I, O, 0);
            mc_k_linear_bwd(be, prec, dx7, dW7, withb ? db7 : NULL, gs, x, W, NULL, N, I, O,
                            MC_LIN_DOUT_SCRATCH);
            same &= !memcmp(dx6, dx7, N * I * 4) && !memcmp(dW6, dW7, O * I * 4) &&
                    !memcmp(db6, db7, O * 4);
            if (es == 4 && !panels) {
                float *gr2 = kt_copy(g, N * O);
                mc_k_round(be, gr2, N * O, prec);
                rounded &= !memcmp(gs, gr2, N * O * 4);
                free(gr2);
            }
            free(gs), free(dx6), free(dW6), free(db6), free(dx7), free(dW7), free(db7);
        }
        TAP_OK(same && rounded,
               "linear %s bwd with dout as scratch (MC_LIN_DOUT_SCRATCH), with and without the "
               "bias: identical bytes%s",
               pn, es == 4 && !panels ? ", dout rounded in place" : "");
    }

    free(x), free(W), free(b), free(g), free(xr), free(Wr), free(gr), free(dx_), free(dW_);
    free(dxr), free(dWr), free(dgr), free(out), free(ref), free(mag), free(ref32), free(mag32);
    free(outb), free(dx), free(dW), free(db), free(dx0), free(dW0), free(db0), free(rdx);
    free(mdx), free(rdW), free(mdW), free(rdb), free(out2), free(dx2), free(dW2);
}

static void check_fp32_determinism(mc_backend *be)
{
    size_t N = 96, I = 200, O = 150;
    kt_rng r = {99};
    float *x = kt_falloc(N * I), *W = kt_falloc(O * I), *b = kt_falloc(O), *g = kt_falloc(N * O);
    kt_fill(&r, x, N * I, -1, 1), kt_fill(&r, W, O * I, -1, 1), kt_fill(&r, b, O, -1, 1);
    kt_fill(&r, g, N * O, -1, 1);
    float *o1 = kt_falloc(N * O), *o2 = kt_falloc(N * O);
    float *a1 = kt_falloc(N * I + O * I + O), *a2 = kt_falloc(N * I + O * I + O);
    mc_k_linear_fwd(be, MC_PREC_FP32, o1, x, W, NULL, b, N, I, O, 0.0f, 0);
    mc_k_linear_bwd(be, MC_PREC_FP32, a1, a1 + N * I, a1 + N * I + O * I, g, x, W, NULL, N, I, O,
                    0);
    mc_k_linear_fwd(be, MC_PREC_FP32, o2, x, W, NULL, b, N, I, O, 0.0f, 0);
    mc_k_linear_bwd(be, MC_PREC_FP32, a2, a2 + N * I, a2 + N * I + O * I, g, x, W, NULL, N, I, O,
                    0);
    TAP_OK(!memcmp(o1, o2, N * O * 4) && !memcmp(a1, a2, (N * I + O * I + O) * 4),
           "linear fp32 fwd+bwd: rerun gives identical bytes");
    free(x), free(W), free(b), free(g), free(o1), free(o2), free(a1), free(a2);
}

/* The bias pass (bias_block in linear.c) splits the columns by the thread
 * count; each column still sums its rows in order, so the bias gradient and
 * dout rounded in place are the same bytes at 1, 2 and 3 threads, in every
 * precision, and db equals a float sum in row order. O = 1000 gives blocks
 * of different widths and a ragged last one. */
static void check_bias_threads(void)
{
    size_t N = 64, I = 8, O = 1000;
    kt_rng r = {7};
    float *x = kt_falloc(N * I), *W = kt_falloc(O * I), *g = kt_falloc(N * O);
    kt_fill(&r, x, N * I, -1, 1), kt_fill(&r, W, O * I, -1, 1), kt_fill(&r, g, N * O, -1, 1);
    const mc_prec precs[] = {MC_PREC_FP32, MC_PREC_BF16, MC_PREC_FP16, MC_PREC_TF32};
    const char *names[] = {"fp32", "bf16", "fp16", "tf32"};
    /* db's reference: rows summed in order in float (no contraction: adds) */
    float *dbr = kt_falloc(O);
    for (size_t o = 0; o < O; o++) {
        float s = 0.0f;
        for (size_t n = 0; n < N; n++) s += g[n * O + o];
        dbr[o] = s;
    }
    for (int p = 0; p < 4; p++) {
        float *db[3], *gs[3];
        int same = 1, ref = 1;
        for (int t = 0; t < 3; t++) {
            mc_backend *be = kt_backend(t + 1);
            float *dx = kt_falloc(N * I), *dW = kt_falloc(O * I);
            db[t] = kt_falloc(O), gs[t] = kt_copy(g, N * O);
            memset(dx, 0, N * I * 4), memset(dW, 0, O * I * 4), memset(db[t], 0, O * 4);
            mc_k_linear_bwd(be, precs[p], dx, dW, db[t], gs[t], x, W, NULL, N, I, O,
                            MC_LIN_DOUT_SCRATCH);
            if (t) same &= !memcmp(db[0], db[t], O * 4) && !memcmp(gs[0], gs[t], N * O * 4);
            free(dx), free(dW);
            mc_backend_free(be);
        }
        ref = !memcmp(db[0], dbr, O * 4);
        TAP_OK(same && ref,
               "linear %s bwd, the bias pass at 1, 2 and 3 threads: db and dout in place the same "
               "bytes, db the rows' sum in order",
               names[p]);
        for (int t = 0; t < 3; t++) free(db[t]), free(gs[t]);
    }
    free(x), free(W), free(g), free(dbr);
}

/* The emulated-bf16 GEMM of the AVX2 and AVX-512 paths (b16gemm.c): each
 * element is one fused multiply-add chain in order of k, from zero (or
 * from the value already there, for the += of d x and d W), on the
 * bf16-rounded operands; so the bytes equal fmaf's chain here at 1, 2 and 3 threads.
 * The shapes cross its edges: rows not a multiple of 6, columns not of 16
 * (the narrow last panel), K over several 768-deep blocks, few rows (the
 * threads split the columns) and many (they split the rows). */
static void check_b16_panels(void)
{
    const size_t shapes[2][3] = {{100, 1100, 70}, {700, 40, 600}}; /* N, I, O */
    mc_backend *probe = kt_backend(1);
    int on = mc_backend_weight_panels(probe, MC_PREC_BF16);
    mc_backend_free(probe);
    for (int s = 0; s < 2; s++) {
        size_t N = shapes[s][0], I = shapes[s][1], O = shapes[s][2];
        if (!on) {
            TAP_SKIP("bf16 is not emulated through panels on this path");
            continue;
        }
        kt_rng r = {N + I + O};
        float *x = kt_falloc(N * I), *W = kt_falloc(O * I), *g = kt_falloc(N * O),
              *d0 = kt_falloc(N * I), *w0 = kt_falloc(O * I);
        kt_fill(&r, x, N * I, -1, 1), kt_fill(&r, W, O * I, -1, 1), kt_fill(&r, g, N * O, -1, 1);
        kt_fill(&r, d0, N * I, -1, 1), kt_fill(&r, w0, O * I, -1, 1);
        float *xr = kt_copy(x, N * I), *Wr = kt_copy(W, O * I), *gr = kt_copy(g, N * O);
        float *yref = kt_falloc(N * O), *dref = kt_falloc(N * I), *wref = kt_copy(w0, O * I);
        {
            mc_backend *be = kt_backend(1);
            mc_k_round(be, xr, N * I, MC_PREC_BF16), mc_k_round(be, Wr, O * I, MC_PREC_BF16);
            mc_k_round(be, gr, N * O, MC_PREC_BF16);
            mc_backend_free(be);
        }
        for (size_t n = 0; n < N; n++) {
            for (size_t o = 0; o < O; o++) {
                float a = 0.0f;
                for (size_t i = 0; i < I; i++) a = fmaf(xr[n * I + i], Wr[o * I + i], a);
                yref[n * O + o] = a;
            }
            for (size_t i = 0; i < I; i++) {
                float a = d0[n * I + i];
                for (size_t o = 0; o < O; o++) a = fmaf(gr[n * O + o], Wr[o * I + i], a);
                dref[n * I + i] = a;
            }
        }
        for (size_t n = 0; n < N; n++) /* dW's chains, n outermost: each in order of n */
            for (size_t o = 0; o < O; o++)
                for (size_t i = 0; i < I; i++)
                    wref[o * I + i] = fmaf(gr[n * O + o], xr[n * I + i], wref[o * I + i]);
        int ok[3] = {1, 1, 1};
        for (int t = 0; t < 3; t++) {
            mc_backend *be = kt_backend(t + 1);
            float *y = kt_falloc(N * O), *dx = kt_copy(d0, N * I), *dW = kt_copy(w0, O * I);
            mc_k_linear_fwd(be, MC_PREC_BF16, y, x, W, NULL, NULL, N, I, O, 0.0f, 0);
            mc_k_linear_bwd(be, MC_PREC_BF16, dx, dW, NULL, g, x, W, NULL, N, I, O, 0);
            ok[t] = !memcmp(y, yref, N * O * 4) && !memcmp(dx, dref, N * I * 4) &&
                    !memcmp(dW, wref, O * I * 4);
            free(y), free(dx), free(dW);
            mc_backend_free(be);
        }
        TAP_OK(ok[0] && ok[1] && ok[2],
               "linear bf16 through bf16 panels N=%zu I=%zu O=%zu: forward, dx and dW (+=) the "
               "bytes of an in-order fmaf chain on the rounded operands at 1, 2, 3 threads (%d "
               "%d %d)",
               N, I, O, ok[0], ok[1], ok[2]);
        free(x), free(W), free(g), free(d0), free(w0), free(xr), free(Wr), free(gr), free(yref);
        free(dref), free(wref);
    }
}

static double best_of(int reps, void (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = kt_now();
        fn(arg);
        double dt = kt_now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

typedef struct {
    mc_backend *be;
    mc_prec prec;
    float *x, *W, *b, *out, *dx, *dW, *db;
    size_t N, I, O;
} tm_arg;
static void tm_fwd(void *p)
{
    tm_arg *a = p;
    mc_k_linear_fwd(a->be, a->prec, a->out, a->x, a->W, NULL, a->b, a->N, a->I, a->O, 0.0f, 0);
}
static void tm_bwd(void *p)
{
    tm_arg *a = p;
    mc_k_linear_bwd(a->be, a->prec, a->dx, a->dW, a->db, a->out, a->x, a->W, NULL, a->N, a->I, a->O,
                    0);
}

static void timing(mc_backend *be)
{
    size_t N = 256, I = 768, O = 3072;
    kt_rng r = {1};
    tm_arg a = {be,
                MC_PREC_FP32,
                kt_falloc(N * I),
                kt_falloc(O * I),
                kt_falloc(O),
                kt_falloc(N * O),
                kt_falloc(N * I),
                kt_falloc(O * I),
                kt_falloc(O),
                N,
                I,
                O};
    kt_fill(&r, a.x, N * I, -1, 1), kt_fill(&r, a.W, O * I, -1, 1);
    double fl = 2.0 * N * I * O;
    const mc_prec ps[3] = {MC_PREC_FP32, MC_PREC_BF16, MC_PREC_FP16};
    const char *names[3] = {"fp32", "bf16", "fp16"};
    for (int i = 0; i < 3; i++) {
        a.prec = ps[i];
        tm_fwd(&a); /* warm up: scratch, JIT kernels, thread pool */
        double tf = best_of(3, tm_fwd, &a), tb = best_of(3, tm_bwd, &a);
        TAP_DIAG("linear %s N=%zu I=%zu O=%zu, %d threads: fwd %.2f ms %.1f GFLOP/s, bwd %.2f ms "
                 "%.1f GFLOP/s",
                 names[i], N, I, O, mc_backend_threads(be), tf * 1e3, fl / tf * 1e-9, tb * 1e3,
                 2 * fl / tb * 1e-9);
    }
    free(a.x), free(a.W), free(a.b), free(a.out), free(a.dx), free(a.dW), free(a.db);
}

/* The bf16 operands are rounded exactly as mc_k_round rounds: nearest
 * even on ties, NaN kept. x = e_0 picks column 0 of W, so out[o] is the
 * rounded W[o, 0] itself; W has 40 rows (vector blocks of 16 and a tail),
 * with ties to even both ways, values just past a tie, and a NaN. */
static void check_bf16_rounding(mc_backend *be)
{
    enum { O = 40, I = 24 };
    static const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0xbf818000u,
                                    0x4049ffffu, 0x7f7fffffu, 0x00008000u, 0x7fc00001u};
    float *W = kt_falloc(O * I), *x = kt_falloc(I), *out = kt_falloc(O), *want = kt_falloc(O);
    kt_rng r = {7};
    kt_fill(&r, W, O * I, -2, 2);
    for (size_t o = 0; o < O; o++)
        if (o % 5 < 2) memcpy(&W[o * I], &bits[o % 8], 4);
    x[0] = 1.0f;
    for (size_t o = 0; o < O; o++) want[o] = W[o * I];
    mc_k_round(be, want, O, MC_PREC_BF16);
    /* NaN * 0 would poison the other rows: the NaN row is checked alone */
    mc_k_linear_fwd(be, MC_PREC_BF16, out, x, W, NULL, NULL, 1, I, O, 0.0f, 0);
    int bad = 0;
    for (size_t o = 0; o < O; o++) {
        if (isnan(want[o]))
            bad += !isnan(out[o]);
        else
            bad += memcmp(&out[o], &want[o], 4) != 0;
    }
    TAP_OK(bad == 0, "bf16 GEMM operands round as mc_k_round (ties to even, NaN kept): %d differ",
           bad);
    free(W), free(x), free(out), free(want);
}

int main(void)
{
    mc_backend *be = kt_backend(0);
    TAP_DIAG("bf16 GEMM path: %s", be->dnnl_bf16 ? "oneDNN dnnl_gemm_bf16bf16f32"
                                   : mc_backend_weight_panels(be, MC_PREC_BF16)
                                       ? "bf16 panels widened in registers (b16gemm.c)"
                                       : "bf16-rounded operands widened to fp32, sgemm");
    check_fp32(be, 5, 7, 3);
    check_fp32(be, 33, 40, 17);
    check_fp32(be, 1, 64, 1);
    check_fp32(be, 1, 200, 77); /* one row: the matrix-vector path */
    check_fp32_determinism(be);
    check_bf16_rounding(be);
    check_lowp(be, MC_PREC_BF16, 37, 64, 29);
    check_lowp(be, MC_PREC_BF16, 128, 256, 96);
    check_lowp(be, MC_PREC_FP16, 37, 64, 29);
    check_lowp(be, MC_PREC_FP16, 128, 256, 96);
    check_bias_threads();
    check_b16_panels();
    timing(be);
    mc_backend_free(be);
    return tap_done();
}
