#!/usr/bin/env bats
# dpo.bats - preference optimization (issue 15): mc-preprocess
# --dataset-type preference (the two datasets, their bad records) and
# mc-train --dpo against TRL's loss (tests/golden/torch_dpo.py, committed as
# tests/data/dpo/golden_dpo.json, compared by check_dpo_golden.py), under
# TP=2 and DP=2, --ref-load, and the bad inputs and usage. The data
# (tests/data/dpo) comes from tests/golden/make_dpo_data.py; the tokenizer
# and chat template are tests/data/sft's.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
SFT="$top_srcdir/tests/data/sft"
DPO="$top_srcdir/tests/data/dpo"
GOLDEN="$DPO/golden_dpo.json"
tok=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$SFT/tokenizer.json")

setup() {
    cd "$BATS_TEST_TMPDIR"
}

pref() {
    "$MC_PREPROCESS" --dataset-type preference "${tok[@]}" --quiet "$@"
}

# The dataset of prefs.jsonl, once per file; prints what mc-preprocess printed.
dataset() {
    local p="$BATS_FILE_TMPDIR/prefs"
    [ -f "${p}_rejected_document_loss_mask.idx" ] ||
        pref --input "$DPO/prefs.jsonl" --output-prefix "$p" >/dev/null
    echo "${p}_chosen_document"
}

# The mc-train arguments of the golden runs, and of run $1.
golden_args() {
    "$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["mc_train_args"]))' \
        "$GOLDEN" | sed "s|^TOKENIZER\$|$SFT/tokenizer.json|"
}
run_args() {
    "$MC_PYTHON" -c 'import json, sys
print("\n".join(next(r for r in json.load(open(sys.argv[1]))["runs"] if r["name"] == sys.argv[2])["args"]))' \
        "$GOLDEN" "$1"
}

# same_dpo A B: the loss and TRL's metrics of two --log-json files, every
# iteration within 1e-6 (absolute, or relative above 1), the rewards within
# 5e-6: a reward is beta (0.1) times the difference of two sums of fp32
# log-probabilities of magnitude ~300, which another grid's summation order
# moves by ~1e-6 (1.12e-6 measured under TP=2 with OpenBLAS's Haswell
# kernels); prints the largest difference against its tolerance.
same_dpo() {
    "$MC_PYTHON" - "$1" "$2" <<'PY' >&3
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
keys = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"]
tol = {k: 5e-6 if k in ("rewards/chosen", "rewards/rejected", "rewards/margins") else 1e-6
       for k in keys}
worst, d, where = max((abs(x[k] - y[k]) / max(1.0, abs(y[k])) / tol[k],
                       abs(x[k] - y[k]) / max(1.0, abs(y[k])), f"{k} at iteration {i + 1}")
                      for i, (x, y) in enumerate(zip(a, b)) for k in keys)
print(f"# {sys.argv[1]} vs {sys.argv[2]}: {len(a)} iterations, largest difference {d:.3g}"
      f" ({where}), {worst:.2f} of its tolerance")
sys.exit(0 if len(a) == len(b) == 6 and worst <= 1 else 1)
PY
}

@test "preference: two SFT-style datasets of as many sequences, the answer's tokens in the mask, the prompt's not" {
    local data
    data=$(dataset)
    [[ "$data" == "$BATS_FILE_TMPDIR/prefs_chosen_document" ]]
    local side
    for side in chosen rejected; do
        for f in "" _loss_mask; do
            [ -f "$BATS_FILE_TMPDIR/prefs_${side}_document$f.idx" ]
        done
    done
    # both sides: 48 pairs, the prompt (and its earlier exchange) at mask 0,
    # the answer at 1, the EOD at 0; chosen and rejected share their prompt
    run "$MC_PYTHON" - "$BATS_FILE_TMPDIR/prefs" "$DPO/golden_dpo.json" <<'PY'
import json, sys, numpy as np
def read(prefix):
    idx = open(prefix + ".idx", "rb").read()
    n = int(np.frombuffer(idx[18:26], np.int64)[0])
    dt = {1: np.uint8, 8: np.uint16}[idx[17]] if idx[17] in (1, 8) else np.int32
    lens = np.frombuffer(idx[34:34 + 4 * n], np.int32)
    data = np.fromfile(prefix + ".bin", dt)
    off = np.concatenate([[0], np.cumsum(lens)])
    return [data[off[i]:off[i + 1]] for i in range(n)]
p = sys.argv[1]
c, cm, r, rm = (read(f"{p}_{s}_document{m}") for s in ("chosen", "rejected") for m in ("", "_loss_mask"))
assert len(c) == len(r) == len(cm) == len(rm) == 48, (len(c), len(r))
for i in range(48):
    first = int(np.argmax(cm[i]))
    assert first > 0 and cm[i][-1] == 0 and rm[i][-1] == 0
    assert (c[i][:first] == r[i][:first]).all(), i          # the same prompt
    assert int(np.argmax(rm[i])) == first, i                 # the answers start together
    assert cm[i][first:-1].all() or i % 4 == 1, i            # one answer stretch (+ its end marker)
print("ok")
PY
    echo "$output"
    assert_success
}

@test "preference: a record missing rejected, chosen or the prompt fails with its file and line, exit 1, no dataset left; --skip-invalid counts them" {
    run -1 pref --input "$DPO/bad.jsonl" --output-prefix b
    assert_output "mc-preprocess: error: $DPO/bad.jsonl:2: no \"rejected\""
    assert_no_dataset b
    local n line
    for n in 3 4 5 6; do
        sed -n "${n}p" "$DPO/bad.jsonl" >one.jsonl
        run -1 pref --input one.jsonl --output-prefix b
        line=$output
        assert_no_dataset b
        case $n in
        3) [[ "$line" == *'one.jsonl:1: no "chosen"'* ]] ;;
        4) [[ "$line" == *'one.jsonl:1: no "prompt" or "messages"'* ]] ;;
        5) [[ "$line" == *'one.jsonl:1: "chosen" has no assistant message'* ]] ;;
        6) [[ "$line" == *'one.jsonl:1: "chosen" must be a string or a list of messages'* ]] ;;
        esac
    done
    run -0 --separate-stderr "$MC_PREPROCESS" --dataset-type preference "${tok[@]}" \
        --input "$DPO/bad.jsonl" --output-prefix b --skip-invalid
    assert_output "b_chosen_document"
    [[ "$stderr" == *"1 documents"*"skipped 5 invalid records"* ]]
    run -2 pref --input "$DPO/prefs.jsonl" --output-prefix b --train-on-prompt
    assert_output --partial "--train-on-prompt applies to --dataset-type sft only"
}

golden_run() {
    require_python_module h5py
    local name=$1 data
    data=$(dataset)
    local -a args extra
    mapfile -t args < <(golden_args)
    mapfile -t extra < <(run_args "$name")
    [ "${#args[@]}" -gt 20 ]
    run -0 --separate-stderr "$MC_TRAIN" "${args[@]}" "${extra[@]}" --threads 1 --dpo \
        --data-path "$data" --log-json log.jsonl
    [[ "$stderr" == *"dpo: reference log-probabilities of 48 pairs from the initial weights"* ]]
    [[ "$stderr" == *"iteration        6/       6"*"rewards/margins: "* ]]
    run "$MC_PYTHON" "$top_srcdir/tests/golden/check_dpo_golden.py" "$GOLDEN" "$name" log.jsonl
    echo "$output"
    assert_success
    refute_output --partial FAIL
    # the first iteration's policy is the reference: z = 0 exactly
    run "$MC_PYTHON" -c 'import json, sys; s = json.loads(open(sys.argv[1]).readline())
assert s["rewards/margins"] == 0 and s["rewards/chosen"] == 0, s' log.jsonl
    assert_success
}

@test "mc-train --dpo sigmoid: 6 fp32 iterations equal TRL's DPO loss and rewards metrics (1e-5)" {
    golden_run sigmoid
}

@test "mc-train --dpo sigmoid with --dpo-label-smoothing (conservative DPO): the formula (1e-5)" {
    golden_run sigmoid-ls
}

@test "mc-train --dpo ipo: TRL's length-normalized IPO loss (1e-5)" {
    golden_run ipo
}

@test "mc-train --dpo hinge: TRL's hinge loss (1e-5)" {
    golden_run hinge
}

@test "mc-train --dpo under TP=2 with SP and under DP=2 with the distributed optimizer: the single process's loss and metrics (1e-6, rewards 5e-6); --ref-load of the initial weights is the default" {
    mpi_setup
    local data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args)
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --dpo --data-path "$data" --log-json one.jsonl
    run -0 mpi 2 "${args[@]}" --threads 1 --dpo --data-path "$data" --tensor-model-parallel-size 2 \
        --sequence-parallel --log-json tp.jsonl
    3>&1 same_dpo tp.jsonl one.jsonl
    run -0 mpi 2 "${args[@]}" --threads 1 --dpo --data-path "$data" \
        --use-distributed-optimizer --log-json dp.jsonl
    3>&1 same_dpo dp.jsonl one.jsonl
    # the reference from a checkpoint of the same weights: the same run
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --train-iters 0 --mock-data --save init
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --dpo --data-path "$data" --ref-load init \
        --log-json ref.jsonl
    3>&1 same_dpo ref.jsonl one.jsonl
}

@test "mc-train --dpo: a --ref-load of another architecture names the file, exit 1; bad usage exits 2" {
    local data
    data=$(dataset)
    local -a args
    mapfile -t args < <(golden_args)
    run -0 "$MC_TRAIN" --model tiny-gpt "${tok[@]}" --lr 1e-3 --train-iters 0 --mock-data \
        --seq-length 128 --save other
    run -1 "$MC_TRAIN" "${args[@]}" --threads 1 --dpo --data-path "$data" --ref-load other
    [ "${#lines[@]}" -eq 1 ]
    assert_output --regexp "^mc-train: error: --ref-load: other/iter_0000000/model.h5: tensor .* has shape"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo-beta 0.2 --data-path "$data"
    assert_output --partial "need --dpo"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo --dpo-loss-type kto --data-path "$data"
    assert_output --partial "--dpo-loss-type"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo --dpo-loss-type ipo --dpo-label-smoothing 0.1 \
        --data-path "$data"
    assert_output --partial "--dpo-label-smoothing applies to --dpo-loss-type sigmoid only"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo --dpo-label-smoothing 0.5 --data-path "$data"
    assert_output --partial "--dpo-label-smoothing"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo --mock-data
    assert_output --partial "--dpo reads a preference dataset, not --mock-data"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo --sft --data-path "$data"
    assert_output --partial "--dpo reads a preference dataset"
    run -2 "$MC_TRAIN" "${args[@]}" --dpo --pipeline-model-parallel-size 2 --data-path "$data"
    assert_output --partial "--dpo does not run under pipeline parallelism"
    # an SFT dataset is not a preference dataset
    "$MC_PREPROCESS" --dataset-type sft "${tok[@]}" --quiet --input "$SFT/chat.jsonl" \
        --output-prefix chat >/dev/null
    run -1 "$MC_TRAIN" "${args[@]}" --dpo --data-path chat_messages_document
    assert_output --regexp "^mc-train: error: --dpo reads the chosen answers: .*chat_messages_document_chosen_document.idx: cannot open"
}
