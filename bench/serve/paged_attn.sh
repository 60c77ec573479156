#!/bin/bash
# bench/serve/paged_attn.sh BUILD [THREADS] [NSEQ] [LEN]: a decode step's
# attention over mc-serve's pool of key/value blocks, read in place
# (mc_k_attention_paged_fwd) against the former gather into a contiguous
# scratch + mc_k_attention_kv_fwd a sequence (paged_attn.c). MC_CPU_ISA
# pins a path. Figures: bench/RESULTS.md.
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD [THREADS] [NSEQ] [LEN]}" && pwd)
threads=${2:-2} nseq=${3:-16} len=${4:-100}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -std=c17 -Wall -I"$here/../../lib" -I"$build" "$here/paged_attn.c" -o "$out/paged_attn" \
    "$build/lib/.libs/libmc.so" -Wl,-rpath,"$build/lib/.libs"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), MC_CPU_ISA=${MC_CPU_ISA:-best}," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$out/paged_attn" "$threads" "$nseq" "$len"
