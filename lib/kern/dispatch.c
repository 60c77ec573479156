/*
 * dispatch.c - the public kern.h functions: each routes on the backend's kind
 * (kern/backend.h) to the CPU implementation (kern/cpu, mc_cpu_*) or the CUDA
 * one (kern/cuda, mc_cuda_*, compiled in when configure found the toolkit:
 * Makefile.am then defines MC_CUDA_BACKEND). Model and training code call
 * only kern.h, so the same code runs on either backend; the CPU backend is
 * the reference. Adding a kernel: doc/ARCHITECTURE.md, section 6.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include "kern/backend.h"
#include "kern/cpu/blas.h"
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"
#ifdef MC_CUDA_BACKEND
#include "kern/cuda/cuda.h"
#endif

#ifdef MC_CUDA_BACKEND
#define IS_CUDA(be) ((be)->kind == MC_BACKEND_CUDA)
#define ROUTE(fn, ...)                           \
    do {                                         \
        if (IS_CUDA(be))                         \
            mc_cuda_##fn(be->cuda, __VA_ARGS__); \
        else                                     \
            mc_cpu_##fn(be, __VA_ARGS__);        \
    } while (0)
#define ROUTE_RET(fn, ...) \
    return IS_CUDA(be) ? mc_cuda_##fn(be->cuda, __VA_ARGS__) : mc_cpu_##fn(be, __VA_ARGS__)
#else
#define IS_CUDA(be) 0
#define ROUTE(fn, ...) mc_cpu_##fn(be, __VA_ARGS__)
#define ROUTE_RET(fn, ...) return mc_cpu_##fn(be, __VA_ARGS__)
#endif

/* A kernel with no CUDA implementation yet (CPU_ONLY): a bug to reach on a
 * GPU, so it aborts (kernels cannot return a status, kern.h) with the
 * kernel's name. */
static void no_cuda_kernel(const char *fn) __attribute__((noreturn, unused));
static void no_cuda_kernel(const char *fn)
{
    fprintf(stderr, "mc: kern: mc_k_%s has no CUDA implementation\n", fn);
    abort();
}

/* ------------------------------------------------------------ backend */

#ifndef MC_CUDA_BACKEND
mc_status mc_backend_cuda_new(int device, mc_backend **out, mc_error *err)
{
    (void)device;
    *out = NULL;
    return mc_error_set(err, MC_ERR_IO, "this mc was built without the CUDA backend");
}

int mc_backend_cuda_devices(void) { return 0; }
#else
mc_status mc_backend_cuda_new(int device, mc_backend **out, mc_error *err)
{
    *out = NULL;
    mc_backend *be = calloc(1, sizeof *be);
    if (!be)
        return mc_error_set(err, MC_ERR_NOMEM, "kern/cuda: out of memory creating the backend");
    be->kind = MC_BACKEND_CUDA;
    be->name = "cuda";
    be->threads = 1;
    mc_status st = mc_cuda_new(device, &be->cuda, err);
    if (st) {
        free(be);
        return st;
    }
    *out = be;
    return MC_OK;
}

int mc_backend_cuda_devices(void) { return mc_cuda_device_count(); }
#endif

void mc_backend_free(mc_backend *be)
{
    if (!be) return;
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) {
        mc_cuda_free(be->cuda);
        free(be);
        return;
    }
#endif
    mc_cpu_backend_free(be);
}

const char *mc_backend_name(const mc_backend *be) { return be->name; }

void mc_backend_set_attention_prec(mc_backend *be, mc_prec prec)
{
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) mc_cuda_set_attention_prec(be->cuda, prec);
#else
    (void)be;
    (void)prec;
#endif
}

int mc_backend_threads(const mc_backend *be) { return be->threads; }

void mc_backend_fp8_gemm_stats(const mc_backend *be, size_t *fp8, size_t *fallback)
{
    *fp8 = *fallback = 0;
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) mc_cuda_fp8_gemm_stats(be->cuda, fp8, fallback);
#else
    (void)be;
#endif
}

double mc_backend_mem_available(const mc_backend *be, char *what, size_t cap)
{
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) return mc_cuda_mem_available(be->cuda, what, cap);
#else
    (void)be;
#endif
    struct sysinfo si;
    if (cap) snprintf(what, cap, "this machine (RAM and swap)");
    if (sysinfo(&si) != 0) return 0;
    double unit = si.mem_unit ? (double)si.mem_unit : 1.0;
    return ((double)si.totalram + (double)si.totalswap) * unit;
}

const char *mc_backend_isa(const mc_backend *be)
{
    return IS_CUDA(be) ? "cuda" : mc_cpu_isa_name(be->isa);
}

int mc_backend_bf16_emulated(const mc_backend *be) { return !IS_CUDA(be) && !be->dnnl_bf16; }

const char *mc_backend_bf16_note(const mc_backend *be)
{
    if (!mc_backend_bf16_emulated(be)) return NULL;
    return be->bf16_note;
}

const char *mc_backend_blas_core(const mc_backend *be)
{
    (void)be;
    return IS_CUDA(be) ? NULL : mc_cpu_blas_core();
}

const char *mc_backend_blas_note(const mc_backend *be)
{
    return IS_CUDA(be) || !be->blas_note[0] ? NULL : be->blas_note;
}

size_t mc_backend_weight_bytes(const mc_backend *be, mc_prec prec)
{
    if (IS_CUDA(be) || prec == MC_PREC_FP32) return 0;
    return prec == MC_PREC_BF16 && be->dnnl_bf16 ? 2 : 4;
}

int mc_backend_weight_panels(const mc_backend *be, mc_prec prec)
{
    return !IS_CUDA(be) && mc_cpu_b16_panels(be, prec);
}

int mc_backend_is_device(const mc_backend *be) { return be && IS_CUDA(be); }

void *mc_backend_stream(mc_backend *be, mc_stream which)
{
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be))
        return which == MC_STREAM_COMM ? mc_cuda_comm_stream(be->cuda) : mc_cuda_stream(be->cuda);
#endif
    (void)be;
    (void)which;
    return NULL;
}

void mc_backend_stream_wait(mc_backend *be, mc_stream waiter, mc_stream signaler)
{
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) mc_cuda_stream_wait(be->cuda, (int)waiter, (int)signaler);
#endif
    (void)be;
    (void)waiter;
    (void)signaler;
}

void *mc_balloc(mc_backend *be, size_t bytes, mc_error *err) { ROUTE_RET(balloc, bytes, err); }

void mc_bfree(mc_backend *be, void *p) { ROUTE(bfree, p); }

void mc_bcopy_from_host(mc_backend *be, void *dst, const void *host, size_t bytes)
{
    ROUTE(bcopy_from_host, dst, host, bytes);
}

void mc_bcopy_to_host(mc_backend *be, void *host, const void *src, size_t bytes)
{
    ROUTE(bcopy_to_host, host, src, bytes);
}

void mc_bcopy(mc_backend *be, void *dst, const void *src, size_t bytes)
{
    ROUTE(bcopy, dst, src, bytes);
}

void mc_bsync(mc_backend *be)
{
#ifdef MC_CUDA_BACKEND
    if (IS_CUDA(be)) {
        mc_cuda_bsync(be->cuda);
        return;
    }
#endif
    mc_cpu_bsync(be);
}

/* ------------------------------------------------------------ kernels */

/* The wrappers of the kernel list: one mc_k_NAME per entry of
 * mc/kern_ops.def, routed by its backends (CPU_CUDA or CPU_ONLY); RETURN_
 * of the entry's return type is what precedes the call. A return type other
 * than void, int and double needs its RETURN_ line here. */
#define RETURN_void
#define RETURN_int return
#define RETURN_double return
#define RETURN_float return
#ifdef MC_CUDA_BACKEND
#define ROUTE_CPU_CUDA(ret, fn, ...)                          \
    do {                                                      \
        if (IS_CUDA(be))                                      \
            RETURN_##ret mc_cuda_##fn(be->cuda, __VA_ARGS__); \
        else                                                  \
            RETURN_##ret mc_cpu_##fn(be, __VA_ARGS__);        \
    } while (0)
#else
#define ROUTE_CPU_CUDA(ret, fn, ...) RETURN_##ret mc_cpu_##fn(be, __VA_ARGS__)
#endif
#define ROUTE_CPU_ONLY(ret, fn, ...)               \
    do {                                           \
        if (IS_CUDA(be)) no_cuda_kernel(#fn);      \
        RETURN_##ret mc_cpu_##fn(be, __VA_ARGS__); \
    } while (0)

#define MC_KERNEL(name, ret, params, args, backends)        \
    ret mc_k_##name(mc_backend *be, MC_KERN_UNPAREN params) \
    {                                                       \
        ROUTE_##backends(ret, name, MC_KERN_UNPAREN args);  \
    }
#include "mc/kern_ops.def"

double mc_rope_inv_freq(const mc_rope *r, size_t d, size_t i)
{
    size_t R = r->rot_dim > 0 ? (size_t)r->rot_dim : d;
    double inv = pow((double)r->base, -2.0 * (double)i / (double)R);
    if (!r->scaling) return inv;
    double L = (double)r->original_max_position_embeddings;
    double lo = (double)r->low_freq_factor, hi = (double)r->high_freq_factor;
    double f = (double)r->factor, wavelen = 2.0 * M_PI / inv;
    if (wavelen < L / hi) return inv;     /* high frequencies: kept */
    if (wavelen > L / lo) return inv / f; /* low frequencies: slowed by the factor */
    double s = (L / wavelen - lo) / (hi - lo);
    return (1.0 - s) * inv / f + s * inv;
}
