/*
 * ckpt_block.c - reading stored tensors, the bottom of every checkpoint
 * reader: open a dataset as a tensor (its logical shape and stored dtype,
 * whichever tool wrote it) and read any block of it as fp32: float32 and
 * float16 through HDF5's conversion, bfloat16 widened here, and the
 * quantized dtypes (written by ckpt_quant.c; layout there and in
 * mc-formats(5), QUANTIZED TENSORS) dequantized with their scales.
 * ckpt_read.c reads one-file checkpoints through it, ckpt_shard.c the
 * shard files of sharded ones.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/h5zstd.h"
#include "mc/dtype.h"
#include "mc/quant.h"

/* ------------------------------------------------------------ quantized */

/* Read [start, +count) of a dataset of nd dims as mtype into buf. */
static mc_status read_slab(hid_t ds, hid_t mtype, int nd, const hsize_t *start,
                           const hsize_t *count, void *buf, const char *where, mc_error *err)
{
    hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(nd, count, NULL);
    mc_status st = MC_OK;
    if (fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot select the block", where);
    else if (H5Dread(ds, mtype, ms, fs, H5P_DEFAULT, buf) < 0)
        st = ck_h5fail(err, MC_ERR_FORMAT, "%s: read failed", where);
    ck_close(&ms);
    ck_close(&fs);
    return st;
}

/* Open scales/<path> and check its shape (nd dims, d0 x d1). */
static mc_status open_scales(hid_t fid, const char *where, const char *path, int nd, int64_t d0,
                             int64_t d1, hid_t *out, mc_error *err)
{
    char spath[1024];
    snprintf(spath, sizeof spath, CK_SCALES_GROUP "/%s", path);
    *out = -1;
    int there = ck_exists(fid, spath);
    if (there <= 0)
        return there < 0
                   ? ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", where, spath)
                   : mc_error_set(err, MC_ERR_FORMAT,
                                  "%s: quantized, but its scales %s are missing", where, spath);
    hid_t ds = H5Dopen2(fid, spath, H5P_DEFAULT), sp = ds >= 0 ? H5Dget_space(ds) : -1;
    hsize_t dims[2] = {0, 0};
    mc_status st = MC_OK;
    if (sp < 0 || H5Sget_simple_extent_ndims(sp) != nd ||
        H5Sget_simple_extent_dims(sp, dims, NULL) < 0 || (int64_t)dims[0] != d0 ||
        (nd == 2 && (int64_t)dims[1] < d1))
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: not the shape its tensor needs", where,
                          spath);
    H5Eclear2(H5E_DEFAULT);
    ck_close(&sp);
    if (st != MC_OK) ck_close(&ds);
    *out = ds;
    return st;
}

/* Read a block of the opened quantized dataset ds as fp32: the levels (or
 * fp8 bits) times their scales. */
static mc_status read_quant(hid_t fid, hid_t ds, const char *where, const char *path,
                            mc_ckpt_dtype dtype, int64_t row0, int64_t col0, int64_t lrows,
                            int64_t lcols, float *out, mc_error *err)
{
    size_t n = (size_t)lrows * (size_t)lcols;
    if (n == 0) return MC_OK;
    hid_t sds = -1, sp = H5Dget_space(ds);
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(sp, dims, NULL);
    ck_close(&sp);
    int64_t drows = (int64_t)dims[0];
    mc_status st = MC_OK;
    uint8_t *q = NULL;
    float *sc = NULL;
    if (dtype == MC_CKPT_INT8 || dtype == MC_CKPT_FP8_E4M3) {
        int fp8 = dtype == MC_CKPT_FP8_E4M3;
        hsize_t start[2] = {(hsize_t)row0, (hsize_t)col0},
                count[2] = {(hsize_t)lrows, (hsize_t)lcols};
        hsize_t s1[1] = {fp8 ? 0 : (hsize_t)row0}, c1[1] = {fp8 ? 1 : (hsize_t)lrows};
        q = malloc(n);
        sc = malloc((size_t)c1[0] * sizeof *sc);
        if (!q || !sc) st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
        if (!st) st = open_scales(fid, where, path, 1, fp8 ? 1 : drows, 0, &sds, err);
        if (!st)
            st = read_slab(ds, fp8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_INT8, 2, start, count, q, where,
                           err);
        if (!st) st = read_slab(sds, H5T_NATIVE_FLOAT, 1, s1, c1, sc, where, err);
        for (int64_t i = 0; i < lrows && !st; i++)
            for (int64_t j = 0; j < lcols; j++) {
                size_t k = (size_t)(i * lcols + j);
                out[k] = fp8 ? mc_fp8_e4m3_to_f32(q[k]) * sc[0] : (float)(int8_t)q[k] * sc[i];
            }
    } else {
        int64_t gs = 0, goff = 0, dcols = 0;
        if ((st = ck_read_int_attr(ds, "group_size", &gs, err, where)) == MC_OK &&
            (st = ck_read_int_attr(ds, "group_offset", &goff, err, where)) == MC_OK &&
            (st = ck_read_int_attr(ds, "cols", &dcols, err, where)) == MC_OK &&
            (gs < 1 || goff < 0 || goff >= gs))
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: int4 group_size %" PRId64 " or group_offset %" PRId64
                              " out of range",
                              where, gs, goff);
        if (st) return st;
        int64_t b0 = col0 / 2, b1 = (col0 + lcols - 1) / 2, nb = b1 - b0 + 1;
        int64_t k0 = (col0 + goff) / gs, k1 = (col0 + lcols - 1 + goff) / gs, nk = k1 - k0 + 1;
        int64_t ngroups = gs ? (dcols - 1 + goff) / gs + 1 : 0;
        if (!st) {
            q = malloc((size_t)(lrows * nb));
            sc = malloc((size_t)(lrows * nk) * sizeof *sc);
            if (!q || !sc) st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
        }
        if (!st) st = open_scales(fid, where, path, 2, drows, ngroups, &sds, err);
        hsize_t start[2] = {(hsize_t)row0, (hsize_t)b0}, count[2] = {(hsize_t)lrows, (hsize_t)nb};
        hsize_t s2[2] = {(hsize_t)row0, (hsize_t)k0}, c2[2] = {(hsize_t)lrows, (hsize_t)nk};
        if (!st) st = read_slab(ds, H5T_NATIVE_UINT8, 2, start, count, q, where, err);
        if (!st) st = read_slab(sds, H5T_NATIVE_FLOAT, 2, s2, c2, sc, where, err);
        for (int64_t i = 0; i < lrows && !st; i++)
            for (int64_t j = 0; j < lcols; j++) {
                int64_t c = col0 + j;
                unsigned b = q[i * nb + (c >> 1) - b0];
                int v = (int)(((c & 1) ? b >> 4 : b & 15u) ^ 8u) - 8;
                out[i * lcols + j] = (float)v * sc[i * nk + (c + goff) / gs - k0];
            }
    }
    ck_close(&sds);
    free(q);
    free(sc);
    return st;
}

/* ------------------------------------------------------------ any tensor */

/* Open a tensor and learn its logical shape and stored dtype. A dataset
 * written by another tool without a dtype attribute is read by its HDF5
 * type: any float (float64 is rounded to fp32); uint16 needs
 * dtype="bfloat16". Quantized datasets (ckpt_quant.c) are int8/uint8 with
 * dtype "int8", "fp8_e4m3" or "int4"; an int4 one holds two elements per
 * byte and keeps its logical column count in the attribute "cols". */
/* The bytes a tensor's extent needs must be in the file before anyone
 * allocates for them (a header claiming 2^40 elements is refused here, not
 * met by an out-of-memory kill): mc writes every element, so the dataset's
 * stored bytes cover its extent, or with zstd at most CK_ZSTD_MAX_RATIO
 * times them; and no dataset stores more than the file holds. */
static mc_status check_stored(hid_t fid, hid_t ds, hid_t t, const char *file, const char *path,
                              int nd, const hsize_t *dims, mc_error *err)
{
    uint64_t esize = H5Tget_size(t), elems = dims[0], need;
    if (nd == 2 && __builtin_mul_overflow(elems, (uint64_t)dims[1], &elems)) elems = UINT64_MAX;
    if (esize == 0 || __builtin_mul_overflow(elems, esize, &need)) need = UINT64_MAX;
    uint64_t stored = H5Dget_storage_size(ds), limit = stored;
    hsize_t fsize = 0;
    if (H5Fget_filesize(fid, &fsize) < 0) fsize = 0;
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl >= 0) {
        unsigned flags = 0, cd[4];
        size_t ncd = 4;
        if (H5Pget_filter_by_id2(dcpl, MC_H5Z_FILTER_ZSTD, &flags, &ncd, cd, 0, NULL, NULL) >= 0 &&
            __builtin_mul_overflow(stored, (uint64_t)CK_ZSTD_MAX_RATIO, &limit))
            limit = UINT64_MAX;
        H5Pclose(dcpl);
    }
    H5Eclear2(H5E_DEFAULT);
    if (stored > fsize)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: %s: stores %" PRIu64 " bytes, more than the file's %llu", file,
                            path, stored, (unsigned long long)fsize);
    if (elems > (uint64_t)INT64_MAX || need > limit) {
        char shape[96];
        if (nd == 2)
            snprintf(shape, sizeof shape, "[%llu, %llu]", (unsigned long long)dims[0],
                     (unsigned long long)dims[1]);
        else
            snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)dims[0]);
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: %s: shape %s needs %" PRIu64 " bytes, the file stores %" PRIu64,
                            file, path, shape, need, stored);
    }
    return MC_OK;
}

mc_status ck_open_tensor(hid_t fid, const char *file, const char *path, hid_t *ds_out,
                         int64_t *rows, int64_t *cols, mc_ckpt_dtype *dtype, mc_error *err)
{
    *ds_out = -1;
    if (!ck_valid_path(path))
        return mc_error_set(err, MC_ERR_USAGE, "%s: %s: invalid tensor path", file,
                            path ? path : "(null)");
    int there = ck_exists(fid, path);
    if (there < 0) return ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", file, path);
    if (!there)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: %s: no such tensor in the checkpoint", file,
                            path);
    hid_t ds = H5Dopen2(fid, path, H5P_DEFAULT), sp = -1, t = -1;
    mc_status st = MC_OK;
    char *dname = NULL;
    hsize_t dims[2] = {0, 0};
    int nd = -1;
    if (ds < 0 || (sp = H5Dget_space(ds)) < 0 || (t = H5Dget_type(ds)) < 0 ||
        (nd = H5Sget_simple_extent_ndims(sp)) < 0) {
        st = ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: not a readable dataset", file, path);
        goto done;
    }
    if (nd < 1 || nd > 2) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: %d dimensions, a tensor has 1 or 2", file,
                          path, nd);
        goto done;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    if (dims[0] < 1 || (nd == 2 && dims[1] < 1)) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: empty tensor", file, path);
        goto done;
    }
    if ((st = check_stored(fid, ds, t, file, path, nd, dims, err)) != MC_OK) goto done;
    *rows = (int64_t)dims[0];
    *cols = nd == 2 ? (int64_t)dims[1] : 0;
    st = ck_read_str_attr(ds, "dtype", &dname, err, file);
    if (st == MC_ERR_NOTFOUND) {
        st = MC_OK;
        mc_error_clear(err);
    } else if (st != MC_OK) {
        goto done;
    }
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    if (dname && strcmp(dname, "bfloat16") == 0) {
        *dtype = MC_CKPT_BFLOAT16;
        if (cls != H5T_INTEGER || size != 2)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: %s: dtype bfloat16 needs 16-bit integer storage", file, path);
    } else if (dname &&
               (!strcmp(dname, "int8") || !strcmp(dname, "fp8_e4m3") || !strcmp(dname, "int4"))) {
        *dtype = dname[1] == 'p' ? MC_CKPT_FP8_E4M3 : dname[3] == '8' ? MC_CKPT_INT8 : MC_CKPT_INT4;
        if (cls != H5T_INTEGER || size != 1 || nd != 2) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: %s: dtype %s needs 2-D 8-bit integer storage", file, path,
                              dname);
        } else if (*dtype == MC_CKPT_INT4) {
            int64_t lc = 0;
            st = ck_read_int_attr(ds, "cols", &lc, err, file);
            if (st == MC_OK && (lc < 1 || lc / 2 + lc % 2 != *cols))
                st = mc_error_set(err, MC_ERR_FORMAT,
                                  "%s: %s: int4 attribute cols %" PRId64 " does not fit %" PRId64
                                  " bytes per row",
                                  file, path, lc, *cols);
            *cols = lc;
        }
    } else if (dname && strcmp(dname, "float16") != 0 && strcmp(dname, "float32") != 0) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: unknown dtype '%s'", file, path, dname);
    } else if (cls != H5T_FLOAT) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: not stored as floating point", file, path);
    } else {
        *dtype = size == 2 ? MC_CKPT_FLOAT16 : MC_CKPT_FLOAT32;
        if (dname && strcmp(dname, mc_ckpt_dtype_name(*dtype)) != 0)
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: dtype '%s' but %zu-byte floats", file,
                              path, dname, size);
    }
done:
    free(dname);
    ck_close(&t);
    ck_close(&sp);
    if (st != MC_OK) ck_close(&ds);
    *ds_out = ds;
    return st;
}

mc_status ck_read_block(hid_t fid, const char *file, const char *path, int64_t row0, int64_t col0,
                        int64_t lrows, int64_t lcols, float *out, mc_error *err)
{
    char where[512];
    snprintf(where, sizeof where, "%s: %s", file, path);
    int64_t frows, fcols;
    mc_ckpt_dtype dtype;
    hid_t ds = -1, fs = -1, ms = -1;
    mc_status st = ck_open_tensor(fid, file, path, &ds, &frows, &fcols, &dtype, err);
    if (st != MC_OK) return st;
    if ((st = ck_check_block(where, frows, fcols, row0, col0, lrows, lcols, err)) != MC_OK) {
        ck_close(&ds);
        return err->code = MC_ERR_FORMAT; /* a dataset smaller than its index says */
    }
    if (mc_ckpt_dtype_is_quantized(dtype)) {
        st = read_quant(fid, ds, where, path, dtype, row0, col0, lrows, lcols, out, err);
        ck_close(&ds);
        return st;
    }
    size_t n = (size_t)lrows * (size_t)lcols;
    if (n > 0) {
        hid_t mt = dtype == MC_CKPT_BFLOAT16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
        if ((fs = H5Dget_space(ds)) < 0 ||
            ck_block_spaces(fs, fcols, row0, col0, lrows, lcols, &ms) != MC_OK)
            st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot select the block", where);
        else if (H5Dread(ds, mt, ms, fs, H5P_DEFAULT, out) < 0)
            st = ck_h5fail(err, MC_ERR_FORMAT, "%s: read failed", where);
        else if (dtype == MC_CKPT_BFLOAT16) {
            /* The n uint16 values sit in the first half of out; widen from
             * the end so that no value is overwritten before it is read. */
            const unsigned char *b = (const unsigned char *)out;
            for (size_t i = n; i-- > 0;) {
                uint16_t h;
                memcpy(&h, b + 2 * i, 2);
                float f = mc_dtype_bf16_to_f32(h);
                memcpy((unsigned char *)out + 4 * i, &f, 4);
            }
        }
    }
    ck_close(&ms);
    ck_close(&fs);
    ck_close(&ds);
    return st;
}
