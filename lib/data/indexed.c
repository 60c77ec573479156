/*
 * indexed.c - Megatron's indexed dataset (PREFIX.bin + PREFIX.idx, MMIDIDX
 * version 1): the streaming writer, the validating reader and the merge of
 * several datasets into one. The layout is described in lib/mc/indexed.h;
 * why the writer leaves no stale pair and the reader trusts no number, in
 * doc/ARCHITECTURE.md, "Data". The on-disk format is little-endian; so are
 * the hosts mc runs on.
 */
#include "mc/indexed.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "indexed.c assumes a little-endian host (the .idx/.bin format is little-endian)"
#endif

#define IDX_MAGIC "MMIDIDX\0\0"
#define IDX_MAGIC_LEN 9
#define IDX_VERSION 1
/* magic 9 + version 8 + dtype 1 + S 8 + D 8 */
#define IDX_HEADER_LEN 34
/* Elements converted per chunk when streaming arrays out. */
#define IDX_CHUNK 4096
/* Bytes per write when concatenating .bin files in a merge. */
#define MERGE_COPY_CHUNK ((size_t)8 << 20)

mc_dtype mc_idx_dtype_for_vocab(int64_t vocab_size)
{
    /* megatron.core.datasets.indexed_dataset.DType.optimal_dtype */
    return vocab_size < 65500 ? MC_DTYPE_U16 : MC_DTYPE_I32;
}

static char *path_with_suffix(const char *prefix, const char *suffix)
{
    size_t a = strlen(prefix), b = strlen(suffix);
    char *p = malloc(a + b + 1);
    if (p) {
        memcpy(p, prefix, a);
        memcpy(p + a, suffix, b + 1);
    }
    return p;
}

/* Largest token id a dtype can hold; 0 for dtypes that cannot hold ids. */
static int64_t dtype_id_max(mc_dtype dt)
{
    switch (dt) {
    case MC_DTYPE_U8: return 255;
    case MC_DTYPE_I8: return 127;
    case MC_DTYPE_I16: return 32767;
    case MC_DTYPE_U16: return 65535;
    case MC_DTYPE_I32:
    case MC_DTYPE_I64: return INT32_MAX; /* ids arrive as int32 */
    default: return 0;
    }
}

/* Store n ids (already range-checked) as dtype elements at dst. */
static void encode_ids(mc_dtype dt, const int32_t *ids, size_t n, unsigned char *dst)
{
    size_t i;
    switch (dt) {
    case MC_DTYPE_U8:
    case MC_DTYPE_I8:
        for (i = 0; i < n; i++) dst[i] = (unsigned char)ids[i];
        break;
    case MC_DTYPE_U16:
    case MC_DTYPE_I16:
        for (i = 0; i < n; i++) {
            uint16_t v = (uint16_t)ids[i];
            memcpy(dst + 2 * i, &v, 2);
        }
        break;
    case MC_DTYPE_I32: memcpy(dst, ids, n * 4); break;
    case MC_DTYPE_I64:
        for (i = 0; i < n; i++) {
            int64_t v = ids[i];
            memcpy(dst + 8 * i, &v, 8);
        }
        break;
    default: break;
    }
}

/* Write the 34-byte header. */
static mc_status write_header(mc_afile *f, mc_dtype dt, uint64_t n_seq, uint64_t n_doc,
                              mc_error *err)
{
    unsigned char h[IDX_HEADER_LEN];
    uint64_t version = IDX_VERSION;
    memcpy(h, IDX_MAGIC, IDX_MAGIC_LEN);
    memcpy(h + 9, &version, 8);
    h[17] = (unsigned char)dt;
    memcpy(h + 18, &n_seq, 8);
    memcpy(h + 26, &n_doc, 8);
    return mc_afile_write(f, h, sizeof h, err);
}

/* Commit the .bin, then the .idx. If the .idx cannot be committed, the new
 * .bin is removed again so that an older .idx under the same prefix is not
 * left beside a .bin it does not describe. */
static mc_status commit_pair(mc_afile *bin, mc_afile *idx, const char *bin_path, mc_error *err)
{
    mc_status st = mc_afile_commit(bin, err);
    if (st != MC_OK) {
        mc_afile_abort(idx);
        return st;
    }
    st = mc_afile_commit(idx, err);
    if (st != MC_OK) {
        mc_afile_abort(idx);
        unlink(bin_path);
    }
    return st;
}

/* ------------------------------------------------------------------ writer */

struct mc_idx_writer {
    char *bin_path;
    mc_dtype dtype;
    size_t esize;
    int64_t id_max;
    mc_afile bin, idx;
    int32_t *lengths; /* one per document */
    size_t n, cap;
    uint64_t tokens;
    unsigned char *conv; /* ids encoded in the dtype, on their way to .bin */
    size_t conv_cap;
};

static void writer_free(mc_idx_writer *w)
{
    free(w->bin_path);
    free(w->lengths);
    free(w->conv);
    free(w);
}

mc_status mc_idx_writer_open(const char *prefix, mc_dtype dtype, mc_idx_writer **out, mc_error *err)
{
    mc_idx_writer *w;
    char *idx_path;
    mc_status st;

    *out = NULL;
    if (dtype_id_max(dtype) == 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: dtype %s (code %d) cannot hold token ids",
                            prefix, mc_dtype_name(dtype) ? mc_dtype_name(dtype) : "unknown",
                            (int)dtype);
    w = calloc(1, sizeof *w);
    if (!w) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", prefix);
    w->dtype = dtype;
    w->esize = mc_dtype_size(dtype);
    w->id_max = dtype_id_max(dtype);
    w->bin_path = path_with_suffix(prefix, ".bin");
    idx_path = path_with_suffix(prefix, ".idx");
    if (!w->bin_path || !idx_path) {
        free(idx_path);
        writer_free(w);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", prefix);
    }
    st = mc_afile_open(&w->bin, w->bin_path, err);
    if (st == MC_OK) {
        st = mc_afile_open(&w->idx, idx_path, err);
        if (st != MC_OK) mc_afile_abort(&w->bin);
    }
    free(idx_path);
    if (st != MC_OK) {
        writer_free(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

mc_status mc_idx_writer_add(mc_idx_writer *w, const int32_t *ids, size_t n, mc_error *err)
{
    size_t i, bytes;
    mc_status st;

    /* Check the whole document before writing any of it, so a rejected
     * document leaves the writer as it was and the caller may go on. */
    if (n > (size_t)INT32_MAX)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "%s: document %zu: %zu tokens, more than a sequence length (int32) "
                            "can hold",
                            w->bin_path, w->n, n);
    for (i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] > w->id_max)
            return mc_error_set(err, MC_ERR_LIMIT,
                                "%s: document %zu: token id %" PRId32
                                " at position %zu does not fit %s (0..%" PRId64 ")",
                                w->bin_path, w->n, ids[i], i, mc_dtype_name(w->dtype), w->id_max);
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 1024;
        int32_t *p = realloc(w->lengths, cap * sizeof *p);
        if (!p) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->bin_path);
        w->lengths = p;
        w->cap = cap;
    }
    bytes = n * w->esize;
    if (w->dtype == MC_DTYPE_I32) {
        if (n) {
            st = mc_afile_write(&w->bin, ids, bytes, err);
            if (st != MC_OK) return st;
        }
    } else {
        size_t done = 0;
        if (w->conv_cap < IDX_CHUNK * w->esize) {
            unsigned char *p = realloc(w->conv, IDX_CHUNK * w->esize);
            if (!p) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", w->bin_path);
            w->conv = p;
            w->conv_cap = IDX_CHUNK * w->esize;
        }
        while (done < n) {
            size_t k = n - done < IDX_CHUNK ? n - done : IDX_CHUNK;
            encode_ids(w->dtype, ids + done, k, w->conv);
            st = mc_afile_write(&w->bin, w->conv, k * w->esize, err);
            if (st != MC_OK) return st;
            done += k;
        }
    }
    w->lengths[w->n++] = (int32_t)n;
    w->tokens += n;
    return MC_OK;
}

uint64_t mc_idx_writer_documents(const mc_idx_writer *w) { return w->n; }
uint64_t mc_idx_writer_tokens(const mc_idx_writer *w) { return w->tokens; }

/* lengths, pointers (from the lengths), document indices 0..n. */
static mc_status writer_write_idx(mc_idx_writer *w, mc_error *err)
{
    int64_t chunk[IDX_CHUNK];
    int64_t ptr = 0;
    size_t i, k;
    mc_status st;

    st = write_header(&w->idx, w->dtype, w->n, (uint64_t)w->n + 1, err);
    if (st == MC_OK && w->n) st = mc_afile_write(&w->idx, w->lengths, w->n * 4, err);
    for (i = 0; st == MC_OK && i < w->n; i += k) {
        k = w->n - i < IDX_CHUNK ? w->n - i : IDX_CHUNK;
        for (size_t j = 0; j < k; j++) {
            chunk[j] = ptr;
            ptr += (int64_t)w->lengths[i + j] * (int64_t)w->esize;
        }
        st = mc_afile_write(&w->idx, chunk, k * 8, err);
    }
    for (i = 0; st == MC_OK && i <= w->n; i += k) {
        k = w->n + 1 - i < IDX_CHUNK ? w->n + 1 - i : IDX_CHUNK;
        for (size_t j = 0; j < k; j++) chunk[j] = (int64_t)(i + j);
        st = mc_afile_write(&w->idx, chunk, k * 8, err);
    }
    return st;
}

mc_status mc_idx_writer_commit(mc_idx_writer *w, mc_error *err)
{
    mc_status st = writer_write_idx(w, err);
    if (st == MC_OK) st = commit_pair(&w->bin, &w->idx, w->bin_path, err);
    mc_afile_abort(&w->bin);
    mc_afile_abort(&w->idx);
    writer_free(w);
    return st;
}

void mc_idx_writer_abort(mc_idx_writer *w)
{
    if (!w) return;
    mc_afile_abort(&w->bin);
    mc_afile_abort(&w->idx);
    writer_free(w);
}

/* ------------------------------------------------------------------ reader */

/* Byte offsets of the three arrays inside the .idx: unaligned (34 is not a
 * multiple of 8), hence memcpy in the accessors. */
static size_t off_lengths(const mc_idx *x)
{
    (void)x;
    return IDX_HEADER_LEN;
}
static size_t off_pointers(const mc_idx *x) { return IDX_HEADER_LEN + (size_t)x->n_seq * 4; }
static size_t off_doc_idx(const mc_idx *x) { return IDX_HEADER_LEN + (size_t)x->n_seq * 12; }

int32_t mc_idx_length(const mc_idx *x, uint64_t seq)
{
    int32_t v;
    if (seq >= x->n_seq) return -1;
    memcpy(&v, x->idx.data + off_lengths(x) + (size_t)seq * 4, 4);
    return v;
}

int64_t mc_idx_pointer(const mc_idx *x, uint64_t seq)
{
    int64_t v;
    if (seq >= x->n_seq) return -1;
    memcpy(&v, x->idx.data + off_pointers(x) + (size_t)seq * 8, 8);
    return v;
}

int64_t mc_idx_doc_index(const mc_idx *x, uint64_t i)
{
    int64_t v;
    if (i >= x->n_doc_idx) return -1;
    memcpy(&v, x->idx.data + off_doc_idx(x) + (size_t)i * 8, 8);
    return v;
}

/* Checks everything in the mapped .idx that does not need the .bin; on
 * success *bin_bytes is the size the .bin must have. */
static mc_status validate_idx(mc_idx *x, const char *path, uint64_t *bin_bytes, mc_error *err)
{
    const unsigned char *d = x->idx.data;
    size_t len = x->idx.len;
    uint64_t version, s, dcount, need, end = 0;
    size_t esize;
    int code;

    if (len < IDX_HEADER_LEN)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: file is %zu bytes, shorter than the %d-byte MMIDIDX header", path,
                            len, IDX_HEADER_LEN);
    if (memcmp(d, IDX_MAGIC, IDX_MAGIC_LEN) != 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: bad magic (not a Megatron MMIDIDX index)",
                            path);
    memcpy(&version, d + 9, 8);
    if (version != IDX_VERSION)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: unsupported version %" PRIu64 " (only version 1 is known)", path,
                            version);
    code = d[17];
    esize = mc_dtype_size(code);
    if (esize == 0)
        return mc_error_set(err, MC_ERR_FORMAT, "%s: unknown dtype code %d", path, code);
    memcpy(&s, d + 18, 8);
    memcpy(&dcount, d + 26, 8);

    /* need = 34 + 12*S + 8*D, computed without wrapping. */
    if (s > (UINT64_MAX - IDX_HEADER_LEN) / 12 ||
        dcount > (UINT64_MAX - IDX_HEADER_LEN - 12 * s) / 8)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: file is %zu bytes but header counts need more than 2^64 "
                            "(%" PRIu64 " sequences, %" PRIu64 " document indices)",
                            path, len, s, dcount);
    need = IDX_HEADER_LEN + 12 * s + 8 * dcount;
    if (need != (uint64_t)len)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: file is %zu bytes but header counts need %" PRIu64 " (%" PRIu64
                            " sequences, %" PRIu64 " document indices)",
                            path, len, need, s, dcount);
    if (dcount == 0)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: no document indices (there must be at least one, 0)", path);
    x->dtype = (mc_dtype)code;
    x->n_seq = s;
    x->n_doc_idx = dcount;

    for (uint64_t i = 0; i < s; i++) {
        int32_t l = mc_idx_length(x, i);
        int64_t p = mc_idx_pointer(x, i);
        if (l < 0)
            return mc_error_set(err, MC_ERR_FORMAT, "%s: sequence %" PRIu64 ": negative length %d",
                                path, i, (int)l);
        if (p < 0 || (uint64_t)p != end) {
            if (i == 0)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s: sequence 0: pointer %" PRId64 " is not 0", path, p);
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: sequence %" PRIu64 ": pointer %" PRId64
                                " does not follow the previous sequence (expected %" PRIu64 ")",
                                path, i, p, end);
        }
        /* l*esize <= 2^31*8, so only the running sum can overflow. */
        if ((uint64_t)l * esize > (uint64_t)INT64_MAX - end)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: sequence %" PRIu64 ": byte offsets overflow int64", path, i);
        end += (uint64_t)l * esize;
    }

    for (uint64_t i = 0; i < dcount; i++) {
        int64_t v = mc_idx_doc_index(x, i);
        if (i == 0 && v != 0)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: document index 0 is %" PRId64 ", expected 0", path, v);
        if (i > 0 && v < mc_idx_doc_index(x, i - 1))
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: document index %" PRIu64 ": %" PRId64
                                " is less than the previous %" PRId64 " (must not decrease)",
                                path, i, v, mc_idx_doc_index(x, i - 1));
        if (v < 0 || (uint64_t)v > s)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: document index %" PRIu64 ": %" PRId64 " is past the %" PRIu64
                                " sequences",
                                path, i, v, s);
    }
    if ((uint64_t)mc_idx_doc_index(x, dcount - 1) != s)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: last document index is %" PRId64 " but there are %" PRIu64
                            " sequences",
                            path, mc_idx_doc_index(x, dcount - 1), s);
    *bin_bytes = end;
    return MC_OK;
}

mc_status mc_idx_open(const char *prefix, mc_idx *out, mc_error *err)
{
    char *idx_path = path_with_suffix(prefix, ".idx");
    char *bin_path = path_with_suffix(prefix, ".bin");
    uint64_t bin_bytes = 0;
    mc_status st;

    memset(out, 0, sizeof *out);
    out->prefix = strdup(prefix);
    if (!idx_path || !bin_path || !out->prefix) {
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", prefix);
        goto done;
    }
    st = mc_map_file(idx_path, &out->idx, err);
    if (st != MC_OK) goto done;
    st = mc_map_file(bin_path, &out->bin, err);
    if (st != MC_OK) goto done;
    st = validate_idx(out, idx_path, &bin_bytes, err);
    if (st != MC_OK) goto done;
    if (bin_bytes != (uint64_t)out->bin.len)
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %zu bytes but the index describes %" PRIu64,
                          bin_path, out->bin.len, bin_bytes);
done:
    if (st != MC_OK) mc_idx_close(out);
    free(idx_path);
    free(bin_path);
    return st;
}

void mc_idx_close(mc_idx *x)
{
    if (!x) return;
    mc_unmap(&x->idx);
    mc_unmap(&x->bin);
    free(x->prefix);
    memset(x, 0, sizeof *x);
}

mc_status mc_idx_read(const mc_idx *x, uint64_t seq, mc_ids *out, mc_error *err)
{
    size_t n;
    const unsigned char *p;
    mc_status st;

    if (seq >= x->n_seq)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s.bin: sequence %" PRIu64 " asked for, the dataset has %" PRIu64,
                            x->prefix, seq, x->n_seq);
    n = (size_t)mc_idx_length(x, seq);
    if (n == 0) return MC_OK;
    p = x->bin.data + mc_idx_pointer(x, seq);
    st = mc_ids_reserve(out, n, err);
    if (st != MC_OK) return st;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        switch (x->dtype) {
        case MC_DTYPE_U8: v = p[i]; break;
        case MC_DTYPE_I8: v = (int8_t)p[i]; break;
        case MC_DTYPE_I16: {
            int16_t t;
            memcpy(&t, p + 2 * i, 2);
            v = t;
            break;
        }
        case MC_DTYPE_U16: {
            uint16_t t;
            memcpy(&t, p + 2 * i, 2);
            v = t;
            break;
        }
        case MC_DTYPE_I32: {
            int32_t t;
            memcpy(&t, p + 4 * i, 4);
            v = t;
            break;
        }
        case MC_DTYPE_I64: memcpy(&v, p + 8 * i, 8); break;
        default:
            return mc_error_set(err, MC_ERR_FORMAT, "%s.bin: dtype %s holds no token ids",
                                x->prefix, mc_dtype_name(x->dtype));
        }
        if (v < INT32_MIN || v > INT32_MAX)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s.bin: sequence %" PRIu64 ": element %zu (%" PRId64
                                ") does not fit a token id (int32)",
                                x->prefix, seq, i, v);
        out->v[out->n++] = (int32_t)v;
    }
    return MC_OK;
}

/* ------------------------------------------------------------------- merge */

static mc_status merge_write_idx(const mc_idx *in, size_t n, mc_afile *f, uint64_t n_seq,
                                 uint64_t n_doc, mc_error *err)
{
    int64_t chunk[IDX_CHUNK];
    mc_status st = write_header(f, in[0].dtype, n_seq, n_doc, err);
    int64_t base;
    uint64_t seq_base;

    /* lengths: copied verbatim */
    for (size_t j = 0; st == MC_OK && j < n; j++)
        if (in[j].n_seq)
            st = mc_afile_write(f, in[j].idx.data + off_lengths(&in[j]), in[j].n_seq * 4, err);
    /* pointers: shifted by the bytes of the .bin files before */
    base = 0;
    for (size_t j = 0; st == MC_OK && j < n; j++) {
        for (uint64_t i = 0, k; st == MC_OK && i < in[j].n_seq; i += k) {
            k = in[j].n_seq - i < IDX_CHUNK ? in[j].n_seq - i : IDX_CHUNK;
            for (uint64_t q = 0; q < k; q++) chunk[q] = base + mc_idx_pointer(&in[j], i + q);
            st = mc_afile_write(f, chunk, k * 8, err);
        }
        base += (int64_t)in[j].bin.len;
    }
    /* document indices: 0, then each input's past its leading 0, shifted by
     * the sequences before (merge_datasets.py / IndexedDatasetBuilder.add_index) */
    chunk[0] = 0;
    if (st == MC_OK) st = mc_afile_write(f, chunk, 8, err);
    seq_base = 0;
    for (size_t j = 0; st == MC_OK && j < n; j++) {
        for (uint64_t i = 1, k; st == MC_OK && i < in[j].n_doc_idx; i += k) {
            k = in[j].n_doc_idx - i < IDX_CHUNK ? in[j].n_doc_idx - i : IDX_CHUNK;
            for (uint64_t q = 0; q < k; q++)
                chunk[q] = (int64_t)seq_base + mc_idx_doc_index(&in[j], i + q);
            st = mc_afile_write(f, chunk, k * 8, err);
        }
        seq_base += in[j].n_seq;
    }
    return st;
}

mc_status mc_idx_merge(const char *const *prefixes, size_t n, const char *out_prefix, mc_error *err)
{
    mc_idx *in;
    mc_afile bin = {0}, idx = {0};
    char *bin_path = NULL, *idx_path = NULL;
    uint64_t n_seq = 0, n_doc = 1, bytes = 0;
    size_t opened = 0;
    bool bin_open = false, idx_open = false;
    mc_status st = MC_OK;

    if (n == 0)
        return mc_error_set(err, MC_ERR_USAGE, "%s: nothing to merge (no input datasets)",
                            out_prefix);
    in = calloc(n, sizeof *in);
    bin_path = path_with_suffix(out_prefix, ".bin");
    idx_path = path_with_suffix(out_prefix, ".idx");
    if (!in || !bin_path || !idx_path) {
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", out_prefix);
        goto done;
    }
    for (; opened < n; opened++) {
        const mc_idx *x = &in[opened];
        st = mc_idx_open(prefixes[opened], &in[opened], err);
        if (st != MC_OK) goto done;
        if (x->dtype != in[0].dtype) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: dtype %s differs from %s in %s (merged datasets must share "
                              "one dtype)",
                              prefixes[opened], mc_dtype_name(x->dtype), mc_dtype_name(in[0].dtype),
                              prefixes[0]);
            opened++;
            goto done;
        }
        if (x->n_seq > (uint64_t)INT64_MAX - n_seq ||
            x->n_doc_idx - 1 > (uint64_t)INT64_MAX - n_doc ||
            (uint64_t)x->bin.len > (uint64_t)INT64_MAX - bytes) {
            st = mc_error_set(err, MC_ERR_LIMIT, "%s: merged dataset would be too large",
                              prefixes[opened]);
            opened++;
            goto done;
        }
        n_seq += x->n_seq;
        n_doc += x->n_doc_idx - 1;
        bytes += x->bin.len;
    }

    st = mc_afile_open(&bin, bin_path, err);
    if (st != MC_OK) goto done;
    bin_open = true;
    st = mc_afile_open(&idx, idx_path, err);
    if (st != MC_OK) goto done;
    idx_open = true;
    for (size_t j = 0; st == MC_OK && j < n; j++) {
        for (size_t off = 0; st == MC_OK && off < in[j].bin.len; off += MERGE_COPY_CHUNK) {
            size_t k = in[j].bin.len - off;
            if (k > MERGE_COPY_CHUNK) k = MERGE_COPY_CHUNK;
            st = mc_afile_write(&bin, in[j].bin.data + off, k, err);
        }
    }
    if (st == MC_OK) st = merge_write_idx(in, n, &idx, n_seq, n_doc, err);
    if (st == MC_OK) st = commit_pair(&bin, &idx, bin_path, err);
done:
    if (bin_open) mc_afile_abort(&bin);
    if (idx_open) mc_afile_abort(&idx);
    for (size_t j = 0; j < opened && in; j++) mc_idx_close(&in[j]);
    free(in);
    free(bin_path);
    free(idx_path);
    return st;
}
