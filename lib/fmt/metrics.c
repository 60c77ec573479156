/*
 * metrics.c - mc_metrics: the trainer's scalars, buffered per step and
 * written at each flush to a TensorBoard event file (tfevents.c) and a
 * JSON-lines log (jsonlog.c). See mc/metrics.h for what is written.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/metrics.h"
#include "fmt/tfevents.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *tag;
    int64_t step;
    double value;
    double wall_time; /* when it was given: the event's wall_time */
} entry;

typedef struct step_samples {
    int64_t step, samples;
} step_samples;

struct mc_metrics {
    bool has_tb, has_json;
    mc_tfevents tb;
    mc_jsonlog json;
    entry *e;
    size_t n, cap;
    step_samples *ss;
    size_t nss, capss;
};

/* Timing tags: Megatron writes no "vs samples" copy of these. */
static bool mirrored_vs_samples(const char *tag)
{
    static const char *const timing[] = {MC_TAG_ITERATION_TIME, MC_TAG_THROUGHPUT,
                                         MC_TAG_TOKENS_PER_SEC, MC_TAG_MFU};
    for (size_t i = 0; i < sizeof timing / sizeof *timing; i++)
        if (strcmp(tag, timing[i]) == 0) return false;
    return true;
}

mc_status mc_metrics_open(const char *tb_dir, const char *json_path, mc_metrics **out,
                          mc_error *err)
{
    *out = NULL;
    mc_metrics *m = calloc(1, sizeof *m);
    if (!m) return mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
    m->tb.fd = -1;
    m->json.fd = -1;
    mc_status s = MC_OK;
    if (tb_dir) {
        if ((s = mc_tfevents_open(&m->tb, tb_dir, mc_wall_time(), err)) != MC_OK) goto fail;
        m->has_tb = true;
    }
    if (json_path) {
        if ((s = mc_jsonlog_open(&m->json, json_path, err)) != MC_OK) goto fail;
        m->has_json = true;
    }
    *out = m;
    return MC_OK;
fail:
    mc_tfevents_close(&m->tb, NULL);
    mc_jsonlog_close(&m->json, NULL);
    free(m);
    return s;
}

mc_status mc_metrics_scalar(mc_metrics *m, const char *tag, int64_t step, double value,
                            mc_error *err)
{
    if (!tag || !*tag)
        return mc_error_set(err, MC_ERR_USAGE, "metrics: empty tag at step %" PRId64, step);
    if (!m->has_tb && !m->has_json) return MC_OK;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].step == step && strcmp(m->e[i].tag, tag) == 0)
            return mc_error_set(err, MC_ERR_USAGE, "metrics: '%s' given twice for step %" PRId64,
                                tag, step);
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 32;
        entry *e = realloc(m->e, cap * sizeof *e);
        if (!e) return mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
        m->e = e;
        m->cap = cap;
    }
    char *t = strdup(tag);
    if (!t) return mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
    m->e[m->n++] = (entry){t, step, value, mc_wall_time()};
    return MC_OK;
}

mc_status mc_metrics_samples(mc_metrics *m, int64_t step, int64_t consumed_samples, mc_error *err)
{
    if (!m->has_tb && !m->has_json) return MC_OK;
    for (size_t i = 0; i < m->nss; i++)
        if (m->ss[i].step == step) {
            m->ss[i].samples = consumed_samples;
            return MC_OK;
        }
    if (m->nss == m->capss) {
        size_t cap = m->capss ? 2 * m->capss : 8;
        step_samples *ss = realloc(m->ss, cap * sizeof *ss);
        if (!ss) return mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
        m->ss = ss;
        m->capss = cap;
    }
    m->ss[m->nss++] = (step_samples){step, consumed_samples};
    return MC_OK;
}

/* Encode and frame one Event of n scalars into rec. */
static mc_status tb_event(mc_buf *rec, double wall_time, int64_t step, const char *const *tags,
                          const double *values, size_t n, mc_error *err)
{
    mc_buf ev = MC_BUF_INIT;
    mc_status s = mc_tfevent_encode_scalars(&ev, wall_time, step, tags, values, n, err);
    if (s == MC_OK) s = mc_tfrecord_append(rec, ev.data, ev.len, err);
    mc_buf_free(&ev);
    return s;
}

/* Write the entries of one step: idx[0..k) index m->e. */
static mc_status flush_step(mc_metrics *m, const size_t *idx, size_t k, const char **tags,
                            double *values, mc_buf *rec, mc_buf *line, mc_error *err)
{
    int64_t step = m->e[idx[0]].step;
    const step_samples *ss = NULL;
    for (size_t i = 0; i < m->nss; i++)
        if (m->ss[i].step == step) ss = &m->ss[i];
    mc_status s = MC_OK;

    if (m->has_tb) {
        for (size_t i = 0; i < k; i++) {
            tags[i] = m->e[idx[i]].tag;
            values[i] = m->e[idx[i]].value;
        }
        double wall = m->e[idx[0]].wall_time;
        if ((s = tb_event(rec, wall, step, tags, values, k, err)) != MC_OK) return s;
        if (ss) {
            /* Megatron's "TAG vs samples": same value, step = samples. */
            size_t nv = 0;
            char **vs = calloc(k ? k : 1, sizeof *vs);
            if (!vs) return mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
            for (size_t i = 0; i < k && s == MC_OK; i++) {
                if (!mirrored_vs_samples(m->e[idx[i]].tag)) continue;
                if (asprintf(&vs[nv], "%s" MC_METRICS_VS_SAMPLES, m->e[idx[i]].tag) < 0) {
                    vs[nv] = NULL;
                    s = mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
                    break;
                }
                tags[nv] = vs[nv];
                values[nv] = m->e[idx[i]].value;
                nv++;
            }
            if (s == MC_OK && nv > 0) s = tb_event(rec, wall, ss->samples, tags, values, nv, err);
            for (size_t i = 0; i < nv; i++) free(vs[i]);
            free(vs);
            if (s) return s;
        }
    }

    if (m->has_json) {
        line->len = 0;
        if ((s = mc_buf_printf(line, err, "{\"step\": %" PRId64, step)) != MC_OK) return s;
        if (ss && (s = mc_buf_printf(line, err, ", \"consumed-samples\": %" PRId64, ss->samples)) !=
                      MC_OK)
            return s;
        for (size_t i = 0; i < k; i++) {
            if ((s = mc_buf_append(line, ", ", 2, err)) != MC_OK ||
                (s = mc_jsonlog_string(line, m->e[idx[i]].tag, err)) != MC_OK ||
                (s = mc_buf_append(line, ": ", 2, err)) != MC_OK ||
                (s = mc_jsonlog_number(line, m->e[idx[i]].value, err)) != MC_OK)
                return s;
        }
        if ((s = mc_buf_append(line, "}\n", 2, err)) != MC_OK) return s;
        s = mc_jsonlog_write(&m->json, line->data, line->len, err);
    }
    return s;
}

mc_status mc_metrics_flush(mc_metrics *m, mc_error *err)
{
    if (!m || m->n == 0) return MC_OK;
    mc_status s = MC_OK;
    size_t *idx = malloc(m->n * sizeof *idx);
    bool *done = calloc(m->n, sizeof *done);
    const char **tags = malloc(m->n * sizeof *tags);
    double *values = malloc(m->n * sizeof *values);
    mc_buf rec = MC_BUF_INIT, line = MC_BUF_INIT;
    if (!idx || !done || !tags || !values) {
        s = mc_error_set(err, MC_ERR_NOMEM, "metrics: out of memory");
        goto out;
    }
    /* Steps in order of first appearance; a step's tags in the order given. */
    for (size_t i = 0; i < m->n && s == MC_OK; i++) {
        if (done[i]) continue;
        size_t k = 0;
        for (size_t j = i; j < m->n; j++)
            if (!done[j] && m->e[j].step == m->e[i].step) {
                idx[k++] = j;
                done[j] = true;
            }
        s = flush_step(m, idx, k, tags, values, &rec, &line, err);
    }
    /* All events of a flush go out in one write, so a reader never sees half
     * of a flush unless the disk fills. */
    if (s == MC_OK && m->has_tb && rec.len > 0)
        s = mc_tfevents_write(&m->tb, rec.data, rec.len, mc_wall_time(), err);
out:
    /* The buffer is emptied even on failure: a full disk must not make the
     * next flush repeat steps already (partly) written. */
    for (size_t i = 0; i < m->n; i++) free(m->e[i].tag);
    m->n = 0;
    m->nss = 0;
    free(idx);
    free(done);
    free(tags);
    free(values);
    mc_buf_free(&rec);
    mc_buf_free(&line);
    return s;
}

const char *mc_metrics_tb_path(const mc_metrics *m) { return m && m->has_tb ? m->tb.path : NULL; }

mc_status mc_metrics_close(mc_metrics *m, mc_error *err)
{
    if (!m) return MC_OK;
    mc_status s = mc_metrics_flush(m, err);
    mc_status s2 = mc_tfevents_close(&m->tb, s ? NULL : err);
    if (s == MC_OK) s = s2;
    s2 = mc_jsonlog_close(&m->json, s ? NULL : err);
    if (s == MC_OK) s = s2;
    free(m->e);
    free(m->ss);
    free(m);
    return s;
}
