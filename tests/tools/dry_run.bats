#!/usr/bin/env bats
# mc-train --dry-run (issue 4, section 9): the memory and communication of a
# grid from the options alone. References: GPT-2 124M has 124,475,904
# parameters with Megatron's vocabulary padded to 50304 (TP=1); under TP the
# split tensors (embeddings, QKV, proj, fc1, fc2 weights and their column
# biases) divide by TP while the 843,264 replicated ones (position table,
# norms, row biases) do not, and the vocabulary pads to 128 x TP. Buffers are
# fp32, so bytes = 4 x the (64-byte padded) elements. Then the measured
# check: the peak RSS (GNU time's %M) of a real CPU run minus that of a
# small run, against the plan's difference of totals, within 15%
# (seen: 4.5%).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
base=(--vocab-size 50257 --lr 1e-4 --train-iters 1)

setup() { cd "$BATS_TEST_TMPDIR"; }

# field PLAN-FILE STAGE REGEX: the first number after REGEX in stage STAGE
field() {
    awk -v s="stage $2 " -v re="$3" 'index($0, s) == 1 { on = 1; next } /^stage / { on = 0 }
        on && $0 ~ re { sub(".*" re "[^0-9]*", ""); print $1 + 0; exit }' "$1"
}

@test "dry-run: gpt2-124m parameters, gradients and optimizer at TP=1, 2, 4 and DP" {
    rep=843264
    for tp in 1 2 4; do
        run -0 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" \
            --tensor-model-parallel-size $tp --world-size $((tp * 2))
        echo "$output" > plan.txt
        V=$(( (50257 + 128 * tp - 1) / (128 * tp) * 128 * tp ))
        # 124475904 with vocab 50304: the split part scales with the vocabulary
        split=$(( 124475904 - rep + (V - 50304) * 768 ))
        want=$(( split / tp + rep ))
        run field plan.txt 0 'parameters:'
        assert_output "$want"
        bytes=$(field plan.txt 0 'parameters: [0-9]+ elements,')
        # bytes = 4 x elements + the 64-byte padding of each tensor (< 16 floats each)
        [ "$bytes" -ge $((4 * want)) ] && [ "$bytes" -lt $((4 * want + 64 * 200)) ]
        run field plan.txt 0 'gradients:'
        assert_output "$bytes"
        run field plan.txt 0 'optimizer:'
        assert_output "$((8 * want))"
        run grep -c 'data-parallel group: [0-9]* / [0-9]* bytes, 1 calls (all-reduce' plan.txt
        assert_output 1
    done
    grep -q "^model: 124475904 parameters" <("$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}")
}

@test "dry-run: the distributed optimizer shards Adam over DP; DP traffic is 2(DP-1)/DP x gradients" {
    run -0 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --world-size 4 \
        --use-distributed-optimizer
    echo "$output" > plan.txt
    g=$(field plan.txt 0 'gradients:')
    o=$(field plan.txt 0 'optimizer:')
    # m and v: 2 x 4 bytes x (numel / 4 + 1)
    [ "$o" -eq $(( 2 * 4 * (g / 4 / 4 + 1) )) ]
    grep -q "data-parallel group: $((2 * g)) / $((g * 3 / 2)) bytes, 2 calls" plan.txt
    grep -q '^  activations: .* pipeline buffer; recomputation none$' plan.txt
}

@test "dry-run: tensor-parallel traffic: 4 all-reduces of B x T x C floats per layer" {
    # TP=2, 12 layers, B=4, T=1024, C=768: 48 + 1 (embedding) + 1 (head) of
    # 12582912 bytes, and 3 cross-entropy statistics of B T floats
    run -0 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --tensor-model-parallel-size 2 \
        --micro-batch-size 4
    X=$((4 * 1024 * 768 * 4))
    assert_output --partial "tensor-parallel group: $((50 * X + 3 * 4 * 1024 * 4)) / "
    assert_output --partial ", 53 calls"
}

@test "dry-run: grids that do not fit are refused with the numbers" {
    run -2 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --tensor-model-parallel-size 5 \
        --world-size 10
    assert_output --partial "5"
    assert_output --partial "heads"
    run -2 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --tensor-model-parallel-size 2 \
        --world-size 3
    assert_output --partial "3 ranks do not divide into tensor-parallel 2"
    run -2 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --world-size 3 \
        --global-batch-size 4
    assert_output --partial "global batch 4 is not a multiple of micro-batch 1 x data-parallel 3"
}

@test "dry-run: memory within 15% of a real CPU run's peak RSS (minus a small run's)" {
    [ -x /usr/bin/time ] || skip "GNU time is not installed (Debian package time)"
    c=(--vocab-size 50257 --seq-length 256 --micro-batch-size 2 --lr 1e-4 --train-iters 1
       --mock-data --eval-iters 0 --threads 1)
    big=(--model gpt2-124m --num-layers 4 "${c[@]}")
    small=(--model tiny-gpt "${c[@]}")
    rss() { /usr/bin/time -f %M -o rss.txt "$MC_TRAIN" "$@" 2>/dev/null >/dev/null; echo $(( $(cat rss.txt) * 1024 )); }
    plan() { "$MC_TRAIN" --dry-run "$@" | awk '/^  total:/ { print $2 }'; }
    rb=$(rss "${big[@]}"); rs=$(rss "${small[@]}")
    pb=$(plan "${big[@]}"); ps=$(plan "${small[@]}")
    awk -v rb="$rb" -v rs="$rs" -v pb="$pb" -v ps="$ps" 'BEGIN {
        m = rb - rs; p = pb - ps; r = p / m
        printf "# measured %.1f MiB, planned %.1f MiB, ratio %.3f\n", m / 1048576, p / 1048576, r
        exit !(r > 0.85 && r < 1.15) }' >&3
}

@test "dry-run: the interleaved schedule is refused, not mis-planned" {
    run "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --world-size 4 \
        --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 \
        --global-batch-size 4 --micro-batch-size 1
    assert_failure
    assert_output --partial "--dry-run does not model the interleaved schedule"
}
