#!/usr/bin/env bats
# --qk-layernorm (Megatron's q_layernorm/k_layernorm, Qwen3's q_norm/k_norm:
# each head's query and key normalized over the head dimension, weights
# [kv_channels] shared by the heads, after the QKV projection and before
# RoPE). The PyTorch golden is train_golden.bats's; here the grid: 20
# iterations under TP=2 with sequence parallelism, PP=2, DP=2 with the
# distributed optimizer, CP=2 (ring and all-to-all) give the single
# process's losses within 1e-6 relative and its final weights within 1e-6
# (mpi_common.bash), for Llama (RMSNorm) and GPT (LayerNorm with its bias);
# recomputation gives the same bits, a resumed run the uninterrupted
# run's losses bit for bit, and the checkpoint records the setting.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"

common=(--seq-length 16 --micro-batch-size 1 --threads 1 --lr 1e-3 --log-interval 5
        --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16
        --train-iters 20 --lr-warmup-iters 2 --global-batch-size 4)
# 8 heads in 4 groups: TP=2 and a2a at CP=2 split them
qk=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --qk-layernorm "${common[@]}")
qkgpt=(--model tiny-gpt --qk-layernorm "${common[@]}")

setup() {
    mpi_env
    [ -x "$MC_TRAIN" ] || skip "$MC_TRAIN not built"
    cd "$BATS_TEST_TMPDIR"
}

@test "--qk-layernorm: q_layernorm/k_layernorm in the checkpoint and its config, learned" {
    require_python_module h5py
    run -0 "$MC_TRAIN" "${qk[@]}" --train-iters 4 --lr-warmup-iters 1 --save ck
    run -0 "$MC_PYTHON" - ck/iter_0000004/model.h5 <<'PY'
import json, sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
cfg = json.loads(f.attrs["config"])["model"]
assert cfg["qk_layernorm"] is True, cfg
for l in range(cfg["num_layers"]):
    for n in ("q_layernorm", "k_layernorm"):
        w = f[f"model/decoder.layers.{l}.self_attention.{n}.weight"][()]
        assert w.shape == (cfg["kv_channels"],), w.shape
        assert np.any(w != 1.0), n  # trained away from its initial ones
        assert f"decoder.layers.{l}.self_attention.{n}.bias" not in f["model"]
print("ok")
PY
    assert_output ok
    # without the flag: no such tensors, no key
    run -0 "$MC_TRAIN" --model tiny-llama "${common[@]}" --train-iters 4 --lr-warmup-iters 1 \
        --save plain
    run -0 "$MC_PYTHON" -c '
import json, sys, h5py
f = h5py.File(sys.argv[1], "r")
assert "qk_layernorm" not in json.loads(f.attrs["config"])["model"]
assert not [k for k in f["model"] if "q_layernorm" in k]
print("ok")' plain/iter_0000004/model.h5
    assert_output ok
}

@test "--qk-layernorm: TP=2 with sequence parallelism, PP=2, DP=2 (distributed optimizer) match one process" {
    mpi_need
    equivalent tp2sp 2 qk --tensor-model-parallel-size 2 --sequence-parallel
    equivalent pp2 2 qk --pipeline-model-parallel-size 2
    equivalent dp2 2 qk --use-distributed-optimizer
}

@test "--qk-layernorm: CP=2 (p2p and a2a) and GPT's LayerNorm q/k norms at TP=2 match one process" {
    mpi_need
    equivalent cp2 2 qk --context-parallel-size 2 --cp-comm-type p2p
    equivalent cp2a2a 2 qk --context-parallel-size 2 --cp-comm-type a2a
    equivalent gtp2 2 qkgpt --tensor-model-parallel-size 2
}

@test "--qk-layernorm: recomputation gives the same bits; a resumed run the uninterrupted one's" {
    run -0 "$MC_TRAIN" "${qk[@]}" --log-json ref.jsonl --save ref
    run -0 "$MC_TRAIN" "${qk[@]}" --recompute-granularity full --recompute-method uniform \
        --recompute-num-layers 1 --log-json full.jsonl
    run -0 "$MC_TRAIN" "${qk[@]}" --recompute-granularity selective \
        --recompute-modules core_attn layernorm --log-json selective.jsonl
    for f in full selective; do
        run -0 diff <(grep -o '"lm loss": [^,}]*\|"grad-norm": [^,}]*' ref.jsonl) \
            <(grep -o '"lm loss": [^,}]*\|"grad-norm": [^,}]*' "$f.jsonl")
    done
    run -0 "$MC_TRAIN" "${qk[@]}" --exit-interval 10 --save half
    run -0 "$MC_TRAIN" "${qk[@]}" --load half --save half --log-json resumed.jsonl
    run -0 diff <(grep -o '"lm loss": [^,}]*' ref.jsonl | tail -n 10) \
        <(grep -o '"lm loss": [^,}]*' resumed.jsonl)
    if "$MC_PYTHON" -c 'import h5py' 2>/dev/null; then
        run -0 "$MC_PYTHON" - ref/iter_0000020/model.h5 half/iter_0000020/model.h5 <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert len(names) > 20 and any("k_layernorm" in n for n in names)
bad = [n for n in names if not np.array_equal(a[n][()], b[n][()])]
print("bit-exact" if not bad else "differ: %s" % bad[:3])
PY
        assert_output bit-exact
    fi
}

@test "--qk-layernorm: what a format cannot hold is refused in one line, leaving nothing" {
    local EXPORT="$top_builddir/tools/mc-export/mc-export"
    local small=(--seq-length 16 --micro-batch-size 1 --global-batch-size 1 --threads 1
                 --mock-data --vocab-size 64 --train-iters 0 --lr 1e-3 --qk-layernorm)
    "$MC_TRAIN" --model tiny-gpt "${small[@]}" --save gpt >/dev/null 2>&1
    run -1 "$EXPORT" gpt --format hf -o out
    assert_output "mc-export: error: gpt/iter_0000000/model.h5: GPT2LMHeadModel (the format for learned absolute positions) needs no query/key norm; this model has --qk-layernorm"
    run -1 "$EXPORT" gpt --format llmc -o out.bin
    assert_output "mc-export: error: gpt/iter_0000000/model.h5: llm.c's GPT-2 needs no query/key norm (this model has --qk-layernorm)"
    "$MC_TRAIN" --model tiny-gpt --normalization RMSNorm --swiglu --position-embedding-type rope \
        "${small[@]}" --save bias >/dev/null 2>&1
    run -1 "$EXPORT" bias --format hf -o out
    assert_output "mc-export: error: bias/iter_0000000/model.h5: Qwen3ForCausalLM (the format for rotary positions with --qk-layernorm) needs no biases in the MLP; this model has biases (no --disable-bias-linear)"
    "$MC_TRAIN" --model tiny-llama --num-experts 4 --moe-shared-expert-intermediate-size 32 \
        "${small[@]}" --save shared >/dev/null 2>&1
    run -1 "$EXPORT" shared --format hf -o out
    assert_output "mc-export: error: shared/iter_0000000/model.h5: Qwen3MoeForCausalLM (the format for a mixture of experts) needs no shared experts; this model has --moe-shared-expert-intermediate-size"
    "$MC_TRAIN" --model tiny-llama --num-experts 4 --moe-router-pre-softmax "${small[@]}" \
        --save pre >/dev/null 2>&1
    run -1 "$EXPORT" pre --format gguf -o out.gguf
    assert_output --partial "GGUF's qwen3moe architecture (the format for a mixture of experts) needs the top-k probabilities renormalized; this model has --moe-router-pre-softmax (Qwen3MoeForCausalLM (--format hf) holds it)"
    run ls -A
    assert_output "$(printf 'bias\ngpt\npre\nshared')"
}

@test "--qk-layernorm: --dry-run plans the activation block to the byte, with and without recomputation" {
    local a=(--model tiny-llama --qk-layernorm --num-layers 5 --vocab-size 512 --seq-length 64
             --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --mock-data --train-iters 1
             --threads 1)
    for rc in none full; do
        local extra=()
        [ "$rc" = none ] || extra=(--recompute-granularity full --recompute-method uniform
                                   --recompute-num-layers 2)
        run -0 --separate-stderr "$MC_TRAIN" "${a[@]}" "${extra[@]}"
        local ran planned
        ran=$(grep -o 'activations (stage 0): [0-9]* bytes' <<<"$stderr" | grep -o '[0-9]* bytes')
        run -0 --separate-stderr "$MC_TRAIN" "${a[@]}" "${extra[@]}" --dry-run
        planned=$(grep -o '^  activations: [0-9]* bytes' <<<"$output$stderr" | grep -o '[0-9]* bytes')
        echo "# $rc: ran $ran, planned $planned" >&3
        [ -n "$ran" ] && [ "$ran" = "$planned" ]
    done
}

@test "--qk-layernorm: TP=2 (with and without SP) moves the bytes and calls --dry-run plans (--log-comm)" {
    mpi_need
    local a=("${qk[@]}" --train-iters 10 --tensor-model-parallel-size 2 --log-comm)
    for sp in "" --sequence-parallel; do
        # shellcheck disable=SC2086
        mpi_exec 120 2 "$MC_TRAIN" "${a[@]}" $sp 2>err.txt >/dev/null
        local m p
        m=$(grep '^ comm per iteration:' err.txt | tail -1 | sed 's/^ comm per iteration://' |
            tr '|' '\n' | awk '$1 == "tp" && $2 != "scalar:" { c += $3; b += $5 * 1e6 }
                              END { printf "%.0f %.0f\n", b, c }')
        # shellcheck disable=SC2086
        p=$("$MC_TRAIN" "${a[@]}" $sp --dry-run --world-size 2 |
            awk 'index($0, "tensor-parallel group:") && !d { print $3, $7; d = 1 }')
        echo "# tp${sp:+ with sp}: measured bytes/calls $m, planned $p" >&3
        [ -n "$p" ]
        awk -v m="$m" -v p="$p" 'BEGIN { split(m, x, " "); split(p, y, " ");
            d = x[1] - y[1]; exit !(d <= 1 && d >= -1 && x[2] == y[2]) }'
    done
}
