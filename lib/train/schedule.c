/*
 * schedule.c - Megatron's learning-rate and weight-decay schedules
 * (OptimizerParamScheduler.get_lr/get_wd) and the conversion of Megatron's
 * options to the scheduler's sample counts (training.py's
 * get_optimizer_param_scheduler). The formulas are in mc/schedule.h.
 *
 * The arithmetic follows Megatron's operation for operation (same order,
 * pow where Python uses **, doubles where Python has floats) so that the
 * rates agree to the last bit or nearly; tests/unit/test_schedule.c checks
 * them against megatron-core's own values.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/schedule.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

void mc_lr_config_defaults(mc_lr_config *c)
{
    *c = (mc_lr_config){
        .lr = 0.0,
        .min_lr = 0.0,
        .lr_warmup_init = 0.0,
        .decay_style = MC_LR_LINEAR,
        .wsd_decay_style = MC_WSD_EXPONENTIAL,
        .global_batch_size = -1,
        .train_iters = -1,
        .train_samples = -1,
        .lr_decay_iters = -1,
        .lr_decay_samples = -1,
        .lr_warmup_iters = 0,
        .lr_warmup_samples = 0,
        .lr_warmup_fraction = -1.0,
        .lr_wsd_decay_iters = -1,
        .lr_wsd_decay_samples = -1,
        .weight_decay = 0.01,
        .start_weight_decay = -1.0,
        .end_weight_decay = -1.0,
        .wd_incr_style = MC_WD_CONSTANT,
    };
}

mc_status mc_lr_schedule_init(mc_lr_schedule *s, const mc_lr_config *c, mc_error *err)
{
    memset(s, 0, sizeof *s);
    if (c->global_batch_size <= 0)
        return mc_error_set(err, MC_ERR_USAGE, "--global-batch-size must be positive");
    int64_t gbs = c->global_batch_size;
    bool by_iters = c->train_iters > 0;
    if (by_iters == (c->train_samples > 0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "give exactly one of --train-iters and --train-samples");
    if (c->lr_warmup_fraction >= 0.0 && c->lr_warmup_fraction > 1.0)
        return mc_error_set(err, MC_ERR_USAGE, "--lr-warmup-fraction %g is over 1",
                            c->lr_warmup_fraction);
    if (c->lr_warmup_iters < 0 || c->lr_warmup_samples < 0)
        return mc_error_set(err, MC_ERR_USAGE, "--lr-warmup-iters/-samples must not be negative");

    double decay, warmup, wsd = 0.0, wd_incr;
    if (by_iters) {
        if (c->lr_decay_samples >= 0 || c->lr_warmup_samples > 0 || c->lr_wsd_decay_samples >= 0)
            return mc_error_set(err, MC_ERR_USAGE,
                                "--train-iters goes with the *-iters "
                                "learning-rate options, not the *-samples ones");
        if (c->lr_warmup_fraction >= 0.0 && c->lr_warmup_iters > 0)
            return mc_error_set(err, MC_ERR_USAGE,
                                "give only one of --lr-warmup-fraction and --lr-warmup-iters");
        int64_t decay_iters = c->lr_decay_iters >= 0 ? c->lr_decay_iters : c->train_iters;
        decay = (double)(decay_iters * gbs);
        wd_incr = (double)(c->train_iters * gbs);
        if (c->lr_wsd_decay_iters >= 0) wsd = (double)(c->lr_wsd_decay_iters * gbs);
        warmup = c->lr_warmup_fraction >= 0.0 ? c->lr_warmup_fraction * decay
                                              : (double)(c->lr_warmup_iters * gbs);
    } else {
        if (c->lr_decay_iters >= 0 || c->lr_warmup_iters > 0 || c->lr_wsd_decay_iters >= 0)
            return mc_error_set(err, MC_ERR_USAGE,
                                "--train-samples goes with the *-samples "
                                "learning-rate options, not the *-iters ones");
        if (c->lr_warmup_fraction >= 0.0 && c->lr_warmup_samples > 0)
            return mc_error_set(err, MC_ERR_USAGE,
                                "give only one of --lr-warmup-fraction and --lr-warmup-samples");
        decay = (double)(c->lr_decay_samples >= 0 ? c->lr_decay_samples : c->train_samples);
        wd_incr = (double)c->train_samples;
        if (c->lr_wsd_decay_samples >= 0) wsd = (double)c->lr_wsd_decay_samples;
        warmup = c->lr_warmup_fraction >= 0.0 ? c->lr_warmup_fraction * decay
                                              : (double)c->lr_warmup_samples;
    }

    /* Megatron's asserts (OptimizerParamScheduler.__init__, arguments.py). */
    if (!(c->min_lr >= 0.0))
        return mc_error_set(err, MC_ERR_USAGE, "--min-lr %g is negative", c->min_lr);
    if (!(c->lr >= c->min_lr))
        return mc_error_set(err, MC_ERR_USAGE, "--lr %g is below --min-lr %g", c->lr, c->min_lr);
    if (!(c->lr_warmup_init <= c->lr))
        return mc_error_set(err, MC_ERR_USAGE, "--lr-warmup-init %g is above --lr %g",
                            c->lr_warmup_init, c->lr);
    if (!(decay > 0.0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "the learning-rate decay length "
                            "(--lr-decay-iters/-samples) must be positive");
    if (!(warmup < decay))
        return mc_error_set(err, MC_ERR_USAGE,
                            "the warmup (%.17g samples) must be shorter "
                            "than the decay (%.17g samples)",
                            warmup, decay);
    if (c->decay_style == MC_LR_WSD && !(wsd > 0.0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--lr-decay-style WSD needs "
                            "--lr-wsd-decay-iters or --lr-wsd-decay-samples");
    if (wsd > decay)
        return mc_error_set(err, MC_ERR_USAGE,
                            "the WSD decay (%.17g samples) is longer than "
                            "the whole decay (%.17g samples)",
                            wsd, decay);

    double start_wd = c->start_weight_decay, end_wd = c->end_weight_decay;
    if (c->wd_incr_style == MC_WD_CONSTANT) {
        /* Megatron refuses --start/--end-weight-decay here; mc takes equal
         * ones and otherwise uses --weight-decay. */
        if (start_wd >= 0.0 || end_wd >= 0.0) {
            if (start_wd != end_wd)
                return mc_error_set(err, MC_ERR_USAGE,
                                    "--weight-decay-incr-style constant "
                                    "takes no different --start-weight-decay and "
                                    "--end-weight-decay");
        } else {
            start_wd = end_wd = c->weight_decay;
        }
    } else if (start_wd < 0.0 || end_wd < 0.0) {
        return mc_error_set(err, MC_ERR_USAGE,
                            "--weight-decay-incr-style linear or cosine "
                            "needs --start-weight-decay and --end-weight-decay");
    }
    if (!(start_wd >= 0.0) || !(end_wd >= start_wd))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--end-weight-decay %g is below "
                            "--start-weight-decay %g",
                            end_wd, start_wd);

    s->init_lr = c->lr_warmup_init;
    s->max_lr = c->lr;
    s->min_lr = c->min_lr;
    s->warmup_steps = warmup;
    s->decay_steps = decay;
    s->wsd_decay_steps = c->decay_style == MC_LR_WSD ? wsd : 0.0;
    s->wd_incr_steps = wd_incr;
    s->start_wd = start_wd;
    s->end_wd = end_wd;
    s->global_batch_size = gbs;
    s->decay_style = c->decay_style;
    s->wsd_decay_style = c->wsd_decay_style;
    s->wd_incr_style = c->wd_incr_style;
    return MC_OK;
}

double mc_lr_at_samples(const mc_lr_schedule *s, double n)
{
    double max_lr = s->max_lr, min_lr = s->min_lr, w = s->warmup_steps, d = s->decay_steps;

    /* Linear warmup: lr0 + (lr - lr0) * n / W. */
    if (w > 0.0 && n <= w) return s->init_lr + (max_lr - s->init_lr) * n / w;
    if (s->decay_style == MC_LR_CONSTANT) return max_lr;
    if (n > d) return min_lr;
    if (s->decay_style == MC_LR_INVERSE_SQRT) {
        /* lr * sqrt(W) / sqrt(n), never below min_lr. */
        double ws = w > 1.0 ? w : 1.0, ns = n > 1.0 ? n : 1.0;
        double lr = max_lr * pow(ws, 0.5) / pow(ns, 0.5);
        return lr > min_lr ? lr : min_lr;
    }

    double ratio = (n - w) / (d - w);
    double delta = max_lr - min_lr, coeff = 1.0;
    switch (s->decay_style) {
    case MC_LR_LINEAR: coeff = 1.0 - ratio; break;
    case MC_LR_COSINE: coeff = 0.5 * (cos(M_PI * ratio) + 1.0); break;
    case MC_LR_WSD: {
        /* Stable at lr until the last S samples of the decay, then anneal. */
        double anneal_start = d - s->wsd_decay_steps;
        if (n <= anneal_start) {
            coeff = 1.0;
            break;
        }
        double q = (n - anneal_start) / s->wsd_decay_steps;
        switch (s->wsd_decay_style) {
        case MC_WSD_LINEAR: coeff = 1.0 - q; break;
        case MC_WSD_COSINE: coeff = 0.5 * (cos(M_PI * q) + 1.0); break;
        case MC_WSD_EXPONENTIAL: coeff = 2.0 * pow(0.5, q) - 1.0; break;
        case MC_WSD_MINUS_SQRT: coeff = 1.0 - sqrt(q); break;
        }
        break;
    }
    default: break;
    }
    return min_lr + coeff * delta;
}

double mc_lr_at(const mc_lr_schedule *s, int64_t iterations)
{
    return mc_lr_at_samples(s, (double)(iterations * s->global_batch_size));
}

double mc_wd_at_samples(const mc_lr_schedule *s, double n)
{
    if (n > s->wd_incr_steps || s->wd_incr_style == MC_WD_CONSTANT) return s->end_wd;
    double ratio = n / s->wd_incr_steps;
    double coeff = s->wd_incr_style == MC_WD_LINEAR ? ratio
                                                    : 0.5 * (cos(M_PI * (1.0 - ratio)) + 1.0);
    return s->start_wd + coeff * (s->end_wd - s->start_wd);
}

double mc_wd_at(const mc_lr_schedule *s, int64_t iterations)
{
    return mc_wd_at_samples(s, (double)(iterations * s->global_batch_size));
}
