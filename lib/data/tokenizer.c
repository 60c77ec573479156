/*
 * tokenizer.c - the public tokenizer API: kinds and specs, loading dispatch,
 * encoders, the encode loop over valid/invalid UTF-8 runs, decoding, and
 * Megatron's NullTokenizer.
 *
 * The formats themselves are read in tok_hf.c (tokenizer.json, vocab.json +
 * merges.txt) and tok_tiktoken.c, into the id table of tok_vocab.c; added
 * tokens and normalizers are applied in tok_added.c; segments are cut into
 * pieces and encoded in tok_segment.c; merging is bpe.c's. The calls go one
 * way: none of those files calls back here.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static const struct {
    const char *name;
    mc_tokenizer_kind kind;
} kinds[] = {
    {"HuggingFaceTokenizer", MC_TOKENIZER_HUGGINGFACE},
    {"GPT2BPETokenizer", MC_TOKENIZER_GPT2BPE},
    {"TikTokenizer", MC_TOKENIZER_TIKTOKEN},
    {"NullTokenizer", MC_TOKENIZER_NULL},
};

mc_status mc_tokenizer_kind_parse(const char *name, mc_tokenizer_kind *out, mc_error *err)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (name && !strcmp(name, kinds[i].name)) {
            *out = kinds[i].kind;
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_USAGE,
                        "unknown tokenizer type '%s' (expected HuggingFaceTokenizer, "
                        "GPT2BPETokenizer, TikTokenizer or NullTokenizer)",
                        name ? name : "");
}

const char *mc_tokenizer_kind_name(mc_tokenizer_kind k)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (kinds[i].kind == k) return kinds[i].name;
    return "?";
}

void mc_tokenizer_spec_init(mc_tokenizer_spec *s, mc_tokenizer_kind kind)
{
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->tiktoken_pattern = "v2";
    s->tiktoken_num_special_tokens = 1000;
}

/* ---- loading ---- */

mc_status mc_tokenizer_load(const mc_tokenizer_spec *spec, mc_tokenizer **out, mc_error *err)
{
    *out = NULL;
    mc_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mc_error_set(err, MC_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = spec->kind;
    t->eod = -1;
    mc_status st = MC_OK;
    switch (spec->kind) {
    case MC_TOKENIZER_HUGGINGFACE:
        if (!spec->model)
            st = mc_error_set(err, MC_ERR_USAGE, "HuggingFaceTokenizer needs --tokenizer-model");
        else
            st = mc_tok_load_hf_json(t, spec->model, err);
        break;
    case MC_TOKENIZER_GPT2BPE:
        if (!spec->vocab_file || !spec->merge_file)
            st = mc_error_set(err, MC_ERR_USAGE,
                              "GPT2BPETokenizer needs --vocab-file and --merge-file");
        else
            st = mc_tok_load_gpt2(t, spec->vocab_file, spec->merge_file, err);
        break;
    case MC_TOKENIZER_TIKTOKEN:
        if (!spec->model)
            st = mc_error_set(err, MC_ERR_USAGE, "TikTokenizer needs --tokenizer-model");
        else
            st = mc_tok_load_tiktoken(t, spec, err);
        break;
    case MC_TOKENIZER_NULL:
        if (spec->vocab_size <= 0 || spec->vocab_size >= INT32_MAX)
            st = mc_error_set(err, MC_ERR_USAGE, "NullTokenizer needs --vocab-size N (1..%d)",
                              INT32_MAX - 1);
        t->null_vocab = spec->vocab_size;
        t->vocab_size = spec->vocab_size + 1; /* Megatron counts the EOD id */
        t->eod = (int32_t)spec->vocab_size;
        break;
    default: st = mc_error_set(err, MC_ERR_USAGE, "unknown tokenizer kind %d", (int)spec->kind);
    }
    if (st == MC_OK && t->kind != MC_TOKENIZER_NULL) st = mc_tok_index_added(t, err);
    if (st != MC_OK) {
        mc_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MC_OK;
}

void mc_tokenizer_free(mc_tokenizer *t)
{
    if (!t) return;
    free(t->tok_off);
    free(t->tok_len);
    mc_buf_free(&t->pool);
    mc_strmap_free(&t->spelling);
    mc_strmap_free(&t->bytes);
    mc_bpe_free(t->bpe);
    mc_pretok_free(t->pretok);
    free(t->added);
    free(t->added_order[0]);
    free(t->added_order[1]);
    free(t);
}

int64_t mc_tokenizer_vocab_size(const mc_tokenizer *t) { return t->vocab_size; }

int32_t mc_tokenizer_eod(const mc_tokenizer *t) { return t->eod; }

int32_t mc_tokenizer_token_to_id(const mc_tokenizer *t, const char *token)
{
    size_t len = strlen(token);
    if (t->kind == MC_TOKENIZER_NULL) {
        char *end;
        errno = 0;
        long long v = strtoll(token, &end, 10);
        return (!errno && *token && !*end && v >= 0 && v <= t->null_vocab) ? (int32_t)v : -1;
    }
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && !memcmp(t->pool.data + t->added[i].off, token, len))
            return t->added[i].id;
    return mc_strmap_get(&t->spelling, token, len);
}

/* ---- encoders ---- */

mc_status mc_encoder_new(const mc_tokenizer *t, mc_encoder **out, mc_error *err)
{
    *out = NULL;
    mc_encoder *e = calloc(1, sizeof *e);
    if (!e) return mc_error_set(err, MC_ERR_NOMEM, "encoder: out of memory");
    e->t = t;
    mc_status st = MC_OK;
    if (t->pretok) st = mc_pretok_iter_new(t->pretok, &e->it, err);
    if (st == MC_OK && t->bpe) st = mc_bpe_state_new(t->bpe, &e->bpe, err);
    if (st != MC_OK) {
        mc_encoder_free(e);
        return st;
    }
    *out = e;
    return MC_OK;
}

void mc_encoder_free(mc_encoder *e)
{
    if (!e) return;
    mc_pretok_iter_free(e->it);
    mc_bpe_state_free(e->bpe);
    mc_buf_free(&e->norm);
    mc_buf_free(&e->seg);
    mc_buf_free(&e->piece);
    free(e);
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Megatron's NullTokenizer: the text is the ids. Megatron splits on single
 * spaces; any whitespace run separates here, and every word must be a
 * decimal id in 0..vocab_size (vocab_size is the EOD id). */
static mc_status encode_null(const mc_tokenizer *t, const char *s, size_t len, mc_ids *out,
                             mc_error *err)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && is_space((unsigned char)s[i])) i++;
        if (i == len) break;
        size_t w = i;
        int64_t v = 0;
        int ok = 1;
        while (i < len && !is_space((unsigned char)s[i])) {
            unsigned char c = (unsigned char)s[i++];
            if (c < '0' || c > '9' || v > t->null_vocab)
                ok = 0;
            else
                v = v * 10 + (c - '0');
        }
        if (!ok || v > t->null_vocab) {
            size_t wl = i - w < 40 ? i - w : 40;
            return mc_error_set(err, MC_ERR_FORMAT,
                                "byte %zu: '%.*s' is not a token id (NullTokenizer ids are "
                                "0..%" PRId64 ")",
                                w, (int)wl, s + w, t->null_vocab);
        }
        mc_status st = mc_ids_push(out, (int32_t)v, err);
        if (st != MC_OK) return st;
    }
    return MC_OK;
}

mc_status mc_encode(mc_encoder *e, const char *text, size_t len, mc_ids *out, mc_error *err)
{
    const mc_tokenizer *t = e->t;
    mc_error_clear(err);
    if (t->kind == MC_TOKENIZER_NULL) return encode_null(t, text, len, out, err);
    e->out = out;
    e->err = err;
    /* No added tokens, normalizer or prefix space: the pre-tokenizer alone
     * splits valid and invalid runs in one pass. */
    if (!t->n_added && !t->n_normalizers && t->prefix_space == MC_PREFIX_NONE && e->it)
        return mc_pretok_split(e->it, text, len, mc_tok_encode_piece, e, err);
    /* Otherwise each valid run is encoded as its own text (as HF would
     * encode it) and each invalid run is one byte-level piece. */
    size_t pos = 0;
    while (pos < len) {
        size_t v = mc_utf8_valid_prefix(text + pos, len - pos);
        mc_status st;
        if (v) {
            st = mc_tok_encode_valid(e, text + pos, v);
            pos += v;
        } else {
            size_t bad = 1;
            while (
                pos + bad < len &&
                !mc_utf8_valid_prefix(text + pos + bad, len - pos - bad < 4 ? len - pos - bad : 4))
                bad++;
            st = mc_bpe_encode(e->bpe, text + pos, bad, out, err);
            pos += bad;
        }
        if (st != MC_OK) return st;
    }
    return MC_OK;
}

/* ---- decoding ---- */

mc_status mc_decode(const mc_tokenizer *t, const int32_t *ids, size_t n, mc_buf *out, mc_error *err)
{
    mc_error_clear(err);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (t->kind == MC_TOKENIZER_NULL) {
            if (id < 0 || id > t->null_vocab)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "decode: token id %" PRId32 " at position %zu is out of range "
                                    "(0..%" PRId64 ")",
                                    id, i, t->null_vocab);
            mc_status st = mc_buf_printf(out, err, i ? " %" PRId32 : "%" PRId32, id);
            if (st != MC_OK) return st;
            continue;
        }
        if (id < 0 || (size_t)id >= t->n_ids || t->tok_len[id] == UINT32_MAX)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "decode: token id %" PRId32 " at position %zu is out of range "
                                "(vocabulary has %" PRId64 " ids)",
                                id, i, t->vocab_size);
        mc_status st = mc_buf_append(out, t->pool.data + t->tok_off[id], t->tok_len[id], err);
        if (st != MC_OK) return st;
    }
    return MC_OK;
}
