#!/usr/bin/env bash
# bench/moe/run.sh - mixture-of-experts training step (issue 13, section 5),
# mc-train against transformers' own models in PyTorch (hf_moe.py), side by
# side in one run on THREADS threads, the same shapes, batch, sequence and
# vocabulary, fp32 and bf16 (mc --bf16; PyTorch autocast):
#
#   mixtral: Mixtral-shaped, 4 layers, hidden 512, 8 heads (2 key/value
#            groups), 8 SwiGLU experts of 1792, top-2 (MixtralForCausalLM)
#   fine:    fine-grained, the same trunk, 64 SwiGLU experts of 192, top-8,
#            a shared expert of 768 (Qwen3MoeForCausalLM plus a shared
#            expert, see hf_moe.py)
#
# both with the load-balancing loss (coefficient 1e-2), B=4, T=256,
# vocabulary 32000. Prints each program's median seconds per step after
# WARM warm-up steps (ITERS measured, ROUNDS times), the ratio torch / mc (target >= 2),
# and the efficiency of the MoE layer's GEMMs: grouped.c runs the expert
# computation of one MoE layer (the four grouped GEMM calls of a forward and
# backward, through kern.h, on the model's shapes and a uniform random
# routing) interleaved with mc_k_linear_fwd on a square P x P matrix (the
# same BLAS call: sgemm, or oneDNN's bf16 GEMM), target >= 70% of it.
#
# Usage: bench/moe/run.sh [BUILD-DIR]
# Environment: THREADS (2); WARM / ITERS (1 / 3) per process, ROUNDS (1): mc and
# PyTorch run alternately ROUNDS times each, the median over all their
# measured steps (the load of a shared machine weighs on both); MC_PYTHON_HEAVY (torch and
# transformers; default /work/venv-torch/bin/python); SKIP (space-separated:
# mixtral fine fp32 bf16 torch mc gemm); PEAK_N (the square GEMM, 2048);
# TORCH_IMPL (transformers' experts_implementation; default its own choice).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
threads=${THREADS:-2}
warm=${WARM:-1}
iters=${ITERS:-3}
rounds=${ROUNDS:-1}
pyh=${MC_PYTHON_HEAVY:-/work/venv-torch/bin/python}
mctrain=$build/tools/mc-train/mc-train
skip=" ${SKIP:-} "
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -x "$mctrain" ] || { echo "run.sh: $mctrain not found: build mc first" >&2; exit 1; }
skipped() { case $skip in *" $1 "*) return 0 ;; esac; return 1; }

# OpenBLAS 0.3.21 misdetects these CPUs (PERF-NOTES): its AVX-512 kernels
# where the CPU has AVX-512, unless the caller chose. Threads for everyone.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
fi
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p'), model $(lscpu | sed -n 's/^Model: *//p')),"\
     "$(free -g | awk '/^Mem:/ {print $2}') GiB"
echo "flags: $(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "settings: threads=$threads OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(default)}" \
     "MC_CPU_ISA=${MC_CPU_ISA:-(best)} warm-up=$warm measured=$iters rounds=$rounds;" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

B=4 T=256 V=32000 L=4 H=512 HEADS=8 KVG=2 AUX=1e-2
trunk=(--num-layers $L --hidden-size $H --num-attention-heads $HEADS --num-query-groups $KVG
       --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
       --untie-embeddings-and-output-weights --moe-aux-loss-coeff $AUX --vocab-size $V
       --seq-length $T --micro-batch-size $B --global-batch-size $B --mock-data --lr 1e-4
       --log-interval 1 --eval-iters 0 --threads "$threads")
# name E K F S(shared)
shape() {
    case $1 in
    mixtral) echo 8 2 1792 0 ;;
    fine) echo 64 8 192 768 ;;
    esac
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

results=$work/results
: > "$results"

run_mc() { # model prec
    local E K F S flag=
    read -r E K F S <<<"$(shape "$1")"
    [ "$2" = bf16 ] && flag=--bf16
    local extra=(--num-experts "$E" --moe-router-topk "$K" --moe-ffn-hidden-size "$F" --ffn-hidden-size "$F")
    [ "$S" -gt 0 ] && extra+=(--moe-shared-expert-intermediate-size "$S")
    local cmd=("$mctrain" "${trunk[@]}" "${extra[@]}" --train-iters $((warm + iters)) $flag
               --log-json "$work/mc.json")
    echo "command: ${cmd[*]/#$build\//}"
    rm -f "$work/mc.json"
    "${cmd[@]}" >/dev/null 2>"$work/mc.log" || { cat "$work/mc.log" >&2; return 1; }
    sed 's/.*"iteration-time": \([0-9.e-]*\).*/\1/' "$work/mc.json" | tail -n +$((warm + 1)) >>"$work/$1-$2-mc"
    echo "$1 $2 mc: $(tr '\n' ' ' <"$work/$1-$2-mc")s per step so far"
}

run_torch() { # model prec
    local E K F S
    read -r E K F S <<<"$(shape "$1")"
    local cmd=("$pyh" "$here/bench/moe/hf_moe.py" "$1" "$2" $B $T $V $((warm + iters)) "$threads"
               $L $H $HEADS $KVG "$E" "$K" "$F" "$S" $AUX ${TORCH_IMPL:-})
    echo "command: ${cmd[*]/#$here\//}"
    "${cmd[@]}" >"$work/torch.json" 2>"$work/torch.log" || { cat "$work/torch.log" >&2; return 1; }
    sed 's/.*"seconds": \[\([^]]*\)\].*/\1/' "$work/torch.json" | tr ',' '\n' | tr -d ' ' |
        tail -n +$((warm + 1)) >>"$work/$1-$2-torch"
    echo "   (torch: $(sed 's/.*"experts_implementation": \("[^"]*"\|null\).*"torch": "\([^"]*\)", "transformers": "\([^"]*\)".*/experts_implementation \1, torch \2, transformers \3/' "$work/torch.json"))"
    echo "$1 $2 torch: $(tr '\n' ' ' <"$work/$1-$2-torch")s per step so far"
}

gemm_eff() { # model prec
    local E K F S
    read -r E K F S <<<"$(shape "$1")"
    local out
    out=$("$work/grouped" "$threads" "$2" $((B * T)) $H "$E" "$K" "$F" 1 5 "${PEAK_N:-2048}" 2>&1) ||
        { echo "gemm $1 $2: failed: $out"; return 0; }
    echo "$out"
    echo "$1 $2 gemm $(echo "$out" | sed 's/.*efficiency \([0-9.]*\)%.*/\1/')" >>"$results"
}

skipped gemm || gcc -O2 -std=c17 -I"$here/lib" -I"$build" "$here/bench/moe/grouped.c" -o "$work/grouped" \
    "$build/lib/.libs/libmc.so" -Wl,-rpath,"$build/lib/.libs"

echo
for model in mixtral fine; do
    skipped $model && continue
    for prec in fp32 bf16; do
        skipped $prec && continue
        for ((round = 1; round <= rounds; round++)); do
            skipped mc || run_mc $model $prec
            skipped torch || run_torch $model $prec
        done
        for prog in mc torch; do
            [ -s "$work/$model-$prec-$prog" ] && echo "$model $prec $prog $(median <"$work/$model-$prec-$prog")" >>"$results"
        done
        skipped gemm || gemm_eff $model $prec
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "FLOPs per step: (6 N + 12 L C T) B T, N the parameters a token goes through (top-k experts, shared"
echo "expert, router, attention, output layer); achieved = FLOPs / s per step, peak = grouped.c's square GEMM."
echo "| model | precision | GFLOP/step | mc s/step (GFLOP/s) | transformers s/step (GFLOP/s) | transformers / mc (target >= 2) | MoE GEMMs / peak (target >= 70%) |"
echo "|---|---|---|---|---|---|---|"
awk -v L=$L -v C=$H -v T=$T -v B=$B -v V=$V -v KVG=$KVG -v HEADS=$HEADS '
NF == 4 && $3 ~ /^(mc|torch|gemm)$/ { k = $1 " " $2; v[k, $3] = $4; if (!(k in seen)) { seen[k] = 1; order[n++] = k } }
END {
    for (i = 0; i < n; i++) {
        k = order[i]; split(k, p, " ")
        if (p[1] == "mixtral") { E = 8; K = 2; F = 1792; S = 0 } else { E = 64; K = 8; F = 192; S = 768 }
        D = C / HEADS
        np = L * (2 * C * C + 2 * C * KVG * D + C * E + K * 3 * C * F + 3 * C * S) + C * V
        gf = (6 * np + 12 * L * C * T) * B * T / 1e9
        mc = v[k, "mc"]; t = v[k, "torch"]; g = v[k, "gemm"]
        r = (mc > 0 && t > 0) ? sprintf("%.2fx", t / mc) : "-"
        printf "| %s | %s | %.0f | %s | %s | %s | %s |\n", p[1], p[2], gf,
            mc == "" ? "-" : sprintf("%.3f (%.1f)", mc, gf / mc),
            t == "" ? "-" : sprintf("%.3f (%.1f)", t, gf / t), r, g == "" ? "-" : g "%"
    }
}' "$results"
