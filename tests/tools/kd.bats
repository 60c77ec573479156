#!/usr/bin/env bats
# kd.bats - knowledge distillation (issue 15): mc-train --kd-teacher against
# PyTorch (tests/golden/torch_kd.py: 20 fp32 iterations of tiny-llama
# distilled from a 3-layer, 96-wide Llama teacher that mc trained on
# tests/data/train/docs.txt; lm loss, kd loss, grad norm and final weights
# through check_train_golden.py), the same run under TP=2 with sequence
# parallelism (the teacher saved at TP=1) equal to one process, the issue's
# distillation check on the demo corpus (a 4-layer student distilled from an
# 8-layer teacher beats the same student on labels alone), and bad usage.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
GOLDEN="$top_srcdir/tests/data/kd/golden_kd_llama_fp32.json"
CHECK="$top_srcdir/tests/golden/check_train_golden.py"

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# The dataset of docs.txt (train_golden.bats's), once per file.
dataset() {
    local p="$BATS_FILE_TMPDIR/docs"
    if [ ! -f "${p}_text_document.idx" ]; then
        "$MC_PREPROCESS" --input "$top_srcdir/tests/data/train/docs.txt" --input-format text \
            --lines --tokenizer-type NullTokenizer --vocab-size 300 --output-prefix "$p" \
            --quiet >/dev/null
    fi
    echo "${p}_text_document"
}

# golden_args KEY: the golden's argument list KEY, one per line, the
# teacher's placeholder replaced by the golden teacher's directory.
golden_args() {
    "$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))[sys.argv[2]]))' \
        "$GOLDEN" "$1" | sed "s|^TEACHER\$|$BATS_FILE_TMPDIR/teacher|"
}

# The golden's teacher, trained by mc once per file (deterministic).
teacher() {
    local data
    data=$(dataset)
    if [ ! -f "$BATS_FILE_TMPDIR/teacher/latest_checkpointed_iteration.txt" ]; then
        local -a targs
        mapfile -t targs < <(golden_args teacher_train_args)
        "$MC_TRAIN" "${targs[@]}" --threads 1 --data-path "$data" \
            --save "$BATS_FILE_TMPDIR/teacher" >/dev/null 2>&1
    fi
    echo "$BATS_FILE_TMPDIR/teacher"
}

# kd_losses FILE: the "kd loss" values of a --log-json file, one per line.
kd_losses() {
    grep -o '"kd loss": [^,}]*' "$1" | sed 's/.*: //'
}

@test "mc-train --kd-teacher: 20 fp32 iterations equal PyTorch's distillation (lm loss 1e-6, kd loss 1e-5, grad norm, weights)" {
    require_python_module h5py
    local data t
    data=$(dataset)
    t=$(teacher)
    # the teacher mc trained is the golden's (its weights' checksums)
    run "$MC_PYTHON" - "$GOLDEN" "$t"/iter_0000060/model.h5 <<'EOF2'
import json, sys, h5py, numpy as np
want = json.load(open(sys.argv[1]))["teacher"]
with h5py.File(sys.argv[2], "r") as f:
    got = {k: float((np.array(v, dtype=np.float64) ** 2).sum()) for k, v in f["model"].items()}
assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
worst = max(abs(got[k] - want[k]["sumsq"]) / want[k]["sumsq"] for k in got)
print(f"# teacher: {len(got)} tensors, largest relative sum-of-squares error {worst:.3g}")
sys.exit(worst > 2e-6)
EOF2
    echo "$output"
    assert_success
    local -a args
    mapfile -t args < <(golden_args mc_train_args)
    [ "${#args[@]}" -gt 20 ]
    run -0 --separate-stderr "$MC_TRAIN" "${args[@]}" --threads 1 --data-path "$data" \
        --log-json log.jsonl --save ck
    [[ "$stderr" == *"distillation from $t: 3 layers, hidden 96"*"temperature 2, alpha 0.5"* ]]
    [[ "$stderr" == *"iteration       20/      20"*"| lm loss: "*"| kd loss: "* ]]
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --train-iters 0 --mock-data --save init
    run "$MC_PYTHON" "$CHECK" "$GOLDEN" log.jsonl ck/iter_0000020/model.h5 init/iter_0000000/model.h5
    echo "$output"
    assert_success
    assert_output --partial "largest kd_loss error"
    refute_output --partial FAIL
    # the teacher is not saved with the student
    run "$MC_PYTHON" -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r"); print(f["model/decoder.final_layernorm.weight"].shape, "decoder.layers.2.mlp.linear_fc1.weight" in f["model"])' ck/iter_0000020/model.h5
    assert_output "(64,) False"
    # another temperature is another KL on the same first batch and weights
    run -0 "$MC_TRAIN" "${args[@]}" --kd-temperature 1 --threads 1 --data-path "$data" \
        --log-json t1.jsonl
    [ "$(losses t1.jsonl | head -1)" = "$(losses log.jsonl | head -1)" ]
    [ "$(kd_losses t1.jsonl | head -1)" != "$(kd_losses log.jsonl | head -1)" ]
}

@test "mc-train --kd-teacher under TP=2 with sequence parallelism (teacher saved at TP=1): the single process's lm losses (1e-6) and kd losses (2e-7 absolute)" {
    mpi_setup
    local data t
    data=$(dataset)
    t=$(teacher)
    local -a args
    mapfile -t args < <(golden_args mc_train_args)
    run -0 "$MC_TRAIN" "${args[@]}" --threads 1 --data-path "$data" --log-json one.jsonl
    run mpi 2 "${args[@]}" --threads 1 --data-path "$data" --tensor-model-parallel-size 2 \
        --sequence-parallel --log-json tp.jsonl
    echo "$output" | grep -v "^ \[" | tail -5
    assert_success
    3>&1 same_losses tp.jsonl one.jsonl
    # The KL is a difference of terms near log V, 100 times its size, whose
    # float sums the TP split adds in another order: held to 2e-7 absolute
    # (observed 5e-8), which is 1e-6 of those terms' scale.
    paste <(kd_losses tp.jsonl) <(kd_losses one.jsonl) | awk '
        { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; if (d > 2e-7) bad = 1; n++ }
        END { printf "# kd losses: %d, max absolute difference %.3g\n", n, m > "/dev/fd/3";
              exit (bad || n != 20) }'
}

@test "distillation check: a 4-layer student distilled from an 8-layer teacher beats labels alone after 200 iterations (demo corpus)" {
    local tok
    tok=$(small_tokenizer)
    "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" --append-eod \
        --input-format text --output-prefix tut --quiet "$DOCS"/tutorial/*.txt >/dev/null
    local -a common=(--model tiny-gpt --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok"
                     --data-path tut_text_document --split 95,5,0 --seq-length 64
                     --micro-batch-size 8 --global-batch-size 8 --seed 1234 --lr 3e-3 --min-lr 3e-4
                     --lr-decay-style cosine --lr-warmup-iters 10 --eval-iters 8
                     --eval-interval 100000 --log-interval 100 --threads 1)
    run -0 "$MC_TRAIN" "${common[@]}" --num-layers 8 --train-iters 300 --save t8 --no-save-optim
    local teacher student distilled
    teacher=$(valid_loss "$output")
    run -0 "$MC_TRAIN" "${common[@]}" --num-layers 4 --train-iters 200
    student=$(valid_loss "$output")
    run -0 "$MC_TRAIN" "${common[@]}" --num-layers 4 --train-iters 200 --kd-teacher t8
    distilled=$(valid_loss "$output")
    echo "# validation loss: teacher (8 layers, 300 iterations) $teacher; student (4 layers, 200 iterations) on labels alone $student, distilled $distilled" >&3
    awk -v d="$distilled" -v s="$student" 'BEGIN { exit !(d + 0 < s + 0) }'
}

# valid_loss OUTPUT: the validation lm loss of the run's end.
valid_loss() {
    grep -E "validation loss at iteration [0-9]+ on validation set" <<<"$1" |
        grep -oE "lm loss value: [0-9.E+-]+" | sed 's/.*: //'
}

@test "mc-train --kd-teacher: bad usage exits 2, a missing teacher or one of another vocabulary 1" {
    local data t
    data=$(dataset)
    t=$(teacher)
    local -a args
    mapfile -t args < <(golden_args mc_train_args)
    local -a base=("${args[@]}" --threads 1 --data-path "$data" --train-iters 2 --lr-warmup-iters 1)
    run -2 "$MC_TRAIN" "${base[@]}" --kd-alpha 1.5
    assert_output --regexp "^mc-train: error: --kd-alpha"
    run -2 "$MC_TRAIN" "${base[@]}" --kd-alpha -0.1
    assert_output --regexp "^mc-train: error: --kd-alpha"
    run -2 "$MC_TRAIN" "${base[@]}" --kd-alpha half
    assert_output --regexp "^mc-train: error: --kd-alpha"
    run -2 "$MC_TRAIN" "${base[@]}" --kd-temperature 0
    assert_output --regexp "^mc-train: error: --kd-temperature"
    run -2 "$MC_TRAIN" "${base[@]}" --kd-temperature -2
    assert_output --regexp "^mc-train: error: --kd-temperature"
    local -a plain=(--model tiny-llama --mock-data --vocab-size 300 --seq-length 32 --lr 1e-3
                    --train-iters 2 --eval-iters 0 --threads 1)
    run -2 "$MC_TRAIN" "${plain[@]}" --kd-alpha 0.3
    assert_output --partial "--kd-temperature and --kd-alpha need --kd-teacher"
    run -2 "$MC_TRAIN" "${plain[@]}" --kd-teacher "$t" --pipeline-model-parallel-size 2
    assert_output --partial "--kd-teacher: distillation under pipeline parallelism is not implemented"
    run -1 "$MC_TRAIN" "${plain[@]}" --kd-teacher nowhere
    assert_output --regexp "^mc-train: error: --kd-teacher nowhere: .*nowhere"
    [ "${#lines[@]}" -eq 1 ]
    # a teacher of another vocabulary: 500 ids pad to 512, the student's 300 to 384
    run -0 "$MC_TRAIN" --model tiny-llama --mock-data --vocab-size 500 --seq-length 32 --lr 1e-3 \
        --train-iters 0 --threads 1 --save other
    run -1 "$MC_TRAIN" "${plain[@]}" --kd-teacher other
    assert_output "mc-train: error: --kd-teacher other: the teacher's padded vocabulary of 512 differs from the student's 384"
}
