#!/usr/bin/env bash
# bench/preprocess/run.sh - tokenization throughput: mc-preprocess against
# Hugging Face tokenizers (encode_batch) and tiktoken, same corpus (the Python
# docs, one document per file, read REPEAT times), same 50,257-token
# vocabulary (trained by mc), same thread count, in one run. Prints MB/s and
# the ratios. Usage: bench/preprocess/run.sh [BUILD-DIR] [THREADS] [REPEAT]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
threads=${2:-2}
repeat=${3:-3}
py=${MC_PYTHON:-$here/.venv/bin/python}
mcp=$build/tools/mc-preprocess/mc-preprocess
corpus=/usr/share/doc/python3.11/html/_sources
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

files=("$corpus"/*.txt "$corpus"/*/*.txt)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" >&2
echo "corpus: ${#files[@]} files, $(cat "${files[@]}" | wc -c) bytes, read $repeat times per measurement" >&2

tok=$work/tok50257.json
t0=$(date +%s.%N)
"$mcp" --train-tokenizer --vocab-size 50257 --min-frequency 1 --input-format text --quiet --output "$tok" "${files[@]}" >/dev/null
t1=$(date +%s.%N)
printf 'mc tokenizer training, 50257 vocab: %.2f s\n' "$(echo "$t1 - $t0" | bc)"

# mc: whole process (load tokenizer, read, tokenize, write .bin/.idx); median of $repeat.
allfiles=()
for _ in $(seq "$repeat"); do allfiles+=("${files[@]}"); done
mc_time() {
    local w=$1 best=()
    for _ in 1 2 3; do
        local s e
        s=$(date +%s.%N)
        "$mcp" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" --input-format text \
            --workers "$w" --quiet --output-prefix "$work/out" "${allfiles[@]}" >/dev/null
        e=$(date +%s.%N)
        best+=("$(echo "$e - $s" | bc)")
    done
    printf '%s\n' "${best[@]}" | sort -n | sed -n 2p
}
mc_tokens() { "$mcp" --inspect "$work/out_text_document" | awk '/^tokens:/ {print $2}'; }

bytes=$(( $(cat "${files[@]}" | wc -c) * repeat ))
declare -A secs toks
for w in 1 $threads; do
    secs[mc-w$w]=$(mc_time "$w")
    toks[mc-w$w]=$(mc_tokens)
done
# Peers: tokenization only (file reading and tokenizer loading excluded), median of 3.
while read -r line; do
    peer=$(echo "$line" | sed 's/.*"peer": "\([^"]*\)".*/\1/')
    secs[$peer]=$(echo "$line" | sed 's/.*"seconds": \([0-9.e-]*\).*/\1/')
    toks[$peer]=$(echo "$line" | sed 's/.*"tokens": \([0-9]*\).*/\1/')
done < <("$py" "$here/bench/preprocess/tokenize_peers.py" "$tok" "$threads" 3 "${allfiles[@]}")

printf '\n%-16s %8s %10s %12s\n' program threads MB/s tokens
for k in mc-w1 mc-w$threads hf-tokenizers tiktoken; do
    t=${k#mc-w}; [ "$t" = "$k" ] && t=$threads
    printf '%-16s %8s %10.1f %12s\n' "$k" "$t" "$(echo "$bytes / ${secs[$k]} / 1000000" | bc -l)" "${toks[$k]}"
done
mc=${secs[mc-w$threads]}
printf '\nmc (%s threads) vs hf-tokenizers: %.2fx   (target >= 2x)\n' "$threads" "$(echo "${secs[hf-tokenizers]} / $mc" | bc -l)"
printf 'mc (%s threads) vs tiktoken:      %.2fx   (target >= 1x)\n' "$threads" "$(echo "${secs[tiktoken]} / $mc" | bc -l)"
printf 'mc scaling 1 -> %s workers:       %.2fx\n' "$threads" "$(echo "${secs[mc-w1]} / $mc" | bc -l)"
