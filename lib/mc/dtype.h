/*
 * dtype.h - element types, numbered as Megatron's indexed dataset numbers them
 * (megatron/core/datasets/indexed_dataset.py, DType), so the codes written in
 * a .idx file are these values.
 */
#ifndef MC_DTYPE_H
#define MC_DTYPE_H

#include <stddef.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_dtype {
    MC_DTYPE_U8 = 1,
    MC_DTYPE_I8 = 2,
    MC_DTYPE_I16 = 3,
    MC_DTYPE_I32 = 4,
    MC_DTYPE_I64 = 5,
    MC_DTYPE_F64 = 6,
    MC_DTYPE_F32 = 7,
    MC_DTYPE_U16 = 8
} mc_dtype;

/* Size in bytes of one element; 0 for an unknown code. */
size_t mc_dtype_size(int code);
/* numpy's name ("uint16"); NULL for an unknown code. */
const char *mc_dtype_name(int code);

#ifdef __cplusplus
}
#endif
#endif
