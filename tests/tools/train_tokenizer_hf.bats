#!/usr/bin/env bats
# train_tokenizer_hf.bats - a tokenizer.json trained by
# `mc-preprocess --train-tokenizer` loads in Hugging Face tokenizers, has the
# size asked for, and encodes every text to the same ids there as in mc
# (tests/unit/encode_ids); both decode the ids back to the text.
#
# Needs the demo corpus (python3.11-doc) and a Python with `tokenizers`
# ($MC_PYTHON, see common.bash); each test skips, saying why, without them.

bats_require_minimum_version 1.5.0
load common

setup() {
    require_python_module tokenizers
    [ -d "$DOCS" ] || skip "demo corpus $DOCS missing (Debian package python3.11-doc)"
    ENCODE="$top_builddir/tests/unit/encode_ids"
    CHECK="$top_srcdir/tests/golden/check_hf_tokenizer.py"
    TEXTS="$top_srcdir/tests/data/hf_check_texts.txt"
    cd "$BATS_TEST_TMPDIR"
    # Lines of documents the tokenizer was not trained on, as a second text.
    cat "$DOCS/library/os.rst.txt" "$DOCS/whatsnew/3.11.rst.txt" > docs.txt
}

# train VOCAB OUT [options...]: train on the tutorial, print nothing.
train() {
    local vocab=$1 out=$2
    shift 2
    run "$MC_PREPROCESS" --train-tokenizer --vocab-size "$vocab" --output "$out" \
        --input-format text --quiet "$@" "$DOCS"/tutorial/*.txt
    assert_success
    assert_output "$out"
}

# same_ids TOKENIZER VOCAB TEXTFILE: HF and mc give the same ids, line by line.
same_ids() {
    run "$MC_PYTHON" "$CHECK" --vocab-size "$2" "$1" "$3"
    assert_success
    echo "$output" > hf.ids
    run "$ENCODE" --roundtrip "$1" < "$3"
    assert_success
    echo "$output" > mc.ids
    [ "$(wc -l < hf.ids)" -eq "$(wc -l < "$3")" ]
    run diff hf.ids mc.ids
    assert_success
}

@test "GPT-2 pattern, 1000 tokens: HF loads it, same ids as mc, round trip" {
    train 1000 T.json
    same_ids T.json 1000 "$TEXTS"
    same_ids T.json 1000 docs.txt
}

@test "Llama-3 pattern and two special tokens: same ids as mc" {
    train 1000 L.json --tokenizer-pattern llama3 --special-tokens '<|endoftext|>,<|pad|>'
    run "$MC_PYTHON" -c 'import sys; from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1])
print(t.token_to_id("<|endoftext|>"), t.token_to_id("<|pad|>"))' L.json
    assert_success
    assert_output "998 999"
    same_ids L.json 1000 "$TEXTS"
    same_ids L.json 1000 docs.txt
}

@test "training twice gives byte-identical files" {
    train 700 a.json
    train 700 b.json
    cmp a.json b.json
}

@test "the whole demo corpus, 32000 tokens: same ids as mc" {
    run "$MC_PREPROCESS" --train-tokenizer --vocab-size 32000 --output big.json \
        --input-format text --quiet "$DOCS"/*.txt "$DOCS"/*/*.txt
    assert_success
    same_ids big.json 32000 "$TEXTS"
    same_ids big.json 32000 docs.txt
}
