/*
 * blas.c - OpenBLAS, loaded with its kernels at the level of mc's CPU path.
 *
 * OpenBLAS (Debian's DYNAMIC_ARCH build) picks its kernels once, in its
 * library constructor, from the CPU's family and model, or from
 * OPENBLAS_CORETYPE when that is set. 0.3.21 does not know every CPU it
 * runs on: on an Emerald Rapids VM (family 6, model 207) it takes its
 * SSE3 "Prescott" kernels, and sgemm runs 3-4x below the AVX-512 kernels
 * the CPU has (bench/RESULTS.md). A library linked to OpenBLAS cannot set
 * the variable in time (OpenBLAS's constructor runs before any code of
 * its users, and a program's .preinit_array cannot add to the environment
 * glibc hands the constructors), so libmc does not link OpenBLAS: the
 * first CPU backend loads it (dlopen) with OPENBLAS_CORETYPE set, for that
 * call only, from mc's path (the CPU's best by CPUID, or MC_CPU_ISA's pin),
 * unless the user has set it. The backend then checks what OpenBLAS took
 * (be->blas_note). MC_OPENBLAS names another OpenBLAS library to load. A
 * process that has OpenBLAS loaded already keeps it as it is.
 */
#include "config.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "kern/backend.h"
#include "kern/cpu/blas.h"
#include "kern/cpu/isa.h"

#ifndef MC_OPENBLAS_LIB
#define MC_OPENBLAS_LIB "libopenblas.so.0"
#endif

mc_cpu_blas_fns mc_cpu_blas_;

/* OpenBLAS's core for mc's path isa, or NULL where OpenBLAS's own choice
 * stands (a CPU whose best is the baseline: it may have AVX without AVX2). */
static const char *core_for(mc_isa isa)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    switch (isa) {
    case MC_ISA_AVX512: return "SkylakeX";
    case MC_ISA_AVX2: return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
    default:
        return mc_cpu_isa_best() > MC_ISA_BASELINE && __builtin_cpu_supports("sse3") ? "Prescott"
                                                                                     : NULL;
    }
#else
    (void)isa;
    return NULL;
#endif
}

static struct {
    pthread_once_t once;
    mc_isa isa;
    const char *lib; /* the library loaded */
    char why[400];
} load = {PTHREAD_ONCE_INIT, MC_ISA_BASELINE, MC_OPENBLAS_LIB, ""};

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p && !load.why[0])
        snprintf(load.why, sizeof load.why, "OpenBLAS (%s) has no %s", load.lib, name);
    return p;
}

static void load_once(void)
{
    /* MC_OPENBLAS names another build (a newer OpenBLAS, say); else the one
     * configure found, else the name on the loader's path */
    const char *user = getenv("MC_OPENBLAS");
    int configured = !user || !*user;
    const char *lib = configured ? MC_OPENBLAS_LIB : user;
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (!h && configured) h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : core_for(load.isa);
        if (core) setenv("OPENBLAS_CORETYPE", core, 1);
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h && configured) {
            (void)dlerror(); /* the configured path's failure is not the message */
            h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
        }
        if (core) unsetenv("OPENBLAS_CORETYPE"); /* children choose for themselves */
    }
    if (!h) {
        const char *e = dlerror();
        snprintf(load.why, sizeof load.why, "cannot load OpenBLAS (%s%s): %s",
                 configured ? "" : "MC_OPENBLAS=", lib, e ? e : "not found");
        return;
    }
    load.lib = lib;
    mc_cpu_blas_.sgemm = (__typeof__(mc_cpu_blas_.sgemm))sym(h, "cblas_sgemm");
    mc_cpu_blas_.sgemv = (__typeof__(mc_cpu_blas_.sgemv))sym(h, "cblas_sgemv");
    mc_cpu_blas_.set_num_threads = (__typeof__(mc_cpu_blas_.set_num_threads))sym(
        h, "openblas_set_num_threads");
    mc_cpu_blas_.get_corename = (__typeof__(mc_cpu_blas_.get_corename))sym(h,
                                                                           "openblas_get_corename");
}

mc_status mc_cpu_blas_load(mc_isa isa, mc_error *err)
{
    load.isa = isa;
    pthread_once(&load.once, load_once);
    if (load.why[0]) return mc_error_set(err, MC_ERR_IO, "kern/cpu: %s", load.why);
    return MC_OK;
}

int mc_cpu_blas_core_level(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    if (!core) return -1;
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (!strcasecmp(core, avx512[i])) return MC_ISA_AVX512;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (!strcasecmp(core, avx2[i])) return MC_ISA_AVX2;
    return MC_ISA_BASELINE;
}

const char *mc_cpu_blas_core(void)
{
    const char *core = mc_cpu_blas_.get_corename ? mc_cpu_blas_.get_corename() : NULL;
    return core && *core ? core : "unknown";
}

void mc_cpu_blas_check(mc_backend *be)
{
    const char *core = mc_cpu_blas_core();
    int level = mc_cpu_blas_core_level(core);
    be->blas_note[0] = 0;
    if (level == (int)be->isa || (be->isa == MC_ISA_BASELINE && level <= 0)) return;
    const char *want = core_for(be->isa), *set = getenv("OPENBLAS_CORETYPE");
    int n = snprintf(
        be->blas_note, sizeof be->blas_note, "OpenBLAS runs its %s kernels on the %s path (%s): %s",
        core, mc_cpu_isa_name(be->isa),
        set ? "OPENBLAS_CORETYPE is set" : "OpenBLAS was loaded before mc could choose",
        level < (int)be->isa ? "its GEMMs are slower than this CPU allows"
                             : "its GEMMs use instructions above the pinned path");
    if (want && n > 0 && (size_t)n < sizeof be->blas_note)
        snprintf(be->blas_note + n, sizeof be->blas_note - (size_t)n,
                 "; OPENBLAS_CORETYPE=%s matches the path", want);
}
