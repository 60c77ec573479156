/*
 * test_model.c - the model (lib/model; its configuration rules are in
 * test_model_config.c): the parameter registry (names, shapes, splits,
 * GPT-2 124M's count), Megatron's initialization and its invariance
 * under tensor-parallel splitting, whole-model gradients against finite
 * differences, row-chunked LM head against per-sequence micro-batches,
 * determinism, and loss and gradients against PyTorch (golden values from
 * tests/golden/torch_model.py in tests/data/model/).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/json.h"
#include "mc/kern.h"
#include "mc/model.h"
#include "tap.h"

static mc_backend *be;
/* --qk-layernorm on the models make() and test_recompute build */
static int qk_on;

/* ---------------------------------------------------------------- helpers */

/* A test model: the preset with T tokens, `vocab` ids padded to a multiple
 * of `div`, micro-batch B, on grid g (NULL: one process). */
static mc_model *make(const char *preset, int T, int64_t vocab, int div, int B, const mc_grid *g,
                      mc_prec prec)
{
    mc_model_config c;
    mc_error err = {0};
    mc_grid one;
    mc_grid_single(&one);
    if (mc_model_preset(preset, &c, &err)) return NULL;
    c.seq_length = T;
    if (c.position_embedding_type == MC_POS_LEARNED && c.max_position_embeddings < T)
        c.max_position_embeddings = T;
    if (!strncmp(preset, "tiny", 4)) c.max_position_embeddings = T;
    c.vocab_size = vocab;
    c.make_vocab_size_divisible_by = div;
    c.qk_layernorm = qk_on;
    mc_model *m = NULL;
    if (mc_model_new(&c, g ? g : &one, be, B, prec, &m, &err)) {
        TAP_DIAG("mc_model_new(%s): %s", preset, err.msg);
        return NULL;
    }
    return m;
}

static float *host_copy(mc_model *m, const float *dev)
{
    size_t n = mc_model_numel(m);
    float *h = malloc(n * sizeof *h);
    mc_bcopy_to_host(be, h, dev, n * sizeof *h);
    return h;
}

static uint64_t lcg = 7;
static uint32_t rnd(void)
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 33);
}

static void make_batch(int32_t *tok, int32_t *tgt, size_t n, int vocab)
{
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(rnd() % (uint32_t)vocab);
        tgt[i] = (int32_t)(rnd() % (uint32_t)vocab);
    }
}

static double step(mc_model *m, const int32_t *tok, const int32_t *tgt, int bwd, float scale)
{
    double loss = NAN;
    int64_t ntok = 0;
    mc_error err = {0};
    if (mc_model_step(m, tok, tgt, bwd, scale, &loss, &ntok, &err)) {
        TAP_DIAG("step: %s", err.msg);
        return NAN;
    }
    return loss;
}

/* ---------------------------------------------------------------- registry */

typedef struct want_param {
    const char *name;
    int64_t rows, cols;
    int split, nwd, chunks;
    float std, value;
} want_param;

static void check_registry(mc_model *m, const char *what, const want_param *w, size_t n)
{
    int ok = mc_model_num_params(m) == n;
    if (!ok) TAP_DIAG("%zu parameters, want %zu", mc_model_num_params(m), n);
    size_t end = 0;
    int64_t total = 0;
    for (size_t i = 0; ok && i < n; i++) {
        const mc_param *p = mc_model_param(m, i);
        int good = !strcmp(p->name, w[i].name) && p->rows == w[i].rows && p->cols == w[i].cols &&
                   p->ndim == (w[i].cols == 1 ? 1 : 2) && p->split_dim == w[i].split &&
                   p->no_weight_decay == w[i].nwd && p->row_chunks == w[i].chunks &&
                   fabsf(p->init_std - w[i].std) < 1e-9f && p->init_value == w[i].value &&
                   p->local_rows == p->rows && p->local_cols == p->cols && p->row0 == 0 &&
                   p->col0 == 0 && p->numel == (size_t)(p->rows * p->cols) && p->offset >= end &&
                   p->offset % 16 == 0 && mc_model_param_by_name(m, w[i].name) == p;
        if (!good)
            TAP_DIAG("param %zu: got %s [%lld, %lld] split %d nwd %d chunks %d std %g value %g; "
                     "want %s [%lld, %lld] split %d",
                     i, p->name, (long long)p->rows, (long long)p->cols, p->split_dim,
                     p->no_weight_decay, p->row_chunks, p->init_std, p->init_value, w[i].name,
                     (long long)w[i].rows, (long long)w[i].cols, w[i].split);
        ok &= good;
        end = p->offset + p->numel;
        total += p->rows * p->cols;
    }
    ok &= end <= mc_model_numel(m) && total == mc_model_global_numel(m);
    ok &= mc_model_param(m, n) == NULL && mc_model_param_by_name(m, "nope") == NULL;
    TAP_OK(ok, "%s: %zu parameters with Megatron Core names, global shapes, splits, init", what, n);
}

static void test_registry(void)
{
    const float s = 0.02f, so = 0.02f / 2.0f; /* std / sqrt(2 * 2 layers) */
    mc_model *m = make("tiny-gpt", 8, 60, 64, 2, NULL, MC_PREC_FP32);
/* one row per parameter */
// clang-format off
#define LAYER_GPT(L)                                                                               \
    {"decoder.layers." #L ".self_attention.linear_qkv.layer_norm_weight", 64, 1, -1, 1, 1, 0, 1},  \
    {"decoder.layers." #L ".self_attention.linear_qkv.layer_norm_bias", 64, 1, -1, 1, 1, 0, 0},    \
    {"decoder.layers." #L ".self_attention.linear_qkv.weight", 192, 64, 0, 0, 1, s, 0},            \
    {"decoder.layers." #L ".self_attention.linear_qkv.bias", 192, 1, 0, 1, 1, 0, 0},               \
    {"decoder.layers." #L ".self_attention.linear_proj.weight", 64, 64, 1, 0, 1, so, 0},           \
    {"decoder.layers." #L ".self_attention.linear_proj.bias", 64, 1, -1, 1, 1, 0, 0},              \
    {"decoder.layers." #L ".mlp.linear_fc1.layer_norm_weight", 64, 1, -1, 1, 1, 0, 1},             \
    {"decoder.layers." #L ".mlp.linear_fc1.layer_norm_bias", 64, 1, -1, 1, 1, 0, 0},               \
    {"decoder.layers." #L ".mlp.linear_fc1.weight", 256, 64, 0, 0, 1, s, 0},                       \
    {"decoder.layers." #L ".mlp.linear_fc1.bias", 256, 1, 0, 1, 1, 0, 0},                          \
    {"decoder.layers." #L ".mlp.linear_fc2.weight", 64, 256, 1, 0, 1, so, 0},                      \
    {"decoder.layers." #L ".mlp.linear_fc2.bias", 64, 1, -1, 1, 1, 0, 0}
    // clang-format on
    const want_param gpt[] = {
        {"embedding.word_embeddings.weight", 64, 64, 0, 0, 1, s, 0},
        {"embedding.position_embeddings.weight", 8, 64, -1, 0, 1, s, 0},
        LAYER_GPT(0),
        LAYER_GPT(1),
        {"decoder.final_layernorm.weight", 64, 1, -1, 1, 1, 0, 1},
        {"decoder.final_layernorm.bias", 64, 1, -1, 1, 1, 0, 0},
    };
    if (m)
        check_registry(m, "tiny-gpt", gpt, sizeof gpt / sizeof gpt[0]);
    else
        TAP_OK(0, "tiny-gpt builds");
    mc_model_free(m);

    m = make("tiny-llama", 8, 60, 64, 2, NULL, MC_PREC_FP32);
/* one row per parameter */
// clang-format off
#define LAYER_LLAMA(L)                                                                             \
    {"decoder.layers." #L ".self_attention.linear_qkv.layer_norm_weight", 64, 1, -1, 1, 1, 0, 1},  \
    {"decoder.layers." #L ".self_attention.linear_qkv.weight", 128, 64, 0, 0, 1, s, 0},            \
    {"decoder.layers." #L ".self_attention.linear_proj.weight", 64, 64, 1, 0, 1, so, 0},           \
    {"decoder.layers." #L ".mlp.linear_fc1.layer_norm_weight", 64, 1, -1, 1, 1, 0, 1},             \
    {"decoder.layers." #L ".mlp.linear_fc1.weight", 256, 64, 0, 0, 2, s, 0},                       \
    {"decoder.layers." #L ".mlp.linear_fc2.weight", 64, 128, 1, 0, 1, so, 0}
    // clang-format on
    const want_param llama[] = {
        {"embedding.word_embeddings.weight", 64, 64, 0, 0, 1, s, 0},
        LAYER_LLAMA(0),
        LAYER_LLAMA(1),
        {"decoder.final_layernorm.weight", 64, 1, -1, 1, 1, 0, 1},
        {"output_layer.weight", 64, 64, 0, 0, 1, s, 0},
    };
    if (m)
        check_registry(m, "tiny-llama", llama, sizeof llama / sizeof llama[0]);
    else
        TAP_OK(0, "tiny-llama builds");
    mc_model_free(m);

    /* GPT-2 124M: the well-known 124,439,808 counts the 50257-row table;
     * Megatron's padding to 50304 adds 47 x 768 = 36,096 (llm.c's figure,
     * 124,475,904). Short T: activations stay small, positions stay 1024. */
    mc_model_config c;
    mc_error err = {0};
    mc_grid g;
    mc_grid_single(&g);
    for (int div = 128; div >= 1; div -= 127) {
        mc_model_preset("gpt2-124m", &c, &err);
        c.vocab_size = 50257, c.seq_length = 4, c.make_vocab_size_divisible_by = div;
        m = NULL;
        mc_status st = mc_model_new(&c, &g, be, 1, MC_PREC_FP32, &m, &err);
        int64_t want = div == 128 ? 124475904 : 124439808;
        TAP_OK(!st && mc_model_global_numel(m) == want && mc_model_num_params(m) == 2 + 12 * 12 + 2,
               "gpt2-124m with vocab padded to %d: %lld parameters (got %lld)",
               div == 128 ? 50304 : 50257, (long long)want,
               m ? (long long)mc_model_global_numel(m) : -1LL);
        if (m) {
            /* FLOPs: 6 (N - positions) + 12 L C T, with the preset's T = 1024 */
            mc_model_config f = *mc_model_get_config(m);
            f.seq_length = 1024;
            double want_f = 6.0 * (double)(want - 1024 * 768) + 12.0 * 12 * 768 * 1024;
            TAP_OK(fabs(mc_model_flops_per_token(&f) - want_f) < 1, "gpt2-124m FLOPs/token %.6g",
                   want_f);
        }
        mc_model_free(m);
    }

    /* llama-160m with the GPT-2 vocabulary: untied, no positions. */
    mc_model_preset("llama-160m", &c, &err);
    c.vocab_size = 50257, c.seq_length = 4;
    m = NULL;
    if (!mc_model_new(&c, &g, be, 1, MC_PREC_FP32, &m, &err)) {
        const mc_param *q = mc_model_param_by_name(
            m, "decoder.layers.11.self_attention.linear_qkv.weight");
        const mc_param *f1 = mc_model_param_by_name(m, "decoder.layers.11.mlp.linear_fc1.weight");
        const mc_param *f2 = mc_model_param_by_name(m, "decoder.layers.11.mlp.linear_fc2.weight");
        const mc_param *o = mc_model_param_by_name(m, "output_layer.weight");
        /* per layer: qkv 20*64*768 + proj 768^2 + fc1 4096*768 + fc2 768*2048 + 2 norms */
        int64_t want = 2 * 50304LL * 768 + 12 * (983040LL + 589824 + 3145728 + 1572864 + 1536) +
                       768;
        TAP_OK(q && q->rows == 1280 && q->cols == 768 && f1 && f1->rows == 4096 &&
                   f1->row_chunks == 2 && f2 && f2->cols == 2048 && o && o->rows == 50304 &&
                   !mc_model_param_by_name(m, "embedding.position_embeddings.weight") &&
                   !mc_model_param_by_name(m, "decoder.final_layernorm.bias") &&
                   mc_model_global_numel(m) == want,
               "llama-160m: qkv [1280, 768], fc1 [2 x 2048, 768], untied head, %lld parameters",
               (long long)want);
        mc_model_config f = *mc_model_get_config(m);
        f.seq_length = 2048;
        double want_f = 6.0 * (double)(want - 50304LL * 768) + 12.0 * 12 * 768 * 2048;
        TAP_OK(fabs(mc_model_flops_per_token(&f) - want_f) < 1,
               "llama-160m FLOPs/token leave out the input embedding lookup: %.6g", want_f);
    } else {
        TAP_OK(0, "llama-160m builds: %s", err.msg);
        TAP_OK(0, "llama-160m FLOPs");
    }
    mc_model_free(m);

    /* mc_model_new's own errors. */
    mc_model_preset("tiny-gpt", &c, &err);
    c.vocab_size = 60;
    m = NULL;
    TAP_OK(mc_model_new(&c, &g, be, 0, MC_PREC_FP32, &m, &err) == MC_ERR_USAGE && !m &&
               strstr(err.msg, "--micro-batch-size must be at least 1 (got 0)"),
           "micro-batch 0 refused: %s", err.msg);
    c.num_attention_heads = 3;
    TAP_OK(
        mc_model_new(&c, &g, be, 1, MC_PREC_FP32, &m, &err) == MC_ERR_USAGE && !m &&
            strstr(err.msg, "--hidden-size (64) must be a multiple of --num-attention-heads (3)"),
        "config errors come through mc_model_new: %s", err.msg);
}

/* ---------------------------------------------------------------- init */

/* Every parameter equals mc_k_init_normal of its global block (or its
 * constant); on a tp = 2 grid each rank's slice equals the same slice of
 * the tp = 1 model, SwiGLU's two halves included. */
static void test_init(void)
{
    const uint64_t seed = 99;
    /* vocabulary 60 padded to 64 whether tp is 1 or 2 (multiple of 32 * tp) */
    mc_model *m1 = make("tiny-llama", 8, 60, 32, 1, NULL, MC_PREC_FP32);
    mc_model *g1 = make("tiny-gpt", 8, 60, 32, 1, NULL, MC_PREC_FP32);
    if (!m1 || !g1) {
        TAP_OK(0, "init models build");
        return;
    }
    int ok = 1;
    mc_model *ms[2] = {m1, g1};
    for (int k = 0; k < 2; k++) {
        mc_model *m = ms[k];
        mc_model_init_weights(m, seed);
        float *h = host_copy(m, mc_model_params(m));
        for (size_t i = 0; i < mc_model_num_params(m); i++) {
            const mc_param *p = mc_model_param(m, i);
            float *ref = mc_balloc(be, p->numel * sizeof(float), NULL);
            float *rh = malloc(p->numel * sizeof(float));
            if (p->init_std > 0)
                mc_k_init_normal(be, ref, (size_t)p->rows, (size_t)p->cols, (uint64_t)p->cols, 0, 0,
                                 seed, mc_k_name_key(p->name), p->init_std);
            else
                mc_k_fill(be, ref, p->init_value, p->numel);
            mc_bcopy_to_host(be, rh, ref, p->numel * sizeof(float));
            if (memcmp(rh, h + p->offset, p->numel * sizeof(float))) {
                TAP_DIAG("%s differs from its global init", p->name);
                ok = 0;
            }
            mc_bfree(be, ref);
            free(rh);
        }
        free(h);
    }
    TAP_OK(ok, "every parameter equals mc_k_init_normal of its global tensor (or 1 / 0)");

    /* statistics: proj/fc2 std 0.02/sqrt(4) = 0.01, qkv 0.02 */
    float *h = host_copy(g1, mc_model_params(g1));
    const mc_param *a = mc_model_param_by_name(g1, "decoder.layers.1.mlp.linear_fc2.weight");
    const mc_param *b = mc_model_param_by_name(g1, "decoder.layers.1.mlp.linear_fc1.weight");
    double sa = 0, sb = 0;
    for (size_t i = 0; i < a->numel; i++) sa += (double)h[a->offset + i] * h[a->offset + i];
    for (size_t i = 0; i < b->numel; i++) sb += (double)h[b->offset + i] * h[b->offset + i];
    sa = sqrt(sa / (double)a->numel), sb = sqrt(sb / (double)b->numel);
    /* 16384 samples: the sample std is within ~1% (3 sigma 1.7%) */
    TAP_OK(fabs(sa - 0.01) < 0.0005 && fabs(sb - 0.02) < 0.001,
           "sample std: fc2 %.5f (0.01 = 0.02/sqrt(2L)), fc1 %.5f (0.02)", sa, sb);
    free(h);

    /* tp = 2: both ranks of a 2-way split, against the tp = 1 model. */
    const char *presets[2] = {"tiny-llama", "tiny-gpt"};
    for (int k = 0; k < 2; k++) {
        float *full = host_copy(ms[k], mc_model_params(ms[k]));
        int same = 1, shapes = 1;
        for (int r = 0; r < 2; r++) {
            mc_grid g;
            mc_grid_single(&g);
            g.world = 2, g.tp = 2, g.tp_rank = r, g.rank = r;
            mc_model *m = make(presets[k], 8, 60, 32, 1, &g, MC_PREC_FP32);
            if (!m) {
                same = 0;
                continue;
            }
            mc_model_init_weights(m, seed);
            float *loc = host_copy(m, mc_model_params(m));
            for (size_t i = 0; i < mc_model_num_params(m); i++) {
                const mc_param *p = mc_model_param(m, i);
                const mc_param *q = mc_model_param_by_name(ms[k], p->name);
                int64_t ch = p->row_chunks, lr = p->local_rows / ch;
                /* expected split: rows (0), columns (1), or none */
                shapes &= p->split_dim == 0
                              ? (p->local_rows * 2 == p->rows && p->row0 == r * (p->rows / ch / 2))
                          : p->split_dim == 1
                              ? (p->local_cols * 2 == p->cols && p->col0 == r * p->local_cols)
                              : (p->local_rows == p->rows && p->local_cols == p->cols);
                for (int64_t j = 0; j < ch; j++)
                    for (int64_t rr = 0; rr < lr; rr++)
                        for (int64_t cc = 0; cc < p->local_cols; cc++) {
                            int64_t grow = j * (p->rows / ch) + p->row0 + rr;
                            float x = loc[p->offset + (size_t)((j * lr + rr) * p->local_cols + cc)];
                            float y = full[q->offset + (size_t)(grow * q->cols + p->col0 + cc)];
                            if (memcmp(&x, &y, sizeof x)) same = 0;
                        }
            }
            if (k == 0 && r == 1) {
                const mc_param *f1 = mc_model_param_by_name(
                    m, "decoder.layers.0.mlp.linear_fc1.weight");
                const mc_param *qkv = mc_model_param_by_name(
                    m, "decoder.layers.0.self_attention.linear_qkv.weight");
                const mc_param *wte = mc_model_param_by_name(m, "embedding.word_embeddings.weight");
                shapes &= f1->local_rows == 128 && f1->row0 == 64 && qkv->local_rows == 64 &&
                          qkv->row0 == 64 && wte->local_rows == 32 && wte->row0 == 32;
            }
            free(loc);
            mc_model_free(m);
        }
        free(full);
        TAP_OK(same && shapes,
               "%s on tp=2: each rank's slices (SwiGLU gate and up halves, QKV groups, vocab "
               "rows, row-parallel columns) equal the tp=1 weights bit for bit",
               presets[k]);
    }
    mc_model_free(m1);
    mc_model_free(g1);
}

/* Expert tensor parallelism (ETP = TP = 2) x EP = 2: every rank's slice of
 * every MoE tensor (the experts' fc1 rows in chunks of F / 2 per expert,
 * SwiGLU's gate and up each split, fc2 columns, the shared experts as the
 * dense MLP) equals the one-process weights bit for bit, and the experts'
 * weights hold a quarter of the global elements on each rank. swiglu: SwiGLU
 * experts with biases, whose fc1 bias [E, gate F | up F] is split by
 * columns in two chunks (drawn like a weight here, so that its slices
 * differ: it starts at zero in training). sub: ETP = 2 under TP = 4 instead
 * (no EP): TP ranks k and k + 2 hold the same slices, the second marked
 * a replica, and each expert tensor holds a half. */
static void test_etp_slices(const char *preset, int shared, int swiglu, int sub)
{
    mc_model_config c;
    mc_error err = {0};
    mc_grid one;
    mc_grid_single(&one);
    mc_model *ref = NULL;
    uint64_t seed = 1234;
    int same = 1, sizes = 1, nexp = 0, nbias = 0, replicas = 1, nrep = 0;
    for (int k = -1; k < 4; k++) {
        mc_grid g = one;
        if (k >= 0 && !sub) /* tp rank k % 2, ep rank k / 2 */
            g.world = 4, g.tp = 2, g.dp = 2, g.ep = 2, g.tp_rank = k % 2, g.dp_rank = k / 2,
            g.ep_rank = k / 2, g.rank = k;
        if (k >= 0 && sub) /* tp rank k: ETP group k / 2, rank k % 2 in it */
            g.world = 4, g.tp = 4, g.etp = 2, g.tp_rank = k, g.rank = k;
        if (mc_model_preset(preset, &c, &err)) break;
        if (sub && c.num_query_groups % 4) /* TP = 4 */
            c.num_attention_heads = 8, c.num_query_groups = 4, c.kv_channels = 8;
        c.seq_length = c.max_position_embeddings = 8;
        c.vocab_size = 60, c.make_vocab_size_divisible_by = sub ? 16 : 32; /* 64 rows */
        c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 32;
        c.moe_shared_expert_intermediate_size = shared;
        c.moe_expert_tensor_parallel = k >= 0 ? 2 : 0;
        if (swiglu) c.swiglu = 1;
        mc_model *m = NULL;
        if (mc_model_new(&c, &g, be, 1, MC_PREC_FP32, &m, &err)) {
            TAP_DIAG("mc_model_new(%s, ETP): %s", preset, err.msg);
            same = 0;
            break;
        }
        for (size_t i = 0; swiglu && i < mc_model_num_params(m); i++) {
            mc_param *p = (mc_param *)mc_model_param(m, i);
            if (!strstr(p->name, "experts.experts.linear_fc1.bias")) continue;
            p->init_std = 0.02f;
            /* the split: rank t holds columns [t F/2, (t+1) F/2) of gate and of up */
            if (k >= 0)
                sizes &= p->split_dim == 1 && p->col_chunks == 2 && p->chunk_cols == 32 &&
                         p->local_cols == 32 && p->col0 == 16 * (k % 2) &&
                         p->local_rows == (sub ? 4 : 2) && p->row0 == (sub ? 0 : 2 * (k / 2)) &&
                         p->row_chunks == 1;
            nbias++;
        }
        mc_model_init_weights(m, seed);
        if (k < 0) {
            ref = m;
            continue;
        }
        float *full = host_copy(ref, mc_model_params(ref)), *loc = host_copy(m, mc_model_params(m));
        for (size_t i = 0; i < mc_model_num_params(m); i++) {
            const mc_param *p = mc_model_param(m, i), *q = mc_model_param_by_name(ref, p->name);
            int64_t ch = p->row_chunks, lr = p->local_rows / ch, lc = p->local_cols / p->col_chunks;
            for (int64_t j = 0; j < ch; j++)
                for (int64_t rr = 0; rr < lr; rr++)
                    for (int64_t cc = 0; cc < p->local_cols; cc++) {
                        int64_t grow = j * p->chunk_rows + p->row0 + rr;
                        int64_t gcol = cc / lc * p->chunk_cols + p->col0 + cc % lc;
                        float x = loc[p->offset + (size_t)((j * lr + rr) * p->local_cols + cc)];
                        float y = full[q->offset + (size_t)(grow * q->cols + gcol)];
                        if (memcmp(&x, &y, sizeof x)) same = 0;
                    }
            if (strstr(p->name, "experts.experts.linear_fc") && strstr(p->name, "weight")) {
                sizes &= p->numel * (sub ? 2 : 4) == q->numel;
                nexp++;
            }
            if (strstr(p->name, "shared_experts.")) sizes &= p->numel * 2 == q->numel;
            /* the replicas: the second ETP group's split expert tensors */
            int split_expert = strstr(p->name, "experts.") && p->split_dim >= 0;
            replicas &= p->replica == (sub && split_expert && k >= 2);
            nrep += p->replica;
        }
        free(full);
        free(loc);
        mc_model_free(m);
    }
    mc_model_free(ref);
    TAP_OK(same && sizes && replicas && (nrep > 0) == sub && nexp == 4 * 4 &&
               nbias == (swiglu ? 2 * 5 : 0),
           "%s MoE%s%s on %s: each rank's slices of the experts (fc1 rows per "
           "expert, gate and up, fc2 columns%s) equal one process's bit for bit, %s of them%s",
           preset, shared ? " with a shared expert" : "", swiglu ? " (SwiGLU, biases)" : "",
           sub ? "TP = 4 x ETP = 2" : "ETP = TP = 2 x EP = 2",
           swiglu ? ", fc1 bias columns of gate and up" : "", sub ? "a half" : "a quarter",
           sub ? ", TP ranks 2 and 3 replicas of 0 and 1" : "");
}

/* ---------------------------------------------------------------- gradients */

/*
 * Central differences of the fp32 model loss against the analytic gradient.
 * The loss (~4.1) carries fp32 rounding of a few 1e-7 (per-row losses in
 * fp32, summed in double), so a difference quotient with step h has noise
 * ~1e-7/h: two checks keep the signal far above it.
 *  1. Per tensor, and per eighth of it (row blocks: a head's rows, q, k or
 *     v; a wrong gradient confined to one block shows there and hides in
 *     the whole), along the unit direction u = g/|g|: (L(p+hu) -
 *     L(p-hu))/2h should equal |g|; h = 1e-2 moves L by ~2h|g|, the
 *     O(h^2) truncation error is ~1e-4 relative. Tolerance 1e-2 |g| + 2e-5
 *     (the noise floor); blocks with |g| under 1e-3 of the tensor's skipped.
 *  2. Per tensor, the 3 elements with the largest |g|, h = 1e-2 (as large
 *     as the weights themselves, fine for a central difference whose error
 *     is O(h^2 L''')), tolerance 1e-2 |g| + 5e-5 (the noise floor).
 */
static void grad_check_on(const char *preset);

/* A thousand tiny forward passes: one thread, so that OpenMP's start-up on a
 * busy 2-core machine does not dominate (threads are covered elsewhere). */
static void grad_check(const char *preset)
{
    mc_backend *two = be;
    mc_error err = {0};
    if (mc_backend_cpu_new(1, &be, &err)) {
        TAP_OK(0, "one-thread backend: %s", err.msg);
        be = two;
        return;
    }
    grad_check_on(preset);
    mc_backend_free(be);
    /* a backend sets the process's OpenMP and BLAS thread counts: make a
     * fresh two-thread one rather than keep the one that was overridden */
    mc_backend_free(two);
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        exit(1);
    }
}

static void grad_check_on(const char *preset)
{
    const int B = 2, T = 8, V = 60;
    mc_model *m = make(preset, T, V, 64, B, NULL, MC_PREC_FP32);
    if (!m) {
        TAP_OK(0, "%s builds", preset);
        return;
    }
    mc_model_init_weights(m, 5);
    int32_t tok[16], tgt[16];
    make_batch(tok, tgt, 16, V);
    tgt[5] = -1; /* an ignored target */
    mc_model_zero_grads(m);
    double l0 = step(m, tok, tgt, 1, 1.0f);
    size_t n = mc_model_numel(m);
    float *g = host_copy(m, mc_model_grads(m));
    float *p0 = host_copy(m, mc_model_params(m));
    float *p = malloc(n * sizeof *p);
    double worst_dir = 0, worst_el = 0;
    int ok = isfinite(l0), checked = 0, ndir = 0;
    /* the query/key norms make the loss more curved along the QKV weights:
     * a shorter step keeps the central difference's O(h^2) error small */
    const float h = qk_on ? 2.5e-3f : 1e-2f;
    const double noise = 1e-2 / h; /* fp32 rounding of the loss, divided by 2h */
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *q = mc_model_param(m, i);
        const float *gi = g + q->offset;
        double gn = 0;
        for (size_t j = 0; j < q->numel; j++) gn += (double)gi[j] * gi[j];
        gn = sqrt(gn);
        if (gn == 0) {
            TAP_DIAG("%s: zero gradient for %s", preset, q->name);
            ok = 0;
            continue;
        }
        double lp, lm, fd;
        /* the whole tensor, then each eighth of it (row blocks: heads, q/k/v) */
        for (size_t nb = 1; nb <= 8; nb += 7) {
            size_t len = q->numel / nb;
            if (len * nb != q->numel) continue;
            for (size_t b = 0; b < nb; b++) {
                const float *gb = gi + b * len;
                double bn = 0;
                for (size_t j = 0; j < len; j++) bn += (double)gb[j] * gb[j];
                bn = sqrt(bn);
                if (bn < 1e-3 * gn) continue; /* below the noise floor */
                size_t o = q->offset + b * len;
                memcpy(p, p0, n * sizeof *p);
                for (size_t j = 0; j < len; j++) p[o + j] += (float)(h * gb[j] / bn);
                mc_bcopy_from_host(be, mc_model_params(m), p, n * sizeof *p);
                lp = step(m, tok, tgt, 0, 1.0f);
                memcpy(p, p0, n * sizeof *p);
                for (size_t j = 0; j < len; j++) p[o + j] -= (float)(h * gb[j] / bn);
                mc_bcopy_from_host(be, mc_model_params(m), p, n * sizeof *p);
                lm = step(m, tok, tgt, 0, 1.0f);
                fd = (lp - lm) / (2 * h);
                double err = fabs(fd - bn), tol = 1e-2 * bn + 2e-5 * noise;
                if (err / tol > worst_dir) worst_dir = err / tol;
                if (err > tol) {
                    TAP_DIAG("%s %s block %zu/%zu: directional fd %.6g, |g| %.6g", preset, q->name,
                             b, nb, fd, bn);
                    ok = 0;
                }
                ndir++;
            }
        }
        /* the 3 largest elements */
        size_t top[3] = {0, 0, 0};
        for (size_t j = 0; j < q->numel; j++) {
            float a = fabsf(gi[j]);
            if (a > fabsf(gi[top[0]]))
                top[2] = top[1], top[1] = top[0], top[0] = j;
            else if (j != top[0] && a > fabsf(gi[top[1]]))
                top[2] = top[1], top[1] = j;
            else if (j != top[0] && j != top[1] && a > fabsf(gi[top[2]]))
                top[2] = j;
        }
        for (int t = 0; t < 3 && t < (int)q->numel; t++) {
            size_t j = q->offset + top[t];
            memcpy(p, p0, n * sizeof *p);
            p[j] += h;
            mc_bcopy_from_host(be, mc_model_params(m), p, n * sizeof *p);
            lp = step(m, tok, tgt, 0, 1.0f);
            p[j] -= 2 * h;
            mc_bcopy_from_host(be, mc_model_params(m), p, n * sizeof *p);
            lm = step(m, tok, tgt, 0, 1.0f);
            fd = (lp - lm) / (2 * h);
            double err = fabs(fd - g[j]), tol = 1e-2 * fabs(g[j]) + 5e-5 * noise;
            if (err / tol > worst_el) worst_el = err / tol;
            if (err > tol) {
                TAP_DIAG("%s %s[%zu]: fd %.6g analytic %.6g", preset, q->name, top[t], fd, g[j]);
                ok = 0;
            }
            checked++;
        }
    }
    mc_bcopy_from_host(be, mc_model_params(m), p0, n * sizeof *p0);
    TAP_OK(ok,
           "%s: gradients of all %zu tensors match central differences (%d directions, "
           "worst err/tol %.2g; %d elements, worst err/tol %.2g)",
           preset, mc_model_num_params(m), ndir, worst_dir, checked, worst_el);
    free(p);
    free(p0);
    free(g);
    mc_model_free(m);
}

/* The LM head runs in chunks of 256 rows: a micro-batch of 5 x 64 = 320
 * rows (a full and a partial chunk) must equal five one-sequence
 * micro-batches accumulated with grad_scale 1/5 (same mean loss; same
 * gradient up to fp32 summation order: 1e-5 relative on the norm of the
 * difference). Also checks accumulation (+=) over micro-batches. */
static void test_chunks(const char *preset)
{
    const int B = 5, T = 64, V = 200;
    mc_model *big = make(preset, T, V, 64, B, NULL, MC_PREC_FP32);
    mc_model *one = make(preset, T, V, 64, 1, NULL, MC_PREC_FP32);
    if (!big || !one) {
        TAP_OK(0, "%s chunk models build", preset);
        return;
    }
    mc_model_init_weights(big, 11);
    mc_model_init_weights(one, 11);
    int32_t tok[320], tgt[320];
    make_batch(tok, tgt, 320, V);
    tgt[7] = tgt[300] = -1;
    mc_model_zero_grads(big);
    mc_model_zero_grads(one);
    double lb = step(big, tok, tgt, 1, 1.0f), ls = 0;
    int64_t counted = 0;
    for (int b = 0; b < B; b++) {
        double l;
        int64_t nt;
        mc_error err = {0};
        /* weight each sequence by its share of the counted targets */
        int cnt = 0;
        for (int t = 0; t < T; t++) cnt += tgt[b * T + t] >= 0;
        mc_model_step(one, tok + b * T, tgt + b * T, 1, (float)cnt / 318.0f, &l, &nt, &err);
        ls += l * (double)nt;
        counted += nt;
    }
    ls /= (double)counted;
    float *gb = host_copy(big, mc_model_grads(big)), *gs = host_copy(one, mc_model_grads(one));
    double dn = 0, nn = 0;
    for (size_t i = 0; i < mc_model_numel(big); i++) {
        dn += ((double)gb[i] - gs[i]) * ((double)gb[i] - gs[i]);
        nn += (double)gb[i] * gb[i];
    }
    TAP_OK(counted == 318 && fabs(lb - ls) < 1e-5 * lb && sqrt(dn / nn) < 1e-5,
           "%s: 320 rows in LM-head chunks = 5 accumulated micro-batches (loss %.7f vs %.7f, "
           "grad rel diff %.2g)",
           preset, lb, ls, sqrt(dn / nn));
    free(gb);
    free(gs);
    mc_model_free(big);
    mc_model_free(one);
}

/* Two fresh models, same seed and batch: identical loss and gradient bytes. */
static void test_determinism(const char *preset, mc_prec prec)
{
    double l[2];
    float *g[2];
    for (int r = 0; r < 2; r++) {
        mc_model *m = make(preset, 32, 100, 64, 3, NULL, prec);
        lcg = 1234;
        int32_t tok[96], tgt[96];
        make_batch(tok, tgt, 96, 100);
        mc_model_init_weights(m, 77);
        mc_model_zero_grads(m);
        l[r] = step(m, tok, tgt, 1, 0.5f);
        step(m, tok, tgt, 1, 0.5f); /* accumulate a second micro-batch */
        g[r] = host_copy(m, mc_model_grads(m));
        if (r == 1)
            TAP_OK(!memcmp(&l[0], &l[1], sizeof l[0]) &&
                       !memcmp(g[0], g[1], mc_model_numel(m) * sizeof(float)),
                   "%s %s: two runs give identical loss (%.7f) and gradient bytes", preset,
                   prec == MC_PREC_FP32 ? "fp32" : "bf16", l[0]);
        mc_model_free(m);
    }
    free(g[0]);
    free(g[1]);
}

static void test_step_errors(void)
{
    mc_model *m = make("tiny-gpt", 8, 60, 64, 1, NULL, MC_PREC_FP32);
    if (!m) return;
    mc_model_init_weights(m, 1);
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    double loss = -1;
    int64_t nt = -1;
    mc_error err = {0};
    tok[3] = 64;
    TAP_OK(mc_model_step(m, tok, tgt, 0, 1, &loss, &nt, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "token id 64 at position 3 of the micro-batch is outside the "
                               "vocabulary [0, 64)"),
           "token outside the vocabulary: %s", err.msg);
    tok[3] = -2;
    TAP_OK(mc_model_step(m, tok, tgt, 0, 1, &loss, &nt, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "token id -2 at position 3"),
           "negative token: %s", err.msg);
    tok[3] = 4;
    tgt[6] = 1000;
    TAP_OK(mc_model_step(m, tok, tgt, 0, 1, &loss, &nt, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "target id 1000 at position 6"),
           "target outside the vocabulary: %s", err.msg);
    for (int i = 0; i < 8; i++) tgt[i] = -1;
    mc_model_zero_grads(m);
    mc_status st = mc_model_step(m, tok, tgt, 1, 1, &loss, &nt, &err);
    float *g = host_copy(m, mc_model_grads(m));
    double s = 0;
    for (size_t i = 0; i < mc_model_numel(m); i++) s += fabs(g[i]);
    TAP_OK(!st && loss == 0 && nt == 0 && s == 0,
           "all targets ignored: loss 0, 0 tokens, no gradient");
    free(g);
    /* uniform logits: a zero-weight model (no init) predicts 1/64 everywhere */
    mc_model_free(m);
    m = make("tiny-gpt", 8, 60, 64, 1, NULL, MC_PREC_FP32);
    for (int i = 0; i < 8; i++) tgt[i] = i;
    st = mc_model_step(m, tok, tgt, 0, 1, &loss, &nt, &err);
    TAP_OK(!st && nt == 8 && fabs(loss - log(64.0)) < 1e-6,
           "all-zero weights: loss = ln(64) = %.6f over the padded vocabulary (got %.6f)",
           log(64.0), loss);
    mc_model_free(m);
}

/* ---------------------------------------------------------------- golden */

static void test_golden(const char *preset)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/model/golden_%s.json", top ? top : ".", preset);
    json_t *j = NULL;
    mc_error err = {0};
    if (mc_json_load_file(path, &j, &err)) {
        TAP_OK(0, "golden %s: %s", preset, err.msg);
        return;
    }
    int B = (int)json_integer_value(json_object_get(j, "micro_batch"));
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(j, "seed"));
    json_t *jt = json_object_get(j, "tokens"), *jg = json_object_get(j, "targets");
    size_t n = json_array_size(jt);
    int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)json_integer_value(json_array_get(jt, i));
        tgt[i] = (int32_t)json_integer_value(json_array_get(jg, i));
    }
    /* same shape as tests/unit/model_dump.c */
    mc_model *m = make(preset, (int)(n / (size_t)B), 60, 64, B, NULL, MC_PREC_FP32);
    if (!m) {
        TAP_OK(0, "golden model builds");
        return;
    }
    mc_model_init_weights(m, seed);
    mc_model_zero_grads(m);
    double loss = step(m, tok, tgt, 1, 1.0f);
    double ref = json_real_value(json_object_get(j, "loss_fp64"));
    /* fp32 against float64: seen 2e-8 relative on the loss, 5e-7 on gradient
     * norms and sums; the bounds leave room for another summation order. */
    TAP_OK(fabs(loss - ref) <= 1e-6 * fabs(ref),
           "%s: loss %.8f vs PyTorch float64 %.8f (1e-6 relative)", preset, loss, ref);
    float *g = host_copy(m, mc_model_grads(m));
    json_t *grads = json_object_get(j, "grads");
    int ok = json_object_size(grads) == mc_model_num_params(m);
    double worst = 0;
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *p = mc_model_param(m, i);
        json_t *e = json_object_get(grads, p->name);
        if (!e) {
            TAP_DIAG("golden lacks %s", p->name);
            ok = 0;
            continue;
        }
        double nr = json_real_value(json_object_get(e, "norm_fp64"));
        double sr = json_real_value(json_object_get(e, "sum_fp64"));
        double nm = 0, sm = 0;
        for (size_t k = 0; k < p->numel; k++) {
            nm += (double)g[p->offset + k] * g[p->offset + k];
            sm += g[p->offset + k];
        }
        nm = sqrt(nm);
        double en = fabs(nm - nr) / nr, es = fabs(sm - sr) / (fabs(sr) + nr);
        if (en > worst) worst = en;
        if (es > worst) worst = es;
        if (en > 1e-5 || es > 1e-5) {
            TAP_DIAG("%s: grad norm %.8g vs %.8g, sum %.8g vs %.8g", p->name, nm, nr, sm, sr);
            ok = 0;
        }
    }
    TAP_OK(ok,
           "%s: every gradient's norm and sum match PyTorch float64 within 1e-5 "
           "(worst %.2g)",
           preset, worst);
    free(g);
    free(tok);
    free(tgt);
    json_decref(j);
    mc_model_free(m);
}

/* ---------------------------------------------------------- recomputation */

/* Every recomputation setting: two micro-batches' loss and accumulated
 * gradients equal the run without it bit for bit, with less kept per
 * micro-batch; a group larger than the stage is refused. */
static void test_recompute(const char *preset, mc_prec prec)
{
    static const struct {
        int g, meth, n;
        unsigned mods;
    } set[] = {
        {MC_RECOMPUTE_NONE, 0, 0, 0},
        {MC_RECOMPUTE_FULL, MC_RECOMPUTE_UNIFORM, 1, 0},
        {MC_RECOMPUTE_FULL, MC_RECOMPUTE_UNIFORM, 2, 0},
        {MC_RECOMPUTE_FULL, MC_RECOMPUTE_BLOCK, 2, 0},
        {MC_RECOMPUTE_SELECTIVE, 0, 0, MC_RECOMPUTE_CORE_ATTN},
        {MC_RECOMPUTE_SELECTIVE, 0, 0, MC_RECOMPUTE_LAYERNORM},
        {MC_RECOMPUTE_SELECTIVE, 0, 0, MC_RECOMPUTE_MLP},
        {MC_RECOMPUTE_SELECTIVE, 0, 0,
         MC_RECOMPUTE_CORE_ATTN | MC_RECOMPUTE_LAYERNORM | MC_RECOMPUTE_MLP},
    };
    const int T = 16, B = 2;
    mc_grid one;
    mc_grid_single(&one);
    mc_model_config c;
    mc_error err = {0};
    mc_model_preset(preset, &c, &err);
    c.num_layers = 3;
    c.qk_layernorm = qk_on;
    c.seq_length = c.max_position_embeddings = T;
    c.vocab_size = 60;
    c.make_vocab_size_divisible_by = 64;
    int32_t tok[2][2 * 16], tgt[2][2 * 16];
    for (int k = 0; k < 2; k++) make_batch(tok[k], tgt[k], (size_t)(B * T), 60);
    float *ref = NULL;
    double ref_loss[2] = {0, 0};
    size_t ref_kept = 0;
    int ok = 1;
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        c.recompute_granularity = set[i].g;
        c.recompute_method = set[i].meth;
        c.recompute_num_layers = set[i].n;
        c.recompute_modules = set[i].mods;
        mc_model *m = NULL;
        if (mc_model_new(&c, &one, be, B, prec, &m, &err)) {
            TAP_DIAG("setting %zu: %s", i, err.msg);
            ok = 0;
            continue;
        }
        mc_model_init_weights(m, 11);
        mc_model_zero_grads(m);
        double loss[2] = {step(m, tok[0], tgt[0], 1, 0.5f), step(m, tok[1], tgt[1], 1, 0.5f)};
        float *g = host_copy(m, mc_model_grads(m));
        mc_act_bytes ab;
        mc_model_act_bytes(m, &ab);
        if (i == 0) {
            ref = g;
            ref_loss[0] = loss[0], ref_loss[1] = loss[1];
            ref_kept = ab.kept;
            ok &= ab.workspace == 0;
        } else {
            int same = !memcmp(g, ref, mc_model_numel(m) * sizeof *g) && loss[0] == ref_loss[0] &&
                       loss[1] == ref_loss[1];
            if (!same || ab.kept >= ref_kept || !ab.workspace)
                TAP_DIAG("setting %zu: same bits %d, kept %zu (none %zu), workspace %zu", i, same,
                         ab.kept, ref_kept, ab.workspace);
            ok &= same && ab.kept < ref_kept && ab.workspace > 0;
            free(g);
        }
        ok &= ab.total == (size_t)ab.slots * ab.kept + ab.workspace + ab.scratch;
        mc_model_free(m);
    }
    free(ref);
    TAP_OK(ok,
           "%s%s: 7 recomputation settings give the losses and gradients of none bit for bit, "
           "keeping less",
           preset, prec == MC_PREC_BF16 ? " (bf16)" : "");
    c.recompute_granularity = MC_RECOMPUTE_FULL;
    c.recompute_method = MC_RECOMPUTE_UNIFORM;
    c.recompute_num_layers = 4;
    c.recompute_modules = 0;
    mc_model *m = NULL;
    mc_status st = mc_model_new(&c, &one, be, B, prec, &m, &err);
    TAP_OK(st == MC_ERR_USAGE && !m &&
               strstr(err.msg, "more than the 3 layers of pipeline stage 0"),
           "a group of 4 on a stage of 3 layers: %s", err.msg);
}

/* --qk-layernorm: the registry's names and shapes (Megatron Core's
 * q_layernorm, k_layernorm: [head dim], no weight decay, init 1), the
 * gradients against central differences (RMSNorm and LayerNorm with its
 * bias), and recomputation bit for bit. */
static void test_qk_layernorm(void)
{
    qk_on = 1;
    mc_model *m = make("tiny-llama", 8, 60, 64, 2, NULL, MC_PREC_FP32);
    mc_model *g = make("tiny-gpt", 8, 60, 64, 2, NULL, MC_PREC_FP32);
    int ok = m && g;
    if (ok) {
        const mc_model_config *c = mc_model_get_config(m);
        const char *names[] = {"decoder.layers.1.self_attention.q_layernorm.weight",
                               "decoder.layers.1.self_attention.k_layernorm.weight"};
        for (int i = 0; i < 2; i++) {
            const mc_param *p = mc_model_param_by_name(m, names[i]);
            ok &= p && p->ndim == 1 && p->rows == c->kv_channels && p->split_dim == -1 &&
                  p->no_weight_decay && p->init_std == 0 && p->init_value == 1.0f;
        }
        ok &= !mc_model_param_by_name(m, "decoder.layers.1.self_attention.q_layernorm.bias");
        ok &= mc_model_param_by_name(g, "decoder.layers.1.self_attention.k_layernorm.bias") != NULL;
        /* the parameter after linear_qkv in the layer (Megatron's module order) */
        for (size_t i = 0; ok && i + 1 < mc_model_num_params(m); i++)
            if (!strcmp(mc_model_param(m, i)->name,
                        "decoder.layers.0.self_attention.linear_qkv.weight"))
                ok &= !strcmp(mc_model_param(m, i + 1)->name,
                              "decoder.layers.0.self_attention.q_layernorm.weight");
    }
    TAP_OK(ok, "--qk-layernorm: q_layernorm/k_layernorm [head dim] in the registry (bias with "
               "LayerNorm)");
    mc_model_free(m);
    mc_model_free(g);
    grad_check("tiny-llama");
    grad_check("tiny-gpt");
    test_recompute("tiny-llama", MC_PREC_FP32);
    qk_on = 0;
}

int main(void)
{
    mc_error err = {0};
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    test_registry();
    test_init();
    grad_check("tiny-gpt");
    grad_check("tiny-llama");
    test_chunks("tiny-gpt");
    test_chunks("tiny-llama");
    test_determinism("tiny-gpt", MC_PREC_FP32);
    test_determinism("tiny-llama", MC_PREC_BF16);
    test_step_errors();
    test_recompute("tiny-gpt", MC_PREC_FP32);
    test_recompute("tiny-llama", MC_PREC_BF16);
    test_golden("tiny-gpt");
    test_golden("tiny-llama");
    test_qk_layernorm();
    test_etp_slices("tiny-llama", 64, 0, 0);
    test_etp_slices("tiny-gpt", 0, 0, 0);
    test_etp_slices("tiny-gpt", 0, 1, 0);
    test_etp_slices("tiny-llama", 64, 0, 1);
    test_etp_slices("tiny-gpt", 0, 1, 1);
    mc_backend_free(be);
    return tap_done();
}
