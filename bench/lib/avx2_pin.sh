# bench/lib/avx2_pin.sh - sourced by the bench/avx2 scripts that compare mc
# with itself on the AVX2 path (bf16_ab.sh, gemm_calls.sh).
#
# avx2_pin: MC_CPU_ISA (default avx2) and OPENBLAS_CORETYPE (default
# Haswell) exported as bench/avx2/run.sh sets them; either set empty is
# unset instead (the CPU's own choice).
avx2_pin() {
    export MC_CPU_ISA=${MC_CPU_ISA-avx2} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-Haswell}
    [ -n "$MC_CPU_ISA" ] || unset MC_CPU_ISA
    [ -n "$OPENBLAS_CORETYPE" ] || unset OPENBLAS_CORETYPE
}

# cpu_line: the CPU's model name, family and model, and the two pins, on
# one line (every benchmark record names its CPU)
cpu_line() {
    echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')," \
        "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')" \
        "model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')," \
        "MC_CPU_ISA=${MC_CPU_ISA:-} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-}"
}
