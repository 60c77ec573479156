#!/usr/bin/env bats
# sft.bats - supervised fine-tuning data (issue 15): mc-preprocess
# --dataset-type sft against an independent rendering (jinja2 set up as
# transformers sets it up, and Hugging Face tokenizers:
# tests/golden/check_sft_dataset.py), the template's sources, determinism,
# and every bad input with its line and exit status; mc-train --sft on the
# result. The data (tests/data/sft) comes from tests/golden/make_sft_data.py:
# Qwen2.5-Instruct's published template over 64 conversations.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
SFT="$top_srcdir/tests/data/sft"
CHECK="$top_srcdir/tests/golden/check_sft_dataset.py"
TPL="$top_srcdir/tests/data/chat_templates"
tok=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$SFT/tokenizer.json")

setup() {
    cd "$BATS_TEST_TMPDIR"
}

sft() {
    "$MC_PREPROCESS" --dataset-type sft "${tok[@]}" --quiet "$@"
}

# The dataset of chat.jsonl, once per file; prints its prefix.
dataset() {
    local p="$BATS_FILE_TMPDIR/chat"
    [ -f "${p}_messages_document_loss_mask.idx" ] ||
        sft --input "$SFT/chat.jsonl" --output-prefix "$p" >/dev/null
    echo "${p}_messages_document"
}

# The mc-train arguments of the golden run (tests/golden/torch_sft.py).
golden_args() {
    "$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["mc_train_args"]))' \
        "$SFT/golden_llama_fp32.json" | sed "s|^TOKENIZER\$|$SFT/tokenizer.json|"
}

@test "sft: tokens and loss mask equal jinja2 + tokenizers' rendering, conversation by conversation" {
    require_python_module tokenizers
    require_python_module jinja2
    run -0 --separate-stderr sft --input "$SFT/chat.jsonl" --output-prefix chat
    assert_output "chat_messages_document" # only the prefix on stdout
    [ -f chat_messages_document_loss_mask.bin ] && [ -f chat_messages_document_loss_mask.idx ]
    run "$MC_PYTHON" "$CHECK" "$SFT/chat.jsonl" "$SFT" chat_messages_document
    echo "$output"
    assert_success
    assert_output --partial "64 conversations"
    assert_output --partial "0 differ; 0 tokenize differently whole"
    # --train-on-prompt: the same tokens, every mask byte 1 but the EOD's
    run -0 sft --input "$SFT/chat.jsonl" --output-prefix all --train-on-prompt
    run "$MC_PYTHON" "$CHECK" "$SFT/chat.jsonl" "$SFT" all_messages_document --train-on-prompt
    echo "$output"
    assert_success
    cmp chat_messages_document.bin all_messages_document.bin
    ! cmp -s chat_messages_document_loss_mask.bin all_messages_document_loss_mask.bin
}

@test "sft: the template from --chat-template (Jinja or tokenizer_config.json) and the one beside the tokenizer agree; any worker count, same bytes" {
    sft --input "$SFT/chat.jsonl" --output-prefix a
    sft --input "$SFT/chat.jsonl" --output-prefix b --chat-template "$TPL/Qwen-Qwen2.5-7B-Instruct.jinja"
    sft --input "$SFT/chat.jsonl" --output-prefix c --chat-template "$SFT/tokenizer_config.json" --workers 3
    for p in b c; do
        cmp a_messages_document.bin ${p}_messages_document.bin
        cmp a_messages_document.idx ${p}_messages_document.idx
        cmp a_messages_document_loss_mask.bin ${p}_messages_document_loss_mask.bin
    done
    # another template renders other tokens
    sft --input "$SFT/chat.jsonl" --output-prefix s --chat-template "$TPL/HuggingFaceTB-SmolLM2-1.7B-Instruct.jinja"
    ! cmp -s a_messages_document.bin s_messages_document.bin
}

@test "sft: each bad conversation fails with its file and line, exit 1, no dataset left; --skip-invalid counts them" {
    local bad="$SFT/bad.jsonl"
    for n in 1 2 3 4 5 6; do
        sed -n "${n}p" "$bad" > one.jsonl
        run sft --input one.jsonl --output-prefix out
        echo "line $n: $output"
        assert_failure 1
        assert_output --regexp "^mc-preprocess: error: one\.jsonl:1:"
        [ "${#lines[@]}" -eq 1 ]
        assert_no_dataset out
    done
    run sft --input "$bad" --output-prefix out
    assert_failure 1
    assert_output --partial "bad.jsonl:1: messages[1]: unknown role 'bot'"
    sed -n 2p "$bad" > one.jsonl
    run sft --input one.jsonl --output-prefix out
    assert_output --partial "no assistant message"
    sed -n 3p "$bad" > one.jsonl
    run sft --input one.jsonl --output-prefix out
    assert_output --partial "messages[0]: \"content\" must be a string"
    # the good ones still go through, the bad ones counted
    cat "$SFT/chat.jsonl" "$bad" > mixed.jsonl
    run -0 --separate-stderr "$MC_PREPROCESS" --dataset-type sft "${tok[@]}" --input mixed.jsonl \
        --output-prefix mixed --skip-invalid
    [[ "$stderr" == *"64 documents"* ]]
    [[ "$stderr" == *"skipped 6 invalid records"* ]]
}

@test "sft: a template that raises, or uses a construct outside the subset, fails naming the template's line" {
    head -n 3 "$SFT/chat.jsonl" > three.jsonl
    # Gemma's template refuses a system message (raise_exception)
    { echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
      echo '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'; } > sys.jsonl
    run sft --input sys.jsonl --output-prefix g --chat-template "$TPL/google-gemma-2-2b-it.jinja"
    assert_failure 1
    assert_output --regexp "^mc-preprocess: error: sys\.jsonl:2: .*google-gemma-2-2b-it\.jinja:1: template raised: System role not supported$"
    assert_no_dataset g
    printf '{%% for m in messages %%}{{ m.content }}\n{%% filter upper %%}x{%% endfilter %%}{%% endfor %%}' > odd.jinja
    run sft --input three.jsonl --output-prefix zz --chat-template odd.jinja
    assert_failure 1
    assert_output --regexp "odd\.jinja:2: .*filter"
    assert_no_dataset zz
}

@test "sft: bad usage exits 2 before anything is read" {
    run -2 "$MC_PREPROCESS" "${tok[@]}" --input "$SFT/chat.jsonl" --output-prefix x --chat-template t.jinja
    assert_output --partial "--chat-template applies to --dataset-type sft and preference only"
    run -2 sft --input "$SFT/chat.jsonl" --output-prefix x --json-keys text
    assert_output --partial "takes no --json-keys"
    run -2 sft --input "$SFT/chat.jsonl" --output-prefix x --chat-template-kwargs '[1]'
    assert_output --partial "--chat-template-kwargs: not a JSON object"
    run -2 "$MC_PREPROCESS" --dataset-type chat "${tok[@]}" --input "$SFT/chat.jsonl" --output-prefix x
    assert_output --partial "--dataset-type: expected text, sft or preference, got 'chat'"
    # no template anywhere: a tokenizer without a tokenizer_config.json beside it
    run -2 sft --input "$SFT/chat.jsonl" --output-prefix x --tokenizer-model "$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"
    assert_output --partial "no chat template"
    assert_no_dataset x
}

@test "mc-train --sft: 20 fp32 iterations equal PyTorch's masked loss (loss 1e-6, grad norm 5e-6, weights)" {
    require_python_module h5py
    local data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args)
    [ "${#args[@]}" -gt 20 ]
    run -0 --separate-stderr "$MC_TRAIN" "${args[@]}" --threads 1 --sft --data-path "$data" \
        --log-json log.jsonl --save ck
    [[ "$stderr" == *"sft train: 64 conversations, 100 samples of 257 tokens over 4 epoch(s), packing efficiency 94.9%, 4920 loss tokens, 0 truncated"* ]]
    [[ "$stderr" == *"iteration       20/      20"* ]]
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --train-iters 0 --mock-data --save init
    run "$MC_PYTHON" "$top_srcdir/tests/golden/check_train_golden.py" "$SFT/golden_llama_fp32.json" \
        log.jsonl ck/iter_0000020/model.h5 init/iter_0000000/model.h5
    echo "$output"
    assert_success
    refute_output --partial FAIL
    # without the mask (every token trained on) the run is another one
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --data-path "$data" \
        --reset-position-ids --reset-attention-mask --eod-mask-loss --log-json plain.jsonl
    [ "$(losses plain.jsonl | head -1)" != "$(losses log.jsonl | head -1)" ]
}

@test "mc-train --sft under TP=2 and under DP=2 with the distributed optimizer: the single process's losses (1e-6)" {
    mpi_setup
    local data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args)
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --sft --data-path "$data" --log-json one.jsonl
    run -0 mpi 2 "${args[@]}" --threads 1 --sft --data-path "$data" --tensor-model-parallel-size 2 \
        --sequence-parallel --log-json tp.jsonl
    3>&1 same_losses tp.jsonl one.jsonl
    run -0 mpi 2 "${args[@]}" --threads 1 --sft --data-path "$data" \
        --use-distributed-optimizer --log-json dp.jsonl
    3>&1 same_losses dp.jsonl one.jsonl
}

@test "mc-train --sft: bad usage and a dataset without its mask" {
    local data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args)
    run -2 "$MC_TRAIN" "${args[@]}" --sft --mock-data
    assert_output --partial "--sft reads an SFT dataset, not --mock-data"
    run -2 "$MC_TRAIN" "${args[@]}" --sft --data-path 1 "$data" 1 "$data"
    assert_output --partial "--sft reads one dataset"
    cp "$data.bin" lone.bin
    cp "$data.idx" lone.idx
    run -1 "$MC_TRAIN" "${args[@]}" --sft --data-path lone
    assert_output --regexp "loss mask.*lone_loss_mask\.idx: cannot open"
}

@test "the model's tokenizer_config.json travels: checkpoint, Hugging Face export (chat template, end-of-turn eos), import and export again" {
    require_python_module jinja2
    local data
    data=$(dataset)
    run -0 "$MC_TRAIN" --model tiny-llama --num-layers 1 --seq-length 256 "${tok[@]}" --sft \
        --data-path "$data" --split 100,0,0 --micro-batch-size 2 --global-batch-size 2 \
        --train-iters 1 --lr 1e-3 --eval-iters 0 --threads 1 --save ck
    run -0 "$top_builddir/tools/mc-export/mc-export" --format hf -o hf ck
    run -0 "$MC_PYTHON" - hf "$SFT/tokenizer_config.json" <<'PY'
import json, sys
out, own = (json.load(open(p)) for p in (sys.argv[1] + "/tokenizer_config.json", sys.argv[2]))
gen = json.load(open(sys.argv[1] + "/generation_config.json"))
tok = json.load(open(sys.argv[1] + "/tokenizer.json"))
ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
assert out["chat_template"] == own["chat_template"], "chat template differs"
assert out["eos_token"] == "<|im_end|>" and out["pad_token"] == "<|endoftext|>", out
assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]], gen
print("ok")
PY
    assert_output "ok"
    # GGUF: llama.cpp's chat template key and the end of turn
    run -0 "$top_builddir/tools/mc-export/mc-export" --format gguf --dtype f32 -o m.gguf ck
    require_python_module gguf
    run -0 "$MC_PYTHON" - m.gguf "$SFT/tokenizer_config.json" <<'PY'
import json, sys, gguf
r, own = gguf.GGUFReader(sys.argv[1]), json.load(open(sys.argv[2]))
val = lambda k: r.fields[k].parts[r.fields[k].data[0]]
assert bytes(val("tokenizer.chat_template")).decode() == own["chat_template"]
assert int(val("tokenizer.ggml.eot_token_id")[0]) != int(val("tokenizer.ggml.eos_token_id")[0])
print("ok")
PY
    assert_output "ok"
    # imported back (mc-reshard) and exported again: the same files
    run -0 "$top_builddir/tools/mc-reshard/mc-reshard" -o back hf
    run -0 "$top_builddir/tools/mc-export/mc-export" --format hf -o hf2 back
    cmp hf/tokenizer_config.json hf2/tokenizer_config.json
    cmp hf/generation_config.json hf2/generation_config.json
    # a tokenizer with no tokenizer_config.json beside it: none stored, mc's own written
    run -0 "$MC_TRAIN" --model tiny-llama --num-layers 1 --seq-length 32 --mock-data \
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$top_srcdir/tests/data/tokenizer/hf_bytelevel.json" \
        --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-3 --eval-iters 0 --save plain
    run -0 "$top_builddir/tools/mc-export/mc-export" --format hf -o hfp plain
    run ! grep -q chat_template hfp/tokenizer_config.json
}
