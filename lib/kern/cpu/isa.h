/*
 * isa.h - private to the CPU backend: the code paths of the CPU kernels and
 * how a kernel is compiled once per path. A path is a level of the x86-64
 * instruction set: baseline (x86-64, SSE2), avx2 (x86-64-v3: AVX2, FMA) and
 * avx512 (x86-64-v4: AVX-512 F/BW/DQ/VL). The backend picks one when it is
 * created (the CPU's best, or MC_CPU_ISA's choice, never above the CPU) and
 * keeps it in be->isa; kernels call the variant for be->isa, so a test can
 * run the AVX2 and baseline paths on an AVX-512 machine.
 *
 * A kernel with variants is written once as NAME_body(PARAMS..., int isa),
 * always inlined, and MC_ISA_VARIANTS compiles it three times, each with
 * its target and with isa a constant (so `if (isa == MC_ISA_AVX2)` picks
 * register tiles at compile time). Within a path, bits do not depend on the
 * thread count; across paths they are the same wherever a kernel says so
 * (attention, norms, activations, AdamW, reductions: fixed summation
 * orders, no contraction) and otherwise within the tolerances of
 * doc/ARCHITECTURE.md.
 */
#ifndef MC_KERN_CPU_ISA_H
#define MC_KERN_CPU_ISA_H

#include "kern/backend.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define MC_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define MC_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define MC_TARGET_AVX512
#define MC_TARGET_AVX2
#endif

/* The body every variant inlines; MC_ISA_UNUSED marks its isa parameter
 * where the body is the same code on every path (only the target differs). */
#define MC_ISA_BODY static inline __attribute__((always_inline))
#define MC_ISA_UNUSED __attribute__((unused))

#define MC_ISA_UNPAREN(...) __VA_ARGS__

/* NAME_avx512, NAME_avx2 and NAME_baseline from NAME_body, and NAME_for(isa),
 * the one to call. PARAMS and ARGS are parenthesized lists without the
 * trailing isa. */
#define MC_ISA_VARIANTS(ret, name, params, args)                  \
    MC_TARGET_AVX512 static ret name##_avx512 params              \
    {                                                             \
        return name##_body(MC_ISA_UNPAREN args, MC_ISA_AVX512);   \
    }                                                             \
    MC_TARGET_AVX2 static ret name##_avx2 params                  \
    {                                                             \
        return name##_body(MC_ISA_UNPAREN args, MC_ISA_AVX2);     \
    }                                                             \
    static ret name##_baseline params                             \
    {                                                             \
        return name##_body(MC_ISA_UNPAREN args, MC_ISA_BASELINE); \
    }                                                             \
    typedef ret(*name##_fn) params;                               \
    static inline name##_fn name##_for(int isa)                   \
    {                                                             \
        return isa >= MC_ISA_AVX512 ? name##_avx512               \
               : isa >= MC_ISA_AVX2 ? name##_avx2                 \
                                    : name##_baseline;            \
    }

/* The same for a body returning void. */
#define MC_ISA_VARIANTS_VOID(name, params, args)                                              \
    MC_TARGET_AVX512 static void name##_avx512 params                                         \
    {                                                                                         \
        name##_body(MC_ISA_UNPAREN args, MC_ISA_AVX512);                                      \
    }                                                                                         \
    MC_TARGET_AVX2 static void name##_avx2 params                                             \
    {                                                                                         \
        name##_body(MC_ISA_UNPAREN args, MC_ISA_AVX2);                                        \
    }                                                                                         \
    static void name##_baseline params { name##_body(MC_ISA_UNPAREN args, MC_ISA_BASELINE); } \
    typedef void(*name##_fn) params;                                                          \
    static inline name##_fn name##_for(int isa)                                               \
    {                                                                                         \
        return isa >= MC_ISA_AVX512 ? name##_avx512                                           \
               : isa >= MC_ISA_AVX2 ? name##_avx2                                             \
                                    : name##_baseline;                                        \
    }

/* The path for a new backend: the CPU's best, or MC_CPU_ISA's (auto,
 * baseline, avx2, avx512). A value that is not one of those, or a path the
 * CPU does not have, is MC_ERR_USAGE naming it. */
mc_status mc_cpu_isa_choose(mc_isa *isa, mc_error *err);
/* The CPU's best path. */
mc_isa mc_cpu_isa_best(void);
/* "baseline", "avx2", "avx512" */
const char *mc_cpu_isa_name(mc_isa isa);

#endif
