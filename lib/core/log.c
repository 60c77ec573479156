/*
 * log.c - the tool's messages to stderr: "PROG: error: ...", "PROG: warning:
 * ...", "PROG: ..." for information and "PROG: debug: ...".
 *
 * Only tools log; the logger is an explicit object the tool owns, so there is
 * no global verbosity.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/log.h"

#include <stdarg.h>

void mc_logger_init(mc_logger *lg, const char *prog)
{
    lg->prog = prog;
    lg->level = MC_LOG_INFO;
    lg->out = stderr;
}

void mc_log(const mc_logger *lg, mc_log_level lvl, const char *fmt, ...)
{
    if (lvl > lg->level) return;
    FILE *out = lg->out ? lg->out : stderr;
    const char *tag = "";
    switch (lvl) {
    case MC_LOG_ERROR: tag = "error: "; break;
    case MC_LOG_WARN: tag = "warning: "; break;
    case MC_LOG_INFO: tag = ""; break;
    case MC_LOG_DEBUG: tag = "debug: "; break;
    }
    /* Build the line first and write it with one call, so lines from several
     * threads or processes sharing stderr do not interleave mid-line. */
    char line[4096];
    int n = snprintf(line, sizeof line, "%s: %s", lg->prog ? lg->prog : "mc", tag);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof line) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        va_end(ap);
    }
    fprintf(out, "%s\n", line);
    fflush(out);
}

int mc_log_fail(const mc_logger *lg, const mc_error *err)
{
    mc_log(lg, MC_LOG_ERROR, "%s", err->msg[0] ? err->msg : mc_status_name(err->code));
    return mc_status_exit_code(err->code);
}
