#!/usr/bin/env bats
# mc-train with pipeline parallelism (issue 4 sections 3 and 8): the layers
# split into stages, Megatron's 1F1B schedule, activations and gradients
# sent between neighbours, the tied word embeddings kept on the first and
# the last stage and summed over the embedding group. With the same seed and
# global batch, 20 iterations give the losses of one process within 1e-6
# relative (fp32; only the order of sums changes: the tied embeddings'
# gradient is the sum of the two stages' parts; measured ~1e-8) and its
# final weights within 1e-6 (key biases 1e-4, see parallel_train.bats), for
# PP=2 and PP=4 (4 micro-batches: >= pp), an uneven split, untied
# embeddings with the overlapped bucketed reduction, and TP=2 x PP=2 x DP=2
# with sequence parallelism and the distributed optimizer, GPT and Llama;
# evaluation through the pipeline; layer splits that do not fit refused
# with the numbers.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# Tiny models of 4 layers, T=16, 20 iterations of 4 sequences in
# micro-batches of 1 (4 micro-batches per pipeline).
common=(--seq-length 16 --micro-batch-size 1 --threads 1 --lr 1e-3 --log-interval 5
        --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16
        --train-iters 20 --lr-warmup-iters 2 --num-layers 4 --global-batch-size 4)
gpt=(--model tiny-gpt "${common[@]}")
llama=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 "${common[@]}")
# 8 layers, for the interleaved schedule on 4 stages (v = 8 / (4 x 1) = 2)
gpt8=("${gpt[@]}" --num-layers 8)
llama8=("${llama[@]}" --num-layers 8)

setup() {
    mpi_setup
    cd "$BATS_TEST_TMPDIR"
}

# same_eval_losses A B: the same evaluation lines (iteration and set) with
# losses within 1e-6 relative. Pipeline ranks reduce in another order than
# one process, so trained weights differ by ~1e-7 (the tests above) and a
# printed loss's seventh digit may differ; exact text would depend on the CPU.
same_eval_losses() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, "\n"); m = split(b, y, "\n")
        if (n != m) { print "# " n " lines vs " m; exit 1 }
        for (i = 1; i <= n; i++) {
            split(x[i], p, "lm loss value: "); split(y[i], q, "lm loss value: ")
            if (p[1] != q[1]) { print "# different lines: " x[i] " / " y[i]; exit 1 }
            d = p[2] - q[2]; if (d < 0) d = -d
            if (d > 1e-6 * p[2]) { print "# " x[i] " vs " y[i] ": relative " d / p[2]; exit 1 }
        }
    }' >&3
}


@test "GPT (tied embeddings): PP=2 and PP=4 match one process" {
    equivalent pp2 2 gpt --pipeline-model-parallel-size 2
    equivalent pp4 4 gpt --pipeline-model-parallel-size 4
}

@test "Llama: PP=2 and PP=4 match one process" {
    equivalent pp2 2 llama --pipeline-model-parallel-size 2
    equivalent pp4 4 llama --pipeline-model-parallel-size 4
}

@test "GPT: PP=3 with --decoder-first-pipeline-num-layers 2 (layers 2+1+1) matches one process" {
    equivalent pp3 3 gpt --pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 2
}

@test "GPT untied: PP=2 x DP=2 with --overlap-grad-reduce in small buckets matches one process" {
    equivalent pp2dp2 4 gpt --untie-embeddings-and-output-weights \
        --pipeline-model-parallel-size 2 --overlap-grad-reduce --ddp-bucket-size 3000
}

@test "GPT and Llama: TP=2 x PP=2 x DP=2, sequence parallel, distributed optimizer, match one process" {
    equivalent gpt-tp2pp2dp2 8 gpt --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --sequence-parallel --use-distributed-optimizer
    equivalent llama-tp2pp2dp2 8 llama --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --sequence-parallel --use-distributed-optimizer
}

@test "evaluation runs through the pipeline: PP=2 validation and test losses equal one process's (1e-6)" {
    local ev=(--eval-iters 2 --eval-interval 10 --train-iters 10)
    run "$MC_TRAIN" "${gpt[@]}" "${ev[@]}"
    assert_success
    local one
    one=$(grep -o 'validation loss at [^|]*| lm loss value: [^ ]*' <<<"$output")
    [ "$(wc -l <<<"$one")" -eq 2 ]
    run mpi 2 "${gpt[@]}" "${ev[@]}" --pipeline-model-parallel-size 2
    assert_success
    local two
    two=$(grep -o 'validation loss at [^|]*| lm loss value: [^ ]*' <<<"$output")
    echo "# one process: $one" >&3
    echo "# PP=2:        $two" >&3
    same_eval_losses "$one" "$two"
}

@test "layer splits that do not fit are refused with the numbers (exit 1, once; PP without the ranks: exit 2)" {
    run mpi 3 "${gpt[@]}" --pipeline-model-parallel-size 3
    assert_failure 1
    [ "$(grep -c '^mc-train: error:' <<<"$output")" -eq 1 ]
    assert_output --partial "--num-layers (4) must be a multiple of --pipeline-model-parallel-size (3)"
    run mpi 2 "${gpt[@]}" --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 4
    assert_failure 1
    assert_output --partial "--num-layers (4) less --decoder-first-pipeline-num-layers (4) and --decoder-last-pipeline-num-layers (0) leaves 0 layers"
    run mpi 3 "${gpt[@]}" --pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 1 \
        --decoder-last-pipeline-num-layers 1
    assert_success
    run "$MC_TRAIN" "${gpt[@]}" --pipeline-model-parallel-size 2
    assert_failure 2
    assert_output --partial "--pipeline-model-parallel-size 2 needs a multiple of 2 ranks and this is one process"
    run "$MC_TRAIN" "${gpt[@]}" --decoder-last-pipeline-num-layers 2
    assert_failure
    assert_output --partial "need --pipeline-model-parallel-size > 1"
}

# The interleaved schedule (Megatron's forward_backward_pipelining_with_
# interleaving): each rank holds v model chunks, chunk c on rank p layers
# [(c pp + p) N, + N). PP=4 with 4 micro-batches takes Megatron's
# all-warm-up path, 8 micro-batches (--global-batch-size 8, its own
# reference) the warm-up / steady / cool-down one; PP=2 with v=2 and v=4.
@test "interleaved schedule: PP=4 (8 layers, N=1: v=2) and PP=2 (4 layers, N=1: v=2) match one process, GPT and Llama" {
    equivalent gpt-vpp4 4 gpt8 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1
    equivalent llama-vpp4 4 llama8 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1
    equivalent gpt-vpp2 2 gpt --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
}

@test "interleaved schedule: PP=2 with v=4 and 8 micro-batches, and untied x DP=2, match one process" {
    gpt8b=("${gpt8[@]}" --global-batch-size 8)
    equivalent gpt-vpp2-v4 2 gpt8b --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
    equivalent gpt-vpp2-dp2 4 gpt --untie-embeddings-and-output-weights \
        --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --overlap-grad-reduce
}

@test "interleaved schedule: evaluation through the chunks equals one process's (1e-6)" {
    local ev=(--eval-iters 2 --eval-interval 10 --train-iters 10)
    run "$MC_TRAIN" "${gpt8[@]}" "${ev[@]}"
    assert_success
    local one
    one=$(grep -o 'validation loss at [^|]*| lm loss value: [^ ]*' <<<"$output")
    [ "$(wc -l <<<"$one")" -eq 2 ]
    run mpi 4 "${gpt8[@]}" "${ev[@]}" --pipeline-model-parallel-size 4 \
        --num-layers-per-virtual-pipeline-stage 1
    assert_success
    local four
    four=$(grep -o 'validation loss at [^|]*| lm loss value: [^ ]*' <<<"$output")
    echo "# one process: $one" >&3
    echo "# PP=4, v=2:   $four" >&3
    same_eval_losses "$one" "$four"
}

@test "a bad --num-layers-per-virtual-pipeline-stage is refused with the numbers (exit 1, once)" {
    run mpi 4 "${gpt8[@]}" --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3
    assert_failure 1
    [ "$(grep -c '^mc-train: error:' <<<"$output")" -eq 1 ]
    assert_output --partial "--num-layers (8) must be a multiple of --pipeline-model-parallel-size (4) x --num-layers-per-virtual-pipeline-stage (3) = 12"
    run mpi 2 "${gpt[@]}" --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --global-batch-size 3
    assert_failure 1
    [ "$(grep -c '^mc-train: error:' <<<"$output")" -eq 1 ]
    assert_output --partial "the interleaved schedule needs the number of micro-batches (3) to be a multiple of --pipeline-model-parallel-size (2)"
    run mpi 2 "${gpt[@]}" --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --decoder-first-pipeline-num-layers 2
    assert_failure 1
    assert_output --partial "does not combine with --decoder-first/last-pipeline-num-layers"
    run "$MC_TRAIN" "${gpt[@]}" --num-layers-per-virtual-pipeline-stage 1
    assert_failure
    assert_output --partial "--num-layers-per-virtual-pipeline-stage (1) needs --pipeline-model-parallel-size > 1 (got 1)"
    run "$MC_TRAIN" "${gpt[@]}" --num-layers-per-virtual-pipeline-stage 0
    assert_failure
    assert_output --partial "--num-layers-per-virtual-pipeline-stage"
}
