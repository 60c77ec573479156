#!/usr/bin/env bats
# parallel_ep.bats - expert parallelism (--expert-model-parallel-size): the
# experts of each MoE layer split over the EP ranks, which train on
# different data as data-parallel ranks do, with the tokens travelling to
# their experts' ranks and back (--moe-token-dispatcher-type alltoall, the
# default, and allgather). 20 iterations under mpirun give the single
# process's losses and load-balancing losses within 1e-6 relative and its
# final weights within 1e-6 (mpi_common.bash's same_weights), with and
# without a capacity factor (the same tokens dropped), for EP=2, EP=4,
# EP=2 x DP=2 (plain and distributed optimizer), EP=2 x TP=2 and EP=2 x
# PP=2 (1F1B and interleaved; the experts' own TP: parallel_etp.bats); a
# checkpoint saved at EP=4 resumes at EP=1 and EP=2 with the uninterrupted
# run's losses; the dry run's parameters and activations are the run's;
# the tokens per expert are one process's; and the bad inputs, each one
# line before any work. Sequence parallelism with experts too (TP=2 and
# EP=2 x TP=2 with SP), and context parallelism (CP=2, EP=2 x CP=2 with
# both dispatchers and the distributed optimizer, CP=2 x TP=2 with SP and
# seq_aux_loss over sequences split across the CP ranks; the router's
# logits are gathered over CP so capacity drops and balancing losses are
# one process's; a checkpoint of EP=2 x CP=2 resumes in one process).
# Measured: losses within 3.7e-8 relative, balancing losses 2e-9, weights
# 1.2e-7, resumed losses 1.6e-8.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# mpi_common.bash's MoE Llama (two layers, 4 experts of 32, top-2, 20
# iterations)
moe=("${moe_args[@]}")
# the same with a capacity factor that drops tokens (1.0: ~0.1% of the loss)
moecap=("${moe[@]}" --moe-expert-capacity-factor 1.0)
# the same with padding to the capacity
moepad=("${moecap[@]}" --moe-pad-expert-input-to-capacity)
# four layers, for the interleaved schedule on 2 stages (v = 2)
moe4=("${moe[@]}" --num-layers 4)

setup() {
    mpi_setup
    cd "$BATS_TEST_TMPDIR"
}

# balancing NAME: the load_balancing_loss values of NAME.jsonl as "lm loss"
# lines, so same_losses compares them.
balancing() {
    sed 's/"lm loss": [^,}]*, //; s/"load_balancing_loss"/"lm loss"/' "$1.jsonl" > "$1.lb.jsonl"
}

# ep_equivalent NAME N MODEL ARGS...: mpi_common's equivalent, and the
# load-balancing losses of one process too.
ep_equivalent() {
    local name=$1 model=$3
    equivalent "$@"
    [[ "$stderr" == *"| load_balancing_loss: "*"| z_loss: "* ]]
    local ref="$BATS_FILE_TMPDIR/ref-$model"
    balancing "$name"
    balancing "$ref"
    same_losses "$name.lb.jsonl" "$ref.lb.jsonl"
}

@test "EP=2, both dispatchers: losses, balancing losses and weights of one process" {
    ep_equivalent ep2 2 moe --expert-model-parallel-size 2
    ep_equivalent ep2ag 2 moe --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
}

@test "EP=4, both dispatchers: losses, balancing losses and weights of one process" {
    ep_equivalent ep4 4 moe --expert-model-parallel-size 4
    ep_equivalent ep4ag 4 moe --expert-model-parallel-size 4 --moe-token-dispatcher-type allgather
}

@test "EP=2 with a capacity factor, both dispatchers, and padded to capacity: one process's dropped tokens" {
    # the reference drops tokens: its losses differ from the model without dropping
    "$MC_TRAIN" "${moe[@]}" --log-json nodrop.jsonl >/dev/null 2>&1
    "$MC_TRAIN" "${moecap[@]}" --log-json drop.jsonl >/dev/null 2>&1
    run ! same_losses drop.jsonl nodrop.jsonl
    ep_equivalent ep2cap 2 moecap --expert-model-parallel-size 2
    ep_equivalent ep2capag 2 moecap --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
    ep_equivalent ep2pad 2 moepad --expert-model-parallel-size 2
    ep_equivalent ep2padag 2 moepad --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
}

@test "EP=2 x DP=2 (expert gradients over the expert-data-parallel group), overlapped: one process" {
    ep_equivalent ep2dp2 4 moe --expert-model-parallel-size 2 --overlap-grad-reduce --ddp-bucket-size 2000
    ep_equivalent ep2dp2cap 4 moecap --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
}

@test "EP=2 x DP=2 with the distributed optimizer (sharded over the expert-data-parallel group): one process" {
    ep_equivalent ep2dp2do 4 moe --expert-model-parallel-size 2 --use-distributed-optimizer
    ep_equivalent ep2dp2doag 4 moecap --expert-model-parallel-size 2 --use-distributed-optimizer \
        --overlap-param-gather --moe-token-dispatcher-type allgather
}

@test "EP=2 x TP=2 (experts replicated over TP): one process, both dispatchers" {
    ep_equivalent ep2tp2 4 moe --expert-model-parallel-size 2 --tensor-model-parallel-size 2
    ep_equivalent ep2tp2ag 4 moe --expert-model-parallel-size 2 --tensor-model-parallel-size 2 \
        --moe-token-dispatcher-type allgather
}

@test "sequence parallelism with experts: TP=2 and EP=2 x TP=2 with SP, and with the expert bias (counts summed over TP): one process's" {
    ep_equivalent tp2sp 2 moe --tensor-model-parallel-size 2 --sequence-parallel
    ep_equivalent ep2tp2sp 4 moe --expert-model-parallel-size 2 --tensor-model-parallel-size 2 \
        --sequence-parallel
    # (a model array of its own name: equivalent's reference is made once per name)
    local biasnocap=("${moe[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
                     --moe-router-bias-update-rate 1e-2)
    ep_equivalent ep2tp2spbias 4 biasnocap --expert-model-parallel-size 2 \
        --tensor-model-parallel-size 2 --sequence-parallel
}

@test "EP=2 x TP=2 with SP, 2 sequences per micro-batch, capacity by position, seq_aux_loss: one process's" {
    local mb2=("${moe[@]}" --micro-batch-size 2 --global-batch-size 8 --moe-expert-capacity-factor 1.0
               --moe-token-drop-policy position --moe-router-load-balancing-type seq_aux_loss)
    "$MC_TRAIN" "${mb2[@]}" --log-json ref.jsonl --save ref >/dev/null 2>&1
    local d
    for d in alltoall allgather; do
        run --separate-stderr mpi 4 "${mb2[@]}" --expert-model-parallel-size 2 \
            --tensor-model-parallel-size 2 --sequence-parallel --moe-token-dispatcher-type $d \
            --log-json $d.jsonl --save $d
        assert_success
        same_losses $d.jsonl ref.jsonl
        sed 's/"lm loss": [^,}]*, //; s/"seq_load_balancing_loss"/"lm loss"/' $d.jsonl > $d.lb.jsonl
        sed 's/"lm loss": [^,}]*, //; s/"seq_load_balancing_loss"/"lm loss"/' ref.jsonl > ref.lb.jsonl
        same_losses $d.lb.jsonl ref.lb.jsonl
        require_python_module h5py
        same_weights $d/iter_0000020/model.h5 ref/iter_0000020/model.h5 same-names
    done
}

@test "EP=2 x PP=2, 1F1B and interleaved: one process" {
    ep_equivalent ep2pp2 4 moe --expert-model-parallel-size 2 --pipeline-model-parallel-size 2
    ep_equivalent ep2vpp2 4 moe4 --expert-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --num-layers-per-virtual-pipeline-stage 1
}

@test "EP=2 with the expert bias (sigmoid routing): the counts summed over EP and DP, one process's" {
    local bias=("${moecap[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
                --moe-router-bias-update-rate 1e-2)
    ep_equivalent ep2bias 4 bias --expert-model-parallel-size 2
}

@test "a checkpoint saved at EP=4 resumes at EP=1 and EP=2, one of EP=2 x DP=2 with the distributed optimizer at EP=1: the uninterrupted run's losses" {
    # uninterrupted: 20 iterations in one process
    "$MC_TRAIN" "${moe[@]}" --log-json full.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moe[@]}" --expert-model-parallel-size 4 --exit-interval 10 \
        --save ck --save-interval 10
    assert_success
    assert_output "ck/iter_0000010"
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --load ck --log-json r1.jsonl
    assert_success
    run --separate-stderr mpi 2 "${moe[@]}" --expert-model-parallel-size 2 --load ck \
        --log-json r2.jsonl
    assert_success
    # the distributed optimizer's moments, gathered over the expert-data-parallel group
    run --separate-stderr mpi 4 "${moe[@]}" --expert-model-parallel-size 2 --exit-interval 10 \
        --use-distributed-optimizer --save ckd --save-interval 10
    assert_success
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --load ckd --log-json r3.jsonl
    assert_success
    # iterations 11 to 20 of each resume against the uninterrupted run
    for r in r1 r2 r3; do
        paste <(losses full.jsonl | tail -n 10) <(losses $r.jsonl) | awk -v r=$r '
            NF != 2 { bad = 1 }
            { d = $1 - $2; if (d < 0) d = -d; d /= $1; if (d > m) m = d; if (d > 1e-6) bad = 1; n++ }
            END { printf "# %s: %d losses, max relative difference %.3g\n", r, n, m > "/dev/fd/3";
                  exit (bad || n != 10) }'
    done
}

@test "bad expert parallelism, one line before any work: experts not divisible, ETP, world, no experts" {
    run --separate-stderr mpi 2 "${moe[@]}" --num-experts 3 --expert-model-parallel-size 2
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'error')" -eq 1 ]
    [[ "$stderr" == *"--num-experts 3 is not divisible by --expert-model-parallel-size 2"* ]]
    # (ETP not dividing TP: parallel_etp.bats, parallel_etp_sub.bats)
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --expert-tensor-parallel-size 2
    assert_failure 2
    [[ "$stderr" == *"--expert-tensor-parallel-size 2 must divide --tensor-model-parallel-size 1"* ]]
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --moe-token-dispatcher-type flex
    assert_failure 2
    [[ "$stderr" == *"--moe-token-dispatcher-type"*"flex"* ]]
    run --separate-stderr "$MC_TRAIN" --model tiny-llama --mock-data --vocab-size 64 \
        --train-iters 2 --lr 1e-3 --expert-model-parallel-size 2
    assert_failure 2
    [[ "$stderr" == *"--expert-model-parallel-size 2 needs --num-experts"* ]]
    # the world must be a multiple of TP x PP x CP x EP: bad usage (exit 2,
    # as for TP, PP and CP: parallel_train.bats), printed once
    run --separate-stderr mpi 3 "${moe[@]}" --expert-model-parallel-size 2
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'error')" -eq 1 ]
    [[ "$stderr" == *"3 ranks do not divide into tensor-parallel 1 x pipeline-parallel 1 x context-parallel 1 x expert-parallel 2 = 2 ranks"* ]]
    # one process cannot hold two EP ranks
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --expert-model-parallel-size 2
    assert_failure 2
    [[ "$stderr" == *"--expert-model-parallel-size 2 needs a multiple of 2 ranks"* ]]
}

@test "dry-run under EP: each rank holds E / EP experts, the same total and active parameters, the run's activations" {
    local p1 p2
    p1=$("$MC_TRAIN" "${moe[@]}" --dry-run | grep -o 'parameters: [0-9]* elements' | grep -o '[0-9]*')
    p2=$("$MC_TRAIN" "${moe[@]}" --expert-model-parallel-size 2 --dry-run --world-size 2 |
         grep -o 'parameters: [0-9]* elements' | grep -o '[0-9]*')
    # 2 MoE layers x 4 experts x (fc1 64 x 64 + fc2 64 x 32): half of them on each rank
    [ "$((p1 - p2))" -eq $((2 * 2 * (64 * 64 + 64 * 32))) ]
    run -0 "$MC_TRAIN" "${moe[@]}" --expert-model-parallel-size 2 --dry-run --world-size 4
    assert_line --partial "data 4 (expert 2 x expert-data 2)"
    assert_line --partial "model: 82752 parameters (58176 active per token"
    local planned
    planned=$(grep -o 'activations: [0-9]* bytes' <<<"$output" | head -1 | grep -o '[0-9]*')
    for d in alltoall allgather "alltoall --tensor-model-parallel-size 2 --sequence-parallel"; do
        run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --expert-model-parallel-size 2 \
            --moe-token-dispatcher-type $d --dry-run --world-size 4
        planned=$(grep -o 'activations: [0-9]* bytes' <<<"$output" | head -1 | grep -o '[0-9]*')
        run --separate-stderr mpi 4 "${moe[@]}" --expert-model-parallel-size 2 \
            --moe-token-dispatcher-type $d --train-iters 2 --lr-warmup-iters 1
        assert_success
        local got
        got=$(grep -o 'activations (stage 0): [0-9]* bytes' <<<"$stderr" | grep -o '[0-9]* bytes' | grep -o '[0-9]*')
        echo "# $d: activations planned $planned, allocated $got" >&3
        [ -n "$got" ] && [ "$got" -eq "$planned" ]
    done
    # the plan refuses what the run refuses
    run -2 "$MC_TRAIN" "${moe[@]}" --expert-model-parallel-size 2 --dry-run --world-size 3
    [[ "$output" == *"3 ranks do not divide into tensor-parallel 1 x pipeline-parallel 1 x context-parallel 1 x expert-parallel 2"* ]]
}

# tokens LOG: "step layer expert count" lines of the tokens per expert in a
# --log-json file (--moe-per-layer-logging).
tokens() {
    grep -o '"step": [0-9]*\|"moe/tokens_per_expert_layer_[0-9]*_expert_[0-9]*": [0-9.e+]*' "$1" |
        awk '/step/ { s = $2; next } { split($1, w, "_"); printf "%s %d %d %s\n", s, w[5], w[7] + 0, $2 }'
}

@test "tokens per expert (--moe-per-layer-logging): summed over EP, DP, TP (SP) and PP, one process's counts, tokens x top-k minus the dropped" {
    local t=(--moe-per-layer-logging --log-interval 1 --train-iters 4)
    # without dropping: 4 sequences x 16 tokens x top-2 per layer and iteration
    "$MC_TRAIN" "${moe[@]}" "${t[@]}" --log-json one.jsonl >/dev/null 2>&1
    tokens one.jsonl > one.txt
    [ "$(wc -l < one.txt)" -eq $((4 * 2 * 4)) ]
    awk '{ s[$1 " " $2] += $4 } END { for (k in s) if (s[k] != 128) exit 1 }' one.txt
    run --separate-stderr mpi 4 "${moe[@]}" "${t[@]}" --expert-model-parallel-size 2 --log-json ep.jsonl
    assert_success
    tokens ep.jsonl > ep.txt
    diff one.txt ep.txt
    # with sequence parallelism each TP rank counts its own rows: summed over TP too
    run --separate-stderr mpi 4 "${moe[@]}" "${t[@]}" --expert-model-parallel-size 2 \
        --tensor-model-parallel-size 2 --sequence-parallel --log-json sp.jsonl
    assert_success
    tokens sp.jsonl > sp.txt
    diff one.txt sp.txt
    # with context parallelism each CP rank counts its chunks' rows: summed over CP too
    run --separate-stderr mpi 4 "${moe[@]}" "${t[@]}" --expert-model-parallel-size 2 \
        --context-parallel-size 2 --log-json cp.jsonl
    assert_success
    tokens cp.jsonl > cp.txt
    diff one.txt cp.txt
    # with a capacity factor: fewer (the dropped), the same as one process's
    "$MC_TRAIN" "${moecap[@]}" "${t[@]}" --log-json onecap.jsonl >/dev/null 2>&1
    tokens onecap.jsonl > onecap.txt
    awk '{ s[$1 " " $2] += $4 } END { for (k in s) { if (s[k] > 128) exit 1; if (s[k] < 128) d = 1 } exit !d }' onecap.txt
    run --separate-stderr mpi 4 "${moecap[@]}" "${t[@]}" --expert-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --log-json eppp.jsonl
    assert_success
    tokens eppp.jsonl > eppp.txt
    [ "$(wc -l < eppp.txt)" -eq $((4 * 2 * 4)) ]
    diff onecap.txt eppp.txt
}

@test "MoE under context parallelism: CP=2 (p2p, a2a), EP=2 x CP=2 (both dispatchers, distributed optimizer), with a capacity factor and with the expert bias: one process's losses, balancing losses and weights" {
    ep_equivalent cp2 2 moecap --context-parallel-size 2
    ep_equivalent cp2a2a 2 moecap --context-parallel-size 2 --cp-comm-type a2a
    ep_equivalent ep2cp2 4 moecap --expert-model-parallel-size 2 --context-parallel-size 2
    ep_equivalent ep2cp2ag 4 moecap --expert-model-parallel-size 2 --context-parallel-size 2 \
        --moe-token-dispatcher-type allgather
    # the experts' gradients summed over the expert-data-parallel group,
    # which now spans the CP ranks (dp / ep x cp), and sharded there
    ep_equivalent ep2cp2do 4 moe --expert-model-parallel-size 2 --context-parallel-size 2 \
        --use-distributed-optimizer
    # the expert bias: the counts summed over CP (and EP, DP)
    local cpbias=("${moecap[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
                  --moe-router-bias-update-rate 1e-2)
    ep_equivalent cp2bias 2 cpbias --context-parallel-size 2
}

@test "MoE under CP=2 x TP=2 with SP, 2 sequences per micro-batch, capacity by position, seq_aux_loss across the CP ranks: one process's" {
    local mb2=("${moe[@]}" --micro-batch-size 2 --global-batch-size 8 --moe-expert-capacity-factor 1.0
               --moe-token-drop-policy position --moe-router-load-balancing-type seq_aux_loss)
    "$MC_TRAIN" "${mb2[@]}" --log-json ref.jsonl --save ref >/dev/null 2>&1
    sed 's/"lm loss": [^,}]*, //; s/"seq_load_balancing_loss"/"lm loss"/' ref.jsonl > ref.lb.jsonl
    local par
    for par in "--context-parallel-size 2" \
               "--context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel --cp-comm-type a2a"; do
        rm -rf x x.jsonl
        # shellcheck disable=SC2086
        run --separate-stderr mpi $([[ "$par" == *tensor* ]] && echo 4 || echo 2) "${mb2[@]}" $par \
            --log-json x.jsonl --save x
        assert_success
        same_losses x.jsonl ref.jsonl
        sed 's/"lm loss": [^,}]*, //; s/"seq_load_balancing_loss"/"lm loss"/' x.jsonl > x.lb.jsonl
        same_losses x.lb.jsonl ref.lb.jsonl
        require_python_module h5py
        same_weights x/iter_0000020/model.h5 ref/iter_0000020/model.h5 same-names
    done
}

@test "a checkpoint saved at EP=2 x CP=2 resumes in one process: the uninterrupted run's losses" {
    "$MC_TRAIN" "${moecap[@]}" --log-json full.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moecap[@]}" --expert-model-parallel-size 2 \
        --context-parallel-size 2 --exit-interval 10 --save ck --save-interval 10 --log-json ck.jsonl
    assert_success
    assert_output "ck/iter_0000010"
    run --separate-stderr "$MC_TRAIN" "${moecap[@]}" --load ck --log-json r1.jsonl
    assert_success
    # iterations 1 to 10 at EP=2 x CP=2, 11 to 20 in one process
    cat ck.jsonl r1.jsonl > both.jsonl
    same_losses both.jsonl full.jsonl
}

@test "dry-run of MoE under EP=2 x CP=2 (and recomputing the block): the run's kept, workspace and scratch bytes" {
    local s got plan
    for s in "" "--recompute-granularity selective --recompute-modules moe"; do
        # shellcheck disable=SC2086
        run --separate-stderr mpi 4 "${moecap[@]}" --expert-model-parallel-size 2 \
            --context-parallel-size 2 --train-iters 1 --lr-warmup-iters 0 $s
        assert_success
        got=$(grep -o 'activations (stage 0): .* scratch' <<<"$stderr" | sed 's/.*= 1 x //')
        # shellcheck disable=SC2086
        plan=$("$MC_TRAIN" "${moecap[@]}" --expert-model-parallel-size 2 --context-parallel-size 2 \
            --train-iters 1 --lr-warmup-iters 0 $s --dry-run --world-size 4 |
            grep -o '^  activations: .* scratch' | sed 's/.*in flight x //')
        echo "# ${s:-none}: run $got, plan $plan" >&3
        [ -n "$got" ] && [ "$got" = "$plan" ]
    done
}

# The staged path of device memory (MC_DEVICE_COMM=mpi on a GPU: each
# collective's data copied to a host buffer, the host bodies, copied back;
# forced on the CPU backend's memory here by MC_TEST_STAGE_HOST=1) gives
# the host path's bits in a whole run: EP=2 x TP=2 with SP and the
# distributed optimizer (all-to-all, all-reduce, reduce-scatter,
# all-gather, max, the non-blocking ones) on 4 ranks, and PP=2 x DP=2 (the
# pipeline's point to point) on 4 ranks: the same losses and the same
# checkpoint, bit for bit.
@test "the staged device-memory path (forced on host memory) gives the host path's bits: EP x TP x SP x distopt, PP x DP" {
    command -v h5diff >/dev/null || skip "h5diff not found (Debian package hdf5-tools)"
    grids=("--expert-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer"
           "--pipeline-model-parallel-size 2")
    for gi in 0 1; do
        # shellcheck disable=SC2206
        g=(${grids[$gi]})
        run --separate-stderr mpi 4 "${moe[@]}" "${g[@]}" --log-json host$gi.jsonl --save host$gi
        assert_success
        MC_TEST_STAGE_HOST=1 run --separate-stderr mpi 4 "${moe[@]}" "${g[@]}" --log-json staged$gi.jsonl --save staged$gi
        assert_success
        [ "$(losses host$gi.jsonl | wc -l)" -eq 20 ]
        diff <(losses host$gi.jsonl) <(losses staged$gi.jsonl)
        run -0 h5diff host$gi/iter_0000020/model.h5 staged$gi/iter_0000020/model.h5 /model /model
        run -0 h5diff host$gi/iter_0000020/model.h5 staged$gi/iter_0000020/model.h5 /optimizer /optimizer
    done
}
