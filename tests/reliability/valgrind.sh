#!/usr/bin/env bash
# tests/reliability/valgrind.sh [BUILD]: valgrind's memcheck over each
# tool's ordinary use on tiny inputs (issue 17, section 2): preprocessing
# (text, JSONL, a tokenizer's training, SFT conversations), training (GPT
# and Llama, a save and a resume), resharding (bf16, int8), exporting
# (Hugging Face, GGUF, llm.c), evaluating (perplexity, generation) and
# serving (requests, then SIGTERM). Every run must end with "ERROR
# SUMMARY: 0 errors" and its usual exit status; prints one line a run and
# a total, and exits 1 if any run has an error. Leaks are not counted
# here (LeakSanitizer's job: configure --enable-sanitizers); invalid reads
# and writes, uses of uninitialised values and bad frees are.
# Minutes on 2 cores; not part of make check.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
tools=$build/tools
lt="$build/libtool --mode=execute"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tok=$top/tests/data/tokenizer/hf_bytelevel.json
runs=0 bad=0

# vg NAME PROGRAM ARGS...: one run under memcheck, its log in NAME.vg
vg() {
    local name=$1 prog=$2 rc=0
    shift 2
    $lt valgrind -q --error-exitcode=99 --log-file="$name.vg" "$tools/$prog/$prog" "$@" \
        > "$name.out" 2> "$name.err" || rc=$?
    runs=$((runs + 1))
    local errs
    errs=$(grep -c "^==[0-9]*== [A-Z]" "$name.vg" || true)
    if [ "$rc" != 0 ] || [ "$errs" != 0 ]; then
        bad=$((bad + 1))
        echo "FAIL $name: exit $rc, $errs valgrind lines (first: $(grep -m1 "^==[0-9]*== [A-Z]" "$name.vg" || true))"
        tail -3 "$name.err"
    else
        echo "ok   $name"
    fi
}

printf 'the river flows under the old bridge\nand the model reads every line\n' > t.txt
printf '{"text": "a first document"}\n{"text": "and a second, longer one"}\n' > t.jsonl
vg preprocess-text mc-preprocess --input t.txt --input-format text --lines \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" --output-prefix d --quiet
vg preprocess-jsonl mc-preprocess --input t.jsonl --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$tok" --output-prefix j --append-eod --quiet
vg train-tokenizer mc-preprocess --train-tokenizer --vocab-size 300 --input-format text \
    --output tok.json --quiet t.txt
vg preprocess-sft mc-preprocess --dataset-type sft --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$top/tests/data/sft/tokenizer.json" --input "$top/tests/data/sft/chat.jsonl" \
    --output-prefix chat --quiet
common=(--seq-length 16 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 --eval-iters 0
        --threads 1 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok"
        --data-path d_text_document --split 100,0,0)
vg train-gpt mc-train --model tiny-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
    "${common[@]}" --train-iters 2 --save gpt
vg train-resume mc-train --model tiny-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
    "${common[@]}" --train-iters 3 --save gpt --load gpt
vg train-llama mc-train --model tiny-llama --num-layers 2 --hidden-size 32 \
    "${common[@]}" --train-iters 2 --save llama
vg reshard-bf16 mc-reshard --dtype bf16 -o gpt-bf16 gpt
vg reshard-int8 mc-reshard --quantize int8 -o gpt-int8 gpt
vg export-hf mc-export --format hf -o hf llama
vg export-gguf mc-export --format gguf -o m.gguf llama
vg export-llmc mc-export --format llmc -o m.bin gpt
vg import-hf mc-reshard -o imported hf
vg eval-ppl mc-eval gpt --text-file t.txt --threads 1
vg eval-generate mc-eval llama --prompt "the river" --max-new-tokens 4 --threads 1
# serving: a request, then SIGTERM (the URL line says it is ready)
mkfifo url
$lt valgrind -q --log-file=serve.vg "$tools/mc-serve/mc-serve" gpt --port 0 --threads 1 \
    > url 2> serve.err &
spid=$!
exec 5< url
read -r -t 300 u <&5 || true
exec 5<&-
curl -sf "$u/v1/completions" -d '{"prompt": "the river", "max_tokens": 4}' > serve.out || true
kill -TERM "$spid"
src=0
wait "$spid" || src=$?
runs=$((runs + 1))
if [ "$src" != 0 ] || grep -q "^==[0-9]*== [A-Z]" serve.vg || ! grep -q '"text"' serve.out; then
    bad=$((bad + 1))
    echo "FAIL serve: exit $src, $(grep -c "^==[0-9]*== [A-Z]" serve.vg || true) valgrind lines"
else
    echo "ok   serve"
fi
echo "valgrind memcheck: $runs runs, $bad with errors"
[ "$bad" = 0 ]
