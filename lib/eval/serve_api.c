/*
 * serve_api.c - the OpenAI-compatible front of the serving engine
 * (serve.h): routing, the request bodies of /v1/completions and
 * /v1/chat/completions checked field by field, the response and
 * server-sent event shapes, OpenAI's error body, /v1/models, /health and
 * the Prometheus text of /metrics. The shapes follow OpenAI's API
 * reference; mc-serve(1) lists what is supported.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/serve_internal.h"
#include "mc/json.h"

#define MAX_STOPS 4
#define MAX_TOP_LOGPROBS 20

void sv_token_text(mc_serve *s, int32_t id, mc_buf *out) { mc_decode(s->tok, &id, 1, out, NULL); }

/* ------------------------------------------------------------ replies */

static void reply_json(mc_serve_reply *r, int status, json_t *j)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    r->len = r->body ? strlen(r->body) : 0;
    json_decref(j);
}

/* OpenAI's error body: {"error": {"message", "type", "param", "code"}} */
static void reply_error(mc_serve_reply *r, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void reply_error(mc_serve_reply *r, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    reply_json(r, status, o);
}

#define BAD(param, ...) \
    reply_error(r, 400, "invalid_request_error", param, "invalid_value", __VA_ARGS__)

void mc_serve_reply_free(mc_serve_reply *r)
{
    free(r->body);
    r->body = NULL;
}

/* ------------------------------------------------------------ parameters */

/* Each returns 0 after answering 400 naming the field. */
static int get_int(mc_serve_reply *r, json_t *j, const char *key, long lo, long hi, long *out)
{
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_integer(v)) {
        BAD(key, "'%s' must be an integer", key);
        return 0;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        BAD(key, "'%s' must be in [%ld, %ld], got %lld", key, lo, hi, (long long)x);
        return 0;
    }
    *out = (long)x;
    return 1;
}

static int get_num(mc_serve_reply *r, json_t *j, const char *key, double lo, double hi, double *out)
{
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_number(v)) {
        BAD(key, "'%s' must be a number", key);
        return 0;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        BAD(key, "'%s' must be in [%g, %g], got %g", key, lo, hi, x);
        return 0;
    }
    *out = x;
    return 1;
}

static int get_bool(mc_serve_reply *r, json_t *j, const char *key, int *out)
{
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_boolean(v)) {
        BAD(key, "'%s' must be a boolean", key);
        return 0;
    }
    *out = json_is_true(v);
    return 1;
}

static int get_stops(mc_serve_reply *r, json_t *j, sv_req *q)
{
    json_t *v = json_object_get(j, "stop");
    if (!v || json_is_null(v)) return 1;
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v)) {
        BAD("stop", "'stop' must be a string or an array of strings");
        return 0;
    }
    if (n > MAX_STOPS) {
        BAD("stop", "'stop' takes at most %d strings, got %zu", MAX_STOPS, n);
        return 0;
    }
    q->stops = calloc(n ? n : 1, sizeof *q->stops);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(e)) {
            BAD("stop", "'stop' must be a string or an array of strings");
            return 0;
        }
        if (!json_string_length(e)) continue;
        q->stops[q->nstops] = strdup(json_string_value(e));
        size_t len = json_string_length(e);
        if (len > q->max_stop) q->max_stop = len;
        q->nstops++;
    }
    return 1;
}

/* The sampling and output fields both endpoints share. */
static int get_common(mc_serve *s, mc_serve_reply *r, json_t *j, sv_req *q, int chat)
{
    long max_tokens = 16, top_k = 0, seed = -1, n = 1;
    double temperature = 1.0, top_p = 1.0;
    int stream = 0;
    if (chat) max_tokens = s->info.ctx;
    if (!get_int(r, j, "max_tokens", 1, 1L << 24, &max_tokens)) return 0;
    if (chat && !get_int(r, j, "max_completion_tokens", 1, 1L << 24, &max_tokens)) return 0;
    if (!get_num(r, j, "temperature", 0, 100, &temperature)) return 0;
    if (!get_num(r, j, "top_p", 0, 1, &top_p)) return 0;
    if (top_p <= 0) {
        BAD("top_p", "'top_p' must be in (0, 1], got 0");
        return 0;
    }
    if (!get_int(r, j, "top_k", 0, 1L << 30, &top_k)) return 0;
    if (!get_int(r, j, "seed", 0, 0xffffffffL, &seed)) return 0;
    if (!get_int(r, j, "n", 1, 1, &n)) return 0;
    if (!get_bool(r, j, "stream", &stream)) return 0;
    json_t *so = json_object_get(j, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            BAD("stream_options", "'stream_options' must be an object");
            return 0;
        }
        if (!stream) {
            BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
            return 0;
        }
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu)) {
            BAD("stream_options", "'stream_options.include_usage' must be a boolean");
            return 0;
        }
        q->include_usage = json_is_true(iu);
    }
    if (!get_stops(r, j, q)) return 0;
    json_t *model = json_object_get(j, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        BAD("model", "'model' must be a string");
        return 0;
    }
    mc_gen_config_init(&q->gen);
    q->gen.max_new_tokens = (int)max_tokens;
    q->gen.temperature = temperature;
    q->gen.top_p = top_p;
    q->gen.top_k = (int)top_k;
    q->gen.eod = s->eod;
    q->gen.vocab_size = s->vocab;
    if (seed >= 0) {
        q->gen.seed = (uint64_t)seed;
        q->seeded = 1;
    }
    q->stream = stream;
    q->chat = chat;
    q->logprobs = -1;
    return 1;
}

/* prompt: a string, an array of one string, or an array of token ids */
static int get_prompt(mc_serve *s, mc_serve_reply *r, json_t *j, sv_req *q)
{
    json_t *p = json_object_get(j, "prompt");
    if (!p) {
        BAD("prompt", "missing required field 'prompt'");
        return 0;
    }
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        q->prompt_len = json_string_length(p);
        q->prompt_text = malloc(q->prompt_len + 1);
        memcpy(q->prompt_text, json_string_value(p), q->prompt_len + 1);
        mc_error err;
        pthread_mutex_lock(&s->text_mu);
        mc_status st = mc_encode(s->enc, q->prompt_text, q->prompt_len, &q->prompt, &err);
        pthread_mutex_unlock(&s->text_mu);
        if (st) {
            BAD("prompt", "'prompt': %s", err.msg);
            return 0;
        }
        return 1;
    }
    if (!json_is_array(p) || !json_array_size(p)) {
        BAD("prompt", "'prompt' must be a string or a non-empty array of token ids (one prompt "
                      "a request)");
        return 0;
    }
    mc_buf text = MC_BUF_INIT;
    for (size_t i = 0; i < json_array_size(p); i++) {
        json_t *e = json_array_get(p, i);
        json_int_t id = json_is_integer(e) ? json_integer_value(e) : -1;
        if (id < 0 || id >= s->vocab) {
            mc_buf_free(&text);
            BAD("prompt", "'prompt' must be a string or an array of token ids in [0, %lld)",
                (long long)s->vocab);
            return 0;
        }
        mc_ids_push(&q->prompt, (int32_t)id, NULL);
        sv_token_text(s, (int32_t)id, &text);
    }
    q->prompt_len = text.len;
    mc_buf_append(&text, "", 1, NULL);
    q->prompt_text = text.data;
    return 1;
}

/* messages rendered with the chat template */
static int get_messages(mc_serve *s, mc_serve_reply *r, json_t *j, sv_req *q)
{
    json_t *m = json_object_get(j, "messages");
    if (!m) {
        BAD("messages", "missing required field 'messages'");
        return 0;
    }
    if (!json_is_array(m) || !json_array_size(m)) {
        BAD("messages", "'messages' must be a non-empty array of messages");
        return 0;
    }
    for (size_t i = 0; i < json_array_size(m); i++) {
        json_t *e = json_array_get(m, i), *c = json_object_get(e, "content");
        if (!json_is_object(e) || !json_is_string(json_object_get(e, "role"))) {
            BAD("messages", "'messages[%zu]' must be an object with a string 'role'", i);
            return 0;
        }
        if (c && !json_is_null(c) && !json_is_string(c) && !json_is_array(c)) {
            BAD("messages", "'messages[%zu].content' must be a string or an array of parts", i);
            return 0;
        }
    }
    json_t *tools = json_object_get(j, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        BAD("tools", "'tools' must be an array");
        return 0;
    }
    if (!s->chat) {
        reply_error(
            r, 501, "invalid_request_error", "messages", "no_chat_template",
            "this server has no chat template: the checkpoint keeps no tokenizer_config.json "
            "with one; "
            "start mc-serve with --chat-template FILE (a .jinja file or a "
            "tokenizer_config.json)");
        return 0;
    }
    mc_chat_vars v = {m, json_is_array(tools) ? tools : NULL, 1, s->bos_text, s->eos_text, NULL};
    mc_error err;
    char *text = NULL;
    size_t len = 0;
    pthread_mutex_lock(&s->text_mu);
    mc_status st = mc_chat_template_render(s->chat, &v, &text, &len, &err);
    pthread_mutex_unlock(&s->text_mu);
    if (st) {
        BAD("messages", "the chat template failed on these messages: %s", err.msg);
        return 0;
    }
    q->prompt_text = text;
    q->prompt_len = len;
    pthread_mutex_lock(&s->text_mu);
    st = mc_encode(s->enc, text, len, &q->prompt, &err);
    pthread_mutex_unlock(&s->text_mu);
    if (st) {
        BAD("messages", "'messages': %s", err.msg);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ shapes */

/* the completion's text so far: the prompt (echo) and the generated text */
static json_t *logprobs_completion(mc_serve *s, const sv_req *q, int t0, int t1, size_t off0,
                                   int with_prompt)
{
    json_t *o = json_object(), *toks = json_array(), *lps = json_array(), *offs = json_array(),
           *tops = q->logprobs > 0 ? json_array() : json_null();
    mc_buf t = MC_BUF_INIT;
    size_t off = off0;
    for (int i = 0; with_prompt && i < (int)q->prompt.n; i++) {
        t.len = 0;
        sv_token_text(s, q->prompt.v[i], &t);
        json_array_append_new(toks, mc_json_text(t.data, t.len));
        json_array_append_new(lps, i && q->plps ? json_real(q->plps[i]) : json_null());
        json_array_append_new(offs, json_integer((json_int_t)off));
        if (json_is_array(tops)) json_array_append_new(tops, json_null());
        off += t.len;
    }
    for (int i = t0; i < t1; i++) {
        if (q->out.v[i] == s->eod) continue;
        t.len = 0;
        sv_token_text(s, q->out.v[i], &t);
        json_array_append_new(toks, mc_json_text(t.data, t.len));
        json_array_append_new(lps, json_real(q->lps[i]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        if (json_is_array(tops)) json_array_append(tops, json_array_get(q->tops, (size_t)i));
        off += t.len;
    }
    mc_buf_free(&t);
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

static json_t *bytes_of(const mc_buf *t)
{
    json_t *a = json_array();
    for (size_t i = 0; i < t->len; i++)
        json_array_append_new(a, json_integer((unsigned char)t->data[i]));
    return a;
}

static json_t *logprobs_chat(mc_serve *s, const sv_req *q, int t0, int t1)
{
    json_t *content = json_array();
    mc_buf t = MC_BUF_INIT;
    for (int i = t0; i < t1; i++) {
        if (q->out.v[i] == s->eod) continue;
        t.len = 0;
        sv_token_text(s, q->out.v[i], &t);
        json_t *e = json_object(), *alts = json_array();
        json_object_set_new(e, "token", mc_json_text(t.data, t.len));
        json_object_set_new(e, "logprob", json_real(q->lps[i]));
        json_object_set_new(e, "bytes", bytes_of(&t));
        json_t *top = q->logprobs > 0 ? json_array_get(q->tops, (size_t)i) : NULL;
        const char *k;
        json_t *v;
        json_object_foreach(top, k, v)
        {
            json_t *a = json_object();
            mc_buf kb = {(char *)k, strlen(k), 0};
            json_object_set_new(a, "token", json_string(k));
            json_object_set_new(a, "logprob", json_copy(v));
            json_object_set_new(a, "bytes", bytes_of(&kb));
            json_array_append_new(alts, a);
        }
        json_object_set_new(e, "top_logprobs", alts);
        json_array_append_new(content, e);
    }
    mc_buf_free(&t);
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    return o;
}

static json_t *head(mc_serve *s, const sv_req *q, const char *object)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(q->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(q->created));
    json_object_set_new(o, "model", json_string(s->model_name));
    return o;
}

static json_t *usage(const sv_req *q)
{
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)q->prompt.n));
    json_object_set_new(u, "completion_tokens", json_integer((json_int_t)q->out.n));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)(q->prompt.n + q->out.n)));
    return u;
}

/* the whole response of a finished request */
static json_t *response(mc_serve *s, const sv_req *q)
{
    json_t *o = head(s, q, q->chat ? "chat.completion" : "text_completion");
    json_t *choice = json_object(), *choices = json_array();
    json_object_set_new(choice, "index", json_integer(0));
    if (q->chat) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        json_object_set_new(msg, "content", mc_json_text(q->text.data, q->text.len));
        json_object_set_new(choice, "message", msg);
        json_object_set_new(choice, "logprobs",
                            q->logprobs >= 0 ? logprobs_chat(s, q, 0, (int)q->out.n) : json_null());
    } else {
        mc_buf t = MC_BUF_INIT;
        if (q->echo) mc_buf_append(&t, q->prompt_text, q->prompt_len, NULL);
        mc_buf_append(&t, q->text.data, q->text.len, NULL);
        json_object_set_new(choice, "text", mc_json_text(t.data, t.len));
        mc_buf_free(&t);
        json_object_set_new(choice, "logprobs",
                            q->logprobs >= 0
                                ? logprobs_completion(s, q, 0, (int)q->out.n, 0, q->echo)
                                : json_null());
    }
    json_object_set_new(choice, "finish_reason", json_string(q->finish ? q->finish : "length"));
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage(q));
    return o;
}

static void sse_event(sv_req *q, json_t *o)
{
    char *d = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!d) return;
    mc_buf_printf(&q->sse, NULL, "data: %s\n\n", d);
    free(d);
}

/* the bytes of text[0..n) that end on a whole character */
static size_t whole_chars(const char *t, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)t[i - 1] & 0xC0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned char c = (unsigned char)t[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back + 1 ? i - 1 : n;
}

void sv_stream_update(mc_serve *s, sv_req *q)
{
    if (q->sse_end) return;
    int done = q->state == SV_DONE;
    size_t safe = q->text.len;
    if (!done) {
        /* hold back what may be the start of a stop string, or of a character */
        safe = q->max_stop > 1 ? (safe > q->max_stop - 1 ? safe - (q->max_stop - 1) : 0) : safe;
        safe = whole_chars(q->text.data, safe);
    }
    if (safe < q->sent) safe = q->sent;
    int ntok = (int)q->out.n;
    int first = !q->role_sent;
    if (!done && safe == q->sent && !(q->logprobs >= 0 && ntok > q->tok_sent) && !first) return;
    json_t *o = head(s, q, q->chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_object(), *choices = json_array();
    json_object_set_new(choice, "index", json_integer(0));
    if (q->chat) {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        json_object_set_new(delta, "content", mc_json_text(q->text.data + q->sent, safe - q->sent));
        json_object_set_new(choice, "delta", delta);
        json_object_set_new(choice, "logprobs",
                            q->logprobs >= 0 ? logprobs_chat(s, q, q->tok_sent, ntok)
                                             : json_null());
    } else {
        mc_buf t = MC_BUF_INIT;
        if (first && q->echo) mc_buf_append(&t, q->prompt_text, q->prompt_len, NULL);
        mc_buf_append(&t, q->text.data + q->sent, safe - q->sent, NULL);
        json_object_set_new(choice, "text", mc_json_text(t.data, t.len));
        mc_buf_free(&t);
        json_object_set_new(
            choice, "logprobs",
            q->logprobs >= 0
                ? logprobs_completion(s, q, q->tok_sent, ntok,
                                      q->sent + (q->echo && !first ? q->prompt_len : 0),
                                      first && q->echo)
                : json_null());
    }
    json_object_set_new(choice, "finish_reason",
                        done ? json_string(q->finish ? q->finish : "length") : json_null());
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    if (q->include_usage) json_object_set_new(o, "usage", json_null());
    sse_event(q, o);
    q->sent = safe;
    q->tok_sent = ntok;
    q->role_sent = 1;
    if (done) {
        if (q->include_usage) {
            /* OpenAI's last chunk: no choices, the request's usage */
            o = head(s, q, q->chat ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage(q));
            sse_event(q, o);
        }
        mc_buf_append(&q->sse, "data: [DONE]\n\n", 14, NULL);
        q->sse_end = 1;
    }
}

/* ------------------------------------------------------------ generation */

static void generate(mc_serve *s, mc_serve_reply *r, const char *body, size_t len, int chat)
{
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", len, 0, &je);
    sv_req *q = calloc(1, sizeof *q);
    q->refs = 1;
    if (!j) {
        reply_error(r, 400, "invalid_request_error", NULL, "invalid_json",
                    "the body is not valid JSON: line %d, column %d: %s", je.line, je.column,
                    je.text);
        goto out;
    }
    if (!json_is_object(j)) {
        reply_error(r, 400, "invalid_request_error", NULL, "invalid_json",
                    "the body must be a JSON object");
        goto out;
    }
    if (!get_common(s, r, j, q, chat)) goto out;
    if (chat) {
        int lp = 0;
        long top = 0;
        if (!get_bool(r, j, "logprobs", &lp)) goto out;
        if (!get_int(r, j, "top_logprobs", 0, MAX_TOP_LOGPROBS, &top)) goto out;
        q->logprobs = lp ? (int)top : -1;
        if (!get_messages(s, r, j, q)) goto out;
    } else {
        long lp = -1;
        if (!get_int(r, j, "logprobs", 0, MAX_TOP_LOGPROBS, &lp)) goto out;
        q->logprobs = (int)lp;
        if (!get_bool(r, j, "echo", &q->echo)) goto out;
        if (!get_prompt(s, r, j, q)) goto out;
    }
    if (q->prompt.n == 0) {
        if (s->eod < 0) {
            BAD(chat ? "messages" : "prompt",
                "the prompt is empty and the tokenizer has no end-of-document token to start "
                "from");
            goto out;
        }
        mc_ids_push(&q->prompt, s->eod, NULL);
    }
    if ((int)q->prompt.n >= s->info.ctx) {
        reply_error(r, 400, "invalid_request_error", chat ? "messages" : "prompt",
                    "context_length_exceeded",
                    "'%s': the prompt has %zu tokens and the context holds %d (--ctx-size): no "
                    "room to generate",
                    chat ? "messages" : "prompt", q->prompt.n, s->info.ctx);
        goto out;
    }
    if (q->logprobs > 0) q->tops = json_array();
    if (q->echo && q->logprobs >= 0) q->plps = calloc(q->prompt.n, sizeof *q->plps);
    mc_error err;
    pthread_mutex_lock(&s->mu);
    mc_status st = sv_submit(s, q, &err);
    if (st == MC_ERR_LIMIT) {
        s->m.rejected_queue++;
        pthread_mutex_unlock(&s->mu);
        reply_error(r, 429, "rate_limit_error", NULL, "queue_full", "%s", err.msg);
        goto out;
    }
    if (st) {
        pthread_mutex_unlock(&s->mu);
        if (s->draining)
            reply_error(r, 503, "server_error", NULL, "shutting_down", "%s", err.msg);
        else
            BAD("max_tokens", "%s", err.msg);
        goto out;
    }
    s->m.prompt_tokens += q->prompt.n;
    if (q->stream) {
        pthread_mutex_unlock(&s->mu);
        r->status = 200;
        r->content_type = "text/event-stream";
        r->stream = (mc_serve_stream *)q;
        json_decref(j);
        return;
    }
    while (q->state != SV_DONE) pthread_cond_wait(&s->progress, &s->mu);
    json_t *o = response(s, q);
    sv_req_unref(q);
    pthread_mutex_unlock(&s->mu);
    json_decref(j);
    reply_json(r, 200, o);
    return;
out:
    if (r->status == 400) {
        pthread_mutex_lock(&s->mu);
        s->m.rejected_bad++;
        pthread_mutex_unlock(&s->mu);
    }
    json_decref(j);
    sv_req_unref(q);
}

long mc_serve_stream_read(mc_serve *s, mc_serve_stream *st, char *buf, size_t max, int timeout_ms)
{
    sv_req *q = (sv_req *)st;
    pthread_mutex_lock(&s->mu);
    if (q->sse_off == q->sse.len && !q->sse_end && q->state != SV_DONE && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->progress, &s->mu, &ts);
    }
    long n = 0;
    if (q->sse_off < q->sse.len) {
        n = (long)(q->sse.len - q->sse_off < max ? q->sse.len - q->sse_off : max);
        memcpy(buf, q->sse.data + q->sse_off, (size_t)n);
        q->sse_off += (size_t)n;
    } else if (q->sse_end || q->state == SV_DONE) {
        n = -1;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void mc_serve_stream_close(mc_serve *s, mc_serve_stream *st)
{
    sv_req *q = (sv_req *)st;
    pthread_mutex_lock(&s->mu);
    if (q->state != SV_DONE) {
        q->cancelled = 1;
        pthread_cond_signal(&s->work);
    }
    sv_req_unref(q);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------ the rest */

static void metrics(mc_serve *s, mc_serve_reply *r)
{
    mc_buf b = MC_BUF_INIT;
    pthread_mutex_lock(&s->mu);
    const sv_metrics *m = &s->m;
#define COUNTER(name, help, v)                                                                    \
    mc_buf_printf(&b, NULL, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, \
                  (unsigned long long)(v))
#define GAUGE(name, help, fmt, v)                                                                  \
    mc_buf_printf(&b, NULL, "# HELP %s %s\n# TYPE %s gauge\n%s " fmt "\n", name, help, name, name, \
                  v)
    COUNTER("mc_serve_http_requests_total", "HTTP requests answered.", m->http_requests);
    COUNTER("mc_serve_requests_completed_total", "Generations finished.", m->completed);
    COUNTER("mc_serve_requests_cancelled_total", "Generations whose client went away.",
            m->cancelled);
    mc_buf_printf(&b, NULL,
                  "# HELP mc_serve_requests_rejected_total Generation requests refused.\n"
                  "# TYPE mc_serve_requests_rejected_total counter\n"
                  "mc_serve_requests_rejected_total{reason=\"queue_full\"} %llu\n"
                  "mc_serve_requests_rejected_total{reason=\"bad_request\"} %llu\n",
                  (unsigned long long)m->rejected_queue, (unsigned long long)m->rejected_bad);
    COUNTER("mc_serve_prompt_tokens_total", "Prompt tokens of admitted requests.",
            m->prompt_tokens);
    COUNTER("mc_serve_generation_tokens_total", "Tokens generated.", m->gen_tokens);
    GAUGE("mc_serve_queue_length", "Requests waiting for the batch.", "%d", s->nqueue);
    GAUGE("mc_serve_requests_running", "Requests in the batch.", "%d", s->nrun);
    mc_buf_printf(&b, NULL,
                  "# HELP mc_serve_batch_size Requests in each forward step.\n"
                  "# TYPE mc_serve_batch_size histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i <= SV_BATCH_BUCKETS; i++) {
        cum += m->batch_hist[i];
        if (i < SV_BATCH_BUCKETS)
            mc_buf_printf(&b, NULL, "mc_serve_batch_size_bucket{le=\"%d\"} %llu\n", 1 << i,
                          (unsigned long long)cum);
        else
            mc_buf_printf(&b, NULL, "mc_serve_batch_size_bucket{le=\"+Inf\"} %llu\n",
                          (unsigned long long)cum);
    }
    mc_buf_printf(&b, NULL, "mc_serve_batch_size_sum %.17g\nmc_serve_batch_size_count %llu\n",
                  m->batch_sum, (unsigned long long)m->steps);
    GAUGE("mc_serve_batch_size_max", "The largest batch so far.", "%d", m->max_batch_seen);
    static const double B[SV_TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
    mc_buf_printf(&b, NULL,
                  "# HELP mc_serve_time_to_first_token_seconds From arrival to the first token.\n"
                  "# TYPE mc_serve_time_to_first_token_seconds histogram\n");
    cum = 0;
    for (int i = 0; i <= SV_TTFT_BUCKETS; i++) {
        cum += m->ttft_hist[i];
        if (i < SV_TTFT_BUCKETS)
            mc_buf_printf(&b, NULL, "mc_serve_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n",
                          B[i], (unsigned long long)cum);
        else
            mc_buf_printf(&b, NULL,
                          "mc_serve_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n",
                          (unsigned long long)cum);
    }
    mc_buf_printf(&b, NULL,
                  "mc_serve_time_to_first_token_seconds_sum %.17g\n"
                  "mc_serve_time_to_first_token_seconds_count %llu\n",
                  m->ttft_sum, (unsigned long long)m->ttft_count);
    GAUGE("mc_serve_generation_tokens_per_second", "Tokens generated per second of forward steps.",
          "%.6g", m->busy_s > 0 ? (double)m->gen_tokens / m->busy_s : 0.0);
    GAUGE("mc_serve_kv_blocks_in_use", "Key/value blocks held by requests.", "%d",
          mc_kvpool_blocks(s->pool) - mc_kvpool_blocks_free(s->pool));
    GAUGE("mc_serve_kv_blocks_total", "Key/value blocks in the pool.", "%d",
          mc_kvpool_blocks(s->pool));
#undef COUNTER
#undef GAUGE
    pthread_mutex_unlock(&s->mu);
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4";
    r->body = b.data ? b.data : strdup("");
    r->len = b.len;
}

void mc_serve_handle(mc_serve *s, const char *method, const char *path, const char *body,
                     size_t len, mc_serve_reply *r)
{
    static const struct {
        const char *path, *method;
        int what;
    } routes[] = {
        {"/v1/completions", "POST", 0}, {"/v1/chat/completions", "POST", 1},
        {"/v1/models", "GET", 2},       {"/health", "GET", 3},
        {"/metrics", "GET", 4},         {NULL, NULL, 0},
    };
    memset(r, 0, sizeof *r);
    pthread_mutex_lock(&s->mu);
    s->m.http_requests++;
    int draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    int i = 0;
    while (routes[i].path && strcmp(routes[i].path, path)) i++;
    if (!routes[i].path) {
        reply_error(r, 404, "invalid_request_error", NULL, "not_found", "no such endpoint: %s %s",
                    method, path);
        return;
    }
    int head = !strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET");
    if (strcmp(method, routes[i].method) && !head) {
        reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                    "%s takes %s, not %s", path, routes[i].method, method);
        r->allow = routes[i].method;
        return;
    }
    switch (routes[i].what) {
    case 0:
    case 1: generate(s, r, body, len, routes[i].what); break;
    case 2: {
        json_t *m = json_object(), *list = json_array(), *o = json_object();
        json_object_set_new(m, "id", json_string(s->model_name));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer(0));
        json_object_set_new(m, "owned_by", json_string("mc"));
        json_object_set_new(m, "checkpoint", json_string(s->ckpt_dir));
        json_object_set_new(m, "context_length", json_integer(s->info.ctx));
        json_array_append_new(list, m);
        json_object_set_new(o, "object", json_string("list"));
        json_object_set_new(o, "data", list);
        reply_json(r, 200, o);
        break;
    }
    case 3: {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string(draining ? "shutting down" : "ok"));
        reply_json(r, draining ? 503 : 200, o);
        break;
    }
    default: metrics(s, r);
    }
}
