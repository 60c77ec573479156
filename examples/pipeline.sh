#!/usr/bin/env bash
# pipeline.sh - mc's demo: learn a tokenizer from the Python documentation
# (Debian's python3.11-doc), tokenize the corpus into a Megatron dataset,
# train a small GPT on it, and show the loss falling below the data's
# unigram entropy. Usage: pipeline.sh [BUILD-DIR] [OUT-DIR]
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
# the CPU. The prefix goes in on stdin; mc-train prints the checkpoint path.
iters=${MC_DEMO_ITERS:-300}
echo "== 4. train a small GPT for $iters iterations (mc-preprocess | mc-train)" >&2
rm -f "$out/train.jsonl"
ckpt=$(echo "$prefix" | "$bin/mc-train/mc-train" \
        --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
        --seq-length 128 --max-position-embeddings 128 \
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
        --micro-batch-size 16 --global-batch-size 16 --train-iters "$iters" \
        --lr 2e-3 --min-lr 2e-4 --lr-warmup-iters 20 --lr-decay-style cosine \
        --weight-decay 0.1 --clip-grad 1.0 --split 90,8,2 \
        --eval-interval "$iters" --eval-iters 8 --log-interval 25 \
        --data-cache-path "$out/cache" --log-json "$out/train.jsonl" \
        --save "$out/ckpt" --seed 1234)

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
echo "checkpoint: $ckpt" >&2
echo "$ckpt"
