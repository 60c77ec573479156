#!/usr/bin/env bats
# Tensor and sequence parallelism of the model under mpirun (issue 4,
# section 2): on TP = 2 and 4 ranks, each rank's slice of every parameter
# equals the single-process model's slice, the loss equals the
# single-process loss within 1e-6 relative, every gradient slice equals the
# single-process gradient's slice within 1e-5 of the tensor's scale, and
# with --sequence-parallel the same again against the run without it; GPT
# (LayerNorm, GELU, learned positions, biases, tied output layer) and Llama
# (RMSNorm, SwiGLU, RoPE, untied) with grouped-query attention. The program
# and its tolerances are in tests/parallel/test_model_tp.c.

bats_require_minimum_version 1.5.0
load common
load mpi_common

TEST_MODEL_TP="$top_builddir/tests/parallel/test_model_tp"

setup() {
    [ -x "$TEST_MODEL_TP" ] || skip "$TEST_MODEL_TP not built (make check builds it)"
    cd "$BATS_TEST_TMPDIR"
}

# tp N FAMILY GROUPS [break]: the model on N tensor-parallel ranks; the
# timeout is only a safety net.
tp() {
    local n=$1
    shift
    mpi_setup
    run mpi_exec 120 "$n" "$TEST_MODEL_TP" run "$1" "$2" "$n" "${@:3}"
    echo "$output" | grep '^#' >&3 || true
}

@test "GPT at TP=2: slices, loss and gradients equal one process's, with and without SP" {
    tp 2 gpt 8
    assert_success
    assert_output --regexp 'ok [0-9]+ checks on 2 ranks'
    refute_output --partial FAILED
}

@test "GPT with GQA at TP=4: the same, with and without SP" {
    tp 4 gpt 4
    assert_success
    assert_output --regexp 'ok [0-9]+ checks on 4 ranks'
    refute_output --partial FAILED
}

@test "Llama with GQA at TP=2: the same, with and without SP" {
    tp 2 llama 2
    assert_success
    assert_output --regexp 'ok [0-9]+ checks on 2 ranks'
    refute_output --partial FAILED
}

@test "Llama with GQA at TP=4 (one query group per rank): the same, with and without SP" {
    tp 4 llama 4
    assert_success
    assert_output --regexp 'ok [0-9]+ checks on 4 ranks'
    refute_output --partial FAILED
}

@test "TP=2 groups inside a 4-rank grid (DP=2): each replica equals one process" {
    mpi_setup
    run mpi_exec 120 4 "$TEST_MODEL_TP" run llama 2 2
    assert_success
    assert_output --regexp 'ok [0-9]+ checks on 4 ranks'
    refute_output --partial FAILED
}

@test "the comparison can fail: each rank against its neighbour's slice" {
    tp 2 gpt 8 break
    assert_failure
    assert_output --partial "differs from the TP=1 slice"
    assert_output --partial "FAILED"
}

@test "--sequence-parallel needs the sequence length divisible by TP (numbers in the message)" {
    run "$TEST_MODEL_TP" config
    assert_success
    assert_output --partial "--sequence-parallel needs --seq-length (6) to be a multiple of --tensor-model-parallel-size (4)"
    assert_output --regexp 'ok [0-9]+ checks on 1 rank'
}
