#!/usr/bin/env bats
# eval_moe.bats - mixture-of-experts checkpoints through inference (issue
# 13, section 3): mc-eval's perplexity of mc-train's validation samples
# equal to the validation loss mc-train logged (1e-6 relative) for softmax
# top-2 with a shared expert (SwiGLU), sigmoid top-4 with a trained expert
# bias and group-limited routing (GELU, every other layer) and a capacity
# factor; tasks and generation, and the same under tensor parallelism;
# under expert parallelism (EP=2, EP=4 with a capacity factor) one
# process's bits, and EP=2 x TP=2 TP=2's; its bad grids exit 2;
# mc-serve's concurrent requests each equal to running alone and to
# mc-eval's greedy output, and under TP=2, EP=2 and EP=2 x TP=2 equal to
# one process bit for bit;
# mc-reshard's dtype, int8 and pre-split
# checkpoints (the expert tensors' layout kept, mc-eval's perplexity exact
# in fp32 and within a measured margin in bf16 and int8). The incremental
# decoding's equality with the full forward is tests/unit/test_infer's.

bats_require_minimum_version 1.5.0
load common
load mpi_common
load serve_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
MC_SERVE="$top_builddir/tools/mc-serve/mc-serve"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
D="$top_srcdir/tests/data/eval"
TOK="$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"

# the tiny Llama of eval.bats (initial weights, std 0.3, its tokenizer
# stored) with 4 SwiGLU experts of 48, top-2, and a shared expert of 32
moe=(--num-experts 4 --moe-ffn-hidden-size 48 --moe-router-topk 2
     --moe-shared-expert-intermediate-size 32 --moe-aux-loss-coeff 1e-2)

setup_file() {
    "$MC_TRAIN" "@$D/llama.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        "${moe[@]}" --save "$BATS_FILE_TMPDIR/moe" >/dev/null 2>&1
}

setup() {
    cd "$BATS_TEST_TMPDIR"
    G="$BATS_FILE_TMPDIR/moe"
    SPID=
}

teardown() {
    serve_kill
}

json() {
    "$MC_PYTHON" -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"
}

# close A B TOL: |A - B| <= TOL |B|
close() {
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; exit !(d <= t * b) }'
}

# A small dataset of random documents (ds_text_document), as eval.bats's
dataset() {
    awk 'BEGIN { srand(3); for (d = 0; d < 200; d++) { n = 5 + int(rand() * 40); s = "";
         for (i = 0; i < n; i++) s = s (i ? " " : "") int(rand() * 50);
         printf "{\"text\": \"%s\"}\n", s } }' > docs.jsonl
    "$MC_PREPROCESS" --quiet --tokenizer-type NullTokenizer --vocab-size 50 --append-eod \
        --output-prefix ds docs.jsonl
}

# samples_equal NAME MODEL-ARGS...: train 4 iterations with validation,
# then mc-eval's NLL of the same validation samples = the logged loss
samples_equal() {
    local name=$1
    shift
    "$MC_TRAIN" --num-layers 2 --hidden-size 32 --seq-length 24 --global-batch-size 4 \
        --train-iters 4 --lr 3e-3 --threads 1 --tokenizer-type NullTokenizer --vocab-size 50 \
        --data-path ds_text_document --eval-iters 3 --eval-interval 1000 --split 80,15,5 \
        --seed 99 --save "ck_$name" --log-json "log_$name.json" "$@" > /dev/null 2>&1
    want=$(grep -o '"lm loss validation": [^,}]*' "log_$name.json" | sed 's/.*: //')
    "$MC_EVAL" "ck_$name" --quiet --data-path ds_text_document --ppl-mode samples \
        --eval-split valid --split 80,15,5 --seed 99 --eval-samples 12 > "s_$name.json"
    got=$(json "s_$name.json" 'repr(d["perplexity"]["nll"])')
    echo "# $name: mc-train validation loss $want, mc-eval NLL $got" >&3
    [ -n "$want" ]
    close "$got" "$want" 1e-6
    [ "$(json "s_$name.json" 'd["perplexity"]["scored_tokens"]')" = 288 ]
}

@test "--ppl-mode samples: softmax top-2 with a shared expert (SwiGLU) gives mc-train's validation loss" {
    require_python_module json
    dataset
    samples_equal softmax --model tiny-llama --micro-batch-size 2 --num-experts 4 \
        --moe-ffn-hidden-size 48 --moe-router-topk 2 --moe-shared-expert-intermediate-size 32 \
        --moe-aux-loss-coeff 1e-2
}

@test "--ppl-mode samples: sigmoid top-4, trained expert bias, group-limited routing (GELU) gives mc-train's validation loss" {
    require_python_module h5py
    dataset
    samples_equal sigmoid --model tiny-gpt --micro-batch-size 2 --num-experts 8 \
        --moe-ffn-hidden-size 40 --moe-router-topk 4 --moe-router-score-function sigmoid \
        --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2 \
        --moe-router-num-groups 4 --moe-router-group-topk 2 --moe-router-topk-scaling-factor 2.5 \
        --moe-layer-freq 2
    # the bias the choice used is not zero
    "$MC_PYTHON" - ck_sigmoid/iter_0000004/model.h5 <<'EOF'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
b = f["model/decoder.layers.0.mlp.router.expert_bias"][()]
print("# expert bias", b)
assert np.abs(b).max() > 0
EOF
}

@test "--ppl-mode samples: a capacity factor drops over each sample as mc-train's micro-batch of one" {
    # capacity ceil(24 x 2 / 4 x 0.5) = 6 of an expert's 24 x 2 / 4 = 12 choices on average: drops
    dataset
    samples_equal capacity --model tiny-llama --micro-batch-size 1 --num-experts 4 \
        --moe-ffn-hidden-size 48 --moe-router-topk 2 --moe-expert-capacity-factor 0.5
}

@test "tasks, perplexity and generation on a MoE checkpoint; TP=2 gives one process's values" {
    require_python_module json
    args=(--threads 1 --quiet --ctx-size 64 --log-samples --task "hellaswag=$D/hellaswag.jsonl"
          --text-file "$D/text.txt" --prompt-file "$D/prompts.txt" --max-new-tokens 16)
    "$MC_EVAL" "$G" "${args[@]}" > one.json
    "$MC_PYTHON" - one.json <<'EOF'
import json, sys, math
d = json.load(open(sys.argv[1]))
assert math.isfinite(d["perplexity"]["ppl"]) and d["perplexity"]["ppl"] > 1, d["perplexity"]
assert 0 <= d["tasks"]["hellaswag"]["acc"] <= 1
assert all(len(g["tokens"]) == 16 for g in d["generations"]), d["generations"]
print("# one process: ppl %.4f, hellaswag acc %.3f" % (d["perplexity"]["ppl"], d["tasks"]["hellaswag"]["acc"]))
EOF
    mpi_setup
    mpi_exec 120 2 "$MC_EVAL" --tensor-model-parallel-size 2 "$G" "${args[@]}" > two.json
    "$MC_PYTHON" - one.json two.json <<'EOF' >&3
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
d = abs(a["perplexity"]["nll"] - b["perplexity"]["nll"]) / a["perplexity"]["nll"]
worst = max(abs(x - y) / max(1, abs(y))
            for s, t in zip(a["tasks"]["hellaswag"]["samples"], b["tasks"]["hellaswag"]["samples"])
            for x, y in zip(s["loglikelihoods"], t["loglikelihoods"]))
same = [g["tokens"] for g in a["generations"]] == [g["tokens"] for g in b["generations"]]
print("# TP=2: NLL within %.2e, log-likelihoods within %.2e, generation %s" % (d, worst, "identical" if same else "DIFFERS"))
sys.exit(0 if d <= 1e-6 and worst <= 1e-5 and same and b["tensor_model_parallel_size"] == 2 else 1)
EOF
}

# same_json A B: perplexity, every log-likelihood and every generation of
# two mc-eval documents equal bit for bit (JSON's repr of the doubles)
same_json() {
    "$MC_PYTHON" - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert repr(a["perplexity"]["nll"]) == repr(b["perplexity"]["nll"]), (a["perplexity"], b["perplexity"])
if "tasks" in a:
    for s, t in zip(a["tasks"]["hellaswag"]["samples"], b["tasks"]["hellaswag"]["samples"]):
        assert s["loglikelihoods"] == t["loglikelihoods"], (s, t)
if "generations" in a:
    assert [g["tokens"] for g in a["generations"]] == [g["tokens"] for g in b["generations"]]
EOF
}

@test "expert parallelism: EP=2 gives one process's perplexity, log-likelihoods and generations bit for bit; EP=2 x TP=2 gives TP=2's" {
    require_python_module json
    args=(--threads 1 --quiet --ctx-size 64 --log-samples --task "hellaswag=$D/hellaswag.jsonl"
          --text-file "$D/text.txt" --prompt-file "$D/prompts.txt" --max-new-tokens 16)
    "$MC_EVAL" "$G" "${args[@]}" > one.json
    mpi_setup
    mpi_exec 120 2 "$MC_EVAL" --expert-model-parallel-size 2 "$G" "${args[@]}" > ep2.json
    same_json one.json ep2.json
    [ "$(json ep2.json 'd["expert_model_parallel_size"]')" = 2 ]
    [ "$(json ep2.json 'd["tensor_model_parallel_size"]')" = 1 ]
    # TP sums the dense layers' partial products over the group (one
    # process's values to rounding); EP on top of it changes no bit
    mpi_exec 120 2 "$MC_EVAL" --tensor-model-parallel-size 2 "$G" "${args[@]}" > tp2.json
    mpi_exec 180 4 "$MC_EVAL" --tensor-model-parallel-size 2 --expert-model-parallel-size 2 \
        "$G" "${args[@]}" > tp2ep2.json
    same_json tp2.json tp2ep2.json
    got=$(json tp2ep2.json 'repr(d["perplexity"]["nll"])')
    want=$(json one.json 'repr(d["perplexity"]["nll"])')
    echo "# EP=2: one process's bits; EP=2 x TP=2: TP=2's bits, NLL $got vs one process $want" >&3
    close "$got" "$want" 1e-6
}

@test "expert parallelism: EP=4 with a capacity factor, sigmoid routing, GELU experts with biases, fp32 and int8: one process's bits" {
    require_python_module json
    # 8 experts of a GPT (biases on every linear), capacity ceil(n 2 / 8 x 0.5): drops
    "$MC_TRAIN" "@$D/gpt.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        --num-experts 8 --moe-ffn-hidden-size 24 --moe-router-topk 2 \
        --moe-router-score-function sigmoid --moe-expert-capacity-factor 0.5 --save cap >/dev/null
    args=(--threads 1 --quiet --ctx-size 64 --text-file "$D/text.txt" --prompt x --max-new-tokens 8)
    "$MC_EVAL" cap "${args[@]}" > one.json
    mpi_setup
    mpi_exec 180 4 "$MC_EVAL" --expert-model-parallel-size 4 cap "${args[@]}" > ep4.json
    same_json one.json ep4.json
    echo "# EP=4: NLL $(json ep4.json 'repr(d["perplexity"]["nll"])'), one process's bits" >&3
    # int8 codes of each rank's experts: one process's codes
    "$MC_EVAL" cap "${args[@]}" --weights int8 > one8.json
    mpi_exec 180 4 "$MC_EVAL" --expert-model-parallel-size 4 cap "${args[@]}" --weights int8 > ep4_8.json
    same_json one8.json ep4_8.json
    [ "$(json ep4_8.json 'd["weights"]')" = int8 ]
}

@test "expert parallelism: experts not divisible by EP, a dense checkpoint, a world that is not TP x EP: one line, exit 2" {
    mpi_setup
    run --separate-stderr mpi_exec 120 3 "$MC_EVAL" --expert-model-parallel-size 3 "$G" --quiet \
        --prompt x
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'mc-eval: error:')" = 1 ]
    [[ "$stderr" == *"the model's 4 experts are not divisible by --expert-model-parallel-size 3"* ]]
    "$MC_TRAIN" "@$D/llama.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        --save dense >/dev/null
    run --separate-stderr mpi_exec 120 2 "$MC_EVAL" --expert-model-parallel-size 2 dense --quiet \
        --prompt x
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'mc-eval: error:')" = 1 ]
    [[ "$stderr" == *"--expert-model-parallel-size 2 needs a mixture of experts, and this model has no experts"* ]]
    run --separate-stderr mpi_exec 120 2 "$MC_EVAL" --tensor-model-parallel-size 2 \
        --expert-model-parallel-size 2 "$G" --quiet --prompt x
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'mc-eval: error:')" = 1 ]
    [[ "$stderr" == *"2 ranks do not divide into tensor-parallel 2 x pipeline-parallel 1 x context-parallel 1 x expert-parallel 2 = 4 ranks"* ]]
    run --separate-stderr mpi_exec 120 4 "$MC_EVAL" --expert-model-parallel-size 2 "$G" --quiet \
        --prompt x
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'mc-eval: error:')" = 1 ]
    [[ "$stderr" == *"4 ranks for --tensor-model-parallel-size 1 x --expert-model-parallel-size 2: evaluation runs one group of 2 ranks, start 2 ranks"* ]]
    run --separate-stderr "$MC_EVAL" --expert-model-parallel-size 2 "$G" --quiet --prompt x
    assert_failure 2
    [[ "$stderr" == *"--expert-model-parallel-size 2 needs 2 ranks and this is one process"* ]]
    if [ -x "$MC_SERVE" ]; then
        run --separate-stderr mpi_exec 120 3 "$MC_SERVE" --expert-model-parallel-size 3 "$G" \
            --port 0 < <(:)
        assert_failure 2
        [ "$(printf '%s\n' "$stderr" | grep -c 'mc-serve: error:')" = 1 ]
        [[ "$stderr" == *"the model's 4 experts are not divisible by --expert-model-parallel-size 3"* ]]
    fi
}

# --- mc-serve -----------------------------------------------------------

# (serve, serve_tp, stop_tp, metric, until_metric, client, together and
# eval_greedy: serve_common.bash)

# The grid tests' reference: 8 requests (specs.json) served by one process
# (one.json), then mpirun set up for the grid.
one_process_specs() {
    mpi_setup
    serve --max-batch 8
    client specs 8 specs.json
    client run specs.json one.json
    kill -TERM "$SPID"; wait "$SPID" || true
}

@test "mc-serve: 16 concurrent requests on a MoE model each equal running alone, greedy ones mc-eval's output" {
    [ -x "$MC_SERVE" ] || skip "mc-serve is not built"
    require_python_module openai
    serve --max-batch 16
    client specs 16 specs.json
    client run specs.json alone.json
    for p in "The river" "x"; do
        want=$(eval_greedy "$p" 20)
        [ "$(client complete "$p" 20)" = "$want" ]
    done
    kill -TERM "$SPID"; wait "$SPID" || true
    together 16 serve --max-batch 16
    cmp alone.json together.json
    max=$(metric mc_serve_batch_size_max)
    echo "# 16 requests identical alone and together; largest batch $max" >&3
    [ "$max" -gt 1 ]
    kill -TERM "$SPID"; wait "$SPID" || true
    # the experts' int8 codes and bf16 values through the same kernels
    for w in int8 bf16; do
        together 16 serve --max-batch 16 --weights $w
        mv together.json together_$w.json
        kill -TERM "$SPID"; wait "$SPID" || true
        serve --weights $w
        client run specs.json alone_$w.json
        kill -TERM "$SPID"; wait "$SPID" || true
        cmp alone_$w.json together_$w.json
    done
}

@test "mc-serve TP=2 on a MoE model: one process's tokens and log-probabilities, bit for bit, batch invariant" {
    [ -x "$MC_SERVE" ] || skip "mc-serve is not built"
    require_python_module openai
    one_process_specs
    together 8 serve_tp --max-batch 8
    client run specs.json alone.json
    cmp alone.json together.json
    "$MC_PYTHON" - <<'EOF2' >&3
import json
one, tp, specs = (json.load(open(f)) for f in ("one.json", "alone.json", "specs.json"))
# every request, greedy and seeded: the row-parallel linears regrouped by
# output rows (infer_batch.c) and the experts whole on every rank, so each
# sum is formed as in one process
n = 0
for s, a, b in zip(specs, one, tp):
    assert a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"], (s, a, b)
    n += s["temperature"] == 0
print("# TP=2: %d requests (%d greedy), one process's tokens and log-probabilities bit for bit" % (len(specs), n))
assert n >= 2 and len(one) == len(tp) == len(specs)
EOF2
    # SIGTERM to every rank (as srun or scancel do): they finish and exit 0
    stop_tp
    [ "$rc" = 0 ] || { cat serve.log; false; }
}

@test "mc-serve EP=2 and EP=2 x TP=2 on a MoE model: one process's tokens and log-probabilities, bit for bit, batch invariant" {
    [ -x "$MC_SERVE" ] || skip "mc-serve is not built"
    require_python_module openai
    one_process_specs
    # each rank runs 2 of the 4 experts, the outputs all-gathered, every
    # token's top-2 added in one process's order
    together 8 serve_grid 2 --expert-model-parallel-size 2 --max-batch 8
    client run specs.json alone.json
    cmp alone.json together.json
    cmp one.json alone.json
    grep -q "expert parallel" serve.log
    stop_tp
    [ "$rc" = 0 ] || { cat serve.log; false; }
    # on int8 weights too (each rank quantizes its experts' rows)
    serve --max-batch 8 --weights int8
    client run specs.json one_int8.json
    kill -TERM "$SPID"; wait "$SPID" || true
    serve_grid 4 --tensor-model-parallel-size 2 --expert-model-parallel-size 2 --max-batch 8 \
        --weights int8
    client run specs.json tp2ep2_int8.json
    stop_tp
    [ "$rc" = 0 ] || { cat serve.log; false; }
    cmp one_int8.json tp2ep2_int8.json
    "$MC_PYTHON" - <<'EOF2' >&3
import json
specs = json.load(open("specs.json"))
print("# EP=2 (fp32) and EP=2 x TP=2 (int8): %d requests (%d greedy), one process's tokens and log-probabilities bit for bit" % (len(specs), sum(s["temperature"] == 0 for s in specs)))
EOF2
}

@test "mc-serve refuses a MoE checkpoint with a capacity factor in one line" {
    [ -x "$MC_SERVE" ] || skip "mc-serve is not built"
    "$MC_TRAIN" "@$D/llama.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        "${moe[@]}" --moe-expert-capacity-factor 1.5 --save cap >/dev/null 2>&1
    run --separate-stderr "$MC_SERVE" cap --port 0 < <(:)
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | wc -l)" = 1 ]
    [[ "$stderr" == *"a mixture of experts with capacity factor 1.5 cannot be served: the tokens it drops depend on the other requests in the batch"* ]]
}

# --- mc-reshard ---------------------------------------------------------

@test "mc-reshard: fp32 exact, bf16 and int8 within their margins; the expert tensors keep their [E x rows, cols] layout" {
    require_python_module h5py
    ev=(--quiet --threads 1 --ctx-size 64 --text-file "$D/text.txt")
    "$MC_EVAL" "$G" "${ev[@]}" > ref.json
    "$MC_RESHARD" "$G" --dtype fp32 -o f32 >/dev/null
    "$MC_RESHARD" "$G" --dtype bf16 -o b16 >/dev/null
    "$MC_RESHARD" "$G" --quantize int8 -o q8 >/dev/null
    ref=$(json ref.json 'repr(d["perplexity"]["nll"])')
    # measured: bf16 3.9e-5, int8 1.4e-4 relative (2.3e-5 when int8 ran
    # with fp32 activations; mc_k_linear_q8a8_fwd also rounds each
    # activation to half a code of its 32-block's largest, 1/254). Each
    # weight moves by at most 2^-9 of itself (bf16) or half a code, 1/254
    # of its row's largest (int8); over sums of 32-96 products of either
    # sign the NLL moves far less; 3e-4 leaves room for the AVX2 and
    # AVX-512 paths' bf16 rounding (int8 gives the same bits on every
    # path), and a lost or swapped expert choice would show
    for q in f32:0 b16:3e-4 q8:3e-4; do
        "$MC_EVAL" "${q%%:*}" "${ev[@]}" > ${q%%:*}.json
        got=$(json ${q%%:*}.json 'repr(d["perplexity"]["nll"])')
        echo "# ${q%%:*}: NLL $got vs fp32 $ref (margin ${q#*:} relative)" >&3
        close "$got" "$ref" "${q#*:}"
    done
    [ "$(json q8.json 'd["weights"]')" = int8 ]
    "$MC_PYTHON" - "$G"/iter_*/model.h5 q8/iter_*/model.h5 b16/iter_*/model.h5 <<'EOF'
import sys, h5py
a, q, b = (h5py.File(p, "r") for p in sys.argv[1:4])
L = "model/decoder.layers.1.mlp."
for f in (q, b):
    for n in ("experts.experts.linear_fc1.weight", "experts.experts.linear_fc2.weight",
              "router.weight", "shared_experts.linear_fc1.weight"):
        assert f[L + n].shape == a[L + n].shape, (n, f[L + n].shape, a[L + n].shape)
assert a[L + "experts.experts.linear_fc1.weight"].shape == (4 * 2 * 48, 32)
assert a[L + "experts.experts.linear_fc2.weight"].shape == (4 * 32, 48)
dt = lambda f, n: f[L + n].attrs.get("dtype", f[L + n].dtype.name)
d = {n: str(dt(q, n)) for n in ("experts.experts.linear_fc1.weight", "experts.experts.linear_fc2.weight",
                                 "shared_experts.linear_fc1.weight", "router.weight")}
print("# int8 checkpoint dtypes:", d)
assert d["router.weight"] in ("float32", "b'float32'"), d
assert all(v in ("int8", "b'int8'") for k, v in d.items() if k != "router.weight"), d
EOF
}

@test "mc-reshard: pre-split for TP=2 and PP=2; TP=2 evaluates the TP=2 shards to one process's value" {
    require_python_module json
    require_python_module h5py
    ev=(--quiet --threads 1 --ctx-size 64 --text-file "$D/text.txt")
    "$MC_EVAL" "$G" "${ev[@]}" > ref.json
    "$MC_RESHARD" "$G" --target-tensor-parallel-size 2 -o tp2 >/dev/null
    "$MC_RESHARD" "$G" --target-pipeline-parallel-size 2 -o pp2 >/dev/null
    # back to one file from the shards: every tensor of the original
    "$MC_RESHARD" pp2 -o back >/dev/null
    "$MC_EVAL" back "${ev[@]}" > back.json
    [ "$(json back.json 'd["perplexity"]["nll"]')" = "$(json ref.json 'd["perplexity"]["nll"]')" ]
    # the shards themselves, read whole by one process
    "$MC_EVAL" pp2 "${ev[@]}" > pp2.json
    [ "$(json pp2.json 'd["perplexity"]["nll"]')" = "$(json ref.json 'd["perplexity"]["nll"]')" ]
    "$MC_PYTHON" - tp2/iter_*/mp_rank_01_000.h5 <<'EOF'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
L = "model/decoder.layers.0."
assert f[L + "mlp.experts.experts.linear_fc1.weight"].shape == (4 * 2 * 48, 32)
assert f[L + "mlp.router.weight"].shape == (4, 32)
assert f[L + "self_attention.linear_qkv.weight"].shape[0] < 2 * 32  # the dense part is split
EOF
    mpi_setup
    mpi_exec 120 2 "$MC_EVAL" --tensor-model-parallel-size 2 tp2 "${ev[@]}" > tp2.json
    got=$(json tp2.json 'repr(d["perplexity"]["nll"])')
    ref=$(json ref.json 'repr(d["perplexity"]["nll"])')
    echo "# TP=2 shards: NLL $got, one process $ref" >&3
    close "$got" "$ref" 1e-6
}
