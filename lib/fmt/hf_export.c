/*
 * hf_export.c - an mc checkpoint out as a Hugging Face model directory
 * (mc_hf_export in mc/hf.h): config.json, the weights in safetensors
 * (sharded beyond a size), generation_config.json, and the tokenizer the
 * model was trained with in the files transformers reads.
 *
 * The directory is built under a hidden temporary name beside the final
 * one and renamed into place when every file is complete, so a failed
 * export leaves nothing behind and a reader never sees half a model.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt/gguf_internal.h"
#include "fmt/hf_internal.h"
#include "mc/buf.h"
#include "mc/ckpt.h"
#include "mc/file.h"
#include "mc/hf.h"
#include "mc/safetensors.h"
#include "mc/tokenizer.h"

void mc_hf_export_options_init(mc_hf_export_options *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = -1;
    o->max_shard_size = 5000000000ull;
}

static void note(const mc_hf_export_options *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(const mc_hf_export_options *o, const char *fmt, ...)
{
    if (!o->note) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    o->note(o->note_ctx, msg);
}

static mc_st_dtype st_dtype(mc_ckpt_dtype d)
{
    return d == MC_CKPT_BFLOAT16 ? MC_ST_BF16 : d == MC_CKPT_FLOAT16 ? MC_ST_F16 : MC_ST_F32;
}

static const char *torch_name(mc_st_dtype d)
{
    return d == MC_ST_BF16 ? "bfloat16" : d == MC_ST_F16 ? "float16" : "float32";
}

/* A small file of the export, atomically. */
static mc_status put_file(const char *dir, const char *name, const void *data, size_t n,
                          mc_error *err)
{
    char *path = mc_strprintf("%s/%s", dir, name);
    if (!path) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_afile f;
    mc_status st = mc_afile_open(&f, path, err);
    if (!st) st = mc_afile_write(&f, data, n, err);
    if (!st)
        st = mc_afile_commit(&f, err);
    else
        mc_afile_abort(&f);
    free(path);
    return st;
}

static mc_status put_json(const char *dir, const char *name, json_t *o, mc_error *err)
{
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))
                   : NULL;
    json_decref(o);
    if (!text) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    size_t n = strlen(text);
    text[n] = 0;
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    t2[n] = '\n';
    mc_status st = put_file(dir, name, t2, n + 1, err);
    free(t2);
    return st;
}

/* ------------------------------------------------------------ tokenizer */

typedef struct tok_info {
    json_t *attr; /* the checkpoint's "tokenizer" attribute, or NULL */
    const char *type;
    int64_t eod; /* -1: unknown */
} tok_info;

/* The content of the token with id `id` in a tokenizer.json (added tokens
 * first, then the model's vocabulary), or NULL. */
static const char *token_text(json_t *tj, int64_t id)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, t)
    {
        if (json_integer_value(json_object_get(t, "id")) == id)
            return json_string_value(json_object_get(t, "content"));
    }
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(tj, "model"), "vocab"), k, v)
    {
        if (json_is_integer(v) && json_integer_value(v) == id) return k;
    }
    return NULL;
}

static void tok_info_read(mc_ckpt_reader *r, tok_info *t)
{
    memset(t, 0, sizeof *t);
    t->eod = -1;
    mc_error e = {0};
    if (mc_ckpt_read_json(r, "tokenizer", &t->attr, &e)) return;
    t->type = json_string_value(json_object_get(t->attr, "type"));
    mc_tokenizer *tok = NULL;
    if (!mc_ckpt_read_tokenizer(r, &tok, &e)) t->eod = mc_tokenizer_eod(tok);
    mc_tokenizer_free(tok);
}

/* The id of the stored tokenizer_config.json's eos_token, or -1. */
static int32_t own_eos_id(mc_ckpt_reader *r)
{
    json_t *own = mc_ckpt_tokenizer_config(r);
    const json_t *v = json_object_get(own, "eos_token");
    if (json_is_object(v)) v = json_object_get(v, "content");
    int32_t id = -1;
    mc_tokenizer *tok = NULL;
    mc_error e = {0};
    if (json_is_string(v) && !mc_ckpt_read_tokenizer(r, &tok, &e))
        id = mc_tokenizer_token_to_id(tok, json_string_value(v));
    mc_tokenizer_free(tok);
    json_decref(own);
    return id;
}

/* The tokenizer's files and tokenizer_config.json. */
static mc_status write_tokenizer(mc_ckpt_reader *r, const tok_info *t, const mc_model_config *c,
                                 hf_arch arch, const char *dir, const mc_hf_export_options *o,
                                 mc_error *err)
{
    if (!t->type) {
        note(o, "the checkpoint holds no tokenizer (trained on --mock-data or by an older mc): "
                "no tokenizer files written");
        return MC_OK;
    }
    int hf = !strcmp(t->type, "HuggingFaceTokenizer"), gpt2 = !strcmp(t->type, "GPT2BPETokenizer");
    int tik = !strcmp(t->type, "TikTokenizer");
    if (!hf && !gpt2 && !tik) {
        note(o,
             "tokenizer %s has no Hugging Face form mc writes (only HuggingFaceTokenizer, "
             "GPT2BPETokenizer and TikTokenizer): no tokenizer files written",
             t->type);
        return MC_OK;
    }
    void *data = NULL;
    size_t n = 0;
    mc_status st = MC_OK;
    const char *eos = NULL;
    json_t *tj = NULL;
    if (tik) {
        /* no tokenizer.json was used in training: one converted from the
         * ranks (gguf_vocab.c), which encodes as mc's TikTokenizer */
        mc_tokenizer *tok = NULL;
        st = mc_ckpt_read_tokenizer(r, &tok, err);
        if (!st) st = mc_tiktoken_hf_json(r, tok, c->padded_vocab_size, &tj, err);
        mc_tokenizer_free(tok);
        if (!st) st = put_json(dir, "tokenizer.json", json_incref(tj), err);
        if (!st && t->eod >= 0) eos = token_text(tj, t->eod);
    } else if (hf) {
        st = mc_ckpt_read_tokenizer_file(r, "model", &data, &n, err);
        if (!st) st = put_file(dir, "tokenizer.json", data, n, err);
        if (!st && t->eod >= 0) {
            json_error_t je;
            tj = json_loadb(data, n, 0, &je);
            eos = tj ? token_text(tj, t->eod) : NULL;
        }
        free(data);
    } else {
        st = mc_ckpt_read_tokenizer_file(r, "vocab", &data, &n, err);
        if (!st) st = put_file(dir, "vocab.json", data, n, err);
        free(data);
        data = NULL;
        if (!st) st = mc_ckpt_read_tokenizer_file(r, "merges", &data, &n, err);
        if (!st) st = put_file(dir, "merges.txt", data, n, err);
        free(data);
        eos = "<|endoftext|>"; /* Megatron's GPT2BPETokenizer's end of document */
    }
    if (st) {
        json_decref(tj);
        return mc_error_prefix(err, "%s: stored tokenizer", mc_ckpt_file(r));
    }
    /* PreTrainedTokenizerFast runs tokenizer.json exactly as it is, which
     * is what mc trained with (a model-specific class may add tokens). */
    json_t *cfg = json_pack("{s:s, s:I, s:b}", "tokenizer_class",
                            gpt2 ? "GPT2Tokenizer" : "PreTrainedTokenizerFast", "model_max_length",
                            (json_int_t)c->max_position_embeddings, "clean_up_tokenization_spaces",
                            0);
    /* Megatron's TikTokenizer encodes special-token text as plain text
     * (encode_ordinary): transformers does so with split_special_tokens */
    if (tik) json_object_set_new(cfg, "split_special_tokens", json_true());
    if (eos) {
        json_object_set_new(cfg, "eos_token", json_string(eos));
        if (arch == HF_GPT2) json_object_set_new(cfg, "bos_token", json_string(eos));
        if (gpt2) json_object_set_new(cfg, "unk_token", json_string(eos));
    }
    /* the model's own tokenizer_config.json, when training stored it: its
     * chat template and its special tokens (a chat model stops at its
     * end-of-turn token, not at the end of document) */
    json_t *own = hf ? mc_ckpt_tokenizer_config(r) : NULL;
    static const char *const keep[] = {"chat_template", "bos_token", "eos_token",
                                       "pad_token",     "unk_token", "add_bos_token",
                                       "add_eos_token"};
    for (size_t i = 0; own && i < sizeof keep / sizeof *keep; i++) {
        json_t *v = json_object_get(own, keep[i]);
        if (v && !json_is_null(v)) json_object_set(cfg, keep[i], v);
    }
    json_decref(own);
    json_decref(tj);
    return put_json(dir, "tokenizer_config.json", cfg, err);
}

/* ------------------------------------------------------------ directory */

/* Names an export writes: only a directory holding nothing else is
 * replaced. */
static int export_file(const char *name)
{
    static const char *const names[] = {"config.json",    "generation_config.json",
                                        "tokenizer.json", "tokenizer_config.json",
                                        "vocab.json",     "merges.txt",
                                        MC_ST_INDEX,      NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(name, names[i])) return 1;
    size_t n = strlen(name);
    return n > 12 && !strcmp(name + n - 12, ".safetensors");
}

static mc_status check_replaceable(const char *out, mc_error *err)
{
    struct stat sb;
    if (lstat(out, &sb) != 0)
        return errno == ENOENT ? MC_OK
                               : mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot stat", out);
    if (!S_ISDIR(sb.st_mode))
        return mc_error_set(err, MC_ERR_IO, "%s: exists and is not a directory", out);
    DIR *d = opendir(out);
    if (!d) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open", out);
    mc_status st = MC_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !st)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !export_file(e->d_name))
            st = mc_error_set(err, MC_ERR_IO,
                              "%s: exists and holds %s, which an export does not write: not "
                              "replacing it",
                              out, e->d_name);
    closedir(d);
    return st;
}

static mc_status make_temp_dir(const char *out, char **tmp, mc_error *err)
{
    const char *slash = strrchr(out, '/');
    *tmp = slash ? mc_strprintf("%.*s/.%s.tmp.XXXXXX", (int)(slash - out), out, slash + 1)
                 : mc_strprintf(".%s.tmp.XXXXXX", out);
    if (!*tmp) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    if (!mkdtemp(*tmp)) {
        int e = errno;
        free(*tmp);
        *tmp = NULL;
        if (e == ENOENT)
            return mc_check_output_dir(out, err) ? err->code
                                                 : mc_error_errno(err, MC_ERR_IO, e, "%s", out);
        return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create a directory beside it", out);
    }
    mode_t um = umask(0);
    umask(um);
    chmod(*tmp, 0777 & ~um); /* mkdtemp's 0700 would stay after the rename */
    return MC_OK;
}

/* Rename tmp to out; an existing out (checked replaceable) is exchanged
 * with it atomically and then removed. */
static mc_status publish(const char *tmp, const char *out, mc_error *err)
{
    mc_status st = mc_fsync_path(tmp, err);
    if (st) return st;
    if (rename(tmp, out) == 0) return MC_OK;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot rename into place", out);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) != 0)
        return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot replace", out);
    mc_remove_tree(tmp); /* now the old directory */
    return MC_OK;
}

/* ------------------------------------------------------------ weights */

typedef struct src_cache {
    char name[128];
    float *x;
    size_t cap;
} src_cache;

static mc_status load_src(mc_ckpt_reader *r, const hf_entry *e, src_cache *s, mc_error *err)
{
    if (s->x && !strcmp(s->name, e->mc)) return MC_OK;
    size_t n = (size_t)e->mc_rows * (size_t)(e->mc_cols ? e->mc_cols : 1);
    if (n > s->cap) {
        free(s->x);
        s->cap = 0;
        if (!(s->x = malloc(n * sizeof(float))))
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory for tensor %s", e->mc);
        s->cap = n;
    }
    char path[160];
    snprintf(path, sizeof path, "model/%s", e->mc);
    s->name[0] = 0;
    mc_status st = mc_ckpt_read_tensor(r, path, e->mc_rows, e->mc_cols, 0, 0, e->mc_rows,
                                       e->mc_cols, s->x, err);
    if (!st) snprintf(s->name, sizeof s->name, "%s", e->mc);
    return st;
}

/* Gather the entry's rows from the source (and transpose) into out. */
static void gather(const hf_entry *e, const float *src, float *out, float *tmp)
{
    size_t cols = (size_t)(e->cols ? e->cols : 1);
    float *g = e->transpose ? tmp : out;
    size_t at = 0;
    for (int i = 0; i < e->nranges; i++) {
        memcpy(g + at * cols, src + (size_t)e->ranges[i].row0 * cols,
               (size_t)e->ranges[i].n * cols * sizeof(float));
        at += (size_t)e->ranges[i].n;
    }
    if (e->transpose) {
        size_t R = (size_t)e->rows;
        for (size_t i0 = 0; i0 < R; i0 += 32)
            for (size_t j0 = 0; j0 < cols; j0 += 32)
                for (size_t i = i0; i < R && i < i0 + 32; i++)
                    for (size_t j = j0; j < cols && j < j0 + 32; j++)
                        out[j * R + i] = g[i * cols + j];
    }
}

static mc_status write_weights(mc_ckpt_reader *r, const hf_map *map, const mc_st_dtype *dt,
                               const char *dir, const mc_hf_export_options *o, mc_error *err)
{
    mc_st_writer *w = NULL;
    mc_status st = mc_st_writer_new(dir, o->max_shard_size, &w, err);
    size_t maxn = 0;
    for (size_t i = 0; i < map->n && !st; i++) {
        const hf_entry *e = &map->e[i];
        int64_t shape[2] = {e->transpose ? e->cols : e->rows, e->transpose ? e->rows : e->cols};
        st = mc_st_writer_add(w, e->hf, dt[i], e->cols ? 2 : 1, shape, err);
        size_t n = (size_t)e->rows * (size_t)(e->cols ? e->cols : 1);
        maxn = n > maxn ? n : maxn;
    }
    src_cache src = {0};
    float *out = st ? NULL : malloc(maxn * sizeof *out),
          *tmp = st ? NULL : malloc(maxn * sizeof *tmp);
    if (!st && (!out || !tmp)) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < map->n && !st; i++) {
        const hf_entry *e = &map->e[i];
        st = load_src(r, e, &src, err);
        if (!st) {
            gather(e, src.x, out, tmp);
            st = mc_st_writer_write_f32(w, out, (size_t)e->rows * (size_t)(e->cols ? e->cols : 1),
                                        err);
        }
    }
    free(out);
    free(tmp);
    free(src.x);
    if (st) {
        mc_st_writer_abort(w);
        return st;
    }
    return mc_st_writer_finish(w, err);
}

/* ------------------------------------------------------------ export */

mc_status mc_hf_export(const char *ckpt, const char *out_dir, const mc_hf_export_options *o,
                       mc_error *err)
{
    mc_hf_export_options defaults;
    if (!o) {
        mc_hf_export_options_init(&defaults);
        o = &defaults;
    }
    mc_ckpt_reader *r = NULL;
    mc_status st = mc_ckpt_open(ckpt, &r, err);
    if (st) return st;
    mc_model_config c;
    hf_arch arch;
    hf_map map = {0};
    tok_info tok = {0};
    mc_st_dtype *dt = NULL;
    char *tmp = NULL;
    st = mc_ckpt_read_model_config(r, &c, err);
    if (!st && (st = hf_arch_for(&c, &arch, err))) mc_error_prefix(err, "%s", mc_ckpt_file(r));
    if (!st) st = hf_map_build(&c, arch, &map, err);
    if (!st && !(dt = calloc(map.n ? map.n : 1, sizeof *dt)))
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    /* Every source tensor, its shape and stored dtype, before writing. */
    int same = 1;
    for (size_t i = 0; i < map.n && !st; i++) {
        const hf_entry *e = &map.e[i];
        char path[160];
        int64_t rows, cols;
        mc_ckpt_dtype d;
        snprintf(path, sizeof path, "model/%s", e->mc);
        st = mc_ckpt_tensor_info(r, path, &rows, &cols, &d, err);
        if (!st && (rows != e->mc_rows || cols != e->mc_cols))
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: tensor %s has shape [%lld, %lld], the configuration needs "
                              "[%lld, %lld]",
                              mc_ckpt_file(r), path, (long long)rows, (long long)cols,
                              (long long)e->mc_rows, (long long)e->mc_cols);
        dt[i] = st_dtype(o->dtype >= 0 ? (mc_ckpt_dtype)o->dtype : d);
        same &= dt[i] == dt[0];
    }
    if (!st) st = check_replaceable(out_dir, err);
    int counted = 0;
    if (!st) {
        /* counted before it exists: a signal is deferred until it is gone */
        mc_temp_begin();
        counted = 1;
        st = make_temp_dir(out_dir, &tmp, err);
    }
    if (!st) st = write_weights(r, &map, dt, tmp, o, err);
    if (!st) {
        tok_info_read(r, &tok);
        st = put_json(tmp, "config.json",
                      hf_config_json(&c, arch, tok.eod, torch_name(same ? dt[0] : MC_ST_F32)), err);
    }
    if (!st) {
        json_t *g = json_object();
        if (tok.eod >= 0) {
            if (arch == HF_GPT2) json_object_set_new(g, "bos_token_id", json_integer(tok.eod));
            json_object_set_new(g, "eos_token_id", json_integer(tok.eod));
        }
        /* a chat model's own end of turn (its stored tokenizer_config.json's
         * eos_token) stops generation too, first */
        int32_t turn = own_eos_id(r);
        if (turn >= 0 && turn != tok.eod)
            json_object_set_new(g, "eos_token_id",
                                tok.eod >= 0 ? json_pack("[i,i]", (int)turn, (int)tok.eod)
                                             : json_integer(turn));
        st = put_json(tmp, "generation_config.json", g, err);
    }
    if (!st) st = write_tokenizer(r, &tok, &c, arch, tmp, o, err);
    if (!st) st = publish(tmp, out_dir, err);
    if (st && tmp) mc_remove_tree(tmp);
    if (counted) mc_temp_end();
    free(tmp);
    json_decref(tok.attr);
    free(dt);
    hf_map_free(&map);
    mc_ckpt_close(r);
    return st;
}
