/*
 * serve.h - serving a checkpoint (lib/eval/serve*.c): the engine under
 * mc-serve. Requests in OpenAI's shapes (completions, chat completions)
 * wait in a bounded queue; one scheduler thread runs decode steps over
 * every active request, and requests that arrive meanwhile join between
 * steps (their prompts are prefilled in the same forward pass as the
 * others' next tokens). Keys and values live in fixed-size blocks of a pool
 * (mc_kvpool, model.h) that requests take as they grow and give back when
 * they finish or their client leaves. A greedy or seeded request gets the
 * same tokens and log-probabilities, bit for bit, whatever else is in the
 * batch (mc_infer_batch).
 *
 * The HTTP transport is the caller's: mc_serve_handle takes a method, a
 * path and a body and answers with a status and a JSON body, or with a
 * stream of server-sent events the caller reads with mc_serve_stream_read.
 * The endpoints, parameters and errors are in mc-serve(1).
 */
#ifndef MC_SERVE_H
#define MC_SERVE_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_serve_config {
    const char *ckpt;          /* mc_ckpt_open's path */
    const char *model_name;    /* the id /v1/models lists; NULL: "mc" */
    const char *chat_template; /* a template file (mc_chat_template_load); NULL: none */
    int threads;               /* CPU threads; 0: the cores present */
    int ctx;                   /* positions a request at most; 0: the checkpoint's seq_length */
    int weights; /* MC_KV_WEIGHTS_FP32, _INT8 (codes and row scales) or _BF16 (model.h); -1: as
                    the checkpoint stores them (int8 or bf16 for such a checkpoint, else fp32) */
    double kv_cache_mb;         /* the key/value pool */
    int block_size;             /* positions a block */
    int max_batch;              /* requests decoded together at most */
    int max_batch_tokens;       /* rows (new positions) a step at most */
    int max_queue;              /* requests waiting at most; more are refused (429) */
    uint64_t seed;              /* draws of requests that give no seed */
    const char *hold_file;      /* tests only: while this file exists, no step runs */
    int hold_at_first;          /* tests only: make hold_file after a step that gave a request
                                   its first token */
    const struct mc_grid *grid; /* NULL: one process; else one tensor-parallel group (world ==
                                   tp): rank 0 serves and drives every step, the other ranks
                                   run mc_serve_follow */
} mc_serve_config;

/* 256 MiB, blocks of 16, batches of 32 requests and 256 rows, a queue of
 * 64, seed 1234. */
void mc_serve_config_init(mc_serve_config *c);

typedef struct mc_serve mc_serve;

typedef struct mc_serve_info {
    const char *checkpoint; /* the iteration directory */
    int64_t iteration, parameters;
    int ctx;
    int weights;            /* MC_KV_WEIGHTS_* in use */
    int blocks, block_size; /* the pool */
    const char *model_name;
    int chat; /* a chat template is loaded */
    const char *blas_note; /* NULL, or a line for the log: OpenBLAS below the CPU path */
} mc_serve_info;

/* Load the checkpoint (with its tokenizer), the chat template, the pool,
 * and start the scheduler thread (on rank 0 of a grid). Collective under a
 * grid: every rank returns the same status. */
mc_status mc_serve_open(const mc_serve_config *c, mc_serve **out, mc_error *err);
/* A rank other than 0 of the grid: run each step rank 0's scheduler
 * broadcasts, until rank 0's engine is freed. */
mc_status mc_serve_follow(mc_serve *s, mc_error *err);
const mc_serve_info *mc_serve_get_info(const mc_serve *s);
/* Refuse new generations from now on (503) and return once every queued
 * and running request has finished. */
void mc_serve_drain(mc_serve *s);
/* Stop the scheduler (on rank 0 of a grid it tells the other ranks to
 * stop following: collective); again is a no-op. Call it before
 * mc_grid_finalize, and free after (the grid's staging memory is the
 * backend's). NULL is allowed. */
void mc_serve_stop(mc_serve *s);
/* Stop the scheduler (mc_serve_stop) and free everything; the caller has
 * closed every stream. NULL is allowed. */
void mc_serve_free(mc_serve *s);

typedef struct mc_serve_stream mc_serve_stream;

typedef struct mc_serve_reply {
    int status;               /* HTTP status */
    const char *content_type; /* "application/json", "text/event-stream", "text/plain; ..." */
    const char *allow;        /* 405: the method the path takes */
    char *body;               /* malloc'd, len bytes; NULL with a stream */
    size_t len;
    mc_serve_stream *stream; /* status 200 with stream: true; read it, then close it */
} mc_serve_reply;

/* Answer one request; blocks until a generation without stream is done. */
void mc_serve_handle(mc_serve *s, const char *method, const char *path, const char *body,
                     size_t len, mc_serve_reply *r);
void mc_serve_reply_free(mc_serve_reply *r); /* the body */

/* Up to max bytes of the stream's events into buf, waiting at most
 * timeout_ms for some: the count, 0 when none came in time, -1 at the end
 * (everything up to "data: [DONE]" was read). */
long mc_serve_stream_read(mc_serve *s, mc_serve_stream *st, char *buf, size_t max, int timeout_ms);
/* Done with the stream; before its end the request is cancelled (the
 * client went away) and its blocks go back to the pool. */
void mc_serve_stream_close(mc_serve *s, mc_serve_stream *st);

#ifdef __cplusplus
}
#endif
#endif
