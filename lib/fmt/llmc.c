/*
 * llmc.c - an mc checkpoint out as llm.c's GPT-2 model file
 * (mc_llmc_export in mc/llmc.h): llm.c's header, the parameters in llm.c's
 * order stacked over the layers, mc's per-head fused qkv rows regrouped to
 * [q; k; v], and the word embeddings padded as llm.c pads them instead of as
 * mc does. Layout: mc-formats(5), LLM.C MODEL FILES.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/ckpt.h"
#include "mc/dtype.h"
#include "mc/file.h"
#include "mc/llmc.h"

/* What llm.c's GPT-2 hard-codes, checked against the configuration. */
static mc_status check_config(const mc_model_config *c, const char *file, mc_error *err)
{
    const char *need = NULL;
    if (c->num_experts > 0) /* llm.c's file has one MLP per layer */
        need = "a dense MLP in every layer (this model is a mixture of experts)";
    else if (c->qk_layernorm)
        need = "no query/key norm (this model has --qk-layernorm)";
    else if (c->position_embedding_type != MC_POS_LEARNED)
        need = "learned absolute positions (this model uses RoPE)";
    else if (c->normalization != MC_NORM_LAYERNORM)
        need = "LayerNorm (this model uses RMSNorm)";
    else if (c->swiglu)
        need = "a GELU MLP (this model uses SwiGLU)";
    else if (!c->add_bias_linear)
        need = "biases in every linear layer (this model has none)";
    else if (c->untie_embeddings_and_output_weights)
        need = "the output layer tied to the word embeddings (this model unties them)";
    else if (c->num_query_groups != c->num_attention_heads)
        need = "one key/value head per query head (this model uses grouped-query attention)";
    else if ((int64_t)c->kv_channels * c->num_attention_heads != c->hidden_size)
        need = "head dim = hidden size / heads (this model sets --kv-channels)";
    else if (c->ffn_hidden_size != 4 * c->hidden_size)
        need = "an MLP of 4 x hidden size (this model sets --ffn-hidden-size)";
    else if (c->norm_epsilon != 1e-5f)
        need = "LayerNorm epsilon 1e-5 (this model sets --norm-epsilon)";
    else if (c->vocab_size > INT32_MAX - MC_LLMC_VOCAB_MULTIPLE)
        need = "a vocabulary that fits int32";
    if (need) return mc_error_set(err, MC_ERR_FORMAT, "%s: llm.c's GPT-2 needs %s", file, need);
    return MC_OK;
}

typedef struct out {
    mc_afile f;
    int bf16;
    uint16_t buf[4096];
} out;

static mc_status put(out *o, const float *x, size_t n, mc_error *err)
{
    if (!o->bf16) return mc_afile_write(&o->f, x, n * sizeof *x, err);
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        for (size_t j = 0; j < k; j++) o->buf[j] = mc_dtype_f32_to_bf16(x[i + j]);
        mc_status st = mc_afile_write(&o->f, o->buf, k * 2, err);
        if (st) return st;
    }
    return MC_OK;
}

static mc_status read_whole(mc_ckpt_reader *r, const char *name, int64_t rows, int64_t cols,
                            float *x, mc_error *err)
{
    char path[160];
    snprintf(path, sizeof path, "model/%s", name);
    return mc_ckpt_read_tensor(r, path, rows, cols, 0, 0, rows, cols, x, err);
}

/* The parameters, in llm.c's order. x and y hold the largest tensor. */
static mc_status write_params(mc_ckpt_reader *r, const mc_model_config *c, int64_t Vp, out *o,
                              float *x, float *y, mc_error *err)
{
    int64_t C = c->hidden_size, V = c->vocab_size, L = c->num_layers, F = c->ffn_hidden_size;
    int64_t H = c->num_attention_heads, D = c->kv_channels, P = c->max_position_embeddings;
    mc_status st = read_whole(r, "embedding.word_embeddings.weight", c->padded_vocab_size, C, x,
                              err);
    if (!st) {
        memset(x + V * C, 0, (size_t)((Vp - V) * C) * sizeof *x);
        st = put(o, x, (size_t)(Vp * C), err);
    }
    if (!st) st = read_whole(r, "embedding.position_embeddings.weight", P, C, x, err);
    if (!st) st = put(o, x, (size_t)(P * C), err);
    /* One group of llm.c: the same tensor of every layer. */
    static const struct {
        const char *fmt;
        int kind; /* 0 vector [C], 1 qkv (regrouped), 2 matrix */
    } groups[] = {
        {"decoder.layers.%d.self_attention.linear_qkv.layer_norm_weight", 0},
        {"decoder.layers.%d.self_attention.linear_qkv.layer_norm_bias", 0},
        {"decoder.layers.%d.self_attention.linear_qkv.weight", 1},
        {"decoder.layers.%d.self_attention.linear_qkv.bias", 1},
        {"decoder.layers.%d.self_attention.linear_proj.weight", 2},
        {"decoder.layers.%d.self_attention.linear_proj.bias", 0},
        {"decoder.layers.%d.mlp.linear_fc1.layer_norm_weight", 0},
        {"decoder.layers.%d.mlp.linear_fc1.layer_norm_bias", 0},
        {"decoder.layers.%d.mlp.linear_fc1.weight", 2},
        {"decoder.layers.%d.mlp.linear_fc1.bias", 0},
        {"decoder.layers.%d.mlp.linear_fc2.weight", 2},
        {"decoder.layers.%d.mlp.linear_fc2.bias", 0},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0] && !st; g++) {
        int is_bias = strstr(groups[g].fmt, ".bias") || strstr(groups[g].fmt, "norm_");
        for (int l = 0; l < L && !st; l++) {
            char name[128];
            snprintf(name, sizeof name, groups[g].fmt, l);
            int64_t rows, cols = is_bias ? 0 : C;
            if (strstr(name, "linear_qkv.weight") || strstr(name, "linear_qkv.bias"))
                rows = 3 * C;
            else if (strstr(name, "linear_fc1.weight") || strstr(name, "linear_fc1.bias"))
                rows = F;
            else if (strstr(name, "linear_fc2.weight"))
                rows = C, cols = F;
            else
                rows = C;
            st = read_whole(r, name, rows, cols, x, err);
            size_t w = (size_t)(cols ? cols : 1), n = (size_t)rows * w;
            if (!st && groups[g].kind == 1) {
                /* mc: per head h rows [q_h; k_h; v_h]; llm.c: [q; k; v] */
                for (int64_t part = 0; part < 3; part++)
                    for (int64_t h = 0; h < H; h++)
                        memcpy(y + (size_t)((part * H + h) * D) * w,
                               x + (size_t)((3 * h + part) * D) * w, (size_t)D * w * sizeof *x);
                st = put(o, y, n, err);
            } else if (!st) {
                st = put(o, x, n, err);
            }
        }
    }
    if (!st) st = read_whole(r, "decoder.final_layernorm.weight", C, 0, x, err);
    if (!st) st = put(o, x, (size_t)C, err);
    if (!st) st = read_whole(r, "decoder.final_layernorm.bias", C, 0, x, err);
    if (!st) st = put(o, x, (size_t)C, err);
    return st;
}

mc_status mc_llmc_export(const char *ckpt, const char *path, int dtype, mc_error *err)
{
    if (dtype != -1 && dtype != MC_CKPT_FLOAT32 && dtype != MC_CKPT_BFLOAT16)
        return mc_error_set(err, MC_ERR_USAGE, "llm.c model files hold fp32 or bf16 parameters");
    mc_ckpt_reader *r = NULL;
    mc_status st = mc_ckpt_open(ckpt, &r, err);
    if (st) return st;
    mc_model_config c;
    st = mc_ckpt_read_model_config(r, &c, err);
    if (!st) st = check_config(&c, mc_ckpt_file(r), err);
    if (!st && dtype < 0) {
        mc_ckpt_dtype d;
        st = mc_ckpt_tensor_info(r, "model/embedding.word_embeddings.weight", NULL, NULL, &d, err);
        dtype = d == MC_CKPT_BFLOAT16 ? MC_CKPT_BFLOAT16 : MC_CKPT_FLOAT32;
    }
    int64_t C = c.hidden_size, V = c.vocab_size;
    int64_t Vp = (V + MC_LLMC_VOCAB_MULTIPLE - 1) / MC_LLMC_VOCAB_MULTIPLE * MC_LLMC_VOCAB_MULTIPLE;
    int64_t rows = c.padded_vocab_size > Vp ? c.padded_vocab_size : Vp;
    if (c.max_position_embeddings > rows) rows = c.max_position_embeddings;
    if (4 * C > rows) rows = 4 * C;
    float *x = NULL, *y = NULL;
    if (!st && (!(x = malloc((size_t)(rows * C) * sizeof *x)) ||
                !(y = malloc((size_t)(rows * C) * sizeof *y))))
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    out *o = st ? NULL : calloc(1, sizeof *o);
    if (!st && !o) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (!st) st = mc_afile_open(&o->f, path, err);
    if (!st) {
        o->bf16 = dtype == MC_CKPT_BFLOAT16;
        int32_t header[256] = {MC_LLMC_MAGIC,
                               o->bf16 ? MC_LLMC_VERSION_BF16 : MC_LLMC_VERSION_FP32,
                               c.max_position_embeddings,
                               (int32_t)V,
                               c.num_layers,
                               c.num_attention_heads,
                               c.hidden_size,
                               (int32_t)Vp};
        st = mc_afile_write(&o->f, header, sizeof header, err);
        if (!st) st = write_params(r, &c, Vp, o, x, y, err);
        if (!st)
            st = mc_afile_commit(&o->f, err);
        else
            mc_afile_abort(&o->f);
    }
    free(o);
    free(x);
    free(y);
    mc_ckpt_close(r);
    return st;
}
