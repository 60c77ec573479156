#!/usr/bin/env bats
# tensorboard.bats - event files written by libmc (mc_metrics, driven by the
# mkevents helper) are read by TensorBoard's own EventAccumulator with the
# tags, steps and values given (values equal to the given doubles rounded to
# float32), every record passes TensorBoard's CRC checks and is the exact
# protobuf encoding; the JSON-lines log holds the exact doubles.
#
# Needs tensorboard in $MC_PYTHON; those tests skip, saying why, without it.

bats_require_minimum_version 1.5.0

setup() {
    load common
    MKEVENTS=$top_builddir/tests/unit/mkevents
    READ=$top_srcdir/tests/golden/read_tfevents.py
    cd "$BATS_TEST_TMPDIR"
}

require_tensorboard() {
    require_python_module tensorboard.backend.event_processing.event_accumulator
}

# A script for mkevents: two logged iterations with Megatron's tags, an
# evaluation, and values that float32 must round (0.0003, 1e-8, 123456789).
training_script() {
    printf 'S\t10\tlm loss\t5.43\n'
    printf 'S\t10\tlearning-rate\t0.0003\n'
    printf 'S\t10\tgrad-norm\t1e-8\n'
    printf 'S\t10\titeration-time\t0.125\n'
    printf 'S\t10\tthroughput\t123456789\n'
    printf 'N\t10\t80\n'
    printf 'F\n'
    printf 'S\t20\tlm loss\t4.25\n'
    printf 'S\t20\tlearning-rate\t0.00015\n'
    printf 'S\t20\tgrad-norm\t-0\n'
    printf 'S\t20\tlm loss validation\t4.5\n'
    printf 'S\t20\tlm loss validation ppl\t90.017131300521811\n'
    printf 'N\t20\t160\n'
    printf 'F\n'
}

expected_scalars() {
    printf 'lm loss\t10\t5.43\nlearning-rate\t10\t0.0003\ngrad-norm\t10\t1e-8\n'
    printf 'iteration-time\t10\t0.125\nthroughput\t10\t123456789\n'
    printf 'lm loss vs samples\t80\t5.43\nlearning-rate vs samples\t80\t0.0003\n'
    printf 'grad-norm vs samples\t80\t1e-8\n'
    printf 'lm loss\t20\t4.25\nlearning-rate\t20\t0.00015\ngrad-norm\t20\t0\n'
    printf 'lm loss validation\t20\t4.5\nlm loss validation ppl\t20\t90.017131300521811\n'
    printf 'lm loss vs samples\t160\t4.25\nlearning-rate vs samples\t160\t0.00015\n'
    printf 'grad-norm vs samples\t160\t0\nlm loss validation vs samples\t160\t4.5\n'
    printf 'lm loss validation ppl vs samples\t160\t90.017131300521811\n'
}

@test "EventAccumulator reads the tags, steps and values written" {
    require_tensorboard
    run "$MKEVENTS" tb run.jsonl < <(training_script)
    assert_success
    assert_output --regexp "^tb/events\.out\.tfevents\.[0-9]{10}\.$(hostname)\.[0-9]+\.0$"
    expected_scalars > want.tsv
    run "$MC_PYTHON" "$READ" --expect want.tsv tb
    assert_success
    assert_output --partial "18 scalars read, 18 expected, 0 problems"
}

@test "the check fails on a wrong value, a missing tag, and a corrupt record" {
    require_tensorboard
    "$MKEVENTS" tb - < <(training_script) >/dev/null
    expected_scalars | sed 's/^lm loss\t20\t4.25$/lm loss\t20\t4.26/' > wrong.tsv
    run "$MC_PYTHON" "$READ" --expect wrong.tsv tb
    assert_failure 1
    assert_output --partial "'lm loss' at step 20: 4.25, expected 4.26"
    { expected_scalars; printf 'mfu\t10\t0.5\n'; } > more.tsv
    run "$MC_PYTHON" "$READ" --expect more.tsv tb
    assert_failure 1
    assert_output --partial "missing: 'mfu' at step 10"
    # Flip one byte of the last record's payload: its CRC no longer matches.
    f=$(echo tb/events.out.tfevents.*)
    size=$(stat -c %s "$f")
    printf '\x7f' | dd of="$f" bs=1 seek=$((size - 6)) conv=notrunc status=none
    expected_scalars > want.tsv
    run "$MC_PYTHON" "$READ" --expect want.tsv tb
    assert_failure 1
    assert_output --partial "bad CRC or torn"
}

@test "what a flush wrote is readable although the writer never closed (killed run)" {
    require_tensorboard
    run "$MKEVENTS" tb - < <(printf 'S\t1\tlm loss\t7.5\nF\nS\t2\tlm loss\t7\nX\n')
    assert_success
    printf 'lm loss\t1\t7.5\n' > want.tsv
    run "$MC_PYTHON" "$READ" --expect want.tsv tb
    assert_success
}

@test "a resumed run adds a second event file; TensorBoard keeps the restart's repeated steps" {
    require_tensorboard
    # First run logs steps 1..4; it is resumed from a checkpoint at step 2,
    # so steps 3 and 4 come again with new values.
    "$MKEVENTS" tb run.jsonl < <(for s in 1 2 3 4; do printf 'S\t%d\tlm loss\t%d.5\nF\n' $s $((10 - s)); done) >/dev/null
    sleep 1 # TensorBoard reads files in name (= start time) order, as after a real restart
    "$MKEVENTS" tb run.jsonl < <(for s in 3 4 5; do printf 'S\t%d\tlm loss\t%d.25\nF\n' $s $((10 - s)); done) >/dev/null
    run bash -c 'ls tb | wc -l'
    assert_output 2
    printf 'lm loss\t%d\t%s\n' 1 9.5 2 8.5 3 7.25 4 6.25 5 5.25 > want.tsv
    run "$MC_PYTHON" "$READ" --expect want.tsv tb
    assert_success
    # The JSON log was appended to: 4 + 3 lines.
    run wc -l < run.jsonl
    assert_output 7
}

@test "JSON lines hold every scalar of a step, exact doubles" {
    require_python_module json
    run "$MKEVENTS" - run.jsonl < <(training_script)
    assert_success
    [ "$output" = "-" ]
    run cat run.jsonl
    assert_line --index 0 '{"step": 10, "consumed-samples": 80, "lm loss": 5.43, "learning-rate": 0.0003, "grad-norm": 1e-08, "iteration-time": 0.125, "throughput": 123456789}'
    # Python's json reads each value back as the very double given.
    run "$MC_PYTHON" -c '
import json, sys
rows = [json.loads(l) for l in open("run.jsonl")]
want = [{"step": 10, "consumed-samples": 80, "lm loss": 5.43, "learning-rate": 0.0003,
         "grad-norm": 1e-8, "iteration-time": 0.125, "throughput": 123456789.0},
        {"step": 20, "consumed-samples": 160, "lm loss": 4.25, "learning-rate": 0.00015,
         "grad-norm": -0.0, "lm loss validation": 4.5,
         "lm loss validation ppl": 90.017131300521811}]
assert rows == want, rows
assert list(rows[1]) == list(want[1]), "key order"
print("ok")'
    assert_success
    assert_output ok
}

@test "read_tfevents.py DIR prints tag, step, value lines" {
    require_tensorboard
    "$MKEVENTS" tb - < <(printf 'S\t3\tlm loss\t2.5\nS\t3\tlearning-rate\t0.001\nS\t4\tlm loss\t2\n') >/dev/null
    run "$MC_PYTHON" "$READ" tb
    assert_success
    assert_output "$(printf 'learning-rate\t3\t0.0010000000474974513\nlm loss\t3\t2.5\nlm loss\t4\t2.0')"
}

@test "errors name the directory or file" {
    touch plain
    run "$MKEVENTS" plain/tb - < <(:)
    assert_failure 1
    assert_output "mkevents: error: plain/tb: cannot create TensorBoard directory: Not a directory"
    run "$MKEVENTS" - nodir/run.jsonl < <(:)
    assert_failure 1
    assert_output "mkevents: error: nodir/run.jsonl: directory 'nodir' does not exist"
    run "$MKEVENTS" - run.jsonl < <(printf 'S\t1\tlm loss\t1\nS\t1\tlm loss\t2\n')
    assert_failure 1
    assert_line --index 1 "mkevents: error: metrics: 'lm loss' given twice for step 1"
}
