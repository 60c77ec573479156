#!/usr/bin/env bats
# The CUDA backend as CI sees it (nvcc, no GPU) and as a GPU machine does:
# mc-train --device, and tests/cuda/check_kern, which compares every CUDA
# kernel with the CPU backend. Where there is no GPU the GPU checks skip,
# saying so; tests/cuda/run.sh is the full GPU verification.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
CHECK_KERN="$top_builddir/tests/cuda/check_kern"

gpt=(--mock-data --vocab-size 64 --model tiny-gpt --num-layers 1 --hidden-size 32
     --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-3
     --log-interval 1 --eval-iters 0 --train-iters 2)

setup() {
    cd "$BATS_TEST_TMPDIR"
    gpus=$("$CHECK_KERN" --devices)
}

@test "--device cuda without a GPU: one line naming the option, exit 1, nothing written" {
    [ "$gpus" = 0 ] || skip "a GPU is present ($gpus): the failure cannot happen here"
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --device cuda --save ck
    assert_failure 1
    [ -z "$output" ]
    [ "$(printf '%s\n' "$stderr" | wc -l)" = 1 ]
    [[ "$stderr" == "mc-train: error: --device cuda: "* ]]
    [[ "$stderr" == *"no CUDA GPU is available"* || "$stderr" == *"built without the CUDA backend"* ]]
    [ ! -e ck ]
}

@test "--device: anything but cpu or cuda is bad usage (exit 2); the default runs here" {
    run "$MC_TRAIN" "${gpt[@]}" --device tpu
    assert_failure 2
    assert_output --partial "--device: expected cpu or cuda, got 'tpu'"
    run "$MC_TRAIN" "${gpt[@]}" --device cpu
    assert_success
    [ "$gpus" = 0 ] || skip "a GPU is present: the default is cuda, run by tests/cuda/run.sh"
    run "$MC_TRAIN" "${gpt[@]}"
    assert_success
}

@test "every CUDA kernel matches the CPU backend (tests/cuda/check_kern)" {
    run "$CHECK_KERN"
    if [ "$status" = 77 ]; then
        assert_output "no GPU: skipped"
        skip "no GPU: the CUDA kernels are checked by tests/cuda/run.sh on a GPU machine"
    fi
    assert_success
    assert_output --partial "0 of"
}

@test "check_kern --rehearse: the GPU harness runs whole with a second CPU backend, every check at 0 error" {
    # what the lent GPU's first minutes would otherwise find: a harness
    # that crashes or miscounts before it compares anything
    run "$CHECK_KERN" --rehearse
    assert_success
    assert_line "# rehearsal: a second CPU backend in the GPU's place"
    assert_output --partial "kd_bwd in place"
    assert_output --partial "attention_fwd_docs"
    assert_line --regexp '^# 0 of [0-9]+ checks failed$'
    # the same backend twice: every comparison exact
    ! printf '%s\n' "$output" | grep -E 'rel err [0-9.]+e[-+][0-9]+' | grep -v 'rel err 0.00e+00'
}

@test "flash.cu's tensor-core attention, run on the CPU by tests/cuda/flash_emu.cc, equals float64 attention" {
    # bf16 operands: out 4e-3, lse 1e-5, dq/dk/dv 1e-2 relative (rms) of a
    # float64 attention on the same bf16 values; causal and packed, grouped
    # queries, T not a multiple of the tiles, D = 16, 64, 128
    run "$top_srcdir/tests/cuda/emu.sh" flash "$BATS_TEST_TMPDIR"
    if [ "$status" = 77 ]; then
        skip "$output"
    fi
    assert_success
    assert_line "# 0 of 48 checks failed"
    assert_output --partial "D=128 packed dk alone: the same bytes"
}

@test "--device cuda with context parallelism: refused in one line, exit 2, before any work; expert parallelism is not" {
    # EP's all-to-all has a device path (NCCL, or staged with MC_DEVICE_COMM=mpi):
    # in one process it meets only the rule every parallel size meets
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --num-experts 4 --expert-model-parallel-size 2 --device cuda --save ck
    assert_failure 2
    [ "$stderr" = "mc-train: error: --expert-model-parallel-size 2 needs a multiple of 2 ranks and this is one process: start it with mpirun -np N or srun" ]
    [ ! -e ck ]
    # a mixture of experts (with capacity) is no reason: without a GPU it fails as any --device cuda run does
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --num-experts 4 --moe-expert-capacity-factor 1 --device cuda --save ck
    [ "$gpus" = 0 ] || skip "a GPU is present: tests/cuda/run.sh trains the MoE model on it"
    assert_failure 1
    [[ "$stderr" == "mc-train: error: --device cuda: "* ]]
    [ ! -e ck ]
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --context-parallel-size 2 --device cuda --save ck
    assert_failure 2
    [[ "$stderr" == "mc-train: error: --context-parallel-size 2 with --device cuda: context parallelism runs on the CPU backend only" ]]
    [ ! -e ck ]
    # the same MoE model on the CPU trains
    run "$MC_TRAIN" "${gpt[@]}" --num-experts 4 --device cpu
    assert_success
}

@test "moe.cu's mixture-of-experts kernels, run on the CPU by tests/cuda/moe_emu.cc, equal the CPU backend's" {
    # choices, counts and permutations equal; floats 1e-6 relative (rms),
    # losses 1e-12: routing of every kind, losses, permutation map over
    # several chunks with dropped choices, expert capacity (both policies,
    # ties), permutations both ways, bias update
    run "$top_srcdir/tests/cuda/emu.sh" moe "$BATS_TEST_TMPDIR" "$top_builddir"
    if [ "$status" = 77 ]; then
        skip "$output"
    fi
    assert_success
    assert_line "# 0 of 72 checks failed"
    assert_output --partial "route_fwd sigmoid top-4 E=16 4 groups top-2 bias idx: 0 of 148 differ"
    assert_output --partial "permute_map N=40 E=64 K=8 block=0 perm: 0 of 320 differ"
}

@test "decode.cu's inference attention, run on the CPU by tests/cuda/decode_emu.cc, equals the CPU backend's" {
    # fp32 both sides, 1e-5 relative (rms): one row and chunks, deep in the
    # cache, grouped queries, packed documents, D from 8 to 128
    run "$top_srcdir/tests/cuda/emu.sh" decode "$BATS_TEST_TMPDIR" "$top_builddir"
    if [ "$status" = 77 ]; then
        skip "$output"
    fi
    assert_success
    assert_line "# 0 of 10 checks failed"
    assert_output --partial "attention_kv_fwd n=1 pos0=300 Q=4 G=2 D=64 packed: relative error"
}

@test "mc-eval --device: cuda without a GPU fails in one line (exit 1), int8 weights with cuda are bad usage (exit 2)" {
    MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
    "$MC_TRAIN" "@$top_srcdir/tests/data/eval/gpt.args" --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$top_srcdir/tests/data/tokenizer/hf_bytelevel.json" --device cpu \
        --save ck > /dev/null 2>&1
    run --separate-stderr bash -c 'echo ck | "$1" --prompt a --max-new-tokens 2 --device cuda --weights int8' _ "$MC_EVAL"
    assert_failure 2
    [ "$stderr" = "mc-eval: error: --device cuda: int8 weights run on the CPU backend only; use --weights fp32 or --device cpu" ]
    run --separate-stderr bash -c 'echo ck | "$1" --prompt a --max-new-tokens 2 --device tpu' _ "$MC_EVAL"
    assert_failure 2
    [[ "$stderr" == *"--device: expected cpu or cuda, got 'tpu'" ]]
    [ "$gpus" = 0 ] || skip "a GPU is present: tests/cuda/run.sh runs mc-eval on it"
    run --separate-stderr bash -c 'echo ck | "$1" --prompt a --max-new-tokens 2 --device cuda' _ "$MC_EVAL"
    assert_failure 1
    [ -z "$output" ]
    [ "$(printf '%s\n' "$stderr" | wc -l)" = 1 ]
    [[ "$stderr" == "mc-eval: error: --device cuda: "* ]]
    [[ "$stderr" == *"no CUDA GPU is available"* || "$stderr" == *"built without the CUDA backend"* ]]
}

@test "fp8.cu's FP8 kernels, run on the CPU by tests/cuda/fp8_emu.cc, give the CPU backend's bits (and exact FP8 bytes)" {
    run "$top_srcdir/tests/cuda/emu.sh" fp8 "$BATS_TEST_TMPDIR" "$top_builddir"
    if [ "$status" = 77 ]; then
        skip "$output"
    fi
    assert_success
    assert_line "# 0 of 19 checks failed"
    assert_output --partial "fp8_quantize E5M2 scale 3.1e-05: the CPU's bits"
    # the bytes cuBLASLt's FP8 GEMMs read, straight and transposed
    assert_output --partial "fp8 bytes E5M2 transposed (37 x 70, tiles of 32): the same bytes"
}
