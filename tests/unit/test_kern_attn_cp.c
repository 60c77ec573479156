/*
 * test_kern_attn_cp.c - the block kernels of context parallelism
 * (attention_block_fwd/_bwd, attention_merge; lib/model/cp_attn.c) against
 * the whole-sequence attention (attention_fwd/_bwd).
 *
 * The sequence is cut in 2 CP chunks, rank r holding chunks r and
 * 2CP-1-r (Megatron's layout); every rank runs, in ring order, its query
 * chunks against every key chunk at or before them (a diagonal block causal,
 * an earlier one full) and merges the partials by their log-sum-exp; the
 * backward adds each block's dq, dk and dv. Out, lse, dq, dk and dv equal
 * the whole-sequence kernels' within 2e-6 of the largest value (the same
 * terms summed in another grouping), with and without packed documents
 * (segment starts crossing chunks and ranks, documents wholly inside a
 * chunk so that some blocks see no key), GQA, chunks shorter and longer
 * than a key block (64).
 */
#include "kern_test.h"

typedef struct {
    size_t B, T, Q, G, D, cp, c; /* c = T / (2 cp) */
} shape;

/* chunk of rank r's half h */
static size_t chunk_of(const shape *s, size_t r, int h) { return h == 0 ? r : 2 * s->cp - 1 - r; }

/* rows of chunk ch of every sequence of x[B, T, H, D] into the local
 * half h of y[B, 2c, H, D], or back (dir 1) */
static void move_chunk(const shape *s, float *local, float *global, size_t H, size_t ch, int h,
                       int back)
{
    size_t c = s->c, row = H * s->D;
    for (size_t b = 0; b < s->B; b++) {
        float *l = local + (b * 2 * c + (size_t)h * c) * row;
        float *g = global + (b * s->T + ch * c) * row;
        if (back)
            memcpy(g, l, c * row * sizeof(float));
        else
            memcpy(l, g, c * row * sizeof(float));
    }
}

static void check_cp(mc_backend *be, shape s, const size_t *lens, size_t nlens, const char *what)
{
    size_t B = s.B, T = s.T, Q = s.Q, G = s.G, D = s.D, cp = s.cp, c = s.c, Tl = 2 * c;
    size_t nq = B * T * Q * D, nk = B * T * G * D, nlq = B * Tl * Q * D, nlk = B * Tl * G * D;
    float scale = 1.0f / sqrtf((float)D);
    kt_rng r = {T * 131 + cp * 7 + Q + G + D + nlens};
    float *q = kt_falloc(nq), *k = kt_falloc(nk), *v = kt_falloc(nk), *dout = kt_falloc(nq);
    kt_fill(&r, q, nq, -1, 1), kt_fill(&r, k, nk, -1, 1), kt_fill(&r, v, nk, -1, 1);
    kt_fill(&r, dout, nq, -1, 1);
    int32_t *seg = NULL, *lseg = NULL;
    if (lens) {
        seg = malloc(B * T * sizeof *seg), lseg = malloc(B * Tl * sizeof *lseg);
        size_t d = 0;
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < T;) {
                size_t len = lens[d++ % nlens];
                for (size_t i = 0; i < len && t < T; i++, t++) seg[b * T + t] = (int32_t)(t - i);
            }
    }
    /* the whole sequence */
    float *out = kt_falloc(nq), *lse = kt_falloc(B * Q * T);
    float *dq = kt_falloc(nq), *dk = kt_falloc(nk), *dv = kt_falloc(nk);
    mc_k_attention_fwd(be, out, lse, q, k, v, B, T, Q, G, D, scale, seg);
    mc_k_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, Q, G, D, scale, seg);
    /* the ranks */
    float *gout = kt_falloc(nq), *glse = kt_falloc(B * Q * T), *gdq = kt_falloc(nq);
    float *gdk = kt_falloc(nk), *gdv = kt_falloc(nk);
    float *lq = kt_falloc(nlq), *ldo = kt_falloc(nlq), *lo = kt_falloc(nlq),
          *llse = kt_falloc(B * Q * Tl);
    float *po = kt_falloc(nlq), *plse = kt_falloc(B * Q * Tl), *ldq = kt_falloc(nlq);
    float *lk = kt_falloc(nlk), *lv = kt_falloc(nlk), *ldk = kt_falloc(nlk), *ldv = kt_falloc(nlk);
    int empty_blocks = 0;
    for (size_t rank = 0; rank < cp; rank++) {
        for (int h = 0; h < 2; h++) {
            size_t ch = chunk_of(&s, rank, h);
            move_chunk(&s, lq, q, Q, ch, h, 0);
            move_chunk(&s, ldo, dout, Q, ch, h, 0);
            if (seg)
                for (size_t b = 0; b < B; b++)
                    memcpy(lseg + b * Tl + (size_t)h * c, seg + b * T + ch * c, c * sizeof *seg);
        }
        for (size_t i = 0; i < nlq; i++) lo[i] = 0.0f, ldq[i] = 0.0f;
        for (size_t i = 0; i < B * Q * Tl; i++) llse[i] = -INFINITY;
        /* forward, then backward, over the ring */
        for (int pass = 0; pass < 2; pass++)
            for (size_t step = 0; step < cp; step++) {
                size_t src = (rank + cp - step) % cp;
                for (int h = 0; h < 2; h++) {
                    size_t ch = chunk_of(&s, src, h);
                    move_chunk(&s, lk, k, G, ch, h, 0);
                    move_chunk(&s, lv, v, G, ch, h, 0);
                }
                if (pass == 1)
                    memset(ldk, 0, nlk * sizeof(float)), memset(ldv, 0, nlk * sizeof(float));
                for (int qh = 0; qh < 2; qh++)
                    for (int kh = 0; kh < 2; kh++) {
                        size_t qc = chunk_of(&s, rank, qh), kc = chunk_of(&s, src, kh);
                        if (kc > qc) continue;
                        size_t qo = (size_t)qh * c, ko = (size_t)kh * c;
                        const int32_t *sg = seg ? lseg + qo : NULL;
                        if (pass == 0) {
                            mc_k_attention_block_fwd(be, po + qo * Q * D, plse + qo,
                                                     lq + qo * Q * D, lk + ko * G * D,
                                                     lv + ko * G * D, B, c, Tl, c, Tl, Q, G, D,
                                                     scale, qc * c, kc * c, sg);
                            for (size_t b = 0; b < B; b++)
                                for (size_t hh = 0; hh < Q; hh++)
                                    empty_blocks += plse[(b * Q + hh) * Tl + qo] == -INFINITY;
                            mc_k_attention_merge(be, lo + qo * Q * D, llse + qo, po + qo * Q * D,
                                                 plse + qo, B, c, Tl, Q, D);
                        } else {
                            mc_k_attention_block_bwd(
                                be, ldq + qo * Q * D, ldk + ko * G * D, ldv + ko * G * D,
                                ldo + qo * Q * D, lq + qo * Q * D, lk + ko * G * D, lv + ko * G * D,
                                lo + qo * Q * D, llse + qo, B, c, Tl, c, Tl, Q, G, D, scale, qc * c,
                                kc * c, sg);
                        }
                    }
                if (pass == 1) /* the key chunks' gradients go home */
                    for (int h = 0; h < 2; h++) {
                        size_t ch = chunk_of(&s, src, h), row = G * D;
                        for (size_t b = 0; b < B; b++)
                            for (size_t i = 0; i < c * row; i++) {
                                size_t li = (b * Tl + (size_t)h * c) * row + i;
                                size_t gi = (b * T + ch * c) * row + i;
                                gdk[gi] += ldk[li], gdv[gi] += ldv[li];
                            }
                    }
            }
        for (int h = 0; h < 2; h++) {
            size_t ch = chunk_of(&s, rank, h);
            move_chunk(&s, lo, gout, Q, ch, h, 1);
            move_chunk(&s, ldq, gdq, Q, ch, h, 1);
            for (size_t b = 0; b < B; b++)
                for (size_t hh = 0; hh < Q; hh++)
                    memcpy(glse + (b * Q + hh) * T + ch * c,
                           llse + (b * Q + hh) * Tl + (size_t)h * c, c * sizeof(float));
        }
    }
    double *rout = kt_todouble(out, nq), *rlse = kt_todouble(lse, B * Q * T);
    double *rdq = kt_todouble(dq, nq), *rdk = kt_todouble(dk, nk), *rdv = kt_todouble(dv, nk);
    double e[5] = {kt_err(gout, rout, nq), kt_err(glse, rlse, B * Q * T), kt_err(gdq, rdq, nq),
                   kt_err(gdk, rdk, nk), kt_err(gdv, rdv, nk)};
    double worst = 0;
    for (int i = 0; i < 5; i++) worst = e[i] > worst || isnan(e[i]) ? e[i] : worst;
    TAP_OK(worst <= 2e-6,
           "CP=%zu %s (B=%zu T=%zu Q=%zu G=%zu D=%zu): out %.2g lse %.2g dq %.2g dk %.2g dv %.2g",
           cp, what, B, T, Q, G, D, e[0], e[1], e[2], e[3], e[4]);
    if (lens) TAP_DIAG("%d (row, head) blocks saw no key", empty_blocks);
    free(rout), free(rlse), free(rdq), free(rdk), free(rdv);
    free(q), free(k), free(v), free(dout), free(seg), free(lseg), free(out), free(lse), free(dq);
    free(dk), free(dv), free(gout), free(glse), free(gdq), free(gdk), free(gdv), free(lq);
    free(ldo), free(lo), free(llse), free(po), free(plse), free(ldq), free(lk), free(lv);
    free(ldk), free(ldv);
}

/* The merge: two partials of one row equal the row over both key sets,
 * and a partial of -inf adds nothing (bit for bit). */
static void check_merge(mc_backend *be)
{
    size_t D = 8;
    float o[8], p[8], l = 0.5f, pl = -INFINITY;
    for (size_t d = 0; d < D; d++) o[d] = (float)d, p[d] = 100.0f;
    mc_k_attention_merge(be, o, &l, p, &pl, 1, 1, 1, 1, D);
    int same = l == 0.5f;
    for (size_t d = 0; d < D; d++) same &= o[d] == (float)d;
    float o2[8] = {0}, l2 = -INFINITY, pl2 = 1.25f;
    mc_k_attention_merge(be, o2, &l2, o, &l, 1, 1, 1, 1, D);
    for (size_t d = 0; d < D; d++) same &= o2[d] == o[d];
    same &= l2 == 0.5f;
    /* equal lse: the mean, lse + log 2 */
    float a[8], b[8], la = 1.25f;
    for (size_t d = 0; d < D; d++) a[d] = 1.0f, b[d] = 3.0f;
    mc_k_attention_merge(be, a, &la, b, &pl2, 1, 1, 1, 1, D);
    int mean = fabsf(la - (1.25f + logf(2.0f))) < 1e-6f;
    for (size_t d = 0; d < D; d++) mean &= fabsf(a[d] - 2.0f) < 1e-6f;
    TAP_OK(same && mean, "merge: -inf partials add nothing; equal partials average");
}

int main(void)
{
    mc_backend *be = kt_backend(0);
    /* chunks shorter than a key block, GQA */
    check_cp(be, (shape){2, 48, 4, 2, 16, 2, 12}, NULL, 0, "causal");
    check_cp(be, (shape){1, 64, 4, 1, 8, 4, 8}, NULL, 0, "causal, MQA");
    /* chunks longer than a key block */
    check_cp(be, (shape){1, 280, 2, 2, 16, 2, 70}, NULL, 0, "causal, 70-row chunks");
    /* packed documents across chunk and rank boundaries, and short ones
     * inside a chunk */
    const size_t a[] = {17, 1, 30, 5, 3};
    check_cp(be, (shape){2, 48, 4, 2, 16, 2, 12}, a, 5, "documents");
    check_cp(be, (shape){1, 64, 4, 2, 8, 4, 8}, a, 5, "documents");
    const size_t b[] = {150, 64, 9};
    check_cp(be, (shape){1, 280, 2, 1, 16, 2, 70}, b, 3, "long documents");
    check_merge(be);
    mc_backend_free(be);
    return tap_done();
}
