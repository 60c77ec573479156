/*
 * preprocess.h - the preprocessing pipeline: documents in, indexed datasets out.
 *
 * Reads records from a docsource in order, tokenizes them on worker threads,
 * and appends them to one indexed dataset per JSON key, in input order, so
 * the output is byte-identical for any number of workers. Memory is bounded
 * by two batches in flight (a batch is at most batch_documents records or
 * batch_bytes of text), never by the size of the corpus.
 */
#ifndef MC_PREPROCESS_H
#define MC_PREPROCESS_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/bpe_train.h"
#include "mc/docsource.h"
#include "mc/tokenizer.h"
#include "mc/sft.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_preprocess_stats {
    uint64_t records;         /* records read, skipped ones included */
    uint64_t documents;       /* documents written (per dataset) */
    uint64_t tokens;          /* tokens written, summed over datasets */
    uint64_t text_bytes;      /* bytes of text tokenized */
    uint64_t input_done;      /* input bytes consumed (compressed for .zst) */
    uint64_t input_total;     /* total input bytes; 0 when unknown (stdin) */
    uint64_t skipped_invalid; /* malformed JSON, missing key, non-string value */
    uint64_t skipped_empty;   /* empty documents */
    double seconds;           /* wall time so far */
} mc_preprocess_stats;

/* Called on the calling thread after each batch is written (final = 0) and
 * once at the end (final = 1). */
typedef void (*mc_progress_fn)(void *ctx, const mc_preprocess_stats *s, int final);

typedef struct mc_preprocess_config {
    const char *const *inputs; /* files, globs, "-" */
    size_t n_inputs;
    mc_docsource_config source;
    const char *const *json_keys; /* JSONL keys (default "text"); text input uses "text" */
    size_t n_json_keys;
    const mc_tokenizer *tokenizer;
    int append_eod;            /* append the tokenizer's EOD id to every document */
    int workers;               /* tokenizing threads, >= 1 */
    int skip_invalid;          /* skip and count bad records instead of failing */
    const char *output_prefix; /* datasets are OUTPUT_PREFIX_<key>_document */
    /* --dataset-type sft: each JSONL record is a conversation, written as
     * OUTPUT_PREFIX_messages_document (tokens, EOD last) and
     * OUTPUT_PREFIX_messages_document_loss_mask (uint8), mc/sft.h; the
     * json_keys are not used. NULL: plain documents. */
    const struct mc_sft_render_opts *sft;
    /* with sft set: each record is a preference pair (mc_pref_encode),
     * written as OUTPUT_PREFIX_chosen_document and
     * OUTPUT_PREFIX_rejected_document, each with its _loss_mask */
    int preference;
    size_t batch_documents; /* 0: default 2048 */
    size_t batch_bytes;     /* 0: default 8 MiB */
    mc_progress_fn progress;
    void *progress_ctx;
    volatile sig_atomic_t *cancel; /* when it becomes non-zero, stop and write nothing */
} mc_preprocess_config;

void mc_preprocess_config_init(mc_preprocess_config *c);

/* Run the pipeline. On success every dataset is in place; on failure none of
 * this run's outputs exists under its final name. */
mc_status mc_preprocess_run(const mc_preprocess_config *c, mc_preprocess_stats *stats,
                            mc_error *err);

/* "PREFIX_KEY_document" into dst (Megatron's naming); MC_ERR_LIMIT if it does
 * not fit. */
mc_status mc_dataset_prefix(char *dst, size_t size, const char *output_prefix, const char *key,
                            mc_error *err);

/* ---- the same inputs teaching a tokenizer (lib/data/bpe_input.c) */

typedef struct mc_bpe_input_stats {
    uint64_t documents; /* records fed */
    uint64_t bytes;     /* bytes of text fed */
    uint64_t skipped;   /* malformed records skipped (skip_invalid) */
} mc_bpe_input_stats;

/* Feed the records of c's inputs (none: stdin) to tr in order: a text
 * record's text, or the value of each of c's json_keys (default "text") of
 * a JSONL record. A record whose values cannot be extracted fails the run
 * with its place, or with skip_invalid is skipped and counted; a non-zero
 * *c->cancel stops it ("interrupted"). Reads inputs, source, json_keys,
 * skip_invalid and cancel of c. */
mc_status mc_bpe_trainer_add_inputs(mc_bpe_trainer *tr, const mc_preprocess_config *c,
                                    mc_bpe_input_stats *s, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
