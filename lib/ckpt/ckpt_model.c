/*
 * ckpt_model.c - what a checkpoint says about the model beyond its tensors:
 * the architecture (the "model" object of the root attribute "config") and
 * the tokenizer it was trained with (the root attribute "tokenizer" and
 * the tokenizer's files as byte datasets), so mc-eval, mc-export and
 * mc-reshard need nothing but the checkpoint. Layout: mc-formats(5),
 * CHECKPOINTS ("The file model.h5").
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc/ckpt.h"
#include "mc/file.h"

static mc_status get_int(const json_t *o, const char *k, int64_t lo, int64_t *v, mc_error *err);
static mc_status get_num(const json_t *o, const char *k, float *v, mc_error *err);
static mc_status get_bool(const json_t *o, const char *k, int *v, mc_error *err);

json_t *mc_model_config_json(const mc_model_config *c)
{
    json_t *o = json_pack(
        "{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:i, s:I, s:s, s:f, s:b, "
        "s:s, s:f, s:b, s:b, s:f}",
        "num_layers", c->num_layers, "hidden_size", c->hidden_size, "num_attention_heads",
        c->num_attention_heads, "num_query_groups", c->num_query_groups, "ffn_hidden_size",
        c->ffn_hidden_size, "kv_channels", c->kv_channels, "seq_length", c->seq_length,
        "max_position_embeddings", c->max_position_embeddings, "vocab_size",
        (json_int_t)c->vocab_size, "make_vocab_size_divisible_by", c->make_vocab_size_divisible_by,
        "padded_vocab_size", (json_int_t)c->padded_vocab_size, "normalization",
        c->normalization == MC_NORM_RMSNORM ? "RMSNorm" : "LayerNorm", "norm_epsilon",
        (double)c->norm_epsilon, "swiglu", c->swiglu, "position_embedding_type",
        c->position_embedding_type == MC_POS_ROPE ? "rope" : "learned_absolute", "rotary_base",
        (double)c->rotary_base, "untie_embeddings_and_output_weights",
        c->untie_embeddings_and_output_weights, "add_bias_linear", c->add_bias_linear,
        "init_method_std", (double)c->init_method_std);
    /* written only when not the default, so older files read the same */
    if (o && c->qk_layernorm) json_object_set_new(o, "qk_layernorm", json_true());
    if (o && c->rotary_percent != 1.0f)
        json_object_set_new(o, "rotary_percent", json_real(c->rotary_percent));
    if (o && c->use_rope_scaling)
        json_object_set_new(
            o, "rope_scaling",
            json_pack("{s:f, s:f, s:f, s:i}", "factor", (double)c->rope_scaling_factor,
                      "low_freq_factor", (double)c->rope_low_freq_factor, "high_freq_factor",
                      (double)c->rope_high_freq_factor, "original_max_position_embeddings",
                      c->rope_original_max_position_embeddings));
    if (o && c->num_experts > 0) {
        static const char *const lb[] = {"aux_loss", "seq_aux_loss", "none"};
        json_t *m = json_pack(
            "{s:i, s:i, s:i, s:s, s:b, s:f, s:i, s:i, s:b, s:f, s:s, s:f, s:f, s:i, s:f, s:s, "
            "s:b, s:i, s:s}",
            "num_experts", c->num_experts, "moe_ffn_hidden_size", c->moe_ffn_hidden_size,
            "moe_router_topk", c->moe_router_topk, "moe_router_score_function",
            c->moe_router_score_sigmoid ? "sigmoid" : "softmax", "moe_router_pre_softmax",
            c->moe_router_pre_softmax, "moe_router_topk_scaling_factor",
            (double)c->moe_router_topk_scaling_factor, "moe_router_num_groups",
            c->moe_router_num_groups, "moe_router_group_topk", c->moe_router_group_topk,
            "moe_router_enable_expert_bias", c->moe_router_enable_expert_bias,
            "moe_router_bias_update_rate", (double)c->moe_router_bias_update_rate,
            "moe_router_load_balancing_type", lb[c->moe_load_balancing % 3], "moe_aux_loss_coeff",
            (double)c->moe_aux_loss_coeff, "moe_z_loss_coeff", (double)c->moe_z_loss_coeff,
            "moe_shared_expert_intermediate_size", c->moe_shared_expert_intermediate_size,
            "moe_expert_capacity_factor", (double)c->moe_expert_capacity_factor,
            "moe_token_drop_policy", c->moe_token_drop_position ? "position" : "probs",
            "moe_pad_expert_input_to_capacity", c->moe_pad_expert_input_to_capacity,
            "moe_layer_freq", c->moe_layer_freq, "moe_layer_pattern", c->moe_layer_pattern);
        json_object_set_new(o, "moe", m);
    }
    return o;
}

/* The "moe" object (mc-formats(5)): every field required. */
static mc_status moe_from_json(const json_t *m, mc_model_config *c, mc_error *err)
{
    struct {
        const char *k;
        int *dst;
        int64_t lo;
    } ints[] = {
        {"num_experts", &c->num_experts, 1},
        {"moe_ffn_hidden_size", &c->moe_ffn_hidden_size, 0},
        {"moe_router_topk", &c->moe_router_topk, 1},
        {"moe_router_num_groups", &c->moe_router_num_groups, 0},
        {"moe_router_group_topk", &c->moe_router_group_topk, 0},
        {"moe_shared_expert_intermediate_size", &c->moe_shared_expert_intermediate_size, 0},
        {"moe_layer_freq", &c->moe_layer_freq, 1},
    };
    mc_status st = MC_OK;
    int64_t v;
    if (!json_is_object(m))
        return mc_error_set(err, MC_ERR_FORMAT, "config.model.moe is not an object");
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) {
        st = get_int(m, ints[i].k, ints[i].lo, &v, err);
        if (!st && v > INT32_MAX)
            st = mc_error_set(err, MC_ERR_FORMAT, "config.model.moe.%s is too large", ints[i].k);
        if (!st) *ints[i].dst = (int)v;
    }
    if (!st) st = get_bool(m, "moe_router_pre_softmax", &c->moe_router_pre_softmax, err);
    if (!st)
        st = get_bool(m, "moe_router_enable_expert_bias", &c->moe_router_enable_expert_bias, err);
    if (!st)
        st = get_bool(m, "moe_pad_expert_input_to_capacity", &c->moe_pad_expert_input_to_capacity,
                      err);
    if (!st)
        st = get_num(m, "moe_router_topk_scaling_factor", &c->moe_router_topk_scaling_factor, err);
    if (!st) st = get_num(m, "moe_router_bias_update_rate", &c->moe_router_bias_update_rate, err);
    if (!st) st = get_num(m, "moe_aux_loss_coeff", &c->moe_aux_loss_coeff, err);
    if (!st) st = get_num(m, "moe_z_loss_coeff", &c->moe_z_loss_coeff, err);
    if (!st) st = get_num(m, "moe_expert_capacity_factor", &c->moe_expert_capacity_factor, err);
    if (st) return st;
    const char *sf = json_string_value(json_object_get(m, "moe_router_score_function"));
    const char *lb = json_string_value(json_object_get(m, "moe_router_load_balancing_type"));
    const char *dp = json_string_value(json_object_get(m, "moe_token_drop_policy"));
    const char *pat = json_string_value(json_object_get(m, "moe_layer_pattern"));
    if (!sf || (strcmp(sf, "softmax") && strcmp(sf, "sigmoid")))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.moe.moe_router_score_function must be \"softmax\" or "
                            "\"sigmoid\"");
    if (!lb || (strcmp(lb, "aux_loss") && strcmp(lb, "seq_aux_loss") && strcmp(lb, "none")))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.moe.moe_router_load_balancing_type must be aux_loss, "
                            "seq_aux_loss or none");
    if (!dp || (strcmp(dp, "probs") && strcmp(dp, "position")))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.moe.moe_token_drop_policy must be probs or position");
    if (!pat || strlen(pat) > MC_MOE_MAX_LAYERS || strspn(pat, "01") != strlen(pat))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.moe.moe_layer_pattern must be a string of 0s and 1s");
    c->moe_router_score_sigmoid = !strcmp(sf, "sigmoid");
    c->moe_load_balancing = !strcmp(lb, "aux_loss")       ? MC_MOE_LB_AUX
                            : !strcmp(lb, "seq_aux_loss") ? MC_MOE_LB_SEQ_AUX
                                                          : MC_MOE_LB_NONE;
    c->moe_token_drop_position = !strcmp(dp, "position");
    strcpy(c->moe_layer_pattern, pat);
    return MC_OK;
}

static mc_status get_int(const json_t *o, const char *k, int64_t lo, int64_t *v, mc_error *err)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_integer(x) || json_integer_value(x) < lo)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.%s is missing or not an integer >= %lld", k,
                            (long long)lo);
    *v = json_integer_value(x);
    return MC_OK;
}

static mc_status get_num(const json_t *o, const char *k, float *v, mc_error *err)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_number(x))
        return mc_error_set(err, MC_ERR_FORMAT, "config.model.%s is missing or not a number", k);
    *v = (float)json_number_value(x);
    return MC_OK;
}

static mc_status get_bool(const json_t *o, const char *k, int *v, mc_error *err)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_boolean(x) && !json_is_integer(x))
        return mc_error_set(err, MC_ERR_FORMAT, "config.model.%s is missing or not a boolean", k);
    *v = json_is_boolean(x) ? json_is_true(x) : json_integer_value(x) != 0;
    return MC_OK;
}

mc_status mc_model_config_from_json(const json_t *o, mc_model_config *c, mc_error *err)
{
    mc_model_config_init(c);
    if (!json_is_object(o))
        return mc_error_set(err, MC_ERR_FORMAT, "config.model is missing or not an object");
    struct {
        const char *k;
        int *dst;
        int64_t lo;
    } ints[] = {
        {"num_layers", &c->num_layers, 1},
        {"hidden_size", &c->hidden_size, 1},
        {"num_attention_heads", &c->num_attention_heads, 1},
        {"num_query_groups", &c->num_query_groups, 0},
        {"ffn_hidden_size", &c->ffn_hidden_size, 0},
        {"kv_channels", &c->kv_channels, 0},
        {"seq_length", &c->seq_length, 1},
        {"max_position_embeddings", &c->max_position_embeddings, 1},
        {"make_vocab_size_divisible_by", &c->make_vocab_size_divisible_by, 1},
    };
    mc_status st = MC_OK;
    int64_t v;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) {
        st = get_int(o, ints[i].k, ints[i].lo, &v, err);
        if (!st && v > INT32_MAX)
            st = mc_error_set(err, MC_ERR_FORMAT, "config.model.%s is too large", ints[i].k);
        if (!st) *ints[i].dst = (int)v;
    }
    if (!st) st = get_int(o, "vocab_size", 1, &c->vocab_size, err);
    if (!st) st = get_int(o, "padded_vocab_size", 1, &c->padded_vocab_size, err);
    if (!st) st = get_num(o, "norm_epsilon", &c->norm_epsilon, err);
    if (!st) st = get_num(o, "rotary_base", &c->rotary_base, err);
    if (!st) st = get_num(o, "init_method_std", &c->init_method_std, err);
    if (!st) st = get_bool(o, "swiglu", &c->swiglu, err);
    if (!st)
        st = get_bool(o, "untie_embeddings_and_output_weights",
                      &c->untie_embeddings_and_output_weights, err);
    if (!st) st = get_bool(o, "add_bias_linear", &c->add_bias_linear, err);
    if (!st && json_object_get(o, "qk_layernorm"))
        st = get_bool(o, "qk_layernorm", &c->qk_layernorm, err);
    if (!st && json_object_get(o, "rotary_percent"))
        st = get_num(o, "rotary_percent", &c->rotary_percent, err);
    json_t *rs = json_object_get(o, "rope_scaling");
    if (!st && rs) {
        if (!json_is_object(rs))
            return mc_error_set(err, MC_ERR_FORMAT, "config.model.rope_scaling is not an object");
        int64_t omp = 0;
        c->use_rope_scaling = 1;
        st = get_num(rs, "factor", &c->rope_scaling_factor, err);
        if (!st) st = get_num(rs, "low_freq_factor", &c->rope_low_freq_factor, err);
        if (!st) st = get_num(rs, "high_freq_factor", &c->rope_high_freq_factor, err);
        if (!st) st = get_int(rs, "original_max_position_embeddings", 1, &omp, err);
        if (!st && omp > INT32_MAX)
            st = mc_error_set(
                err, MC_ERR_FORMAT,
                "config.model.rope_scaling.original_max_position_embeddings is too large");
        if (!st) c->rope_original_max_position_embeddings = (int)omp;
        if (st) mc_error_prefix(err, "rope_scaling");
    }
    if (st) return st;
    const char *norm = json_string_value(json_object_get(o, "normalization"));
    const char *pos = json_string_value(json_object_get(o, "position_embedding_type"));
    if (!norm || (strcmp(norm, "LayerNorm") && strcmp(norm, "RMSNorm")))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.normalization must be \"LayerNorm\" or \"RMSNorm\"");
    if (!pos || (strcmp(pos, "learned_absolute") && strcmp(pos, "rope")))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "config.model.position_embedding_type must be "
                            "\"learned_absolute\" or \"rope\"");
    c->normalization = strcmp(norm, "RMSNorm") ? MC_NORM_LAYERNORM : MC_NORM_RMSNORM;
    c->position_embedding_type = strcmp(pos, "rope") ? MC_POS_LEARNED : MC_POS_ROPE;
    json_t *moe = json_object_get(o, "moe");
    if (moe) return moe_from_json(moe, c, err);
    return MC_OK;
}

/* One stored tensor's shape against the one the configuration implies
 * (cols 0: 1-D; rows_at_least: the rows may be more, as a padded vocabulary
 * is). */
static mc_status check_shape(mc_ckpt_reader *r, const char *name, int64_t rows, int64_t cols,
                             int rows_at_least, mc_error *err)
{
    char path[160];
    int64_t fr = 0, fc = 0;
    snprintf(path, sizeof path, "model/%s", name);
    mc_status st = mc_ckpt_tensor_info(r, path, &fr, &fc, NULL, err);
    if (st == MC_ERR_NOTFOUND)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: config.model implies the tensor %s, which the file does not hold",
                            mc_ckpt_file(r), path);
    if (st) return st;
    if (fc != cols || (rows_at_least ? fr < rows : fr != rows))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: %s is [%" PRId64 ", %" PRId64 "], config.model implies %s[%" PRId64
                            ", %" PRId64 "]",
                            mc_ckpt_file(r), path, fr, fc, rows_at_least ? "at least " : "", rows,
                            cols);
    return MC_OK;
}

/* The sizes of config.model against the tensors the file holds, whose own
 * shapes are bounded by the file (ck_open_tensor): a loader allocates the
 * model from the configuration, so a configuration claiming more layers, a
 * wider hidden size or a longer vocabulary than the file stores is refused
 * here, before anything is allocated for it. A model family whose layers
 * are named otherwise checks its own names here. */
static mc_status check_config_sizes(mc_ckpt_reader *r, const mc_model_config *raw, mc_error *err)
{
    mc_model_config c = *raw;
    mc_error e = {0};
    if (mc_model_config_finish(&c, 1, &e)) return MC_OK; /* the loader's finish says why */
    int64_t C = c.hidden_size, F = c.ffn_hidden_size * (c.swiglu ? 2 : 1);
    int64_t qkv = ((int64_t)c.num_attention_heads + 2 * (int64_t)c.num_query_groups) *
                  c.kv_channels;
    mc_status st = check_shape(r, "embedding.word_embeddings.weight", c.vocab_size, C, 1, err);
    if (!st && c.position_embedding_type == MC_POS_LEARNED)
        st = check_shape(r, "embedding.position_embeddings.weight", c.max_position_embeddings, C, 0,
                         err);
    for (int l = 0; l < c.num_layers && !st; l++) {
        char name[128];
        snprintf(name, sizeof name, "decoder.layers.%d.self_attention.linear_qkv.weight", l);
        st = check_shape(r, name, qkv, C, 0, err);
        if (mc_model_layer_is_moe(&c, l)) { /* the router and the experts' [E x fc1, C] */
            int64_t E = c.num_experts, Fe = c.moe_ffn_hidden_size * (c.swiglu ? 2 : 1);
            snprintf(name, sizeof name, "decoder.layers.%d.mlp.router.weight", l);
            if (!st) st = check_shape(r, name, E, C, 0, err);
            snprintf(name, sizeof name, "decoder.layers.%d.mlp.experts.experts.linear_fc1.weight",
                     l);
            if (!st) st = check_shape(r, name, E * Fe, C, 0, err);
            continue;
        }
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.linear_fc1.weight", l);
        if (!st) st = check_shape(r, name, F, C, 0, err);
    }
    return st;
}

mc_status mc_ckpt_read_model_config(mc_ckpt_reader *r, mc_model_config *c, mc_error *err)
{
    json_t *cfg = NULL;
    mc_status st = mc_ckpt_read_json(r, "config", &cfg, err);
    if (!st) {
        st = mc_model_config_from_json(json_object_get(cfg, "model"), c, err);
        if (st) mc_error_prefix(err, "%s", mc_ckpt_file(r));
    }
    json_decref(cfg);
    if (st == MC_ERR_NOTFOUND) st = err->code = MC_ERR_FORMAT;
    if (!st) st = check_config_sizes(r, c, err);
    return st;
}

mc_status mc_ckpt_write_model_config(mc_ckpt_writer *w, const mc_model_config *c, mc_error *err)
{
    json_t *root = json_pack("{s:o}", "model", mc_model_config_json(c));
    char *text = root ? json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17))
                      : NULL;
    json_decref(root);
    mc_status st = text ? mc_ckpt_write_json(w, "config", text, err)
                        : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}

/* ------------------------------------------------------------ tokenizer */

/* which file, and the dataset holding its bytes; "config" is the
 * tokenizer_config.json found beside a Hugging Face tokenizer.json (its
 * chat template and special tokens, for exports and chat) */
#define N_TOK_FILES 4
static const char *const TOK_FILES[N_TOK_FILES][2] = {{"model", "tokenizer_model"},
                                                      {"vocab", "tokenizer_vocab"},
                                                      {"merges", "tokenizer_merges"},
                                                      {"config", "tokenizer_config"}};

static mc_status put_file(mc_ckpt_writer *w, const char *path, const char *key, json_t *files,
                          const char *which, mc_error *err)
{
    char *data = NULL;
    size_t n = 0;
    mc_status st = mc_read_file(path, &data, &n, err);
    if (!st) st = mc_ckpt_write_bytes(w, key, data, n, err);
    free(data);
    if (!st) {
        const char *base = strrchr(path, '/');
        json_object_set_new(files, which, json_string(base ? base + 1 : path));
    }
    return st;
}

mc_status mc_ckpt_write_tokenizer(mc_ckpt_writer *w, const mc_tokenizer_spec *s, mc_error *err)
{
    json_t *root = json_object(), *files = json_object();
    json_object_set_new(root, "type", json_string(mc_tokenizer_kind_name(s->kind)));
    mc_status st = MC_OK;
    if (s->model) st = put_file(w, s->model, TOK_FILES[0][1], files, "model", err);
    if (!st && s->vocab_file) st = put_file(w, s->vocab_file, TOK_FILES[1][1], files, "vocab", err);
    if (!st && s->merge_file)
        st = put_file(w, s->merge_file, TOK_FILES[2][1], files, "merges", err);
    if (!st && s->kind == MC_TOKENIZER_HUGGINGFACE && s->model) {
        const char *slash = strrchr(s->model, '/');
        char *cfg = slash ? mc_strprintf("%.*s/tokenizer_config.json", (int)(slash - s->model),
                                         s->model)
                          : mc_strprintf("tokenizer_config.json");
        if (!cfg)
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        else if (access(cfg, R_OK) == 0)
            st = put_file(w, cfg, TOK_FILES[3][1], files, "config", err);
        free(cfg);
    }
    json_object_set_new(root, "files", files);
    if (s->kind == MC_TOKENIZER_TIKTOKEN) {
        json_t *sp = json_array();
        for (size_t i = 0; i < s->n_tiktoken_special_tokens; i++)
            json_array_append_new(sp, json_string(s->tiktoken_special_tokens[i]));
        json_object_set_new(root, "tiktoken_pattern",
                            json_string(s->tiktoken_pattern ? s->tiktoken_pattern : "v2"));
        json_object_set_new(root, "tiktoken_num_special_tokens",
                            json_integer(s->tiktoken_num_special_tokens));
        json_object_set_new(root, "tiktoken_special_tokens", sp);
    }
    if (s->kind == MC_TOKENIZER_NULL)
        json_object_set_new(root, "vocab_size", json_integer(s->vocab_size));
    char *text = st ? NULL : json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(root);
    if (!st)
        st = text ? mc_ckpt_write_json(w, "tokenizer", text, err)
                  : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}

int mc_ckpt_has_tokenizer(mc_ckpt_reader *r)
{
    json_t *t = NULL;
    mc_error e = {0};
    if (mc_ckpt_read_json(r, "tokenizer", &t, &e)) return 0;
    json_decref(t);
    return 1;
}

mc_status mc_ckpt_read_tokenizer_file(mc_ckpt_reader *r, const char *which, void **data, size_t *n,
                                      mc_error *err)
{
    for (int i = 0; i < N_TOK_FILES; i++)
        if (!strcmp(which, TOK_FILES[i][0]))
            return mc_ckpt_read_bytes(r, TOK_FILES[i][1], data, n, err);
    return mc_error_set(err, MC_ERR_USAGE, "unknown tokenizer file \"%s\"", which);
}

json_t *mc_ckpt_tokenizer_config(mc_ckpt_reader *r)
{
    json_t *t = NULL, *cfg = NULL;
    mc_error e = {0};
    if (mc_ckpt_read_json(r, "tokenizer", &t, &e)) return NULL;
    if (json_object_get(json_object_get(t, "files"), "config")) {
        void *data = NULL;
        size_t n = 0;
        json_error_t je;
        if (!mc_ckpt_read_tokenizer_file(r, "config", &data, &n, &e))
            cfg = json_loadb(data, n, 0, &je);
        free(data);
        if (cfg && !json_is_object(cfg)) {
            json_decref(cfg);
            cfg = NULL;
        }
    }
    json_decref(t);
    return cfg;
}

mc_status mc_ckpt_copy_tokenizer(mc_ckpt_reader *r, mc_ckpt_writer *w, mc_error *err)
{
    json_t *t = NULL;
    mc_error e = {0};
    if (mc_ckpt_read_json(r, "tokenizer", &t, &e)) return MC_OK; /* none to copy */
    char *text = json_dumps(t, JSON_SORT_KEYS | JSON_COMPACT);
    mc_status st = text ? mc_ckpt_write_json(w, "tokenizer", text, err)
                        : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    free(text);
    json_t *files = json_object_get(t, "files");
    for (int i = 0; i < N_TOK_FILES && !st; i++) {
        if (!json_object_get(files, TOK_FILES[i][0])) continue;
        void *data = NULL;
        size_t n = 0;
        st = mc_ckpt_read_bytes(r, TOK_FILES[i][1], &data, &n, err);
        if (!st) st = mc_ckpt_write_bytes(w, TOK_FILES[i][1], data, n, err);
        free(data);
    }
    json_decref(t);
    return st;
}

/* Write bytes to a fresh temporary file; its path goes to path[cap]. */
static mc_status temp_file(const void *data, size_t n, char *path, size_t cap, mc_error *err)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, cap, "%s/mc-tokenizer-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return mc_error_set(err, MC_ERR_IO, "%s: cannot create a temporary file", path);
    const char *p = data;
    size_t left = n;
    while (left) {
        ssize_t k = write(fd, p, left);
        if (k <= 0) {
            close(fd);
            unlink(path);
            return mc_error_set(err, MC_ERR_IO, "%s: cannot write the tokenizer", path);
        }
        p += k;
        left -= (size_t)k;
    }
    close(fd);
    return MC_OK;
}

/* The tokenizer loaders read files, so the stored bytes are written to
 * temporary files under $TMPDIR (or /tmp), unlinked after use. */
mc_status mc_ckpt_read_tokenizer(mc_ckpt_reader *r, mc_tokenizer **out, mc_error *err)
{
    *out = NULL;
    json_t *t = NULL;
    mc_status st = mc_ckpt_read_json(r, "tokenizer", &t, err);
    if (st) {
        json_decref(t);
        if (st == MC_ERR_NOTFOUND)
            return mc_error_set(err, MC_ERR_NOTFOUND,
                                "%s: the checkpoint holds no tokenizer (it was trained without "
                                "--tokenizer-type, or by an mc older than 0.2)",
                                mc_ckpt_file(r));
        return mc_error_prefix(err, "%s", mc_ckpt_file(r));
    }
    mc_tokenizer_spec spec;
    mc_tokenizer_kind kind;
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || mc_tokenizer_kind_parse(type, &kind, err)) {
        json_decref(t);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: attribute tokenizer has no known \"type\"",
                            mc_ckpt_file(r));
    }
    mc_tokenizer_spec_init(&spec, kind);
    char paths[3][512] = {{0}};
    json_t *files = json_object_get(t, "files");
    for (int i = 0; i < 3 && !st; i++) { /* the files a tokenizer loads (not "config") */
        if (!json_object_get(files, TOK_FILES[i][0])) continue;
        void *data = NULL;
        size_t n = 0;
        st = mc_ckpt_read_bytes(r, TOK_FILES[i][1], &data, &n, err);
        if (!st) st = temp_file(data, n, paths[i], sizeof paths[i], err);
        free(data);
    }
    const char **sp = NULL;
    if (!st) {
        spec.model = paths[0][0] ? paths[0] : NULL;
        spec.vocab_file = paths[1][0] ? paths[1] : NULL;
        spec.merge_file = paths[2][0] ? paths[2] : NULL;
        json_t *x;
        if ((x = json_object_get(t, "tiktoken_pattern")) && json_is_string(x))
            spec.tiktoken_pattern = json_string_value(x);
        if ((x = json_object_get(t, "tiktoken_num_special_tokens")) && json_is_integer(x))
            spec.tiktoken_num_special_tokens = json_integer_value(x);
        if ((x = json_object_get(t, "tiktoken_special_tokens")) && json_is_array(x)) {
            size_t k = json_array_size(x);
            if (!(sp = calloc(k + 1, sizeof *sp)))
                st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", mc_ckpt_file(r));
            for (size_t i = 0; i < k && !st; i++)
                if (!(sp[i] = json_string_value(json_array_get(x, i))))
                    st = mc_error_set(err, MC_ERR_FORMAT,
                                      "%s: attribute tokenizer: tiktoken_special_tokens[%zu] is "
                                      "not a string",
                                      mc_ckpt_file(r), i);
            spec.tiktoken_special_tokens = sp;
            spec.n_tiktoken_special_tokens = k;
        }
        if ((x = json_object_get(t, "vocab_size")) && json_is_integer(x))
            spec.vocab_size = json_integer_value(x);
        if (!st) {
            st = mc_tokenizer_load(&spec, out, err);
            if (st) mc_error_prefix(err, "%s: stored tokenizer", mc_ckpt_file(r));
        }
    }
    for (int i = 0; i < 3; i++)
        if (paths[i][0]) unlink(paths[i]);
    free(sp);
    json_decref(t);
    return st;
}
