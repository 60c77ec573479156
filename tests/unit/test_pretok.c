/*
 * test_pretok.c - pre-tokenization against Hugging Face tokenizers' Split
 * (Regex, behavior "isolated"): the expected pieces below were printed by
 * tokenizers 0.23 (tests/golden/make_pretok_golden.py) for each of mc's
 * four patterns. Also: the UTF-8
 * validity scan (RFC 3629 edge cases), invalid byte runs as pieces, and the
 * error paths (bad pattern, a callback that stops the split).
 */
#include <stdlib.h>
#include <string.h>

#include "mc/pretok.h"
#include "tap.h"

typedef struct golden {
    const char *pattern;
    const char *text;
    const char *pieces[64];
} golden;

static const golden cases[] = {
    {"gpt2", "Hello world, it's 2024!", {"Hello", " world", ",", " it", "'s", " 2024", "!", NULL}},
    {"gpt2",
     "  leading   spaces\x0a"
     "\x0a"
     "\x09"
     "tab\x0d"
     "\x0a"
     "end  ",
     {" ", " leading", "  ", " spaces",
      "\x0a"
      "\x0a"
      "",
      "\x09"
      "",
      "tab",
      "\x0d"
      "",
      "\x0a"
      "",
      "end", "  ", NULL}},
    {"gpt2", "I'LL DON'T we'Re", {"I", "'", "LL", " DON", "'", "T", " we", "'", "Re", NULL}},
    {"gpt2",
     "\xe6"
     "\x95"
     "\xb0"
     "\xe5"
     "\xad"
     "\x97"
     "12345 and \xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe8"
     "\xaa"
     "\x9e"
     "\xe3"
     "\x83"
     "\x86"
     "\xe3"
     "\x82"
     "\xad"
     "\xe3"
     "\x82"
     "\xb9"
     "\xe3"
     "\x83"
     "\x88"
     "",
     {"\xe6"
      "\x95"
      "\xb0"
      "\xe5"
      "\xad"
      "\x97"
      "",
      "12345", " and",
      " \xe6"
      "\x97"
      "\xa5"
      "\xe6"
      "\x9c"
      "\xac"
      "\xe8"
      "\xaa"
      "\x9e"
      "\xe3"
      "\x83"
      "\x86"
      "\xe3"
      "\x82"
      "\xad"
      "\xe3"
      "\x82"
      "\xb9"
      "\xe3"
      "\x83"
      "\x88"
      "",
      NULL}},
    {"gpt2",
     "caf\xc3"
     "\xa9"
     " na\xc3"
     "\xaf"
     "ve e\xcc"
     "\x81"
     " \xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa7"
     " ok",
     {"caf\xc3"
      "\xa9"
      "",
      " na\xc3"
      "\xaf"
      "ve",
      " e",
      "\xcc"
      "\x81"
      "",
      " \xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa7"
      "",
      " ok", NULL}},
    {"gpt2",
     "a/b//c http://x.y/z",
     {"a", "/", "b", "//", "c", " http", "://", "x", ".", "y", "/", "z", NULL}},
    {"gpt2",
     "\xd7"
     "\xa9"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9d"
     " \xd7"
     "\xa2"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x9d"
     " \xd9"
     "\x85"
     "\xd8"
     "\xb1"
     "\xd8"
     "\xad"
     "\xd8"
     "\xa8"
     "\xd8"
     "\xa7"
     "",
     {"\xd7"
      "\xa9"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9d"
      "",
      " \xd7"
      "\xa2"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x9d"
      "",
      " \xd9"
      "\x85"
      "\xd8"
      "\xb1"
      "\xd8"
      "\xad"
      "\xd8"
      "\xa8"
      "\xd8"
      "\xa7"
      "",
      NULL}},
    {"gpt2",
     "x = f(a, b)\x0a"
     "    return x**2  # done\x0a"
     "",
     {"x", " =", " f", "(", "a", ",", " b", ")",
      "\x0a"
      "   ",
      " return", " x", "**", "2", " ", " #", " done",
      "\x0a"
      "",
      NULL}},
    {"gpt2",
     "camelCaseWord HTTPServer\x0a"
     "\x0a"
     "\x0a"
     " x  \x0d"
     "\x0a"
     "\x0d"
     "\x0a"
     "",
     {"camelCaseWord", " HTTPServer",
      "\x0a"
      "\x0a"
      "\x0a"
      "",
      " x",
      "  \x0d"
      "\x0a"
      "\x0d"
      "\x0a"
      "",
      NULL}},
    {"llama3",
     "Hello world, it's 2024!",
     {"Hello", " world", ",", " it", "'s", " ", "202", "4", "!", NULL}},
    {"llama3",
     "  leading   spaces\x0a"
     "\x0a"
     "\x09"
     "tab\x0d"
     "\x0a"
     "end  ",
     {" ", " leading", "  ", " spaces",
      "\x0a"
      "\x0a"
      "",
      "\x09"
      "tab",
      "\x0d"
      "\x0a"
      "",
      "end", "  ", NULL}},
    {"llama3", "I'LL DON'T we'Re", {"I", "'LL", " DON", "'T", " we", "'Re", NULL}},
    {"llama3",
     "\xe6"
     "\x95"
     "\xb0"
     "\xe5"
     "\xad"
     "\x97"
     "12345 and \xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe8"
     "\xaa"
     "\x9e"
     "\xe3"
     "\x83"
     "\x86"
     "\xe3"
     "\x82"
     "\xad"
     "\xe3"
     "\x82"
     "\xb9"
     "\xe3"
     "\x83"
     "\x88"
     "",
     {"\xe6"
      "\x95"
      "\xb0"
      "\xe5"
      "\xad"
      "\x97"
      "",
      "123", "45", " and",
      " \xe6"
      "\x97"
      "\xa5"
      "\xe6"
      "\x9c"
      "\xac"
      "\xe8"
      "\xaa"
      "\x9e"
      "\xe3"
      "\x83"
      "\x86"
      "\xe3"
      "\x82"
      "\xad"
      "\xe3"
      "\x82"
      "\xb9"
      "\xe3"
      "\x83"
      "\x88"
      "",
      NULL}},
    {"llama3",
     "caf\xc3"
     "\xa9"
     " na\xc3"
     "\xaf"
     "ve e\xcc"
     "\x81"
     " \xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa7"
     " ok",
     {"caf\xc3"
      "\xa9"
      "",
      " na\xc3"
      "\xaf"
      "ve",
      " e",
      "\xcc"
      "\x81"
      "",
      " \xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa7"
      "",
      " ok", NULL}},
    {"llama3",
     "a/b//c http://x.y/z",
     {"a", "/b", "//", "c", " http", "://", "x", ".y", "/z", NULL}},
    {"llama3",
     "\xd7"
     "\xa9"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9d"
     " \xd7"
     "\xa2"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x9d"
     " \xd9"
     "\x85"
     "\xd8"
     "\xb1"
     "\xd8"
     "\xad"
     "\xd8"
     "\xa8"
     "\xd8"
     "\xa7"
     "",
     {"\xd7"
      "\xa9"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9d"
      "",
      " \xd7"
      "\xa2"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x9d"
      "",
      " \xd9"
      "\x85"
      "\xd8"
      "\xb1"
      "\xd8"
      "\xad"
      "\xd8"
      "\xa8"
      "\xd8"
      "\xa7"
      "",
      NULL}},
    {"llama3",
     "x = f(a, b)\x0a"
     "    return x**2  # done\x0a"
     "",
     {"x", " =", " f", "(a", ",", " b",
      ")\x0a"
      "",
      "   ", " return", " x", "**", "2", " ", " #", " done",
      "\x0a"
      "",
      NULL}},
    {"llama3",
     "camelCaseWord HTTPServer\x0a"
     "\x0a"
     "\x0a"
     " x  \x0d"
     "\x0a"
     "\x0d"
     "\x0a"
     "",
     {"camelCaseWord", " HTTPServer",
      "\x0a"
      "\x0a"
      "\x0a"
      "",
      " x",
      "  \x0d"
      "\x0a"
      "\x0d"
      "\x0a"
      "",
      NULL}},
    {"tiktoken-v1",
     "Hello world, it's 2024!",
     {"Hello", " world", ",", " it", "'s", " ", "2", "0", "2", "4", "!", NULL}},
    {"tiktoken-v1",
     "  leading   spaces\x0a"
     "\x0a"
     "\x09"
     "tab\x0d"
     "\x0a"
     "end  ",
     {" ", " leading", "  ", " spaces",
      "\x0a"
      "\x0a"
      "",
      "\x09"
      "tab",
      "\x0d"
      "\x0a"
      "",
      "end", "  ", NULL}},
    {"tiktoken-v1", "I'LL DON'T we'Re", {"I", "'LL", " DON", "'T", " we", "'Re", NULL}},
    {"tiktoken-v1",
     "\xe6"
     "\x95"
     "\xb0"
     "\xe5"
     "\xad"
     "\x97"
     "12345 and \xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe8"
     "\xaa"
     "\x9e"
     "\xe3"
     "\x83"
     "\x86"
     "\xe3"
     "\x82"
     "\xad"
     "\xe3"
     "\x82"
     "\xb9"
     "\xe3"
     "\x83"
     "\x88"
     "",
     {"\xe6"
      "\x95"
      "\xb0"
      "\xe5"
      "\xad"
      "\x97"
      "",
      "1", "2", "3", "4", "5", " and",
      " \xe6"
      "\x97"
      "\xa5"
      "\xe6"
      "\x9c"
      "\xac"
      "\xe8"
      "\xaa"
      "\x9e"
      "\xe3"
      "\x83"
      "\x86"
      "\xe3"
      "\x82"
      "\xad"
      "\xe3"
      "\x82"
      "\xb9"
      "\xe3"
      "\x83"
      "\x88"
      "",
      NULL}},
    {"tiktoken-v1",
     "caf\xc3"
     "\xa9"
     " na\xc3"
     "\xaf"
     "ve e\xcc"
     "\x81"
     " \xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa7"
     " ok",
     {"caf\xc3"
      "\xa9"
      "",
      " na\xc3"
      "\xaf"
      "ve",
      " e",
      "\xcc"
      "\x81"
      "",
      " \xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa7"
      "",
      " ok", NULL}},
    {"tiktoken-v1",
     "a/b//c http://x.y/z",
     {"a", "/b", "//", "c", " http", "://", "x", ".y", "/z", NULL}},
    {"tiktoken-v1",
     "\xd7"
     "\xa9"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9d"
     " \xd7"
     "\xa2"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x9d"
     " \xd9"
     "\x85"
     "\xd8"
     "\xb1"
     "\xd8"
     "\xad"
     "\xd8"
     "\xa8"
     "\xd8"
     "\xa7"
     "",
     {"\xd7"
      "\xa9"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9d"
      "",
      " \xd7"
      "\xa2"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x9d"
      "",
      " \xd9"
      "\x85"
      "\xd8"
      "\xb1"
      "\xd8"
      "\xad"
      "\xd8"
      "\xa8"
      "\xd8"
      "\xa7"
      "",
      NULL}},
    {"tiktoken-v1",
     "x = f(a, b)\x0a"
     "    return x**2  # done\x0a"
     "",
     {"x", " =", " f", "(a", ",", " b",
      ")\x0a"
      "",
      "   ", " return", " x", "**", "2", " ", " #", " done",
      "\x0a"
      "",
      NULL}},
    {"tiktoken-v1",
     "camelCaseWord HTTPServer\x0a"
     "\x0a"
     "\x0a"
     " x  \x0d"
     "\x0a"
     "\x0d"
     "\x0a"
     "",
     {"camelCaseWord", " HTTPServer",
      "\x0a"
      "\x0a"
      "\x0a"
      "",
      " x",
      "  \x0d"
      "\x0a"
      "\x0d"
      "\x0a"
      "",
      NULL}},
    {"tiktoken-v2",
     "Hello world, it's 2024!",
     {"Hello", " world", ",", " it", "'s", " ", "2", "0", "2", "4", "!", NULL}},
    {"tiktoken-v2",
     "  leading   spaces\x0a"
     "\x0a"
     "\x09"
     "tab\x0d"
     "\x0a"
     "end  ",
     {" ", " leading", "  ", " spaces",
      "\x0a"
      "\x0a"
      "",
      "\x09"
      "tab",
      "\x0d"
      "\x0a"
      "",
      "end", "  ", NULL}},
    {"tiktoken-v2", "I'LL DON'T we'Re", {"I", "'LL", " DON", "'T", " we", "'Re", NULL}},
    {"tiktoken-v2",
     "\xe6"
     "\x95"
     "\xb0"
     "\xe5"
     "\xad"
     "\x97"
     "12345 and \xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe8"
     "\xaa"
     "\x9e"
     "\xe3"
     "\x83"
     "\x86"
     "\xe3"
     "\x82"
     "\xad"
     "\xe3"
     "\x82"
     "\xb9"
     "\xe3"
     "\x83"
     "\x88"
     "",
     {"\xe6"
      "\x95"
      "\xb0"
      "\xe5"
      "\xad"
      "\x97"
      "",
      "1", "2", "3", "4", "5", " and",
      " \xe6"
      "\x97"
      "\xa5"
      "\xe6"
      "\x9c"
      "\xac"
      "\xe8"
      "\xaa"
      "\x9e"
      "\xe3"
      "\x83"
      "\x86"
      "\xe3"
      "\x82"
      "\xad"
      "\xe3"
      "\x82"
      "\xb9"
      "\xe3"
      "\x83"
      "\x88"
      "",
      NULL}},
    {"tiktoken-v2",
     "caf\xc3"
     "\xa9"
     " na\xc3"
     "\xaf"
     "ve e\xcc"
     "\x81"
     " \xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa9"
     "\xe2"
     "\x80"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x91"
     "\xa7"
     " ok",
     {"caf\xc3"
      "\xa9"
      "",
      " na\xc3"
      "\xaf"
      "ve",
      " e\xcc"
      "\x81"
      "",
      " \xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa9"
      "\xe2"
      "\x80"
      "\x8d"
      "\xf0"
      "\x9f"
      "\x91"
      "\xa7"
      "",
      " ok", NULL}},
    {"tiktoken-v2",
     "a/b//c http://x.y/z",
     {"a", "/b", "//", "c", " http", "://", "x", ".y", "/z", NULL}},
    {"tiktoken-v2",
     "\xd7"
     "\xa9"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9d"
     " \xd7"
     "\xa2"
     "\xd7"
     "\x95"
     "\xd7"
     "\x9c"
     "\xd7"
     "\x9d"
     " \xd9"
     "\x85"
     "\xd8"
     "\xb1"
     "\xd8"
     "\xad"
     "\xd8"
     "\xa8"
     "\xd8"
     "\xa7"
     "",
     {"\xd7"
      "\xa9"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9d"
      "",
      " \xd7"
      "\xa2"
      "\xd7"
      "\x95"
      "\xd7"
      "\x9c"
      "\xd7"
      "\x9d"
      "",
      " \xd9"
      "\x85"
      "\xd8"
      "\xb1"
      "\xd8"
      "\xad"
      "\xd8"
      "\xa8"
      "\xd8"
      "\xa7"
      "",
      NULL}},
    {"tiktoken-v2",
     "x = f(a, b)\x0a"
     "    return x**2  # done\x0a"
     "",
     {"x", " =", " f", "(a", ",", " b",
      ")\x0a"
      "",
      "   ", " return", " x", "**", "2", " ", " #", " done",
      "\x0a"
      "",
      NULL}},
    {"tiktoken-v2",
     "camelCaseWord HTTPServer\x0a"
     "\x0a"
     "\x0a"
     " x  \x0d"
     "\x0a"
     "\x0d"
     "\x0a"
     "",
     {"camel", "Case", "Word", " HTTPServer",
      "\x0a"
      "\x0a"
      "\x0a"
      "",
      " x",
      "  \x0d"
      "\x0a"
      "\x0d"
      "\x0a"
      "",
      NULL}},
    /* Runs of invalid bytes are pieces of their own (not from HF, whose
     * input is a str; this is mc's documented rule in pretok.h). */
    {"gpt2",
     "ab\xff\xfe"
     "cd \xc3",
     {"ab", "\xff\xfe", "cd", " ", "\xc3", NULL}},
    {"llama3",
     "\xed\xa0\x80x\xf4\x90\x80\x80 y",
     {"\xed\xa0\x80", "x", "\xf4\x90\x80\x80", " y", NULL}},
};

typedef struct collect {
    char pieces[64][256];
    size_t n;
    int stop_after; /* return non-zero on this piece (0: never) */
} collect;

static int collect_piece(void *ctx, const char *piece, size_t len)
{
    collect *c = ctx;
    if (c->n >= 64 || len >= 256) return 1;
    memcpy(c->pieces[c->n], piece, len);
    c->pieces[c->n][len] = 0;
    c->n++;
    return c->stop_after && (int)c->n == c->stop_after;
}

static void test_golden(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const golden *g = &cases[i];
        mc_error err;
        mc_pretok *p = NULL;
        mc_pretok_iter *it = NULL;
        if (mc_pretok_new(mc_pattern_by_name(g->pattern), &p, &err) != MC_OK ||
            mc_pretok_iter_new(p, &it, &err) != MC_OK) {
            TAP_OK(0, "case %zu: compile %s: %s", i, g->pattern, err.msg);
            continue;
        }
        collect c = {.n = 0};
        mc_status st = mc_pretok_split(it, g->text, strlen(g->text), collect_piece, &c, &err);
        size_t nexp = 0;
        while (g->pieces[nexp]) nexp++;
        int same = st == MC_OK && c.n == nexp;
        size_t bad = 0;
        for (size_t k = 0; same && k < nexp; k++)
            if (strcmp(c.pieces[k], g->pieces[k])) {
                same = 0;
                bad = k;
            }
        TAP_OK(same, "case %zu (%s): %zu pieces as HF", i, g->pattern, nexp);
        if (!same)
            TAP_DIAG("got %zu pieces, want %zu; first difference at piece %zu: '%s' vs '%s'", c.n,
                     nexp, bad, bad < c.n ? c.pieces[bad] : "",
                     g->pieces[bad] ? g->pieces[bad] : "");
        mc_pretok_iter_free(it);
        mc_pretok_free(p);
    }
}

static void test_utf8(void)
{
    static const struct {
        const char *s;
        size_t len, want;
    } u[] = {
        {"abc", 3, 3},
        {"\xc3\xa9", 2, 2},
        {"a\xc0\x80", 3, 1},         /* overlong NUL */
        {"a\xe0\x80\x80", 4, 1},     /* overlong 3-byte */
        {"a\xf0\x80\x80\x80", 5, 1}, /* overlong 4-byte */
        {"a\xed\xa0\x80", 4, 1},     /* surrogate U+D800 */
        {"\xed\x9f\xbf", 3, 3},      /* U+D7FF is fine */
        {"\xf4\x8f\xbf\xbf", 4, 4},  /* U+10FFFF */
        {"\xf4\x90\x80\x80", 4, 0},  /* above U+10FFFF */
        {"\xf5\x80\x80\x80", 4, 0},
        {"abcdefgh\xe2\x82", 10, 8}, /* truncated at the end, after the fast path */
        {"abcdefghij\x80", 11, 10},  /* lone continuation */
        {"\xf0\x9f\x98\x80xyz", 7, 7},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        size_t got = mc_utf8_valid_prefix(u[i].s, u[i].len);
        TAP_OK(got == u[i].want, "utf8 case %zu: valid prefix %zu (want %zu)", i, got, u[i].want);
    }
}

typedef struct sizes {
    size_t n, total, longest;
} sizes;

static int count_piece(void *ctx, const char *piece, size_t len)
{
    sizes *z = ctx;
    (void)piece;
    z->n++;
    z->total += len;
    if (len > z->longest) z->longest = len;
    return 0;
}

static void test_errors(void)
{
    mc_error err;
    mc_pretok *p = NULL;
    TAP_OK(mc_pattern_by_name("gpt3") == NULL, "unknown pattern name -> NULL");
    mc_status st = mc_pretok_new("(\\p{L}+", &p, &err);
    TAP_OK(st == MC_ERR_FORMAT && strstr(err.msg, "pre-tokenizer pattern") != NULL,
           "bad pattern is a format error: %s", err.msg);

    mc_pretok_iter *it = NULL;
    if (mc_pretok_new(MC_PATTERN_GPT2, &p, &err) != MC_OK || mc_pretok_iter_new(p, &it, &err)) {
        TAP_OK(0, "compile gpt2");
        return;
    }
    collect c = {.n = 0, .stop_after = 2};
    st = mc_pretok_split(it, "one two three", 13, collect_piece, &c, &err);
    TAP_OK(st == MC_ERR_INTERNAL && c.n == 2 && strstr(err.msg, "callback"),
           "a callback that returns non-zero stops the split: %s", err.msg);

    /* A 1 MB run of spaces (lookahead on a long run) and of letters. */
    size_t n = 1 << 20;
    char *big = malloc(n);
    memset(big, ' ', n);
    big[n - 1] = 'x';
    sizes sz = {0, 0, 0};
    st = mc_pretok_split(it, big, n, count_piece, &sz, &err);
    /* GPT-2: \s+(?!\S) takes all spaces but the last, then " x". */
    TAP_OK(st == MC_OK && sz.n == 2 && sz.total == n && sz.longest == n - 2,
           "1 MB run of spaces: %zu pieces, longest %zu", sz.n, sz.longest);
    free(big);
    mc_pretok_iter_free(it);
    mc_pretok_free(p);
}

int main(void)
{
    test_golden();
    test_utf8();
    test_errors();
    return tap_done();
}
