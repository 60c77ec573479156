/*
 * pretok.c - pre-tokenization with PCRE2: owns the pattern table, the
 * compiled regex (shared, read-only) and the per-thread match state, and the
 * UTF-8 validity scan that splits text into valid runs and invalid-byte runs.
 *
 * The patterns are those of GPT-2, Llama-3 (tiktoken cl100k) and Megatron's
 * TikTokenizer. They are compiled with PCRE2_UTF|PCRE2_UCP so \s, \p{L},
 * \p{N} and case-insensitive matching use Unicode properties, as Rust's regex
 * / fancy-regex (Hugging Face tokenizers) and tiktoken do. Matching runs with
 * PCRE2_NO_UTF_CHECK: every subject we hand PCRE2 has already been proven
 * valid by mc_utf8_valid_prefix, so PCRE2's own check would be a second scan.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mc/pretok.h"

const char MC_PATTERN_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

const char MC_PATTERN_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Megatron's PATTERN_TIKTOKEN (megatron/training/tokenizer/tokenizer.py)
 * verbatim: note the possessive quantifiers and "\s*[\r\n]" (one line end),
 * unlike Llama-3's "\s*[\r\n]+". */
const char MC_PATTERN_TIKTOKEN_V1[] =
    "[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";

const char MC_PATTERN_TIKTOKEN_V2[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *mc_pattern_by_name(const char *name)
{
    if (!name) return NULL;
    if (!strcmp(name, "gpt2")) return MC_PATTERN_GPT2;
    if (!strcmp(name, "llama3")) return MC_PATTERN_LLAMA3;
    if (!strcmp(name, "tiktoken-v1")) return MC_PATTERN_TIKTOKEN_V1;
    if (!strcmp(name, "tiktoken-v2")) return MC_PATTERN_TIKTOKEN_V2;
    return NULL;
}

struct mc_pretok {
    pcre2_code *code;
    int jit; /* pcre2_jit_compile succeeded: use pcre2_jit_match */
};

struct mc_pretok_iter {
    const mc_pretok *p;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
};

mc_status mc_pretok_new(const char *pattern, mc_pretok **out, mc_error *err)
{
    *out = NULL;
    if (!pattern) return mc_error_set(err, MC_ERR_USAGE, "pre-tokenizer: no pattern");
    int ec = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &ec, &eoff, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return mc_error_set(err, MC_ERR_FORMAT, "pre-tokenizer pattern: offset %zu: %s",
                            (size_t)eoff, (const char *)msg);
    }
    mc_pretok *p = calloc(1, sizeof *p);
    if (!p) {
        pcre2_code_free(code);
        return mc_error_set(err, MC_ERR_NOMEM, "pre-tokenizer: out of memory");
    }
    p->code = code;
    /* JIT may be absent (some architectures, SELinux execmem): the
     * interpreter gives the same matches, only slower. */
    p->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    *out = p;
    return MC_OK;
}

void mc_pretok_free(mc_pretok *p)
{
    if (!p) return;
    pcre2_code_free(p->code);
    free(p);
}

mc_status mc_pretok_iter_new(const mc_pretok *p, mc_pretok_iter **out, mc_error *err)
{
    *out = NULL;
    mc_pretok_iter *it = calloc(1, sizeof *it);
    if (!it) return mc_error_set(err, MC_ERR_NOMEM, "pre-tokenizer: out of memory");
    it->p = p;
    it->md = pcre2_match_data_create_from_pattern(p->code, NULL);
    if (!it->md) goto nomem;
    if (p->jit) {
        /* A private JIT stack per thread: lookahead on long whitespace runs
         * can need more than the default 32 KiB. */
        it->jstack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        it->mctx = pcre2_match_context_create(NULL);
        if (!it->jstack || !it->mctx) goto nomem;
        pcre2_jit_stack_assign(it->mctx, NULL, it->jstack);
    }
    *out = it;
    return MC_OK;
nomem:
    mc_pretok_iter_free(it);
    return mc_error_set(err, MC_ERR_NOMEM, "pre-tokenizer: out of memory");
}

void mc_pretok_iter_free(mc_pretok_iter *it)
{
    if (!it) return;
    if (it->md) pcre2_match_data_free(it->md);
    if (it->mctx) pcre2_match_context_free(it->mctx);
    if (it->jstack) pcre2_jit_stack_free(it->jstack);
    free(it);
}

/* Split one valid UTF-8 run. Gaps between matches are pieces, so no byte is
 * ever dropped whatever the pattern. An empty match (none of the built-in
 * patterns can make one, a user pattern might) is skipped by one character,
 * which stays in the pending gap, so the loop always progresses. */
static int match_at(mc_pretok_iter *it, const char *s, size_t len, size_t from)
{
    if (it->p->jit)
        return pcre2_jit_match(it->p->code, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK, it->md,
                               it->mctx);
    return pcre2_match(it->p->code, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK, it->md, NULL);
}

static mc_status callback_failed(mc_error *err)
{
    if (err && err->code != MC_OK) return err->code;
    return mc_error_set(err, MC_ERR_INTERNAL, "pre-tokenizer: piece callback failed");
}

static mc_status split_valid(mc_pretok_iter *it, const char *s, size_t len, mc_piece_fn fn,
                             void *ctx, mc_error *err)
{
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(it->md);
    size_t gap = 0, from = 0;
    while (from < len) {
        int rc = match_at(it, s, len, from);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mc_error_set(err, MC_ERR_INTERNAL, "pre-tokenizer: match failed: %s",
                                (const char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            from = ms + 1;
            while (from < len && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
            continue;
        }
        if (ms > gap && fn(ctx, s + gap, ms - gap)) return callback_failed(err);
        if (fn(ctx, s + ms, me - ms)) return callback_failed(err);
        gap = from = me;
    }
    if (gap < len && fn(ctx, s + gap, len - gap)) return callback_failed(err);
    return MC_OK;
}

/* Length of the run of invalid bytes starting at s: it ends where a valid
 * UTF-8 sequence begins. */
static size_t invalid_run(const char *s, size_t len)
{
    size_t i = 1;
    while (i < len && mc_utf8_valid_prefix(s + i, len - i < 4 ? len - i : 4) == 0) i++;
    return i;
}

mc_status mc_pretok_split(mc_pretok_iter *it, const char *text, size_t len, mc_piece_fn fn,
                          void *ctx, mc_error *err)
{
    mc_error_clear(err);
    size_t pos = 0;
    while (pos < len) {
        size_t v = mc_utf8_valid_prefix(text + pos, len - pos);
        if (v) {
            mc_status st = split_valid(it, text + pos, v, fn, ctx, err);
            if (st != MC_OK) return st;
            pos += v;
            continue;
        }
        size_t bad = invalid_run(text + pos, len - pos);
        if (fn(ctx, text + pos, bad)) return callback_failed(err);
        pos += bad;
    }
    return MC_OK;
}

size_t mc_utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            n = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            if (c == 0xE0)
                lo = 0xA0; /* no overlongs */
            else if (c == 0xED)
                hi = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            if (c == 0xF0)
                lo = 0x90; /* no overlongs */
            else if (c == 0xF4)
                hi = 0x8F; /* nothing above U+10FFFF */
        } else
            return i;
        if (i + n > len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += n;
    }
    return len;
}
