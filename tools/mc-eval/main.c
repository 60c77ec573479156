/*
 * mc-eval - measure a checkpoint: perplexity on a dataset or a text file,
 * lm-evaluation-harness tasks from local JSONL files, and text generation.
 *
 * This file turns the options into an evaluation run of lib/eval
 * (mc_eval_open and the measures of mc/eval.h, lib/eval/run.c), on one
 * process or a tensor-parallel grid under mpirun/srun, and prints what it
 * reports. Pipeline contract: the checkpoint path is the argument,
 * or one line on stdin (what mc-train and mc-reshard print). Human lines go
 * to stderr (rank 0); one JSON document with every metric goes to stdout,
 * or to -o FILE, whose path stdout then carries.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "mc/ckpt.h"
#include "mc/comm.h"
#include "mc/eval.h"
#include "mc/file.h"
#include "mc/log.h"
#include "mc/opt.h"
#include "mc/tool.h"

static const char PROG[] = "mc-eval";

enum {
    OPT_CTX = 'c',
    OPT_OUTPUT = 'o',
    OPT_THREADS = 256,
    OPT_DEVICE,
    OPT_BF16,
    OPT_WEIGHTS,
    OPT_TP,
    OPT_EP,
    OPT_PP,
    OPT_DIST_TIMEOUT,
    OPT_DATA_PATH,
    OPT_TEXT_FILE,
    OPT_SPLIT,
    OPT_EVAL_SPLIT,
    OPT_PPL_MODE,
    OPT_STRIDE,
    OPT_CHUNKS,
    OPT_ADD_BOS,
    OPT_BOS_ID,
    OPT_EVAL_SAMPLES,
    OPT_SEED,
    OPT_DATA_CACHE,
    OPT_RESET_POSITION_IDS,
    OPT_RESET_ATTENTION_MASK,
    OPT_EOD_MASK_LOSS,
    OPT_TASK,
    OPT_LIMIT,
    OPT_LOG_SAMPLES,
    OPT_PROMPT,
    OPT_PROMPT_FILE,
    OPT_MAX_NEW,
    OPT_TEMPERATURE,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_NO_CACHE,
    OPT_TEXT,
    OPT_NO_VERIFY,
    OPT_QUIET
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
    {"no-verify", MC_OPT_NONE, OPT_NO_VERIFY, NULL,
     "Do not check the checkpoint's files against its checksums.xxh128 manifest before "
     "reading them (faster; a damaged file may then crash HDF5)."},
    {"threads", MC_OPT_REQUIRED, OPT_THREADS, "N", "CPU threads (default: the cores present)."},
    {"device", MC_OPT_REQUIRED, OPT_DEVICE, "DEV",
     "cpu (default) or cuda: the GPU of the process's local rank (fp32 or bf16 weights; "
     "not int8 weights or a mixture of experts)."},
    {"tensor-model-parallel-size", MC_OPT_REQUIRED, OPT_TP, "N",
     "Under mpirun or srun: ranks that split each layer (1); the world must be N x "
     "--expert-model-parallel-size ranks."},
    {"expert-model-parallel-size", MC_OPT_REQUIRED, OPT_EP, "N",
     "Under mpirun or srun, a mixture of experts: split the experts over N copies of the "
     "tensor-parallel group, which run the same tokens (1); the number of experts must be "
     "divisible by N."},
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
    {"stride", MC_OPT_REQUIRED, OPT_STRIDE, "N",
     "--ppl-mode sliding: window step (--ctx-size / 2)."},
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
    {"reset-position-ids", MC_OPT_NONE, OPT_RESET_POSITION_IDS, NULL,
     "Perplexity of packed documents: positions restart at 0 after each end-of-document "
     "token (as mc-train)."},
    {"reset-attention-mask", MC_OPT_NONE, OPT_RESET_ATTENTION_MASK, NULL,
     "Perplexity of packed documents: attention does not cross an end-of-document token."},
    {"eod-mask-loss", MC_OPT_NONE, OPT_EOD_MASK_LOSS, NULL,
     "Perplexity: leave unscored the positions whose input is the end-of-document token."},
    /* tasks */
    {"task", MC_OPT_REQUIRED, OPT_TASK, "NAME=FILE",
     "Run a task on a local JSONL file: lambada_openai, hellaswag, arc_easy, arc_challenge, "
     "piqa or multiple_choice (repeatable)."},
    {"limit", MC_OPT_REQUIRED, OPT_LIMIT, "N", "Only the first N documents of each task."},
    {"log-samples", MC_OPT_NONE, OPT_LOG_SAMPLES, NULL,
     "Add each document's log-likelihoods, greedy flags and picks to the JSON."},
    /* generation */
    {"prompt", MC_OPT_REQUIRED, OPT_PROMPT, "TEXT",
     "Generate a continuation of TEXT (repeatable)."},
    {"prompt-file", MC_OPT_REQUIRED, OPT_PROMPT_FILE, "FILE",
     "Prompts, one a line (- reads stdin; empty lines are skipped)."},
    {"max-new-tokens", MC_OPT_REQUIRED, OPT_MAX_NEW, "N", "Tokens to generate at most (64)."},
    {"temperature", MC_OPT_REQUIRED, OPT_TEMPERATURE, "X",
     "Sampling temperature; 0 is greedy (0)."},
    {"top-k", MC_OPT_REQUIRED, OPT_TOP_K, "K", "Sample among the K most likely tokens (0: all)."},
    {"top-p", MC_OPT_REQUIRED, OPT_TOP_P, "P",
     "Sample among the most likely tokens whose probability reaches P (1: all)."},
    {"no-kv-cache", MC_OPT_NONE, OPT_NO_CACHE, NULL,
     "Recompute the whole sequence for every generated token (for tests and timing)."},
    {"text", MC_OPT_NONE, OPT_TEXT, NULL,
     "Print each prompt and its continuation on stdout instead of the JSON document."},
    /* output */
    {"output", MC_OPT_REQUIRED, OPT_OUTPUT, "FILE",
     "Write the JSON document to FILE; print its path."},
    {"quiet", MC_OPT_NONE, OPT_QUIET, NULL, "No progress lines, only the results on stderr."},
    {NULL, 0, 0, NULL, NULL},
};

typedef struct args {
    mc_eval_config e;
    int64_t tp, ep, pp;
    const char *device;
    double dist_timeout;
    mc_buf tasks;   /* mc_eval_task, names malloc'd */
    mc_buf prompts; /* const char * */
    int text, quiet;
    const char *output;
    int have_stride;
} args;

static const mc_choice weight_types[] = {{"fp32", 0}, {"int8", 1}, {NULL, 0}};
static const mc_choice eval_splits[] = {
    {"all", -1}, {"train", MC_SPLIT_TRAIN}, {"valid", MC_SPLIT_VALID}, {"test", MC_SPLIT_TEST},
    {NULL, 0},
};

static mc_status parse_args(mc_cli *cli, args *a, int *exit_now, mc_error *err)
{
    const char *arg;
    int key;
    mc_eval_config *e = &a->e;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0) {
        mc_status st = MC_OK;
        switch (key) {
        case OPT_CTX: st = mc_parse_int("--ctx-size", arg, 2, 1 << 24, &e->ctx, err); break;
        case OPT_BF16: e->bf16 = 1; break;
        case OPT_WEIGHTS:
            st = mc_parse_choice("--weights", "type", arg, weight_types, &e->weights, err);
            break;
        case OPT_THREADS: st = mc_parse_int("--threads", arg, 1, 4096, &e->threads, err); break;
        case OPT_DEVICE:
            a->device = arg;
            e->cuda = !strcmp(arg, "cuda");
            break;
        case OPT_TP:
            st = mc_parse_i64("--tensor-model-parallel-size", arg, 1, 4096, &a->tp, err);
            break;
        case OPT_EP:
            st = mc_parse_i64("--expert-model-parallel-size", arg, 1, 4096, &a->ep, err);
            break;
        case OPT_PP:
            st = mc_parse_i64("--pipeline-model-parallel-size", arg, 1, 4096, &a->pp, err);
            break;
        case OPT_DIST_TIMEOUT:
            st = mc_parse_double("--distributed-timeout-minutes", arg, 1e-3, 1e6, &a->dist_timeout,
                                 err);
            break;
        case OPT_DATA_PATH: e->data_path = arg; break;
        case OPT_TEXT_FILE: e->text_file = arg; break;
        case OPT_SPLIT: e->split = arg; break;
        case OPT_EVAL_SPLIT:
            st = mc_parse_choice("--eval-split", NULL, arg, eval_splits, &e->eval_split, err);
            break;
        case OPT_PPL_MODE: st = mc_ppl_mode_parse(arg, &e->mode, err); break;
        case OPT_STRIDE:
            st = mc_parse_int("--stride", arg, 1, 1 << 24, &e->stride, err);
            a->have_stride = 1;
            break;
        case OPT_CHUNKS: st = mc_parse_i64("--chunks", arg, 1, INT64_MAX, &e->chunks, err); break;
        case OPT_ADD_BOS: e->add_bos = 1; break;
        case OPT_BOS_ID: st = mc_parse_int("--bos-id", arg, 0, INT32_MAX, &e->bos_id, err); break;
        case OPT_EVAL_SAMPLES:
            st = mc_parse_i64("--eval-samples", arg, 1, INT64_MAX, &e->eval_samples, err);
            break;
        case OPT_SEED: st = mc_parse_u64("--seed", arg, 0, UINT32_MAX, &e->seed, err); break;
        case OPT_DATA_CACHE: e->data_cache = arg; break;
        case OPT_RESET_POSITION_IDS: e->reset_position_ids = 1; break;
        case OPT_RESET_ATTENTION_MASK: e->reset_attention_mask = 1; break;
        case OPT_EOD_MASK_LOSS: e->eod_mask_loss = 1; break;
        case OPT_TASK: {
            const char *eq = strchr(arg, '=');
            mc_eval_task t = {NULL, NULL, MC_TASK_LAMBADA};
            if (!eq || eq == arg || !eq[1]) {
                st = mc_error_set(err, MC_ERR_USAGE, "--task: expected NAME=FILE, got '%s'", arg);
                break;
            }
            char *name = strndup(arg, (size_t)(eq - arg));
            if (!name) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            t.name = name;
            t.file = eq + 1;
            st = mc_task_kind_parse(name, &t.kind, err);
            if (!st)
                st = mc_buf_push(&a->tasks, &t, sizeof t, err);
            else
                free(name);
            if (st) mc_error_prefix(err, "--task");
            break;
        }
        case OPT_LIMIT: st = mc_parse_i64("--limit", arg, 1, INT64_MAX, &e->limit, err); break;
        case OPT_LOG_SAMPLES: e->log_samples = 1; break;
        case OPT_PROMPT: st = mc_buf_push_str(&a->prompts, arg, err); break;
        case OPT_PROMPT_FILE: e->prompt_file = arg; break;
        case OPT_MAX_NEW:
            st = mc_parse_int("--max-new-tokens", arg, 1, 1 << 24, &e->gen.max_new_tokens, err);
            break;
        case OPT_TEMPERATURE:
            st = mc_parse_double("--temperature", arg, 0, 1e6, &e->gen.temperature, err);
            break;
        case OPT_TOP_K: st = mc_parse_int("--top-k", arg, 0, INT32_MAX, &e->gen.top_k, err); break;
        case OPT_TOP_P:
            st = mc_parse_double("--top-p", arg, 0, 1, &e->gen.top_p, err);
            if (!st && e->gen.top_p <= 0)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "--top-p: expected a number in (0, 1], got '%s'", arg);
            break;
        case OPT_NO_CACHE: e->gen.no_cache = 1; break;
        case OPT_TEXT: a->text = 1; break;
        case OPT_OUTPUT: a->output = arg; break;
        case OPT_NO_VERIFY: mc_ckpt_set_verify(0); break;
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
    mc_status pst = mc_cli_one_positional(cli, "checkpoint", &e->ckpt, err);
    if (pst) return pst;
    e->tasks = (const mc_eval_task *)(const void *)a->tasks.data;
    e->ntasks = a->tasks.len / sizeof *e->tasks;
    e->prompts = mc_buf_strs(&a->prompts);
    e->nprompts = mc_buf_nstrs(&a->prompts);
    return MC_OK;
}

static mc_status check_args(const args *a, mc_error *err)
{
    const mc_eval_config *e = &a->e;
    int ppl = e->data_path || e->text_file;
    int gen = e->nprompts || e->prompt_file;
    if (!ppl && !e->ntasks && !gen)
        return mc_error_set(err, MC_ERR_USAGE,
                            "nothing to do: give --data-path or --text-file (perplexity), --task, "
                            "or --prompt/--prompt-file (generation)");
    if (e->data_path && e->text_file)
        return mc_error_set(err, MC_ERR_USAGE, "--data-path and --text-file exclude each other");
    if (!ppl && (e->reset_position_ids || e->reset_attention_mask || e->eod_mask_loss))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--%s applies to perplexity: give --data-path or --text-file",
                            e->reset_position_ids     ? "reset-position-ids"
                            : e->reset_attention_mask ? "reset-attention-mask"
                                                      : "eod-mask-loss");
    if (e->mode == MC_PPL_SAMPLES && !e->data_path)
        return mc_error_set(err, MC_ERR_USAGE, "--ppl-mode samples needs --data-path");
    if (e->text_file && e->eval_split != -1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--eval-split applies to --data-path, not --text-file");
    if (a->have_stride && e->mode != MC_PPL_SLIDING)
        return mc_error_set(err, MC_ERR_USAGE, "--stride needs --ppl-mode sliding");
    if (e->eval_samples && e->mode != MC_PPL_SAMPLES)
        return mc_error_set(err, MC_ERR_USAGE, "--eval-samples needs --ppl-mode samples");
    if (e->mode == MC_PPL_SAMPLES && e->eval_split == -1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--ppl-mode samples needs --eval-split train, valid or test");
    if (e->prompt_file && !strcmp(e->prompt_file, "-") && !e->ckpt)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--prompt-file - reads stdin, so the checkpoint must be an argument");
    if (a->text && (ppl || e->ntasks || !gen))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--text prints generations only: use it with "
                            "--prompt or --prompt-file alone");
    if (a->text && a->output)
        return mc_error_set(err, MC_ERR_USAGE, "--text and --output exclude each other");
    if (a->pp > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--pipeline-model-parallel-size %" PRId64 ": evaluation does not run "
                            "a pipeline; use --tensor-model-parallel-size (any checkpoint loads "
                            "under any grid)",
                            a->pp);
    if (a->device && strcmp(a->device, "cpu") && strcmp(a->device, "cuda"))
        return mc_error_set(err, MC_ERR_USAGE, "--device: expected cpu or cuda, got '%s'",
                            a->device);
    if (a->device && !strcmp(a->device, "cuda") && e->weights == 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--device cuda: int8 weights run on the CPU backend only; use "
                            "--weights fp32 or --device cpu");
    return MC_OK;
}

/* ------------------------------------------------------------ progress */

typedef struct progress {
    const mc_logger *lg;
    int on;
    const char *what;
    int64_t next; /* the next count that prints */
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

/* Per document of a task: the progress line. */
static void task_doc(void *ctx, int64_t doc, int64_t total, int nchoices, const double *lls,
                     const int *greedy, int gold, int pred, int pred_norm)
{
    (void)nchoices, (void)lls, (void)greedy, (void)gold, (void)pred, (void)pred_norm;
    progress *p = ctx;
    if (!p->on) return;
    int64_t done = doc + 1, step = (total + 9) / 10;
    if (done < p->next && done != total) return;
    p->next = (done / step + 1) * step;
    mc_log_info(p->lg, "%s: %" PRId64 "/%" PRId64 " documents", p->what, done, total);
}

/* --text: each prompt and its continuation on stdout, as they come. */
static mc_status print_text(void *ctx, const char *prompt, const char *text, size_t len,
                            mc_error *err)
{
    (void)ctx;
    fwrite(prompt, 1, strlen(prompt), stdout);
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    if (fflush(stdout) == EOF) return mc_error_errno(err, MC_ERR_IO, errno, "stdout");
    return MC_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ the work */

static mc_status do_perplexity(mc_eval *ev, const args *a, const mc_logger *lg, int say,
                               mc_error *err)
{
    const mc_eval_config *e = &a->e;
    progress pr = {lg, say && !a->quiet, "perplexity", 0};
    mc_eval_ppl res;
    mc_status st = mc_eval_perplexity(ev, ppl_progress, &pr, &res, err);
    if (st || !say) return st;
    mc_log_info(lg, "perplexity of %s (%s, %" PRId64 " tokens scored in %" PRId64 " windows of %d)",
                e->data_path ? e->data_path : e->text_file, mc_ppl_mode_name(e->mode), res.s.count,
                res.s.windows, mc_eval_get_info(ev)->ctx);
    fprintf(stderr, "PPL = %.4f +/- %.5f\n", mc_ppl_value(&res.s), mc_ppl_stderr(&res.s));
    fflush(stderr);
    return MC_OK;
}

static mc_status do_tasks(mc_eval *ev, const args *a, const mc_logger *lg, int say, mc_error *err)
{
    for (size_t i = 0; i < a->e.ntasks; i++) {
        const mc_eval_task *t = &a->e.tasks[i];
        progress pr = {lg, say && !a->quiet, t->name, 0};
        mc_task_result res;
        mc_status st = mc_eval_run_task(ev, i, task_doc, &pr, &res, err);
        if (st) return st;
        if (!say) continue;
        if (t->kind == MC_TASK_LAMBADA)
            mc_log_info(lg, "%s: %" PRId64 " documents: acc = %.4f +/- %.4f, perplexity = %.4f",
                        t->name, res.docs, res.acc, res.acc_stderr, res.perplexity);
        else
            mc_log_info(
                lg, "%s: %" PRId64 " documents: acc = %.4f +/- %.4f, acc_norm = %.4f +/- %.4f",
                t->name, res.docs, res.acc, res.acc_stderr, res.acc_norm, res.acc_norm_stderr);
    }
    return MC_OK;
}

static mc_status do_generate(mc_eval *ev, const args *a, const mc_logger *lg, int say,
                             mc_error *err)
{
    mc_eval_gen res;
    mc_status st = mc_eval_generate(ev, say && a->text ? print_text : NULL, NULL, &res, err);
    if (!st && say && !a->quiet)
        mc_log_info(lg, "generation: %zu prompts, %" PRId64 " tokens in %.2f s (%.1f tokens/s)",
                    res.prompts, res.tokens, res.seconds,
                    res.seconds > 0 ? (double)res.tokens / res.seconds : 0.0);
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
            if (!st)
                st = mc_afile_commit(&f, err);
            else
                mc_afile_abort(&f);
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
    /* SIGINT/SIGTERM/SIGHUP: temporaries removed, then the signal (file.h) */
    mc_tool_start(&lg, PROG, MC_TOOL_INTERRUPT | MC_TOOL_EFBIG);
    mc_error err;
    mc_error_clear(&err);
    mc_cli cli;
    args a;
    memset(&a, 0, sizeof a);
    a.tp = a.ep = a.pp = 1;
    mc_eval_config_init(&a.e);
    mc_grid grid;
    mc_grid_single(&grid);
    char *stdin_ckpt = NULL;
    mc_eval *ev = NULL;
    int rc = 1, grid_error = 0;
    double t0 = now_s();

    mc_status st = mc_cli_init(&cli, PROG, "[OPTION]... [CHECKPOINT]",
                               "Evaluate a checkpoint (a checkpoint directory, an iteration "
                               "directory or its model.h5; read from stdin when omitted or -): "
                               "perplexity of a dataset or a text file, lm-evaluation-harness "
                               "tasks from local JSONL files, and text generation. Prints one "
                               "JSON document with every metric; human lines go to stderr. "
                               "Under mpirun or srun, runs on --tensor-model-parallel-size x "
                               "--expert-model-parallel-size ranks.",
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
    st = mc_grid_init_tp_group(&argc, &argv, st, a.tp, a.ep, "evaluation", &grid, &grid_error,
                               &err);
    if (!st) st = mc_backend_cpu_check_env(&err);
    if (st) goto fail;
    if (a.dist_timeout > 0 && (st = mc_grid_set_timeout(&grid, a.dist_timeout, PROG, &err)))
        goto fail;
    int say = grid.rank == 0; /* rank 0 prints */

    /* The checkpoint: the argument, or the line on stdin (mpirun gives
     * stdin to rank 0 alone, which broadcasts it). */
    if (!a.e.ckpt) {
        st = say ? mc_tool_stdin_path(&stdin_ckpt,
                                      "no checkpoint given and stdin is a terminal: give its "
                                      "path, or pipe in what mc-train prints",
                                      "no checkpoint given and stdin holds no path", &err)
                 : MC_OK;
        if ((st = mc_broadcast_text(&grid, st, &stdin_ckpt, &err))) goto fail;
        a.e.ckpt = stdin_ckpt;
    }
    if ((st = mc_eval_open(&a.e, &grid, &ev, &err))) goto fail;
    const mc_eval_info *info = mc_eval_get_info(ev);
    if (say && !a.quiet)
        mc_log_info(&lg, "%s: iteration %" PRId64 ", %" PRId64 " parameters, context %d%s",
                    info->checkpoint, info->iteration, info->parameters, info->ctx,
                    grid.tp > 1 && grid.ep > 1 ? ", tensor and expert parallel"
                    : grid.ep > 1              ? ", expert parallel"
                    : grid.world > 1           ? ", tensor parallel"
                                               : "");
    if (say && !a.quiet && info->note) mc_log_info(&lg, "note: %s", info->note);
    if (say && !a.quiet && info->blas_note) mc_log_info(&lg, "note: %s", info->blas_note);

    if (a.e.data_path || a.e.text_file) st = do_perplexity(ev, &a, &lg, say, &err);
    if (!st && a.e.ntasks) st = do_tasks(ev, &a, &lg, say, &err);
    if (!st && info->nprompts) st = do_generate(ev, &a, &lg, say, &err);
    if (st) goto fail;
    json_t *doc = mc_eval_doc(ev);
    json_object_set_new(doc, "seconds", json_real(now_s() - t0));
    if (say && !a.text && (st = write_doc(&a, doc, &err))) {
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
    mc_eval_free(ev);
    const mc_eval_task *tasks = (const mc_eval_task *)(const void *)a.tasks.data;
    for (size_t i = 0; i < a.tasks.len / sizeof *tasks; i++) free((char *)tasks[i].name);
    mc_buf_free(&a.tasks);
    mc_buf_free(&a.prompts);
    free(stdin_ckpt);
    mc_cli_free(&cli);
    return rc;
}
