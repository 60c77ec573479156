/*
 * gptdata.h - Megatron's GPT dataset over indexed datasets (.bin/.idx):
 * train/valid/test splits over documents, shuffled samples of seq_length+1
 * tokens that cross document boundaries, as many epochs as needed, blends of
 * several datasets, and mock data. Sample for sample what megatron-core's
 * BlendedMegatronDatasetBuilder + GPTDataset + BlendedDataset give for the
 * same files, seed, split, sequence length and sizes.
 *
 * What is reproduced from megatron-core (0.16):
 *  - split: "969,30,1" parsed like parse_and_normalize_split (every run of
 *    [.0-9] is a number, missing ones are 0, normalized; mc rejects any
 *    other character but blanks , / :), documents [round(b*N), round(e*N))
 *    per split, round half to even; a split of weight 0 does not exist
 *    (mc_gpt_dataset_num_samples gives 0); a split with no tokens is an
 *    error (Megatron loops forever on it);
 *  - document index: the split's documents repeated per epoch, shuffled by
 *    numpy.random.RandomState(seed).shuffle (MT19937, bit-exact); the final
 *    epoch shuffled separately when it supplies < 80% of an epoch's samples;
 *  - sample index: helpers.cpp build_sample_idx (samples start seq_length
 *    tokens apart and read seq_length+1 tokens, so consecutive samples share
 *    one token); shuffle index: a permutation of the samples, same generator;
 *  - blends: weights normalized; each dataset built for
 *    ceil(ceil(size*w)*(1+surplus)) samples, the blend of sum(ceil(size*w))
 *    samples assigned greedily to the dataset whose share lags most
 *    (helpers.cpp build_blending_indices); a bare list of prefixes weights
 *    each by its one-epoch sample count, size min(requested, total);
 *  - the cache: files "<md5>-GPTDataset-<split>-{description.txt,
 *    document_index.npy,sample_index.npy,shuffle_index.npy}" and
 *    "<md5>-BlendedDataset-<split>-{description.txt,dataset_index.npy,
 *    dataset_sample_index.npy}", md5 of the JSON description Megatron writes
 *    (so mc and Megatron share one cache directory when `tokenizer_json`
 *    matches the tokenizer's unique_identifiers). With no cache directory the
 *    GPTDataset indices go to PREFIX/cache/GPTDataset_indices/ (Megatron's
 *    default: a directory named like the prefix) and blend indices are kept
 *    in memory, as Megatron does.
 * Indices are built once, written atomically, then memory-mapped; a second
 * open with the same configuration maps the cached files and builds nothing.
 *
 * Mock data: Megatron Core's MockGPTDataset sample for sample. Its
 * MC_GPTDATA_MOCK_DOCS documents have the lengths
 * numpy.random.default_rng(0).integers(1, MC_GPTDATA_MOCK_MAXLEN) (seed 0
 * whatever the run's; lib/data/pcg64.c) and hold 1, 2, ..., length - 1
 * (modulo the vocabulary size) then the eod; like Megatron's they are
 * split 1,1,1 whatever --split says, then split and shuffled with the run's
 * seed like real data, and never cached.
 *
 * A sample shorter than seq_length+1 (only the last validation sample with
 * drop_last_partial_validation = 0) is padded with -1, Megatron's pad id.
 */
#ifndef MC_GPTDATA_H
#define MC_GPTDATA_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_split { MC_SPLIT_TRAIN = 0, MC_SPLIT_VALID = 1, MC_SPLIT_TEST = 2 } mc_split;
#define MC_SPLIT_COUNT 3

#define MC_GPTDATA_MOCK_DOCS 100000
#define MC_GPTDATA_MOCK_MAXLEN 4096

/* A parsed --data-path: prefixes with weights, or a bare list (weights NULL). */
typedef struct mc_gptdata_blend {
    char **prefixes;
    double *weights; /* NULL: weight by size */
    size_t n;
} mc_gptdata_blend;

/* Megatron's get_blend_from_list: "W1 P1 W2 P2 ..." (an even count whose
 * every other word is a number) or "P1 P2 ..." (a bare list). Errors: an
 * empty list, a weight that does not parse while others do, a negative,
 * zero or non-finite weight. Prefixes are stripped of blanks. */
mc_status mc_gptdata_parse_data_path(const char *const *args, size_t n, mc_gptdata_blend *out,
                                     mc_error *err);
void mc_gptdata_blend_free(mc_gptdata_blend *b);

/* Megatron's parse_and_normalize_split: "969,30,1" -> {0.969, 0.03, 0.001}. */
mc_status mc_gptdata_parse_split(const char *split, double out[MC_SPLIT_COUNT], mc_error *err);

/* Megatron's get_train_valid_test_num_samples (megatron/training):
 * train = train_iters * global_batch,
 * valid = (train_iters / eval_interval + 1) * eval_iters * global_batch,
 * test = eval_iters * global_batch. */
void mc_gptdata_num_samples(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                            int64_t global_batch, int64_t out[MC_SPLIT_COUNT]);

typedef struct mc_gptdata_config {
    mc_gptdata_blend blend;              /* the data; ignored when mock */
    const char *split;                   /* default "969,30,1" */
    int64_t seq_length;                  /* tokens per sample input (> 1) */
    uint32_t seed;                       /* --seed (Megatron's default 1234) */
    int64_t num_samples[MC_SPLIT_COUNT]; /* samples wanted; -1 = one epoch (None) */
    const char *cache_dir;               /* --data-cache-path; NULL: Megatron's default */
    int add_extra_token;                 /* 1 (Megatron's default): samples of seq_length+1 */
    int drop_last_partial_validation;    /* 1 (default) */
    double mid_level_surplus;            /* 0.005 */
    int mock;                            /* --mock-data */
    int sft; /* --sft: the one prefix is an SFT dataset (mc/sft.h), opened by the caller */
    int64_t vocab_size; /* mock: tokens in [0, vocab_size) */
    int32_t eod;        /* mock: last token of each document; the end-of-document id */
    /* Packed documents, as Megatron's GPTDatasetConfig has them (the
     * dataset hands out samples; the training loop and mc-eval act on
     * these, model.h "packed documents"): --reset-position-ids,
     * --reset-attention-mask, and --eod-mask-loss (targets whose input
     * token is eod are not counted). */
    int reset_position_ids, reset_attention_mask, eod_mask_loss;
    /* JSON of the tokenizer's unique_identifiers for the cache description
     * (e.g. {"class": "..."}); NULL writes null. Only the cache file names
     * depend on it. */
    const char *tokenizer_json;
} mc_gptdata_config;

/* Defaults: split "969,30,1", seed 1234, add_extra_token 1,
 * drop_last_partial_validation 1, surplus 0.005, num_samples -1. */
void mc_gptdata_config_init(mc_gptdata_config *c);

typedef struct mc_gpt_dataset mc_gpt_dataset;

/* Build or load every split's indices. Errors name the thing: a prefix
 * whose files are missing or malformed, a bad split or weight, a split with
 * no tokens, a dataset too small for one sample, a blend that oversamples
 * a dataset, an unwritable cache directory. */
mc_status mc_gpt_dataset_open(const mc_gptdata_config *c, mc_gpt_dataset **out, mc_error *err);
void mc_gpt_dataset_close(mc_gpt_dataset *ds);

/* Samples in a split (0 for a split that does not exist). For a blend this
 * is the blend's size; for one dataset, all samples built (>= requested). */
int64_t mc_gpt_dataset_num_samples(const mc_gpt_dataset *ds, mc_split split);
/* Sample `index` of `split`: seq_length + add_extra_token token ids
 * (inputs tokens[0..T-1], targets tokens[1..T]). */
mc_status mc_gpt_dataset_sample(const mc_gpt_dataset *ds, mc_split split, int64_t index,
                                int32_t *tokens, mc_error *err);
/* For a blend: which dataset (index into the blend) and which of its samples
 * sample `index` comes from; for one dataset 0 and `index`. */
mc_status mc_gpt_dataset_locate(const mc_gpt_dataset *ds, mc_split split, int64_t index,
                                int *dataset, int64_t *dataset_sample, mc_error *err);
/* How many index sets this open built (0 when everything came from the
 * cache); for tests and the log. */
int mc_gpt_dataset_built(const mc_gpt_dataset *ds);
/* The cache file prefix "<dir>/<md5>-GPTDataset-<split>" of dataset i's
 * split (NULL when not cached), and the blend's ("...-BlendedDataset-..."
 * with i = -1). */
const char *mc_gpt_dataset_cache_base(const mc_gpt_dataset *ds, int i, mc_split split);

const char *mc_split_name(mc_split s); /* "train", "valid", "test" */

#ifdef __cplusplus
}
#endif
#endif
