/*
 * gpt_dataset.c - one split of one dataset, as megatron-core's GPTDataset
 * builds it: the document, sample and shuffle indices, drawn from one numpy
 * RandomState(seed) in Megatron's order, cached as .npy under Megatron's
 * names and read back through file maps (doc/ARCHITECTURE.md, "Data"). Also
 * a dataset's documents (mc_gpt_docs, Megatron's low-level dataset: an mc_idx
 * or mc's mock documents) and the splits' names (mc_split_name, blend.c's too).
 */
#include "gpt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ documents */

mc_status mc_gpt_docs_open(mc_gpt_docs *docs, const char *prefix, mc_error *err)
{
    memset(docs, 0, sizeof *docs);
    mc_status st = mc_idx_open(prefix, &docs->idx, err);
    if (st != MC_OK) return st;
    docs->n_docs = (int64_t)docs->idx.n_seq;
    docs->path = strdup(prefix);
    if (!docs->path) {
        mc_idx_close(&docs->idx);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", prefix);
    }
    return MC_OK;
}

/* Megatron Core's MockGPTLowLevelDataset: MC_GPTDATA_MOCK_DOCS documents
 * whose lengths are numpy.random.default_rng(0).integers(1, 4096) (seed 0
 * whatever the run's: the run's seed shuffles them, as for real data). */
mc_status mc_gpt_docs_mock(mc_gpt_docs *docs, int64_t vocab_size, int32_t eod, mc_error *err)
{
    memset(docs, 0, sizeof *docs);
    docs->mock = 1;
    docs->vocab_size = vocab_size;
    docs->eod = eod;
    docs->n_docs = MC_GPTDATA_MOCK_DOCS;
    docs->mock_len = malloc(MC_GPTDATA_MOCK_DOCS * sizeof *docs->mock_len);
    if (!docs->mock_len) return mc_error_set(err, MC_ERR_NOMEM, "mock data: out of memory");
    mc_pcg64 g;
    mc_pcg64_seed(&g, 0);
    mc_pcg64_integers32(&g, 1, MC_GPTDATA_MOCK_MAXLEN, docs->mock_len, MC_GPTDATA_MOCK_DOCS);
    return MC_OK;
}

void mc_gpt_docs_close(mc_gpt_docs *docs)
{
    if (!docs) return;
    if (!docs->mock) mc_idx_close(&docs->idx);
    free(docs->path);
    free(docs->mock_len);
    memset(docs, 0, sizeof *docs);
}

int64_t mc_gpt_docs_length(const mc_gpt_docs *docs, int64_t doc)
{
    if (docs->mock) return docs->mock_len[doc];
    return mc_idx_length(&docs->idx, (uint64_t)doc);
}

/* Tokens [off, off+n) of document doc; the caller checked the range. */
static void doc_tokens(const mc_gpt_docs *docs, int64_t doc, int64_t off, int64_t n, int32_t *out)
{
    if (docs->mock) {
        /* Megatron's: (arange(length - 1) + 1) % vocab_size, then the eod */
        int64_t len = mc_gpt_docs_length(docs, doc);
        for (int64_t i = 0; i < n; i++) {
            int64_t pos = off + i;
            out[i] = pos == len - 1 ? docs->eod : (int32_t)((pos + 1) % docs->vocab_size);
        }
        return;
    }
    size_t es = mc_dtype_size(docs->idx.dtype);
    const unsigned char *p = docs->idx.bin.data + mc_idx_pointer(&docs->idx, (uint64_t)doc) +
                             off * es;
    for (int64_t i = 0; i < n; i++, p += es) {
        switch (docs->idx.dtype) {
        case MC_DTYPE_U8: out[i] = p[0]; break;
        case MC_DTYPE_I8: out[i] = (int8_t)p[0]; break;
        case MC_DTYPE_U16: {
            uint16_t v;
            memcpy(&v, p, 2);
            out[i] = v;
            break;
        }
        case MC_DTYPE_I16: {
            int16_t v;
            memcpy(&v, p, 2);
            out[i] = v;
            break;
        }
        case MC_DTYPE_I32: {
            int32_t v;
            memcpy(&v, p, 4);
            out[i] = v;
            break;
        }
        case MC_DTYPE_I64: {
            int64_t v;
            memcpy(&v, p, 8);
            out[i] = (int32_t)v;
            break;
        }
        default: out[i] = 0; break; /* float datasets hold no token ids */
        }
    }
}

/* ------------------------------------------------------------ helpers */

const char *mc_split_name(mc_split s)
{
    static const char *names[] = {"train", "valid", "test"};
    return (unsigned)s < MC_SPLIT_COUNT ? names[s] : "?";
}

char *mc_gpt_path(const char *base, const char *affix)
{
    size_t a = strlen(base), b = strlen(affix);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, base, a);
    p[a] = '-';
    memcpy(p + a + 1, affix, b + 1);
    return p;
}

int mc_gpt_files_exist(const char *const *paths, size_t n)
{
    struct stat sb;
    for (size_t i = 0; i < n; i++)
        if (stat(paths[i], &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    return 1;
}

mc_status mc_gpt_mkdirs(const char *dir, mc_error *err)
{
    char *p = strdup(dir);
    if (!p) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            mc_status st = mc_error_errno(err, MC_ERR_IO, errno,
                                          "data cache directory %s: cannot create %s", dir, p);
            free(p);
            return st;
        }
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            mc_status st = mc_error_set(err, MC_ERR_IO,
                                        "data cache directory %s: %s is not a directory", dir, p);
            free(p);
            return st;
        }
        p[i] = c;
    }
    free(p);
    return MC_OK;
}

mc_status mc_gpt_write_text(const char *path, const char *text, size_t n, mc_error *err)
{
    mc_afile f;
    mc_status st = mc_afile_open(&f, path, err);
    if (st != MC_OK) return st;
    st = mc_afile_write(&f, text, n, err);
    if (st == MC_OK) st = mc_afile_commit(&f, err);
    mc_afile_abort(&f);
    return st;
}

/* ------------------------------------------------------------ building */

/* _get_num_epochs: epochs until the tokens cover num_samples*T + extra. */
static int64_t num_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t T, int64_t extra)
{
    int64_t epochs = 1, tokens = tokens_per_epoch;
    if (num_samples < 0) return 1;
    int64_t wanted = num_samples * T + extra;
    while (tokens < wanted) {
        epochs++;
        tokens += tokens_per_epoch;
    }
    return epochs;
}

/* helpers.cpp build_sample_idx, into int64 pairs (doc index position,
 * offset); n_samples+1 rows. */
static mc_status build_sample_idx(const mc_gpt_docs *docs, const int32_t *doc_index, int64_t n_doc,
                                  int64_t T, int64_t epochs, int64_t tokens_per_epoch,
                                  int drop_last, int64_t extra, int64_t **out, int64_t *n_out,
                                  mc_error *err)
{
    int64_t n;
    if (drop_last)
        n = (epochs * tokens_per_epoch - extra) / T;
    else /* helpers.cpp rounds through a C float here */
        n = (int64_t)ceilf((float)(epochs * tokens_per_epoch - extra) / (float)T);
    int64_t *s = malloc(sizeof(int64_t) * 2 * (size_t)(n + 1));
    if (!s)
        return mc_error_set(err, MC_ERR_NOMEM, "sample index of %" PRId64 " samples: out of memory",
                            n);
    int64_t row = 0, d = 0, off = 0;
    s[0] = 0;
    s[1] = 0;
    row = 1;
    while (row <= n) {
        /* walk documents until seq_length+extra tokens are covered; the next
         * sample starts `extra` tokens before this one ends */
        int64_t remaining = T + extra;
        while (remaining != 0) {
            int64_t doc_len = mc_gpt_docs_length(docs, doc_index[d]) - off;
            remaining -= doc_len;
            if (remaining <= 0) {
                off += remaining + doc_len - extra;
                remaining = 0;
            } else {
                if (d == n_doc - 1) { /* the last, partial sample */
                    off = mc_gpt_docs_length(docs, doc_index[d]) - extra;
                    break;
                }
                d++;
                off = 0;
            }
        }
        s[2 * row] = d;
        s[2 * row + 1] = off;
        row++;
    }
    *out = s;
    *n_out = n;
    return MC_OK;
}

static mc_status npy_adopt(mc_npy *a, mc_npy_type t, int ndim, int64_t d0, int64_t d1, void *data)
{
    memset(a, 0, sizeof *a);
    a->owned = data;
    a->data = data;
    a->type = t;
    a->ndim = ndim;
    a->shape[0] = d0;
    a->shape[1] = d1;
    return MC_OK;
}

static mc_status build_indices(mc_gpt_samples *m, const mc_gpt_params *p, int64_t beg, int64_t end,
                               mc_error *err)
{
    const mc_gpt_docs *docs = m->docs;
    const int64_t T = p->seq_length, extra = p->add_extra_token ? 1 : 0, ndoc = end - beg;
    const char *name = docs->path ? docs->path : "mock data";
    int64_t tokens = 0, max_len = 0;
    for (int64_t i = beg; i < end; i++) tokens += mc_gpt_docs_length(docs, i);
    for (int64_t i = 0; i < docs->n_docs; i++) {
        int64_t l = mc_gpt_docs_length(docs, i);
        if (l > max_len) max_len = l;
    }
    if (tokens <= 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: the %s split (documents %" PRId64 " to %" PRId64 ") has %" PRId64
                            " tokens; it needs at least %" PRId64 " for one sample",
                            name, mc_split_name(m->split), beg, end, tokens, T + extra);
    int64_t epochs = num_epochs(tokens, m->num_samples, T, extra);
    int separate = 0;
    int64_t sans_final = 0;
    if (epochs > 1) {
        sans_final = ((epochs - 1) * tokens - extra) / T;
        int64_t from_final = m->num_samples - sans_final;
        int64_t per_epoch = (tokens - extra) / T;
        /* separate the final epoch if it falls below 80% of one; int() of
         * the product in double, as Python computes it */
        separate = from_final < (int64_t)(0.80 * (double)per_epoch);
    }

    mc_mt19937 rs;
    mc_mt_seed(&rs, p->seed);

    /* document index: the split's documents per epoch, shuffled */
    int64_t n_doc_index = epochs * ndoc;
    if (n_doc_index > INT32_MAX)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "%s: %" PRId64 " epochs of %" PRId64
                            " documents overflow Megatron's int32 document index",
                            name, epochs, ndoc);
    int32_t *di = malloc(sizeof(int32_t) * (size_t)n_doc_index);
    if (!di) return mc_error_set(err, MC_ERR_NOMEM, "%s: document index: out of memory", name);
    for (int64_t e = 0; e < epochs; e++)
        for (int64_t i = 0; i < ndoc; i++) di[e * ndoc + i] = (int32_t)(beg + i);
    if (!separate) {
        mc_mt_shuffle(&rs, di, n_doc_index, 4);
    } else {
        mc_mt_shuffle(&rs, di, (epochs - 1) * ndoc, 4);
        mc_mt_shuffle(&rs, di + (epochs - 1) * ndoc, ndoc, 4);
    }

    int drop = m->split == MC_SPLIT_VALID ? p->drop_last_partial_validation : 1;
    int64_t *si = NULL, n = 0;
    mc_status st = build_sample_idx(docs, di, n_doc_index, T, epochs, tokens, drop, extra, &si, &n,
                                    err);
    if (st != MC_OK) {
        free(di);
        return st;
    }
    if (n <= 0 && m->num_samples != 0) {
        free(di);
        free(si);
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: the %s split (documents %" PRId64 " to %" PRId64 ") has %" PRId64
                            " tokens, too few for one sample of %" PRId64,
                            name, mc_split_name(m->split), beg, end, tokens, T + extra);
    }
    /* the sample index narrows to int32 as megatron's helpers.py does */
    mc_npy_type st_type = MC_NPY_I64;
    if ((n_doc_index > max_len ? n_doc_index : max_len) <= INT32_MAX) {
        /* in place: element k is read before its bytes are overwritten */
        unsigned char *bytes = (unsigned char *)si;
        for (int64_t k = 0; k < 2 * (n + 1); k++) {
            int64_t v;
            memcpy(&v, bytes + 8 * k, 8);
            int32_t w = (int32_t)v;
            memcpy(bytes + 4 * k, &w, 4);
        }
        st_type = MC_NPY_I32;
    }

    /* shuffle index: uint32 unless the count needs int64 */
    void *sh;
    mc_npy_type sh_type = n >= (int64_t)UINT32_MAX - 1 ? MC_NPY_I64 : MC_NPY_U32;
    sh = malloc(mc_npy_type_size(sh_type) * (size_t)(n > 0 ? n : 1));
    if (!sh) {
        free(di);
        free(si);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: shuffle index: out of memory", name);
    }
    for (int64_t k = 0; k < n; k++) {
        if (sh_type == MC_NPY_U32)
            ((uint32_t *)sh)[k] = (uint32_t)k;
        else
            ((int64_t *)sh)[k] = k;
    }
    int64_t first = separate ? sans_final : n;
    mc_mt_shuffle(&rs, sh, first, mc_npy_type_size(sh_type));
    if (first < n)
        mc_mt_shuffle(&rs, (char *)sh + (size_t)first * mc_npy_type_size(sh_type), n - first,
                      mc_npy_type_size(sh_type));

    npy_adopt(&m->doc_index, MC_NPY_I32, 1, n_doc_index, 0, di);
    npy_adopt(&m->sample_index, st_type, 2, n + 1, 2, si);
    npy_adopt(&m->shuffle_index, sh_type, 1, n, 0, sh);
    m->n_samples = n;
    m->built = 1;
    return MC_OK;
}

/* ------------------------------------------------------------ the split */

static const char *AFFIX[4] = {"description.txt", "document_index.npy", "sample_index.npy",
                               "shuffle_index.npy"};

static mc_status describe(mc_gpt_samples *m, const mc_gpt_params *p, mc_buf *desc, mc_error *err)
{
    json_t *o = json_object();
    if (!o) return mc_error_set(err, MC_ERR_NOMEM, "dataset description: out of memory");
    json_object_set_new(o, "class", json_string("GPTDataset"));
    json_object_set_new(o, "dataset_path",
                        m->docs->path ? json_string(m->docs->path) : json_null());
    json_object_set_new(o, "num_samples",
                        m->num_samples < 0 ? json_null() : json_integer(m->num_samples));
    json_object_set_new(o, "index_split", json_string(mc_split_name(m->split)));
    json_object_set_new(o, "random_seed", json_integer(p->seed));
    json_object_set_new(o, "sequence_length", json_integer(p->seq_length));
    json_object_set_new(o, "split", json_string(p->split_string));
    json_object_set(o, "split_matrix", p->split_matrix);
    json_object_set(o, "tokenizer", p->tokenizer);
    m->ids = o;
    return mc_pyjson_dump(desc, o, 0, err);
}

static mc_status check_loaded(const mc_gpt_samples *m, const char *base, mc_error *err)
{
    if (m->doc_index.ndim != 1 || m->doc_index.type != MC_NPY_I32 || m->sample_index.ndim != 2 ||
        m->sample_index.shape[1] != 2 || m->sample_index.shape[0] < 1 ||
        m->shuffle_index.ndim != 1 || m->shuffle_index.shape[0] != m->sample_index.shape[0] - 1)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s-*.npy: cached indices have inconsistent shapes or types; "
                            "delete them to rebuild",
                            base);
    return MC_OK;
}

mc_status mc_gpt_samples_open(mc_gpt_samples *m, const mc_gpt_docs *docs, const mc_gpt_params *p,
                              mc_split split, int64_t doc_beg, int64_t doc_end, int64_t num_samples,
                              mc_error *err)
{
    memset(m, 0, sizeof *m);
    m->docs = docs;
    m->split = split;
    m->num_samples = num_samples;
    m->seq_length = p->seq_length;
    m->add_extra = p->add_extra_token ? 1 : 0;
    mc_buf desc = MC_BUF_INIT;
    char *paths[4] = {0}, *dir = NULL;
    mc_status st = describe(m, p, &desc, err);
    if (st != MC_OK) goto done;

    if (p->cache_dir) {
        dir = strdup(p->cache_dir);
    } else if (!docs->mock) {
        /* Megatron: os.path.join(path_prefix, "cache", "GPTDataset_indices") */
        size_t n = strlen(docs->path) + 32;
        dir = malloc(n);
        if (dir) snprintf(dir, n, "%s/cache/GPTDataset_indices", docs->path);
    }
    if (!docs->mock && !dir) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (dir && !docs->mock) {
        char hash[33];
        mc_md5_hex(desc.data, desc.len, hash);
        size_t n = strlen(dir) + 80;
        m->cache_base = malloc(n);
        if (!m->cache_base) {
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            goto done;
        }
        snprintf(m->cache_base, n, "%s/%s-GPTDataset-%s", dir, hash, mc_split_name(split));
        for (int i = 0; i < 4; i++)
            if (!(paths[i] = mc_gpt_path(m->cache_base, AFFIX[i]))) {
                st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                goto done;
            }
        if (mc_gpt_files_exist((const char *const *)paths, 4)) {
            if ((st = mc_npy_load(paths[1], &m->doc_index, err)) != MC_OK ||
                (st = mc_npy_load(paths[2], &m->sample_index, err)) != MC_OK ||
                (st = mc_npy_load(paths[3], &m->shuffle_index, err)) != MC_OK ||
                (st = check_loaded(m, m->cache_base, err)) != MC_OK)
                goto done;
            m->n_samples = m->sample_index.shape[0] - 1;
            goto done;
        }
    }

    if ((st = build_indices(m, p, doc_beg, doc_end, err)) != MC_OK) goto done;
    if (m->cache_base) {
        /* write, then drop the heap copies and map the files: one copy only */
        int64_t s2[2] = {m->sample_index.shape[0], 2};
        if ((st = mc_gpt_mkdirs(dir, err)) != MC_OK ||
            (st = mc_npy_save(paths[1], MC_NPY_I32, 1, m->doc_index.shape, m->doc_index.data,
                              err)) != MC_OK ||
            (st = mc_npy_save(paths[2], m->sample_index.type, 2, s2, m->sample_index.data, err)) !=
                MC_OK ||
            (st = mc_npy_save(paths[3], m->shuffle_index.type, 1, m->shuffle_index.shape,
                              m->shuffle_index.data, err)) != MC_OK ||
            (st = mc_gpt_write_text(paths[0], desc.data, desc.len, err)) != MC_OK)
            goto done;
        mc_npy_free(&m->doc_index);
        mc_npy_free(&m->sample_index);
        mc_npy_free(&m->shuffle_index);
        if ((st = mc_npy_load(paths[1], &m->doc_index, err)) != MC_OK ||
            (st = mc_npy_load(paths[2], &m->sample_index, err)) != MC_OK ||
            (st = mc_npy_load(paths[3], &m->shuffle_index, err)) != MC_OK)
            goto done;
    }
done:
    for (int i = 0; i < 4; i++) free(paths[i]);
    free(dir);
    mc_buf_free(&desc);
    if (st != MC_OK) mc_gpt_samples_free(m);
    return st;
}

mc_status mc_gpt_samples_get(const mc_gpt_samples *m, int64_t index, int32_t *tokens, mc_error *err)
{
    const int64_t want = m->seq_length + m->add_extra;
    const char *name = m->docs->path ? m->docs->path : "mock data";
    if (index < 0 || index >= m->n_samples)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s: %s sample %" PRId64 " out of range [0, %" PRId64 ")", name,
                            mc_split_name(m->split), index, m->n_samples);
    int64_t s = mc_npy_get(&m->shuffle_index, index);
    int64_t nd = m->doc_index.shape[0];
    if (s < 0 || s >= m->n_samples) goto corrupt;
    int64_t b = mc_npy_get(&m->sample_index, 2 * s), bo = mc_npy_get(&m->sample_index, 2 * s + 1);
    int64_t e = mc_npy_get(&m->sample_index, 2 * s + 2),
            eo = mc_npy_get(&m->sample_index, 2 * s + 3);
    if (b < 0 || e < b || e >= nd || bo < 0 || eo < 0) goto corrupt;
    int64_t got = 0;
    for (int64_t i = b; i <= e; i++) {
        int64_t doc = mc_npy_get(&m->doc_index, i);
        if (doc < 0 || doc >= m->docs->n_docs) goto corrupt;
        int64_t len = mc_gpt_docs_length(m->docs, doc);
        int64_t off = i == b ? bo : 0;
        int64_t stop = i == e ? eo + m->add_extra : len;
        if (stop > len) stop = len;
        if (off > stop || got + (stop - off) > want) goto corrupt;
        doc_tokens(m->docs, doc, off, stop - off, tokens + got);
        got += stop - off;
    }
    for (; got < want; got++) tokens[got] = -1; /* Megatron's pad id for a partial sample */
    return MC_OK;
corrupt:
    return mc_error_set(err, MC_ERR_FORMAT,
                        "%s-*.npy: %s sample %" PRId64
                        " points outside the dataset; the cached indices do not belong to %s",
                        m->cache_base ? m->cache_base : name, mc_split_name(m->split), index, name);
}

void mc_gpt_samples_free(mc_gpt_samples *m)
{
    if (!m) return;
    mc_npy_free(&m->doc_index);
    mc_npy_free(&m->sample_index);
    mc_npy_free(&m->shuffle_index);
    json_decref(m->ids);
    free(m->cache_base);
    memset(m, 0, sizeof *m);
}
