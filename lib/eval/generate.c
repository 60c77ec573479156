/*
 * generate.c - text generation: the sampler (temperature, top-k, top-p,
 * greedy) and the loop that feeds each new token back through the
 * inference context, one position per token thanks to its key/value cache.
 *
 * The sampler works on one row of logits on the host: it is a few hundred
 * kilobytes per token, chosen from once, as llama.cpp's samplers do; every
 * rank of a tensor-parallel group holds the same gathered row and the same
 * generator, so all ranks pick the same token without a broadcast.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mc/eval.h"

void mc_gen_config_init(mc_gen_config *c)
{
    memset(c, 0, sizeof *c);
    c->max_new_tokens = 64;
    c->temperature = 0.0;
    c->top_k = 0;
    c->top_p = 1.0;
    c->seed = 1234;
    c->eod = -1;
}

const char *mc_gen_stop_name(mc_gen_stop s)
{
    switch (s) {
    case MC_GEN_STOP_EOD: return "eod";
    case MC_GEN_STOP_LENGTH: return "length";
    case MC_GEN_STOP_CONTEXT: return "context";
    }
    return "?";
}

/* splitmix64's finalizer */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) from (seed, stream, step) */
static double uniform(uint64_t seed, uint64_t stream, uint64_t step)
{
    uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull);
    h = mix(h ^ (stream + 0x632be59bd9b4e019ull));
    h = mix(h ^ (step + 0x85157af5ull));
    return (double)(h >> 11) * 0x1p-53;
}

/* descending logit, then ascending id: a total order, so the same bits
 * give the same list on every machine (glibc's qsort_r) */
static int by_logit(const void *a, const void *b, void *ctx)
{
    const float *l = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = l[i], y = l[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

int32_t mc_sample(const mc_gen_config *c, const float *logits, uint64_t stream, uint64_t step,
                  float *scratch, int32_t *idx)
{
    int64_t V = c->vocab_size;
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = (int32_t)i;
    if (c->temperature <= 0 || c->top_k == 1) return best;
    /* temperature, then the candidates in order */
    for (int64_t i = 0; i < V; i++) {
        scratch[i] = (float)((double)logits[i] / c->temperature);
        idx[i] = (int32_t)i;
    }
    qsort_r(idx, (size_t)V, sizeof *idx, by_logit, scratch);
    int64_t n = V;
    if (c->top_k > 0 && c->top_k < n) n = c->top_k;
    /* softmax over what top-k left, then the top-p prefix */
    double mx = scratch[idx[0]], sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)scratch[idx[i]] - mx);
    if (c->top_p < 1.0) {
        double cum = 0;
        int64_t keep = 0;
        while (keep < n) {
            cum += exp((double)scratch[idx[keep]] - mx) / sum;
            keep++;
            if (cum >= c->top_p) break;
        }
        n = keep;
        sum = 0;
        for (int64_t i = 0; i < n; i++) sum += exp((double)scratch[idx[i]] - mx);
    }
    double u = uniform(c->seed, stream, step) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += exp((double)scratch[idx[i]] - mx);
        if (u < acc) return idx[i];
    }
    return idx[n - 1];
}

mc_status mc_generate(mc_infer *inf, const mc_gen_config *c, uint64_t stream, const int32_t *prompt,
                      size_t n, mc_ids *out, mc_gen_stop *stop, mc_error *err)
{
    int cap = mc_infer_capacity(inf);
    if (n < 1) return mc_error_set(err, MC_ERR_USAGE, "an empty prompt");
    if (n >= (size_t)cap)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "the prompt has %zu tokens: no room left in a context of %d", n, cap);
    mc_ids seq = MC_IDS_INIT;
    float *logits = NULL, *scratch = NULL;
    int32_t *idx = NULL;
    mc_status st = mc_ids_reserve(&seq, n + (size_t)c->max_new_tokens, err);
    if (st) return st;
    memcpy(seq.v, prompt, n * sizeof *seq.v);
    seq.n = n;
    logits = malloc((size_t)mc_infer_padded_vocab(inf) * sizeof *logits);
    scratch = malloc((size_t)c->vocab_size * sizeof *scratch);
    idx = malloc((size_t)c->vocab_size * sizeof *idx);
    if (!logits || !scratch || !idx) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    *stop = MC_GEN_STOP_LENGTH;
    mc_infer_truncate(inf, 0);
    if (!st) st = mc_infer_extend(inf, prompt, (int)n, NULL, NULL, NULL, err);
    for (int k = 0; k < c->max_new_tokens && !st; k++) {
        if ((st = mc_infer_logits(inf, logits, err))) break;
        int32_t t = mc_sample(c, logits, stream, (uint64_t)k, scratch, idx);
        seq.v[seq.n++] = t;
        if ((st = mc_ids_push(out, t, err))) break;
        if (t == c->eod) {
            *stop = MC_GEN_STOP_EOD;
            break;
        }
        if (k + 1 == c->max_new_tokens) break;
        if (seq.n >= (size_t)cap) {
            *stop = MC_GEN_STOP_CONTEXT;
            break;
        }
        if (c->no_cache) {
            mc_infer_truncate(inf, 0);
            st = mc_infer_extend(inf, seq.v, (int)seq.n, NULL, NULL, NULL, err);
        } else {
            st = mc_infer_extend(inf, &t, 1, NULL, NULL, NULL, err);
        }
    }
    free(logits);
    free(scratch);
    free(idx);
    mc_ids_free(&seq);
    return st;
}
