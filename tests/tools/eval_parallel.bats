#!/usr/bin/env bats
# mc-eval under mpirun with tensor parallelism (2 ranks): the checkpoints
# of eval_golden.bats split over two ranks give torch's golden values with
# the tolerances of one process (vocab-parallel log-softmax, heads and MLP
# split, logits gathered for generation), sampled text equals one
# process's, and a world that is not one tensor-parallel group is refused.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
D="$top_srcdir/tests/data/eval"
GOLDEN="$D/golden.json"

setup_file() {
    local tok="$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"
    for m in gpt llama; do
        "$MC_TRAIN" "@$D/$m.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
            --save "$BATS_FILE_TMPDIR/$m" >/dev/null 2>&1
    done
}

setup() {
    mpi_setup
    require_python_module json
    cd "$BATS_TEST_TMPDIR"
}

mpi() {
    local n=$1
    shift
    mpi_exec 120 "$n" "$MC_EVAL" "$@"
}

@test "TP=2: task log-likelihoods, perplexity (llama windows) and greedy generation equal torch's golden values" {
    mpi 2 --tensor-model-parallel-size 2 "$BATS_FILE_TMPDIR/gpt" --threads 1 --quiet --ctx-size 64 \
        --log-samples --task "hellaswag=$D/hellaswag.jsonl" --task "lambada_openai=$D/lambada.jsonl" \
        --prompt-file "$D/prompts.txt" --max-new-tokens 24 > gpt.json
    mpi 2 --tensor-model-parallel-size 2 "$BATS_FILE_TMPDIR/llama" --threads 1 --quiet --ctx-size 32 \
        --text-file "$D/text.txt" --ppl-mode llama > llama-ppl.json
    mpi 2 --tensor-model-parallel-size 2 "$BATS_FILE_TMPDIR/llama" --threads 1 --quiet \
        --prompt-file "$D/prompts.txt" --max-new-tokens 24 > llama-gen.json
    "$MC_PYTHON" - "$GOLDEN" gpt.json llama-ppl.json llama-gen.json <<'EOF' >&3
import json, sys
G = json.load(open(sys.argv[1]))
gpt, lp, lg = (json.load(open(p)) for p in sys.argv[2:5])
bad, worst = [], 0.0
for task in ("hellaswag", "lambada_openai"):
    for a, b in zip(gpt["tasks"][task]["samples"], G["gpt"]["tasks"][task]["samples"]):
        bad += [] if a["greedy"] == b["greedy"] else [task + " greedy"]
        worst = max([worst] + [abs(x - y) / max(1, abs(y)) for x, y in zip(a["loglikelihoods"], b["loglikelihoods"])])
    for k in ("acc", "acc_norm"):
        if k in G["gpt"]["tasks"][task] and gpt["tasks"][task][k] != G["gpt"]["tasks"][task][k]:
            bad.append(task + " " + k)
d = abs(lp["perplexity"]["nll"] - G["llama"]["ppl"]["llama"]["nll"]) / G["llama"]["ppl"]["llama"]["nll"]
for name, doc in (("gpt", gpt), ("llama", lg)):
    if [g["tokens"] for g in doc["generations"]] != [g["tokens"] for g in G[name]["generate"]]:
        bad.append(name + " generation")
print("# TP=2: request log-likelihoods within %.2e, llama NLL within %.2e, %s" % (worst, d, bad or "tokens identical"))
sys.exit(1 if bad or worst > 1e-5 or d > 1e-6 or gpt["tensor_model_parallel_size"] != 2 else 0)
EOF
}

@test "TP=2 samples the same text as one process" {
    args=(--threads 1 --quiet --prompt "The river" --prompt "" --max-new-tokens 20 --temperature 1.1
          --top-k 50 --top-p 0.95 --seed 3)
    "$MC_EVAL" "$BATS_FILE_TMPDIR/llama" "${args[@]}" > one.json
    mpi 2 --tensor-model-parallel-size 2 "$BATS_FILE_TMPDIR/llama" "${args[@]}" > two.json
    run "$MC_PYTHON" -c 'import json, sys; a, b = (json.load(open(p))["generations"] for p in sys.argv[1:]); print([x["tokens"] for x in a] == [x["tokens"] for x in b])' one.json two.json
    assert_output True
}

@test "a world that is not one tensor-parallel group, and pipeline parallelism, are refused on rank 0 with one line" {
    run --separate-stderr mpi 2 "$BATS_FILE_TMPDIR/gpt" --quiet --prompt x
    assert_failure 2
    [ "$(echo "$stderr" | grep -c 'mc-eval: error:')" = 1 ]
    [[ "$stderr" == *"2 ranks for --tensor-model-parallel-size 1: evaluation runs one tensor-parallel group, start 1 ranks"* ]]
    run --separate-stderr mpi 2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        "$BATS_FILE_TMPDIR/gpt" --quiet --prompt x
    assert_failure 2
    [ "$(echo "$stderr" | grep -c 'mc-eval: error:')" = 1 ]
    [[ "$stderr" == *"evaluation does not run a pipeline"* ]]
}
