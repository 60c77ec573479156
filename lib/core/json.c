/*
 * json.c - JSON parsing through jansson, with errors that say where.
 *
 * jansson reports a line and a column (in characters, 1-based) and a short
 * text; this file turns that into the project's one-line form
 * "PATH:LINE:COL: invalid JSON: TEXT". Duplicate keys are accepted (the last
 * wins), as Python's json module does, so files Python accepts load here too.
 * NUL characters ("\u0000") inside strings are allowed, because text corpora
 * contain them; callers read string lengths with json_string_length.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <utf8proc.h>

#include "mc/buf.h"
#include "mc/json.h"
#include "mc/file.h"

#include <stdlib.h>
#include <string.h>

#define MC_JSON_FLAGS JSON_ALLOW_NUL

mc_status mc_json_load_buf(const char *where, const char *data, size_t len, json_t **out,
                           mc_error *err)
{
    *out = NULL;
    json_error_t je;
    json_t *j = json_loadb(data, len, MC_JSON_FLAGS, &je);
    if (j) {
        *out = j;
        return MC_OK;
    }
    int line = je.line > 0 ? je.line : 1;
    int col = je.column > 0 ? je.column : 1;
    if (!where || !*where)
        return mc_error_set(err, MC_ERR_FORMAT, "%d:%d: invalid JSON: %s", line, col, je.text);
    /* Does `where` already end in ":LINE" (a JSONL record)? Then the column
     * is all that is left to add, and a later line inside the buffer moves
     * the line number on. */
    size_t wl = strlen(where), d = wl;
    while (d > 0 && where[d - 1] >= '0' && where[d - 1] <= '9') d--;
    if (d < wl && d > 1 && where[d - 1] == ':') {
        if (line == 1)
            return mc_error_set(err, MC_ERR_FORMAT, "%s:%d: invalid JSON: %s", where, col, je.text);
        long base = strtol(where + d, NULL, 10);
        return mc_error_set(err, MC_ERR_FORMAT, "%.*s:%ld:%d: invalid JSON: %s", (int)(d - 1),
                            where, base + line - 1, col, je.text);
    }
    return mc_error_set(err, MC_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", where, line, col,
                        je.text);
}

mc_status mc_json_load_file(const char *path, json_t **out, mc_error *err)
{
    *out = NULL;
    char *data;
    size_t len;
    /* Read it ourselves rather than with json_load_file so that open and read
     * errors have the same form as every other file error. */
    mc_status st = mc_read_file(path, &data, &len, err);
    if (st) return st;
    json_error_t je;
    json_t *j = json_loadb(data, len, MC_JSON_FLAGS, &je);
    free(data);
    if (!j)
        return mc_error_set(err, MC_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path,
                            je.line > 0 ? je.line : 1, je.column > 0 ? je.column : 1, je.text);
    *out = j;
    return MC_OK;
}

json_t *mc_json_text(const char *s, size_t n)
{
    mc_buf b = MC_BUF_INIT;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &c);
        if (k < 1) {
            if (mc_buf_append(&b, "\xEF\xBF\xBD", 3, NULL)) break;
            i++;
        } else {
            if (mc_buf_append(&b, s + i, (size_t)k, NULL)) break;
            i += (size_t)k;
        }
    }
    json_t *j = json_stringn(b.data ? b.data : "", b.len);
    mc_buf_free(&b);
    return j ? j : json_string("");
}
