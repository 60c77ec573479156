#!/usr/bin/env bash
# bench/longctx/plan.sh - what mc-train --dry-run plans per rank for the
# long-context grid of run.sh and cp.sh (issue 14, section 6): a GPT-2
# 124M-shaped model (12 layers, hidden 768, 12 heads, 50257 ids,
# positions up to T), one sequence per micro-batch, at each sequence length
# T, context-parallel size CP and recomputation setting: the activation
# bytes and the rank's total (parameters, gradients, Adam's moments and
# activations), in MiB. The plan is model.c's own carving
# (tests/tools/dry_run.bats and recompute.bats hold the two equal); a
# measured peak RSS adds the process's libraries and BLAS buffers (about
# 200 MiB on the machine of bench/RESULTS.md). Settings that mc-train
# refuses (recomputation with CP > 1 today) print "refused".
#
# Usage: bench/longctx/plan.sh [BUILD-DIR] > plan.dat
# Environment: SEQS="4096 8192 16384 32768" CPS="1 2 4"
#   SETTINGS="none selective selective-cheap selective-mlp full" (run.sh's names)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
mctrain=$build/tools/mc-train/mc-train
[ -x "$mctrain" ] || { echo "plan.sh: $mctrain not found: build mc first" >&2; exit 1; }
# shellcheck source=bench/longctx/settings.sh
. "$here/bench/longctx/settings.sh"
echo "# T CP setting activations_MiB total_MiB (mc-train --dry-run, per rank)"
for T in ${SEQS:-4096 8192 16384 32768}; do
    for cp in ${CPS:-1 2 4}; do
        for s in ${SETTINGS:-none selective selective-cheap selective-mlp full}; do
            # shellcheck disable=SC2046
            if out=$("$mctrain" --model gpt2-124m --num-layers 12 --vocab-size 50257 \
                         --seq-length "$T" --max-position-embeddings "$T" --micro-batch-size 1 \
                         --mock-data --lr 1e-4 --train-iters 1 --dry-run --world-size "$cp" \
                         --context-parallel-size "$cp" $(recompute_options "$s") 2>&1); then
                echo "$out" | awk -v T="$T" -v cp="$cp" -v s="$s" '
                    /^  activations: / { a = $2 } /^  total: / { t = $2 }
                    END { printf "%s %s %s %.1f %.1f\n", T, cp, s, a / 1048576, t / 1048576 }'
            else
                echo "$T $cp $s refused"
            fi
        done
    done
done
