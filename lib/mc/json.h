/*
 * json.h - JSON reading through jansson, with errors that name the place.
 */
#ifndef MC_JSON_H
#define MC_JSON_H

#include <jansson.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse a JSON file; on failure err reads "PATH:LINE:COL: invalid JSON: ...". */
mc_status mc_json_load_file(const char *path, json_t **out, mc_error *err);
/* Parse a buffer; `where` (e.g. "corpus.jsonl:12") prefixes the message. */
mc_status mc_json_load_buf(const char *where, const char *data, size_t len, json_t **out,
                           mc_error *err);

/* A JSON string of the bytes s[0..n) as text: invalid UTF-8 (a token that
 * ends inside a character) becomes U+FFFD, as Python's
 * decode(errors="replace") does. Never NULL (an empty string when out of
 * memory). */
json_t *mc_json_text(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
