/*
 * test_kern_attn.c - the CPU backend's causal attention (flash-style, GQA):
 * forward against the full T x T softmax in float64, backward against
 * central finite differences of that float64 forward, accumulation into
 * pre-filled gradients, the qkv split, bit-identical reruns and thread
 * counts, T = 4096 rows, and a timing printout (not asserted).
 */
#include "kern_test.h"

typedef struct {
    size_t B, T, Q, G, D;
    double scale;
    double *q, *k, *v, *dout;
} att_ctx;

/* out[b,t,h,:] = sum_{c<=t} softmax_c(scale q_t . k_c) v_c; lse[b,h,t] */
static void ref_attention(const att_ctx *a, double *out, double *lse)
{
    size_t B = a->B, T = a->T, Q = a->Q, G = a->G, D = a->D, hpg = Q / G;
    double *s = kt_dalloc(T);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < Q; h++)
            for (size_t t = 0; t < T; t++) {
                const double *qr = a->q + ((b * T + t) * Q + h) * D;
                double mx = -INFINITY;
                for (size_t c = 0; c <= t; c++) {
                    const double *kr = a->k + ((b * T + c) * G + h / hpg) * D;
                    double d = 0;
                    for (size_t i = 0; i < D; i++) d += qr[i] * kr[i];
                    s[c] = d * a->scale;
                    if (s[c] > mx) mx = s[c];
                }
                double sum = 0;
                for (size_t c = 0; c <= t; c++) sum += exp(s[c] - mx);
                double *o = out + ((b * T + t) * Q + h) * D;
                for (size_t i = 0; i < D; i++) o[i] = 0;
                for (size_t c = 0; c <= t; c++) {
                    const double *vr = a->v + ((b * T + c) * G + h / hpg) * D;
                    double p = exp(s[c] - mx) / sum;
                    for (size_t i = 0; i < D; i++) o[i] += p * vr[i];
                }
                if (lse) lse[(b * Q + h) * T + t] = mx + log(sum);
            }
    free(s);
}

static double att_loss(void *ctx)
{
    att_ctx *a = ctx;
    size_t n = a->B * a->T * a->Q * a->D;
    double *out = kt_dalloc(n), L = 0;
    ref_attention(a, out, NULL);
    for (size_t i = 0; i < n; i++) L += a->dout[i] * out[i];
    free(out);
    return L;
}

static void check_shape(mc_backend *be, size_t B, size_t T, size_t Q, size_t G, size_t D,
                        size_t samples)
{
    kt_rng r = {B * 1000003 + T * 101 + Q * 11 + G * 7 + D};
    size_t nq = B * T * Q * D, nk = B * T * G * D, nl = B * Q * T;
    float *q = kt_falloc(nq), *k = kt_falloc(nk), *v = kt_falloc(nk), *dout = kt_falloc(nq);
    kt_fill(&r, q, nq, -1, 1);
    kt_fill(&r, k, nk, -1, 1);
    kt_fill(&r, v, nk, -1, 1);
    kt_fill(&r, dout, nq, -1, 1);
    float scale = 1.0f / sqrtf((float)D);
    float *out = kt_falloc(nq), *lse = kt_falloc(nl);
    mc_k_attention_fwd(be, out, lse, q, k, v, B, T, Q, G, D, scale, NULL);

    att_ctx a = {B,
                 T,
                 Q,
                 G,
                 D,
                 scale,
                 kt_todouble(q, nq),
                 kt_todouble(k, nk),
                 kt_todouble(v, nk),
                 kt_todouble(dout, nq)};
    double *rout = kt_dalloc(nq), *rlse = kt_dalloc(nl);
    ref_attention(&a, rout, rlse);
    double eo = kt_err(out, rout, nq), el = kt_err(lse, rlse, nl);
    TAP_OK(eo < 1e-5, "attention fwd B=%zu T=%zu Q=%zu G=%zu D=%zu: out err %.2e < 1e-5", B, T, Q,
           G, D, eo);
    TAP_OK(el < 1e-5, "attention fwd B=%zu T=%zu Q=%zu G=%zu D=%zu: lse err %.2e < 1e-5", B, T, Q,
           G, D, el);

    /* gradients are added onto pre-filled contents */
    float *dq = kt_falloc(nq), *dk = kt_falloc(nk), *dv = kt_falloc(nk);
    kt_fill(&r, dq, nq, -0.5, 0.5);
    kt_fill(&r, dk, nk, -0.5, 0.5);
    kt_fill(&r, dv, nk, -0.5, 0.5);
    float *dq0 = kt_copy(dq, nq), *dk0 = kt_copy(dk, nk), *dv0 = kt_copy(dv, nk);
    mc_k_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, Q, G, D, scale, NULL);
    double eq = kt_fd_check(att_loss, &a, a.q, nq, dq, dq0, samples, 1);
    double ek = kt_fd_check(att_loss, &a, a.k, nk, dk, dk0, samples, 2);
    double ev = kt_fd_check(att_loss, &a, a.v, nk, dv, dv0, samples, 3);
    TAP_OK(eq < 1e-4 && ek < 1e-4 && ev < 1e-4,
           "attention bwd B=%zu T=%zu Q=%zu G=%zu D=%zu vs FD (+= onto prefill): dq %.2e dk %.2e "
           "dv %.2e < 1e-4",
           B, T, Q, G, D, eq, ek, ev);

    /* bit-identical rerun, and the same bits with one thread */
    float *out2 = kt_falloc(nq), *lse2 = kt_falloc(nl);
    float *dq2 = kt_copy(dq0, nq), *dk2 = kt_copy(dk0, nk), *dv2 = kt_copy(dv0, nk);
    mc_backend *be1 = kt_backend(1);
    mc_k_attention_fwd(be1, out2, lse2, q, k, v, B, T, Q, G, D, scale, NULL);
    mc_k_attention_bwd(be1, dq2, dk2, dv2, dout, q, k, v, out, lse, B, T, Q, G, D, scale, NULL);
    mc_backend_free(be1);
    int same = !memcmp(out, out2, nq * 4) && !memcmp(lse, lse2, nl * 4) &&
               !memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nk * 4) && !memcmp(dv, dv2, nk * 4);
    memcpy(dq2, dq0, nq * 4);
    memcpy(dk2, dk0, nk * 4);
    memcpy(dv2, dv0, nk * 4);
    mc_k_attention_fwd(be, out2, lse2, q, k, v, B, T, Q, G, D, scale, NULL);
    mc_k_attention_bwd(be, dq2, dk2, dv2, dout, q, k, v, out, lse, B, T, Q, G, D, scale, NULL);
    same = same && !memcmp(out, out2, nq * 4) && !memcmp(lse, lse2, nl * 4) &&
           !memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nk * 4) && !memcmp(dv, dv2, nk * 4);
    TAP_OK(same, "attention T=%zu Q=%zu G=%zu: rerun and 1 thread give identical bytes", T, Q, G);

    free(q), free(k), free(v), free(dout), free(out), free(lse), free(rout), free(rlse);
    free(a.q), free(a.k), free(a.v), free(a.dout);
    free(dq), free(dk), free(dv), free(dq0), free(dk0), free(dv0);
    free(out2), free(lse2), free(dq2), free(dk2), free(dv2);
}

/* NULL gradient outputs are skipped, the others still get their values */
static void check_null_grads(mc_backend *be)
{
    size_t B = 1, T = 40, Q = 2, G = 1, D = 8, nq = B * T * Q * D, nk = B * T * G * D;
    kt_rng r = {77};
    float *q = kt_falloc(nq), *k = kt_falloc(nk), *v = kt_falloc(nk), *dout = kt_falloc(nq);
    kt_fill(&r, q, nq, -1, 1), kt_fill(&r, k, nk, -1, 1), kt_fill(&r, v, nk, -1, 1);
    kt_fill(&r, dout, nq, -1, 1);
    float *out = kt_falloc(nq), *lse = kt_falloc(B * Q * T), sc = 0.35f;
    mc_k_attention_fwd(be, out, lse, q, k, v, B, T, Q, G, D, sc, NULL);
    float *dq = kt_falloc(nq), *dk = kt_falloc(nk), *dv = kt_falloc(nk), *dk1 = kt_falloc(nk);
    mc_k_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, Q, G, D, sc, NULL);
    mc_k_attention_bwd(be, NULL, dk1, NULL, dout, q, k, v, out, lse, B, T, Q, G, D, sc, NULL);
    TAP_OK(!memcmp(dk, dk1, nk * 4), "attention bwd with dq = dv = NULL gives the same dk");
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(dk1);
}

/* T = 4096 in O(T) memory: spot rows against the float64 reference */
static void check_long(mc_backend *be)
{
    size_t B = 1, T = 4096, Q = 2, G = 1, D = 64, nq = B * T * Q * D, nk = B * T * G * D;
    kt_rng r = {4096};
    float *q = kt_falloc(nq), *k = kt_falloc(nk), *v = kt_falloc(nk);
    kt_fill(&r, q, nq, -2, 2), kt_fill(&r, k, nk, -2, 2), kt_fill(&r, v, nk, -1, 1);
    float *out = kt_falloc(nq), *lse = kt_falloc(B * Q * T), scale = 0.125f;
    double t0 = kt_now();
    mc_k_attention_fwd(be, out, lse, q, k, v, B, T, Q, G, D, scale, NULL);
    double dt = kt_now() - t0;
    double md = 0, mr = 0;
    size_t rows[] = {0, 1, 63, 64, 1000, 4031, 4094, 4095};
    double *s = kt_dalloc(T), o[64];
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
        for (size_t h = 0; h < Q; h++) {
            size_t t = rows[ri];
            double mx = -INFINITY, sum = 0;
            for (size_t c = 0; c <= t; c++) {
                double d = 0;
                for (size_t i = 0; i < D; i++) d += (double)q[(t * Q + h) * D + i] * k[c * D + i];
                s[c] = d * scale;
                if (s[c] > mx) mx = s[c];
            }
            for (size_t c = 0; c <= t; c++) sum += exp(s[c] - mx);
            for (size_t i = 0; i < D; i++) o[i] = 0;
            for (size_t c = 0; c <= t; c++)
                for (size_t i = 0; i < D; i++) o[i] += exp(s[c] - mx) / sum * v[c * D + i];
            for (size_t i = 0; i < D; i++) {
                double d = fabs(out[(t * Q + h) * D + i] - o[i]);
                md = d > md ? d : md;
                mr = fabs(o[i]) > mr ? fabs(o[i]) : mr;
            }
            double dl = fabs(lse[h * T + t] - (mx + log(sum))) / fabs(mx + log(sum));
            md = dl * mr > md ? dl * mr : md;
        }
    TAP_OK(md / mr < 1e-5, "attention T=4096 (%.2f s): sampled rows and lse err %.2e < 1e-5", dt,
           md / mr);
    free(q), free(k), free(v), free(out), free(lse), free(s);
}

static void check_qkv_split(mc_backend *be)
{
    size_t N = 3, Q = 4, G = 2, D = 5, hpg = Q / G, W = G * (hpg + 2) * D;
    float *qkv = kt_falloc(N * W), *q = kt_falloc(N * Q * D), *k = kt_falloc(N * G * D);
    float *v = kt_falloc(N * G * D);
    for (size_t i = 0; i < N * W; i++) qkv[i] = (float)i;
    mc_k_qkv_split(be, q, k, v, qkv, N, Q, G, D);
    int ok = 1;
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < G; g++)
            for (size_t d = 0; d < D; d++) {
                size_t base = n * W + g * (hpg + 2) * D;
                for (size_t j = 0; j < hpg; j++)
                    ok &= q[(n * Q + g * hpg + j) * D + d] == (float)(base + j * D + d);
                ok &= k[(n * G + g) * D + d] == (float)(base + hpg * D + d);
                ok &= v[(n * G + g) * D + d] == (float)(base + (hpg + 1) * D + d);
            }
    TAP_OK(ok, "qkv split follows Megatron's per-group [q.. k v] layout");
    /* backward = transpose of the gather, added onto dqkv */
    float *dqkv = kt_falloc(N * W);
    for (size_t i = 0; i < N * W; i++) dqkv[i] = 1.0f;
    mc_k_qkv_split_bwd(be, dqkv, q, k, v, N, Q, G, D);
    ok = 1;
    for (size_t i = 0; i < N * W; i++) ok &= dqkv[i] == (float)i + 1.0f;
    TAP_OK(ok, "qkv split bwd scatters back and adds onto dqkv");
    mc_k_qkv_split_bwd(be, dqkv, NULL, k, NULL, N, Q, G, D);
    ok = 1;
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < G; g++)
            for (size_t i = 0; i < (hpg + 2) * D; i++) {
                size_t j = n * W + g * (hpg + 2) * D + i;
                float want = (float)j + 1.0f;
                if (i >= hpg * D && i < (hpg + 1) * D) want += (float)j;
                ok &= dqkv[j] == want;
            }
    TAP_OK(ok, "qkv split bwd skips NULL parts");
    free(qkv), free(q), free(k), free(v), free(dqkv);
}

static void timing(mc_backend *be)
{
    size_t B = 1, T = 1024, H = 12, D = 64, n = B * T * H * D;
    kt_rng r = {5};
    float *q = kt_falloc(n), *k = kt_falloc(n), *v = kt_falloc(n), *dout = kt_falloc(n);
    kt_fill(&r, q, n, -1, 1), kt_fill(&r, k, n, -1, 1), kt_fill(&r, v, n, -1, 1);
    kt_fill(&r, dout, n, -1, 1);
    float *out = kt_falloc(n), *lse = kt_falloc(B * H * T);
    float *dq = kt_falloc(n), *dk = kt_falloc(n), *dv = kt_falloc(n);
    /* causal FLOPs: QK^T and PV over T^2/2 pairs, 2 flops per multiply-add */
    double flops = 2.0 * 2.0 * (double)B * H * T * T / 2 * D;
    double tf = 1e30, tb = 1e30; /* best of 3: the machine may be shared */
    for (int rep = 0; rep < 3; rep++) {
        double t0 = kt_now();
        mc_k_attention_fwd(be, out, lse, q, k, v, B, T, H, H, D, 0.125f, NULL);
        double t1 = kt_now();
        mc_k_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, H, H, D, 0.125f, NULL);
        double t2 = kt_now();
        tf = fmin(tf, t1 - t0), tb = fmin(tb, t2 - t1);
    }
    TAP_DIAG("attention B=1 T=1024 H=12 D=64, %d threads: fwd %.1f ms (%.1f GFLOP/s), "
             "bwd %.1f ms (%.1f GFLOP/s, counting 2.5x the forward's FLOPs)",
             mc_backend_threads(be), tf * 1e3, flops / tf * 1e-9, tb * 1e3,
             2.5 * flops / tb * 1e-9);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
}

int main(void)
{
    mc_backend *be = kt_backend(0);
    check_shape(be, 1, 1, 1, 1, 8, 1000);  /* T = 1 */
    check_shape(be, 2, 70, 4, 2, 16, 120); /* T not a block multiple, GQA Q=4 G=2 */
    check_shape(be, 1, 130, 4, 1, 8, 120); /* three key blocks, G = 1 (MQA) */
    check_shape(be, 1, 64, 2, 2, 16, 120); /* exactly one block, plain MHA */
    check_shape(be, 2, 33, 3, 3, 8, 120);
    check_shape(be, 1, 70, 2, 1, 64, 60); /* D = 64: whole register tiles (att_tile.h) */
    check_shape(be, 1, 67, 2, 2, 80, 60); /* D = 80: a tile of 64 columns and one of 16 */
    check_null_grads(be);
    check_long(be);
    check_qkv_split(be);
    timing(be);
    mc_backend_free(be);
    return tap_done();
}
