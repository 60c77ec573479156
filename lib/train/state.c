/*
 * state.c - a training run's checkpoint: the model's parameters as global
 * tensors (each rank its own block), Adam's moments, the counters that make
 * a resumed run continue bit for bit (iteration, consumed samples, the LR
 * schedule's clock, Adam's step, the loss scaler), and the configuration.
 * Layout in mc-formats(5), CHECKPOINTS; see doc/ARCHITECTURE.md, "Checkpoints".
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "train/state.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/ckpt.h"
#include "mc/distopt.h"
#include "mc/plan.h"
#include "mc/kern.h"

/* ckpt.h's shape convention: cols 0 for a 1-D tensor. */
static int64_t ckpt_cols(const mc_param *p) { return p->ndim == 1 ? 0 : p->cols; }

/* Visit this rank's blocks of a parameter: one, or one per row chunk
 * (SwiGLU's [gate; up], each chunk split over tensor parallelism alone),
 * or with column chunks (the experts' [E, gate F | up F] bias under expert
 * tensor parallelism) one per local row and chunk: a local row's slices
 * lie apart in the global row. */
typedef mc_status (*block_fn)(void *ctx, const mc_param *p, const char *path, int64_t row0,
                              int64_t nrows, int64_t col0, int64_t ncols, float *host,
                              mc_error *err);

static mc_status for_blocks(const mc_param *p, const char *path, float *host, block_fn fn,
                            void *ctx, mc_error *err)
{
    int rc = p->row_chunks > 1 ? p->row_chunks : 1, cc = p->col_chunks > 1 ? p->col_chunks : 1;
    int64_t lrows = p->local_rows / rc, grows = p->chunk_rows;
    int64_t lcols = p->ndim == 1 ? 1 : p->local_cols;
    if (cc > 1) { /* (row_chunks 1: model.h) */
        int64_t w = lcols / cc;
        for (int64_t i = 0; i < p->local_rows; i++)
            for (int k = 0; k < cc; k++) {
                mc_status st = fn(ctx, p, path, p->row0 + i, 1, k * p->chunk_cols + p->col0, w,
                                  host + (size_t)(i * lcols + k * w), err);
                if (st) return st;
            }
        return MC_OK;
    }
    for (int j = 0; j < rc; j++) {
        mc_status st = fn(ctx, p, path, (int64_t)j * grows + p->row0, lrows, p->col0, lcols,
                          host + (size_t)j * (size_t)(lrows * lcols), err);
        if (st) return st;
    }
    return MC_OK;
}

typedef struct wctx {
    mc_ckpt_writer *w;
} wctx;

static mc_status write_block(void *ctx, const mc_param *p, const char *path, int64_t row0,
                             int64_t nrows, int64_t col0, int64_t ncols, float *host, mc_error *err)
{
    wctx *c = ctx;
    return mc_ckpt_write_tensor(c->w, path, p->rows, ckpt_cols(p), row0, col0, nrows, ncols, host,
                                MC_CKPT_FLOAT32, err);
}

static mc_status read_block(void *ctx, const mc_param *p, const char *path, int64_t row0,
                            int64_t nrows, int64_t col0, int64_t ncols, float *host, mc_error *err)
{
    mc_ckpt_reader *r = ctx;
    return mc_ckpt_read_tensor(r, path, p->rows, ckpt_cols(p), row0, col0, nrows, ncols, host, err);
}

/* The three tensors a parameter has in a checkpoint. */
static const char *const GROUPS[3] = {"model", "optimizer/exp_avg", "optimizer/exp_avg_sq"};

static size_t max_param_numel(mc_model *m)
{
    size_t maxn = 1, np = mc_model_num_params(m);
    for (size_t i = 0; i < np; i++)
        if (mc_model_param(m, i)->numel > maxn) maxn = mc_model_param(m, i)->numel;
    return maxn;
}

/* Who writes what (the writer also keeps one copy of any block several
 * ranks give it, but copying replicas to the host would be wasted work):
 * data- and context-parallel replicas leave it to their rank 0, and a
 * parameter replicated over tensor parallelism (split_dim -1: norms,
 * row-parallel biases) to tensor-parallel rank 0, and an expert slice
 * under expert tensor parallelism smaller than TP (p->replica) to the
 * first ETP group of the TP group. The members of one
 * data-parallel group share tp and pp ranks, so they make the same choice
 * for every parameter: the distributed optimizer's moment gather, which is
 * collective over that group, sees the same calls on each. */
static int writes_param(const mc_grid *g, const mc_param *p)
{
    return !(p->split_dim < 0 && g->tp_rank != 0) && !p->replica;
}

/* This rank's parameters and (with o) moments, block by block, to fn:
 * the writer's tensors, or a snapshot's copies. Collective on a grid (the
 * moments' gather). */
static mc_status save_params(const mc_grid *g, mc_backend *be, mc_model *m, mc_optim *o,
                             block_fn fn, void *ctx, mc_error *err)
{
    mc_status st = MC_OK;
    /* a MoE layer's experts differ between EP ranks: each EP rank's
     * expert-data-parallel rank 0 writes its experts' rows */
    int dense_writer = g->dp_rank == 0 && g->cp_rank == 0;
    int expert_writer = g->dp_rank / g->ep == 0 && g->cp_rank == 0;
    size_t maxn = max_param_numel(m), np = mc_model_num_params(m);
    float *host = malloc(maxn * sizeof *host);
    /* Backend scratch for the moments of one parameter (full, this
     * tensor-parallel rank's slice), gathered from the data-parallel
     * shards under the distributed optimizer. */
    float *mom = o ? mc_balloc(be, 2 * maxn * sizeof *mom, err) : NULL;
    if (!host || (o && !mom)) st = mc_error_set(err, MC_ERR_NOMEM, "checkpoint: out of memory");
    if (!st && o) st = mc_optim_wait_params(o, err);

    char path[512];
    for (size_t i = 0; i < np && !st; i++) {
        const mc_param *p = mc_model_param(m, i);
        if (!writes_param(g, p)) continue;
        int writer = p->expert ? expert_writer : dense_writer;
        if (writer) {
            mc_bcopy_to_host(be, host, mc_model_params(m) + p->offset, p->numel * sizeof(float));
            snprintf(path, sizeof path, "%s/%s", GROUPS[0], p->name);
            st = for_blocks(p, path, host, fn, ctx, err);
        }
        if (st || !o) continue;
        st = mc_optim_gather_moments(o, p->offset, p->numel, writer ? mom : NULL,
                                     writer ? mom + maxn : NULL, err);
        for (int k = 1; k <= 2 && !st && writer; k++) {
            mc_bcopy_to_host(be, host, mom + (size_t)(k - 1) * maxn, p->numel * sizeof(float));
            snprintf(path, sizeof path, "%s/%s", GROUPS[k], p->name);
            st = for_blocks(p, path, host, fn, ctx, err);
        }
    }
    free(host);
    if (mom) mc_bfree(be, mom);
    return st;
}

/* The FP8 delayed-scaling state (mc-formats(5), /fp8): per global layer
 * one row of each tensor, MC_MODEL_FP8_OPS operands (x history length
 * for the histories). */
static const char *const FP8_SETS[3] = {"fp8/scale", "fp8/amax", "fp8/amax_history"};

/* The stage's FP8 state, the same on its every rank once the amaxes
 * recorded since the last step are synchronized (collective over the
 * stage's TP, CP and DP groups: every rank calls it): their rank 0
 * writes the stage's layers, a row each. */
static mc_status save_fp8(const mc_grid *g, mc_model *m, mc_ckpt_writer *w, mc_error *err)
{
    int len = mc_model_fp8_history_len(m);
    if (!len) return MC_OK;
    mc_status st = mc_model_fp8_sync(m, err);
    if (st || g->tp_rank != 0 || g->cp_rank != 0 || g->dp_rank != 0) return st;
    const int64_t K = MC_MODEL_FP8_OPS, L = mc_model_get_config(m)->num_layers;
    const int64_t cols[3] = {K, K, K * len};
    float *buf = malloc((size_t)(2 * K + K * len) * sizeof *buf);
    if (!buf) return mc_error_set(err, MC_ERR_NOMEM, "checkpoint: out of memory");
    float *part[3] = {buf, buf + K, buf + 2 * K};
    for (int64_t l = 0; l < L && !st; l++) {
        if (!mc_model_fp8_get(m, (int)l, part[0], part[1], part[2])) continue;
        for (int k = 0; k < 3 && !st; k++)
            st = mc_ckpt_write_tensor(w, FP8_SETS[k], L, cols[k], l, 0, 1, cols[k], part[k],
                                      MC_CKPT_FLOAT32, err);
    }
    free(buf);
    return st;
}

/* Everything after the tensors: the counters, the configuration, the
 * tokenizer and the loss scaler. */
static mc_status write_tail(mc_ckpt_writer *w, const mc_train_state *s, int has_optim,
                            const char *config_json, const mc_tokenizer_spec *tok, mc_error *err)
{
    mc_status st = mc_ckpt_write_int(w, "consumed_samples", s->consumed_samples, err);
    if (!st) st = mc_ckpt_write_int(w, "scheduler_samples", s->sched_samples, err);
    if (!st) st = mc_ckpt_write_int(w, "optimizer_steps", s->optim_steps, err);
    if (!st) st = mc_ckpt_write_int(w, "has_optimizer", has_optim, err);
    if (!st && config_json) st = mc_ckpt_write_json(w, "config", config_json, err);
    if (!st && tok) st = mc_ckpt_write_tokenizer(w, tok, err);
    if (!st) {
        json_t *ts = json_pack("{s:f, s:b, s:f, s:i, s:i, s:i, s:i}", "loss_scale", s->scaler.scale,
                               "dynamic", s->scaler.dynamic, "min_loss_scale", s->scaler.min_scale,
                               "window", s->scaler.window, "hysteresis", s->scaler.hysteresis,
                               "growth_tracker", s->scaler.growth_tracker, "hysteresis_tracker",
                               s->scaler.hysteresis_tracker);
        char *text = ts ? json_dumps(ts, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
        st = text ? mc_ckpt_write_json(w, "train_state", text, err)
                  : mc_error_set(err, MC_ERR_NOMEM, "checkpoint: out of memory");
        free(text);
        json_decref(ts);
    }
    return st;
}

/* The tail, then the commit (or the abort, which on a grid fails every
 * rank's save with this error). */
static mc_status finish(mc_ckpt_writer *w, mc_status st, const mc_train_state *s, int has_optim,
                        const char *config_json, const mc_tokenizer_spec *tok, char *out_dir,
                        size_t cap, mc_error *err)
{
    if (!st) st = write_tail(w, s, has_optim, config_json, tok, err);
    if (st) {
        mc_ckpt_writer_abort(w);
        return st;
    }
    snprintf(out_dir, cap, "%s", mc_ckpt_writer_dir(w));
    return mc_ckpt_writer_commit(w, err);
}

mc_status mc_train_state_save(const char *dir, const mc_grid *g, mc_backend *be, mc_model *m,
                              mc_optim *o, const mc_train_state *s, const char *config_json,
                              const mc_tokenizer_spec *tok, int compression, char *out_dir,
                              size_t cap, mc_error *err)
{
    mc_grid one;
    if (!g) {
        mc_grid_single(&one);
        g = &one;
    }
    mc_ckpt_writer *w = NULL;
    mc_status st = mc_ckpt_writer_begin_grid(dir, s->iteration, g, &w, err);
    if (st) return st;
    if (compression)
        st = mc_ckpt_writer_set_compression(w, (mc_ckpt_compression)compression, 0, err);
    wctx c = {w};
    if (!st) st = save_params(g, be, m, o, write_block, &c, err);
    if (!st) st = save_fp8(g, m, w, err);
    return finish(w, st, s, o != NULL, config_json, tok, out_dir, cap, err);
}

mc_status mc_train_state_stage(const char *dir, const mc_grid *g, const mc_grid *wg, mc_backend *be,
                               mc_model *m, mc_optim *o, const mc_train_state *s,
                               const char *config_json, const mc_tokenizer_spec *tok,
                               int compression, mc_ckpt_writer **out, mc_error *err)
{
    *out = NULL;
    mc_ckpt_writer *w = NULL;
    mc_status st = mc_ckpt_writer_begin_grid(dir, s->iteration, wg, &w, err);
    if (st) return st;
    if (compression)
        st = mc_ckpt_writer_set_compression(w, (mc_ckpt_compression)compression, 0, err);
    wctx c = {w};
    if (!st) st = save_params(g, be, m, o, write_block, &c, err);
    if (!st) st = save_fp8(g, m, w, err);
    if (!st) st = write_tail(w, s, o != NULL, config_json, tok, err);
    if (st) {
        mc_ckpt_writer_abort(w); /* the others' commits get this error */
        return st;
    }
    *out = w;
    return MC_OK;
}

/* ------------------------------------------------------------ snapshots */

/* A snapshot is made once per run (its block table and one arena of host
 * memory, touched when it is made so that no save pays the page faults of
 * fresh memory) and refilled at every save: one copy of each parameter and
 * moment from backend memory into the arena, nothing allocated. */
typedef struct snap_block {
    char *path;
    int64_t rows, cols, row0, col0, nrows, lcols;
    size_t off; /* in floats, into the arena */
} snap_block;

struct mc_train_snapshot {
    snap_block *b;
    size_t n, cap;
    float *arena;
    size_t arena_n; /* floats */
    int has_optim, compression;
    mc_train_state s;
    char *config_json;
    const mc_tokenizer_spec *tok;
    /* the capture, per parameter and group: where its first block starts */
    size_t *first; /* [3 * num_params], SIZE_MAX for a parameter not written */
    /* the FP8 state (fp8_len 0: none): FP8_SETS' whole tensors, each
     * [fp8_layers, MC_MODEL_FP8_OPS (x fp8_len)], one after the other */
    float *fp8;
    int fp8_len, fp8_layers;
};

/* Recording the layout: host is an offset into the arena (cast), not data. */
static mc_status layout_block(void *ctx, const mc_param *p, const char *path, int64_t row0,
                              int64_t nrows, int64_t col0, int64_t ncols, float *host,
                              mc_error *err)
{
    mc_train_snapshot *sn = ctx;
    if (sn->n == sn->cap) {
        size_t cap = sn->cap ? 2 * sn->cap : 64;
        snap_block *b = realloc(sn->b, cap * sizeof *b);
        if (!b) return mc_error_set(err, MC_ERR_NOMEM, "checkpoint snapshot: out of memory");
        sn->b = b;
        sn->cap = cap;
    }
    snap_block *b = &sn->b[sn->n];
    if (!(b->path = strdup(path)))
        return mc_error_set(err, MC_ERR_NOMEM, "checkpoint snapshot: out of memory");
    b->lcols = ncols;
    b->rows = p->rows;
    b->cols = ckpt_cols(p);
    b->row0 = row0;
    b->col0 = col0;
    b->nrows = nrows;
    b->off = (size_t)((uintptr_t)host / sizeof(float));
    sn->n++;
    return MC_OK;
}

void mc_train_snapshot_free(mc_train_snapshot *sn)
{
    if (!sn) return;
    for (size_t i = 0; i < sn->n; i++) free(sn->b[i].path);
    free(sn->b);
    free(sn->arena);
    free(sn->first);
    free(sn->fp8);
    free(sn->config_json);
    free(sn);
}

/* The table and the arena (one process: every parameter is written, each
 * as its blocks of for_blocks, contiguous in the arena). */
static mc_status snapshot_new(mc_model *m, int has_optim, mc_train_snapshot **out, mc_error *err)
{
    mc_train_snapshot *sn = calloc(1, sizeof *sn);
    size_t np = mc_model_num_params(m);
    if (sn) sn->first = malloc(3 * (np ? np : 1) * sizeof *sn->first);
    if (!sn || !sn->first) {
        free(sn);
        return mc_error_set(err, MC_ERR_NOMEM, "checkpoint snapshot: out of memory");
    }
    sn->has_optim = has_optim;
    mc_status st = MC_OK;
    char path[512];
    size_t at = 0;
    /* the order save_params writes in: a parameter, then its moments */
    for (size_t i = 0; i < np && !st; i++) {
        const mc_param *p = mc_model_param(m, i);
        for (int k = 0; k < 3; k++) {
            sn->first[3 * i + k] = SIZE_MAX;
            if (k > 0 && !has_optim) continue;
            sn->first[3 * i + k] = at;
            snprintf(path, sizeof path, "%s/%s", GROUPS[k], p->name);
            if ((st = for_blocks(p, path, (float *)(uintptr_t)(at * sizeof(float)), layout_block,
                                 sn, err)))
                break;
            at += p->numel;
        }
    }
    sn->arena_n = at;
    if (!st && !(sn->arena = malloc((at ? at : 1) * sizeof(float))))
        st = mc_error_set(err, MC_ERR_NOMEM, "checkpoint snapshot: out of memory (%zu bytes)",
                          at * sizeof(float));
    sn->fp8_len = mc_model_fp8_history_len(m);
    sn->fp8_layers = mc_model_get_config(m)->num_layers;
    size_t nfp8 = (size_t)sn->fp8_layers * MC_MODEL_FP8_OPS * (size_t)(2 + sn->fp8_len);
    if (!st && sn->fp8_len && !(sn->fp8 = calloc(nfp8, sizeof(float))))
        st = mc_error_set(err, MC_ERR_NOMEM, "checkpoint snapshot: out of memory");
    if (st) {
        mc_train_snapshot_free(sn);
        return st;
    }
    memset(sn->arena, 0, at * sizeof(float)); /* the page faults now, not at a save */
    *out = sn;
    return MC_OK;
}

mc_status mc_train_state_snapshot(mc_backend *be, mc_model *m, mc_optim *o, const mc_train_state *s,
                                  const char *config_json, const mc_tokenizer_spec *tok,
                                  int compression, mc_train_snapshot **inout, mc_error *err)
{
    mc_status st = MC_OK;
    if (!*inout && (st = snapshot_new(m, o != NULL, inout, err))) return st;
    mc_train_snapshot *sn = *inout;
    if (sn->has_optim != (o != NULL))
        return mc_error_set(err, MC_ERR_INTERNAL, "checkpoint snapshot: made %s the moments",
                            sn->has_optim ? "with" : "without");
    sn->s = *s;
    sn->compression = compression;
    sn->tok = tok;
    if (!sn->config_json != !config_json || (config_json && strcmp(sn->config_json, config_json))) {
        free(sn->config_json);
        sn->config_json = NULL;
        if (config_json && !(sn->config_json = strdup(config_json)))
            return mc_error_set(err, MC_ERR_NOMEM, "checkpoint snapshot: out of memory");
    }
    if (o && (st = mc_optim_wait_params(o, err))) return st;
    if (sn->fp8_len) { /* the FP8 state (host); one process: every layer is here */
        size_t K = MC_MODEL_FP8_OPS, L = (size_t)sn->fp8_layers;
        for (size_t l = 0; l < L; l++)
            mc_model_fp8_get(m, (int)l, sn->fp8 + l * K, sn->fp8 + (L + l) * K,
                             sn->fp8 + 2 * L * K + l * K * (size_t)sn->fp8_len);
    }
    /* Backend memory to the arena, one copy each; the moments of a
     * distributed optimizer (not on one process) through its gather. */
    const float *params = mc_model_params(m);
    const float *mv[2] = {o ? mc_optim_exp_avg(o) : NULL, o ? mc_optim_exp_avg_sq(o) : NULL};
    size_t np = mc_model_num_params(m);
    for (size_t i = 0; i < np && !st; i++) {
        const mc_param *p = mc_model_param(m, i);
        size_t bytes = p->numel * sizeof(float);
        mc_bcopy_to_host(be, sn->arena + sn->first[3 * i], params + p->offset, bytes);
        if (!o) continue;
        if (mv[0] && mv[1]) {
            for (int k = 1; k <= 2; k++)
                mc_bcopy_to_host(be, sn->arena + sn->first[3 * i + k], mv[k - 1] + p->offset,
                                 bytes);
            continue;
        }
        float *mom = mc_balloc(be, 2 * bytes, err);
        if (!mom) return err && err->code ? err->code : MC_ERR_NOMEM;
        st = mc_optim_gather_moments(o, p->offset, p->numel, mom, mom + p->numel, err);
        for (int k = 1; k <= 2 && !st; k++)
            mc_bcopy_to_host(be, sn->arena + sn->first[3 * i + k], mom + (size_t)(k - 1) * p->numel,
                             bytes);
        mc_bfree(be, mom);
    }
    return st;
}

mc_status mc_train_snapshot_write(const mc_train_snapshot *sn, const char *dir, char *out_dir,
                                  size_t cap, mc_error *err)
{
    mc_ckpt_writer *w = NULL;
    mc_status st = mc_ckpt_writer_begin(dir, sn->s.iteration, &w, err);
    if (st) return st;
    if (sn->compression)
        st = mc_ckpt_writer_set_compression(w, (mc_ckpt_compression)sn->compression, 0, err);
    for (size_t i = 0; i < sn->n && !st; i++) {
        const snap_block *b = &sn->b[i];
        st = mc_ckpt_write_tensor(w, b->path, b->rows, b->cols, b->row0, b->col0, b->nrows,
                                  b->lcols, sn->arena + b->off, MC_CKPT_FLOAT32, err);
    }
    const int64_t K = MC_MODEL_FP8_OPS, L = sn->fp8_layers;
    for (int k = 0; k < 3 && sn->fp8_len && !st; k++) {
        int64_t cols = k < 2 ? K : K * sn->fp8_len;
        st = mc_ckpt_write_tensor(w, FP8_SETS[k], L, cols, 0, 0, L, cols, sn->fp8 + k * L * K,
                                  MC_CKPT_FLOAT32, err);
    }
    return finish(w, st, &sn->s, sn->has_optim, sn->config_json, sn->tok, out_dir, cap, err);
}

/* The expert count before anything else (the shapes follow from it): a
 * usage error naming the flag. */
static mc_status check_experts(mc_ckpt_reader *r, const mc_model_config *mine, mc_error *err)
{
    json_t *cfg = NULL;
    if (mc_ckpt_read_json(r, "config", &cfg, err))
        return mc_error_prefix(err, "%s", mc_ckpt_file(r));
    json_t *moe = json_object_get(json_object_get(cfg, "model"), "moe");
    json_int_t theirs = json_integer_value(json_object_get(moe, "num_experts"));
    json_decref(cfg);
    if (theirs == (json_int_t)(mine->num_experts > 0 ? mine->num_experts : 0)) return MC_OK;
    return mc_error_set(err, MC_ERR_USAGE,
                        "%s: the checkpoint has %lld experts, the flags say %d (--num-experts)",
                        mc_ckpt_file(r), (long long)theirs, mine->num_experts);
}

/* Compare the checkpoint's model configuration with this run's: every
 * field must match except the vocabulary before padding (the padded size,
 * which fixes the shapes, must). */
static mc_status check_config(mc_ckpt_reader *r, const mc_model_config *mine, mc_error *err)
{
    json_t *cfg = NULL;
    if (mc_ckpt_read_json(r, "config", &cfg, err))
        return mc_error_prefix(err, "%s", mc_ckpt_file(r));
    json_t *theirs = json_object_get(cfg, "model");
    json_t *ours = mc_model_config_json(mine);
    mc_status st = MC_OK;
    const char *key;
    json_t *v;
    json_object_foreach(ours, key, v)
    {
        /* The sequence length is a run's choice (positions are bounded
         * by max_position_embeddings, which must match). */
        if (!strcmp(key, "vocab_size") || !strcmp(key, "seq_length")) continue;
        json_t *t = theirs ? json_object_get(theirs, key) : NULL;
        if (t && json_equal(t, v)) continue;
        /* Floats went through float -> double: compare as floats. */
        if (t && json_is_number(t) && json_is_number(v) &&
            (float)json_number_value(t) == (float)json_number_value(v))
            continue;
        char *a = t ? json_dumps(t, JSON_ENCODE_ANY) : NULL, *b = json_dumps(v, JSON_ENCODE_ANY);
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: model configuration differs: %s is %s in the checkpoint, %s here",
                          mc_ckpt_file(r), key, a ? a : "missing", b ? b : "?");
        free(a);
        free(b);
        break;
    }
    json_decref(ours);
    json_decref(cfg);
    return st;
}

/* The FP8 state's shapes, before anything is overwritten: none of its
 * tensors (*len 0: a checkpoint of a run without FP8, or of an mc before
 * it was saved), or all three, [L, 12] and [L, 12 x N] (*len N). */
static mc_status check_fp8(mc_ckpt_reader *r, int64_t L, int64_t *len, mc_error *err)
{
    *len = 0;
    int have = 0;
    for (int k = 0; k < 3; k++) have += mc_ckpt_has_tensor(r, FP8_SETS[k]);
    if (!have) return MC_OK;
    const int64_t K = MC_MODEL_FP8_OPS;
    for (int k = 0; k < 3; k++) {
        int64_t rows, cols;
        mc_status st = mc_ckpt_tensor_info(r, FP8_SETS[k], &rows, &cols, NULL, err);
        if (st) return st;
        if (rows == L && (k < 2 ? cols == K : cols >= K && cols % K == 0)) {
            if (k == 2) *len = cols / K;
            continue;
        }
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: tensor %s has shape [%" PRId64 ", %" PRId64
                            "] in the checkpoint, the model needs [%" PRId64 ", %s]",
                            mc_ckpt_file(r), FP8_SETS[k], rows, cols, L,
                            k < 2 ? "12" : "12 x history length");
    }
    return MC_OK;
}

/* The FP8 state into the model: each rank its stage's layers (the
 * tensors are small: read whole). */
static mc_status load_fp8(mc_ckpt_reader *r, mc_model *m, int64_t L, int64_t len, mc_error *err)
{
    const int64_t K = MC_MODEL_FP8_OPS, cols[3] = {K, K, K * len};
    float *buf = malloc((size_t)(L * K * (2 + len)) * sizeof *buf);
    if (!buf) return mc_error_set(err, MC_ERR_NOMEM, "checkpoint: out of memory");
    float *part[3] = {buf, buf + L * K, buf + 2 * L * K};
    mc_status st = MC_OK;
    for (int k = 0; k < 3 && !st; k++)
        st = mc_ckpt_read_tensor(r, FP8_SETS[k], L, cols[k], 0, 0, L, cols[k], part[k], err);
    for (int64_t l = 0; l < L && !st; l++)
        mc_model_fp8_set(m, (int)l, part[0] + l * K, part[1] + l * K, part[2] + l * K * len,
                         (int)len);
    free(buf);
    return st;
}

static mc_status load(const char *path, const mc_grid *g, mc_backend *be, mc_model *m, mc_optim *o,
                      mc_train_state *s, char *dir_out, size_t cap, mc_error *err)
{
    mc_ckpt_reader *r = NULL;
    mc_status st = mc_ckpt_open(path, &r, err);
    if (st) return st;
    /* a checkpoint pre-split for this grid: each rank opens only its file */
    if (g) mc_ckpt_prefer_shard(r, g->tp_rank, g->pp_rank);
    snprintf(dir_out, cap, "%s", mc_ckpt_dir(r));
    size_t maxn = max_param_numel(m), np = mc_model_num_params(m);
    float *host = malloc(maxn * sizeof *host);
    float *mom = o ? mc_balloc(be, 2 * maxn * sizeof *mom, err) : NULL;
    if (!host || (o && !mom)) st = mc_error_set(err, MC_ERR_NOMEM, "checkpoint: out of memory");

    /* Shapes first, every tensor, before anything is overwritten: the
     * error names the tensor and both shapes. */
    char p_path[512];
    if (!st) st = check_experts(r, mc_model_get_config(m), err);
    for (size_t i = 0; i < np && !st; i++) {
        const mc_param *p = mc_model_param(m, i);
        int64_t rows, cols;
        snprintf(p_path, sizeof p_path, "model/%s", p->name);
        st = mc_ckpt_tensor_info(r, p_path, &rows, &cols, NULL, err); /* names the file */
        if (st) break;
        if (rows != p->rows || cols != ckpt_cols(p)) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: tensor %s has shape [%" PRId64 ", %" PRId64
                              "] in the checkpoint, the model needs [%" PRId64 ", %" PRId64 "]",
                              mc_ckpt_file(r), p_path, rows, cols, p->rows, ckpt_cols(p));
        }
    }
    if (!st) st = check_config(r, mc_model_get_config(m), err);
    /* FP8 state: a resume's (s), when this run uses FP8 */
    const int64_t L = mc_model_get_config(m)->num_layers;
    int64_t fp8_len = 0;
    int fp8 = s && mc_model_fp8_history_len(m) > 0;
    if (!st && fp8) st = check_fp8(r, L, &fp8_len, err);

    int64_t has_optim = 0;
    if (!st && o) {
        if (mc_ckpt_read_int(r, "has_optimizer", &has_optim, err)) has_optim = 0;
        if (!has_optim)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: the checkpoint holds no optimizer state (saved with "
                              "--no-save-optim); resume with --no-load-optim or --finetune",
                              mc_ckpt_file(r));
    }
    /* Every rank reads its own blocks, whatever grid wrote the file; the
     * moments go to the optimizer whole (this rank's slice of the global
     * tensor), which keeps its data-parallel shard of them. */
    if (!st && o) st = mc_optim_wait_params(o, err);
    for (size_t i = 0; i < np && !st; i++) {
        const mc_param *p = mc_model_param(m, i);
        for (int k = 0; k < (o ? 3 : 1) && !st; k++) {
            snprintf(p_path, sizeof p_path, "%s/%s", GROUPS[k], p->name);
            st = for_blocks(p, p_path, host, read_block, r, err);
            if (!st)
                mc_bcopy_from_host(
                    be, k ? mom + (size_t)(k - 1) * maxn : mc_model_params(m) + p->offset, host,
                    p->numel * sizeof(float));
        }
        if (!st && o) st = mc_optim_set_moments(o, p->offset, p->numel, mom, mom + maxn, err);
    }
    free(host);
    if (mom) mc_bfree(be, mom);
    if (!st && fp8 && fp8_len) st = load_fp8(r, m, L, fp8_len, err);

    if (!st && s) {
        s->fp8_missing = fp8 && !fp8_len;
        s->iteration = mc_ckpt_iteration(r);
        st = mc_ckpt_read_int(r, "consumed_samples", &s->consumed_samples, err);
        if (!st) st = mc_ckpt_read_int(r, "scheduler_samples", &s->sched_samples, err);
        if (!st && o) st = mc_ckpt_read_int(r, "optimizer_steps", &s->optim_steps, err);
        json_t *ts = NULL;
        if (!st && o) st = mc_ckpt_read_json(r, "train_state", &ts, err);
        if (!st && o) {
            double scale = json_number_value(json_object_get(ts, "loss_scale"));
            json_t *gt = json_object_get(ts, "growth_tracker");
            json_t *ht = json_object_get(ts, "hysteresis_tracker");
            if (!(scale > 0) || !json_is_integer(gt) || !json_is_integer(ht))
                st = mc_error_set(err, MC_ERR_FORMAT,
                                  "%s: attribute train_state lacks loss_scale, growth_tracker "
                                  "or hysteresis_tracker",
                                  mc_ckpt_file(r));
            else if (s->scaler.dynamic) {
                /* The scale and its trackers resume; the window, hysteresis
                 * and minimum are this run's options. */
                s->scaler.scale = scale;
                s->scaler.growth_tracker = (int)json_integer_value(gt);
                s->scaler.hysteresis_tracker = (int)json_integer_value(ht);
            }
        }
        json_decref(ts);
        if (st) mc_error_prefix(err, "%s", mc_ckpt_file(r));
    }
    mc_ckpt_close(r);
    /* Past the open, something missing is a malformed checkpoint, not the
     * absence of one (which the caller may take as "start from scratch"). */
    if (st == MC_ERR_NOTFOUND) st = err->code = MC_ERR_FORMAT;
    return st;
}

mc_status mc_train_state_load(const char *path, const mc_grid *g, mc_backend *be, mc_model *m,
                              mc_optim *o, mc_train_state *s, char *dir_out, size_t cap,
                              mc_error *err)
{
    /* A rank's failure (or a checkpoint one rank cannot see) is every
     * rank's: they start from the same state or stop together. */
    mc_status st = load(path, g, be, m, o, s, dir_out, cap, err);
    return mc_grid_status_all(g, st, "checkpoint status", err);
}

/* A model for inference (mc-eval, mc-serve, a DPO reference, a KD
 * teacher) that cannot fit: its parameters and activations on this rank
 * (mc_plan_check_fit), before mc_model_new allocates them, so a checkpoint
 * larger than the machine fails in one line instead of in the allocator or
 * the OOM killer. A configuration the plan does not take is left to
 * mc_model_new. */
static mc_status check_fits(const char *path, const mc_model_config *c, const mc_grid *g,
                            mc_backend *be, int micro_batch, mc_error *err)
{
    mc_plan plan;
    mc_error perr;
    if (mc_plan_compute_grid(c, g->world, g->tp, g->pp, g->cp, g->ep, micro_batch, 0, 0, &plan,
                             &perr))
        return MC_OK;
    mc_status st = mc_plan_check_fit(&plan, g->pp_rank, 0, be, err);
    mc_plan_free(&plan);
    if (st) mc_error_prefix(err, "%s", path);
    return st;
}

mc_status mc_train_load_model(const char *path, const mc_grid *g, mc_backend *be, int micro_batch,
                              int seq_length, mc_prec prec, mc_model **out, mc_error *err)
{
    *out = NULL;
    mc_grid one;
    if (!g) {
        mc_grid_single(&one);
        g = &one;
    }
    mc_ckpt_reader *r = NULL;
    mc_model_config c;
    mc_status st = mc_ckpt_open(path, &r, err);
    if (!st) st = mc_ckpt_read_model_config(r, &c, err);
    mc_ckpt_close(r);
    if (!st && seq_length > 0) c.seq_length = seq_length;
    if (!st && c.position_embedding_type == MC_POS_LEARNED &&
        c.seq_length > c.max_position_embeddings)
        st = mc_error_set(err, MC_ERR_USAGE,
                          "%s: sequence length %d exceeds the model's %d learned positions", path,
                          c.seq_length, c.max_position_embeddings);
    if (!st) st = mc_model_config_finish(&c, g->tp, err);
    if (!st) st = check_fits(path, &c, g, be, micro_batch, err);
    mc_model *m = NULL;
    if (!st) st = mc_model_new(&c, g, be, micro_batch, prec, &m, err);
    char dir[4096];
    if (!st)
        st = mc_train_state_load(path, g, be, m, NULL, NULL, dir, sizeof dir, err);
    else
        st = mc_grid_status_all(g, st, "checkpoint status", err);
    if (st) {
        mc_model_free(m);
        return st;
    }
    *out = m;
    return MC_OK;
}
