/*
 * config.c - the model configuration: Megatron's defaults, the named
 * presets, and the derivation and checks Megatron does in validate_args and
 * TransformerConfig.__post_init__ (ffn size, head dim, query groups, vocab
 * padding, divisibility by the tensor-parallel size).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

void mc_model_config_init(mc_model_config *c)
{
    memset(c, 0, sizeof *c);
    c->make_vocab_size_divisible_by = 128;
    c->normalization = MC_NORM_LAYERNORM;
    c->norm_epsilon = 1e-5f;
    c->swiglu = 0;
    c->position_embedding_type = MC_POS_LEARNED;
    c->rotary_base = 10000.0f;
    c->rotary_percent = 1.0f;
    c->rope_scaling_factor = 8.0f; /* Megatron's and Llama 3.1's */
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_position_embeddings = 8192;
    c->untie_embeddings_and_output_weights = 0;
    c->add_bias_linear = 1;
    c->init_method_std = 0.02f;
    c->moe_router_topk = 2;
    c->moe_router_bias_update_rate = 1e-3f;
    c->moe_load_balancing = MC_MOE_LB_AUX;
    c->moe_layer_freq = 1;
}

/* GPT-2 shapes (Radford et al. 2019) with Megatron's GPT recipe: LayerNorm,
 * GELU, learned positions, biases, tied embeddings. The vocabulary comes
 * from the tokenizer, so vocab_size is left for the caller. */
static void preset_gpt(mc_model_config *c, int layers, int hidden, int heads, int seq)
{
    mc_model_config_init(c);
    c->num_layers = layers;
    c->hidden_size = hidden;
    c->num_attention_heads = heads;
    c->seq_length = seq;
    c->max_position_embeddings = seq;
}

/* The Llama recipe: RMSNorm, SwiGLU, RoPE, grouped-query attention, no
 * biases, and an untied output layer (mc's Llama family is always untied,
 * even where the Hugging Face model it borrows a shape from ties them). */
static void preset_llama(mc_model_config *c, int layers, int hidden, int heads, int groups, int ffn,
                         int seq, float rope_base)
{
    mc_model_config_init(c);
    c->num_layers = layers;
    c->hidden_size = hidden;
    c->num_attention_heads = heads;
    c->num_query_groups = groups;
    c->ffn_hidden_size = ffn;
    c->seq_length = seq;
    c->max_position_embeddings = seq;
    c->normalization = MC_NORM_RMSNORM;
    c->swiglu = 1;
    c->position_embedding_type = MC_POS_ROPE;
    c->rotary_base = rope_base;
    c->untie_embeddings_and_output_weights = 1;
    c->add_bias_linear = 0;
}

static const char *const preset_names[] = {
    "gpt2-124m", "gpt2-350m", "gpt2-774m",  "gpt2-1.5b", "llama-160m",
    "llama-1b",  "tiny-gpt",  "tiny-llama", NULL,
};

const char *const *mc_model_preset_names(void) { return preset_names; }

mc_status mc_model_preset(const char *name, mc_model_config *c, mc_error *err)
{
    if (!strcmp(name, "gpt2-124m"))
        preset_gpt(c, 12, 768, 12, 1024);
    else if (!strcmp(name, "gpt2-350m"))
        preset_gpt(c, 24, 1024, 16, 1024);
    else if (!strcmp(name, "gpt2-774m"))
        preset_gpt(c, 36, 1280, 20, 1024);
    else if (!strcmp(name, "gpt2-1.5b"))
        preset_gpt(c, 48, 1600, 25, 1024);
    /* A small Llama for experiments: the GPT-2 124M trunk with 4 KV groups
     * and the SwiGLU size Megatron derives for 768 (2048). RoPE base 10000
     * as Llama 1/2; llama-1b uses Llama 3's 500000. */
    else if (!strcmp(name, "llama-160m"))
        preset_llama(c, 12, 768, 12, 4, 2048, 2048, 10000.0f);
    /* Llama-3.2-1B's shape (16 x 2048, 32 heads, 8 KV groups, ffn 8192,
     * rope base 500000), seq 2048; untied, unlike the HF checkpoint. */
    else if (!strcmp(name, "llama-1b"))
        preset_llama(c, 16, 2048, 32, 8, 8192, 2048, 500000.0f);
    /* Test-sized models. */
    else if (!strcmp(name, "tiny-gpt"))
        preset_gpt(c, 2, 64, 4, 64);
    else if (!strcmp(name, "tiny-llama"))
        preset_llama(c, 2, 64, 4, 2, 128, 64, 10000.0f);
    else
        return mc_error_set(err, MC_ERR_USAGE,
                            "unknown model preset '%s' (known: gpt2-124m, gpt2-350m, gpt2-774m, "
                            "gpt2-1.5b, llama-160m, llama-1b, tiny-gpt, tiny-llama)",
                            name);
    return MC_OK;
}

/* Megatron's _vocab_size_with_padding: up to a multiple of
 * make_vocab_size_divisible_by * tp, so every rank's vocabulary slice has
 * the same size and a GEMM-friendly multiple. */
static int64_t padded_vocab(int64_t v, int64_t multiple)
{
    return (v + multiple - 1) / multiple * multiple;
}

#define BAD(...) mc_error_set(err, MC_ERR_USAGE, "model config: " __VA_ARGS__)

/* ------------------------------------------------------------ mixture of experts */

/* --moe-layer-freq's list expressions: a tiny recursive-descent parser of
 *   sum := product ('+' product)*      list concatenation
 *   product := atom ('*' atom)*        a list times an integer (either side)
 *   atom := '[' INT (',' INT)* ']' | '(' sum ')' | INT
 * Values are lists of 0/1 (as bytes) or plain integers. */
typedef struct lf_val {
    int is_list;
    long n; /* the integer, or the list's length */
    unsigned char v[MC_MOE_MAX_LAYERS];
} lf_val;

typedef struct lf_parser {
    const char *s, *p;
    mc_error *err;
} lf_parser;

static mc_status lf_fail(lf_parser *ps, const char *what)
{
    return mc_error_set(ps->err, MC_ERR_USAGE,
                        "--moe-layer-freq '%s': %s at character %d (an integer, or a list such "
                        "as ([0]*1+[1]*3)*4)",
                        ps->s, what, (int)(ps->p - ps->s) + 1);
}

static void lf_space(lf_parser *ps)
{
    while (*ps->p == ' ') ps->p++;
}

static mc_status lf_sum(lf_parser *ps, lf_val *out);

static mc_status lf_int(lf_parser *ps, long *v)
{
    lf_space(ps);
    if (*ps->p < '0' || *ps->p > '9') return lf_fail(ps, "expected a number");
    long x = 0;
    while (*ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > 1000000) return lf_fail(ps, "number too large");
    }
    *v = x;
    return MC_OK;
}

static mc_status lf_atom(lf_parser *ps, lf_val *out)
{
    lf_space(ps);
    mc_status st;
    if (*ps->p == '(') {
        ps->p++;
        if ((st = lf_sum(ps, out))) return st;
        lf_space(ps);
        if (*ps->p != ')') return lf_fail(ps, "expected ')'");
        ps->p++;
        return MC_OK;
    }
    if (*ps->p == '[') {
        ps->p++;
        out->is_list = 1;
        out->n = 0;
        lf_space(ps);
        if (*ps->p == ']') return ps->p++, MC_OK;
        for (;;) {
            long x;
            if ((st = lf_int(ps, &x))) return st;
            if (x > 1) return lf_fail(ps, "list entries must be 0 or 1");
            if (out->n >= MC_MOE_MAX_LAYERS) return lf_fail(ps, "list too long");
            out->v[out->n++] = (unsigned char)x;
            lf_space(ps);
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p != ']') return lf_fail(ps, "expected ',' or ']'");
            ps->p++;
            return MC_OK;
        }
    }
    out->is_list = 0;
    return lf_int(ps, &out->n);
}

static mc_status lf_product(lf_parser *ps, lf_val *out)
{
    mc_status st = lf_atom(ps, out);
    lf_val *b = malloc(sizeof *b);
    if (!b) return mc_error_set(ps->err, MC_ERR_NOMEM, "out of memory");
    for (lf_space(ps); !st && *ps->p == '*'; lf_space(ps)) {
        ps->p++;
        if ((st = lf_atom(ps, b))) break;
        if (out->is_list == b->is_list) {
            st = lf_fail(ps, "'*' needs a list and an integer");
            break;
        }
        lf_val *list = out->is_list ? out : b;
        long times = out->is_list ? b->n : out->n, len = list->n;
        if (len * times > MC_MOE_MAX_LAYERS) {
            st = lf_fail(ps, "list too long");
            break;
        }
        for (long r = 1; r < times; r++) memcpy(list->v + r * len, list->v, (size_t)len);
        list->n = len * times;
        if (list == b) *out = *b;
    }
    free(b);
    return st;
}

static mc_status lf_sum(lf_parser *ps, lf_val *out)
{
    mc_status st = lf_product(ps, out);
    lf_val *b = malloc(sizeof *b);
    if (!b) return mc_error_set(ps->err, MC_ERR_NOMEM, "out of memory");
    for (lf_space(ps); !st && *ps->p == '+'; lf_space(ps)) {
        ps->p++;
        if ((st = lf_product(ps, b))) break;
        if (!out->is_list || !b->is_list) {
            st = lf_fail(ps, "'+' joins two lists");
            break;
        }
        if (out->n + b->n > MC_MOE_MAX_LAYERS) {
            st = lf_fail(ps, "list too long");
            break;
        }
        memcpy(out->v + out->n, b->v, (size_t)b->n);
        out->n += b->n;
    }
    free(b);
    return st;
}

mc_status mc_moe_layer_freq_parse(const char *s, mc_model_config *c, mc_error *err)
{
    lf_parser ps = {s, s, err};
    lf_val *v = malloc(sizeof *v);
    if (!v) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status st = lf_sum(&ps, v);
    lf_space(&ps);
    if (!st && *ps.p) st = lf_fail(&ps, "unexpected text");
    if (!st && !v->is_list && v->n < 1) st = lf_fail(&ps, "the frequency must be at least 1");
    if (!st && v->is_list && v->n == 0) st = lf_fail(&ps, "the list is empty");
    if (!st) {
        c->moe_layer_freq = v->is_list ? 1 : (int)v->n;
        c->moe_layer_pattern[0] = 0;
        if (v->is_list) {
            for (long i = 0; i < v->n; i++) c->moe_layer_pattern[i] = (char)('0' + v->v[i]);
            c->moe_layer_pattern[v->n] = 0;
        }
    }
    free(v);
    return st;
}

int mc_model_layer_is_moe(const mc_model_config *c, int l)
{
    if (c->num_experts <= 0) return 0;
    if (c->moe_layer_pattern[0]) return c->moe_layer_pattern[l] == '1';
    return l % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
}

int mc_model_num_moe_layers(const mc_model_config *c)
{
    int n = 0;
    for (int l = 0; l < c->num_layers; l++) n += mc_model_layer_is_moe(c, l);
    return n;
}

mc_status mc_model_refuse_moe(const mc_model_config *c, const char *path, const char *what,
                              mc_error *err)
{
    if (c->num_experts <= 0) return MC_OK;
    return mc_error_set(err, MC_ERR_USAGE,
                        "%s: a mixture-of-experts checkpoint (%d experts): %s is not implemented "
                        "yet",
                        path, c->num_experts, what);
}

/* Megatron's checks of the MoE flags (validate_args, TransformerConfig). */
static mc_status moe_finish(mc_model_config *c, mc_error *err)
{
    int E = c->num_experts, K = c->moe_router_topk;
    if (E < 1 || E > MC_MOE_MAX_EXPERTS)
        return BAD("--num-experts must be in [1, %d] (got %d)", MC_MOE_MAX_EXPERTS, E);
    if (K < 1 || K > E)
        return BAD("--moe-router-topk (%d) must be between 1 and --num-experts (%d)", K, E);
    if (c->moe_ffn_hidden_size < 0) return BAD("--moe-ffn-hidden-size must be positive");
    if (c->moe_ffn_hidden_size == 0) c->moe_ffn_hidden_size = c->ffn_hidden_size;
    if (c->moe_router_num_groups || c->moe_router_group_topk) {
        int G = c->moe_router_num_groups, g = c->moe_router_group_topk;
        if (G < 1 || g < 1)
            return BAD("--moe-router-num-groups and --moe-router-group-topk go together "
                       "(got %d and %d)",
                       G, g);
        if (E % G)
            return BAD("--num-experts (%d) must be a multiple of --moe-router-num-groups (%d)", E,
                       G);
        if (g > G)
            return BAD("--moe-router-group-topk (%d) must be at most --moe-router-num-groups (%d)",
                       g, G);
        if (K % g || K / g > E / G)
            return BAD("--moe-router-topk (%d) must be a multiple of --moe-router-group-topk (%d) "
                       "and topk / group-topk at most the %d experts of a group",
                       K, g, E / G);
    }
    if (c->moe_shared_expert_intermediate_size < 0)
        return BAD("--moe-shared-expert-intermediate-size must be positive");
    if (c->moe_shared_expert_intermediate_size > 0 && c->add_bias_linear)
        return BAD("--moe-shared-expert-intermediate-size: shared experts have no biases "
                   "(Megatron's rule): add --disable-bias-linear");
    if (c->moe_router_enable_expert_bias && !c->moe_router_score_sigmoid)
        return BAD("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid");
    if (c->moe_router_topk_scaling_factor < 0)
        return BAD("--moe-router-topk-scaling-factor must be positive");
    if (c->moe_aux_loss_coeff < 0 || c->moe_z_loss_coeff < 0)
        return BAD("--moe-aux-loss-coeff and --moe-z-loss-coeff must not be negative");
    if (c->moe_expert_capacity_factor < 0)
        return BAD("--moe-expert-capacity-factor must be greater than 0 (got %g)",
                   (double)c->moe_expert_capacity_factor);
    if (c->moe_pad_expert_input_to_capacity && !(c->moe_expert_capacity_factor > 0))
        return BAD("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
    if (c->moe_layer_freq < 1) return BAD("--moe-layer-freq must be at least 1");
    size_t n = strlen(c->moe_layer_pattern);
    if (n && n != (size_t)c->num_layers)
        return BAD("--moe-layer-freq lists %zu layers, --num-layers is %d", n, c->num_layers);
    return MC_OK;
}

mc_status mc_model_config_finish(mc_model_config *c, int tp, mc_error *err)
{
    if (tp < 1) return BAD("--tensor-model-parallel-size must be at least 1 (got %d)", tp);
    if (c->num_layers < 1) return BAD("--num-layers must be at least 1 (got %d)", c->num_layers);
    if (c->hidden_size < 1) return BAD("--hidden-size must be at least 1 (got %d)", c->hidden_size);
    if (c->num_attention_heads < 1)
        return BAD("--num-attention-heads must be at least 1 (got %d)", c->num_attention_heads);
    if (c->seq_length < 1) return BAD("--seq-length must be at least 1 (got %d)", c->seq_length);
    if (c->vocab_size < 1)
        return BAD("vocabulary size unknown: give --tokenizer-type/--tokenizer-model or "
                   "--vocab-size");
    if (c->make_vocab_size_divisible_by < 1)
        return BAD("--make-vocab-size-divisible-by must be at least 1 (got %d)",
                   c->make_vocab_size_divisible_by);
    if (c->num_query_groups < 0 || c->ffn_hidden_size < 0 || c->kv_channels < 0 ||
        c->max_position_embeddings < 0)
        return BAD("--num-query-groups, --ffn-hidden-size, --kv-channels and "
                   "--max-position-embeddings must not be negative");
    if (!(c->norm_epsilon > 0)) return BAD("--norm-epsilon must be positive");
    if (!(c->init_method_std >= 0)) return BAD("--init-method-std must not be negative");

    /* TransformerConfig.__post_init__ and validate_args, in their order. */
    if (c->num_attention_heads % tp)
        return BAD("--num-attention-heads (%d) must be a multiple of "
                   "--tensor-model-parallel-size (%d)",
                   c->num_attention_heads, tp);
    if (c->ffn_hidden_size == 0)
        /* With SwiGLU two input projections share the budget of one 4h
         * projection: 2/3 of 4h, down to a multiple of 64 (Megatron). */
        c->ffn_hidden_size = c->swiglu ? (int)((4.0 * c->hidden_size * 2.0 / 3.0) / 64) * 64
                                       : 4 * c->hidden_size;
    if (c->ffn_hidden_size < 1)
        return BAD("--ffn-hidden-size derived from --hidden-size %d is 0: give it explicitly",
                   c->hidden_size);
    if (c->kv_channels == 0) {
        if (c->hidden_size % c->num_attention_heads)
            return BAD("--hidden-size (%d) must be a multiple of --num-attention-heads (%d) "
                       "unless --kv-channels is given",
                       c->hidden_size, c->num_attention_heads);
        c->kv_channels = c->hidden_size / c->num_attention_heads;
    }
    if (c->num_query_groups == 0) c->num_query_groups = c->num_attention_heads;
    if (c->num_attention_heads % c->num_query_groups)
        return BAD("--num-attention-heads (%d) must be a multiple of --num-query-groups (%d)",
                   c->num_attention_heads, c->num_query_groups);
    /* Megatron also accepts fewer groups than tp ranks (replicating KV
     * heads); mc splits whole groups over the ranks, so it does not. */
    if (c->num_query_groups % tp)
        return BAD("--num-query-groups (%d) must be a multiple of "
                   "--tensor-model-parallel-size (%d)",
                   c->num_query_groups, tp);
    if (c->ffn_hidden_size % tp)
        return BAD("--ffn-hidden-size (%d) must be a multiple of "
                   "--tensor-model-parallel-size (%d)",
                   c->ffn_hidden_size, tp);
    if (c->position_embedding_type == MC_POS_ROPE && c->kv_channels % 2)
        return BAD("rotary embeddings need an even head dimension (--kv-channels %d)",
                   c->kv_channels);
    if (c->max_position_embeddings == 0) c->max_position_embeddings = c->seq_length;
    if (c->position_embedding_type == MC_POS_LEARNED && c->max_position_embeddings < c->seq_length)
        return BAD("--seq-length (%d) exceeds --max-position-embeddings (%d)", c->seq_length,
                   c->max_position_embeddings);
    if (c->position_embedding_type == MC_POS_ROPE && !(c->rotary_base > 0))
        return BAD("--rotary-base must be positive");
    if (!(c->rotary_percent > 0 && c->rotary_percent <= 1))
        return BAD("--rotary-percent must be in (0, 1], got %g", (double)c->rotary_percent);
    if (c->position_embedding_type == MC_POS_ROPE && c->rotary_percent < 1) {
        double r = c->kv_channels * (double)c->rotary_percent;
        if (r != floor(r) || (int)r % 2 || r < 2)
            return BAD("--rotary-percent %g of the head dimension %d is %g dims: it must be a "
                       "positive even number",
                       (double)c->rotary_percent, c->kv_channels, r);
    }
    if (c->use_rope_scaling && !(c->rope_scaling_factor >= 1 && c->rope_low_freq_factor > 0 &&
                                 c->rope_high_freq_factor > c->rope_low_freq_factor &&
                                 c->rope_original_max_position_embeddings > 0))
        return BAD("--use-rope-scaling needs a factor >= 1, 0 < low frequency factor < high "
                   "frequency factor and a positive original context (got %g, %g, %g, %d)",
                   (double)c->rope_scaling_factor, (double)c->rope_low_freq_factor,
                   (double)c->rope_high_freq_factor, c->rope_original_max_position_embeddings);
    if (c->use_rope_scaling && c->position_embedding_type != MC_POS_ROPE)
        return BAD("--use-rope-scaling needs --position-embedding-type rope");

    mc_status rst = mc_model_recompute_finish(c, err);
    if (rst) return rst;

    if (c->sequence_parallel && tp > 1 && c->seq_length % tp)
        return BAD("--sequence-parallel needs --seq-length (%d) to be a multiple of "
                   "--tensor-model-parallel-size (%d)",
                   c->seq_length, tp);

    if (c->num_experts) {
        mc_status st = moe_finish(c, err);
        if (st) return st;
    }
    if (c->moe_expert_tensor_parallel > 1) {
        int etp = c->moe_expert_tensor_parallel;
        if (c->num_experts <= 0)
            return BAD("--expert-tensor-parallel-size %d needs --num-experts", etp);
        if (tp % etp)
            return BAD("--expert-tensor-parallel-size %d must divide "
                       "--tensor-model-parallel-size (%d)",
                       etp, tp);
        if (c->moe_ffn_hidden_size % etp)
            return BAD("--moe-ffn-hidden-size (%d) must be a multiple of "
                       "--expert-tensor-parallel-size (%d)",
                       c->moe_ffn_hidden_size, etp);
        if (c->moe_shared_expert_intermediate_size % etp)
            return BAD("--moe-shared-expert-intermediate-size (%d) must be a multiple of "
                       "--expert-tensor-parallel-size (%d)",
                       c->moe_shared_expert_intermediate_size, etp);
    }

    int64_t multiple = (int64_t)c->make_vocab_size_divisible_by * tp;
    c->padded_vocab_size = padded_vocab(c->vocab_size, multiple);
    if (c->padded_vocab_size > INT32_MAX)
        return BAD("padded vocabulary size %lld does not fit token ids of 32 bits",
                   (long long)c->padded_vocab_size);
    return MC_OK;
}

/* Megatron's layer split (get_num_layers_to_build): with
 * --decoder-first/last-pipeline-num-layers those stages get their counts
 * and the middle stages split the rest evenly; otherwise all stages split
 * num_layers evenly. */
mc_status mc_model_stage_layers(const mc_model_config *c, int pp, int rank, int *first, int *last,
                                mc_error *err)
{
    int L = c->num_layers, nf = c->decoder_first_pipeline_num_layers,
        nl = c->decoder_last_pipeline_num_layers;
    *first = 0;
    *last = L;
    if (nf < 0 || nl < 0)
        return BAD("--decoder-first/last-pipeline-num-layers must not be negative (%d, %d)", nf,
                   nl);
    if (c->num_layers_per_virtual_pipeline_stage) {
        int v, f, l;
        mc_status st = mc_model_num_chunks_for(c, pp, &v, err);
        if (st) return st;
        /* the first chunk's layers: see mc_model_chunk_layers for the rest */
        st = mc_model_chunk_layers(c, pp, rank, 0, &f, &l, err);
        *first = f;
        *last = l;
        return st;
    }
    if (pp <= 1) {
        if (nf || nl)
            return BAD("--decoder-first/last-pipeline-num-layers need "
                       "--pipeline-model-parallel-size > 1");
        return MC_OK;
    }
    if (rank < 0 || rank >= pp)
        return mc_error_set(err, MC_ERR_INTERNAL, "model: stage %d of %d", rank, pp);
    int middle = pp - (nf > 0) - (nl > 0);
    int rest = L - nf - nl;
    if (!nf && !nl && L % pp)
        return BAD("--num-layers (%d) must be a multiple of --pipeline-model-parallel-size (%d) "
                   "(or give --decoder-first/last-pipeline-num-layers)",
                   L, pp);
    if (rest < 0 || (middle > 0 ? rest % middle != 0 || rest == 0 : rest != 0))
        return BAD("--num-layers (%d) less --decoder-first-pipeline-num-layers (%d) and "
                   "--decoder-last-pipeline-num-layers (%d) leaves %d layers, which do not split "
                   "evenly into the %d other stage(s) with at least one layer each",
                   L, nf, nl, rest, middle);
    int per = middle > 0 ? rest / middle : 0;
    int lo = 0;
    for (int p = 0; p <= rank; p++) {
        int n = (p == 0 && nf) ? nf : (p == pp - 1 && nl) ? nl : per;
        if (p == rank) {
            *first = lo;
            *last = lo + n;
        }
        lo += n;
    }
    return MC_OK;
}

/*
 * Training FLOPs per token, forward + backward = 3 x forward:
 *   6 N + 12 L (Q D) T
 * N counts the parameters that multiply activations: every parameter except
 * the position embeddings and, when the output layer is untied, the input
 * word embeddings (a lookup, no FLOPs; tied, the table is the LM head and is
 * counted once). 12 L (Q D) T is the attention score and value products,
 * 2 x 2 (Q D) T per token per layer forward, with no causal halving, as
 * Megatron and nanoGPT/llm.c count them (Q D = hidden size unless
 * --kv-channels says otherwise). Vocab and padded shapes as computed.
 */
double mc_model_flops_per_token(const mc_model_config *c)
{
    double C = c->hidden_size, L = c->num_layers, F = c->ffn_hidden_size;
    double Q = c->num_attention_heads, G = c->num_query_groups, D = c->kv_channels;
    double V = (double)c->padded_vocab_size, T = c->seq_length;
    double bias = c->add_bias_linear ? 1 : 0;
    double norm = c->normalization == MC_NORM_LAYERNORM ? 2 * C : C;
    double fc1 = c->swiglu ? 2 * F : F;
    double layer = norm + (Q + 2 * G) * D * C + bias * (Q + 2 * G) * D /* qkv */
                   + C * Q * D + bias * C                              /* proj */
                   + norm + fc1 * C + bias * fc1                       /* fc1 */
                   + C * F + bias * C;                                 /* fc2 */
    double n = L * layer + norm + V * C; /* final norm and the LM head */
    if (c->num_experts > 0) {
        /* a MoE layer: the router and the top-k experts in place of the MLP */
        double Fm = c->moe_ffn_hidden_size, f1 = c->swiglu ? 2 * Fm : Fm;
        double E = c->num_experts, K = c->moe_router_topk;
        double mlp = fc1 * C + bias * fc1 + C * F + bias * C;
        double S = c->moe_shared_expert_intermediate_size, s1 = c->swiglu ? 2 * S : S;
        double moe = E * C + bias * E + K * (f1 * C + bias * f1 + C * Fm + bias * C) + s1 * C +
                     C * S;
        n += mc_model_num_moe_layers(c) * (moe - mlp);
    }
    return 6.0 * n + 12.0 * L * Q * D * T;
}

mc_status mc_model_num_chunks_for(const mc_model_config *c, int pp, int *v, mc_error *err)
{
    int L = c->num_layers, n = c->num_layers_per_virtual_pipeline_stage;
    *v = 1;
    if (!n) return MC_OK;
    if (n < 0) return BAD("--num-layers-per-virtual-pipeline-stage must be positive (got %d)", n);
    if (pp <= 1)
        return BAD("--num-layers-per-virtual-pipeline-stage (%d) needs "
                   "--pipeline-model-parallel-size > 1 (got %d)",
                   n, pp);
    if (c->decoder_first_pipeline_num_layers || c->decoder_last_pipeline_num_layers)
        return BAD("--num-layers-per-virtual-pipeline-stage does not combine with "
                   "--decoder-first/last-pipeline-num-layers");
    if (L % (pp * n))
        return BAD("--num-layers (%d) must be a multiple of --pipeline-model-parallel-size (%d) "
                   "x --num-layers-per-virtual-pipeline-stage (%d) = %d",
                   L, pp, n, pp * n);
    *v = L / (pp * n);
    return MC_OK;
}

mc_status mc_model_chunk_layers(const mc_model_config *c, int pp, int rank, int chunk, int *first,
                                int *last, mc_error *err)
{
    int n = c->num_layers_per_virtual_pipeline_stage, v;
    if (!n) {
        if (chunk != 0) return mc_error_set(err, MC_ERR_INTERNAL, "model: chunk %d of 1", chunk);
        return mc_model_stage_layers(c, pp, rank, first, last, err);
    }
    mc_status st = mc_model_num_chunks_for(c, pp, &v, err);
    if (st) return st;
    if (rank < 0 || rank >= pp || chunk < 0 || chunk >= v)
        return mc_error_set(err, MC_ERR_INTERNAL, "model: chunk %d of %d on stage %d of %d", chunk,
                            v, rank, pp);
    /* Megatron's virtual stage c * pp + rank holds n consecutive layers */
    *first = (chunk * pp + rank) * n;
    *last = *first + n;
    return MC_OK;
}
