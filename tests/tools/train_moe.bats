#!/usr/bin/env bats
# train_moe.bats - mixture-of-experts models in mc-train (issue 13, section
# 1), end to end in one process: Megatron's MoE metrics on the iteration
# line, in --log-json and TensorBoard; the checkpoint's expert tensors
# (global [E x rows, cols] tensors under Megatron Core's names) and config;
# exact resume (6 iterations == 3 + 3, losses, balancing losses and
# weights); --dry-run's parameter counts against the checkpoint's; each bad
# input a one-line error with exit status 2 before any work; and the tools
# that cannot handle MoE checkpoints yet refusing them in one line. The
# numbers themselves are train_moe_golden.bats's (PyTorch).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"

# A two-layer Llama, T=16, 4 sequences per iteration in 2 micro-batches,
# 4 SwiGLU experts of 32, top-2, aux loss and z-loss.
moe=(--model tiny-llama --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --threads 1
     --lr 1e-3 --log-interval 1 --eval-iters 0 --mock-data --vocab-size 64
     --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32
     --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3)

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# Compare every dataset of two checkpoints bit for bit (h5py).
same_weights() {
    "$MC_PYTHON" - "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert any("experts" in n for n in names), "no expert tensors"
bad = [n for n in names if n not in b or not np.array_equal(a[n][()], b[n][()])]
print(len(names), "tensors,", len(bad), "differ:", bad[:5])
sys.exit(1 if bad else 0)
EOF
}

@test "the iteration line, --log-json and TensorBoard carry load_balancing_loss and z_loss" {
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --train-iters 2 --log-json log.jsonl \
        --tensorboard-dir tb
    [[ "$stderr" =~ "lm loss: "[0-9.E+-]+" | load_balancing_loss: "[0-9.E+-]+" | z_loss: "[0-9.E+-]+" | loss scale:" ]]
    run -0 grep -c '"load_balancing_loss": [0-9.]*, "z_loss": [0-9.]*' log.jsonl
    assert_output 2
    # the aux loss of a router near uniform is near 1 (E sum f_e P_e, f = P = 1/E)
    "$MC_PYTHON" -c '
import json, sys
for l in open("log.jsonl"):
    d = json.loads(l)
    assert 0.9 < d["load_balancing_loss"] < 1.5 and d["z_loss"] > 0, d' || exit 1
    require_python_module tensorboard.backend.event_processing.event_accumulator
    run -0 "$MC_PYTHON" "$top_srcdir/tests/golden/read_tfevents.py" tb
    assert_output --regexp $'load_balancing_loss\t1\t'
    assert_output --regexp $'z_loss\t2\t'
}

@test "--moe-per-layer-logging: each layer's values, whose mean over the MoE layers is the logged one" {
    run -0 "$MC_TRAIN" "${moe[@]}" --train-iters 2 --num-layers 3 --moe-layer-freq '[1,0,1]' \
        --moe-per-layer-logging --log-json log.jsonl
    "$MC_PYTHON" -c '
import json
for l in open("log.jsonl"):
    d = json.loads(l)
    for k in ("load_balancing_loss", "z_loss"):
        v = [d["moe/%s_layer_%d" % (k, i)] for i in range(3)]
        assert v[1] == 0 and v[0] > 0 and v[2] > 0, (k, v)
        assert abs((v[0] + v[2]) / 2 - d[k]) <= 1e-12 * d[k], (k, v, d[k])
print("ok")' || exit 1
}

@test "seq_aux_loss is logged as seq_load_balancing_loss; none and no z coefficient log nothing" {
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --train-iters 1 \
        --moe-router-load-balancing-type seq_aux_loss
    [[ "$stderr" == *"| seq_load_balancing_loss: "* ]]
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --train-iters 1 \
        --moe-router-load-balancing-type none --moe-z-loss-coeff 0
    [[ "$stderr" == *"| lm loss: "* ]]
    [[ "$stderr" != *"load_balancing_loss"* && "$stderr" != *"z_loss"* ]]
}

@test "the checkpoint holds the experts as global [E x rows, cols] tensors under Megatron Core's names" {
    require_python_module h5py
    run -0 "$MC_TRAIN" "${moe[@]}" --train-iters 1 --save ck --moe-layer-freq '[0]*1+[1]*1'
    run -0 "$MC_PYTHON" - ck/iter_0000001/model.h5 <<'EOF'
import json, sys, h5py
f = h5py.File(sys.argv[1], "r")
m = f["model"]
shapes = {k: m[k].shape for k in m}
L1 = "decoder.layers.1."
assert shapes[L1 + "mlp.experts.experts.linear_fc1.weight"] == (4 * 2 * 32, 64), shapes
assert shapes[L1 + "mlp.experts.experts.linear_fc2.weight"] == (4 * 64, 32)
assert shapes[L1 + "mlp.router.weight"] == (4, 64)
assert shapes[L1 + "pre_mlp_layernorm.weight"] == (64,)
assert L1 + "mlp.linear_fc1.weight" not in shapes
# layer 0 is dense ([0]*1+[1]*1): the fused norm and the MLP of the dense model
assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in shapes
assert not any(k.startswith("decoder.layers.0.mlp.experts") for k in shapes)
cfg = f.attrs["config"]
moe = json.loads(cfg if isinstance(cfg, str) else cfg.decode())["model"]["moe"]
assert moe["num_experts"] == 4 and moe["moe_router_topk"] == 2, moe
assert moe["moe_layer_pattern"] == "01" and moe["moe_ffn_hidden_size"] == 32, moe
assert "optimizer/exp_avg/" + L1 + "mlp.experts.experts.linear_fc1.weight" in f
print("ok")
EOF
    assert_output ok
}

@test "exact resume: 6 iterations == 3, stop, resume for 3 more (losses, balancing losses, weights)" {
    require_python_module h5py
    run -0 "$MC_TRAIN" "${moe[@]}" --train-iters 6 --log-json full.jsonl --save full
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --train-iters 6 --log-json half.jsonl --save half \
        --exit-interval 3
    assert_output "half/iter_0000003"
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --train-iters 6 --log-json half.jsonl \
        --save half --load half
    assert_output "half/iter_0000006"
    [[ "$stderr" == *"loaded checkpoint half/iter_0000003 at iteration 3"* ]]
    for k in "lm loss" load_balancing_loss z_loss grad-norm; do
        [ "$(grep -o "\"$k\": [^,}]*" half.jsonl | wc -l)" = 6 ]
        diff <(grep -o "\"$k\": [^,}]*" full.jsonl) <(grep -o "\"$k\": [^,}]*" half.jsonl)
    done
    same_weights full/iter_0000006/model.h5 half/iter_0000006/model.h5
}

@test "exact resume with sigmoid routing, the expert bias, capacity and a shared expert" {
    require_python_module h5py
    local x=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias
             --moe-router-bias-update-rate 1e-2 --moe-expert-capacity-factor 1.0
             --moe-shared-expert-intermediate-size 48)
    run -0 "$MC_TRAIN" "${moe[@]}" "${x[@]}" --train-iters 6 --log-json full.jsonl --save full
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" "${x[@]}" --train-iters 6 \
        --log-json half.jsonl --save half --exit-interval 3
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" "${x[@]}" --train-iters 6 \
        --log-json half.jsonl --save half --load half
    for k in "lm loss" load_balancing_loss grad-norm; do
        [ "$(grep -o "\"$k\": [^,}]*" half.jsonl | wc -l)" = 6 ]
        diff <(grep -o "\"$k\": [^,}]*" full.jsonl) <(grep -o "\"$k\": [^,}]*" half.jsonl)
    done
    same_weights full/iter_0000006/model.h5 half/iter_0000006/model.h5
    # the bias moved (by multiples of the rate), and is in the checkpoint (with
    # --moe-pad-expert-input-to-capacity it would not: every expert counts
    # its capacity then, as in Megatron)
    "$MC_PYTHON" -c '
import sys, h5py, numpy as np
b = h5py.File(sys.argv[1])["model/decoder.layers.0.mlp.router.expert_bias"][()]
assert b.shape == (4,) and np.abs(b).max() > 0, b
assert np.allclose(b / 1e-2, np.round(b / 1e-2), atol=1e-4), b' full/iter_0000006/model.h5
}

@test "--use-checkpoint-args takes the MoE configuration from the checkpoint" {
    run -0 "$MC_TRAIN" "${moe[@]}" --train-iters 2 --save ck --moe-router-pre-softmax
    run -0 --separate-stderr "$MC_TRAIN" --load ck --use-checkpoint-args --mock-data \
        --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-3 --train-iters 3 \
        --eval-iters 0 --log-interval 1 --save ck
    [[ "$stderr" == *"load_balancing_loss"* ]]
    assert_output "ck/iter_0000003"
}

@test "--dry-run counts the experts: total and active parameters equal the checkpoint's" {
    require_python_module h5py
    local shape=(--moe-router-topk 2 --moe-layer-freq 2 --num-experts 8)
    run -0 "$MC_TRAIN" "${moe[@]}" "${shape[@]}" --train-iters 1 --dry-run
    echo "$output" > plan.txt
    run -0 "$MC_TRAIN" "${moe[@]}" "${shape[@]}" --train-iters 0 --save ck
    n=$("$MC_PYTHON" -c '
import sys, h5py
f = h5py.File(sys.argv[1], "r")
print(sum(v.size for v in f["model"].values()))' ck/iter_0000000/model.h5)
    # layer 0 MoE (freq 2): 6 of its 8 experts are idle for a token; an
    # expert is SwiGLU fc1 [64, 64] + fc2 [64, 32]
    active=$((n - 6 * (64 * 64 + 64 * 32)))
    grep -q "^model: $n parameters ($active active per token" plan.txt
    grep -q "parameters: $n elements" plan.txt
}

@test "bad MoE input: one line naming the option, exit status 2, nothing trained or written" {
    local base=(--model tiny-llama --seq-length 16 --mock-data --vocab-size 64 --lr 1e-3
                --train-iters 1 --save ck --threads 1)
    bad() {
        run --separate-stderr "$MC_TRAIN" "${base[@]}" "$@"
        assert_failure 2
        [ "$(printf '%s\n' "$stderr" | wc -l)" = 1 ]
        [[ "$stderr" == "mc-train: error: "* ]]
        [ ! -e ck ]
    }
    bad --num-experts 4 --moe-router-topk 5
    [[ "$stderr" == *"--moe-router-topk (5) must be between 1 and --num-experts (4)"* ]]
    bad --num-experts 8 --moe-router-num-groups 4 --moe-router-group-topk 5
    [[ "$stderr" == *"--moe-router-group-topk (5) must be at most --moe-router-num-groups (4)"* ]]
    bad --num-experts 8 --moe-router-num-groups 3 --moe-router-group-topk 1
    [[ "$stderr" == *"--num-experts (8) must be a multiple of --moe-router-num-groups (3)"* ]]
    bad --num-experts 8 --moe-router-topk 3 --moe-router-num-groups 4 --moe-router-group-topk 2
    [[ "$stderr" == *"--moe-router-topk (3) must be a multiple of --moe-router-group-topk (2)"* ]]
    bad --num-experts 8 --moe-router-topk 2 --moe-router-num-groups 4
    [[ "$stderr" == *"--moe-router-num-groups and --moe-router-group-topk go together"* ]]
    bad --num-experts 4 --moe-expert-capacity-factor 0
    [[ "$stderr" == *"--moe-expert-capacity-factor must be greater than 0 (got 0)"* ]]
    bad --num-experts 4 --moe-expert-capacity-factor -1.5
    [[ "$stderr" == *"--moe-expert-capacity-factor must be greater than 0 (got -1.5)"* ]]
    bad --num-experts 4 --moe-layer-freq '[1]*3'
    [[ "$stderr" == *"--moe-layer-freq lists 3 layers, --num-layers is 2"* ]]
    bad --num-experts 4 --moe-layer-freq '([0]+[2])'
    [[ "$stderr" == *"--moe-layer-freq '([0]+[2])': list entries must be 0 or 1"* ]]
    bad --num-experts 4 --moe-layer-freq '[1,0'
    [[ "$stderr" == *"expected ',' or ']'"* ]]
    bad --num-experts 4 --moe-router-score-function relu
    [[ "$stderr" == *"--moe-router-score-function"* ]]
    bad --num-experts 6 --expert-model-parallel-size 4
    [[ "$stderr" == *"--num-experts 6 is not divisible by --expert-model-parallel-size 4"* ]]
    bad --num-experts 4 --expert-tensor-parallel-size 2
    [[ "$stderr" == *"--expert-tensor-parallel-size 2 must divide --tensor-model-parallel-size 1"* ]]
    bad --moe-router-topk 2
    [[ "$stderr" == *"the --moe-* options need --num-experts"* ]]
    bad --num-experts 4 --moe-router-enable-expert-bias
    [[ "$stderr" == *"--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid"* ]]
    bad --num-experts 4 --moe-pad-expert-input-to-capacity
    [[ "$stderr" == *"--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor"* ]]
    bad --model tiny-gpt --num-experts 4 --moe-shared-expert-intermediate-size 32
    [[ "$stderr" == *"shared experts have no biases (Megatron's rule): add --disable-bias-linear"* ]]
}

@test "a checkpoint whose expert count differs from the flags: one line, exit 2, before training" {
    run -0 "$MC_TRAIN" "${moe[@]}" --train-iters 1 --save ck
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --num-experts 8 --train-iters 2 --load ck \
        --save ck2
    assert_failure 2
    [[ "$stderr" == *"the checkpoint has 4 experts, the flags say 8 (--num-experts)"* ]]
    [[ "$stderr" != *"iteration "*"/"* ]]
    [ ! -e ck2 ]
    # a dense run loading the MoE checkpoint, and the reverse
    local dense=(--model tiny-llama --seq-length 16 --micro-batch-size 2 --global-batch-size 4
                 --threads 1 --lr 1e-3 --eval-iters 0 --mock-data --vocab-size 64)
    run --separate-stderr "$MC_TRAIN" "${dense[@]}" --train-iters 2 --load ck
    assert_failure 2
    [[ "$stderr" == *"the checkpoint has 4 experts, the flags say 0 (--num-experts)"* ]]
    run -0 "$MC_TRAIN" "${dense[@]}" --train-iters 1 --save dense
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --train-iters 2 --load dense
    assert_failure 2
    [[ "$stderr" == *"the checkpoint has 0 experts, the flags say 4 (--num-experts)"* ]]
}

# (mc-export, mc-eval and mc-reshard run MoE checkpoints: export_hf_moe.bats,
# export_gguf.bats, eval_moe.bats; llm.c export refuses them: export_llmc.bats)

@test "a MoE checkpoint whose config.model claims wider experts than it stores is refused before the model is built" {
    require_python_module h5py
    run -0 "$MC_TRAIN" "${moe[@]}" --moe-layer-freq '[0,1]' --train-iters 1 --save ck
    "$MC_PYTHON" - ck/iter_0000001/model.h5 <<'EOF2'
import sys, json, h5py
with h5py.File(sys.argv[1], "r+") as f:
    cfg = f.attrs["config"]
    cfg = json.loads(cfg if isinstance(cfg, str) else cfg.decode())
    cfg["model"]["moe"]["moe_ffn_hidden_size"] = 1 << 20
    f.attrs["config"] = json.dumps(cfg)
EOF2
    # the architecture from the checkpoint (4 experts of fc1 2 x 2^20 rows)
    run --separate-stderr "$MC_TRAIN" --load ck --use-checkpoint-args --no-verify --save ck2 \
        --train-iters 2 --lr 1e-3 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
        --mock-data --vocab-size 64 --threads 1
    assert_failure 1
    [ "$(printf '%s\n' "$stderr" | wc -l)" = 1 ]
    [[ "$stderr" == *"model.h5: model/decoder.layers.1.mlp.experts.experts.linear_fc1.weight is [256, 64], config.model implies [8388608, 64]"* ]]
    [ ! -e ck2 ]
}
