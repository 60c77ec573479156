/*
 * ckpt.c - checkpoints in HDF5: the all-or-nothing writer (temporary
 * directory, fsync, rename, latest pointer) and the reader that resolves a
 * checkpoint directory, checks shapes and reads blocks of global tensors.
 * The on-disk layout is documented in mc-formats(5), CHECKPOINTS.
 *
 * Integrity: the file is created with HDF5 1.10 format structures
 * (superblock v3, version 2 object headers, fixed-array chunk indexes), all
 * of which carry checksums, and every non-empty dataset is chunked with the
 * Fletcher-32 filter, so a truncated file or corrupt bytes make HDF5 fail
 * (and us report it) instead of yielding wrong numbers.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt/h5zstd.h"
#include "mc/buf.h"
#include "mc/ckpt.h"
#include "mc/file.h"
#include "mc/json.h"

#define FORMAT_NAME "mc-checkpoint"
/* Chunks of about this many stored bytes: large enough for zstd to find
 * its matches, small enough that a partial read stays cheap. */
#define CHUNK_TARGET (2u << 20)

/* ------------------------------------------------------------ HDF5 errors */

/* HDF5's automatic error printing, switched off for the duration of one of
 * our calls and restored afterwards, so the caller's setting stands. */
typedef struct quiet {
    H5E_auto2_t func;
    void *data;
} quiet;

static void quiet_on(quiet *q) {
    H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void quiet_off(const quiet *q) {
    H5Eset_auto2(H5E_DEFAULT, q->func, q->data);
}

static herr_t innermost_cb(unsigned n, const H5E_error2_t *e, void *data) {
    (void)n;
    char *out = data;
    if (e->desc && e->desc[0])
        snprintf(out, 256, "%s", e->desc);
    return 0;
}

/* Set err to "<message>: <HDF5's innermost description>" and clear HDF5's
 * error stack. */
__attribute__((format(printf, 3, 4))) static mc_status h5fail(mc_error *err, mc_status code,
                                                              const char *fmt, ...) {
    char msg[MC_ERROR_MSG_MAX], inner[256] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, innermost_cb, inner);
    H5Eclear2(H5E_DEFAULT);
    if (inner[0])
        return mc_error_set(err, code, "%s: %s", msg, inner);
    return mc_error_set(err, code, "%s", msg);
}

static void close_id(hid_t *id) {
    if (*id >= 0)
        H5Idec_ref(*id);
    *id = -1;
}

/* ------------------------------------------------------------ dtypes */

const char *mc_ckpt_dtype_name(mc_ckpt_dtype d) {
    switch (d) {
    case MC_CKPT_FLOAT32: return "float32";
    case MC_CKPT_BFLOAT16: return "bfloat16";
    case MC_CKPT_FLOAT16: return "float16";
    }
    return NULL;
}

mc_status mc_ckpt_dtype_parse(const char *s, mc_ckpt_dtype *out, mc_error *err) {
    for (int d = MC_CKPT_FLOAT32; d <= MC_CKPT_FLOAT16; d++)
        if (s && strcmp(s, mc_ckpt_dtype_name((mc_ckpt_dtype)d)) == 0) {
            *out = (mc_ckpt_dtype)d;
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_USAGE, "unknown checkpoint dtype '%s' (float32, bfloat16, float16)",
                        s ? s : "");
}

mc_status mc_ckpt_compression_parse(const char *s, mc_ckpt_compression *out, mc_error *err) {
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
static hid_t half_type(void) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0)
        return -1;
    if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* bf16 = the top 16 bits of the fp32 pattern, rounded to nearest even:
 * adding 0x7fff plus the lowest kept bit carries into the kept half exactly
 * when the dropped half is above one half, or equal with an odd kept half.
 * NaNs stay (quiet) NaNs instead of rounding into infinities. */
static uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> binary16, round to nearest even.
 *   normal half:    exponent rebias 127 -> 15, keep 10 of 23 mantissa bits,
 *                   round on the 13 dropped bits (a carry may reach inf);
 *   subnormal half: value = q * 2^-24 with q = round(|x| * 2^24).  */
static uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, NaN (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14 */
        int e = (int)(a >> 23);
        if (e < 102) /* below 2^-25: rounds to zero */
            return (uint16_t)sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u; /* |x| = m * 2^(e-150) */
        int shift = 126 - e;                      /* q = m * 2^(e-126) */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/* ------------------------------------------------------------ shapes */

static void shape_str(char *out, size_t cap, int64_t rows, int64_t cols) {
    if (cols == 0)
        snprintf(out, cap, "[%" PRId64 "]", rows);
    else
        snprintf(out, cap, "[%" PRId64 ", %" PRId64 "]", rows, cols);
}

/* Check a block against a global shape; where = "FILE: PATH". */
static mc_status check_block(const char *where, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                             int64_t lrows, int64_t lcols, mc_error *err) {
    if (rows < 1 || cols < 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid shape [%" PRId64 ", %" PRId64 "]", where,
                            rows, cols);
    if (cols == 0) {
        col0 = 0;
        lcols = 1;
        cols = 1;
    }
    if (row0 < 0 || lrows < 0 || row0 > rows - lrows || col0 < 0 || lcols < 0 || col0 > cols - lcols)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: block rows [%" PRId64 ", %" PRId64 ") x cols [%" PRId64 ", %" PRId64
                            ") is outside the tensor",
                            where, row0, row0 + lrows, col0, col0 + lcols);
    return MC_OK;
}

/* File and memory dataspaces for a block (cols == 0: 1-D). */
static mc_status block_spaces(hid_t fspace, int64_t cols, int64_t row0, int64_t col0, int64_t lrows,
                              int64_t lcols, hid_t *mspace) {
    int nd = cols == 0 ? 1 : 2;
    hsize_t start[2] = {(hsize_t)row0, (hsize_t)(nd == 2 ? col0 : 0)};
    hsize_t count[2] = {(hsize_t)lrows, (hsize_t)(nd == 2 ? lcols : 1)};
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0)
        return MC_ERR_INTERNAL;
    *mspace = H5Screate_simple(nd, count, NULL);
    return *mspace < 0 ? MC_ERR_INTERNAL : MC_OK;
}

/* A tensor path: non-empty, relative, no empty component. */
static int valid_path(const char *p) {
    if (!p || !*p || p[0] == '/' || p[strlen(p) - 1] == '/' || strstr(p, "//"))
        return 0;
    return 1;
}

/* A root key: a plain name. */
static int valid_key(const char *k) {
    return k && *k && !strchr(k, '/');
}

/* ------------------------------------------------------------ attributes */

static mc_status write_str_attr(hid_t loc, const char *name, const char *s, mc_error *err,
                                const char *where) {
    size_t len = strlen(s);
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = -1;
    mc_status st = MC_OK;
    if (t < 0 || sp < 0 || H5Tset_size(t, len ? len : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0)
        st = h5fail(err, MC_ERR_INTERNAL, "%s: attribute %s: cannot make its type", where, name);
    else if (H5Aexists(loc, name) > 0 && H5Adelete(loc, name) < 0)
        st = h5fail(err, MC_ERR_IO, "%s: attribute %s: cannot replace it", where, name);
    else if ((a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
             H5Awrite(a, t, len ? s : "") < 0)
        st = h5fail(err, MC_ERR_IO, "%s: attribute %s: write failed", where, name);
    close_id(&a);
    close_id(&sp);
    close_id(&t);
    return st;
}

/* Read a string attribute (fixed or variable length) into a malloc'd,
 * NUL-terminated string. MC_ERR_NOTFOUND when absent. */
static mc_status read_str_attr(hid_t loc, const char *name, char **out, mc_error *err, const char *where) {
    hid_t a = -1, t = -1, mt = -1, sp = -1;
    mc_status st = MC_OK;
    *out = NULL;
    htri_t there = H5Aexists(loc, name);
    if (there < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: cannot read attribute %s", where, name);
    if (!there)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no attribute '%s'", where, name);
    if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (t = H5Aget_type(a)) < 0 ||
        (sp = H5Aget_space(a)) < 0) {
        st = h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: cannot open it", where, name);
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
            st = h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: read failed", where, name);
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
            st = h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: read failed", where, name);
            goto done;
        }
        *out = v;
    }
    if (!*out)
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: attribute %s: out of memory", where, name);
done:
    close_id(&mt);
    close_id(&sp);
    close_id(&t);
    close_id(&a);
    return st;
}

static mc_status write_int_attr(hid_t loc, const char *name, int64_t v, mc_error *err, const char *where) {
    hid_t sp = H5Screate(H5S_SCALAR), a = -1;
    mc_status st = MC_OK;
    if (H5Aexists(loc, name) > 0 && H5Adelete(loc, name) < 0)
        st = h5fail(err, MC_ERR_IO, "%s: attribute %s: cannot replace it", where, name);
    else if (sp < 0 || (a = H5Acreate2(loc, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
             H5Awrite(a, H5T_NATIVE_INT64, &v) < 0)
        st = h5fail(err, MC_ERR_IO, "%s: attribute %s: write failed", where, name);
    close_id(&a);
    close_id(&sp);
    return st;
}

static mc_status read_int_attr(hid_t loc, const char *name, int64_t *v, mc_error *err, const char *where) {
    hid_t a = -1, t = -1, sp = -1;
    mc_status st = MC_OK;
    htri_t there = H5Aexists(loc, name);
    if (there < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: cannot read attribute %s", where, name);
    if (!there)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no attribute '%s'", where, name);
    if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (t = H5Aget_type(a)) < 0 || (sp = H5Aget_space(a)) < 0)
        st = h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: cannot open it", where, name);
    else if (H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_npoints(sp) != 1)
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: attribute %s: not a single integer", where, name);
    else if (H5Aread(a, H5T_NATIVE_INT64, v) < 0)
        st = h5fail(err, MC_ERR_FORMAT, "%s: attribute %s: read failed", where, name);
    close_id(&sp);
    close_id(&t);
    close_id(&a);
    return st;
}

/* ------------------------------------------------------------ directories */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) != 0 ? -1 : 0;
}

/* Remove a directory tree this module made or is replacing. */
static int rm_tree(const char *path) {
    return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static mc_status fsync_path(const char *path, mc_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open to fsync", path);
    /* Some file systems cannot fsync a directory; that is not a failure of ours. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS && errno != ENOTSUP) {
        int e = errno;
        close(fd);
        return mc_error_errno(err, MC_ERR_IO, e, "%s: fsync failed", path);
    }
    close(fd);
    return MC_OK;
}

/* mkdtemp, but with the mode the final directory should have (0777 less
 * the umask) rather than 0700: the directory is renamed, not copied. */
static int make_tmpdir(char *tmpl) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char *x = tmpl + strlen(tmpl) - 6;
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
            return -1;
        for (int i = 0; i < 6; i++)
            x[i] = abc[r[i] % (sizeof abc - 1)];
        if (mkdir(tmpl, 0777) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
    }
    return -1;
}

static mc_status mkdir_p(const char *dir, mc_error *err) {
    char *p = strdup(dir);
    if (!p)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create directory '%s'", dir, p);
                free(p);
                return MC_ERR_IO;
            }
            *s = c;
            if (!c)
                break;
        }
    }
    free(p);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mc_error_set(err, MC_ERR_IO, "%s: not a directory", dir);
    return MC_OK;
}

/* ------------------------------------------------------------ writer */

typedef struct wtensor {
    char *path;
    int64_t rows, cols;
    mc_ckpt_dtype dtype;
    int64_t written; /* elements written so far */
} wtensor;

struct mc_ckpt_writer {
    char *dir, *final, *final_file, *tmp, *tmp_file;
    int64_t iteration;
    hid_t fid;
    mc_ckpt_compression comp;
    int level;
    wtensor *t;
    size_t nt, ct;
};

const char *mc_ckpt_writer_dir(const mc_ckpt_writer *w) {
    return w->final;
}

static void writer_free(mc_ckpt_writer *w) {
    close_id(&w->fid);
    for (size_t i = 0; i < w->nt; i++)
        free(w->t[i].path);
    free(w->t);
    free(w->dir);
    free(w->final);
    free(w->final_file);
    free(w->tmp);
    free(w->tmp_file);
    free(w);
}

static void writer_discard(mc_ckpt_writer *w) {
    close_id(&w->fid);
    if (w->tmp)
        rm_tree(w->tmp);
    writer_free(w);
}

static mc_status writer_begin(const char *dir, int64_t iteration, mc_ckpt_writer **out, mc_error *err) {
    mc_ckpt_writer *w = calloc(1, sizeof *w);
    mc_status st;
    hid_t fapl = -1;
    if (!w)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    w->fid = -1;
    w->iteration = iteration;
    w->dir = strdup(dir);
    w->final = str_printf("%s/iter_%07" PRId64, dir, iteration);
    w->final_file = str_printf("%s/" MC_CKPT_FILE, w->final ? w->final : "");
    w->tmp = str_printf("%s/.iter_%07" PRId64 ".tmp.XXXXXX", dir, iteration);
    if (!w->dir || !w->final || !w->final_file || !w->tmp) {
        writer_free(w);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    }
    if ((st = mkdir_p(dir, err)) != MC_OK) {
        writer_free(w);
        return st;
    }
    if (make_tmpdir(w->tmp) != 0) {
        int e = errno;
        free(w->tmp);
        w->tmp = NULL;
        writer_free(w);
        return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create a temporary directory", dir);
    }
    if (!(w->tmp_file = str_printf("%s/" MC_CKPT_FILE, w->tmp))) {
        writer_discard(w);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    }
    if ((st = mc_h5zstd_register(err)) != MC_OK) {
        writer_discard(w);
        return st;
    }
    /* 1.10 structures everywhere: checksummed metadata (see the top). */
    if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) < 0 ||
        (w->fid = H5Fcreate(w->tmp_file, H5F_ACC_EXCL, H5P_DEFAULT, fapl)) < 0) {
        st = h5fail(err, MC_ERR_IO, "%s: cannot create the HDF5 file", w->final_file);
        close_id(&fapl);
        writer_discard(w);
        return st;
    }
    close_id(&fapl);
    if ((st = write_str_attr(w->fid, "mc_format", FORMAT_NAME, err, w->final_file)) != MC_OK ||
        (st = write_int_attr(w->fid, "mc_format_version", MC_CKPT_FORMAT_VERSION, err, w->final_file)) != MC_OK ||
        (st = write_str_attr(w->fid, "mc_version", PACKAGE_VERSION, err, w->final_file)) != MC_OK ||
        (st = write_int_attr(w->fid, "iteration", iteration, err, w->final_file)) != MC_OK) {
        writer_discard(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

mc_status mc_ckpt_writer_begin(const char *dir, int64_t iteration, mc_ckpt_writer **out, mc_error *err) {
    *out = NULL;
    if (!dir || !*dir)
        return mc_error_set(err, MC_ERR_USAGE, "checkpoint directory: empty name");
    if (iteration < 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: negative iteration %" PRId64, dir, iteration);
    quiet q;
    quiet_on(&q);
    mc_status st = writer_begin(dir, iteration, out, err);
    quiet_off(&q);
    return st;
}

mc_status mc_ckpt_writer_set_compression(mc_ckpt_writer *w, mc_ckpt_compression c, int level,
                                         mc_error *err) {
    if (c != MC_CKPT_COMPRESS_NONE && c != MC_CKPT_COMPRESS_ZSTD)
        return mc_error_set(err, MC_ERR_USAGE, "%s: unknown compression %d", w->final_file, (int)c);
    w->comp = c;
    w->level = level;
    return MC_OK;
}

/* Dataset creation properties: chunks of ~CHUNK_TARGET bytes (whole rows
 * when a row fits), then zstd when asked, then Fletcher-32 over the stored
 * bytes (checked before anything is decompressed). */
static hid_t tensor_dcpl(const mc_ckpt_writer *w, int nd, const hsize_t *dims, size_t esize) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2];
    hsize_t target = CHUNK_TARGET / esize;
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
    if (dcpl < 0 || H5Pset_chunk(dcpl, nd, chunk) < 0)
        goto fail;
    if (w->comp == MC_CKPT_COMPRESS_ZSTD) {
        unsigned cd = (unsigned)(int32_t)w->level;
        if (H5Pset_filter(dcpl, MC_H5Z_FILTER_ZSTD, H5Z_FLAG_MANDATORY, w->level ? 1 : 0, &cd) < 0)
            goto fail;
    }
    if (H5Pset_fletcher32(dcpl) < 0)
        goto fail;
    return dcpl;
fail:
    close_id(&dcpl);
    return -1;
}

static hid_t file_type(mc_ckpt_dtype d) {
    switch (d) {
    case MC_CKPT_FLOAT32: return H5Tcopy(H5T_IEEE_F32LE);
    case MC_CKPT_BFLOAT16: return H5Tcopy(H5T_STD_U16LE);
    case MC_CKPT_FLOAT16: return half_type();
    }
    return -1;
}

static mc_status create_tensor(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                               mc_ckpt_dtype dtype, mc_error *err) {
    int nd = cols == 0 ? 1 : 2;
    hsize_t dims[2] = {(hsize_t)rows, (hsize_t)(cols ? cols : 1)};
    hid_t ft = file_type(dtype), sp = H5Screate_simple(nd, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = -1, ds = -1;
    mc_status st = MC_OK;
    if (ft < 0 || sp < 0 || lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        (dcpl = tensor_dcpl(w, nd, dims, H5Tget_size(ft))) < 0)
        st = h5fail(err, MC_ERR_INTERNAL, "%s: %s: cannot set up the dataset", w->final_file, path);
    else if ((ds = H5Dcreate2(w->fid, path, ft, sp, lcpl, dcpl, H5P_DEFAULT)) < 0)
        st = h5fail(err, MC_ERR_IO, "%s: %s: cannot create the dataset", w->final_file, path);
    else
        st = write_str_attr(ds, "dtype", mc_ckpt_dtype_name(dtype), err, w->final_file);
    close_id(&ds);
    close_id(&dcpl);
    close_id(&lcpl);
    close_id(&sp);
    close_id(&ft);
    return st;
}

static mc_status write_tensor(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols, int64_t row0,
                              int64_t col0, int64_t lrows, int64_t lcols, const float *host,
                              mc_ckpt_dtype dtype, mc_error *err) {
    char where[512];
    snprintf(where, sizeof where, "%s: %s", w->final_file, path ? path : "(null)");
    if (!valid_path(path))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid tensor path", where);
    if (!mc_ckpt_dtype_name(dtype))
        return mc_error_set(err, MC_ERR_USAGE, "%s: unknown dtype %d", where, (int)dtype);
    mc_status st = check_block(where, rows, cols, row0, col0, lrows, lcols, err);
    if (st != MC_OK)
        return st;
    if (cols == 0)
        col0 = 0, lcols = 1;
    wtensor *t = NULL;
    for (size_t i = 0; i < w->nt; i++)
        if (strcmp(w->t[i].path, path) == 0)
            t = &w->t[i];
    if (t) {
        if (t->rows != rows || t->cols != cols || t->dtype != dtype) {
            char a[64], b[64];
            shape_str(a, sizeof a, t->rows, t->cols);
            shape_str(b, sizeof b, rows, cols);
            return mc_error_set(err, MC_ERR_USAGE, "%s: written as %s %s, now as %s %s", where, a,
                                mc_ckpt_dtype_name(t->dtype), b, mc_ckpt_dtype_name(dtype));
        }
    } else {
        if (w->nt == w->ct) {
            size_t nc = w->ct ? 2 * w->ct : 64;
            wtensor *nt = realloc(w->t, nc * sizeof *nt);
            if (!nt)
                return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
            w->t = nt;
            w->ct = nc;
        }
        if (H5Lexists(w->fid, path, H5P_DEFAULT) > 0)
            return mc_error_set(err, MC_ERR_USAGE, "%s: name already used in the file", where);
        H5Eclear2(H5E_DEFAULT);
        if ((st = create_tensor(w, path, rows, cols, dtype, err)) != MC_OK)
            return st;
        t = &w->t[w->nt];
        if (!(t->path = strdup(path)))
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
        t->rows = rows;
        t->cols = cols;
        t->dtype = dtype;
        t->written = 0;
        w->nt++;
    }
    size_t n = (size_t)lrows * (size_t)lcols;
    if (n == 0)
        return MC_OK;

    /* The stored form of the block: fp32 as is, 16-bit types converted. */
    uint16_t *half = NULL;
    hid_t mt = -1;
    if (dtype == MC_CKPT_FLOAT32) {
        mt = H5Tcopy(H5T_NATIVE_FLOAT);
    } else {
        if (!(half = malloc(n * sizeof *half)))
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
        for (size_t i = 0; i < n; i++)
            half[i] = dtype == MC_CKPT_BFLOAT16 ? f32_to_bf16(host[i]) : f32_to_f16(host[i]);
        /* Same layout as the file type, so HDF5 copies the bits unconverted. */
        mt = dtype == MC_CKPT_BFLOAT16 ? H5Tcopy(H5T_NATIVE_UINT16) : half_type();
        if (mt >= 0 && dtype == MC_CKPT_FLOAT16)
            H5Tset_order(mt, H5Tget_order(H5T_NATIVE_FLOAT));
    }
    hid_t ds = H5Dopen2(w->fid, path, H5P_DEFAULT), fs = -1, ms = -1;
    if (mt < 0 || ds < 0 || (fs = H5Dget_space(ds)) < 0 ||
        block_spaces(fs, cols, row0, col0, lrows, lcols, &ms) != MC_OK)
        st = h5fail(err, MC_ERR_INTERNAL, "%s: cannot select the block", where);
    else if (H5Dwrite(ds, mt, ms, fs, H5P_DEFAULT, half ? (const void *)half : (const void *)host) < 0)
        st = h5fail(err, MC_ERR_IO, "%s: write failed", where);
    else
        t->written += (int64_t)n;
    close_id(&ms);
    close_id(&fs);
    close_id(&ds);
    close_id(&mt);
    free(half);
    return st;
}

mc_status mc_ckpt_write_tensor(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                               int64_t row0, int64_t col0, int64_t local_rows, int64_t local_cols,
                               const float *host, mc_ckpt_dtype dtype, mc_error *err) {
    quiet q;
    quiet_on(&q);
    mc_status st = write_tensor(w, path, rows, cols, row0, col0, local_rows, local_cols, host, dtype, err);
    quiet_off(&q);
    return st;
}

mc_status mc_ckpt_write_json(mc_ckpt_writer *w, const char *key, const char *json_text, mc_error *err) {
    if (!valid_key(key) || !json_text)
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name or text", w->final_file);
    char where[512];
    snprintf(where, sizeof where, "%s: attribute %s", w->final_file, key);
    json_t *j = NULL;
    mc_status st = mc_json_load_buf(where, json_text, strlen(json_text), &j, err);
    if (st != MC_OK)
        return st;
    json_decref(j);
    quiet q;
    quiet_on(&q);
    st = write_str_attr(w->fid, key, json_text, err, w->final_file);
    quiet_off(&q);
    return st;
}

mc_status mc_ckpt_write_int(mc_ckpt_writer *w, const char *key, int64_t value, mc_error *err) {
    if (!valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name", w->final_file);
    quiet q;
    quiet_on(&q);
    mc_status st = write_int_attr(w->fid, key, value, err, w->final_file);
    quiet_off(&q);
    return st;
}

static mc_status write_bytes(mc_ckpt_writer *w, const char *key, const void *data, size_t n, mc_error *err) {
    hsize_t dims[1] = {n}, chunk[1] = {n < CHUNK_TARGET ? n : CHUNK_TARGET};
    hid_t sp = H5Screate_simple(1, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE), ds = -1;
    mc_status st = MC_OK;
    if (H5Lexists(w->fid, key, H5P_DEFAULT) > 0) {
        st = mc_error_set(err, MC_ERR_USAGE, "%s: %s: name already used in the file", w->final_file, key);
        goto done;
    }
    /* An empty dataset cannot be chunked; there is nothing to checksum. */
    if (sp < 0 || dcpl < 0 || (n > 0 && (H5Pset_chunk(dcpl, 1, chunk) < 0 || H5Pset_fletcher32(dcpl) < 0)) ||
        (ds = H5Dcreate2(w->fid, key, H5T_STD_U8LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT)) < 0 ||
        (n > 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        st = h5fail(err, MC_ERR_IO, "%s: %s: write failed", w->final_file, key);
done:
    close_id(&ds);
    close_id(&dcpl);
    close_id(&sp);
    return st;
}

mc_status mc_ckpt_write_bytes(mc_ckpt_writer *w, const char *key, const void *data, size_t n, mc_error *err) {
    if (!valid_key(key) || (n && !data))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid dataset name or data", w->final_file);
    quiet q;
    quiet_on(&q);
    mc_status st = write_bytes(w, key, data, n, err);
    quiet_off(&q);
    return st;
}

static mc_status writer_commit(mc_ckpt_writer *w, mc_error *err) {
    mc_status st;
    for (size_t i = 0; i < w->nt; i++) {
        const wtensor *t = &w->t[i];
        int64_t numel = t->rows * (t->cols ? t->cols : 1);
        if (t->written != numel)
            return mc_error_set(err, MC_ERR_USAGE,
                                "%s: %s: %" PRId64 " of %" PRId64 " elements written; not saving a partial tensor",
                                w->final_file, t->path, t->written, numel);
    }
    if (H5Fclose(w->fid) < 0) {
        w->fid = -1;
        return h5fail(err, MC_ERR_IO, "%s: closing the HDF5 file failed", w->final_file);
    }
    w->fid = -1;
    if ((st = fsync_path(w->tmp_file, err)) != MC_OK || (st = fsync_path(w->tmp, err)) != MC_OK)
        return st;
    /* An existing iteration directory is swapped out atomically (so the
     * pointer never names a missing directory) and removed afterwards. */
    if (rename(w->tmp, w->final) != 0) {
        int e = errno;
        if (e != ENOTEMPTY && e != EEXIST)
            return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot rename '%s' to it", w->final, w->tmp);
        if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->final, RENAME_EXCHANGE) != 0) {
            /* No exchange on this file system: remove, then rename. */
            if (rm_tree(w->final) != 0 || rename(w->tmp, w->final) != 0)
                return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot replace it", w->final);
        } else if (rm_tree(w->tmp) != 0) {
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot remove the replaced copy '%s'",
                                  w->final, w->tmp);
        }
    }
    if ((st = fsync_path(w->dir, err)) != MC_OK)
        return st;
    /* The final directory is in place; from here a failure leaves the
     * previous pointer, which still names a complete checkpoint. */
    free(w->tmp);
    w->tmp = NULL;
    char *latest = str_printf("%s/" MC_CKPT_LATEST, w->dir), num[32];
    if (!latest)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->dir);
    int len = snprintf(num, sizeof num, "%" PRId64 "\n", w->iteration);
    mc_afile f;
    if ((st = mc_afile_open(&f, latest, err)) == MC_OK) {
        if ((st = mc_afile_write(&f, num, (size_t)len, err)) == MC_OK)
            st = mc_afile_commit(&f, err);
        mc_afile_abort(&f);
    }
    free(latest);
    return st;
}

mc_status mc_ckpt_writer_commit(mc_ckpt_writer *w, mc_error *err) {
    quiet q;
    quiet_on(&q);
    mc_status st = writer_commit(w, err);
    writer_discard(w); /* removes the temporary if it is still there */
    quiet_off(&q);
    return st;
}

void mc_ckpt_writer_abort(mc_ckpt_writer *w) {
    if (!w)
        return;
    quiet q;
    quiet_on(&q);
    writer_discard(w);
    quiet_off(&q);
}

/* ------------------------------------------------------------ reader */

struct mc_ckpt_reader {
    char *dir, *file;
    int64_t iteration;
    hid_t fid;
};

int64_t mc_ckpt_iteration(const mc_ckpt_reader *r) { return r->iteration; }
const char *mc_ckpt_dir(const mc_ckpt_reader *r) { return r->dir; }
const char *mc_ckpt_file(const mc_ckpt_reader *r) { return r->file; }

void mc_ckpt_close(mc_ckpt_reader *r) {
    if (!r)
        return;
    quiet q;
    quiet_on(&q);
    close_id(&r->fid);
    quiet_off(&q);
    free(r->dir);
    free(r->file);
    free(r);
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* DIR/latest_checkpointed_iteration.txt -> the iteration it names. */
static mc_status read_latest(const char *latest, int64_t *it, mc_error *err) {
    char *data;
    size_t len;
    mc_status st = mc_read_file(latest, &data, &len, err);
    if (st != MC_OK)
        return st;
    char *s = data, *e;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    int ok = e != s && *s != '-' && *s != '+' && errno == 0;
    while (ok && (*e == ' ' || *e == '\t' || *e == '\n' || *e == '\r'))
        e++;
    if (!ok || *e) {
        if (strncmp(s, "release", 7) == 0)
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: 'release' checkpoints (Megatron) are not supported", latest);
        else
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: not an iteration number", latest);
    } else {
        *it = v;
    }
    free(data);
    return st;
}

static mc_status reader_open(const char *path, mc_ckpt_reader *r, mc_error *err) {
    mc_status st;
    int64_t named = -1;
    if (is_file(path)) {
        const char *slash = strrchr(path, '/');
        r->file = strdup(path);
        r->dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    } else if (is_dir(path)) {
        char *f = str_printf("%s/" MC_CKPT_FILE, path), *latest = str_printf("%s/" MC_CKPT_LATEST, path);
        if (!f || !latest) {
            free(f);
            free(latest);
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
        }
        if (is_file(f)) {
            r->file = f;
            r->dir = strdup(path);
            free(latest);
        } else if (is_file(latest)) {
            free(f);
            st = read_latest(latest, &named, err);
            free(latest);
            if (st != MC_OK)
                return st;
            r->dir = str_printf("%s/iter_%07" PRId64, path, named);
            r->file = r->dir ? str_printf("%s/" MC_CKPT_FILE, r->dir) : NULL;
            if (r->file && !is_file(r->file))
                return mc_error_set(err, MC_ERR_FORMAT, "%s/" MC_CKPT_LATEST ": names iteration %" PRId64
                                    " but %s does not exist", path, named, r->file);
        } else {
            free(f);
            free(latest);
            return mc_error_set(err, MC_ERR_NOTFOUND,
                                "%s: not a checkpoint: no " MC_CKPT_LATEST " and no " MC_CKPT_FILE, path);
        }
    } else {
        return mc_error_errno(err, MC_ERR_NOTFOUND, errno, "%s: cannot open checkpoint", path);
    }
    if (!r->dir || !r->file)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    if ((st = mc_h5zstd_register(err)) != MC_OK)
        return st;
    if ((r->fid = H5Fopen(r->file, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: not a readable HDF5 file", r->file);
    char *fmt = NULL;
    if ((st = read_str_attr(r->fid, "mc_format", &fmt, err, r->file)) != MC_OK)
        return st;
    int ok = strcmp(fmt, FORMAT_NAME) == 0;
    free(fmt);
    if (!ok)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: attribute mc_format is not '" FORMAT_NAME "'", r->file);
    int64_t version;
    if ((st = read_int_attr(r->fid, "mc_format_version", &version, err, r->file)) != MC_OK ||
        (st = read_int_attr(r->fid, "iteration", &r->iteration, err, r->file)) != MC_OK)
        return st;
    if (version < 1 || version > MC_CKPT_FORMAT_VERSION)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: format version %" PRId64 ", this mc reads up to %d",
                            r->file, version, MC_CKPT_FORMAT_VERSION);
    if (named >= 0 && named != r->iteration)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: holds iteration %" PRId64 ", the directory says %" PRId64,
                            r->file, r->iteration, named);
    return MC_OK;
}

mc_status mc_ckpt_open(const char *path, mc_ckpt_reader **out, mc_error *err) {
    *out = NULL;
    if (!path || !*path)
        return mc_error_set(err, MC_ERR_USAGE, "checkpoint: empty path");
    mc_ckpt_reader *r = calloc(1, sizeof *r);
    if (!r)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    r->fid = -1;
    quiet q;
    quiet_on(&q);
    mc_status st = reader_open(path, r, err);
    quiet_off(&q);
    if (st != MC_OK)
        mc_ckpt_close(r);
    else
        *out = r;
    return st;
}

mc_status mc_ckpt_read_json(mc_ckpt_reader *r, const char *key, json_t **out, mc_error *err) {
    *out = NULL;
    if (!valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name", r->file);
    char *s = NULL, where[512];
    quiet q;
    quiet_on(&q);
    mc_status st = read_str_attr(r->fid, key, &s, err, r->file);
    quiet_off(&q);
    if (st != MC_OK)
        return st;
    snprintf(where, sizeof where, "%s: attribute %s", r->file, key);
    st = mc_json_load_buf(where, s, strlen(s), out, err);
    free(s);
    return st;
}

mc_status mc_ckpt_read_int(mc_ckpt_reader *r, const char *key, int64_t *out, mc_error *err) {
    if (!valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid attribute name", r->file);
    quiet q;
    quiet_on(&q);
    mc_status st = read_int_attr(r->fid, key, out, err, r->file);
    quiet_off(&q);
    return st;
}

/* 1 when the link path exists, 0 when it does not, -1 when HDF5 cannot
 * tell (a damaged group; its error stack is left for h5fail). */
static int exists(hid_t fid, const char *path) {
    /* H5Lexists on "a/b" fails when "a" is missing: check each prefix. */
    char buf[1024];
    size_t n = strlen(path);
    if (n >= sizeof buf)
        return 0;
    memcpy(buf, path, n + 1);
    for (size_t i = 0; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            htri_t e = H5Lexists(fid, buf, H5P_DEFAULT);
            buf[i] = c;
            if (e <= 0)
                return e < 0 ? -1 : 0;
        }
    }
    return 1;
}

static mc_status read_bytes(mc_ckpt_reader *r, const char *key, void **data, size_t *n, mc_error *err) {
    int there = exists(r->fid, key);
    if (there < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", r->file, key);
    if (!there)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no dataset '%s'", r->file, key);
    hid_t ds = H5Dopen2(r->fid, key, H5P_DEFAULT), sp = -1, t = -1;
    mc_status st = MC_OK;
    if (ds < 0 || (sp = H5Dget_space(ds)) < 0 || (t = H5Dget_type(ds)) < 0) {
        st = h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot open the dataset", r->file, key);
    } else if (H5Sget_simple_extent_ndims(sp) != 1 || H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != 1) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: not a 1-D byte dataset", r->file, key);
    } else {
        hssize_t m = H5Sget_simple_extent_npoints(sp);
        void *p = malloc(m > 0 ? (size_t)m : 1);
        if (!p)
            st = mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", r->file, key);
        else if (m > 0 && H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, p) < 0) {
            free(p);
            st = h5fail(err, MC_ERR_FORMAT, "%s: %s: read failed", r->file, key);
        } else {
            *data = p;
            *n = (size_t)m;
        }
    }
    close_id(&t);
    close_id(&sp);
    close_id(&ds);
    return st;
}

mc_status mc_ckpt_read_bytes(mc_ckpt_reader *r, const char *key, void **data, size_t *n, mc_error *err) {
    *data = NULL;
    *n = 0;
    if (!valid_key(key))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid dataset name", r->file);
    quiet q;
    quiet_on(&q);
    mc_status st = read_bytes(r, key, data, n, err);
    quiet_off(&q);
    return st;
}

/* Open a tensor and learn its global shape and stored dtype. A dataset
 * written by another tool without a dtype attribute is read by its HDF5
 * type: any float (float64 is rounded to fp32); uint16 needs
 * dtype="bfloat16". */
static mc_status open_tensor(mc_ckpt_reader *r, const char *path, hid_t *ds_out, int64_t *rows,
                             int64_t *cols, mc_ckpt_dtype *dtype, mc_error *err) {
    if (!valid_path(path))
        return mc_error_set(err, MC_ERR_USAGE, "%s: %s: invalid tensor path", r->file, path ? path : "(null)");
    int there = exists(r->fid, path);
    if (there < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", r->file, path);
    if (!there)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: %s: no such tensor in the checkpoint", r->file, path);
    hid_t ds = H5Dopen2(r->fid, path, H5P_DEFAULT), sp = -1, t = -1;
    mc_status st = MC_OK;
    char *dname = NULL;
    hsize_t dims[2] = {0, 0};
    int nd = -1;
    if (ds < 0 || (sp = H5Dget_space(ds)) < 0 || (t = H5Dget_type(ds)) < 0 ||
        (nd = H5Sget_simple_extent_ndims(sp)) < 0) {
        st = h5fail(err, MC_ERR_FORMAT, "%s: %s: not a readable dataset", r->file, path);
        goto done;
    }
    if (nd < 1 || nd > 2) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: %d dimensions, a tensor has 1 or 2", r->file, path, nd);
        goto done;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    if (dims[0] < 1 || (nd == 2 && dims[1] < 1)) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: empty tensor", r->file, path);
        goto done;
    }
    *rows = (int64_t)dims[0];
    *cols = nd == 2 ? (int64_t)dims[1] : 0;
    st = read_str_attr(ds, "dtype", &dname, err, r->file);
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
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: dtype bfloat16 needs 16-bit integer storage", r->file, path);
    } else if (dname && strcmp(dname, "float16") != 0 && strcmp(dname, "float32") != 0) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: unknown dtype '%s'", r->file, path, dname);
    } else if (cls != H5T_FLOAT) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: not stored as floating point", r->file, path);
    } else {
        *dtype = size == 2 ? MC_CKPT_FLOAT16 : MC_CKPT_FLOAT32;
        if (dname && strcmp(dname, mc_ckpt_dtype_name(*dtype)) != 0)
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s: dtype '%s' but %zu-byte floats", r->file, path,
                              dname, size);
    }
done:
    free(dname);
    close_id(&t);
    close_id(&sp);
    if (st != MC_OK)
        close_id(&ds);
    *ds_out = ds;
    return st;
}

int mc_ckpt_has_tensor(mc_ckpt_reader *r, const char *path) {
    quiet q;
    quiet_on(&q);
    int e = valid_path(path) && exists(r->fid, path) > 0;
    H5Eclear2(H5E_DEFAULT);
    quiet_off(&q);
    return e;
}

mc_status mc_ckpt_tensor_info(mc_ckpt_reader *r, const char *path, int64_t *rows, int64_t *cols,
                              mc_ckpt_dtype *dtype, mc_error *err) {
    int64_t rr = 0, cc = 0;
    mc_ckpt_dtype dd = MC_CKPT_FLOAT32;
    hid_t ds = -1;
    quiet q;
    quiet_on(&q);
    mc_status st = open_tensor(r, path, &ds, &rr, &cc, &dd, err);
    close_id(&ds);
    quiet_off(&q);
    if (st == MC_OK) {
        if (rows)
            *rows = rr;
        if (cols)
            *cols = cc;
        if (dtype)
            *dtype = dd;
    }
    return st;
}

static mc_status read_tensor(mc_ckpt_reader *r, const char *path, int64_t rows, int64_t cols, int64_t row0,
                             int64_t col0, int64_t lrows, int64_t lcols, float *out, mc_error *err) {
    char where[512];
    snprintf(where, sizeof where, "%s: %s", r->file, path ? path : "(null)");
    mc_status st = check_block(where, rows, cols, row0, col0, lrows, lcols, err);
    if (st != MC_OK)
        return st;
    if (cols == 0)
        col0 = 0, lcols = 1;
    int64_t frows, fcols;
    mc_ckpt_dtype dtype;
    hid_t ds = -1, fs = -1, ms = -1;
    if ((st = open_tensor(r, path, &ds, &frows, &fcols, &dtype, err)) != MC_OK)
        return st;
    if (frows != rows || fcols != cols) {
        char a[64], b[64];
        shape_str(a, sizeof a, frows, fcols);
        shape_str(b, sizeof b, rows, cols);
        close_id(&ds);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: shape %s in the checkpoint, %s expected", where, a, b);
    }
    size_t n = (size_t)lrows * (size_t)lcols;
    if (n > 0) {
        hid_t mt = dtype == MC_CKPT_BFLOAT16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
        if ((fs = H5Dget_space(ds)) < 0 || block_spaces(fs, cols, row0, col0, lrows, lcols, &ms) != MC_OK)
            st = h5fail(err, MC_ERR_INTERNAL, "%s: cannot select the block", where);
        else if (H5Dread(ds, mt, ms, fs, H5P_DEFAULT, out) < 0)
            st = h5fail(err, MC_ERR_FORMAT, "%s: read failed", where);
        else if (dtype == MC_CKPT_BFLOAT16) {
            /* The n uint16 values sit in the first half of out; widen from
             * the end so that no value is overwritten before it is read. */
            const unsigned char *b = (const unsigned char *)out;
            for (size_t i = n; i-- > 0;) {
                uint16_t h;
                memcpy(&h, b + 2 * i, 2);
                float f = bf16_to_f32(h);
                memcpy((unsigned char *)out + 4 * i, &f, 4);
            }
        }
    }
    close_id(&ms);
    close_id(&fs);
    close_id(&ds);
    return st;
}

mc_status mc_ckpt_read_tensor(mc_ckpt_reader *r, const char *path, int64_t rows, int64_t cols, int64_t row0,
                              int64_t col0, int64_t local_rows, int64_t local_cols, float *host_out,
                              mc_error *err) {
    quiet q;
    quiet_on(&q);
    mc_status st = read_tensor(r, path, rows, cols, row0, col0, local_rows, local_cols, host_out, err);
    quiet_off(&q);
    return st;
}

typedef struct list_ctx {
    mc_buf names; /* NUL-separated */
    size_t n;
    mc_error *err;
} list_ctx;

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    (void)info;
    list_ctx *c = data;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    int is_ds = o >= 0 && H5Iget_type(o) == H5I_DATASET;
    close_id(&o);
    H5Eclear2(H5E_DEFAULT);
    if (!is_ds)
        return 0;
    if (mc_buf_append(&c->names, name, strlen(name) + 1, c->err) != MC_OK)
        return -1;
    c->n++;
    return 0;
}

static mc_status list_group(mc_ckpt_reader *r, const char *group, char ***names, size_t *n, mc_error *err) {
    int there = exists(r->fid, group);
    if (there < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot look it up", r->file, group);
    if (!there)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: no group '%s'", r->file, group);
    hid_t g = H5Gopen2(r->fid, group, H5P_DEFAULT);
    if (g < 0)
        return h5fail(err, MC_ERR_FORMAT, "%s: %s: not a group", r->file, group);
    list_ctx c = {MC_BUF_INIT, 0, err};
    hsize_t idx = 0;
    herr_t e = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_cb, &c);
    close_id(&g);
    if (e < 0) {
        mc_buf_free(&c.names);
        return err && err->code ? err->code : h5fail(err, MC_ERR_FORMAT, "%s: %s: cannot list it", r->file, group);
    }
    /* One block: the pointer array, then the strings. */
    char **v = malloc((c.n + 1) * sizeof *v + c.names.len + 1);
    if (!v) {
        mc_buf_free(&c.names);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", r->file);
    }
    char *s = (char *)(v + c.n + 1);
    if (c.names.len)
        memcpy(s, c.names.data, c.names.len);
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

mc_status mc_ckpt_list(mc_ckpt_reader *r, const char *group, char ***names, size_t *n, mc_error *err) {
    *names = NULL;
    *n = 0;
    if (!valid_path(group))
        return mc_error_set(err, MC_ERR_USAGE, "%s: invalid group name", r->file);
    mc_error_clear(err);
    quiet q;
    quiet_on(&q);
    mc_status st = list_group(r, group, names, n, err);
    quiet_off(&q);
    return st;
}
