#!/usr/bin/env bats
# mc-eval against values computed independently in float64 by PyTorch
# (tests/golden/eval_golden.py, committed in tests/data/eval/golden.json):
# the lm-evaluation-harness tasks request by request, the three perplexity
# rules, and greedy generation through the key/value cache against greedy
# decoding by full recomputation, on a tiny GPT (learned positions) and a
# tiny Llama (RoPE, GQA, SwiGLU). The models are mc-train's initial weights
# (bit-exact functions of the seed), so the golden values hold on any
# machine; mc computes in fp32, hence the tolerances below.

bats_require_minimum_version 1.5.0
load common

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
    require_python_module json
    cd "$BATS_TEST_TMPDIR"
}

@test "tasks: every request's log-likelihood within 1e-5 of torch's, greedy flags, acc, acc_norm and lambada perplexity as the harness computes them" {
    run --separate-stderr "$MC_EVAL" "$BATS_FILE_TMPDIR/gpt" --ctx-size 64 --threads 1 --quiet \
        --log-samples --task "lambada_openai=$D/lambada.jsonl" --task "hellaswag=$D/hellaswag.jsonl" \
        --task "arc_easy=$D/arc.jsonl" --task "piqa=$D/piqa.jsonl" \
        --task "multiple_choice=$D/mc.jsonl"
    assert_success
    echo "$output" > out.json
    "$MC_PYTHON" - "$GOLDEN" out.json <<'EOF' >&3
import json, sys
g = json.load(open(sys.argv[1]))["gpt"]["tasks"]
m = json.load(open(sys.argv[2]))["tasks"]
worst, n, bad = 0.0, 0, []
for task, ref in g.items():
    got = m[task]
    if len(got["samples"]) != len(ref["samples"]):
        bad.append(task + " documents")
    for a, b in zip(got["samples"], ref["samples"]):
        if a["greedy"] != b["greedy"] or a["gold"] != b["gold"]:
            bad.append("%s doc %d greedy/gold" % (task, a["doc"]))
        for x, y in zip(a["loglikelihoods"], b["loglikelihoods"]):
            worst = max(worst, abs(x - y) / max(1.0, abs(y)))
            n += 1
    for k in ("acc", "acc_norm"):
        if k in ref and got[k] != ref[k]:
            bad.append("%s %s %r != %r" % (task, k, got[k], ref[k]))
    for k in ("perplexity", "mean_loglikelihood"):
        if k in ref and abs(got[k] - ref[k]) > 1e-5 * abs(ref[k]):
            bad.append("%s %s %r != %r" % (task, k, got[k], ref[k]))
print("# %d requests, largest difference %.2e of max(1, |ll|); %s" % (n, worst, bad or "all metrics equal"))
sys.exit(1 if bad or worst > 1e-5 or n != 41 else 0)
EOF
}

# compare_ppl MODEL KEY FILE: nll within 1e-6 relative, the same count, stderr 1e-5
compare_ppl() {
    "$MC_PYTHON" - "$GOLDEN" "$1" "$2" "$3" <<'EOF' >&3
import json, sys
ref = json.load(open(sys.argv[1]))[sys.argv[2]]["ppl"][sys.argv[3]]
got = json.load(open(sys.argv[4]))["perplexity"]
d = abs(got["nll"] - ref["nll"]) / ref["nll"]
e = abs(got["ppl_stderr"] - ref["ppl_stderr"]) / ref["ppl_stderr"]
print("# %s %s: %d tokens, NLL %.9f vs torch %.9f (%.1e), stderr %.1e" %
      (sys.argv[2], sys.argv[3], got["scored_tokens"], got["nll"], ref["nll"], d, e))
sys.exit(0 if got["scored_tokens"] == ref["count"] and d < 1e-6 and e < 1e-5 else 1)
EOF
}

@test "perplexity: plain, llama (with and without BOS) and sliding windows give torch's NLL within 1e-6, for GPT and Llama" {
    for m in gpt llama; do
        for mode in plain llama sliding; do
            extra=()
            [ $mode = sliding ] && extra=(--stride 12)
            "$MC_EVAL" "$BATS_FILE_TMPDIR/$m" --ctx-size 32 --threads 1 --quiet --text-file "$D/text.txt" \
                --ppl-mode $mode "${extra[@]}" > $m-$mode.json
            compare_ppl $m $mode $m-$mode.json
        done
        "$MC_EVAL" "$BATS_FILE_TMPDIR/$m" --ctx-size 32 --threads 1 --quiet --text-file "$D/text.txt" \
            --ppl-mode llama --add-bos > $m-bos.json
        compare_ppl $m llama_bos $m-bos.json
    done
}

# same_tokens MODEL FILE: every generation's tokens equal torch's greedy ones
same_tokens() {
    "$MC_PYTHON" - "$GOLDEN" "$1" "$2" <<'EOF' >&3
import json, sys
ref = json.load(open(sys.argv[1]))[sys.argv[2]]["generate"]
got = json.load(open(sys.argv[3]))["generations"]
ok = len(ref) == len(got) and all(a["tokens"] == b["tokens"] for a, b in zip(got, ref))
print("# %s: %d prompts, %d tokens, %s (smallest top-2 logit gap in torch %.4f)" %
      (sys.argv[2], len(got), sum(len(a["tokens"]) for a in got), "identical" if ok else "DIFFERENT",
       min(b["min_gap"] for b in ref)))
sys.exit(0 if ok else 1)
EOF
}

@test "greedy generation through the key/value cache gives exactly the tokens of torch's greedy decoding by full recomputation, and so does --no-kv-cache" {
    for m in gpt llama; do
        "$MC_EVAL" "$BATS_FILE_TMPDIR/$m" --threads 1 --quiet --prompt-file "$D/prompts.txt" \
            --max-new-tokens 24 > $m-cache.json
        same_tokens $m $m-cache.json
        "$MC_EVAL" "$BATS_FILE_TMPDIR/$m" --threads 1 --quiet --prompt-file "$D/prompts.txt" \
            --max-new-tokens 24 --no-kv-cache > $m-nocache.json
        same_tokens $m $m-nocache.json
    done
    # the GPT stops at <|endoftext|> on the second prompt
    run grep -c '"stop": "eod"' gpt-cache.json
    assert_output 1
}
