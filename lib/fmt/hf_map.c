/*
 * hf_map.c - how an mc model is a Hugging Face model: which architecture
 * expresses it (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM,
 * Qwen3ForCausalLM or Qwen3MoeForCausalLM), its config.json in
 * both directions, and the table from Megatron Core tensor names and
 * layouts to Hugging Face ones (hf_internal.h), used by both hf_export.c
 * and hf_import.c so the two cannot disagree. The names, the layouts and
 * the fields are mc-formats(5), HUGGING FACE MODEL DIRECTORIES.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt/hf_internal.h"

const char *hf_arch_name(hf_arch a)
{
    return a == HF_LLAMA       ? "LlamaForCausalLM"
           : a == HF_MIXTRAL   ? "MixtralForCausalLM"
           : a == HF_QWEN3_MOE ? "Qwen3MoeForCausalLM"
           : a == HF_QWEN3     ? "Qwen3ForCausalLM"
                               : "GPT2LMHeadModel";
}

/* A mixture of experts as MixtralForCausalLM or Qwen3MoeForCausalLM
 * (doc/ARCHITECTURE.md, "The MoE layer"; mc-formats(5)). Mixtral's router
 * (MixtralTopKRouter) is softmax over all the experts' logits, the top k,
 * renormalized to sum 1: the same probabilities as Megatron's default
 * softmax routing (the top k of the logits, softmax over those k; mc's
 * moe_route_fwd), and the same choice. Qwen3-MoE's router
 * (Qwen3MoeTopKRouter) is the same with norm_topk_prob true, and with
 * norm_topk_prob false the top k of the softmax over all the experts, not
 * renormalized: Megatron's --moe-router-pre-softmax; its dense layers
 * (mlp_only_layers) are --moe-layer-freq's. It always normalizes queries
 * and keys per head (q_norm, k_norm: --qk-layernorm). Everything else that
 * changes a forward is refused, naming it. The balancing and z losses are
 * training-only (router_aux_loss_coef holds the aux loss's coefficient). */
mc_status hf_moe_check(const mc_model_config *c, const char *fmt, const char *alt, int qwen,
                       mc_error *err)
{
    const char *need = NULL, *has = NULL;
    char buf[96];
    int dense = 0;
    for (int l = 0; l < c->num_layers; l++) dense += !mc_model_layer_is_moe(c, l);
    if (c->add_bias_linear)
        need = "no biases", has = "biases (no --disable-bias-linear)";
    else if (c->moe_router_enable_expert_bias)
        need = "no expert bias in the choice", has = "--moe-router-enable-expert-bias";
    else if (c->moe_router_score_sigmoid)
        need = "softmax routing", has = "--moe-router-score-function sigmoid";
    else if (c->moe_router_num_groups > 0)
        need = "routing over all the experts", has = "group-limited routing";
    else if (c->moe_router_topk_scaling_factor > 0 && c->moe_router_topk_scaling_factor != 1)
        need = "probabilities summing to 1", has = "--moe-router-topk-scaling-factor";
    else if (c->moe_expert_capacity_factor > 0)
        need = "no token dropping", has = "--moe-expert-capacity-factor";
    else if (c->moe_shared_expert_intermediate_size > 0)
        need = "no shared experts", has = "--moe-shared-expert-intermediate-size";
    else if (c->moe_router_pre_softmax && !qwen)
        need = "the top-k probabilities renormalized", has = "--moe-router-pre-softmax";
    else if (dense && !qwen) {
        snprintf(buf, sizeof buf, "%d of %d layers dense (--moe-layer-freq)", dense, c->num_layers);
        need = "experts in every layer", has = buf;
    }
    if (!need) return MC_OK;
    int other = !qwen && (c->moe_router_pre_softmax || dense); /* what Qwen3-MoE holds */
    return mc_error_set(
        err, MC_ERR_FORMAT,
        "%s (the format for a mixture of experts) needs %s; this model has %s%s%s%s", fmt, need,
        has, other ? " (" : "", other ? alt : "",
        !other            ? ""
        : c->qk_layernorm ? " holds it)"
                          : " holds it, and normalizes queries and keys per head: train "
                            "with --qk-layernorm)");
}

mc_status hf_arch_for(const mc_model_config *c, hf_arch *out, mc_error *err)
{
    const char *need = NULL, *has = NULL;
    if (c->num_experts > 0 && c->position_embedding_type == MC_POS_LEARNED)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "MixtralForCausalLM (the format for a mixture of experts) needs "
                            "rotary positions; this model has learned absolute positions");
    if (c->position_embedding_type == MC_POS_LEARNED) {
        *out = HF_GPT2;
        if (c->qk_layernorm)
            need = "no query/key norm", has = "--qk-layernorm";
        else if (c->normalization != MC_NORM_LAYERNORM)
            need = "LayerNorm", has = "RMSNorm";
        else if (c->swiglu)
            need = "a GELU MLP", has = "SwiGLU";
        else if (!c->add_bias_linear)
            need = "biases in every linear layer", has = "none (--disable-bias-linear)";
        else if (c->num_query_groups != c->num_attention_heads)
            need = "one key/value head per query head", has = "grouped-query attention";
        else if ((int64_t)c->kv_channels * c->num_attention_heads != c->hidden_size)
            need = "head dim x heads = hidden size", has = "a different --kv-channels";
        if (need)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "GPT2LMHeadModel (the format for learned absolute positions) needs "
                                "%s; this model has %s",
                                need, has);
        return MC_OK;
    }
    /* --qk-layernorm: Qwen3's q_norm and k_norm (RMSNorm over the head) */
    int qk = c->qk_layernorm, moe = c->num_experts > 0;
    *out = qk ? (moe ? HF_QWEN3_MOE : HF_QWEN3) : moe ? HF_MIXTRAL : HF_LLAMA;
    if (c->normalization != MC_NORM_RMSNORM)
        need = "RMSNorm", has = "LayerNorm";
    else if (!c->swiglu)
        need = "a SwiGLU MLP", has = "GELU";
    else if (c->rotary_percent < 1)
        need = "rotary embeddings over the whole head", has = "--rotary-percent below 1";
    else if (qk && c->add_bias_linear) /* Qwen3's MLPs have no biases */
        need = "no biases in the MLP", has = "biases (no --disable-bias-linear)";
    if (need)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s (the format for rotary positions%s) needs %s; this model has %s",
                            hf_arch_name(*out), qk ? " with --qk-layernorm" : "", need, has);
    if (moe) return hf_moe_check(c, hf_arch_name(*out), "Qwen3MoeForCausalLM", qk, err);
    return MC_OK;
}

/* ------------------------------------------------------------ the table */

typedef struct builder {
    hf_map *m;
    mc_error *err;
    int failed;
} builder;

static hf_entry *entry(builder *b, const char *mc, int64_t mc_rows, int64_t mc_cols, int transpose,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A new entry (no ranges yet) for mc tensor `mc` of shape [mc_rows, mc_cols]. */
static hf_entry *entry(builder *b, const char *mc, int64_t mc_rows, int64_t mc_cols, int transpose,
                       const char *fmt, ...)
{
    hf_map *m = b->m;
    if (b->failed) return NULL;
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        hf_entry *e = realloc(m->e, cap * sizeof *e);
        if (!e) {
            b->failed = 1;
            mc_error_set(b->err, MC_ERR_NOMEM, "out of memory");
            return NULL;
        }
        m->e = e;
        m->cap = cap;
    }
    hf_entry *e = &m->e[m->n++];
    memset(e, 0, sizeof *e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->hf, sizeof e->hf, fmt, ap);
    va_end(ap);
    snprintf(e->mc, sizeof e->mc, "%s", mc);
    e->mc_rows = mc_rows;
    e->mc_cols = mc_cols;
    e->cols = mc_cols;
    e->transpose = transpose;
    return e;
}

/* Append rows [row0, row0 + n) (merged with the previous range when they
 * touch). */
static void rows(builder *b, hf_entry *e, int64_t row0, int64_t n)
{
    if (!e || b->failed) return;
    e->rows += n;
    if (e->nranges && e->ranges[e->nranges - 1].row0 + e->ranges[e->nranges - 1].n == row0) {
        e->ranges[e->nranges - 1].n += n;
        return;
    }
    hf_range *r = realloc(e->ranges, (size_t)(e->nranges + 1) * sizeof *r);
    if (!r) {
        b->failed = 1;
        mc_error_set(b->err, MC_ERR_NOMEM, "out of memory");
        return;
    }
    e->ranges = r;
    e->ranges[e->nranges++] = (hf_range){row0, n};
}

/* A whole tensor, row for row. */
static void whole(builder *b, const char *mc, int64_t mc_rows, int64_t mc_cols, int transpose,
                  const char *hf)
{
    hf_entry *e = entry(b, mc, mc_rows, mc_cols, transpose, "%s", hf);
    rows(b, e, 0, mc_rows);
}

void hf_map_free(hf_map *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->e[i].ranges);
    free(m->e);
    memset(m, 0, sizeof *m);
}

/* Which rows of linear_qkv hold the query (part 0), key (1) or value (2)
 * heads, in head order. */
static void qkv_rows(builder *b, hf_entry *e, const mc_model_config *c, int part)
{
    int64_t Q = c->num_attention_heads, G = c->num_query_groups, D = c->kv_channels;
    int64_t per = Q / G + 2; /* heads per group in the fused layout */
    for (int64_t g = 0; g < G; g++) {
        if (part == 0)
            rows(b, e, g * per * D, Q / G * D);
        else
            rows(b, e, (g * per + Q / G + part - 1) * D, D);
    }
}

mc_status hf_map_build(const mc_model_config *c, hf_arch arch, hf_map *m, mc_error *err)
{
    memset(m, 0, sizeof *m);
    m->arch = arch;
    builder b = {m, err, 0};
    int64_t C = c->hidden_size, V = c->vocab_size, Vp = c->padded_vocab_size;
    int64_t Q = c->num_attention_heads, G = c->num_query_groups, D = c->kv_channels;
    int64_t F = c->ffn_hidden_size, QKV = (Q + 2 * G) * D;
    int gpt = arch == HF_GPT2, bias = c->add_bias_linear;
    char mc[128], hf[160];
    hf_entry *e;

    e = entry(&b, "embedding.word_embeddings.weight", Vp, C, 0, "%s",
              gpt ? "transformer.wte.weight" : "model.embed_tokens.weight");
    rows(&b, e, 0, V);
    if (gpt)
        whole(&b, "embedding.position_embeddings.weight", c->max_position_embeddings, C, 0,
              "transformer.wpe.weight");
    for (int l = 0; l < c->num_layers && !b.failed; l++) {
        char a[64], p[64];
        snprintf(a, sizeof a, "decoder.layers.%d.self_attention", l);
        snprintf(p, sizeof p, gpt ? "transformer.h.%d" : "model.layers.%d", l);
#define MC(fmt) (snprintf(mc, sizeof mc, fmt, a), mc)
#define HF(fmt) (snprintf(hf, sizeof hf, fmt, p), hf)
        whole(&b, MC("%s.linear_qkv.layer_norm_weight"), C, 0, 0,
              HF(gpt ? "%s.ln_1.weight" : "%s.input_layernorm.weight"));
        if (gpt) whole(&b, MC("%s.linear_qkv.layer_norm_bias"), C, 0, 0, HF("%s.ln_1.bias"));
        for (int w = 0; w < 1 + bias; w++) {
            const char *kind = w ? "bias" : "weight";
            snprintf(mc, sizeof mc, "%s.linear_qkv.%s", a, kind);
            if (gpt) {
                e = entry(&b, mc, QKV, w ? 0 : C, !w, "%s.attn.c_attn.%s", p, kind);
                for (int part = 0; part < 3; part++) qkv_rows(&b, e, c, part);
            } else {
                static const char *const names[3] = {"q_proj", "k_proj", "v_proj"};
                for (int part = 0; part < 3; part++) {
                    e = entry(&b, mc, QKV, w ? 0 : C, 0, "%s.self_attn.%s.%s", p, names[part],
                              kind);
                    qkv_rows(&b, e, c, part);
                }
            }
        }
        if (c->qk_layernorm && !gpt) { /* Qwen3's q_norm, k_norm (hf_arch_for) */
            whole(&b, MC("%s.q_layernorm.weight"), D, 0, 0, HF("%s.self_attn.q_norm.weight"));
            whole(&b, MC("%s.k_layernorm.weight"), D, 0, 0, HF("%s.self_attn.k_norm.weight"));
        }
        whole(&b, MC("%s.linear_proj.weight"), C, Q * D, gpt,
              HF(gpt ? "%s.attn.c_proj.weight" : "%s.self_attn.o_proj.weight"));
        if (bias)
            whole(&b, MC("%s.linear_proj.bias"), C, 0, 0,
                  HF(gpt ? "%s.attn.c_proj.bias" : "%s.self_attn.o_proj.bias"));
        if (mc_model_layer_is_moe(c, l)) {
            /* the router, then each expert's gate, up and down projections,
             * rows of mc's global [E, rows, cols] tensors, under the names
             * of the published checkpoints (which transformers 5 reads and
             * writes): Mixtral's block_sparse_moe.gate and experts' w1, w3,
             * w2; Qwen3-MoE's mlp.gate and experts' gate_proj, up_proj,
             * down_proj */
            int q3 = arch == HF_QWEN3_MOE;
            const char *ex = q3 ? "mlp.experts" : "block_sparse_moe.experts";
            const char *gate = q3 ? "gate_proj" : "w1", *up = q3 ? "up_proj" : "w3";
            const char *down = q3 ? "down_proj" : "w2";
            int64_t E = c->num_experts, FE = c->moe_ffn_hidden_size;
            snprintf(a, sizeof a, "decoder.layers.%d", l);
            whole(&b, MC("%s.pre_mlp_layernorm.weight"), C, 0, 0,
                  HF("%s.post_attention_layernorm.weight"));
            whole(&b, MC("%s.mlp.router.weight"), E, C, 0,
                  HF(q3 ? "%s.mlp.gate.weight" : "%s.block_sparse_moe.gate.weight"));
            char fc1[128], fc2[128];
            snprintf(fc1, sizeof fc1, "%s.mlp.experts.experts.linear_fc1.weight", a);
            snprintf(fc2, sizeof fc2, "%s.mlp.experts.experts.linear_fc2.weight", a);
            for (int64_t x = 0; x < E && !b.failed; x++) {
                e = entry(&b, fc1, E * 2 * FE, C, 0, "%s.%s.%lld.%s.weight", p, ex, (long long)x,
                          gate);
                rows(&b, e, x * 2 * FE, FE);
                e = entry(&b, fc1, E * 2 * FE, C, 0, "%s.%s.%lld.%s.weight", p, ex, (long long)x,
                          up);
                rows(&b, e, x * 2 * FE + FE, FE);
            }
            /* after fc1's: export reads each mc tensor once */
            for (int64_t x = 0; x < E && !b.failed; x++) {
                e = entry(&b, fc2, E * C, FE, 0, "%s.%s.%lld.%s.weight", p, ex, (long long)x,
                          down);
                rows(&b, e, x * C, C);
            }
            continue;
        }
        snprintf(a, sizeof a, "decoder.layers.%d.mlp", l);
        whole(&b, MC("%s.linear_fc1.layer_norm_weight"), C, 0, 0,
              HF(gpt ? "%s.ln_2.weight" : "%s.post_attention_layernorm.weight"));
        if (gpt) whole(&b, MC("%s.linear_fc1.layer_norm_bias"), C, 0, 0, HF("%s.ln_2.bias"));
        for (int w = 0; w < 1 + bias; w++) {
            const char *kind = w ? "bias" : "weight";
            snprintf(mc, sizeof mc, "%s.linear_fc1.%s", a, kind);
            if (gpt) {
                whole(&b, mc, F, w ? 0 : C, !w, HF(w ? "%s.mlp.c_fc.bias" : "%s.mlp.c_fc.weight"));
            } else {
                e = entry(&b, mc, 2 * F, w ? 0 : C, 0, "%s.mlp.gate_proj.%s", p, kind);
                rows(&b, e, 0, F);
                e = entry(&b, mc, 2 * F, w ? 0 : C, 0, "%s.mlp.up_proj.%s", p, kind);
                rows(&b, e, F, F);
            }
        }
        whole(&b, MC("%s.linear_fc2.weight"), C, F, gpt,
              HF(gpt ? "%s.mlp.c_proj.weight" : "%s.mlp.down_proj.weight"));
        if (bias)
            whole(&b, MC("%s.linear_fc2.bias"), C, 0, 0,
                  HF(gpt ? "%s.mlp.c_proj.bias" : "%s.mlp.down_proj.bias"));
#undef MC
#undef HF
    }
    whole(&b, "decoder.final_layernorm.weight", C, 0, 0,
          gpt ? "transformer.ln_f.weight" : "model.norm.weight");
    if (gpt) whole(&b, "decoder.final_layernorm.bias", C, 0, 0, "transformer.ln_f.bias");
    if (c->untie_embeddings_and_output_weights) {
        e = entry(&b, "output_layer.weight", Vp, C, 0, "lm_head.weight");
        rows(&b, e, 0, V);
    }
    if (b.failed) {
        hf_map_free(m);
        return err ? err->code : MC_ERR_NOMEM;
    }
    return MC_OK;
}

/* ------------------------------------------------------------ config.json */

/* A float as the shortest decimal that reads back as the same float, so
 * config.json says 1e-05 rather than 9.999999747378752e-06. */
static json_t *real(float x)
{
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return json_real(strtod(buf, NULL));
}

json_t *hf_config_json(const mc_model_config *c, hf_arch arch, int64_t eos_id,
                       const char *torch_dtype)
{
    json_t *o = json_object();
    json_t *eos = eos_id >= 0 ? json_integer(eos_id) : json_null();
    json_object_set_new(o, "architectures", json_pack("[s]", hf_arch_name(arch)));
    if (arch == HF_GPT2) {
        json_object_set_new(o, "model_type", json_string("gpt2"));
        json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
        json_object_set_new(o, "n_positions", json_integer(c->max_position_embeddings));
        json_object_set_new(o, "n_ctx", json_integer(c->max_position_embeddings));
        json_object_set_new(o, "n_embd", json_integer(c->hidden_size));
        json_object_set_new(o, "n_layer", json_integer(c->num_layers));
        json_object_set_new(o, "n_head", json_integer(c->num_attention_heads));
        json_object_set_new(o, "n_inner", json_integer(c->ffn_hidden_size));
        json_object_set_new(o, "activation_function", json_string("gelu_new"));
        json_object_set_new(o, "layer_norm_epsilon", real(c->norm_epsilon));
        /* mc trains without dropout */
        json_object_set_new(o, "resid_pdrop", json_real(0));
        json_object_set_new(o, "embd_pdrop", json_real(0));
        json_object_set_new(o, "attn_pdrop", json_real(0));
        json_object_set_new(o, "scale_attn_weights", json_true());
        json_object_set_new(o, "bos_token_id", json_copy(eos));
    } else {
        int mx = arch == HF_MIXTRAL, qm = arch == HF_QWEN3_MOE, q3 = arch == HF_QWEN3 || qm;
        json_object_set_new(o, "model_type",
                            json_string(mx   ? "mixtral"
                                        : qm ? "qwen3_moe"
                                        : q3 ? "qwen3"
                                             : "llama"));
        json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
        json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
        json_object_set_new(o, "intermediate_size",
                            json_integer(mx ? c->moe_ffn_hidden_size : c->ffn_hidden_size));
        json_object_set_new(o, "num_hidden_layers", json_integer(c->num_layers));
        json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
        json_object_set_new(o, "num_key_value_heads", json_integer(c->num_query_groups));
        json_object_set_new(o, "head_dim", json_integer(c->kv_channels));
        json_object_set_new(o, "hidden_act", json_string("silu"));
        json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
        json_object_set_new(o, "rms_norm_eps", real(c->norm_epsilon));
        json_object_set_new(o, "rope_theta", real(c->rotary_base));
        json_object_set_new(o, "rope_scaling",
                            c->use_rope_scaling
                                ? json_pack("{s:s, s:o, s:o, s:o, s:i}", "rope_type", "llama3",
                                            "factor", real(c->rope_scaling_factor),
                                            "low_freq_factor", real(c->rope_low_freq_factor),
                                            "high_freq_factor", real(c->rope_high_freq_factor),
                                            "original_max_position_embeddings",
                                            c->rope_original_max_position_embeddings)
                                : json_null());
        if (mx) {
            /* hf_arch_for checked the routing is Mixtral's; the balancing
             * loss is training's, its coefficient kept, off by default */
            json_object_set_new(o, "num_local_experts", json_integer(c->num_experts));
            json_object_set_new(o, "num_experts_per_tok", json_integer(c->moe_router_topk));
            json_object_set_new(o, "router_aux_loss_coef",
                                c->moe_load_balancing == MC_MOE_LB_NONE
                                    ? json_real(0)
                                    : real(c->moe_aux_loss_coeff));
            json_object_set_new(o, "output_router_logits", json_false());
            json_object_set_new(o, "router_jitter_noise", json_real(0));
            json_object_set_new(o, "sliding_window", json_null());
        } else if (q3) {
            /* hf_arch_for checked: no biases, RMSNorm q_norm/k_norm */
            json_object_set_new(o, "attention_bias", json_false());
            json_object_set_new(o, "use_sliding_window", json_false());
            json_object_set_new(o, "sliding_window", json_null());
            json_object_set_new(o, "max_window_layers", json_integer(c->num_layers));
            if (qm) {
                /* norm_topk_prob false is --moe-router-pre-softmax (hf_moe_check);
                 * the dense layers of --moe-layer-freq listed */
                json_t *dense = json_array();
                for (int l = 0; l < c->num_layers; l++)
                    if (!mc_model_layer_is_moe(c, l)) json_array_append_new(dense, json_integer(l));
                json_object_set_new(o, "num_experts", json_integer(c->num_experts));
                json_object_set_new(o, "num_experts_per_tok", json_integer(c->moe_router_topk));
                json_object_set_new(o, "moe_intermediate_size",
                                    json_integer(c->moe_ffn_hidden_size));
                json_object_set_new(o, "norm_topk_prob", json_boolean(!c->moe_router_pre_softmax));
                json_object_set_new(o, "decoder_sparse_step", json_integer(1));
                json_object_set_new(o, "mlp_only_layers", dense);
                json_object_set_new(o, "router_aux_loss_coef",
                                    c->moe_load_balancing == MC_MOE_LB_NONE
                                        ? json_real(0)
                                        : real(c->moe_aux_loss_coeff));
                json_object_set_new(o, "output_router_logits", json_false());
            }
        } else {
            json_object_set_new(o, "attention_bias", json_boolean(c->add_bias_linear));
            json_object_set_new(o, "mlp_bias", json_boolean(c->add_bias_linear));
            json_object_set_new(o, "pretraining_tp", json_integer(1));
        }
        json_object_set_new(o, "attention_dropout", json_real(0));
        json_object_set_new(o, "bos_token_id", json_null());
    }
    json_object_set_new(o, "eos_token_id", eos);
    json_object_set_new(o, "tie_word_embeddings",
                        json_boolean(!c->untie_embeddings_and_output_weights));
    json_object_set_new(o, "initializer_range", real(c->init_method_std));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype));
    return o;
}

/* Reading: every field is optional and defaults as in transformers'
 * config class; a present field of the wrong type is an error. */
typedef struct reader {
    const json_t *o;
    const char *where;
    mc_error *err;
    mc_status st;
} reader;

static int64_t get_int(reader *r, const char *k, int64_t def, int64_t lo)
{
    json_t *x = json_object_get(r->o, k);
    if (r->st || !x || json_is_null(x)) return def;
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > INT32_MAX) {
        r->st = mc_error_set(r->err, MC_ERR_FORMAT, "%s: %s: expected an integer >= %lld", r->where,
                             k, (long long)lo);
        return def;
    }
    return json_integer_value(x);
}

static double get_num(reader *r, const char *k, double def)
{
    json_t *x = json_object_get(r->o, k);
    if (r->st || !x || json_is_null(x)) return def;
    if (!json_is_number(x) || !(json_number_value(x) > 0)) {
        r->st = mc_error_set(r->err, MC_ERR_FORMAT, "%s: %s: expected a positive number", r->where,
                             k);
        return def;
    }
    return json_number_value(x);
}

static int get_bool(reader *r, const char *k, int def)
{
    json_t *x = json_object_get(r->o, k);
    if (r->st || !x || json_is_null(x)) return def;
    if (!json_is_boolean(x)) {
        r->st = mc_error_set(r->err, MC_ERR_FORMAT, "%s: %s: expected true or false", r->where, k);
        return def;
    }
    return json_is_true(x);
}

static const char *get_str(reader *r, const char *k, const char *def)
{
    json_t *x = json_object_get(r->o, k);
    if (r->st || !x || json_is_null(x)) return def;
    if (!json_is_string(x)) {
        r->st = mc_error_set(r->err, MC_ERR_FORMAT, "%s: %s: expected a string", r->where, k);
        return def;
    }
    return json_string_value(x);
}

/* Refuse a field whose value changes the math in a way mc does not do. */
static void refuse(reader *r, const char *k, const char *why)
{
    if (!r->st) r->st = mc_error_set(r->err, MC_ERR_FORMAT, "%s: %s: %s", r->where, k, why);
}

/* transformers' "llama3" rope_type (rope_scaling, or transformers 5's
 * rope_parameters) into the configuration; any other type is refused. */
static void rope_scaling(reader *r, const char *key, const json_t *rs, mc_model_config *c)
{
    char k[96];
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!json_is_object(rs) || !type || strcmp(type, "llama3")) {
        snprintf(k, sizeof k, "%s.rope_type", key);
        refuse(r, k, "mc's RoPE scaling is Llama 3.1's (\"llama3\") only");
        return;
    }
    static const char *const names[] = {"factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings"};
    double v[4];
    for (int i = 0; i < 4; i++) {
        json_t *x = json_object_get(rs, names[i]);
        v[i] = json_is_number(x) ? json_number_value(x) : -1;
        if (!(v[i] > 0)) {
            snprintf(k, sizeof k, "%s.%s", key, names[i]);
            refuse(r, k, "expected a positive number");
            return;
        }
    }
    c->use_rope_scaling = 1;
    c->rope_scaling_factor = (float)v[0];
    c->rope_low_freq_factor = (float)v[1];
    c->rope_high_freq_factor = (float)v[2];
    c->rope_original_max_position_embeddings = (int)v[3];
}

static hf_arch detect(reader *r)
{
    const char *a = json_string_value(json_array_get(json_object_get(r->o, "architectures"), 0));
    const char *t = get_str(r, "model_type", NULL);
    if (a && !strcmp(a, "GPT2LMHeadModel")) return HF_GPT2;
    if (a && !strcmp(a, "LlamaForCausalLM")) return HF_LLAMA;
    if (!a && t && !strcmp(t, "gpt2")) return HF_GPT2;
    if (!a && t && !strcmp(t, "llama")) return HF_LLAMA;
    if (a ? !strcmp(a, "MixtralForCausalLM") : t && !strcmp(t, "mixtral")) return HF_MIXTRAL;
    if (a ? !strcmp(a, "Qwen3MoeForCausalLM") : t && !strcmp(t, "qwen3_moe")) return HF_QWEN3_MOE;
    if (a ? !strcmp(a, "Qwen3ForCausalLM") : t && !strcmp(t, "qwen3")) return HF_QWEN3;
    if (!r->st) {
        if (a)
            r->st = mc_error_set(r->err, MC_ERR_FORMAT,
                                 "%s: architectures: %s is not supported (mc imports "
                                 "GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM, "
                                 "Qwen3ForCausalLM and Qwen3MoeForCausalLM)",
                                 r->where, a);
        else
            r->st = mc_error_set(r->err, MC_ERR_FORMAT,
                                 "%s: architectures: missing, and model_type %s%s%s is not gpt2, "
                                 "llama, mixtral, qwen3 or qwen3_moe",
                                 r->where, t ? "\"" : "", t ? t : "missing", t ? "\"" : "");
    }
    return HF_GPT2;
}

static void parse_gpt2(reader *r, mc_model_config *c)
{
    c->hidden_size = (int)get_int(r, "n_embd", 768, 1);
    c->num_layers = (int)get_int(r, "n_layer", 12, 1);
    c->num_attention_heads = (int)get_int(r, "n_head", 12, 1);
    c->max_position_embeddings = (int)get_int(r, "n_positions", 1024, 1);
    c->vocab_size = get_int(r, "vocab_size", 50257, 1);
    c->ffn_hidden_size = (int)get_int(r, "n_inner", 4 * (int64_t)c->hidden_size, 1);
    c->norm_epsilon = (float)get_num(r, "layer_norm_epsilon", 1e-5);
    c->init_method_std = (float)get_num(r, "initializer_range", 0.02);
    c->untie_embeddings_and_output_weights = !get_bool(r, "tie_word_embeddings", 1);
    const char *act = get_str(r, "activation_function", "gelu_new");
    if (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        refuse(r, "activation_function",
               "mc's GPT uses the tanh GELU (gelu_new or gelu_pytorch_tanh)");
    if (!get_bool(r, "scale_attn_weights", 1))
        refuse(r, "scale_attn_weights", "mc always scales attention by 1/sqrt(head dim)");
    if (get_bool(r, "scale_attn_by_inverse_layer_idx", 0))
        refuse(r, "scale_attn_by_inverse_layer_idx", "not supported by mc");
    if (get_bool(r, "add_cross_attention", 0))
        refuse(r, "add_cross_attention", "mc has no cross-attention");
    c->normalization = MC_NORM_LAYERNORM;
    c->position_embedding_type = MC_POS_LEARNED;
    c->swiglu = 0;
    c->add_bias_linear = 1;
}

static void parse_llama(reader *r, mc_model_config *c, hf_arch arch)
{
    int mixtral = arch == HF_MIXTRAL, qwen = arch == HF_QWEN3 || arch == HF_QWEN3_MOE;
    c->hidden_size = (int)get_int(r, "hidden_size", 4096, 1);
    c->ffn_hidden_size = (int)get_int(r, "intermediate_size", 11008, 1);
    c->num_layers = (int)get_int(r, "num_hidden_layers", 32, 1);
    c->num_attention_heads = (int)get_int(r, "num_attention_heads", 32, 1);
    c->num_query_groups = (int)get_int(r, "num_key_value_heads", c->num_attention_heads, 1);
    if (!r->st && c->hidden_size % c->num_attention_heads && !json_object_get(r->o, "head_dim"))
        refuse(r, "head_dim", "missing, and hidden_size is not a multiple of num_attention_heads");
    c->kv_channels = (int)get_int(r, "head_dim", c->hidden_size / c->num_attention_heads, 1);
    c->max_position_embeddings = (int)get_int(r, "max_position_embeddings", 2048, 1);
    c->vocab_size = get_int(r, "vocab_size", 32000, 1);
    c->norm_epsilon = (float)get_num(r, "rms_norm_eps", 1e-6);
    c->init_method_std = (float)get_num(r, "initializer_range", 0.02);
    c->untie_embeddings_and_output_weights = !get_bool(r, "tie_word_embeddings", 0);
    const char *act = get_str(r, "hidden_act", "silu");
    if (strcmp(act, "silu")) refuse(r, "hidden_act", "mc's SwiGLU uses silu");
    double theta = get_num(r, "rope_theta", mixtral ? 1e6 : 10000.0);
    json_t *rs = json_object_get(r->o, "rope_scaling");
    if (rs && !json_is_null(rs)) rope_scaling(r, "rope_scaling", rs, c);
    /* transformers 5 writes rope_parameters {"rope_type", "rope_theta"} */
    json_t *rp = json_object_get(r->o, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        const char *type = json_string_value(json_object_get(rp, "rope_type"));
        json_t *th = json_object_get(rp, "rope_theta");
        if (!json_is_object(rp))
            refuse(r, "rope_parameters", "expected an object");
        else if (type && !strcmp(type, "llama3"))
            rope_scaling(r, "rope_parameters", rp, c);
        else if (type && strcmp(type, "default"))
            refuse(r, "rope_parameters.rope_type",
                   "mc's RoPE is \"default\" or Llama 3.1's \"llama3\"");
        else if (th && !(json_is_number(th) && json_number_value(th) > 0))
            refuse(r, "rope_parameters.rope_theta", "expected a positive number");
        else if (th)
            theta = json_number_value(th);
        json_t *prf = json_object_get(rp, "partial_rotary_factor");
        if (prf && !(json_is_number(prf) && json_number_value(prf) == 1.0))
            refuse(r, "rope_parameters.partial_rotary_factor", "mc rotates the whole head");
    }
    json_t *prf = json_object_get(r->o, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && !(json_is_number(prf) && json_number_value(prf) == 1.0))
        refuse(r, "partial_rotary_factor", "mc rotates the whole head");
    c->rotary_base = (float)theta;
    int ab = get_bool(r, "attention_bias", 0), mb = get_bool(r, "mlp_bias", 0);
    if (ab != mb && !qwen) /* Qwen3 has no mlp_bias: refused below */
        refuse(r, "mlp_bias",
               "mc has biases in all linear layers or in none (attention_bias differs)");
    c->add_bias_linear = ab;
    c->normalization = MC_NORM_RMSNORM;
    c->position_embedding_type = MC_POS_ROPE;
    c->swiglu = 1;
    if (qwen) {
        /* Qwen3's q_norm and k_norm (RMSNorm over the head); its MLPs have
         * no biases, so attention_bias must be false too */
        c->qk_layernorm = 1;
        if (c->add_bias_linear)
            refuse(r, "attention_bias",
                   "mc has biases in all linear layers or in none (Qwen3's "
                   "MLPs have none)");
        if (get_bool(r, "use_sliding_window", 0))
            refuse(r, "use_sliding_window", "mc's attention has no window");
    }
    if (arch == HF_QWEN3_MOE) {
        /* Qwen3MoeConfig's fields and defaults: layer l is a mixture of
         * num_experts experts of moe_intermediate_size unless it is in
         * mlp_only_layers or (l + 1) % decoder_sparse_step != 0 (a dense
         * MLP of intermediate_size); the top num_experts_per_tok of the
         * softmax, renormalized with norm_topk_prob, else Megatron's
         * --moe-router-pre-softmax (hf_moe_check) */
        c->num_experts = (int)get_int(r, "num_experts", 128, 1);
        c->num_experts = (int)get_int(r, "num_local_experts", c->num_experts, 1);
        c->moe_router_topk = (int)get_int(r, "num_experts_per_tok", 8, 1);
        c->moe_ffn_hidden_size = (int)get_int(r, "moe_intermediate_size", 768, 1);
        c->moe_router_pre_softmax = !get_bool(r, "norm_topk_prob", 0);
        int64_t step = get_int(r, "decoder_sparse_step", 1, 1);
        json_t *only = json_object_get(r->o, "mlp_only_layers");
        if (only && !json_is_null(only) && !json_is_array(only))
            refuse(r, "mlp_only_layers", "expected a list of layer numbers");
        if (c->num_layers > MC_MOE_MAX_LAYERS)
            refuse(r, "num_hidden_layers", "more layers than mc's --moe-layer-freq list holds");
        int dense = 0;
        for (int l = 0; l < c->num_layers && !r->st; l++) {
            int moe = (l + 1) % step == 0;
            for (size_t i = 0; json_is_array(only) && i < json_array_size(only); i++) {
                json_t *x = json_array_get(only, i);
                if (!json_is_integer(x)) refuse(r, "mlp_only_layers", "expected layer numbers");
                if (json_integer_value(x) == l) moe = 0;
            }
            c->moe_layer_pattern[l] = moe ? '1' : '0';
            dense += !moe;
        }
        c->moe_layer_freq = 1;
        if (!dense) c->moe_layer_pattern[0] = 0; /* every layer: the integer rule */
        c->moe_layer_pattern[c->num_layers < MC_MOE_MAX_LAYERS ? c->num_layers : 0] = 0;
        json_t *coef = json_object_get(r->o, "router_aux_loss_coef");
        double aux = json_is_number(coef) ? json_number_value(coef) : 0.001;
        if (coef && !json_is_null(coef) && !(json_is_number(coef) && aux >= 0))
            refuse(r, "router_aux_loss_coef", "expected a number >= 0");
        c->moe_aux_loss_coeff = get_bool(r, "output_router_logits", 0) ? (float)aux : 0;
        return;
    }
    if (!mixtral) return;
    /* MixtralConfig's fields and defaults: every layer a mixture of
     * num_local_experts experts of intermediate_size, top
     * num_experts_per_tok, Megatron's default softmax routing (hf_arch_for) */
    c->num_experts = (int)get_int(r, "num_local_experts", 8, 1);
    c->moe_router_topk = (int)get_int(r, "num_experts_per_tok", 2, 1);
    c->moe_ffn_hidden_size = c->ffn_hidden_size;
    c->moe_layer_freq = 1;
    /* the balancing loss transformers trains with: router_aux_loss_coef
     * when output_router_logits (mc-train --finetune takes it) */
    json_t *coef = json_object_get(r->o, "router_aux_loss_coef");
    double aux = json_is_number(coef) ? json_number_value(coef) : 0.001;
    if (coef && !json_is_null(coef) && !(json_is_number(coef) && aux >= 0))
        refuse(r, "router_aux_loss_coef", "expected a number >= 0");
    c->moe_aux_loss_coeff = get_bool(r, "output_router_logits", 0) ? (float)aux : 0;
    json_t *sw = json_object_get(r->o, "sliding_window");
    if (sw && !json_is_null(sw)) refuse(r, "sliding_window", "mc's attention has no window");
}

mc_status hf_config_parse(const json_t *cfg, const char *where, mc_model_config *c, hf_arch *arch,
                          mc_error *err)
{
    reader r = {cfg, where, err, MC_OK};
    mc_model_config_init(c);
    if (!json_is_object(cfg))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: not a JSON object", where);
    *arch = detect(&r);
    if (r.st) return r.st;
    if (*arch == HF_GPT2)
        parse_gpt2(&r, c);
    else
        parse_llama(&r, c, *arch);
    if (r.st) return r.st;
    /* A run's length, not the model's: the positions, up to 4096 (mc-train
     * and mc-eval take --seq-length). */
    c->seq_length = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    /* No padding rows: mc's cross-entropy (Megatron's) normalizes over the
     * padded vocabulary, and zero rows would give every padding class logit
     * 0, far above a trained model's usual logits (GPT-2's are mostly well
     * below -20), changing the model. The largest power of two up to
     * Megatron's 128 that divides the vocabulary pads nothing. */
    c->make_vocab_size_divisible_by = 128;
    while (c->vocab_size % c->make_vocab_size_divisible_by) c->make_vocab_size_divisible_by /= 2;
    mc_status st = mc_model_config_finish(c, 1, err);
    if (st) {
        err->code = MC_ERR_FORMAT;
        return mc_error_prefix(err, "%s", where);
    }
    /* hf_arch_for must pick the same architecture back (export of an
     * import); a GPT-2 head dim other than hidden / heads cannot happen. */
    hf_arch back;
    if (hf_arch_for(c, &back, err)) return mc_error_prefix(err, "%s", where);
    return MC_OK;
}
