#!/usr/bin/env bash
# tests/cuda/run.sh - the CUDA backend's verification, in one call on a GPU
# machine (issue 6, section 4). Builds mc (configure finds nvcc), then:
#   1. kernels: tests/cuda/check_kern, every CUDA kernel against the CPU
#      backend on fresh random inputs of several shapes (outputs NaN-poisoned;
#      relative error bounds fp32 1e-5, tf32 1e-3, bf16/fp16 1e-2);
#   2. training: 50 iterations of a tiny GPT, a tiny Llama and a tiny
#      mixture of experts (Llama with 4 experts, top-2) and the GPT with
#      --fp8-format hybrid, --bf16, on the
#      GPU and on the CPU from the same initialization (counter-based, so the
#      same weights) and the same mock data; every iteration's loss must
#      agree within bf16 tolerance (relative 2e-2), and two GPU runs must give
#      the same bits (determinism);
#   3. checkpoints: GPU trains 10 iterations and saves; the CPU loads that and
#      trains to 15 and saves; the GPU loads that and trains to 20. Losses of
#      iterations 11..20 must match an uninterrupted GPU run (fp32, relative
#      1e-4: CPU and GPU differ only by rounding);
#   3b. mc-eval: perplexity (fp32, relative 1e-5) and greedy generation (the
#      same tokens) on the GPU against the CPU, the KV cache on the device;
#   3c. two ranks on the one GPU through the staged path (MC_DEVICE_COMM=mpi):
#      TP=2, TP=2 with SP, DP=2 and EP=2 equal one GPU process (fp32, 1e-4);
#      a model too big for the GPU refused with the bytes, exit 1;
#   4. compute-sanitizer --tool memcheck over 3 GPU training iterations of
#      each model (and racecheck over one).
# Prints a short table last; exit 0 only when every step passed.
#
# Usage: tests/cuda/run.sh [BUILD-DIR]
#   BUILD-DIR: an existing build to use (default: build one in $TMPDIR).
# Environment: MC_CONFIGURE_FLAGS (extra configure flags), JOBS (make -j,
# default the cores present), KEEP=1 to keep the work directory,
# MC_GPU_DEVICE=cpu to run the script's own logic without a GPU (every "GPU"
# run then uses the CPU backend: a check of the script, not of CUDA; the
# kernel check and the sanitizer are then skipped), MC_GPUKIT=0 to ignore
# .gpukit, SAN_TIMEOUT (seconds one compute-sanitizer run may take, 200; rc
# 124 when it ran out), SAN_MODELS (the models memcheck trains, "gpt llama
# moe"; fewer when the call's 10 minutes are short).
#
# On the bare GPU machines (no Debian development packages, no autotools, no
# network) the libraries come in .gpukit, made here by scripts/gpu-kit.sh
# and carried along; scripts/gpu-env.sh, sourced below when .gpukit exists,
# points the build at them. The device call (tests/cuda/README.md), after
# `scripts/gpu-kit.sh` here (or `scripts/gpu-kit.sh --autotools-only` when
# only configure.ac or Makefile.am changed since the kit was made):
#   run(command="set -o pipefail; tests/cuda/run.sh 2>&1 | tee $OUT/cuda.log",
#       carry=[".gpukit"], timeout_s=600)
# The CUDA objects carry sm_80 and sm_90 machine code and compute_90 PTX
# (Makefile.am's NVCC_GENCODE; nothing in lib/kern/cuda needs sm_90a); the
# summary's "sm_90 machine code" row reads it back with cuobjdump.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/mc-cuda.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
jobs=${JOBS:-$(nproc)}
declare -a rows
status=0
row() { # NAME RESULT DETAIL (RESULT: ok, skip, or a failure)
    rows+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")")
    [ "$2" = ok ] || [ "$2" = skip ] || status=1
}
finish() {
    echo
    echo "== tests/cuda/run.sh summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
    printf '%s\n' "${rows[@]}"
    exit $status
}

gpu=${MC_GPU_DEVICE:-cuda}
if [ "$gpu" = cuda ]; then
    nvidia-smi -L 2>/dev/null || { echo "run.sh: no GPU (nvidia-smi lists none)"; row gpu FAIL "none found"; finish; }
fi

# ---------------------------------------------------------------- the kit
if [ -d "$src/.gpukit" ] && [ "${MC_GPUKIT:-1}" != 0 ]; then
    # shellcheck source=../../scripts/gpu-env.sh
    . "$src/scripts/gpu-env.sh" || { row "libraries (.gpukit)" FAIL "scripts/gpu-env.sh (above)"; finish; }
    row "libraries (.gpukit)" ok "$MC_GPUKIT_ROOT"
fi

# ---------------------------------------------------------------- build
if [ $# -ge 1 ]; then
    build=$(cd "$1" && pwd)
else
    build=$work/build
    mkdir -p "$build"
    t0=$(date +%s)
    if [ ! -x "$src/configure" ]; then (cd "$src" && ./autogen.sh) >"$work/autogen.log" 2>&1 ||
        { tail -20 "$work/autogen.log"; row build FAIL "autogen.sh"; finish; }; fi
    (cd "$build" && "$src/configure" -q --with-cuda ${MC_CONFIGURE_FLAGS:-}) >"$work/configure.log" 2>&1 ||
        { tail -20 "$work/configure.log"; row build FAIL "configure (see above: a missing dependency?)"; finish; }
    make -C "$build" -j"$jobs" all >"$work/make.log" 2>&1 &&
        make -C "$build" -j"$jobs" tests/cuda/check_kern >>"$work/make.log" 2>&1 ||
        { tail -30 "$work/make.log"; row build FAIL make; finish; }
    row build ok "$(( $(date +%s) - t0 )) s"
fi
grep -q '^#define HAVE_CUDA 1' "$build/config.h" || row "CUDA backend built" FAIL "$build/config.h has no HAVE_CUDA"
# the machine code the H100/H200 runs: sm_90 (cuobjdump comes with the toolkit)
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
libmc=$(ls "$build"/lib/.libs/libmc.so.[0-9]* 2>/dev/null | head -1)
if [ -n "$cuobjdump" ] && [ -n "$libmc" ]; then
    elfs=$("$cuobjdump" --list-elf "$libmc" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort | uniq -c | awk '{ printf "%s%s x%s", s, $2, $1; s = ", " }')
    case $elfs in *sm_90*) row "sm_90 machine code" ok "$elfs" ;; *) row "sm_90 machine code" FAIL "libmc: ${elfs:-none}" ;; esac
else
    row "sm_90 machine code" skip "$([ -z "$cuobjdump" ] && echo "no cuobjdump" || echo "no shared libmc")"
fi
train=$build/tools/mc-train/mc-train
[ -x "$train" ] || { row build FAIL "$train missing"; finish; }

# ---------------------------------------------------------------- 1. kernels
echo "== 1. kernels"
"$build/tests/cuda/check_kern" | tee "$work/kern.log"
rc=${PIPESTATUS[0]}
nk=$(grep -c '^ok ' "$work/kern.log"); nf=$(grep -c '^not ok ' "$work/kern.log")
if [ "$gpu" != cuda ] && [ $rc = 77 ]; then
    row "kernels vs CPU (check_kern)" skip "no GPU (MC_GPU_DEVICE=$gpu)"
else
    row "kernels vs CPU (check_kern)" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$nk passed, $nf failed"
fi
grep '^# ' "$work/kern.log" | sed -n '/worst err/,$p' > "$work/kern_table"

# ---------------------------------------------------------------- helpers
gpt=(--model tiny-gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
     --max-position-embeddings 64)
llama=(--model tiny-llama --num-layers 2 --hidden-size 64 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 64)
# a mixture of experts (moe.cu): 4 SwiGLU experts, top-2, both balancing
# losses, capacity 1.0 (tokens dropped by probability: 1.5 drops none here)
moe=("${llama[@]}" --num-experts 4 --moe-ffn-hidden-size 96 --moe-router-topk 2
     --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-expert-capacity-factor 1.0)
# FP8 (fp8.cu's quantization, fp32 GEMMs on the quantized values)
fp8=("${gpt[@]}" --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max)
common=(--mock-data --vocab-size 512 --micro-batch-size 4 --global-batch-size 8 --lr 3e-3
        --lr-warmup-iters 5 --log-interval 1 --eval-iters 0 --seed 7 --threads "$(nproc)")
losses() { grep -o '"lm loss": [^,}]*' "$1" | cut -d' ' -f3; }
# max relative difference of two loss lists (and the count compared)
maxrel() {
    paste "$1" "$2" | awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2);
        if (r > m) m = r; n++ } END { if (n == 0) { print "none"; exit 1 } printf "%.2e %d\n", m, n }'
}
run_train() { # LOG-JSON DEVICE ARGS...
    local lj=$1 dev=$2
    shift 2
    "$train" "${common[@]}" "$@" --device "$dev" --log-json "$lj" >"$lj.out" 2>"$lj.err"
}

# ---------------------------------------------------------------- 2. training
echo "== 2. training: 50 iterations, GPU vs CPU, bf16"
for m in gpt llama moe fp8; do
    declare -n args=$m
    ok=1
    run_train "$work/$m-gpu.json" "$gpu" "${args[@]}" --bf16 --train-iters 50 || ok=0
    run_train "$work/$m-gpu2.json" "$gpu" "${args[@]}" --bf16 --train-iters 50 || ok=0
    run_train "$work/$m-cpu.json" cpu "${args[@]}" --bf16 --train-iters 50 || ok=0
    if [ $ok = 0 ]; then
        tail -3 "$work/$m-"*.json.err
        row "train $m 50 it (gpu vs cpu, bf16)" FAIL "a run failed"
        continue
    fi
    losses "$work/$m-gpu.json" > "$work/$m-gpu.l"
    losses "$work/$m-gpu2.json" > "$work/$m-gpu2.l"
    losses "$work/$m-cpu.json" > "$work/$m-cpu.l"
    read -r r n < <(maxrel "$work/$m-gpu.l" "$work/$m-cpu.l")
    first=$(head -1 "$work/$m-gpu.l"); last_g=$(tail -1 "$work/$m-gpu.l"); last_c=$(tail -1 "$work/$m-cpu.l")
    good=$(awk -v r="$r" -v n="$n" 'BEGIN { print (n == 50 && r <= 2e-2) ? "ok" : "FAIL" }')
    row "train $m 50 it (gpu vs cpu, bf16)" "$good" "max rel $r over $n its; loss $first -> gpu $last_g cpu $last_c"
    if cmp -s "$work/$m-gpu.l" "$work/$m-gpu2.l"; then
        row "train $m: gpu run twice" ok "same losses, bit for bit"
    else
        row "train $m: gpu run twice" FAIL "losses differ: $(maxrel "$work/$m-gpu.l" "$work/$m-gpu2.l")"
    fi
    unset -n args
done

# ---------------------------------------------------------------- 3. checkpoints
echo "== 3. checkpoint GPU -> CPU -> GPU (fp32)"
for m in gpt llama moe; do
    declare -n args=$m
    d=$work/ck-$m
    ok=1
    run_train "$d-ref.json" "$gpu" "${args[@]}" --lr-decay-iters 20 --train-iters 20 || ok=0
    run_train "$d-a.json" "$gpu" "${args[@]}" --lr-decay-iters 20 --train-iters 10 --save "$d" --save-interval 10 || ok=0
    run_train "$d-b.json" cpu "${args[@]}" --lr-decay-iters 20 --train-iters 15 --load "$d" --save "$d" --save-interval 15 || ok=0
    run_train "$d-c.json" "$gpu" "${args[@]}" --lr-decay-iters 20 --train-iters 20 --load "$d" --save "$d" --save-interval 20 || ok=0
    if [ $ok = 0 ]; then
        tail -3 "$d"-*.json.err
        row "ckpt $m gpu->cpu->gpu" FAIL "a run failed"
    else
        losses "$d-ref.json" | tail -n 10 > "$d-ref.l"
        cat "$d-b.json" "$d-c.json" | grep -o '"lm loss": [^,}]*' | cut -d' ' -f3 > "$d-bc.l"
        read -r r n < <(maxrel "$d-bc.l" "$d-ref.l")
        good=$(awk -v r="$r" -v n="$n" 'BEGIN { print (n == 10 && r <= 1e-4) ? "ok" : "FAIL" }')
        row "ckpt $m gpu->cpu->gpu" "$good" "its 11-20 vs one gpu run: max rel $r over $n"
    fi
    unset -n args
done

# ---------------------------------------------------------------- 3b. mc-eval
echo "== 3b. mc-eval on the GPU vs the CPU (fp32)"
ev=$build/tools/mc-eval/mc-eval
evck=$work/ck-eval
"$train" "@$src/tests/data/eval/gpt.args" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$src/tests/data/tokenizer/hf_bytelevel.json" --device cpu --save "$evck" \
    >"$work/ev-train.log" 2>&1 || { tail -3 "$work/ev-train.log"; row "mc-eval ckpt" FAIL "mc-train failed"; }
evargs=(--quiet --ctx-size 64 --text-file "$src/tests/data/eval/text.txt" --prompt "The river"
        --prompt "In Python" --max-new-tokens 24)
# eval_rows LABEL CKPT: perplexity (relative 1e-5) and greedy generation (the
# same tokens) of CKPT on the GPU against the CPU, two rows
eval_rows() {
    local label=$1 ck=$2 ok=1 pc pg tc tg
    "$ev" "$ck" "${evargs[@]}" --device cpu >"$ck-cpu.json" 2>"$ck-cpu.err" || ok=0
    "$ev" "$ck" "${evargs[@]}" --device "$gpu" >"$ck-gpu.json" 2>"$ck-gpu.err" || ok=0
    if [ $ok = 0 ]; then
        tail -3 "$ck"-*.err
        row "$label ppl+generate (gpu vs cpu)" FAIL "a run failed"
        return
    fi
    read -r pc pg tc tg < <(python3 - "$ck-cpu.json" "$ck-gpu.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
tok = lambda d: [g["tokens"] for g in d["generations"]]
same = sum(x == y for ta, tb in zip(tok(a), tok(b)) for x, y in zip(ta, tb))
print(a["perplexity"]["nll"], b["perplexity"]["nll"], sum(len(t) for t in tok(a)), same)
PY
)
    row "$label perplexity (gpu vs cpu)" \
        "$(awk -v a="$pc" -v b="$pg" 'BEGIN { d = a - b; if (d < 0) d = -d; print (d <= 1e-5 * (a < 0 ? -a : a)) ? "ok" : "FAIL" }')" \
        "nll cpu $pc gpu $pg (relative 1e-5)"
    row "$label greedy generation" "$([ "$tc" = "$tg" ] && echo ok || echo FAIL)" \
        "$tg of $tc tokens the same (2 prompts, KV cache on the device)"
}
eval_rows mc-eval "$evck"

# The same for a mixture of experts (moe_infer.c on the GPU): the run.sh
# MoE model with the test tokenizer, trained 10 iterations on the CPU.
evmoe=$work/ck-evmoe
if "$train" "${moe[@]}" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$src/tests/data/tokenizer/hf_bytelevel.json" --mock-data --micro-batch-size 4 \
    --global-batch-size 8 --lr 3e-3 --log-interval 5 --eval-iters 0 --seed 7 --train-iters 10 \
    --device cpu --save "$evmoe" >"$work/evmoe-train.log" 2>&1; then
    eval_rows "mc-eval moe" "$evmoe"
else
    tail -3 "$work/evmoe-train.log"
    row "mc-eval moe" FAIL "mc-train failed"
fi

# ---------------------------------------------------------------- 3c. two ranks, one GPU
# Issue 11, section 5: one GPU cannot hold two NCCL ranks, so the grid's GPU
# path runs staged (MC_DEVICE_COMM=mpi: device memory through host memory
# and MPI). TP=2, TP=2 with SP, DP=2 and EP=2 against one GPU process, fp32,
# 20 iterations: relative 1e-4 (the runs differ by reduction order only).
echo "== 3c. two ranks on the one GPU (MC_DEVICE_COMM=mpi), fp32"
if ! command -v mpirun >/dev/null 2>&1; then
    row "2 ranks, 1 gpu" FAIL "no mpirun"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    for spec in "tp2:gpt:--tensor-model-parallel-size 2" \
                "tp2-sp:llama:--tensor-model-parallel-size 2 --sequence-parallel" \
                "dp2:gpt:--use-distributed-optimizer" \
                "ep2:moe:--expert-model-parallel-size 2"; do
        IFS=: read -r name m extra <<<"$spec"
        declare -n args=$m
        one=$work/mp-$name-1.json two=$work/mp-$name-2.json
        ok=1
        run_train "$one" "$gpu" "${args[@]}" --train-iters 20 || ok=0
        # shellcheck disable=SC2086
        MC_DEVICE_COMM=mpi timeout 300 mpirun -np 2 --oversubscribe -x MC_DEVICE_COMM -x LD_LIBRARY_PATH \
            "$train" "${common[@]}" --threads 4 "${args[@]}" $extra --train-iters 20 --device "$gpu" \
            --log-json "$two" >"$two.out" 2>"$two.err" || ok=0
        if [ $ok = 0 ]; then
            tail -5 "$one.err" "$two.err"
            row "2 ranks, 1 gpu: $name ($m)" FAIL "a run failed"
        else
            losses "$one" > "$one.l"; losses "$two" > "$two.l"
            read -r r n < <(maxrel "$two.l" "$one.l")
            good=$(awk -v r="$r" -v n="$n" 'BEGIN { print (n == 20 && r <= 1e-4) ? "ok" : "FAIL" }')
            row "2 ranks, 1 gpu: $name ($m)" "$good" "vs one process: max rel $r over $n its"
        fi
        unset -n args
    done
fi

# NCCL itself over one-rank communicators (tests/cuda/nccl1.c): every
# operation nccl.c issues, on device memory, its result the input.
if [ "$gpu" = cuda ] && command -v mpicc >/dev/null 2>&1; then
    # linked through libtool against libmc.la, which brings libmc's own
    # libraries (cuBLAS, NCCL, the kit's) as the build's programs get them
    if mpicc -std=c11 -O1 -I"$src/lib" -I"$build" -DMC_CUDA_BACKEND -c "$src/tests/cuda/nccl1.c" \
        -o "$work/nccl1.o" >"$work/nccl1.log" 2>&1 &&
        "$build/libtool" --mode=link --tag=CC mpicc -o "$work/nccl1" "$work/nccl1.o" \
            "$build/lib/libmc.la" -lm >>"$work/nccl1.log" 2>&1; then
        timeout 120 mpirun -np 1 -x LD_LIBRARY_PATH "$work/nccl1" >>"$work/nccl1.log" 2>&1
        rc=$?
        grep -E '^(ok|not ok) ' "$work/nccl1.log"
        row "nccl, one-rank communicators" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
            "rc=$rc: $(grep -c '^ok ' "$work/nccl1.log") ok, $(grep -c '^not ok ' "$work/nccl1.log") not ok"
        [ $rc = 0 ] || tail -5 "$work/nccl1.log"
    else
        tail -5 "$work/nccl1.log"
        row "nccl, one-rank communicators" FAIL "tests/cuda/nccl1.c did not build"
    fi
else
    row "nccl, one-rank communicators" skip "$([ "$gpu" = cuda ] && echo "no mpicc" || echo "no GPU (MC_GPU_DEVICE=$gpu)")"
fi

# A model the device cannot hold: refused before any allocation, naming the
# plan's bytes and the GPU's (exit 1).
"$train" "${common[@]}" --num-layers 96 --hidden-size 12288 --num-attention-heads 96 \
    --seq-length 2048 --max-position-embeddings 2048 --train-iters 1 --device "$gpu" \
    >"$work/big.out" 2>"$work/big.err"
rc=$?
msg=$(head -c 400 "$work/big.err")
want="GPU 0 ("; [ "$gpu" = cuda ] || want="this machine"
if [ $rc = 1 ] && [[ "$msg" == *"does not fit"*"$want"* ]]; then
    row "model too big for the device" ok "exit 1: ${msg#*needs }"
else
    row "model too big for the device" FAIL "rc=$rc: $msg"
fi

# ---------------------------------------------------------------- 4. sanitizer
echo "== 4. compute-sanitizer"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
if [ "$gpu" != cuda ]; then
    row "compute-sanitizer" skip "no GPU (MC_GPU_DEVICE=$gpu)"
elif [ -z "$san" ]; then
    row "compute-sanitizer" FAIL "not found"
else
    for m in ${SAN_MODELS:-gpt llama moe}; do
        declare -n args=$m
        # through libtool: tools/mc-train/mc-train is libtool's wrapper script
        timeout "${SAN_TIMEOUT:-200}" "$build/libtool" --mode=execute "$san" --tool memcheck --error-exitcode 9 --leak-check full "$train" "${common[@]}" \
            "${args[@]}" --bf16 --train-iters 3 --lr-warmup-iters 1 --device "$gpu" >"$work/san-$m.log" 2>&1
        rc=$?
        summary=$(grep -m1 'ERROR SUMMARY' "$work/san-$m.log" | sed 's/^=* *//')
        row "memcheck train $m 3 it" "$([ $rc = 0 ] && echo ok || echo FAIL)" "rc=$rc ${summary:-}"
        [ $rc = 0 ] || { grep -m 20 -E 'Invalid|Error|at ' "$work/san-$m.log"; tail -5 "$work/san-$m.log"; }
        unset -n args
    done
    timeout "${SAN_TIMEOUT:-200}" "$build/libtool" --mode=execute "$san" --tool racecheck --error-exitcode 9 "$train" "${common[@]}" "${gpt[@]}" --train-iters 2 \
        --lr-warmup-iters 1 --device "$gpu" >"$work/race.log" 2>&1
    rc=$?
    [ $rc = 0 ] || tail -5 "$work/race.log"
    row "racecheck train gpt 2 it" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "rc=$rc $(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' "$work/race.log" | sed 's/^=* *//')"
fi

echo
echo "== worst kernel errors (check_kern)"
cat "$work/kern_table" 2>/dev/null | sed 's/^# //' | awk '$2 != "0.00e+00" || /kernel/' | head -60
finish
