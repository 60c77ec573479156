/*
 * ckpt_loss.c - mc's mean cross-entropy of a checkpoint on given tokens,
 * for comparing with other implementations (transformers, llm.c) that
 * load the same weights after mc-export.
 *
 *   ckpt_loss CKPT B T < ids
 *
 * stdin: B*T input ids, then B*T target ids (-1: not counted), whitespace
 * separated. Prints "loss N" with the mean loss over counted targets
 * (%.9g) and their number. One process, fp32 GEMMs.
 */
#include <stdio.h>
#include <stdlib.h>

#include "mc/kern.h"
#include "mc/model.h"
#include "mc/train.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: ckpt_loss CKPT B T < ids\n");
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]);
    if (B < 1 || T < 1) {
        fprintf(stderr, "ckpt_loss: bad B or T\n");
        return 2;
    }
    size_t n = (size_t)B * (size_t)T;
    int32_t *ids = malloc(2 * n * sizeof *ids);
    for (size_t i = 0; i < 2 * n; i++) {
        long v;
        if (scanf("%ld", &v) != 1) {
            fprintf(stderr, "ckpt_loss: stdin holds %zu ids, need %zu\n", i, 2 * n);
            return 1;
        }
        ids[i] = (int32_t)v;
    }
    mc_error err = {0};
    mc_backend *be = NULL;
    mc_model *m = NULL;
    double loss = 0;
    int64_t ntok = 0;
    if (mc_backend_cpu_new(1, &be, &err) ||
        mc_train_load_model(argv[1], NULL, be, B, T, MC_PREC_FP32, &m, &err) ||
        mc_model_step(m, ids, ids + n, 0, 1.0f, &loss, &ntok, &err)) {
        fprintf(stderr, "ckpt_loss: %s\n", err.msg);
        return 1;
    }
    printf("%.9g %lld\n", loss, (long long)ntok);
    mc_model_free(m);
    mc_backend_free(be);
    free(ids);
    return 0;
}
