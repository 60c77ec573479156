/*
 * tasks.c - lm-evaluation-harness's zero-shot tasks from local JSONL files
 * (lambada_openai, hellaswag, arc_easy, arc_challenge, piqa, and mc's generic
 * multiple_choice): each document becomes (context, continuation) requests,
 * scored as the harness's Hugging Face model scores them (eval.h), and the
 * metrics are aggregated as the harness does. The schemas, the prompts and
 * the metrics are in mc-eval(1), OPTIONS, "Tasks".
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "mc/eval.h"
#include "mc/file.h"
#include "mc/json.h"

#define TRY(call)               \
    do {                        \
        mc_status st_ = (call); \
        if (st_) return st_;    \
    } while (0)

static const char *const NAMES[] = {
    "lambada_openai", "hellaswag", "arc_easy", "arc_challenge", "piqa", "multiple_choice", NULL};
static const mc_task_kind KINDS[] = {MC_TASK_LAMBADA, MC_TASK_HELLASWAG, MC_TASK_ARC,
                                     MC_TASK_ARC,     MC_TASK_PIQA,      MC_TASK_MC};

const char *const *mc_task_names(void) { return NAMES; }

mc_status mc_task_kind_parse(const char *name, mc_task_kind *out, mc_error *err)
{
    for (int i = 0; NAMES[i]; i++)
        if (!strcmp(name, NAMES[i])) {
            *out = KINDS[i];
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_USAGE,
                        "unknown task '%s' (tasks: lambada_openai, hellaswag, arc_easy, "
                        "arc_challenge, piqa, multiple_choice)",
                        name);
}

/* ------------------------------------------------------------ Python's str */

/* str.isspace(): Unicode White_Space plus the separators 0x1c-0x1f. */
static int py_space(utf8proc_int32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Code point at s[i] (len bytes in all), its byte length in *n. */
static utf8proc_int32_t cp_at(const char *s, size_t len, size_t i, size_t *n)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(len - i), &c);
    if (k < 1) {
        *n = 1;
        return (unsigned char)s[i];
    }
    *n = (size_t)k;
    return c;
}

/* Bytes of trailing whitespace of s[0..len). */
static size_t trailing_space(const char *s, size_t len)
{
    size_t end = len;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80) b--;
        size_t n;
        if (!py_space(cp_at(s, len, b, &n))) break;
        end = b;
    }
    return len - end;
}

static char *dup_range(const char *s, size_t n)
{
    char *r = malloc(n + 1);
    if (!r) return NULL;
    memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

char *mc_task_py_strip(const char *s)
{
    size_t len = strlen(s), b = 0, n;
    while (b < len && py_space(cp_at(s, len, b, &n))) b += n;
    size_t t = trailing_space(s + b, len - b);
    return dup_range(s + b, len - b - t);
}

static size_t put_cp(char *out, utf8proc_int32_t c)
{
    return (size_t)utf8proc_encode_char(c, (utf8proc_uint8_t *)out);
}

char *mc_task_py_capitalize(const char *s)
{
    size_t len = strlen(s), o = 0, n;
    char *r = malloc(len * 2 + 8); /* a case mapping grows a code point by at most 1 byte */
    if (!r) return NULL;
    for (size_t i = 0; i < len; i += n) {
        utf8proc_int32_t c = cp_at(s, len, i, &n);
        o += put_cp(r + o, i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c));
    }
    r[o] = '\0';
    return r;
}

/* Python's s.replace(a, b): left to right, non-overlapping. */
static char *py_replace(const char *s, const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), n = 0;
    for (const char *p = strstr(s, a); p; p = strstr(p + la, a)) n++;
    char *r = malloc(strlen(s) + n * (lb > la ? lb - la : 0) + 1), *o = r;
    if (!r) return NULL;
    for (const char *p = s, *q; (q = strstr(p, a)); p = q + la) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, b, lb);
        o += lb;
        s = q + la;
    }
    strcpy(o, s);
    return r;
}

/* re.sub("\\[.*?\\]", "", s): from each '[', the nearest ']' with no line
 * break in between ('.' stops at "\n") is cut with everything between. */
static char *drop_brackets(const char *s)
{
    char *r = malloc(strlen(s) + 1), *o = r;
    if (!r) return NULL;
    for (const char *p = s; *p;) {
        if (*p == '[') {
            const char *q = p + 1;
            while (*q && *q != ']' && *q != '\n') q++;
            if (*q == ']') {
                p = q + 1;
                continue;
            }
        }
        *o++ = *p++;
    }
    *o = '\0';
    return r;
}

char *mc_task_hellaswag_preprocess(const char *text)
{
    char *a = mc_task_py_strip(text);
    char *b = a ? py_replace(a, " [title]", ". ") : NULL;
    char *c = b ? drop_brackets(b) : NULL;
    char *d = c ? py_replace(c, "  ", " ") : NULL;
    free(a);
    free(b);
    free(c);
    return d;
}

static size_t py_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* ------------------------------------------------------------ documents */

typedef struct doc {
    char *context;
    char **choices; /* the choice texts (continuation = " " + choice) */
    int nchoices;
    int gold;
} doc;

static void doc_free(doc *d)
{
    free(d->context);
    for (int i = 0; i < d->nchoices; i++) free(d->choices[i]);
    free(d->choices);
    memset(d, 0, sizeof *d);
}

static char *cat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *r = malloc(la + lb + lc + 1);
    if (!r) return NULL;
    memcpy(r, a, la);
    memcpy(r + la, b, lb);
    memcpy(r + la + lb, c, lc + 1);
    return r;
}

/* Field helpers: errors say "PATH:LINE: ..." (where). */
static mc_status get_str(const json_t *o, const char *key, const char *where, const char **out,
                         mc_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v) return mc_error_set(err, MC_ERR_FORMAT, "%s: missing field \"%s\"", where, key);
    if (!json_is_string(v))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: field \"%s\" must be a string", where, key);
    *out = json_string_value(v);
    return MC_OK;
}

/* An index: an integer, or a string of digits (hellaswag's "label"). */
static mc_status get_index(const json_t *o, const char *key, const char *where, int n, int *out,
                           mc_error *err)
{
    const json_t *v = json_object_get(o, key);
    long long x = -1;
    char *end = NULL;
    if (!v) return mc_error_set(err, MC_ERR_FORMAT, "%s: missing field \"%s\"", where, key);
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_string(v) && *json_string_value(v)) {
        x = strtoll(json_string_value(v), &end, 10);
        if (*end) x = -1;
    } else
        return mc_error_set(err, MC_ERR_FORMAT, "%s: field \"%s\" must be an integer", where, key);
    if (x < 0 || x >= n)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: field \"%s\" is not a choice index in [0, %d)",
                            where, key, n);
    *out = (int)x;
    return MC_OK;
}

static mc_status str_array(const json_t *a, const char *key, const char *where, doc *d,
                           int preprocess, mc_error *err)
{
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > 1000)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: field \"%s\" must be an array of 1 to 1000 strings", where, key);
    size_t n = json_array_size(a);
    d->choices = calloc(n, sizeof *d->choices);
    if (!d->choices) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(a, i);
        if (!json_is_string(s))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: \"%s\"[%zu] must be a string", where, key,
                                i);
        d->choices[i] = preprocess ? mc_task_hellaswag_preprocess(json_string_value(s))
                                   : strdup(json_string_value(s));
        if (!d->choices[i]) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        d->nchoices = (int)i + 1;
    }
    return MC_OK;
}

static mc_status parse_doc(mc_task_kind kind, const json_t *o, const char *where, doc *d,
                           mc_error *err)
{
    const char *a, *b, *c;
    if (!json_is_object(o))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: expected a JSON object", where);
    switch (kind) {
    case MC_TASK_LAMBADA: {
        TRY(get_str(o, "text", where, &a, err));
        const char *sp = strrchr(a, ' ');
        size_t cl = sp ? (size_t)(sp - a) : 0;
        d->context = dup_range(a, cl);
        d->choices = calloc(1, sizeof *d->choices);
        if (!d->context || !d->choices) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        d->choices[0] = strdup(sp ? sp + 1 : a);
        if (!d->choices[0]) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        d->nchoices = 1;
        d->gold = 0;
        return MC_OK;
    }
    case MC_TASK_HELLASWAG: {
        const char *lab;
        TRY(get_str(o, "activity_label", where, &lab, err));
        TRY(get_str(o, "ctx_a", where, &a, err));
        TRY(get_str(o, "ctx_b", where, &b, err));
        TRY(str_array(json_object_get(o, "endings"), "endings", where, d, 1, err));
        TRY(get_index(o, "label", where, d->nchoices, &d->gold, err));
        char *cap = mc_task_py_capitalize(b);
        char *ctx = cap ? cat3(a, " ", cap) : NULL;
        char *q = ctx ? cat3(lab, ": ", ctx) : NULL;
        d->context = q ? mc_task_hellaswag_preprocess(q) : NULL;
        free(cap);
        free(ctx);
        free(q);
        if (!d->context) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        return MC_OK;
    }
    case MC_TASK_ARC: {
        TRY(get_str(o, "question", where, &a, err));
        const json_t *ch = json_object_get(o, "choices");
        if (!json_is_object(ch))
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: field \"choices\" must be an object {\"text\": [...], "
                                "\"label\": [...]}",
                                where);
        TRY(str_array(json_object_get(ch, "text"), "choices.text", where, d, 0, err));
        TRY(get_str(o, "answerKey", where, &b, err));
        const json_t *labels = json_object_get(ch, "label");
        if (!json_is_array(labels) || (int)json_array_size(labels) != d->nchoices)
            return mc_error_set(
                err, MC_ERR_FORMAT,
                "%s: \"choices.label\" must be an array as long as \"choices.text\"", where);
        d->gold = -1;
        for (int i = 0; i < d->nchoices; i++) {
            const json_t *l = json_array_get(labels, (size_t)i);
            if (json_is_string(l) && !strcmp(json_string_value(l), b)) {
                d->gold = i;
                break;
            }
        }
        if (d->gold < 0)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: answerKey \"%s\" is not one of \"choices.label\"", where, b);
        d->context = cat3("Question: ", a, "\nAnswer:");
        return d->context ? MC_OK : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    case MC_TASK_PIQA: {
        TRY(get_str(o, "goal", where, &a, err));
        TRY(get_str(o, "sol1", where, &b, err));
        TRY(get_str(o, "sol2", where, &c, err));
        d->choices = calloc(2, sizeof *d->choices);
        if (!d->choices) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        d->choices[0] = strdup(b);
        d->choices[1] = strdup(c);
        d->nchoices = 2;
        TRY(get_index(o, "label", where, 2, &d->gold, err));
        d->context = cat3("Question: ", a, "\nAnswer:");
        if (!d->context || !d->choices[0] || !d->choices[1])
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        return MC_OK;
    }
    case MC_TASK_MC: {
        if (json_object_get(o, "context")) {
            TRY(get_str(o, "context", where, &a, err));
            d->context = strdup(a);
        } else if (json_object_get(o, "question")) {
            TRY(get_str(o, "question", where, &a, err));
            d->context = cat3("Question: ", a, "\nAnswer:");
        } else {
            return mc_error_set(err, MC_ERR_FORMAT, "%s: missing field \"context\" or \"question\"",
                                where);
        }
        if (!d->context) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        TRY(str_array(json_object_get(o, "choices"), "choices", where, d, 0, err));
        TRY(get_index(o, "answer", where, d->nchoices, &d->gold, err));
        return MC_OK;
    }
    }
    return mc_error_set(err, MC_ERR_INTERNAL, "task kind %d", (int)kind);
}

/* ------------------------------------------------------------ scoring */

typedef struct scorer {
    mc_infer *inf;
    mc_encoder *enc;
    int ctx;
    int32_t eod;
    mc_ids cached; /* ids in the context's cache */
    mc_ids cenc, whole, full;
    int32_t *tgt;
    float *lp;
    int *gr;
    int64_t requests;
} scorer;

static mc_status encode(scorer *sc, const char *s, size_t n, mc_ids *out, mc_error *err)
{
    out->n = 0;
    return mc_encode(sc->enc, s, n, out, err);
}

/* The harness's loglikelihood of continuation `cont` after `context`.
 * Requests run one after another through one inference context; the cached
 * ids of the previous request are kept up to the first position this one
 * scores, so the choices of a document share their context's forward pass. */
static mc_status score(scorer *sc, const char *context, const char *cont, const char *where,
                       double *ll, int *greedy, mc_error *err)
{
    size_t ncont;
    sc->full.n = 0;
    if (!*context) {
        if (sc->eod < 0)
            return mc_error_set(err, MC_ERR_USAGE,
                                "%s: an empty context is the end-of-document token, and the "
                                "tokenizer has none",
                                where);
        TRY(mc_ids_push(&sc->full, sc->eod, err));
        TRY(encode(sc, cont, strlen(cont), &sc->whole, err));
        for (size_t i = 0; i < sc->whole.n; i++) TRY(mc_ids_push(&sc->full, sc->whole.v[i], err));
        ncont = sc->whole.n;
    } else {
        /* trailing whitespace of the context moves to the continuation */
        size_t lc = strlen(context), sp = trailing_space(context, lc);
        if (sp == lc)
            return mc_error_set(err, MC_ERR_FORMAT, "%s: the context is only whitespace", where);
        size_t lw = lc + strlen(cont);
        char *w = malloc(lw + 1);
        if (!w) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        memcpy(w, context, lc);
        strcpy(w + lc, cont);
        mc_status st = encode(sc, w, lw, &sc->whole, err);
        if (!st) st = encode(sc, context, lc - sp, &sc->cenc, err);
        free(w);
        TRY(st);
        if (sc->whole.n <= sc->cenc.n)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: the continuation encodes to no token of its own", where);
        ncont = sc->whole.n - sc->cenc.n;
        for (size_t i = 0; i < sc->cenc.n; i++) TRY(mc_ids_push(&sc->full, sc->cenc.v[i], err));
        for (size_t i = sc->cenc.n; i < sc->whole.n; i++)
            TRY(mc_ids_push(&sc->full, sc->whole.v[i], err));
    }
    if (ncont == 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: the continuation encodes to no token", where);
    if (ncont > (size_t)sc->ctx)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "%s: the continuation has %zu tokens, more than --ctx-size %d", where,
                            ncont, sc->ctx);
    /* input: the last ctx + 1 ids minus the last one */
    size_t nf = sc->full.n, cut = nf > (size_t)sc->ctx + 1 ? nf - (size_t)sc->ctx - 1 : 0;
    const int32_t *full = sc->full.v + cut;
    size_t L = nf - cut - 1, s0 = L - (ncont - 1) - 1;
    /* keep what the cache holds of this input, up to the first scored row */
    size_t keep = 0;
    while (keep < s0 && keep < sc->cached.n && keep < (size_t)mc_infer_length(sc->inf) &&
           sc->cached.v[keep] == full[keep])
        keep++;
    mc_infer_truncate(sc->inf, (int)keep);
    for (size_t i = keep; i < L; i++) sc->tgt[i - keep] = i >= s0 ? full[i + 1] : -1;
    TRY(mc_infer_extend(sc->inf, full + keep, (int)(L - keep), sc->tgt, sc->lp, sc->gr, err));
    sc->cached.n = 0;
    for (size_t i = 0; i < L; i++) TRY(mc_ids_push(&sc->cached, full[i], err));
    double s = 0;
    int g = 1;
    for (size_t i = s0; i < L; i++) {
        s += sc->lp[i - keep];
        g &= sc->gr[i - keep];
    }
    *ll = s;
    *greedy = g;
    sc->requests++;
    return MC_OK;
}

/* ------------------------------------------------------------ the task */

/* Running mean and sum of squares of a 0/1 metric. */
typedef struct acc_stat {
    double sum, sum2;
    int64_t n;
} acc_stat;

static void acc_add(acc_stat *a, double x)
{
    a->sum += x;
    a->sum2 += x * x;
    a->n++;
}

static double acc_mean(const acc_stat *a) { return a->n ? a->sum / (double)a->n : NAN; }

/* the harness's mean_stderr: sample standard deviation / sqrt(n) */
static double acc_stderr(const acc_stat *a)
{
    if (a->n < 2) return NAN;
    double n = (double)a->n, m = a->sum / n, var = (a->sum2 - n * m * m) / (n - 1);
    return sqrt(var > 0 ? var : 0) / sqrt(n);
}

mc_status mc_task_run(mc_infer *inf, const mc_tokenizer *tok, mc_task_kind kind, const char *path,
                      int64_t limit, int ctx, mc_task_result *res, mc_task_doc_fn cb, void *cb_ctx,
                      mc_error *err)
{
    memset(res, 0, sizeof *res);
    res->acc = res->acc_stderr = res->acc_norm = res->acc_norm_stderr = NAN;
    res->perplexity = res->mean_ll = NAN;
    if (ctx < 2 || ctx > mc_infer_capacity(inf))
        return mc_error_set(err, MC_ERR_USAGE, "--ctx-size %d: must be in [2, %d]", ctx,
                            mc_infer_capacity(inf));
    char *text = NULL;
    size_t len = 0;
    TRY(mc_read_file(path, &text, &len, err));
    scorer sc = {.inf = inf, .ctx = ctx, .eod = mc_tokenizer_eod(tok)};
    mc_status st = mc_encoder_new(tok, &sc.enc, err);
    sc.tgt = malloc((size_t)ctx * sizeof *sc.tgt);
    sc.lp = malloc((size_t)ctx * sizeof *sc.lp);
    sc.gr = malloc((size_t)ctx * sizeof *sc.gr);
    if (!st && (!sc.tgt || !sc.lp || !sc.gr)) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");

    /* documents first (so a bad line fails before any work), then scores */
    doc *docs = NULL;
    int64_t ndocs = 0, cap = 0, lineno = 0;
    char where[4200];
    for (size_t p = 0; p < len && !st && (limit <= 0 || ndocs < limit);) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len, b = p;
        p = e + 1;
        lineno++;
        size_t q = b;
        while (q < e && (text[q] == ' ' || text[q] == '\t' || text[q] == '\r')) q++;
        if (q == e) continue; /* blank line */
        snprintf(where, sizeof where, "%s:%" PRId64, path, lineno);
        json_t *o = NULL;
        if ((st = mc_json_load_buf(where, text + b, e - b, &o, err))) break;
        if (ndocs == cap) {
            cap = cap ? 2 * cap : 64;
            doc *nd = realloc(docs, (size_t)cap * sizeof *docs);
            if (!nd) {
                json_decref(o);
                st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                break;
            }
            docs = nd;
        }
        memset(&docs[ndocs], 0, sizeof *docs);
        st = parse_doc(kind, o, where, &docs[ndocs], err);
        json_decref(o);
        ndocs++;
    }
    if (!st && ndocs == 0) st = mc_error_set(err, MC_ERR_FORMAT, "%s: no documents", path);

    acc_stat acc = {0}, accn = {0};
    double llsum = 0;
    double *lls = NULL;
    int *grs = NULL;
    int maxc = 1;
    for (int64_t i = 0; i < ndocs && !st; i++)
        if (docs[i].nchoices > maxc) maxc = docs[i].nchoices;
    if (!st && (!(lls = malloc((size_t)maxc * sizeof *lls)) ||
                !(grs = malloc((size_t)maxc * sizeof *grs))))
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_infer_truncate(inf, 0);
    for (int64_t i = 0; i < ndocs && !st; i++) {
        doc *d = &docs[i];
        int best = 0, bestn = 0;
        for (int c = 0; c < d->nchoices && !st; c++) {
            char *cont = cat3(" ", d->choices[c], "");
            if (!cont) {
                st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                break;
            }
            snprintf(where, sizeof where, "%s: document %" PRId64 ", choice %d", path, i + 1, c);
            st = score(&sc, d->context, cont, where, &lls[c], &grs[c], err);
            free(cont);
        }
        if (st) break;
        llsum += lls[d->gold];
        if (kind == MC_TASK_LAMBADA) {
            acc_add(&acc, grs[0]);
        } else {
            double nb = lls[0] / (double)py_len(d->choices[0]);
            for (int c = 1; c < d->nchoices; c++) {
                double v = lls[c] / (double)py_len(d->choices[c]);
                if (lls[c] > lls[best]) best = c;
                if (v > nb) nb = v, bestn = c;
            }
            acc_add(&acc, best == d->gold);
            acc_add(&accn, bestn == d->gold);
        }
        if (cb) cb(cb_ctx, i, ndocs, d->nchoices, lls, grs, d->gold, best, bestn);
    }
    if (!st) {
        res->docs = ndocs;
        res->requests = sc.requests;
        res->acc = acc_mean(&acc);
        res->acc_stderr = acc_stderr(&acc);
        res->mean_ll = llsum / (double)ndocs;
        if (kind == MC_TASK_LAMBADA) {
            res->perplexity = exp(-res->mean_ll);
        } else {
            res->acc_norm = acc_mean(&accn);
            res->acc_norm_stderr = acc_stderr(&accn);
        }
    }
    for (int64_t i = 0; i < ndocs; i++) doc_free(&docs[i]);
    free(docs);
    free(lls);
    free(grs);
    free(text);
    free(sc.tgt);
    free(sc.lp);
    free(sc.gr);
    mc_ids_free(&sc.cached);
    mc_ids_free(&sc.cenc);
    mc_ids_free(&sc.whole);
    mc_ids_free(&sc.full);
    mc_encoder_free(sc.enc);
    return st;
}
