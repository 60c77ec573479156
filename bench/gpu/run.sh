#!/usr/bin/env bash
# bench/gpu/run.sh - GPU training throughput (issue 6, section 5), in one call
# on one H100 or H200: mc (--device cuda, --bf16, --mock-data) and llm.c's
# train_gpt2cu on the GPT-2 124M shape at B=16, 32, 64 and T=1024; then mc
# alone on a 1.3B GPT (24 layers, hidden 2048, 16 heads, T=2048) and the
# Llama-style 1B preset (llama-1b: Llama-3.2-1B's shape, T=2048); the 1.3B
# GPT again with --fp8-format hybrid (cuBLASLt's FP8 GEMMs) and a 300-step
# FP8 vs bf16 loss curve of a small GPT. Prints
# tokens/s and MFU against the card's dense bf16 peak (PEAK_TFLOPS, default
# 989 for an H100 SXM; 989 too for an H200, which has the same SMs) for each,
# with the issue's targets, as a table last.
#
# Usage: bench/gpu/run.sh [BUILD-DIR]   (default: configure and build mc in
#        $TMPDIR first)
# Environment: LLMC_SRC (a checkout of karpathy/llm.c fetched beside mc and
# never committed; default .gpukit/llmc, put there by scripts/gpu-llmc.sh;
# without one the llm.c runs are skipped), ITERS (20) and
# WARM (5) measured / warm-up iterations, BATCHES ("16 32 64"), MB_BIG
# (micro-batch of the 1.3B and 1B runs, 4: ~46 GB by mc-train --dry-run;
# the global batch is 4 of them),
# SKIP (space-separated: mc llmc big fp8 eval), PEAK_TFLOPS (989), JOBS (make -j, default
# the cores present), RUN_TIMEOUT (seconds one mc run may take, 150: a slow
# configuration then fails alone and the table still prints inside the
# device tool's 10 minutes), MC_GPUKIT=0 to ignore .gpukit.
#
# On the bare GPU machines the libraries come in .gpukit (scripts/gpu-kit.sh,
# run here first; scripts/gpu-env.sh is sourced below when .gpukit exists).
# The device call (tests/cuda/README.md), a call of its own after the one of
# tests/cuda/run.sh:
#   run(command="set -o pipefail; bench/gpu/run.sh 2>&1 | tee $OUT/bench.log",
#       carry=[".gpukit"], timeout_s=600)
#
# FLOPs per token: 6 N + 12 L C T (N = parameters without position
# embeddings, the attention term counts the full T x T product as llm.c and
# Megatron do); MFU = FLOPs/token x tokens/s / peak. mc prints the same
# figures on its log line (--peak-tflops); both are read back and compared.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/mc-gpubench.XXXXXX")
trap 'rm -rf "$work"' EXIT
peak=${PEAK_TFLOPS:-989}
iters=${ITERS:-20} warm=${WARM:-5}
batches=${BATCHES:-16 32 64}
mbbig=${MB_BIG:-4}
skip=" ${SKIP:-} "
jobs=${JOBS:-$(nproc)}
results=$work/results
: > "$results"
if [ -d "$here/.gpukit" ] && [ "${MC_GPUKIT:-1}" != 0 ]; then
    # shellcheck source=../../scripts/gpu-env.sh
    . "$here/scripts/gpu-env.sh" || { echo "bench/gpu: scripts/gpu-env.sh failed"; exit 1; }
fi

echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null)"
echo "settings: ITERS=$iters WARM=$warm PEAK_TFLOPS=$peak load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ $# -ge 1 ]; then
    build=$(cd "$1" && pwd)
else
    build=$work/build
    mkdir -p "$build"
    [ -x "$here/configure" ] || (cd "$here" && ./autogen.sh >/dev/null) || exit 1
    (cd "$build" && "$here/configure" -q --with-cuda && make -j"$jobs" all) >"$work/build.log" 2>&1 ||
        { tail -30 "$work/build.log"; echo "bench/gpu: building mc failed"; exit 1; }
fi
mctrain=$build/tools/mc-train/mc-train
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
# flops_per_token N L C T
fpt() { awk -v n="$1" -v l="$2" -v c="$3" -v t="$4" 'BEGIN { printf "%.6e", 6 * n + 12 * l * c * t }'; }
# report NAME B T TOKENS/S FLOPS/TOKEN
report() {
    local mfu
    mfu=$(awk -v f="$5" -v s="$4" -v p="$peak" 'BEGIN { printf "%.1f", 100 * f * s / (p * 1e12) }')
    printf '%-10s %-12s %4s %5s %12.0f %6s%%\n' "$1" "$6" "$2" "$3" "$4" "$mfu" | tee -a "$results"
}

# ---------------------------------------------------------------- mc
# run_mc LABEL B(micro) GLOBAL T N L C ARGS...
run_mc() {
    local label=$1 mb=$2 gb=$3 t=$4 n=$5 l=$6 c=$7
    shift 7
    local lj=$work/mc-$label-$mb.json
    timeout "${RUN_TIMEOUT:-150}" "$mctrain" --device cuda --bf16 --mock-data --seq-length "$t" --micro-batch-size "$mb" \
        --global-batch-size "$gb" --train-iters $((warm + iters)) --lr 1e-4 --log-interval 1 \
        --eval-iters 0 --peak-tflops "$peak" --log-json "$lj" "$@" >"$lj.out" 2>"$lj.err"
    local rc=$?
    [ $rc = 0 ] || { tail -5 "$lj.err"; echo "mc $label B=$mb: failed$([ $rc = 124 ] && echo " (over RUN_TIMEOUT=${RUN_TIMEOUT:-150} s)")" |
        tee -a "$results"; return 0; }
    local tps
    tps=$(grep -o '"tokens-per-sec": [^,}]*' "$lj" | cut -d' ' -f2 | tail -n +$((warm + 1)) | median)
    report mc "$gb" "$t" "$tps" "$(fpt "$n" "$l" "$c" "$t")" "$label"
    grep 'iteration' "$lj.err" | tail -1 | sed 's/^/    last log line: /'
}

# GPT-2 124M: N = 123,689,472 without position embeddings (vocabulary padded to 50304)
gpt2=(--model gpt2-124m --vocab-size 50257)
case $skip in *" mc "*) ;; *)
    for b in $batches; do run_mc gpt2-124m "$b" "$b" 1024 123689472 12 768 "${gpt2[@]}"; done ;;
esac

# ---------------------------------------------------------------- llm.c
run_llmc() {
    local src=${LLMC_SRC:-}
    [ -n "$src" ] || [ ! -f "$here/.gpukit/llmc/train_gpt2.cu" ] || src=$here/.gpukit/llmc
    [ -n "$src" ] || { echo "llm.c: LLMC_SRC is not set (a checkout of karpathy/llm.c): skipped"; return 0; }
    [ -f "$src/train_gpt2.cu" ] || { echo "llm.c: $src/train_gpt2.cu not found: skipped"; return 0; }
    # build out of the checkout (llm.c's Makefile; no cuDNN, no MPI/NCCL: one GPU)
    cp -r "$src" "$work/llmc"
    make -C "$work/llmc" -j"$jobs" train_gpt2cu USE_CUDNN=0 NO_MULTI_GPU=1 >"$work/llmc-build.log" 2>&1 ||
        { tail -20 "$work/llmc-build.log"; echo "llm.c: build failed" | tee -a "$results"; return 0; }
    # random tokens in llm.c's data format: 256 int32 header [20240520, 1, ntok], uint16 tokens
    python3 - "$work/tok.bin" <<'PY'
import sys, numpy as np
n = 64 * 1024 * 8 + 1
h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 1, n
t = np.random.default_rng(1).integers(0, 50257, n, dtype=np.uint16)
with open(sys.argv[1], "wb") as f: f.write(h.tobytes()); f.write(t.tobytes())
PY
    for b in $batches; do
        (cd "$work/llmc" && ./train_gpt2cu -e d12 -i "$work/tok.bin" -j "$work/tok.bin" -b "$b" \
            -t 1024 -d $((b * 1024)) -x $((warm + iters)) -v 1000000 -s 0 -g 0 -h 0 -o none \
            -l 1e-4) >"$work/llmc-$b.log" 2>&1 ||
            { tail -5 "$work/llmc-$b.log"; echo "llm.c B=$b: failed" | tee -a "$results"; continue; }
        # "step  k/n | loss ... | ... ms | ...% bf16 MFU | N tok/s"
        local tps
        tps=$(grep -o '[0-9.]* tok/s' "$work/llmc-$b.log" | awk '{ print $1 }' | tail -n +$((warm + 1)) | median)
        report llm.c "$b" 1024 "${tps:-0}" "$(fpt 123689472 12 768 1024)" gpt2-124m
    done
}
case $skip in *" llmc "*) ;; *) run_llmc ;; esac

# ---------------------------------------------------------------- large models (mc)
case $skip in *" big "*) ;; *)
    # 1.3B GPT: 24 x 2048, 16 heads, T=2048; N = 12 L C^2 + 13 L C + V C (no wpe)
    n13=$(awk 'BEGIN { L = 24; C = 2048; V = 50304; printf "%.0f", 12*L*C*C + 13*L*C + V*C + 2*C }')
    run_mc gpt-1.3b "$mbbig" $((4 * mbbig)) 2048 "$n13" 24 2048 --model gpt2-124m --vocab-size 50257 \
        --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --max-position-embeddings 2048
    # llama-1b: 16 x 2048, GQA 32/8, SwiGLU 8192, untied 128256 vocabulary (padded to 128256)
    nl=$(awk 'BEGIN { L = 16; C = 2048; F = 8192; V = 128256; kv = 512;
        printf "%.0f", L * (C*C + 2*C*kv + C*C + 3*C*F + 2*C) + 2*V*C + C }')
    run_mc llama-1b "$mbbig" $((4 * mbbig)) 2048 "$nl" 16 2048 --model llama-1b --vocab-size 128256 ;;
esac

# ---------------------------------------------------------------- FP8 (issue 11, section 4)
case $skip in *" fp8 "*) ;; *)
    # the 1.3B GPT with --fp8-format hybrid against its bf16 run above:
    # target >= 1.3x the tokens/s
    case $skip in *" big "*) ;; *)
        run_mc gpt-1.3b-fp8 "$mbbig" $((4 * mbbig)) 2048 "$n13" 24 2048 --model gpt2-124m \
            --vocab-size 50257 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
            --max-position-embeddings 2048 --fp8-format hybrid --fp8-amax-history-len 16 \
            --fp8-amax-compute-algo max
        b16=$(awk '$2 == "gpt-1.3b" { print $5 }' "$results") f8=$(awk '$2 == "gpt-1.3b-fp8" { print $5 }' "$results")
        [ -n "$b16" ] && [ -n "$f8" ] &&
            awk -v a="$f8" -v b="$b16" 'BEGIN { printf "fp8/bf16 tokens/s on gpt-1.3b: %.2fx (target >= 1.3x)\n", a / b }' |
            tee -a "$results.fp8" ;;
    esac
    # 300 iterations of a small GPT, FP8 against bf16: the loss curves within 1%
    small=(--model gpt2-124m --vocab-size 50257 --num-layers 4 --hidden-size 256 --num-attention-heads 4
           --seq-length 256 --max-position-embeddings 256 --micro-batch-size 16 --global-batch-size 16
           --lr 1e-3 --lr-warmup-iters 30 --train-iters 300 --log-interval 1 --eval-iters 0 --seed 3)
    ok=1
    for f in bf16 fp8; do
        extra=(); [ $f = fp8 ] && extra=(--fp8-format hybrid --fp8-amax-history-len 16 --fp8-amax-compute-algo max)
        timeout "${RUN_TIMEOUT:-150}" "$mctrain" --device cuda --bf16 --mock-data "${small[@]}" "${extra[@]}" \
            --log-json "$work/curve-$f.json" >"$work/curve-$f.out" 2>"$work/curve-$f.err" ||
            { tail -3 "$work/curve-$f.err"; ok=0; }
    done
    if [ $ok = 1 ]; then
        paste <(grep -o '"lm loss": [^,}]*' "$work/curve-fp8.json" | cut -d' ' -f3) \
              <(grep -o '"lm loss": [^,}]*' "$work/curve-bf16.json" | cut -d' ' -f3) |
            awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d; n++; l1 = $1; l2 = $2 }
                 END { printf "fp8 vs bf16 loss curve, small GPT, %d iterations: max relative difference %.2f%% (target <= 1%%); last loss fp8 %.4f bf16 %.4f\n", n, 100 * m, l1, l2 }' |
            tee -a "$results.fp8"
    else
        echo "fp8 loss curve: a run failed" | tee -a "$results.fp8"
    fi ;;
esac

# ---------------------------------------------------------------- generation (mc-eval)
case $skip in *" eval "*) ;; *)
    echo "== generation: mc-eval --device cuda vs transformers (bench/gpu/eval.sh)"
    "$here/bench/gpu/eval.sh" "$build" 2>&1 | tee "$work/eval.log"
    grep '^batch' "$work/eval.log" >> "$results.eval" ;;
esac

echo
echo "== bench/gpu summary: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), peak $peak TFLOP/s bf16 dense"
printf '%-10s %-12s %4s %5s %12s %7s\n' program model B T tokens/s MFU
cat "$results"
[ -s "$results.eval" ] && cat "$results.eval"
[ -s "$results.fp8" ] && cat "$results.fp8"
echo "targets: mc >= llm.c tokens/s on gpt2-124m at each B; MFU >= 50% on gpt-1.3b; generation >= 3x transformers; FP8 >= 1.3x bf16 on gpt-1.3b and its loss curve within 1%"
