/*
 * blend.c - the top of the GPT data pipeline, as megatron-core's
 * BlendedMegatronDatasetBuilder and BlendedDataset do it: parse --data-path
 * and --split, open the indexed datasets, cut each into train/valid/test
 * document ranges, build one GPTDataset per (dataset, split) with the sample
 * counts Megatron asks of it, and, for blends, the blending indices
 * (helpers.cpp build_blending_indices: each sample goes to the dataset whose
 * share lags its weight the most). Owns mc_gpt_dataset, the public handle.
 */
#include "gpt_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct blend_split {
    int exists;
    int64_t size;
    mc_npy dataset_index;        /* int16 */
    mc_npy dataset_sample_index; /* int64 */
    char *cache_base;
} blend_split;

struct mc_gpt_dataset {
    mc_gpt_params p;
    char *split_string;
    size_t n;
    mc_gpt_docs *docs;
    mc_gpt_samples (*samples)[MC_SPLIT_COUNT];
    int *exists; /* n * 3 */
    int blended;
    blend_split blend[MC_SPLIT_COUNT];
    int built;
};

void mc_gptdata_config_init(mc_gptdata_config *c)
{
    memset(c, 0, sizeof *c);
    c->split = "969,30,1";
    c->seed = 1234;
    for (int i = 0; i < MC_SPLIT_COUNT; i++) c->num_samples[i] = -1;
    c->add_extra_token = 1;
    c->drop_last_partial_validation = 1;
    c->mid_level_surplus = 0.005;
}

void mc_gptdata_num_samples(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                            int64_t global_batch, int64_t out[MC_SPLIT_COUNT])
{
    out[0] = train_iters * global_batch;
    out[1] = (eval_interval > 0 ? train_iters / eval_interval + 1 : 1) * eval_iters * global_batch;
    out[2] = eval_iters * global_batch;
}

/* ------------------------------------------------------------ parsing */

/* Python's float() on a whole word: strtod must consume it all. */
static int parse_number(const char *s, double *out)
{
    char *end;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return 0;
    *out = strtod(s, &end);
    while (isspace((unsigned char)*end)) end++;
    return *end == 0;
}

static char *strip_dup(const char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

void mc_gptdata_blend_free(mc_gptdata_blend *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->n; i++) free(b->prefixes[i]);
    free(b->prefixes);
    free(b->weights);
    memset(b, 0, sizeof *b);
}

mc_status mc_gptdata_parse_data_path(const char *const *args, size_t n, mc_gptdata_blend *out,
                                     mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (n == 0) return mc_error_set(err, MC_ERR_USAGE, "--data-path: no dataset prefix given");
    /* get_blend_from_list: an even count whose weights all parse is a
     * weighted blend; otherwise every word is a prefix */
    size_t parsed = 0;
    double w;
    if (n % 2 == 0)
        for (size_t i = 0; i < n; i += 2) parsed += parse_number(args[i], &w);
    int weighted = n % 2 == 0 && parsed == n / 2;
    if (n % 2 == 0 && parsed > 0 && !weighted) {
        for (size_t i = 0; i < n; i += 2)
            if (!parse_number(args[i], &w))
                return mc_error_set(err, MC_ERR_USAGE,
                                    "--data-path: weight '%s' (word %zu) is not a number", args[i],
                                    i + 1);
    }
    size_t m = weighted ? n / 2 : n;
    out->prefixes = calloc(m, sizeof(char *));
    if (weighted) out->weights = calloc(m, sizeof(double));
    if (!out->prefixes || (weighted && !out->weights)) goto nomem;
    out->n = m;
    for (size_t i = 0; i < m; i++) {
        if (weighted) {
            parse_number(args[2 * i], &out->weights[i]);
            if (!isfinite(out->weights[i]) || out->weights[i] <= 0) {
                mc_status st = mc_error_set(
                    err, MC_ERR_USAGE, "--data-path: weight '%s' of %s must be a positive number",
                    args[2 * i], args[2 * i + 1]);
                mc_gptdata_blend_free(out);
                return st;
            }
        }
        if (!(out->prefixes[i] = strip_dup(args[weighted ? 2 * i + 1 : i]))) goto nomem;
        if (!out->prefixes[i][0]) {
            mc_gptdata_blend_free(out);
            return mc_error_set(err, MC_ERR_USAGE, "--data-path: empty dataset prefix");
        }
    }
    return MC_OK;
nomem:
    mc_gptdata_blend_free(out);
    return mc_error_set(err, MC_ERR_NOMEM, "--data-path: out of memory");
}

mc_status mc_gptdata_parse_split(const char *split, double out[MC_SPLIT_COUNT], mc_error *err)
{
    /* parse_and_normalize_split: the numbers are the runs of [.0-9]; mc
     * accepts only blanks, commas, slashes and colons between them (Megatron
     * would read "-1" as 1) */
    double v[MC_SPLIT_COUNT] = {0, 0, 0};
    int k = 0;
    const char *p = split;
    if (!split) return mc_error_set(err, MC_ERR_USAGE, "--split: missing");
    while (*p) {
        if (isdigit((unsigned char)*p) || *p == '.') {
            size_t len = strspn(p, "0123456789.");
            char word[64];
            char *end;
            if (k == MC_SPLIT_COUNT || len >= sizeof word)
                return mc_error_set(err, MC_ERR_USAGE,
                                    "--split '%s': expected at most 3 weights (train,valid,test)",
                                    split);
            memcpy(word, p, len);
            word[len] = 0;
            v[k] = strtod(word, &end);
            if (*end || end == word)
                return mc_error_set(err, MC_ERR_USAGE, "--split '%s': '%s' is not a number", split,
                                    word);
            k++;
            p += len;
        } else if (*p == ',' || *p == '/' || *p == ':' || isspace((unsigned char)*p)) {
            p++;
        } else {
            return mc_error_set(err, MC_ERR_USAGE,
                                "--split '%s': unexpected '%c'; expected weights like 969,30,1",
                                split, *p);
        }
    }
    if (k == 0)
        return mc_error_set(err, MC_ERR_USAGE, "--split '%s': no weights; expected e.g. 969,30,1",
                            split);
    double sum = mc_np_sum(v, MC_SPLIT_COUNT);
    if (!(sum > 0) || !isfinite(sum))
        return mc_error_set(err, MC_ERR_USAGE, "--split '%s': the weights must not all be zero",
                            split);
    for (int i = 0; i < MC_SPLIT_COUNT; i++) out[i] = v[i] / sum;
    return MC_OK;
}

/* convert_split_vector_to_split_matrix: bookends [(0, a), (a, a+b), ...];
 * a bookend of zero width is None. bounds[i][0..1], exists[i]. */
static json_t *split_matrix(const double v[MC_SPLIT_COUNT], double bounds[][2], int exists[])
{
    double e[MC_SPLIT_COUNT + 1];
    e[0] = 0;
    for (int i = 0; i < MC_SPLIT_COUNT; i++) e[i + 1] = e[i] + v[i];
    json_t *m = json_array();
    for (int i = 0; i < MC_SPLIT_COUNT; i++) {
        exists[i] = e[i + 1] > e[i];
        bounds[i][0] = e[i];
        bounds[i][1] = e[i + 1];
        if (!exists[i]) {
            json_array_append_new(m, json_null());
            continue;
        }
        json_t *pair = json_array();
        /* Python's running sum starts from the integer 0 */
        json_array_append_new(pair, i == 0 ? json_integer(0) : json_real(e[i]));
        json_array_append_new(pair, json_real(e[i + 1]));
        json_array_append_new(m, pair);
    }
    return m;
}

/* ------------------------------------------------------------ blending */

static void normalize(const double *w, size_t n, double *out)
{
    double s = mc_np_sum(w, n);
    for (size_t i = 0; i < n; i++) out[i] = w[i] / s;
}

/* helpers.cpp build_blending_indices */
static void blending_indices(const double *w, size_t n, int64_t size, int16_t *di, int64_t *dsi)
{
    int64_t *cur = calloc(n, sizeof(int64_t));
    for (int64_t k = 0; k < size; k++) {
        /* error_d = w_d * max(k, 1) - taken_d; the first largest wins */
        double kd = k > 1 ? (double)k : 1.0;
        size_t best = 0;
        double best_err = w[0] * kd - (double)cur[0];
        for (size_t d = 1; d < n; d++) {
            double e = w[d] * kd - (double)cur[d];
            if (e > best_err) {
                best_err = e;
                best = d;
            }
        }
        di[k] = (int16_t)best;
        dsi[k] = cur[best]++;
    }
    free(cur);
}

/* helpers.cpp build_exhaustive_blending_indices: exactly sizes[d] from each */
static void exhaustive_indices(const int64_t *sizes, size_t n, int16_t *di, int64_t *dsi)
{
    int64_t total = 0, *cur = calloc(n, sizeof(int64_t));
    double *w = malloc(n * sizeof(double));
    for (size_t d = 0; d < n; d++) total += sizes[d];
    for (size_t d = 0; d < n; d++) w[d] = (double)sizes[d] / (double)total;
    for (int64_t k = 0; k < total; k++) {
        double kd = k > 1 ? (double)k : 1.0;
        int64_t best = -1;
        double best_err = -INFINITY;
        for (size_t d = 0; d < n; d++) {
            if (cur[d] == sizes[d]) continue;
            double e = w[d] * kd - (double)cur[d];
            if (best < 0 || e > best_err) {
                best_err = e;
                best = (int64_t)d;
            }
        }
        di[k] = (int16_t)best;
        dsi[k] = cur[best]++;
    }
    free(cur);
    free(w);
}

static const char *BAFFIX[3] = {"description.txt", "dataset_index.npy", "dataset_sample_index.npy"};

static mc_status build_blend(mc_gpt_dataset *ds, mc_split sp, const double *weights,
                             const int64_t *int_weights, int64_t size, const char *cache_dir,
                             mc_error *err)
{
    blend_split *b = &ds->blend[sp];
    size_t n = ds->n;
    mc_status st = MC_OK;
    mc_buf desc = MC_BUF_INIT;
    char *paths[3] = {0};
    double *nw = NULL;
    b->exists = 1;

    /* BlendedDataset's unique description */
    json_t *o = json_object(), *dl = json_array(), *wl = json_array();
    for (size_t d = 0; d < n; d++) json_array_append(dl, ds->samples[d][sp].ids);
    if (size >= 0) {
        nw = malloc(n * sizeof(double));
        normalize(weights, n, nw);
        for (size_t d = 0; d < n; d++) json_array_append_new(wl, json_real(nw[d]));
    } else {
        for (size_t d = 0; d < n; d++) json_array_append_new(wl, json_integer(int_weights[d]));
    }
    json_object_set_new(o, "class", json_string("BlendedDataset"));
    json_object_set_new(o, "datasets", dl);
    json_object_set_new(o, "split", json_string(mc_split_name(sp)));
    json_object_set_new(o, "weights", wl);
    json_object_set_new(o, "size", size >= 0 ? json_integer(size) : json_null());
    if ((st = mc_pyjson_dump(&desc, o, 0, err)) != MC_OK) goto done;

    if (size < 0) {
        size = 0;
        for (size_t d = 0; d < n; d++) size += int_weights[d];
    }
    b->size = size;
    if (cache_dir) {
        char hash[33];
        mc_md5_hex(desc.data, desc.len, hash);
        size_t l = strlen(cache_dir) + 80;
        if (!(b->cache_base = malloc(l))) goto nomem;
        snprintf(b->cache_base, l, "%s/%s-BlendedDataset-%s", cache_dir, hash, mc_split_name(sp));
        for (int i = 0; i < 3; i++)
            if (!(paths[i] = mc_gpt_path(b->cache_base, BAFFIX[i]))) goto nomem;
        if (mc_gpt_files_exist((const char *const *)paths, 3)) {
            if ((st = mc_npy_load(paths[1], &b->dataset_index, err)) != MC_OK ||
                (st = mc_npy_load(paths[2], &b->dataset_sample_index, err)) != MC_OK)
                goto done;
            if (b->dataset_index.type != MC_NPY_I16 || b->dataset_index.ndim != 1 ||
                b->dataset_sample_index.type != MC_NPY_I64 || b->dataset_sample_index.ndim != 1 ||
                b->dataset_index.shape[0] != size || b->dataset_sample_index.shape[0] != size) {
                st = mc_error_set(err, MC_ERR_FORMAT,
                                  "%s-*.npy: cached blend indices have the wrong "
                                  "shape or type; delete them to rebuild",
                                  b->cache_base);
                goto done;
            }
            goto done;
        }
    }

    int16_t *di = malloc(sizeof(int16_t) * (size_t)(size > 0 ? size : 1));
    int64_t *dsi = malloc(sizeof(int64_t) * (size_t)(size > 0 ? size : 1));
    b->dataset_index.owned = di;
    b->dataset_sample_index.owned = dsi;
    if (!di || !dsi) goto nomem;
    if (nw)
        blending_indices(nw, n, size, di, dsi);
    else
        exhaustive_indices(int_weights, n, di, dsi);
    b->dataset_index.data = di;
    b->dataset_index.type = MC_NPY_I16;
    b->dataset_index.ndim = 1;
    b->dataset_index.shape[0] = size;
    b->dataset_sample_index.data = dsi;
    b->dataset_sample_index.type = MC_NPY_I64;
    b->dataset_sample_index.ndim = 1;
    b->dataset_sample_index.shape[0] = size;
    ds->built++;
    /* the blend must not ask a dataset for more samples than it has */
    for (size_t d = 0; d < n; d++) {
        int64_t want = 0;
        for (int64_t k = 0; k < size; k++) want += di[k] == (int16_t)d;
        if (want > ds->samples[d][sp].n_samples) {
            st = mc_error_set(
                err, MC_ERR_USAGE,
                "%s: the %s blend takes %" PRId64 " samples from it but it has %" PRId64
                "; raise the mid-level surplus",
                ds->docs[d].path, mc_split_name(sp), want, ds->samples[d][sp].n_samples);
            goto done;
        }
    }
    if (cache_dir) {
        if ((st = mc_gpt_mkdirs(cache_dir, err)) != MC_OK ||
            (st = mc_npy_save(paths[1], MC_NPY_I16, 1, &size, di, err)) != MC_OK ||
            (st = mc_npy_save(paths[2], MC_NPY_I64, 1, &size, dsi, err)) != MC_OK ||
            (st = mc_gpt_write_text(paths[0], desc.data, desc.len, err)) != MC_OK)
            goto done;
        mc_npy_free(&b->dataset_index);
        mc_npy_free(&b->dataset_sample_index);
        if ((st = mc_npy_load(paths[1], &b->dataset_index, err)) != MC_OK ||
            (st = mc_npy_load(paths[2], &b->dataset_sample_index, err)) != MC_OK)
            goto done;
    }
    goto done;
nomem:
    st = mc_error_set(err, MC_ERR_NOMEM, "%s blend: out of memory", mc_split_name(sp));
done:
    json_decref(o);
    mc_buf_free(&desc);
    free(nw);
    for (int i = 0; i < 3; i++) free(paths[i]);
    return st;
}

/* ------------------------------------------------------------ open */

static int has_samples(const mc_gpt_dataset *ds, size_t d, int sp)
{
    return ds->exists[d * 3 + sp];
}

mc_status mc_gpt_dataset_open(const mc_gptdata_config *c, mc_gpt_dataset **out, mc_error *err)
{
    *out = NULL;
    mc_gpt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return mc_error_set(err, MC_ERR_NOMEM, "dataset: out of memory");
    mc_status st = MC_OK;
    double v[MC_SPLIT_COUNT], bounds[MC_SPLIT_COUNT][2];
    int split_exists[MC_SPLIT_COUNT];
    const mc_gptdata_blend *bl = &c->blend;

    if (c->seq_length < 2) {
        st = mc_error_set(err, MC_ERR_USAGE, "--seq-length %" PRId64 ": must be at least 2",
                          c->seq_length);
        goto fail;
    }
    if (!c->mock && bl->n == 0) {
        st = mc_error_set(err, MC_ERR_USAGE, "no --data-path given (and no --mock-data)");
        goto fail;
    }
    if (c->mock && c->vocab_size <= 0) {
        st = mc_error_set(err, MC_ERR_USAGE, "--mock-data needs a vocabulary size");
        goto fail;
    }
    if (!c->mock && bl->n > 32766) {
        st = mc_error_set(err, MC_ERR_LIMIT,
                          "--data-path: %zu datasets; a blend holds at most 32766", bl->n);
        goto fail;
    }
    /* Megatron's mock data always splits 1,1,1 */
    ds->split_string = strdup(c->mock ? "1,1,1" : (c->split ? c->split : "969,30,1"));
    if (!ds->split_string) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = mc_gptdata_parse_split(ds->split_string, v, err)) != MC_OK) goto fail;
    ds->p.seq_length = c->seq_length;
    ds->p.seed = c->seed;
    ds->p.add_extra_token = c->add_extra_token;
    ds->p.drop_last_partial_validation = c->drop_last_partial_validation;
    ds->p.split_string = ds->split_string;
    ds->p.cache_dir = c->cache_dir;
    ds->p.split_matrix = split_matrix(v, bounds, split_exists);
    if (c->tokenizer_json) {
        json_error_t je;
        ds->p.tokenizer = json_loads(c->tokenizer_json, JSON_DECODE_ANY, &je);
        if (!ds->p.tokenizer) {
            st = mc_error_set(err, MC_ERR_USAGE,
                              "tokenizer identifiers: invalid JSON at column %d: %s", je.column,
                              je.text);
            goto fail;
        }
    } else {
        ds->p.tokenizer = json_null();
    }

    ds->n = c->mock ? 1 : bl->n;
    ds->docs = calloc(ds->n, sizeof *ds->docs);
    ds->samples = calloc(ds->n, sizeof *ds->samples);
    ds->exists = calloc(ds->n * 3, sizeof(int));
    if (!ds->docs || !ds->samples || !ds->exists) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t d = 0; d < ds->n; d++) {
        st = c->mock ? mc_gpt_docs_mock(&ds->docs[d], c->vocab_size, c->eod, err)
                     : mc_gpt_docs_open(&ds->docs[d], bl->prefixes[d], err);
        if (st != MC_OK) goto fail;
    }

    /* what each (dataset, split) is asked for */
    int weighted = !c->mock && bl->weights != NULL;
    ds->blended = !c->mock && (bl->n > 1 || weighted);
    double *w = NULL;
    if (weighted) {
        if (!(w = malloc(ds->n * sizeof(double)))) {
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            goto fail;
        }
        normalize(bl->weights, ds->n, w);
        for (int sp = 0; sp < MC_SPLIT_COUNT; sp++)
            if (split_exists[sp] && c->num_samples[sp] < 0) {
                free(w);
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "--data-path with weights needs the number of %s samples",
                                  mc_split_name((mc_split)sp));
                goto fail;
            }
    }
    for (size_t d = 0; d < ds->n; d++) {
        int64_t n_elem = ds->docs[d].n_docs;
        for (int sp = 0; sp < MC_SPLIT_COUNT; sp++) {
            if (!split_exists[sp]) continue;
            /* int(round(b * N)): round half to even, like Python's round */
            int64_t beg = (int64_t)nearbyint(bounds[sp][0] * (double)n_elem);
            int64_t end = (int64_t)nearbyint(bounds[sp][1] * (double)n_elem);
            int64_t want;
            if (!ds->blended)
                want = c->num_samples[sp];
            else if (weighted)
                want = (int64_t)ceil(ceil((double)c->num_samples[sp] * w[d]) *
                                     (1 + c->mid_level_surplus));
            else
                want = -1;
            if ((st = mc_gpt_samples_open(&ds->samples[d][sp], &ds->docs[d], &ds->p, (mc_split)sp,
                                          beg, end, want, err)) != MC_OK) {
                free(w);
                goto fail;
            }
            ds->exists[d * 3 + sp] = 1;
            ds->built += ds->samples[d][sp].built;
        }
    }

    if (ds->blended) {
        for (int sp = 0; sp < MC_SPLIT_COUNT; sp++) {
            if (!split_exists[sp]) continue;
            int64_t size = 0;
            double *bw = malloc(ds->n * sizeof(double));
            int64_t *iw = malloc(ds->n * sizeof(int64_t));
            if (!bw || !iw) {
                free(bw);
                free(iw);
                free(w);
                st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
                goto fail;
            }
            if (weighted) {
                for (size_t d = 0; d < ds->n; d++) {
                    bw[d] = w[d];
                    size += (int64_t)ceil((double)c->num_samples[sp] * w[d]);
                }
            } else {
                int64_t total = 0;
                for (size_t d = 0; d < ds->n; d++) {
                    iw[d] = ds->samples[d][sp].n_samples;
                    bw[d] = (double)iw[d];
                    total += iw[d];
                    if (iw[d] <= 0) {
                        free(bw);
                        free(iw);
                        free(w);
                        st = mc_error_set(err, MC_ERR_USAGE,
                                          "%s: the %s split has no samples to blend",
                                          ds->docs[d].path, mc_split_name((mc_split)sp));
                        goto fail;
                    }
                }
                size = c->num_samples[sp] < 0
                           ? -1
                           : (c->num_samples[sp] < total ? c->num_samples[sp] : total);
            }
            st = build_blend(ds, (mc_split)sp, bw, iw, size, c->cache_dir, err);
            free(bw);
            free(iw);
            if (st != MC_OK) {
                free(w);
                goto fail;
            }
        }
    }
    free(w);
    *out = ds;
    return MC_OK;
fail:
    mc_gpt_dataset_close(ds);
    return st;
}

void mc_gpt_dataset_close(mc_gpt_dataset *ds)
{
    if (!ds) return;
    for (int sp = 0; sp < MC_SPLIT_COUNT; sp++) {
        mc_npy_free(&ds->blend[sp].dataset_index);
        mc_npy_free(&ds->blend[sp].dataset_sample_index);
        free(ds->blend[sp].cache_base);
    }
    if (ds->samples)
        for (size_t d = 0; d < ds->n; d++)
            for (int sp = 0; sp < MC_SPLIT_COUNT; sp++) mc_gpt_samples_free(&ds->samples[d][sp]);
    if (ds->docs)
        for (size_t d = 0; d < ds->n; d++) mc_gpt_docs_close(&ds->docs[d]);
    free(ds->samples);
    free(ds->docs);
    free(ds->exists);
    json_decref(ds->p.split_matrix);
    json_decref(ds->p.tokenizer);
    free(ds->split_string);
    free(ds);
}

/* ------------------------------------------------------------ access */

int64_t mc_gpt_dataset_num_samples(const mc_gpt_dataset *ds, mc_split split)
{
    if ((unsigned)split >= MC_SPLIT_COUNT) return 0;
    if (ds->blended) return ds->blend[split].exists ? ds->blend[split].size : 0;
    return has_samples(ds, 0, split) ? ds->samples[0][split].n_samples : 0;
}

mc_status mc_gpt_dataset_locate(const mc_gpt_dataset *ds, mc_split split, int64_t index,
                                int *dataset, int64_t *dataset_sample, mc_error *err)
{
    int64_t n = mc_gpt_dataset_num_samples(ds, split);
    if (index < 0 || index >= n)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s sample %" PRId64 " out of range [0, %" PRId64 ")",
                            mc_split_name(split), index, n);
    if (!ds->blended) {
        *dataset = 0;
        *dataset_sample = index;
        return MC_OK;
    }
    const blend_split *b = &ds->blend[split];
    int64_t d = mc_npy_get(&b->dataset_index, index);
    int64_t s = mc_npy_get(&b->dataset_sample_index, index);
    if (d < 0 || (size_t)d >= ds->n || s < 0)
        return mc_error_set(
            err, MC_ERR_FORMAT, "%s-*.npy: %s sample %" PRId64 " names dataset %" PRId64 " of %zu",
            b->cache_base ? b->cache_base : "blend", mc_split_name(split), index, d, ds->n);
    *dataset = (int)d;
    *dataset_sample = s;
    return MC_OK;
}

mc_status mc_gpt_dataset_sample(const mc_gpt_dataset *ds, mc_split split, int64_t index,
                                int32_t *tokens, mc_error *err)
{
    int d;
    int64_t s;
    mc_status st = mc_gpt_dataset_locate(ds, split, index, &d, &s, err);
    if (st != MC_OK) return st;
    return mc_gpt_samples_get(&ds->samples[d][split], s, tokens, err);
}

int mc_gpt_dataset_built(const mc_gpt_dataset *ds) { return ds->built; }

const char *mc_gpt_dataset_cache_base(const mc_gpt_dataset *ds, int i, mc_split split)
{
    if ((unsigned)split >= MC_SPLIT_COUNT) return NULL;
    if (i < 0) return ds->blend[split].cache_base;
    if ((size_t)i >= ds->n || !has_samples(ds, (size_t)i, split)) return NULL;
    return ds->samples[i][split].cache_base;
}
