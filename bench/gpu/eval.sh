#!/usr/bin/env bash
# bench/gpu/eval.sh - generation on one GPU (issue 11, section 3): mc-eval
# --device cuda --bf16 (KV cache on the GPU, greedy) against transformers'
# generate (hf_generate.py: the model in bfloat16, its KV cache, greedy) on
# the same weights, batch 1 and batch 16, side by side in one run; prints
# tokens/s and the ratio (target: mc >= 3x transformers bf16).
#
# The model: GPT-2 124M's shape (12 layers, 768 hidden, 12 heads) with the
# test tokenizer's vocabulary (tests/data/tokenizer/hf_bytelevel.json, 2,002
# ids), initial weights (throughput does not depend on them), exported with
# mc-export --format hf. mc-eval generates its prompts one after another
# (one sequence at a time), so its "batch 16" is 16 prompts in turn; the
# figures count the generated tokens only.
#
# Usage: bench/gpu/eval.sh BUILD-DIR   (an mc build with the CUDA backend:
#        bench/gpu/run.sh's or tests/cuda/run.sh's)
# Environment: NTOK (128 new tokens), CTX (1024), REPS (3), PYTHON (python3
# with torch, transformers, tokenizers: the GPU machines have them), DEVICE
# (cuda; cpu rehearses the script's mc side on a machine without a GPU).
# mc-eval stops a generation at the end-of-document id (transformers is told
# not to); the tokens/s count the tokens each generated.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: bench/gpu/eval.sh BUILD-DIR}
ntok=${NTOK:-128} ctx=${CTX:-1024} reps=${REPS:-3} py=${PYTHON:-python3} dev=${DEVICE:-cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$build/tools
prompt="The river flows"
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); NTOK=$ntok CTX=$ctx REPS=$reps"
"$bin/mc-train/mc-train" --model gpt2-124m --seq-length "$ctx" --max-position-embeddings "$ctx" \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$here/tests/data/tokenizer/hf_bytelevel.json" \
    --mock-data --train-iters 0 --lr 1e-4 --micro-batch-size 1 --global-batch-size 1 \
    --save "$work/ck" >"$work/train.log" 2>&1 || { tail -5 "$work/train.log"; echo "eval.sh: mc-train failed"; exit 1; }
"$bin/mc-export/mc-export" --format hf -o "$work/hf" "$work/ck" >/dev/null 2>"$work/export.log" ||
    { tail -5 "$work/export.log"; echo "eval.sh: mc-export failed"; exit 1; }

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
mc_tps() { # PROMPTS: tokens/s of mc-eval's generation line, median of REPS
    local n=$1 args=()
    for _ in $(seq "$n"); do args+=(--prompt "$prompt"); done
    for _ in $(seq "$reps"); do
        "$bin/mc-eval/mc-eval" "$work/ck" --device "$dev" --bf16 -c "$ctx" --max-new-tokens "$ntok" \
            "${args[@]}" 2>&1 >/dev/null | grep -o 'generation: .*tokens/s' |
            grep -o '[0-9.]* tokens/s' | cut -d' ' -f1
    done | median
}
for b in 1 16; do
    mc=$(mc_tps "$b")
    hf=$("$py" "$here/bench/gpu/hf_generate.py" "$work/hf" "$prompt" "$ntok" "$b" "$reps" 2>"$work/hf.err" |
         awk '{ print $NF }')
    [ -n "$hf" ] || { tail -3 "$work/hf.err"; hf=0; }
    awk -v b="$b" -v m="${mc:-0}" -v h="$hf" 'BEGIN {
        r = h > 0 ? m / h : 0
        printf "batch %2d: mc-eval %.1f tokens/s, transformers bf16 %.1f tokens/s: %.2fx (target >= 3x: %s)\n",
            b, m, h, r, (r >= 3 ? "met" : "MISSED") }'
done
