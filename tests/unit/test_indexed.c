/*
 * test_indexed.c - the indexed dataset (lib/data/indexed.c): round trips for
 * uint16 and int32, the exact bytes of a tiny .idx/.bin against bytes worked
 * out by hand from megatron-core's _IndexWriter, merge against a single
 * write of the same documents, and every rejection of a malformed dataset
 * with its message. Byte-level agreement with megatron-core itself is
 * checked by tests/tools/megatron_indexed.bats.
 */
#include "mc/indexed.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"

static char dir[512];

static const char *path_in(const char *name)
{
    static char p[2][1024];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *d;
    long n;
    *len = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    d = malloc(n > 0 ? (size_t)n : 1);
    if (d && n > 0 && fread(d, 1, (size_t)n, f) != (size_t)n) {
        free(d);
        d = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return d;
}

static void spit(const char *path, const void *d, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(d, 1, len, f) != len)) {
        printf("Bail out! cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static int same_file(const char *a, const char *b)
{
    size_t la, lb;
    unsigned char *da = slurp(a, &la), *db = slurp(b, &lb);
    int same = da && db && la == lb && memcmp(da, db, la) == 0;
    free(da);
    free(db);
    return same;
}

/* Number of files in dir whose names contain ".tmp." (leftover temporaries). */
static int count_temporaries(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void remove_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(path_in(e->d_name));
    if (d) closedir(d);
    rmdir(dir);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A set of documents held as one flat id array plus offsets. */
typedef struct docs {
    int32_t *ids;
    size_t *start; /* n+1 offsets */
    size_t n;
} docs;

static docs make_docs(size_t n, size_t max_len, int32_t max_id)
{
    docs d;
    size_t total = 0;
    d.n = n;
    d.start = malloc((n + 1) * sizeof *d.start);
    d.start[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = (i % 17 == 3) ? 0 : (size_t)(rng() % (max_len + 1));
        total += len;
        d.start[i + 1] = total;
    }
    d.ids = malloc((total ? total : 1) * sizeof *d.ids);
    for (size_t t = 0; t < total; t++) d.ids[t] = (int32_t)(rng() % ((uint64_t)max_id + 1));
    /* make sure the extremes appear */
    if (total >= 2) {
        d.ids[0] = max_id;
        d.ids[total - 1] = 0;
    }
    return d;
}

static void free_docs(docs *d)
{
    free(d->ids);
    free(d->start);
}

static mc_status write_docs(const char *prefix, mc_dtype dt, const docs *d, size_t from, size_t to,
                            mc_error *err)
{
    mc_idx_writer *w;
    mc_status st = mc_idx_writer_open(prefix, dt, &w, err);
    if (st != MC_OK) return st;
    for (size_t i = from; i < to; i++) {
        st = mc_idx_writer_add(w, d->ids + d->start[i], d->start[i + 1] - d->start[i], err);
        if (st != MC_OK) {
            mc_idx_writer_abort(w);
            return st;
        }
    }
    return mc_idx_writer_commit(w, err);
}

/* Every length, pointer, document index and id of prefix equals d. */
static int check_dataset(const char *prefix, mc_dtype dt, const docs *d, size_t from, size_t to)
{
    mc_idx x;
    mc_error err = {0};
    mc_ids got = MC_IDS_INIT;
    size_t esize = mc_dtype_size(dt);
    int64_t ptr = 0;
    int ok = 1;
    if (mc_idx_open(prefix, &x, &err) != MC_OK) {
        TAP_DIAG("open %s: %s", prefix, err.msg);
        return 0;
    }
    if (x.dtype != dt || x.n_seq != to - from || x.n_doc_idx != to - from + 1) {
        TAP_DIAG("%s: dtype %d n_seq %" PRIu64 " n_doc_idx %" PRIu64, prefix, (int)x.dtype, x.n_seq,
                 x.n_doc_idx);
        ok = 0;
    }
    for (size_t i = from; ok && i < to; i++) {
        uint64_t s = i - from;
        size_t len = d->start[i + 1] - d->start[i];
        got.n = 0;
        if (mc_idx_length(&x, s) != (int32_t)len || mc_idx_pointer(&x, s) != ptr ||
            mc_idx_doc_index(&x, s) != (int64_t)s) {
            TAP_DIAG("%s: sequence %" PRIu64 ": length %d pointer %" PRId64 " doc %" PRId64, prefix,
                     s, (int)mc_idx_length(&x, s), mc_idx_pointer(&x, s), mc_idx_doc_index(&x, s));
            ok = 0;
        } else if (mc_idx_read(&x, s, &got, &err) != MC_OK) {
            TAP_DIAG("read: %s", err.msg);
            ok = 0;
        } else if (got.n != len || (len && memcmp(got.v, d->ids + d->start[i], len * 4))) {
            TAP_DIAG("%s: sequence %" PRIu64 ": ids differ", prefix, s);
            ok = 0;
        }
        ptr += (int64_t)(len * esize);
    }
    if (ok && mc_idx_doc_index(&x, to - from) != (int64_t)(to - from)) ok = 0;
    if (ok && x.bin.len != (size_t)ptr) ok = 0;
    mc_ids_free(&got);
    mc_idx_close(&x);
    return ok;
}

static void test_dtype_for_vocab(void)
{
    TAP_OK(mc_idx_dtype_for_vocab(50257) == MC_DTYPE_U16, "vocab 50257 -> uint16");
    TAP_OK(mc_idx_dtype_for_vocab(65499) == MC_DTYPE_U16, "vocab 65499 -> uint16");
    TAP_OK(mc_idx_dtype_for_vocab(65500) == MC_DTYPE_I32, "vocab 65500 -> int32 (Megatron's rule)");
    TAP_OK(mc_idx_dtype_for_vocab(128256) == MC_DTYPE_I32, "vocab 128256 -> int32");
}

static void test_roundtrip(mc_dtype dt, int32_t max_id, const char *name)
{
    docs d = make_docs(300, 257, max_id);
    char prefix[600];
    mc_idx_writer *w;
    mc_error err = {0};
    mc_status st;
    uint64_t tokens = 0;
    size_t blen;
    unsigned char *bin;

    snprintf(prefix, sizeof prefix, "%s", path_in(name));
    st = mc_idx_writer_open(prefix, dt, &w, &err);
    TAP_OK(st == MC_OK, "%s: writer opens (%s)", name, err.msg);
    if (st != MC_OK) return;
    for (size_t i = 0; st == MC_OK && i < d.n; i++) {
        st = mc_idx_writer_add(w, d.ids + d.start[i], d.start[i + 1] - d.start[i], &err);
        tokens += d.start[i + 1] - d.start[i];
    }
    TAP_OK(st == MC_OK, "%s: 300 documents added (%s)", name, err.msg);
    TAP_OK(mc_idx_writer_documents(w) == 300 && mc_idx_writer_tokens(w) == tokens,
           "%s: writer counts 300 documents, %" PRIu64 " tokens", name, tokens);
    {
        char b[700], i[700];
        snprintf(b, sizeof b, "%s.bin", prefix);
        snprintf(i, sizeof i, "%s.idx", prefix);
        TAP_OK(!exists(b) && !exists(i), "%s: nothing under the final names before commit", name);
        st = mc_idx_writer_commit(w, &err);
        TAP_OK(st == MC_OK, "%s: commit (%s)", name, err.msg);
        TAP_OK(exists(b) && exists(i) && count_temporaries() == 0,
               "%s: both files in place, no temporaries left", name);
        bin = slurp(b, &blen);
        TAP_OK(blen == tokens * mc_dtype_size(dt), "%s: .bin holds %" PRIu64 " x %zu bytes", name,
               tokens, mc_dtype_size(dt));
        /* first id is max_id, little-endian */
        if (dt == MC_DTYPE_U16)
            TAP_OK(bin && bin[0] == (max_id & 0xff) && bin[1] == (max_id >> 8),
                   "%s: ids stored little-endian", name);
        else
            TAP_OK(bin && bin[0] == (max_id & 0xff) && bin[3] == ((uint32_t)max_id >> 24),
                   "%s: ids stored little-endian", name);
        free(bin);
    }
    TAP_OK(check_dataset(prefix, dt, &d, 0, d.n), "%s: every length, pointer and id reads back",
           name);
    free_docs(&d);
}

/* docs {1,2,3}, {}, {65535,256} as uint16; worked out from _IndexWriter. */
static const unsigned char tiny_idx[102] = {
    'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,          /* magic */
    1,   0,   0,   0,   0,   0,   0,   0,             /* version 1 */
    8,                                                /* dtype uint16 */
    3,   0,   0,   0,   0,   0,   0,   0,             /* 3 sequences */
    4,   0,   0,   0,   0,   0,   0,   0,             /* 4 document indices */
    3,   0,   0,   0,   0,   0,   0,   0, 2, 0, 0, 0, /* lengths 3 0 2 */
    0,   0,   0,   0,   0,   0,   0,   0,             /* pointers 0 */
    6,   0,   0,   0,   0,   0,   0,   0,             /*          6 */
    6,   0,   0,   0,   0,   0,   0,   0,             /*          6 */
    0,   0,   0,   0,   0,   0,   0,   0,             /* document indices 0 */
    1,   0,   0,   0,   0,   0,   0,   0,             /*                  1 */
    2,   0,   0,   0,   0,   0,   0,   0,             /*                  2 */
    3,   0,   0,   0,   0,   0,   0,   0,             /*                  3 */
};
static const unsigned char tiny_bin[10] = {1, 0, 2, 0, 3, 0, 0xff, 0xff, 0, 1};

static void test_exact_bytes(void)
{
    const int32_t a[] = {1, 2, 3}, c[] = {65535, 256}, e[] = {7}, f[] = {70000};
    mc_idx_writer *w;
    mc_error err = {0};
    size_t len;
    unsigned char *got;
    int ok;

    ok = mc_idx_writer_open(path_in("tiny"), MC_DTYPE_U16, &w, &err) == MC_OK &&
         mc_idx_writer_add(w, a, 3, &err) == MC_OK &&
         mc_idx_writer_add(w, NULL, 0, &err) == MC_OK &&
         mc_idx_writer_add(w, c, 2, &err) == MC_OK && mc_idx_writer_commit(w, &err) == MC_OK;
    TAP_OK(ok, "tiny uint16 dataset written, with a 0-token document (%s)", err.msg);
    got = slurp(path_in("tiny.idx"), &len);
    TAP_OK(got && len == sizeof tiny_idx && memcmp(got, tiny_idx, len) == 0,
           "tiny.idx equals the 102 bytes worked out by hand");
    free(got);
    got = slurp(path_in("tiny.bin"), &len);
    TAP_OK(got && len == sizeof tiny_bin && memcmp(got, tiny_bin, len) == 0,
           "tiny.bin equals 01 00 02 00 03 00 ff ff 00 01");
    free(got);

    /* int32: docs {7}, {70000} */
    {
        static const unsigned char want_bin[8] = {7, 0, 0, 0, 0x70, 0x11, 0x01, 0};
        unsigned char want_idx[34 + 2 * 12 + 3 * 8] = {0};
        memcpy(want_idx, "MMIDIDX\0\0", 9);
        want_idx[9] = 1;
        want_idx[17] = 4;
        want_idx[18] = 2;
        want_idx[26] = 3;
        want_idx[34] = 1;     /* length 1 */
        want_idx[38] = 1;     /* length 1 */
        want_idx[42 + 8] = 4; /* pointer 0, 4 */
        want_idx[58 + 8] = 1; /* document indices 0 1 2 */
        want_idx[58 + 16] = 2;
        ok = mc_idx_writer_open(path_in("tiny32"), MC_DTYPE_I32, &w, &err) == MC_OK &&
             mc_idx_writer_add(w, e, 1, &err) == MC_OK &&
             mc_idx_writer_add(w, f, 1, &err) == MC_OK && mc_idx_writer_commit(w, &err) == MC_OK;
        TAP_OK(ok, "tiny int32 dataset written (%s)", err.msg);
        got = slurp(path_in("tiny32.idx"), &len);
        TAP_OK(got && len == sizeof want_idx && memcmp(got, want_idx, len) == 0,
               "tiny32.idx equals the 82 bytes worked out by hand");
        free(got);
        got = slurp(path_in("tiny32.bin"), &len);
        TAP_OK(got && len == 8 && memcmp(got, want_bin, 8) == 0,
               "tiny32.bin equals 07 00 00 00 70 11 01 00");
        free(got);
    }
}

static void test_empty_dataset(void)
{
    mc_idx_writer *w;
    mc_idx x;
    mc_error err = {0};
    size_t len;
    unsigned char *got;
    int ok = mc_idx_writer_open(path_in("empty"), MC_DTYPE_U16, &w, &err) == MC_OK &&
             mc_idx_writer_commit(w, &err) == MC_OK;
    TAP_OK(ok, "a dataset of no documents commits (%s)", err.msg);
    got = slurp(path_in("empty.idx"), &len);
    TAP_OK(got && len == 42 && memcmp(got, tiny_idx, 18) == 0 && got[18] == 0 && got[26] == 1,
           "its .idx is the header with S=0, D=1 and the single document index 0");
    free(got);
    ok = mc_idx_open(path_in("empty"), &x, &err) == MC_OK;
    TAP_OK(ok && x.n_seq == 0 && x.n_doc_idx == 1 && x.bin.len == 0 && mc_idx_doc_index(&x, 0) == 0,
           "and it opens (%s)", err.msg);
    if (ok) mc_idx_close(&x);
}

static void test_writer_errors(void)
{
    const int32_t good[] = {5, 6}, big[] = {1, 65536}, neg[] = {-1}, top[] = {65535};
    mc_idx_writer *w = NULL;
    mc_error err = {0};
    mc_status st;
    mc_ids got = MC_IDS_INIT;
    mc_idx x;

    st = mc_idx_writer_open(path_in("range"), MC_DTYPE_U16, &w, &err);
    TAP_OK(st == MC_OK, "range: writer opens");
    if (st != MC_OK) return;
    mc_idx_writer_add(w, good, 2, &err);
    mc_idx_writer_add(w, good, 1, &err);
    st = mc_idx_writer_add(w, big, 2, &err);
    TAP_OK(st == MC_ERR_LIMIT && strstr(err.msg, "range.bin: document 2: token id 65536 at "
                                                 "position 1 does not fit uint16 (0..65535)"),
           "uint16: id 65536 rejected, naming the document: %s", err.msg);
    st = mc_idx_writer_add(w, neg, 1, &err);
    TAP_OK(st == MC_ERR_LIMIT &&
               strstr(err.msg, "document 2: token id -1 at position 0 does not fit "
                               "uint16"),
           "uint16: id -1 rejected: %s", err.msg);
    st = mc_idx_writer_add(w, top, 1, &err);
    TAP_OK(st == MC_OK, "uint16: 65535 accepted after the rejections");
    TAP_OK(mc_idx_writer_documents(w) == 3 && mc_idx_writer_tokens(w) == 4,
           "rejected documents are not counted");
    st = mc_idx_writer_commit(w, &err);
    TAP_OK(st == MC_OK && mc_idx_open(path_in("range"), &x, &err) == MC_OK,
           "the writer stays usable after a rejected document");
    if (st == MC_OK && x.n_seq == 3) {
        mc_idx_read(&x, 0, &got, &err);
        mc_idx_read(&x, 1, &got, &err);
        mc_idx_read(&x, 2, &got, &err);
        TAP_OK(got.n == 4 && got.v[0] == 5 && got.v[1] == 6 && got.v[2] == 5 && got.v[3] == 65535,
               "only the accepted documents are in the file");
        st = mc_idx_read(&x, 3, &got, &err);
        TAP_OK(st == MC_ERR_USAGE && strstr(err.msg, "sequence 3 asked for, the dataset has 3"),
               "reading past the last sequence is refused: %s", err.msg);
        TAP_OK(mc_idx_length(&x, 3) == -1 && mc_idx_pointer(&x, 3) == -1 &&
                   mc_idx_doc_index(&x, 4) == -1,
               "accessors return -1 past the end");
        mc_idx_close(&x);
    } else {
        TAP_OK(0, "range dataset has 3 sequences");
    }
    mc_ids_free(&got);

    st = mc_idx_writer_open(path_in("range32"), MC_DTYPE_I32, &w, &err);
    if (st == MC_OK) {
        st = mc_idx_writer_add(w, neg, 1, &err);
        TAP_OK(st == MC_ERR_LIMIT &&
                   strstr(err.msg, "range32.bin: document 0: token id -1 at position 0 does not "
                                   "fit int32 (0..2147483647)"),
               "int32: id -1 rejected: %s", err.msg);
        mc_idx_writer_abort(w);
    } else {
        TAP_OK(0, "range32 writer opens: %s", err.msg);
    }
    TAP_OK(!exists(path_in("range32.bin")) && !exists(path_in("range32.idx")) &&
               count_temporaries() == 0,
           "abort leaves neither the files nor temporaries");
    mc_idx_writer_abort(NULL);

    st = mc_idx_writer_open(path_in("float"), MC_DTYPE_F32, &w, &err);
    TAP_OK(st == MC_ERR_USAGE && w == NULL &&
               strstr(err.msg, "dtype float32 (code 7) cannot hold token ids"),
           "a float dtype is refused: %s", err.msg);
    st = mc_idx_writer_open(path_in("no/such/dir/x"), MC_DTYPE_U16, &w, &err);
    TAP_OK(st != MC_OK && w == NULL && strstr(err.msg, "no/such/dir/x.bin"),
           "a missing output directory is reported with the path: %s", err.msg);
}

static void test_merge(void)
{
    docs d = make_docs(40, 50, 65535);
    mc_error err = {0};
    const char *names[4];
    char p[5][600];
    int ok = 1;
    mc_status st;

    /* parts: [0,12) [12,12) [12,25) [25,40) */
    static const size_t cut[5] = {0, 12, 12, 25, 40};
    for (int i = 0; i < 4; i++) {
        snprintf(p[i], sizeof p[i], "%s%d", path_in("part"), i);
        if (write_docs(p[i], MC_DTYPE_U16, &d, cut[i], cut[i + 1], &err) != MC_OK) ok = 0;
    }
    snprintf(p[4], sizeof p[4], "%s", path_in("whole"));
    if (write_docs(p[4], MC_DTYPE_U16, &d, 0, 40, &err) != MC_OK) ok = 0;
    TAP_OK(ok, "merge inputs written (%s)", err.msg);

    names[0] = p[0], names[1] = p[2], names[2] = p[3];
    {
        /* 3 datasets, no empty one: equals writing docs [0,12)+[12,40) */
        char m[600];
        snprintf(m, sizeof m, "%s", path_in("merged3"));
        st = mc_idx_merge(names, 3, m, &err);
        TAP_OK(st == MC_OK, "merge of 3 datasets (%s)", err.msg);
        TAP_OK(same_file(path_in("merged3.bin"), path_in("whole.bin")) &&
                   same_file(path_in("merged3.idx"), path_in("whole.idx")),
               "merged .bin and .idx equal one write of all 40 documents, byte for byte");
        TAP_OK(check_dataset(m, MC_DTYPE_U16, &d, 0, 40), "merged dataset reads back every id");
    }
    for (int i = 0; i < 4; i++) names[i] = p[i];
    st = mc_idx_merge(names, 4, path_in("merged4"), &err);
    TAP_OK(st == MC_OK && same_file(path_in("merged4.bin"), path_in("whole.bin")) &&
               same_file(path_in("merged4.idx"), path_in("whole.idx")),
           "merge with an empty dataset among the inputs equals the single write (%s)", err.msg);
    TAP_OK(count_temporaries() == 0, "merge leaves no temporaries");

    /* mismatched dtypes */
    {
        const int32_t one[] = {1};
        mc_idx_writer *w;
        char p32[600];
        snprintf(p32, sizeof p32, "%s", path_in("other32"));
        if (mc_idx_writer_open(p32, MC_DTYPE_I32, &w, &err) == MC_OK) {
            mc_idx_writer_add(w, one, 1, &err);
            mc_idx_writer_commit(w, &err);
        }
        names[0] = p[0];
        names[1] = p32;
        st = mc_idx_merge(names, 2, path_in("mixed"), &err);
        TAP_OK(st == MC_ERR_FORMAT &&
                   strstr(err.msg, "other32: dtype int32 differs from uint16 in ") &&
                   strstr(err.msg, "part0"),
               "merge of uint16 and int32 rejected naming the prefix: %s", err.msg);
        TAP_OK(!exists(path_in("mixed.bin")) && !exists(path_in("mixed.idx")) &&
                   count_temporaries() == 0,
               "a refused merge writes nothing");
    }
    names[1] = path_in("nonexistent");
    st = mc_idx_merge(names, 2, path_in("mixed"), &err);
    TAP_OK(st == MC_ERR_IO && strstr(err.msg, "nonexistent.idx: cannot open"),
           "merge with a missing input names it: %s", err.msg);
    st = mc_idx_merge(names, 0, path_in("mixed"), &err);
    TAP_OK(st == MC_ERR_USAGE && strstr(err.msg, "nothing to merge"),
           "merge of no inputs refused: %s", err.msg);
    free_docs(&d);
}

/* Write idx/bin bytes as "bad", open it, expect failure with want in the message. */
static void expect_bad(const unsigned char *idx, size_t idx_len, const unsigned char *bin,
                       size_t bin_len, const char *want, const char *what)
{
    mc_idx x;
    mc_error err = {0};
    mc_status st;
    unlink(path_in("bad.idx"));
    unlink(path_in("bad.bin"));
    if (idx) spit(path_in("bad.idx"), idx, idx_len);
    if (bin) spit(path_in("bad.bin"), bin, bin_len);
    memset(&x, 0xab, sizeof x);
    st = mc_idx_open(path_in("bad"), &x, &err);
    TAP_OK(st != MC_OK && strstr(err.msg, want) && x.idx.data == NULL && x.bin.data == NULL &&
               x.prefix == NULL,
           "%s rejected: %s", what, err.msg);
    if (st == MC_OK) mc_idx_close(&x);
}

static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

static void test_corrupt(void)
{
    unsigned char b[sizeof tiny_idx + 8];
    char want[256];
    static const size_t cuts_header[] = {0, 1, 9, 17, 25, 33};
    static const size_t cuts_body[] = {34, 46, 70, 101};

    /* the untouched tiny dataset opens, so each rejection below is the edit's doing */
    {
        mc_idx x;
        mc_error err = {0};
        spit(path_in("good.idx"), tiny_idx, sizeof tiny_idx);
        spit(path_in("good.bin"), tiny_bin, sizeof tiny_bin);
        TAP_OK(mc_idx_open(path_in("good"), &x, &err) == MC_OK && x.n_seq == 3 &&
                   x.dtype == MC_DTYPE_U16,
               "the hand-made tiny dataset opens (%s)", err.msg);
        mc_idx_close(&x);
    }
    expect_bad(tiny_idx, sizeof tiny_idx, tiny_bin, sizeof tiny_bin - 2,
               "bad.bin: 8 bytes but the index describes 10", ".bin two bytes short");
    expect_bad(tiny_idx, sizeof tiny_idx, tiny_bin, 0,
               "bad.bin: 0 bytes but the index describes 10", "empty .bin");
    {
        unsigned char longer[11];
        memcpy(longer, tiny_bin, 10);
        longer[10] = 0;
        expect_bad(tiny_idx, sizeof tiny_idx, longer, 11,
                   "bad.bin: 11 bytes but the index describes 10", ".bin one byte long");
    }
    expect_bad(tiny_idx, sizeof tiny_idx, NULL, 0, "bad.bin: cannot open", "missing .bin");
    expect_bad(NULL, 0, tiny_bin, sizeof tiny_bin, "bad.idx: cannot open", "missing .idx");

#define RESET() memcpy(b, tiny_idx, sizeof tiny_idx)
    RESET();
    b[0] = 'X';
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: bad magic (not a Megatron MMIDIDX index)", "bad magic");
    RESET();
    b[8] = 1;
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "bad.idx: bad magic",
               "magic with a wrong padding byte");
    RESET();
    put64(b + 9, 2);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: unsupported version 2 (only version 1 is known)", "version 2");
    RESET();
    put64(b + 9, 1ull << 32 | 1);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: unsupported version 4294967297", "version with high bits set");
    RESET();
    b[17] = 9;
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "bad.idx: unknown dtype code 9",
               "dtype 9");
    RESET();
    b[17] = 0;
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "bad.idx: unknown dtype code 0",
               "dtype 0");

    for (size_t i = 0; i < sizeof cuts_header / sizeof *cuts_header; i++) {
        snprintf(want, sizeof want,
                 "bad.idx: file is %zu bytes, shorter than the 34-byte MMIDIDX header",
                 cuts_header[i]);
        expect_bad(tiny_idx, cuts_header[i], tiny_bin, sizeof tiny_bin, want, "truncated header");
    }
    for (size_t i = 0; i < sizeof cuts_body / sizeof *cuts_body; i++) {
        snprintf(want, sizeof want, "bad.idx: file is %zu bytes but header counts need 102",
                 cuts_body[i]);
        expect_bad(tiny_idx, cuts_body[i], tiny_bin, sizeof tiny_bin, want, "truncated arrays");
    }
    RESET();
    expect_bad(b, sizeof tiny_idx + 1, tiny_bin, sizeof tiny_bin,
               "bad.idx: file is 103 bytes but header counts need 102",
               "trailing byte after the arrays");

    RESET();
    put64(b + 18, 1000);
    expect_bad(
        b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
        "bad.idx: file is 102 bytes but header counts need 12066 (1000 sequences, 4 document "
        "indices)",
        "sequence count larger than the file");
    RESET();
    put64(b + 26, 1u << 20);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: file is 102 bytes but header counts need 8388678",
               "document count larger than the file");
    RESET();
    put64(b + 18, UINT64_MAX);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: file is 102 bytes but header counts need more than 2^64 "
               "(18446744073709551615 sequences",
               "sequence count UINT64_MAX");
    RESET();
    put64(b + 18, UINT64_MAX / 12); /* 12*S still fits, 12*S + 34 + 8*D does not */
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "header counts need more than 2^64",
               "sequence count UINT64_MAX/12");
    RESET();
    put64(b + 18, ((uint64_t)1 << 62) + 3); /* 12*S wraps to 36: naive sum gives 102 */
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "header counts need more than 2^64",
               "sequence count 2^62+3 (wraps to the real size)");
    RESET();
    put64(b + 26, UINT64_MAX);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "header counts need more than 2^64",
               "document count UINT64_MAX");
    RESET();
    put64(b + 26, ((uint64_t)1 << 61) + 4); /* 8*D wraps to 32: naive sum gives 102 */
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin, "header counts need more than 2^64",
               "document count 2^61+4 (wraps to the real size)");

    RESET();
    put32(b + 34 + 4, (uint32_t)-1);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: sequence 1: negative length -1", "negative length");
    RESET();
    put32(b + 34 + 8, 5);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.bin: 10 bytes but the index describes 16",
               "last length too large for the .bin");
    RESET();
    put64(b + 46, 2);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: sequence 0: pointer 2 is not 0", "first pointer not 0");
    RESET();
    put64(b + 46 + 8, 4);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: sequence 1: pointer 4 does not follow the previous sequence (expected 6)",
               "pointer inconsistent with lengths");
    RESET();
    put64(b + 46 + 16, (uint64_t)-1);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: sequence 2: pointer -1 does not follow the previous sequence (expected 6)",
               "negative pointer");
    RESET();
    put32(b + 34, 0x7fffffff); /* the other pointers then no longer follow */
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: sequence 1: pointer 6 does not follow the previous sequence (expected "
               "4294967294)",
               "huge length");

    RESET();
    put64(b + 70 + 16, 1);
    put64(b + 70 + 8, 2);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: document index 2: 1 is less than the previous 2",
               "decreasing document index");
    RESET();
    put64(b + 70, 1);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: document index 0 is 1, expected 0", "document index not starting at 0");
    RESET();
    put64(b + 70 + 24, 2);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: last document index is 2 but there are 3 sequences",
               "document indices ending before the last sequence");
    RESET();
    put64(b + 70 + 16, 5);
    put64(b + 70 + 24, 5);
    expect_bad(b, sizeof tiny_idx, tiny_bin, sizeof tiny_bin,
               "bad.idx: document index 2: 5 is past the 3 sequences",
               "document index past the end");
    RESET();
    put64(b + 18, 0);
    put64(b + 26, 0);
    expect_bad(b, 34, tiny_bin, 0, "bad.idx: no document indices", "no document indices at all");
#undef RESET
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mc-test-indexed.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        printf("Bail out! mkdtemp %s failed\n", dir);
        return 1;
    }
    test_dtype_for_vocab();
    test_roundtrip(MC_DTYPE_U16, 65535, "u16");
    test_roundtrip(MC_DTYPE_I32, INT32_MAX, "i32");
    test_exact_bytes();
    test_empty_dataset();
    test_writer_errors();
    test_merge();
    test_corrupt();
    remove_dir();
    return tap_done();
}
