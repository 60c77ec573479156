#!/usr/bin/env bash
# bench/longctx/cp.sh - context parallelism at long sequences (issue 14,
# section 6): a GPT-2 124M-shaped model (hidden 768, 12 heads, GPT-2's 50257
# ids, LAYERS layers, --mock-data) at sequence lengths T, one sequence per
# micro-batch, on CP = 1, 2, 4 ranks with each --cp-comm-type: the step time
# (mc-train's "elapsed time per iteration" of the last iteration), the peak
# resident memory of the largest rank (GNU time's %M) and the activations
# --dry-run plans per rank; then each against CP=1 at the same T (time_x,
# mem_x, act_x: 1/CP is the ideal for the activations). The ranks share
# THREADS threads (each gets THREADS / CP, at least 1), so the machine's
# cores are the same for every CP and the step time shows the price of the
# communication and of the smaller GEMMs. A benchmark, not a test:
# tests/tools/parallel_cp.bats checks the numbers, log_comm.bats the bytes.
#
# Usage: bench/longctx/cp.sh [BUILD-DIR]
# Environment (defaults): SEQS="4096 8192" CPS="1 2 4" TYPES="p2p a2a"
#   LAYERS=12 THREADS=2 ITERS=2 MPIRUN=mpirun WORK=(a temporary directory)
#   EXTRA="" (more mc-train options for every run, e.g.
#   --use-distributed-optimizer, which shards Adam's moments over the
#   data x context ranks as Megatron's does)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
mctrain=$build/tools/mc-train/mc-train
seqs=${SEQS:-4096 8192}
cps=${CPS:-1 2 4}
types=${TYPES:-p2p a2a}
layers=${LAYERS:-12}
threads=${THREADS:-2}
iters=${ITERS:-2}
read -r -a extra <<<"${EXTRA:-}"
mpirun=${MPIRUN:-$(command -v mpirun || true)}
[ -x "$mctrain" ] || { echo "cp.sh: $mctrain not found: build mc first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "cp.sh: GNU time not found (Debian package time)" >&2; exit 1; }
[ -n "$mpirun" ] || { echo "cp.sh: mpirun not found (openmpi-bin)" >&2; exit 1; }
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
echo "# gpt2-124m shape, $layers layers, micro-batch 1, $threads threads shared by the ranks, $iters iterations${EXTRA:+, $EXTRA}"
printf '%-6s %-3s %-4s %10s %10s %14s %7s %7s %7s\n' T CP type step_ms peak_MiB planned_act time_x mem_x act_x
for T in $seqs; do
    base_ms='' base_rss='' base_act=''
    for cp in $cps; do
        for type in $types; do
            [ "$cp" -eq 1 ] && [ "$type" != "${types%% *}" ] && continue # CP=1: one run
            per=$((threads / cp))
            [ "$per" -ge 1 ] || per=1
            args=(--model gpt2-124m --num-layers "$layers" --vocab-size 50257 --seq-length "$T"
                  --max-position-embeddings "$T" --micro-batch-size 1 --global-batch-size 1
                  --mock-data --lr 1e-4 --train-iters "$iters" --eval-iters 0 --log-interval 1
                  --threads "$per" --context-parallel-size "$cp" --cp-comm-type "$type" ${extra[@]+"${extra[@]}"})
            log=$work/T$T-cp$cp-$type.log
            rm -f "$work"/rss.*
            if [ "$cp" -gt 1 ]; then
                "$mpirun" --oversubscribe --bind-to none -np "$cp" sh -c \
                    '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/rss" \
                    "$mctrain" "${args[@]}" >"$log" 2>&1
            else
                /usr/bin/time -f %M -o "$work/rss.0" "$mctrain" "${args[@]}" >"$log" 2>&1
            fi
            ms=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$log" | tail -1 | awk '{ print $NF }')
            rss=$(($(cat "$work"/rss.* | sort -n | tail -1) / 1024))
            act=$("$mctrain" "${args[@]}" --dry-run --world-size "$cp" |
                  awk '/^  activations: / { print $2; exit }')
            if [ -z "$base_ms" ]; then base_ms=$ms base_rss=$rss base_act=$act; fi
            awk -v T="$T" -v cp="$cp" -v ty="$type" -v ms="$ms" -v rss="$rss" -v act="$act" \
                -v bm="$base_ms" -v br="$base_rss" -v ba="$base_act" 'BEGIN {
                printf "%-6s %-3s %-4s %10.1f %10d %14.0f %7.2f %7.2f %7.3f\n",
                       T, cp, (cp == 1 ? "-" : ty), ms, rss, act, ms / bm, rss / br, act / ba }'
        done
    done
done
