/*
 * test_schedule.c - the learning-rate and weight-decay schedules against
 * megatron-core's own OptimizerParamScheduler.
 *
 * tests/data/megatron_lr.txt (made by tests/golden/megatron_lr.py with
 * megatron-core 0.16.1) holds 13 configurations: every decay style, every
 * WSD decay style, warmup by iterations, samples and fraction, a warmup
 * start above 0, decay shorter than training, sample-based training, and
 * linear and cosine weight-decay increments; for each, the lr and weight
 * decay before training and after every iteration, some past the end.
 * Tolerance: 1e-12 relative (the arithmetic is Megatron's, operation for
 * operation, so most values agree exactly; the count of exact ones is
 * printed). Then the option checks, each with its message.
 *
 * Fixtures are found under $top_srcdir (else $srcdir, else .)/tests/data.
 */
#include "mc/schedule.h"
#include "tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int set_key(mc_lr_config *c, const char *key, const char *val)
{
    mc_error err;
#define INT(k, f)                      \
    if (strcmp(key, k) == 0) {         \
        c->f = strtoll(val, NULL, 10); \
        return 1;                      \
    }
#define DBL(k, f)                 \
    if (strcmp(key, k) == 0) {    \
        c->f = strtod(val, NULL); \
        return 1;                 \
    }
    DBL("lr", lr)
        DBL("min_lr", min_lr) DBL("lr_warmup_init", lr_warmup_init) INT("gbs", global_batch_size)
            INT("train_iters", train_iters) INT("train_samples", train_samples)
                INT("lr_decay_iters", lr_decay_iters) INT("lr_decay_samples", lr_decay_samples) INT(
                    "lr_warmup_iters", lr_warmup_iters) INT("lr_warmup_samples", lr_warmup_samples)
                    DBL("lr_warmup_fraction", lr_warmup_fraction)
                        INT("lr_wsd_decay_iters", lr_wsd_decay_iters)
                            INT("lr_wsd_decay_samples", lr_wsd_decay_samples)
                                DBL("weight_decay", weight_decay) DBL("start_weight_decay",
                                                                      start_weight_decay)
                                    DBL("end_weight_decay", end_weight_decay)
#undef INT
#undef DBL
                                        if (strcmp(key, "decay_style") ==
                                            0) return mc_lr_decay_style_parse(val, &c->decay_style,
                                                                              &err) == MC_OK;
    if (strcmp(key, "wsd_decay_style") == 0)
        return mc_wsd_decay_style_parse(val, &c->wsd_decay_style, &err) == MC_OK;
    if (strcmp(key, "wd_incr_style") == 0)
        return mc_wd_incr_style_parse(val, &c->wd_incr_style, &err) == MC_OK;
    return strcmp(key, "name") == 0;
}

static double rel(double got, double want)
{
    if (got == want) return 0.0;
    return fabs(got - want) / fmax(fabs(want), 1e-300);
}

/* One configuration: its values follow until the next "config" line. */
typedef struct golden_run {
    char name[64];
    mc_lr_schedule s;
    int ok_setup, n, exact;
    double worst;
} golden_run;

static void finish(golden_run *r)
{
    if (!r->name[0]) return;
    TAP_OK(r->ok_setup && r->n > 0 && r->worst <= 1e-12,
           "%s: %d iterations match megatron-core (max rel. error %.3g, %d of %d exactly)", r->name,
           r->n, r->worst, r->exact, 2 * r->n);
}

static void test_golden(void)
{
    const char *top = getenv("top_srcdir");
    if (!top || !*top) top = getenv("srcdir");
    if (!top || !*top) top = ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/megatron_lr.txt", top);
    FILE *f = fopen(path, "r");
    TAP_OK(f != NULL, "open %s", path);
    if (!f) return;
    char line[1024];
    golden_run r = {0};
    int configs = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || !line[0]) continue;
        if (strncmp(line, "config ", 7) == 0) {
            finish(&r);
            memset(&r, 0, sizeof r);
            configs++;
            mc_lr_config c;
            mc_lr_config_defaults(&c);
            int ok = 1;
            for (char *save = NULL, *tok = strtok_r(line + 7, " ", &save); tok;
                 tok = strtok_r(NULL, " ", &save)) {
                char *eq = strchr(tok, '=');
                if (!eq) {
                    ok = 0;
                    continue;
                }
                *eq = '\0';
                if (strcmp(tok, "name") == 0) snprintf(r.name, sizeof r.name, "%s", eq + 1);
                if (!set_key(&c, tok, eq + 1)) {
                    TAP_DIAG("unknown key %s", tok);
                    ok = 0;
                }
            }
            mc_error err;
            if (mc_lr_schedule_init(&r.s, &c, &err) != MC_OK) {
                TAP_DIAG("%s: %s", r.name, err.msg);
                ok = 0;
            }
            r.ok_setup = ok;
            continue;
        }
        long long it;
        double lr, wd;
        if (sscanf(line, "%lld %lf %lf", &it, &lr, &wd) != 3 || !r.ok_setup) {
            r.ok_setup = 0;
            continue;
        }
        double glr = mc_lr_at(&r.s, it), gwd = mc_wd_at(&r.s, it);
        double e = fmax(rel(glr, lr), rel(gwd, wd));
        if (e > r.worst) {
            if (e > 1e-12)
                TAP_DIAG("%s: iteration %lld: lr %.17g (megatron %.17g), wd %.17g (megatron %.17g)",
                         r.name, it, glr, lr, gwd, wd);
            r.worst = e;
        }
        r.exact += (glr == lr) + (gwd == wd);
        r.n++;
    }
    finish(&r);
    fclose(f);
    TAP_OK(configs == 13, "13 configurations in the golden file (%d)", configs);
}

/* Hand-computed points, independent of the golden file. */
static void test_points(void)
{
    mc_lr_config c;
    mc_lr_schedule s;
    mc_error err;
    mc_lr_config_defaults(&c);
    c.lr = 1.0;
    c.min_lr = 0.1;
    c.global_batch_size = 4;
    c.train_iters = 20;
    c.lr_warmup_iters = 10;
    c.decay_style = MC_LR_COSINE;
    TAP_OK(mc_lr_schedule_init(&s, &c, &err) == MC_OK, "cosine schedule");
    /* warmup: n/W; at the middle of the decay cos(pi/2) = 0 -> 0.1 + 0.5 * 0.9 */
    TAP_OK(mc_lr_at(&s, 0) == 0.0 && mc_lr_at(&s, 5) == 0.5 && mc_lr_at(&s, 10) == 1.0 &&
               fabs(mc_lr_at(&s, 15) - 0.55) < 1e-15 && fabs(mc_lr_at(&s, 20) - 0.1) < 1e-15 &&
               mc_lr_at(&s, 21) == 0.1,
           "warmup, half-way cosine, end, past the end");
    TAP_OK(mc_lr_at_samples(&s, 40.0) == mc_lr_at(&s, 10) &&
               mc_lr_at_samples(&s, 42.0) < mc_lr_at(&s, 10) &&
               mc_lr_at_samples(&s, 42.0) > mc_lr_at(&s, 11),
           "samples and iterations agree");
    TAP_OK(mc_wd_at(&s, 7) == 0.01, "default weight decay 0.01, constant");
}

static int init_fails(mc_lr_config *c, const char *want)
{
    mc_lr_schedule s;
    mc_error err = {0};
    mc_status st = mc_lr_schedule_init(&s, c, &err);
    int ok = st == MC_ERR_USAGE && strstr(err.msg, want) != NULL;
    if (!ok) TAP_DIAG("status %d, message: %s", st, err.msg);
    return ok;
}

static void test_errors(void)
{
    mc_lr_config base, c;
    mc_lr_config_defaults(&base);
    base.lr = 1e-3;
    base.global_batch_size = 8;
    base.train_iters = 100;

    c = base;
    c.global_batch_size = 0;
    TAP_OK(init_fails(&c, "--global-batch-size must be positive"), "no batch size");
    c = base;
    c.train_samples = 800;
    TAP_OK(init_fails(&c, "exactly one of --train-iters and --train-samples"), "both lengths");
    c = base;
    c.lr_decay_samples = 10;
    TAP_OK(init_fails(&c, "not the *-samples ones"), "iters with a samples option");
    c = base;
    c.train_iters = -1;
    c.train_samples = 800;
    c.lr_warmup_iters = 3;
    TAP_OK(init_fails(&c, "not the *-iters ones"), "samples with an iters option");
    c = base;
    c.lr_warmup_fraction = 0.1;
    c.lr_warmup_iters = 3;
    TAP_OK(init_fails(&c, "only one of --lr-warmup-fraction and --lr-warmup-iters"),
           "fraction and iters");
    c = base;
    c.min_lr = 1e-2;
    TAP_OK(init_fails(&c, "--lr 0.001 is below --min-lr 0.01"), "lr below min_lr");
    c = base;
    c.min_lr = -1;
    TAP_OK(init_fails(&c, "--min-lr -1 is negative"), "negative min_lr");
    c = base;
    c.lr_warmup_init = 1;
    TAP_OK(init_fails(&c, "--lr-warmup-init 1 is above --lr 0.001"), "warmup start above lr");
    c = base;
    c.lr_warmup_iters = 100;
    TAP_OK(init_fails(&c, "the warmup (800 samples) must be shorter than the decay (800 samples)"),
           "warmup as long as the decay");
    c = base;
    c.lr_decay_iters = 0;
    TAP_OK(init_fails(&c, "decay length"), "zero decay length");
    c = base;
    c.decay_style = MC_LR_WSD;
    TAP_OK(init_fails(&c, "WSD needs --lr-wsd-decay-iters"), "WSD without its decay length");
    c.lr_wsd_decay_iters = 101;
    TAP_OK(init_fails(&c, "WSD decay (808 samples) is longer than the whole decay"),
           "WSD decay longer than the decay");
    c = base;
    c.wd_incr_style = MC_WD_LINEAR;
    TAP_OK(init_fails(&c, "needs --start-weight-decay and --end-weight-decay"),
           "weight-decay increment without its ends");
    c.start_weight_decay = 0.1;
    c.end_weight_decay = 0.01;
    TAP_OK(init_fails(&c, "--end-weight-decay 0.01 is below --start-weight-decay 0.1"),
           "decreasing weight decay");
    c = base;
    c.start_weight_decay = 0.1;
    c.end_weight_decay = 0.2;
    TAP_OK(init_fails(&c, "constant takes no different"), "constant with different ends");

    mc_lr_decay_style d;
    mc_error err;
    TAP_OK(mc_lr_decay_style_parse("inverse-square-root", &d, &err) == MC_OK &&
               d == MC_LR_INVERSE_SQRT &&
               strcmp(mc_lr_decay_style_name(d), "inverse-square-root") == 0,
           "parse a decay style");
    TAP_OK(mc_lr_decay_style_parse("wsd", &d, &err) == MC_ERR_USAGE &&
               strcmp(err.msg, "--lr-decay-style: unknown style 'wsd' (choose from constant, "
                               "linear, cosine, inverse-square-root, WSD)") == 0,
           "unknown style: %s", err.msg);
    mc_wsd_decay_style w;
    TAP_OK(mc_wsd_decay_style_parse("minus-sqrt", &w, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "minus_sqrt"),
           "unknown WSD style: %s", err.msg);
}

int main(void)
{
    test_golden();
    test_points();
    test_errors();
    return tap_done();
}
