/*
 * state.h - private to lib/train: what a training checkpoint holds beyond
 * the tensors (iteration, samples, optimizer and loss-scaler state) and the
 * calls that write and read a whole training state through ckpt.h.
 */
#ifndef MC_TRAIN_STATE_H
#define MC_TRAIN_STATE_H

#include <stdint.h>
#include "mc/ckpt.h"
#include "mc/model.h"
#include "mc/status.h"
#include "mc/tokenizer.h"
#include "mc/train.h"

typedef struct mc_train_state {
    int64_t iteration;        /* iterations completed */
    int64_t consumed_samples; /* training samples consumed (skipped iterations too) */
    int64_t sched_samples;    /* samples of successful updates: the LR schedule's clock */
    int64_t optim_steps;      /* Adam's step count */
    mc_loss_scaler scaler;
    /* set by mc_train_state_load: this run uses FP8 and the checkpoint
     * holds no FP8 state (its histories start afresh) */
    int fp8_missing;
} mc_train_state;

/* Write DIR/iter_NNNNNNN: every parameter as its global tensor (this rank's
 * block), the Adam moments unless o is NULL, the FP8 state when the model
 * uses FP8 (collective over each stage then), the state, and config_json
 * (the model and training configuration) as the "config" attribute. The
 * final directory goes to out_dir.
 * g is the grid the model was built on (NULL: one process). With more than
 * one rank this is collective over the world: every rank calls it and they
 * write one file in parallel (ckpt.h, mc_ckpt_writer_begin_grid); data-
 * parallel rank 0 writes the parameters and moments (gathered from the
 * distributed optimizer's shards), tensor-parallel rank 0 the replicated
 * ones; every rank gets the same status. */
mc_status mc_train_state_save(const char *dir, const mc_grid *g, mc_backend *be, mc_model *m,
                              mc_optim *o, const mc_train_state *s, const char *config_json,
                              const mc_tokenizer_spec *tok, int compression, char *out_dir,
                              size_t cap, mc_error *err);

/* --async-save on a grid: everything of mc_train_state_save up to the
 * commit, on the training thread at the save iteration: begin on wg (g
 * with a world communicator of its own, mc_grid_dup_world), every block
 * this rank writes stashed in host memory (the parallel writer copies
 * them: this is the snapshot), the tail. *out is then committed with
 * mc_ckpt_writer_commit on another thread (collective over wg's world:
 * every rank's thread commits), while training goes on over g. On an
 * error the writer is aborted here (collective over wg: the other ranks'
 * commits fail with it). */
mc_status mc_train_state_stage(const char *dir, const mc_grid *g, const mc_grid *wg, mc_backend *be,
                               mc_model *m, mc_optim *o, const mc_train_state *s,
                               const char *config_json, const mc_tokenizer_spec *tok,
                               int compression, mc_ckpt_writer **out, mc_error *err);

/* --async-save (one process): a host copy of everything
 * mc_train_state_save writes, taken at the save iteration
 * (mc_train_state_snapshot, on the training thread), then written by
 * mc_train_snapshot_write on another thread while training goes on, with
 * the same temporary directory, checksums, rename and latest pointer.
 * *inout NULL: the snapshot is made (its host memory allocated and
 * touched once); otherwise the same snapshot is refilled, nothing
 * allocated (the caller has waited for its previous write). o NULL or
 * not must be the same each time. config_json is copied; tok must
 * outlive the snapshot. */
typedef struct mc_train_snapshot mc_train_snapshot;
mc_status mc_train_state_snapshot(mc_backend *be, mc_model *m, mc_optim *o, const mc_train_state *s,
                                  const char *config_json, const mc_tokenizer_spec *tok,
                                  int compression, mc_train_snapshot **inout, mc_error *err);
mc_status mc_train_snapshot_write(const mc_train_snapshot *sn, const char *dir, char *out_dir,
                                  size_t cap, mc_error *err);
void mc_train_snapshot_free(mc_train_snapshot *sn);

/* Read a checkpoint into the model (every parameter must exist with the
 * model's global shape: the error names the tensor and both shapes, or the
 * configuration field that differs). With o non-NULL the Adam moments are
 * loaded too (a checkpoint saved without them is an error); with s
 * non-NULL the iteration and counters (and, with o, Adam's step and the
 * loss scaler's state when s->scaler is dynamic, and the FP8 state when
 * the model uses FP8 and the checkpoint has it). dir_out gets the
 * checkpoint's directory. A missing checkpoint is MC_ERR_NOTFOUND.
 * Any grid g (NULL: one process) loads a checkpoint of any other: each rank
 * reads its own blocks, and the moments are handed to the optimizer (which
 * keeps its shard). Collective over the world: every rank returns the same
 * status (mc_grid_status_all). */
mc_status mc_train_state_load(const char *path, const mc_grid *g, mc_backend *be, mc_model *m,
                              mc_optim *o, mc_train_state *s, char *dir_out, size_t cap,
                              mc_error *err);

#endif
