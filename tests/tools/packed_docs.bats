#!/usr/bin/env bats
# packed_docs.bats - packed documents (issue 14): --reset-position-ids,
# --reset-attention-mask and --eod-mask-loss in mc-train and mc-eval.
#
# The dataset repeats one unit of 24 ids that holds documents of 4, 1, 10
# and 4 ids (each ended by the end-of-document id 255, NullTokenizer's with
# 255 ids: 256 in all, which pads to the same vocabulary at TP 1 and 2) and
# a last one of 5 that runs on into the next unit's first. With T = 96 every
# sample is the same four units plus one id, whatever the shuffling, so the
# documents of a batch are known: a document crosses the attention's key
# block of 64. With the three options the lm loss of mc-train's first
# iteration (learning rate 0, fp32) must equal, within 1e-6 relative, the
# mean over the documents' targets with each document run alone as its own
# sequence (tests/unit/ckpt_loss: no option, plain causal attention from
# position 0): GPT (learned positions) and Llama (RoPE, grouped queries);
# mc-eval's perplexity over the same samples gives the same mean; without
# the options the loss differs. Under mpirun, pipeline parallelism (1F1B and
# interleaved) and tensor parallelism with sequence parallelism give the
# single process's losses for three training iterations within 1e-6. The
# PyTorch golden (tests/golden/torch_packed.py: Megatron's own
# _get_ltor_masks_and_position_ids, a [T, T] mask) gives the first
# iteration's loss and gradient norm, committed in
# tests/data/train/golden_packed_{gpt,llama}.json.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
CKPT_LOSS="$top_builddir/tests/unit/ckpt_loss"
MKIDX="$top_builddir/tests/unit/mkidx"
GOLDEN="$top_srcdir/tests/data/train"

EOD=255
UNIT="5 17 42 255 255 8 99 23 61 4 77 13 250 41 255 66 12 9 255 7 3 88 150 21"
T=96

packed=(--reset-position-ids --reset-attention-mask --eod-mask-loss)
common=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length $T
        --tokenizer-type NullTokenizer --vocab-size 255 --split 100,0,0 --eval-iters 0
        --log-interval 1 --threads 1)
gpt=(--model tiny-gpt "${common[@]}")
llama=(--model tiny-llama "${common[@]}" --num-query-groups 2)

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# The dataset, once per file: 60 copies of the unit.
dataset() {
    local p="$BATS_FILE_TMPDIR/packed"
    if [ ! -f "$p.idx" ]; then
        for _ in $(seq 60); do echo "$UNIT"; done | "$MKIDX" write "$p" uint16
    fi
    echo "$p"
}

# ckpt_loss's input for the documents of one sample, one document a row:
# the document's ids padded with 0 to T, then the targets (the next id of
# the sample; -1 where the input is the end-of-document id, as
# --eod-mask-loss, and on the padding). Prints "ROWS" on fd 3.
doc_rows() {
    local sample
    sample=$(for u in 1 2 3 4; do echo "$UNIT"; done | tr '\n' ' '; echo "${UNIT%% *}")
    awk -v T=$T -v eod=$EOD -v sample="$sample" '
        BEGIN {
            n = split(sample, s, " ")            # T + 1 ids
            rows = 0; start = 1
            for (i = 1; i <= T; i++)
                if (s[i] == eod || i == T) { rows++; b[rows] = start; e[rows] = i; start = i + 1 }
            for (r = 1; r <= rows; r++) {
                line = ""
                for (j = 0; j < T; j++) line = line " " (b[r] + j <= e[r] ? s[b[r] + j] : 0)
                print line
            }
            for (r = 1; r <= rows; r++) {
                line = ""
                for (j = 0; j < T; j++) {
                    i = b[r] + j
                    line = line " " (i <= e[r] && s[i] != eod ? s[i + 1] : -1)
                }
                print line
            }
            print rows > "/dev/fd/3"
        }'
}

# lm loss of iteration $2 of a --log-json file $1
loss_at() {
    grep -o '"lm loss": [^,}]*' "$1" | sed -n "${2}p" | sed 's/.*: //'
}

# |a - b| <= tol * |b|
close() {
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
        printf "# %s vs %s: relative difference %.3g (bound %g)\n", a, b, d / m, t > "/dev/fd/3";
        exit !(d <= t * m) }'
}

# The packed loss against the documents one by one, for model args "$@".
check_docs() {
    local data
    data=$(dataset)
    run -0 "$MC_TRAIN" "$@" "${packed[@]}" --data-path "$data" --micro-batch-size 2 \
        --global-batch-size 2 --lr 0 --train-iters 1 --log-json log.json --save ck
    local lpacked rows
    lpacked=$(loss_at log.json 1)
    [ -n "$lpacked" ]
    doc_rows > ids.txt 3> rows.txt
    rows=$(cat rows.txt)
    [ "$rows" -eq 17 ]
    run -0 "$CKPT_LOSS" ck/iter_0000001 "$rows" $T < ids.txt
    local ldocs=${output% *} count=${output#* }
    # counted targets: the ids that are not the end of a document, less the
    # first unit's first document's first id (no id predicts it): 4 x 20 - 1,
    # and the extra id of the sample (predicted by the last one)
    assert_equal "$count" 80
    close "$lpacked" "$ldocs" 1e-6
    # mc-eval over the same two samples: the same mean
    run -0 "$MC_EVAL" ck/iter_0000001 "${packed[@]}" --data-path "$data" --split 100,0,0 \
        --ppl-mode samples --eval-split train --eval-samples 2 --quiet -o eval.json
    local nll scored
    nll=$(grep -o '"nll": [^,}]*' eval.json | sed 's/.*: //')
    scored=$(grep -o '"scored_tokens": [0-9]*' eval.json | sed 's/.*: //')
    assert_equal "$scored" $((2 * 80))
    close "$nll" "$ldocs" 1e-6
    # without the options the same batch has another loss
    run -0 "$MC_TRAIN" "$@" --data-path "$data" --micro-batch-size 2 --global-batch-size 2 \
        --lr 0 --train-iters 1 --log-json plain.json
    ! close "$(loss_at plain.json 1)" "$ldocs" 1e-4
}

@test "GPT (learned positions): a packed sequence's loss is its documents' losses one by one (1e-6), in mc-train and mc-eval" {
    check_docs "${gpt[@]}"
}

@test "Llama (RoPE, grouped queries): a packed sequence's loss is its documents' losses one by one (1e-6), in mc-train and mc-eval" {
    check_docs "${llama[@]}"
}

# Three iterations (learning rate 1e-3) of model args $3... on one process
# and on $1 ranks with the grid's options $2 (words).
grid_same() {
    local np=$1 data
    local -a grid
    read -r -a grid <<<"$2"
    shift 2
    data=$(dataset)
    rm -f one.json grid.json # --log-json appends
    run -0 "$MC_TRAIN" "$@" "${packed[@]}" --data-path "$data" --lr 1e-3 --train-iters 3 \
        --log-json one.json
    mpi_setup
    run -0 mpi "$np" "$@" "${grid[@]}" "${packed[@]}" --data-path "$data" --lr 1e-3 \
        --train-iters 3 --log-json grid.json
    local i
    for i in 1 2 3; do close "$(loss_at grid.json $i)" "$(loss_at one.json $i)" 1e-6; done
}

@test "pipeline parallelism (1F1B and interleaved): the single process's losses (1e-6)" {
    grid_same 2 "--pipeline-model-parallel-size 2" "${llama[@]}" --micro-batch-size 1 \
        --global-batch-size 2
    grid_same 2 "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1" \
        "${gpt[@]}" --num-layers 4 --micro-batch-size 1 --global-batch-size 2
}

@test "tensor parallelism with sequence parallelism: the single process's losses (1e-6)" {
    grid_same 2 "--tensor-model-parallel-size 2 --sequence-parallel" "${gpt[@]}" \
        --micro-batch-size 2 --global-batch-size 2
    grid_same 2 "--tensor-model-parallel-size 2" "${llama[@]}" --micro-batch-size 2 \
        --global-batch-size 2
}

# mc-train against the PyTorch golden of $1 (gpt or llama).
check_golden() {
    require_python_module numpy
    local g="$GOLDEN/golden_packed_$1.json" data
    data=$(dataset)
    local -a args
    mapfile -t args < <("$MC_PYTHON" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["mc_train_args"]))' "$g")
    [ "${#args[@]}" -gt 10 ]
    run -0 "$MC_TRAIN" "${args[@]}" --data-path "$data" --log-json log.json
    local want_loss want_norm
    want_loss=$("$MC_PYTHON" -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["lm_loss"]))' "$g")
    want_norm=$("$MC_PYTHON" -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["grad_norm"]))' "$g")
    close "$(loss_at log.json 1)" "$want_loss" 1e-6
    close "$(grep -o '"grad-norm": [^,}]*' log.json | sed 's/.*: //')" "$want_norm" 5e-6
}

@test "GPT: the first iteration's loss and gradient norm match PyTorch with Megatron's masks (1e-6, 5e-6)" {
    check_golden gpt
}

@test "Llama: the first iteration's loss and gradient norm match PyTorch with Megatron's masks (1e-6, 5e-6)" {
    check_golden llama
}

@test "bad usage: one line and exit status 2" {
    run -2 "$MC_TRAIN" "${gpt[@]}" --mock-data --lr 1e-3 --train-iters 1 --reset-position-ids=1
    assert_equal "${#lines[@]}" 1
    assert_output --partial "reset-position-ids"
    run -2 "$MC_EVAL" --prompt hello --reset-attention-mask ck
    assert_output "mc-eval: error: --reset-attention-mask applies to perplexity: give --data-path or --text-file"
    run -2 "$MC_EVAL" --prompt hello --eod-mask-loss ck
    assert_output "mc-eval: error: --eod-mask-loss applies to perplexity: give --data-path or --text-file"
}
