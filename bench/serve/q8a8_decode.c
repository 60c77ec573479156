/*
 * q8a8_decode.c - the int8 x int8 kernel (mc_k_linear_q8a8_fwd) as one
 * generated token of a GPT-2 124M shape uses it: one row through the 49
 * linears (12 layers of 768 -> 2304, 768 -> 768, 768 -> 3072, 3072 -> 768,
 * then the 768 -> 4096 head), each with its own weights, 85 MB of codes in
 * all, so the weights stream from memory as in decoding (bench/serve/q8a8.c
 * times one shape, its weights in cache). Prints the best and the mean
 * milliseconds a token over TOKENS tokens (the first two not counted) and
 * the codes' bytes per second at the best. MC_CPU_ISA pins a path.
 *
 *   bench/serve/q8a8_decode THREADS [TOKENS]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mc/kern.h"
#include "now.h"


int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, tokens = argc > 2 ? atoi(argv[2]) : 40;
    if (tokens < 3) tokens = 3;
    mc_backend *be;
    mc_error err;
    if (mc_backend_cpu_new(threads, &be, &err)) {
        fprintf(stderr, "q8a8_decode: %s\n", err.msg);
        return 1;
    }
    static const size_t shapes[4][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
    enum { L = 49 };
    uint8_t *P[L];
    float *S[L];
    size_t In[L], Out[L], bytes = 0;
    float *x = malloc(4096 * sizeof(float)), *out = malloc(4096 * sizeof(float));
    for (int i = 0; i < 4096; i++) x[i] = (float)(i % 7) * 0.1f - 0.3f;
    for (int l = 0; l < L; l++) {
        size_t I = l == L - 1 ? 768 : shapes[l % 4][0], O = l == L - 1 ? 4096 : shapes[l % 4][1];
        float *W = malloc(I * O * sizeof(float));
        int8_t *q = malloc(I * O);
        In[l] = I, Out[l] = O, S[l] = malloc(O * sizeof(float));
        for (size_t i = 0; i < I * O; i++) W[i] = (float)((i * 2654435761u) % 251) * 0.001f - 0.12f;
        mc_k_quantize_q8_rows(be, q, S[l], W, O, I);
        P[l] = mc_balloc(be, mc_k_q8a8_packed_bytes(O, I), NULL);
        mc_k_pack_q8a8(be, P[l], q, O, I);
        bytes += I * O;
        free(W), free(q);
    }
    double best = 1e9, sum = 0;
    for (int t = 0; t < tokens; t++) {
        double t0 = now();
        for (int l = 0; l < L; l++)
            mc_k_linear_q8a8_fwd(be, out, x, P[l], S[l], NULL, 1, In[l], Out[l]);
        double d = now() - t0;
        if (t < 2) continue;
        sum += d;
        if (d < best) best = d;
    }
    printf("# %s, threads %d, %zu MiB of codes a token\nbest %.2f ms/token, mean %.2f ms, %.1f GB/s "
           "at the best\n",
           getenv("MC_CPU_ISA") ? getenv("MC_CPU_ISA") : "best path", threads, bytes >> 20,
           best * 1e3, sum / (tokens - 2) * 1e3, (double)bytes / best * 1e-9);
    for (int l = 0; l < L; l++) mc_bfree(be, P[l]), free(S[l]);
    free(x), free(out);
    mc_backend_free(be);
    return 0;
}
