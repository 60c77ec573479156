/*
 * fuzz_tok.h - what the tokenizer harnesses do with a tokenizer that
 * loaded: encode a fixed text and the input's first bytes, decode them
 * again, and decode the edge ids.
 */
#ifndef MC_FUZZ_TOK_H
#define MC_FUZZ_TOK_H

#include "fuzz.h"
#include "mc/tokenizer.h"

static const char TEXT[] = "Hello world, it's 2024!\n\tcafé  <|endoftext|> 日本語 ...";

static inline void exercise(const mc_tokenizer *t, const uint8_t *d, size_t n)
{
    mc_error err = {0};
    mc_encoder *e = NULL;
    if (mc_encoder_new(t, &e, &err) != MC_OK) return;
    mc_ids ids = {0};
    mc_buf out = MC_BUF_INIT;
    if (mc_encode(e, TEXT, sizeof TEXT - 1, &ids, &err) == MC_OK)
        (void)mc_decode(t, ids.v, ids.n, &out, &err);
    ids.n = 0;
    if (mc_encode(e, (const char *)d, n < 256 ? n : 256, &ids, &err) == MC_OK)
        (void)mc_decode(t, ids.v, ids.n, &out, &err);
    int32_t probe[4] = {0, 1, (int32_t)mc_tokenizer_vocab_size(t) - 1, mc_tokenizer_eod(t)};
    for (int i = 0; i < 4; i++) (void)mc_decode(t, &probe[i], 1, &out, &err);
    (void)mc_tokenizer_token_to_id(t, "<|endoftext|>");
    mc_buf_free(&out);
    mc_ids_free(&ids);
    mc_encoder_free(e);
}

/* A tokenizer of `type` from one file (name: its file name), the input's
 * bytes: loaded and, when it loads, exercised. */
static inline int fuzz_tokenizer_file(mc_tokenizer_kind type, const char *name, const uint8_t *d, size_t n)
{
    const char *path = fuzz_path(0, name);
    fuzz_write(path, d, n);
    mc_tokenizer_spec spec;
    mc_tokenizer_spec_init(&spec, type);
    spec.model = path;
    mc_tokenizer *t = NULL;
    mc_error err = {0};
    if (mc_tokenizer_load(&spec, &t, &err) == MC_OK) exercise(t, d, n);
    mc_tokenizer_free(t);
    return 0;
}

#endif
