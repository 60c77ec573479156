/*
 * test_kern_qlinear.c - the weight-only int8 linear (kern/cpu/qlinear.c):
 * codes and scales against a float64 re-derivation of the int8 rule
 * (scale = absmax / 127, code = round-half-even(w / scale)), and the
 * product against float64 x . (codes * scale)^T for few rows (the
 * vectorized direct path) and many (the widen-and-GEMM path), with bias and
 * beta = 1. Tolerance 1e-5 normwise: fp32 sums of up to 300 terms.
 */
#include <math.h>
#include <stdio.h>
#include "kern_test.h"

static int check_codes(mc_backend *be, const float *W, size_t R, size_t C, int8_t *q, float *s)
{
    mc_k_quantize_q8_rows(be, q, s, W, R, C);
    int bad = 0;
    for (size_t r = 0; r < R; r++) {
        double amax = 0;
        for (size_t c = 0; c < C; c++) amax = fmax(amax, fabs((double)W[r * C + c]));
        float sc = (float)amax / 127.0f;
        if (s[r] != sc) bad++;
        for (size_t c = 0; c < C; c++) {
            double v = sc > 0 ? nearbyint((double)(W[r * C + c] / sc)) : 0;
            if (q[r * C + c] != (int8_t)v) bad++;
            /* the int8 bound of mc-formats(5): |w - code * scale| <= scale / 2 */
            if (fabs((double)W[r * C + c] - q[r * C + c] * (double)sc) > sc * 0.5000001) bad++;
        }
    }
    return bad;
}

int main(void)
{
    mc_backend *be;
    mc_error err = {0};
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    kt_rng rng = {42};
    const size_t Cin = 300, Cout = 70; /* tails past 16 and 8 lanes */
    float *W = kt_falloc(Cout * Cin), *b = kt_falloc(Cout), *s = kt_falloc(Cout);
    int8_t *q = malloc(Cout * Cin);
    kt_fill(&rng, W, Cout * Cin, -0.5, 0.5);
    kt_fill(&rng, b, Cout, -1, 1);
    for (size_t c = 0; c < Cin; c++) W[3 * Cin + c] = 0; /* an all-zero row: scale 0, codes 0 */
    W[5 * Cin + 7] = 2.0f;                               /* an outlier sets its row's scale */
    TAP_OK(check_codes(be, W, Cout, Cin, q, s) == 0,
           "codes and scales follow the int8 rule and bound");
    TAP_OK(s[3] == 0 && q[3 * Cin + 9] == 0, "an all-zero row has scale 0 and codes 0");
    TAP_OK(q[5 * Cin + 7] == 127, "the row's absmax element is code 127");

    size_t Ns[] = {1, 3, 8, 9, 40};
    for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++) {
        size_t N = Ns[k];
        float *x = kt_falloc(N * Cin), *out = kt_falloc(N * Cout), *out2 = kt_falloc(N * Cout);
        kt_fill(&rng, x, N * Cin, -1, 1);
        double *ref = kt_dalloc(N * Cout), *ref2 = kt_dalloc(N * Cout);
        for (size_t n = 0; n < N; n++)
            for (size_t r = 0; r < Cout; r++) {
                double acc = 0;
                for (size_t c = 0; c < Cin; c++)
                    acc += (double)x[n * Cin + c] * q[r * Cin + c] * (double)s[r];
                ref[n * Cout + r] = acc + b[r];
                ref2[n * Cout + r] = 2 * acc + b[r];
            }
        for (size_t i = 0; i < N * Cout; i++)
            out[i] = NAN; /* beta = 0 must overwrite every element */
        mc_k_linear_q8_fwd(be, out, x, q, s, b, N, Cin, Cout, 0.0f);
        double e = kt_err(out, ref, N * Cout);
        TAP_OK(e < 1e-5, "N=%zu: x . (codes * scale)^T + b within 1e-5 (err %.2e)", N, e);
        /* beta = 1 adds: out already holds x.W^T + b, adding x.W^T (no bias) */
        mc_k_linear_q8_fwd(be, out, x, q, s, NULL, N, Cin, Cout, 1.0f);
        e = kt_err(out, ref2, N * Cout);
        TAP_OK(e < 1e-5, "N=%zu: beta = 1 accumulates (err %.2e)", N, e);
        mc_k_linear_q8_fwd(be, out2, x, q, s, b, N, Cin, Cout, 0.0f);
        mc_k_linear_q8_fwd(be, out, x, q, s, b, N, Cin, Cout, 0.0f);
        TAP_OK(!memcmp(out, out2, N * Cout * sizeof(float)),
               "N=%zu: bit-identical on a second call", N);
        free(x), free(out), free(out2), free(ref), free(ref2);
    }
    free(W), free(b), free(s), free(q);
    mc_backend_free(be);
    return tap_done();
}
