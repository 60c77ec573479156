#!/usr/bin/env bats
# faults.bats - faults during training (issue 17, sections 3 and 4), each
# planted at a chosen place rather than raced:
#   - a NaN or Inf in one rank's gradient at one iteration
#     (MC_TEST_FAULT_NAN): the iteration is skipped on every rank, counted
#     in the log line, --log-json and TensorBoard; --max-nan-iters stops the
#     run; with --fp16 the loss scale follows Megatron's DynamicGradScaler
#     (backoff 0.5 after --hysteresis overflows, x2 after a clean window);
#     under TP=2 x DP=2 and DP=2 with the distributed optimizer the losses
#     are those of the same fault under one process (within 1e-6: the
#     grids sum in other orders), so no rank stepped alone;
#   - SIGTERM to one rank of four (--exit-signal-handler, always on): every
#     rank saves after the same iteration and exits 0;
#   - a rank killed entering an all-reduce, a rank stopped (SIGSTOP)
#     entering an all-reduce or a pipeline send (MC_TEST_FAULT_COMM): the
#     job exits non-zero, by mpirun's notice or the watchdog's deadline
#     (--distributed-timeout-minutes 0.5), the message naming the rank and
#     the call; `timeout` is only a safety net, and no assertion is on how
#     fast. The deadline is 30 s, not 3: on a loaded 2-core machine a
#     healthy rank was seen to reach a collective more than 3 s after the
#     others, and the watchdog then rightly fired before the planted fault.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# A one-layer GPT on mock data, 4 sequences an iteration.
gpt=(--model tiny-gpt --num-layers 1 --hidden-size 32 --seq-length 16 --micro-batch-size 1
     --global-batch-size 4 --threads 1 --lr 1e-3 --log-interval 1 --eval-iters 0 --mock-data
     --vocab-size 64 --make-vocab-size-divisible-by 16)

setup() {
    mpi_env
    [ -x "$MC_TRAIN" ] || skip "$MC_TRAIN not built"
    cd "$BATS_TEST_TMPDIR"
}

# The log lines' "number of skipped iterations" and "nan iterations" and
# the loss scale, "IT SKIPPED NAN SCALE" a line.
counts() {
    sed -n 's/.*iteration *\([0-9]*\)\/.*loss scale: \([^ ]*\) |.*skipped iterations: *\([0-9]*\) | number of nan iterations: *\([0-9]*\) .*/\1 \3 \4 \2/p' "$1"
}

# The "lm loss" of each step of a --log-json file: "STEP LOSS" lines.
steps() {
    sed -n 's/^{"step": \([0-9]*\),.*"lm loss": \([^,}]*\).*}$/\1 \2/p' "$1"
}

# close A B: the same steps, the losses within 1e-6 relative.
close() {
    paste -d' ' <(steps "$1") <(steps "$2") | awk '
        { if ($1 != $3) bad = 1; d = $2 - $4; if (d < 0) d = -d; r = d / ($4 < 0 ? -$4 : $4);
          if (r > m) m = r; if (r > 1e-6) bad = 1; n++ }
        END { printf "# %d losses, max relative difference %.3g\n", n, m; exit bad || n == 0 }' >&3
}

@test "MC_TEST_FAULT_NAN: a NaN, then an Inf, in the gradient: the iterations are skipped and counted, the run goes on" {
    MC_TEST_FAULT_NAN=0:3,0:4:inf run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --train-iters 6 \
        --log-json f.jsonl --tensorboard-dir tb
    assert_success
    echo "$stderr" >err
    run counts err
    assert_output "1 0 0 1.0
2 0 0 1.0
3 1 1 1.0
4 1 1 1.0
5 0 0 1.0
6 0 0 1.0"
    [[ "$stderr" == *"warning: iteration 3: the gradient is not finite (lm loss finite, grad norm nan); update skipped (1 in a row, --max-nan-iters 10)"* ]]
    [[ "$stderr" == *"warning: iteration 4: the gradient is not finite (lm loss finite, grad norm inf); update skipped (2 in a row, --max-nan-iters 10)"* ]]
    grep -c '"skipped-iterations": 1, "nan-iterations": 1' f.jsonl | grep -qx 2
    # the losses of iterations 1-3 are the clean run's (a loss comes before
    # its update); iteration 4's differs: the update of 3 was skipped
    "$MC_TRAIN" "${gpt[@]}" --train-iters 6 --log-json clean.jsonl 2>/dev/null
    diff <(steps clean.jsonl | head -3) <(steps f.jsonl | head -3)
    run diff <(steps clean.jsonl | sed -n 4p) <(steps f.jsonl | sed -n 4p)
    assert_failure
    # TensorBoard: the same counts, read by TensorBoard itself
    require_python_module tensorboard.backend.event_processing.event_accumulator
    run -0 "$MC_PYTHON" "$top_srcdir/tests/golden/read_tfevents.py" tb
    [[ "$output" == *$'nan-iterations\t3\t1'* ]]
    [[ "$output" == *$'nan-iterations\t4\t1'* ]]
    [[ "$output" == *$'nan-iterations\t5\t0'* ]]
    [[ "$output" == *$'skipped-iterations\t4\t1'* ]]
}

@test "MC_TEST_FAULT_NAN: --max-nan-iters stops the run at the limit with one clear error, exit 1; a malformed value is a usage error" {
    MC_TEST_FAULT_NAN=0:2,0:3,0:4,0:6 run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --train-iters 8 \
        --max-nan-iters 3 --save ck
    assert_failure 1
    assert_output ""
    [ "$(grep -c 'error' <<<"$stderr")" -eq 1 ]
    [[ "$stderr" == *"mc-train: error: iteration 4: 3 iterations in a row with NaN/Inf loss or gradients (--max-nan-iters 3); lower --lr or check the data"* ]]
    [ ! -e ck/latest_checkpointed_iteration.txt ]
    # not in a row: the count starts again after a clean iteration
    MC_TEST_FAULT_NAN=0:2,0:3,0:5,0:6 run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --train-iters 8 \
        --max-nan-iters 3
    assert_success
    # another rank's fault does not touch a one-process run
    MC_TEST_FAULT_NAN=1:2 run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --train-iters 3
    assert_success
    [[ "$stderr" != *warning* ]]
    for bad in "x" "0:0" "0:2;1:3" "0:2:nan" "-1:2" "0:2,"; do
        MC_TEST_FAULT_NAN=$bad run -2 "$MC_TRAIN" "${gpt[@]}" --train-iters 2
        assert_output "mc-train: error: MC_TEST_FAULT_NAN: '$bad' is not RANK:ITER[:inf][,RANK:ITER...]"
    done
}

@test "MC_TEST_FAULT_NAN with --fp16: the loss scale backs off as Megatron's DynamicGradScaler (hysteresis 2, window 3)" {
    # Megatron: an overflow zeroes the growth count and spends one unit of
    # hysteresis; at <= 0 the scale halves (and halves again on each
    # overflow until a clean window of 3 doubles it and restores the
    # hysteresis). Faults at 2, 3, 5 and 9.
    MC_TEST_FAULT_NAN=0:2,0:3,0:5,0:9 run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --fp16 \
        --train-iters 10 --initial-loss-scale 1024 --hysteresis 2 --loss-scale-window 3
    assert_success
    echo "$stderr" >err
    run counts err
    assert_output "1 0 0 1024.0
2 1 0 1024.0
3 1 0 512.0
4 0 0 512.0
5 1 0 256.0
6 0 0 256.0
7 0 0 256.0
8 0 0 512.0
9 1 0 512.0
10 0 0 512.0"
    # overflows are fp16's business, not NaN iterations: no limit reached
    MC_TEST_FAULT_NAN=0:2,0:3,0:4 run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --fp16 \
        --train-iters 5 --initial-loss-scale 1024 --max-nan-iters 2
    assert_success
}

@test "MC_TEST_FAULT_NAN under mpirun: TP=2 x DP=2 and DP=2 (distributed optimizer) skip on every rank, as one process does" {
    mpi_need
    "$MC_TRAIN" "${gpt[@]}" --train-iters 6 --log-json one.jsonl 2>/dev/null
    MC_TEST_FAULT_NAN=0:3 "$MC_TRAIN" "${gpt[@]}" --train-iters 6 --log-json one_f.jsonl 2>/dev/null
    # rank 3 (tensor rank 1 of data-parallel replica 1) alone is poisoned
    MC_TEST_FAULT_NAN=3:3 run --separate-stderr mpi_exec 120 4 "$MC_TRAIN" "${gpt[@]}" \
        --tensor-model-parallel-size 2 --train-iters 6 --log-json tp.jsonl
    assert_success
    echo "$stderr" >err
    run counts err
    assert_line "3 1 1 1.0"
    assert_line "4 0 0 1.0"
    close one_f.jsonl tp.jsonl
    run close one.jsonl tp.jsonl
    assert_failure
    MC_TEST_FAULT_NAN=1:3 run --separate-stderr mpi_exec 120 2 "$MC_TRAIN" "${gpt[@]}" \
        --use-distributed-optimizer --train-iters 6 --log-json dp.jsonl
    assert_success
    close one_f.jsonl dp.jsonl
    # the limit: every rank stops, one message
    MC_TEST_FAULT_NAN=2:2,2:3 run --separate-stderr mpi_exec 120 4 "$MC_TRAIN" "${gpt[@]}" \
        --tensor-model-parallel-size 2 --train-iters 6 --max-nan-iters 2
    assert_failure
    [ "$(grep -c 'mc-train: error' <<<"$stderr")" -eq 1 ]
    [[ "$stderr" == *"mc-train: error: iteration 3: 2 iterations in a row with NaN/Inf loss or gradients (--max-nan-iters 2)"* ]]
}

@test "SIGTERM to one rank of TP=2 x DP=2: every rank saves after the same iteration and exits 0" {
    mpi_need
    mkdir pids
    # each rank writes its pid, with SIGTERM's default disposition whatever
    # the test's parent set (mc keeps a signal ignored on entry ignored)
    mpi_exec 120 4 env --default-signal=TERM,INT bash -c \
        'echo $$ >pids/$OMPI_COMM_WORLD_RANK; exec "$@"' rank "$MC_TRAIN" "${gpt[@]}" \
        --tensor-model-parallel-size 2 --train-iters 100000 --save ck >out 2>err &
    local job=$!
    # the signal goes to rank 2 once iteration 2 is logged: whenever it
    # lands after that, the assertions are the same
    for _ in $(seq 1200); do
        grep -q '\] iteration        2/' err 2>/dev/null && [ -s pids/2 ] && break
        sleep 0.1
    done
    grep -q '\] iteration        2/' err
    kill -TERM "$(cat pids/2)"
    local rc=0
    wait "$job" || rc=$?
    [ "$rc" = 0 ]
    [ "$(grep -c 'exiting after iteration .* on a signal' err)" = 1 ]
    local it dir
    it=$(sed -n 's/.*exiting after iteration \([0-9]*\) on a signal.*/\1/p' err)
    dir=ck/iter_$(printf %07d "$it")
    [ "$(cat out)" = "$dir" ]
    [ "$(cat ck/latest_checkpointed_iteration.txt)" = "$it" ]
    # the last iteration logged is the one saved, and saved once
    [ "$(grep -o '\] iteration *[0-9]*/' err | tail -1 | grep -o '[0-9]*')" = "$it" ]
    [ "$(grep -c 'successfully saved checkpoint' err)" = 1 ]
    # and the checkpoint verifies and resumes under the same grid
    run --separate-stderr mpi_exec 120 4 "$MC_TRAIN" "${gpt[@]}" --tensor-model-parallel-size 2 \
        --train-iters 100000 --load ck --exit-interval $((it + 1))
    assert_success
    [[ "$stderr" == *"loaded checkpoint $dir at iteration $it"* ]]
}

@test "a rank killed entering an all-reduce: mpirun ends the job, naming the rank" {
    mpi_need
    MC_TEST_FAULT_COMM=2:all-reduce:5:KILL run mpi_exec 120 4 "$MC_TRAIN" "${gpt[@]}" \
        --tensor-model-parallel-size 2 --train-iters 1000 --distributed-timeout-minutes 0.5
    assert_failure
    refute_output --partial "timeout: sending signal"
    assert_output --partial "mc-train: MC_TEST_FAULT_COMM: rank 2 raises SIGKILL entering all-reduce 5"
    assert_output --regexp "process rank 2 with PID [0-9]+ on node .* exited on signal 9"
}

@test "a rank stopped (SIGSTOP) entering an all-reduce: the others' watchdog names itself and the collective, the job exits non-zero" {
    mpi_need
    MC_TEST_FAULT_COMM=1:all-reduce:5:STOP run mpi_exec 120 4 "$MC_TRAIN" "${gpt[@]}" \
        --tensor-model-parallel-size 2 --train-iters 1000 --distributed-timeout-minutes 0.5
    assert_failure
    refute_output --partial "timeout: sending signal"
    assert_output --partial "rank 1 raises SIGSTOP entering all-reduce 5"
    assert_output --regexp "mc-train: error: rank [023]: all-reduce on the [a-z-]+ group did not complete within 0.5 minutes; a rank may have died"
}

@test "a rank stopped (SIGSTOP) entering a pipeline send: the other rank names it and the group, the job exits non-zero" {
    mpi_need
    MC_TEST_FAULT_COMM=0:send:3:STOP run mpi_exec 120 2 "$MC_TRAIN" "${gpt[@]}" --num-layers 2 \
        --pipeline-model-parallel-size 2 --train-iters 1000 --distributed-timeout-minutes 0.5
    assert_failure
    refute_output --partial "timeout: sending signal"
    assert_output --partial "rank 0 raises SIGSTOP entering send 3"
    # rank 1 waits on a receive from rank 0 or, when the stop catches it
    # sending a gradient back, on that send: which depends on the moment
    assert_output --regexp "mc-train: error: rank 1: (receive from|send to) rank 0 on the pipeline-parallel group did not complete within 0.5 minutes; a rank may have died"
    # a malformed value: a usage error on every rank, one line
    MC_TEST_FAULT_COMM=0:send:3:HUP run mpi_exec 120 2 "$MC_TRAIN" "${gpt[@]}" --train-iters 2
    assert_failure
    assert_output --partial "MC_TEST_FAULT_COMM: '0:send:3:HUP' is not RANK:OP:N:KILL or RANK:OP:N:STOP"
}
