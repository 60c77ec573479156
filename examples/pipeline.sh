#!/usr/bin/env bash
# pipeline.sh - mc's demo: learn a tokenizer from the Python documentation
# (Debian's python3.11-doc), tokenize the corpus into a Megatron dataset,
# and show what was made. Usage: pipeline.sh [BUILD-DIR] [OUT-DIR]
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
echo "$prefix"
