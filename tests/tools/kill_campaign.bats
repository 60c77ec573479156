#!/usr/bin/env bats
# kill_campaign.bats - the short version of the kill -9 campaign (issue 17,
# section 3; tests/reliability/kill_campaign.sh, whose full run of 50 kills
# is in bench/RESULTS.md, RELIABILITY): mc-train saving every iteration is
# SIGKILLed at 5 moments drawn from a fixed seed, 3 times as one process and
# 2 times as TP=2 x DP=2 under mpirun (one rank or every rank). After each
# kill latest_checkpointed_iteration.txt names a checkpoint whose checksums
# verify and a resume from it gives the uninterrupted run's losses bit for
# bit. The assertions are the same wherever a kill lands (mid-save, between
# saves, before the first save); every wait in the script is bounded.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
CAMPAIGN="$top_srcdir/tests/reliability/kill_campaign.sh"

setup() {
    [ -x "$MC_TRAIN" ] || skip "$MC_TRAIN not built"
    cd "$BATS_TEST_TMPDIR"
}

@test "kill -9 of a one-process run, 3 times: latest always names a complete checkpoint that resumes exactly" {
    run env MC_TRAIN="$MC_TRAIN" timeout -k 5 500 "$CAMPAIGN" -s 1 -n 3 -m 0 -d camp
    echo "$output" >&3
    assert_success
    assert_line --regexp "^survived 3 of 3 kills \(0 corrupt; [0-9]+ mid-save"
}

@test "kill -9 of one rank or every rank of TP=2 x DP=2, twice: the same" {
    mpi_setup
    run env MC_TRAIN="$MC_TRAIN" MPIRUN="$MPIRUN" timeout -k 5 500 "$CAMPAIGN" -s 2 -n 0 -m 2 -d camp
    echo "$output" >&3
    assert_success
    assert_line --regexp "^survived 2 of 2 kills \(0 corrupt; [0-9]+ mid-save"
}

# fake WHAT: an mc-train whose resumes (--load without --save: the
# script's checks) see WHAT: a damaged file, or another seed. Every other
# run is the real one, exec'd (so the kills reach mc-train itself).
fake() {
    cat >fake <<FAKE
#!/usr/bin/env bash
case " \$* " in
*" --save "*) ;;
*" --load "*)
    if [ "$1" = damage ]; then
        # every model.h5 one byte off; with none yet, latest names a ghost
        [ -e ck_single/latest_checkpointed_iteration.txt ] ||
            echo 7 >ck_single/latest_checkpointed_iteration.txt
        for f in ck_single/iter_*/model.h5; do
            [ -f "\$f" ] && printf X | dd of="\$f" bs=1 seek=5000 conv=notrunc 2>/dev/null
        done
    else
        set -- "\$@" --seed 99
    fi ;;
esac
exec "$MC_TRAIN" "\$@"
FAKE
    chmod +x fake
}

@test "the campaign's checks can fail: a damaged checkpoint, or a resume with other losses, is counted corrupt" {
    fake damage
    run env MC_TRAIN="$PWD/fake" timeout -k 5 500 "$CAMPAIGN" -s 1 -n 1 -m 0 -d camp
    assert_failure 1
    assert_line --regexp "CORRUPT: the resume failed: mc-train: error: ck_single/iter_[0-9]+"
    assert_line --regexp "^survived 0 of 1 kills \\(1 corrupt"
    rm -rf camp
    fake seed
    run env MC_TRAIN="$PWD/fake" timeout -k 5 500 "$CAMPAIGN" -s 1 -n 1 -m 0 -d camp
    assert_failure 1
    assert_line --regexp "CORRUPT: losses after the resume differ from the uninterrupted run"
    assert_line --regexp "^survived 0 of 1 kills \\(1 corrupt"
}

# --async-save: a one-layer GPT on mock data (the campaign's model).
small=(--model tiny-gpt --num-layers 1 --hidden-size 32 --seq-length 16 --micro-batch-size 1
       --global-batch-size 4 --threads 1 --lr 1e-3 --lr-warmup-iters 5 --log-interval 1
       --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16)

# verifies DIR: the manifest's checksums hold (when xxh128sum is installed;
# the resumes below verify them through mc anyway).
verifies() {
    if command -v xxh128sum >/dev/null; then
        (cd "$1" && xxh128sum -c --quiet checksums.xxh128)
    fi
}

# The "step loss" pairs of a --log-json file.
steps() {
    sed -n 's/^{"step": \([0-9]*\),.*"lm loss": \([^,}]*\).*}$/\1 \2/p' "$1"
}

# same_h5 A B: every dataset's bytes and the counters of two model.h5 files
# are equal (48 tensors: the small model's parameters and moments).
same_h5() {
    "$MC_PYTHON" - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert len(names) == 48, len(names)
bad = [n for n in names if not np.array_equal(a[n][()].view(np.uint8), b[n][()].view(np.uint8))]
for k in ("iteration", "consumed_samples", "scheduler_samples", "optimizer_steps", "train_state"):
    if str(a.attrs[k]) != str(b.attrs[k]): bad.append(k)
print(len(names), "tensors;", bad)
sys.exit(1 if bad else 0)
PY
}

@test "--async-save: written while the next iteration runs; a resume is bit-identical (losses and weights)" {
    require_python_module h5py
    "$MC_TRAIN" "${small[@]}" --train-iters 8 --save full --log-json full.jsonl >/dev/null 2>&1
    run --separate-stderr "$MC_TRAIN" "${small[@]}" --train-iters 8 --save a --save-interval 1 \
        --async-save --exit-interval 4 --log-json a.jsonl
    assert_success
    assert_output "a/iter_0000004"
    # the success line of iteration 2's save comes after iteration 3's log
    # line: the write was waited for only at the next save
    echo "$stderr" | grep -E '\] iteration|successfully saved' >order
    [ "$(grep -c 'asynchronous' order)" = 4 ]
    run grep -n . order
    assert_line --regexp "^4: .*\] iteration        3/"
    assert_line --regexp "^5: *successfully saved checkpoint from iteration       2 to a/iter_0000002 \[ t [0-9.]+s, asynchronous \]"
    [ "$(cat a/latest_checkpointed_iteration.txt)" = 4 ]
    verifies a/iter_0000004
    run --separate-stderr "$MC_TRAIN" "${small[@]}" --train-iters 8 --save a --load a --save-interval 1 \
        --async-save --log-json a.jsonl
    assert_success
    assert_output "a/iter_0000008"
    diff <(steps full.jsonl) <(steps a.jsonl)
    same_h5 full/iter_0000008/model.h5 a/iter_0000008/model.h5
}


@test "--async-save under mpirun, TP=2 x DP=2, every iteration: stopped at 4 and resumed to 8, the losses and model.h5 equal a synchronous run's bit for bit" {
    mpi_setup
    require_python_module h5py
    tp=(--tensor-model-parallel-size 2)
    run --separate-stderr mpi_exec 300 4 "$MC_TRAIN" "${tp[@]}" "${small[@]}" --train-iters 8 --save s \
        --save-interval 1 --log-json s.jsonl
    assert_success
    run --separate-stderr mpi_exec 300 4 "$MC_TRAIN" "${tp[@]}" "${small[@]}" --train-iters 8 --save a \
        --save-interval 1 --async-save --exit-interval 4 --log-json a.jsonl
    assert_success
    assert_output "a/iter_0000004"
    # four writes, each reported by rank 0 once done (at the next save or the end)
    [ "$(echo "$stderr" | grep -c 'successfully saved checkpoint from iteration .* asynchronous \]')" = 4 ]
    [ "$(cat a/latest_checkpointed_iteration.txt)" = 4 ]
    verifies a/iter_0000004
    same_h5 s/iter_0000004/model.h5 a/iter_0000004/model.h5
    run --separate-stderr mpi_exec 300 4 "$MC_TRAIN" "${tp[@]}" "${small[@]}" --train-iters 8 --save a \
        --load a --save-interval 1 --async-save --log-json a.jsonl
    assert_success
    assert_output "a/iter_0000008"
    [[ "$stderr" == *"loaded checkpoint a/iter_0000004 at iteration 4"* ]]
    diff <(steps s.jsonl) <(steps a.jsonl)
    [ "$(steps a.jsonl | wc -l)" = 8 ]
    verifies a/iter_0000008
    same_h5 s/iter_0000008/model.h5 a/iter_0000008/model.h5
}

# stopped_at N: mc-train --async-save saving every iteration, stopped by
# itself at its Nth temporary (MC_TEST_STOP_AT_TEMP; 3 a save: the
# directory, the manifest, the pointer), then SIGKILLed. Sets nothing; the
# checkpoint directory is ck.
stopped_at() {
    MC_TEST_STOP_AT_TEMP=$1 "$MC_TRAIN" "${small[@]}" --train-iters 100 --save ck \
        --save-interval 1 --async-save >/dev/null 2>err &
    local pid=$! i
    for i in $(seq 1200); do
        [[ "$(ps -o stat= -p "$pid")" == T* ]] && break
        sleep 0.05
    done
    [[ "$(ps -o stat= -p "$pid")" == T* ]]
    kill -KILL "$pid"
    wait "$pid" || true
}

@test "--async-save killed inside its third write (before the manifest, before the pointer): latest stays 2, verifies and resumes exactly" {
    "$MC_TRAIN" "${small[@]}" --train-iters 100 --exit-interval 6 --log-json ref.jsonl 2>/dev/null
    for n in 8 9; do
        rm -rf ck
        stopped_at "$n"
        # 8: iteration 3's model.h5 written in its hidden directory;
        # 9: the directory renamed into place, the pointer not yet moved
        if [ "$n" = 8 ]; then
            ls -d ck/.iter_0000003.tmp.* && [ ! -e ck/iter_0000003 ]
        else
            [ -f ck/iter_0000003/model.h5 ]
        fi
        [ "$(cat ck/latest_checkpointed_iteration.txt)" = 2 ]
        verifies ck/iter_0000002
        rm -f v.jsonl
        run --separate-stderr "$MC_TRAIN" "${small[@]}" --train-iters 100 --load ck --exit-interval 6 \
            --log-json v.jsonl
        assert_success
        [[ "$stderr" == *"loaded checkpoint ck/iter_0000002 at iteration 2"* ]]
        diff <(steps v.jsonl) <(steps ref.jsonl | awk '$1 > 2')
    done
}

@test "kill -9 of a one-process run with --async-save, 3 times at random moments: the same guarantees" {
    run env MC_TRAIN="$MC_TRAIN" timeout -k 5 500 "$CAMPAIGN" -s 3 -n 3 -m 0 -a -d camp
    echo "$output" >&3
    assert_success
    assert_line --regexp "^survived 3 of 3 kills \(--async-save\) \(0 corrupt"
}

@test "kill -9 of one rank or every rank of TP=2 x DP=2 with --async-save, twice: the same guarantees" {
    mpi_setup
    run env MC_TRAIN="$MC_TRAIN" MPIRUN="$MPIRUN" timeout -k 5 500 "$CAMPAIGN" -s 4 -n 0 -m 2 -a -d camp
    echo "$output" >&3
    assert_success
    assert_line --regexp "^survived 2 of 2 kills \(--async-save\) \(0 corrupt"
}
