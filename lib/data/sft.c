/*
 * sft.c - one conversation (a JSONL record) into tokens and a loss mask
 * (mc/sft.h): the messages checked, rendered with the chat template, the
 * assistant turns located by rendering growing prefixes of the
 * conversation, each stretch tokenized on its own.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc/chat.h"
#include "mc/json.h"
#include "mc/sft.h"
#include "mc/tokenizer.h"

static const char *const roles[] = {"system", "user", "assistant", "tool", "developer", NULL};

/* Check a list of messages: an array of objects with a known role and a
 * string, list or null content; `what` names it in errors ("messages",
 * "chosen", ...). *assistant gets whether one message is the assistant's. */
static mc_status check_messages(const json_t *msgs, const char *where, const char *what,
                                int *assistant, mc_error *err)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: \"%s\" must be a non-empty array", where,
                            what);
    *assistant = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: %s[%zu] is not an object", where, what, i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: %s[%zu] has no \"role\" string", where,
                                what, i);
        int k = 0;
        while (roles[k] && strcmp(roles[k], json_string_value(role))) k++;
        if (!roles[k])
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: %s[%zu]: unknown role '%s' (system, user, assistant, "
                                "tool or developer)",
                                where, what, i, json_string_value(role));
        json_t *content = json_object_get(m, "content");
        if (content && !json_is_string(content) && !json_is_array(content) &&
            !json_is_null(content))
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: %s[%zu]: \"content\" must be a string, a list of "
                                "parts or null",
                                where, what, i);
        *assistant |= !strcmp(roles[k], "assistant");
    }
    return MC_OK;
}

/* The conversation as the template will see it: msgs (checked), then
 * `more` (may be NULL), a top-level "system" of rec put first when the
 * messages have none. */
static mc_status conversation_of(const json_t *rec, const json_t *msgs, const json_t *more,
                                 const char *where, json_t **out, mc_error *err)
{
    *out = NULL;
    json_t *sys = json_object_get(rec, "system");
    const char *first = json_string_value(json_object_get(json_array_get(msgs, 0), "role"));
    if (sys && !json_is_string(sys))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: \"system\" must be a string", where);
    json_t *all = json_array();
    if (!all) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (sys && strcmp(first, "system"))
        json_array_append_new(all, json_pack("{s:s,s:O}", "role", "system", "content", sys));
    json_array_extend(all, (json_t *)msgs);
    if (more) json_array_extend(all, (json_t *)more);
    *out = all;
    return MC_OK;
}

/* The record's messages as the template will see them (mc_sft_encode). */
static mc_status messages_of(const json_t *rec, const char *where, json_t **out, mc_error *err)
{
    *out = NULL;
    if (!json_is_object(rec))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: a conversation must be a JSON object", where);
    json_t *msgs = json_object_get(rec, "messages");
    if (!msgs) return mc_error_set(err, MC_ERR_FORMAT, "%s: no \"messages\"", where);
    int assistant;
    mc_status st = check_messages(msgs, where, "messages", &assistant, err);
    if (st) return st;
    if (!assistant)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: no assistant message: nothing to train on",
                            where);
    return conversation_of(rec, msgs, NULL, where, out, err);
}

/* Render messages[0..n) of all. */
static mc_status render(const mc_sft_render_opts *o, const json_t *rec, json_t *all, size_t n,
                        int gen, char **text, size_t *len, mc_error *err)
{
    json_t *part = json_array();
    if (!part) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) json_array_append(part, json_array_get(all, i));
    mc_chat_vars v = {.messages = part,
                      .tools = json_object_get(rec, "tools"),
                      .add_generation_prompt = gen,
                      .bos_token = o->bos_token,
                      .eos_token = o->eos_token,
                      .extra = o->extra};
    mc_status st = mc_chat_template_render(o->tmpl, &v, text, len, err);
    json_decref(part);
    return st;
}

/* The conversation `all` of record rec into tokens and mask (replaced), EOD
 * last: the assistant messages at index >= first_trained get mask 1 (every
 * token but the EOD with train_on_prompt). */
static mc_status encode_conversation(const mc_sft_render_opts *o, mc_encoder *enc, int32_t eod,
                                     const char *where, const json_t *rec, json_t *all,
                                     size_t first_trained, mc_ids *tokens, mc_ids *mask,
                                     mc_error *err)
{
    tokens->n = mask->n = 0;
    mc_status st = MC_OK;
    size_t n = json_array_size(all);
    char *text = NULL, *pre = NULL, *upto = NULL;
    size_t tlen = 0, plen, ulen;
    /* spans[2k], spans[2k+1]: the k-th assistant turn's bytes in text */
    size_t *spans = calloc(2 * n + 2, sizeof *spans), ns = 0;
    if (!spans) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (!st) st = render(o, rec, all, n, 0, &text, &tlen, err);
    for (size_t i = first_trained; !st && !o->train_on_prompt && i < n; i++) {
        const char *role = json_string_value(json_object_get(json_array_get(all, i), "role"));
        if (strcmp(role, "assistant")) continue;
        /* the conversation up to this turn with the generation prompt,
         * then with this turn: the difference is what the model says */
        if (!(st = render(o, rec, all, i, 1, &pre, &plen, err)) &&
            !(st = render(o, rec, all, i + 1, 0, &upto, &ulen, err))) {
            if (plen > ulen || memcmp(pre, upto, plen) || ulen > tlen || memcmp(upto, text, ulen) ||
                (ns && plen < spans[ns - 1]))
                st = mc_error_set(err, MC_ERR_FORMAT,
                                  "%s: messages[%zu]: the chat template does not render the "
                                  "conversation so that each turn extends the text before it, so "
                                  "the assistant's tokens cannot be told apart "
                                  "(--train-on-prompt trains on every token)",
                                  where, i);
            else {
                spans[ns++] = plen;
                spans[ns++] = ulen;
            }
        }
        free(pre);
        free(upto);
        pre = upto = NULL;
    }
    /* tokenize stretch by stretch: prompt, turn, prompt, turn, ..., rest */
    size_t at = 0;
    for (size_t k = 0; !st && k <= ns; k++) {
        size_t end = k < ns ? spans[k] : tlen;
        uint8_t keep = o->train_on_prompt || (k & 1);
        size_t before = tokens->n;
        if (end > at) st = mc_encode(enc, text + at, end - at, tokens, err);
        for (size_t j = before; !st && j < tokens->n; j++) st = mc_ids_push(mask, keep, err);
        at = end;
    }
    if (!st) st = mc_ids_push(tokens, eod, err);
    if (!st) st = mc_ids_push(mask, 0, err);
    if (st && err->code != MC_ERR_NOMEM && !strstr(err->msg, where))
        mc_error_prefix(err, "%s", where);
    free(spans);
    free(text);
    return st;
}

mc_status mc_sft_encode(const mc_sft_render_opts *o, mc_encoder *enc, int32_t eod,
                        const char *where, const char *line, size_t len, mc_ids *tokens,
                        mc_ids *mask, mc_error *err)
{
    tokens->n = mask->n = 0;
    json_t *rec = NULL, *all = NULL;
    mc_status st = mc_json_load_buf(where, line, len, &rec, err);
    if (!st) st = messages_of(rec, where, &all, err);
    if (!st) st = encode_conversation(o, enc, eod, where, rec, all, 0, tokens, mask, err);
    json_decref(all);
    json_decref(rec);
    return st;
}

/* A preference record's answer: a string (one assistant message) or a list
 * of messages with an assistant message among them; *out is new. */
static mc_status answer_of(const json_t *rec, const char *key, const char *where, json_t **out,
                           mc_error *err)
{
    *out = NULL;
    json_t *v = json_object_get(rec, key);
    if (!v) return mc_error_set(err, MC_ERR_FORMAT, "%s: no \"%s\"", where, key);
    if (json_is_string(v)) {
        *out = json_pack("[{s:s,s:O}]", "role", "assistant", "content", v);
        return *out ? MC_OK : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    if (!json_is_array(v))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: \"%s\" must be a string or a list of messages",
                            where, key);
    int assistant;
    mc_status st = check_messages(v, where, key, &assistant, err);
    if (st) return st;
    if (!assistant)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: \"%s\" has no assistant message", where, key);
    *out = json_incref(v);
    return MC_OK;
}

mc_status mc_pref_encode(const mc_sft_render_opts *o, mc_encoder *enc, int32_t eod,
                         const char *where, const char *line, size_t len, mc_ids *chosen,
                         mc_ids *chosen_mask, mc_ids *rejected, mc_ids *rejected_mask,
                         mc_error *err)
{
    chosen->n = chosen_mask->n = rejected->n = rejected_mask->n = 0;
    json_t *rec = NULL, *prompt = NULL, *ans[2] = {NULL, NULL}, *all = NULL;
    mc_status st = mc_json_load_buf(where, line, len, &rec, err);
    if (st) return st;
    if (!json_is_object(rec)) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: a preference record must be a JSON object",
                          where);
        goto out;
    }
    /* the prompt: "prompt" (a string: one user message; or messages, TRL's
     * conversational format) or "messages" */
    json_t *p = json_object_get(rec, "prompt");
    const char *pkey = "prompt";
    if (!p) {
        p = json_object_get(rec, "messages");
        pkey = "messages";
    }
    if (!p) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: no \"prompt\" or \"messages\"", where);
        goto out;
    }
    int assistant;
    if (json_is_string(p)) {
        if (!(prompt = json_pack("[{s:s,s:O}]", "role", "user", "content", p)))
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    } else if (!(st = check_messages(p, where, pkey, &assistant, err))) {
        prompt = json_incref(p);
    }
    if (!st) st = answer_of(rec, "chosen", where, &ans[0], err);
    if (!st) st = answer_of(rec, "rejected", where, &ans[1], err);
    mc_ids *tok[2] = {chosen, rejected}, *mask[2] = {chosen_mask, rejected_mask};
    for (int k = 0; k < 2 && !st; k++) {
        if (!(st = conversation_of(rec, prompt, ans[k], where, &all, err))) {
            size_t first = json_array_size(all) - json_array_size(ans[k]);
            st = encode_conversation(o, enc, eod, where, rec, all, first, tok[k], mask[k], err);
        }
        json_decref(all);
        all = NULL;
    }
out:
    json_decref(prompt);
    json_decref(ans[0]);
    json_decref(ans[1]);
    json_decref(rec);
    return st;
}

/* A special token of tokenizer_config.json: a string, or an AddedToken
 * object {"content": ...}; NULL when absent. */
static char *special_token(const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

mc_status mc_sft_chat_load(const char *template_path, const char *tokenizer_model, mc_sft_chat *out,
                           mc_error *err)
{
    memset(out, 0, sizeof *out);
    char *cfg_path = NULL;
    size_t tl = template_path ? strlen(template_path) : 0;
    if (template_path && tl >= 5 && !strcmp(template_path + tl - 5, ".json")) {
        cfg_path = strdup(template_path);
    } else if (tokenizer_model) {
        const char *slash = strrchr(tokenizer_model, '/');
        int n = slash ? (int)(slash - tokenizer_model) : 1;
        if (asprintf(&cfg_path, "%.*s/tokenizer_config.json", n, slash ? tokenizer_model : ".") < 0)
            cfg_path = NULL;
    }
    json_t *cfg = NULL;
    if (cfg_path && access(cfg_path, R_OK) == 0) {
        mc_status st = mc_json_load_file(cfg_path, &cfg, err);
        if (st) {
            free(cfg_path);
            return st;
        }
        out->bos_token = special_token(cfg, "bos_token");
        out->eos_token = special_token(cfg, "eos_token");
    }
    const char *src = template_path;
    if (!src && cfg && json_object_get(cfg, "chat_template")) src = cfg_path;
    mc_status st;
    if (!src)
        st = mc_error_set(err, MC_ERR_USAGE,
                          "no chat template: give --chat-template FILE (a Jinja template or a "
                          "tokenizer_config.json), or a --tokenizer-model whose directory has a "
                          "tokenizer_config.json with one");
    else if (!(out->source = strdup(src)))
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    else
        st = mc_chat_template_load(src, &out->tmpl, err);
    json_decref(cfg);
    free(cfg_path);
    if (st) mc_sft_chat_free(out);
    return st;
}

void mc_sft_chat_free(mc_sft_chat *c)
{
    mc_chat_template_free(c->tmpl);
    free(c->bos_token);
    free(c->eos_token);
    free(c->source);
    memset(c, 0, sizeof *c);
}
