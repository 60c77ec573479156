/*
 * watchdog.c - the deadline of every blocking collective (issue 4, faults):
 * the main thread notes when it enters and leaves each blocking call, and a
 * thread of ours aborts the whole job (one line on stderr, then MPI_Abort)
 * when a call outlasts --distributed-timeout-minutes, so a dead or stuck rank
 * never hangs it. See doc/ARCHITECTURE.md, "Communication". Also the test
 * hook MC_TEST_FAULT_COMM (a rank that kills or stops itself entering a
 * chosen call; mc-train(1), ENVIRONMENT).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm_internal.h"

struct mc_watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the thread early: stop */
    int rank;
    double minutes;
    char prog[64];
    int stop;
    /* the call in progress, if any */
    int active;
    const char *op;
    mc_group_kind kind;
    int peer; /* point to point: the other end's world rank; else -1 */
    struct timespec start;
    /* MC_TEST_FAULT_COMM=RANK:OP:N:KILL|STOP: this rank's calls of op seen */
    int fault_sig;
    char fault_op[48];
    long fault_n, fault_seen;
};

static double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* Check often enough that a hang is caught within ~5% past the deadline,
 * but at most once a second. */
static double check_interval(double minutes)
{
    double s = minutes * 60.0 / 20.0;
    return s > 1.0 ? 1.0 : s < 0.01 ? 0.01 : s;
}

static void expire(struct mc_watchdog *wd)
{
    char mins[32];
    if (wd->minutes >= 1.0 && wd->minutes == floor(wd->minutes))
        snprintf(mins, sizeof mins, "%.1f", wd->minutes);
    else
        snprintf(mins, sizeof mins, "%g", wd->minutes);
    char peer[48] = "";
    if (wd->peer >= 0)
        snprintf(peer, sizeof peer, " %s rank %d", strcmp(wd->op, "send") ? "from" : "to",
                 wd->peer);
    fprintf(stderr,
            "%s: error: rank %d: %s%s on the %s did not complete within %s minutes; "
            "a rank may have died\n",
            wd->prog, wd->rank, wd->op, peer, mc_group_name(wd->kind), mins);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1); /* MPI_Abort does not return; in case it does */
}

static void *watch(void *arg)
{
    struct mc_watchdog *wd = arg;
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        double dt = check_interval(wd->minutes);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long ns = until.tv_nsec + (long)(dt * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&wd->cv, &wd->mu, &until);
        if (!wd->stop && wd->active && since(&wd->start) > wd->minutes * 60.0) {
            pthread_mutex_unlock(&wd->mu);
            expire(wd);
        }
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

/* MC_TEST_FAULT_COMM=RANK:OP:N:KILL|STOP: world rank RANK raises SIGKILL or
 * SIGSTOP on itself as it enters its Nth call of OP (a name of the
 * watchdog's messages: all-reduce, send, receive, ...), so that a test
 * kills or freezes a rank at a chosen place, whatever the timing. */
static mc_status fault_parse(struct mc_watchdog *wd, mc_error *err)
{
    const char *v = getenv("MC_TEST_FAULT_COMM");
    if (!v) return MC_OK;
    int rank, used = 0;
    long n;
    char op[48], sig[8];
    if (sscanf(v, "%d:%47[^:]:%ld:%7[A-Z]%n", &rank, op, &n, sig, &used) != 4 || v[used] != '\0' ||
        rank < 0 || n < 1 || (strcmp(sig, "KILL") && strcmp(sig, "STOP")))
        return mc_error_set(err, MC_ERR_USAGE,
                            "MC_TEST_FAULT_COMM: '%s' is not RANK:OP:N:KILL or RANK:OP:N:STOP", v);
    if (rank != wd->rank) return MC_OK;
    wd->fault_sig = strcmp(sig, "KILL") ? SIGSTOP : SIGKILL;
    snprintf(wd->fault_op, sizeof wd->fault_op, "%s", op);
    wd->fault_n = n;
    return MC_OK;
}

mc_status mc_watchdog_start(mc_watchdog **out, int rank, double minutes, mc_error *err)
{
    struct mc_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd) return mc_error_set(err, MC_ERR_NOMEM, "watchdog: out of memory");
    wd->rank = rank;
    mc_status st = fault_parse(wd, err);
    if (st) {
        free(wd);
        return st;
    }
    wd->minutes = minutes;
    snprintf(wd->prog, sizeof wd->prog, "%s", program_invocation_short_name);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&wd->mu, NULL);
    int rc = pthread_create(&wd->thread, NULL, watch, wd);
    if (rc) {
        pthread_cond_destroy(&wd->cv);
        pthread_mutex_destroy(&wd->mu);
        free(wd);
        return mc_error_errno(err, MC_ERR_INTERNAL, rc, "watchdog: cannot start its thread");
    }
    *out = wd;
    return MC_OK;
}

mc_status mc_watchdog_start_like(const mc_watchdog *like, mc_watchdog **out, mc_error *err)
{
    mc_watchdog *src = (mc_watchdog *)like;
    pthread_mutex_lock(&src->mu);
    double minutes = src->minutes;
    char prog[sizeof src->prog];
    memcpy(prog, src->prog, sizeof prog);
    pthread_mutex_unlock(&src->mu);
    mc_status st = mc_watchdog_start(out, src->rank, minutes, err);
    if (!st) mc_watchdog_configure(*out, minutes, prog);
    return st;
}

void mc_watchdog_configure(mc_watchdog *wd, double minutes, const char *prog)
{
    pthread_mutex_lock(&wd->mu);
    wd->minutes = minutes;
    if (prog) snprintf(wd->prog, sizeof wd->prog, "%s", prog);
    pthread_cond_signal(&wd->cv); /* a shorter interval starts now */
    pthread_mutex_unlock(&wd->mu);
}

void mc_watchdog_enter_peer(mc_watchdog *wd, const char *op, mc_group_kind k, int peer)
{
    if (!wd) return;
    pthread_mutex_lock(&wd->mu);
    wd->active = 1;
    wd->op = op;
    wd->kind = k;
    wd->peer = peer;
    clock_gettime(CLOCK_MONOTONIC, &wd->start);
    int fault = wd->fault_sig && !strcmp(op, wd->fault_op) && ++wd->fault_seen == wd->fault_n;
    pthread_mutex_unlock(&wd->mu);
    if (fault) {
        fprintf(stderr, "%s: MC_TEST_FAULT_COMM: rank %d raises SIG%s entering %s %ld\n", wd->prog,
                wd->rank, wd->fault_sig == SIGKILL ? "KILL" : "STOP", op, wd->fault_n);
        fflush(stderr);
        raise(wd->fault_sig);
    }
}

void mc_watchdog_enter(mc_watchdog *wd, const char *op, mc_group_kind k)
{
    mc_watchdog_enter_peer(wd, op, k, -1);
}

void mc_watchdog_leave(mc_watchdog *wd)
{
    if (!wd) return;
    pthread_mutex_lock(&wd->mu);
    wd->active = 0;
    pthread_mutex_unlock(&wd->mu);
}

void mc_watchdog_stop(mc_watchdog *wd)
{
    if (!wd) return;
    pthread_mutex_lock(&wd->mu);
    wd->stop = 1;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    free(wd);
}
