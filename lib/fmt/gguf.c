/*
 * gguf.c - GGUF version 3 export of an mc checkpoint for llama.cpp: the
 * file layout, the mapping from Megatron Core's tensors to llama.cpp's, the
 * element codecs (f16, bf16, q8_0, q4_0) and the tokenizer metadata.
 *
 * File layout (all little-endian):
 *   "GGUF" u32 version=3, u64 n_tensors, u64 n_kv
 *   n_kv x (string key, u32 value type, value)      string = u64 length + bytes
 *   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
 *                u64 offset from the start of the data section)
 *   zero padding to general.alignment (32), then the data section, each
 *   tensor at an offset that is a multiple of 32.
 * ggml numbers dimensions fastest first, so a row-major [rows, cols] matrix
 * is ne = {cols, rows}.
 *
 * Tensor mapping (Megatron Core name -> llama.cpp name):
 *   embedding.word_embeddings.weight [Vpad, C]   token_embd.weight, first V rows
 *   embedding.position_embeddings.weight         position_embd.weight (gpt2, f32)
 *   L.self_attention.linear_qkv.layer_norm_*     blk.L.attn_norm.{weight,bias}
 *   L.self_attention.linear_qkv.{weight,bias}    gpt2: blk.L.attn_qkv, rows regrouped
 *                                                from per-group [q.., k, v] to [Q; K; V]
 *                                                llama: blk.L.attn_{q,k,v}, q and k rows
 *                                                permuted within each head (below)
 *   L.self_attention.linear_proj                 blk.L.attn_output
 *   L.mlp.linear_fc1.layer_norm_*                blk.L.ffn_norm
 *   L.mlp.linear_fc1 [F or 2F, C]                gpt2: blk.L.ffn_up; llama: [gate; up] ->
 *                                                blk.L.ffn_gate, blk.L.ffn_up
 *   L.mlp.linear_fc2                             blk.L.ffn_down
 *   decoder.final_layernorm                      output_norm
 *   output_layer.weight                          output.weight (untied only; tied
 *                                                models let llama.cpp reuse token_embd)
 * RoPE: mc (like Megatron and Hugging Face) rotates the pairs (i, i + D/2)
 * of each head; llama.cpp's "llama" rotates adjacent pairs (2i, 2i + 1).
 * Row 2i + s of a head in the file is therefore row s * D/2 + i of mc's
 * head, the permutation llama.cpp's converter applies to q_proj/k_proj.
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
#include "mc/json.h"
#include "mc/pretok.h"
#include "mc/tokenizer.h"

#define GGUF_VERSION 3
#define GGUF_ALIGN 32
#define QK 32 /* elements per q8_0 / q4_0 block */

/* GGUF metadata value types. */
enum { KV_U32 = 4, KV_I32 = 5, KV_F32 = 6, KV_BOOL = 7, KV_STRING = 8, KV_ARRAY = 9 };
/* ggml tensor types. */
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8, GGML_BF16 = 30 };
/* llama.cpp's token types. */
enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5 };

static const char *const TYPE_NAMES[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
static const int TYPE_GGML[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0};
/* general.file_type: llama.cpp's llama_ftype (ALL_F32, MOSTLY_F16, MOSTLY_BF16,
 * MOSTLY_Q8_0, MOSTLY_Q4_0). */
static const uint32_t TYPE_FTYPE[] = {0, 1, 32, 7, 2};

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
                        "--dtype '%s' is not a GGUF type (f32, f16, bf16, q8_0 or q4_0)",
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
    if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00); /* NaN stays a (quiet) NaN */
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

static int ggml_of(int t) { return TYPE_GGML[t]; }

/* Bytes of a tensor of rows x cols elements (cols: the row length) stored as
 * ggml type g. */
static uint64_t tensor_bytes(int g, int64_t rows, int64_t cols)
{
    uint64_t n = (uint64_t)rows * (uint64_t)cols;
    switch (g) {
    case GGML_F32: return 4 * n;
    case GGML_F16: case GGML_BF16: return 2 * n;
    case GGML_Q8_0: return n / QK * (2 + QK);
    default: return n / QK * (2 + QK / 2);
    }
}

/* ------------------------------------------------------------ the tensor plan */

typedef enum xform {
    X_COPY,   /* rows [0, rows) of the source as they are */
    X_QKV,    /* gpt2: Megatron's per-group [q.., k, v] -> [all q; all k; all v] */
    X_Q, X_K, /* llama: one part of the QKV, rows permuted for adjacent RoPE pairs */
    X_V,
    X_GATE,   /* llama: first half of SwiGLU's fc1 */
    X_UP      /* llama: second half */
} xform;

typedef struct tplan {
    char name[64];   /* llama.cpp's name */
    char src[160];   /* "model/<Megatron Core name>" */
    xform x;
    int64_t rows, cols;         /* in the file; cols 0: 1-D */
    int64_t src_rows, src_cols; /* the stored global tensor (cols 0: 1-D) */
    int ggml;
    uint64_t offset, bytes;
} tplan;

typedef struct plan {
    tplan *t;
    size_t n, cap;
    int64_t Q, G, D;   /* heads, query groups, head dim */
    int fallback;      /* matrices written f16 because their rows do not fill blocks */
} plan;

static mc_status plan_add(plan *p, const char *name, const char *src, xform x, int64_t rows,
                          int64_t cols, int64_t src_rows, int64_t src_cols, int ggml,
                          mc_error *err)
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
    } else if ((ggml == GGML_Q8_0 || ggml == GGML_Q4_0) && cols % QK) {
        t->ggml = GGML_F16;
        p->fallback++;
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
    if (llama) return "llama";
    mc_error_set(err, MC_ERR_FORMAT,
                 "%s: GGUF has no architecture for this model (%s, %s, %s positions): llama.cpp "
                 "reads GPT (LayerNorm, GELU, learned positions) as gpt2 and Llama (RMSNorm, "
                 "SwiGLU, RoPE) as llama",
                 file, c->normalization == MC_NORM_RMSNORM ? "RMSNorm" : "LayerNorm",
                 c->swiglu ? "SwiGLU" : "GELU",
                 c->position_embedding_type == MC_POS_ROPE ? "RoPE" : "learned");
    return NULL;
}

static mc_status build_plan(const mc_model_config *c, int llama, int ggml, int has_bias,
                            plan *p, mc_error *err)
{
    int64_t C = c->hidden_size, V = c->vocab_size, Vp = c->padded_vocab_size;
    int64_t Q = c->num_attention_heads, G = c->num_query_groups, D = c->kv_channels;
    int64_t F = c->ffn_hidden_size, QKV = (Q + 2 * G) * D;
    p->Q = Q;
    p->G = G;
    p->D = D;
    mc_status st = plan_add(p, "token_embd.weight", "embedding.word_embeddings.weight", X_COPY, V,
                            C, Vp, C, ggml, err);
    if (!st && !llama) /* f32 whatever the type, as llama.cpp's converter does */
        st = plan_add(p, "position_embd.weight", "embedding.position_embeddings.weight", X_COPY,
                      c->max_position_embeddings, C, c->max_position_embeddings, C, GGML_F32,
                      err);
    char n[64], s[160];
#define ADD(X, R, CO, SR, SC)                                                          \
    do {                                                                               \
        if (!st) st = plan_add(p, n, s, X, R, CO, SR, SC, ggml, err);                 \
    } while (0)
#define NAMES(gg, mm) (snprintf(n, sizeof n, "blk.%d." gg, l), snprintf(s, sizeof s, "decoder.layers.%d." mm, l))
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
        NAMES("attn_output.weight", "self_attention.linear_proj.weight");
        ADD(X_COPY, C, Q * D, C, Q * D);
        if (has_bias) {
            NAMES("attn_output.bias", "self_attention.linear_proj.bias");
            ADD(X_COPY, C, 0, C, 0);
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
    if (c->untie_embeddings_and_output_weights) {
        snprintf(n, sizeof n, "output.weight");
        snprintf(s, sizeof s, "output_layer.weight");
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

/* The source row of row r of the file's tensor. */
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
        int64_t within = s * (D / 2) + i; /* row of mc's head */
        if (t->x == X_Q) return (h / per) * grp + (h % per) * D + within;
        return h * grp + per * D + within;
    }
    case X_V: return (r / D) * grp + (per + 1) * D + r % D;
    case X_GATE: return r;
    case X_UP: return t->rows + r;
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

/* ------------------------------------------------------------ tokenizer */

/* GPT-2's byte-level alphabet: the printable bytes stand for themselves,
 * the others for U+0100 onwards in byte order. */
static void bytelevel_table(char tab[256][3])
{
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b
                                                                                  : 256 + extra++;
        if (cp < 0x80) {
            tab[b][0] = (char)cp;
            tab[b][1] = 0;
        } else {
            tab[b][0] = (char)(0xc0 | cp >> 6);
            tab[b][1] = (char)(0x80 | (cp & 0x3f));
            tab[b][2] = 0;
        }
    }
}

typedef struct vocab {
    int64_t n;
    char **tok;      /* the GGUF spelling of each id; NULL: no token */
    int32_t *type;
    char **merges;   /* "left right", byte-level spellings */
    size_t n_merges, cap_merges;
    const char *pre; /* tokenizer.ggml.pre */
} vocab;

static void vocab_free(vocab *v)
{
    for (int64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    for (size_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->type);
    free(v->merges);
}

static mc_status add_merge(vocab *v, const char *a, size_t na, const char *b, size_t nb,
                           const char *where, mc_error *err)
{
    if (memchr(a, ' ', na) || memchr(b, ' ', nb) || !na || !nb)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: merge %zu has a token with a space or an empty token, which "
                            "GGUF's \"left right\" merges cannot express",
                            where, v->n_merges);
    if (v->n_merges == v->cap_merges) {
        size_t cap = v->cap_merges ? 2 * v->cap_merges : 1024;
        char **m = realloc(v->merges, cap * sizeof *m);
        if (!m) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        v->merges = m;
        v->cap_merges = cap;
    }
    char *s = malloc(na + nb + 2);
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    memcpy(s, a, na);
    s[na] = ' ';
    memcpy(s + na + 1, b, nb);
    s[na + nb + 1] = 0;
    v->merges[v->n_merges++] = s;
    return MC_OK;
}

/* Set id's spelling (raw bytes in the byte-level alphabet when bytelevel). */
static mc_status set_token(vocab *v, int64_t id, const char *s, size_t len, int bytelevel,
                           const char tab[256][3], int32_t type, mc_error *err)
{
    if (id < 0 || id >= v->n) return MC_OK; /* checked by the caller where it matters */
    char *t = malloc(bytelevel ? 2 * len + 1 : len + 1);
    if (!t) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (bytelevel) {
            const char *u = tab[(unsigned char)s[i]];
            while (*u) t[k++] = *u++;
        } else {
            t[k++] = s[i];
        }
    }
    t[k] = 0;
    free(v->tok[id]);
    v->tok[id] = t;
    v->type[id] = type;
    return MC_OK;
}

/* The pre-tokenizer llama.cpp runs for a regex mc splits with. */
static const char *pre_of(const char *pattern)
{
    if (!strcmp(pattern, MC_PATTERN_GPT2)) return "gpt-2";
    if (!strcmp(pattern, MC_PATTERN_LLAMA3)) return "llama-bpe";
    if (!strcmp(pattern, MC_PATTERN_TIKTOKEN_V2)) return "tekken";
    return NULL;
}

/* tokenizer.json: vocabulary, added tokens, merges, pre-tokenizer. */
static mc_status vocab_hf(vocab *v, const char *data, size_t len, const char *where,
                          mc_error *err)
{
    json_t *root = NULL;
    mc_status st = mc_json_load_buf(where, data, len, &root, err);
    if (st) return st;
    json_t *model = json_object_get(root, "model");
    json_t *vj = json_object_get(model, "vocab"), *mj = json_object_get(model, "merges");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vj) || !json_is_array(mj)) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: model: GGUF export needs a BPE model with "
                                              "vocab and merges", where);
        goto out;
    }
    /* The pre-tokenizer: ByteLevel with its own (GPT-2) regex, or a Split
     * on a regex before a ByteLevel that only maps bytes. */
    json_t *pt = json_object_get(root, "pre_tokenizer");
    const char *ptype = json_string_value(json_object_get(pt, "type"));
    const char *pattern = NULL;
    if (ptype && !strcmp(ptype, "ByteLevel")) {
        pattern = MC_PATTERN_GPT2;
    } else if (ptype && !strcmp(ptype, "Sequence")) {
        json_t *sp = json_array_get(json_object_get(pt, "pretokenizers"), 0);
        json_t *pat = json_object_get(sp, "pattern");
        pattern = json_string_value(json_object_get(pat, "Regex"));
        if (!pattern) pattern = json_string_value(json_object_get(pat, "String"));
    }
    v->pre = pattern ? pre_of(pattern) : NULL;
    if (!v->pre) {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: pre_tokenizer: llama.cpp has no pre-tokenizer for this one (mc "
                          "exports the GPT-2 and Llama-3 patterns as \"gpt-2\" and \"llama-bpe\")",
                          where);
        goto out;
    }
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: normalizer: llama.cpp's BPE tokenizer runs "
                                              "none, so this tokenizer cannot be exported", where);
        goto out;
    }
    const char *k;
    json_t *val;
    json_object_foreach(vj, k, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= v->n) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: model.vocab: token id of \"%s\" is not in [0, %lld)", where, k,
                              (long long)v->n);
            goto out;
        }
        /* already spelled in the byte-level alphabet */
        if ((st = set_token(v, id, k, strlen(k), 0, NULL, TOK_NORMAL, err))) goto out;
    }
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, val) {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        if (!content || id < 0 || id >= v->n) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s: added_tokens[%zu]: no content or an id not in [0, %lld)",
                              where, i, (long long)v->n);
            goto out;
        }
        int special = json_is_true(json_object_get(val, "special"));
        if ((st = set_token(v, id, content, strlen(content), 0, NULL,
                            special ? TOK_CONTROL : TOK_USER_DEFINED, err)))
            goto out;
    }
    json_array_foreach(mj, i, val) {
        char where2[1200];
        snprintf(where2, sizeof where2, "%s: model.merges", where);
        if (json_is_string(val)) {
            const char *s = json_string_value(val), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = mc_error_set(err, MC_ERR_FORMAT, "%s[%zu]: expected \"left right\"", where2, i);
                goto out;
            }
            st = add_merge(v, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), where2, err);
        } else {
            const char *a = json_string_value(json_array_get(val, 0));
            const char *b = json_string_value(json_array_get(val, 1));
            if (!a || !b) {
                st = mc_error_set(err, MC_ERR_FORMAT, "%s[%zu]: expected [left, right]", where2, i);
                goto out;
            }
            st = add_merge(v, a, strlen(a), b, strlen(b), where2, err);
        }
        if (st) goto out;
    }
out:
    json_decref(root);
    return st;
}

/* GPT2BPETokenizer: vocab.json and merges.txt (GPT-2's regex). */
static mc_status vocab_gpt2(vocab *v, const mc_tokenizer *tok, const char *vdata, size_t vlen,
                            const char *mdata, size_t mlen, const char *where, mc_error *err)
{
    json_t *root = NULL;
    mc_status st = mc_json_load_buf(where, vdata, vlen, &root, err);
    if (st) return st;
    const char *k;
    json_t *val;
    int32_t eod = mc_tokenizer_eod(tok);
    json_object_foreach(root, k, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= v->n) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: vocab: token id of \"%s\" is not in [0, %lld)",
                              where, k, (long long)v->n);
            break;
        }
        if ((st = set_token(v, id, k, strlen(k), 0, NULL, id == eod ? TOK_CONTROL : TOK_NORMAL,
                            err)))
            break;
    }
    json_decref(root);
    v->pre = "gpt-2";
    const char *p = mdata, *end = mdata + mlen;
    for (size_t line = 1; p < end && !st; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        size_t n = (size_t)(e - p);
        if (n && p[n - 1] == '\r') n--;
        if (n && !(line == 1 && n >= 8 && !memcmp(p, "#version", 8))) {
            const char *sp = memchr(p, ' ', n);
            char where2[1200];
            snprintf(where2, sizeof where2, "%s: merges:%zu", where, line);
            if (!sp) st = mc_error_set(err, MC_ERR_FORMAT, "%s: expected \"left right\"", where2);
            else st = add_merge(v, p, (size_t)(sp - p), sp + 1, n - (size_t)(sp - p) - 1, where2, err);
        }
        p = e + 1;
    }
    return st;
}

/* TikTokenizer: token bytes from the loaded tokenizer; the merges are the
 * ones tiktoken's rank rule implies: the two parts that BPE, allowed only
 * merges of lower rank, leaves of each token (what llama.cpp's converter
 * derives for tiktoken vocabularies). */
typedef struct tkent {
    const char *s;
    size_t len;
    int64_t rank;
} tkent;

static int tk_cmp(const void *a, const void *b)
{
    const tkent *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int64_t tk_rank(const tkent *sorted, size_t n, const char *s, size_t len)
{
    tkent key = {s, len, 0};
    const tkent *e = bsearch(&key, sorted, n, sizeof *e, tk_cmp);
    return e ? e->rank : -1;
}

static mc_status vocab_tiktoken(vocab *v, const mc_tokenizer *tok, int64_t nspecial,
                                const char *pattern, const char *where, mc_error *err)
{
    char tab[256][3];
    bytelevel_table(tab);
    v->pre = pre_of(pattern);
    if (!v->pre)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s: llama.cpp has no pre-tokenizer for this TikTokenizer pattern (mc "
                            "exports tiktoken v2 as \"tekken\")",
                            where);
    mc_buf all = MC_BUF_INIT;
    size_t *off = calloc((size_t)v->n + 1, sizeof *off);
    tkent *ents = calloc((size_t)v->n, sizeof *ents);
    mc_status st = off && ents ? MC_OK : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    size_t n_ents = 0;
    for (int64_t id = 0; id < v->n && !st; id++) {
        int32_t i32 = (int32_t)id;
        size_t before = all.len;
        mc_error e2 = {0};
        off[id] = before;
        if (mc_decode(tok, &i32, 1, &all, &e2)) { /* no token: a padding id */
            off[id + 1] = all.len;
            continue;
        }
        off[id + 1] = all.len;
        st = set_token(v, id, all.data + before, all.len - before, id >= nspecial, tab,
                       id < nspecial ? TOK_CONTROL : TOK_NORMAL, err);
    }
    for (int64_t id = nspecial; id < v->n && !st; id++)
        if (v->tok[id]) ents[n_ents++] = (tkent){NULL, off[id + 1] - off[id], id - nspecial};
    for (size_t i = 0; i < n_ents; i++) ents[i].s = all.data + off[ents[i].rank + nspecial];
    if (!st) qsort(ents, n_ents, sizeof *ents, tk_cmp);
    /* by rank: a token's merge must come after those of its parts */
    size_t *cut = NULL;
    for (int64_t id = nspecial; id < v->n && !st; id++) {
        if (!v->tok[id]) continue;
        const char *s = all.data + off[id];
        size_t len = off[id + 1] - off[id], np = len;
        int64_t rank = id - nspecial;
        if (len < 2) continue;
        free(cut);
        cut = malloc((len + 1) * sizeof *cut); /* part k is [cut[k], cut[k+1]) */
        if (!cut) {
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            break;
        }
        for (size_t k = 0; k <= len; k++) cut[k] = k;
        while (np > 2) {
            int64_t best = -1;
            size_t bk = 0;
            for (size_t k = 0; k + 1 < np; k++) {
                int64_t r = tk_rank(ents, n_ents, s + cut[k], cut[k + 2] - cut[k]);
                if (r >= 0 && r < rank && (best < 0 || r < best)) {
                    best = r;
                    bk = k;
                }
            }
            if (best < 0) break;
            memmove(cut + bk + 1, cut + bk + 2, (np - bk - 1) * sizeof *cut);
            np--;
        }
        if (np != 2) continue; /* not reachable by merges: llama.cpp reaches it whole */
        char a[1024], b[1024];
        size_t na = 0, nb = 0;
        for (size_t k = cut[0]; k < cut[1] && na + 3 < sizeof a; k++)
            for (const char *u = tab[(unsigned char)s[k]]; *u; u++) a[na++] = *u;
        for (size_t k = cut[1]; k < cut[2] && nb + 3 < sizeof b; k++)
            for (const char *u = tab[(unsigned char)s[k]]; *u; u++) b[nb++] = *u;
        st = add_merge(v, a, na, b, nb, where, err);
    }
    free(cut);
    free(off);
    free(ents);
    mc_buf_free(&all);
    return st;
}

/* Read the checkpoint's tokenizer into v (v->n ids: the model's vocab_size). */
static mc_status read_vocab(mc_ckpt_reader *r, const mc_tokenizer *tok, vocab *v, mc_error *err)
{
    const char *file = mc_ckpt_file(r);
    json_t *meta = NULL;
    mc_status st = mc_ckpt_read_json(r, "tokenizer", &meta, err);
    if (st) return st;
    const char *type = json_string_value(json_object_get(meta, "type"));
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    v->type = calloc((size_t)v->n, sizeof *v->type);
    if (!v->tok || !v->type) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    char where[1024];
    if (st) {
    } else if (type && !strcmp(type, "HuggingFaceTokenizer")) {
        snprintf(where, sizeof where, "%s: tokenizer_model", file);
        st = mc_ckpt_read_tokenizer_file(r, "model", &a, &na, err);
        if (!st) st = vocab_hf(v, a, na, where, err);
    } else if (type && !strcmp(type, "GPT2BPETokenizer")) {
        snprintf(where, sizeof where, "%s: tokenizer_vocab", file);
        st = mc_ckpt_read_tokenizer_file(r, "vocab", &a, &na, err);
        if (!st) st = mc_ckpt_read_tokenizer_file(r, "merges", &b, &nb, err);
        if (!st) st = vocab_gpt2(v, tok, a, na, b, nb, where, err);
    } else if (type && !strcmp(type, "TikTokenizer")) {
        const char *pname = json_string_value(json_object_get(meta, "tiktoken_pattern"));
        const char *pattern = mc_pattern_by_name(pname && !strcmp(pname, "v1") ? "tiktoken-v1"
                                                                                : "tiktoken-v2");
        json_int_t nsp = json_integer_value(json_object_get(meta, "tiktoken_num_special_tokens"));
        snprintf(where, sizeof where, "%s: tokenizer_model", file);
        st = vocab_tiktoken(v, tok, nsp, pattern, where, err);
    } else {
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s: GGUF needs a BPE tokenizer, and the checkpoint's is %s", file,
                          type ? type : "of no known type");
    }
    free(a);
    free(b);
    json_decref(meta);
    return st;
}

static void put_tokenizer(kvbuf *k, const vocab *v, int32_t eod)
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
        kv_u32(k, "tokenizer.ggml.eot_token_id", (uint32_t)eod);
    }
    /* mc trains without a BOS token: llama.cpp must not add one (its
     * llama-bpe and tekken pre-tokenizers would by default) */
    kv_bool(k, "tokenizer.ggml.add_bos_token", 0);
    kv_bool(k, "tokenizer.ggml.add_eos_token", 0);
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
    if (strcmp(cached, t->src) || t->x == X_COPY) {
        free(*cache);
        *cache = malloc((size_t)(rows_read * src_cols) * sizeof **cache);
        cached[0] = 0;
        if (!*cache) return mc_error_set(err, MC_ERR_NOMEM, "out of memory for %s", t->src);
        st = mc_ckpt_read_tensor(r, t->src, t->src_rows, t->src_cols, 0, 0, rows_read,
                                 t->src_cols, *cache, err);
        if (st) return st;
        if (t->x != X_COPY) snprintf(cached, cached_cap, "%s", t->src);
    }
    /* gather the rows in the file's order */
    size_t n = (size_t)(t->rows * cols);
    float *x = *cache;
    float *tmp = NULL;
    if (t->x != X_COPY) {
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
    case GGML_F16: for (size_t i = 0; i < n; i++) h[i] = mc_gguf_f32_to_f16(x[i]); break;
    case GGML_BF16: for (size_t i = 0; i < n; i++) h[i] = mc_gguf_f32_to_bf16(x[i]); break;
    case GGML_Q8_0: mc_gguf_quantize_q8_0(x, n, *conv); break;
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
    vocab v = {0};
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
    int llama = !strcmp(arch, "llama");
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
    if ((st = read_vocab(r, tok, &v, err))) goto out;
    int has_bias = mc_ckpt_has_tensor(r, "model/decoder.layers.0.self_attention.linear_qkv.bias");
    if (!has_bias && !llama) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: GGUF's gpt2 architecture needs the linear "
                                              "layers' biases (the model has none)", file);
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
    kv_arch(&k, arch, "feed_forward_length", (uint32_t)c.ffn_hidden_size);
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
    put_tokenizer(&k, &v, mc_tokenizer_eod(tok));

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
        put_u32(&hd, t->cols ? 2 : 1);
        if (t->cols) put_u64(&hd, (uint64_t)t->cols);
        put_u64(&hd, (uint64_t)t->rows);
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
        st = write_tensor(r, &p, &p.t[i], &cache, cached, sizeof cached, &conv, &conv_cap, &f,
                          err);
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
    vocab_free(&v);
    mc_tokenizer_free(tok);
    mc_ckpt_close(r);
    return st;
}
