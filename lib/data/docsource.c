/*
 * docsource.c - the stream of documents that mc-preprocess tokenizes: input
 * names and globs turned into an ordered list of files, each read (and
 * zstd-decompressed when its name ends in ".zst") through fixed-size
 * buffers, cut into records (lines or whole files) that carry their place;
 * and mc_jsonl_extract, which pulls string fields out of one JSONL record.
 * Memory is bounded whatever the input; see doc/ARCHITECTURE.md, "Data".
 */
/* glob, mkfifo, faccessat, strdup, posix_fadvise: POSIX.1-2008 and GNU
 * extensions, whether or not the build passes config.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "mc/docsource.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define DS_CHUNK ((size_t)1 << 20)          /* read / decompress buffer */
#define DS_DEFAULT_MAX ((uint64_t)64 << 20) /* 64 MiB per record */
#define DS_STDIN_NAME "<stdin>"

typedef struct ds_input {
    char *path; /* as given, or as produced by glob; "<stdin>" for "-" */
    int is_stdin;
    int is_zst;
} ds_input;

struct mc_docsource {
    mc_docsource_config cfg;
    size_t max; /* cfg.max_record_bytes, clamped to size_t */

    ds_input *in;
    size_t n, cap;
    uint64_t total; /* sum of on-disk sizes; 0 when any is unknown */

    size_t cur;     /* input being read; n when all are done */
    int fd;         /* -1 when the current input is not open */
    int input_done; /* whole-file record returned, or EOF seen */
    uint64_t line;  /* lines finished in the current input */

    /* Raw bytes as read from fd. For .zst they are ZSTD's input. */
    char *raw;
    size_t raw_pos, raw_len;
    int raw_eof;
    uint64_t raw_read;  /* bytes read from the current input */
    uint64_t done_base; /* bytes of inputs already finished */

    ZSTD_DCtx *dctx;
    char *zout;           /* decompressed bytes */
    size_t zret;          /* last ZSTD_decompressStream hint; 0 = frame ended */
    int zstarted, zflush; /* any input given to zstd; output was full */

    /* The current chunk of plain bytes: raw (plain input) or zout (.zst). */
    const char *chunk;
    size_t chunk_pos, chunk_len;

    char *rec; /* a record that straddles chunks */
    size_t rec_len, rec_cap;

    int failed; /* after an error, next() repeats it */
    mc_error saved;
};

/* ---- opening ----------------------------------------------------------- */

static mc_status add_input(mc_docsource *s, const char *path, int is_stdin, mc_error *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        ds_input *p = realloc(s->in, cap * sizeof *p);
        if (!p) return mc_error_set(err, MC_ERR_NOMEM, "out of memory (input list)");
        s->in = p;
        s->cap = cap;
    }
    char *copy = strdup(is_stdin ? DS_STDIN_NAME : path);
    if (!copy) return mc_error_set(err, MC_ERR_NOMEM, "out of memory (input list)");
    size_t len = strlen(path);
    s->in[s->n].path = copy;
    s->in[s->n].is_stdin = is_stdin;
    s->in[s->n].is_zst = !is_stdin && len >= 4 && strcmp(path + len - 4, ".zst") == 0;
    s->n++;
    return MC_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static mc_status expand_glob(mc_docsource *s, const char *pat, mc_error *err)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    /* GLOB_ERR: a directory we cannot read must not silently drop shards. */
    int rc = glob(pat, GLOB_ERR | GLOB_NOSORT, NULL, &g);
    mc_status st = MC_OK;
    if (rc == GLOB_NOMATCH)
        st = mc_error_set(err, MC_ERR_NOTFOUND, "no input matches '%s'", pat);
    else if (rc == GLOB_NOSPACE)
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory expanding '%s'", pat);
    else if (rc != 0)
        st = mc_error_set(err, MC_ERR_IO,
                          "cannot expand '%s': a directory on its path cannot be read", pat);
    if (rc == 0) {
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
        for (size_t i = 0; i < g.gl_pathc && !st; i++) st = add_input(s, g.gl_pathv[i], 0, err);
    }
    globfree(&g);
    return st;
}

/* The input exists, is readable and is not a directory. A regular file is
 * opened and closed again (the surest test of readability). A FIFO or a
 * pipe from the shell's <(...) is only stat-ed: opening it here would either
 * block until its writer starts or, once closed again, make that writer die
 * of SIGPIPE; it is opened when its turn comes. */
static mc_status check_input(mc_docsource *s, const ds_input *in, int *size_unknown, mc_error *err)
{
    struct stat st;
    if (in->is_stdin ? fstat(0, &st) : stat(in->path, &st))
        return mc_error_errno(err, errno == ENOENT ? MC_ERR_NOTFOUND : MC_ERR_IO, errno,
                              "%s: cannot open", in->path);
    if (S_ISDIR(st.st_mode))
        return mc_error_errno(err, MC_ERR_IO, EISDIR, "%s: cannot read", in->path);
    if (in->is_stdin || !S_ISREG(st.st_mode)) {
        *size_unknown = 1;
        if (!in->is_stdin && faccessat(AT_FDCWD, in->path, R_OK, AT_EACCESS))
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open", in->path);
        return MC_OK;
    }
    int fd = open(in->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mc_error_errno(err, errno == ENOENT ? MC_ERR_NOTFOUND : MC_ERR_IO, errno,
                              "%s: cannot open", in->path);
    close(fd);
    s->total += (uint64_t)st.st_size;
    return MC_OK;
}

mc_status mc_docsource_open(const char *const *inputs, size_t n, const mc_docsource_config *c,
                            mc_docsource **out, mc_error *err)
{
    *out = NULL;
    mc_docsource *s = calloc(1, sizeof *s);
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    s->fd = -1;
    if (c)
        s->cfg = *c;
    else
        s->cfg.format = MC_INPUT_JSONL;
    if (!s->cfg.max_record_bytes) s->cfg.max_record_bytes = DS_DEFAULT_MAX;
    /* Keep two bytes of headroom below SIZE_MAX for the "\r" and slack. */
    s->max = s->cfg.max_record_bytes > SIZE_MAX - 2 ? SIZE_MAX - 2
                                                    : (size_t)s->cfg.max_record_bytes;

    mc_status st = MC_OK;
    int nstdin = 0;
    for (size_t i = 0; i < n && !st; i++) {
        const char *name = inputs[i];
        if (strcmp(name, "-") == 0) {
            if (nstdin++)
                st = mc_error_set(err, MC_ERR_USAGE,
                                  "'-' (stdin) given more than once as an input");
            else
                st = add_input(s, name, 1, err);
        } else if (strpbrk(name, "*?[")) {
            st = expand_glob(s, name, err);
        } else {
            st = add_input(s, name, 0, err);
        }
    }
    int size_unknown = 0;
    for (size_t i = 0; i < s->n && !st; i++) st = check_input(s, &s->in[i], &size_unknown, err);
    if (!st && size_unknown) s->total = 0;
    if (!st) {
        s->raw = malloc(DS_CHUNK);
        if (!s->raw) st = mc_error_set(err, MC_ERR_NOMEM, "out of memory (read buffer)");
    }
    if (st) {
        mc_docsource_close(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

size_t mc_docsource_count(const mc_docsource *s) { return s->n; }

void mc_docsource_progress(const mc_docsource *s, uint64_t *done, uint64_t *total)
{
    /* Bytes read but not yet handed on (to the line splitter, or to zstd)
     * are not counted as done, so done tracks the records returned. */
    uint64_t pending = 0;
    if (s->fd >= 0) {
        if (s->in[s->cur].is_zst)
            pending = s->raw_len - s->raw_pos;
        else
            pending = s->chunk_len - s->chunk_pos;
    }
    if (done) *done = s->done_base + s->raw_read - pending;
    if (total) *total = s->total;
}

void mc_docsource_close(mc_docsource *s)
{
    if (!s) return;
    if (s->fd > 0) close(s->fd);
    for (size_t i = 0; i < s->n; i++) free(s->in[i].path);
    free(s->in);
    free(s->raw);
    free(s->zout);
    free(s->rec);
    ZSTD_freeDCtx(s->dctx);
    free(s);
}

/* ---- reading ----------------------------------------------------------- */

static mc_status open_current(mc_docsource *s, mc_error *err)
{
    const ds_input *in = &s->in[s->cur];
    if (in->is_stdin) {
        s->fd = 0;
    } else {
        s->fd = open(in->path, O_RDONLY | O_CLOEXEC);
        if (s->fd < 0)
            return mc_error_errno(err, errno == ENOENT ? MC_ERR_NOTFOUND : MC_ERR_IO, errno,
                                  "%s: cannot open", in->path);
#ifdef POSIX_FADV_SEQUENTIAL
        posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    }
    s->input_done = 0;
    s->line = 0;
    s->raw_pos = s->raw_len = 0;
    s->raw_eof = 0;
    s->raw_read = 0;
    s->chunk = NULL;
    s->chunk_pos = s->chunk_len = 0;
    s->rec_len = 0;
    if (in->is_zst) {
        if (!s->dctx && !(s->dctx = ZSTD_createDCtx()))
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory (zstd context)");
        if (!s->zout && !(s->zout = malloc(DS_CHUNK)))
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory (zstd buffer)");
        ZSTD_DCtx_reset(s->dctx, ZSTD_reset_session_only);
        s->zret = 0;
        s->zstarted = s->zflush = 0;
    }
    return MC_OK;
}

static void close_current(mc_docsource *s)
{
    if (s->fd > 0) close(s->fd);
    s->fd = -1;
    s->done_base += s->raw_read;
    s->raw_read = 0;
    s->raw_pos = s->raw_len = 0;
    s->chunk_pos = s->chunk_len = 0;
    s->cur++;
}

static mc_status read_raw(mc_docsource *s, mc_error *err)
{
    ssize_t r;
    do r = read(s->fd, s->raw, DS_CHUNK);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return mc_error_errno(err, MC_ERR_IO, errno, "%s: read failed at byte %llu",
                              s->in[s->cur].path, (unsigned long long)s->raw_read);
    s->raw_pos = 0;
    s->raw_len = (size_t)r;
    s->raw_read += (uint64_t)r;
    if (r == 0) s->raw_eof = 1;
    return MC_OK;
}

/* Make the next chunk of plain bytes current; *eof = 1 at the input's end. */
static mc_status fill(mc_docsource *s, int *eof, mc_error *err)
{
    const ds_input *in = &s->in[s->cur];
    *eof = 0;
    mc_status st;
    if (!in->is_zst) {
        if ((st = read_raw(s, err))) return st;
        s->chunk = s->raw;
        s->chunk_pos = 0;
        s->chunk_len = s->raw_len;
        s->raw_pos = s->raw_len;
        *eof = s->raw_len == 0;
        return MC_OK;
    }
    for (;;) {
        if (s->raw_pos == s->raw_len && !s->raw_eof && !s->zflush) {
            if ((st = read_raw(s, err))) return st;
        }
        if (s->raw_eof && s->raw_pos == s->raw_len && !s->zflush) {
            /* A nonzero hint means zstd still expects input for the frame. */
            if (!s->zstarted)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s: empty file, not a zstd stream (no frame)", in->path);
            if (s->zret != 0)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s: truncated zstd stream (input ends inside a frame)",
                                    in->path);
            *eof = 1;
            return MC_OK;
        }
        ZSTD_inBuffer zin = {s->raw, s->raw_len, s->raw_pos};
        ZSTD_outBuffer zout = {s->zout, DS_CHUNK, 0};
        uint64_t at = s->raw_read - s->raw_len + s->raw_pos;
        size_t r = ZSTD_decompressStream(s->dctx, &zout, &zin);
        if (ZSTD_isError(r))
            return mc_error_set(err, MC_ERR_FORMAT, "%s: zstd: %s (near compressed byte %llu)",
                                in->path, ZSTD_getErrorName(r), (unsigned long long)at);
        if (zin.pos > s->raw_pos) s->zstarted = 1;
        s->raw_pos = zin.pos;
        s->zret = r;
        /* A full output buffer may leave decoded bytes inside zstd: call
         * again before concluding anything from the end of the input. */
        s->zflush = zout.pos == zout.size;
        if (zout.pos) {
            s->chunk = s->zout;
            s->chunk_pos = 0;
            s->chunk_len = zout.pos;
            return MC_OK;
        }
    }
}

/* Grow the record buffer to hold need bytes; callers keep need <= max + 2. */
static mc_status rec_reserve(mc_docsource *s, size_t need, mc_error *err)
{
    if (need <= s->rec_cap) return MC_OK;
    size_t cap = s->rec_cap ? s->rec_cap : 65536;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > s->max + 2) cap = s->max + 2;
    if (cap < need) cap = need;
    char *p = realloc(s->rec, cap);
    if (!p)
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory (record of %zu bytes)",
                            s->in[s->cur].path, need);
    s->rec = p;
    s->rec_cap = cap;
    return MC_OK;
}

static mc_status too_long(mc_docsource *s, uint64_t line, mc_error *err)
{
    if (line)
        return mc_error_set(err, MC_ERR_LIMIT,
                            "%s:%llu: record longer than %llu bytes (--max-document-bytes)",
                            s->in[s->cur].path, (unsigned long long)line,
                            (unsigned long long)s->cfg.max_record_bytes);
    return mc_error_set(err, MC_ERR_LIMIT,
                        "%s: record longer than %llu bytes (--max-document-bytes)",
                        s->in[s->cur].path, (unsigned long long)s->cfg.max_record_bytes);
}

static int is_blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\f' && p[i] != '\v') return 0;
    return 1;
}

/* Next line of the current input. Blank JSONL lines (empty or only white
 * space) are skipped silently but still counted, so the line numbers in
 * messages match an editor's; they carry no document, and an empty line
 * at the end of a file is common. Text lines (--lines) are returned even
 * when empty: whether an empty document is an error is the caller's call. */
static mc_status next_line(mc_docsource *s, mc_record *rec, int *got, mc_error *err)
{
    mc_status st;
    int partial = 0;
    s->rec_len = 0;
    for (;;) {
        const char *data;
        size_t len;
        if (s->chunk_pos == s->chunk_len) {
            int eof;
            if ((st = fill(s, &eof, err))) return st;
            if (eof) {
                s->input_done = 1;
                if (!partial) return MC_OK;
                data = s->rec;
                len = s->rec_len;
                goto have_line; /* the last line, without its '\n' */
            }
        }
        const char *p = s->chunk + s->chunk_pos;
        size_t avail = s->chunk_len - s->chunk_pos;
        const char *nl = memchr(p, '\n', avail);
        size_t take = nl ? (size_t)(nl - p) : avail;
        if (nl && !partial) {
            /* The common case: the whole line is in the chunk, no copy. */
            data = p;
            len = take;
            s->chunk_pos += take + 1;
        } else {
            /* +1 allows a "\r" that will be stripped from the line's end. */
            if (take > s->max + 1 - s->rec_len) return too_long(s, s->line + 1, err);
            if ((st = rec_reserve(s, s->rec_len + take, err))) return st;
            memcpy(s->rec + s->rec_len, p, take);
            s->rec_len += take;
            s->chunk_pos += take + (nl != NULL);
            partial = 1;
            if (!nl) continue;
            data = s->rec;
            len = s->rec_len;
        }
    have_line:
        s->line++;
        if (len && data[len - 1] == '\r') len--;
        if (len > s->max) return too_long(s, s->line, err);
        if (s->cfg.format == MC_INPUT_JSONL && is_blank(data, len)) {
            if (s->input_done) return MC_OK;
            partial = 0;
            s->rec_len = 0;
            continue;
        }
        rec->data = data;
        rec->len = len;
        rec->file = s->in[s->cur].path;
        rec->line = s->line;
        *got = 1;
        return MC_OK;
    }
}

/* The whole input as one record (text, one document per file). An empty
 * file gives an empty record, for the caller to report or skip. */
static mc_status next_file(mc_docsource *s, mc_record *rec, int *got, mc_error *err)
{
    mc_status st;
    s->rec_len = 0;
    for (;;) {
        if (s->chunk_pos == s->chunk_len) {
            int eof;
            if ((st = fill(s, &eof, err))) return st;
            if (eof) break;
        }
        size_t take = s->chunk_len - s->chunk_pos;
        if (take > s->max - s->rec_len) return too_long(s, 0, err);
        if ((st = rec_reserve(s, s->rec_len + take, err))) return st;
        memcpy(s->rec + s->rec_len, s->chunk + s->chunk_pos, take);
        s->rec_len += take;
        s->chunk_pos = s->chunk_len;
    }
    s->input_done = 1;
    rec->data = s->rec ? s->rec : "";
    rec->len = s->rec_len;
    rec->file = s->in[s->cur].path;
    rec->line = 0;
    *got = 1;
    return MC_OK;
}

mc_status mc_docsource_next(mc_docsource *s, mc_record *rec, int *eof, mc_error *err)
{
    *eof = 0;
    if (s->failed) {
        if (err) *err = s->saved;
        return s->saved.code;
    }
    mc_status st = MC_OK;
    for (;;) {
        if (s->fd < 0) {
            if (s->cur >= s->n) {
                *eof = 1;
                return MC_OK;
            }
            if ((st = open_current(s, &s->saved))) break;
        }
        int got = 0;
        if (!s->input_done) {
            int whole = s->cfg.format == MC_INPUT_TEXT && !s->cfg.lines;
            st = whole ? next_file(s, rec, &got, &s->saved) : next_line(s, rec, &got, &s->saved);
            if (st) break;
        }
        if (got) return MC_OK;
        close_current(s);
    }
    s->failed = 1;
    if (err) *err = s->saved;
    return st;
}

/* ---- JSONL fields ------------------------------------------------------ */

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

/* jansson quotes the input near the error; keep the message on one line. */
static void one_line(char *t)
{
    for (; *t; t++)
        if ((unsigned char)*t < 0x20) *t = ' ';
}

mc_status mc_jsonl_extract(const mc_record *rec, const char *const *keys, size_t nkeys,
                           mc_buf *vals, mc_error *err)
{
    char where[512];
    if (rec->line)
        snprintf(where, sizeof where, "%s:%llu", rec->file ? rec->file : "?",
                 (unsigned long long)rec->line);
    else
        snprintf(where, sizeof where, "%s", rec->file ? rec->file : "?");

    /* JSON_DECODE_ANY so a top-level scalar is reported as "not an object"
     * rather than as a syntax error; JSON_ALLOW_NUL keeps "\u0000" in
     * strings. A repeated key keeps its last value (jansson's default). */
    json_error_t je;
    json_t *root = json_loadb(rec->data, rec->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!root) {
        one_line(je.text);
        /* jansson checks that JSON text is UTF-8 and refuses it otherwise;
         * say so plainly, since the fix (re-encode the corpus) differs from
         * the fix for a syntax error. */
        if (json_error_code(&je) == json_error_invalid_utf8)
            return mc_error_set(err, MC_ERR_FORMAT, "%s: invalid UTF-8 in JSON at column %d: %s",
                                where, je.column, je.text);
        return mc_error_set(err, MC_ERR_FORMAT, "%s: invalid JSON at column %d: %s", where,
                            je.column, je.text);
    }
    mc_status st = MC_OK;
    if (!json_is_object(root)) {
        st = mc_error_set(err, MC_ERR_FORMAT, "%s: expected a JSON object, got %s", where,
                          json_kind(root));
        goto done;
    }
    for (size_t i = 0; i < nkeys; i++) {
        json_t *v = json_object_get(root, keys[i]);
        if (!v) {
            st = mc_error_set(err, MC_ERR_NOTFOUND, "%s: missing key '%s'", where, keys[i]);
            goto done;
        }
        if (!json_is_string(v)) {
            st = mc_error_set(err, MC_ERR_FORMAT, "%s: key '%s' is %s, expected a string", where,
                              keys[i], json_kind(v));
            goto done;
        }
        vals[i].len = 0;
        if ((st = mc_buf_append(&vals[i], json_string_value(v), json_string_length(v), err)))
            goto done;
    }
done:
    json_decref(root);
    return st;
}
