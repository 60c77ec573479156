/*
 * linear_rows.c - what batch invariance costs in the linear layers: the
 * row-invariant mc_k_linear_rows_fwd against mc_k_linear_fwd (OpenBLAS's
 * sgemm; sgemv for one row, 0) and, for int8, mc_k_linear_q8_fwd, on GPT-2
 * 124M's shapes (768 -> 2304, 768 -> 3072, 3072 -> 768 and the 50304-row
 * head), at N rows. Prints ms per call of each and the ratio.
 *
 *   bench/serve/linear_rows THREADS [N...]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mc/kern.h"
#include "now.h"

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    mc_backend *be;
    mc_error err;
    if (mc_backend_cpu_new(threads, &be, &err)) return 1;
    static const size_t shapes[][2] = {{768, 2304}, {768, 3072}, {3072, 768}, {768, 50304}};
    int ns[16], nn = 0;
    for (int i = 2; i < argc && nn < 16; i++) ns[nn++] = atoi(argv[i]);
    if (!nn) ns[nn++] = 1, ns[nn++] = 4, ns[nn++] = 16, ns[nn++] = 64, ns[nn++] = 256;
    printf("threads %d\n%6s %14s %10s %10s %7s %10s %10s %7s\n", threads, "N", "shape", "sgemm",
           "rows", "ratio", "q8", "rows-q8", "ratio");
    for (int k = 0; k < nn; k++)
        for (size_t s = 0; s < 4; s++) {
            size_t N = (size_t)ns[k], I = shapes[s][0], O = shapes[s][1];
            float *x = malloc(N * I * 4), *W = malloc(I * O * 4), *out = malloc(N * O * 4),
                  *sc = malloc(O * 4);
            int8_t *q = malloc(I * O);
            for (size_t i = 0; i < N * I; i++) x[i] = (float)(i % 7) * 0.1f;
            for (size_t i = 0; i < I * O; i++) W[i] = (float)(i % 13) * 0.01f - 0.05f;
            mc_k_quantize_q8_rows(be, q, sc, W, O, I);
            double t[4];
            int reps = N * I * O > 200000000 ? 3 : 10;
            for (int v = 0; v < 4; v++) {
                double best = 1e9;
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    if (v == 0)
                        mc_k_linear_fwd(be, MC_PREC_FP32, out, x, W, NULL, NULL, N, I, O, 0, 0);
                    if (v == 1) mc_k_linear_rows_fwd(be, out, x, W, NULL, NULL, NULL, N, I, O);
                    if (v == 2) mc_k_linear_q8_fwd(be, out, x, q, sc, NULL, N, I, O, 0);
                    if (v == 3) mc_k_linear_rows_fwd(be, out, x, NULL, q, sc, NULL, N, I, O);
                    double d = now() - t0;
                    if (d < best) best = d;
                }
                t[v] = best * 1e3;
            }
            char sh[32];
            snprintf(sh, sizeof sh, "%zux%zu", I, O);
            printf("%6zu %14s %10.3f %10.3f %7.2f %10.3f %10.3f %7.2f\n", N, sh, t[0], t[1],
                   t[1] / t[0], t[2], t[3], t[3] / t[2]);
            free(x), free(W), free(out), free(sc), free(q);
        }
    mc_backend_free(be);
    return 0;
}
