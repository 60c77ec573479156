#!/usr/bin/env bash
# bench/moe/ep_bytes.sh - issue 13 section 5: under mpirun with EP=2, the
# bytes the MoE dispatch moves over the expert-parallel group in an
# iteration, measured by --log-comm on rank 0, against --dry-run's plan, on
# the Mixtral-shaped model of bench/moe/run.sh (8 experts, top-2, 4 layers,
# hidden 512; T=256, micro-batch 4 per rank, vocabulary 32000).
#
#   bench/moe/ep_bytes.sh BUILDDIR
#
# Three runs of ITERS (3) iterations on 2 ranks (1 thread each):
#   alltoall, padded to capacity 1.0 (--moe-pad-expert-input-to-capacity):
#       every rank sends and receives the same rows whatever the routing,
#       so the plan is exact: ratio 1.000;
#   allgather: the same bytes whatever the routing: ratio 1.000;
#   alltoall, no capacity: each rank's bytes follow the routing, the plan
#       is the EP group's mean (a rank's ratio is near 1, not 1).
# Prints, per run, the measured and planned bytes and calls and the ratio.
# Environment: MPIRUN (mpirun), ITERS (3).
set -euo pipefail
build=${1:?usage: bench/moe/ep_bytes.sh BUILDDIR}
mctrain=$build/tools/mc-train/mc-train
[ -x "$mctrain" ] || { echo "ep_bytes.sh: $mctrain not found: build mc first" >&2; exit 1; }
mpirun=${MPIRUN:-mpirun}
iters=${ITERS:-3}
# Open MPI refuses root unless told (containers run as root)
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'),"\
     "flags: $(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "mpirun: $("$mpirun" --version 2>&1 | head -1)"

args=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --num-query-groups 2
      --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
      --untie-embeddings-and-output-weights --vocab-size 32000 --seq-length 256
      --micro-batch-size 4 --global-batch-size 8 --mock-data --lr 1e-4 --eval-iters 0
      --threads 1 --train-iters "$iters" --log-interval "$iters"
      --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1792 --ffn-hidden-size 1792
      --moe-aux-loss-coeff 1e-2 --expert-model-parallel-size 2)

# measured FIELD: rank 0's "ep" kinds summed over the last comm line
measured() {
    grep '^ comm per iteration:' "$work/err.txt" | tail -1 | sed 's/^ comm per iteration://' |
        tr '|' '\n' | awk -v f="$1" '
        $1 == "ep" && $2 != "scalar:" { if (f == "calls") s += $3; else s += $5 * 1e6 }
        END { printf "%.0f\n", s }'
}
# planned FIELD ARGS...: the dry run's expert-parallel group line
planned() {
    local f=$1
    shift
    "$mctrain" --dry-run "$@" --world-size 2 |
        awk -v f="$f" 'index($0, "expert-parallel group:") && !done {
            n = split($0, w, " "); print (f == "calls" ? w[7] : w[3]); done = 1 }'
}

printf '%-34s %14s %14s %7s %7s %7s\n' run "measured B" "planned B" ratio calls plan
for run in "alltoall padded" allgather "alltoall unpadded"; do
    case $run in
    "alltoall padded") extra=(--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity) ;;
    allgather) extra=(--moe-token-dispatcher-type allgather) ;;
    *) extra=() ;;
    esac
    "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np 2 "$mctrain" "${args[@]}" "${extra[@]}" \
        --log-comm >/dev/null 2>"$work/err.txt" < <(:) ||
        { cat "$work/err.txt" >&2; exit 1; }
    mb=$(measured bytes) mc=$(measured calls)
    pb=$(planned bytes "${args[@]}" "${extra[@]}") pc=$(planned calls "${args[@]}" "${extra[@]}")
    printf '%-34s %14s %14s %7.3f %7s %7s\n' "$run" "$mb" "$pb" "$(awk -v a="$mb" -v b="$pb" 'BEGIN { print a / b }')" "$mc" "$pc"
done
