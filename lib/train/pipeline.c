/*
 * pipeline.c - pipeline parallelism's schedules: the micro-batches of one
 * iteration pass through the stages (one stage per pipeline rank), the
 * activations going forward to rank + 1 and their gradients back to
 * rank - 1 over MC_GROUP_PP, in Megatron's 1F1B order. See
 * doc/ARCHITECTURE.md, "Training".
 */
#include <stdlib.h>

#include "train/pipeline.h"

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

int mc_pipeline_slots(const mc_grid *g, int64_t num_micro)
{
    int64_t n = g->pp - g->pp_rank;
    return (int)(n < num_micro ? n : num_micro > 0 ? num_micro : 1);
}

typedef struct pipe {
    mc_model *m;
    const mc_grid *g;
    mc_backend *be;
    size_t n; /* activation elements */
    int first, last, slots, backward;
    float grad_scale;
    mc_pipe_batch_fn batch;
    void *ctx;
    double *acc;
    float *dout; /* the received output gradient */
} pipe;

static int slot_of(const pipe *p, int64_t k) { return (int)(k % p->slots); }

static mc_status recv_forward(pipe *p, int64_t k, mc_error *err)
{
    if (p->first) return MC_OK;
    return mc_recv(p->g, MC_GROUP_PP, p->be, mc_model_stage_input(p->m, slot_of(p, k)), p->n,
                   p->g->pp_rank - 1, err);
}

static mc_status send_forward(pipe *p, const float *out, mc_error *err)
{
    if (p->last) return MC_OK;
    return mc_send(p->g, MC_GROUP_PP, p->be, out, p->n, p->g->pp_rank + 1, err);
}

static mc_status recv_backward(pipe *p, mc_error *err)
{
    if (p->last) return MC_OK;
    return mc_recv(p->g, MC_GROUP_PP, p->be, p->dout, p->n, p->g->pp_rank + 1, err);
}

static mc_status send_backward(pipe *p, const float *din, mc_error *err)
{
    if (p->first) return MC_OK;
    return mc_send(p->g, MC_GROUP_PP, p->be, din, p->n, p->g->pp_rank - 1, err);
}

/* Receive into `in` from peer while sending `out` to the same peer. */
static mc_status exchange(pipe *p, const float *out, float *in, int peer, mc_error *err)
{
    mc_request *rq = NULL;
    TRY(mc_irecv(p->g, MC_GROUP_PP, p->be, in, p->n, peer, &rq, err));
    mc_status st = mc_send(p->g, MC_GROUP_PP, p->be, out, p->n, peer, err);
    mc_error e;
    mc_status ws = mc_wait(p->g, rq, st ? &e : err);
    return st ? st : ws;
}

static mc_status forward(pipe *p, int64_t k, const float **out, mc_error *err)
{
    const int32_t *tok = NULL, *tgt = NULL;
    double l;
    int64_t ntok;
    TRY(p->batch(p->ctx, k, &tok, &tgt, err));
    TRY(mc_model_forward(p->m, slot_of(p, k), tok, tgt, p->backward, p->grad_scale, out, &l, &ntok,
                         err));
    if (p->last) {
        p->acc[0] += l * (double)ntok;
        p->acc[1] += (double)ntok;
    }
    return MC_OK;
}

static mc_status run_interleaved(mc_model *m, const mc_grid *g, mc_backend *be, int64_t num_micro,
                                 int backward, float grad_scale, mc_pipe_batch_fn batch, void *ctx,
                                 double acc[2], mc_error *err);

mc_status mc_pipeline_run(mc_model *m, const mc_grid *g, mc_backend *be, int64_t num_micro,
                          int backward, float grad_scale, mc_pipe_batch_fn batch,
                          mc_pipe_last_fn last, void *ctx, double acc[2], mc_error *err)
{
    if (mc_model_num_chunks(m) > 1)
        return run_interleaved(m, g, be, num_micro, backward, grad_scale, batch, ctx, acc, err);
    pipe p = {m,
              g,
              be,
              mc_model_act_numel(m),
              mc_model_is_first_stage(m),
              mc_model_is_last_stage(m),
              1,
              backward,
              grad_scale,
              batch,
              ctx,
              acc,
              NULL};
    const float *out;
    if (!backward) {
        for (int64_t k = 0; k < num_micro; k++) {
            TRY(recv_forward(&p, k, err));
            TRY(forward(&p, k, &out, err));
            TRY(send_forward(&p, out, err));
        }
        return MC_OK;
    }
    p.slots = mc_pipeline_slots(g, num_micro);
    if (!p.last && !(p.dout = mc_balloc(be, p.n * sizeof(float), err)))
        return err ? err->code : MC_ERR_NOMEM;
    mc_status st = MC_OK;
    int64_t warm = g->pp - g->pp_rank - 1, fk = 0, bk = 0;
    if (warm > num_micro) warm = num_micro;
    int64_t rest = num_micro - warm;
    const float *din;
#define CHECK(call)                   \
    do {                              \
        if ((st = (call))) goto done; \
    } while (0)
    for (int64_t i = 0; i < warm; i++, fk++) {
        CHECK(recv_forward(&p, fk, err));
        CHECK(forward(&p, fk, &out, err));
        CHECK(send_forward(&p, out, err));
    }
    if (rest > 0) CHECK(recv_forward(&p, fk, err));
    for (int64_t i = 0; i < rest; i++) {
        CHECK(forward(&p, fk, &out, err));
        fk++;
        if (!p.last) CHECK(exchange(&p, out, p.dout, g->pp_rank + 1, err));
        if (bk + 1 == num_micro && last) last(ctx);
        CHECK(mc_model_backward(m, slot_of(&p, bk), p.dout, &din, err));
        bk++;
        if (i + 1 == rest)
            CHECK(send_backward(&p, din, err));
        else if (!p.first) /* the next input lands in the slot just retired */
            CHECK(exchange(&p, din, mc_model_stage_input(m, slot_of(&p, fk)), g->pp_rank - 1, err));
    }
    for (int64_t i = 0; i < warm; i++) {
        CHECK(recv_backward(&p, err));
        if (bk + 1 == num_micro && last) last(ctx);
        CHECK(mc_model_backward(m, slot_of(&p, bk), p.dout, &din, err));
        bk++;
        CHECK(send_backward(&p, din, err));
    }
#undef CHECK
done:
    if (p.dout) mc_bfree(be, p.dout);
    return st;
}

/* ------------------------------------------------ the interleaved schedule
 *
 * Megatron's forward_backward_pipelining_with_interleaving: each rank holds
 * v model chunks; virtual micro-batch j (of M v) is micro-batch
 * (j / (pp v)) pp + j mod pp in chunk (j mod pp v) / pp, backwards visiting
 * the chunks in reverse. Rank p runs W = 2 (pp - p - 1) + (v - 1) pp
 * warm-up forwards (all of them when M == pp, or forwards only), then
 * M v - W times "forward, backward", then the remaining backwards. After
 * each step every rank makes one exchange with both neighbours (ring:
 * the last rank's non-final chunks feed rank 0's next chunk), whose
 * presence on each side follows Megatron's recv_prev / recv_next rules, so
 * the two sides always agree; the receives are posted in the order
 * [from prev, from next] and the sends [to next, to prev], which keeps the
 * two messages of a step apart when prev == next (pp = 2).
 *
 * A received input waits in one staging buffer per chunk (Megatron keeps
 * at most one per chunk) and is copied into the micro-batch's slot at its
 * forward; the n-th forward (and backward) of a chunk is micro-batch n, so
 * received gradients go to dout[chunk][slot of the next micro-batch]. */

static int64_t pymod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

typedef struct ipipe {
    mc_model *m;
    const mc_grid *g;
    mc_backend *be;
    size_t n;
    int pp, rank, v, slots, backward, first, last;
    int64_t M;
    float grad_scale;
    mc_pipe_batch_fn batch;
    void *ctx;
    double *acc;
    float *buf;                      /* staging [v][n], then dout [v][slots][n] */
    int64_t nf[64], nb[64], nrb[64]; /* per chunk: forwards, backwards, gradients received */
} ipipe;

static int vchunk(const ipipe *p, int64_t j, int forward)
{
    int c = (int)(pymod(j, (int64_t)p->pp * p->v) / p->pp);
    return forward ? c : p->v - 1 - c;
}

static float *staging(ipipe *p, int c) { return p->buf + (size_t)c * p->n; }
static float *dout_of(ipipe *p, int c, int64_t k)
{
    return p->buf + ((size_t)p->v + (size_t)c * (size_t)p->slots + (size_t)(k % p->slots)) * p->n;
}

/* Megatron's W. */
static int64_t interleaved_warmup(const ipipe *p)
{
    int64_t total = p->M * p->v;
    if (!p->backward || p->M == p->pp) return total;
    int64_t w = 2 * (int64_t)(p->pp - p->rank - 1) + (int64_t)(p->v - 1) * p->pp;
    return w < total ? w : total;
}

int mc_pipeline_model_slots(const mc_model *m, const mc_grid *g, int64_t num_micro)
{
    int v = mc_model_num_chunks(m);
    if (v == 1) return mc_pipeline_slots(g, num_micro);
    /* Micro-batch k holds its slot from its chunk-0 forward to its chunk-0
     * backward, in order: replay the compute order and count. */
    ipipe p = {.pp = g->pp, .rank = g->pp_rank, .v = v, .M = num_micro, .backward = 1};
    int64_t total = num_micro * v, w = interleaved_warmup(&p), f0 = 0, b0 = 0, most = 1;
    for (int64_t t = 0; t < 2 * total; t++) {
        /* event t: forwards 0..w-1, then F(w+i) B(i) pairs, then backwards */
        int64_t fj = -1, bj = -1;
        if (t < w)
            fj = t;
        else if (t < w + 2 * (total - w)) {
            int64_t i = (t - w) / 2;
            if ((t - w) % 2 == 0)
                fj = w + i;
            else
                bj = i;
        } else
            bj = t - w - (total - w);
        if (fj >= 0 && vchunk(&p, fj, 1) == 0) f0++;
        if (fj >= 0 && f0 - b0 > most) most = f0 - b0;
        if (bj >= 0 && vchunk(&p, bj, 0) == 0) b0++;
    }
    return (int)most;
}

/* One step's exchange; NULL: nothing that way. */
static mc_status step_exchange(ipipe *p, const float *send_next, float *recv_prev,
                               const float *send_prev, float *recv_next, mc_error *err)
{
    int next = (p->rank + 1) % p->pp, prev = (p->rank + p->pp - 1) % p->pp;
    mc_request *rq[4] = {NULL, NULL, NULL, NULL};
    mc_status st = MC_OK;
    if (recv_prev) st = mc_irecv(p->g, MC_GROUP_PP, p->be, recv_prev, p->n, prev, &rq[0], err);
    if (!st && recv_next)
        st = mc_irecv(p->g, MC_GROUP_PP, p->be, recv_next, p->n, next, &rq[1], err);
    if (!st && send_next)
        st = mc_isend(p->g, MC_GROUP_PP, p->be, send_next, p->n, next, &rq[2], err);
    if (!st && send_prev)
        st = mc_isend(p->g, MC_GROUP_PP, p->be, send_prev, p->n, prev, &rq[3], err);
    for (int i = 0; i < 4; i++) {
        mc_error e;
        mc_status ws = mc_wait(p->g, rq[i], st ? &e : err);
        if (!st) st = ws;
    }
    return st;
}

/* Forward of virtual micro-batch j; *out NULL when nothing goes on. */
static mc_status forward_virtual(ipipe *p, int64_t j, const float **out, mc_error *err)
{
    int c = vchunk(p, j, 1);
    int64_t k = p->nf[c]++;
    int s = (int)(k % p->slots), cfirst = p->first && c == 0, clast = p->last && c == p->v - 1;
    if (!cfirst)
        mc_bcopy(p->be, mc_model_chunk_input(p->m, c, s), staging(p, c), p->n * sizeof(float));
    const int32_t *tok = NULL, *tgt = NULL;
    /* the tokens: the embeddings' chunk, and every chunk with document
     * resets (positions and segments are computed from them) */
    if (cfirst || clast || mc_model_doc_resets_on(p->m)) TRY(p->batch(p->ctx, k, &tok, &tgt, err));
    double l;
    int64_t ntok;
    TRY(mc_model_forward_chunk(p->m, c, s, tok, tgt, p->backward, p->grad_scale, out, &l, &ntok,
                               err));
    if (clast) {
        p->acc[0] += l * (double)ntok;
        p->acc[1] += (double)ntok;
        *out = NULL;
    }
    return MC_OK;
}

static mc_status backward_virtual(ipipe *p, int64_t j, const float **din, mc_error *err)
{
    int c = vchunk(p, j, 0);
    int64_t k = p->nb[c]++;
    int clast = p->last && c == p->v - 1;
    TRY(mc_model_backward_chunk(p->m, c, (int)(k % p->slots), clast ? NULL : dout_of(p, c, k), din,
                                err));
    if (p->first && c == 0) *din = NULL;
    return MC_OK;
}

/* Where the next gradient for chunk c lands. */
static float *next_dout(ipipe *p, int c) { return dout_of(p, c, p->nrb[c]++); }

static mc_status interleaved(ipipe *p, mc_error *err)
{
    int64_t total = p->M * p->v, w = interleaved_warmup(p), rest = total - w;
    int all_warm = p->backward && w == total;
    const float *out, *din;
    if (!p->first) TRY(step_exchange(p, NULL, staging(p, 0), NULL, NULL, err));
    for (int64_t k = 0; k < w; k++) {
        TRY(forward_virtual(p, k, &out, err));
        int nfc = vchunk(p, k + 1, 1);
        int recv_prev = !(p->first && nfc == 0) && k != total - 1;
        float *rp = recv_prev ? staging(p, nfc) : NULL;
        if (k == w - 1 && p->backward && !all_warm)
            TRY(step_exchange(p, out, rp, NULL, p->last ? NULL : next_dout(p, p->v - 1), err));
        else
            TRY(step_exchange(p, out, rp, NULL, NULL, err));
    }
    for (int64_t i = 0; i < rest; i++) {
        int64_t fk = i + w;
        TRY(forward_virtual(p, fk, &out, err));
        TRY(backward_virtual(p, i, &din, err));
        int recv_prev = 1, recv_next = 1, nfc, nbc;
        if (p->first) {
            nfc = vchunk(p, fk - (p->pp - 1), 1);
            if (nfc == p->v - 1) recv_prev = 0;
            nfc++;
        } else {
            nfc = vchunk(p, fk + 1, 1);
        }
        if (p->last) {
            nbc = vchunk(p, i - (p->pp - 1), 0);
            if (nbc == 0) recv_next = 0;
            nbc--;
        } else {
            nbc = vchunk(p, i + 1, 0);
        }
        if (i == rest - 1) recv_prev = 0;
        TRY(step_exchange(p, out, recv_prev ? staging(p, nfc) : NULL, din,
                          recv_next ? next_dout(p, nbc) : NULL, err));
    }
    if (!p->backward) return MC_OK;
    if (all_warm && !p->last) TRY(step_exchange(p, NULL, NULL, NULL, next_dout(p, p->v - 1), err));
    for (int64_t k = rest; k < total; k++) {
        TRY(backward_virtual(p, k, &din, err));
        int nbc = vchunk(p, k + 1, 0);
        int recv_next = !(p->last && nbc == p->v - 1) && k != total - 1;
        TRY(step_exchange(p, NULL, NULL, din, recv_next ? next_dout(p, nbc) : NULL, err));
    }
    return MC_OK;
}

static mc_status run_interleaved(mc_model *m, const mc_grid *g, mc_backend *be, int64_t num_micro,
                                 int backward, float grad_scale, mc_pipe_batch_fn batch, void *ctx,
                                 double acc[2], mc_error *err)
{
    int v = mc_model_num_chunks(m);
    if (num_micro % g->pp)
        return mc_error_set(err, MC_ERR_USAGE,
                            "the interleaved schedule needs the number of micro-batches (%lld) to "
                            "be a multiple of --pipeline-model-parallel-size (%d)",
                            (long long)num_micro, g->pp);
    if (v > 64) return mc_error_set(err, MC_ERR_LIMIT, "pipeline: %d model chunks (at most 64)", v);
    ipipe p = {.m = m,
               .g = g,
               .be = be,
               .n = mc_model_act_numel(m),
               .pp = g->pp,
               .rank = g->pp_rank,
               .v = v,
               .backward = backward,
               .first = mc_model_is_first_stage(m),
               .last = mc_model_is_last_stage(m),
               .M = num_micro,
               .grad_scale = grad_scale,
               .batch = batch,
               .ctx = ctx,
               .acc = acc};
    /* forwards only: everything in slot 0 (nothing is kept) */
    p.slots = backward ? mc_pipeline_model_slots(m, g, num_micro) : 1;
    if (backward) TRY(mc_model_set_slots(m, p.slots, err));
    size_t nbuf = (size_t)v + (backward ? (size_t)v * (size_t)p.slots : 0);
    if (!(p.buf = mc_balloc(be, nbuf * p.n * sizeof(float), err)))
        return err ? err->code : MC_ERR_NOMEM;
    mc_status st = interleaved(&p, err);
    mc_bfree(be, p.buf);
    return st;
}
