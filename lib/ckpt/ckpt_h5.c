/*
 * ckpt_h5.c - the HDF5 side of checkpoints, bottom layer of every writer and
 * reader (ckpt_internal.h): error capture, the stored dtypes and their
 * conversions from fp32 (mc/dtype.h's), block shapes and selections, link
 * lookup, string and integer attributes, the root header, and creating
 * checksummed tensor and byte datasets (layout in mc-formats(5), CHECKPOINTS;
 * why checksummed in doc/ARCHITECTURE.md, "Checkpoints").
 */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/h5zstd.h"
#include "mc/dtype.h"

/* ------------------------------------------------------------ HDF5 errors */

void ck_quiet_on(ck_quiet *q)
{
    H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void ck_quiet_off(const ck_quiet *q) { H5Eset_auto2(H5E_DEFAULT, q->func, q->data); }

static herr_t innermost_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    (void)n;
    char *out = data;
    if (!e->desc || !e->desc[0]) return 0;
    /* HDF5's POSIX driver describes a failed system call in several lines
     * ("file write failed: time = ..., errno = 27, error message = 'File
     * too large', buf = ..."): the system's message is what a person needs,
     * on the one line of an error. */
    const char *en = strstr(e->desc, "errno = ");
    int code = en ? atoi(en + 8) : 0;
    if (code > 0) {
        snprintf(out, 256, "%s", strerror(code));
        return 0;
    }
    snprintf(out, 256, "%s", e->desc);
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return 0;
}

/* HDF5 closes what is still open when the process exits. After a failed
 * write (a full disk, a file-size limit) its cleanup crashed on the dataset
 * it could not flush (H5D_close from its atexit handler). mc closes every
 * file it finished, and a failed writer's temporaries are removed anyway,
 * so HDF5 does no cleanup at exit: the operating system frees the rest. */
__attribute__((constructor)) static void no_hdf5_cleanup_at_exit(void) { H5dont_atexit(); }

mc_status ck_h5fail(mc_error *err, mc_status code, const char *fmt, ...)
{
    char msg[MC_ERROR_MSG_MAX], inner[256] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, innermost_cb, inner);
    H5Eclear2(H5E_DEFAULT);
    if (inner[0]) return mc_error_set(err, code, "%s: %s", msg, inner);
    return mc_error_set(err, code, "%s", msg);
}

void ck_close(hid_t *id)
{
    if (*id >= 0) H5Idec_ref(*id);
    *id = -1;
}

/* ------------------------------------------------------------ dtypes */

const char *mc_ckpt_dtype_name(mc_ckpt_dtype d)
{
    switch (d) {
    case MC_CKPT_FLOAT32: return "float32";
    case MC_CKPT_BFLOAT16: return "bfloat16";
    case MC_CKPT_FLOAT16: return "float16";
    case MC_CKPT_INT8: return "int8";
    case MC_CKPT_FP8_E4M3: return "fp8_e4m3";
    case MC_CKPT_INT4: return "int4";
    }
    return NULL;
}

const mc_choice mc_ckpt_float_dtype_choices[] = {
    {"fp32", MC_CKPT_FLOAT32},
    {"float32", MC_CKPT_FLOAT32},
    {"bf16", MC_CKPT_BFLOAT16},
    {"bfloat16", MC_CKPT_BFLOAT16},
    {"fp16", MC_CKPT_FLOAT16},
    {"float16", MC_CKPT_FLOAT16},
    {NULL, 0},
};

int mc_ckpt_dtype_is_quantized(mc_ckpt_dtype d)
{
    return d == MC_CKPT_INT8 || d == MC_CKPT_FP8_E4M3 || d == MC_CKPT_INT4;
}

mc_status mc_ckpt_dtype_parse(const char *s, mc_ckpt_dtype *out, mc_error *err)
{
    for (int d = MC_CKPT_FLOAT32; d <= MC_CKPT_FLOAT16; d++)
        if (s && strcmp(s, mc_ckpt_dtype_name((mc_ckpt_dtype)d)) == 0) {
            *out = (mc_ckpt_dtype)d;
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_USAGE,
                        "unknown checkpoint dtype '%s' (float32, bfloat16, float16)", s ? s : "");
}

mc_status mc_ckpt_compression_parse(const char *s, mc_ckpt_compression *out, mc_error *err)
{
    if (s && strcmp(s, "none") == 0)
        *out = MC_CKPT_COMPRESS_NONE;
    else if (s && strcmp(s, "zstd") == 0)
        *out = MC_CKPT_COMPRESS_ZSTD;
    else
        return mc_error_set(err, MC_ERR_USAGE, "unknown checkpoint compression '%s' (none, zstd)",
                            s ? s : "");
    return MC_OK;
}

/* IEEE binary16 as HDF5 describes it (what h5py and numpy call float16). */
hid_t ck_half_type(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0) return -1;
    if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 ||
        H5Tset_ebias(t, 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* ------------------------------------------------------------ shapes */

void ck_shape_str(char *out, size_t cap, int64_t rows, int64_t cols)
{
    if (cols == 0)
        snprintf(out, cap, "[%" PRId64 "]", rows);
    else
        snprintf(out, cap, "[%" PRId64 ", %" PRId64 "]", rows, cols);
}

mc_status ck_check_block(const char *where, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                         int64_t lrows, int64_t lcols, mc_error *err)
{
    if (rows < 1 || cols < 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid shape [%" PRId64 ", %" PRId64 "]",
                            where, rows, cols);
    if (cols == 0) {
        col0 = 0;
        lcols = 1;
        cols = 1;
    }
    if (row0 < 0 || lrows < 0 || row0 > rows - lrows || col0 < 0 || lcols < 0 ||
        col0 > cols - lcols)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: block rows [%" PRId64 ", %" PRId64 ") x cols [%" PRId64
                            ", %" PRId64 ") is outside the tensor",
                            where, row0, row0 + lrows, col0, col0 + lcols);
    return MC_OK;
}

mc_status ck_block_spaces(hid_t fspace, int64_t cols, int64_t row0, int64_t col0, int64_t lrows,
                          int64_t lcols, hid_t *mspace)
{
    int nd = cols == 0 ? 1 : 2;
    hsize_t start[2] = {(hsize_t)row0, (hsize_t)(nd == 2 ? col0 : 0)};
    hsize_t count[2] = {(hsize_t)lrows, (hsize_t)(nd == 2 ? lcols : 1)};
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0)
        return MC_ERR_INTERNAL;
    *mspace = H5Screate_simple(nd, count, NULL);
    return *mspace < 0 ? MC_ERR_INTERNAL : MC_OK;
}

int ck_valid_path(const char *p)
{
    if (!p || !*p || p[0] == '/' || p[strlen(p) - 1] == '/' || strstr(p, "//")) return 0;
    return 1;
}

int ck_valid_key(const char *k) { return k && *k && !strchr(k, '/'); }

/* 1 when the link path exists, 0 when it does not, -1 when HDF5 cannot
 * tell (a damaged group; its error stack is left for ck_h5fail). */
int ck_exists(hid_t fid, const char *path)
{
    /* H5Lexists on "a/b" fails when "a" is missing: check each prefix. */
    char buf[1024];
    size_t n = strlen(path);
    if (n >= sizeof buf) return 0;
    memcpy(buf, path, n + 1);
    for (size_t i = 0; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            htri_t e = H5Lexists(fid, buf, H5P_DEFAULT);
            buf[i] = c;
            if (e <= 0) return e < 0 ? -1 : 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------ attributes */

mc_status ck_write_str_attr(hid_t loc, const char *name, const char *s, mc_error *err,
                            const char *where)
{
    size_t len = strlen(s);
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = -1;
    mc_status st = MC_OK;
    if (t < 0 || sp < 0 || H5Tset_size(t, len ? len : 1) < 0 ||
        H5Tset_strpad(t, H5T_STR_NULLPAD) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: attribute %s: cannot make its type", where, name);
    else if (H5Aexists(loc, name) > 0 && H5Adelete(loc, name) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: attribute %s: cannot replace it", where, name);
    else if ((a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
             H5Awrite(a, t, len ? s : "") < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: attribute %s: write failed", where, name);
    ck_close(&a);
    ck_close(&sp);
    ck_close(&t);
    return st;
}

/* Read a string attribute (fixed or variable length) into a malloc'd,
 * NUL-terminated string. MC_ERR_NOTFOUND when absent. */
mc_status ck_read_str_attr(hid_t loc, const char *name, char **out, mc_error *err,
                           const char *where)
{
    hid_t a = -1, t = -1, mt = -1, sp = -1;
    mc_status st = MC_OK;
    *out = NULL;
    htri_t there = H5Aexists(loc, name);
    if (there < 0)
        return ck_h5fail(err, MC_ERR_FORMAT, "%s: cannot read attribute %s", where, name);
    if (!there) return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no attribute '%s'", where, name);
    if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (t = H5Aget_type(a)) < 0 ||
        (sp = H5Aget_space(a)) < 0) {
        st = ck_h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: cannot open it", where, name);
        goto done;
    }
    if (H5Tget_class(t) != H5T_STRING || H5Sget_simple_extent_npoints(sp) != 1) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: attribute %s: not a single string", where, name);
        goto done;
    }
    if (H5Tis_variable_str(t) > 0) {
        char *v = NULL;
        mt = H5Tcopy(H5T_C_S1);
        /* HDF5 converts no ASCII <-> UTF-8: read in the stored encoding. */
        if (mt < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 || H5Tset_cset(mt, H5Tget_cset(t)) < 0 ||
            H5Aread(a, mt, &v) < 0) {
            st = ck_h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: read failed", where, name);
            goto done;
        }
        *out = strdup(v ? v : "");
        H5free_memory(v);
    } else {
        size_t n = H5Tget_size(t);
        char *v = calloc(n + 1, 1);
        if (!v) {
            st = mc_error_set(err, MC_ERR_NOMEM, "%s: attribute %s: out of memory", where, name);
            goto done;
        }
        if (H5Aread(a, t, v) < 0) {
            free(v);
            st = ck_h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: read failed", where, name);
            goto done;
        }
        *out = v;
    }
    if (!*out) st = mc_error_set(err, MC_ERR_NOMEM, "%s: attribute %s: out of memory", where, name);
done:
    ck_close(&mt);
    ck_close(&sp);
    ck_close(&t);
    ck_close(&a);
    return st;
}

mc_status ck_write_int_attr(hid_t loc, const char *name, int64_t v, mc_error *err,
                            const char *where)
{
    hid_t sp = H5Screate(H5S_SCALAR), a = -1;
    mc_status st = MC_OK;
    if (H5Aexists(loc, name) > 0 && H5Adelete(loc, name) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: attribute %s: cannot replace it", where, name);
    else if (sp < 0 ||
             (a = H5Acreate2(loc, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
             H5Awrite(a, H5T_NATIVE_INT64, &v) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: attribute %s: write failed", where, name);
    ck_close(&a);
    ck_close(&sp);
    return st;
}

mc_status ck_read_int_attr(hid_t loc, const char *name, int64_t *v, mc_error *err,
                           const char *where)
{
    hid_t a = -1, t = -1, sp = -1;
    mc_status st = MC_OK;
    htri_t there = H5Aexists(loc, name);
    if (there < 0)
        return ck_h5fail(err, MC_ERR_FORMAT, "%s: cannot read attribute %s", where, name);
    if (!there) return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no attribute '%s'", where, name);
    if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (t = H5Aget_type(a)) < 0 ||
        (sp = H5Aget_space(a)) < 0)
        st = ck_h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: cannot open it", where, name);
    else if (H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_npoints(sp) != 1)
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: attribute %s: not a single integer", where,
                          name);
    else if (H5Aread(a, H5T_NATIVE_INT64, v) < 0)
        st = ck_h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: read failed", where, name);
    ck_close(&sp);
    ck_close(&t);
    ck_close(&a);
    return st;
}

hid_t ck_file_type(mc_ckpt_dtype d)
{
    switch (d) {
    case MC_CKPT_FLOAT32: return H5Tcopy(H5T_IEEE_F32LE);
    case MC_CKPT_BFLOAT16: return H5Tcopy(H5T_STD_U16LE);
    case MC_CKPT_FLOAT16: return ck_half_type();
    default: return -1; /* quantized: ckpt_quant.c */
    }
}

hid_t ck_mem_type(mc_ckpt_dtype d)
{
    if (d == MC_CKPT_FLOAT32) return H5Tcopy(H5T_NATIVE_FLOAT);
    if (d == MC_CKPT_BFLOAT16) return H5Tcopy(H5T_NATIVE_UINT16);
    /* Same layout as the file type, so HDF5 copies the bits unconverted. */
    hid_t t = ck_half_type();
    if (t >= 0) H5Tset_order(t, H5Tget_order(H5T_NATIVE_FLOAT));
    return t;
}

size_t ck_dtype_size(mc_ckpt_dtype d) { return d == MC_CKPT_FLOAT32 ? 4 : 2; }

void ck_convert(mc_ckpt_dtype d, const float *in, size_t n, void *out)
{
    if (d == MC_CKPT_FLOAT32) {
        memcpy(out, in, n * sizeof *in);
        return;
    }
    uint16_t *h = out;
    for (size_t i = 0; i < n; i++)
        h[i] = d == MC_CKPT_BFLOAT16 ? mc_dtype_f32_to_bf16(in[i]) : mc_dtype_f32_to_f16(in[i]);
}

/* ------------------------------------------------------------ datasets */

mc_status ck_write_header(hid_t fid, int64_t iteration, mc_error *err, const char *where)
{
    mc_status st;
    if ((st = ck_write_str_attr(fid, "mc_format", CK_FORMAT_NAME, err, where)) != MC_OK ||
        (st = ck_write_int_attr(fid, "mc_format_version", MC_CKPT_FORMAT_VERSION, err, where)) !=
            MC_OK ||
        (st = ck_write_str_attr(fid, "mc_version", PACKAGE_VERSION, err, where)) != MC_OK ||
        (st = ck_write_int_attr(fid, "iteration", iteration, err, where)) != MC_OK)
        return st;
    return MC_OK;
}

/* Dataset creation properties: chunks of ~CK_CHUNK_TARGET bytes (whole rows
 * when a row fits), then zstd when asked, then Fletcher-32 over the stored
 * bytes (checked before anything is decompressed). */
hid_t ck_tensor_dcpl(mc_ckpt_compression comp, int level, int nd, const hsize_t *dims, size_t esize)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2];
    hsize_t target = CK_CHUNK_TARGET / esize;
    /* Split the (row) extent into k equal chunks of at most `target`
     * elements rather than cutting target-sized ones: HDF5 stores an edge
     * chunk whole, and a mostly empty last chunk would waste its size. */
    if (nd == 1) {
        hsize_t k = (dims[0] + target - 1) / target;
        chunk[0] = (dims[0] + k - 1) / k;
    } else if (dims[1] <= target) {
        hsize_t per = target / dims[1], k = (dims[0] + per - 1) / per;
        chunk[0] = (dims[0] + k - 1) / k;
        chunk[1] = dims[1];
    } else {
        hsize_t k = (dims[1] + target - 1) / target;
        chunk[0] = 1;
        chunk[1] = (dims[1] + k - 1) / k;
    }
    if (dcpl < 0 || H5Pset_chunk(dcpl, nd, chunk) < 0) goto fail;
    if (comp == MC_CKPT_COMPRESS_ZSTD) {
        unsigned cd = (unsigned)(int32_t)level;
        if (H5Pset_filter(dcpl, MC_H5Z_FILTER_ZSTD, H5Z_FLAG_MANDATORY, level ? 1 : 0, &cd) < 0)
            goto fail;
    }
    if (H5Pset_fletcher32(dcpl) < 0) goto fail;
    return dcpl;
fail:
    ck_close(&dcpl);
    return -1;
}

mc_status ck_create_tensor(hid_t fid, const char *where, const char *path, int64_t rows,
                           int64_t cols, mc_ckpt_dtype dtype, mc_ckpt_compression comp, int level,
                           mc_error *err)
{
    int nd = cols == 0 ? 1 : 2;
    hsize_t dims[2] = {(hsize_t)rows, (hsize_t)(cols ? cols : 1)};
    hid_t ft = ck_file_type(dtype), sp = H5Screate_simple(nd, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = -1, ds = -1;
    mc_status st = MC_OK;
    if (ft < 0 || sp < 0 || lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        (dcpl = ck_tensor_dcpl(comp, level, nd, dims, H5Tget_size(ft))) < 0)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: %s: cannot set up the dataset", where, path);
    else if ((ds = H5Dcreate2(fid, path, ft, sp, lcpl, dcpl, H5P_DEFAULT)) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: %s: cannot create the dataset", where, path);
    else
        st = ck_write_str_attr(ds, "dtype", mc_ckpt_dtype_name(dtype), err, where);
    ck_close(&ds);
    ck_close(&dcpl);
    ck_close(&lcpl);
    ck_close(&sp);
    ck_close(&ft);
    return st;
}

hid_t ck_bytes_dcpl(size_t n)
{
    hsize_t chunk[1] = {n < CK_CHUNK_TARGET ? n : CK_CHUNK_TARGET};
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl >= 0 && (H5Pset_chunk(dcpl, 1, chunk) < 0 || H5Pset_fletcher32(dcpl) < 0))
        ck_close(&dcpl);
    return dcpl;
}

mc_status ck_write_bytes(hid_t fid, const char *file, const char *key, const void *data, size_t n,
                         mc_error *err)
{
    hsize_t dims[1] = {n};
    hid_t sp = H5Screate_simple(1, dims, NULL), dcpl = -1, ds = -1;
    mc_status st = MC_OK;
    if (H5Lexists(fid, key, H5P_DEFAULT) > 0) {
        st = mc_error_set(err, MC_ERR_USAGE, "%s: %s: name already used in the file", file, key);
        goto done;
    }
    /* An empty dataset cannot be chunked; there is nothing to checksum. */
    dcpl = n > 0 ? ck_bytes_dcpl(n) : H5Pcreate(H5P_DATASET_CREATE);
    if (sp < 0 || dcpl < 0 ||
        (ds = H5Dcreate2(fid, key, H5T_STD_U8LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT)) < 0 ||
        (n > 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        st = ck_h5fail(err, MC_ERR_IO, "%s: %s: write failed", file, key);
done:
    ck_close(&ds);
    ck_close(&dcpl);
    ck_close(&sp);
    return st;
}
