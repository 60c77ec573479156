/*
 * grad_buckets.h - private to lib/train: the data-parallel gradient
 * reduction in buckets, optionally overlapped with the last micro-batch's
 * backward pass (--overlap-grad-reduce), as Megatron's DistributedDataParallel
 * does it (lib/train/grad_buckets.c).
 */
#ifndef MC_TRAIN_GRAD_BUCKETS_H
#define MC_TRAIN_GRAD_BUCKETS_H

#include <stddef.h>
#include "mc/comm.h"
#include "mc/model.h"
#include "mc/status.h"

typedef struct mc_grad_buckets mc_grad_buckets;

/* Cut the model's gradient buffer into buckets of whole parameters, from
 * the last parameter to the first (the order in which the backward pass
 * finishes them), each of at least bucket_elems elements except the last
 * (bucket_elems 0: one bucket). With overlap the buckets are launched
 * (mc_iallreduce_sum over MC_GROUP_DP_CP) from the model's grad-ready hook,
 * which this installs on m. */
mc_status mc_grad_buckets_new(const mc_grid *g, mc_backend *be, mc_model *m, size_t bucket_elems,
                              int overlap, mc_grad_buckets **out, mc_error *err);
void mc_grad_buckets_free(mc_grad_buckets *b);
size_t mc_grad_buckets_count(const mc_grad_buckets *b);
/* With overlap: the next backward pass is the iteration's last, so its
 * finished buckets may be sent at once. */
void mc_grad_buckets_arm(mc_grad_buckets *b);
/* After the last backward pass: reduce every bucket not yet started, then
 * wait for all. Afterwards every gradient is summed over the group. */
mc_status mc_grad_buckets_finish(mc_grad_buckets *b, mc_error *err);

#endif
