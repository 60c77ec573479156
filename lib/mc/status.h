/*
 * status.h - status codes and error reports for libmc.
 *
 * Every libmc function that can fail returns an mc_status and, on failure,
 * fills a caller-owned mc_error with one human-readable line that already
 * names the file and the place in it ("corpus.jsonl:1042: invalid JSON: ...").
 * Tools prefix that line with their name and "error: " and exit 1.
 */
#ifndef MC_STATUS_H
#define MC_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_status {
    MC_OK = 0,
    MC_ERR_IO,       /* the operating system refused: open, read, write, rename */
    MC_ERR_FORMAT,   /* the input is malformed: bad JSON, bad magic, bad sizes */
    MC_ERR_USAGE,    /* the caller asked for something impossible (exit 2) */
    MC_ERR_NOMEM,    /* out of memory */
    MC_ERR_LIMIT,    /* a configured limit was exceeded (document too long, ...) */
    MC_ERR_NOTFOUND, /* a named thing (key, token, file) does not exist */
    MC_ERR_INTERNAL  /* a bug in mc */
} mc_status;

#define MC_ERROR_MSG_MAX 1024

typedef struct mc_error {
    mc_status code;
    char msg[MC_ERROR_MSG_MAX];
} mc_error;

/* Record an error; returns code so callers can write `return mc_error_set(...)`.
 * A NULL err is allowed and records nothing. */
mc_status mc_error_set(mc_error *err, mc_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
mc_status mc_error_setv(mc_error *err, mc_status code, const char *fmt, va_list ap);

/* Like mc_error_set, with ": strerror(errnum)" appended. */
mc_status mc_error_errno(mc_error *err, mc_status code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Put "prefix: " in front of the message already in err (adds context on the
 * way up: the file name, the document number). Returns err->code. */
mc_status mc_error_prefix(mc_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void mc_error_clear(mc_error *err);

/* Short name of a status code ("io error", "format error", ...). */
const char *mc_status_name(mc_status s);

/* Exit status for a tool: 0 ok, 2 usage, 1 anything else. */
int mc_status_exit_code(mc_status s);

#ifdef __cplusplus
}
#endif
#endif
