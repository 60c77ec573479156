/*
 * fuzz_ckpt.c - a checkpoint's metadata (mc/ckpt.h): HDF5 itself is not
 * fuzzed (it does not defend itself against a corrupt file, which is why
 * mc checks the checksum manifest first); the input chooses what a
 * well-formed HDF5 file holds, and mc's reader meets it: the root
 * attributes (mc_format, its version, iteration, layout, config, the
 * tokenizer), the tensors' shapes, storage types, dtype attributes,
 * quantization attributes and scales, a sharded checkpoint's index, the
 * latest_checkpointed_iteration.txt pointer and the checksums.xxh128
 * manifest. Then everything a loader reads is read. FUZZ_VERBOSE=1 prints
 * why mc_ckpt_open refused an input (to see what a seed reaches).
 */
#include <hdf5.h>
#include <xxhash.h>

#include "fuzz.h"
#include "mc/ckpt.h"
#include "mc/file.h"
#include "mc/model.h"
#include "mc/tokenizer.h"

static const char *const NAMES[] = {
    "embedding.word_embeddings.weight",
    "embedding.position_embeddings.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.0.mlp.linear_fc1.weight",
    "decoder.final_layernorm.weight",
    "output_layer.weight",
};
#define NNAMES (sizeof NAMES / sizeof NAMES[0])
static const char *const DTYPES[] = {"float32", "bfloat16", "float16", "int8", "fp8_e4m3", "int4"};

static void attr_str(hid_t loc, const char *name, const char *s)
{
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    H5Tset_size(t, strlen(s) ? strlen(s) : 1);
    hid_t a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) H5Awrite(a, t, strlen(s) ? s : "");
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
}

static void attr_int(hid_t loc, const char *name, int64_t v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(sp);
}

/* A string attribute chosen: the right value, the input's, an integer, or none. */
static void choose_str_attr(fuzz_bytes *b, hid_t loc, const char *name, const char *right)
{
    switch (fuzz_u8(b) % 4) {
    case 0:
        if (right) attr_str(loc, name, right);
        break;
    case 1: {
        char *s = fuzz_str(b);
        attr_str(loc, name, s);
        free(s);
        break;
    }
    case 2: attr_int(loc, name, (int64_t)fuzz_u64(b)); break;
    default: break;
    }
}

static void choose_int_attr(fuzz_bytes *b, hid_t loc, const char *name, int64_t right)
{
    switch (fuzz_u8(b) % 4) {
    case 0: attr_int(loc, name, right); break;
    case 1: attr_int(loc, name, (int64_t)fuzz_u64(b)); break;
    case 2: attr_str(loc, name, "1"); break;
    default: break;
    }
}

/* A small extent mostly, now and then one from the input (up to 2^62). */
static hsize_t choose_dim(fuzz_bytes *b)
{
    uint8_t c = fuzz_u8(b);
    if (c < 224) return 1 + c % 12;
    return (hsize_t)(fuzz_u64(b) & (((uint64_t)1 << 62) - 1));
}

/* A dataset at path: its extent, storage type and dtype attribute chosen;
 * small ones are written with the input's bytes, large ones left as
 * chunks never written (HDF5 reads them as the fill value). */
static void make_dataset(fuzz_bytes *b, hid_t f, const char *path)
{
    int nd = fuzz_u8(b) % 4;
    hsize_t dims[3] = {choose_dim(b), choose_dim(b), choose_dim(b)};
    hsize_t total = 1;
    int big = 0;
    for (int i = 0; i < nd; i++) {
        if (dims[i] > 4096 || total * dims[i] > 4096) big = 1;
        total = big ? total : total * dims[i];
    }
    hid_t types[] = {H5T_IEEE_F32LE, H5T_STD_U16LE,  H5T_STD_I8LE, H5T_STD_U8LE,
                     H5T_IEEE_F64LE, H5T_IEEE_F32BE, H5T_STD_I64LE};
    hid_t ft = H5Tcopy(types[fuzz_u8(b) % (sizeof types / sizeof types[0])]);
    if (fuzz_u8(b) % 8 == 7) { /* an IEEE half, as h5py writes float16 */
        H5Tclose(ft);
        ft = H5Tcopy(H5T_IEEE_F32LE);
        H5Tset_fields(ft, 15, 10, 5, 0, 10);
        H5Tset_size(ft, 2);
        H5Tset_ebias(ft, 15);
    }
    hid_t sp = nd ? H5Screate_simple(nd, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    if (nd && big) {
        hsize_t chunk[3] = {1, 1, 1};
        for (int i = 0; i < nd; i++) chunk[i] = dims[i] < 64 ? dims[i] : 64;
        H5Pset_chunk(dcpl, nd, chunk);
    }
    hid_t ds = H5Dcreate2(f, path, ft, sp, lcpl, dcpl, H5P_DEFAULT);
    if (ds >= 0) {
        if (!big) {
            size_t bytes = (size_t)total * H5Tget_size(ft);
            unsigned char *buf = calloc(bytes ? bytes : 1, 1);
            size_t k = bytes < b->n ? bytes : b->n;
            memcpy(buf, b->p, k);
            b->p += k;
            b->n -= k;
            H5Dwrite(ds, ft, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
            free(buf);
        }
        uint8_t c = fuzz_u8(b) % 10;
        if (c < 6)
            attr_str(ds, "dtype", DTYPES[c]);
        else if (c == 6)
            choose_str_attr(b, ds, "dtype", NULL);
        if (c == 5 || c == 6) { /* int4's attributes */
            choose_int_attr(b, ds, "cols", (int64_t)(nd > 1 ? dims[1] * 2 : 1));
            choose_int_attr(b, ds, "group_size", 128);
            choose_int_attr(b, ds, "group_offset", 0);
        }
        H5Dclose(ds);
    }
    H5Pclose(dcpl);
    H5Pclose(lcpl);
    H5Sclose(sp);
    H5Tclose(ft);
}

static void make_bytes(hid_t f, const char *name, const char *s)
{
    hsize_t n = strlen(s);
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t ds = H5Dcreate2(f, name, H5T_STD_U8LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (ds >= 0 && n) H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s);
    H5Dclose(ds);
    H5Sclose(sp);
}

/* config = {"model": a preset with one field perhaps changed}, or the input's. */
static void make_config(fuzz_bytes *b, hid_t f)
{
    uint8_t c = fuzz_u8(b) % 4;
    if (c == 3) return;
    if (c == 2) {
        choose_str_attr(b, f, "config", NULL);
        return;
    }
    const char *const *names = mc_model_preset_names();
    size_t np = 0;
    while (names[np]) np++;
    mc_model_config m;
    mc_error err = {0};
    if (mc_model_preset(names[fuzz_u8(b) % np], &m, &err) != MC_OK) abort();
    json_t *j = mc_model_config_json(&m);
    if (c == 1 && json_object_size(j)) { /* one field replaced */
        size_t k = fuzz_u8(b) % json_object_size(j), i = 0;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v)
        {
            if (i++ != k) continue;
            uint8_t how = fuzz_u8(b) % 4;
            json_object_set_new(j, key,
                                how == 0   ? json_integer((json_int_t)fuzz_u64(b))
                                : how == 1 ? json_integer((json_int_t)(fuzz_u64(b) & 0xffffff))
                                : how == 2 ? json_real(-1.5)
                                           : json_string("x"));
            break;
        }
    }
    json_t *cfg = json_pack("{s:o}", "model", j);
    char *text = json_dumps(cfg, JSON_COMPACT);
    attr_str(f, "config", text);
    free(text);
    json_decref(cfg);
}

static void make_tokenizer(fuzz_bytes *b, hid_t f)
{
    if (fuzz_u8(b) % 2) return;
    choose_str_attr(b, f, "tokenizer",
                    "{\"type\":\"HuggingFaceTokenizer\",\"files\":{\"model\":\"tokenizer.json\","
                    "\"config\":\"tokenizer_config.json\"}}");
    static const char *const files[] = {"tokenizer_model", "tokenizer_vocab", "tokenizer_merges",
                                        "tokenizer_config"};
    for (int i = 0; i < 4; i++) {
        if (fuzz_u8(b) % 2) continue;
        char *s = fuzz_str(b);
        make_bytes(f, files[i], s);
        free(s);
    }
}

static void make_file(fuzz_bytes *b, const char *path, int64_t iteration, const char *layout)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) abort();
    choose_str_attr(b, f, "mc_format", "mc-checkpoint");
    choose_int_attr(b, f, "mc_format_version", 1);
    choose_int_attr(b, f, "iteration", iteration);
    if (layout) attr_str(f, "layout", layout);
    if (fuzz_u8(b) % 8 == 7) choose_str_attr(b, f, "layout", NULL);
    make_config(b, f);
    make_tokenizer(b, f);
    choose_int_attr(b, f, "consumed_samples", 64);
    int k = fuzz_u8(b) % 6;
    for (int i = 0; i < k; i++) {
        char p[600];
        uint8_t c = fuzz_u8(b);
        if (c < 200) {
            snprintf(p, sizeof p, "%smodel/%s", c % 4 == 3 ? "scales/" : "", NAMES[c % NNAMES]);
        } else {
            char *s = fuzz_str(b);
            snprintf(p, sizeof p, "model/%s", s);
            free(s);
        }
        make_dataset(b, f, p);
    }
    if (!strcmp(layout ? layout : "", "sharded")) {
        char *s = fuzz_str(b);
        make_bytes(f, "shard_index",
                   s[0] ? s
                        : "{\"files\":[\"mp_rank_00_000.h5\"],"
                          "\"pipeline_parallel_size\":1,"
                          "\"tensor_parallel_size\":1,\"tensors\":{"
                          "\"model/decoder.final_layernorm.weight\":{"
                          "\"blocks\":[[0,0,0,4,1,0]],\"dtype\":\"float32\","
                          "\"shape\":[4]}}}");
        free(s);
    }
    H5Fclose(f);
}

static void hash_line(FILE *m, const char *dir, const char *name)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *data;
    size_t n;
    mc_error err;
    if (mc_read_file(p, &data, &n, &err) != MC_OK) return;
    XXH128_hash_t h = XXH3_128bits(data, n);
    free(data);
    fprintf(m, "%016llx%016llx  %s\n", (unsigned long long)h.high64, (unsigned long long)h.low64,
            name);
}

static void read_all(mc_ckpt_reader *r)
{
    mc_error err = {0};
    int64_t v;
    json_t *j = NULL;
    (void)mc_ckpt_read_int(r, "consumed_samples", &v, &err);
    if (mc_ckpt_read_json(r, "config", &j, &err) == MC_OK) json_decref(j);
    mc_model_config c;
    if (mc_ckpt_read_model_config(r, &c, &err) == MC_OK) (void)mc_model_config_finish(&c, 1, &err);
    mc_tokenizer *t = NULL;
    if (mc_ckpt_has_tokenizer(r) && mc_ckpt_read_tokenizer(r, &t, &err) == MC_OK)
        mc_tokenizer_free(t);
    json_decref(mc_ckpt_tokenizer_config(r));
    void *data = NULL;
    size_t n = 0;
    if (mc_ckpt_read_tokenizer_file(r, "model", &data, &n, &err) == MC_OK) free(data);
    mc_ckpt_reader *rs[1] = {r};
    (void)mc_ckpt_same_model(rs, 1, &err);
    char **names = NULL;
    size_t k = 0;
    if (mc_ckpt_list(r, "model", &names, &k, &err) != MC_OK) return;
    for (size_t i = 0; i < k; i++) {
        char p[600];
        snprintf(p, sizeof p, "model/%s", names[i]);
        int64_t rows, cols;
        mc_ckpt_dtype dt;
        if (mc_ckpt_tensor_info(r, p, &rows, &cols, &dt, &err) != MC_OK) continue;
        int64_t w = cols ? cols : 1;
        if (rows < 1 || w < 1 || rows > (1 << 16) / w) continue; /* the harness's own bound */
        float *x = malloc((size_t)(rows * w) * sizeof *x);
        if (!x) continue;
        (void)mc_ckpt_read_tensor(r, p, rows, cols, 0, 0, rows, w, x, &err);
        if (rows > 1) /* a block, as a tensor-parallel rank reads one */
            (void)mc_ckpt_read_tensor(r, p, rows, cols, rows / 2, 0, rows - rows / 2, w, x, &err);
        (void)mc_ckpt_read_average(rs, 1, p, rows, cols, x, &err);
        free(x);
    }
    free(names);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    static char top[600];
    if (!top[0]) {
        snprintf(top, sizeof top, "%s/ckpt", fuzz_dir());
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    }
    mc_remove_tree(top);
    mkdir(top, 0700);
    fuzz_bytes b = {d, n};
    int64_t iteration = fuzz_u8(&b) % 3;
    char iter[700], p[800];
    snprintf(iter, sizeof iter, "%s/iter_%07lld", top, (long long)iteration);
    mkdir(iter, 0700);
    uint8_t layout = fuzz_u8(&b) % 4;
    if (layout == 1) { /* sharded: index.h5 and one shard */
        snprintf(p, sizeof p, "%s/index.h5", iter);
        make_file(&b, p, iteration, "sharded");
        snprintf(p, sizeof p, "%s/mp_rank_00_000.h5", iter);
        make_file(&b, p, iteration, "shard");
    } else {
        snprintf(p, sizeof p, "%s/model.h5", iter);
        make_file(&b, p, iteration, layout == 2 ? "shard" : NULL);
    }
    snprintf(p, sizeof p, "%s/" MC_CKPT_LATEST, top);
    uint8_t latest = fuzz_u8(&b) % 4;
    if (latest == 0) {
        char s[32];
        snprintf(s, sizeof s, "%lld\n", (long long)iteration);
        fuzz_write(p, s, strlen(s));
    } else if (latest == 1) {
        char *s = fuzz_str(&b);
        fuzz_write(p, s, strlen(s));
        free(s);
    }
    snprintf(p, sizeof p, "%s/" MC_CKPT_MANIFEST, iter);
    uint8_t man = fuzz_u8(&b) % 3;
    if (man == 1) {
        FILE *m = fopen(p, "w");
        if (!m) abort();
        hash_line(m, iter, "model.h5");
        hash_line(m, iter, "index.h5");
        hash_line(m, iter, "mp_rank_00_000.h5");
        fclose(m);
    } else if (man == 2) {
        char *s = fuzz_str(&b);
        fuzz_write(p, s, strlen(s));
        free(s);
    }
    mc_ckpt_reader *r = NULL;
    mc_error err = {0};
    if (mc_ckpt_open(latest == 3 ? iter : top, &r, &err) == MC_OK)
        read_all(r);
    else if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "mc_ckpt_open: %s\n", err.msg);
    mc_ckpt_close(r);
    return 0;
}
