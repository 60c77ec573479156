/*
 * h5zstd.c - the zstd HDF5 filter (id 32015) with the chunk format of the
 * public HDF5 zstd plugin (HDF5Plugin-Zstandard, also shipped by Python's
 * hdf5plugin): each chunk is stored as ONE plain zstd frame whose header
 * carries the decompressed size; cd_values[0], when present, is the
 * compression level as a 32-bit two's-complement integer (hdf5plugin's
 * Zstd(clevel) stores negative levels that way). No header of our own, so
 * files written here read with hdf5plugin and the other way round.
 *
 * Debian ships no such plugin, hence a built-in registration.
 */
#include "config.h"

#include <hdf5.h>
#include <stdint.h>
#include <zstd.h>

#include "ckpt/h5zstd.h"

/* HDF5's own chunk limit; a frame claiming more is corrupt. */
#define CHUNK_MAX ((unsigned long long)0xffffffffu)

static size_t zstd_filter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                          size_t nbytes, size_t *buf_size, void **buf)
{
    void *out;
    size_t cap, n;
    if (flags & H5Z_FLAG_REVERSE) {
        unsigned long long size = ZSTD_getFrameContentSize(*buf, nbytes);
        /* The plugin always writes the size into the frame header; a frame
         * without one (or no frame at all) is not a chunk of this format. */
        if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR || size > CHUNK_MAX)
            return 0;
        cap = size ? (size_t)size : 1;
        if (!(out = H5allocate_memory(cap, 0))) return 0;
        n = ZSTD_decompress(out, (size_t)size, *buf, nbytes);
        if (ZSTD_isError(n) || n != size) {
            H5free_memory(out);
            return 0;
        }
    } else {
        int level = cd_nelmts > 0 ? (int)(int32_t)cd_values[0] : ZSTD_CLEVEL_DEFAULT;
        if (level == 0) level = ZSTD_CLEVEL_DEFAULT;
        if (level < ZSTD_minCLevel()) level = ZSTD_minCLevel();
        if (level > ZSTD_maxCLevel()) level = ZSTD_maxCLevel();
        cap = ZSTD_compressBound(nbytes);
        if (!(out = H5allocate_memory(cap, 0))) return 0;
        n = ZSTD_compress(out, cap, *buf, nbytes, level);
        if (ZSTD_isError(n)) {
            H5free_memory(out);
            return 0;
        }
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = cap;
    return n;
}

static const H5Z_class2_t zstd_class = {
    H5Z_CLASS_T_VERS,
    (H5Z_filter_t)MC_H5Z_FILTER_ZSTD,
    1, /* encoder present */
    1, /* decoder present */
    "zstd (format of the HDF5 zstd plugin)",
    NULL, /* can_apply: any type */
    NULL, /* set_local: cd_values as given */
    zstd_filter,
};

mc_status mc_h5zstd_register(mc_error *err)
{
    if (H5Zregister(&zstd_class) < 0)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "HDF5 refused to register the zstd filter (32015)");
    return MC_OK;
}
