/*
 * pipeline.c - pipeline parallelism's schedules: the micro-batches of one
 * iteration pass through the stages (one stage per pipeline rank), the
 * activations [micro_batch, T or T/tp, hidden] going forward to rank + 1
 * and their gradients back to rank - 1 over MC_GROUP_PP.
 *
 * 1F1B, as Megatron's forward_backward_pipelining_without_interleaving:
 * stage p runs w = min(pp - p - 1, M) warm-up forwards, then M - w times
 * "forward one, backward the oldest", then the w remaining backwards, so
 * at most w + 1 = pp - p micro-batches are in flight (each in its own
 * activation slot, micro-batch k in slot k mod slots: they retire in
 * order). Exchanges that go both ways at once (send the output and receive
 * the next gradient; send the input gradient and receive the next input)
 * post the receive first (mc_irecv), then send (blocking), then wait, so two
 * neighbours sending to each other never wait on each other.
 */
#include <stdlib.h>

#include "train/pipeline.h"

#define TRY(call)                  \
    do {                           \
        mc_status st_ = (call);    \
        if (st_) return st_;       \
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
    size_t n;          /* activation elements */
    int first, last, slots, backward;
    float grad_scale;
    mc_pipe_batch_fn batch;
    void *ctx;
    double *acc;
    float *dout;       /* the received output gradient */
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
    TRY(mc_model_forward(p->m, slot_of(p, k), tok, tgt, p->backward, p->grad_scale, out, &l,
                         &ntok, err));
    if (p->last) {
        p->acc[0] += l * (double)ntok;
        p->acc[1] += (double)ntok;
    }
    return MC_OK;
}

mc_status mc_pipeline_run(mc_model *m, const mc_grid *g, mc_backend *be, int64_t num_micro,
                          int backward, float grad_scale, mc_pipe_batch_fn batch,
                          mc_pipe_last_fn last, void *ctx, double acc[2], mc_error *err)
{
    pipe p = {m, g, be, mc_model_act_numel(m), mc_model_is_first_stage(m),
              mc_model_is_last_stage(m), 1, backward, grad_scale, batch, ctx, acc, NULL};
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
#define CHECK(call)             \
    do {                        \
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
            CHECK(exchange(&p, din, mc_model_stage_input(m, slot_of(&p, fk)), g->pp_rank - 1,
                           err));
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
