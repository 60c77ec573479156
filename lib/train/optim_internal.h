/*
 * optim_internal.h - the optimizer's state, shared by lib/train/optim.c
 * (spans, the step) and lib/train/distopt.c (the data-parallel shard, the
 * gradient reduce-scatter, the parameter all-gather, moments for
 * checkpoints). Not installed.
 */
#ifndef MC_OPTIM_INTERNAL_H
#define MC_OPTIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "mc/distopt.h"
#include "mc/train.h"

/* Adjacent parameters that share a weight-decay group and a norm rule. */
typedef struct mc_optim_span {
    size_t offset, n;
    int decay;     /* weight decay applies */
    int in_norm;   /* counted in the global norm on this rank */
} mc_optim_span;

/* What this rank updates: a span, or its intersection with the shard. The
 * pointers are fixed at creation (the buffers never move): p and g into
 * the model's buffers or, for the distributed tail element, g into the
 * scratch the tail reduce-scatter writes; moff is where the piece starts
 * in the moments. */
typedef struct mc_optim_piece {
    float *p, *g;
    size_t moff;
    size_t offset, n;  /* elements [offset, offset + n) of the buffer */
    int decay, in_norm;
} mc_optim_piece;

struct mc_optim {
    mc_backend *be;
    const mc_grid *grid;
    mc_optim_config cfg;
    float *params, *grads;
    size_t numel;
    mc_optim_span *spans;
    size_t nspans;
    mc_optim_piece *pieces;
    size_t npieces;
    float *m, *v;       /* mnumel floats each */
    size_t mnumel;
    int64_t steps;

    /* The distributed optimizer (distopt.c); distributed == 0: plain. */
    int distributed, overlap;
    int dp, dp_rank;    /* MC_GROUP_DP_CP */
    size_t q, t;        /* main share numel / dp, tail count numel - dp q */
    size_t tail;        /* this rank's tail element, or SIZE_MAX */
    float *scratch;     /* backend: tail grads in [dp], tail grad out [1],
                         * tail param in [1], tail params out [dp] */
    int reduced;        /* mc_optim_reduce_grads ran since the last step */
    mc_request *req_main, *req_tail;
    int gather_pending;
};

/* distopt.c: the pieces of o (spans, or spans intersected with the shard)
 * and the moments' size; called once by the constructor after the spans. */
/* optim.c: the constructor of both optimizers. */
mc_status mc_optim_create(mc_backend *be, const mc_grid *g, const mc_optim_config *c,
                          float *params, float *grads, size_t numel, const mc_param *ps,
                          size_t nps, int distributed, int overlap, mc_optim **out, mc_error *err);

mc_status mc_optim_dist_layout(mc_optim *o, mc_error *err);
/* Around the AdamW updates of mc_optim_step: before checks the gradients
 * were reduced (distributed) and finishes a pending parameter gather; after
 * starts (overlap) or runs the parameter all-gather. No-ops when plain. */
mc_status mc_optim_dist_before_step(mc_optim *o, mc_error *err);
mc_status mc_optim_dist_after_step(mc_optim *o, mc_error *err);

#endif
