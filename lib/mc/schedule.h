/*
 * schedule.h - the learning-rate and weight-decay schedules of Megatron's
 * OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py), set
 * up from Megatron's options the way megatron/training/training.py's
 * get_optimizer_param_scheduler does.
 *
 * Megatron counts the schedule in samples: lengths given in iterations are
 * multiplied by the global batch size, and after each iteration the
 * scheduler advances by the global batch size. So is it here; mc_lr_at takes
 * the number of completed iterations and mc_lr_at_samples the consumed
 * samples (for a batch size that changes during training).
 *
 * Which learning rate an iteration uses: Megatron sets the rate for
 * num_steps = 0 before training and advances after each optimizer step, so
 * iteration i (1-based) updates with mc_lr_at(s, i - 1), and the rate it
 * logs at iteration i is mc_lr_at(s, i). With warmup from
 * --lr-warmup-init 0 the very first update therefore has lr 0, as in
 * Megatron.
 *
 * lr(n), n in samples, W = warmup, D = decay length, lr0 = --lr-warmup-init:
 *   n <= W (W > 0):      lr0 + (lr - lr0) * n / W
 *   constant:            lr
 *   n > D:               min_lr
 *   inverse-square-root: max(min_lr, lr * sqrt(max(W,1)) / sqrt(max(n,1)))
 *   otherwise, r = (n - W) / (D - W), lr(n) = min_lr + c * (lr - min_lr) with
 *     linear c = 1 - r,  cosine c = (cos(pi r) + 1) / 2,
 *     WSD: c = 1 until n = D - S (S = --lr-wsd-decay-iters/samples), then
 *     with q = (n - (D - S)) / S: exponential 2 * 0.5^q - 1, linear 1 - q,
 *     cosine (cos(pi q) + 1) / 2, minus_sqrt 1 - sqrt(q).
 * Weight decay, T = train length: n > T: end_wd; constant: end_wd; else
 * start_wd + c * (end_wd - start_wd), c = n / T (linear) or
 * (cos(pi (1 - n/T)) + 1) / 2 (cosine).
 */
#ifndef MC_SCHEDULE_H
#define MC_SCHEDULE_H

#include <stdint.h>
#include "mc/opt.h" /* the styles, parsed with the other options */
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Megatron's options. Counts of -1 and a negative fraction mean "not given";
 * mc_lr_config_defaults sets Megatron's defaults. Exactly one of train_iters
 * and train_samples is given; the *_iters options go with train_iters and
 * the *_samples ones with train_samples, as Megatron requires. */
typedef struct mc_lr_config {
    double lr;                                        /* --lr (the peak) */
    double min_lr;                                    /* --min-lr, 0 */
    double lr_warmup_init;                            /* --lr-warmup-init, 0 */
    mc_lr_decay_style decay_style;                    /* --lr-decay-style, linear */
    mc_wsd_decay_style wsd_decay_style;               /* --lr-wsd-decay-style, exponential */
    int64_t global_batch_size;                        /* --global-batch-size */
    int64_t train_iters, train_samples;               /* --train-iters | --train-samples */
    int64_t lr_decay_iters, lr_decay_samples;         /* default: the train length */
    int64_t lr_warmup_iters, lr_warmup_samples;       /* 0 */
    double lr_warmup_fraction;                        /* of the decay length; -1 */
    int64_t lr_wsd_decay_iters, lr_wsd_decay_samples; /* WSD needs one; -1 */
    double weight_decay;                              /* --weight-decay, 0.01 */
    double start_weight_decay, end_weight_decay;      /* -1: --weight-decay */
    mc_wd_incr_style wd_incr_style;                   /* --weight-decay-incr-style, constant */
} mc_lr_config;

/* Everything in samples, as in Megatron's scheduler. */
typedef struct mc_lr_schedule {
    double init_lr, max_lr, min_lr;
    double warmup_steps; /* may be fractional (--lr-warmup-fraction) */
    double decay_steps;
    double wsd_decay_steps; /* 0 unless WSD */
    double wd_incr_steps;
    double start_wd, end_wd;
    int64_t global_batch_size;
    mc_lr_decay_style decay_style;
    mc_wsd_decay_style wsd_decay_style;
    mc_wd_incr_style wd_incr_style;
} mc_lr_schedule;

void mc_lr_config_defaults(mc_lr_config *c);

/* Check the options as Megatron does (its asserts become usage errors that
 * name the option) and convert them to samples. */
mc_status mc_lr_schedule_init(mc_lr_schedule *s, const mc_lr_config *c, mc_error *err);

/* Learning rate after `iterations` completed iterations of the global batch
 * size, and after `samples` consumed samples. */
double mc_lr_at(const mc_lr_schedule *s, int64_t iterations);
double mc_lr_at_samples(const mc_lr_schedule *s, double samples);
/* Weight decay likewise (for the parameters that have any). */
double mc_wd_at(const mc_lr_schedule *s, int64_t iterations);
double mc_wd_at_samples(const mc_lr_schedule *s, double samples);

/* The styles (mc_lr_decay_style, mc_wsd_decay_style, mc_wd_incr_style), their
 * parsers and names are option parsing: mc/opt.h. */

#ifdef __cplusplus
}
#endif
#endif
