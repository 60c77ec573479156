#!/usr/bin/env bats
# parallel_etp_sub.bats - expert tensor parallelism smaller than TP
# (--expert-tensor-parallel-size 2 under --tensor-model-parallel-size 4):
# each TP group is two ETP groups of two consecutive TP ranks (MC_GROUP_ETP),
# every expert split over its ETP group the way ETP = TP splits it over the
# whole group, the two ETP groups replicas of each other for the experts
# (MC_GROUP_ETP_REP). With SP an ETP group gathers its members' rows, runs
# its slices and reduce-scatters the partial outputs within the group, and
# the experts' gradients are summed over the replicas; without SP every ETP
# group runs every token. 20 iterations on 4 ranks give one process's losses
# and load-balancing losses within 1e-6 relative and its final weights within
# 1e-6 (mpi_common.bash's same_weights): SwiGLU experts without and with SP,
# GELU experts with biases (with SP and without), micro-batches of 2 with
# shared experts and selective recomputation, SwiGLU experts with biases
# under the distributed optimizer with a capacity factor; on 8 ranks x EP=2
# (both dispatchers, the distributed optimizer), x CP=2, x PP=2, x DP=2. Checkpoints: one
# written at TP=4 x ETP=2 resumes in one process and one process's at TP=4
# x ETP=2, the uninterrupted run's losses and weights, and a checkpoint
# loaded and saved again at once is the same bits. The dry run's per-rank
# parameters, activations and traffic are the run's (--log-comm), the tokens
# per expert one process's, and the bad values are refused in one line.
# Measured: losses within 2.6e-8 relative, weights 1.2e-7, resumed 1.3e-8.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# mpi_common.bash's MoE Llama (two layers, 4 SwiGLU experts of 32, top-2,
# 20 iterations); TP=4 divides its 4 query groups and 16 positions
moe=("${moe_args[@]}")
# GELU experts with biases (tiny-gpt's defaults)
moegpt=("${moe[@]}" --model tiny-gpt)
# micro-batches of 2 (the gathers' reordering of B sequences) with shared experts
moemb2=("${moe[@]}" --micro-batch-size 2 --moe-shared-expert-intermediate-size 64)
# SwiGLU experts with biases, and a capacity factor
moeswb=("${moe[@]}" --model tiny-gpt --swiglu --moe-expert-capacity-factor 1.0)
moecap=("${moe[@]}" --moe-expert-capacity-factor 1.0)
# sigmoid routing with the expert bias (its counts summed over TP and DP)
moebias=("${moe[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias)
etp=(--tensor-model-parallel-size 4 --expert-tensor-parallel-size 2)

setup() {
    mpi_setup
    cd "$BATS_TEST_TMPDIR"
}

@test "TP=4 x ETP=2, SwiGLU experts without and with SP: one process's losses, balancing losses and weights" {
    etp_equivalent sub 4 moe "${etp[@]}"
    etp_equivalent subsp 4 moe "${etp[@]}" --sequence-parallel
}

@test "TP=4 x ETP=2, GELU experts with biases with and without SP, micro-batches of 2 with shared experts and selective recomputation, SwiGLU experts with biases under the distributed optimizer with a capacity factor: one process" {
    etp_equivalent subgpt 4 moegpt "${etp[@]}" --sequence-parallel
    etp_equivalent subgptnosp 4 moegpt "${etp[@]}"
    etp_equivalent submb2 4 moemb2 "${etp[@]}" --sequence-parallel \
        --recompute-granularity selective --recompute-modules moe_act shared_experts
    etp_equivalent subswb 4 moeswb "${etp[@]}" --sequence-parallel --use-distributed-optimizer
}

@test "TP=4 x ETP=2 on 8 ranks: x EP=2 (both dispatchers, the distributed optimizer), x CP=2 with a capacity factor, x PP=2, x DP=2 with the expert bias: one process" {
    etp_equivalent subep2 8 moe "${etp[@]}" --sequence-parallel --expert-model-parallel-size 2
    etp_equivalent subep2ag 8 moe "${etp[@]}" --expert-model-parallel-size 2 \
        --moe-token-dispatcher-type allgather
    etp_equivalent subcp2 8 moecap "${etp[@]}" --sequence-parallel --context-parallel-size 2
    etp_equivalent subpp2 8 moe "${etp[@]}" --sequence-parallel --pipeline-model-parallel-size 2
    etp_equivalent subdp2 8 moebias "${etp[@]}" --sequence-parallel --use-distributed-optimizer
    etp_equivalent subep2dist 8 moebias "${etp[@]}" --sequence-parallel \
        --expert-model-parallel-size 2 --use-distributed-optimizer
}

@test "a checkpoint written at TP=4 x ETP=2 resumes in one process and one process's at TP=4 x ETP=2: the uninterrupted run's losses and weights; each saves what it loaded bit for bit" {
    "$MC_TRAIN" "${moegpt[@]}" --log-json full.jsonl --save full >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moegpt[@]}" "${etp[@]}" --sequence-parallel --exit-interval 10 \
        --save ck --save-interval 10 --log-json ck.jsonl
    assert_success
    assert_output "ck/iter_0000010"
    run --separate-stderr "$MC_TRAIN" "${moegpt[@]}" --load ck --log-json r1.jsonl --save r1
    assert_success
    # iterations 1 to 10 at TP=4 x ETP=2, 11 to 20 in one process
    cat ck.jsonl r1.jsonl > both.jsonl
    same_losses both.jsonl full.jsonl
    # the other way: 10 iterations in one process, 10 at TP=4 x ETP=2
    "$MC_TRAIN" "${moegpt[@]}" --exit-interval 10 --save ck1 --save-interval 10 \
        --log-json ck1.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moegpt[@]}" "${etp[@]}" --sequence-parallel --load ck1 \
        --log-json r2.jsonl --save r2
    assert_success
    cat ck1.jsonl r2.jsonl > both2.jsonl
    same_losses both2.jsonl full.jsonl
    # loaded and saved again at once (--train-iters 10): the same tensors,
    # weights and moments, bit for bit, TP=4 x ETP=2's read by one process
    # and one process's read at TP=4 x ETP=2
    same_bits_after_reload 4 moegpt etp
    require_python_module h5py
    same_weights r1/iter_0000020/model.h5 full/iter_0000020/model.h5 same-names
    same_weights r2/iter_0000020/model.h5 full/iter_0000020/model.h5 same-names
}

# plan_params: the per-rank parameters of $output's dry run
plan_params() { grep -o 'parameters: [0-9]* elements' <<<"$output" | grep -o '[0-9]*'; }

@test "the dry run at TP=4 x ETP=2: per-rank parameters hold half of each expert (the run's checkpoint the model's), activations and traffic per group the run's (--log-comm), tokens per expert one process's" {
    local m=("${moemb2[@]}" --tensor-model-parallel-size 4) p1 p2 p4
    run -0 "$MC_TRAIN" "${m[@]}" --expert-tensor-parallel-size 1 --dry-run --world-size 4
    p1=$(plan_params)
    run -0 "$MC_TRAIN" "${m[@]}" --expert-tensor-parallel-size 2 --dry-run --world-size 4
    p2=$(plan_params)
    assert_line --partial "tensor 4 x pipeline 1 x context 1 x data 1; experts split over tensor 2;"
    run -0 "$MC_TRAIN" "${m[@]}" --expert-tensor-parallel-size 4 --dry-run --world-size 4
    p4=$(plan_params)
    echo "# per-rank parameters: ETP=1 $p1, ETP=2 $p2, ETP=4 $p4" >&3
    # 2 MoE layers x (4 experts x (fc1 64 x 64 + fc2 64 x 32) + the shared
    # expert's fc1 128 x 64 + fc2 64 x 64): half of it at ETP=2, a quarter at 4
    local x=$((2 * (4 * (64 * 64 + 64 * 32) + 128 * 64 + 64 * 64)))
    [ "$((p1 - p2))" -eq $((x / 2)) ]
    [ "$((p1 - p4))" -eq $((x * 3 / 4)) ]
    local d planned got
    for d in --sequence-parallel ""; do
        # shellcheck disable=SC2086
        run -0 "$MC_TRAIN" "${m[@]}" --expert-tensor-parallel-size 2 $d --train-iters 2 \
            --lr-warmup-iters 1 --dry-run --world-size 4
        planned=$(grep -o '^  activations: .* scratch' <<<"$output" | sed 's/.*in flight x //')
        local tpg etpg rep
        tpg=$(grep -o '^    tensor-parallel group: [0-9]* / [0-9]* bytes, [0-9]* calls' <<<"$output")
        etpg=$(grep -o 'expert-tensor-parallel group: [0-9]* / [0-9]* bytes, [0-9]* calls' <<<"$output")
        rep=$(grep -o 'replica group: [0-9]* / [0-9]* bytes, [0-9]* calls' <<<"$output")
        # shellcheck disable=SC2086
        run --separate-stderr mpi 4 "${m[@]}" --expert-tensor-parallel-size 2 $d --train-iters 2 \
            --lr-warmup-iters 1 --log-interval 1 --log-comm --save one
        assert_success
        got=$(grep -o 'activations (stage 0): .* scratch' <<<"$stderr" | sed 's/.*= 1 x //')
        echo "# ${d:-no SP}: activations planned $planned, allocated $got" >&3
        [ -n "$got" ] && [ "$got" = "$planned" ]
        # the second iteration's traffic per group, summed over the
        # collective kinds, against the plan's bytes and calls
        local line
        line=$(grep ' comm per iteration:' <<<"$stderr" | tail -1 | sed 's/.*comm per iteration://')
        echo "# ${d:-no SP}: plan: $tpg; $etpg; $rep" >&3
        echo "# ${d:-no SP}: run: $line" >&3
        sum_group() {
            tr '|' '\n' <<<"$line" | awk -v g="$1" '$1 == g { c += $3; b += $5 }
                END { printf "%d %d\n", c, b * 1e6 + 0.5 }'
        }
        [ "$(sum_group tp)" = "$(awk '{ print $7, $3 }' <<<"$tpg")" ]
        [ "$(sum_group etp)" = "$(awk '{ print $7, $3 }' <<<"$etpg")" ]
        [ "$(sum_group etp-rep)" = "$(awk '{ print $7, $3 }' <<<"$rep")" ]
    done
    # the parameters the model counts are its checkpoint's
    if "$MC_PYTHON" -c 'import h5py' 2>/dev/null; then
        run -0 "$MC_TRAIN" "${m[@]}" --expert-tensor-parallel-size 2 --dry-run --world-size 4
        local total
        total=$(grep -o '^model: [0-9]* parameters' <<<"$output" | grep -o '[0-9]*')
        run -0 "$MC_PYTHON" -c 'import sys, h5py
m = h5py.File(sys.argv[1], "r")["model"]
print(sum(m[k].size for k in m))' one/iter_0000002/model.h5
        echo "# model parameters: dry run $total, checkpoint $output" >&3
        [ -n "$total" ] && [ "$output" = "$total" ]
    fi
    # the tokens per expert: each ETP group counted its rows, summed once
    local t=(--moe-per-layer-logging --log-interval 1 --train-iters 4)
    "$MC_TRAIN" "${moe[@]}" "${t[@]}" --log-json one.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moe[@]}" "${t[@]}" "${etp[@]}" --sequence-parallel \
        --log-json sp.jsonl
    assert_success
    local f
    for f in one sp; do
        grep -o '"step": [0-9]*\|"moe/tokens_per_expert_layer_[0-9]*_expert_[0-9]*": [0-9.e+]*' $f.jsonl > $f.txt
    done
    [ "$(grep -c tokens_per_expert one.txt)" -eq $((4 * 2 * 4)) ]
    diff one.txt sp.txt
}

@test "bad expert tensor parallelism under TP=4, one line before any work (exit 2): 3 and 8 do not divide 4, F not divisible by ETP" {
    local b
    for b in 3 8; do
        run --separate-stderr mpi 4 "${moe[@]}" --tensor-model-parallel-size 4 \
            --expert-tensor-parallel-size $b
        assert_failure 2
        [ "$(printf '%s\n' "$stderr" | grep -c 'error')" -eq 1 ]
        [[ "$stderr" == *"--expert-tensor-parallel-size $b must divide --tensor-model-parallel-size 4"* ]]
        run --separate-stderr "$MC_TRAIN" "${moe[@]}" --tensor-model-parallel-size 4 \
            --expert-tensor-parallel-size $b --dry-run --world-size 4
        assert_failure 2
        [[ "$stderr" == *"--expert-tensor-parallel-size $b must divide --tensor-model-parallel-size 4"* ]]
    done
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --moe-ffn-hidden-size 33 "${etp[@]}" \
        --dry-run --world-size 4
    assert_failure 2
    [[ "$stderr" == *"--moe-ffn-hidden-size (33) must be a multiple of --expert-tensor-parallel-size (2)"* ]]
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --moe-shared-expert-intermediate-size 33 "${etp[@]}" \
        --dry-run --world-size 4
    assert_failure 2
    [[ "$stderr" == *"--moe-shared-expert-intermediate-size (33) must be a multiple of --expert-tensor-parallel-size (2)"* ]]
    # the experts' widths need only divide by ETP, not by TP
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --moe-ffn-hidden-size 18 "${etp[@]}" \
        --moe-shared-expert-intermediate-size 18 --dry-run --world-size 4
}
