/*
 * tokenizer.h - text <-> token ids, with the tokenizers Megatron names.
 *
 *   HuggingFaceTokenizer  a Hugging Face tokenizer.json with a byte-level BPE
 *                         model (GPT-2 or Llama-3 style pre-tokenizer,
 *                         added/special tokens, merges as "a b" or ["a","b"])
 *   GPT2BPETokenizer      vocab.json + merges.txt
 *   TikTokenizer          a tiktoken rank file ("base64 rank" lines), with
 *                         Megatron's special-token offset
 *   NullTokenizer         whitespace-separated integer ids (tests)
 *
 * A loaded mc_tokenizer is read-only and shared by threads; each thread
 * encodes through its own mc_encoder (scratch space and a piece cache).
 * Encoding matches Hugging Face tokenizers' encode(text,
 * add_special_tokens=False) id for id; decoding returns the original bytes.
 */
#ifndef MC_TOKENIZER_H
#define MC_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/buf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_tokenizer_kind {
    MC_TOKENIZER_HUGGINGFACE,
    MC_TOKENIZER_GPT2BPE,
    MC_TOKENIZER_TIKTOKEN,
    MC_TOKENIZER_NULL
} mc_tokenizer_kind;

/* Megatron's --tokenizer-type names; MC_ERR_USAGE for anything else. */
mc_status mc_tokenizer_kind_parse(const char *name, mc_tokenizer_kind *out, mc_error *err);
const char *mc_tokenizer_kind_name(mc_tokenizer_kind k);

typedef struct mc_tokenizer_spec {
    mc_tokenizer_kind kind;
    const char *model;            /* --tokenizer-model: tokenizer.json, or tiktoken rank file */
    const char *vocab_file;       /* --vocab-file (GPT2BPETokenizer) */
    const char *merge_file;       /* --merge-file (GPT2BPETokenizer) */
    const char *tiktoken_pattern; /* "v1" or "v2" (default "v2") */
    int64_t tiktoken_num_special_tokens;        /* default 1000 */
    const char *const *tiktoken_special_tokens; /* default <unk>, <s>, </s> */
    size_t n_tiktoken_special_tokens;
    int64_t vocab_size; /* NullTokenizer: --vocab-size (ids 0..N-1, EOD = N) */
} mc_tokenizer_spec;

/* A spec with Megatron's defaults for the given kind. */
void mc_tokenizer_spec_init(mc_tokenizer_spec *s, mc_tokenizer_kind kind);

typedef struct mc_tokenizer mc_tokenizer;
typedef struct mc_encoder mc_encoder;

mc_status mc_tokenizer_load(const mc_tokenizer_spec *spec, mc_tokenizer **out, mc_error *err);
void mc_tokenizer_free(mc_tokenizer *t);

/* Number of ids, added tokens included (before Megatron's padding). */
int64_t mc_tokenizer_vocab_size(const mc_tokenizer *t);
/* The end-of-document id, or -1 when the tokenizer has none. */
int32_t mc_tokenizer_eod(const mc_tokenizer *t);
/* The id of a token given as its text (added tokens, then the vocabulary, in
 * the vocabulary's own spelling), or -1. */
int32_t mc_tokenizer_token_to_id(const mc_tokenizer *t, const char *token);

mc_status mc_encoder_new(const mc_tokenizer *t, mc_encoder **out, mc_error *err);
void mc_encoder_free(mc_encoder *e);
/* Append the ids of text[0..len) to out. */
mc_status mc_encode(mc_encoder *e, const char *text, size_t len, mc_ids *out, mc_error *err);
/* Append the bytes of ids to out; an id out of range is an error. */
mc_status mc_decode(const mc_tokenizer *t, const int32_t *ids, size_t n, mc_buf *out,
                    mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
