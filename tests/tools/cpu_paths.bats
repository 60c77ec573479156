#!/usr/bin/env bats
# cpu_paths.bats - every CPU code path, checked on every machine (issue 18).
# The CPU kernels are compiled for three paths (lib/kern/cpu/isa.h):
# baseline (x86-64), avx2 (x86-64-v3) and avx512 (x86-64-v4); the
# environment variable MC_CPU_ISA pins one, never above what the CPU has.
# The rest of `make check` runs on the CPU's best path; this file runs the
# kernel unit tests and the golden tests (PyTorch's values) on each path the
# CPU has, so an AVX-512 machine checks the AVX2 and baseline code too, and
# checks what the paths promise: OpenBLAS runs its kernels of the same
# level (mc loads it with OPENBLAS_CORETYPE set from the path, unless the
# user set it); fp32 training gives the same bits on every path and any
# thread count with OpenBLAS's kernels held fixed (mc's kernels keep one
# summation order); bf16 is emulated where the path has no bf16 GEMM, says
# so in one line, and stays within the golden bf16 tolerances of PyTorch.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"

# A two-layer Llama with grouped queries, head size 32 (the AVX2 and AVX-512
# register tiles of attention both run) and T=80 (a partial key block).
model=(--model tiny-llama --num-layers 2 --hidden-size 128 --num-attention-heads 4
       --num-query-groups 2 --seq-length 80 --micro-batch-size 2 --global-batch-size 4
       --lr 1e-3 --log-interval 1 --eval-iters 0)
llama=("${model[@]}" --mock-data --vocab-size 96)
# The same model on tests/data/train/docs.txt (NullTokenizer ids), which
# mc-eval can measure.
llama_docs=("${model[@]}" --tokenizer-type NullTokenizer --vocab-size 300 --split 100,0,0)

# docs.txt as an indexed dataset, once per file.
dataset() {
    local p="$BATS_FILE_TMPDIR/docs"
    if [ ! -f "${p}_text_document.idx" ]; then
        "$MC_PREPROCESS" --input "$top_srcdir/tests/data/train/docs.txt" --input-format text \
            --lines --tokenizer-type NullTokenizer --vocab-size 300 --output-prefix "$p" \
            --quiet >/dev/null
    fi
    echo "${p}_text_document"
}

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# Run every kernel unit test on path $1: each must print its whole plan with
# no failure.
kernel_tests_on() {
    require_path "$1"
    local t n
    for t in "$top_builddir"/tests/unit/test_kern_*; do
        [ -x "$t" ] || continue
        n=$((n + 1))
        run env MC_CPU_ISA="$1" "$t"
        [ "$status" -eq 0 ] || { echo "$t on $1: exit status $status"; echo "$output"; return 1; }
        if grep -q '^not ok' <<<"$output"; then
            echo "$t on $1:"
            grep -A3 '^not ok' <<<"$output"
            return 1
        fi
        local plan oks
        plan=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' <<<"$output")
        oks=$(grep -c '^ok ' <<<"$output")
        [ -n "$plan" ] && [ "$plan" -eq "$oks" ] || { echo "$t on $1: plan $plan, $oks ok"; return 1; }
    done
    [ "${n:-0}" -ge 6 ] || { echo "only ${n:-0} kernel test programs found"; return 1; }
}

# Run the golden bats files (training and evaluation against PyTorch's
# values) with path $1 pinned.
golden_on() {
    require_path "$1"
    run env MC_CPU_ISA="$1" bats --tap "$top_srcdir/tests/tools/train_golden.bats" \
        "$top_srcdir/tests/tools/eval_golden.bats"
    echo "$output"
    [ "$status" -eq 0 ]
    ! grep -q '^not ok' <<<"$output"
    if grep -q '^ok .*tiny-llama bf16 matches PyTorch.*# skip' <<<"$output"; then
        skip "the golden tests skipped: $(grep -m1 -o '# skip.*' <<<"$output")"
    fi
    grep -q '^ok .*tiny-llama bf16 matches PyTorch' <<<"$output"
}

@test "MC_CPU_ISA: a value that is no path, or a path the CPU lacks, is one line and exit status 2" {
    run -2 env MC_CPU_ISA=avx9 "$MC_TRAIN" "${llama[@]}" --train-iters 1
    assert_output "mc-train: error: MC_CPU_ISA=avx9: expected auto, baseline, avx2 or avx512"
    run -2 env MC_CPU_ISA=sse "$MC_EVAL" --ppl-mode plain --text-file /dev/null ck
    assert_output --partial "MC_CPU_ISA=sse: expected auto, baseline, avx2 or avx512"
    assert_equal "${#lines[@]}" 1
    local best
    best=$(best_path)
    if [ "$best" != avx512 ]; then
        run -2 env MC_CPU_ISA=avx512 "$MC_TRAIN" "${llama[@]}" --train-iters 1
        assert_output "mc-train: error: MC_CPU_ISA=avx512: this CPU has no avx512 path (its best is $best)"
    fi
}

@test "--dry-run names the path in use: the best by default and with auto, the pinned one otherwise" {
    local best p
    best=$(best_path)
    [ -n "$best" ]
    run -0 env MC_CPU_ISA=auto "$MC_TRAIN" "${llama[@]}" --train-iters 1 --device cpu --dry-run
    assert_line --regexp "^cpu path: $best \(OpenBLAS [A-Za-z0-9]+\)$"
    for p in baseline avx2 avx512; do
        [ "$p" = avx2 ] && [ "$best" = baseline ] && continue
        [ "$p" = avx512 ] && [ "$best" != avx512 ] && continue
        run -0 env MC_CPU_ISA=$p "$MC_TRAIN" "${llama[@]}" --train-iters 1 --device cpu --dry-run
        assert_line --regexp "^cpu path: $p \(OpenBLAS [A-Za-z0-9]+\)$"
    done
}

# OpenBLAS's core name in --dry-run's "cpu path" line under environment $@.
blas_core() {
    env "$@" "$MC_TRAIN" "${llama[@]}" --train-iters 1 --device cpu --dry-run |
        sed -n 's/^cpu path: [a-z0-9]* (OpenBLAS \([A-Za-z0-9]*\)).*/\1/p'
}

@test "OpenBLAS runs its kernels of the path's level, unless OPENBLAS_CORETYPE says otherwise (then one note); MC_OPENBLAS" {
    local best p core
    best=$(best_path)
    for p in baseline avx2 avx512; do
        [ "$p" = avx2 ] && [ "$best" = baseline ] && continue
        [ "$p" = avx512 ] && [ "$best" != avx512 ] && continue
        core=$(blas_core -u OPENBLAS_CORETYPE MC_CPU_ISA=$p)
        echo "path $p: OpenBLAS $core"
        case "$p:$core" in
        avx512:SkylakeX | avx512:Cooperlake | avx512:SapphireRapids) ;;
        avx2:Haswell | avx2:Zen) ;;
        baseline:Prescott) ;;
        baseline:*) [ "$best" = baseline ] && [ -n "$core" ] ;; # OpenBLAS's own choice
        *) false ;;
        esac
    done
    [ "$best" != baseline ] || skip "the CPU's best path is the baseline: OpenBLAS chooses alone"
    # the user's choice stands, and is named when it is below the path
    run -0 env -u MC_CPU_ISA OPENBLAS_CORETYPE=Prescott "$MC_TRAIN" "${llama[@]}" --train-iters 1 \
        --device cpu --dry-run
    assert_line --partial "cpu path: $best (OpenBLAS Prescott); note: OpenBLAS runs its Prescott kernels on the $best path (OPENBLAS_CORETYPE is set): its GEMMs are slower than this CPU allows"
    run -0 --separate-stderr env -u MC_CPU_ISA OPENBLAS_CORETYPE=Prescott "$MC_TRAIN" "${llama[@]}" \
        --train-iters 1
    [ "$(grep -c 'OpenBLAS runs its Prescott kernels' <<<"$stderr")" -eq 1 ]
    grep -q "^mc-train: note: OpenBLAS runs its Prescott kernels on the $best path" <<<"$stderr"
    # MC_OPENBLAS names the library to load: one that is not there, or is
    # no OpenBLAS, is one line and exit status 1 before any work
    run -1 env MC_OPENBLAS="$BATS_TEST_TMPDIR/none/libopenblas.so.0" "$MC_TRAIN" "${llama[@]}" \
        --train-iters 1 --save ck
    assert_output "mc-train: error: kern/cpu: cannot load OpenBLAS (MC_OPENBLAS=$BATS_TEST_TMPDIR/none/libopenblas.so.0): $BATS_TEST_TMPDIR/none/libopenblas.so.0: cannot open shared object file: No such file or directory"
    [ ! -e ck ]
    local notblas
    notblas=$top_builddir/lib/.libs/libmc.so.0 # a library, but no OpenBLAS
    [ -f "$notblas" ]
    run -1 env MC_OPENBLAS="$notblas" "$MC_TRAIN" "${llama[@]}" --train-iters 1
    assert_output --partial "kern/cpu: OpenBLAS ($notblas) has no cblas_sgemm"
    assert_equal "${#lines[@]}" 1
    # and no note when OpenBLAS matches the path
    run -0 --separate-stderr env -u MC_CPU_ISA -u OPENBLAS_CORETYPE "$MC_TRAIN" "${llama[@]}" \
        --train-iters 1
    [ -z "$(grep OpenBLAS <<<"$stderr")" ]
}

@test "kernel unit tests on the baseline path" {
    kernel_tests_on baseline
}

@test "kernel unit tests on the avx2 path" {
    kernel_tests_on avx2
}

@test "kernel unit tests on the avx512 path" {
    kernel_tests_on avx512
}

@test "golden training and evaluation (PyTorch's values) on the baseline path" {
    golden_on baseline
}

@test "golden training and evaluation (PyTorch's values) on the avx2 path" {
    golden_on avx2
}

@test "fp32 training: the same losses, grad norms and weights on every path and thread count" {
    local best p th ref= core
    best=$(best_path)
    # OpenBLAS's kernels follow the path; hold them at the baseline's so that
    # the runs differ in mc's kernels alone
    core=$(blas_core -u OPENBLAS_CORETYPE MC_CPU_ISA=baseline)
    [ -n "$core" ]
    for p in baseline avx2 avx512; do
        [ "$p" = avx2 ] && [ "$best" = baseline ] && continue
        [ "$p" = avx512 ] && [ "$best" != avx512 ] && continue
        for th in 1 2; do
            # each run in a directory of its own, with the same --save path
            mkdir $p$th
            (cd $p$th && env MC_CPU_ISA=$p OPENBLAS_CORETYPE="$core" "$MC_TRAIN" "${llama[@]}" --train-iters 5 --threads $th \
                --log-json log.json --save ck >/dev/null 2>&1)
            grep -o '"lm loss": [^,}]*\|"grad-norm": [^,}]*' $p$th/log.json > $p$th.txt
            [ "$(wc -l < $p$th.txt)" -eq 10 ]
            if [ -z "$ref" ]; then
                ref=$p$th
                continue
            fi
            diff $ref.txt $p$th.txt
            # every tensor (the root's attributes record --threads)
            run -0 h5diff $ref/ck/iter_0000005/model.h5 $p$th/ck/iter_0000005/model.h5 /model /model
        done
    done
    [ -n "$ref" ]
}

@test "bf16 where the path has no bf16 GEMM: one note line from mc-train and mc-eval, none where it is native" {
    require_path avx2
    local data
    data=$(dataset)
    run -0 --separate-stderr env MC_CPU_ISA=avx2 "$MC_TRAIN" "${llama_docs[@]}" --data-path "$data" \
        --train-iters 2 --bf16 --save ck
    [ "$(grep -c 'bf16 is emulated' <<<"$stderr")" -eq 1 ]
    assert_equal "$(grep 'bf16 is emulated' <<<"$stderr")" \
        "mc-train: note: bf16 is emulated on the avx2 path (no bf16 GEMM): weights are kept as bf16 panels widened in registers, activations rounded to bf16 and multiplied in fp32"
    # MC_BF16_PANELS=0: the rounded fp32 copies through sgemm, as the baseline path
    run -0 --separate-stderr env MC_CPU_ISA=avx2 MC_BF16_PANELS=0 "$MC_TRAIN" "${llama[@]}" \
        --train-iters 1 --bf16
    assert_equal "$(grep 'bf16 is emulated' <<<"$stderr")" \
        "mc-train: note: bf16 is emulated on the avx2 path (no bf16 GEMM): operands are rounded to bf16 and multiplied by the fp32 GEMM, no faster than fp32"
    run -0 env MC_CPU_ISA=avx2 "$MC_TRAIN" "${llama[@]}" --train-iters 1 --bf16 --dry-run --device cpu
    assert_line --partial "cpu path: avx2 (OpenBLAS "
    assert_line --partial "; note: bf16 is emulated on the avx2 path"
    run -0 --separate-stderr env MC_CPU_ISA=avx2 "$MC_EVAL" --bf16 --data-path "$data" \
        --chunks 2 ck/iter_0000002
    [ "$(grep -c 'bf16 is emulated on the avx2 path' <<<"$stderr")" -eq 1 ]
    run -0 --separate-stderr env MC_CPU_ISA=avx2 "$MC_EVAL" --data-path "$data" --chunks 2 \
        ck/iter_0000002
    [ -z "$(grep emulated <<<"$stderr")" ]
    # fp32: no note
    run -0 --separate-stderr env MC_CPU_ISA=avx2 "$MC_TRAIN" "${llama[@]}" --train-iters 1
    refute_output --partial "emulated"
    [ -z "$(grep emulated <<<"$stderr")" ]
    # the best path of an AVX512_BF16 (or AMX) machine has oneDNN's bf16
    # GEMM: no note; an AVX-512 CPU without bf16 instructions emulates bf16
    # (oneDNN's own bf16 GEMM there widens inside the kernel, far below sgemm)
    if [ "$(best_path)" = avx512 ]; then
        run -0 --separate-stderr env -u MC_CPU_ISA "$MC_TRAIN" "${llama[@]}" --train-iters 1 --bf16
        if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
            [ -z "$(grep emulated <<<"$stderr")" ]
        else
            assert_equal "$(grep emulated <<<"$stderr")" \
                "mc-train: note: bf16 is emulated on the avx512 path (the CPU has no AVX512_BF16 or AMX-BF16 instructions): weights are kept as bf16 panels widened in registers, activations rounded to bf16 and multiplied in fp32"
        fi
    fi
}
