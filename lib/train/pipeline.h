/*
 * pipeline.h - private to lib/train: the pipeline-parallel schedules over
 * the model's stage-wise execution (mc_model_forward/backward), as
 * Megatron's megatron/core/pipeline_parallel/schedules.py
 * (lib/train/pipeline.c).
 */
#ifndef MC_TRAIN_PIPELINE_H
#define MC_TRAIN_PIPELINE_H

#include <stdint.h>
#include "mc/comm.h"
#include "mc/model.h"
#include "mc/status.h"

/* Micro-batch k's host tokens and targets (valid until the next call). */
typedef mc_status (*mc_pipe_batch_fn)(void *ctx, int64_t k, const int32_t **tokens,
                                      const int32_t **targets, mc_error *err);
/* Called just before the backward pass of the last micro-batch (to arm the
 * overlapped data-parallel reduction). */
typedef void (*mc_pipe_last_fn)(void *ctx);

/* Activation slots a stage needs for num_micro micro-batches in flight
 * under 1F1B: min(pp - pp_rank, num_micro). */
int mc_pipeline_slots(const mc_grid *g, int64_t num_micro);
/* The slots the model needs for training: mc_pipeline_slots with one chunk,
 * the most micro-batches in flight under the interleaved schedule with
 * several (lib/train/pipeline.c). */
int mc_pipeline_model_slots(const mc_model *m, const mc_grid *g, int64_t num_micro);

/* One iteration's micro-batches through the stages. backward set: Megatron's
 * forward_backward_pipelining_without_interleaving (1F1B: pp - rank - 1
 * warm-up forwards, then one forward and one backward alternately, then the
 * remaining backwards), the model holding mc_pipeline_slots slots;
 * backward 0: forwards only (evaluation), slot 0. acc[0] += loss x tokens
 * and acc[1] += tokens of every micro-batch on the last stage (nothing on
 * the others). last may be NULL. With several model chunks
 * (mc_model_num_chunks): Megatron's interleaved schedule (pipeline.c),
 * num_micro a multiple of pp, last not called (the data-parallel
 * reduction runs after it). */
mc_status mc_pipeline_run(mc_model *m, const mc_grid *g, mc_backend *be, int64_t num_micro,
                          int backward, float grad_scale, mc_pipe_batch_fn batch,
                          mc_pipe_last_fn last, void *ctx, double acc[2], mc_error *err);

#endif
