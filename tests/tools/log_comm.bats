#!/usr/bin/env bats
# mc-train --log-comm (issue 4, section 9): after every log line rank 0
# prints one line of its traffic per iteration, per group and collective
# kind, and the same figures go to --log-json. The bytes handed to the
# collectives and the bytes this rank sent ("wire") must equal --dry-run's
# theoretical figures for the tensor- and data-parallel groups: both count
# the same tensors, so the tolerance is the line's resolution, 1e-6 MB = 1
# byte per iteration (the calls must match exactly too).

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# Tiny GPT, 4 sequences of 16 tokens per iteration in micro-batches of 1.
args=(--model tiny-gpt --seq-length 16 --micro-batch-size 1 --global-batch-size 4 --threads 1
      --lr 1e-3 --log-interval 5 --eval-iters 0 --mock-data --vocab-size 64
      --make-vocab-size-divisible-by 16 --train-iters 10 --lr-warmup-iters 2)

setup() {
    mpi_setup
    cd "$BATS_TEST_TMPDIR"
}

# mpi N ARGS...: mc-train on N ranks, stderr to err.txt.
mpi() {
    local n=$1
    shift
    mpi_exec 120 "$n" "$MC_TRAIN" "$@" 2>err.txt
}

# measured GROUP FIELD: from the last comm line of err.txt, the sum over the
# group's kinds (host scalars left out) of bytes ("MB" x 1e6), "wire" bytes
# or "calls".
measured() {
    grep '^ comm per iteration:' err.txt | tail -1 | sed 's/^ comm per iteration://' |
        tr '|' '\n' | awk -v g="$1" -v f="$2" '
        $1 == g && $2 != "scalar:" {
            # " tp all-reduce: 13 calls, 0.041152 MB, wire 0.041152 MB, 3.4 ms "
            if (f == "calls") s += $3
            else if (f == "MB") s += $5 * 1e6
            else if (f == "wire") s += $8 * 1e6
        }
        END { printf "%.0f\n", s }'
}

# planned GROUP-NAME FIELD WORLD ARGS...: the dry run's stage-0 figure for
# "tensor-parallel" or "data-parallel": bytes, wire or calls.
planned() {
    local grp=$1 f=$2 world=$3
    shift 3
    "$MC_TRAIN" --dry-run "$@" --world-size "$world" |
        awk -v g="$grp group:" -v f="$f" 'index($0, g) && !done {
            # "    tensor-parallel group: 41152 / 41152 bytes, 13 calls"
            n = split($0, w, " ")
            print (f == "bytes" ? w[3] : f == "wire" ? w[5] : w[7]); done = 1 }'
}

# same GROUP DRYNAME WORLD ARGS...: bytes and wire within 1 byte, calls equal
# (calls left out when $FIELDS says so: the plan counts the bucketed
# reduction as one call).
same() {
    local grp=$1 name=$2 world=$3
    shift 3
    local f m p
    for f in ${FIELDS:-bytes wire calls}; do
        m=$(measured "$grp" "$([ $f = bytes ] && echo MB || echo $f)")
        p=$(planned "$name" "$f" "$world" "$@")
        echo "# $grp $f: measured $m, planned $p" >&3
        [ -n "$p" ] && [ "$p" -gt 0 ]
        awk -v a="$m" -v b="$p" 'BEGIN { d = a - b; exit !(d <= 1 && d >= -1) }'
    done
}

@test "log-comm: TP=2 prints a comm line after every log line; tp bytes, wire and calls are the dry run's" {
    mpi 2 "${args[@]}" --tensor-model-parallel-size 2 --log-comm --log-json log.json
    [ "$(grep -c ' iteration ' err.txt)" -eq 2 ]
    [ "$(grep -c '^ comm per iteration:' err.txt)" -eq 2 ]
    # the comm line follows the iteration line
    run -0 grep -A1 ' iteration  *10/' err.txt
    assert_line --index 1 --regexp '^ comm per iteration: tp all-reduce: [0-9.]+ calls, [0-9.]+ MB, wire [0-9.]+ MB, [0-9.]+ ms \|'
    assert_line --index 1 --partial '| dp overlap: - |'
    same tp tensor-parallel 2 "${args[@]}" --tensor-model-parallel-size 2
    # log-json: the same bytes per iteration at step 10
    local mb
    mb=$(grep '"step": 10,' log.json | grep -o '"comm tp all-reduce MB": [0-9.e+-]*' | sed 's/.*: //')
    [ -n "$mb" ]
    awk -v a="$mb" -v b="$(measured tp MB)" 'BEGIN { d = a * 1e6 - b; exit !(d <= 1 && d >= -1) }'
}

@test "log-comm: DP=2 with overlapped buckets: dp all-reduce bytes are the dry run's, overlap in [0, 1]" {
    local o=(--overlap-grad-reduce --ddp-bucket-size 2000)
    mpi 2 "${args[@]}" "${o[@]}" --log-comm --log-json log.json
    FIELDS="bytes wire" same dp data-parallel 2 "${args[@]}" "${o[@]}"
    # 433152 bytes of gradients in buckets of 2000 elements or so: many calls
    [ "$(grep '^ comm' err.txt | tail -1 | grep -o 'dp all-reduce: [0-9]* calls' | grep -o '[0-9]*')" -gt 1 ]
    local f
    f=$(grep '^ comm' err.txt | tail -1 | grep -o 'dp overlap: [0-9.]*' | sed 's/.*: //')
    echo "# overlap $f" >&3
    awk -v f="$f" 'BEGIN { exit !(f != "" && f >= 0 && f <= 1) }'
    grep -q '"comm dp overlap": ' log.json
}

@test "log-comm: TP=2 x DP=2, sequence parallel, distributed optimizer: tp and dp are the dry run's" {
    local o=(--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer)
    mpi 4 "${args[@]}" "${o[@]}" --log-comm
    grep '^ comm' err.txt | tail -1 | grep -q 'tp all-gather: .*tp reduce-scatter: .*dp all-gather: .*dp reduce-scatter: '
    same tp tensor-parallel 4 "${args[@]}" "${o[@]}"
    same dp data-parallel 4 "${args[@]}" "${o[@]}"
}

@test "log-comm: recomputation's repeated forward collectives are the dry run's (TP=2, with and without SP)" {
    # tiny-gpt has 2 layers: full uniform 1 reruns both (2 groups), block 1
    # the first; selective mlp re-gathers norm2's output under SP
    local full=(--tensor-model-parallel-size 2 --recompute-granularity full
                --recompute-method uniform --recompute-num-layers 1)
    mpi 2 "${args[@]}" "${full[@]}" --log-comm
    same tp tensor-parallel 2 "${args[@]}" "${full[@]}"
    local block=(--tensor-model-parallel-size 2 --sequence-parallel --recompute-granularity full
                 --recompute-method block --recompute-num-layers 1)
    mpi 2 "${args[@]}" "${block[@]}" --log-comm
    same tp tensor-parallel 2 "${args[@]}" "${block[@]}"
    local sel=(--tensor-model-parallel-size 2 --sequence-parallel --recompute-granularity selective
               --recompute-modules mlp core_attn)
    mpi 2 "${args[@]}" "${sel[@]}" --log-comm
    same tp tensor-parallel 2 "${args[@]}" "${sel[@]}"
    # mc's attn_proj replays proj's all-reduce (under SP its reduce-scatter);
    # mlp_act replays nothing (no GEMM)
    local cheap=(--tensor-model-parallel-size 2 --recompute-granularity selective
                 --recompute-modules layernorm mlp_act attn_proj)
    mpi 2 "${args[@]}" "${cheap[@]}" --log-comm
    same tp tensor-parallel 2 "${args[@]}" "${cheap[@]}"
    mpi 2 "${args[@]}" "${cheap[@]}" --sequence-parallel --log-comm
    same tp tensor-parallel 2 "${args[@]}" "${cheap[@]}" --sequence-parallel
}

@test "log-comm: expert parallelism EP=2 x DP=2: the MoE dispatch (all-to-all, allgather) and the experts' reduction are the dry run's" {
    # 4 experts, top-2; padded to the capacity, every rank sends and
    # receives the same rows whatever the routing, so rank 0's all-to-all
    # bytes are the plan's exactly (without padding they vary by rank)
    local moe=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --num-experts 4
               --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 1e-2 --expert-model-parallel-size 2)
    local pad=(--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity)
    mpi 4 "${args[@]}" "${moe[@]}" "${pad[@]}" --log-comm
    grep '^ comm' err.txt | tail -1 | grep -q 'dp all-reduce: .* ep all-to-all: .* edp all-reduce: '
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}"
    FIELDS="bytes wire" same edp expert-data-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}"
    FIELDS="bytes wire" same dp data-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}"
    # the distributed optimizer: the dense gradients all-reduced over EP, then
    # everything reduce-scattered and gathered over the expert-data-parallel group
    mpi 4 "${args[@]}" "${moe[@]}" "${pad[@]}" --use-distributed-optimizer --log-comm
    grep '^ comm' err.txt | tail -1 | grep -q 'ep all-reduce: .* ep all-to-all: .* edp all-gather: .* edp reduce-scatter: '
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}" --use-distributed-optimizer
    same edp expert-data-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}" --use-distributed-optimizer
    # sequence parallelism: the router's logits gathered, the MoE gradients
    # summed over TP, no MLP gathers in a MoE layer
    local sp=(--tensor-model-parallel-size 2 --sequence-parallel)
    mpi 4 "${args[@]}" "${moe[@]}" "${pad[@]}" "${sp[@]}" --log-comm
    same tp tensor-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}" "${sp[@]}"
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}" "${sp[@]}"
    mpi 4 "${args[@]}" "${moe[@]}" "${sp[@]}" --moe-token-dispatcher-type allgather --log-comm
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" "${sp[@]}" --moe-token-dispatcher-type allgather
    # the allgather dispatcher moves the same bytes whatever the routing
    mpi 4 "${args[@]}" "${moe[@]}" --moe-token-dispatcher-type allgather --log-comm
    grep '^ comm' err.txt | tail -1 | grep -q 'ep all-gather: .* ep reduce-scatter: '
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" --moe-token-dispatcher-type allgather
}

@test "log-comm: expert tensor parallelism (ETP=TP=2): the experts' sums over TP, with and without SP, shared experts, recomputation, EP=2, are the dry run's" {
    # per MoE layer: the partial outputs summed, d probs and d h backward;
    # with SP the input and output gradient gathered, the sums scattered
    local moe=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --num-experts 4
               --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 1e-2 --tensor-model-parallel-size 2
               --expert-tensor-parallel-size 2)
    local shared=(--moe-shared-expert-intermediate-size 64 --sequence-parallel)
    local pad=(--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity
               --expert-model-parallel-size 2)
    local set
    for set in "" "${shared[*]}" "${shared[*]} --recompute-granularity selective --recompute-modules moe_act shared_experts" \
               "${shared[*]} --recompute-granularity selective --recompute-modules moe" \
               "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"; do
        # shellcheck disable=SC2086
        mpi 2 "${args[@]}" "${moe[@]}" $set --log-comm
        # shellcheck disable=SC2086
        same tp tensor-parallel 2 "${args[@]}" "${moe[@]}" $set
    done
    for set in "" "--sequence-parallel"; do
        # shellcheck disable=SC2086
        mpi 4 "${args[@]}" "${moe[@]}" "${pad[@]}" $set --log-comm
        # shellcheck disable=SC2086
        same tp tensor-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}" $set
        # shellcheck disable=SC2086
        same ep expert-parallel 4 "${args[@]}" "${moe[@]}" "${pad[@]}" $set
    done
}

# scalar GROUP: "calls bytes" of the group's host scalars in err.txt's
# last comm line
scalar() {
    grep '^ comm per iteration:' err.txt | tail -1 | sed 's/^ comm per iteration://' |
        tr '|' '\n' | awk -v g="$1" '$1 == g && $2 == "scalar:" { printf "%d %.0f\n", $3, $5 * 1e6 }'
}

@test "log-comm: the tokens per expert are summed over DP only when read (expert bias, --moe-per-layer-logging)" {
    # 2 layers x 4 experts: one all-reduce of 8 doubles, 64 bytes, per iteration
    local moe=(--num-experts 4 --moe-ffn-hidden-size 32 --expert-model-parallel-size 2)
    mpi 2 "${args[@]}" "${moe[@]}" --log-comm
    # the plan (no host scalars) is the run's
    FIELDS="bytes wire" same dp data-parallel 2 "${args[@]}" "${moe[@]}"
    local none=$(scalar dp)
    for opt in --moe-per-layer-logging \
               "--moe-router-enable-expert-bias --moe-router-score-function sigmoid"; do
        mpi 2 "${args[@]}" "${moe[@]}" --log-comm $opt
        local with=$(scalar dp)
        echo "# dp scalars (calls bytes): $none, with $opt $with" >&3
        [ "$(awk -v a="$none" -v b="$with" 'BEGIN { split(a, x, " "); split(b, y, " "); print y[1] - x[1], y[2] - x[2] }')" = "1 64" ]
    done
}

@test "log-comm: one process has no traffic; without --log-comm no comm line; --log-comm takes no value" {
    "$MC_TRAIN" "${args[@]}" --log-comm 2>err.txt
    [ "$(grep -c '^ comm per iteration: dp overlap: - |$' err.txt)" -eq 2 ]
    "$MC_TRAIN" "${args[@]}" 2>err.txt
    run -1 grep -c '^ comm' err.txt
    assert_output 0
    run -2 "$MC_TRAIN" "${args[@]}" --log-comm=1
    assert_output --partial "option '--log-comm' doesn't allow an argument"
}

@test "log-comm: context parallelism (p2p CP=2 x TP=2 SP, a2a CP=4 with GQA): cp, tp and dp-cp are the dry run's" {
    local o=(--context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel)
    mpi 4 "${args[@]}" "${o[@]}" --log-comm
    grep '^ comm' err.txt | tail -1 | grep -q 'cp send/recv: .*dp-cp all-reduce: '
    same cp context-parallel 4 "${args[@]}" "${o[@]}"
    same tp tensor-parallel 4 "${args[@]}" "${o[@]}"
    same dp-cp data-parallel 4 "${args[@]}" "${o[@]}"
    local l=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 "${args[@]:2}"
             --context-parallel-size 4 --cp-comm-type a2a)
    mpi 4 "${l[@]}" --log-comm
    same cp context-parallel 4 "${l[@]}"
    same dp-cp data-parallel 4 "${l[@]}"
}

@test "log-comm: recomputation under CP and of MoE layers: the replayed ring, all-to-all, router gathers and EP exchanges are the dry run's" {
    local full=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
    # the ring replayed in every layer (full uniform 1 reruns both)
    local o=(--context-parallel-size 2 "${full[@]}")
    mpi 2 "${args[@]}" "${o[@]}" --log-comm
    same cp context-parallel 2 "${args[@]}" "${o[@]}"
    # Ulysses' forward exchanges replayed by selective core_attn
    local l=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 "${args[@]:2}"
             --context-parallel-size 2 --cp-comm-type a2a --recompute-granularity selective
             --recompute-modules core_attn)
    mpi 2 "${l[@]}" --log-comm
    same cp context-parallel 2 "${l[@]}"
    # MoE under EP=2 x CP=2 (padded: exact all-to-all bytes): the router's
    # logits gathered over CP in each forward and replay, the dispatch replayed
    local moe=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --num-experts 4
               --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 1e-2 --expert-model-parallel-size 2
               --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity)
    mpi 4 "${args[@]}" "${moe[@]}" --context-parallel-size 2 "${full[@]}" --log-comm
    grep '^ comm' err.txt | tail -1 | grep -q 'cp all-gather: .*cp send/recv: .* ep all-to-all: '
    same cp context-parallel 4 "${args[@]}" "${moe[@]}" --context-parallel-size 2 "${full[@]}"
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" --context-parallel-size 2 "${full[@]}"
    # selective moe under TP=2 with SP: the logits' TP gather and the dispatch again
    local sel=(--tensor-model-parallel-size 2 --sequence-parallel --recompute-granularity selective
               --recompute-modules moe)
    mpi 4 "${args[@]}" "${moe[@]}" "${sel[@]}" --log-comm
    same tp tensor-parallel 4 "${args[@]}" "${moe[@]}" "${sel[@]}"
    same ep expert-parallel 4 "${args[@]}" "${moe[@]}" "${sel[@]}"
}
