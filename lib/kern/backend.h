/*
 * backend.h - the backend object every backend shares, private to lib/kern
 * (the dispatcher, kern/cpu, and the C side of kern/cuda). kern.h keeps
 * struct mc_backend opaque; here it is defined once, with the kind the
 * dispatcher (dispatch.c) routes on.
 */
#ifndef MC_KERN_BACKEND_H
#define MC_KERN_BACKEND_H

#include <stddef.h>
#include "mc/kern.h"

typedef enum mc_backend_kind { MC_BACKEND_CPU = 0, MC_BACKEND_CUDA = 1 } mc_backend_kind;

/* The CUDA backend's state (kern/cuda/cuda.h); opaque to everyone else. */
typedef struct mc_cuda mc_cuda;

/* The CPU kernels' code paths (kern/cpu/isa.h), in order. */
typedef enum mc_isa { MC_ISA_BASELINE = 0, MC_ISA_AVX2 = 1, MC_ISA_AVX512 = 2 } mc_isa;

#define MC_BACKEND_SCRATCH_SLOTS 6

struct mc_backend {
    mc_backend_kind kind; /* what dispatch.c routes on */
    const char *name;     /* "cpu", "cuda" */
    int threads;          /* host threads of the CPU kernels (1 for CUDA) */
    /* CPU backend (kern/cpu) */
    mc_isa isa;          /* the kernels' code path (kern/cpu/isa.h) */
    int dnnl_bf16;       /* 1 when oneDNN's bf16 GEMM ran at creation */
    int b16_panels;      /* 0 when MC_BF16_PANELS=0 (b16gemm.c) */
    char bf16_note[256]; /* mc_backend_bf16_note's line where it is 0 */
    char blas_note[320]; /* mc_backend_blas_note's line; "" when OpenBLAS matches isa */
    /* 64-byte aligned, grown on demand, never shrunk; slots in cpu.h */
    void *scratch[MC_BACKEND_SCRATCH_SLOTS];
    size_t scratch_cap[MC_BACKEND_SCRATCH_SLOTS];
    /* CUDA backend (kern/cuda): streams, cuBLASLt handle, allocator */
    mc_cuda *cuda;
};

#endif
