/*
 * npy.c - numpy .npy files for the GPT dataset's cached indices.
 *
 * Written byte for byte as numpy.save writes them (format 1.0: "\x93NUMPY",
 * 1, 0, a little-endian uint16 header length, the dict repr
 * "{'descr': '<i4', 'fortran_order': False, 'shape': (N,), }" padded with
 * spaces and a newline so the data starts at a multiple of 64 bytes), so
 * Megatron reads mc's cache and mc reads Megatron's. Read back by mapping the
 * file; the header is parsed strictly and the data size checked against the
 * file size before anything is trusted.
 */
#include "gpt_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPY_ALIGN 64

static const char *type_descr(mc_npy_type t)
{
    switch (t) {
    case MC_NPY_I16: return "<i2";
    case MC_NPY_I32: return "<i4";
    case MC_NPY_U32: return "<u4";
    case MC_NPY_I64: return "<i8";
    }
    return "?";
}

size_t mc_npy_type_size(mc_npy_type t)
{
    switch (t) {
    case MC_NPY_I16: return 2;
    case MC_NPY_I32:
    case MC_NPY_U32: return 4;
    case MC_NPY_I64: return 8;
    }
    return 0;
}

int64_t mc_npy_get(const mc_npy *a, int64_t i)
{
    const unsigned char *p = a->data;
    switch (a->type) {
    case MC_NPY_I16: {
        int16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case MC_NPY_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case MC_NPY_U32: {
        uint32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case MC_NPY_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    }
    return 0;
}

mc_status mc_npy_save(const char *path, mc_npy_type t, int ndim, const int64_t *shape,
                      const void *data, mc_error *err)
{
    char dict[256], hdr[512];
    int64_t count = 1;
    if (ndim == 1) {
        snprintf(dict, sizeof dict,
                 "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ",), }",
                 type_descr(t), shape[0]);
        count = shape[0];
    } else {
        snprintf(dict, sizeof dict,
                 "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ", %" PRId64 "), }",
                 type_descr(t), shape[0], shape[1]);
        count = shape[0] * shape[1];
    }
    /* magic(6) + version(2) + hlen(2) + dict + pad + '\n' is a multiple of 64 */
    size_t dl = strlen(dict);
    size_t pad = NPY_ALIGN - ((10 + dl + 1) % NPY_ALIGN);
    if (pad == NPY_ALIGN) pad = 0;
    size_t hlen = dl + pad + 1;
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (char)(hlen & 0xff);
    hdr[9] = (char)(hlen >> 8);
    memcpy(hdr + 10, dict, dl);
    memset(hdr + 10 + dl, ' ', pad);
    hdr[10 + dl + pad] = '\n';

    mc_afile f;
    mc_status st = mc_afile_open(&f, path, err);
    if (st != MC_OK) return st;
    st = mc_afile_write(&f, hdr, 10 + hlen, err);
    if (st == MC_OK) st = mc_afile_write(&f, data, (size_t)count * mc_npy_type_size(t), err);
    if (st == MC_OK) st = mc_afile_commit(&f, err);
    mc_afile_abort(&f);
    return st;
}

/* Find 'key': in the header dict and return a pointer just after the colon
 * and blanks. */
static const char *dict_value(const char *h, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "'%s':", key);
    const char *p = strstr(h, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

mc_status mc_npy_load(const char *path, mc_npy *a, mc_error *err)
{
    memset(a, 0, sizeof *a);
    mc_status st = mc_map_file(path, &a->map, err);
    if (st != MC_OK) return st;
    const unsigned char *d = a->map.data;
    size_t len = a->map.len, hlen, start;
    if (len < 10 || memcmp(d, "\x93NUMPY", 6) != 0) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
        goto fail;
    }
    if (d[6] == 1) {
        hlen = (size_t)d[8] | (size_t)d[9] << 8;
        start = 10;
    } else if ((d[6] == 2 || d[6] == 3) && len >= 12) {
        hlen = (size_t)d[8] | (size_t)d[9] << 8 | (size_t)d[10] << 16 | (size_t)d[11] << 24;
        start = 12;
    } else {
        mc_error_set(err, MC_ERR_FORMAT, "%s: unsupported .npy version %u", path, d[6]);
        goto fail;
    }
    if (hlen > 65536 || start + hlen > len) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: .npy header runs past the end of the file", path);
        goto fail;
    }
    char h[65537];
    memcpy(h, d + start, hlen);
    h[hlen] = 0;
    const char *descr = dict_value(h, "descr"), *fo = dict_value(h, "fortran_order"),
               *shape = dict_value(h, "shape");
    if (!descr || !fo || !shape || *shape != '(') {
        mc_error_set(err, MC_ERR_FORMAT, "%s: .npy header lacks descr, fortran_order or shape",
                     path);
        goto fail;
    }
    static const struct {
        const char *s;
        mc_npy_type t;
    } types[] = {
        {"'<i2'", MC_NPY_I16}, {"'<i4'", MC_NPY_I32}, {"'<u4'", MC_NPY_U32}, {"'<i8'", MC_NPY_I64}};
    int found = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strncmp(descr, types[i].s, 5) == 0) {
            a->type = types[i].t;
            found = 1;
        }
    if (!found) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: unsupported .npy dtype %.8s", path, descr);
        goto fail;
    }
    if (strncmp(fo, "False", 5) != 0) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: Fortran-ordered .npy arrays are not supported", path);
        goto fail;
    }
    const char *p = shape + 1;
    a->ndim = 0;
    while (*p != ')') {
        char *end;
        while (*p == ' ') p++;
        if (*p == ')') break;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || a->ndim == 2) {
            mc_error_set(err, MC_ERR_FORMAT, "%s: bad or unsupported .npy shape", path);
            goto fail;
        }
        a->shape[a->ndim++] = v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
    }
    if (a->ndim == 0) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: .npy array is a scalar", path);
        goto fail;
    }
    uint64_t count = (uint64_t)a->shape[0] * (a->ndim == 2 ? (uint64_t)a->shape[1] : 1);
    if (len - start - hlen != count * mc_npy_type_size(a->type)) {
        mc_error_set(err, MC_ERR_FORMAT, "%s: .npy data is %zu bytes, the header says %" PRIu64,
                     path, len - start - hlen, count * mc_npy_type_size(a->type));
        goto fail;
    }
    a->data = d + start + hlen;
    return MC_OK;
fail:
    mc_unmap(&a->map);
    a->data = NULL;
    return err ? err->code : MC_ERR_FORMAT;
}

void mc_npy_free(mc_npy *a)
{
    if (!a) return;
    if (a->map.data) mc_unmap(&a->map);
    free(a->owned);
    memset(a, 0, sizeof *a);
}
