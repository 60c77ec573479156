/*
 * serve_internal.h - private to lib/eval/serve*.c: a request's state, the
 * engine, and the calls between the scheduler (serve.c) and the OpenAI
 * front (serve_api.c). Every field of a request or the engine that both
 * the scheduler and a client's thread touch is guarded by mc_serve.mu.
 */
#ifndef MC_EVAL_SERVE_INTERNAL_H
#define MC_EVAL_SERVE_INTERNAL_H

#include <pthread.h>
#include <jansson.h>

#include "mc/buf.h"
#include "mc/chat.h"
#include "mc/eval.h"
#include "mc/kern.h"
#include "mc/model.h"
#include "mc/serve.h"
#include "mc/tokenizer.h"

enum { SV_QUEUED = 0, SV_RUNNING = 1, SV_DONE = 2 };

typedef struct sv_req {
    struct sv_req *next; /* the queue */
    int refs;            /* the engine's and the client's */
    int state, cancelled;
    int chat, stream;
    int include_usage; /* stream_options.include_usage: a last chunk with the usage */
    /* parameters */
    mc_gen_config gen; /* max_new_tokens, temperature, top_k, top_p, seed, eod, vocab */
    uint64_t draw;     /* the generator's stream */
    int seeded;        /* the request gave a seed: stream 0 of it, as mc-eval's first prompt */
    int logprobs;      /* -1: none; else the alternatives a token (0..20) */
    int echo;
    char **stops;
    int nstops;
    size_t max_stop;
    char *prompt_text; /* echo */
    size_t prompt_len;
    mc_ids prompt;
    /* progress */
    int fed, len;    /* prompt ids run, positions in the cache */
    int32_t *blocks; /* [need] */
    int nblocks, need;
    mc_ids out;         /* generated ids */
    double *lps;        /* [max_new_tokens] their log-probabilities */
    double *plps;       /* [prompt.n] the prompt's (echo with logprobs; [0] unused) */
    json_t *tops;       /* logprobs > 0: per token, an object of the alternatives */
    mc_buf text;        /* the completion, cut at a stop string */
    const char *finish; /* "stop", "length" */
    /* streaming */
    mc_buf sse;
    size_t sse_off, sent;
    int tok_sent, sse_end, role_sent;
    /* bookkeeping */
    double t_arrive, t_first;
    char id[48];
    int64_t created;
    int rows;      /* rows in the running step */
    float *logits; /* host [padded vocab] */
} sv_req;

#define SV_BATCH_BUCKETS 8 /* 1, 2, 4, ..., 128, +Inf */
#define SV_TTFT_BUCKETS 10

typedef struct sv_metrics {
    uint64_t http_requests, completed, rejected_queue, rejected_bad, cancelled;
    uint64_t prompt_tokens, gen_tokens, steps;
    uint64_t batch_hist[SV_BATCH_BUCKETS + 1];
    double batch_sum;
    uint64_t ttft_hist[SV_TTFT_BUCKETS + 1];
    double ttft_sum;
    uint64_t ttft_count;
    double busy_s; /* seconds of forward steps */
    int max_batch_seen;
} sv_metrics;

struct mc_serve {
    mc_serve_config c;
    mc_serve_info info;
    char ckpt_dir[4096];
    char model_name[256];
    mc_backend *be;
    mc_model *model;
    mc_kvpool *pool;
    mc_tokenizer *tok;
    mc_encoder *enc;
    mc_chat_template *chat;
    char *bos_text, *eos_text; /* the chat template's bos_token, eos_token */
    json_t *own;               /* the checkpoint's tokenizer_config.json, or NULL */
    int64_t vocab, vpad;
    int32_t eod;
    int32_t eot; /* the model's own end of turn (its eos_token), -1: none but the eod */
    pthread_mutex_t mu;
    pthread_mutex_t text_mu; /* the encoder and the chat template, shared by the clients */
    pthread_cond_t work, progress;
    pthread_t thread;
    int thread_started, quit, draining;
    sv_req *qhead, *qtail;
    int nqueue;
    sv_req **run;
    int nrun, reserved;
    /* the scheduler's scratch */
    float *scratch;
    int32_t *idx;
    mc_kvseq *seqs;
    sv_req **inbatch;
    int32_t *targets; /* [max_batch_tokens] */
    /* tensor parallelism: the steps rank 0 broadcasts (serve.c) */
    mc_grid grid;
    int32_t *wire; /* a step: nb, then each sequence's n, len, blocks, flags, ids */
    size_t wire_cap;
    float *junk; /* a follower's logits [padded vocab] */
    uint64_t next_id;
    sv_metrics m;
};

double sv_now(void);
/* Queue r (the engine takes a reference): MC_ERR_LIMIT when the queue is
 * full, MC_ERR_USAGE while draining. Under mu. */
mc_status sv_submit(mc_serve *s, sv_req *r, mc_error *err);
/* Drop one reference; the last frees r. Under mu. */
void sv_req_unref(sv_req *r);
/* The stream's events for what r made since the last call; under mu, by
 * the scheduler after each token and at the end (serve_api.c). */
void sv_stream_update(mc_serve *s, sv_req *r);
/* The id's text (may be part of a character). */
void sv_token_text(mc_serve *s, int32_t id, mc_buf *out);
/* A JSON string of bytes that may not be UTF-8: invalid bytes become
 * U+FFFD, as Python's decode(errors="replace"). */

#endif
