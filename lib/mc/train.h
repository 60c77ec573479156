/*
 * train.h - the trainer: AdamW with Megatron's gradient clipping and fp16
 * loss scaling (lib/train/optim.c; mc_optim_step, mc_optim_free and the
 * moments, which depend on the optimizer's kind, in lib/train/distopt.c,
 * which adds the distributed optimizer of mc/distopt.h to it), and the
 * training loop that drives the model over the GPT dataset with gradient
 * accumulation, evaluation, logging, checkpoints and clean exits
 * (lib/train/loop.c).
 *
 * The semantics follow Megatron-LM's training.py and megatron/core/optimizer
 * (names of the options in comments); where mc differs, mc-train(1) says so.
 */
#ifndef MC_TRAIN_H
#define MC_TRAIN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "mc/comm.h"
#include "mc/kern.h"
#include "mc/model.h"
#include "mc/schedule.h"
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ loss scaling */

/* Megatron's ConstantGradScaler (--loss-scale) and DynamicGradScaler
 * (--initial-loss-scale, --min-loss-scale, --loss-scale-window,
 * --hysteresis; growth 2, backoff 0.5). Used with --fp16 only; in fp32 and
 * bf16 the scale is 1 and never changes. */
typedef struct mc_loss_scaler {
    int dynamic;
    double scale;
    double min_scale;
    int window;     /* growth interval: clean steps before doubling */
    int hysteresis; /* overflows in a row before halving */
    double growth_factor, backoff_factor;
    int growth_tracker;     /* clean steps since the last change */
    int hysteresis_tracker; /* overflows still tolerated */
} mc_loss_scaler;

void mc_loss_scaler_fixed(mc_loss_scaler *s, double scale);
void mc_loss_scaler_dynamic(mc_loss_scaler *s, double initial, double min_scale, int window,
                            int hysteresis);
/* After each iteration: found_inf says the gradients overflowed. */
void mc_loss_scaler_update(mc_loss_scaler *s, int found_inf);

/* ------------------------------------------------------------ optimizer */

typedef struct mc_optim_config {
    double weight_decay; /* --weight-decay (0.01); none on no_weight_decay params */
    double beta1, beta2; /* --adam-beta1 (0.9), --adam-beta2 (0.999) */
    double eps;          /* --adam-eps (1e-8) */
    double clip_grad;    /* --clip-grad (1.0); 0 turns clipping off */
} mc_optim_config;

void mc_optim_config_init(mc_optim_config *c);

typedef struct mc_optim mc_optim;

/* AdamW over a model's contiguous parameter and gradient buffers (numel
 * floats of backend memory each); ps[0..nps) describe the parameters in
 * the buffer (offset, numel, no_weight_decay, split_dim). The moments are
 * allocated on the backend, zero. */
mc_status mc_optim_new(mc_backend *be, const mc_grid *g, const mc_optim_config *c, float *params,
                       float *grads, size_t numel, const mc_param *ps, size_t nps, mc_optim **out,
                       mc_error *err);
/* The same for every parameter of a model. */
mc_status mc_optim_new_for_model(mc_backend *be, const mc_grid *g, const mc_optim_config *c,
                                 mc_model *m, mc_optim **out, mc_error *err);
void mc_optim_free(mc_optim *o);

typedef struct mc_optim_result {
    double grad_norm;  /* global L2 norm of the unscaled gradients (NaN/Inf when not finite) */
    double clip_coeff; /* factor applied for --clip-grad (1 when not clipped) */
    int found_inf;     /* some gradient was NaN or Inf: nothing was updated */
} mc_optim_result;

/* One optimizer step. The gradients hold loss_scale times the true
 * gradient (1 outside fp16): the norm is computed over the model-parallel
 * group on unscaled values (parameters replicated over tensor parallelism
 * counted once, as Megatron does), then, when every gradient is finite,
 * clipped to --clip-grad (clip_coeff = clip / (norm + 1e-6) when below 1)
 * and applied with AdamW at learning rate lr and decoupled weight decay
 * weight_decay (on the parameters without no_weight_decay); the step count
 * advances.
 * When some gradient is not finite the parameters, moments and step count
 * are left untouched and result->found_inf is set. */
mc_status mc_optim_step(mc_optim *o, double lr, double weight_decay, double loss_scale,
                        mc_optim_result *result, mc_error *err);

/* Have each update also write the parameters' form for the GEMMs of
 * precision prec into pw (laid out as the parameter buffer, pw_bytes an
 * element: mc_model_prepared_weights), in the same pass. Returns 1 when it
 * will (the plain optimizer), 0 when it will not (the distributed one). */
int mc_optim_set_prepared(mc_optim *o, void *pw, size_t pw_bytes, mc_prec prec);

/* Adam's first and second moments, laid out as the parameter buffer
 * (param i at ps[i].offset); backend memory, for checkpoints. */
float *mc_optim_exp_avg(mc_optim *o);
float *mc_optim_exp_avg_sq(mc_optim *o);
size_t mc_optim_numel(const mc_optim *o);
/* Successful steps so far (Adam's bias-correction step count). */
int64_t mc_optim_steps(const mc_optim *o);
void mc_optim_set_steps(mc_optim *o, int64_t steps);

/* ------------------------------------------------------------ training run */

/* Direct preference optimization (mc-train --dpo; TRL's DPOTrainer names and
 * defaults). Per pair, with logp the sum of the answer's token
 * log-probabilities and ref the reference model's:
 *   delta = (logp_c - ref_c) - (logp_r - ref_r),  z = beta delta
 *   sigmoid: -(1 - ls) log sigmoid(z) - ls log sigmoid(-z)   (ls: label smoothing)
 *   ipo:     (delta' - 1 / (2 beta))^2, delta' with each side's log-ratio divided
 *            by its number of answer tokens (TRL's normalization)
 *   hinge:   max(0, 1 - z)
 * the loss of a micro-batch being the mean over its pairs. */
typedef enum mc_dpo_loss { MC_DPO_SIGMOID = 0, MC_DPO_IPO = 1, MC_DPO_HINGE = 2 } mc_dpo_loss;

typedef struct mc_dpo_config {
    int on;                 /* --dpo: the data is preference pairs (mc/sft.h) */
    double beta;            /* --dpo-beta (0.1) */
    mc_dpo_loss loss_type;  /* --dpo-loss-type (sigmoid) */
    double label_smoothing; /* --dpo-label-smoothing (0), sigmoid only */
    const char *ref_load;   /* --ref-load: the reference; NULL: the initial weights */
} mc_dpo_config;

/* Everything mc_train_run needs besides the model and the data: Megatron's
 * training, learning-rate, mixed-precision, logging and checkpointing
 * arguments (flag names in comments, Megatron's defaults from
 * mc_train_config_init). */
typedef struct mc_train_config {
    /* batches and length of the run */
    int64_t micro_batch_size;  /* --micro-batch-size (1) */
    int64_t global_batch_size; /* --global-batch-size (0: micro-batch x data-parallel size) */
    int64_t train_iters;       /* --train-iters; exactly one of these two is > 0 */
    int64_t train_samples;     /* --train-samples */
    /* --train-iters 0: build and initialize the model (load --load when
     * given), save it with --save as it stands (a fresh model: iteration 0,
     * zero Adam moments) and train nothing; train_iters and train_samples
     * stay 0, and no data is opened. */
    int init_only;
    /* learning rate and weight-decay schedule (lib/mc/schedule.h): --lr
     * (required: < 0 until given), --min-lr, --lr-decay-style, ...; its
     * batch and length fields are filled in from the ones above */
    mc_lr_config sched;
    /* Adam and clipping; optim.weight_decay is ignored: the schedule gives
     * the weight decay of each step */
    mc_optim_config optim;
    /* precision */
    mc_prec prec;              /* --bf16, --fp16 (GEMM precision; master weights stay fp32) */
    double loss_scale;         /* --loss-scale (0: dynamic, fp16 only) */
    double initial_loss_scale; /* --initial-loss-scale (2^32) */
    double min_loss_scale;     /* --min-loss-scale (1) */
    int64_t loss_scale_window; /* --loss-scale-window (1000) */
    int64_t hysteresis;        /* --hysteresis (2) */
    int64_t max_nan_iters; /* --max-nan-iters (10): NaN/Inf iterations in a row before failing */
    /* evaluation and logging */
    int64_t eval_interval;       /* --eval-interval (1000) */
    int64_t eval_iters;          /* --eval-iters (100; 0 turns evaluation off) */
    int64_t log_interval;        /* --log-interval (100) */
    int log_comm;                /* --log-comm: traffic per group after the log line */
    const char *tensorboard_dir; /* --tensorboard-dir */
    const char *log_json;        /* --log-json */
    int moe_per_layer_logging;   /* --moe-per-layer-logging */
    double peak_tflops;          /* --peak-tflops (0: no MFU) */
    /* checkpoints */
    const char *save;                 /* --save DIR */
    const char *load;                 /* --load DIR */
    int64_t save_interval;            /* --save-interval (0: only at the end) */
    int finetune;                     /* --finetune: weights only, iteration 0 */
    int no_load_optim, no_save_optim; /* --no-load-optim, --no-save-optim */
    int ckpt_compression;             /* an mc_ckpt_compression (--ckpt-compression) */
    int async_save; /* --async-save: written from a snapshot on a thread */
    /* exits */
    int64_t exit_interval;        /* --exit-interval (0: off) */
    double exit_duration_in_mins; /* --exit-duration-in-mins (0: off) */
    uint64_t seed;                /* --seed (1234): initialization and data order */
    /* Set asynchronously (a SIGTERM/SIGINT handler) to finish the current
     * iteration, save a checkpoint and return (Megatron's
     * --exit-signal-handler). May be NULL. */
    volatile sig_atomic_t *stop;
    /* Where log lines go (the caller prints them; library code never does):
     * Megatron's iteration line, validation lines, warnings. */
    void (*print)(void *ctx, const char *line);
    void *print_ctx;
    /* The command line as a JSON object, stored in checkpoints beside the
     * model configuration (may be NULL). */
    const char *args_json;
    /* The tokenizer the data was made with, stored in every checkpoint so
     * mc-eval and mc-export need nothing else (NULL: none stored). */
    const struct mc_tokenizer_spec *tokenizer;
    /* data parallelism (issue 4): --use-distributed-optimizer,
     * --overlap-grad-reduce, --overlap-param-gather, and --ddp-bucket-size
     * (elements per gradient bucket; 0: Megatron's default, one bucket
     * without overlap, max(40M, 1M x data-parallel size) with it) */
    int use_distributed_optimizer;
    int overlap_grad_reduce;
    int overlap_param_gather;
    int64_t ddp_bucket_size;
    /* --dpo and its options (the data path names a preference dataset) */
    mc_dpo_config dpo;
    /* knowledge distillation (issue 15; mc_model_set_teacher): the frozen
     * teacher's checkpoint (--kd-teacher; NULL: none), loaded on the run's
     * grid beside the student and never saved; --kd-temperature (1) and
     * --kd-alpha (0.5): loss = (1 - alpha) CE + alpha temperature^2 KL */
    const char *kd_teacher;
    float kd_temperature;
    float kd_alpha;
} mc_train_config;

void mc_train_config_init(mc_train_config *c);

/* How a run ended. */
typedef struct mc_train_report {
    int64_t iteration; /* the last iteration completed */
    int64_t consumed_samples;
    int64_t skipped_iters, nan_iters; /* over the whole run */
    char last_checkpoint[4096];       /* directory of the last checkpoint written, "" if none */
    double last_lm_loss;              /* the last iteration's training loss */
    double last_kd_loss;              /* and its distillation KL (NaN without --kd-teacher) */
    double valid_loss, test_loss;     /* last evaluations (NaN when none ran) */
    const char *exit_reason; /* "train-iters", "signal", "exit-interval", "exit-duration" */
} mc_train_report;

struct mc_gptdata_config;

/* Train: build the model (model_cfg, finished here against the grid) and
 * its optimizer on be, open the data (data->num_samples and seq_length are
 * filled in here from the run's length), load --load when given, and run
 * the loop until train_iters, a signal, --exit-interval or
 * --exit-duration-in-mins. Errors: bad configuration (MC_ERR_USAGE), data,
 * checkpoint (naming the tensor and both shapes), and NaN/Inf iterations
 * beyond max_nan_iters in a row. */
mc_status mc_train_run(const mc_train_config *c, const mc_model_config *model_cfg,
                       const struct mc_gptdata_config *data, mc_backend *be, const mc_grid *g,
                       mc_train_report *report, mc_error *err);

/* The checks mc_train_run makes of the grid against the model and the
 * batch sizes, on their own: a tensor-parallel size that does not divide
 * the heads, query groups or FFN size (the numbers in the message), a
 * global batch that is not a multiple of micro-batch x data-parallel size.
 * No communication, and the same answer on every rank of a grid whose
 * ranks agree on the configuration, so the launcher can refuse a grid
 * before any work with one message. */
mc_status mc_train_check_grid(const mc_train_config *c, const mc_model_config *model_cfg,
                              const mc_grid *g, mc_error *err);

/* Build a model from a checkpoint (any checkpoint path mc_ckpt_open takes)
 * for evaluation or export: its stored configuration, seq_length replaced
 * when > 0, micro-batches of micro_batch sequences, GEMMs in prec, weights
 * loaded as the grid g needs them (NULL: one process; collective over g's
 * world otherwise, every rank getting the same status). */
mc_status mc_train_load_model(const char *path, const mc_grid *g, mc_backend *be, int micro_batch,
                              int seq_length, mc_prec prec, mc_model **out, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
