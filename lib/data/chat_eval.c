/*
 * chat_eval.c - rendering a parsed chat template: scopes as jinja2 has them
 * (a for loop's body and a macro are scopes, an if is not; namespace()
 * carries values out of loops), the loop variable, macros, break/continue,
 * {% generation %} spans, the globals transformers adds (raise_exception,
 * strftime_now, namespace, dict, range), the variables apply_chat_template
 * passes, and the public entry points of mc/chat.h.
 */
#include "chat_internal.h"
#include "mc/file.h"
#include "mc/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CALL_DEPTH 100
#define MAX_EVAL_DEPTH 400
#define RENDER_LIMIT ((size_t)1 << 30)
/* Loop iterations and macro calls of one render: a template of a hundred
 * bytes (three loops over a list of 30000) could otherwise run for hours,
 * in mc-serve on every request. Published templates take thousands. */
#define RENDER_MAX_STEPS ((uint64_t)1 << 24)

typedef struct scope {
    chat_dict *vars;
    struct scope *parent;
} scope;

typedef struct eval {
    chat_rt rt;
    mc_buf *out, *main;
    scope *top;
    int calls, depth;
    uint64_t steps; /* loop iterations and macro calls so far (RENDER_MAX_STEPS) */
    mc_buf spans;   /* mc_chat_span list */
} eval;

static int step(eval *E)
{
    if (++E->steps <= RENDER_MAX_STEPS) return 0;
    return chat_rt_fail(&E->rt, "more than %llu loop iterations and macro calls (render limit)",
                        (unsigned long long)RENDER_MAX_STEPS);
}

enum { EX_OK = 0, EX_BREAK = 1, EX_CONTINUE = 2 };

static int oom(eval *E) { return chat_rt_fail(&E->rt, "out of memory (render limit)"); }

static int lookup(eval *E, scope *s, chat_str name, chat_val *out)
{
    for (; s; s = s->parent) {
        const chat_val *v = chat_dict_get(s->vars, name.p, name.n);
        if (v) {
            *out = *v;
            return 1;
        }
    }
    static const char *const funcs[CF_N] = {"range", "namespace", "dict", "raise_exception",
                                            "strftime_now"};
    for (int i = 0; i < CF_N; i++)
        if (name.n == strlen(funcs[i]) && !memcmp(name.p, funcs[i], name.n)) {
            *out = (chat_val){.t = CV_FUNC, .func = i};
            return 1;
        }
    char *nm = chat_strndup(E->rt.a, name.p, name.n);
    *out = cv_undef(nm);
    return 0;
}

static int scope_set(eval *E, scope *s, chat_str name, chat_val v)
{
    return chat_dict_set(E->rt.a, s->vars, cv_str(name.p, name.n), v) ? oom(E) : 0;
}

static scope *scope_new(eval *E, scope *parent)
{
    scope *s = chat_alloc(E->rt.a, sizeof *s);
    if (!s || !(s->vars = chat_dict_new(E->rt.a, 4))) return NULL;
    s->parent = parent;
    return s;
}

static int eval_expr(eval *E, scope *s, const chat_node *n, chat_val *out);
static int exec_body(eval *E, scope *s, chat_node *const *body, size_t n);

static int eval_list(eval *E, scope *s, chat_node *const *v, size_t n, chat_val **out)
{
    *out = chat_alloc(E->rt.a, (n + 1) * sizeof **out);
    if (!*out) return oom(E);
    for (size_t i = 0; i < n; i++)
        if (eval_expr(E, s, v[i], &(*out)[i])) return -1;
    return 0;
}

/* evaluated arguments of a call, filter or test */
static int eval_call(eval *E, scope *s, const chat_node *n, chat_call *c, chat_val **args,
                     chat_val **kw)
{
    if (eval_list(E, s, n->list, n->n, args) || eval_list(E, s, n->list2, n->n2, kw)) return -1;
    c->args = *args;
    c->nargs = n->n;
    c->kwnames = n->names;
    c->kwargs = *kw;
    c->nkw = n->n2;
    return 0;
}

static int render_to_str(eval *E, scope *s, chat_node *const *body, size_t n, chat_val *out)
{
    mc_buf buf = MC_BUF_INIT, *saved = E->out;
    E->out = &buf;
    int r = exec_body(E, s, body, n);
    E->out = saved;
    if (r > 0) r = chat_rt_fail(&E->rt, "break or continue outside a loop");
    if (!r) {
        *out = chat_make_str(&E->rt, buf.data ? buf.data : "", buf.len);
        if (out->t != CV_STR) r = oom(E);
    }
    mc_buf_free(&buf);
    return r;
}

static int call_macro(eval *E, const chat_node *m, const chat_call *c, chat_val *out)
{
    if (E->calls >= MAX_CALL_DEPTH) return chat_rt_fail(&E->rt, "macro calls nested too deeply");
    if (step(E)) return -1;
    if (c->nargs > m->nnames)
        return chat_rt_fail(&E->rt, "macro '%.*s' takes not more than %zu argument(s)",
                            (int)m->name.n, m->name.p, m->nnames);
    scope *ms = scope_new(E, E->top);
    if (!ms) return oom(E);
    for (size_t i = 0; i < c->nkw; i++) {
        size_t j;
        for (j = 0; j < m->nnames; j++)
            if (m->names[j].n == c->kwnames[i].n &&
                !memcmp(m->names[j].p, c->kwnames[i].p, m->names[j].n))
                break;
        if (j == m->nnames || j < c->nargs)
            return chat_rt_fail(&E->rt, "macro '%.*s' got an unexpected argument '%.*s'",
                                (int)m->name.n, m->name.p, (int)c->kwnames[i].n, c->kwnames[i].p);
    }
    for (size_t j = 0; j < m->nnames; j++) {
        chat_val v = cv_undef(NULL);
        int have = 0;
        if (j < c->nargs) {
            v = c->args[j];
            have = 1;
        }
        for (size_t i = 0; i < c->nkw && !have; i++)
            if (m->names[j].n == c->kwnames[i].n &&
                !memcmp(m->names[j].p, c->kwnames[i].p, m->names[j].n)) {
                v = c->kwargs[i];
                have = 1;
            }
        if (!have && m->list2[j] && eval_expr(E, ms, m->list2[j], &v)) return -1;
        if (!have && !m->list2[j]) {
            char *nm = chat_strndup(E->rt.a, m->names[j].p, m->names[j].n);
            v = cv_undef(nm);
        }
        if (scope_set(E, ms, m->names[j], v)) return -1;
    }
    E->calls++;
    int line = E->rt.line;
    int r = render_to_str(E, ms, m->list, m->n, out);
    E->rt.line = line;
    E->calls--;
    return r;
}

static int call_func(eval *E, int f, const chat_call *c, chat_val *out)
{
    chat_rt *rt = &E->rt;
    if (f == CF_RAISE) {
        chat_val msg = c->nargs ? c->args[0] : cv_str("", 0);
        mc_buf b = MC_BUF_INIT;
        if (chat_str_of(&b, msg)) return oom(E);
        mc_error_set(rt->err, MC_ERR_FORMAT, "%s:%d: template raised: %.*s", rt->name, rt->line,
                     (int)b.len, b.data ? b.data : "");
        mc_buf_free(&b);
        return -1;
    }
    if (f == CF_RANGE) {
        int64_t a[3] = {0, 0, 1};
        if (c->nargs < 1 || c->nargs > 3 || c->nkw)
            return chat_rt_fail(rt, "range takes 1 to 3 integers");
        for (size_t i = 0; i < c->nargs; i++) {
            if (c->args[i].t != CV_INT && c->args[i].t != CV_BOOL)
                return chat_rt_fail(rt, "range: '%s' object cannot be interpreted as an integer",
                                    chat_type_name(c->args[i]));
            a[c->nargs == 1 ? 1 : i] = c->args[i].t == CV_INT ? c->args[i].i : c->args[i].b;
        }
        if (!a[2]) return chat_rt_fail(rt, "range() arg 3 must not be zero");
        chat_list *l = chat_list_new(rt->a, 0);
        if (!l) return oom(E);
        for (int64_t x = a[0]; a[2] > 0 ? x < a[1] : x > a[1]; x += a[2]) {
            if (l->n >= 10000000) return chat_rt_fail(rt, "range too large");
            if (chat_list_push(rt->a, l, cv_int(x))) return oom(E);
        }
        *out = (chat_val){.t = CV_LIST, .l = l};
        return 0;
    }
    if (f == CF_NAMESPACE || f == CF_DICT) {
        chat_dict *d = chat_dict_new(rt->a, c->nkw);
        if (!d) return oom(E);
        if (c->nargs > 1)
            return chat_rt_fail(rt, "%s takes at most one positional argument",
                                f == CF_DICT ? "dict" : "namespace");
        if (c->nargs == 1) {
            chat_val a0 = c->args[0];
            if (a0.t != CV_DICT && a0.t != CV_NS)
                return chat_rt_fail(rt, "unsupported argument to dict()/namespace()");
            for (size_t i = 0; i < a0.d->n; i++)
                if (chat_dict_set(rt->a, d, a0.d->k[i], a0.d->v[i])) return oom(E);
        }
        for (size_t i = 0; i < c->nkw; i++) {
            if (f == CF_NAMESPACE && c->kwnames[i].n && c->kwnames[i].p[0] == '_')
                return chat_rt_fail(rt, "namespace attributes may not start with '_'");
            if (chat_dict_set(rt->a, d, cv_str(c->kwnames[i].p, c->kwnames[i].n), c->kwargs[i]))
                return oom(E);
        }
        *out = (chat_val){.t = f == CF_DICT ? CV_DICT : CV_NS, .d = d};
        return 0;
    }
    /* strftime_now(format) */
    if (c->nargs != 1 || c->args[0].t != CV_STR)
        return chat_rt_fail(rt, "strftime_now takes a format string");
    char fmt[256], buf[512];
    if (c->args[0].s.n >= sizeof fmt) return chat_rt_fail(rt, "strftime_now: format too long");
    memcpy(fmt, c->args[0].s.p, c->args[0].s.n);
    fmt[c->args[0].s.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t k = strftime(buf, sizeof buf, fmt, &tm);
    *out = chat_make_str(rt, buf, k);
    return out->t == CV_STR ? 0 : oom(E);
}

static int slice_index(int64_t v, int64_t n, int64_t step, int is_start)
{
    (void)is_start;
    if (v < 0) {
        v += n;
        if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
        v = step < 0 ? n - 1 : n;
    }
    return (int)v;
}

static int eval_slice(eval *E, scope *s, const chat_node *n, chat_val *out)
{
    chat_val obj, part[3];
    if (eval_expr(E, s, n->list[0], &obj)) return -1;
    const chat_node *pn[3] = {n->a, n->b, n->c};
    for (int i = 0; i < 3; i++) {
        part[i] = cv_none();
        if (pn[i] && eval_expr(E, s, pn[i], &part[i])) return -1;
        if (part[i].t != CV_NONE && part[i].t != CV_INT && part[i].t != CV_BOOL)
            return chat_rt_fail(&E->rt, "slice indices must be integers or None");
    }
    E->rt.line = n->line;
    if (obj.t == CV_UNDEF)
        return chat_rt_fail(&E->rt, "undefined value: %.*s", (int)obj.s.n, obj.s.p ? obj.s.p : "");
    if (obj.t != CV_LIST && obj.t != CV_STR) {
        *out = cv_undef(NULL);
        return 0;
    }
    int64_t len = obj.t == CV_LIST ? (int64_t)obj.l->n : (int64_t)chat_utf8_len(obj.s.p, obj.s.n);
    int64_t step = part[2].t == CV_NONE ? 1 : part[2].t == CV_INT ? part[2].i : part[2].b;
    if (!step) return chat_rt_fail(&E->rt, "slice step cannot be zero");
    if (len > 0x7fffffff) return oom(E);
    int64_t start, stop;
    if (part[0].t == CV_NONE)
        start = step < 0 ? len - 1 : 0;
    else
        start = slice_index(part[0].t == CV_INT ? part[0].i : part[0].b, len, step, 1);
    if (part[1].t == CV_NONE)
        stop = step < 0 ? -1 : len;
    else
        stop = slice_index(part[1].t == CV_INT ? part[1].i : part[1].b, len, step, 0);
    if (obj.t == CV_LIST) {
        chat_list *l = chat_list_new(E->rt.a, 0);
        if (!l) return oom(E);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            if (chat_list_push(E->rt.a, l, obj.l->v[i])) return oom(E);
        *out = (chat_val){.t = CV_LIST, .l = l, .tuple = obj.tuple};
        return 0;
    }
    /* strings: by code point */
    size_t *offs = chat_alloc(E->rt.a, ((size_t)len + 1) * sizeof *offs);
    if (!offs) return oom(E);
    for (size_t i = 0, k = 0; k <= (size_t)len; k++) {
        offs[k] = i;
        if (i < obj.s.n) chat_utf8_next(obj.s.p, obj.s.n, &i);
    }
    if (step == 1) {
        *out = cv_str(obj.s.p + offs[start], start < stop ? offs[stop] - offs[start] : 0);
        return 0;
    }
    mc_buf b = MC_BUF_INIT;
    int r = 0;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        r |= mc_buf_append(&b, obj.s.p + offs[i], offs[i + 1] - offs[i], NULL) != MC_OK;
    if (!r) *out = chat_make_str(&E->rt, b.data ? b.data : "", b.len);
    mc_buf_free(&b);
    return r || out->t != CV_STR ? oom(E) : 0;
}

static int eval_expr(eval *E, scope *s, const chat_node *n, chat_val *out)
{
    chat_rt *rt = &E->rt;
    chat_val x, y;
    if (++E->depth > MAX_EVAL_DEPTH) return chat_rt_fail(rt, "expression nested too deeply");
    int r = 0;
    switch (n->kind) {
    case CN_CONST: *out = n->val; break;
    case CN_NAME: lookup(E, s, n->name, out); break;
    case CN_ATTR:
        if ((r = eval_expr(E, s, n->a, &x))) break;
        rt->line = n->line;
        if (x.t == CV_UNDEF)
            r = chat_rt_fail(rt, "undefined value%s%.*s has no attribute '%.*s'", x.s.p ? " " : "",
                             (int)x.s.n, x.s.p ? x.s.p : "", (int)n->name.n, n->name.p);
        else
            r = chat_getattr(rt, x, n->name, out);
        break;
    case CN_ITEM:
        if ((r = eval_expr(E, s, n->a, &x)) || (r = eval_expr(E, s, n->b, &y))) break;
        rt->line = n->line;
        r = chat_getitem(rt, x, y, out);
        break;
    case CN_SLICE: r = eval_slice(E, s, n, out); break;
    case CN_CALL: {
        chat_val *args, *kw;
        chat_call c;
        if ((r = eval_expr(E, s, n->a, &x)) || (r = eval_call(E, s, n, &c, &args, &kw))) break;
        rt->line = n->line;
        if (x.t == CV_MACRO)
            r = call_macro(E, x.macro, &c, out);
        else if (x.t == CV_FUNC)
            r = call_func(E, x.func, &c, out);
        else if (x.t == CV_METHOD)
            r = chat_call_method(rt, x.m, &c, out);
        else if (x.t == CV_UNDEF)
            r = chat_rt_fail(rt, "undefined value%s%.*s is not callable", x.s.p ? " " : "",
                             (int)x.s.n, x.s.p ? x.s.p : "");
        else
            r = chat_rt_fail(rt, "'%s' object is not callable", chat_type_name(x));
        break;
    }
    case CN_FILTER:
    case CN_TEST: {
        chat_val *args, *kw;
        chat_call c;
        if ((r = eval_expr(E, s, n->a, &x)) || (r = eval_call(E, s, n, &c, &args, &kw))) break;
        rt->line = n->line;
        if (n->kind == CN_FILTER) {
            r = chat_filter(rt, n->name, x, &c, out);
        } else {
            int t;
            if (!(r = chat_test(rt, n->name, x, &c, &t))) *out = cv_bool(n->negate ? !t : t);
        }
        break;
    }
    case CN_BINOP:
        if ((r = eval_expr(E, s, n->a, &x)) || (r = eval_expr(E, s, n->b, &y))) break;
        rt->line = n->line;
        r = chat_binop(rt, n->op, x, y, out);
        break;
    case CN_NEG:
    case CN_POS:
        if ((r = eval_expr(E, s, n->a, &x))) break;
        rt->line = n->line;
        if (x.t == CV_INT || x.t == CV_BOOL) {
            int64_t v = x.t == CV_INT ? x.i : x.b;
            if (n->kind == CN_NEG && v == INT64_MIN) r = chat_rt_fail(rt, "integer overflow");
            *out = cv_int(n->kind == CN_NEG ? -v : v);
        } else if (x.t == CV_FLOAT) {
            *out = cv_float(n->kind == CN_NEG ? -x.f : x.f);
        } else {
            r = chat_rt_fail(rt, "bad operand type for unary %c: '%s'",
                             n->kind == CN_NEG ? '-' : '+', chat_type_name(x));
        }
        break;
    case CN_NOT:
        if (!(r = eval_expr(E, s, n->a, &x))) *out = cv_bool(!chat_truthy(x));
        break;
    case CN_AND:
    case CN_OR:
        if ((r = eval_expr(E, s, n->a, &x))) break;
        if (chat_truthy(x) == (n->kind == CN_OR))
            *out = x;
        else
            r = eval_expr(E, s, n->b, out);
        break;
    case CN_COMPARE:
        if ((r = eval_expr(E, s, n->a, &x))) break;
        *out = cv_bool(1);
        for (size_t i = 0; i < n->n; i++) {
            chat_val res;
            if ((r = eval_expr(E, s, n->list[i], &y))) break;
            rt->line = n->line;
            if ((r = chat_binop(rt, n->ops[i], x, y, &res))) break;
            if (!res.b) {
                *out = cv_bool(0);
                break;
            }
            x = y;
        }
        break;
    case CN_COND:
        if ((r = eval_expr(E, s, n->a, &x))) break;
        if (chat_truthy(x))
            r = eval_expr(E, s, n->b, out);
        else if (n->c)
            r = eval_expr(E, s, n->c, out);
        else
            *out = cv_undef(NULL);
        break;
    case CN_LIST:
    case CN_TUPLE: {
        chat_val *v;
        if ((r = eval_list(E, s, n->list, n->n, &v))) break;
        chat_list *l = chat_alloc(rt->a, sizeof *l);
        if (!l) {
            r = oom(E);
            break;
        }
        l->v = v;
        l->n = l->cap = n->n;
        *out = (chat_val){.t = CV_LIST, .l = l, .tuple = n->kind == CN_TUPLE};
        break;
    }
    case CN_DICT: {
        chat_dict *d = chat_dict_new(rt->a, n->n);
        if (!d) {
            r = oom(E);
            break;
        }
        for (size_t i = 0; i < n->n && !r; i++) {
            if ((r = eval_expr(E, s, n->list[i], &x)) || (r = eval_expr(E, s, n->list2[i], &y)))
                break;
            if (chat_dict_set(rt->a, d, x, y)) r = oom(E);
        }
        *out = (chat_val){.t = CV_DICT, .d = d};
        break;
    }
    default: r = chat_rt_fail(rt, "internal error: bad expression node");
    }
    E->depth--;
    return r;
}

/* ---------------------------------------------------------------- statements */

static int assign(eval *E, scope *s, const chat_node *n, chat_val v)
{
    if (n->nnames == 1) return scope_set(E, s, n->names[0], v);
    if (v.t != CV_LIST || v.l->n != n->nnames)
        return chat_rt_fail(&E->rt, "cannot unpack %s into %zu variables", chat_type_name(v),
                            n->nnames);
    for (size_t i = 0; i < n->nnames; i++)
        if (scope_set(E, s, n->names[i], v.l->v[i])) return -1;
    return 0;
}

static int iterable(eval *E, chat_val v, chat_list **out)
{
    chat_rt *rt = &E->rt;
    if (v.t == CV_LIST) {
        *out = v.l;
        return 0;
    }
    chat_list *l = chat_list_new(rt->a, 0);
    if (!l) return oom(E);
    *out = l;
    if (v.t == CV_UNDEF) return 0;
    if (v.t == CV_DICT) {
        for (size_t i = 0; i < v.d->n; i++)
            if (chat_list_push(rt->a, l, v.d->k[i])) return oom(E);
        return 0;
    }
    if (v.t == CV_STR) {
        for (size_t i = 0; i < v.s.n;) {
            size_t b = i;
            chat_utf8_next(v.s.p, v.s.n, &i);
            if (chat_list_push(rt->a, l, cv_str(v.s.p + b, i - b))) return oom(E);
        }
        return 0;
    }
    return chat_rt_fail(rt, "'%s' object is not iterable", chat_type_name(v));
}

static int exec_for(eval *E, scope *s, const chat_node *n)
{
    chat_val seq;
    chat_list *items = NULL;
    if (eval_expr(E, s, n->a, &seq)) return -1;
    E->rt.line = n->line;
    if (iterable(E, seq, &items)) return -1;
    scope *ls = scope_new(E, s);
    if (!ls) return oom(E);
    if (n->b) { /* for x in seq if cond: the loop sees only the items that pass */
        chat_list *kept = chat_list_new(E->rt.a, 0);
        if (!kept) return oom(E);
        for (size_t i = 0; i < items->n; i++) {
            chat_val ok;
            if (step(E)) return -1;
            if (assign(E, ls, n, items->v[i]) || eval_expr(E, ls, n->b, &ok)) return -1;
            if (chat_truthy(ok) && chat_list_push(E->rt.a, kept, items->v[i])) return oom(E);
        }
        items = kept;
    }
    chat_loop *L = chat_alloc(E->rt.a, sizeof *L);
    if (!L) return oom(E);
    L->items = items;
    chat_val outer;
    L->depth = lookup(E, s, (chat_str){"loop", 4}, &outer) && outer.t == CV_LOOP
                   ? outer.loop->depth + 1
                   : 1;
    if (scope_set(E, ls, (chat_str){"loop", 4}, (chat_val){.t = CV_LOOP, .loop = L})) return -1;
    for (size_t i = 0; i < items->n; i++) {
        L->index0 = i;
        E->rt.line = n->line;
        if (step(E)) return -1;
        if (assign(E, ls, n, items->v[i])) return -1;
        int r = exec_body(E, ls, n->list, n->n);
        if (r < 0) return -1;
        if (r == EX_BREAK) break;
    }
    if (!items->n && n->n2) return exec_body(E, s, n->list2, n->n2);
    return 0;
}

static int exec_stmt(eval *E, scope *s, const chat_node *n)
{
    chat_rt *rt = &E->rt;
    chat_val v;
    rt->line = n->line;
    switch (n->kind) {
    case CN_TEXT:
        if (E->out->len + n->val.s.n > RENDER_LIMIT) return oom(E);
        return mc_buf_append(E->out, n->val.s.p, n->val.s.n, NULL) ? oom(E) : 0;
    case CN_OUTPUT:
        if (eval_expr(E, s, n->a, &v)) return -1;
        /* the text rendered so far is held to the arena's limit too */
        return chat_str_of(E->out, v) || E->out->len > RENDER_LIMIT ? oom(E) : 0;
    case CN_IF:
        if (eval_expr(E, s, n->a, &v)) return -1;
        return chat_truthy(v) ? exec_body(E, s, n->list, n->n) : exec_body(E, s, n->list2, n->n2);
    case CN_FOR: return exec_for(E, s, n);
    case CN_SET:
        if (n->a) {
            if (eval_expr(E, s, n->a, &v)) return -1;
        } else if (render_to_str(E, s, n->list, n->n, &v)) {
            return -1;
        }
        rt->line = n->line;
        if (n->negate) {
            chat_val ns;
            lookup(E, s, n->names[0], &ns);
            if (ns.t != CV_NS)
                return chat_rt_fail(rt, "cannot assign attribute on non-namespace object '%.*s'",
                                    (int)n->names[0].n, n->names[0].p);
            if (n->attr.n && n->attr.p[0] == '_')
                return chat_rt_fail(rt, "namespace attributes may not start with '_'");
            return chat_dict_set(rt->a, ns.d, cv_str(n->attr.p, n->attr.n), v) ? oom(E) : 0;
        }
        return assign(E, s, n, v);
    case CN_MACRO: return scope_set(E, s, n->name, (chat_val){.t = CV_MACRO, .macro = n});
    case CN_BREAK: return EX_BREAK;
    case CN_CONTINUE: return EX_CONTINUE;
    case CN_GENERATION: {
        size_t begin = E->out->len;
        int r = exec_body(E, s, n->list, n->n);
        if (r == 0 && E->out == E->main) {
            mc_chat_span sp = {begin, E->out->len};
            if (mc_buf_push(&E->spans, &sp, sizeof sp, NULL)) return oom(E);
        }
        return r;
    }
    default: return chat_rt_fail(rt, "internal error: bad statement node");
    }
}

static int exec_body(eval *E, scope *s, chat_node *const *body, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int r = exec_stmt(E, s, body[i]);
        if (r) return r;
    }
    return 0;
}

/* ---------------------------------------------------------------- variables */

static int put_var(eval *E, chat_dict *d, const char *name, chat_val v)
{
    return chat_dict_set(E->rt.a, d, cv_str(name, strlen(name)), v) ? oom(E) : 0;
}

/* transformers' _normalize_chat_messages and _alias_reasoning_fields */
static int make_messages(eval *E, const json_t *msgs, chat_val *out)
{
    chat_rt *rt = &E->rt;
    if (!msgs || !json_is_array(msgs))
        return mc_error_set(rt->err, MC_ERR_USAGE, "%s: messages must be a JSON array", rt->name),
               -1;
    chat_list *l = chat_list_new(rt->a, json_array_size(msgs));
    if (!l) return oom(E);
    static const char *const reasoning[] = {"reasoning_content", "thinking", "reasoning"};
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            return mc_error_set(rt->err, MC_ERR_FORMAT, "%s: message %zu is not a JSON object",
                                rt->name, i + 1),
                   -1;
        const json_t *r = NULL;
        for (int k = 0; k < 3 && !r; k++) {
            const json_t *x = json_object_get(m, reasoning[k]);
            if (x && !json_is_null(x)) r = x;
        }
        chat_dict *d = chat_dict_new(rt->a, json_object_size(m) + 2);
        if (!d) return oom(E);
        chat_val rv;
        if (r && (chat_from_json(rt->a, r, &rv) || put_var(E, d, "thinking", rv))) return oom(E);
        for (void *it = json_object_iter((json_t *)m); it;
             it = json_object_iter_next((json_t *)m, it)) {
            const json_t *x = json_object_iter_value(it);
            chat_val v;
            if (json_is_null(x)) continue;
            if (chat_from_json(rt->a, x, &v) || put_var(E, d, json_object_iter_key(it), v))
                return oom(E);
        }
        if (r && put_var(E, d, "reasoning_content", rv)) return -1;
        l->v[l->n++] = (chat_val){.t = CV_DICT, .d = d};
    }
    *out = (chat_val){.t = CV_LIST, .l = l};
    return 0;
}

/* ---------------------------------------------------------------- public API */

mc_status mc_chat_template_parse(const char *name, const char *src, size_t len,
                                 mc_chat_template **out, mc_error *err)
{
    mc_error local;
    if (!err) err = &local;
    mc_error_clear(err);
    *out = NULL;
    mc_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name ? name : "template"))) {
        free(t);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    t->arena.limit = RENDER_LIMIT;
    if (chat_parse(&t->arena, t->name, src ? src : "", src ? len : 0, &t->body, err)) {
        mc_chat_template_free(t);
        return err && err->code ? err->code : MC_ERR_FORMAT;
    }
    *out = t;
    return MC_OK;
}

void mc_chat_template_free(mc_chat_template *t)
{
    if (!t) return;
    chat_arena_free(&t->arena);
    free(t->name);
    free(t);
}

mc_status mc_chat_template_load(const char *path, mc_chat_template **out, mc_error *err)
{
    char *data;
    size_t len;
    *out = NULL;
    mc_status st = mc_read_file(path, &data, &len, err);
    if (st) return st;
    size_t i = 0;
    while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
        i++;
    size_t k = i + 1, pl = strlen(path);
    while (k < len && (data[k] == ' ' || data[k] == '\t' || data[k] == '\n' || data[k] == '\r'))
        k++;
    int is_json = (pl >= 5 && !strcmp(path + pl - 5, ".json")) ||
                  (i < len && data[i] == '{' && k < len && data[k] == '"');
    if (!is_json) {
        st = mc_chat_template_parse(path, data, len, out, err);
        free(data);
        return st;
    }
    json_t *j;
    st = mc_json_load_buf(path, data, len, &j, err);
    free(data);
    if (st) return st;
    const json_t *ct = json_object_get(j, "chat_template");
    if (json_is_array(ct)) {
        const json_t *found = NULL;
        for (size_t x = 0; x < json_array_size(ct); x++) {
            const json_t *e = json_array_get(ct, x);
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "default")) found = json_object_get(e, "template");
        }
        if (!found) {
            json_decref(j);
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: chat_template is a list without a template named \"default\"",
                                path);
        }
        ct = found;
    }
    if (!json_is_string(ct)) {
        json_decref(j);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: no \"chat_template\" string", path);
    }
    char *name = mc_strprintf("%s[chat_template]", path);
    if (!name) {
        json_decref(j);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    st = mc_chat_template_parse(name, json_string_value(ct), json_string_length(ct), out, err);
    free(name);
    json_decref(j);
    return st;
}

mc_status mc_chat_template_render_spans(const mc_chat_template *t, const mc_chat_vars *v,
                                        char **out, size_t *len, mc_chat_span **spans,
                                        size_t *nspans, mc_error *err)
{
    mc_error local;
    if (!err) err = &local;
    *out = NULL;
    *len = 0;
    if (spans) *spans = NULL;
    if (nspans) *nspans = 0;
    if (!t || !v) return mc_error_set(err, MC_ERR_USAGE, "chat template: nothing to render");
    chat_arena arena = {.limit = RENDER_LIMIT};
    mc_buf buf = MC_BUF_INIT;
    eval E = {
        .rt = {.a = &arena, .err = err, .name = t->name, .line = 1}, .out = &buf, .main = &buf};
    mc_error_clear(err);
    int r = -1;
    scope *g = scope_new(&E, NULL), *top = g ? scope_new(&E, g) : NULL;
    if (!top) {
        r = oom(&E);
        goto done;
    }
    E.top = top;
    chat_val x;
    if (v->bos_token &&
        put_var(&E, g->vars, "bos_token", cv_str(v->bos_token, strlen(v->bos_token))))
        goto done;
    if (v->eos_token &&
        put_var(&E, g->vars, "eos_token", cv_str(v->eos_token, strlen(v->eos_token))))
        goto done;
    if (v->extra) {
        if (!json_is_object(v->extra)) {
            mc_error_set(err, MC_ERR_USAGE, "%s: extra variables must be a JSON object", t->name);
            goto done;
        }
        for (void *it = json_object_iter((json_t *)v->extra); it;
             it = json_object_iter_next((json_t *)v->extra, it))
            if (chat_from_json(&arena, json_object_iter_value(it), &x) ||
                put_var(&E, g->vars, json_object_iter_key(it), x))
                goto done;
    }
    if (make_messages(&E, v->messages, &x) || put_var(&E, g->vars, "messages", x)) goto done;
    x = cv_none();
    if (v->tools && chat_from_json(&arena, v->tools, &x)) {
        oom(&E);
        goto done;
    }
    if (put_var(&E, g->vars, "tools", x) || put_var(&E, g->vars, "documents", cv_none()) ||
        put_var(&E, g->vars, "add_generation_prompt", cv_bool(v->add_generation_prompt)))
        goto done;
    r = exec_body(&E, top, t->body->list, t->body->n);
    if (r > 0) r = chat_rt_fail(&E.rt, "break or continue outside a loop");
    if (!r) {
        *out = malloc(buf.len + 1);
        if (!*out) {
            r = -1;
            mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        } else {
            if (buf.len) memcpy(*out, buf.data, buf.len);
            (*out)[buf.len] = 0;
            *len = buf.len;
            if (spans && E.spans.len) {
                *spans = (mc_chat_span *)(void *)E.spans.data;
                *nspans = E.spans.len / sizeof(mc_chat_span);
                E.spans = (mc_buf)MC_BUF_INIT;
            }
        }
    }
done:
    mc_buf_free(&buf);
    mc_buf_free(&E.spans);
    chat_arena_free(&arena);
    if (r && err && !err->code) mc_error_set(err, MC_ERR_INTERNAL, "%s: render failed", t->name);
    return r ? (err ? err->code : MC_ERR_FORMAT) : MC_OK;
}

mc_status mc_chat_template_render(const mc_chat_template *t, const mc_chat_vars *v, char **out,
                                  size_t *len, mc_error *err)
{
    return mc_chat_template_render_spans(t, v, out, len, NULL, NULL, err);
}
