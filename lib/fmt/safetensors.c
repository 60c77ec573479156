/*
 * safetensors.c - reading and writing safetensors files and sharded
 * safetensors models (mc/safetensors.h; layout in mc-formats(5)).
 *
 * The reader maps each file and validates its header completely before any
 * tensor is handed out: a header length that fits the file, JSON that is an
 * object of objects, known dtypes, non-negative shapes whose element count
 * times the dtype size equals the span of data_offsets, spans inside the
 * data section and not overlapping one another. The writer computes every
 * header from the declared tensors, so each file is written front to back
 * in one pass.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "mc/dtype.h"
#include "mc/file.h"
#include "mc/json.h"
#include "mc/safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* A header longer than this is not a model's (safetensors itself stops at
 * 100 MB). */
#define ST_MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    [MC_ST_F32] = {"F32", 4},   [MC_ST_F16] = {"F16", 2}, [MC_ST_BF16] = {"BF16", 2},
    [MC_ST_F64] = {"F64", 8},   [MC_ST_I64] = {"I64", 8}, [MC_ST_I32] = {"I32", 4},
    [MC_ST_I16] = {"I16", 2},   [MC_ST_I8] = {"I8", 1},   [MC_ST_U8] = {"U8", 1},
    [MC_ST_BOOL] = {"BOOL", 1},
};
#define NDTYPES (sizeof DTYPES / sizeof DTYPES[0])

const char *mc_st_dtype_name(mc_st_dtype d)
{
    return (unsigned)d < NDTYPES ? DTYPES[d].name : NULL;
}

size_t mc_st_dtype_size(mc_st_dtype d) { return (unsigned)d < NDTYPES ? DTYPES[d].size : 0; }

int mc_st_dtype_parse(const char *s)
{
    for (size_t i = 0; s && i < NDTYPES; i++)
        if (!strcmp(s, DTYPES[i].name)) return (int)i;
    return -1;
}

/* ------------------------------------------------------------ reading */

typedef struct st_file {
    char *path;
    mc_map map;
    json_t *header;
} st_file;

struct mc_st_model {
    st_file *files;
    size_t nfiles;
    mc_st_tensor *t;
    size_t n, cap;
};

void mc_st_close(mc_st_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->nfiles; i++) {
        mc_unmap(&m->files[i].map);
        json_decref(m->files[i].header);
        free(m->files[i].path);
    }
    free(m->files);
    free(m->t);
    free(m);
}

size_t mc_st_count(const mc_st_model *m) { return m->n; }

const mc_st_tensor *mc_st_get(const mc_st_model *m, size_t i) { return i < m->n ? &m->t[i] : NULL; }

const mc_st_tensor *mc_st_find(const mc_st_model *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

const char *mc_st_metadata(const mc_st_model *m, const char *key)
{
    if (!m->nfiles) return NULL;
    return json_string_value(
        json_object_get(json_object_get(m->files[0].header, "__metadata__"), key));
}

static int by_begin(const void *a, const void *b)
{
    const mc_st_tensor *x = *(const mc_st_tensor *const *)a, *y = *(const mc_st_tensor *const *)b;
    const char *px = x->data, *py = y->data;
    return px < py ? -1 : px > py;
}

/* One tensor's entry of a header, checked against the data section. */
static mc_status parse_entry(const char *file, const char *name, json_t *e,
                             const unsigned char *data, uint64_t dlen, mc_st_tensor *t,
                             mc_error *err)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    t->file = file;
    if (!json_is_object(e))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: header: tensor '%s' is not an object", file,
                            name);
    int d = mc_st_dtype_parse(json_string_value(json_object_get(e, "dtype")));
    if (d < 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: header: tensor '%s': unknown or missing dtype",
                            file, name);
    t->dtype = (mc_st_dtype)d;
    json_t *shape = json_object_get(e, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > MC_ST_MAX_DIMS)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: header: tensor '%s': shape is missing or has more than %d "
                            "dimensions",
                            file, name, MC_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *x = json_array_get(shape, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            (uint64_t)json_integer_value(x) > ((uint64_t)1 << 48))
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: header: tensor '%s': shape[%d] is not a size", file, name, i);
        t->shape[i] = json_integer_value(x);
        numel *= (uint64_t)t->shape[i];
        if (numel > ((uint64_t)1 << 48))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: header: tensor '%s': shape too large",
                                file, name);
    }
    t->numel = (int64_t)numel;
    json_t *off = json_object_get(e, "data_offsets");
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(en))
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: header: tensor '%s': data_offsets is not [BEGIN, END]", file,
                            name);
    json_int_t begin = json_integer_value(b), end = json_integer_value(en);
    if (begin < 0 || end < begin || (uint64_t)end > dlen)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: header: tensor '%s': data_offsets [%lld, %lld] outside the data "
                            "(%" PRIu64 " bytes)",
                            file, name, (long long)begin, (long long)end, dlen);
    uint64_t want = numel * DTYPES[d].size;
    if ((uint64_t)(end - begin) != want)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: header: tensor '%s': data_offsets span %lld bytes, its shape and "
                            "dtype %s need %" PRIu64,
                            file, name, (long long)(end - begin), DTYPES[d].name, want);
    t->data = data + begin;
    t->nbytes = (size_t)want;
    return MC_OK;
}

/* Map one file, validate its header and append its tensors. */
static mc_status open_file(mc_st_model *m, const char *path, mc_error *err)
{
    st_file *nf = realloc(m->files, (m->nfiles + 1) * sizeof *nf);
    if (!nf) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    m->files = nf;
    st_file *f = &m->files[m->nfiles];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path)))
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    m->nfiles++;
    mc_status st = mc_map_file(path, &f->map, err);
    if (st) return st;
    const unsigned char *p = f->map.data;
    if (f->map.len < 8)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: %zu bytes: too short for a safetensors header length", path,
                            f->map.len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > f->map.len - 8 || hlen > ST_MAX_HEADER)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: header length %" PRIu64 " exceeds the file (%zu bytes)%s", path,
                            hlen, f->map.len, hlen > ST_MAX_HEADER ? " or 100 MB" : "");
    st = mc_json_load_buf(path, (const char *)p + 8, (size_t)hlen, &f->header, err);
    if (st) return st;
    if (!json_is_object(f->header))
        return mc_error_set(err, MC_ERR_FORMAT, "%s: header is not a JSON object", path);
    const unsigned char *data = p + 8 + hlen;
    uint64_t dlen = f->map.len - 8 - hlen;
    size_t first = m->n;
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v))
                return mc_error_set(err, MC_ERR_FORMAT, "%s: header: __metadata__ is not an object",
                                    path);
            continue;
        }
        if (m->n == m->cap) {
            size_t cap = m->cap ? 2 * m->cap : 64;
            mc_st_tensor *t = realloc(m->t, cap * sizeof *t);
            if (!t) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
            m->t = t;
            m->cap = cap;
        }
        if ((st = parse_entry(f->path, key, v, data, dlen, &m->t[m->n], err))) return st;
        m->n++;
    }
    /* No two tensors of the file may share bytes. */
    size_t k = m->n - first;
    mc_st_tensor **order = malloc((k ? k : 1) * sizeof *order);
    if (!order) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < k; i++) order[i] = &m->t[first + i];
    qsort(order, k, sizeof *order, by_begin);
    for (size_t i = 1; i < k && !st; i++) {
        const char *prev_end = (const char *)order[i - 1]->data + order[i - 1]->nbytes;
        if ((const char *)order[i]->data < prev_end)
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: header: tensors '%s' and '%s' overlap", path,
                              order[i - 1]->name, order[i]->name);
    }
    free(order);
    return st;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *join(const char *dir, const char *name)
{
    char *s = NULL;
    if (asprintf(&s, "%s/%s", dir, name) < 0) return NULL;
    return s;
}

/* Open the shards an index names, in the order they first appear, and
 * check that every name of weight_map is in the file it says. */
static mc_status open_index(mc_st_model *m, const char *index, mc_error *err)
{
    json_t *root = NULL;
    mc_status st = mc_json_load_file(index, &root, err);
    if (st) return st;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || !json_object_size(wm)) {
        json_decref(root);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: weight_map is missing or empty", index);
    }
    char *dir = strdup(index);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (dir) {
        if (slash)
            *slash = 0;
        else
            strcpy(dir, ".");
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v)
    {
        const char *file = json_string_value(v);
        /* A plain name in the index's directory: no '/', so neither an
         * absolute path nor one through "..", and not "." or ".." itself. */
        if (!file || !*file || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, "..")) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: weight_map: '%s' does not name a file in the directory", index,
                              key);
            break;
        }
        char *path = join(dir ? dir : ".", file);
        if (!path) {
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            break;
        }
        size_t i;
        for (i = 0; i < m->nfiles && strcmp(m->files[i].path, path); i++)
            ;
        if (i == m->nfiles) st = open_file(m, path, err);
        if (!st) {
            const mc_st_tensor *t = mc_st_find(m, key);
            if (!t || strcmp(t->file, path))
                st = mc_error_set(err, MC_ERR_FORMAT, "%s: weight_map: tensor '%s' is not in %s",
                                  index, key, file);
        }
        free(path);
        if (st) break;
    }
    free(dir);
    json_decref(root);
    return st;
}

/* Every *.safetensors file of a directory, sorted by name. */
static mc_status open_dir_files(mc_st_model *m, const char *dir, mc_error *err)
{
    DIR *d = opendir(dir);
    if (!d) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open the directory", dir);
    char **names = NULL;
    size_t n = 0;
    mc_status st = MC_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !st) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".safetensors")) continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (!nn || !(nn[n] = strdup(e->d_name))) {
            if (nn) names = nn;
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            break;
        }
        names = nn;
        n++;
    }
    closedir(d);
    if (!st && !n) st = mc_error_set(err, MC_ERR_NOTFOUND, "%s: no *.safetensors file", dir);
    if (!st) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !st; i++) {
        char *p = join(dir, names[i]);
        st = p ? open_file(m, p, err) : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

mc_status mc_st_open(const char *path, mc_st_model **out, mc_error *err)
{
    *out = NULL;
    mc_st_model *m = calloc(1, sizeof *m);
    if (!m) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    struct stat sb;
    mc_status st = MC_OK;
    if (stat(path, &sb) != 0) {
        st = mc_error_errno(err, errno == ENOENT ? MC_ERR_NOTFOUND : MC_ERR_IO, errno, "%s", path);
    } else if (S_ISDIR(sb.st_mode)) {
        char *index = join(path, MC_ST_INDEX);
        if (!index)
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        else if (access(index, F_OK) == 0)
            st = open_index(m, index, err);
        else
            st = open_dir_files(m, path, err);
        free(index);
    } else if (ends_with(path, ".json")) {
        st = open_index(m, path, err);
    } else {
        st = open_file(m, path, err);
    }
    /* A name in two files: which one is the model's is anyone's guess. */
    for (size_t i = 0; i < m->n && !st; i++)
        for (size_t j = i + 1; j < m->n && !st; j++)
            if (!strcmp(m->t[i].name, m->t[j].name))
                st = mc_error_set(err, MC_ERR_FORMAT, "%s: tensor '%s' is also in %s", m->t[j].file,
                                  m->t[j].name, m->t[i].file);
    if (st) {
        mc_st_close(m);
        return st;
    }
    *out = m;
    return MC_OK;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, f = h & 0x3ff, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | f << 13;
    } else if (e) {
        bits = sign | (e + 112) << 23 | f << 13;
    } else if (f) { /* subnormal: renormalize */
        e = 113;
        while (!(f & 0x400)) {
            f <<= 1;
            e--;
        }
        bits = sign | e << 23 | (f & 0x3ff) << 13;
    } else {
        bits = sign;
    }
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

mc_status mc_st_to_f32(const mc_st_tensor *t, float *out, mc_error *err)
{
    const unsigned char *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case MC_ST_F32: memcpy(out, p, n * 4); return MC_OK;
    case MC_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return MC_OK;
    case MC_ST_BF16:
    case MC_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            out[i] = t->dtype == MC_ST_BF16 ? mc_dtype_bf16_to_f32(h) : f16_to_f32(h);
        }
        return MC_OK;
    default:
        return mc_error_set(err, MC_ERR_FORMAT, "%s: tensor '%s' has dtype %s, not a float type",
                            t->file, t->name, mc_st_dtype_name(t->dtype));
    }
}

/* ------------------------------------------------------------ writing */

typedef struct st_decl {
    char *name;
    mc_st_dtype dtype;
    int ndim;
    int64_t shape[MC_ST_MAX_DIMS];
    uint64_t nbytes;
    int shard;
    uint64_t offset; /* within its shard's data */
} st_decl;

struct mc_st_writer {
    char *dir;
    uint64_t max_shard;
    st_decl *t;
    size_t n, cap;
    json_t *meta;
    int nshards;      /* after planning; 0 before */
    mc_afile *files;  /* one per shard, open until finish */
    int opened;       /* files opened so far */
    size_t next;      /* next tensor to write */
    uint64_t written; /* bytes of the next tensor's shard written */
};

mc_status mc_st_writer_new(const char *dir, uint64_t max_shard_bytes, mc_st_writer **out,
                           mc_error *err)
{
    *out = NULL;
    mc_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir)) || !(w->meta = json_pack("{s:s}", "format", "pt"))) {
        if (w) free(w->dir);
        free(w);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    w->max_shard = max_shard_bytes;
    *out = w;
    return MC_OK;
}

mc_status mc_st_writer_add(mc_st_writer *w, const char *name, mc_st_dtype dtype, int ndim,
                           const int64_t *shape, mc_error *err)
{
    if (w->nshards)
        return mc_error_set(err, MC_ERR_INTERNAL, "safetensors: tensor '%s' added after writing",
                            name);
    if (!mc_st_dtype_size(dtype) || ndim < 0 || ndim > MC_ST_MAX_DIMS)
        return mc_error_set(err, MC_ERR_INTERNAL, "safetensors: tensor '%s': bad dtype or rank",
                            name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        st_decl *t = realloc(w->t, cap * sizeof *t);
        if (!t) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    st_decl *d = &w->t[w->n];
    memset(d, 0, sizeof *d);
    if (!(d->name = strdup(name))) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    d->dtype = dtype;
    d->ndim = ndim;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        d->shape[i] = shape[i];
        numel *= (uint64_t)shape[i];
    }
    d->nbytes = numel * mc_st_dtype_size(dtype);
    w->n++;
    return MC_OK;
}

mc_status mc_st_writer_set_metadata(mc_st_writer *w, const char *key, const char *value,
                                    mc_error *err)
{
    if (json_object_set_new(w->meta, key, json_string(value)))
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    return MC_OK;
}

/* Assign shards greedily in order (transformers' rule): a tensor that
 * would push the current shard past the limit starts a new one. */
static void plan(mc_st_writer *w)
{
    int shard = 0;
    uint64_t size = 0;
    for (size_t i = 0; i < w->n; i++) {
        st_decl *d = &w->t[i];
        if (w->max_shard && size > 0 && size + d->nbytes > w->max_shard) {
            shard++;
            size = 0;
        }
        d->shard = shard;
        d->offset = size;
        size += d->nbytes;
    }
    w->nshards = shard + 1;
}

int mc_st_writer_num_shards(mc_st_writer *w)
{
    plan(w);
    int n = w->nshards;
    w->nshards = 0; /* still open for adds */
    return n;
}

static char *shard_path(const mc_st_writer *w, int shard)
{
    char *s = NULL;
    int r = w->nshards == 1
                ? asprintf(&s, "%s/%s", w->dir, MC_ST_SINGLE)
                : asprintf(&s, "%s/model-%05d-of-%05d.safetensors", w->dir, shard + 1, w->nshards);
    return r < 0 ? NULL : s;
}

/* Open shard k and write its header (padded with spaces to 8 bytes, as
 * the reference writer does, so the data is aligned). */
static mc_status open_shard(mc_st_writer *w, int k, mc_error *err)
{
    json_t *h = json_object();
    json_object_set(h, "__metadata__", w->meta);
    for (size_t i = 0; i < w->n; i++) {
        const st_decl *d = &w->t[i];
        if (d->shard != k) continue;
        json_t *shape = json_array();
        for (int j = 0; j < d->ndim; j++) json_array_append_new(shape, json_integer(d->shape[j]));
        json_object_set_new(h, d->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", mc_st_dtype_name(d->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)d->offset,
                                      (json_int_t)(d->offset + d->nbytes)));
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    char *path = shard_path(w, k);
    if (!text || !path) {
        free(text);
        free(path);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    size_t len = strlen(text), padded = (len + 8 + 7) / 8 * 8 - 8;
    unsigned char pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    mc_status st = mc_afile_open(&w->files[k], path, err);
    if (!st) {
        w->opened = k + 1;
        st = mc_afile_write(&w->files[k], pre, 8, err);
    }
    if (!st) st = mc_afile_write(&w->files[k], text, len, err);
    if (!st) st = mc_afile_write(&w->files[k], "        ", padded - len, err);
    free(text);
    free(path);
    return st;
}

static mc_status begin_write(mc_st_writer *w, size_t nbytes, mc_error *err)
{
    if (!w->nshards) {
        plan(w);
        if (!(w->files = calloc((size_t)w->nshards, sizeof *w->files)))
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        for (int k = 0; k < w->nshards; k++) w->files[k].fd = -1;
    }
    if (w->next >= w->n)
        return mc_error_set(err, MC_ERR_INTERNAL, "safetensors: more tensors written than added");
    const st_decl *d = &w->t[w->next];
    if (nbytes != d->nbytes)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "safetensors: tensor '%s': %zu bytes written, %" PRIu64 " declared",
                            d->name, nbytes, d->nbytes);
    if (d->shard >= w->opened) return open_shard(w, d->shard, err);
    return MC_OK;
}

mc_status mc_st_writer_write_raw(mc_st_writer *w, const void *p, size_t nbytes, mc_error *err)
{
    mc_status st = begin_write(w, nbytes, err);
    if (!st) st = mc_afile_write(&w->files[w->t[w->next].shard], p, nbytes, err);
    if (!st) w->next++;
    return st;
}

mc_status mc_st_writer_write_f32(mc_st_writer *w, const float *x, size_t n, mc_error *err)
{
    if (w->next >= w->n)
        return mc_error_set(err, MC_ERR_INTERNAL, "safetensors: more tensors written than added");
    mc_st_dtype dt = w->t[w->next].dtype;
    size_t es = mc_st_dtype_size(dt);
    mc_status st = begin_write(w, n * es, err);
    if (st) return st;
    mc_afile *f = &w->files[w->t[w->next].shard];
    if (dt == MC_ST_F32) {
        st = mc_afile_write(f, x, n * 4, err);
    } else if (dt == MC_ST_BF16 || dt == MC_ST_F16) {
        uint16_t buf[4096];
        for (size_t i = 0; i < n && !st; i += 4096) {
            size_t k = n - i < 4096 ? n - i : 4096;
            for (size_t j = 0; j < k; j++)
                buf[j] = dt == MC_ST_BF16 ? mc_dtype_f32_to_bf16(x[i + j])
                                          : mc_dtype_f32_to_f16(x[i + j]);
            st = mc_afile_write(f, buf, k * 2, err);
        }
    } else {
        st = mc_error_set(err, MC_ERR_INTERNAL, "safetensors: tensor '%s': cannot convert to %s",
                          w->t[w->next].name, mc_st_dtype_name(dt));
    }
    if (!st) w->next++;
    return st;
}

static void writer_free(mc_st_writer *w)
{
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w->files);
    json_decref(w->meta);
    free(w->dir);
    free(w);
}

void mc_st_writer_abort(mc_st_writer *w)
{
    if (!w) return;
    for (int k = 0; k < w->opened; k++) mc_afile_abort(&w->files[k]);
    writer_free(w);
}

static mc_status write_index(mc_st_writer *w, mc_error *err)
{
    uint64_t total = 0;
    json_t *wm = json_object();
    for (size_t i = 0; i < w->n; i++) {
        total += w->t[i].nbytes;
        char *p = shard_path(w, w->t[i].shard);
        json_object_set_new(wm, w->t[i].name, json_string(p ? strrchr(p, '/') + 1 : "?"));
        free(p);
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", wm);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    char *path = join(w->dir, MC_ST_INDEX);
    mc_status st = MC_OK;
    if (!text || !path) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    } else {
        mc_afile f;
        st = mc_afile_open(&f, path, err);
        if (!st) st = mc_afile_write(&f, text, strlen(text), err);
        if (!st) st = mc_afile_write(&f, "\n", 1, err);
        if (!st)
            st = mc_afile_commit(&f, err);
        else
            mc_afile_abort(&f);
    }
    free(text);
    free(path);
    return st;
}

mc_status mc_st_writer_finish(mc_st_writer *w, mc_error *err)
{
    mc_status st = MC_OK;
    if (w->n == 0)
        st = mc_error_set(err, MC_ERR_INTERNAL, "safetensors: no tensor to write");
    else if (w->next != w->n)
        st = mc_error_set(err, MC_ERR_INTERNAL, "safetensors: %zu of %zu tensors written", w->next,
                          w->n);
    int committed = 0;
    for (; committed < w->nshards && !st; committed++)
        st = mc_afile_commit(&w->files[committed], err);
    if (st) committed--; /* the failed one discarded its temporary itself */
    if (!st && w->nshards > 1) st = write_index(w, err);
    if (st) {
        /* the shards committed so far lose their final names too */
        for (int k = 0; k < committed; k++) {
            char *p = shard_path(w, k);
            if (p) unlink(p);
            free(p);
        }
        mc_st_writer_abort(w);
        return st;
    }
    writer_free(w);
    return MC_OK;
}
