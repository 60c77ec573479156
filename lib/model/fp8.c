/*
 * fp8.c - FP8 training of the transformer layers' dense linears (Megatron's
 * --fp8-format with Transformer Engine's delayed scaling), emulated exactly
 * on the CPU backend: each GEMM operand (the input x, the weight W, the
 * output gradient dy) is scaled by its operand's scale s, rounded to the
 * FP8 grid (E4M3; E5M2 for dy with hybrid) with saturation, and the GEMM
 * runs on those values in fp32, where their products are exact; the
 * result is multiplied by 1 / (s_a s_b), as an FP8 tensor-core GEMM with
 * fp32 accumulation and scale factors gives it. The bias and its gradient
 * stay in full precision. Scales come from the amax of earlier steps: each
 * use records max |operand| (before scaling) for this step, in backend
 * memory (mc_k_amax_into); mc_model_fp8_update, after the step, takes the maximum over the stage's
 * ranks (so any grid sees the values one process would), pushes it into the
 * operand's history and sets s = (fp8 max / amax) / 2^margin from the
 * history's newest (most_recent) or largest (max) entry; a step with amax
 * 0 or not finite keeps the scale. Scales start at 1. The output layer,
 * the embeddings and the experts stay in the model's precision. On the GPU
 * the same kernels (kern/cuda/fp8.cu, the same bits), and the GEMMs
 * (mc_k_fp8_gemm) are cuBLASLt's FP8 GEMMs on the operands converted to FP8
 * bytes, exact conversions, so only the summation order differs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/model_internal.h"

#define E4M3_MAX 448.0f
#define E5M2_MAX 57344.0f

static int nops(const mc_model *m) { return m->nlocal * 4 * 3; }

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

mc_status mc_model_fp8_new(mc_model *m, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    if (!c->fp8) return MC_OK;
    size_t n = (size_t)nops(m),
           len = (size_t)(c->fp8_amax_history_len > 0 ? c->fp8_amax_history_len : 1);
    m->fp8_scale = malloc((n + 1) * sizeof(float));
    m->fp8_cur = calloc(n + 1, sizeof(float));
    m->fp8_hist = calloc(n * len + 1, sizeof(float));
    if (!m->fp8_scale || !m->fp8_cur || !m->fp8_hist)
        return mc_error_set(err, MC_ERR_NOMEM, "model: FP8 state: out of memory");
    for (size_t i = 0; i < n; i++) m->fp8_scale[i] = 1.0f;
    size_t N = m->N, C = m->C, A = m->Ql * m->D;
    size_t xi = N * maxz(maxz(C, A), m->Fl);
    size_t wi = maxz(maxz(m->qkv_out * C, C * A), maxz(m->fc1_out * C, C * m->Fl));
    size_t di = N * maxz(maxz(m->qkv_out, C), m->fc1_out);
    m->fp8_qx = mc_balloc(m->be, xi * sizeof(float), err);
    m->fp8_qw = m->fp8_qx ? mc_balloc(m->be, wi * sizeof(float), err) : NULL;
    m->fp8_qd = m->fp8_qw ? mc_balloc(m->be, di * sizeof(float), err) : NULL;
    m->fp8_tmp = m->fp8_qd ? mc_balloc(m->be, maxz(xi, wi) * sizeof(float), err) : NULL;
    m->fp8_red = m->fp8_tmp ? mc_balloc(m->be, (n + 1) * sizeof(float), err) : NULL;
    if (!m->fp8_red) {
        mc_error_prefix(err, "model: FP8 buffers");
        return err ? err->code : MC_ERR_NOMEM;
    }
    return MC_OK;
}

void mc_model_fp8_free(mc_model *m)
{
    free(m->fp8_scale);
    free(m->fp8_cur);
    free(m->fp8_hist);
    if (m->fp8_qx) mc_bfree(m->be, m->fp8_qx);
    if (m->fp8_qw) mc_bfree(m->be, m->fp8_qw);
    if (m->fp8_qd) mc_bfree(m->be, m->fp8_qd);
    if (m->fp8_tmp) mc_bfree(m->be, m->fp8_tmp);
    if (m->fp8_red) mc_bfree(m->be, m->fp8_red);
}

/* operand op (0 x, 1 W, 2 dy) of linear `which` of layer l */
static size_t op_index(const mc_model *m, int l, int which, int op)
{
    return ((size_t)m->lidx[l] * 4 + (size_t)which) * 3 + (size_t)op;
}

/* q = x quantized with the operand's scale, its amax recorded (in backend
 * memory: no host round trip per operand) */
static float quantize(mc_model *m, size_t k, float *q, const float *x, size_t n, int e5m2)
{
    mc_k_amax_into(m->be, m->fp8_red + k, x, n);
    float s = m->fp8_scale[k];
    mc_k_fp8_quantize(m->be, q, x, n, s, e5m2);
    return s;
}

void mc_model_lin_fwd(mc_model *m, int l, int which, float *out, const float *x, int w,
                      const float *b, size_t N, size_t I, size_t O)
{
    if (!m->cfg.fp8) {
        mc_k_linear_fwd(m->be, m->prec, out, x, param_val(m, w), param_prep(m, w), b, N, I, O,
                        0.0f);
        return;
    }
    float sx = quantize(m, op_index(m, l, which, 0), m->fp8_qx, x, N * I, 0);
    float sw = quantize(m, op_index(m, l, which, 1), m->fp8_qw, param_val(m, w), O * I, 0);
    mc_k_fp8_gemm(m->be, 0, out, m->fp8_qx, m->fp8_qw, N, I, O, 0);
    mc_k_fp8_out(m->be, out, N, O, (1.0f / sx) * (1.0f / sw), b);
}

void mc_model_lin_bwd(mc_model *m, mc_prec pr, int l, int which, float *dx, float *dW, float *db,
                      const float *dy, const float *x, int w, size_t N, size_t I, size_t O)
{
    if (!m->cfg.fp8) {
        mc_k_linear_bwd(m->be, pr, dx, dW, db, dy, x, param_val(m, w), param_prep(m, w), N, I, O);
        return;
    }
    mc_backend *be = m->be;
    int e5 = m->cfg.fp8 == 2;
    float sd = quantize(m, op_index(m, l, which, 2), m->fp8_qd, dy, N * O, e5);
    if (dx) {
        float sw = quantize(m, op_index(m, l, which, 1), m->fp8_qw, param_val(m, w), O * I, 0);
        mc_k_fp8_gemm(be, 1, m->fp8_tmp, m->fp8_qd, m->fp8_qw, N, I, O, e5);
        mc_k_axpy(be, dx, m->fp8_tmp, N * I, (1.0f / sd) * (1.0f / sw));
    }
    if (dW) {
        float sx = quantize(m, op_index(m, l, which, 0), m->fp8_qx, x, N * I, 0);
        mc_k_fp8_gemm(be, 2, m->fp8_tmp, m->fp8_qd, m->fp8_qx, N, I, O, e5);
        mc_k_axpy(be, dW, m->fp8_tmp, O * I, (1.0f / sd) * (1.0f / sx));
    }
    if (db) mc_k_linear_bwd(be, MC_PREC_FP32, NULL, NULL, db, dy, NULL, NULL, NULL, N, I, O);
}

mc_status mc_model_fp8_update(mc_model *m, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    if (!c->fp8 || !m->fp8_cur) return MC_OK;
    size_t n = (size_t)nops(m),
           len = (size_t)(c->fp8_amax_history_len > 0 ? c->fp8_amax_history_len : 1);
    if (n) { /* the step's maxima are in backend memory (quantize): reduced
              * there (NCCL's collectives on a GPU), then one copy to the host */
        mc_status st = mc_allreduce_max(&m->grid, MC_GROUP_TP, m->be, m->fp8_red, n, err);
        if (!st) st = mc_allreduce_max(&m->grid, MC_GROUP_CP, m->be, m->fp8_red, n, err);
        if (!st) st = mc_allreduce_max(&m->grid, MC_GROUP_DP, m->be, m->fp8_red, n, err);
        if (st) return st;
        mc_bcopy_to_host(m->be, m->fp8_cur, m->fp8_red, n * sizeof(float));
        mc_k_fill(m->be, m->fp8_red, 0.0f, n);
    }
    for (size_t k = 0; k < n; k++) {
        float *h = m->fp8_hist + k * len;
        memmove(h + 1, h, (len - 1) * sizeof *h);
        h[0] = m->fp8_cur[k];
        m->fp8_cur[k] = 0.0f;
        float a = h[0];
        if (c->fp8_amax_compute_max)
            for (size_t j = 1; j < len; j++) a = h[j] > a ? h[j] : a;
        int e5m2 = k % 3 == 2 && c->fp8 == 2;
        float fmax = e5m2 ? E5M2_MAX : E4M3_MAX;
        if (a > 0.0f && isfinite(a)) m->fp8_scale[k] = fmax / a / ldexpf(1.0f, c->fp8_margin);
    }
    return MC_OK;
}
