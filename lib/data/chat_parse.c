/*
 * chat_parse.c - the chat template parser: tokens to a syntax tree, with
 * jinja2's grammar and precedence (filters and tests bind tighter than
 * arithmetic, "not x is y" is "not (x is y)", chained comparisons, the
 * "for ... in ... if ..." filter). Tags, filters and tests outside mc's
 * subset are refused here, naming the construct and the line.
 */
#include "chat_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 200

typedef struct parser {
    chat_arena *a;
    const char *name;
    mc_error *err;
    chat_token *t;
    size_t n, i;
    int depth;
} parser;

static int perr(parser *P, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *P, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mc_error_set(P->err, MC_ERR_FORMAT, "%s:%d: %s", P->name, line, msg);
    return -1;
}

static chat_token *cur(parser *P) { return &P->t[P->i]; }
static chat_token *peek(parser *P, size_t k)
{
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}
static void adv(parser *P)
{
    if (P->i + 1 < P->n) P->i++;
}
static int is_op(chat_token *k, const char *op)
{
    return k->t == CT_OP && k->s.n == strlen(op) && !memcmp(k->s.p, op, k->s.n);
}
static int is_name(chat_token *k, const char *w)
{
    return k->t == CT_NAME && k->s.n == strlen(w) && !memcmp(k->s.p, w, k->s.n);
}

static const char *tok_desc(chat_token *k, char *buf, size_t size)
{
    switch (k->t) {
    case CT_EOF: return "end of template";
    case CT_VAR_END: return "'}}'";
    case CT_BLK_END: return "'%}'";
    case CT_VAR_BEG: return "'{{'";
    case CT_BLK_BEG: return "'{%'";
    case CT_STRING: return "a string";
    case CT_TEXT: return "template data";
    default: snprintf(buf, size, "'%.*s'", (int)(k->s.n > 40 ? 40 : k->s.n), k->s.p); return buf;
    }
}

static int expect_op(parser *P, const char *op)
{
    char b[64];
    if (!is_op(cur(P), op))
        return perr(P, cur(P)->line, "syntax error: expected '%s', got %s", op,
                    tok_desc(cur(P), b, sizeof b));
    adv(P);
    return 0;
}

static int expect(parser *P, chat_tok t, const char *what)
{
    char b[64];
    if (cur(P)->t != t)
        return perr(P, cur(P)->line, "syntax error: expected %s, got %s", what,
                    tok_desc(cur(P), b, sizeof b));
    adv(P);
    return 0;
}

static chat_node *node(parser *P, int kind, int line)
{
    chat_node *n = chat_alloc(P->a, sizeof *n);
    if (!n) {
        perr(P, line, "template too large");
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

/* Growable arrays of node pointers and names, in the arena. */
typedef struct nvec {
    chat_node **v;
    size_t n, cap;
} nvec;
typedef struct svec {
    chat_str *v;
    size_t n, cap;
} svec;

static int nvec_push(parser *P, nvec *v, chat_node *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 4;
        chat_node **nv = chat_alloc(P->a, cap * sizeof *nv);
        if (!nv) return perr(P, cur(P)->line, "template too large");
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}
static int svec_push(parser *P, svec *v, chat_str x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 4;
        chat_str *nv = chat_alloc(P->a, cap * sizeof *nv);
        if (!nv) return perr(P, cur(P)->line, "template too large");
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

static chat_node *parse_expr(parser *P, int with_condexpr);
static chat_node *parse_unary(parser *P, int with_filter);
static chat_node *parse_primary(parser *P);
static chat_node *parse_postfix(parser *P, chat_node *e);

static int enter(parser *P)
{
    if (++P->depth > MAX_DEPTH) return perr(P, cur(P)->line, "template nested too deeply");
    return 0;
}

/* expr [, expr ...]: a tuple when there is a comma */
static chat_node *parse_tuple(parser *P, int with_condexpr, int explicit_parens)
{
    int line = cur(P)->line;
    nvec items = {0};
    int comma = 0;
    for (;;) {
        if (items.n) {
            if (!is_op(cur(P), ",")) break;
            adv(P);
            comma = 1;
        }
        chat_token *k = cur(P);
        if (k->t == CT_VAR_END || k->t == CT_BLK_END || k->t == CT_EOF || is_op(k, ")") ||
            (items.n && is_name(k, "in")) || (items.n && is_name(k, "if")))
            break;
        chat_node *e = parse_expr(P, with_condexpr);
        if (!e || nvec_push(P, &items, e)) return NULL;
    }
    if (!items.n) {
        if (!explicit_parens) {
            char b[64];
            perr(P, cur(P)->line, "syntax error: expected an expression, got %s",
                 tok_desc(cur(P), b, sizeof b));
            return NULL;
        }
    } else if (!comma) {
        return items.v[0];
    }
    chat_node *t = node(P, CN_TUPLE, line);
    if (!t) return NULL;
    t->list = items.v;
    t->n = items.n;
    return t;
}

static int parse_args(parser *P, chat_node *call)
{
    nvec args = {0}, kw = {0};
    svec kwn = {0};
    if (expect_op(P, "(")) return -1;
    while (!is_op(cur(P), ")")) {
        if (args.n + kw.n && expect_op(P, ",")) return -1;
        if (is_op(cur(P), ")")) break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            return perr(P, cur(P)->line, "unsupported construct: *args/**kwargs in a call");
        if (cur(P)->t == CT_NAME && is_op(peek(P, 1), "=")) {
            chat_str k = cur(P)->s;
            adv(P);
            adv(P);
            chat_node *e = parse_expr(P, 1);
            if (!e || svec_push(P, &kwn, k) || nvec_push(P, &kw, e)) return -1;
        } else {
            if (kw.n)
                return perr(P, cur(P)->line, "syntax error: positional argument after keyword");
            chat_node *e = parse_expr(P, 1);
            if (!e || nvec_push(P, &args, e)) return -1;
        }
    }
    adv(P);
    call->list = args.v;
    call->n = args.n;
    call->list2 = kw.v;
    call->n2 = kw.n;
    call->names = kwn.v;
    call->nnames = kwn.n;
    return 0;
}

static int parse_dotted_name(parser *P, chat_str *out)
{
    if (cur(P)->t != CT_NAME) return expect(P, CT_NAME, "a name");
    *out = cur(P)->s;
    adv(P);
    if (is_op(cur(P), "."))
        return perr(P, cur(P)->line, "unsupported construct: dotted filter or test name");
    return 0;
}

static chat_node *parse_filter_expr(parser *P, chat_node *e)
{
    for (;;) {
        chat_token *k = cur(P);
        if (is_op(k, "|")) {
            adv(P);
            chat_node *f = node(P, CN_FILTER, cur(P)->line);
            if (!f || parse_dotted_name(P, &f->name)) return NULL;
            if (!chat_filter_known(f->name)) {
                perr(P, f->line, "unsupported filter: %.*s", (int)f->name.n, f->name.p);
                return NULL;
            }
            f->a = e;
            if (is_op(cur(P), "(") && parse_args(P, f)) return NULL;
            e = f;
        } else if (is_name(k, "is")) {
            adv(P);
            chat_node *t = node(P, CN_TEST, k->line);
            if (!t) return NULL;
            if (is_name(cur(P), "not")) {
                t->negate = 1;
                adv(P);
            }
            if (parse_dotted_name(P, &t->name)) return NULL;
            if (!chat_test_known(t->name)) {
                perr(P, t->line, "unsupported test: %.*s", (int)t->name.n, t->name.p);
                return NULL;
            }
            t->a = e;
            chat_token *c = cur(P);
            if (is_op(c, "(")) {
                if (parse_args(P, t)) return NULL;
            } else if ((c->t == CT_NAME || c->t == CT_STRING || c->t == CT_INT ||
                        c->t == CT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is")) {
                    perr(P, c->line, "syntax error: cannot chain tests with is");
                    return NULL;
                }
                chat_node *arg = parse_primary(P);
                if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
                t->list = chat_alloc(P->a, sizeof *t->list);
                if (!t->list) return NULL;
                t->list[0] = arg;
                t->n = 1;
            }
            e = t;
        } else if (is_op(k, "(")) {
            chat_node *c = node(P, CN_CALL, k->line);
            if (!c || parse_args(P, c)) return NULL;
            c->a = e;
            e = c;
        } else {
            return e;
        }
    }
}

static chat_node *parse_subscribed(parser *P)
{
    int line = cur(P)->line;
    chat_node *parts[3] = {NULL, NULL, NULL};
    if (!is_op(cur(P), ":")) {
        parts[0] = parse_expr(P, 1);
        if (!parts[0]) return NULL;
        if (!is_op(cur(P), ":")) return parts[0];
    }
    adv(P); /* ':' */
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) {
        if (!(parts[1] = parse_expr(P, 1))) return NULL;
    }
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) {
            if (!(parts[2] = parse_expr(P, 1))) return NULL;
        }
    }
    chat_node *s = node(P, CN_SLICE, line);
    if (!s) return NULL;
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static chat_node *parse_postfix(parser *P, chat_node *e)
{
    for (;;) {
        chat_token *k = cur(P);
        if (is_op(k, ".")) {
            adv(P);
            chat_token *a = cur(P);
            if (a->t == CT_NAME) {
                chat_node *g = node(P, CN_ATTR, k->line);
                if (!g) return NULL;
                g->a = e;
                g->name = a->s;
                adv(P);
                e = g;
            } else if (a->t == CT_INT) {
                chat_node *g = node(P, CN_ITEM, k->line), *c = node(P, CN_CONST, k->line);
                if (!g || !c) return NULL;
                c->val = cv_int(a->i);
                g->a = e;
                g->b = c;
                adv(P);
                e = g;
            } else {
                perr(P, a->line, "syntax error: expected a name after '.'");
                return NULL;
            }
        } else if (is_op(k, "[")) {
            adv(P);
            nvec idx = {0};
            while (!is_op(cur(P), "]")) {
                if (idx.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "]")) break;
                chat_node *s = parse_subscribed(P);
                if (!s || nvec_push(P, &idx, s)) return NULL;
            }
            adv(P);
            if (idx.n != 1) {
                perr(P, k->line, "unsupported construct: subscript with %zu parts", idx.n);
                return NULL;
            }
            if (idx.v[0]->kind == CN_SLICE) {
                idx.v[0]->list = chat_alloc(P->a, sizeof(chat_node *));
                if (!idx.v[0]->list) return NULL;
                idx.v[0]->list[0] = e;
                idx.v[0]->n = 1;
                e = idx.v[0];
            } else {
                chat_node *g = node(P, CN_ITEM, k->line);
                if (!g) return NULL;
                g->a = e;
                g->b = idx.v[0];
                e = g;
            }
        } else if (is_op(k, "(")) {
            chat_node *c = node(P, CN_CALL, k->line);
            if (!c || parse_args(P, c)) return NULL;
            c->a = e;
            e = c;
        } else {
            return e;
        }
    }
}

static chat_node *parse_primary(parser *P)
{
    chat_token *k = cur(P);
    char b[64];
    if (enter(P)) return NULL;
    chat_node *e = NULL;
    if (k->t == CT_NAME) {
        e = node(P, CN_CONST, k->line);
        if (!e) return NULL;
        if (is_name(k, "true") || is_name(k, "True"))
            e->val = cv_bool(1);
        else if (is_name(k, "false") || is_name(k, "False"))
            e->val = cv_bool(0);
        else if (is_name(k, "none") || is_name(k, "None"))
            e->val = cv_none();
        else {
            e->kind = CN_NAME;
            e->name = k->s;
        }
        adv(P);
    } else if (k->t == CT_STRING) {
        e = node(P, CN_CONST, k->line);
        if (!e) return NULL;
        size_t total = 0, j = P->i;
        for (; j < P->n && P->t[j].t == CT_STRING; j++) total += P->t[j].s.n;
        char *s = chat_alloc(P->a, total + 1);
        if (!s) {
            perr(P, k->line, "template too large");
            return NULL;
        }
        size_t o = 0;
        for (; P->i < j; P->i++) {
            memcpy(s + o, P->t[P->i].s.p, P->t[P->i].s.n);
            o += P->t[P->i].s.n;
        }
        e->val = cv_str(s, total);
    } else if (k->t == CT_INT || k->t == CT_FLOAT) {
        e = node(P, CN_CONST, k->line);
        if (!e) return NULL;
        e->val = k->t == CT_INT ? cv_int(k->i) : cv_float(k->f);
        adv(P);
    } else if (is_op(k, "(")) {
        adv(P);
        e = parse_tuple(P, 1, 1);
        if (!e || expect_op(P, ")")) return NULL;
    } else if (is_op(k, "[")) {
        adv(P);
        nvec items = {0};
        while (!is_op(cur(P), "]")) {
            if (items.n && expect_op(P, ",")) return NULL;
            if (is_op(cur(P), "]")) break;
            chat_node *x = parse_expr(P, 1);
            if (!x || nvec_push(P, &items, x)) return NULL;
        }
        adv(P);
        e = node(P, CN_LIST, k->line);
        if (!e) return NULL;
        e->list = items.v;
        e->n = items.n;
    } else if (is_op(k, "{")) {
        adv(P);
        nvec keys = {0}, vals = {0};
        while (!is_op(cur(P), "}")) {
            if (keys.n && expect_op(P, ",")) return NULL;
            if (is_op(cur(P), "}")) break;
            chat_node *key = parse_expr(P, 1);
            if (!key || expect_op(P, ":")) return NULL;
            chat_node *val = parse_expr(P, 1);
            if (!val || nvec_push(P, &keys, key) || nvec_push(P, &vals, val)) return NULL;
        }
        adv(P);
        e = node(P, CN_DICT, k->line);
        if (!e) return NULL;
        e->list = keys.v;
        e->n = keys.n;
        e->list2 = vals.v;
        e->n2 = vals.n;
    } else {
        perr(P, k->line, "syntax error: unexpected %s", tok_desc(k, b, sizeof b));
        return NULL;
    }
    P->depth--;
    return e;
}

static chat_node *parse_unary(parser *P, int with_filter)
{
    chat_token *k = cur(P);
    chat_node *e;
    if (enter(P)) return NULL;
    if (is_op(k, "-") || is_op(k, "+")) {
        adv(P);
        e = node(P, is_op(k, "-") ? CN_NEG : CN_POS, k->line);
        if (!e || !(e->a = parse_unary(P, 0))) return NULL;
    } else {
        e = parse_primary(P);
    }
    if (e) e = parse_postfix(P, e);
    if (e && with_filter) e = parse_filter_expr(P, e);
    P->depth--;
    return e;
}

static chat_node *binop(parser *P, int op, chat_node *l, chat_node *r, int line)
{
    if (!l || !r) return NULL;
    chat_node *e = node(P, CN_BINOP, line);
    if (!e) return NULL;
    e->op = (uint8_t)op;
    e->a = l;
    e->b = r;
    return e;
}

static chat_node *parse_pow(parser *P)
{
    chat_node *l = parse_unary(P, 1);
    while (l && is_op(cur(P), "**")) {
        int line = cur(P)->line;
        adv(P);
        l = binop(P, CO_POW, l, parse_unary(P, 1), line);
    }
    return l;
}

static chat_node *parse_math2(parser *P)
{
    chat_node *l = parse_pow(P);
    for (;;) {
        chat_token *k = cur(P);
        int op = is_op(k, "*")    ? CO_MUL
                 : is_op(k, "/")  ? CO_DIV
                 : is_op(k, "//") ? CO_FLOORDIV
                 : is_op(k, "%")  ? CO_MOD
                                  : -1;
        if (!l || op < 0) return l;
        adv(P);
        l = binop(P, op, l, parse_pow(P), k->line);
    }
}

static chat_node *parse_concat(parser *P)
{
    chat_node *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) {
        int line = cur(P)->line;
        adv(P);
        l = binop(P, CO_CONCAT, l, parse_math2(P), line);
    }
    return l;
}

static chat_node *parse_math1(parser *P)
{
    chat_node *l = parse_concat(P);
    for (;;) {
        chat_token *k = cur(P);
        int op = is_op(k, "+") ? CO_ADD : is_op(k, "-") ? CO_SUB : -1;
        if (!l || op < 0) return l;
        adv(P);
        l = binop(P, op, l, parse_concat(P), k->line);
    }
}

static chat_node *parse_compare(parser *P)
{
    int line = cur(P)->line;
    chat_node *first = parse_math1(P);
    if (!first) return NULL;
    nvec rhs = {0};
    uint8_t ops[64];
    for (;;) {
        chat_token *k = cur(P);
        int op = is_op(k, "==")     ? CO_EQ
                 : is_op(k, "!=")   ? CO_NE
                 : is_op(k, "<")    ? CO_LT
                 : is_op(k, "<=")   ? CO_LE
                 : is_op(k, ">")    ? CO_GT
                 : is_op(k, ">=")   ? CO_GE
                 : is_name(k, "in") ? CO_IN
                                    : -1;
        if (op < 0 && is_name(k, "not") && is_name(peek(P, 1), "in")) {
            op = CO_NOTIN;
            adv(P);
        }
        if (op < 0) break;
        adv(P);
        if (rhs.n == sizeof ops) {
            perr(P, k->line, "comparison chain too long");
            return NULL;
        }
        ops[rhs.n] = (uint8_t)op;
        chat_node *r = parse_math1(P);
        if (!r || nvec_push(P, &rhs, r)) return NULL;
    }
    if (!rhs.n) return first;
    chat_node *c = node(P, CN_COMPARE, line);
    if (!c) return NULL;
    c->a = first;
    c->list = rhs.v;
    c->n = rhs.n;
    c->ops = chat_alloc(P->a, rhs.n);
    if (!c->ops) return NULL;
    memcpy(c->ops, ops, rhs.n);
    return c;
}

static chat_node *parse_not(parser *P)
{
    chat_token *k = cur(P);
    if (is_name(k, "not")) {
        if (enter(P)) return NULL;
        adv(P);
        chat_node *e = node(P, CN_NOT, k->line);
        if (!e || !(e->a = parse_not(P))) return NULL;
        P->depth--;
        return e;
    }
    return parse_compare(P);
}

static chat_node *parse_and(parser *P)
{
    chat_node *l = parse_not(P);
    while (l && is_name(cur(P), "and")) {
        int line = cur(P)->line;
        adv(P);
        chat_node *e = node(P, CN_AND, line);
        if (!e || !(e->b = parse_not(P))) return NULL;
        e->a = l;
        l = e;
    }
    return l;
}

static chat_node *parse_or(parser *P)
{
    chat_node *l = parse_and(P);
    while (l && is_name(cur(P), "or")) {
        int line = cur(P)->line;
        adv(P);
        chat_node *e = node(P, CN_OR, line);
        if (!e || !(e->b = parse_and(P))) return NULL;
        e->a = l;
        l = e;
    }
    return l;
}

static chat_node *parse_expr(parser *P, int with_condexpr)
{
    if (enter(P)) return NULL;
    chat_node *e = parse_or(P);
    while (e && with_condexpr && is_name(cur(P), "if")) {
        int line = cur(P)->line;
        adv(P);
        chat_node *c = node(P, CN_COND, line);
        if (!c || !(c->a = parse_or(P))) return NULL;
        c->b = e;
        if (is_name(cur(P), "else")) {
            adv(P);
            if (!(c->c = parse_expr(P, 1))) return NULL;
        }
        e = c;
    }
    P->depth--;
    return e;
}

/* ---------------------------------------------------------------- statements */

static int parse_body(parser *P, nvec *body, const char *const *ends, int *which);

/* a name or a tuple of names (for/set targets) */
static int parse_targets(parser *P, svec *names, int allow_ns, chat_str *ns_attr, int *is_ns)
{
    int paren = is_op(cur(P), "(");
    if (paren) adv(P);
    for (;;) {
        if (cur(P)->t != CT_NAME) return expect(P, CT_NAME, "a variable name");
        if (svec_push(P, names, cur(P)->s)) return -1;
        adv(P);
        if (allow_ns && names->n == 1 && !paren && is_op(cur(P), ".")) {
            adv(P);
            if (cur(P)->t != CT_NAME) return expect(P, CT_NAME, "an attribute name");
            *ns_attr = cur(P)->s;
            *is_ns = 1;
            adv(P);
            return 0;
        }
        if (!is_op(cur(P), ",")) break;
        adv(P);
        if (paren && is_op(cur(P), ")")) break;
    }
    if (paren) return expect_op(P, ")");
    return 0;
}

static chat_node *parse_stmt(parser *P)
{
    chat_token *k = cur(P);
    int line = k->line;
    char b[64];
    if (k->t != CT_NAME) {
        perr(P, line, "syntax error: expected a tag name, got %s", tok_desc(k, b, sizeof b));
        return NULL;
    }
    adv(P);
    if (is_name(k, "if") || is_name(k, "elif")) {
        chat_node *n = node(P, CN_IF, line);
        if (!n || !(n->a = parse_tuple(P, 0, 0)) || expect(P, CT_BLK_END, "'%}'")) return NULL;
        nvec body = {0}, other = {0};
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        int which;
        if (parse_body(P, &body, ends, &which)) return NULL;
        n->list = body.v;
        n->n = body.n;
        if (which == 0) { /* elif: an if in the else branch */
            chat_node *e = parse_stmt(P);
            if (!e || nvec_push(P, &other, e)) return NULL;
            n->list2 = other.v;
            n->n2 = other.n;
            return n; /* the nested if consumed endif */
        }
        adv(P); /* else / endif */
        if (which == 1) {
            static const char *const ends2[] = {"endif", NULL};
            if (expect(P, CT_BLK_END, "'%}'") || parse_body(P, &other, ends2, &which)) return NULL;
            adv(P);
            n->list2 = other.v;
            n->n2 = other.n;
        }
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        return n;
    }
    if (is_name(k, "for")) {
        chat_node *n = node(P, CN_FOR, line);
        svec names = {0};
        chat_str dummy;
        int is_ns = 0;
        if (!n || parse_targets(P, &names, 0, &dummy, &is_ns)) return NULL;
        if (!is_name(cur(P), "in")) {
            perr(P, cur(P)->line, "syntax error: expected 'in' in for loop");
            return NULL;
        }
        adv(P);
        if (!(n->a = parse_tuple(P, 0, 0))) return NULL;
        if (is_name(cur(P), "if")) {
            adv(P);
            if (!(n->b = parse_expr(P, 1))) return NULL;
        }
        if (is_name(cur(P), "recursive")) {
            perr(P, cur(P)->line, "unsupported construct: recursive for loop");
            return NULL;
        }
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        n->names = names.v;
        n->nnames = names.n;
        nvec body = {0}, other = {0};
        static const char *const ends[] = {"else", "endfor", NULL};
        int which;
        if (parse_body(P, &body, ends, &which)) return NULL;
        adv(P);
        if (which == 0) {
            static const char *const ends2[] = {"endfor", NULL};
            if (expect(P, CT_BLK_END, "'%}'") || parse_body(P, &other, ends2, &which)) return NULL;
            adv(P);
        }
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        n->list = body.v;
        n->n = body.n;
        n->list2 = other.v;
        n->n2 = other.n;
        return n;
    }
    if (is_name(k, "set")) {
        chat_node *n = node(P, CN_SET, line);
        svec names = {0};
        int is_ns = 0;
        if (!n || parse_targets(P, &names, 1, &n->attr, &is_ns)) return NULL;
        n->negate = (uint8_t)is_ns;
        n->names = names.v;
        n->nnames = names.n;
        if (is_op(cur(P), "=")) {
            adv(P);
            if (!(n->a = parse_tuple(P, 1, 0)) || expect(P, CT_BLK_END, "'%}'")) return NULL;
            return n;
        }
        if (is_op(cur(P), "|")) {
            perr(P, cur(P)->line, "unsupported construct: filtered block set");
            return NULL;
        }
        if (is_ns || names.n != 1) {
            perr(P, line, "syntax error: a block set takes one variable name");
            return NULL;
        }
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        nvec body = {0};
        static const char *const ends[] = {"endset", NULL};
        int which;
        if (parse_body(P, &body, ends, &which)) return NULL;
        adv(P);
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        n->list = body.v;
        n->n = body.n;
        return n;
    }
    if (is_name(k, "macro")) {
        chat_node *n = node(P, CN_MACRO, line);
        if (!n) return NULL;
        if (cur(P)->t != CT_NAME) {
            expect(P, CT_NAME, "a macro name");
            return NULL;
        }
        n->name = cur(P)->s;
        adv(P);
        if (expect_op(P, "(")) return NULL;
        svec params = {0};
        nvec defs = {0};
        while (!is_op(cur(P), ")")) {
            if (params.n && expect_op(P, ",")) return NULL;
            if (is_op(cur(P), ")")) break;
            if (cur(P)->t != CT_NAME) {
                expect(P, CT_NAME, "a parameter name");
                return NULL;
            }
            if (svec_push(P, &params, cur(P)->s)) return NULL;
            adv(P);
            chat_node *d = NULL;
            if (is_op(cur(P), "=")) {
                adv(P);
                if (!(d = parse_expr(P, 1))) return NULL;
            } else if (defs.n && defs.v[defs.n - 1]) {
                perr(P, cur(P)->line,
                     "syntax error: non-default argument follows default argument");
                return NULL;
            }
            if (nvec_push(P, &defs, d)) return NULL;
        }
        adv(P);
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        nvec body = {0};
        static const char *const ends[] = {"endmacro", NULL};
        int which;
        if (parse_body(P, &body, ends, &which)) return NULL;
        adv(P);
        if (cur(P)->t == CT_NAME) adv(P); /* {% endmacro name %} */
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        n->names = params.v;
        n->nnames = params.n;
        n->list2 = defs.v;
        n->n2 = defs.n;
        n->list = body.v;
        n->n = body.n;
        return n;
    }
    if (is_name(k, "break") || is_name(k, "continue")) {
        chat_node *n = node(P, is_name(k, "break") ? CN_BREAK : CN_CONTINUE, line);
        if (!n || expect(P, CT_BLK_END, "'%}'")) return NULL;
        return n;
    }
    if (is_name(k, "generation")) {
        chat_node *n = node(P, CN_GENERATION, line);
        if (!n || expect(P, CT_BLK_END, "'%}'")) return NULL;
        nvec body = {0};
        static const char *const ends[] = {"endgeneration", NULL};
        int which;
        if (parse_body(P, &body, ends, &which)) return NULL;
        adv(P);
        if (expect(P, CT_BLK_END, "'%}'")) return NULL;
        n->list = body.v;
        n->n = body.n;
        return n;
    }
    static const char *const unsupported[] = {
        "include",    "extends", "block", "import",    "from",     "with",  "call", "filter",
        "autoescape", "do",      "trans", "pluralize", "endtrans", "debug", NULL};
    for (int j = 0; unsupported[j]; j++)
        if (is_name(k, unsupported[j])) {
            perr(P, line, "unsupported tag: %s", unsupported[j]);
            return NULL;
        }
    perr(P, line, "syntax error: unexpected tag '%.*s'", (int)(k->s.n > 40 ? 40 : k->s.n), k->s.p);
    return NULL;
}

/* Statements until a {% NAME %} with NAME in ends (or the end of the template
 * when ends is NULL); leaves the name as the current token, *which its index. */
static int parse_body(parser *P, nvec *body, const char *const *ends, int *which)
{
    if (enter(P)) return -1;
    int start_line = cur(P)->line;
    for (;;) {
        chat_token *k = cur(P);
        if (k->t == CT_EOF) {
            if (!ends) break;
            return perr(P, k->line,
                        "syntax error: unexpected end of template, expected '%s' (for the block "
                        "opened at line %d)",
                        ends[0], start_line);
        }
        if (k->t == CT_TEXT) {
            chat_node *t = node(P, CN_TEXT, k->line);
            if (!t) return -1;
            t->val = cv_str(k->s.p, k->s.n);
            if (nvec_push(P, body, t)) return -1;
            adv(P);
        } else if (k->t == CT_VAR_BEG) {
            adv(P);
            chat_node *o = node(P, CN_OUTPUT, k->line);
            if (!o || !(o->a = parse_tuple(P, 1, 0)) || expect(P, CT_VAR_END, "'}}'") ||
                nvec_push(P, body, o))
                return -1;
        } else if (k->t == CT_BLK_BEG) {
            adv(P);
            chat_token *nm = cur(P);
            if (ends)
                for (int j = 0; ends[j]; j++)
                    if (is_name(nm, ends[j])) {
                        *which = j;
                        P->depth--;
                        return 0;
                    }
            static const char *const stray[] = {"endif",   "endfor",    "endset",        "endmacro",
                                                "elif",    "else",      "endgeneration", "endraw",
                                                "endcall", "endfilter", "endblock",      NULL};
            for (int j = 0; stray[j]; j++)
                if (is_name(nm, stray[j]))
                    return perr(P, nm->line, "syntax error: unexpected '%s'", stray[j]);
            chat_node *s = parse_stmt(P);
            if (!s || nvec_push(P, body, s)) return -1;
        } else {
            char b[64];
            return perr(P, k->line, "syntax error: unexpected %s", tok_desc(k, b, sizeof b));
        }
    }
    P->depth--;
    return 0;
}

int chat_parse(chat_arena *a, const char *name, const char *src, size_t len, chat_node **root,
               mc_error *err)
{
    if (!chat_utf8_valid(src, len)) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: the template is not valid UTF-8", name);
        return -1;
    }
    parser P = {.a = a, .name = name, .err = err};
    if (chat_lex(a, name, src, len, &P.t, &P.n, err)) return -1;
    chat_node *r = node(&P, CN_GENERATION, 1);
    if (!r) return -1;
    nvec body = {0};
    int which;
    if (parse_body(&P, &body, NULL, &which)) return -1;
    r->list = body.v;
    r->n = body.n;
    *root = r;
    return 0;
}
