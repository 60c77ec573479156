#!/usr/bin/env bash
# bench/train/run.sh - training throughput (issue 3, section 7): GPT-2 124M
# (vocabulary 50257 padded to 50304) at B=4, T=64 and B=4, T=1024, fp32 and
# bf16, on THREADS threads, in one run: mc-train --mock-data, the PyTorch
# reference (torch_gpt2.py: eager, autocast for bf16) and llm.c's CPU trainer
# train_gpt2.c (fp32, B=4, T=64 only: it takes ~10 s a step here). Also
# measures, in the same run, the GEMM peaks that MFU is computed against: a
# 4096^3 sgemm through OpenBLAS and a 4096^3 bf16 GEMM through oneDNN
# (peak.c). Prints ms/iteration (median of the iterations after warm-up),
# tokens/s, TFLOP/s, MFU, peak RSS (/usr/bin/time) and the issue's targets.
#
# Usage: bench/train/run.sh [BUILD-DIR]
# Environment: THREADS (2); ITERS_64 / WARM_64 (5 / 2) and ITERS_1024 /
# WARM_1024 (2 / 1) measured / warm-up iterations; LLMC_ITERS (3, after one
# warm-up step); MC_PYTHON (numpy; default $top_srcdir/.venv/bin/python);
# MC_PYTHON_HEAVY (torch; default /opt/mcheavy/bin/python); LLMC_SRC (a
# directory holding a checkout of llm.c (karpathy/llm.c: train_gpt2.c and
# llmc/); without it the llm.c runs are skipped; llm.c is never committed to mc); SKIP (space-separated names to skip: mc torch llmc
# t64 t1024 torch-bf16-1024 torch-fp32-1024 mc-bf16-1024 mc-fp32-1024); OPENBLAS_OPENMP_DIR (a directory holding the OpenMP build of
# OpenBLAS's libopenblas.so.0, e.g. Debian libopenblas0-openmp's
# /usr/lib/x86_64-linux-gnu/openblas-openmp: mc runs a second time with it
# first on LD_LIBRARY_PATH, as "mc+ompblas", so that BLAS and mc's kernels
# share one OpenMP thread pool instead of OpenBLAS's own pthreads competing
# with OpenMP's spinning workers).
#
# FLOPs per iteration: (6 N + 12 L C T) B T, N = parameters without the
# position embeddings (123,689,472 with the padded vocabulary).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
threads=${THREADS:-2}
py=${MC_PYTHON:-$here/.venv/bin/python}
pyh=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
mctrain=$build/tools/mc-train/mc-train
skip=" ${SKIP:-} "
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -x "$mctrain" ] || { echo "run.sh: $mctrain not found: build mc first" >&2; exit 1; }

# Every peer gets its best settings. OpenBLAS 0.3.21 does not recognize
# these CPUs and falls back to AVX2 kernels: force its AVX-512 kernels where
# the CPU has AVX-512 (read when the library loads), unless the caller chose
# a core type (bench/avx2/run.sh pins everyone to AVX2). oneDNN and
# PyTorch's MKL/oneDNN detect the CPU themselves. OpenMP threads for everyone.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
fi
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
N=123689472 L=12 C=768

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "$(free -g | awk '/^Mem:/ {print $2}') GiB; flags:"\
     "$(grep -m1 -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | tr '\n' ' ')"
echo "settings: threads=$threads OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(default)}" \
     "MC_CPU_ISA=${MC_CPU_ISA:-(best)} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-(all)}" \
     "MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-(all)} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-(best)};" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------- peaks
cc=${CC:-gcc}
$cc -O2 -std=c17 -I"$here/lib/kern/cpu" -o "$work/peak" "$here/bench/train/peak.c" -lopenblas -ldnnl
sg=$("$work/peak" sgemm 4096 5)
# no bf16 GEMM on this CPU (or oneDNN held below AVX-512): reported, and
# bf16 MFU is then against the sgemm peak (bf16 runs on sgemm there)
bf=$("$work/peak" bf16 4096 5 2>&1) || bf="bf16 GEMM: none on this CPU ($bf): bf16 MFU is against the sgemm peak"
sg_def=$(env -u OPENBLAS_CORETYPE "$work/peak" sgemm 4096 3)
echo "peak: $sg"
echo "peak: $bf"
echo "      (OpenBLAS with its own CPU detection: $sg_def)"
peak_fp32=$(echo "$sg" | sed 's/.*: \([0-9.]*\) GFLOP.*/\1/')
peak_bf16=$(echo "$bf" | sed -n 's/.*: \([0-9.]*\) GFLOP.*/\1/p')
[ -n "$peak_bf16" ] || peak_bf16=$peak_fp32
# mc emulates bf16 on sgemm where the CPU has no bf16 instructions, even
# where oneDNN's (widening) bf16 GEMM ran above: its bf16 MFU is then
# against the sgemm peak too
if "$mctrain" --model gpt2-124m --mock-data --vocab-size 50257 --seq-length 64 --lr 1e-4 \
    --train-iters 1 --device cpu --bf16 --dry-run 2>&1 | grep -q 'bf16 is emulated'; then
    echo "      (mc emulates bf16 on this CPU: the bf16 rows' MFU is against the sgemm peak)"
    peak_bf16=$peak_fp32
fi

# Results: one line per run, "name precision T seconds-per-iteration maxrss-KB".
results=$work/results
: > "$results"
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
maxrss() { awk '/Maximum resident set size/ {print $NF}' "$1"; }

# ---------------------------------------------------------------- mc
run_mc() { # name precision T warm iters
    local name=$1 prec=$2 t=$3 warm=$4 iters=$5 flag= libpath=${LD_LIBRARY_PATH:-}
    [ "$prec" = bf16 ] && flag=--bf16
    [ "$name" = mc+ompblas ] && libpath=$OPENBLAS_OPENMP_DIR${libpath:+:$libpath}
    rm -f "$work/mc.json"
    LD_LIBRARY_PATH=$libpath /usr/bin/time -v -o "$work/time" "$mctrain" --model gpt2-124m --mock-data --vocab-size 50257 \
        --micro-batch-size 4 --global-batch-size 4 --seq-length "$t" --train-iters $((warm + iters)) \
        --lr 1e-4 --log-interval 1 --eval-iters 0 --threads "$threads" $flag \
        --log-json "$work/mc.json" >/dev/null 2>"$work/mc.log" || { cat "$work/mc.log" >&2; return 1; }
    local s
    s=$(sed 's/.*"iteration-time": \([0-9.e-]*\).*/\1/' "$work/mc.json" | tail -n +$((warm + 1)) | median)
    echo "$name $prec $t $s $(maxrss "$work/time")" | tee -a "$results"
}

# ---------------------------------------------------------------- PyTorch
run_torch() { # precision T warm iters
    local prec=$1 t=$2 warm=$3 iters=$4
    /usr/bin/time -v -o "$work/time" "$pyh" "$here/bench/train/torch_gpt2.py" "$prec" 4 "$t" \
        $((warm + iters)) "$threads" >"$work/torch.json" 2>"$work/torch.log" || { cat "$work/torch.log" >&2; return 1; }
    torch_info=$(sed 's/, "precision".*//; s/[{}"]//g' "$work/torch.json")
    local s
    s=$(sed 's/.*"seconds": \[\([^]]*\)\].*/\1/' "$work/torch.json" | tr ',' '\n' | tail -n +$((warm + 1)) | median)
    echo "torch $prec $t $s $(maxrss "$work/time")" | tee -a "$results"
}

# ---------------------------------------------------------------- llm.c
run_llmc() {
    local src=${LLMC_SRC:-}
    [ -n "$src" ] || { echo "llm.c: LLMC_SRC is not set (a checkout of karpathy/llm.c): skipped"; return 0; }
    [ -f "$src/train_gpt2.c" ] || { echo "llm.c: $src/train_gpt2.c not found: skipped"; return 0; }
    # llm.c's Makefile flags for its CPU trainer: -Ofast -march=native -fopenmp -DOMP
    # (LLMC_MARCH overrides -march: x86-64-v3 for the AVX2 comparison).
    $cc -Ofast -march=${LLMC_MARCH:-native} -fopenmp -DOMP -Wno-unused-result -I"$src" \
        -o "$work/llmc-train" "$here/bench/train/llmc_main.c" -lm
    "$py" "$here/bench/train/llmc_files.py" "$work/gpt2_124M.bin" "$work/tokens.bin" 65536
    local steps=$((1 + ${LLMC_ITERS:-3}))
    /usr/bin/time -v -o "$work/time" "$work/llmc-train" "$work/gpt2_124M.bin" "$work/tokens.bin" 4 64 \
        "$steps" >"$work/llmc.log" 2>&1 || { cat "$work/llmc.log" >&2; return 1; }
    local s
    s=$(sed -n 's/^step [0-9]*: .*(took \([0-9.]*\) ms)$/\1/p' "$work/llmc.log" | tail -n +2 |
        awk '{ print $1 / 1000 }' | median)
    echo "llm.c fp32 64 $s $(maxrss "$work/time")" | tee -a "$results"
}

echo
echo "runs (name precision T s/iteration maxRSS-KB):"
mcs=mc
[ -n "${OPENBLAS_OPENMP_DIR:-}" ] && mcs="mc mc+ompblas"
run_mcs() { local m; for m in $mcs; do run_mc "$m" "$@"; done; }
case $skip in *" t64 "*) ;; *)
    for prec in fp32 bf16; do
        case $skip in *" mc "*) ;; *) run_mcs "$prec" 64 "${WARM_64:-2}" "${ITERS_64:-5}" ;; esac
        case $skip in *" torch "*) ;; *) run_torch "$prec" 64 "${WARM_64:-2}" "${ITERS_64:-5}" ;; esac
    done ;;
esac
case $skip in *" llmc "*) ;; *) run_llmc ;; esac
case $skip in *" t1024 "*) ;; *)
    for prec in fp32 bf16; do
        case $skip in *" mc "* | *" mc-$prec-1024 "*) ;; *) run_mcs "$prec" 1024 "${WARM_1024:-1}" "${ITERS_1024:-2}" ;; esac
        case $skip in *" torch "* | *" torch-$prec-1024 "*) ;; *) run_torch "$prec" 1024 "${WARM_1024:-1}" "${ITERS_1024:-2}" ;; esac
    done ;;
esac
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${torch_info:-}" ] && echo "PyTorch: $torch_info"

# ---------------------------------------------------------------- table
echo
awk -v N=$N -v L=$L -v C=$C -v pf="$peak_fp32" -v pb="$peak_bf16" '
{
    name = $1; prec = $2; T = $3; s = $4; rss = $5; B = 4
    flops = (6 * N + 12 * L * C * T) * B * T
    peak = (prec == "bf16") ? pb : pf
    key = name " " prec " " T
    sec[key] = s; mem[key] = rss
    printf "%-10s %-5s B=4 T=%-5d %10.1f ms/it %9.0f tok/s %7.3f TFLOP/s  MFU %5.1f%% of %s peak  RSS %6.2f GiB\n",
        name, prec, T, s * 1000, B * T / s, flops / s / 1e12, 100 * flops / s / 1e9 / peak, prec, rss / 1048576
    if (prec == "fp32") mfu[key] = flops / s / 1e9 / peak
}
function ratio(label, a, b, target) {
    if ((a in sec) && (b in sec))
        printf "%-52s %6.2fx  (target >= %s)%s\n", label, sec[b] / sec[a], target, (sec[b] / sec[a] >= target ? "" : "  MISSED")
}
function memcmp(label, a, b) {
    if ((a in mem) && (b in mem))
        printf "%-52s %6.2fx  (target <= 1)%s\n", label, mem[a] / mem[b], (mem[a] <= mem[b] ? "" : "  MISSED")
}
END {
    split("mc mc+ompblas", mcs, " ")
    for (i = 1; i <= 2; i++) for (T = 64; T <= 1024; T *= 16) {
        m = mcs[i]
        if (!((m " fp32 " T) in sec) && !((m " bf16 " T) in sec)) continue
        print ""
        ratio("fp32 T=" T ": " m " speed vs PyTorch", m " fp32 " T, "torch fp32 " T, 1.5)
        if ((m " fp32 " T) in mfu)
            printf "%-52s %6.1f%%  (target >= 50%%)%s\n", "fp32 T=" T ": " m " MFU of the sgemm peak",
                100 * mfu[m " fp32 " T], (mfu[m " fp32 " T] >= 0.5 ? "" : "  MISSED")
        ratio("bf16 T=" T ": " m " speed vs PyTorch autocast", m " bf16 " T, "torch bf16 " T, 1.5)
        ratio("bf16 T=" T ": " m " speed vs llm.c fp32", m " bf16 " T, "llm.c fp32 " T, 10)
        # issue 18 (every x86 CPU): bf16 never slower than fp32, >= 1.3x
        # PyTorch autocast, fp32 >= 75% of the sgemm peak
        ratio("bf16 T=" T ": " m " bf16 vs " m " fp32", m " bf16 " T, m " fp32 " T, 1.0)
        if (T == 64 && (m " fp32 " T) in mfu)
            printf "%-52s %6.1f%%  (issue 18 target >= 75%%)%s\n", "fp32 T=" T ": " m " MFU of the sgemm peak", 100 * mfu[m " fp32 " T], (mfu[m " fp32 " T] >= 0.75 ? "" : "  MISSED")
        memcmp("fp32 T=" T ": " m " peak memory / PyTorch", m " fp32 " T, "torch fp32 " T)
        memcmp("bf16 T=" T ": " m " peak memory / PyTorch", m " bf16 " T, "torch bf16 " T)
    }
}' "$results"
