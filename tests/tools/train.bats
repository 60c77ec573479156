#!/usr/bin/env bats
# Tests of mc-train as a user runs it: usage errors, Megatron's log line,
# --log-json, determinism, exact resume (2N == N + N, losses and weights),
# signals, exits, NaN handling, checkpoint refusal, the pipeline contract
# and --data-path's Megatron-style word lists. Every run is a tiny model on
# a few short sequences (about a second each).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# A one-layer GPT, T=16, 4 sequences per iteration in 2 micro-batches.
gpt=(--model tiny-gpt --num-layers 1 --hidden-size 32 --seq-length 16 --micro-batch-size 2
     --global-batch-size 4 --threads 1 --lr 1e-3 --log-interval 1 --eval-iters 0)
mock=(--mock-data --vocab-size 64)
llama=(--model tiny-llama --num-layers 1 --seq-length 16 --micro-batch-size 2
       --global-batch-size 4 --threads 1 --lr 1e-3 --log-interval 1 --eval-iters 0)

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# The "lm loss" of every line of a --log-json file, one per line, exactly
# as written (shortest round-trip digits, so equal text is equal bits).
losses() {
    grep -o '"lm loss": [^,}]*' "$1"
}

# Compare every dataset of two checkpoints bit for bit (h5py).
same_weights() {
    "$MC_PYTHON" - "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert names, "no tensors"
bad = [n for n in names if n not in b or a[n].dtype != b[n].dtype
       or not np.array_equal(a[n][()].view(np.uint8), b[n][()].view(np.uint8))]
print(len(names), "tensors,", len(bad), "differ:", bad[:5])
sys.exit(1 if bad else 0)
EOF
}

# A small NullTokenizer dataset: 300 documents of ids < 50, with EOD.
make_dataset() {
    awk 'BEGIN { srand(7); for (d = 0; d < 300; d++) { n = 5 + int(rand() * 40); s = "";
         for (i = 0; i < n; i++) s = s (i ? " " : "") int(rand() * 50);
         printf "{\"text\": \"%s\"}\n", s } }' > docs.jsonl
    "$MC_PREPROCESS" --quiet --tokenizer-type NullTokenizer --vocab-size 50 --append-eod \
        --output-prefix "$1" docs.jsonl
}

@test "--help lists the options of issue 3; --version names the package" {
    run "$MC_TRAIN" --help
    assert_success
    for o in model num-layers hidden-size num-attention-heads ffn-hidden-size seq-length \
             max-position-embeddings normalization swiglu position-embedding-type rotary-base \
             group-query-attention num-query-groups untie-embeddings-and-output-weights \
             disable-bias-linear init-method-std make-vocab-size-divisible-by tokenizer-type \
             tokenizer-model vocab-size bf16 fp16 loss-scale initial-loss-scale hysteresis \
             micro-batch-size global-batch-size train-iters train-samples lr min-lr \
             lr-warmup-iters lr-warmup-fraction lr-decay-iters lr-decay-style weight-decay \
             adam-beta1 adam-beta2 adam-eps clip-grad eval-interval eval-iters log-interval \
             tensorboard-dir log-json max-nan-iters exit-interval exit-duration-in-mins \
             data-path split data-cache-path mock-data save load save-interval finetune \
             no-load-optim no-save-optim ckpt-compression seed device peak-tflops; do
        assert_output --partial "--$o"
    done
    run "$MC_TRAIN" --version
    assert_success
    assert_output --regexp '^mc-train \(mc\) [0-9]+\.[0-9]+'
}

@test "bad usage exits 2 with one line naming the problem" {
    run "$MC_TRAIN" --no-such-option
    assert_failure 2
    assert_output --partial "mc-train: error:"
    assert_output --partial "no-such-option"
    run "$MC_TRAIN" "${mock[@]}" --model tiny-gpt --train-iters 2
    assert_failure 2
    assert_output --partial "--lr is required"
    run "$MC_TRAIN" "${mock[@]}" --model tiny-gpt --lr 1e-3
    assert_failure 2
    assert_output --partial "exactly one of --train-iters and --train-samples"
    run "$MC_TRAIN" "${mock[@]}" --model tiny-gpt --lr 1e-3 --train-iters 2 --train-samples 8
    assert_failure 2
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --global-batch-size 5
    assert_failure 2
    assert_output --partial "--global-batch-size 5 is not a multiple of --micro-batch-size 2"
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --lr-decay-style sideways
    assert_failure 2
    assert_output --partial "sideways"
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --model gpt5
    assert_failure 2
    assert_output --partial "gpt5"
    run "$MC_TRAIN" --model tiny-gpt --lr 1e-3 --train-iters 2 --mock-data
    assert_failure 2
    assert_output --partial "vocabulary size is unknown"
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --micro-batch-size 0
    assert_failure 2
    assert_output --partial "--micro-batch-size"
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --data-path x
    assert_failure 2
    assert_output --partial "exclude each other"
}

@test "the log line is Megatron's, with tokens/s, TFLOP/s and MFU appended" {
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 3 --peak-tflops 1
    assert_success
    assert_output ""
    local re='^ \[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}\] iteration        2/       3 \| consumed samples:            8 \| elapsed time per iteration \(ms\): [0-9]+\.[0-9] \| learning rate: 3\.333333E-04 \| global batch size:     4 \| lm loss: [0-9]\.[0-9]{6}E\+00 \| loss scale: 1\.0 \| grad norm: [0-9]+\.[0-9]{3} \| number of skipped iterations:   0 \| number of nan iterations:   0 \| tokens/s: [0-9]+\.[0-9] \| TFLOP/s: [0-9]+\.[0-9]{3} \| MFU: [0-9]+\.[0-9]% \|$'
    echo "$stderr" | grep -E "$re"
    [ "$(echo "$stderr" | grep -c ' iteration  ')" = 3 ]
    # without --peak-tflops there is no MFU column
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 1
    [[ "$stderr" != *MFU* ]]
    [[ "$stderr" == *"TFLOP/s: "* ]]
}

@test "evaluation prints Megatron's framed validation and test lines" {
    make_dataset data >/dev/null
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --tokenizer-type NullTokenizer --vocab-size 50 \
        --data-path data_text_document --split 80,10,10 --train-iters 4 --eval-iters 2 \
        --eval-interval 2 --log-interval 2
    assert_success
    echo "$stderr" | grep -E '^ validation loss at iteration 2 \| lm loss value: [0-9]\.[0-9]{6}E\+00 \| lm loss PPL: [0-9]\.[0-9]{6}E\+[0-9]{2} \| $'
    echo "$stderr" | grep -E '^ validation loss at iteration 4 \| '
    echo "$stderr" | grep -E '^ validation loss at iteration 4 on test set \| lm loss value: '
    # the frame is one dash longer than the line, as Megatron prints it
    local line dashes
    line=$(echo "$stderr" | grep -m1 '^ validation loss at iteration 2 |')
    dashes=$(echo "$stderr" | grep -m1 -B1 '^ validation loss at iteration 2 |' | head -1)
    [ "${#dashes}" = $(( ${#line} + 1 )) ]
    [[ "$dashes" =~ ^-+$ ]]
}

@test "--log-json: one line per iteration with Megatron's tags, lr following the schedule" {
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 4 --lr-decay-style constant \
        --log-interval 2 --log-json m.jsonl --tensorboard-dir tb
    assert_success
    [ "$(wc -l < m.jsonl)" = 4 ]
    for k in '"step": 1,' '"consumed-samples": 16' '"lm loss": ' '"learning-rate": 0.001' \
             '"batch-size": 4' '"loss-scale": 1' '"grad-norm": ' '"iteration-time": ' \
             '"tokens-per-sec": ' '"throughput": ' '"skipped-iterations": 0' '"nan-iterations": 0'; do
        grep -q -F -- "$k" m.jsonl || { echo "missing $k"; cat m.jsonl; return 1; }
    done
    # timing tags only at log lines (iterations 2 and 4)
    [ "$(grep -c iteration-time m.jsonl)" = 2 ]
    ls tb/events.out.tfevents.*
    # losses are finite and fall on this easy task? at least they are numbers
    losses m.jsonl | grep -E '"lm loss": [0-9]+\.[0-9]+'
}

@test "determinism: two runs give identical losses and weights" {
    require_python_module h5py
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 4 --log-json a.jsonl --save a 2>/dev/null
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 4 --log-json b.jsonl --save b 2>/dev/null
    [ "$(losses a.jsonl | wc -l)" = 4 ]
    diff <(losses a.jsonl) <(losses b.jsonl)
    same_weights a/iter_0000004/model.h5 b/iter_0000004/model.h5
    # and a different seed gives different losses
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 4 --log-json c.jsonl --seed 7 2>/dev/null
    run diff <(losses a.jsonl) <(losses c.jsonl)
    assert_failure
}

@test "exact resume: 6 iterations == 3, stop, resume for 3 more (GPT, losses and weights)" {
    require_python_module h5py
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 6 \
        --lr-warmup-iters 2 --lr-decay-style cosine --log-json full.jsonl --save full
    assert_success
    assert_output "full/iter_0000006"
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 6 \
        --lr-warmup-iters 2 --lr-decay-style cosine --log-json half.jsonl --save half --exit-interval 3
    assert_success
    assert_output "half/iter_0000003"
    [ "$(cat half/latest_checkpointed_iteration.txt)" = 3 ]
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 6 \
        --lr-warmup-iters 2 --lr-decay-style cosine --log-json half.jsonl --save half --load half
    assert_success
    assert_output "half/iter_0000006"
    [[ "$stderr" == *"loaded checkpoint half/iter_0000003 at iteration 3"* ]]
    [ "$(losses half.jsonl | wc -l)" = 6 ]
    diff <(losses full.jsonl) <(losses half.jsonl)
    same_weights full/iter_0000006/model.h5 half/iter_0000006/model.h5
}

@test "exact resume with a real dataset, Llama, bf16, evaluation and accumulation" {
    require_python_module h5py
    make_dataset data >/dev/null
    local args=("${llama[@]}" --tokenizer-type NullTokenizer --vocab-size 50 --bf16
                --data-path data_text_document --split 80,10,10 --eval-iters 1 --eval-interval 2
                --global-batch-size 8 --train-iters 4)
    "$MC_TRAIN" "${args[@]}" --log-json full.jsonl --save full 2>/dev/null
    "$MC_TRAIN" "${args[@]}" --log-json half.jsonl --save half --exit-interval 2 2>/dev/null
    "$MC_TRAIN" "${args[@]}" --log-json half.jsonl --save half --load half 2>/dev/null
    diff <(losses full.jsonl) <(losses half.jsonl)
    diff <(grep -o '"lm loss validation": [^,}]*' full.jsonl) \
         <(grep -o '"lm loss validation": [^,}]*' half.jsonl)
    same_weights full/iter_0000004/model.h5 half/iter_0000004/model.h5
}

@test "SIGTERM mid-run: finish the iteration, save, print the checkpoint, exit 0" {
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 100000 --save ck >out 2>err &
    local pid=$!
    for _ in $(seq 1200); do
        grep -q 'iteration        2/' err 2>/dev/null && break
        sleep 0.1
    done
    grep -q 'iteration        2/' err
    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 0 ]
    grep -q "exiting after iteration .* on a signal" err
    local dir
    dir=$(cat out)
    [[ "$dir" =~ ^ck/iter_[0-9]{7}$ ]]
    [ -f "$dir/model.h5" ]
    [ "ck/iter_$(printf %07d "$(cat ck/latest_checkpointed_iteration.txt)")" = "$dir" ]
    # the checkpoint's iteration is the last one logged
    local last
    last=$(grep -o 'iteration *[0-9]*/' err | tail -1 | grep -o '[0-9]*')
    [ "$dir" = "ck/iter_$(printf %07d "$last")" ]
}

@test "--exit-duration-in-mins and --save-interval save and exit 0" {
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 1000 \
        --exit-duration-in-mins 0.0001 --save ck
    assert_success
    assert_output "ck/iter_0000001"
    [[ "$stderr" == *"--exit-duration-in-mins"* ]]
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 5 --save-interval 2 --save s
    assert_success
    assert_output "s/iter_0000005"
    [ -d s/iter_0000002 ] && [ -d s/iter_0000004 ] && [ -d s/iter_0000005 ]
}

@test "a full disk during a save (file-size limit): one line, exit 1, the previous checkpoint and latest intact" {
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 1 --save ck >/dev/null 2>&1
    cp ck/iter_0000001/model.h5 before.h5
    # model.h5 is ~250 KB: a 64 KB limit fails its write (SIGXFSZ ignored)
    run --separate-stderr bash -c "ulimit -f 64; '$MC_TRAIN' ${mock[*]} ${gpt[*]} --train-iters 2 --load ck --save ck"
    assert_failure 1
    assert_output ""
    [ "$(grep -c 'error' <<<"$stderr")" -eq 1 ]
    [[ "$stderr" == *"mc-train: error: ck/iter_0000002/model.h5: "*"File too large"* ]]
    run ls -A ck
    assert_output "iter_0000001
latest_checkpointed_iteration.txt"
    [ "$(cat ck/latest_checkpointed_iteration.txt)" = 1 ]
    cmp before.h5 ck/iter_0000001/model.h5
}

@test "NaN: a huge --lr makes the loss overflow; iterations are skipped, counted, then an error" {
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --lr 1e12 --train-iters 40 \
        --max-nan-iters 3 --log-json m.jsonl --save ck
    assert_failure 1
    assert_output ""
    [[ "$stderr" == *"update skipped (1 in a row, --max-nan-iters 3)"* ]]
    [[ "$stderr" == *"update skipped (3 in a row, --max-nan-iters 3)"* ]]
    [[ "$stderr" == *"mc-train: error: iteration "*": 3 iterations in a row with NaN/Inf loss or gradients (--max-nan-iters 3)"* ]]
    echo "$stderr" | grep -E 'number of skipped iterations:   1 \| number of nan iterations:   1 \|'
    grep -q '"nan-iterations": 1' m.jsonl
    # nothing was saved for a failed run
    [ ! -e ck/latest_checkpointed_iteration.txt ]
}

@test "fp16: an overflowing loss scale backs off with hysteresis and skips the updates" {
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --fp16 --train-iters 3 \
        --initial-loss-scale 1e30 --hysteresis 2
    assert_success
    echo "$stderr" | grep -E 'iteration        1/.*loss scale: 1000000000000000019884624838656\.0 \| number of skipped iterations:   1 \| number of nan iterations:   0'
    echo "$stderr" | grep -E 'iteration        2/.*loss scale: 500000000000000009942312419328\.0 \|'
    # a sane scale trains normally
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --fp16 --train-iters 2 --loss-scale 1024
    assert_success
    echo "$stderr" | grep -E 'iteration        2/.*loss scale: 1024\.0 \| grad norm: [0-9.]+ \| number of skipped iterations:   0'
}

@test "a checkpoint of another shape is refused naming the tensor and both shapes" {
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 1 --save ck 2>/dev/null
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --load ck --hidden-size 64
    assert_failure 1
    assert_output --partial "ck/iter_0000001/model.h5: tensor model/embedding.word_embeddings.weight has shape [128, 32] in the checkpoint, the model needs [128, 64]"
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --load ck --init-method-std 0.01
    assert_failure 1
    assert_output --partial "model configuration differs: init_method_std"
    # a tensor the checkpoint lacks: an error, not a fresh start
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --load ck --untie-embeddings-and-output-weights
    assert_failure 1
    assert_output "mc-train: error: ck/iter_0000001/model.h5: model/output_layer.weight: no such tensor in the checkpoint"
    # a truncated file
    truncate -s 2000 ck/iter_0000001/model.h5
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --load ck
    assert_failure 1
    assert_output --regexp "^mc-train: error: ck/iter_0000001/model.h5: "
}

@test "--no-save-optim, --no-load-optim, --finetune and a --load with nothing in it" {
    "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 2 --save ck --no-save-optim 2>/dev/null
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 3 --load ck
    assert_failure 1
    assert_output --partial "holds no optimizer state"
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 3 --load ck --no-load-optim
    assert_success
    [[ "$stderr" == *"at iteration 2 (no optimizer state)"* ]]
    [ "$(echo "$stderr" | grep -c ' iteration  ')" = 1 ]
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 3 --load ck --finetune
    assert_success
    [ "$(echo "$stderr" | grep -c ' iteration  ')" = 3 ]
    run --separate-stderr "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 1 --load empty --save empty
    assert_success
    assert_output "empty/iter_0000001"
    [[ "$stderr" == *"starting from random initialization"* ]]
    run "$MC_TRAIN" "${mock[@]}" "${gpt[@]}" --train-iters 1 --load nowhere --finetune
    assert_failure 1
}

@test "pipeline: the prefix comes from stdin, stdout is exactly the checkpoint directory" {
    make_dataset data > prefix.txt
    [ "$(cat prefix.txt)" = data_text_document ]
    run --separate-stderr bash -c "'$MC_PREPROCESS' --quiet --tokenizer-type NullTokenizer --vocab-size 50 \
        --append-eod --output-prefix piped docs.jsonl | '$MC_TRAIN' ${gpt[*]} --tokenizer-type NullTokenizer \
        --vocab-size 50 --split 80,10,10 --train-iters 2 --save ck"
    assert_success
    assert_output "ck/iter_0000002"
    # without --save nothing is printed
    run --separate-stderr "$MC_TRAIN" "${gpt[@]}" --tokenizer-type NullTokenizer --vocab-size 50 \
        --split 80,10,10 --train-iters 1 < prefix.txt
    assert_success
    assert_output ""
    # an empty stdin is a usage error
    run "$MC_TRAIN" "${gpt[@]}" --tokenizer-type NullTokenizer --vocab-size 50 --train-iters 1 < <(:)
    assert_failure 2
    assert_output --partial "stdin holds no dataset prefix"
}

@test "--data-path takes Megatron's word list, repeated or not; stray words are refused" {
    make_dataset a >/dev/null
    cp a_text_document.bin b_text_document.bin
    cp a_text_document.idx b_text_document.idx
    local base=("${gpt[@]}" --tokenizer-type NullTokenizer --vocab-size 50 --split 80,10,10
                --train-iters 2 --data-cache-path cache)
    "$MC_TRAIN" "${base[@]}" --data-path 0.3 a_text_document 0.7 b_text_document --log-json one.jsonl 2>/dev/null
    "$MC_TRAIN" --data-path 0.3 --data-path a_text_document --data-path=0.7 b_text_document \
        "${base[@]}" --log-json two.jsonl 2>/dev/null
    diff <(losses one.jsonl) <(losses two.jsonl)
    # a blend differs from one dataset alone
    "$MC_TRAIN" "${base[@]}" --data-path a_text_document --log-json three.jsonl 2>/dev/null
    run diff <(losses one.jsonl) <(losses three.jsonl)
    assert_failure
    run "$MC_TRAIN" "${base[@]}" stray --mock-data
    assert_failure 2
    assert_output --partial "unexpected argument 'stray'"
    run "$MC_TRAIN" "${base[@]}" --data-path 0.3 a_text_document -0.7 b_text_document
    assert_failure 2
    assert_output --partial "--data-path"
}

@test "the checkpoint stores the tokenizer: its files byte for byte and its type" {
    tok="$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"
    run "$MC_TRAIN" "${gpt[@]}" --mock-data --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$tok" --train-iters 1 --save ck
    assert_success
    h5dump -d /tokenizer_model -b LE -o stored.bin ck/iter_0000001/model.h5 >/dev/null
    cmp stored.bin "$tok"
    run h5dump -a tokenizer ck/iter_0000001/model.h5
    assert_output --partial '"type":"HuggingFaceTokenizer"'
    assert_output --partial '"model":"hf_bytelevel.json"'
    # Without a tokenizer there is none to store.
    run "$MC_TRAIN" "${gpt[@]}" "${mock[@]}" --train-iters 1 --save ck2
    assert_success
    run h5dump -a tokenizer ck2/iter_0000001/model.h5
    refute_output --partial 'HuggingFaceTokenizer'
}

@test "--use-checkpoint-args takes the architecture and vocabulary from --load" {
    # a Llama of a shape no preset has, and a vocabulary given only here
    shape=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --num-query-groups 2
           --group-query-attention --ffn-hidden-size 80 --seq-length 16)
    run "$MC_TRAIN" "${llama[@]}" "${shape[@]}" --mock-data --vocab-size 70 \
        --make-vocab-size-divisible-by 8 --train-iters 2 --save ck
    assert_success
    # fine-tune it twice: from the checkpoint's args, and from the same flags
    run "$MC_TRAIN" --load ck --use-checkpoint-args --finetune --mock-data --micro-batch-size 2 \
        --global-batch-size 4 --threads 1 --lr 1e-3 --log-interval 1 --eval-iters 0 \
        --train-iters 2 --log-json a.jsonl
    assert_success
    run "$MC_TRAIN" "${llama[@]}" "${shape[@]}" --mock-data --vocab-size 70 \
        --make-vocab-size-divisible-by 8 --load ck --finetune --train-iters 2 --log-json b.jsonl
    assert_success
    [ -n "$(losses a.jsonl)" ]
    [ "$(losses a.jsonl)" = "$(losses b.jsonl)" ]
    # a model flag still overrides: another width no longer fits the tensors
    run "$MC_TRAIN" --load ck --use-checkpoint-args --finetune --mock-data --hidden-size 64 \
        --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 1
    assert_failure 1
    assert_output --partial "has shape [72, 48] in the checkpoint, the model needs [72, 64]"
    run "$MC_TRAIN" --use-checkpoint-args --mock-data --lr 1e-3 --train-iters 1 \
        --micro-batch-size 2 --global-batch-size 4
    assert_failure 2
    assert_output --partial "--use-checkpoint-args needs --load"
    run "$MC_TRAIN" --model tiny-gpt --load ck --use-checkpoint-args --mock-data --lr 1e-3 \
        --train-iters 1 --micro-batch-size 2 --global-batch-size 4
    assert_failure 2
    assert_output --partial "exclude each other"
}
