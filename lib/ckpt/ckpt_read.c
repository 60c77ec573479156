/*
 * ckpt_read.c - the checkpoint reader, every public reading call of
 * mc/ckpt.h but the model's (ckpt_model.c): resolves a checkpoint directory
 * through its latest pointer, checks the file's format and iteration, and
 * reads attributes, byte datasets and blocks of global tensors (any block:
 * a rank of any grid reads its own slice) as fp32 through ckpt_block.c,
 * which converts and dequantizes. Many processes may read one file at
 * once: each opens it on its own (HDF5's default driver, read-only). A
 * sharded checkpoint (index.h5 and shard files) opens the same way; its
 * tensors are assembled from the shards by ckpt_shard.c's reader.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/h5zstd.h"
#include "mc/buf.h"
#include "mc/dtype.h"
#include "mc/file.h"
#include "mc/json.h"

struct mc_ckpt_reader {
    char *dir, *file;
    int64_t iteration;
    hid_t fid;              /* model.h5, or index.h5 of a sharded checkpoint */
    ck_shard_reader *shard; /* NULL: one file */
    ck_manifest *manifest;  /* the directory's checksums (NULL: none, or not verifying) */
};

int64_t mc_ckpt_iteration(const mc_ckpt_reader *r) { return r->iteration; }
const char *mc_ckpt_dir(const mc_ckpt_reader *r) { return r->dir; }
const char *mc_ckpt_file(const mc_ckpt_reader *r) { return r->file; }

void mc_ckpt_prefer_shard(mc_ckpt_reader *r, int tp_rank, int pp_rank)
{
    if (r->shard) ck_shard_reader_prefer(r->shard, tp_rank, pp_rank);
}

void mc_ckpt_shards(const mc_ckpt_reader *r, int *tp, int *pp)
{
    *tp = *pp = 0;
    if (r->shard) ck_shard_reader_grid(r->shard, tp, pp);
}

void mc_ckpt_close(mc_ckpt_reader *r)
{
    if (!r) return;
    ck_quiet q;
    ck_quiet_on(&q);
    ck_shard_reader_close(r->shard);
    ck_close(&r->fid);
    ck_quiet_off(&q);
    ck_manifest_free(r->manifest);
    free(r->dir);
    free(r->file);
    free(r);
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* DIR/latest_checkpointed_iteration.txt -> the iteration it names. */
static mc_status read_latest(const char *latest, int64_t *it, mc_error *err)
{
    char *data;
    size_t len;
    mc_status st = mc_read_file(latest, &data, &len, err);
    if (st != MC_OK) return st;
    char *s = data, *e;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    int ok = e != s && *s != '-' && *s != '+' && errno == 0;
    while (ok && (*e == ' ' || *e == '\t' || *e == '\n' || *e == '\r')) e++;
    if (!ok || *e) {
        if (strncmp(s, "release", 7) == 0)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: 'release' checkpoints (Megatron) are not supported", latest);
        else
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: not an iteration number", latest);
    } else {
        *it = v;
    }
    free(data);
    return st;
}

static mc_status reader_open(const char *path, mc_ckpt_reader *r, mc_error *err)
{
    mc_status st;
    int64_t named = -1;
    if (is_file(path)) {
        const char *slash = strrchr(path, '/');
        r->file = strdup(path);
        r->dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    } else if (is_dir(path)) {
        char *f = mc_strprintf("%s/" MC_CKPT_FILE, path);
        char *latest = mc_strprintf("%s/" MC_CKPT_LATEST, path);
        if (!f || !latest) {
            free(f);
            free(latest);
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
        }
        char *ix = NULL;
        if (!is_file(f) && (ix = mc_strprintf("%s/" CK_INDEX_FILE, path)) && is_file(ix)) {
            free(f);
            f = ix; /* a sharded checkpoint */
            ix = NULL;
        }
        free(ix);
        if (is_file(f)) {
            r->file = f;
            r->dir = strdup(path);
            free(latest);
        } else if (is_file(latest)) {
            free(f);
            st = read_latest(latest, &named, err);
            free(latest);
            if (st != MC_OK) return st;
            r->dir = mc_strprintf("%s/iter_%07" PRId64, path, named);
            r->file = r->dir ? mc_strprintf("%s/" MC_CKPT_FILE, r->dir) : NULL;
            if (r->file && !is_file(r->file)) {
                char *ix = mc_strprintf("%s/" CK_INDEX_FILE, r->dir);
                if (ix && is_file(ix)) {
                    free(r->file);
                    r->file = ix;
                } else {
                    free(ix);
                }
            }
            if (r->file && !is_file(r->file))
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s/" MC_CKPT_LATEST ": names iteration %" PRId64
                                    " but %s does not exist",
                                    path, named, r->file);
        } else {
            free(f);
            free(latest);
            return mc_error_set(err, MC_ERR_NOTFOUND,
                                "%s: not a checkpoint: no " MC_CKPT_LATEST ", " MC_CKPT_FILE
                                " or " CK_INDEX_FILE,
                                path);
        }
    } else {
        return mc_error_errno(err, MC_ERR_NOTFOUND, errno, "%s: cannot open checkpoint", path);
    }
    if (!r->dir || !r->file) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    /* HDF5 does not defend itself against a damaged file (a few changed
     * bytes can crash it): the manifest's checksum first. */
    if (mc_ckpt_verify() && ((st = ck_manifest_load(r->dir, &r->manifest, err)) != MC_OK ||
                             (st = ck_manifest_check(r->manifest, r->file, err)) != MC_OK))
        return st;
    if ((st = mc_h5zstd_register(err)) != MC_OK) return st;
    if ((r->fid = H5Fopen(r->file, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0)
        return ck_h5fail(err, MC_ERR_FORMAT, "%s: not a readable HDF5 file", r->file);
    char *fmt = NULL;
    if ((st = ck_read_str_attr(r->fid, "mc_format", &fmt, err, r->file)) != MC_OK) return st;
    int ok = strcmp(fmt, CK_FORMAT_NAME) == 0;
    free(fmt);
    if (!ok)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: attribute mc_format is not '" CK_FORMAT_NAME "'", r->file);
    int64_t version;
    if ((st = ck_read_int_attr(r->fid, "mc_format_version", &version, err, r->file)) != MC_OK ||
        (st = ck_read_int_attr(r->fid, "iteration", &r->iteration, err, r->file)) != MC_OK)
        return st;
    if (version < 1 || version > MC_CKPT_FORMAT_VERSION)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: format version %" PRId64 ", this mc reads up to %d", r->file,
                            version, MC_CKPT_FORMAT_VERSION);
    if (named >= 0 && named != r->iteration)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: holds iteration %" PRId64 ", the directory says %" PRId64, r->file,
                            r->iteration, named);
    /* "layout": absent in one-file checkpoints, "sharded" in index.h5,
     * "shard" in a shard file (a part, not a checkpoint). */
    char *layout = NULL;
    st = ck_read_str_attr(r->fid, "layout", &layout, err, r->file);
    if (st == MC_ERR_NOTFOUND) {
        mc_error_clear(err);
        return MC_OK;
    }
    if (st != MC_OK) return st;
    if (strcmp(layout, "sharded") == 0) {
        free(layout);
        return ck_shard_reader_open(r->fid, r->file, r->dir, r->manifest, &r->shard, err);
    }
    st = strcmp(layout, "shard") == 0
             ? mc_error_set(err, MC_ERR_FORMAT,
                            "%s: one shard of a sharded checkpoint; open its directory", r->file)
             : mc_error_set(err, MC_ERR_FORMAT, "%s: unknown layout '%s'", r->file, layout);
    free(layout);
    return st;
}

mc_status mc_ckpt_open(const char *path, mc_ckpt_reader **out, mc_error *err)
{
    *out = NULL;
    if (!path || !*path) return mc_error_set(err, MC_ERR_USAGE, "checkpoint: empty path");
    mc_ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    r->fid = -1;
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = reader_open(path, r, err);
    ck_quiet_off(&q);
    if (st != MC_OK)
        mc_ckpt_close(r);
    else
        *out = r;
    return st;
}

mc_status mc_ckpt_read_json(mc_ckpt_reader *r, const char *key, json_t **out, mc_error *err)
{
    *out = NULL;
    if (!ck_valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name", r->file);
    char *s = NULL, where[512];
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = ck_read_str_attr(r->fid, key, &s, err, r->file);
    ck_quiet_off(&q);
    if (st != MC_OK) return st;
    snprintf(where, sizeof where, "%s: attribute %s", r->file, key);
    st = mc_json_load_buf(where, s, strlen(s), out, err);
    free(s);
    return st;
}

mc_status mc_ckpt_read_int(mc_ckpt_reader *r, const char *key, int64_t *out, mc_error *err)
{
    if (!ck_valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name", r->file);
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = ck_read_int_attr(r->fid, key, out, err, r->file);
    ck_quiet_off(&q);
    return st;
}

static mc_status read_bytes(mc_ckpt_reader *r, const char *key, void **data, size_t *n,
                            mc_error *err)
{
    int there = ck_exists(r->fid, key);
    if (there < 0) return ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", r->file, key);
    if (!there) return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no dataset '%s'", r->file, key);
    hid_t ds = H5Dopen2(r->fid, key, H5P_DEFAULT), sp = -1, t = -1;
    mc_status st = MC_OK;
    if (ds < 0 || (sp = H5Dget_space(ds)) < 0 || (t = H5Dget_type(ds)) < 0) {
        st = ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot open the dataset", r->file, key);
    } else if (H5Sget_simple_extent_ndims(sp) != 1 || H5Tget_class(t) != H5T_INTEGER ||
               H5Tget_size(t) != 1) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: not a 1-D byte dataset", r->file, key);
    } else {
        hssize_t m = H5Sget_simple_extent_npoints(sp);
        void *p = malloc(m > 0 ? (size_t)m : 1);
        if (!p)
            st = mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", r->file, key);
        else if (m > 0 && H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, p) < 0) {
            free(p);
            st = ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: read failed", r->file, key);
        } else {
            *data = p;
            *n = (size_t)m;
        }
    }
    ck_close(&t);
    ck_close(&sp);
    ck_close(&ds);
    return st;
}

mc_status mc_ckpt_read_bytes(mc_ckpt_reader *r, const char *key, void **data, size_t *n,
                             mc_error *err)
{
    *data = NULL;
    *n = 0;
    if (!ck_valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid dataset name", r->file);
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = read_bytes(r, key, data, n, err);
    ck_quiet_off(&q);
    return st;
}

int mc_ckpt_has_tensor(mc_ckpt_reader *r, const char *path)
{
    if (r->shard) return ck_valid_path(path) && ck_shard_reader_has(r->shard, path);
    ck_quiet q;
    ck_quiet_on(&q);
    int e = ck_valid_path(path) && ck_exists(r->fid, path) > 0;
    H5Eclear2(H5E_DEFAULT);
    ck_quiet_off(&q);
    return e;
}

mc_status mc_ckpt_tensor_info(mc_ckpt_reader *r, const char *path, int64_t *rows, int64_t *cols,
                              mc_ckpt_dtype *dtype, mc_error *err)
{
    int64_t rr = 0, cc = 0;
    mc_ckpt_dtype dd = MC_CKPT_FLOAT32;
    hid_t ds = -1;
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = r->shard ? ck_shard_reader_info(r->shard, path, &rr, &cc, &dd, err)
                            : ck_open_tensor(r->fid, r->file, path, &ds, &rr, &cc, &dd, err);
    ck_close(&ds);
    ck_quiet_off(&q);
    if (st == MC_OK) {
        if (rows) *rows = rr;
        if (cols) *cols = cc;
        if (dtype) *dtype = dd;
    }
    return st;
}

static mc_status read_tensor(mc_ckpt_reader *r, const char *path, int64_t rows, int64_t cols,
                             int64_t row0, int64_t col0, int64_t lrows, int64_t lcols, float *out,
                             mc_error *err)
{
    char where[512];
    snprintf(where, sizeof where, "%s: %s", r->file, path ? path : "(null)");
    mc_status st = ck_check_block(where, rows, cols, row0, col0, lrows, lcols, err);
    if (st != MC_OK) return st;
    if (cols == 0) col0 = 0, lcols = 1;
    int64_t frows, fcols;
    mc_ckpt_dtype dtype;
    hid_t ds = -1;
    if (r->shard)
        st = ck_shard_reader_info(r->shard, path, &frows, &fcols, &dtype, err);
    else
        st = ck_open_tensor(r->fid, r->file, path, &ds, &frows, &fcols, &dtype, err);
    ck_close(&ds);
    if (st != MC_OK) return st;
    if (frows != rows || fcols != cols) {
        char a[64], b[64];
        ck_shape_str(a, sizeof a, frows, fcols);
        ck_shape_str(b, sizeof b, rows, cols);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: shape %s in the checkpoint, %s expected",
                            where, a, b);
    }
    if (r->shard) return ck_shard_reader_read(r->shard, path, row0, col0, lrows, lcols, out, err);
    return ck_read_block(r->fid, r->file, path, row0, col0, lrows, lcols, out, err);
}

mc_status mc_ckpt_read_tensor(mc_ckpt_reader *r, const char *path, int64_t rows, int64_t cols,
                              int64_t row0, int64_t col0, int64_t local_rows, int64_t local_cols,
                              float *host_out, mc_error *err)
{
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = read_tensor(r, path, rows, cols, row0, col0, local_rows, local_cols, host_out,
                               err);
    ck_quiet_off(&q);
    return st;
}

typedef struct list_ctx {
    mc_buf names; /* NUL-separated */
    size_t n;
    mc_error *err;
} list_ctx;

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *data)
{
    (void)info;
    list_ctx *c = data;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    int is_ds = o >= 0 && H5Iget_type(o) == H5I_DATASET;
    ck_close(&o);
    H5Eclear2(H5E_DEFAULT);
    if (!is_ds) return 0;
    if (mc_buf_append(&c->names, name, strlen(name) + 1, c->err) != MC_OK) return -1;
    c->n++;
    return 0;
}

static mc_status names_vector(mc_ckpt_reader *r, mc_buf *buf, size_t count, char ***names,
                              size_t *n, mc_error *err);

static mc_status list_group(mc_ckpt_reader *r, const char *group, char ***names, size_t *n,
                            mc_error *err)
{
    if (r->shard) {
        mc_buf b = MC_BUF_INIT;
        size_t k = 0;
        mc_status st = ck_shard_reader_list(r->shard, group, &b, &k, err);
        if (st != MC_OK) {
            mc_buf_free(&b);
            return st;
        }
        if (k == 0) {
            mc_buf_free(&b);
            return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no group '%s'", r->file, group);
        }
        return names_vector(r, &b, k, names, n, err);
    }
    int there = ck_exists(r->fid, group);
    if (there < 0)
        return ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", r->file, group);
    if (!there) return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no group '%s'", r->file, group);
    hid_t g = H5Gopen2(r->fid, group, H5P_DEFAULT);
    if (g < 0) return ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: not a group", r->file, group);
    list_ctx c = {MC_BUF_INIT, 0, err};
    hsize_t idx = 0;
    herr_t e = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_cb, &c);
    ck_close(&g);
    if (e < 0) {
        mc_buf_free(&c.names);
        return err && err->code
                   ? err->code
                   : ck_h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot list it", r->file, group);
    }
    return names_vector(r, &c.names, c.n, names, n, err);
}

/* The NUL-separated names in buf as one malloc'd block: the pointer
 * array, then the strings. Frees buf. */
static mc_status names_vector(mc_ckpt_reader *r, mc_buf *buf, size_t count, char ***names,
                              size_t *n, mc_error *err)
{
    list_ctx c = {*buf, count, err};
    /* One block: the pointer array, then the strings. */
    char **v = malloc((c.n + 1) * sizeof *v + c.names.len + 1);
    if (!v) {
        mc_buf_free(&c.names);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", r->file);
    }
    char *s = (char *)(v + c.n + 1);
    if (c.names.len) memcpy(s, c.names.data, c.names.len);
    for (size_t i = 0; i < c.n; i++) {
        v[i] = s;
        s += strlen(s) + 1;
    }
    v[c.n] = NULL;
    mc_buf_free(&c.names);
    *names = v;
    *n = c.n;
    return MC_OK;
}

mc_status mc_ckpt_list(mc_ckpt_reader *r, const char *group, char ***names, size_t *n,
                       mc_error *err)
{
    *names = NULL;
    *n = 0;
    if (!ck_valid_path(group))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid group name", r->file);
    mc_error_clear(err);
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = list_group(r, group, names, n, err);
    ck_quiet_off(&q);
    return st;
}
