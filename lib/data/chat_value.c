/*
 * chat_value.c - the values of the chat template engine: arenas, lists and
 * dicts (insertion-ordered, as Python's), conversion from JSON, truth and
 * equality as Python has them, str() and repr() as Python prints them,
 * transformers' tojson (json.dumps with ensure_ascii=False by default), and
 * the UTF-8 helpers that let string methods count code points as Python does.
 */
#include "chat_internal.h"
#include "gpt_internal.h" /* mc_py_float_repr */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- arenas */

struct chat_chunk {
    struct chat_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *chat_alloc(chat_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    if (a->limit && a->used + n > a->limit) return NULL;
    struct chat_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 60000 ? n : 60000;
        c = malloc(sizeof *c + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *chat_strndup(chat_arena *a, const char *s, size_t n)
{
    char *p = chat_alloc(a, n + 1);
    if (p && n) memcpy(p, s, n);
    return p;
}

void chat_arena_free(chat_arena *a)
{
    struct chat_chunk *c = a->head;
    while (c) {
        struct chat_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---------------------------------------------------------------- lists and dicts */

chat_list *chat_list_new(chat_arena *a, size_t cap)
{
    chat_list *l = chat_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = chat_alloc(a, cap * sizeof *l->v);
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

int chat_list_push(chat_arena *a, chat_list *l, chat_val v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        chat_val *nv = chat_alloc(a, cap * sizeof *nv);
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

chat_dict *chat_dict_new(chat_arena *a, size_t cap)
{
    chat_dict *d = chat_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->k = chat_alloc(a, cap * sizeof *d->k);
        d->v = chat_alloc(a, cap * sizeof *d->v);
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

int chat_dict_set(chat_arena *a, chat_dict *d, chat_val k, chat_val v)
{
    for (size_t i = 0; i < d->n; i++)
        if (chat_equal(d->k[i], k)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        chat_val *nk = chat_alloc(a, cap * sizeof *nk), *nv = chat_alloc(a, cap * sizeof *nv);
        if (!nk || !nv) return -1;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

const chat_val *chat_dict_get(const chat_dict *d, const char *key, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == CV_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, key, n))
            return &d->v[i];
    return NULL;
}

int chat_from_json(chat_arena *a, const json_t *j, chat_val *out)
{
    switch (json_typeof(j)) {
    case JSON_NULL: *out = cv_none(); return 0;
    case JSON_TRUE: *out = cv_bool(1); return 0;
    case JSON_FALSE: *out = cv_bool(0); return 0;
    case JSON_INTEGER: *out = cv_int(json_integer_value(j)); return 0;
    case JSON_REAL: *out = cv_float(json_real_value(j)); return 0;
    case JSON_STRING: *out = cv_str(json_string_value(j), json_string_length(j)); return 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        chat_list *l = chat_list_new(a, n);
        if (!l) return -1;
        for (size_t i = 0; i < n; i++)
            if (chat_from_json(a, json_array_get(j, i), &l->v[l->n++])) return -1;
        *out = (chat_val){.t = CV_LIST, .l = l};
        return 0;
    }
    case JSON_OBJECT: {
        chat_dict *d = chat_dict_new(a, json_object_size(j));
        if (!d) return -1;
        /* jansson keeps insertion order, as Python's json.load does */
        for (void *it = json_object_iter((json_t *)j); it;
             it = json_object_iter_next((json_t *)j, it)) {
            const char *key = json_object_iter_key(it);
            chat_val v;
            if (chat_from_json(a, json_object_iter_value(it), &v)) return -1;
            d->k[d->n] = cv_str(key, strlen(key));
            d->v[d->n++] = v;
        }
        *out = (chat_val){.t = CV_DICT, .d = d};
        return 0;
    }
    }
    return -1;
}

/* ---------------------------------------------------------------- truth and equality */

int chat_truthy(chat_val v)
{
    switch (v.t) {
    case CV_UNDEF:
    case CV_NONE: return 0;
    case CV_BOOL: return v.b;
    case CV_INT: return v.i != 0;
    case CV_FLOAT: return v.f != 0;
    case CV_STR: return v.s.n != 0;
    case CV_LIST: return v.l->n != 0;
    case CV_DICT: return v.d->n != 0;
    default: return 1;
    }
}

static int is_num(chat_val v) { return v.t == CV_BOOL || v.t == CV_INT || v.t == CV_FLOAT; }

int chat_equal(chat_val a, chat_val b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t == CV_FLOAT || b.t == CV_FLOAT) {
            double x = a.t == CV_FLOAT ? a.f : a.t == CV_INT ? (double)a.i : a.b;
            double y = b.t == CV_FLOAT ? b.f : b.t == CV_INT ? (double)b.i : b.b;
            return x == y;
        }
        int64_t x = a.t == CV_INT ? a.i : a.b, y = b.t == CV_INT ? b.i : b.b;
        return x == y;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case CV_UNDEF:
    case CV_NONE: return 1;
    case CV_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case CV_LIST:
        if (a.tuple != b.tuple || a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!chat_equal(a.l->v[i], b.l->v[i])) return 0;
        return 1;
    case CV_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            size_t j;
            for (j = 0; j < b.d->n; j++)
                if (chat_equal(a.d->k[i], b.d->k[j])) break;
            if (j == b.d->n || !chat_equal(a.d->v[i], b.d->v[j])) return 0;
        }
        return 1;
    case CV_NS: return a.d == b.d;
    case CV_MACRO: return a.macro == b.macro;
    case CV_FUNC: return a.func == b.func;
    default: return 0;
    }
}

const char *chat_type_name(chat_val v)
{
    switch (v.t) {
    case CV_UNDEF: return "Undefined";
    case CV_NONE: return "NoneType";
    case CV_BOOL: return "bool";
    case CV_INT: return "int";
    case CV_FLOAT: return "float";
    case CV_STR: return "str";
    case CV_LIST: return v.tuple ? "tuple" : "list";
    case CV_DICT: return "dict";
    case CV_NS: return "Namespace";
    case CV_MACRO: return "Macro";
    case CV_FUNC: return "function";
    case CV_METHOD: return "method";
    case CV_LOOP: return "LoopContext";
    }
    return "object";
}

/* ---------------------------------------------------------------- str() and repr() */

static int put(mc_buf *b, const char *p, size_t n) { return mc_buf_append(b, p, n, NULL) ? -1 : 0; }
static int puts_(mc_buf *b, const char *s) { return put(b, s, strlen(s)); }

static int repr_str(mc_buf *b, chat_str s)
{
    int has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (put(b, &q, 1)) return -1;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char esc[8];
        const char *e = NULL;
        if (c == '\\')
            e = "\\\\";
        else if (c == (unsigned char)q)
            e = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n')
            e = "\\n";
        else if (c == '\r')
            e = "\\r";
        else if (c == '\t')
            e = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            e = esc;
        }
        if (e ? puts_(b, e) : put(b, (const char *)&c, 1)) return -1;
    }
    return put(b, &q, 1);
}

static int num_str(mc_buf *b, chat_val v)
{
    char tmp[40];
    if (v.t == CV_BOOL) return puts_(b, v.b ? "True" : "False");
    if (v.t == CV_INT) {
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        return puts_(b, tmp);
    }
    if (isnan(v.f)) return puts_(b, "nan");
    if (isinf(v.f)) return puts_(b, v.f > 0 ? "inf" : "-inf");
    mc_py_float_repr(v.f, tmp);
    return puts_(b, tmp);
}

int chat_repr(mc_buf *b, chat_val v)
{
    switch (v.t) {
    case CV_UNDEF: return 0;
    case CV_NONE: return puts_(b, "None");
    case CV_BOOL:
    case CV_INT:
    case CV_FLOAT: return num_str(b, v);
    case CV_STR: return repr_str(b, v.s);
    case CV_LIST:
        if (puts_(b, v.tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < v.l->n; i++)
            if ((i && puts_(b, ", ")) || chat_repr(b, v.l->v[i])) return -1;
        if (v.tuple && v.l->n == 1 && puts_(b, ",")) return -1;
        return puts_(b, v.tuple ? ")" : "]");
    case CV_DICT:
    case CV_NS:
        if (v.t == CV_NS && puts_(b, "<Namespace ")) return -1;
        if (puts_(b, "{")) return -1;
        for (size_t i = 0; i < v.d->n; i++)
            if ((i && puts_(b, ", ")) || chat_repr(b, v.d->k[i]) || puts_(b, ": ") ||
                chat_repr(b, v.d->v[i]))
                return -1;
        return puts_(b, v.t == CV_NS ? "}>" : "}");
    case CV_MACRO:
        return puts_(b, "<Macro '") || put(b, v.macro->name.p, v.macro->name.n) || puts_(b, "'>");
    default: return puts_(b, "<") || puts_(b, chat_type_name(v)) || puts_(b, " object>");
    }
}

int chat_str_of(mc_buf *b, chat_val v)
{
    if (v.t == CV_STR) return put(b, v.s.p, v.s.n);
    if (v.t == CV_FLOAT || v.t == CV_INT || v.t == CV_BOOL) return num_str(b, v);
    return chat_repr(b, v);
}

/* ---------------------------------------------------------------- json.dumps */

static int json_str(mc_buf *b, chat_str s, int ensure_ascii)
{
    if (put(b, "\"", 1)) return -1;
    for (size_t i = 0; i < s.n;) {
        size_t i0 = i;
        uint32_t cp = chat_utf8_next(s.p, s.n, &i);
        char esc[16];
        const char *e = NULL;
        switch (cp) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp >= 0x7f && cp < 0x10000)) {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
                e = esc;
            } else if (ensure_ascii && cp >= 0x10000) {
                uint32_t c = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (c >> 10),
                         0xdc00 + (c & 0x3ff));
                e = esc;
            }
        }
        if (e ? puts_(b, e) : put(b, s.p + i0, i - i0)) return -1;
    }
    return put(b, "\"", 1);
}

static int json_newline(mc_buf *b, int indent, int depth)
{
    if (put(b, "\n", 1)) return -1;
    for (int i = 0; i < indent * depth; i++)
        if (put(b, " ", 1)) return -1;
    return 0;
}

static int cmp_keys(const void *x, const void *y)
{
    const chat_val *a = *(const chat_val *const *)x, *b = *(const chat_val *const *)y;
    size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
    int c = memcmp(a->s.p, b->s.p, n);
    return c ? c : (a->s.n > b->s.n) - (a->s.n < b->s.n);
}

int chat_json_dumps(mc_buf *b, chat_val v, int ensure_ascii, int indent, const char *item_sep,
                    const char *key_sep, int sort_keys, int depth, chat_val *bad)
{
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    if (depth > 500) {
        *bad = v;
        return -2;
    }
    switch (v.t) {
    case CV_NONE: return puts_(b, "null");
    case CV_BOOL: return puts_(b, v.b ? "true" : "false");
    case CV_INT: return num_str(b, v);
    case CV_FLOAT:
        if (isnan(v.f)) return puts_(b, "NaN");
        if (isinf(v.f)) return puts_(b, v.f > 0 ? "Infinity" : "-Infinity");
        return num_str(b, v);
    case CV_STR: return json_str(b, v.s, ensure_ascii);
    case CV_LIST:
        if (!v.l->n) return puts_(b, "[]");
        if (puts_(b, "[")) return -1;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && puts_(b, item_sep)) return -1;
            if (indent >= 0 && json_newline(b, indent, depth + 1)) return -1;
            int r = chat_json_dumps(b, v.l->v[i], ensure_ascii, indent, item_sep, key_sep,
                                    sort_keys, depth + 1, bad);
            if (r) return r;
        }
        if (indent >= 0 && json_newline(b, indent, depth)) return -1;
        return puts_(b, "]");
    case CV_DICT:
    case CV_NS: {
        if (!v.d->n) return puts_(b, "{}");
        const chat_val **order = malloc(v.d->n * sizeof *order);
        if (!order) return -1;
        int r = 0;
        for (size_t i = 0; i < v.d->n; i++) {
            order[i] = &v.d->k[i];
            if (v.d->k[i].t != CV_STR && v.d->k[i].t != CV_INT && v.d->k[i].t != CV_NONE &&
                v.d->k[i].t != CV_BOOL && v.d->k[i].t != CV_FLOAT) {
                *bad = v.d->k[i];
                r = -2;
            }
        }
        if (!r && sort_keys) {
            for (size_t i = 0; i < v.d->n; i++)
                if (v.d->k[i].t != CV_STR) {
                    *bad = v.d->k[i];
                    r = -2;
                }
            if (!r) qsort(order, v.d->n, sizeof *order, cmp_keys);
        }
        if (!r) r = puts_(b, "{");
        for (size_t i = 0; i < v.d->n && !r; i++) {
            const chat_val *k = order[i];
            size_t at = (size_t)(k - v.d->k);
            if (i) r = puts_(b, item_sep);
            if (!r && indent >= 0) r = json_newline(b, indent, depth + 1);
            if (r) break;
            if (k->t == CV_STR) {
                r = json_str(b, k->s, ensure_ascii);
            } else { /* Python turns other keys into strings */
                mc_buf t = MC_BUF_INIT;
                r = k->t == CV_NONE   ? puts_(&t, "null")
                    : k->t == CV_BOOL ? puts_(&t, k->b ? "true" : "false")
                                      : num_str(&t, *k);
                if (!r) r = json_str(b, (chat_str){t.data ? t.data : "", t.len}, ensure_ascii);
                mc_buf_free(&t);
            }
            if (!r) r = puts_(b, key_sep);
            if (!r)
                r = chat_json_dumps(b, v.d->v[at], ensure_ascii, indent, item_sep, key_sep,
                                    sort_keys, depth + 1, bad);
        }
        free(order);
        if (r) return r;
        if (indent >= 0 && json_newline(b, indent, depth)) return -1;
        return puts_(b, "}");
    }
    default: *bad = v; return -2;
    }
}

/* ---------------------------------------------------------------- UTF-8 */

uint32_t chat_utf8_next(const char *p, size_t n, size_t *i)
{
    unsigned char c = (unsigned char)p[*i];
    size_t k = c < 0x80             ? 1
               : (c & 0xe0) == 0xc0 ? 2
               : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4
                                    : 1;
    if (*i + k > n) k = 1;
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
    for (size_t j = 1; j < k; j++) cp = cp << 6 | ((unsigned char)p[*i + j] & 0x3f);
    *i += k;
    return cp;
}

size_t chat_utf8_len(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n;) {
        chat_utf8_next(p, n, &i);
        c++;
    }
    return c;
}

size_t chat_utf8_offset(const char *p, size_t n, size_t cp_index)
{
    size_t i = 0;
    for (size_t c = 0; c < cp_index && i < n; c++) chat_utf8_next(p, n, &i);
    return i;
}

int chat_py_isspace(uint32_t cp)
{
    return (cp >= 9 && cp <= 13) || (cp >= 28 && cp <= 32) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

int chat_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += k;
    }
    return 1;
}
