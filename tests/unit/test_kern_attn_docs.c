/*
 * test_kern_attn_docs.c - packed documents in the CPU kernels: attention with
 * segment starts (row t attends keys seg[t] .. t), RoPE and learned
 * positions at per-token positions.
 *
 * The segmented attention, forward and backward, equals the attention run on
 * each document alone (its own sequence, seg NULL) within 2e-6 of the
 * largest value (the key blocks fall elsewhere, so the sums are the same
 * terms in another grouping); against a float64 masked softmax 1e-5, and
 * its gradients against central finite differences of that float64 forward
 * 1e-4. One document (every start 0) gives seg NULL's bits; the thread
 * count and the CPU path (every path this CPU has, pinned with MC_CPU_ISA)
 * change no bit. Per-token positions give exactly the bits of each document
 * rotated or embedded alone from position 0. A timing of one long sequence
 * cut into shorter documents is printed (not asserted).
 */
#include "kern_test.h"

static const mc_rope rope10k = {10000.0f, 0, 0, 0, 0, 0, 0}; /* plain RoPE, base 10000 */

/* Documents of the given lengths, cycled, packed into B sequences of T:
 * seg[b T + t] = the first token of t's document, pos = t - that. */
static void pack(const size_t *lens, size_t nlens, size_t B, size_t T, int32_t *seg, int32_t *pos)
{
    size_t d = 0;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T;) {
            size_t len = lens[d++ % nlens];
            for (size_t i = 0; i < len && t < T; i++, t++) {
                seg[b * T + t] = (int32_t)(t - i);
                if (pos) pos[b * T + t] = (int32_t)i;
            }
        }
}

typedef struct {
    size_t B, T, Q, G, D;
    double scale;
    double *q, *k, *v, *dout;
    const int32_t *seg;
} att_ctx;

/* float64: out[b,t,h,:] = sum_{seg_t <= c <= t} softmax_c(scale q_t . k_c) v_c */
static void ref_attention(const att_ctx *a, double *out, double *lse)
{
    size_t B = a->B, T = a->T, Q = a->Q, G = a->G, D = a->D, hpg = Q / G;
    double *s = kt_dalloc(T);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < Q; h++)
            for (size_t t = 0; t < T; t++) {
                size_t c0 = (size_t)a->seg[b * T + t];
                const double *qr = a->q + ((b * T + t) * Q + h) * D;
                double mx = -INFINITY, sum = 0;
                for (size_t c = c0; c <= t; c++) {
                    const double *kr = a->k + ((b * T + c) * G + h / hpg) * D;
                    double d = 0;
                    for (size_t i = 0; i < D; i++) d += qr[i] * kr[i];
                    s[c] = d * a->scale;
                    if (s[c] > mx) mx = s[c];
                }
                for (size_t c = c0; c <= t; c++) sum += exp(s[c] - mx);
                double *o = out + ((b * T + t) * Q + h) * D;
                for (size_t i = 0; i < D; i++) o[i] = 0;
                for (size_t c = c0; c <= t; c++) {
                    const double *vr = a->v + ((b * T + c) * G + h / hpg) * D;
                    for (size_t i = 0; i < D; i++) o[i] += exp(s[c] - mx) / sum * vr[i];
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

/* One call's inputs and outputs. */
typedef struct {
    size_t B, T, Q, G, D;
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} att_run;

static void run_alloc(att_run *r, size_t B, size_t T, size_t Q, size_t G, size_t D)
{
    memset(r, 0, sizeof *r);
    r->B = B, r->T = T, r->Q = Q, r->G = G, r->D = D;
    size_t nq = B * T * Q * D, nk = B * T * G * D;
    r->q = kt_falloc(nq), r->k = kt_falloc(nk), r->v = kt_falloc(nk), r->dout = kt_falloc(nq);
    r->out = kt_falloc(nq), r->lse = kt_falloc(B * Q * T), r->dq = kt_falloc(nq);
    r->dk = kt_falloc(nk), r->dv = kt_falloc(nk);
}

static void run_free(att_run *r)
{
    free(r->q), free(r->k), free(r->v), free(r->dout), free(r->out), free(r->lse);
    free(r->dq), free(r->dk), free(r->dv);
}

/* forward, then the backward into zeroed gradients */
static void run_att(mc_backend *be, att_run *r, const int32_t *seg)
{
    size_t nq = r->B * r->T * r->Q * r->D, nk = r->B * r->T * r->G * r->D;
    float scale = 1.0f / sqrtf((float)r->D);
    mc_k_attention_fwd(be, r->out, r->lse, r->q, r->k, r->v, r->B, r->T, r->Q, r->G, r->D, scale,
                       seg);
    memset(r->dq, 0, nq * 4), memset(r->dk, 0, nk * 4), memset(r->dv, 0, nk * 4);
    mc_k_attention_bwd(be, r->dq, r->dk, r->dv, r->dout, r->q, r->k, r->v, r->out, r->lse, r->B,
                       r->T, r->Q, r->G, r->D, scale, seg);
}

static int same_bits(const att_run *a, const att_run *b)
{
    size_t nq = a->B * a->T * a->Q * a->D, nk = a->B * a->T * a->G * a->D;
    return !memcmp(a->out, b->out, nq * 4) && !memcmp(a->lse, b->lse, a->B * a->Q * a->T * 4) &&
           !memcmp(a->dq, b->dq, nq * 4) && !memcmp(a->dk, b->dk, nk * 4) &&
           !memcmp(a->dv, b->dv, nk * 4);
}

/* rows [s, s + n) of sequence b of x[B, T, H, D] <-> y[n, H, D] */
static void rows_get(float *y, const float *x, size_t b, size_t T, size_t s, size_t n, size_t HD)
{
    memcpy(y, x + (b * T + s) * HD, n * HD * 4);
}

/* max |a - b| over the rows, and max |b| (b is the reference) */
static void diff(const float *a, const float *b, size_t n, double *md, double *mr)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= *md)) *md = d;
        if (fabs((double)b[i]) > *mr) *mr = fabs((double)b[i]);
    }
}

/* The packed run against each document run alone; *eo (out and lse) and
 * *eg (the gradients) get the worst normwise errors. */
static void against_alone(mc_backend *be, const att_run *p, const int32_t *seg, double *eo,
                          double *eg)
{
    size_t T = p->T, Q = p->Q, G = p->G, D = p->D;
    double mo = 0, ro = 0, ml = 0, rl = 0, mq = 0, rq = 0, mk = 0, rk = 0, mv = 0, rv = 0;
    for (size_t b = 0; b < p->B; b++)
        for (size_t s = 0; s < T;) {
            size_t e = s + 1;
            while (e < T && (size_t)seg[b * T + e] == s) e++;
            size_t n = e - s;
            att_run a;
            run_alloc(&a, 1, n, Q, G, D);
            rows_get(a.q, p->q, b, T, s, n, Q * D), rows_get(a.k, p->k, b, T, s, n, G * D);
            rows_get(a.v, p->v, b, T, s, n, G * D), rows_get(a.dout, p->dout, b, T, s, n, Q * D);
            run_att(be, &a, NULL);
            float *x = kt_falloc(n * Q * D);
            rows_get(x, p->out, b, T, s, n, Q * D), diff(x, a.out, n * Q * D, &mo, &ro);
            rows_get(x, p->dq, b, T, s, n, Q * D), diff(x, a.dq, n * Q * D, &mq, &rq);
            rows_get(x, p->dk, b, T, s, n, G * D), diff(x, a.dk, n * G * D, &mk, &rk);
            rows_get(x, p->dv, b, T, s, n, G * D), diff(x, a.dv, n * G * D, &mv, &rv);
            for (size_t h = 0; h < Q; h++)
                diff(p->lse + (b * Q + h) * T + s, a.lse + h * n, n, &ml, &rl);
            free(x);
            run_free(&a);
            s = e;
        }
    *eo = fmax(mo / ro, ml / rl);
    *eg = fmax(mq / rq, fmax(mk / rk, mv / rv));
}

static void check_docs(mc_backend *be, size_t B, size_t T, size_t Q, size_t G, size_t D,
                       const size_t *lens, size_t nlens, const char *what)
{
    kt_rng r = {B * 7919 + T * 31 + Q * 5 + G + D + nlens};
    att_run p;
    run_alloc(&p, B, T, Q, G, D);
    size_t nq = B * T * Q * D, nk = B * T * G * D;
    kt_fill(&r, p.q, nq, -1, 1), kt_fill(&r, p.k, nk, -1, 1), kt_fill(&r, p.v, nk, -1, 1);
    kt_fill(&r, p.dout, nq, -1, 1);
    int32_t *seg = malloc(B * T * sizeof *seg);
    pack(lens, nlens, B, T, seg, NULL);
    run_att(be, &p, seg);

    double eo, eg;
    against_alone(be, &p, seg, &eo, &eg);
    TAP_OK(eo < 2e-6 && eg < 2e-6,
           "%s (B=%zu T=%zu Q=%zu G=%zu D=%zu): packed = each document alone: out/lse %.2e, "
           "grads %.2e < 2e-6",
           what, B, T, Q, G, D, eo, eg);

    /* float64, and finite differences of it */
    att_ctx a = {B,
                 T,
                 Q,
                 G,
                 D,
                 (double)(1.0f / sqrtf((float)D)), /* the kernels' scale */
                 kt_todouble(p.q, nq),
                 kt_todouble(p.k, nk),
                 kt_todouble(p.v, nk),
                 kt_todouble(p.dout, nq),
                 seg};
    double *rout = kt_dalloc(nq), *rlse = kt_dalloc(B * Q * T);
    ref_attention(&a, rout, rlse);
    double e1 = kt_err(p.out, rout, nq), e2 = kt_err(p.lse, rlse, B * Q * T);
    TAP_OK(e1 < 1e-5 && e2 < 1e-5, "%s: fwd vs float64 masked softmax: out %.2e lse %.2e < 1e-5",
           what, e1, e2);
    double eq = kt_fd_check(att_loss, &a, a.q, nq, p.dq, NULL, 60, 1);
    double ek = kt_fd_check(att_loss, &a, a.k, nk, p.dk, NULL, 60, 2);
    double ev = kt_fd_check(att_loss, &a, a.v, nk, p.dv, NULL, 60, 3);
    TAP_OK(eq < 1e-4 && ek < 1e-4 && ev < 1e-4,
           "%s: bwd vs finite differences: dq %.2e dk %.2e dv %.2e < 1e-4", what, eq, ek, ev);

    /* one thread: the same bits */
    att_run p1 = p;
    run_alloc(&p1, B, T, Q, G, D);
    memcpy(p1.q, p.q, nq * 4), memcpy(p1.k, p.k, nk * 4), memcpy(p1.v, p.v, nk * 4);
    memcpy(p1.dout, p.dout, nq * 4);
    mc_backend *be1 = kt_backend(1);
    run_att(be1, &p1, seg);
    mc_backend_free(be1);
    TAP_OK(same_bits(&p, &p1), "%s: one thread gives the same bits", what);

    /* every path this CPU has: the same bits */
    const char *paths[] = {"baseline", "avx2", "avx512"}, *old = getenv("MC_CPU_ISA");
    char *saved = old ? strdup(old) : NULL;
    int same = 1, ran = 0;
    for (int i = 0; i < 3; i++) {
        setenv("MC_CPU_ISA", paths[i], 1);
        mc_backend *bp = NULL;
        mc_error err;
        if (mc_backend_cpu_new(0, &bp, &err) != MC_OK) continue; /* the CPU lacks it */
        run_att(bp, &p1, seg);
        mc_backend_free(bp);
        same &= same_bits(&p, &p1);
        ran++;
    }
    if (saved)
        setenv("MC_CPU_ISA", saved, 1);
    else
        unsetenv("MC_CPU_ISA");
    free(saved);
    TAP_OK(same && ran >= 1, "%s: the same bits on the %d paths this CPU has", what, ran);

    /* all starts 0 (one document): seg NULL's bits */
    memset(seg, 0, B * T * sizeof *seg);
    run_att(be, &p, seg);
    run_att(be, &p1, NULL);
    TAP_OK(same_bits(&p, &p1), "%s: one document (starts 0) gives seg NULL's bits", what);

    free(a.q), free(a.k), free(a.v), free(a.dout), free(rout), free(rlse), free(seg);
    run_free(&p);
    run_free(&p1);
}

/* The KV-cache forward with segment starts: the prefill equals the training
 * forward's rows, and decoding one row at a time gives the prefill's bits. */
static void check_kv(mc_backend *be)
{
    size_t T = 150, Q = 4, G = 2, D = 16, nq = T * Q * D, nk = T * G * D;
    const size_t lens[] = {70, 1, 66, 13};
    kt_rng r = {1501};
    float *q = kt_falloc(nq), *k = kt_falloc(nk), *v = kt_falloc(nk);
    kt_fill(&r, q, nq, -1, 1), kt_fill(&r, k, nk, -1, 1), kt_fill(&r, v, nk, -1, 1);
    int32_t *seg = malloc(T * sizeof *seg);
    pack(lens, 4, 1, T, seg, NULL);
    float *a = kt_falloc(nq), *lse = kt_falloc(Q * T), *b = kt_falloc(nq), *c = kt_falloc(nq);
    mc_k_attention_fwd(be, a, lse, q, k, v, 1, T, Q, G, D, 0.25f, seg);
    mc_k_attention_kv_fwd(be, b, q, k, v, T, 0, Q, G, D, 0.25f, seg);
    for (size_t t = 0; t < T; t++)
        mc_k_attention_kv_fwd(be, c + t * Q * D, q + t * Q * D, k, v, 1, t, Q, G, D, 0.25f,
                              seg + t);
    TAP_OK(!memcmp(a, b, nq * 4) && !memcmp(b, c, nq * 4),
           "attention_kv with segments: prefill = training forward = one row at a time (bits)");
    free(q), free(k), free(v), free(seg), free(a), free(lse), free(b), free(c);
}

/* RoPE and learned positions at per-token positions: the bits of each
 * document at positions 0.. on its own. */
static void check_positions(mc_backend *be)
{
    size_t B = 2, T = 90, H = 3, D = 16, C = 24, n = B * T * H * D;
    const size_t lens[] = {40, 1, 7, 64};
    int32_t *seg = malloc(B * T * 4), *pos = malloc(B * T * 4);
    pack(lens, 4, B, T, seg, pos);
    kt_rng r = {90};
    float *x = kt_falloc(n), *y = kt_falloc(n);
    kt_fill(&r, x, n, -1, 1);
    memcpy(y, x, n * 4);
    int ok = 1;
    for (int dir = 0; dir < 2; dir++) {
        if (dir == 0)
            mc_k_rope_fwd(be, x, B, T, H, D, &rope10k, 0, pos);
        else
            mc_k_rope_bwd(be, x, B, T, H, D, &rope10k, 0, pos);
        for (size_t bt = 0; bt < B * T;) { /* each document alone, from position 0 */
            size_t len = 1;
            while (bt + len < B * T && pos[bt + len] != 0) len++;
            if (dir == 0)
                mc_k_rope_fwd(be, y + bt * H * D, 1, len, H, D, &rope10k, 0, NULL);
            else
                mc_k_rope_bwd(be, y + bt * H * D, 1, len, H, D, &rope10k, 0, NULL);
            bt += len;
        }
        ok &= !memcmp(x, y, n * 4);
    }
    TAP_OK(ok, "rope fwd/bwd at per-token positions = each document from position 0 (bits)");

    float *wpe = kt_falloc(T * C), *o = kt_falloc(B * T * C), *o2 = kt_falloc(B * T * C);
    kt_fill(&r, wpe, T * C, -1, 1), kt_fill(&r, o, B * T * C, -1, 1);
    memcpy(o2, o, B * T * C * 4);
    mc_k_posemb_fwd(be, o, wpe, B, T, C, 0, pos);
    for (size_t bt = 0; bt < B * T; bt++)
        for (size_t c = 0; c < C; c++) o2[bt * C + c] += wpe[(size_t)pos[bt] * C + c];
    ok = !memcmp(o, o2, B * T * C * 4);
    /* backward: table rows add their tokens in (b, t) order */
    float *dw = kt_falloc(T * C), *dw2 = kt_falloc(T * C);
    kt_fill(&r, dw, T * C, -1, 1);
    memcpy(dw2, dw, T * C * 4);
    mc_k_posemb_bwd(be, dw, o, B, T, C, 0, pos);
    for (size_t bt = 0; bt < B * T; bt++)
        for (size_t c = 0; c < C; c++) dw2[(size_t)pos[bt] * C + c] += o[bt * C + c];
    ok &= !memcmp(dw, dw2, T * C * 4);
    TAP_OK(ok, "posemb fwd/bwd at per-token positions (bits of the per-row loop)");
    free(seg), free(pos), free(x), free(y), free(wpe), free(o), free(o2), free(dw), free(dw2);
}

/* Printed, not asserted: the work falls with the documents' lengths. */
static void timing(mc_backend *be)
{
    size_t T = 4096, H = 4, D = 64, n = T * H * D;
    kt_rng r = {4096};
    att_run p;
    run_alloc(&p, 1, T, H, H, D);
    kt_fill(&r, p.q, n, -1, 1), kt_fill(&r, p.k, n, -1, 1), kt_fill(&r, p.v, n, -1, 1);
    kt_fill(&r, p.dout, n, -1, 1);
    int32_t *seg = malloc(T * sizeof *seg);
    const size_t lens[] = {4096, 1024, 256};
    double ms[3];
    for (int i = 0; i < 3; i++) {
        pack(lens + i, 1, 1, T, seg, NULL);
        double best = 1e30; /* best of 2: the machine may be shared */
        for (int rep = 0; rep < 2; rep++) {
            double t0 = kt_now();
            run_att(be, &p, seg);
            best = fmin(best, kt_now() - t0);
        }
        ms[i] = best * 1e3;
    }
    TAP_DIAG("attention fwd+bwd T=4096 H=4 D=64, %d threads: one document %.1f ms, documents "
             "of 1024 %.1f ms, of 256 %.1f ms",
             mc_backend_threads(be), ms[0], ms[1], ms[2]);
    free(seg);
    run_free(&p);
}

int main(void)
{
    mc_backend *be = kt_backend(0);
    /* documents across key blocks (64), a one-token document, GQA */
    const size_t a[] = {70, 1, 66, 13, 5};
    check_docs(be, 2, 200, 4, 2, 16, a, 5, "blocks and a 1-token document");
    /* short documents: whole key blocks skipped; MQA */
    const size_t b[] = {3, 9, 2, 17};
    check_docs(be, 1, 150, 2, 1, 32, b, 4, "short documents");
    /* documents aligned to the blocks, D=64 (the wide register tiles) */
    const size_t c[] = {64, 128};
    check_docs(be, 1, 256, 2, 2, 64, c, 2, "block-aligned documents");
    /* one sequence of one document shorter than T: the rest a second one */
    const size_t d[] = {37};
    check_docs(be, 1, 40, 1, 1, 8, d, 1, "T=40, two documents");
    check_kv(be);
    check_positions(be);
    timing(be);
    mc_backend_free(be);
    return tap_done();
}
