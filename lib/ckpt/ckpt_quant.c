/*
 * ckpt_quant.c - writing quantized tensors in checkpoints: quantizing a
 * global tensor (quant.c, mc/quant.h) and storing a local part of it (the
 * whole tensor in model.h5, a rank's block in a shard file) with its
 * scales. Loaders read any block back dequantized to fp32, all they ever
 * see, through ckpt_block.c. Layout: mc-formats(5), "Quantized tensors".
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "mc/quant.h"

void ck_qtensor_free(ck_qtensor *q)
{
    free(q->q);
    free(q->scale);
    q->q = NULL;
    q->scale = NULL;
}

mc_status ck_quantize(const char *where, const float *x, int64_t rows, int64_t cols,
                      mc_ckpt_dtype dtype, int64_t group_size, ck_qtensor *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (cols < 1)
        return mc_error_set(err, MC_ERR_USAGE, "%s: only 2-D tensors are quantized", where);
    out->dtype = dtype;
    out->rows = rows;
    out->cols = cols;
    out->group_size = dtype == MC_CKPT_INT4 ? group_size : 0;
    out->ngroups = dtype == MC_CKPT_INT4 ? mc_quant_int4_groups(cols, group_size) : 1;
    size_t nscale = dtype == MC_CKPT_INT8       ? (size_t)rows
                    : dtype == MC_CKPT_FP8_E4M3 ? 1
                                                : (size_t)(rows * out->ngroups);
    out->q = malloc((size_t)(rows * cols));
    out->scale = malloc(nscale * sizeof *out->scale);
    if (!out->q || !out->scale) {
        ck_qtensor_free(out);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
    }
    int64_t bad;
    if (dtype == MC_CKPT_INT8)
        bad = mc_quant_int8(x, rows, cols, out->q, out->scale);
    else if (dtype == MC_CKPT_FP8_E4M3)
        bad = mc_quant_fp8(x, rows * cols, (uint8_t *)out->q, out->scale);
    else
        bad = mc_quant_int4(x, rows, cols, group_size, out->q, out->scale);
    if (bad >= 0) {
        ck_qtensor_free(out);
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: element [%" PRId64 ", %" PRId64
                            "] is %g; only finite values can be quantized",
                            where, bad / cols, bad % cols, (double)x[bad]);
    }
    return MC_OK;
}

/* Create and write one dataset (chunked, Fletcher-32, as the tensors). */
static mc_status put_dataset(hid_t fid, const char *where, const char *path, hid_t ftype,
                             hid_t mtype, int nd, const hsize_t *dims, size_t esize,
                             const void *data, mc_ckpt_compression comp, int level, hid_t *ds_out,
                             mc_error *err)
{
    hid_t sp = H5Screate_simple(nd, dims, NULL), lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = -1,
          ds = -1;
    mc_status st = MC_OK;
    if (sp < 0 || lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        (dcpl = ck_tensor_dcpl(comp, level, nd, dims, esize)) < 0)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: %s: cannot set up the dataset", where, path);
    else if ((ds = H5Dcreate2(fid, path, ftype, sp, lcpl, dcpl, H5P_DEFAULT)) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: %s: cannot create the dataset", where, path);
    else if (H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: %s: write failed", where, path);
    ck_close(&dcpl);
    ck_close(&lcpl);
    ck_close(&sp);
    if (st != MC_OK || !ds_out)
        ck_close(&ds);
    else
        *ds_out = ds;
    return st;
}

/* Store the rows rg[] and columns [col0, col0 + ncols) of qt at path, with
 * their scales. An int4 part keeps the global groups: its first column sits
 * group_offset = col0 mod group_size into its first group (0 in one-file
 * checkpoints). */
mc_status ck_write_quant_local(hid_t fid, const char *where, const char *path, const ck_qtensor *qt,
                               const ck_range *rg, int nrg, int64_t col0, int64_t ncols,
                               mc_ckpt_compression comp, int level, mc_error *err)
{
    int64_t lrows = 0, gs = qt->group_size;
    for (int i = 0; i < nrg; i++) lrows += rg[i].rows;
    int int4 = qt->dtype == MC_CKPT_INT4;
    int64_t g0 = int4 ? col0 / gs : 0, g1 = int4 ? (col0 + ncols - 1) / gs : 0, ngl = g1 - g0 + 1;
    int64_t bcols = int4 ? (ncols + 1) / 2 : ncols;
    int64_t nscale = qt->dtype == MC_CKPT_INT8       ? lrows
                     : qt->dtype == MC_CKPT_FP8_E4M3 ? 1
                                                     : lrows * ngl;
    int8_t *q = malloc((size_t)(lrows * ncols));
    uint8_t *packed = int4 ? malloc((size_t)(lrows * bcols)) : NULL;
    float *sc = malloc((size_t)nscale * sizeof *sc);
    char *spath = mc_strprintf(CK_SCALES_GROUP "/%s", path);
    mc_status st = MC_OK;
    hid_t ds = -1;
    if (!q || !sc || !spath || (int4 && !packed)) {
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", where, path);
        goto done;
    }
    int64_t lr = 0;
    for (int i = 0; i < nrg; i++)
        for (int64_t r = rg[i].row0; r < rg[i].row0 + rg[i].rows; r++, lr++) {
            memcpy(q + lr * ncols, qt->q + r * qt->cols + col0, (size_t)ncols);
            if (qt->dtype == MC_CKPT_INT8)
                sc[lr] = qt->scale[r];
            else if (int4)
                memcpy(sc + lr * ngl, qt->scale + r * qt->ngroups + g0, (size_t)ngl * sizeof *sc);
        }
    if (qt->dtype == MC_CKPT_FP8_E4M3) sc[0] = qt->scale[0];
    if (int4) mc_int4_pack(q, lrows, ncols, packed);
    hsize_t dims[2] = {(hsize_t)lrows, (hsize_t)bcols};
    hid_t ftype = qt->dtype == MC_CKPT_INT8 ? H5T_STD_I8LE : H5T_STD_U8LE;
    hid_t mtype = qt->dtype == MC_CKPT_INT8 ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8;
    if ((st = put_dataset(fid, where, path, ftype, mtype, 2, dims, 1,
                          int4 ? (void *)packed : (void *)q, comp, level, &ds, err)) != MC_OK)
        goto done;
    if ((st = ck_write_str_attr(ds, "dtype", mc_ckpt_dtype_name(qt->dtype), err, where)) != MC_OK ||
        (st = ck_write_str_attr(ds, "scales", spath, err, where)) != MC_OK)
        goto done;
    if (int4 && ((st = ck_write_int_attr(ds, "cols", ncols, err, where)) != MC_OK ||
                 (st = ck_write_int_attr(ds, "group_size", gs, err, where)) != MC_OK ||
                 (st = ck_write_int_attr(ds, "group_offset", col0 - g0 * gs, err, where)) != MC_OK))
        goto done;
    hsize_t sdims[2] = {(hsize_t)(qt->dtype == MC_CKPT_FP8_E4M3 ? 1 : lrows), (hsize_t)ngl};
    st = put_dataset(fid, where, spath, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, int4 ? 2 : 1, sdims, 4,
                     sc, comp, level, NULL, err);
done:
    ck_close(&ds);
    free(q);
    free(packed);
    free(sc);
    free(spath);
    return st;
}
