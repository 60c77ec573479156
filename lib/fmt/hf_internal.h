/*
 * hf_internal.h - what the Hugging Face files of lib/fmt share (private):
 *   hf_map.c     the architecture of an mc model (GPT2LMHeadModel,
 *                LlamaForCausalLM or, with experts, MixtralForCausalLM),
 *                config.json both ways, and the tensor
 *                map between Megatron Core names and Hugging Face names
 *   hf_export.c  mc checkpoint -> Hugging Face directory
 *   hf_import.c  Hugging Face directory -> mc checkpoint
 *
 * The map is one table used in both directions. Each entry is one Hugging
 * Face tensor made of rows of one mc tensor: the rows listed in `ranges`,
 * in that order, form a matrix [rows, cols] in PyTorch's Linear layout
 * (out, in); GPT-2's Conv1D stores its transpose [cols, rows]. Export
 * gathers the rows, import scatters them back; mc rows no entry names (the
 * padding of the vocabulary) are zero on import.
 */
#ifndef MC_FMT_HF_INTERNAL_H
#define MC_FMT_HF_INTERNAL_H

#include <stdint.h>
#include <jansson.h>
#include "mc/model.h"
#include "mc/status.h"

/* Qwen3ForCausalLM and Qwen3MoeForCausalLM are the Llama family with
 * --qk-layernorm (their q_norm, k_norm), dense or with experts. */
typedef enum hf_arch {
    HF_GPT2 = 0,
    HF_LLAMA = 1,
    HF_MIXTRAL = 2,
    HF_QWEN3_MOE = 3,
    HF_QWEN3 = 4
} hf_arch;

/* "GPT2LMHeadModel", "LlamaForCausalLM", "MixtralForCausalLM",
 * "Qwen3MoeForCausalLM", "Qwen3ForCausalLM". */
const char *hf_arch_name(hf_arch a);

typedef struct hf_range {
    int64_t row0, n; /* rows [row0, row0 + n) of the mc tensor */
} hf_range;

typedef struct hf_entry {
    char hf[160];             /* Hugging Face name */
    char mc[128];             /* Megatron Core name (without "model/") */
    int64_t mc_rows, mc_cols; /* the mc tensor's global shape; cols 0 for 1-D */
    int64_t rows, cols;       /* the gathered matrix; cols 0 for 1-D */
    int transpose;            /* stored as [cols, rows] (GPT-2's Conv1D) */
    hf_range *ranges;
    int nranges;
} hf_entry;

typedef struct hf_map {
    hf_arch arch;
    hf_entry *e;
    size_t n, cap;
} hf_map;

/* The architecture that expresses c, or MC_ERR_FORMAT with the reason it
 * cannot be exported (what the format needs and what c has). */
mc_status hf_arch_for(const mc_model_config *c, hf_arch *out, mc_error *err);
/* A mixture of experts (c->num_experts > 0) as Mixtral's softmax top-k
 * renormalized experts in every layer (MixtralForCausalLM, GGUF's llama;
 * qwen 0), or as Qwen3-MoE's softmax top-k, renormalized or not, with
 * dense layers allowed (Qwen3MoeForCausalLM; qwen 1; GGUF's qwen3moe is
 * Mixtral's and takes qwen 0):
 * MC_OK, or MC_ERR_FORMAT "FMT (...) needs X; this model has Y", naming ALT
 * (the Qwen3-MoE format) where only it could hold Y. */
mc_status hf_moe_check(const mc_model_config *c, const char *fmt, const char *alt, int qwen,
                       mc_error *err);
/* The table for a finished config under arch (hf_arch_for's answer). */
mc_status hf_map_build(const mc_model_config *c, hf_arch arch, hf_map *m, mc_error *err);
void hf_map_free(hf_map *m);

/* config.json for c (eos_id < 0: no token ids); caller decrefs. */
json_t *hf_config_json(const mc_model_config *c, hf_arch arch, int64_t eos_id,
                       const char *torch_dtype);
/* Read a config.json (parsed) into an mc config (finished) and its
 * architecture; an architecture or field mc cannot express is
 * MC_ERR_FORMAT naming the field ("config.json: rope_scaling: ..."). */
mc_status hf_config_parse(const json_t *cfg, const char *where, mc_model_config *c, hf_arch *arch,
                          mc_error *err);

#endif
