/*
 * idx_stats.c - statistics over a whole indexed dataset and one document's
 * ids (mc-preprocess --inspect).
 */
#include <math.h>
#include <stdlib.h>

#include "mc/indexed.h"

/* Ids below this are counted in a table indexed by id (8 MiB at most,
 * every published vocabulary fits); the rare larger ids of an int32
 * dataset go to a hash table that grows with the distinct ids met, so
 * memory follows the file's contents, never an id's value (one id
 * 2^31 - 1 in an 8-byte .bin must not cost a 16 GiB table). */
#define DENSE_IDS ((size_t)1 << 20)

typedef struct id_counts {
    uint64_t *dense; /* [0, dense_cap) */
    size_t dense_cap;
    uint32_t *key; /* open addressing; key 0 is empty (ids here are >= DENSE_IDS) */
    uint64_t *val;
    size_t cap, used;
} id_counts;

static int count_big(id_counts *c, uint32_t v)
{
    if (2 * (c->used + 1) > c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 1024;
        uint32_t *nk = calloc(ncap, sizeof *nk);
        uint64_t *nv = calloc(ncap, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return -1;
        }
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->key[i]) continue;
            size_t j = (c->key[i] * 2654435761u) & (ncap - 1);
            while (nk[j]) j = (j + 1) & (ncap - 1);
            nk[j] = c->key[i];
            nv[j] = c->val[i];
        }
        free(c->key);
        free(c->val);
        c->key = nk;
        c->val = nv;
        c->cap = ncap;
    }
    size_t j = (v * 2654435761u) & (c->cap - 1);
    while (c->key[j] && c->key[j] != v) j = (j + 1) & (c->cap - 1);
    if (!c->key[j]) {
        c->key[j] = v;
        c->used++;
    }
    c->val[j]++;
    return 0;
}

static int count_id(id_counts *c, uint32_t v)
{
    if (v >= DENSE_IDS) return count_big(c, v);
    if (v >= c->dense_cap) {
        size_t ncap = c->dense_cap ? c->dense_cap : 1024;
        while (ncap <= v) ncap *= 2;
        uint64_t *nc = realloc(c->dense, ncap * sizeof *nc);
        if (!nc) return -1;
        for (size_t j = c->dense_cap; j < ncap; j++) nc[j] = 0;
        c->dense = nc;
        c->dense_cap = ncap;
    }
    c->dense[v]++;
    return 0;
}

mc_status mc_idx_unigram_entropy(const mc_idx *x, double *nats, uint64_t *n_distinct, mc_error *err)
{
    /* Count every id in one pass over the sequences, then
     * H = ln N - (1/N) sum_v c_v ln c_v, which needs no second pass. */
    id_counts c = {0};
    uint64_t total = 0;
    mc_ids ids = MC_IDS_INIT;
    mc_status st = MC_OK;
    for (uint64_t s = 0; s < x->n_seq && st == MC_OK; s++) {
        ids.n = 0;
        st = mc_idx_read(x, s, &ids, err);
        for (size_t i = 0; i < ids.n && st == MC_OK; i++) {
            int32_t v = ids.v[i];
            if (v < 0) {
                st = mc_error_set(err, MC_ERR_FORMAT,
                                  "%s.bin: sequence %llu holds the negative id %d", x->prefix,
                                  (unsigned long long)s, v);
                break;
            }
            if (count_id(&c, (uint32_t)v) != 0) {
                st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                break;
            }
            total++;
        }
    }
    if (st == MC_OK) {
        double sum = 0;
        uint64_t distinct = 0;
        for (size_t v = 0; v < c.dense_cap; v++)
            if (c.dense[v]) {
                sum += (double)c.dense[v] * log((double)c.dense[v]);
                distinct++;
            }
        for (size_t j = 0; j < c.cap; j++)
            if (c.key[j]) {
                sum += (double)c.val[j] * log((double)c.val[j]);
                distinct++;
            }
        *nats = total ? log((double)total) - sum / (double)total : 0.0;
        if (n_distinct) *n_distinct = distinct;
    }
    free(c.dense);
    free(c.key);
    free(c.val);
    mc_ids_free(&ids);
    return st;
}

void mc_idx_length_stats(const mc_idx *x, uint64_t *tokens, int64_t *min_len, int64_t *max_len)
{
    uint64_t n = 0;
    int64_t mn = 0, mx = 0;
    for (uint64_t i = 0; i < x->n_seq; i++) {
        int32_t l = mc_idx_length(x, i);
        n += (uint64_t)l;
        if (i == 0 || l < mn) mn = l;
        if (i == 0 || l > mx) mx = l;
    }
    *tokens = n;
    *min_len = mn;
    *max_len = mx;
}

mc_status mc_idx_read_document(const mc_idx *x, uint64_t doc, mc_ids *out, mc_error *err)
{
    int64_t s0 = mc_idx_doc_index(x, doc), s1 = mc_idx_doc_index(x, doc + 1);
    mc_status st = MC_OK;
    for (int64_t s = s0; s < s1 && st == MC_OK; s++) st = mc_idx_read(x, (uint64_t)s, out, err);
    return st;
}
