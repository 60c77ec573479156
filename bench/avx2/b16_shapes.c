/*
 * bench/avx2/b16_shapes.c - issue 18: the emulated-bf16 linear layer of
 * the AVX2 path, shape by shape, through the bf16-panel GEMM (b16gemm.c)
 * against the same layer with MC_BF16_PANELS=0 (sgemm on rounded fp32
 * copies), each with its weight prepared as the model prepares it and its
 * activations exact (rounded where they were made, as the model has them).
 * Times the forward product, the d x product and the d W product
 * (mc_k_linear_bwd with the other outputs NULL) of GPT-2 124M's linear layers at B=4, T=1024 and of
 * one LM-head chunk (256 rows, GPT-2's vocabulary), alternating the two backends ROUNDS times;
 * prints the best time of each and sgemm / panels (> 1: the panels faster). Built and run by
 * bench/avx2/b16_shapes.sh.
 *
 *   b16_shapes THREADS ROUNDS
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "mc/kern.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *filled(size_t n, unsigned seed, float scale)
{
    float *p = malloc(n * sizeof *p);
    if (!p) exit(1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * scale;
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: b16_shapes THREADS ROUNDS\n");
        return 2;
    }
    int threads = atoi(argv[1]), rounds = atoi(argv[2]);
    mc_backend *be[2];
    mc_error err = {0};
    for (int k = 0; k < 2; k++) { /* 0: panels, 1: sgemm on rounded copies */
        setenv("MC_BF16_PANELS", k ? "0" : "1", 1);
        if (mc_backend_cpu_new(threads, &be[k], &err)) {
            fprintf(stderr, "b16_shapes: %s\n", err.msg);
            return 1;
        }
    }
    if (!mc_backend_weight_panels(be[0], MC_PREC_BF16)) {
        fprintf(stderr,
                "b16_shapes: this path has no bf16-panel GEMM (native bf16, or baseline)\n");
        return 1;
    }
    const struct {
        const char *name;
        size_t N, I, O;
    } sh[] = {{"qkv", 4096, 768, 2304},
              {"proj", 4096, 768, 768},
              {"fc1", 4096, 768, 3072},
              {"fc2", 4096, 3072, 768},
              {"lm head", 256, 768, 50257}};
    printf("%-8s %6s %6s %6s  %-5s %10s %10s %8s\n", "layer", "N", "I", "O", "prod", "panels ms",
           "sgemm ms", "ratio");
    double tot[2][3] = {{0, 0, 0}, {0, 0, 0}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        size_t N = sh[s].N, I = sh[s].I, O = sh[s].O;
        float *x = filled(N * I, 1, 2.0f), *W = filled(O * I, 2, 0.05f),
              *g = filled(N * O, 3, 1.0f);
        float *y = malloc(N * O * sizeof *y), *dx = calloc(N * I, sizeof *dx),
              *dW = calloc(O * I, sizeof *dW);
        mc_k_round(be[0], x, N * I, MC_PREC_BF16); /* exact, as the flags below say */
        mc_k_round(be[0], g, N * O, MC_PREC_BF16);
        void *Wp[2];
        for (int k = 0; k < 2; k++) {
            Wp[k] = malloc(O * I * mc_backend_weight_bytes(be[k], MC_PREC_BF16));
            mc_k_prepare_weight(be[k], MC_PREC_BF16, Wp[k], W, O * I, I);
        }
        double best[2][3] = {{1e9, 1e9, 1e9}, {1e9, 1e9, 1e9}};
        for (int r = 0; r <= rounds; r++)
            for (int k0 = 0; k0 < 2; k0++) {
                int k = (k0 + r) % 2; /* the order swapped every round */
                double t0 = now();
                mc_k_linear_fwd(be[k], MC_PREC_BF16, y, x, W, Wp[k], NULL, N, I, O, 0.0f,
                                MC_LIN_EXACT_X);
                double t1 = now();
                mc_k_linear_bwd(be[k], MC_PREC_BF16, dx, NULL, NULL, g, x, W, Wp[k], N, I, O,
                                MC_LIN_DX_WRITE | MC_LIN_EXACT_DOUT);
                double t2 = now();
                mc_k_linear_bwd(be[k], MC_PREC_BF16, NULL, dW, NULL, g, x, W, Wp[k], N, I, O,
                                MC_LIN_EXACT_X | MC_LIN_EXACT_DOUT);
                double t3 = now();
                if (r == 0) continue; /* warm-up */
                if (t1 - t0 < best[k][0]) best[k][0] = t1 - t0;
                if (t2 - t1 < best[k][1]) best[k][1] = t2 - t1;
                if (t3 - t2 < best[k][2]) best[k][2] = t3 - t2;
            }
        for (int p = 0; p < 3; p++) {
            printf("%-8s %6zu %6zu %6zu  %-5s %10.2f %10.2f %8.3f\n", sh[s].name, N, I, O,
                   p == 2 ? "dW"
                   : p    ? "dx"
                          : "fwd",
                   1e3 * best[0][p], 1e3 * best[1][p], best[1][p] / best[0][p]);
            tot[0][p] += best[0][p] * (s == 4 ? 16 : 12); /* a step: 12 layers, 16 LM chunks */
            tot[1][p] += best[1][p] * (s == 4 ? 16 : 12);
        }
        free(x), free(W), free(g), free(y), free(dx), free(dW), free(Wp[0]), free(Wp[1]);
    }
    printf("a step's worth (12 layers, 16 LM-head chunks), panels vs sgemm: fwd %.3f s vs %.3f s "
           "(%.3f), dx %.3f s vs %.3f s (%.3f), dW %.3f s vs %.3f s (%.3f); all %.3f s vs %.3f s "
           "(%.3f)\n",
           tot[0][0], tot[1][0], tot[1][0] / tot[0][0], tot[0][1], tot[1][1], tot[1][1] / tot[0][1],
           tot[0][2], tot[1][2], tot[1][2] / tot[0][2], tot[0][0] + tot[0][1] + tot[0][2],
           tot[1][0] + tot[1][1] + tot[1][2],
           (tot[1][0] + tot[1][1] + tot[1][2]) / (tot[0][0] + tot[0][1] + tot[0][2]));
    mc_backend_free(be[0]), mc_backend_free(be[1]);
    return 0;
}
