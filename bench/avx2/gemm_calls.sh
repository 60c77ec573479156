#!/usr/bin/env bash
# bench/avx2/gemm_calls.sh - where emulated bf16's time goes against fp32
# (issue 18, section 2): mc-train fp32 and --bf16 alternating, ROUNDS times
# each (the order swapped every round, so neither always runs second), with
# every sgemm call timed by shape (gemm_calls.c, loaded as mc's OpenBLAS).
# It runs bf16 with MC_BF16_PANELS=0, the emulation before the bf16-panel
# GEMM (b16gemm.c, whose calls it cannot see; bench/avx2/b16_shapes.sh
# compares the two): there emulated bf16 multiplies the same shapes as fp32
# through the same sgemm,
# on operands rounded to bf16: the table shows whether those GEMMs take
# longer (bf16/fp32 > 1), and the step's time outside the GEMMs (the
# rounding passes, attention, norms, optimizer) per precision. Also prints
# the machine's AVX2 FMA ceiling (fma_peak.c) and OpenBLAS's GEMM rate
# against it. GPT-2 124M, mock data, B=4, T (1024), ITERS (3) iterations a
# run, THREADS (2).
#
# Usage: bench/avx2/gemm_calls.sh [BUILD-DIR]
# Environment: T, ROUNDS (2), ITERS, THREADS, CC; MC_CPU_ISA (avx2) and
# OPENBLAS_CORETYPE (Haswell) as bench/avx2/run.sh sets them (empty: the
# CPU's own choice).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
T=${T:-1024} rounds=${ROUNDS:-2} iters=${ITERS:-3} threads=${THREADS:-2} cc=${CC:-cc}
. "$here/bench/lib/avx2_pin.sh"
avx2_pin
export MC_BF16_PANELS=0
mctrain=$build/tools/mc-train/mc-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the OpenBLAS mc would load (its configured path is in config.h)
blas=$(sed -n 's/^#define MC_OPENBLAS_LIB "\(.*\)"$/\1/p' "$build/config.h")
[ -n "$blas" ] && [ -e "$blas" ] || blas=$($cc -print-file-name=libopenblas.so.0)
"$cc" -O2 -std=gnu17 -shared -fPIC -o "$work/gemm_calls.so" "$here/bench/avx2/gemm_calls.c" \
    -ldl -lpthread -Wl,--no-as-needed "$blas" -Wl,-rpath,"$(dirname "$blas")"
"$cc" -O2 -std=gnu17 -fopenmp -o "$work/fma_peak" "$here/bench/avx2/fma_peak.c"

echo "bench/avx2/gemm_calls.sh: $(cpu_line), OpenBLAS $blas"
peak=$(OMP_NUM_THREADS=$threads "$work/fma_peak")
echo "$peak"
peak=$(sed 's/.*: \([0-9.]*\) GFLOP.*/\1/' <<<"$peak")
"$mctrain" --model gpt2-124m --mock-data --vocab-size 50257 --lr 1e-4 --train-iters 1 \
    --device cpu --bf16 --dry-run | grep "^cpu path" || true
echo "GPT-2 124M, B=4, T=$T, $threads threads, $iters iterations a run (every iteration counted)"

for ((r = 1; r <= rounds; r++)); do
    order="fp32 bf16"
    ((r % 2)) || order="bf16 fp32"
    for prec in $order; do
        flags=()
        [ $prec = bf16 ] && flags=(--bf16)
        rm -f "$work/log.json"
        MC_OPENBLAS="$work/gemm_calls.so" GEMM_CALLS_OUT="$work/$prec.$r" \
            "$mctrain" --model gpt2-124m --mock-data --vocab-size 50257 --micro-batch-size 4 \
            --global-batch-size 4 --seq-length "$T" --train-iters "$iters" --lr 1e-4 \
            --log-interval 1 --eval-iters 0 --threads "$threads" "${flags[@]}" \
            --log-json "$work/log.json" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
        step=$(sed 's/.*"iteration-time": \([0-9.e-]*\).*/\1/' "$work/log.json" |
            awk '{ s += $1 } END { printf "%.4f", s }')
        gemm=$(sed -n 's/^total calls [0-9]* seconds \([0-9.]*\).*/\1/p' "$work/$prec.$r")
        echo "$step $gemm" >"$work/$prec.$r.sum"
        echo "round $r $prec: steps $step s, of which sgemm $gemm s"
    done
done

# per shape: both precisions' GFLOP/s over all rounds, and bf16's time / fp32's
cat "$work"/fp32.[0-9]* | sed 's/^/fp32 /' >"$work/all"
cat "$work"/bf16.[0-9]* | sed 's/^/bf16 /' >>"$work/all"
echo
echo "per GEMM shape, all rounds (op M N K beta: calls a run, GFLOP/s fp32, bf16, % of FMA peak, time bf16/fp32):"
awk -v rounds="$rounds" -v peak="$peak" '
$2 == "gemm" {
    key = $3 " " $4 " " $5 " " $6 " " $7
    t[$1, key] += $11; calls[key] = $9
    fl[key] = 2 * substr($4, 3) * substr($5, 3) * substr($6, 3) * $9
    if (!(key in seen)) { seen[key] = 1; keys[++n] = key }
}
END {
    for (i = 1; i <= n; i++) {
        k = keys[i]
        f = fl[k] * rounds / t["fp32", k] / 1e9; b = fl[k] * rounds / t["bf16", k] / 1e9
        printf "  %-40s %4d  %6.1f  %6.1f  %5.1f%%  %.4f\n", k, calls[k], f, b, 100 * f / peak, t["bf16", k] / t["fp32", k]
        tf += t["fp32", k]; tb += t["bf16", k]; ff += fl[k] * rounds
    }
    printf "  all GEMMs: fp32 %.1f GFLOP/s (%.1f%% of the FMA peak), bf16 %.1f GFLOP/s; time bf16/fp32 %.4f\n", ff / tf / 1e9, 100 * ff / tf / 1e9 / peak, ff / tb / 1e9, tb / tf
}' "$work/all"

sum() { cat "$work"/"$1".*.sum | awk -v c="$2" '{ s += $c } END { printf "%.3f", s }'; }
sf=$(sum fp32 1) gf=$(sum fp32 2) sb=$(sum bf16 1) gb=$(sum bf16 2)
awk -v sf="$sf" -v gf="$gf" -v sb="$sb" -v gb="$gb" -v n="$((rounds * iters))" 'BEGIN {
    printf "\nper iteration (mean of %d): fp32 %.3f s = sgemm %.3f + the rest %.3f\n", n, sf / n, gf / n, (sf - gf) / n
    printf "                           bf16 %.3f s = sgemm %.3f + the rest %.3f\n", sb / n, gb / n, (sb - gb) / n
    printf "fp32 / bf16 = %.4fx (>= 1: --bf16 at least as fast); bf16 - fp32: sgemm %+.3f s, the rest %+.3f s an iteration\n", sf / sb, (gb - gf) / n, ((sb - gb) - (sf - gf)) / n
}'
