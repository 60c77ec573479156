/*
 * compare.c - checkpoints compared and combined through the public reader
 * (ckpt.h): whether several checkpoints hold one model (the same
 * configuration, tensors and shapes), the element-wise average of a tensor
 * over them (mc-reshard --average), and the check that a tensor about to be
 * quantized holds only finite values, naming the first that is not.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/ckpt.h"

/* The fields of config.model of r (holding one: has) and of r0 (has0)
 * agree, both ways; the message names the first field that differs. */
static mc_status same_config(mc_ckpt_reader *r0, json_t *c0, int has0, mc_ckpt_reader *r,
                             mc_error *err)
{
    json_t *ck = NULL;
    int hask = mc_ckpt_read_json(r, "config", &ck, err) == MC_OK;
    mc_error_clear(err);
    json_t *m0 = json_object_get(c0, "model"), *mk = json_object_get(ck, "model");
    mc_status st = MC_OK;
    if (has0 != hask) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: %s a model configuration, %s %s",
                          mc_ckpt_file(r), hask ? "has" : "has no", mc_ckpt_file(r0),
                          has0 ? "has one" : "has none");
    } else if (m0 || mk) {
        const char *key;
        json_t *v;
        for (int pass = 0; pass < 2 && !st; pass++) {
            json_t *x = pass ? mk : m0, *y = pass ? m0 : mk;
            json_object_foreach(x, key, v)
            {
                json_t *o = json_object_get(y, key);
                if (o && json_equal(o, v)) continue;
                char *a = json_dumps(pass ? v : o, JSON_ENCODE_ANY);
                char *b = json_dumps(pass ? o : v, JSON_ENCODE_ANY);
                st = mc_error_set(err, MC_ERR_FORMAT, "%s: config.model.%s is %s, %s in %s",
                                  mc_ckpt_file(r), key, a ? a : "missing", b ? b : "missing",
                                  mc_ckpt_file(r0));
                free(a);
                free(b);
                break;
            }
        }
    }
    json_decref(ck);
    return st;
}

/* The same model tensors with the same shapes in r0 and r, both ways. */
static mc_status same_tensors(mc_ckpt_reader *r0, mc_ckpt_reader *r, mc_error *err)
{
    mc_status st = MC_OK;
    for (int pass = 0; pass < 2 && !st; pass++) {
        mc_ckpt_reader *x = pass ? r : r0, *y = pass ? r0 : r;
        char **names = NULL;
        size_t n = 0;
        if ((st = mc_ckpt_list(x, "model", &names, &n, err)) != MC_OK) break;
        char path[1024];
        for (size_t i = 0; i < n && !st; i++) {
            snprintf(path, sizeof path, "model/%s", names[i]);
            int64_t r1, c1, r2, c2;
            if (!mc_ckpt_has_tensor(y, path)) {
                if (pass)
                    st = mc_error_set(err, MC_ERR_FORMAT, "%s: has tensor %s, which %s has not",
                                      mc_ckpt_file(r), path, mc_ckpt_file(r0));
                else
                    st = mc_error_set(err, MC_ERR_FORMAT, "%s: no tensor %s, which %s has",
                                      mc_ckpt_file(r), path, mc_ckpt_file(r0));
            } else if (!pass && (st = mc_ckpt_tensor_info(x, path, &r1, &c1, NULL, err)) == MC_OK &&
                       (st = mc_ckpt_tensor_info(y, path, &r2, &c2, NULL, err)) == MC_OK &&
                       (r1 != r2 || c1 != c2)) {
                st = mc_error_set(err, MC_ERR_FORMAT,
                                  "%s: %s has shape [%" PRId64 ", %" PRId64 "], [%" PRId64
                                  ", %" PRId64 "] in %s",
                                  mc_ckpt_file(r), path, r2, c2, r1, c1, mc_ckpt_file(r0));
            }
        }
        free(names);
    }
    return st;
}

mc_status mc_ckpt_same_model(mc_ckpt_reader *const *r, size_t n, mc_error *err)
{
    json_t *c0 = NULL;
    int has0 = mc_ckpt_read_json(r[0], "config", &c0, err) == MC_OK;
    mc_error_clear(err);
    mc_status st = MC_OK;
    for (size_t k = 1; k < n && !st; k++) {
        st = same_config(r[0], c0, has0, r[k], err);
        if (!st) st = same_tensors(r[0], r[k], err);
    }
    json_decref(c0);
    return st;
}

mc_status mc_ckpt_read_average(mc_ckpt_reader *const *r, size_t n, const char *path, int64_t rows,
                               int64_t cols, float *host, mc_error *err)
{
    int64_t c = cols ? cols : 1;
    mc_status st = mc_ckpt_read_tensor(r[0], path, rows, cols, 0, 0, rows, c, host, err);
    if (st || n < 2) return st;
    /* The mean in double, rounded once: (a + b) / 2 of two fp32 values is
     * then the correctly rounded mean. */
    size_t len = (size_t)rows * (size_t)c;
    double *acc = malloc(len * sizeof *acc);
    if (!acc) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < len; i++) acc[i] = host[i];
    for (size_t k = 1; k < n && !st; k++) {
        st = mc_ckpt_read_tensor(r[k], path, rows, cols, 0, 0, rows, c, host, err);
        for (size_t i = 0; i < len && !st; i++) acc[i] += host[i];
    }
    for (size_t i = 0; i < len && !st; i++) host[i] = (float)(acc[i] / (double)n);
    free(acc);
    return st;
}

mc_status mc_ckpt_check_quantizable(const char *what, const char *path, int64_t rows, int64_t cols,
                                    const float *host, mc_error *err)
{
    size_t c = (size_t)(cols ? cols : 1), len = (size_t)rows * c;
    for (size_t i = 0; i < len; i++)
        if (!isfinite(host[i]))
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: %s: element [%zu, %zu] is %g; only finite values can be "
                                "quantized",
                                what, path, i / c, i % c, (double)host[i]);
    return MC_OK;
}
