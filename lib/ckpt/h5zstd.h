/*
 * h5zstd.h - HDF5 filter 32015 (zstd), registered by libmc itself (private).
 */
#ifndef MC_CKPT_H5ZSTD_H
#define MC_CKPT_H5ZSTD_H

#include "mc/status.h"

#define MC_H5Z_FILTER_ZSTD 32015

/* Register the filter with the HDF5 library (idempotent; the library keeps
 * one table per process, so this is not mc state). */
mc_status mc_h5zstd_register(mc_error *err);

#endif
