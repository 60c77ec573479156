/*
 * model.h - GPT- and Llama-family decoder-only transformers built from
 * parallel layers (column/row-parallel linears, vocab-parallel embedding and
 * cross-entropy, heads split over tensor parallelism).
 *
 * The model owns its parameters, their gradients and its activations, all
 * in backend memory. Parameters live in one contiguous fp32 buffer and
 * gradients in another (same order), so the optimizer and the gradient norm
 * run over one span. Each parameter is described by an mc_param with its
 * Megatron Core state-dict name and its global shape; a checkpoint stores
 * the global tensors and a grid is only a loading concern.
 */
#ifndef MC_MODEL_H
#define MC_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "mc/comm.h"
#include "mc/kern.h"
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest --moe-layer-freq list (layers). */
#define MC_MOE_MAX_LAYERS 512

typedef enum mc_norm_kind { MC_NORM_LAYERNORM = 0, MC_NORM_RMSNORM = 1 } mc_norm_kind;
typedef enum mc_pos_kind { MC_POS_LEARNED = 0, MC_POS_ROPE = 1 } mc_pos_kind;

/* The architecture, in Megatron's terms (its flag names in comments). */
typedef struct mc_model_config {
    int num_layers;          /* --num-layers */
    int hidden_size;         /* --hidden-size */
    int num_attention_heads; /* --num-attention-heads */
    int num_query_groups;    /* --num-query-groups (== heads without --group-query-attention) */
    int ffn_hidden_size;     /* --ffn-hidden-size (0: 4 * hidden, or Llama's rule with --swiglu) */
    int kv_channels;         /* head dim; 0: hidden / heads */
    int seq_length;          /* --seq-length */
    int max_position_embeddings;         /* --max-position-embeddings */
    int64_t vocab_size;                  /* the tokenizer's size, before padding */
    int make_vocab_size_divisible_by;    /* --make-vocab-size-divisible-by (default 128) */
    int64_t padded_vocab_size;           /* computed by mc_model_config_finish */
    mc_norm_kind normalization;          /* --normalization LayerNorm|RMSNorm */
    float norm_epsilon;                  /* --norm-epsilon (1e-5) */
    int swiglu;                          /* --swiglu */
    mc_pos_kind position_embedding_type; /* --position-embedding-type learned_absolute|rope */
    float rotary_base;                   /* --rotary-base (10000) */
    float rotary_percent;                /* --rotary-percent (1): the head dims rotated */
    /* --use-rope-scaling: Llama 3.1's RoPE frequency scaling (mc_rope in
     * mc/kern.h), with --rope-scaling-factor (8), the low and high
     * frequency factors (1, 4) and the original context (8192) */
    int use_rope_scaling;
    float rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    int untie_embeddings_and_output_weights; /* --untie-embeddings-and-output-weights */
    int add_bias_linear;                     /* 0 with --disable-bias-linear */
    /* --qk-layernorm: each head's query and key normalized (the model's
     * normalization over the head dimension, weights [kv_channels] shared
     * by the heads) after the QKV projection and before RoPE */
    int qk_layernorm;
    float init_method_std; /* --init-method-std (0.02) */
    /* --sequence-parallel: with tensor parallelism, the residual stream,
     * the norms and the embeddings' output hold seq_length / tp positions of
     * every sequence per rank (doc/ARCHITECTURE.md, "The model"); needs
     * seq_length % tp == 0. Ignored at tp = 1, as Megatron turns it off there. */
    int sequence_parallel;
    /* --cp-comm-type under context parallelism (the grid's cp > 1; not an
     * architecture: checkpoints do not record it): MC_CP_P2P, ring
     * attention, or MC_CP_A2A, Ulysses' all-to-all (doc/ARCHITECTURE.md,
     * "Context parallelism"). */
    int cp_comm_type;
    /* --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers:
     * layers on the first / last pipeline stage (0: the even split; see
     * mc_model_stage_layers). */
    int decoder_first_pipeline_num_layers;
    int decoder_last_pipeline_num_layers;
    /* --num-layers-per-virtual-pipeline-stage N (0: none): the interleaved
     * schedule; each pipeline rank p holds v = num_layers / (pp * N) model
     * chunks, chunk c being layers [(c * pp + p) * N, + N) (Megatron's
     * virtual pipeline stages; see mc_model_chunk_layers). */
    int num_layers_per_virtual_pipeline_stage;
    /* Mixture of experts (doc/ARCHITECTURE.md, "The MoE layer"), Megatron's
     * flags; num_experts 0: every layer dense. A MoE layer's MLP is a
     * router and num_experts experts (each an MLP of moe_ffn_hidden_size,
     * SwiGLU or GELU as the dense one), each token through its top
     * moe_router_topk experts, their outputs weighted by the router's
     * probabilities. */
    int num_experts;                      /* --num-experts */
    int moe_ffn_hidden_size;              /* --moe-ffn-hidden-size (0: ffn_hidden_size) */
    int moe_router_topk;                  /* --moe-router-topk (2) */
    int moe_router_score_sigmoid;         /* --moe-router-score-function sigmoid (else softmax) */
    int moe_router_pre_softmax;           /* --moe-router-pre-softmax */
    float moe_router_topk_scaling_factor; /* --moe-router-topk-scaling-factor (0: none) */
    int moe_router_num_groups;            /* --moe-router-num-groups (0: none) */
    int moe_router_group_topk;            /* --moe-router-group-topk */
    int moe_router_enable_expert_bias;    /* --moe-router-enable-expert-bias */
    float moe_router_bias_update_rate;    /* --moe-router-bias-update-rate (1e-3) */
    int moe_load_balancing;               /* --moe-router-load-balancing-type: MC_MOE_LB_* */
    float moe_aux_loss_coeff;             /* --moe-aux-loss-coeff (0) */
    float moe_z_loss_coeff;               /* --moe-z-loss-coeff (0: none) */
    int moe_shared_expert_intermediate_size; /* --moe-shared-expert-intermediate-size (0) */
    float moe_expert_capacity_factor;        /* --moe-expert-capacity-factor (0: no dropping) */
    int moe_token_drop_position;             /* --moe-token-drop-policy position (else probs) */
    int moe_pad_expert_input_to_capacity;    /* --moe-pad-expert-input-to-capacity */
    /* --moe-token-dispatcher-type allgather (else alltoall): how tokens
     * reach their experts under expert parallelism; a run's choice, not
     * stored in checkpoints */
    int moe_token_dispatcher_allgather;
    /* --expert-tensor-parallel-size: 0 or 1, the experts replicated over
     * tensor parallelism; the tensor-parallel size, every MoE layer's
     * experts (and shared experts) split over the TP group as the dense MLP
     * is (doc/ARCHITECTURE.md, "The MoE layer", expert tensor parallelism).
     * A run's choice, not stored in checkpoints (they hold global tensors). */
    int moe_expert_tensor_parallel;
    /* FP8 (Megatron's --fp8-format; doc/ARCHITECTURE.md "FP8"): 0 off, 1
     * e4m3 (every operand E4M3), 2 hybrid (E5M2 output gradients), for the
     * transformer layers' four dense linears, delayed scaling: a scale per
     * operand from the amax history of the steps before (--fp8-amax-
     * history-len, 1; --fp8-amax-compute-algo max (1) or most_recent (0,
     * the default); --fp8-margin, 0). Emulated exactly on the CPU backend.
     * A run's choice, not in a checkpoint's model configuration (its
     * scales and histories are: mc_model_fp8_get below). */
    int fp8;
    int fp8_amax_history_len;
    int fp8_amax_compute_max;
    int fp8_margin;
    /* --moe-layer-freq: an integer k (layer l is MoE when l % k == 0; 1:
     * every layer), or a list, expanded here to one '0'/'1' per layer
     * (empty: the integer rule). */
    int moe_layer_freq;
    char moe_layer_pattern[MC_MOE_MAX_LAYERS + 1];
    /* Activation recomputation, Megatron's --recompute-granularity,
     * --recompute-method, --recompute-num-layers and --recompute-modules
     * (doc/ARCHITECTURE.md, "Recomputation"): what the forward keeps for the
     * backward and what the backward runs again. Like sequence_parallel a
     * setting of the run, not of the architecture (checkpoints do not
     * store it); results are bit-identical whatever it is. */
    int recompute_granularity;  /* MC_RECOMPUTE_NONE, _FULL, _SELECTIVE */
    int recompute_method;       /* full: MC_RECOMPUTE_UNIFORM or _BLOCK */
    int recompute_num_layers;   /* full: layers per group (uniform), per chunk (block) */
    unsigned recompute_modules; /* selective: MC_RECOMPUTE_CORE_ATTN | ... */
} mc_model_config;

enum { MC_CP_P2P = 0, MC_CP_A2A = 1 };
/* The sequence and heads against context parallelism of cp ranks (with tp
 * tensor-parallel ranks): seq_length a multiple of 2 cp (of cp tp with
 * sequence parallelism), and with MC_CP_A2A the heads and query groups of
 * a tensor-parallel rank multiples of cp; MC_ERR_USAGE naming the options
 * otherwise. cp 1: MC_OK. */
mc_status mc_model_check_cp(const mc_model_config *c, int tp, int cp, mc_error *err);
/* Inference under expert parallelism (mc-eval, mc-serve): a checkpoint's
 * model (file names it in the message) must be a mixture of experts whose
 * expert count ep divides; MC_ERR_USAGE otherwise. ep 1: always MC_OK. */
mc_status mc_model_check_ep(const mc_model_config *c, int ep, const char *file, mc_error *err);
/* --moe-router-load-balancing-type */
enum { MC_MOE_LB_AUX = 0, MC_MOE_LB_SEQ_AUX = 1, MC_MOE_LB_NONE = 2 };

/* Parse --moe-layer-freq: an integer k >= 1, or a Python list expression of
 * 0s and 1s built with [..], +, * and parentheses (Megatron's
 * `([0]*1+[1]*3)*4`), into c->moe_layer_freq / c->moe_layer_pattern
 * (MC_ERR_USAGE naming the option and the place; the length is checked
 * against --num-layers by mc_model_config_finish). */
mc_status mc_moe_layer_freq_parse(const char *s, mc_model_config *c, mc_error *err);
/* 1 when global layer l is a MoE layer. */
int mc_model_layer_is_moe(const mc_model_config *c, int l);
/* MC_ERR_USAGE "TOOL: PATH: a mixture-of-experts checkpoint (E experts):
 * WHAT is not implemented yet" when c has experts; MC_OK otherwise. For the
 * tools that cannot handle MoE models yet, so they never misread one. */
mc_status mc_model_refuse_moe(const mc_model_config *c, const char *path, const char *what,
                              mc_error *err);

/* mc_model_config.recompute_granularity and recompute_method */
enum { MC_RECOMPUTE_NONE = 0, MC_RECOMPUTE_FULL = 1, MC_RECOMPUTE_SELECTIVE = 2 };
enum { MC_RECOMPUTE_UNIFORM = 1, MC_RECOMPUTE_BLOCK = 2 };
/* mc_model_config.recompute_modules: Megatron's names.
 * core_attn: the attention's output and log-sum-exp are not kept; attention
 *   runs again from q, k and v;
 * layernorm: neither norm's output (nor its statistics) is kept; both norms
 *   run again from the residual stream;
 * mlp: the dense MLP block with its fused norm (Megatron Core's TE spec)
 *   keeps nothing; norm2, fc1 and the activation run again from the
 *   residual (a MoE layer is not touched: Megatron's "dense MLP");
 * mlp_act (mc's, not Megatron's: the dense MLP's counterpart of Megatron's
 *   moe_act, MindSpeed's --recompute-activation-function): the activation
 *   function's output is not kept; it runs again from fc1's output (no
 *   GEMM runs again); dense layers only, like mlp (moe_act is the experts');
 * attn_proj (mc's, not Megatron's): the residual stream after attention
 *   (res + the output projection linear_proj) is not kept; the projection
 *   runs again from the attention's output (one [hidden, hidden] GEMM);
 *   dense and MoE layers alike (the attention half is the same);
 * moe: a MoE layer's block keeps nothing but its input (the pre-MLP norm's
 *   output): the router, the dispatch (EP's exchanges too), the experts
 *   and the shared experts run again;
 * moe_act: the experts' activation output is not kept; it runs again from
 *   their fc1 output;
 * shared_experts: the shared experts' fc1 and activation outputs are not
 *   kept; they run again from the block's input. */
enum {
    MC_RECOMPUTE_CORE_ATTN = 1 << 0,
    MC_RECOMPUTE_LAYERNORM = 1 << 1,
    MC_RECOMPUTE_MLP = 1 << 2,
    MC_RECOMPUTE_MOE = 1 << 3,
    MC_RECOMPUTE_MOE_ACT = 1 << 4,
    MC_RECOMPUTE_SHARED_EXPERTS = 1 << 5,
    MC_RECOMPUTE_MLP_ACT = 1 << 6,
    MC_RECOMPUTE_ATTN_PROJ = 1 << 7,
};
/* Module name (Megatron's) -> MC_RECOMPUTE_* bit; MC_ERR_USAGE naming it
 * for a module mc's layers do not have (mla_up_proj, ...) or an unknown
 * name. */
mc_status mc_recompute_module(const char *name, unsigned *bit, mc_error *err);
/* The groups of a layer's saved activations, each carved together
 * (model.c) and counted together (plan.c's --dry-run plan). */
enum {
    MC_ACT_RES = 1 << 0,  /* res, the layer's input */
    MC_ACT_LN1 = 1 << 1,  /* ln1 and its statistics */
    MC_ACT_QKV = 1 << 2,  /* q, k, v */
    MC_ACT_ATT = 1 << 3,  /* att, lse */
    MC_ACT_RES2 = 1 << 4, /* res2 */
    MC_ACT_LN2 = 1 << 5,  /* ln2 and its statistics */
    MC_ACT_FC1 = 1 << 6,  /* fc1 */
    MC_ACT_ACT = 1 << 7,  /* act */
    MC_ACT_MLP = MC_ACT_FC1 | MC_ACT_ACT,
    /* a MoE layer's block instead of MC_ACT_MLP (moe.c's MC_MOE_ACTS_*) */
    MC_ACT_MOE = 1 << 8,     /* the router's, the dispatch's and the experts' but: */
    MC_ACT_MOE_ACT = 1 << 9, /* the experts' activation output */
    MC_ACT_SHARED = 1 << 10, /* the shared experts' */
    MC_ACT_ALL = (1 << 11) - 1,
    MC_ACT_MOE_ALL = MC_ACT_MOE | MC_ACT_MOE_ACT | MC_ACT_SHARED,
};
/* The MC_ACT_* groups a MoE (moe != 0) or a dense layer has. */
unsigned mc_recompute_layer_has(int moe);
/* What selective recomputation of `modules` (MC_RECOMPUTE_* bits) does not
 * keep of a MoE or a dense layer (mlp and mlp_act are a dense layer's;
 * moe, moe_act and shared_experts a MoE layer's). */
unsigned mc_recompute_dropped(unsigned modules, int moe);
/* The setting in words ("full uniform 2", "selective core_attn,mlp",
 * "none") into buf. */
void mc_recompute_describe(const mc_model_config *c, char *buf, size_t n);
/* Check the recomputation setting (MC_ERR_USAGE with the numbers): its
 * combinations as Megatron's TransformerConfig does (method and number of
 * layers with full granularity only, and needed there; modules with
 * selective only; mc_model_config_finish checks these too), and with full
 * granularity recompute_num_layers no more than the layers of any model
 * chunk of any of the pp stages. mc_model_new checks it on its grid. */
mc_status mc_model_check_recompute(const mc_model_config *c, int pp, mc_error *err);

/* Megatron's defaults (GPT-style: LayerNorm, GELU, learned positions, biases,
 * tied embeddings); fields left 0 are derived by mc_model_config_finish. */
void mc_model_config_init(mc_model_config *c);
/* Fill a preset by name: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b,
 * llama-160m, llama-1b, tiny-gpt, tiny-llama (see mc-train(1)). Fields the
 * user sets afterwards override the preset. */
mc_status mc_model_preset(const char *name, mc_model_config *c, mc_error *err);
/* Names of the presets, NULL-terminated. */
const char *const *mc_model_preset_names(void);
/* Derive the defaults and check the configuration against itself and the
 * tensor-parallel size (heads and groups divisible, ...). Pads the vocab as
 * Megatron does: up to a multiple of make_vocab_size_divisible_by * tp. */
mc_status mc_model_config_finish(mc_model_config *c, int tp, mc_error *err);

/* One parameter. Global shape [rows, cols] (cols = 1 for vectors, ndim = 1).
 * This rank holds rows [row0, row0 + local_rows) and columns
 * [col0, col0 + local_cols): column-parallel weights split rows (split_dim
 * 0), row-parallel weights split columns (split_dim 1), replicated
 * parameters have split_dim -1.
 *
 * row_chunks > 1 (SwiGLU's linear_fc1, whose global rows are [gate; up], as
 * Megatron Core's checkpoints store them): the global rows are row_chunks
 * equal chunks of rows / row_chunks rows, each split over tensor
 * parallelism on its own. The rank's local tensor is its slice of chunk 0,
 * then its slice of chunk 1, ...: local_rows / row_chunks rows from global
 * row j * rows / row_chunks + row0 for chunk j (row0 is the offset within
 * a chunk). With tp = 1 this is the whole tensor in global order.
 *
 * col_chunks > 1 (a MoE layer's SwiGLU experts' fc1 bias under expert
 * tensor parallelism, [E, 2F] whose rows are [gate F | up F]): split by
 * columns (split_dim 1), the global columns are col_chunks equal chunks of
 * chunk_cols columns, each split over tensor parallelism on its own. Each
 * local row is its slice of chunk 0, then its slice of chunk 1, ...:
 * local_cols / col_chunks columns from global column k * chunk_cols + col0
 * for chunk k (col0 is the offset within a chunk), as the local fc1 rows
 * are [gate slice; up slice]. Such a parameter has row_chunks 1. */
typedef struct mc_param {
    char name[128]; /* Megatron Core state-dict name */
    int ndim;
    int64_t rows, cols;             /* global */
    int64_t local_rows, local_cols; /* on this rank */
    int64_t row0, col0;
    int split_dim;
    int no_weight_decay; /* biases and norm weights */
    float init_std;      /* 0: constant init_value */
    float init_value;
    size_t offset;  /* element offset in the parameter buffer */
    size_t numel;   /* local elements */
    int row_chunks; /* 1, or 2 for SwiGLU's [gate; up] (see above) */
    /* global rows from one local chunk's first row to the next's: rows /
     * row_chunks, except for the experts' fc1 under expert tensor
     * parallelism, where each of the rank's E / ep experts has one chunk
     * (two with SwiGLU) of F rows split over tensor parallelism:
     * row_chunks = E / ep (x 2), chunk_rows = F, row0 = the first expert's
     * first row plus the rank's offset within a chunk */
    int64_t chunk_rows;
    int col_chunks;     /* 1, or 2 (see above) */
    int64_t chunk_cols; /* cols / col_chunks */
    /* 1 on the last pipeline stage's copy of the tied word embeddings
     * (Megatron's shared parameter): same name and values as the first
     * stage's, kept equal by mc_model_allreduce_embedding_grads; left out
     * of the gradient norm (counted once, on the first stage) and a
     * replica for checkpoints. */
    int shared;
    /* 1 for a MoE layer's experts (mlp.experts.*): under expert parallelism
     * the global [E rows, cols] tensor is split by experts, this rank
     * holding rows [row0, row0 + local_rows) = its E / ep experts; their
     * gradients reduce over the expert-data-parallel group. Under expert
     * tensor parallelism each expert's fc1 is also split by rows (chunks,
     * above) and its fc2 by columns, split_dim saying which. */
    int expert;
    /* 1 where the same slice lives on a lower tensor-parallel rank: an
     * expert slice under expert tensor parallelism smaller than TP (the
     * ETP group's tp / etp replicas, MC_GROUP_ETP_REP); left out of the
     * gradient norm and of checkpoint writes, as split_dim -1 is on TP
     * ranks other than 0 */
    int replica;
} mc_param;

/* The columns a parameter's prepared form (mc_k_prepare_weight) is made
 * with: a linear weight's local columns, 0 for the experts' weights (read
 * elementwise by the grouped GEMM) and for vectors. The model and the
 * optimizer that writes the prepared copy (mc_optim_set_prepared) agree
 * through this. */
static inline size_t mc_param_prepared_cols(const mc_param *p)
{
    return p->ndim == 2 && !p->expert ? (size_t)p->local_cols : 0;
}

typedef struct mc_model mc_model;

/* Build the model for micro-batches of `micro_batch` sequences of
 * config->seq_length tokens; allocates parameters, gradients and
 * activations on the backend. prec is the GEMM precision. Under context
 * parallelism (g->cp > 1) the model still takes whole sequences but keeps
 * the rows of this rank's two chunks (config->cp_comm_type says how
 * attention crosses the group; mc_model_check_cp's rules, MC_ERR_USAGE). */
mc_status mc_model_new(const mc_model_config *c, const mc_grid *g, mc_backend *be, int micro_batch,
                       mc_prec prec, mc_model **out, mc_error *err);
void mc_model_free(mc_model *m);
const mc_model_config *mc_model_get_config(const mc_model *m);

size_t mc_model_num_params(const mc_model *m); /* number of mc_param entries */
const mc_param *mc_model_param(const mc_model *m, size_t i);
const mc_param *mc_model_param_by_name(const mc_model *m, const char *name);
float *mc_model_params(mc_model *m); /* the whole buffer (backend memory) */
float *mc_model_grads(mc_model *m);
size_t mc_model_numel(const mc_model *m); /* local elements in the buffer */
/* Parameter count of the whole (global) model, for FLOP estimates. */
int64_t mc_model_global_numel(const mc_model *m);

/* Megatron's initialization from (seed, name, global index): normal with
 * init_method_std; output projections (linear_proj, linear_fc2) with
 * std / sqrt(2 * num_layers); norm weights 1, biases 0. */
void mc_model_init_weights(mc_model *m, uint64_t seed);
void mc_model_zero_grads(mc_model *m);
/* on = 1: the parameters will not change until mc_model_hold_weights(m,
 * 0), so each weight's GEMM form (bf16 bits, or rounded fp32 where the
 * GEMMs are emulated) is made once, by its first forward pass, instead of
 * by every forward pass: once per step for all its micro-batches. The
 * caller must end the hold before anything writes the parameters (the
 * optimizer's step, a load). The same bits either way. */
void mc_model_hold_weights(mc_model *m, int on);
/* The weights' prepared copy, laid out as the parameter buffer (*bytes an
 * element, for the GEMMs of *prec), for an optimizer that writes it with
 * each update (mc_optim_set_prepared); NULL when the model keeps none. */
void *mc_model_prepared_weights(mc_model *m, size_t *bytes, mc_prec *prec);
/* The prepared copy equals the parameters now (the optimizer wrote both):
 * the next mc_model_hold_weights(m, 1) prepares nothing. Cleared by
 * mc_model_hold_weights(m, 0). */
void mc_model_weights_prepared(mc_model *m);

/* One micro-batch: tokens and targets are host arrays of micro_batch *
 * seq_length ids (targets < 0 are ignored; under context parallelism the
 * whole sequences on every rank of the group, the loss and count those of
 * the whole micro-batch). Runs the forward pass and, when
 * backward is set, the backward pass, adding into the gradients with the
 * loss scaled by grad_scale (e.g. 1 / number of micro-batches, times the
 * fp16 loss scale). *loss gets the mean loss over counted targets, *ntok the
 * number of counted targets. */
mc_status mc_model_step(mc_model *m, const int32_t *tokens, const int32_t *targets, int backward,
                        float grad_scale, double *loss, int64_t *ntok, mc_error *err);

/* ------------------------------------------------------------ packed documents
 *
 * Megatron's --reset-position-ids and --reset-attention-mask
 * (megatron/core/datasets/gpt_dataset.py, _get_ltor_masks_and_position_ids):
 * a sequence packs several documents, each ended by the id eod (which
 * belongs to the document it ends). With reset_position_ids the positions
 * restart at 0 on the token after each eod; with reset_attention_mask a
 * token attends only to the tokens of its own document at or before it (the
 * attention kernels' segment starts: a variable-length attention over the
 * documents, never a T x T mask). Megatron's --eod-mask-loss is the data's
 * concern: mc_doc_mask_targets. */
typedef struct mc_doc_resets {
    int32_t eod;              /* the end-of-document id */
    int reset_position_ids;   /* --reset-position-ids */
    int reset_attention_mask; /* --reset-attention-mask */
} mc_doc_resets;

/* For n tokens of one sequence: pos[t] = t - (the index after the last eod
 * before t) with reset_position_ids, else pos0 + t; seg[t] = that index
 * (the document's first token) with reset_attention_mask, else 0. Either
 * output may be NULL. */
void mc_doc_layout(const mc_doc_resets *r, const int32_t *tokens, size_t n, size_t pos0,
                   int32_t *pos, int32_t *seg);
/* Megatron's --eod-mask-loss: targets[t] = -1 (not counted) where tokens[t]
 * is eod, for t < n. */
void mc_doc_mask_targets(int32_t eod, const int32_t *tokens, int32_t *targets, size_t n);

/* Packed documents from now on (r NULL, or both resets 0: off). Then every
 * forward needs the micro-batch's tokens on every pipeline stage (the
 * positions and segments are computed from them), and the pipeline
 * schedules pass them to every stage. mc_infer contexts of the model follow
 * the same setting. */
void mc_model_set_doc_resets(mc_model *m, const mc_doc_resets *r);
/* 1 when a reset is on (every stage reads tokens). */
int mc_model_doc_resets_on(const mc_model *m);

/* A loss over each micro-batch's log-probabilities in place of the mean
 * cross-entropy (mc-train --dpo: lib/train/dpo.c). On the last stage, after
 * the LM head's forward, fn gets logp[i] = log softmax(logits_i)[targets[i]]
 * over the padded vocabulary for the micro-batch's n = micro_batch *
 * seq_length positions (0 where targets[i] < 0) and fills dlogp[i] =
 * d loss / d logp[i] (dlogp comes zeroed; entries where targets[i] < 0 are
 * ignored), *loss (the micro-batch's loss) and *count (the number it
 * averages over; mc_model_forward reports it as *ntok, and a micro-batch
 * with count 0 runs no backward). With backward the head then runs again
 * with per-row weights -grad_scale * dlogp[i] on the cross-entropy's
 * gradient (a row's cross-entropy is -logp): its GEMM is recomputed, the
 * logits are still never kept. Host arrays; fn runs once per forward of the
 * last stage, in the schedule's order, with the same values on every rank
 * of the tensor-parallel group. fn NULL: the mean cross-entropy. */
typedef mc_status (*mc_logp_loss_fn)(void *ctx, const float *logp, const int32_t *targets, size_t n,
                                     float *dlogp, double *loss, int64_t *count, mc_error *err);
void mc_model_set_logp_loss(mc_model *m, mc_logp_loss_fn fn, void *ctx);

/* Gradient readiness, for the data-parallel reduction overlapped with the
 * backward pass (lib/train/grad_buckets.c): during each backward pass of
 * mc_model_step the model calls fn(ctx, offset) each time every gradient
 * at buffer element offset >= `offset` is final for this pass (after the
 * LM head and final norm, after each layer from the last to the first, and
 * 0 after the embeddings). The frontier only decreases within a pass. A
 * non-zero status stops the step with that error. fn NULL removes it. */
typedef mc_status (*mc_grad_ready_fn)(void *ctx, size_t offset, mc_error *err);
void mc_model_set_grad_ready_hook(mc_model *m, mc_grad_ready_fn fn, void *ctx);

/* ------------------------------------------------------------ distillation
 *
 * Knowledge distillation (mc-train --kd-teacher): teacher is a frozen model
 * (borrowed, never freed here; its gradients are never computed) built on
 * the same grid, backend and micro-batch shape, of any size but with the
 * same padded vocabulary (MC_ERR_FORMAT otherwise). Needs one pipeline
 * stage (MC_ERR_USAGE otherwise), temperature > 0 and alpha in [0, 1].
 * From then on every forward WITH backward (training) runs the teacher's
 * forward on the same tokens and, in the LM head chunk by chunk, the
 * forward KL(p_t || p_s) with p = softmax(logits / temperature),
 * vocab-parallel, over the counted targets (targets >= 0); the gradient is
 * that of (1 - alpha) CE + alpha temperature^2 KL (Hinton's scaling), each
 * term a mean over the counted targets. *loss stays the cross-entropy's
 * mean; mc_model_kd_loss gives the KL's. A forward without backward
 * (evaluation) ignores the teacher. teacher NULL turns distillation off.
 * The teacher follows the student's mc_model_set_doc_resets. */
mc_status mc_model_set_teacher(mc_model *m, mc_model *teacher, float temperature, float alpha,
                               mc_error *err);
/* The last forward's mean KL over its counted targets (0 without one). */
double mc_model_kd_loss(const mc_model *m);
/* ------------------------------------------------------------ pipeline
 *
 * With pipeline parallelism (grid pp > 1) the model built on a rank is its
 * stage: global layers [first, last) (mc_model_stage_layers), the
 * embeddings on the first stage, the final norm and the output layer on the
 * last (and there, with tied embeddings, its own copy of the word
 * embeddings, mc_param.shared). Parameters of other stages are absent from
 * the registry; names keep the GLOBAL layer index.
 *
 * Stage-wise execution of micro-batches: the pipeline schedule
 * (lib/train/pipeline.c) keeps up to `slots` micro-batches in flight, each
 * with its own saved activations. Activations between stages are the
 * residual stream [micro_batch, T/tp (sequence parallel) or T, hidden]:
 * mc_model_act_numel elements. */

/* Global layers [*first, *last) of stage `rank` of `pp`: the even split, or
 * first/last stage counts from the config with the rest split evenly over
 * the middle stages (Megatron's rule). Every stage must get >= 1 layer;
 * errors (MC_ERR_USAGE) carry the numbers. */
mc_status mc_model_stage_layers(const mc_model_config *c, int pp, int rank, int *first, int *last,
                                mc_error *err);
/* Virtual pipeline stages (num_layers_per_virtual_pipeline_stage N > 0):
 * the number of model chunks per rank, v = num_layers / (pp * N), and
 * chunk `chunk`'s layers [*first, *last) on rank `rank`. Needs pp > 1, no
 * --decoder-first/last-pipeline-num-layers and num_layers % (pp * N) == 0;
 * errors (MC_ERR_USAGE) carry the numbers. Without N: one chunk, the
 * stage's layers. */
mc_status mc_model_num_chunks_for(const mc_model_config *c, int pp, int *v, mc_error *err);
mc_status mc_model_chunk_layers(const mc_model_config *c, int pp, int rank, int chunk, int *first,
                                int *last, mc_error *err);
/* This rank's model chunks (1 without virtual stages). The registry and
 * the parameter buffer hold every chunk's layers (so the optimizer,
 * checkpoints and gradient reduction see one model); the chunk-wise calls
 * below run one chunk's layers. Chunk 0 of the first rank runs the
 * embeddings, the last chunk of the last rank the head and loss. Under
 * several chunks the grad-ready hook is not called (the reduction runs
 * after the schedule). */
int mc_model_num_chunks(const mc_model *m);
float *mc_model_chunk_input(mc_model *m, int chunk, int slot);
mc_status mc_model_forward_chunk(mc_model *m, int chunk, int slot, const int32_t *tokens,
                                 const int32_t *targets, int backward, float grad_scale,
                                 const float **out, double *loss, int64_t *ntok, mc_error *err);
mc_status mc_model_backward_chunk(mc_model *m, int chunk, int slot, const float *dout,
                                  const float **din, mc_error *err);
int mc_model_is_first_stage(const mc_model *m);
int mc_model_is_last_stage(const mc_model *m);
size_t mc_model_act_numel(const mc_model *m);
/* Re-lay the activations for `slots` micro-batches in flight (default 1);
 * slot arguments below are in [0, slots). */
mc_status mc_model_set_slots(mc_model *m, int slots, mc_error *err);
/* The bytes of the activation block (backend memory): per micro-batch
 * slot, what the forward keeps for the backward (every layer's saved
 * activations, less what recomputation drops; the stage's output, the
 * head's, the ids); the recomputation workspace, shared by all slots,
 * where dropped activations live while a layer runs; and the scratch
 * of one forward or backward. total = slots x kept + workspace + scratch. */
typedef struct mc_act_bytes {
    size_t kept, workspace, scratch, total;
    int slots;
} mc_act_bytes;
void mc_model_act_bytes(const mc_model *m, mc_act_bytes *out);
/* Where the previous stage's output for a micro-batch in `slot` goes
 * before mc_model_forward (not the first stage). */
float *mc_model_stage_input(mc_model *m, int slot);
/* Forward of one micro-batch on this stage. The first stage reads tokens,
 * the others mc_model_stage_input(m, slot). The last stage reads targets
 * and sets *loss and *ntok (the others set 0); with backward set it also
 * runs the output layer's backward (grad_scale as in mc_model_step), so
 * the logits are never kept. *out (not the last stage) is the stage's
 * output, valid until the slot is used again. Host arrays of micro_batch *
 * seq_length ids; NULL where the stage does not read them (with document
 * resets, mc_model_set_doc_resets, every stage reads tokens). */
mc_status mc_model_forward(mc_model *m, int slot, const int32_t *tokens, const int32_t *targets,
                           int backward, float grad_scale, const float **out, double *loss,
                           int64_t *ntok, mc_error *err);
/* Backward of the micro-batch in `slot` (after its forward with backward
 * set): dout is d(stage output) (ignored on the last stage). *din (not the
 * first stage) is d(stage input), valid until the next call. Calls the
 * grad-ready hook as mc_model_step does. */
mc_status mc_model_backward(mc_model *m, int slot, const float *dout, const float **din,
                            mc_error *err);
/* Tied embeddings under pipeline parallelism: sum the word embeddings'
 * gradient over the embedding group (first and last stage), before the
 * data-parallel reduction. A no-op elsewhere. */
mc_status mc_model_allreduce_embedding_grads(mc_model *m, mc_error *err);

/* ------------------------------------------------------------ inference
 * (lib/model/infer.c)
 *
 * Forward-only evaluation of one sequence at a time with a key/value cache,
 * for mc-eval (perplexity, log-likelihoods of continuations, generation).
 * The context borrows the model's parameters (its training activations are
 * left alone) and runs on one pipeline stage under any tensor parallelism:
 * every rank of the tensor-parallel group calls each function alike and gets
 * the same results. Each new position costs one row of work: keys and values
 * of earlier positions stay in the cache. */
typedef struct mc_infer mc_infer;

/* A context for sequences of up to max_len positions (the cache), running
 * at most max_rows positions per forward (longer inputs are split). Refuses
 * pipeline parallelism and, with learned positions, max_len beyond the
 * position table (MC_ERR_USAGE). A bf16 model on the CPU has its weights'
 * bf16 rounding made here, once: the context sees the weights as they are
 * now (as mc_infer_use_int8 does). */
mc_status mc_infer_new(mc_model *m, int max_len, int max_rows, mc_infer **out, mc_error *err);
void mc_infer_free(mc_infer *inf); /* NULL is allowed */
int mc_infer_capacity(const mc_infer *inf);
int mc_infer_length(const mc_infer *inf); /* positions in the cache */
/* The model's padded vocabulary: the length of mc_infer_logits's row. */
int64_t mc_infer_padded_vocab(const mc_infer *inf);
/* Forget positions >= len (0: start a new sequence); the cache below len is
 * kept, so a shared prefix is computed once. */
void mc_infer_truncate(mc_infer *inf, int len);
/* Run n tokens (host ids) at positions length .. length+n-1, appending them
 * to the cache. targets (NULL: nothing scored) are n ids, < 0 where nothing
 * is scored; for each scored row i, logprob[i] = log softmax(logits_i)
 * [targets[i]] over the padded vocabulary (as the training loss) and
 * greedy[i] = 1 when no logit of row i exceeds the target's (a tie counts as
 * greedy); unscored rows get 0. Either output may be NULL. Scored rows go
 * through the LM head in chunks, never as an [n, V] tensor. MC_ERR_LIMIT
 * when length + n exceeds the capacity, MC_ERR_FORMAT for an id outside the
 * vocabulary. */
mc_status mc_infer_extend(mc_infer *inf, const int32_t *tokens, int n, const int32_t *targets,
                          float *logprob, int *greedy, mc_error *err);
/* Int8 from now on: the linear layers and the LM head run on int8 codes
 * with one scale per output row (the int8 checkpoint format's rule, kern.h
 * mc_k_quantize_q8_rows) times activations quantized to int8 per row in
 * blocks of 32 (kern_ops.def mc_k_linear_q8a8_fwd, batched inference's
 * kernel too); an int8 checkpoint thus runs on its own codes. Costs a
 * quarter of the weights' fp32 bytes more memory. */
mc_status mc_infer_use_int8(mc_infer *inf, mc_error *err);
/* The logits of the last position run, the whole padded vocabulary
 * (gathered over the tensor-parallel group) into host[padded_vocab_size]. */
mc_status mc_infer_logits(mc_infer *inf, float *host, mc_error *err);

/* ------------------------------------------------------------ batched inference
 * (lib/model/infer_batch.c)
 *
 * Many sequences in one forward pass over a pool of key/value blocks, for
 * a server's scheduler (mc-serve): each sequence owns blocks of block_size
 * positions (every layer's keys and values of those positions), taken from
 * and given back to the pool, and each call advances any set of sequences
 * by any number of rows each (a prompt's chunk beside others' one new
 * token). Batch invariant: a sequence's logits and log-probabilities are
 * the same bits whatever else runs in the call and however its rows were
 * split into calls (the linears use mc_k_linear_rows_fwd, int8 weights
 * mc_k_linear_q8a8_fwd; attention runs per sequence). One process only
 * (no tensor or pipeline parallelism). */
typedef struct mc_kvpool mc_kvpool;

typedef struct mc_kvpool_config {
    size_t bytes;   /* memory for keys and values: floor(bytes / block bytes) blocks */
    int block_size; /* positions a block */
    int max_len;    /* positions a sequence at most (<= learned positions) */
    int max_rows;   /* rows (new positions of all sequences) a call at most */
    int weights;    /* the linears' weights: MC_KV_WEIGHTS_* */
} mc_kvpool_config;
/* mc_kvpool_config.weights: the model's fp32 values; weight-only int8 (as
 * mc_infer_use_int8: codes and one scale per row); weight-only bf16 (the
 * values rounded to bf16, nearest even, widened exactly in the kernel). */
enum { MC_KV_WEIGHTS_FP32 = 0, MC_KV_WEIGHTS_INT8 = 1, MC_KV_WEIGHTS_BF16 = 2 };

/* The bytes of one block: 2 x layers x block_size x (query groups x head dim) floats. */
size_t mc_kvpool_block_bytes(const mc_model *m, int block_size);
/* MC_ERR_USAGE for a grid of more than one rank, bytes below one block, a
 * max_len beyond learned positions. The pool borrows the model's weights. */
mc_status mc_kvpool_new(mc_model *m, const mc_kvpool_config *c, mc_kvpool **out, mc_error *err);
void mc_kvpool_free(mc_kvpool *p); /* NULL is allowed */
int mc_kvpool_blocks(const mc_kvpool *p);
int mc_kvpool_blocks_free(const mc_kvpool *p);
int mc_kvpool_block_size(const mc_kvpool *p);
int mc_kvpool_max_rows(const mc_kvpool *p);
int mc_kvpool_max_len(const mc_kvpool *p);
int64_t mc_kvpool_padded_vocab(const mc_kvpool *p);
/* n free block ids into ids (MC_ERR_LIMIT when fewer are free), and back. */
mc_status mc_kvpool_take(mc_kvpool *p, int n, int32_t *ids, mc_error *err);
void mc_kvpool_give(mc_kvpool *p, const int32_t *ids, int n);

typedef struct mc_kvseq {
    const int32_t *blocks; /* its blocks in position order, covering len + n positions */
    int len;               /* positions already in its cache */
    const int32_t *tokens; /* n >= 1 new ids, run at positions len .. len + n - 1 */
    int n;
    const int32_t *targets; /* NULL, or n ids (< 0: none) whose log-probabilities are wanted */
    double *logprobs;       /* [n]: log softmax(logits_j)[targets[j]] over the padded vocabulary */
    float *logits;          /* NULL, or host [padded vocab]: the last new row's logits */
} mc_kvseq;

/* Advance seqs[0..nseq) (at most max_rows rows in all). MC_ERR_LIMIT past
 * a sequence's max_len or the rows, MC_ERR_FORMAT for an id outside the
 * vocabulary; nothing is run then. */
mc_status mc_infer_batch(mc_kvpool *p, const mc_kvseq *seqs, int nseq, mc_error *err);

/* log softmax(logits[0..V))[t], in double (max subtracted first). */
double mc_logprob_at(const float *logits, int64_t V, int32_t t);

/* The MoE layers' balancing losses summed over this rank's layers and
 * training forwards since the last mc_model_moe_layer_losses: the
 * load-balancing loss (aux_loss or seq_aux_loss) and the z-loss, each
 * without its coefficient (what Megatron logs as load_balancing_loss /
 * seq_load_balancing_loss and z_loss before averaging). */
void mc_model_moe_losses(mc_model *m, double *load_balancing, double *z);
/* The same per global layer, into [num_layers] arrays (0 for layers that
 * are dense or on other stages); then the sums restart. */
void mc_model_moe_layer_losses(mc_model *m, double *load_balancing, double *z);
/* --moe-router-enable-expert-bias: after an iteration's micro-batches
 * (every rank of the data-parallel group calls it), each MoE layer's
 * expert bias += sign(mean - tokens[e]) x --moe-router-bias-update-rate,
 * tokens[e] what expert e received in the iteration's training forwards
 * summed over data parallelism (Megatron's _update_router_expert_bias);
 * then the counts restart. Without the option only the counts are summed
 * and kept (mc_model_moe_tokens_per_expert) when keep_counts is set
 * (--moe-per-layer-logging); otherwise they restart with no collective. */
mc_status mc_model_moe_update_expert_bias(mc_model *m, int keep_counts, mc_error *err);
/* FP8 (cfg.fp8): after a training step, the largest |value| each FP8
 * operand had during it (over every rank of the stage) joins its amax
 * history and sets the operand's scale for the next step; no-op without
 * FP8. Collective over the stage's TP, CP and DP groups. */
mc_status mc_model_fp8_update(mc_model *m, mc_error *err);
/* FP8 state for checkpoints (lib/train/state.c; mc-formats(5), the /fp8
 * datasets). Per layer MC_MODEL_FP8_OPS operands, index linear 3 + operand
 * (linear: QKV, projection, fc1, fc2; operand: x, W, dy): the scale, the
 * amax recorded since the last mc_model_fp8_update (evaluation's; 0 right
 * after a step) and the amax history, newest first. It is the same on
 * every rank of a pipeline stage once mc_model_fp8_sync has max-reduced
 * the recorded amaxes over the stage (collective over its TP, CP and DP
 * groups, which mc_model_fp8_update then does again: max is idempotent,
 * so the run is unchanged). mc_model_fp8_history_len: the history's
 * length, 0 without FP8. _get copies global layer l's scale[12],
 * amax[12] and hist[12 x len] out, _set in from a history of length len
 * (another length than the model's: the newest min(len, model's)
 * entries, the older ones 0); both return 0 (copying nothing) when l is
 * not on this rank or the model has no FP8, else 1. */
#define MC_MODEL_FP8_OPS 12
int mc_model_fp8_history_len(const mc_model *m);
mc_status mc_model_fp8_sync(mc_model *m, mc_error *err);
int mc_model_fp8_get(const mc_model *m, int l, float *scale, float *amax, float *hist);
int mc_model_fp8_set(mc_model *m, int l, const float *scale, const float *amax, const float *hist,
                     int len);
/* Host [num_layers, E]: the tokens each expert of each MoE layer received
 * (after dropping; with padding its capacity) in the training forwards
 * counted by the last mc_model_moe_update_expert_bias with keep_counts
 * or the bias (which every MoE model's loop calls once per iteration), summed
 * over data parallelism (the EP ranks included); 0 for layers on other
 * pipeline stages. NULL before the first. */
const double *mc_model_moe_tokens_per_expert(const mc_model *m);
/* MoE layers of the whole model (0: dense). */
int mc_model_num_moe_layers(const mc_model_config *c);

/* FLOPs of one forward+backward over `tokens` tokens, Megatron's formula
 * (documented in mc-train(1)). */
double mc_model_flops_per_token(const mc_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
