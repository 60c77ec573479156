#!/usr/bin/env bash
# bench/gpu/profile.sh - where a GPU training step of mc goes (issue 11,
# section 3): builds mc with the carried .gpukit (as tests/cuda/run.sh),
# then runs ITERS iterations of GPT-2 124M (B, T=1024, bf16) under Nsight
# Systems and prints its CUDA kernel and API summaries (time per kernel,
# launches, host syncs). On a GPU machine, in one device call:
#   run(command="bench/gpu/profile.sh 2>&1 | tee $OUT/profile.log", carry=[".gpukit"])
# Environment: ITERS (6), B (16), JOBS (nproc); where only Nsight Compute
# is installed, NCU_SKIP (600) and NCU_COUNT (400) kernels.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=../../scripts/gpu-env.sh
[ -d "$src/.gpukit" ] && { . "$src/scripts/gpu-env.sh" || exit 1; }
mkdir -p "$work/build"
(cd "$work/build" && "$src/configure" -q --with-cuda && make -s -j"${JOBS:-$(nproc)}") \
    > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
cmd=("$work/build/libtool" --mode=execute)
train=("$work/build/tools/mc-train/mc-train" --model gpt2-124m --vocab-size 50257 --mock-data
       --seq-length 1024 --micro-batch-size "${B:-16}" --global-batch-size "${B:-16}" --bf16
       --lr 1e-4 --train-iters "${ITERS:-6}" --log-interval 1 --eval-iters 0 --device cuda)
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -z "$nsys" ] && [ -n "$ncu" ]; then
    # Nsight Compute instead: the kernels of one iteration after the first
    # (each kernel replayed: slow), time per kernel name
    echo "profile.sh: no nsys; Nsight Compute on ${NCU_COUNT:-400} kernels after the first ${NCU_SKIP:-600}"
    "${cmd[@]}" "$ncu" --launch-skip "${NCU_SKIP:-600}" --launch-count "${NCU_COUNT:-400}" \
        --metrics gpu__time_duration.sum --print-summary per-kernel "${train[@]}" 2>&1 |
        grep -E '^  [A-Za-z_]|gpu__time_duration|invocations|ERROR' | cut -c1-200 | head -150
    exit 0
fi
if [ -z "$nsys" ]; then
    echo "profile.sh: no nsys or ncu on this machine: the step's log only"
    "${cmd[@]}" "${train[@]}" 2>&1 | tail -3
    exit 0
fi
"${cmd[@]}" "$nsys" profile -o "$work/step" --force-overwrite true --stats=false "${train[@]}" \
    > "$work/nsys.log" 2>&1 || { tail -20 "$work/nsys.log"; exit 1; }
grep 'elapsed time per iteration' "$work/nsys.log" | tail -2
"$nsys" stats --report cuda_gpu_kern_sum,cuda_api_sum --format column "$work/step.nsys-rep" 2>&1 |
    cut -c1-220 | head -80
