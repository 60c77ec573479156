/*
 * preprocess.c - the preprocessing pipeline (see mc/preprocess.h).
 *
 * Two batches are in flight: while the workers tokenize batch k, the calling
 * thread reads batch k+1; then it writes batch k in record order. Workers
 * take records from the batch in small chunks through an atomic counter, so
 * a long document does not stall the others, and every result lands in the
 * record's own slot: the order of the output never depends on the schedule.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc/buf.h"
#include "mc/indexed.h"
#include "mc/preprocess.h"

#define DEFAULT_BATCH_DOCUMENTS 2048
#define DEFAULT_BATCH_BYTES (8u << 20)
#define CHUNK 8 /* records a worker takes at a time */

enum slot_state { SLOT_OK, SLOT_BLANK, SLOT_INVALID, SLOT_EMPTY, SLOT_FATAL };

typedef struct slot {
    size_t off, len;  /* the record's bytes in the batch arena */
    const char *file; /* owned by the docsource, stable for its lifetime */
    uint64_t line;
    enum slot_state state;
    char *errmsg; /* set when state != SLOT_OK */
    mc_status code;
    mc_ids *ids; /* one per key, capacity reused across batches */
} slot;

typedef struct batch {
    mc_buf arena;
    slot *slots;
    size_t n, cap;
    atomic_size_t next; /* next record to hand out */
    int eof;            /* the source ended with this batch */
} batch;

typedef struct worker_ctx worker_ctx;

typedef struct pipeline {
    const mc_preprocess_config *c;
    const char *const *keys;
    size_t n_keys;
    int32_t eod;
    /* hand-off between the reader and the workers */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    batch *current;      /* the batch being tokenized, NULL when idle */
    uint64_t generation; /* bumped for every dispatched batch */
    int busy;            /* workers still on the current batch */
    int quit;
    worker_ctx *workers;
    pthread_t *threads;
    int n_started;
} pipeline;

struct worker_ctx {
    pipeline *p;
    mc_encoder *enc;
    mc_buf *vals; /* one per key: the extracted text */
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void mc_preprocess_config_init(mc_preprocess_config *c)
{
    memset(c, 0, sizeof *c);
    c->source.format = MC_INPUT_JSONL;
    c->source.max_record_bytes = 64u << 20;
    c->workers = 1;
}

mc_status mc_dataset_prefix(char *dst, size_t size, const char *output_prefix, const char *key,
                            mc_error *err)
{
    int n = snprintf(dst, size, "%s_%s_document", output_prefix, key);
    if (n < 0 || (size_t)n >= size)
        return mc_error_set(err, MC_ERR_LIMIT, "%s: output prefix too long", output_prefix);
    return MC_OK;
}

static void slot_fail(slot *s, enum slot_state st, const mc_error *e)
{
    s->state = st;
    s->code = e->code;
    s->errmsg = strdup(e->msg);
}

/* Tokenize one record into its slot: extract the keys (JSONL) or take the
 * whole record (text), encode each, append EOD. */
static void process_record(worker_ctx *w, batch *b, slot *s)
{
    const pipeline *p = w->p;
    const char *data = b->arena.data + s->off;
    mc_error e;
    mc_error_clear(&e);
    for (size_t k = 0; k < p->n_keys; k++) s->ids[k].n = 0;

    if (p->c->sft) {
        char where[4200];
        snprintf(where, sizeof where, "%s:%llu", s->file, (unsigned long long)s->line);
        mc_status rc = p->c->preference
                           ? mc_pref_encode(p->c->sft, w->enc, p->eod, where, data, s->len,
                                            &s->ids[0], &s->ids[1], &s->ids[2], &s->ids[3], &e)
                           : mc_sft_encode(p->c->sft, w->enc, p->eod, where, data, s->len,
                                           &s->ids[0], &s->ids[1], &e);
        if (rc != MC_OK) slot_fail(s, e.code == MC_ERR_NOMEM ? SLOT_FATAL : SLOT_INVALID, &e);
        return;
    }
    const char *texts[16];
    size_t lens[16];
    if (p->c->source.format == MC_INPUT_JSONL) {
        mc_record rec = {data, s->len, s->file, s->line};
        if (mc_jsonl_extract(&rec, p->keys, p->n_keys, w->vals, &e) != MC_OK) {
            slot_fail(s, SLOT_INVALID, &e);
            return;
        }
        for (size_t k = 0; k < p->n_keys; k++) {
            texts[k] = w->vals[k].data;
            lens[k] = w->vals[k].len;
        }
    } else {
        /* Blank lines separate documents in a text file; they are not
         * documents themselves (as blank JSONL lines are not records). */
        if (p->c->source.lines && s->len == 0) {
            s->state = SLOT_BLANK;
            return;
        }
        texts[0] = data;
        lens[0] = s->len;
    }
    for (size_t k = 0; k < p->n_keys; k++) {
        if (lens[k] == 0) {
            if (s->line)
                mc_error_set(&e, MC_ERR_FORMAT, "%s:%llu: empty document%s%s%s", s->file,
                             (unsigned long long)s->line, p->n_keys > 1 ? " (key '" : "",
                             p->n_keys > 1 ? p->keys[k] : "", p->n_keys > 1 ? "')" : "");
            else
                mc_error_set(&e, MC_ERR_FORMAT, "%s: empty document", s->file);
            slot_fail(s, SLOT_EMPTY, &e);
            return;
        }
        if (mc_encode(w->enc, texts[k], lens[k], &s->ids[k], &e) != MC_OK) {
            if (s->line)
                mc_error_prefix(&e, "%s:%llu", s->file, (unsigned long long)s->line);
            else
                mc_error_prefix(&e, "%s", s->file);
            slot_fail(s, SLOT_INVALID, &e);
            return;
        }
        if (p->c->append_eod && mc_ids_push(&s->ids[k], p->eod, &e) != MC_OK) {
            slot_fail(s, SLOT_FATAL, &e);
            return;
        }
    }
}

static void *worker_main(void *arg)
{
    worker_ctx *w = arg;
    pipeline *p = w->p;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        batch *b = p->current;
        pthread_mutex_unlock(&p->mu);

        for (;;) {
            size_t i = atomic_fetch_add(&b->next, CHUNK);
            if (i >= b->n) break;
            size_t end = i + CHUNK < b->n ? i + CHUNK : b->n;
            for (; i < end; i++) process_record(w, b, &b->slots[i]);
        }

        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void dispatch(pipeline *p, batch *b)
{
    atomic_store(&b->next, 0);
    pthread_mutex_lock(&p->mu);
    p->current = b;
    p->busy = p->n_started;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
}

static void wait_done(pipeline *p)
{
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    p->current = NULL;
    pthread_mutex_unlock(&p->mu);
}

static void batch_reset(batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->slots[i].errmsg);
        b->slots[i].errmsg = NULL;
        b->slots[i].state = SLOT_OK;
    }
    b->n = 0;
    b->arena.len = 0;
    b->eof = 0;
}

static void batch_free(batch *b, size_t n_keys)
{
    batch_reset(b);
    for (size_t i = 0; i < b->cap; i++) {
        for (size_t k = 0; k < n_keys; k++) mc_ids_free(&b->slots[i].ids[k]);
        free(b->slots[i].ids);
    }
    free(b->slots);
    mc_buf_free(&b->arena);
}

/* Fill b with the next records, up to the batch limits. */
static mc_status read_batch(pipeline *p, mc_docsource *src, batch *b, size_t max_docs,
                            size_t max_bytes, mc_error *err)
{
    batch_reset(b);
    while (b->n < max_docs && b->arena.len < max_bytes) {
        mc_record rec;
        int eof = 0;
        mc_status st = mc_docsource_next(src, &rec, &eof, err);
        if (st != MC_OK) return st;
        if (eof) {
            b->eof = 1;
            break;
        }
        if (b->n == b->cap) {
            size_t ncap = b->cap ? b->cap * 2 : 64;
            slot *ns = realloc(b->slots, ncap * sizeof *ns);
            if (!ns) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            for (size_t i = b->cap; i < ncap; i++) {
                memset(&ns[i], 0, sizeof ns[i]);
                ns[i].ids = calloc(p->n_keys, sizeof(mc_ids));
                if (!ns[i].ids) {
                    b->slots = ns;
                    b->cap = i;
                    return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                }
            }
            b->slots = ns;
            b->cap = ncap;
        }
        slot *s = &b->slots[b->n];
        s->off = b->arena.len;
        s->len = rec.len;
        s->file = rec.file;
        s->line = rec.line;
        s->state = SLOT_OK;
        if (mc_buf_append(&b->arena, rec.data, rec.len, err) != MC_OK) return err->code;
        b->n++;
    }
    return MC_OK;
}

/* Append batch b to the datasets in record order; bad records fail the run
 * or, with skip_invalid, are counted. */
static mc_status write_batch(pipeline *p, batch *b, mc_idx_writer **writers,
                             mc_preprocess_stats *st, mc_error *err)
{
    for (size_t i = 0; i < b->n; i++) {
        slot *s = &b->slots[i];
        if (s->state == SLOT_BLANK) continue;
        st->records++;
        if (s->state != SLOT_OK) {
            if (s->state != SLOT_FATAL && p->c->skip_invalid) {
                if (s->state == SLOT_EMPTY)
                    st->skipped_empty++;
                else
                    st->skipped_invalid++;
                continue;
            }
            return mc_error_set(err, s->code ? s->code : MC_ERR_FORMAT, "%s", s->errmsg);
        }
        for (size_t k = 0; k < p->n_keys; k++) {
            mc_status rc = mc_idx_writer_add(writers[k], s->ids[k].v, s->ids[k].n, err);
            if (rc != MC_OK) return rc;
            if (!(p->c->sft && k % 2 == 1)) st->tokens += s->ids[k].n; /* not a mask */
        }
        st->documents++;
        st->text_bytes += s->len;
    }
    return MC_OK;
}

static void stop_workers(pipeline *p)
{
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    for (int i = 0; p->workers && i < p->c->workers; i++) {
        worker_ctx *w = &p->workers[i];
        mc_encoder_free(w->enc);
        if (w->vals)
            for (size_t k = 0; k < p->n_keys; k++) mc_buf_free(&w->vals[k]);
        free(w->vals);
    }
    free(p->workers);
    free(p->threads);
}

mc_status mc_preprocess_run(const mc_preprocess_config *c, mc_preprocess_stats *stats,
                            mc_error *err)
{
    static const char *const default_keys[] = {"text"};
    static const char *const sft_keys[] = {"messages", "messages loss mask"};
    static const char *const pref_keys[] = {"chosen", "chosen loss mask", "rejected",
                                            "rejected loss mask"};
    mc_preprocess_stats st;
    memset(&st, 0, sizeof st);
    double t0 = now_seconds();

    pipeline p;
    memset(&p, 0, sizeof p);
    p.c = c;
    if (c->sft) {
        if (c->source.format != MC_INPUT_JSONL)
            return mc_error_set(err, MC_ERR_USAGE, "--dataset-type sft reads JSONL");
        p.keys = c->preference ? pref_keys : sft_keys;
        p.n_keys = c->preference ? 4 : 2;
    } else if (c->source.format == MC_INPUT_TEXT || c->n_json_keys == 0) {
        p.keys = default_keys;
        p.n_keys = 1;
    } else {
        p.keys = c->json_keys;
        p.n_keys = c->n_json_keys;
    }
    if (p.n_keys > 16) return mc_error_set(err, MC_ERR_USAGE, "--json-keys: at most 16 keys");
    if (c->workers < 1) return mc_error_set(err, MC_ERR_USAGE, "--workers must be at least 1");
    p.eod = mc_tokenizer_eod(c->tokenizer);
    if ((c->append_eod || c->sft) && p.eod < 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: the tokenizer has no end-of-document token",
                            c->preference ? "--dataset-type preference"
                            : c->sft      ? "--dataset-type sft"
                                          : "--append-eod");

    mc_dtype dtype = mc_idx_dtype_for_vocab(mc_tokenizer_vocab_size(c->tokenizer));
    mc_idx_writer *writers[16] = {0};
    mc_docsource *src = NULL;
    batch bufs[2];
    memset(bufs, 0, sizeof bufs);
    mc_status rc = MC_OK;

    /* Check every input and every output before reading anything. */
    rc = mc_docsource_open(c->inputs, c->n_inputs, &c->source, &src, err);
    if (rc != MC_OK) return rc;
    for (size_t k = 0; k < p.n_keys && rc == MC_OK; k++) {
        char prefix[4096];
        /* beside the tokens: PREFIX_messages_document_loss_mask */
        int mask = c->sft && k % 2 == 1;
        rc = mc_dataset_prefix(prefix, sizeof prefix - 16, c->output_prefix, p.keys[k & ~(size_t)1],
                               err);
        if (mask)
            strcat(prefix, "_loss_mask");
        else if (rc == MC_OK)
            rc = mc_dataset_prefix(prefix, sizeof prefix, c->output_prefix, p.keys[k], err);
        if (rc == MC_OK)
            rc = mc_idx_writer_open(prefix, mask ? MC_DTYPE_U8 : dtype, &writers[k], err);
    }
    if (rc != MC_OK) goto out_noworkers;

    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.work_cv, NULL);
    pthread_cond_init(&p.done_cv, NULL);
    p.workers = calloc((size_t)c->workers, sizeof *p.workers);
    p.threads = calloc((size_t)c->workers, sizeof *p.threads);
    if (!p.workers || !p.threads) {
        rc = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < c->workers; i++) {
        worker_ctx *w = &p.workers[i];
        w->p = &p;
        w->vals = calloc(p.n_keys, sizeof(mc_buf));
        if (!w->vals) {
            rc = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            goto out;
        }
        rc = mc_encoder_new(c->tokenizer, &w->enc, err);
        if (rc != MC_OK) goto out;
        if (pthread_create(&p.threads[i], NULL, worker_main, w) != 0) {
            rc = mc_error_set(err, MC_ERR_INTERNAL, "cannot start worker thread");
            goto out;
        }
        p.n_started++;
    }

    size_t max_docs = c->batch_documents ? c->batch_documents : DEFAULT_BATCH_DOCUMENTS;
    size_t max_bytes = c->batch_bytes ? c->batch_bytes : DEFAULT_BATCH_BYTES;
    int cur = 0;
    rc = read_batch(&p, src, &bufs[cur], max_docs, max_bytes, err);
    while (rc == MC_OK) {
        batch *b = &bufs[cur];
        if (b->n == 0) break;
        dispatch(&p, b);
        /* Read the next batch while the workers tokenize this one. */
        batch *nb = &bufs[cur ^ 1];
        mc_error read_err;
        mc_error_clear(&read_err);
        mc_status read_rc = b->eof ? MC_OK
                                   : read_batch(&p, src, nb, max_docs, max_bytes, &read_err);
        if (b->eof) batch_reset(nb);
        wait_done(&p);
        rc = write_batch(&p, b, writers, &st, err);
        if (rc != MC_OK) break;
        if (read_rc != MC_OK) {
            *err = read_err;
            rc = read_rc;
            break;
        }
        if (c->cancel && *c->cancel) {
            rc = mc_error_set(err, MC_ERR_IO, "interrupted");
            break;
        }
        mc_docsource_progress(src, &st.input_done, &st.input_total);
        st.seconds = now_seconds() - t0;
        if (c->progress) c->progress(c->progress_ctx, &st, 0);
        if (b->eof) break;
        cur ^= 1;
    }
    if (rc == MC_OK && st.documents == 0)
        rc = mc_error_set(err, MC_ERR_FORMAT, "no documents in the input%s",
                          st.records ? " (every record was skipped)" : "");

out:
    stop_workers(&p);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.work_cv);
    pthread_cond_destroy(&p.done_cv);
out_noworkers:
    for (size_t k = 0; k < p.n_keys; k++) {
        if (!writers[k]) continue;
        if (rc == MC_OK)
            rc = mc_idx_writer_commit(writers[k], err);
        else
            mc_idx_writer_abort(writers[k]);
        writers[k] = NULL;
    }
    if (src) {
        mc_docsource_progress(src, &st.input_done, &st.input_total);
        mc_docsource_close(src);
    }
    batch_free(&bufs[0], p.n_keys);
    batch_free(&bufs[1], p.n_keys);
    st.seconds = now_seconds() - t0;
    if (rc == MC_OK && c->progress) c->progress(c->progress_ctx, &st, 1);
    if (stats) *stats = st;
    return rc;
}
