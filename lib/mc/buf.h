/*
 * buf.h - growable byte buffers, growable lists and int32 vectors, and
 * malloc'd formatted strings.
 *
 * These hold host-side bookkeeping (text, token ids on their way to disk,
 * the values of a repeated option); tensor data lives in backend memory and
 * never in these.
 */
#ifndef MC_BUF_H
#define MC_BUF_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_buf {
    char *data;
    size_t len;
    size_t cap;
} mc_buf;

typedef struct mc_ids {
    int32_t *v;
    size_t n;
    size_t cap;
} mc_ids;

#define MC_BUF_INIT \
    {               \
        NULL, 0, 0  \
    }
#define MC_IDS_INIT \
    {               \
        NULL, 0, 0  \
    }

mc_status mc_buf_reserve(mc_buf *b, size_t extra, mc_error *err);
mc_status mc_buf_append(mc_buf *b, const void *p, size_t n, mc_error *err);
mc_status mc_buf_printf(mc_buf *b, mc_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mc_buf_free(mc_buf *b);

/* Growable lists on mc_buf: elements of one type back to back in data
 * (malloc'd, so aligned for any type), len counting bytes; the list starts
 * as MC_BUF_INIT and mc_buf_free frees it (not what its elements point to).
 * A failed push leaves the list as it was ("out of memory"). */
mc_status mc_buf_push(mc_buf *b, const void *elem, size_t size, mc_error *err);

/* Lists of C strings, the values of repeated options: the pointer is stored,
 * not a copy, except by mc_buf_push_strdup (free such a list with
 * mc_buf_free_strs). mc_buf_push_split cuts s in place at the characters of
 * seps and pushes each non-empty word, as strtok finds them. */
mc_status mc_buf_push_str(mc_buf *b, const char *s, mc_error *err);
mc_status mc_buf_push_strdup(mc_buf *b, const char *s, mc_error *err);
mc_status mc_buf_push_split(mc_buf *b, char *s, const char *seps, mc_error *err);
void mc_buf_free_strs(mc_buf *b);
/* The strings and their number (NULL and 0 for an empty list). */
static inline const char **mc_buf_strs(const mc_buf *b) { return (const char **)(void *)b->data; }
static inline size_t mc_buf_nstrs(const mc_buf *b) { return b->len / sizeof(const char *); }

mc_status mc_ids_reserve(mc_ids *v, size_t extra, mc_error *err);
mc_status mc_ids_push(mc_ids *v, int32_t id, mc_error *err);
void mc_ids_free(mc_ids *v);

/* printf into a malloc'd string (paths: "%s/%s"); NULL when out of memory. */
char *mc_strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif
#endif
