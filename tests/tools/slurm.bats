#!/usr/bin/env bats
# Launching under SLURM (issue 4, section 6): a real single-node SLURM from
# Debian's slurm-wlm (tests/slurm/start_slurm.sh: slurmctld and slurmd as
# root with AuthType=auth/none and CredType=cred/none, state under a
# temporary directory, ports of their own, 4 CPUs oversubscribed) runs an
# sbatch job of mc-train on 4 ranks, TP=2 x DP=2, started by
# `srun --mpi=pmix` (or by mpirun inside the job where srun has no pmix
# plugin). The job must end with status 0, its output must show every
# iteration, and its losses must be the single-process run's within 1e-6
# relative (as tests/tools/parallel_train.bats holds mpirun's; 4 tasks that
# each trained alone would fail TP=2 at once). Then a grid that does not fit
# fails the job with one message, and `srun --mpi=none` (no PMI: the tasks
# cannot see each other) is refused instead of training 4 copies.
# Skips, saying why, where SLURM is not installed or not root.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
START="$top_srcdir/tests/slurm/start_slurm.sh"
args=(--model tiny-gpt --seq-length 16 --vocab-size 64 --make-vocab-size-divisible-by 16
      --mock-data --train-iters 4 --lr 1e-3 --lr-warmup-iters 1 --log-interval 1
      --eval-iters 0 --micro-batch-size 1 --global-batch-size 4 --threads 1)

setup_file() {
    # A short path: slurmd's step sockets live under it (108-byte limit).
    SLURM_DIR=$(mktemp -d /tmp/mc-slurm.XXXXXX)
    export SLURM_DIR
    local out rc=0
    out=$("$START" start "$SLURM_DIR" 2>"$SLURM_DIR/start.err") || rc=$?
    if [ $rc -eq 3 ]; then
        skip "$(sed -n 's/^skip: //p' "$SLURM_DIR/start.err")"
    fi
    [ $rc -eq 0 ] || { cat "$SLURM_DIR/start.err" >&3; return 1; }
    export SLURM_CONF=$out
}

teardown_file() {
    [ -n "${SLURM_DIR:-}" ] || return 0
    "$START" stop "$SLURM_DIR"
    rm -rf "$SLURM_DIR"
}

setup() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
    cd "$BATS_TEST_TMPDIR"
}

# job SCRIPT: sbatch --wait it (the job's own time limit is 3 minutes;
# timeout is a safety net) with its output in job.out; $status is the job's.
job() {
    run timeout -k 5 240 sbatch --wait --time=3 -o "$PWD/job.out" "$1"
}

# The launcher line of the job: srun with pmix, else mpirun in the job.
launcher() {
    if grep -q '^MpiDefault=pmix' "$SLURM_CONF"; then
        echo "srun --mpi=pmix"
    else
        echo "mpirun --oversubscribe --bind-to none -np \$SLURM_NTASKS"
    fi
}

@test "slurm: sbatch runs mc-train on 4 ranks (TP=2 x DP=2) to completion, losses as one process" {
    "$MC_TRAIN" "${args[@]}" --log-json one.jsonl 2>one.err
    {
        echo '#!/bin/bash'
        echo '#SBATCH --job-name=mc-test --ntasks=4 --nodes=1'
        printf '%s %q' "$(launcher)" "$MC_TRAIN"
        printf ' %q' "${args[@]}" --tensor-model-parallel-size 2 --log-json "$PWD/grid.jsonl"
        echo
        echo 'echo "job done rc=$?"'
    } > job.sh
    job job.sh
    [ "$status" -eq 0 ] || { cat job.out; false; }
    run grep -c 'iteration *[1-4]/ *4 ' job.out
    assert_output 4
    run grep -c 'job done rc=0' job.out
    assert_output 1
    # the losses: one process's within 1e-6 relative, 4 of them
    paste <(grep -o '"lm loss": [^,}]*' one.jsonl | sed 's/.*: //') \
          <(grep -o '"lm loss": [^,}]*' grid.jsonl | sed 's/.*: //') |
        awk '{ n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
               if (r > m) m = r } END { printf "# %d losses, max rel diff %.3g\n", n, m;
               exit !(n == 4 && m <= 1e-6) }' >&3
}

@test "slurm: a grid that does not fit fails the job with one message" {
    {
        echo '#!/bin/bash'
        echo '#SBATCH --ntasks=4 --nodes=1'
        printf '%s %q' "$(launcher)" "$MC_TRAIN"
        printf ' %q' "${args[@]}" --tensor-model-parallel-size 3
        echo
    } > bad.sh
    job bad.sh
    [ "$status" -ne 0 ]
    run grep -c 'ranks do not divide into tensor-parallel 3' job.out
    assert_output 1
}

@test "slurm: srun --mpi=none (no PMI) is refused, not 4 separate trainings" {
    {
        echo '#!/bin/bash'
        echo '#SBATCH --ntasks=2 --nodes=1'
        printf 'srun --mpi=none %q' "$MC_TRAIN"
        printf ' %q' "${args[@]}"
        echo
    } > none.sh
    job none.sh
    [ "$status" -ne 0 ]
    run grep -c 'iteration' job.out
    assert_output 0
    # Open MPI's own refusal, or mc's where MPI makes each task a world of one
    run grep -E -c 'direct launched using "srun"|srun started 2 tasks but MPI sees 1 rank' job.out
    refute_output 0
}
