/*
 * distopt.h - Megatron's distributed optimizer (--use-distributed-optimizer)
 * and the data-parallel gradient reduction of either optimizer
 * (lib/train/distopt.c, on the mc_optim of lib/mc/train.h).
 *
 * mc's parameters are fp32, so the parameter buffer is the "master" copy:
 * what is sharded over the data-parallel group (MC_GROUP_DP_CP: data x
 * context, Megatron's gradient-reduction group; DP below is its size, r
 * this rank's place in it) is the AdamW update and its moments.
 *
 * The shard. With q = numel / DP (integer division) and t = numel - DP q
 * (< DP) the buffer is read as if padded to DP (q + 1) elements:
 *   rank r owns [r q, (r+1) q)   (the "main" part)
 *         and  element DP q + r  when DP q + r < numel (the "tail")
 * so any DP, odd ones included, divides it; each rank holds q or q + 1
 * elements of each Adam moment (2 (q + 1) floats at most, not 2 numel).
 * The padding is never stored in the model's buffers: the tail goes
 * through a DP-float scratch, so mc_model needs no padding.
 *
 * One iteration, as the loop calls it (the same calls for both optimizers,
 * so the loop needs no branch):
 *
 *   mc_optim_wait_params(o)        <- before anything reads the parameters:
 *                                     the forward, evaluation, a checkpoint
 *   mc_model_zero_grads, forward/backward of every micro-batch (the loss
 *                                     already carries 1/(micro-batches x DP))
 *   mc_optim_reduce_grads(o)       <- instead of mc_allreduce_sum over
 *                                     MC_GROUP_DP_CP: all-reduce (plain) or
 *                                     reduce-scatter (distributed); after it
 *                                     only this rank's shard of the gradient
 *                                     buffer holds sums, the rest is stale
 *   mc_optim_step(o, lr, wd, scale, &res)
 *                                  <- distributed: norm of the shard, summed
 *                                     over every rank (MC_GROUP_WORLD, the
 *                                     data x model-parallel ranks, TP
 *                                     replicas counted once), clipping,
 *                                     AdamW on the shard, then the all-gather
 *                                     of the parameters (blocking, or started
 *                                     non-blocking with overlap_param_gather)
 *
 * Sums are the same bits as the plain path: the reduce-scatter adds each
 * element in group-rank order exactly like mc_allreduce_sum, and AdamW is
 * elementwise, so DP=N with and without the distributed optimizer give the
 * same parameters bit for bit. The one difference is the order in which the
 * gradient norm's double partial sums are added (per shard piece, then over
 * ranks): the norm agrees to ~1e-15 relative, and the float clip factor
 * derived from it is the same except when it falls within an ulp of a
 * rounding boundary (tests/parallel/test_distopt.c checks both).
 *
 * --overlap-param-gather: mc_optim_step only starts the all-gather
 * (mc_iallgather) and returns; mc_optim_wait_params finishes it. mc has no
 * forward hooks yet (Megatron waits per bucket as the forward reaches each
 * layer), so the gather overlaps what the loop does between the step and
 * the next forward (logging, metrics, loading the next micro-batch), and
 * the loop waits before the first forward: the same result, less overlap.
 * mc_optim_step, mc_optim_free and the checkpoint calls below wait too.
 *
 * Buckets: the shard is cut from the whole buffer (one bucket), so with
 * the distributed optimizer the loop reduces after the last backward with
 * mc_optim_reduce_grads instead of lib/train/grad_buckets.c's overlapped
 * all-reduce: --overlap-grad-reduce overlaps only the plain optimizer's
 * reduction for now (Megatron shards each bucket on its own, which would
 * let the reduce-scatter start per bucket; not done yet).
 *
 * Wiring in lib/train/loop.c (for NAME gridtrain): with
 * use_distributed_optimizer create the optimizer with
 * mc_optim_new_distributed_for_model(be, g, &c->optim, model,
 * c->overlap_param_gather, &optim, err); call mc_optim_reduce_grads in
 * place of the bucketed reduction, and mc_optim_wait_params before each
 * iteration's first forward, before evaluation and before saving.
 *
 * Checkpoints store global tensors (doc/ARCHITECTURE.md): with the distributed
 * optimizer mc_optim_exp_avg/_sq return NULL (no rank holds the whole
 * buffer) and checkpoint code uses the calls below, which work for both
 * optimizers (for the plain one they are copies), so a checkpoint saved
 * under any DP with or without the distributed optimizer loads under any
 * other.
 */
#ifndef MC_DISTOPT_H
#define MC_DISTOPT_H

#include <stddef.h>
#include "mc/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The distributed optimizer over the same buffers and parameters as
 * mc_optim_new (collective over nothing: every rank derives its shard from
 * the grid). overlap_param_gather: --overlap-param-gather. With DP = 1 it is
 * the plain optimizer. */
mc_status mc_optim_new_distributed(mc_backend *be, const mc_grid *g, const mc_optim_config *c,
                                   float *params, float *grads, size_t numel, const mc_param *ps,
                                   size_t nps, int overlap_param_gather, mc_optim **out,
                                   mc_error *err);
mc_status mc_optim_new_distributed_for_model(mc_backend *be, const mc_grid *g,
                                             const mc_optim_config *c, mc_model *m,
                                             int overlap_param_gather, mc_optim **out,
                                             mc_error *err);
int mc_optim_is_distributed(const mc_optim *o);

/* Sum the gradients over MC_GROUP_DP_CP (collective on that group): the
 * plain optimizer all-reduces the whole buffer, the distributed one
 * reduce-scatters it into the shards. Call once per iteration after the
 * backward passes and before mc_optim_step; the distributed mc_optim_step
 * refuses (MC_ERR_INTERNAL) gradients that were not reduced. */
mc_status mc_optim_reduce_grads(mc_optim *o, mc_error *err);

/* Finish the parameter all-gather started by mc_optim_step with
 * overlap_param_gather (no-op otherwise, and when nothing is pending).
 * Afterwards every rank holds all the updated parameters. */
mc_status mc_optim_wait_params(mc_optim *o, mc_error *err);

/* This rank's shard: main part [*lo, *hi) and the tail element *tail (or
 * (size_t)-1 when it has none). The plain optimizer: [0, numel), no tail. */
void mc_optim_shard(const mc_optim *o, size_t *lo, size_t *hi, size_t *tail);

/* Checkpoint save: the moments of buffer elements [offset, offset + n)
 * (a parameter: p->offset, p->numel; or the whole buffer 0, numel) into
 * m_out and v_out (n floats of backend memory each). Collective over
 * MC_GROUP_DP_CP for the distributed optimizer: every member calls it with
 * the same range; the ranks that write may pass buffers, the others NULL.
 * The plain optimizer copies locally. */
mc_status mc_optim_gather_moments(mc_optim *o, size_t offset, size_t n, float *m_out, float *v_out,
                                  mc_error *err);
/* Checkpoint load: set the moments of elements [offset, offset + n) from
 * the full values m_in, v_in (n floats of backend memory each, e.g. a
 * parameter's global tensor sliced to this tensor-parallel rank); each
 * rank keeps the part in its shard. Local: no communication. */
mc_status mc_optim_set_moments(mc_optim *o, size_t offset, size_t n, const float *m_in,
                               const float *v_in, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
