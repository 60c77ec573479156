/*
 * fuzz_indexed.c - Megatron's indexed dataset reader (mc/indexed.h): the
 * input is PREFIX.idx, FUZZ_SEP, PREFIX.bin; every sequence and document
 * is read, and the statistics mc-preprocess --stats prints are computed.
 */
#include "fuzz.h"
#include "mc/indexed.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    const uint8_t *part[2];
    size_t len[2];
    fuzz_split(d, n, part, len, 2);
    fuzz_write(fuzz_path(0, "f.idx"), part[0], len[0]);
    fuzz_write(fuzz_path(1, "f.bin"), part[1], len[1]);
    mc_idx x;
    mc_error err = {0};
    if (mc_idx_open(fuzz_path(2, "f"), &x, &err) != MC_OK) return 0;
    mc_ids ids = {0};
    for (uint64_t s = 0; s < x.n_seq && s < 4096; s++) {
        ids.n = 0;
        (void)mc_idx_read(&x, s, &ids, &err);
    }
    for (uint64_t doc = 0; doc + 1 < x.n_doc_idx && doc < 4096; doc++) {
        ids.n = 0;
        (void)mc_idx_read_document(&x, doc, &ids, &err);
    }
    uint64_t tokens, distinct;
    int64_t lo, hi;
    double nats;
    mc_idx_length_stats(&x, &tokens, &lo, &hi);
    (void)mc_idx_unigram_entropy(&x, &nats, &distinct, &err);
    mc_ids_free(&ids);
    mc_idx_close(&x);
    return 0;
}
