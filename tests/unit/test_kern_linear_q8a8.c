/*
 * test_kern_linear_q8a8.c - the int8 x int8 row-invariant linear
 * (kern/cpu/linear_q8a8.c, kern_ops.def linear_q8a8_fwd):
 *   - against float64 on the same quantized math (the activation blocks
 *     quantized here by the documented rule, the block sums exact in
 *     int64): 1e-6 relative to the sum of the terms' magnitudes;
 *   - the documented float order re-done here (fma of each block in
 *     order, times the row scale, plus the bias): bit for bit;
 *   - against the fp32 product x . (Wq scale)^T within the bound of the
 *     activations' rounding (half a code of each block, times |w|);
 *   - batch invariance: a row alone and at every place of batches of 1..17
 *     rows (and 70, past a 64-row work chunk), bit for bit;
 *   - the thread count (1, 2, 3) and every path this CPU has (MC_CPU_ISA
 *     baseline, avx2, avx512) change no bit;
 *   - a zero row gives the bias; a row holding a NaN or an infinity gives
 *     NaNs and leaves the other rows' bits alone.
 * Shapes with tails: Cin not a multiple of 32, Cout not of 16.
 */
#include <math.h>
#include <stdio.h>
#include "kern_test.h"

#define QK 32

/* the documented quantization of one row: codes, block scales */
static void ref_quant(const float *x, size_t Cin, int32_t *q, float *d)
{
    size_t nb = (Cin + QK - 1) / QK;
    for (size_t b = 0; b < nb; b++) {
        float amax = 0;
        int finite = 1;
        for (size_t k = b * QK; k < (b + 1) * QK && k < Cin; k++) {
            amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
            finite &= isfinite(x[k]) != 0;
        }
        d[b] = !finite ? NAN : amax / 127.0f;
        float inv = finite && amax > 0 ? 127.0f / amax : 0.0f;
        for (size_t k = b * QK; k < (b + 1) * QK; k++)
            q[k] = k < Cin && inv != 0.0f ? (int32_t)nearbyintf(x[k] * inv) : 0;
    }
}

typedef struct {
    size_t Cin, Cout;
    const int8_t *Wq;
    const float *s, *b;
} shape;

/* out[n, o] three ways: the documented float order (bits), float64 of the
 * same exact block sums, and the bound of its distance to fp32 */
static void ref_row(const shape *sh, const float *x, float *bits, double *f64, double *mag,
                    double *bound)
{
    size_t Cin = sh->Cin, nb = (Cin + QK - 1) / QK;
    int32_t q[4096];
    float d[128];
    ref_quant(x, Cin, q, d);
    for (size_t o = 0; o < sh->Cout; o++) {
        float acc = 0;
        double a64 = 0, m = 0, bd = 0;
        for (size_t b = 0; b < nb; b++) {
            int64_t s = 0;
            double wabs = 0;
            for (size_t k = b * QK; k < (b + 1) * QK && k < Cin; k++) {
                s += (int64_t)q[k] * sh->Wq[o * Cin + k];
                wabs += fabs((double)sh->Wq[o * Cin + k]);
            }
            acc = fmaf(d[b], (float)s, acc);
            a64 += (double)d[b] * (double)s;
            m += fabs((double)d[b] * (double)s);
            bd += 0.5 * (double)d[b] * wabs * 1.0001;
        }
        float t = acc * sh->s[o];
        if (sh->b) t += sh->b[o];
        bits[o] = t;
        f64[o] = a64 * sh->s[o] + (sh->b ? sh->b[o] : 0.0);
        mag[o] = m * fabs((double)sh->s[o]) + (sh->b ? fabs((double)sh->b[o]) : 0.0);
        bound[o] = bd * fabs((double)sh->s[o]);
    }
}

static mc_backend *backend_on(const char *path, int threads)
{
    const char *old = getenv("MC_CPU_ISA");
    char *saved = old ? strdup(old) : NULL;
    if (path) setenv("MC_CPU_ISA", path, 1);
    mc_backend *be = NULL;
    mc_error err;
    if (mc_backend_cpu_new(threads, &be, &err) != MC_OK) be = NULL; /* the CPU lacks it */
    if (saved)
        setenv("MC_CPU_ISA", saved, 1);
    else
        unsetenv("MC_CPU_ISA");
    free(saved);
    return be;
}

static void run_shape(mc_backend *be, size_t Cin, size_t Cout, int bias, kt_rng *rng)
{
    const size_t NMAX = 70;
    float *W = kt_falloc(Cout * Cin), *b = kt_falloc(Cout), *s = kt_falloc(Cout);
    int8_t *Wq = malloc(Cout * Cin);
    kt_fill(rng, W, Cout * Cin, -0.5, 0.5);
    kt_fill(rng, b, Cout, -1, 1);
    mc_k_quantize_q8_rows(be, Wq, s, W, Cout, Cin);
    uint8_t *Wp = mc_balloc(be, mc_k_q8a8_packed_bytes(Cout, Cin), NULL);
    mc_k_pack_q8a8(be, Wp, Wq, Cout, Cin);
    shape sh = {Cin, Cout, Wq, s, bias ? b : NULL};
    const float *bb = sh.b;
    char what[64];
    snprintf(what, sizeof what, "%zux%zu%s", Cout, Cin, bias ? " +b" : "");

    float *x = kt_falloc(NMAX * Cin), *out = kt_falloc(NMAX * Cout);
    kt_fill(rng, x, NMAX * Cin, -1, 1);
    /* row 1 has outliers (one block's scale set by one element), row 2 is
     * zero, row 3 spans magnitudes */
    x[1 * Cin + 3] = 40.0f, x[1 * Cin + Cin - 1] = -25.0f;
    memset(x + 2 * Cin, 0, Cin * sizeof(float));
    for (size_t k = 0; k < Cin; k++) x[3 * Cin + k] *= ldexpf(1.0f, (int)(k % 20) - 10);

    float *bits = kt_falloc(Cout);
    double *f64 = kt_dalloc(Cout), *mag = kt_dalloc(Cout), *bound = kt_dalloc(Cout);
    mc_k_linear_q8a8_fwd(be, out, x, Wp, s, bb, NMAX, Cin, Cout);
    int nbits = 0;
    double worst64 = 0, worst32 = 0;
    int over32 = 0;
    for (size_t n = 0; n < NMAX; n++) {
        ref_row(&sh, x + n * Cin, bits, f64, mag, bound);
        for (size_t o = 0; o < Cout; o++) {
            float got = out[n * Cout + o];
            nbits += memcmp(&got, &bits[o], sizeof got) != 0;
            double e = fabs(got - f64[o]) / (mag[o] > 0 ? mag[o] : 1.0);
            worst64 = e > worst64 ? e : worst64;
            double fp = bb ? bb[o] : 0.0; /* the fp32 product on the dequantized weights */
            for (size_t k = 0; k < Cin; k++) fp += (double)x[n * Cin + k] * Wq[o * Cin + k] * s[o];
            double e32 = fabs(got - fp);
            if (e32 > bound[o] + 1e-6 * mag[o] + 1e-7) over32++;
            worst32 = e32 / (bound[o] + 1e-30) > worst32 ? e32 / (bound[o] + 1e-30) : worst32;
        }
    }
    TAP_OK(worst64 < 1e-6, "%s: the exact quantized math in float64 within 1e-6 relative (%.2e)",
           what, worst64);
    TAP_OK(nbits == 0, "%s: the documented order, bit for bit (%d of %zu differ)", what, nbits,
           NMAX * Cout);
    TAP_OK(over32 == 0,
           "%s: within the activations' rounding bound of the fp32 product (%d over; worst %.2f "
           "of the bound)",
           what, over32, worst32);
    /* a zero row: the bias (or 0) exactly */
    int zero_ok = 1;
    for (size_t o = 0; o < Cout; o++) zero_ok &= out[2 * Cout + o] == (bb ? bb[o] : 0.0f);
    TAP_OK(zero_ok, "%s: a zero row gives the bias exactly", what);

    /* batch invariance: rows 1 and 5 alone, then at every place of every batch size */
    float *xb = kt_falloc(NMAX * Cin), *ob = kt_falloc(NMAX * Cout), *one = kt_falloc(Cout);
    int varied = 0, tried = 0;
    for (int which = 1; which <= 5; which += 4) {
        mc_k_linear_q8a8_fwd(be, one, x + which * Cin, Wp, s, bb, 1, Cin, Cout);
        for (size_t N = 1; N <= 17; N++)
            for (size_t at = 0; at < N; at++) {
                memcpy(xb, x, N * Cin * sizeof(float));
                memcpy(xb + at * Cin, x + which * Cin, Cin * sizeof(float));
                mc_k_linear_q8a8_fwd(be, ob, xb, Wp, s, bb, N, Cin, Cout);
                varied += memcmp(ob + at * Cout, one, Cout * sizeof(float)) != 0;
                tried++;
            }
        /* and in a batch of 70, at place 66 (past the first 64-row chunk) */
        memcpy(xb, x, NMAX * Cin * sizeof(float));
        memcpy(xb + 66 * Cin, x + which * Cin, Cin * sizeof(float));
        mc_k_linear_q8a8_fwd(be, ob, xb, Wp, s, bb, NMAX, Cin, Cout);
        varied += memcmp(ob + 66 * Cout, one, Cout * sizeof(float)) != 0;
        tried++;
    }
    TAP_OK(varied == 0, "%s: a row's bits do not depend on the batch (%d of %d differ)", what,
           varied, tried);

    /* a NaN in one row, an infinity in another: NaN rows, the others unchanged */
    memcpy(xb, x, NMAX * Cin * sizeof(float));
    xb[7 * Cin + Cin / 2] = NAN;
    xb[9 * Cin] = INFINITY;
    mc_k_linear_q8a8_fwd(be, ob, xb, Wp, s, bb, NMAX, Cin, Cout);
    int nan_ok = 1, others = 0;
    for (size_t o = 0; o < Cout; o++) nan_ok &= isnan(ob[7 * Cout + o]) && isnan(ob[9 * Cout + o]);
    for (size_t n = 0; n < NMAX; n++)
        if (n != 7 && n != 9) others += memcmp(ob + n * Cout, out + n * Cout, Cout * 4) != 0;
    TAP_OK(nan_ok && others == 0,
           "%s: rows with a NaN or an infinity give NaN, the other rows their bits (%d differ)",
           what, others);

    /* threads and paths */
    int tdiff = 0;
    for (int t = 1; t <= 3; t++) {
        mc_backend *bt = backend_on(NULL, t);
        for (size_t N = 1; N <= NMAX; N += 23) {
            mc_k_linear_q8a8_fwd(bt, ob, x, Wp, s, bb, N, Cin, Cout);
            tdiff += memcmp(ob, out, N * Cout * sizeof(float)) != 0;
        }
        mc_backend_free(bt);
    }
    TAP_OK(tdiff == 0, "%s: 1, 2 and 3 threads give the same bits (%d differ)", what, tdiff);
    const char *paths[] = {"baseline", "avx2", "avx512"};
    int pdiff = 0, ran = 0;
    for (int i = 0; i < 3; i++) {
        mc_backend *bp = backend_on(paths[i], 2);
        if (!bp) continue;
        for (size_t N = 1; N <= NMAX; N += 23) {
            mc_k_linear_q8a8_fwd(bp, ob, x, Wp, s, bb, N, Cin, Cout);
            pdiff += memcmp(ob, out, N * Cout * sizeof(float)) != 0;
        }
        mc_backend_free(bp);
        ran++;
    }
    TAP_OK(pdiff == 0 && ran >= 1, "%s: the same bits on the %d paths this CPU has (%d differ)",
           what, ran, pdiff);

    free(W), free(b), free(s), free(Wq), free(x), free(out), free(bits), free(f64), free(mag);
    free(bound), free(xb), free(ob), free(one);
    mc_bfree(be, Wp);
}

int main(void)
{
    mc_backend *be = kt_backend(2);
    kt_rng rng = {11};
    run_shape(be, 300, 70, 1, &rng);  /* tails: 300 = 9 x 32 + 12, 70 = 4 x 16 + 6 */
    run_shape(be, 256, 200, 0, &rng); /* whole blocks, 13 panels, several work items */
    run_shape(be, 5, 3, 1, &rng);     /* smaller than a block and a panel */
    /* the packed layout: code + 128 at 64 j + 4 o + t of its panel, zero codes padded */
    {
        int8_t Wq[17 * 5];
        for (int i = 0; i < 17 * 5; i++) Wq[i] = (int8_t)(i % 255 - 127);
        size_t bytes = mc_k_q8a8_packed_bytes(17, 5);
        uint8_t *Wp = mc_balloc(be, bytes, NULL);
        mc_k_pack_q8a8(be, Wp, Wq, 17, 5);
        int ok = bytes == 2 * 16 * 32;
        for (size_t r = 0; r < 32; r++)
            for (size_t k = 0; k < 32; k++) {
                int code = r < 17 && k < 5 ? Wq[r * 5 + k] : 0;
                ok &= Wp[(r / 16) * 16 * 32 + 64 * (k / 4) + 4 * (r % 16) + k % 4] == code + 128;
            }
        TAP_OK(ok, "packed layout: 2 panels of 16 x 32, codes + 128 in groups of 4");
        mc_bfree(be, Wp);
    }
    mc_backend_free(be);
    return tap_done();
}
