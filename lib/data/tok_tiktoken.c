/*
 * tok_tiktoken.c - loading Megatron's TikTokenizer: a tiktoken rank file
 * (tiktoken's own "BASE64 RANK" lines, or the JSON list Megatron's
 * reload_mergeable_ranks reads) plus Megatron's special-token convention.
 * The forms and the ids are in mc-formats(5), "tiktoken rank files".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/file.h"
#include "mc/json.h"
#include "tok_internal.h"

/* Standard base64 (padding optional); returns 0 on a bad character. */
static int b64_decode(const char *s, size_t len, mc_buf *out)
{
    unsigned acc = 0;
    int bits = 0;
    out->len = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        int v;
        if (c >= 'A' && c <= 'Z')
            v = c - 'A';
        else if (c >= 'a' && c <= 'z')
            v = c - 'a' + 26;
        else if (c >= '0' && c <= '9')
            v = c - '0' + 52;
        else if (c == '+')
            v = 62;
        else if (c == '/')
            v = 63;
        else if (c == '=')
            break;
        else
            return 0;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            char b = (char)((acc >> bits) & 0xFF);
            if (mc_buf_append(out, &b, 1, NULL) != MC_OK) return 0;
        }
    }
    return 1;
}

typedef struct rank_ent {
    uint32_t off, len; /* bytes in the loader's pool */
    int64_t rank;
} rank_ent;

typedef struct ranks {
    rank_ent *v;
    size_t n, cap;
    mc_buf pool;
} ranks;

static mc_status push_rank(ranks *r, const mc_buf *bytes, int64_t rank, mc_error *err)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        rank_ent *v = realloc(r->v, cap * sizeof *v);
        if (!v) return mc_error_set(err, MC_ERR_NOMEM, "tiktoken: out of memory");
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (rank_ent){(uint32_t)r->pool.len, (uint32_t)bytes->len, rank};
    return mc_buf_append(&r->pool, bytes->data, bytes->len, err);
}

static mc_status read_lines(const char *path, const char *data, size_t len, ranks *r, mc_error *err)
{
    mc_buf tok = MC_BUF_INIT;
    size_t line = 0;
    mc_status st = MC_OK;
    const char *s;
    size_t ll, pos = 0;
    while (st == MC_OK && mc_next_line(data, len, &pos, &s, &ll)) {
        line++;
        if (!ll) continue;
        const char *sp = memchr(s, ' ', ll);
        char *end = NULL;
        long long rank = -1;
        if (sp && sp + 1 < s + ll) rank = strtoll(sp + 1, &end, 10);
        if (!sp || sp == s || !end || end != s + ll || rank < 0) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s:%zu: expected \"BASE64 RANK\"", path, line);
            break;
        }
        if (!b64_decode(s, (size_t)(sp - s), &tok) || !tok.len) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s:%zu: invalid base64 token '%.*s'", path, line,
                              (int)(sp - s), s);
            break;
        }
        st = push_rank(r, &tok, rank, err);
    }
    mc_buf_free(&tok);
    return st;
}

static mc_status read_json(const char *path, const char *data, size_t len, ranks *r, mc_error *err)
{
    json_t *root;
    mc_status st = mc_json_load_buf(path, data, len, &root, err);
    if (st != MC_OK) return st;
    mc_buf tok = MC_BUF_INIT;
    if (!json_is_array(root)) st = mc_error_set(err, MC_ERR_FORMAT, "%s: not a JSON list", path);
    size_t i;
    json_t *e;
    json_array_foreach(root, i, e)
    {
        if (st != MC_OK) break;
        json_t *rk = json_object_get(e, "rank"), *tb = json_object_get(e, "token_bytes");
        if (!json_is_integer(rk) || !json_is_string(tb) ||
            !b64_decode(json_string_value(tb), json_string_length(tb), &tok) || !tok.len) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: [%zu]: expected {\"rank\": N, \"token_bytes\": BASE64}", path,
                              i);
            break;
        }
        st = push_rank(r, &tok, json_integer_value(rk), err);
    }
    mc_buf_free(&tok);
    json_decref(root);
    return st;
}

/* Megatron's CustomTikTokenizer puts the special tokens first: ids
 * 0..num_special-1 are the given list (default <unk>, <s>, </s>) padded with
 * "<SPECIAL_i>", and rank r becomes id r + num_special. A --vocab-size, when
 * given, keeps only the first vocab_size - num_special ranks. Encoding is
 * encode_ordinary (special tokens in the text are plain text); EOD is </s>.
 * tiktoken merges the adjacent pair whose concatenation has the lowest rank;
 * the loader turns each split A+B of every token T (A and B tokens
 * themselves) into the rule (A, B) -> T at rank(T), so bpe.c runs it. */
mc_status mc_tok_load_tiktoken(mc_tokenizer *t, const mc_tokenizer_spec *spec, mc_error *err)
{
    const char *path = spec->model;
    static const char *const dflt[] = {"<unk>", "<s>", "</s>"};
    const char *const *sp = spec->n_tiktoken_special_tokens ? spec->tiktoken_special_tokens : dflt;
    size_t nsp = spec->n_tiktoken_special_tokens ? spec->n_tiktoken_special_tokens : 3;
    int64_t nspecial = spec->tiktoken_num_special_tokens;
    if (nspecial < (int64_t)nsp || nspecial > 1000000)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--tiktoken-num-special-tokens %" PRId64 " is below the %zu special "
                            "tokens given",
                            nspecial, nsp);
    const char *pname = spec->tiktoken_pattern ? spec->tiktoken_pattern : "v2";
    const char *pattern = !strcmp(pname, "v1")   ? MC_PATTERN_TIKTOKEN_V1
                          : !strcmp(pname, "v2") ? MC_PATTERN_TIKTOKEN_V2
                                                 : NULL;
    if (!pattern)
        return mc_error_set(err, MC_ERR_USAGE, "--tiktoken-pattern must be v1 or v2, not '%s'",
                            pname);

    /* Special tokens: ids 0..nspecial-1. */
    mc_status st = MC_OK;
    char name[64];
    for (int64_t i = 0; i < nspecial && st == MC_OK; i++) {
        const char *s = i < (int64_t)nsp ? sp[i] : name;
        if (i >= (int64_t)nsp) snprintf(name, sizeof name, "<SPECIAL_%" PRId64 ">", i);
        if (mc_strmap_get(&t->spelling, s, strlen(s)) >= 0)
            return mc_error_set(err, MC_ERR_USAGE, "special token '%s' given twice", s);
        st = mc_strmap_put(&t->spelling, s, strlen(s), (int32_t)i, err);
        if (st == MC_OK) st = mc_tok_set_token(t, (int32_t)i, s, strlen(s), err);
    }
    if (st != MC_OK) return st;
    for (size_t k = 0; k < 3; k++)
        if (mc_strmap_get(&t->spelling, dflt[k], strlen(dflt[k])) < 0)
            return mc_error_set(err, MC_ERR_USAGE,
                                "TikTokenizer special tokens must include <unk>, <s> and </s>");
    t->eod = mc_strmap_get(&t->spelling, "</s>", 4);

    char *data;
    size_t len;
    if ((st = mc_read_file(path, &data, &len, err)) != MC_OK) return st;
    ranks r = {0};
    size_t lead = 0;
    while (lead < len && (data[lead] == ' ' || data[lead] == '\n' || data[lead] == '\t')) lead++;
    st = lead < len && data[lead] == '[' ? read_json(path, data, len, &r, err)
                                         : read_lines(path, data, len, &r, err);
    free(data);

    /* Ranks must be 0..n-1, once each (Megatron asserts the same). */
    size_t keep = r.n;
    if (st == MC_OK && spec->vocab_size > 0) {
        if (spec->vocab_size <= nspecial)
            st = mc_error_set(err, MC_ERR_USAGE,
                              "--vocab-size %" PRId64 " leaves no room after %" PRId64
                              " special tokens",
                              spec->vocab_size, nspecial);
        else if ((size_t)(spec->vocab_size - nspecial) < keep)
            keep = (size_t)(spec->vocab_size - nspecial);
    }
    int32_t *by_rank = NULL;
    if (st == MC_OK && (by_rank = malloc((r.n ? r.n : 1) * sizeof *by_rank)) == NULL)
        st = mc_error_set(err, MC_ERR_NOMEM, "tiktoken: out of memory");
    for (size_t i = 0; st == MC_OK && i < r.n; i++) by_rank[i] = -1;
    for (size_t i = 0; st == MC_OK && i < r.n; i++) {
        if (r.v[i].rank >= (int64_t)r.n || by_rank[r.v[i].rank] >= 0)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: rank %" PRId64 " is out of order or repeated (ranks must be "
                              "0..%zu, once each)",
                              path, r.v[i].rank, r.n - 1);
        else
            by_rank[r.v[i].rank] = (int32_t)i;
    }
    for (size_t k = 0; st == MC_OK && k < keep; k++) {
        const rank_ent *e = &r.v[by_rank[k]];
        int32_t id = (int32_t)(k + (size_t)nspecial);
        const char *b = r.pool.data + e->off;
        if (mc_strmap_get(&t->bytes, b, e->len) >= 0)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: rank %zu repeats the bytes of an earlier rank", path, k);
        if (st == MC_OK) st = mc_strmap_put(&t->bytes, b, e->len, id, err);
        if (st == MC_OK) st = mc_tok_set_token(t, id, b, e->len, err);
        /* token_to_id looks tokens up in their own spelling: the bytes */
        if (st == MC_OK && mc_strmap_get(&t->spelling, b, e->len) < 0)
            st = mc_strmap_put(&t->spelling, b, e->len, id, err);
    }
    if (st == MC_OK) st = mc_bpe_new(&t->bpe, err);
    for (unsigned c = 0; st == MC_OK && c < 256; c++) {
        char ch = (char)c;
        int32_t id = mc_strmap_get(&t->bytes, &ch, 1);
        if (id < 0)
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: no rank for the single byte 0x%02X", path,
                              c);
        else
            mc_bpe_set_byte(t->bpe, c, id);
    }
    for (size_t k = 0; st == MC_OK && k < keep; k++) {
        const rank_ent *e = &r.v[by_rank[k]];
        const char *b = r.pool.data + e->off;
        int32_t id = (int32_t)(k + (size_t)nspecial);
        for (uint32_t cut = 1; st == MC_OK && cut < e->len; cut++) {
            int32_t a = mc_strmap_get(&t->bytes, b, cut);
            int32_t c = a < 0 ? -1 : mc_strmap_get(&t->bytes, b + cut, e->len - cut);
            if (c >= 0) st = mc_bpe_add_merge(t->bpe, a, c, id, id, err);
        }
    }
    free(by_rank);
    free(r.v);
    mc_buf_free(&r.pool);
    if (st != MC_OK) return st;
    mc_bpe_set_whole(t->bpe, &t->bytes);
    t->vocab_size = nspecial + (int64_t)keep;
    return mc_pretok_new(pattern, &t->pretok, err);
}
