/*
 * eval.h - evaluating language models (lib/eval): perplexity under
 * Megatron's, llama.cpp's and Hugging Face's rules, lm-evaluation-harness
 * tasks read from local JSONL files, text generation, and the evaluation
 * run that loads a checkpoint and ties them together (mc-eval's work).
 *
 * Everything runs on an inference context (mc_infer, model.h), so the same
 * code serves one process and a tensor-parallel group: every rank of the
 * group calls the same function with the same arguments and gets the same
 * results (the collectives live below, in the model). Files are read and
 * text is tokenized on every rank alike.
 */
#ifndef MC_EVAL_H
#define MC_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "mc/buf.h"
#include "mc/comm.h"
#include "mc/gptdata.h"
#include "mc/model.h"
#include "mc/status.h"
#include "mc/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ perplexity
 * (lib/eval/ppl.c)
 *
 * Over a token stream of n ids, with a window of ctx positions:
 *   plain    non-overlapping windows as Megatron's samples are made:
 *            window k reads ids [k ctx, k ctx + ctx + 1) and scores ids
 *            k ctx + 1 .. k ctx + ctx from everything before them in the
 *            window, so every id but the first is scored once (the last
 *            window may be shorter);
 *   llama    llama.cpp's llama-perplexity: floor(n / ctx) windows of ctx
 *            ids (the rest dropped; at least 2 windows needed), the first
 *            id of each window replaced by bos when bos >= 0, and only the
 *            second half scored: positions ctx/2 + 1 .. ctx - 1 of each
 *            window, ctx - ctx/2 - 1 ids per window;
 *   sliding  Hugging Face's strided perplexity: windows of ctx ids starting
 *            at 0, stride, 2 stride, ..., each scoring the ids after the
 *            previous window's end (the first window all but its first id),
 *            until a window reaches the end; every id but the first is
 *            scored once, with at least ctx - stride ids of context.
 * PPL = exp(mean NLL). Its uncertainty is llama.cpp's: with s the standard
 * deviation of the per-token NLLs, the standard error of the mean is
 * s / sqrt(count - 1) and PPL's is PPL times that (first order). */
typedef enum mc_ppl_mode {
    MC_PPL_PLAIN = 0,
    MC_PPL_LLAMA = 1,
    MC_PPL_SLIDING = 2,
    MC_PPL_SAMPLES = 3 /* a GPT dataset's samples: mc_ppl_run_gptdata, not mc_ppl_run */
} mc_ppl_mode;

/* "plain", "llama", "sliding", "samples"; MC_ERR_USAGE naming the choices
 * otherwise. */
mc_status mc_ppl_mode_parse(const char *s, mc_ppl_mode *out, mc_error *err);
const char *mc_ppl_mode_name(mc_ppl_mode m);

typedef struct mc_ppl_config {
    mc_ppl_mode mode;
    int ctx;             /* window, <= the context's capacity */
    int stride;          /* sliding: 0 means ctx / 2 */
    int64_t max_windows; /* 0: all (llama.cpp's --chunks) */
    int32_t bos;         /* llama: id written over each window's first id; -1: none */
    int32_t mask_eod;    /* --eod-mask-loss: positions whose input is this id are not
                          * scored; -1: none */
} mc_ppl_config;

typedef struct mc_ppl_stats {
    double nll, nll2; /* sums over scored tokens of -log p and its square */
    int64_t count;    /* tokens scored */
    int64_t windows;  /* windows (or samples) run */
    int64_t tokens;   /* ids in the input */
} mc_ppl_stats;

/* exp(nll / count), and its standard error as above (NAN below 2 tokens). */
double mc_ppl_value(const mc_ppl_stats *s);
double mc_ppl_stderr(const mc_ppl_stats *s);

/* Called after each window with the running totals and the window count. */
typedef void (*mc_ppl_progress)(void *ctx, const mc_ppl_stats *s, int64_t windows);

/* Perplexity of ids[0..n) under c (stats zeroed first). Errors: a window
 * larger than the context, a text too short for one window (llama: two)
 * with the numbers. */
mc_status mc_ppl_run(mc_infer *inf, const mc_ppl_config *c, const int32_t *ids, size_t n,
                     mc_ppl_stats *s, mc_ppl_progress cb, void *cb_ctx, mc_error *err);

/* Megatron's samples (mc-train's validation): samples first .. first +
 * count - 1 of split `split` of the GPT dataset dc (count -1: all of them),
 * each seq_length + 1 ids read from the dataset's shuffled sample index,
 * every target scored; the mean is mc-train's validation loss on the same
 * samples. */
mc_status mc_ppl_run_gptdata(mc_infer *inf, const mc_gptdata_config *dc, mc_split split,
                             int64_t first, int64_t count, mc_ppl_stats *s, mc_ppl_progress cb,
                             void *cb_ctx, mc_error *err);

/* The ids of one split of the indexed dataset `prefix` (its documents
 * [round(b N), round(e N)) under the split weights "A,B,C", as mc-train and
 * Megatron split them), documents back to back in their order, appended to
 * out; split -1 takes every document. *ndocs gets the documents read. */
mc_status mc_eval_dataset_ids(const char *prefix, const char *split_weights, int split, mc_ids *out,
                              int64_t *ndocs, mc_error *err);

/* ------------------------------------------------------------ tasks
 * (lib/eval/tasks.c)
 *
 * lm-evaluation-harness's zero-shot tasks from local JSONL files, one
 * document a line, with its preprocessing and scoring (mc-eval(1) gives
 * every rule and the JSONL schema of each task). Each document becomes
 * (context, continuation) requests; a request is scored as the harness's
 * Hugging Face model does: trailing whitespace of the context moves to the
 * continuation, the continuation's ids are encode(context + continuation)
 * past the length of encode(context) (an empty context is the
 * end-of-document id), the input is context + continuation minus its last
 * id, cut from the left to ctx ids, and the log-likelihood is the sum of
 * log p over the continuation's ids; greedy when every continuation id is
 * its position's argmax. */
typedef enum mc_task_kind {
    MC_TASK_LAMBADA = 0, /* lambada_openai: acc, perplexity */
    MC_TASK_HELLASWAG,   /* hellaswag: acc, acc_norm */
    MC_TASK_ARC,         /* arc_easy, arc_challenge: acc, acc_norm */
    MC_TASK_PIQA,        /* piqa: acc, acc_norm */
    MC_TASK_MC           /* multiple_choice (mc's generic schema): acc, acc_norm */
} mc_task_kind;

/* Task names: lambada_openai, hellaswag, arc_easy, arc_challenge, piqa,
 * multiple_choice; MC_ERR_USAGE naming them otherwise. */
mc_status mc_task_kind_parse(const char *name, mc_task_kind *out, mc_error *err);
const char *const *mc_task_names(void); /* NULL-terminated */

typedef struct mc_task_result {
    int64_t docs;                     /* documents scored */
    int64_t requests;                 /* log-likelihood requests run */
    double acc, acc_stderr;           /* acc_stderr: the harness's mean_stderr */
    double acc_norm, acc_norm_stderr; /* multiple choice only, else NAN */
    double perplexity;                /* lambada only: exp(-mean log-likelihood), else NAN */
    double mean_ll;                   /* mean log-likelihood of the gold continuation */
} mc_task_result;

/* Called after each document (0-based `doc`): the log-likelihood of each
 * choice and whether it is greedy, the gold index, and the choices picked
 * by acc and acc_norm (lambada: one choice, pred = pred_norm = 0). */
typedef void (*mc_task_doc_fn)(void *ctx, int64_t doc, int64_t docs, int nchoices,
                               const double *lls, const int *greedy, int gold, int pred,
                               int pred_norm);

/* Run task `kind` on the JSONL file `path` (limit > 0: its first limit
 * documents) with windows of ctx ids; cb (may be NULL) hears of each
 * document. A malformed line is MC_ERR_FORMAT "PATH:LINE: what", every
 * line checked before any is scored; the tokenizer must have an
 * end-of-document id for an empty context. */
mc_status mc_task_run(mc_infer *inf, const mc_tokenizer *tok, mc_task_kind kind, const char *path,
                      int64_t limit, int ctx, mc_task_result *res, mc_task_doc_fn cb, void *cb_ctx,
                      mc_error *err);

/* The harness's text helpers, exposed for tests: Python's str.strip(),
 * str.capitalize() (first character title-cased, the rest lower-cased,
 * simple case mappings) and hellaswag's preprocess(); results malloc'd. */
char *mc_task_py_strip(const char *s);
char *mc_task_py_capitalize(const char *s);
char *mc_task_hellaswag_preprocess(const char *s);

/* ------------------------------------------------------------ generation
 * (lib/eval/generate.c)
 *
 * Sampling, in Hugging Face's order: temperature, then top-k, then top-p
 * (the smallest set of most likely tokens whose probability reaches p),
 * then a draw from what is left; temperature 0 is greedy (the first largest
 * logit). Only ids below vocab_size are candidates (never Megatron's
 * padding). Draws come from a counter-based generator keyed by (seed,
 * stream, step): prompt k of a run is stream k, so its text depends on
 * neither what the other prompts are, the thread count nor the grid. */
typedef struct mc_gen_config {
    int max_new_tokens;
    double temperature; /* 0: greedy */
    int top_k;          /* 0: off */
    double top_p;       /* 1: off */
    uint64_t seed;
    int32_t eod;        /* stop after generating it; -1: never */
    int64_t vocab_size; /* candidates [0, vocab_size) */
    int no_cache;       /* recompute the whole sequence for every token (tests, timing) */
} mc_gen_config;

void mc_gen_config_init(mc_gen_config *c); /* greedy, 64 tokens, top_p 1, seed 1234 */

typedef enum mc_gen_stop {
    MC_GEN_STOP_EOD = 0,    /* the end-of-document id was generated (kept in out) */
    MC_GEN_STOP_LENGTH = 1, /* max_new_tokens generated */
    MC_GEN_STOP_CONTEXT = 2 /* the context is full */
} mc_gen_stop;
const char *mc_gen_stop_name(mc_gen_stop s); /* "eod", "length", "context" */

/* One id from the logits of the whole (padded) vocabulary; scratch must
 * hold vocab_size floats and vocab_size ints. */
int32_t mc_sample(const mc_gen_config *c, const float *logits, uint64_t stream, uint64_t step,
                  float *scratch, int32_t *idx);

/* Continue prompt[0..n) (n >= 1, at most the context's capacity - 1) by up
 * to max_new_tokens ids, appended to out. */
mc_status mc_generate(mc_infer *inf, const mc_gen_config *c, uint64_t stream, const int32_t *prompt,
                      size_t n, mc_ids *out, mc_gen_stop *stop, mc_error *err);

/* ------------------------------------------------------------ an evaluation run
 * (lib/eval/run.c)
 *
 * mc-eval's work for any front end: a checkpoint's model loaded for
 * inference on a tensor-parallel grid, then perplexity, tasks and
 * generation run on it, each returning its result and adding it to one
 * JSON document (its fields in mc-eval(1)). Every rank of the grid calls
 * the same functions with the same configuration; errors every rank meets
 * while opening are agreed (mc_grid_status_all), so all return the same. The
 * caller prints: results and callbacks tell it what happened. Messages
 * name mc-eval's options (--ctx-size, --add-bos, ...). */

typedef struct mc_eval_task {
    const char *name; /* the key of its results */
    const char *file; /* the JSONL file */
    mc_task_kind kind;
} mc_eval_task;

typedef struct mc_eval_config {
    /* the model */
    const char *ckpt; /* mc_ckpt_open's path */
    int ctx;          /* the context; 0: the checkpoint's seq_length */
    int threads;      /* CPU threads; 0: the cores present */
    int cuda;         /* 1: the CUDA backend (--device cuda), GPU of the local rank */
    int bf16;         /* bf16 GEMMs with fp32 accumulation */
    int weights;      /* 0: fp32, 1: int8 codes; -1 (default): int8 when the checkpoint
                       * stores its first linear weight as int8 */
    /* perplexity of data_path (an indexed dataset) or text_file */
    const char *data_path, *text_file;
    const char *split; /* the dataset's split weights; NULL: 969,30,1 */
    int eval_split;    /* an mc_split; -1 (default): every document */
    mc_ppl_mode mode;
    int stride;             /* sliding; 0: ctx / 2 */
    int64_t chunks;         /* windows at most; 0: all */
    int64_t eval_samples;   /* samples: the first N; 0: all of one epoch */
    const char *data_cache; /* samples: the dataset's index cache */
    int add_bos;            /* the BOS id before the text and each prompt */
    int bos_id;             /* -1 (default): the end-of-document id */
    uint64_t seed;          /* of the samples' order and of sampling (1234) */
    /* packed documents in the perplexity's windows and samples, as
     * mc-train's options (model.h "packed documents"); the end-of-document
     * id is the tokenizer's, else the vocabulary's last */
    int reset_position_ids, reset_attention_mask, eod_mask_loss;
    /* tasks */
    const mc_eval_task *tasks;
    size_t ntasks;
    int64_t limit;   /* each task's first documents; 0: all */
    int log_samples; /* each document's scores in the document */
    /* generation: the lines of prompt_file ("-": stdin; empty lines
     * skipped), then prompts[0..nprompts) */
    const char *prompt_file;
    const char *const *prompts;
    size_t nprompts;
    mc_gen_config gen; /* seed, eod and vocab_size come from the run */
} mc_eval_config;

void mc_eval_config_init(mc_eval_config *c);

typedef struct mc_eval mc_eval;

/* What mc_eval_open loaded. */
typedef struct mc_eval_info {
    const char *checkpoint; /* the iteration directory */
    int64_t iteration;
    int64_t parameters; /* the whole model's */
    int ctx;            /* the context in use */
    int int8;           /* the linear layers run on int8 codes */
    const char *note;   /* NULL, or a line for the log: bf16 is emulated */
    const char *blas_note; /* NULL, or a line for the log: OpenBLAS below the CPU path */
    size_t nprompts;    /* prompts to continue */
} mc_eval_info;

/* Open the checkpoint c->ckpt: its configuration, its tokenizer (when text
 * is involved: text_file, tasks, prompts; or add_bos), the prompts, then
 * the model and one inference context of ctx positions on the grid g
 * (NULL: one process). Collective over g. c must outlive the run. */
mc_status mc_eval_open(const mc_eval_config *c, const mc_grid *g, mc_eval **out, mc_error *err);
void mc_eval_free(mc_eval *ev); /* NULL is allowed */
const mc_eval_info *mc_eval_get_info(const mc_eval *ev);
/* The document of the results so far (owned by ev). */
json_t *mc_eval_doc(mc_eval *ev);

typedef struct mc_eval_ppl {
    mc_ppl_stats s;
    int64_t documents; /* of the dataset; -1 for a text or samples */
    double seconds;
} mc_eval_ppl;

/* Perplexity of c->data_path or c->text_file under c->mode; cb (may be
 * NULL) hears of each window. Adds "perplexity" to the document. */
mc_status mc_eval_perplexity(mc_eval *ev, mc_ppl_progress cb, void *cb_ctx, mc_eval_ppl *res,
                             mc_error *err);

/* Task i of c->tasks; cb (may be NULL) hears of each document. Adds the
 * task under "tasks" (with c->log_samples, each document's scores). */
mc_status mc_eval_run_task(mc_eval *ev, size_t i, mc_task_doc_fn cb, void *cb_ctx,
                           mc_task_result *res, mc_error *err);

typedef struct mc_eval_gen {
    size_t prompts; /* continued */
    int64_t tokens; /* generated */
    double seconds;
} mc_eval_gen;

/* Called with each prompt and its continuation's text (without the
 * end-of-document token) as it is made; an error stops the run. */
typedef mc_status (*mc_eval_text_fn)(void *ctx, const char *prompt, const char *text, size_t len,
                                     mc_error *err);

/* Continue every prompt (c->gen, seeded by c->seed; prompt k is stream k).
 * Adds "generations" to the document. */
mc_status mc_eval_generate(mc_eval *ev, mc_eval_text_fn cb, void *cb_ctx, mc_eval_gen *res,
                           mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
