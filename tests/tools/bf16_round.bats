#!/usr/bin/env bats
# Emulated bf16 and fp16 (issue 18, section 2): where the CPU's GEMMs
# multiply fp32 values rounded to the precision (the avx2 path, and every
# path without AVX512_BF16 or AMX), mc-train rounds each activation that
# only linear layers read (the norms' outputs before the QKV projection, a
# dense MLP and the LM head; the MLP's activation) once, in place, where it
# is made, and the GEMMs take it as it is, instead of rounding it into
# scratch in every forward and backward product; and in training each
# weight is prepared for the GEMMs (rounded, or cast to bf16 where the
# bf16 GEMM is native) by the optimizer's update, in the same pass (the
# first iteration and the distributed optimizer: by the first micro-batch
# that uses it), not by every micro-batch's forward pass. That
# is the same computation, so the reference is the run that rounds at
# every GEMM and prepares the weights in every forward pass
# (MC_TEST_ROUND_PER_GEMM=1), and the comparison is exact: the --log-json
# files byte for byte, the validation losses, and every tensor of the final
# checkpoints (parameters and Adam's moments) bit for bit. A tensor rounded
# that something else also reads (the MoE router's input, the attention
# output the attention's backward reads), one passed as exact without
# being rounded, or a weight prepared before the optimizer changed it,
# changes the bits.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# two micro-batches an iteration; an evaluation after iterations 2 and 4
common=(--num-layers 3 --vocab-size 256 --seq-length 32 --micro-batch-size 2 --lr 1e-3
        --global-batch-size 4 --train-iters 4 --lr-warmup-iters 1 --mock-data --eval-iters 1
        --eval-interval 2 --threads 2)
gpt=(--model tiny-gpt "${common[@]}")
llama=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 "${common[@]}")

setup() {
    mpi_env
    cd "$BATS_TEST_TMPDIR"
    # the avx2 path emulates bf16 on every CPU that has it
    require_path avx2
    export MC_CPU_ISA=avx2
}

# once_vs_per_gemm NAME RUNNER ARGS...: RUNNER ARGS with --log-json and
# --save, as is and with MC_TEST_ROUND_PER_GEMM=1: the same bytes and bits,
# and the same validation losses.
once_vs_per_gemm() {
    local name=$1 val
    shift
    run -0 --separate-stderr "$@" --log-json "$name.jsonl" --save "$name"
    val=$(grep 'validation loss' <<<"$stderr")
    [ "$(grep -c 'lm loss value' <<<"$val")" -ge 2 ]
    # (exported, not env: RUNNER may be the shell function mpi)
    export MC_TEST_ROUND_PER_GEMM=1
    run -0 --separate-stderr "$@" --log-json "$name-ref.jsonl" --save "$name-ref"
    unset MC_TEST_ROUND_PER_GEMM
    [ "$(grep -c '"lm loss"' "$name.jsonl")" -eq 4 ]
    assert_equal "$val" "$(grep 'validation loss' <<<"$stderr")"
    cmp "$name.jsonl" "$name-ref.jsonl"
    if "$MC_PYTHON" -c 'import h5py' 2>/dev/null; then
        same_bits "$name/iter_0000004/model.h5" "$name-ref/iter_0000004/model.h5" >&3
    else
        echo "# weights not compared: no h5py in $MC_PYTHON" >&3
    fi
}

@test "bf16 and fp16 emulated, GPT and Llama: activations rounded once where they are made, the bits of rounding at every GEMM" {
    once_vs_per_gemm gpt-bf16 "$MC_TRAIN" "${gpt[@]}" --bf16
    once_vs_per_gemm llama-bf16 "$MC_TRAIN" "${llama[@]}" --bf16
    once_vs_per_gemm gpt-fp16 "$MC_TRAIN" "${gpt[@]}" --fp16
    # the CPU's best path (native bf16 where it has AVX512_BF16 or AMX):
    # each weight prepared once an iteration
    once_vs_per_gemm best env -u MC_CPU_ISA "$MC_TRAIN" "${gpt[@]}" --bf16
    # untied output weights: the head's own weight, the same rounded input
    once_vs_per_gemm llama-untied "$MC_TRAIN" "${llama[@]}" --bf16 \
        --untie-embeddings-and-output-weights
}

@test "bf16 emulated with recomputation (full, compact, selective) and MoE layers beside dense ones, and MoE with a shared expert on the best path: the same bits" {
    once_vs_per_gemm full "$MC_TRAIN" "${gpt[@]}" --bf16 --recompute-granularity full \
        --recompute-method uniform --recompute-num-layers 2
    # one layer per group: the compact workspace remakes ln1 and ln2 in the backward
    once_vs_per_gemm compact "$MC_TRAIN" "${llama[@]}" --bf16 --recompute-granularity full \
        --recompute-method uniform --recompute-num-layers 1
    once_vs_per_gemm selective "$MC_TRAIN" "${llama[@]}" --bf16 --recompute-granularity selective \
        --recompute-modules layernorm mlp_act core_attn
    # layers 0 and 2 MoE (ln2 unrounded: the router reads it), layer 1 dense
    once_vs_per_gemm moe "$MC_TRAIN" "${llama[@]}" --bf16 --num-experts 4 \
        --moe-ffn-hidden-size 32 --moe-layer-freq "[1,0,1]" --moe-aux-loss-coeff 1e-2
    # the best path (native bf16 where the CPU has it), with a shared expert:
    # the experts' weights, routed and shared, prepared once an iteration
    once_vs_per_gemm moe-best env -u MC_CPU_ISA "$MC_TRAIN" "${llama[@]}" --bf16 --num-experts 4 \
        --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 48 --moe-aux-loss-coeff 1e-2
}

@test "bf16 emulated under TP=2 with sequence parallelism, PP=2 and DP=2 with the distributed optimizer: the same bits" {
    mpi_need
    once_vs_per_gemm tpsp mpi 2 "${llama[@]}" --bf16 --tensor-model-parallel-size 2 \
        --sequence-parallel
    once_vs_per_gemm pp mpi 2 "${gpt[@]}" --num-layers 4 --bf16 --pipeline-model-parallel-size 2
    # DP=2 with the distributed optimizer: a shard updated, the parameters
    # gathered, their GEMM form made by the model (the plain optimizer's
    # update writes it)
    once_vs_per_gemm distopt mpi 2 "${gpt[@]}" --bf16 --use-distributed-optimizer
}
