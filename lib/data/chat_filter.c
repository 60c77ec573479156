/*
 * chat_filter.c - the Jinja filters of mc's chat template subset (trim,
 * tojson, length, join, map, selectattr, indent, ...), each as jinja2 3.1
 * (and transformers' own tojson) computes it. A filter outside the subset is
 * refused at parse time (chat_filter_known), naming it.
 */
#include "chat_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---------------------------------------------------------------- filters */

static const char *const filters[] = {
    "trim",   "tojson", "length", "count",      "first",      "last",    "join",    "default",
    "d",      "upper",  "lower",  "capitalize", "title",      "replace", "items",   "list",
    "string", "int",    "float",  "selectattr", "rejectattr", "map",     "select",  "reject",
    "indent", "safe",   "escape", "e",          "round",      "abs",     "reverse", "unique",
    "sum",    "min",    "max",    "wordcount",  "dictsort",   "sort",    "batch",   NULL};

int chat_filter_known(chat_str name) { return chat_in_list(filters, name); }

static int iter_list(chat_rt *rt, chat_val v, chat_list **out)
{
    if (v.t == CV_LIST) {
        *out = v.l;
        return 0;
    }
    chat_list *l = chat_list_new(rt->a, 0);
    if (!l) return chat_oom(rt);
    if (v.t == CV_UNDEF) {
        *out = l;
        return 0;
    }
    if (v.t == CV_DICT || v.t == CV_NS) {
        for (size_t i = 0; i < v.d->n; i++)
            if (chat_list_push(rt->a, l, v.d->k[i])) return chat_oom(rt);
    } else if (v.t == CV_STR) {
        for (size_t i = 0; i < v.s.n;) {
            size_t b = i;
            chat_utf8_next(v.s.p, v.s.n, &i);
            if (chat_list_push(rt->a, l, cv_str(v.s.p + b, i - b))) return chat_oom(rt);
        }
    } else {
        return chat_rt_fail(rt, "'%s' object is not iterable", chat_type_name(v));
    }
    *out = l;
    return 0;
}

/* jinja2's attribute getter: "a.b.0" looked up part by part with getitem */
static int attr_path(chat_rt *rt, chat_val v, chat_str path, chat_val *out)
{
    size_t i = 0;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.p[j] != '.') j++;
        chat_str part = {path.p + i, j - i};
        chat_val key = cv_str(part.p, part.n);
        int digits = part.n > 0;
        for (size_t k = 0; k < part.n; k++) digits &= part.p[k] >= '0' && part.p[k] <= '9';
        if (digits && part.n < 18) key = cv_int(strtoll(part.p, NULL, 10));
        if (v.t == CV_UNDEF) return chat_undefined_error(rt, v);
        if (chat_getitem(rt, v, key, &v)) return -1;
        i = j + 1;
    }
    *out = v;
    return 0;
}

static int py_len(chat_rt *rt, chat_val v, int64_t *n)
{
    switch (v.t) {
    case CV_UNDEF: *n = 0; return 0;
    case CV_STR: *n = (int64_t)chat_utf8_len(v.s.p, v.s.n); return 0;
    case CV_LIST: *n = (int64_t)v.l->n; return 0;
    case CV_DICT: *n = (int64_t)v.d->n; return 0;
    default: return chat_rt_fail(rt, "object of type '%s' has no len()", chat_type_name(v));
    }
}

static int sort_cmp(chat_rt *rt, chat_val a, chat_val b, int case_sensitive, int *c)
{
    if (!case_sensitive && a.t == CV_STR && b.t == CV_STR) {
        chat_val la, lb;
        if (chat_case_map(rt, a.s, chat_map_lower, 0, &la) ||
            chat_case_map(rt, b.s, chat_map_lower, 0, &lb))
            return -1;
        a = la, b = lb;
    }
    return chat_compare_order(rt, "<", a, b, c);
}

/* a stable insertion sort: lists in templates are short */
static int sort_vals(chat_rt *rt, chat_val *v, const chat_val *keys_in, size_t n, int reverse,
                     int cs)
{
    chat_val *keys = chat_alloc(rt->a, (n + 1) * sizeof *keys);
    if (!keys) return chat_oom(rt);
    memcpy(keys, keys_in, n * sizeof *keys);
    for (size_t i = 1; i < n; i++) {
        chat_val kv = keys[i], vv = v[i];
        size_t j = i;
        while (j > 0) {
            int c;
            if (sort_cmp(rt, keys[j - 1], kv, cs, &c)) return -1;
            if (reverse ? c >= 0 : c <= 0) break;
            keys[j] = keys[j - 1];
            v[j] = v[j - 1];
            j--;
        }
        keys[j] = kv;
        v[j] = vv;
    }
    return 0;
}

static int do_select(chat_rt *rt, chat_str name, chat_val v, const chat_call *c, chat_val *out)
{
    int by_attr = name.p[1] == 'e' && name.n == 10; /* selectattr / rejectattr */
    int reject = name.p[0] == 'r';
    chat_list *in, *l;
    if (iter_list(rt, v, &in)) return -1;
    if (!(l = chat_list_new(rt->a, 0))) return chat_oom(rt);
    size_t first_test = by_attr ? 1 : 0;
    chat_str attr = {0}, test = {0};
    if (by_attr && chat_want_str(rt, chat_arg(c, 0, ""), "selectattr", &attr)) return -1;
    const chat_val *t = chat_arg(c, first_test, "");
    if (t && chat_want_str(rt, t, "select", &test)) return -1;
    if (t && !chat_test_known(test))
        return chat_rt_fail(rt, "unsupported test: %.*s", (int)test.n, test.p);
    chat_call sub = {0};
    if (c && c->nargs > first_test + 1) {
        sub.args = c->args + first_test + 1;
        sub.nargs = c->nargs - first_test - 1;
    }
    for (size_t i = 0; i < in->n; i++) {
        chat_val x = in->v[i];
        if (by_attr && attr_path(rt, x, attr, &x)) return -1;
        int ok;
        if (t) {
            if (chat_test(rt, test, x, &sub, &ok)) return -1;
        } else {
            ok = chat_truthy(x);
        }
        if (ok != reject && chat_list_push(rt->a, l, in->v[i])) return chat_oom(rt);
    }
    *out = (chat_val){.t = CV_LIST, .l = l};
    return 0;
}

static int do_indent(chat_rt *rt, chat_str s, const chat_call *c, chat_val *out)
{
    static const char *const kn[] = {"width", "first", "blank", NULL};
    if (chat_check_args(rt, c, 3, kn, "indent")) return -1;
    const chat_val *w = chat_arg(c, 0, "width"), *f = chat_arg(c, 1, "first"),
                   *bl = chat_arg(c, 2, "blank");
    chat_str ind;
    char spaces[256];
    if (w && w->t == CV_STR) {
        ind = w->s;
    } else {
        int64_t k = w ? (w->t == CV_INT ? w->i : -1) : 4;
        if (k < 0 || k > 255) return chat_rt_fail(rt, "indent: bad width");
        memset(spaces, ' ', (size_t)k);
        ind = (chat_str){spaces, (size_t)k};
    }
    /* s + "\n", split into lines as str.splitlines() does */
    mc_buf b = MC_BUF_INIT;
    int r = 0, line_no = 0;
    size_t i = 0;
    if (f && chat_truthy(*f)) r |= mc_buf_append(&b, ind.p, ind.n, NULL) != MC_OK;
    char *tmp = chat_alloc(rt->a, s.n + 2);
    if (!tmp) return chat_oom(rt);
    memcpy(tmp, s.p, s.n);
    tmp[s.n] = '\n';
    size_t n = s.n + 1;
    while (i < n && !r) {
        size_t b0 = i, e = i, next = n;
        while (e < n) {
            size_t j = e;
            uint32_t cp = chat_utf8_next(tmp, n, &j);
            if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c ||
                (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
                next = (cp == '\r' && j < n && tmp[j] == '\n') ? j + 1 : j;
                break;
            }
            e = j;
        }
        if (e >= n) next = n;
        if (line_no) {
            r |= mc_buf_append(&b, "\n", 1, NULL) != MC_OK;
            if (e > b0 || (bl && chat_truthy(*bl)))
                r |= mc_buf_append(&b, ind.p, ind.n, NULL) != MC_OK;
        }
        r |= mc_buf_append(&b, tmp + b0, e - b0, NULL) != MC_OK;
        line_no++;
        i = next;
    }
    if (!r) *out = chat_make_str(rt, b.data ? b.data : "", b.len);
    mc_buf_free(&b);
    return r || out->t != CV_STR ? chat_oom(rt) : 0;
}

int chat_filter(chat_rt *rt, chat_str n, chat_val v, const chat_call *c, chat_val *out)
{
    const chat_val *a0 = chat_arg(c, 0, "");
    chat_str s;
    if (chat_seq_eq(n, "default") || chat_seq_eq(n, "d")) {
        static const char *const kn[] = {"default_value", "boolean", NULL};
        if (chat_check_args(rt, c, 2, kn, "default")) return -1;
        const chat_val *dv = chat_arg(c, 0, "default_value"), *bo = chat_arg(c, 1, "boolean");
        int use = v.t == CV_UNDEF || (bo && chat_truthy(*bo) && !chat_truthy(v));
        *out = use ? (dv ? *dv : cv_str("", 0)) : v;
        return 0;
    }
    if (chat_seq_eq(n, "safe")) {
        *out = v;
        return 0;
    }
    if (chat_seq_eq(n, "length") || chat_seq_eq(n, "count")) {
        int64_t k = 0;
        if (py_len(rt, v, &k)) return -1;
        *out = cv_int(k);
        return 0;
    }
    if (chat_seq_eq(n, "tojson")) {
        static const char *const kn[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
        if (chat_check_args(rt, c, 4, kn, "tojson")) return -1;
        const chat_val *ea = chat_arg(c, 0, "ensure_ascii"), *in = chat_arg(c, 1, "indent"),
                       *sp = chat_arg(c, 2, "separators"), *sk = chat_arg(c, 3, "sort_keys");
        int indent = -1;
        if (in && in->t != CV_NONE) {
            if (in->t != CV_INT) return chat_rt_fail(rt, "tojson: unsupported indent");
            indent = in->i < 0 ? 0 : in->i > 64 ? 64 : (int)in->i;
        }
        char isep[64] = "", ksep[64] = "";
        if (sp && sp->t != CV_NONE) {
            if (sp->t != CV_LIST || sp->l->n != 2 || sp->l->v[0].t != CV_STR ||
                sp->l->v[1].t != CV_STR || sp->l->v[0].s.n >= 64 || sp->l->v[1].s.n >= 64)
                return chat_rt_fail(rt, "tojson: separators must be two strings");
            memcpy(isep, sp->l->v[0].s.p, sp->l->v[0].s.n);
            memcpy(ksep, sp->l->v[1].s.p, sp->l->v[1].s.n);
        }
        mc_buf b = MC_BUF_INIT;
        chat_val bad;
        int r = chat_json_dumps(
            &b, v, ea && chat_truthy(*ea), indent, sp && sp->t != CV_NONE ? isep : NULL,
            sp && sp->t != CV_NONE ? ksep : NULL, sk && chat_truthy(*sk), 0, &bad);
        if (!r) *out = chat_make_str(rt, b.data ? b.data : "", b.len);
        mc_buf_free(&b);
        if (r == -2) {
            if (bad.t == CV_UNDEF) return chat_undefined_error(rt, bad);
            return chat_rt_fail(rt, "Object of type %s is not JSON serializable",
                                chat_type_name(bad));
        }
        return r || out->t != CV_STR ? chat_oom(rt) : 0;
    }
    if (chat_seq_eq(n, "first") || chat_seq_eq(n, "last")) {
        chat_list *l;
        if (v.t == CV_UNDEF) return chat_undefined_error(rt, v);
        if (iter_list(rt, v, &l)) return -1;
        *out = l->n ? l->v[n.p[0] == 'f' ? 0 : l->n - 1] : cv_undef(NULL);
        return 0;
    }
    if (chat_seq_eq(n, "list")) {
        chat_list *l, *cp;
        if (iter_list(rt, v, &l)) return -1;
        if (!(cp = chat_list_new(rt->a, l->n))) return chat_oom(rt);
        if (l->n) memcpy(cp->v, l->v, l->n * sizeof *cp->v);
        cp->n = l->n;
        *out = (chat_val){.t = CV_LIST, .l = cp};
        return 0;
    }
    if (chat_seq_eq(n, "reverse")) {
        if (v.t == CV_STR) {
            size_t nn = v.s.n;
            char *o = chat_alloc(rt->a, nn + 1);
            if (!o) return chat_oom(rt);
            for (size_t i = 0, w = nn; i < nn;) {
                size_t b = i;
                chat_utf8_next(v.s.p, nn, &i);
                w -= i - b;
                memcpy(o + w, v.s.p + b, i - b);
            }
            *out = cv_str(o, nn);
            return 0;
        }
        chat_list *l, *r;
        if (iter_list(rt, v, &l)) return -1;
        if (!(r = chat_list_new(rt->a, l->n))) return chat_oom(rt);
        for (size_t i = 0; i < l->n; i++) r->v[i] = l->v[l->n - 1 - i];
        r->n = l->n;
        *out = (chat_val){.t = CV_LIST, .l = r};
        return 0;
    }
    if (chat_seq_eq(n, "join")) {
        static const char *const kn[] = {"d", "attribute", NULL};
        if (chat_check_args(rt, c, 2, kn, "join")) return -1;
        const chat_val *sep = chat_arg(c, 0, "d"), *at = chat_arg(c, 1, "attribute");
        chat_str sp = {"", 0}, ap;
        if (sep && chat_want_str(rt, sep, "join", &sp)) return -1;
        if (at && chat_want_str(rt, at, "join", &ap)) return -1;
        chat_list *l;
        if (iter_list(rt, v, &l)) return -1;
        mc_buf b = MC_BUF_INIT;
        int r = 0;
        for (size_t i = 0; i < l->n && !r; i++) {
            chat_val x = l->v[i];
            if (at && attr_path(rt, x, ap, &x)) {
                mc_buf_free(&b);
                return -1;
            }
            if (i) r |= mc_buf_append(&b, sp.p, sp.n, NULL) != MC_OK;
            r |= chat_str_of(&b, x);
        }
        if (!r) *out = chat_make_str(rt, b.data ? b.data : "", b.len);
        mc_buf_free(&b);
        return r || out->t != CV_STR ? chat_oom(rt) : 0;
    }
    if (chat_seq_eq(n, "items")) {
        if (v.t == CV_UNDEF) {
            chat_list *l = chat_list_new(rt->a, 0);
            if (!l) return chat_oom(rt);
            *out = (chat_val){.t = CV_LIST, .l = l};
            return 0;
        }
        if (v.t != CV_DICT)
            return chat_rt_fail(rt, "items: expected a mapping, got %s", chat_type_name(v));
        chat_method m = {v, {"items", 5}};
        return chat_call_method(rt, &m, NULL, out);
    }
    if (chat_seq_eq(n, "selectattr") || chat_seq_eq(n, "rejectattr") || chat_seq_eq(n, "select") ||
        chat_seq_eq(n, "reject"))
        return do_select(rt, n, v, c, out);
    if (chat_seq_eq(n, "map")) {
        chat_list *in, *l;
        if (iter_list(rt, v, &in)) return -1;
        if (!(l = chat_list_new(rt->a, in->n))) return chat_oom(rt);
        const chat_val *at = chat_arg(c, 99, "attribute"), *df = chat_arg(c, 99, "default");
        if (at) {
            chat_str ap;
            if (chat_want_str(rt, at, "map", &ap)) return -1;
            for (size_t i = 0; i < in->n; i++) {
                chat_val x;
                if (attr_path(rt, in->v[i], ap, &x)) return -1;
                if (x.t == CV_UNDEF && df) x = *df;
                l->v[l->n++] = x;
            }
        } else {
            chat_str fn;
            if (chat_want_str(rt, a0, "map", &fn)) return -1;
            if (!chat_filter_known(fn) || chat_seq_eq(fn, "map"))
                return chat_rt_fail(rt, "unsupported filter: %.*s", (int)fn.n, fn.p);
            chat_call sub = {0};
            if (c && c->nargs > 1) {
                sub.args = c->args + 1;
                sub.nargs = c->nargs - 1;
            }
            sub.kwnames = c ? c->kwnames : NULL;
            sub.kwargs = c ? c->kwargs : NULL;
            sub.nkw = c ? c->nkw : 0;
            for (size_t i = 0; i < in->n; i++)
                if (chat_filter(rt, fn, in->v[i], &sub, &l->v[l->n++])) return -1;
        }
        *out = (chat_val){.t = CV_LIST, .l = l};
        return 0;
    }
    if (chat_seq_eq(n, "unique")) {
        chat_list *in, *l;
        if (iter_list(rt, v, &in)) return -1;
        if (!(l = chat_list_new(rt->a, in->n))) return chat_oom(rt);
        for (size_t i = 0; i < in->n; i++) {
            int seen = 0;
            for (size_t j = 0; j < l->n && !seen; j++) seen = chat_equal(l->v[j], in->v[i]);
            if (!seen) l->v[l->n++] = in->v[i];
        }
        *out = (chat_val){.t = CV_LIST, .l = l};
        return 0;
    }
    if (chat_seq_eq(n, "sort") || chat_seq_eq(n, "dictsort")) {
        static const char *const kn[] = {"reverse", "case_sensitive", "attribute", "by", NULL};
        if (chat_check_args(rt, c, 3, kn, "sort")) return -1;
        int dict = n.p[0] == 'd';
        const chat_val *rv = chat_arg(c, dict ? 99 : 0, "reverse"),
                       *cs = chat_arg(c, dict ? 0 : 1, "case_sensitive"),
                       *at = chat_arg(c, dict ? 99 : 2, "attribute"),
                       *by = chat_arg(c, dict ? 1 : 99, "by");
        chat_list *in, *l;
        if (dict) {
            if (v.t != CV_DICT) return chat_rt_fail(rt, "dictsort: expected a mapping");
            chat_method m = {v, {"items", 5}};
            chat_val it;
            if (chat_call_method(rt, &m, NULL, &it)) return -1;
            in = it.l;
        } else if (iter_list(rt, v, &in)) {
            return -1;
        }
        if (!(l = chat_list_new(rt->a, in->n + 1))) return chat_oom(rt);
        chat_val *keys = chat_alloc(rt->a, (in->n + 1) * sizeof *keys);
        if (!keys) return chat_oom(rt);
        for (size_t i = 0; i < in->n; i++) {
            l->v[i] = in->v[i];
            keys[i] = in->v[i];
            if (dict)
                keys[i] =
                    in->v[i].l->v[by && by->t == CV_STR && chat_seq_eq(by->s, "value") ? 1 : 0];
            else if (at) {
                chat_str ap;
                if (chat_want_str(rt, at, "sort", &ap) || attr_path(rt, in->v[i], ap, &keys[i]))
                    return -1;
            }
        }
        l->n = in->n;
        if (sort_vals(rt, l->v, keys, l->n, rv && chat_truthy(*rv), cs && chat_truthy(*cs)))
            return -1;
        *out = (chat_val){.t = CV_LIST, .l = l};
        return 0;
    }
    if (chat_seq_eq(n, "sum") || chat_seq_eq(n, "min") || chat_seq_eq(n, "max")) {
        chat_list *in;
        if (iter_list(rt, v, &in)) return -1;
        if (n.p[1] == 'u') {
            const chat_val *at = chat_arg(c, 0, "attribute"), *st = chat_arg(c, 1, "start");
            chat_val acc = st ? *st : cv_int(0);
            for (size_t i = 0; i < in->n; i++) {
                chat_val x = in->v[i];
                chat_str ap;
                if (at && (chat_want_str(rt, at, "sum", &ap) || attr_path(rt, x, ap, &x)))
                    return -1;
                if (chat_binop(rt, CO_ADD, acc, x, &acc)) return -1;
            }
            *out = acc;
            return 0;
        }
        if (!in->n) {
            *out = cv_undef(NULL);
            return 0;
        }
        chat_val best = in->v[0];
        for (size_t i = 1; i < in->n; i++) {
            int cmp;
            if (sort_cmp(rt, in->v[i], best, 0, &cmp)) return -1;
            if (n.p[1] == 'i' ? cmp < 0 : cmp > 0) best = in->v[i];
        }
        *out = best;
        return 0;
    }
    if (chat_seq_eq(n, "batch")) return chat_rt_fail(rt, "unsupported filter: batch");
    if (chat_seq_eq(n, "abs")) {
        if (v.t == CV_INT)
            *out = cv_int(v.i < 0 ? -v.i : v.i);
        else if (v.t == CV_FLOAT)
            *out = cv_float(fabs(v.f));
        else if (v.t == CV_BOOL)
            *out = cv_int(v.b);
        else
            return chat_rt_fail(rt, "bad operand type for abs(): '%s'", chat_type_name(v));
        return 0;
    }
    if (chat_seq_eq(n, "int") || chat_seq_eq(n, "float")) {
        int is_int = n.p[0] == 'i';
        const chat_val *df = chat_arg(c, 0, "default");
        chat_val dflt = df ? *df : is_int ? cv_int(0) : cv_float(0);
        if (v.t == CV_INT || v.t == CV_BOOL)
            *out = is_int ? cv_int(chat_num_i(v)) : cv_float((double)chat_num_i(v));
        else if (v.t == CV_FLOAT)
            *out = is_int ? cv_int((int64_t)v.f) : v;
        else if (v.t == CV_STR) {
            char buf[64];
            chat_str t = chat_py_strip(v.s, NULL, 3);
            if (t.n >= sizeof buf) {
                *out = dflt;
                return 0;
            }
            memcpy(buf, t.p, t.n);
            buf[t.n] = 0;
            char *end;
            if (is_int) {
                long long x = strtoll(buf, &end, 10);
                if (t.n && !*end)
                    *out = cv_int(x);
                else {
                    double f = strtod(buf, &end);
                    *out = t.n && !*end && isfinite(f) ? cv_int((int64_t)f) : dflt;
                }
            } else {
                double f = strtod(buf, &end);
                *out = t.n && !*end ? cv_float(f) : dflt;
            }
        } else
            *out = dflt;
        return 0;
    }
    if (chat_seq_eq(n, "round")) {
        static const char *const kn[] = {"precision", "method", NULL};
        if (chat_check_args(rt, c, 2, kn, "round")) return -1;
        const chat_val *pr = chat_arg(c, 0, "precision"), *me = chat_arg(c, 1, "method");
        int64_t p = pr && pr->t == CV_INT ? pr->i : 0;
        if (!chat_is_num(v))
            return chat_rt_fail(rt, "round: expected a number, got %s", chat_type_name(v));
        double x = chat_num_f(v), scale = pow(10, (double)p);
        if (me && me->t == CV_STR && chat_seq_eq(me->s, "floor"))
            x = floor(x * scale) / scale;
        else if (me && me->t == CV_STR && chat_seq_eq(me->s, "ceil"))
            x = ceil(x * scale) / scale;
        else if (p == 0)
            x = nearbyint(x);
        else {
            char buf[512];
            snprintf(buf, sizeof buf, "%.*f", (int)(p < 0 ? 0 : p > 300 ? 300 : p), x);
            x = strtod(buf, NULL);
        }
        *out = cv_float(x);
        return 0;
    }
    if (chat_seq_eq(n, "wordcount")) {
        chat_val l;
        if (chat_to_str(rt, v, &s) || chat_str_split(rt, s, NULL, -1, &l)) return -1;
        *out = cv_int((int64_t)l.l->n);
        return 0;
    }
    /* the rest take the value as a string */
    if (v.t == CV_UNDEF && !chat_seq_eq(n, "string") && !chat_seq_eq(n, "trim")) {
        s = (chat_str){"", 0};
    } else if (chat_to_str(rt, v, &s)) {
        return -1;
    }
    if (chat_seq_eq(n, "string")) {
        *out = cv_str(s.p, s.n);
        return 0;
    }
    if (chat_seq_eq(n, "trim")) {
        chat_str chars;
        if (chat_check_args(rt, c, 1, NULL, "trim")) return -1;
        if (a0 && a0->t != CV_NONE && chat_want_str(rt, a0, "trim", &chars)) return -1;
        chat_str r = chat_py_strip(s, a0 && a0->t != CV_NONE ? &chars : NULL, 3);
        *out = cv_str(r.p, r.n);
        return 0;
    }
    if (chat_seq_eq(n, "upper") || chat_seq_eq(n, "lower"))
        return chat_case_map(rt, s, n.p[0] == 'u' ? chat_map_upper : chat_map_lower, 0, out);
    if (chat_seq_eq(n, "capitalize")) return chat_case_map(rt, s, NULL, 2, out);
    if (chat_seq_eq(n, "title")) {
        /* jinja2: each word (split at runs of -, whitespace, (, {, [, <) as w[0].upper() +
         * w[1:].lower() */
        char *o = chat_alloc(rt->a, s.n * 2 + 4);
        if (!o) return chat_oom(rt);
        size_t k = 0;
        int start = 1;
        for (size_t i = 0; i < s.n;) {
            uint32_t cp = chat_utf8_next(s.p, s.n, &i);
            int delim = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' ||
                        chat_py_isspace(cp);
            uint32_t m = delim ? cp : start ? chat_map_upper(cp) : chat_map_lower(cp);
            start = delim;
            utf8proc_uint8_t tmp[4];
            utf8proc_ssize_t w = utf8proc_encode_char((utf8proc_int32_t)m, tmp);
            if (k + (size_t)w > s.n * 2 + 4) return chat_oom(rt);
            memcpy(o + k, tmp, (size_t)w);
            k += (size_t)w;
        }
        *out = cv_str(o, k);
        return 0;
    }
    if (chat_seq_eq(n, "replace")) {
        chat_str o, nw;
        if (chat_want_str(rt, a0, "replace", &o) ||
            chat_want_str(rt, chat_arg(c, 1, "new"), "replace", &nw))
            return -1;
        const chat_val *cn = chat_arg(c, 2, "count");
        return chat_str_replace(rt, s, o, nw, cn && cn->t == CV_INT ? cn->i : -1, out);
    }
    if (chat_seq_eq(n, "indent")) return do_indent(rt, s, c, out);
    if (chat_seq_eq(n, "escape") || chat_seq_eq(n, "e")) {
        mc_buf b = MC_BUF_INIT;
        int r = 0;
        for (size_t i = 0; i < s.n && !r; i++) {
            const char *e = s.p[i] == '&'    ? "&amp;"
                            : s.p[i] == '<'  ? "&lt;"
                            : s.p[i] == '>'  ? "&gt;"
                            : s.p[i] == '"'  ? "&#34;"
                            : s.p[i] == '\'' ? "&#39;"
                                             : NULL;
            r |= (e ? mc_buf_append(&b, e, strlen(e), NULL)
                    : mc_buf_append(&b, s.p + i, 1, NULL)) != MC_OK;
        }
        if (!r) *out = chat_make_str(rt, b.data ? b.data : "", b.len);
        mc_buf_free(&b);
        return r || out->t != CV_STR ? chat_oom(rt) : 0;
    }
    return chat_rt_fail(rt, "unsupported filter: %.*s", (int)n.n, n.p);
}
