/*
 * gpt_internal.h - private pieces of the GPT dataset (lib/data/gpt_*.c,
 * blend.c, mt19937.c, pcg64.c, npy.c, pyjson.c, md5.c): numpy's legacy
 * RandomState and its default_rng,
 * .npy files, Python-style JSON for Megatron's cache descriptions, MD5.
 * Not installed; nothing outside lib/data includes it.
 */
#ifndef MC_DATA_GPT_INTERNAL_H
#define MC_DATA_GPT_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "mc/buf.h"
#include "mc/file.h"
#include "mc/status.h"

/* ---- mt19937.c: numpy.random.RandomState (MT19937, legacy seeding) ---- */
#define MC_MT_N 624
typedef struct mc_mt19937 {
    uint32_t key[MC_MT_N];
    int pos;
} mc_mt19937;

/* RandomState(seed) for an integer seed in [0, 2^32): init_genrand. */
void mc_mt_seed(mc_mt19937 *s, uint32_t seed);
uint32_t mc_mt_next32(mc_mt19937 *s);
/* numpy's random_interval: uniform in [0, max] by masked rejection. */
uint64_t mc_mt_interval(mc_mt19937 *s, uint64_t max);
/* RandomState.shuffle of a 1-D array with elements of `size` bytes
 * (Fisher-Yates from the end, j = random_interval(i)). */
void mc_mt_shuffle(mc_mt19937 *s, void *data, int64_t n, size_t size);

/* ---- pcg64.c: numpy.random.default_rng (SeedSequence, PCG64) ---- */
typedef struct mc_pcg64 {
    uint64_t state[2], inc[2]; /* 128-bit, high word first */
    int has32;                 /* next_uint32's buffered high half */
    uint32_t hi32;
} mc_pcg64;

/* SeedSequence(seed).generate_state(nwords, uint32) for an integer seed. */
void mc_seedseq_state(uint64_t seed, uint32_t *out, int nwords);
/* default_rng(seed)'s bit generator. */
void mc_pcg64_seed(mc_pcg64 *g, uint64_t seed);
uint64_t mc_pcg64_next64(mc_pcg64 *g);
uint32_t mc_pcg64_next32(mc_pcg64 *g);
/* Generator.integers(low, high, size=n, dtype=int32): [low, high). */
void mc_pcg64_integers32(mc_pcg64 *g, int32_t low, int32_t high, int32_t *out, size_t n);

/* ---- npy.c: numpy .npy files (format 1.0 written, 1.0-3.0 read) ---- */
typedef enum mc_npy_type { MC_NPY_I16, MC_NPY_I32, MC_NPY_U32, MC_NPY_I64 } mc_npy_type;

/* A 1-D or 2-D little-endian C-order array, mapped from a file or owned. */
typedef struct mc_npy {
    mc_map map;       /* the mapped file (data NULL when owned) */
    void *owned;      /* malloc'd data when not mapped */
    const void *data; /* first element */
    mc_npy_type type;
    int ndim;
    int64_t shape[2];
} mc_npy;

size_t mc_npy_type_size(mc_npy_type t);
int64_t mc_npy_get(const mc_npy *a, int64_t i); /* element i of the flat array */
/* Write `data` as PATH (atomically, mc_afile), the bytes numpy.save writes. */
mc_status mc_npy_save(const char *path, mc_npy_type t, int ndim, const int64_t *shape,
                      const void *data, mc_error *err);
/* Map PATH and check its header: type, ndim, C order, size against file. */
mc_status mc_npy_load(const char *path, mc_npy *a, mc_error *err);
void mc_npy_free(mc_npy *a);

/* ---- pyjson.c: json.dumps(obj, indent=4) as CPython writes it ---- */
/* Append the rendering of v at nesting depth `depth` (0 at the top). */
mc_status mc_pyjson_dump(mc_buf *out, const json_t *v, int depth, mc_error *err);
/* repr(float) of CPython: shortest round-trip digits. */
void mc_py_float_repr(double x, char out[32]);

/* ---- md5.c: RFC 1321, for the hex digest Megatron names cache files by ---- */
void mc_md5_hex(const void *data, size_t n, char hex[33]);

/* ---- numpy's float64 sum (pairwise, 8 accumulators), for normalize() ---- */
double mc_np_sum(const double *a, size_t n);

/* ---- gpt_dataset.c: one split of one dataset (Megatron's GPTDataset) ---- */
#include "mc/gptdata.h"
#include "mc/indexed.h"

/* ---- sft_dataset.c: a loss mask checked against its tokens (same number of
 * sequences and lengths, dtype uint8, bytes 0 or 1); *loss_count (malloc'd,
 * set even on failure) gets each sequence's ones ---- */
mc_status mc_sft_check_mask(const mc_idx *t, const mc_idx *m, int64_t **loss_count, mc_error *err);

/* The documents of one dataset (Megatron's "low-level dataset"): an indexed
 * dataset, or mc's mock documents. */
typedef struct mc_gpt_docs {
    mc_idx idx;
    int mock;
    int64_t vocab_size;
    int32_t eod;
    int64_t n_docs;
    char *path;        /* the prefix as given (Megatron's dataset_path); NULL for mock */
    int32_t *mock_len; /* mock: every document's length */
} mc_gpt_docs;

mc_status mc_gpt_docs_open(mc_gpt_docs *docs, const char *prefix, mc_error *err);
mc_status mc_gpt_docs_mock(mc_gpt_docs *docs, int64_t vocab_size, int32_t eod, mc_error *err);
void mc_gpt_docs_close(mc_gpt_docs *docs);
int64_t mc_gpt_docs_length(const mc_gpt_docs *docs, int64_t doc);

/* What every split of every dataset shares. */
typedef struct mc_gpt_params {
    int64_t seq_length;
    uint32_t seed;
    int add_extra_token;
    int drop_last_partial_validation;
    const char *split_string;
    json_t *split_matrix;  /* Megatron's split_matrix, for descriptions */
    json_t *tokenizer;     /* unique_identifiers, or JSON null */
    const char *cache_dir; /* NULL: PREFIX/cache/GPTDataset_indices */
} mc_gpt_params;

/* The samples of one split of one dataset: Megatron's GPTDataset (its
 * "mid-level dataset"), the document, sample and shuffle indices over an
 * mc_gpt_docs. mc_gpt_samples_get reads sample `index` through them. */
typedef struct mc_gpt_samples {
    const mc_gpt_docs *docs;
    mc_split split;
    int64_t num_samples; /* requested, -1 = None */
    int64_t add_extra;
    int64_t seq_length;
    mc_npy doc_index, sample_index, shuffle_index;
    int64_t n_samples;
    json_t *ids;      /* unique_identifiers (an ordered object) */
    char *cache_base; /* "<dir>/<md5>-GPTDataset-<split>" or NULL */
    int built;        /* 1 when this open built the indices */
} mc_gpt_samples;

mc_status mc_gpt_samples_open(mc_gpt_samples *m, const mc_gpt_docs *docs, const mc_gpt_params *p,
                              mc_split split, int64_t doc_beg, int64_t doc_end, int64_t num_samples,
                              mc_error *err);
mc_status mc_gpt_samples_get(const mc_gpt_samples *m, int64_t index, int32_t *tokens,
                             mc_error *err);
void mc_gpt_samples_free(mc_gpt_samples *m);

/* mkdir -p DIR; the error names the component that failed. */
mc_status mc_gpt_mkdirs(const char *dir, mc_error *err);
/* malloc'd "base-affix" */
char *mc_gpt_path(const char *base, const char *affix);
/* Whether every one of the n paths names a regular file. */
int mc_gpt_files_exist(const char *const *paths, size_t n);
/* Write text atomically. */
mc_status mc_gpt_write_text(const char *path, const char *text, size_t n, mc_error *err);

#endif
