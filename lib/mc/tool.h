/*
 * tool.h - what every mc tool does alike around its options and calls: the
 * start (logger and signals), the pipeline's input path on stdin, the usage
 * error's message and the last flush of stdout at exit.
 */
#ifndef MC_TOOL_H
#define MC_TOOL_H

#include <signal.h>
#include "mc/log.h"
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    /* mc_interrupt_install (file.h): SIGINT, SIGTERM and SIGHUP remove the
     * temporaries, then kill. Not for mc-train, which finishes the
     * iteration and saves on SIGTERM/SIGINT itself. */
    MC_TOOL_INTERRUPT = 1 << 0,
    /* SIGXFSZ ignored: a file-size limit fails the write (EFBIG) with a
     * message naming the file, and the temporaries go, instead of a kill. */
    MC_TOOL_EFBIG = 1 << 1
};

/* The first thing in a tool's main: lg set up for prog, and the signal
 * handling of flags. */
void mc_tool_start(mc_logger *lg, const char *prog, unsigned flags);

/* mc-train's signals, installed when training starts: the first SIGTERM or
 * SIGINT sets the flag returned (the loop finishes the iteration, saves
 * and exits 0, as Megatron's --exit-signal-handler); the default action
 * comes back at once, so a second signal ends the process. */
volatile sig_atomic_t *mc_tool_stop_on_signals(void);

/* The pipeline contract's input (a tool reads the path the previous one
 * printed): the next non-blank line of stdin, malloc'd into *out
 * (mc_read_stdin_line). MC_ERR_USAGE with the tool's words when stdin is a
 * terminal (no_pipe) or holds no path (empty). */
mc_status mc_tool_stdin_path(char **out, const char *no_pipe, const char *empty, mc_error *err);

/* "PROG: error: MSG (try 'PROG --help')" for a usage error; returns its
 * exit status, 2. */
int mc_tool_usage(const mc_logger *lg, const mc_error *err);

/* The last flush of stdout before exiting with status rc: when it fails
 * and rc is 0, "PROG: error: stdout: write failed" and 1. Returns the
 * status to exit with. */
int mc_tool_exit(const mc_logger *lg, int rc);

#ifdef __cplusplus
}
#endif
#endif
