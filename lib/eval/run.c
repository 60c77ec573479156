/*
 * run.c - an evaluation run (eval.h): what mc-eval does, for any front end.
 * mc_eval_open reads what the checkpoint holds (configuration, tokenizer,
 * the dtype of its first linear weight) and the prompts, then builds the
 * model and one inference context on the grid; mc_eval_perplexity,
 * mc_eval_task and mc_eval_generate run the measures of ppl.c, tasks.c and
 * generate.c on it, return their results and add them to one JSON
 * document. Printing is the caller's: the results and the callbacks give
 * it everything it reports.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc/json.h"
#include "mc/ckpt.h"
#include "mc/eval.h"
#include "mc/file.h"
#include "mc/kern.h"
#include "mc/train.h"

struct mc_eval {
    const mc_eval_config *c;
    const mc_grid *g;
    mc_grid one; /* g when the caller gave none */
    mc_backend *be;
    mc_model *model;
    mc_infer *inf;
    mc_tokenizer *tok;
    mc_model_config cfg;         /* as the checkpoint stores it */
    const mc_model_config *mcfg; /* the model's (the padded vocabulary) */
    char ckpt_dir[4096];
    mc_eval_info info;
    int32_t bos;
    int32_t eod;       /* the end-of-document id of packed documents */
    mc_buf prompts;    /* const char *: the prompt file's lines, then c->prompts */
    char *prompt_text; /* the prompt file, which the lines point into */
    json_t *doc;
};

void mc_eval_config_init(mc_eval_config *c)
{
    memset(c, 0, sizeof *c);
    c->weights = -1;
    c->eval_split = -1;
    c->bos_id = -1;
    c->seed = 1234;
    mc_gen_config_init(&c->gen);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* ------------------------------------------------------------ opening */

/* Prompts of a prompt file: one a line, empty lines skipped, pushed to
 * lines; they point into *buf (the caller frees it). */
static mc_status read_prompt_file(const char *path, char **buf, mc_buf *lines, mc_error *err)
{
    size_t len = 0;
    if (!strcmp(path, "-")) {
        mc_buf b = MC_BUF_INIT;
        char chunk[65536];
        size_t k;
        while ((k = fread(chunk, 1, sizeof chunk, stdin)) > 0)
            if (mc_buf_append(&b, chunk, k, err)) return err->code;
        if (ferror(stdin)) {
            mc_buf_free(&b);
            return mc_error_errno(err, MC_ERR_IO, errno, "stdin");
        }
        if (mc_buf_append(&b, "", 1, err)) return err->code;
        *buf = b.data;
        len = b.len - 1;
    } else {
        mc_status st = mc_read_file(path, buf, &len, err);
        if (st) return st;
    }
    char *p = *buf, *end = p + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        if (e > p && e[-1] == '\r') e[-1] = '\0';
        *e = '\0';
        if (*p) {
            mc_status st = mc_buf_push_str(lines, p, err);
            if (st) return st;
        }
        p = e + 1;
    }
    return MC_OK;
}

/* What the checkpoint holds, the BOS and the prompts: local work, every
 * rank alike. */
static mc_status read_inputs(mc_eval *ev, int *int8, mc_error *err)
{
    const mc_eval_config *c = ev->c;
    mc_ckpt_reader *rd = NULL;
    mc_status st = mc_ckpt_open(c->ckpt, &rd, err);
    if (!st) st = mc_ckpt_read_model_config(rd, &ev->cfg, err);
    if (!st) st = mc_model_check_ep(&ev->cfg, ev->g->ep, mc_ckpt_file(rd), err);
    int need_text = c->text_file || c->ntasks || c->nprompts || c->prompt_file;
    if (!st && (need_text || c->add_bos)) {
        if (!mc_ckpt_has_tokenizer(rd) && need_text)
            st = mc_error_set(err, MC_ERR_NOTFOUND,
                              "%s: the checkpoint stores no tokenizer, and %s needs one to turn "
                              "text into tokens",
                              mc_ckpt_file(rd),
                              c->text_file ? "--text-file"
                              : c->ntasks  ? "--task"
                                           : "generation");
        else if (mc_ckpt_has_tokenizer(rd))
            st = mc_ckpt_read_tokenizer(rd, &ev->tok, err);
    }
    *int8 = c->weights;
    if (!st && *int8 < 0) {
        /* int8 when the checkpoint's first linear weight is stored so */
        char qkv[128];
        mc_ckpt_dtype dt = MC_CKPT_FLOAT32;
        snprintf(qkv, sizeof qkv, "model/decoder.layers.0.self_attention.linear_qkv.weight");
        *int8 = mc_ckpt_has_tensor(rd, qkv) &&
                !mc_ckpt_tensor_info(rd, qkv, NULL, NULL, &dt, NULL) && dt == MC_CKPT_INT8;
    }
    ev->info.iteration = rd ? mc_ckpt_iteration(rd) : -1;
    if (rd) snprintf(ev->ckpt_dir, sizeof ev->ckpt_dir, "%s", mc_ckpt_dir(rd));
    mc_ckpt_close(rd);
    if (!st && c->add_bos) {
        ev->bos = c->bos_id >= 0 ? (int32_t)c->bos_id : ev->tok ? mc_tokenizer_eod(ev->tok) : -1;
        if (ev->bos < 0)
            st = mc_error_set(err, MC_ERR_USAGE,
                              "--add-bos: the checkpoint's tokenizer has no end-of-document "
                              "token; give --bos-id");
    }
    if (!st && c->prompt_file)
        st = read_prompt_file(c->prompt_file, &ev->prompt_text, &ev->prompts, err);
    for (size_t i = 0; !st && i < c->nprompts; i++)
        st = mc_buf_push_str(&ev->prompts, c->prompts[i], err);
    if (!st && (c->nprompts || c->prompt_file) && mc_buf_nstrs(&ev->prompts) == 0)
        st = mc_error_set(err, MC_ERR_USAGE, "%s: no prompt in it", c->prompt_file);
    return st;
}

/* The document's head: the checkpoint, the model and how it runs. */
static json_t *head_json(const mc_eval *ev)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "checkpoint", json_string(ev->ckpt_dir));
    json_object_set_new(doc, "iteration", json_integer(ev->info.iteration));
    json_t *mj = json_object();
    json_object_set_new(mj, "parameters", json_integer(ev->info.parameters));
    json_object_set_new(mj, "num_layers", json_integer(ev->cfg.num_layers));
    json_object_set_new(mj, "hidden_size", json_integer(ev->cfg.hidden_size));
    json_object_set_new(mj, "vocab_size", json_integer(ev->mcfg->vocab_size));
    json_object_set_new(mj, "padded_vocab_size", json_integer(ev->mcfg->padded_vocab_size));
    json_object_set_new(mj, "seq_length", json_integer(ev->cfg.seq_length));
    json_object_set_new(doc, "model", mj);
    json_object_set_new(doc, "ctx_size", json_integer(ev->info.ctx));
    json_object_set_new(doc, "tensor_model_parallel_size", json_integer(ev->g->tp));
    json_object_set_new(doc, "expert_model_parallel_size", json_integer(ev->g->ep));
    json_object_set_new(doc, "precision", json_string(ev->c->bf16 ? "bf16" : "fp32"));
    json_object_set_new(doc, "weights", json_string(ev->info.int8 ? "int8" : "fp32"));
    return doc;
}

mc_status mc_eval_open(const mc_eval_config *c, const mc_grid *g, mc_eval **out, mc_error *err)
{
    *out = NULL;
    mc_grid single;
    if (!g) {
        mc_grid_single(&single);
        g = &single;
    }
    mc_eval *ev = calloc(1, sizeof *ev);
    int int8 = 0;
    mc_status st = MC_OK;
    if (ev) {
        ev->c = c;
        ev->one = *g;
        ev->g = g == &single ? &ev->one : g;
        st = read_inputs(ev, &int8, err);
    } else {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    if ((st = mc_grid_status_all(g, st, "checkpoint status", err))) goto fail;

    /* the model and the inference context */
    if (!c->cuda) {
        st = mc_backend_cpu_new(c->threads, &ev->be, err);
    } else if (int8 > 0) {
        st = mc_error_set(err, MC_ERR_USAGE,
                          "--device cuda: this checkpoint's weights are int8, which run on the "
                          "CPU backend only; use --weights fp32 or --device cpu");
    } else if ((st = mc_backend_cuda_new(-1, &ev->be, err))) {
        mc_error_prefix(err, "--device cuda");
    }
    if ((st = mc_grid_status_all(g, st, "checkpoint status", err))) goto fail;
    /* The model's own activations are sized for the shortest sequence the
     * configuration allows (tp positions); inference has its own. */
    st = mc_train_load_model(c->ckpt, g, ev->be, 1, g->tp, c->bf16 ? MC_PREC_BF16 : MC_PREC_FP32,
                             &ev->model, err);
    if (st) goto fail;
    ev->mcfg = mc_model_get_config(ev->model);
    /* the tokenizer's end of document, else the vocabulary's last id (as
     * mc-train's) */
    ev->eod = ev->tok ? mc_tokenizer_eod(ev->tok) : -1;
    if (ev->eod < 0) ev->eod = (int32_t)(ev->mcfg->vocab_size - 1);
    if (c->bf16 && int8 <= 0) ev->info.note = mc_backend_bf16_note(ev->be);
    ev->info.blas_note = mc_backend_blas_note(ev->be);
    ev->info.ctx = c->ctx ? c->ctx : ev->cfg.seq_length;
    st = mc_infer_new(ev->model, ev->info.ctx, ev->info.ctx, &ev->inf, err);
    if (st) mc_error_prefix(err, "--ctx-size %d", ev->info.ctx);
    if (!st && int8 > 0) st = mc_infer_use_int8(ev->inf, err);
    if ((st = mc_grid_status_all(g, st, "checkpoint status", err))) goto fail;

    ev->info.checkpoint = ev->ckpt_dir;
    ev->info.parameters = mc_model_global_numel(ev->model);
    ev->info.int8 = int8 > 0;
    ev->info.nprompts = mc_buf_nstrs(&ev->prompts);
    ev->doc = head_json(ev);
    *out = ev;
    return MC_OK;

fail:
    mc_eval_free(ev);
    return st;
}

void mc_eval_free(mc_eval *ev)
{
    if (!ev) return;
    json_decref(ev->doc);
    mc_infer_free(ev->inf);
    mc_model_free(ev->model);
    mc_tokenizer_free(ev->tok);
    if (ev->be) mc_backend_free(ev->be);
    mc_buf_free(&ev->prompts);
    free(ev->prompt_text);
    free(ev);
}

const mc_eval_info *mc_eval_get_info(const mc_eval *ev) { return &ev->info; }

json_t *mc_eval_doc(mc_eval *ev) { return ev->doc; }

/* ------------------------------------------------------------ perplexity */

mc_status mc_eval_perplexity(mc_eval *ev, mc_ppl_progress cb, void *cb_ctx, mc_eval_ppl *res,
                             mc_error *err)
{
    const mc_eval_config *c = ev->c;
    mc_ppl_stats s;
    mc_ids ids = MC_IDS_INIT;
    mc_status st = MC_OK;
    int64_t ndocs = -1;
    int ctx = ev->info.ctx;
    const char *src = c->data_path ? c->data_path : c->text_file;
    double t0 = now_s();
    /* packed documents: for the perplexity's windows and samples only */
    mc_doc_resets docs = {ev->eod, c->reset_position_ids, c->reset_attention_mask};
    mc_model_set_doc_resets(ev->model, &docs);
    if (c->mode == MC_PPL_SAMPLES) {
        mc_gptdata_config dc;
        mc_gptdata_config_init(&dc);
        const char *one = c->data_path;
        st = mc_gptdata_parse_data_path(&one, 1, &dc.blend, err);
        if (st) return mc_error_prefix(err, "--data-path");
        if (c->split) dc.split = c->split;
        dc.seq_length = ctx;
        dc.seed = (uint32_t)c->seed;
        dc.cache_dir = c->data_cache;
        dc.eod = ev->eod;
        dc.eod_mask_loss = c->eod_mask_loss;
        st = mc_ppl_run_gptdata(ev->inf, &dc, (mc_split)c->eval_split, 0,
                                c->eval_samples ? c->eval_samples : -1, &s, cb, cb_ctx, err);
        mc_gptdata_blend_free(&dc.blend);
    } else {
        if (c->add_bos) st = mc_ids_push(&ids, ev->bos, err);
        if (!st && c->data_path) {
            st = mc_eval_dataset_ids(c->data_path, c->split, c->eval_split, &ids, &ndocs, err);
        } else if (!st) {
            char *text = NULL;
            size_t len = 0;
            mc_encoder *enc = NULL;
            st = mc_read_file(c->text_file, &text, &len, err);
            if (!st) st = mc_encoder_new(ev->tok, &enc, err);
            if (!st) st = mc_encode(enc, text, len, &ids, err);
            if (st) mc_error_prefix(err, "%s", c->text_file);
            mc_encoder_free(enc);
            free(text);
        }
        if (!st) {
            mc_ppl_config pc = {c->mode,
                                ctx,
                                c->stride,
                                c->chunks,
                                c->add_bos && c->mode == MC_PPL_LLAMA ? ev->bos : -1,
                                c->eod_mask_loss ? ev->eod : -1};
            st = mc_ppl_run(ev->inf, &pc, ids.v, ids.n, &s, cb, cb_ctx, err);
            if (st && st != MC_ERR_NOMEM) mc_error_prefix(err, "%s", src);
        }
    }
    mc_ids_free(&ids);
    mc_model_set_doc_resets(ev->model, NULL);
    if (st) return st;
    double secs = now_s() - t0;
    res->s = s;
    res->documents = ndocs;
    res->seconds = secs;
    json_t *o = json_object();
    json_object_set_new(o, "source", json_string(src));
    json_object_set_new(o, "kind", json_string(c->data_path ? "dataset" : "text"));
    if (c->data_path) {
        static const char *const SPL[] = {"train", "valid", "test"};
        json_object_set_new(o, "eval_split",
                            json_string(c->eval_split < 0 ? "all" : SPL[c->eval_split]));
        json_object_set_new(o, "split", json_string(c->split ? c->split : "969,30,1"));
        if (ndocs >= 0) json_object_set_new(o, "documents", json_integer(ndocs));
    }
    json_object_set_new(o, "mode", json_string(mc_ppl_mode_name(c->mode)));
    if (c->reset_position_ids || c->reset_attention_mask || c->eod_mask_loss) {
        json_t *pk = json_object();
        json_object_set_new(pk, "eod", json_integer(ev->eod));
        json_object_set_new(pk, "reset_position_ids", json_boolean(c->reset_position_ids));
        json_object_set_new(pk, "reset_attention_mask", json_boolean(c->reset_attention_mask));
        json_object_set_new(pk, "eod_mask_loss", json_boolean(c->eod_mask_loss));
        json_object_set_new(o, "packed_documents", pk);
    }
    json_object_set_new(o, "ctx_size", json_integer(ctx));
    if (c->mode == MC_PPL_SLIDING)
        json_object_set_new(o, "stride", json_integer(c->stride ? c->stride : ctx / 2));
    if (c->add_bos) json_object_set_new(o, "bos_id", json_integer(ev->bos));
    json_object_set_new(o, "tokens", json_integer(s.tokens));
    json_object_set_new(o, "windows", json_integer(s.windows));
    json_object_set_new(o, "scored_tokens", json_integer(s.count));
    json_object_set_new(o, "nll", jreal(s.count ? s.nll / (double)s.count : NAN));
    json_object_set_new(o, "ppl", jreal(mc_ppl_value(&s)));
    json_object_set_new(o, "ppl_stderr", jreal(mc_ppl_stderr(&s)));
    json_object_set_new(o, "seconds", json_real(secs));
    json_object_set_new(o, "tokens_per_second", jreal((double)s.tokens / secs));
    json_object_set_new(ev->doc, "perplexity", o);
    return MC_OK;
}

/* ------------------------------------------------------------ tasks */

typedef struct task_docs {
    mc_task_doc_fn cb; /* the caller's */
    void *cb_ctx;
    json_t *samples; /* log_samples: per-document scores */
} task_docs;

static void task_doc(void *ctx, int64_t doc, int64_t total, int nchoices, const double *lls,
                     const int *greedy, int gold, int pred, int pred_norm)
{
    task_docs *t = ctx;
    if (t->samples) {
        json_t *o = json_object(), *l = json_array(), *g = json_array();
        for (int i = 0; i < nchoices; i++) {
            json_array_append_new(l, json_real(lls[i]));
            json_array_append_new(g, json_boolean(greedy[i]));
        }
        json_object_set_new(o, "doc", json_integer(doc));
        json_object_set_new(o, "loglikelihoods", l);
        json_object_set_new(o, "greedy", g);
        json_object_set_new(o, "gold", json_integer(gold));
        json_object_set_new(o, "pred", json_integer(pred));
        json_object_set_new(o, "pred_norm", json_integer(pred_norm));
        json_array_append_new(t->samples, o);
    }
    if (t->cb) t->cb(t->cb_ctx, doc, total, nchoices, lls, greedy, gold, pred, pred_norm);
}

mc_status mc_eval_run_task(mc_eval *ev, size_t i, mc_task_doc_fn cb, void *cb_ctx,
                           mc_task_result *res, mc_error *err)
{
    const mc_eval_config *c = ev->c;
    const mc_eval_task *t = &c->tasks[i];
    json_t *all = json_object_get(ev->doc, "tasks");
    if (!all) {
        all = json_object();
        json_object_set_new(ev->doc, "tasks", all);
    }
    task_docs td = {cb, cb_ctx, c->log_samples ? json_array() : NULL};
    double t0 = now_s();
    mc_status st = mc_task_run(ev->inf, ev->tok, t->kind, t->file, c->limit, ev->info.ctx, res,
                               task_doc, &td, err);
    if (st) {
        json_decref(td.samples);
        return st;
    }
    double secs = now_s() - t0;
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(t->file));
    json_object_set_new(o, "docs", json_integer(res->docs));
    json_object_set_new(o, "requests", json_integer(res->requests));
    json_object_set_new(o, "acc", jreal(res->acc));
    json_object_set_new(o, "acc_stderr", jreal(res->acc_stderr));
    if (t->kind == MC_TASK_LAMBADA) {
        json_object_set_new(o, "perplexity", jreal(res->perplexity));
    } else {
        json_object_set_new(o, "acc_norm", jreal(res->acc_norm));
        json_object_set_new(o, "acc_norm_stderr", jreal(res->acc_norm_stderr));
    }
    json_object_set_new(o, "mean_loglikelihood", jreal(res->mean_ll));
    json_object_set_new(o, "seconds", json_real(secs));
    if (td.samples) json_object_set_new(o, "samples", td.samples);
    json_object_set_new(all, t->name, o);
    return MC_OK;
}

/* ------------------------------------------------------------ generation */

mc_status mc_eval_generate(mc_eval *ev, mc_eval_text_fn cb, void *cb_ctx, mc_eval_gen *res,
                           mc_error *err)
{
    const mc_eval_config *c = ev->c;
    const char **prompts = mc_buf_strs(&ev->prompts);
    size_t n = mc_buf_nstrs(&ev->prompts);
    mc_gen_config gc = c->gen;
    gc.seed = c->seed;
    gc.eod = mc_tokenizer_eod(ev->tok);
    gc.vocab_size = mc_tokenizer_vocab_size(ev->tok);
    if (gc.vocab_size > ev->mcfg->padded_vocab_size) gc.vocab_size = ev->mcfg->padded_vocab_size;
    mc_encoder *enc = NULL;
    mc_status st = mc_encoder_new(ev->tok, &enc, err);
    json_t *list = json_array();
    json_object_set_new(ev->doc, "generations", list);
    mc_ids ids = MC_IDS_INIT, out = MC_IDS_INIT;
    mc_buf text = MC_BUF_INIT;
    double t0 = now_s();
    int64_t generated = 0;
    for (size_t i = 0; i < n && !st; i++) {
        ids.n = out.n = text.len = 0;
        if (c->add_bos) st = mc_ids_push(&ids, ev->bos, err);
        if (!st) st = mc_encode(enc, prompts[i], strlen(prompts[i]), &ids, err);
        if (!st && ids.n == 0) {
            /* an empty prompt starts a document */
            if (gc.eod < 0)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "prompt %zu is empty and the tokenizer has no end-of-document "
                                  "token to start from",
                                  i + 1);
            else
                st = mc_ids_push(&ids, gc.eod, err);
        }
        mc_gen_stop stop = MC_GEN_STOP_LENGTH;
        if (!st) st = mc_generate(ev->inf, &gc, (uint64_t)i, ids.v, ids.n, &out, &stop, err);
        if (st) {
            mc_error_prefix(err, "prompt %zu", i + 1);
            break;
        }
        generated += (int64_t)out.n;
        /* the text without the end-of-document token */
        size_t keep = out.n && stop == MC_GEN_STOP_EOD ? out.n - 1 : out.n;
        if ((st = mc_decode(ev->tok, out.v, keep, &text, err))) break;
        json_t *o = json_object(), *toks = json_array();
        for (size_t k = 0; k < out.n; k++) json_array_append_new(toks, json_integer(out.v[k]));
        json_object_set_new(o, "prompt", mc_json_text(prompts[i], strlen(prompts[i])));
        json_object_set_new(o, "completion", mc_json_text(text.data, text.len));
        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)ids.n));
        json_object_set_new(o, "tokens", toks);
        json_object_set_new(o, "stop", json_string(mc_gen_stop_name(stop)));
        json_array_append_new(list, o);
        if (cb) st = cb(cb_ctx, prompts[i], text.data ? text.data : "", text.len, err);
    }
    res->prompts = n;
    res->tokens = generated;
    res->seconds = now_s() - t0;
    mc_ids_free(&ids);
    mc_ids_free(&out);
    mc_buf_free(&text);
    mc_encoder_free(enc);
    return st;
}
