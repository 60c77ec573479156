/*
 * tool.c - the start and the end every tool shares (tool.h): logger and
 * signals (mc-train's graceful stop among them), the path on stdin, the
 * usage message, the flush of stdout. The stop flag is the one global:
 * a signal handler has nowhere else to write.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/tool.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "mc/file.h"

void mc_tool_start(mc_logger *lg, const char *prog, unsigned flags)
{
    mc_logger_init(lg, prog);
    if (flags & MC_TOOL_INTERRUPT) mc_interrupt_install();
    if (flags & MC_TOOL_EFBIG) signal(SIGXFSZ, SIG_IGN);
}

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    stop_requested = 1;
    signal(sig, SIG_DFL);
}

volatile sig_atomic_t *mc_tool_stop_on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return &stop_requested;
}

mc_status mc_tool_stdin_path(char **out, const char *no_pipe, const char *empty, mc_error *err)
{
    if (mc_read_stdin_line(out, err)) return mc_error_set(err, MC_ERR_USAGE, "%s", no_pipe);
    if (!*out) return mc_error_set(err, MC_ERR_USAGE, "%s", empty);
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
