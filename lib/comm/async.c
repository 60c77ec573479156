/*
 * async.c - non-blocking collectives and point-to-point, and mc_wait. Open
 * MPI does not progress its own non-blocking collectives in the background,
 * so a worker thread of ours runs the queued collectives in issue order, with
 * the bodies of the blocking calls (same bits), while the main thread
 * computes; point-to-point requests are plain MPI_Isend/MPI_Irecv. See
 * doc/ARCHITECTURE.md, "Communication".
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "comm_internal.h"

enum req_op { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_SEND, OP_RECV };

struct mc_request {
    enum req_op op;
    const char *name;
    mc_group_kind k;
    MPI_Comm c;
    mc_backend *be;
    const float *in;
    float *out;
    size_t n;
    int peer;
    MPI_Request mpi; /* OP_SEND, OP_RECV */
    int done;        /* collectives: set by the worker under the lock */
    mc_status st;
    mc_error err;
    void *event;    /* NCCL collectives: the CUDA event mc_wait waits for */
    float *host;    /* point to point of device memory: the host copy */
    int P, me;      /* group size and rank, for the counters */
    double t_issue; /* mc_comm_now() at issue */
    double t_end;   /* collectives: when the body finished (worker) */
    double blocked; /* time the issuing call itself ran the body (no worker) */
    struct mc_request *next;
};

struct mc_async {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    mc_request *head, *tail;
    int pending[MC_GROUP_COUNT];
    int stop;
    mc_scratch scratch; /* the worker's */
};

static void execute(mc_request *r, mc_scratch *s)
{
    mc_error_clear(&r->err);
    switch (r->op) {
    case OP_ALLREDUCE:
        r->st = mc_comm_allreduce_sum(r->c, r->k, s, r->be, r->out, r->n, &r->err);
        break;
    case OP_REDUCE_SCATTER:
        r->st = mc_comm_reduce_scatter_sum(r->c, r->k, s, r->be, r->in, r->out, r->n, &r->err);
        break;
    case OP_ALLGATHER:
        r->st = mc_comm_allgather(r->c, r->k, r->be, r->in, r->out, r->n, &r->err);
        break;
    default: r->st = mc_error_set(&r->err, MC_ERR_INTERNAL, "%s: not a collective", r->name);
    }
}

static void *worker(void *arg)
{
    mc_async *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->head && !a->stop) pthread_cond_wait(&a->work, &a->mu);
        if (!a->head) break;
        mc_request *r = a->head;
        a->head = r->next;
        if (!a->head) a->tail = NULL;
        pthread_mutex_unlock(&a->mu);
        execute(r, &a->scratch);
        r->t_end = mc_comm_now();
        pthread_mutex_lock(&a->mu);
        a->pending[r->k]--;
        r->done = 1; /* r belongs to mc_wait from here on */
        pthread_cond_broadcast(&a->done);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static mc_status async_get(mc_comm *cm, mc_async **out, mc_error *err)
{
    *out = cm->async;
    if (cm->async || cm->thread_level < MPI_THREAD_MULTIPLE) return MC_OK;
    mc_async *a = calloc(1, sizeof *a);
    if (!a) return mc_error_set(err, MC_ERR_NOMEM, "non-blocking collectives: out of memory");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_cond_init(&a->done, NULL);
    int rc = pthread_create(&a->thread, NULL, worker, a);
    if (rc) {
        free(a);
        return mc_error_errno(err, MC_ERR_INTERNAL, rc,
                              "non-blocking collectives: cannot start the worker thread");
    }
    *out = cm->async = a;
    return MC_OK;
}

void mc_async_free(mc_async *a)
{
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    mc_scratch_free(&a->scratch);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

int mc_async_busy(mc_comm *cm, mc_group_kind k)
{
    mc_async *a = cm ? cm->async : NULL;
    if (!a) return 0;
    pthread_mutex_lock(&a->mu);
    int busy = a->pending[k] > 0;
    pthread_mutex_unlock(&a->mu);
    return busy;
}

mc_status mc_async_drain(mc_comm *cm, mc_group_kind k, const char *op, mc_error *err)
{
    (void)err; /* the queued requests report their own errors at mc_wait */
    mc_async *a = cm->async;
    mc_watchdog_enter(cm->wd, op, k);
    pthread_mutex_lock(&a->mu);
    while (a->pending[k] > 0) pthread_cond_wait(&a->done, &a->mu);
    pthread_mutex_unlock(&a->mu);
    mc_watchdog_leave(cm->wd);
    return MC_OK;
}

static mc_status submit(const mc_grid *g, enum req_op op, const char *name, mc_group_kind k,
                        mc_backend *be, const float *in, float *out, size_t n, mc_request **req,
                        mc_error *err)
{
    *req = NULL;
    MPI_Comm c;
    mc_status st = mc_comm_group(g, k, be, name, &c, err);
    if (st || n == 0) return st;
    if (c == MPI_COMM_NULL) { /* one member: nothing moves, the data stays put */
        if (op != OP_ALLREDUCE && in != out) mc_bcopy(be, out, in, n * sizeof(float));
        return MC_OK;
    }
    mc_comm *cm = g->impl;
    mc_request *r = calloc(1, sizeof *r);
    if (!r) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", name);
    *r = (mc_request){.op = op,
                      .name = name,
                      .k = k,
                      .c = c,
                      .be = be,
                      .in = in,
                      .out = out,
                      .n = n,
                      .P = mc_grid_group_size(g, k),
                      .me = mc_grid_group_rank(g, k),
                      .t_issue = mc_comm_now()};
    mc_path path = mc_comm_path(cm, be);
    if (path == MC_PATH_STAGED) { /* staged device memory: done here, blocking */
        /* after what the worker still holds for the group, in issue order */
        if (mc_async_busy(cm, k) && (st = mc_async_drain(cm, k, name, err))) {
            free(r);
            return st;
        }
        mc_watchdog_enter(cm->wd, name, k);
        switch (op) {
        case OP_ALLREDUCE: st = mc_comm_staged_allreduce_sum(cm, c, k, be, out, n, err); break;
        case OP_REDUCE_SCATTER:
            st = mc_comm_staged_reduce_scatter_sum(cm, c, k, be, in, out, n, err);
            break;
        default: st = mc_comm_staged_allgather(cm, c, k, be, in, out, n, err);
        }
        mc_watchdog_leave(cm->wd);
        if (st) {
            free(r);
            return st;
        }
        r->t_end = mc_comm_now();
        r->blocked = r->t_end - r->t_issue;
        r->done = 1;
        *req = r;
        return MC_OK;
    }
    if (path == MC_PATH_NCCL) { /* device memory: NCCL's stream is the worker */
        static const mc_nccl_op ops[] = {[OP_ALLREDUCE] = MC_NCCL_ALLREDUCE_SUM,
                                         [OP_REDUCE_SCATTER] = MC_NCCL_REDUCE_SCATTER,
                                         [OP_ALLGATHER] = MC_NCCL_ALLGATHER};
        if ((st = mc_nccl_run(cm, k, be, ops[op], in, out, n, 0, &r->event, err))) {
            free(r);
            return st;
        }
        r->t_end = mc_comm_now();
        r->done = 1;
        *req = r;
        return MC_OK;
    }
    mc_async *a;
    if ((st = async_get(cm, &a, err))) {
        free(r);
        return st;
    }
    if (!a) { /* no MPI_THREAD_MULTIPLE: run it now, under the deadline */
        mc_watchdog_enter(cm->wd, name, k);
        execute(r, &cm->scratch);
        mc_watchdog_leave(cm->wd);
        r->t_end = mc_comm_now();
        r->blocked = r->t_end - r->t_issue;
        r->done = 1;
    } else {
        pthread_mutex_lock(&a->mu);
        a->pending[k]++;
        if (a->tail)
            a->tail->next = r;
        else
            a->head = r;
        a->tail = r;
        pthread_cond_signal(&a->work);
        pthread_mutex_unlock(&a->mu);
    }
    *req = r;
    return MC_OK;
}

mc_status mc_iallreduce_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n,
                            mc_request **req, mc_error *err)
{
    if (n > (size_t)INT_MAX)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "all-reduce on the %s: %zu elements are over MPI's limit",
                            mc_group_name(k), n);
    return submit(g, OP_ALLREDUCE, "all-reduce", k, be, x, x, n, req, err);
}

mc_status mc_ireduce_scatter_sum(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                                 float *out, size_t n, mc_request **req, mc_error *err)
{
    if (n > (size_t)INT_MAX)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "reduce-scatter on the %s: %zu elements are over MPI's limit",
                            mc_group_name(k), n);
    return submit(g, OP_REDUCE_SCATTER, "reduce-scatter", k, be, in, out, n, req, err);
}

mc_status mc_iallgather(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *in,
                        float *out, size_t n, mc_request **req, mc_error *err)
{
    if (n > (size_t)INT_MAX)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "all-gather on the %s: %zu elements are over MPI's limit",
                            mc_group_name(k), n);
    return submit(g, OP_ALLGATHER, "all-gather", k, be, in, out, n, req, err);
}

static mc_status p2p(const mc_grid *g, enum req_op op, mc_group_kind k, mc_backend *be, float *x,
                     size_t n, int peer, mc_request **req, mc_error *err)
{
    *req = NULL;
    const char *name = op == OP_SEND ? "send" : "receive";
    MPI_Comm c;
    mc_status st = mc_comm_peer(g, k, be, name, peer, n, &c, err);
    if (st) return st;
    mc_request *r = calloc(1, sizeof *r);
    if (!r) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", name);
    *r = (mc_request){.op = op,
                      .name = name,
                      .k = k,
                      .c = c,
                      .be = be,
                      .out = x,
                      .n = n,
                      .peer = peer,
                      .P = mc_grid_group_size(g, k),
                      .me = mc_grid_group_rank(g, k),
                      .t_issue = mc_comm_now()};
    /* device memory through host memory (reduce.c, mc_comm_stage) */
    float *buf = x;
    if (mc_comm_path(g->impl, be) != MC_PATH_HOST) {
        buf = r->host = op == OP_SEND ? mc_comm_stage(g->impl, be, x, n)
                                      : malloc(n * sizeof(float) + 1);
        if (!buf) {
            free(r);
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", name);
        }
    }
    int rc = op == OP_SEND ? MPI_Isend(buf, (int)n, MPI_FLOAT, peer, 0, c, &r->mpi)
                           : MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, 0, c, &r->mpi);
    if (rc != MPI_SUCCESS) {
        free(r->host);
        free(r);
        return mc_comm_mpi_error(err, rc, name, k);
    }
    *req = r;
    return MC_OK;
}

mc_status mc_isend(const mc_grid *g, mc_group_kind k, mc_backend *be, const float *x, size_t n,
                   int peer, mc_request **req, mc_error *err)
{
    /* MPI_Isend reads x only; the cast serves the shared request layout */
    return p2p(g, OP_SEND, k, be, (float *)x, n, peer, req, err);
}

mc_status mc_irecv(const mc_grid *g, mc_group_kind k, mc_backend *be, float *x, size_t n, int peer,
                   mc_request **req, mc_error *err)
{
    return p2p(g, OP_RECV, k, be, x, n, peer, req, err);
}

/* The counters of a request waited for since t0 (stats.c; bytes as in
 * reduce.c's entry points). Point to point completes, as far as we can
 * see, when MPI_Wait returns. */
static void count(mc_comm *cm, const mc_request *r, double t0)
{
    double t1 = mc_comm_now(), n = (double)r->n, P = r->P;
    double end = r->op == OP_SEND || r->op == OP_RECV ? t1 : r->t_end;
    double bytes = 4.0 * n, wire = 0;
    mc_coll_kind c = MC_COLL_SENDRECV;
    switch (r->op) {
    case OP_ALLREDUCE:
        c = MC_COLL_ALLREDUCE, wire = mc_comm_allreduce_wire(r->n, r->P, r->me);
        break;
    case OP_REDUCE_SCATTER:
        c = MC_COLL_REDUCE_SCATTER, bytes = 4.0 * P * n, wire = 4.0 * (P - 1) * n;
        break;
    case OP_ALLGATHER: c = MC_COLL_ALLGATHER, bytes = 4.0 * P * n, wire = 4.0 * (P - 1) * n; break;
    case OP_SEND: wire = 4.0 * n; break;
    case OP_RECV: break;
    }
    mc_comm_count_async(cm, r->k, c, bytes, wire, end - r->t_issue, r->blocked + (t1 - t0));
}

mc_status mc_wait(const mc_grid *g, mc_request *r, mc_error *err)
{
    if (!r) return MC_OK;
    mc_comm *cm = g->impl;
    mc_status st;
    double t0 = mc_comm_now();
    int p2p = r->op == OP_SEND || r->op == OP_RECV;
    mc_watchdog_enter_peer(cm->wd, r->name, r->k, p2p ? mc_comm_world_rank(r->c, r->peer) : -1);
    if (p2p) {
        MPI_Status s;
        int rc = MPI_Wait(&r->mpi, &s);
        mc_watchdog_leave(cm->wd);
        if (rc != MPI_SUCCESS)
            st = mc_comm_mpi_error(err, rc, r->name, r->k);
        else if (r->op == OP_RECV)
            st = mc_comm_recv_status(&s, r->n, r->peer, r->k, err);
        else
            st = MC_OK;
        if (!st && r->host && r->op == OP_RECV)
            mc_bcopy_from_host(r->be, r->out, r->host, r->n * sizeof(float));
        free(r->host);
    } else {
        mc_async *a = cm->async;
        if (a) {
            pthread_mutex_lock(&a->mu);
            while (!r->done) pthread_cond_wait(&a->done, &a->mu);
            pthread_mutex_unlock(&a->mu);
        }
        mc_watchdog_leave(cm->wd);
        st = r->st;
        if (st && err) *err = r->err;
        if (!st && r->event) st = mc_nccl_wait(r->be, r->event, r->name, r->k, err);
    }
    count(cm, r, t0);
    free(r);
    return st;
}
