/*
 * mc-eval - measure a checkpoint: perplexity on a dataset or a text file,
 * lm-evaluation-harness tasks from local JSONL files, and text generation.
 *
 * This file turns the options into calls of lib/eval (mc/eval.h) on one
 * inference context (mc_infer, model.h) over the model mc_train_load_model
 * builds from the checkpoint, on one process or a tensor-parallel grid
 * under mpirun/srun. Pipeline contract: the checkpoint path is the argument,
 * or one line on stdin (what mc-train and mc-reshard print). Human lines go
 * to stderr (rank 0); one JSON document with every metric goes to stdout,
 * or to -o FILE, whose path stdout then carries.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <utf8proc.h>

#include "mc/ckpt.h"
#include "mc/comm.h"
#include "mc/eval.h"
#include "mc/file.h"
#include "mc/kern.h"
#include "mc/log.h"
#include "mc/model.h"
#include "mc/opt.h"
#include "mc/tokenizer.h"
#include "mc/train.h"

static const char PROG[] = "mc-eval";

enum {
    OPT_CTX = 'c',
    OPT_OUTPUT = 'o',
    OPT_THREADS = 256, OPT_DEVICE, OPT_BF16, OPT_WEIGHTS, OPT_TP, OPT_PP, OPT_DIST_TIMEOUT,
    OPT_DATA_PATH, OPT_TEXT_FILE, OPT_SPLIT, OPT_EVAL_SPLIT, OPT_PPL_MODE, OPT_STRIDE, OPT_CHUNKS,
    OPT_ADD_BOS, OPT_BOS_ID, OPT_EVAL_SAMPLES, OPT_SEED, OPT_DATA_CACHE,
    OPT_TASK, OPT_LIMIT, OPT_LOG_SAMPLES,
    OPT_PROMPT, OPT_PROMPT_FILE, OPT_MAX_NEW, OPT_TEMPERATURE, OPT_TOP_K, OPT_TOP_P, OPT_NO_CACHE,
    OPT_TEXT, OPT_QUIET
};

static const mc_option options[] = {
    /* model and machine */
    {"ctx-size", MC_OPT_REQUIRED, OPT_CTX, "N",
     "Context: perplexity window, longest task input, prompt plus generated tokens "
     "(default: the checkpoint's --seq-length)."},
    {"bf16", MC_OPT_NONE, OPT_BF16, NULL, "bf16 GEMMs with fp32 accumulation (default fp32)."},
    {"weights", MC_OPT_REQUIRED, OPT_WEIGHTS, "TYPE",
     "fp32 or int8: run the linear layers on the weights as fp32, or as int8 codes with "
     "one scale per row (a quarter of the bytes; generation is faster). Default: int8 for "
     "a checkpoint quantized to int8 (on its own codes), fp32 otherwise."},
    {"threads", MC_OPT_REQUIRED, OPT_THREADS, "N", "CPU threads (default: the cores present)."},
    {"device", MC_OPT_REQUIRED, OPT_DEVICE, "DEV",
     "cpu (the only one yet: the inference kernels have no CUDA version)."},
    {"tensor-model-parallel-size", MC_OPT_REQUIRED, OPT_TP, "N",
     "Under mpirun or srun: ranks that split each layer (1); the world must be N ranks."},
    {"pipeline-model-parallel-size", MC_OPT_REQUIRED, OPT_PP, "N",
     "Accepted for Megatron's scripts; only 1 (evaluation does not run a pipeline)."},
    {"distributed-timeout-minutes", MC_OPT_REQUIRED, OPT_DIST_TIMEOUT, "MIN",
     "Abort the whole job when a collective waits longer than MIN minutes (10)."},
    /* perplexity */
    {"data-path", MC_OPT_REQUIRED, OPT_DATA_PATH, "PREFIX",
     "Perplexity of an indexed dataset (PREFIX.bin/.idx), its documents back to back."},
    {"text-file", MC_OPT_REQUIRED, OPT_TEXT_FILE, "FILE",
     "Perplexity of a text file, tokenized with the checkpoint's tokenizer."},
    {"split", MC_OPT_REQUIRED, OPT_SPLIT, "A,B,C",
     "Train, validation, test weights of the dataset, as given to mc-train (969,30,1)."},
    {"eval-split", MC_OPT_REQUIRED, OPT_EVAL_SPLIT, "WHICH",
     "all (default), train, valid or test: which documents of --data-path."},
    {"ppl-mode", MC_OPT_REQUIRED, OPT_PPL_MODE, "MODE",
     "plain (default; Megatron's windows), llama (llama-perplexity's rules), sliding "
     "(strided windows, --stride) or samples (mc-train's validation samples)."},
    {"stride", MC_OPT_REQUIRED, OPT_STRIDE, "N", "--ppl-mode sliding: window step (--ctx-size / 2)."},
    {"chunks", MC_OPT_REQUIRED, OPT_CHUNKS, "N", "Evaluate at most N windows (all)."},
    {"add-bos", MC_OPT_NONE, OPT_ADD_BOS, NULL,
     "Prepend the BOS token to the text and to each prompt; --ppl-mode llama also writes it "
     "over each window's first token (llama.cpp with add_bos_token)."},
    {"bos-id", MC_OPT_REQUIRED, OPT_BOS_ID, "ID",
     "The BOS token of --add-bos (default: the end-of-document token)."},
    {"eval-samples", MC_OPT_REQUIRED, OPT_EVAL_SAMPLES, "N",
     "--ppl-mode samples: the first N samples of the split (all of one epoch)."},
    {"seed", MC_OPT_REQUIRED, OPT_SEED, "N",
     "Seed of the samples' order (as mc-train's --seed) and of sampling (1234)."},
    {"data-cache-path", MC_OPT_REQUIRED, OPT_DATA_CACHE, "DIR",
     "--ppl-mode samples: where the dataset's index files are cached (as mc-train)."},
    /* tasks */
    {"task", MC_OPT_REQUIRED, OPT_TASK, "NAME=FILE",
     "Run a task on a local JSONL file: lambada_openai, hellaswag, arc_easy, arc_challenge, "
     "piqa or multiple_choice (repeatable)."},
    {"limit", MC_OPT_REQUIRED, OPT_LIMIT, "N", "Only the first N documents of each task."},
    {"log-samples", MC_OPT_NONE, OPT_LOG_SAMPLES, NULL,
     "Add each document's log-likelihoods, greedy flags and picks to the JSON."},
    /* generation */
    {"prompt", MC_OPT_REQUIRED, OPT_PROMPT, "TEXT", "Generate a continuation of TEXT (repeatable)."},
    {"prompt-file", MC_OPT_REQUIRED, OPT_PROMPT_FILE, "FILE",
     "Prompts, one a line (- reads stdin; empty lines are skipped)."},
    {"max-new-tokens", MC_OPT_REQUIRED, OPT_MAX_NEW, "N", "Tokens to generate at most (64)."},
    {"temperature", MC_OPT_REQUIRED, OPT_TEMPERATURE, "X", "Sampling temperature; 0 is greedy (0)."},
    {"top-k", MC_OPT_REQUIRED, OPT_TOP_K, "K", "Sample among the K most likely tokens (0: all)."},
    {"top-p", MC_OPT_REQUIRED, OPT_TOP_P, "P",
     "Sample among the most likely tokens whose probability reaches P (1: all)."},
    {"no-kv-cache", MC_OPT_NONE, OPT_NO_CACHE, NULL,
     "Recompute the whole sequence for every generated token (for tests and timing)."},
    {"text", MC_OPT_NONE, OPT_TEXT, NULL,
     "Print each prompt and its continuation on stdout instead of the JSON document."},
    /* output */
    {"output", MC_OPT_REQUIRED, OPT_OUTPUT, "FILE", "Write the JSON document to FILE; print its path."},
    {"quiet", MC_OPT_NONE, OPT_QUIET, NULL, "No progress lines, only the results on stderr."},
    {NULL, 0, 0, NULL, NULL},
};

typedef struct task_arg {
    const char *name, *file;
    mc_task_kind kind;
} task_arg;

typedef struct args {
    const char *ckpt;
    int64_t ctx, threads, tp, pp;
    const char *device;
    double dist_timeout;
    int bf16;
    int weights; /* -1: as the checkpoint, 0: fp32, 1: int8 */
    const char *data_path, *text_file, *split, *data_cache;
    int eval_split; /* -1: all */
    mc_ppl_mode mode;
    int64_t stride, chunks, eval_samples, bos_id;
    int add_bos;
    uint64_t seed;
    task_arg *tasks;
    size_t ntasks;
    int64_t limit;
    int log_samples;
    const char **prompts;
    size_t nprompts;
    const char *prompt_file;
    mc_gen_config gen;
    int text, quiet;
    const char *output;
    int have_seed, have_stride, have_mode;
} args;

static mc_status parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out,
                           mc_error *err)
{
    return mc_parse_i64(opt, s, min, max, out, err);
}

static mc_status push(void *list, size_t *n, size_t size, const void *item, mc_error *err)
{
    void **l = list;
    char *nl = realloc(*l, (*n + 1) * size);
    if (!nl) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    memcpy(nl + *n * size, item, size);
    *l = nl;
    (*n)++;
    return MC_OK;
}

static mc_status parse_args(mc_cli *cli, args *a, int *exit_now, mc_error *err)
{
    const char *arg;
    int key;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0) {
        mc_status st = MC_OK;
        int64_t i;
        double d;
        switch (key) {
        case OPT_CTX: st = parse_i64("--ctx-size", arg, 2, 1 << 24, &a->ctx, err); break;
        case OPT_BF16: a->bf16 = 1; break;
        case OPT_WEIGHTS:
            if (!strcmp(arg, "fp32")) a->weights = 0;
            else if (!strcmp(arg, "int8")) a->weights = 1;
            else st = mc_error_set(err, MC_ERR_USAGE, "--weights: unknown type '%s' (choose from fp32, int8)", arg);
            break;
        case OPT_THREADS: st = parse_i64("--threads", arg, 1, 4096, &a->threads, err); break;
        case OPT_DEVICE: a->device = arg; break;
        case OPT_TP: st = parse_i64("--tensor-model-parallel-size", arg, 1, 4096, &a->tp, err); break;
        case OPT_PP: st = parse_i64("--pipeline-model-parallel-size", arg, 1, 4096, &a->pp, err); break;
        case OPT_DIST_TIMEOUT:
            st = mc_parse_double("--distributed-timeout-minutes", arg, 1e-3, 1e6, &a->dist_timeout, err);
            break;
        case OPT_DATA_PATH: a->data_path = arg; break;
        case OPT_TEXT_FILE: a->text_file = arg; break;
        case OPT_SPLIT: a->split = arg; break;
        case OPT_EVAL_SPLIT:
            if (!strcmp(arg, "all")) a->eval_split = -1;
            else if (!strcmp(arg, "train")) a->eval_split = MC_SPLIT_TRAIN;
            else if (!strcmp(arg, "valid")) a->eval_split = MC_SPLIT_VALID;
            else if (!strcmp(arg, "test")) a->eval_split = MC_SPLIT_TEST;
            else st = mc_error_set(err, MC_ERR_USAGE,
                                   "--eval-split: expected all, train, valid or test, got '%s'", arg);
            break;
        case OPT_PPL_MODE: st = mc_ppl_mode_parse(arg, &a->mode, err); a->have_mode = 1; break;
        case OPT_STRIDE: st = parse_i64("--stride", arg, 1, 1 << 24, &a->stride, err); a->have_stride = 1; break;
        case OPT_CHUNKS: st = parse_i64("--chunks", arg, 1, INT64_MAX, &a->chunks, err); break;
        case OPT_ADD_BOS: a->add_bos = 1; break;
        case OPT_BOS_ID: st = parse_i64("--bos-id", arg, 0, INT32_MAX, &a->bos_id, err); break;
        case OPT_EVAL_SAMPLES: st = parse_i64("--eval-samples", arg, 1, INT64_MAX, &a->eval_samples, err); break;
        case OPT_SEED:
            st = parse_i64("--seed", arg, 0, UINT32_MAX, &i, err);
            a->seed = (uint64_t)i, a->have_seed = 1;
            break;
        case OPT_DATA_CACHE: a->data_cache = arg; break;
        case OPT_TASK: {
            const char *eq = strchr(arg, '=');
            task_arg t = {NULL, NULL, MC_TASK_LAMBADA};
            if (!eq || eq == arg || !eq[1]) {
                st = mc_error_set(err, MC_ERR_USAGE, "--task: expected NAME=FILE, got '%s'", arg);
                break;
            }
            char *name = strndup(arg, (size_t)(eq - arg));
            if (!name) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            t.name = name;
            t.file = eq + 1;
            st = mc_task_kind_parse(name, &t.kind, err);
            if (!st) st = push(&a->tasks, &a->ntasks, sizeof t, &t, err);
            else free(name);
            if (st) mc_error_prefix(err, "--task");
            break;
        }
        case OPT_LIMIT: st = parse_i64("--limit", arg, 1, INT64_MAX, &a->limit, err); break;
        case OPT_LOG_SAMPLES: a->log_samples = 1; break;
        case OPT_PROMPT: st = push(&a->prompts, &a->nprompts, sizeof arg, &arg, err); break;
        case OPT_PROMPT_FILE: a->prompt_file = arg; break;
        case OPT_MAX_NEW:
            st = parse_i64("--max-new-tokens", arg, 1, 1 << 24, &i, err);
            a->gen.max_new_tokens = (int)i;
            break;
        case OPT_TEMPERATURE:
            st = mc_parse_double("--temperature", arg, 0, 1e6, &d, err);
            a->gen.temperature = d;
            break;
        case OPT_TOP_K:
            st = parse_i64("--top-k", arg, 0, INT32_MAX, &i, err);
            a->gen.top_k = (int)i;
            break;
        case OPT_TOP_P:
            st = mc_parse_double("--top-p", arg, 0, 1, &d, err);
            if (!st && d <= 0) st = mc_error_set(err, MC_ERR_USAGE, "--top-p: expected a number in (0, 1], got '%s'", arg);
            a->gen.top_p = d;
            break;
        case OPT_NO_CACHE: a->gen.no_cache = 1; break;
        case OPT_TEXT: a->text = 1; break;
        case OPT_OUTPUT: a->output = arg; break;
        case OPT_QUIET: a->quiet = 1; break;
        default: st = mc_error_set(err, MC_ERR_INTERNAL, "option %d", key);
        }
        if (st) return st;
    }
    if (key == MC_CLI_EXIT) {
        *exit_now = 1;
        return MC_OK;
    }
    if (key == MC_CLI_ERROR) return MC_ERR_USAGE;
    int npos = cli->argc - cli->optind;
    if (npos > 1)
        return mc_error_set(err, MC_ERR_USAGE, "one checkpoint at most, got %d arguments (%s ...)",
                            npos, cli->argv[cli->optind + 1]);
    if (npos == 1 && strcmp(cli->argv[cli->optind], "-")) a->ckpt = cli->argv[cli->optind];
    return MC_OK;
}

static mc_status check_args(const args *a, mc_error *err)
{
    int ppl = a->data_path || a->text_file;
    int gen = a->nprompts || a->prompt_file;
    if (!ppl && !a->ntasks && !gen)
        return mc_error_set(err, MC_ERR_USAGE,
                            "nothing to do: give --data-path or --text-file (perplexity), --task, "
                            "or --prompt/--prompt-file (generation)");
    if (a->data_path && a->text_file)
        return mc_error_set(err, MC_ERR_USAGE, "--data-path and --text-file exclude each other");
    if (a->mode == MC_PPL_SAMPLES && !a->data_path)
        return mc_error_set(err, MC_ERR_USAGE, "--ppl-mode samples needs --data-path");
    if (a->text_file && a->eval_split != -1)
        return mc_error_set(err, MC_ERR_USAGE, "--eval-split applies to --data-path, not --text-file");
    if (a->have_stride && a->mode != MC_PPL_SLIDING)
        return mc_error_set(err, MC_ERR_USAGE, "--stride needs --ppl-mode sliding");
    if (a->eval_samples && a->mode != MC_PPL_SAMPLES)
        return mc_error_set(err, MC_ERR_USAGE, "--eval-samples needs --ppl-mode samples");
    if (a->mode == MC_PPL_SAMPLES && a->eval_split == -1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--ppl-mode samples needs --eval-split train, valid or test");
    if (a->prompt_file && !strcmp(a->prompt_file, "-") && !a->ckpt)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--prompt-file - reads stdin, so the checkpoint must be an argument");
    if (a->text && (ppl || a->ntasks || !gen))
        return mc_error_set(err, MC_ERR_USAGE, "--text prints generations only: use it with "
                                               "--prompt or --prompt-file alone");
    if (a->text && a->output)
        return mc_error_set(err, MC_ERR_USAGE, "--text and --output exclude each other");
    if (a->pp > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--pipeline-model-parallel-size %" PRId64 ": evaluation does not run "
                            "a pipeline; use --tensor-model-parallel-size (any checkpoint loads "
                            "under any grid)",
                            a->pp);
    if (a->device && !strcmp(a->device, "cuda"))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--device cuda: mc-eval's inference kernels have no CUDA version yet; "
                            "use --device cpu");
    if (a->device && strcmp(a->device, "cpu"))
        return mc_error_set(err, MC_ERR_USAGE, "--device: expected cpu, got '%s'", a->device);
    return MC_OK;
}

/* ------------------------------------------------------------ stdin and files */

/* One line of stdin (the checkpoint path of the pipeline contract). */
static mc_status read_stdin_line(char **out, mc_error *err)
{
    if (mc_read_stdin_line(out, err))
        return mc_error_set(err, MC_ERR_USAGE,
                            "no checkpoint given and stdin is a terminal: give its path, or pipe "
                            "in what mc-train prints");
    if (!*out)
        return mc_error_set(err, MC_ERR_USAGE, "no checkpoint given and stdin holds no path");
    return MC_OK;
}

/* Rank 0 reads stdin (mpirun gives it to rank 0 alone) and broadcasts the
 * line as floats (exact below 2^24); every rank gets the same status. */
static mc_status share_stdin_line(const mc_grid *g, char **out, mc_error *err)
{
    mc_status st = g->rank == 0 ? read_stdin_line(out, err) : MC_OK;
    return mc_broadcast_text(g, st, out, err);
}

/* Prompts of --prompt-file: one a line, empty lines skipped. The lines
 * point into *buf (freed by the caller). */
static mc_status read_prompt_file(const char *path, char **buf, const char ***lines, size_t *n,
                                  mc_error *err)
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
            const char *line = p;
            mc_status st = push(lines, n, sizeof line, &line, err);
            if (st) return st;
        }
        p = e + 1;
    }
    return MC_OK;
}

/* ------------------------------------------------------------ progress */

typedef struct progress {
    const mc_logger *lg;
    int on;
    const char *what;
    int64_t next;    /* the next count that prints */
    json_t *samples; /* --log-samples: per-document scores (tasks) */
} progress;

static void ppl_progress(void *ctx, const mc_ppl_stats *s, int64_t windows)
{
    progress *p = ctx;
    if (!p->on) return;
    /* about ten lines a run: every tenth of the windows */
    int64_t step = (windows + 9) / 10;
    if (s->windows < p->next && s->windows != windows) return;
    p->next = (s->windows / step + 1) * step;
    mc_log_info(p->lg, "%s: %" PRId64 "/%" PRId64 " windows, %" PRId64 " tokens scored, PPL %.4f",
                p->what, s->windows, windows, s->count, mc_ppl_value(s));
}

/* Per document: the progress line, and with --log-samples the document's
 * scores in the JSON array `samples`. */
static void task_doc(void *ctx, int64_t doc, int64_t total, int nchoices, const double *lls,
                     const int *greedy, int gold, int pred, int pred_norm)
{
    progress *p = ctx;
    if (p->samples) {
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
        json_array_append_new(p->samples, o);
    }
    if (!p->on) return;
    int64_t done = doc + 1, step = (total + 9) / 10;
    if (done < p->next && done != total) return;
    p->next = (done / step + 1) * step;
    mc_log_info(p->lg, "%s: %" PRId64 "/%" PRId64 " documents", p->what, done, total);
}

/* ------------------------------------------------------------ JSON */

static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* A JSON string of bytes that may not be UTF-8 (a generation can stop
 * inside a character): invalid sequences become U+FFFD, as Python's
 * decode(errors="replace") does. */
static json_t *jtext(const char *s, size_t n)
{
    mc_buf b = MC_BUF_INIT;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &c);
        if (k < 1) {
            if (mc_buf_append(&b, "\xEF\xBF\xBD", 3, NULL)) break;
            i++;
        } else {
            if (mc_buf_append(&b, s + i, (size_t)k, NULL)) break;
            i += (size_t)k;
        }
    }
    json_t *j = json_stringn(b.data ? b.data : "", b.len);
    mc_buf_free(&b);
    return j ? j : json_string("");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ the work */

typedef struct run {
    args *a;
    const mc_grid *g;
    mc_logger *lg;
    mc_infer *inf;
    mc_tokenizer *tok;
    const mc_model_config *cfg;
    int ctx;
    int32_t bos;
    json_t *doc;
    int say; /* rank 0 prints */
} run;

static mc_status do_perplexity(run *r, mc_error *err)
{
    args *a = r->a;
    mc_ppl_stats s;
    mc_ids ids = MC_IDS_INIT;
    mc_status st = MC_OK;
    int64_t ndocs = -1;
    const char *src = a->data_path ? a->data_path : a->text_file;
    progress pr = {r->lg, r->say && !a->quiet, "perplexity", 0, NULL};
    double t0 = now_s();
    if (a->mode == MC_PPL_SAMPLES) {
        mc_gptdata_config dc;
        mc_gptdata_config_init(&dc);
        const char *one = a->data_path;
        st = mc_gptdata_parse_data_path(&one, 1, &dc.blend, err);
        if (st) return mc_error_prefix(err, "--data-path");
        if (a->split) dc.split = a->split;
        dc.seq_length = r->ctx;
        dc.seed = (uint32_t)(a->have_seed ? a->seed : 1234);
        dc.cache_dir = a->data_cache;
        st = mc_ppl_run_gptdata(r->inf, &dc, (mc_split)a->eval_split, 0,
                                a->eval_samples ? a->eval_samples : -1, &s, ppl_progress, &pr, err);
        mc_gptdata_blend_free(&dc.blend);
    } else {
        if (a->add_bos) st = mc_ids_push(&ids, r->bos, err);
        if (!st && a->data_path) {
            st = mc_eval_dataset_ids(a->data_path, a->split, a->eval_split, &ids, &ndocs, err);
        } else if (!st) {
            char *text = NULL;
            size_t len = 0;
            mc_encoder *enc = NULL;
            st = mc_read_file(a->text_file, &text, &len, err);
            if (!st) st = mc_encoder_new(r->tok, &enc, err);
            if (!st) st = mc_encode(enc, text, len, &ids, err);
            if (st) mc_error_prefix(err, "%s", a->text_file);
            mc_encoder_free(enc);
            free(text);
        }
        if (!st) {
            mc_ppl_config c = {a->mode, r->ctx, (int)a->stride, a->chunks,
                               a->add_bos && a->mode == MC_PPL_LLAMA ? r->bos : -1};
            st = mc_ppl_run(r->inf, &c, ids.v, ids.n, &s, ppl_progress, &pr, err);
            if (st && st != MC_ERR_NOMEM) mc_error_prefix(err, "%s", src);
        }
    }
    mc_ids_free(&ids);
    if (st) return st;
    double secs = now_s() - t0;
    double ppl = mc_ppl_value(&s), pe = mc_ppl_stderr(&s);
    if (r->say) {
        mc_log_info(r->lg, "perplexity of %s (%s, %" PRId64 " tokens scored in %" PRId64
                           " windows of %d)", src, mc_ppl_mode_name(a->mode), s.count, s.windows,
                    r->ctx);
        fprintf(stderr, "PPL = %.4f +/- %.5f\n", ppl, pe);
        fflush(stderr);
    }
    json_t *o = json_object();
    json_object_set_new(o, "source", json_string(src));
    json_object_set_new(o, "kind", json_string(a->data_path ? "dataset" : "text"));
    if (a->data_path) {
        static const char *const SPL[] = {"train", "valid", "test"};
        json_object_set_new(o, "eval_split",
                            json_string(a->eval_split < 0 ? "all" : SPL[a->eval_split]));
        json_object_set_new(o, "split", json_string(a->split ? a->split : "969,30,1"));
        if (ndocs >= 0) json_object_set_new(o, "documents", json_integer(ndocs));
    }
    json_object_set_new(o, "mode", json_string(mc_ppl_mode_name(a->mode)));
    json_object_set_new(o, "ctx_size", json_integer(r->ctx));
    if (a->mode == MC_PPL_SLIDING)
        json_object_set_new(o, "stride", json_integer(a->stride ? a->stride : r->ctx / 2));
    if (a->add_bos) json_object_set_new(o, "bos_id", json_integer(r->bos));
    json_object_set_new(o, "tokens", json_integer(s.tokens));
    json_object_set_new(o, "windows", json_integer(s.windows));
    json_object_set_new(o, "scored_tokens", json_integer(s.count));
    json_object_set_new(o, "nll", jreal(s.count ? s.nll / (double)s.count : NAN));
    json_object_set_new(o, "ppl", jreal(ppl));
    json_object_set_new(o, "ppl_stderr", jreal(pe));
    json_object_set_new(o, "seconds", json_real(secs));
    json_object_set_new(o, "tokens_per_second", jreal((double)s.tokens / secs));
    json_object_set_new(r->doc, "perplexity", o);
    return MC_OK;
}

static mc_status do_tasks(run *r, mc_error *err)
{
    args *a = r->a;
    json_t *all = json_object();
    json_object_set_new(r->doc, "tasks", all);
    for (size_t i = 0; i < a->ntasks; i++) {
        task_arg *t = &a->tasks[i];
        mc_task_result res;
        progress pr = {r->lg, r->say && !a->quiet, t->name, 0,
                       a->log_samples ? json_array() : NULL};
        double t0 = now_s();
        mc_status st = mc_task_run(r->inf, r->tok, t->kind, t->file, a->limit, r->ctx, &res,
                                   task_doc, &pr, err);
        if (st) {
            json_decref(pr.samples);
            return st;
        }
        double secs = now_s() - t0;
        json_t *o = json_object();
        json_object_set_new(o, "file", json_string(t->file));
        json_object_set_new(o, "docs", json_integer(res.docs));
        json_object_set_new(o, "requests", json_integer(res.requests));
        json_object_set_new(o, "acc", jreal(res.acc));
        json_object_set_new(o, "acc_stderr", jreal(res.acc_stderr));
        if (t->kind == MC_TASK_LAMBADA) {
            json_object_set_new(o, "perplexity", jreal(res.perplexity));
        } else {
            json_object_set_new(o, "acc_norm", jreal(res.acc_norm));
            json_object_set_new(o, "acc_norm_stderr", jreal(res.acc_norm_stderr));
        }
        json_object_set_new(o, "mean_loglikelihood", jreal(res.mean_ll));
        json_object_set_new(o, "seconds", json_real(secs));
        if (pr.samples) json_object_set_new(o, "samples", pr.samples);
        json_object_set_new(all, t->name, o);
        if (!r->say) continue;
        if (t->kind == MC_TASK_LAMBADA)
            mc_log_info(r->lg, "%s: %" PRId64 " documents: acc = %.4f +/- %.4f, perplexity = %.4f",
                        t->name, res.docs, res.acc, res.acc_stderr, res.perplexity);
        else
            mc_log_info(r->lg,
                        "%s: %" PRId64 " documents: acc = %.4f +/- %.4f, acc_norm = %.4f +/- %.4f",
                        t->name, res.docs, res.acc, res.acc_stderr, res.acc_norm,
                        res.acc_norm_stderr);
    }
    return MC_OK;
}

static mc_status do_generate(run *r, const char **prompts, size_t n, mc_error *err)
{
    args *a = r->a;
    mc_gen_config c = a->gen;
    c.seed = a->have_seed ? a->seed : 1234;
    c.eod = mc_tokenizer_eod(r->tok);
    c.vocab_size = mc_tokenizer_vocab_size(r->tok);
    if (c.vocab_size > r->cfg->padded_vocab_size) c.vocab_size = r->cfg->padded_vocab_size;
    mc_encoder *enc = NULL;
    mc_status st = mc_encoder_new(r->tok, &enc, err);
    json_t *list = json_array();
    json_object_set_new(r->doc, "generations", list);
    mc_ids ids = MC_IDS_INIT, out = MC_IDS_INIT;
    mc_buf text = MC_BUF_INIT;
    double t0 = now_s();
    int64_t generated = 0;
    for (size_t i = 0; i < n && !st; i++) {
        ids.n = out.n = text.len = 0;
        if (a->add_bos) st = mc_ids_push(&ids, r->bos, err);
        if (!st) st = mc_encode(enc, prompts[i], strlen(prompts[i]), &ids, err);
        if (!st && ids.n == 0) {
            /* an empty prompt starts a document */
            if (c.eod < 0)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "prompt %zu is empty and the tokenizer has no end-of-document "
                                  "token to start from", i + 1);
            else
                st = mc_ids_push(&ids, c.eod, err);
        }
        mc_gen_stop stop = MC_GEN_STOP_LENGTH;
        if (!st) st = mc_generate(r->inf, &c, (uint64_t)i, ids.v, ids.n, &out, &stop, err);
        if (st) {
            mc_error_prefix(err, "prompt %zu", i + 1);
            break;
        }
        generated += (int64_t)out.n;
        /* the text without the end-of-document token */
        size_t keep = out.n && stop == MC_GEN_STOP_EOD ? out.n - 1 : out.n;
        if ((st = mc_decode(r->tok, out.v, keep, &text, err))) break;
        json_t *o = json_object(), *toks = json_array();
        for (size_t k = 0; k < out.n; k++) json_array_append_new(toks, json_integer(out.v[k]));
        json_object_set_new(o, "prompt", jtext(prompts[i], strlen(prompts[i])));
        json_object_set_new(o, "completion", jtext(text.data, text.len));
        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)ids.n));
        json_object_set_new(o, "tokens", toks);
        json_object_set_new(o, "stop", json_string(mc_gen_stop_name(stop)));
        json_array_append_new(list, o);
        if (r->say && a->text) {
            fwrite(prompts[i], 1, strlen(prompts[i]), stdout);
            fwrite(text.data ? text.data : "", 1, text.len, stdout);
            fputc('\n', stdout);
            if (fflush(stdout) == EOF) st = mc_error_errno(err, MC_ERR_IO, errno, "stdout");
        }
    }
    double secs = now_s() - t0;
    if (!st && r->say && !a->quiet)
        mc_log_info(r->lg, "generation: %zu prompts, %" PRId64 " tokens in %.2f s (%.1f tokens/s)",
                    n, generated, secs, secs > 0 ? (double)generated / secs : 0.0);
    mc_ids_free(&ids);
    mc_ids_free(&out);
    mc_buf_free(&text);
    mc_encoder_free(enc);
    return st;
}

/* Write the document: stdout, or FILE atomically (then its path on stdout). */
static mc_status write_doc(const args *a, json_t *doc, mc_error *err)
{
    char *s = json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status st = MC_OK;
    if (a->output) {
        mc_afile f;
        st = mc_check_output_dir(a->output, err);
        if (!st) st = mc_afile_open(&f, a->output, err);
        if (!st) {
            st = mc_afile_write(&f, s, strlen(s), err);
            if (!st) st = mc_afile_write(&f, "\n", 1, err);
            if (!st) st = mc_afile_commit(&f, err);
            else mc_afile_abort(&f);
        }
        if (!st) printf("%s\n", a->output);
    } else {
        printf("%s\n", s);
    }
    free(s);
    if (!st && fflush(stdout) == EOF) st = mc_error_errno(err, MC_ERR_IO, errno, "stdout");
    return st;
}

int main(int argc, char **argv)
{
    mc_logger lg;
    mc_logger_init(&lg, PROG);
    mc_error err;
    mc_error_clear(&err);
    /* SIGINT/SIGTERM/SIGHUP: temporaries removed, then the signal (file.h) */
    mc_interrupt_install();
    mc_cli cli;
    args a;
    memset(&a, 0, sizeof a);
    a.tp = a.pp = 1;
    a.eval_split = -1;
    a.weights = -1;
    a.bos_id = -1;
    mc_gen_config_init(&a.gen);
    mc_grid grid;
    mc_grid_single(&grid);
    char *stdin_ckpt = NULL, *prompt_buf = NULL;
    const char **prompts = NULL;
    size_t nprompts = 0;
    mc_backend *be = NULL;
    mc_model *model = NULL;
    mc_ckpt_reader *rd = NULL;
    run r = {0};
    int rc = 1, grid_error = 0;
    double t0 = now_s();

    mc_status st = mc_cli_init(&cli, PROG, "[OPTION]... [CHECKPOINT]",
                               "Evaluate a checkpoint (a checkpoint directory, an iteration "
                               "directory or its model.h5; read from stdin when omitted or -): "
                               "perplexity of a dataset or a text file, lm-evaluation-harness "
                               "tasks from local JSONL files, and text generation. Prints one "
                               "JSON document with every metric; human lines go to stderr. "
                               "Under mpirun or srun, runs on --tensor-model-parallel-size ranks.",
                               options, argc, argv, &err);
    int exit_now = 0;
    if (!st) st = parse_args(&cli, &a, &exit_now, &err);
    if (!st && exit_now) {
        rc = 0;
        goto done;
    }
    if (!st) st = check_args(&a, &err);

    /* The grid: under an MPI launcher every rank starts MPI even after a
     * usage error, so that rank 0 alone reports it. */
    if (mc_grid_launched_by_mpi()) {
        mc_error gerr;
        mc_status gst = mc_grid_init_mpi(&argc, &argv, st ? 1 : (int)a.tp, 1, 1, 1, &grid, &gerr);
        if (!st && gst) err = gerr, st = gst, grid_error = 1;
        if (!st && grid.world != a.tp) {
            st = mc_error_set(&err, MC_ERR_USAGE,
                              "%d ranks for --tensor-model-parallel-size %" PRId64
                              ": evaluation runs one tensor-parallel group, start %" PRId64 " ranks",
                              grid.world, a.tp, a.tp);
            grid_error = 1;
        }
    } else if (!st && a.tp > 1) {
        st = mc_error_set(&err, MC_ERR_USAGE,
                          "--tensor-model-parallel-size %" PRId64 " needs %" PRId64
                          " ranks and this is one process: start it with mpirun -np %" PRId64
                          " or srun", a.tp, a.tp, a.tp);
    }
    if (st) goto fail;
    if (a.dist_timeout > 0 && (st = mc_grid_set_timeout(&grid, a.dist_timeout, PROG, &err)))
        goto fail;
    r.a = &a;
    r.g = &grid;
    r.lg = &lg;
    r.say = grid.rank == 0;

    /* the checkpoint, its configuration and (when text is involved) its tokenizer */
    if (!a.ckpt) {
        if ((st = share_stdin_line(&grid, &stdin_ckpt, &err))) goto fail;
        a.ckpt = stdin_ckpt;
    }
    mc_model_config cfg;
    st = mc_ckpt_open(a.ckpt, &rd, &err);
    if (!st) st = mc_ckpt_read_model_config(rd, &cfg, &err);
    int need_text = a.text_file || a.ntasks || a.nprompts || a.prompt_file;
    if (!st && (need_text || a.add_bos)) {
        if (!mc_ckpt_has_tokenizer(rd) && need_text)
            st = mc_error_set(&err, MC_ERR_NOTFOUND,
                              "%s: the checkpoint stores no tokenizer, and %s needs one to turn "
                              "text into tokens",
                              mc_ckpt_file(rd),
                              a.text_file ? "--text-file" : a.ntasks ? "--task" : "generation");
        else if (mc_ckpt_has_tokenizer(rd))
            st = mc_ckpt_read_tokenizer(rd, &r.tok, &err);
    }
    if (!st && a.weights < 0) {
        /* int8 when the checkpoint's first linear weight is stored so */
        char qkv[128];
        mc_ckpt_dtype dt = MC_CKPT_FLOAT32;
        snprintf(qkv, sizeof qkv, "model/decoder.layers.0.self_attention.linear_qkv.weight");
        a.weights = mc_ckpt_has_tensor(rd, qkv) && !mc_ckpt_tensor_info(rd, qkv, NULL, NULL, &dt, NULL) &&
                    dt == MC_CKPT_INT8;
    }
    int64_t iteration = rd ? mc_ckpt_iteration(rd) : -1;
    char ckpt_dir[4096] = "";
    if (rd) snprintf(ckpt_dir, sizeof ckpt_dir, "%s", mc_ckpt_dir(rd));
    mc_ckpt_close(rd);
    rd = NULL;
    if (!st && a.add_bos) {
        r.bos = a.bos_id >= 0 ? (int32_t)a.bos_id : r.tok ? mc_tokenizer_eod(r.tok) : -1;
        if (r.bos < 0)
            st = mc_error_set(&err, MC_ERR_USAGE,
                              "--add-bos: the checkpoint's tokenizer has no end-of-document "
                              "token; give --bos-id");
    }
    if (!st && a.prompt_file)
        st = read_prompt_file(a.prompt_file, &prompt_buf, &prompts, &nprompts, &err);
    for (size_t i = 0; !st && i < a.nprompts; i++)
        st = push(&prompts, &nprompts, sizeof *prompts, &a.prompts[i], &err);
    if (!st && (a.nprompts || a.prompt_file) && nprompts == 0)
        st = mc_error_set(&err, MC_ERR_USAGE, "%s: no prompt in it", a.prompt_file);
    st = mc_grid_status_all(&grid, st, "checkpoint status", &err);
    if (st) goto fail;

    /* the model and the inference context */
    st = mc_backend_cpu_new((int)a.threads, &be, &err);
    if ((st = mc_grid_status_all(&grid, st, "checkpoint status", &err))) goto fail;
    /* The model's own activations are sized for the shortest sequence the
     * configuration allows (tp positions); inference has its own. */
    st = mc_train_load_model(a.ckpt, &grid, be, 1, (int)a.tp,
                             a.bf16 ? MC_PREC_BF16 : MC_PREC_FP32, &model, &err);
    if (st) goto fail;
    r.cfg = mc_model_get_config(model);
    r.ctx = a.ctx ? (int)a.ctx : cfg.seq_length;
    st = mc_infer_new(model, r.ctx, r.ctx, &r.inf, &err);
    if (st) mc_error_prefix(&err, "--ctx-size %d", r.ctx);
    if (!st && a.weights > 0) st = mc_infer_use_int8(r.inf, &err);
    if ((st = mc_grid_status_all(&grid, st, "checkpoint status", &err))) goto fail;
    if (r.say && !a.quiet)
        mc_log_info(&lg, "%s: iteration %" PRId64 ", %" PRId64 " parameters, context %d%s",
                    ckpt_dir, iteration, mc_model_global_numel(model), r.ctx,
                    grid.world > 1 ? ", tensor parallel" : "");

    r.doc = json_object();
    json_object_set_new(r.doc, "checkpoint", json_string(ckpt_dir));
    json_object_set_new(r.doc, "iteration", json_integer(iteration));
    json_t *mj = json_object();
    json_object_set_new(mj, "parameters", json_integer(mc_model_global_numel(model)));
    json_object_set_new(mj, "num_layers", json_integer(cfg.num_layers));
    json_object_set_new(mj, "hidden_size", json_integer(cfg.hidden_size));
    json_object_set_new(mj, "vocab_size", json_integer(r.cfg->vocab_size));
    json_object_set_new(mj, "padded_vocab_size", json_integer(r.cfg->padded_vocab_size));
    json_object_set_new(mj, "seq_length", json_integer(cfg.seq_length));
    json_object_set_new(r.doc, "model", mj);
    json_object_set_new(r.doc, "ctx_size", json_integer(r.ctx));
    json_object_set_new(r.doc, "tensor_model_parallel_size", json_integer(grid.tp));
    json_object_set_new(r.doc, "precision", json_string(a.bf16 ? "bf16" : "fp32"));
    json_object_set_new(r.doc, "weights", json_string(a.weights > 0 ? "int8" : "fp32"));

    if (a.data_path || a.text_file) st = do_perplexity(&r, &err);
    if (!st && a.ntasks) st = do_tasks(&r, &err);
    if (!st && nprompts) st = do_generate(&r, prompts, nprompts, &err);
    if (st) goto fail;
    json_object_set_new(r.doc, "seconds", json_real(now_s() - t0));
    if (r.say && !a.text && (st = write_doc(&a, r.doc, &err))) {
        /* rank 0 alone writes: its failure is its own */
        mc_log_fail(&lg, &err);
        rc = 1;
        if (grid.impl) mc_grid_fail(&grid, 0);
        goto done;
    }
    rc = 0;
    mc_grid_finalize(&grid);
    goto done;

fail:
    /* Every rank meets the same errors here (the same files, options and
     * results of the same collectives), so rank 0 alone reports them. */
    rc = grid_error ? 1 : mc_status_exit_code(st);
    if (grid.rank == 0) mc_log_fail(&lg, &err);
    if (grid.impl) mc_grid_fail(&grid, 1);
done:
    json_decref(r.doc);
    mc_infer_free(r.inf);
    mc_model_free(model);
    mc_tokenizer_free(r.tok);
    if (be) mc_backend_free(be);
    for (size_t i = 0; i < a.ntasks; i++) free((char *)a.tasks[i].name);
    free(a.tasks);
    free(a.prompts);
    free(prompts);
    free(prompt_buf);
    free(stdin_ckpt);
    mc_cli_free(&cli);
    return rc;
}
