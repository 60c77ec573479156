/*
 * test_docsource.c - mc_docsource (inputs, globs, stdin, .zst, records and
 * their places, limits, progress) and mc_jsonl_extract (values and every
 * error message).
 *
 * Inputs are generated here in a mkdtemp directory; the expected records
 * are known from how each file was made, and .zst files are made with
 * libzstd's one-shot ZSTD_compress, independent of the streaming reader.
 */
/* glob, mkfifo, faccessat, strdup, posix_fadvise: POSIX.1-2008 and GNU
 * extensions, whether or not the build passes config.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "tap.h"
#include "mc/docsource.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

static char dir[64];

/* Paths in the test directory; a ring of buffers large enough that every
 * path a test holds stays valid through the test. */
static const char *pth(const char *name)
{
    static char bufs[64][512];
    static int k;
    char *b = bufs[k++ % 64];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
        printf("Bail out! cannot write %s\n", path);
        exit(1);
    }
}

static void write_str(const char *path, const char *s) { write_file(path, s, strlen(s)); }

/* Compress with the one-shot API (a different code path from the reader). */
static size_t zcompress(const void *src, size_t n, char **out)
{
    size_t cap = ZSTD_compressBound(n);
    *out = malloc(cap);
    size_t z = ZSTD_compress(*out, cap, src, n, 3);
    if (ZSTD_isError(z)) {
        printf("Bail out! ZSTD_compress: %s\n", ZSTD_getErrorName(z));
        exit(1);
    }
    return z;
}

typedef struct rec_copy {
    char *data;
    size_t len;
    uint64_t line;
    char file[512];
} rec_copy;

typedef struct recs {
    rec_copy *v;
    size_t n;
    mc_status st;
    mc_error err;
    uint64_t done, total; /* progress at the end (or at the error) */
} recs;

static void recs_free(recs *r)
{
    for (size_t i = 0; i < r->n; i++) free(r->v[i].data);
    free(r->v);
    memset(r, 0, sizeof *r);
}

/* Open and read everything; stops at the first error (kept in r->st/err). */
static void collect(const char *const *inputs, size_t n, mc_input_format fmt, int lines,
                    uint64_t max, recs *r)
{
    memset(r, 0, sizeof *r);
    mc_docsource_config c = {fmt, lines, max};
    mc_docsource *s;
    r->st = mc_docsource_open(inputs, n, &c, &s, &r->err);
    if (r->st) return;
    for (;;) {
        mc_record rec;
        int eof;
        r->st = mc_docsource_next(s, &rec, &eof, &r->err);
        if (r->st || eof) break;
        r->v = realloc(r->v, (r->n + 1) * sizeof *r->v);
        rec_copy *rc = &r->v[r->n++];
        rc->data = malloc(rec.len + 1);
        memcpy(rc->data, rec.data, rec.len);
        rc->data[rec.len] = 0;
        rc->len = rec.len;
        rc->line = rec.line;
        snprintf(rc->file, sizeof rc->file, "%s", rec.file);
    }
    mc_docsource_progress(s, &r->done, &r->total);
    mc_docsource_close(s);
}

static int rec_is(const recs *r, size_t i, const char *file, uint64_t line, const char *data)
{
    if (i >= r->n) return 0;
    const rec_copy *c = &r->v[i];
    int ok = strcmp(c->file, file) == 0 && c->line == line && c->len == strlen(data) &&
             memcmp(c->data, data, c->len) == 0;
    if (!ok)
        TAP_DIAG("record %zu: got %s:%llu '%.60s' (len %zu), want %s:%llu '%.60s'", i, c->file,
                 (unsigned long long)c->line, c->data, c->len, file, (unsigned long long)line,
                 data);
    return ok;
}

static int msg_is(const mc_error *e, const char *want)
{
    if (strcmp(e->msg, want) == 0) return 1;
    TAP_DIAG("message: '%s'", e->msg);
    TAP_DIAG("expected: '%s'", want);
    return 0;
}

static int msg_has(const mc_error *e, const char *want)
{
    if (strstr(e->msg, want)) return 1;
    TAP_DIAG("message: '%s' lacks '%s'", e->msg, want);
    return 0;
}

/* ---- records ----------------------------------------------------------- */

static void test_jsonl_lines(void)
{
    const char *f = pth("a.jsonl");
    write_str(f, "{\"text\":\"a\"}\r\n\r\n   \n{\"text\":\"b\"}\n\t \r\n\n{\"text\":\"c\"}");
    recs r;
    collect(&f, 1, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(r.st == MC_OK && r.n == 3, "jsonl: 3 records, blank lines skipped (got %zu, st %d)", r.n,
           r.st);
    TAP_OK(rec_is(&r, 0, f, 1, "{\"text\":\"a\"}"), "jsonl: CRLF stripped, line 1");
    TAP_OK(rec_is(&r, 1, f, 4, "{\"text\":\"b\"}"), "jsonl: blank lines still counted (line 4)");
    TAP_OK(rec_is(&r, 2, f, 7, "{\"text\":\"c\"}"), "jsonl: last line without newline, line 7");
    recs_free(&r);

    /* A file that is only blank lines yields nothing; a file ending in a
     * blank line with no newline does not add a record. */
    const char *g = pth("blank.jsonl");
    write_str(g, "\n \n\r\n\t");
    collect(&g, 1, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(r.st == MC_OK && r.n == 0, "jsonl: only blank lines -> no records (got %zu)", r.n);
    recs_free(&r);

    /* A '\r' in the middle of a line is content, not a line end. */
    const char *h = pth("cr.jsonl");
    write_str(h, "x\ry\r\n");
    collect(&h, 1, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(r.n == 1 && rec_is(&r, 0, h, 1, "x\ry"),
           "jsonl: inner \\r kept, only the trailing one stripped");
    recs_free(&r);
}

static void test_text(void)
{
    const char *f1 = pth("t1.txt"), *f2 = pth("t2.txt"), *f3 = pth("t3.txt");
    write_str(f1, "first doc\r\nline two\n\n");
    write_str(f2, "");
    write_str(f3, "no newline at end");
    const char *in[] = {f1, f2, f3};
    recs r;
    collect(in, 3, MC_INPUT_TEXT, 0, 0, &r);
    TAP_OK(r.st == MC_OK && r.n == 3, "text whole-file: one record per file (got %zu)", r.n);
    TAP_OK(rec_is(&r, 0, f1, 0, "first doc\r\nline two\n\n"),
           "text whole-file: bytes kept exactly, line 0");
    TAP_OK(rec_is(&r, 1, f2, 0, ""), "text whole-file: empty file -> empty record");
    TAP_OK(rec_is(&r, 2, f3, 0, "no newline at end"), "text whole-file: third file");
    recs_free(&r);

    collect(in, 3, MC_INPUT_TEXT, 1, 0, &r);
    TAP_OK(r.st == MC_OK && r.n == 4, "text --lines: 4 records (got %zu)", r.n);
    TAP_OK(rec_is(&r, 0, f1, 1, "first doc"), "text --lines: \\r\\n stripped");
    TAP_OK(rec_is(&r, 1, f1, 2, "line two"), "text --lines: line 2");
    TAP_OK(rec_is(&r, 2, f1, 3, ""), "text --lines: empty line returned as an empty record");
    TAP_OK(rec_is(&r, 3, f3, 1, "no newline at end"),
           "text --lines: line numbers restart per file");
    recs_free(&r);
}

/* Lines of varied lengths, some longer than the 1 MiB read buffer, so
 * lines straddle chunk boundaries (and, compressed, frame boundaries). */
static char *make_corpus(size_t *len, size_t *nlines, size_t **starts)
{
    size_t cap = 6u << 20, n = 0, k = 0;
    char *p = malloc(cap);
    *starts = malloc(4096 * sizeof **starts);
    uint32_t x = 12345;
    while (n < (3u << 20)) {
        x = x * 1664525u + 1013904223u;
        size_t l = (x >> 8) % 3000;
        if (k % 97 == 5) l = (1u << 20) + 1000 + k; /* longer than one read chunk */
        (*starts)[k++] = n;
        for (size_t i = 0; i < l; i++) p[n++] = (char)('a' + (i * 7 + k) % 26);
        if (k % 5 == 0) p[n++] = '\r';
        p[n++] = '\n';
    }
    *len = n;
    *nlines = k;
    return p;
}

static int check_corpus(const recs *r, const char *file, const char *p, size_t nlines,
                        const size_t *starts, size_t len)
{
    if (r->st != MC_OK || r->n != nlines) {
        TAP_DIAG("st %d (%s), %zu records, want %zu", r->st, r->err.msg, r->n, nlines);
        return 0;
    }
    for (size_t i = 0; i < nlines; i++) {
        size_t end = i + 1 < nlines ? starts[i + 1] - 1 : len - 1;
        if (end > starts[i] && p[end - 1] == '\r') end--;
        const rec_copy *c = &r->v[i];
        if (c->len != end - starts[i] || memcmp(c->data, p + starts[i], c->len) != 0 ||
            c->line != i + 1 || strcmp(c->file, file) != 0) {
            TAP_DIAG("record %zu differs (len %zu want %zu)", i, c->len, end - starts[i]);
            return 0;
        }
    }
    return 1;
}

static void test_big_and_zst(void)
{
    size_t len, nlines, *starts;
    char *p = make_corpus(&len, &nlines, &starts);
    const char *f = pth("big.jsonl");
    write_file(f, p, len);
    recs r;
    collect(&f, 1, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(check_corpus(&r, f, p, nlines, starts, len),
           "plain: %zu lines over %zu bytes, across read chunks", nlines, len);
    TAP_OK(r.done == len && r.total == len,
           "plain: progress done %llu = total %llu = %zu at the end", (unsigned long long)r.done,
           (unsigned long long)r.total, len);
    recs_free(&r);

    /* Two frames, split in the middle of a line. */
    size_t cut = starts[nlines / 2] + 17;
    char *z1, *z2;
    size_t n1 = zcompress(p, cut, &z1), n2 = zcompress(p + cut, len - cut, &z2);
    char *z = malloc(n1 + n2);
    memcpy(z, z1, n1);
    memcpy(z + n1, z2, n2);
    const char *fz = pth("big.jsonl.zst");
    write_file(fz, z, n1 + n2);
    collect(&fz, 1, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(check_corpus(&r, fz, p, nlines, starts, len),
           ".zst: 2 concatenated frames, split mid-line, round trip");
    TAP_OK(r.done == n1 + n2 && r.total == n1 + n2,
           ".zst: progress counts compressed bytes (%llu of %llu, file %zu)",
           (unsigned long long)r.done, (unsigned long long)r.total, n1 + n2);
    recs_free(&r);

    /* Truncated in the middle of the second frame. */
    const char *ft = pth("trunc.jsonl.zst");
    write_file(ft, z, n1 + n2 / 2);
    collect(&ft, 1, MC_INPUT_JSONL, 0, 0, &r);
    char want[1024];
    snprintf(want, sizeof want, "%s: truncated zstd stream (input ends inside a frame)", ft);
    TAP_OK(r.st == MC_ERR_FORMAT && msg_is(&r.err, want), ".zst truncated mid-frame: error");
    TAP_OK(r.n >= nlines / 2 - 1 && r.n < nlines,
           ".zst truncated: records before the cut were returned (%zu)", r.n);
    recs_free(&r);

    /* Truncated inside the frame header (a handful of bytes). */
    write_file(ft, z, 3);
    collect(&ft, 1, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(r.st == MC_ERR_FORMAT && msg_is(&r.err, want) && r.n == 0,
           ".zst cut to 3 bytes: truncated error");
    recs_free(&r);

    /* Garbage after a valid frame: the error names zstd's reason and the
     * compressed offset where the bad data starts. */
    const char *fc = pth("corrupt.jsonl.zst");
    char *zc = malloc(n1 + 32);
    memcpy(zc, z1, n1);
    memcpy(zc + n1, "this is not a zstd frame at all!", 32);
    write_file(fc, zc, n1 + 32);
    collect(&fc, 1, MC_INPUT_JSONL, 0, 0, &r);
    snprintf(want, sizeof want, "%s: zstd: %s (near compressed byte %zu)", fc,
             ZSTD_getErrorName(ZSTD_decompress(want, 1, "this is not", 11)), n1);
    TAP_OK(r.st == MC_ERR_FORMAT && msg_is(&r.err, want),
           ".zst with garbage after a frame: zstd error and offset");
    recs_free(&r);

    /* Corruption inside a frame: a frame of all-'a' lines where the block
     * type bits are broken. zstd must report an error, not garbage text. */
    const char *fc2 = pth("corrupt2.jsonl.zst");
    memcpy(zc, z1, n1);
    for (size_t i = n1 / 3; i < n1 / 3 + 64 && i < n1; i++) zc[i] = (char)0xff;
    write_file(fc2, zc, n1);
    collect(&fc2, 1, MC_INPUT_JSONL, 0, 0, &r);
    snprintf(want, sizeof want, "%s: zstd: ", fc2);
    TAP_OK(r.st == MC_ERR_FORMAT && strncmp(r.err.msg, want, strlen(want)) == 0 &&
               msg_has(&r.err, "(near compressed byte "),
           ".zst corrupted inside a frame: zstd error (%s)", r.err.msg);
    recs_free(&r);

    const char *fe = pth("empty.jsonl.zst");
    write_file(fe, "", 0);
    collect(&fe, 1, MC_INPUT_JSONL, 0, 0, &r);
    snprintf(want, sizeof want, "%s: empty file, not a zstd stream (no frame)", fe);
    TAP_OK(r.st == MC_ERR_FORMAT && msg_is(&r.err, want), ".zst empty file: error");
    recs_free(&r);

    /* Text whole-file from .zst. */
    const char *fw = pth("doc.txt.zst");
    char *zw;
    size_t nw = zcompress("hello\nworld\n", 12, &zw);
    write_file(fw, zw, nw);
    collect(&fw, 1, MC_INPUT_TEXT, 0, 0, &r);
    TAP_OK(r.st == MC_OK && r.n == 1 && rec_is(&r, 0, fw, 0, "hello\nworld\n"),
           ".zst text whole-file");
    recs_free(&r);

    free(zw);
    free(zc);
    free(z);
    free(z1);
    free(z2);
    free(starts);
    free(p);
}

/* ---- limits ------------------------------------------------------------ */

static void test_limits(void)
{
    char want[1024];
    recs r;
    /* Exactly at the limit passes (with and without "\r"), one more fails. */
    const uint64_t lim = 100;
    char line[300];
    memset(line, 'x', sizeof line);
    const char *f = pth("lim.jsonl");
    char buf[1024];
    size_t n = 0;
    memcpy(buf + n, line, lim), n += lim, buf[n++] = '\n';
    memcpy(buf + n, line, lim), n += lim, buf[n++] = '\r', buf[n++] = '\n';
    memcpy(buf + n, line, lim + 1), n += lim + 1, buf[n++] = '\n';
    write_file(f, buf, n);
    collect(&f, 1, MC_INPUT_JSONL, 0, lim, &r);
    snprintf(want, sizeof want, "%s:3: record longer than 100 bytes (--max-document-bytes)", f);
    TAP_OK(r.n == 2 && r.v[0].len == lim && r.v[1].len == lim,
           "limit: lines of exactly the limit pass (%zu)", r.n);
    TAP_OK(r.st == MC_ERR_LIMIT && msg_is(&r.err, want),
           "limit: limit+1 bytes on line 3 is MC_ERR_LIMIT naming file:line");
    recs_free(&r);

    /* A line of 10x the limit, far longer than the read buffer: the error
     * comes before the line is read, so memory stays bounded. */
    const size_t big_lim = 256 << 10, big = 10 * big_lim + (3u << 20);
    char *p = malloc(big + 32);
    strcpy(p, "{\"text\":\"ok\"}\n\n");
    size_t off = strlen(p);
    memset(p + off, 'y', big);
    const char *fb = pth("huge.jsonl");
    write_file(fb, p, off + big);
    collect(&fb, 1, MC_INPUT_JSONL, 0, big_lim, &r);
    snprintf(want, sizeof want, "%s:3: record longer than 262144 bytes (--max-document-bytes)", fb);
    TAP_OK(r.n == 1 && r.st == MC_ERR_LIMIT && msg_is(&r.err, want),
           "limit: 10x line on line 3 reported");
    TAP_OK(r.total == off + big && r.done == off,
           "limit: progress counts the %zu bytes of records handed on, not bytes read ahead (%llu)",
           off, (unsigned long long)r.done);
    recs_free(&r);

    /* The same line in text whole-file mode: "FILE: ", no line. */
    collect(&fb, 1, MC_INPUT_TEXT, 0, big_lim, &r);
    snprintf(want, sizeof want, "%s: record longer than 262144 bytes (--max-document-bytes)", fb);
    TAP_OK(r.st == MC_ERR_LIMIT && msg_is(&r.err, want), "limit: whole-file text document");
    recs_free(&r);

    /* A .zst whose decompressed line passes the limit. */
    char *z;
    size_t nz = zcompress(p, off + big, &z);
    const char *fz = pth("huge.jsonl.zst");
    write_file(fz, z, nz);
    collect(&fz, 1, MC_INPUT_JSONL, 0, big_lim, &r);
    snprintf(want, sizeof want, "%s:3: record longer than 262144 bytes (--max-document-bytes)", fz);
    TAP_OK(r.n == 1 && r.st == MC_ERR_LIMIT && msg_is(&r.err, want), "limit: .zst over-long line");
    recs_free(&r);

    /* Text --lines: the last line, without '\n', also checked. */
    const char *ft = pth("lim.txt");
    write_file(ft, line, lim + 1);
    collect(&ft, 1, MC_INPUT_TEXT, 1, lim, &r);
    snprintf(want, sizeof want, "%s:1: record longer than 100 bytes (--max-document-bytes)", ft);
    TAP_OK(r.st == MC_ERR_LIMIT && msg_is(&r.err, want),
           "limit: text --lines last line without newline");
    recs_free(&r);
    free(z);
    free(p);
    unlink(fb);
    unlink(fz);
}

/* Feed a FIFO from a child: `prefix`, then `n` bytes of 'z' with no newline.
 * *written is how much the child got into the FIFO before the reader closed
 * it, which bounds what the reader can have read. */
static void fifo_collect(const char *prefix, size_t n, mc_input_format fmt, uint64_t max, recs *r,
                         uint64_t *written)
{
    const char *ff = pth("fifo.jsonl");
    int res[2];
    *written = 0;
    memset(r, 0, sizeof *r);
    r->st = MC_ERR_INTERNAL;
    if (mkfifo(ff, 0600) != 0 || pipe(res) != 0) {
        TAP_DIAG("mkfifo/pipe failed: %s", strerror(errno));
        return;
    }
    signal(SIGPIPE, SIG_IGN); /* the writer sees EPIPE instead */
    pid_t pid = fork();
    if (pid == 0) {
        close(res[0]);
        int fd = open(ff, O_WRONLY);
        uint64_t w = 0;
        static char chunk[1 << 16];
        memset(chunk, 'z', sizeof chunk);
        ssize_t k = write(fd, prefix, strlen(prefix));
        if (k > 0) w += (uint64_t)k;
        while (w < n + strlen(prefix) && (k = write(fd, chunk, sizeof chunk)) > 0) w += (uint64_t)k;
        if (write(res[1], &w, sizeof w) != sizeof w) _exit(1);
        _exit(0);
    }
    close(res[1]);
    collect(&ff, 1, fmt, 0, max, r);
    if (read(res[0], written, sizeof *written) != sizeof *written)
        TAP_DIAG("no byte count from the writer");
    close(res[0]);
    int status;
    waitpid(pid, &status, 0);
    unlink(ff);
}

static void test_fifo_limits(void)
{
    char want[1024];
    recs r;
    uint64_t written;
    const char *ff = pth("fifo.jsonl");

    /* 10x the limit: the reader gives up once the limit is passed. */
    const size_t lim = 1u << 20;
    fifo_collect("{\"text\":\"ok\"}\n", 10 * lim, MC_INPUT_JSONL, lim, &r, &written);
    snprintf(want, sizeof want, "%s:2: record longer than 1048576 bytes (--max-document-bytes)",
             ff);
    TAP_OK(r.n == 1 && r.st == MC_ERR_LIMIT && msg_is(&r.err, want),
           "FIFO: 10x over-long line reported");
    TAP_OK(written <= lim + (2u << 20),
           "FIFO: reader stopped after %llu of %zu bytes (bounded reading)",
           (unsigned long long)written, 10 * lim);
    TAP_OK(r.total == 0, "FIFO: total unknown (0)");
    recs_free(&r);

    fifo_collect("", 10 * lim, MC_INPUT_TEXT, lim, &r, &written);
    snprintf(want, sizeof want, "%s: record longer than 1048576 bytes (--max-document-bytes)", ff);
    TAP_OK(r.st == MC_ERR_LIMIT && msg_is(&r.err, want) && written <= lim + (2u << 20),
           "FIFO: whole-file text over the limit, stopped after %llu bytes",
           (unsigned long long)written);
    recs_free(&r);

    /* max_record_bytes 0 means the default, 64 MiB. */
    fifo_collect("", 80u << 20, MC_INPUT_JSONL, 0, &r, &written);
    snprintf(want, sizeof want, "%s:1: record longer than 67108864 bytes (--max-document-bytes)",
             ff);
    TAP_OK(r.st == MC_ERR_LIMIT && msg_is(&r.err, want), "default limit is 64 MiB");
    TAP_OK(written <= (66u << 20), "default limit: stopped after %llu of %u bytes",
           (unsigned long long)written, 80u << 20);
    recs_free(&r);

    /* A FIFO that is read to its end works like a file. */
    fifo_collect("{\"text\":\"x\"}\n", 3, MC_INPUT_JSONL, 0, &r, &written);
    TAP_OK(r.st == MC_OK && r.n == 2 && rec_is(&r, 0, ff, 1, "{\"text\":\"x\"}") &&
               r.v[1].line == 2 && r.v[1].len >= 3,
           "FIFO read to the end: records as from a file");
    recs_free(&r);
}

/* ---- inputs ------------------------------------------------------------ */

static void test_inputs(void)
{
    mkdir(pth("g"), 0700);
    const char *names[] = {"g/b.jsonl", "g/a10.jsonl", "g/a.jsonl", "g/C.jsonl", "g/skip.txt"};
    for (int i = 0; i < 5; i++) {
        char content[64];
        snprintf(content, sizeof content, "\"%s\"\n", names[i]);
        write_str(pth(names[i]), content);
    }
    const char *solo = pth("a.jsonl");
    const char *in[] = {pth("g/*.jsonl"), solo};
    mc_docsource_config c = {MC_INPUT_JSONL, 0, 0};
    mc_docsource *s;
    mc_error err;
    TAP_OK(mc_docsource_open(in, 2, &c, &s, &err) == MC_OK && mc_docsource_count(s) == 5,
           "glob + file: 5 inputs after expansion");
    mc_docsource_close(s);
    recs r;
    collect(in, 2, MC_INPUT_JSONL, 0, 0, &r);
    TAP_OK(r.n == 7 && rec_is(&r, 0, pth("g/C.jsonl"), 1, "\"g/C.jsonl\"") &&
               rec_is(&r, 1, pth("g/a.jsonl"), 1, "\"g/a.jsonl\"") &&
               rec_is(&r, 2, pth("g/a10.jsonl"), 1, "\"g/a10.jsonl\"") &&
               rec_is(&r, 3, pth("g/b.jsonl"), 1, "\"g/b.jsonl\"") &&
               rec_is(&r, 4, solo, 1, "{\"text\":\"a\"}"),
           "glob expands in bytewise order (C, a, a10, b), then the next input");
    recs_free(&r);

    char want[1024];
    const char *bad1[] = {solo, pth("missing.jsonl")};
    TAP_OK(mc_docsource_open(bad1, 2, &c, &s, &err) == MC_ERR_NOTFOUND && s == NULL,
           "missing file: open fails");
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", pth("missing.jsonl"));
    TAP_OK(msg_is(&err, want), "missing file: message");

    const char *bad2[] = {pth("g/*.none")};
    TAP_OK(mc_docsource_open(bad2, 1, &c, &s, &err) == MC_ERR_NOTFOUND,
           "glob with no match: open fails");
    snprintf(want, sizeof want, "no input matches '%s'", pth("g/*.none"));
    TAP_OK(msg_is(&err, want), "glob with no match: message");

    const char *bad3[] = {pth("g")};
    TAP_OK(mc_docsource_open(bad3, 1, &c, &s, &err) == MC_ERR_IO, "directory input: open fails");
    snprintf(want, sizeof want, "%s: cannot read: Is a directory", pth("g"));
    TAP_OK(msg_is(&err, want), "directory input: message");

    const char *bad4[] = {pth("g/*")};
    TAP_OK(mc_docsource_open(bad4, 1, &c, &s, &err) == MC_OK, "glob of files only: ok");
    mc_docsource_close(s);
    mkdir(pth("g/sub"), 0700);
    TAP_OK(mc_docsource_open(bad4, 1, &c, &s, &err) == MC_ERR_IO,
           "glob matching a directory: fails");
    snprintf(want, sizeof want, "%s: cannot read: Is a directory", pth("g/sub"));
    TAP_OK(msg_is(&err, want), "glob matching a directory: message names it");
    rmdir(pth("g/sub"));

    if (geteuid() != 0) {
        const char *ro = pth("noread.jsonl");
        write_str(ro, "{}\n");
        chmod(ro, 0);
        TAP_OK(mc_docsource_open(&ro, 1, &c, &s, &err) == MC_ERR_IO, "unreadable file: open fails");
        snprintf(want, sizeof want, "%s: cannot open: Permission denied", ro);
        TAP_OK(msg_is(&err, want), "unreadable file: message");
        unlink(ro);
    } else {
        TAP_SKIP("running as root: permission bits are not enforced");
        TAP_SKIP("running as root");
    }

    const char *bad5[] = {"-", solo, "-"};
    TAP_OK(mc_docsource_open(bad5, 3, &c, &s, &err) == MC_ERR_USAGE &&
               msg_is(&err, "'-' (stdin) given more than once as an input"),
           "'-' twice: usage error");

    /* A file removed after open is reported when its turn comes, and the
     * error sticks: next() repeats it. */
    const char *gone = pth("gone.jsonl");
    write_str(gone, "{}\n");
    const char *vanish[] = {pth("g/a.jsonl"), gone};
    mc_record rec;
    int eof;
    TAP_OK(mc_docsource_open(vanish, 2, &c, &s, &err) == MC_OK,
           "vanishing file: open succeeds while it exists");
    unlink(gone);
    TAP_OK(mc_docsource_next(s, &rec, &eof, &err) == MC_OK && !eof && rec.line == 1,
           "vanishing file: first input read");
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", gone);
    TAP_OK(mc_docsource_next(s, &rec, &eof, &err) == MC_ERR_NOTFOUND && msg_is(&err, want),
           "vanishing file: error when its turn comes");
    memset(&err, 0, sizeof err);
    TAP_OK(mc_docsource_next(s, &rec, &eof, &err) == MC_ERR_NOTFOUND && msg_is(&err, want),
           "after an error, next() repeats it");
    mc_docsource_close(s);

    /* Progress before and after, over two files. */
    const char *two[] = {pth("g/a.jsonl"), pth("g/b.jsonl")};
    uint64_t done = 1, total = 0;
    TAP_OK(mc_docsource_open(two, 2, &c, &s, &err) == MC_OK, "two files: open");
    mc_docsource_progress(s, &done, &total);
    uint64_t sz = strlen("\"g/a.jsonl\"\n") + strlen("\"g/b.jsonl\"\n");
    TAP_OK(done == 0 && total == sz, "progress at start: 0 of %llu (got %llu of %llu)",
           (unsigned long long)sz, (unsigned long long)done, (unsigned long long)total);
    mc_docsource_next(s, &rec, &eof, &err);
    mc_docsource_progress(s, &done, &total);
    TAP_OK(done == sz / 2, "progress after the first file's line: %llu (want %llu)",
           (unsigned long long)done, (unsigned long long)sz / 2);
    mc_docsource_next(s, &rec, &eof, &err);
    mc_docsource_next(s, &rec, &eof, &err);
    mc_docsource_progress(s, &done, &total);
    TAP_OK(eof && done == sz, "progress at the end: done = total");
    TAP_OK(mc_docsource_next(s, &rec, &eof, &err) == MC_OK && eof, "next after eof: eof again");
    mc_docsource_close(s);
}

/* stdin: in a child with a pipe (or a file) on fd 0; the child reports the
 * failed check's number as its exit status. */
static int stdin_child(int fd, const char *extra)
{
    dup2(fd, 0);
    close(fd);
    const char *in[] = {"-", extra};
    mc_docsource_config c = {MC_INPUT_JSONL, 0, 0};
    mc_docsource *s;
    mc_error err;
    if (mc_docsource_open(in, extra ? 2 : 1, &c, &s, &err)) return 10;
    const char *want[] = {"{\"text\":\"from stdin\"}", "{\"text\":\"second\"}"};
    mc_record rec;
    int eof;
    for (int i = 0; i < 2; i++) {
        if (mc_docsource_next(s, &rec, &eof, &err) || eof) return 11 + i;
        if (strcmp(rec.file, "<stdin>") || rec.line != (uint64_t)(i == 0 ? 1 : 3) ||
            rec.len != strlen(want[i]) || memcmp(rec.data, want[i], rec.len))
            return 13 + i;
    }
    uint64_t done, total;
    mc_docsource_progress(s, &done, &total);
    if (total != 0) return 15;
    if (extra) {
        if (mc_docsource_next(s, &rec, &eof, &err) || eof || strcmp(rec.file, extra)) return 16;
    }
    if (mc_docsource_next(s, &rec, &eof, &err) || !eof) return 17;
    mc_docsource_close(s);
    if (fcntl(0, F_GETFD) < 0) return 18; /* stdin must not be closed by the library */
    return 0;
}

static void test_stdin(void)
{
    const char *data = "{\"text\":\"from stdin\"}\r\n\n{\"text\":\"second\"}";
    int pfd[2];
    if (pipe(pfd)) {
        TAP_SKIP("pipe failed");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[1]);
        _exit(stdin_child(pfd[0], pth("g/a.jsonl")));
    }
    close(pfd[0]);
    if (write(pfd[1], data, strlen(data)) < 0) TAP_DIAG("write to pipe: %s", strerror(errno));
    close(pfd[1]);
    int status = -1;
    waitpid(pid, &status, 0);
    TAP_OK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "stdin from a pipe, then a file: records, '<stdin>', total 0 (child status %d)",
           WEXITSTATUS(status));

    const char *f = pth("stdin.jsonl");
    write_str(f, data);
    int fd = open(f, O_RDONLY);
    pid = fork();
    if (pid == 0) _exit(stdin_child(fd, NULL));
    close(fd);
    waitpid(pid, &status, 0);
    TAP_OK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "stdin redirected from a file: read as given, total 0 (child status %d)",
           WEXITSTATUS(status));
}

/* ---- mc_jsonl_extract -------------------------------------------------- */

static mc_record mkrec(const char *json, uint64_t line)
{
    mc_record r = {json, strlen(json), "c.jsonl", line};
    return r;
}

static void test_extract(void)
{
    const char *keys[] = {"text", "meta"};
    mc_buf vals[2] = {MC_BUF_INIT, MC_BUF_INIT};
    mc_error err;
    mc_buf_append(&vals[0], "old content", 11, &err);

    mc_record r = mkrec("{\"id\":3,\"meta\":\"m\\u00e9\",\"text\":\"a\\u0000b\\n\\u4e2d\"}", 5);
    TAP_OK(mc_jsonl_extract(&r, keys, 2, vals, &err) == MC_OK, "extract: two keys");
    TAP_OK(vals[0].len == 7 && memcmp(vals[0].data, "a\0b\n\xe4\xb8\xad", 7) == 0,
           "extract: value replaces old content, keeps NUL, decodes escapes to UTF-8 (len %zu)",
           vals[0].len);
    TAP_OK(vals[1].len == 3 && memcmp(vals[1].data, "m\xc3\xa9", 3) == 0, "extract: second key");

    r = mkrec("{\"text\":\"x\",\"text\":\"y\"}", 1);
    TAP_OK(mc_jsonl_extract(&r, keys, 1, vals, &err) == MC_OK && vals[0].len == 1 &&
               vals[0].data[0] == 'y',
           "extract: a repeated key keeps its last value");

    struct {
        const char *json;
        mc_status st;
        const char *msg;
    } bad[] = {
        {"{\"text\": }", MC_ERR_FORMAT,
         "c.jsonl:12: invalid JSON at column 10: unexpected token near '}'"},
        {"{\"text\":\"abc\"", MC_ERR_FORMAT,
         "c.jsonl:12: invalid JSON at column 13: '}' expected near end of file"},
        {"{\"text\":\"a\" } trailing", MC_ERR_FORMAT,
         "c.jsonl:12: invalid JSON at column 22: end of file expected near 'trailing'"},
        {"{\"text\":\"a\xff b\"}", MC_ERR_FORMAT,
         "c.jsonl:12: invalid UTF-8 in JSON at column 10: unable to decode byte 0xff near '\"a'"},
        {"[{\"text\":\"a\"}]", MC_ERR_FORMAT, "c.jsonl:12: expected a JSON object, got an array"},
        {"\"text\"", MC_ERR_FORMAT, "c.jsonl:12: expected a JSON object, got a string"},
        {"42", MC_ERR_FORMAT, "c.jsonl:12: expected a JSON object, got a number"},
        {"{\"txt\":\"a\"}", MC_ERR_NOTFOUND, "c.jsonl:12: missing key 'text'"},
        {"{\"text\":7}", MC_ERR_FORMAT, "c.jsonl:12: key 'text' is a number, expected a string"},
        {"{\"text\":1.5}", MC_ERR_FORMAT, "c.jsonl:12: key 'text' is a number, expected a string"},
        {"{\"text\":null}", MC_ERR_FORMAT, "c.jsonl:12: key 'text' is null, expected a string"},
        {"{\"text\":true}", MC_ERR_FORMAT,
         "c.jsonl:12: key 'text' is a boolean, expected a string"},
        {"{\"text\":[\"a\"]}", MC_ERR_FORMAT,
         "c.jsonl:12: key 'text' is an array, expected a string"},
        {"{\"text\":{\"a\":1}}", MC_ERR_FORMAT,
         "c.jsonl:12: key 'text' is an object, expected a string"},
        {"{\"text\":\"ok\",\"meta\":3}", MC_ERR_FORMAT,
         "c.jsonl:12: key 'meta' is a number, expected a string"},
        {"{\"text\":\"ok\"}", MC_ERR_NOTFOUND, "c.jsonl:12: missing key 'meta'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = mkrec(bad[i].json, 12);
        mc_status st = mc_jsonl_extract(&r, keys, 2, vals, &err);
        TAP_OK(st == bad[i].st && msg_is(&err, bad[i].msg), "extract error: %s", bad[i].msg);
    }

    /* A whole-file record (line 0) is named by its file alone. */
    mc_record w = {"[]", 2, "doc.txt", 0};
    TAP_OK(mc_jsonl_extract(&w, keys, 1, vals, &err) == MC_ERR_FORMAT &&
               msg_is(&err, "doc.txt: expected a JSON object, got an array"),
           "extract error on a line-0 record: 'FILE: ' prefix");

    /* An embedded NUL byte in the record itself is not valid JSON. */
    mc_record nul = {"{\"text\":\"a\0b\"}", 14, "c.jsonl", 2};
    TAP_OK(mc_jsonl_extract(&nul, keys, 1, vals, &err) == MC_ERR_FORMAT &&
               msg_has(&err, "c.jsonl:2: invalid JSON at column"),
           "extract: a raw NUL byte in the line is invalid JSON (%s)", err.msg);
    mc_buf_free(&vals[0]);
    mc_buf_free(&vals[1]);
}

static void rm_tree(void)
{
    const char *files[] = {"a.jsonl",
                           "blank.jsonl",
                           "cr.jsonl",
                           "t1.txt",
                           "t2.txt",
                           "t3.txt",
                           "big.jsonl",
                           "big.jsonl.zst",
                           "trunc.jsonl.zst",
                           "corrupt.jsonl.zst",
                           "corrupt2.jsonl.zst",
                           "empty.jsonl.zst",
                           "doc.txt.zst",
                           "lim.jsonl",
                           "lim.txt",
                           "stdin.jsonl",
                           "g/b.jsonl",
                           "g/a10.jsonl",
                           "g/a.jsonl",
                           "g/C.jsonl",
                           "g/skip.txt"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(pth(files[i]));
    rmdir(pth("g"));
    rmdir(dir);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", "/tmp/mc-test-docsource-XXXXXX");
    if (!mkdtemp(dir)) {
        printf("Bail out! mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    test_jsonl_lines();
    test_text();
    test_big_and_zst();
    test_limits();
    test_fifo_limits();
    test_inputs();
    test_stdin();
    test_extract();
    rm_tree();
    return tap_done();
}
