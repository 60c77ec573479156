/*
 * test_metrics.c - TensorBoard event files and the JSON-lines log.
 *
 * The references: CRC-32C check values from the CRC catalogue ("123456789"
 * -> 0xE3069283); an Event record derived by hand from event.proto and
 * summary.proto (field keys, lengths, IEEE bytes) whose bytes were also
 * checked equal to tensorboard's own protobuf SerializeToString, with its
 * CRCs from an independent bitwise CRC-32C; JSON lines compared as text.
 * Whether TensorBoard itself reads the files is tests/tools/tensorboard.bats.
 */
#include "mc/metrics.h"
#include "fmt/tfevents.h"
#include "mc/file.h"
#include "tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/test_metrics.XXXXXX";

static char *path_in(const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s/%s", tmpdir, name) < 0) abort();
    return p;
}

static char *slurp(const char *path, size_t *len)
{
    char *d = NULL;
    mc_error err;
    if (mc_read_file(path, &d, len, &err) != MC_OK) {
        TAP_DIAG("%s", err.msg);
        return NULL;
    }
    return d;
}

static void test_crc(void)
{
    TAP_OK(mc_crc32c("123456789", 9) == 0xE3069283u, "crc32c(\"123456789\") = 0xE3069283");
    TAP_OK(mc_crc32c("", 0) == 0, "crc32c of nothing is 0");
    /* iSCSI test vectors (RFC 3720, B.4): 32 zero bytes, 32 0xff bytes. */
    unsigned char z[32], f[32];
    memset(z, 0, 32);
    memset(f, 0xff, 32);
    TAP_OK(mc_crc32c(z, 32) == 0x8A9136AAu, "crc32c(32 x 00) = 0x8A9136AA");
    TAP_OK(mc_crc32c(f, 32) == 0x62A8AB43u, "crc32c(32 x ff) = 0x62A8AB43");
    TAP_OK(mc_crc32c_extend(mc_crc32c("1234", 4), "56789", 5) == 0xE3069283u,
           "crc32c extends across pieces");
    /* ((c >> 15) | (c << 17)) + 0xa282ead8 by hand for c = 0xE3069283:
     * c >> 15 = 0x1c60d, c << 17 (32 bits) = 0x25060000, sum 0xc78ab0e5. */
    TAP_OK(mc_crc32c_mask(0xE3069283u) == 0xc78ab0e5u, "masked crc 0x%08x",
           mc_crc32c_mask(0xE3069283u));
}

/* Event{wall_time: 1.5, step: 10, summary{value{tag: "lm loss", simple_value:
 * 2.5}, value{tag: "lr", simple_value: 0}}}:
 *   09 <1.5 as little-endian double>      field 1, 64-bit
 *   10 0a                                 field 2, varint 10
 *   2a 1b                                 field 5, 27 bytes of Summary
 *     0a 0e  0a 07 "lm loss"  15 <2.5f>   Value: tag, float 0x40200000
 *     0a 09  0a 02 "lr"       15 <0.0f>
 * framed as 28 00.. (40, uint64) | masked crc | data | masked crc. */
static const unsigned char hand_record[] = {
    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0x70, 0x16, 0x4a, 0x09, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10, 0x0a, 0x2a, 0x1b, 0x0a, 0x0e, 0x0a,
    0x07, 0x6c, 0x6d, 0x20, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x20, 0x40, 0x0a,
    0x09, 0x0a, 0x02, 0x6c, 0x72, 0x15, 0x00, 0x00, 0x00, 0x00, 0xb2, 0xe0, 0x14, 0xe2,
};

static void test_encoding(void)
{
    mc_error err;
    mc_buf ev = MC_BUF_INIT, rec = MC_BUF_INIT;
    const char *tags[] = {"lm loss", "lr"};
    const double vals[] = {2.5, 0.0};
    TAP_OK(mc_tfevent_encode_scalars(&ev, 1.5, 10, tags, vals, 2, &err) == MC_OK,
           "encode a scalar event");
    TAP_OK(ev.len == 40 && memcmp(ev.data, hand_record + 12, 40) == 0,
           "event bytes equal the hand encoding (%zu bytes)", ev.len);
    TAP_OK(mc_tfrecord_append(&rec, ev.data, ev.len, &err) == MC_OK, "frame it");
    TAP_OK(rec.len == sizeof hand_record && memcmp(rec.data, hand_record, rec.len) == 0,
           "record bytes (length, masked crcs) equal the hand-derived record");

    /* Event{wall_time: 1.5, file_version: "brain.Event:2"} */
    static const unsigned char version[] = {0x09, 0,    0,    0,   0,   0,   0,   0xf8,
                                            0x3f, 0x1a, 0x0d, 'b', 'r', 'a', 'i', 'n',
                                            '.',  'E',  'v',  'e', 'n', 't', ':', '2'};
    ev.len = 0;
    TAP_OK(mc_tfevent_encode_version(&ev, 1.5, &err) == MC_OK && ev.len == sizeof version &&
               memcmp(ev.data, version, ev.len) == 0,
           "file_version event bytes");

    /* step -1: int64 varint of two's complement, 10 bytes; wall_time 0 is
     * left out as proto3 does; simple_value -1.0f = bf800000. */
    static const unsigned char neg[] = {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0x01, 0x2a, 0x0a, 0x0a, 0x08, 0x0a,
                                        0x01, 'x',  0x15, 0x00, 0x00, 0x80, 0xbf};
    const char *xt[] = {"x"};
    const double xv[] = {-1.0};
    ev.len = 0;
    TAP_OK(mc_tfevent_encode_scalars(&ev, 0.0, -1, xt, xv, 1, &err) == MC_OK &&
               ev.len == sizeof neg && memcmp(ev.data, neg, ev.len) == 0,
           "negative step and zero wall_time encode as protobuf does");

    /* A 200-byte tag needs two-byte lengths (varint 0xc8 0x01) at both levels. */
    char longtag[201];
    memset(longtag, 'a', 200);
    longtag[200] = '\0';
    const char *lt[] = {longtag};
    ev.len = 0;
    TAP_OK(mc_tfevent_encode_scalars(&ev, 0.0, 1, lt, xv, 1, &err) == MC_OK &&
               ev.len == 2 + 3 + 3 + 3 + 200 + 5 && (unsigned char)ev.data[3] == 0xd3 &&
               (unsigned char)ev.data[4] == 0x01 && (unsigned char)ev.data[6] == 0xd0 &&
               (unsigned char)ev.data[9] == 0xc8 && (unsigned char)ev.data[10] == 0x01,
           "multi-byte varint lengths (summary 211, value 208, tag 200)");
    mc_buf_free(&ev);
    mc_buf_free(&rec);
}

static int number_is(double v, const char *want)
{
    mc_buf b = MC_BUF_INIT;
    mc_error err;
    mc_jsonlog_number(&b, v, &err);
    mc_buf_append(&b, "", 1, &err);
    int ok = strcmp(b.data, want) == 0;
    if (!ok) TAP_DIAG("got %s, want %s", b.data, want);
    mc_buf_free(&b);
    return ok;
}

static void test_json_spelling(void)
{
    TAP_OK(number_is(0.0003, "0.0003"), "0.0003 in its shortest exact form");
    TAP_OK(number_is(0.1 + 0.2, "0.30000000000000004"), "0.1+0.2 needs 17 digits");
    TAP_OK(number_is(8, "8") && number_is(-2.5e-300, "-2.5e-300"), "integers and exponents");
    TAP_OK(number_is(NAN, "null") && number_is(INFINITY, "null") && number_is(-INFINITY, "null"),
           "NaN and infinities are null");

    /* Every double reads back exactly: random bit patterns (xorshift). */
    uint64_t x = 88172645463325252ull;
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double v;
        memcpy(&v, &x, 8);
        if (!isfinite(v)) continue;
        mc_buf b = MC_BUF_INIT;
        mc_error err;
        mc_jsonlog_number(&b, v, &err);
        mc_buf_append(&b, "", 1, &err);
        double back = strtod(b.data, NULL);
        if (memcmp(&back, &v, 8) != 0) bad++;
        mc_buf_free(&b);
    }
    TAP_OK(bad == 0, "20000 random doubles round-trip exactly (%d did not)", bad);

    mc_buf b = MC_BUF_INIT;
    mc_error err;
    mc_jsonlog_string(&b, "a\"b\\c\nd\x01é", &err);
    mc_buf_append(&b, "", 1, &err);
    TAP_OK(strcmp(b.data, "\"a\\\"b\\\\c\\u000ad\\u0001é\"") == 0, "string escapes: %s", b.data);
    mc_buf_free(&b);
}

/* Split an event file into record payloads, checking every CRC. */
static int read_records(const char *data, size_t len, const char **rec, size_t *rlen, int max)
{
    size_t off = 0;
    int n = 0;
    while (off < len && n < max) {
        uint64_t l = 0;
        uint32_t c1 = 0, c2 = 0;
        if (len - off < 12) return -1;
        for (int i = 0; i < 8; i++) l |= (uint64_t)(unsigned char)data[off + i] << (8 * i);
        for (int i = 0; i < 4; i++) c1 |= (uint32_t)(unsigned char)data[off + 8 + i] << (8 * i);
        if (c1 != mc_crc32c_mask(mc_crc32c(data + off, 8)) || len - off - 12 < l + 4) return -1;
        for (int i = 0; i < 4; i++)
            c2 |= (uint32_t)(unsigned char)data[off + 12 + l + i] << (8 * i);
        if (c2 != mc_crc32c_mask(mc_crc32c(data + off + 12, l))) return -1;
        rec[n] = data + off + 12;
        rlen[n] = l;
        n++;
        off += 12 + l + 4;
    }
    return off == len ? n : -1;
}

/* The event without its leading wall_time (09 + 8 bytes) equals the
 * encoder's output for wall_time 0. */
static int event_is(const char *rec, size_t rlen, int64_t step, const char *const *tags,
                    const double *vals, size_t n)
{
    mc_buf ev = MC_BUF_INIT;
    mc_error err;
    mc_tfevent_encode_scalars(&ev, 0.0, step, tags, vals, n, &err);
    int ok = rlen == ev.len + 9 && (unsigned char)rec[0] == 0x09 &&
             memcmp(rec + 9, ev.data, ev.len) == 0;
    mc_buf_free(&ev);
    return ok;
}

static void test_writer(void)
{
    mc_error err;
    char *tb = path_in("tb/run1"), *js = path_in("log.jsonl");
    mc_metrics *m = NULL;
    TAP_OK(mc_metrics_open(tb, js, &m, &err) == MC_OK, "open tb dir (made with parents) and log");
    const char *p = mc_metrics_tb_path(m);
    char host[256] = "";
    gethostname(host, sizeof host);
    char *tail = NULL;
    asprintf(&tail, ".%s.%ld.0", host, (long)getpid());
    TAP_OK(p && strncmp(p, tb, strlen(tb)) == 0 &&
               strncmp(p + strlen(tb), "/events.out.tfevents.", 21) == 0 &&
               strlen(p) > strlen(tail) && strcmp(p + strlen(p) - strlen(tail), tail) == 0,
           "event file named DIR/events.out.tfevents.TIME.HOST.PID.0: %s", p ? p : "(null)");
    char *first = p ? strdup(p) : NULL;

    TAP_OK(mc_metrics_scalar(m, MC_TAG_LM_LOSS, 10, 5.43, &err) == MC_OK &&
               mc_metrics_scalar(m, MC_TAG_LEARNING_RATE, 10, 0.0003, &err) == MC_OK &&
               mc_metrics_scalar(m, MC_TAG_ITERATION_TIME, 10, 0.25, &err) == MC_OK &&
               mc_metrics_samples(m, 10, 80, &err) == MC_OK &&
               mc_metrics_scalar(m, MC_TAG_VAL_LOSS, 10, 5.5, &err) == MC_OK &&
               mc_metrics_scalar(m, MC_TAG_LM_LOSS, 20, NAN, &err) == MC_OK,
           "buffer scalars of steps 10 and 20");
    TAP_OK(mc_metrics_scalar(m, MC_TAG_LM_LOSS, 10, 1.0, &err) == MC_ERR_USAGE &&
               strcmp(err.msg, "metrics: 'lm loss' given twice for step 10") == 0,
           "a tag given twice for a step: %s", err.msg);
    TAP_OK(mc_metrics_scalar(m, "", 10, 1.0, &err) == MC_ERR_USAGE && strstr(err.msg, "empty tag"),
           "an empty tag: %s", err.msg);
    TAP_OK(mc_metrics_flush(m, &err) == MC_OK, "flush");

    /* Visible before close: the data went to the kernel at flush. */
    size_t len = 0;
    char *data = first ? slurp(first, &len) : NULL;
    const char *rec[8];
    size_t rlen[8];
    int n = data ? read_records(data, len, rec, rlen, 8) : -1;
    TAP_OK(n == 4, "after flush, before close: 4 records with good CRCs (got %d)", n);
    if (n == 4) {
        static const char ver[] = {0x1a, 0x0d, 'b', 'r', 'a', 'i', 'n', '.',
                                   'E',  'v',  'e', 'n', 't', ':', '2'};
        TAP_OK(rlen[0] == 9 + sizeof ver && memcmp(rec[0] + 9, ver, sizeof ver) == 0,
               "record 1: file_version brain.Event:2");
        const char *t10[] = {"lm loss", "learning-rate", "iteration-time", "lm loss validation"};
        const double v10[] = {5.43, 0.0003, 0.25, 5.5};
        TAP_OK(event_is(rec[1], rlen[1], 10, t10, v10, 4), "record 2: step 10, four scalars");
        const char *ts[] = {"lm loss vs samples", "learning-rate vs samples",
                            "lm loss validation vs samples"};
        const double vs[] = {5.43, 0.0003, 5.5};
        TAP_OK(event_is(rec[2], rlen[2], 80, ts, vs, 3),
               "record 3: 'vs samples' at step 80, timing tags not mirrored");
        const char *t20[] = {"lm loss"};
        const double v20[] = {NAN};
        TAP_OK(event_is(rec[3], rlen[3], 20, t20, v20, 1), "record 4: step 20, NaN loss");
    }
    free(data);
    TAP_OK(mc_metrics_close(m, &err) == MC_OK, "close");

    data = slurp(js, &len);
    const char *want1 = "{\"step\": 10, \"consumed-samples\": 80, \"lm loss\": 5.43, "
                        "\"learning-rate\": 0.0003, \"iteration-time\": 0.25, "
                        "\"lm loss validation\": 5.5}\n"
                        "{\"step\": 20, \"lm loss\": null}\n";
    TAP_OK(data && strcmp(data, want1) == 0, "JSON lines, one per step");
    if (data && strcmp(data, want1) != 0) TAP_DIAG("got: %s", data);
    free(data);

    /* A resumed run: the log is appended to (after a torn line from a kill)
     * and a second event file starts beside the first. */
    FILE *f = fopen(js, "a");
    fputs("{\"step\": 2", f);
    fclose(f);
    TAP_OK(mc_metrics_open(tb, js, &m, &err) == MC_OK, "reopen for a resumed run");
    p = mc_metrics_tb_path(m);
    TAP_OK(p && first && strcmp(p, first) != 0, "a new event file: %s", p ? p : "(null)");
    TAP_OK(mc_metrics_scalar(m, "batch-size", 30, 8, &err) == MC_OK, "scalar at step 30");
    TAP_OK(mc_metrics_close(m, &err) == MC_OK, "close flushes");
    data = slurp(js, &len);
    char *want2 = NULL;
    asprintf(&want2, "%s{\"step\": 2\n{\"step\": 30, \"batch-size\": 8}\n", want1);
    TAP_OK(data && strcmp(data, want2) == 0, "appended after ending the torn line");
    free(data);
    free(want2);
    free(first);
    free(tail);
    free(tb);
    free(js);
}

static void test_errors(void)
{
    mc_error err;
    mc_metrics *m = (mc_metrics *)1;

    char *file = path_in("plain");
    FILE *f = fopen(file, "w");
    fclose(f);
    char *under = path_in("plain/tb/x");
    TAP_OK(mc_metrics_open(under, NULL, &m, &err) == MC_ERR_IO && m == NULL &&
               strstr(err.msg, under) && strstr(err.msg, "cannot create TensorBoard directory"),
           "tb dir that cannot be created: %s", err.msg);
    TAP_OK(mc_metrics_open(file, NULL, &m, &err) == MC_ERR_IO && strstr(err.msg, file) &&
               strstr(err.msg, "not a directory"),
           "tb dir that is a file: %s", err.msg);

    char *missing = path_in("nodir/log.jsonl");
    char *nodir = path_in("nodir");
    char *tb = path_in("tb_unused");
    TAP_OK(mc_metrics_open(tb, missing, &m, &err) == MC_ERR_IO && strstr(err.msg, missing) &&
               strstr(err.msg, nodir) && strstr(err.msg, "does not exist"),
           "json path in a missing directory: %s", err.msg);
    TAP_OK(mc_metrics_open(NULL, tmpdir, &m, &err) != MC_OK && strstr(err.msg, tmpdir) &&
               strstr(err.msg, "directory"),
           "json path that is a directory: %s", err.msg);

    TAP_OK(mc_metrics_open(NULL, NULL, &m, &err) == MC_OK && m &&
               mc_metrics_scalar(m, "x", 1, 1.0, &err) == MC_OK && mc_metrics_tb_path(m) == NULL &&
               mc_metrics_flush(m, &err) == MC_OK && mc_metrics_close(m, &err) == MC_OK,
           "no outputs: every call is a no-op");
    TAP_OK(mc_metrics_close(NULL, &err) == MC_OK, "close(NULL)");
    free(file);
    free(under);
    free(missing);
    free(nodir);
    free(tb);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc();
    test_encoding();
    test_json_spelling();
    test_writer();
    test_errors();
    char *cmd = NULL;
    if (asprintf(&cmd, "rm -rf '%s'", tmpdir) >= 0) (void)!system(cmd);
    free(cmd);
    return tap_done();
}
