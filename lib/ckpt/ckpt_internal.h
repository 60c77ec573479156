/*
 * ckpt_internal.h - what the checkpoint files of lib/ckpt share (private).
 *
 * Layers, top to bottom. A file calls only files listed below it, in its
 * own layer or lower, never one above it: no cycle among the files.
 *
 *   top     ckpt_model.c  model configuration and tokenizer, through the
 *                         public reader and writer calls alone
 *   front   ckpt_write.c  the writer: every public writing call of
 *                         mc/ckpt.h, its table of tensors, the one-process
 *                         path (model.h5 as the calls come), and the front
 *                         of the back ends below
 *           ckpt_read.c   the reader: resolving a checkpoint, attributes,
 *                         byte datasets, blocks, from one file or shards
 *   back    ckpt_par.c    the collective writer of a grid over parallel
 *   ends                  HDF5 (public comm calls: mc/comm.h, comm_mpi.h)
 *           ckpt_shard.c  sharded checkpoints: the split, shard files and
 *                         index (writer); assembling blocks (reader)
 *           ckpt_quant.c  quantizing a tensor and storing a local part of
 *                         it with its scales
 *   bottom  ckpt_block.c  opening a stored tensor of any dtype and reading
 *                         any block of it as fp32 (dequantizing)
 *           ckpt_h5.c     HDF5 errors and ids, dtypes and conversions, block
 *                         shapes and selections, attributes, dataset
 *                         creation, byte datasets, link lookup
 *           ckpt_dir.c    directories: temporary, mkdir -p, publish
 *           ckpt_sum.c    the checksum manifest (checksums.xxh128): written
 *                         at publish, checked before HDF5 opens a file
 *           h5zstd.c      the zstd filter (h5zstd.h)
 *           quant.c       the quantizers (public: mc/quant.h)
 *
 * The back ends share the writer's struct (below) with ckpt_write.c: they
 * read and fill their part of it, and call nothing of ckpt_write.c.
 */
#ifndef MC_CKPT_INTERNAL_H
#define MC_CKPT_INTERNAL_H

#include <hdf5.h>
#include <stdint.h>
#include "mc/ckpt.h"
#include "mc/buf.h"
#include "mc/comm.h"
#include "mc/file.h"

#define CK_FORMAT_NAME "mc-checkpoint"
/* Chunks of about this many stored bytes: large enough for zstd to find
 * its matches, small enough that a partial read stays cheap. */
#define CK_CHUNK_TARGET (2u << 20)
/* zstd's best ratio (a 128 KiB block of one byte value stored as a 4-byte
 * RLE block): the most raw bytes a compressed byte can stand for, the bound
 * a tensor's shape is checked against before anything is allocated. */
#define CK_ZSTD_MAX_RATIO 32768u
#define CK_SCALES_GROUP "scales" /* scales of quantized model/X: scales/model/X */
#define CK_INDEX_FILE "index.h5" /* a sharded checkpoint's root file */
#define CK_INDEX_DATASET "shard_index"

/* ------------------------------------------------------------ ckpt_h5.c */

/* HDF5's automatic error printing, switched off for the duration of one of
 * our calls and restored afterwards, so the caller's setting stands. */
typedef struct ck_quiet {
    H5E_auto2_t func;
    void *data;
} ck_quiet;
void ck_quiet_on(ck_quiet *q);
void ck_quiet_off(const ck_quiet *q);

/* Set err to "<message>: <HDF5's innermost description>" and clear HDF5's
 * error stack. */
__attribute__((format(printf, 3, 4))) mc_status ck_h5fail(mc_error *err, mc_status code,
                                                          const char *fmt, ...);
/* Release an HDF5 id (any kind) and set it to -1; -1 is allowed. */
void ck_close(hid_t *id);

hid_t ck_half_type(void); /* IEEE binary16 (h5py's float16) */
/* The file type of a stored dtype (a copy: ck_close it). */
hid_t ck_file_type(mc_ckpt_dtype d);
/* The memory type of a block already converted to dtype's stored form. */
hid_t ck_mem_type(mc_ckpt_dtype d);
/* Bytes per stored element. */
size_t ck_dtype_size(mc_ckpt_dtype d);
/* Convert n fp32 values to dtype's stored form (out holds n elements of
 * ck_dtype_size bytes). */
void ck_convert(mc_ckpt_dtype d, const float *in, size_t n, void *out);

void ck_shape_str(char *out, size_t cap, int64_t rows, int64_t cols);
/* Check a block against a global shape; where = "FILE: PATH". */
mc_status ck_check_block(const char *where, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                         int64_t lrows, int64_t lcols, mc_error *err);
/* Select the block in fspace and make the memory dataspace (cols == 0: 1-D). */
mc_status ck_block_spaces(hid_t fspace, int64_t cols, int64_t row0, int64_t col0, int64_t lrows,
                          int64_t lcols, hid_t *mspace);
int ck_valid_path(const char *p); /* non-empty, relative, no empty component */
int ck_valid_key(const char *k);  /* a plain name */

mc_status ck_write_str_attr(hid_t loc, const char *name, const char *s, mc_error *err,
                            const char *where);
/* Fixed or variable length, into a malloc'd string; MC_ERR_NOTFOUND when absent. */
mc_status ck_read_str_attr(hid_t loc, const char *name, char **out, mc_error *err,
                           const char *where);
mc_status ck_write_int_attr(hid_t loc, const char *name, int64_t v, mc_error *err,
                            const char *where);
mc_status ck_read_int_attr(hid_t loc, const char *name, int64_t *v, mc_error *err,
                           const char *where);
/* The root attributes every checkpoint starts with. */
mc_status ck_write_header(hid_t fid, int64_t iteration, mc_error *err, const char *where);
/* Create the dataset of a tensor (chunked, zstd when asked, Fletcher-32,
 * attribute dtype). Collective under parallel HDF5: same arguments everywhere. */
mc_status ck_create_tensor(hid_t fid, const char *where, const char *path, int64_t rows,
                           int64_t cols, mc_ckpt_dtype dtype, mc_ckpt_compression comp, int level,
                           mc_error *err);
/* Dataset creation properties of a 1-D byte dataset of n > 0 bytes. */
hid_t ck_bytes_dcpl(size_t n);
/* Those of a tensor dataset of nd dims and esize-byte elements. */
hid_t ck_tensor_dcpl(mc_ckpt_compression comp, int level, int nd, const hsize_t *dims,
                     size_t esize);
/* Write the byte dataset key (a new name) of the file fid, named file in
 * messages (one process). */
mc_status ck_write_bytes(hid_t fid, const char *file, const char *key, const void *data, size_t n,
                         mc_error *err);
/* 1 when the link path exists in fid, 0 when not, -1 when HDF5 cannot tell
 * (its error stack is left for ck_h5fail). */
int ck_exists(hid_t fid, const char *path);

/* ------------------------------------------------------------ ckpt_dir.c */

/* mkdtemp with the final directory's mode (0777 less the umask). */
int ck_make_tmpdir(char *tmpl);
mc_status ck_mkdir_p(const char *dir, mc_error *err);
/* The temporary iteration directory tmp (its file closed and fsynced) becomes
 * final: write its checksum manifest (ckpt_sum.c), fsync tmp, rename (exchanging an existing final,
 * then removed), fsync dir, then rewrite dir's latest pointer to iteration. On success *tmp_gone is
 * 1: nothing is left under the temporary name. */
mc_status ck_publish(const char *dir, const char *tmp, const char *final, int64_t iteration,
                     int *tmp_gone, mc_error *err);

/* ------------------------------------------------------------ ckpt_sum.c */

/* Write dir/checksums.xxh128 (MC_CKPT_MANIFEST): "<XXH3-128 in 32 hex
 * digits>  <name>" for every regular file of dir, by name, hidden
 * temporaries left out; through a temporary, fsynced. */
mc_status ck_manifest_write(const char *dir, mc_error *err);
/* A loaded manifest. */
typedef struct ck_manifest ck_manifest;
/* Read dir's manifest; *out is NULL (and MC_OK) when dir has none. A
 * malformed line is MC_ERR_FORMAT naming the manifest and the line. */
mc_status ck_manifest_load(const char *dir, ck_manifest **out, mc_error *err);
/* Hash the file path and compare it with m's line for its name: MC_OK when
 * they agree or m is NULL, MC_ERR_FORMAT naming path when they differ or
 * m does not list it. */
mc_status ck_manifest_check(const ck_manifest *m, const char *path, mc_error *err);
void ck_manifest_free(ck_manifest *m);

/* ------------------------------------------------------------ ckpt_block.c */

/* Open dataset `path` of the file fid (named `file` in messages) as a
 * tensor: its logical shape (cols 0: 1-D) and stored dtype, any of
 * mc_ckpt_dtype (quantized ones by their attributes). */
mc_status ck_open_tensor(hid_t fid, const char *file, const char *path, hid_t *ds, int64_t *rows,
                         int64_t *cols, mc_ckpt_dtype *dtype, mc_error *err);
/* Read the block [row0, +lrows) x [col0, +lcols) of that dataset, in its
 * own coordinates (cols 0: col0 0, lcols 1), as fp32. */
mc_status ck_read_block(hid_t fid, const char *file, const char *path, int64_t row0, int64_t col0,
                        int64_t lrows, int64_t lcols, float *out, mc_error *err);

/* ------------------------------------------------------------ the writer (ckpt_write.c) */

typedef struct ck_tensor {
    char *path;
    int64_t rows, cols;
    mc_ckpt_dtype dtype;
    int64_t written; /* elements written so far (by this process) */
} ck_tensor;

typedef struct ck_par ck_par;                   /* ckpt_par.c */
typedef struct ck_shard_writer ck_shard_writer; /* ckpt_shard.c */

struct mc_ckpt_writer {
    char *dir, *final, *final_file, *tmp, *tmp_file;
    int64_t iteration;
    hid_t fid; /* one process: open from begin to commit */
    mc_ckpt_compression comp;
    int level;
    ck_tensor *t;
    size_t nt, ct;
    ck_par *par;            /* NULL: this process writes alone */
    ck_shard_writer *shard; /* a sharded checkpoint: fid is index.h5 */
    int tmp_counted;        /* this process made tmp: mc_temp_end when freed */
};

/* ------------------------------------------------------------ ckpt_quant.c */

/* A tensor quantized whole: levels (int8, int4 unpacked -7..7) or E4M3FN
 * bits (fp8), and the scales (rows; 1; rows x ngroups). */
typedef struct ck_qtensor {
    mc_ckpt_dtype dtype;
    int64_t rows, cols, group_size, ngroups;
    int8_t *q;
    float *scale;
} ck_qtensor;
/* where = "FILE: PATH" for the errors. */
mc_status ck_quantize(const char *where, const float *x, int64_t rows, int64_t cols,
                      mc_ckpt_dtype dtype, int64_t group_size, ck_qtensor *out, mc_error *err);
void ck_qtensor_free(ck_qtensor *q);

/* Row ranges of a global tensor that make up a local one, in order. */
typedef struct ck_range {
    int64_t row0, rows;
} ck_range;

/* Write the local tensor made of rows rg[0..nrg) and columns
 * [col0, col0 + ncols) of the quantized global tensor as dataset `path`
 * of fid (its scales at scales/<path>). */
mc_status ck_write_quant_local(hid_t fid, const char *where, const char *path, const ck_qtensor *qt,
                               const ck_range *rg, int nrg, int64_t col0, int64_t ncols,
                               mc_ckpt_compression comp, int level, mc_error *err);

/* ------------------------------------------------------------ ckpt_shard.c */

/* Writer: the split of a tp x pp grid for the model (checked), then, once
 * the writer w of index.h5 holds it in w->shard, its root attributes and
 * the shard files; the sharded part of mc_ckpt_write_whole; and the
 * commit's first step (write the index into w->fid, close and fsync the
 * shard files). */
mc_status ck_shard_new(const char *dir, int tp, int pp, const mc_model_config *model,
                       ck_shard_writer **out, mc_error *err);
mc_status ck_shard_begin(mc_ckpt_writer *w, mc_error *err);
mc_status ck_shard_write_whole(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                               const float *host, mc_ckpt_dtype dtype, int64_t group_size,
                               mc_error *err);
mc_status ck_shard_finish(mc_ckpt_writer *w, mc_error *err);
void ck_shard_free(ck_shard_writer *s);

/* Reader: a sharded checkpoint's table, from index.h5 (fid). Each shard
 * file is checked against manifest (NULL: none; kept, not owned) before
 * HDF5 opens it. */
typedef struct ck_shard_reader ck_shard_reader;
mc_status ck_shard_reader_open(hid_t index_fid, const char *index_file, const char *dir,
                               const ck_manifest *manifest, ck_shard_reader **out, mc_error *err);
void ck_shard_reader_close(ck_shard_reader *s);
void ck_shard_reader_grid(const ck_shard_reader *s, int *tp, int *pp);
void ck_shard_reader_prefer(ck_shard_reader *s, int tp_rank, int pp_rank);
int ck_shard_reader_has(const ck_shard_reader *s, const char *path);
mc_status ck_shard_reader_info(const ck_shard_reader *s, const char *path, int64_t *rows,
                               int64_t *cols, mc_ckpt_dtype *dtype, mc_error *err);
/* Assemble the block from the shards holding it (shape already checked). */
mc_status ck_shard_reader_read(ck_shard_reader *s, const char *path, int64_t row0, int64_t col0,
                               int64_t lrows, int64_t lcols, float *out, mc_error *err);
/* The names directly under group, sorted, NUL-separated in *buf (count *n). */
mc_status ck_shard_reader_list(const ck_shard_reader *s, const char *group, mc_buf *buf, size_t *n,
                               mc_error *err);

/* ------------------------------------------------------------ ckpt_par.c */

/* w->dir, final, final_file, tmp (template) and iteration are set; make the
 * temporary directory on rank 0 and share it (collective). On failure w is
 * left for ck_par_free. */
mc_status ck_par_begin(mc_ckpt_writer *w, const mc_grid *g, mc_error *err);
/* Keep a block (already checked) for the collective write at commit. */
mc_status ck_par_stash_block(mc_ckpt_writer *w, size_t tensor, int64_t row0, int64_t col0,
                             int64_t lrows, int64_t lcols, const float *host, mc_error *err);
mc_status ck_par_stash_attr(mc_ckpt_writer *w, const char *key, int is_int, int64_t v,
                            const char *text, mc_error *err);
mc_status ck_par_stash_bytes(mc_ckpt_writer *w, const char *key, const void *data, size_t n,
                             mc_error *err);
/* Collective commit: agree, check, write, publish; every rank returns the
 * same status. */
mc_status ck_par_commit(mc_ckpt_writer *w, mc_error *err);
/* Remember the first error of a writing call on this rank. */
void ck_par_note(mc_ckpt_writer *w, const mc_error *err);
/* Collective abort: the other ranks' commit (or abort) fails with this
 * rank's noted error (or "abandoned"). */
void ck_par_abort(mc_ckpt_writer *w);
void ck_par_free(ck_par *p);

#endif
