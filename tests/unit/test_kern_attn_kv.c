/*
 * test_kern_attn_kv.c - mc_k_attention_kv_fwd, the attention of new query
 * rows against a key/value cache (inference): against the causal softmax in
 * float64 for several (pos0, n) and grouped-query shapes; prefill (pos0 = 0)
 * against the training kernel mc_k_attention_fwd; one row at a time
 * (decoding) against the rows of one prefill, which the kernel computes in
 * register tiles of four rows (head sizes 64, 80, 128 and others); the same
 * bits for 1 and 2 threads.
 */
#include "kern_test.h"

static void check_ref(mc_backend *be, size_t n, size_t pos0, size_t Q, size_t G, size_t D)
{
    kt_rng r = {n * 7919 + pos0 * 31 + Q * 7 + G * 3 + D};
    size_t L = pos0 + n + 5; /* capacity beyond what is read: never touched */
    float *q = kt_falloc(n * Q * D), *kc = kt_falloc(L * G * D), *vc = kt_falloc(L * G * D);
    float *out = kt_falloc(n * Q * D);
    kt_fill(&r, q, n * Q * D, -2, 2);
    kt_fill(&r, kc, L * G * D, -2, 2);
    kt_fill(&r, vc, L * G * D, -1, 1);
    for (size_t i = (pos0 + n) * G * D; i < L * G * D; i++) kc[i] = vc[i] = NAN;
    double *qd = kt_todouble(q, n * Q * D), *kd = kt_todouble(kc, L * G * D);
    double *vd = kt_todouble(vc, L * G * D), *ref = kt_dalloc(n * Q * D);
    double scale = 1.0 / sqrt((double)D);
    kt_ref_kv(ref, qd, kd, vd, n, pos0, Q, G, D, scale);
    mc_k_attention_kv_fwd(be, out, q, kc, vc, n, pos0, Q, G, D, (float)scale, NULL);
    double e = kt_err(out, ref, n * Q * D);
    TAP_OK(e < 2e-6, "kv attention n=%zu pos0=%zu Q=%zu G=%zu D=%zu vs float64: err %.2e < 2e-6", n,
           pos0, Q, G, D, e);
    free(q), free(kc), free(vc), free(out), free(qd), free(kd), free(vd), free(ref);
}

/* Prefill equals the training kernel; decoding row by row equals prefill. */
static void check_prefill_decode(mc_backend *be, size_t T, size_t Q, size_t G, size_t D)
{
    kt_rng r = {T * 13 + Q + G + D};
    size_t nq = T * Q * D, nk = T * G * D;
    float *q = kt_falloc(nq), *k = kt_falloc(nk), *v = kt_falloc(nk);
    float *a = kt_falloc(nq), *b = kt_falloc(nq), *c = kt_falloc(nq), *lse = kt_falloc(Q * T);
    kt_fill(&r, q, nq, -2, 2);
    kt_fill(&r, k, nk, -2, 2);
    kt_fill(&r, v, nk, -1, 1);
    float scale = 1.0f / sqrtf((float)D);
    mc_k_attention_fwd(be, a, lse, q, k, v, 1, T, Q, G, D, scale, NULL);
    mc_k_attention_kv_fwd(be, b, q, k, v, T, 0, Q, G, D, scale, NULL);
    for (size_t t = 0; t < T; t++)
        mc_k_attention_kv_fwd(be, c + t * Q * D, q + t * Q * D, k, v, 1, t, Q, G, D, scale, NULL);
    double *ad = kt_todouble(a, nq), *bd = kt_todouble(b, nq);
    double e1 = kt_err(b, ad, nq), e2 = kt_err(c, bd, nq);
    TAP_OK(e1 < 1e-6, "prefill T=%zu equals mc_k_attention_fwd: err %.2e < 1e-6", T, e1);
    /* same keys, same order of every sum, blocks of the same keys: equal bits */
    TAP_OK(memcmp(b, c, nq * sizeof(float)) == 0,
           "decoding one row at a time gives the prefill's bits (err %.2e)", e2);
    free(q), free(k), free(v), free(a), free(b), free(c), free(lse), free(ad), free(bd);
}

static void check_threads(void)
{
    mc_backend *b1, *b2;
    mc_error err;
    if (mc_backend_cpu_new(1, &b1, &err) || mc_backend_cpu_new(2, &b2, &err)) {
        TAP_OK(0, "backend: %s", err.msg);
        return;
    }
    size_t n = 70, pos0 = 100, Q = 4, G = 2, D = 16, L = pos0 + n;
    kt_rng r = {42};
    float *q = kt_falloc(n * Q * D), *kc = kt_falloc(L * G * D), *vc = kt_falloc(L * G * D);
    float *o1 = kt_falloc(n * Q * D), *o2 = kt_falloc(n * Q * D);
    kt_fill(&r, q, n * Q * D, -2, 2);
    kt_fill(&r, kc, L * G * D, -2, 2);
    kt_fill(&r, vc, L * G * D, -1, 1);
    mc_k_attention_kv_fwd(b1, o1, q, kc, vc, n, pos0, Q, G, D, 0.25f, NULL);
    mc_k_attention_kv_fwd(b2, o2, q, kc, vc, n, pos0, Q, G, D, 0.25f, NULL);
    TAP_OK(memcmp(o1, o2, n * Q * D * sizeof(float)) == 0, "1 and 2 threads: the same bits");
    free(q), free(kc), free(vc), free(o1), free(o2);
    mc_backend_free(b1);
    mc_backend_free(b2);
}

int main(void)
{
    mc_backend *be;
    mc_error err;
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    check_ref(be, 1, 0, 2, 2, 8);     /* a single first token */
    check_ref(be, 1, 37, 4, 2, 16);   /* decoding, GQA */
    check_ref(be, 1, 200, 3, 1, 8);   /* decoding past several key blocks, MQA */
    check_ref(be, 17, 0, 4, 4, 8);    /* prefill */
    check_ref(be, 45, 70, 6, 2, 12);  /* a chunk after a cached prefix, across blocks */
    check_ref(be, 100, 5, 2, 1, 32);  /* several query blocks */
    check_ref(be, 70, 0, 4, 2, 64);   /* register tiles: 64 columns of the output at once */
    check_ref(be, 66, 61, 2, 2, 80);  /* tiles, a 16-column rest, rows across key blocks */
    check_ref(be, 9, 130, 2, 1, 128); /* a tile's rows with different key counts */
    check_ref(be, 3, 64, 2, 2, 68);   /* rows fewer than a tile; 4 columns one by one */
    check_prefill_decode(be, 150, 4, 2, 16);
    /* tiles (prefill) and single rows (decoding) must do each element's
     * arithmetic in the same order: equal bits */
    check_prefill_decode(be, 203, 4, 4, 64);
    check_prefill_decode(be, 97, 2, 1, 80);
    check_threads();
    mc_backend_free(be);
    return tap_done();
}
