#!/usr/bin/env bats
# Context parallelism (issue 14, sections 1 and 5): --context-parallel-size
# splits every sequence in 2 CP chunks (rank r holding chunks r and
# 2CP-1-r), attention runs across the group as ring attention
# (--cp-comm-type p2p) or Ulysses' all-to-all (a2a), and the gradients are
# summed over the data-and-context-parallel group. With the same seed and
# global batch, 20 iterations give the single process's losses within 1e-6
# relative and its final weights within 1e-6 (mpi_common.bash's
# comparisons; the CP run only regroups the attention's and the loss's sums:
# ~1e-8 measured): CP=2 and CP=4, GPT and Llama with GQA, with and without
# packed documents (--reset-position-ids --reset-attention-mask
# --eod-mask-loss on a dataset whose documents cross the chunks, so
# boundaries fall on other ranks), CP=2 x TP=2 with sequence parallelism,
# CP=2 x DP=2 with the distributed optimizer and CP=2 x PP=2 (with packed
# documents too: every stage finds the boundaries of several micro-batches
# in flight), micro-batches of 2 sequences, for both communication types;
# validation losses under CP=4 print as one process's. A checkpoint written at CP=4 resumes at CP=1 with the
# uninterrupted run's losses. Bad input (a sequence length the chunks or
# sequence parallelism cannot split, heads a2a cannot split) is one line
# and exit 2 before any work. Mixtures of experts under CP (and EP x CP):
# parallel_ep.bats; recomputation under CP: recompute.bats.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MKIDX="$top_builddir/tests/unit/mkidx"

# Tiny models, T=16 (chunks of 4 at CP=2, 2 at CP=4), 20 iterations of 4
# sequences in micro-batches of 1 (2 with DP=2).
common=(--seq-length 16 --micro-batch-size 1 --threads 1 --lr 1e-3 --log-interval 5
        --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16
        --train-iters 20 --lr-warmup-iters 2 --global-batch-size 4)
gpt=(--model tiny-gpt "${common[@]}")
# 8 heads in 4 groups: a2a splits the groups over CP=4
llama=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 "${common[@]}")

# Packed documents (as packed_docs.bats): a unit of 24 ids holding
# documents of 4, 1, 10 and 4 ids and one running on into the next unit,
# end-of-document id 255; T=96, chunks of 24 (CP=2) and 12 (CP=4). Adam's
# epsilon is 1e-4 here: this data leaves many gradients at exactly zero
# plus rounding noise, which Adam with 1e-8 turns into whole steps, so any
# change in the order of a sum shows in the weights (TP=2 on the same data
# differs from one process by 1.6e-5 with 1e-8, 2e-8 with 1e-4).
UNIT="5 17 42 255 255 8 99 23 61 4 77 13 250 41 255 66 12 9 255 7 3 88 150 21"
packed_common=(--seq-length 96 --micro-batch-size 1 --threads 1 --lr 1e-3 --log-interval 5
               --eval-iters 0 --tokenizer-type NullTokenizer --vocab-size 255 --split 100,0,0
               --train-iters 20 --lr-warmup-iters 2 --global-batch-size 4
               --reset-position-ids --reset-attention-mask --eod-mask-loss --adam-eps 1e-4)

setup() {
    mpi_setup
    [ -x "$MC_TRAIN" ] || skip "$MC_TRAIN not built"
    cd "$BATS_TEST_TMPDIR"
}

# The packed dataset, once per file.
dataset() {
    local p="$BATS_FILE_TMPDIR/packed"
    if [ ! -f "$p.idx" ]; then
        for _ in $(seq 60); do echo "$UNIT"; done | "$MKIDX" write "$p" uint16
    fi
    echo "$p"
}
pgpt() { pgpt=(--model tiny-gpt "${packed_common[@]}" --data-path "$(dataset)"); }
pllama() {
    pllama=(--model tiny-llama --num-query-groups 2 "${packed_common[@]}" --data-path "$(dataset)")
}


@test "p2p: GPT at CP=2 and CP=4 matches one process (losses 1e-6 relative, weights 1e-6)" {
    equivalent cp2 2 gpt --context-parallel-size 2
    equivalent cp4 4 gpt --context-parallel-size 4 --cp-comm-type p2p
}

@test "p2p: Llama with GQA (8 heads, 4 groups) at CP=2 and CP=4 matches one process" {
    equivalent cp2 2 llama --context-parallel-size 2
    equivalent cp4 4 llama --context-parallel-size 4
}

@test "p2p: packed documents split across ranks, GPT and Llama, CP=2 and CP=4, CP=2 x PP=2, match one process" {
    pgpt
    pllama
    equivalent gcp2 2 pgpt --context-parallel-size 2
    equivalent gcp4 4 pgpt --context-parallel-size 4
    equivalent lcp2 2 pllama --context-parallel-size 2
    equivalent lcp4 4 pllama --context-parallel-size 4
    # every pipeline stage finds the boundaries (several micro-batches in
    # flight, each with its own)
    equivalent gcp2pp2 4 pgpt --context-parallel-size 2 --pipeline-model-parallel-size 2
}

@test "p2p: CP=2 x TP=2 with sequence parallelism, CP=2 x DP=2 distributed, CP=2 x PP=2" {
    equivalent cp2tp2 4 llama --context-parallel-size 2 --tensor-model-parallel-size 2 \
        --sequence-parallel
    equivalent cp2dp2 4 gpt --context-parallel-size 2 --use-distributed-optimizer
    equivalent cp2pp2 4 gpt --context-parallel-size 2 --pipeline-model-parallel-size 2
}

@test "a2a: GPT and Llama with GQA at CP=2 and CP=4 match one process" {
    equivalent cp2 2 gpt --context-parallel-size 2 --cp-comm-type a2a
    equivalent cp4 4 gpt --context-parallel-size 4 --cp-comm-type a2a
    equivalent lcp2 2 llama --context-parallel-size 2 --cp-comm-type a2a
    equivalent lcp4 4 llama --context-parallel-size 4 --cp-comm-type a2a
}

@test "a2a: packed documents, GPT and Llama, CP=2 and CP=4 (GPT), CP=2 x PP=2, match one process" {
    pgpt
    pllama
    equivalent gcp2 2 pgpt --context-parallel-size 2 --cp-comm-type a2a
    equivalent gcp4 4 pgpt --context-parallel-size 4 --cp-comm-type a2a
    equivalent lcp2 2 pllama --context-parallel-size 2 --cp-comm-type a2a
    equivalent lcp2pp2 4 pllama --context-parallel-size 2 --pipeline-model-parallel-size 2 \
        --cp-comm-type a2a
}

@test "a2a: CP=2 x TP=2 with sequence parallelism, CP=2 x DP=2 distributed, CP=2 x PP=2" {
    equivalent cp2tp2 4 llama --context-parallel-size 2 --tensor-model-parallel-size 2 \
        --sequence-parallel --cp-comm-type a2a
    equivalent cp2dp2 4 gpt --context-parallel-size 2 --use-distributed-optimizer \
        --cp-comm-type a2a
    equivalent cp2pp2 4 gpt --context-parallel-size 2 --pipeline-model-parallel-size 2 \
        --cp-comm-type a2a
}

@test "micro-batches of 2 sequences (p2p and a2a), and validation under CP, match one process" {
    # every sequence of a micro-batch is cut alike; the reference runs
    # micro-batches of 1 (the same mean: every target counts)
    equivalent mb2 2 gpt --context-parallel-size 2 --micro-batch-size 2
    equivalent mb2a 2 llama --context-parallel-size 2 --micro-batch-size 2 --cp-comm-type a2a
    local v=(--eval-interval 5 --eval-iters 2 --train-iters 10)
    run -0 "$MC_TRAIN" "${gpt[@]}" "${v[@]}"
    grep 'validation loss' <<<"$output" >one.txt
    [ "$(wc -l <one.txt)" -eq 3 ]
    run --separate-stderr mpi 4 "${gpt[@]}" "${v[@]}" --context-parallel-size 4
    assert_success
    grep 'validation loss' <<<"$stderr" >cp4.txt
    diff one.txt cp4.txt
}

@test "a checkpoint written at CP=4 resumes at CP=1 continuing the run's losses" {
    local ref="$BATS_FILE_TMPDIR/ref-gpt"
    if [ ! -f "$ref.jsonl" ]; then
        "$MC_TRAIN" "${gpt[@]}" --log-json "$ref.jsonl" --save "$ref" >/dev/null 2>&1
    fi
    run --separate-stderr mpi 4 "${gpt[@]}" --context-parallel-size 4 --exit-interval 10 \
        --save cp4 --log-json cp4.jsonl
    assert_success
    [ "$(cat cp4/latest_checkpointed_iteration.txt)" = 10 ]
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --load cp4 --save one --log-json one.jsonl
    assert_success
    # iterations 1..10 at CP=4, then 11..20 in one process: the 20 losses
    # of the uninterrupted run, and its final weights
    cat cp4.jsonl one.jsonl >both.jsonl
    same_losses both.jsonl "$ref.jsonl"
    if "$MC_PYTHON" -c 'import h5py' 2>/dev/null; then
        same_weights one/iter_0000020/model.h5 "$ref/iter_0000020/model.h5" same-names
    fi
}

@test "bad input is one line and exit 2 before any work" {
    # sequence length not divisible by 2 x CP (one process: refused before
    # the grid is looked at)
    run "$MC_TRAIN" "${gpt[@]}" --context-parallel-size 2 --seq-length 18
    assert_failure 2
    assert_output "mc-train: error: --seq-length 18 is not divisible by 2 x --context-parallel-size = 4 (each rank holds two chunks of every sequence)"
    # under mpirun: printed once, by rank 0, and no rank starts the data
    run --separate-stderr mpi 2 "${gpt[@]}" --context-parallel-size 2 --seq-length 18 \
        --save never
    assert_failure 2
    [ "$(grep -c 'not divisible by 2 x --context-parallel-size' <<<"$stderr")" -eq 1 ]
    [ "$(grep -c '^mc-train' <<<"$stderr")" -eq 1 ]
    [ ! -e never ]
    # with sequence parallelism, by CP x TP
    run "$MC_TRAIN" "${gpt[@]}" --context-parallel-size 2 --tensor-model-parallel-size 4 \
        --sequence-parallel --seq-length 20
    assert_failure 2
    assert_output --partial "--seq-length 20 is not divisible by --context-parallel-size x --tensor-model-parallel-size = 8"
    # a2a: 2 query groups over CP=4
    run "$MC_TRAIN" --model tiny-llama "${common[@]}" --context-parallel-size 4 \
        --cp-comm-type a2a
    assert_failure 2
    assert_output "mc-train: error: --cp-comm-type a2a: 4 attention heads and 2 query groups per tensor-parallel rank cannot be split over --context-parallel-size 4 (both must be multiples of it); use --cp-comm-type p2p"
    run "$MC_TRAIN" "${gpt[@]}" --cp-comm-type ring
    assert_failure 2
    assert_output --partial "--cp-comm-type"
    # a valid CP needs the ranks
    run "$MC_TRAIN" "${gpt[@]}" --context-parallel-size 2
    assert_failure 2
    assert_output --partial "--context-parallel-size 2 needs a multiple of 2 ranks and this is one process"
}
