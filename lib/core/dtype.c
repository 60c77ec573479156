/*
 * dtype.c - element sizes and numpy names of Megatron's indexed-dataset
 * dtype codes (1..8; see dtype.h).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/dtype.h"

static const struct {
    size_t size;
    const char *name;
} dtypes[] = {
    [MC_DTYPE_U8] = {1, "uint8"},    [MC_DTYPE_I8] = {1, "int8"},
    [MC_DTYPE_I16] = {2, "int16"},   [MC_DTYPE_I32] = {4, "int32"},
    [MC_DTYPE_I64] = {8, "int64"},   [MC_DTYPE_F64] = {8, "float64"},
    [MC_DTYPE_F32] = {4, "float32"}, [MC_DTYPE_U16] = {2, "uint16"},
};

size_t mc_dtype_size(int code)
{
    if (code < MC_DTYPE_U8 || code > MC_DTYPE_U16) return 0;
    return dtypes[code].size;
}

const char *mc_dtype_name(int code)
{
    if (code < MC_DTYPE_U8 || code > MC_DTYPE_U16) return NULL;
    return dtypes[code].name;
}
