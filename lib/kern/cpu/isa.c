/*
 * isa.c - which code path the CPU kernels take (isa.h): the CPU's best, or
 * the one MC_CPU_ISA pins, never above what the CPU has.
 */
#include <stdlib.h>
#include <string.h>
#include "kern/cpu/isa.h"

static const char *const isa_names[] = {"baseline", "avx2", "avx512"};

mc_isa mc_cpu_isa_best(void)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    /* GCC 12 knows the levels themselves (every feature of each) */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return MC_ISA_AVX512;
    if (__builtin_cpu_supports("x86-64-v3")) return MC_ISA_AVX2;
#elif defined(__clang__) && defined(__x86_64__)
    /* clang 14 (the fuzzing builds) knows only features: those of each
     * level that clang 14 can test (F16C and MOVBE come with AVX2 on every
     * CPU that has it) */
    __builtin_cpu_init();
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    if (v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd"))
        return MC_ISA_AVX512;
    if (v3) return MC_ISA_AVX2;
#endif
    return MC_ISA_BASELINE;
}

mc_status mc_cpu_isa_choose(mc_isa *isa, mc_error *err)
{
    mc_isa best = mc_cpu_isa_best();
    *isa = best;
    const char *want = getenv("MC_CPU_ISA");
    if (!want || !*want || !strcmp(want, "auto")) return MC_OK;
    for (int i = 0; i <= MC_ISA_AVX512; i++) {
        if (strcmp(want, isa_names[i])) continue;
        if (i > (int)best)
            return mc_error_set(err, MC_ERR_USAGE,
                                "MC_CPU_ISA=%s: this CPU has no %s path (its best is %s)", want,
                                want, isa_names[best]);
        *isa = (mc_isa)i;
        return MC_OK;
    }
    return mc_error_set(err, MC_ERR_USAGE, "MC_CPU_ISA=%s: expected auto, baseline, avx2 or avx512",
                        want);
}

const char *mc_cpu_isa_name(mc_isa isa)
{
    return isa >= MC_ISA_BASELINE && isa <= MC_ISA_AVX512 ? isa_names[isa] : "?";
}
