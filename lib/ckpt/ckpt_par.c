/*
 * ckpt_par.c - the collective checkpoint writer of a grid of processes:
 * every rank writes its own blocks of the global tensors into ONE model.h5
 * through parallel HDF5 (the MPI-IO driver), so the file is the same as a
 * single process would write (mc-formats(5), CHECKPOINTS). The blocks wait in
 * host memory for the collective commit, whose protocol is in
 * doc/ARCHITECTURE.md, "Checkpoints".
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/h5zstd.h"
#include "mc/buf.h"
#include "mc/comm_mpi.h"

typedef struct par_block {
    size_t tensor; /* index in the writer's table */
    int64_t row0, col0, lrows, lcols;
    void *data; /* stored form, lrows * lcols elements */
    uint64_t hash;
} par_block;

typedef struct par_attr {
    char *key;
    int is_int;
    int64_t v;
    char *text;
} par_attr;

typedef struct par_bytes {
    char *key;
    void *data;
    size_t n;
} par_bytes;

struct ck_par {
    mc_grid g; /* the writer's grid: its world does the collective work */
    int rank, size;
    par_block *b;
    size_t nb, cb;
    par_attr *a;
    size_t na, ca;
    par_bytes *y;
    size_t ny, cy;
    mc_error why; /* the first error of a writing call here: what abort tells */
};

/* ------------------------------------------------------------ agreement */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}
#define FNV_BASIS 14695981039346656037ull

/* Every rank passes its own status; all return MC_OK, or all the error of
 * the lowest failing rank as "rank R: its message". */
static mc_status status_all(ck_par *p, mc_status st, mc_error *err)
{
    return mc_grid_status_all(&p->g, st, "checkpoint", err);
}

/* ------------------------------------------------------------ begin, stash */

void ck_par_free(ck_par *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->nb; i++) free(p->b[i].data);
    for (size_t i = 0; i < p->na; i++) {
        free(p->a[i].key);
        free(p->a[i].text);
    }
    for (size_t i = 0; i < p->ny; i++) {
        free(p->y[i].key);
        free(p->y[i].data);
    }
    free(p->b);
    free(p->a);
    free(p->y);
    free(p);
}

mc_status ck_par_begin(mc_ckpt_writer *w, const mc_grid *g, mc_error *err)
{
    mc_status st = w ? MC_OK : (err && err->code ? err->code : MC_ERR_NOMEM);
    ck_par *p = w ? calloc(1, sizeof *p) : NULL;
    if (w && !p) st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->dir);
    if ((st = mc_grid_status_all(g, st, "checkpoint begin", err)) != MC_OK) {
        free(p);
        return st;
    }
    p->g = *g;
    p->rank = g->rank;
    p->size = g->world;
    w->par = p;
    /* The same directory and iteration everywhere, or the ranks would
     * write different checkpoints: every rank compares every rank's hash. */
    uint64_t h = fnv1a(fnv1a(FNV_BASIS, w->dir, strlen(w->dir)), &w->iteration,
                       sizeof w->iteration);
    unsigned char *all = NULL;
    size_t *off = NULL;
    if ((st = mc_grid_allgather_bytes(g, &h, sizeof h, "checkpoint begin", &all, &off, err)))
        return st;
    int same = 1;
    for (int r = 1; r < p->size; r++) same &= memcmp(all + off[r], all, sizeof h) == 0;
    free(all);
    free(off);
    if (!same)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: the ranks name different checkpoint directories or iterations",
                            w->dir);
    /* Rank 0 makes the temporary directory; the others learn its name
     * (the template has the same length everywhere). */
    if (p->rank == 0) {
        if ((st = ck_mkdir_p(w->dir, err)) == MC_OK) {
            mc_temp_begin(); /* before it exists: ended when the writer is freed */
            w->tmp_counted = 1;
            if (ck_make_tmpdir(w->tmp) != 0)
                st = mc_error_errno(err, MC_ERR_IO, errno,
                                    "%s: cannot create a temporary directory", w->dir);
        }
    }
    if ((st = status_all(p, st, err)) != MC_OK) {
        free(w->tmp);
        w->tmp = NULL;
        return st;
    }
    if ((st = mc_grid_broadcast_bytes(g, w->tmp, strlen(w->tmp) + 1, 0, "checkpoint begin", err)))
        return st;
    st = (w->tmp_file = mc_strprintf("%s/" MC_CKPT_FILE, w->tmp))
             ? MC_OK
             : mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->dir);
    if ((st = status_all(p, st, err)) != MC_OK && p->rank == 0) mc_remove_tree(w->tmp);
    return st;
}

#define GROW(arr, n, cap, err, where)                                                         \
    do {                                                                                      \
        if ((n) == (cap)) {                                                                   \
            size_t nc_ = (cap) ? 2 * (cap) : 16;                                              \
            void *np_ = realloc((arr), nc_ * sizeof *(arr));                                  \
            if (!np_) return mc_error_set((err), MC_ERR_NOMEM, "%s: out of memory", (where)); \
            (arr) = np_;                                                                      \
            (cap) = nc_;                                                                      \
        }                                                                                     \
    } while (0)

mc_status ck_par_stash_block(mc_ckpt_writer *w, size_t tensor, int64_t row0, int64_t col0,
                             int64_t lrows, int64_t lcols, const float *host, mc_error *err)
{
    ck_par *p = w->par;
    GROW(p->b, p->nb, p->cb, err, w->final_file);
    size_t n = (size_t)lrows * (size_t)lcols, size = n * ck_dtype_size(w->t[tensor].dtype);
    void *data = malloc(size);
    if (!data)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", w->final_file,
                            w->t[tensor].path);
    ck_convert(w->t[tensor].dtype, host, n, data);
    p->b[p->nb++] = (par_block){
        tensor, row0, col0, lrows, lcols, data, fnv1a(FNV_BASIS, data, size)};
    return MC_OK;
}

mc_status ck_par_stash_attr(mc_ckpt_writer *w, const char *key, int is_int, int64_t v,
                            const char *text, mc_error *err)
{
    ck_par *p = w->par;
    par_attr *a = NULL;
    for (size_t i = 0; i < p->na; i++)
        if (!strcmp(p->a[i].key, key))
            a = &p->a[i]; /* written again: replaced, as HDF5 attributes are */
    if (!a) {
        GROW(p->a, p->na, p->ca, err, w->final_file);
        a = &p->a[p->na];
        *a = (par_attr){strdup(key), 0, 0, NULL};
        if (!a->key) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->final_file);
        p->na++;
    }
    free(a->text);
    a->is_int = is_int;
    a->v = v;
    a->text = text ? strdup(text) : NULL;
    if (text && !a->text)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->final_file);
    return MC_OK;
}

mc_status ck_par_stash_bytes(mc_ckpt_writer *w, const char *key, const void *data, size_t n,
                             mc_error *err)
{
    ck_par *p = w->par;
    for (size_t i = 0; i < p->ny; i++)
        if (!strcmp(p->y[i].key, key))
            return mc_error_set(err, MC_ERR_USAGE, "%s: %s: name already used in the file",
                                w->final_file, key);
    GROW(p->y, p->ny, p->cy, err, w->final_file);
    par_bytes *y = &p->y[p->ny];
    y->key = strdup(key);
    y->data = malloc(n ? n : 1);
    y->n = n;
    if (!y->key || !y->data) {
        free(y->key);
        free(y->data);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->final_file);
    }
    if (n) memcpy(y->data, data, n);
    p->ny++;
    return MC_OK;
}

/* ------------------------------------------------------------ declarations */

/* One rank's declaration, as every rank sees it after the all-gather:
 *   u64 digest of the root attributes and byte datasets, u32 tensors, then
 *   per tensor: u32 path length, path, i64 rows, i64 cols, i32 dtype,
 *   u32 blocks, and per block i64 row0, col0, lrows, lcols, u64 hash. */
static mc_status declare(const mc_ckpt_writer *w, mc_buf *b, mc_error *err)
{
    const ck_par *p = w->par;
    uint64_t d = FNV_BASIS;
    for (size_t i = 0; i < p->na; i++) {
        d = fnv1a(d, p->a[i].key, strlen(p->a[i].key) + 1);
        d = p->a[i].is_int ? fnv1a(d, &p->a[i].v, sizeof p->a[i].v)
                           : fnv1a(d, p->a[i].text, strlen(p->a[i].text) + 1);
    }
    for (size_t i = 0; i < p->ny; i++) {
        d = fnv1a(d, p->y[i].key, strlen(p->y[i].key) + 1);
        d = fnv1a(fnv1a(d, &p->y[i].n, sizeof p->y[i].n), p->y[i].data, p->y[i].n);
    }
    uint32_t nt = (uint32_t)w->nt;
    mc_status st = mc_buf_append(b, &d, sizeof d, err);
    if (!st) st = mc_buf_append(b, &nt, sizeof nt, err);
    for (size_t i = 0; i < w->nt && !st; i++) {
        const ck_tensor *t = &w->t[i];
        uint32_t len = (uint32_t)strlen(t->path), nb = 0;
        int32_t dt = (int32_t)t->dtype;
        for (size_t j = 0; j < p->nb; j++) nb += p->b[j].tensor == i;
        if ((st = mc_buf_append(b, &len, sizeof len, err)) ||
            (st = mc_buf_append(b, t->path, len, err)) ||
            (st = mc_buf_append(b, &t->rows, 8, err)) ||
            (st = mc_buf_append(b, &t->cols, 8, err)) ||
            (st = mc_buf_append(b, &dt, sizeof dt, err)) ||
            (st = mc_buf_append(b, &nb, sizeof nb, err)))
            break;
        for (size_t j = 0; j < p->nb && !st; j++) {
            const par_block *k = &p->b[j];
            if (k->tensor != i) continue;
            int64_t v[4] = {k->row0, k->col0, k->lrows, k->lcols};
            if (!(st = mc_buf_append(b, v, sizeof v, err)))
                st = mc_buf_append(b, &k->hash, sizeof k->hash, err);
        }
    }
    return st;
}

/* A tensor of one rank's declaration. */
typedef struct entry {
    const char *path;
    uint32_t len;
    int64_t rows, cols;
    int32_t dtype;
    int rank;
    size_t local; /* index in that rank's table */
    uint32_t nb;
    const unsigned char *blocks; /* nb * 40 bytes */
} entry;

/* A block of the union, with where it came from. */
typedef struct ublock {
    int64_t v[4]; /* row0, col0, lrows, lcols */
    uint64_t hash;
    int rank;
    uint32_t k; /* the k-th block of that rank for this tensor */
    int kept;
} ublock;

/* A tensor of the union: what every rank creates and writes. */
typedef struct utensor {
    const entry *e;  /* the lowest rank's declaration */
    ptrdiff_t mine;  /* index in this rank's table, -1 if it holds none */
    uint32_t rounds; /* collective writes: max blocks kept on one rank */
    int *kept_mine;  /* [nb of this rank]: block k is written by this rank */
} utensor;

static int cmp_entry(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->path, y->path, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->rank - y->rank;
}

static int cmp_ublock(const void *a, const void *b)
{
    const ublock *x = a, *y = b;
    for (int i = 0; i < 4; i++)
        if (x->v[i] != y->v[i]) return x->v[i] < y->v[i] ? -1 : 1;
    return x->rank - y->rank;
}

static int overlap(const int64_t *a, const int64_t *b)
{
    return a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3];
}

static int64_t rd64(const unsigned char *p)
{
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Parse every rank's declaration (rank r's at buf[off[r] .. off[r + 1])). */
static mc_status parse(const mc_ckpt_writer *w, const unsigned char *buf, const size_t *off,
                       entry **out, size_t *n_out, mc_error *err)
{
    const ck_par *p = w->par;
    size_t n = 0, cap = 0;
    entry *e = NULL;
    uint64_t d0 = 0;
    for (int r = 0; r < p->size; r++) {
        const unsigned char *s = buf + off[r], *end = buf + off[r + 1];
        uint64_t d;
        memcpy(&d, s, 8);
        if (r == 0)
            d0 = d;
        else if (d != d0) {
            free(e);
            return mc_error_set(
                err, MC_ERR_USAGE,
                "%s: rank %d's root attributes or byte datasets differ from rank 0's "
                "(every rank writes the same ones)",
                w->final_file, r);
        }
        uint32_t nt = rd32(s + 8);
        s += 12;
        for (uint32_t i = 0; i < nt && s < end; i++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                entry *ne = realloc(e, cap * sizeof *ne);
                if (!ne) {
                    free(e);
                    return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->final_file);
                }
                e = ne;
            }
            entry *x = &e[n++];
            x->len = rd32(s);
            x->path = (const char *)s + 4;
            s += 4 + x->len;
            x->rows = rd64(s);
            x->cols = rd64(s + 8);
            x->dtype = (int32_t)rd32(s + 16);
            x->nb = rd32(s + 20);
            x->blocks = s + 24;
            x->rank = r;
            x->local = i;
            s += 24 + (size_t)x->nb * 40;
        }
    }
    qsort(e, n, sizeof *e, cmp_entry);
    *out = e;
    *n_out = n;
    return MC_OK;
}

static void free_union(utensor *u, size_t n)
{
    for (size_t i = 0; u && i < n; i++) free(u[i].kept_mine);
    free(u);
}

/* Merge the declarations (sorted by path, then rank) into the union of the
 * tensors, checked; the same on every rank. */
static mc_status merge_declarations(const mc_ckpt_writer *w, const entry *e, size_t n,
                                    utensor **out, size_t *nu_out, mc_error *err)
{
    const ck_par *p = w->par;
    utensor *u = calloc(n ? n : 1, sizeof *u);
    int *kept_per_rank = calloc((size_t)p->size, sizeof *kept_per_rank);
    ublock *ub = NULL;
    size_t nu = 0, ubcap = 0;
    mc_status st = MC_OK;
    if (!u || !kept_per_rank)
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->final_file);
    for (size_t i = 0; i < n && !st;) {
        size_t j = i;
        uint32_t nb = 0;
        while (j < n && e[j].len == e[i].len && !memcmp(e[j].path, e[i].path, e[i].len))
            nb += e[j++].nb;
        char where[512];
        snprintf(where, sizeof where, "%s: %.*s", w->final_file, (int)e[i].len, e[i].path);
        utensor *t = &u[nu++];
        t->e = &e[i];
        t->mine = -1;
        if (nb > ubcap) {
            ubcap = nb;
            free(ub);
            if (!(ub = malloc(ubcap * sizeof *ub))) {
                st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
                break;
            }
        }
        size_t m = 0;
        for (size_t q = i; q < j && !st; q++) {
            if (e[q].rows != e[i].rows || e[q].cols != e[i].cols || e[q].dtype != e[i].dtype) {
                char a[64], b[64];
                ck_shape_str(a, sizeof a, e[i].rows, e[i].cols);
                ck_shape_str(b, sizeof b, e[q].rows, e[q].cols);
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "%s: rank %d writes it as %s %s, rank %d as %s %s", where,
                                  e[i].rank, a, mc_ckpt_dtype_name((mc_ckpt_dtype)e[i].dtype),
                                  e[q].rank, b, mc_ckpt_dtype_name((mc_ckpt_dtype)e[q].dtype));
                break;
            }
            if (e[q].rank == p->rank) {
                t->mine = (ptrdiff_t)e[q].local;
                if (!(t->kept_mine = calloc(e[q].nb ? e[q].nb : 1, sizeof *t->kept_mine)))
                    st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", where);
            }
            for (uint32_t k = 0; k < e[q].nb; k++, m++) {
                const unsigned char *s = e[q].blocks + (size_t)k * 40;
                for (int c = 0; c < 4; c++) ub[m].v[c] = rd64(s + 8 * c);
                memcpy(&ub[m].hash, s + 32, 8);
                ub[m].rank = e[q].rank;
                ub[m].k = k;
                ub[m].kept = 1;
            }
        }
        if (st) break;
        /* Replicas: the same block on several ranks is written once, by the
         * lowest rank, and must be the same bits everywhere. */
        qsort(ub, m, sizeof *ub, cmp_ublock);
        int64_t count = 0, numel = e[i].rows * (e[i].cols ? e[i].cols : 1);
        size_t first = 0;
        for (size_t q = 0; q < m && !st; q++) {
            if (q > 0 && !memcmp(ub[q].v, ub[first].v, sizeof ub[q].v)) {
                ub[q].kept = 0;
                if (ub[q].hash != ub[first].hash)
                    st = mc_error_set(err, MC_ERR_USAGE,
                                      "%s: ranks %d and %d hold the same block (rows %" PRId64
                                      "+%" PRId64 ", cols %" PRId64 "+%" PRId64
                                      ") with different values",
                                      where, ub[first].rank, ub[q].rank, ub[q].v[0], ub[q].v[2],
                                      ub[q].v[1], ub[q].v[3]);
                continue;
            }
            first = q;
            count += ub[q].v[2] * ub[q].v[3];
            for (size_t o = 0; o < q && !st; o++)
                if (ub[o].kept && overlap(ub[o].v, ub[q].v))
                    st = mc_error_set(err, MC_ERR_USAGE,
                                      "%s: the blocks of rank %d (rows %" PRId64 "+%" PRId64
                                      ", cols %" PRId64 "+%" PRId64 ") and rank %d (rows %" PRId64
                                      "+%" PRId64 ", cols %" PRId64 "+%" PRId64 ") overlap",
                                      where, ub[o].rank, ub[o].v[0], ub[o].v[2], ub[o].v[1],
                                      ub[o].v[3], ub[q].rank, ub[q].v[0], ub[q].v[2], ub[q].v[1],
                                      ub[q].v[3]);
        }
        if (!st && count != numel)
            st = mc_error_set(err, MC_ERR_USAGE,
                              "%s: %" PRId64 " of %" PRId64
                              " elements written by the ranks together; "
                              "not saving a partial tensor",
                              where, count, numel);
        memset(kept_per_rank, 0, (size_t)p->size * sizeof *kept_per_rank);
        for (size_t q = 0; q < m && !st; q++) {
            if (!ub[q].kept) continue;
            if ((uint32_t)++kept_per_rank[ub[q].rank] > t->rounds)
                t->rounds = (uint32_t)kept_per_rank[ub[q].rank];
            if (ub[q].rank == p->rank) t->kept_mine[ub[q].k] = 1;
        }
        i = j;
    }
    free(ub);
    free(kept_per_rank);
    if (st) {
        free_union(u, nu);
        return st;
    }
    *out = u;
    *nu_out = nu;
    return MC_OK;
}

/* All-gather the declarations and check them: the union of the tensors. */
static mc_status gather(mc_ckpt_writer *w, entry **e, size_t *ne, utensor **u, size_t *nu,
                        unsigned char **all_out, mc_error *err)
{
    ck_par *p = w->par;
    mc_buf mine = MC_BUF_INIT;
    mc_status st = declare(w, &mine, err);
    if (!st && mine.len > INT_MAX / 2)
        st = mc_error_set(err, MC_ERR_USAGE, "%s: too many tensors on one rank", w->final_file);
    if ((st = status_all(p, st, err)) != MC_OK) {
        mc_buf_free(&mine);
        return st;
    }
    unsigned char *all = NULL;
    size_t *off = NULL;
    st = mc_grid_allgather_bytes(&p->g, mine.data, mine.len, "checkpoint declarations", &all, &off,
                                 err);
    mc_buf_free(&mine);
    /* From here every rank computes the same thing from the same bytes:
     * the checks fail on all ranks together, with the same message. */
    if (!st) st = parse(w, all, off, e, ne, err);
    if (!st && (st = merge_declarations(w, *e, *ne, u, nu, err)) != MC_OK) {
        free(*e);
        *e = NULL;
    }
    free(off);
    if (st) {
        free(all);
        return st;
    }
    *all_out = all;
    return MC_OK;
}

/* ------------------------------------------------------------ writing */

/* This rank's k-th block of its tensor ti (in the order written). */
static const par_block *own_block(const ck_par *p, size_t ti, uint32_t k)
{
    for (size_t j = 0; j < p->nb; j++)
        if (p->b[j].tensor == ti && k-- == 0) return &p->b[j];
    return NULL;
}

static mc_status write_one(mc_ckpt_writer *w, const utensor *t, hid_t dxpl, mc_error *err)
{
    ck_par *p = w->par;
    const entry *e = t->e;
    char path[512], where[600];
    snprintf(path, sizeof path, "%.*s", (int)e->len, e->path);
    snprintf(where, sizeof where, "%s: %s", w->final_file, path);
    mc_ckpt_dtype dt = (mc_ckpt_dtype)e->dtype;
    mc_status st = ck_create_tensor(w->fid, w->final_file, path, e->rows, e->cols, dt, w->comp,
                                    w->level, err);
    if (st) return st;
    hid_t ds = H5Dopen2(w->fid, path, H5P_DEFAULT), fs = -1, mt = ck_mem_type(dt);
    if (ds < 0 || mt < 0 || (fs = H5Dget_space(ds)) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: cannot open the dataset", where);
    /* Round r: every rank its r-th kept block, or an empty selection. */
    uint32_t next = 0;
    for (uint32_t r = 0; r < t->rounds && !st; r++) {
        const par_block *b = NULL;
        while (t->mine >= 0 && !b && (b = own_block(p, (size_t)t->mine, next))) {
            if (!t->kept_mine[next++]) b = NULL;
        }
        hid_t ms = -1;
        const void *data = &ms;
        if (b) {
            if (ck_block_spaces(fs, e->cols, b->row0, b->col0, b->lrows, b->lcols, &ms) != MC_OK)
                st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot select the block", where);
            data = b->data;
        } else {
            hsize_t one = 1;
            if (H5Sselect_none(fs) < 0 || (ms = H5Screate_simple(1, &one, NULL)) < 0 ||
                H5Sselect_none(ms) < 0)
                st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot select nothing", where);
        }
        if (!st && H5Dwrite(ds, mt, ms, fs, dxpl, data) < 0)
            st = ck_h5fail(err, MC_ERR_IO, "%s: write failed", where);
        ck_close(&ms);
    }
    ck_close(&fs);
    ck_close(&mt);
    ck_close(&ds);
    return st;
}

static mc_status write_bytes_all(mc_ckpt_writer *w, hid_t dxpl, mc_error *err)
{
    ck_par *p = w->par;
    mc_status st = MC_OK;
    for (size_t i = 0; i < p->ny && !st; i++) {
        const par_bytes *y = &p->y[i];
        hsize_t dims[1] = {y->n};
        hid_t sp = H5Screate_simple(1, dims, NULL), ds = -1;
        hid_t dcpl = y->n > 0 ? ck_bytes_dcpl(y->n) : H5Pcreate(H5P_DATASET_CREATE);
        if (sp < 0 || dcpl < 0 ||
            (ds = H5Dcreate2(w->fid, y->key, H5T_STD_U8LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT)) < 0)
            st = ck_h5fail(err, MC_ERR_IO, "%s: %s: cannot create the dataset", w->final_file,
                           y->key);
        /* The same bytes everywhere (checked): rank 0's are written. */
        else if (y->n > 0 && (p->rank == 0 ? H5Sselect_all(sp) : H5Sselect_none(sp)) < 0)
            st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: %s: cannot select", w->final_file, y->key);
        else if (y->n > 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, sp, sp, dxpl, y->data) < 0)
            st = ck_h5fail(err, MC_ERR_IO, "%s: %s: write failed", w->final_file, y->key);
        ck_close(&ds);
        ck_close(&dcpl);
        ck_close(&sp);
    }
    return st;
}

/* Steps 3 and 4: the file, collectively. */
static mc_status write_file(mc_ckpt_writer *w, const utensor *u, size_t nu, mc_error *err)
{
    ck_par *p = w->par;
    hid_t fapl = -1, dxpl = -1;
    mc_status st = mc_h5zstd_register(err);
    if (st) return st;
    mc_grid_deadline_begin(&p->g, "checkpoint write");
    if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
        H5Pset_fapl_mpio(fapl, mc_grid_world_comm(&p->g), MPI_INFO_NULL) < 0 ||
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) < 0 ||
        (w->fid = H5Fcreate(w->tmp_file, H5F_ACC_EXCL, H5P_DEFAULT, fapl)) < 0)
        st = ck_h5fail(err, MC_ERR_IO, "%s: cannot create the HDF5 file", w->final_file);
    else if ((dxpl = H5Pcreate(H5P_DATASET_XFER)) < 0 ||
             H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0)
        st = ck_h5fail(err, MC_ERR_INTERNAL, "%s: cannot set up collective I/O", w->final_file);
    else
        st = ck_write_header(w->fid, w->iteration, err, w->final_file);
    for (size_t i = 0; i < p->na && !st; i++)
        st = p->a[i].is_int
                 ? ck_write_int_attr(w->fid, p->a[i].key, p->a[i].v, err, w->final_file)
                 : ck_write_str_attr(w->fid, p->a[i].key, p->a[i].text, err, w->final_file);
    mc_grid_deadline_end(&p->g);
    /* One deadline per tensor: a large checkpoint is no hang. */
    for (size_t i = 0; i < nu && !st; i++) {
        mc_grid_deadline_begin(&p->g, "checkpoint write");
        st = write_one(w, &u[i], dxpl, err);
        mc_grid_deadline_end(&p->g);
    }
    mc_grid_deadline_begin(&p->g, "checkpoint write");
    if (!st) st = write_bytes_all(w, dxpl, err);
    ck_close(&dxpl);
    ck_close(&fapl);
    if (w->fid >= 0) {
        if (H5Fclose(w->fid) < 0 && !st)
            st = ck_h5fail(err, MC_ERR_IO, "%s: closing the HDF5 file failed", w->final_file);
        w->fid = -1;
    }
    mc_grid_deadline_end(&p->g);
    /* Each rank flushes what it wrote from its own node's cache. */
    if (!st) st = mc_fsync_path(w->tmp_file, err);
    return st;
}

/* ------------------------------------------------------------ commit */

static mc_status commit(mc_ckpt_writer *w, mc_status mine, mc_error *err)
{
    ck_par *p = w->par;
    entry *e = NULL;
    utensor *u = NULL;
    size_t ne = 0, nu = 0;
    unsigned char *all = NULL;
    mc_status st = status_all(p, mine, err);
    if (!st) st = gather(w, &e, &ne, &u, &nu, &all, err);
    if (!st) st = status_all(p, write_file(w, u, nu, err), err);
    free_union(u, nu);
    free(e);
    free(all);
    if (!st) {
        int gone = 0;
        mc_status s0 = MC_OK;
        if (p->rank == 0) {
            s0 = ck_publish(w->dir, w->tmp, w->final, w->iteration, &gone, err);
            if (gone) {
                free(w->tmp);
                w->tmp = NULL;
            }
        }
        st = status_all(p, s0, err);
    }
    if (st) {
        ck_close(&w->fid);
        if (p->rank == 0 && w->tmp) mc_remove_tree(w->tmp);
    }
    return st;
}

mc_status ck_par_commit(mc_ckpt_writer *w, mc_error *err)
{
    ck_quiet q;
    ck_quiet_on(&q);
    mc_status st = commit(w, MC_OK, err);
    ck_quiet_off(&q);
    return st;
}

void ck_par_note(mc_ckpt_writer *w, const mc_error *err)
{
    if (w->par && !w->par->why.code && err && err->code) w->par->why = *err;
}

void ck_par_abort(mc_ckpt_writer *w)
{
    mc_error e = w->par->why;
    if (!e.code)
        mc_error_set(&e, MC_ERR_USAGE, "%s: checkpoint abandoned after an error on that rank",
                     w->final);
    ck_quiet q;
    ck_quiet_on(&q);
    commit(w, e.code, &e);
    ck_quiet_off(&q);
}
