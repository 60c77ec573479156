/*
 * optim_internal.h - the optimizer's state and primitives, shared by
 * lib/train/optim.c and lib/train/distopt.c. The calls go one way:
 * optim.c is the plain optimizer (spans, pieces, the AdamW update, the
 * moments' storage) and never calls distopt.c; distopt.c builds the
 * distributed optimizer on optim.c's primitives (the data-parallel shard,
 * the gradient reduce-scatter, the parameter all-gather, moments for
 * checkpoints) and holds the public entry points whose work depends on the
 * optimizer's kind, so every branch on o->distributed is there. Not
 * installed.
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
    int decay;   /* weight decay applies */
    int in_norm; /* counted in the global norm on this rank */
} mc_optim_span;

/* What this rank updates: a span, or its intersection with the shard. The
 * pointers are fixed at creation (the buffers never move): p and g into
 * the model's buffers or, for the distributed tail element, g into the
 * scratch the tail reduce-scatter writes; moff is where the piece starts
 * in the moments. */
typedef struct mc_optim_piece {
    float *p, *g;
    size_t moff;
    size_t offset, n; /* elements [offset, offset + n) of the buffer */
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
    float *m, *v; /* mnumel floats each */
    size_t mnumel;
    int64_t steps;
    /* mc_optim_set_prepared: the parameters' GEMM form, written with each
     * update (pw_bytes an element; NULL: none) */
    void *pw;
    size_t pw_bytes;
    mc_prec pw_prec;
    /* the linear weights (mc_param_prepared_cols > 0) in buffer order:
     * offset, numel, cols; the update prepares each a whole weight at a
     * time where its form depends on the shape (mc_backend_weight_panels) */
    size_t (*mats)[3];
    size_t nmats;

    /* The distributed optimizer (distopt.c); distributed == 0: plain. */
    int distributed, overlap;
    int dp, dp_rank;     /* of `group` */
    mc_group_kind group; /* the shard's: MC_GROUP_DP_CP, or MC_GROUP_EDP under EP */
    /* under expert parallelism: the dense ranges [lo, hi) of the buffer,
     * whose gradients are first summed over the EP group */
    size_t (*dense)[2];
    size_t ndense;
    size_t q, t;    /* main share numel / dp, tail count numel - dp q */
    size_t tail;    /* this rank's tail element, or SIZE_MAX */
    float *scratch; /* backend: tail grads in [dp], tail grad out [1],
                     * tail param in [1], tail params out [dp] */
    int reduced;    /* mc_optim_reduce_grads ran since the last step */
    mc_request *req_main, *req_tail;
    int gather_pending;
};

/* ---- optim.c's primitives, for distopt.c ---- */

/* A new optimizer over the buffers with its spans, the whole buffer on one
 * rank (dp 1, q numel, no tail), not distributed, with no pieces or moments
 * yet: mc_optim_cut_pieces comes next. Checks the configuration. */
mc_status mc_optim_alloc(mc_backend *be, const mc_grid *g, const mc_optim_config *c, float *params,
                         float *grads, size_t numel, const mc_param *ps, size_t nps, mc_optim **out,
                         mc_error *err);
/* The pieces this rank updates, the spans cut to elements [lo, hi) and to
 * element tail (SIZE_MAX: none) whose gradient is read from tail_grad, and
 * the moments, (hi - lo) + (tail != SIZE_MAX) floats each; once, after
 * mc_optim_alloc. */
mc_status mc_optim_cut_pieces(mc_optim *o, size_t lo, size_t hi, size_t tail, float *tail_grad,
                              mc_error *err);
/* The step's arithmetic over the pieces: the norm and finiteness of the
 * gradients (summed over stats_group), clipping and AdamW. r->found_inf:
 * nothing was updated. */
mc_status mc_optim_update(mc_optim *o, mc_group_kind stats_group, double lr, double weight_decay,
                          double loss_scale, mc_optim_result *r, mc_error *err);
/* Free o and what it holds (nothing may be in flight). NULL is a no-op. */
void mc_optim_destroy(mc_optim *o);
/* A malloc'd copy of the model's parameter table (*ps, *nps entries), as
 * the constructors take it. */
mc_status mc_optim_model_params(mc_model *m, mc_param **ps, size_t *nps, mc_error *err);

#endif
