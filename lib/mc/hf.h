/*
 * hf.h - Hugging Face model directories (config.json + *.safetensors,
 * sharded or not) of the GPT-2 (GPT2LMHeadModel) and Llama
 * (LlamaForCausalLM) architectures, in and out of mc checkpoints.
 * Implemented in lib/fmt/hf_*.c; layouts in mc-formats(5).
 */
#ifndef MC_HF_H
#define MC_HF_H

#include <stddef.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when path is a directory holding config.json and at least one
 * *.safetensors file (what mc-reshard takes as a Hugging Face model). */
int mc_hf_is_model_dir(const char *path);

/* Import the model in hf_dir as the mc checkpoint ckpt_dir/iter_0000000
 * (weights only, stored in the source dtype, the tokenizer.json stored as
 * the checkpoint's tokenizer when present). The iteration directory goes
 * to out_path. An architecture mc cannot express is MC_ERR_FORMAT naming
 * the config.json field. */
mc_status mc_hf_import(const char *hf_dir, const char *ckpt_dir, char *out_path, size_t cap,
                       mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
