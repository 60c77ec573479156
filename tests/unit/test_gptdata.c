/*
 * test_gptdata.c - mc's GPT dataset against megatron-core.
 *
 * Golden: tests/data/gptdata/megatron_samples.txt, printed by
 * tests/golden/megatron_gpt_samples.py from megatron-core 0.16's
 * BlendedMegatronDatasetBuilder/GPTDataset/BlendedDataset over the documents
 * in tests/data/gptdata/docs_{a,b}.txt. Here the same documents are written
 * with mc_idx_writer, the same configurations (the CONFIGS table, which must
 * match the script's) are opened with mc_gpt_dataset_open, and every printed
 * sample must be equal token for token (tolerance: none), as must the split
 * lengths, the blend assignment (dataset, sample) and the cache file names
 * (md5 of Megatron's description). Then: cache reuse, Megatron's default
 * cache location, a corrupt cache, parsing, mock data, and error messages.
 */
#include "mc/gptdata.h"
#include "mc/indexed.h"
#include "data/gpt_internal.h"
#include "tap.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SRCDIR
#define SRCDIR "."
#endif

typedef struct gd_config {
    const char *name;
    const char *data_path[4];
    size_t n_data;
    const char *split;
    int64_t seq;
    uint32_t seed;
    int64_t sizes[3];
    int extra;
} gd_config;

/* keep in step with CONFIGS in tests/golden/megatron_gpt_samples.py */
static const gd_config CONFIGS[] = {
    {"single", {"A"}, 1, "90,7,3", 16, 1234, {200, 40, 8}, 1},
    {"epochs1", {"A"}, 1, "80,20,0", 8, 42, {50, 10, 0}, 1},
    {"noextra", {"B"}, 1, "80,15,5", 16, 7, {30, 5, 2}, 0},
    {"blend", {"0.3", "A", "0.7", "B"}, 4, "90,7,3", 16, 1234, {100, 20, 10}, 1},
    {"bare", {"A", "B"}, 2, "90,7,3", 16, 99, {60, 10, 5}, 1},
};
#define N_CONFIGS (sizeof CONFIGS / sizeof CONFIGS[0])
#define TOKENIZER_JSON "{\"class\": \"mc.test.Tokenizer\"}"

static char tmpdir[256];

static const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s ? s : SRCDIR;
}

static int write_docs(const char *txt, const char *prefix, mc_dtype dt)
{
    FILE *f = fopen(txt, "r");
    if (!f) return -1;
    mc_idx_writer *w;
    mc_error err = {0};
    if (mc_idx_writer_open(prefix, dt, &w, &err) != MC_OK) {
        fclose(f);
        return -1;
    }
    char line[65536];
    int32_t ids[8192];
    while (fgets(line, sizeof line, f)) {
        size_t n = 0;
        char *p = line, *end;
        for (;;) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            ids[n++] = (int32_t)v;
            p = end;
        }
        if (mc_idx_writer_add(w, ids, n, &err) != MC_OK) {
            mc_idx_writer_abort(w);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return mc_idx_writer_commit(w, &err) == MC_OK ? 0 : -1;
}

/* The data path words as they are: the test runs in tmpdir, and relative
 * prefixes keep Megatron's cache names (which hash them) independent of it. */
static mc_status open_config(const gd_config *g, const char *cache, mc_gpt_dataset **ds,
                             mc_error *err)
{
    char paths[4][300];
    const char *words[4];
    for (size_t i = 0; i < g->n_data; i++) {
        snprintf(paths[i], sizeof paths[i], "%s", g->data_path[i]);
        words[i] = paths[i];
    }
    mc_gptdata_config c;
    mc_gptdata_config_init(&c);
    mc_status st = mc_gptdata_parse_data_path(words, g->n_data, &c.blend, err);
    if (st != MC_OK) return st;
    c.split = g->split;
    c.seq_length = g->seq;
    c.seed = g->seed;
    for (int i = 0; i < 3; i++) c.num_samples[i] = g->sizes[i];
    c.add_extra_token = g->extra;
    c.cache_dir = cache;
    c.tokenizer_json = TOKENIZER_JSON;
    st = mc_gpt_dataset_open(&c, ds, err);
    mc_gptdata_blend_free(&c.blend);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* sorted "*-description.txt" names in dir, joined by '\n' */
static void list_descriptions(const char *dir, char *out, size_t cap)
{
    char *names[64];
    int n = 0;
    out[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        size_t l = strlen(e->d_name);
        if (l > 16 && strcmp(e->d_name + l - 16, "-description.txt") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        strncat(out, names[i], cap - strlen(out) - 1);
        strncat(out, "\n", cap - strlen(out) - 1);
        free(names[i]);
    }
}

static int split_of(const char *s)
{
    return strcmp(s, "train") == 0   ? 0
           : strcmp(s, "valid") == 0 ? 1
           : strcmp(s, "test") == 0  ? 2
                                     : -1;
}

/* Compare one config's block of the golden file (lines[beg, end)). */
static void check_config(const gd_config *g, char **lines, size_t beg, size_t end)
{
    char cache[400], want_cache[4096] = "", got_cache[4096];
    snprintf(cache, sizeof cache, "cache-%s", g->name);
    mc_gpt_dataset *ds;
    mc_error err = {0};
    mc_status st = open_config(g, cache, &ds, &err);
    TAP_OK(st == MC_OK, "%s: opens (%s)", g->name, st == MC_OK ? "ok" : err.msg);
    if (st != MC_OK) return;
    size_t samples = 0, bad = 0, bad_len = 0, splits = 0;
    int32_t tok[64];
    for (size_t i = beg; i < end; i++) {
        char *l = lines[i], sname[16];
        long long n, idx, d, s;
        if (strncmp(l, "cache ", 6) == 0) {
            strncat(want_cache, l + 6, sizeof want_cache - strlen(want_cache) - 1);
            strncat(want_cache, "\n", sizeof want_cache - strlen(want_cache) - 1);
        } else if (sscanf(l, "split %15s %lld", sname, &n) == 2) {
            splits++;
            if (mc_gpt_dataset_num_samples(ds, (mc_split)split_of(sname)) != n) {
                bad_len++;
                TAP_DIAG("%s %s: %" PRId64 " samples, megatron %lld", g->name, sname,
                         mc_gpt_dataset_num_samples(ds, (mc_split)split_of(sname)), n);
            }
        } else if (strncmp(l, "split ", 6) == 0) {
            char nm[16];
            sscanf(l, "split %15s", nm);
            splits++;
            if (mc_gpt_dataset_num_samples(ds, (mc_split)split_of(nm)) != 0) bad_len++;
        } else if (sscanf(l, "%15s %lld %lld %lld:", sname, &idx, &d, &s) == 4) {
            int sp = split_of(sname), gd = -1;
            int64_t gs = -1;
            samples++;
            char *p = strchr(l, ':') + 1, *q;
            int ok = mc_gpt_dataset_locate(ds, (mc_split)sp, idx, &gd, &gs, &err) == MC_OK &&
                     gd == d && gs == s &&
                     mc_gpt_dataset_sample(ds, (mc_split)sp, idx, tok, &err) == MC_OK;
            for (int64_t k = 0; ok && k < g->seq + g->extra; k++) {
                long v = strtol(p, &q, 10);
                if (q == p || v != tok[k]) ok = 0;
                p = q;
            }
            if (!ok && bad++ < 3) TAP_DIAG("%s: mismatch at line: %.80s", g->name, l);
        }
    }
    list_descriptions(cache, got_cache, sizeof got_cache);
    TAP_OK(bad == 0 && samples > 0,
           "%s: %zu samples equal to megatron-core's, token for token (%zu differ)", g->name,
           samples, bad);
    TAP_OK(bad_len == 0 && splits == 3, "%s: split lengths equal to megatron-core's", g->name);
    TAP_OK(strcmp(want_cache, got_cache) == 0 && want_cache[0],
           "%s: cache file names (md5 of Megatron's description) equal", g->name);
    if (strcmp(want_cache, got_cache) != 0) TAP_DIAG("want:\n%s got:\n%s", want_cache, got_cache);
    mc_gpt_dataset_close(ds);
}

static void golden(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/gptdata/megatron_samples.txt", srcdir());
    char *data;
    size_t len;
    mc_error err = {0};
    if (mc_read_file(path, &data, &len, &err) != MC_OK) {
        TAP_OK(0, "golden file readable: %s", err.msg);
        return;
    }
    size_t nl = 0, cap = 1024;
    char **lines = malloc(cap * sizeof *lines);
    for (char *p = data; *p;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        if (nl == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[nl++] = p;
        if (!e) break;
        p = e + 1;
    }
    for (size_t c = 0; c < N_CONFIGS; c++) {
        size_t beg = 0, end;
        char head[64];
        snprintf(head, sizeof head, "config %s", CONFIGS[c].name);
        while (beg < nl && strcmp(lines[beg], head) != 0) beg++;
        TAP_OK(beg < nl, "golden file has config %s", CONFIGS[c].name);
        if (beg == nl) continue;
        for (end = beg + 1; end < nl && strncmp(lines[end], "config ", 7) != 0; end++) {}
        check_config(&CONFIGS[c], lines, beg + 1, end);
    }
    free(lines);
    free(data);
}

static time_t mtime_of(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_mtim.tv_sec * 1000000000L + sb.st_mtim.tv_nsec : -1;
}

static void cache_reuse(void)
{
    char cache[400], path[600];
    snprintf(cache, sizeof cache, "cache-single");
    mc_gpt_dataset *a, *b;
    mc_error err = {0};
    /* golden() already built this cache; the reopen must build nothing */
    TAP_OK(open_config(&CONFIGS[0], cache, &a, &err) == MC_OK, "single: reopens");
    TAP_OK(mc_gpt_dataset_built(a) == 0, "second open reuses the cache (built %d index sets)",
           mc_gpt_dataset_built(a));
    snprintf(path, sizeof path, "%s-shuffle_index.npy",
             mc_gpt_dataset_cache_base(a, 0, MC_SPLIT_TRAIN));
    time_t m0 = mtime_of(path);
    mc_gpt_dataset_close(a);
    TAP_OK(open_config(&CONFIGS[0], cache, &b, &err) == MC_OK && mtime_of(path) == m0 && m0 > 0,
           "cached shuffle index not rewritten by a third open");
    mc_gpt_dataset_close(b);

    /* numpy.save's exact bytes: header padded to 64, then the data */
    static const char npy_head[] =
        "\x93NUMPY\x01\x00v\x00{'descr': '<u4', 'fortran_order': False, 'shape': (";
    FILE *f = fopen(path, "rb");
    unsigned char hdr[128] = {0};
    size_t got = f ? fread(hdr, 1, sizeof hdr, f) : 0;
    if (f) fclose(f);
    TAP_OK(got == 128 && memcmp(hdr, npy_head, sizeof npy_head - 1) == 0 && hdr[126] == ' ' &&
               hdr[127] == '\n',
           "shuffle index .npy header is numpy.save's");

    /* no cache dir: Megatron's PREFIX/cache/GPTDataset_indices */
    gd_config g = CONFIGS[1];
    mc_gptdata_config c;
    mc_gptdata_config_init(&c);
    char pa[300];
    snprintf(pa, sizeof pa, "%s/A", tmpdir);
    const char *words[1] = {pa};
    mc_gptdata_parse_data_path(words, 1, &c.blend, &err);
    c.split = g.split;
    c.seq_length = g.seq;
    c.seed = g.seed;
    for (int i = 0; i < 3; i++) c.num_samples[i] = g.sizes[i];
    c.tokenizer_json = TOKENIZER_JSON;
    mc_gpt_dataset *d;
    mc_status st = mc_gpt_dataset_open(&c, &d, &err);
    char dir[400], list[2048];
    snprintf(dir, sizeof dir, "%s/A/cache/GPTDataset_indices", tmpdir);
    list_descriptions(dir, list, sizeof list);
    TAP_OK(st == MC_OK && strlen(list) > 0, "default cache under PREFIX/cache/GPTDataset_indices");
    if (st == MC_OK) mc_gpt_dataset_close(d);

    /* a truncated cache file: a clear error naming it */
    const char *base = NULL;
    if (mc_gpt_dataset_open(&c, &d, &err) == MC_OK) {
        snprintf(path, sizeof path, "%s-sample_index.npy",
                 mc_gpt_dataset_cache_base(d, 0, MC_SPLIT_TRAIN));
        base = path;
        mc_gpt_dataset_close(d);
    }
    TAP_OK(base && truncate(base, 130) == 0, "truncate a cached sample index");
    st = mc_gpt_dataset_open(&c, &d, &err);
    TAP_OK(st == MC_ERR_FORMAT && strstr(err.msg, "sample_index.npy") &&
               strstr(err.msg, "header says"),
           "truncated cache file: error names it (%s)", err.msg);
    if (st == MC_OK) mc_gpt_dataset_close(d);
    mc_gptdata_blend_free(&c.blend);
}

static void parsing(void)
{
    double v[3];
    mc_error err = {0};
    TAP_OK(mc_gptdata_parse_split("969,30,1", v, &err) == MC_OK && v[0] == 0.969 && v[1] == 0.03 &&
               v[2] == 0.001,
           "split 969,30,1 -> 0.969 0.03 0.001");
    TAP_OK(mc_gptdata_parse_split("1", v, &err) == MC_OK && v[0] == 1 && v[1] == 0 && v[2] == 0,
           "split 1 -> 1 0 0 (missing weights are 0)");
    TAP_OK(mc_gptdata_parse_split("98 2", v, &err) == MC_OK && v[0] == 0.98 && v[1] == 0.02,
           "split '98 2': blanks separate");
    TAP_OK(mc_gptdata_parse_split("1,2,3,4", v, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "at most 3"),
           "split with 4 weights: %s", err.msg);
    TAP_OK(mc_gptdata_parse_split("0,0,0", v, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "all be zero"),
           "split 0,0,0: %s", err.msg);
    TAP_OK(mc_gptdata_parse_split("90,-5,5", v, &err) == MC_ERR_USAGE && strstr(err.msg, "'-'"),
           "negative split: %s", err.msg);
    TAP_OK(mc_gptdata_parse_split("9.1.1,1", v, &err) == MC_ERR_USAGE && strstr(err.msg, "'9.1.1'"),
           "split '9.1.1,1': %s", err.msg);
    TAP_OK(mc_gptdata_parse_split("train", v, &err) == MC_ERR_USAGE && strstr(err.msg, "'train'"),
           "split 'train': %s", err.msg);

    mc_gptdata_blend b;
    const char *w1[] = {"0.3", " A ", "0.7", "B"};
    TAP_OK(mc_gptdata_parse_data_path(w1, 4, &b, &err) == MC_OK && b.n == 2 && b.weights &&
               b.weights[0] == 0.3 && strcmp(b.prefixes[0], "A") == 0,
           "--data-path 0.3 A 0.7 B");
    mc_gptdata_blend_free(&b);
    const char *w2[] = {"A", "B"};
    TAP_OK(mc_gptdata_parse_data_path(w2, 2, &b, &err) == MC_OK && b.n == 2 && !b.weights,
           "--data-path A B is a bare list");
    mc_gptdata_blend_free(&b);
    const char *w3[] = {"0.3", "A", "x", "B"};
    TAP_OK(mc_gptdata_parse_data_path(w3, 4, &b, &err) == MC_ERR_USAGE && strstr(err.msg, "'x'"),
           "unparsable weight: %s", err.msg);
    const char *w4[] = {"-1", "A", "2", "B"};
    TAP_OK(mc_gptdata_parse_data_path(w4, 4, &b, &err) == MC_ERR_USAGE && strstr(err.msg, "'-1'") &&
               strstr(err.msg, "positive"),
           "negative weight: %s", err.msg);
    const char *w5[] = {"0", "A"};
    TAP_OK(mc_gptdata_parse_data_path(w5, 2, &b, &err) == MC_ERR_USAGE, "zero weight: %s", err.msg);
    TAP_OK(mc_gptdata_parse_data_path(w5, 0, &b, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "no dataset"),
           "empty --data-path: %s", err.msg);

    int64_t n[3];
    mc_gptdata_num_samples(1000, 100, 10, 8, n);
    TAP_OK(n[0] == 8000 && n[1] == 880 && n[2] == 80, "Megatron's train/valid/test sample counts");
}

static void internals(void)
{
    /* numpy: r = RandomState(1234); a = arange(20, dtype=int32); r.shuffle(a) */
    static const int32_t want[20] = {3,  13, 2,  16, 14, 5, 4,  0,  8, 18,
                                     17, 11, 10, 9,  7,  1, 19, 12, 6, 15};
    int32_t a[20];
    for (int i = 0; i < 20; i++) a[i] = i;
    mc_mt19937 rs;
    mc_mt_seed(&rs, 1234);
    mc_mt_shuffle(&rs, a, 20, 4);
    TAP_OK(memcmp(a, want, sizeof a) == 0, "RandomState(1234).shuffle equals numpy's");
    char hex[33], big[1000];
    mc_md5_hex("", 0, hex);
    TAP_OK(strcmp(hex, "d41d8cd98f00b204e9800998ecf8427e") == 0, "md5('')");
    mc_md5_hex("abc", 3, hex);
    TAP_OK(strcmp(hex, "900150983cd24fb0d6963f7d28e17f72") == 0, "md5('abc')");
    memset(big, 'x', sizeof big);
    mc_md5_hex(big, sizeof big, hex);
    TAP_OK(strcmp(hex, "398533d48111e9f664b1f64cb10c4b63") == 0, "md5('x'*1000) (hashlib)");
    struct {
        double x;
        const char *r;
    } reprs[] = {{0.969, "0.969"},
                 {0.03 + 0.969, "0.999"},
                 {1e-05, "1e-05"},
                 {1.5e16, "1.5e+16"},
                 {0.1 + 0.2, "0.30000000000000004"},
                 {100.0, "100.0"},
                 {123456789012345678.0, "1.2345678901234568e+17"},
                 {0.3 / 1.0000000000000002, "0.29999999999999993"}};
    int ok = 1;
    for (size_t i = 0; i < sizeof reprs / sizeof reprs[0]; i++) {
        char r[32];
        mc_py_float_repr(reprs[i].x, r);
        if (strcmp(r, reprs[i].r) != 0) {
            ok = 0;
            TAP_DIAG("repr %s != %s", r, reprs[i].r);
        }
    }
    TAP_OK(ok, "float repr as CPython writes it");
}

static void errors_and_mock(void)
{
    mc_gptdata_config c;
    mc_gpt_dataset *d;
    mc_error err = {0};
    char pa[300], pb[300], nope[300];
    snprintf(pa, sizeof pa, "%s/A", tmpdir);
    snprintf(pb, sizeof pb, "%s/B", tmpdir);
    snprintf(nope, sizeof nope, "%s/nope", tmpdir);

    mc_gptdata_config_init(&c);
    const char *w[] = {nope};
    mc_gptdata_parse_data_path(w, 1, &c.blend, &err);
    c.seq_length = 16;
    c.num_samples[0] = 10;
    TAP_OK(mc_gpt_dataset_open(&c, &d, &err) != MC_OK && strstr(err.msg, "nope"),
           "missing prefix: %s", err.msg);
    mc_gptdata_blend_free(&c.blend);

    /* 999,1,0 over 120 documents: valid is [120, 120), no tokens */
    const char *wa[] = {pa};
    mc_gptdata_parse_data_path(wa, 1, &c.blend, &err);
    c.split = "999,1,0";
    char cache[400];
    snprintf(cache, sizeof cache, "%s/cache-err", tmpdir);
    c.cache_dir = cache;
    TAP_OK(mc_gpt_dataset_open(&c, &d, &err) == MC_ERR_USAGE && strstr(err.msg, "valid split") &&
               strstr(err.msg, "0 tokens"),
           "empty split: %s", err.msg);
    c.split = "bad/split";
    TAP_OK(mc_gpt_dataset_open(&c, &d, &err) == MC_ERR_USAGE && strstr(err.msg, "--split"),
           "bad split string: %s", err.msg);
    mc_gptdata_blend_free(&c.blend);

    /* one epoch (num_samples None) of B is ~1270 tokens: too few for 5000 */
    const char *wb[] = {pb};
    mc_gptdata_parse_data_path(wb, 1, &c.blend, &err);
    c.split = "1,0,0";
    c.seq_length = 5000;
    c.num_samples[0] = -1;
    TAP_OK(mc_gpt_dataset_open(&c, &d, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "too few for one sample") && strstr(err.msg, "/B"),
           "dataset too small: %s", err.msg);
    /* with a sample count, epochs repeat instead */
    c.num_samples[0] = 3;
    mc_status st = mc_gpt_dataset_open(&c, &d, &err);
    TAP_OK(st == MC_OK && mc_gpt_dataset_num_samples(d, MC_SPLIT_TRAIN) >= 3,
           "3 samples of 5001 tokens from ~1270 tokens: %" PRId64 " samples over several epochs",
           st == MC_OK ? mc_gpt_dataset_num_samples(d, MC_SPLIT_TRAIN) : -1);
    if (st == MC_OK) mc_gpt_dataset_close(d);
    mc_gptdata_blend_free(&c.blend);

    /* mock data: same seed, same samples; other seed, other samples */
    mc_gptdata_config_init(&c);
    c.mock = 1;
    c.vocab_size = 50257;
    c.eod = 50256;
    c.seq_length = 32;
    c.seed = 5;
    for (int i = 0; i < 3; i++) c.num_samples[i] = 20;
    mc_gpt_dataset *m1, *m2, *m3;
    int32_t t1[33], t2[33], t3[33];
    st = mc_gpt_dataset_open(&c, &m1, &err);
    TAP_OK(st == MC_OK, "mock data opens (%s)", st == MC_OK ? "ok" : err.msg);
    if (st != MC_OK) return;
    mc_gpt_dataset_open(&c, &m2, &err);
    c.seed = 6;
    mc_gpt_dataset_open(&c, &m3, &err);
    int same = 1, differ = 0, in_range = 1;
    for (int sp = 0; sp < 3; sp++)
        for (int i = 0; i < 20; i++) {
            mc_gpt_dataset_sample(m1, (mc_split)sp, i, t1, &err);
            mc_gpt_dataset_sample(m2, (mc_split)sp, i, t2, &err);
            mc_gpt_dataset_sample(m3, (mc_split)sp, i, t3, &err);
            same &= memcmp(t1, t2, sizeof t1) == 0;
            differ += memcmp(t1, t3, sizeof t1) != 0;
            for (int k = 0; k < 33; k++) in_range &= t1[k] >= 0 && t1[k] < 50257;
        }
    TAP_OK(same, "mock data: same seed, same samples");
    TAP_OK(differ > 50, "mock data: another seed, other samples (%d of 60 differ)", differ);
    TAP_OK(in_range, "mock tokens within the vocabulary");
    TAP_OK(mc_gpt_dataset_cache_base(m1, 0, MC_SPLIT_TRAIN) == NULL, "mock data is not cached");
    TAP_OK(mc_gpt_dataset_sample(m1, MC_SPLIT_TRAIN, mc_gpt_dataset_num_samples(m1, MC_SPLIT_TRAIN),
                                 t1, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "out of range"),
           "sample index out of range: %s", err.msg);
    mc_gpt_dataset_close(m1);
    mc_gpt_dataset_close(m2);
    mc_gpt_dataset_close(m3);
}

/* Megatron Core's mock dataset (tests/data/gptdata/megatron_mock_samples.txt,
 * tests/golden/megatron_mock_samples.py): every split's length and its
 * listed samples, token for token. */
static void golden_mock(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/gptdata/megatron_mock_samples.txt", srcdir());
    FILE *f = fopen(path, "r");
    TAP_OK(f != NULL, "golden mock samples readable");
    if (!f) return;
    static char line[1 << 16];
    mc_gpt_dataset *d = NULL;
    mc_error err = {0};
    char name[64] = "";
    int64_t seq = 0;
    int bad = 0, samples = 0, configs = 0;
    while (fgets(line, sizeof line, f)) {
        char sname[16];
        long long v1, v2, v3, v4, v5, v6, v7;
        int used = 0;
        if (sscanf(line, "config %63s %lld %lld %lld %lld %lld %lld %lld", name, &v1, &v2, &v3, &v4,
                   &v5, &v6, &v7) == 8) {
            if (d) mc_gpt_dataset_close(d);
            mc_gptdata_config c;
            mc_gptdata_config_init(&c);
            c.mock = 1;
            c.vocab_size = v1;
            c.eod = (int32_t)v2;
            c.seq_length = seq = v3;
            c.seed = (uint32_t)v4;
            c.num_samples[0] = v5, c.num_samples[1] = v6, c.num_samples[2] = v7;
            mc_status st = mc_gpt_dataset_open(&c, &d, &err);
            configs++;
            if (st) {
                TAP_OK(0, "mock %s opens: %s", name, err.msg);
                d = NULL;
            }
        } else if (d && sscanf(line, "split %15s %lld", sname, &v1) == 2) {
            int sp = split_of(sname);
            int64_t n = mc_gpt_dataset_num_samples(d, (mc_split)sp);
            if (n != v1) {
                TAP_DIAG("mock %s: split %s has %lld samples, megatron-core %lld", name, sname,
                         (long long)n, v1);
                bad++;
            }
        } else if (d && sscanf(line, "%15s %lld: %n", sname, &v1, &used) == 2 && used > 0) {
            int32_t t[4200];
            char *p = line + used;
            mc_gpt_dataset_sample(d, (mc_split)split_of(sname), v1, t, &err);
            for (int64_t k = 0; k <= seq; k++) {
                long want = strtol(p, &p, 10);
                if (t[k] != want) {
                    if (bad++ < 3)
                        TAP_DIAG("mock %s %s %lld: token %lld is %d, megatron-core %ld", name,
                                 sname, v1, (long long)k, t[k], want);
                    break;
                }
            }
            samples++;
        }
    }
    fclose(f);
    if (d) mc_gpt_dataset_close(d);
    TAP_OK(configs == 2 && samples > 60 && bad == 0,
           "--mock-data is megatron-core's mock dataset: %d configurations, %d samples and the "
           "splits' lengths equal (%d differ)",
           configs, samples, bad);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mc-test-gptdata-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char txt[512], prefix[400];
    snprintf(txt, sizeof txt, "%s/tests/data/gptdata/docs_a.txt", srcdir());
    snprintf(prefix, sizeof prefix, "%s/A", tmpdir);
    int ok = write_docs(txt, prefix, MC_DTYPE_U16) == 0;
    snprintf(txt, sizeof txt, "%s/tests/data/gptdata/docs_b.txt", srcdir());
    snprintf(prefix, sizeof prefix, "%s/B", tmpdir);
    ok &= write_docs(txt, prefix, MC_DTYPE_I32) == 0;
    TAP_OK(ok, "datasets A (uint16) and B (int32) written from tests/data/gptdata");
    if (chdir(tmpdir) != 0) ok = 0;
    if (ok) {
        internals();
        parsing();
        golden();
        cache_reuse();
        errors_and_mock();
        golden_mock();
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) TAP_DIAG("could not remove %s", tmpdir);
    return tap_done();
}
