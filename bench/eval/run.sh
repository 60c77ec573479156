#!/usr/bin/env bash
# bench/eval/run.sh - evaluation throughput (issue 5, section 5), in one run,
# THREADS threads each, on one model exported from one mc checkpoint:
#   perplexity tokens/s: mc-eval --ppl-mode llama vs transformers
#     (hf_eval.py on the mc-export --format hf directory), same text, same
#     windows (CTX tokens, the first CHUNKS windows, batch 1), each in fp32
#     and in bf16 (mc-eval --bf16: bf16 GEMM operands, fp32 accumulation
#     and activations; transformers with the model loaded in bfloat16);
#   generation tokens/s: mc-eval --weights int8 (KV cache, greedy) vs
#     llama.cpp's llama-completion on the q8_0 GGUF (mc-export --format gguf
#     --dtype q8_0), and mc-eval --weights fp32 vs llama.cpp on the f32
#     GGUF, same checkpoint, same prompt, NTOK new
#     tokens, greedy, --ignore-eos for llama.cpp; the figures count
#     the generated tokens only (llama.cpp's "eval time", mc-eval's
#     "generation: ... tokens/s").
# Each measurement runs REPS times, the sides alternating; the medians and
# the ratios are printed with the targets (mc-eval >= 2x transformers on
# perplexity, checked as mc-eval --bf16 against transformers' default fp32,
# with both like-for-like ratios printed beside it; generation within 1.5x
# of llama.cpp at q8_0).
#
# The model (unless CKPT is given): a GPT-2 124M shape (12 layers, 768
# hidden, 12 heads, T=CTX) with a 4096-token BPE tokenizer trained on the
# Python documentation (Debian's python3.11-doc), after 2 training
# iterations: throughput does not depend on the weights.
#
# Usage: bench/eval/run.sh [BUILD-DIR]
# Environment: LLAMA_CPP_DIR (a llama.cpp build directory with
# bin/llama-completion; required; llama.cpp is never committed to mc),
# MC_PYTHON_HEAVY (torch, transformers, tokenizers; /opt/mcheavy/bin/python),
# THREADS (2), REPS (3), CTX (256), CHUNKS (16), NTOK (128), CKPT (a
# checkpoint with a HuggingFaceTokenizer to use instead of training one),
# PPL (1; 0: generation only, no perplexity runs: transformers' bf16 has no
# bf16 hardware on an AVX2 machine), LLAMA_NO_AVX512 (1: fail when
# llama.cpp's CPU backend reports AVX-512 in its system_info line; its
# instruction sets are printed either way).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/bench/lib/gpt2_model.sh"
build=${1:-$here/build}
threads=${THREADS:-2} reps=${REPS:-3} ppl=${PPL:-1} ctx=${CTX:-256} chunks=${CHUNKS:-16} ntok=${NTOK:-128}
pyh=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
llama=${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a llama.cpp build directory}/bin
bin=$build/tools
docs=/usr/share/doc/python3.11/html/_sources
# llama-completion (llama.cpp since 2025) or, in older builds, llama-cli
lc=$llama/llama-completion
[ -x "$lc" ] || lc=$llama/llama-cli
for p in "$bin/mc-eval/mc-eval" "$bin/mc-export/mc-export" "$lc"; do
    [ -x "$p" ] || { echo "run.sh: $p not found" >&2; exit 1; }
done
"$pyh" -c "import torch, transformers, tokenizers" ||
    { echo "run.sh: $pyh lacks torch/transformers/tokenizers" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

echo "machine: $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"

ckpt=${CKPT:-}
[ -n "$ckpt" ] || ckpt=$(train_gpt2_model "$bin" "$work" "$ctx" "$threads" 4)
"$bin/mc-export/mc-export" --format hf -o "$work/hf" "$ckpt" >/dev/null
"$bin/mc-export/mc-export" --format gguf --dtype q8_0 -o "$work/m.q8_0.gguf" "$ckpt" >/dev/null
"$bin/mc-export/mc-export" --format gguf --dtype f32 -o "$work/m.f32.gguf" "$ckpt" >/dev/null
cat "$docs"/howto/*.txt > "$work/text.txt" # not in the training text
prompt="The Python interpreter"

# llama-completion's generation tokens/s ("eval time"). Its log thread can
# lose the last lines at exit: run again (up to 5 times) until they are there.
lc_gen() {
    local v
    for _ in 1 2 3 4 5; do
        "$lc" -m "$1" -p "$prompt" -n "$ntok" --temp 0 -t "$threads" \
            -c "$ctx" --ignore-eos -no-cnv --no-warmup </dev/null > "$work/lc.log" 2>&1 || true
        v=$(sed -n 's/.* eval time = .*runs .*, *\([0-9.]*\) tokens per second).*/\1/p' \
            "$work/lc.log" | tail -n 1)
        if [ -n "$v" ]; then
            # the instruction sets llama.cpp's CPU backend was built for
            # (its system_info line), once: the record says what ran
            [ -s "$work/lc_features" ] ||
                sed -n 's/.*system_info: .*| CPU : \(.*\)/\1/p' "$work/lc.log" | head -n 1 \
                    > "$work/lc_features"
            echo "$v"
            return
        fi
    done
    echo "run.sh: no timing from llama-completion on $1" >&2
    exit 1
}

med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

touch "$work/mc_ppl" "$work/mc_ppl_bf16" "$work/hf_ppl" "$work/hf_ppl_bf16"
for r in $(seq "$reps"); do
  if [ "$ppl" = 1 ]; then
    # perplexity: mc-eval's tokens/s as windows x ctx / seconds (every
    # token of a window passes through the model), as hf_eval.py counts
    "$bin/mc-eval/mc-eval" "$ckpt" --text-file "$work/text.txt" --ppl-mode llama -c "$ctx" \
        --chunks "$chunks" --threads "$threads" --quiet -o "$work/ppl.json" >/dev/null 2>&1
    "$pyh" - "$work/ppl.json" "$ctx" >> "$work/mc_ppl" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["perplexity"]
print(p["windows"] * int(sys.argv[2]) / p["seconds"], p["ppl"])
EOF
    # the same with bf16 GEMMs (fp32 accumulation)
    "$bin/mc-eval/mc-eval" "$ckpt" --text-file "$work/text.txt" --ppl-mode llama -c "$ctx" \
        --chunks "$chunks" --threads "$threads" --bf16 --quiet -o "$work/ppl.json" >/dev/null 2>&1
    "$pyh" - "$work/ppl.json" "$ctx" >> "$work/mc_ppl_bf16" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["perplexity"]
print(p["windows"] * int(sys.argv[2]) / p["seconds"], p["ppl"])
EOF
    "$pyh" "$here/bench/eval/hf_eval.py" "$work/hf" "$work/text.txt" "$ctx" "$chunks" "$threads" \
        2>/dev/null | awk '{ print $10, $2 }' >> "$work/hf_ppl"
    # transformers with the model in bf16 (weights and activations), the
    # like-for-like peer of mc-eval --bf16
    "$pyh" "$here/bench/eval/hf_eval.py" "$work/hf" "$work/text.txt" "$ctx" "$chunks" "$threads" \
        bfloat16 2>/dev/null | awk '{ print $10, $2 }' >> "$work/hf_ppl_bf16"
  fi
    # generation: mc-eval on int8 weights (one scale per row, as q8_0 has one
    # per 32) and on fp32
    for w in int8 fp32; do
        "$bin/mc-eval/mc-eval" "$ckpt" --prompt "$prompt" --max-new-tokens "$ntok" -c "$ctx" \
            --weights $w --threads "$threads" -o "$work/gen.json" 2> "$work/gen.err" >/dev/null
        sed -n 's/.*generation: .* tokens in .* s (\([0-9.]*\) tokens\/s).*/\1/p' \
            "$work/gen.err" >> "$work/mc_gen_$w"
    done
    # llama.cpp: q8_0 (the target) and f32 (mc-eval's precision)
    for t in q8_0 f32; do
        lc_gen "$work/m.$t.gguf" >> "$work/lc_gen_$t"
    done
done

echo "llama.cpp's CPU backend: $(cat "$work/lc_features")"
if [ "${LLAMA_NO_AVX512:-0}" = 1 ] && grep -q 'AVX512[A-Z_]* = 1' "$work/lc_features"; then
    echo "run.sh: $lc was built with AVX-512 (LLAMA_NO_AVX512=1 asks for a build without)" >&2
    exit 1
fi
mcp=$(cut -d' ' -f1 "$work/mc_ppl" | med) hfp=$(cut -d' ' -f1 "$work/hf_ppl" | med)
mcb=$(cut -d' ' -f1 "$work/mc_ppl_bf16" | med) hfb=$(cut -d' ' -f1 "$work/hf_ppl_bf16" | med)
mcg=$(med < "$work/mc_gen_int8") mcf=$(med < "$work/mc_gen_fp32")
lcg=$(med < "$work/lc_gen_q8_0") lcf=$(med < "$work/lc_gen_f32")
echo "model: $(grep -o '"parameters": [0-9]*' "$work/gen.json" | head -1), ctx $ctx," \
     "$chunks windows, $ntok new tokens, $threads threads, $reps runs alternating (medians)"
echo "perplexity values: mc-eval $(cut -d' ' -f2 "$work/mc_ppl" | head -1)," \
     "transformers $(cut -d' ' -f2 "$work/hf_ppl" | head -1)"
printf 'perplexity tokens/s: mc-eval %.1f (%s)  transformers %.1f (%s)\n' "$mcp" \
    "$(cut -d' ' -f1 "$work/mc_ppl" | tr '\n' ' ')" "$hfp" "$(cut -d' ' -f1 "$work/hf_ppl" | tr '\n' ' ')"
printf 'perplexity tokens/s: mc-eval --bf16 %.1f (%s), PPL %s\n' "$mcb" \
    "$(cut -d' ' -f1 "$work/mc_ppl_bf16" | tr '\n' ' ')" "$(cut -d' ' -f2 "$work/mc_ppl_bf16" | head -1)"
printf 'perplexity tokens/s: transformers bf16 %.1f (%s), PPL %s\n' "$hfb" \
    "$(cut -d' ' -f1 "$work/hf_ppl_bf16" | tr '\n' ' ')" "$(cut -d' ' -f2 "$work/hf_ppl_bf16" | head -1)"
printf 'generation tokens/s: mc-eval int8 %.1f (%s)  llama.cpp q8_0 %.1f (%s)\n' \
    "$mcg" "$(tr '\n' ' ' < "$work/mc_gen_int8")" "$lcg" "$(tr '\n' ' ' < "$work/lc_gen_q8_0")"
printf 'generation tokens/s: mc-eval fp32 %.1f (%s)  llama.cpp f32 %.1f (%s)\n' \
    "$mcf" "$(tr '\n' ' ' < "$work/mc_gen_fp32")" "$lcf" "$(tr '\n' ' ' < "$work/lc_gen_f32")"
best() { sort -g | tail -n 1; }
printf 'best of %s (the least disturbed run on a shared machine): perplexity mc-eval %.1f, transformers %.1f; generation mc-eval int8 %.1f, llama.cpp q8_0 %.1f, mc-eval fp32 %.1f, llama.cpp f32 %.1f\n' \
    "$reps" "$(cut -d' ' -f1 "$work/mc_ppl" | best)" "$(cut -d' ' -f1 "$work/hf_ppl" | best)" \
    "$(best < "$work/mc_gen_int8")" "$(best < "$work/lc_gen_q8_0")" \
    "$(best < "$work/mc_gen_fp32")" "$(best < "$work/lc_gen_f32")"
awk -v a="$mcp" -v b="$hfp" -v c="$mcg" -v d="$lcg" -v e="$lcf" -v f="$mcf" -v g="$mcb" -v h="$hfb" 'BEGIN {
    r2 = d / c
    if (b > 0 && h > 0) {
        printf "perplexity: mc-eval --bf16 / transformers (fp32, its default) = %.2fx (target >= 2x: %s)\n", g / b, (g / b >= 2 ? "met" : "MISSED")
        printf "perplexity: mc-eval --bf16 / transformers bf16 (like for like) = %.2fx\n", g / h
        printf "perplexity: mc-eval / transformers, both fp32 (like for like) = %.2fx\n", a / b
    }
    printf "generation in fp32: llama.cpp f32 / mc-eval fp32 = %.2fx\n", e / f
    printf "generation: llama.cpp q8_0 / mc-eval int8 = %.2fx (target <= 1.5x: %s)\n", r2, (r2 <= 1.5 ? "met" : "MISSED")
    printf "generation: mc-eval int8 / llama.cpp q8_0 = %.2fx (issue 18 target >= 1.0x)\n", c / d }'
