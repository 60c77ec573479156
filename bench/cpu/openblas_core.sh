#!/usr/bin/env bash
# bench/cpu/openblas_core.sh - what mc's choice of OpenBLAS's kernels is
# worth on this CPU (lib/kern/cpu/blas.c): GPT-2 124M training steps, B=4,
# T=64, fp32, THREADS threads, side by side in one run, alternating:
#   - "mc": OPENBLAS_CORETYPE unset, so mc loads OpenBLAS with the kernels of
#     its own CPU path;
#   - "openblas": OPENBLAS_CORETYPE set to the core OpenBLAS picks by itself
#     in a program that links it (what every mc program ran before, and what
#     a program linking OpenBLAS gets), found by a 5-line C program here.
# Prints both cores, ms/iteration (median of the steps after the first, over
# ROUNDS alternating rounds) and the ratio. Where OpenBLAS picks the path's
# core by itself the two runs are the same and the ratio ~1.
#
# Usage: bench/cpu/openblas_core.sh [BUILD-DIR]
# Environment: THREADS (2), ITERS (4 per run), ROUNDS (2), SEQ (64), MBS (4).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
threads=${THREADS:-2} iters=${ITERS:-4} rounds=${ROUNDS:-2} seq=${SEQ:-64} mbs=${MBS:-4}
mctrain=$build/tools/mc-train/mc-train
[ -x "$mctrain" ] || { echo "openblas_core.sh: $mctrain not found: build mc first" >&2; exit 1; }
[ -z "${OPENBLAS_CORETYPE:-}" ] || { echo "openblas_core.sh: unset OPENBLAS_CORETYPE first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat > "$work/core.c" <<'C'
#include <stdio.h>
#include <cblas.h>
int main(void) { puts(openblas_get_corename()); return 0; }
C
inc=$(pkg-config --cflags openblas 2>/dev/null || true)
libs=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
libdir=$(pkg-config --variable=libdir openblas 2>/dev/null || true)
# shellcheck disable=SC2086 # the flags are words
${CC:-gcc} $inc -o "$work/core" "$work/core.c" $libs ${libdir:+-Wl,-rpath,$libdir}
own=$("$work/core")

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
     "(family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')," \
     "model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')); flags:" \
     "$(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | tr '\n' ' ')"
path=$("$mctrain" --model gpt2-124m --vocab-size 50257 --mock-data --seq-length "$seq" --micro-batch-size "$mbs" \
    --lr 1e-4 --train-iters 1 --dry-run --device cpu | sed -n 's/^cpu path: //p')
echo "mc: cpu path $path; OpenBLAS by itself: $own; threads $threads, B=$mbs T=$seq," \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

step() { # $1: label, rest: environment
    local label=$1
    shift
    env "$@" OMP_NUM_THREADS="$threads" "$mctrain" --model gpt2-124m --vocab-size 50257 --mock-data \
        --seq-length "$seq" --max-position-embeddings 1024 --micro-batch-size "$mbs" \
        --global-batch-size "$mbs" --lr 1e-4 --train-iters "$iters" --log-interval 1 \
        --eval-iters 0 --threads "$threads" --device cpu 2>&1 >/dev/null |
        grep -o 'elapsed time per iteration (ms): *[0-9.]*' | awk '{print $NF}' | tail -n +2 |
        sed "s/^/$label /" >> "$work/times"
}
for ((r = 0; r < rounds; r++)); do
    step mc -u OPENBLAS_CORETYPE
    step openblas OPENBLAS_CORETYPE="$own"
done
med() { grep "^$1 " "$work/times" | awk '{print $2}' | sort -g |
        awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
a=$(med mc) b=$(med openblas)
echo "mc's choice:       $a ms/iteration"
echo "OpenBLAS's choice: $b ms/iteration ($own)"
awk -v a="$a" -v b="$b" 'BEGIN { printf "speed-up from mc choosing the kernels: %.2fx\n", b / a }'
