/*
 * interrupt.c - SIGINT, SIGTERM and SIGHUP for the tools that write files
 * (file.h): the count of temporary outputs that exist, and the handler that
 * kills the process at once when there are none, or else notes the signal so
 * that the writer cleans up and the tool dies of it on exit (the steps are
 * above on_signal; doc/ARCHITECTURE.md, section 5, "Files").
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "mc/file.h"

static atomic_int temps;              /* temporaries that exist now */
static volatile sig_atomic_t pending; /* the signal noted, 0: none */

/* While no temporary output exists, such a signal kills the process as it
 * would without a handler: nothing is left behind. While one exists (an
 * mc_afile's NAME.tmp.XXXXXX, a checkpoint's or an export's hidden temporary
 * directory), the signal is noted instead; the next write fails with
 * "interrupted by SIG...", the writer's error path removes its temporaries
 * as after any failed write, and the tool, once it has reported the error
 * and exits, dies of the same signal (an atexit handler,
 * mc_interrupt_reraise), so the shell and SLURM see the usual 128 + N. A
 * second signal while the first is pending kills at once. */
static void on_signal(int sig)
{
    if (pending || atomic_load(&temps) == 0) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    pending = sig;
}

void mc_interrupt_install(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    static int done;
    if (done++) return;
    /* the tool reports the error and returns from main; then it dies of
     * the signal */
    atexit(mc_interrupt_reraise);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        /* a signal the caller's shell ignores (nohup, a background job's
         * SIGINT) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

/* MC_TEST_STOP_AT_TEMP=N in the environment (N >= 1; any other non-empty
 * value but 0 means 1): the process stops itself (SIGSTOP) when it counts
 * its Nth temporary, so a test can send a signal at exactly that point and
 * then SIGCONT, whatever the machine's speed (tests/tools/interrupt.bats;
 * kill_campaign.bats stops mc-train --async-save in its third save). */
static void stop_for_test(void)
{
    static atomic_int seen;
    const char *v = getenv("MC_TEST_STOP_AT_TEMP");
    if (!v || !*v || *v == '0') return;
    int n = atoi(v);
    if (atomic_fetch_add(&seen, 1) + 1 == (n > 0 ? n : 1)) raise(SIGSTOP);
}

void mc_temp_begin(void)
{
    atomic_fetch_add(&temps, 1);
    stop_for_test();
}
void mc_temp_end(void) { atomic_fetch_sub(&temps, 1); }

int mc_interrupt_signal(void) { return pending; }

volatile sig_atomic_t *mc_interrupt_flag(void) { return &pending; }

mc_status mc_interrupt_check(const char *what, mc_error *err)
{
    int sig = pending;
    if (!sig) return MC_OK;
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
    return mc_error_set(err, MC_ERR_IO, "%s: interrupted by %s; the temporary output was removed",
                        what ? what : "(output)", name);
}

void mc_interrupt_reraise(void)
{
    int sig = pending;
    if (!sig) return;
    signal(sig, SIG_DFL);
    raise(sig);
}
