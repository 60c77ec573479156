/*
 * hf_import.c - a Hugging Face model directory in as an mc checkpoint
 * (mc_hf_is_model_dir, mc_hf_import in mc/hf.h): config.json through
 * hf_map.c, the safetensors files (sharded or not) scattered into Megatron
 * Core's layouts, each tensor in its stored dtype (so an import exported
 * again gives the same bytes); a tensor mc would drop is an error, not a
 * silent loss. See mc-formats(5), HUGGING FACE MODEL DIRECTORIES, "Import".
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt/hf_internal.h"
#include "mc/buf.h"
#include "mc/ckpt.h"
#include "mc/hf.h"
#include "mc/json.h"
#include "mc/safetensors.h"
#include "mc/tokenizer.h"

int mc_hf_is_model_dir(const char *path)
{
    struct stat sb;
    char *cfg = mc_strprintf("%s/config.json", path);
    int ok = cfg && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && access(cfg, R_OK) == 0;
    free(cfg);
    if (!ok) return 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        found = e->d_name[0] != '.' && n > 12 && !strcmp(e->d_name + n - 12, ".safetensors");
    }
    closedir(d);
    return found;
}

static int starts_with(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }
static int ends_with(const char *s, const char *x)
{
    size_t n = strlen(s), k = strlen(x);
    return n >= k && !strcmp(s + n - k, x);
}

/* The tensor of an entry: GPT-2 files saved by older transformers (the
 * original "gpt2" repository) have no "transformer." prefix. */
static const mc_st_tensor *find(const mc_st_model *m, hf_arch arch, const char *name)
{
    const mc_st_tensor *t = mc_st_find(m, name);
    if (!t && arch == HF_GPT2 && starts_with(name, "transformer."))
        t = mc_st_find(m, name + strlen("transformer."));
    return t;
}

/* Tensors of a directory that transformers itself does not load. */
static int ignorable(hf_arch arch, const char *name, int tied)
{
    if (!strcmp(name, "lm_head.weight")) return tied;
    if (arch == HF_GPT2)
        return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
    return ends_with(name, ".rotary_emb.inv_freq");
}

static mc_ckpt_dtype ckpt_dtype(mc_st_dtype d)
{
    return d == MC_ST_BF16 ? MC_CKPT_BFLOAT16 : d == MC_ST_F16 ? MC_CKPT_FLOAT16 : MC_CKPT_FLOAT32;
}

/* Check every entry's tensor (present, float, right shape) and every
 * tensor of the directory (used or ignorable). */
static mc_status check_tensors(const mc_st_model *m, const hf_map *map, const char *dir, int tied,
                               mc_error *err)
{
    char *used = calloc(mc_st_count(m) + 1, 1);
    if (!used) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status st = MC_OK;
    for (size_t i = 0; i < map->n && !st; i++) {
        const hf_entry *e = &map->e[i];
        const mc_st_tensor *t = find(m, map->arch, e->hf);
        if (!t) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: tensor %s is missing (%s needs it)", dir,
                              e->hf, hf_arch_name(map->arch));
            break;
        }
        used[t - mc_st_get(m, 0)] = 1;
        if (t->dtype != MC_ST_F32 && t->dtype != MC_ST_F16 && t->dtype != MC_ST_BF16) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: tensor %s has dtype %s (mc imports F32, F16 and BF16)", t->file,
                              t->name, mc_st_dtype_name(t->dtype));
            break;
        }
        int64_t want[2] = {e->transpose ? e->cols : e->rows, e->transpose ? e->rows : e->cols};
        int nd = e->cols ? 2 : 1;
        if (t->ndim != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1])) {
            char got[64] = "", need[64];
            for (int k = 0; k < t->ndim; k++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", k ? ", " : "",
                         (long long)t->shape[k]);
            if (nd == 2)
                snprintf(need, sizeof need, "%lld, %lld", (long long)want[0], (long long)want[1]);
            else
                snprintf(need, sizeof need, "%lld", (long long)want[0]);
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: tensor %s has shape [%s], config.json implies [%s]", t->file,
                              t->name, got, need);
        }
    }
    for (size_t i = 0; i < mc_st_count(m) && !st; i++) {
        const mc_st_tensor *t = mc_st_get(m, i);
        if (!used[i] && !ignorable(map->arch, t->name, tied))
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: tensor %s is not part of %s as mc reads it (refusing to drop "
                              "it)",
                              t->file, t->name, hf_arch_name(map->arch));
    }
    free(used);
    return st;
}

/* Assemble and write every mc tensor, in the map's order of first use. */
static mc_status write_tensors(const mc_st_model *m, const hf_map *map, mc_ckpt_writer *w,
                               mc_error *err)
{
    size_t maxmc = 0, maxhf = 0;
    for (size_t i = 0; i < map->n; i++) {
        const hf_entry *e = &map->e[i];
        size_t a = (size_t)e->mc_rows * (size_t)(e->mc_cols ? e->mc_cols : 1);
        size_t b = (size_t)e->rows * (size_t)(e->cols ? e->cols : 1);
        maxmc = a > maxmc ? a : maxmc;
        maxhf = b > maxhf ? b : maxhf;
    }
    float *dst = malloc(maxmc * sizeof *dst), *src = malloc(maxhf * sizeof *src),
          *tr = malloc(maxhf * sizeof *tr);
    char *done = calloc(map->n + 1, 1);
    mc_status st = dst && src && tr && done ? MC_OK
                                            : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < map->n && !st; i++) {
        if (done[i]) continue;
        const hf_entry *first = &map->e[i];
        size_t cols = (size_t)(first->mc_cols ? first->mc_cols : 1);
        memset(dst, 0, (size_t)first->mc_rows * cols * sizeof *dst);
        mc_st_dtype dt = find(m, map->arch, first->hf)->dtype;
        for (size_t j = i; j < map->n && !st; j++) {
            const hf_entry *e = &map->e[j];
            if (strcmp(e->mc, first->mc)) continue;
            done[j] = 1;
            const mc_st_tensor *t = find(m, map->arch, e->hf);
            if (t->dtype != dt) dt = MC_ST_F32; /* pieces of mixed dtypes: keep every bit */
            st = mc_st_to_f32(t, e->transpose ? tr : src, err);
            if (st) break;
            if (e->transpose) { /* stored [cols, rows] */
                size_t R = (size_t)e->rows;
                for (size_t a = 0; a < cols; a++)
                    for (size_t b = 0; b < R; b++) src[b * cols + a] = tr[a * R + b];
            }
            size_t at = 0;
            for (int k = 0; k < e->nranges; k++) {
                memcpy(dst + (size_t)e->ranges[k].row0 * cols, src + at * cols,
                       (size_t)e->ranges[k].n * cols * sizeof *dst);
                at += (size_t)e->ranges[k].n;
            }
        }
        char path[160];
        snprintf(path, sizeof path, "model/%s", first->mc);
        if (!st)
            st = mc_ckpt_write_tensor(w, path, first->mc_rows, first->mc_cols, 0, 0, first->mc_rows,
                                      first->mc_cols, dst, ckpt_dtype(dt), err);
    }
    free(dst);
    free(src);
    free(tr);
    free(done);
    return st;
}

/* The tokenizer of the directory: tokenizer.json, else GPT-2's
 * vocab.json + merges.txt; none is no error. */
static mc_status write_tokenizer(const char *dir, mc_ckpt_writer *w, mc_error *err)
{
    char *tj = mc_strprintf("%s/tokenizer.json", dir), *vj = mc_strprintf("%s/vocab.json", dir),
         *mt = mc_strprintf("%s/merges.txt", dir);
    mc_status st = MC_OK;
    mc_tokenizer_spec spec;
    if (!tj || !vj || !mt) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    } else if (access(tj, F_OK) == 0) {
        mc_tokenizer_spec_init(&spec, MC_TOKENIZER_HUGGINGFACE);
        spec.model = tj;
        st = mc_ckpt_write_tokenizer(w, &spec, err);
    } else if (access(vj, F_OK) == 0 && access(mt, F_OK) == 0) {
        mc_tokenizer_spec_init(&spec, MC_TOKENIZER_GPT2BPE);
        spec.vocab_file = vj;
        spec.merge_file = mt;
        st = mc_ckpt_write_tokenizer(w, &spec, err);
    }
    free(tj);
    free(vj);
    free(mt);
    return st;
}

mc_status mc_hf_import(const char *hf_dir, const char *ckpt_dir, char *out_path, size_t cap,
                       mc_error *err)
{
    char *cfg_path = mc_strprintf("%s/config.json", hf_dir);
    if (!cfg_path) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    json_t *cfg = NULL;
    mc_model_config c;
    hf_arch arch;
    hf_map map = {0};
    mc_st_model *m = NULL;
    mc_ckpt_writer *w = NULL;
    mc_status st = mc_json_load_file(cfg_path, &cfg, err);
    if (!st) st = hf_config_parse(cfg, cfg_path, &c, &arch, err);
    if (!st) st = hf_map_build(&c, arch, &map, err);
    if (!st) st = mc_st_open(hf_dir, &m, err);
    if (!st) st = check_tensors(m, &map, hf_dir, !c.untie_embeddings_and_output_weights, err);
    if (!st) st = mc_ckpt_writer_begin(ckpt_dir, 0, &w, err);
    if (!st) st = write_tensors(m, &map, w, err);
    if (!st) st = mc_ckpt_write_model_config(w, &c, err);
    if (!st && (st = write_tokenizer(hf_dir, w, err))) mc_error_prefix(err, "%s", hf_dir);
    if (!st && out_path) snprintf(out_path, cap, "%s", mc_ckpt_writer_dir(w));
    if (!st) {
        st = mc_ckpt_writer_commit(w, err);
    } else {
        mc_ckpt_writer_abort(w);
    }
    mc_st_close(m);
    hf_map_free(&map);
    json_decref(cfg);
    free(cfg_path);
    return st;
}
