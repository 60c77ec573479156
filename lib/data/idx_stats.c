/*
 * idx_stats.c - statistics over a whole indexed dataset (mc --inspect).
 */
#include <math.h>
#include <stdlib.h>

#include "mc/indexed.h"

mc_status mc_idx_unigram_entropy(const mc_idx *x, double *nats, uint64_t *n_distinct,
                                 mc_error *err)
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
                st = mc_error_set(err, MC_ERR_FORMAT, "%s.bin: sequence %llu holds the negative id %d",
                                  x->prefix, (unsigned long long)s, v);
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
