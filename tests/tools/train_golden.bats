#!/usr/bin/env bats
# train_golden.bats - mc-train against PyTorch: 20 iterations of tiny-gpt and
# tiny-llama (T=32, NullTokenizer with 300 ids, micro-batch 2, global batch 4,
# warmup then linear or cosine decay, AdamW with weight decay, clipping at 1)
# on the dataset tests/data/train/docs.txt, from mc's initial weights, compared
# with the values tests/golden/torch_train.py computed in PyTorch and
# committed (tests/data/train/golden_{gpt,llama}_{fp32,bf16}.json, and
# golden_llama_qk_fp32.json: tiny-llama with --qk-layernorm): every
# iteration's lm loss, gradient norm and learning rate, and the final weights'
# per-tensor sum and sum of squares. tests/golden/check_train_golden.py does
# the comparison and states the tolerances (fp32: loss 1e-6, grad norm 5e-6,
# sum of squares 2e-6 relative; bf16: loss 2e-3, grad norm 2e-2, sum of
# squares 1e-2, and in the first iteration loss 1e-6, grad norm 1e-4).
# Also: --train-iters 0 writes the initial state, which the golden started
# from.
#
# Needs numpy and h5py in $MC_PYTHON (skips, saying why, without them).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
CHECK="$top_srcdir/tests/golden/check_train_golden.py"
GOLDEN="$top_srcdir/tests/data/train"

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# The dataset, once per file: docs.txt through mc-preprocess's NullTokenizer.
dataset() {
    local p="$BATS_FILE_TMPDIR/docs"
    if [ ! -f "${p}_text_document.idx" ]; then
        "$MC_PREPROCESS" --input "$GOLDEN/docs.txt" --input-format text --lines \
            --tokenizer-type NullTokenizer --vocab-size 300 --output-prefix "$p" \
            --quiet >/dev/null
    fi
    echo "${p}_text_document"
}

# The mc-train arguments a golden file records, one per line.
golden_args() {
    "$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["mc_train_args"]))' "$1"
}

# Train as the golden did and compare: $1 is gpt or llama, $2 fp32, bf16 or fp8.
# Also checks the --train-iters 0 checkpoint against the golden's initial
# weights (mc's initialization must be what PyTorch started from).
check_golden() {
    require_python_module h5py
    local g="$GOLDEN/golden_$1_$2.json" data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args "$g")
    [ "${#args[@]}" -gt 20 ]
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --data-path "$data" --log-json log.jsonl \
        --save ck
    assert_output --partial "iteration       20/      20"
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --train-iters 0 --mock-data --save init
    run "$MC_PYTHON" "$CHECK" "$g" log.jsonl ck/iter_0000020/model.h5 init/iter_0000000/model.h5
    echo "$output"
    assert_success
    assert_output --partial "largest loss error"
    refute_output --partial FAIL
}

@test "--train-iters 0 saves the initial state as iter_0000000 and trains nothing" {
    require_python_module h5py
    local common=(--model tiny-gpt --num-layers 1 --seq-length 16 --mock-data --vocab-size 64
                  --micro-batch-size 2 --global-batch-size 4 --threads 1 --lr 1e-3
                  --log-interval 1 --eval-iters 0)
    run -0 --separate-stderr "$MC_TRAIN" "${common[@]}" --train-iters 0 --save ck
    assert_output "ck/iter_0000000"
    [ "$(cat ck/latest_checkpointed_iteration.txt)" = 0 ]
    [[ "$stderr" != *"consumed samples:"* ]]
    [[ "$stderr" == *"saved checkpoint from iteration       0"* ]]
    # The weights are the initialization (not zero), the Adam moments zero,
    # the counters 0.
    run -0 "$MC_PYTHON" - ck/iter_0000000/model.h5 <<'EOF'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert int(f.attrs["iteration"]) == 0 and int(f.attrs["consumed_samples"]) == 0
w = f["model/decoder.layers.0.self_attention.linear_qkv.weight"][()]
assert 0.015 < w.std() < 0.025, w.std()
for g in ("exp_avg", "exp_avg_sq"):
    assert all(not np.any(f["optimizer"][g][k][()]) for k in f["optimizer"][g]), g
print("ok", len(f["model"]))
EOF
    assert_output --regexp '^ok [0-9]+$'
    # Resuming from it is the run that starts from scratch, loss for loss.
    run -0 "$MC_TRAIN" "${common[@]}" --train-iters 3 --log-json fresh.jsonl
    run -0 --separate-stderr "$MC_TRAIN" "${common[@]}" --train-iters 3 \
        --log-json resumed.jsonl --load ck --save ck
    assert_output "ck/iter_0000003"
    [[ "$stderr" == *"loaded checkpoint ck/iter_0000000 at iteration 0"* ]]
    [ "$(grep -c 'lm loss' fresh.jsonl)" -eq 3 ]
    run -0 diff <(grep -o '"lm loss": [^,}]*' fresh.jsonl) <(grep -o '"lm loss": [^,}]*' resumed.jsonl)
    # With a loaded checkpoint, --train-iters 0 writes nothing new and
    # names the loaded one.
    run -0 --separate-stderr "$MC_TRAIN" "${common[@]}" --train-iters 0 --load ck --save ck
    assert_output "ck/iter_0000003"
    # Still exactly one of the two lengths.
    run -2 "$MC_TRAIN" "${common[@]}" --train-iters 0 --train-samples 8
    assert_output --partial "exactly one of --train-iters and --train-samples"
    run -2 "$MC_TRAIN" "${common[@]}" --train-iters -1
    assert_output --partial "--train-iters"
}

@test "tiny-gpt fp32 matches PyTorch for 20 iterations (losses, grad norms, weights)" {
    check_golden gpt fp32
}

@test "tiny-gpt bf16 matches PyTorch with bf16-rounded GEMM operands" {
    check_golden gpt bf16
}

@test "tiny-llama fp32 matches PyTorch for 20 iterations (losses, grad norms, weights)" {
    check_golden llama fp32
}

@test "tiny-llama bf16 matches PyTorch with bf16-rounded GEMM operands" {
    check_golden llama bf16
}

@test "tiny-gpt --fp8-format hybrid matches PyTorch's FP8 recipe (exact for 3 iterations, then close)" {
    check_golden gpt fp8
}

@test "tiny-llama --fp8-format hybrid matches PyTorch's FP8 recipe (exact for 3 iterations, then close)" {
    check_golden llama fp8
}

@test "tiny-llama --qk-layernorm fp32 matches PyTorch for 20 iterations (Qwen3's q/k norms)" {
    check_golden llama_qk fp32
}

@test "the golden comparison fails on a loss, a grad norm or a weight off by its tolerance" {
    require_python_module h5py
    local g="$GOLDEN/golden_gpt_fp32.json" data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args "$g")
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --data-path "$data" --log-json log.jsonl \
        --save ck
    run -0 "$MC_PYTHON" "$CHECK" "$g" log.jsonl ck/iter_0000020/model.h5
    # One loss 1e-5 off (relative) fails; so does one grad norm.
    "$MC_PYTHON" - log.jsonl <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for key, out in (("lm loss", "loss.jsonl"), ("grad-norm", "norm.jsonl")):
    with open(out, "w") as f:
        for r in rows:
            r2 = dict(r)
            if r2["step"] == 7:
                r2[key] *= 1 + 1e-5
            f.write(json.dumps(r2) + "\n")
EOF
    run -1 "$MC_PYTHON" "$CHECK" "$g" loss.jsonl ck/iter_0000020/model.h5
    assert_output --partial "FAIL iteration 7 lm loss"
    run -1 "$MC_PYTHON" "$CHECK" "$g" norm.jsonl ck/iter_0000020/model.h5
    assert_output --partial "FAIL iteration 7 grad norm"
    # A missing iteration fails.
    head -n 19 log.jsonl > short.jsonl
    run -1 "$MC_PYTHON" "$CHECK" "$g" short.jsonl ck/iter_0000020/model.h5
    assert_output --partial "19 iterations logged, the golden has 20"
    # One weight of the final checkpoint set to 0.5 (they are ~0.02) fails
    # its tensor.
    cp ck/iter_0000020/model.h5 moved.h5
    "$MC_PYTHON" - moved.h5 <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    d = f["model/decoder.layers.1.mlp.linear_fc2.weight"]
    w = d[()]
    w[3, 5] = 0.5
    d[...] = w
EOF
    run -1 "$MC_PYTHON" "$CHECK" "$g" log.jsonl moved.h5
    assert_output --partial "FAIL final decoder.layers.1.mlp.linear_fc2.weight"
    # An fp32 run is not the bf16 golden (its first iteration gives it away).
    run -1 "$MC_PYTHON" "$CHECK" "$GOLDEN/golden_gpt_bf16.json" log.jsonl \
        ck/iter_0000020/model.h5
    assert_output --partial "FAIL iteration 1 grad norm"
    # The initial weights of another seed are not the golden's.
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --train-iters 0 --mock-data --seed 99 --save init
    run -1 "$MC_PYTHON" "$CHECK" "$g" log.jsonl ck/iter_0000020/model.h5 \
        init/iter_0000000/model.h5
    assert_output --partial "FAIL initial embedding.word_embeddings.weight"
}
