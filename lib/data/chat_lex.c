/*
 * chat_lex.c - the chat template lexer: template text to tokens, as jinja2's
 * lexer makes them under transformers' settings. Newlines are normalized
 * (\r\n and \r become \n) and one trailing newline is dropped
 * (keep_trailing_newline=False); "{%-", "-%}", "{{-", "-}}", "{#-", "-#}"
 * strip the whitespace beside them; trim_blocks drops the newline right after
 * a block or comment tag, lstrip_blocks the spaces and tabs between a line's
 * start and a block or comment tag ("{%+" and "+%}" opt out); a tag ends only
 * where its brackets balance; string literals are decoded as Python's
 * unicode-escape codec decodes them.
 */
#include "chat_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    chat_arena *a;
    const char *name;
    const char *s;
    size_t n, pos;
    int line;
    mc_error *err;
    chat_token *toks;
    size_t ntoks, cap;
} lexer;

static int lex_fail(lexer *L, int line, const char *msg, const char *arg)
{
    mc_error_set(L->err, MC_ERR_FORMAT, "%s:%d: syntax error: %s%s", L->name, line, msg,
                 arg ? arg : "");
    return -1;
}

static int push(lexer *L, chat_tok t, int line, const char *p, size_t n)
{
    if (L->ntoks == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        chat_token *nt = chat_alloc(L->a, cap * sizeof *nt);
        if (!nt) return lex_fail(L, line, "template too large", NULL);
        if (L->ntoks) memcpy(nt, L->toks, L->ntoks * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    chat_token *k = &L->toks[L->ntoks++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = line;
    k->s.p = p;
    k->s.n = n;
    return 0;
}

static int count_nl(const char *p, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] == '\n';
    return c;
}

/* Length of the run of (Unicode) whitespace at p. */
static size_t space_run(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp = chat_utf8_next(p, n, &j);
        if (!chat_py_isspace(cp)) break;
        i = j;
    }
    return i;
}

/* Length of p[0, n) without its trailing (Unicode) whitespace. */
static size_t rstrip_len(const char *p, size_t n)
{
    size_t keep = 0, i = 0;
    while (i < n) {
        uint32_t cp = chat_utf8_next(p, n, &i);
        if (!chat_py_isspace(cp)) keep = i;
    }
    return keep;
}

/* Emit the text before a tag, with the tag's whitespace control applied. */
static int emit_text(lexer *L, const char *p, size_t n, char sign, int is_var, int line_starting)
{
    int line = L->line;
    if (sign == '-') {
        n = rstrip_len(p, n);
    } else if (sign != '+' && !is_var) {
        size_t l_pos = n;
        while (l_pos > 0 && p[l_pos - 1] != '\n') l_pos--;
        if ((l_pos > 0 || line_starting) && l_pos < n &&
            space_run(p + l_pos, n - l_pos) == n - l_pos)
            n = l_pos;
    }
    if (n && push(L, CT_TEXT, line, p, n)) return -1;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decode a string literal's body as Python's unicode-escape codec does. */
static int unescape(lexer *L, int line, const char *p, size_t n, chat_str *out)
{
    char *o = chat_alloc(L->a, n + 1);
    if (!o) return lex_fail(L, line, "template too large", NULL);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] != '\\' || i + 1 >= n) {
            o[k++] = p[i++];
            continue;
        }
        char c = p[i + 1];
        i += 2;
        switch (c) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = '\a'; continue;
        case 'b': o[k++] = '\b'; continue;
        case 'f': o[k++] = '\f'; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = '\v'; continue;
        default: break;
        }
        if (c >= '0' && c <= '7') {
            uint32_t cp = (uint32_t)(c - '0');
            for (int d = 0; d < 2 && i < n && p[i] >= '0' && p[i] <= '7'; d++)
                cp = cp * 8 + (uint32_t)(p[i++] - '0');
            k += put_utf8(o + k, cp);
            continue;
        }
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            for (int d = 0; d < digits; d++) {
                int h = i < n ? hexval(p[i]) : -1;
                if (h < 0)
                    return lex_fail(L, line, "truncated \\",
                                    digits == 2 ? "xXX escape" : "uXXXX escape");
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10ffff) return lex_fail(L, line, "illegal Unicode character", NULL);
            if (k + 4 > n + 1) return lex_fail(L, line, "bad escape", NULL); /* cannot happen */
            k += put_utf8(o + k, cp);
            continue;
        }
        if (c == 'N') return lex_fail(L, line, "unsupported escape: \\N{...}", NULL);
        o[k++] = '\\'; /* unknown escapes stay as written */
        i--;
    }
    out->p = o;
    out->n = k;
    return 0;
}

static int is_name_start(unsigned char c)
{
    return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z');
}
static int is_name_char(unsigned char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* Digits with single underscores between them; returns the length. */
static size_t digit_run(const char *p, size_t n, int (*ok)(int))
{
    size_t i = 0;
    if (i >= n || !ok((unsigned char)p[i])) return 0;
    i++;
    while (i < n) {
        if (ok((unsigned char)p[i]))
            i++;
        else if (p[i] == '_' && i + 1 < n && ok((unsigned char)p[i + 1]))
            i += 2;
        else
            break;
    }
    return i;
}
static int ok_dec(int c) { return c >= '0' && c <= '9'; }
static int ok_hex(int c) { return hexval((char)c) >= 0; }
static int ok_oct(int c) { return c >= '0' && c <= '7'; }
static int ok_bin(int c) { return c == '0' || c == '1'; }

static int lex_number(lexer *L, const char *p, size_t n, size_t *used)
{
    /* float: digits ( .digits [exp] | exp ) */
    size_t d = digit_run(p, n, ok_dec);
    size_t i = d;
    int is_float = 0;
    if (i < n && p[i] == '.' && i + 1 < n && is_digit((unsigned char)p[i + 1])) {
        i += 1 + digit_run(p + i + 1, n - i - 1, ok_dec);
        is_float = 1;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (p[j] == '+' || p[j] == '-')) j++;
        size_t e = digit_run(p + j, n - j, ok_dec);
        if (e) {
            i = j + e;
            is_float = 1;
        }
    }
    char buf[128];
    if (is_float) {
        size_t k = 0;
        for (size_t j = 0; j < i && k + 1 < sizeof buf; j++)
            if (p[j] != '_') buf[k++] = p[j];
        buf[k] = 0;
        if (push(L, CT_FLOAT, L->line, p, i)) return -1;
        L->toks[L->ntoks - 1].f = strtod(buf, NULL);
        *used = i;
        return 0;
    }
    int base = 10;
    size_t start = 0;
    if (n >= 2 && p[0] == '0' && (p[1] | 32) == 'x') base = 16, start = 2;
    if (n >= 2 && p[0] == '0' && (p[1] | 32) == 'o') base = 8, start = 2;
    if (n >= 2 && p[0] == '0' && (p[1] | 32) == 'b') base = 2, start = 2;
    if (base != 10) {
        size_t j = start;
        if (j < n && p[j] == '_') j++;
        size_t e = digit_run(p + j, n - j, base == 16 ? ok_hex : base == 8 ? ok_oct : ok_bin);
        if (!e) return lex_fail(L, L->line, "invalid number literal", NULL);
        i = j + e;
    } else {
        i = d;
    }
    size_t k = 0;
    for (size_t j = start; j < i && k + 1 < sizeof buf; j++)
        if (p[j] != '_') buf[k++] = p[j];
    buf[k] = 0;
    char *end;
    unsigned long long u = strtoull(buf, &end, base);
    if (k >= sizeof buf - 1 || u > (unsigned long long)INT64_MAX)
        return lex_fail(L, L->line, "integer literal too large", NULL);
    if (push(L, CT_INT, L->line, p, i)) return -1;
    L->toks[L->ntoks - 1].i = (int64_t)u;
    *used = i;
    return 0;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char ops1[] = "+-/*%~[](){}><=.:|,;";

/* The inside of a {{ }} or {% %} tag, from L->pos; stops after the end tag. */
static int lex_tag(lexer *L, int is_var, int *line_starting)
{
    char stack[256];
    int depth = 0;
    const char *s = L->s;
    size_t n = L->n;
    int start_line = L->line;
    for (;;) {
        size_t p = L->pos;
        if (p >= n)
            return lex_fail(L, start_line,
                            is_var ? "unexpected end of template, expected '}}'"
                                   : "unexpected end of template, expected '%}'",
                            NULL);
        if (!depth) {
            const char *end = is_var ? "}}" : "%}";
            if (!is_var && s[p] == '+' && p + 2 < n && !strncmp(s + p + 1, end, 2)) {
                if (push(L, CT_BLK_END, L->line, s + p, 3)) return -1;
                L->pos = p + 3;
                *line_starting = 0;
                return 0;
            }
            if (s[p] == '-' && p + 2 < n && !strncmp(s + p + 1, end, 2)) {
                if (push(L, is_var ? CT_VAR_END : CT_BLK_END, L->line, s + p, 3)) return -1;
                size_t q = p + 3, w = space_run(s + q, n - q);
                L->line += count_nl(s + q, w);
                L->pos = q + w;
                *line_starting = w > 0 ? s[q + w - 1] == '\n' : 0;
                return 0;
            }
            if (p + 1 < n && !strncmp(s + p, end, 2)) {
                if (push(L, is_var ? CT_VAR_END : CT_BLK_END, L->line, s + p, 2)) return -1;
                L->pos = p + 2;
                *line_starting = 0;
                if (!is_var && L->pos < n && s[L->pos] == '\n') { /* trim_blocks */
                    L->pos++;
                    L->line++;
                    *line_starting = 1;
                }
                return 0;
            }
        }
        size_t w = space_run(s + p, n - p);
        if (w) {
            L->line += count_nl(s + p, w);
            L->pos += w;
            continue;
        }
        unsigned char c = (unsigned char)s[p];
        if (is_digit(c)) {
            size_t used;
            if (lex_number(L, s + p, n - p, &used)) return -1;
            L->pos += used;
            continue;
        }
        if (is_name_start(c)) {
            size_t q = p + 1;
            while (q < n && is_name_char((unsigned char)s[q])) q++;
            if (push(L, CT_NAME, L->line, s + p, q - p)) return -1;
            L->pos = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < n && s[q] != (char)c) q += s[q] == '\\' ? 2 : 1;
            if (q >= n) return lex_fail(L, L->line, "unterminated string", NULL);
            chat_str v;
            if (unescape(L, L->line, s + p + 1, q - p - 1, &v)) return -1;
            if (push(L, CT_STRING, L->line, v.p, v.n)) return -1;
            L->line += count_nl(s + p, q - p);
            L->pos = q + 1;
            continue;
        }
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
            if (p + 1 < n && !strncmp(s + p, ops2[k], 2)) oplen = 2;
        if (!oplen && c && strchr(ops1, c)) oplen = 1;
        if (!oplen) {
            char ch[8];
            snprintf(ch, sizeof ch, c >= 0x20 && c < 0x7f ? "'%c'" : "0x%02x", c);
            return lex_fail(L, L->line, "unexpected character ", ch);
        }
        if (oplen == 1 && (c == '(' || c == '[' || c == '{')) {
            if (depth == (int)sizeof stack)
                return lex_fail(L, L->line, "brackets nested too deep", NULL);
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (oplen == 1 && (c == ')' || c == ']' || c == '}')) {
            char m[4] = {'\'', (char)c, '\'', 0};
            if (!depth) return lex_fail(L, L->line, "unexpected ", m);
            if (stack[--depth] != (char)c) return lex_fail(L, L->line, "unexpected ", m);
        }
        if (push(L, CT_OP, L->line, s + p, oplen)) return -1;
        L->pos += oplen;
    }
}

/* Is s[p] the start of "{% raw %}"? Sets *end past it and *sign. */
static int match_raw(const char *s, size_t n, size_t p, const char *word, size_t *end, char *sign)
{
    size_t q = p + 2;
    *sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *sign = s[q++];
    q += space_run(s + q, n - q);
    size_t wl = strlen(word);
    if (q + wl > n || strncmp(s + q, word, wl)) return 0;
    q += wl;
    if (q < n && is_name_char((unsigned char)s[q])) return 0;
    q += space_run(s + q, n - q);
    *end = q;
    return 1;
}

int chat_lex(chat_arena *a, const char *name, const char *src, size_t len, chat_token **toks,
             size_t *ntoks, mc_error *err)
{
    lexer L = {.a = a, .name = name, .line = 1, .err = err};
    /* newlines normalized, one trailing newline dropped */
    char *s = chat_alloc(a, len + 1);
    if (!s) return lex_fail(&L, 1, "template too large", NULL);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    L.s = s;
    L.n = n;
    int line_starting = 1;
    while (L.pos < n) {
        size_t p = L.pos, q = p;
        /* the next tag start */
        while (q + 1 < n &&
               !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')))
            q++;
        if (q + 1 >= n) { /* data to the end */
            if (push(&L, CT_TEXT, L.line, s + p, n - p)) return -1;
            L.pos = n;
            break;
        }
        char kind = s[q + 1];
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t raw_end;
        char raw_sign;
        if (kind == '%' && match_raw(s, n, q, "raw", &raw_end, &raw_sign) && raw_end < n &&
            (!strncmp(s + raw_end, "%}", 2) || !strncmp(s + raw_end, "-%}", 3))) {
            if (emit_text(&L, s + p, q - p, raw_sign, 0, line_starting)) return -1;
            L.line += count_nl(s + p, q - p);
            size_t b = raw_end + (s[raw_end] == '-' ? 3 : 2);
            if (s[raw_end] == '-') b += space_run(s + b, n - b);
            L.line += count_nl(s + q, b - q);
            /* find {% endraw %} */
            size_t e = b, e_end = 0;
            char e_sign = 0;
            for (; e + 1 < n; e++) {
                if (s[e] == '{' && s[e + 1] == '%' &&
                    match_raw(s, n, e, "endraw", &e_end, &e_sign) && e_end < n &&
                    (!strncmp(s + e_end, "%}", 2) || !strncmp(s + e_end, "-%}", 3) ||
                     !strncmp(s + e_end, "+%}", 3)))
                    break;
            }
            if (e + 1 >= n) return lex_fail(&L, L.line, "missing end of raw directive", NULL);
            if (emit_text(&L, s + b, e - b, e_sign, 0, 0)) return -1;
            L.line += count_nl(s + b, e - b);
            size_t after = e_end;
            int ls = 0;
            if (s[after] == '+') {
                after += 3;
            } else if (s[after] == '-') {
                after += 3;
                size_t w = space_run(s + after, n - after);
                ls = w > 0 && s[after + w - 1] == '\n';
                after += w;
            } else {
                after += 2;
                if (after < n && s[after] == '\n') after++, ls = 1;
            }
            L.line += count_nl(s + e, after - e);
            L.pos = after;
            line_starting = ls;
            continue;
        }
        if (emit_text(&L, s + p, q - p, sign, kind == '{', line_starting)) return -1;
        L.line += count_nl(s + p, q - p);
        L.pos = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = L.pos;
            for (; e < n; e++) {
                if ((s[e] == '+' || s[e] == '-') && e + 2 < n && s[e + 1] == '#' && s[e + 2] == '}')
                    break;
                if (s[e] == '#' && e + 1 < n && s[e + 1] == '}') break;
            }
            if (e >= n) return lex_fail(&L, L.line, "missing end of comment tag", NULL);
            L.line += count_nl(s + L.pos, e - L.pos);
            line_starting = 0;
            if (s[e] == '+') {
                L.pos = e + 3;
            } else if (s[e] == '-') {
                size_t q2 = e + 3, w = space_run(s + q2, n - q2);
                L.line += count_nl(s + q2, w);
                L.pos = q2 + w;
                line_starting = w > 0 && s[q2 + w - 1] == '\n';
            } else {
                L.pos = e + 2;
                if (L.pos < n && s[L.pos] == '\n') L.pos++, L.line++, line_starting = 1;
            }
            continue;
        }
        if (push(&L, kind == '{' ? CT_VAR_BEG : CT_BLK_BEG, L.line, s + q, 2)) return -1;
        if (lex_tag(&L, kind == '{', &line_starting)) return -1;
    }
    if (push(&L, CT_EOF, L.line, s + n, 0)) return -1;
    *toks = L.toks;
    *ntoks = L.ntoks;
    return 0;
}
