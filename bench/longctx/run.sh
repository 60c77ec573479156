#!/usr/bin/env bash
# bench/longctx/run.sh - long-sequence training (issue 14, section 6): a
# GPT-2 124M-shaped model (12 layers, hidden 768, 12 heads, GPT-2's 50257
# ids, --mock-data) at sequence lengths T, one sequence per micro-batch, for
# each activation-recomputation setting (and, where given, each
# context-parallel size): the step time (mc-train's "elapsed time per
# iteration" of the last iteration), the process's CPU time (user + system,
# set-up included: on a shared machine the fairer comparison, since wall
# time follows the load), the peak resident memory of each rank (GNU
# time's %M, the largest rank's), and mc's own account of the
# activation block (the "activations (stage 0)" line) beside what --dry-run
# plans for it. Prints a table and the ratios to the run without
# recomputation at the same T and CP. A benchmark, not a test:
# tests/tools/recompute.bats checks bits and bytes.
#
# Usage: bench/longctx/run.sh [BUILD-DIR]
# Environment (defaults):
#   SEQS="4096 8192"            sequence lengths
#   SETTINGS="none selective full"
#       none          no recomputation
#       selective     --recompute-granularity selective (core_attn, Megatron's default)
#       selective-mlp selective with mlp
#       selective-all selective with core_attn layernorm mlp
#       selective-cheap selective with layernorm mlp_act attn_proj (mc's modules
#                     mlp_act and attn_proj: no attention and one [C, C] GEMM run again)
#       full          --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
#       full-block-N  full, block, N layers
#   CPS="1"       context-parallel sizes (CP > 1 runs CP ranks under mpirun
#                 with --context-parallel-size CP, THREADS threads each)
#   THREADS=2  ITERS=1  LAYERS=12  MICRO=1  WORK=(a temporary directory)
#   TOGETHER=1    run the settings of one T and CP at the same time (side
#                 by side: on a shared machine the load is then the same
#                 for all, and cpu_x is the fair ratio), not one by one
# OMP_WAIT_POLICY is passive unless set, so that threads waiting for a core
# sleep instead of spinning into the CPU time.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
mctrain=$build/tools/mc-train/mc-train
seqs=${SEQS:-4096 8192}
settings=${SETTINGS:-none selective full}
cps=${CPS:-1}
threads=${THREADS:-2}
iters=${ITERS:-1}
layers=${LAYERS:-12}
micro=${MICRO:-1}
together=${TOGETHER:-0}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -x "$mctrain" ] || { echo "run.sh: $mctrain not found: build mc first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "run.sh: GNU time not found (Debian package time)" >&2; exit 1; }
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1

# shellcheck source=bench/longctx/settings.sh
. "$here/bench/longctx/settings.sh"

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
printf '%-6s %-3s %-14s %12s %9s %10s %14s %14s %8s %8s %8s\n' T CP setting step_ms cpu_s peak_MiB \
    act_bytes planned_act time_x cpu_x mem_x
args_of() { # T CP SETTING
    # shellcheck disable=SC2046,SC2207
    args=(--model gpt2-124m --num-layers "$layers" --vocab-size 50257 --seq-length "$1"
          --max-position-embeddings "$1" --micro-batch-size "$micro" --mock-data --lr 1e-4
          --train-iters "$iters" --eval-iters 0 --log-interval 1 --threads "$threads"
          $(recompute_options "$3"))
    [ "$2" -gt 1 ] && args+=(--context-parallel-size "$2")
    return 0
}

launch() { # T CP SETTING: the run, its log and each rank's GNU time line
    args_of "$@"
    local log=$work/T$1-cp$2-$3.log rss=$work/rss-T$1-cp$2-$3
    rm -f "$rss".*
    if [ "$2" -gt 1 ]; then
        # shellcheck disable=SC2016
        "${MPIRUN:-mpirun}" --oversubscribe --bind-to none -np "$2" sh -c \
            '/usr/bin/time -f "%M %U %S" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$rss" \
            "$mctrain" "${args[@]}" >"$log" 2>&1
    else
        /usr/bin/time -f "%M %U %S" -o "$rss.0" "$mctrain" "${args[@]}" >"$log" 2>&1
    fi
}

report() { # T CP SETTING
    args_of "$@"
    local log=$work/T$1-cp$2-$3.log rss=$work/rss-T$1-cp$2-$3
    ms=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$log" | tail -1 | awk '{ print $NF }')
    peak=$(awk '{ print $1 }' "$rss".* | sort -n | tail -1)
    peak=$((peak / 1024))
    cpu=$(awk '{ s += $2 + $3 } END { printf "%.1f", s }' "$rss".*)
    act=$(awk '/^activations \(stage 0\)/ { print $4; exit }' "$log")
    planned=$("$mctrain" "${args[@]}" --dry-run --world-size "$2" 2>/dev/null |
              awk '/^  activations: / { print $2; exit }')
    [ -n "$base_ms" ] || { base_ms=$ms; base_rss=$peak; base_cpu=$cpu; }
    printf '%-6s %-3s %-14s %12s %9s %10s %14s %14s %8.3f %8.3f %8.3f\n' "$1" "$2" "$3" \
        "$ms" "$cpu" "$peak" "$act" "${planned:--}" "$(echo "$ms / $base_ms" | bc -l)" \
        "$(echo "$cpu / $base_cpu" | bc -l)" "$(echo "$peak / $base_rss" | bc -l)"
}

for T in $seqs; do
    for cp in $cps; do
        base_ms='' base_rss='' base_cpu=''
        if [ "$together" = 1 ]; then
            for s in $settings; do launch "$T" "$cp" "$s" & done
            wait
            for s in $settings; do report "$T" "$cp" "$s"; done
        else
            for s in $settings; do
                launch "$T" "$cp" "$s"
                report "$T" "$cp" "$s"
            done
        fi
    done
done
