/*
 * test_infer_batch.c - batched inference over key/value blocks
 * (lib/model/infer_batch.c) on tiny GPT and Llama models with random
 * weights: a sequence's logits and log-probabilities are the same bits
 * alone, beside others in one call, cut into chunks of any size, and
 * decoded one row at a time; and they equal the one-sequence context's
 * (mc_infer) within 1e-5 (another linear kernel: the sums round
 * differently). Blocks go back to the pool. The same for mixtures of
 * experts (softmax top-2 with a shared expert, SwiGLU; sigmoid top-4 with
 * a random expert bias and group-limited routing, GELU), on fp32, int8
 * and bf16 weights: the rows an expert receives change with the batch,
 * its row-invariant GEMM keeps each row's bits. On int8 weights both run
 * the same int8 x int8 kernel (mc_k_linear_q8a8_fwd): mc_infer's int8
 * results are the pool's within 1e-5 too.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/kern.h"
#include "mc/model.h"
#include "tap.h"

static mc_backend *be;

#define T 40
#define VOCAB 60

/* --qk-layernorm on the models make() builds */
static int qk_on;

enum { DENSE, MOE_SOFTMAX_SHARED, MOE_SIGMOID_BIAS_GROUPS };
static const char *const MOE_NAME[] = {"", " moe softmax top-2 + shared",
                                       " moe sigmoid top-4 bias groups"};
static const char *const WEIGHTS[] = {"", " int8", " bf16"};

static mc_model *make(const char *preset, int moe)
{
    mc_model_config c;
    mc_error err = {0};
    mc_grid one;
    mc_grid_single(&one);
    if (mc_model_preset(preset, &c, &err)) return NULL;
    c.seq_length = T;
    c.max_position_embeddings = 64;
    c.vocab_size = VOCAB;
    c.make_vocab_size_divisible_by = 16;
    c.qk_layernorm = qk_on;
    if (moe != DENSE) {
        c.num_experts = moe == MOE_SIGMOID_BIAS_GROUPS ? 8 : 4;
        c.moe_ffn_hidden_size = 24;
        c.moe_router_topk = 2;
        c.moe_layer_freq = 1;
        if (moe == MOE_SOFTMAX_SHARED) c.moe_shared_expert_intermediate_size = 16;
        if (moe == MOE_SIGMOID_BIAS_GROUPS) {
            c.moe_router_topk = 4;
            c.moe_router_score_sigmoid = 1;
            c.moe_router_enable_expert_bias = 1;
            c.moe_router_num_groups = 4;
            c.moe_router_group_topk = 2;
        }
    }
    mc_model *m = NULL;
    if (mc_model_new(&c, &one, be, 1, MC_PREC_FP32, &m, &err)) {
        TAP_DIAG("mc_model_new(%s): %s", preset, err.msg);
        return NULL;
    }
    mc_model_init_weights(m, 4321);
    /* a random expert bias, of the sigmoids' size */
    uint32_t r = 7;
    float *pb = mc_model_params(m);
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *pa = mc_model_param(m, i);
        if (!strstr(pa->name, "expert_bias")) continue;
        float b[64];
        for (int64_t j = 0; j < pa->rows && j < 64; j++) {
            r = r * 1103515245u + 12345u;
            b[j] = 0.02f * ((float)((r >> 16) % 1000) / 1000.0f - 0.5f);
        }
        mc_bcopy_from_host(be, pb + pa->offset, b, (size_t)pa->rows * sizeof(float));
    }
    return m;
}

/* Run seq s (ids[0..n)) through the pool in chunks of `chunk` rows, beside
 * `others` other sequences that each advance one row a call; the last
 * row's logits into logits, log p(ids[i+1]) into lp. Each sequence has
 * blocks of its own: the sequence blocks[0], the others blocks[1..]. */
static int run(mc_kvpool *p, const int32_t *ids, int n, int chunk, int others, float *logits,
               double *lp, int64_t V)
{
    mc_error err = {0};
    int32_t blocks[8][16], tg[T];
    mc_kvseq q[8];
    int len[8] = {0};
    for (int s = 0; s <= others; s++)
        if (mc_kvpool_take(p, 16, blocks[s], &err)) return 1;
    float *junk = malloc((size_t)V * sizeof *junk);
    for (int i = 0; i + 1 < n; i++) tg[i] = ids[i + 1];
    tg[n - 1] = -1;
    for (int fed = 0; fed < n;) {
        int k = n - fed < chunk ? n - fed : chunk;
        int nq = 0;
        for (int s = 0; s < others; s++) {
            /* another sequence: the same ids reversed, one row a call */
            int32_t *t = (int32_t *)&ids[n - 1 - len[s + 1] % n];
            q[nq++] = (mc_kvseq){blocks[s + 1], len[s + 1]++, t, 1, NULL, NULL, junk};
        }
        q[nq++] = (mc_kvseq){
            blocks[0], fed, ids + fed, k, tg + fed, lp + fed, fed + k == n ? logits : NULL};
        if (mc_infer_batch(p, q, nq, &err)) {
            TAP_DIAG("%s", err.msg);
            free(junk);
            return 1;
        }
        fed += k;
    }
    for (int s = 0; s <= others; s++) mc_kvpool_give(p, blocks[s], 16);
    free(junk);
    return 0;
}

static void check(const char *preset_name, int moe, int weights)
{
    char preset[128];
    snprintf(preset, sizeof preset, "%s%s%s", preset_name, MOE_NAME[moe], WEIGHTS[weights]);
    mc_model *m = make(preset_name, moe);
    if (!m) {
        TAP_OK(0, "%s: model", preset);
        return;
    }
    mc_error err = {0};
    mc_kvpool *p = NULL;
    mc_kvpool_config pc = {mc_kvpool_block_bytes(m, 4) * 200, 4, 64, 64,
                           weights == 1   ? MC_KV_WEIGHTS_INT8
                           : weights == 2 ? MC_KV_WEIGHTS_BF16
                                          : MC_KV_WEIGHTS_FP32};
    TAP_OK(!mc_kvpool_new(m, &pc, &p, &err), "%s: a pool of %d blocks", preset,
           p ? mc_kvpool_blocks(p) : 0);
    if (!p) return;
    int64_t V = mc_kvpool_padded_vocab(p);
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7 + 3) % VOCAB);
    float *ref = malloc((size_t)V * 4), *got = malloc((size_t)V * 4);
    double rlp[T] = {0}, glp[T] = {0};
    run(p, ids, T, 64, 0, ref, rlp, V);
    int same = 1;
    static const int cuts[][2] = {{64, 3}, {1, 0}, {1, 5},  {7, 0}, {8, 0}, {4, 0},
                                  {2, 1},  {7, 2}, {13, 7}, {5, 3}, {16, 4}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        memset(glp, 0, sizeof glp);
        run(p, ids, T, cuts[c][0], cuts[c][1], got, glp, V);
        int ok = !memcmp(ref, got, (size_t)V * 4) && !memcmp(rlp, glp, sizeof rlp);
        for (int i = 0; !ok && i < T; i++)
            if (rlp[i] != glp[i]) {
                TAP_DIAG("first lp differing at %d: %.9g %.9g", i, rlp[i], glp[i]);
                break;
            }
        TAP_OK(ok, "%s: chunks of %d beside %d others: the same bits", preset, cuts[c][0],
               cuts[c][1]);
        same &= ok;
    }
    TAP_OK(mc_kvpool_blocks_free(p) == mc_kvpool_blocks(p), "%s: every block back in the pool",
           preset);
    /* against the one-sequence context (fp32 weights; int8 weights, which
     * both run through mc_k_linear_q8a8_fwd) */
    if (weights == 2) {
        mc_kvpool_free(p);
        mc_model_free(m);
        free(ref), free(got);
        return;
    }
    mc_infer *inf = NULL;
    float olp[T];
    int32_t tg[T];
    for (int i = 0; i + 1 < T; i++) tg[i] = ids[i + 1];
    tg[T - 1] = -1;
    float *ol = malloc((size_t)V * 4);
    mc_infer_new(m, 64, 64, &inf, &err);
    if (weights == 1) mc_infer_use_int8(inf, &err);
    mc_infer_extend(inf, ids, T, tg, olp, NULL, &err);
    mc_infer_logits(inf, ol, &err);
    double d = 0, big = 1;
    for (int i = 0; i + 1 < T; i++) {
        d = fmax(d, fabs(rlp[i] - olp[i]));
        big = fmax(big, fabs(olp[i]));
    }
    for (int64_t v = 0; v < V; v++) d = fmax(d, fabs((double)ref[v] - ol[v]));
    TAP_OK(d <= 1e-5 * big, "%s: logits and log-probabilities within 1e-5 of mc_infer's (%.2e)",
           preset, d);
    mc_infer_free(inf);
    mc_kvpool_free(p);
    mc_model_free(m);
    free(ref), free(got), free(ol);
}

int main(void)
{
    mc_error err = {0};
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    check("tiny-gpt", DENSE, 0);
    check("tiny-llama", DENSE, 0);
    check("tiny-llama", MOE_SOFTMAX_SHARED, 0);
    check("tiny-gpt", MOE_SIGMOID_BIAS_GROUPS, 0);
    check("tiny-gpt", DENSE, 1);
    check("tiny-llama", DENSE, 1);
    check("tiny-llama", MOE_SOFTMAX_SHARED, 1);
    check("tiny-gpt", MOE_SIGMOID_BIAS_GROUPS, 2);
    qk_on = 1; /* the same checks with per-head query/key norms (keys cached normed) */
    TAP_DIAG("with --qk-layernorm:");
    check("tiny-llama", DENSE, 0);
    check("tiny-gpt", DENSE, 0);
    qk_on = 0;
    mc_backend_free(be);
    return tap_done();
}
