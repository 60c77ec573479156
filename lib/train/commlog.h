/*
 * commlog.h - private to lib/train: mc-train --log-comm, the per-iteration
 * traffic of the training steps (lib/train/commlog.c over mc/comm_stats.h).
 */
#ifndef MC_TRAIN_COMMLOG_H
#define MC_TRAIN_COMMLOG_H

#include <stdint.h>
#include "mc/comm_stats.h"
#include "mc/metrics.h"
#include "mc/status.h"

/* The counters of the training steps since the last line. */
typedef struct mc_comm_log {
    mc_comm_stat acc[MC_GROUP_COUNT][MC_COLL_COUNT];
    int64_t iters;
} mc_comm_log;

/* Around each training step: start zeroes the grid's counters, so what
 * happens between steps (evaluation, checkpoints, the exit checks) stays
 * out; end adds the step's counters to l. */
void mc_comm_log_start(const mc_grid *g);
void mc_comm_log_end(mc_comm_log *l, const mc_grid *g);
/* The line (one print call) and the metrics of step `step`: per group and
 * kind, the mean per step since the last line; then clears l. */
mc_status mc_comm_log_emit(mc_comm_log *l, const mc_grid *g, mc_metrics *m, int64_t step,
                           void (*print)(void *ctx, const char *line), void *ctx, mc_error *err);

#endif
