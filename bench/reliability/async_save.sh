#!/usr/bin/env bash
# async_save.sh - what a checkpoint costs the training loop, synchronous
# and with --async-save (issue 17, section 3: async within 5% of no save).
# Usage: bench/reliability/async_save.sh [BUILD_DIR] [REPEATS]
# mc-train trains a 4-layer GPT (hidden 512: 13.6M parameters, a 160 MB
# checkpoint with Adam's moments; T=32, 2 sequences an iteration) for 20
# iterations on mock data, saving every 5 (4 saves) or never; each
# configuration REPEATS times (default 3), alternating, the median of the whole process's wall time printed with the
# ratio to no save.
set -eu
build=${1:-build}
reps=${2:-3}
T=$build/tools/mc-train/mc-train
[ -x "$T" ] || { echo "async_save.sh: $T not built" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/async_save.XXXXXX")
trap 'rm -rf "$work"' EXIT
args=(--model tiny-gpt --num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 32
      --micro-batch-size 1 --global-batch-size 2 --lr 1e-4 --log-interval 10 --eval-iters 0
      --mock-data --vocab-size 1024 --train-iters 20 --threads 2)
run() { # NAME ARGS...: seconds of one run
    local name=$1 t0 t1
    shift
    rm -rf "$work/ck"
    t0=$(date +%s.%N)
    "$T" "${args[@]}" "$@" >/dev/null 2>"$work/$name.err" || { cat "$work/$name.err" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
declare -A times
for r in $(seq "$reps"); do
    times[none]+="$(run none) "
    times[sync]+="$(run sync --save "$work/ck" --save-interval 5) "
    times[async]+="$(run async --save "$work/ck" --save-interval 5 --async-save) "
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
base=$(echo "${times[none]}" | median)
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $reps runs each"
for k in none sync async; do
    m=$(echo "${times[$k]}" | median)
    printf '%-6s median %7.2f s  (runs: %s)  x%.3f of no save\n' "$k" "$m" "${times[$k]}" "$(echo "$m / $base" | bc -l)"
done
