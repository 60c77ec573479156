/*
 * serve.c - the serving engine (serve.h): the checkpoint loaded for
 * batched inference, the bounded queue, and the scheduler thread that runs
 * continuous batching over the key/value block pool.
 *
 * One step of the scheduler, under the engine's lock except for the
 * forward pass itself:
 *   1. release cancelled requests (their blocks go back to the pool);
 *   2. admit queued requests, first come first served, while the batch has
 *      room and the pool can hold each admitted request's whole length
 *      (prompt + max_tokens, capped by the context): blocks are taken as a
 *      request grows, but admission reserves them, so a running request
 *      never waits for memory and nothing is ever preempted;
 *   3. build the batch: every running request's next token (one row each),
 *      then the prompts still being prefilled, cut to the step's row
 *      budget (a cut anywhere gives the same bits: mc_infer_batch);
 *   4. run it (mc_infer_batch), then sample each request whose prompt is
 *      done, check its stops, and wake its client.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eval/serve_internal.h"
#include "mc/chat.h"
#include "mc/ckpt.h"
#include "mc/json.h"
#include "mc/train.h"

void mc_serve_config_init(mc_serve_config *c)
{
    memset(c, 0, sizeof *c);
    c->weights = -1;
    c->kv_cache_mb = 256;
    c->block_size = 16;
    c->max_batch = 32;
    c->max_batch_tokens = 256;
    c->max_queue = 64;
    c->seed = 1234;
}

double sv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ requests */

void sv_req_unref(sv_req *r)
{
    if (!r || --r->refs > 0) return;
    for (int i = 0; i < r->nstops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->prompt_text);
    mc_ids_free(&r->prompt);
    mc_ids_free(&r->out);
    free(r->blocks);
    free(r->lps);
    free(r->plps);
    json_decref(r->tops);
    mc_buf_free(&r->text);
    mc_buf_free(&r->sse);
    free(r->logits);
    free(r);
}

static int blocks_for(const mc_serve *s, int positions)
{
    return (positions + s->c.block_size - 1) / s->c.block_size;
}

mc_status sv_submit(mc_serve *s, sv_req *r, mc_error *err)
{
    if (s->draining || s->quit)
        return mc_error_set(err, MC_ERR_USAGE, "the server is shutting down");
    if (s->nqueue >= s->c.max_queue)
        return mc_error_set(err, MC_ERR_LIMIT, "the queue is full (%d requests wait; --max-queue)",
                            s->nqueue);
    int total = r->prompt.n + (size_t)r->gen.max_new_tokens > (size_t)s->info.ctx
                    ? s->info.ctx
                    : (int)r->prompt.n + r->gen.max_new_tokens;
    r->need = blocks_for(s, total);
    if (r->need > mc_kvpool_blocks(s->pool))
        return mc_error_set(err, MC_ERR_USAGE,
                            "the request needs %d key/value blocks of %d positions and the pool "
                            "has %d (--kv-cache-mb)",
                            r->need, s->c.block_size, mc_kvpool_blocks(s->pool));
    r->blocks = malloc((size_t)r->need * sizeof *r->blocks);
    r->lps = malloc(((size_t)r->gen.max_new_tokens + 1) * sizeof *r->lps);
    r->logits = malloc((size_t)s->vpad * sizeof *r->logits);
    if (!r->blocks || !r->lps || !r->logits)
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    snprintf(r->id, sizeof r->id, "%s-%llu", r->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id);
    r->created = (int64_t)time(NULL);
    if (!r->seeded) {
        /* an unseeded request draws its own stream of the server's seed */
        r->gen.seed = s->c.seed;
        r->draw = s->next_id;
    }
    r->t_arrive = sv_now();
    r->refs++;
    r->state = SV_QUEUED;
    if (s->qtail)
        s->qtail->next = r;
    else
        s->qhead = r;
    s->qtail = r;
    s->nqueue++;
    pthread_cond_signal(&s->work);
    return MC_OK;
}

/* r leaves the batch (or the queue): its blocks back, its reservation
 * dropped, its client woken. */
static void finish_req(mc_serve *s, sv_req *r)
{
    mc_kvpool_give(s->pool, r->blocks, r->nblocks);
    s->reserved -= r->need - r->nblocks;
    r->nblocks = 0;
    r->state = SV_DONE;
    if (r->cancelled)
        s->m.cancelled++;
    else
        s->m.completed++;
    if (r->stream && !r->cancelled) sv_stream_update(s, r);
    pthread_cond_broadcast(&s->progress);
    sv_req_unref(r);
}

/* ------------------------------------------------------------ sampling */

/* The top n of logits[0..vocab) as {"text": logprob} (ties: lower id first). */
static json_t *alternatives(mc_serve *s, const float *logits, int n)
{
    json_t *o = json_object();
    int32_t best[20];
    int k = 0;
    for (int64_t i = 0; i < s->vocab; i++) {
        int j = k < n ? k++ : n;
        if (j == n && !(logits[i] > logits[best[n - 1]])) continue;
        if (j == n) j = n - 1;
        while (j > 0 && logits[i] > logits[best[j - 1]]) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = (int32_t)i;
    }
    mc_buf t = MC_BUF_INIT;
    for (int i = 0; i < k; i++) {
        t.len = 0;
        sv_token_text(s, best[i], &t);
        mc_buf_append(&t, "", 1, NULL);
        json_object_set_new(o, t.data ? t.data : "",
                            json_real(mc_logprob_at(logits, s->vpad, best[i])));
    }
    mc_buf_free(&t);
    return o;
}

/* the earliest stop string in text at or after byte `from`; -1 for none */
static long find_stop(const sv_req *r, size_t from)
{
    long at = -1;
    for (int i = 0; i < r->nstops; i++) {
        size_t n = strlen(r->stops[i]);
        for (size_t p = from; n && p + n <= r->text.len; p++)
            if (!memcmp(r->text.data + p, r->stops[i], n)) {
                if (at < 0 || (long)p < at) at = (long)p;
                break;
            }
    }
    return at;
}

/* Sample r's next token from its logits; 1 when r is finished. */
static int next_token(mc_serve *s, sv_req *r)
{
    int64_t k = (int64_t)r->out.n;
    int32_t t = mc_sample(&r->gen, r->logits, r->draw, (uint64_t)k, s->scratch, s->idx);
    /* a softmax over the vocabulary in double: only for a request that
     * returns log-probabilities (logprobs >= 0; serve_api.c reads lps only
     * then), not a serial cost of every step */
    r->lps[k] = r->logprobs >= 0 ? mc_logprob_at(r->logits, s->vpad, t) : 0.0;
    if (r->logprobs > 0) json_array_append_new(r->tops, alternatives(s, r->logits, r->logprobs));
    if (mc_ids_push(&r->out, t, NULL)) {
        r->finish = "length";
        return 1;
    }
    s->m.gen_tokens++;
    if (!k) {
        r->t_first = sv_now();
        double d = r->t_first - r->t_arrive;
        static const double B[SV_TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,  1,     2.5,  10};
        int b = 0;
        while (b < SV_TTFT_BUCKETS && d > B[b]) b++;
        s->m.ttft_hist[b]++;
        s->m.ttft_sum += d;
        s->m.ttft_count++;
    }
    if (t == s->eod || (s->eot >= 0 && t == s->eot)) {
        r->finish = "stop";
        return 1;
    }
    size_t before = r->text.len;
    mc_decode(s->tok, &t, 1, &r->text, NULL);
    if (r->nstops) {
        size_t from = before > r->max_stop ? before - r->max_stop : 0;
        long at = find_stop(r, from);
        if (at >= 0) {
            r->text.len = (size_t)at;
            r->finish = "stop";
            return 1;
        }
    }
    if ((int)r->out.n >= r->gen.max_new_tokens || r->len + 1 >= s->info.ctx) {
        r->finish = "length";
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ the scheduler */

static void observe_batch(mc_serve *s, int n, double secs)
{
    int b = 0;
    while (b < SV_BATCH_BUCKETS && n > (1 << b)) b++;
    s->m.batch_hist[b]++;
    s->m.batch_sum += n;
    s->m.steps++;
    s->m.busy_s += secs;
    if (n > s->m.max_batch_seen) s->m.max_batch_seen = n;
}

static void drop_cancelled(mc_serve *s)
{
    for (sv_req **pp = &s->qhead, *prev = NULL; *pp;) {
        sv_req *r = *pp;
        if (!r->cancelled) {
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (s->qtail == r) s->qtail = prev;
        s->nqueue--;
        s->reserved += r->need; /* finish_req takes back what was never reserved */
        finish_req(s, r);
    }
    for (int i = 0; i < s->nrun;) {
        sv_req *r = s->run[i];
        if (!r->cancelled) {
            i++;
            continue;
        }
        s->run[i] = s->run[--s->nrun];
        finish_req(s, r);
    }
}

static void admit(mc_serve *s)
{
    while (s->qhead && s->nrun < s->c.max_batch) {
        sv_req *r = s->qhead;
        if (mc_kvpool_blocks_free(s->pool) - s->reserved < r->need) break;
        s->qhead = r->next;
        if (!s->qhead) s->qtail = NULL;
        r->next = NULL;
        s->nqueue--;
        s->reserved += r->need;
        r->state = SV_RUNNING;
        s->run[s->nrun++] = r;
    }
}

static int held(const mc_serve *s) { return s->c.hold_file && access(s->c.hold_file, F_OK) == 0; }

/* Grow r's blocks to cover `positions`. */
static void grow(mc_serve *s, sv_req *r, int positions)
{
    int want = blocks_for(s, positions);
    if (want <= r->nblocks) return;
    /* reserved at admission: cannot fail */
    mc_kvpool_take(s->pool, want - r->nblocks, r->blocks + r->nblocks, NULL);
    s->reserved -= want - r->nblocks;
    r->nblocks = want;
}

/* ------------------------------------------------------------ tensor parallelism */

/* A step on the wire (int32): nb, then per sequence n, len, its block
 * count k, flags (1: logits wanted, 2: targets), n ids, n targets when
 * flagged, k block ids. Every rank runs mc_infer_batch on the same
 * description, so the head's rows and every collective match. */
enum { SV_WANT_LOGITS = 1, SV_HAS_TARGETS = 2 };

static int wire_room(mc_serve *s, size_t n)
{
    if (n <= s->wire_cap) return 1;
    int32_t *w = realloc(s->wire, n * sizeof *w);
    if (!w) return 0;
    s->wire = w;
    s->wire_cap = n;
    return 1;
}

static size_t seq_blocks(const mc_serve *s, const mc_kvseq *q)
{
    return (size_t)((q->len + q->n + s->c.block_size - 1) / s->c.block_size);
}

/* Rank 0: the step of nb sequences (nb < 0: quit) to the other ranks. */
static mc_status send_step(mc_serve *s, int nb, mc_error *err)
{
    size_t n = 1;
    for (int b = 0; b < nb; b++) {
        const mc_kvseq *q = &s->seqs[b];
        n += 4 + (size_t)q->n * (q->targets ? 2 : 1) + seq_blocks(s, q);
    }
    if (!wire_room(s, n)) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    int32_t *w = s->wire, head[2] = {nb, (int32_t)n};
    *w++ = nb;
    for (int b = 0; b < nb; b++) {
        const mc_kvseq *q = &s->seqs[b];
        size_t k = seq_blocks(s, q);
        *w++ = q->n;
        *w++ = q->len;
        *w++ = (int32_t)k;
        *w++ = (q->logits ? SV_WANT_LOGITS : 0) | (q->targets ? SV_HAS_TARGETS : 0);
        memcpy(w, q->tokens, (size_t)q->n * sizeof *w);
        w += q->n;
        if (q->targets) {
            memcpy(w, q->targets, (size_t)q->n * sizeof *w);
            w += q->n;
        }
        memcpy(w, q->blocks, k * sizeof *w);
        w += k;
    }
    mc_status st = mc_grid_broadcast_idle(&s->grid, head, sizeof head, 0, "a step's size", err);
    if (!st && nb > 0)
        st = mc_grid_broadcast_bytes(&s->grid, s->wire, n * sizeof *s->wire, 0, "a step", err);
    return st;
}

mc_status mc_serve_follow(mc_serve *s, mc_error *err)
{
    if (s->grid.rank == 0)
        return mc_error_set(err, MC_ERR_INTERNAL, "serving: rank 0 leads, it does not follow");
    for (;;) {
        int32_t head[2];
        mc_status st = mc_grid_broadcast_idle(&s->grid, head, sizeof head, 0, "a step's size", err);
        if (st) return st;
        int nb = head[0];
        if (nb < 0) return MC_OK;
        if (nb > s->c.max_batch || head[1] < 1 || !wire_room(s, (size_t)head[1]))
            return mc_error_set(err, MC_ERR_INTERNAL, "serving: a step of %d sequences", nb);
        st = mc_grid_broadcast_bytes(&s->grid, s->wire, (size_t)head[1] * sizeof *s->wire, 0,
                                     "a step", err);
        if (st) return st;
        const int32_t *w = s->wire + 1;
        for (int b = 0; b < nb; b++) {
            mc_kvseq *q = &s->seqs[b];
            memset(q, 0, sizeof *q);
            q->n = *w++;
            q->len = *w++;
            int k = *w++, flags = *w++;
            q->tokens = w;
            w += q->n;
            if (flags & SV_HAS_TARGETS) {
                q->targets = w;
                w += q->n;
            }
            q->blocks = w;
            w += k;
            if (flags & SV_WANT_LOGITS) q->logits = s->junk;
        }
        if ((st = mc_infer_batch(s->pool, s->seqs, nb, err))) return st;
    }
}

static void *scheduler(void *arg)
{
    mc_serve *s = arg;
    mc_error err;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        drop_cancelled(s);
        if (s->quit) break;
        admit(s);
        if (!s->nrun || held(s)) {
            if (s->c.hold_file) {
                /* tests: look at the file again soon */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 10 * 1000 * 1000;
                if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&s->work, &s->mu, &ts);
            } else {
                pthread_cond_wait(&s->work, &s->mu);
            }
            continue;
        }
        /* the batch: decodes first, then prompt chunks within the budget */
        int nb = 0, rows = 0, budget = s->c.max_batch_tokens;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < s->nrun && rows < budget; i++) {
                sv_req *r = s->run[i];
                int prefill = r->fed < (int)r->prompt.n;
                if (prefill != pass) continue;
                /* a prompt longer than what is left of the budget is cut;
                 * its next chunk joins a later step, beside whatever else
                 * runs then (its rows' bits do not depend on that) */
                mc_kvseq *q = &s->seqs[nb];
                memset(q, 0, sizeof *q);
                if (prefill) {
                    int n = (int)r->prompt.n - r->fed;
                    if (n > budget - rows) n = budget - rows;
                    q->tokens = r->prompt.v + r->fed;
                    q->n = n;
                    if (r->plps) {
                        int32_t *t = s->targets + rows;
                        for (int j = 0; j < n; j++)
                            t[j] = r->fed + j + 1 < (int)r->prompt.n ? r->prompt.v[r->fed + j + 1]
                                                                     : -1;
                        q->targets = t;
                        q->logprobs = r->plps + r->fed + 1;
                    }
                    if (r->fed + n == (int)r->prompt.n) q->logits = r->logits;
                } else {
                    q->tokens = &r->out.v[r->out.n - 1];
                    q->n = 1;
                    q->logits = r->logits;
                }
                grow(s, r, r->len + q->n);
                q->blocks = r->blocks;
                q->len = r->len;
                r->rows = q->n;
                s->inbatch[nb++] = r;
                rows += q->n;
            }
        pthread_mutex_unlock(&s->mu);
        double t0 = sv_now();
        mc_status st = s->grid.world > 1 ? send_step(s, nb, &err) : MC_OK;
        if (!st) st = mc_infer_batch(s->pool, s->seqs, nb, &err);
        double secs = sv_now() - t0;
        pthread_mutex_lock(&s->mu);
        observe_batch(s, nb, secs);
        int firsts = 0;
        for (int b = 0; b < nb; b++) {
            sv_req *r = s->inbatch[b];
            int done = 0;
            if (st) {
                /* cannot happen for requests the front checked; end it */
                r->finish = "length";
                done = 1;
            } else {
                r->len += r->rows;
                if (r->fed < (int)r->prompt.n) r->fed += r->rows;
                if (r->fed == (int)r->prompt.n && !r->cancelled) {
                    firsts += r->out.n == 0;
                    done = next_token(s, r);
                    if (!done && r->stream) sv_stream_update(s, r);
                }
            }
            if (done) {
                for (int i = 0; i < s->nrun; i++)
                    if (s->run[i] == r) {
                        memmove(s->run + i, s->run + i + 1,
                                (size_t)(s->nrun - i - 1) * sizeof *s->run);
                        s->nrun--;
                        break;
                    }
                finish_req(s, r);
            }
        }
        if (firsts && s->c.hold_at_first && s->c.hold_file) {
            FILE *f = fopen(s->c.hold_file, "w");
            if (f) fclose(f);
            s->c.hold_at_first = 0; /* once */
        }
        pthread_cond_broadcast(&s->progress);
    }
    /* quitting: the other ranks stop following; whatever is left is
     * cancelled */
    if (s->grid.world > 1) {
        mc_error qerr;
        mc_error_clear(&qerr);
        send_step(s, -1, &qerr);
    }
    for (sv_req *r = s->qhead; r; r = r->next) r->cancelled = 1;
    for (int i = 0; i < s->nrun; i++) s->run[i]->cancelled = 1;
    drop_cancelled(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ------------------------------------------------------------ opening */

static mc_status read_ckpt(mc_serve *s, int *weights, mc_error *err)
{
    const mc_serve_config *c = &s->c;
    mc_ckpt_reader *rd = NULL;
    mc_model_config cfg;
    mc_status st = mc_ckpt_open(c->ckpt, &rd, err);
    if (!st) st = mc_ckpt_read_model_config(rd, &cfg, err);
    if (!st) st = mc_model_check_ep(&cfg, s->grid.ep, mc_ckpt_file(rd), err);
    /* a capacity factor drops tokens by what else is in the forward pass:
     * no batch invariance (mc-eval runs such a checkpoint) */
    if (!st && cfg.num_experts > 0 && cfg.moe_expert_capacity_factor > 0)
        st = mc_error_set(err, MC_ERR_USAGE,
                          "%s: a mixture of experts with capacity factor %g cannot be served: "
                          "the tokens it drops depend on the other requests in the batch",
                          mc_ckpt_file(rd), (double)cfg.moe_expert_capacity_factor);
    if (!st && !mc_ckpt_has_tokenizer(rd))
        st = mc_error_set(err, MC_ERR_NOTFOUND,
                          "%s: the checkpoint stores no tokenizer, and serving text needs one",
                          mc_ckpt_file(rd));
    if (!st) st = mc_ckpt_read_tokenizer(rd, &s->tok, err);
    if (!st) s->own = mc_ckpt_tokenizer_config(rd); /* its chat template and tokens */
    *weights = c->weights;
    if (!st && *weights < 0) {
        /* as the checkpoint stores its weights: its own int8 codes or bf16 values */
        const char *qkv = "model/decoder.layers.0.self_attention.linear_qkv.weight";
        mc_ckpt_dtype dt = MC_CKPT_FLOAT32;
        if (!mc_ckpt_has_tensor(rd, qkv) || mc_ckpt_tensor_info(rd, qkv, NULL, NULL, &dt, NULL))
            dt = MC_CKPT_FLOAT32;
        *weights = dt == MC_CKPT_INT8       ? MC_KV_WEIGHTS_INT8
                   : dt == MC_CKPT_BFLOAT16 ? MC_KV_WEIGHTS_BF16
                                            : MC_KV_WEIGHTS_FP32;
    }
    if (!st) {
        s->info.iteration = mc_ckpt_iteration(rd);
        snprintf(s->ckpt_dir, sizeof s->ckpt_dir, "%s", mc_ckpt_dir(rd));
        s->info.ctx = c->ctx ? c->ctx : cfg.seq_length;
    }
    mc_ckpt_close(rd);
    return st;
}

/* A special token of the model's tokenizer_config.json: a string or
 * {"content": ...}; NULL when absent. */
static const char *own_token(const json_t *own, const char *key)
{
    const json_t *v = json_object_get(own, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

/* The chat template's special tokens: the model's own (the checkpoint's
 * tokenizer_config.json) where it has them, else the tokenizer's
 * end-of-document token as eos_token and bos_token (GPT-2's <|endoftext|>
 * is both); the model's own eos_token, when it is another token, ends a
 * generation too (a chat model's end of turn). */
static mc_status chat_tokens(mc_serve *s, mc_error *err)
{
    mc_buf t = MC_BUF_INIT;
    s->eot = -1;
    if (s->eod >= 0) {
        mc_status st = mc_decode(s->tok, &s->eod, 1, &t, err);
        if (!st) st = mc_buf_append(&t, "", 1, err);
        if (st) return st;
        s->eos_text = t.data;
        s->bos_text = strdup(t.data);
        if (!s->bos_text) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    const char *eos = own_token(s->own, "eos_token"), *bos = own_token(s->own, "bos_token");
    if (eos) {
        free(s->eos_text);
        if (!(s->eos_text = strdup(eos))) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        int32_t id = mc_tokenizer_token_to_id(s->tok, eos);
        if (id >= 0 && id != s->eod) s->eot = id;
    }
    if (bos) {
        free(s->bos_text);
        if (!(s->bos_text = strdup(bos))) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    return MC_OK;
}

/* The chat template: --chat-template, else the one the checkpoint keeps in
 * its tokenizer_config.json (none: chat answers 501). */
static mc_status load_chat(mc_serve *s, mc_error *err)
{
    if (s->c.chat_template) return mc_chat_template_load(s->c.chat_template, &s->chat, err);
    const char *tpl = json_string_value(json_object_get(s->own, "chat_template"));
    if (!tpl) return MC_OK;
    char name[4200];
    snprintf(name, sizeof name, "%s/tokenizer_config.json[chat_template]", s->ckpt_dir);
    return mc_chat_template_parse(name, tpl, strlen(tpl), &s->chat, err);
}

mc_status mc_serve_open(const mc_serve_config *c, mc_serve **out, mc_error *err)
{
    *out = NULL;
    if (c->block_size < 1 || c->max_batch < 1 || c->max_batch_tokens < 1 || c->max_queue < 0)
        return mc_error_set(err, MC_ERR_USAGE, "serving: a bad configuration");
    mc_serve *s = calloc(1, sizeof *s);
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    s->c = *c;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->text_mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->progress, NULL);
    if (c->grid)
        s->grid = *c->grid;
    else
        mc_grid_single(&s->grid);
    int weights = 0;
    mc_status st = read_ckpt(s, &weights, err);
    if (!st) st = load_chat(s, err);
    if (!st) st = mc_backend_cpu_new(c->threads, &s->be, err);
    if (!st) st = mc_train_load_model(c->ckpt, &s->grid, s->be, 1, 1, MC_PREC_FP32, &s->model, err);
    if (!st) {
        mc_kvpool_config pc = {(size_t)(c->kv_cache_mb * 1048576.0), c->block_size, s->info.ctx,
                               c->max_batch_tokens, weights};
        st = mc_kvpool_new(s->model, &pc, &s->pool, err);
        if (st)
            mc_error_prefix(err, "--kv-cache-mb %g, --ctx-size %d", c->kv_cache_mb, s->info.ctx);
    }
    if (!st) st = mc_encoder_new(s->tok, &s->enc, err);
    if (!st) {
        s->vpad = mc_kvpool_padded_vocab(s->pool);
        s->vocab = mc_tokenizer_vocab_size(s->tok);
        if (s->vocab > s->vpad) s->vocab = s->vpad;
        s->eod = mc_tokenizer_eod(s->tok);
        st = chat_tokens(s, err);
    }
    if (!st) {
        s->scratch = malloc((size_t)s->vpad * sizeof *s->scratch);
        s->idx = malloc((size_t)s->vpad * sizeof *s->idx);
        s->run = calloc((size_t)c->max_batch, sizeof *s->run);
        s->inbatch = calloc((size_t)c->max_batch, sizeof *s->inbatch);
        s->seqs = calloc((size_t)c->max_batch, sizeof *s->seqs);
        s->targets = malloc((size_t)c->max_batch_tokens * sizeof *s->targets);
        s->junk = malloc((size_t)s->vpad * sizeof *s->junk);
        if (!s->scratch || !s->idx || !s->run || !s->inbatch || !s->seqs || !s->targets || !s->junk)
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        snprintf(s->model_name, sizeof s->model_name, "%s", c->model_name ? c->model_name : "mc");
        s->info.checkpoint = s->ckpt_dir;
        s->info.parameters = mc_model_global_numel(s->model);
        s->info.weights = weights;
        s->info.blocks = mc_kvpool_blocks(s->pool);
        s->info.block_size = c->block_size;
        s->info.model_name = s->model_name;
        s->info.chat = s->chat != NULL;
        s->info.blas_note = mc_backend_blas_note(s->be);
    }
    /* every rank opened, or none goes on */
    if (s->grid.world > 1) st = mc_grid_status_all(&s->grid, st, "opening the server", err);
    if (!st && s->grid.rank == 0) {
        int e = pthread_create(&s->thread, NULL, scheduler, s);
        if (e)
            st = mc_error_errno(err, MC_ERR_IO, e, "the scheduler thread");
        else
            s->thread_started = 1;
    }
    if (st) {
        mc_serve_free(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

const mc_serve_info *mc_serve_get_info(const mc_serve *s) { return &s->info; }

void mc_serve_drain(mc_serve *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    while (s->nqueue || s->nrun) pthread_cond_wait(&s->progress, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void mc_serve_stop(mc_serve *s)
{
    if (!s || !s->thread_started) return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->thread_started = 0;
}

void mc_serve_free(mc_serve *s)
{
    if (!s) return;
    mc_serve_stop(s);
    mc_kvpool_free(s->pool);
    mc_model_free(s->model);
    if (s->be) mc_backend_free(s->be);
    mc_encoder_free(s->enc);
    mc_tokenizer_free(s->tok);
    mc_chat_template_free(s->chat);
    json_decref(s->own);
    free(s->bos_text);
    free(s->eos_text);
    free(s->scratch);
    free(s->idx);
    free(s->run);
    free(s->inbatch);
    free(s->seqs);
    free(s->targets);
    free(s->wire);
    free(s->junk);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->text_mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->progress);
    free(s);
}
