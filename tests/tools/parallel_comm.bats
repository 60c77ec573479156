#!/usr/bin/env bats
# The MPI grid under mpirun (issue 4, sections 1 and 7): coordinates and the
# groups of Megatron's parallel_state for several grids, every collective
# against a locally computed reference (bit for bit), the errors every rank
# meets together (world not divisible, configurations that differ: one
# message, every rank exits 1), and the watchdog: a rank that hangs, exits,
# finalizes early, is killed or fails alone ends the whole job within
# --distributed-timeout-minutes (0.05 minutes = 3 s here).
# The program is tests/parallel/test_comm.c; its modes are listed there.

bats_require_minimum_version 1.5.0
load common
load mpi_common

TEST_COMM="$top_builddir/tests/parallel/test_comm"

setup() {
    mpi_setup
    [ -x "$TEST_COMM" ] || skip "$TEST_COMM not built (make check builds it)"
    cd "$BATS_TEST_TMPDIR"
}

# mpi N ARGS...: test_comm on N ranks; `timeout` is only a safety net (a hang
# is a failure of the test, not a wait), and the wall time lands in $elapsed
# (seconds, with milliseconds).
mpi() {
    local n=$1
    shift
    local t0 t1
    t0=$(date +%s%N)
    run mpi_exec 60 "$n" "$TEST_COMM" "$@"
    t1=$(date +%s%N)
    elapsed=$(( (t1 - t0) / 1000000 ))
    elapsed="$((elapsed / 1000)).$(printf %03d $((elapsed % 1000)))"
    echo "# $n ranks, $*: status $status in ${elapsed}s" >&3
}

# Seconds as milliseconds, for comparisons.
ms() { echo $(( ${1%.*} * 1000 + 10#${1#*.} )); }

# The job ended by itself, not by mpi_exec's safety-net timeout (which says
# so on stderr): what "at once" and "before the deadline" mean here, with no
# bound on the wall time that a slow machine could break.
ended_by_itself() { ! grep -q "timeout: sending signal" <<<"$output"; }

# Every rank's error line, counted: the agreed errors print once.
count_errors() { grep -c "^test_comm: error:" <<<"$output" || true; }

@test "one process without MPI: size-1 groups are no-ops, no MPI_Init; the timeout is checked" {
    run "$TEST_COMM" single
    assert_success
    assert_output --regexp '^ok [0-9]+ checks on 1 rank$'
}

@test "grid TP=2 on 2 ranks: coordinates, groups, collectives" {
    mpi 2 grid 2 1
    assert_success
    assert_output --partial "checks on 2 ranks"
    refute_output --partial FAILED
}

@test "grid PP=2 on 2 ranks: coordinates, groups, collectives, point to point" {
    mpi 2 grid 1 2
    assert_success
    assert_output --partial "checks on 2 ranks"
    refute_output --partial FAILED
}

@test "grid DP=2 on 2 ranks" {
    mpi 2 grid 1 1
    assert_success
    assert_output --partial "checks on 2 ranks"
    refute_output --partial FAILED
}

@test "grid TP=2 x PP=2 x DP=2 on 8 ranks" {
    mpi 8 grid 2 2
    assert_success
    assert_output --partial "checks on 8 ranks"
    refute_output --partial FAILED
}

@test "grid PP=4 x DP=2 on 8 ranks (middle stages outside the embedding group)" {
    mpi 8 grid 1 4
    assert_success
    assert_output --partial "checks on 8 ranks"
    refute_output --partial FAILED
}

@test "grid with expert parallelism: EP=2 x DP=2 on 4 ranks, TP=2 x EP=2 x PP=2 and EP=2 x CP=2 on 8 ranks" {
    mpi 4 grid 1 1 2
    assert_success
    assert_output --partial "checks on 4 ranks"
    refute_output --partial FAILED
    mpi 8 grid 2 2 2
    assert_success
    assert_output --partial "checks on 8 ranks"
    refute_output --partial FAILED
    # EP=2 x CP=2 x DP=2: the expert-data-parallel group spans dp / ep x cp
    mpi 8 grid 1 1 2 2
    assert_success
    assert_output --partial "checks on 8 ranks"
    refute_output --partial FAILED
}

@test "grid TP=4 on 4 ranks (its expert tensor-parallel groups and replicas at ETP 1, 2, 4; 3 refused); DP=3 on 3 ranks (odd)" {
    mpi 4 grid 4 1
    assert_success
    assert_output --partial "checks on 4 ranks"
    mpi 3 grid 1 1
    assert_success
    assert_output --partial "checks on 3 ranks"
    refute_output --partial FAILED
}

@test "a world that does not divide into the grid: one error naming the numbers, every rank exits 1" {
    mpi 4 world 3 1
    assert_failure 1
    assert_output --partial "test_comm: error: grid: 4 ranks do not divide into tensor-parallel 3 x pipeline-parallel 1 x context-parallel 1 = 3 ranks per data-parallel replica"
    [ "$(count_errors)" -eq 1 ]
}

@test "ranks with different configurations: one error naming them, every rank exits 1" {
    mpi 4 config 2 3
    assert_failure 1
    assert_output --partial "test_comm: error: the ranks disagree on the configuration: ranks 2, 3 differ from rank 0"
    [ "$(count_errors)" -eq 1 ]
    mpi 2 config 1
    assert_failure 1
    assert_output --partial "rank 1 differs from rank 0"
    mpi 3 config
    assert_success
}

@test "watchdog: a rank stuck for 30 s makes every rank exit non-zero after the 3 s deadline" {
    mpi 4 hang 0.05 2 30
    assert_failure
    assert_output --regexp "test_comm: error: rank [013]: all-reduce on the world did not complete within 0.05 minutes; a rank may have died"
    (( $(ms "$elapsed") >= 3000 ))   # not before the deadline
    ended_by_itself                  # and by the watchdog (the message), not the sleep's end
}

@test "watchdog: a rank that finalizes and exits 1 while others wait (mpirun alone would hang)" {
    mpi 3 finalize 0.05 1
    assert_failure
    assert_output --partial "did not complete within 0.05 minutes; a rank may have died"
    ended_by_itself
}

@test "a rank that exits 1 before finalizing, or is killed: mpirun ends the job at once" {
    mpi 4 exit 0.05 2
    assert_failure
    ended_by_itself
    mpi 4 kill 0.05 3
    assert_failure
    assert_output --partial "exited on signal 9"
    ended_by_itself
}

@test "a rank that fails alone aborts the job (mc_grid_fail) before the deadline" {
    mpi 4 fail 10 1
    assert_failure
    assert_output --partial "test_comm: error: rank 1: something went wrong here"
    [ "$(count_errors)" -eq 1 ]
    ended_by_itself
}

@test "MC_DEVICE_COMM: a value other than nccl or mpi is one error naming it, every rank exits 1; mpi and nccl are taken" {
    MC_DEVICE_COMM=gloo mpi 2 grid 1 1
    assert_failure 1
    assert_output --partial "test_comm: error: grid: MC_DEVICE_COMM=gloo: expected nccl or mpi"
    [ "$(count_errors)" -eq 1 ]
    # on the CPU backend's memory neither changes anything (host memory
    # always goes through MPI; test_comm checks the staged path itself)
    MC_DEVICE_COMM=mpi mpi 2 grid 1 2
    assert_success
    MC_DEVICE_COMM=nccl mpi 2 grid 2 1
    assert_success
}
