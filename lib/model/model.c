/*
 * model.c - the decoder-only transformer's forward and backward pass for one
 * micro-batch, and the memory it keeps for them (activation slots, scratch).
 * Every tensor operation is a kern.h call; this file sequences them, places
 * Megatron's tensor- and sequence-parallel collectives, and runs one pipeline
 * stage or its virtual chunks. See doc/ARCHITECTURE.md, "The model".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* LM-head rows per chunk: bounds the logits buffer to chunk x V/tp floats
 * (256 x 50304 x 4 bytes = 51 MB for GPT-2) while keeping the GEMM wide. */
#define LM_CHUNK_ROWS 256

/* What a layer keeps for its backward, by groups of mc_layer_acts's
 * tensors (mc_model.rc_keep); the rest lives in a workspace layer. */
/* Layer a's tensors in `bits` carved from cv, the others those of the
 * workspace layer ws (NULL: none). */
static void carve_layer(mc_model *m, carver *cv, mc_layer_acts *a, unsigned bits,
                        const mc_layer_acts *ws)
{
    size_t N = m->N, C = m->C, D = m->D, Nl = m->Nl;
    int ln = m->cfg.normalization == MC_NORM_LAYERNORM;
    static const mc_layer_acts none;
    if (!ws) ws = &none;
    *a = *ws;
    if (bits & MC_ACT_RES) a->res = carve(cv, Nl * C);
    if (bits & MC_ACT_LN1) {
        a->ln1 = carve(cv, Nl * C);
        a->ln1_mean = ln ? carve(cv, Nl) : NULL;
        a->ln1_rstd = carve(cv, Nl);
    }
    if (bits & MC_ACT_QKV) {
        a->q = carve(cv, N * m->Ql * D);
        a->k = carve(cv, N * m->Gl * D);
        a->v = carve(cv, N * m->Gl * D);
        if (m->cfg.qk_layernorm) { /* plan.c's layer_bytes counts the same */
            a->qp = carve(cv, N * m->Ql * D);
            a->kp = carve(cv, N * m->Gl * D);
            a->qn_mean = ln ? carve(cv, N * m->Ql) : NULL;
            a->qn_rstd = carve(cv, N * m->Ql);
            a->kn_mean = ln ? carve(cv, N * m->Gl) : NULL;
            a->kn_rstd = carve(cv, N * m->Gl);
        }
    }
    if (bits & MC_ACT_ATT) {
        a->att = carve(cv, N * m->Ql * D);
        a->lse = carve(cv, N * m->Ql);
    }
    if (bits & MC_ACT_RES2) a->res2 = carve(cv, Nl * C);
    if (bits & MC_ACT_LN2) {
        a->ln2 = carve(cv, Nl * C);
        a->ln2_mean = ln ? carve(cv, Nl) : NULL;
        a->ln2_rstd = carve(cv, Nl);
    }
    if (bits & MC_ACT_FC1) a->fc1 = carve(cv, N * m->fc1_out);
    if (bits & MC_ACT_ACT) a->act = carve(cv, N * m->Fl);
    if (bits & MC_ACT_MOE_ALL)
        mc_moe_layout(m, cv, a,
                      (bits & MC_ACT_MOE ? MC_MOE_ACTS_ROUTE : 0u) |
                          (bits & MC_ACT_MOE_ACT ? MC_MOE_ACTS_ACT : 0u) |
                          (bits & MC_ACT_SHARED ? MC_MOE_ACTS_SHARED : 0u));
}

/* The attention backward's gradients d(att), d(q), d(k), d(v) of a dense
 * layer: in the layer's own fc1 and act tensors (n0 and n1 floats at r0
 * and r1), which the MLP's backward has consumed by then, each piece in
 * the first that still has room, 64-byte aligned. Returns 0 when they do
 * not fit (the scratch then holds them; plan.c's grads_fit is the same
 * test). r0 and r1 NULL: only the test. */
static int place_attn_grads(const mc_model *m, float *r0, size_t n0, float *r1, size_t n1,
                            float **out)
{
    size_t nq = m->N * m->Ql * m->D, nk = m->N * m->Gl * m->D;
    size_t sz[4] = {nq, nq, nk, nk}, cap[2] = {n0, n1}, used[2] = {0, 0};
    float *base[2] = {r0, r1};
    int r = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = (sz[i] + 15) / 16 * 16;
        while (r < 2 && used[r] + sz[i] > cap[r]) r++;
        if (r == 2) return 0;
        if (out) out[i] = base[r] ? base[r] + used[r] : NULL;
        used[r] += n;
    }
    return 1;
}

/* The bytes carve() takes for n floats. */
static size_t carved_bytes(size_t n) { return (n * sizeof(float) + 63) / 64 * 64; }

/* Whether the compact workspace of full recomputation (plan_recompute,
 * layout_acts, layer_bwd; plan.c's compact_fits is the same test) fits a
 * dense layer's shapes: the attention's four gradients in fc1's memory
 * alone; the forward's qkv output and the row-parallel [N, C] outputs in
 * fc1's (both dead by the time fc1 is made); a norm's output with an
 * [N, C] input gradient after it in act's memory and in fc1's; d(qkv) in
 * act's. */
static int compact_fits(const mc_model *m)
{
    size_t f1 = m->N * m->fc1_out * sizeof(float), fa = m->N * m->Fl * sizeof(float);
    size_t ln_dln = carved_bytes(m->Nl * m->C) + carved_bytes(m->N * m->C);
    size_t qkv = carved_bytes(m->N * m->qkv_out);
    return ln_dln <= fa && ln_dln <= f1 && qkv <= fa && qkv <= f1 &&
           place_attn_grads(m, NULL, m->N * m->fc1_out, NULL, 0, NULL);
}

static void layout_acts(mc_model *m, carver *cv)
{
    size_t N = m->N, C = m->C, D = m->D, Nl = m->Nl;
    int ln = m->cfg.normalization == MC_NORM_LAYERNORM;
    size_t off0 = cv->off, off_att = 0;
    if (m->rc_compact) {
        /* one workspace layer without norm outputs of its own: in the
         * forward ln1 and ln2 live in act's memory (each dead before act is
         * made); layer_bwd remakes them where it needs them */
        mc_layer_acts att, *w = &m->rc_ws[0];
        carve_layer(m, cv, &att, MC_ACT_QKV | MC_ACT_ATT, NULL);
        off_att = cv->off - off0;
        carve_layer(m, cv, w, MC_ACT_RES2 | MC_ACT_FC1 | MC_ACT_ACT, &att);
        w->ln1_mean = ln ? carve(cv, Nl) : NULL;
        w->ln1_rstd = carve(cv, Nl);
        w->ln2_mean = ln ? carve(cv, Nl) : NULL;
        w->ln2_rstd = carve(cv, Nl);
        w->ln1 = w->ln2 = w->act;
    } else {
        for (int j = 0; j < m->rc_nws; j++) carve_layer(m, cv, &m->rc_ws[j], m->rc_wsbits[j], NULL);
    }
    size_t off_ws = cv->off;
    /* The head's overlay on the compact workspace, with one slot on the
     * last stage: after the forward's last layer nothing in the workspace
     * is needed until the backward recomputes that layer, so the final
     * norm's input (the last layer's output, written while only its res2
     * and act and the row-parallel output in fc1's memory are live: it goes
     * into the dead q ... lse), the final norm, d(lnf), the logits chunk
     * and the head's input gradient live there (plan.c's the same test). */
    size_t ov_bytes = 3 * carved_bytes(Nl * C) + (ln ? 2 : 1) * carved_bytes(Nl) +
                      carved_bytes(m->chunk_rows * (size_t)m->vl) + carved_bytes(N * C);
    int overlay = m->rc_compact && m->last_stage && m->nchunks == 1 && m->nslots == 1 &&
                  carved_bytes(Nl * C) <= off_att && ov_bytes <= off_ws - off0;
    carver ov = {cv->base, off0};
    for (int s = 0; s < m->nslots; s++) {
        mc_slot *sl = &m->slots[s];
        for (int c = 0; c < m->nchunks; c++)
            for (int l = m->cl0[c]; l < m->cl1[c]; l++) {
                /* (the MLP's two groups are carved together, fc1 then act) */
                int li = m->lidx[l];
                int j = m->rc_g0[li] >= 0 ? l - m->rc_g0[li] : 0;
                mc_layer_acts *a = &sl->acts[li];
                carve_layer(m, cv, a, m->rc_keep[li], m->rc_nws ? &m->rc_ws[j] : NULL);
                if (m->lp[l].moe) /* the MoE block's own (moe.c) instead of the MLP's */
                    a->fc1 = a->act = NULL;
                else
                    memset(&a->moe, 0, sizeof a->moe);
            }
        carver *h = overlay ? &ov : cv;
        sl->res_out = carve(h, (size_t)m->nchunks * Nl * C);
        if (m->last_stage) {
            sl->lnf = carve(h, Nl * C);
            sl->lnf_mean = ln ? carve(h, Nl) : NULL;
            sl->lnf_rstd = carve(h, Nl);
            sl->dhead = carve(h, Nl * C);
        }
        sl->tokens = (int32_t *)carve(cv, N);
        sl->targets = (int32_t *)carve(cv, N);
        sl->pos = (int32_t *)carve(cv, N);
        sl->seg = (int32_t *)carve(cv, N);
        sl->pos_loc = (int32_t *)carve(cv, Nl);
    }
    size_t off_slots = cv->off;
    /* the forward's qkv output, in the backward d(qkv); the row-parallel
     * outputs: in the compact workspace's fc1 memory */
    if (m->rc_compact) {
        m->qkv = m->tmp = m->rc_ws[0].fc1;
    } else {
        m->qkv = carve(cv, N * m->qkv_out);
        m->tmp = carve(cv, N * C);
    }
    m->dres = carve(cv, Nl * C);
    m->dln = carve(overlay ? &ov : cv, N * C);
    if (m->sp) {
        m->gath = carve(cv, N * C);
        m->sp_buf = carve(cv, N * C);
        m->loc = carve(cv, Nl * C);
        m->nrm_g = carve(cv, 2 * C);
    }
    if (m->cfg.qk_layernorm) {
        m->dkp = carve(cv, N * m->Gl * D);
        m->qk_g = carve(cv, 4 * D);
    }
    if (m->cfg.num_experts > 0) mc_moe_layout_scratch(m, cv);
    /* d(act) is made in act's place, d(fc1) in fc1's; the attention's
     * gradients go into a dense layer's fc1 and act (place_attn_grads),
     * here only for MoE models or where they do not fit */
    m->attn_grads_in_layer = m->cfg.num_experts == 0 &&
                             place_attn_grads(m, NULL, N * m->fc1_out, NULL, N * m->Fl, NULL);
    m->datt = m->dq = m->dk = m->dv = NULL;
    if (!m->attn_grads_in_layer) {
        m->datt = carve(cv, N * m->Ql * D);
        m->dq = carve(cv, N * m->Ql * D);
        m->dk = carve(cv, N * m->Gl * D);
        m->dv = carve(cv, N * m->Gl * D);
    }
    m->logits = carve(overlay ? &ov : cv, m->chunk_rows * (size_t)m->vl);
    m->rowmax = carve(cv, N);
    m->sumexp = carve(cv, N);
    m->tlogit = carve(cv, N);
    m->loss = carve(cv, N);
    m->act_ws = off_ws - off0;
    m->act_kept = (off_slots - off_ws) / (size_t)m->nslots; /* the slots are alike */
    m->act_scratch = cv->off - off_slots;
}

/* Which layers recomputation touches (cfg.recompute_*), per model chunk
 * as Megatron's TransformerBlock does: full uniform makes groups of N
 * layers from each chunk's first, the last one shorter; full block
 * recomputes the first N layers of each chunk, each on its own; selective
 * drops the named modules' tensors of every layer. Workspace layer j
 * holds what any layer that runs in it does not keep (a MoE layer's block
 * or a dense layer's MLP, or both where both kinds run there). */
static mc_status plan_recompute(mc_model *m, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    size_t nl = (size_t)m->nlocal + 1;
    m->rc_g0 = malloc(nl * sizeof *m->rc_g0);
    m->rc_g1 = malloc(nl * sizeof *m->rc_g1);
    m->rc_keep = malloc(nl * sizeof *m->rc_keep);
    int full = c->recompute_granularity == MC_RECOMPUTE_FULL, N = c->recompute_num_layers;
    m->rc_nws = full ? (c->recompute_method == MC_RECOMPUTE_UNIFORM ? N : 1)
                     : c->recompute_granularity == MC_RECOMPUTE_SELECTIVE;
    m->rc_ws = calloc((size_t)m->rc_nws + 1, sizeof *m->rc_ws);
    m->rc_wsbits = calloc((size_t)m->rc_nws + 1, sizeof *m->rc_wsbits);
    if (!m->rc_g0 || !m->rc_g1 || !m->rc_keep || !m->rc_ws || !m->rc_wsbits)
        return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    int sel = c->recompute_granularity == MC_RECOMPUTE_SELECTIVE;
    for (int k = 0; k < m->nchunks; k++)
        for (int l = m->cl0[k]; l < m->cl1[k]; l++) {
            int li = m->lidx[l], i = l - m->cl0[k], j = 0;
            unsigned has = mc_recompute_layer_has(m->lp[l].moe);
            m->rc_g0[li] = m->rc_g1[li] = -1;
            m->rc_keep[li] = has &
                             ~(sel ? mc_recompute_dropped(c->recompute_modules, m->lp[l].moe) : 0u);
            if (full && !(c->recompute_method == MC_RECOMPUTE_BLOCK && i >= N)) {
                int g0 = c->recompute_method == MC_RECOMPUTE_BLOCK ? l : m->cl0[k] + i / N * N;
                int g1 = c->recompute_method == MC_RECOMPUTE_BLOCK ? l + 1 : g0 + N;
                m->rc_g0[li] = g0;
                m->rc_g1[li] = g1 < m->cl1[k] ? g1 : m->cl1[k];
                m->rc_keep[li] = l == g0 ? MC_ACT_RES : 0u;
                j = l - g0;
            }
            if (m->rc_nws) m->rc_wsbits[j] |= has & ~m->rc_keep[li];
        }
    /* The compact workspace (layout_acts): full recomputation of every
     * layer on its own (uniform 1, or block covering each chunk), dense,
     * without context parallelism, where the shapes fit */
    m->rc_compact = full && c->num_experts == 0 && m->grid.cp == 1 && compact_fits(m);
    for (int l = 0; l < c->num_layers && m->rc_compact; l++)
        if (m->lidx[l] >= 0 && (m->rc_g0[m->lidx[l]] != l || m->rc_g1[m->lidx[l]] != l + 1))
            m->rc_compact = 0;
    return MC_OK;
}

/* (Re)allocate the slots and the activation block for nslots. */
static mc_status alloc_acts(mc_model *m, int nslots, mc_error *err)
{
    if (m->act_block) mc_bfree(m->be, m->act_block);
    m->act_block = NULL;
    if (m->slots) free(m->slots[0].acts);
    free(m->slots);
    m->nslots = nslots;
    size_t nl = (size_t)m->nlocal;
    m->slots = calloc((size_t)nslots, sizeof *m->slots);
    mc_layer_acts *acts = m->slots ? calloc((size_t)nslots * nl + 1, sizeof *acts) : NULL;
    if (!acts) {
        free(m->slots);
        m->slots = NULL;
        return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    }
    for (int s = 0; s < nslots; s++) m->slots[s].acts = acts + (size_t)s * nl;
    carver cv = {NULL, 0};
    layout_acts(m, &cv);
    cv.base = mc_balloc(m->be, cv.off, err);
    if (!cv.base) return err ? err->code : MC_ERR_NOMEM;
    m->act_block = cv.base;
    cv.off = 0;
    layout_acts(m, &cv);
    /* the MoE layers' host row counts, E per layer and slot */
    free(m->moe_rows_host);
    m->moe_rows_host = NULL;
    if (m->cfg.num_experts > 0) {
        size_t E = (size_t)m->cfg.num_experts;
        m->moe_rows_host = calloc((size_t)nslots * nl * 2 * E + 1, sizeof *m->moe_rows_host);
        if (!m->moe_rows_host) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
        for (int s = 0; s < nslots; s++)
            for (size_t l = 0; l < nl; l++) {
                mc_moe_acts *x = &m->slots[s].acts[l].moe;
                x->rows = m->moe_rows_host + ((size_t)s * nl + l) * 2 * E;
                x->xrows = x->rows + E;
            }
    }
    return MC_OK;
}

mc_status mc_model_new(const mc_model_config *c, const mc_grid *g, mc_backend *be, int micro_batch,
                       mc_prec prec, mc_model **out, mc_error *err)
{
    *out = NULL;
    if (micro_batch < 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "model: --micro-batch-size must be at least 1 (got %d)", micro_batch);
    mc_model *m = calloc(1, sizeof *m);
    if (!m) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    m->cfg = *c;
    m->grid = *g;
    m->be = be;
    m->B = micro_batch;
    m->prec = prec;
    mc_status st = mc_model_config_finish(&m->cfg, g->tp, err);
    if (st) goto fail;
    if (m->cfg.num_experts > 0 && strcmp(mc_backend_name(be), "cpu")) {
        st = mc_error_set(err, MC_ERR_USAGE,
                          "--num-experts on the %s backend is not implemented yet (the MoE "
                          "kernels are CPU-only): use --device cpu",
                          mc_backend_name(be));
        goto fail;
    }
    st = mc_model_num_chunks_for(&m->cfg, g->pp, &m->nchunks, err);
    if (st) goto fail;
    m->cl0 = calloc((size_t)m->nchunks, sizeof *m->cl0);
    m->cl1 = calloc((size_t)m->nchunks, sizeof *m->cl1);
    m->lidx = malloc((size_t)m->cfg.num_layers * sizeof *m->lidx + 1);
    if (!m->cl0 || !m->cl1 || !m->lidx) {
        st = mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (int l = 0; l < m->cfg.num_layers; l++) m->lidx[l] = -1;
    for (int c = 0; c < m->nchunks; c++) {
        st = mc_model_chunk_layers(&m->cfg, g->pp, g->pp_rank, c, &m->cl0[c], &m->cl1[c], err);
        if (st) goto fail;
        for (int l = m->cl0[c]; l < m->cl1[c]; l++) m->lidx[l] = m->nlocal++;
    }
    m->first_stage = g->pp_rank == 0;
    m->last_stage = g->pp_rank == g->pp - 1;
    st = mc_model_build_registry(m, err);
    if (st) goto fail;

    const mc_model_config *k = &m->cfg;
    size_t tp = (size_t)g->tp;
    m->T = (size_t)k->seq_length / (size_t)g->cp; /* context parallelism: this rank's rows */
    m->N = (size_t)micro_batch * m->T;
    m->C = (size_t)k->hidden_size;
    m->D = (size_t)k->kv_channels;
    m->Ql = (size_t)k->num_attention_heads / tp;
    m->Gl = (size_t)k->num_query_groups / tp;
    m->Fl = (size_t)k->ffn_hidden_size / tp;
    m->fc1_out = k->swiglu ? 2 * m->Fl : m->Fl;
    m->qkv_out = (m->Ql + 2 * m->Gl) * m->D;
    m->vl = k->padded_vocab_size / g->tp;
    m->v0 = m->vl * g->tp_rank;
    m->chunk_rows = m->N < LM_CHUNK_ROWS ? m->N : LM_CHUNK_ROWS;
    /* config_finish checked seq_length % tp when sequence_parallel */
    m->sp = k->sequence_parallel && g->tp > 1;
    m->etp = k->moe_expert_tensor_parallel > 1 && g->tp > 1; /* config_finish: it divides tp */
    m->etpn = m->etp ? k->moe_expert_tensor_parallel : 1;
    if (m->etp && mc_grid_group_size(&m->grid, MC_GROUP_ETP) != m->etpn) {
        st = mc_error_set(err, MC_ERR_USAGE,
                          "model: --expert-tensor-parallel-size %d but the grid's expert "
                          "tensor-parallel groups have %d ranks (mc_grid_set_etp)",
                          m->etpn, mc_grid_group_size(&m->grid, MC_GROUP_ETP));
        goto fail;
    }
    m->Tl = m->sp ? m->T / tp : m->T;
    m->Nl = (size_t)micro_batch * m->Tl;
    if (g->cp > 1 && (st = mc_model_cp_new(m, k->cp_comm_type, err))) goto fail;
    m->hpos = malloc(m->N * sizeof *m->hpos);
    m->hseg = malloc(m->N * sizeof *m->hseg);
    m->hpos_loc = malloc(m->Nl * sizeof *m->hpos_loc);
    if (!m->hpos || !m->hseg || !m->hpos_loc) {
        st = mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
        goto fail;
    }

    m->p = mc_balloc(be, m->numel * sizeof(float), err);
    if (!m->p) goto nomem;
    m->g = mc_balloc(be, m->numel * sizeof(float), err);
    if (!m->g) goto nomem;
    m->pw_bytes = mc_backend_weight_bytes(be, prec);
    if (m->pw_bytes) {
        m->pw = mc_balloc(be, m->numel * m->pw_bytes, err);
        if (!m->pw) goto nomem;
    }
    const char *per_gemm = getenv("MC_TEST_ROUND_PER_GEMM");
    m->per_gemm = per_gemm && !strcmp(per_gemm, "1");
    m->round_acts = m->pw_bytes == 4 && !m->cfg.fp8 && !m->per_gemm;
    if (m->pw && !(m->pw_ok = calloc(m->nparams + 1, 1))) goto nomem;
    if ((st = mc_model_check_recompute(&m->cfg, g->pp, err)) || (st = plan_recompute(m, err)))
        goto fail;
    if (alloc_acts(m, 1, err)) goto nomem;
    if ((st = mc_model_fp8_new(m, err))) goto fail;
    *out = m;
    return MC_OK;
nomem:
    st = err ? err->code : MC_ERR_NOMEM;
    mc_error_prefix(err, "model: %lld parameters, micro-batch %d x %d", (long long)m->global_numel,
                    micro_batch, k->seq_length);
fail:
    mc_model_free(m);
    return st;
}

void mc_model_free(mc_model *m)
{
    if (!m) return;
    mc_model_kd_free(m);
    mc_model_cp_free(m);
    mc_model_fp8_free(m);
    if (m->act_block) mc_bfree(m->be, m->act_block);
    if (m->p) mc_bfree(m->be, m->p);
    if (m->g) mc_bfree(m->be, m->g);
    if (m->pw) mc_bfree(m->be, m->pw);
    free(m->pw_ok);
    if (m->slots) free(m->slots[0].acts);
    free(m->slots);
    free(m->lp);
    free(m->cl0);
    free(m->cl1);
    free(m->lidx);
    free(m->rc_g0);
    free(m->rc_g1);
    free(m->rc_keep);
    free(m->rc_ws);
    free(m->rc_wsbits);
    free(m->params);
    free(m->hpos);
    free(m->hseg);
    free(m->hpos_loc);
    free(m->hlogp);
    free(m->hdlogp);
    free(m->moe_rows_host);
    free(m->moe_tpe);
    free(m->moe_lb_layer);
    free(m);
}

const mc_model_config *mc_model_get_config(const mc_model *m) { return &m->cfg; }

void mc_model_hold_weights(mc_model *m, int on)
{
    m->pw_hold = on && m->pw && !m->per_gemm;
    if (m->pw_hold) memset(m->pw_ok, m->pw_synced, m->nparams);
    if (!on) m->pw_synced = 0;
}

void *mc_model_prepared_weights(mc_model *m, size_t *bytes, mc_prec *prec)
{
    *bytes = m->pw_bytes;
    *prec = m->prec;
    return m->per_gemm ? NULL : m->pw;
}

void mc_model_weights_prepared(mc_model *m) { m->pw_synced = m->pw && !m->per_gemm; }

/* the global index of a layer's parameters */
static int lp_layer(const mc_model *m, const mc_layer_params *lp) { return (int)(lp - m->lp); }

/* (re)make parameter i's prepared form from its fp32 values: a linear
 * weight's with its columns (mc_k_prepare_weight), the experts' (read by the
 * grouped GEMM) and the vectors' elementwise */
static void round_weight(mc_model *m, int i)
{
    if (i < 0 || !m->pw) return;
    if (m->pw_hold) {
        if (m->pw_ok[i]) return; /* prepared since the hold began */
        m->pw_ok[i] = 1;
    }
    const mc_param *p = &m->params[i];
    mc_k_prepare_weight(m->be, m->prec, (char *)m->pw + p->offset * m->pw_bytes, param_val(m, i),
                        p->numel, mc_param_prepared_cols(p));
}

void model_prepare_weights(mc_model *m)
{
    for (size_t i = 0; m->pw && i < m->nparams; i++) round_weight(m, (int)i);
}

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

/* the precision an activation only linear layers read is rounded to where
 * it is made (m->round_acts), MC_PREC_FP32 where the GEMMs round it */
static mc_prec act_round(const mc_model *m) { return m->round_acts ? m->prec : MC_PREC_FP32; }

/* the exact bits for a linear layer's input made with act_round */
static unsigned exact_x(const mc_model *m) { return m->round_acts ? MC_LIN_EXACT_X : 0; }

/* MC_LIN_DOUT_SCRATCH for a linear layer's backward whose output gradient
 * nothing reads after it (d(fc1), d(qkv)): rounded in place (emulated
 * precisions) rather than copied; not under MC_TEST_ROUND_PER_GEMM, the
 * reference that rounds at every GEMM */
static unsigned dout_scratch(const mc_model *m) { return m->per_gemm ? 0 : MC_LIN_DOUT_SCRATCH; }

/* out = the norm of x's Nl rows, rounded to `round` (act_round, or
 * MC_PREC_FP32) */
static void norm_fwd(mc_model *m, float *out, float *mean, float *rstd, const float *x, int w,
                     int b, mc_prec round)
{
    if (m->cfg.normalization == MC_NORM_LAYERNORM)
        mc_k_layernorm_fwd(m->be, out, mean, rstd, x, param_val(m, w), param_val(m, b), m->Nl, m->C,
                           m->cfg.norm_epsilon, round);
    else
        mc_k_rmsnorm_fwd(m->be, out, rstd, x, param_val(m, w), m->Nl, m->C, m->cfg.norm_epsilon,
                         round);
}

/* With sequence parallelism the weight and bias gradients of this rank's
 * rows are partial: they go to a scratch, are summed over the group and
 * then added. */
static mc_status norm_bwd(mc_model *m, float *dx, const float *dout, const float *x,
                          const float *mean, const float *rstd, int w, int b, mc_error *err)
{
    mc_backend *be = m->be;
    size_t C = m->C, nb = b >= 0 ? 2 * C : C;
    float *dw = m->sp ? m->nrm_g : param_grad(m, w);
    float *db = b < 0 ? NULL : m->sp ? m->nrm_g + C : param_grad(m, b);
    if (m->sp) mc_k_fill(be, m->nrm_g, 0.0f, nb);
    if (m->cfg.normalization == MC_NORM_LAYERNORM)
        mc_k_layernorm_bwd(be, dx, dw, db, dout, x, param_val(m, w), mean, rstd, m->Nl, C);
    else
        mc_k_rmsnorm_bwd(be, dx, dw, dout, x, param_val(m, w), rstd, m->Nl, C);
    if (!m->sp) return MC_OK;
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, m->nrm_g, nb, err));
    mc_k_acc(be, param_grad(m, w), m->nrm_g, C);
    if (b >= 0) mc_k_acc(be, param_grad(m, b), m->nrm_g + C, C);
    return MC_OK;
}

/* Sequence-parallel gather: *full = the [N, C] rows of the whole
 * micro-batch from every rank's [Nl, C] chunk (into m->gath). Without
 * sequence parallelism the rows are all here: *full = local. */
mc_status mc_model_tp_gather(mc_model *m, const float *local, const float **full, mc_error *err)
{
    if (!m->sp) {
        *full = local;
        return MC_OK;
    }
    size_t B = (size_t)m->B, C = m->C, T = m->T, Tl = m->Tl, n = m->Nl * C;
    int tp = m->grid.tp;
    *full = m->gath;
    if (B == 1) /* [tp][Tl][C] is [T][C] */
        return mc_allgather(&m->grid, MC_GROUP_TP, m->be, local, m->gath, n, err);
    TRY(mc_allgather(&m->grid, MC_GROUP_TP, m->be, local, m->sp_buf, n, err));
    /* rank r's sequence b, [r][b][Tl][C], goes to rows b T + r Tl */
    for (int r = 0; r < tp; r++)
        for (size_t b = 0; b < B; b++)
            mc_bcopy(m->be, m->gath + (b * T + (size_t)r * Tl) * C,
                     m->sp_buf + ((size_t)r * B + b) * Tl * C, Tl * C * sizeof(float));
    return MC_OK;
}

/* Sum partial [N, C] rows over the group (full is overwritten): without
 * sequence parallelism an all-reduce in place, *out = full; with it a
 * reduce-scatter to this rank's [Nl, C] chunk in `local`, *out = local. */
mc_status mc_model_tp_reduce(mc_model *m, float *full, float *local, float **out, mc_error *err)
{
    if (!m->sp) {
        *out = full;
        return mc_allreduce_sum(&m->grid, MC_GROUP_TP, m->be, full, m->N * m->C, err);
    }
    size_t B = (size_t)m->B, C = m->C, T = m->T, Tl = m->Tl, n = m->Nl * C;
    int tp = m->grid.tp;
    *out = local;
    if (B == 1) return mc_reduce_scatter_sum(&m->grid, MC_GROUP_TP, m->be, full, local, n, err);
    /* rows b T + r Tl go to [r][b][Tl][C]: rank r's block is contiguous */
    for (int r = 0; r < tp; r++)
        for (size_t b = 0; b < B; b++)
            mc_bcopy(m->be, m->sp_buf + ((size_t)r * B + b) * Tl * C,
                     full + (b * T + (size_t)r * Tl) * C, Tl * C * sizeof(float));
    return mc_reduce_scatter_sum(&m->grid, MC_GROUP_TP, m->be, m->sp_buf, local, n, err);
}

/* Row-parallel linear: *out = x W^T, summed over the tp group, plus the
 * replicated bias once: [N, C] in m->tmp, or this rank's [Nl, C] chunk
 * of it in m->loc with sequence parallelism. */
static mc_status row_parallel_fwd(mc_model *m, int l, int which, float **out, const float *x, int w,
                                  int b, size_t I, unsigned exact, mc_error *err)
{
    const float *bias = m->grid.tp_rank == 0 ? param_val(m, b) : NULL;
    mc_model_lin_fwd(m, l, which, m->tmp, x, w, bias, m->N, I, m->C, exact);
    return mc_model_tp_reduce(m, m->tmp, m->loc, out, err);
}

/* The parts of a layer's forward, each a function of what it reads, so a
 * part run again (recomputation) gives the same bits. ln1 is read by the
 * QKV projection alone, ln2 by fc1 (dense MLP; the MoE router and experts
 * read it unrounded): act_round. */
static void norm1_make(mc_model *m, float *ln1, mc_layer_acts *a, const mc_layer_params *lp)
{
    norm_fwd(m, ln1, a->ln1_mean, a->ln1_rstd, a->res, lp->ln1_w, lp->ln1_b, act_round(m));
}

static void norm1_fwd(mc_model *m, mc_layer_acts *a, const mc_layer_params *lp)
{
    norm1_make(m, a->ln1, a, lp);
}

static void norm2_fwd(mc_model *m, mc_layer_acts *a, const mc_layer_params *lp)
{
    norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, lp->ln2_w, lp->ln2_b,
             lp->moe ? MC_PREC_FP32 : act_round(m));
}

/* --qk-layernorm's backward (mc_model_qk_norm): dx = d(x) (WRITTEN), the weight's and bias's
 * gradients added to dw, db. */
static void qk_norm_bwd(mc_model *m, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *mean, const float *rstd, size_t rows, int w)
{
    mc_k_fill(m->be, dx, 0.0f, rows * m->D);
    if (m->cfg.normalization == MC_NORM_LAYERNORM)
        mc_k_layernorm_bwd(m->be, dx, dw, db, dout, x, param_val(m, w), mean, rstd, rows, m->D);
    else
        mc_k_rmsnorm_bwd(m->be, dx, dw, dout, x, param_val(m, w), rstd, rows, m->D);
}

/* The gradients of the query and key norms of layer lp from d(q), d(k)
 * after RoPE's backward (normed side); *dq, *dk become the gradients of q
 * and k before their norms (m->datt and m->dkp). The heads are split over
 * tensor parallelism and the weights replicated: each rank's sums are
 * partial, summed over the group before they are added. */
static mc_status qk_norm_bwd_layer(mc_model *m, const mc_layer_acts *a, const mc_layer_params *lp,
                                   float **dq, float **dk, mc_error *err)
{
    size_t D = m->D, nq = m->N * m->Ql, nk = m->N * m->Gl;
    int tp = m->grid.tp > 1, ln = lp->qn_b >= 0;
    float *g = m->qk_g;
    if (tp) mc_k_fill(m->be, g, 0.0f, 4 * D);
    /* with tp: the partial sums in g [q w, q b, k w, k b], else the gradients */
    float *qw = tp ? g : param_grad(m, lp->qn_w), *kw = tp ? g + 2 * D : param_grad(m, lp->kn_w);
    float *qb = tp ? g + D : param_grad(m, lp->qn_b),
          *kb = tp ? g + 3 * D : param_grad(m, lp->kn_b);
    if (!ln) qb = kb = NULL;
    qk_norm_bwd(m, m->datt, qw, qb, *dq, a->qp, a->qn_mean, a->qn_rstd, nq, lp->qn_w);
    qk_norm_bwd(m, m->dkp, kw, kb, *dk, a->kp, a->kn_mean, a->kn_rstd, nk, lp->kn_w);
    *dq = m->datt;
    *dk = m->dkp;
    if (!tp) return MC_OK;
    TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, m->be, g, 4 * D, err));
    mc_k_acc(m->be, param_grad(m, lp->qn_w), g, D);
    mc_k_acc(m->be, param_grad(m, lp->kn_w), g + 2 * D, D);
    if (ln) {
        mc_k_acc(m->be, param_grad(m, lp->qn_b), g + D, D);
        mc_k_acc(m->be, param_grad(m, lp->kn_b), g + 3 * D, D);
    }
    return MC_OK;
}

/* q, k, v = split(ln1 Wqkv^T + b) (ln1 gathered), with --qk-layernorm q
 * and k normed, RoPE applied */
static mc_status qkv_fwd(mc_model *m, mc_slot *sl, mc_layer_acts *a, const mc_layer_params *lp,
                         mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    size_t N = m->N, B = (size_t)m->B, T = m->T, C = m->C, D = m->D;
    const float *h;
    TRY(mc_model_tp_gather(m, a->ln1, &h, err));
    mc_model_lin_fwd(m, lp_layer(m, lp), MC_LIN_QKV, m->qkv, h, lp->qkv_w, param_val(m, lp->qkv_b),
                     N, C, m->qkv_out, exact_x(m));
    if (c->qk_layernorm) {
        mc_k_qkv_split(m->be, a->qp, a->kp, a->v, m->qkv, N, m->Ql, m->Gl, D);
        mc_model_qk_norm(m, a->q, a->qn_mean, a->qn_rstd, a->qp, N * m->Ql, lp->qn_w, lp->qn_b);
        mc_model_qk_norm(m, a->k, a->kn_mean, a->kn_rstd, a->kp, N * m->Gl, lp->kn_w, lp->kn_b);
    } else {
        mc_k_qkv_split(m->be, a->q, a->k, a->v, m->qkv, N, m->Ql, m->Gl, D);
    }
    if (c->position_embedding_type == MC_POS_ROPE) {
        mc_rope rp = mc_rope_of(c);
        mc_k_rope_fwd(m->be, a->q, B, T, m->Ql, D, &rp, 0, slot_pos(m, sl));
        mc_k_rope_fwd(m->be, a->k, B, T, m->Gl, D, &rp, 0, slot_pos(m, sl));
    }
    return MC_OK;
}

/* Megatron's core attention: att, lse from q, k, v (over the context-
 * parallel group when there is one) */
static mc_status core_attn_fwd(mc_model *m, mc_slot *sl, mc_layer_acts *a, mc_error *err)
{
    size_t D = m->D;
    if (m->cpa) return mc_model_cp_attention_fwd(m, sl, a, slot_seg(m, sl), err);
    mc_backend_set_attention_prec(m->be, m->prec);
    mc_k_attention_fwd(m->be, a->att, a->lse, a->q, a->k, a->v, (size_t)m->B, m->T, m->Ql, m->Gl, D,
                       1.0f / sqrtf((float)D), slot_seg(m, sl));
    return MC_OK;
}

/* res2 = res + att Wproj^T + b */
static mc_status proj_fwd(mc_model *m, mc_layer_acts *a, const mc_layer_params *lp, mc_error *err)
{
    float *y;
    TRY(row_parallel_fwd(m, lp_layer(m, lp), MC_LIN_PROJ, &y, a->att, lp->proj_w, lp->proj_b,
                         m->Ql * m->D, 0, err));
    mc_k_add(m->be, a->res2, a->res, y, m->Nl * m->C);
    return MC_OK;
}

/* act = act_fn(fc1), read by fc2 alone (act_round) */
static void act_fwd(mc_model *m, mc_layer_acts *a)
{
    if (m->cfg.swiglu)
        mc_k_swiglu_fwd(m->be, a->act, a->fc1, m->N, m->Fl, act_round(m));
    else
        mc_k_gelu_fwd(m->be, a->act, a->fc1, m->N * m->Fl, act_round(m));
}

/* act = act_fn(ln2 Wfc1^T + b) (ln2 gathered) */
static mc_status fc1_act_fwd(mc_model *m, mc_layer_acts *a, const mc_layer_params *lp,
                             mc_error *err)
{
    size_t N = m->N;
    const float *h;
    TRY(mc_model_tp_gather(m, a->ln2, &h, err));
    mc_model_lin_fwd(m, lp_layer(m, lp), MC_LIN_FC1, a->fc1, h, lp->fc1_w, param_val(m, lp->fc1_b),
                     N, m->C, m->fc1_out, exact_x(m));
    act_fwd(m, a);
    return MC_OK;
}

/* out = res2 + act Wfc2^T + b */
static mc_status fc2_fwd(mc_model *m, mc_layer_acts *a, const mc_layer_params *lp, float *out,
                         mc_error *err)
{
    float *y;
    TRY(row_parallel_fwd(m, lp_layer(m, lp), MC_LIN_FC2, &y, a->act, lp->fc2_w, lp->fc2_b, m->Fl,
                         exact_x(m), err));
    mc_k_add(m->be, out, a->res2, y, m->Nl * m->C);
    return MC_OK;
}

/* Layer l's forward from its input sl->acts[.].res into out, keeping its
 * activations in the slot (or the recomputation workspace). prepare: remake
 * the weights' GEMM form first (a forward pass; recomputation reuses the
 * pass's). out NULL (recomputation of a group's last layer): the output
 * is not needed, fc2 is not run. */
static mc_status layer_fwd_run(mc_model *m, mc_slot *sl, int l, float *out, int prepare,
                               mc_error *err)
{
    const mc_layer_params *lp = &m->lp[l];
    mc_layer_acts *a = &sl->acts[m->lidx[l]];
    if (prepare) {
        round_weight(m, lp->qkv_w);
        round_weight(m, lp->proj_w);
        round_weight(m, lp->fc1_w);
        round_weight(m, lp->fc2_w);
        round_weight(m, lp->efc1_w); /* the MoE block's experts (moe.c) */
        round_weight(m, lp->efc2_w);
        round_weight(m, lp->sfc1_w);
        round_weight(m, lp->sfc2_w);
    }
    norm1_fwd(m, a, lp);
    TRY(qkv_fwd(m, sl, a, lp, err));
    TRY(core_attn_fwd(m, sl, a, err));
    TRY(proj_fwd(m, a, lp, err));
    norm2_fwd(m, a, lp);
    if (lp->moe) { /* the MoE block (moe.c), replicated over tensor parallelism or split
                    * (ETP: its sums over TP inside); run whole
                    * again by recomputation (its output is then not needed) */
        TRY(mc_moe_fwd(m, sl, l, a->ln2, m->tmp, err));
        if (out) mc_k_add(m->be, out, a->res2, m->tmp, m->Nl * m->C);
        return MC_OK;
    }
    TRY(fc1_act_fwd(m, a, lp, err));
    return out ? fc2_fwd(m, a, lp, out, err) : MC_OK;
}

static mc_status layer_fwd(mc_model *m, mc_slot *sl, int l, float *out, mc_error *err)
{
    return layer_fwd_run(m, sl, l, out, 1, err);
}

/* Before layer l's backward, what its forward did not keep, made again by
 * the same calls on the same inputs: the same bits. Full recomputation, at
 * the group's last layer: the group's forward from its first layer's kept
 * input (the workspace then holds every layer of the group); selective:
 * the named modules of layer l. */
static mc_status layer_recompute_run(mc_model *m, mc_slot *sl, int l, mc_error *err)
{
    int li = m->lidx[l];
    if (m->rc_g0[li] >= 0) {
        int g0 = m->rc_g0[li], g1 = m->rc_g1[li];
        if (l != g1 - 1) return MC_OK; /* run with the group's last layer */
        for (int j = g0; j < g1; j++)
            TRY(layer_fwd_run(m, sl, j, j + 1 < g1 ? sl->acts[m->lidx[j + 1]].res : NULL, 0, err));
        return MC_OK;
    }
    if (m->cfg.recompute_granularity != MC_RECOMPUTE_SELECTIVE) return MC_OK;
    const mc_layer_params *lp = &m->lp[l];
    mc_layer_acts *a = &sl->acts[li];
    /* in the forward's order: each part's inputs are kept or remade first */
    unsigned drop = mc_recompute_layer_has(lp->moe) & ~m->rc_keep[li];
    if (drop & MC_ACT_LN1) norm1_fwd(m, a, lp);
    if (drop & MC_ACT_ATT) TRY(core_attn_fwd(m, sl, a, err));
    if (drop & MC_ACT_RES2) TRY(proj_fwd(m, a, lp, err)); /* (its scratch is free again after) */
    if (drop & MC_ACT_LN2) norm2_fwd(m, a, lp);
    if (drop & MC_ACT_FC1)
        TRY(fc1_act_fwd(m, a, lp, err));
    else if (drop & MC_ACT_ACT)
        act_fwd(m, a);
    if (drop & MC_ACT_MOE) /* the whole block: routing, dispatch, experts (m->tmp is free) */
        TRY(mc_moe_fwd(m, sl, l, a->ln2, m->tmp, err));
    else if (drop & (MC_ACT_MOE_ACT | MC_ACT_SHARED))
        TRY(mc_moe_recompute(m, sl, l, a->ln2, !!(drop & MC_ACT_MOE_ACT), !!(drop & MC_ACT_SHARED),
                             err));
    return MC_OK;
}

/* The MoE layers of a recomputation count no balancing losses nor expert
 * loads: the forward did (m->rc_replay). */
static mc_status layer_recompute(mc_model *m, mc_slot *sl, int l, mc_error *err)
{
    m->rc_replay = 1;
    mc_status st = layer_recompute_run(m, sl, l, err);
    m->rc_replay = 0;
    return st;
}

/* dres holds d(layer output) on entry and d(layer input) on return: the
 * residual connections pass it through and each branch adds into it. */
static mc_status layer_bwd(mc_model *m, mc_slot *sl, int l, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    const mc_layer_params *lp = &m->lp[l];
    mc_layer_acts *a = &sl->acts[m->lidx[l]];
    mc_backend *be = m->be;
    mc_prec pr = m->prec;
    size_t N = m->N, B = (size_t)m->B, T = m->T, C = m->C, D = m->D;
    const float *dy, *x;
    float *dl, *dln = m->dln; /* d(norm output): the compact workspace's own (below) */

    if (lp->moe) { /* the MoE block (moe.c): its own sums (ETP, SP) */
        TRY(mc_moe_bwd(m, sl, l, m->dres, a->ln2, err));
        TRY(norm_bwd(m, m->dres, m->dln, a->res2, a->ln2_mean, a->ln2_rstd, lp->ln2_w, lp->ln2_b,
                     err));
        goto attention;
    }
    /* MLP branch: row-parallel fc2 needs no communication backward (with
     * sequence parallelism: the gather of its output gradient). */
    TRY(mc_model_tp_gather(m, m->dres, &dy, err));
    /* fc2's weight gradient first: it is act's last reader, and act's
     * memory then takes d(act): one call that makes dW first and writes
     * d(act) over act (MC_LIN_DX_WRITE; dy rounded once for both products);
     * with FP8, whose products quantize their operands, two calls */
    float *dact = a->act, *dfc1 = a->fc1; /* d(fc1) in fc1's place: elementwise */
    if (!c->fp8) {
        mc_model_lin_bwd(m, pr, l, MC_LIN_FC2, dact, param_grad(m, lp->fc2_w),
                         param_grad(m, lp->fc2_b), dy, a->act, lp->fc2_w, N, m->Fl, C,
                         exact_x(m) | MC_LIN_DX_WRITE);
    } else {
        mc_model_lin_bwd(m, pr, l, MC_LIN_FC2, NULL, param_grad(m, lp->fc2_w),
                         param_grad(m, lp->fc2_b), dy, a->act, lp->fc2_w, N, m->Fl, C, exact_x(m));
        mc_k_fill(be, dact, 0.0f, N * m->Fl);
        mc_model_lin_bwd(m, pr, l, MC_LIN_FC2, dact, NULL, NULL, dy, NULL, lp->fc2_w, N, m->Fl, C,
                         0);
    }
    if (c->swiglu)
        mc_k_swiglu_bwd_inplace(be, dfc1, dact, N, m->Fl);
    else
        mc_k_gelu_bwd_inplace(be, dfc1, dact, N * m->Fl);
    /* the compact workspace (layout_acts) remakes ln2 in act's memory, the
     * same call on the same res2, and takes d(ln2) after it */
    if (m->rc_compact) {
        norm2_fwd(m, a, lp);
        dln = a->act + carved_bytes(m->Nl * C) / sizeof(float);
    }
    TRY(mc_model_tp_gather(m, a->ln2, &x, err));
    mc_k_fill(be, dln, 0.0f, N * C);
    mc_model_lin_bwd(m, pr, l, MC_LIN_FC1, dln, param_grad(m, lp->fc1_w), param_grad(m, lp->fc1_b),
                     dfc1, x, lp->fc1_w, N, C, m->fc1_out, exact_x(m) | dout_scratch(m));
    TRY(mc_model_tp_reduce(m, dln, m->loc, &dl, err));
    TRY(norm_bwd(m, m->dres, dl, a->res2, a->ln2_mean, a->ln2_rstd, lp->ln2_w, lp->ln2_b, err));

attention:
    /* Attention branch: its gradients in fc1's and act's memory, which
     * nothing reads any more (place_attn_grads), or in the scratch */
    if (m->attn_grads_in_layer) {
        float *g[4];
        place_attn_grads(m, a->fc1, N * m->fc1_out, a->act, N * m->Fl, g);
        m->datt = g[0], m->dq = g[1], m->dk = g[2], m->dv = g[3];
    }
    TRY(mc_model_tp_gather(m, m->dres, &dy, err));
    mc_k_fill(be, m->datt, 0.0f, N * m->Ql * D);
    mc_model_lin_bwd(m, pr, l, MC_LIN_PROJ, m->datt, param_grad(m, lp->proj_w),
                     param_grad(m, lp->proj_b), dy, a->att, lp->proj_w, N, m->Ql * D, C, 0);
    mc_k_fill(be, m->dq, 0.0f, N * m->Ql * D);
    mc_k_fill(be, m->dk, 0.0f, N * m->Gl * D);
    mc_k_fill(be, m->dv, 0.0f, N * m->Gl * D);
    if (m->cpa)
        TRY(mc_model_cp_attention_bwd(m, sl, a, slot_seg(m, sl), err));
    else {
        mc_backend_set_attention_prec(be, m->prec);
        mc_k_attention_bwd(be, m->dq, m->dk, m->dv, m->datt, a->q, a->k, a->v, a->att, a->lse, B, T,
                           m->Ql, m->Gl, D, 1.0f / sqrtf((float)D), slot_seg(m, sl));
    }
    if (c->position_embedding_type == MC_POS_ROPE) {
        mc_rope rp = mc_rope_of(c);
        mc_k_rope_bwd(be, m->dq, B, T, m->Ql, D, &rp, 0, slot_pos(m, sl));
        mc_k_rope_bwd(be, m->dk, B, T, m->Gl, D, &rp, 0, slot_pos(m, sl));
    }
    float *dq = m->dq, *dk = m->dk; /* d(q), d(k) as the projection gave them */
    if (c->qk_layernorm) TRY(qk_norm_bwd_layer(m, a, lp, &dq, &dk, err));
    /* the forward's scratch is free now (compact: act's memory, the
     * attention's gradients being all in fc1's) */
    float *dqkv = m->rc_compact ? a->act : m->qkv;
    mc_k_fill(be, dqkv, 0.0f, N * m->qkv_out);
    mc_k_qkv_split_bwd(be, dqkv, dq, dk, m->dv, N, m->Ql, m->Gl, D);
    /* compact: ln1 remade in fc1's memory (the same call on the same res),
     * d(ln1) after it */
    float *ln1 = a->ln1;
    if (m->rc_compact) {
        ln1 = a->fc1;
        dln = a->fc1 + carved_bytes(m->Nl * C) / sizeof(float);
        norm1_make(m, ln1, a, lp);
    }
    TRY(mc_model_tp_gather(m, ln1, &x, err));
    mc_k_fill(be, dln, 0.0f, N * C);
    mc_model_lin_bwd(m, pr, l, MC_LIN_QKV, dln, param_grad(m, lp->qkv_w), param_grad(m, lp->qkv_b),
                     dqkv, x, lp->qkv_w, N, C, m->qkv_out, exact_x(m) | dout_scratch(m));
    TRY(mc_model_tp_reduce(m, dln, m->loc, &dl, err));
    TRY(norm_bwd(m, m->dres, dl, a->res, a->ln1_mean, a->ln1_rstd, lp->ln1_w, lp->ln1_b, err));
    return MC_OK;
}

/* LM head and cross-entropy over row chunks of the final norm's output
 * lnf [N, C]. With backward, each chunk's logits become d(logits) in place
 * (weight scale per counted target, or dloss[i] per row when dloss is
 * given) and flow at once into d(lnf) (m->dln, zeroed here) and the head's
 * weight; *dl gets d(lnf) summed over the group, this rank's [Nl, C] rows
 * (tp_reduce). With dloss (backend, [N]) the row statistics and losses of
 * an earlier forward-only call are reused: only the logits are made again. */
static mc_status head_fwd_bwd(mc_model *m, const mc_slot *sl, const float *lnf, int backward,
                              float scale, const float *dloss, float **dl, mc_error *err)
{
    mc_backend *be = m->be;
    size_t N = m->N, C = m->C, vl = (size_t)m->vl;
    int w = m->out_w >= 0 ? m->out_w : m->wte; /* tied: the word embeddings */
    if (backward) mc_k_fill(be, m->dln, 0.0f, N * C);
    round_weight(m, w);
    for (size_t r0 = 0; r0 < N; r0 += m->chunk_rows) {
        size_t R = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
        const float *x = lnf + r0 * C;
        const int32_t *tgt = sl->targets + r0;
        mc_k_linear_fwd(be, m->prec, m->logits, x, param_val(m, w), param_prep(m, w), NULL, R, C,
                        vl, 0.0f, exact_x(m));
        if (!dloss) {
            mc_k_xent_max(be, m->rowmax + r0, m->logits, R, vl);
            TRY(mc_allreduce_max(&m->grid, MC_GROUP_TP, be, m->rowmax + r0, R, err));
            mc_k_xent_sumexp(be, m->sumexp + r0, m->tlogit + r0, m->logits, m->rowmax + r0, tgt,
                             m->v0, R, vl);
            TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, m->sumexp + r0, R, err));
            TRY(mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, m->tlogit + r0, R, err));
            mc_k_xent_loss(be, m->loss + r0, m->rowmax + r0, m->sumexp + r0, m->tlogit + r0, tgt,
                           R);
        }
        /* distillation: the KL, and with backward the mixed gradient (kd.c) */
        if (m->kd && m->kd->on) TRY(mc_model_kd_chunk(m, r0, R, tgt, backward, scale, err));
        if (!backward) continue;
        /* d(logits), read by the head's two products alone: rounded as it
         * is made (distillation's mixed gradient is rounded by the GEMM) */
        unsigned ex = exact_x(m);
        if (!(m->kd && m->kd->on)) {
            mc_k_xent_bwd(be, m->logits, m->logits, m->rowmax + r0, m->sumexp + r0, tgt, m->v0, R,
                          vl, dloss ? dloss + r0 : NULL, scale, act_round(m));
            if (m->round_acts) ex |= MC_LIN_EXACT_DOUT;
        }
        mc_k_linear_bwd(be, m->prec, m->dln + r0 * C, param_grad(m, w), NULL, m->logits, x,
                        param_val(m, w), param_prep(m, w), R, C, vl, ex);
    }
    /* column-parallel (over the vocabulary): sum the input gradient */
    if (backward) TRY(mc_model_tp_reduce(m, m->dln, m->loc, dl, err));
    return MC_OK;
}

/* The head under a logp objective (mc_model_set_logp_loss): the forward
 * gives every row's cross-entropy, -logp; the objective turns the host copy
 * into its loss and d loss / d logp; the backward runs the head again with
 * row weights -grad_scale * dlogp (m->loss holds them on the backend). */
static mc_status logp_loss_head(mc_model *m, mc_slot *sl, const float *lnf, const int32_t *targets,
                                int backward, float grad_scale, double *loss, int64_t *ntok,
                                mc_error *err)
{
    mc_backend *be = m->be;
    size_t N = m->N;
    if (!m->hlogp) {
        m->hlogp = malloc(N * sizeof *m->hlogp);
        m->hdlogp = malloc(N * sizeof *m->hdlogp);
        if (!m->hlogp || !m->hdlogp) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    }
    TRY(head_fwd_bwd(m, sl, lnf, 0, 0.0f, NULL, NULL, err));
    mc_bcopy_to_host(be, m->hlogp, m->loss, N * sizeof(float));
    for (size_t i = 0; i < N; i++) {
        m->hlogp[i] = targets[i] < 0 ? 0.0f : -m->hlogp[i];
        m->hdlogp[i] = 0.0f;
    }
    int64_t count = 0;
    TRY(m->logp_loss(m->logp_loss_ctx, m->hlogp, targets, N, m->hdlogp, loss, &count, err));
    *ntok = count;
    for (size_t i = 0; i < N; i++)
        m->hdlogp[i] = targets[i] < 0 ? 0.0f : -grad_scale * m->hdlogp[i];
    sl->bwd = backward && count > 0;
    if (!sl->bwd) return MC_OK;
    mc_bcopy_from_host(be, m->loss, m->hdlogp, N * sizeof(float));
    float *dl = NULL;
    TRY(head_fwd_bwd(m, sl, lnf, 1, 0.0f, m->loss, &dl, err));
    mc_bcopy(be, sl->dhead, dl, m->Nl * m->C * sizeof(float));
    return MC_OK;
}

void mc_model_set_logp_loss(mc_model *m, mc_logp_loss_fn fn, void *ctx)
{
    m->logp_loss = fn;
    m->logp_loss_ctx = ctx;
}

/* Tell the hook (if any) that gradients at offsets >= offset are final. */
static mc_status grad_ready(mc_model *m, size_t offset, mc_error *err)
{
    return m->grad_ready ? m->grad_ready(m->grad_ready_ctx, offset, err) : MC_OK;
}

/* Ids are checked here: an id outside every rank's slice would embed as
 * zeros and score as an impossible target, silently. */
static mc_status check_ids(const mc_model *m, const int32_t *ids, const char *what, int neg_ok,
                           int64_t *count, mc_error *err)
{
    int64_t V = m->cfg.padded_vocab_size, n = 0;
    for (size_t i = 0; i < m->N; i++) {
        if ((!neg_ok && ids[i] < 0) || ids[i] >= V)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "model: %s id %d at position %zu of the micro-batch is outside "
                                "the vocabulary [0, %lld)",
                                what, ids[i], i, (long long)V);
        n += ids[i] >= 0;
    }
    if (count) *count = n;
    return MC_OK;
}

void mc_doc_layout(const mc_doc_resets *r, const int32_t *tokens, size_t n, size_t pos0,
                   int32_t *pos, int32_t *seg)
{
    size_t doc = 0; /* the first token of the current document */
    for (size_t t = 0; t < n; t++) {
        if (pos) pos[t] = (int32_t)(r->reset_position_ids ? t - doc : pos0 + t);
        if (seg) seg[t] = (int32_t)(r->reset_attention_mask ? doc : 0);
        if (tokens[t] == r->eod) doc = t + 1;
    }
}

void mc_doc_mask_targets(int32_t eod, const int32_t *tokens, int32_t *targets, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tokens[i] == eod) targets[i] = -1;
}

void mc_model_set_doc_resets(mc_model *m, const mc_doc_resets *r)
{
    m->docs_on = r && (r->reset_position_ids || r->reset_attention_mask);
    if (m->docs_on) m->docs = *r;
    if (m->kd) mc_model_set_doc_resets(m->kd->teacher, r);
}

int mc_model_doc_resets_on(const mc_model *m) { return m->docs_on; }

/* The micro-batch's positions and segment starts into slot sl, from its
 * tokens (every stage has them with the resets on). */
static mc_status doc_layout(mc_model *m, mc_slot *sl, const int32_t *tokens, mc_error *err)
{
    if (!tokens && m->docs_on)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "model: document resets need the tokens on pipeline stage %d",
                            m->grid.pp_rank);
    size_t B = (size_t)m->B, T = m->T, Tl = m->Tl, r0 = (size_t)m->grid.tp_rank * Tl;
    for (size_t b = 0; b < B; b++) {
        if (m->cpa) /* tokens: the whole sequences (cp x T each) */
            TRY(mc_model_cp_layout(m, (int)(sl - m->slots), b,
                                   tokens && m->docs_on ? tokens + b * T * (size_t)m->grid.cp
                                                        : NULL,
                                   m->hpos + b * T, m->hseg + b * T, err));
        else
            mc_doc_layout(&m->docs, tokens + b * T, T, 0, m->hpos + b * T, m->hseg + b * T);
        /* this rank's rows of the sequence-parallel regions: [r Tl, (r+1) Tl) */
        memcpy(m->hpos_loc + b * Tl, m->hpos + b * T + (m->sp ? r0 : 0), Tl * sizeof(int32_t));
    }
    mc_bcopy_from_host(m->be, sl->pos, m->hpos, m->N * sizeof(int32_t));
    mc_bcopy_from_host(m->be, sl->seg, m->hseg, m->N * sizeof(int32_t));
    mc_bcopy_from_host(m->be, sl->pos_loc, m->hpos_loc, m->Nl * sizeof(int32_t));
    return MC_OK;
}

/* Chunk c of this rank holds the embeddings / the head. */
static int chunk_first(const mc_model *m, int c) { return m->first_stage && c == 0; }
static int chunk_last(const mc_model *m, int c) { return m->last_stage && c == m->nchunks - 1; }
static float *chunk_out(const mc_model *m, mc_slot *sl, int c)
{
    return sl->res_out + (size_t)c * m->Nl * m->C;
}

/* The hook only under one chunk: with several, a chunk's backward finishes
 * no suffix of the buffer (its layers see more micro-batches later). */
static mc_status chunk_grad_ready(mc_model *m, size_t offset, mc_error *err)
{
    return m->nchunks == 1 ? grad_ready(m, offset, err) : MC_OK;
}

/* The first stage's embedding of tokens (host) into x0, slot sl's first
 * layer input. */
static mc_status embed_fwd(mc_model *m, mc_slot *sl, const int32_t *tokens, float *x0,
                           mc_error *err)
{
    mc_backend *be = m->be;
    size_t N = m->N, C = m->C, B = (size_t)m->B;
    mc_bcopy_from_host(be, sl->tokens, tokens, N * sizeof(int32_t));
    /* Embedding: vocab-parallel lookup, all-reduced (reduce-scattered to
     * this rank's positions [pos0, pos0 + Tl) with sequence parallelism),
     * then positions. */
    float *e = m->sp ? m->tmp : x0;
    size_t pos0 = m->sp ? (size_t)m->grid.tp_rank * m->Tl : 0;
    mc_k_embed_fwd(be, e, sl->tokens, N, param_val(m, m->wte), m->v0, m->vl, C);
    TRY(mc_model_tp_reduce(m, e, x0, &x0, err));
    const int32_t *pos = slot_pos(m, sl);
    if (pos && m->sp) pos = sl->pos_loc;
    if (m->wpe >= 0) mc_k_posemb_fwd(be, x0, param_val(m, m->wpe), B, m->Tl, C, pos0, pos);
    return MC_OK;
}

mc_status mc_model_final_hidden(mc_model *t, const int32_t *tokens, const float **lnf,
                                mc_error *err)
{
    if (!t->first_stage || !t->last_stage || t->nchunks != 1)
        return mc_error_set(err, MC_ERR_INTERNAL, "model: a teacher needs one pipeline stage");
    mc_slot *sl = &t->slots[0];
    int l1 = t->cfg.num_layers;
    TRY(check_ids(t, tokens, "token", 0, NULL, err));
    if (t->docs_on) TRY(doc_layout(t, sl, tokens, err));
    TRY(embed_fwd(t, sl, tokens, sl->acts[t->lidx[0]].res, err));
    for (int l = 0; l < l1; l++)
        TRY(layer_fwd(t, sl, l, l + 1 < l1 ? sl->acts[t->lidx[l + 1]].res : sl->res_out, err));
    norm_fwd(t, sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->res_out, t->lnf_w, t->lnf_b, MC_PREC_FP32);
    round_weight(t, t->out_w >= 0 ? t->out_w : t->wte);
    return mc_model_tp_gather(t, sl->lnf, lnf, err);
}

mc_status mc_model_forward(mc_model *m, int slot, const int32_t *tokens, const int32_t *targets,
                           int backward, float grad_scale, const float **out, double *loss,
                           int64_t *ntok, mc_error *err)
{
    return mc_model_forward_chunk(m, 0, slot, tokens, targets, backward, grad_scale, out, loss,
                                  ntok, err);
}

mc_status mc_model_forward_chunk(mc_model *m, int chunk, int slot, const int32_t *tokens,
                                 const int32_t *targets, int backward, float grad_scale,
                                 const float **out, double *loss, int64_t *ntok, mc_error *err)
{
    mc_backend *be = m->be;
    size_t N = m->N, C = m->C;
    mc_slot *sl = &m->slots[slot];
    int64_t count = 0;
    int first = chunk_first(m, chunk), last = chunk_last(m, chunk);
    int l0 = m->cl0[chunk], l1 = m->cl1[chunk];
    *loss = 0;
    *ntok = 0;
    if (out) *out = NULL;
    if (first || m->nchunks == 1) sl->bwd = 0;
    /* context parallelism: the whole sequences come in; this rank's rows
     * go on, and the mean is over the whole micro-batch's targets */
    const int32_t *whole = tokens;
    int64_t whole_count = 0;
    if (m->cpa) TRY(mc_model_cp_cut(m, &tokens, &targets, &whole_count, err));
    if (first) TRY(check_ids(m, tokens, "token", 0, NULL, err));
    if (last) TRY(check_ids(m, targets, "target", 1, &count, err));
    if (m->cpa) count = whole_count;
    if (m->docs_on || m->cpa) TRY(doc_layout(m, sl, m->cpa ? whole : tokens, err));
    sl->train = backward;
    sl->grad_scale = grad_scale;
    if (first) TRY(embed_fwd(m, sl, tokens, sl->acts[m->lidx[l0]].res, err));
    float *res_out = chunk_out(m, sl, chunk);
    for (int l = l0; l < l1; l++)
        TRY(layer_fwd(m, sl, l, l + 1 < l1 ? sl->acts[m->lidx[l + 1]].res : res_out, err));
    if (!last) {
        if (out) *out = res_out;
        return MC_OK;
    }
    mc_bcopy_from_host(be, sl->targets, targets, N * sizeof(int32_t));
    /* read by the LM head alone */
    norm_fwd(m, sl->lnf, sl->lnf_mean, sl->lnf_rstd, res_out, m->lnf_w, m->lnf_b, act_round(m));
    const float *lnf;
    TRY(mc_model_tp_gather(m, sl->lnf, &lnf, err));
    if (m->logp_loss)
        return logp_loss_head(m, sl, lnf, targets, backward, grad_scale, loss, ntok, err);
    /* Mean over counted targets; a micro-batch with none has loss 0 and
     * contributes no gradient. */
    float scale = count ? grad_scale / (float)count : 0.0f;
    float *dl = NULL;
    sl->bwd = backward && count > 0;
    /* Distillation in training only: the teacher's forward on the same
     * tokens, then its logits chunk by chunk in the head (kd.c). */
    if (m->kd) {
        m->kd->on = sl->bwd;
        m->kd->last_kl = 0.0;
        if (m->kd->on) TRY(mc_model_final_hidden(m->kd->teacher, tokens, &m->kd->t_lnf, err));
    }
    TRY(head_fwd_bwd(m, sl, lnf, sl->bwd, scale, NULL, &dl, err));
    if (m->kd && m->kd->on)
        m->kd->last_kl = mc_k_mean(be, m->kd->kl, N) * (double)N / (double)count;
    if (sl->bwd) mc_bcopy(be, sl->dhead, dl, m->Nl * C * sizeof(float));
    double sum = mc_k_mean(be, m->loss, N) * (double)N;
    if (m->cpa) TRY(mc_allreduce_sum_f64(&m->grid, MC_GROUP_CP, &sum, 1, err));
    *loss = count ? sum / (double)count : 0.0;
    *ntok = count;
    return MC_OK;
}

mc_status mc_model_backward(mc_model *m, int slot, const float *dout, const float **din,
                            mc_error *err)
{
    return mc_model_backward_chunk(m, 0, slot, dout, din, err);
}

mc_status mc_model_backward_chunk(mc_model *m, int chunk, int slot, const float *dout,
                                  const float **din, mc_error *err)
{
    mc_backend *be = m->be;
    size_t N = m->N, C = m->C, T = m->T, B = (size_t)m->B;
    mc_slot *sl = &m->slots[slot];
    if (din) *din = NULL;
    if (chunk_last(m, chunk)) {
        mc_k_fill(be, m->dres, 0.0f, m->Nl * C);
        if (sl->bwd)
            TRY(norm_bwd(m, m->dres, sl->dhead, chunk_out(m, sl, chunk), sl->lnf_mean, sl->lnf_rstd,
                         m->lnf_w, m->lnf_b, err));
        /* The buffer holds embeddings, the rank's layers, final norm, output
         * layer: each step of the backward finishes a suffix of it. */
        TRY(chunk_grad_ready(m, m->params[m->lnf_w].offset, err));
    } else {
        mc_bcopy(be, m->dres, dout, m->Nl * C * sizeof(float));
    }
    for (int l = m->cl1[chunk] - 1; l >= m->cl0[chunk]; l--) {
        TRY(layer_recompute(m, sl, l, err));
        TRY(layer_bwd(m, sl, l, err));
        TRY(chunk_grad_ready(m, m->params[m->lp[l].ln1_w].offset, err));
    }
    if (chunk_first(m, chunk)) {
        /* The embedding's input gradient is replicated: each rank adds its
         * vocabulary rows, no communication (with sequence parallelism,
         * after gathering it; the position gradient then comes whole from
         * every row). */
        const float *dx0;
        TRY(mc_model_tp_gather(m, m->dres, &dx0, err));
        mc_k_embed_bwd(be, param_grad(m, m->wte), dx0, sl->tokens, N, m->v0, m->vl, C);
        if (m->wpe >= 0)
            mc_k_posemb_bwd(be, param_grad(m, m->wpe), dx0, B, T, C, 0, slot_pos(m, sl));
    } else if (din) {
        *din = m->dres;
    }
    return chunk_grad_ready(m, 0, err);
}

/* One process's micro-batch (one stage holding the whole model), slot 0. */
mc_status mc_model_step(mc_model *m, const int32_t *tokens, const int32_t *targets, int backward,
                        float grad_scale, double *loss, int64_t *ntok, mc_error *err)
{
    if (!m->first_stage || !m->last_stage || m->nchunks != 1)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "model: mc_model_step on pipeline stage %d of %d; use the pipeline "
                            "schedule",
                            m->grid.pp_rank, m->grid.pp);
    TRY(mc_model_forward(m, 0, tokens, targets, backward, grad_scale, NULL, loss, ntok, err));
    if (!m->slots[0].bwd) return MC_OK;
    return mc_model_backward(m, 0, NULL, NULL, err);
}

int mc_model_is_first_stage(const mc_model *m) { return m->first_stage; }
int mc_model_is_last_stage(const mc_model *m) { return m->last_stage; }
size_t mc_model_act_numel(const mc_model *m) { return m->Nl * m->C; }
float *mc_model_stage_input(mc_model *m, int slot) { return mc_model_chunk_input(m, 0, slot); }
int mc_model_num_chunks(const mc_model *m) { return m->nchunks; }
float *mc_model_chunk_input(mc_model *m, int chunk, int slot)
{
    return m->slots[slot].acts[m->lidx[m->cl0[chunk]]].res;
}

mc_status mc_model_set_slots(mc_model *m, int slots, mc_error *err)
{
    if (slots < 1) return mc_error_set(err, MC_ERR_INTERNAL, "model: %d activation slots", slots);
    if (slots == m->nslots) return MC_OK;
    return alloc_acts(m, slots, err);
}

void mc_model_act_bytes(const mc_model *m, mc_act_bytes *out)
{
    out->kept = m->act_kept;
    out->workspace = m->act_ws;
    out->scratch = m->act_scratch;
    out->slots = m->nslots;
    out->total = (size_t)m->nslots * m->act_kept + m->act_ws + m->act_scratch;
}

mc_status mc_model_allreduce_embedding_grads(mc_model *m, mc_error *err)
{
    if (m->grid.pp <= 1 || m->cfg.untie_embeddings_and_output_weights ||
        !(m->first_stage || m->last_stage))
        return MC_OK;
    const mc_param *w = &m->params[m->wte];
    return mc_allreduce_sum(&m->grid, MC_GROUP_EMBD, m->be, m->g + w->offset, w->numel, err);
}

void mc_model_set_grad_ready_hook(mc_model *m, mc_grad_ready_fn fn, void *ctx)
{
    m->grad_ready = fn;
    m->grad_ready_ctx = ctx;
}
