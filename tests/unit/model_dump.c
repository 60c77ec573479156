/*
 * model_dump.c - write a freshly initialized test model's parameters as .npy
 * files, for tests/golden/torch_model.py to rebuild the same model in
 * PyTorch.
 *
 *   model_dump PRESET SEED OUTDIR
 *
 * PRESET is tiny-gpt or tiny-llama, shrunk to the golden's shape (see
 * golden_config below, which test_model.c repeats). Writes OUTDIR/NAME.npy
 * (float32, the global shape; 1-D for vectors) for every parameter and
 * OUTDIR/config.json with the shape.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/kern.h"
#include "mc/model.h"

/* The golden's model: the preset with T = 8, vocabulary 60 padded to 64. */
static int golden_config(const char *preset, mc_model_config *c, mc_error *err)
{
    if (mc_model_preset(preset, c, err)) return -1;
    c->seq_length = 8;
    c->max_position_embeddings = 8;
    c->vocab_size = 60;
    c->make_vocab_size_divisible_by = 64;
    return mc_model_config_finish(c, 1, err) ? -1 : 0;
}

/* NPY version 1.0: magic, header length, a Python dict literal padded with
 * spaces and ended by a newline so the data starts on a 64-byte boundary. */
static int write_npy(const char *path, const float *x, const mc_param *p)
{
    char dict[256];
    if (p->ndim == 1)
        snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld,), }",
                 (long long)p->rows);
    else
        snprintf(dict, sizeof dict,
                 "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                 (long long)p->rows, (long long)p->cols);
    size_t len = strlen(dict), total = (10 + len + 1 + 63) / 64 * 64;
    size_t hlen = total - 10;
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, len, f);
    for (size_t i = 10 + len; i < total - 1; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(x, sizeof(float), p->numel, f);
    return fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: model_dump PRESET SEED OUTDIR\n");
        return 2;
    }
    mc_error err = {0};
    mc_model_config c;
    mc_backend *be = NULL;
    mc_model *m = NULL;
    mc_grid g;
    mc_grid_single(&g);
    if (golden_config(argv[1], &c, &err) || mc_backend_cpu_new(1, &be, &err) ||
        mc_model_new(&c, &g, be, 2, MC_PREC_FP32, &m, &err)) {
        fprintf(stderr, "model_dump: %s\n", err.msg);
        return 1;
    }
    mc_model_init_weights(m, strtoull(argv[2], NULL, 10));
    size_t n = mc_model_numel(m);
    float *host = malloc(n * sizeof *host);
    mc_bcopy_to_host(be, host, mc_model_params(m), n * sizeof *host);
    char path[4096];
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *p = mc_model_param(m, i);
        snprintf(path, sizeof path, "%s/%s.npy", argv[3], p->name);
        if (write_npy(path, host + p->offset, p)) {
            fprintf(stderr, "model_dump: cannot write %s\n", path);
            return 1;
        }
    }
    snprintf(path, sizeof path, "%s/config.json", argv[3]);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f,
            "{\"preset\": \"%s\", \"num_layers\": %d, \"hidden_size\": %d, "
            "\"num_attention_heads\": %d, \"num_query_groups\": %d, \"kv_channels\": %d, "
            "\"ffn_hidden_size\": %d, \"seq_length\": %d, \"vocab_size\": %lld, "
            "\"padded_vocab_size\": %lld, \"normalization\": \"%s\", \"norm_epsilon\": %.9g, "
            "\"swiglu\": %d, \"rope\": %d, \"rotary_base\": %.9g, \"untied\": %d, "
            "\"bias\": %d, \"micro_batch\": 2}\n",
            argv[1], c.num_layers, c.hidden_size, c.num_attention_heads, c.num_query_groups,
            c.kv_channels, c.ffn_hidden_size, c.seq_length, (long long)c.vocab_size,
            (long long)c.padded_vocab_size,
            c.normalization == MC_NORM_LAYERNORM ? "LayerNorm" : "RMSNorm", c.norm_epsilon,
            c.swiglu, c.position_embedding_type == MC_POS_ROPE, c.rotary_base,
            c.untie_embeddings_and_output_weights, c.add_bias_linear);
    fclose(f);
    free(host);
    mc_model_free(m);
    mc_backend_free(be);
    return 0;
}
