#!/usr/bin/env bash
# bench/avx2/bf16_ab.sh - issue 18's "--bf16 >= 1.0x mc's own fp32" where
# bf16 is emulated (the avx2 path: the weights' products through the
# bf16-panel GEMM, d W through sgemm on rounded operands), measured the only
# way a difference of a percent can be: mc-train fp32 and --bf16
# alternating, ROUNDS times each, in one run, so the load of a shared
# machine weighs on both alike (the order turned every round). SGEMM=1 adds
# a third setting, --bf16 with MC_BF16_PANELS=0 (every GEMM through sgemm
# on rounded fp32 copies, as before b16gemm.c). GPT-2 124M, mock data, B=4,
# T (1024), THREADS (2); per run the median iteration time of ITERS (2) after
# WARM (1). Prints every run, the medians over all runs and the ratio
# fp32 / bf16 (>= 1: bf16 at least as fast).
#
# Usage: bench/avx2/bf16_ab.sh [BUILD-DIR]
# Environment: T, ROUNDS (4), WARM, ITERS, THREADS; MC_CPU_ISA (avx2) and
# OPENBLAS_CORETYPE (Haswell) as bench/avx2/run.sh sets them; on a CPU
# without AVX512_BF16 or AMX, MC_CPU_ISA= (empty: the best path) measures
# the emulation the CPU itself gets.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
T=${T:-1024} rounds=${ROUNDS:-4} warm=${WARM:-1} iters=${ITERS:-2} threads=${THREADS:-2}
. "$here/bench/lib/avx2_pin.sh"
avx2_pin
mctrain=$build/tools/mc-train/mc-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "bench/avx2/bf16_ab.sh: $(cpu_line)"
"$mctrain" --model gpt2-124m --mock-data --vocab-size 50257 --lr 1e-4 --train-iters 1 \
    --device cpu --bf16 --dry-run | grep "^cpu path" || true
echo "GPT-2 124M, B=4, T=$T, $threads threads; per run the median of $iters iterations after $warm"
settings=(fp32 bf16)
[ "${SGEMM:-0}" = 1 ] && settings+=(bf16-sgemm)
for ((r = 1; r <= rounds; r++)); do
    # the order turned every round, so no setting always runs first
    n=${#settings[@]}
    for ((k = 0; k < n; k++)); do
        prec=${settings[$(((k + r - 1) % n))]}
        flags=() panels=1
        [ $prec != fp32 ] && flags=(--bf16)
        [ $prec = bf16-sgemm ] && panels=0
        rm -f "$work/log.json"
        MC_BF16_PANELS=$panels "$mctrain" --model gpt2-124m --mock-data --vocab-size 50257 \
            --micro-batch-size 4 --global-batch-size 4 --seq-length "$T" \
            --train-iters $((warm + iters)) --lr 1e-4 --log-interval 1 --eval-iters 0 \
            --threads "$threads" "${flags[@]}" --log-json "$work/log.json" >/dev/null \
            2>"$work/err" || { cat "$work/err" >&2; exit 1; }
        s=$(sed 's/.*"iteration-time": \([0-9.e-]*\).*/\1/' "$work/log.json" | tail -n +$((warm + 1)) | median)
        echo "round $r $prec $s s/iteration"
        echo "$s" >>"$work/$prec"
    done
done
f=$(median <"$work/fp32") b=$(median <"$work/bf16")
echo "medians: fp32 $f s, bf16 $b s; fp32 / bf16 = $(awk -v f="$f" -v b="$b" 'BEGIN { printf "%.4f", f / b }')x (>= 1: --bf16 at least as fast)"
if [ -s "$work/bf16-sgemm" ]; then
    o=$(median <"$work/bf16-sgemm")
    echo "bf16 with MC_BF16_PANELS=0 (sgemm on rounded copies): $o s; fp32 / that = $(awk -v f="$f" -v b="$o" 'BEGIN { printf "%.4f", f / b }')x"
fi
