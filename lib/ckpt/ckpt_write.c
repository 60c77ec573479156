/*
 * ckpt_write.c - the all-or-nothing checkpoint writer, every public writing
 * call of mc/ckpt.h: its front (argument checks, the table of tensors and
 * their shapes) and the one-process path, which writes model.h5 in a
 * hidden temporary directory through HDF5's default driver as the calls
 * come, then commits (completeness check, fsync, rename, latest pointer).
 * The back ends below it (ckpt_internal.h): a writer begun on a grid of
 * several processes hands its blocks to ckpt_par.c, which writes them all
 * collectively at commit; a sharded one (mc_ckpt_writer_begin_sharded)
 * has ckpt_shard.c split each whole tensor into the shard files; whole
 * tensors stored quantized (mc_ckpt_write_whole) are ckpt_quant.c's.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/h5zstd.h"
#include "mc/json.h"

const char *mc_ckpt_writer_dir(const mc_ckpt_writer *w) { return w->final; }

static void writer_free(mc_ckpt_writer *w)
{
    ck_close(&w->fid);
    if (w->tmp_counted) mc_temp_end();
    for (size_t i = 0; i < w->nt; i++) free(w->t[i].path);
    ck_par_free(w->par);
    ck_shard_free(w->shard);
    free(w->t);
    free(w->dir);
    free(w->final);
    free(w->final_file);
    free(w->tmp);
    free(w->tmp_file);
    free(w);
}

/* One process: drop the file and the temporary directory. */
static void writer_discard(mc_ckpt_writer *w)
{
    ck_close(&w->fid);
    if (w->tmp) mc_remove_tree(w->tmp);
    writer_free(w);
}

/* The names every writer needs; the temporary keeps its XXXXXX template. */
static mc_status writer_new(const char *dir, int64_t iteration, const char *fname,
                            mc_ckpt_writer **out, mc_error *err)
{
    mc_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    w->fid = -1;
    w->iteration = iteration;
    w->dir = strdup(dir);
    w->final = mc_strprintf("%s/iter_%07" PRId64, dir, iteration);
    w->final_file = mc_strprintf("%s/%s", w->final ? w->final : "", fname);
    w->tmp = mc_strprintf("%s/.iter_%07" PRId64 ".tmp.XXXXXX", dir, iteration);
    if (!w->dir || !w->final || !w->final_file || !w->tmp) {
        writer_free(w);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    }
    *out = w;
    return MC_OK;
}

static mc_status writer_begin(const char *dir, int64_t iteration, const char *fname,
                              mc_ckpt_writer **out, mc_error *err)
{
    mc_ckpt_writer *w;
    mc_status st = writer_new(dir, iteration, fname, &w, err);
    hid_t fapl = -1;
    if (st != MC_OK) return st;
    if ((st = ck_mkdir_p(dir, err)) != MC_OK) {
        writer_free(w);
        return st;
    }
    /* counted before it exists: a signal is deferred until it is gone */
    mc_temp_begin();
    w->tmp_counted = 1;
    if (ck_make_tmpdir(w->tmp) != 0) {
        int e = errno;
        free(w->tmp);
        w->tmp = NULL;
        writer_free(w);
        return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create a temporary directory", dir);
    }
    if (!(w->tmp_file = mc_strprintf("%s/%s", w->tmp, fname))) {
        writer_discard(w);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    }
    if ((st = mc_h5zstd_register(err)) != MC_OK) {
        writer_discard(w);
        return st;
    }
    /* 1.10 structures everywhere: checksummed metadata (ckpt_h5.c). */
    if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) < 0 ||
        (w->fid = H5Fcreate(w->tmp_file, H5F_ACC_EXCL, H5P_DEFAULT, fapl)) < 0) {
        st = ck_h5fail(err, MC_ERR_IO, "%s: cannot create the HDF5 file", w->final_file);
        ck_close(&fapl);
        writer_discard(w);
        return st;
    }
    ck_close(&fapl);
    if ((st = ck_write_header(w->fid, iteration, err, w->final_file)) != MC_OK) {
        writer_discard(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

/* A one-process writer whose file in the iteration directory is named
 * fname (MC_CKPT_FILE, or CK_INDEX_FILE for a sharded one). */
static mc_status begin_named(const char *dir, int64_t iteration, const char *fname,
                             mc_ckpt_writer **out, mc_error *err)
{
    *out = NULL;
    if (!dir || !*dir) return mc_error_set(err, MC_ERR_USAGE, "checkpoint directory: empty name");
    if (iteration < 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: negative iteration %" PRId64, dir, iteration);
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = writer_begin(dir, iteration, fname, out, err);
    ck_quiet_off(&q);
    return st;
}

mc_status mc_ckpt_writer_begin(const char *dir, int64_t iteration, mc_ckpt_writer **out,
                               mc_error *err)
{
    return begin_named(dir, iteration, MC_CKPT_FILE, out, err);
}

mc_status mc_ckpt_writer_begin_sharded(const char *dir, int64_t iteration, int tp, int pp,
                                       const mc_model_config *model, mc_ckpt_writer **out,
                                       mc_error *err)
{
    *out = NULL;
    ck_shard_writer *s;
    mc_status st = ck_shard_new(dir, tp, pp, model, &s, err);
    if (st) return st;
    mc_ckpt_writer *w;
    if ((st = begin_named(dir, iteration, CK_INDEX_FILE, &w, err)) != MC_OK) {
        ck_shard_free(s);
        return st;
    }
    w->shard = s;
    ck_quiet q;
    ck_quiet_on(&q);
    st = ck_shard_begin(w, err);
    ck_quiet_off(&q);
    if (st) {
        mc_ckpt_writer_abort(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

mc_status mc_ckpt_writer_begin_grid(const char *dir, int64_t iteration, const mc_grid *g,
                                    mc_ckpt_writer **out, mc_error *err)
{
    if (!g || g->world <= 1 || !g->impl) return mc_ckpt_writer_begin(dir, iteration, out, err);
    *out = NULL;
    /* The checks are the same on every rank (same arguments): no rank is
     * left waiting in ck_par_begin's collectives. */
    if (!dir || !*dir) return mc_error_set(err, MC_ERR_USAGE, "checkpoint directory: empty name");
    if (iteration < 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: negative iteration %" PRId64, dir, iteration);
    mc_ckpt_writer *w;
    mc_status st = writer_new(dir, iteration, MC_CKPT_FILE, &w, err);
    /* Every rank reaches ck_par_begin even when out of memory here, so that
     * the others learn of it instead of waiting. */
    if ((st = ck_par_begin(st == MC_OK ? w : NULL, g, err)) != MC_OK) {
        if (w) writer_free(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

mc_status mc_ckpt_writer_set_compression(mc_ckpt_writer *w, mc_ckpt_compression c, int level,
                                         mc_error *err)
{
    if (c != MC_CKPT_COMPRESS_NONE && c != MC_CKPT_COMPRESS_ZSTD)
        return mc_error_set(err, MC_ERR_USAGE, "%s: unknown compression %d", w->final_file, (int)c);
    w->comp = c;
    w->level = level;
    return MC_OK;
}

/* Find or add (after checks) the tensor `path` in w's table; *created is 1
 * when it was added. where = "FILE: PATH". */
static mc_status writer_tensor(mc_ckpt_writer *w, const char *where, const char *path, int64_t rows,
                               int64_t cols, mc_ckpt_dtype dtype, ck_tensor **out, int *created,
                               mc_error *err)
{
    *created = 0;
    for (size_t i = 0; i < w->nt; i++)
        if (strcmp(w->t[i].path, path) == 0) {
            ck_tensor *t = &w->t[i];
            if (t->rows != rows || t->cols != cols || t->dtype != dtype) {
                char a[64], b[64];
                ck_shape_str(a, sizeof a, t->rows, t->cols);
                ck_shape_str(b, sizeof b, rows, cols);
                return mc_error_set(err, MC_ERR_USAGE, "%s: written as %s %s, now as %s %s", where,
                                    a, mc_ckpt_dtype_name(t->dtype), b, mc_ckpt_dtype_name(dtype));
            }
            *out = t;
            return MC_OK;
        }
    if (w->nt == w->ct) {
        size_t nc = w->ct ? 2 * w->ct : 64;
        ck_tensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
        w->t = nt;
        w->ct = nc;
    }
    ck_tensor *t = &w->t[w->nt];
    if (!(t->path = strdup(path)))
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
    t->rows = rows;
    t->cols = cols;
    t->dtype = dtype;
    t->written = 0;
    w->nt++;
    *out = t;
    *created = 1;
    return MC_OK;
}

static mc_status write_tensor(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                              int64_t row0, int64_t col0, int64_t lrows, int64_t lcols,
                              const float *host, mc_ckpt_dtype dtype, mc_error *err)
{
    char where[512];
    snprintf(where, sizeof where, "%s: %s", w->final_file, path ? path : "(null)");
    mc_status ist = mc_interrupt_check(w->final, err);
    if (ist) return ist;
    if (!ck_valid_path(path))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid tensor path", where);
    if (!mc_ckpt_dtype_name(dtype))
        return mc_error_set(err, MC_ERR_USAGE, "%s: unknown dtype %d", where, (int)dtype);
    if (mc_ckpt_dtype_is_quantized(dtype) || w->shard)
        return mc_error_set(err, MC_ERR_USAGE, "%s: %s: write it whole (mc_ckpt_write_whole)",
                            where, w->shard ? "a sharded checkpoint" : "a quantized tensor");
    mc_status st = ck_check_block(where, rows, cols, row0, col0, lrows, lcols, err);
    if (st != MC_OK) return st;
    if (cols == 0) col0 = 0, lcols = 1;
    /* One process: the dataset is created by the first write of a path. */
    if (!w->par && H5Lexists(w->fid, path, H5P_DEFAULT) > 0) {
        int known = 0;
        for (size_t i = 0; i < w->nt; i++) known |= strcmp(w->t[i].path, path) == 0;
        if (!known)
            return mc_error_set(err, MC_ERR_USAGE, "%s: name already used in the file", where);
    }
    H5Eclear2(H5E_DEFAULT);
    ck_tensor *t;
    int created;
    if ((st = writer_tensor(w, where, path, rows, cols, dtype, &t, &created, err)) != MC_OK)
        return st;
    size_t ti = (size_t)(t - w->t);
    if (created && !w->par &&
        (st = ck_create_tensor(w->fid, w->final_file, path, rows, cols, dtype, w->comp, w->level,
                               err)) != MC_OK) {
        free(t->path);
        w->nt--;
        return st;
    }
    size_t n = (size_t)lrows * (size_t)lcols;
    if (n == 0) return MC_OK;
    if (w->par) {
        if ((st = ck_par_stash_block(w, ti, row0, col0, lrows, lcols, host, err)) == MC_OK)
            w->t[ti].written += (int64_t)n;
        return st;
    }

    /* The stored form of the block: fp32 as is, 16-bit types converted. */
    void *conv = NULL;
    if (dtype != MC_CKPT_FLOAT32) {
        if (!(conv = malloc(n * ck_dtype_size(dtype))))
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
        ck_convert(dtype, host, n, conv);
    }
    hid_t mt = ck_mem_type(dtype), ds = H5Dopen2(w->fid, path, H5P_DEFAULT), fs = -1, ms = -1;
    if (mt < 0 || ds < 0 || (fs = H5Dget_space(ds)) < 0 ||
        ck_block_spaces(fs, cols, row0, col0, lrows, lcols, &ms) != MC_OK)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot select the block", where);
    else if (H5Dwrite(ds, mt, ms, fs, H5P_DEFAULT, conv ? conv : (const void *)host) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: write failed", where);
    else
        t->written += (int64_t)n;
    ck_close(&ms);
    ck_close(&fs);
    ck_close(&ds);
    ck_close(&mt);
    free(conv);
    return st;
}

mc_status mc_ckpt_write_tensor(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                               int64_t row0, int64_t col0, int64_t local_rows, int64_t local_cols,
                               const float *host, mc_ckpt_dtype dtype, mc_error *err)
{
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = write_tensor(w, path, rows, cols, row0, col0, local_rows, local_cols, host,
                                dtype, err);
    ck_quiet_off(&q);
    if (st && w->par) ck_par_note(w, err);
    return st;
}

mc_status mc_ckpt_write_whole(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                              const float *host, mc_ckpt_dtype dtype, int64_t group_size,
                              mc_error *err)
{
    char where[512];
    snprintf(where, sizeof where, "%s: %s", w->final_file, path ? path : "(null)");
    mc_status st = MC_OK;
    int quant = mc_ckpt_dtype_is_quantized(dtype);
    if (!ck_valid_path(path))
        st = mc_error_set(err, MC_ERR_USAGE, "%s: invalid tensor path", where);
    else if (!mc_ckpt_dtype_name(dtype))
        st = mc_error_set(err, MC_ERR_USAGE, "%s: unknown dtype %d", where, (int)dtype);
    else if (rows < 1 || cols < 0)
        st = ck_check_block(where, rows, cols, 0, 0, rows, cols, err);
    else if (quant && cols == 0)
        st = mc_error_set(err, MC_ERR_USAGE, "%s: only 2-D tensors are quantized", where);
    else if (dtype == MC_CKPT_INT4 && group_size < 1)
        st = mc_error_set(err, MC_ERR_USAGE, "%s: int4 group size %" PRId64 " must be positive",
                          where, group_size);
    else if (!quant && !w->shard)
        return mc_ckpt_write_tensor(w, path, rows, cols, 0, 0, rows, cols ? cols : 1, host, dtype,
                                    err);
    else if (w->par)
        st = mc_error_set(err, MC_ERR_USAGE, "%s: quantized tensors are written by one process",
                          where);
    if (st) return st;
    ck_tensor *t;
    int created;
    if ((st = writer_tensor(w, where, path, rows, cols, dtype, &t, &created, err)) != MC_OK)
        return st;
    if (!created) return mc_error_set(err, MC_ERR_USAGE, "%s: written twice", where);
    size_t ti = (size_t)(t - w->t);
    ck_quiet q;
    ck_quiet_on(&q);
    if (w->shard) {
        st = ck_shard_write_whole(w, path, rows, cols, host, dtype, group_size, err);
    } else if (H5Lexists(w->fid, path, H5P_DEFAULT) > 0) {
        st = mc_error_set(err, MC_ERR_USAGE, "%s: name already used in the file", where);
    } else {
        ck_qtensor qt;
        ck_range all = {0, rows};
        H5Eclear2(H5E_DEFAULT);
        if ((st = ck_quantize(where, host, rows, cols, dtype, group_size, &qt, err)) == MC_OK)
            st = ck_write_quant_local(w->fid, w->final_file, path, &qt, &all, 1, 0, cols, w->comp,
                                      w->level, err);
        ck_qtensor_free(&qt);
    }
    ck_quiet_off(&q);
    if (st == MC_OK) w->t[ti].written = rows * (cols ? cols : 1);
    return st;
}

mc_status mc_ckpt_write_json(mc_ckpt_writer *w, const char *key, const char *json_text,
                             mc_error *err)
{
    if (!ck_valid_key(key) || !json_text) {
        mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name or text", w->final_file);
        ck_par_note(w, err);
        return MC_ERR_USAGE;
    }
    char where[512];
    snprintf(where, sizeof where, "%s: attribute %s", w->final_file, key);
    json_t *j = NULL;
    mc_status st = mc_json_load_buf(where, json_text, strlen(json_text), &j, err);
    if (st != MC_OK) {
        ck_par_note(w, err);
        return st;
    }
    json_decref(j);
    if (w->par) {
        if ((st = ck_par_stash_attr(w, key, 0, 0, json_text, err)) != MC_OK) ck_par_note(w, err);
        return st;
    }
    ck_quiet q;
    ck_quiet_on(&q);
    st = ck_write_str_attr(w->fid, key, json_text, err, w->final_file);
    ck_quiet_off(&q);
    return st;
}

mc_status mc_ckpt_write_int(mc_ckpt_writer *w, const char *key, int64_t value, mc_error *err)
{
    if (!ck_valid_key(key)) {
        mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name", w->final_file);
        ck_par_note(w, err);
        return MC_ERR_USAGE;
    }
    if (w->par) {
        mc_status st = ck_par_stash_attr(w, key, 1, value, NULL, err);
        ck_par_note(w, st ? err : NULL);
        return st;
    }
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = ck_write_int_attr(w->fid, key, value, err, w->final_file);
    ck_quiet_off(&q);
    return st;
}

mc_status mc_ckpt_write_bytes(mc_ckpt_writer *w, const char *key, const void *data, size_t n,
                              mc_error *err)
{
    if (!ck_valid_key(key) || (n && !data)) {
        mc_error_set(err, MC_ERR_USAGE, "%s: invalid dataset name or data", w->final_file);
        ck_par_note(w, err);
        return MC_ERR_USAGE;
    }
    if (w->par) {
        mc_status st = ck_par_stash_bytes(w, key, data, n, err);
        ck_par_note(w, st ? err : NULL);
        return st;
    }
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = ck_write_bytes(w->fid, w->final_file, key, data, n, err);
    ck_quiet_off(&q);
    return st;
}

static mc_status writer_commit(mc_ckpt_writer *w, mc_error *err)
{
    mc_status st;
    for (size_t i = 0; i < w->nt; i++) {
        const ck_tensor *t = &w->t[i];
        int64_t numel = t->rows * (t->cols ? t->cols : 1);
        if (t->written != numel)
            return mc_error_set(err, MC_ERR_USAGE,
                                "%s: %s: %" PRId64 " of %" PRId64
                                " elements written; not saving a partial tensor",
                                w->final_file, t->path, t->written, numel);
    }
    if (w->shard && (st = ck_shard_finish(w, err)) != MC_OK) return st;
    if (H5Fclose(w->fid) < 0) {
        w->fid = -1;
        return ck_h5fail(err, MC_ERR_IO, "%s: closing the HDF5 file failed", w->final_file);
    }
    w->fid = -1;
    if ((st = mc_fsync_path(w->tmp_file, err)) != MC_OK) return st;
    int gone = 0;
    st = ck_publish(w->dir, w->tmp, w->final, w->iteration, &gone, err);
    if (gone) {
        free(w->tmp);
        w->tmp = NULL;
    }
    return st;
}

mc_status mc_ckpt_writer_commit(mc_ckpt_writer *w, mc_error *err)
{
    if (w->par) {
        mc_status st = ck_par_commit(w, err);
        writer_free(w);
        return st;
    }
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = writer_commit(w, err);
    writer_discard(w); /* removes the temporary if it is still there */
    ck_quiet_off(&q);
    return st;
}

void mc_ckpt_writer_abort(mc_ckpt_writer *w)
{
    if (!w) return;
    if (w->par) {
        ck_par_abort(w);
        writer_free(w);
        return;
    }
    ck_quiet q;
    ck_quiet_on(&q);
    writer_discard(w);
    ck_quiet_off(&q);
}
