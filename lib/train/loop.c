/*
 * loop.c - the training loop of megatron/training/training.py on the mc
 * model: global batches of micro-batches with gradient accumulation, the
 * learning-rate schedule, the optimizer step with loss scaling and NaN
 * skips, Megatron's log line, evaluation, metrics, checkpoints, and the
 * clean exits (signal, --exit-interval, --exit-duration-in-mins). Resumes
 * exactly: see doc/ARCHITECTURE.md, "Training".
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "mc/ckpt.h"
#include "mc/distopt.h"
#include "mc/gptdata.h"
#include "mc/sft.h"
#include "mc/metrics.h"
#include "mc/train.h"
#include "train/commlog.h"
#include "train/dpo.h"
#include "train/grad_buckets.h"
#include "train/pipeline.h"
#include "train/state.h"

void mc_train_config_init(mc_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->micro_batch_size = 1;
    mc_lr_config_defaults(&c->sched);
    c->sched.lr = -1; /* required */
    mc_optim_config_init(&c->optim);
    c->prec = MC_PREC_FP32;
    c->initial_loss_scale = 4294967296.0;
    c->min_loss_scale = 1.0;
    c->loss_scale_window = 1000;
    c->hysteresis = 2;
    c->max_nan_iters = 10;
    c->eval_interval = 1000;
    c->eval_iters = 100;
    c->log_interval = 100;
    c->seed = 1234;
    c->dpo.beta = 0.1;
    c->kd_temperature = 1.0f;
    c->kd_alpha = 0.5f;
}

/* Everything one run holds. */
typedef struct run {
    const mc_train_config *c;
    mc_backend *be;
    const mc_grid *g;
    mc_model *model;
    mc_model *teacher; /* --kd-teacher: frozen, never saved */
    mc_optim *optim;
    int optim_prepares;       /* mc_optim_set_prepared took the model's prepared weights */
    mc_grad_buckets *buckets; /* the data-parallel gradient reduction */
    mc_gpt_dataset *ds;
    mc_sft_dataset *sft; /* --sft: packed conversations instead of ds */
    uint8_t *mask;       /* --sft: one sample's loss mask */
    /* --dpo: the pairs (instead of ds), the reference's logp of every
     * pair's chosen and rejected answer [2 pairs], the loaded micro-batch's
     * pairs [mbs] (-1: padding of the reference pass) and reference values
     * [2 mbs], whether the reference pass is running, and the sums of the
     * iteration's metrics */
    mc_pref_dataset *pref;
    double *dpo_ref, *dpo_cur, *dpo_seq;
    int64_t *dpo_pairs;
    int dpo_ref_pass;
    mc_dpo_sums dpo_sums;
    mc_metrics *metrics;
    mc_lr_schedule sched;
    mc_train_state s;
    int64_t train_iters, global_batch, num_micro, dp, T;
    int pp;                             /* pipeline stages: > 1 runs pipeline.c */
    int32_t *tokens, *targets, *sample; /* host: one micro-batch, one sample */
    int32_t mask_eod;                   /* --eod-mask-loss: the eod id; -1: off */
    char *config_json;
    int64_t last_saved; /* iteration of the last checkpoint written, -1 */
    mc_train_report *rep;
    double flops_per_token;
    /* MoE: the MoE layers (0: dense), and the last iteration's balancing
     * losses as Megatron logs them (load_balancing_loss or
     * seq_load_balancing_loss, z_loss) */
    int moe_layers;
    double moe_lb, moe_z;
    double *moe_layer_losses; /* [2 num_layers]: the last iteration's per layer */
    double *moe_tokens;       /* [num_layers, E]: the last iteration's tokens per expert */
    double t_start;           /* --exit-duration-in-mins counts from here, set-up included */
    /* --async-save: the write in flight, if any */
    struct {
        int active;
        pthread_t thread;
        mc_train_snapshot *snap; /* one process: the host copy, kept from save to save */
        mc_grid wg;              /* a grid: g with a world of its own for the writer thread */
        int has_wg;
        mc_ckpt_writer *w; /* a grid: the staged writer the thread commits */
        const char *dir;
        int64_t iteration;
        double t0;
        mc_status st;
        mc_error err;
        char out[4096];
    } async;
} run;

static void say(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const run *r, const char *fmt, ...)
{
    if (!r->c->print) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    r->c->print(r->c->print_ctx, line);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Megatron's " [%Y-%m-%d %H:%M:%S.%f]" stamp, local time. */
static void stamp(char *out, size_t cap)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(out, cap, "%s.%06ld", day, (long)tv.tv_usec);
}

/* Python's "{:.3f}" of a float: nan and inf spelled as Python does. */
static void fmt_py(char *out, size_t cap, const char *fmt, double v)
{
    if (isnan(v))
        snprintf(out, cap, "nan");
    else if (isinf(v))
        snprintf(out, cap, v > 0 ? "inf" : "-inf");
    else
        snprintf(out, cap, fmt, v);
}

static int64_t num_samples(const run *r, mc_split split)
{
    return r->pref  ? mc_pref_dataset_num_samples(r->pref, split)
           : r->sft ? mc_sft_dataset_num_samples(r->sft, split)
                    : mc_gpt_dataset_num_samples(r->ds, split);
}

/* --dpo: pair `pair` into micro-batch row b (chosen) and row mbs + b
 * (rejected), targets -1 where the answer's mask is 0; pair < 0 loads pair
 * 0 as padding (the reference pass records nothing for it). */
static mc_status load_pair(run *r, int64_t b, int64_t pair, mc_error *err)
{
    int64_t mbs = r->c->micro_batch_size, T = r->T, p = pair < 0 ? 0 : pair;
    for (int side = 0; side < 2; side++) {
        int64_t row = side ? mbs + b : b;
        mc_status st = mc_pref_dataset_read(r->pref, p, side, r->sample, r->mask, err);
        if (st) return st;
        memcpy(r->tokens + row * T, r->sample, (size_t)T * sizeof(int32_t));
        for (int64_t t = 0; t < T; t++)
            r->targets[row * T + t] = r->mask[t + 1] ? r->sample[t + 1] : -1;
        r->dpo_cur[2 * b + side] = r->dpo_ref ? r->dpo_ref[2 * p + side] : 0.0;
    }
    r->dpo_pairs[b] = pair;
    return MC_OK;
}

/* --dpo's objective on the model's log-probabilities (mc_logp_loss_fn):
 * in the reference pass, each pair's summed logp recorded; otherwise
 * the loss against the micro-batch's reference values. */
static mc_status dpo_logp_loss(void *ctx, const float *logp, const int32_t *targets, size_t n,
                               float *dlogp, double *loss, int64_t *count, mc_error *err)
{
    run *r = ctx;
    size_t B = (size_t)r->c->micro_batch_size, T = (size_t)r->T;
    if (n != 2 * B * T)
        return mc_error_set(err, MC_ERR_INTERNAL, "--dpo: a micro-batch of %zu positions", n);
    if (r->dpo_ref_pass) {
        mc_dpo_sequence_logps(logp, targets, B, T, r->dpo_seq);
        for (size_t b = 0; b < B; b++) {
            int64_t p = r->dpo_pairs[b];
            if (p < 0) continue;
            r->dpo_ref[2 * p] = r->dpo_seq[2 * b];
            r->dpo_ref[2 * p + 1] = r->dpo_seq[2 * b + 1];
        }
        *loss = 0;
        *count = 0;
        return MC_OK;
    }
    *count = (int64_t)B;
    return mc_dpo_objective(&r->c->dpo, logp, targets, B, T, r->dpo_cur, dlogp, loss, &r->dpo_sums,
                            err);
}

/* Fill one micro-batch: sample indices start at `first`, consecutive.
 * For a split, indices wrap around its size (validation is cyclic, as
 * Megatron's cyclic validation iterator). With --sft a target whose token
 * the loss mask leaves out is -1, so the loss averages over the rest. */
static mc_status load_batch(run *r, mc_split split, int64_t first, int wrap, mc_error *err)
{
    int64_t n = num_samples(r, split);
    int64_t mbs = r->c->micro_batch_size, T = r->T;
    for (int64_t b = 0; b < mbs; b++) {
        int64_t idx = first + b;
        if (wrap) idx %= n;
        if (idx >= n)
            return mc_error_set(err, MC_ERR_INTERNAL,
                                "%s sample %" PRId64 " is past the %" PRId64 " built",
                                mc_split_name(split), idx, n);
        if (r->pref) {
            mc_status st = load_pair(r, b, mc_pref_dataset_pair(r->pref, split, idx), err);
            if (st) return st;
            continue;
        }
        mc_status st = r->sft ? mc_sft_dataset_sample(r->sft, split, idx, r->sample, r->mask, err)
                              : mc_gpt_dataset_sample(r->ds, split, idx, r->sample, err);
        if (st) return st;
        memcpy(r->tokens + b * T, r->sample, (size_t)T * sizeof(int32_t));
        memcpy(r->targets + b * T, r->sample + 1, (size_t)T * sizeof(int32_t));
        if (r->sft)
            for (int64_t t = 0; t < T; t++)
                if (!r->mask[t + 1]) r->targets[b * T + t] = -1;
        if (r->mask_eod >= 0)
            mc_doc_mask_targets(r->mask_eod, r->tokens + b * T, r->targets + b * T, (size_t)T);
    }
    return MC_OK;
}

/* ---------------------------------------------------------------- evaluation */

/* Micro-batches for the pipeline schedule: micro-batch k of the global
 * batch whose first sample is base, this data-parallel rank's share. */
typedef struct pipe_batches {
    run *r;
    mc_split split;
    int64_t base;
    int wrap;
} pipe_batches;

static mc_status pipe_batch(void *ctx, int64_t k, const int32_t **tokens, const int32_t **targets,
                            mc_error *err)
{
    pipe_batches *pb = ctx;
    run *r = pb->r;
    int64_t mbs = r->c->micro_batch_size;
    int64_t first = pb->base + k * mbs * r->dp + mc_grid_group_rank(r->g, MC_GROUP_DP) * mbs;
    mc_status st = load_batch(r, pb->split, first, pb->wrap, err);
    *tokens = r->tokens;
    *targets = r->targets;
    return st;
}

/* Before the last micro-batch's backward: the overlapped data-parallel
 * reduction may start (not with tied embeddings across stages: their
 * gradient is summed over the embedding group first). */
static void pipe_arm(void *ctx)
{
    run *r = ((pipe_batches *)ctx)->r;
    if (r->buckets && mc_model_get_config(r->model)->untie_embeddings_and_output_weights)
        mc_grad_buckets_arm(r->buckets);
}

/* Mean loss per token over eval_iters global batches of `split`, starting
 * at sample `base` (mod the split's size). */
static mc_status evaluate(run *r, mc_split split, int64_t base, double *loss, mc_error *err)
{
    const mc_train_config *c = r->c;
    int dp_rank = mc_grid_group_rank(r->g, MC_GROUP_DP);
    double acc[2] = {0, 0};
    for (int64_t e = 0; e < c->eval_iters && r->pp > 1; e++) {
        pipe_batches pb = {r, split, base + e * r->global_batch, 1};
        mc_status st = mc_pipeline_run(r->model, r->g, r->be, r->num_micro, 0, 1.0f, pipe_batch,
                                       NULL, &pb, acc, err);
        if (st) return st;
    }
    for (int64_t e = 0; e < c->eval_iters && r->pp == 1; e++)
        for (int64_t k = 0; k < r->num_micro; k++) {
            int64_t first = base + e * r->global_batch + k * c->micro_batch_size * r->dp +
                            dp_rank * c->micro_batch_size;
            mc_status st = load_batch(r, split, first, 1, err);
            double l;
            int64_t ntok;
            if (!st) st = mc_model_step(r->model, r->tokens, r->targets, 0, 1.0f, &l, &ntok, err);
            if (st) return st;
            acc[0] += l * (double)ntok;
            acc[1] += (double)ntok;
        }
    /* Over data parallelism, then from the last stage to every stage (the
     * others hold zeros: the sum is its value, exactly). */
    mc_status st = mc_allreduce_sum_f64(r->g, MC_GROUP_DP, acc, 2, err);
    if (!st) st = mc_allreduce_sum_f64(r->g, MC_GROUP_PP, acc, 2, err);
    if (st) return st;
    *loss = acc[1] > 0 ? acc[0] / acc[1] : NAN;
    return MC_OK;
}

/* Megatron's evaluate_and_print_results: the framed line, and the metrics. */
static mc_status eval_and_print(run *r, mc_split split, const char *where, int64_t base,
                                mc_error *err)
{
    if (r->c->eval_iters <= 0 || num_samples(r, split) <= 0) return MC_OK;
    double loss;
    mc_status st = mc_optim_wait_params(r->optim, err);
    if (!st) st = evaluate(r, split, base, &loss, err);
    if (st) return st;
    double ppl = exp(loss < 20 ? loss : 20);
    char line[512], dashes[520];
    int n = snprintf(line, sizeof line,
                     " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", where,
                     loss, ppl);
    int len = n + 1 < (int)sizeof dashes ? n + 1 : (int)sizeof dashes - 1;
    memset(dashes, '-', (size_t)len);
    dashes[len] = '\0';
    say(r, "%s", dashes);
    say(r, "%s", line);
    say(r, "%s", dashes);
    int test = split == MC_SPLIT_TEST;
    if (test)
        r->rep->test_loss = loss;
    else
        r->rep->valid_loss = loss;
    int64_t it = r->s.iteration;
    st = mc_metrics_scalar(r->metrics, test ? MC_TAG_TEST_LOSS : MC_TAG_VAL_LOSS, it, loss, err);
    if (!st)
        st = mc_metrics_scalar(r->metrics, test ? MC_TAG_TEST_PPL : MC_TAG_VAL_PPL, it, ppl, err);
    if (!st) st = mc_metrics_samples(r->metrics, it, r->s.consumed_samples, err);
    if (!st) st = mc_metrics_flush(r->metrics, err);
    return st;
}

/* ---------------------------------------------------------------- checkpoints */

static void *async_write(void *arg)
{
    run *r = arg;
    if (r->async.w) { /* a grid: the collective commit, over the writer's own world */
        r->async.st = mc_ckpt_writer_commit(r->async.w, &r->async.err);
        r->async.w = NULL;
    } else {
        r->async.st = mc_train_snapshot_write(r->async.snap, r->async.dir, r->async.out,
                                              sizeof r->async.out, &r->async.err);
    }
    return NULL;
}

/* --async-save: wait for the write in flight, report it. The snapshot
 * stays for the next save. */
static mc_status async_finish(run *r, mc_error *err)
{
    if (!r->async.active) return MC_OK;
    pthread_join(r->async.thread, NULL);
    r->async.active = 0;
    if (r->async.st) {
        *err = r->async.err;
        return r->async.st;
    }
    snprintf(r->rep->last_checkpoint, sizeof r->rep->last_checkpoint, "%s", r->async.out);
    say(r,
        "  successfully saved checkpoint from iteration %7" PRId64 " to %s [ t %.2fs, "
        "asynchronous ]",
        r->async.iteration, r->async.out, now_s() - r->async.t0);
    return MC_OK;
}

/* --async-save: the previous write done, a copy of the state now, written
 * on a thread while training goes on. */
static mc_status async_save(run *r, mc_error *err)
{
    const mc_train_config *c = r->c;
    mc_status st = async_finish(r, err);
    if (st) return st;
    r->async.t0 = now_s();
    r->async.iteration = r->s.iteration;
    r->async.dir = c->save;
    mc_optim *o = c->no_save_optim ? NULL : r->optim;
    if (r->g->world > 1) {
        /* the blocks stashed by the parallel writer are the snapshot */
        if ((st = mc_train_state_stage(c->save, r->g, &r->async.wg, r->be, r->model, o, &r->s,
                                       r->config_json, c->tokenizer, c->ckpt_compression,
                                       &r->async.w, err)))
            return st;
        snprintf(r->async.out, sizeof r->async.out, "%s", mc_ckpt_writer_dir(r->async.w));
    } else if ((st = mc_train_state_snapshot(r->be, r->model, o, &r->s, r->config_json,
                                             c->tokenizer, c->ckpt_compression, &r->async.snap,
                                             err))) {
        return st;
    }
    int rc = pthread_create(&r->async.thread, NULL, async_write, r);
    if (rc) {
        mc_ckpt_writer_abort(r->async.w); /* the other ranks' commits fail with it */
        r->async.w = NULL;
        return mc_error_errno(err, MC_ERR_INTERNAL, rc, "--async-save: cannot start a thread");
    }
    r->async.active = 1;
    r->last_saved = r->s.iteration;
    return MC_OK;
}

static mc_status save(run *r, mc_error *err)
{
    const mc_train_config *c = r->c;
    if (!c->save || r->last_saved == r->s.iteration) return MC_OK;
    {
        /* every parameter updated (--overlap-param-gather) before writing */
        mc_status ws = mc_optim_wait_params(r->optim, err);
        if (ws) return ws;
    }
    r->s.optim_steps = mc_optim_steps(r->optim);
    if (c->async_save && !c->init_only) return async_save(r, err);
    double t0 = now_s();
    mc_status st = mc_train_state_save(c->save, r->g, r->be, r->model,
                                       c->no_save_optim ? NULL : r->optim, &r->s, r->config_json,
                                       c->tokenizer, c->ckpt_compression, r->rep->last_checkpoint,
                                       sizeof r->rep->last_checkpoint, err);
    if (st) return st;
    r->last_saved = r->s.iteration;
    say(r, "  successfully saved checkpoint from iteration %7" PRId64 " to %s [ t %.2fs ]",
        r->s.iteration, r->rep->last_checkpoint, now_s() - t0);
    return MC_OK;
}

static mc_status load(run *r, mc_error *err)
{
    const mc_train_config *c = r->c;
    char dir[4096];
    mc_optim *o = (c->finetune || c->no_load_optim) ? NULL : r->optim;
    mc_train_state *s = c->finetune ? NULL : &r->s;
    mc_status st = mc_train_state_load(c->load, r->g, r->be, r->model, o, s, dir, sizeof dir, err);
    if (st == MC_ERR_NOTFOUND && !c->finetune) {
        /* Megatron: no checkpoint to load is not an error, so one command
         * line (--save D --load D) both starts a run and resumes it. */
        say(r, "mc-train: warning: %s; starting from random initialization", err->msg);
        mc_error_clear(err);
        return MC_OK;
    }
    if (st) return st;
    if (o) mc_optim_set_steps(r->optim, r->s.optim_steps);
    say(r, "  loaded checkpoint %s at iteration %" PRId64 "%s", dir,
        c->finetune ? 0 : r->s.iteration,
        c->finetune ? " (weights only: --finetune)"
        : o         ? ""
                    : " (no optimizer state)");
    if (s && s->fp8_missing)
        say(r, "mc-train: note: %s holds no FP8 state: the amax histories start afresh (scales 1)",
            dir);
    /* The loaded checkpoint is the last one of this run's --save
     * directory until a new one is written (nothing to train: stdout still
     * names it). */
    if (c->save && !c->finetune) {
        snprintf(r->rep->last_checkpoint, sizeof r->rep->last_checkpoint, "%s", dir);
        r->last_saved = r->s.iteration;
        size_t n = strlen(c->save);
        while (n > 1 && c->save[n - 1] == '/') n--;
        if (strncmp(dir, c->save, n) || (dir[n] != '/' && dir[n] != '\0')) {
            r->rep->last_checkpoint[0] = '\0';
            r->last_saved = -1;
        }
    }
    return MC_OK;
}

/* ---------------------------------------------------------------- set-up */

static mc_status config_json(run *r, const mc_model_config *m, mc_error *err)
{
    const mc_train_config *c = r->c;
    json_t *root = json_object();
    json_object_set_new(root, "model", mc_model_config_json(m));
    json_t *t = json_pack(
        "{s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I}",
        "micro_batch_size", (json_int_t)c->micro_batch_size, "global_batch_size",
        (json_int_t)r->global_batch, "train_iters", (json_int_t)r->train_iters, "train_samples",
        (json_int_t)c->train_samples, "lr", c->sched.lr, "min_lr", c->sched.min_lr,
        "lr_decay_style", mc_lr_decay_style_name(c->sched.decay_style), "weight_decay",
        c->sched.weight_decay, "adam_beta1", c->optim.beta1, "adam_beta2", c->optim.beta2,
        "adam_eps", c->optim.eps, "clip_grad", c->optim.clip_grad, "precision",
        c->prec == MC_PREC_BF16   ? "bf16"
        : c->prec == MC_PREC_FP16 ? "fp16"
                                  : "fp32",
        "seed", (json_int_t)c->seed, "data_parallel_size", (json_int_t)r->dp);
    json_object_set_new(root, "train", t);
    if (c->args_json) {
        json_error_t je;
        json_t *a = json_loads(c->args_json, 0, &je);
        if (a) json_object_set_new(root, "args", a);
    }
    r->config_json = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    return r->config_json ? MC_OK : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
}

/* Megatron's num_microbatches = global batch / (micro-batch x data-parallel
 * size), which must divide evenly. */
static mc_status batch_sizes(const mc_train_config *c, int64_t dp, int64_t *global_batch,
                             int64_t *num_micro, mc_error *err)
{
    int64_t per_micro = c->micro_batch_size * dp;
    *global_batch = c->global_batch_size > 0 ? c->global_batch_size : per_micro;
    if (c->micro_batch_size < 1)
        return mc_error_set(err, MC_ERR_USAGE, "--micro-batch-size must be at least 1");
    if (*global_batch % per_micro)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--global-batch-size %" PRId64 " is not a multiple of "
                            "--micro-batch-size %" PRId64 " x data-parallel size %" PRId64
                            " = %" PRId64,
                            *global_batch, c->micro_batch_size, dp, per_micro);
    *num_micro = *global_batch / per_micro;
    return MC_OK;
}

mc_status mc_train_check_grid(const mc_train_config *c, const mc_model_config *model_cfg,
                              const mc_grid *g, mc_error *err)
{
    mc_model_config m = *model_cfg;
    mc_status st = mc_model_config_finish(&m, mc_grid_group_size(g, MC_GROUP_TP), err);
    int l0, l1;
    if (!st) st = mc_model_stage_layers(&m, g->pp, g->pp_rank, &l0, &l1, err);
    if (st) return st;
    int64_t gb, nm;
    if ((st = batch_sizes(c, mc_grid_group_size(g, MC_GROUP_DP), &gb, &nm, err))) return st;
    /* Megatron's rule for the interleaved schedule */
    if (m.num_layers_per_virtual_pipeline_stage && nm % g->pp)
        return mc_error_set(err, MC_ERR_USAGE,
                            "the interleaved schedule needs the number of micro-batches (%lld) to "
                            "be a multiple of --pipeline-model-parallel-size (%d)",
                            (long long)nm, g->pp);
    return MC_OK;
}

/* Megatron's DDP bucket size: --ddp-bucket-size, else one bucket without
 * overlap and max(40M, 1M x data-parallel size) elements with it. */
static size_t bucket_elems(const mc_train_config *c, int64_t dp)
{
    if (c->ddp_bucket_size > 0) return (size_t)c->ddp_bucket_size;
    if (!c->overlap_grad_reduce) return 0;
    int64_t n = 1000000 * dp;
    return (size_t)(n > 40000000 ? n : 40000000);
}

/* The packing of each split, once, on rank 0: what users compare with
 * other packers (efficiency = conversation tokens / sample tokens). */
static void sft_report(const run *r)
{
    for (int s = 0; s < MC_SPLIT_COUNT; s++) {
        mc_sft_stats st;
        mc_sft_dataset_stats(r->sft, (mc_split)s, &st);
        if (!st.samples) continue;
        say(r,
            "sft %s: %" PRId64 " conversations, %" PRId64 " samples of %" PRId64
            " tokens over %" PRId64 " epoch(s), packing efficiency %.1f%%, %" PRId64
            " loss tokens, %" PRId64 " truncated",
            mc_split_name((mc_split)s), st.conversations, st.samples, r->T + 1, st.epochs,
            100.0 * (double)st.tokens / ((double)st.samples * (double)(r->T + 1)), st.loss_tokens,
            st.truncated);
    }
}

/* --dpo: the reference model's logp of every pair's answers, once, before
 * training: the model holds the reference's weights (--ref-load, loaded
 * over a copy of the run's weights, which come back afterwards; else the
 * weights the run starts from) and runs forward over the pairs in
 * micro-batches, data-parallel rank d taking micro-batches d, d + dp, ...;
 * the table is then summed over data parallelism (each entry is one
 * rank's, the others add exact zeros). The micro-batches are the training
 * split's first epoch in its order, then the pairs of no training sample:
 * each training pair sits where its first training step will put it, so
 * that step's policy (the reference's weights) gives the reference's bits
 * whatever the GEMM kernels do with a row's place in the batch (z = 0
 * exactly on the first iteration). */
static mc_status dpo_reference(run *r, mc_error *err)
{
    const mc_train_config *c = r->c;
    int64_t P = mc_pref_dataset_num_pairs(r->pref), mbs = c->micro_batch_size;
    int dp_rank = mc_grid_group_rank(r->g, MC_GROUP_DP);
    r->dpo_ref = calloc((size_t)(2 * P + 1), sizeof *r->dpo_ref);
    r->dpo_cur = calloc((size_t)(2 * mbs), sizeof *r->dpo_cur);
    r->dpo_seq = calloc((size_t)(2 * mbs), sizeof *r->dpo_seq);
    r->dpo_pairs = calloc((size_t)mbs, sizeof *r->dpo_pairs);
    if (!r->dpo_ref || !r->dpo_cur || !r->dpo_seq || !r->dpo_pairs)
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    double t0 = now_s();
    mc_status st = MC_OK;
    float *saved = NULL;
    size_t bytes = mc_model_numel(r->model) * sizeof(float);
    char dir[4096] = "";
    if (c->dpo.ref_load) {
        if (!(saved = mc_balloc(r->be, bytes, err))) return err->code;
        mc_bcopy(r->be, saved, mc_model_params(r->model), bytes);
        st = mc_train_state_load(c->dpo.ref_load, r->g, r->be, r->model, NULL, NULL, dir,
                                 sizeof dir, err);
        if (st) mc_error_prefix(err, "--ref-load");
    }
    int64_t *order = st ? NULL : malloc((size_t)P * sizeof *order);
    unsigned char *seen = st ? NULL : calloc((size_t)P + 1, 1);
    if (!st && (!order || !seen)) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    int64_t n = 0;
    for (int64_t i = 0; !st && n < P; i++) { /* the first epoch: each pair once */
        int64_t p = mc_pref_dataset_pair(r->pref, MC_SPLIT_TRAIN, i);
        if (p < 0 || p >= P || seen[p]) break;
        seen[p] = 1;
        order[n++] = p;
    }
    for (int64_t p = 0; !st && p < P; p++)
        if (!seen[p]) order[n++] = p;
    r->dpo_ref_pass = 1;
    for (int64_t j = dp_rank; !st && j * mbs < P; j += r->dp) {
        for (int64_t b = 0; b < mbs && !st; b++)
            st = load_pair(r, b, j * mbs + b < P ? order[j * mbs + b] : -1, err);
        double l;
        int64_t ntok;
        if (!st) st = mc_model_step(r->model, r->tokens, r->targets, 0, 1.0f, &l, &ntok, err);
    }
    r->dpo_ref_pass = 0;
    free(order);
    free(seen);
    if (saved) {
        mc_bcopy(r->be, mc_model_params(r->model), saved, bytes);
        mc_bfree(r->be, saved);
    }
    /* every rank reaches the sum, failed or not: the error is agreed after */
    st = mc_grid_status_all(r->g, st, "dpo reference", err);
    if (!st) st = mc_allreduce_sum_f64(r->g, MC_GROUP_DP, r->dpo_ref, (size_t)(2 * P), err);
    if (st) return st;
    say(r,
        "dpo: reference log-probabilities of %" PRId64 " pairs from %s [ t %.2fs ]; %" PRId64
        " pairs with an answer cut to --seq-length",
        P, c->dpo.ref_load ? dir : "the initial weights", now_s() - t0,
        mc_pref_dataset_truncated(r->pref));
    return MC_OK;
}

/* --kd-teacher: the teacher's model from its checkpoint (its own
 * architecture, the student's grid, micro-batch and sequence length). */
static mc_status load_teacher(run *r, mc_error *err)
{
    const mc_train_config *c = r->c;
    if (r->pp > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--kd-teacher: distillation under pipeline parallelism is not "
                            "implemented");
    mc_status st = mc_train_load_model(c->kd_teacher, r->g, r->be, (int)c->micro_batch_size,
                                       (int)r->T, c->prec, &r->teacher, err);
    if (st) return mc_error_prefix(err, "--kd-teacher %s", c->kd_teacher);
    const mc_model_config *tc = mc_model_get_config(r->teacher);
    const mc_model_config *sc = mc_model_get_config(r->model);
    if (tc->padded_vocab_size != sc->padded_vocab_size)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "--kd-teacher %s: the teacher's padded vocabulary of %" PRId64
                            " differs from the student's %" PRId64,
                            c->kd_teacher, tc->padded_vocab_size, sc->padded_vocab_size);
    if ((st = mc_model_set_teacher(r->model, r->teacher, c->kd_temperature, c->kd_alpha, err)))
        return mc_error_prefix(err, "--kd-teacher %s", c->kd_teacher);
    say(r,
        "distillation from %s: %d layers, hidden %d, %" PRId64
        " parameters; temperature %g, alpha %g",
        c->kd_teacher, tc->num_layers, tc->hidden_size, mc_model_global_numel(r->teacher),
        (double)c->kd_temperature, (double)c->kd_alpha);
    return MC_OK;
}

/* The test hook MC_TEST_FAULT_NAN=RANK:ITER[:inf][,RANK:ITER[:inf]...]
 * (mc-train(1), ENVIRONMENT): world rank RANK's gradient holds a NaN (an
 * Inf with ":inf") at iteration ITER (the log's 1-based number), planted
 * before the backward passes accumulate into it, so it reaches the
 * data-parallel reduction and the overflow check as a real one would. The
 * whole value is checked at the start (it == 0: only the syntax); *poison
 * is NaN or Inf for an entry naming this rank and iteration, else 0. */
static mc_status fault_nan(int rank, int64_t it, float *poison, mc_error *err)
{
    const char *spec = getenv("MC_TEST_FAULT_NAN");
    *poison = 0.0f;
    if (!spec) return MC_OK;
    for (const char *p = spec; *p;) {
        char *end;
        errno = 0;
        long long rk = strtoll(p, &end, 10);
        long long at = 0;
        int ok = end != p && *end == ':' && rk >= 0 && errno == 0;
        if (ok) {
            const char *q = end + 1;
            at = strtoll(q, &end, 10);
            ok = end != q && at >= 1 && errno == 0;
        }
        int inf = 0;
        if (ok && !strncmp(end, ":inf", 4)) {
            inf = 1;
            end += 4;
        }
        if (!ok || (*end != ',' && *end != '\0') || (*end == ',' && !end[1]))
            return mc_error_set(err, MC_ERR_USAGE,
                                "MC_TEST_FAULT_NAN: '%s' is not RANK:ITER[:inf][,RANK:ITER...]",
                                spec);
        if (rk == rank && at == it) *poison = inf ? INFINITY : NAN;
        p = *end ? end + 1 : end;
    }
    return MC_OK;
}

/* The activation block of each pipeline stage (mc_model_act_bytes), one
 * line per stage from rank 0: the figures --dry-run plans. */
static mc_status report_acts(run *r, mc_error *err)
{
    mc_act_bytes ab;
    mc_model_act_bytes(r->model, &ab);
    int64_t mine[5] = {r->g->pp_rank, (int64_t)ab.kept, (int64_t)ab.workspace, (int64_t)ab.scratch,
                       ab.slots};
    unsigned char *all = NULL;
    size_t *off = NULL;
    mc_status st = mc_grid_allgather_bytes(r->g, mine, sizeof mine, "activation bytes", &all, &off,
                                           err);
    if (st) return st;
    char rc[128];
    mc_recompute_describe(mc_model_get_config(r->model), rc, sizeof rc);
    for (int p = 0; p < r->pp; p++)
        for (int k = 0; k < r->g->world; k++) {
            int64_t v[5];
            memcpy(v, all + off[k], sizeof v);
            if (v[0] != p) continue;
            say(r,
                "activations (stage %d): %" PRId64 " bytes = %" PRId64 " x %" PRId64
                " kept + %" PRId64 " recomputation workspace + %" PRId64
                " scratch; recomputation %s",
                p, v[4] * v[1] + v[2] + v[3], v[4], v[1], v[2], v[3], rc);
            break;
        }
    free(all);
    free(off);
    return MC_OK;
}

static mc_status setup(run *r, const mc_model_config *model_cfg,
                       const struct mc_gptdata_config *data, mc_error *err)
{
    const mc_train_config *c = r->c;
    mc_status st;
    r->dp = mc_grid_group_size(r->g, MC_GROUP_DP);
    if ((st = batch_sizes(c, r->dp, &r->global_batch, &r->num_micro, err))) return st;
    if (c->init_only ? c->train_iters > 0 || c->train_samples > 0
                     : (c->train_iters > 0) == (c->train_samples > 0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "give exactly one of --train-iters and --train-samples");
    /* Megatron's update_train_iters without batch-size ramp-up. */
    r->train_iters = c->train_iters > 0 ? c->train_iters : c->train_samples / r->global_batch;
    if (!c->init_only && r->train_iters < 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--train-samples %" PRId64 " is less than one global batch of %" PRId64,
                            c->train_samples, r->global_batch);
    if (c->sched.lr < 0) return mc_error_set(err, MC_ERR_USAGE, "--lr is required");
    mc_lr_config lc = c->sched;
    lc.global_batch_size = r->global_batch;
    lc.train_iters = c->train_iters > 0 ? c->train_iters : -1;
    lc.train_samples = c->train_samples > 0 ? c->train_samples : -1;
    /* --train-iters 0 has no schedule to run (and none that is valid). */
    if (!c->init_only && (st = mc_lr_schedule_init(&r->sched, &lc, err))) return st;

    mc_model_config mcfg = *model_cfg;
    if ((st = mc_model_config_finish(&mcfg, mc_grid_group_size(r->g, MC_GROUP_TP), err))) return st;
    r->T = mcfg.seq_length;
    r->flops_per_token = mc_model_flops_per_token(&mcfg);
    r->moe_layers = mc_model_num_moe_layers(&mcfg);
    if (r->moe_layers) {
        r->moe_layer_losses = calloc(2 * (size_t)mcfg.num_layers, sizeof *r->moe_layer_losses);
        if (!r->moe_layer_losses) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    /* --dpo: a micro-batch of B pairs runs 2 B sequences */
    int per_sample = c->dpo.on ? 2 : 1;
    if ((st = mc_model_new(&mcfg, r->g, r->be, (int)c->micro_batch_size * per_sample, c->prec,
                           &r->model, err)))
        return st;
    if (c->dpo.on) mc_model_set_logp_loss(r->model, dpo_logp_loss, r);
    mc_model_init_weights(r->model, c->seed);
    /* packed documents: positions and attention restart after each eod
     * (the model), the eod's own target left out of the loss (load_batch) */
    mc_doc_resets docs = {data->eod, data->reset_position_ids, data->reset_attention_mask};
    mc_model_set_doc_resets(r->model, &docs);
    r->mask_eod = data->eod_mask_loss ? data->eod : -1;
    r->pp = mc_grid_group_size(r->g, MC_GROUP_PP);
    if (c->kd_teacher && !c->init_only && (st = load_teacher(r, err))) return st;
    if (r->pp > 1 && (st = mc_model_set_slots(
                          r->model, mc_pipeline_model_slots(r->model, r->g, r->num_micro), err)))
        return st;
    /* The distributed optimizer reduce-scatters the whole buffer after the
     * backward (its shard is cut from the whole buffer: one bucket, no
     * overlap yet, distopt.h); the plain one all-reduces in buckets. */
    if (c->use_distributed_optimizer)
        st = mc_optim_new_distributed_for_model(r->be, r->g, &c->optim, r->model,
                                                c->overlap_param_gather, &r->optim, err);
    else
        st = mc_optim_new_for_model(r->be, r->g, &c->optim, r->model, &r->optim, err);
    if (st) return st;
    /* the plain optimizer also writes the weights' GEMM form (bf16 bits,
     * or rounded fp32 where the GEMMs are emulated) as it updates them */
    size_t pw_bytes;
    mc_prec pw_prec;
    void *pw = mc_model_prepared_weights(r->model, &pw_bytes, &pw_prec);
    r->optim_prepares = mc_optim_set_prepared(r->optim, pw, pw_bytes, pw_prec);
    if (!c->use_distributed_optimizer &&
        (st = mc_grad_buckets_new(r->g, r->be, r->model, bucket_elems(c, r->dp),
                                  c->overlap_grad_reduce, &r->buckets, err)))
        return st;
    if (c->prec == MC_PREC_FP16) {
        if (c->loss_scale > 0)
            mc_loss_scaler_fixed(&r->s.scaler, c->loss_scale);
        else
            mc_loss_scaler_dynamic(&r->s.scaler, c->initial_loss_scale, c->min_loss_scale,
                                   (int)c->loss_scale_window, (int)c->hysteresis);
    } else {
        mc_loss_scaler_fixed(&r->s.scaler, 1.0);
    }
    if ((st = config_json(r, mc_model_get_config(r->model), err))) return st;
    if (c->load && (st = load(r, err))) return st;
    if (c->dpo.on && !c->dpo.ref_load && r->s.iteration > 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo resumes at iteration %" PRId64 " of %s: its weights are no "
                            "longer the reference; give the reference with --ref-load",
                            r->s.iteration, c->load);
    if (c->init_only) return MC_OK; /* nothing to train: no data, no metrics */
    /* --async-save: on a grid the writer thread's own world communicator
     * (its collectives run beside the training's); on one process the
     * snapshot's memory now, so that no save allocates */
    if (c->async_save && c->save && r->g->world > 1) {
        if ((st = mc_grid_dup_world(r->g, &r->async.wg, err)))
            return mc_error_prefix(err, "--async-save");
        r->async.has_wg = 1;
    } else if (c->async_save && c->save &&
               (st = mc_train_state_snapshot(r->be, r->model, c->no_save_optim ? NULL : r->optim,
                                             &r->s, r->config_json, c->tokenizer,
                                             c->ckpt_compression, &r->async.snap, err))) {
        return st;
    }
    float unused;
    if ((st = fault_nan(r->g->rank, 0, &unused, err))) return st;

    /* Data: as many samples as Megatron asks the dataset builder for. */
    mc_gptdata_config dc = *data;
    dc.seq_length = r->T;
    dc.seed = (uint32_t)c->seed;
    mc_gptdata_num_samples(r->train_iters, c->eval_interval, c->eval_iters, r->global_batch,
                           dc.num_samples);
    if (c->train_samples > 0) dc.num_samples[MC_SPLIT_TRAIN] = c->train_samples;
    if (c->dpo.on || dc.sft) {
        /* one prefix: the SFT or preference dataset, packed or paired */
        const char *what = c->dpo.on ? "--dpo reads one preference dataset"
                                     : "--sft reads one dataset";
        if (dc.blend.n != 1 || dc.blend.weights)
            return mc_error_set(err, MC_ERR_USAGE, "%s: give --data-path one prefix", what);
        mc_sft_config sc = {.prefix = dc.blend.prefixes[0],
                            .split = dc.split,
                            .seq_length = r->T,
                            .seed = dc.seed,
                            .eod = dc.eod};
        memcpy(sc.num_samples, dc.num_samples, sizeof sc.num_samples);
        if (c->dpo.on) {
            if ((st = mc_pref_dataset_open(&sc, &r->pref, err))) return st;
        } else {
            if ((st = mc_sft_dataset_open(&sc, &r->sft, err))) return st;
            sft_report(r);
        }
    } else if ((st = mc_gpt_dataset_open(&dc, &r->ds, err))) {
        return st;
    }
    if (num_samples(r, MC_SPLIT_TRAIN) < r->train_iters * r->global_batch)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "the training split has fewer samples than asked");

    size_t n = (size_t)(c->micro_batch_size * r->T) * (size_t)per_sample;
    r->tokens = malloc(n * sizeof *r->tokens);
    r->targets = malloc(n * sizeof *r->targets);
    r->sample = malloc((size_t)(r->T + 1) * sizeof *r->sample);
    r->mask = malloc((size_t)(r->T + 1));
    if (!r->tokens || !r->targets || !r->sample || !r->mask)
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (c->dpo.on && (st = dpo_reference(r, err))) return st;
    return mc_metrics_open(c->tensorboard_dir, c->log_json, &r->metrics, err);
}

/* ---------------------------------------------------------------- the loop */

/* What the log line averages over its interval. */
typedef struct window {
    double loss_sum, kd_sum;
    double moe_lb_sum, moe_z_sum; /* MoE: the balancing losses' sums */
    double rewards[4]; /* --dpo: sums of each iteration's rewards/chosen, rejected, accuracies,
                          margins */
    int64_t advanced, skipped, nan;
    double t0;
} window;

/* Megatron's training_log line, then mc's throughput columns. */
static mc_status log_line(run *r, window *w, double grad_norm, int show_norm, mc_error *err)
{
    const mc_train_config *c = r->c;
    int64_t n_it = w->advanced + w->skipped;
    double per_iter = n_it ? (now_s() - w->t0) / (double)n_it : 0;
    double lr = mc_lr_at_samples(&r->sched, (double)r->s.sched_samples);
    double avg = w->loss_sum / (double)(w->advanced > 0 ? w->advanced : 1);
    double tok_s = per_iter > 0 ? (double)(r->global_batch * r->T * (r->pref ? 2 : 1)) / per_iter
                                : 0;
    double tflops = tok_s * r->flops_per_token / 1e12 / (double)r->g->world;
    char ts[64], norm[64] = "", line[1024];
    stamp(ts, sizeof ts);
    if (show_norm) {
        char v[32];
        fmt_py(v, sizeof v, "%.3f", grad_norm);
        snprintf(norm, sizeof norm, " grad norm: %s |", v);
    }
    char lossv[256] = "";
    double na = (double)(w->advanced > 0 ? w->advanced : 1);
    if (r->pref)
        snprintf(lossv, sizeof lossv,
                 " loss: %.6E | rewards/chosen: %.6E | rewards/rejected: %.6E |"
                 " rewards/accuracies: %.4f | rewards/margins: %.6E |",
                 avg, w->rewards[0] / na, w->rewards[1] / na, w->rewards[2] / na,
                 w->rewards[3] / na);
    else if (avg >= 0.0) {
        int lv = snprintf(lossv, sizeof lossv, " lm loss: %.6E |", avg);
        if (r->teacher && lv > 0)
            lv += snprintf(lossv + lv, sizeof lossv - (size_t)lv, " kd loss: %.6E |",
                           w->kd_sum / na);
        /* Megatron's MoE metrics, after the losses */
        const mc_model_config *mc = mc_model_get_config(r->model);
        if (r->moe_layers && lv > 0 && mc->moe_load_balancing != MC_MOE_LB_NONE)
            lv += snprintf(lossv + lv, sizeof lossv - (size_t)lv, " %s: %.6E |",
                           mc->moe_load_balancing == MC_MOE_LB_SEQ_AUX ? "seq_load_balancing_loss"
                                                                       : "load_balancing_loss",
                           w->moe_lb_sum / na);
        if (r->moe_layers && lv > 0 && mc->moe_z_loss_coeff > 0)
            snprintf(lossv + lv, sizeof lossv - (size_t)lv, " z_loss: %.6E |", w->moe_z_sum / na);
    }
    int len = snprintf(
        line, sizeof line,
        " [%s] iteration %8" PRId64 "/%8" PRId64 " | consumed samples: %12" PRId64
        " | elapsed time per iteration (ms): %.1f | learning rate: %.6E |"
        " global batch size: %5" PRId64 " |%s loss scale: %.1f |%s"
        " number of skipped iterations: %3" PRId64 " | number of nan iterations: %3" PRId64 " |"
        " tokens/s: %.1f | TFLOP/s: %.3f |",
        ts, r->s.iteration, r->train_iters, r->s.consumed_samples, per_iter * 1e3, lr,
        r->global_batch, lossv, r->s.scaler.scale, norm, w->skipped, w->nan, tok_s, tflops);
    if (c->peak_tflops > 0 && len > 0 && (size_t)len < sizeof line)
        snprintf(line + len, sizeof line - (size_t)len, " MFU: %.1f%% |",
                 100.0 * tflops / c->peak_tflops);
    say(r, "%s", line);

    int64_t it = r->s.iteration;
    mc_status st = mc_metrics_scalar(r->metrics, MC_TAG_ITERATION_TIME, it, per_iter, err);
    if (!st) st = mc_metrics_scalar(r->metrics, MC_TAG_THROUGHPUT, it, tflops, err);
    if (!st) st = mc_metrics_scalar(r->metrics, MC_TAG_TOKENS_PER_SEC, it, tok_s, err);
    if (!st && c->peak_tflops > 0)
        st = mc_metrics_scalar(r->metrics, MC_TAG_MFU, it, tflops / c->peak_tflops, err);
    if (!st) st = mc_metrics_scalar(r->metrics, MC_TAG_SKIPPED_ITERS, it, (double)w->skipped, err);
    if (!st) st = mc_metrics_scalar(r->metrics, MC_TAG_NAN_ITERS, it, (double)w->nan, err);
    memset(w, 0, sizeof *w);
    w->t0 = now_s();
    return st;
}

/* One iteration: forward and backward over every micro-batch, then the
 * optimizer. *skipped and *nan say what happened; *grad_norm the norm. */
/* The iteration's micro-batches, forward and backward (the pipeline's
 * schedule, or one after the other): losses and token counts into acc. */
static mc_status micro_batches(run *r, float gscale, double acc[3], mc_error *err)
{
    const mc_train_config *c = r->c;
    int dp_rank = mc_grid_group_rank(r->g, MC_GROUP_DP);
    mc_status st;
    if (r->pp > 1) {
        pipe_batches pb = {r, MC_SPLIT_TRAIN, r->s.consumed_samples, 0};
        if ((st = mc_pipeline_run(r->model, r->g, r->be, r->num_micro, 1, gscale, pipe_batch,
                                  pipe_arm, &pb, acc, err)))
            return st;
    }
    for (int64_t k = 0; k < r->num_micro && r->pp == 1; k++) {
        int64_t first = r->s.consumed_samples + k * c->micro_batch_size * r->dp +
                        dp_rank * c->micro_batch_size;
        double l;
        int64_t ntok;
        if ((st = load_batch(r, MC_SPLIT_TRAIN, first, 0, err))) return st;
        /* --overlap-grad-reduce: the last backward pass starts each bucket
         * as soon as its gradients are final (Megatron reduces only after
         * the last micro-batch: no_sync on the others). */
        if (k + 1 == r->num_micro && r->buckets) mc_grad_buckets_arm(r->buckets);
        if ((st = mc_model_step(r->model, r->tokens, r->targets, 1, gscale, &l, &ntok, err)))
            return st;
        acc[0] += l * (double)ntok;
        acc[1] += (double)ntok;
        acc[2] += mc_model_kd_loss(r->model) * (double)ntok;
    }
    return MC_OK;
}

static mc_status train_step(run *r, double *lm_loss, double *kd_loss, double *grad_norm,
                            int *skipped, int *nan, int *overflow, mc_error *err)
{
    const mc_train_config *c = r->c;
    double scale = r->s.scaler.scale;
    /* Each micro-batch's loss is its token mean; the iteration's gradient
     * is the mean over micro-batches and data-parallel ranks (Megatron's
     * 1/num_microbatches in the loss and the averaging all-reduce),
     * times the loss scale. */
    float gscale = (float)(scale / (double)(r->num_micro * r->dp));
    mc_status st;
    /* --overlap-param-gather: the last step's all-gather ends here. */
    if ((st = mc_optim_wait_params(r->optim, err))) return st;
    mc_model_zero_grads(r->model);
    float poison;
    if ((st = fault_nan(r->g->rank, r->s.iteration + 1, &poison, err))) return st;
    if (poison != 0.0f) mc_bcopy_from_host(r->be, mc_model_grads(r->model), &poison, sizeof poison);
    memset(&r->dpo_sums, 0, sizeof r->dpo_sums);
    /* the loss sums and token count; [2]: the KL's sum with --kd-teacher */
    double acc[3] = {0, 0, 0};
    /* the weights stay as they are until the optimizer's step: each is
     * prepared for the GEMMs once, not once per micro-batch */
    mc_model_hold_weights(r->model, 1);
    st = micro_batches(r, gscale, acc, err);
    mc_model_hold_weights(r->model, 0);
    if (st) return st;
    /* Tied embeddings across stages: the two copies' gradients summed
     * (Megatron's _allreduce_embedding_grads), then the data-parallel sum. */
    if ((st = mc_model_allreduce_embedding_grads(r->model, err))) return st;
    st = r->buckets ? mc_grad_buckets_finish(r->buckets, err)
                    : mc_optim_reduce_grads(r->optim, err);
    if (st) return st;
    if ((st = mc_allreduce_sum_f64(r->g, MC_GROUP_DP, acc, 3, err))) return st;
    if ((st = mc_allreduce_sum_f64(r->g, MC_GROUP_PP, acc, 3, err))) return st;
    if (r->pref && (st = mc_allreduce_sum_f64(r->g, MC_GROUP_DP, &r->dpo_sums.loss,
                                              sizeof r->dpo_sums / sizeof(double), err)))
        return st;
    if (r->moe_layers) {
        /* Megatron's MoE metrics: each layer's value summed over the
         * micro-batches times 1 / num_microbatches, summed over the layers
         * (all stages) / the MoE layers, averaged over data parallelism */
        size_t L = (size_t)mc_model_get_config(r->model)->num_layers;
        double *v = r->moe_layer_losses;
        mc_model_moe_layer_losses(r->model, v, v + L);
        if ((st = mc_allreduce_sum_f64(r->g, MC_GROUP_PP, v, 2 * L, err))) return st;
        if ((st = mc_allreduce_sum_f64(r->g, MC_GROUP_DP, v, 2 * L, err))) return st;
        double d = (double)r->num_micro * (double)r->dp;
        r->moe_lb = r->moe_z = 0;
        for (size_t l = 0; l < 2 * L; l++) v[l] /= d; /* each layer's, Megatron's per-layer value */
        for (size_t l = 0; l < L; l++) r->moe_lb += v[l] / (double)r->moe_layers;
        for (size_t l = 0; l < L; l++) r->moe_z += v[L + l] / (double)r->moe_layers;
    }
    /* FP8: this step's amaxes into the histories, the next step's scales */
    if ((st = mc_model_fp8_update(r->model, err))) return st;
    *lm_loss = acc[1] > 0 ? acc[0] / acc[1] : NAN;
    *kd_loss = !r->teacher ? NAN : acc[1] > 0 ? acc[2] / acc[1] : NAN;
    *nan = 0;
    *overflow = 0;
    if (!isfinite(*lm_loss) || (r->teacher && !isfinite(*kd_loss))) {
        /* The loss itself is not finite: no update, whatever the
         * gradients (Megatron counts this as a nan iteration). */
        *skipped = *nan = 1;
        *grad_norm = NAN;
        return MC_OK;
    }
    double lr = mc_lr_at_samples(&r->sched, (double)r->s.sched_samples);
    double wd = mc_wd_at_samples(&r->sched, (double)r->s.sched_samples);
    mc_optim_result res;
    /* MoE aux-loss-free balancing: the expert biases move with the
     * iteration's token counts (Megatron: in finalize_model_grads) */
    if ((st = mc_model_moe_update_expert_bias(r->model, c->moe_per_layer_logging, err))) return st;
    if (c->moe_per_layer_logging && r->moe_layers) {
        /* the tokens per expert of every stage's layers, for the log */
        const mc_model_config *mc = mc_model_get_config(r->model);
        size_t n = (size_t)mc->num_layers * (size_t)mc->num_experts;
        const double *t = mc_model_moe_tokens_per_expert(r->model);
        if (!r->moe_tokens && !(r->moe_tokens = calloc(n, sizeof *r->moe_tokens)))
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        if (t) memcpy(r->moe_tokens, t, n * sizeof *r->moe_tokens);
        if ((st = mc_allreduce_sum_f64(r->g, MC_GROUP_PP, r->moe_tokens, n, err))) return st;
    }
    if ((st = mc_optim_step(r->optim, lr, wd, scale, &res, err))) return st;
    if (r->optim_prepares && !res.found_inf) mc_model_weights_prepared(r->model);
    *grad_norm = res.grad_norm;
    *skipped = res.found_inf;
    if (res.found_inf) {
        /* fp16: an overflow, the loss scale's business. Otherwise the
         * gradients are NaN/Inf in fp32 or bf16: a nan iteration. */
        if (c->prec == MC_PREC_FP16)
            *overflow = 1;
        else
            *nan = 1;
    }
    return MC_OK;
}

static mc_status train_loop(run *r, mc_error *err)
{
    const mc_train_config *c = r->c;
    mc_status st;
    double t_start = r->t_start;
    window w;
    memset(&w, 0, sizeof w);
    w.t0 = now_s();
    int64_t bad_in_a_row = 0;
    mc_comm_log comm = {0}; /* --log-comm: the steps' traffic only */
    r->rep->exit_reason = "train-iters";
    while (r->s.iteration < r->train_iters) {
        double loss = 0, kd = 0, norm = 0;
        int skipped = 0, nan = 0, overflow = 0;
        mc_comm_log_start(r->g);
        if ((st = train_step(r, &loss, &kd, &norm, &skipped, &nan, &overflow, err))) return st;
        mc_comm_log_end(&comm, r->g);
        int at_min = r->s.scaler.scale <= r->s.scaler.min_scale;
        mc_loss_scaler_update(&r->s.scaler, skipped);
        if (!skipped) r->s.sched_samples += r->global_batch;
        r->s.iteration++;
        r->s.consumed_samples += r->global_batch;
        int64_t it = r->s.iteration;
        r->rep->iteration = it;
        r->rep->consumed_samples = r->s.consumed_samples;
        r->rep->last_lm_loss = loss;
        r->rep->last_kd_loss = kd;
        if (skipped) {
            w.skipped++;
            r->rep->skipped_iters++;
        } else {
            w.advanced++;
            w.loss_sum += loss;
            if (r->pref) {
                const mc_dpo_sums *d = &r->dpo_sums;
                double n = d->pairs > 0 ? d->pairs : 1;
                w.rewards[0] += d->chosen / n;
                w.rewards[1] += d->rejected / n;
                w.rewards[2] += d->accuracies / n;
                w.rewards[3] += d->margins / n;
            }
            if (r->teacher) w.kd_sum += kd;
            w.moe_lb_sum += r->moe_lb;
            w.moe_z_sum += r->moe_z;
        }
        if (nan) {
            w.nan++;
            r->rep->nan_iters++;
        }
        /* NaN/Inf in a row, and in fp16 overflows at the smallest scale,
         * which no amount of backing off will cure. */
        bad_in_a_row = (nan || (overflow && at_min)) ? bad_in_a_row + 1 : 0;
        if (nan) {
            char nv[32];
            fmt_py(nv, sizeof nv, "%.3f", norm);
            say(r,
                "mc-train: warning: iteration %" PRId64 ": %s is not finite (lm loss %s, grad "
                "norm %s); update skipped (%" PRId64 " in a row, --max-nan-iters %" PRId64 ")",
                it, isfinite(loss) ? "the gradient" : "the loss",
                isnan(loss)   ? "nan"
                : isinf(loss) ? "inf"
                              : "finite",
                nv, bad_in_a_row, c->max_nan_iters);
        }
        if (bad_in_a_row >= c->max_nan_iters)
            return mc_error_set(
                err, MC_ERR_LIMIT,
                "iteration %" PRId64 ": %" PRId64 " iterations in a row with NaN/Inf "
                "loss or gradients (--max-nan-iters %" PRId64 "); lower --lr or check the data",
                it, bad_in_a_row, c->max_nan_iters);

        /* Every iteration's scalars (Megatron's tensorboard_log_interval 1). */
        double lr_now = mc_lr_at_samples(&r->sched, (double)r->s.sched_samples);
        if (r->pref) {
            /* TRL's names: the iteration's means over its pairs */
            const mc_dpo_sums *d = &r->dpo_sums;
            double n = d->pairs > 0 ? d->pairs : 1;
            st = mc_metrics_scalar(r->metrics, MC_TAG_DPO_LOSS, it, loss, err);
            if (!st)
                st = mc_metrics_scalar(r->metrics, MC_TAG_REWARDS_CHOSEN, it, d->chosen / n, err);
            if (!st)
                st = mc_metrics_scalar(r->metrics, MC_TAG_REWARDS_REJECTED, it, d->rejected / n,
                                       err);
            if (!st)
                st = mc_metrics_scalar(r->metrics, MC_TAG_REWARDS_ACCURACIES, it, d->accuracies / n,
                                       err);
            if (!st)
                st = mc_metrics_scalar(r->metrics, MC_TAG_REWARDS_MARGINS, it, d->margins / n, err);
        } else {
            st = mc_metrics_scalar(r->metrics, MC_TAG_LM_LOSS, it, loss, err);
            if (!st && r->teacher) st = mc_metrics_scalar(r->metrics, MC_TAG_KD_LOSS, it, kd, err);
            const mc_model_config *mc = mc_model_get_config(r->model);
            if (!st && r->moe_layers && mc->moe_load_balancing != MC_MOE_LB_NONE)
                st = mc_metrics_scalar(r->metrics,
                                       mc->moe_load_balancing == MC_MOE_LB_SEQ_AUX
                                           ? MC_TAG_MOE_SEQ_LB_LOSS
                                           : MC_TAG_MOE_LB_LOSS,
                                       it, r->moe_lb, err);
            if (!st && r->moe_layers && mc->moe_z_loss_coeff > 0)
                st = mc_metrics_scalar(r->metrics, MC_TAG_MOE_Z_LOSS, it, r->moe_z, err);
            /* --moe-per-layer-logging: Megatron's moe/<name>_layer_<i>, every layer */
            for (int l = 0; !st && c->moe_per_layer_logging && r->moe_layers && l < mc->num_layers;
                 l++) {
                char tag[96];
                if (mc->moe_load_balancing != MC_MOE_LB_NONE) {
                    snprintf(tag, sizeof tag, "moe/%s_layer_%d",
                             mc->moe_load_balancing == MC_MOE_LB_SEQ_AUX ? MC_TAG_MOE_SEQ_LB_LOSS
                                                                         : MC_TAG_MOE_LB_LOSS,
                             l);
                    st = mc_metrics_scalar(r->metrics, tag, it, r->moe_layer_losses[l], err);
                }
                if (!st && mc->moe_z_loss_coeff > 0) {
                    snprintf(tag, sizeof tag, "moe/%s_layer_%d", MC_TAG_MOE_Z_LOSS, l);
                    st = mc_metrics_scalar(r->metrics, tag, it,
                                           r->moe_layer_losses[mc->num_layers + l], err);
                }
                /* the tokens each expert received in the iteration, summed
                 * over data (and expert) parallelism */
                for (int e = 0;
                     !st && r->moe_tokens && mc_model_layer_is_moe(mc, l) && e < mc->num_experts;
                     e++) {
                    snprintf(tag, sizeof tag, "moe/tokens_per_expert_layer_%d_expert_%d", l, e);
                    st = mc_metrics_scalar(r->metrics, tag, it,
                                           r->moe_tokens[(size_t)l * mc->num_experts + e], err);
                }
            }
        }
        if (!st) st = mc_metrics_scalar(r->metrics, MC_TAG_LEARNING_RATE, it, lr_now, err);
        if (!st)
            st = mc_metrics_scalar(r->metrics, MC_TAG_BATCH_SIZE, it, (double)r->global_batch, err);
        if (!st) st = mc_metrics_scalar(r->metrics, MC_TAG_LOSS_SCALE, it, r->s.scaler.scale, err);
        if (!st && !overflow) st = mc_metrics_scalar(r->metrics, MC_TAG_GRAD_NORM, it, norm, err);
        if (!st) st = mc_metrics_samples(r->metrics, it, r->s.consumed_samples, err);
        if (!st && it % c->log_interval == 0) st = log_line(r, &w, norm, !overflow, err);
        if (!st && c->log_comm && it % c->log_interval == 0)
            st = mc_comm_log_emit(&comm, r->g, r->metrics, it, c->print, c->print_ctx, err);
        if (!st) st = mc_metrics_flush(r->metrics, err);
        if (st) return st;

        /* Evaluation: the interval timer stops while it runs. */
        if (c->eval_iters > 0 && c->eval_interval > 0 && it % c->eval_interval == 0) {
            double t0 = now_s();
            char where[64];
            snprintf(where, sizeof where, "iteration %" PRId64, it);
            int64_t base = (it / c->eval_interval - 1) * c->eval_iters * r->global_batch;
            if ((st = eval_and_print(r, MC_SPLIT_VALID, where, base, err))) return st;
            w.t0 += now_s() - t0;
        }

        /* Megatron's checkpoint_and_decide_exit, in its order. A signal to
         * any rank, or any rank's clock past --exit-duration-in-mins, stops
         * every rank after this same iteration (Megatron all-gathers the
         * signal flags and all-reduces the duration flag with MAX). */
        double t0 = now_s();
        double quit[2] = {c->stop && *c->stop ? 1.0 : 0.0,
                          c->exit_duration_in_mins > 0 &&
                                  (now_s() - t_start) / 60.0 > c->exit_duration_in_mins
                              ? 1.0
                              : 0.0};
        if ((st = mc_allreduce_sum_f64(r->g, MC_GROUP_WORLD, quit, 2, err))) return st;
        if (quit[0] > 0) {
            if ((st = save(r, err))) return st;
            say(r, "mc-train: exiting after iteration %" PRId64 " on a signal", it);
            r->rep->exit_reason = "signal";
            return MC_OK;
        }
        if (c->save_interval > 0 && it % c->save_interval == 0 && (st = save(r, err))) return st;
        if (quit[1] > 0) {
            if ((st = save(r, err))) return st;
            say(r, "mc-train: exiting after %.2f minutes (--exit-duration-in-mins)",
                (now_s() - t_start) / 60.0);
            r->rep->exit_reason = "exit-duration";
            return MC_OK;
        }
        if (c->exit_interval > 0 && it % c->exit_interval == 0) {
            if ((st = save(r, err))) return st;
            say(r, "mc-train: exiting at iteration %" PRId64 " (--exit-interval)", it);
            r->rep->exit_reason = "exit-interval";
            return MC_OK;
        }
        w.t0 += now_s() - t0;
    }

    /* The end of training: save, then validation and test as Megatron's
     * pretrain() does after train(). */
    if ((st = save(r, err))) return st;
    int64_t it = r->s.iteration;
    char where[96];
    if (c->eval_iters > 0 && (c->eval_interval <= 0 || it % c->eval_interval != 0)) {
        snprintf(where, sizeof where, "iteration %" PRId64 " on validation set", it);
        int64_t base = (c->eval_interval > 0 ? it / c->eval_interval : 0) * c->eval_iters *
                       r->global_batch;
        if ((st = eval_and_print(r, MC_SPLIT_VALID, where, base, err))) return st;
    }
    snprintf(where, sizeof where, "iteration %" PRId64 " on test set", it);
    return eval_and_print(r, MC_SPLIT_TEST, where, 0, err);
}

mc_status mc_train_run(const mc_train_config *c, const mc_model_config *model_cfg,
                       const struct mc_gptdata_config *data, mc_backend *be, const mc_grid *g,
                       mc_train_report *report, mc_error *err)
{
    run r;
    memset(&r, 0, sizeof r);
    memset(report, 0, sizeof *report);
    report->valid_loss = report->test_loss = report->last_lm_loss = report->last_kd_loss = NAN;
    r.c = c;
    r.be = be;
    r.g = g;
    r.rep = report;
    r.last_saved = -1;
    r.t_start = now_s();
    mc_status st = setup(&r, model_cfg, data, err);
    if (!st && !c->init_only) st = report_acts(&r, err);
    if (!st) {
        report->iteration = r.s.iteration;
        report->consumed_samples = r.s.consumed_samples;
        st = c->init_only ? save(&r, err) : train_loop(&r, err);
    }
    /* --async-save: the last write is waited for, whatever ended the run */
    mc_error aerr;
    mc_status ast = async_finish(&r, st ? &aerr : err);
    if (!st) st = ast;
    mc_train_snapshot_free(r.async.snap);
    if (r.async.has_wg) mc_grid_free_dup(&r.async.wg);
    mc_error cerr;
    mc_status cst = mc_metrics_close(r.metrics, &cerr);
    if (!st && cst) {
        *err = cerr;
        st = cst;
    }
    free(r.tokens);
    free(r.targets);
    free(r.sample);
    free(r.mask);
    free(r.config_json);
    free(r.moe_layer_losses);
    free(r.moe_tokens);
    mc_gpt_dataset_close(r.ds);
    mc_sft_dataset_close(r.sft);
    mc_pref_dataset_close(r.pref);
    free(r.dpo_ref);
    free(r.dpo_cur);
    free(r.dpo_seq);
    free(r.dpo_pairs);
    mc_grad_buckets_free(r.buckets);
    mc_optim_free(r.optim);
    mc_model_free(r.model);
    mc_model_free(r.teacher);
    return st;
}
