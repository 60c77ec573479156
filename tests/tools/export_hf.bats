#!/usr/bin/env bats
# export_hf.bats - mc-export --format hf: the directory's tensors are the
# checkpoint's, mapped and converted as tests/golden/hf_check_export.py
# re-derives them with numpy + h5py + safetensors (byte for byte, fp32 /
# bf16 / fp16, GPT-2 and Llama with GQA, biases, tied and untied, sharded);
# config.json, generation_config.json and the tokenizer's files; the
# pipeline contract; refusals with the reason; usage errors; nothing left
# behind on failure. transformers' logits are in export_hf_logits.bats.
#
# The layout checks need numpy, h5py and safetensors in $MC_PYTHON (see
# common.bash); they skip, saying why, without them.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
CHECK="$top_srcdir/tests/golden/hf_check_export.py"
TOK="$top_srcdir/tests/data/tokenizer"

# Ten iterations at a high rate, so biases and norm weights are not their
# initial 0 and 1 (a mix-up of them shows).
run_args=(--seq-length 16 --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-2
          --log-interval 10 --eval-iters 0 --train-iters 10)

setup() {
    # a directory of its own: bats keeps --separate-stderr files in the tmpdir
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

# train DIR ARGS...: a checkpoint; prints nothing.
train() {
    local dir=$1
    shift
    "$MC_TRAIN" "$@" "${run_args[@]}" --save "$dir" >/dev/null 2>&1
}

check() {
    require_python_module safetensors
    require_python_module h5py
    run "$MC_PYTHON" "$CHECK" "$@"
    echo "$output"
    assert_success
}

@test "--help lists every option; --version names the package" {
    run -0 "$MC_EXPORT" --help
    for o in format output dtype max-shard-size quiet; do
        assert_output --partial -- "--$o"
    done
    assert_output --partial "-o, --output"
    run -0 "$MC_EXPORT" --version
    assert_output --regexp '^mc-export \(mc\) [0-9]+\.[0-9]+'
}

@test "bad usage exits 2 with one line naming the problem, writing nothing" {
    train g --model tiny-gpt --mock-data --vocab-size 64
    run -2 "$MC_EXPORT" g -o out
    assert_output --partial "mc-export: error: --format is required"
    run -2 "$MC_EXPORT" g --format onnx -o out
    assert_output "mc-export: error: --format: expected hf, llmc or gguf, got 'onnx' (try 'mc-export --help')"
    run -2 "$MC_EXPORT" g --format hf
    assert_output --partial "-o/--output is required"
    run -2 "$MC_EXPORT" g --format hf -o out --dtype fp8
    assert_output --partial "--dtype: --format hf takes fp32, fp16 or bf16, got 'fp8'"
    run -2 "$MC_EXPORT" g --format llmc -o out --dtype fp16
    assert_output --partial "--dtype: --format llmc takes fp32 or bf16, got 'fp16'"
    run -2 "$MC_EXPORT" g --format hf -o out --max-shard-size lots
    assert_output --partial "--max-shard-size"
    run -2 "$MC_EXPORT" g --format llmc -o out --max-shard-size 1GB
    assert_output --partial "--max-shard-size applies to --format hf only"
    run -2 "$MC_EXPORT" g g --format hf -o out
    assert_output --partial "one checkpoint at a time"
    run -2 "$MC_EXPORT" --format hf -o out < <(:)
    assert_output --partial "stdin: no checkpoint path"
    [ ! -e out ]
}

@test "GPT-2: every tensor byte for byte, config.json, stdout is the path only" {
    train g --model tiny-gpt --mock-data --vocab-size 64
    run --separate-stderr "$MC_EXPORT" g --format hf -o out
    assert_success
    assert_output "out"
    [[ "$stderr" == *"no tokenizer files written"* ]]
    [ -f out/model.safetensors ] && [ -f out/config.json ] && [ -f out/generation_config.json ]
    check g/iter_0000010/model.h5 out
    assert_output "GPT2LMHeadModel: 28 tensors checked, 0 differ"
    # the padded vocabulary (128 rows in the checkpoint) is trimmed to 64
    run -0 grep -c '"vocab_size": 64,' out/config.json
    # nothing temporary is left beside it
    run ls -A
    assert_output $'g\nout'
}

@test "GPT-2 in bf16 and fp16, untied, from a pipe" {
    train g --model tiny-gpt --mock-data --vocab-size 200 --untie-embeddings-and-output-weights
    run -0 bash -c "echo g/iter_0000010 | '$MC_EXPORT' --format hf -o b16 --dtype bf16 --quiet"
    assert_output "b16"
    check g/iter_0000010/model.h5 b16 BF16
    assert_output "GPT2LMHeadModel: 29 tensors checked, 0 differ"
    run -0 grep '"torch_dtype": "bfloat16"' b16/config.json
    run -0 grep '"tie_word_embeddings": false' b16/config.json
    run -0 "$MC_EXPORT" - --format hf -o f16 --dtype fp16 --quiet <<< g
    check g/iter_0000010/model.h5 f16 F16
}

@test "Llama with GQA: q/k/v and gate/up split, sharded at 20KB with an index" {
    train l --model tiny-llama --mock-data --vocab-size 100
    run -0 "$MC_EXPORT" l --format hf -o out --quiet --max-shard-size 20KB
    check l/iter_0000010/model.h5 out
    assert_output "LlamaForCausalLM: 21 tensors checked, 0 differ"
    [ -f out/model.safetensors.index.json ] && [ ! -f out/model.safetensors ]
    run ls out
    assert_output --partial "model-00001-of-000"
    # every shard holds at most 20000 data bytes unless one tensor is bigger
    # (the 100 x 64 fp32 embeddings: 25600 bytes), as transformers shards
    require_python_module numpy
    run -0 "$MC_PYTHON" - out <<'EOF'
import glob, json, os, sys
for f in glob.glob(os.path.join(sys.argv[1], "model-*.safetensors")):
    n = int.from_bytes(open(f, "rb").read(8), "little")
    h = json.loads(open(f, "rb").read(8 + n)[8:])
    sizes = [v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__"]
    assert sum(sizes) <= 20000 or len(sizes) == 1, (f, sizes)
idx = json.load(open(os.path.join(sys.argv[1], "model.safetensors.index.json")))
print(len(idx["weight_map"]), idx["metadata"]["total_size"])
EOF
    assert_output "21 347392"
    for k in '"num_key_value_heads": 2' '"head_dim": 16' '"rope_theta": 10000.0' \
             '"rms_norm_eps": 1e-5' '"tie_word_embeddings": false' '"attention_bias": false'; do
        grep -q "$k" out/config.json
    done
}

@test "Llama family with biases, tied embeddings and --rotary-base 500000" {
    train l --model tiny-gpt --normalization RMSNorm --swiglu --position-embedding-type rope \
        --rotary-base 500000 --mock-data --vocab-size 96
    run -0 "$MC_EXPORT" l --format hf -o out --quiet
    check l/iter_0000010/model.h5 out
    assert_output "LlamaForCausalLM: 34 tensors checked, 0 differ"
    grep -q '"rope_theta": 500000.0' out/config.json
    grep -q '"mlp_bias": true' out/config.json
    grep -q '"tie_word_embeddings": true' out/config.json
}

@test "a HuggingFaceTokenizer goes out as the same tokenizer.json, with its end of document" {
    train g --model tiny-gpt --mock-data --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$TOK/hf_bytelevel.json"
    run --separate-stderr "$MC_EXPORT" g --format hf -o out
    assert_success
    [ -z "$stderr" ]
    cmp out/tokenizer.json "$TOK/hf_bytelevel.json"
    grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' out/tokenizer_config.json
    grep -q '"eos_token": "<|endoftext|>"' out/tokenizer_config.json
    grep -q '"eos_token_id": 0' out/config.json
    grep -q '"eos_token_id": 0' out/generation_config.json
    grep -q '"vocab_size": 2002' out/config.json
}

@test "a GPT2BPETokenizer goes out as vocab.json and merges.txt; NullTokenizer is said to be left out" {
    train g --model tiny-gpt --mock-data --tokenizer-type GPT2BPETokenizer \
        --vocab-file "$TOK/gpt2_vocab.json" --merge-file "$TOK/gpt2_merges.txt"
    run -0 "$MC_EXPORT" g --format hf -o out
    cmp out/vocab.json "$TOK/gpt2_vocab.json"
    cmp out/merges.txt "$TOK/gpt2_merges.txt"
    grep -q '"tokenizer_class": "GPT2Tokenizer"' out/tokenizer_config.json
    [ ! -e out/tokenizer.json ]
    train n --model tiny-gpt --mock-data --tokenizer-type NullTokenizer --vocab-size 64
    run --separate-stderr "$MC_EXPORT" n --format hf -o nout
    assert_success
    assert_output "nout"
    [[ "$stderr" == *"tokenizer NullTokenizer has no Hugging Face form mc writes"* ]]
    run ls nout
    assert_output $'config.json\ngeneration_config.json\nmodel.safetensors'
}

@test "a TikTokenizer goes out as a tokenizer.json that encodes and decodes as mc does" {
    require_python_module tokenizers
    train t --model tiny-gpt --mock-data --tokenizer-type TikTokenizer \
        --tokenizer-model "$TOK/tiktoken.ranks"
    run --separate-stderr "$MC_EXPORT" t --format hf -o out
    assert_success
    [ -z "$stderr" ]
    grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' out/tokenizer_config.json
    grep -q '"split_special_tokens": true' out/tokenizer_config.json
    grep -q '"eos_token": "</s>"' out/tokenizer_config.json
    grep -q '"eos_token_id": 2' out/config.json
    # every line of the golden corpus, and special-token text (Megatron's
    # TikTokenizer encodes it as plain text): the ids of mc's own encoder
    # (encode_ids) and of the tokenizers package on the exported file; the
    # ids decode back to the line
    run -0 "$MC_PYTHON" - "$top_builddir/tests/unit/encode_ids" "$TOK/tiktoken.ranks" \
        out/tokenizer.json "$TOK/corpus.json" <<'PY'
import json, subprocess, sys
from tokenizers import Tokenizer
enc, ranks, tj, corpus = sys.argv[1:5]
lines = [l for t in json.load(open(corpus))["texts"] for l in t.split("\n") if l]
lines += ["text with <s>, </s> and <unk> inside", "<SPECIAL_7> x"]
out = subprocess.run([enc, "--type", "TikTokenizer", ranks], input="\n".join(lines) + "\n",
                     capture_output=True, text=True, check=True).stdout.split("\n")
tok = Tokenizer.from_file(tj)
tok.encode_special_tokens = True  # what transformers' split_special_tokens does
bad = [l for l, o in zip(lines, out)
       if list(map(int, o.split())) != tok.encode(l, add_special_tokens=False).ids
       or tok.decode(list(map(int, o.split())), skip_special_tokens=False) != l]
print(len(lines), "lines", len(bad), "differ", bad[:3])
sys.exit(1 if bad or len(out) < len(lines) else 0)
PY
    echo "$output"
    [[ "$output" == *" 0 differ"* ]]
}

@test "what the formats cannot express is refused with the reason, leaving nothing" {
    train a --model tiny-gpt --normalization RMSNorm --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" a --format hf -o out
    assert_output "mc-export: error: a/iter_0000010/model.h5: GPT2LMHeadModel (the format for learned absolute positions) needs LayerNorm; this model has RMSNorm"
    train b --model tiny-gpt --disable-bias-linear --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" b --format hf -o out
    assert_output --partial "needs biases in every linear layer; this model has none"
    train c --model tiny-gpt --group-query-attention --num-query-groups 2 --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" c --format hf -o out
    assert_output --partial "needs one key/value head per query head; this model has grouped-query attention"
    train d --model tiny-gpt --swiglu --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" d --format hf -o out
    assert_output --partial "needs a GELU MLP; this model has SwiGLU"
    train e --model tiny-gpt --position-embedding-type rope --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" e --format hf -o out
    assert_output --partial "LlamaForCausalLM (the format for rotary positions) needs RMSNorm; this model has LayerNorm"
    run ls -A
    assert_output $'a\nb\nc\nd\ne'
}

@test "a missing checkpoint, an unwritable or foreign output: exit 1, nothing left" {
    train g --model tiny-gpt --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" nope --format hf -o out
    assert_output --partial "mc-export: error: nope"
    run -1 "$MC_EXPORT" g --format hf -o missing/dir/out
    assert_output --partial "missing/dir/out"
    touch afile
    run -1 "$MC_EXPORT" g --format hf -o afile/out
    assert_output --partial "afile/out"
    run -1 "$MC_EXPORT" g --format hf -o afile
    assert_output "mc-export: error: afile: exists and is not a directory"
    mkdir mine && echo keep > mine/notes.txt
    run -1 "$MC_EXPORT" g --format hf -o mine
    assert_output "mc-export: error: mine: exists and holds notes.txt, which an export does not write: not replacing it"
    [ "$(cat mine/notes.txt)" = keep ]
    run ls -A
    assert_output $'afile\ng\nmine'
    # a corrupt checkpoint: its error names the file
    cp -r g h && truncate -s 100 h/iter_0000010/model.h5
    run -1 "$MC_EXPORT" h --format hf -o out
    assert_output --partial "h/iter_0000010/model.h5"
    [ ! -e out ]
}

@test "exporting again replaces an earlier export atomically" {
    train g --model tiny-gpt --mock-data --vocab-size 64
    run -0 "$MC_EXPORT" g --format hf -o out --quiet --max-shard-size 20KB
    [ -f out/model.safetensors.index.json ]
    run -0 "$MC_EXPORT" g --format hf -o out --quiet
    [ ! -f out/model.safetensors.index.json ] && [ -f out/model.safetensors ]
    check g/iter_0000010/model.h5 out
    run ls -A
    assert_output $'g\nout'
}
