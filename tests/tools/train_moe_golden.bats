#!/usr/bin/env bats
# train_moe_golden.bats - mc-train's mixture-of-experts models against
# PyTorch: 20 fp32 iterations of seven MoE models (tests/golden/torch_moe.py:
# a Llama trunk with SwiGLU experts, softmax top-2, aux loss and z-loss; a
# GPT trunk with GELU experts and biases, pre-softmax top-2 scaled by 2,
# seq_aux_loss, the first of two layers MoE; a Llama trunk with sigmoid
# routing limited to 2 of 4 expert groups; a shared expert; sigmoid routing
# with the expert bias of aux-loss-free balancing; expert capacity with the
# probs policy; the position policy padded to capacity, which drops 130 to
# 176 of 512 choices an iteration) on tests/data/train/docs.txt from
# mc's initial weights, compared with the committed golden values
# (tests/data/train/golden_moe_*.json): every iteration's lm loss (1e-6),
# load_balancing_loss / seq_load_balancing_loss and z_loss as Megatron logs
# them (1e-5), gradient norm (1e-5) and learning rate, the initial weights
# (1e-12) and the final weights' per-tensor sum of squares (1e-5) and sum
# (tests/golden/check_train_golden.py, tolerance set fp32_moe).
#
# Needs numpy and h5py in $MC_PYTHON (skips, saying why, without them).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
CHECK="$top_srcdir/tests/golden/check_train_golden.py"
GOLDEN="$top_srcdir/tests/data/train"

setup() {
    cd "$BATS_TEST_TMPDIR"
}

dataset() {
    local p="$BATS_FILE_TMPDIR/docs"
    if [ ! -f "${p}_text_document.idx" ]; then
        "$MC_PREPROCESS" --input "$GOLDEN/docs.txt" --input-format text --lines \
            --tokenizer-type NullTokenizer --vocab-size 300 --output-prefix "$p" \
            --quiet >/dev/null
    fi
    echo "${p}_text_document"
}

check_golden() {
    require_python_module h5py
    local g="$GOLDEN/golden_moe_$1.json" data
    data=$(dataset)
    local -a args
    mapfile -t args < <("$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["mc_train_args"]))' "$g")
    [ "${#args[@]}" -gt 20 ]
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --data-path "$data" --log-json log.jsonl \
        --save ck
    assert_output --partial "iteration       20/      20"
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --train-iters 0 --mock-data --save init
    run "$MC_PYTHON" "$CHECK" "$g" log.jsonl ck/iter_0000020/model.h5 init/iter_0000000/model.h5
    echo "$output"
    assert_success
    assert_output --partial "largest moe_loss error"
    refute_output --partial FAIL
}

@test "MoE Llama, softmax top-2, aux loss and z-loss: 20 fp32 iterations equal PyTorch's" {
    check_golden llama_softmax_top2
}

@test "MoE GPT, pre-softmax top-2 scaled, seq_aux_loss, --moe-layer-freq list: equal PyTorch's" {
    check_golden gpt_presoftmax_seqaux
}

@test "MoE Llama, sigmoid top-2 over 2 of 4 expert groups: 20 fp32 iterations equal PyTorch's" {
    check_golden llama_sigmoid_groups
}

@test "MoE Llama with a shared expert beside 4 routed ones: 20 fp32 iterations equal PyTorch's" {
    check_golden llama_shared_expert
}

@test "MoE Llama, sigmoid routing with the expert bias of aux-loss-free balancing: equal PyTorch's" {
    check_golden llama_sigmoid_expert_bias
}

@test "MoE Llama, expert capacity 1.25 dropping the lowest probabilities: equal PyTorch's" {
    check_golden llama_capacity_probs
}

@test "MoE GPT, capacity 0.75, position drop policy, padded to capacity: equal PyTorch's" {
    check_golden gpt_capacity_position_pad
}

@test "the MoE golden check fails on a wrong balancing loss" {
    require_python_module h5py
    local g="$GOLDEN/golden_moe_llama_softmax_top2.json" data
    data=$(dataset)
    local -a args
    mapfile -t args < <("$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["mc_train_args"]))' "$g")
    # twice the aux-loss coefficient: the loss curve and the gradients move
    run -0 "$MC_TRAIN" "${args[@]}" --moe-aux-loss-coeff 2e-2 --threads 1 --data-path "$data" \
        --log-json log.jsonl --save ck
    run "$MC_PYTHON" "$CHECK" "$g" log.jsonl ck/iter_0000020/model.h5
    assert_failure
    assert_output --partial "FAIL iteration 1 grad norm"
}
