/*
 * metrics.h - training metrics to TensorBoard event files and JSON lines
 * (mc-train's --tensorboard-dir and --log-json).
 *
 * The trainer hands over named scalars for an iteration; mc_metrics buffers
 * them and mc_metrics_flush writes them, grouped by step:
 *
 *  - TensorBoard: DIR/events.out.tfevents.<unix time>.<hostname>.<pid>.<n>
 *    (TensorBoard's own naming; n counts up from 0 until the name is free),
 *    TFRecord-framed `Event` protobufs that TensorBoard's EventAccumulator
 *    reads with no TensorFlow: a first record with file_version
 *    "brain.Event:2", then one Event per step holding every scalar of that
 *    step as a float32 simple_value. A resumed run starts a new file in the
 *    same directory, as TensorFlow does; TensorBoard joins them and drops the
 *    steps that a restart repeats. Byte layout: lib/fmt/tfevents.c.
 *  - JSON lines: one object per step, appended to the file (a resumed run
 *    continues it), written with one write() per line:
 *        {"step": 10, "consumed-samples": 80, "lm loss": 5.43, ...}
 *    Values are printed with the fewest digits that read back as the same
 *    double (so exactly); NaN and infinities, which JSON cannot spell, are
 *    null. After a restart a step may appear twice: the later line wins.
 *
 * The data is handed to the kernel (write()) at every flush, so TensorBoard
 * sees it while training runs; the event file is fsynced at most every
 * MC_METRICS_SYNC_SECONDS and at close. In a multi-rank job exactly one rank
 * (Megatron: the last) owns an mc_metrics.
 *
 * Tags are Megatron's TensorBoard tags (megatron/training/training.py,
 * training_log and evaluate_and_print_results), so existing dashboards work;
 * the list below is every tag mc-train writes.
 */
#ifndef MC_METRICS_H
#define MC_METRICS_H

#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Megatron's tags. "iteration-time" is in seconds, "throughput" in TFLOP/s
 * per GPU (Megatron's num_floating_point_operations / time / world size). */
#define MC_TAG_LM_LOSS "lm loss"
#define MC_TAG_LEARNING_RATE "learning-rate"
#define MC_TAG_BATCH_SIZE "batch-size"
#define MC_TAG_LOSS_SCALE "loss-scale"
#define MC_TAG_WORLD_SIZE "world-size"
#define MC_TAG_GRAD_NORM "grad-norm"
#define MC_TAG_NUM_ZEROS "num-zeros"
#define MC_TAG_PARAMS_NORM "params-norm"
#define MC_TAG_ITERATION_TIME "iteration-time"
#define MC_TAG_THROUGHPUT "throughput"
#define MC_TAG_VAL_LOSS "lm loss validation"
#define MC_TAG_VAL_PPL "lm loss validation ppl"
/* mc's additions. Megatron writes its end-of-training test evaluation under
 * the validation tags, where it collides with the last validation point; mc
 * gives the test split tags of its own. */
#define MC_TAG_TEST_LOSS "lm loss test"
#define MC_TAG_TEST_PPL "lm loss test ppl"
#define MC_TAG_TOKENS_PER_SEC "tokens-per-sec"
#define MC_TAG_MFU "mfu" /* fraction of peak, 0..1 */
#define MC_TAG_SKIPPED_ITERS "skipped-iterations"
#define MC_TAG_NAN_ITERS "nan-iterations"
/* mc-train --dpo: TRL's names (the loss in place of "lm loss") */
#define MC_TAG_DPO_LOSS "loss"
#define MC_TAG_REWARDS_CHOSEN "rewards/chosen"
#define MC_TAG_REWARDS_REJECTED "rewards/rejected"
#define MC_TAG_REWARDS_ACCURACIES "rewards/accuracies"
#define MC_TAG_REWARDS_MARGINS "rewards/margins"
#define MC_TAG_KD_LOSS "kd loss" /* --kd-teacher: the KL term, unscaled */
/* MoE (--num-experts): Megatron's balancing losses, without their
 * coefficients, averaged over the MoE layers */
#define MC_TAG_MOE_LB_LOSS "load_balancing_loss"
#define MC_TAG_MOE_SEQ_LB_LOSS "seq_load_balancing_loss"
#define MC_TAG_MOE_Z_LOSS "z_loss"

/* When mc_metrics_samples gave a step its consumed-sample count, each of
 * that step's scalars is also written to TensorBoard as "TAG vs samples"
 * with the sample count as its step, as Megatron does; except the timing
 * tags (iteration-time, throughput, tokens-per-sec, mfu), which Megatron
 * does not mirror either. */
#define MC_METRICS_VS_SAMPLES " vs samples"

#define MC_METRICS_SYNC_SECONDS 30.0

typedef struct mc_metrics mc_metrics;

/* Open the writers: tb_dir (created with its parents when missing) and/or
 * json_path (its directory must exist; the file is created or appended to).
 * Either may be NULL; with both NULL every call is a cheap no-op. */
mc_status mc_metrics_open(const char *tb_dir, const char *json_path, mc_metrics **out,
                          mc_error *err);

/* Buffer one scalar of one step. Giving the same tag twice for a step is a
 * usage error (MC_ERR_USAGE); an empty tag too. */
mc_status mc_metrics_scalar(mc_metrics *m, const char *tag, int64_t step, double value,
                            mc_error *err);

/* Record the consumed samples at a step (JSON "consumed-samples", TensorBoard
 * "TAG vs samples"). Optional. */
mc_status mc_metrics_samples(mc_metrics *m, int64_t step, int64_t consumed_samples, mc_error *err);

/* Write everything buffered, one TensorBoard event and one JSON line per
 * step, steps in the order they were first given; then empty the buffer. */
mc_status mc_metrics_flush(mc_metrics *m, mc_error *err);

/* Path of the event file being written, or NULL without a TensorBoard dir. */
const char *mc_metrics_tb_path(const mc_metrics *m);

/* Flush, fsync and free. Returns the first error met; m is freed anyway.
 * NULL is allowed. */
mc_status mc_metrics_close(mc_metrics *m, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
