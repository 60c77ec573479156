/*
 * distopt.c - Megatron's distributed optimizer over the data-parallel group
 * (lib/mc/distopt.h says what it computes and how the loop calls it): each
 * rank's shard of the flat buffer (doc/ARCHITECTURE.md, "Training"), the
 * step's pieces cut to it, the gradient reduce-scatter, the parameter
 * all-gather (blocking or overlapped), the moments for checkpoints, and the
 * entry points whose work depends on the optimizer's kind, for both kinds.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "optim_internal.h"

#include <stdint.h>
#include <stdlib.h>

/* Where the tail's values sit in o->scratch (2 DP + 2 floats). */
#define TAIL_GRADS_IN(o) ((o)->scratch)                 /* [DP] */
#define TAIL_GRAD_OUT(o) ((o)->scratch + (o)->dp)       /* [1] */
#define TAIL_PARAM_IN(o) ((o)->scratch + (o)->dp + 1)   /* [1] */
#define TAIL_PARAMS_OUT(o) ((o)->scratch + (o)->dp + 2) /* [DP] */

static size_t zmax(size_t a, size_t b) { return a > b ? a : b; }
static size_t zmin(size_t a, size_t b) { return a < b ? a : b; }

/* ------------------------------------------------------------ constructors */

static int cmp_offset(const void *a, const void *b)
{
    const mc_param *x = *(const mc_param *const *)a, *y = *(const mc_param *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* o->dense: the runs of non-expert parameters, each from its first
 * parameter's offset to the next expert parameter's (or the buffer's end),
 * alignment gaps included. */
static mc_status dense_ranges(mc_optim *o, const mc_param *ps, size_t nps, mc_error *err)
{
    const mc_param **order = calloc(nps ? nps : 1, sizeof *order);
    o->dense = calloc(nps ? nps : 1, sizeof *o->dense);
    if (!order || !o->dense) {
        free(order);
        return mc_error_set(err, MC_ERR_NOMEM, "distributed optimizer: out of memory");
    }
    for (size_t i = 0; i < nps; i++) order[i] = &ps[i];
    qsort(order, nps, sizeof *order, cmp_offset);
    o->ndense = 0;
    int open = 0;
    for (size_t i = 0; i < nps; i++) {
        if (!order[i]->expert && !open) {
            o->dense[o->ndense][0] = i == 0 ? 0 : order[i]->offset;
            open = 1;
        } else if (order[i]->expert && open) {
            o->dense[o->ndense++][1] = order[i]->offset;
            open = 0;
        }
    }
    if (open) o->dense[o->ndense++][1] = o->numel;
    free(order);
    return MC_OK;
}

mc_status mc_optim_new_distributed(mc_backend *be, const mc_grid *g, const mc_optim_config *c,
                                   float *params, float *grads, size_t numel, const mc_param *ps,
                                   size_t nps, int overlap_param_gather, mc_optim **out,
                                   mc_error *err)
{
    *out = NULL;
    mc_optim *o;
    mc_status st = mc_optim_alloc(be, g, c, params, grads, numel, ps, nps, &o, err);
    if (st) return st;
    o->distributed = 1;
    o->overlap = overlap_param_gather != 0;
    /* Under expert parallelism the shard is
     * over the expert-data-parallel group: the experts' gradients are
     * summed there, and the dense ones, summed over the EP group first,
     * too; every EP rank then updates the same dense shard alike. The
     * dense parameters' ranges, from each to the next expert's start. */
    o->group = MC_GROUP_DP_CP;
    if (mc_grid_group_size(g, MC_GROUP_EP) > 1) {
        o->group = MC_GROUP_EDP;
        st = dense_ranges(o, ps, nps, err);
        if (st) {
            mc_optim_destroy(o);
            return st;
        }
    }
    o->dp = mc_grid_group_size(o->grid, o->group);
    o->dp_rank = mc_grid_group_rank(o->grid, o->group);
    if (o->dp < 1 || o->dp_rank < 0) {
        st = mc_error_set(err, MC_ERR_INTERNAL,
                          "distributed optimizer: this rank has no place in the %s",
                          mc_group_name(o->group));
        mc_optim_destroy(o);
        return st;
    }
    /* The shard: main part [lo, hi) and the tail element, if any. */
    size_t dp = (size_t)o->dp, r = (size_t)o->dp_rank;
    o->q = o->numel / dp;
    o->t = o->numel - dp * o->q;
    size_t lo = r * o->q, hi = lo + o->q;
    if (r < o->t) o->tail = dp * o->q + r;
    o->scratch = mc_balloc(o->be, (2 * dp + 2) * sizeof(float), err);
    if (!o->scratch) st = err ? err->code : MC_ERR_NOMEM;
    /* The pieces cut to the shard; the tail's gradient is the scratch's. */
    if (!st) st = mc_optim_cut_pieces(o, lo, hi, o->tail, TAIL_GRAD_OUT(o), err);
    if (st) {
        mc_optim_destroy(o);
        return st;
    }
    *out = o;
    return MC_OK;
}

mc_status mc_optim_new_distributed_for_model(mc_backend *be, const mc_grid *g,
                                             const mc_optim_config *c, mc_model *m,
                                             int overlap_param_gather, mc_optim **out,
                                             mc_error *err)
{
    size_t nps;
    mc_param *ps;
    mc_status st = mc_optim_model_params(m, &ps, &nps, err);
    if (st) return st;
    st = mc_optim_new_distributed(be, g, c, mc_model_params(m), mc_model_grads(m),
                                  mc_model_numel(m), ps, nps, overlap_param_gather, out, err);
    free(ps);
    return st;
}

void mc_optim_free(mc_optim *o)
{
    if (!o) return;
    /* A parameter gather still in flight owns the buffers: finish it (its
     * error, if any, has nowhere to go; the job is ending anyway). */
    mc_error ignored;
    mc_optim_wait_params(o, &ignored);
    mc_optim_destroy(o);
}

int mc_optim_is_distributed(const mc_optim *o) { return o->distributed; }

void mc_optim_shard(const mc_optim *o, size_t *lo, size_t *hi, size_t *tail)
{
    size_t r = o->distributed ? (size_t)o->dp_rank : 0;
    *lo = r * o->q;
    *hi = *lo + o->q;
    *tail = o->tail;
}

/* ------------------------------------------------------------ the step */

mc_status mc_optim_reduce_grads(mc_optim *o, mc_error *err)
{
    mc_status st;
    if (!o->distributed) {
        if ((st = mc_allreduce_sum(o->grid, MC_GROUP_DP_CP, o->be, o->grads, o->numel, err)))
            return st;
        o->reduced = 1;
        return MC_OK;
    }
    /* Expert parallelism: the dense gradients summed over the EP group
     * first (then over the shard's group below: over all data parallelism) */
    for (size_t i = 0; i < o->ndense; i++)
        if ((st = mc_allreduce_sum(o->grid, MC_GROUP_EP, o->be, o->grads + o->dense[i][0],
                                   o->dense[i][1] - o->dense[i][0], err)))
            return st;
    /* Main part: rank r receives the sum of every member's chunk r, in
     * place, each element added in group-rank order as the all-reduce does. */
    size_t r = (size_t)o->dp_rank, dp = (size_t)o->dp;
    if (o->q > 0 && (st = mc_reduce_scatter_sum(o->grid, o->group, o->be, o->grads,
                                                o->grads + r * o->q, o->q, err)))
        return st;
    /* Tail: the last t gradients, zero-padded to DP, one to each rank. */
    if (o->t > 0) {
        mc_k_fill(o->be, TAIL_GRADS_IN(o), 0.0f, dp);
        mc_bcopy(o->be, TAIL_GRADS_IN(o), o->grads + dp * o->q, o->t * sizeof(float));
        if ((st = mc_reduce_scatter_sum(o->grid, o->group, o->be, TAIL_GRADS_IN(o),
                                        TAIL_GRAD_OUT(o), 1, err)))
            return st;
    }
    o->reduced = 1;
    return MC_OK;
}

/* Before the update: the distributed optimizer checks the gradients were
 * reduced and finishes a pending parameter gather. */
static mc_status before_step(mc_optim *o, mc_error *err)
{
    int reduced = o->reduced;
    o->reduced = 0;
    if (!o->distributed) return MC_OK;
    if (!reduced)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "distributed optimizer: mc_optim_step without mc_optim_reduce_grads "
                            "since the last step: this rank's shard of the gradients is not "
                            "summed over the %s",
                            mc_group_name(o->group));
    /* The shard about to be updated is the all-gather's source. */
    return mc_optim_wait_params(o, err);
}

static void tail_params_land(mc_optim *o)
{
    if (o->t > 0)
        mc_bcopy(o->be, o->params + (size_t)o->dp * o->q, TAIL_PARAMS_OUT(o), o->t * sizeof(float));
}

/* After the update: the distributed optimizer starts (overlap) or runs the
 * parameter all-gather. */
static mc_status after_step(mc_optim *o, mc_error *err)
{
    if (!o->distributed || o->dp == 1) return MC_OK;
    size_t r = (size_t)o->dp_rank;
    float *mine = o->params + r * o->q;
    /* A rank without a tail element sends a zero that nobody keeps. */
    if (o->t > 0) {
        if (o->tail != SIZE_MAX)
            mc_bcopy(o->be, TAIL_PARAM_IN(o), o->params + o->tail, sizeof(float));
        else
            mc_k_fill(o->be, TAIL_PARAM_IN(o), 0.0f, 1);
    }
    mc_status st;
    if (o->overlap) {
        /* Started here, finished by mc_optim_wait_params before the next
         * forward reads the parameters. */
        if (o->q > 0 && (st = mc_iallgather(o->grid, o->group, o->be, mine, o->params, o->q,
                                            &o->req_main, err)))
            return st;
        o->gather_pending = 1;
        if (o->t > 0 && (st = mc_iallgather(o->grid, o->group, o->be, TAIL_PARAM_IN(o),
                                            TAIL_PARAMS_OUT(o), 1, &o->req_tail, err)))
            return st;
        return MC_OK;
    }
    if (o->q > 0 && (st = mc_allgather(o->grid, o->group, o->be, mine, o->params, o->q, err)))
        return st;
    if (o->t > 0 &&
        (st = mc_allgather(o->grid, o->group, o->be, TAIL_PARAM_IN(o), TAIL_PARAMS_OUT(o), 1, err)))
        return st;
    tail_params_land(o);
    return MC_OK;
}

mc_status mc_optim_wait_params(mc_optim *o, mc_error *err)
{
    if (!o->gather_pending) return MC_OK;
    o->gather_pending = 0;
    mc_request *a = o->req_main, *b = o->req_tail;
    o->req_main = o->req_tail = NULL;
    mc_status st = mc_wait(o->grid, a, err);
    mc_error second;
    mc_status st2 = mc_wait(o->grid, b, st ? &second : err);
    if (st) return st;
    if (st2) return st2;
    tail_params_land(o);
    return MC_OK;
}

mc_status mc_optim_step(mc_optim *o, double lr, double weight_decay, double loss_scale,
                        mc_optim_result *r, mc_error *err)
{
    mc_status st = before_step(o, err);
    if (st) return st;
    /* Megatron's grad-stats group. The plain optimizer's gradients are
     * already summed over data parallelism, so the norm and the overflow
     * flag are reduced over the model-parallel group only; the distributed
     * one holds a shard of them, so every rank (data x model parallel)
     * contributes its part. */
    mc_group_kind stats_group = o->distributed                                 ? MC_GROUP_WORLD
                                : mc_grid_group_size(o->grid, MC_GROUP_EP) > 1 ? MC_GROUP_MP_EP
                                                                               : MC_GROUP_MP;
    if ((st = mc_optim_update(o, stats_group, lr, weight_decay, loss_scale, r, err))) return st;
    if (r->found_inf) return MC_OK;
    return after_step(o, err);
}

/* ------------------------------------------------------------ checkpoints */

/* The whole-buffer moments exist only for the plain optimizer; the
 * distributed one's checkpoints go through mc_optim_gather_moments. */
float *mc_optim_exp_avg(mc_optim *o) { return o->distributed ? NULL : o->m; }
float *mc_optim_exp_avg_sq(mc_optim *o) { return o->distributed ? NULL : o->v; }

static mc_status check_range(const mc_optim *o, size_t offset, size_t n, const char *what,
                             mc_error *err)
{
    if (offset > o->numel || n > o->numel - offset)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "optimizer: %s of elements [%zu, %zu) outside the buffer of %zu", what,
                            offset, offset + n, o->numel);
    return MC_OK;
}

/*
 * Every member packs what it holds of [offset, offset + n) into a slot of
 * 2L floats, L = min(q, n) + 1:
 *   [0, L-1)  its main part's exp_avg in the range (at most min(q, n))
 *   L-1       its tail element's exp_avg, if that is in the range
 *   [L, 2L)   the same for exp_avg_sq
 * and one all-gather gives everyone every slot; only the ranks with an
 * output buffer unpack. Floats are moved, never added: the bits survive.
 */
mc_status mc_optim_gather_moments(mc_optim *o, size_t offset, size_t n, float *m_out, float *v_out,
                                  mc_error *err)
{
    mc_status st = check_range(o, offset, n, "moment gather", err);
    if (st || n == 0) return st;
    if (!o->distributed) {
        if (m_out) mc_bcopy(o->be, m_out, o->m + offset, n * sizeof(float));
        if (v_out) mc_bcopy(o->be, v_out, o->v + offset, n * sizeof(float));
        return MC_OK;
    }
    size_t dp = (size_t)o->dp, r = (size_t)o->dp_rank, q = o->q, end = offset + n;
    size_t L = zmin(q, n) + 1;
    float *buf = mc_balloc(o->be, dp * 2 * L * sizeof(float), err);
    if (!buf) return err ? err->code : MC_ERR_NOMEM;
    float *slot = buf + r * 2 * L;
    size_t a = zmax(offset, r * q), b = zmin(end, r * q + q);
    if (a < b) {
        mc_bcopy(o->be, slot, o->m + (a - r * q), (b - a) * sizeof(float));
        mc_bcopy(o->be, slot + L, o->v + (a - r * q), (b - a) * sizeof(float));
    }
    if (o->tail != SIZE_MAX && o->tail >= offset && o->tail < end) {
        mc_bcopy(o->be, slot + L - 1, o->m + q, sizeof(float));
        mc_bcopy(o->be, slot + 2 * L - 1, o->v + q, sizeof(float));
    }
    st = mc_allgather(o->grid, o->group, o->be, slot, buf, 2 * L, err);
    for (size_t j = 0; j < dp && !st; j++) {
        const float *sj = buf + j * 2 * L;
        size_t aj = zmax(offset, j * q), bj = zmin(end, j * q + q), tj = dp * q + j;
        if (aj < bj) {
            if (m_out) mc_bcopy(o->be, m_out + (aj - offset), sj, (bj - aj) * sizeof(float));
            if (v_out) mc_bcopy(o->be, v_out + (aj - offset), sj + L, (bj - aj) * sizeof(float));
        }
        if (j < o->t && tj >= offset && tj < end) {
            if (m_out) mc_bcopy(o->be, m_out + (tj - offset), sj + L - 1, sizeof(float));
            if (v_out) mc_bcopy(o->be, v_out + (tj - offset), sj + 2 * L - 1, sizeof(float));
        }
    }
    mc_bfree(o->be, buf);
    return st;
}

mc_status mc_optim_set_moments(mc_optim *o, size_t offset, size_t n, const float *m_in,
                               const float *v_in, mc_error *err)
{
    mc_status st = check_range(o, offset, n, "moment load", err);
    if (st || n == 0) return st;
    if (!o->distributed) {
        mc_bcopy(o->be, o->m + offset, m_in, n * sizeof(float));
        mc_bcopy(o->be, o->v + offset, v_in, n * sizeof(float));
        return MC_OK;
    }
    size_t r = (size_t)o->dp_rank, q = o->q, end = offset + n;
    size_t a = zmax(offset, r * q), b = zmin(end, r * q + q);
    if (a < b) {
        mc_bcopy(o->be, o->m + (a - r * q), m_in + (a - offset), (b - a) * sizeof(float));
        mc_bcopy(o->be, o->v + (a - r * q), v_in + (a - offset), (b - a) * sizeof(float));
    }
    if (o->tail != SIZE_MAX && o->tail >= offset && o->tail < end) {
        mc_bcopy(o->be, o->m + q, m_in + (o->tail - offset), sizeof(float));
        mc_bcopy(o->be, o->v + q, v_in + (o->tail - offset), sizeof(float));
    }
    return MC_OK;
}
