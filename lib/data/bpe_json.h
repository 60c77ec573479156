/*
 * bpe_json.h - writing a byte-level BPE model as a Hugging Face
 * tokenizer.json, and GPT-2's byte-level alphabet. Private to libmc (the
 * trainer uses it; not installed).
 */
#ifndef MC_BPE_JSON_H
#define MC_BPE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

/* A trained model as the writer sees it: tokens 0..255 are the bytes, token
 * 256+k is made by merge k (merge_l[k], merge_r[k]), the special tokens come
 * after, at 256 + n_merges + i. Token id's bytes: tok_bytes[tok_off[id]],
 * tok_len[id] of them. */
typedef struct mc_bpe_model_view {
    const char *pattern;
    bool gpt2_pattern; /* pattern is MC_PATTERN_GPT2: HF ByteLevel(use_regex) */
    const char *const *special;
    size_t n_special;
    const unsigned char *tok_bytes;
    const size_t *tok_off, *tok_len;
    const int32_t *merge_l, *merge_r;
    int64_t n_merges;
} mc_bpe_model_view;

/* Write it atomically (mc_afile). */
mc_status mc_bpe_json_write(const mc_bpe_model_view *m, const char *path, mc_error *err);

/* GPT-2's bytes_to_unicode: tab[b] is the NUL-terminated UTF-8 string that
 * spells byte b. */
void mc_bpe_bytelevel_table(char tab[256][3]);

#endif
