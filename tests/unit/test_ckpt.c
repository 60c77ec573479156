/*
 * test_ckpt.c - checkpoints (lib/ckpt/ckpt_*.c, lib/ckpt/h5zstd.c): bit-exact
 * round trips of matrices and vectors, a tensor written as two hyperslab
 * halves as two tensor-parallel ranks write it, reading a slice, bfloat16
 * and float16 storage against hand-worked roundings, zstd, the latest
 * pointer (commit, abort, an unfinished writer, a leftover temporary,
 * replacing an iteration), and every refusal with its message: shape
 * mismatch, missing tensor, partial tensor, truncated and corrupt files.
 * Interoperability with h5py/hdf5plugin/h5dump: tests/tools/ckpt_h5py.bats.
 */
#include "mc/ckpt.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"

static char root[256];

static const char *P(const char *fmt, const char *a)
{
    static char p[16][1024];
    static int k;
    k = (k + 1) & 15;
    char tail[512];
    snprintf(tail, sizeof tail, fmt, a);
    snprintf(p[k], sizeof p[k], "%s/%s", root, tail);
    return p[k];
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *d = malloc((size_t)n + 1);
    *len = fread(d, 1, (size_t)n, f);
    fclose(f);
    d[*len] = 0;
    return d;
}

static void spit(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(d, 1, n, f);
    fclose(f);
}

static int rm_cb(const char *p, const struct stat *s, int fl, struct FTW *w)
{
    (void)s, (void)fl, (void)w;
    return remove(p);
}

/* Number of hidden entries (temporaries) in a directory. */
static int hidden_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static float valf(uint32_t i, uint32_t seed)
{
    return (float)((double)(uint32_t)(i * 2654435761u + seed) / 4294967296.0 - 0.5);
}

static float *fill(size_t n, uint32_t seed)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = valf((uint32_t)i, seed);
    return v;
}

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bitsf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

#define QKV "model/decoder.layers.0.self_attention.linear_qkv.weight"
#define FC1 "model/decoder.layers.0.mlp.linear_fc1.weight"
#define PROJ "model/decoder.layers.0.self_attention.linear_proj.weight"
#define NORM "model/decoder.final_layernorm.weight"

/* The checkpoint every reading test uses: iteration 100 of root/ckpt. */
static float *qkv, *fc1, *proj, *norm, *mom;
static const char *config_json = "{\"num_layers\": 2, \"hidden_size\": 48, \"lr\": 0.0003}";
static const unsigned char rng[5] = {1, 2, 3, 250, 0};

static mc_status write_main(const char *dir, int64_t it, mc_error *err)
{
    mc_ckpt_writer *w;
    mc_status st = mc_ckpt_writer_begin(dir, it, &w, err);
    if (st) return st;
    /* qkv [5, 7] whole; fc1 [6, 4] as two row halves (column-parallel
     * ranks); proj [4, 6] as two column halves (row-parallel ranks). */
    float half[12];
    if ((st = mc_ckpt_write_tensor(w, QKV, 5, 7, 0, 0, 5, 7, qkv, MC_CKPT_FLOAT32, err)) ||
        (st = mc_ckpt_write_tensor(w, FC1, 6, 4, 3, 0, 3, 4, fc1 + 12, MC_CKPT_FLOAT32, err)) ||
        (st = mc_ckpt_write_tensor(w, FC1, 6, 4, 0, 0, 3, 4, fc1, MC_CKPT_FLOAT32, err)))
        goto fail;
    for (int rank = 0; rank < 2; rank++) {
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 3; c++) half[r * 3 + c] = proj[r * 6 + rank * 3 + c];
        if ((st = mc_ckpt_write_tensor(w, PROJ, 4, 6, 0, rank * 3, 4, 3, half, MC_CKPT_FLOAT32,
                                       err)))
            goto fail;
    }
    if ((st = mc_ckpt_write_tensor(w, NORM, 7, 0, 0, 0, 7, 0, norm, MC_CKPT_FLOAT32, err)) ||
        (st = mc_ckpt_write_tensor(w, "optimizer/exp_avg/decoder.final_layernorm.weight", 7, 0, 0,
                                   0, 7, 1, mom, MC_CKPT_FLOAT32, err)) ||
        (st = mc_ckpt_write_json(w, "config", config_json, err)) ||
        (st = mc_ckpt_write_int(w, "consumed_samples", 1600, err)) ||
        (st = mc_ckpt_write_bytes(w, "rng", rng, sizeof rng, err)))
        goto fail;
    return mc_ckpt_writer_commit(w, err);
fail:
    mc_ckpt_writer_abort(w);
    return st;
}

/* Read everything of the main checkpoint; 1 when all of it is there and
 * equal, 0 on a clean error (message in err), -1 on WRONG DATA. */
static int read_all(const char *path, mc_error *err)
{
    mc_ckpt_reader *r;
    float buf[64];
    int ok = 0;
    mc_error_clear(err);
    if (mc_ckpt_open(path, &r, err)) return 0;
    if (!mc_ckpt_read_tensor(r, QKV, 5, 7, 0, 0, 5, 7, buf, err)) {
        if (!same_bits(buf, qkv, 35)) goto wrong;
        if (!mc_ckpt_read_tensor(r, FC1, 6, 4, 0, 0, 6, 4, buf, err)) {
            if (!same_bits(buf, fc1, 24)) goto wrong;
            if (!mc_ckpt_read_tensor(r, PROJ, 4, 6, 0, 0, 4, 6, buf, err)) {
                if (!same_bits(buf, proj, 24)) goto wrong;
                if (!mc_ckpt_read_tensor(r, NORM, 7, 0, 0, 0, 7, 0, buf, err)) {
                    if (!same_bits(buf, norm, 7)) goto wrong;
                    ok = 1;
                }
            }
        }
    }
    if (ok) {
        json_t *j = NULL;
        int64_t cs = 0;
        void *b = NULL;
        size_t n = 0;
        ok = 0;
        if (!mc_ckpt_read_json(r, "config", &j, err) &&
            !mc_ckpt_read_int(r, "consumed_samples", &cs, err) &&
            !mc_ckpt_read_bytes(r, "rng", &b, &n, err)) {
            if (json_integer_value(json_object_get(j, "num_layers")) != 2 || cs != 1600 || n != 5 ||
                memcmp(b, rng, 5) != 0 || mc_ckpt_iteration(r) != 100) {
                json_decref(j);
                free(b);
                goto wrong;
            }
            ok = 1;
        }
        json_decref(j);
        free(b);
    }
    mc_ckpt_close(r);
    return ok;
wrong:
    mc_ckpt_close(r);
    return -1;
}

static void test_round_trip(void)
{
    mc_error err = {0};
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", P("%s", "ckpt"));
    TAP_OK(write_main(ck, 100, &err) == MC_OK, "write iteration 100 (%s)", err.msg);
    size_t n;
    unsigned char *latest = slurp(P("%s", "ckpt/latest_checkpointed_iteration.txt"), &n);
    TAP_OK(latest && strcmp((char *)latest, "100\n") == 0, "latest pointer reads 100");
    free(latest);
    TAP_OK(exists(P("%s", "ckpt/iter_0000100/model.h5")), "iter_0000100/model.h5 exists");
    TAP_OK(hidden_entries(ck) == 0, "no temporary left behind");

    TAP_OK(read_all(ck, &err) == 1,
           "every tensor, the config, the counters and the rng bytes read back bit for bit (%s)",
           err.msg);
    TAP_OK(read_all(P("%s", "ckpt/iter_0000100"), &err) == 1,
           "the iteration directory opens directly");
    TAP_OK(read_all(P("%s", "ckpt/iter_0000100/model.h5"), &err) == 1, "the file opens directly");

    mc_ckpt_reader *r;
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_OK, "open");
    TAP_OK(strcmp(mc_ckpt_dir(r), P("%s", "ckpt/iter_0000100")) == 0, "dir is %s", mc_ckpt_dir(r));
    int64_t rows = -1, cols = -1;
    mc_ckpt_dtype dt = MC_CKPT_BFLOAT16;
    TAP_OK(mc_ckpt_tensor_info(r, NORM, &rows, &cols, &dt, &err) == MC_OK && rows == 7 &&
               cols == 0 && dt == MC_CKPT_FLOAT32,
           "a vector is 1-D [7] float32");
    TAP_OK(mc_ckpt_tensor_info(r, FC1, &rows, &cols, NULL, &err) == MC_OK && rows == 6 && cols == 4,
           "fc1 is [6, 4]");
    /* A TP rank's slice: rows [1, 4), cols [2, 6) of proj. */
    float s[12], want[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) want[i * 4 + j] = proj[(1 + i) * 6 + 2 + j];
    TAP_OK(mc_ckpt_read_tensor(r, PROJ, 4, 6, 1, 2, 3, 4, s, &err) == MC_OK &&
               same_bits(s, want, 12),
           "a 3x4 slice of proj");
    TAP_OK(mc_ckpt_read_tensor(r, NORM, 7, 0, 5, 0, 2, 0, s, &err) == MC_OK &&
               same_bits(s, norm + 5, 2),
           "a slice of a vector");
    TAP_OK(mc_ckpt_has_tensor(r, "optimizer/exp_avg/decoder.final_layernorm.weight") &&
               !mc_ckpt_has_tensor(r, "optimizer/exp_avg_sq/decoder.final_layernorm.weight") &&
               !mc_ckpt_has_tensor(r, "nosuchgroup/x"),
           "has_tensor");
    char **names;
    size_t nn;
    TAP_OK(mc_ckpt_list(r, "model", &names, &nn, &err) == MC_OK && nn == 4 &&
               strcmp(names[0], "decoder.final_layernorm.weight") == 0 &&
               strcmp(names[3], "decoder.layers.0.self_attention.linear_qkv.weight") == 0 &&
               !names[4],
           "list model: %zu names, sorted", nn);
    free(names);

    /* Refusals. */
    char msg[1024];
    snprintf(msg, sizeof msg,
             "%s/ckpt/iter_0000100/model.h5: " FC1
             ": shape [6, 4] in the checkpoint, [8, 4] expected",
             root);
    TAP_OK(mc_ckpt_read_tensor(r, FC1, 8, 4, 0, 0, 8, 4, s, &err) == MC_ERR_FORMAT &&
               strcmp(err.msg, msg) == 0,
           "shape mismatch: %s", err.msg);
    TAP_OK(mc_ckpt_read_tensor(r, NORM, 7, 1, 0, 0, 7, 1, s, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "shape [7] in the checkpoint, [7, 1] expected"),
           "vector vs matrix: %s", err.msg);
    TAP_OK(mc_ckpt_read_tensor(r, "model/decoder.layers.9.mlp.linear_fc2.weight", 4, 4, 0, 0, 4, 4,
                               s, &err) == MC_ERR_NOTFOUND &&
               strstr(err.msg,
                      "model.h5: model/decoder.layers.9.mlp.linear_fc2.weight: no such tensor"),
           "missing tensor: %s", err.msg);
    TAP_OK(mc_ckpt_tensor_info(r, "optimizer/exp_avg_sq/x", NULL, NULL, NULL, &err) ==
                   MC_ERR_NOTFOUND &&
               strstr(err.msg, "optimizer/exp_avg_sq/x"),
           "missing group: %s", err.msg);
    TAP_OK(mc_ckpt_read_tensor(r, FC1, 6, 4, 4, 0, 3, 4, s, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "outside"),
           "block outside the tensor: %s", err.msg);
    json_t *j;
    TAP_OK(mc_ckpt_read_json(r, "nope", &j, &err) == MC_ERR_NOTFOUND &&
               strstr(err.msg, "no attribute 'nope'"),
           "missing attribute: %s", err.msg);
    mc_ckpt_close(r);
}

/* Hand-worked roundings (bit patterns in the comments). */
static void test_dtypes(void)
{
    mc_error err = {0};
    const float x[] = {
        1.0f,
        fbits(0x3F808000), /* 1 + 2^-8: bf16 tie, kept half even -> 1.0 */
        fbits(0x3F818000), /* 1 + 3*2^-8: tie, kept half odd -> 0x3F82 */
        fbits(0x3F808001), /* just above the tie -> 0x3F81 */
        -2.5f,
        INFINITY,
        NAN,
        fbits(0x7F7FFFFF), /* FLT_MAX -> rounds up to bf16 inf */
        65504.0f,          /* fp16 max */
        65520.0f,          /* fp16: tie between max and inf -> inf */
        fbits(0x33800000), /* 2^-24: smallest fp16 subnormal */
        fbits(0x33000000), /* 2^-25: fp16 tie with 0 -> 0 */
        fbits(0x33400000), /* 1.5 * 2^-25 -> 2^-24 */
        fbits(0x3F801000), /* 1 + 2^-11: fp16 tie -> 1.0 */
        fbits(0x3F803000), /* 1 + 3*2^-11: fp16 tie, odd -> 1 + 2^-9 */
        0.1f,              /* fp16 0x2E66 = 0.0999755859375 */
        -0.0f,
    };
    const uint32_t bf[] = {0x3F800000,
                           0x3F800000,
                           0x3F820000,
                           0x3F810000,
                           0xC0200000,
                           0x7F800000,
                           0,
                           0x7F800000,
                           0x47800000 /* 65504 -> 65536 */,
                           0x47800000 /* 65520 -> 65536 */,
                           0x33800000,
                           0x33000000,
                           0x33400000,
                           0x3F800000,
                           0x3F800000,
                           0x3DCD0000 /* 0x3DCCCCCD -> 0x3DCD */,
                           0x80000000};
    const float hf[] = {1.0f,
                        1.0f + 1.0f / 256,
                        fbits(0x3F818000) /* 1+3*2^-8 = 1.01171875 exact in fp16 */,
                        1.0f + 1.0f / 256 /* 1+2^-8+2^-23 -> 1+2^-8 */,
                        -2.5f,
                        INFINITY,
                        NAN,
                        INFINITY,
                        65504.0f,
                        INFINITY,
                        fbits(0x33800000),
                        0.0f,
                        fbits(0x33800000),
                        1.0f,
                        1.0f + 1.0f / 512,
                        0.0999755859375f,
                        -0.0f};
    enum { N = sizeof x / sizeof x[0] };
    mc_ckpt_writer *w;
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", P("%s", "dtypes"));
    TAP_OK(mc_ckpt_writer_begin(ck, 1, &w, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, "model/bf", N, 0, 0, 0, N, 0, x, MC_CKPT_BFLOAT16, &err) ==
                   MC_OK &&
               mc_ckpt_write_tensor(w, "model/hf", 1, N, 0, 0, 1, N, x, MC_CKPT_FLOAT16, &err) ==
                   MC_OK &&
               mc_ckpt_writer_commit(w, &err) == MC_OK,
           "write bfloat16 and float16 tensors (%s)", err.msg);
    mc_ckpt_reader *r;
    float y[N];
    mc_ckpt_dtype dt;
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_OK, "open");
    TAP_OK(mc_ckpt_tensor_info(r, "model/bf", NULL, NULL, &dt, &err) == MC_OK &&
               dt == MC_CKPT_BFLOAT16,
           "dtype bfloat16");
    TAP_OK(mc_ckpt_read_tensor(r, "model/bf", N, 0, 0, 0, N, 0, y, &err) == MC_OK, "read bf16 (%s)",
           err.msg);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        int want_nan = isnan(x[i]);
        if (want_nan ? !isnan(y[i]) : bitsf(y[i]) != bf[i]) {
            bad++;
            TAP_DIAG("bf16 %d: %08x -> %08x, want %08x", i, bitsf(x[i]), bitsf(y[i]), bf[i]);
        }
    }
    TAP_OK(bad == 0, "bf16 rounds to nearest even, ties, overflow, NaN");
    TAP_OK(mc_ckpt_tensor_info(r, "model/hf", NULL, NULL, &dt, &err) == MC_OK &&
               dt == MC_CKPT_FLOAT16,
           "dtype float16");
    TAP_OK(mc_ckpt_read_tensor(r, "model/hf", 1, N, 0, 0, 1, N, y, &err) == MC_OK, "read fp16 (%s)",
           err.msg);
    bad = 0;
    for (int i = 0; i < N; i++) {
        if (isnan(hf[i]) ? !isnan(y[i]) : bitsf(y[i]) != bitsf(hf[i])) {
            bad++;
            TAP_DIAG("fp16 %d: %08x -> %08x, want %08x", i, bitsf(x[i]), bitsf(y[i]), bitsf(hf[i]));
        }
    }
    TAP_OK(bad == 0, "fp16 rounds to nearest even, subnormals, overflow");
    mc_ckpt_close(r);
    mc_ckpt_dtype d;
    TAP_OK(mc_ckpt_dtype_parse("bfloat16", &d, &err) == MC_OK && d == MC_CKPT_BFLOAT16 &&
               mc_ckpt_dtype_parse("fp8", &d, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "float32, bfloat16, float16"),
           "dtype names: %s", err.msg);
    mc_ckpt_compression c;
    TAP_OK(mc_ckpt_compression_parse("zstd", &c, &err) == MC_OK && c == MC_CKPT_COMPRESS_ZSTD &&
               mc_ckpt_compression_parse("gzip", &c, &err) == MC_ERR_USAGE,
           "compression names: %s", err.msg);
}

static void test_pointer(void)
{
    mc_error err = {0};
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", P("%s", "ckpt"));
    mc_ckpt_writer *w;
    size_t n;
    unsigned char *latest;

    /* Abort: nothing changes. */
    TAP_OK(mc_ckpt_writer_begin(ck, 200, &w, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, QKV, 5, 7, 0, 0, 5, 7, qkv, MC_CKPT_FLOAT32, &err) == MC_OK,
           "begin 200");
    TAP_OK(hidden_entries(ck) == 1, "the writer works in a hidden temporary");
    /* A reader during the write (or after a crash) sees iteration 100. */
    mc_ckpt_reader *r;
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_OK && mc_ckpt_iteration(r) == 100,
           "a concurrent reader sees 100");
    mc_ckpt_close(r);
    mc_ckpt_writer_abort(w);
    latest = slurp(P("%s", "ckpt/latest_checkpointed_iteration.txt"), &n);
    TAP_OK(latest && strcmp((char *)latest, "100\n") == 0 &&
               !exists(P("%s", "ckpt/iter_0000200")) && hidden_entries(ck) == 0,
           "abort: latest still 100, no iter_0000200, no temporary");
    free(latest);

    /* A partial tensor refuses to commit. */
    TAP_OK(mc_ckpt_writer_begin(ck, 300, &w, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, FC1, 6, 4, 0, 0, 3, 4, fc1, MC_CKPT_FLOAT32, &err) == MC_OK,
           "begin 300, half of fc1");
    TAP_OK(mc_ckpt_writer_commit(w, &err) == MC_ERR_USAGE &&
               strstr(err.msg, FC1 ": 12 of 24 elements written"),
           "partial tensor refused: %s", err.msg);
    latest = slurp(P("%s", "ckpt/latest_checkpointed_iteration.txt"), &n);
    TAP_OK(latest && strcmp((char *)latest, "100\n") == 0 &&
               !exists(P("%s", "ckpt/iter_0000300")) && hidden_entries(ck) == 0,
           "refused commit: latest still 100, nothing left");
    free(latest);

    /* Inconsistent halves. */
    TAP_OK(mc_ckpt_writer_begin(ck, 300, &w, &err) == MC_OK, "begin 300 again");
    TAP_OK(mc_ckpt_write_tensor(w, FC1, 6, 4, 0, 0, 3, 4, fc1, MC_CKPT_FLOAT32, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, FC1, 6, 4, 3, 0, 3, 4, fc1, MC_CKPT_BFLOAT16, &err) ==
                   MC_ERR_USAGE &&
               strstr(err.msg, "written as [6, 4] float32, now as [6, 4] bfloat16"),
           "second half with another dtype: %s", err.msg);
    TAP_OK(mc_ckpt_write_tensor(w, FC1, 6, 4, 3, 2, 3, 4, fc1, MC_CKPT_FLOAT32, &err) ==
                   MC_ERR_USAGE &&
               strstr(err.msg, "outside the tensor"),
           "block outside: %s", err.msg);
    TAP_OK(mc_ckpt_write_tensor(w, "/model/x", 1, 1, 0, 0, 1, 1, fc1, MC_CKPT_FLOAT32, &err) ==
               MC_ERR_USAGE,
           "absolute path refused: %s", err.msg);
    TAP_OK(mc_ckpt_write_json(w, "config", "{\"a\": ", &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "attribute config"),
           "invalid JSON refused: %s", err.msg);
    mc_ckpt_writer_abort(w);

    /* A crash leaves a temporary with a half-written file: ignored. */
    mkdir(P("%s", "ckpt/.iter_0000400.tmp.AbCdEf"), 0777);
    spit(P("%s", "ckpt/.iter_0000400.tmp.AbCdEf/model.h5"), "\x89HDF\r\n", 6);
    TAP_OK(read_all(ck, &err) == 1, "a leftover temporary is ignored (%s)", err.msg);

    /* Replacing an existing iteration: new contents, no leftovers. */
    float *q2 = fill(35, 99);
    TAP_OK(mc_ckpt_writer_begin(ck, 100, &w, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, QKV, 5, 7, 0, 0, 5, 7, q2, MC_CKPT_FLOAT32, &err) == MC_OK &&
               mc_ckpt_writer_commit(w, &err) == MC_OK,
           "rewrite iteration 100 (%s)", err.msg);
    float buf[35];
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_OK &&
               mc_ckpt_read_tensor(r, QKV, 5, 7, 0, 0, 5, 7, buf, &err) == MC_OK &&
               same_bits(buf, q2, 35) && !mc_ckpt_has_tensor(r, FC1),
           "the new iteration 100 replaced the old one whole");
    mc_ckpt_close(r);
    TAP_OK(hidden_entries(ck) == 1, "only the crash leftover is hidden");
    free(q2);
    TAP_OK(write_main(ck, 100, &err) == MC_OK && read_all(ck, &err) == 1,
           "restore the main checkpoint");

    /* Bad pointers. */
    mkdir(P("%s", "bad"), 0777);
    spit(P("%s", "bad/latest_checkpointed_iteration.txt"), "12x\n", 4);
    TAP_OK(mc_ckpt_open(P("%s", "bad"), &r, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "not an iteration number"),
           "garbage pointer: %s", err.msg);
    spit(P("%s", "bad/latest_checkpointed_iteration.txt"), "release", 7);
    TAP_OK(mc_ckpt_open(P("%s", "bad"), &r, &err) == MC_ERR_FORMAT && strstr(err.msg, "'release'"),
           "release pointer: %s", err.msg);
    spit(P("%s", "bad/latest_checkpointed_iteration.txt"), "7\n", 2);
    TAP_OK(mc_ckpt_open(P("%s", "bad"), &r, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "names iteration 7 but") &&
               strstr(err.msg, "iter_0000007/model.h5 does not exist"),
           "dangling pointer: %s", err.msg);
    remove(P("%s", "bad/latest_checkpointed_iteration.txt"));
    TAP_OK(mc_ckpt_open(P("%s", "bad"), &r, &err) == MC_ERR_NOTFOUND &&
               strstr(err.msg, "not a checkpoint"),
           "empty directory: %s", err.msg);
    TAP_OK(mc_ckpt_open(P("%s", "nonexistent"), &r, &err) == MC_ERR_NOTFOUND, "missing path: %s",
           err.msg);
    TAP_OK(mc_ckpt_writer_begin(ck, -1, &w, &err) == MC_ERR_USAGE, "negative iteration: %s",
           err.msg);
    spit(P("%s", "afile"), "x", 1);
    TAP_OK(mc_ckpt_writer_begin(P("%s", "afile"), 1, &w, &err) == MC_ERR_IO &&
               strstr(err.msg, "afile"),
           "a file where the directory should be: %s", err.msg);
    TAP_OK(mc_ckpt_writer_begin(P("%s", "afile/sub"), 1, &w, &err) == MC_ERR_IO &&
               strstr(err.msg, "afile/sub"),
           "a directory under a file: %s", err.msg);

    /* Empty RNG state; a nested new directory. */
    void *b = NULL;
    size_t nb = 1;
    TAP_OK(mc_ckpt_writer_begin(P("%s", "deep/er/ckpt"), 0, &w, &err) == MC_OK &&
               mc_ckpt_write_bytes(w, "rng", "", 0, &err) == MC_OK &&
               mc_ckpt_write_bytes(w, "rng", "a", 1, &err) == MC_ERR_USAGE &&
               mc_ckpt_writer_commit(w, &err) == MC_OK &&
               mc_ckpt_open(P("%s", "deep/er/ckpt"), &r, &err) == MC_OK &&
               mc_ckpt_iteration(r) == 0 && mc_ckpt_read_bytes(r, "rng", &b, &nb, &err) == MC_OK &&
               nb == 0 && exists(P("%s", "deep/er/ckpt/iter_0000000/model.h5")),
           "iteration 0 in a new nested directory, empty bytes (%s)", err.msg);
    free(b);
    mc_ckpt_close(r);
}

/* Truncations and corrupt bytes: a clean error or the exact data, never
 * wrong data and never a crash. HDF5 prints nothing on the way. */
static void test_damage(void)
{
    mc_error err = {0};
    size_t len;
    unsigned char *orig = slurp(P("%s", "ckpt/iter_0000100/model.h5"), &len);
    char dmg[1024];
    snprintf(dmg, sizeof dmg, "%s", P("%s", "damaged.h5"));
    TAP_OK(orig && len > 1000, "the file has %zu bytes", len);

    /* Let any HDF5 chatter land in a file we can inspect. */
    fflush(stderr);
    int saved = dup(2), fd = open(P("%s", "stderr.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    dup2(fd, 2);

    size_t cuts[] = {0, 8, 100, 512, len / 4, len / 2, len - 200, len - 1};
    int refused = 0, wrong = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(dmg, orig, cuts[i]);
        int k = read_all(dmg, &err);
        if (k == 0 && strstr(err.msg, "damaged.h5"))
            refused++;
        else
            TAP_DIAG("cut at %zu: %d %s", cuts[i], k, err.msg);
        if (k < 0) wrong++;
    }
    spit(dmg, orig, len / 2);
    read_all(dmg, &err);
    char half_msg[1024];
    snprintf(half_msg, sizeof half_msg, "%s", err.msg);

    /* Flip one byte at a time, all over the file. */
    int flips = 0, caught = 0, harmless = 0;
    unsigned char *copy = malloc(len);
    size_t step = len / 300 + 1;
    for (size_t off = 0; off < len; off += step) {
        memcpy(copy, orig, len);
        copy[off] ^= 0x5a;
        spit(dmg, copy, len);
        int k = read_all(dmg, &err);
        flips++;
        if (k == 0)
            caught++;
        else if (k == 1)
            harmless++;
        else {
            wrong++;
            TAP_DIAG("flip at %zu: wrong data read silently", off);
        }
    }
    /* A flip inside the data of qkv itself must be caught (Fletcher-32). */
    unsigned char *at = memmem(orig, len, qkv, 35 * sizeof(float));
    int data_caught = 0;
    char data_msg[1024] = "";
    if (at) {
        memcpy(copy, orig, len);
        copy[(at - orig) + 17] ^= 1;
        spit(dmg, copy, len);
        data_caught = read_all(dmg, &err) == 0;
        snprintf(data_msg, sizeof data_msg, "%s", err.msg);
    }
    free(copy);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    size_t elen;
    unsigned char *e = slurp(P("%s", "stderr.txt"), &elen);

    TAP_OK(refused == (int)(sizeof cuts / sizeof cuts[0]),
           "all %d truncations refused with the file named", refused);
    TAP_DIAG("truncated at half: %s", half_msg);
    TAP_OK(wrong == 0, "no damage yields wrong data (%d flips: %d caught, %d harmless)", flips,
           caught, harmless);
    TAP_OK(caught > flips / 2, "most flips are caught (%d of %d)", caught, flips);
    TAP_OK(at && data_caught && strstr(data_msg, QKV ": read failed"),
           "a flipped bit in tensor data: %s", data_msg);
    TAP_OK(e && elen == 0, "HDF5 printed nothing to stderr (%zu bytes)", elen);
    free(e);
    free(orig);

    /* The caller's HDF5 error printing is left as it was. */
    H5E_auto2_t f = NULL;
    void *d = NULL;
    H5Eget_auto2(H5E_DEFAULT, &f, &d);
    TAP_OK(f != NULL, "HDF5's default error printer is still installed");
    /* Every file, group, dataset and attribute opened was closed again. */
    ssize_t open_objs = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    TAP_OK(open_objs == 0, "no HDF5 file object left open (%zd)", open_objs);
}

static void test_zstd(void)
{
    mc_error err = {0};
    enum { R = 300, C = 1000 };
    float *a = malloc(R * C * sizeof *a), *b = malloc(R * C * sizeof *b);
    /* Compressible (a smooth ramp quantized to few values) with a random tail. */
    for (int i = 0; i < R * C; i++)
        a[i] = i < R * C - 5000 ? (float)((i / 97) % 13) * 0.125f : valf((uint32_t)i, 5);
    mc_ckpt_writer *w;
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", P("%s", "zstd"));
    TAP_OK(mc_ckpt_writer_begin(ck, 3, &w, &err) == MC_OK &&
               mc_ckpt_writer_set_compression(w, MC_CKPT_COMPRESS_ZSTD, 0, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, "model/big", R, C, 0, 0, R / 2, C, a, MC_CKPT_FLOAT32,
                                    &err) == MC_OK &&
               mc_ckpt_write_tensor(w, "model/big", R, C, R / 2, 0, R / 2, C, a + R / 2 * C,
                                    MC_CKPT_FLOAT32, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, "model/v", 1000, 0, 0, 0, 1000, 0, a + R * C - 1000,
                                    MC_CKPT_BFLOAT16, &err) == MC_OK &&
               mc_ckpt_writer_set_compression(w, MC_CKPT_COMPRESS_ZSTD, 19, &err) == MC_OK &&
               mc_ckpt_write_tensor(w, "model/l19", R, C, 0, 0, R, C, a, MC_CKPT_FLOAT32, &err) ==
                   MC_OK &&
               mc_ckpt_writer_commit(w, &err) == MC_OK,
           "write zstd tensors, two halves each, levels 3 and 19 (%s)", err.msg);
    struct stat sb;
    stat(P("%s", "zstd/iter_0000003/model.h5"), &sb);
    TAP_OK(sb.st_size < (off_t)(R * C * 4 / 4), "compressed: %lld bytes for 2 x %d raw",
           (long long)sb.st_size, R * C * 4);
    mc_ckpt_reader *r;
    float v[1000];
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_OK &&
               mc_ckpt_read_tensor(r, "model/big", R, C, 0, 0, R, C, b, &err) == MC_OK &&
               same_bits(a, b, (size_t)R * C),
           "zstd round trip bit for bit (%s)", err.msg);
    TAP_OK(mc_ckpt_read_tensor(r, "model/l19", R, C, 10, 500, 200, 300, b, &err) == MC_OK &&
               memcmp(b, a + 10 * C + 500, 300 * sizeof(float)) == 0 &&
               memcmp(b + 199 * 300, a + 209 * C + 500, 300 * sizeof(float)) == 0,
           "a slice of a level-19 tensor");
    TAP_OK(mc_ckpt_read_tensor(r, "model/v", 1000, 0, 0, 0, 1000, 0, v, &err) == MC_OK &&
               fabsf(v[7] - a[R * C - 1000 + 7]) <= fabsf(a[R * C - 1000 + 7]) / 256,
           "a compressed bf16 vector");
    mc_ckpt_close(r);

    /* Corrupt compressed data: the checksum manifest refuses the file
     * before HDF5 opens it; without that check, Fletcher-32 catches it
     * before zstd runs. */
    size_t len;
    unsigned char *f = slurp(P("%s", "zstd/iter_0000003/model.h5"), &len);
    f[len / 2] ^= 0xff;
    spit(P("%s", "zstd/iter_0000003/model.h5"), f, len);
    free(f);
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_ERR_FORMAT && !r &&
               strstr(err.msg, "zstd/iter_0000003/model.h5: checksum mismatch with ") &&
               strstr(err.msg, "zstd/iter_0000003/" MC_CKPT_MANIFEST),
           "a damaged file is refused by its checksum: %s", err.msg);
    mc_ckpt_set_verify(0);
    TAP_OK(mc_ckpt_open(ck, &r, &err) == MC_OK &&
               (mc_ckpt_read_tensor(r, "model/big", R, C, 0, 0, R, C, b, &err) != MC_OK ||
                mc_ckpt_read_tensor(r, "model/l19", R, C, 0, 0, R, C, b, &err) != MC_OK),
           "unverified, the corrupt compressed chunk is refused by HDF5: %s", err.msg);
    mc_ckpt_set_verify(1);
    mc_ckpt_close(r);
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    /* HDF5 1.10 keeps some blocks after a metadata checksum failure and
     * then complains at exit ("infinite loop closing library"); the library
     * state is irrelevant once the process ends, so skip its atexit close. */
    H5dont_atexit();
    snprintf(root, sizeof root, "/tmp/test_ckpt.XXXXXX");
    if (!mkdtemp(root)) return 1;
    qkv = fill(35, 1);
    fc1 = fill(24, 2);
    proj = fill(24, 3);
    norm = fill(7, 4);
    mom = fill(7, 5);
    if (!*only || strstr(only, "round_trip")) test_round_trip();
    if (!*only || strstr(only, "dtypes")) test_dtypes();
    if (!*only || strstr(only, "pointer")) test_pointer();
    if (!*only || strstr(only, "damage")) test_damage();
    if (!*only || strstr(only, "zstd")) test_zstd();
    free(qkv);
    free(fc1);
    free(proj);
    free(norm);
    free(mom);
    nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return tap_done();
}
