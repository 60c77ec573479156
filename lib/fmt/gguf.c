/*
 * gguf.c - GGUF version 3 export of an mc checkpoint for llama.cpp: the
 * file layout, the mapping from Megatron Core's tensors to llama.cpp's, the
 * element codecs (f16, bf16, q8_0, q4_0, q4_K) and the tokenizer metadata,
 * each as mc-formats(5), GGUF FILES, describes it (layout, tensors, types).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/buf.h"
#include "mc/ckpt.h"
#include "mc/file.h"
#include "mc/gguf.h"
#include "mc/tokenizer.h"
#include "fmt/gguf_internal.h"
#include "fmt/hf_internal.h"

#define GGUF_VERSION 3
#define GGUF_ALIGN 32
#define QK 32    /* elements per q8_0 / q4_0 block */
#define QK_K 256 /* elements per q4_K super-block */

/* GGUF metadata value types. */
enum { KV_U32 = 4, KV_I32 = 5, KV_F32 = 6, KV_BOOL = 7, KV_STRING = 8, KV_ARRAY = 9 };
/* ggml tensor types. */
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_BF16 = 30 };

static const char *const TYPE_NAMES[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K"};
static const int TYPE_GGML[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_K};
/* general.file_type: llama.cpp's llama_ftype (ALL_F32, MOSTLY_F16, MOSTLY_BF16,
 * MOSTLY_Q8_0, MOSTLY_Q4_0, MOSTLY_Q4_K_S). */
static const uint32_t TYPE_FTYPE[] = {0, 1, 32, 7, 2, 14};

const char *mc_gguf_type_name(mc_gguf_type t)
{
    return (unsigned)t < sizeof TYPE_NAMES / sizeof *TYPE_NAMES ? TYPE_NAMES[t] : NULL;
}

mc_status mc_gguf_type_parse(const char *s, mc_gguf_type *out, mc_error *err)
{
    for (unsigned i = 0; i < sizeof TYPE_NAMES / sizeof *TYPE_NAMES; i++)
        if (s && !strcmp(s, TYPE_NAMES[i])) {
            *out = (mc_gguf_type)i;
            return MC_OK;
        }
    return mc_error_set(err, MC_ERR_USAGE,
                        "--dtype '%s' is not a GGUF type (f32, f16, bf16, q8_0, q4_0 or q4_K)",
                        s ? s : "");
}

void mc_gguf_options_init(mc_gguf_options *o)
{
    memset(o, 0, sizeof *o);
    o->type = MC_GGUF_F16;
}

/* ------------------------------------------------------------ element codecs */

uint16_t mc_gguf_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00);  /* NaN stays a (quiet) NaN */
    if (ax >= 0x47800000) return (uint16_t)(sign | 0x7c00); /* 2^16 and up: infinity */
    if (ax < 0x38800000) {
        /* below 2^-14: a multiple of 2^-24; scaling by 2^24 is exact and
         * rintf rounds half to even */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
    }
    uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3ff), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

uint16_t mc_gguf_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* q8_0: d = max|x| / 127, q = round(x / d) (half away from zero), ggml's
 * reference quantizer (quantize_row_q8_0_ref); the scale is stored in fp16
 * but the values are divided by the fp32 one, as ggml does. */
void mc_gguf_quantize_q8_0(const float *x, size_t n, void *out)
{
    unsigned char *o = out;
    for (size_t b = 0; b < n / QK; b++, x += QK, o += 2 + QK) {
        float amax = 0;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t h = mc_gguf_f32_to_f16(d);
        memcpy(o, &h, 2);
        for (int j = 0; j < QK; j++) o[2 + j] = (unsigned char)(signed char)roundf(x[j] * id);
    }
}

/* q4_0: d = -m / 8 where m is the element of largest magnitude (the first
 * one on ties), q = min(15, trunc(x / d + 8.5)), so q - 8 lies in [-8, 7]
 * and m itself maps to -8 exactly (quantize_row_q4_0_ref). */
void mc_gguf_quantize_q4_0(const float *x, size_t n, void *out)
{
    unsigned char *o = out;
    for (size_t b = 0; b < n / QK; b++, x += QK, o += 2 + QK / 2) {
        float amax = 0, m = 0;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                m = x[j];
            }
        float d = m / -8, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t h = mc_gguf_f32_to_f16(d);
        memcpy(o, &h, 2);
        for (int j = 0; j < QK / 2; j++) {
            int q0 = (int)(signed char)(x[j] * id + 8.5f);
            int q1 = (int)(signed char)(x[j + QK / 2] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            o[2 + j] = (unsigned char)(q0 | q1 << 4);
        }
    }
}

/* fp16 bits back to float (normal, subnormal, zero; no inf/NaN here). */
static float f16_to_f32(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    float m = (float)(h & 0x3ff);
    float v = e ? ldexpf(1024.0f + m, e - 25) : ldexpf(m, -24);
    return h & 0x8000 ? -v : v;
}

/* The smallest fp16 >= v (v >= 0, finite, below 65504). */
static uint16_t f16_up(float v)
{
    uint16_t h = mc_gguf_f32_to_f16(v);
    return f16_to_f32(h) < v ? (uint16_t)(h + 1) : h;
}

/* q4_K: in each sub-block j of 32, the offset m_j = -min(0, min x) and the
 * step s_j = (max x + m_j) / 15; the super-block stores d >= max s_j / 63
 * and dmin >= max m_j / 63 as fp16 (rounded up), each sub-block
 * sc_j = ceil(s_j / d) and m_j' = ceil(m_j / dmin) in 6 bits (rounding up,
 * no value falls below q = 0, and only by at most dmin above q = 15), then
 * q = clamp(round((x + dmin m_j') / (d sc_j)), 0, 15). Error at most
 * (S + d) / 2 + dmin, S = max s_j. */
void mc_gguf_quantize_q4_K(const float *x, size_t n, void *out)
{
    unsigned char *o = out;
    for (size_t b = 0; b < n / QK_K; b++, x += QK_K, o += 4 + 12 + QK_K / 2) {
        float s[8], m[8], smax = 0, mmax = 0;
        for (int j = 0; j < 8; j++) {
            float lo = 0, hi = -INFINITY;
            for (int l = 0; l < 32; l++) {
                lo = fminf(lo, x[32 * j + l]);
                hi = fmaxf(hi, x[32 * j + l]);
            }
            m[j] = -lo;
            s[j] = (hi - lo) / 15;
            smax = fmaxf(smax, s[j]);
            mmax = fmaxf(mmax, m[j]);
        }
        uint16_t dh = f16_up(smax / 63), mh = f16_up(mmax / 63);
        float d = f16_to_f32(dh), dmin = f16_to_f32(mh);
        unsigned char sc[8], mq[8], *scales = o + 4, *qs = o + 16;
        for (int j = 0; j < 8; j++) {
            float a = d > 0 ? ceilf(s[j] / d) : 0, c = dmin > 0 ? ceilf(m[j] / dmin) : 0;
            sc[j] = (unsigned char)(a > 63 ? 63 : a);
            mq[j] = (unsigned char)(c > 63 ? 63 : c);
        }
        memcpy(o, &dh, 2);
        memcpy(o + 2, &mh, 2);
        memset(scales, 0, 12);
        for (int j = 0; j < 8; j++) { /* ggml's 12-byte packing of 6-bit pairs */
            if (j < 4) {
                scales[j] = sc[j];
                scales[j + 4] = mq[j];
            } else {
                scales[j + 4] = (unsigned char)((sc[j] & 0xf) | (mq[j] & 0xf) << 4);
                scales[j - 4] |= (unsigned char)((sc[j] >> 4) << 6);
                scales[j] |= (unsigned char)((mq[j] >> 4) << 6);
            }
        }
        unsigned char q[QK_K];
        for (int j = 0; j < 8; j++) {
            float dj = d * sc[j], mj = dmin * mq[j];
            for (int l = 0; l < 32; l++) {
                float v = dj > 0 ? rintf((x[32 * j + l] + mj) / dj) : 0;
                q[32 * j + l] = (unsigned char)(v < 0 ? 0 : v > 15 ? 15 : v);
            }
        }
        /* each 64 elements: 32 bytes, sub-block 2i in the low nibbles and
         * 2i + 1 in the high ones */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                qs[32 * c + l] = (unsigned char)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}

static int ggml_of(int t) { return TYPE_GGML[t]; }

/* Bytes of a tensor of rows x cols elements (cols: the row length) stored as
 * ggml type g. */
static uint64_t tensor_bytes(int g, int64_t rows, int64_t cols)
{
    uint64_t n = (uint64_t)rows * (uint64_t)cols;
    switch (g) {
    case GGML_F32: return 4 * n;
    case GGML_F16:
    case GGML_BF16: return 2 * n;
    case GGML_Q8_0: return n / QK * (2 + QK);
    case GGML_Q4_K: return n / QK_K * (4 + 12 + QK_K / 2);
    default: return n / QK * (2 + QK / 2);
    }
}

/* ------------------------------------------------------------ the tensor plan */

typedef enum xform {
    X_COPY, /* rows [0, rows) of the source as they are */
    X_QKV,  /* gpt2: Megatron's per-group [q.., k, v] -> [all q; all k; all v] */
    X_Q,
    X_K, /* llama: one part of the QKV, rows permuted for adjacent RoPE pairs */
    X_V,
    X_GATE,      /* llama: first half of SwiGLU's fc1 */
    X_UP,        /* llama: second half */
    X_GATE_EXPS, /* llama MoE: each expert's first half of fc1, experts in order */
    X_UP_EXPS,   /* llama MoE: each expert's second half */
    X_ROPE_FREQS /* llama with RoPE scaling: llama.cpp's per-pair frequency divisors,
                    computed (no source tensor) */
} xform;

typedef struct tplan {
    char name[64]; /* llama.cpp's name */
    char src[160]; /* "model/<Megatron Core name>" */
    xform x;
    int64_t rows, cols;         /* in the file; cols 0: 1-D */
    int64_t experts;            /* > 0: 3-D, [experts, rows / experts, cols] */
    int64_t src_rows, src_cols; /* the stored global tensor (cols 0: 1-D) */
    int ggml;
    uint64_t offset, bytes;
} tplan;

typedef struct plan {
    tplan *t;
    size_t n, cap;
    int64_t Q, G, D; /* heads, query groups, head dim */
    mc_rope rope;    /* the model's RoPE (X_ROPE_FREQS) */
    int neox;        /* qwen3, qwen3moe: llama.cpp rotates (i, i + D/2) as mc: no permutation */
} plan;

static mc_status plan_add(plan *p, const char *name, const char *src, xform x, int64_t rows,
                          int64_t cols, int64_t src_rows, int64_t src_cols, int ggml, mc_error *err)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        tplan *t = realloc(p->t, cap * sizeof *t);
        if (!t) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        p->t = t;
        p->cap = cap;
    }
    tplan *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->src, sizeof t->src, "model/%s", src);
    t->x = x;
    t->rows = rows;
    t->cols = cols;
    t->src_rows = src_rows;
    t->src_cols = src_cols;
    if (cols == 0) {
        t->ggml = GGML_F32; /* norms and biases stay f32, as llama.cpp's converter keeps them */
    } else if ((ggml == GGML_Q8_0 || ggml == GGML_Q4_0 || ggml == GGML_Q4_K) && cols % QK) {
        t->ggml = GGML_F16; /* rows that hold no whole block: the converter's fallback */
    } else if (ggml == GGML_Q4_K && cols % QK_K) {
        t->ggml = GGML_Q8_0; /* rows that hold no whole super-block */
    } else {
        t->ggml = ggml;
    }
    t->bytes = tensor_bytes(t->ggml, rows, cols ? cols : 1);
    return MC_OK;
}

/* Which architecture llama.cpp knows this configuration as; NULL with a
 * reason in err when none. */
static const char *arch_of(const mc_model_config *c, const char *file, mc_error *err)
{
    int gpt = c->normalization == MC_NORM_LAYERNORM && !c->swiglu &&
              c->position_embedding_type == MC_POS_LEARNED;
    int llama = c->normalization == MC_NORM_RMSNORM && c->swiglu &&
                c->position_embedding_type == MC_POS_ROPE;
    if (gpt) {
        if ((int64_t)c->num_attention_heads * c->kv_channels != c->hidden_size) {
            mc_error_set(err, MC_ERR_FORMAT,
                         "%s: GGUF's gpt2 architecture needs heads x kv_channels = hidden_size "
                         "(%d x %d != %d)",
                         file, c->num_attention_heads, c->kv_channels, c->hidden_size);
            return NULL;
        }
        return "gpt2";
    }
    if (llama && c->rotary_percent < 1) {
        mc_error_set(err, MC_ERR_FORMAT,
                     "%s: GGUF's llama architecture turns whole heads; this model turns %g of "
                     "each (--rotary-percent)",
                     file, (double)c->rotary_percent);
        return NULL;
    }
    if (llama && c->qk_layernorm && c->use_rope_scaling) {
        mc_error_set(err, MC_ERR_FORMAT,
                     "%s: GGUF's qwen3 architecture (for --qk-layernorm) has no Llama 3.1 RoPE "
                     "scaling; this model has --use-rope-scaling",
                     file);
        return NULL;
    }
    /* --qk-layernorm: llama.cpp's qwen3 and qwen3moe (attn_q_norm, attn_k_norm) */
    if (llama && c->qk_layernorm) return c->num_experts > 0 ? "qwen3moe" : "qwen3";
    if (llama) return "llama";
    if (c->qk_layernorm) {
        mc_error_set(err, MC_ERR_FORMAT,
                     "%s: GGUF's gpt2 architecture has no query/key norm; this model has "
                     "--qk-layernorm",
                     file);
        return NULL;
    }
    mc_error_set(err, MC_ERR_FORMAT,
                 "%s: GGUF has no architecture for this model (%s, %s, %s positions): llama.cpp "
                 "reads GPT (LayerNorm, GELU, learned positions) as gpt2 and Llama (RMSNorm, "
                 "SwiGLU, RoPE) as llama",
                 file, c->normalization == MC_NORM_RMSNORM ? "RMSNorm" : "LayerNorm",
                 c->swiglu ? "SwiGLU" : "GELU",
                 c->position_embedding_type == MC_POS_ROPE ? "RoPE" : "learned");
    return NULL;
}

static mc_status build_plan(const mc_model_config *c, int llama, int ggml, int has_bias, plan *p,
                            mc_error *err)
{
    int64_t C = c->hidden_size, V = c->vocab_size, Vp = c->padded_vocab_size;
    int64_t Q = c->num_attention_heads, G = c->num_query_groups, D = c->kv_channels;
    int64_t F = c->ffn_hidden_size, QKV = (Q + 2 * G) * D;
    p->Q = Q;
    p->G = G;
    p->D = D;
    p->neox = c->qk_layernorm;
    p->rope = (mc_rope){c->rotary_base,
                        0,
                        c->use_rope_scaling,
                        c->rope_scaling_factor,
                        c->rope_low_freq_factor,
                        c->rope_high_freq_factor,
                        c->rope_original_max_position_embeddings};
    mc_status st = plan_add(p, "token_embd.weight", "embedding.word_embeddings.weight", X_COPY, V,
                            C, Vp, C, ggml, err);
    /* Llama 3.1's scaling as llama.cpp reads it: theta_i / rope_freqs[i],
     * so rope_freqs[i] = plain inv_freq_i / scaled inv_freq_i */
    if (!st && llama && c->use_rope_scaling)
        st = plan_add(p, "rope_freqs.weight", "", X_ROPE_FREQS, D / 2, 0, D / 2, 0, GGML_F32, err);
    if (!st && !llama) /* f32 whatever the type, as llama.cpp's converter does */
        st = plan_add(p, "position_embd.weight", "embedding.position_embeddings.weight", X_COPY,
                      c->max_position_embeddings, C, c->max_position_embeddings, C, GGML_F32, err);
    char n[64], s[160];
#define ADD(X, R, CO, SR, SC)                                         \
    do {                                                              \
        if (!st) st = plan_add(p, n, s, X, R, CO, SR, SC, ggml, err); \
    } while (0)
#define NAMES(gg, mm) \
    (snprintf(n, sizeof n, "blk.%d." gg, l), snprintf(s, sizeof s, "decoder.layers.%d." mm, l))
    for (int l = 0; l < c->num_layers && !st; l++) {
        NAMES("attn_norm.weight", "self_attention.linear_qkv.layer_norm_weight");
        ADD(X_COPY, C, 0, C, 0);
        if (!llama) {
            NAMES("attn_norm.bias", "self_attention.linear_qkv.layer_norm_bias");
            ADD(X_COPY, C, 0, C, 0);
            NAMES("attn_qkv.weight", "self_attention.linear_qkv.weight");
            ADD(X_QKV, QKV, C, QKV, C);
            if (has_bias) {
                NAMES("attn_qkv.bias", "self_attention.linear_qkv.bias");
                ADD(X_QKV, QKV, 0, QKV, 0);
            }
        } else {
            static const char *const part[3] = {"q", "k", "v"};
            for (int k = 0; k < 3; k++) {
                int64_t rows = (k ? G : Q) * D;
                snprintf(n, sizeof n, "blk.%d.attn_%s.weight", l, part[k]);
                snprintf(s, sizeof s, "decoder.layers.%d.self_attention.linear_qkv.weight", l);
                ADD((xform)(X_Q + k), rows, C, QKV, C);
                if (has_bias) {
                    snprintf(n, sizeof n, "blk.%d.attn_%s.bias", l, part[k]);
                    snprintf(s, sizeof s, "decoder.layers.%d.self_attention.linear_qkv.bias", l);
                    ADD((xform)(X_Q + k), rows, 0, QKV, 0);
                }
            }
        }
        if (c->qk_layernorm) { /* qwen3, qwen3moe: [D] each, f32 */
            NAMES("attn_q_norm.weight", "self_attention.q_layernorm.weight");
            ADD(X_COPY, D, 0, D, 0);
            NAMES("attn_k_norm.weight", "self_attention.k_layernorm.weight");
            ADD(X_COPY, D, 0, D, 0);
        }
        NAMES("attn_output.weight", "self_attention.linear_proj.weight");
        ADD(X_COPY, C, Q * D, C, Q * D);
        if (has_bias) {
            NAMES("attn_output.bias", "self_attention.linear_proj.bias");
            ADD(X_COPY, C, 0, C, 0);
        }
        if (mc_model_layer_is_moe(c, l)) {
            /* llama.cpp's Mixtral layout: the router (f32, as its
             * converter keeps ffn_gate_inp) and each weight of all the
             * experts as one [E, rows, cols] tensor, mc's global tensor
             * (fc1's gate and up halves gathered apart) */
            int64_t E = c->num_experts, FE = c->moe_ffn_hidden_size;
            NAMES("ffn_norm.weight", "pre_mlp_layernorm.weight");
            ADD(X_COPY, C, 0, C, 0);
            NAMES("ffn_gate_inp.weight", "mlp.router.weight");
            if (!st) st = plan_add(p, n, s, X_COPY, E, C, E, C, GGML_F32, err);
            static const char *const ex[3] = {"gate", "up", "down"};
            for (int k = 0; k < 3 && !st; k++) {
                snprintf(n, sizeof n, "blk.%d.ffn_%s_exps.weight", l, ex[k]);
                snprintf(s, sizeof s, "decoder.layers.%d.mlp.experts.experts.linear_fc%d.weight", l,
                         k < 2 ? 1 : 2);
                if (k < 2)
                    ADD(k ? X_UP_EXPS : X_GATE_EXPS, E * FE, C, E * 2 * FE, C);
                else
                    ADD(X_COPY, E * C, FE, E * C, FE);
                if (!st) p->t[p->n - 1].experts = E;
            }
            continue;
        }
        NAMES("ffn_norm.weight", "mlp.linear_fc1.layer_norm_weight");
        ADD(X_COPY, C, 0, C, 0);
        if (!llama) {
            NAMES("ffn_norm.bias", "mlp.linear_fc1.layer_norm_bias");
            ADD(X_COPY, C, 0, C, 0);
            NAMES("ffn_up.weight", "mlp.linear_fc1.weight");
            ADD(X_COPY, F, C, F, C);
            if (has_bias) {
                NAMES("ffn_up.bias", "mlp.linear_fc1.bias");
                ADD(X_COPY, F, 0, F, 0);
            }
        } else {
            NAMES("ffn_gate.weight", "mlp.linear_fc1.weight");
            ADD(X_GATE, F, C, 2 * F, C);
            NAMES("ffn_up.weight", "mlp.linear_fc1.weight");
            ADD(X_UP, F, C, 2 * F, C);
            if (has_bias) {
                NAMES("ffn_gate.bias", "mlp.linear_fc1.bias");
                ADD(X_GATE, F, 0, 2 * F, 0);
                NAMES("ffn_up.bias", "mlp.linear_fc1.bias");
                ADD(X_UP, F, 0, 2 * F, 0);
            }
        }
        NAMES("ffn_down.weight", "mlp.linear_fc2.weight");
        ADD(X_COPY, C, F, C, F);
        if (has_bias) {
            NAMES("ffn_down.bias", "mlp.linear_fc2.bias");
            ADD(X_COPY, C, 0, C, 0);
        }
    }
#undef NAMES
    snprintf(n, sizeof n, "output_norm.weight");
    snprintf(s, sizeof s, "decoder.final_layernorm.weight");
    ADD(X_COPY, C, 0, C, 0);
    if (!llama) {
        snprintf(n, sizeof n, "output_norm.bias");
        snprintf(s, sizeof s, "decoder.final_layernorm.bias");
        ADD(X_COPY, C, 0, C, 0);
    }
    /* gpt2 with tied embeddings: output.weight a copy of token_embd, as
     * llama.cpp's own converter writes it (the gpt2 loader of older
     * llama.cpp versions requires the tensor) */
    if (c->untie_embeddings_and_output_weights || !llama) {
        snprintf(n, sizeof n, "output.weight");
        snprintf(s, sizeof s, "%s",
                 c->untie_embeddings_and_output_weights ? "output_layer.weight"
                                                        : "embedding.word_embeddings.weight");
        ADD(X_COPY, V, C, Vp, C);
    }
#undef ADD
    uint64_t off = 0;
    for (size_t i = 0; i < p->n; i++) {
        p->t[i].offset = off;
        off += (p->t[i].bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
    }
    return st;
}

/* The source row of row r of the file's tensor. RoPE: mc (like Megatron and
 * Hugging Face) rotates the pairs (i, i + D/2) of each head; llama.cpp's
 * "llama" rotates adjacent pairs (2i, 2i + 1). Row 2i + s of a head in the
 * file is therefore row s * D/2 + i of mc's head, the permutation llama.cpp's
 * converter applies to q_proj/k_proj. */
static int64_t src_row(const plan *p, const tplan *t, int64_t r)
{
    int64_t Q = p->Q, G = p->G, D = p->D, per = Q / G; /* query heads per group */
    int64_t grp = (per + 2) * D;                       /* rows of one group */
    switch (t->x) {
    case X_COPY: return r;
    case X_QKV:
        if (r < Q * D) return (r / D / per) * grp + (r / D % per) * D + r % D;
        r -= Q * D;
        if (r < G * D) return (r / D) * grp + per * D + r % D;
        r -= G * D;
        return (r / D) * grp + (per + 1) * D + r % D;
    case X_Q:
    case X_K: {
        int64_t h = r / D, j = r % D;
        int64_t i = j / 2, s = j % 2;
        int64_t within = p->neox ? j : s * (D / 2) + i; /* row of mc's head */
        if (t->x == X_Q) return (h / per) * grp + (h % per) * D + within;
        return h * grp + per * D + within;
    }
    case X_V: return (r / D) * grp + (per + 1) * D + r % D;
    case X_GATE: return r;
    case X_UP: return t->rows + r;
    case X_GATE_EXPS:
    case X_UP_EXPS: {
        int64_t F = t->rows / t->experts; /* an expert's rows of fc1: [gate F; up F] */
        return r / F * 2 * F + (t->x == X_UP_EXPS ? F : 0) + r % F;
    }
    case X_ROPE_FREQS: return r; /* computed, not gathered */
    }
    return r;
}

/* ------------------------------------------------------------ metadata */

typedef struct kvbuf {
    mc_buf b;
    uint64_t n;
    mc_status st;
    mc_error *err;
} kvbuf;

static void put(kvbuf *k, const void *p, size_t n)
{
    if (!k->st) k->st = mc_buf_append(&k->b, p, n, k->err);
}
static void put_u32(kvbuf *k, uint32_t v) { put(k, &v, 4); }
static void put_u64(kvbuf *k, uint64_t v) { put(k, &v, 8); }
static void put_strn(kvbuf *k, const char *s, size_t n)
{
    put_u64(k, n);
    put(k, s, n);
}
static void put_str(kvbuf *k, const char *s) { put_strn(k, s, strlen(s)); }
static void key(kvbuf *k, const char *name, uint32_t type)
{
    put_str(k, name);
    put_u32(k, type);
    k->n++;
}
static void kv_u32(kvbuf *k, const char *name, uint32_t v)
{
    key(k, name, KV_U32);
    put_u32(k, v);
}
static void kv_f32(kvbuf *k, const char *name, float v)
{
    key(k, name, KV_F32);
    put(k, &v, 4);
}
static void kv_bool(kvbuf *k, const char *name, int v)
{
    unsigned char b = v != 0;
    key(k, name, KV_BOOL);
    put(k, &b, 1);
}
static void kv_str(kvbuf *k, const char *name, const char *v)
{
    key(k, name, KV_STRING);
    put_str(k, v);
}
static void kv_arch(kvbuf *k, const char *arch, const char *name, uint32_t v)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, name);
    kv_u32(k, full, v);
}

static void put_tokenizer(kvbuf *k, const mc_gguf_vocab *v, int32_t eod, int32_t eot)
{
    kv_str(k, "tokenizer.ggml.model", "gpt2");
    kv_str(k, "tokenizer.ggml.pre", v->pre);
    key(k, "tokenizer.ggml.tokens", KV_ARRAY);
    put_u32(k, KV_STRING);
    put_u64(k, (uint64_t)v->n);
    for (int64_t i = 0; i < v->n; i++) {
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
        put_str(k, v->tok[i] ? v->tok[i] : pad);
    }
    key(k, "tokenizer.ggml.token_type", KV_ARRAY);
    put_u32(k, KV_I32);
    put_u64(k, (uint64_t)v->n);
    for (int64_t i = 0; i < v->n; i++) {
        int32_t t = v->tok[i] ? v->type[i] : TOK_UNUSED;
        put(k, &t, 4);
    }
    key(k, "tokenizer.ggml.merges", KV_ARRAY);
    put_u32(k, KV_STRING);
    put_u64(k, v->n_merges);
    for (size_t i = 0; i < v->n_merges; i++) put_str(k, v->merges[i]);
    if (eod >= 0) {
        /* mc's one special token, the end of document, ends generation */
        kv_u32(k, "tokenizer.ggml.bos_token_id", (uint32_t)eod);
        kv_u32(k, "tokenizer.ggml.eos_token_id", (uint32_t)eod);
    }
    /* the end of turn: a chat model's own (its tokenizer_config.json's
     * eos_token), else the end of document */
    if (eot >= 0 || eod >= 0)
        kv_u32(k, "tokenizer.ggml.eot_token_id", (uint32_t)(eot >= 0 ? eot : eod));
    /* mc trains without a BOS token: llama.cpp must not add one (its
     * llama-bpe and tekken pre-tokenizers would by default) */
    kv_bool(k, "tokenizer.ggml.add_bos_token", 0);
    kv_bool(k, "tokenizer.ggml.add_eos_token", 0);
}

/* The model's own tokenizer_config.json, when the checkpoint keeps one:
 * its end of turn (the eos_token there; -1 without), and its chat template
 * as llama.cpp's tokenizer.chat_template. */
static int32_t chat_eot(mc_ckpt_reader *r, const mc_tokenizer *tok)
{
    json_t *own = mc_ckpt_tokenizer_config(r);
    const json_t *eos = json_object_get(own, "eos_token");
    if (json_is_object(eos)) eos = json_object_get(eos, "content");
    int32_t id = json_is_string(eos) ? mc_tokenizer_token_to_id(tok, json_string_value(eos)) : -1;
    json_decref(own);
    return id;
}

static void put_chat_template(kvbuf *k, mc_ckpt_reader *r)
{
    json_t *own = mc_ckpt_tokenizer_config(r);
    const json_t *tpl = json_object_get(own, "chat_template");
    if (json_is_string(tpl)) kv_str(k, "tokenizer.chat_template", json_string_value(tpl));
    json_decref(own);
}

/* ------------------------------------------------------------ writing */

static mc_status write_tensor(mc_ckpt_reader *r, const plan *p, const tplan *t, float **cache,
                              char *cached, size_t cached_cap, void **conv, size_t *conv_cap,
                              mc_afile *f, mc_error *err)
{
    int64_t cols = t->cols ? t->cols : 1;
    int64_t src_cols = t->src_cols ? t->src_cols : 1;
    mc_status st = MC_OK;
    int64_t rows_read = t->x == X_COPY ? t->rows : t->src_rows;
    if (t->x == X_ROPE_FREQS) {
        free(*cache);
        cached[0] = 0;
        if (!(*cache = malloc((size_t)t->rows * sizeof **cache)))
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        mc_rope plain = p->rope;
        plain.scaling = 0;
        for (int64_t i = 0; i < t->rows; i++)
            (*cache)[i] = (float)(mc_rope_inv_freq(&plain, (size_t)p->D, (size_t)i) /
                                  mc_rope_inv_freq(&p->rope, (size_t)p->D, (size_t)i));
    } else if (strcmp(cached, t->src) || t->x == X_COPY) {
        free(*cache);
        *cache = malloc((size_t)(rows_read * src_cols) * sizeof **cache);
        cached[0] = 0;
        if (!*cache) return mc_error_set(err, MC_ERR_NOMEM, "out of memory for %s", t->src);
        st = mc_ckpt_read_tensor(r, t->src, t->src_rows, t->src_cols, 0, 0, rows_read, t->src_cols,
                                 *cache, err);
        if (st) return st;
        if (t->x != X_COPY) snprintf(cached, cached_cap, "%s", t->src);
    }
    /* gather the rows in the file's order */
    size_t n = (size_t)(t->rows * cols);
    float *x = *cache;
    float *tmp = NULL;
    if (t->x != X_COPY && t->x != X_ROPE_FREQS) {
        tmp = malloc(n * sizeof *tmp);
        if (!tmp) return mc_error_set(err, MC_ERR_NOMEM, "out of memory for %s", t->name);
        for (int64_t i = 0; i < t->rows; i++)
            memcpy(tmp + i * cols, *cache + src_row(p, t, i) * src_cols,
                   (size_t)cols * sizeof *tmp);
        x = tmp;
    }
    if (t->bytes > *conv_cap) {
        free(*conv);
        *conv = malloc(t->bytes);
        *conv_cap = *conv ? t->bytes : 0;
        if (!*conv) {
            free(tmp);
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory for %s", t->name);
        }
    }
    uint16_t *h = *conv;
    switch (t->ggml) {
    case GGML_F32: memcpy(*conv, x, n * sizeof *x); break;
    case GGML_F16:
        for (size_t i = 0; i < n; i++) h[i] = mc_gguf_f32_to_f16(x[i]);
        break;
    case GGML_BF16:
        for (size_t i = 0; i < n; i++) h[i] = mc_gguf_f32_to_bf16(x[i]);
        break;
    case GGML_Q8_0: mc_gguf_quantize_q8_0(x, n, *conv); break;
    case GGML_Q4_K: mc_gguf_quantize_q4_K(x, n, *conv); break;
    default: mc_gguf_quantize_q4_0(x, n, *conv); break;
    }
    free(tmp);
    static const char zeros[GGUF_ALIGN] = {0};
    st = mc_afile_write(f, *conv, t->bytes, err);
    if (!st && t->bytes % GGUF_ALIGN)
        st = mc_afile_write(f, zeros, GGUF_ALIGN - t->bytes % GGUF_ALIGN, err);
    return st;
}

mc_status mc_export_gguf(const char *ckpt_path, const mc_gguf_options *o, const char *out_path,
                         mc_error *err)
{
    mc_gguf_options dflt;
    if (!o) {
        mc_gguf_options_init(&dflt);
        o = &dflt;
    }
    if (!mc_gguf_type_name(o->type))
        return mc_error_set(err, MC_ERR_USAGE, "unknown GGUF type %d", (int)o->type);
    mc_ckpt_reader *r = NULL;
    mc_tokenizer *tok = NULL;
    mc_gguf_vocab v = {0};
    plan p = {0};
    kvbuf k = {.b = MC_BUF_INIT, .err = err};
    mc_buf head = MC_BUF_INIT;
    mc_afile f;
    int f_open = 0;
    float *cache = NULL;
    void *conv = NULL;
    size_t conv_cap = 0;
    char cached[160] = "";
    mc_model_config c;

    mc_status st = mc_check_output_dir(out_path, err);
    if (!st) st = mc_ckpt_open(ckpt_path, &r, err);
    if (st) goto out;
    const char *file = mc_ckpt_file(r);
    if ((st = mc_ckpt_read_model_config(r, &c, err))) goto out;
    const char *arch = arch_of(&c, file, err);
    if (!arch) {
        st = err ? err->code : MC_ERR_FORMAT;
        goto out;
    }
    /* experts: llama.cpp's llama with Mixtral's routing (softmax, top k,
     * renormalized; build_moe_ffn with norm_w) in every layer */
    int qwen = !strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe");
    if (c.num_experts > 0 && strcmp(arch, "llama") && !qwen) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: GGUF holds a mixture of experts as llama.cpp's llama (RMSNorm, "
                          "SwiGLU, RoPE); this model is %s",
                          file, arch);
        goto out;
    }
    /* llama.cpp's qwen3moe renormalizes the top k (as Mixtral) and has
     * experts in every layer: Mixtral's constraints */
    if (c.num_experts > 0 &&
        (st = hf_moe_check(&c, qwen ? "GGUF's qwen3moe architecture" : "GGUF's llama architecture",
                           "Qwen3MoeForCausalLM (--format hf)", 0, err))) {
        mc_error_prefix(err, "%s", file);
        goto out;
    }
    int llama = !strcmp(arch, "llama") || qwen;
    if (!mc_ckpt_has_tokenizer(r)) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: GGUF needs the tokenizer, and the checkpoint holds none (train "
                          "with --tokenizer-type and its files, or give mc-train a tokenizer)",
                          file);
        goto out;
    }
    if ((st = mc_ckpt_read_tokenizer(r, &tok, err))) goto out;
    if (mc_tokenizer_vocab_size(tok) > c.vocab_size) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: the tokenizer has %lld ids but the model only %lld", file,
                          (long long)mc_tokenizer_vocab_size(tok), (long long)c.vocab_size);
        goto out;
    }
    v.n = c.vocab_size;
    if ((st = mc_gguf_read_vocab(r, tok, &v, err))) goto out;
    int has_bias = mc_ckpt_has_tensor(r, "model/decoder.layers.0.self_attention.linear_qkv.bias");
    if (!has_bias && !llama) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: GGUF's gpt2 architecture needs the linear "
                          "layers' biases (the model has none)",
                          file);
        goto out;
    }
    if ((st = build_plan(&c, llama, ggml_of(o->type), has_bias, &p, err))) goto out;

    /* metadata */
    kv_str(&k, "general.architecture", arch);
    kv_str(&k, "general.name", o->name ? o->name : "mc");
    kv_u32(&k, "general.file_type", TYPE_FTYPE[o->type]);
    kv_u32(&k, "general.quantization_version", 2);
    kv_u32(&k, "general.alignment", GGUF_ALIGN);
    kv_arch(&k, arch, "context_length", (uint32_t)c.max_position_embeddings);
    kv_arch(&k, arch, "embedding_length", (uint32_t)c.hidden_size);
    kv_arch(&k, arch, "block_count", (uint32_t)c.num_layers);
    kv_arch(&k, arch, "feed_forward_length",
            (uint32_t)(c.num_experts > 0 && !qwen ? c.moe_ffn_hidden_size : c.ffn_hidden_size));
    if (c.num_experts > 0 && qwen) /* qwen3moe: the experts' own */
        kv_arch(&k, arch, "expert_feed_forward_length", (uint32_t)c.moe_ffn_hidden_size);
    if (c.num_experts > 0) {
        kv_arch(&k, arch, "expert_count", (uint32_t)c.num_experts);
        kv_arch(&k, arch, "expert_used_count", (uint32_t)c.moe_router_topk);
    }
    kv_arch(&k, arch, "attention.head_count", (uint32_t)c.num_attention_heads);
    kv_arch(&k, arch, "attention.head_count_kv", (uint32_t)c.num_query_groups);
    kv_arch(&k, arch, "vocab_size", (uint32_t)c.vocab_size);
    char name[128];
    snprintf(name, sizeof name, "%s.attention.layer_norm%s_epsilon", arch, llama ? "_rms" : "");
    kv_f32(&k, name, c.norm_epsilon);
    if (llama) {
        snprintf(name, sizeof name, "%s.rope.freq_base", arch);
        kv_f32(&k, name, c.rotary_base);
        kv_arch(&k, arch, "rope.dimension_count", (uint32_t)c.kv_channels);
        kv_arch(&k, arch, "attention.key_length", (uint32_t)c.kv_channels);
        kv_arch(&k, arch, "attention.value_length", (uint32_t)c.kv_channels);
    }
    put_tokenizer(&k, &v, mc_tokenizer_eod(tok), chat_eot(r, tok));
    put_chat_template(&k, r);

    /* header, metadata, tensor infos */
    kvbuf hd = {.b = MC_BUF_INIT, .err = err};
    put(&hd, "GGUF", 4);
    put_u32(&hd, GGUF_VERSION);
    put_u64(&hd, p.n);
    put_u64(&hd, k.n);
    put(&hd, k.b.data, k.b.len);
    for (size_t i = 0; i < p.n; i++) {
        const tplan *t = &p.t[i];
        put_str(&hd, t->name);
        put_u32(&hd, t->experts ? 3 : t->cols ? 2 : 1);
        if (t->cols) put_u64(&hd, (uint64_t)t->cols);
        put_u64(&hd, (uint64_t)(t->experts ? t->rows / t->experts : t->rows));
        if (t->experts) put_u64(&hd, (uint64_t)t->experts);
        put_u32(&hd, (uint32_t)t->ggml);
        put_u64(&hd, t->offset);
    }
    while (!hd.st && hd.b.len % GGUF_ALIGN) put(&hd, "", 1);
    head = hd.b;
    if ((st = k.st ? k.st : hd.st)) goto out;

    if ((st = mc_afile_open(&f, out_path, err))) goto out;
    f_open = 1;
    st = mc_afile_write(&f, head.data, head.len, err);
    for (size_t i = 0; i < p.n && !st; i++)
        st = write_tensor(r, &p, &p.t[i], &cache, cached, sizeof cached, &conv, &conv_cap, &f, err);
    if (!st) {
        st = mc_afile_commit(&f, err);
        f_open = 0;
    }
out:
    if (f_open) mc_afile_abort(&f);
    free(cache);
    free(conv);
    free(p.t);
    mc_buf_free(&k.b);
    mc_buf_free(&head);
    mc_gguf_vocab_free(&v);
    mc_tokenizer_free(tok);
    mc_ckpt_close(r);
    return st;
}
