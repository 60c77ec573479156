#!/usr/bin/env bash
# async_save.sh - what a checkpoint costs the training loop, synchronous
# and with --async-save (issue 17, section 3: async within 5% of no save).
# Usage: bench/reliability/async_save.sh [BUILD_DIR] [REPEATS]
# mc-train trains a 4-layer GPT (hidden 256, one thread; a ~40 MB
# checkpoint with Adam's moments; T=32, 2 sequences an iteration) for 20
# iterations on mock data, saving every 5 or never. The time measured is
# the training's: from iteration 1's log line to iteration 20's (so the
# saves at 5, 10 and 15 are in it; start-up and the final save, which
# every mode waits for, are not). Each mode runs REPEATS times (default 3),
# alternating; the medians are printed with the ratio to no save.
set -eu
build=${1:-build}
reps=${2:-3}
T=$build/tools/mc-train/mc-train
[ -x "$T" ] || { echo "async_save.sh: $T not built" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/async_save.XXXXXX")
trap 'rm -rf "$work"' EXIT
args=(--model tiny-gpt --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 32
      --micro-batch-size 1 --global-batch-size 2 --lr 1e-4 --log-interval 1 --eval-iters 0
      --mock-data --vocab-size 1024 --train-iters 20 --threads 1)
run() { # NAME ARGS...: seconds from iteration 1's log line to iteration 20's
    local name=$1
    shift
    rm -rf "$work/ck"
    "$T" "${args[@]}" "$@" >/dev/null 2>"$work/$name.err" || { cat "$work/$name.err" >&2; exit 1; }
    sed -n 's/^ \[[0-9-]* \([0-9:.]*\)\] iteration *\([0-9]*\)\/.*/\2 \1/p' "$work/$name.err" |
        awk '{ split($2, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3] }
             $1 == 1 { a = s } $1 == 20 { b = s } END { printf "%.3f", b - a }'
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
