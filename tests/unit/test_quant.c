/*
 * test_quant.c - the checkpoint quantizations (lib/ckpt/quant.c) against
 * their documented error bounds on random data with zero rows, tiny rows,
 * single spikes and a group tail; E4M3FN against a brute-force nearest
 * search over all 256 codes (ties to the even code); int4 packing; the
 * refusal of NaN and infinities; and quantized tensors written through
 * mc_ckpt_write_whole (one file, and shards split at columns that cut
 * int4 groups) read back by mc_ckpt_read_tensor as exactly the
 * dequantized values, whole and as blocks.
 *
 * Bounds (mc-formats(5)), with the stored fp32 scale s and the fp32
 * dequantized value d:
 *   int8, int4  |x - d| <= s/2 + 2^-23 |x|
 *   fp8         |x - d| <= max(|x|/16, s/1024) + 2^-23 |x|
 * (the last term covers the fp32 rounding of the product q * s; the test
 * adds a relative 2^-20 of slack to the first, for the double -> fp32
 * rounding of x / s, which can only matter at exact ties).
 */
#include "mc/quant.h"

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc/ckpt.h"
#include "mc/model.h"
#include "tap.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float nrand(void)
{
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* rows x cols with a different scale per row, a zero row, a row of tiny
 * values, a row with one spike, and exact zeros sprinkled in. */
static void fill(float *x, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) {
        double mag = pow(10.0, -3 + 5 * urand());
        for (int64_t c = 0; c < cols; c++) {
            float v = (float)(mag * nrand());
            if (urand() < 0.05) v = 0.0f;
            if (r == 1) v = 0.0f;
            if (r == 2) v = (float)(1e-30 * nrand());
            if (r == 3) v = c == 7 ? 1000.0f : 1e-3f * nrand();
            x[r * cols + c] = v;
        }
    }
}

static int nearest_fp8(double y)
{
    /* brute force: the finite code nearest to y, ties to the even code */
    int best = -1;
    double bd = INFINITY;
    for (int b = 0; b < 256; b++) {
        float v = mc_fp8_e4m3_to_f32((uint8_t)b);
        if (isnan(v)) continue;
        double d = fabs((double)v - y);
        if (d < bd || (d == bd && !(b & 1) && (!!signbit(v) == !!signbit(y)))) {
            bd = d;
            best = b;
        }
    }
    return best;
}

static void test_fp8_codes(void)
{
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        float v = mc_fp8_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            bad += !isnan(v);
            continue;
        }
        bad += mc_fp8_e4m3_from_f32(v) != b;
    }
    TAP_OK(bad == 0, "fp8: every code decodes and re-encodes to itself (NaN at 0x7f/0xff)");
    TAP_OK(mc_fp8_e4m3_to_f32(0x7e) == 448.0f && mc_fp8_e4m3_to_f32(0x38) == 1.0f &&
               mc_fp8_e4m3_to_f32(0x01) == 0x1p-9f && mc_fp8_e4m3_to_f32(0x08) == 0x1p-6f,
           "fp8: 0x7e = 448, 0x38 = 1, 0x01 = 2^-9, 0x08 = 2^-6");
    TAP_OK(mc_fp8_e4m3_from_f32(500.0f) == 0x7e && mc_fp8_e4m3_from_f32(-1e30f) == 0xfe &&
               mc_fp8_e4m3_from_f32(1.0625f) == 0x38 && mc_fp8_e4m3_from_f32(1.1875f) == 0x3a &&
               mc_fp8_e4m3_from_f32(0x1p-10f) == 0x00 && mc_fp8_e4m3_from_f32(3 * 0x1p-10f) == 0x02,
           "fp8: saturation at 448, ties to even (normal and subnormal)");
    int mism = 0;
    for (int i = 0; i < 20000; i++) {
        double y = (urand() * 2 - 1) * pow(2.0, -12 + 21 * urand());
        if (fabs(y) > 448) continue;
        float f = (float)y;
        mism += mc_fp8_e4m3_from_f32(f) != nearest_fp8((double)f);
    }
    TAP_OK(mism == 0, "fp8: 20000 random values encode to the nearest code (%d differ)", mism);
}

static void test_int8(void)
{
    enum { R = 37, C = 300 };
    static float x[R * C], s[R];
    static int8_t q[R * C];
    fill(x, R, C);
    TAP_OK(mc_quant_int8(x, R, C, q, s) == -1, "int8: finite input accepted");
    double worst = 0;
    int over = 0, range = 0, peak = 0;
    for (int r = 0; r < R; r++) {
        int m = 0;
        for (int c = 0; c < C; c++) {
            float xv = x[r * C + c], d = (float)q[r * C + c] * s[r];
            double e = fabs((double)xv - d),
                   bound = 0.5 * s[r] * (1 + 0x1p-20) + 0x1p-23 * fabs(xv);
            if (e > bound) over++;
            if (s[r] > 0 && e / s[r] > worst) worst = e / s[r];
            range += q[r * C + c] == -128;
            if (abs(q[r * C + c]) > m) m = abs(q[r * C + c]);
        }
        peak += r != 1 && m != 127;
    }
    TAP_DIAG("int8: worst |x - d| / scale = %.6f (bound 0.5)", worst);
    TAP_OK(over == 0 && range == 0, "int8: every element within scale/2, levels in [-127, 127]");
    TAP_OK(peak == 0, "int8: each nonzero row uses level +-127 (scale = absmax / 127)");
    int zero = s[1] == 0.0f;
    for (int c = 0; c < C; c++) zero &= q[C + c] == 0;
    TAP_OK(zero, "int8: a zero row has scale 0 and dequantizes to exact zeros");
    TAP_OK(q[3 * C + 7] == 127 && s[3] == (float)(1000.0 / 127),
           "int8: a spike row: scale 1000/127");
    x[3 * C + 5] = NAN;
    TAP_OK(mc_quant_int8(x, R, C, q, s) == 3 * C + 5, "int8: NaN refused, its index reported");
}

static void test_fp8(void)
{
    enum { N = 5000 };
    static float x[N];
    static uint8_t q[N];
    fill(x, 10, N / 10);
    float s;
    TAP_OK(mc_quant_fp8(x, N, q, &s) == -1, "fp8: finite input accepted");
    float am = 0;
    for (int i = 0; i < N; i++) am = fmaxf(am, fabsf(x[i]));
    int over = 0;
    double worst = 0;
    for (int i = 0; i < N; i++) {
        float d = mc_fp8_e4m3_to_f32(q[i]) * s;
        double e = fabs((double)x[i] - d);
        double b = fmax(fabs(x[i]) / 16, s / 1024.0) * (1 + 0x1p-20) + 0x1p-23 * fabs(x[i]);
        over += e > b;
        if (fabs(x[i]) > 64 * s && e / fabs(x[i]) > worst) worst = e / fabs(x[i]);
    }
    TAP_DIAG("fp8: worst relative error of normal values %.5f (bound 1/16)", worst);
    TAP_OK(over == 0 && s == (float)(am / 448.0),
           "fp8: every element within max(|x|/16, scale/1024)");
    float z[4] = {0, 0, 0, 0};
    TAP_OK(mc_quant_fp8(z, 4, q, &s) == -1 && s == 0 && !q[0] && !q[3],
           "fp8: a zero tensor: scale 0");
    x[17] = INFINITY;
    TAP_OK(mc_quant_fp8(x, N, q, &s) == 17, "fp8: infinity refused, its index reported");
}

static void test_int4(void)
{
    enum { R = 9, C = 100, G = 32 };
    static float x[R * C];
    static int8_t q[R * C];
    static uint8_t packed[R * ((C + 1) / 2)];
    int64_t ng = mc_quant_int4_groups(C, G);
    float *s = malloc((size_t)(R * ng) * sizeof *s);
    fill(x, R, C);
    TAP_OK(ng == 4 && mc_quant_int4(x, R, C, G, q, s) == -1, "int4: 4 groups of a 100-column row");
    int over = 0, range = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float sc = s[r * ng + c / G], d = (float)q[r * C + c] * sc;
            double e = fabs((double)x[r * C + c] - d);
            over += e > 0.5 * sc * (1 + 0x1p-20) + 0x1p-23 * fabs(x[r * C + c]);
            range += q[r * C + c] < -7 || q[r * C + c] > 7;
        }
    TAP_OK(over == 0 && range == 0,
           "int4: every element within its group's scale/2, levels in [-7, 7]");
    mc_int4_pack(q, R, C, packed);
    int same = 1;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            same &= mc_int4_get(packed + r * ((C + 1) / 2), c) == q[r * C + c];
    int8_t odd[3] = {-7, 5, -1};
    uint8_t pk[2];
    mc_int4_pack(odd, 1, 3, pk);
    TAP_OK(same && pk[0] == 0x59 && pk[1] == 0x0f, "int4: packing (low nibble first) round-trips");
    x[2 * C + 99] = -NAN;
    TAP_OK(mc_quant_int4(x, R, C, G, q, s) == 2 * C + 99, "int4: NaN in a group tail refused");
    free(s);
}

static int rm_cb(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb, (void)f, (void)w;
    return remove(p);
}

/* Dequantize the global tensor as the reader must. */
static void dequant(mc_ckpt_dtype dt, const float *x, int64_t R, int64_t C, int64_t G, float *out)
{
    int8_t *q = malloc((size_t)(R * C));
    float *s = malloc((size_t)(R * (C / 1 + 1)) * sizeof *s);
    if (dt == MC_CKPT_INT8) {
        mc_quant_int8(x, R, C, q, s);
        for (int64_t i = 0; i < R * C; i++) out[i] = (float)q[i] * s[i / C];
    } else if (dt == MC_CKPT_FP8_E4M3) {
        mc_quant_fp8(x, R * C, (uint8_t *)q, s);
        for (int64_t i = 0; i < R * C; i++) out[i] = mc_fp8_e4m3_to_f32((uint8_t)q[i]) * s[0];
    } else {
        int64_t ng = mc_quant_int4_groups(C, G);
        mc_quant_int4(x, R, C, G, q, s);
        for (int64_t i = 0; i < R * C; i++) out[i] = (float)q[i] * s[(i / C) * ng + (i % C) / G];
    }
    free(q);
    free(s);
}

static void test_ckpt(void)
{
    char root[] = "/tmp/mc-test-quant-XXXXXX";
    if (!mkdtemp(root)) {
        TAP_SKIP("no temporary directory");
        return;
    }
    enum { R = 64, C = 64 };
    static float x[R * C], y[R * C], ref[R * C];
    fill(x, R, C);
    const char *names[3] = {"model/a.weight", "model/b.weight", "model/c.weight"};
    mc_ckpt_dtype dts[3] = {MC_CKPT_INT8, MC_CKPT_FP8_E4M3, MC_CKPT_INT4};
    mc_error err = {0};
    char dir[512];

    /* one file */
    snprintf(dir, sizeof dir, "%s/one", root);
    mc_ckpt_writer *w = NULL;
    int ok = mc_ckpt_writer_begin(dir, 5, &w, &err) == MC_OK;
    for (int k = 0; k < 3 && ok; k++)
        ok = mc_ckpt_write_whole(w, names[k], R, C, x, dts[k], 24, &err) == MC_OK;
    ok = ok && mc_ckpt_write_whole(w, "model/v", R, 0, x, MC_CKPT_INT8, 0, &err) == MC_ERR_USAGE;
    ok = ok && mc_ckpt_write_whole(w, "model/norm", R, 0, x, MC_CKPT_BFLOAT16, 0, &err) == MC_OK;
    ok = ok && mc_ckpt_writer_commit(w, &err) == MC_OK;
    TAP_OK(ok, "ckpt: int8, fp8 and int4 (group 24) tensors written whole; a 1-D one refused: %s",
           err.msg);
    mc_ckpt_reader *r = NULL;
    ok = mc_ckpt_open(dir, &r, &err) == MC_OK;
    for (int k = 0; k < 3 && ok; k++) {
        mc_ckpt_dtype dt;
        int64_t rr, cc;
        dequant(dts[k], x, R, C, 24, ref);
        ok = mc_ckpt_tensor_info(r, names[k], &rr, &cc, &dt, &err) == MC_OK && rr == R && cc == C &&
             dt == dts[k] && mc_ckpt_read_tensor(r, names[k], R, C, 0, 0, R, C, y, &err) == MC_OK &&
             !memcmp(y, ref, sizeof y);
        /* a block that starts inside a group and at an odd column */
        ok = ok && mc_ckpt_read_tensor(r, names[k], R, C, 5, 13, 7, 30, y, &err) == MC_OK;
        for (int i = 0; i < 7 && ok; i++)
            ok = !memcmp(y + i * 30, ref + (5 + i) * C + 13, 30 * sizeof *y);
        TAP_OK(ok, "ckpt: %s read back dequantized, whole and as the block [5,12)x[13,43): %s",
               mc_ckpt_dtype_name(dts[k]), err.msg);
    }
    mc_ckpt_close(r);

    /* shards: tiny-gpt's linear_proj (row-parallel) over 4 ranks cuts the
     * 24-column int4 groups at columns 16, 32, 48 */
    mc_model_config c;
    mc_model_config_init(&c);
    ok = mc_model_preset("tiny-gpt", &c, &err) == MC_OK;
    c.vocab_size = 100;
    snprintf(dir, sizeof dir, "%s/sharded", root);
    const char *proj = "model/decoder.layers.1.self_attention.linear_proj.weight";
    const char *qkv = "model/decoder.layers.0.self_attention.linear_qkv.weight";
    static float big[192 * C], bigy[192 * C], bigref[192 * C];
    fill(big, 192, C);
    ok = ok && mc_ckpt_writer_begin_sharded(dir, 5, 4, 2, &c, &w, &err) == MC_OK;
    ok = ok && mc_ckpt_write_whole(w, proj, R, C, x, MC_CKPT_INT4, 24, &err) == MC_OK;
    ok = ok && mc_ckpt_write_whole(w, qkv, 192, C, big, MC_CKPT_INT8, 0, &err) == MC_OK;
    ok = ok && mc_ckpt_write_whole(w, "model/decoder.final_layernorm.weight", R, 0, x,
                                   MC_CKPT_FLOAT32, 0, &err) == MC_OK;
    ok = ok && mc_ckpt_writer_commit(w, &err) == MC_OK;
    TAP_OK(ok, "shards: TP=4 x PP=2 checkpoint written: %s", err.msg);
    char f[600];
    snprintf(f, sizeof f, "%s/iter_0000005/mp_rank_03_001.h5", dir);
    int files = access(f, F_OK) == 0;
    snprintf(f, sizeof f, "%s/iter_0000005/model.h5", dir);
    files &= access(f, F_OK) != 0;
    TAP_OK(files, "shards: mp_rank_03_001.h5 exists, model.h5 does not");
    ok = mc_ckpt_open(dir, &r, &err) == MC_OK;
    int tp = 0, pp = 0;
    if (ok) mc_ckpt_shards(r, &tp, &pp);
    dequant(MC_CKPT_INT4, x, R, C, 24, ref);
    dequant(MC_CKPT_INT8, big, 192, C, 0, bigref);
    ok = ok && tp == 4 && pp == 2 &&
         mc_ckpt_read_tensor(r, proj, R, C, 0, 0, R, C, y, &err) == MC_OK &&
         !memcmp(y, ref, sizeof y) &&
         mc_ckpt_read_tensor(r, qkv, 192, C, 0, 0, 192, C, bigy, &err) == MC_OK &&
         !memcmp(bigy, bigref, sizeof bigy);
    TAP_OK(ok, "shards: int4 split across groups and int8 by rows read back whole, as one file: %s",
           err.msg);
    ok = ok && mc_ckpt_read_tensor(r, proj, R, C, 3, 10, 20, 41, y, &err) == MC_OK;
    for (int i = 0; i < 20 && ok; i++)
        ok = !memcmp(y + i * 41, ref + (3 + i) * C + 10, 41 * sizeof *y);
    ok = ok &&
         mc_ckpt_read_tensor(r, "model/decoder.final_layernorm.weight", R, 0, 10, 0, 20, 0, y,
                             &err) == MC_OK &&
         !memcmp(y, x + 10, 20 * sizeof *y);
    TAP_OK(ok, "shards: a block spanning three shards, and a slice of a replicated vector: %s",
           err.msg);
    char **names_out = NULL;
    size_t n = 0;
    ok = ok && mc_ckpt_list(r, "model", &names_out, &n, &err) == MC_OK && n == 3 &&
         !strcmp(names_out[0], "decoder.final_layernorm.weight");
    free(names_out);
    TAP_OK(ok, "shards: mc_ckpt_list gives the union (%zu tensors)", n);
    mc_ckpt_close(r);
    snprintf(dir, sizeof dir, "%s/bad", root);
    c.num_layers = 3;
    TAP_OK(mc_ckpt_writer_begin_sharded(dir, 1, 1, 2, &c, &w, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "(3)"),
           "shards: 3 layers on 2 stages refused: %s", err.msg);
    nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
    test_fp8_codes();
    test_int8();
    test_fp8();
    test_int4();
    test_ckpt();
    return tap_done();
}
