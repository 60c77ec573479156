/*
 * llmc.h - llm.c's GPT-2 model file (train_gpt2.c, train_gpt2.cu):
 * a header of 256 int32 [20240326, version, maxT, V, L, NH, C, Vp, 0...],
 * version 3 (fp32 parameters) or 5 (bf16), then the parameters in llm.c's
 * order and Linear layouts, the vocabulary padded to Vp rows of zeros.
 * Layout in mc-formats(5). Implemented in lib/fmt/llmc.c.
 */
#ifndef MC_LLMC_H
#define MC_LLMC_H

#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MC_LLMC_MAGIC 20240326
#define MC_LLMC_VERSION_FP32 3
#define MC_LLMC_VERSION_BF16 5
/* llm.c pads the vocabulary to a multiple of this (50257 -> 50304). */
#define MC_LLMC_VOCAB_MULTIPLE 128

/* Export the checkpoint at ckpt (any path mc_ckpt_open takes) to the file
 * out, atomically. dtype: -1 follows the checkpoint (bf16 when its word
 * embeddings are stored in bf16, else fp32), or MC_CKPT_FLOAT32 /
 * MC_CKPT_BFLOAT16 (anything else is MC_ERR_USAGE). A model llm.c's GPT-2
 * cannot run (not LayerNorm + GELU + learned positions + biases + tied
 * embeddings with an MLP of 4 x hidden, head dim hidden / heads and
 * LayerNorm epsilon 1e-5, as llm.c hard-codes them) is MC_ERR_FORMAT with
 * the reason. */
mc_status mc_llmc_export(const char *ckpt, const char *out, int dtype, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
