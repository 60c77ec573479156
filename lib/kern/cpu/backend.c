/*
 * backend.c - the CPU backend object: thread count (OpenMP and OpenBLAS),
 * backend memory (64-byte aligned, zero-filled host memory), copies, and the
 * scratch buffers the kernels reuse from call to call. The public mc_b*
 * functions of kern.h reach these through lib/kern/dispatch.c.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <cpuid.h>
/* OpenBLAS pulls in <complex.h>, whose macro I would eat kern.h's size I */
#undef I
#include "kern/cpu/blas.h"
#include "kern/cpu/cpu.h"
#include "kern/cpu/dnnl_bf16.h"
#include "kern/cpu/isa.h"

static size_t round_up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Whether the CPU has bf16 dot-product instructions: AVX512_BF16 (CPUID
 * leaf 7 subleaf 1, EAX bit 5) or AMX-BF16 (leaf 7 subleaf 0, EDX bit 22).
 * Without them oneDNN still runs its bf16 GEMM on AVX-512, by widening to
 * fp32 inside the kernel, at a fraction of sgemm's speed (10-32 GFLOP/s
 * against 60 on a 2-vCPU AVX-512 VM without them; bench/RESULTS.md): there
 * mc emulates bf16 itself (operands rounded, then sgemm), which is the same
 * arithmetic at sgemm's speed. */
static int cpu_has_bf16(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) return 1;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22))) return 1;
    return 0;
}

/* oneDNN implements its bf16 GEMM only for some CPUs (AVX512 and up in the
 * 2.x series); elsewhere it returns an error. Try it once on a 2x2 product
 * with a known answer so the linear kernels know whether to widen to fp32. */
static int probe_dnnl_bf16(void)
{
    uint16_t a[4], b[4];
    float c[4] = {0};
    const float av[4] = {1, 2, 3, 4}, bv[4] = {1, 0, 0, 1};
    for (int i = 0; i < 4; i++) {
        a[i] = mc_f32_to_bf16(av[i]);
        b[i] = mc_f32_to_bf16(bv[i]);
    }
    if (dnnl_gemm_bf16bf16f32('N', 'N', 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2) != 0) return 0;
    return c[0] == 1 && c[1] == 2 && c[2] == 3 && c[3] == 4;
}

mc_status mc_backend_cpu_check_env(mc_error *err)
{
    mc_isa isa;
    return mc_cpu_isa_choose(&isa, err);
}

mc_status mc_backend_cpu_new(int threads, mc_backend **out, mc_error *err)
{
    *out = NULL;
    mc_isa isa;
    mc_status st = mc_cpu_isa_choose(&isa, err);
    if (st) return st;
    /* A pinned path pins oneDNN too (its bf16 GEMM needs AVX-512, so on the
     * avx2 path bf16 is emulated as on an AVX2 machine). oneDNN takes the
     * limit once, before its first kernel; later calls change nothing. */
    if ((st = mc_cpu_blas_load(isa, err))) return st;
    if (isa < mc_cpu_isa_best())
        dnnl_set_max_cpu_isa(isa == MC_ISA_AVX2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41);
    mc_backend *be = calloc(1, sizeof *be);
    if (!be) return mc_error_set(err, MC_ERR_NOMEM, "kern/cpu: out of memory creating the backend");
    if (threads <= 0) threads = omp_get_num_procs();
    if (threads <= 0) threads = 1;
    be->kind = MC_BACKEND_CPU;
    be->name = "cpu";
    be->threads = threads;
    be->isa = isa;
    /* The kernels' parallel regions also say num_threads(be->threads); these
     * two calls make the libraries (oneDNN follows OpenMP) use the same. */
    omp_set_num_threads(threads);
    mc_cpu_blas_.set_num_threads(threads);
    mc_cpu_blas_check(be);
    int native = isa == MC_ISA_AVX512 && cpu_has_bf16();
    be->dnnl_bf16 = native && probe_dnnl_bf16();
    /* MC_BF16_PANELS=0: emulated bf16 through sgemm on rounded fp32 copies,
     * as before b16gemm.c (for comparisons) */
    const char *pan = getenv("MC_BF16_PANELS");
    be->b16_panels = !(pan && !strcmp(pan, "0"));
    if (!be->dnnl_bf16)
        snprintf(be->bf16_note, sizeof be->bf16_note, "bf16 is emulated on the %s path (%s): %s",
                 mc_cpu_isa_name(isa),
                 isa != MC_ISA_AVX512 ? "no bf16 GEMM"
                 : !native            ? "the CPU has no AVX512_BF16 or AMX-BF16 instructions"
                                      : "oneDNN has no bf16 GEMM for this CPU",
                 mc_cpu_b16_panels(be, MC_PREC_BF16)
                     ? "weights are kept as bf16 panels widened in registers, activations "
                       "rounded to bf16 and multiplied in fp32"
                     : "operands are rounded to bf16 and multiplied by the fp32 GEMM, no faster "
                       "than fp32");
    *out = be;
    return MC_OK;
}

void mc_cpu_backend_free(mc_backend *be)
{
    if (!be) return;
    for (int i = 0; i < MC_CPU_SCRATCH_N; i++) free(be->scratch[i]);
    free(be);
}

void *mc_cpu_scratch(mc_backend *be, int slot, size_t bytes)
{
    assert(slot >= 0 && slot < MC_CPU_SCRATCH_N);
    if (bytes <= be->scratch_cap[slot]) return be->scratch[slot];
    /* grow by half again so a slowly growing size does not reallocate often */
    size_t cap = round_up64(bytes + bytes / 2);
    void *p = aligned_alloc(64, cap);
    if (!p) abort(); /* see cpu.h: a kernel has no way to report failure */
    free(be->scratch[slot]);
    be->scratch[slot] = p;
    be->scratch_cap[slot] = cap;
    return p;
}

#define ZERO_CHUNK ((size_t)1 << 20)

void *mc_cpu_balloc(mc_backend *be, size_t bytes, mc_error *err)
{
    size_t n = round_up64(bytes ? bytes : 1);
    if (n < bytes) {
        mc_error_set(err, MC_ERR_NOMEM, "kern/cpu: allocation of %zu bytes overflows", bytes);
        return NULL;
    }
    void *p = aligned_alloc(64, n);
    if (!p) {
        mc_error_set(err, MC_ERR_NOMEM, "kern/cpu: out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    /* Zeroed by all threads: the first touch of each page (a fault and the
     * kernel clearing it) is what costs at start-up for the gigabytes of
     * parameters, gradients and optimizer state, and it runs in parallel. */
    size_t nb = (n + ZERO_CHUNK - 1) / ZERO_CHUNK;
#pragma omp parallel for num_threads(be->threads) if (nb > 1) schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t off = b * ZERO_CHUNK, len = n - off < ZERO_CHUNK ? n - off : ZERO_CHUNK;
        memset((char *)p + off, 0, len);
    }
    return p;
}

void mc_cpu_bfree(mc_backend *be, void *p)
{
    (void)be;
    free(p);
}

void mc_cpu_bcopy_from_host(mc_backend *be, void *dst, const void *host, size_t bytes)
{
    (void)be;
    if (bytes) memmove(dst, host, bytes);
}

void mc_cpu_bcopy_to_host(mc_backend *be, void *host, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memmove(host, src, bytes);
}

void mc_cpu_bcopy(mc_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}

void mc_cpu_bsync(mc_backend *be) { (void)be; }
