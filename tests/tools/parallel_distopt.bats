#!/usr/bin/env bats
# The distributed optimizer under mpirun (issue 4, section 4): on synthetic
# flat buffers (spans with and without weight decay, a gap, sizes 1001, 1003
# and 2 that do not divide by DP), several AdamW steps of the distributed
# optimizer (with and without --overlap-param-gather) equal the plain
# optimizer on the grid and a one-process optimizer fed the gradients summed
# in data-parallel rank order: parameters and moments bit for bit, the
# gradient norm and clip factor within 1e-12 relative (their double partial
# sums are added in another order); clipping, the loss scale, a NaN on one
# rank that every rank skips, the moments gathered and loaded across
# optimizer kinds, guard elements and gaps never touched, and the error
# paths; and global moments saved under one DP load under another DP,
# with or without the distributed optimizer, continuing the one-process
# run bit for bit. The program is tests/parallel/test_distopt.c; it says more.

bats_require_minimum_version 1.5.0
load common
load mpi_common

TEST_DISTOPT="$top_builddir/tests/parallel/test_distopt"

setup() {
    [ -x "$TEST_DISTOPT" ] || skip "$TEST_DISTOPT not built (make check builds it)"
    mpi_env
    cd "$BATS_TEST_TMPDIR"
}

# mpi N TP: test_distopt on N ranks, N / TP data-parallel ones; `timeout`
# is only a safety net against a hang.
mpi() {
    local n=$1
    shift
    mpi_need
    run mpi_exec 120 "$n" "$TEST_DISTOPT" "$@"
    echo "$output" | grep '^#' >&3 || true
}

@test "one process: DP=1 distributed equals the plain optimizer; error messages" {
    run "$TEST_DISTOPT" single
    assert_success
    assert_output --regexp 'ok [0-9]+ checks on 1 rank$'
}

@test "DP=2 equals the single-rank optimizer on the summed gradients, bit for bit" {
    mpi 2 grid 1
    assert_success
    assert_output --partial "checks on 2 ranks"
    refute_output --partial FAILED
}

@test "DP=3 (odd: every size leaves a tail) equals the single-rank optimizer" {
    mpi 3 grid 1
    assert_success
    assert_output --partial "checks on 3 ranks"
    refute_output --partial FAILED
}

@test "TP=2 x DP=2: the norm counts tensor-parallel replicas once, as the plain optimizer does" {
    mpi 4 grid 2
    assert_success
    assert_output --partial "checks on 4 ranks"
    refute_output --partial FAILED
}

@test "TP=2 x DP=3" {
    mpi 6 grid 2
    assert_success
    assert_output --partial "checks on 6 ranks"
    refute_output --partial FAILED
}

# save N KIND then load under each of "N KIND" pairs; every run checks
# itself against the one-process run of the same steps.
ckpt() {
    mpi "$1" save ck "$2"
    assert_success
    assert_output --partial "checks on $1 rank"
    shift 2
    while [ $# -gt 0 ]; do
        mpi "$1" load ck "$2"
        assert_success
        assert_output --partial "checks on $1 rank"
        refute_output --partial FAILED
        shift 2
    done
}

@test "moments saved under DP=2 (distributed) load under DP=3 and DP=1 (distributed and plain)" {
    ckpt 2 dist 3 dist 3 plain 1 plain 1 dist 2 plain
}

@test "moments saved under DP=3 without the distributed optimizer load under DP=2 distributed" {
    ckpt 3 plain 2 dist
}

@test "a missing checkpoint file is reported" {
    mpi 2 load missing.ck dist
    assert_failure
    assert_output --partial "cannot read missing.ck"
}

@test "usage error" {
    run "$TEST_DISTOPT" nonsense
    assert_failure 2
    assert_output --partial "usage: test_distopt"
}
