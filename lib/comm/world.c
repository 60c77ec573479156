/*
 * world.c - control over the world for the library's own protocols outside
 * the training step (the collective checkpoint writer, agreeing on a
 * load): status agreement, gathering and broadcasting host bytes, the
 * deadline around another library's collectives (parallel HDF5), and the
 * world communicator for it (mc/comm_mpi.h).
 *
 * Everything runs on the world communicator from the calling thread, each
 * blocking MPI call under the watchdog as the caller's op; none of it is
 * counted in mc/comm_stats.h (not the training's traffic). A grid without
 * MPI (one process) makes no MPI call.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm_internal.h"
#include "mc/comm_mpi.h"

/* The transport when there is anyone to talk to, else NULL. */
static mc_comm *world_of(const mc_grid *g) { return g && g->world > 1 && g->impl ? g->impl : NULL; }

mc_status mc_grid_status_all(const mc_grid *g, mc_status st, const char *op, mc_error *err)
{
    mc_comm *cm = world_of(g);
    if (!cm) return st;
    MPI_Comm c = cm->comm[MC_GROUP_WORLD];
    int mine = st != MC_OK ? g->rank : INT_MAX, first = INT_MAX;
    mc_watchdog_enter(cm->wd, op, MC_GROUP_WORLD);
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c);
    mc_watchdog_leave(cm->wd);
    if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, op, MC_GROUP_WORLD);
    if (first == INT_MAX) return MC_OK;
    struct {
        int code;
        char msg[MC_ERROR_MSG_MAX];
    } m;
    memset(&m, 0, sizeof m);
    if (g->rank == first) {
        m.code = st;
        snprintf(m.msg, sizeof m.msg, "%s", err && err->msg[0] ? err->msg : "failed");
    }
    mc_watchdog_enter(cm->wd, op, MC_GROUP_WORLD);
    rc = MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, first, c);
    mc_watchdog_leave(cm->wd);
    if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, op, MC_GROUP_WORLD);
    return mc_error_set(err, (mc_status)m.code, "rank %d: %.1000s", first, m.msg);
}

mc_status mc_grid_allgather_bytes(const mc_grid *g, const void *in, size_t n, const char *op,
                                  unsigned char **all, size_t **off, mc_error *err)
{
    *all = NULL;
    *off = NULL;
    mc_comm *cm = world_of(g);
    size_t P = cm ? (size_t)g->world : 1;
    size_t *o = malloc((P + 1) * sizeof *o);
    if (!cm) {
        unsigned char *a = malloc(n ? n : 1);
        if (!o || !a) {
            free(o);
            free(a);
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", op);
        }
        if (n) memcpy(a, in, n);
        o[0] = 0;
        o[1] = n;
        *all = a;
        *off = o;
        return MC_OK;
    }
    MPI_Comm c = cm->comm[MC_GROUP_WORLD];
    uint64_t mine = n, *len = malloc(P * sizeof *len);
    int *cnt = malloc(2 * P * sizeof *cnt), *dsp = cnt ? cnt + P : NULL;
    unsigned char *a = NULL;
    int rc = MPI_SUCCESS;
    mc_status st = o && len && cnt ? MC_OK
                                   : mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", op);
    /* Every rank knows the others can take part before the first gather. */
    if (!(st = mc_grid_status_all(g, st, op, err))) {
        mc_watchdog_enter(cm->wd, op, MC_GROUP_WORLD);
        rc = MPI_Allgather(&mine, 1, MPI_UINT64_T, len, 1, MPI_UINT64_T, c);
        mc_watchdog_leave(cm->wd);
        if (rc != MPI_SUCCESS) st = mc_comm_mpi_error(err, rc, op, MC_GROUP_WORLD);
    }
    if (rc == MPI_SUCCESS && !st) {
        /* The lengths are the same everywhere: so is the total. */
        uint64_t total = 0;
        for (size_t r = 0; r < P; r++) {
            o[r] = (size_t)total;
            total += len[r];
        }
        o[P] = (size_t)total;
        if (total > INT_MAX)
            st = mc_error_set(err, MC_ERR_LIMIT,
                              "%s: %llu bytes from the ranks together are over MPI's limit of %d",
                              op, (unsigned long long)total, INT_MAX);
        else if (!(a = malloc(total ? (size_t)total : 1)))
            st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", op);
        for (size_t r = 0; r < P && !st; r++) {
            cnt[r] = (int)len[r];
            dsp[r] = (int)o[r];
        }
        if (!(st = mc_grid_status_all(g, st, op, err))) {
            mc_watchdog_enter(cm->wd, op, MC_GROUP_WORLD);
            rc = MPI_Allgatherv(in, (int)n, MPI_BYTE, a, cnt, dsp, MPI_BYTE, c);
            mc_watchdog_leave(cm->wd);
            if (rc != MPI_SUCCESS) st = mc_comm_mpi_error(err, rc, op, MC_GROUP_WORLD);
        }
    }
    free(len);
    free(cnt);
    if (st) {
        free(a);
        free(o);
        return st;
    }
    *all = a;
    *off = o;
    return MC_OK;
}

mc_status mc_grid_broadcast_bytes(const mc_grid *g, void *x, size_t n, int root, const char *op,
                                  mc_error *err)
{
    mc_comm *cm = world_of(g);
    if (!cm || n == 0) return MC_OK;
    if (root < 0 || root >= g->world)
        return mc_error_set(err, MC_ERR_INTERNAL, "%s on the %s: no rank %d", op,
                            mc_group_name(MC_GROUP_WORLD), root);
    if (n > (size_t)INT_MAX)
        return mc_error_set(err, MC_ERR_LIMIT, "%s on the %s: %zu bytes are over MPI's limit of %d",
                            op, mc_group_name(MC_GROUP_WORLD), n, INT_MAX);
    mc_watchdog_enter(cm->wd, op, MC_GROUP_WORLD);
    int rc = MPI_Bcast(x, (int)n, MPI_BYTE, root, cm->comm[MC_GROUP_WORLD]);
    mc_watchdog_leave(cm->wd);
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, op, MC_GROUP_WORLD);
}

mc_status mc_grid_broadcast_idle(const mc_grid *g, void *x, size_t n, int root, const char *op,
                                 mc_error *err)
{
    mc_comm *cm = world_of(g);
    if (!cm || n == 0) return MC_OK;
    if (root < 0 || root >= g->world || n > (size_t)INT_MAX)
        return mc_error_set(err, MC_ERR_INTERNAL, "%s on the %s: root %d, %zu bytes", op,
                            mc_group_name(MC_GROUP_WORLD), root, n);
    MPI_Request rq;
    int rc = MPI_Ibcast(x, (int)n, MPI_BYTE, root, cm->comm[MC_GROUP_WORLD], &rq);
    for (int done = 0, spins = 0; rc == MPI_SUCCESS;) {
        rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        if (done) break;
        /* answer at once while steps follow each other; nap when idle */
        if (++spins > 1000) {
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, op, MC_GROUP_WORLD);
}

void mc_grid_deadline_begin(const mc_grid *g, const char *op)
{
    mc_comm *cm = world_of(g);
    if (cm) mc_watchdog_enter(cm->wd, op, MC_GROUP_WORLD);
}

void mc_grid_deadline_end(const mc_grid *g)
{
    mc_comm *cm = world_of(g);
    if (cm) mc_watchdog_leave(cm->wd);
}

MPI_Comm mc_grid_world_comm(const mc_grid *g)
{
    const mc_comm *cm = g ? g->impl : NULL;
    return cm ? cm->comm[MC_GROUP_WORLD] : MPI_COMM_NULL;
}
