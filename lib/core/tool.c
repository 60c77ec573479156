/*
 * tool.c - the start and the end every tool shares (tool.h): logger and
 * signals, the path on stdin, the usage message, the flush of stdout.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/tool.h"

#include <signal.h>
#include <stdio.h>

#include "mc/file.h"

void mc_tool_start(mc_logger *lg, const char *prog, unsigned flags)
{
    mc_logger_init(lg, prog);
    if (flags & MC_TOOL_INTERRUPT)
        mc_interrupt_install();
    if (flags & MC_TOOL_EFBIG)
        signal(SIGXFSZ, SIG_IGN);
}

mc_status mc_tool_stdin_path(char **out, const char *no_pipe, const char *empty, mc_error *err)
{
    if (mc_read_stdin_line(out, err))
        return mc_error_set(err, MC_ERR_USAGE, "%s", no_pipe);
    if (!*out)
        return mc_error_set(err, MC_ERR_USAGE, "%s", empty);
    return MC_OK;
}

int mc_tool_usage(const mc_logger *lg, const mc_error *err)
{
    mc_log_error(lg, "%s (try '%s --help')", err->msg, lg->prog);
    return 2;
}

int mc_tool_exit(const mc_logger *lg, int rc)
{
    if (fflush(stdout) != 0 && rc == 0) {
        mc_log_error(lg, "stdout: write failed");
        rc = 1;
    }
    return rc;
}
