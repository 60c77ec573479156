/*
 * tfevents.h - private to libmc: TensorBoard event files (TFRecord framing
 * of hand-encoded `tensorboard.Event` protobufs) and the JSON-lines metrics
 * log. mc_metrics (metrics.c) sits on top; the encoders are exposed here so
 * the unit tests can check them byte for byte.
 */
#ifndef MC_FMT_TFEVENTS_H
#define MC_FMT_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>
#include "mc/buf.h"
#include "mc/status.h"

/* ---- TFRecord ----------------------------------------------------------- */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * TFRecord; extend with crc = mc_crc32c_extend(crc, p, n) from crc 0. */
uint32_t mc_crc32c_extend(uint32_t crc, const void *p, size_t n);
uint32_t mc_crc32c(const void *p, size_t n);
/* TFRecord's masking: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t mc_crc32c_mask(uint32_t crc);

/* Append one record: uint64 length (little-endian), masked CRC of those 8
 * bytes, the data, masked CRC of the data. */
mc_status mc_tfrecord_append(mc_buf *out, const void *data, size_t n, mc_error *err);

/* ---- Event protobufs ---------------------------------------------------- */

/* Field numbers of tensorboard/compat/proto/event.proto and summary.proto:
 * Event { double wall_time = 1; int64 step = 2; oneof what { string
 * file_version = 3; Summary summary = 5; ... } }, Summary { repeated Value
 * value = 1; }, Value { string tag = 1; oneof value { float simple_value =
 * 2; ... } }. */

/* Append the serialized Event{wall_time, file_version: "brain.Event:2"}. */
mc_status mc_tfevent_encode_version(mc_buf *out, double wall_time, mc_error *err);

/* Append the serialized Event{wall_time, step, summary: n simple values}.
 * Values are rounded to float32, as simple_value is a float. Zero wall_time
 * and step are omitted, as proto3 omits default values, so the bytes equal
 * what protobuf itself serializes. */
mc_status mc_tfevent_encode_scalars(mc_buf *out, double wall_time, int64_t step,
                                    const char *const *tags, const double *values, size_t n,
                                    mc_error *err);

/* ---- the event file ----------------------------------------------------- */

typedef struct mc_tfevents {
    int fd;
    char *path;
    double last_sync; /* wall time of the last fsync */
} mc_tfevents;

/* Create dir (and its parents) when missing, then create a new event file
 * named as TensorBoard names it, and write the file_version record. */
mc_status mc_tfevents_open(mc_tfevents *w, const char *dir, double wall_time, mc_error *err);
/* Write already-framed records; fsync when MC_METRICS_SYNC_SECONDS passed. */
mc_status mc_tfevents_write(mc_tfevents *w, const void *data, size_t n, double now, mc_error *err);
/* fsync and close; safe to call again (fd is then -1). */
mc_status mc_tfevents_close(mc_tfevents *w, mc_error *err);

/* ---- JSON lines --------------------------------------------------------- */

/* Append a JSON string literal for s (quotes and escapes). */
mc_status mc_jsonlog_string(mc_buf *out, const char *s, mc_error *err);
/* Append a double with the fewest digits that read back as the same double;
 * NaN and infinities as null. */
mc_status mc_jsonlog_number(mc_buf *out, double v, mc_error *err);

typedef struct mc_jsonlog {
    int fd;
    char *path;
} mc_jsonlog;

/* Open path for appending (created when missing). When the file ends in a
 * partial line (a run killed mid-write), the next line starts on its own. */
mc_status mc_jsonlog_open(mc_jsonlog *j, const char *path, mc_error *err);
/* Write one complete line (line must end in '\n') with a single write(). */
mc_status mc_jsonlog_write(mc_jsonlog *j, const char *line, size_t n, mc_error *err);
mc_status mc_jsonlog_close(mc_jsonlog *j, mc_error *err);

/* Wall-clock time in seconds since the epoch, as TensorBoard's wall_time. */
double mc_wall_time(void);

#endif
