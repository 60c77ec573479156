/*
 * q8a8.c - the int8 x int8 row-invariant linear (mc_k_linear_q8a8_fwd,
 * mc-serve's and mc-eval's int8 kernel) against the kernels it replaced:
 * the row-invariant kernel on int8 codes widened to fp32
 * (mc_k_linear_rows_fwd with Wq) and mc-eval's former weight-only int8
 * kernel (mc_k_linear_q8_fwd: fp32 activations, sgemm past 8 rows), on
 * the linear shapes of bench/serve/vs_llama.sh's GPT-2 124M model (768 ->
 * 2304, 768 -> 3072, 3072 -> 768 and the 4096-token head), at N rows.
 * Prints the best of a few calls as GOP/s (2 N Cin Cout operations) and the
 * speed-up over the widening row kernel.
 *
 *   bench/serve/q8a8 THREADS [N...]
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
    static const size_t shapes[][2] = {{768, 2304}, {768, 3072}, {3072, 768}, {768, 4096}};
    int ns[16], nn = 0;
    for (int i = 2; i < argc && nn < 16; i++) ns[nn++] = atoi(argv[i]);
    if (!nn) ns[nn++] = 1, ns[nn++] = 4, ns[nn++] = 16, ns[nn++] = 64;
    printf("threads %d, GOP/s (best of several calls)\n%6s %12s %12s %12s %12s %8s\n", threads, "N",
           "shape", "q8 (eval)", "rows-q8", "q8a8", "speedup");
    for (int k = 0; k < nn; k++)
        for (size_t s = 0; s < 4; s++) {
            size_t N = (size_t)ns[k], I = shapes[s][0], O = shapes[s][1];
            float *x = malloc(N * I * 4), *W = malloc(I * O * 4), *out = malloc(N * O * 4),
                  *sc = malloc(O * 4);
            int8_t *q = malloc(I * O);
            uint8_t *p = mc_balloc(be, mc_k_q8a8_packed_bytes(O, I), NULL);
            for (size_t i = 0; i < N * I; i++) x[i] = (float)(i % 7) * 0.1f - 0.3f;
            for (size_t i = 0; i < I * O; i++) W[i] = (float)(i % 13) * 0.01f - 0.05f;
            mc_k_quantize_q8_rows(be, q, sc, W, O, I);
            mc_k_pack_q8a8(be, p, q, O, I);
            double t[3];
            int reps = N >= 16 ? 5 : 20;
            for (int v = 0; v < 3; v++) {
                double best = 1e9;
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    if (v == 0) mc_k_linear_q8_fwd(be, out, x, q, sc, NULL, N, I, O, 0);
                    if (v == 1) mc_k_linear_rows_fwd(be, out, x, NULL, q, sc, NULL, N, I, O);
                    if (v == 2) mc_k_linear_q8a8_fwd(be, out, x, p, sc, NULL, N, I, O);
                    double d = now() - t0;
                    if (d < best) best = d;
                }
                t[v] = 2.0 * (double)N * (double)I * (double)O / best * 1e-9;
            }
            char sh[32];
            snprintf(sh, sizeof sh, "%zux%zu", I, O);
            printf("%6zu %12s %12.1f %12.1f %12.1f %7.2fx\n", N, sh, t[0], t[1], t[2], t[2] / t[1]);
            free(x), free(W), free(out), free(sc), free(q);
            mc_bfree(be, p);
        }
    mc_backend_free(be);
    return 0;
}
