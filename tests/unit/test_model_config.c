/*
 * test_model_config.c - the model configuration (lib/model/config.c):
 * Megatron's defaults and derived sizes (ffn 4h or the SwiGLU rule, head
 * dim, query groups, max positions), vocabulary padding to a multiple of
 * divisible-by x tp, the presets, and every configuration error with its
 * message.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mc/model.h"
#include "tap.h"

static int finish_err(mc_model_config *c, int tp, const char *want)
{
    mc_error err = {0};
    mc_status st = mc_model_config_finish(c, tp, &err);
    int ok = st == MC_ERR_USAGE && strstr(err.msg, want) != NULL;
    if (!ok) TAP_DIAG("status %d, message: %s", (int)st, err.msg);
    return ok;
}

/* ---------------------------------------------------------------- config */

static void test_config(void)
{
    mc_model_config c;
    mc_error err = {0};

    int n = 0, all = 1;
    for (const char *const *p = mc_model_preset_names(); *p; p++, n++) {
        all &= mc_model_preset(*p, &c, &err) == MC_OK;
        c.vocab_size = 50257;
        all &= mc_model_config_finish(&c, 1, &err) == MC_OK;
    }
    TAP_OK(n == 8 && all, "all %d presets load and finish", n);

    mc_model_preset("gpt2-124m", &c, &err);
    c.vocab_size = 50257;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.num_layers == 12 && c.hidden_size == 768 &&
               c.num_attention_heads == 12 && c.ffn_hidden_size == 3072 && c.kv_channels == 64 &&
               c.num_query_groups == 12 && c.seq_length == 1024 &&
               c.max_position_embeddings == 1024 && c.padded_vocab_size == 50304 &&
               c.normalization == MC_NORM_LAYERNORM && !c.swiglu &&
               c.position_embedding_type == MC_POS_LEARNED && c.add_bias_linear &&
               !c.untie_embeddings_and_output_weights && c.init_method_std == 0.02f &&
               c.norm_epsilon == 1e-5f,
           "gpt2-124m: 12x768, 12 heads, ffn 3072, kv 64, vocab 50257 -> 50304, GPT recipe");
    static const struct {
        const char *name;
        int L, C, H;
    } gpts[] = {
        {"gpt2-350m", 24, 1024, 16}, {"gpt2-774m", 36, 1280, 20}, {"gpt2-1.5b", 48, 1600, 25}};
    for (int i = 0; i < 3; i++) {
        mc_model_preset(gpts[i].name, &c, &err);
        c.vocab_size = 50257;
        TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.num_layers == gpts[i].L &&
                   c.hidden_size == gpts[i].C && c.num_attention_heads == gpts[i].H &&
                   c.ffn_hidden_size == 4 * gpts[i].C && c.kv_channels == 64,
               "%s: %d x %d, %d heads", gpts[i].name, gpts[i].L, gpts[i].C, gpts[i].H);
    }
    mc_model_preset("llama-160m", &c, &err);
    c.vocab_size = 32000;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.num_layers == 12 && c.hidden_size == 768 &&
               c.num_query_groups == 4 && c.ffn_hidden_size == 2048 && c.seq_length == 2048 &&
               c.normalization == MC_NORM_RMSNORM && c.swiglu &&
               c.position_embedding_type == MC_POS_ROPE && c.rotary_base == 10000.0f &&
               !c.add_bias_linear && c.untie_embeddings_and_output_weights &&
               c.padded_vocab_size == 32000,
           "llama-160m: RMSNorm, SwiGLU 2048, RoPE 10000, 4 groups, no bias, untied");
    mc_model_preset("llama-1b", &c, &err);
    c.vocab_size = 128256;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.num_layers == 16 && c.hidden_size == 2048 &&
               c.num_attention_heads == 32 && c.num_query_groups == 8 &&
               c.ffn_hidden_size == 8192 && c.kv_channels == 64 && c.rotary_base == 500000.0f &&
               c.untie_embeddings_and_output_weights && c.padded_vocab_size == 128256,
           "llama-1b: Llama-3.2-1B's shape, rope base 500000");
    mc_model_preset("tiny-llama", &c, &err);
    c.vocab_size = 60;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.num_layers == 2 && c.hidden_size == 64 &&
               c.num_attention_heads == 4 && c.num_query_groups == 2 && c.ffn_hidden_size == 128 &&
               c.kv_channels == 16 && c.seq_length == 64 && c.padded_vocab_size == 128,
           "tiny-llama: 2 x 64, 4 heads, 2 groups, ffn 128, vocab 60 -> 128");
    TAP_OK(mc_model_preset("gpt5", &c, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "unknown model preset 'gpt5' (known: gpt2-124m"),
           "unknown preset: %s", err.msg);

    /* Megatron's SwiGLU default: int(4h * 2/3 / 64) * 64. */
    static const int swi[][2] = {{768, 2048}, {4096, 10880}, {2048, 5440}, {64, 128}, {96, 256}};
    for (int i = 0; i < 5; i++) {
        mc_model_config_init(&c);
        c.num_layers = 1, c.hidden_size = swi[i][0], c.num_attention_heads = 4;
        c.seq_length = 8, c.vocab_size = 100, c.swiglu = 1;
        TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.ffn_hidden_size == swi[i][1],
               "swiglu ffn default for hidden %d: %d (got %d)", swi[i][0], swi[i][1],
               c.ffn_hidden_size);
    }
    mc_model_config_init(&c);
    c.num_layers = 1, c.hidden_size = 64, c.num_attention_heads = 4, c.seq_length = 8;
    c.vocab_size = 100;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.ffn_hidden_size == 256 &&
               c.max_position_embeddings == 8 && c.kv_channels == 16,
           "defaults: ffn 4h, kv_channels h/heads, max positions = seq");
    c.ffn_hidden_size = 200;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.ffn_hidden_size == 200,
           "an explicit ffn size stays; finish is idempotent");

    /* Vocabulary padding: up to a multiple of divisible_by * tp. */
    static const struct {
        int64_t v;
        int div, tp;
        int64_t want;
    } pad[] = {{50257, 128, 1, 50304}, {50257, 128, 2, 50432}, {50304, 128, 1, 50304},
               {50304, 128, 8, 51200}, {1, 128, 1, 128},       {50257, 1, 1, 50257},
               {32000, 64, 4, 32000},  {32001, 64, 4, 32256}};
    for (int i = 0; i < 8; i++) {
        mc_model_config_init(&c);
        c.num_layers = 1, c.hidden_size = 64, c.num_attention_heads = 8, c.seq_length = 8;
        c.vocab_size = pad[i].v, c.make_vocab_size_divisible_by = pad[i].div;
        TAP_OK(!mc_model_config_finish(&c, pad[i].tp, &err) && c.padded_vocab_size == pad[i].want,
               "vocab %lld, divisible by %d, tp %d -> %lld (got %lld)", (long long)pad[i].v,
               pad[i].div, pad[i].tp, (long long)pad[i].want, (long long)c.padded_vocab_size);
    }

    /* Every error, with its message. */
#define BASE()                                                                               \
    do {                                                                                     \
        mc_model_config_init(&c);                                                            \
        c.num_layers = 2, c.hidden_size = 96, c.num_attention_heads = 12, c.seq_length = 16; \
        c.vocab_size = 100;                                                                  \
    } while (0)
    BASE();
    TAP_OK(finish_err(&c, 5,
                      "model config: --num-attention-heads (12) must be a multiple of "
                      "--tensor-model-parallel-size (5)"),
           "heads not divisible by tp");
    BASE();
    c.num_attention_heads = 16, c.hidden_size = 128, c.num_query_groups = 2;
    TAP_OK(finish_err(&c, 4,
                      "--num-query-groups (2) must be a multiple of "
                      "--tensor-model-parallel-size (4)"),
           "query groups not divisible by tp");
    BASE();
    c.num_query_groups = 5;
    TAP_OK(finish_err(&c, 1,
                      "--num-attention-heads (12) must be a multiple of "
                      "--num-query-groups (5)"),
           "heads not divisible by groups");
    BASE();
    c.hidden_size = 100;
    TAP_OK(finish_err(&c, 1,
                      "--hidden-size (100) must be a multiple of --num-attention-heads "
                      "(12) unless --kv-channels is given"),
           "hidden not divisible by heads");
    BASE();
    c.hidden_size = 100, c.kv_channels = 8;
    TAP_OK(!mc_model_config_finish(&c, 1, &err) && c.kv_channels == 8,
           "hidden not divisible by heads is fine with --kv-channels");
    BASE();
    c.ffn_hidden_size = 100;
    TAP_OK(finish_err(&c, 3,
                      "--ffn-hidden-size (100) must be a multiple of "
                      "--tensor-model-parallel-size (3)"),
           "ffn not divisible by tp");
    BASE();
    c.hidden_size = 36, c.num_attention_heads = 4, c.position_embedding_type = MC_POS_ROPE;
    TAP_OK(finish_err(&c, 1, "rotary embeddings need an even head dimension (--kv-channels 9)"),
           "odd head dim with RoPE");
    BASE();
    c.max_position_embeddings = 8;
    TAP_OK(finish_err(&c, 1, "--seq-length (16) exceeds --max-position-embeddings (8)"),
           "seq longer than learned positions");
    BASE();
    c.max_position_embeddings = 8, c.position_embedding_type = MC_POS_ROPE;
    TAP_OK(!mc_model_config_finish(&c, 1, &err), "RoPE has no position table to exceed");
    BASE();
    c.vocab_size = 0;
    TAP_OK(finish_err(&c, 1,
                      "vocabulary size unknown: give --tokenizer-type/--tokenizer-model "
                      "or --vocab-size"),
           "no vocabulary size");
    BASE();
    c.make_vocab_size_divisible_by = 0;
    TAP_OK(finish_err(&c, 1, "--make-vocab-size-divisible-by must be at least 1 (got 0)"),
           "divisible-by 0");
    BASE();
    TAP_OK(finish_err(&c, 0, "--tensor-model-parallel-size must be at least 1 (got 0)"), "tp 0");
    BASE();
    c.num_layers = 0;
    TAP_OK(finish_err(&c, 1, "--num-layers must be at least 1 (got 0)"), "no layers");
    BASE();
    c.hidden_size = -4;
    TAP_OK(finish_err(&c, 1, "--hidden-size must be at least 1 (got -4)"), "negative hidden");
    BASE();
    c.num_attention_heads = 0;
    TAP_OK(finish_err(&c, 1, "--num-attention-heads must be at least 1 (got 0)"), "no heads");
    BASE();
    c.seq_length = 0;
    TAP_OK(finish_err(&c, 1, "--seq-length must be at least 1 (got 0)"), "seq 0");
    BASE();
    c.num_query_groups = -1;
    TAP_OK(finish_err(&c, 1, "must not be negative"), "negative groups");
    BASE();
    c.norm_epsilon = 0;
    TAP_OK(finish_err(&c, 1, "--norm-epsilon must be positive"), "norm epsilon 0");
    BASE();
    c.init_method_std = -1;
    TAP_OK(finish_err(&c, 1, "--init-method-std must not be negative"), "negative std");
    BASE();
    c.position_embedding_type = MC_POS_ROPE, c.rotary_base = 0;
    TAP_OK(finish_err(&c, 1, "--rotary-base must be positive"), "rotary base 0");
    BASE();
    c.hidden_size = 16, c.num_attention_heads = 4, c.swiglu = 1;
    TAP_OK(finish_err(&c, 1, "--ffn-hidden-size derived from --hidden-size 16 is 0"),
           "SwiGLU ffn rounds to 0 for a tiny hidden size");
    BASE();
    c.vocab_size = (int64_t)1 << 31;
    TAP_OK(finish_err(&c, 1, "does not fit token ids of 32 bits"), "vocabulary over int32");
#undef BASE
}

/* --moe-layer-freq: integers and Megatron's list expressions, and the
 * layers they make MoE layers. */
static void test_moe_layer_freq(void)
{
    mc_error err;
    mc_model_config c;
    static const struct {
        const char *spec;
        int layers;
        const char *want; /* the MoE layers, one '0'/'1' each */
    } ok[] = {
        {"1", 4, "1111"},
        {"2", 5, "10101"},
        {"([0]*1+[1]*3)*4", 16, "0111011101110111"},
        {"[1, 0,1]", 3, "101"},
        {"2*[0]+[1]*2", 4, "0011"},
        {" ( [1] + ( [0] ) * 2 ) ", 3, "100"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        mc_model_config_init(&c);
        c.num_layers = ok[i].layers, c.num_experts = 4;
        char got[64] = "";
        int good = mc_moe_layer_freq_parse(ok[i].spec, &c, &err) == MC_OK;
        for (int l = 0; good && l < c.num_layers; l++)
            got[l] = (char)('0' + mc_model_layer_is_moe(&c, l));
        TAP_OK(good && !strcmp(got, ok[i].want), "--moe-layer-freq '%s': %s (got %s)", ok[i].spec,
               ok[i].want, got);
    }
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"0", "the frequency must be at least 1"},
        {"[0,2]", "list entries must be 0 or 1"},
        {"[1]*[1]", "'*' needs a list and an integer"},
        {"[1]+2", "'+' joins two lists"},
        {"([1]", "expected ')'"},
        {"[1] x", "unexpected text"},
        {"[]", "the list is empty"},
        {"[1]*600", "list too long"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mc_model_config_init(&c);
        mc_status st = mc_moe_layer_freq_parse(bad[i].spec, &c, &err);
        TAP_OK(st == MC_ERR_USAGE && strstr(err.msg, bad[i].msg) && strstr(err.msg, bad[i].spec),
               "--moe-layer-freq '%s' refused: %s", bad[i].spec, st ? err.msg : "(accepted)");
    }
    /* without experts no layer is MoE, whatever the frequency */
    mc_model_config_init(&c);
    c.num_layers = 2;
    TAP_OK(!mc_model_layer_is_moe(&c, 0) && mc_model_num_moe_layers(&c) == 0,
           "a dense model has no MoE layer");
}

int main(void)
{
    test_config();
    test_moe_layer_freq();
    return tap_done();
}
