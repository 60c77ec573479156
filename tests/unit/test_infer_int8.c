/*
 * test_infer_int8.c - int8 inference (mc_infer_use_int8: int8 weights
 * times activations quantized to int8 in blocks of 32, kern_ops.def
 * mc_k_linear_q8a8_fwd): on tiny GPT and Llama models whose linear weights
 * were first replaced by their int8 round trip (codes * row scale, so the
 * int8 copy holds exactly the same values), every per-token
 * log-probability of a prefill and of a token-at-a-time decode through the
 * cache (the one-row kernel path), and the last position's logits, are
 * the fp32 run's but for the activations' rounding: each activation moves
 * by at most half a code, 1/254 of its block's largest magnitude; measured
 * 3.9e-4 (log-probabilities) and 5.0e-3 (logits) of the largest |value|,
 * asserted within 1e-3 and 1e-2 (a wrong scale, code or block would be far
 * off). A second check shows the path is really taken: on the original
 * weights the int8 run differs.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/kern.h"
#include "mc/model.h"
#include "tap.h"

#define T 24
#define VOCAB 60

static mc_backend *be;

static mc_model *make(const char *preset)
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
    mc_model *m = NULL;
    if (mc_model_new(&c, &one, be, 1, MC_PREC_FP32, &m, &err)) return NULL;
    mc_model_init_weights(m, 99);
    return m;
}

/* Replace every 2-D weight by its int8 round trip. */
static void round_trip_int8(mc_model *m)
{
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *p = mc_model_param(m, i);
        if (p->ndim != 2 || strstr(p->name, "position_embeddings")) continue;
        size_t r = (size_t)p->local_rows, c = (size_t)p->local_cols;
        int8_t *q = mc_balloc(be, r * c, NULL);
        float *s = mc_balloc(be, r * sizeof(float), NULL);
        float *w = mc_model_params(m) + p->offset;
        mc_k_quantize_q8_rows(be, q, s, w, r, c);
        int8_t *hq = malloc(r * c);
        float *hs = malloc(r * sizeof(float)), *hw = malloc(r * c * sizeof(float));
        mc_bcopy_to_host(be, hq, q, r * c);
        mc_bcopy_to_host(be, hs, s, r * sizeof(float));
        for (size_t k = 0; k < r * c; k++) hw[k] = (float)hq[k] * hs[k / c];
        mc_bcopy_from_host(be, w, hw, r * c * sizeof(float));
        free(hq), free(hs), free(hw);
        mc_bfree(be, q);
        mc_bfree(be, s);
    }
}

static double rel_diff(const float *a, const float *b, int64_t n)
{
    double d = 0, r = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        r = fmax(r, fabs((double)b[i]));
    }
    return d / r;
}

/* Scores of the prefill, of a token-at-a-time decode, and the last logits. */
static int run(mc_model *m, int int8, const int32_t *tok, float *pre, float *dec, float *logits)
{
    mc_error err = {0};
    mc_infer *f = NULL;
    if (mc_infer_new(m, T, T, &f, &err)) return -1;
    if (int8 && mc_infer_use_int8(f, &err)) return -1;
    if (mc_infer_extend(f, tok, T - 1, tok + 1, pre, NULL, &err)) return -1;
    mc_infer_truncate(f, 0);
    for (int i = 0; i < T - 1; i++)
        if (mc_infer_extend(f, tok + i, 1, tok + i + 1, dec + i, NULL, &err)) return -1;
    if (mc_infer_logits(f, logits, &err)) return -1;
    mc_infer_free(f);
    return 0;
}

static void check(const char *preset)
{
    mc_model *m = make(preset);
    if (!m) {
        TAP_OK(0, "%s: model", preset);
        return;
    }
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 37 + 11) % VOCAB);
    int64_t V = mc_model_get_config(m)->padded_vocab_size;
    float a[T], b[T], c[T], d[T], *la = malloc(V * sizeof(float)), *lb = malloc(V * sizeof(float));

    /* original weights: int8 must differ from fp32 (the path is taken) */
    int ok = !run(m, 0, tok, a, b, la) && !run(m, 1, tok, c, d, lb);
    TAP_OK(ok && rel_diff(c, a, T - 1) > 1e-7,
           "%s: int8 codes change the scores of fp32 weights (%.2e)", preset,
           ok ? rel_diff(c, a, T - 1) : 0.0);

    round_trip_int8(m);
    ok = !run(m, 0, tok, a, b, la) && !run(m, 1, tok, c, d, lb);
    TAP_OK(ok, "%s: both runs", preset);
    if (ok) {
        double e1 = rel_diff(c, a, T - 1), e2 = rel_diff(d, b, T - 1), e3 = rel_diff(lb, la, V);
        TAP_OK(e1 < 1e-3, "%s: prefill log-probabilities within 1e-3 of the fp32 run's (%.2e)",
               preset, e1);
        TAP_OK(e2 < 1e-3, "%s: one-token decode log-probabilities within 1e-3 (%.2e)", preset, e2);
        TAP_OK(e3 < 1e-2, "%s: last position's logits within 1e-2 (%.2e)", preset, e3);
    }
    free(la), free(lb);
    mc_model_free(m);
}

int main(void)
{
    mc_error err = {0};
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    check("tiny-gpt");
    check("tiny-llama");
    mc_backend_free(be);
    return tap_done();
}
