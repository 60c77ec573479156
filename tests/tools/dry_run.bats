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

@test "dry-run: context parallelism: CP traffic of the ring and of the all-to-all, activations ~1/CP" {
    # gpt2-124m, T=1024, B=1, 12 layers of 12 heads (D=64). Ring at CP=2:
    # each rank's k|v block is 2 x 512 x 12 x 64 floats = 3145728 bytes;
    # per layer it goes round once forward, once backward, and its gradient
    # twice: 4 sends and 4 receives
    run -0 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --context-parallel-size 2
    echo "$output" >cp2.txt
    kv=3145728
    assert_output --partial "context-parallel group: $((12 * 8 * kv)) / $((12 * 4 * kv)) bytes, 96 calls (p2p"
    assert_output --partial "2 ranks = tensor 1 x pipeline 1 x context 2 x data 1"
    # the gradients are reduced over data x context
    assert_output --partial "data-parallel group: $(field cp2.txt 0 'gradients:') / $(field cp2.txt 0 'gradients:') bytes, 1 calls (all-reduce of gradients, over data x context)"
    # Ulysses at CP=4: 12 all-to-alls per layer (q, k, v, out forward; q, k,
    # v, out, dout and dq, dk, dv backward: 144 heads' worth), each 3 sends
    # of 256 x 3 x 64 floats and 3 receives
    run -0 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --context-parallel-size 4 \
        --cp-comm-type a2a
    sent=$((12 * 3 * 256 * 64 / 4 * 144 * 4))
    assert_output --partial "context-parallel group: $((2 * sent)) / $sent bytes, 864 calls (a2a"
    echo "$output" >cp4.txt
    run -0 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}"
    echo "$output" >cp1.txt
    # activations per rank: 1/CP of the layers' (the LM head's logits chunk
    # and the CP scratch stay): below 0.6 and 0.35 of CP=1's
    a1=$(field cp1.txt 0 'activations:') a2=$(field cp2.txt 0 'activations:')
    a4=$(field cp4.txt 0 'activations:')
    echo "# activations: CP=1 $a1, CP=2 $a2, CP=4 (a2a) $a4 bytes" >&3
    awk -v a="$a1" -v b="$a2" -v c="$a4" 'BEGIN { exit !(b < 0.6 * a && c < 0.35 * a) }'
    # a grid CP does not fit
    run -2 "$MC_TRAIN" --dry-run --model gpt2-124m "${base[@]}" --context-parallel-size 2 \
        --world-size 3
    assert_output --partial "3 ranks do not divide into tensor-parallel 1 x pipeline-parallel 1 x context-parallel 2"
}

# Issue 11's bad input: a model larger than the memory there is gets one line
# naming the bytes the plan needs (--dry-run's total for the stage, to the
# byte) and the bytes available (on the CPU, RAM and swap: /proc/meminfo's
# MemTotal + SwapTotal), exit 1, before any allocation and with nothing
# written. GPT-3 175B needs ~2.7 TiB on one rank; with PP=2 each stage's
# figure is its own.
@test "a model that does not fit in memory is refused before allocating: bytes needed and available, exit 1" {
    big=(--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048
        --max-position-embeddings 2048 --vocab-size 50257 --lr 1e-4 --train-iters 1)
    run -0 "$MC_TRAIN" --dry-run "${big[@]}"
    echo "$output" > plan.txt
    need=$(awk '/^stage 0 / { on = 1 } on && /total:/ { print $2; exit }' plan.txt)
    [[ "$need" =~ ^[0-9]{13}$ ]]
    avail=$(awk '/^MemTotal:|^SwapTotal:/ { s += $2 } END { printf "%.0f", s * 1024 }' /proc/meminfo)
    run -1 "$MC_TRAIN" "${big[@]}" --mock-data --device cpu --save ck --save-interval 1
    [ "${#lines[@]}" -eq 1 ]
    assert_output --partial "mc-train: error: the model does not fit: pipeline stage 0 needs $need bytes on each of its ranks $(
        awk -v n="$need" 'BEGIN { printf "(%.1f GiB: ", n / 2^30 }')"
    assert_output --partial "and this machine (RAM and swap) has $avail bytes"
    [ ! -e ck ]
    [[ "$output" != *"out of memory"* ]]
}
