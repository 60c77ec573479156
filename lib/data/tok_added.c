/*
 * tok_added.c - what Hugging Face tokenizers does before the pre-tokenizer:
 * added tokens are split out of the text, and the stretches between them
 * are normalized (utf8proc), as HF's AddedVocabulary::extract_and_normalize
 * (the steps are above mc_tok_encode_valid, the matching above split_added).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"

/* ---- the index: per set, token indices grouped by first byte ---- */

mc_status mc_tok_index_added(mc_tokenizer *t, mc_error *err)
{
    for (int set = 0; set < 2; set++) {
        uint32_t *order = malloc((t->n_added + 1) * sizeof *order);
        if (!order) return mc_error_set(err, MC_ERR_NOMEM, "tokenizer: out of memory");
        t->added_order[set] = order;
        /* counting sort by first byte, then longest first inside a bucket
         * (insertion sort: buckets are tiny) */
        uint32_t count[257] = {0};
        for (size_t i = 0; i < t->n_added; i++) {
            const mc_added_token *a = &t->added[i];
            if (a->len && a->normalized == set) count[(unsigned char)t->pool.data[a->off] + 1]++;
        }
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        memcpy(t->added_start[set], count, sizeof count);
        uint32_t fill[257];
        memcpy(fill, count, sizeof fill);
        for (size_t i = 0; i < t->n_added; i++) {
            const mc_added_token *a = &t->added[i];
            if (!a->len || a->normalized != set) continue;
            unsigned b = (unsigned char)t->pool.data[a->off];
            uint32_t k = fill[b]++;
            while (k > count[b] && t->added[order[k - 1]].len < a->len) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = (uint32_t)i;
        }
    }
    return MC_OK;
}

/* ---- Unicode helpers ---- */

/* Decode one code point of valid UTF-8 at s; returns its length. */
static size_t cp_at(const char *s, size_t len, utf8proc_int32_t *cp)
{
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, cp);
    return n > 0 ? (size_t)n : 1;
}

/* The code point that ends s[0..len) (valid UTF-8). */
static utf8proc_int32_t last_cp(const char *s, size_t len, size_t *cplen)
{
    size_t i = len - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    utf8proc_int32_t cp;
    cp_at(s + i, len - i, &cp);
    *cplen = len - i;
    return cp;
}

/* Rust's char::is_whitespace (Unicode White_Space). */
static int is_ws(utf8proc_int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Regex \w (letters, marks, decimal digits, connector punctuation). */
static int is_word(utf8proc_int32_t c)
{
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}

/* ---- matching ---- */

typedef mc_status (*gap_fn)(mc_encoder *e, const char *s, size_t len);

/* Split s by the added tokens of `set`; gaps go to gap(), matches become ids.
 * Matching is leftmost-longest (HF's aho-corasick with
 * MatchKind::LeftmostLongest); a single_word token only matches with no word
 * character on either side; lstrip/rstrip make the match swallow the
 * whitespace to its left/right (never what an earlier match took). */
static mc_status split_added(mc_encoder *e, int set, const char *s, size_t len, gap_fn gap)
{
    const mc_tokenizer *t = e->t;
    const uint32_t *start = t->added_start[set], *order = t->added_order[set];
    size_t done = 0; /* everything before this is emitted */
    size_t i = 0;
    while (i < len) {
        unsigned b = (unsigned char)s[i];
        const mc_added_token *hit = NULL;
        for (uint32_t k = start[b]; k < start[b + 1]; k++) {
            const mc_added_token *a = &t->added[order[k]];
            if (a->len <= len - i && !memcmp(s + i, t->pool.data + a->off, a->len)) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t ms = i, me = i + hit->len;
        if (hit->single_word) {
            size_t cl;
            int left_word = ms > 0 && is_word(last_cp(s, ms, &cl));
            utf8proc_int32_t c = 0;
            int right_word = me < len && (cp_at(s + me, len - me, &c), is_word(c));
            if (left_word || right_word) {
                i = me; /* HF's matcher resumes after the rejected match */
                continue;
            }
        }
        if (hit->lstrip) {
            size_t ns = ms, cl;
            while (ns > done && is_ws(last_cp(s, ns, &cl))) ns -= cl;
            ms = ns;
        }
        if (hit->rstrip) {
            utf8proc_int32_t c;
            size_t cl;
            while (me < len && (cl = cp_at(s + me, len - me, &c), is_ws(c))) me += cl;
        }
        if (ms > done) {
            mc_status st = gap(e, s + done, ms - done);
            if (st != MC_OK) return st;
        }
        mc_status st = mc_ids_push(e->out, hit->id, e->err);
        if (st != MC_OK) return st;
        done = i = me;
    }
    if (done < len) return gap(e, s + done, len - done);
    return MC_OK;
}

/* ---- normalization ---- */

static mc_status normalize(mc_encoder *e, const char *s, size_t len)
{
    const mc_tokenizer *t = e->t;
    mc_buf *nb = &e->norm;
    nb->len = 0;
    mc_status st = mc_buf_append(nb, s, len, e->err);
    if (st != MC_OK) return st;
    for (size_t k = 0; k < t->n_normalizers; k++) {
        int n = t->normalizers[k];
        if (n == MC_NORM_LOWER) {
            /* Code point by code point; lowercase may change lengths. */
            mc_buf tmp = MC_BUF_INIT;
            for (size_t i = 0; i < nb->len;) {
                utf8proc_int32_t cp;
                i += cp_at(nb->data + i, nb->len - i, &cp);
                utf8proc_uint8_t enc[4];
                utf8proc_ssize_t el = utf8proc_encode_char(utf8proc_tolower(cp), enc);
                if ((st = mc_buf_append(&tmp, enc, (size_t)el, e->err)) != MC_OK) {
                    mc_buf_free(&tmp);
                    return st;
                }
            }
            mc_buf_free(nb);
            *nb = tmp;
            continue;
        }
        int opt = UTF8PROC_STABLE;
        if (n == MC_NORM_NFC || n == MC_NORM_NFKC)
            opt |= UTF8PROC_COMPOSE;
        else
            opt |= UTF8PROC_DECOMPOSE;
        if (n == MC_NORM_NFKC || n == MC_NORM_NFKD) opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t rl = utf8proc_map((const utf8proc_uint8_t *)nb->data,
                                           (utf8proc_ssize_t)nb->len, &res, (utf8proc_option_t)opt);
        if (rl < 0)
            return mc_error_set(e->err, MC_ERR_INTERNAL, "normalizer: %s", utf8proc_errmsg(rl));
        nb->len = 0;
        st = mc_buf_append(nb, res, (size_t)rl, e->err);
        free(res);
        if (st != MC_OK) return st;
    }
    return MC_OK;
}

static mc_status raw_gap(mc_encoder *e, const char *s, size_t len)
{
    const mc_tokenizer *t = e->t;
    if (!t->n_normalizers) return split_added(e, 1, s, len, mc_tok_encode_segment);
    mc_status st = normalize(e, s, len);
    if (st != MC_OK) return st;
    /* e->norm is not touched again until this gap is done: segments and
     * pieces use their own buffers. */
    return split_added(e, 1, e->norm.data, e->norm.len, mc_tok_encode_segment);
}

/* HF's order: (1) added tokens with normalized=false are found in the raw
 * text; (2) each stretch between them is normalized; (3) added tokens with
 * normalized=true are found in the normalized stretch; (4) what is left goes
 * to the pre-tokenizer. */
mc_status mc_tok_encode_valid(mc_encoder *e, const char *s, size_t len)
{
    return split_added(e, 0, s, len, raw_gap);
}
