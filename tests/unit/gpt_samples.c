/*
 * gpt_samples.c - a test helper: print the training samples mc-train reads
 * from a dataset, one line of seq_length + 1 ids per sample, in order (the
 * golden scripts train PyTorch on exactly these; the order is Megatron
 * Core's GPTDataset's, which test_gptdata checks).
 *
 *   gpt_samples PREFIX SEQ_LENGTH SEED NUM_SAMPLES CACHE_DIR
 *
 * The split is "100,0,0" and NUM_SAMPLES the training samples mc-train asks
 * for (--train-iters x --global-batch-size, no evaluation).
 */
#include <stdio.h>
#include <stdlib.h>

#include "mc/gptdata.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: gpt_samples PREFIX SEQ_LENGTH SEED NUM_SAMPLES CACHE_DIR\n");
        return 2;
    }
    mc_error err;
    mc_gptdata_config c;
    mc_gptdata_config_init(&c);
    const char *words[1] = {argv[1]};
    if (mc_gptdata_parse_data_path(words, 1, &c.blend, &err)) goto fail;
    c.split = "100,0,0";
    c.seq_length = atol(argv[2]);
    c.seed = (uint32_t)atol(argv[3]);
    int64_t n = atoll(argv[4]);
    c.num_samples[MC_SPLIT_TRAIN] = n;
    c.num_samples[MC_SPLIT_VALID] = c.num_samples[MC_SPLIT_TEST] = 0;
    c.cache_dir = argv[5];
    mc_gpt_dataset *ds = NULL;
    if (mc_gpt_dataset_open(&c, &ds, &err)) goto fail;
    int32_t *s = malloc((size_t)(c.seq_length + 1) * sizeof *s);
    for (int64_t i = 0; s && i < n; i++) {
        if (mc_gpt_dataset_sample(ds, MC_SPLIT_TRAIN, i, s, &err)) goto fail;
        for (int64_t j = 0; j <= c.seq_length; j++) printf(j ? " %d" : "%d", s[j]);
        printf("\n");
    }
    free(s);
    mc_gpt_dataset_close(ds);
    mc_gptdata_blend_free(&c.blend);
    return 0;
fail:
    fprintf(stderr, "gpt_samples: %s\n", err.msg);
    return 1;
}
