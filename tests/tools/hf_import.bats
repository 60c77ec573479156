#!/usr/bin/env bats
# hf_import.bats - the Hugging Face import (mc_hf_import, which mc-reshard
# runs; here through the tests/unit/hf_import helper): directories laid out
# as transformers writes them (tests/golden/hf_make_dir.py: GPT-2 with and
# without the "transformer." prefix, Llama with GQA, biases, tied, the
# rope_parameters of transformers 5; F32, F16, BF16; sharded or not) come
# back byte for byte through mc-export; an mc export imported and exported
# again is byte-identical; the imported checkpoint trains (mc-train --load
# --finetune) and carries the tokenizer; every field mc cannot express is
# refused by name, and a bad directory leaves no checkpoint.
#
# Needs numpy in $MC_PYTHON (see common.bash); skips, saying why, without.
# The import's numbers against transformers are in export_hf_logits.bats.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
IMPORT="$top_builddir/tests/unit/hf_import"
MAKE="$top_srcdir/tests/golden/hf_make_dir.py"
SAME="$top_srcdir/tests/golden/hf_same_tensors.py"
TOK="$top_srcdir/tests/data/tokenizer"

setup() {
    require_python_module numpy
    # a directory of its own: bats keeps --separate-stderr files in the tmpdir
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

# roundtrip SRC [hf_same_tensors options]: import SRC, export it again,
# compare every tensor with SRC's bytes.
roundtrip() {
    local src=$1
    shift
    run -0 "$IMPORT" "$src" "$src.ckpt"
    assert_output "$src.ckpt/iter_0000000"
    run -0 "$MC_EXPORT" "$src.ckpt" --format hf -o "$src.out" --quiet
    run "$MC_PYTHON" "$SAME" "$src" "$src.out" "$@"
    echo "$output"
    assert_success
}

@test "GPT-2 without the transformer. prefix, fp16, with attention-mask buffers: same bytes back" {
    "$MC_PYTHON" "$MAKE" gpt2 g --no-prefix --dtype F16
    roundtrip g --gpt2-names
    assert_output "28 tensors, 0 differ"
    # stored as float16 in the checkpoint, not widened
    require_python_module h5py
    run -0 "$MC_PYTHON" -c 'import h5py, sys
f = h5py.File(sys.argv[1]); print(f["model/decoder.layers.1.mlp.linear_fc1.weight"].dtype)' \
        g.ckpt/iter_0000000/model.h5
    assert_output "float16"
}

@test "GPT-2 untied fp32, and Llama bf16 sharded with biases, tied, rope_parameters" {
    "$MC_PYTHON" "$MAKE" gpt2 g --untie
    roundtrip g
    assert_output "29 tensors, 0 differ"
    "$MC_PYTHON" "$MAKE" llama l --dtype BF16 --shard-bytes 10000 --bias --tie --rope-parameters
    [ -f l/model.safetensors.index.json ]
    roundtrip l
    assert_output "34 tensors, 0 differ"
    grep -q '"rope_theta": 5000.0' l.out/config.json
    grep -q '"rms_norm_eps": 1e-6' l.out/config.json
}

@test "Llama with GQA: the checkpoint holds Megatron's fused layouts, computed here from q/k/v and gate/up" {
    require_python_module h5py
    "$MC_PYTHON" "$MAKE" llama l
    run -0 "$IMPORT" l ck
    run -0 "$MC_PYTHON" - l/model.safetensors ck/iter_0000000/model.h5 <<'EOF'
import json, sys
import h5py, numpy as np
from safetensors.numpy import load_file
hf, f = load_file(sys.argv[1]), h5py.File(sys.argv[2])
cfg = json.loads(f.attrs["config"])["model"]
H, G, D, C = 4, 2, 8, 32
for l in range(2):
    p = f"model.layers.{l}."
    q = hf[p + "self_attn.q_proj.weight"].reshape(G, H // G, D, C)
    k = hf[p + "self_attn.k_proj.weight"].reshape(G, 1, D, C)
    v = hf[p + "self_attn.v_proj.weight"].reshape(G, 1, D, C)
    qkv = np.concatenate([q, k, v], 1).reshape(-1, C)
    assert np.array_equal(f[f"model/decoder.layers.{l}.self_attention.linear_qkv.weight"][()], qkv)
    fc1 = np.concatenate([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
    assert np.array_equal(f[f"model/decoder.layers.{l}.mlp.linear_fc1.weight"][()], fc1)
print(cfg["num_query_groups"], cfg["kv_channels"], cfg["vocab_size"], cfg["padded_vocab_size"],
      cfg["make_vocab_size_divisible_by"], cfg["rotary_base"], cfg["norm_epsilon"] == np.float32(1e-6))
EOF
    # vocabulary 96 needs no padding row (zero rows would get logit 0 in mc's softmax)
    assert_output "2 8 96 96 32 5000.0 True"
}

@test "an mc export imported and exported again is byte-identical (fp32 GPT, bf16 sharded Llama)" {
    "$MC_TRAIN" --model tiny-gpt --mock-data --vocab-size 128 --seq-length 16 --micro-batch-size 2 \
        --global-batch-size 4 --threads 1 --lr 1e-2 --train-iters 3 --eval-iters 0 --save g \
        >/dev/null 2>&1
    "$MC_EXPORT" g --format hf -o g.hf --quiet >/dev/null
    roundtrip g.hf
    assert_output "28 tensors, 0 differ"
    "$MC_TRAIN" --model tiny-llama --mock-data --vocab-size 128 --seq-length 16 \
        --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-2 --train-iters 3 \
        --eval-iters 0 --save l >/dev/null 2>&1
    "$MC_EXPORT" l --format hf -o l.hf --quiet --dtype bf16 --max-shard-size 30KB >/dev/null
    run -0 "$IMPORT" l.hf l.ck
    run -0 "$MC_EXPORT" l.ck --format hf -o l.out --quiet --max-shard-size 30KB
    for f in l.hf/*; do cmp "$f" "l.out/${f#l.hf/}"; done
    [ "$(ls l.hf | wc -l)" = "$(ls l.out | wc -l)" ]
}

@test "the import fine-tunes with mc-train --load --finetune and keeps the tokenizer" {
    "$MC_PYTHON" "$MAKE" gpt2 g
    cp "$TOK/hf_bytelevel.json" g/tokenizer.json
    # the tokenizer's 2002 ids are more than this toy's 100 rows: only the
    # file's round trip matters here
    run -0 "$IMPORT" g ck
    run -0 --separate-stderr "$MC_TRAIN" --model tiny-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
        --max-position-embeddings 32 --seq-length 16 --vocab-size 100 \
        --make-vocab-size-divisible-by 4 --mock-data --load ck --finetune --train-iters 2 \
        --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-3 --eval-iters 0 --save ft
    assert_output "ft/iter_0000002"
    run -0 "$MC_EXPORT" ck --format hf -o out --quiet
    cmp out/tokenizer.json "$TOK/hf_bytelevel.json"
    # GPT-2's vocab.json + merges.txt when there is no tokenizer.json
    "$MC_PYTHON" "$MAKE" gpt2 b
    cp "$TOK/gpt2_vocab.json" b/vocab.json
    cp "$TOK/gpt2_merges.txt" b/merges.txt
    run -0 "$IMPORT" b bck
    run -0 "$MC_EXPORT" bck --format hf -o bout --quiet
    cmp bout/vocab.json b/vocab.json
    cmp bout/merges.txt b/merges.txt
}

@test "what mc cannot express is refused, naming the field; nothing is written" {
    bad() {  # bad KIND MESSAGE hf_make_dir-options...
        local kind=$1 msg=$2
        shift 2
        rm -rf d
        "$MC_PYTHON" "$MAKE" "$kind" d "$@"
        run -1 "$IMPORT" d ck
        assert_output "hf_import: error: $msg"
        [ ! -e ck ]
    }
    bad llama "d/config.json: rope_scaling.low_freq_factor: expected a positive number" \
        --set 'rope_scaling={"rope_type": "llama3", "factor": 8.0}'
    bad llama 'd/config.json: rope_scaling.rope_type: mc'"'"'s RoPE scaling is Llama 3.1'"'"'s ("llama3") only' \
        --set 'rope_scaling={"rope_type": "dynamic", "factor": 2.0}'
    bad llama 'd/config.json: rope_parameters.rope_type: mc'"'"'s RoPE is "default" or Llama 3.1'"'"'s "llama3"' \
        --rope-parameters --set 'rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}'
    bad llama "d/config.json: architectures: MistralForCausalLM is not supported (mc imports GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM)" \
        --set 'architectures=["MistralForCausalLM"]'
    bad llama "d/config.json: hidden_act: mc's SwiGLU uses silu" --set 'hidden_act="gelu"'
    bad llama "d: tensor model.layers.0.self_attn.q_norm.weight is missing (Qwen3ForCausalLM needs it)" \
        --set 'architectures=["Qwen3ForCausalLM"]'
    bad llama "d/config.json: attention_bias: mc has biases in all linear layers or in none (Qwen3's MLPs have none)" \
        --set 'architectures=["Qwen3ForCausalLM"]' --set 'attention_bias=true'
    bad llama "d/config.json: use_sliding_window: mc's attention has no window" \
        --set 'architectures=["Qwen3MoeForCausalLM"]' --set 'use_sliding_window=true'
    bad llama "d/config.json: sliding_window: mc's attention has no window" \
        --set 'architectures=["MixtralForCausalLM"]' --set 'sliding_window=4096'
    bad llama "d: tensor model.layers.0.block_sparse_moe.gate.weight is missing (MixtralForCausalLM needs it)" \
        --set 'architectures=["MixtralForCausalLM"]' --set 'num_local_experts=2'
    bad llama "d/config.json: mlp_bias: mc has biases in all linear layers or in none (attention_bias differs)" \
        --set 'mlp_bias=true'
    bad gpt2 "d/config.json: activation_function: mc's GPT uses the tanh GELU (gelu_new or gelu_pytorch_tanh)" \
        --set 'activation_function="relu"'
    bad gpt2 "d/config.json: scale_attn_by_inverse_layer_idx: not supported by mc" \
        --set 'scale_attn_by_inverse_layer_idx=true'
    bad gpt2 "d/config.json: n_layer: expected an integer >= 1" --set 'n_layer="two"'
    bad llama "d: tensor model.layers.1.mlp.up_proj.weight is missing (LlamaForCausalLM needs it)" \
        --drop model.layers.1.mlp.up_proj.weight
    bad llama "d/model.safetensors: tensor model.layers.0.mlp.experts.0.weight is not part of LlamaForCausalLM as mc reads it (refusing to drop it)" \
        --extra model.layers.0.mlp.experts.0.weight
    bad llama "d/model.safetensors: tensor model.layers.0.self_attn.k_proj.weight has shape [16, 32], config.json implies [32, 32]" \
        --set 'num_key_value_heads=4'
}

@test "damaged safetensors files and directories are refused with the place" {
    "$MC_PYTHON" "$MAKE" gpt2 d
    head -c 1000 d/model.safetensors > t && mv t d/model.safetensors
    run -1 "$IMPORT" d ck
    assert_output "hf_import: error: d/model.safetensors: header length 2832 exceeds the file (1000 bytes)"
    # a data offset beyond the data, found by editing one number of the header
    "$MC_PYTHON" "$MAKE" gpt2 e
    "$MC_PYTHON" - e/model.safetensors <<'EOF'
import json, sys
b = open(sys.argv[1], "rb").read()
n = int.from_bytes(b[:8], "little")
h = json.loads(b[8:8 + n])
h["transformer.ln_f.bias"]["data_offsets"][1] += 4
s = json.dumps(h).encode()
s += b" " * (n - len(s))
open(sys.argv[1], "wb").write(b[:8] + s + b[8 + n:])
EOF
    run -1 "$IMPORT" e ck
    assert_output --partial "hf_import: error: e/model.safetensors: header: tensor 'transformer.ln_f.bias': data_offsets"
    # an index naming a shard that is not there
    "$MC_PYTHON" "$MAKE" llama s --shard-bytes 10000
    rm s/model-00002-of-*.safetensors
    run -1 "$IMPORT" s ck
    assert_output --regexp "^hf_import: error: s/model-00002-of-000[0-9]+.safetensors: cannot open: No such file"
    run -1 "$IMPORT" nowhere ck
    assert_output "hf_import: error: nowhere/config.json: cannot open: No such file or directory"
    [ ! -e ck ]
}
