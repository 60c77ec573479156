/*
 * mc-train - train a GPT- or Llama-family model the way Megatron-LM does.
 *
 * This file turns Megatron's command-line options into an mc_model_config,
 * an mc_gptdata_config and an mc_train_config, installs the SIGTERM/SIGINT
 * handler, and calls mc_train_run. Pipeline contract: with neither
 * --data-path nor --mock-data the dataset prefix is read from stdin (one
 * line, as mc-preprocess prints it); stdout gets exactly one line, the
 * directory of the last checkpoint written, or nothing without --save.
 * Everything else (the per-iteration log line included) goes to stderr.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "mc/file.h"
#include "mc/ckpt.h"
#include "mc/comm.h"
#include "mc/gptdata.h"
#include "mc/kern.h"
#include "mc/log.h"
#include "mc/model.h"
#include "mc/opt.h"
#include "mc/plan.h"
#include "mc/tokenizer.h"
#include "mc/tool.h"
#include "mc/train.h"

static const char PROG[] = "mc-train";

enum {
    /* model */
    OPT_MODEL = 256,
    OPT_NUM_LAYERS,
    OPT_HIDDEN_SIZE,
    OPT_NUM_HEADS,
    OPT_FFN_HIDDEN,
    OPT_KV_CHANNELS,
    OPT_SEQ_LENGTH,
    OPT_MAX_POS,
    OPT_NORMALIZATION,
    OPT_NORM_EPS,
    OPT_SWIGLU,
    OPT_QK_LAYERNORM,
    OPT_POS_TYPE,
    OPT_ROTARY_BASE,
    OPT_ROTARY_PERCENT,
    OPT_USE_ROPE_SCALING,
    OPT_ROPE_SCALING_FACTOR,
    OPT_ROPE_LOW_FREQ,
    OPT_ROPE_HIGH_FREQ,
    OPT_ROPE_ORIG_MAX_POS,
    OPT_GQA,
    OPT_NUM_QUERY_GROUPS,
    OPT_UNTIE,
    OPT_DISABLE_BIAS,
    OPT_INIT_STD,
    OPT_VOCAB_DIVISIBLE,
    /* tokenizer */
    OPT_TOKENIZER_TYPE,
    OPT_TOKENIZER_MODEL,
    OPT_VOCAB_FILE,
    OPT_MERGE_FILE,
    OPT_VOCAB_SIZE,
    /* mixed precision */
    OPT_BF16,
    OPT_FP16,
    OPT_LOSS_SCALE,
    OPT_INITIAL_LOSS_SCALE,
    OPT_MIN_LOSS_SCALE,
    OPT_LOSS_SCALE_WINDOW,
    OPT_HYSTERESIS,
    /* training */
    OPT_MICRO_BATCH,
    OPT_GLOBAL_BATCH,
    OPT_TRAIN_ITERS,
    OPT_TRAIN_SAMPLES,
    OPT_MAX_NAN_ITERS,
    OPT_EXIT_SIGNAL_HANDLER,
    OPT_EXIT_INTERVAL,
    OPT_EXIT_DURATION,
    OPT_SEED,
    OPT_DEVICE,
    OPT_THREADS,
    /* learning rate and optimizer */
    OPT_LR,
    OPT_MIN_LR,
    OPT_LR_DECAY_STYLE,
    OPT_LR_DECAY_ITERS,
    OPT_LR_DECAY_SAMPLES,
    OPT_LR_WARMUP_ITERS,
    OPT_LR_WARMUP_SAMPLES,
    OPT_LR_WARMUP_FRACTION,
    OPT_LR_WARMUP_INIT,
    OPT_LR_WSD_DECAY_STYLE,
    OPT_LR_WSD_DECAY_ITERS,
    OPT_LR_WSD_DECAY_SAMPLES,
    OPT_WEIGHT_DECAY,
    OPT_ADAM_BETA1,
    OPT_ADAM_BETA2,
    OPT_ADAM_EPS,
    OPT_CLIP_GRAD,
    OPT_START_WD,
    OPT_END_WD,
    OPT_WD_INCR_STYLE,
    /* validation and logging */
    OPT_EVAL_INTERVAL,
    OPT_EVAL_ITERS,
    OPT_LOG_INTERVAL,
    OPT_TENSORBOARD_DIR,
    OPT_LOG_JSON,
    OPT_PEAK_TFLOPS,
    OPT_LOG_COMM,
    /* checkpointing */
    OPT_SAVE,
    OPT_LOAD,
    OPT_SAVE_INTERVAL,
    OPT_FINETUNE,
    OPT_USE_CKPT_ARGS,
    OPT_NO_LOAD_OPTIM,
    OPT_NO_SAVE_OPTIM,
    OPT_ASYNC_SAVE,
    OPT_CKPT_COMPRESSION,
    OPT_NO_VERIFY,
    /* data */
    OPT_DATA_PATH,
    OPT_SPLIT,
    OPT_DATA_CACHE_PATH,
    OPT_MOCK_DATA,
    OPT_SFT,
    OPT_DPO,
    OPT_DPO_BETA,
    OPT_DPO_LOSS_TYPE,
    OPT_DPO_LABEL_SMOOTHING,
    OPT_REF_LOAD,
    OPT_KD_TEACHER,
    OPT_KD_TEMPERATURE,
    OPT_KD_ALPHA,
    OPT_RESET_POSITION_IDS,
    OPT_RESET_ATTENTION_MASK,
    OPT_EOD_MASK_LOSS,
    /* distributed */
    OPT_TP,
    OPT_PP,
    OPT_CP,
    OPT_CP_COMM_TYPE,
    OPT_SEQUENCE_PARALLEL,
    OPT_DIST_OPT,
    OPT_OVERLAP_GRAD,
    OPT_OVERLAP_PARAM,
    OPT_DIST_TIMEOUT,
    OPT_DDP_BUCKET,
    OPT_PP_FIRST,
    OPT_PP_LAST,
    OPT_VPP,
    /* activation recomputation */
    OPT_RECOMPUTE_GRANULARITY,
    OPT_RECOMPUTE_METHOD,
    OPT_RECOMPUTE_NUM_LAYERS,
    OPT_RECOMPUTE_MODULES,
    OPT_RECOMPUTE_ACTIVATIONS,
    /* planning */
    OPT_DRY_RUN,
    OPT_WORLD_SIZE,
    /* mixture of experts: one bit each in args.moe_set, in this order */
    OPT_NUM_EXPERTS,
    OPT_MOE_FFN,
    OPT_MOE_TOPK,
    OPT_MOE_SCORE,
    OPT_MOE_PRE_SOFTMAX,
    OPT_MOE_SCALING,
    OPT_MOE_NUM_GROUPS,
    OPT_MOE_GROUP_TOPK,
    OPT_MOE_EXPERT_BIAS,
    OPT_MOE_BIAS_RATE,
    OPT_MOE_LB_TYPE,
    OPT_MOE_AUX_COEFF,
    OPT_MOE_Z_COEFF,
    OPT_MOE_SHARED,
    OPT_MOE_CAPACITY,
    OPT_MOE_DROP_POLICY,
    OPT_MOE_PAD,
    OPT_MOE_LAYER_FREQ,
    OPT_EP,
    OPT_MOE_PER_LAYER_LOGGING,
    OPT_MOE_DISPATCHER,
    OPT_ETP,
    OPT_FP8_FORMAT,
    OPT_FP8_HISTORY,
    OPT_FP8_ALGO,
    OPT_FP8_MARGIN
};

static const mc_option options[] = {
    /* network size */
    {"model", MC_OPT_REQUIRED, OPT_MODEL, "PRESET",
     "Start from a preset (gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama-160m, llama-1b, "
     "tiny-gpt, tiny-llama); the flags below override it."},
    {"num-layers", MC_OPT_REQUIRED, OPT_NUM_LAYERS, "N", "Transformer layers."},
    {"hidden-size", MC_OPT_REQUIRED, OPT_HIDDEN_SIZE, "N", "Hidden size."},
    {"num-attention-heads", MC_OPT_REQUIRED, OPT_NUM_HEADS, "N", "Attention heads."},
    {"ffn-hidden-size", MC_OPT_REQUIRED, OPT_FFN_HIDDEN, "N",
     "MLP hidden size (default 4 x hidden size)."},
    {"kv-channels", MC_OPT_REQUIRED, OPT_KV_CHANNELS, "N",
     "Head dimension (default hidden size / heads)."},
    {"seq-length", MC_OPT_REQUIRED, OPT_SEQ_LENGTH, "N", "Tokens per sample."},
    {"max-position-embeddings", MC_OPT_REQUIRED, OPT_MAX_POS, "N",
     "Positions of the learned position table (default the sequence length)."},
    {"normalization", MC_OPT_REQUIRED, OPT_NORMALIZATION, "KIND", "LayerNorm or RMSNorm."},
    {"norm-epsilon", MC_OPT_REQUIRED, OPT_NORM_EPS, "X", "Epsilon of the norms (1e-5)."},
    {"swiglu", MC_OPT_NONE, OPT_SWIGLU, NULL, "SwiGLU MLP instead of GELU."},
    {"qk-layernorm", MC_OPT_NONE, OPT_QK_LAYERNORM, NULL,
     "Normalize each head's queries and keys (the model's norm, before RoPE)."},
    {"position-embedding-type", MC_OPT_REQUIRED, OPT_POS_TYPE, "TYPE", "learned_absolute or rope."},
    {"rotary-base", MC_OPT_REQUIRED, OPT_ROTARY_BASE, "X", "RoPE base (10000)."},
    {"rotary-percent", MC_OPT_REQUIRED, OPT_ROTARY_PERCENT, "X",
     "Share of each head's dimensions RoPE turns (1.0); the rest pass unchanged."},
    {"use-rope-scaling", MC_OPT_NONE, OPT_USE_ROPE_SCALING, NULL,
     "Llama 3.1's RoPE frequency scaling for long contexts."},
    {"rope-scaling-factor", MC_OPT_REQUIRED, OPT_ROPE_SCALING_FACTOR, "X",
     "With --use-rope-scaling: the factor low frequencies are divided by (8)."},
    {"rope-scaling-low-freq-factor", MC_OPT_REQUIRED, OPT_ROPE_LOW_FREQ, "X",
     "With --use-rope-scaling: wavelengths above the original context / X are scaled (1)."},
    {"rope-scaling-high-freq-factor", MC_OPT_REQUIRED, OPT_ROPE_HIGH_FREQ, "X",
     "With --use-rope-scaling: wavelengths below the original context / X are kept (4)."},
    {"rope-scaling-original-max-position-embeddings", MC_OPT_REQUIRED, OPT_ROPE_ORIG_MAX_POS, "N",
     "With --use-rope-scaling: the context the model was first trained for (8192)."},
    {"group-query-attention", MC_OPT_NONE, OPT_GQA, NULL, "Grouped-query attention."},
    {"num-query-groups", MC_OPT_REQUIRED, OPT_NUM_QUERY_GROUPS, "N",
     "Key/value groups (implies --group-query-attention)."},
    {"untie-embeddings-and-output-weights", MC_OPT_NONE, OPT_UNTIE, NULL,
     "A separate output layer instead of the input embedding."},
    {"disable-bias-linear", MC_OPT_NONE, OPT_DISABLE_BIAS, NULL, "No biases in linear layers."},
    {"init-method-std", MC_OPT_REQUIRED, OPT_INIT_STD, "X",
     "Standard deviation of the initial weights (0.02)."},
    {"make-vocab-size-divisible-by", MC_OPT_REQUIRED, OPT_VOCAB_DIVISIBLE, "N",
     "Pad the vocabulary to a multiple of N (128)."},
    /* tokenizer */
    {"tokenizer-type", MC_OPT_REQUIRED, OPT_TOKENIZER_TYPE, "TYPE",
     "HuggingFaceTokenizer, GPT2BPETokenizer, TikTokenizer or NullTokenizer: gives the "
     "vocabulary size."},
    {"tokenizer-model", MC_OPT_REQUIRED, OPT_TOKENIZER_MODEL, "FILE",
     "tokenizer.json or tiktoken rank file."},
    {"vocab-file", MC_OPT_REQUIRED, OPT_VOCAB_FILE, "FILE", "vocab.json (GPT2BPETokenizer)."},
    {"merge-file", MC_OPT_REQUIRED, OPT_MERGE_FILE, "FILE", "merges.txt (GPT2BPETokenizer)."},
    {"vocab-size", MC_OPT_REQUIRED, OPT_VOCAB_SIZE, "N",
     "NullTokenizer's size (ids 0..N-1, EOD N), or the vocabulary size without a tokenizer."},
    /* mixed precision */
    {"bf16", MC_OPT_NONE, OPT_BF16, NULL, "bf16 GEMMs with fp32 accumulation and master weights."},
    {"fp16", MC_OPT_NONE, OPT_FP16, NULL, "fp16 GEMMs with loss scaling and fp32 master weights."},
    {"loss-scale", MC_OPT_REQUIRED, OPT_LOSS_SCALE, "X",
     "Fixed fp16 loss scale (default: dynamic)."},
    {"initial-loss-scale", MC_OPT_REQUIRED, OPT_INITIAL_LOSS_SCALE, "X",
     "Starting dynamic loss scale (2^32)."},
    {"min-loss-scale", MC_OPT_REQUIRED, OPT_MIN_LOSS_SCALE, "X",
     "Smallest dynamic loss scale (1)."},
    {"loss-scale-window", MC_OPT_REQUIRED, OPT_LOSS_SCALE_WINDOW, "N",
     "Clean iterations before the dynamic scale doubles (1000)."},
    {"hysteresis", MC_OPT_REQUIRED, OPT_HYSTERESIS, "N",
     "Overflows before the dynamic scale halves; a clean window restores them (2)."},
    /* training */
    {"micro-batch-size", MC_OPT_REQUIRED, OPT_MICRO_BATCH, "N", "Sequences per micro-batch (1)."},
    {"global-batch-size", MC_OPT_REQUIRED, OPT_GLOBAL_BATCH, "N",
     "Sequences per iteration, accumulated over micro-batches (default: one micro-batch per "
     "data-parallel rank)."},
    {"train-iters", MC_OPT_REQUIRED, OPT_TRAIN_ITERS, "N",
     "Iterations to train for (0: save the initial state with --save and exit)."},
    {"train-samples", MC_OPT_REQUIRED, OPT_TRAIN_SAMPLES, "N",
     "Samples to train for (instead of --train-iters)."},
    {"max-nan-iters", MC_OPT_REQUIRED, OPT_MAX_NAN_ITERS, "N",
     "Fail after N iterations in a row with NaN/Inf loss or gradients (10)."},
    {"exit-signal-handler", MC_OPT_NONE, OPT_EXIT_SIGNAL_HANDLER, NULL,
     "Accepted for Megatron compatibility: mc-train always saves and exits 0 on SIGTERM/SIGINT."},
    {"exit-interval", MC_OPT_REQUIRED, OPT_EXIT_INTERVAL, "N",
     "Save and exit when the iteration is a multiple of N."},
    {"exit-duration-in-mins", MC_OPT_REQUIRED, OPT_EXIT_DURATION, "MIN",
     "Save and exit after training for MIN minutes."},
    {"seed", MC_OPT_REQUIRED, OPT_SEED, "N", "Seed of initialization and data order (1234)."},
    {"device", MC_OPT_REQUIRED, OPT_DEVICE, "DEV",
     "cpu or cuda (default: cuda when the CUDA backend is built and a GPU is present)."},
    {"threads", MC_OPT_REQUIRED, OPT_THREADS, "N", "CPU threads (default: the cores present)."},
    /* learning rate */
    {"lr", MC_OPT_REQUIRED, OPT_LR, "X", "Peak learning rate (required)."},
    {"min-lr", MC_OPT_REQUIRED, OPT_MIN_LR, "X", "Learning rate at the end of the decay (0)."},
    {"lr-decay-style", MC_OPT_REQUIRED, OPT_LR_DECAY_STYLE, "STYLE",
     "constant, linear (default), cosine, inverse-square-root or WSD."},
    {"lr-decay-iters", MC_OPT_REQUIRED, OPT_LR_DECAY_ITERS, "N",
     "Iterations of decay (default --train-iters)."},
    {"lr-decay-samples", MC_OPT_REQUIRED, OPT_LR_DECAY_SAMPLES, "N",
     "Samples of decay, with --train-samples."},
    {"lr-warmup-iters", MC_OPT_REQUIRED, OPT_LR_WARMUP_ITERS, "N",
     "Iterations of linear warmup (0)."},
    {"lr-warmup-samples", MC_OPT_REQUIRED, OPT_LR_WARMUP_SAMPLES, "N",
     "Samples of warmup, with --train-samples."},
    {"lr-warmup-fraction", MC_OPT_REQUIRED, OPT_LR_WARMUP_FRACTION, "X",
     "Warmup as a fraction of the decay."},
    {"lr-warmup-init", MC_OPT_REQUIRED, OPT_LR_WARMUP_INIT, "X",
     "Learning rate warmup starts at (0)."},
    {"lr-wsd-decay-style", MC_OPT_REQUIRED, OPT_LR_WSD_DECAY_STYLE, "STYLE",
     "WSD's annealing: exponential (default), linear, cosine or minus_sqrt."},
    {"lr-wsd-decay-iters", MC_OPT_REQUIRED, OPT_LR_WSD_DECAY_ITERS, "N",
     "WSD: iterations of the final annealing."},
    {"lr-wsd-decay-samples", MC_OPT_REQUIRED, OPT_LR_WSD_DECAY_SAMPLES, "N",
     "WSD: samples of the final annealing."},
    /* optimizer */
    {"weight-decay", MC_OPT_REQUIRED, OPT_WEIGHT_DECAY, "X",
     "AdamW weight decay (0.01), not applied to biases and norm weights."},
    {"start-weight-decay", MC_OPT_REQUIRED, OPT_START_WD, "X",
     "Weight decay at the start of training (default --weight-decay)."},
    {"end-weight-decay", MC_OPT_REQUIRED, OPT_END_WD, "X",
     "Weight decay at the end of training (default --weight-decay)."},
    {"weight-decay-incr-style", MC_OPT_REQUIRED, OPT_WD_INCR_STYLE, "STYLE",
     "constant (default), linear or cosine, from start to end weight decay."},
    {"adam-beta1", MC_OPT_REQUIRED, OPT_ADAM_BETA1, "X", "Adam beta1 (0.9)."},
    {"adam-beta2", MC_OPT_REQUIRED, OPT_ADAM_BETA2, "X", "Adam beta2 (0.999)."},
    {"adam-eps", MC_OPT_REQUIRED, OPT_ADAM_EPS, "X", "Adam epsilon (1e-8)."},
    {"clip-grad", MC_OPT_REQUIRED, OPT_CLIP_GRAD, "X",
     "Clip the global gradient norm to X (1.0; 0 disables)."},
    /* validation and logging */
    {"eval-interval", MC_OPT_REQUIRED, OPT_EVAL_INTERVAL, "N",
     "Evaluate on the validation split every N iterations (1000)."},
    {"eval-iters", MC_OPT_REQUIRED, OPT_EVAL_ITERS, "N",
     "Global batches per evaluation (100; 0 disables)."},
    {"log-interval", MC_OPT_REQUIRED, OPT_LOG_INTERVAL, "N",
     "Print the log line every N iterations (100)."},
    {"tensorboard-dir", MC_OPT_REQUIRED, OPT_TENSORBOARD_DIR, "DIR",
     "Write TensorBoard event files."},
    {"log-json", MC_OPT_REQUIRED, OPT_LOG_JSON, "FILE", "Append the metrics as JSON lines."},
    {"peak-tflops", MC_OPT_REQUIRED, OPT_PEAK_TFLOPS, "X",
     "Peak TFLOP/s of the machine, for the MFU column."},
    {"log-comm", MC_OPT_NONE, OPT_LOG_COMM, NULL,
     "After each log line, the bytes and time of each group's collectives per iteration."},
    /* checkpointing */
    {"save", MC_OPT_REQUIRED, OPT_SAVE, "DIR", "Checkpoint directory to write."},
    {"load", MC_OPT_REQUIRED, OPT_LOAD, "DIR",
     "Checkpoint directory (or iteration) to resume from."},
    {"save-interval", MC_OPT_REQUIRED, OPT_SAVE_INTERVAL, "N",
     "Save every N iterations (and always at the end)."},
    {"finetune", MC_OPT_NONE, OPT_FINETUNE, NULL,
     "Load only the weights and start at iteration 0."},
    {"use-checkpoint-args", MC_OPT_NONE, OPT_USE_CKPT_ARGS, NULL,
     "Take the model's architecture and vocabulary size from the --load checkpoint (model flags "
     "given still override), e.g. to fine-tune a Hugging Face import."},
    {"no-load-optim", MC_OPT_NONE, OPT_NO_LOAD_OPTIM, NULL, "Do not load the optimizer state."},
    {"no-verify", MC_OPT_NONE, OPT_NO_VERIFY, NULL,
     "Do not check the --load checkpoint's files against its checksums.xxh128 manifest "
     "before reading them (faster; a damaged file may then crash HDF5)."},
    {"no-save-optim", MC_OPT_NONE, OPT_NO_SAVE_OPTIM, NULL, "Do not save the optimizer state."},
    {"async-save", MC_OPT_NONE, OPT_ASYNC_SAVE, NULL,
     "Write checkpoints from a copy of the state while training goes on."},
    {"ckpt-compression", MC_OPT_REQUIRED, OPT_CKPT_COMPRESSION, "none|zstd",
     "Compress checkpoint tensors (HDF5 filter 32015)."},
    /* data */
    {"data-path", MC_OPT_REQUIRED, OPT_DATA_PATH, "[W] PREFIX...",
     "Dataset prefixes, optionally weighted: 0.3 A 0.7 B (words after it are taken until "
     "the next option; repeatable). Default: one prefix read from stdin."},
    {"split", MC_OPT_REQUIRED, OPT_SPLIT, "A,B,C", "Train, validation, test weights (969,30,1)."},
    {"data-cache-path", MC_OPT_REQUIRED, OPT_DATA_CACHE_PATH, "DIR",
     "Where dataset indices are cached."},
    {"mock-data", MC_OPT_NONE, OPT_MOCK_DATA, NULL,
     "Megatron Core's mock dataset instead of a dataset: documents 1, 2, ..., n-1, eod."},
    {"sft", MC_OPT_NONE, OPT_SFT, NULL,
     "Supervised fine-tuning: --data-path is an SFT dataset (mc-preprocess --dataset-type sft); "
     "whole conversations packed into each sample, the loss over the loss mask's tokens only; "
     "implies --reset-position-ids, --reset-attention-mask and --eod-mask-loss."},
    {"dpo", MC_OPT_NONE, OPT_DPO, NULL,
     "Direct preference optimization: --data-path is a preference dataset (mc-preprocess "
     "--dataset-type preference); a sample is a (chosen, rejected) pair, each padded to "
     "--seq-length; the reference's log-probabilities are computed once before training. "
     "No pipeline parallelism."},
    {"dpo-beta", MC_OPT_REQUIRED, OPT_DPO_BETA, "B",
     "With --dpo: the KL coefficient beta (TRL's default 0.1)."},
    {"dpo-loss-type", MC_OPT_REQUIRED, OPT_DPO_LOSS_TYPE, "sigmoid|ipo|hinge",
     "With --dpo: the loss, TRL's formulas (default sigmoid)."},
    {"dpo-label-smoothing", MC_OPT_REQUIRED, OPT_DPO_LABEL_SMOOTHING, "E",
     "With --dpo and the sigmoid loss: the probability that a label is flipped, in [0, 0.5) "
     "(conservative DPO; default 0)."},
    {"ref-load", MC_OPT_REQUIRED, OPT_REF_LOAD, "CKPT",
     "With --dpo: the frozen reference model (same architecture); default: the weights the run "
     "starts from."},
    {"kd-teacher", MC_OPT_REQUIRED, OPT_KD_TEACHER, "CKPT",
     "Knowledge distillation from the frozen model of checkpoint CKPT (any size and grid it was "
     "saved under, the student's padded vocabulary): the loss mixes the cross-entropy with the "
     "forward KL from the teacher's softmax to the student's. One pipeline stage only."},
    {"kd-temperature", MC_OPT_REQUIRED, OPT_KD_TEMPERATURE, "T",
     "Distillation: softmax temperature of both models' logits in the KL (1; > 0)."},
    {"kd-alpha", MC_OPT_REQUIRED, OPT_KD_ALPHA, "A",
     "Distillation: loss = (1 - A) cross-entropy + A T^2 KL (0.5; 0 to 1)."},
    {"reset-position-ids", MC_OPT_NONE, OPT_RESET_POSITION_IDS, NULL,
     "Packed documents: positions restart at 0 after each end-of-document token."},
    {"reset-attention-mask", MC_OPT_NONE, OPT_RESET_ATTENTION_MASK, NULL,
     "Packed documents: attention does not cross an end-of-document token."},
    {"eod-mask-loss", MC_OPT_NONE, OPT_EOD_MASK_LOSS, NULL,
     "Leave out of the loss the positions whose input is the end-of-document token."},
    /* distributed (under mpirun or srun; data-parallel size = ranks / (TP x PP x CP)) */
    {"tensor-model-parallel-size", MC_OPT_REQUIRED, OPT_TP, "N",
     "Ranks that split each layer (1); must divide the heads, query groups and FFN size."},
    {"pipeline-model-parallel-size", MC_OPT_REQUIRED, OPT_PP, "N",
     "Pipeline stages (1); the layers split evenly over them unless given below."},
    {"decoder-first-pipeline-num-layers", MC_OPT_REQUIRED, OPT_PP_FIRST, "N",
     "Layers on the first pipeline stage (the rest split evenly)."},
    {"num-layers-per-virtual-pipeline-stage", MC_OPT_REQUIRED, OPT_VPP, "N",
     "Interleaved pipeline schedule: N layers per virtual stage (chunk)."},
    {"decoder-last-pipeline-num-layers", MC_OPT_REQUIRED, OPT_PP_LAST, "N",
     "Layers on the last pipeline stage (the rest split evenly)."},
    {"context-parallel-size", MC_OPT_REQUIRED, OPT_CP, "N",
     "Ranks that split every sequence (1): each holds 2 of its 2N chunks; attention runs "
     "across them."},
    {"cp-comm-type", MC_OPT_REQUIRED, OPT_CP_COMM_TYPE, "TYPE",
     "Attention under context parallelism: p2p (ring attention, the default) or a2a "
     "(all-to-all over the heads, as DeepSpeed-Ulysses)."},
    {"sequence-parallel", MC_OPT_NONE, OPT_SEQUENCE_PARALLEL, NULL,
     "Split the activations outside attention and MLP along the sequence over TP."},
    {"use-distributed-optimizer", MC_OPT_NONE, OPT_DIST_OPT, NULL,
     "Shard the Adam state over the data-parallel ranks."},
    {"overlap-grad-reduce", MC_OPT_NONE, OPT_OVERLAP_GRAD, NULL,
     "Reduce gradient buckets during the last backward pass."},
    {"overlap-param-gather", MC_OPT_NONE, OPT_OVERLAP_PARAM, NULL,
     "With --use-distributed-optimizer: gather the parameters in the background."},
    {"ddp-bucket-size", MC_OPT_REQUIRED, OPT_DDP_BUCKET, "N",
     "Gradient elements per data-parallel bucket (default: one bucket, or max(40M, 1M x DP) "
     "with --overlap-grad-reduce)."},
    {"distributed-timeout-minutes", MC_OPT_REQUIRED, OPT_DIST_TIMEOUT, "MIN",
     "Abort the whole job when a collective waits longer than MIN minutes (10)."},
    /* activation recomputation */
    {"recompute-granularity", MC_OPT_REQUIRED, OPT_RECOMPUTE_GRANULARITY, "full|selective",
     "Recompute activations in the backward instead of keeping them: whole layers (full) or "
     "the --recompute-modules of every layer (selective). Bit-identical results."},
    {"recompute-method", MC_OPT_REQUIRED, OPT_RECOMPUTE_METHOD, "uniform|block",
     "Full recomputation: groups of --recompute-num-layers layers keeping only each group's "
     "input (uniform), or only the first --recompute-num-layers layers of each stage (block)."},
    {"recompute-num-layers", MC_OPT_REQUIRED, OPT_RECOMPUTE_NUM_LAYERS, "N",
     "Full recomputation: the layers of a group (uniform) or of a stage (block)."},
    {"recompute-modules", MC_OPT_REQUIRED, OPT_RECOMPUTE_MODULES, "M...",
     "Selective recomputation: any of core_attn, layernorm, mlp, mlp_act, attn_proj, moe, "
     "moe_act, shared_experts "
     "(core_attn)."},
    {"recompute-activations", MC_OPT_NONE, OPT_RECOMPUTE_ACTIVATIONS, NULL,
     "Megatron's shorthand for --recompute-granularity selective."},
    /* planning */
    {"dry-run", MC_OPT_NONE, OPT_DRY_RUN, NULL,
     "Print each pipeline stage's memory (parameters, gradients, optimizer, activations) and "
     "each group's communication per iteration for the grid, then exit; allocates nothing."},
    {"world-size", MC_OPT_REQUIRED, OPT_WORLD_SIZE, "N",
     "With --dry-run: the ranks to plan for (default TP x PP, i.e. DP = 1)."},
    /* mixture of experts */
    {"num-experts", MC_OPT_REQUIRED, OPT_NUM_EXPERTS, "E",
     "Mixture of experts: E experts in each MoE layer's MLP (default none: dense)."},
    {"moe-ffn-hidden-size", MC_OPT_REQUIRED, OPT_MOE_FFN, "N",
     "Hidden size of each expert (default --ffn-hidden-size)."},
    {"moe-router-topk", MC_OPT_REQUIRED, OPT_MOE_TOPK, "K", "Experts each token goes through (2)."},
    {"moe-router-score-function", MC_OPT_REQUIRED, OPT_MOE_SCORE, "FN",
     "softmax (default) or sigmoid: the router's scores."},
    {"moe-router-pre-softmax", MC_OPT_NONE, OPT_MOE_PRE_SOFTMAX, NULL,
     "Softmax over all experts before the top-k (default: softmax of the top-k logits)."},
    {"moe-router-topk-scaling-factor", MC_OPT_REQUIRED, OPT_MOE_SCALING, "X",
     "Multiply the top-k probabilities by X (default none)."},
    {"moe-router-num-groups", MC_OPT_REQUIRED, OPT_MOE_NUM_GROUPS, "G",
     "Group-limited routing: the experts in G groups."},
    {"moe-router-group-topk", MC_OPT_REQUIRED, OPT_MOE_GROUP_TOPK, "N",
     "Group-limited routing: each token's experts from its best N groups."},
    {"moe-router-enable-expert-bias", MC_OPT_NONE, OPT_MOE_EXPERT_BIAS, NULL,
     "Aux-loss-free balancing: a per-expert bias on the sigmoid scores, moved each iteration."},
    {"moe-router-bias-update-rate", MC_OPT_REQUIRED, OPT_MOE_BIAS_RATE, "X",
     "The expert bias's update step per iteration (1e-3)."},
    {"moe-router-load-balancing-type", MC_OPT_REQUIRED, OPT_MOE_LB_TYPE, "TYPE",
     "aux_loss (default), seq_aux_loss or none."},
    {"moe-aux-loss-coeff", MC_OPT_REQUIRED, OPT_MOE_AUX_COEFF, "X",
     "Weight of the load-balancing loss (0: off)."},
    {"moe-z-loss-coeff", MC_OPT_REQUIRED, OPT_MOE_Z_COEFF, "X",
     "Weight of the router z-loss (default none)."},
    {"moe-shared-expert-intermediate-size", MC_OPT_REQUIRED, OPT_MOE_SHARED, "N",
     "Shared experts beside the routed ones: their hidden size (needs --disable-bias-linear)."},
    {"moe-expert-capacity-factor", MC_OPT_REQUIRED, OPT_MOE_CAPACITY, "X",
     "Expert capacity as a multiple of the even share N K / E (default: no dropping)."},
    {"moe-token-drop-policy", MC_OPT_REQUIRED, OPT_MOE_DROP_POLICY, "POLICY",
     "probs (default) or position: which tokens an expert over capacity drops."},
    {"moe-pad-expert-input-to-capacity", MC_OPT_NONE, OPT_MOE_PAD, NULL,
     "Pad each expert's rows to its capacity."},
    {"moe-layer-freq", MC_OPT_REQUIRED, OPT_MOE_LAYER_FREQ, "SPEC",
     "MoE layers: every k-th (an integer, 1 = all) or a list such as ([0]*1+[1]*3)*4."},
    {"moe-per-layer-logging", MC_OPT_NONE, OPT_MOE_PER_LAYER_LOGGING, NULL,
     "Also write each layer's balancing losses to the metrics (moe/<name>_layer_<i>)."},
    {"expert-model-parallel-size", MC_OPT_REQUIRED, OPT_EP, "N",
     "Expert parallelism: N ranks split each MoE layer's experts (1)."},
    {"fp8-format", MC_OPT_REQUIRED, OPT_FP8_FORMAT, "FMT",
     "FP8 for the transformer layers' dense linears (Transformer Engine's delayed scaling): "
     "e4m3 (every operand E4M3) or hybrid (E4M3 forward, E5M2 output gradients); emulated "
     "exactly on the CPU backend, not available on the GPU yet."},
    {"fp8-amax-history-len", MC_OPT_REQUIRED, OPT_FP8_HISTORY, "N",
     "Steps of amax history each FP8 scale is computed from (1)."},
    {"fp8-amax-compute-algo", MC_OPT_REQUIRED, OPT_FP8_ALGO, "ALGO",
     "most_recent (the default) or max: which amax of the history sets the scale."},
    {"fp8-margin", MC_OPT_REQUIRED, OPT_FP8_MARGIN, "N",
     "Scale FP8 operands down by 2^N below the largest value the format holds (0)."},
    {"expert-tensor-parallel-size", MC_OPT_REQUIRED, OPT_ETP, "N",
     "Tensor parallelism inside the experts: a divisor of --tensor-model-parallel-size; 1 "
     "(replicated over TP, the default), TP (split like the dense MLP), or between (split over "
     "groups of N consecutive TP ranks, replicated over the TP / N groups)."},
    {"moe-token-dispatcher-type", MC_OPT_REQUIRED, OPT_MOE_DISPATCHER, "TYPE",
     "alltoall (default) or allgather: how tokens reach their experts' ranks."},
    {NULL, 0, 0, NULL, NULL},
};

/* Model flags given on the command line, applied over the preset. */
enum {
    SET_LAYERS = 1 << 0,
    SET_HIDDEN = 1 << 1,
    SET_HEADS = 1 << 2,
    SET_FFN = 1 << 3,
    SET_KV = 1 << 4,
    SET_SEQ = 1 << 5,
    SET_MAXPOS = 1 << 6,
    SET_NORM = 1 << 7,
    SET_EPS = 1 << 8,
    SET_SWIGLU = 1 << 9,
    SET_POS = 1 << 10,
    SET_ROPE_BASE = 1 << 11,
    SET_GROUPS = 1 << 12,
    SET_UNTIE = 1 << 13,
    SET_NOBIAS = 1 << 14,
    SET_STD = 1 << 15,
    SET_DIVISIBLE = 1 << 16,
    SET_ROPE_PERCENT = 1 << 17,
    SET_ROPE_SCALING = 1 << 18, /* --use-rope-scaling */
    SET_ROPE_FACTOR = 1 << 19,
    SET_ROPE_LOW = 1 << 20,
    SET_ROPE_HIGH = 1 << 21,
    SET_ROPE_ORIG = 1 << 22,
    SET_KD_OPTS = 1 << 23, /* --kd-temperature or --kd-alpha */
};

typedef struct args {
    const char *preset;
    int use_ckpt_args; /* --use-checkpoint-args: the base is --load's config */
    mc_model_config m; /* values of the flags in `set` */
    unsigned set;
    uint32_t moe_set; /* the MoE flags given: 1 << (OPT_x - OPT_NUM_EXPERTS) */
    int64_t ep;       /* --expert-model-parallel-size */
    int64_t etp;      /* --expert-tensor-parallel-size (a divisor of tp) */
    int fp8, fp8_history, fp8_max, fp8_margin; /* --fp8-*: 0 off, 1 e4m3, 2 hybrid */
    int dispatcher_allgather;                  /* --moe-token-dispatcher-type allgather */
    int gqa;
    int have_tokenizer;
    mc_tokenizer_spec tok;
    int64_t vocab_size;
    mc_buf data_path; /* the words of --data-path (mc_buf_strs) */
    const char *split;
    const char *data_cache_path;
    int mock;
    int sft;     /* --sft */
    int dpo_set; /* an option of --dpo's given */
    int reset_position_ids, reset_attention_mask, eod_mask_loss;
    const char *device;
    int64_t threads;
    mc_train_config t;
    int64_t tp, pp, cp;        /* grid sizes (1) */
    int64_t pp_first, pp_last; /* --decoder-first/last-pipeline-num-layers (0: even) */
    int64_t vpp;               /* --num-layers-per-virtual-pipeline-stage (0: none) */
    int sequence_parallel;
    int qk_layernorm; /* --qk-layernorm */
    int cp_comm_type; /* --cp-comm-type: MC_CP_P2P or MC_CP_A2A */
    /* --recompute-*: mc_model_config's recompute fields */
    int recompute_granularity, recompute_method, recompute_num_layers;
    unsigned recompute_modules;
    double dist_timeout; /* --distributed-timeout-minutes (0: the grid's 10) */
    json_t *argv_json;   /* every option as given, for the checkpoint */
    int dry_run;         /* --dry-run: print the plan (mc/plan.h) and exit */
    int64_t world_size;  /* --world-size, for --dry-run (0: TP x PP) */
} args;

static void print_line(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

static const mc_choice cp_comm_types[] = {
    {"p2p", MC_CP_P2P},
    {"a2a", MC_CP_A2A},
    {NULL, 0},
};
static const mc_choice score_functions[] = {{"softmax", 0}, {"sigmoid", 1}, {NULL, 0}};
static const mc_choice lb_types[] = {{"aux_loss", MC_MOE_LB_AUX},
                                     {"seq_aux_loss", MC_MOE_LB_SEQ_AUX},
                                     {"none", MC_MOE_LB_NONE},
                                     {NULL, 0}};
static const mc_choice drop_policies[] = {{"probs", 0}, {"position", 1}, {NULL, 0}};
static const mc_choice dispatchers[] = {{"alltoall", 0}, {"allgather", 1}, {NULL, 0}};

static const mc_choice normalizations[] = {
    {"LayerNorm", MC_NORM_LAYERNORM},
    {"RMSNorm", MC_NORM_RMSNORM},
    {NULL, 0},
};
static const mc_choice recompute_granularities[] = {
    {"full", MC_RECOMPUTE_FULL},
    {"selective", MC_RECOMPUTE_SELECTIVE},
    {NULL, 0},
};
static const mc_choice recompute_methods[] = {
    {"uniform", MC_RECOMPUTE_UNIFORM},
    {"block", MC_RECOMPUTE_BLOCK},
    {NULL, 0},
};
static const mc_choice position_types[] = {
    {"learned_absolute", MC_POS_LEARNED},
    {"rope", MC_POS_ROPE},
    {NULL, 0},
};

/* Record "--name value" in the JSON of the arguments (lists for repeated
 * options such as --data-path; true for flags). */
static void record_arg(json_t *obj, const char *name, const char *value)
{
    json_t *v = value ? json_string(value) : json_true();
    json_t *old = json_object_get(obj, name);
    if (old && value && !strcmp(name, "data-path")) {
        if (!json_is_array(old)) {
            json_t *arr = json_array();
            json_array_append(arr, old);
            json_object_set_new(obj, name, arr);
            old = arr;
        }
        json_array_append_new(old, v);
        return;
    }
    json_object_set_new(obj, name, v);
}

static mc_status parse_args(mc_cli *cli, args *a, int *exit_now, mc_error *err)
{
    const char *arg;
    int key;
    mc_train_config *t = &a->t;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0) {
        mc_status st = MC_OK;
        const mc_option *o = NULL;
        for (const mc_option *p = options; p->name; p++)
            if (p->key == key) o = p;
        if (o) record_arg(a->argv_json, o->name, arg);
        int v;
        if (key >= OPT_NUM_EXPERTS && key < OPT_EP) a->moe_set |= 1u << (key - OPT_NUM_EXPERTS);
        switch (key) {
        case OPT_MODEL: a->preset = arg; break;
        case OPT_NUM_LAYERS:
            st = mc_parse_int("--num-layers", arg, 1, INT32_MAX, &a->m.num_layers, err);
            a->set |= SET_LAYERS;
            break;
        case OPT_HIDDEN_SIZE:
            st = mc_parse_int("--hidden-size", arg, 1, INT32_MAX, &a->m.hidden_size, err);
            a->set |= SET_HIDDEN;
            break;
        case OPT_NUM_HEADS:
            st = mc_parse_int("--num-attention-heads", arg, 1, INT32_MAX, &a->m.num_attention_heads,
                              err);
            a->set |= SET_HEADS;
            break;
        case OPT_FFN_HIDDEN:
            st = mc_parse_int("--ffn-hidden-size", arg, 1, INT32_MAX, &a->m.ffn_hidden_size, err);
            a->set |= SET_FFN;
            break;
        case OPT_KV_CHANNELS:
            st = mc_parse_int("--kv-channels", arg, 1, INT32_MAX, &a->m.kv_channels, err);
            a->set |= SET_KV;
            break;
        case OPT_SEQ_LENGTH:
            st = mc_parse_int("--seq-length", arg, 1, INT32_MAX, &a->m.seq_length, err);
            a->set |= SET_SEQ;
            break;
        case OPT_MAX_POS:
            st = mc_parse_int("--max-position-embeddings", arg, 1, INT32_MAX,
                              &a->m.max_position_embeddings, err);
            a->set |= SET_MAXPOS;
            break;
        case OPT_NORMALIZATION:
            if (!(st = mc_parse_choice("--normalization", NULL, arg, normalizations, &v, err)))
                a->m.normalization = (mc_norm_kind)v;
            a->set |= SET_NORM;
            break;
        case OPT_NORM_EPS:
            st = mc_parse_float("--norm-epsilon", arg, 1e-30, 1, &a->m.norm_epsilon, err);
            a->set |= SET_EPS;
            break;
        case OPT_SWIGLU: a->m.swiglu = 1, a->set |= SET_SWIGLU; break;
        case OPT_QK_LAYERNORM: a->qk_layernorm = 1; break;
        case OPT_POS_TYPE:
            st = mc_parse_choice("--position-embedding-type", NULL, arg, position_types, &v, err);
            if (!st) a->m.position_embedding_type = (mc_pos_kind)v;
            a->set |= SET_POS;
            break;
        case OPT_ROTARY_PERCENT:
            st = mc_parse_float("--rotary-percent", arg, 1e-6f, 1, &a->m.rotary_percent, err);
            a->set |= SET_ROPE_PERCENT;
            break;
        case OPT_USE_ROPE_SCALING: a->set |= SET_ROPE_SCALING; break;
        case OPT_ROPE_SCALING_FACTOR:
            st = mc_parse_float("--rope-scaling-factor", arg, 1, 1e6, &a->m.rope_scaling_factor,
                                err);
            a->set |= SET_ROPE_FACTOR;
            break;
        case OPT_ROPE_LOW_FREQ:
            st = mc_parse_float("--rope-scaling-low-freq-factor", arg, 1e-6f, 1e6,
                                &a->m.rope_low_freq_factor, err);
            a->set |= SET_ROPE_LOW;
            break;
        case OPT_ROPE_HIGH_FREQ:
            st = mc_parse_float("--rope-scaling-high-freq-factor", arg, 1e-6f, 1e6,
                                &a->m.rope_high_freq_factor, err);
            a->set |= SET_ROPE_HIGH;
            break;
        case OPT_ROPE_ORIG_MAX_POS: {
            int64_t v;
            st = mc_parse_i64("--rope-scaling-original-max-position-embeddings", arg, 1, INT32_MAX,
                              &v, err);
            a->m.rope_original_max_position_embeddings = (int)v;
            a->set |= SET_ROPE_ORIG;
            break;
        }
        case OPT_ROTARY_BASE:
            st = mc_parse_float("--rotary-base", arg, 1, 1e12, &a->m.rotary_base, err);
            a->set |= SET_ROPE_BASE;
            break;
        case OPT_GQA: a->gqa = 1; break;
        case OPT_NUM_QUERY_GROUPS:
            st = mc_parse_int("--num-query-groups", arg, 1, INT32_MAX, &a->m.num_query_groups, err);
            a->set |= SET_GROUPS;
            break;
        case OPT_UNTIE: a->m.untie_embeddings_and_output_weights = 1, a->set |= SET_UNTIE; break;
        case OPT_DISABLE_BIAS: a->m.add_bias_linear = 0, a->set |= SET_NOBIAS; break;
        case OPT_INIT_STD:
            st = mc_parse_float("--init-method-std", arg, 0, 10, &a->m.init_method_std, err);
            a->set |= SET_STD;
            break;
        case OPT_VOCAB_DIVISIBLE:
            st = mc_parse_int("--make-vocab-size-divisible-by", arg, 1, INT32_MAX,
                              &a->m.make_vocab_size_divisible_by, err);
            a->set |= SET_DIVISIBLE;
            break;
        case OPT_TOKENIZER_TYPE: {
            mc_tokenizer_kind k;
            st = mc_tokenizer_kind_parse(arg, &k, err);
            if (!st) {
                /* the spec's defaults do not depend on the kind (main sets
                 * them), so options given before --tokenizer-type stay */
                a->tok.kind = k;
                a->have_tokenizer = 1;
            }
            break;
        }
        case OPT_TOKENIZER_MODEL: a->tok.model = arg; break;
        case OPT_VOCAB_FILE: a->tok.vocab_file = arg; break;
        case OPT_MERGE_FILE: a->tok.merge_file = arg; break;
        case OPT_VOCAB_SIZE:
            st = mc_parse_i64("--vocab-size", arg, 1, INT32_MAX, &a->vocab_size, err);
            break;
        case OPT_BF16: t->prec = MC_PREC_BF16; break;
        case OPT_FP16: t->prec = MC_PREC_FP16; break;
        case OPT_LOSS_SCALE:
            st = mc_parse_double("--loss-scale", arg, 1e-30, 1e38, &t->loss_scale, err);
            break;
        case OPT_INITIAL_LOSS_SCALE:
            st = mc_parse_double("--initial-loss-scale", arg, 1e-30, 1e38, &t->initial_loss_scale,
                                 err);
            break;
        case OPT_MIN_LOSS_SCALE:
            st = mc_parse_double("--min-loss-scale", arg, 1e-30, 1e38, &t->min_loss_scale, err);
            break;
        case OPT_LOSS_SCALE_WINDOW:
            st = mc_parse_i64("--loss-scale-window", arg, 1, INT32_MAX, &t->loss_scale_window, err);
            break;
        case OPT_HYSTERESIS:
            st = mc_parse_i64("--hysteresis", arg, 1, INT32_MAX, &t->hysteresis, err);
            break;
        case OPT_MICRO_BATCH:
            st = mc_parse_i64("--micro-batch-size", arg, 1, INT32_MAX, &t->micro_batch_size, err);
            break;
        case OPT_GLOBAL_BATCH:
            st = mc_parse_i64("--global-batch-size", arg, 1, INT32_MAX, &t->global_batch_size, err);
            break;
        case OPT_TRAIN_ITERS:
            /* 0: save the initial state and train nothing (init_only) */
            st = mc_parse_i64("--train-iters", arg, 0, INT64_MAX / 2, &t->train_iters, err);
            t->init_only = !st && t->train_iters == 0;
            break;
        case OPT_TRAIN_SAMPLES:
            st = mc_parse_i64("--train-samples", arg, 1, INT64_MAX / 2, &t->train_samples, err);
            break;
        case OPT_MAX_NAN_ITERS:
            st = mc_parse_i64("--max-nan-iters", arg, 1, INT32_MAX, &t->max_nan_iters, err);
            break;
        case OPT_EXIT_SIGNAL_HANDLER: break;
        case OPT_EXIT_INTERVAL:
            st = mc_parse_i64("--exit-interval", arg, 1, INT64_MAX / 2, &t->exit_interval, err);
            break;
        case OPT_EXIT_DURATION:
            st = mc_parse_double("--exit-duration-in-mins", arg, 0, 1e9, &t->exit_duration_in_mins,
                                 err);
            break;
        case OPT_SEED: st = mc_parse_u64("--seed", arg, 0, UINT32_MAX, &t->seed, err); break;
        case OPT_DEVICE: a->device = arg; break;
        case OPT_THREADS: st = mc_parse_i64("--threads", arg, 1, 4096, &a->threads, err); break;
        case OPT_LR: st = mc_parse_double("--lr", arg, 0, 1e30, &t->sched.lr, err); break;
        case OPT_MIN_LR:
            st = mc_parse_double("--min-lr", arg, 0, 1e30, &t->sched.min_lr, err);
            break;
        case OPT_LR_DECAY_STYLE:
            st = mc_lr_decay_style_parse(arg, &t->sched.decay_style, err);
            break;
        case OPT_LR_DECAY_ITERS:
            st = mc_parse_i64("--lr-decay-iters", arg, 1, INT64_MAX / 2, &t->sched.lr_decay_iters,
                              err);
            break;
        case OPT_LR_DECAY_SAMPLES:
            st = mc_parse_i64("--lr-decay-samples", arg, 1, INT64_MAX / 2,
                              &t->sched.lr_decay_samples, err);
            break;
        case OPT_LR_WARMUP_ITERS:
            st = mc_parse_i64("--lr-warmup-iters", arg, 0, INT64_MAX / 2, &t->sched.lr_warmup_iters,
                              err);
            break;
        case OPT_LR_WARMUP_SAMPLES:
            st = mc_parse_i64("--lr-warmup-samples", arg, 0, INT64_MAX / 2,
                              &t->sched.lr_warmup_samples, err);
            break;
        case OPT_LR_WARMUP_FRACTION:
            st = mc_parse_double("--lr-warmup-fraction", arg, 0, 1, &t->sched.lr_warmup_fraction,
                                 err);
            break;
        case OPT_LR_WARMUP_INIT:
            st = mc_parse_double("--lr-warmup-init", arg, 0, 1e30, &t->sched.lr_warmup_init, err);
            break;
        case OPT_LR_WSD_DECAY_STYLE:
            st = mc_wsd_decay_style_parse(arg, &t->sched.wsd_decay_style, err);
            break;
        case OPT_LR_WSD_DECAY_ITERS:
            st = mc_parse_i64("--lr-wsd-decay-iters", arg, 0, INT64_MAX / 2,
                              &t->sched.lr_wsd_decay_iters, err);
            break;
        case OPT_LR_WSD_DECAY_SAMPLES:
            st = mc_parse_i64("--lr-wsd-decay-samples", arg, 0, INT64_MAX / 2,
                              &t->sched.lr_wsd_decay_samples, err);
            break;
        case OPT_WEIGHT_DECAY:
            st = mc_parse_double("--weight-decay", arg, 0, 1e6, &t->sched.weight_decay, err);
            break;
        case OPT_START_WD:
            st = mc_parse_double("--start-weight-decay", arg, 0, 1e6, &t->sched.start_weight_decay,
                                 err);
            break;
        case OPT_END_WD:
            st = mc_parse_double("--end-weight-decay", arg, 0, 1e6, &t->sched.end_weight_decay,
                                 err);
            break;
        case OPT_WD_INCR_STYLE:
            st = mc_wd_incr_style_parse(arg, &t->sched.wd_incr_style, err);
            break;
        case OPT_ADAM_BETA1:
            st = mc_parse_double("--adam-beta1", arg, 0, 0.999999999, &t->optim.beta1, err);
            break;
        case OPT_ADAM_BETA2:
            st = mc_parse_double("--adam-beta2", arg, 0, 0.999999999, &t->optim.beta2, err);
            break;
        case OPT_ADAM_EPS:
            st = mc_parse_double("--adam-eps", arg, 1e-30, 1, &t->optim.eps, err);
            break;
        case OPT_CLIP_GRAD:
            st = mc_parse_double("--clip-grad", arg, 0, 1e30, &t->optim.clip_grad, err);
            break;
        case OPT_EVAL_INTERVAL:
            st = mc_parse_i64("--eval-interval", arg, 1, INT64_MAX / 2, &t->eval_interval, err);
            break;
        case OPT_EVAL_ITERS:
            st = mc_parse_i64("--eval-iters", arg, 0, INT64_MAX / 2, &t->eval_iters, err);
            break;
        case OPT_LOG_INTERVAL:
            st = mc_parse_i64("--log-interval", arg, 1, INT64_MAX / 2, &t->log_interval, err);
            break;
        case OPT_TENSORBOARD_DIR: t->tensorboard_dir = arg; break;
        case OPT_LOG_JSON: t->log_json = arg; break;
        case OPT_LOG_COMM: t->log_comm = 1; break;
        case OPT_PEAK_TFLOPS:
            st = mc_parse_double("--peak-tflops", arg, 1e-9, 1e12, &t->peak_tflops, err);
            break;
        case OPT_SAVE: t->save = arg; break;
        case OPT_LOAD: t->load = arg; break;
        case OPT_SAVE_INTERVAL:
            st = mc_parse_i64("--save-interval", arg, 1, INT64_MAX / 2, &t->save_interval, err);
            break;
        case OPT_FINETUNE: t->finetune = 1; break;
        case OPT_USE_CKPT_ARGS: a->use_ckpt_args = 1; break;
        case OPT_NO_LOAD_OPTIM: t->no_load_optim = 1; break;
        case OPT_NO_VERIFY: mc_ckpt_set_verify(0); break;
        case OPT_NO_SAVE_OPTIM: t->no_save_optim = 1; break;
        case OPT_ASYNC_SAVE: t->async_save = 1; break;
        case OPT_CKPT_COMPRESSION: {
            mc_ckpt_compression c;
            st = mc_ckpt_compression_parse(arg, &c, err);
            if (st == MC_OK)
                t->ckpt_compression = (int)c;
            else
                st = mc_error_prefix(err, "--ckpt-compression");
            if (st) err->code = st = MC_ERR_USAGE;
            break;
        }
        case OPT_DATA_PATH: st = mc_buf_push_str(&a->data_path, arg, err); break;
        case OPT_SPLIT: a->split = arg; break;
        case OPT_DATA_CACHE_PATH: a->data_cache_path = arg; break;
        case OPT_MOCK_DATA: a->mock = 1; break;
        case OPT_SFT: a->sft = 1; break;
        case OPT_DPO: t->dpo.on = 1; break;
        case OPT_DPO_BETA:
            st = mc_parse_double("--dpo-beta", arg, 1e-12, 1e12, &t->dpo.beta, err);
            a->dpo_set = 1;
            break;
        case OPT_DPO_LOSS_TYPE: {
            static const mc_choice types[] = {{"sigmoid", MC_DPO_SIGMOID},
                                              {"ipo", MC_DPO_IPO},
                                              {"hinge", MC_DPO_HINGE},
                                              {NULL, 0}};
            int v = 0;
            st = mc_parse_choice("--dpo-loss-type", NULL, arg, types, &v, err);
            t->dpo.loss_type = (mc_dpo_loss)v;
            a->dpo_set = 1;
            break;
        }
        case OPT_DPO_LABEL_SMOOTHING:
            st = mc_parse_double("--dpo-label-smoothing", arg, 0, 0.4999999,
                                 &t->dpo.label_smoothing, err);
            a->dpo_set = 1;
            break;
        case OPT_REF_LOAD:
            t->dpo.ref_load = arg;
            a->dpo_set = 1;
            break;
        case OPT_KD_TEACHER: t->kd_teacher = arg; break;
        case OPT_KD_TEMPERATURE:
            st = mc_parse_float("--kd-temperature", arg, 1e-3, 1e3, &t->kd_temperature, err);
            a->set |= SET_KD_OPTS;
            break;
        case OPT_KD_ALPHA:
            st = mc_parse_float("--kd-alpha", arg, 0, 1, &t->kd_alpha, err);
            a->set |= SET_KD_OPTS;
            break;
        case OPT_RESET_POSITION_IDS: a->reset_position_ids = 1; break;
        case OPT_RESET_ATTENTION_MASK: a->reset_attention_mask = 1; break;
        case OPT_EOD_MASK_LOSS: a->eod_mask_loss = 1; break;
        case OPT_TP:
            st = mc_parse_i64("--tensor-model-parallel-size", arg, 1, 65536, &a->tp, err);
            break;
        case OPT_PP:
            st = mc_parse_i64("--pipeline-model-parallel-size", arg, 1, 65536, &a->pp, err);
            break;
        case OPT_PP_FIRST:
            st = mc_parse_i64("--decoder-first-pipeline-num-layers", arg, 1, 1 << 20, &a->pp_first,
                              err);
            break;
        case OPT_PP_LAST:
            st = mc_parse_i64("--decoder-last-pipeline-num-layers", arg, 1, 1 << 20, &a->pp_last,
                              err);
            break;
        case OPT_VPP:
            st = mc_parse_i64("--num-layers-per-virtual-pipeline-stage", arg, 1, 1 << 20, &a->vpp,
                              err);
            break;
        case OPT_CP:
            st = mc_parse_i64("--context-parallel-size", arg, 1, 65536, &a->cp, err);
            break;
        case OPT_CP_COMM_TYPE:
            if (!(st = mc_parse_choice("--cp-comm-type", NULL, arg, cp_comm_types, &v, err)))
                a->cp_comm_type = v;
            break;
        case OPT_SEQUENCE_PARALLEL: a->sequence_parallel = 1; break;
        case OPT_RECOMPUTE_GRANULARITY:
            st = mc_parse_choice("--recompute-granularity", NULL, arg, recompute_granularities,
                                 &a->recompute_granularity, err);
            break;
        case OPT_RECOMPUTE_ACTIVATIONS: a->recompute_granularity = MC_RECOMPUTE_SELECTIVE; break;
        case OPT_RECOMPUTE_METHOD:
            st = mc_parse_choice("--recompute-method", NULL, arg, recompute_methods,
                                 &a->recompute_method, err);
            break;
        case OPT_RECOMPUTE_NUM_LAYERS:
            st = mc_parse_int("--recompute-num-layers", arg, 1, 1 << 20, &a->recompute_num_layers,
                              err);
            break;
        case OPT_RECOMPUTE_MODULES: {
            unsigned bit = 0;
            if (!(st = mc_recompute_module(arg, &bit, err))) a->recompute_modules |= bit;
            break;
        }
        case OPT_DIST_OPT: t->use_distributed_optimizer = 1; break;
        case OPT_OVERLAP_GRAD: t->overlap_grad_reduce = 1; break;
        case OPT_OVERLAP_PARAM: t->overlap_param_gather = 1; break;
        case OPT_DRY_RUN: a->dry_run = 1; break;
        case OPT_NUM_EXPERTS:
            st = mc_parse_int("--num-experts", arg, 1, MC_MOE_MAX_EXPERTS, &a->m.num_experts, err);
            break;
        case OPT_MOE_FFN:
            st = mc_parse_int("--moe-ffn-hidden-size", arg, 1, INT32_MAX, &a->m.moe_ffn_hidden_size,
                              err);
            break;
        case OPT_MOE_TOPK:
            st = mc_parse_int("--moe-router-topk", arg, 1, MC_MOE_MAX_EXPERTS,
                              &a->m.moe_router_topk, err);
            break;
        case OPT_MOE_SCORE:
            st = mc_parse_choice("--moe-router-score-function", NULL, arg, score_functions,
                                 &a->m.moe_router_score_sigmoid, err);
            break;
        case OPT_MOE_PRE_SOFTMAX: a->m.moe_router_pre_softmax = 1; break;
        case OPT_MOE_SCALING:
            st = mc_parse_float("--moe-router-topk-scaling-factor", arg, 1e-30, 1e30,
                                &a->m.moe_router_topk_scaling_factor, err);
            break;
        case OPT_MOE_NUM_GROUPS:
            st = mc_parse_int("--moe-router-num-groups", arg, 1, MC_MOE_MAX_EXPERTS,
                              &a->m.moe_router_num_groups, err);
            break;
        case OPT_MOE_GROUP_TOPK:
            st = mc_parse_int("--moe-router-group-topk", arg, 1, MC_MOE_MAX_EXPERTS,
                              &a->m.moe_router_group_topk, err);
            break;
        case OPT_MOE_EXPERT_BIAS: a->m.moe_router_enable_expert_bias = 1; break;
        case OPT_MOE_BIAS_RATE:
            st = mc_parse_float("--moe-router-bias-update-rate", arg, 0, 1e30,
                                &a->m.moe_router_bias_update_rate, err);
            break;
        case OPT_MOE_LB_TYPE:
            st = mc_parse_choice("--moe-router-load-balancing-type", NULL, arg, lb_types,
                                 &a->m.moe_load_balancing, err);
            break;
        case OPT_MOE_AUX_COEFF:
            st = mc_parse_float("--moe-aux-loss-coeff", arg, 0, 1e30, &a->m.moe_aux_loss_coeff,
                                err);
            break;
        case OPT_MOE_Z_COEFF:
            st = mc_parse_float("--moe-z-loss-coeff", arg, 0, 1e30, &a->m.moe_z_loss_coeff, err);
            break;
        case OPT_MOE_SHARED:
            st = mc_parse_int("--moe-shared-expert-intermediate-size", arg, 1, INT32_MAX,
                              &a->m.moe_shared_expert_intermediate_size, err);
            break;
        case OPT_MOE_CAPACITY:
            st = mc_parse_float("--moe-expert-capacity-factor", arg, -1e30, 1e30,
                                &a->m.moe_expert_capacity_factor, err);
            if (!st && !(a->m.moe_expert_capacity_factor > 0))
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "--moe-expert-capacity-factor must be greater than 0 (got %s)",
                                  arg);
            break;
        case OPT_MOE_DROP_POLICY:
            st = mc_parse_choice("--moe-token-drop-policy", NULL, arg, drop_policies,
                                 &a->m.moe_token_drop_position, err);
            break;
        case OPT_MOE_PAD: a->m.moe_pad_expert_input_to_capacity = 1; break;
        case OPT_MOE_LAYER_FREQ: st = mc_moe_layer_freq_parse(arg, &a->m, err); break;
        case OPT_MOE_PER_LAYER_LOGGING: t->moe_per_layer_logging = 1; break;
        case OPT_EP:
            st = mc_parse_i64("--expert-model-parallel-size", arg, 1, 65536, &a->ep, err);
            break;
        case OPT_ETP:
            st = mc_parse_i64("--expert-tensor-parallel-size", arg, 1, 65536, &a->etp, err);
            break;
        case OPT_FP8_FORMAT: {
            static const mc_choice fmts[] = {{"e4m3", 1}, {"hybrid", 2}, {NULL, 0}};
            st = mc_parse_choice("--fp8-format", NULL, arg, fmts, &a->fp8, err);
            break;
        }
        case OPT_FP8_HISTORY:
            st = mc_parse_int("--fp8-amax-history-len", arg, 1, 65536, &a->fp8_history, err);
            break;
        case OPT_FP8_ALGO: {
            static const mc_choice algos[] = {{"most_recent", 0}, {"max", 1}, {NULL, 0}};
            st = mc_parse_choice("--fp8-amax-compute-algo", NULL, arg, algos, &a->fp8_max, err);
            break;
        }
        case OPT_FP8_MARGIN:
            st = mc_parse_int("--fp8-margin", arg, 0, 64, &a->fp8_margin, err);
            break;
        case OPT_MOE_DISPATCHER:
            st = mc_parse_choice("--moe-token-dispatcher-type", NULL, arg, dispatchers,
                                 &a->dispatcher_allgather, err);
            break;
        case OPT_WORLD_SIZE:
            st = mc_parse_i64("--world-size", arg, 1, 1 << 24, &a->world_size, err);
            break;
        case OPT_DDP_BUCKET:
            st = mc_parse_i64("--ddp-bucket-size", arg, 1, INT64_MAX / 2, &t->ddp_bucket_size, err);
            break;
        case OPT_DIST_TIMEOUT:
            st = mc_parse_double("--distributed-timeout-minutes", arg, 1e-6, 1e7, &a->dist_timeout,
                                 err);
            break;
        default: st = mc_error_set(err, MC_ERR_INTERNAL, "option key %d not handled", key); break;
        }
        if (st) return st;
    }
    if (key == MC_CLI_EXIT) {
        *exit_now = 1;
        return MC_OK;
    }
    if (key == MC_CLI_ERROR) return MC_ERR_USAGE;
    if (cli->optind < cli->argc)
        return mc_error_set(err, MC_ERR_USAGE,
                            "unexpected argument '%s' (datasets go after --data-path)",
                            cli->argv[cli->optind]);
    return MC_OK;
}

/* Usage errors found after parsing: the combinations Megatron rejects. */
static mc_status check_args(args *a, mc_error *err)
{
    mc_train_config *t = &a->t;
    if (a->device && strcmp(a->device, "cpu") && strcmp(a->device, "cuda"))
        return mc_error_set(err, MC_ERR_USAGE, "--device: expected cpu or cuda, got '%s'",
                            a->device);
    if (t->init_only ? t->train_samples > 0 : (t->train_iters > 0) == (t->train_samples > 0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "give exactly one of --train-iters and --train-samples");
    if (t->sched.lr < 0) return mc_error_set(err, MC_ERR_USAGE, "--lr is required");
    if (a->mock && a->data_path.len)
        return mc_error_set(err, MC_ERR_USAGE, "--mock-data and --data-path exclude each other");
    if (a->mock && a->sft)
        return mc_error_set(err, MC_ERR_USAGE, "--sft reads an SFT dataset, not --mock-data");
    if (a->dpo_set && !t->dpo.on)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo-beta, --dpo-loss-type, --dpo-label-smoothing and --ref-load "
                            "need --dpo");
    if (t->dpo.on && (a->sft || a->mock))
        return mc_error_set(err, MC_ERR_USAGE, "--dpo reads a preference dataset, not %s",
                            a->sft ? "--sft's" : "--mock-data");
    if (t->dpo.on && a->pp > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo does not run under pipeline parallelism yet "
                            "(--pipeline-model-parallel-size %" PRId64 ")",
                            a->pp);
    if (t->dpo.on && t->dpo.label_smoothing > 0 && t->dpo.loss_type != MC_DPO_SIGMOID)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo-label-smoothing applies to --dpo-loss-type sigmoid only");
    if (t->dpo.on && (a->reset_position_ids || a->reset_attention_mask || a->eod_mask_loss))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo reads one answer per sequence: no --reset-position-ids, "
                            "--reset-attention-mask or --eod-mask-loss");
    if ((a->set & SET_KD_OPTS) && !t->kd_teacher)
        return mc_error_set(err, MC_ERR_USAGE, "--kd-temperature and --kd-alpha need --kd-teacher");
    if (t->kd_teacher && t->dpo.on)
        return mc_error_set(err, MC_ERR_USAGE, "--kd-teacher and --dpo exclude each other");
    if (t->kd_teacher && (a->pp > 1 || a->vpp > 0))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--kd-teacher: distillation under pipeline parallelism is not "
                            "implemented; use --pipeline-model-parallel-size 1");
    if (t->finetune && !t->load) return mc_error_set(err, MC_ERR_USAGE, "--finetune needs --load");
    if (t->loss_scale > 0 && t->prec != MC_PREC_FP16)
        return mc_error_set(err, MC_ERR_USAGE, "--loss-scale needs --fp16");
    if (a->use_ckpt_args && !t->load)
        return mc_error_set(err, MC_ERR_USAGE, "--use-checkpoint-args needs --load");
    if (a->use_ckpt_args && a->preset)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--use-checkpoint-args and --model exclude each other");
    /* With --use-checkpoint-args the architecture and vocabulary come from
     * the checkpoint. */
    if (!a->use_ckpt_args && !a->preset && !(a->set & SET_SEQ))
        return mc_error_set(err, MC_ERR_USAGE, "--seq-length is required (or a --model preset)");
    if (!a->use_ckpt_args && !a->preset &&
        (a->set & (SET_LAYERS | SET_HIDDEN | SET_HEADS)) != (SET_LAYERS | SET_HIDDEN | SET_HEADS))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--num-layers, --hidden-size and --num-attention-heads are required "
                            "(or a --model preset)");
    /* Context parallelism: what does not follow the split sequence yet. */
    if (a->cp > 1 && t->kd_teacher)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--kd-teacher: distillation under context parallelism is not "
                            "implemented; use --context-parallel-size 1");
    if (a->cp > 1 && t->dpo.on)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo under context parallelism is not implemented; use "
                            "--context-parallel-size 1");
    if (a->cp > 1 && a->device && !strcmp(a->device, "cuda"))
        return mc_error_set(err, MC_ERR_USAGE,
                            "--context-parallel-size %" PRId64 " with --device cuda: context "
                            "parallelism runs on the CPU backend only",
                            a->cp);
    if (a->moe_set && !(a->moe_set & 1u) && !a->use_ckpt_args)
        return mc_error_set(err, MC_ERR_USAGE, "the --moe-* options need --num-experts");
    if (t->overlap_param_gather && !t->use_distributed_optimizer)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--overlap-param-gather needs --use-distributed-optimizer");
    if (!a->have_tokenizer && a->vocab_size <= 0 && !a->use_ckpt_args)
        return mc_error_set(err, MC_ERR_USAGE,
                            "the vocabulary size is unknown: give --tokenizer-type (with its "
                            "files) or --vocab-size");
    return MC_OK;
}

/* The model configuration: Megatron's defaults, the preset, then the flags. */
static mc_status model_config(const args *a, mc_model_config *c, mc_error *err)
{
    mc_model_config_init(c);
    if (a->use_ckpt_args) {
        mc_ckpt_reader *r = NULL;
        mc_status st = mc_ckpt_open(a->t.load, &r, err);
        if (!st) st = mc_ckpt_read_model_config(r, c, err);
        mc_ckpt_close(r);
        if (st) return mc_error_prefix(err, "--use-checkpoint-args");
    }
    if (a->preset) {
        mc_status st = mc_model_preset(a->preset, c, err);
        if (st) {
            mc_error_prefix(err, "--model");
            err->code = MC_ERR_USAGE;
            return MC_ERR_USAGE;
        }
    }
    const mc_model_config *m = &a->m;
    c->moe_token_dispatcher_allgather = a->dispatcher_allgather;
    c->moe_expert_tensor_parallel = (int)a->etp;
    c->fp8 = a->fp8;
    c->fp8_amax_history_len = a->fp8_history > 0 ? a->fp8_history : 1;
    c->fp8_amax_compute_max = a->fp8_max;
    c->fp8_margin = a->fp8_margin;
    if (a->set & SET_LAYERS) c->num_layers = m->num_layers;
    if (a->set & SET_HIDDEN) c->hidden_size = m->hidden_size;
    if (a->set & SET_HEADS) c->num_attention_heads = m->num_attention_heads;
    if (a->set & SET_FFN) c->ffn_hidden_size = m->ffn_hidden_size;
    if (a->set & SET_KV) c->kv_channels = m->kv_channels;
    if (a->set & SET_SEQ) c->seq_length = m->seq_length;
    if (a->set & SET_MAXPOS) c->max_position_embeddings = m->max_position_embeddings;
    if (a->set & SET_NORM) c->normalization = m->normalization;
    if (a->set & SET_EPS) c->norm_epsilon = m->norm_epsilon;
    if (a->set & SET_SWIGLU) c->swiglu = 1;
    if (a->qk_layernorm) c->qk_layernorm = 1;
    if (a->set & SET_POS) c->position_embedding_type = m->position_embedding_type;
    if (a->set & SET_ROPE_BASE) c->rotary_base = m->rotary_base;
    if (a->set & SET_ROPE_PERCENT) c->rotary_percent = m->rotary_percent;
    if (a->set & SET_ROPE_SCALING) c->use_rope_scaling = 1;
    if (a->set & SET_ROPE_FACTOR) c->rope_scaling_factor = m->rope_scaling_factor;
    if (a->set & SET_ROPE_LOW) c->rope_low_freq_factor = m->rope_low_freq_factor;
    if (a->set & SET_ROPE_HIGH) c->rope_high_freq_factor = m->rope_high_freq_factor;
    if (a->set & SET_ROPE_ORIG)
        c->rope_original_max_position_embeddings = m->rope_original_max_position_embeddings;
    if (a->set & SET_GROUPS) c->num_query_groups = m->num_query_groups;
    if (a->set & SET_UNTIE) c->untie_embeddings_and_output_weights = 1;
    if (a->set & SET_NOBIAS) c->add_bias_linear = 0;
    if (a->set & SET_STD) c->init_method_std = m->init_method_std;
    if (a->set & SET_DIVISIBLE) c->make_vocab_size_divisible_by = m->make_vocab_size_divisible_by;
        /* The MoE flags given, over the checkpoint's with --use-checkpoint-args. */
#define MOE_SET(opt, field) \
    if (a->moe_set & (1u << (opt - OPT_NUM_EXPERTS))) c->field = m->field
    MOE_SET(OPT_NUM_EXPERTS, num_experts);
    MOE_SET(OPT_MOE_FFN, moe_ffn_hidden_size);
    MOE_SET(OPT_MOE_TOPK, moe_router_topk);
    MOE_SET(OPT_MOE_SCORE, moe_router_score_sigmoid);
    MOE_SET(OPT_MOE_PRE_SOFTMAX, moe_router_pre_softmax);
    MOE_SET(OPT_MOE_SCALING, moe_router_topk_scaling_factor);
    MOE_SET(OPT_MOE_NUM_GROUPS, moe_router_num_groups);
    MOE_SET(OPT_MOE_GROUP_TOPK, moe_router_group_topk);
    MOE_SET(OPT_MOE_EXPERT_BIAS, moe_router_enable_expert_bias);
    MOE_SET(OPT_MOE_BIAS_RATE, moe_router_bias_update_rate);
    MOE_SET(OPT_MOE_LB_TYPE, moe_load_balancing);
    MOE_SET(OPT_MOE_AUX_COEFF, moe_aux_loss_coeff);
    MOE_SET(OPT_MOE_Z_COEFF, moe_z_loss_coeff);
    MOE_SET(OPT_MOE_SHARED, moe_shared_expert_intermediate_size);
    MOE_SET(OPT_MOE_CAPACITY, moe_expert_capacity_factor);
    MOE_SET(OPT_MOE_DROP_POLICY, moe_token_drop_position);
    MOE_SET(OPT_MOE_PAD, moe_pad_expert_input_to_capacity);
#undef MOE_SET
    if (a->moe_set & (1u << (OPT_MOE_LAYER_FREQ - OPT_NUM_EXPERTS))) {
        c->moe_layer_freq = m->moe_layer_freq;
        memcpy(c->moe_layer_pattern, m->moe_layer_pattern, sizeof c->moe_layer_pattern);
    }
    /* Megatron turns --sequence-parallel off when there is no TP to split over. */
    c->sequence_parallel = a->sequence_parallel && a->tp > 1;
    c->cp_comm_type = a->cp_comm_type;
    c->decoder_first_pipeline_num_layers = (int)a->pp_first;
    c->decoder_last_pipeline_num_layers = (int)a->pp_last;
    c->num_layers_per_virtual_pipeline_stage = (int)a->vpp;
    c->recompute_granularity = a->recompute_granularity;
    c->recompute_method = a->recompute_method;
    c->recompute_num_layers = a->recompute_num_layers;
    c->recompute_modules = a->recompute_modules;
    /* A preset's sequence length may be overridden below its position
     * table; a longer one needs the table to grow with it. */
    if ((a->set & SET_SEQ) && !(a->set & SET_MAXPOS) && c->max_position_embeddings &&
        c->max_position_embeddings < c->seq_length)
        c->max_position_embeddings = c->seq_length;
    return MC_OK;
}

static void print_stdout(void *ctx, const char *line)
{
    (void)ctx;
    printf("%s\n", line);
}

/* The vocabulary comes from the tokenizer (padded later, as Megatron pads
 * it); without one, --vocab-size is the size itself (none with
 * --use-checkpoint-args: the checkpoint's). *eod: the tokenizer's
 * end-of-document id, else the last id. */
static mc_status vocabulary(args *a, mc_model_config *mcfg, int32_t *eod, mc_error *err)
{
    int32_t e = -1;
    if (a->have_tokenizer) {
        mc_tokenizer *tok = NULL;
        if (a->tok.kind == MC_TOKENIZER_NULL) a->tok.vocab_size = a->vocab_size;
        mc_status st = mc_tokenizer_load(&a->tok, &tok, err);
        if (st) return st;
        mcfg->vocab_size = mc_tokenizer_vocab_size(tok);
        e = mc_tokenizer_eod(tok);
        mc_tokenizer_free(tok);
    } else if (!(a->use_ckpt_args && a->vocab_size <= 0)) {
        mcfg->vocab_size = a->vocab_size;
    }
    *eod = e >= 0 ? e : (int32_t)(mcfg->vocab_size - 1);
    return MC_OK;
}

/* What keeps this run off the CUDA backend (its kernels are CPU only), or
 * NULL. */
static const char *cuda_blocker(const args *a, const mc_model_config *c)
{
    (void)c;
    if (a->cp > 1)
        return "--context-parallel-size: context parallelism runs on the CPU backend only";
    return NULL;
}

/* Expert parallelism against the model (the experts may come from a
 * checkpoint's configuration): before any work. */
static mc_status check_ep(const args *a, const mc_model_config *c, mc_error *err)
{
    const char *why = cuda_blocker(a, c);
    if (why && a->device && !strcmp(a->device, "cuda"))
        return mc_error_set(err, MC_ERR_USAGE, "--device cuda: %s; use --device cpu", why);
    if (a->etp > 1 && a->tp % a->etp)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--expert-tensor-parallel-size %" PRId64
                            " must divide --tensor-model-parallel-size %" PRId64,
                            a->etp, a->tp);
    if (a->etp > 1 && c->num_experts <= 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--expert-tensor-parallel-size %" PRId64 " needs --num-experts",
                            a->etp);
    if (a->ep > 1 && c->num_experts <= 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--expert-model-parallel-size %" PRId64 " needs --num-experts", a->ep);
    if (a->ep > 1 && c->num_experts % a->ep)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--num-experts %d is not divisible by --expert-model-parallel-size "
                            "%" PRId64,
                            c->num_experts, a->ep);
    return MC_OK;
}

/* A model that cannot fit: this rank's share as --dry-run plans it
 * (parameters, gradients, optimizer state, activations) against what the
 * backend can still allocate, before any allocation (issue 11). Every rank
 * agrees, so all stop with the first failing rank's line. The plan leaves
 * out small buffers (scratch, the FP8 copies, a DPO reference's or a KD
 * teacher's weights), so passing this is no promise; failing it is
 * certain. A plan the options do not give (which mc_train_run then
 * reports) checks nothing. */
static mc_status check_fit(const args *a, const mc_model_config *mcfg, const mc_grid *g,
                           mc_backend *be, mc_error *err)
{
    mc_plan plan;
    mc_error perr;
    mc_status st = MC_OK;
    if (!mc_plan_compute_grid(mcfg, g->world, g->tp, g->pp, g->cp, g->ep, a->t.micro_batch_size,
                              a->t.global_batch_size, a->t.use_distributed_optimizer, &plan,
                              &perr)) {
        st = mc_plan_check_fit(&plan, g->pp_rank, 1, be, err);
        mc_plan_free(&plan);
    }
    return g->world > 1 ? mc_grid_status_all(g, st, "memory check", err) : st;
}

/* --dry-run: the plan of the grid, from the options alone (no MPI, no
 * allocation beyond the tokenizer that gives the vocabulary size). */
static mc_status dry_run(args *a, mc_model_config *mcfg, mc_error *err)
{
    int32_t eod;
    mc_status st = vocabulary(a, mcfg, &eod, err);
    if (st) return st;
    int64_t world = a->world_size ? a->world_size : a->tp * a->pp * a->cp * a->ep;
    mc_plan plan;
    st = mc_plan_compute_grid(mcfg, (int)world, (int)a->tp, (int)a->pp, (int)a->cp, (int)a->ep,
                              a->t.micro_batch_size, a->t.global_batch_size,
                              a->t.use_distributed_optimizer, &plan, err);
    if (st) return st;
    mc_plan_print(&plan, print_stdout, NULL);
    mc_plan_free(&plan);
    /* the CPU path of this machine, and whether bf16 is emulated on it */
    if (a->device ? !strcmp(a->device, "cpu") : mc_backend_cuda_devices() == 0) {
        mc_backend *be;
        if ((st = mc_backend_cpu_new(1, &be, err))) return st;
        const char *note = a->t.prec == MC_PREC_BF16 ? mc_backend_bf16_note(be) : NULL;
        const char *blas = mc_backend_blas_note(be);
        printf("cpu path: %s (OpenBLAS %s)%s%s%s%s\n", mc_backend_isa(be), mc_backend_blas_core(be),
               note ? "; note: " : "", note ? note : "", blas ? "; note: " : "", blas ? blas : "");
        mc_backend_free(be);
    }
    return fflush(stdout) == EOF ? mc_error_errno(err, MC_ERR_IO, errno, "stdout") : MC_OK;
}

int main(int argc, char **argv)
{
    mc_logger lg;
    /* no interrupt handling of file.h: SIGTERM/SIGINT stop training
     * gracefully, installed below */
    mc_tool_start(&lg, PROG, MC_TOOL_EFBIG);
    mc_error err;
    mc_error_clear(&err);
    mc_cli cli;
    args a;
    memset(&a, 0, sizeof a);
    a.tp = a.pp = a.cp = a.ep = a.etp = 1;
    mc_train_config_init(&a.t);
    mc_tokenizer_spec_init(&a.tok, MC_TOKENIZER_NULL);
    a.argv_json = json_object();
    char *stdin_prefix = NULL, *args_text = NULL;
    mc_backend *be = NULL;
    mc_gptdata_config data;
    mc_gptdata_config_init(&data);
    mc_grid grid;
    mc_grid_single(&grid);
    int rc = 1;
    /* Errors every rank meets alike (usage, configuration, files all ranks
     * read) are printed by rank 0 alone and every rank leaves with the same
     * status; an error of one rank alone aborts the job (mc_grid_fail). */
    int agreed = 1;
    int grid_error = 0; /* MPI, or the configuration across ranks: exit 1 */

    mc_status st = mc_cli_init(&cli, PROG, "[OPTION]...",
                               "Train a GPT- or Llama-family language model as Megatron-LM does. "
                               "Reads the dataset prefix from stdin unless --data-path or "
                               "--mock-data is given; prints the directory of the last checkpoint "
                               "written. Under mpirun or srun, trains on the grid of "
                               "--tensor-model-parallel-size x data-parallel ranks.",
                               options, argc, argv, &err);
    if (!st) st = mc_cli_expand_nargs(&cli, OPT_DATA_PATH, &err);
    if (!st) st = mc_cli_expand_nargs(&cli, OPT_RECOMPUTE_MODULES, &err);
    int exit_now = 0;
    if (!st) st = parse_args(&cli, &a, &exit_now, &err);
    if (!st && exit_now) {
        rc = 0;
        goto done;
    }
    if (!st) st = check_args(&a, &err);
    if (!st) st = mc_backend_cpu_check_env(&err);
    mc_model_config mcfg;
    if (!st) st = model_config(&a, &mcfg, &err);
    if (!st) st = mc_model_check_cp(&mcfg, (int)a.tp, (int)a.cp, &err);
    if (!st) st = check_ep(&a, &mcfg, &err);
    /* recomputation against the stages' layers: before any work */
    if (!st) st = mc_model_check_recompute(&mcfg, (int)a.pp, &err);
    if (!st && a.dry_run) {
        if (!(st = dry_run(&a, &mcfg, &err))) {
            rc = 0;
            goto done;
        }
        goto fail;
    }

    /* The grid. Under an MPI launcher every rank starts MPI even after a
     * usage error, so that rank 0 alone reports it. */
    if (mc_grid_launched_by_mpi()) {
        mc_error gerr;
        mc_status gst = mc_grid_init_mpi(&argc, &argv, st ? 1 : (int)a.tp, st ? 1 : (int)a.pp,
                                         st ? 1 : (int)a.cp, st ? 1 : (int)a.ep, &grid, &gerr);
        /* a world the sizes do not divide is bad usage (exit 2, issue 13);
         * MPI's own failures are the grid's (exit 1) */
        if (!st && gst) err = gerr, st = gst, grid_error = gst != MC_ERR_USAGE;
    } else if (!st) {
        /* one process: every parallel size must be 1; the first that is not is refused */
        const struct {
            const char *opt;
            int64_t n;
        } par[] = {{"--tensor-model-parallel-size", a.tp},
                   {"--context-parallel-size", a.cp},
                   {"--expert-model-parallel-size", a.ep},
                   {"--pipeline-model-parallel-size", a.pp}};
        for (size_t i = 0; i < sizeof par / sizeof *par && !st; i++)
            if (par[i].n > 1) {
                st = mc_error_set(&err, MC_ERR_USAGE,
                                  "%s %" PRId64 " needs a multiple of %" PRId64
                                  " ranks and this is one process: start it with mpirun -np N "
                                  "or srun",
                                  par[i].opt, par[i].n, par[i].n);
            }
    }
    if (st) goto fail;
    /* the experts' tensor-parallel groups (every rank, collective) */
    if (a.etp > 1 && (st = mc_grid_set_etp(&grid, (int)a.etp, &err))) goto fail;
    if (a.dist_timeout > 0 && (st = mc_grid_set_timeout(&grid, a.dist_timeout, PROG, &err)))
        goto fail;
    /* Every rank must run the same configuration: the canonical JSON of the
     * options (sorted keys) is hashed and compared. */
    args_text = json_dumps(a.argv_json, JSON_SORT_KEYS | JSON_COMPACT);
    if (!args_text) {
        st = mc_error_set(&err, MC_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = mc_grid_check_config(&grid, args_text, strlen(args_text), &err))) goto fail_1;

    int32_t eod;
    if ((st = vocabulary(&a, &mcfg, &eod, &err))) goto fail;

    /* A grid that does not fit the model or the batch: refused before any
     * work, by every rank alike; exit 1 on a grid (the options are fine,
     * the grid is not), 2 in one process (only the batch sizes can be
     * wrong there: a usage error, as in issue 3). */
    if ((st = mc_train_check_grid(&a.t, &mcfg, &grid, &err))) {
        grid_error = grid.world > 1;
        goto fail;
    }

    /* Data: --mock-data, --data-path, or the prefix on stdin. */
    data.mock = a.mock;
    data.sft = a.sft;
    data.vocab_size = mcfg.vocab_size;
    data.eod = eod;
    data.reset_position_ids = a.reset_position_ids;
    data.reset_attention_mask = a.reset_attention_mask;
    data.eod_mask_loss = a.eod_mask_loss;
    /* --sft: conversations end with the eod; none sees or predicts another */
    if (a.sft) data.reset_position_ids = data.reset_attention_mask = data.eod_mask_loss = 1;
    data.seed = (uint32_t)a.t.seed;
    if (a.split) data.split = a.split;
    data.cache_dir = a.data_cache_path;
    if (!a.mock) {
        if (!a.data_path.len) {
            /* rank 0 reads the prefix (mpirun gives it stdin alone) and
             * broadcasts it; every rank gets the same status */
            st = grid.rank == 0 ? mc_tool_stdin_path(&stdin_prefix,
                                                     "no --data-path or --mock-data, and stdin is "
                                                     "a terminal: pipe in the prefix mc-preprocess "
                                                     "prints",
                                                     "no --data-path or --mock-data, and stdin "
                                                     "holds no dataset prefix",
                                                     &err)
                                : MC_OK;
            if ((st = mc_broadcast_text(&grid, st, &stdin_prefix, &err))) goto fail;
            const char *one = stdin_prefix;
            st = mc_gptdata_parse_data_path(&one, 1, &data.blend, &err);
        } else {
            st = mc_gptdata_parse_data_path(mc_buf_strs(&a.data_path), mc_buf_nstrs(&a.data_path),
                                            &data.blend, &err);
        }
        if (st) {
            mc_error_prefix(&err, "--data-path");
            err.code = st = MC_ERR_USAGE;
            goto fail;
        }
    }

    /* --device: cuda by default where it can run; asked for and impossible
     * (no GPU, or built without CUDA) is a run-time failure, exit 1. A
     * model the CUDA kernels cannot run goes to the CPU by default, with a
     * note (asked for, it was refused above). */
    const char *off_cuda = cuda_blocker(&a, &mcfg);
    int use_cuda = a.device ? !strcmp(a.device, "cuda") : mc_backend_cuda_devices() > 0;
    if (use_cuda && !a.device && off_cuda) {
        use_cuda = 0;
        if (grid.rank == 0)
            fprintf(stderr, "%s: note: %s: training on the CPU although a GPU is present\n", PROG,
                    off_cuda);
    }
    if (use_cuda) {
        if ((st = mc_backend_cuda_new(-1, &be, &err))) {
            mc_error_prefix(&err, "--device cuda");
            goto fail;
        }
    } else if ((st = mc_backend_cpu_new((int)a.threads, &be, &err))) {
        goto fail;
    }
    if ((st = check_fit(&a, &mcfg, &grid, be, &err))) {
        agreed = 1;
        goto fail;
    }
    const char *bf16_note = a.t.prec == MC_PREC_BF16 ? mc_backend_bf16_note(be) : NULL;
    if (grid.rank == 0 && bf16_note) fprintf(stderr, "%s: note: %s\n", PROG, bf16_note);
    const char *blas_note = mc_backend_blas_note(be);
    if (grid.rank == 0 && blas_note) fprintf(stderr, "%s: note: %s\n", PROG, blas_note);

    a.t.args_json = args_text;
    a.t.tokenizer = a.have_tokenizer ? &a.tok : NULL;
    /* One voice: rank 0 prints the log lines and writes the metrics (every
     * rank has the same losses, reduced over the grid; Megatron writes them
     * from the last rank, which is the last pipeline stage: with one stage
     * rank 0 holds the same values). */
    a.t.print = grid.rank == 0 ? print_line : NULL;
    a.t.print_ctx = NULL;
    if (grid.rank != 0) a.t.tensorboard_dir = a.t.log_json = NULL;

    /* Installed always (issue 3): the first SIGTERM or SIGINT finishes the
     * iteration, saves and exits 0, as Megatron's --exit-signal-handler.
     * Under MPI the loop shares the flag, so a signal to any rank stops
     * every rank after the same iteration. */
    a.t.stop = mc_tool_stop_on_signals();

    mc_train_report rep;
    st = mc_train_run(&a.t, &mcfg, &data, be, &grid, &rep, &err);
    if (st) {
        /* Usage errors and the NaN limit are the same on every rank (the
         * configuration and the reduced losses are); anything else may be
         * this rank's alone. */
        agreed = st == MC_ERR_USAGE || st == MC_ERR_LIMIT;
        goto fail;
    }
    if (rep.last_checkpoint[0] && grid.rank == 0) {
        printf("%s\n", rep.last_checkpoint);
        if (fflush(stdout) == EOF) {
            st = mc_error_errno(&err, MC_ERR_IO, errno, "stdout");
            agreed = 0;
            goto fail;
        }
    }
    rc = 0;
    mc_grid_finalize(&grid);
    goto done;

fail_1:
    grid_error = 1;
fail:
    if (grid.world > 1 && !agreed) mc_error_prefix(&err, "rank %d", grid.rank);
    /* MPI's and configuration errors exit 1 (issue 4), even as usage; a
     * world that does not fit the parallel sizes exits 2 (issue 13). */
    rc = grid_error ? 1 : mc_status_exit_code(st);
    if (grid.rank == 0 || !agreed) mc_log_fail(&lg, &err);
    if (grid.impl) mc_grid_fail(&grid, agreed);
done:
    mc_gptdata_blend_free(&data.blend);
    if (be) mc_backend_free(be);
    free(stdin_prefix);
    free(args_text);
    mc_buf_free(&a.data_path);
    json_decref(a.argv_json);
    mc_cli_free(&cli);
    return rc;
}
