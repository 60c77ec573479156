/*
 * convert.c - one checkpoint (or the average of several) written anew,
 * tensor by tensor through the public reader and writer (ckpt.h): stored
 * dtype, quantization, optimizer state kept or dropped, mc-train's FP8
 * state carried (not when averaging), pre-split for a
 * grid or one file, the attributes and tokenizer carried over, and a
 * "reshard" record of what was done. What mc-reshard does once its inputs
 * are open.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/ckpt.h"

void mc_ckpt_convert_opts_init(mc_ckpt_convert_opts *o)
{
    memset(o, 0, sizeof *o);
    o->quantize = MC_CKPT_FLOAT32;
    o->group_size = 128;
    o->tp = o->pp = 1;
}

/* Counters, integer and JSON attributes, the tokenizer, the RNG state and
 * the record of this conversion. */
static mc_status copy_attributes(mc_ckpt_reader *const *r, size_t nr, const char *const *names,
                                 const mc_ckpt_convert_opts *o, mc_ckpt_writer *w,
                                 int wrote_optimizer, mc_error *err)
{
    static const char *const ints[] = {"consumed_samples", "scheduler_samples", "optimizer_steps"};
    static const char *const jsons[] = {"config", "train_state"};
    mc_status st = MC_OK;
    mc_error e;
    for (size_t i = 0; i < 3 && !st; i++) {
        int64_t v;
        if (mc_ckpt_read_int(r[0], ints[i], &v, &e) == MC_OK)
            st = mc_ckpt_write_int(w, ints[i], v, err);
    }
    if (!st) st = mc_ckpt_write_int(w, "has_optimizer", wrote_optimizer, err);
    for (size_t i = 0; i < 2 && !st; i++) {
        json_t *v = NULL;
        if (mc_ckpt_read_json(r[0], jsons[i], &v, &e) == MC_OK) {
            char *text = json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(17));
            st = text ? mc_ckpt_write_json(w, jsons[i], text, err)
                      : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            free(text);
        }
        json_decref(v);
    }
    if (!st) st = mc_ckpt_copy_tokenizer(r[0], w, err);
    void *rng = NULL;
    size_t nrng = 0;
    if (!st && mc_ckpt_read_bytes(r[0], "rng", &rng, &nrng, &e) == MC_OK)
        st = mc_ckpt_write_bytes(w, "rng", rng, nrng, err);
    free(rng);
    /* Where this checkpoint came from and what was done to it. */
    if (!st) {
        json_t *from = json_array();
        for (size_t k = 0; k < nr; k++)
            json_array_append_new(from, json_string(names ? names[k] : mc_ckpt_dir(r[k])));
        json_t *p = json_pack(
            "{s:o, s:s, s:s?, s:I, s:I, s:I, s:b, s:b}", "from", from, "dtype",
            o->dtype_set ? mc_ckpt_dtype_name(o->dtype) : "as stored", "quantize",
            o->quantize != MC_CKPT_FLOAT32 ? mc_ckpt_dtype_name(o->quantize) : NULL, "group_size",
            (json_int_t)(o->quantize == MC_CKPT_INT4 ? o->group_size : 0), "tensor_parallel_size",
            (json_int_t)o->tp, "pipeline_parallel_size", (json_int_t)o->pp, "average", o->average,
            "drop_optimizer", !wrote_optimizer);
        char *text = p ? json_dumps(p, JSON_COMPACT) : NULL;
        st = text ? mc_ckpt_write_json(w, "reshard", text, err)
                  : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        free(text);
        json_decref(p);
    }
    return st;
}

/* One tensor of group (model or a moment) read (averaged), converted and
 * written; *buf grows as needed. */
static mc_status copy_tensor(mc_ckpt_reader *const *r, size_t nr, const mc_ckpt_convert_opts *o,
                             mc_ckpt_writer *w, const char *group, const char *path, float **buf,
                             size_t *cap, mc_ckpt_convert_stats *stats, mc_error *err)
{
    int64_t rows, cols;
    mc_ckpt_dtype in;
    mc_status st = mc_ckpt_tensor_info(r[0], path, &rows, &cols, &in, err);
    if (st) return st;
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    if (n > *cap) {
        float *nb = realloc(*buf, n * sizeof *nb);
        if (!nb)
            return mc_error_set(err, MC_ERR_NOMEM, "%s: %s: out of memory", mc_ckpt_file(r[0]),
                                path);
        *buf = nb;
        *cap = n;
    }
    if ((st = mc_ckpt_read_average(r, nr, path, rows, cols, *buf, err))) return st;
    int model = !strcmp(group, "model");
    mc_ckpt_dtype out = mc_ckpt_dtype_is_quantized(in) ? MC_CKPT_FLOAT32 : in;
    if (model && o->dtype_set) out = o->dtype;
    /* Quantized: the 2-D weights, not a MoE layer's router (its choice of
     * experts stays as trained; Megatron keeps it in fp32) nor the experts'
     * [E, rows] biases */
    if (model && cols > 0 && o->quantize != MC_CKPT_FLOAT32 && !strstr(path, ".mlp.router.") &&
        !(strstr(path, ".mlp.experts.") && !strcmp(path + strlen(path) - 5, ".bias")))
        out = o->quantize;
    /* The quantizers refuse non-finite values; name the input holding one. */
    const char *from = nr > 1 ? "the average" : mc_ckpt_file(r[0]);
    if (mc_ckpt_dtype_is_quantized(out) &&
        (st = mc_ckpt_check_quantizable(from, path, rows, cols, *buf, err)))
        return st;
    if ((st = mc_ckpt_write_whole(w, path, rows, cols, *buf, out, o->group_size, err))) return st;
    stats->tensors++;
    if (model) stats->params += (int64_t)n;
    return MC_OK;
}

mc_status mc_ckpt_convert(mc_ckpt_reader *const *r, size_t nr, const char *const *names,
                          const mc_ckpt_convert_opts *o, const char *out_dir, char **iter_dir,
                          mc_ckpt_convert_stats *stats, const mc_logger *lg, mc_error *err)
{
    *iter_dir = NULL;
    memset(stats, 0, sizeof *stats);
    mc_ckpt_reader *r0 = r[0];
    mc_status st = MC_OK;
    if (nr > 1 && (st = mc_ckpt_same_model(r, nr, err))) return st;
    mc_model_config cfg;
    int sharded = o->tp > 1 || o->pp > 1, have_cfg = 0;
    if (sharded) {
        if ((st = mc_ckpt_read_model_config(r0, &cfg, err)))
            return mc_error_prefix(err, "cannot split it for a grid");
        have_cfg = 1;
        /* Megatron pads the vocabulary to a multiple of
         * make_vocab_size_divisible_by x TP, so the grid may want other
         * shapes than the checkpoint has (mc-train would refuse it). */
        mc_model_config c = cfg;
        mc_error e;
        if (lg && mc_model_config_finish(&c, (int)o->tp, &e) == MC_OK &&
            c.padded_vocab_size != cfg.padded_vocab_size)
            mc_log_warn(lg,
                        "%s: under tensor-parallel size %" PRId64
                        " mc-train pads the vocabulary of "
                        "%" PRId64 " to %" PRId64 ", not to the %" PRId64
                        " stored, and will not load this checkpoint",
                        names ? names[0] : mc_ckpt_dir(r0), o->tp, cfg.vocab_size,
                        c.padded_vocab_size, cfg.padded_vocab_size);
    }
    mc_ckpt_writer *w = NULL;
    int64_t it = mc_ckpt_iteration(r0);
    st = sharded ? mc_ckpt_writer_begin_sharded(out_dir, it, (int)o->tp, (int)o->pp,
                                                have_cfg ? &cfg : NULL, &w, err)
                 : mc_ckpt_writer_begin(out_dir, it, &w, err);
    if (st) return st;
    if (o->compression) st = mc_ckpt_writer_set_compression(w, o->compression, 0, err);
    /* the model, the moments unless dropped, and mc-train's FP8 state
     * (training state like the loss scaler's: carried as stored, fp32,
     * dropped by --average) */
    static const char *const groups[] = {"model", "optimizer/exp_avg", "optimizer/exp_avg_sq",
                                         "fp8"};
    int wrote_optim = 0;
    float *buf = NULL;
    size_t cap = 0;
    for (int g = 0; g < 4 && !st; g++) {
        if (g > 0 && o->average) break;
        if (g > 0 && g < 3 && o->drop_optimizer) continue;
        char **list = NULL;
        size_t n = 0;
        st = mc_ckpt_list(r0, groups[g], &list, &n, err);
        if (st == MC_ERR_NOTFOUND && g > 0) {
            mc_error_clear(err);
            st = MC_OK;
            continue;
        }
        wrote_optim |= g > 0 && g < 3 && n > 0;
        char path[1024];
        for (size_t i = 0; i < n && !st; i++) {
            snprintf(path, sizeof path, "%s/%s", groups[g], list[i]);
            st = copy_tensor(r, nr, o, w, groups[g], path, &buf, &cap, stats, err);
        }
        free(list);
    }
    free(buf);
    if (!st) st = copy_attributes(r, nr, names, o, w, wrote_optim, err);
    if (st) {
        mc_ckpt_writer_abort(w);
        return st;
    }
    char *dir = strdup(mc_ckpt_writer_dir(w));
    if (!dir) {
        mc_ckpt_writer_abort(w);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    if ((st = mc_ckpt_writer_commit(w, err)) == MC_OK)
        *iter_dir = dir;
    else
        free(dir);
    return st;
}
