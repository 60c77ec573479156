/*
 * paged_attn.c - one layer's attention of a decode step of mc-serve on the
 * bench model's shape (12 heads of 64, blocks of 16 positions, a pool of 12
 * layers): the paged kernel reading the blocks in place
 * (mc_k_attention_paged_fwd, one call for all sequences) against what
 * mc-serve did before it, each sequence's blocks gathered into a contiguous
 * scratch (mc_bcopy, block by block) and mc_k_attention_kv_fwd called per
 * sequence. NSEQ sequences of one new row after LEN cached positions, the
 * blocks shuffled in the pool; each of the 12 layers in turn (as a step
 * does, so the pool is not in cache). Prints the best and the median wall
 * time of a step's 12 layers over a few repetitions, and the mean CPU time
 * of all the threads (what a loaded machine inflates least; with more than
 * one thread it includes OpenMP's spinning).
 *
 *   bench/serve/paged_attn THREADS NSEQ LEN [MODE]   (bench/serve/paged_attn.sh builds it)
 *
 * MODE paged or gather runs that side alone (for perf stat's cycle counts,
 * which a loaded machine does not inflate as it does the wall time).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc/kern.h"
#include "now.h"


static double cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, nseq = argc > 2 ? atoi(argv[2]) : 16;
    int len = argc > 3 ? atoi(argv[3]) : 100;
    const char *mode = argc > 4 ? argv[4] : "both";
    int run_paged = strcmp(mode, "gather") != 0, run_gather = strcmp(mode, "paged") != 0;
    const size_t Q = 12, G = 12, D = 64, bs = 16, NL = 12, GD = G * D;
    size_t per = ((size_t)len + 1 + bs - 1) / bs, nblk = per * (size_t)nseq;
    size_t bstride = NL * bs * GD;
    mc_backend *be;
    mc_error err;
    if (mc_backend_cpu_new(threads, &be, &err)) {
        fprintf(stderr, "paged_attn: %s\n", err.msg);
        return 1;
    }
    float *kp = malloc(nblk * bstride * sizeof(float)), *vp = malloc(nblk * bstride * sizeof(float));
    float *q = malloc((size_t)nseq * Q * D * sizeof(float));
    float *out = malloc((size_t)nseq * Q * D * sizeof(float));
    float *kc = malloc((per * bs) * GD * sizeof(float)), *vc = malloc((per * bs) * GD * sizeof(float));
    int32_t *tab = malloc(nblk * sizeof *tab), *rows = malloc(nseq * sizeof *rows);
    int32_t *pos0 = malloc(nseq * sizeof *pos0);
    if (!kp || !vp || !q || !out || !kc || !vc || !tab || !rows || !pos0) return 1;
    srand(1);
    for (size_t i = 0; i < nblk * bstride; i++) kp[i] = vp[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < (size_t)nseq * Q * D; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nblk; i++) tab[i] = (int32_t)i;
    for (size_t i = nblk - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1);
        int32_t t = tab[i];
        tab[i] = tab[j], tab[j] = t;
    }
    for (int s = 0; s < nseq; s++) rows[s] = 1, pos0[s] = len;
    float scale = 0.125f;
    enum { REPS = 15 };
    double tp[REPS], tg[REPS], cp = 0, cg = 0;
    for (int r = 0; r < REPS; r++) {
        double c0 = cpu(), t0 = now();
        for (size_t l = 0; run_paged && l < NL; l++) {
            size_t loff = l * bs * GD;
            mc_k_attention_paged_fwd(be, out, q, kp + loff, vp + loff, (size_t)nseq, rows, pos0,
                                     tab, per, bs, bstride, Q, G, D, scale);
        }
        double t1 = now(), c1 = cpu();
        for (size_t l = 0; run_gather && l < NL; l++) {
            size_t loff = l * bs * GD, end = (size_t)len + 1;
            for (int s = 0; s < nseq; s++) {
                for (size_t b = 0; b < per; b++) {
                    size_t run = end - b * bs < bs ? end - b * bs : bs;
                    size_t off = (size_t)tab[s * per + b] * bstride + loff;
                    mc_bcopy(be, kc + b * bs * GD, kp + off, run * GD * sizeof(float));
                    mc_bcopy(be, vc + b * bs * GD, vp + off, run * GD * sizeof(float));
                }
                mc_k_attention_kv_fwd(be, out + s * Q * D, q + s * Q * D, kc, vc, 1, (size_t)len,
                                      Q, G, D, scale, NULL);
            }
        }
        double t2 = now(), c2 = cpu();
        tp[r] = t1 - t0, tg[r] = t2 - t1, cp += c1 - c0, cg += c2 - c1;
    }
    qsort(tp, REPS, sizeof *tp, cmp);
    qsort(tg, REPS, sizeof *tg, cmp);
    printf("%d threads, %d sequences of 1 row after %d positions, 12 layers: paged %.2f ms "
           "(median %.2f, CPU %.2f), gather + contiguous %.2f ms (median %.2f, CPU %.2f)\n",
           threads, nseq, len, 1e3 * tp[0], 1e3 * tp[REPS / 2], 1e3 * cp / REPS, 1e3 * tg[0],
           1e3 * tg[REPS / 2], 1e3 * cg / REPS);
    mc_backend_free(be);
    return 0;
}
