#!/usr/bin/env bats
# export_hf_moe.bats - mixtures of experts out of mc and back:
#  - mc-export --format hf writes MixtralForCausalLM: every tensor (the
#    router as block_sparse_moe.gate, each expert's w1/w3/w2 split from mc's
#    global [E, rows, cols] tensors) byte for byte as
#    tests/golden/hf_check_export.py re-derives it with numpy, and
#    config.json's MoE fields; an export imported (mc_hf_import) and exported
#    again gives the same bytes, and the import holds the checkpoint's
#    tensors;
#  - every setting Mixtral cannot hold is refused in one line naming it
#    (exit 1, nothing written), and so is llm.c's format;
#  - tests/golden/hf_moe_logits.py (torch + transformers) trained tiny MoE
#    models, checked transformers' logits on the exports against the
#    float64 reference (<= 1e-4) and its loss against mc's (1e-5 relative),
#    imported random Mixtral models made by transformers (mc's loss equal to
#    transformers' within 1e-5 relative), and Qwen3-MoE the same way
#    (--qk-layernorm: the exports, and random imports); its
#    output is tests/golden/hf_moe_logits.json. Everywhere: mc-train
#    rebuilds each case and mc's loss on the golden tokens must equal
#    transformers' loss on the export. Where transformers is installed
#    ($MC_PYTHON_HEAVY, default /opt/mcheavy/bin/python): the whole script
#    again, live.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
IMPORT="$top_builddir/tests/unit/hf_import"
CHECK="$top_srcdir/tests/golden/hf_check_export.py"
SAME="$top_srcdir/tests/golden/hf_same_tensors.py"
GOLDEN="$top_srcdir/tests/golden/hf_moe_logits.json"

run_args=(--seq-length 16 --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-2
          --log-interval 10 --eval-iters 0 --mock-data --vocab-size 64)
moe=(--model tiny-llama --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48)

setup() {
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

# train DIR ITERS ARGS...: a checkpoint; prints nothing.
train() {
    local dir=$1 iters=$2
    shift 2
    "$MC_TRAIN" "$@" "${run_args[@]}" --train-iters "$iters" --save "$dir" >/dev/null 2>&1
}

@test "MixtralForCausalLM: every expert's tensors byte for byte, config.json, fp32 and bf16" {
    require_python_module safetensors
    require_python_module h5py
    train m 10 "${moe[@]}" --moe-aux-loss-coeff 1e-2 --untie-embeddings-and-output-weights
    run -0 "$MC_EXPORT" m --format hf -o out --quiet --max-shard-size 40KB
    assert_output "out"
    run "$MC_PYTHON" "$CHECK" m/iter_0000010/model.h5 out
    echo "$output"
    assert_success
    # 2 layers x (4 attention + 2 norms + router + 4 experts x 3) + embeddings,
    # final norm, lm_head
    assert_output "MixtralForCausalLM: 41 tensors checked, 0 differ"
    run -0 "$MC_EXPORT" m --format hf -o b16 --quiet --dtype bf16
    run "$MC_PYTHON" "$CHECK" m/iter_0000010/model.h5 b16 BF16
    assert_success
    for k in '"num_local_experts": 4' '"num_experts_per_tok": 2' '"intermediate_size": 48' \
             '"router_aux_loss_coef": 0.01' '"output_router_logits": false' \
             '"model_type": "mixtral"'; do
        grep -q "$k" out/config.json || { echo "config.json lacks $k"; cat out/config.json; false; }
    done
}

@test "a Mixtral export imported and exported again: the same bytes; the import holds mc's tensors" {
    require_python_module h5py
    train m 10 "${moe[@]}" --num-query-groups 4
    run -0 "$MC_EXPORT" m --format hf -o out --quiet
    run -0 "$IMPORT" out ck
    assert_output "ck/iter_0000000"
    run -0 "$MC_EXPORT" ck --format hf -o again --quiet
    run "$MC_PYTHON" "$SAME" out again
    echo "$output"
    assert_success
    run -0 "$MC_PYTHON" - m/iter_0000010/model.h5 ck/iter_0000000/model.h5 <<'EOF'
import json, sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
names = sorted(a["model"])
assert names == sorted(b["model"]), (names, sorted(b["model"]))
V = json.loads(a.attrs["config"])["model"]["vocab_size"]
for n in names:  # the vocabulary's padding rows are not exported
    x, y = a["model"][n][()], b["model"][n][()]
    if n in ("embedding.word_embeddings.weight", "output_layer.weight"):
        x, y = x[:V], y[:V]
    assert np.array_equal(x, y), n
ca, cb = (json.loads(f.attrs["config"])["model"]["moe"] for f in (a, b))
for k in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_score_function",
          "moe_router_pre_softmax", "moe_layer_freq"):
    assert ca[k] == cb[k], (k, ca[k], cb[k])
print(len(names), "tensors equal")
EOF
    assert_output "17 tensors equal"
}

@test "what Mixtral cannot hold is refused in one line naming it, leaving nothing" {
    local base="mc-export: error: x/iter_0000000/model.h5: MixtralForCausalLM (the format for a mixture of experts) needs"
    refuse() { # WANT ARGS...: train at 0 iterations, export, expect the line
        local want=$1
        shift
        rm -rf x
        train x 0 "$@"
        run -1 "$MC_EXPORT" x --format hf -o out
        assert_output "$base $want"
        [ ! -e out ]
    }
    refuse "no biases; this model has biases (no --disable-bias-linear)" \
        --model tiny-gpt --normalization RMSNorm --swiglu --position-embedding-type rope \
        --num-experts 4
    refuse "softmax routing; this model has --moe-router-score-function sigmoid" \
        "${moe[@]}" --moe-router-score-function sigmoid
    refuse "no expert bias in the choice; this model has --moe-router-enable-expert-bias" \
        "${moe[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    refuse "routing over all the experts; this model has group-limited routing" \
        "${moe[@]}" --moe-router-num-groups 2 --moe-router-group-topk 1
    refuse "probabilities summing to 1; this model has --moe-router-topk-scaling-factor" \
        "${moe[@]}" --moe-router-topk-scaling-factor 2.5
    refuse "no token dropping; this model has --moe-expert-capacity-factor" \
        "${moe[@]}" --moe-expert-capacity-factor 1.0
    refuse "no shared experts; this model has --moe-shared-expert-intermediate-size" \
        "${moe[@]}" --moe-shared-expert-intermediate-size 32
    refuse "the top-k probabilities renormalized; this model has --moe-router-pre-softmax (Qwen3MoeForCausalLM holds it, and normalizes queries and keys per head: train with --qk-layernorm)" \
        "${moe[@]}" --moe-router-pre-softmax
    refuse "experts in every layer; this model has 1 of 2 layers dense (--moe-layer-freq) (Qwen3MoeForCausalLM holds it, and normalizes queries and keys per head: train with --qk-layernorm)" \
        "${moe[@]}" --moe-layer-freq 2
    refuse "rotary positions; this model has learned absolute positions" \
        --model tiny-gpt --num-experts 4
    rm -rf x
    train x 0 --model tiny-gpt --normalization RMSNorm --position-embedding-type rope \
        --num-experts 4 --disable-bias-linear
    run -1 "$MC_EXPORT" x --format hf -o out
    assert_output "mc-export: error: x/iter_0000000/model.h5: MixtralForCausalLM (the format for rotary positions) needs a SwiGLU MLP; this model has GELU"
    run ls -A
    assert_output "x"
}

@test "--format llmc refuses a mixture of experts in one line" {
    train x 0 --model tiny-gpt --num-experts 4
    run -1 "$MC_EXPORT" x --format llmc -o x.bin
    assert_output "mc-export: error: x/iter_0000000/model.h5: llm.c's GPT-2 needs a dense MLP in every layer (this model is a mixture of experts)"
    [ ! -e x.bin ]
}

@test "mc's loss on each golden MoE checkpoint equals transformers' loss on its export" {
    [ -x "$MC_PYTHON" ] || skip "no Python at $MC_PYTHON to read the golden JSON"
    run "$MC_PYTHON" "$top_srcdir/tests/golden/rerun_mc_losses.py" "$GOLDEN" "$top_builddir"
    echo "$output"
    assert_success
    assert_output --partial "mixtral-top2: mc "
    assert_output --partial "qwen3moe-presoftmax-dense: mc "
    [ "$(echo "$output" | grep -c ' ok$')" = 5 ]
}

@test "transformers runs every MoE export with mc's logits and mc imports Mixtral (live)" {
    local py=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
    [ -x "$py" ] || skip "no Python at $py (set MC_PYTHON_HEAVY to one with torch and transformers)"
    "$py" -c "import transformers, h5py" 2>/dev/null ||
        skip "transformers (or h5py) is not installed in $py: '$py -m pip install transformers' runs this test"
    run --separate-stderr "$py" "$top_srcdir/tests/golden/hf_moe_logits.py" "$top_builddir"
    echo "$stderr" | grep -v '^\[transformers\]\|Writing model shards'
    assert_success
    [ "$(echo "$stderr" | grep -c ' ok$')" = 9 ]
}
