/*
 * mc-serve - serve a checkpoint over HTTP with OpenAI's API: completions,
 * chat completions, models, health and Prometheus metrics, with
 * continuous batching over a pool of key/value blocks.
 *
 * This file is the option table, GNU libmicrohttpd's glue (one thread per
 * connection; a streamed response is read from the engine as it comes),
 * and the signals; the engine, the API's shapes and the scheduler are
 * lib/eval/serve*.c (mc/serve.h). Pipeline contract: the checkpoint is
 * the argument or one line on stdin; when ready, the server's URL is the
 * one line on stdout; logs go to stderr. SIGTERM or SIGINT: stop
 * accepting, finish every request already received, exit 0.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <microhttpd.h>

#include "mc/buf.h"
#include "mc/ckpt.h"
#include "mc/log.h"
#include "mc/opt.h"
#include "mc/serve.h"
#include "mc/tool.h"

static const char PROG[] = "mc-serve";

#define MAX_BODY (16u << 20)

enum {
    OPT_CTX = 'c',
    OPT_HOST = 256,
    OPT_PORT,
    OPT_THREADS,
    OPT_WEIGHTS,
    OPT_KV_MB,
    OPT_BLOCK,
    OPT_MAX_BATCH,
    OPT_MAX_TOKENS,
    OPT_MAX_QUEUE,
    OPT_NAME,
    OPT_CHAT,
    OPT_SEED,
    OPT_TP,
    OPT_EP,
    OPT_NO_VERIFY,
    OPT_QUIET
};

static const mc_option options[] = {
    {"host", MC_OPT_REQUIRED, OPT_HOST, "ADDR",
     "Address to listen on, a name or a numeric IPv4/IPv6 address (127.0.0.1)."},
    {"port", MC_OPT_REQUIRED, OPT_PORT, "N", "Port to listen on; 0 picks a free one (8080)."},
    {"ctx-size", MC_OPT_REQUIRED, OPT_CTX, "N",
     "Positions a request may use, prompt plus generated tokens (default: the checkpoint's "
     "--seq-length)."},
    {"weights", MC_OPT_REQUIRED, OPT_WEIGHTS, "TYPE",
     "fp32, bf16 or int8: run the linear layers on fp32 weights, on bf16 weights (half the "
     "bytes) or on int8 codes with one scale per row. Default: int8 for a checkpoint quantized "
     "to int8, bf16 for a bf16 checkpoint (on its own values), fp32 otherwise."},
    {"threads", MC_OPT_REQUIRED, OPT_THREADS, "N", "CPU threads (default: the cores present)."},
    {"kv-cache-mb", MC_OPT_REQUIRED, OPT_KV_MB, "MB",
     "Memory for the key/value cache, cut into blocks shared by all requests (256)."},
    {"kv-block-size", MC_OPT_REQUIRED, OPT_BLOCK, "N", "Positions a key/value block (16)."},
    {"max-batch", MC_OPT_REQUIRED, OPT_MAX_BATCH, "N", "Requests decoded together at most (32)."},
    {"max-batch-tokens", MC_OPT_REQUIRED, OPT_MAX_TOKENS, "N",
     "New positions a forward step at most: decoded tokens plus prompt chunks (256)."},
    {"max-queue", MC_OPT_REQUIRED, OPT_MAX_QUEUE, "N",
     "Requests waiting for the batch at most; more get 429 (64)."},
    {"model-name", MC_OPT_REQUIRED, OPT_NAME, "NAME",
     "The model's id in /v1/models and in responses (mc)."},
    {"chat-template", MC_OPT_REQUIRED, OPT_CHAT, "FILE",
     "Chat template for /v1/chat/completions: a Jinja file or a tokenizer_config.json."},
    {"seed", MC_OPT_REQUIRED, OPT_SEED, "N", "Seed of the draws of requests without one (1234)."},
    {"tensor-model-parallel-size", MC_OPT_REQUIRED, OPT_TP, "N",
     "Under mpirun or srun: ranks that split each layer (1); the world must be N x "
     "--expert-model-parallel-size ranks. Rank 0 serves HTTP and drives every step."},
    {"expert-model-parallel-size", MC_OPT_REQUIRED, OPT_EP, "N",
     "Under mpirun or srun, a mixture of experts: split the experts over N copies of the "
     "tensor-parallel group, which run the same steps (1); the number of experts must be "
     "divisible by N."},
    {"no-verify", MC_OPT_NONE, OPT_NO_VERIFY, NULL,
     "Do not check the checkpoint's files against its checksums.xxh128 manifest."},
    {"quiet", MC_OPT_NONE, OPT_QUIET, NULL, "Only errors on stderr."},
    {NULL, 0, 0, NULL, NULL},
};

static const mc_choice weight_types[] = {{"fp32", MC_KV_WEIGHTS_FP32},
                                         {"bf16", MC_KV_WEIGHTS_BF16},
                                         {"int8", MC_KV_WEIGHTS_INT8},
                                         {NULL, 0}};

typedef struct args {
    mc_serve_config c;
    const char *host;
    int port, quiet;
    int64_t tp, ep;
} args;

static mc_status parse_args(mc_cli *cli, args *a, int *exit_now, mc_error *err)
{
    const char *arg;
    int key;
    mc_serve_config *c = &a->c;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0) {
        mc_status st = MC_OK;
        switch (key) {
        case OPT_HOST: a->host = arg; break;
        case OPT_PORT: st = mc_parse_int("--port", arg, 0, 65535, &a->port, err); break;
        case OPT_CTX: st = mc_parse_int("--ctx-size", arg, 2, 1 << 24, &c->ctx, err); break;
        case OPT_WEIGHTS:
            st = mc_parse_choice("--weights", "type", arg, weight_types, &c->weights, err);
            break;
        case OPT_THREADS: st = mc_parse_int("--threads", arg, 1, 4096, &c->threads, err); break;
        case OPT_KV_MB:
            st = mc_parse_double("--kv-cache-mb", arg, 1e-3, 1e9, &c->kv_cache_mb, err);
            break;
        case OPT_BLOCK:
            st = mc_parse_int("--kv-block-size", arg, 1, 1 << 16, &c->block_size, err);
            break;
        case OPT_MAX_BATCH:
            st = mc_parse_int("--max-batch", arg, 1, 4096, &c->max_batch, err);
            break;
        case OPT_MAX_TOKENS:
            st = mc_parse_int("--max-batch-tokens", arg, 1, 1 << 20, &c->max_batch_tokens, err);
            break;
        case OPT_MAX_QUEUE:
            st = mc_parse_int("--max-queue", arg, 0, 1 << 20, &c->max_queue, err);
            break;
        case OPT_NAME: c->model_name = arg; break;
        case OPT_CHAT: c->chat_template = arg; break;
        case OPT_SEED: st = mc_parse_u64("--seed", arg, 0, UINT32_MAX, &c->seed, err); break;
        case OPT_TP:
            st = mc_parse_i64("--tensor-model-parallel-size", arg, 1, 4096, &a->tp, err);
            break;
        case OPT_EP:
            st = mc_parse_i64("--expert-model-parallel-size", arg, 1, 4096, &a->ep, err);
            break;
        case OPT_NO_VERIFY: mc_ckpt_set_verify(0); break;
        case OPT_QUIET: a->quiet = 1; break;
        default: st = mc_error_set(err, MC_ERR_INTERNAL, "option %d", key);
        }
        if (st) return st;
    }
    if (key == MC_CLI_EXIT) {
        *exit_now = 1;
        return MC_OK;
    }
    if (key == MC_CLI_ERROR) return MC_ERR_USAGE;
    return mc_cli_one_positional(cli, "checkpoint", &c->ckpt, err);
}

/* ------------------------------------------------------------ HTTP */

typedef struct conn {
    mc_buf body;
    int too_big;
    struct MHD_Connection *mhd;
    mc_serve_stream *stream;
} conn;

typedef struct server {
    mc_serve *s;
} server;

/* The client closed its end: a read of the socket sees end of file. */
static int client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c,
                                                                 MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static mc_serve *the_engine;

/* requests between their first byte and their response's last: on SIGTERM
 * the daemon stops once they are all answered */
static pthread_mutex_t active_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t active_cv = PTHREAD_COND_INITIALIZER;
static int active;

static void active_add(int d)
{
    pthread_mutex_lock(&active_mu);
    active += d;
    if (!active) pthread_cond_broadcast(&active_cv);
    pthread_mutex_unlock(&active_mu);
}

/* server-sent events, as the engine makes them */
static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    conn *x = cls;
    for (;;) {
        long n = mc_serve_stream_read(the_engine, x->stream, buf, max, 50);
        if (n > 0) return (ssize_t)n;
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(x->mhd)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    server *sv = cls;
    conn *x = *con_cls;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        x->mhd = c;
        *con_cls = x;
        active_add(1);
        return MHD_YES;
    }
    if (*upload_size) {
        if (x->body.len + *upload_size > MAX_BODY)
            x->too_big = 1;
        else if (mc_buf_append(&x->body, upload_data, *upload_size, NULL))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    mc_serve_reply r;
    struct MHD_Response *resp;
    if (x->too_big) {
        static const char big[] =
            "{\"error\":{\"message\":\"the body is larger than 16 MiB\",\"type\":"
            "\"invalid_request_error\",\"param\":null,\"code\":\"body_too_large\"}}";
        memset(&r, 0, sizeof r);
        r.status = 413;
        r.content_type = "application/json";
        resp = MHD_create_response_from_buffer(sizeof big - 1, (void *)big, MHD_RESPMEM_PERSISTENT);
    } else {
        mc_serve_handle(sv->s, method, url, x->body.data, x->body.len, &r);
        if (r.stream) {
            x->stream = r.stream;
            resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_events, x, NULL);
            if (resp) MHD_add_response_header(resp, "Cache-Control", "no-cache");
        } else {
            resp = MHD_create_response_from_buffer(r.len, r.body ? r.body : (void *)"",
                                                   r.body ? MHD_RESPMEM_MUST_FREE
                                                          : MHD_RESPMEM_PERSISTENT);
            if (!resp) mc_serve_reply_free(&r);
        }
    }
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", r.content_type);
    if (r.allow) MHD_add_response_header(resp, "Allow", r.allow);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)c, (void)why;
    server *sv = cls;
    conn *x = *con_cls;
    if (!x) return;
    if (x->stream) mc_serve_stream_close(sv->s, x->stream);
    mc_buf_free(&x->body);
    free(x);
    *con_cls = NULL;
    active_add(-1);
}

/* Listen on host:port; the URL into url. */
static mc_status start_http(server *sv, const char *host, int port, struct MHD_Daemon **out,
                            char *url, size_t urlsz, mc_error *err)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e) return mc_error_set(err, MC_ERR_USAGE, "--host %s: %s", host, gai_strerror(e));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, sv, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv, MHD_OPTION_LISTENING_ADDRESS_REUSE,
        (unsigned)1, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d)
        return mc_error_set(err, MC_ERR_IO,
                            "cannot listen on %s port %d (in use, or not an "
                            "address of this machine)",
                            host, port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char name[INET6_ADDRSTRLEN] = "?";
    int bound = port;
    if (di && !getsockname(di->listen_fd, (struct sockaddr *)&ss, &sl)) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a6->sin6_addr, name, sizeof name);
            bound = ntohs(a6->sin6_port);
            snprintf(url, urlsz, "http://[%s]:%d", name, bound);
        } else {
            struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a4->sin_addr, name, sizeof name);
            bound = ntohs(a4->sin_port);
            snprintf(url, urlsz, "http://%s:%d", name, bound);
        }
    } else {
        snprintf(url, urlsz, "http://%s:%d", host, bound);
    }
    *out = d;
    return MC_OK;
}

int main(int argc, char **argv)
{
    mc_logger lg;
    mc_tool_start(&lg, PROG, 0);
    mc_error err;
    mc_error_clear(&err);
    mc_cli cli;
    args a;
    memset(&a, 0, sizeof a);
    a.host = "127.0.0.1";
    a.port = 8080;
    a.tp = a.ep = 1;
    mc_serve_config_init(&a.c);
    /* test hooks (mc-serve(1), ENVIRONMENT) */
    a.c.hold_file = getenv("MC_TEST_SERVE_HOLD");
    a.c.hold_at_first = getenv("MC_TEST_SERVE_HOLD_AT_FIRST") != NULL;
    char *stdin_ckpt = NULL;
    mc_serve *s = NULL;
    struct MHD_Daemon *d = NULL;
    int rc = 1, grid_error = 0;
    mc_grid grid;
    mc_grid_single(&grid);
    mc_status st = mc_cli_init(&cli, PROG, "[OPTION]... [CHECKPOINT]",
                               "Serve a checkpoint (a checkpoint directory, an iteration "
                               "directory or its model.h5; read from stdin when omitted or -) "
                               "over HTTP with OpenAI's API: /v1/completions, "
                               "/v1/chat/completions, /v1/models, /health, /metrics. Prints its "
                               "URL on stdout when ready; logs go to stderr. SIGTERM or SIGINT "
                               "finishes the requests received and exits 0. Under mpirun or "
                               "srun, runs on --tensor-model-parallel-size x "
                               "--expert-model-parallel-size ranks.",
                               options, argc, argv, &err);
    int exit_now = 0;
    if (!st) st = parse_args(&cli, &a, &exit_now, &err);
    if (!st && exit_now) {
        rc = 0;
        goto done;
    }
    /* SIGTERM and SIGINT blocked in every thread (MPI's too, so block them
     * before it starts); rank 0's main thread waits for them */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, &old);
    /* The grid: under an MPI launcher every rank starts MPI even after a
     * usage error, so that rank 0 alone reports it. */
    st = mc_grid_init_tp_group(&argc, &argv, st, a.tp, a.ep, "mc-serve", &grid, &grid_error, &err);
    if (st) goto fail;
    a.c.grid = &grid;
    int lead = grid.rank == 0;
    if (!a.c.ckpt) {
        /* mpirun gives stdin to rank 0 alone, which broadcasts the path */
        st = lead ? mc_tool_stdin_path(&stdin_ckpt,
                                       "no checkpoint given and stdin is a terminal: give its "
                                       "path, or pipe in what mc-train prints",
                                       "no checkpoint given and stdin holds no path", &err)
                  : MC_OK;
        if ((st = mc_broadcast_text(&grid, st, &stdin_ckpt, &err))) goto fail;
        a.c.ckpt = stdin_ckpt;
    }
    signal(SIGPIPE, SIG_IGN);
    if ((st = mc_serve_open(&a.c, &s, &err))) goto fail;
    if (!lead) {
        /* SIGTERM stays blocked here: rank 0 drains, then ends the steps */
        if ((st = mc_serve_follow(s, &err))) {
            mc_log_fail(&lg, &err);
            rc = mc_grid_fail(&grid, 0);
            goto done;
        }
        rc = 0;
        goto done;
    }
    the_engine = s;
    const mc_serve_info *info = mc_serve_get_info(s);
    server sv = {s};
    char url[256];
    if ((st = start_http(&sv, a.host, a.port, &d, url, sizeof url, &err))) goto fail;
    if (!a.quiet) {
        mc_log_info(&lg,
                    "%s: iteration %" PRId64 ", %" PRId64 " parameters, context %d, %s weights, "
                    "%d key/value blocks of %d positions%s%s",
                    info->checkpoint, info->iteration, info->parameters, info->ctx,
                    info->weights == MC_KV_WEIGHTS_INT8   ? "int8"
                    : info->weights == MC_KV_WEIGHTS_BF16 ? "bf16"
                                                          : "fp32",
                    info->blocks, info->block_size, info->chat ? ", chat template" : "",
                    grid.tp > 1 && grid.ep > 1 ? ", tensor and expert parallel"
                    : grid.ep > 1              ? ", expert parallel"
                    : grid.world > 1           ? ", tensor parallel"
                                               : "");
        if (info->blas_note) mc_log_info(&lg, "note: %s", info->blas_note);
        mc_log_info(&lg, "listening on %s", url);
    }
    printf("%s\n", url);
    if (fflush(stdout) == EOF) {
        st = mc_error_errno(&err, MC_ERR_IO, errno, "stdout");
        goto fail;
    }
    int sig = 0;
    sigwait(&stop, &sig);
    if (!a.quiet)
        mc_log_info(&lg, "%s: no new connections; finishing the requests received", strsignal(sig));
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    mc_serve_drain(s);
    pthread_mutex_lock(&active_mu);
    while (active) pthread_cond_wait(&active_cv, &active_mu);
    pthread_mutex_unlock(&active_mu);
    MHD_stop_daemon(d);
    d = NULL;
    if (!a.quiet) mc_log_info(&lg, "stopped");
    rc = 0;
    goto done;
fail:
    /* before serving, every rank meets the same errors: rank 0 reports */
    if (grid.rank == 0)
        rc = st == MC_ERR_USAGE && !grid_error ? mc_tool_usage(&lg, &err)
                                               : (mc_log_fail(&lg, &err), 1);
    else
        rc = st == MC_ERR_USAGE && !grid_error ? 2 : 1;
done:
    if (d) MHD_stop_daemon(d);
    mc_serve_stop(s); /* rank 0 ends the other ranks' steps */
    if (grid.impl) mc_grid_finalize(&grid);
    mc_serve_free(s); /* the backend, after the grid's staging memory */
    free(stdin_ckpt);
    mc_cli_free(&cli);
    return mc_tool_exit(&lg, rc);
}
