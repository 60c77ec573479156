/*
 * bpe_train.h - learning a byte-level BPE vocabulary from text.
 *
 * Feed documents with mc_bpe_trainer_add (they are pre-tokenized and their
 * pieces counted; the text itself is not kept), then train and write a
 * Hugging Face tokenizer.json. The result is deterministic: the same inputs
 * in the same order give the same file.
 */
#ifndef MC_BPE_TRAIN_H
#define MC_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_bpe_trainer_config {
    int64_t vocab_size;                /* final size, special tokens included */
    const char *pattern;               /* pre-tokenizer regex (MC_PATTERN_GPT2 default) */
    const char *const *special_tokens; /* default: "<|endoftext|>" */
    size_t n_special_tokens;
    int64_t min_frequency; /* pairs seen fewer times are never merged (default 2) */
} mc_bpe_trainer_config;

void mc_bpe_trainer_config_init(mc_bpe_trainer_config *c);

typedef struct mc_bpe_trainer mc_bpe_trainer;

mc_status mc_bpe_trainer_new(const mc_bpe_trainer_config *c, mc_bpe_trainer **out, mc_error *err);
void mc_bpe_trainer_free(mc_bpe_trainer *t);
mc_status mc_bpe_trainer_add(mc_bpe_trainer *t, const char *text, size_t len, mc_error *err);
/* Learn the merges. Returns the number of merges learned in *n_merges: at
 * most vocab_size - 256 - n_special_tokens, fewer when no pair left occurs
 * min_frequency times. Tokens 0..255 are the bytes, 256+k comes from merge k,
 * and the special tokens take the ids right after the last merge (so
 * vocab_size - n_special_tokens .. vocab_size - 1 when the vocabulary is
 * full). Special tokens found in the text are cut out, never learned from. */
mc_status mc_bpe_trainer_train(mc_bpe_trainer *t, int64_t *n_merges, mc_error *err);
/* Write tokenizer.json (atomically). */
mc_status mc_bpe_trainer_write_json(const mc_bpe_trainer *t, const char *path, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
