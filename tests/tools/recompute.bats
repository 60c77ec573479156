#!/usr/bin/env bats
# Activation recomputation (issue 14, sections 2 and 5): mc-train
# --recompute-granularity full|selective, --recompute-method uniform|block,
# --recompute-num-layers, --recompute-modules. Recomputation runs the same
# kernels on the same inputs in the same order, so the reference is the run
# without it, and the comparison is exact: the --log-json files (losses and
# grad norms printed to 17 digits) byte for byte, and every tensor of the
# final checkpoints (parameters and Adam's moments) bit for bit. Memory is
# asserted on mc's own accounting, the "activations (stage S)" line (kept
# bytes per micro-batch, recomputation workspace, scratch), which must also
# equal what --dry-run plans. Under context parallelism (p2p and a2a)
# the recomputed attention replays the ring or the all-to-all; with
# mixtures of experts the recomputed block replays the routing (top-k,
# capacity drops, expert bias), EP's exchanges and nothing of the
# balancing losses (counted once): 20 iterations there, byte for byte too.
# Bad settings: one line, exit 2, nothing done.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"

# 5 layers (groups of 2 leave one of 1; of 3, one of 2), 4 iterations
common=(--num-layers 5 --vocab-size 512 --seq-length 64 --micro-batch-size 2 --lr 1e-3
        --train-iters 4 --lr-warmup-iters 1 --mock-data --eval-iters 0 --threads 2)
gpt=(--model tiny-gpt "${common[@]}")
llama=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 "${common[@]}"
       --reset-position-ids --reset-attention-mask --eod-mask-loss --bf16)
settings=(
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2"
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 5"
    "--recompute-granularity full --recompute-method block --recompute-num-layers 3"
    "--recompute-granularity selective"
    "--recompute-activations --recompute-modules layernorm"
    "--recompute-granularity selective --recompute-modules mlp"
    "--recompute-granularity selective --recompute-modules core_attn layernorm mlp"
    "--recompute-granularity selective --recompute-modules layernorm mlp_act attn_proj"
    "--recompute-granularity selective --recompute-modules core_attn attn_proj mlp"
)

setup() { cd "$BATS_TEST_TMPDIR"; }

# field LOG NAME: from the "activations (stage 0)" line of LOG, bytes
# (total), kept, workspace or scratch
field() {
    awk -v f="$2" '/^activations \(stage 0\)/ {
        if (f == "bytes") print $4; if (f == "kept") print $9;
        if (f == "workspace") print $12; if (f == "scratch") print $16; exit }' "$1"
}

# bits_equal MODEL-ARRAY-NAME: each setting against no recomputation
bits_equal() {
    local -n m=$1
    local h5=1
    "$MC_PYTHON" -c 'import h5py' 2>/dev/null || h5=0
    "$MC_TRAIN" "${m[@]}" --log-json ref.jsonl --save ref >/dev/null 2>&1
    [ "$(wc -l <ref.jsonl)" -eq 4 ]
    # (not $i: bats's run sets it)
    local n=0
    for s in "${settings[@]}"; do
        # shellcheck disable=SC2086
        run -0 "$MC_TRAIN" "${m[@]}" $s --log-json "r$n.jsonl" --save "r$n"
        cmp ref.jsonl "r$n.jsonl"
        if [ $h5 = 1 ]; then same_bits ref/iter_0000004/model.h5 "r$n/iter_0000004/model.h5" >&3; fi
        n=$((n + 1))
    done
    [ $h5 = 1 ] || echo "# weights not compared: no h5py in $MC_PYTHON" >&3
}

@test "recompute: GPT, every setting gives the losses, grad norms and final weights of none, bit for bit" {
    bits_equal gpt
}

@test "recompute: Llama (GQA, RoPE, SwiGLU, RMSNorm) with packed documents and --bf16, bit for bit" {
    bits_equal llama
}

@test "recompute: the kept activation bytes fall as each setting says" {
    run -0 "$MC_TRAIN" "${gpt[@]}" --train-iters 2
    echo "$output" >none.txt
    for s in "${settings[@]}"; do
        # shellcheck disable=SC2086
        "$MC_TRAIN" "${gpt[@]}" --train-iters 2 $s 2>"$(echo $s | tr -d ' -').txt" >/dev/null
    done
    f=recomputegranularityfullrecomputemethod
    none=$(field none.txt kept)
    u1=$(field ${f}uniformrecomputenumlayers1.txt kept)
    u2=$(field ${f}uniformrecomputenumlayers2.txt kept)
    u5=$(field ${f}uniformrecomputenumlayers5.txt kept)
    b3=$(field ${f}blockrecomputenumlayers3.txt kept)
    sel=$(field recomputegranularityselective.txt kept)
    # block 3 drops exactly 3 of the 5 layers' shares (all but the input);
    # uniform 2 keeps 3 inputs of 5 and uniform 5 one
    drop=$(( (none - b3) / 3 ))
    [ $(( none - b3 )) -eq $(( 3 * drop )) ] && [ "$drop" -gt 0 ]
    input=$(( (u2 - u5) / 2 ))
    [ "$input" -gt 0 ] && [ $(( u2 - u5 )) -eq $(( 2 * input )) ]
    [ $(( none - u2 )) -eq $(( 5 * drop + 2 * input )) ]
    # uniform 1 (every layer on its own: the compact workspace, model.c's
    # layout_acts) keeps each layer's input only, and the head's tensors
    # (the last layer's output, the final norm's output and statistics,
    # d(lnf): 3 [N, C] + 2 [N] floats, N = 2 x 64, C = 64) move into the
    # workspace
    [ $(( none - u1 )) -eq $(( 5 * drop + 3 * 128 * 64 * 4 + 2 * 128 * 4 )) ]
    # the workspace holds one layer less its input for block; uniform 1's
    # less both norms' outputs (2 [N, C]: remade in the backward); the
    # group's layers for uniform 2 and 5
    ws1=$(field ${f}uniformrecomputenumlayers1.txt workspace)
    [ "$ws1" -eq $(( drop - 2 * 128 * 64 * 4 )) ]
    [ "$(field ${f}blockrecomputenumlayers3.txt workspace)" -eq "$drop" ]
    [ "$(field ${f}uniformrecomputenumlayers2.txt workspace)" -eq $(( 2 * drop + input )) ]
    [ "$(field ${f}uniformrecomputenumlayers5.txt workspace)" -eq $(( 5 * drop + 4 * input )) ]
    # selective core_attn drops the attention output and log-sum-exp: per
    # layer [N, C] + [N, heads] floats, N = 2 x 64, C = 64, 4 heads (64-byte padded)
    [ $(( none - sel )) -eq $(( 5 * (2 * 64 * 64 * 4 + 2 * 64 * 4 * 4) )) ]
    # layernorm mlp_act attn_proj (mc's modules) drops both norms' outputs
    # and statistics, the residual after attention and the activation's
    # output: per layer 3 [N, C] + 4 [N] + [N, 4C] floats
    sa=$(field recomputegranularityselectiverecomputemoduleslayernormmlp_actattn_proj.txt kept)
    [ $(( none - sa )) -eq $(( 5 * (3 * 128 * 64 * 4 + 4 * 128 * 4 + 128 * 256 * 4) )) ]
    # every setting has less in all; the scratch is the same but uniform
    # 1's, which has no qkv [N, 3C] nor row-parallel [N, C] scratch (in the
    # workspace), and the head's input gradient [N, C] and logits chunk
    # [N, 512] in the workspace
    for t in ${f}*.txt recomputegranularityselective*.txt; do
        [ "$(field "$t" bytes)" -lt "$(field none.txt bytes)" ] || [ "$t" = "${f}uniformrecomputenumlayers5.txt" ]
        [ "$t" = "${f}uniformrecomputenumlayers1.txt" ] ||
            [ "$(field "$t" scratch)" -eq "$(field none.txt scratch)" ]
    done
    [ $(( $(field none.txt scratch) - $(field ${f}uniformrecomputenumlayers1.txt scratch) )) -eq \
      $(( (128 * 192 + 128 * 64 + 128 * 64 + 128 * 512) * 4 )) ]
}

@test "recompute: --dry-run plans the activation bytes each run reports" {
    for s in "" "${settings[@]}"; do
        # shellcheck disable=SC2086
        run -0 "$MC_TRAIN" "${gpt[@]}" --train-iters 2 $s
        echo "$output" >run.txt
        # shellcheck disable=SC2086
        run -0 "$MC_TRAIN" "${gpt[@]}" --train-iters 2 $s --dry-run
        line=$(grep '^  activations: ' <<<"$output")
        want="= 1 micro-batch in flight x $(field run.txt kept) kept + $(field run.txt workspace) recomputation workspace + $(field run.txt scratch) scratch + 0 pipeline buffer"
        [[ "$line" == "  activations: $(field run.txt bytes) bytes ("*") $want; recomputation "* ]] ||
            { echo "run: $(grep '^activations' run.txt)"; echo "plan: $line"; false; }
    done
    assert_output --partial "activations by recomputation: none "
}

@test "recompute: TP=2 with sequence parallelism x PP=2: bit for bit, and as planned per stage" {
    mpi_setup
    m=(--model tiny-gpt --num-layers 4 --seq-length 16 --micro-batch-size 1 --global-batch-size 4
       --threads 1 --lr 1e-3 --eval-iters 0 --mock-data --vocab-size 64
       --make-vocab-size-divisible-by 16 --train-iters 5
       --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2)
    run -0 mpi 4 "${m[@]}" --log-json ref.jsonl
    for s in "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2" \
             "--recompute-granularity full --recompute-method block --recompute-num-layers 1" \
             "--recompute-granularity selective --recompute-modules core_attn layernorm mlp"; do
        # shellcheck disable=SC2086
        rm -f r.jsonl
        run -0 mpi 4 "${m[@]}" $s --log-json r.jsonl
        cmp ref.jsonl r.jsonl
        echo "$output" >run.txt
        # shellcheck disable=SC2086
        "$MC_TRAIN" "${m[@]}" $s --dry-run --world-size 4 >plan.txt
        for st in 0 1; do
            k=$(awk -v s="$st):" '$1 == "activations" && $3 == s { print $9 }' run.txt)
            w=$(awk -v s="$st):" '$1 == "activations" && $3 == s { print $12 }' run.txt)
            [ -n "$k" ] && [ -n "$w" ]
            awk -v s="stage $st " 'index($0, s) == 1 { on = 1; next } /^stage / { on = 0 }
                on && /^  activations: / { print }' plan.txt | grep -q "x $k kept + $w recomputation workspace"
        done
    done
}

@test "recompute: interleaved PP=2 x DP=2 with the distributed optimizer, Llama with packed documents: bit for bit" {
    mpi_setup
    m=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --num-layers 8
       --seq-length 16 --micro-batch-size 1 --global-batch-size 8 --threads 1 --lr 1e-3
       --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16
       --train-iters 5 --reset-position-ids --reset-attention-mask
       --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2
       --use-distributed-optimizer)
    run -0 mpi 4 "${m[@]}" --log-json ref.jsonl
    for s in "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2" \
             "--recompute-granularity full --recompute-method block --recompute-num-layers 1" \
             "--recompute-granularity selective --recompute-modules core_attn mlp"; do
        # shellcheck disable=SC2086
        rm -f r.jsonl
        run -0 mpi 4 "${m[@]}" $s --log-json r.jsonl
        cmp ref.jsonl r.jsonl
    done
}

@test "recompute: bad settings are one line and exit status 2, before any work" {
    bad() {
        local want=$1
        shift
        run -2 "$MC_TRAIN" "${gpt[@]}" --save out "$@"
        assert_equal "${#lines[@]}" 1
        assert_output --partial "$want"
        [[ "$output" == "mc-train: error: "* ]]
        [ ! -e out ]
    }
    full=(--recompute-granularity full --recompute-method uniform)
    bad "--recompute-num-layers 6 is more than the 5 layers of pipeline stage 0" \
        "${full[@]}" --recompute-num-layers 6
    # per stage: 5 layers on 2 stages do not split, 6 do (3 each)
    bad "--recompute-num-layers 4 is more than the 3 layers of pipeline stage 0" \
        "${full[@]}" --recompute-num-layers 4 --num-layers 6 --pipeline-model-parallel-size 2
    bad "--recompute-num-layers 3 is more than the 2 layers of model chunk 0 of pipeline stage 0" \
        --recompute-granularity full --recompute-method block --recompute-num-layers 3 \
        --num-layers 8 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2
    bad "--recompute-modules: unknown module 'attention' (choose from core_attn, layernorm, mlp, mlp_act, attn_proj, moe, moe_act, shared_experts)" \
        --recompute-granularity selective --recompute-modules attention
    bad "--recompute-modules gdp_qkv: mc's layers have no gated delta product" \
        --recompute-granularity selective --recompute-modules core_attn gdp_qkv
    bad "--recompute-modules mla_up_proj: mc's attention has no multi-latent attention" \
        --recompute-granularity selective --recompute-modules mla_up_proj
    bad "--recompute-method and --recompute-num-layers need --recompute-granularity full" \
        --recompute-method uniform --recompute-num-layers 1
    bad "--recompute-method and --recompute-num-layers need --recompute-granularity full" \
        --recompute-granularity selective --recompute-method block --recompute-num-layers 1
    bad "--recompute-granularity full needs --recompute-method uniform or block" \
        --recompute-granularity full --recompute-num-layers 1
    bad "--recompute-granularity full needs --recompute-num-layers N >= 1" \
        --recompute-granularity full --recompute-method block
    bad "--recompute-modules needs --recompute-granularity selective" \
        "${full[@]}" --recompute-num-layers 1 --recompute-modules mlp
    bad "--recompute-granularity: expected full or selective, got 'partial'" \
        --recompute-granularity partial
    bad "--recompute-num-layers" "${full[@]}" --recompute-num-layers 0
    # beside mixture of experts, per chunk of each stage as for dense layers
    bad "--recompute-num-layers 4 is more than the 3 layers of pipeline stage 0" \
        "${full[@]}" --recompute-num-layers 4 --num-layers 6 --pipeline-model-parallel-size 2 \
        --num-experts 4
    # --dry-run checks the same, before planning
    bad "--recompute-num-layers 6 is more than the 5 layers of pipeline stage 0" \
        "${full[@]}" --recompute-num-layers 6 --dry-run
}

# 20 iterations of 4 sequences in micro-batches of 1 (2 with DP=2)
long=(--seq-length 16 --micro-batch-size 1 --global-batch-size 4 --threads 1 --lr 1e-3
      --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16
      --train-iters 20 --lr-warmup-iters 2)

# same_runs N MODEL-ARRAY-NAME SETTING...: each setting against none on N
# ranks (N = 1: one process), --log-json byte for byte (losses, balancing
# losses, z-losses, grad norms: 20 lines), final checkpoints bit for bit.
same_runs() {
    local n=$1
    local -n mm=$2
    shift 2
    local cmd=("$MC_TRAIN")
    [ "$n" = 1 ] || cmd=(mpi "$n")
    local h5=1
    "$MC_PYTHON" -c 'import h5py' 2>/dev/null || h5=0
    rm -rf ref ref.jsonl
    run -0 "${cmd[@]}" "${mm[@]}" --log-json ref.jsonl --save ref
    [ "$(wc -l <ref.jsonl)" -eq 20 ]
    local k=0
    for s in "$@"; do
        rm -rf "r$k" "r$k.jsonl"
        # shellcheck disable=SC2086
        run -0 "${cmd[@]}" "${mm[@]}" $s --log-json "r$k.jsonl" --save "r$k"
        cmp ref.jsonl "r$k.jsonl" || { echo "differs: $s"; false; }
        if [ $h5 = 1 ]; then
            same_bits ref/iter_0000020/model.h5 "r$k/iter_0000020/model.h5" >&3
        fi
        k=$((k + 1))
    done
    [ $h5 = 1 ] || echo "# weights not compared: no h5py in $MC_PYTHON" >&3
}

@test "recompute: CP=2 ring (p2p) and all-to-all (a2a), Llama with packed documents, and CP=2 x interleaved PP=2: 20 iterations bit for bit" {
    mpi_setup
    local cpl=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --num-layers 4
               "${long[@]}" --reset-position-ids --reset-attention-mask --eod-mask-loss
               --context-parallel-size 2)
    local cpa=("${cpl[@]}" --cp-comm-type a2a)
    local s3=("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2"
              "--recompute-granularity full --recompute-method block --recompute-num-layers 1"
              "--recompute-granularity selective --recompute-modules core_attn layernorm mlp")
    same_runs 2 cpl "${s3[@]}"
    same_runs 2 cpa "${s3[@]}"
    # the interleaved schedule: several micro-batches in flight, each
    # recomputation replays its own ring between other chunks' work
    local cppp=("${cpl[@]}" --global-batch-size 8 --pipeline-model-parallel-size 2
                --num-layers-per-virtual-pipeline-stage 1)
    same_runs 4 cppp "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" \
        "--recompute-granularity selective --recompute-modules core_attn"
}

# A MoE Llama of 3 layers (MoE, dense, MoE: --moe-layer-freq 2) with a
# shared expert, top-2 of 4 experts, a capacity factor that drops tokens,
# aux and z losses: every recomputation setting and module.
moe_rc=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --num-layers 3
        "${long[@]}" --num-experts 4 --moe-ffn-hidden-size 32 --moe-layer-freq 2
        --moe-shared-expert-intermediate-size 16 --moe-aux-loss-coeff 1e-2
        --moe-z-loss-coeff 1e-3 --moe-expert-capacity-factor 1.0)
moe_settings=(
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2"
    "--recompute-granularity full --recompute-method block --recompute-num-layers 2"
    "--recompute-granularity selective --recompute-modules moe"
    "--recompute-granularity selective --recompute-modules moe_act shared_experts layernorm"
    "--recompute-granularity selective --recompute-modules core_attn mlp"
    # mc's modules beside the experts': attn_proj on every layer, mlp_act on the dense one
    "--recompute-granularity selective --recompute-modules layernorm attn_proj mlp_act moe_act shared_experts"
)

@test "recompute: MoE in one process (capacity drops, shared expert, aux and z losses), every setting and module, and sigmoid routing with the expert bias: 20 iterations bit for bit" {
    same_runs 1 moe_rc "${moe_settings[@]}"
    # the balancing losses are on every line, counted once
    grep -q '"load_balancing_loss": ' ref.jsonl && grep -q '"z_loss": ' ref.jsonl
    # the expert bias at that iteration: the replayed routing chooses alike
    local bias=("${moe_rc[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
                --moe-router-bias-update-rate 1e-2 --moe-token-drop-policy position)
    same_runs 1 bias "--recompute-granularity full --recompute-method uniform --recompute-num-layers 3" \
        "--recompute-granularity selective --recompute-modules moe"
}

@test "recompute: MoE at EP=2 (alltoall with a capacity factor, allgather padded) and EP=2 x CP=2: the exchanges replayed, 20 iterations bit for bit" {
    mpi_setup
    local ep=("${moe_rc[@]}" --expert-model-parallel-size 2)
    local epag=("${moe_rc[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
                --moe-pad-expert-input-to-capacity)
    local epcp=("${moe_rc[@]}" --expert-model-parallel-size 2 --context-parallel-size 2)
    same_runs 2 ep "${moe_settings[@]}"
    same_runs 2 epag "${moe_settings[0]}" "${moe_settings[3]}"
    same_runs 4 epcp "${moe_settings[1]}" "${moe_settings[3]}"
}

@test "recompute: MoE, --dry-run plans the kept, workspace and scratch bytes each setting allocates" {
    local m=("${moe_rc[@]}" --train-iters 1 --lr-warmup-iters 0)
    local s
    for s in "" "${moe_settings[@]}"; do
        # shellcheck disable=SC2086
        run -0 "$MC_TRAIN" "${m[@]}" $s
        local got
        got=$(grep -o '^activations (stage 0): .* scratch' <<<"$output" | sed 's/.*= 1 x //')
        # shellcheck disable=SC2086
        run -0 "$MC_TRAIN" "${m[@]}" $s --dry-run
        [ -n "$got" ] && [[ "$output" == *"in flight x $got + 0 pipeline buffer"* ]] ||
            { echo "run: $got"; grep '^  activations: ' <<<"$output"; false; }
    done
    # the whole block recomputed keeps less than its activation alone
    run -0 "$MC_TRAIN" "${m[@]}" --recompute-granularity selective --recompute-modules moe
    local moe
    moe=$(awk '/^activations \(stage 0\)/ { print $9; exit }' <<<"$output")
    run -0 "$MC_TRAIN" "${m[@]}" --recompute-granularity selective --recompute-modules moe_act
    local act
    act=$(awk '/^activations \(stage 0\)/ { print $9; exit }' <<<"$output")
    run -0 "$MC_TRAIN" "${m[@]}"
    local none
    none=$(awk '/^activations \(stage 0\)/ { print $9; exit }' <<<"$output")
    [ "$moe" -lt "$act" ] && [ "$act" -lt "$none" ]
}
