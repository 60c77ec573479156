#!/bin/sh
# run.sh HARNESS... - what `make fuzz` runs (configure --enable-fuzzing): each
# libFuzzer harness of tests/fuzz for FUZZ_SECONDS (default 30), one at a
# time, in one process, on a corpus kept in tests/fuzz/work/corpus/NAME of
# the build directory and seeded from tests/data (the seeds are rebuilt each
# run, some with the fuzzing build's own tools). A crash, leak, UBSan report,
# timeout (-timeout=10 s per input) or allocation over 1 GiB
# (-malloc_limit_mb) is a finding: its input goes to
# tests/fuzz/work/artifacts/NAME/ and the exit status is 1. tests/fuzz/NAME.dict,
# where there is one, is its libFuzzer dictionary. FUZZ_ONLY=NAME
# runs the harnesses whose name contains NAME; FUZZ_FLAGS adds libFuzzer
# options. One summary line per harness: executions, seconds, findings.
set -u
: "${top_srcdir:?}" "${MC_BIN:?}"
secs=${FUZZ_SECONDS:-30}
only=${FUZZ_ONLY:-}
data=$top_srcdir/tests/data
work=$PWD/tests/fuzz/work
sep='
--mc-fuzz-file--
'
# Scratch files of the harnesses on tmpfs when there is one (fsync is free).
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then TMPDIR=/dev/shm; fi
export TMPDIR=${TMPDIR:-/tmp}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# pack OUT FILE...: the files joined with the harnesses' separator.
pack() {
    out=$1
    shift
    first=1
    : >"$out"
    for f in "$@"; do
        [ $first = 1 ] || printf '%s' "$sep" >>"$out"
        first=0
        cat "$f" >>"$out"
    done
}

# A tiny model, for the Hugging Face and safetensors seeds (made once).
model_seeds() {
    m=$work/model
    [ -f "$m/hf/config.json" ] && return 0
    rm -rf "$m" && mkdir -p "$m" || return 1
    for p in tiny-gpt tiny-llama; do
        "$MC_BIN/mc-train/mc-train" --model "$p" --mock-data --vocab-size 64 --seq-length 16 \
            --micro-batch-size 1 --global-batch-size 1 --train-iters 0 --lr 1e-3 --threads 1 \
            --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$data/tokenizer/hf_bytelevel.json" \
            --save "$m/$p" >/dev/null 2>"$m/train.log" ||
            "$MC_BIN/mc-train/mc-train" --model "$p" --mock-data --vocab-size 64 --seq-length 16 \
                --micro-batch-size 1 --global-batch-size 1 --train-iters 0 --lr 1e-3 --threads 1 \
                --save "$m/$p" >/dev/null 2>>"$m/train.log" || return 1
        "$MC_BIN/mc-export/mc-export" --format hf "$m/$p" -o "$m/hf-$p" >/dev/null &&
            "$MC_BIN/mc-export/mc-export" --format hf --max-shard-size 4KB "$m/$p" \
                -o "$m/hf-$p-sharded" >/dev/null || return 1
    done
    mv "$m/hf-tiny-gpt" "$m/hf"
}

# seeds NAME DIR: the seed corpus of one harness.
seeds() {
    name=$1 dir=$2
    rm -rf "$dir" && mkdir -p "$dir"
    case $name in
    fuzz_indexed)
        printf '%s\n' '{"text": "1 2 3"}' '{"text": "4 5"}' '{"text": "6"}' >"$dir/d.jsonl"
        "$MC_BIN/mc-preprocess/mc-preprocess" --tokenizer-type NullTokenizer --vocab-size 100 \
            --output-prefix "$dir/s" "$dir/d.jsonl" >/dev/null &&
            pack "$dir/seed1" "$dir/s_text_document.idx" "$dir/s_text_document.bin"
        "$MC_BIN/mc-preprocess/mc-preprocess" --tokenizer-type NullTokenizer --vocab-size 70000 \
            --output-prefix "$dir/w" "$dir/d.jsonl" >/dev/null &&
            pack "$dir/seed2" "$dir/w_text_document.idx" "$dir/w_text_document.bin"
        rm -f "$dir"/*.jsonl "$dir"/*_document.*
        ;;
    fuzz_tokenizer_hf)
        cp "$data"/tokenizer/hf_*.json "$data/sft/tokenizer.json" "$dir/" ;;
    fuzz_tokenizer_bpe)
        pack "$dir/gpt2" "$data/tokenizer/gpt2_vocab.json" "$data/tokenizer/gpt2_merges.txt" ;;
    fuzz_tiktoken)
        cp "$data/tokenizer/tiktoken.ranks" "$dir/"
        head -n 300 "$data/tokenizer/tiktoken.ranks" >"$dir/short" ;;
    fuzz_jsonl)
        for f in "$data"/eval/*.jsonl "$data"/sft/*.jsonl "$data"/dpo/*.jsonl; do
            cp "$f" "$dir/$(basename "$(dirname "$f")")-$(basename "$f")"
        done ;;
    fuzz_zst)
        for f in "$data"/eval/*.jsonl "$data"/sft/bad.jsonl; do
            zstd -q -c "$f" >"$dir/$(basename "$f").zst"
        done
        zstd -q -c --no-content-size "$data/eval/arc.jsonl" >"$dir/nosize.zst" ;;
    fuzz_argfile)
        cp "$data"/eval/*.args "$dir/"
        printf '%s\n' "--lr 1e-3 --data-path 0.3 A 0.7 B 'quoted word' \"x\\\"y\" # c" >"$dir/a1"
        printf '%s\n' '--flag @b @c' >"$work/a" && printf '%s\n' '@c @c' >"$work/b" &&
            printf '%s\n' '--lr=1 -o x' >"$work/c" && pack "$dir/nested" "$work/a" "$work/b" "$work/c" &&
            rm -f "$work/a" "$work/b" "$work/c" ;;
    fuzz_safetensors)
        model_seeds || return 1
        pack "$dir/one" "$work/model/hf/model.safetensors"
        sd=$work/model/hf-tiny-llama-sharded
        pack "$dir/sharded" "$sd"/model-00001-of-*.safetensors "$sd"/model-00002-of-*.safetensors \
            "$sd/model.safetensors.index.json"
        ;;
    fuzz_hf_config)
        model_seeds || return 1
        for p in hf hf-tiny-llama; do
            hd=$work/model/$p
            if [ -f "$hd/tokenizer.json" ]; then
                pack "$dir/$p" "$hd/config.json" "$hd/model.safetensors" "$hd/tokenizer.json"
            else
                pack "$dir/$p" "$hd/config.json" "$hd/model.safetensors"
            fi
        done ;;
    fuzz_ckpt)
        # the input is a list of choices: all zeros is the well-formed checkpoint
        head -c 256 /dev/zero >"$dir/zeros"
        { printf '\001\001'; head -c 254 /dev/zero; } >"$dir/sharded"
        { printf '\002\000\000\000\000\000\000\000\000\000\005'; head -c 245 /dev/zero; } >"$dir/tensors"
        ;;
    fuzz_chat_template)
        cp "$data"/chat_templates/*.jinja "$dir/" ;;
    esac
}

status=0
mkdir -p "$work"
for h in "$@"; do
    name=$(basename "$h")
    case $name in *"$only"*) ;; *) continue ;; esac
    corpus=$work/corpus/$name art=$work/artifacts/$name log=$work/$name.log
    mkdir -p "$corpus" "$art"
    if ! seeds "$name" "$work/seeds/$name"; then
        echo "$name: could not build the seeds (see $work)" >&2
        status=1
        continue
    fi
    before=$(ls "$art" | wc -l)
    dict=
    [ -f "$top_srcdir/tests/fuzz/$name.dict" ] && dict=-dict=$top_srcdir/tests/fuzz/$name.dict
    # shellcheck disable=SC2086
    ./"$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -print_final_stats=1 -artifact_prefix="$art/" $dict ${FUZZ_FLAGS:-} \
        "$corpus" "$work/seeds/$name" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    took=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    found=$(($(ls "$art" | wc -l) - before))
    echo "$name: ${execs:-?} executions in $secs s (${took:-?}/s), corpus $(ls "$corpus" | wc -l), findings $found"
    if [ $rc -ne 0 ] || [ "$found" -gt 0 ]; then
        echo "$name: libFuzzer exit status $rc; the report is in $log" >&2
        grep -m 3 -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" >&2
        status=1
    fi
done
exit $status
