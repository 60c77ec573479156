/*
 * ckpt.h - checkpoints: global tensors, optimizer state, configuration and
 * RNG state in one HDF5 file per iteration (layout in mc-formats(5)).
 *
 *   DIR/latest_checkpointed_iteration.txt   "500\n", moved last (atomically)
 *   DIR/iter_0000500/model.h5               everything of iteration 500
 *
 * Tensors are addressed by their path in the file: "model/<name>" for
 * parameters (Megatron Core state-dict names, kept flat, dots and all),
 * "optimizer/exp_avg/<name>" and "optimizer/exp_avg_sq/<name>" for Adam's
 * moments. On disk each is the GLOBAL tensor; a writer and a reader each
 * name the block [row0, row0 + local_rows) x [col0, col0 + local_cols) it
 * holds, so a tensor-parallel rank writes and reads only its own slice and
 * any grid loads any checkpoint. cols == 0 means a 1-D tensor of `rows`
 * elements (biases, norm weights; then col0 = 0 and local_cols is ignored).
 *
 * Host data is always fp32; the stored dtype is float32 (default), bfloat16
 * (uint16 bit patterns with attribute dtype="bfloat16", rounded to nearest
 * even) or float16 (an IEEE half type h5py reads as float16); reading
 * converts back to fp32.
 *
 * Writing is all-or-nothing: mc_ckpt_writer_begin makes a hidden temporary
 * directory DIR/.iter_0000500.tmp.XXXXXX; mc_ckpt_writer_commit checks that
 * every tensor was written whole, closes and fsyncs the file and the
 * directory, renames it to DIR/iter_0000500 (exchanging it with an existing
 * one, which is then removed) and only then rewrites the latest pointer.
 * A crash at any point leaves the previous checkpoint and pointer intact;
 * readers never look at hidden temporaries.
 *
 * One process writes through HDF5's default driver. A grid of processes
 * (mc_ckpt_writer_begin_grid) writes the same single file in parallel
 * through parallel HDF5: each rank writes its own blocks, begin, commit and
 * abort are collective over the world, and the latest pointer moves only
 * after every rank has finished (doc/ARCHITECTURE.md, "Checkpoints", says how).
 *
 * HDF5 prints its error stack to stderr by default. Every function here
 * turns that off for its own duration and restores the caller's setting
 * before returning; HDF5's innermost message is folded into the mc_error.
 * The HDF5 library is not thread-safe as Debian builds it: use one thread.
 */
#ifndef MC_CKPT_H
#define MC_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "mc/comm.h"
#include "mc/log.h"
#include "mc/model.h"
#include "mc/opt.h"
#include "mc/status.h"
#include "mc/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MC_CKPT_FORMAT_VERSION 1
#define MC_CKPT_FILE "model.h5"
#define MC_CKPT_LATEST "latest_checkpointed_iteration.txt"
/* Beside the files of an iteration directory: their XXH3 128-bit hashes
 * in xxh128sum's format, written when the directory is published. */
#define MC_CKPT_MANIFEST "checksums.xxh128"

/* Whether mc_ckpt_open checks each file it opens against the iteration
 * directory's MC_CKPT_MANIFEST before HDF5 reads it (default 1): a
 * mismatch is MC_ERR_FORMAT naming the file; a directory without a
 * manifest loads unchecked. Process-wide, set once from the tools'
 * --no-verify. */
void mc_ckpt_set_verify(int on);
int mc_ckpt_verify(void);

typedef enum mc_ckpt_dtype {
    MC_CKPT_FLOAT32 = 0,
    MC_CKPT_BFLOAT16 = 1,
    MC_CKPT_FLOAT16 = 2,
    /* Quantized 2-D weights (mc/quant.h), each with its scales; written
     * whole by mc_ckpt_write_whole, read back dequantized to fp32. */
    MC_CKPT_INT8 = 3,     /* per row */
    MC_CKPT_FP8_E4M3 = 4, /* per tensor */
    MC_CKPT_INT4 = 5      /* per group of a row */
} mc_ckpt_dtype;

/* "float32", "bfloat16", "float16", "int8", "fp8_e4m3", "int4"; NULL for
 * an unknown value. */
const char *mc_ckpt_dtype_name(mc_ckpt_dtype d);
/* 1 for the quantized dtypes. */
int mc_ckpt_dtype_is_quantized(mc_ckpt_dtype d);
/* Parse one of the three float names (the only ones mc_ckpt_write_tensor
 * takes); MC_ERR_USAGE naming the choices otherwise. */
mc_status mc_ckpt_dtype_parse(const char *s, mc_ckpt_dtype *out, mc_error *err);
/* The float dtypes by the names a tool's --dtype takes (fp32, float32,
 * bf16, bfloat16, fp16, float16), for mc_parse_choice; NULL-terminated. */
extern const mc_choice mc_ckpt_float_dtype_choices[];

typedef enum mc_ckpt_compression {
    MC_CKPT_COMPRESS_NONE = 0,
    MC_CKPT_COMPRESS_ZSTD = 1 /* HDF5 filter 32015, as the public zstd plugin */
} mc_ckpt_compression;

/* "none" | "zstd" (the --ckpt-compression argument). */
mc_status mc_ckpt_compression_parse(const char *s, mc_ckpt_compression *out, mc_error *err);

/* ------------------------------------------------------------ writing */

typedef struct mc_ckpt_writer mc_ckpt_writer;

/* Start iteration `iteration` (>= 0) of the checkpoint directory dir
 * (created if missing). */
mc_status mc_ckpt_writer_begin(const char *dir, int64_t iteration, mc_ckpt_writer **out,
                               mc_error *err);

/* The same on a grid: collective over the world of g (every rank calls it,
 * with the same dir and iteration). Rank 0 makes the temporary directory
 * and the others learn its name. Then every writing call below is local to
 * the rank (the blocks are kept in host memory, in their stored dtype) and
 * mc_ckpt_writer_commit or mc_ckpt_writer_abort, which every rank must call
 * exactly once, does the collective work:
 *  - each rank writes the blocks it holds and no more; a block held by
 *    several ranks (replicas) is written once, by the lowest rank, and must
 *    be the same bits on each; blocks must not otherwise overlap, and every
 *    element of every tensor must be written by some rank;
 *  - root attributes and byte datasets must be the same on every rank;
 *  - errors are agreed: when any rank fails or aborts, every rank's commit
 *    returns the same error ("rank R: ..."), nothing is published and the
 *    pointer stays.
 * g NULL, or a grid of one process (mc_grid_single): exactly
 * mc_ckpt_writer_begin, no MPI call. */
mc_status mc_ckpt_writer_begin_grid(const char *dir, int64_t iteration, const mc_grid *g,
                                    mc_ckpt_writer **out, mc_error *err);

/* Compression of the tensors created from now on; level is zstd's
 * (1..22, negative for faster; 0 means zstd's default, 3). */
mc_status mc_ckpt_writer_set_compression(mc_ckpt_writer *w, mc_ckpt_compression c, int level,
                                         mc_error *err);

/* Write the block [row0, row0+local_rows) x [col0, col0+local_cols) of the
 * global tensor `path` of shape [rows, cols] (cols == 0: 1-D [rows]) from
 * host[local_rows * local_cols] (row-major), stored as dtype. The first
 * write of a path creates the dataset; later writes of other blocks must
 * give the same global shape and dtype. The blocks of one tensor must not
 * overlap: commit counts the elements written to refuse a partial tensor. */
mc_status mc_ckpt_write_tensor(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                               int64_t row0, int64_t col0, int64_t local_rows, int64_t local_cols,
                               const float *host, mc_ckpt_dtype dtype, mc_error *err);

/* A JSON document (validated) as the root attribute `key` ("config"). */
mc_status mc_ckpt_write_json(mc_ckpt_writer *w, const char *key, const char *json_text,
                             mc_error *err);
/* An integer as the root attribute `key` ("consumed_samples"). The writer
 * itself stores "iteration", "mc_format", "mc_format_version", "mc_version". */
mc_status mc_ckpt_write_int(mc_ckpt_writer *w, const char *key, int64_t value, mc_error *err);
/* Opaque bytes (RNG states) as the 1-D uint8 dataset `/key`. */
mc_status mc_ckpt_write_bytes(mc_ckpt_writer *w, const char *key, const void *data, size_t n,
                              mc_error *err);

/* Finish: completeness check, fsync, rename, latest pointer. Frees w
 * whether or not it succeeds (on failure the temporary is removed). */
mc_status mc_ckpt_writer_commit(mc_ckpt_writer *w, mc_error *err);
/* Drop everything written; the directory and pointer stay as they were.
 * Frees w; NULL is allowed. */
void mc_ckpt_writer_abort(mc_ckpt_writer *w);

/* The final directory this writer will produce ("DIR/iter_0000500"). */
const char *mc_ckpt_writer_dir(const mc_ckpt_writer *w);

/* ------------------------------------------------------------ whole tensors,
 * quantized tensors and sharded checkpoints (lib/ckpt/ckpt_shard.c,
 * lib/ckpt/ckpt_quant.c; layouts in mc-formats(5))
 *
 * A checkpoint may also be written pre-split for a grid of tp x pp ranks:
 *   DIR/iter_0000500/index.h5            root attributes, tokenizer, and the
 *                                        index: which file holds which block
 *   DIR/iter_0000500/mp_rank_TT_PPP.h5   the blocks of tensor-parallel rank
 *                                        TT on pipeline stage PPP, each
 *                                        dataset the rank's local tensor
 * so that each rank of that grid reads only its own file. mc_ckpt_open
 * reads such a directory like one model.h5: blocks of any grid are
 * assembled from the shards, mc_ckpt_list gives the union, attributes come
 * from index.h5. Writing one is for one process (mc-reshard). */

/* Write the whole tensor `path` [rows, cols] (cols 0: 1-D) from the global
 * host[rows * max(cols, 1)], stored as dtype: a float type, or a quantized
 * one (2-D only; group_size is int4's, > 0). On a sharded writer the tensor
 * is split into the blocks of every shard that holds it. Quantized tensors
 * and sharded writers are for one process (MC_ERR_USAGE on a grid writer).
 * A non-finite value in a tensor to quantize is MC_ERR_FORMAT naming the
 * element. */
mc_status mc_ckpt_write_whole(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                              const float *host, mc_ckpt_dtype dtype, int64_t group_size,
                              mc_error *err);

/* Begin a checkpoint pre-split for tp x pp ranks (one process). The model
 * configuration decides the split (Megatron's: column-parallel weights by
 * rows, row-parallel by columns, the rest replicated on every
 * tensor-parallel rank; layers on the pipeline stages of
 * mc_model_stage_layers); it must pass mc_model_config_finish for tp, and
 * every split tensor must divide evenly (else MC_ERR_USAGE naming it).
 * tp = pp = 1 is one shard. The root attributes and byte datasets go to
 * index.h5; tensors only through mc_ckpt_write_whole. */
mc_status mc_ckpt_writer_begin_sharded(const char *dir, int64_t iteration, int tp, int pp,
                                       const mc_model_config *model, mc_ckpt_writer **out,
                                       mc_error *err);

/* ------------------------------------------------------------ reading */

typedef struct mc_ckpt_reader mc_ckpt_reader;

/* Open a checkpoint: `path` is a checkpoint directory (resolved through its
 * latest_checkpointed_iteration.txt), an iteration directory holding
 * model.h5 (or index.h5 and the shards of a sharded checkpoint), or the
 * model.h5 (index.h5) file itself. */
mc_status mc_ckpt_open(const char *path, mc_ckpt_reader **out, mc_error *err);
void mc_ckpt_close(mc_ckpt_reader *r); /* NULL is allowed */

int64_t mc_ckpt_iteration(const mc_ckpt_reader *r);
/* The iteration directory ("DIR/iter_0000500"): what mc-train prints. */
const char *mc_ckpt_dir(const mc_ckpt_reader *r);
/* The file ("DIR/iter_0000500/model.h5", or .../index.h5 for a sharded
 * checkpoint), the prefix of every message. */
const char *mc_ckpt_file(const mc_ckpt_reader *r);
/* The grid a sharded checkpoint was split for; 0 and 0 for one file. */
void mc_ckpt_shards(const mc_ckpt_reader *r, int *tp, int *pp);
/* Tell the reader of a sharded checkpoint which rank reads it: of the
 * files holding copies of a block (replicated tensors, the tied
 * embeddings' copy on the last stage), it then prefers the file of this
 * tensor-parallel rank and pipeline stage, so a rank of the grid the
 * checkpoint was split for opens only its own file. Without the hint it
 * prefers files already open, then the first. No effect on one file. */
void mc_ckpt_prefer_shard(mc_ckpt_reader *r, int tp_rank, int pp_rank);

/* Root attribute written by mc_ckpt_write_json, parsed (caller decrefs). */
mc_status mc_ckpt_read_json(mc_ckpt_reader *r, const char *key, json_t **out, mc_error *err);
mc_status mc_ckpt_read_int(mc_ckpt_reader *r, const char *key, int64_t *out, mc_error *err);
/* Bytes written by mc_ckpt_write_bytes; *data is malloc'd (caller frees). */
mc_status mc_ckpt_read_bytes(mc_ckpt_reader *r, const char *key, void **data, size_t *n,
                             mc_error *err);

/* 1 when the tensor exists (e.g. "optimizer/exp_avg/<name>"), else 0. */
int mc_ckpt_has_tensor(mc_ckpt_reader *r, const char *path);
/* Global shape (cols = 0 for 1-D) and stored dtype; MC_ERR_NOTFOUND names
 * a missing tensor. Any pointer may be NULL. */
mc_status mc_ckpt_tensor_info(mc_ckpt_reader *r, const char *path, int64_t *rows, int64_t *cols,
                              mc_ckpt_dtype *dtype, mc_error *err);
/* Read the block [row0, row0+local_rows) x [col0, col0+local_cols) of the
 * tensor `path` into host_out as fp32, after checking that its global shape
 * is [rows, cols] (cols == 0: 1-D); a mismatch is MC_ERR_FORMAT naming the
 * tensor and both shapes. */
mc_status mc_ckpt_read_tensor(mc_ckpt_reader *r, const char *path, int64_t rows, int64_t cols,
                              int64_t row0, int64_t col0, int64_t local_rows, int64_t local_cols,
                              float *host_out, mc_error *err);

/* Names of the datasets directly under group `group` ("model",
 * "optimizer/exp_avg"), sorted; *names is one malloc'd block (free it). */
mc_status mc_ckpt_list(mc_ckpt_reader *r, const char *group, char ***names, size_t *n,
                       mc_error *err);

/* ------------------------------------------------------------ model and tokenizer
 * (lib/ckpt/ckpt_model.c) */

/* The model configuration as the JSON object stored under "model" in the
 * root attribute "config" (field names in mc-formats(5)); caller decrefs. */
json_t *mc_model_config_json(const mc_model_config *c);
/* Parse that object (every field required); MC_ERR_FORMAT names the field.
 * The result still goes through mc_model_config_finish. */
mc_status mc_model_config_from_json(const json_t *model, mc_model_config *c, mc_error *err);
/* config.model of a checkpoint, parsed; errors name the file. */
mc_status mc_ckpt_read_model_config(mc_ckpt_reader *r, mc_model_config *c, mc_error *err);
/* Write the root attribute config = {"model": {...}} (a checkpoint made by a
 * tool other than mc-train, which adds "train" and "args"). */
mc_status mc_ckpt_write_model_config(mc_ckpt_writer *w, const mc_model_config *c, mc_error *err);

/* Store the tokenizer of spec: its kind and options as the root attribute
 * "tokenizer" and the bytes of its files as datasets tokenizer_model,
 * tokenizer_vocab, tokenizer_merges; for a Hugging Face tokenizer.json, the
 * tokenizer_config.json beside it too when there is one (tokenizer_config:
 * the chat template and special tokens exports and chat need). */
mc_status mc_ckpt_write_tokenizer(mc_ckpt_writer *w, const mc_tokenizer_spec *spec, mc_error *err);
/* 1 when the checkpoint holds a tokenizer. */
int mc_ckpt_has_tokenizer(mc_ckpt_reader *r);
/* Load the stored tokenizer; MC_ERR_NOTFOUND (naming the file) when none. */
mc_status mc_ckpt_read_tokenizer(mc_ckpt_reader *r, mc_tokenizer **out, mc_error *err);
/* The raw bytes of a stored tokenizer file, which = "config"
 * (tokenizer_config.json, MC_ERR_NOTFOUND when none was stored), "model" (tokenizer.json
 * or tiktoken ranks), "vocab" or "merges"; *data malloc'd. The root
 * attribute "tokenizer" (mc_ckpt_read_json) says the type and file names. */
mc_status mc_ckpt_read_tokenizer_file(mc_ckpt_reader *r, const char *which, void **data, size_t *n,
                                      mc_error *err);
/* The stored tokenizer_config.json parsed (an object), or NULL when none was
 * stored or it is not a JSON object. */
json_t *mc_ckpt_tokenizer_config(mc_ckpt_reader *r);
/* Copy the tokenizer (attribute and files) from r to w; none is no error. */
mc_status mc_ckpt_copy_tokenizer(mc_ckpt_reader *r, mc_ckpt_writer *w, mc_error *err);

/* ------------------------------------------------------------ comparing and averaging
 * (lib/ckpt/compare.c) */

/* Whether the checkpoints r[0..n) hold one model: each has config.model as
 * r[0] has it (the same fields and values) or none as r[0] has none, and the
 * same model tensors with the same shapes. MC_ERR_FORMAT names the file and
 * the first difference ("FILE: config.model.hidden_size is 64, 32 in FILE0"). */
mc_status mc_ckpt_same_model(mc_ckpt_reader *const *r, size_t n, mc_error *err);

/* The whole tensor `path` [rows, cols] (cols 0: 1-D) of r[0] into
 * host[rows * max(cols, 1)], or for n > 1 its element-wise mean over
 * r[0..n): summed in double in the order of r and divided once, so that the
 * mean of two fp32 values is the correctly rounded one. */
mc_status mc_ckpt_read_average(mc_ckpt_reader *const *r, size_t n, const char *path, int64_t rows,
                               int64_t cols, float *host, mc_error *err);

/* MC_OK when every element of host[rows * max(cols, 1)] is finite, else
 * MC_ERR_FORMAT "WHAT: PATH: element [i, j] is nan; only finite values can
 * be quantized" for the first that is not (what: the file, or "the average"). */
mc_status mc_ckpt_check_quantizable(const char *what, const char *path, int64_t rows, int64_t cols,
                                    const float *host, mc_error *err);

/* ------------------------------------------------------------ converting
 * (lib/ckpt/convert.c): what mc-reshard does once its inputs are open */

typedef struct mc_ckpt_convert_opts {
    int dtype_set;          /* store the model's tensors as dtype */
    mc_ckpt_dtype dtype;    /* fp32, bf16, fp16 */
    mc_ckpt_dtype quantize; /* 2-D model tensors: int8, fp8, int4; FLOAT32: none */
    int64_t group_size;     /* int4's elements per scale (128) */
    int64_t tp, pp;         /* > 1: pre-split for that grid (sharded) */
    int average;            /* the mean of the inputs' model tensors, no optimizer */
    int drop_optimizer;     /* leave the moments out */
    mc_ckpt_compression compression;
} mc_ckpt_convert_opts;

/* No conversion: as stored, one file, optimizer kept, group size 128. */
void mc_ckpt_convert_opts_init(mc_ckpt_convert_opts *o);

typedef struct mc_ckpt_convert_stats {
    int64_t tensors; /* written */
    int64_t params;  /* elements of the model's tensors */
} mc_ckpt_convert_stats;

/* Write r[0] (or, with o->average, the mean of r[0..nr), which must hold
 * one model: mc_ckpt_same_model) as a new checkpoint at its iteration in
 * out_dir: every tensor converted as o says, the counters, configuration,
 * train state, tokenizer and RNG state carried over, and a "reshard"
 * attribute recording the conversion and its inputs (names[k], or the
 * readers' directories when names is NULL). All or nothing (the writer's
 * rules); on success *iter_dir is the iteration directory (malloc'd). A
 * grid whose vocabulary padding differs from the stored one is warned
 * about through lg (may be NULL). */
mc_status mc_ckpt_convert(mc_ckpt_reader *const *r, size_t nr, const char *const *names,
                          const mc_ckpt_convert_opts *o, const char *out_dir, char **iter_dir,
                          mc_ckpt_convert_stats *stats, const mc_logger *lg, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
