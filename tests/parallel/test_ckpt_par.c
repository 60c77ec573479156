/*
 * test_ckpt_par.c - checkpoints written by a grid of ranks in parallel
 * (lib/ckpt/ckpt_par.c), run under mpirun by tests/tools/parallel_ckpt.bats,
 * one mode per launch:
 *
 *   test_ckpt_par write DIR TP DP ITER [zstd]   the ranks of a TP x DP grid
 *        write their slices of known global tensors; rank 0 then reads the
 *        file alone and compares every tensor with the global one, bit for bit
 *   test_ckpt_par read DIR TP DP                each rank of another grid reads
 *        its own slices and compares them
 *   test_ckpt_par fail DIR TP DP ITER R KIND    rank R misbehaves (KIND: block,
 *        abort, partial, replica, overlap, attr); every rank must get the same
 *        error, and neither the iteration directory, a temporary nor a moved
 *        latest pointer may be left; rank 0 prints "error: MESSAGE"
 *   test_ckpt_par single DIR ITER               one process, no MPI: the
 *        writer on mc_grid_single, which must not initialize MPI
 *
 * The tensors (values a function of the tensor and the global index):
 *   model/col.weight [24, 10] rows split over TP     (column-parallel)
 *   model/row.weight [10, 24] columns split over TP  (row-parallel)
 *   model/fc1.weight [24, 10] SwiGLU [gate; up]: each 12-row chunk split over TP
 *   model/norm.weight [10]    replicated: tensor-parallel rank 0 writes
 *   model/bias [10]           replicated: EVERY rank writes (the writer keeps one)
 *   optimizer/exp_avg/col.weight [24, 10] stored bfloat16 (values exact in it)
 *   model/half [12, 8]        rows split, stored float16 (exact)
 * Only data-parallel rank 0 writes the split tensors, as lib/train/state.c
 * does. Checks failing go to stderr; rank 0 prints "ok N checks on W ranks".
 */
#include <dirent.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mc/ckpt.h"
#include "mc/comm.h"
#include "mc/file.h"

static int checks, failed, my_rank;

#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        checks++;                                                                    \
        if (!(cond)) {                                                               \
            failed++;                                                                \
            fprintf(stderr, "rank %d: FAILED %s:%d: ", my_rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
        }                                                                            \
    } while (0)

enum { COL, ROW, FC1, NORM, BIAS, AVG, HALF, NT };

typedef struct tdesc {
    const char *path;
    int64_t rows, cols; /* cols 0: 1-D */
    int split;          /* 0 rows, 1 cols, -1 replicated */
    int chunks;         /* SwiGLU row chunks */
    mc_ckpt_dtype dtype;
} tdesc;

static const tdesc T[NT] = {
    {"model/col.weight", 24, 10, 0, 1, MC_CKPT_FLOAT32},
    {"model/row.weight", 10, 24, 1, 1, MC_CKPT_FLOAT32},
    {"model/fc1.weight", 24, 10, 0, 2, MC_CKPT_FLOAT32},
    {"model/norm.weight", 10, 0, -1, 1, MC_CKPT_FLOAT32},
    {"model/bias", 10, 0, -1, 1, MC_CKPT_FLOAT32},
    {"optimizer/exp_avg/col.weight", 24, 10, 0, 1, MC_CKPT_BFLOAT16},
    {"model/half", 12, 8, 0, 1, MC_CKPT_FLOAT16},
};

/* The global value of element i of tensor t: arbitrary fp32 bits, or
 * multiples of 1/16 below 2 (exact in bfloat16 and float16). */
static float value(int t, int64_t i)
{
    if (T[t].dtype != MC_CKPT_FLOAT32) return (float)((i * 37 + t * 11) % 64 - 32) / 16.0f;
    return sinf((float)i * 0.37f + (float)t) * 3.1f;
}

static int64_t ncols(int t) { return T[t].cols ? T[t].cols : 1; }

/* Rank tp of tp_size's block of chunk j: rows [r0, r0+nr) x cols [c0, c0+nc). */
static void block_of(int t, int tp, int tp_size, int j, int64_t *r0, int64_t *c0, int64_t *nr,
                     int64_t *nc)
{
    int64_t crows = T[t].rows / T[t].chunks;
    *r0 = (int64_t)j * crows;
    *c0 = 0;
    *nr = crows;
    *nc = ncols(t);
    if (T[t].split == 0) {
        *nr = crows / tp_size;
        *r0 += tp * *nr;
    } else if (T[t].split == 1) {
        *nc = ncols(t) / tp_size;
        *c0 = tp * *nc;
    }
}

static float *fill(int t, int64_t r0, int64_t c0, int64_t nr, int64_t nc)
{
    float *x = malloc((size_t)(nr * nc) * sizeof *x + 1);
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) x[r * nc + c] = value(t, (r0 + r) * ncols(t) + c0 + c);
    return x;
}

/* What this rank writes: its blocks of the tensors its grid coordinates
 * make it responsible for; `bad` selects one misbehaviour. */
static mc_status write_all(mc_ckpt_writer *w, const mc_grid *g, const char *bad, mc_error *err)
{
    mc_status st = MC_OK;
    for (int t = 0; t < NT && !st; t++) {
        if (t != BIAS && g->dp_rank != 0)
            continue; /* data-parallel replicas: rank 0 of the group writes */
        if (T[t].split < 0 && t != BIAS && g->tp_rank != 0) continue; /* tensor-parallel replicas */
        for (int j = 0; j < T[t].chunks && !st; j++) {
            int64_t r0, c0, nr, nc;
            block_of(t, g->tp_rank, g->tp, j, &r0, &c0, &nr, &nc);
            if (bad && !strcmp(bad, "partial") && t == ROW) continue;
            if (bad && !strcmp(bad, "block") && t == FC1) r0 += T[t].rows; /* outside the tensor */
            if (bad && !strcmp(bad, "overlap") && t == COL && nr > 1)
                r0 += 1; /* shifted: overlaps the next rank's block */
            float *x = fill(t, r0 < T[t].rows ? r0 : 0, c0, nr, nc);
            if (bad && !strcmp(bad, "replica") && t == BIAS) x[3] += 1.0f;
            st = mc_ckpt_write_tensor(w, T[t].path, T[t].rows, T[t].cols, r0, T[t].cols ? c0 : 0,
                                      nr, T[t].cols ? nc : 1, x, T[t].dtype, err);
            free(x);
        }
    }
    if (!st)
        st = mc_ckpt_write_int(w, "consumed_samples", bad && !strcmp(bad, "attr") ? 99 : 4096, err);
    if (!st) st = mc_ckpt_write_json(w, "config", "{\"model\": {\"hidden_size\": 10}}", err);
    static const unsigned char rng[5] = {1, 2, 3, 250, 0};
    if (!st) st = mc_ckpt_write_bytes(w, "rng", rng, sizeof rng, err);
    return st;
}

/* Read every tensor (the whole of it, or rank tp's slices) and compare. */
static void check_read(const char *dir, int tp, int tp_size)
{
    mc_error e = {0};
    mc_ckpt_reader *r = NULL;
    mc_status st = mc_ckpt_open(dir, &r, &e);
    CHECK(st == MC_OK, "open %s: %s", dir, e.msg);
    if (st) return;
    for (int t = 0; t < NT; t++) {
        mc_ckpt_dtype dt;
        int64_t rows, cols;
        st = mc_ckpt_tensor_info(r, T[t].path, &rows, &cols, &dt, &e);
        CHECK(st == MC_OK && rows == T[t].rows && cols == T[t].cols && dt == T[t].dtype,
              "%s: info: %s", T[t].path, e.msg);
        for (int j = 0; j < T[t].chunks; j++) {
            int64_t r0, c0, nr, nc;
            block_of(t, tp, tp_size, j, &r0, &c0, &nr, &nc);
            float *want = fill(t, r0, c0, nr, nc),
                  *got = calloc((size_t)(nr * nc) + 1, sizeof *got);
            st = mc_ckpt_read_tensor(r, T[t].path, T[t].rows, T[t].cols, r0, T[t].cols ? c0 : 0, nr,
                                     T[t].cols ? nc : 1, got, &e);
            CHECK(st == MC_OK, "%s: read: %s", T[t].path, e.msg);
            CHECK(!memcmp(want, got, (size_t)(nr * nc) * sizeof *got),
                  "%s chunk %d (rows %lld+%lld, cols %lld+%lld) differs bit for bit", T[t].path, j,
                  (long long)r0, (long long)nr, (long long)c0, (long long)nc);
            free(want);
            free(got);
        }
    }
    int64_t cs = 0;
    CHECK(mc_ckpt_read_int(r, "consumed_samples", &cs, &e) == MC_OK && cs == 4096,
          "consumed_samples");
    void *b = NULL;
    size_t n = 0;
    CHECK(mc_ckpt_read_bytes(r, "rng", &b, &n, &e) == MC_OK && n == 5 &&
              ((unsigned char *)b)[3] == 250,
          "rng bytes");
    free(b);
    mc_ckpt_close(r);
}

/* DIR holds nothing but iter dirs of `iters` and the pointer naming last. */
static void check_dir(const char *dir, const char *last, const char *const *iters, int n)
{
    char p[4096], *data = NULL;
    size_t len = 0;
    mc_error e = {0};
    snprintf(p, sizeof p, "%s/%s", dir, MC_CKPT_LATEST);
    CHECK(mc_read_file(p, &data, &len, &e) == MC_OK && len == strlen(last) &&
              !memcmp(data, last, len),
          "latest pointer is '%.*s', expected '%s'", (int)len, data ? data : "", last);
    free(data);
    DIR *d = opendir(dir);
    struct dirent *de;
    int seen = 0;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !strcmp(de->d_name, MC_CKPT_LATEST))
            continue;
        int known = 0;
        for (int i = 0; i < n; i++) known |= !strcmp(de->d_name, iters[i]);
        CHECK(known, "unexpected entry %s/%s", dir, de->d_name);
        seen += known;
    }
    if (d) closedir(d);
    CHECK(seen == n, "%d of %d iteration directories", seen, n);
}

static int finish(const mc_grid *g)
{
    int mine[2] = {checks, failed}, all[2] = {checks, failed};
    if (g->world > 1) MPI_Allreduce(mine, all, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g->rank == 0 && !all[1]) printf("ok %d checks on %d ranks\n", all[0], g->world);
    return all[1] ? 1 : 0;
}

static mc_status save(const char *dir, int64_t it, const mc_grid *g, int zstd, const char *bad,
                      mc_error *err)
{
    mc_ckpt_writer *w = NULL;
    mc_status st = mc_ckpt_writer_begin_grid(dir, it, g, &w, err);
    if (st) return st;
    if (zstd) mc_ckpt_writer_set_compression(w, MC_CKPT_COMPRESS_ZSTD, 3, err);
    if (bad && !strcmp(bad, "abort")) {
        mc_ckpt_writer_abort(w);
        return mc_error_set(err, MC_ERR_USAGE, "aborted by the test");
    }
    st = write_all(w, g, bad, err);
    if (st) {
        mc_ckpt_writer_abort(w); /* collective: the others' commit fails */
        return st;
    }
    return mc_ckpt_writer_commit(w, err);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_ckpt_par write|read|fail|single DIR ...\n");
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2];
    mc_grid g;
    mc_error e = {0};
    if (!strcmp(mode, "single")) {
        mc_grid_single(&g);
        mc_status st = save(dir, atoll(argv[3]), &g, 0, NULL, &e);
        CHECK(st == MC_OK, "single save: %s", e.msg);
        int init = 1;
        MPI_Initialized(&init);
        CHECK(!init, "the one-process writer initialized MPI");
        check_read(dir, 0, 1);
        return finish(&g);
    }
    if (argc < 5) return 2;
    int tp = atoi(argv[3]);
    if (mc_grid_init_mpi(&argc, &argv, tp, 1, 1, 1, &g, &e)) {
        if (g.rank == 0) fprintf(stderr, "test_ckpt_par: error: %s\n", e.msg);
        return mc_grid_fail(&g, 1);
    }
    my_rank = g.rank;
    CHECK(g.dp == atoi(argv[4]), "data-parallel size %d, expected %s", g.dp, argv[4]);
    mc_grid_set_timeout(&g, 1.0, "test_ckpt_par", &e);
    if (!strcmp(mode, "write") && argc >= 6) {
        int zstd = argc > 6 && !strcmp(argv[6], "zstd");
        mc_status st = save(dir, atoll(argv[5]), &g, zstd, NULL, &e);
        CHECK(st == MC_OK, "save: %s", e.msg);
        MPI_Barrier(MPI_COMM_WORLD);
        if (g.rank == 0) check_read(dir, 0, 1); /* alone: the global tensors */
    } else if (!strcmp(mode, "read")) {
        check_read(dir, g.tp_rank, g.tp);
    } else if (!strcmp(mode, "fail") && argc >= 8) {
        int bad_rank = atoi(argv[6]);
        const char *kind = argv[7];
        /* First a good checkpoint, then the failing one. */
        mc_status st = save(dir, 1, &g, 0, NULL, &e);
        CHECK(st == MC_OK, "first save: %s", e.msg);
        st = save(dir, atoll(argv[5]), &g, 0, g.rank == bad_rank ? kind : NULL, &e);
        CHECK(st != MC_OK, "the failing save succeeded");
        /* The same message on every rank (the misbehaving rank's own error
         * may differ where it failed before commit: block, abort). */
        char msg0[MC_ERROR_MSG_MAX];
        memcpy(msg0, e.msg, sizeof msg0);
        MPI_Bcast(msg0, sizeof msg0, MPI_CHAR, bad_rank == 0 ? 1 : 0, MPI_COMM_WORLD);
        if (g.rank != bad_rank)
            CHECK(!strcmp(msg0, e.msg), "message '%s' differs from '%s'", e.msg, msg0);
        MPI_Barrier(MPI_COMM_WORLD);
        if (g.rank == 0) {
            static const char *const iters[] = {"iter_0000001"};
            check_dir(dir, "1\n", iters, 1);
            check_read(dir, 0, 1);
        }
        if (g.rank == (bad_rank == 0 ? 1 : 0)) printf("error: %s\n", e.msg);
    } else {
        fprintf(stderr, "test_ckpt_par: bad mode or arguments\n");
        failed++;
    }
    int rc = finish(&g);
    mc_grid_finalize(&g);
    return rc;
}
