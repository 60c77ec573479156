/*
 * hf.h - Hugging Face model directories (config.json + *.safetensors,
 * sharded or not) of the GPT-2 (GPT2LMHeadModel), Llama (LlamaForCausalLM)
 * and Mixtral (MixtralForCausalLM, mixtures of experts) architectures, in
 * and out of mc checkpoints.
 * Implemented in lib/fmt/hf_*.c; layouts in mc-formats(5).
 */
#ifndef MC_HF_H
#define MC_HF_H

#include <stddef.h>
#include <stdint.h>
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

/* ------------------------------------------------------------ export */

typedef struct mc_hf_export_options {
    /* Stored dtype of every tensor: -1 keeps each tensor's dtype in the
     * checkpoint; else an mc_ckpt_dtype (MC_CKPT_FLOAT32, ...). */
    int dtype;
    /* Largest shard in bytes (0: one file). Default 5 GB, as transformers'
     * save_pretrained. */
    uint64_t max_shard_size;
    /* Told, one line each, what the export leaves out and why (a tokenizer
     * transformers cannot read); NULL: nobody is told. */
    void (*note)(void *ctx, const char *msg);
    void *note_ctx;
} mc_hf_export_options;

void mc_hf_export_options_init(mc_hf_export_options *o);

/* Export the checkpoint at ckpt (any path mc_ckpt_open takes) as the
 * Hugging Face directory out_dir: config.json, model.safetensors (or
 * shards and model.safetensors.index.json), generation_config.json and the
 * tokenizer's files, as GPT2LMHeadModel (learned positions),
 * LlamaForCausalLM (rotary positions) or MixtralForCausalLM (experts). A
 * model none can express is MC_ERR_FORMAT with the reason. The directory
 * is written under a temporary name beside out_dir and renamed into place;
 * an existing out_dir is replaced only when it holds nothing but files an
 * export writes. */
mc_status mc_hf_export(const char *ckpt, const char *out_dir, const mc_hf_export_options *o,
                       mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
