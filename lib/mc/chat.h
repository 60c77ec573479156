/*
 * chat.h - Hugging Face chat templates (the Jinja "chat_template" of a
 * tokenizer_config.json) rendered in C, byte for byte as transformers'
 * apply_chat_template(..., tokenize=False) renders them.
 *
 * The engine implements the subset of Jinja2 that published templates use
 * (for/if/set/macros, loop variables, namespaces, the usual filters and tests,
 * Python's string methods), with the environment transformers builds:
 * trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now,
 * its own tojson and the {% generation %} block. Anything outside the subset
 * is an error naming the construct and the template's line. The supported
 * subset is listed in mc-formats(5), CHAT TEMPLATES.
 */
#ifndef MC_CHAT_H
#define MC_CHAT_H

#include <stddef.h>
#include <jansson.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_chat_template mc_chat_template;

/* Parse a template; `name` (a file path or "tokenizer_config.json") prefixes
 * errors: "NAME:LINE: ...". src need not be NUL-terminated. */
mc_status mc_chat_template_parse(const char *name, const char *src, size_t len,
                                 mc_chat_template **out, mc_error *err);

/* Read a template file: a .jinja/plain text file, or a tokenizer_config.json
 * (a name ending in ".json", or text starting with '{' and then '"') whose
 * "chat_template" is a string or a list of {"name", "template"} (the one
 * named "default" is taken); errors then name "PATH[chat_template]:LINE". */
mc_status mc_chat_template_load(const char *path, mc_chat_template **out, mc_error *err);

void mc_chat_template_free(mc_chat_template *t);

/* The variables a template sees. As transformers does, each message's keys
 * whose value is null are dropped, and a message with "reasoning_content",
 * "thinking" or "reasoning" gets the first of them under both "thinking"
 * and "reasoning_content". */
typedef struct mc_chat_vars {
    const json_t *messages; /* array of {"role","content",...}; content may be a string or
                               a list of {"type":"text","text":...} parts */
    const json_t *tools;    /* array, or NULL: `tools` is none, as transformers passes it */
    int add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: undefined */
    const json_t *extra; /* object of further variables (enable_thinking, date_string, ...)
                            or NULL */
} mc_chat_vars;

/* Render; on success *out is malloc'd NUL-terminated text of *len bytes.
 * raise_exception("msg") gives err "NAME:LINE: template raised: msg" (with
 * code MC_ERR_FORMAT); any other failure of the template (an undefined
 * value's attribute, a list added to a string, ...) "NAME:LINE: ...". */
mc_status mc_chat_template_render(const mc_chat_template *t, const mc_chat_vars *v, char **out,
                                  size_t *len, mc_error *err);

/* A {% generation %} block's output: bytes [begin, end) of the rendered text
 * (transformers records the same spans in characters). */
typedef struct mc_chat_span {
    size_t begin, end;
} mc_chat_span;

/* mc_chat_template_render, and the spans of the {% generation %} blocks in
 * the order they were rendered (*spans malloc'd, NULL when there is none). */
mc_status mc_chat_template_render_spans(const mc_chat_template *t, const mc_chat_vars *v,
                                        char **out, size_t *len, mc_chat_span **spans,
                                        size_t *nspans, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
