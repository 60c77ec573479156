/*
 * params.c - the parameter registry: every parameter's Megatron Core
 * state-dict name, global shape, tensor-parallel split and initialization,
 * laid out in one contiguous buffer; and Megatron's initialization. The names
 * and splits are tabled in doc/ARCHITECTURE.md, "The model".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* Alignment of each parameter in the buffer, in elements (64 bytes). */
#define PARAM_ALIGN 16

typedef struct reg {
    mc_model *m;
    size_t cap;
    size_t off;
    int skip;        /* on another pipeline stage: counted in global_numel only */
    int shared;      /* the last stage's copy of the tied embeddings: local only */
    int expert;      /* a MoE layer's experts: split by experts over expert parallelism */
    int64_t experts; /* their number E (the expert tensors' rows are E blocks) */
    int etpn;        /* >0: split over the ETP group of that size, not over TP */
} reg;

static int add(reg *r, mc_error *err, int ndim, int64_t rows, int64_t cols, int split_dim,
               int chunks, int nwd, float std, float value, const char *fmt, ...)
    __attribute__((format(printf, 11, 12)));

/* Append one parameter; returns its index, -1 on allocation failure, -2
 * when it lives on another pipeline stage (r->skip). chunks: the split
 * dimension's chunks, each split over TP on its own (mc_param's row_chunks,
 * or col_chunks when split_dim is 1). */
static int add(reg *r, mc_error *err, int ndim, int64_t rows, int64_t cols, int split_dim,
               int chunks, int nwd, float std, float value, const char *fmt, ...)
{
    mc_model *m = r->m;
    if (r->skip) {
        m->global_numel += rows * cols;
        return -2;
    }
    if (m->nparams == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        mc_param *p = realloc(m->params, cap * sizeof *p);
        if (!p) {
            mc_error_set(err, MC_ERR_NOMEM, "model: out of memory for the parameter registry");
            return -1;
        }
        m->params = p;
        r->cap = cap;
    }
    mc_param *p = &m->params[m->nparams];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    int tp = m->grid.tp, rank = m->grid.tp_rank;
    if (r->etpn && split_dim >= 0) {
        /* expert tensor parallelism: split over the rank's ETP group, the
         * same slice on its tp / etp replicas (the lowest writes it) */
        tp = r->etpn, rank = m->grid.tp_rank % r->etpn;
        p->replica = m->grid.tp_rank / r->etpn > 0;
    }
    p->ndim = ndim;
    p->rows = rows;
    p->cols = cols;
    p->split_dim = split_dim; /* the layout's, whatever tp: a loader re-splits by it */
    int row_chunks = split_dim == 1 ? 1 : chunks;
    p->row_chunks = row_chunks;
    p->col_chunks = split_dim == 1 ? chunks : 1;
    p->local_rows = rows;
    p->local_cols = cols;
    if (split_dim == 0) {
        /* config_finish guarantees divisibility (heads, groups, ffn, vocab) */
        p->local_rows = rows / tp;
        p->row0 = (rows / row_chunks / tp) * rank;
    } else if (split_dim == 1) {
        p->local_cols = cols / tp;
        p->col0 = (cols / p->col_chunks / tp) * rank;
    }
    p->chunk_rows = rows / row_chunks;
    p->chunk_cols = cols / p->col_chunks;
    if (r->expert) {
        /* rows / ep: whole experts (config checks E divisible by ep) */
        int64_t erows = rows / m->grid.ep;
        p->expert = 1;
        p->local_rows = erows;
        p->row0 = erows * m->grid.ep_rank;
        if (split_dim == 0) {
            /* expert tensor parallelism: row_chunks chunks per expert, each
             * split over TP (config checks F divisible by tp) */
            int64_t per = rows / r->experts / row_chunks; /* one chunk's rows */
            p->row_chunks = (int)(r->experts / m->grid.ep) * row_chunks;
            p->chunk_rows = per;
            p->local_rows = erows / tp;
            p->row0 += per / tp * rank;
        }
    }
    p->no_weight_decay = nwd;
    p->init_std = std;
    p->init_value = value;
    p->numel = (size_t)(p->local_rows * p->local_cols);
    p->offset = r->off;
    p->shared = r->shared;
    r->off += (p->numel + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
    if (!r->shared) m->global_numel += rows * cols;
    return (int)m->nparams++;
}

#define ADD(...)                                                \
    do {                                                        \
        if ((idx = add(&r, err, __VA_ARGS__)) == -1) goto fail; \
        if (idx < 0) idx = -1;                                  \
    } while (0)

/* A MoE layer's MLP parameters (Megatron Core's names: the pre-MLP norm
 * is not fused into a linear, and the experts' weights are the global
 * [E, ...] tensors of its distributed checkpoints, expert e's matrix rows
 * [e R, (e + 1) R) of a [E R, cols] tensor; mc-formats(5)). Replicated
 * over tensor parallelism, or under expert tensor parallelism split over it
 * like the dense MLP. Returns nonzero on allocation failure. */
static int moe_layer(reg *r, const mc_model_config *c, mc_layer_params *lp, int l, mc_error *err)
{
    int idx;
    int64_t C = c->hidden_size, E = c->num_experts, F = c->moe_ffn_hidden_size;
    int64_t fc1 = c->swiglu ? 2 * F : F;
    int ln = c->normalization == MC_NORM_LAYERNORM, bias = c->add_bias_linear;
    float std = c->init_method_std, out_std = std / sqrtf(2.0f * (float)c->num_layers);
    char pre[96];
    lp->moe = 1;
    snprintf(pre, sizeof pre, "decoder.layers.%d", l);
#define ADDM(...)                                             \
    do {                                                      \
        if ((idx = add(r, err, __VA_ARGS__)) == -1) return 1; \
        if (idx < 0) idx = -1;                                \
    } while (0)
    ADDM(1, C, 1, -1, 1, 1, 0, 1, "%s.pre_mlp_layernorm.weight", pre);
    lp->ln2_w = idx;
    if (ln) {
        ADDM(1, C, 1, -1, 1, 1, 0, 0, "%s.pre_mlp_layernorm.bias", pre);
        lp->ln2_b = idx;
    }
    ADDM(2, E, C, -1, 1, 0, std, 0, "%s.mlp.router.weight", pre);
    lp->router_w = idx;
    if (bias) { /* Megatron's router initializes its bias like its weight */
        ADDM(1, E, 1, -1, 1, 1, std, 0, "%s.mlp.router.bias", pre);
        lp->router_b = idx;
    }
    if (c->moe_router_enable_expert_bias) { /* a buffer, updated by the loop, never by Adam */
        ADDM(1, E, 1, -1, 1, 1, 0, 0, "%s.mlp.router.expert_bias", pre);
        lp->expert_bias = idx;
    }
    /* expert tensor parallelism: fc1 column-parallel (each expert's rows,
     * SwiGLU's gate and up each split alike; its [E, fc1] bias by columns,
     * each expert's [gate F | up F] alike), fc2 row-parallel, as the dense
     * MLP; fc2's bias replicated (added by TP rank 0) */
    int etp = c->moe_expert_tensor_parallel > 1, col = etp ? 0 : -1, row = etp ? 1 : -1;
    int chunks = etp && c->swiglu ? 2 : 1;             /* whole rows when replicated */
    r->etpn = etp ? c->moe_expert_tensor_parallel : 0; /* split over the ETP group */
    r->expert = 1;
    r->experts = E;
    ADDM(2, E * fc1, C, col, chunks, 0, std, 0, "%s.mlp.experts.experts.linear_fc1.weight", pre);
    lp->efc1_w = idx;
    if (bias) {
        ADDM(2, E, fc1, row, chunks, 1, 0, 0, "%s.mlp.experts.experts.linear_fc1.bias", pre);
        lp->efc1_b = idx;
    }
    ADDM(2, E * C, F, row, 1, 0, out_std, 0, "%s.mlp.experts.experts.linear_fc2.weight", pre);
    lp->efc2_w = idx;
    if (bias) {
        ADDM(2, E, C, -1, 1, 1, 0, 0, "%s.mlp.experts.experts.linear_fc2.bias", pre);
        lp->efc2_b = idx;
    }
    r->expert = 0;
    if (c->moe_shared_expert_intermediate_size > 0) {
        /* Megatron's SharedExpertMLP: one MLP of the shared size beside
         * the routed experts, no biases (config_finish checks) */
        int64_t S = c->moe_shared_expert_intermediate_size, s1 = c->swiglu ? 2 * S : S;
        ADDM(2, s1, C, col, chunks, 0, std, 0, "%s.mlp.shared_experts.linear_fc1.weight", pre);
        lp->sfc1_w = idx;
        ADDM(2, C, S, row, 1, 0, out_std, 0, "%s.mlp.shared_experts.linear_fc2.weight", pre);
        lp->sfc2_w = idx;
    }
    r->etpn = 0;
#undef ADDM
    return 0;
}

mc_status mc_model_build_registry(mc_model *m, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    reg r = {.m = m};
    int idx;
    int64_t C = c->hidden_size, V = c->padded_vocab_size;
    int64_t Q = c->num_attention_heads, G = c->num_query_groups, D = c->kv_channels;
    int64_t F = c->ffn_hidden_size;
    int64_t fc1 = c->swiglu ? 2 * F : F, chunks = c->swiglu ? 2 : 1;
    int ln = c->normalization == MC_NORM_LAYERNORM, bias = c->add_bias_linear;
    float std = c->init_method_std;
    float out_std = std / sqrtf(2.0f * (float)c->num_layers);

    m->nparams = 0;
    m->global_numel = 0;
    m->wte = m->wpe = m->lnf_w = m->lnf_b = m->out_w = -1;
    m->lp = calloc((size_t)c->num_layers, sizeof *m->lp);
    if (!m->lp) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");

    /* Stage membership (pipeline parallelism): the embeddings on the
     * first stage, the rank's layers (loc[]), the final norm and output layer on the
     * last; with tied embeddings the last stage (when not also the first)
     * holds its own copy of the word embeddings, first in its buffer. */
    int first = m->first_stage, last = m->last_stage;
    if (last && !first && !c->untie_embeddings_and_output_weights) {
        r.shared = 1;
        ADD(2, V, C, 0, 1, 0, std, 0, "embedding.word_embeddings.weight");
        m->wte = idx;
        r.shared = 0;
    }
    r.skip = !first;
    ADD(2, V, C, 0, 1, 0, std, 0, "embedding.word_embeddings.weight");
    if (first) m->wte = idx;
    if (c->position_embedding_type == MC_POS_LEARNED) {
        ADD(2, c->max_position_embeddings, C, -1, 1, 0, std, 0,
            "embedding.position_embeddings.weight");
        m->wpe = idx;
    }
    for (int l = 0; l < c->num_layers; l++) {
        mc_layer_params *lp = &m->lp[l];
        r.skip = m->lidx[l] < 0;
        lp->ln1_w = lp->ln1_b = lp->qkv_w = lp->proj_w = lp->ln2_w = lp->fc1_w = lp->fc2_w = -1;
        lp->ln1_b = lp->qkv_b = lp->proj_b = lp->ln2_b = lp->fc1_b = lp->fc2_b = -1;
        const char *a = "decoder.layers.%d.self_attention";
        char pre[96];
        snprintf(pre, sizeof pre, a, l);
        ADD(1, C, 1, -1, 1, 1, 0, 1, "%s.linear_qkv.layer_norm_weight", pre);
        lp->ln1_w = idx;
        if (ln) {
            ADD(1, C, 1, -1, 1, 1, 0, 0, "%s.linear_qkv.layer_norm_bias", pre);
            lp->ln1_b = idx;
        }
        ADD(2, (Q + 2 * G) * D, C, 0, 1, 0, std, 0, "%s.linear_qkv.weight", pre);
        lp->qkv_w = idx;
        if (bias) {
            ADD(1, (Q + 2 * G) * D, 1, 0, 1, 1, 0, 0, "%s.linear_qkv.bias", pre);
            lp->qkv_b = idx;
        }
        lp->qn_w = lp->qn_b = lp->kn_w = lp->kn_b = -1;
        if (c->qk_layernorm) { /* Megatron's q_layernorm, k_layernorm: [D], replicated */
            ADD(1, D, 1, -1, 1, 1, 0, 1, "%s.q_layernorm.weight", pre);
            lp->qn_w = idx;
            if (ln) {
                ADD(1, D, 1, -1, 1, 1, 0, 0, "%s.q_layernorm.bias", pre);
                lp->qn_b = idx;
            }
            ADD(1, D, 1, -1, 1, 1, 0, 1, "%s.k_layernorm.weight", pre);
            lp->kn_w = idx;
            if (ln) {
                ADD(1, D, 1, -1, 1, 1, 0, 0, "%s.k_layernorm.bias", pre);
                lp->kn_b = idx;
            }
        }
        ADD(2, C, Q * D, 1, 1, 0, out_std, 0, "%s.linear_proj.weight", pre);
        lp->proj_w = idx;
        if (bias) {
            ADD(1, C, 1, -1, 1, 1, 0, 0, "%s.linear_proj.bias", pre);
            lp->proj_b = idx;
        }
        lp->router_w = lp->router_b = lp->expert_bias = -1;
        lp->efc1_w = lp->efc1_b = lp->efc2_w = lp->efc2_b = -1;
        lp->sfc1_w = lp->sfc2_w = -1;
        if (mc_model_layer_is_moe(c, l)) {
            if (moe_layer(&r, c, lp, l, err)) goto fail;
            continue;
        }
        snprintf(pre, sizeof pre, "decoder.layers.%d.mlp", l);
        ADD(1, C, 1, -1, 1, 1, 0, 1, "%s.linear_fc1.layer_norm_weight", pre);
        lp->ln2_w = idx;
        if (ln) {
            ADD(1, C, 1, -1, 1, 1, 0, 0, "%s.linear_fc1.layer_norm_bias", pre);
            lp->ln2_b = idx;
        }
        ADD(2, fc1, C, 0, (int)chunks, 0, std, 0, "%s.linear_fc1.weight", pre);
        lp->fc1_w = idx;
        if (bias) {
            ADD(1, fc1, 1, 0, (int)chunks, 1, 0, 0, "%s.linear_fc1.bias", pre);
            lp->fc1_b = idx;
        }
        ADD(2, C, F, 1, 1, 0, out_std, 0, "%s.linear_fc2.weight", pre);
        lp->fc2_w = idx;
        if (bias) {
            ADD(1, C, 1, -1, 1, 1, 0, 0, "%s.linear_fc2.bias", pre);
            lp->fc2_b = idx;
        }
    }
    r.skip = !last;
    ADD(1, C, 1, -1, 1, 1, 0, 1, "decoder.final_layernorm.weight");
    m->lnf_w = idx;
    if (ln) {
        ADD(1, C, 1, -1, 1, 1, 0, 0, "decoder.final_layernorm.bias");
        m->lnf_b = idx;
    }
    if (c->untie_embeddings_and_output_weights) {
        ADD(2, V, C, 0, 1, 0, std, 0, "output_layer.weight");
        m->out_w = idx;
    }
    m->numel = r.off;
    return MC_OK;
fail:
    return err ? err->code : MC_ERR_NOMEM;
}

size_t mc_model_num_params(const mc_model *m) { return m->nparams; }

const mc_param *mc_model_param(const mc_model *m, size_t i)
{
    return i < m->nparams ? &m->params[i] : NULL;
}

const mc_param *mc_model_param_by_name(const mc_model *m, const char *name)
{
    for (size_t i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

float *mc_model_params(mc_model *m) { return m->p; }
float *mc_model_grads(mc_model *m) { return m->g; }
size_t mc_model_numel(const mc_model *m) { return m->numel; }
int64_t mc_model_global_numel(const mc_model *m) { return m->global_numel; }

/* Megatron's init, but drawn per global element from (seed, name, index),
 * so any grid (and any chunk of SwiGLU's fc1) gets the same values as the
 * whole tensor would: each local chunk is the block of the global matrix at
 * (its global first row, col0). */
void mc_model_init_weights(mc_model *m, uint64_t seed)
{
    for (size_t i = 0; i < m->nparams; i++) {
        const mc_param *p = &m->params[i];
        float *x = m->p + p->offset;
        if (p->init_std > 0 && p->col_chunks > 1) {
            /* each local row's slices of the column chunks, row by row */
            uint64_t key = mc_k_name_key(p->name);
            size_t lc = (size_t)(p->local_cols / p->col_chunks);
            for (int64_t i = 0; i < p->local_rows; i++)
                for (int k = 0; k < p->col_chunks; k++)
                    mc_k_init_normal(m->be, x + (size_t)i * (size_t)p->local_cols + k * lc, 1, lc,
                                     (uint64_t)p->cols, (uint64_t)(p->row0 + i),
                                     (uint64_t)(k * p->chunk_cols + p->col0), seed, key,
                                     p->init_std);
        } else if (p->init_std > 0) {
            uint64_t key = mc_k_name_key(p->name);
            size_t rows = (size_t)(p->local_rows / p->row_chunks);
            for (int j = 0; j < p->row_chunks; j++)
                mc_k_init_normal(m->be, x + (size_t)j * rows * (size_t)p->local_cols, rows,
                                 (size_t)p->local_cols, (uint64_t)p->cols,
                                 (uint64_t)(j * p->chunk_rows + p->row0), (uint64_t)p->col0, seed,
                                 key, p->init_std);
        } else {
            mc_k_fill(m->be, x, p->init_value, p->numel);
        }
    }
}

void mc_model_zero_grads(mc_model *m) { mc_k_fill(m->be, m->g, 0.0f, m->numel); }
