/*
 * gguf_internal.h - what gguf.c and gguf_vocab.c share (not installed):
 * the tokenizer as llama.cpp's BPE vocabulary.
 */
#ifndef MC_GGUF_INTERNAL_H
#define MC_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "mc/ckpt.h"
#include "mc/status.h"
#include "mc/tokenizer.h"

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5 };

typedef struct mc_gguf_vocab {
    int64_t n;  /* ids: the model's vocab_size (set before reading) */
    char **tok; /* the GGUF spelling of each id; NULL: no token */
    int32_t *type;
    char **merges; /* "left right", byte-level spellings, priority order */
    size_t n_merges, cap_merges;
    const char *pre; /* tokenizer.ggml.pre (static) */
} mc_gguf_vocab;

/* Fill v (v->n set, the rest zero) from the checkpoint's stored tokenizer,
 * tok being that tokenizer loaded. Errors name the checkpoint file. */
mc_status mc_gguf_read_vocab(mc_ckpt_reader *r, const mc_tokenizer *tok, mc_gguf_vocab *v,
                             mc_error *err);
void mc_gguf_vocab_free(mc_gguf_vocab *v);

/* A Hugging Face tokenizer.json for the checkpoint's TikTokenizer (tok: it
 * loaded, n: the model's vocab_size): byte-level BPE with the merges the
 * ranks imply (as for GGUF), ignore_merges (a piece that is a token is
 * taken whole, as tiktoken does), the tiktoken pattern as a Split
 * pre-tokenizer, Megatron's special tokens as added tokens. */
mc_status mc_tiktoken_hf_json(mc_ckpt_reader *r, const mc_tokenizer *tok, int64_t n, json_t **out,
                              mc_error *err);

#endif
