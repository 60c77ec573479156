/*
 * test_kern_linear_rows.c - the row-invariant linear (kern/cpu/linear_rows.c):
 * fp32 and int8 weights against float64 (1e-5 normwise), the documented
 * summation order re-done here in scalar C (bit for bit, so every path
 * gives the same bits), and the batch invariance itself: a row's outputs
 * are the same bits whatever the number of rows and its place among them.
 * bf16 weights: the bits of the fp32 kernel on their widened values, at
 * every batch size.
 */
#include <math.h>
#include <stdio.h>
#include "kern_test.h"

/* the kernel's order, scalar */
static float ref_dot(const float *x, const float *W, const int8_t *Wq, float scale, size_t Cin)
{
    float l[16] = {0};
    size_t k = 0;
    for (; k + 16 <= Cin; k += 16)
        for (int j = 0; j < 16; j++) l[j] += x[k + j] * (Wq ? (float)Wq[k + j] : W[k + j]);
    for (int h = 8; h >= 1; h /= 2)
        for (int j = 0; j < h; j++) l[j] += l[j + h];
    float t = l[0];
    for (; k < Cin; k++) t += x[k] * (Wq ? (float)Wq[k] : W[k]);
    return Wq ? t * scale : t;
}

int main(void)
{
    mc_backend *be;
    mc_error err = {0};
    if (mc_backend_cpu_new(2, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    kt_rng rng = {7};
    const size_t Cin = 300, Cout = 70; /* tails past 16 lanes and the tiles */
    float *W = kt_falloc(Cout * Cin), *b = kt_falloc(Cout), *s = kt_falloc(Cout);
    int8_t *q = malloc(Cout * Cin);
    kt_fill(&rng, W, Cout * Cin, -0.5, 0.5);
    kt_fill(&rng, b, Cout, -1, 1);
    mc_k_quantize_q8_rows(be, q, s, W, Cout, Cin);
    const size_t NMAX = 13;
    float *x = kt_falloc(NMAX * Cin), *out = kt_falloc(NMAX * Cout), *one = kt_falloc(Cout);
    kt_fill(&rng, x, NMAX * Cin, -1, 1);
    double *ref = kt_dalloc(NMAX * Cout);
    for (int q8 = 0; q8 < 2; q8++) {
        const char *kind = q8 ? "int8" : "fp32";
        const int8_t *Wq = q8 ? q : NULL;
        for (size_t n = 0; n < NMAX; n++)
            for (size_t r = 0; r < Cout; r++) {
                double acc = 0;
                for (size_t c = 0; c < Cin; c++)
                    acc += (double)x[n * Cin + c] *
                           (q8 ? q[r * Cin + c] * (double)s[r] : (double)W[r * Cin + c]);
                ref[n * Cout + r] = acc + b[r];
            }
        mc_k_linear_rows_fwd(be, out, x, W, Wq, s, b, NMAX, Cin, Cout);
        double e = kt_err(out, ref, NMAX * Cout);
        TAP_OK(e < 1e-5, "%s: x . W^T + b within 1e-5 of float64 (err %.2e)", kind, e);
        int bad = 0;
        for (size_t n = 0; n < NMAX; n++)
            for (size_t r = 0; r < Cout; r++) {
                float want = ref_dot(x + n * Cin, W + r * Cin, q + r * Cin, s[r], Cin);
                if (!q8) want = ref_dot(x + n * Cin, W + r * Cin, NULL, 0, Cin);
                want += b[r];
                if (memcmp(&want, &out[n * Cout + r], sizeof want)) bad++;
            }
        TAP_OK(bad == 0, "%s: the documented order, bit for bit (%d differ)", kind, bad);
        /* row 5 of x alone, then at every place of every batch size */
        mc_k_linear_rows_fwd(be, one, x + 5 * Cin, W, Wq, s, b, 1, Cin, Cout);
        int varied = 0;
        float *xb = kt_falloc(NMAX * Cin), *ob = kt_falloc(NMAX * Cout);
        for (size_t N = 1; N <= NMAX; N++)
            for (size_t at = 0; at < N; at++) {
                memcpy(xb, x, N * Cin * sizeof(float));
                memcpy(xb + at * Cin, x + 5 * Cin, Cin * sizeof(float));
                mc_k_linear_rows_fwd(be, ob, xb, W, Wq, s, b, N, Cin, Cout);
                if (memcmp(ob + at * Cout, one, Cout * sizeof(float))) varied++;
            }
        TAP_OK(varied == 0, "%s: a row's bits do not depend on the batch (%d of 91 differ)", kind,
               varied);
        free(xb), free(ob);
    }
    /* bf16: W rounded (nearest even, kern.h cast), against the fp32 kernel
     * on the widened values: the same sum of the same products */
    {
        uint16_t *wb = malloc(Cout * Cin * sizeof *wb);
        float *wide = kt_falloc(Cout * Cin), *o2 = kt_falloc(NMAX * Cout);
        mc_k_cast_to_bf16(be, wb, W, Cout * Cin);
        mc_k_cast_from_bf16(be, wide, wb, Cout * Cin);
        int differ = 0, same_as_fp32 = 1;
        for (size_t N = 1; N <= NMAX; N++) {
            mc_k_linear_rows_bf16_fwd(be, out, x, wb, b, N, Cin, Cout);
            mc_k_linear_rows_fwd(be, o2, x, wide, NULL, NULL, b, N, Cin, Cout);
            differ += memcmp(out, o2, N * Cout * sizeof(float)) != 0;
        }
        TAP_OK(differ == 0,
               "bf16: the bits of the fp32 kernel on the widened weights at 1..13 rows (%d "
               "differ)",
               differ);
        mc_k_linear_rows_fwd(be, o2, x, W, NULL, NULL, b, NMAX, Cin, Cout);
        same_as_fp32 = !memcmp(out, o2, NMAX * Cout * sizeof(float));
        TAP_OK(!same_as_fp32, "bf16: the weights are rounded (results differ from fp32's)");
        free(wb), free(wide), free(o2);
    }
    free(W), free(b), free(s), free(q), free(x), free(out), free(one), free(ref);
    mc_backend_free(be);
    return tap_done();
}
