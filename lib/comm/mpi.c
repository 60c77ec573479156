/*
 * mpi.c - the grid over MPI: start-up, the communicator of every group (an
 * MPI_Comm_split of the world keyed by world rank), the configuration check,
 * and leaving the job: cleanly, every rank together, after an error all met,
 * or with MPI_Abort after an error of one rank. Why, and what Open MPI's
 * mpirun does when a rank dies: doc/ARCHITECTURE.md, "Communication".
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm_internal.h"

/* Tasks of the srun job step this process belongs to (0: not a task of a
 * step; the batch script itself has SLURM_NTASKS but no step). */
static long slurm_step_tasks(void)
{
    const char *n = getenv("SLURM_STEP_NUM_TASKS");
    if (!n || !getenv("SLURM_STEP_ID")) return 0;
    return strtol(n, NULL, 10);
}

/* mpirun/mpiexec (Open MPI's OMPI_*, or PMIx's PMIX_RANK), srun --mpi=pmix
 * (PMIX_RANK) or --mpi=pmi2 (PMI_RANK), or a multi-task srun step without
 * an MPI plugin (SLURM_STEP_*): then MPI starts rather than each task
 * training alone. Open MPI 4.1's MPI_Init refuses that last case itself
 * ("direct launched using srun ... without PMI support", exit 1); an MPI
 * that makes each task a world of one is refused by mc_grid_init_mpi. */
int mc_grid_launched_by_mpi(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return slurm_step_tasks() > 1;
}

/* The color of this rank's group of kind k: the coordinates outside the
 * group, or MPI_UNDEFINED for a rank that is no member. */
static int color_of(const mc_grid *g, mc_group_kind k)
{
    int TP = g->tp, CP = g->cp, DP = g->dp, EP = g->ep, EDP = g->dp / g->ep;
    int tp = g->tp_rank, cp = g->cp_rank, dp = g->dp_rank, pp = g->pp_rank;
    int ep = g->ep_rank, edp = g->dp_rank / g->ep;
    switch (k) {
    case MC_GROUP_WORLD: return 0;
    case MC_GROUP_TP: return cp + CP * (dp + DP * pp);
    case MC_GROUP_PP: return tp + TP * (cp + CP * dp);
    case MC_GROUP_DP: return tp + TP * (cp + CP * pp);
    case MC_GROUP_CP: return tp + TP * (dp + DP * pp);
    case MC_GROUP_DP_CP: return tp + TP * pp;
    case MC_GROUP_MP: return cp + CP * dp;
    case MC_GROUP_EMBD:
    case MC_GROUP_POS_EMBD:
        return mc_grid_in_group(g, k) ? tp + TP * (cp + CP * dp) : MPI_UNDEFINED;
    case MC_GROUP_EP: return tp + TP * (cp + CP * (edp + EDP * pp));
    case MC_GROUP_EDP: return tp + TP * (ep + EP * pp); /* dp / ep x cp */
    case MC_GROUP_MP_EP: return cp + CP * edp;
    case MC_GROUP_ETP: /* etp consecutive ranks of the TP group */
        return tp / g->etp + TP / g->etp * (cp + CP * (dp + DP * pp));
    case MC_GROUP_ETP_REP: return tp % g->etp + g->etp * (cp + CP * (dp + DP * pp));
    default: return MPI_UNDEFINED;
    }
}

static void free_comm(mc_comm *cm)
{
    mc_nccl_free(cm->nccl); /* before the MPI communicators it was made over */
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        if (cm->comm[k] != MPI_COMM_NULL) MPI_Comm_free(&cm->comm[k]);
    mc_scratch_free(&cm->scratch);
    mc_scratch_free(&cm->host_scratch);
    free(cm->stage);
    if (cm->host_be) mc_backend_free(cm->host_be);
    free(cm);
}

static mc_status split_groups(mc_grid *g, mc_comm *cm, int k0, int k1, mc_error *err)
{
    for (int k = k0; k < k1; k++) {
        int rc = MPI_Comm_split(MPI_COMM_WORLD, color_of(g, k), g->rank, &cm->comm[k]);
        if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, "split", k);
        if (cm->comm[k] == MPI_COMM_NULL) continue;
        MPI_Comm_set_errhandler(cm->comm[k], MPI_ERRORS_RETURN);
        int size, rank;
        MPI_Comm_size(cm->comm[k], &size);
        MPI_Comm_rank(cm->comm[k], &rank);
        if (size != mc_grid_group_size(g, k) || rank != mc_grid_group_rank(g, k))
            return mc_error_set(err, MC_ERR_INTERNAL,
                                "rank %d: the %s has %d members and this rank is %d in it, "
                                "the grid says %d and %d",
                                g->rank, mc_group_name(k), size, rank, mc_grid_group_size(g, k),
                                mc_grid_group_rank(g, k));
    }
    return MC_OK;
}

mc_status mc_grid_init_mpi(int *argc, char ***argv, int tp, int pp, int cp, int ep, mc_grid *g,
                           mc_error *err)
{
    mc_grid_single(g);
    mc_comm *cm = calloc(1, sizeof *cm);
    if (!cm) return mc_error_set(err, MC_ERR_NOMEM, "grid: out of memory");
    for (int k = 0; k < MC_GROUP_COUNT; k++) cm->comm[k] = MPI_COMM_NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &cm->thread_level);
        cm->own_mpi = 1;
    } else {
        MPI_Query_thread(&cm->thread_level);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &g->world);
    MPI_Comm_rank(MPI_COMM_WORLD, &g->rank);
    g->impl = cm;

    /* srun without an MPI plugin (MpiDefault=none, --mpi=none): every task
     * is a world of one. Agreed by construction: each task is its rank 0. */
    long step = slurm_step_tasks();
    if (g->world == 1 && step > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "grid: srun started %ld tasks but MPI sees 1 rank: launch with "
                            "srun --mpi=pmix (srun --mpi=list shows the plugins) or mpirun",
                            step);

    /* How device memory travels (comm_internal.h, mc_comm_path). */
    const char *dc = getenv("MC_DEVICE_COMM");
    if (dc && *dc && strcmp(dc, "nccl") != 0 && strcmp(dc, "mpi") != 0)
        return mc_error_set(err, MC_ERR_USAGE, "grid: MC_DEVICE_COMM=%s: expected nccl or mpi", dc);
    cm->device_mpi = dc && !strcmp(dc, "mpi");
    /* For tests (parallel_ep.bats): host memory takes the staged path too,
     * so a CPU run checks it end to end against the host path's bits. */
    const char *sh = getenv("MC_TEST_STAGE_HOST");
    if (sh && !strcmp(sh, "1")) mc_comm_set_staging(1);

    /* Checked after MPI_Init, so every rank can report and finalize alike. */
    if (tp < 1 || pp < 1 || cp < 1 || ep < 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "grid: every parallel size must be at least 1, not tensor %d, "
                            "pipeline %d, context %d, expert %d",
                            tp, pp, cp, ep);
    long per = (long)tp * pp * cp;
    if (ep == 1 && g->world % per)
        return mc_error_set(err, MC_ERR_USAGE,
                            "grid: %d ranks do not divide into tensor-parallel %d x "
                            "pipeline-parallel %d x context-parallel %d = %ld ranks per "
                            "data-parallel replica",
                            g->world, tp, pp, cp, per);
    if (ep > 1 && g->world % (per * ep))
        return mc_error_set(err, MC_ERR_USAGE,
                            "grid: %d ranks do not divide into tensor-parallel %d x "
                            "pipeline-parallel %d x context-parallel %d x expert-parallel %d = "
                            "%ld ranks per expert-data-parallel replica",
                            g->world, tp, pp, cp, ep, per * ep);
    g->tp = tp, g->pp = pp, g->cp = cp, g->ep = ep;
    g->dp = (int)(g->world / per);
    int r = g->rank;
    g->tp_rank = r % tp, r /= tp;
    g->cp_rank = r % cp, r /= cp;
    g->dp_rank = r % g->dp, r /= g->dp;
    g->pp_rank = r;
    g->ep_rank = g->dp_rank % ep;
    g->etp = tp; /* the experts' TP group is the TP group until mc_grid_set_etp */

    /* Ranks sharing this node's memory: the local rank under any launcher. */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g->local_rank);
    MPI_Comm_free(&node);

    mc_status st = split_groups(g, cm, 0, MC_GROUP_COUNT, err);
    if (!st && g->world > 1) st = mc_watchdog_start(&cm->wd, g->rank, 10.0, err);
    return st;
}

mc_status mc_grid_set_etp(mc_grid *g, int etp, mc_error *err)
{
    if (etp < 1 || g->tp % etp)
        return mc_error_set(err, MC_ERR_USAGE,
                            "grid: expert tensor-parallel size %d does not divide the "
                            "tensor-parallel size %d",
                            etp, g->tp);
    mc_comm *cm = g->impl;
    if (!cm) { /* the single grid: tp = etp = 1 */
        g->etp = etp;
        return MC_OK;
    }
    if (etp == g->etp) return MC_OK;
    for (int k = MC_GROUP_ETP; k <= MC_GROUP_ETP_REP; k++)
        if (cm->comm[k] != MPI_COMM_NULL) MPI_Comm_free(&cm->comm[k]);
    g->etp = etp;
    return split_groups(g, cm, MC_GROUP_ETP, MC_GROUP_ETP_REP + 1, err);
}

mc_status mc_grid_set_timeout(mc_grid *g, double minutes, const char *prog, mc_error *err)
{
    if (!(minutes > 0) || !isfinite(minutes))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--distributed-timeout-minutes: must be a positive number of minutes, "
                            "not %g",
                            minutes);
    mc_comm *cm = g->impl;
    if (cm && cm->wd) mc_watchdog_configure(cm->wd, minutes, prog);
    return MC_OK;
}

void mc_grid_finalize(mc_grid *g)
{
    mc_comm *cm = g->impl;
    if (!cm) return;
    mc_async_free(cm->async);
    /* Leave together, under the deadline: Open MPI's MPI_Finalize waits for
     * every rank too, and a rank that never comes would hang us there. */
    if (cm->wd && cm->comm[MC_GROUP_WORLD] != MPI_COMM_NULL) {
        mc_watchdog_enter(cm->wd, "barrier before MPI_Finalize", MC_GROUP_WORLD);
        MPI_Barrier(cm->comm[MC_GROUP_WORLD]);
        mc_watchdog_leave(cm->wd);
    }
    mc_watchdog *wd = cm->wd;
    int own = cm->own_mpi;
    free_comm(cm);
    if (own) {
        mc_watchdog_enter(wd, "MPI_Finalize", MC_GROUP_WORLD);
        MPI_Finalize();
        mc_watchdog_leave(wd);
    }
    mc_watchdog_stop(wd);
    g->impl = NULL;
}

mc_status mc_grid_dup_world(const mc_grid *g, mc_grid *out, mc_error *err)
{
    *out = *g;
    const mc_comm *cm = g->impl;
    if (!cm || g->world == 1) {
        out->impl = NULL; /* nothing of g's to free twice */
        return MC_OK;
    }
    if (cm->thread_level < MPI_THREAD_MULTIPLE)
        return mc_error_set(err, MC_ERR_USAGE,
                            "the MPI library gives thread level %d, not MPI_THREAD_MULTIPLE: "
                            "no second thread may make MPI calls",
                            cm->thread_level);
    mc_comm *d = calloc(1, sizeof *d);
    if (!d) return mc_error_set(err, MC_ERR_NOMEM, "grid: out of memory");
    for (int k = 0; k < MC_GROUP_COUNT; k++) d->comm[k] = MPI_COMM_NULL;
    d->thread_level = cm->thread_level;
    mc_watchdog_enter(cm->wd, "communicator duplication", MC_GROUP_WORLD);
    int rc = MPI_Comm_dup(cm->comm[MC_GROUP_WORLD], &d->comm[MC_GROUP_WORLD]);
    mc_watchdog_leave(cm->wd);
    mc_status st = rc == MPI_SUCCESS
                       ? MC_OK
                       : mc_comm_mpi_error(err, rc, "communicator duplication", MC_GROUP_WORLD);
    if (!st) MPI_Comm_set_errhandler(d->comm[MC_GROUP_WORLD], MPI_ERRORS_RETURN);
    if (!st && cm->wd) st = mc_watchdog_start_like(cm->wd, &d->wd, err);
    if (st) {
        free_comm(d);
        return st;
    }
    out->impl = d;
    return MC_OK;
}

void mc_grid_free_dup(mc_grid *g)
{
    mc_comm *d = g->impl;
    if (!d || d->own_mpi) return;
    mc_async_free(d->async);
    mc_watchdog *wd = d->wd;
    free_comm(d);
    mc_watchdog_stop(wd);
    g->impl = NULL;
}

int mc_grid_fail(mc_grid *g, int agreed)
{
    mc_comm *cm = g->impl;
    if (cm && !agreed && g->world > 1) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    mc_grid_finalize(g);
    return 1;
}

/* FNV-1a, 64 bits: cheap, and any difference in the bytes shows. */
static uint64_t fnv1a64(const void *bytes, size_t n)
{
    const unsigned char *p = bytes;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

mc_status mc_grid_check_config(const mc_grid *g, const void *bytes, size_t n, mc_error *err)
{
    mc_comm *cm = g->impl;
    if (!cm || g->world <= 1) return MC_OK;
    uint64_t h = fnv1a64(bytes, n);
    uint64_t *all = malloc((size_t)g->world * sizeof *all);
    if (!all) return mc_error_set(err, MC_ERR_NOMEM, "configuration check: out of memory");
    mc_watchdog_enter(cm->wd, "configuration check", MC_GROUP_WORLD);
    int rc = MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, cm->comm[MC_GROUP_WORLD]);
    mc_watchdog_leave(cm->wd);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mc_comm_mpi_error(err, rc, "configuration check", MC_GROUP_WORLD);
    }
    char list[256] = "";
    size_t len = 0;
    int ndiff = 0, first = -1;
    for (int r = 1; r < g->world; r++) {
        if (all[r] == all[0]) continue;
        if (first < 0) first = r;
        if (++ndiff <= 16 && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", ndiff > 1 ? ", " : "",
                                    r);
    }
    mc_status st = MC_OK;
    if (ndiff)
        st = mc_error_set(err, MC_ERR_USAGE,
                          "the ranks disagree on the configuration: rank%s %s%s differ%s from "
                          "rank 0 (configuration hash %016llx, rank %d has %016llx); start every "
                          "rank with the same options",
                          ndiff > 1 ? "s" : "", list, ndiff > 16 ? ", ..." : "",
                          ndiff > 1 ? "" : "s", (unsigned long long)all[0], first,
                          (unsigned long long)all[first]);
    free(all);
    return st;
}

mc_status mc_grid_init_tp_group(int *argc, char ***argv, mc_status st, int64_t tp, int64_t ep,
                                const char *tool, mc_grid *g, int *grid_error, mc_error *err)
{
    mc_grid_single(g);
    *grid_error = 0;
    if (mc_grid_launched_by_mpi()) {
        mc_error gerr;
        mc_error_clear(&gerr);
        mc_status gst = mc_grid_init_mpi(argc, argv, st ? 1 : (int)tp, 1, 1, st ? 1 : (int)ep, g,
                                         &gerr);
        /* a world that is not the grid is bad usage (exit 2); MPI's own
         * failures are the grid's (exit 1) */
        if (!st && gst) *err = gerr, st = gst, *grid_error = gst != MC_ERR_USAGE;
        if (!st && g->world != tp * ep) {
            if (ep > 1)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "%d ranks for --tensor-model-parallel-size %" PRId64
                                  " x --expert-model-parallel-size %" PRId64
                                  ": %s runs one group of %" PRId64 " ranks, start %" PRId64
                                  " ranks",
                                  g->world, tp, ep, tool, tp * ep, tp * ep);
            else
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "%d ranks for --tensor-model-parallel-size %" PRId64
                                  ": %s runs one tensor-parallel group, start %" PRId64 " ranks",
                                  g->world, tp, tool, tp);
        }
    } else if (!st && tp * ep > 1) {
        const char *opt = tp > 1 ? "--tensor-model-parallel-size" : "--expert-model-parallel-size";
        int64_t n = tp > 1 ? tp : ep;
        st = mc_error_set(err, MC_ERR_USAGE,
                          "%s %" PRId64 " needs %" PRId64
                          " ranks and this is one process: start it with mpirun -np %" PRId64
                          " or srun",
                          opt, n, tp * ep, tp * ep);
    }
    return st;
}
