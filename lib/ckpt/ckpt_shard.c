/*
 * ckpt_shard.c - checkpoints pre-split for a grid (mc-reshard
 * --target-tensor-parallel-size / --target-pipeline-parallel-size): the
 * back end of ckpt_write.c's sharded writer (the split, the shard files,
 * the index) and of ckpt_read.c for sharded checkpoints (ck_shard_reader).
 * Layout in mc-formats(5), "Sharded checkpoints"; the split and the reader in
 * doc/ARCHITECTURE.md, "Checkpoints".
 */
#include "config.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/h5zstd.h"

/* ================================================================ the split */

struct ck_shard_writer {
    int tp, pp;
    int untied, swiglu;
    int *first, *last; /* layers of each stage */
    hid_t *fid;        /* file p * tp + t */
    char **tmpfile;
    json_t *tensors;
};

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int layer_of(const char *name)
{
    int L, n = 0;
    if (sscanf(name, "decoder.layers.%d.%n", &L, &n) == 1 && n > 0) return L;
    return -1;
}

static int stage_holds(const ck_shard_writer *s, const char *name, int p)
{
    int L = layer_of(name);
    if (L >= 0) return s->first[p] <= L && L < s->last[p];
    if (!strncmp(name, "embedding.", 10))
        return p == 0 ||
               (p == s->pp - 1 && !s->untied && !strcmp(name, "embedding.word_embeddings.weight"));
    if (!strncmp(name, "decoder.final_layernorm", 23) || !strncmp(name, "output_layer.", 13))
        return p == s->pp - 1;
    return p == 0;
}

/* 0 replicated, 1 by rows, 2 by columns; *chunks for row splits. */
static int split_of(const ck_shard_writer *s, const char *name, int *chunks)
{
    *chunks = 1;
    /* a MoE layer's router, experts and shared experts: replicated over
     * tensor parallelism, the experts' global [E x rows, cols] tensors whole */
    if (strstr(name, ".mlp.router.") || strstr(name, ".mlp.experts.") ||
        strstr(name, ".mlp.shared_experts."))
        return 0;
    if (ends_with(name, ".linear_fc1.weight") || ends_with(name, ".linear_fc1.bias")) {
        *chunks = s->swiglu ? 2 : 1;
        return 1;
    }
    if (ends_with(name, ".linear_qkv.weight") || ends_with(name, ".linear_qkv.bias") ||
        !strcmp(name, "embedding.word_embeddings.weight") || !strcmp(name, "output_layer.weight"))
        return 1;
    if (ends_with(name, ".linear_proj.weight") || ends_with(name, ".linear_fc2.weight")) return 2;
    return 0;
}

void ck_shard_free(ck_shard_writer *s)
{
    if (!s) return;
    int n = s->tp * s->pp;
    for (int i = 0; i < n; i++) {
        if (s->fid) ck_close(&s->fid[i]);
        if (s->tmpfile) free(s->tmpfile[i]);
    }
    free(s->fid);
    free(s->tmpfile);
    free(s->first);
    free(s->last);
    json_decref(s->tensors);
    free(s);
}

static mc_status shard_files(mc_ckpt_writer *w, ck_shard_writer *s, int64_t iteration,
                             mc_error *err)
{
    int n = s->tp * s->pp;
    mc_status st = MC_OK;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) < 0)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot set up the shard files", w->final);
    for (int i = 0; i < n && !st; i++) {
        int t = i % s->tp, p = i / s->tp;
        char where[512];
        snprintf(where, sizeof where, "%s/mp_rank_%02d_%03d.h5", w->final, t, p);
        if (!(s->tmpfile[i] = mc_strprintf("%s/mp_rank_%02d_%03d.h5", w->tmp, t, p))) {
            st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
            break;
        }
        if ((s->fid[i] = H5Fcreate(s->tmpfile[i], H5F_ACC_EXCL, H5P_DEFAULT, fapl)) < 0) {
            st = ck_h5fail(err, MC_ERR_IO, "%s: cannot create the HDF5 file", where);
            break;
        }
        if ((st = ck_write_header(s->fid[i], iteration, err, where)) != MC_OK ||
            (st = ck_write_str_attr(s->fid[i], "layout", "shard", err, where)) != MC_OK ||
            (st = ck_write_int_attr(s->fid[i], "tensor_parallel_rank", t, err, where)) != MC_OK ||
            (st = ck_write_int_attr(s->fid[i], "pipeline_parallel_rank", p, err, where)) != MC_OK ||
            (st = ck_write_int_attr(s->fid[i], "tensor_parallel_size", s->tp, err, where)) !=
                MC_OK ||
            (st = ck_write_int_attr(s->fid[i], "pipeline_parallel_size", s->pp, err, where)) !=
                MC_OK)
            break;
    }
    ck_close(&fapl);
    return st;
}

mc_status ck_shard_new(const char *dir, int tp, int pp, const mc_model_config *model,
                       ck_shard_writer **out, mc_error *err)
{
    *out = NULL;
    if (tp < 1 || pp < 1 || tp > 1024 || pp > 1024)
        return mc_error_set(err, MC_ERR_USAGE,
                            "sharded checkpoint: grid %d x %d out of range [1, 1024]", tp, pp);
    if (!model)
        return mc_error_set(err, MC_ERR_USAGE,
                            "sharded checkpoint: the model configuration is needed to split it");
    mc_model_config c = *model;
    mc_status st = mc_model_config_finish(&c, tp, err);
    if (st) return mc_error_prefix(err, "tensor-parallel size %d", tp);
    ck_shard_writer *s = calloc(1, sizeof *s);
    int n = tp * pp;
    if (!s || !(s->fid = malloc((size_t)n * sizeof *s->fid)) ||
        !(s->tmpfile = calloc((size_t)n, sizeof *s->tmpfile)) ||
        !(s->first = calloc((size_t)pp, sizeof(int))) ||
        !(s->last = calloc((size_t)pp, sizeof(int))) || !(s->tensors = json_object())) {
        if (s && !s->fid) s->tp = s->pp = 0;
        ck_shard_free(s);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    }
    for (int i = 0; i < n; i++) s->fid[i] = -1;
    s->tp = tp;
    s->pp = pp;
    s->untied = c.untie_embeddings_and_output_weights;
    s->swiglu = c.swiglu;
    for (int p = 0; p < pp && !st; p++)
        if ((st = mc_model_stage_layers(&c, pp, p, &s->first[p], &s->last[p], err)) != MC_OK)
            mc_error_prefix(err, "pipeline-parallel size %d", pp);
    if (st) {
        ck_shard_free(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

mc_status ck_shard_begin(mc_ckpt_writer *w, mc_error *err)
{
    ck_shard_writer *s = w->shard;
    mc_status st;
    if ((st = ck_write_str_attr(w->fid, "layout", "sharded", err, w->final_file)) == MC_OK &&
        (st = ck_write_int_attr(w->fid, "tensor_parallel_size", s->tp, err, w->final_file)) ==
            MC_OK &&
        (st = ck_write_int_attr(w->fid, "pipeline_parallel_size", s->pp, err, w->final_file)) ==
            MC_OK)
        st = shard_files(w, s, w->iteration, err);
    return st;
}

/* The "blocks" attribute of a shard dataset: int64 [n, 5] rows of
 * (row0, col0, rows, cols, local_row0) in the global tensor. */
static mc_status blocks_attr(hid_t fid, const char *path, const int64_t *b, int n,
                             const char *where, mc_error *err)
{
    hsize_t dims[2] = {(hsize_t)n, 5};
    hid_t ds = H5Dopen2(fid, path, H5P_DEFAULT), sp = H5Screate_simple(2, dims, NULL), a = -1;
    mc_status st = MC_OK;
    if (ds < 0 || sp < 0 ||
        (a = H5Acreate2(ds, "blocks", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        H5Awrite(a, H5T_NATIVE_INT64, b) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: %s: attribute blocks: write failed", where, path);
    ck_close(&a);
    ck_close(&sp);
    ck_close(&ds);
    return st;
}

/* Write the float local tensor (rows rg, columns [c0, c0 + nc)) of host. */
static mc_status write_float_local(hid_t fid, const char *where, const char *path,
                                   const float *host, int64_t cols, const ck_range *rg, int nrg,
                                   int64_t c0, int64_t nc, mc_ckpt_dtype dtype,
                                   mc_ckpt_compression comp, int level, mc_error *err)
{
    int64_t lrows = 0, w = cols ? cols : 1;
    for (int i = 0; i < nrg; i++) lrows += rg[i].rows;
    size_t n = (size_t)(lrows * nc);
    float *loc = malloc(n * sizeof *loc);
    void *conv = malloc(n * ck_dtype_size(dtype));
    mc_status st = MC_OK;
    hid_t mt = -1, ds = -1;
    if (!loc || !conv) {
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", where, path);
        goto done;
    }
    int64_t lr = 0;
    for (int i = 0; i < nrg; i++)
        for (int64_t r = rg[i].row0; r < rg[i].row0 + rg[i].rows; r++, lr++)
            memcpy(loc + lr * nc, host + r * w + c0, (size_t)nc * sizeof *loc);
    ck_convert(dtype, loc, n, conv);
    if ((st = ck_create_tensor(fid, where, path, lrows, cols ? nc : 0, dtype, comp, level, err)) !=
        MC_OK)
        goto done;
    if ((mt = ck_mem_type(dtype)) < 0 || (ds = H5Dopen2(fid, path, H5P_DEFAULT)) < 0 ||
        H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, conv) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: %s: write failed", where, path);
done:
    ck_close(&ds);
    ck_close(&mt);
    free(loc);
    free(conv);
    return st;
}

mc_status ck_shard_write_whole(mc_ckpt_writer *w, const char *path, int64_t rows, int64_t cols,
                               const float *host, mc_ckpt_dtype dtype, int64_t group_size,
                               mc_error *err)
{
    ck_shard_writer *s = w->shard;
    char where[512];
    snprintf(where, sizeof where, "%s: %s", w->final_file, path);
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    int chunks, how = split_of(s, name, &chunks);
    if (how == 1 && rows % ((int64_t)chunks * s->tp))
        return mc_error_set(
            err, MC_ERR_USAGE, "%s: %" PRId64 " rows do not split into %d equal parts%s", where,
            rows, chunks * s->tp, chunks > 1 ? " (two chunks over the tensor ranks)" : "");
    if (how == 2 && (cols == 0 || cols % s->tp))
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: %" PRId64 " columns do not split into %d equal parts", where, cols,
                            s->tp);
    ck_qtensor qt = {0};
    mc_status st = MC_OK;
    if (mc_ckpt_dtype_is_quantized(dtype) &&
        (st = ck_quantize(where, host, rows, cols, dtype, group_size, &qt, err)) != MC_OK)
        return st;
    json_t *blocks = json_array();
    int placed = 0;
    for (int p = 0; p < s->pp && !st; p++) {
        if (!stage_holds(s, name, p)) continue;
        for (int t = 0; t < s->tp && !st; t++) {
            ck_range rg[2];
            int nrg = 1;
            int64_t c0 = 0, nc = cols ? cols : 1;
            rg[0].row0 = 0;
            rg[0].rows = rows;
            if (how == 1) {
                int64_t cr = rows / chunks, per = cr / s->tp;
                nrg = chunks;
                for (int j = 0; j < chunks; j++) {
                    rg[j].row0 = j * cr + t * per;
                    rg[j].rows = per;
                }
            } else if (how == 2) {
                nc = cols / s->tp;
                c0 = t * nc;
            }
            int f = p * s->tp + t;
            char fwhere[512];
            snprintf(fwhere, sizeof fwhere, "%s/mp_rank_%02d_%03d.h5", w->final, t, p);
            if (qt.q)
                st = ck_write_quant_local(s->fid[f], fwhere, path, &qt, rg, nrg, c0, nc, w->comp,
                                          w->level, err);
            else
                st = write_float_local(s->fid[f], fwhere, path, host, cols, rg, nrg, c0, nc, dtype,
                                       w->comp, w->level, err);
            int64_t b[10], lr = 0;
            for (int j = 0; j < nrg; j++) {
                int64_t *e = b + 5 * j;
                e[0] = rg[j].row0, e[1] = c0, e[2] = rg[j].rows, e[3] = nc, e[4] = lr;
                lr += rg[j].rows;
                json_array_append_new(blocks, json_pack("[i, I, I, I, I, I]", f, (json_int_t)e[0],
                                                        (json_int_t)e[1], (json_int_t)e[2],
                                                        (json_int_t)e[3], (json_int_t)e[4]));
            }
            if (!st) st = blocks_attr(s->fid[f], path, b, nrg, fwhere, err);
            placed = 1;
        }
    }
    ck_qtensor_free(&qt);
    if (!st && !placed) st = mc_error_set(err, MC_ERR_INTERNAL, "%s: no shard holds it", where);
    if (st) {
        json_decref(blocks);
        return st;
    }
    json_t *shape = cols ? json_pack("[I, I]", (json_int_t)rows, (json_int_t)cols)
                         : json_pack("[I]", (json_int_t)rows);
    json_t *e = json_pack("{s:o, s:s, s:o}", "shape", shape, "dtype", mc_ckpt_dtype_name(dtype),
                          "blocks", blocks);
    if (!e || json_object_set_new(s->tensors, path, e))
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
    return MC_OK;
}

mc_status ck_shard_finish(mc_ckpt_writer *w, mc_error *err)
{
    ck_shard_writer *s = w->shard;
    json_t *files = json_array();
    for (int i = 0; i < s->tp * s->pp; i++)
        json_array_append_new(files, json_sprintf("mp_rank_%02d_%03d.h5", i % s->tp, i / s->tp));
    json_t *ix = json_pack("{s:i, s:i, s:o, s:O}", "tensor_parallel_size", s->tp,
                           "pipeline_parallel_size", s->pp, "files", files, "tensors", s->tensors);
    char *text = ix ? json_dumps(ix, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(ix);
    if (!text) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->final_file);
    mc_status st = ck_write_bytes(w->fid, w->final_file, CK_INDEX_DATASET, text, strlen(text), err);
    free(text);
    for (int i = 0; i < s->tp * s->pp && !st; i++) {
        herr_t e = H5Fclose(s->fid[i]);
        s->fid[i] = -1;
        if (e < 0)
            st = ck_h5fail(err, MC_ERR_IO, "%s: closing a shard file failed", s->tmpfile[i]);
        else
            st = mc_fsync_path(s->tmpfile[i], err);
    }
    return st;
}

/* ================================================================ reading */

typedef struct sblock {
    int file;
    int64_t row0, col0, rows, cols, lrow0;
} sblock;

typedef struct stensor {
    char *path;
    int64_t rows, cols;
    mc_ckpt_dtype dtype;
    sblock *b;
    int nb;
} stensor;

struct ck_shard_reader {
    char *index_file;
    int64_t iteration;
    int tp, pp, nfiles;
    char **files;                /* full paths */
    const ck_manifest *manifest; /* the reader's (NULL: none, or not verifying) */
    hid_t *fid;                  /* -1 until first needed */
    int prefer;                  /* the file of the reading rank (-1: none named) */
    stensor *t;
    size_t nt;
};

void ck_shard_reader_grid(const ck_shard_reader *s, int *tp, int *pp)
{
    *tp = s->tp;
    *pp = s->pp;
}

void ck_shard_reader_prefer(ck_shard_reader *s, int tp_rank, int pp_rank)
{
    /* files are named mp_rank_TT_PPP.h5 at index p * tp + t */
    s->prefer = tp_rank >= 0 && tp_rank < s->tp && pp_rank >= 0 && pp_rank < s->pp
                    ? pp_rank * s->tp + tp_rank
                    : -1;
}

void ck_shard_reader_close(ck_shard_reader *s)
{
    if (!s) return;
    for (int i = 0; i < s->nfiles; i++) {
        if (s->fid) ck_close(&s->fid[i]);
        if (s->files) free(s->files[i]);
    }
    for (size_t i = 0; i < s->nt; i++) {
        free(s->t[i].path);
        free(s->t[i].b);
    }
    free(s->t);
    free(s->fid);
    free(s->files);
    free(s->index_file);
    free(s);
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const stensor *)a)->path, ((const stensor *)b)->path);
}

static const stensor *find(const ck_shard_reader *s, const char *path)
{
    stensor key = {.path = (char *)path};
    return s->nt ? bsearch(&key, s->t, s->nt, sizeof *s->t, cmp_tensor) : NULL;
}

static int same_region(const sblock *a, const sblock *b)
{
    return a->row0 == b->row0 && a->col0 == b->col0 && a->rows == b->rows && a->cols == b->cols;
}

/* The distinct regions of t's blocks must tile it: inside, disjoint, and
 * covering every element. The numbers come from the file: every sum and
 * product is checked for overflow. */
static int tiles(const stensor *t)
{
    int64_t w = t->cols ? t->cols : 1, area = 0, whole, end_r, end_c, a_n;
    if (__builtin_mul_overflow(t->rows, w, &whole)) return 0;
    for (int i = 0; i < t->nb; i++) {
        const sblock *a = &t->b[i];
        if (a->rows < 1 || a->cols < 1 || a->row0 < 0 || a->col0 < 0 ||
            __builtin_add_overflow(a->row0, a->rows, &end_r) ||
            __builtin_add_overflow(a->col0, a->cols, &end_c) || end_r > t->rows || end_c > w)
            return 0;
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) dup = same_region(a, &t->b[j]);
        if (dup) continue;
        for (int j = 0; j < i; j++) {
            const sblock *b = &t->b[j];
            if (!same_region(a, b) && a->row0 < b->row0 + b->rows && b->row0 < end_r &&
                a->col0 < b->col0 + b->cols && b->col0 < end_c)
                return 0;
        }
        if (__builtin_mul_overflow(a->rows, a->cols, &a_n) ||
            __builtin_add_overflow(area, a_n, &area))
            return 0;
    }
    return area == whole;
}

/* Bytes per element of a stored dtype, rounded up (int4: 1). */
static int64_t stored_size(mc_ckpt_dtype d)
{
    return d == MC_CKPT_FLOAT32 ? 4 : d == MC_CKPT_BFLOAT16 || d == MC_CKPT_FLOAT16 ? 2 : 1;
}

static mc_status parse_index(ck_shard_reader *s, const char *dir, const json_t *ix, mc_error *err)
{
    const char *F = s->index_file;
    json_t *files = json_object_get(ix, "files"), *tensors = json_object_get(ix, "tensors");
    json_t *jtp = json_object_get(ix, "tensor_parallel_size"),
           *jpp = json_object_get(ix, "pipeline_parallel_size");
    if (!json_is_array(files) || !json_is_object(tensors) || !json_is_integer(jtp) ||
        !json_is_integer(jpp) || json_array_size(files) < 1 || json_array_size(files) > 1u << 20)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: " CK_INDEX_DATASET ": needs files, tensors and the grid", F);
    s->tp = (int)json_integer_value(jtp);
    s->pp = (int)json_integer_value(jpp);
    s->nfiles = (int)json_array_size(files);
    s->files = calloc((size_t)s->nfiles, sizeof *s->files);
    s->fid = malloc((size_t)s->nfiles * sizeof *s->fid);
    s->t = calloc(json_object_size(tensors) + 1, sizeof *s->t);
    if (!s->files || !s->fid || !s->t) {
        if (s->fid) s->nfiles = 0; /* nothing to close yet */
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", F);
    }
    for (int i = 0; i < s->nfiles; i++) {
        s->fid[i] = -1;
        const char *name = json_string_value(json_array_get(files, (size_t)i));
        if (!name || !*name || strchr(name, '/') || name[0] == '.')
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: " CK_INDEX_DATASET ": file %d is not a plain file name", F, i);
        if (!(s->files[i] = mc_strprintf("%s/%s", dir, name)))
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", F);
    }
    const char *path;
    json_t *e;
    json_object_foreach(tensors, path, e)
    {
        stensor *t = &s->t[s->nt];
        json_t *shape = json_object_get(e, "shape"), *blocks = json_object_get(e, "blocks");
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        if (!(t->path = strdup(path)))
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", F);
        s->nt++;
        size_t nd = json_array_size(shape);
        int dtype_ok = 0;
        for (int d = MC_CKPT_FLOAT32; d <= MC_CKPT_INT4; d++)
            if (dt && !strcmp(dt, mc_ckpt_dtype_name((mc_ckpt_dtype)d))) {
                t->dtype = (mc_ckpt_dtype)d;
                dtype_ok = 1;
            }
        if (!ck_valid_path(path) || nd < 1 || nd > 2 || !dtype_ok || !json_is_array(blocks) ||
            json_array_size(blocks) < 1 || json_array_size(blocks) > 1u << 16)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: " CK_INDEX_DATASET ": %s: needs shape, dtype and blocks", F,
                                path);
        t->rows = json_integer_value(json_array_get(shape, 0));
        t->cols = nd == 2 ? json_integer_value(json_array_get(shape, 1)) : 0;
        t->nb = (int)json_array_size(blocks);
        if (!(t->b = calloc((size_t)t->nb, sizeof *t->b)))
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", F);
        for (int i = 0; i < t->nb; i++) {
            json_t *b = json_array_get(blocks, (size_t)i);
            int64_t v[6];
            int ok = json_array_size(b) == 6;
            for (int k = 0; k < 6 && ok; k++) {
                json_t *x = json_array_get(b, (size_t)k);
                ok = json_is_integer(x) && json_integer_value(x) >= 0;
                v[k] = ok ? json_integer_value(x) : 0;
            }
            if (!ok || v[0] >= s->nfiles)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s: " CK_INDEX_DATASET ": %s: block %d is not "
                                    "[file, row0, col0, rows, cols, local_row0]",
                                    F, path, i);
            t->b[i] = (sblock){(int)v[0], v[1], v[2], v[3], v[4], v[5]};
        }
        if (t->rows < 1 || t->cols < 0 || !tiles(t))
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: " CK_INDEX_DATASET ": %s: its blocks do not tile "
                                "the tensor",
                                F, path);
        /* The index's shapes are what a loader allocates for: each block
         * must fit in its file (with zstd, CK_ZSTD_MAX_RATIO times it)
         * before anything is. A file that is not there fails when read. */
        for (int i = 0; i < t->nb; i++) {
            const sblock *b = &t->b[i];
            struct stat sb;
            uint64_t need, cap;
            if (stat(s->files[b->file], &sb) != 0) continue;
            if (__builtin_mul_overflow((uint64_t)b->rows, (uint64_t)b->cols, &need) ||
                __builtin_mul_overflow(need, (uint64_t)stored_size(t->dtype), &need))
                need = UINT64_MAX;
            if (__builtin_mul_overflow((uint64_t)sb.st_size, (uint64_t)CK_ZSTD_MAX_RATIO, &cap))
                cap = UINT64_MAX;
            if (need > cap)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s: " CK_INDEX_DATASET ": %s: block %d needs %" PRIu64
                                    " bytes, more than %s can hold (%lld bytes)",
                                    F, path, i, need, s->files[b->file], (long long)sb.st_size);
        }
    }
    qsort(s->t, s->nt, sizeof *s->t, cmp_tensor);
    return MC_OK;
}

mc_status ck_shard_reader_open(hid_t fid, const char *index_file, const char *dir,
                               const ck_manifest *manifest, ck_shard_reader **out, mc_error *err)
{
    *out = NULL;
    ck_shard_reader *s = calloc(1, sizeof *s);
    if (!s || !(s->index_file = strdup(index_file))) {
        free(s);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", index_file);
    }
    s->prefer = -1;
    s->manifest = manifest;
    mc_status st = ck_read_int_attr(fid, "iteration", &s->iteration, err, index_file);
    hid_t ds = -1, sp = -1;
    char *text = NULL;
    if (!st && ck_exists(fid, CK_INDEX_DATASET) <= 0)
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: layout sharded but no " CK_INDEX_DATASET,
                          index_file);
    if (!st) {
        ds = H5Dopen2(fid, CK_INDEX_DATASET, H5P_DEFAULT);
        sp = ds >= 0 ? H5Dget_space(ds) : -1;
        hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
        if (n < 1 || !(text = malloc((size_t)n + 1)) ||
            H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, text) < 0) {
            st = ck_h5fail(err, MC_ERR_FORMAT, "%s: " CK_INDEX_DATASET ": read failed", index_file);
        } else {
            json_error_t je;
            json_t *ix = json_loadb(text, (size_t)n, 0, &je);
            if (!ix)
                st = mc_error_set(err, MC_ERR_FORMAT, "%s: " CK_INDEX_DATASET ": byte %d: %s",
                                  index_file, je.position, je.text);
            else
                st = parse_index(s, dir, ix, err);
            json_decref(ix);
        }
    }
    free(text);
    ck_close(&sp);
    ck_close(&ds);
    if (st) {
        ck_shard_reader_close(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

int ck_shard_reader_has(const ck_shard_reader *s, const char *path)
{
    return find(s, path) != NULL;
}

mc_status ck_shard_reader_info(const ck_shard_reader *s, const char *path, int64_t *rows,
                               int64_t *cols, mc_ckpt_dtype *dtype, mc_error *err)
{
    if (!ck_valid_path(path))
        return mc_error_set(err, MC_ERR_USAGE, "%s: %s: invalid tensor path", s->index_file,
                            path ? path : "(null)");
    const stensor *t = find(s, path);
    if (!t)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: %s: no such tensor in the checkpoint",
                            s->index_file, path);
    *rows = t->rows;
    *cols = t->cols;
    *dtype = t->dtype;
    return MC_OK;
}

static mc_status open_file(ck_shard_reader *s, int f, mc_error *err)
{
    if (s->fid[f] >= 0) return MC_OK;
    const char *F = s->files[f];
    /* HDF5 does not defend itself against a damaged file: check it first. */
    mc_status sum = ck_manifest_check(s->manifest, F, err);
    if (sum != MC_OK) return sum;
    hid_t id = H5Fopen(F, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0) return ck_h5fail(err, MC_ERR_FORMAT, "%s: cannot open this shard", F);
    char *fmt = NULL, *layout = NULL;
    int64_t it = -1;
    mc_status st;
    if ((st = ck_read_str_attr(id, "mc_format", &fmt, err, F)) == MC_OK &&
        (st = ck_read_str_attr(id, "layout", &layout, err, F)) == MC_OK &&
        (st = ck_read_int_attr(id, "iteration", &it, err, F)) == MC_OK &&
        (strcmp(fmt, CK_FORMAT_NAME) || strcmp(layout, "shard") || it != s->iteration))
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: not a shard of iteration %" PRId64 " of %s", F,
                          s->iteration, s->index_file);
    free(fmt);
    free(layout);
    if (st) {
        ck_close(&id);
        return st;
    }
    s->fid[f] = id;
    return MC_OK;
}

mc_status ck_shard_reader_read(ck_shard_reader *s, const char *path, int64_t row0, int64_t col0,
                               int64_t lrows, int64_t lcols, float *out, mc_error *err)
{
    const stensor *t = find(s, path);
    if (!t)
        return mc_error_set(err, MC_ERR_NOTFOUND, "%s: %s: no such tensor in the checkpoint",
                            s->index_file, path);
    if (lrows == 0 || lcols == 0) return MC_OK;
    float *tmp = NULL;
    size_t cap = 0;
    mc_status st = MC_OK;
    for (int i = 0; i < t->nb && !st; i++) {
        const sblock *b = &t->b[i];
        int first = 1;
        for (int j = 0; j < i && first; j++) first = !same_region(b, &t->b[j]);
        if (!first) continue; /* this region was read from an earlier replica */
        int64_t r0 = b->row0 > row0 ? b->row0 : row0, c0 = b->col0 > col0 ? b->col0 : col0;
        int64_t r1 = b->row0 + b->rows < row0 + lrows ? b->row0 + b->rows : row0 + lrows;
        int64_t c1 = b->col0 + b->cols < col0 + lcols ? b->col0 + b->cols : col0 + lcols;
        if (r0 >= r1 || c0 >= c1) continue;
        /* Of the replicas of this region: the reading rank's own file,
         * else one already open, else the first. */
        const sblock *use = b, *open_one = NULL;
        for (int j = i; j < t->nb; j++) {
            if (!same_region(b, &t->b[j])) continue;
            if (t->b[j].file == s->prefer) {
                open_one = &t->b[j];
                break;
            }
            if (!open_one && s->fid[t->b[j].file] >= 0) open_one = &t->b[j];
        }
        if (open_one) use = open_one;
        if ((st = open_file(s, use->file, err)) != MC_OK) break;
        size_t n = (size_t)((r1 - r0) * (c1 - c0));
        if (n > cap) {
            float *nt = realloc(tmp, n * sizeof *tmp);
            if (!nt) {
                st = mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", s->index_file, path);
                break;
            }
            tmp = nt;
            cap = n;
        }
        st = ck_read_block(s->fid[use->file], s->files[use->file], path,
                           use->lrow0 + (r0 - use->row0), t->cols ? c0 - use->col0 : 0, r1 - r0,
                           t->cols ? c1 - c0 : 1, tmp, err);
        for (int64_t r = r0; r < r1 && !st; r++)
            memcpy(out + (r - row0) * lcols + (c0 - col0), tmp + (r - r0) * (c1 - c0),
                   (size_t)(c1 - c0) * sizeof *out);
    }
    free(tmp);
    return st;
}

mc_status ck_shard_reader_list(const ck_shard_reader *s, const char *group, mc_buf *buf, size_t *n,
                               mc_error *err)
{
    size_t gl = strlen(group);
    *n = 0;
    for (size_t i = 0; i < s->nt; i++) {
        const char *p = s->t[i].path;
        if (strncmp(p, group, gl) || p[gl] != '/' || strchr(p + gl + 1, '/')) continue;
        mc_status st = mc_buf_append(buf, p + gl + 1, strlen(p + gl + 1) + 1, err);
        if (st) return st;
        (*n)++;
    }
    return MC_OK;
}
