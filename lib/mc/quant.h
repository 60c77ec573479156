/*
 * quant.h - the weight quantizations of mc checkpoints (mc-reshard
 * --quantize), their scales and their inverses. Formats and error bounds in
 * mc-formats(5), QUANTIZED TENSORS; the checkpoint reader dequantizes
 * transparently (ckpt.h).
 *
 *   int8  per output channel (row): scale[r] = absmax(row r) / 127,
 *         q = round(x / scale) in [-127, 127];
 *         |x - q * scale| <= scale / 2 (+ fp32 rounding of the product).
 *   fp8   OCP E4M3FN (bias 7, no infinities, max 448) with one fp32 scale
 *         per tensor, scale = absmax / 448, q = fp8(x / scale), rounded to
 *         nearest even and saturating at 448;
 *         |x - dq| <= max(|x| / 16, scale / 1024) (+ fp32 rounding).
 *   int4  group-wise along rows: groups of group_size consecutive elements
 *         of a row (the last group of a row may be shorter);
 *         scale = absmax(group) / 7, q = round(x / scale) in [-7, 7],
 *         two per byte (element 2j in the low nibble of byte j of its row,
 *         2j + 1 in the high nibble, two's complement);
 *         |x - q * scale| <= scale / 2 (+ fp32 rounding of the product).
 *
 * q is computed in double from the stored (fp32) scale, so it is the
 * nearest level to x for that scale: the bound holds for the scale that is
 * stored, not only for the exact one. Rounding is to nearest, ties away
 * from zero (int8, int4) or to even (fp8). A zero row, group or tensor has
 * scale 0 and dequantizes to exact zeros. Non-finite inputs (NaN, +-inf)
 * cannot be quantized: the functions refuse them and report the first
 * element's index (a checkpoint holding them is broken anyway).
 */
#ifndef MC_QUANT_H
#define MC_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MC_FP8_E4M3_MAX 448.0f

/* fp32 -> E4M3FN bits, round to nearest even, saturating at +-448; NaN
 * becomes 0x7f (with the sign). */
uint8_t mc_fp8_e4m3_from_f32(float x);
float mc_fp8_e4m3_to_f32(uint8_t b);

/* Each quantizer returns -1 when every element is finite, else the index
 * (row-major) of the first element that is not (outputs then undefined). */

/* x[rows * cols] -> q[rows * cols], scale[rows]. */
int64_t mc_quant_int8(const float *x, int64_t rows, int64_t cols, int8_t *q, float *scale);
/* x[n] -> q[n] (E4M3FN bits), *scale. */
int64_t mc_quant_fp8(const float *x, int64_t n, uint8_t *q, float *scale);
/* Number of groups per row: ceil(cols / group_size). */
int64_t mc_quant_int4_groups(int64_t cols, int64_t group_size);
/* x[rows * cols] -> q[rows * cols] (unpacked, -7..7),
 * scale[rows * mc_quant_int4_groups(cols, group_size)]. */
int64_t mc_quant_int4(const float *x, int64_t rows, int64_t cols, int64_t group_size, int8_t *q,
                      float *scale);

/* Pack int4 values (-8..7) two per byte along each row: packed holds
 * rows * ((cols + 1) / 2) bytes; an odd row's last high nibble is 0. */
void mc_int4_pack(const int8_t *q, int64_t rows, int64_t cols, uint8_t *packed);
/* The value of element `col` in a packed row. */
static inline int mc_int4_get(const uint8_t *row, int64_t col)
{
    unsigned b = row[col >> 1];
    unsigned nib = (col & 1) ? b >> 4 : b & 15u;
    return (int)(nib ^ 8u) - 8;
}

#ifdef __cplusplus
}
#endif
#endif
