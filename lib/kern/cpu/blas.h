/*
 * blas.h - private to the CPU backend: OpenBLAS's functions, loaded by the
 * first CPU backend with its kernels at the level of mc's path (blas.c).
 */
#ifndef MC_KERN_CPU_BLAS_H
#define MC_KERN_CPU_BLAS_H

#include <cblas.h>
/* OpenBLAS pulls in <complex.h>, whose macro I would eat kern.h's size I */
#undef I
#include "kern/backend.h"
#include "mc/status.h"

typedef struct mc_cpu_blas_fns {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    __typeof__(openblas_set_num_threads) *set_num_threads;
    __typeof__(openblas_get_corename) *get_corename;
} mc_cpu_blas_fns;

/* Set by mc_cpu_blas_load; valid once a CPU backend exists. */
extern mc_cpu_blas_fns mc_cpu_blas_;

/* Loads OpenBLAS once per process for path isa (the first call's path
 * decides); an error names the library when it cannot be loaded. */
mc_status mc_cpu_blas_load(mc_isa isa, mc_error *err);
/* The path of an OpenBLAS core name (openblas_get_corename's), this
 * process's OpenBLAS core, and the backend's check of the two against
 * be->isa (be->blas_note). */
int mc_cpu_blas_core_level(const char *core);
const char *mc_cpu_blas_core(void);
void mc_cpu_blas_check(mc_backend *be);

#endif
