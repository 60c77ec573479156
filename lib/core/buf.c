/*
 * buf.c - growable byte buffers (mc_buf), lists on them, int32 id vectors
 * (mc_ids) and mc_strprintf.
 *
 * Capacity doubles so appends are amortized O(1); every size computation is
 * checked for overflow, because a length read from a corrupt file can reach
 * these functions.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Smallest capacity >= need, growing geometrically from cap. */
static size_t grow_cap(size_t cap, size_t need, size_t min)
{
    size_t c = cap ? cap : min;
    while (c < need) {
        if (c > SIZE_MAX / 2) return need;
        c *= 2;
    }
    return c;
}

mc_status mc_buf_reserve(mc_buf *b, size_t extra, mc_error *err)
{
    /* +1 keeps room for a NUL terminator so data can always be used as a
     * C string after mc_buf_printf. */
    if (extra > SIZE_MAX - b->len - 1)
        return mc_error_set(err, MC_ERR_NOMEM, "buffer size overflow");
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return MC_OK;
    size_t cap = grow_cap(b->cap, need, 64);
    char *p = realloc(b->data, cap);
    if (!p) return mc_error_set(err, MC_ERR_NOMEM, "out of memory (buffer of %zu bytes)", cap);
    b->data = p;
    b->cap = cap;
    return MC_OK;
}

mc_status mc_buf_append(mc_buf *b, const void *p, size_t n, mc_error *err)
{
    mc_status st = mc_buf_reserve(b, n, err);
    if (st) return st;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return MC_OK;
}

mc_status mc_buf_printf(mc_buf *b, mc_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return mc_error_set(err, MC_ERR_INTERNAL, "mc_buf_printf: bad format");
    mc_status st = mc_buf_reserve(b, (size_t)n, err);
    if (st) return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return MC_OK;
}

void mc_buf_free(mc_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- lists ---------------------------------------------------------------- */

mc_status mc_buf_push(mc_buf *b, const void *elem, size_t size, mc_error *err)
{
    if (mc_buf_reserve(b, size, NULL)) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    memcpy(b->data + b->len, elem, size);
    b->len += size;
    return MC_OK;
}

mc_status mc_buf_push_str(mc_buf *b, const char *s, mc_error *err)
{
    return mc_buf_push(b, &s, sizeof s, err);
}

mc_status mc_buf_push_strdup(mc_buf *b, const char *s, mc_error *err)
{
    char *d = strdup(s);
    if (!d) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status st = mc_buf_push_str(b, d, err);
    if (st) free(d);
    return st;
}

mc_status mc_buf_push_split(mc_buf *b, char *s, const char *seps, mc_error *err)
{
    char *save = NULL;
    for (char *w = strtok_r(s, seps, &save); w; w = strtok_r(NULL, seps, &save)) {
        mc_status st = mc_buf_push_str(b, w, err);
        if (st) return st;
    }
    return MC_OK;
}

void mc_buf_free_strs(mc_buf *b)
{
    const char **v = mc_buf_strs(b);
    for (size_t i = 0; i < mc_buf_nstrs(b); i++) free((char *)v[i]);
    mc_buf_free(b);
}

/* ---- id vectors ------------------------------------------------------------ */

mc_status mc_ids_reserve(mc_ids *v, size_t extra, mc_error *err)
{
    if (extra > SIZE_MAX / sizeof(int32_t) - v->n)
        return mc_error_set(err, MC_ERR_NOMEM, "id vector size overflow");
    size_t need = v->n + extra;
    if (need <= v->cap) return MC_OK;
    size_t cap = grow_cap(v->cap, need, 16);
    if (cap > SIZE_MAX / sizeof(int32_t)) cap = need;
    int32_t *p = realloc(v->v, cap * sizeof(int32_t));
    if (!p) return mc_error_set(err, MC_ERR_NOMEM, "out of memory (%zu ids)", cap);
    v->v = p;
    v->cap = cap;
    return MC_OK;
}

mc_status mc_ids_push(mc_ids *v, int32_t id, mc_error *err)
{
    if (v->n == v->cap) {
        mc_status st = mc_ids_reserve(v, 1, err);
        if (st) return st;
    }
    v->v[v->n++] = id;
    return MC_OK;
}

void mc_ids_free(mc_ids *v)
{
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
}

char *mc_strprintf(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}
