/*
 * indexed.h - Megatron's indexed dataset: PREFIX.bin (token ids back to back)
 * and PREFIX.idx (MMIDIDX version 1), byte for byte what megatron-core's
 * IndexedDataset reads.
 *
 * .idx layout (little-endian):
 *   char[9]   magic "MMIDIDX\0\0"
 *   uint64    version = 1
 *   uint8     dtype code (mc_dtype)
 *   uint64    sequence count S
 *   uint64    document index count D (documents + 1)
 *   int32[S]  sequence lengths (in elements)
 *   int64[S]  sequence byte offsets into .bin
 *   int64[D]  document indices (sequence index where each document starts; 0 first, S last)
 * Here every document is one sequence, so document indices are 0..S.
 */
#ifndef MC_INDEXED_H
#define MC_INDEXED_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/buf.h"
#include "mc/dtype.h"
#include "mc/file.h"

#ifdef __cplusplus
extern "C" {
#endif

/* uint16 when every id fits under 65500 (vocab_size < 65500), else int32. */
mc_dtype mc_idx_dtype_for_vocab(int64_t vocab_size);

typedef struct mc_idx_writer mc_idx_writer;

/* Opens PREFIX.bin and PREFIX.idx under temporary names. */
mc_status mc_idx_writer_open(const char *prefix, mc_dtype dtype, mc_idx_writer **out,
                             mc_error *err);
/* Append one document (one sequence). Ids must fit the dtype. */
mc_status mc_idx_writer_add(mc_idx_writer *w, const int32_t *ids, size_t n, mc_error *err);
uint64_t mc_idx_writer_documents(const mc_idx_writer *w);
uint64_t mc_idx_writer_tokens(const mc_idx_writer *w);
/* Write .idx, then rename .bin and .idx into place; frees w. */
mc_status mc_idx_writer_commit(mc_idx_writer *w, mc_error *err);
/* Remove the temporaries; frees w. NULL is allowed. */
void mc_idx_writer_abort(mc_idx_writer *w);

typedef struct mc_idx {
    mc_map idx;
    mc_map bin;
    mc_dtype dtype;
    uint64_t n_seq;
    uint64_t n_doc_idx; /* documents + 1 */
    char *prefix;
} mc_idx;

/* Open and validate (magic, version, dtype, counts against the file size,
 * lengths and pointers against .bin, document indices monotone). */
mc_status mc_idx_open(const char *prefix, mc_idx *out, mc_error *err);
void mc_idx_close(mc_idx *x);
int32_t mc_idx_length(const mc_idx *x, uint64_t seq);
int64_t mc_idx_pointer(const mc_idx *x, uint64_t seq);
int64_t mc_idx_doc_index(const mc_idx *x, uint64_t i);
/* Append the ids of sequence seq to out. */
mc_status mc_idx_read(const mc_idx *x, uint64_t seq, mc_ids *out, mc_error *err);

/* Tokens in all sequences, and the shortest and longest sequence (0 and 0
 * for an empty dataset). */
void mc_idx_length_stats(const mc_idx *x, uint64_t *tokens, int64_t *min_len, int64_t *max_len);
/* Append the ids of every sequence of document doc (< the documents) to out. */
mc_status mc_idx_read_document(const mc_idx *x, uint64_t doc, mc_ids *out, mc_error *err);

/* Unigram entropy of all tokens, in nats: H = -sum_v p(v) ln p(v) with p the
 * token frequencies. A language model that has learned anything beyond token
 * frequencies has a cross-entropy below it. *n_distinct gets the number of
 * distinct ids. Ids must be in [0, 2^31). */
mc_status mc_idx_unigram_entropy(const mc_idx *x, double *nats, uint64_t *n_distinct,
                                 mc_error *err);

/* Concatenate datasets (same dtype) into out_prefix, as Megatron's
 * tools/merge_datasets.py does. */
mc_status mc_idx_merge(const char *const *prefixes, size_t n, const char *out_prefix,
                       mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
