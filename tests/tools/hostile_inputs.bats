#!/usr/bin/env bats
# hostile_inputs.bats - the inputs the fuzzing campaign found (make fuzz,
# tests/fuzz; issue 17, section 1) and the crafted files of section 5, each
# fed to the tool a user would run: no crash, no allocation a header's
# claim decides, no path out of the directory; one error line and exit 1
# where the input is wrong. The inputs are in tests/data/fuzz (README.md
# there says where each came from).

bats_require_minimum_version 1.5.0
load common

FZ="$top_srcdir/tests/data/fuzz"
MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"

setup() {
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

@test "--inspect: a large id costs no count table as long as the id (fuzz_indexed)" {
    # The unigram statistics counted ids in a table as long as the largest
    # id (8 GiB here); under a 4 GB address-space limit that table could not
    # be had. (Under 1 GB the start-up of the libraries mc links spun for
    # minutes on some machines: the limit leaves them room.)
    [ -z "${MC_SAN_DIR:-}" ] ||
        skip "under the sanitizers: ASan reserves terabytes of shadow address space, so no address-space limit can apply"
    run -0 timeout 120 bash -c "ulimit -v 4000000; '$MC_PREPROCESS' --inspect '$FZ/idx_big_id'"
    assert_output --partial "tokens:     6"
    assert_output --partial "unigram:    6 distinct ids, entropy 1.7918 nats/token"
}

# ---- section 5: sizes from headers are checked against the file before
# anything is allocated for them

@test "a checkpoint tensor claiming 2^40 elements is refused in one line" {
    # model.h5 of 6 KiB whose embedding dataset is [2^20, 2^20], chunked,
    # no chunk written (crafted with h5py; no manifest, so it loads unchecked)
    run -1 "$MC_RESHARD" --dtype bf16 "$FZ/ckpt_huge_tensor" -o out
    assert_output "mc-reshard: error: $FZ/ckpt_huge_tensor/iter_0000000/model.h5: model/embedding.word_embeddings.weight: shape [1048576, 1048576] needs 4398046511104 bytes, the file stores 0"
    [ ! -e out ]
}

@test "a checkpoint whose config.model claims more layers than it stores is refused before the model is built" {
    # num_layers 2^20 in config.model; the file holds one layer
    run -1 "$MC_EXPORT" --format hf "$FZ/ckpt_config_layers" -o out
    assert_output "mc-export: error: $FZ/ckpt_config_layers/iter_0000000/model.h5: config.model implies the tensor model/decoder.layers.1.self_attention.linear_qkv.weight, which the file does not hold"
    run -1 "$MC_EVAL" "$FZ/ckpt_config_layers" --prompt hi --max-new-tokens 1
    assert_output --partial "config.model implies the tensor model/decoder.layers.1.self_attention.linear_qkv.weight"
    [ ! -e out ]
}

# sharded CKPT_INDEX: the sharded checkpoint of tests/data/fuzz with index.h5
# replaced by tests/data/fuzz/CKPT_INDEX (its shard_index edited with h5py).
sharded() {
    cp -r "$FZ/ckpt_sharded" c
    chmod -R u+w c
    cp "$FZ/$1" c/iter_0000000/index.h5
}

@test "a sharded checkpoint's index: blocks claiming 2^40 elements or overflowing int64 are refused" {
    run -0 "$MC_RESHARD" --dtype bf16 "$FZ/ckpt_sharded" -o ok
    sharded index_huge_block.h5
    run -1 "$MC_RESHARD" --dtype bf16 c -o out
    assert_output "mc-reshard: error: c/iter_0000000/index.h5: shard_index: model/decoder.final_layernorm.weight: block 0 needs 4398046511104 bytes, more than c/iter_0000000/mp_rank_00_001.h5 can hold (14188 bytes)"
    rm -rf c
    # shape [2^63-1] in two blocks whose ends overflow: no signed overflow, refused
    sharded index_overflow.h5
    run -1 "$MC_RESHARD" --dtype bf16 c -o out
    assert_output "mc-reshard: error: c/iter_0000000/index.h5: shard_index: model/decoder.final_layernorm.weight: its blocks do not tile the tensor"
    [ ! -e out ]
}

# ---- section 5: no path read from a file leads out of its directory

@test "a sharded checkpoint's index naming ../ or an absolute path is refused" {
    sharded index_dotdot.h5
    run -1 "$MC_RESHARD" --dtype bf16 c -o out
    assert_output "mc-reshard: error: c/iter_0000000/index.h5: shard_index: file 0 is not a plain file name"
    rm -rf c
    sharded index_absolute.h5
    run -1 "$MC_EXPORT" --format hf c -o out
    assert_output "mc-export: error: c/iter_0000000/index.h5: shard_index: file 1 is not a plain file name"
    [ ! -e out ]
}

# hf_dir DIR WEIGHT_FILE: a Hugging Face directory (the tiny GPT-2 config of
# tests/data/fuzz) whose index maps its first tensor to WEIGHT_FILE.
hf_dir() {
    mkdir "$1"
    cp "$FZ/hf_config.json" "$1/config.json"
    : >"$1/model-00001-of-00001.safetensors"
    printf '{"metadata": {}, "weight_map": {"transformer.wte.weight": "%s"}}\n' "$2" \
        >"$1/model.safetensors.index.json"
}

@test "model.safetensors.index.json: a weight_map entry with ../, an absolute path, . or .. is refused" {
    mkdir -p outside && : >outside/model.safetensors
    for f in ../outside/model.safetensors /etc/passwd .. .; do
        rm -rf hf
        hf_dir hf "$f"
        run -1 "$MC_RESHARD" --quiet --dtype bf16 hf -o out
        assert_output "mc-reshard: error: hf/model.safetensors.index.json: weight_map: 'transformer.wte.weight' does not name a file in the directory"
    done
    [ ! -e out ]
}

@test "a safetensors header claiming 2^40 elements is refused in one line" {
    mkdir hf
    cp "$FZ/hf_config.json" hf/config.json
    h='{"transformer.wte.weight":{"dtype":"F32","shape":[1048576,1048576],"data_offsets":[0,4398046511104]}}'
    # the header's length, 8 bytes little-endian (< 256 here)
    printf "$(printf '\\%03o' ${#h})\\0\\0\\0\\0\\0\\0\\0%s" "$h" >hf/model.safetensors
    run -1 "$MC_RESHARD" --quiet --dtype bf16 hf -o out
    assert_output "mc-reshard: error: hf/model.safetensors: header: tensor 'transformer.wte.weight': data_offsets [0, 4398046511104] outside the data (0 bytes)"
    [ ! -e out ]
}

@test "a stored tokenizer whose tiktoken_special_tokens holds a number is refused, not a crash" {
    # attribute tokenizer = {"type": "TikTokenizer", ..., "tiktoken_special_tokens": [1, "<s>", "</s>"]}:
    # mc-eval and mc-export died of SIGSEGV (strlen of NULL) loading it
    run -1 "$MC_EVAL" "$FZ/ckpt_tiktoken_special" --prompt hi --max-new-tokens 1
    assert_output "mc-eval: error: $FZ/ckpt_tiktoken_special/iter_0000000/model.h5: attribute tokenizer: tiktoken_special_tokens[0] is not a string"
    run -1 "$MC_EXPORT" --format gguf "$FZ/ckpt_tiktoken_special" -o m.gguf
    assert_output "mc-export: error: $FZ/ckpt_tiktoken_special/iter_0000000/model.h5: attribute tokenizer: tiktoken_special_tokens[0] is not a string"
    [ ! -e m.gguf ]
}

@test "@argument files naming each other many times are refused past 2^20 words, not expanded without bound" {
    # a: 1100 words @b; b: 1000 words: 1.1 million words
    for i in $(seq 1100); do printf '@b '; done >a
    for i in $(seq 1000); do printf 'x '; done >b
    run -2 "$MC_PREPROCESS" @a
    assert_output "mc-preprocess: error: b:1: argument files expand to more than 1048576 words"
}

@test "chat templates that would loop for hours stop at the render limit, one line" {
    # chat_loops.jinja: three loops over a list of 30000 (2.7e13 iterations,
    # no allocation per iteration) ran until killed; chat_macro_fanout.jinja:
    # a macro calling itself twice, 40 deep
    head -n 1 "$top_srcdir/tests/data/sft/chat.jsonl" >one.jsonl
    for t in chat_loops chat_macro_fanout; do
        run -1 "$MC_PREPROCESS" --dataset-type sft --tokenizer-type HuggingFaceTokenizer \
            --tokenizer-model "$top_srcdir/tests/data/sft/tokenizer.json" --quiet \
            --input one.jsonl --output-prefix o --chat-template "$FZ/$t.jinja"
        assert_output --regexp "^mc-preprocess: error: one.jsonl:1: $FZ/$t.jinja:1: .*\(render limit\)$"
    done
    run -1 "$MC_PREPROCESS" --dataset-type sft --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$top_srcdir/tests/data/sft/tokenizer.json" --quiet \
        --input one.jsonl --output-prefix o --chat-template "$FZ/chat_loops.jinja"
    assert_output "mc-preprocess: error: one.jsonl:1: $FZ/chat_loops.jinja:1: more than 16777216 loop iterations and macro calls (render limit)"
    run bash -c "ls o_* 2>/dev/null"
    assert_output ""
}

@test "an .idx header claiming 2^40 sequences is refused against the file's size" {
    # magic, version 1, dtype 4 (int32), 2^40 sequences, 1 document index
    printf 'MMIDIDX\0\0\1\0\0\0\0\0\0\0\4\0\0\0\0\0\1\0\0\1\0\0\0\0\0\0\0' >big.idx
    : >big.bin
    run -1 "$MC_PREPROCESS" --inspect big
    assert_output "mc-preprocess: error: big.idx: file is 34 bytes but header counts need 13194139533354 (1099511627776 sequences, 1 document indices)"
}
