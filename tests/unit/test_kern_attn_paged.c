/*
 * test_kern_attn_paged.c - mc_k_attention_paged_fwd, the attention of a
 * batch of sequences whose keys and values lie in blocks of a pool (mc-serve,
 * lib/model/infer_batch.c): on random inputs, every sequence's outputs
 * equal mc_k_attention_kv_fwd's on the same keys in one array, bit for bit,
 * with the blocks handed out in a shuffled order, blocks of 1, 5, 16, 64 and
 * 100 positions (smaller than, equal to and larger than the kernel's key
 * blocks of 64), another layer's rows between a block's (bstride), NaN in
 * every position no sequence owns, prefill chunks beside decoded rows; and
 * the same outputs against the causal softmax in float64 (2e-6), on every
 * CPU path this machine has and with 1 and 2 threads.
 */
#include "kern_test.h"

typedef struct {
    size_t nseq, Q, G, D, bs, nl, li, tstride, R, nblk, bstride;
    int32_t rows[8], pos0[8], *tab;
    float *q, *kc[8], *vc[8], *kpool, *vpool, *want;
    double *ref;
} paged_case;

/* Sequences of rows[s] new rows after pos0[s] cached positions, their keys
 * in blocks of bs positions of layer li of nl, the blocks shuffled. */
static void make_case(paged_case *c, size_t nseq, const int *rows, const int *pos0, size_t Q,
                      size_t G, size_t D, size_t bs, uint64_t seed)
{
    kt_rng r = {seed};
    memset(c, 0, sizeof *c);
    c->nseq = nseq, c->Q = Q, c->G = G, c->D = D, c->bs = bs, c->nl = 3, c->li = 1;
    size_t GD = G * D, maxlen = 0;
    for (size_t s = 0; s < nseq; s++) {
        c->rows[s] = rows[s], c->pos0[s] = pos0[s];
        c->R += (size_t)rows[s];
        size_t len = (size_t)(rows[s] + pos0[s]);
        if (len > maxlen) maxlen = len;
        c->nblk += (len + bs - 1) / bs;
    }
    c->tstride = (maxlen + bs - 1) / bs;
    c->nblk += 3; /* blocks no sequence owns */
    c->bstride = c->nl * bs * GD;
    c->q = kt_falloc(c->R * Q * D);
    kt_fill(&r, c->q, c->R * Q * D, -2, 2);
    c->kpool = kt_falloc(c->nblk * c->bstride);
    c->vpool = kt_falloc(c->nblk * c->bstride);
    for (size_t i = 0; i < c->nblk * c->bstride; i++) c->kpool[i] = c->vpool[i] = NAN;
    /* a shuffled order of the blocks (Fisher-Yates) */
    int32_t *perm = malloc(c->nblk * sizeof *perm);
    for (size_t i = 0; i < c->nblk; i++) perm[i] = (int32_t)i;
    for (size_t i = c->nblk - 1; i > 0; i--) {
        size_t j = kt_next(&r) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    c->tab = calloc(nseq * c->tstride, sizeof *c->tab);
    c->want = kt_falloc(c->R * Q * D);
    c->ref = kt_dalloc(c->R * Q * D);
    size_t next = 0, row0 = 0;
    for (size_t s = 0; s < nseq; s++) {
        size_t len = (size_t)(rows[s] + pos0[s]);
        c->kc[s] = kt_falloc(len * GD);
        c->vc[s] = kt_falloc(len * GD);
        kt_fill(&r, c->kc[s], len * GD, -2, 2);
        kt_fill(&r, c->vc[s], len * GD, -1, 1);
        for (size_t b = 0; b < (len + bs - 1) / bs; b++) c->tab[s * c->tstride + b] = perm[next++];
        for (size_t j = 0; j < len; j++) {
            size_t off = (size_t)c->tab[s * c->tstride + j / bs] * c->bstride +
                         (c->li * bs + j % bs) * GD;
            memcpy(c->kpool + off, c->kc[s] + j * GD, GD * sizeof(float));
            memcpy(c->vpool + off, c->vc[s] + j * GD, GD * sizeof(float));
        }
        double *qd = kt_todouble(c->q + row0 * Q * D, (size_t)rows[s] * Q * D);
        double *kd = kt_todouble(c->kc[s], len * GD), *vd = kt_todouble(c->vc[s], len * GD);
        kt_ref_kv(c->ref + row0 * Q * D, qd, kd, vd, (size_t)rows[s], (size_t)pos0[s], Q, G, D,
                  1.0 / sqrt((double)D));
        free(qd), free(kd), free(vd);
        row0 += (size_t)rows[s];
    }
    free(perm);
}

static void run_paged(mc_backend *be, const paged_case *c, float *out)
{
    size_t loff = c->li * c->bs * c->G * c->D;
    mc_k_attention_paged_fwd(be, out, c->q, c->kpool + loff, c->vpool + loff, c->nseq, c->rows,
                             c->pos0, c->tab, c->tstride, c->bs, c->bstride, c->Q, c->G, c->D,
                             1.0f / sqrtf((float)c->D));
}

static void free_case(paged_case *c)
{
    for (size_t s = 0; s < c->nseq; s++) free(c->kc[s]), free(c->vc[s]);
    free(c->q), free(c->kpool), free(c->vpool), free(c->tab), free(c->want), free(c->ref);
}

static void check(mc_backend *be, const char *what, size_t nseq, const int *rows, const int *pos0,
                  size_t Q, size_t G, size_t D, size_t bs)
{
    paged_case c;
    make_case(&c, nseq, rows, pos0, Q, G, D, bs, nseq * 1000 + bs * 7 + D);
    size_t no = c.R * Q * D, row0 = 0;
    float scale = 1.0f / sqrtf((float)D);
    /* each sequence alone in one array: the contiguous kernel */
    for (size_t s = 0; s < nseq; s++) {
        mc_k_attention_kv_fwd(be, c.want + row0 * Q * D, c.q + row0 * Q * D, c.kc[s], c.vc[s],
                              (size_t)rows[s], (size_t)pos0[s], Q, G, D, scale, NULL);
        row0 += (size_t)rows[s];
    }
    float *out = kt_falloc(no);
    run_paged(be, &c, out);
    double e = kt_err(out, c.ref, no);
    TAP_OK(memcmp(out, c.want, no * sizeof(float)) == 0 && e < 2e-6,
           "%s (Q=%zu G=%zu D=%zu, blocks of %zu shuffled): the contiguous kernel's bits, "
           "float64 err %.2e < 2e-6",
           what, Q, G, D, bs, e);

    /* one thread, and every path this CPU has: the same bits */
    float *o2 = kt_falloc(no);
    mc_backend *b1 = kt_backend(1);
    run_paged(b1, &c, o2);
    mc_backend_free(b1);
    int same = memcmp(out, o2, no * sizeof(float)) == 0, ran = 0;
    const char *paths[] = {"baseline", "avx2", "avx512"}, *old = getenv("MC_CPU_ISA");
    char *saved = old ? strdup(old) : NULL;
    for (int i = 0; i < 3; i++) {
        setenv("MC_CPU_ISA", paths[i], 1);
        mc_backend *bp = NULL;
        mc_error err;
        if (mc_backend_cpu_new(2, &bp, &err) != MC_OK) continue; /* the CPU lacks it */
        memset(o2, 0, no * sizeof(float));
        run_paged(bp, &c, o2);
        mc_backend_free(bp);
        same &= memcmp(out, o2, no * sizeof(float)) == 0;
        ran++;
    }
    if (saved)
        setenv("MC_CPU_ISA", saved, 1);
    else
        unsetenv("MC_CPU_ISA");
    free(saved);
    TAP_OK(same && ran >= 1, "%s, blocks of %zu: the same bits with 1 thread and on the %d paths",
           what, bs, ran);

    /* batch invariance: each sequence alone gives its rows' bits in the batch */
    int alone = 1;
    row0 = 0;
    for (size_t s = 0; s < nseq; s++) {
        size_t loff = c.li * bs * G * D, nr = (size_t)rows[s] * Q * D;
        memset(o2, 0, nr * sizeof(float));
        mc_k_attention_paged_fwd(be, o2, c.q + row0 * Q * D, c.kpool + loff, c.vpool + loff, 1,
                                 c.rows + s, c.pos0 + s, c.tab + s * c.tstride, c.tstride, bs,
                                 c.bstride, Q, G, D, scale);
        alone &= memcmp(o2, out + row0 * Q * D, nr * sizeof(float)) == 0;
        row0 += (size_t)rows[s];
    }
    TAP_OK(alone, "%s, blocks of %zu: each sequence alone gives its bits in the batch", what, bs);
    free(out), free(o2);
    free_case(&c);
}

int main(void)
{
    mc_backend *be = kt_backend(2);
    /* a serving step: decoded rows beside prefill chunks, one over several
     * query blocks, contexts across many key blocks */
    const int rows[] = {1, 70, 1, 9, 1, 130}, pos0[] = {0, 0, 200, 61, 63, 5};
    const size_t bss[] = {1, 5, 16, 64, 100};
    for (size_t i = 0; i < sizeof bss / sizeof *bss; i++)
        check(be, "mixed batch", 6, rows, pos0, 4, 2, 16, bss[i]);
    /* register tiles (64 output columns at once), head sizes with a rest */
    const int r2[] = {66, 1, 3}, p2[] = {61, 140, 64};
    check(be, "tiles", 3, r2, p2, 2, 2, 64, 16);
    check(be, "tiles", 3, r2, p2, 2, 1, 80, 7);
    check(be, "tiles", 3, r2, p2, 3, 1, 68, 64);
    /* decoding only, GPT-2's head size */
    const int r3[] = {1, 1, 1, 1}, p3[] = {0, 100, 511, 33};
    check(be, "decode", 4, r3, p3, 12, 12, 64, 16);
    mc_backend_free(be);
    return tap_done();
}
