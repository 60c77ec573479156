#!/bin/bash
# bench/serve/q8a8.sh BUILD [THREADS]: the int8 x int8 row kernel
# (mc_k_linear_q8a8_fwd) against the widening row kernel and mc-eval's former
# int8 kernel, GOP/s on the GPT-2 124M shapes at 1 to 64 rows (q8a8.c), then
# one generated token: a row through the 49 linears with the weights
# streaming from memory, ms a token (q8a8_decode.c).
# MC_CPU_ISA pins a path. Figures: bench/RESULTS.md.
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD [THREADS]}" && pwd)
threads=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -std=c17 -Wall -I"$here/../../lib" -I"$build" "$here/q8a8.c" -o "$out/q8a8" \
    "$build/lib/.libs/libmc.so" -Wl,-rpath,"$build/lib/.libs"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), MC_CPU_ISA=${MC_CPU_ISA:-best}"
"$out/q8a8" "$threads" 1 4 16 64
# one generated token: a row through all the model's linears, weights from memory
gcc -O2 -std=c17 -Wall -I"$here/../../lib" -I"$build" "$here/q8a8_decode.c" -o "$out/q8a8_decode" \
    "$build/lib/.libs/libmc.so" -Wl,-rpath,"$build/lib/.libs"
"$out/q8a8_decode" "$threads" 40
