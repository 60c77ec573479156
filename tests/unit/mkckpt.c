/*
 * mkckpt.c - test helper for tests/tools/ckpt_h5py.bats: writes a small
 * checkpoint with known values through libmc, and dumps a tensor as libmc
 * reads it, so that h5py/hdf5plugin (tests/golden/check_ckpt_h5py.py) can
 * check the one and produce files for the other.
 *
 *   mkckpt write DIR [zstd [LEVEL]]   iteration 7; prints DIR/iter_0000007
 *   mkckpt dump PATH TENSOR           "ROWS COLS DTYPE", then the fp32 bit
 *                                     pattern of each element, %08x a line
 *
 * Values: element i of a tensor with seed s is
 *   (float)(((i * 2654435761 + s) mod 2^32) / 2^32 - 0.5)
 * (VALUES in check_ckpt_h5py.py computes the same).
 */
#include "mc/ckpt.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *values(size_t n, uint32_t seed)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((double)(uint32_t)((uint32_t)i * 2654435761u + seed) / 4294967296.0 - 0.5);
    return v;
}

/* name, rows, cols (0: vector), seed, dtype, how written: 0 whole, 1 two
 * row halves, 2 two column halves (the blocks of two TP ranks). */
static const struct {
    const char *name;
    int64_t rows, cols;
    uint32_t seed;
    mc_ckpt_dtype dtype;
    int split;
} T[] = {
    {"model/embedding.word_embeddings.weight", 64, 48, 11, MC_CKPT_FLOAT32, 1},
    {"model/decoder.layers.0.self_attention.linear_proj.weight", 48, 48, 12, MC_CKPT_FLOAT32, 2},
    {"model/decoder.layers.0.self_attention.linear_qkv.bias", 144, 0, 13, MC_CKPT_FLOAT32, 1},
    {"model/decoder.final_layernorm.weight", 48, 0, 14, MC_CKPT_FLOAT32, 0},
    {"model/output_layer.weight", 64, 48, 15, MC_CKPT_BFLOAT16, 1},
    {"model/decoder.layers.0.mlp.linear_fc1.weight", 96, 48, 16, MC_CKPT_FLOAT16, 2},
    {"model/decoder.layers.0.mlp.linear_fc2.weight", 600, 1000, 19, MC_CKPT_FLOAT32, 1},
    {"optimizer/exp_avg/embedding.word_embeddings.weight", 64, 48, 17, MC_CKPT_FLOAT32, 0},
    {"optimizer/exp_avg_sq/embedding.word_embeddings.weight", 64, 48, 18, MC_CKPT_FLOAT32, 0},
};

static int fail(const char *what, const mc_error *err)
{
    fprintf(stderr, "mkckpt: %s: %s\n", what, err->msg);
    return 1;
}

static int write_ckpt(const char *dir, int zstd, int level)
{
    mc_error err = {0};
    mc_ckpt_writer *w;
    if (mc_ckpt_writer_begin(dir, 7, &w, &err) ||
        (zstd && mc_ckpt_writer_set_compression(w, MC_CKPT_COMPRESS_ZSTD, level, &err)))
        return fail("begin", &err);
    for (size_t t = 0; t < sizeof T / sizeof T[0]; t++) {
        int64_t R = T[t].rows, C = T[t].cols, lc = C ? C : 1;
        float *v = values((size_t)(R * lc), T[t].seed),
              *blk = malloc((size_t)(R * lc) * sizeof *blk);
        mc_status st = MC_OK;
        if (T[t].split == 0) {
            st = mc_ckpt_write_tensor(w, T[t].name, R, C, 0, 0, R, C, v, T[t].dtype, &err);
        } else if (T[t].split == 1) { /* rows [0, R/2) then [R/2, R), second first */
            st = mc_ckpt_write_tensor(w, T[t].name, R, C, R / 2, 0, R - R / 2, C, v + R / 2 * lc,
                                      T[t].dtype, &err);
            if (!st)
                st = mc_ckpt_write_tensor(w, T[t].name, R, C, 0, 0, R / 2, C, v, T[t].dtype, &err);
        } else {
            for (int rank = 0; rank < 2 && !st; rank++) {
                int64_t c0 = rank * (C / 2), nc = rank ? C - C / 2 : C / 2;
                for (int64_t r = 0; r < R; r++)
                    memcpy(blk + r * nc, v + r * C + c0, (size_t)nc * sizeof *blk);
                st = mc_ckpt_write_tensor(w, T[t].name, R, C, 0, c0, R, nc, blk, T[t].dtype, &err);
            }
        }
        free(v);
        free(blk);
        if (st) {
            mc_ckpt_writer_abort(w);
            return fail(T[t].name, &err);
        }
    }
    unsigned char rng[16];
    for (int i = 0; i < 16; i++) rng[i] = (unsigned char)(i * 17);
    if (mc_ckpt_write_json(w, "config",
                           "{\"num_layers\": 1, \"hidden_size\": 48, \"name\": \"tiny\"}", &err) ||
        mc_ckpt_write_int(w, "consumed_samples", 448, &err) ||
        mc_ckpt_write_bytes(w, "rng", rng, 16, &err)) {
        mc_ckpt_writer_abort(w);
        return fail("metadata", &err);
    }
    char *final = strdup(mc_ckpt_writer_dir(w));
    if (mc_ckpt_writer_commit(w, &err)) {
        free(final);
        return fail("commit", &err);
    }
    printf("%s\n", final);
    free(final);
    return 0;
}

static int dump(const char *path, const char *name)
{
    mc_error err = {0};
    mc_ckpt_reader *r;
    int64_t R, C;
    mc_ckpt_dtype dt;
    if (mc_ckpt_open(path, &r, &err)) return fail("open", &err);
    if (mc_ckpt_tensor_info(r, name, &R, &C, &dt, &err)) {
        mc_ckpt_close(r);
        return fail("info", &err);
    }
    size_t n = (size_t)(R * (C ? C : 1));
    float *v = malloc(n * sizeof *v);
    if (mc_ckpt_read_tensor(r, name, R, C, 0, 0, R, C ? C : 1, v, &err)) {
        free(v);
        mc_ckpt_close(r);
        return fail("read", &err);
    }
    printf("%" PRId64 " %" PRId64 " %s\n", R, C, mc_ckpt_dtype_name(dt));
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        printf("%08x\n", u);
    }
    free(v);
    mc_ckpt_close(r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "write") == 0)
        return write_ckpt(argv[2], argc > 3 && strcmp(argv[3], "zstd") == 0,
                          argc > 4 ? atoi(argv[4]) : 0);
    if (argc == 4 && strcmp(argv[1], "dump") == 0) return dump(argv[2], argv[3]);
    fprintf(stderr, "usage: mkckpt write DIR [zstd [LEVEL]] | mkckpt dump PATH TENSOR\n");
    return 2;
}
