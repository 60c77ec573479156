#!/usr/bin/env bash
# bench/comm/run.sh - communication per iteration (issue 4, section 9): runs
# mc-train --log-comm under mpirun on a few grids of a small GPT (4 layers,
# hidden 128, 4 heads, T=64, micro-batch 2, global batch 8, 20 iterations,
# the figures of the last 10) and compares rank 0's measured traffic per
# iteration with the theory:
#   plan     mc-train --dry-run's figures for pipeline stage 0 (bytes into
#            collectives and ring wire bytes per group);
#   formula  the wire bytes a ring needs for what was handed over:
#            all-reduce 2(P-1)/P x bytes, all-gather and reduce-scatter
#            (P-1)/P x bytes (the full size), sends x 1;
# and prints the ratios (1.000 = as planned), the time blocked per group and
# the overlap achieved by the data-parallel reduction (1 - waited/elapsed of
# its non-blocking calls) with and without --overlap-grad-reduce.
# A benchmark, not a test: tests/tools/log_comm.bats checks the equalities.
#
# Usage: bench/comm/run.sh [BUILD-DIR]
# Environment: MPIRUN (mpirun), ITERS (20), BUCKET (--ddp-bucket-size for
# the overlapped run, 40000 elements).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
mctrain=$build/tools/mc-train/mc-train
mpirun=${MPIRUN:-$(command -v mpirun || true)}
iters=${ITERS:-20}
bucket=${BUCKET:-40000}
[ -x "$mctrain" ] || { echo "run.sh: $mctrain not found: build mc first" >&2; exit 1; }
[ -n "$mpirun" ] || { echo "run.sh: mpirun not found (openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

model=(--model tiny-gpt --num-layers 4 --hidden-size 128 --num-attention-heads 4
       --seq-length 64 --max-position-embeddings 64 --vocab-size 512
       --micro-batch-size 2 --global-batch-size 8 --threads 1 --lr 1e-4
       --lr-warmup-iters 2 --eval-iters 0 --mock-data --train-iters "$iters"
       --log-interval $((iters / 2)))

# name | ranks | options
grids=(
    "TP=2|2|--tensor-model-parallel-size 2"
    "DP=2|2|"
    "TP=2xDP=2 SP|4|--tensor-model-parallel-size 2 --sequence-parallel"
    "PP=2|2|--pipeline-model-parallel-size 2"
    "DP=2 overlap|2|--overlap-grad-reduce --ddp-bucket-size $bucket"
)

echo "mc-train --log-comm: rank 0's traffic per iteration vs the dry run (stage 0) and the ring formulas"
echo "model: ${model[*]}"
printf '%-14s %-5s %-15s %6s %12s %12s %8s %8s %8s %9s %8s\n' grid group kind calls bytes wire \
    "b/plan" "w/plan" "w/ring" "ms" overlap
for g in "${grids[@]}"; do
    IFS='|' read -r name n opts <<<"$g"
    # shellcheck disable=SC2086
    "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np "$n" \
        "$mctrain" "${model[@]}" $opts --log-comm 2>"$work/err" >/dev/null
    # shellcheck disable=SC2086
    "$mctrain" --dry-run "${model[@]}" $opts --world-size "$n" >"$work/plan"
    grep '^ comm per iteration:' "$work/err" | tail -1 | sed 's/^ comm per iteration://' |
        tr '|' '\n' >"$work/line"
    awk -v name="$name" -v P_tp="$(grep -o 'tensor-model-parallel-size [0-9]*' <<<"$opts" | awk '{print $2}')" \
        -v n="$n" -v opts="$opts" '
        FNR == NR {
            # the plan: stage 0 lines "    tensor-parallel group: B / W bytes, C calls"
            if ($0 ~ /^stage 1/) stop = 1
            if (!stop && $0 ~ /group: [0-9]/) {
                g = $1 == "tensor-parallel" ? "tp" : $1 == "data-parallel" ? "dp" : $1 == "pipeline-parallel" ? "pp" : "embd"
                pb[g] = $3; pw[g] = $5
            }
            next
        }
        $0 ~ /overlap/ { ov = $3; next }
        NF >= 10 && $2 != "scalar:" {
            grp = $1; kind = $2; sub(":", "", kind)
            calls = $3; b = $5 * 1e6; w = $8 * 1e6; ms = $10
            tp = P_tp ? P_tp : 1
            size = grp == "tp" ? tp : (grp == "embd" || grp == "pp") ? 2 : n / tp
            if (kind == "all-reduce") ring = 2 * (size - 1) / size * b
            else if (kind == "send/recv") ring = w
            else ring = (size - 1) / size * b
            rows[++nr] = sprintf("%-14s %-5s %-15s %6s %12.0f %12.0f", name, grp, kind, calls, b, w)
            rg[nr] = grp; rring[nr] = ring; rw[nr] = w; rms[nr] = ms
            tb[grp] += (kind == "send/recv" ? w : b); tw[grp] += w
        }
        END {
            for (i = 1; i <= nr; i++) {
                g = rg[i]
                bp = pb[g] > 0 ? sprintf("%.3f", tb[g] / pb[g]) : "-"
                wp = pw[g] > 0 ? sprintf("%.3f", tw[g] / pw[g]) : "-"
                wr = rring[i] > 0 ? sprintf("%.3f", rw[i] / rring[i]) : "-"
                printf "%s %8s %8s %8s %9s %8s\n", rows[i], bp, wp, wr, rms[i], (g == "dp" ? ov : "")
            }
        }' "$work/plan" "$work/line"
done
echo "(bytes: handed to the calls, per iteration; wire: sent by rank 0; b/plan and w/plan: the"
echo " group's totals over the dry run's; w/ring: wire over the ring formula for that kind;"
echo " for pp the plan counts sends only, so b/plan compares the sent bytes)"
