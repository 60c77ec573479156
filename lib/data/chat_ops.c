/*
 * chat_ops.c - what chat templates do to values: attribute and item lookup
 * (jinja2's sandboxed getattr/getitem: a missing key is undefined),
 * arithmetic and comparison operators with Python's types, the tests mc
 * supports, and Python's string/dict/list methods. A test or method outside
 * the subset is an error naming it.
 */
#include "chat_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int chat_rt_fail(chat_rt *rt, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mc_error_set(rt->err, MC_ERR_FORMAT, "%s:%d: %s", rt->name, rt->line, msg);
    return -1;
}

int chat_oom(chat_rt *rt) { return chat_rt_fail(rt, "out of memory (render limit)"); }

chat_val chat_make_str(chat_rt *rt, const char *p, size_t n)
{
    char *s = chat_strndup(rt->a, p, n);
    if (!s) return cv_undef(NULL);
    return cv_str(s, n);
}

/* a value's str() in the arena */
int chat_to_str(chat_rt *rt, chat_val v, chat_str *out)
{
    if (v.t == CV_STR) {
        *out = v.s;
        return 0;
    }
    mc_buf b = MC_BUF_INIT;
    if (chat_str_of(&b, v)) {
        mc_buf_free(&b);
        return chat_oom(rt);
    }
    char *s = chat_strndup(rt->a, b.data ? b.data : "", b.len);
    out->p = s;
    out->n = b.len;
    mc_buf_free(&b);
    return s ? 0 : chat_oom(rt);
}

int chat_seq_eq(chat_str s, const char *w) { return s.n == strlen(w) && !memcmp(s.p, w, s.n); }

int chat_undefined_error(chat_rt *rt, chat_val v)
{
    if (v.s.p) return chat_rt_fail(rt, "undefined value: %.*s", (int)v.s.n, v.s.p);
    return chat_rt_fail(rt, "undefined value");
}

/* ---------------------------------------------------------------- lookup */

static const char *const str_methods[] = {
    "strip",        "lstrip",       "rstrip",     "split",    "startswith", "endswith",
    "upper",        "lower",        "title",      "replace",  "capitalize", "find",
    "rfind",        "count",        "join",       "isdigit",  "isalpha",    "isspace",
    "isalnum",      "islower",      "isupper",    "rsplit",   "splitlines", "format",
    "encode",       "center",       "ljust",      "rjust",    "zfill",      "index",
    "rindex",       "partition",    "rpartition", "swapcase", "casefold",   "expandtabs",
    "removeprefix", "removesuffix", NULL};
static const char *const dict_methods[] = {"items", "keys",    "values", "get",
                                           "copy",  "pop",     "update", "setdefault",
                                           "clear", "popitem", NULL};
static const char *const list_methods[] = {"index",  "count", "append", "extend",  "insert", "pop",
                                           "remove", "clear", "sort",   "reverse", "copy",   NULL};

int chat_in_list(const char *const *l, chat_str s)
{
    for (int i = 0; l[i]; i++)
        if (chat_seq_eq(s, l[i])) return 1;
    return 0;
}

static int make_method(chat_rt *rt, chat_val self, chat_str name, chat_val *out)
{
    chat_method *m = chat_alloc(rt->a, sizeof *m);
    if (!m) return chat_oom(rt);
    m->self = self;
    m->name = name;
    *out = (chat_val){.t = CV_METHOD, .m = m};
    return 0;
}

static int loop_attr(chat_rt *rt, const chat_loop *L, chat_str a, chat_val *out)
{
    size_t n = L->items->n, i = L->index0;
    if (chat_seq_eq(a, "index"))
        *out = cv_int((int64_t)i + 1);
    else if (chat_seq_eq(a, "index0"))
        *out = cv_int((int64_t)i);
    else if (chat_seq_eq(a, "revindex"))
        *out = cv_int((int64_t)(n - i));
    else if (chat_seq_eq(a, "revindex0"))
        *out = cv_int((int64_t)(n - i - 1));
    else if (chat_seq_eq(a, "first"))
        *out = cv_bool(i == 0);
    else if (chat_seq_eq(a, "last"))
        *out = cv_bool(i + 1 == n);
    else if (chat_seq_eq(a, "length"))
        *out = cv_int((int64_t)n);
    else if (chat_seq_eq(a, "previtem"))
        *out = i ? L->items->v[i - 1] : cv_undef("previtem");
    else if (chat_seq_eq(a, "nextitem"))
        *out = i + 1 < n ? L->items->v[i + 1] : cv_undef("nextitem");
    else if (chat_seq_eq(a, "depth"))
        *out = cv_int(L->depth);
    else if (chat_seq_eq(a, "depth0"))
        *out = cv_int(L->depth - 1);
    else if (chat_seq_eq(a, "cycle") || chat_seq_eq(a, "changed"))
        return chat_rt_fail(rt, "unsupported: loop.%.*s", (int)a.n, a.p);
    else
        *out = cv_undef("loop attribute");
    return 0;
}

int chat_getattr(chat_rt *rt, chat_val obj, chat_str attr, chat_val *out)
{
    switch (obj.t) {
    case CV_UNDEF: return chat_undefined_error(rt, obj);
    case CV_STR:
        if (chat_in_list(str_methods, attr)) return make_method(rt, obj, attr, out);
        break;
    case CV_DICT:
        if (chat_in_list(dict_methods, attr)) return make_method(rt, obj, attr, out);
        break;
    case CV_LIST:
        if (chat_in_list(list_methods, attr)) return make_method(rt, obj, attr, out);
        break;
    case CV_NS: {
        const chat_val *v = chat_dict_get(obj.d, attr.p, attr.n);
        *out = v ? *v : cv_undef(NULL);
        return 0;
    }
    case CV_LOOP: return loop_attr(rt, obj.loop, attr, out);
    default: break;
    }
    return chat_getitem(rt, obj, cv_str(attr.p, attr.n), out) == 0 ? 0 : -1;
}

static int64_t as_index(chat_val v, int *ok)
{
    *ok = v.t == CV_INT || v.t == CV_BOOL;
    return v.t == CV_INT ? v.i : v.t == CV_BOOL ? v.b : 0;
}

int chat_getitem(chat_rt *rt, chat_val obj, chat_val key, chat_val *out)
{
    int ok;
    *out = cv_undef(NULL);
    switch (obj.t) {
    case CV_UNDEF: return chat_undefined_error(rt, obj);
    case CV_LIST: {
        int64_t i = as_index(key, &ok), n = (int64_t)obj.l->n;
        if (ok) {
            if (i < 0) i += n;
            if (i >= 0 && i < n) *out = obj.l->v[i];
            return 0;
        }
        break;
    }
    case CV_STR: {
        int64_t i = as_index(key, &ok);
        if (ok) {
            int64_t n = (int64_t)chat_utf8_len(obj.s.p, obj.s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t b = chat_utf8_offset(obj.s.p, obj.s.n, (size_t)i), e = b;
                chat_utf8_next(obj.s.p, obj.s.n, &e);
                *out = cv_str(obj.s.p + b, e - b);
            }
            return 0;
        }
        break;
    }
    case CV_DICT:
    case CV_NS:
        for (size_t i = 0; i < obj.d->n; i++)
            if (chat_equal(obj.d->k[i], key)) {
                *out = obj.d->v[i];
                return 0;
            }
        break;
    case CV_LOOP:
        if (key.t == CV_STR) return loop_attr(rt, obj.loop, key.s, out);
        break;
    default: break;
    }
    /* a string key that is no item may name a method */
    if (key.t == CV_STR && obj.t != CV_NS && obj.t != CV_LOOP) {
        if ((obj.t == CV_STR && chat_in_list(str_methods, key.s)) ||
            (obj.t == CV_DICT && chat_in_list(dict_methods, key.s)) ||
            (obj.t == CV_LIST && chat_in_list(list_methods, key.s)))
            return make_method(rt, obj, key.s, out);
    }
    if (key.t == CV_STR) *out = cv_undef(NULL);
    return 0;
}

/* ---------------------------------------------------------------- operators */

int chat_is_num(chat_val v) { return v.t == CV_BOOL || v.t == CV_INT || v.t == CV_FLOAT; }
double chat_num_f(chat_val v) { return v.t == CV_FLOAT ? v.f : v.t == CV_INT ? (double)v.i : v.b; }
int64_t chat_num_i(chat_val v) { return v.t == CV_INT ? v.i : v.b; }

static int type_error(chat_rt *rt, const char *op, chat_val x, chat_val y)
{
    if (x.t == CV_UNDEF) return chat_undefined_error(rt, x);
    if (y.t == CV_UNDEF) return chat_undefined_error(rt, y);
    return chat_rt_fail(rt, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                        chat_type_name(x), chat_type_name(y));
}

static int cat(chat_rt *rt, chat_str a, chat_str b, chat_val *out)
{
    char *s = chat_alloc(rt->a, a.n + b.n + 1);
    if (!s) return chat_oom(rt);
    memcpy(s, a.p, a.n);
    memcpy(s + a.n, b.p, b.n);
    *out = cv_str(s, a.n + b.n);
    return 0;
}

int chat_compare_order(chat_rt *rt, const char *op, chat_val x, chat_val y, int *c)
{
    if (chat_is_num(x) && chat_is_num(y)) {
        if (x.t == CV_FLOAT || y.t == CV_FLOAT) {
            double a = chat_num_f(x), b = chat_num_f(y);
            *c = a < b ? -1 : a > b ? 1 : 0;
            if (isnan(a) || isnan(b)) *c = 2;
        } else {
            int64_t a = chat_num_i(x), b = chat_num_i(y);
            *c = a < b ? -1 : a > b;
        }
        return 0;
    }
    if (x.t == CV_STR && y.t == CV_STR) {
        size_t n = x.s.n < y.s.n ? x.s.n : y.s.n;
        int r = memcmp(x.s.p, y.s.p, n);
        *c = r < 0 ? -1 : r > 0 ? 1 : (x.s.n > y.s.n) - (x.s.n < y.s.n);
        return 0;
    }
    if (x.t == CV_LIST && y.t == CV_LIST) {
        for (size_t i = 0; i < x.l->n && i < y.l->n; i++)
            if (!chat_equal(x.l->v[i], y.l->v[i]))
                return chat_compare_order(rt, op, x.l->v[i], y.l->v[i], c);
        *c = (x.l->n > y.l->n) - (x.l->n < y.l->n);
        return 0;
    }
    return chat_rt_fail(rt, "'%s' not supported between instances of '%s' and '%s'", op,
                        chat_type_name(x), chat_type_name(y));
}

static int contains(chat_rt *rt, chat_val item, chat_val seq, int *res)
{
    *res = 0;
    switch (seq.t) {
    case CV_UNDEF: return 0;
    case CV_STR:
        if (item.t != CV_STR)
            return chat_rt_fail(rt, "'in <string>' requires string as left operand, not %s",
                                chat_type_name(item));
        *res = item.s.n == 0 || memmem(seq.s.p, seq.s.n, item.s.p, item.s.n) != NULL;
        return 0;
    case CV_LIST:
        for (size_t i = 0; i < seq.l->n; i++)
            if (chat_equal(seq.l->v[i], item)) *res = 1;
        return 0;
    case CV_DICT:
    case CV_NS:
        for (size_t i = 0; i < seq.d->n; i++)
            if (chat_equal(seq.d->k[i], item)) *res = 1;
        return 0;
    default: return chat_rt_fail(rt, "argument of type '%s' is not iterable", chat_type_name(seq));
    }
}

int chat_binop(chat_rt *rt, int op, chat_val x, chat_val y, chat_val *out)
{
    static const char *const names[] = {"+",  "-",  "*", "/",  "//", "%",  "**", "~",
                                        "==", "!=", "<", "<=", ">",  ">=", "in", "not in"};
    const char *nm = names[op];
    int c, r;
    switch (op) {
    case CO_EQ: *out = cv_bool(chat_equal(x, y)); return 0;
    case CO_NE: *out = cv_bool(!chat_equal(x, y)); return 0;
    case CO_LT:
    case CO_LE:
    case CO_GT:
    case CO_GE:
        if (x.t == CV_UNDEF || y.t == CV_UNDEF) return type_error(rt, nm, x, y);
        if (chat_compare_order(rt, nm, x, y, &c)) return -1;
        *out = cv_bool(c == 2        ? 0
                       : op == CO_LT ? c < 0
                       : op == CO_LE ? c <= 0
                       : op == CO_GT ? c > 0
                                     : c >= 0);
        return 0;
    case CO_IN:
    case CO_NOTIN:
        if (contains(rt, x, y, &r)) return -1;
        *out = cv_bool(op == CO_IN ? r : !r);
        return 0;
    case CO_CONCAT: {
        chat_str a, b;
        if (chat_to_str(rt, x, &a) || chat_to_str(rt, y, &b)) return -1;
        return cat(rt, a, b, out);
    }
    default: break;
    }
    if (op == CO_ADD && x.t == CV_STR && y.t == CV_STR) return cat(rt, x.s, y.s, out);
    if (op == CO_ADD && x.t == CV_LIST && y.t == CV_LIST) {
        chat_list *l = chat_list_new(rt->a, x.l->n + y.l->n);
        if (!l) return chat_oom(rt);
        memcpy(l->v, x.l->v, x.l->n * sizeof *l->v);
        memcpy(l->v + x.l->n, y.l->v, y.l->n * sizeof *l->v);
        l->n = x.l->n + y.l->n;
        *out = (chat_val){.t = CV_LIST, .l = l, .tuple = x.tuple};
        return 0;
    }
    if (op == CO_MUL && ((x.t == CV_STR && (y.t == CV_INT || y.t == CV_BOOL)) ||
                         (y.t == CV_STR && (x.t == CV_INT || x.t == CV_BOOL)))) {
        chat_str s = x.t == CV_STR ? x.s : y.s;
        int64_t k = x.t == CV_STR ? chat_num_i(y) : chat_num_i(x);
        if (k <= 0 || !s.n) {
            *out = cv_str("", 0);
            return 0;
        }
        if ((uint64_t)k > (1u << 30) / s.n) return chat_oom(rt);
        char *p = chat_alloc(rt->a, s.n * (size_t)k + 1);
        if (!p) return chat_oom(rt);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s.n, s.p, s.n);
        *out = cv_str(p, s.n * (size_t)k);
        return 0;
    }
    if (op == CO_MOD && x.t == CV_STR)
        return chat_rt_fail(rt, "unsupported construct: %% string formatting");
    if (!chat_is_num(x) || !chat_is_num(y)) return type_error(rt, nm, x, y);
    if (x.t != CV_FLOAT && y.t != CV_FLOAT && op != CO_DIV) {
        int64_t a = chat_num_i(x), b = chat_num_i(y), v = 0;
        int of = 0;
        switch (op) {
        case CO_ADD: of = __builtin_add_overflow(a, b, &v); break;
        case CO_SUB: of = __builtin_sub_overflow(a, b, &v); break;
        case CO_MUL: of = __builtin_mul_overflow(a, b, &v); break;
        case CO_FLOORDIV:
        case CO_MOD:
            if (!b) return chat_rt_fail(rt, "integer division or modulo by zero");
            if (a == INT64_MIN && b == -1) {
                of = 1;
                break;
            }
            v = a / b;
            if ((a % b != 0) && ((a < 0) != (b < 0))) v--;
            if (op == CO_MOD) v = a - v * b;
            break;
        case CO_POW:
            if (b < 0) {
                *out = cv_float(pow((double)a, (double)b));
                return 0;
            }
            v = 1;
            for (int64_t i = 0; i < b && !of; i++) of = __builtin_mul_overflow(v, a, &v);
            break;
        }
        if (of) return chat_rt_fail(rt, "integer overflow");
        *out = cv_int(v);
        return 0;
    }
    double a = chat_num_f(x), b = chat_num_f(y), v = 0;
    switch (op) {
    case CO_ADD: v = a + b; break;
    case CO_SUB: v = a - b; break;
    case CO_MUL: v = a * b; break;
    case CO_DIV:
        if (b == 0) return chat_rt_fail(rt, "division by zero");
        v = a / b;
        break;
    case CO_FLOORDIV:
    case CO_MOD:
        if (b == 0) return chat_rt_fail(rt, "float floor division or modulo by zero");
        v = fmod(a, b);
        if (op == CO_MOD) {
            if (v != 0 && ((v < 0) != (b < 0))) v += b;
        } else {
            v = floor(a / b);
        }
        break;
    case CO_POW: v = pow(a, b); break;
    }
    *out = cv_float(v);
    return 0;
}

/* ---------------------------------------------------------------- string helpers */

static int cp_in(uint32_t cp, chat_str chars)
{
    for (size_t i = 0; i < chars.n;)
        if (chat_utf8_next(chars.p, chars.n, &i) == cp) return 1;
    return 0;
}

/* Python's strip family: which = 1 left, 2 right, 3 both; chars NULL: whitespace */
chat_str chat_py_strip(chat_str s, const chat_str *chars, int which)
{
    size_t b = 0, e = s.n;
    if (which & 1)
        while (b < e) {
            size_t j = b;
            uint32_t cp = chat_utf8_next(s.p, e, &j);
            if (chars ? !cp_in(cp, *chars) : !chat_py_isspace(cp)) break;
            b = j;
        }
    if (which & 2) {
        size_t keep = b;
        for (size_t i = b; i < e;) {
            uint32_t cp = chat_utf8_next(s.p, e, &i);
            if (chars ? !cp_in(cp, *chars) : !chat_py_isspace(cp)) keep = i;
        }
        e = keep;
    }
    return (chat_str){s.p + b, e - b};
}

uint32_t chat_map_upper(uint32_t c) { return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c); }
uint32_t chat_map_lower(uint32_t c) { return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c); }
static uint32_t map_title(uint32_t c) { return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c); }
static int is_cased(uint32_t c)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* mode 0: each code point through f; 1: Python's title(); 2: capitalize() */
int chat_case_map(chat_rt *rt, chat_str s, chat_cp_map f, int mode, chat_val *out)
{
    char *o = chat_alloc(rt->a, s.n * 2 + 4);
    if (!o) return chat_oom(rt);
    size_t k = 0;
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp = chat_utf8_next(s.p, s.n, &i), m;
        if (mode == 1) {
            m = is_cased(cp) ? (prev_cased ? chat_map_lower(cp) : map_title(cp)) : cp;
            prev_cased = is_cased(cp);
        } else if (mode == 2) {
            m = first ? map_title(cp) : chat_map_lower(cp);
            first = 0;
        } else {
            m = f(cp);
        }
        utf8proc_uint8_t tmp[4];
        utf8proc_ssize_t w = utf8proc_encode_char((utf8proc_int32_t)m, tmp);
        if (k + (size_t)w > s.n * 2 + 4) return chat_oom(rt);
        memcpy(o + k, tmp, (size_t)w);
        k += (size_t)w;
    }
    *out = cv_str(o, k);
    return 0;
}

int chat_str_replace(chat_rt *rt, chat_str s, chat_str old, chat_str new_, int64_t count,
                     chat_val *out)
{
    mc_buf b = MC_BUF_INIT;
    int r = 0;
    int64_t done = 0;
    if (!old.n) { /* Python inserts new before every code point and at the end */
        for (size_t i = 0; i <= s.n && !r;) {
            if (count < 0 || done < count) {
                r |= mc_buf_append(&b, new_.p, new_.n, NULL) != MC_OK;
                done++;
            }
            if (i == s.n) break;
            size_t j = i;
            chat_utf8_next(s.p, s.n, &j);
            r |= mc_buf_append(&b, s.p + i, j - i, NULL) != MC_OK;
            i = j;
        }
    } else {
        size_t i = 0;
        while (i < s.n && !r) {
            const char *f = (count < 0 || done < count) ? memmem(s.p + i, s.n - i, old.p, old.n)
                                                        : NULL;
            if (!f) break;
            size_t at = (size_t)(f - s.p);
            r |= mc_buf_append(&b, s.p + i, at - i, NULL) != MC_OK;
            r |= mc_buf_append(&b, new_.p, new_.n, NULL) != MC_OK;
            i = at + old.n;
            done++;
        }
        r |= mc_buf_append(&b, s.p + i, s.n - i, NULL) != MC_OK;
    }
    if (!r) *out = chat_make_str(rt, b.data ? b.data : "", b.len);
    mc_buf_free(&b);
    return r || out->t != CV_STR ? chat_oom(rt) : 0;
}

int chat_str_split(chat_rt *rt, chat_str s, const chat_str *sep, int64_t maxsplit, chat_val *out)
{
    chat_list *l = chat_list_new(rt->a, 0);
    if (!l) return chat_oom(rt);
    if (sep) {
        if (!sep->n) return chat_rt_fail(rt, "empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || done < maxsplit)
                                ? memmem(s.p + i, s.n - i, sep->p, sep->n)
                                : NULL;
            if (!f) break;
            if (chat_list_push(rt->a, l, cv_str(s.p + i, (size_t)(f - s.p) - i)))
                return chat_oom(rt);
            i = (size_t)(f - s.p) + sep->n;
            done++;
        }
        if (chat_list_push(rt->a, l, cv_str(s.p + i, s.n - i))) return chat_oom(rt);
    } else {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < s.n) { /* skip whitespace */
                size_t j = i;
                if (!chat_py_isspace(chat_utf8_next(s.p, s.n, &j))) break;
                i = j;
            }
            if (i >= s.n) break;
            if (maxsplit >= 0 && done >= maxsplit) {
                chat_str rest = chat_py_strip((chat_str){s.p + i, s.n - i}, NULL, 2);
                if (chat_list_push(rt->a, l, cv_str(rest.p, rest.n))) return chat_oom(rt);
                break;
            }
            size_t b = i;
            while (i < s.n) {
                size_t j = i;
                if (chat_py_isspace(chat_utf8_next(s.p, s.n, &j))) break;
                i = j;
            }
            if (chat_list_push(rt->a, l, cv_str(s.p + b, i - b))) return chat_oom(rt);
            done++;
        }
    }
    *out = (chat_val){.t = CV_LIST, .l = l};
    return 0;
}

/* ---------------------------------------------------------------- arguments */

/* The argument at position pos or named name; NULL when absent. */
const chat_val *chat_arg(const chat_call *c, size_t pos, const char *name)
{
    if (c && pos < c->nargs) return &c->args[pos];
    if (c)
        for (size_t i = 0; i < c->nkw; i++)
            if (chat_seq_eq(c->kwnames[i], name)) return &c->kwargs[i];
    return NULL;
}

int chat_check_args(chat_rt *rt, const chat_call *c, size_t maxpos, const char *const *names,
                    const char *what)
{
    if (!c) return 0;
    if (c->nargs > maxpos) return chat_rt_fail(rt, "%s takes at most %zu arguments", what, maxpos);
    for (size_t i = 0; i < c->nkw; i++) {
        int ok = 0;
        for (int j = 0; names && names[j]; j++) ok |= chat_seq_eq(c->kwnames[i], names[j]);
        if (!ok)
            return chat_rt_fail(rt, "unsupported argument %.*s= of %s", (int)c->kwnames[i].n,
                                c->kwnames[i].p, what);
    }
    return 0;
}

int chat_want_str(chat_rt *rt, const chat_val *v, const char *what, chat_str *out)
{
    if (!v || v->t != CV_STR)
        return chat_rt_fail(rt, "%s: expected a string argument, got %s", what,
                            v ? chat_type_name(*v) : "nothing");
    *out = v->s;
    return 0;
}

/* ---------------------------------------------------------------- methods */

int chat_call_method(chat_rt *rt, const chat_method *m, const chat_call *c, chat_val *out)
{
    chat_val self = m->self;
    chat_str nm = m->name;
    if (self.t == CV_STR) {
        chat_str s = self.s, a;
        const chat_val *a0 = chat_arg(c, 0, "");
        if (chat_seq_eq(nm, "strip") || chat_seq_eq(nm, "lstrip") || chat_seq_eq(nm, "rstrip")) {
            int which = nm.p[0] == 'l' ? 1 : nm.p[0] == 'r' ? 2 : 3;
            if (chat_check_args(rt, c, 1, NULL, "strip")) return -1;
            if (a0 && a0->t != CV_NONE && chat_want_str(rt, a0, "strip", &a)) return -1;
            chat_str r = chat_py_strip(s, a0 && a0->t != CV_NONE ? &a : NULL, which);
            *out = cv_str(r.p, r.n);
            return 0;
        }
        if (chat_seq_eq(nm, "split")) {
            static const char *const kn[] = {"sep", "maxsplit", NULL};
            if (chat_check_args(rt, c, 2, kn, "split")) return -1;
            const chat_val *sep = chat_arg(c, 0, "sep"), *mx = chat_arg(c, 1, "maxsplit");
            if (sep && sep->t != CV_NONE && chat_want_str(rt, sep, "split", &a)) return -1;
            return chat_str_split(rt, s, sep && sep->t != CV_NONE ? &a : NULL,
                                  mx && mx->t == CV_INT ? mx->i : -1, out);
        }
        if (chat_seq_eq(nm, "startswith") || chat_seq_eq(nm, "endswith")) {
            int ends = nm.p[0] == 'e';
            if (chat_check_args(rt, c, 1, NULL, "startswith") || !a0)
                return a0 ? -1 : chat_rt_fail(rt, "startswith/endswith takes one argument");
            chat_val one = *a0;
            size_t cnt = one.t == CV_LIST ? one.l->n : 1;
            int hit = 0;
            for (size_t i = 0; i < cnt; i++) {
                chat_val p = one.t == CV_LIST ? one.l->v[i] : one;
                if (chat_want_str(rt, &p, "startswith", &a)) return -1;
                if (a.n <= s.n && !memcmp(ends ? s.p + s.n - a.n : s.p, a.p, a.n)) hit = 1;
            }
            *out = cv_bool(hit);
            return 0;
        }
        if (chat_seq_eq(nm, "upper") || chat_seq_eq(nm, "lower")) {
            if (chat_check_args(rt, c, 0, NULL, "upper/lower")) return -1;
            return chat_case_map(rt, s, nm.p[0] == 'u' ? chat_map_upper : chat_map_lower, 0, out);
        }
        if (chat_seq_eq(nm, "title") || chat_seq_eq(nm, "capitalize")) {
            if (chat_check_args(rt, c, 0, NULL, "title/capitalize")) return -1;
            return chat_case_map(rt, s, NULL, nm.p[0] == 't' ? 1 : 2, out);
        }
        if (chat_seq_eq(nm, "replace")) {
            chat_str o, n;
            static const char *const kn[] = {"count", NULL};
            if (chat_check_args(rt, c, 3, kn, "replace") ||
                chat_want_str(rt, chat_arg(c, 0, ""), "replace", &o) ||
                chat_want_str(rt, chat_arg(c, 1, ""), "replace", &n))
                return -1;
            const chat_val *cn = chat_arg(c, 2, "count");
            return chat_str_replace(rt, s, o, n, cn && cn->t == CV_INT ? cn->i : -1, out);
        }
        if (chat_seq_eq(nm, "find") || chat_seq_eq(nm, "rfind") || chat_seq_eq(nm, "count")) {
            if (chat_check_args(rt, c, 1, NULL, "find") || chat_want_str(rt, a0, "find", &a))
                return -1;
            if (nm.p[0] == 'c') {
                int64_t k = 0;
                if (!a.n)
                    k = (int64_t)chat_utf8_len(s.p, s.n) + 1;
                else
                    for (size_t i = 0; i + a.n <= s.n;) {
                        const char *f = memmem(s.p + i, s.n - i, a.p, a.n);
                        if (!f) break;
                        k++;
                        i = (size_t)(f - s.p) + a.n;
                    }
                *out = cv_int(k);
                return 0;
            }
            const char *f = NULL;
            if (nm.p[0] == 'f')
                f = memmem(s.p, s.n, a.p, a.n);
            else
                for (size_t i = s.n + 1; i-- > 0;)
                    if (i + a.n <= s.n && !memcmp(s.p + i, a.p, a.n)) {
                        f = s.p + i;
                        break;
                    }
            *out = cv_int(f ? (int64_t)chat_utf8_len(s.p, (size_t)(f - s.p)) : -1);
            return 0;
        }
        if (chat_seq_eq(nm, "join")) {
            if (chat_check_args(rt, c, 1, NULL, "join") || !a0 || a0->t != CV_LIST)
                return chat_rt_fail(rt, "str.join: expected a list");
            mc_buf b = MC_BUF_INIT;
            int r = 0;
            for (size_t i = 0; i < a0->l->n && !r; i++) {
                if (a0->l->v[i].t != CV_STR) {
                    mc_buf_free(&b);
                    return chat_rt_fail(rt, "sequence item %zu: expected str instance, %s found", i,
                                        chat_type_name(a0->l->v[i]));
                }
                if (i) r |= mc_buf_append(&b, s.p, s.n, NULL) != MC_OK;
                r |= mc_buf_append(&b, a0->l->v[i].s.p, a0->l->v[i].s.n, NULL) != MC_OK;
            }
            if (!r) *out = chat_make_str(rt, b.data ? b.data : "", b.len);
            mc_buf_free(&b);
            return r || out->t != CV_STR ? chat_oom(rt) : 0;
        }
        if (chat_seq_eq(nm, "isdigit") || chat_seq_eq(nm, "isspace") ||
            chat_seq_eq(nm, "isalpha") || chat_seq_eq(nm, "isalnum")) {
            int ok = s.n > 0;
            for (size_t i = 0; i < s.n && ok;) {
                uint32_t cp = chat_utf8_next(s.p, s.n, &i);
                utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
                int digit = k == UTF8PROC_CATEGORY_ND,
                    alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
                if (nm.p[2] == 'd')
                    ok = digit;
                else if (nm.p[2] == 's')
                    ok = chat_py_isspace(cp);
                else if (nm.p[3] == 'p')
                    ok = alpha;
                else
                    ok = alpha || digit;
            }
            *out = cv_bool(ok);
            return 0;
        }
        return chat_rt_fail(rt, "unsupported string method: %.*s", (int)nm.n, nm.p);
    }
    if (self.t == CV_DICT) {
        if (chat_seq_eq(nm, "items") || chat_seq_eq(nm, "keys") || chat_seq_eq(nm, "values")) {
            if (chat_check_args(rt, c, 0, NULL, "items/keys/values")) return -1;
            chat_list *l = chat_list_new(rt->a, self.d->n);
            if (!l) return chat_oom(rt);
            for (size_t i = 0; i < self.d->n; i++) {
                if (nm.p[0] == 'i') {
                    chat_list *p = chat_list_new(rt->a, 2);
                    if (!p) return chat_oom(rt);
                    p->v[0] = self.d->k[i];
                    p->v[1] = self.d->v[i];
                    p->n = 2;
                    l->v[i] = (chat_val){.t = CV_LIST, .l = p, .tuple = 1};
                } else {
                    l->v[i] = nm.p[0] == 'k' ? self.d->k[i] : self.d->v[i];
                }
            }
            l->n = self.d->n;
            *out = (chat_val){.t = CV_LIST, .l = l};
            return 0;
        }
        if (chat_seq_eq(nm, "get")) {
            if (chat_check_args(rt, c, 2, NULL, "get") || !c || c->nargs < 1)
                return chat_rt_fail(rt, "dict.get takes a key and an optional default");
            *out = c->nargs > 1 ? c->args[1] : cv_none();
            for (size_t i = 0; i < self.d->n; i++)
                if (chat_equal(self.d->k[i], c->args[0])) *out = self.d->v[i];
            return 0;
        }
        if (chat_seq_eq(nm, "copy")) {
            *out = self;
            return 0;
        }
        return chat_rt_fail(rt, "unsupported: dict.%.*s (templates cannot change a dict)",
                            (int)nm.n, nm.p);
    }
    if (self.t == CV_LIST) {
        if (chat_seq_eq(nm, "index") || chat_seq_eq(nm, "count")) {
            const chat_val *a0 = chat_arg(c, 0, "");
            if (chat_check_args(rt, c, 1, NULL, "index/count") || !a0)
                return chat_rt_fail(rt, "list.%.*s takes one argument", (int)nm.n, nm.p);
            int64_t k = 0, at = -1;
            for (size_t i = 0; i < self.l->n; i++)
                if (chat_equal(self.l->v[i], *a0)) {
                    if (at < 0) at = (int64_t)i;
                    k++;
                }
            if (nm.p[0] == 'i' && at < 0) return chat_rt_fail(rt, "list.index(x): x not in list");
            *out = cv_int(nm.p[0] == 'i' ? at : k);
            return 0;
        }
        if (chat_seq_eq(nm, "copy")) {
            *out = self;
            return 0;
        }
        return chat_rt_fail(rt, "unsupported: list.%.*s (templates cannot change a list)",
                            (int)nm.n, nm.p);
    }
    return chat_rt_fail(rt, "unsupported method: %.*s", (int)nm.n, nm.p);
}

/* ---------------------------------------------------------------- tests */

static const char *const tests[] = {
    "defined", "undefined", "none",        "string",  "mapping", "iterable", "sequence",
    "number",  "integer",   "float",       "boolean", "true",    "false",    "callable",
    "equalto", "eq",        "==",          "ne",      "!=",      "lt",       "<",
    "le",      "<=",        "gt",          ">",       "ge",      ">=",       "in",
    "odd",     "even",      "divisibleby", "lower",   "upper",   "sameas",   NULL};

int chat_test_known(chat_str name) { return chat_in_list(tests, name); }

int chat_test(chat_rt *rt, chat_str n, chat_val v, const chat_call *c, int *out)
{
    const chat_val *a0 = chat_arg(c, 0, "");
    int t = v.t;
    if (chat_seq_eq(n, "defined"))
        *out = t != CV_UNDEF;
    else if (chat_seq_eq(n, "undefined"))
        *out = t == CV_UNDEF;
    else if (chat_seq_eq(n, "none"))
        *out = t == CV_NONE;
    else if (chat_seq_eq(n, "string"))
        *out = t == CV_STR;
    else if (chat_seq_eq(n, "mapping"))
        *out = t == CV_DICT;
    else if (chat_seq_eq(n, "iterable"))
        *out = t == CV_STR || t == CV_LIST || t == CV_DICT || t == CV_UNDEF;
    else if (chat_seq_eq(n, "sequence"))
        *out = t == CV_STR || t == CV_LIST || t == CV_DICT;
    else if (chat_seq_eq(n, "number"))
        *out = t == CV_INT || t == CV_FLOAT || t == CV_BOOL;
    else if (chat_seq_eq(n, "integer"))
        *out = t == CV_INT;
    else if (chat_seq_eq(n, "float"))
        *out = t == CV_FLOAT;
    else if (chat_seq_eq(n, "boolean"))
        *out = t == CV_BOOL;
    else if (chat_seq_eq(n, "true"))
        *out = t == CV_BOOL && v.b;
    else if (chat_seq_eq(n, "false"))
        *out = t == CV_BOOL && !v.b;
    else if (chat_seq_eq(n, "callable"))
        *out = t == CV_MACRO || t == CV_FUNC || t == CV_METHOD;
    else if (chat_seq_eq(n, "lower") || chat_seq_eq(n, "upper")) {
        chat_val m;
        if (t != CV_STR) return chat_rt_fail(rt, "test %.*s needs a string", (int)n.n, n.p);
        if (chat_case_map(rt, v.s, n.p[0] == 'l' ? chat_map_lower : chat_map_upper, 0, &m)) return -1;
        *out = chat_equal(m, v);
    } else if (chat_seq_eq(n, "odd") || chat_seq_eq(n, "even") || chat_seq_eq(n, "divisibleby")) {
        if (t != CV_INT && t != CV_BOOL)
            return chat_rt_fail(rt, "test %.*s needs an integer", (int)n.n, n.p);
        int64_t x = chat_num_i(v), d = n.p[0] == 'd' ? (a0 && a0->t == CV_INT ? a0->i : 0) : 2;
        if (!d) return chat_rt_fail(rt, "divisibleby needs a non-zero integer");
        int64_t r = x % d;
        *out = n.p[0] == 'o' ? r != 0 : r == 0;
    } else {
        if (!a0) return chat_rt_fail(rt, "test %.*s takes one argument", (int)n.n, n.p);
        int op = chat_seq_eq(n, "equalto") || chat_seq_eq(n, "eq") || chat_seq_eq(n, "==") ? CO_EQ
                 : chat_seq_eq(n, "ne") || chat_seq_eq(n, "!=")                            ? CO_NE
                 : chat_seq_eq(n, "lt") || chat_seq_eq(n, "<")                             ? CO_LT
                 : chat_seq_eq(n, "le") || chat_seq_eq(n, "<=")                            ? CO_LE
                 : chat_seq_eq(n, "gt") || chat_seq_eq(n, ">")                             ? CO_GT
                 : chat_seq_eq(n, "ge") || chat_seq_eq(n, ">=")                            ? CO_GE
                 : chat_seq_eq(n, "in")                                                    ? CO_IN
                                                                                           : -1;
        if (chat_seq_eq(n, "sameas")) {
            *out = (t == CV_NONE || t == CV_BOOL) ? chat_equal(v, *a0) && a0->t == t : 0;
            return 0;
        }
        chat_val r;
        if (op < 0 || chat_binop(rt, op, v, *a0, &r))
            return op < 0 ? chat_rt_fail(rt, "unknown test") : -1;
        *out = r.b;
    }
    return 0;
}
