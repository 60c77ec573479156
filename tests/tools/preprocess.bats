#!/usr/bin/env bats
# Tests of mc-preprocess as a user runs it: outputs, the pipeline contract,
# determinism across worker counts, and every bad input named in issue 2.

bats_require_minimum_version 1.5.0
load common

setup() {
    cd "$BATS_TEST_TMPDIR"
    printf '%s\n' '{"text": "1 2 3", "title": "7"}' '{"text": "4 5", "title": "8 9"}' \
        '{"text": "6", "title": "10"}' > ok.jsonl
}

null_args=(--tokenizer-type NullTokenizer --vocab-size 100)

@test "--help lists every option and exits 0; --version names the package" {
    run "$MC_PREPROCESS" --help
    assert_success
    for o in input input-format lines json-keys output-prefix tokenizer-type tokenizer-model \
             vocab-file merge-file vocab-size append-eod workers log-interval skip-invalid \
             max-document-bytes train-tokenizer output merge inspect show; do
        assert_output --partial "--$o"
    done
    run "$MC_PREPROCESS" --version
    assert_success
    assert_output --regexp '^mc-preprocess \(mc\) [0-9]+\.[0-9]+'
}

@test "bad usage exits 2 with one line naming the option" {
    run "$MC_PREPROCESS" --no-such-option
    assert_failure 2
    assert_output --partial "mc-preprocess: error:"
    assert_output --partial "no-such-option"
    run "$MC_PREPROCESS" "${null_args[@]}" --workers zero --output-prefix x ok.jsonl
    assert_failure 2
    assert_output --partial "--workers"
    run "$MC_PREPROCESS" ok.jsonl --output-prefix x
    assert_failure 2
    assert_output --partial "--tokenizer-type"
}

@test "stdout is exactly the dataset prefix; ids round-trip through --inspect --show" {
    run --separate-stderr "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out ok.jsonl
    assert_success
    assert_output "out_text_document"
    [ -s out_text_document.bin ] && [ -s out_text_document.idx ]
    # uint16 ids, 6 tokens -> 12 bytes
    [ "$(stat -c %s out_text_document.bin)" = 12 ]
    run "$MC_PREPROCESS" --inspect out_text_document --show 1
    assert_success
    assert_output "4 5"
    run "$MC_PREPROCESS" --inspect out_text_document
    assert_output --partial "documents:  3"
    assert_output --partial "tokens:     6"
    assert_output --partial "dtype:      uint16"
    assert_output --partial "min 1, mean 2.0, max 3"
    # six distinct ids, each once: ln 6 = 1.7918 nats
    assert_output --partial "unigram:    6 distinct ids, entropy 1.7918 nats/token"
    printf '%s\n' '{"text": "1 1 1 2"}' > skew.jsonl
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix skew skew.jsonl
    run "$MC_PREPROCESS" --inspect skew_text_document
    # p = (3/4, 1/4): -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.5623
    assert_output --partial "2 distinct ids, entropy 0.5623 nats/token"
}

@test "several --json-keys write one dataset per key; --append-eod adds the EOD id" {
    run --separate-stderr "$MC_PREPROCESS" "${null_args[@]}" --json-keys text,title --append-eod \
        --output-prefix out ok.jsonl
    assert_success
    assert_output $'out_text_document\nout_title_document'
    run "$MC_PREPROCESS" --inspect out_title_document --show 1
    assert_output "8 9 100"
    run "$MC_PREPROCESS" --inspect out_text_document --show 2
    assert_output "6 100"
}

@test "stdin, .zst and globs give the same dataset as the plain file" {
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix plain ok.jsonl
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix stdin - < ok.jsonl
    zstd -q ok.jsonl -o ok.jsonl.zst
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix zst ok.jsonl.zst
    head -n 2 ok.jsonl > part1.jsonl; tail -n 1 ok.jsonl > part2.jsonl
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix glob 'part*.jsonl'
    for p in stdin zst glob; do
        cmp plain_text_document.bin ${p}_text_document.bin
        cmp plain_text_document.idx ${p}_text_document.idx
    done
}

@test "output is byte-identical for 1, 2 and 5 workers on the demo corpus" {
    tok=$(small_tokenizer)
    for w in 1 2 5; do
        "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
            --input-format text --append-eod --workers $w --quiet --output-prefix w$w \
            "$DOCS"/library/[a-c]*.txt
    done
    cmp w1_text_document.bin w2_text_document.bin
    cmp w1_text_document.bin w5_text_document.bin
    cmp w1_text_document.idx w2_text_document.idx
    cmp w1_text_document.idx w5_text_document.idx
}

@test "text documents decode back to the original bytes, invalid UTF-8 included" {
    tok=$(small_tokenizer)
    printf 'caf\xc3\xa9 \xff\xfe broken \xe2\x82 bytes\n\tend' > doc.txt
    cp "$DOCS/tutorial/classes.rst.txt" doc2.txt
    "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
        --input-format text --output-prefix rt doc.txt doc2.txt
    "$MC_PREPROCESS" --inspect rt_text_document --show 0 --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$tok" > back.txt
    # --show adds a final newline when the text lacks one
    printf '\n' >> doc.txt
    cmp doc.txt back.txt
    "$MC_PREPROCESS" --inspect rt_text_document --show 1 --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$tok" > back2.txt
    cmp doc2.txt back2.txt
}

@test "tokenizer options may come before --tokenizer-type" {
    ranks="$top_srcdir/tests/data/tokenizer/tiktoken.ranks"
    printf 'hello world\n' > hw.txt
    tik=(--input-format text --tokenizer-model "$ranks" --tiktoken-pattern v1)
    "$MC_PREPROCESS" --tiktoken-num-special-tokens 10 --tokenizer-type TikTokenizer "${tik[@]}" \
        --output-prefix early hw.txt
    "$MC_PREPROCESS" --tokenizer-type TikTokenizer --tiktoken-num-special-tokens 10 "${tik[@]}" \
        --output-prefix late hw.txt
    "$MC_PREPROCESS" --tokenizer-type TikTokenizer "${tik[@]}" --output-prefix default hw.txt
    cmp early_text_document.bin late_text_document.bin
    # the default 1000 special ids shift every id: the option was not lost
    ! cmp -s early_text_document.bin default_text_document.bin
}

@test "--lines makes one document per line; blank lines are not documents" {
    printf '1 2\n3\n\n4 5 6\n\n' > ids.txt
    "$MC_PREPROCESS" "${null_args[@]}" --input-format text --lines --output-prefix l ids.txt
    run "$MC_PREPROCESS" --inspect l_text_document
    assert_output --partial "documents:  3"
    assert_output --partial "tokens:     6"
}

@test "@FILE argument files hold options" {
    printf -- '--tokenizer-type NullTokenizer\n# a comment\n--vocab-size 100 --output-prefix "at file"\n' > args.txt
    run --separate-stderr "$MC_PREPROCESS" @args.txt ok.jsonl
    assert_success
    assert_output "at file_text_document"
}

@test "--merge concatenates datasets; the result equals preprocessing all inputs at once" {
    head -n 2 ok.jsonl > a.jsonl; tail -n 1 ok.jsonl > b.jsonl
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix a a.jsonl
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix b b.jsonl
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix all ok.jsonl
    run --separate-stderr "$MC_PREPROCESS" --merge a_text_document b_text_document --output-prefix m
    assert_success
    assert_output "m"
    cmp m.bin all_text_document.bin
    cmp m.idx all_text_document.idx
}

# ---------------------------------------------------------------- bad input

@test "malformed JSON: error names file and line, exit 1, no output; --skip-invalid counts it" {
    printf '%s\n' '{"text": "1"}' '{"text": "2"' '{"text": "3"}' > bad.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out bad.jsonl
    assert_failure 1
    assert_output --regexp '^mc-preprocess: error: bad.jsonl:2: invalid JSON'
    assert_no_dataset out_
    run "$MC_PREPROCESS" "${null_args[@]}" --skip-invalid --output-prefix out bad.jsonl
    assert_success
    assert_output --partial "skipped 1 invalid records"
    run "$MC_PREPROCESS" --inspect out_text_document
    assert_output --partial "documents:  2"
}

@test "missing JSON key and non-string value are errors naming the line" {
    printf '%s\n' '{"text": "1"}' '{"body": "2"}' > nokey.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out nokey.jsonl
    assert_failure 1
    assert_output --partial "nokey.jsonl:2: missing key 'text'"
    printf '%s\n' '{"text": 12}' > num.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out num.jsonl
    assert_failure 1
    assert_output --partial "num.jsonl:1: key 'text' is a number, expected a string"
    assert_no_dataset out_
}

@test "invalid UTF-8 inside JSON is an error naming the line" {
    printf '{"text": "1"}\n{"text": "a\xff"}\n' > badutf.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out badutf.jsonl
    assert_failure 1
    assert_output --partial "badutf.jsonl:2:"
    assert_output --partial "UTF-8"
    assert_no_dataset out_
}

@test "an empty document is an error; --skip-invalid skips and counts it" {
    printf '%s\n' '{"text": "1"}' '{"text": ""}' > empty.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out empty.jsonl
    assert_failure 1
    assert_output --partial "empty.jsonl:2: empty document"
    assert_no_dataset out_
    run "$MC_PREPROCESS" "${null_args[@]}" --skip-invalid --output-prefix out empty.jsonl
    assert_success
    assert_output --partial "1 empty documents"
    : > empty.txt
    run "$MC_PREPROCESS" "${null_args[@]}" --input-format text --output-prefix out2 empty.txt
    assert_failure 1
    assert_output --partial "empty.txt: empty document"
}

@test "a 200 MB single line is refused with the line number, memory bounded" {
    { printf '{"text": "'; head -c 200000000 /dev/zero | tr '\0' 'a'; printf '"}\n'; } > big.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out big.jsonl
    assert_failure 1
    assert_output --partial "big.jsonl:1: record longer than"
    assert_no_dataset out_
    rm -f big.jsonl
}

@test "a truncated .zst is an error naming the file" {
    seq 1 20000 | sed 's/.*/{"text": "&"}/' | zstd -q -c > full.jsonl.zst
    head -c $(( $(stat -c %s full.jsonl.zst) / 2 )) full.jsonl.zst > cut.jsonl.zst
    run "$MC_PREPROCESS" "${null_args[@]}" --vocab-size 30000 --output-prefix out cut.jsonl.zst
    assert_failure 1
    assert_output --partial "cut.jsonl.zst: truncated zstd"
    assert_no_dataset out_
}

@test "bad tokenizer files: not JSON, no model.vocab, unknown merge token" {
    printf '{"model": {"type": "BPE", ' > notjson.json
    run "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer --tokenizer-model notjson.json --output-prefix out ok.jsonl
    assert_failure 1
    assert_output --regexp 'notjson.json:[0-9]+:[0-9]+: invalid JSON'
    printf '{"model": {"type": "BPE", "merges": []}}' > novocab.json
    run "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer --tokenizer-model novocab.json --output-prefix out ok.jsonl
    assert_failure 1
    assert_output --partial "novocab.json: missing model.vocab"
    printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a zz"]}}' > badmerge.json
    run "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer --tokenizer-model badmerge.json --output-prefix out ok.jsonl
    assert_failure 1
    assert_output --partial "badmerge.json"
    assert_output --partial "model.merges[1]"
    assert_output --partial "zz"
    assert_no_dataset out_
}

@test "a missing output directory is refused before reading input" {
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix no/such/dir/out ok.jsonl
    assert_failure 1
    assert_output --partial "no/such/dir"
    [ ! -e no ]
}

@test "a missing input file is refused" {
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix out missing.jsonl
    assert_failure 1
    assert_output --partial "missing.jsonl"
    assert_no_dataset out_
}

@test "a full disk (file-size limit) fails cleanly and leaves nothing" {
    seq 1 200000 | sed 's/.*/{"text": "& & & &"}/' > many.jsonl
    run bash -c "ulimit -f 64; '$MC_PREPROCESS' --tokenizer-type NullTokenizer --vocab-size 300000 --output-prefix out many.jsonl"
    assert_failure 1
    assert_output --partial "out_text_document.bin"
    assert_output --partial "File too large"
    assert_no_dataset out_
}

@test "an existing dataset survives a failed run unchanged" {
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix keep ok.jsonl
    cp keep_text_document.bin before.bin
    printf '%s\n' '{"text": "1"}' 'oops' > bad.jsonl
    run "$MC_PREPROCESS" "${null_args[@]}" --output-prefix keep bad.jsonl
    assert_failure 1
    cmp before.bin keep_text_document.bin
    run bash -c "ls keep_text_document.*.tmp* 2>/dev/null"
    assert_output ""
}

@test "--inspect and --merge reject a corrupt or truncated .idx" {
    "$MC_PREPROCESS" "${null_args[@]}" --output-prefix good ok.jsonl
    cp good_text_document.bin magic.bin; { printf 'NOTMAGIC!'; tail -c +10 good_text_document.idx; } > magic.idx
    run "$MC_PREPROCESS" --inspect magic
    assert_failure 1
    assert_output --partial "magic.idx"
    assert_output --partial "magic"
    cp good_text_document.bin trunc.bin; head -c 40 good_text_document.idx > trunc.idx
    run "$MC_PREPROCESS" --inspect trunc
    assert_failure 1
    assert_output --partial "trunc.idx"
    run "$MC_PREPROCESS" --merge good_text_document trunc --output-prefix m
    assert_failure 1
    assert_output --partial "trunc.idx"
    assert_no_dataset m.
    cp good_text_document.idx short.idx; head -c 4 good_text_document.bin > short.bin
    run "$MC_PREPROCESS" --inspect short
    assert_failure 1
    assert_output --partial "short.bin"
}
