/*
 * buf.h - growable byte buffers and int32 vectors, and malloc'd formatted
 * strings.
 *
 * These hold host-side bookkeeping (text, token ids on their way to disk);
 * tensor data lives in backend memory and never in these.
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

#define MC_BUF_INIT {NULL, 0, 0}
#define MC_IDS_INIT {NULL, 0, 0}

mc_status mc_buf_reserve(mc_buf *b, size_t extra, mc_error *err);
mc_status mc_buf_append(mc_buf *b, const void *p, size_t n, mc_error *err);
mc_status mc_buf_printf(mc_buf *b, mc_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mc_buf_free(mc_buf *b);

mc_status mc_ids_reserve(mc_ids *v, size_t extra, mc_error *err);
mc_status mc_ids_push(mc_ids *v, int32_t id, mc_error *err);
void mc_ids_free(mc_ids *v);

/* printf into a malloc'd string (paths: "%s/%s"); NULL when out of memory. */
char *mc_strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif
#endif
