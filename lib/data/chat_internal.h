/*
 * chat_internal.h - the pieces of the chat template engine (mc/chat.h):
 * arenas, values, the lexer's tokens, the syntax tree, and the calls
 * between chat_value.c, chat_lex.c, chat_parse.c, chat_ops.c, chat_filter.c
 * and chat_eval.c (each calls only files before it in that list, and the
 * parser asks chat_ops.c and chat_filter.c which tests and filters exist).
 */
#ifndef MC_CHAT_INTERNAL_H
#define MC_CHAT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "mc/buf.h"
#include "mc/chat.h"
#include "mc/status.h"

/* ---- arenas: everything a template or a render allocates, freed at once */
typedef struct chat_arena {
    struct chat_chunk *head;
    size_t used; /* bytes handed out, against the limit */
    size_t limit;
} chat_arena;

void *chat_alloc(chat_arena *a, size_t n); /* zeroed; NULL past the limit or out of memory */
char *chat_strndup(chat_arena *a, const char *s, size_t n);
void chat_arena_free(chat_arena *a);

/* ---- values */
typedef enum chat_type {
    CV_UNDEF, /* jinja2's Undefined; s holds the name it stands for, if known */
    CV_NONE,
    CV_BOOL,
    CV_INT,
    CV_FLOAT,
    CV_STR,
    CV_LIST, /* also tuples (tuple = 1) */
    CV_DICT,
    CV_NS,     /* namespace(): a dict whose attributes `set` may change */
    CV_MACRO,  /* a template macro */
    CV_FUNC,   /* a global function (range, namespace, ...) */
    CV_METHOD, /* a bound method of a string, list or dict */
    CV_LOOP    /* the `loop` of a for loop */
} chat_type;

typedef struct chat_str {
    const char *p;
    size_t n;
} chat_str;

struct chat_list;
struct chat_dict;
struct chat_node;
struct chat_method;
struct chat_loop;

typedef struct chat_val {
    uint8_t t;
    uint8_t tuple;
    union {
        int b;
        int64_t i;
        double f;
        chat_str s;
        struct chat_list *l;
        struct chat_dict *d;
        const struct chat_node *macro;
        int func;
        struct chat_method *m;
        struct chat_loop *loop;
    };
} chat_val;

typedef struct chat_list {
    chat_val *v;
    size_t n, cap;
} chat_list;

typedef struct chat_dict {
    chat_val *k, *v;
    size_t n, cap;
} chat_dict;

typedef struct chat_method {
    chat_val self;
    chat_str name;
} chat_method;

typedef struct chat_loop {
    const chat_list *items;
    size_t index0;
    int depth;
} chat_loop;

enum chat_func { CF_RANGE, CF_NAMESPACE, CF_DICT, CF_RAISE, CF_STRFTIME, CF_N };

static inline chat_val cv_undef(const char *name)
{
    chat_val v = {.t = CV_UNDEF};
    v.s.p = name;
    v.s.n = name ? __builtin_strlen(name) : 0;
    return v;
}
static inline chat_val cv_none(void) { return (chat_val){.t = CV_NONE}; }
static inline chat_val cv_bool(int b) { return (chat_val){.t = CV_BOOL, .b = !!b}; }
static inline chat_val cv_int(int64_t i) { return (chat_val){.t = CV_INT, .i = i}; }
static inline chat_val cv_float(double f) { return (chat_val){.t = CV_FLOAT, .f = f}; }
static inline chat_val cv_str(const char *p, size_t n)
{
    chat_val v = {.t = CV_STR};
    v.s.p = p;
    v.s.n = n;
    return v;
}

/* Errors inside the engine: a message in a caller's mc_error, and -1. */
typedef struct chat_ctx_err {
    mc_error *err;
    const char *name; /* the template's name */
} chat_ctx_err;

/* chat_value.c: lists, dicts, conversions, Python's str()/repr(), json.dumps */
chat_list *chat_list_new(chat_arena *a, size_t cap);
int chat_list_push(chat_arena *a, chat_list *l, chat_val v);
chat_dict *chat_dict_new(chat_arena *a, size_t cap);
int chat_dict_set(chat_arena *a, chat_dict *d, chat_val k, chat_val v); /* insert or replace */
const chat_val *chat_dict_get(const chat_dict *d, const char *key, size_t n);
int chat_from_json(chat_arena *a, const json_t *j, chat_val *out);
int chat_truthy(chat_val v);
int chat_equal(chat_val a, chat_val b);
const char *chat_type_name(chat_val v); /* Python's name for the type: 'str', 'list', ... */
/* str(v) as Python prints it (undefined: ""); appended to b. -1: out of memory. */
int chat_str_of(mc_buf *b, chat_val v);
int chat_repr(mc_buf *b, chat_val v);
/* transformers' tojson: json.dumps(v, ensure_ascii, indent, separators, sort_keys).
 * indent < 0: None. item_sep/key_sep NULL: Python's defaults. Returns 0, -1
 * out of memory, or -2 with *bad set to a value JSON cannot hold. */
int chat_json_dumps(mc_buf *b, chat_val v, int ensure_ascii, int indent, const char *item_sep,
                    const char *key_sep, int sort_keys, int depth, chat_val *bad);
/* UTF-8 and Python's str methods on code points */
size_t chat_utf8_len(const char *p, size_t n);                     /* code points */
size_t chat_utf8_offset(const char *p, size_t n, size_t cp_index); /* byte offset */
uint32_t chat_utf8_next(const char *p, size_t n, size_t *i);       /* decode at *i, advance */
int chat_py_isspace(uint32_t cp);
int chat_utf8_valid(const char *p, size_t n);

/* ---- the lexer's tokens */
typedef enum chat_tok {
    CT_TEXT,    /* template data */
    CT_VAR_BEG, /* {{ */
    CT_VAR_END, /* }} */
    CT_BLK_BEG, /* {% */
    CT_BLK_END, /* %} */
    CT_NAME,
    CT_STRING, /* decoded */
    CT_INT,
    CT_FLOAT,
    CT_OP, /* s: the operator's text */
    CT_EOF
} chat_tok;

typedef struct chat_token {
    chat_tok t;
    int line;
    chat_str s;
    int64_t i;
    double f;
} chat_token;

/* Tokenize src (newlines normalized, whitespace control applied as jinja2's
 * lexer does). On error: err "NAME:LINE: ...", -1. */
int chat_lex(chat_arena *a, const char *name, const char *src, size_t len, chat_token **toks,
             size_t *ntoks, mc_error *err);

/* ---- the syntax tree */
typedef enum chat_kind {
    /* expressions */
    CN_CONST,
    CN_NAME,
    CN_ATTR,   /* a.name */
    CN_ITEM,   /* a[b] */
    CN_SLICE,  /* a[b:c:d], absent parts NULL */
    CN_CALL,   /* a(args, kw=...) */
    CN_FILTER, /* a | name(args, kw=...); a NULL inside {% filter %} */
    CN_TEST,   /* a is [not] name(args) */
    CN_BINOP,  /* op: + - * / // % ** ~ */
    CN_NEG,
    CN_POS,
    CN_NOT,
    CN_AND,
    CN_OR,
    CN_COMPARE, /* a (op b)...: ops[] and list[] */
    CN_COND,    /* b if a else c */
    CN_LIST,
    CN_TUPLE,
    CN_DICT, /* list = keys, list2 = values */
    /* statements */
    CN_TEXT,
    CN_OUTPUT,
    CN_IF,    /* a cond, list body, list2 else-body (an elif is an IF inside) */
    CN_FOR,   /* names targets, a iter, b filter, list body, list2 else */
    CN_SET,   /* names targets (or name ns + attr), a value or list body */
    CN_MACRO, /* name, names params, list2 defaults, list body */
    CN_BREAK,
    CN_CONTINUE,
    CN_GENERATION /* list body */
} chat_kind;

enum chat_op {
    CO_ADD,
    CO_SUB,
    CO_MUL,
    CO_DIV,
    CO_FLOORDIV,
    CO_MOD,
    CO_POW,
    CO_CONCAT,
    CO_EQ,
    CO_NE,
    CO_LT,
    CO_LE,
    CO_GT,
    CO_GE,
    CO_IN,
    CO_NOTIN
};

typedef struct chat_node {
    uint8_t kind;
    uint8_t negate; /* CN_TEST: is not; CN_SET: the target is ns.attr */
    uint8_t op;
    int line;
    chat_val val;                /* CN_CONST */
    chat_str name;               /* names, attributes, filters, tests, macros */
    chat_str attr;               /* CN_SET on a namespace */
    struct chat_node *a, *b, *c; /* operands */
    struct chat_node **list;     /* args, items, bodies */
    size_t n;
    struct chat_node **list2; /* keyword values, dict values, else bodies, defaults */
    size_t n2;
    chat_str *names; /* keyword names, targets, parameters */
    size_t nnames;
    uint8_t *ops; /* CN_COMPARE */
} chat_node;

struct mc_chat_template {
    chat_arena arena;
    char *name;
    chat_node *body; /* a CN_GENERATION-like list node holding the top statements */
};

/* chat_parse.c */
int chat_parse(chat_arena *a, const char *name, const char *src, size_t len, chat_node **root,
               mc_error *err);

/* chat_ops.c (lookup, operators, tests, methods) and chat_filter.c (filters),
 * over evaluated values. */
typedef struct chat_call {
    const chat_val *args;
    size_t nargs;
    const chat_str *kwnames;
    const chat_val *kwargs;
    size_t nkw;
} chat_call;

typedef struct chat_rt {
    chat_arena *a;
    mc_error *err;
    const char *name;
    int line;
} chat_rt;

int chat_rt_fail(chat_rt *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int chat_getattr(chat_rt *rt, chat_val obj, chat_str attr, chat_val *out);
int chat_getitem(chat_rt *rt, chat_val obj, chat_val key, chat_val *out);
int chat_filter(chat_rt *rt, chat_str name, chat_val v, const chat_call *c, chat_val *out);
int chat_test(chat_rt *rt, chat_str name, chat_val v, const chat_call *c, int *out);
int chat_call_method(chat_rt *rt, const chat_method *m, const chat_call *c, chat_val *out);
int chat_filter_known(chat_str name);
int chat_test_known(chat_str name);
chat_val chat_make_str(chat_rt *rt, const char *p, size_t n); /* copy into the arena */
int chat_binop(chat_rt *rt, int op, chat_val x, chat_val y, chat_val *out);

/* chat_ops.c: helpers the filters share */
typedef uint32_t (*chat_cp_map)(uint32_t);
int chat_oom(chat_rt *rt);
int chat_undefined_error(chat_rt *rt, chat_val v);
int chat_seq_eq(chat_str s, const char *w);
int chat_in_list(const char *const *l, chat_str s);
int chat_to_str(chat_rt *rt, chat_val v, chat_str *out); /* str(v), in the arena */
int chat_is_num(chat_val v);
double chat_num_f(chat_val v);
int64_t chat_num_i(chat_val v);
int chat_compare_order(chat_rt *rt, const char *op, chat_val x, chat_val y, int *c);
chat_str chat_py_strip(chat_str s, const chat_str *chars, int which); /* 1 left, 2 right, 3 both */
uint32_t chat_map_lower(uint32_t c);
uint32_t chat_map_upper(uint32_t c);
/* mode 0: each code point through f; 1: Python's title(); 2: capitalize() */
int chat_case_map(chat_rt *rt, chat_str s, chat_cp_map f, int mode, chat_val *out);
int chat_str_replace(chat_rt *rt, chat_str s, chat_str old, chat_str new_, int64_t count,
                     chat_val *out);
int chat_str_split(chat_rt *rt, chat_str s, const chat_str *sep, int64_t maxsplit, chat_val *out);
/* the argument at position pos or named name; NULL when absent */
const chat_val *chat_arg(const chat_call *c, size_t pos, const char *name);
int chat_check_args(chat_rt *rt, const chat_call *c, size_t maxpos, const char *const *names,
                    const char *what);
int chat_want_str(chat_rt *rt, const chat_val *v, const char *what, chat_str *out);

#endif
