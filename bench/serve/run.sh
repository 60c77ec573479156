#!/bin/bash
# bench/serve/run.sh BUILD [THREADS]: what mc-serve's batch invariance costs
# in the linear layers. Builds linear_rows.c against BUILD's libmc and times
# the row-invariant kernel (mc_k_linear_rows_fwd) against the linear layer
# mc-eval runs (OpenBLAS sgemm, sgemv for one row; mc_k_linear_q8_fwd for
# int8) on GPT-2 124M's shapes at 1 to 256 rows. Figures: bench/RESULTS.md.
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD [THREADS]}" && pwd)
threads=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -std=c17 -Wall -I"$here/../../lib" -I"$build" "$here/linear_rows.c" -o "$out/linear_rows" \
    "$build/lib/.libs/libmc.so" -Wl,-rpath,"$build/lib/.libs"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), MC_CPU_ISA=${MC_CPU_ISA:-best}"
"$out/linear_rows" "$threads" 1 4 16 64 256
