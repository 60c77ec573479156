#!/usr/bin/env bash
# pipeline.sh - mc's demo, the whole pipeline: learn a tokenizer from the
# Python documentation (Debian's python3.11-doc), tokenize the corpus into a
# Megatron dataset, then in one shell pipeline train a small GPT on it,
# reshard the checkpoint to bf16 and export it as a GGUF file for
# llama.cpp; export it for Hugging Face too, measure the perplexity of the
# fp32, bf16 and int8 checkpoints on the held-out test documents beside the
# data's unigram entropy, and generate a few lines of text.
# Usage: pipeline.sh [BUILD-DIR] [OUT-DIR]
# (MC_DEMO_ITERS sets the training iterations, default 300.)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
out=${2:-$here/demo}
bin=$build/tools
corpus=/usr/share/doc/python3.11/html/_sources
[ -d "$corpus" ] || { echo "pipeline.sh: $corpus missing: apt-get install python3.11-doc" >&2; exit 1; }
mkdir -p "$out"

echo "== 1. train a 32k byte-level BPE tokenizer on $corpus" >&2
tok=$("$bin/mc-preprocess/mc-preprocess" --train-tokenizer --vocab-size 32000 \
        --input-format text --output "$out/tokenizer.json" "$corpus/*.txt" "$corpus/*/*.txt")

echo "== 2. tokenize the corpus (one document per file) into a Megatron dataset" >&2
prefix=$("$bin/mc-preprocess/mc-preprocess" --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$tok" --input-format text --append-eod \
        --output-prefix "$out/pydocs" "$corpus/*.txt" "$corpus/*/*.txt")

echo "== 3. what was made" >&2
ls -l "$tok" "$prefix.bin" "$prefix.idx" >&2
"$bin/mc-preprocess/mc-preprocess" --inspect "$prefix" >&2
echo "-- the first 300 bytes of document 0, detokenized:" >&2
"$bin/mc-preprocess/mc-preprocess" --inspect "$prefix" --show 0 \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" | head -c 300 >&2
echo >&2

# A small GPT (4 layers, 256 hidden, 128-token context) for a few minutes on
# the CPU. Each tool reads the previous one's output path on stdin and
# prints its own: mc-train the checkpoint, mc-reshard the bf16 copy,
# mc-export the GGUF file (tee keeps the intermediate paths).
iters=${MC_DEMO_ITERS:-300}
echo "== 4. mc-train ($iters iterations) | mc-reshard --dtype bf16 | mc-export --format gguf" >&2
rm -rf "$out/train.jsonl" "$out/ckpt" "$out/ckpt-bf16" "$out/ckpt-int8" "$out/hf" "$out/model.gguf"
gguf=$(echo "$prefix" | "$bin/mc-train/mc-train" \
        --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
        --seq-length 128 --max-position-embeddings 128 \
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
        --micro-batch-size 16 --global-batch-size 16 --train-iters "$iters" \
        --lr 2e-3 --min-lr 2e-4 --lr-warmup-iters $((iters / 10)) --lr-decay-style cosine \
        --weight-decay 0.1 --clip-grad 1.0 --split 90,8,2 \
        --eval-interval "$iters" --eval-iters 8 --log-interval 25 \
        --data-cache-path "$out/cache" --log-json "$out/train.jsonl" \
        --save "$out/ckpt" --seed 1234 |
    tee "$out/ckpt.path" |
    "$bin/mc-reshard/mc-reshard" --dtype bf16 --drop-optimizer -o "$out/ckpt-bf16" |
    tee "$out/ckpt-bf16.path" |
    "$bin/mc-export/mc-export" --format gguf --dtype q8_0 -o "$out/model.gguf")
ckpt=$(cat "$out/ckpt.path")
bf16=$(cat "$out/ckpt-bf16.path")

echo "== 5. the loss curve's start and end" >&2
entropy=$("$bin/mc-preprocess/mc-preprocess" --inspect "$prefix" | sed -n 's/.*entropy \([0-9.]*\) nats.*/\1/p')
awk -v h="$entropy" '
    /"lm loss":/ { match($0, /"step": *[0-9]+/); s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
                   match($0, /"lm loss": *[-0-9.eE+]+/); l = substr($0, RSTART, RLENGTH); sub(/.*: */, "", l)
                   if (first == "") { first = l; fs = s } last = l; ls = s }
    /"lm loss validation":/ { match($0, /"lm loss validation": *[-0-9.eE+]+/); v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v) }
    END { printf "training loss: %.3f at iteration %s -> %.3f at iteration %s\n", first, fs, last, ls
          if (v != "") printf "validation loss: %.3f nats/token (unigram entropy of the data: %.3f)\n", v, h }
' "$out/train.jsonl" >&2

echo "== 6. an int8 copy, and a Hugging Face export of the bf16 checkpoint" >&2
int8=$("$bin/mc-reshard/mc-reshard" --quantize int8 --drop-optimizer -o "$out/ckpt-int8" "$ckpt")
hf=$(echo "$bf16" | "$bin/mc-export/mc-export" --format hf -o "$out/hf")
ls -l "$gguf" "$hf" >&2

echo "== 7. perplexity on the held-out test documents (split 90,8,2)" >&2
for c in "$ckpt" "$bf16" "$int8"; do
    "$bin/mc-eval/mc-eval" "$c" --data-path "$prefix" --split 90,8,2 --eval-split test --chunks 100 \
        --quiet -o "$out/ppl-$(basename "$(dirname "$c")").json" >/dev/null 2>"$out/ppl.err" ||
        { cat "$out/ppl.err" >&2; exit 1; }
    printf '%-12s %s\n' "$(basename "$(dirname "$c")")" "$(grep 'PPL' "$out/ppl.err" | tail -1)" >&2
done
echo "(unigram entropy $entropy nats = perplexity $(awk -v h="$entropy" 'BEGIN { printf "%.1f", exp(h) }'))" >&2

echo "== 8. generate (bf16 checkpoint, top-k sampling)" >&2
"$bin/mc-eval/mc-eval" "$bf16" --text --max-new-tokens 48 --temperature 0.8 --top-k 40 --seed 7 \
    --prompt "The Python interpreter" --prompt "To open a file," >&2 2>/dev/null
echo >&2
echo "checkpoint: $ckpt  bf16: $bf16  int8: $int8  gguf: $gguf  hf: $hf" >&2
echo "$gguf"
