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
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return MC_ISA_AVX512;
    if (__builtin_cpu_supports("x86-64-v3")) return MC_ISA_AVX2;
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
