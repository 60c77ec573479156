/*
 * grad_buckets.c - the data-parallel gradient all-reduce in buckets, as
 * Megatron's DistributedDataParallel and its _ParamAndGradBuffer do it:
 * buckets of whole parameters, started as the backward pass finishes them
 * (--overlap-grad-reduce) and waited for before the optimizer step, without
 * changing a bit of the result. See doc/ARCHITECTURE.md, "Training".
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "train/grad_buckets.h"

#include <stdlib.h>

typedef struct bucket {
    size_t lo, hi;       /* elements [lo, hi) of the gradient buffer */
    mc_group_kind group; /* MC_GROUP_DP_CP, or MC_GROUP_EDP for experts' gradients */
    mc_request *req;     /* in flight (NULL: done, or nothing to do) */
    int started;
} bucket;

struct mc_grad_buckets {
    const mc_grid *g;
    mc_backend *be;
    mc_model *m;
    float *grads;
    bucket *b; /* b[0] is the top of the buffer: ready first */
    size_t n;
    size_t next; /* first bucket not started */
    int overlap, armed;
};

static int cmp_offset_desc(const void *a, const void *b)
{
    const mc_param *x = *(const mc_param *const *)a, *y = *(const mc_param *const *)b;
    return x->offset < y->offset ? 1 : x->offset > y->offset ? -1 : 0;
}

static mc_status start(mc_grad_buckets *gb, bucket *k, mc_error *err)
{
    k->started = 1;
    return mc_iallreduce_sum(gb->g, k->group, gb->be, gb->grads + k->lo, k->hi - k->lo, &k->req,
                             err);
}

/* The model's hook: start every bucket that lies wholly at or above the
 * frontier, in order. */
static mc_status on_ready(void *ctx, size_t frontier, mc_error *err)
{
    mc_grad_buckets *gb = ctx;
    if (!gb->armed) return MC_OK;
    while (gb->next < gb->n && gb->b[gb->next].lo >= frontier) {
        mc_status st = start(gb, &gb->b[gb->next], err);
        gb->next++;
        if (st) return st;
    }
    return MC_OK;
}

mc_status mc_grad_buckets_new(const mc_grid *g, mc_backend *be, mc_model *m, size_t bucket_elems,
                              int overlap, mc_grad_buckets **out, mc_error *err)
{
    *out = NULL;
    size_t np = mc_model_num_params(m);
    mc_grad_buckets *gb = calloc(1, sizeof *gb);
    const mc_param **order = calloc(np ? np : 1, sizeof *order);
    if (gb) gb->b = calloc(np ? np : 1, sizeof *gb->b);
    if (!gb || !order || !gb->b) {
        free(order);
        mc_grad_buckets_free(gb);
        return mc_error_set(err, MC_ERR_NOMEM, "gradient buckets: out of memory");
    }
    gb->g = g;
    gb->be = be;
    gb->m = m;
    gb->grads = mc_model_grads(m);
    gb->overlap = overlap && mc_grid_group_size(g, MC_GROUP_DP_CP) > 1;
    for (size_t i = 0; i < np; i++) order[i] = mc_model_param(m, i);
    qsort(order, np, sizeof *order, cmp_offset_desc);
    /* From the top of the buffer down; a bucket closes once it holds
     * bucket_elems elements. Its top is the previous bucket's bottom, so
     * the alignment gaps between parameters belong to some bucket too. */
    /* Under expert parallelism a bucket holds experts' gradients only
     * (reduced over the expert-data-parallel group) or none (the
     * data-parallel group): it also closes where the kind changes. */
    size_t hi = mc_model_numel(m);
    int ep = mc_grid_group_size(g, MC_GROUP_EP) > 1;
    for (size_t i = 0; i < np; i++) {
        size_t lo = order[i]->offset;
        int last = i + 1 == np, expert = ep && order[i]->expert;
        int change = !last && ep && order[i + 1]->expert != order[i]->expert;
        if (last) lo = 0;
        if (last || change || (bucket_elems > 0 && hi - lo >= bucket_elems)) {
            mc_group_kind k = expert ? MC_GROUP_EDP : MC_GROUP_DP_CP;
            if (hi > lo) gb->b[gb->n++] = (bucket){lo, hi, k, NULL, 0};
            hi = lo;
        }
    }
    free(order);
    if (gb->overlap) mc_model_set_grad_ready_hook(m, on_ready, gb);
    *out = gb;
    return MC_OK;
}

void mc_grad_buckets_free(mc_grad_buckets *gb)
{
    if (!gb) return;
    /* An error left requests in flight: finish them before the buffers go. */
    for (size_t i = 0; i < gb->n; i++)
        if (gb->b[i].req) {
            mc_error e;
            mc_wait(gb->g, gb->b[i].req, &e);
        }
    if (gb->m && gb->overlap) mc_model_set_grad_ready_hook(gb->m, NULL, NULL);
    free(gb->b);
    free(gb);
}

size_t mc_grad_buckets_count(const mc_grad_buckets *gb) { return gb->n; }

void mc_grad_buckets_arm(mc_grad_buckets *gb)
{
    gb->armed = gb->overlap;
    gb->next = 0;
}

mc_status mc_grad_buckets_finish(mc_grad_buckets *gb, mc_error *err)
{
    mc_status st = MC_OK;
    gb->armed = 0;
    for (size_t i = 0; i < gb->n && !st; i++) {
        bucket *k = &gb->b[i];
        if (!k->started)
            st = gb->overlap ? start(gb, k, err)
                             : mc_allreduce_sum(gb->g, k->group, gb->be, gb->grads + k->lo,
                                                k->hi - k->lo, err);
    }
    /* Wait for every request, even after an error, so none is left holding
     * the buffer; the first error is the one reported. */
    for (size_t i = 0; i < gb->n; i++) {
        bucket *k = &gb->b[i];
        if (k->req) {
            mc_error e;
            mc_status ws = mc_wait(gb->g, k->req, st ? &e : err);
            k->req = NULL;
            if (!st) st = ws;
        }
        k->started = 0;
    }
    gb->next = 0;
    return st;
}
