/*
 * tfevents.c - TensorBoard event files written with no TensorFlow: CRC-32C,
 * TFRecord framing, the few protobuf messages a scalar needs (encoded by
 * hand), and the append-only event file itself.
 *
 * An event file is a sequence of TFRecords:
 *     uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
 * all little-endian, each data a serialized tensorboard.Event. TensorBoard's
 * reader checks both CRCs, so a torn record at the end of a killed run is
 * dropped by the reader rather than misread.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "fmt/tfevents.h"
#include "mc/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ---- CRC-32C -------------------------------------------------------------- */

/* crc_table[i] = the CRC register after shifting the nibble i out, for the
 * reflected Castagnoli polynomial 0x82F63B78. Records are a few hundred bytes
 * per flush, so a nibble table (two lookups per byte) is ample. */
static const uint32_t crc_table[16] = {
    0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1, 0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
    0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9, 0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75,
};

uint32_t mc_crc32c_extend(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= b[i];
        crc = (crc >> 4) ^ crc_table[crc & 15];
        crc = (crc >> 4) ^ crc_table[crc & 15];
    }
    return ~crc;
}

uint32_t mc_crc32c(const void *p, size_t n) { return mc_crc32c_extend(0, p, n); }

uint32_t mc_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- little-endian and protobuf wire format ------------------------------- */

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

mc_status mc_tfrecord_append(mc_buf *out, const void *data, size_t n, mc_error *err)
{
    unsigned char head[12], tail[4];
    put_le(head, (uint64_t)n, 8);
    put_le(head + 8, mc_crc32c_mask(mc_crc32c(head, 8)), 4);
    put_le(tail, mc_crc32c_mask(mc_crc32c(data, n)), 4);
    mc_status s;
    if ((s = mc_buf_append(out, head, sizeof head, err)) != MC_OK ||
        (s = mc_buf_append(out, data, n, err)) != MC_OK ||
        (s = mc_buf_append(out, tail, sizeof tail, err)) != MC_OK)
        return s;
    return MC_OK;
}

/* Wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit. A key is
 * (field << 3) | wire type, itself a varint (one byte for fields 1..15). */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static mc_status put_varint(mc_buf *out, uint64_t v, mc_error *err)
{
    unsigned char b[10];
    int n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    return mc_buf_append(out, b, (size_t)n, err);
}

static mc_status put_key(mc_buf *out, unsigned field, unsigned wire, mc_error *err)
{
    return put_varint(out, ((uint64_t)field << 3) | wire, err);
}

static mc_status put_double(mc_buf *out, unsigned field, double v, mc_error *err)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    unsigned char b[8];
    put_le(b, u, 8);
    mc_status s = put_key(out, field, WT_I64, err);
    return s ? s : mc_buf_append(out, b, 8, err);
}

static mc_status put_float(mc_buf *out, unsigned field, float v, mc_error *err)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    unsigned char b[4];
    put_le(b, u, 4);
    mc_status s = put_key(out, field, WT_I32, err);
    return s ? s : mc_buf_append(out, b, 4, err);
}

static mc_status put_bytes(mc_buf *out, unsigned field, const void *p, size_t n, mc_error *err)
{
    mc_status s;
    if ((s = put_key(out, field, WT_LEN, err)) != MC_OK ||
        (s = put_varint(out, (uint64_t)n, err)) != MC_OK)
        return s;
    return mc_buf_append(out, p, n, err);
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >>= 7) n++;
    return n;
}

/* Event fields 1 and 2; proto3 leaves out values equal to the default. */
static mc_status put_event_head(mc_buf *out, double wall_time, int64_t step, mc_error *err)
{
    mc_status s;
    if (wall_time != 0.0 && (s = put_double(out, 1, wall_time, err)) != MC_OK) return s;
    /* int64 is a varint of the two's-complement value: 10 bytes if negative. */
    if (step != 0 && ((s = put_key(out, 2, WT_VARINT, err)) != MC_OK ||
                      (s = put_varint(out, (uint64_t)step, err)) != MC_OK))
        return s;
    return MC_OK;
}

mc_status mc_tfevent_encode_version(mc_buf *out, double wall_time, mc_error *err)
{
    static const char version[] = "brain.Event:2";
    mc_status s = put_event_head(out, wall_time, 0, err);
    return s ? s : put_bytes(out, 3, version, sizeof version - 1, err);
}

mc_status mc_tfevent_encode_scalars(mc_buf *out, double wall_time, int64_t step,
                                    const char *const *tags, const double *values, size_t n,
                                    mc_error *err)
{
    /* Nested messages are length-prefixed, so sizes are computed first:
     * Value = key(1) len tag, key(2) float  -> 1 + varint(t) + t + 5 bytes
     * Summary = n x (key(1) len Value). */
    size_t summary_len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t t = strlen(tags[i]);
        size_t value_len = 1 + varint_len(t) + t + 5;
        summary_len += 1 + varint_len(value_len) + value_len;
    }
    mc_status s;
    if ((s = put_event_head(out, wall_time, step, err)) != MC_OK ||
        (s = put_key(out, 5, WT_LEN, err)) != MC_OK ||
        (s = put_varint(out, summary_len, err)) != MC_OK)
        return s;
    for (size_t i = 0; i < n; i++) {
        size_t t = strlen(tags[i]);
        size_t value_len = 1 + varint_len(t) + t + 5;
        /* simple_value sits in a oneof, so it is written even when zero. */
        if ((s = put_key(out, 1, WT_LEN, err)) != MC_OK ||
            (s = put_varint(out, value_len, err)) != MC_OK ||
            (s = put_bytes(out, 1, tags[i], t, err)) != MC_OK ||
            (s = put_float(out, 2, (float)values[i], err)) != MC_OK)
            return s;
    }
    return MC_OK;
}

/* ---- the event file --------------------------------------------------------- */

double mc_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mkdir -p; the message names the directory asked for and, when it differs,
 * the component that could not be made. */
static mc_status make_dirs(const char *dir, mc_error *err)
{
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return mc_error_set(err, MC_ERR_IO,
                                "%s: cannot use as TensorBoard directory: "
                                "not a directory",
                                dir);
        return MC_OK;
    }
    char *p = strdup(dir);
    if (!p) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    size_t n = strlen(p);
    mc_status s = MC_OK;
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        if (p[i - 1] == '/') continue; /* "a//b" */
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            if (i == n)
                s = mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create TensorBoard directory",
                                   dir);
            else
                s = mc_error_errno(err, MC_ERR_IO, e,
                                   "%s: cannot create TensorBoard directory '%s'", dir, p);
            break;
        }
        p[i] = c;
    }
    free(p);
    if (s == MC_OK && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        s = mc_error_set(err, MC_ERR_IO,
                         "%s: cannot use as TensorBoard directory: "
                         "not a directory",
                         dir);
    return s;
}

static mc_status write_all(int fd, const char *path, const void *data, size_t n, mc_error *err)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot write", path);
        }
        p += w;
        n -= (size_t)w;
    }
    return MC_OK;
}

mc_status mc_tfevents_open(mc_tfevents *w, const char *dir, double wall_time, mc_error *err)
{
    w->fd = -1;
    w->path = NULL;
    w->last_sync = wall_time;
    mc_status s = make_dirs(dir, err);
    if (s) return s;

    char host[256];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';

    /* TensorBoard's name; the counter (a per-process uid in TensorFlow) is
     * found by O_EXCL, so two writers in one second never share a file. */
    for (int counter = 0; counter < 1000; counter++) {
        char *path = NULL;
        if (asprintf(&path, "%s/events.out.tfevents.%010lld.%s.%ld.%d", dir, (long long)wall_time,
                     host, (long)getpid(), counter) < 0)
            return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
        if (fd < 0) {
            int e = errno;
            if (e == EEXIST) {
                free(path);
                continue;
            }
            s = mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create event file", path);
            free(path);
            return s;
        }
        w->fd = fd;
        w->path = path;
        break;
    }
    if (w->fd < 0)
        return mc_error_set(err, MC_ERR_IO, "%s: cannot find a free event file name", dir);

    mc_buf ev = MC_BUF_INIT, rec = MC_BUF_INIT;
    if ((s = mc_tfevent_encode_version(&ev, wall_time, err)) == MC_OK &&
        (s = mc_tfrecord_append(&rec, ev.data, ev.len, err)) == MC_OK)
        s = mc_tfevents_write(w, rec.data, rec.len, wall_time, err);
    mc_buf_free(&ev);
    mc_buf_free(&rec);
    if (s) {
        close(w->fd);
        unlink(w->path);
        free(w->path);
        w->fd = -1;
        w->path = NULL;
    }
    return s;
}

mc_status mc_tfevents_write(mc_tfevents *w, const void *data, size_t n, double now, mc_error *err)
{
    mc_status s = write_all(w->fd, w->path, data, n, err);
    if (s) return s;
    /* write() already makes the records visible to a TensorBoard on this
     * machine; fsync (for network file systems, and crashes) costs a disk
     * round trip, so it is rationed. */
    if (now - w->last_sync >= MC_METRICS_SYNC_SECONDS) {
        if (fsync(w->fd) != 0 && errno != EINVAL)
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot fsync", w->path);
        w->last_sync = now;
    }
    return MC_OK;
}

mc_status mc_tfevents_close(mc_tfevents *w, mc_error *err)
{
    mc_status s = MC_OK;
    if (w->fd >= 0) {
        if (fsync(w->fd) != 0 && errno != EINVAL)
            s = mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot fsync", w->path);
        if (close(w->fd) != 0 && s == MC_OK)
            s = mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot close", w->path);
    }
    free(w->path);
    w->fd = -1;
    w->path = NULL;
    return s;
}
