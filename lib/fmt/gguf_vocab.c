/*
 * gguf_vocab.c - the tokenizer of a checkpoint as llama.cpp's "gpt2" BPE
 * vocabulary: each id's spelling in GPT-2's byte-level alphabet, its token
 * type, the merges as "left right" strings and the pre-tokenizer name
 * (tokenizer.ggml.* in mc-formats(5)). gguf.c writes them.
 *
 * Hugging Face tokenizer.json and GPT-2's vocab.json/merges.txt are read
 * from the bytes the checkpoint stores (their spellings are already
 * byte-level); a TikTokenizer's tokens come from the loaded tokenizer's
 * bytes and its merges are derived from the ranks.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt/gguf_internal.h"
#include "mc/buf.h"
#include "mc/file.h"
#include "mc/json.h"
#include "mc/pretok.h"

/* GPT-2's byte-level alphabet: the printable bytes stand for themselves,
 * the others for U+0100 onwards in byte order. */
static void bytelevel_table(char tab[256][3])
{
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b
                                                                                  : 256 + extra++;
        if (cp < 0x80) {
            tab[b][0] = (char)cp;
            tab[b][1] = 0;
        } else {
            tab[b][0] = (char)(0xc0 | cp >> 6);
            tab[b][1] = (char)(0x80 | (cp & 0x3f));
            tab[b][2] = 0;
        }
    }
}

void mc_gguf_vocab_free(mc_gguf_vocab *v)
{
    for (int64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    for (size_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->type);
    free(v->merges);
}

static mc_status add_merge(mc_gguf_vocab *v, const char *a, size_t na, const char *b, size_t nb,
                           const char *where, mc_error *err)
{
    if (memchr(a, ' ', na) || memchr(b, ' ', nb) || !na || !nb)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: merge %zu has a token with a space or an empty token, which "
                            "GGUF's \"left right\" merges cannot express",
                            where, v->n_merges);
    if (v->n_merges == v->cap_merges) {
        size_t cap = v->cap_merges ? 2 * v->cap_merges : 1024;
        char **m = realloc(v->merges, cap * sizeof *m);
        if (!m) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        v->merges = m;
        v->cap_merges = cap;
    }
    char *s = malloc(na + nb + 2);
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    memcpy(s, a, na);
    s[na] = ' ';
    memcpy(s + na + 1, b, nb);
    s[na + nb + 1] = 0;
    v->merges[v->n_merges++] = s;
    return MC_OK;
}

/* Set id's spelling (raw bytes in the byte-level alphabet when bytelevel). */
static mc_status set_token(mc_gguf_vocab *v, int64_t id, const char *s, size_t len, int bytelevel,
                           const char tab[256][3], int32_t type, mc_error *err)
{
    if (id < 0 || id >= v->n) return MC_OK; /* checked by the caller where it matters */
    char *t = malloc(bytelevel ? 2 * len + 1 : len + 1);
    if (!t) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (bytelevel) {
            const char *u = tab[(unsigned char)s[i]];
            while (*u) t[k++] = *u++;
        } else {
            t[k++] = s[i];
        }
    }
    t[k] = 0;
    free(v->tok[id]);
    v->tok[id] = t;
    v->type[id] = type;
    return MC_OK;
}

/* The pre-tokenizer llama.cpp runs for a regex mc splits with. */
static const char *pre_of(const char *pattern)
{
    if (!strcmp(pattern, MC_PATTERN_GPT2)) return "gpt-2";
    if (!strcmp(pattern, MC_PATTERN_LLAMA3)) return "llama-bpe";
    if (!strcmp(pattern, MC_PATTERN_TIKTOKEN_V2)) return "tekken";
    return NULL;
}

/* tokenizer.json: vocabulary, added tokens, merges, pre-tokenizer. */
static mc_status vocab_hf(mc_gguf_vocab *v, const char *data, size_t len, const char *where,
                          mc_error *err)
{
    json_t *root = NULL;
    mc_status st = mc_json_load_buf(where, data, len, &root, err);
    if (st) return st;
    json_t *model = json_object_get(root, "model");
    json_t *vj = json_object_get(model, "vocab"), *mj = json_object_get(model, "merges");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vj) || !json_is_array(mj)) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: model: GGUF export needs a BPE model with "
                          "vocab and merges",
                          where);
        goto out;
    }
    /* The pre-tokenizer: ByteLevel with its own (GPT-2) regex, or a Split
     * on a regex before a ByteLevel that only maps bytes. */
    json_t *pt = json_object_get(root, "pre_tokenizer");
    const char *ptype = json_string_value(json_object_get(pt, "type"));
    const char *pattern = NULL;
    if (ptype && !strcmp(ptype, "ByteLevel")) {
        pattern = MC_PATTERN_GPT2;
    } else if (ptype && !strcmp(ptype, "Sequence")) {
        json_t *sp = json_array_get(json_object_get(pt, "pretokenizers"), 0);
        json_t *pat = json_object_get(sp, "pattern");
        pattern = json_string_value(json_object_get(pat, "Regex"));
        if (!pattern) pattern = json_string_value(json_object_get(pat, "String"));
    }
    v->pre = pattern ? pre_of(pattern) : NULL;
    if (!v->pre) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: pre_tokenizer: llama.cpp has no pre-tokenizer for this one (mc "
                          "exports the GPT-2 and Llama-3 patterns as \"gpt-2\" and \"llama-bpe\")",
                          where);
        goto out;
    }
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: normalizer: llama.cpp's BPE tokenizer runs "
                          "none, so this tokenizer cannot be exported",
                          where);
        goto out;
    }
    const char *k;
    json_t *val;
    json_object_foreach(vj, k, val)
    {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= v->n) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: model.vocab: token id of \"%s\" is not in [0, %lld)", where, k,
                              (long long)v->n);
            goto out;
        }
        /* already spelled in the byte-level alphabet */
        if ((st = set_token(v, id, k, strlen(k), 0, NULL, TOK_NORMAL, err))) goto out;
    }
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, val)
    {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        if (!content || id < 0 || id >= v->n) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: added_tokens[%zu]: no content or an id not in [0, %lld)", where,
                              i, (long long)v->n);
            goto out;
        }
        int special = json_is_true(json_object_get(val, "special"));
        if ((st = set_token(v, id, content, strlen(content), 0, NULL,
                            special ? TOK_CONTROL : TOK_USER_DEFINED, err)))
            goto out;
    }
    json_array_foreach(mj, i, val)
    {
        char where2[1200];
        snprintf(where2, sizeof where2, "%s: model.merges", where);
        if (json_is_string(val)) {
            const char *s = json_string_value(val), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = mc_error_set(err, MC_ERR_FORMAT, "%s[%zu]: expected \"left right\"", where2,
                                  i);
                goto out;
            }
            st = add_merge(v, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), where2, err);
        } else {
            const char *a = json_string_value(json_array_get(val, 0));
            const char *b = json_string_value(json_array_get(val, 1));
            if (!a || !b) {
                st = mc_error_set(err, MC_ERR_FORMAT, "%s[%zu]: expected [left, right]", where2, i);
                goto out;
            }
            st = add_merge(v, a, strlen(a), b, strlen(b), where2, err);
        }
        if (st) goto out;
    }
out:
    json_decref(root);
    return st;
}

/* GPT2BPETokenizer: vocab.json and merges.txt (GPT-2's regex). */
static mc_status vocab_gpt2(mc_gguf_vocab *v, const mc_tokenizer *tok, const char *vdata,
                            size_t vlen, const char *mdata, size_t mlen, const char *where,
                            mc_error *err)
{
    json_t *root = NULL;
    mc_status st = mc_json_load_buf(where, vdata, vlen, &root, err);
    if (st) return st;
    const char *k;
    json_t *val;
    int32_t eod = mc_tokenizer_eod(tok);
    json_object_foreach(root, k, val)
    {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= v->n) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: vocab: token id of \"%s\" is not in [0, %lld)", where, k,
                              (long long)v->n);
            break;
        }
        if ((st = set_token(v, id, k, strlen(k), 0, NULL, id == eod ? TOK_CONTROL : TOK_NORMAL,
                            err)))
            break;
    }
    json_decref(root);
    v->pre = "gpt-2";
    const char *p;
    size_t n, pos = 0;
    for (size_t line = 1; !st && mc_next_line(mdata, mlen, &pos, &p, &n); line++) {
        if (n && !(line == 1 && n >= 8 && !memcmp(p, "#version", 8))) {
            const char *sp = memchr(p, ' ', n);
            char where2[1200];
            snprintf(where2, sizeof where2, "%s: merges:%zu", where, line);
            if (!sp)
                st = mc_error_set(err, MC_ERR_FORMAT, "%s: expected \"left right\"", where2);
            else
                st = add_merge(v, p, (size_t)(sp - p), sp + 1, n - (size_t)(sp - p) - 1, where2,
                               err);
        }
    }
    return st;
}

/* TikTokenizer: token bytes from the loaded tokenizer; the merges are the
 * ones tiktoken's rank rule implies: the two parts that BPE, allowed only
 * merges of lower rank, leaves of each token (what llama.cpp's converter
 * derives for tiktoken vocabularies). */
typedef struct tkent {
    const char *s;
    size_t len;
    int64_t rank;
} tkent;

static int tk_cmp(const void *a, const void *b)
{
    const tkent *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int64_t tk_rank(const tkent *sorted, size_t n, const char *s, size_t len)
{
    tkent key = {s, len, 0};
    const tkent *e = bsearch(&key, sorted, n, sizeof *e, tk_cmp);
    return e ? e->rank : -1;
}

static mc_status vocab_tiktoken(mc_gguf_vocab *v, const mc_tokenizer *tok, int64_t nspecial,
                                const char *pattern, int need_pre, const char *where, mc_error *err)
{
    char tab[256][3];
    bytelevel_table(tab);
    v->pre = pre_of(pattern);
    if (!v->pre && need_pre)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: llama.cpp has no pre-tokenizer for this TikTokenizer pattern (mc "
                            "exports tiktoken v2 as \"tekken\")",
                            where);
    mc_buf all = MC_BUF_INIT;
    size_t *off = calloc((size_t)v->n + 1, sizeof *off);
    tkent *ents = calloc((size_t)v->n, sizeof *ents);
    mc_status st = off && ents ? MC_OK : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    size_t n_ents = 0;
    for (int64_t id = 0; id < v->n && !st; id++) {
        int32_t i32 = (int32_t)id;
        size_t before = all.len;
        mc_error e2 = {0};
        off[id] = before;
        if (mc_decode(tok, &i32, 1, &all, &e2)) { /* no token: a padding id */
            off[id + 1] = all.len;
            continue;
        }
        off[id + 1] = all.len;
        st = set_token(v, id, all.data + before, all.len - before, id >= nspecial, tab,
                       id < nspecial ? TOK_CONTROL : TOK_NORMAL, err);
    }
    for (int64_t id = nspecial; id < v->n && !st; id++)
        if (v->tok[id]) ents[n_ents++] = (tkent){NULL, off[id + 1] - off[id], id - nspecial};
    for (size_t i = 0; i < n_ents; i++) ents[i].s = all.data + off[ents[i].rank + nspecial];
    if (!st) qsort(ents, n_ents, sizeof *ents, tk_cmp);
    /* by rank: a token's merge must come after those of its parts */
    size_t *cut = NULL;
    for (int64_t id = nspecial; id < v->n && !st; id++) {
        if (!v->tok[id]) continue;
        const char *s = all.data + off[id];
        size_t len = off[id + 1] - off[id], np = len;
        int64_t rank = id - nspecial;
        if (len < 2) continue;
        free(cut);
        cut = malloc((len + 1) * sizeof *cut); /* part k is [cut[k], cut[k+1]) */
        if (!cut) {
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            break;
        }
        for (size_t k = 0; k <= len; k++) cut[k] = k;
        while (np > 2) {
            int64_t best = -1;
            size_t bk = 0;
            for (size_t k = 0; k + 1 < np; k++) {
                int64_t r = tk_rank(ents, n_ents, s + cut[k], cut[k + 2] - cut[k]);
                if (r >= 0 && r < rank && (best < 0 || r < best)) {
                    best = r;
                    bk = k;
                }
            }
            if (best < 0) break;
            memmove(cut + bk + 1, cut + bk + 2, (np - bk - 1) * sizeof *cut);
            np--;
        }
        if (np != 2) continue; /* not reachable by merges: llama.cpp reaches it whole */
        char a[1024], b[1024];
        size_t na = 0, nb = 0;
        for (size_t k = cut[0]; k < cut[1] && na + 3 < sizeof a; k++)
            for (const char *u = tab[(unsigned char)s[k]]; *u; u++) a[na++] = *u;
        for (size_t k = cut[1]; k < cut[2] && nb + 3 < sizeof b; k++)
            for (const char *u = tab[(unsigned char)s[k]]; *u; u++) b[nb++] = *u;
        st = add_merge(v, a, na, b, nb, where, err);
    }
    free(cut);
    free(off);
    free(ents);
    mc_buf_free(&all);
    return st;
}

/* A stored TikTokenizer's pre-tokenizer pattern and special-token count. */
static void tiktoken_meta(json_t *meta, const char **pattern, json_int_t *nspecial)
{
    const char *pname = json_string_value(json_object_get(meta, "tiktoken_pattern"));
    *pattern = mc_pattern_by_name(pname && !strcmp(pname, "v1") ? "tiktoken-v1" : "tiktoken-v2");
    *nspecial = json_integer_value(json_object_get(meta, "tiktoken_num_special_tokens"));
}

mc_status mc_tiktoken_hf_json(mc_ckpt_reader *r, const mc_tokenizer *tok, int64_t n, json_t **out,
                              mc_error *err)
{
    *out = NULL;
    json_t *meta = NULL;
    mc_status st = mc_ckpt_read_json(r, "tokenizer", &meta, err);
    if (st) return st;
    const char *pattern;
    json_int_t nsp;
    tiktoken_meta(meta, &pattern, &nsp);
    json_decref(meta);
    char where[1024];
    snprintf(where, sizeof where, "%s: tokenizer_model", mc_ckpt_file(r));
    mc_gguf_vocab v = {0};
    v.n = n;
    v.tok = calloc((size_t)n, sizeof *v.tok);
    v.type = calloc((size_t)n, sizeof *v.type);
    st = v.tok && v.type ? vocab_tiktoken(&v, tok, nsp, pattern, 0, where, err)
                         : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    json_t *added = json_array(), *vocab = json_object(), *merges = json_array();
    /* The special tokens are in the vocabulary as well: tokenizers gives
     * an added token the vocabulary's id for its content, and one the
     * vocabulary lacks the next free id past it, not the id written here. */
    for (int64_t id = 0; id < n && !st; id++) {
        if (!v.tok[id]) continue;
        if (id < nsp)
            json_array_append_new(added, json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (json_int_t)id, "content", v.tok[id],
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special", 1));
        json_t *had = json_object_get(vocab, v.tok[id]);
        if (had)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: special token %lld '%s' is also token %lld of the ranks: a "
                              "tokenizer.json cannot hold both",
                              where, (long long)json_integer_value(had), v.tok[id], (long long)id);
        else
            json_object_set_new(vocab, v.tok[id], json_integer(id));
    }
    for (size_t i = 0; i < v.n_merges && !st; i++)
        json_array_append_new(merges, json_string(v.merges[i]));
    if (!st) {
        *out = json_pack("{s:s, s:n, s:n, s:o, s:n,"
                         " s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
                         " s:n, s:{s:s, s:b, s:b, s:b},"
                         " s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
                         "version", "1.0", "truncation", "padding", "added_tokens", added,
                         "normalizer", "pre_tokenizer", "type", "Sequence", "pretokenizers", "type",
                         "Split", "pattern", "Regex", pattern, "behavior", "Isolated", "invert", 0,
                         "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex",
                         0, "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 1,
                         "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout",
                         "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                         0, "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab, "merges",
                         merges);
        if (!*out) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    } else {
        json_decref(added);
        json_decref(vocab);
        json_decref(merges);
    }
    mc_gguf_vocab_free(&v);
    return st;
}

/* Read the checkpoint's tokenizer into v (v->n ids: the model's vocab_size). */
mc_status mc_gguf_read_vocab(mc_ckpt_reader *r, const mc_tokenizer *tok, mc_gguf_vocab *v,
                             mc_error *err)
{
    const char *file = mc_ckpt_file(r);
    json_t *meta = NULL;
    mc_status st = mc_ckpt_read_json(r, "tokenizer", &meta, err);
    if (st) return st;
    const char *type = json_string_value(json_object_get(meta, "type"));
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    v->type = calloc((size_t)v->n, sizeof *v->type);
    if (!v->tok || !v->type) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    char where[1024];
    if (st) {
    } else if (type && !strcmp(type, "HuggingFaceTokenizer")) {
        snprintf(where, sizeof where, "%s: tokenizer_model", file);
        st = mc_ckpt_read_tokenizer_file(r, "model", &a, &na, err);
        if (!st) st = vocab_hf(v, a, na, where, err);
    } else if (type && !strcmp(type, "GPT2BPETokenizer")) {
        snprintf(where, sizeof where, "%s: tokenizer_vocab", file);
        st = mc_ckpt_read_tokenizer_file(r, "vocab", &a, &na, err);
        if (!st) st = mc_ckpt_read_tokenizer_file(r, "merges", &b, &nb, err);
        if (!st) st = vocab_gpt2(v, tok, a, na, b, nb, where, err);
    } else if (type && !strcmp(type, "TikTokenizer")) {
        const char *pattern;
        json_int_t nsp;
        tiktoken_meta(meta, &pattern, &nsp);
        snprintf(where, sizeof where, "%s: tokenizer_model", file);
        st = vocab_tiktoken(v, tok, nsp, pattern, 1, where, err);
    } else {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: GGUF needs a BPE tokenizer, and the checkpoint's is %s", file,
                          type ? type : "of no known type");
    }
    free(a);
    free(b);
    json_decref(meta);
    return st;
}
