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
 * the embeddings and the experts stay in the model's precision. The
 * scales, the histories and any amax recorded since the last update (an
 * evaluation's) go into training checkpoints by global layer
 * (mc_model_fp8_get/_set, lib/train/state.c), so a resumed run continues
 * bit for bit. On the GPU the same kernels (kern/cuda/fp8.cu, the same
 * bits), and the GEMMs (mc_k_fp8_gemm) are cuBLASLt's FP8 GEMMs on the
 * operands converted to FP8 bytes, exact conversions, so only the
 * summation order differs.
 */
#include <assert.h>
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
                      const float *b, size_t N, size_t I, size_t O, unsigned exact)
{
    if (!m->cfg.fp8) {
        mc_k_linear_fwd(m->be, m->prec, out, x, param_val(m, w), param_prep(m, w), b, N, I, O, 0.0f,
                        exact);
        return;
    }
    float sx = quantize(m, op_index(m, l, which, 0), m->fp8_qx, x, N * I, 0);
    float sw = quantize(m, op_index(m, l, which, 1), m->fp8_qw, param_val(m, w), O * I, 0);
    mc_k_fp8_gemm(m->be, 0, out, m->fp8_qx, m->fp8_qw, N, I, O, 0);
    mc_k_fp8_out(m->be, out, N, O, (1.0f / sx) * (1.0f / sw), b);
}

void mc_model_lin_bwd(mc_model *m, mc_prec pr, int l, int which, float *dx, float *dW, float *db,
                      const float *dy, const float *x, int w, size_t N, size_t I, size_t O,
                      unsigned exact)
{
    if (!m->cfg.fp8) {
        mc_k_linear_bwd(m->be, pr, dx, dW, db, dy, x, param_val(m, w), param_prep(m, w), N, I, O,
                        exact);
        return;
    }
    assert(!(exact & MC_LIN_DX_WRITE)); /* dx added below, x quantized after it */
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
    if (db) mc_k_linear_bwd(be, MC_PREC_FP32, NULL, NULL, db, dy, NULL, NULL, NULL, N, I, O, 0);
}

/* the stage's amaxes so far (in backend memory, fp8_red: quantize records
 * them there), max-reduced over its TP, CP and DP groups in place (NCCL's
 * collectives on a GPU; a second reduction changes nothing) and copied to
 * the host (fp8_cur) */
static mc_status reduce_cur(mc_model *m, size_t n, mc_error *err)
{
    if (!n) return MC_OK;
    mc_status st = mc_allreduce_max(&m->grid, MC_GROUP_TP, m->be, m->fp8_red, n, err);
    if (!st) st = mc_allreduce_max(&m->grid, MC_GROUP_CP, m->be, m->fp8_red, n, err);
    if (!st) st = mc_allreduce_max(&m->grid, MC_GROUP_DP, m->be, m->fp8_red, n, err);
    if (st) return st;
    mc_bcopy_to_host(m->be, m->fp8_cur, m->fp8_red, n * sizeof(float));
    return MC_OK;
}

mc_status mc_model_fp8_update(mc_model *m, mc_error *err)
{
    const mc_model_config *c = &m->cfg;
    if (!c->fp8 || !m->fp8_cur) return MC_OK;
    size_t n = (size_t)nops(m),
           len = (size_t)(c->fp8_amax_history_len > 0 ? c->fp8_amax_history_len : 1);
    mc_status st = reduce_cur(m, n, err);
    if (st) return st;
    if (n) mc_k_fill(m->be, m->fp8_red, 0.0f, n); /* the next step's maxima start at 0 */
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

/* ------------------------------------------------------------ checkpoints */

int mc_model_fp8_history_len(const mc_model *m)
{
    if (!m->cfg.fp8 || !m->fp8_hist) return 0;
    return m->cfg.fp8_amax_history_len > 0 ? m->cfg.fp8_amax_history_len : 1;
}

mc_status mc_model_fp8_sync(mc_model *m, mc_error *err)
{
    if (!mc_model_fp8_history_len(m)) return MC_OK;
    return reduce_cur(m, (size_t)nops(m), err);
}

int mc_model_fp8_get(const mc_model *m, int l, float *scale, float *amax, float *hist)
{
    int len = mc_model_fp8_history_len(m);
    if (!len || l < 0 || l >= m->cfg.num_layers || m->lidx[l] < 0) return 0;
    size_t k0 = (size_t)m->lidx[l] * MC_MODEL_FP8_OPS;
    memcpy(scale, m->fp8_scale + k0, MC_MODEL_FP8_OPS * sizeof *scale);
    memcpy(amax, m->fp8_cur + k0, MC_MODEL_FP8_OPS * sizeof *amax);
    memcpy(hist, m->fp8_hist + k0 * (size_t)len, MC_MODEL_FP8_OPS * (size_t)len * sizeof *hist);
    return 1;
}

int mc_model_fp8_set(mc_model *m, int l, const float *scale, const float *amax, const float *hist,
                     int len)
{
    int mine = mc_model_fp8_history_len(m);
    if (!mine || l < 0 || l >= m->cfg.num_layers || m->lidx[l] < 0 || len < 1) return 0;
    size_t k0 = (size_t)m->lidx[l] * MC_MODEL_FP8_OPS, keep = (size_t)(len < mine ? len : mine);
    memcpy(m->fp8_scale + k0, scale, MC_MODEL_FP8_OPS * sizeof *scale);
    memcpy(m->fp8_cur + k0, amax, MC_MODEL_FP8_OPS * sizeof *amax);
    /* the pending maxima live in backend memory (quantize, reduce_cur) */
    mc_bcopy_from_host(m->be, m->fp8_red + k0, amax, MC_MODEL_FP8_OPS * sizeof *amax);
    for (size_t k = 0; k < MC_MODEL_FP8_OPS; k++) {
        /* newest first: the newest min(len, mine) entries, older ones 0 (a
         * fresh history's) */
        float *h = m->fp8_hist + (k0 + k) * (size_t)mine;
        memcpy(h, hist + k * (size_t)len, keep * sizeof *h);
        for (size_t j = keep; j < (size_t)mine; j++) h[j] = 0.0f;
    }
    return 1;
}
