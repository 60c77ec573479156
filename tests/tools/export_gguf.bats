#!/usr/bin/env bats
# mc-export --format gguf: every type written for a GPT (gpt2) and a Llama
# (llama, grouped-query, untied, hidden 256 for q4_K's super-blocks, an MLP
# width that is not a multiple of 32,
# a vocabulary of 600 left unpadded where the GPT's is padded to 640)
# checkpoint, read back by the gguf Python package and compared with the
# checkpoint read by h5py (tests/golden/gguf_check.py: every key, tensor,
# shape and type; f32 exact, f16/bf16 bit-equal to nearest-even rounding,
# q8_0/q4_0 byte-equal to ggml's reference quantizer and within the
# documented error bounds); the refusals. With LLAMA_CPP_DIR (a llama.cpp
# build directory) also llama.cpp itself: it loads the files, generates,
# and its perplexity agrees with the reference transformer's.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
CHECK="$top_srcdir/tests/golden/gguf_check.py"

common=(--seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 2
        --threads 1 --lr 1e-3 --train-iters 1 --eval-iters 0 --seed 5)

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    [ -d "$DOCS" ] || return 0
    local tok
    tok=$(small_tokenizer)
    "$MC_PREPROCESS" --quiet --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
        --input-format text --append-eod --output-prefix docs "$DOCS"/tutorial/*.txt >/dev/null
    local data=(--data-path docs_text_document --split 100,0,0 --data-cache-path cache
                --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok")
    "$MC_TRAIN" "${common[@]}" "${data[@]}" --num-layers 2 --hidden-size 64 \
        --num-attention-heads 2 --save gpt >/dev/null 2>&1
    "$MC_TRAIN" "${common[@]}" "${data[@]}" --num-layers 2 --hidden-size 256 \
        --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 80 \
        --make-vocab-size-divisible-by 8 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
        --untie-embeddings-and-output-weights --save llama >/dev/null 2>&1
    # a mixture of experts (llama.cpp's Mixtral layout), and two it cannot
    # hold: sigmoid routing, a dense layer between MoE ones
    local moe=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-query-groups 2
               --normalization RMSNorm --swiglu --position-embedding-type rope
               --disable-bias-linear --make-vocab-size-divisible-by 8 --num-experts 4
               --moe-router-topk 2 --moe-ffn-hidden-size 64 --lr 1e-2)
    "$MC_TRAIN" "${common[@]}" "${data[@]}" "${moe[@]}" --train-iters 3 --save moe >/dev/null 2>&1
    "$MC_TRAIN" "${common[@]}" "${data[@]}" "${moe[@]}" --moe-router-score-function sigmoid \
        --save moe_sigmoid >/dev/null 2>&1
    "$MC_TRAIN" "${common[@]}" "${data[@]}" "${moe[@]}" --moe-layer-freq 2 \
        --save moe_dense >/dev/null 2>&1
    # --qk-layernorm: llama.cpp's qwen3 and qwen3moe
    "$MC_TRAIN" "${common[@]}" "${data[@]}" --num-layers 2 --hidden-size 128 \
        --num-attention-heads 4 --num-query-groups 2 --kv-channels 64 --ffn-hidden-size 96 \
        --make-vocab-size-divisible-by 8 --normalization RMSNorm --swiglu \
        --position-embedding-type rope --disable-bias-linear --qk-layernorm \
        --untie-embeddings-and-output-weights --save qwen3 >/dev/null 2>&1
    "$MC_TRAIN" "${common[@]}" "${data[@]}" "${moe[@]}" --qk-layernorm --train-iters 3 \
        --save qwen3moe >/dev/null 2>&1
    # the same GPT with no tokenizer, and a mix GGUF has no architecture for
    "$MC_TRAIN" "${common[@]}" --mock-data --vocab-size 64 --num-layers 1 --hidden-size 32 \
        --num-attention-heads 2 --save notok >/dev/null 2>&1
    "$MC_TRAIN" "${common[@]}" "${data[@]}" --num-layers 1 --hidden-size 32 \
        --num-attention-heads 2 --swiglu --save mixed >/dev/null 2>&1
    # the same vocabulary as GPT-2's vocab.json/merges.txt and as a tiktoken
    # rank file (ids are ranks: BPE training adds tokens in merge order)
    [ -x "$MC_PYTHON" ] && "$MC_PYTHON" -c "import tokenizers" 2>/dev/null || return 0
    "$MC_PYTHON" - "$tok" <<'PY'
import base64, json, sys
tj = json.load(open(sys.argv[1]))
v = dict(tj["model"]["vocab"], **{a["content"]: a["id"] for a in tj["added_tokens"]})
json.dump(v, open("vocab.json", "w"))
with open("merges.txt", "w") as f:
    f.write("#version: 0.2\n")
    f.writelines((m if isinstance(m, str) else " ".join(m)) + "\n" for m in tj["model"]["merges"])
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for x in range(256):
    if x not in bs:
        bs.append(x)
        cs.append(256 + len(cs) - 188)
byte = {chr(c): b for b, c in zip(bs, cs)}
with open("ranks.tiktoken", "w") as f:
    for t, i in sorted(tj["model"]["vocab"].items(), key=lambda x: x[1]):
        if t != "<|endoftext|>":
            f.write(base64.b64encode(bytes(byte[c] for c in t)).decode() + f" {i}\n")
PY
    "$MC_PREPROCESS" --quiet --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json \
        --merge-file merges.txt --input-format text --append-eod --output-prefix g2 \
        "$DOCS"/tutorial/*.txt >/dev/null
    "$MC_TRAIN" "${common[@]}" --data-path g2_text_document --split 100,0,0 \
        --data-cache-path cache --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json \
        --merge-file merges.txt --num-layers 1 --hidden-size 64 --num-attention-heads 2 \
        --make-vocab-size-divisible-by 8 --save gpt2bpe >/dev/null 2>&1
    "$MC_PREPROCESS" --quiet --tokenizer-type TikTokenizer --tokenizer-model ranks.tiktoken \
        --input-format text --append-eod --output-prefix tk "$DOCS"/tutorial/*.txt >/dev/null
    "$MC_TRAIN" "${common[@]}" --data-path tk_text_document --split 100,0,0 \
        --data-cache-path cache --tokenizer-type TikTokenizer --tokenizer-model ranks.tiktoken \
        --num-layers 1 --hidden-size 64 --num-attention-heads 2 \
        --make-vocab-size-divisible-by 1 --save tiktoken_v2 >/dev/null 2>&1
    # the same checkpoint saying it splits with Megatron's v1 pattern
    cp -r tiktoken_v2 tiktoken_v1
    "$MC_PYTHON" - tiktoken_v1/iter_0000001/model.h5 <<'PY'
import json, sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    t = json.loads(f.attrs["tokenizer"])
    t["tiktoken_pattern"] = "v1"
    f.attrs["tokenizer"] = json.dumps(t)
PY
    # edited by hand: its checksum manifest no longer holds (mc-formats(5))
    rm tiktoken_v1/iter_0000001/checksums.xxh128
}

setup() {
    [ -d "$DOCS" ] || skip "demo corpus $DOCS missing (Debian package python3.11-doc)"
    [ -x "$MC_EXPORT" ] || skip "mc-export is not built"
    cd "$BATS_TEST_TMPDIR"
    D=$BATS_FILE_TMPDIR
}

# export MODEL TYPE [ITER], check it against the checkpoint
export_and_check() {
    require_python_module gguf
    require_python_module h5py
    run "$MC_EXPORT" --format gguf --dtype "$2" -o "$1.$2.gguf" "$D/$1"
    assert_success
    assert_output "$1.$2.gguf"
    run ls -A
    assert_output "$1.$2.gguf"
    run "$MC_PYTHON" "$CHECK" "$1.$2.gguf" "$D/$1/${3:-iter_0000001}/model.h5" "$2"
    echo "$output"
    assert_success
}

@test "gpt2 f32: every key and tensor as written, values exact" { export_and_check gpt f32; }
@test "gpt2 f16: bit-equal to nearest-even rounding" { export_and_check gpt f16; }
@test "gpt2 bf16: bit-equal to nearest-even rounding" { export_and_check gpt bf16; }
@test "gpt2 q8_0: ggml's bytes, error within the bound" { export_and_check gpt q8_0; }
@test "gpt2 q4_0: ggml's bytes, error within the bound" { export_and_check gpt q4_0; }
@test "llama f32: q/k rows permuted, [gate; up] split, GQA, untied" { export_and_check llama f32; }
@test "llama f16" { export_and_check llama f16; }
@test "llama bf16" { export_and_check llama bf16; }
@test "llama q8_0: ffn_down (rows of 80) falls back to f16" {
    export_and_check llama q8_0
    assert_output --partial "Q8_0 max error"
}
@test "llama q4_0" { export_and_check llama q4_0; }
@test "llama q4_K: rows of 256 as q4_K within the bound, rows of 80 as f16" {
    export_and_check llama q4_K
    assert_output --partial "Q4_K max error"
}
@test "gpt2 q4_K: rows of 64 hold no super-block and fall back to q8_0" {
    export_and_check gpt q4_K
    assert_output --partial "Q8_0 max error"
}

@test "llama MoE f32: ffn_gate_inp, ffn_{gate,up,down}_exps as [E, rows, cols], expert counts" {
    export_and_check moe f32 iter_0000003
}
@test "llama MoE f16, the router kept f32" { export_and_check moe f16 iter_0000003; }
@test "llama MoE q8_0" { export_and_check moe q8_0 iter_0000003; }
@test "llama MoE q4_K: rows of 64 fall back to q8_0" { export_and_check moe q4_K iter_0000003; }
@test "a mixture of experts llama.cpp's llama cannot hold is refused in one line" {
    run "$MC_EXPORT" --format gguf -o m.gguf "$D/moe_sigmoid"
    assert_failure 1
    assert_output --regexp "^mc-export: error: .*moe_sigmoid/iter_0000001/model.h5: GGUF's llama architecture \(the format for a mixture of experts\) needs softmax routing; this model has --moe-router-score-function sigmoid$"
    run "$MC_EXPORT" --format gguf -o m.gguf "$D/moe_dense"
    assert_failure 1
    assert_output --partial "needs experts in every layer; this model has 1 of 2 layers dense (--moe-layer-freq) (Qwen3MoeForCausalLM (--format hf) holds it, and normalizes queries and keys per head: train with --qk-layernorm)"
    run ls -A
    assert_output ""
}

@test "qwen3 f32 (--qk-layernorm): attn_q_norm/attn_k_norm, q/k rows as mc's (NEOX RoPE)" {
    export_and_check qwen3 f32
}
@test "qwen3 q8_0" { export_and_check qwen3 q8_0; }
@test "qwen3moe f32: the q/k norms, experts as llama's, expert_feed_forward_length" {
    export_and_check qwen3moe f32 iter_0000003
}
@test "qwen3moe bf16" { export_and_check qwen3moe bf16 iter_0000003; }

@test "GPT2BPETokenizer: vocab.json and merges.txt as tokens and merges (gpt-2)" {
    [ -d "$D/gpt2bpe" ] || skip "no GPT2BPETokenizer checkpoint (needs $MC_PYTHON)"
    export_and_check gpt2bpe f32
    assert_output --partial "pre gpt-2"
}

@test "TikTokenizer: 1000 specials first, merges derived from the ranks (tekken)" {
    [ -d "$D/tiktoken_v2" ] || skip "no TikTokenizer checkpoint (needs $MC_PYTHON)"
    export_and_check tiktoken_v2 q8_0
    assert_output --partial "(1599 tokens, 343 merges, pre tekken)"
}

@test "a TikTokenizer with the v1 pattern is refused (llama.cpp has no such pre-tokenizer)" {
    [ -d "$D/tiktoken_v1" ] || skip "no TikTokenizer checkpoint (needs $MC_PYTHON)"
    run "$MC_EXPORT" --format gguf -o m.gguf "$D/tiktoken_v1"
    assert_failure 1
    assert_output --partial "llama.cpp has no pre-tokenizer for this TikTokenizer pattern"
    run ls -A
    assert_output ""
}

@test "the checkpoint comes on stdin, --dtype defaults to f16, --name sets general.name" {
    require_python_module gguf
    run bash -c "echo '$D/gpt' | '$MC_EXPORT' --format gguf --name tiny -o m.gguf"
    assert_success
    assert_output m.gguf
    run "$MC_PYTHON" -c "
import gguf
r = gguf.GGUFReader('m.gguf')
print(r.fields['general.name'].contents(), r.fields['general.file_type'].contents(),
      r.fields['general.architecture'].contents())"
    assert_output "tiny 1 gpt2"
}

@test "a checkpoint without a tokenizer is refused, nothing left behind" {
    run "$MC_EXPORT" --format gguf -o m.gguf "$D/notok"
    assert_failure 1
    assert_output --regexp "^mc-export: error: .*notok/iter_0000001/model.h5: GGUF needs the tokenizer"
    run ls -A
    assert_output ""
}

@test "a model GGUF has no architecture for (LayerNorm + SwiGLU) is refused" {
    run "$MC_EXPORT" --format gguf -o m.gguf "$D/mixed"
    assert_failure 1
    assert_output --partial "GGUF has no architecture for this model (LayerNorm, SwiGLU, learned positions)"
    run ls -A
    assert_output ""
}

@test "a bad --dtype is a usage error naming the choices" {
    run "$MC_EXPORT" --format gguf --dtype q5_k -o m.gguf "$D/gpt"
    assert_failure 2
    assert_output --partial "'q5_k' is not a GGUF type (f32, f16, bf16, q8_0, q4_0 or q4_K)"
    run ls -A
    assert_output ""
}

@test "an output in a missing directory is refused" {
    run "$MC_EXPORT" --format gguf -o nodir/m.gguf "$D/gpt"
    assert_failure 1
    assert_output --regexp "^mc-export: error: nodir/m.gguf: directory 'nodir' does not exist"
    run ls -A
    assert_output ""
}

@test "a full disk (file-size limit) fails cleanly and leaves nothing" {
    run bash -c "ulimit -f 64; '$MC_EXPORT' --format gguf --dtype f32 -o m.gguf '$D/gpt'"
    assert_failure 1
    assert_output --partial "m.gguf"
    assert_output --partial "File too large"
    run ls -A
    assert_output ""
}

# ---- llama.cpp itself (LLAMA_CPP_DIR: a build directory with bin/)

# llama-perplexity's final PPL (llama.cpp's logging thread sometimes loses
# the last lines at exit, on a file as on a pipe: run it again, up to 5 times)
llama_ppl() {
    local bin=$1 out
    shift
    for _ in 1 2 3 4 5; do
        "$bin" "$@" > ppl.out 2>&1 || { cat ppl.out >&2; return 1; }
        out=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' ppl.out)
        [ -n "$out" ] && { echo "$out"; return 0; }
    done
    return 1
}

# llama_bin NAME: the program's path in $llama, or skip the test (called
# directly, not in $(...), where skip would only leave the subshell)
llama_bin() {
    [ -n "${LLAMA_CPP_DIR:-}" ] || skip "LLAMA_CPP_DIR is not set (a llama.cpp build directory)"
    [ -x "$LLAMA_CPP_DIR/bin/$1" ] || skip "$LLAMA_CPP_DIR/bin/$1 is not built"
    llama="$LLAMA_CPP_DIR/bin/$1"
}

@test "llama.cpp loads every type of both models and generates" {
    local gen
    llama_bin llama-completion
    gen=$llama
    for m in gpt llama moe; do
        for t in f32 f16 bf16 q8_0 q4_0 q4_K; do
            "$MC_EXPORT" --format gguf --dtype $t -o $m.$t.gguf "$D/$m" >/dev/null
            run "$gen" -m $m.$t.gguf -p "The Python" -n 8 --temp 0 -t 1 -no-cnv --no-warmup
            assert_success
        done
    done
}

@test "llama-perplexity agrees with the reference transformer (f32 within 1e-3 relative)" {
    local ppl PY=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
    llama_bin llama-perplexity
    ppl=$llama
    "$PY" -c "import torch, h5py, tokenizers" 2>/dev/null || skip "no torch/h5py/tokenizers in $PY"
    cat "$DOCS"/howto/argparse.rst.txt > text.txt
    for m in gpt llama moe; do
        local it=iter_0000001
        [ $m = moe ] && it=iter_0000003
        "$MC_EXPORT" --format gguf --dtype f32 -o $m.gguf "$D/$m" >/dev/null
        run "$PY" "$top_srcdir/tests/golden/gguf_ppl_ref.py" "$D/$m/$it/model.h5" \
            text.txt 32 20
        assert_success
        local want=${output##*PPL = }
        local got
        got=$(llama_ppl "$ppl" -m $m.gguf -f text.txt -c 32 -b 32 --chunks 20 -t 1)
        echo "$m: llama.cpp $got, reference $want"
        awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * b) }'
    done
}

# Only for unpadded vocabularies: with padding, mc's softmax also spans the
# padding classes, which the GGUF file leaves out. The GPT-2 BPE and
# tiktoken models check that llama.cpp tokenizes the text as mc does.
@test "llama-perplexity agrees with mc-eval --ppl-mode llama on every type (unpadded vocab)" {
    local ppl MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
    llama_bin llama-perplexity
    ppl=$llama
    [ -x "$MC_EVAL" ] || skip "mc-eval is not built"
    cat "$DOCS"/howto/argparse.rst.txt > text.txt
    # relative tolerance of llama.cpp's figure on each type against mc's fp32 one
    declare -A tol=([f32]=1e-4 [f16]=1e-3 [bf16]=1e-2 [q8_0]=1e-2 [q4_0]=5e-2 [q4_K]=5e-2)
    for m in llama gpt2bpe tiktoken_v2; do
        [ -d "$D/$m" ] || continue
        run "$MC_EVAL" "$D/$m" --text-file text.txt --ppl-mode llama -c 32 --chunks 20 --threads 1
        assert_success
        local want
        want=$(echo "$output" | sed -n 's/.*PPL = \([0-9.]*\).*/\1/p')
        for t in f32 f16 bf16 q8_0 q4_0 q4_K; do
            "$MC_EXPORT" --format gguf --dtype $t -o $m.$t.gguf "$D/$m" >/dev/null
            local got
            got=$(llama_ppl "$ppl" -m $m.$t.gguf -f text.txt -c 32 -b 32 --chunks 20 -t 1)
            echo "$m $t: llama.cpp $got, mc-eval $want"
            awk -v a="$got" -v b="$want" -v t="${tol[$t]}" \
                'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * b) }'
        done
    done
}

@test "RoPE scaling: llama.cpp's rope_freqs tensor holds transformers' llama3 frequency ratios; a partial rotary dimension is refused" {
    require_python_module gguf
    local tok="$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"
    local m=(--model tiny-llama --seq-length 32 --micro-batch-size 1 --global-batch-size 1 --threads 1
             --lr 1e-3 --train-iters 0 --mock-data --tokenizer-type HuggingFaceTokenizer
             --tokenizer-model "$tok" --rotary-base 500000)
    run -0 "$MC_TRAIN" "${m[@]}" --use-rope-scaling --rope-scaling-factor 8 \
        --rope-scaling-original-max-position-embeddings 64 --save sc
    run -0 "$MC_EXPORT" --format gguf --dtype f32 -o sc.gguf sc
    run -0 "$MC_PYTHON" - sc.gguf <<'PY'
import math, sys, gguf, numpy as np
r = gguf.GGUFReader(sys.argv[1])
t = {t.name: t for t in r.tensors}["rope_freqs.weight"]
D = int(r.fields["llama.rope.dimension_count"].parts[-1][0])
# transformers' _compute_llama3_parameters (factor 8, low 1, high 4, original 64)
inv = 1.0 / 500000.0 ** (np.arange(0, D, 2) / D)
wl = 2 * math.pi / inv
scaled = np.where(wl > 64 / 1, inv / 8, inv)
s = (64 / wl - 1) / (4 - 1)
mid = ~(wl < 64 / 4) & ~(wl > 64 / 1)
scaled = np.where(mid, (1 - s) * scaled / 8 + s * scaled, scaled)
want = inv / scaled
assert t.data.shape == (D // 2,), t.data.shape
assert np.allclose(t.data, want, rtol=1e-6), (t.data, want)
assert want.min() == 1 and want.max() == 8 and ((want > 1) & (want < 8)).any()
print("ok", D // 2)
PY
    assert_output --regexp '^ok [0-9]+$'
    run -0 "$MC_TRAIN" "${m[@]}" --save plain
    run -0 "$MC_EXPORT" --format gguf --dtype f32 -o plain.gguf plain
    run -0 "$MC_PYTHON" -c 'import sys, gguf; assert "rope_freqs.weight" not in {t.name for t in gguf.GGUFReader(sys.argv[1]).tensors}' plain.gguf
    run -0 "$MC_TRAIN" "${m[@]}" --rotary-percent 0.5 --save half
    run -1 "$MC_EXPORT" --format gguf -o half.gguf half
    assert_output --partial "GGUF's llama architecture turns whole heads"
    [ ! -e half.gguf ]
    run -1 "$MC_EXPORT" --format hf -o half-hf half
    assert_output --partial "rotary embeddings over the whole head"
    run -2 "$MC_TRAIN" "${m[@]}" --rotary-percent 0.3 --save bad
    assert_output --partial "--rotary-percent 0.3 of the head dimension"
}
