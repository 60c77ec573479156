#!/usr/bin/env bash
# bench/avx2/b16_shapes.sh - issue 18, section 2: the bf16-panel GEMM
# (lib/kern/cpu/b16gemm.c) against sgemm on rounded fp32 copies
# (MC_BF16_PANELS=0), product by product over GPT-2 124M's linear layers at
# B=4, T=1024 and one LM-head chunk, alternating in one process
# (b16_shapes.c); the last line weighs them as a training step does.
#
# Usage: bench/avx2/b16_shapes.sh [BUILD-DIR]
# Environment: ROUNDS (3), THREADS (2), CC; MC_CPU_ISA (avx2) and
# OPENBLAS_CORETYPE (Haswell) as bench/avx2/run.sh sets them (empty: the
# CPU's own choice; the CPU must have no native bf16 GEMM on that path).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
rounds=${ROUNDS:-3} threads=${THREADS:-2} cc=${CC:-cc}
. "$here/bench/lib/avx2_pin.sh"
avx2_pin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cc" -O2 -std=c17 -I"$here/lib" -I"$build" "$here/bench/avx2/b16_shapes.c" -o "$work/b16_shapes" \
    "$build/lib/.libs/libmc.so" -Wl,-rpath,"$build/lib/.libs"
echo "bench/avx2/b16_shapes.sh: $(cpu_line)"
echo "$threads threads, best of $rounds alternating rounds; ratio = sgemm time / panels time"
"$work/b16_shapes" "$threads" "$rounds"
