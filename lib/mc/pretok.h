/*
 * pretok.h - pre-tokenization: splitting text into the pieces that BPE then
 * encodes one at a time, with a PCRE2 (JIT) regular expression.
 *
 * Text is split first into maximal runs of valid UTF-8 and maximal runs of
 * invalid bytes. Each valid run is matched against the pattern (as Hugging
 * Face tokenizers and tiktoken do for a str); unmatched stretches between
 * matches become pieces too (as HF's Split with behavior "Isolated" does).
 * Each run of invalid bytes is one piece of its own, so byte-level BPE still
 * encodes every byte and decoding gives the original bytes back.
 */
#ifndef MC_PRETOK_H
#define MC_PRETOK_H

#include <stddef.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPT-2's pattern (also HF ByteLevel's use_regex=true). */
extern const char MC_PATTERN_GPT2[];
/* Llama-3 / tiktoken cl100k_base's pattern. */
extern const char MC_PATTERN_LLAMA3[];
/* Megatron's TikTokenizer patterns ("v1" and "v2"). */
extern const char MC_PATTERN_TIKTOKEN_V1[];
extern const char MC_PATTERN_TIKTOKEN_V2[];

/* "gpt2", "llama3", "tiktoken-v1", "tiktoken-v2" -> pattern; NULL if unknown. */
const char *mc_pattern_by_name(const char *name);

typedef struct mc_pretok mc_pretok;           /* compiled, shared by threads */
typedef struct mc_pretok_iter mc_pretok_iter; /* per-thread match state */

mc_status mc_pretok_new(const char *pattern, mc_pretok **out, mc_error *err);
void mc_pretok_free(mc_pretok *p);
mc_status mc_pretok_iter_new(const mc_pretok *p, mc_pretok_iter **out, mc_error *err);
void mc_pretok_iter_free(mc_pretok_iter *it);

/* Called for each piece in order; a non-zero return stops the split and is
 * reported as MC_ERR_INTERNAL unless fn set err itself. */
typedef int (*mc_piece_fn)(void *ctx, const char *piece, size_t len);

mc_status mc_pretok_split(mc_pretok_iter *it, const char *text, size_t len, mc_piece_fn fn,
                          void *ctx, mc_error *err);

/* Length of the valid UTF-8 prefix of s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
size_t mc_utf8_valid_prefix(const char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif
