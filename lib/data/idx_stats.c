/*
 * idx_stats.c - statistics over a whole indexed dataset and one document's
 * ids (mc-preprocess --inspect).
 */
#include <math.h>
#include <stdlib.h>

#include "mc/indexed.h"

mc_status mc_idx_unigram_entropy(const mc_idx *x, double *nats, uint64_t *n_distinct, mc_error *err)
{
    /* Count every id in one pass over the sequences, then
     * H = ln N - (1/N) sum_v c_v ln c_v, which needs no second pass. */
    uint64_t *count = NULL;
    size_t cap = 0;
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
            if ((size_t)v >= cap) {
                size_t ncap = cap ? cap : 1024;
                while (ncap <= (size_t)v) ncap *= 2;
                uint64_t *nc = realloc(count, ncap * sizeof *nc);
                if (!nc) {
                    st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                    break;
                }
                for (size_t j = cap; j < ncap; j++) nc[j] = 0;
                count = nc;
                cap = ncap;
            }
            count[v]++;
            total++;
        }
    }
    if (st == MC_OK) {
        double sum = 0;
        uint64_t distinct = 0;
        for (size_t v = 0; v < cap; v++)
            if (count[v]) {
                sum += (double)count[v] * log((double)count[v]);
                distinct++;
            }
        *nats = total ? log((double)total) - sum / (double)total : 0.0;
        if (n_distinct) *n_distinct = distinct;
    }
    free(count);
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
