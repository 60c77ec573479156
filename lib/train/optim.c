/*
 * optim.c - AdamW over the model's contiguous parameter buffer, Megatron's
 * global gradient-norm clipping, the NaN/overflow check that skips a step,
 * and the fp16 loss scalers (constant and dynamic): the plain optimizer and
 * the primitives the distributed one (distopt.c) builds on, through
 * optim_internal.h. Nothing here calls distopt.c. See doc/ARCHITECTURE.md,
 * "Training".
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/train.h"
#include "optim_internal.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ loss scalers */

void mc_loss_scaler_fixed(mc_loss_scaler *s, double scale)
{
    memset(s, 0, sizeof *s);
    s->dynamic = 0;
    s->scale = scale;
    s->min_scale = scale;
    s->growth_factor = 1.0;
    s->backoff_factor = 1.0;
}

void mc_loss_scaler_dynamic(mc_loss_scaler *s, double initial, double min_scale, int window,
                            int hysteresis)
{
    memset(s, 0, sizeof *s);
    s->dynamic = 1;
    s->scale = initial;
    s->min_scale = min_scale;
    s->window = window > 0 ? window : 1;
    s->hysteresis = hysteresis > 0 ? hysteresis : 1;
    s->growth_factor = 2.0;
    s->backoff_factor = 0.5;
    s->growth_tracker = 0;
    s->hysteresis_tracker = s->hysteresis;
}

/* Megatron's DynamicGradScaler.update: an overflow resets the growth count
 * and spends one unit of hysteresis; with none left the scale backs off
 * (never below the minimum, and it keeps backing off on every further
 * overflow until a full clean window restores the hysteresis). A full
 * window of clean steps grows the scale and restores the hysteresis. */
void mc_loss_scaler_update(mc_loss_scaler *s, int found_inf)
{
    if (!s->dynamic) return;
    if (found_inf) {
        s->growth_tracker = 0;
        s->hysteresis_tracker--;
        if (s->hysteresis_tracker <= 0) {
            double next = s->scale * s->backoff_factor;
            s->scale = next > s->min_scale ? next : s->min_scale;
        }
    } else {
        s->growth_tracker++;
        if (s->growth_tracker == s->window) {
            s->growth_tracker = 0;
            s->hysteresis_tracker = s->hysteresis;
            s->scale *= s->growth_factor;
        }
    }
}

/* ------------------------------------------------------------ optimizer */

void mc_optim_config_init(mc_optim_config *c)
{
    c->weight_decay = 0.01;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->clip_grad = 1.0;
}

static int cmp_param_offset(const void *a, const void *b)
{
    const mc_param *x = *(const mc_param *const *)a, *y = *(const mc_param *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

mc_status mc_optim_alloc(mc_backend *be, const mc_grid *g, const mc_optim_config *c, float *params,
                         float *grads, size_t numel, const mc_param *ps, size_t nps, mc_optim **out,
                         mc_error *err)
{
    *out = NULL;
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return mc_error_set(err, MC_ERR_USAGE, "adam betas must lie in [0, 1), got %g and %g",
                            c->beta1, c->beta2);
    if (!(c->eps > 0) || !(c->weight_decay >= 0) || !(c->clip_grad >= 0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "adam eps must be > 0 and weight decay, clip-grad >= 0");
    mc_optim *o = calloc(1, sizeof *o);
    const mc_param **order = calloc(nps ? nps : 1, sizeof *order);
    if (o) o->spans = calloc(nps ? nps : 1, sizeof *o->spans);
    if (o) o->mats = calloc(nps ? nps : 1, sizeof *o->mats);
    if (!o || !order || !o->spans || !o->mats) {
        free(order);
        mc_optim_destroy(o);
        return mc_error_set(err, MC_ERR_NOMEM, "optimizer: out of memory");
    }
    o->be = be;
    o->grid = g;
    o->cfg = *c;
    o->params = params;
    o->grads = grads;
    o->numel = numel;
    /* The whole buffer on one rank until distopt.c lays out a shard. */
    o->dp = 1;
    o->dp_rank = 0;
    o->q = numel;
    o->t = 0;
    o->tail = SIZE_MAX;

    /* Spans in buffer order; adjacent parameters with the same rules merge. */
    for (size_t i = 0; i < nps; i++) order[i] = &ps[i];
    qsort(order, nps, sizeof *order, cmp_param_offset);
    int tp_rank = mc_grid_group_rank(g, MC_GROUP_TP), ep_rank = mc_grid_group_rank(g, MC_GROUP_EP);
    size_t end = 0;
    for (size_t i = 0; i < nps; i++) {
        const mc_param *p = order[i];
        if (p->offset < end || p->offset + p->numel > numel) {
            free(order);
            mc_optim_destroy(o);
            return mc_error_set(err, MC_ERR_INTERNAL,
                                "optimizer: parameter %s [%zu, %zu) overlaps another or lies "
                                "outside the buffer of %zu elements",
                                p->name, p->offset, p->offset + p->numel, numel);
        }
        end = p->offset + p->numel;
        if (p->numel == 0) continue;
        if (mc_param_prepared_cols(p)) {
            size_t *mt = o->mats[o->nmats++];
            mt[0] = p->offset, mt[1] = p->numel, mt[2] = mc_param_prepared_cols(p);
        }
        /* A parameter replicated over tensor parallelism is counted in the
         * norm by tensor-parallel rank 0 only, so the all-reduce over the
         * model-parallel group counts it once (Megatron's
         * param_is_not_tensor_parallel_duplicate); the last pipeline
         * stage's copy of tied embeddings not at all (param_is_not_shared). */
        /* Under expert parallelism the dense parameters are the same on
         * every EP rank and the experts differ: EP rank 0 counts the
         * dense ones (mc_optim_step sums over tp x ep x pp). An expert
         * slice's replicas (ETP < TP, p->replica) leave it to the first. */
        mc_optim_span s = {p->offset, p->numel, !p->no_weight_decay,
                           !p->shared && (p->split_dim >= 0 || tp_rank == 0) && !p->replica &&
                               (p->expert || ep_rank == 0)};
        mc_optim_span *last = o->nspans ? &o->spans[o->nspans - 1] : NULL;
        if (last && last->offset + last->n == s.offset && last->decay == s.decay &&
            last->in_norm == s.in_norm)
            last->n += s.n;
        else
            o->spans[o->nspans++] = s;
    }
    free(order);
    *out = o;
    return MC_OK;
}

static size_t zmax(size_t a, size_t b) { return a > b ? a : b; }
static size_t zmin(size_t a, size_t b) { return a < b ? a : b; }

mc_status mc_optim_cut_pieces(mc_optim *o, size_t lo, size_t hi, size_t tail, float *tail_grad,
                              mc_error *err)
{
    o->mnumel = (hi - lo) + (tail != SIZE_MAX);

    /* Each span gives at most one main piece and the tail piece. */
    o->pieces = calloc(2 * o->nspans + 1, sizeof *o->pieces);
    if (!o->pieces) return mc_error_set(err, MC_ERR_NOMEM, "optimizer: out of memory");
    for (size_t i = 0; i < o->nspans; i++) {
        const mc_optim_span *s = &o->spans[i];
        size_t a = zmax(s->offset, lo), b = zmin(s->offset + s->n, hi);
        if (a >= b) continue;
        o->pieces[o->npieces++] = (mc_optim_piece){o->params + a, o->grads + a, a - lo,    a,
                                                   b - a,         s->decay,     s->in_norm};
    }
    /* The tail element comes last in the buffer, and so in the pieces. A
     * tail that falls in a gap between parameters gets no piece: like the
     * gaps of the main part, it is moved but never updated. */
    for (size_t i = 0; i < o->nspans && tail != SIZE_MAX; i++) {
        const mc_optim_span *s = &o->spans[i];
        if (tail >= s->offset && tail < s->offset + s->n)
            o->pieces[o->npieces++] = (mc_optim_piece){
                o->params + tail, tail_grad, hi - lo, tail, 1, s->decay, s->in_norm};
    }
    o->m = mc_balloc(o->be, (o->mnumel ? o->mnumel : 1) * sizeof(float), err);
    o->v = o->m ? mc_balloc(o->be, (o->mnumel ? o->mnumel : 1) * sizeof(float), err) : NULL;
    if (!o->m || !o->v) return err ? err->code : MC_ERR_NOMEM;
    return MC_OK;
}

mc_status mc_optim_new(mc_backend *be, const mc_grid *g, const mc_optim_config *c, float *params,
                       float *grads, size_t numel, const mc_param *ps, size_t nps, mc_optim **out,
                       mc_error *err)
{
    *out = NULL;
    mc_optim *o;
    mc_status st = mc_optim_alloc(be, g, c, params, grads, numel, ps, nps, &o, err);
    if (st) return st;
    /* Every span is a piece; the moments cover the whole buffer. */
    if ((st = mc_optim_cut_pieces(o, 0, numel, SIZE_MAX, NULL, err))) {
        mc_optim_destroy(o);
        return st;
    }
    *out = o;
    return MC_OK;
}

mc_status mc_optim_model_params(mc_model *m, mc_param **ps, size_t *nps, mc_error *err)
{
    *nps = mc_model_num_params(m);
    if (!(*ps = malloc((*nps ? *nps : 1) * sizeof **ps)))
        return mc_error_set(err, MC_ERR_NOMEM, "optimizer: out of memory");
    for (size_t i = 0; i < *nps; i++) (*ps)[i] = *mc_model_param(m, i);
    return MC_OK;
}

mc_status mc_optim_new_for_model(mc_backend *be, const mc_grid *g, const mc_optim_config *c,
                                 mc_model *m, mc_optim **out, mc_error *err)
{
    size_t nps;
    mc_param *ps;
    mc_status st = mc_optim_model_params(m, &ps, &nps, err);
    if (st) return st;
    st = mc_optim_new(be, g, c, mc_model_params(m), mc_model_grads(m), mc_model_numel(m), ps, nps,
                      out, err);
    free(ps);
    return st;
}

void mc_optim_destroy(mc_optim *o)
{
    if (!o) return;
    if (o->m) mc_bfree(o->be, o->m);
    if (o->v) mc_bfree(o->be, o->v);
    if (o->scratch) mc_bfree(o->be, o->scratch);
    free(o->dense);
    free(o->pieces);
    free(o->spans);
    free(o->mats);
    free(o);
}

mc_status mc_optim_update(mc_optim *o, mc_group_kind stats_group, double lr, double weight_decay,
                          double loss_scale, mc_optim_result *r, mc_error *err)
{
    mc_status st;
    /* Sum of squares of the scaled gradients: what this rank counts toward
     * the norm, and everything it updates (for the finiteness check). The
     * finiteness test reads the double sums: a float gradient squared
     * cannot overflow a double, so the sum is finite exactly when every
     * gradient is. */
    double stats[2] = {0.0, 0.0}; /* [0] norm part, [1] not-finite flag */
    for (size_t i = 0; i < o->npieces; i++) {
        const mc_optim_piece *s = &o->pieces[i];
        double ss = mc_k_sumsq(o->be, s->g, s->n);
        if (s->in_norm) stats[0] += ss;
        if (!isfinite(ss)) stats[1] = 1.0;
    }
    if (isnan(stats[0]) || isinf(stats[0])) stats[1] = 1.0;
    /* Megatron's grad-stats group (the caller's choice, mc_optim_step). */
    if ((st = mc_allreduce_sum_f64(o->grid, stats_group, stats, 2, err))) return st;

    double inv_scale = 1.0 / loss_scale;
    r->found_inf = stats[1] != 0.0 || !isfinite(stats[0]);
    r->grad_norm = sqrt(stats[0]) * inv_scale;
    r->clip_coeff = 1.0;
    if (r->found_inf) return MC_OK;

    /* Megatron's clip_grad_norm_fp32: clip_coeff = max_norm / (norm + 1e-6),
     * applied only when it shrinks the gradients. It folds into the factor
     * the AdamW kernel multiplies every gradient by, with the unscaling. */
    if (o->cfg.clip_grad > 0) {
        double coeff = o->cfg.clip_grad / (r->grad_norm + 1.0e-6);
        if (coeff < 1.0) r->clip_coeff = coeff;
    }
    o->steps++;
    double bc1 = 1.0 - pow(o->cfg.beta1, (double)o->steps);
    double bc2 = 1.0 - pow(o->cfg.beta2, (double)o->steps);
    float gscale = (float)(inv_scale * r->clip_coeff);
    int whole = o->pw && mc_backend_weight_panels(o->be, o->pw_prec);
    size_t mi = 0; /* the next linear weight (o->mats) */
    for (size_t i = 0; i < o->npieces; i++) {
        const mc_optim_piece *s = &o->pieces[i];
        float wd = s->decay ? (float)weight_decay : 0.0f;
        if (o->pw) {
            /* [a, b) of the piece at a time: a whole linear weight where its
             * prepared form depends on its shape, else up to the next one */
            size_t a = s->offset, end = s->offset + s->n;
            while (a < end) {
                while (whole && mi < o->nmats && o->mats[mi][0] + o->mats[mi][1] <= a) mi++;
                size_t next = whole && mi < o->nmats ? o->mats[mi][0] : end;
                int mat = next == a;
                size_t b = mat ? a + o->mats[mi][1] : next < end ? next : end;
                /* pieces are whole spans of whole parameters (the plain
                 * optimizer's): a weight never straddles their ends */
                assert(next >= a && b <= end);
                size_t d = a - s->offset;
                mc_k_adamw_prepare(o->be, s->p + d, s->g + d, o->m + s->moff + d,
                                   o->v + s->moff + d, b - a, (float)lr, (float)o->cfg.beta1,
                                   (float)o->cfg.beta2, (float)o->cfg.eps, wd, (float)bc1,
                                   (float)bc2, gscale, o->pw_prec,
                                   (char *)o->pw + (size_t)(s->p + d - o->params) * o->pw_bytes,
                                   mat ? o->mats[mi][2] : 0);
                a = b;
            }
        } else
            mc_k_adamw(o->be, s->p, s->g, o->m + s->moff, o->v + s->moff, s->n, (float)lr,
                       (float)o->cfg.beta1, (float)o->cfg.beta2, (float)o->cfg.eps, wd, (float)bc1,
                       (float)bc2, gscale);
    }
    return MC_OK;
}

int mc_optim_set_prepared(mc_optim *o, void *pw, size_t pw_bytes, mc_prec prec)
{
    /* the distributed optimizer updates a shard, then gathers the
     * parameters: their GEMM form is made after, by the model */
    if (o->distributed || !pw || !pw_bytes) return 0;
    o->pw = pw;
    o->pw_bytes = pw_bytes;
    o->pw_prec = prec;
    return 1;
}

size_t mc_optim_numel(const mc_optim *o) { return o->numel; }
int64_t mc_optim_steps(const mc_optim *o) { return o->steps; }
void mc_optim_set_steps(mc_optim *o, int64_t steps) { o->steps = steps; }
