/*
 * tok_hf.c - loading byte-level BPE vocabularies in Hugging Face's formats:
 * tokenizer.json (HuggingFaceTokenizer) and GPT-2's vocab.json + merges.txt
 * (GPT2BPETokenizer).
 *
 * Only what changes the ids of encode(text, add_special_tokens=False) is
 * read: model (BPE: vocab, merges, ignore_merges), added_tokens, normalizer
 * and pre_tokenizer. decoder and post_processor do not change those ids and
 * are ignored. Anything else that would (another model or pre-tokenizer
 * type, dropout, a subword prefix) is refused with the field named, rather
 * than encoded differently from HF.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/file.h"
#include "mc/json.h"
#include "tok_internal.h"

/* Put every vocabulary entry in the id table and the two maps. */
static mc_status load_vocab(mc_tokenizer *t, const char *where, json_t *vocab, mc_error *err)
{
    size_t n = json_object_size(vocab);
    unsigned char *seen = calloc(n ? n : 1, 1);
    if (!seen) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
    mc_buf bytes = MC_BUF_INIT;
    mc_status st = MC_OK;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        size_t klen = strlen(key);
        if (!json_is_integer(val) || json_integer_value(val) < 0) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: token '%s': id is not an integer >= 0",
                              where, key);
            break;
        }
        json_int_t id = json_integer_value(val);
        if ((size_t)id >= n) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: token '%s' has id %" JSON_INTEGER_FORMAT
                              ", but ids must be 0..%zu (one per token)",
                              where, key, id, n - 1);
            break;
        }
        if (seen[id]) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: id %" JSON_INTEGER_FORMAT " is used twice (again by '%s')",
                              where, id, key);
            break;
        }
        seen[id] = 1;
        bytes.len = 0;
        /* A spelling outside the byte-level alphabet cannot come out of
         * BPE; it decodes as its own UTF-8. */
        int mapped = mc_bytelevel_decode(key, klen, &bytes);
        const char *b = mapped ? bytes.data : key;
        size_t blen = mapped ? bytes.len : klen;
        if ((st = mc_strmap_put(&t->spelling, key, klen, (int32_t)id, err)) != MC_OK) break;
        if (mapped && (st = mc_strmap_put(&t->bytes, b, blen, (int32_t)id, err)) != MC_OK) break;
        if ((st = mc_tok_set_token(t, (int32_t)id, b ? b : "", blen, err)) != MC_OK) break;
    }
    free(seen);
    mc_buf_free(&bytes);
    if (st != MC_OK) return st;
    t->vocab_size = (int64_t)n;
    if ((st = mc_bpe_new(&t->bpe, err)) != MC_OK) return st;
    for (unsigned c = 0; c < 256; c++) {
        char ch = (char)c;
        mc_bpe_set_byte(t->bpe, c, mc_strmap_get(&t->bytes, &ch, 1));
    }
    return MC_OK;
}

/* One merge rule "a b" at rank k; `where` names it for errors. */
static mc_status add_merge(mc_tokenizer *t, const char *where, const char *a, size_t alen,
                           const char *b, size_t blen, int32_t rank, mc_buf *tmp, mc_error *err)
{
    int32_t ia = mc_strmap_get(&t->spelling, a, alen);
    if (ia < 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: unknown token '%.*s'", where, (int)alen, a);
    int32_t ib = mc_strmap_get(&t->spelling, b, blen);
    if (ib < 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: unknown token '%.*s'", where, (int)blen, b);
    tmp->len = 0;
    mc_status st = mc_buf_append(tmp, a, alen, err);
    if (st == MC_OK) st = mc_buf_append(tmp, b, blen, err);
    if (st != MC_OK) return st;
    int32_t im = mc_strmap_get(&t->spelling, tmp->data, tmp->len);
    if (im < 0)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: unknown token '%.*s' (the merge of '%.*s' and '%.*s')", where,
                            (int)tmp->len, tmp->data, (int)alen, a, (int)blen, b);
    return mc_bpe_add_merge(t->bpe, ia, ib, rank, im, err);
}

static mc_status load_merges_json(mc_tokenizer *t, const char *path, json_t *merges, mc_error *err)
{
    if (!json_is_array(merges))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: model.merges is not an array", path);
    mc_buf tmp = MC_BUF_INIT;
    mc_status st = MC_OK;
    size_t k;
    json_t *m;
    json_array_foreach(merges, k, m)
    {
        char where[512];
        snprintf(where, sizeof where, "%s: model.merges[%zu]", path, k);
        if (json_is_string(m)) {
            /* "a b": byte-level tokens never hold a plain space. */
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))) {
                st = mc_error_set(err, MC_ERR_FORMAT, "%s: expected \"A B\", got \"%s\"", where, s);
                break;
            }
            st = add_merge(t, where, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp + 1 - s),
                           (int32_t)k, &tmp, err);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            st = add_merge(t, where, json_string_value(a), json_string_length(a),
                           json_string_value(b), json_string_length(b), (int32_t)k, &tmp, err);
        } else {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: expected \"A B\" or [\"A\", \"B\"]", where);
        }
        if (st != MC_OK) break;
    }
    mc_buf_free(&tmp);
    return st;
}

static int get_bool(json_t *obj, const char *key, int dflt)
{
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static mc_status load_model(mc_tokenizer *t, const char *path, json_t *model, mc_error *err)
{
    if (!json_is_object(model)) return mc_error_set(err, MC_ERR_FORMAT, "%s: missing model", path);
    json_t *type = json_object_get(model, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE")))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: model.type: unsupported '%s' (mc reads byte-level BPE only)", path,
                            json_is_string(type) ? json_string_value(type) : "?");
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: model.dropout: BPE dropout is not supported",
                            path);
    static const char *const unsup[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        v = json_object_get(model, unsup[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: model.%s: not supported", path, unsup[i]);
    }
    if (get_bool(model, "byte_fallback", 0))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: model.byte_fallback: not supported", path);
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: missing model.vocab", path);
    char where[512];
    snprintf(where, sizeof where, "%s: model.vocab", path);
    mc_status st = load_vocab(t, where, vocab, err);
    if (st != MC_OK) return st;
    json_t *merges = json_object_get(model, "merges");
    if (!merges) return mc_error_set(err, MC_ERR_FORMAT, "%s: missing model.merges", path);
    if ((st = load_merges_json(t, path, merges, err)) != MC_OK) return st;
    if (get_bool(model, "ignore_merges", 0)) mc_bpe_set_whole(t->bpe, &t->bytes);
    return MC_OK;
}

static mc_status load_added(mc_tokenizer *t, const char *path, json_t *added, mc_error *err)
{
    if (!added || json_is_null(added)) return MC_OK;
    if (!json_is_array(added))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: added_tokens is not an array", path);
    size_t n = json_array_size(added);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(added, i);
        json_t *content = json_object_get(a, "content"), *id = json_object_get(a, "id");
        if (!json_is_string(content) || !json_string_length(content) || !json_is_integer(id) ||
            json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: added_tokens[%zu]: needs a non-empty \"content\" and an "
                                "\"id\" >= 0",
                                path, i);
        mc_added_token *at = &t->added[t->n_added++];
        at->id = (int32_t)json_integer_value(id);
        at->off = (uint32_t)t->pool.len;
        at->len = (uint32_t)json_string_length(content);
        at->special = (unsigned char)get_bool(a, "special", 0);
        at->lstrip = (unsigned char)get_bool(a, "lstrip", 0);
        at->rstrip = (unsigned char)get_bool(a, "rstrip", 0);
        at->single_word = (unsigned char)get_bool(a, "single_word", 0);
        at->normalized = (unsigned char)get_bool(a, "normalized", !at->special);
        /* set_token appends the content to the pool at `off` */
        mc_status st = mc_tok_set_token(t, at->id, json_string_value(content), at->len, err);
        if (st != MC_OK) return st;
    }
    return MC_OK;
}

static mc_status load_normalizer(mc_tokenizer *t, const char *path, json_t *n, int depth,
                                 mc_error *err)
{
    if (!n || json_is_null(n)) return MC_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    static const struct {
        const char *name;
        int code;
    } norms[] = {{"NFC", MC_NORM_NFC},
                 {"NFD", MC_NORM_NFD},
                 {"NFKC", MC_NORM_NFKC},
                 {"NFKD", MC_NORM_NFKD},
                 {"Lowercase", MC_NORM_LOWER}};
    if (type && !strcmp(type, "Sequence") && depth == 0) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *m;
        if (!json_is_array(list))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: normalizer.normalizers is not an array",
                                path);
        json_array_foreach(list, i, m)
        {
            mc_status st = load_normalizer(t, path, m, 1, err);
            if (st != MC_OK) return st;
        }
        return MC_OK;
    }
    for (size_t i = 0; type && i < sizeof norms / sizeof norms[0]; i++)
        if (!strcmp(type, norms[i].name)) {
            if (t->n_normalizers == MC_MAX_NORMALIZERS)
                return mc_error_set(err, MC_ERR_LIMIT, "%s: normalizer: more than %d steps", path,
                                    MC_MAX_NORMALIZERS);
            t->normalizers[t->n_normalizers++] = norms[i].code;
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_FORMAT,
                        "%s: normalizer: unsupported type '%s' (mc supports NFC, NFD, NFKC, NFKD, "
                        "Lowercase and a Sequence of them)",
                        path, type ? type : "?");
}

static mc_status compile(mc_tokenizer *t, const char *path, const char *pattern, mc_error *err)
{
    mc_status st = mc_pretok_new(pattern, &t->pretok, err);
    if (st != MC_OK) mc_error_prefix(err, "%s: pre_tokenizer", path);
    return st;
}

static mc_status load_pretokenizer(mc_tokenizer *t, const char *path, json_t *p, mc_error *err)
{
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "ByteLevel")) {
        if (get_bool(p, "add_prefix_space", 1)) t->prefix_space = MC_PREFIX_SEGMENT;
        return get_bool(p, "use_regex", 1) ? compile(t, path, MC_PATTERN_GPT2, err) : MC_OK;
    }
    if (!type || strcmp(type, "Sequence"))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: pre_tokenizer: unsupported type '%s' (mc reads ByteLevel, or a "
                            "Sequence of Split and ByteLevel)",
                            path, type ? type : "?");
    json_t *list = json_object_get(p, "pretokenizers");
    size_t n = json_array_size(list);
    if (n < 1 || n > 2)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: pre_tokenizer.pretokenizers: expected [Split, ByteLevel] or "
                            "[ByteLevel]",
                            path);
    json_t *bl = json_array_get(list, n - 1);
    const char *bt = json_string_value(json_object_get(bl, "type"));
    if (!bt || strcmp(bt, "ByteLevel"))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: pre_tokenizer.pretokenizers[%zu]: unsupported type '%s' "
                            "(expected ByteLevel)",
                            path, n - 1, bt ? bt : "?");
    if (n == 1) return load_pretokenizer(t, path, bl, err);
    json_t *sp = json_array_get(list, 0);
    const char *st0 = json_string_value(json_object_get(sp, "type"));
    const char *beh = json_string_value(json_object_get(sp, "behavior"));
    if (!st0 || strcmp(st0, "Split") || !beh || strcmp(beh, "Isolated") ||
        get_bool(sp, "invert", 0))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: pre_tokenizer.pretokenizers[0]: unsupported (mc reads Split with "
                            "behavior Isolated and invert false)",
                            path);
    if (get_bool(bl, "use_regex", 1))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: pre_tokenizer.pretokenizers[1]: ByteLevel after Split must have "
                            "use_regex false",
                            path);
    if (get_bool(bl, "add_prefix_space", 1)) t->prefix_space = MC_PREFIX_PIECE;
    json_t *pat = json_object_get(sp, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    if (re) return compile(t, path, re, err);
    const char *lit = json_string_value(json_object_get(pat, "String"));
    if (!lit)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: pre_tokenizer.pretokenizers[0].pattern: expected Regex or String",
                            path);
    /* A literal: quote it for PCRE2 (\Q...\E cannot hold "\E" itself). */
    mc_buf q = MC_BUF_INIT;
    mc_status st = MC_OK;
    for (const char *c = lit; *c && st == MC_OK; c++) {
        if (strchr("\\^$.|?*+()[]{}", *c)) st = mc_buf_append(&q, "\\", 1, err);
        if (st == MC_OK) st = mc_buf_append(&q, c, 1, err);
    }
    if (st == MC_OK) st = mc_buf_append(&q, "", 1, err);
    if (st == MC_OK) st = compile(t, path, q.data, err);
    mc_buf_free(&q);
    return st;
}

/* Every id below n_ids must name a token. */
static mc_status check_dense(mc_tokenizer *t, const char *path, mc_error *err)
{
    for (size_t i = 0; i < t->n_ids; i++)
        if (t->tok_len[i] == UINT32_MAX)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: id %zu is in neither model.vocab nor added_tokens (ids must "
                                "be dense)",
                                path, i);
    t->vocab_size = (int64_t)t->n_ids;
    return MC_OK;
}

mc_status mc_tok_load_hf_json(mc_tokenizer *t, const char *path, mc_error *err)
{
    json_t *root;
    mc_status st = mc_json_load_file(path, &root, err);
    if (st != MC_OK) return st;
    if (!json_is_object(root)) {
        json_decref(root);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: not a tokenizer.json (not an object)", path);
    }
    st = load_model(t, path, json_object_get(root, "model"), err);
    if (st == MC_OK) st = load_added(t, path, json_object_get(root, "added_tokens"), err);
    if (st == MC_OK) st = load_normalizer(t, path, json_object_get(root, "normalizer"), 0, err);
    if (st == MC_OK) {
        json_t *p = json_object_get(root, "pre_tokenizer");
        if (!p || json_is_null(p))
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: pre_tokenizer: missing (mc reads byte-level BPE, which needs "
                              "a ByteLevel pre-tokenizer)",
                              path);
        else
            st = load_pretokenizer(t, path, p, err);
    }
    if (st == MC_OK) st = check_dense(t, path, err);
    json_decref(root);
    if (st == MC_OK) mc_tok_pick_eod(t);
    return st;
}

/* ---- GPT-2's vocab.json + merges.txt ---- */

mc_status mc_tok_load_gpt2(mc_tokenizer *t, const char *vocab_path, const char *merges_path,
                           mc_error *err)
{
    json_t *vocab;
    mc_status st = mc_json_load_file(vocab_path, &vocab, err);
    if (st != MC_OK) return st;
    if (!json_is_object(vocab))
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: not a JSON object", vocab_path);
    if (st == MC_OK) st = load_vocab(t, vocab_path, vocab, err);
    json_decref(vocab);
    if (st != MC_OK) return st;

    char *data;
    size_t len;
    if ((st = mc_read_file(merges_path, &data, &len, err)) != MC_OK) return st;
    mc_buf tmp = MC_BUF_INIT;
    size_t line = 0;
    int32_t rank = 0;
    const char *s;
    size_t ll, pos = 0;
    while (st == MC_OK && mc_next_line(data, len, &pos, &s, &ll)) {
        line++;
        if (!ll || (line == 1 && ll >= 8 && !memcmp(s, "#version", 8))) continue;
        char where[512];
        snprintf(where, sizeof where, "%s:%zu", merges_path, line);
        const char *sp = memchr(s, ' ', ll);
        if (!sp || sp == s || sp + 1 == s + ll || memchr(sp + 1, ' ', (size_t)(s + ll - sp - 1))) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: expected two tokens separated by a space",
                              where);
            break;
        }
        st = add_merge(t, where, s, (size_t)(sp - s), sp + 1, (size_t)(s + ll - sp - 1), rank++,
                       &tmp, err);
    }
    mc_buf_free(&tmp);
    free(data);
    if (st != MC_OK) return st;
    if ((st = compile(t, vocab_path, MC_PATTERN_GPT2, err)) != MC_OK) return st;
    t->eod = mc_strmap_get(&t->spelling, "<|endoftext|>", 13);
    if (t->eod < 0)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: no '<|endoftext|>' token (GPT2BPETokenizer's end of document)",
                            vocab_path);
    return MC_OK;
}
