/*
 * mc-preprocess - text and JSONL in, Megatron indexed datasets out.
 *
 * Four modes, chosen by option:
 *   (default)          tokenize inputs into PREFIX_<key>_document.{bin,idx}
 *   --train-tokenizer  learn a byte-level BPE and write tokenizer.json
 *   --merge            concatenate datasets (Megatron's merge_datasets.py)
 *   --inspect PREFIX   print a dataset's counts, or one document's text
 * This file only parses options, reports progress and calls libmc.
 * stdout carries exactly one line per artifact (its path or prefix), so the
 * tool composes in pipelines; everything else goes to stderr.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mc/file.h"
#include "mc/bpe_train.h"
#include "mc/docsource.h"
#include "mc/indexed.h"
#include "mc/json.h"
#include "mc/log.h"
#include "mc/opt.h"
#include "mc/preprocess.h"
#include "mc/pretok.h"
#include "mc/sft.h"
#include "mc/tokenizer.h"
#include "mc/tool.h"

static const char PROG[] = "mc-preprocess";

enum {
    OPT_INPUT = 256,
    OPT_INPUT_FORMAT,
    OPT_LINES,
    OPT_JSON_KEYS,
    OPT_OUTPUT_PREFIX,
    OPT_TOKENIZER_TYPE,
    OPT_TOKENIZER_MODEL,
    OPT_VOCAB_FILE,
    OPT_MERGE_FILE,
    OPT_VOCAB_SIZE,
    OPT_TIKTOKEN_PATTERN,
    OPT_TIKTOKEN_NUM_SPECIAL,
    OPT_TIKTOKEN_SPECIAL,
    OPT_APPEND_EOD,
    OPT_WORKERS,
    OPT_LOG_INTERVAL,
    OPT_SKIP_INVALID,
    OPT_MAX_DOC_BYTES,
    OPT_TRAIN_TOKENIZER,
    OPT_OUTPUT,
    OPT_TOKENIZER_PATTERN,
    OPT_SPECIAL_TOKENS,
    OPT_MIN_FREQUENCY,
    OPT_MERGE,
    OPT_INSPECT,
    OPT_SHOW,
    OPT_QUIET,
    OPT_PARTITIONS,
    OPT_KEEP_SEQUENTIAL,
    OPT_DATASET_TYPE,
    OPT_CHAT_TEMPLATE,
    OPT_CHAT_TEMPLATE_KWARGS,
    OPT_TRAIN_ON_PROMPT
};

static const mc_option options[] = {
    {"input", MC_OPT_REQUIRED, OPT_INPUT, "FILE",
     "Input file, glob or '-' for stdin (repeatable; bare arguments are inputs too). "
     "Names ending in .zst are decompressed."},
    {"input-format", MC_OPT_REQUIRED, OPT_INPUT_FORMAT, "FMT",
     "jsonl (default) or text (one document per file, or per line with --lines)."},
    {"lines", MC_OPT_NONE, OPT_LINES, NULL, "With --input-format text: one document per line."},
    {"json-keys", MC_OPT_REQUIRED, OPT_JSON_KEYS, "KEYS",
     "JSON keys to tokenize, comma-separated or repeated (default: text); each writes "
     "PREFIX_<key>_document."},
    {"output-prefix", MC_OPT_REQUIRED, OPT_OUTPUT_PREFIX, "PREFIX",
     "Output prefix: writes PREFIX_<key>_document.bin and .idx."},
    {"tokenizer-type", MC_OPT_REQUIRED, OPT_TOKENIZER_TYPE, "TYPE",
     "HuggingFaceTokenizer, GPT2BPETokenizer, TikTokenizer or NullTokenizer."},
    {"tokenizer-model", MC_OPT_REQUIRED, OPT_TOKENIZER_MODEL, "FILE",
     "tokenizer.json (HuggingFaceTokenizer) or tiktoken rank file (TikTokenizer)."},
    {"vocab-file", MC_OPT_REQUIRED, OPT_VOCAB_FILE, "FILE", "vocab.json (GPT2BPETokenizer)."},
    {"merge-file", MC_OPT_REQUIRED, OPT_MERGE_FILE, "FILE", "merges.txt (GPT2BPETokenizer)."},
    {"vocab-size", MC_OPT_REQUIRED, OPT_VOCAB_SIZE, "N",
     "NullTokenizer: number of ids (EOD is N); --train-tokenizer: size to learn."},
    {"tiktoken-pattern", MC_OPT_REQUIRED, OPT_TIKTOKEN_PATTERN, "v1|v2",
     "TikTokenizer pre-tokenizer pattern (default v2)."},
    {"tiktoken-num-special-tokens", MC_OPT_REQUIRED, OPT_TIKTOKEN_NUM_SPECIAL, "N",
     "TikTokenizer: ids reserved for special tokens before the ranks (default 1000)."},
    {"tiktoken-special-tokens", MC_OPT_REQUIRED, OPT_TIKTOKEN_SPECIAL, "LIST",
     "TikTokenizer: comma-separated special tokens (default <unk>,<s>,</s>)."},
    {"append-eod", MC_OPT_NONE, OPT_APPEND_EOD, NULL,
     "Append the end-of-document token to every document."},
    {"workers", MC_OPT_REQUIRED, OPT_WORKERS, "N",
     "Tokenizing threads (default: the cores present). The output is identical for any N."},
    {"log-interval", MC_OPT_REQUIRED, OPT_LOG_INTERVAL, "N",
     "When stderr is not a terminal, log progress every N documents (default 100000)."},
    {"skip-invalid", MC_OPT_NONE, OPT_SKIP_INVALID, NULL,
     "Skip malformed records (bad JSON, missing key, non-string value, empty document) "
     "and count them, instead of failing."},
    {"max-document-bytes", MC_OPT_REQUIRED, OPT_MAX_DOC_BYTES, "SIZE",
     "Longest record accepted, bounding memory (default 64M)."},
    {"train-tokenizer", MC_OPT_NONE, OPT_TRAIN_TOKENIZER, NULL,
     "Learn a byte-level BPE from the inputs and write --output tokenizer.json."},
    {"output", MC_OPT_REQUIRED, OPT_OUTPUT, "FILE",
     "--train-tokenizer: the tokenizer.json to write."},
    {"tokenizer-pattern", MC_OPT_REQUIRED, OPT_TOKENIZER_PATTERN, "NAME",
     "--train-tokenizer: pre-tokenizer gpt2 (default) or llama3."},
    {"special-tokens", MC_OPT_REQUIRED, OPT_SPECIAL_TOKENS, "LIST",
     "--train-tokenizer: comma-separated special tokens (default <|endoftext|>)."},
    {"min-frequency", MC_OPT_REQUIRED, OPT_MIN_FREQUENCY, "N",
     "--train-tokenizer: never merge a pair seen fewer than N times (default 2)."},
    {"merge", MC_OPT_NONE, OPT_MERGE, NULL,
     "Concatenate the dataset prefixes given as arguments into --output-prefix."},
    {"inspect", MC_OPT_REQUIRED, OPT_INSPECT, "PREFIX", "Print a dataset's counts and lengths."},
    {"show", MC_OPT_REQUIRED, OPT_SHOW, "N",
     "With --inspect: print document N (0-based), detokenized when a tokenizer is given, "
     "else as ids."},
    {"dataset-type", MC_OPT_REQUIRED, OPT_DATASET_TYPE, "text|sft|preference",
     "text (default): documents; sft: JSONL conversations ({\"messages\": [...]}) rendered "
     "with the chat template into PREFIX_messages_document and its _loss_mask; preference: "
     "JSONL {\"prompt\"|\"messages\", \"chosen\", \"rejected\"} into "
     "PREFIX_chosen_document and PREFIX_rejected_document, each with its _loss_mask."},
    {"chat-template", MC_OPT_REQUIRED, OPT_CHAT_TEMPLATE, "FILE",
     "With sft or preference: the Jinja chat template, or a tokenizer_config.json holding one "
     "(default: the "
     "tokenizer_config.json beside --tokenizer-model)."},
    {"chat-template-kwargs", MC_OPT_REQUIRED, OPT_CHAT_TEMPLATE_KWARGS, "JSON",
     "With sft or preference: more template variables, a JSON object (e.g. "
     "'{\"enable_thinking\": false}')."},
    {"train-on-prompt", MC_OPT_NONE, OPT_TRAIN_ON_PROMPT, NULL,
     "With sft: the loss mask keeps every token, not only the assistant's."},
    {"quiet", MC_OPT_NONE, OPT_QUIET, NULL, "No progress or summary on stderr."},
    {"partitions", MC_OPT_REQUIRED, OPT_PARTITIONS, "N",
     "Accepted for Megatron compatibility and ignored: mc streams the input on --workers threads."},
    {"keep-sequential-samples", MC_OPT_NONE, OPT_KEEP_SEQUENTIAL, NULL,
     "Accepted for Megatron compatibility and ignored: mc always keeps the input order."},
    {NULL, 0, 0, NULL, NULL},
};

typedef struct args {
    mc_buf inputs; /* string lists (mc_buf_strs) */
    mc_docsource_config source;
    mc_buf keys;
    const char *output_prefix;
    int have_tokenizer;
    mc_tokenizer_spec tok;
    mc_buf tik_special;
    int64_t vocab_size;
    int append_eod;
    int64_t workers;
    int64_t log_interval;
    int skip_invalid;
    int train_tokenizer;
    const char *output;
    const char *pattern;
    mc_buf special;
    int64_t min_frequency;
    int merge;
    const char *inspect;
    int64_t show;
    int quiet;
    int sft;                     /* --dataset-type sft */
    const char *chat_template;   /* --chat-template */
    const char *template_kwargs; /* --chat-template-kwargs */
    int train_on_prompt;
    int exit_now; /* --help or --version was printed */
} args;

static const mc_choice dataset_types[] = {{"text", 0}, {"sft", 1}, {"preference", 2}, {NULL, 0}};

static const mc_choice input_formats[] = {
    {"jsonl", MC_INPUT_JSONL},
    {"json", MC_INPUT_JSONL},
    {"text", MC_INPUT_TEXT},
    {NULL, 0},
};
static const mc_choice tiktoken_patterns[] = {{"v1", 1}, {"v2", 2}, {NULL, 0}};

static mc_status parse_args(mc_cli *cli, args *a, mc_error *err)
{
    const char *arg;
    int key;
    int tok_kind_set = 0;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0 || key == MC_CLI_END) {
        if (key == MC_CLI_END) break;
        mc_status st = MC_OK;
        uint64_t sz;
        int v;
        switch (key) {
        case OPT_INPUT: st = mc_buf_push_str(&a->inputs, arg, err); break;
        case OPT_INPUT_FORMAT:
            st = mc_parse_choice("--input-format", NULL, arg, input_formats, &v, err);
            if (!st) a->source.format = (mc_input_format)v;
            break;
        case OPT_LINES: a->source.lines = 1; break;
        case OPT_JSON_KEYS: st = mc_buf_push_split(&a->keys, (char *)arg, ",", err); break;
        case OPT_OUTPUT_PREFIX: a->output_prefix = arg; break;
        case OPT_TOKENIZER_TYPE: {
            mc_tokenizer_kind k;
            st = mc_tokenizer_kind_parse(arg, &k, err);
            if (st == MC_OK) {
                /* the spec's defaults do not depend on the kind (main sets
                 * them), so options given before --tokenizer-type stay */
                a->tok.kind = k;
                tok_kind_set = 1;
            }
            break;
        }
        case OPT_TOKENIZER_MODEL: a->tok.model = arg; break;
        case OPT_VOCAB_FILE: a->tok.vocab_file = arg; break;
        case OPT_MERGE_FILE: a->tok.merge_file = arg; break;
        case OPT_VOCAB_SIZE:
            st = mc_parse_i64("--vocab-size", arg, 1, INT32_MAX, &a->vocab_size, err);
            break;
        case OPT_TIKTOKEN_PATTERN:
            st = mc_parse_choice("--tiktoken-pattern", NULL, arg, tiktoken_patterns, &v, err);
            a->tok.tiktoken_pattern = arg;
            break;
        case OPT_TIKTOKEN_NUM_SPECIAL:
            st = mc_parse_i64("--tiktoken-num-special-tokens", arg, 0, 1000000,
                              &a->tok.tiktoken_num_special_tokens, err);
            break;
        case OPT_TIKTOKEN_SPECIAL:
            st = mc_buf_push_split(&a->tik_special, (char *)arg, ",", err);
            break;
        case OPT_APPEND_EOD: a->append_eod = 1; break;
        case OPT_WORKERS: st = mc_parse_i64("--workers", arg, 1, 1024, &a->workers, err); break;
        case OPT_LOG_INTERVAL:
            st = mc_parse_i64("--log-interval", arg, 1, INT64_MAX, &a->log_interval, err);
            break;
        case OPT_SKIP_INVALID: a->skip_invalid = 1; break;
        case OPT_MAX_DOC_BYTES:
            st = mc_parse_size("--max-document-bytes", arg, &sz, err);
            if (st == MC_OK && sz == 0)
                st = mc_error_set(err, MC_ERR_USAGE, "--max-document-bytes: must be positive");
            a->source.max_record_bytes = sz;
            break;
        case OPT_TRAIN_TOKENIZER: a->train_tokenizer = 1; break;
        case OPT_OUTPUT: a->output = arg; break;
        case OPT_TOKENIZER_PATTERN:
            a->pattern = mc_pattern_by_name(arg);
            if (!a->pattern)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "--tokenizer-pattern: expected gpt2, llama3, tiktoken-v1 or "
                                  "tiktoken-v2, got '%s'",
                                  arg);
            break;
        case OPT_SPECIAL_TOKENS: st = mc_buf_push_split(&a->special, (char *)arg, ",", err); break;
        case OPT_MIN_FREQUENCY:
            st = mc_parse_i64("--min-frequency", arg, 1, INT64_MAX, &a->min_frequency, err);
            break;
        case OPT_MERGE: a->merge = 1; break;
        case OPT_INSPECT: a->inspect = arg; break;
        case OPT_SHOW: st = mc_parse_i64("--show", arg, 0, INT64_MAX, &a->show, err); break;
        case OPT_QUIET: a->quiet = 1; break;
        case OPT_PARTITIONS: {
            int64_t ignored;
            st = mc_parse_i64("--partitions", arg, 1, INT32_MAX, &ignored, err);
            break;
        }
        case OPT_KEEP_SEQUENTIAL: break;
        case OPT_DATASET_TYPE:
            st = mc_parse_choice("--dataset-type", NULL, arg, dataset_types, &a->sft, err);
            break;
        case OPT_CHAT_TEMPLATE: a->chat_template = arg; break;
        case OPT_CHAT_TEMPLATE_KWARGS: a->template_kwargs = arg; break;
        case OPT_TRAIN_ON_PROMPT: a->train_on_prompt = 1; break;
        default: st = mc_error_set(err, MC_ERR_INTERNAL, "unhandled option %d", key); break;
        }
        if (st != MC_OK) return err->code == MC_OK ? MC_ERR_USAGE : err->code;
    }
    if (key == MC_CLI_EXIT) {
        a->exit_now = 1;
        return MC_OK;
    }
    if (key == MC_CLI_ERROR) return MC_ERR_USAGE;
    for (int i = cli->optind; i < cli->argc; i++)
        if (mc_buf_push_str(&a->inputs, cli->argv[i], err)) return err->code;
    a->have_tokenizer = tok_kind_set;
    return MC_OK;
}

/* ---------------------------------------------------------------- progress */

typedef struct progress {
    int tty;
    int quiet;
    int64_t log_interval;
    uint64_t next_log;
    double last_draw;
} progress;

static void human(char *dst, size_t n, double v, const char *unit)
{
    const char *pre[] = {"", "k", "M", "G", "T"};
    int i = 0;
    while (v >= 1000 && i < 4) {
        v /= 1000;
        i++;
    }
    snprintf(dst, n, i ? "%.1f %s%s" : "%.0f %s%s", v, pre[i], unit);
}

static void on_progress(void *ctx, const mc_preprocess_stats *s, int final)
{
    progress *p = ctx;
    if (p->quiet) return;
    double secs = s->seconds > 1e-9 ? s->seconds : 1e-9;
    char done[32], rate[32], toks[32];
    human(done, sizeof done, (double)s->input_done, "B");
    human(rate, sizeof rate, (double)s->text_bytes / secs, "B/s");
    human(toks, sizeof toks, (double)s->tokens / secs, "tok/s");
    if (final) {
        char ntok[32];
        human(ntok, sizeof ntok, (double)s->tokens, "");
        if (p->tty) fprintf(stderr, "\r\033[K");
        fprintf(stderr, "%s: done: %llu documents, %stokens, %s of input in %.2f s (%s, %s)", PROG,
                (unsigned long long)s->documents, ntok, done, s->seconds, rate, toks);
        if (s->skipped_invalid || s->skipped_empty)
            fprintf(stderr, "; skipped %llu invalid records and %llu empty documents",
                    (unsigned long long)s->skipped_invalid, (unsigned long long)s->skipped_empty);
        fprintf(stderr, "\n");
        return;
    }
    if (p->tty) {
        if (s->seconds - p->last_draw < 0.2) return;
        p->last_draw = s->seconds;
        char eta[32] = "";
        if (s->input_total && s->input_done) {
            double left = s->seconds * ((double)s->input_total / (double)s->input_done - 1.0);
            snprintf(eta, sizeof eta, " ETA %d:%02d", (int)left / 60, (int)left % 60);
            int pct = (int)(100.0 * (double)s->input_done / (double)s->input_total);
            int bar = pct * 20 / 100;
            fprintf(stderr, "\r\033[K[%.*s%*s] %3d%% ", bar, "####################", 20 - bar, "",
                    pct);
        } else {
            fprintf(stderr, "\r\033[K");
        }
        fprintf(stderr, "%s %llu docs %s %s%s", done, (unsigned long long)s->documents, rate, toks,
                eta);
        fflush(stderr);
    } else if (s->documents >= p->next_log) {
        fprintf(stderr, "%s: processed %llu documents (%s of input, %s, %s)\n", PROG,
                (unsigned long long)s->documents, done, rate, toks);
        while (p->next_log <= s->documents) p->next_log += (uint64_t)p->log_interval;
    }
}

/* ---------------------------------------------------------------- modes */

/* The inputs as the library reads them: files (none: stdin), format, keys. */
static void inputs_config(const args *a, mc_preprocess_config *c)
{
    static const char *const stdin_input[] = {"-"};
    mc_preprocess_config_init(c);
    c->inputs = a->inputs.len ? mc_buf_strs(&a->inputs) : stdin_input;
    c->n_inputs = a->inputs.len ? mc_buf_nstrs(&a->inputs) : 1;
    c->source = a->source;
    c->json_keys = mc_buf_strs(&a->keys);
    c->n_json_keys = mc_buf_nstrs(&a->keys);
    c->skip_invalid = a->skip_invalid;
    c->cancel = mc_interrupt_flag();
}

static mc_status load_tokenizer(args *a, mc_tokenizer **tok, mc_error *err)
{
    if (!a->have_tokenizer)
        return mc_error_set(err, MC_ERR_USAGE, "--tokenizer-type is required (see --help)");
    if (a->tik_special.len) {
        a->tok.tiktoken_special_tokens = mc_buf_strs(&a->tik_special);
        a->tok.n_tiktoken_special_tokens = mc_buf_nstrs(&a->tik_special);
    }
    if (a->tok.kind == MC_TOKENIZER_NULL && !a->vocab_size)
        return mc_error_set(err, MC_ERR_USAGE, "NullTokenizer needs --vocab-size");
    /* TikTokenizer: --vocab-size keeps the first ranks, as Megatron does. */
    if (a->tok.kind == MC_TOKENIZER_NULL || a->tok.kind == MC_TOKENIZER_TIKTOKEN)
        a->tok.vocab_size = a->vocab_size;
    return mc_tokenizer_load(&a->tok, tok, err);
}

static mc_status run_preprocess(args *a, mc_error *err)
{
    if (!a->output_prefix)
        return mc_error_set(err, MC_ERR_USAGE, "--output-prefix is required (see --help)");
    if (!a->sft && (a->chat_template || a->template_kwargs || a->train_on_prompt))
        return mc_error_set(err, MC_ERR_USAGE, "%s applies to --dataset-type sft%s only",
                            a->chat_template     ? "--chat-template"
                            : a->template_kwargs ? "--chat-template-kwargs"
                                                 : "--train-on-prompt",
                            a->train_on_prompt ? "" : " and preference");
    if (a->sft == 2 && a->train_on_prompt)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--train-on-prompt applies to --dataset-type sft only: a preference "
                            "pair compares its answers");
    if (a->sft && (a->keys.len || a->source.format != MC_INPUT_JSONL))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dataset-type %s reads JSONL %s; it takes no --json-keys and no "
                            "--input-format text",
                            a->sft == 2 ? "preference" : "sft",
                            a->sft == 2 ? "preference records" : "conversations (\"messages\")");
    mc_tokenizer *tok = NULL;
    mc_status st = load_tokenizer(a, &tok, err);
    if (st != MC_OK) return st;

    mc_preprocess_config c;
    inputs_config(a, &c);
    c.tokenizer = tok;
    c.append_eod = a->append_eod;
    mc_sft_chat chat = {0};
    json_t *kwargs = NULL;
    mc_sft_render_opts sft = {0};
    if (a->sft) {
        if (a->template_kwargs) {
            st = mc_json_load_buf("--chat-template-kwargs", a->template_kwargs,
                                  strlen(a->template_kwargs), &kwargs, err);
            if (!st && !json_is_object(kwargs))
                st = mc_error_set(err, MC_ERR_USAGE, "--chat-template-kwargs: not a JSON object");
            if (st) err->code = st = MC_ERR_USAGE;
        }
        if (!st) st = mc_sft_chat_load(a->chat_template, a->tok.model, &chat, err);
        if (st) {
            json_decref(kwargs);
            mc_tokenizer_free(tok);
            return st;
        }
        sft = (mc_sft_render_opts){chat.tmpl, chat.bos_token, chat.eos_token, a->train_on_prompt,
                                   kwargs};
        c.sft = &sft;
        c.preference = a->sft == 2;
    }
    c.workers = (int)a->workers;
    c.output_prefix = a->output_prefix;
    progress pr = {isatty(2), a->quiet, a->log_interval, (uint64_t)a->log_interval, 0};
    c.progress = on_progress;
    c.progress_ctx = &pr;

    mc_preprocess_stats stats;
    st = mc_preprocess_run(&c, &stats, err);
    if (st == MC_OK) {
        const char *const *keys = a->keys.len && a->source.format == MC_INPUT_JSONL ? c.json_keys
                                                                                    : NULL;
        size_t n = keys ? c.n_json_keys : 1; /* preference: the chosen dataset's path */
        for (size_t k = 0; k < n && st == MC_OK; k++) {
            char prefix[4096];
            st = mc_dataset_prefix(prefix, sizeof prefix, a->output_prefix,
                                   a->sft == 2 ? "chosen"
                                   : a->sft    ? "messages"
                                   : keys      ? keys[k]
                                               : "text",
                                   err);
            if (st == MC_OK) printf("%s\n", prefix);
        }
    } else if (pr.tty && !a->quiet) {
        fprintf(stderr, "\r\033[K");
    }
    mc_sft_chat_free(&chat);
    json_decref(kwargs);
    mc_tokenizer_free(tok);
    return st;
}

static double seconds_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (b->tv_nsec - a->tv_nsec) * 1e-9;
}

static mc_status run_train_tokenizer(args *a, mc_error *err)
{
    if (!a->output) return mc_error_set(err, MC_ERR_USAGE, "--train-tokenizer needs --output FILE");
    if (!a->vocab_size)
        return mc_error_set(err, MC_ERR_USAGE, "--train-tokenizer needs --vocab-size N");
    mc_bpe_trainer_config tc;
    mc_bpe_trainer_config_init(&tc);
    tc.vocab_size = a->vocab_size;
    if (a->pattern) tc.pattern = a->pattern;
    if (a->special.len) {
        tc.special_tokens = mc_buf_strs(&a->special);
        tc.n_special_tokens = mc_buf_nstrs(&a->special);
    }
    if (a->min_frequency) tc.min_frequency = a->min_frequency;

    mc_status st = mc_check_output_dir(a->output, err);
    if (st != MC_OK) return st;
    mc_bpe_trainer *tr = NULL;
    st = mc_bpe_trainer_new(&tc, &tr, err);
    if (st != MC_OK) return st;

    mc_preprocess_config c;
    inputs_config(a, &c);
    mc_bpe_input_stats in;
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = mc_bpe_trainer_add_inputs(tr, &c, &in, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t merges = 0;
    if (st == MC_OK) st = mc_bpe_trainer_train(tr, &merges, err);
    if (st == MC_OK) st = mc_bpe_trainer_write_json(tr, a->output, err);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    if (st == MC_OK) {
        if (!a->quiet) {
            double rd = seconds_between(&t0, &t1), tr_s = seconds_between(&t1, &t2);
            fprintf(stderr,
                    "%s: done: tokenizer with %lld merges from %llu documents (%.1f MB) "
                    "in %.2f s (counting %.2f s, merging %.2f s)%s\n",
                    PROG, (long long)merges, (unsigned long long)in.documents,
                    (double)in.bytes / 1e6, rd + tr_s, rd, tr_s,
                    in.skipped ? "; some records skipped" : "");
            if (in.skipped)
                fprintf(stderr, "%s: skipped %llu invalid records\n", PROG,
                        (unsigned long long)in.skipped);
            int64_t want = tc.vocab_size - 256 -
                           (int64_t)(tc.special_tokens ? tc.n_special_tokens : 0);
            if (merges < want)
                fprintf(stderr,
                        "%s: warning: the vocabulary has %lld tokens, not %lld: no pair left "
                        "occurs --min-frequency (%lld) times; use more text or --min-frequency 1\n",
                        PROG, (long long)(tc.vocab_size - (want - merges)),
                        (long long)tc.vocab_size, (long long)tc.min_frequency);
        }
        printf("%s\n", a->output);
    }
    mc_bpe_trainer_free(tr);
    return st;
}

static mc_status run_merge(args *a, mc_error *err)
{
    if (!a->output_prefix)
        return mc_error_set(err, MC_ERR_USAGE, "--merge needs --output-prefix PREFIX");
    if (!a->inputs.len)
        return mc_error_set(err, MC_ERR_USAGE, "--merge needs the dataset prefixes to merge");
    mc_status st = mc_idx_merge(mc_buf_strs(&a->inputs), mc_buf_nstrs(&a->inputs), a->output_prefix,
                                err);
    if (st == MC_OK) printf("%s\n", a->output_prefix);
    return st;
}

static mc_status run_inspect(args *a, mc_error *err)
{
    mc_idx x;
    mc_status st = mc_idx_open(a->inspect, &x, err);
    if (st != MC_OK) return st;
    uint64_t n_docs = x.n_doc_idx ? x.n_doc_idx - 1 : 0;
    if (a->show >= 0) {
        if ((uint64_t)a->show >= n_docs) {
            st = mc_error_set(err, MC_ERR_USAGE,
                              "--show %lld: the dataset has %llu documents (0..%llu)",
                              (long long)a->show, (unsigned long long)n_docs,
                              (unsigned long long)(n_docs ? n_docs - 1 : 0));
            mc_idx_close(&x);
            return st;
        }
        mc_tokenizer *tok = NULL;
        if (a->have_tokenizer) st = load_tokenizer(a, &tok, err);
        mc_ids ids = MC_IDS_INIT;
        if (st == MC_OK) st = mc_idx_read_document(&x, (uint64_t)a->show, &ids, err);
        if (st == MC_OK && tok) {
            mc_buf text = MC_BUF_INIT;
            st = mc_decode(tok, ids.v, ids.n, &text, err);
            if (st == MC_OK) fwrite(text.data, 1, text.len, stdout);
            if (st == MC_OK && (text.len == 0 || text.data[text.len - 1] != '\n')) putchar('\n');
            mc_buf_free(&text);
        } else if (st == MC_OK) {
            for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.v[i]);
            putchar('\n');
        }
        mc_ids_free(&ids);
        mc_tokenizer_free(tok);
        mc_idx_close(&x);
        return st;
    }
    uint64_t tokens;
    int64_t mn, mx;
    mc_idx_length_stats(&x, &tokens, &mn, &mx);
    printf("prefix:     %s\n", a->inspect);
    printf("dtype:      %s\n", mc_dtype_name(x.dtype));
    printf("documents:  %llu\n", (unsigned long long)n_docs);
    printf("sequences:  %llu\n", (unsigned long long)x.n_seq);
    printf("tokens:     %llu\n", (unsigned long long)tokens);
    printf("length:     min %lld, mean %.1f, max %lld\n", (long long)mn,
           x.n_seq ? (double)tokens / (double)x.n_seq : 0.0, (long long)mx);
    printf("bin bytes:  %llu\n", (unsigned long long)x.bin.len);
    double h = 0;
    uint64_t distinct = 0;
    st = mc_idx_unigram_entropy(&x, &h, &distinct, err);
    if (st == MC_OK)
        printf("unigram:    %llu distinct ids, entropy %.4f nats/token\n",
               (unsigned long long)distinct, h);
    mc_idx_close(&x);
    return st;
}

int main(int argc, char **argv)
{
    mc_logger lg;
    /* SIGINT/SIGTERM/SIGHUP: the run stops at the next batch or write, its
     * temporaries are removed, then the process dies of the signal (file.h);
     * a file-size limit surfaces as a write error (EFBIG), not a kill */
    mc_tool_start(&lg, PROG, MC_TOOL_INTERRUPT | MC_TOOL_EFBIG);
    mc_error err;
    mc_error_clear(&err);

    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    args a;
    memset(&a, 0, sizeof a);
    a.source.format = MC_INPUT_JSONL;
    a.source.max_record_bytes = 64u << 20;
    a.workers = cores > 0 ? cores : 1;
    a.log_interval = 100000;
    a.show = -1;
    mc_tokenizer_spec_init(&a.tok, MC_TOKENIZER_HUGGINGFACE);

    mc_cli cli;
    mc_status st = mc_cli_init(&cli, PROG, "[OPTION]... [INPUT]...",
                               "Tokenize text or JSONL into Megatron indexed datasets "
                               "(PREFIX_<key>_document.bin/.idx), train a byte-level BPE "
                               "tokenizer, merge or inspect datasets. Prints the path of "
                               "what it wrote on stdout.",
                               options, argc, argv, &err);
    if (st != MC_OK) return mc_log_fail(&lg, &err);
    st = parse_args(&cli, &a, &err);
    if (st == MC_OK && a.exit_now) {
        mc_cli_free(&cli);
        return 0;
    }
    if (st == MC_ERR_USAGE) {
        mc_cli_free(&cli);
        return mc_tool_usage(&lg, &err);
    }
    int modes = a.train_tokenizer + a.merge + (a.inspect != NULL);
    if (st == MC_OK && modes > 1)
        st = mc_error_set(&err, MC_ERR_USAGE,
                          "--train-tokenizer, --merge and --inspect exclude each other");
    if (st == MC_OK) {
        if (a.train_tokenizer)
            st = run_train_tokenizer(&a, &err);
        else if (a.merge)
            st = run_merge(&a, &err);
        else if (a.inspect)
            st = run_inspect(&a, &err);
        else
            st = run_preprocess(&a, &err);
    }
    int rc = mc_tool_exit(&lg, st != MC_OK ? mc_log_fail(&lg, &err) : 0);
    mc_buf_free(&a.inputs);
    mc_buf_free(&a.keys);
    mc_buf_free(&a.tik_special);
    mc_buf_free(&a.special);
    mc_cli_free(&cli);
    return rc;
}
