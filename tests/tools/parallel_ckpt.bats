#!/usr/bin/env bats
# Checkpoints written in parallel by a grid of ranks (issue 4, section 5):
# the ranks of TP=2 x DP=2 and TP=4 x DP=3 grids write their slices of known
# global tensors into one model.h5 through parallel HDF5; read back alone
# it holds the global tensors bit for bit (and the same data as the file one
# process writes: h5diff), and read under another grid each rank gets its
# slices. A failure on any one rank (a bad block, an abort, a missing slice,
# replicas that differ, overlapping blocks, differing attributes) fails
# every rank with the same message and leaves no checkpoint: the latest
# pointer still names the previous one and no temporary is left.
# The program is tests/parallel/test_ckpt_par.c; its modes are listed there.

bats_require_minimum_version 1.5.0
load common
load mpi_common

TEST_CKPT_PAR="$top_builddir/tests/parallel/test_ckpt_par"

setup() {
    mpi_setup
    [ -x "$TEST_CKPT_PAR" ] || skip "$TEST_CKPT_PAR not built (make check builds it)"
    cd "$BATS_TEST_TMPDIR"
}

# mpi N ARGS...: test_ckpt_par on N ranks (`timeout` is a safety net only).
mpi() {
    local n=$1
    shift
    run mpi_exec 120 "$n" "$TEST_CKPT_PAR" "$@"
    echo "# $n ranks, $*: status $status" >&3
}

@test "one process: the writer on mc_grid_single writes without initializing MPI" {
    run "$TEST_CKPT_PAR" single one 5
    assert_success
    assert_output --regexp '^ok [0-9]+ checks on 1 ranks$'
    [ "$(cat one/latest_checkpointed_iteration.txt)" = 5 ]
}

@test "TP=2 x DP=2 write one file: the global tensors bit for bit, the same data as one process writes" {
    mpi 4 write par 2 2 5
    assert_success
    assert_output --partial "checks on 4 ranks"
    refute_output --partial FAILED
    [ "$(cat par/latest_checkpointed_iteration.txt)" = 5 ]
    [ "$(ls -A par)" = "$(printf 'iter_0000005\nlatest_checkpointed_iteration.txt')" ]
    run "$TEST_CKPT_PAR" single one 5
    assert_success
    # Datasets, values and attributes: no difference from the serial file.
    run h5diff one/iter_0000005/model.h5 par/iter_0000005/model.h5
    assert_success
    # Chunked, Fletcher-32 checksummed, as a serial checkpoint.
    run h5dump -p -H -d /model/col.weight par/iter_0000005/model.h5
    assert_success
    assert_output --partial FLETCHER32
}

@test "TP=2 x DP=2 checkpoint read under TP=4, TP=1 x DP=3 and TP=2 x DP=3: each rank its slices" {
    mpi 4 write ck 2 2 5
    assert_success
    mpi 4 read ck 4 1
    assert_success
    assert_output --partial "checks on 4 ranks"
    mpi 3 read ck 1 3
    assert_success
    assert_output --partial "checks on 3 ranks"
    mpi 6 read ck 2 3
    assert_success
    assert_output --partial "checks on 6 ranks"
    refute_output --partial FAILED
}

@test "TP=4 x DP=3 with zstd (collective filtered writes), read under TP=2 and TP=1 x DP=2" {
    mpi 12 write z 4 3 7 zstd
    assert_success
    assert_output --partial "checks on 12 ranks"
    run h5dump -p -H -d /model/row.weight z/iter_0000007/model.h5
    assert_output --partial "FILTER_ID 32015"
    mpi 2 read z 2 1
    assert_success
    mpi 2 read z 1 2
    assert_success
    refute_output --partial FAILED
}

# fail_case KIND RANK LINE-REGEX: rank RANK misbehaves while saving iteration 2
# after a good iteration 1; the program checks that every other rank got
# the same error, the pointer still says 1 and nothing else is left.
fail_case() {
    mpi 4 fail f 2 2 2 "$2" "$1"
    assert_success
    assert_output --partial "checks on 4 ranks"
    # The line rank 0 (or 1) prints; grep anchors per line.
    grep -qE "$3" <<<"$output" || { echo "no line matches: $3" >&2; false; }
    refute_output --partial FAILED
    [ "$(cat f/latest_checkpointed_iteration.txt)" = 1 ]
    [ "$(ls -A f)" = "$(printf 'iter_0000001\nlatest_checkpointed_iteration.txt')" ]
}

@test "a bad block on one rank: every rank fails with that rank's error, no checkpoint" {
    fail_case block 1 '^error: rank 1: .*/iter_0000002/model\.h5: model/fc1\.weight: block rows \[30, 36\) x cols \[0, 10\) is outside the tensor$'
}

@test "one rank aborts: the others' commit fails, no checkpoint" {
    fail_case abort 2 '^error: rank 2: .*/iter_0000002: checkpoint abandoned after an error on that rank$'
}

@test "a slice nobody wrote: a partial tensor is refused on every rank" {
    fail_case partial 1 'model/row\.weight: 120 of 240 elements written by the ranks together; not saving a partial tensor$'
}

@test "replicas that differ are refused, naming both ranks" {
    fail_case replica 3 'model/bias: ranks 0 and 3 hold the same block \(rows 0\+10, cols 0\+1\) with different values$'
}

@test "overlapping blocks of two ranks are refused" {
    fail_case overlap 0 'model/col\.weight: the blocks of rank 0 \(rows 1\+12, cols 0\+10\) and rank 1 \(rows 12\+12, cols 0\+10\) overlap$'
}

@test "root attributes that differ between ranks are refused" {
    fail_case attr 1 "rank 1's root attributes or byte datasets differ from rank 0's"
}
