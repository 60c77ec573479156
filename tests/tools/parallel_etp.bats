#!/usr/bin/env bats
# parallel_etp.bats - expert tensor parallelism (--expert-tensor-parallel-size
# equal to --tensor-model-parallel-size; smaller: parallel_etp_sub.bats):
# each TP rank holds 1 / tp of every expert's fc1 rows (SwiGLU's gate and
# up alike) and fc2 columns, and of the shared experts', routes the TP
# group's tokens alike (gathered first with sequence parallelism),
# dispatches over EP with its own tp coordinate, and
# the partial outputs are summed over TP. 20 iterations under mpirun give
# the single process's losses and load-balancing losses within 1e-6
# relative and its final weights within 1e-6 (mpi_common.bash's
# same_weights) for ETP=TP=2 with and without SP, ETP=TP=2 x EP=2 (both
# dispatchers, SP, the distributed optimizer with a capacity factor), with
# shared experts and selective recomputation, for GELU experts with biases,
# for SwiGLU experts with biases (each expert's fc1 bias [gate F | up F]
# split by columns, gate and up alike: with and without SP, x EP=2), and
# under CP=2 with a capacity factor; a checkpoint written at ETP=TP=2 x
# EP=2 resumes in one process with the uninterrupted run's losses, and one
# process's at ETP=TP=2 x EP=2 (also pre-split by mc-reshard for TP=2);
# the same both ways (and via mc-reshard) for SwiGLU experts with biases at
# ETP=TP=2, and each grid saves a checkpoint it loaded bit for bit (h5diff);
# mc-eval reads an ETP checkpoint (its NLL is mc-train's validation loss);
# the experts are really split (the plan's per-rank parameters lose half of
# the experts', and the run allocates the plan's activations, whose expert
# rows are F / 2 wide); the tokens per expert are one process's; and the bad
# values, each one line before any work.
# Measured: losses within 2.3e-8 relative, weights 1.2e-7, resumed 1.4e-8;
# SwiGLU experts with biases: losses 1.4e-8, weights 1.2e-7, resumed 1.1e-8.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
MC_PREPROCESS="$top_builddir/tools/mc-preprocess/mc-preprocess"

# mpi_common.bash's MoE Llama (two layers, 4 SwiGLU experts of 32, top-2,
# 20 iterations)
moe=("${moe_args[@]}")
moecap=("${moe[@]}" --moe-expert-capacity-factor 1.0)
moeshared=("${moe[@]}" --moe-shared-expert-intermediate-size 64)
# GELU experts with biases (tiny-gpt's defaults)
moegpt=("${moe[@]}" --model tiny-gpt)
# SwiGLU experts with biases (tiny-gpt's LayerNorm, biases and learned
# positions): each expert's fc1 bias [gate F | up F] split in two column chunks
moeswb=("${moe[@]}" --model tiny-gpt --swiglu)
etp=(--tensor-model-parallel-size 2 --expert-tensor-parallel-size 2)

setup() {
    mpi_setup
    cd "$BATS_TEST_TMPDIR"
}

@test "ETP=TP=2, without and with SP: one process's losses, balancing losses and weights" {
    etp_equivalent etp2 2 moe "${etp[@]}"
    etp_equivalent etp2sp 2 moe "${etp[@]}" --sequence-parallel
}

@test "ETP=TP=2 x EP=2 (world 4): both dispatchers, SP, the distributed optimizer with a capacity factor: one process" {
    etp_equivalent etp2ep2 4 moe "${etp[@]}" --expert-model-parallel-size 2
    etp_equivalent etp2ep2ag 4 moe "${etp[@]}" --expert-model-parallel-size 2 \
        --moe-token-dispatcher-type allgather
    etp_equivalent etp2ep2sp 4 moe "${etp[@]}" --expert-model-parallel-size 2 --sequence-parallel
    etp_equivalent etp2ep2cap 4 moecap "${etp[@]}" --expert-model-parallel-size 2 \
        --sequence-parallel --use-distributed-optimizer
}

@test "ETP=TP=2: shared experts split too (with SP and selective recomputation), GELU experts with biases x EP=2, x CP=2 with a capacity factor: one process" {
    etp_equivalent etp2shared 2 moeshared "${etp[@]}" --sequence-parallel
    etp_equivalent etp2sharedrc 4 moeshared "${etp[@]}" --expert-model-parallel-size 2 \
        --sequence-parallel --recompute-granularity selective --recompute-modules moe_act shared_experts
    etp_equivalent etp2gpt 4 moegpt "${etp[@]}" --expert-model-parallel-size 2 --sequence-parallel
    # context parallelism: the TP group's tokens are the CP rank's chunks
    etp_equivalent etp2cp2 4 moecap "${etp[@]}" --context-parallel-size 2 --sequence-parallel
}

@test "ETP=TP=2: SwiGLU experts with biases (fc1's bias split by columns, gate and up alike), without and with SP, and x EP=2 with the distributed optimizer: one process" {
    etp_equivalent etp2swb 2 moeswb "${etp[@]}"
    etp_equivalent etp2swbsp 2 moeswb "${etp[@]}" --sequence-parallel
    etp_equivalent etp2swbep2 4 moeswb "${etp[@]}" --expert-model-parallel-size 2 \
        --sequence-parallel --use-distributed-optimizer
}

@test "SwiGLU experts with biases: a checkpoint of ETP=TP=2 resumes in one process and one process's at ETP=TP=2 (and pre-split by mc-reshard), the uninterrupted run's losses and weights; each grid saves what it loaded bit for bit" {
    "$MC_TRAIN" "${moeswb[@]}" --log-json full.jsonl --save full >/dev/null 2>&1
    run --separate-stderr mpi 2 "${moeswb[@]}" "${etp[@]}" --sequence-parallel --exit-interval 10 \
        --save ck --save-interval 10 --log-json ck.jsonl
    assert_success
    assert_output "ck/iter_0000010"
    run --separate-stderr "$MC_TRAIN" "${moeswb[@]}" --load ck --log-json r1.jsonl --save r1
    assert_success
    cat ck.jsonl r1.jsonl > both.jsonl
    same_losses both.jsonl full.jsonl
    "$MC_TRAIN" "${moeswb[@]}" --exit-interval 10 --save ck1 --save-interval 10 \
        --log-json ck1.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 2 "${moeswb[@]}" "${etp[@]}" --load ck1 --log-json r2.jsonl --save r2
    assert_success
    cat ck1.jsonl r2.jsonl > both2.jsonl
    same_losses both2.jsonl full.jsonl
    # mc-reshard's TP pre-split (the expert tensors whole in each rank's file)
    run -0 "$top_builddir/tools/mc-reshard/mc-reshard" ck1 --target-tensor-parallel-size 2 -o shd
    run --separate-stderr mpi 2 "${moeswb[@]}" "${etp[@]}" --load shd --log-json r3.jsonl
    assert_success
    cat ck1.jsonl r3.jsonl > both3.jsonl
    same_losses both3.jsonl full.jsonl
    # loaded and saved again at once (--train-iters 10): the same tensors,
    # weights and moments, bit for bit, ETP=TP=2's read at TP=1 and back
    same_bits_after_reload 2 moeswb etp
    require_python_module h5py
    same_weights r1/iter_0000020/model.h5 full/iter_0000020/model.h5 same-names
    same_weights r2/iter_0000020/model.h5 full/iter_0000020/model.h5 same-names
}

@test "a checkpoint written at ETP=TP=2 x EP=2 resumes in one process, and one process's at ETP=TP=2 x EP=2 (and pre-split by mc-reshard at ETP=TP=2): the uninterrupted run's losses and weights" {
    "$MC_TRAIN" "${moe[@]}" --log-json full.jsonl --save full >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moe[@]}" "${etp[@]}" --expert-model-parallel-size 2 \
        --sequence-parallel --exit-interval 10 --save ck --save-interval 10 --log-json ck.jsonl
    assert_success
    assert_output "ck/iter_0000010"
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --load ck --log-json r1.jsonl
    assert_success
    # iterations 1 to 10 at ETP=TP=2 x EP=2, 11 to 20 in one process
    cat ck.jsonl r1.jsonl > both.jsonl
    same_losses both.jsonl full.jsonl
    # the other way: 10 iterations in one process, 10 at ETP=TP=2 x EP=2
    "$MC_TRAIN" "${moe[@]}" --exit-interval 10 --save ck1 --save-interval 10 \
        --log-json ck1.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moe[@]}" "${etp[@]}" --expert-model-parallel-size 2 \
        --load ck1 --log-json r2.jsonl --save r2
    assert_success
    cat ck1.jsonl r2.jsonl > both2.jsonl
    same_losses both2.jsonl full.jsonl
    # mc-reshard's TP pre-split (whole expert tensors in each rank's file)
    # read at ETP=TP=2: each rank takes its slices of them
    run -0 "$top_builddir/tools/mc-reshard/mc-reshard" ck1 --target-tensor-parallel-size 2 -o shd
    run --separate-stderr mpi 2 "${moe[@]}" "${etp[@]}" --load shd --log-json r3.jsonl
    assert_success
    cat ck1.jsonl r3.jsonl > both3.jsonl
    same_losses both3.jsonl full.jsonl
    require_python_module h5py
    same_weights r2/iter_0000020/model.h5 full/iter_0000020/model.h5 same-names
}

@test "the experts are split: the plan's per-rank parameters lose half of the experts' (SwiGLU's fc1 bias too; the model's count is its checkpoint's), the run allocates the plan's activations (expert rows F / 2 wide), tokens per expert one process's" {
    local p1 p2
    p1=$("$MC_TRAIN" "${moeshared[@]}" --tensor-model-parallel-size 2 --expert-model-parallel-size 2 \
         --dry-run --world-size 4 | grep -o 'parameters: [0-9]* elements' | grep -o '[0-9]*')
    p2=$("$MC_TRAIN" "${moeshared[@]}" "${etp[@]}" --expert-model-parallel-size 2 \
         --dry-run --world-size 4 | grep -o 'parameters: [0-9]* elements' | grep -o '[0-9]*')
    echo "# per-rank parameters: ETP=1 $p1, ETP=2 $p2" >&3
    run -0 "$MC_TRAIN" "${moe[@]}" "${etp[@]}" --expert-model-parallel-size 2 --dry-run --world-size 4
    assert_line --partial "data 2 (expert 2 x expert-data 1); experts split over tensor 2; micro-batch 1"
    run -0 "$MC_TRAIN" "${moe[@]}" --tensor-model-parallel-size 2 --dry-run --world-size 2
    refute_output --partial "experts split"

    # 2 MoE layers x 2 local experts x (fc1 64 x 64 + fc2 64 x 32), and the
    # shared expert's fc1 128 x 64 + fc2 64 x 64: half of each on a rank
    [ "$((p1 - p2))" -eq $((2 * (2 * (64 * 64 + 64 * 32) + 128 * 64 + 64 * 64) / 2)) ]
    # SwiGLU experts with biases: 2 layers x 4 experts x (fc1 64 x 64, its
    # bias 64, fc2 64 x 32) halved; the model's count is its checkpoint's
    local s1 s2
    s1=$("$MC_TRAIN" "${moeswb[@]}" --tensor-model-parallel-size 2 --dry-run --world-size 2 |
         grep -o 'parameters: [0-9]* elements' | grep -o '[0-9]*')
    run -0 "$MC_TRAIN" "${moeswb[@]}" "${etp[@]}" --dry-run --world-size 2
    s2=$(grep -o 'parameters: [0-9]* elements' <<<"$output" | grep -o '[0-9]*')
    echo "# SwiGLU experts with biases, per-rank parameters: ETP=1 $s1, ETP=2 $s2" >&3
    [ "$((s1 - s2))" -eq $((2 * 4 * (64 * 64 + 64 + 64 * 32) / 2)) ]
    local total
    total=$(grep -o '^model: [0-9]* parameters' <<<"$output" | grep -o '[0-9]*')
    run --separate-stderr mpi 2 "${moeswb[@]}" "${etp[@]}" --train-iters 2 --lr-warmup-iters 1 \
        --save one
    assert_success
    if "$MC_PYTHON" -c 'import h5py' 2>/dev/null; then
        run -0 "$MC_PYTHON" -c 'import sys, h5py
m = h5py.File(sys.argv[1], "r")["model"]
print(sum(m[k].size for k in m))' one/iter_0000002/model.h5
        echo "# model parameters: dry run $total, checkpoint $output" >&3
        [ -n "$total" ] && [ "$output" = "$total" ]
    fi
    local d planned got
    for d in "--moe-token-dispatcher-type alltoall --sequence-parallel" \
             "--moe-token-dispatcher-type allgather"; do
        # shellcheck disable=SC2086
        planned=$("$MC_TRAIN" "${moeshared[@]}" "${etp[@]}" --expert-model-parallel-size 2 $d \
                  --train-iters 2 --lr-warmup-iters 1 --dry-run --world-size 4 |
                  grep -o '^  activations: .* scratch' | sed 's/.*in flight x //')
        # shellcheck disable=SC2086
        run --separate-stderr mpi 4 "${moeshared[@]}" "${etp[@]}" --expert-model-parallel-size 2 $d \
            --train-iters 2 --lr-warmup-iters 1
        assert_success
        got=$(grep -o 'activations (stage 0): .* scratch' <<<"$stderr" | sed 's/.*= 1 x //')
        echo "# $d: activations planned $planned, allocated $got" >&3
        [ -n "$got" ] && [ "$got" = "$planned" ]
    done
    # without ETP the experts' rows are F wide: the plan differs
    run -0 "$MC_TRAIN" "${moeshared[@]}" --tensor-model-parallel-size 2 --expert-model-parallel-size 2 \
        --moe-token-dispatcher-type allgather --train-iters 2 --lr-warmup-iters 1 --dry-run --world-size 4
    [ "$(grep -o '^  activations: .* scratch' <<<"$output" | sed 's/.*in flight x //')" != "$got" ]
    # the tokens per expert: every TP rank routed the TP group's tokens, not summed over TP
    local t=(--moe-per-layer-logging --log-interval 1 --train-iters 4)
    "$MC_TRAIN" "${moe[@]}" "${t[@]}" --log-json one.jsonl >/dev/null 2>&1
    run --separate-stderr mpi 4 "${moe[@]}" "${t[@]}" "${etp[@]}" --expert-model-parallel-size 2 \
        --sequence-parallel --log-json sp.jsonl
    assert_success
    local f
    for f in one sp; do
        grep -o '"step": [0-9]*\|"moe/tokens_per_expert_layer_[0-9]*_expert_[0-9]*": [0-9.e+]*' $f.jsonl > $f.txt
    done
    [ "$(grep -c tokens_per_expert one.txt)" -eq $((4 * 2 * 4)) ]
    diff one.txt sp.txt
}

@test "mc-eval reads a checkpoint of ETP=TP=2 with SP: its NLL of the validation samples is mc-train's validation loss" {
    awk 'BEGIN { srand(3); for (d = 0; d < 200; d++) { n = 5 + int(rand() * 40); s = "";
         for (i = 0; i < n; i++) s = s (i ? " " : "") int(rand() * 50);
         printf "{\"text\": \"%s\"}\n", s } }' > docs.jsonl
    "$MC_PREPROCESS" --quiet --tokenizer-type NullTokenizer --vocab-size 50 --append-eod \
        --output-prefix ds docs.jsonl
    # (vocabulary padded to 52 at TP=2 and TP=1 alike)
    run --separate-stderr mpi 2 --model tiny-llama --num-attention-heads 8 --num-query-groups 4 \
        --num-layers 2 --hidden-size 32 --seq-length 24 --global-batch-size 4 --micro-batch-size 2 \
        --num-experts 4 --moe-ffn-hidden-size 16 --moe-shared-expert-intermediate-size 32 \
        --train-iters 4 --lr 3e-3 --threads 1 --tokenizer-type NullTokenizer --vocab-size 50 \
        --make-vocab-size-divisible-by 13 --data-path ds_text_document --eval-iters 3 \
        --eval-interval 1000 --split 80,15,5 --seed 99 --save ck --log-json log.json \
        "${etp[@]}" --sequence-parallel
    assert_success
    local want got
    want=$(grep -o '"lm loss validation": [^,}]*' log.json | sed 's/.*: //')
    "$MC_EVAL" ck --quiet --data-path ds_text_document --ppl-mode samples --eval-split valid \
        --split 80,15,5 --seed 99 --eval-samples 12 > s.json
    got=$(grep -o '"nll": [^,}]*' s.json | sed 's/.*: //')
    echo "# mc-train validation loss $want, mc-eval NLL $got" >&3
    [ -n "$want" ] && [ -n "$got" ]
    awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b) }'
}

@test "bad expert tensor parallelism, one line before any work (exit 2): not dividing TP, no experts, F not divisible" {
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --expert-tensor-parallel-size 2
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'error')" -eq 1 ]
    [[ "$stderr" == *"--expert-tensor-parallel-size 2 must divide --tensor-model-parallel-size 1"* ]]
    run --separate-stderr mpi 4 "${moe[@]}" --tensor-model-parallel-size 2 \
        --expert-tensor-parallel-size 4
    assert_failure 2
    [ "$(printf '%s\n' "$stderr" | grep -c 'error')" -eq 1 ]
    [[ "$stderr" == *"--expert-tensor-parallel-size 4 must divide --tensor-model-parallel-size 2"* ]]
    run --separate-stderr "$MC_TRAIN" --model tiny-llama --mock-data --vocab-size 64 \
        --train-iters 2 --lr 1e-3 "${etp[@]}" --dry-run --world-size 2
    assert_failure 2
    [[ "$stderr" == *"--expert-tensor-parallel-size 2 needs --num-experts"* ]]
    run --separate-stderr "$MC_TRAIN" "${moe[@]}" --moe-ffn-hidden-size 33 "${etp[@]}" \
        --dry-run --world-size 2
    assert_failure 2
    [[ "$stderr" == *"--moe-ffn-hidden-size (33) must be a multiple of --expert-tensor-parallel-size (2)"* ]]
    # ETP=1 under TP=2 is the replicated experts of parallel_ep.bats
    run -0 --separate-stderr "$MC_TRAIN" "${moe[@]}" --tensor-model-parallel-size 2 \
        --expert-tensor-parallel-size 1 --dry-run --world-size 2
}
