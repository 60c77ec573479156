#!/usr/bin/env bash
# bench/avx2/run.sh - issue 18's targets on the AVX2 path: GPT-2 124M
# training (bench/train/run.sh: fp32 and --bf16 at T=64 and T=1024, mc vs
# PyTorch, MFU against the sgemm peak measured in the same run) and int8
# generation (bench/eval/run.sh: mc-eval --weights int8 vs llama.cpp q8_0),
# with every program held to AVX2 and FMA, in one run:
#   mc:        MC_CPU_ISA=avx2 (its kernels' avx2 path, oneDNN capped at
#              AVX2, so --bf16 is emulated as on a CPU without bf16)
#   OpenBLAS:  OPENBLAS_CORETYPE=Haswell (its AVX2 kernels; also the sgemm
#              peak the MFU is computed against)
#   PyTorch:   ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2,
#              ONEDNN_MAX_CPU_ISA=AVX2
#   llama.cpp: LLAMA_CPP_DIR must be a build with GGML_NATIVE=OFF
#              GGML_AVX2=ON GGML_AVX512=OFF: ggml picks its kernels when it
#              is compiled, not at run time, so a GGML_NATIVE=ON or
#              GGML_AVX512=ON build on this machine runs AVX-512 whatever
#              the environment says. bench/eval/run.sh prints the
#              instruction sets from llama.cpp's system_info line and,
#              with LLAMA_NO_AVX512=1 (set here), fails on AVX-512.
#   llm.c:     -march=x86-64-v3 (when LLMC_SRC is set)
# On an AVX2-only machine (AMD Zen 2/3, Intel before Skylake-SP) these pins
# change nothing; on an AVX-512 machine they make it one, as far as the
# programs can tell: say which in the record (the CPU is printed).
#
# Usage: bench/avx2/run.sh [BUILD-DIR]
# Environment: as bench/train/run.sh and bench/eval/run.sh; WHAT (train
# eval: which halves to run). PyTorch's bf16 autocast has no bf16 hardware
# here and takes minutes a step at T=1024: SKIP defaults to
# "llmc torch-bf16-1024" (the T=64 figure is the comparison).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
export MC_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 \
    MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 LLMC_MARCH=x86-64-v3 LLAMA_NO_AVX512=1
export SKIP=${SKIP:-llmc torch-bf16-1024}
export WARM_64=${WARM_64:-1} ITERS_64=${ITERS_64:-3} WARM_1024=${WARM_1024:-1} ITERS_1024=${ITERS_1024:-1}
echo "bench/avx2/run.sh: every program held to AVX2 (CPU flags: $(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '))"
"$build/tools/mc-train/mc-train" --model gpt2-124m --mock-data --vocab-size 50257 --lr 1e-4 \
    --train-iters 1 --device cpu --bf16 --dry-run | grep "^cpu path"
for w in ${WHAT:-train eval}; do
    echo
    echo "==== bench/$w/run.sh"
    "$here/bench/$w/run.sh" "$build"
done
