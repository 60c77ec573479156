/*
 * status.c - mc_error: recording one-line error reports and mapping status
 * codes to names and exit codes.
 *
 * Messages are truncated (never overflowed) at MC_ERROR_MSG_MAX; context is
 * added on the way up with mc_error_prefix, so the innermost code only needs
 * to know what it was doing, not which file or document it was part of.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/status.h"

#include <stdio.h>
#include <string.h>

mc_status mc_error_setv(mc_error *err, mc_status code, const char *fmt, va_list ap)
{
    if (!err) return code;
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

mc_status mc_error_set(mc_error *err, mc_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mc_error_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

mc_status mc_error_errno(mc_error *err, mc_status code, int errnum, const char *fmt, ...)
{
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    mc_error_setv(err, code, fmt, ap);
    va_end(ap);
    size_t n = strlen(err->msg);
    /* strerror() is not thread-safe on every libc; strerror_r is, but comes in
     * two flavours. Copy into a local buffer through the GNU or XSI one. */
    char ebuf[256];
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    const char *es = strerror_r(errnum, ebuf, sizeof ebuf);
#else
    const char *es = ebuf;
    if (strerror_r(errnum, ebuf, sizeof ebuf) != 0) snprintf(ebuf, sizeof ebuf, "error %d", errnum);
#endif
    if (n < sizeof err->msg) snprintf(err->msg + n, sizeof err->msg - n, ": %s", es);
    return code;
}

mc_status mc_error_prefix(mc_error *err, const char *fmt, ...)
{
    if (!err) return MC_OK;
    char pre[MC_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* Shift the old message right and put "prefix: " in front; whatever no
     * longer fits is cut from the end, keeping the string terminated. */
    const size_t cap = sizeof err->msg;
    size_t plen = strnlen(pre, cap - 1);
    size_t head = plen + 2 < cap - 1 ? plen + 2 : cap - 1;
    size_t old = strnlen(err->msg, cap - 1);
    if (old > cap - 1 - head) old = cap - 1 - head;
    memmove(err->msg + head, err->msg, old);
    err->msg[head + old] = '\0';
    memcpy(err->msg, pre, head < plen ? head : plen);
    if (head >= plen + 2) memcpy(err->msg + plen, ": ", 2);
    return err->code;
}

void mc_error_clear(mc_error *err)
{
    if (!err) return;
    err->code = MC_OK;
    err->msg[0] = '\0';
}

const char *mc_status_name(mc_status s)
{
    switch (s) {
    case MC_OK: return "ok";
    case MC_ERR_IO: return "io error";
    case MC_ERR_FORMAT: return "format error";
    case MC_ERR_USAGE: return "usage error";
    case MC_ERR_NOMEM: return "out of memory";
    case MC_ERR_LIMIT: return "limit exceeded";
    case MC_ERR_NOTFOUND: return "not found";
    case MC_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

int mc_status_exit_code(mc_status s)
{
    if (s == MC_OK) return 0;
    if (s == MC_ERR_USAGE) return 2;
    return 1;
}
