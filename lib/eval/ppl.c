/*
 * ppl.c - perplexity of a token stream under the window rules of Megatron
 * (plain), llama.cpp's llama-perplexity (llama) and Hugging Face's strided
 * evaluation (sliding), or of a GPT dataset's samples as mc-train
 * validates; the split of an indexed dataset into its documents' ids.
 * eval.h states each rule; here each becomes a list of windows
 *   (first id, length, first scored position within the window)
 * run through one inference context from an empty cache, every position
 * from the first scored one to the end scored against the next id.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mc/eval.h"
#include "mc/indexed.h"

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

static const char *const MODES[] = {"plain", "llama", "sliding", "samples"};

mc_status mc_ppl_mode_parse(const char *s, mc_ppl_mode *out, mc_error *err)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, MODES[i])) {
            *out = (mc_ppl_mode)i;
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_USAGE,
                        "--ppl-mode: expected plain, llama, sliding or samples, got '%s'", s);
}

const char *mc_ppl_mode_name(mc_ppl_mode m) { return (unsigned)m < 4 ? MODES[m] : "?"; }

double mc_ppl_value(const mc_ppl_stats *s)
{
    return s->count ? exp(s->nll / (double)s->count) : NAN;
}

double mc_ppl_stderr(const mc_ppl_stats *s)
{
    if (s->count < 2) return NAN;
    double n = (double)s->count, mean = s->nll / n, var = s->nll2 / n - mean * mean;
    if (var < 0) var = 0;
    return sqrt(var / (n - 1)) * exp(mean);
}

/* Buffers of one window, sized once. */
typedef struct win {
    int32_t *tok, *tgt;
    float *lp;
} win;

static mc_status win_alloc(win *w, size_t n, mc_error *err)
{
    w->tok = malloc((n + 1) * sizeof *w->tok);
    w->tgt = malloc((n + 1) * sizeof *w->tgt);
    w->lp = malloc((n + 1) * sizeof *w->lp);
    if (!w->tok || !w->tgt || !w->lp) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    return MC_OK;
}

static void win_free(win *w)
{
    free(w->tok);
    free(w->tgt);
    free(w->lp);
}

/* Run ids[0..len) from an empty cache, scoring positions i >= from against
 * ids[i + 1] (i + 1 < len + extra, where extra = 1 lets the last position
 * predict the id after the window). bos >= 0 overwrites the first id;
 * mask_eod >= 0 leaves unscored the positions whose input is that id
 * (--eod-mask-loss). */
static mc_status run_window(mc_infer *inf, win *w, const int32_t *ids, size_t len, size_t from,
                            int extra, int32_t bos, int32_t mask_eod, mc_ppl_stats *s,
                            mc_error *err)
{
    memcpy(w->tok, ids, len * sizeof *w->tok);
    if (bos >= 0) w->tok[0] = bos;
    for (size_t i = 0; i < len; i++)
        w->tgt[i] = i >= from && (i + 1 < len || extra) ? ids[i + 1] : -1;
    if (mask_eod >= 0) mc_doc_mask_targets(mask_eod, w->tok, w->tgt, len);
    mc_infer_truncate(inf, 0);
    TRY(mc_infer_extend(inf, w->tok, (int)len, w->tgt, w->lp, NULL, err));
    for (size_t i = 0; i < len; i++) {
        if (w->tgt[i] < 0) continue;
        double v = -(double)w->lp[i];
        s->nll += v;
        s->nll2 += v * v;
        s->count++;
    }
    s->windows++;
    return MC_OK;
}

mc_status mc_ppl_run(mc_infer *inf, const mc_ppl_config *c, const int32_t *ids, size_t n,
                     mc_ppl_stats *s, mc_ppl_progress cb, void *cb_ctx, mc_error *err)
{
    memset(s, 0, sizeof *s);
    s->tokens = (int64_t)n;
    size_t ctx = (size_t)c->ctx;
    if (c->ctx < 2 || c->ctx > mc_infer_capacity(inf))
        return mc_error_set(err, MC_ERR_USAGE, "--ctx-size %d: must be in [2, %d]", c->ctx,
                            mc_infer_capacity(inf));
    size_t nwin = 0, stride = 0;
    switch (c->mode) {
    case MC_PPL_PLAIN:
        if (n < 2)
            return mc_error_set(err, MC_ERR_LIMIT,
                                "the text has %zu tokens: perplexity needs at least 2", n);
        nwin = (n - 1 + ctx - 1) / ctx;
        break;
    case MC_PPL_LLAMA:
        if (n < 2 * ctx)
            return mc_error_set(err, MC_ERR_LIMIT,
                                "the text has %zu tokens: --ppl-mode llama needs at least 2 x "
                                "--ctx-size = %zu",
                                n, 2 * ctx);
        nwin = n / ctx;
        break;
    case MC_PPL_SAMPLES:
        return mc_error_set(err, MC_ERR_INTERNAL, "mc_ppl_run: samples are mc_ppl_run_gptdata's");
    case MC_PPL_SLIDING:
        stride = c->stride > 0 ? (size_t)c->stride : ctx / 2;
        if (stride > ctx)
            return mc_error_set(err, MC_ERR_USAGE, "--stride %zu exceeds --ctx-size %zu", stride,
                                ctx);
        if (n < 2)
            return mc_error_set(err, MC_ERR_LIMIT,
                                "the text has %zu tokens: perplexity needs at least 2", n);
        /* windows begin at 0, stride, ... until one reaches the end */
        nwin = n <= ctx ? 1 : (n - ctx + stride - 1) / stride + 1;
        break;
    }
    if (c->max_windows > 0 && (size_t)c->max_windows < nwin) nwin = (size_t)c->max_windows;
    win w;
    mc_status st = win_alloc(&w, ctx, err);
    size_t prev_end = 0;
    for (size_t k = 0; k < nwin && !st; k++) {
        switch (c->mode) {
        case MC_PPL_PLAIN: {
            size_t b = k * ctx, len = n - 1 - b < ctx ? n - 1 - b : ctx;
            st = run_window(inf, &w, ids + b, len, 0, 1, -1, c->mask_eod, s, err);
            break;
        }
        case MC_PPL_LLAMA:
            /* positions first .. ctx - 2 predict ids first + 1 .. ctx - 1 */
            st = run_window(inf, &w, ids + k * ctx, ctx, ctx / 2, 0, c->bos, c->mask_eod, s, err);
            break;
        case MC_PPL_SLIDING: {
            size_t b = k * stride, e = b + ctx < n ? b + ctx : n;
            /* score ids prev_end .. e - 1, i.e. positions prev_end - 1 - b .. */
            size_t from = prev_end > b + 1 ? prev_end - 1 - b : 0;
            st = run_window(inf, &w, ids + b, e - b, from, 0, -1, c->mask_eod, s, err);
            prev_end = e;
            break;
        }
        case MC_PPL_SAMPLES: break;
        }
        if (!st && cb) cb(cb_ctx, s, (int64_t)nwin);
    }
    win_free(&w);
    return st;
}

mc_status mc_ppl_run_gptdata(mc_infer *inf, const mc_gptdata_config *dc, mc_split split,
                             int64_t first, int64_t count, mc_ppl_stats *s, mc_ppl_progress cb,
                             void *cb_ctx, mc_error *err)
{
    memset(s, 0, sizeof *s);
    int64_t T = dc->seq_length;
    if (T < 2 || T > mc_infer_capacity(inf))
        return mc_error_set(err, MC_ERR_USAGE, "--ctx-size %" PRId64 ": must be in [2, %d]", T,
                            mc_infer_capacity(inf));
    mc_gpt_dataset *ds = NULL;
    TRY(mc_gpt_dataset_open(dc, &ds, err));
    int64_t have = mc_gpt_dataset_num_samples(ds, split);
    if (count < 0) count = have - first;
    mc_status st = MC_OK;
    if (have <= 0)
        st = mc_error_set(err, MC_ERR_USAGE, "the dataset has no %s split under --split %s",
                          mc_split_name(split), dc->split ? dc->split : "969,30,1");
    else if (first < 0 || count < 1 || first + count > have)
        st = mc_error_set(err, MC_ERR_USAGE,
                          "samples %" PRId64 " to %" PRId64
                          " asked of the %s split, which has %" PRId64,
                          first, first + count - 1, mc_split_name(split), have);
    win w = {0};
    int32_t *sample = malloc((size_t)(T + 1) * sizeof *sample);
    if (!st && !sample) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (!st) st = win_alloc(&w, (size_t)T, err);
    for (int64_t i = 0; i < count && !st; i++) {
        if ((st = mc_gpt_dataset_sample(ds, split, first + i, sample, err))) break;
        /* Megatron's pad id -1 (a short last validation sample): no input,
         * no target */
        size_t len = (size_t)T;
        while (len > 1 && sample[len - 1] < 0) len--;
        for (size_t j = 0; j < len; j++) {
            w.tok[j] = sample[j];
            w.tgt[j] = sample[j + 1];
        }
        if (dc->eod_mask_loss) mc_doc_mask_targets(dc->eod, w.tok, w.tgt, len);
        mc_infer_truncate(inf, 0);
        if ((st = mc_infer_extend(inf, w.tok, (int)len, w.tgt, w.lp, NULL, err))) break;
        for (size_t j = 0; j < len; j++) {
            if (w.tgt[j] < 0) continue;
            double v = -(double)w.lp[j];
            s->nll += v;
            s->nll2 += v * v;
            s->count++;
        }
        s->tokens += (int64_t)len;
        s->windows++;
        if (cb) cb(cb_ctx, s, count);
    }
    free(sample);
    win_free(&w);
    mc_gpt_dataset_close(ds);
    return st;
}

mc_status mc_eval_dataset_ids(const char *prefix, const char *split_weights, int split, mc_ids *out,
                              int64_t *ndocs, mc_error *err)
{
    mc_idx x;
    TRY(mc_idx_open(prefix, &x, err));
    int64_t ndoc = (int64_t)x.n_doc_idx - 1, beg = 0, end = ndoc;
    mc_status st = MC_OK;
    if (split >= 0) {
        double w[MC_SPLIT_COUNT];
        st = mc_gptdata_parse_split(split_weights ? split_weights : "969,30,1", w, err);
        if (!st) {
            double b = 0;
            for (int i = 0; i < split; i++) b += w[i];
            double e = b + w[split];
            /* int(round(x * N)), round half to even, as gptdata does */
            beg = (int64_t)nearbyint(b * (double)ndoc);
            end = (int64_t)nearbyint(e * (double)ndoc);
            if (end <= beg)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "%s: the %s split under --split %s holds no document (of %" PRId64
                                  ")",
                                  prefix, mc_split_name((mc_split)split),
                                  split_weights ? split_weights : "969,30,1", ndoc);
        }
    }
    for (int64_t d = beg; d < end && !st; d++) {
        int64_t s0 = mc_idx_doc_index(&x, (uint64_t)d), s1 = mc_idx_doc_index(&x, (uint64_t)d + 1);
        for (int64_t q = s0; q < s1 && !st; q++) st = mc_idx_read(&x, (uint64_t)q, out, err);
    }
    if (ndocs) *ndocs = end - beg;
    mc_idx_close(&x);
    return st;
}
