/*
 * log.h - messages to stderr.
 *
 * A tool owns one mc_logger (program name, verbosity); library code does not
 * log, it returns errors. Messages go to stderr as "PROG: LEVEL: text", so
 * stdout stays free for the one line of the pipeline contract.
 */
#ifndef MC_LOG_H
#define MC_LOG_H

#include <stdio.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_log_level {
    MC_LOG_ERROR = 0,
    MC_LOG_WARN = 1,
    MC_LOG_INFO = 2,
    MC_LOG_DEBUG = 3
} mc_log_level;

typedef struct mc_logger {
    const char *prog;   /* "mc-preprocess" */
    mc_log_level level; /* messages above this level are dropped */
    FILE *out;          /* stderr unless a test redirects it */
} mc_logger;

void mc_logger_init(mc_logger *lg, const char *prog);
void mc_log(const mc_logger *lg, mc_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define mc_log_error(lg, ...) mc_log((lg), MC_LOG_ERROR, __VA_ARGS__)
#define mc_log_warn(lg, ...) mc_log((lg), MC_LOG_WARN, __VA_ARGS__)
#define mc_log_info(lg, ...) mc_log((lg), MC_LOG_INFO, __VA_ARGS__)
#define mc_log_debug(lg, ...) mc_log((lg), MC_LOG_DEBUG, __VA_ARGS__)

/* Print "PROG: error: MSG" for a failed status; returns the exit code. */
int mc_log_fail(const mc_logger *lg, const mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
