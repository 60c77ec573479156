/*
 * test_distopt.c - the distributed optimizer (lib/train/distopt.c) under
 * mpirun, driven by tests/tools/parallel_distopt.bats:
 *
 *   test_distopt single      one process, no MPI: DP = 1 distributed equals
 *                            the plain optimizer; the error paths
 *   test_distopt grid TP     world / TP data-parallel ranks
 *   test_distopt save|load FILE dist|plain
 *                            global moments written under one DP, read
 *                            under another (see run_ckpt)
 *
 * Synthetic flat buffers stand in for a model: mc_param spans with and
 * without weight decay, a gap no parameter covers, and sizes that do not
 * divide by DP (1001: tails inside parameters; 1003: the tail in a trailing
 * gap; 2: fewer elements than ranks). Every data-parallel rank makes its own
 * gradients (from its rank and the step; the tensor-parallel replicas of a
 * replicated parameter get the same ones, as they would in a model), scaled
 * by 1/DP as the loop's loss does. Four optimizers run side by side:
 *   ref    plain, on a one-process grid, fed the gradients summed here in
 *          data-parallel rank order ((g0 + g1) + g2 in float: comm.h's order)
 *          (TP = 1 only: with TP the norm needs the model-parallel group)
 *   plain  plain, on the grid, mc_optim_reduce_grads (all-reduce)
 *   dist   distributed (reduce-scatter, shard update, all-gather)
 *   ovl    distributed with --overlap-param-gather
 * Expected: parameters and moments the same bits in all four (AdamW is
 * elementwise and the sums are in the same order); the gradient norm the
 * same bits for ref and plain and within 1e-12 relative for the distributed
 * ones (their double partial sums are added per shard, then over ranks);
 * the clip factor within 1e-12 relative. Steps 0-1 are clipped, 2-3 not
 * (checked for the 1001-element buffers), step 2 carries a loss scale of
 * 4, step 4 has a NaN in one rank's gradient
 * (every optimizer skips it on every rank). Then the moments are gathered
 * (whole buffer and per parameter), loaded into fresh optimizers across
 * kinds (plain's into distributed and the distributed one's into plain,
 * as a checkpoint saved under one DP loads under another: the gathered
 * buffer is the global one, the same under any DP) and two more steps must
 * still agree. Guard elements past the buffer and the gap elements must
 * never change (the padding does not leak). Failures go to stderr; rank 0
 * prints "ok N checks on W ranks" when every rank passed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mc/distopt.h"
#include "rank_check.h"

typedef struct ctx {
    mc_grid g;
    mc_backend *be;
    int checks, failed;
} ctx;

#define GUARD 8
#define GUARD_VALUE 12345.0f

/* ------------------------------------------------------------ the buffers */

typedef struct layout {
    const char *name;
    size_t numel;
    mc_param ps[4];
    size_t nps;
} layout;

static mc_param param(const char *name, size_t off, size_t n, int split_dim, int no_wd)
{
    mc_param p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", name);
    p.offset = off, p.numel = n, p.split_dim = split_dim, p.no_weight_decay = no_wd;
    p.ndim = split_dim < 0 ? 1 : 2;
    return p;
}

/* w1 [0,300) decays, b1 [300,317) does not, gap [317,320), w2 [320,1000)
 * decays, b2 [1000,1001) does not; layout "gap" adds a 2-element tail gap. */
static void make_layout(layout *l, int which)
{
    memset(l, 0, sizeof *l);
    if (which == 2) {
        l->name = "tiny", l->numel = 2, l->nps = 1;
        l->ps[0] = param("w", 0, 2, 0, 0);
        return;
    }
    l->name = which == 0 ? "1001" : "1003-gap";
    l->numel = which == 0 ? 1001 : 1003;
    l->nps = 4;
    l->ps[0] = param("w1", 0, 300, 0, 0);
    l->ps[1] = param("b1", 300, 17, -1, 1);
    l->ps[2] = param("w2", 320, 680, 1, 0);
    l->ps[3] = param("b2", 1000, 1, -1, 1);
}

/* A value in [-1, 1) from a key: stateless, so every rank can make every
 * other rank's gradients. */
static float hval(uint64_t key)
{
    key += 0x9e3779b97f4a7c15ULL;
    key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ULL;
    key = (key ^ (key >> 27)) * 0x94d049bb133111ebULL;
    key ^= key >> 31;
    return (float)((double)(key >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Gradient of element i on data-parallel rank d at step s; the
 * tensor-parallel rank changes it only for split parameters. */
static float grad_of(const layout *l, size_t i, int d, int tp_rank, int s, double amp, int dp)
{
    int split = 0;
    for (size_t k = 0; k < l->nps; k++)
        if (i >= l->ps[k].offset && i < l->ps[k].offset + l->ps[k].numel)
            split = l->ps[k].split_dim >= 0;
    uint64_t key = ((uint64_t)s << 48) ^ ((uint64_t)d << 40) ^
                   ((uint64_t)(split ? tp_rank : 0) << 36) ^ i;
    return (float)(amp * hval(key)) * (1.0f / (float)dp);
}

typedef struct opt {
    const char *name;
    float *p, *g; /* numel + GUARD floats, CPU backend memory */
    mc_optim *o;
} opt;

static void fill_params(const layout *l, float *p, int tp_rank)
{
    for (size_t i = 0; i < l->numel; i++)
        p[i] = hval(0xabcdef00000000ULL ^ ((uint64_t)tp_rank << 32) ^ i);
    for (size_t i = l->numel; i < l->numel + GUARD; i++) p[i] = GUARD_VALUE;
}

static int same_bits(const float *a, const float *b, size_t n, size_t *where)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            *where = i;
            return 0;
        }
    return 1;
}

static double rel(double a, double b) { return a == b ? 0 : fabs(a - b) / fmax(fabs(a), fabs(b)); }

/* Every optimizer's full moments (gathered; collective for the distributed
 * ones), bit for bit against the first's. */
static void check_moments(ctx *c, const layout *l, opt *os, int n, const char *when)
{
    size_t N = l->numel;
    float *m0 = calloc(N, sizeof *m0), *v0 = calloc(N, sizeof *v0);
    float *m = calloc(N, sizeof *m), *v = calloc(N, sizeof *v);
    mc_error e;
    for (int k = 0; k < n; k++) {
        /* Ranks other than data-parallel 0 pass NULL on odd k: the writer
         * alone gets the values, the others still take part. */
        int writer = k % 2 == 0 || c->g.dp_rank == 0;
        mc_status st = mc_optim_gather_moments(os[k].o, 0, N, writer ? (k ? m : m0) : NULL,
                                               writer ? (k ? v : v0) : NULL, &e);
        CHECK(c, st == MC_OK, "%s %s: gather moments: %s", l->name, os[k].name, e.msg);
        size_t at = 0;
        if (k > 0 && writer) {
            CHECK(c, same_bits(m0, m, N, &at) && same_bits(v0, v, N, &at),
                  "%s %s: %s: moments differ from %s's at %zu", l->name, os[k].name, when,
                  os[0].name, at);
        }
    }
    /* Per parameter too: the checkpoint writer's way. */
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < l->nps; j++) {
            const mc_param *p = &l->ps[j];
            mc_status st = mc_optim_gather_moments(os[k].o, p->offset, p->numel, m, v, &e);
            size_t at = 0;
            CHECK(c,
                  st == MC_OK && same_bits(m0 + p->offset, m, p->numel, &at) &&
                      same_bits(v0 + p->offset, v, p->numel, &at),
                  "%s %s: %s: moments of %s differ at %zu (%s)", l->name, os[k].name, when, p->name,
                  at, st ? e.msg : "");
        }
    free(m0), free(v0), free(m), free(v);
}

/* ------------------------------------------------------------ one layout */

static void run_layout(ctx *c, const layout *l)
{
    size_t N = l->numel;
    int dp = c->g.dp, tp_rank = c->g.tp_rank;
    int with_ref = c->g.tp == 1;
    mc_grid single;
    mc_grid_single(&single);
    mc_optim_config cfg;
    mc_optim_config_init(&cfg);
    cfg.weight_decay = 0.1;
    cfg.clip_grad = 1.0;
    mc_error e;

    opt os[4] = {{"plain", 0, 0, 0}, {"dist", 0, 0, 0}, {"ovl", 0, 0, 0}, {"ref", 0, 0, 0}};
    int n = with_ref ? 4 : 3;
    for (int k = 0; k < n; k++) {
        os[k].p = mc_balloc(c->be, (N + GUARD) * sizeof(float), &e);
        os[k].g = mc_balloc(c->be, (N + GUARD) * sizeof(float), &e);
        fill_params(l, os[k].p, tp_rank);
        for (size_t i = N; i < N + GUARD; i++) os[k].g[i] = GUARD_VALUE;
        mc_status st;
        if (k == 0)
            st = mc_optim_new(c->be, &c->g, &cfg, os[k].p, os[k].g, N, l->ps, l->nps, &os[k].o, &e);
        else if (k == 3)
            st = mc_optim_new(c->be, &single, &cfg, os[k].p, os[k].g, N, l->ps, l->nps, &os[k].o,
                              &e);
        else
            st = mc_optim_new_distributed(c->be, &c->g, &cfg, os[k].p, os[k].g, N, l->ps, l->nps,
                                          k == 2, &os[k].o, &e);
        CHECK(c, st == MC_OK, "%s %s: create: %s", l->name, os[k].name, st ? e.msg : "");
        if (st) exit(1);
    }
    float *init = malloc(N * sizeof *init), *before = malloc(N * sizeof *before);
    memcpy(init, os[0].p, N * sizeof *init);

    /* The shard: sizes and memory. */
    size_t lo, hi, tail;
    mc_optim_shard(os[1].o, &lo, &hi, &tail);
    size_t q = N / (size_t)dp, t = N - q * (size_t)dp;
    CHECK(c,
          lo == (size_t)c->g.dp_rank * q && hi == lo + q &&
              tail == ((size_t)c->g.dp_rank < t ? q * (size_t)dp + (size_t)c->g.dp_rank : SIZE_MAX),
          "%s: shard [%zu, %zu) tail %zu for dp rank %d of %d", l->name, lo, hi, tail, c->g.dp_rank,
          dp);
    CHECK(c,
          mc_optim_is_distributed(os[1].o) && !mc_optim_is_distributed(os[0].o) &&
              mc_optim_exp_avg(os[1].o) == NULL && mc_optim_exp_avg_sq(os[1].o) == NULL,
          "%s: the distributed optimizer has no whole-buffer moments", l->name);

    /* The steps. */
    static const double amps[] = {3.0, 2.0, 0.01, 0.02, 0.5, 0.3, 0.05};
    static const double scales[] = {1, 1, 4, 1, 1, 1, 1};
    /* The norm of the summed gradients is about 3 amps[s] whatever N and DP:
     * clipped in steps 0-1, not in 2-3. */
    double norm_amp = 3.0 * sqrt(3.0 * dp / (double)N);
    int nsteps = 7, reloaded = 0;
    for (int s = 0; s < nsteps; s++) {
        if (s == 5 && !reloaded) {
            /* The checkpoint round trip: global moments out of one kind,
             * into a fresh optimizer of the other (plain's into dist, dist's
             * into plain, ovl's own back into ovl). */
            check_moments(c, l, os, n, "before reload");
            float *m = calloc(N, sizeof *m), *v = calloc(N, sizeof *v);
            float *m2 = calloc(N, sizeof *m2), *v2 = calloc(N, sizeof *v2);
            mc_status st = mc_optim_gather_moments(os[0].o, 0, N, m, v, &e);
            st = st ? st : mc_optim_gather_moments(os[1].o, 0, N, m2, v2, &e);
            CHECK(c, st == MC_OK, "%s: gather for reload: %s", l->name, st ? e.msg : "");
            int64_t steps = mc_optim_steps(os[0].o);
            for (int k = 0; k < 3; k++) {
                mc_optim_free(os[k].o);
                os[k].o = NULL;
                st = k == 0 ? mc_optim_new(c->be, &c->g, &cfg, os[k].p, os[k].g, N, l->ps, l->nps,
                                           &os[k].o, &e)
                            : mc_optim_new_distributed(c->be, &c->g, &cfg, os[k].p, os[k].g, N,
                                                       l->ps, l->nps, k == 2, &os[k].o, &e);
                const float *mk = k == 1 ? m : m2, *vk = k == 1 ? v : v2;
                /* Per parameter, as a checkpoint reader would. */
                for (size_t j = 0; j < l->nps && !st; j++)
                    st = mc_optim_set_moments(os[k].o, l->ps[j].offset, l->ps[j].numel,
                                              mk + l->ps[j].offset, vk + l->ps[j].offset, &e);
                CHECK(c, st == MC_OK, "%s %s: reload: %s", l->name, os[k].name, st ? e.msg : "");
                if (st) exit(1);
                mc_optim_set_steps(os[k].o, steps);
            }
            check_moments(c, l, os, n, "after reload");
            free(m), free(v), free(m2), free(v2);
            reloaded = 1;
        }
        for (int k = 0; k < n; k++) {
            for (size_t i = 0; i < N; i++)
                os[k].g[i] = grad_of(l, i, c->g.dp_rank, tp_rank, s, norm_amp * amps[s] * scales[s],
                                     dp);
            if (s == 4) {
                /* A NaN on the last data-parallel rank, in the first rank's
                 * shard: only the global flag can stop the others. */
                if (c->g.dp_rank == dp - 1) os[k].g[0] = NAN;
            }
        }
        if (with_ref) {
            /* The reference sums every rank's gradients itself, in
             * data-parallel rank order, in float. */
            for (size_t i = 0; i < N; i++) {
                float sum = grad_of(l, i, 0, 0, s, norm_amp * amps[s] * scales[s], dp);
                if (s == 4 && dp == 1 && i == 0) sum = NAN;
                for (int d = 1; d < dp; d++)
                    sum += (s == 4 && d == dp - 1 && i == 0)
                               ? NAN
                               : grad_of(l, i, d, 0, s, norm_amp * amps[s] * scales[s], dp);
                os[3].g[i] = sum;
            }
        }
        memcpy(before, os[0].p, N * sizeof *before);
        mc_optim_result res[4];
        for (int k = 0; k < n; k++) {
            mc_status st = k == 3 ? MC_OK : mc_optim_reduce_grads(os[k].o, &e);
            if (!st) st = mc_optim_step(os[k].o, 1e-2 * (1 + s % 3), 0.1, scales[s], &res[k], &e);
            if (!st) st = mc_optim_wait_params(os[k].o, &e);
            CHECK(c, st == MC_OK, "%s %s step %d: %s", l->name, os[k].name, s, st ? e.msg : "");
            if (st) exit(1);
        }
        for (int k = 0; k < n; k++)
            CHECK(c, res[k].found_inf == (s == 4), "%s %s step %d: found_inf %d", l->name,
                  os[k].name, s, res[k].found_inf);
        if (s == 4) {
            size_t at = 0;
            for (int k = 0; k < n; k++)
                CHECK(c, mc_optim_steps(os[k].o) == 4 && same_bits(os[k].p, before, N, &at),
                      "%s %s: the NaN step changed something (steps %lld)", l->name, os[k].name,
                      (long long)mc_optim_steps(os[k].o));
            continue;
        }
        /* (With 2 elements the norm is too random to promise either.) */
        if (s < 2 && N > 100)
            CHECK(c, res[0].clip_coeff < 1, "%s step %d: clipping is active (norm %g)", l->name, s,
                  res[0].grad_norm);
        if ((s == 2 || s == 3) && N > 100)
            CHECK(c, res[0].clip_coeff == 1, "%s step %d: no clipping (norm %g)", l->name, s,
                  res[0].grad_norm);
        for (int k = 1; k < n; k++) {
            double tol = k == 3 ? 0 : 1e-12;
            CHECK(c,
                  rel(res[k].grad_norm, res[0].grad_norm) <= tol &&
                      rel(res[k].clip_coeff, res[0].clip_coeff) <= tol,
                  "%s %s step %d: norm %.17g clip %.17g, plain %.17g %.17g (tolerance %g)", l->name,
                  os[k].name, s, res[k].grad_norm, res[k].clip_coeff, res[0].grad_norm,
                  res[0].clip_coeff, tol);
            size_t at = 0;
            CHECK(c, same_bits(os[k].p, os[0].p, N, &at),
                  "%s %s step %d: parameter %zu: %.9g vs %.9g", l->name, os[k].name, s, at,
                  os[k].p[at], os[0].p[at]);
        }
        if (s == 0 && c->g.rank == 0)
            printf("# %s: step 0 norm %.17g (dist %.17g), clip %.9g\n", l->name, res[0].grad_norm,
                   res[1].grad_norm, res[0].clip_coeff);
    }
    check_moments(c, l, os, n, "at the end");

    /* No leak: guards past the buffer untouched, gap elements unchanged,
     * covered elements changed. */
    for (int k = 0; k < n; k++) {
        int guards = 1, gaps = 1, moved = 1;
        for (size_t i = N; i < N + GUARD; i++)
            guards &= os[k].p[i] == GUARD_VALUE && os[k].g[i] == GUARD_VALUE;
        for (size_t i = 0; i < N; i++) {
            int covered = 0;
            for (size_t j = 0; j < l->nps; j++)
                covered |= i >= l->ps[j].offset && i < l->ps[j].offset + l->ps[j].numel;
            if (covered)
                moved &= os[k].p[i] != init[i];
            else
                gaps &= os[k].p[i] == init[i];
        }
        CHECK(c, guards && gaps && moved, "%s %s: guards %s, gap elements %s, parameters %s",
              l->name, os[k].name, guards ? "intact" : "CHANGED", gaps ? "intact" : "CHANGED",
              moved ? "all updated" : "NOT all updated");
    }

    /* Errors: a step without the reduction; ranges outside the buffer. */
    mc_optim_result r;
    for (size_t i = 0; i < N; i++) os[1].g[i] = 0;
    mc_status st = mc_optim_step(os[1].o, 1e-2, 0.1, 1, &r, &e);
    CHECK(c, st == MC_ERR_INTERNAL && strstr(e.msg, "without mc_optim_reduce_grads"),
          "%s: step without reduce_grads: %d %s", l->name, st, e.msg);
    float tmp[4];
    for (int k = 0; k < 2; k++) {
        st = mc_optim_gather_moments(os[k].o, N - 1, 2, tmp, tmp, &e);
        CHECK(c,
              st == MC_ERR_INTERNAL && strstr(e.msg, "moment gather of elements") &&
                  strstr(e.msg, "outside the buffer"),
              "%s %s: gather out of range: %d %s", l->name, os[k].name, st, e.msg);
        st = mc_optim_set_moments(os[k].o, N + 1, 1, tmp, tmp, &e);
        CHECK(c, st == MC_ERR_INTERNAL && strstr(e.msg, "moment load of elements"),
              "%s %s: load out of range: %d %s", l->name, os[k].name, st, e.msg);
    }

    for (int k = 0; k < n; k++) {
        mc_optim_free(os[k].o);
        mc_bfree(c->be, os[k].p);
        mc_bfree(c->be, os[k].g);
    }
    free(init);
    free(before);
}

/* ------------------------------------------------------------ across DP */

/*
 * A checkpoint written under one DP and read under another, the way the
 * checkpoint code will do it: `save FILE KIND` runs steps 0-2 of the 1001
 * layout on this world (DP = world), gathers the global moments to rank 0
 * (the others pass NULL) and writes dp, steps, the parameters and both
 * moments as raw floats; `load FILE KIND` (KIND: dist or plain) reads it on
 * every rank, sets the parameters, the moments parameter by parameter and
 * the step count, and runs steps 3-4 under this world's DP. Each rank's
 * one-process reference replays all five steps (steps 0-2 summing the
 * saving DP's gradients, 3-4 the loading DP's), and the result must be the
 * same bits: parameters and moments.
 */
#define CKPT_SPLIT 3
#define CKPT_STEPS 5

static void grads_at(const layout *l, int s, int d, int dp, float *g)
{
    static const double amps[] = {3.0, 2.0, 0.01, 0.02, 0.5};
    double amp = 3.0 * sqrt(3.0 * dp / (double)l->numel) * amps[s];
    for (size_t i = 0; i < l->numel; i++) g[i] = grad_of(l, i, d, 0, s, amp, dp);
}

/* The reference (p: numel + GUARD floats): steps [0, until) on one process, DP dp_save before the
 * split and dp_load after. */
static mc_optim *reference(ctx *c, const layout *l, const mc_optim_config *cfg, int dp_save,
                           int dp_load, int until, float *p, float *g)
{
    mc_grid single;
    mc_grid_single(&single);
    mc_error e;
    mc_optim *o;
    fill_params(l, p, 0);
    if (mc_optim_new(c->be, &single, cfg, p, g, l->numel, l->ps, l->nps, &o, &e)) exit(1);
    float *part = malloc(l->numel * sizeof *part);
    for (int s = 0; s < until; s++) {
        int dp = s < CKPT_SPLIT ? dp_save : dp_load;
        grads_at(l, s, 0, dp, g);
        for (int d = 1; d < dp; d++) {
            grads_at(l, s, d, dp, part);
            for (size_t i = 0; i < l->numel; i++) g[i] += part[i];
        }
        mc_optim_result r;
        mc_optim_step(o, 1e-2, 0.1, 1, &r, &e);
    }
    free(part);
    return o;
}

static void run_ckpt(ctx *c, const char *path, int save, int distributed)
{
    layout l;
    make_layout(&l, 0);
    size_t N = l.numel;
    mc_optim_config cfg;
    mc_optim_config_init(&cfg);
    cfg.weight_decay = 0.1;
    mc_error e;
    float *p = mc_balloc(c->be, (N + GUARD) * sizeof(float), &e);
    float *g = mc_balloc(c->be, (N + GUARD) * sizeof(float), &e);
    float *m = calloc(N, sizeof *m), *v = calloc(N, sizeof *v);
    mc_optim *o = NULL;
    mc_status st = distributed ? mc_optim_new_distributed(c->be, &c->g, &cfg, p, g, N, l.ps, l.nps,
                                                          1, &o, &e)
                               : mc_optim_new(c->be, &c->g, &cfg, p, g, N, l.ps, l.nps, &o, &e);
    CHECK(c, st == MC_OK, "create: %s", st ? e.msg : "");
    if (st) exit(1);
    int dp = c->g.dp, dp_save = dp, first = 0;
    fill_params(&l, p, 0);
    if (!save) {
        /* Every rank reads the global tensors; each keeps its shard. */
        FILE *f = fopen(path, "rb");
        int64_t hdr[2] = {0, 0};
        int ok = f && fread(hdr, sizeof hdr, 1, f) == 1 && fread(p, sizeof(float), N, f) == N &&
                 fread(m, sizeof(float), N, f) == N && fread(v, sizeof(float), N, f) == N;
        CHECK(c, ok, "cannot read %s", path);
        if (f) fclose(f);
        if (!ok) exit(1);
        dp_save = (int)hdr[0];
        for (size_t j = 0; j < l.nps && !st; j++)
            st = mc_optim_set_moments(o, l.ps[j].offset, l.ps[j].numel, m + l.ps[j].offset,
                                      v + l.ps[j].offset, &e);
        CHECK(c, st == MC_OK, "set moments: %s", st ? e.msg : "");
        mc_optim_set_steps(o, hdr[1]);
        first = CKPT_SPLIT;
    }
    int until = save ? CKPT_SPLIT : CKPT_STEPS;
    for (int s = first; s < until && !st; s++) {
        grads_at(&l, s, c->g.dp_rank, dp, g);
        mc_optim_result r;
        st = mc_optim_reduce_grads(o, &e);
        st = st ? st : mc_optim_step(o, 1e-2, 0.1, 1, &r, &e);
        st = st ? st : mc_optim_wait_params(o, &e);
        CHECK(c, st == MC_OK, "step %d: %s", s, st ? e.msg : "");
    }
    /* Global moments: data-parallel rank 0 writes, the others only help. */
    int writer = save ? c->g.rank == 0 : 1;
    st = mc_optim_gather_moments(o, 0, N, writer ? m : NULL, writer ? v : NULL, &e);
    CHECK(c, st == MC_OK, "gather: %s", st ? e.msg : "");
    if (save && c->g.rank == 0) {
        FILE *f = fopen(path, "wb");
        int64_t hdr[2] = {dp, mc_optim_steps(o)};
        int ok = f && fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(p, sizeof(float), N, f) == N &&
                 fwrite(m, sizeof(float), N, f) == N && fwrite(v, sizeof(float), N, f) == N;
        CHECK(c, ok && fclose(f) == 0, "cannot write %s", path);
    }
    /* Against the one-process run of the same steps. */
    float *rp = malloc((N + GUARD) * sizeof *rp), *rg = malloc(N * sizeof *rg);
    float *rm = malloc(N * sizeof *rm), *rv = malloc(N * sizeof *rv);
    mc_optim *ref = reference(c, &l, &cfg, dp_save, dp, until, rp, rg);
    mc_optim_gather_moments(ref, 0, N, rm, rv, &e);
    size_t at = 0;
    CHECK(c, same_bits(rp, p, N, &at),
          "%s under DP=%d (saved under DP=%d): parameter %zu differs "
          "from the one-process run",
          save ? "saved" : "loaded", dp, dp_save, at);
    if (writer)
        CHECK(c, same_bits(rm, m, N, &at) && same_bits(rv, v, N, &at),
              "%s under DP=%d: moment %zu differs from the one-process run",
              save ? "saved" : "loaded", dp, at);
    CHECK(c, mc_optim_steps(o) == until, "steps %lld", (long long)mc_optim_steps(o));
    if (c->g.rank == 0)
        printf("# %s %s optimizer, DP=%d (saved under DP=%d): %d steps\n",
               save ? "saved" : "loaded", distributed ? "distributed" : "plain", dp, dp_save,
               until);
    mc_optim_free(ref);
    mc_optim_free(o);
    mc_bfree(c->be, p), mc_bfree(c->be, g);
    free(m), free(v), free(rp), free(rg), free(rm), free(rv);
}

/* ------------------------------------------------------------ main */

static int finish(ctx *c)
{
    double f[2] = {c->failed, c->checks};
    mc_error e;
    if (mc_allreduce_sum_f64(&c->g, MC_GROUP_WORLD, f, 2, &e)) {
        fprintf(stderr, "test_distopt: error: %s\n", e.msg);
        return mc_grid_fail(&c->g, 0);
    }
    int bad = f[0] != 0;
    if (c->g.rank == 0) {
        if (bad)
            printf("FAILED %.0f of %.0f checks on %d ranks\n", f[0], f[1], c->g.world);
        else
            printf("ok %.0f checks on %d rank%s\n", f[1], c->g.world, c->g.world > 1 ? "s" : "");
    }
    mc_grid_finalize(&c->g); /* its staging memory is the backend's */
    mc_backend_free(c->be);
    return bad;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    ctx c;
    memset(&c, 0, sizeof c);
    mc_error e;
    if (!strcmp(mode, "single") && argc == 2) {
        mc_grid_single(&c.g);
    } else if ((!strcmp(mode, "grid") && argc == 3) ||
               ((!strcmp(mode, "save") || !strcmp(mode, "load")) && argc == 4 &&
                (!strcmp(argv[3], "dist") || !strcmp(argv[3], "plain")))) {
        int tp = !strcmp(mode, "grid") ? atoi(argv[2]) : 1;
        if (mc_grid_init_mpi(&argc, &argv, tp, 1, 1, 1, &c.g, &e)) {
            if (c.g.rank == 0) fprintf(stderr, "test_distopt: error: %s\n", e.msg);
            return mc_grid_fail(&c.g, 1);
        }
        mc_grid_set_timeout(&c.g, 1.0, "test_distopt", &e);
    } else {
        fprintf(stderr, "usage: test_distopt single | grid TP | save|load FILE dist|plain\n");
        return 2;
    }
    if (mc_backend_cpu_new(1, &c.be, &e)) {
        fprintf(stderr, "test_distopt: error: %s\n", e.msg);
        return mc_grid_fail(&c.g, 0);
    }
    if (!strcmp(mode, "save") || !strcmp(mode, "load")) {
        run_ckpt(&c, argv[2], !strcmp(mode, "save"), !strcmp(argv[3], "dist"));
        return finish(&c);
    }
    for (int which = 0; which < 3; which++) {
        layout l;
        make_layout(&l, which);
        run_layout(&c, &l);
    }
    return finish(&c);
}
