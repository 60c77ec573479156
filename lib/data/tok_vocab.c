/*
 * tok_vocab.c - the tokenizer's id table, which the loaders (tok_hf.c,
 * tok_tiktoken.c) fill in: the bytes each id decodes to, and the choice of
 * the EOD token among the added tokens.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

mc_status mc_tok_set_token(mc_tokenizer *t, int32_t id, const char *bytes, size_t len,
                           mc_error *err)
{
    if (id < 0) return mc_error_set(err, MC_ERR_FORMAT, "negative token id %" PRId32, id);
    if ((size_t)id >= t->n_ids) {
        size_t n = (size_t)id + 1, cap = t->n_ids ? t->n_ids : 1024;
        while (cap < n) cap *= 2;
        uint32_t *o = realloc(t->tok_off, cap * sizeof *o);
        if (o) t->tok_off = o;
        uint32_t *l = realloc(t->tok_len, cap * sizeof *l);
        if (l) t->tok_len = l;
        if (!o || !l) return mc_error_set(err, MC_ERR_NOMEM, "tokenizer: out of memory");
        for (size_t i = t->n_ids; i < cap; i++) t->tok_len[i] = UINT32_MAX;
        t->n_ids = n;
    }
    if (t->pool.len + len >= UINT32_MAX)
        return mc_error_set(err, MC_ERR_LIMIT, "tokenizer: vocabulary exceeds 4 GiB");
    t->tok_off[id] = (uint32_t)t->pool.len;
    t->tok_len[id] = (uint32_t)len;
    return mc_buf_append(&t->pool, bytes, len, err);
}

void mc_tok_pick_eod(mc_tokenizer *t)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|eot_id|>",
                                        "<eos>"};
    t->eod = -1;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        for (size_t i = 0; i < t->n_added; i++) {
            const mc_added_token *a = &t->added[i];
            if (a->special && a->len == strlen(names[k]) &&
                !memcmp(t->pool.data + a->off, names[k], a->len)) {
                t->eod = a->id;
                return;
            }
        }
}
