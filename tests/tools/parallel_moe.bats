#!/usr/bin/env bats
# parallel_moe.bats - mixture-of-experts models on the grid before expert
# parallelism exists: the experts replicated over tensor parallelism (every
# rank routes and runs every token), data and pipeline parallelism as for a
# dense model. 20 iterations under mpirun give the single process's losses
# and load-balancing losses within 1e-6 relative and its final weights
# within 1e-6 (mpi_common.bash's same_weights), for TP=2, PP=2, DP=2 with
# the distributed optimizer and TP=2 x DP=2. Measured: losses within 1.8e-8,
# load-balancing losses 2.2e-9, weights 1.2e-7 (PP=2: bit for bit).

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# mpi_common.bash's MoE Llama (two layers, 4 experts of 32, top-2, 20
# iterations)
moe=("${moe_args[@]}")

setup() {
    mpi_setup
    cd "$BATS_TEST_TMPDIR"
}

# balancing NAME: the load_balancing_loss values of NAME.jsonl as "lm loss"
# lines, so same_losses compares them.
balancing() {
    sed 's/"lm loss": [^,}]*, //; s/"load_balancing_loss"/"lm loss"/' "$1.jsonl" > "$1.lb.jsonl"
}

equivalent() {
    local name=$1 n=$2
    shift 2
    local ref="$BATS_FILE_TMPDIR/ref"
    if [ ! -f "$ref.jsonl" ]; then
        "$MC_TRAIN" "${moe[@]}" --log-json "$ref.jsonl" --save "$ref" >/dev/null 2>&1
    fi
    run --separate-stderr mpi "$n" "${moe[@]}" "$@" --log-json "$name.jsonl" --save "$name"
    assert_success
    assert_output "$name/iter_0000020"
    [[ "$stderr" == *"| load_balancing_loss: "*"| z_loss: "* ]]
    same_losses "$name.jsonl" "$ref.jsonl"
    balancing "$name"
    balancing "$ref"
    same_losses "$name.lb.jsonl" "$ref.lb.jsonl"
    require_python_module h5py
    same_weights "$name/iter_0000020/model.h5" "$ref/iter_0000020/model.h5" same-names
}

@test "MoE, TP=2 (experts replicated): losses, balancing losses and weights of one process" {
    equivalent tp2 2 --tensor-model-parallel-size 2
}

@test "MoE, PP=2: losses, balancing losses and weights of one process" {
    equivalent pp2 2 --pipeline-model-parallel-size 2
}

@test "MoE, DP=2 with the distributed optimizer: losses, balancing losses and weights" {
    equivalent dp2 2 --use-distributed-optimizer
}

@test "MoE, TP=2 x DP=2: losses, balancing losses and weights of one process" {
    equivalent tp2dp2 4 --tensor-model-parallel-size 2
}

@test "MoE, DP=2 with sigmoid routing, the expert bias and capacity: the DP-summed counts of one process" {
    moe+=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias
          --moe-router-bias-update-rate 1e-2 --moe-expert-capacity-factor 1.0)
    local ref="$BATS_FILE_TMPDIR/ref"
    rm -rf "$ref" "$ref.jsonl"
    equivalent bias_dp2 2
    rm -rf "$ref" "$ref.jsonl" # the next test's reference is the plain model
}
