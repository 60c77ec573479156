/*
 * safetensors.h - the safetensors file format (Hugging Face): an 8-byte
 * little-endian header length N, N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [R, C], "data_offsets": [BEGIN, END]},
 *    ..., "__metadata__": {"format": "pt"}}
 * then the tensors' bytes, row-major, little-endian, at the offsets (from the
 * end of the header). A model too big for one file is split into shards
 * model-00001-of-0000K.safetensors with an index model.safetensors.index.json
 *   {"metadata": {"total_size": BYTES}, "weight_map": {"NAME": "FILE", ...}}.
 * Layout and checks in mc-formats(5).
 *
 * Reading maps the files and checks the header before trusting it (length,
 * JSON, dtypes, shapes, offsets inside the file, sizes equal to shape x
 * dtype, no two tensors overlapping); errors name the file and the tensor.
 * Writing declares every tensor first, then streams their data in that
 * order, each shard through mc_afile (temporary name, fsync, rename), so a
 * failure leaves no file under a final name.
 */
#ifndef MC_SAFETENSORS_H
#define MC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MC_ST_MAX_DIMS 8
#define MC_ST_INDEX "model.safetensors.index.json"
#define MC_ST_SINGLE "model.safetensors"

typedef enum mc_st_dtype {
    MC_ST_F32 = 0,
    MC_ST_F16 = 1,
    MC_ST_BF16 = 2,
    MC_ST_F64 = 3,
    MC_ST_I64 = 4,
    MC_ST_I32 = 5,
    MC_ST_I16 = 6,
    MC_ST_I8 = 7,
    MC_ST_U8 = 8,
    MC_ST_BOOL = 9
} mc_st_dtype;

/* "F32", "BF16", ...; NULL for an unknown value. */
const char *mc_st_dtype_name(mc_st_dtype d);
/* Bytes per element; 0 for an unknown value. */
size_t mc_st_dtype_size(mc_st_dtype d);
/* Parse a header dtype string; -1 when unknown. */
int mc_st_dtype_parse(const char *s);

/* ------------------------------------------------------------ reading */

typedef struct mc_st_tensor {
    const char *name;
    mc_st_dtype dtype;
    int ndim;
    int64_t shape[MC_ST_MAX_DIMS];
    int64_t numel;
    const void *data; /* in the mapped file */
    size_t nbytes;
    const char *file; /* the file it lives in (for messages) */
} mc_st_tensor;

typedef struct mc_st_model mc_st_model;

/* Open `path`: a .safetensors file; an index file; or a directory holding
 * model.safetensors.index.json (its shards), else every *.safetensors file
 * in it (sorted by name). A tensor name found twice is an error. */
mc_status mc_st_open(const char *path, mc_st_model **out, mc_error *err);
void mc_st_close(mc_st_model *m); /* NULL is allowed */

size_t mc_st_count(const mc_st_model *m);
/* Tensors in file order (files in the order opened). */
const mc_st_tensor *mc_st_get(const mc_st_model *m, size_t i);
/* NULL when absent. */
const mc_st_tensor *mc_st_find(const mc_st_model *m, const char *name);
/* The string value `key` of the first file's __metadata__, or NULL. */
const char *mc_st_metadata(const mc_st_model *m, const char *key);

/* Convert a floating tensor (F32, F16, BF16, F64) to fp32 into out[numel]. */
mc_status mc_st_to_f32(const mc_st_tensor *t, float *out, mc_error *err);

/* ------------------------------------------------------------ writing */

typedef struct mc_st_writer mc_st_writer;

/* A writer of files into the existing directory dir. max_shard_bytes 0:
 * one file, model.safetensors; otherwise tensors go, in their order, into
 * shards of at most that many data bytes (a tensor bigger than the limit
 * gets a shard of its own, as transformers does), and when more than one
 * shard results, an index names them. */
mc_status mc_st_writer_new(const char *dir, uint64_t max_shard_bytes, mc_st_writer **out,
                           mc_error *err);
/* Declare the next tensor (all before the first write). */
mc_status mc_st_writer_add(mc_st_writer *w, const char *name, mc_st_dtype dtype, int ndim,
                           const int64_t *shape, mc_error *err);
/* Metadata string for every file's __metadata__ ("format": "pt" is always
 * there). */
mc_status mc_st_writer_set_metadata(mc_st_writer *w, const char *key, const char *value,
                                    mc_error *err);
/* Number of shard files the declared tensors make (after the last add). */
int mc_st_writer_num_shards(mc_st_writer *w);
/* The data of the next declared tensor, as fp32 (converted to its dtype:
 * bf16 and fp16 round to nearest even) or as raw little-endian bytes of its
 * dtype; n must be its element count (bytes for _raw). */
mc_status mc_st_writer_write_f32(mc_st_writer *w, const float *x, size_t n, mc_error *err);
mc_status mc_st_writer_write_raw(mc_st_writer *w, const void *p, size_t nbytes, mc_error *err);
/* Every tensor written: commit the files (and the index). Frees w. */
mc_status mc_st_writer_finish(mc_st_writer *w, mc_error *err);
/* Remove whatever was written; frees w. NULL is allowed. */
void mc_st_writer_abort(mc_st_writer *w);

#ifdef __cplusplus
}
#endif
#endif
