/*
 * dnnl_bf16.h - the declaration of oneDNN's bf16 GEMM. libdnnl exports
 * dnnl_gemm_bf16bf16f32 (C linkage) but the 2.x headers do not declare it;
 * this is its signature in oneDNN's src/common/gemm.cpp. Row-major like
 * dnnl_sgemm: C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, op by 'N'/'T'.
 * Its bfloat16_t is a struct holding one uint16_t, so uint16_t pointers are
 * the same in the ABI.
 */
#ifndef MC_KERN_CPU_DNNL_BF16_H
#define MC_KERN_CPU_DNNL_BF16_H

#include <stdint.h>
#include <dnnl.h>

dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                    dnnl_dim_t K, float alpha, const uint16_t *A, dnnl_dim_t lda,
                                    const uint16_t *B, dnnl_dim_t ldb, float beta, float *C,
                                    dnnl_dim_t ldc);

#endif
