/*
 * gguf.h - exporting an mc checkpoint to GGUF (version 3), the file format
 * of llama.cpp and ggml (layout and tensor mapping in mc-formats(5)).
 *
 * A GPT-family checkpoint (LayerNorm, GELU, learned positions) becomes
 * llama.cpp's architecture "gpt2", a Llama-family one (RMSNorm, RoPE,
 * SwiGLU) its "llama" (with experts: llama.cpp's Mixtral layout, routing
 * as Mixtral's or refused); any other mix is refused. The checkpoint's stored
 * tokenizer becomes tokenizer.ggml.* metadata (llama.cpp's "gpt2" BPE
 * model), so a checkpoint without one is refused.
 *
 * The chosen type applies to the 2-D weight matrices (token embeddings,
 * attention and MLP weights, the output layer). Norm weights, biases and
 * learned position embeddings stay f32, as llama.cpp's own converter keeps
 * them; a matrix whose row length is not a multiple of the 32-element block
 * of q8_0/q4_0 falls back to f16, as that converter does too, and one whose
 * rows are not a multiple of q4_K's 256-element super-block to q8_0 (or f16).
 */
#ifndef MC_GGUF_H
#define MC_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml's names for the weight types mc-export writes. */
typedef enum mc_gguf_type {
    MC_GGUF_F32 = 0,
    MC_GGUF_F16,
    MC_GGUF_BF16,
    MC_GGUF_Q8_0,
    MC_GGUF_Q4_0,
    MC_GGUF_Q4_K
} mc_gguf_type;

/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_K"; NULL for an unknown value. */
const char *mc_gguf_type_name(mc_gguf_type t);
/* Parse one of those names; MC_ERR_USAGE naming the choices otherwise. */
mc_status mc_gguf_type_parse(const char *s, mc_gguf_type *out, mc_error *err);

typedef struct mc_gguf_options {
    mc_gguf_type type; /* of the weight matrices (default f16) */
    const char *name;  /* general.name; NULL: "mc" */
} mc_gguf_options;

void mc_gguf_options_init(mc_gguf_options *o);

/* Write the checkpoint at ckpt_path (anything mc_ckpt_open takes) as the
 * GGUF file out_path, atomically: on any error nothing is left under
 * out_path nor beside it. Errors name the checkpoint or the output file. */
mc_status mc_export_gguf(const char *ckpt_path, const mc_gguf_options *o, const char *out_path,
                         mc_error *err);

/* The block codecs, exposed for tests. n is a multiple of 32; out holds
 * n / 32 blocks: q8_0 = fp16 scale + 32 int8 (34 bytes), q4_0 = fp16 scale +
 * 16 bytes of 4-bit values offset by 8, element j in the low nibble of byte
 * j and element j + 16 in its high nibble (18 bytes), as ggml lays them. */
void mc_gguf_quantize_q8_0(const float *x, size_t n, void *out);
void mc_gguf_quantize_q4_0(const float *x, size_t n, void *out);
/* q4_K: n a multiple of 256; out holds n / 256 super-blocks of 144 bytes:
 * fp16 d, fp16 dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes of
 * 4-bit values; x ~ d * sc_j * q - dmin * m_j in sub-block j of 32
 * (ggml's block_q4_K). The scales come from each sub-block's range, not
 * from ggml's weighted search. */
void mc_gguf_quantize_q4_K(const float *x, size_t n, void *out);
/* IEEE half and bfloat16, rounded to nearest even. */
uint16_t mc_gguf_f32_to_f16(float f);
uint16_t mc_gguf_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif
#endif
