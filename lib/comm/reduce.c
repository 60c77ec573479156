/*
 * reduce.c - the blocking collectives and point-to-point calls over MPI, for
 * host memory (a CUDA backend's device memory goes through nccl.c). Sums are
 * ours, in group-rank order, not MPI_Allreduce's, so they are the same bits
 * on every member and in every run; see doc/ARCHITECTURE.md, "Communication".
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm_internal.h"

mc_status mc_comm_mpi_error(mc_error *err, int rc, const char *op, mc_group_kind k)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    return mc_error_set(err, MC_ERR_IO, "%s on the %s: %s", op, mc_group_name(k), text);
}

mc_status mc_comm_group(const mc_grid *g, mc_group_kind k, mc_backend *be, const char *op,
                        MPI_Comm *c, mc_error *err)
{
    *c = MPI_COMM_NULL;
    if (k < 0 || k >= MC_GROUP_COUNT)
        return mc_error_set(err, MC_ERR_INTERNAL, "%s: no group kind %d", op, (int)k);
    if (!mc_grid_in_group(g, k))
        return mc_error_set(err, MC_ERR_INTERNAL, "%s on the %s: rank %d is not a member", op,
                            mc_group_name(k), g->rank);
    if (mc_grid_group_size(g, k) <= 1) return MC_OK;
    if (!g->impl)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s on the %s: a grid of %d ranks needs the MPI transport "
                            "(mc_grid_init_mpi)",
                            op, mc_group_name(k), g->world);
    /* Device memory cannot go through host MPI as it is: a CUDA backend's
     * goes through NCCL (nccl.c), bootstrapped over this communicator, or
     * is staged (mc_comm_path). */
    if (be && strcmp(mc_backend_name(be), "cpu") != 0 && mc_comm_path(g->impl, be) == MC_PATH_HOST)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s on the %s: %s memory needs NCCL, which is not built", op,
                            mc_group_name(k), mc_backend_name(be));
    *c = ((mc_comm *)g->impl)->comm[k];
    return MC_OK;
}

static mc_status check_count(size_t n, const char *op, mc_group_kind k, mc_error *err)
{
    if (n > (size_t)INT_MAX)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "%s on the %s: %zu elements per rank are over MPI's limit of %d", op,
                            mc_group_name(k), n, INT_MAX);
    return MC_OK;
}

void mc_scratch_free(mc_scratch *s)
{
    if (s->p) mc_bfree(s->be, s->p);
    s->p = NULL;
    s->cap = 0;
    s->be = NULL;
}

static float *scratch(mc_scratch *s, mc_backend *be, size_t n, mc_error *err)
{
    if (n == 0) n = 1;
    if (s->p && s->be == be && s->cap >= n) return s->p;
    mc_scratch_free(s);
    s->p = mc_balloc(be, n * sizeof(float), err);
    if (!s->p) return NULL;
    s->be = be;
    s->cap = n;
    return s->p;
}

/* Chunk j of n over P: n/P elements, one more for the first n%P. */
static void chunks(size_t n, int P, int *cnt, int *off)
{
    size_t base = n / (size_t)P, extra = n % (size_t)P, o = 0;
    for (int j = 0; j < P; j++) {
        size_t c = base + ((size_t)j < extra);
        cnt[j] = (int)c;
        off[j] = (int)o;
        o += c;
    }
}

/* out = sum over j of parts[j*c .. (j+1)*c), j = 0, 1, ..., P-1 in order. */
static void sum_in_order(mc_backend *be, float *out, const float *parts, size_t c, int P)
{
    if (c == 0) return;
    mc_bcopy(be, out, parts, c * sizeof(float));
    for (int j = 1; j < P; j++) mc_k_acc(be, out, parts + (size_t)j * c, c);
}

/* The host collectives below move at most this many floats through their
 * scratch at a time (16 MiB): a gradient all-reduce or reduce-scatter of any
 * size costs no second copy of the gradients, only more calls. Which member
 * sums which element changes with the pieces; the order of each element's
 * sum (group-rank order) does not, so the bits are the same. */
#define PIECE_FLOATS ((size_t)1 << 22)
static size_t piece_floats = PIECE_FLOATS;

void mc_comm_set_piece_floats(size_t n) { piece_floats = n ? n : PIECE_FLOATS; }

/* All-reduce of n floats over P members: an all-to-all gives member j chunk j
 * of every member, in group-rank order; member j sums them in that order
 * (mc_k_acc: ((x_0 + x_1) + x_2) + ...); an all-gather returns the sums. MPI
 * only moves bytes, 2 (P-1)/P n floats per member, a ring's traffic. In
 * pieces of PIECE_FLOATS. */
static mc_status allreduce_piece(MPI_Comm c, mc_group_kind k, float *tmp, int *cnt, mc_backend *be,
                                 float *x, size_t n, int P, int me, mc_error *err)
{
    int *off = cnt + P, *rcnt = off + P, *roff = rcnt + P;
    chunks(n, P, cnt, off);
    for (int j = 0; j < P; j++) rcnt[j] = cnt[me], roff[j] = j * cnt[me];
    int rc = MPI_Alltoallv(x, cnt, off, MPI_FLOAT, tmp, rcnt, roff, MPI_FLOAT, c);
    if (rc == MPI_SUCCESS) {
        sum_in_order(be, x + off[me], tmp, (size_t)cnt[me], P);
        rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt, off, MPI_FLOAT, c);
    }
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "all-reduce", k);
}

mc_status mc_comm_allreduce_sum(MPI_Comm c, mc_group_kind k, mc_scratch *s, mc_backend *be,
                                float *x, size_t n, mc_error *err)
{
    int P, me;
    MPI_Comm_size(c, &P);
    MPI_Comm_rank(c, &me);
    size_t piece = n < piece_floats ? n : piece_floats;
    int *cnt = malloc(4 * (size_t)P * sizeof(int));
    if (!cnt) return mc_error_set(err, MC_ERR_NOMEM, "all-reduce: out of memory");
    mc_status st = MC_OK;
    /* member j's chunk of a piece is at most ceil(piece / P) */
    float *tmp = scratch(s, be, (size_t)P * ((piece + (size_t)P - 1) / (size_t)P), err);
    if (!tmp) st = err ? err->code : MC_ERR_NOMEM;
    for (size_t a = 0; !st && a < n; a += piece)
        st = allreduce_piece(c, k, tmp, cnt, be, x + a, n - a < piece ? n - a : piece, P, me, err);
    free(cnt);
    return st;
}

/* The all-reduce's first two steps: member j keeps the sum of chunk j. In
 * pieces: elements [a, a + m) of every member's chunk at a time, sent as one
 * block of a type whose extent is a whole chunk (no int offsets to
 * overflow). */
mc_status mc_comm_reduce_scatter_sum(MPI_Comm c, mc_group_kind k, mc_scratch *s, mc_backend *be,
                                     const float *in, float *out, size_t n, mc_error *err)
{
    int P;
    MPI_Comm_size(c, &P);
    size_t m = piece_floats / (size_t)P;
    if (m < 1) m = 1;
    if (m > n) m = n;
    float *tmp = scratch(s, be, (size_t)P * m, err);
    if (!tmp) return err ? err->code : MC_ERR_NOMEM;
    int rc = MPI_SUCCESS;
    if (m == n) {
        rc = MPI_Alltoall(in, (int)n, MPI_FLOAT, tmp, (int)n, MPI_FLOAT, c);
        if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, "reduce-scatter", k);
        sum_in_order(be, out, tmp, n, P);
        return MC_OK;
    }
    for (size_t a = 0; a < n && rc == MPI_SUCCESS; a += m) {
        size_t w = n - a < m ? n - a : m;
        MPI_Datatype run, block;
        rc = MPI_Type_contiguous((int)w, MPI_FLOAT, &run);
        if (rc != MPI_SUCCESS) break;
        rc = MPI_Type_create_resized(run, 0, (MPI_Aint)(n * sizeof(float)), &block);
        MPI_Type_free(&run);
        if (rc != MPI_SUCCESS) break;
        if ((rc = MPI_Type_commit(&block)) == MPI_SUCCESS)
            rc = MPI_Alltoall(in + a, 1, block, tmp, (int)w, MPI_FLOAT, c);
        MPI_Type_free(&block);
        if (rc == MPI_SUCCESS) sum_in_order(be, out + a, tmp, w, P);
    }
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "reduce-scatter", k);
}

mc_status mc_comm_allgather(MPI_Comm c, mc_group_kind k, mc_backend *be, const float *in,
                            float *out, size_t n, mc_error *err)
{
    (void)be;
    int me;
    MPI_Comm_rank(c, &me);
    int rc = in == out + (size_t)me * n
                 ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, (int)n, MPI_FLOAT, c)
                 : MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, c);
    if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, "all-gather", k);
    return MC_OK;
}

/* ------------------------------------------------------------ staged */

static int force_staging;

void mc_comm_set_staging(int on) { force_staging = on; }

mc_path mc_comm_path(const mc_comm *cm, const mc_backend *be)
{
    if (!be) return MC_PATH_HOST;
    if (!mc_backend_is_device(be)) return force_staging ? MC_PATH_STAGED : MC_PATH_HOST;
    if (cm && cm->device_mpi) return MC_PATH_STAGED;
    return mc_nccl_wanted(be) ? MC_PATH_NCCL : MC_PATH_STAGED;
}

/* The staged path's host copy of n floats: cm's buffer, grown and kept (a
 * step's gradients would otherwise be a fresh multi-gigabyte allocation,
 * and its page faults, every call); one collective at a time uses it, on
 * the thread that issues them. */
static float *host_floats(mc_comm *cm, size_t n, const char *op, mc_error *err)
{
    if (n > cm->stage_cap || !cm->stage) {
        free(cm->stage);
        cm->stage_cap = 0;
        if (!(cm->stage = malloc(n * sizeof(float) + 1))) {
            mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory staging %zu floats", op, n);
            return NULL;
        }
        cm->stage_cap = n;
    }
    return cm->stage;
}

static mc_backend *host_backend(mc_comm *cm, mc_error *err)
{
    if (!cm->host_be && mc_backend_cpu_new(1, &cm->host_be, err)) cm->host_be = NULL;
    return cm->host_be;
}

mc_status mc_comm_staged_allreduce_sum(mc_comm *cm, MPI_Comm c, mc_group_kind k, mc_backend *be,
                                       float *x, size_t n, mc_error *err)
{
    mc_backend *hb = host_backend(cm, err);
    if (!hb) return err ? err->code : MC_ERR_NOMEM;
    float *h = host_floats(cm, n, "all-reduce", err);
    if (!h) return MC_ERR_NOMEM;
    mc_bcopy_to_host(be, h, x, n * sizeof(float));
    mc_status st = mc_comm_allreduce_sum(c, k, &cm->host_scratch, hb, h, n, err);
    if (!st) mc_bcopy_from_host(be, x, h, n * sizeof(float));
    return st;
}

mc_status mc_comm_staged_reduce_scatter_sum(mc_comm *cm, MPI_Comm c, mc_group_kind k,
                                            mc_backend *be, const float *in, float *out, size_t n,
                                            mc_error *err)
{
    int P;
    MPI_Comm_size(c, &P);
    mc_backend *hb = host_backend(cm, err);
    if (!hb) return err ? err->code : MC_ERR_NOMEM;
    float *h = host_floats(cm, (size_t)P * n + n, "reduce-scatter", err);
    if (!h) return MC_ERR_NOMEM;
    mc_bcopy_to_host(be, h, in, (size_t)P * n * sizeof(float));
    mc_status st = mc_comm_reduce_scatter_sum(c, k, &cm->host_scratch, hb, h, h + (size_t)P * n, n,
                                              err);
    if (!st) mc_bcopy_from_host(be, out, h + (size_t)P * n, n * sizeof(float));
    return st;
}

mc_status mc_comm_staged_allgather(mc_comm *cm, MPI_Comm c, mc_group_kind k, mc_backend *be,
                                   const float *in, float *out, size_t n, mc_error *err)
{
    int P, me;
    MPI_Comm_size(c, &P);
    MPI_Comm_rank(c, &me);
    float *h = host_floats(cm, (size_t)P * n, "all-gather", err);
    if (!h) return MC_ERR_NOMEM;
    /* this member's block in place, as the host path does it */
    mc_bcopy_to_host(be, h + (size_t)me * n, in, n * sizeof(float));
    mc_status st = mc_comm_allgather(c, k, NULL, h + (size_t)me * n, h, n, err);
    if (!st) mc_bcopy_from_host(be, out, h, (size_t)P * n * sizeof(float));
    return st;
}

/* ------------------------------------------------------------ entry points */

/* Blocking calls wait for the group's queued non-blocking work first (so the
 * order on the communicator is the issue order) and run under the deadline. */
#define BEGIN_PEER(op, k, peer)                                                   \
    mc_comm *cm = g->impl;                                                        \
    double t0_ = mc_comm_now();                                                   \
    if (mc_async_busy(cm, k) && (st = mc_async_drain(cm, k, op, err))) return st; \
    mc_watchdog_enter_peer(cm->wd, op, k, peer)
#define BEGIN(op, k) BEGIN_PEER(op, k, -1)
/* Leave the deadline and count the call (stats.c): kind, bytes handed,
 * bytes this rank sent, the time blocked since BEGIN (a drain included). */
#define END(kind, bytes, wire) \
    mc_watchdog_leave(cm->wd); \
    mc_comm_count(cm, k, kind, bytes, wire, mc_comm_now() - t0_)

mc_status mc_allreduce_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, "all-reduce", &c, err);
    if (st || c == MPI_COMM_NULL || n == 0) return st;
    if ((st = check_count(n, "all-reduce", k, err))) return st;
    BEGIN("all-reduce", k);
    switch (mc_comm_path(cm, be)) {
    case MC_PATH_NCCL:
        st = mc_nccl_run(cm, k, be, MC_NCCL_ALLREDUCE_SUM, x, x, n, 0, NULL, err);
        break;
    case MC_PATH_STAGED: st = mc_comm_staged_allreduce_sum(cm, c, k, be, x, n, err); break;
    default: st = mc_comm_allreduce_sum(c, k, &cm->scratch, be, x, n, err);
    }
    END(MC_COLL_ALLREDUCE, 4.0 * (double)n,
        mc_comm_allreduce_wire(n, mc_grid_group_size(g, k), mc_grid_group_rank(g, k)));
    return st;
}

/* A maximum is exact in any order, so MPI's own reduction serves. */
mc_status mc_allreduce_max(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                           mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, "all-reduce (max)", &c, err);
    if (st || c == MPI_COMM_NULL || n == 0) return st;
    if ((st = check_count(n, "all-reduce (max)", k, err))) return st;
    BEGIN("all-reduce (max)", k);
    int rc = MPI_SUCCESS;
    mc_path path = mc_comm_path(cm, be);
    float *h = x;
    if (path == MC_PATH_NCCL) {
        st = mc_nccl_run(cm, k, be, MC_NCCL_ALLREDUCE_MAX, x, x, n, 0, NULL, err);
    } else if (path == MC_PATH_STAGED && !(h = host_floats(cm, n, "all-reduce (max)", err))) {
        st = MC_ERR_NOMEM;
    } else {
        if (h != x) mc_bcopy_to_host(be, h, x, n * sizeof(float));
        rc = MPI_Allreduce(MPI_IN_PLACE, h, (int)n, MPI_FLOAT, MPI_MAX, c);
        if (h != x && rc == MPI_SUCCESS) mc_bcopy_from_host(be, x, h, n * sizeof(float));
    }
    int P = mc_grid_group_size(g, k);
    END(MC_COLL_ALLREDUCE, 4.0 * (double)n, 4.0 * 2.0 * (P - 1) / P * (double)n);
    if (st) return st;
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "all-reduce (max)", k);
}

/* Host doubles, few of them: gather every member's and sum in rank order. */
mc_status mc_allreduce_sum_f64(const mc_grid *g, mc_group_kind k, double *x, size_t n,
                               mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, NULL, "all-reduce", &c, err);
    if (st || c == MPI_COMM_NULL || n == 0) return st;
    if ((st = check_count(n, "all-reduce", k, err))) return st;
    int P = mc_grid_group_size(g, k);
    double *all = malloc((size_t)P * n * sizeof(double));
    if (!all) return mc_error_set(err, MC_ERR_NOMEM, "all-reduce: out of memory");
    BEGIN("all-reduce", k);
    int rc = MPI_Allgather(x, (int)n, MPI_DOUBLE, all, (int)n, MPI_DOUBLE, c);
    END(MC_COLL_SCALAR, 8.0 * (double)n, 8.0 * (double)(P - 1) * (double)n);
    if (rc == MPI_SUCCESS)
        for (size_t i = 0; i < n; i++) {
            double s = all[i];
            for (int j = 1; j < P; j++) s += all[(size_t)j * n + i];
            x[i] = s;
        }
    free(all);
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "all-reduce", k);
}

mc_status mc_allgather(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                       float *out, size_t n, mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, "all-gather", &c, err);
    if (st || n == 0) return st;
    if (c == MPI_COMM_NULL) {
        if (in != out) mc_bcopy(be, out, in, n * sizeof(float));
        return MC_OK;
    }
    if ((st = check_count(n, "all-gather", k, err))) return st;
    BEGIN("all-gather", k);
    switch (mc_comm_path(cm, be)) {
    case MC_PATH_NCCL:
        st = mc_nccl_run(cm, k, be, MC_NCCL_ALLGATHER, in, out, n, 0, NULL, err);
        break;
    case MC_PATH_STAGED: st = mc_comm_staged_allgather(cm, c, k, be, in, out, n, err); break;
    default: st = mc_comm_allgather(c, k, be, in, out, n, err);
    }
    double P = mc_grid_group_size(g, k);
    END(MC_COLL_ALLGATHER, 4.0 * P * (double)n, 4.0 * (P - 1) * (double)n);
    return st;
}

mc_status mc_reduce_scatter_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                                float *out, size_t n, mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, "reduce-scatter", &c, err);
    if (st || n == 0) return st;
    if (c == MPI_COMM_NULL) {
        if (in != out) mc_bcopy(be, out, in, n * sizeof(float));
        return MC_OK;
    }
    if ((st = check_count(n, "reduce-scatter", k, err))) return st;
    BEGIN("reduce-scatter", k);
    switch (mc_comm_path(cm, be)) {
    case MC_PATH_NCCL:
        st = mc_nccl_run(cm, k, be, MC_NCCL_REDUCE_SCATTER, in, out, n, 0, NULL, err);
        break;
    case MC_PATH_STAGED:
        st = mc_comm_staged_reduce_scatter_sum(cm, c, k, be, in, out, n, err);
        break;
    default: st = mc_comm_reduce_scatter_sum(c, k, &cm->scratch, be, in, out, n, err);
    }
    double P = mc_grid_group_size(g, k);
    END(MC_COLL_REDUCE_SCATTER, 4.0 * P * (double)n, 4.0 * (P - 1) * (double)n);
    return st;
}

mc_status mc_broadcast(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                       int root, mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, "broadcast", &c, err);
    if (st) return st;
    if (root < 0 || root >= mc_grid_group_size(g, k))
        return mc_error_set(err, MC_ERR_INTERNAL, "broadcast on the %s: no group rank %d",
                            mc_group_name(k), root);
    if (c == MPI_COMM_NULL || n == 0) return MC_OK;
    if ((st = check_count(n, "broadcast", k, err))) return st;
    BEGIN("broadcast", k);
    int rc = MPI_SUCCESS;
    int root_me = mc_grid_group_rank(g, k) == root;
    mc_path path = mc_comm_path(cm, be);
    float *h = x;
    if (path == MC_PATH_NCCL) {
        st = mc_nccl_run(cm, k, be, MC_NCCL_BROADCAST, x, x, n, root, NULL, err);
    } else if (path == MC_PATH_STAGED && !(h = host_floats(cm, n, "broadcast", err))) {
        st = MC_ERR_NOMEM;
    } else {
        if (h != x && root_me) mc_bcopy_to_host(be, h, x, n * sizeof(float));
        rc = MPI_Bcast(h, (int)n, MPI_FLOAT, root, c);
        if (h != x && rc == MPI_SUCCESS && !root_me)
            mc_bcopy_from_host(be, x, h, n * sizeof(float));
    }
    END(MC_COLL_BROADCAST, 4.0 * (double)n,
        root_me ? 4.0 * (mc_grid_group_size(g, k) - 1) * (double)n : 0.0);
    if (st) return st;
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "broadcast", k);
}

mc_status mc_broadcast_text(const mc_grid *g, mc_status st, char **s, mc_error *err)
{
    if (g->world == 1) return st;
    /* the length, then the bytes, as floats (exact below 2^24) */
    float len = g->rank == 0 && !st ? (float)strlen(*s) : -1.0f;
    mc_error berr;
    if (mc_broadcast(g, MC_GROUP_WORLD, NULL, &len, 1, 0, &berr)) return *err = berr, berr.code;
    if (len < 0)
        return g->rank == 0 ? st
                            : mc_error_set(err, MC_ERR_USAGE, "rank 0 could not read its input");
    size_t n = (size_t)len;
    float *f = malloc((n + 1) * sizeof *f);
    char *t = g->rank == 0 ? *s : malloc(n + 1);
    if (!f || !t) {
        /* memory for a line of text: not worth agreeing on; the job ends */
        free(f);
        if (t != *s) free(t);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) f[i] = (float)(unsigned char)t[i];
    st = mc_broadcast(g, MC_GROUP_WORLD, NULL, f, n, 0, err);
    for (size_t i = 0; i < n; i++) t[i] = (char)(unsigned char)f[i];
    t[n] = '\0';
    free(f);
    *s = t;
    return st;
}

/* Point to point moves device memory through host memory with MPI, also
 * for a CUDA backend: NCCL's send and receive on one stream would deadlock
 * where both peers send first, which MPI's buffered sends allow. The host
 * copy of x (malloc'ed; x itself for host memory; NULL when out of memory). */
float *mc_comm_stage(mc_comm *cm, mc_backend *be, const float *x, size_t n)
{
    if (mc_comm_path(cm, be) == MC_PATH_HOST) return (float *)x;
    float *h = malloc(n * sizeof(float) + 1);
    if (h) mc_bcopy_to_host(be, h, x, n * sizeof(float));
    return h;
}

/* Point to point: the peer must be another member. */
mc_status mc_comm_peer(const mc_grid *g, mc_group_kind k, mc_backend *be, const char *op, int peer,
                       size_t n, MPI_Comm *c, mc_error *err)
{
    mc_status st = mc_comm_group(g, k, be, op, c, err);
    if (st) return st;
    if (peer < 0 || peer >= mc_grid_group_size(g, k) || peer == mc_grid_group_rank(g, k))
        return mc_error_set(err, MC_ERR_INTERNAL, "%s on the %s: group rank %d is not a peer of %d",
                            op, mc_group_name(k), peer, mc_grid_group_rank(g, k));
    return check_count(n, op, k, err);
}

int mc_comm_world_rank(MPI_Comm c, int peer)
{
    MPI_Group gc, gw;
    int out = -1;
    if (MPI_Comm_group(c, &gc) != MPI_SUCCESS) return -1;
    if (MPI_Comm_group(MPI_COMM_WORLD, &gw) == MPI_SUCCESS) {
        if (MPI_Group_translate_ranks(gc, 1, &peer, gw, &out) != MPI_SUCCESS ||
            out == MPI_UNDEFINED)
            out = -1;
        MPI_Group_free(&gw);
    }
    MPI_Group_free(&gc);
    return out;
}

mc_status mc_send(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *x, size_t n,
                  int peer, mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_peer(g, k, be, "send", peer, n, &c, err);
    if (st) return st;
    BEGIN_PEER("send", k, mc_comm_world_rank(c, peer));
    /* device memory goes through host memory (see mc_comm_stage) */
    float *h = mc_comm_stage(cm, be, x, n);
    int rc = h || !n ? MPI_Send(h ? h : x, (int)n, MPI_FLOAT, peer, 0, c) : MPI_ERR_NO_MEM;
    if (h != x) free(h);
    END(MC_COLL_SENDRECV, 4.0 * (double)n, 4.0 * (double)n);
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "send", k);
}

mc_status mc_comm_recv_status(const MPI_Status *s, size_t n, int peer, mc_group_kind k,
                              mc_error *err)
{
    int got = 0;
    MPI_Get_count(s, MPI_FLOAT, &got);
    if ((size_t)got != n)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "receive on the %s: %d floats came from group rank %d, %zu expected",
                            mc_group_name(k), got, peer, n);
    return MC_OK;
}

mc_status mc_recv(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n, int peer,
                  mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_peer(g, k, be, "receive", peer, n, &c, err);
    if (st) return st;
    MPI_Status s;
    BEGIN_PEER("receive", k, mc_comm_world_rank(c, peer));
    float *h = mc_comm_path(cm, be) != MC_PATH_HOST ? malloc(n * sizeof(float) + 1) : x;
    int rc = h ? MPI_Recv(h, (int)n, MPI_FLOAT, peer, 0, c, &s) : MPI_ERR_NO_MEM;
    if (h && h != x) {
        if (rc == MPI_SUCCESS) mc_bcopy_from_host(be, x, h, n * sizeof(float));
        free(h);
    }
    END(MC_COLL_SENDRECV, 4.0 * (double)n, 0.0);
    if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, "receive", k);
    return mc_comm_recv_status(&s, n, peer, k, err);
}

mc_status mc_alltoallv(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *send,
                       const size_t *scount, const size_t *sdispl, float *recv,
                       const size_t *rcount, const size_t *rdispl, mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, "all-to-all", &c, err);
    if (st) return st;
    int P = mc_grid_group_size(g, k), me = mc_grid_group_rank(g, k);
    if (c == MPI_COMM_NULL) {
        if (scount[0]) mc_bcopy(be, recv + rdispl[0], send + sdispl[0], scount[0] * sizeof(float));
        return MC_OK;
    }
    mc_path path = mc_comm_path(g->impl, be);
    int *v = malloc(4 * (size_t)P * sizeof *v);
    if (!v) return mc_error_set(err, MC_ERR_NOMEM, "all-to-all: out of memory");
    double bytes = 0, wire = 0;
    for (int j = 0; j < P && !st; j++) {
        if (sdispl[j] + scount[j] > (size_t)INT_MAX || rdispl[j] + rcount[j] > (size_t)INT_MAX)
            st = check_count((size_t)INT_MAX + 1, "all-to-all", k, err);
        v[j] = (int)scount[j], v[P + j] = (int)sdispl[j];
        v[2 * P + j] = (int)rcount[j], v[3 * P + j] = (int)rdispl[j];
        bytes += 4.0 * (double)scount[j];
        if (j != me) wire += 4.0 * (double)scount[j];
    }
    /* staged: the spans the counts cover, copied whole to the host; only
     * the received blocks come back (the rest of recv stays as it was) */
    size_t sn = 0, rn = 0;
    for (int j = 0; j < P; j++) {
        if (scount[j] && sdispl[j] + scount[j] > sn) sn = sdispl[j] + scount[j];
        if (rcount[j] && rdispl[j] + rcount[j] > rn) rn = rdispl[j] + rcount[j];
    }
    float *hs = NULL;
    if (!st && path == MC_PATH_STAGED && !(hs = host_floats(g->impl, sn + rn, "all-to-all", err)))
        st = MC_ERR_NOMEM;
    if (st) {
        free(v);
        return st;
    }
    if (hs) mc_bcopy_to_host(be, hs, send, sn * sizeof(float));
    BEGIN("all-to-all", k);
    int rc = MPI_SUCCESS;
    if (path == MC_PATH_NCCL)
        st = mc_nccl_alltoallv(cm, k, be, send, scount, sdispl, recv, rcount, rdispl, err);
    else if (hs)
        rc = MPI_Alltoallv(hs, v, v + P, MPI_FLOAT, hs + sn, v + 2 * P, v + 3 * P, MPI_FLOAT, c);
    else
        rc = MPI_Alltoallv(send, v, v + P, MPI_FLOAT, recv, v + 2 * P, v + 3 * P, MPI_FLOAT, c);
    END(MC_COLL_ALLTOALL, bytes, wire);
    free(v);
    if (hs) {
        if (rc == MPI_SUCCESS)
            for (int j = 0; j < P; j++)
                if (rcount[j])
                    mc_bcopy_from_host(be, recv + rdispl[j], hs + sn + rdispl[j],
                                       rcount[j] * sizeof(float));
    }
    if (st) return st;
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "all-to-all", k);
}

mc_status mc_alltoall_i64(const mc_grid *g, mc_group_kind k, const int64_t *send, int64_t *recv,
                          size_t n, mc_error *err)
{
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, NULL, "all-to-all", &c, err);
    if (st) return st;
    if (c == MPI_COMM_NULL) {
        memcpy(recv, send, n * sizeof *recv);
        return MC_OK;
    }
    if ((st = check_count(n, "all-to-all", k, err))) return st;
    int P = mc_grid_group_size(g, k);
    BEGIN("all-to-all", k);
    int rc = MPI_Alltoall(send, (int)n, MPI_INT64_T, recv, (int)n, MPI_INT64_T, c);
    END(MC_COLL_SCALAR, 8.0 * (double)P * (double)n, 8.0 * (double)(P - 1) * (double)n);
    return rc == MPI_SUCCESS ? MC_OK : mc_comm_mpi_error(err, rc, "all-to-all", k);
}
