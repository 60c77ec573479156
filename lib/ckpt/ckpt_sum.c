/*
 * ckpt_sum.c - the checksum manifest of a checkpoint iteration directory
 * (bottom layer): checksums.xxh128 lists the XXH3 128-bit hash of every
 * file in the directory in xxh128sum's format, is written before the
 * directory is published and checked before HDF5 parses a file, which it
 * does not defend against corruption. The process-wide switch that turns
 * the check off (the tools' --no-verify) lives here too.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt_internal.h"
#include "mc/buf.h"
#include "mc/file.h"

/* Large reads: the file was just written or is about to be read whole, so
 * it is mostly in the page cache and the hash runs at memory speed. */
#define SUM_CHUNK (256u << 10) /* within L2: read() copies, XXH3 reads it back from cache */

static int verify_on = 1; /* process-wide, like the log level: set once by a tool's options */

void mc_ckpt_set_verify(int on) { verify_on = on != 0; }
int mc_ckpt_verify(void) { return verify_on; }

struct ck_manifest {
    char *file; /* DIR/checksums.xxh128, for messages */
    size_t n;
    char **name;
    char (*hex)[33];
};

/* XXH3-128 of the file at path as xxh128sum prints it (32 lowercase hex
 * digits, most significant first). */
static mc_status hash_file(const char *path, char hex[33], mc_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mc_error_errno(err, errno == ENOENT ? MC_ERR_FORMAT : MC_ERR_IO, errno,
                              "%s: cannot open", path);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_state_t *state = XXH3_createState();
    unsigned char *buf = malloc(SUM_CHUNK);
    mc_status st = MC_OK;
    if (!state || !buf || XXH3_128bits_reset(state) == XXH_ERROR) {
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (;;) {
        ssize_t got = read(fd, buf, SUM_CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = mc_error_errno(err, MC_ERR_IO, errno, "%s: read failed", path);
            goto done;
        }
        if (got == 0) break;
        XXH3_128bits_update(state, buf, (size_t)got);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state));
    for (size_t i = 0; i < sizeof c.digest; i++) snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
done:
    free(buf);
    XXH3_freeState(state);
    close(fd);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A name xxh128sum prints as it is (no escaping) and that stays in dir. */
static int plain_name(const char *s, size_t n)
{
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/' || s[i] == '\\' || s[i] == '\n' || s[i] == '\r' || s[i] == 0) return 0;
    return 1;
}

mc_status ck_manifest_write(const char *dir, mc_error *err)
{
    DIR *d = opendir(dir);
    if (!d) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot list the directory", dir);
    mc_buf names = MC_BUF_INIT, text = MC_BUF_INIT;
    mc_status st = MC_OK;
    struct dirent *e;
    errno = 0;
    while (!st && (e = readdir(d))) {
        struct stat sb;
        /* Hidden names are temporaries (mc_afile's); the manifest is not its own
         * entry. */
        if (e->d_name[0] == '.' || strcmp(e->d_name, MC_CKPT_MANIFEST) == 0) continue;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
            st = mc_error_errno(err, MC_ERR_IO, errno, "%s/%s: cannot stat", dir, e->d_name);
        else if (!S_ISREG(sb.st_mode))
            st = mc_error_set(err, MC_ERR_IO, "%s/%s: not a regular file", dir, e->d_name);
        else if (!plain_name(e->d_name, strlen(e->d_name)))
            st = mc_error_set(err, MC_ERR_IO, "%s: a file name " MC_CKPT_MANIFEST " cannot hold",
                              dir);
        else
            st = mc_buf_push_strdup(&names, e->d_name, err);
        errno = 0;
    }
    if (!st && errno)
        st = mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot list the directory", dir);
    closedir(d);
    const char **v = mc_buf_strs(&names);
    size_t n = mc_buf_nstrs(&names);
    if (n > 1) qsort(v, n, sizeof *v, cmp_str);
    for (size_t i = 0; !st && i < n; i++) {
        char hex[33], *path = mc_strprintf("%s/%s", dir, v[i]);
        if (!path)
            st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
        else if ((st = hash_file(path, hex, err)) == MC_OK)
            st = mc_buf_printf(&text, err, "%s  %s\n", hex, v[i]);
        free(path);
    }
    char *file = st ? NULL : mc_strprintf("%s/" MC_CKPT_MANIFEST, dir);
    if (!st && !file) st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    if (!st) {
        mc_afile f;
        if ((st = mc_afile_open(&f, file, err)) == MC_OK) {
            if ((st = mc_afile_write(&f, text.data, text.len, err)) == MC_OK)
                st = mc_afile_commit(&f, err);
            mc_afile_abort(&f);
        }
    }
    free(file);
    mc_buf_free(&text);
    mc_buf_free_strs(&names);
    return st;
}

void ck_manifest_free(ck_manifest *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) free(m->name[i]);
    free(m->name);
    free(m->hex);
    free(m->file);
    free(m);
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One line "<32 hex digits>  <name>" (or " *<name>", xxh128sum's binary
 * mode) into m's next entry; 0 when the line is not of that form. */
static int parse_line(ck_manifest *m, const char *s, size_t len, mc_error *err, mc_status *st)
{
    if (len < 35 || s[32] != ' ' || (s[33] != ' ' && s[33] != '*')) return 0;
    for (int i = 0; i < 32; i++)
        if (!is_hex(s[i])) return 0;
    const char *name = s + 34;
    size_t n = len - 34;
    if (!plain_name(name, n)) return 0;
    char *dup = strndup(name, n);
    if (!dup) {
        *st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", m->file);
        return 1;
    }
    m->name[m->n] = dup;
    for (int i = 0; i < 32; i++)
        m->hex[m->n][i] = (char)(s[i] >= 'A' && s[i] <= 'F' ? s[i] - 'A' + 'a' : s[i]);
    m->hex[m->n][32] = 0;
    m->n++;
    return 1;
}

mc_status ck_manifest_load(const char *dir, ck_manifest **out, mc_error *err)
{
    *out = NULL;
    ck_manifest *m = calloc(1, sizeof *m);
    if (!m || !(m->file = mc_strprintf("%s/" MC_CKPT_MANIFEST, dir))) {
        free(m);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    }
    struct stat sb;
    if (stat(m->file, &sb) != 0 && errno == ENOENT) {
        ck_manifest_free(m); /* an older checkpoint, or one written by hand: nothing to check */
        return MC_OK;
    }
    char *data = NULL;
    size_t len = 0;
    mc_status st = mc_read_file(m->file, &data, &len, err);
    size_t lines = 1;
    for (size_t i = 0; !st && i < len; i++) lines += data[i] == '\n';
    if (!st &&
        (!(m->name = calloc(lines, sizeof *m->name)) || !(m->hex = calloc(lines, sizeof *m->hex))))
        st = mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", m->file);
    size_t pos = 0, n, lineno = 0;
    const char *line;
    while (!st && mc_next_line(data, len, &pos, &line, &n)) {
        lineno++;
        if (n == 0) continue;
        if (!parse_line(m, line, n, err, &st)) {
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s:%zu: not a line of xxh128sum's format, '<32 hex "
                              "digits>  <file name>'",
                              m->file, lineno);
            break;
        }
        for (size_t i = 0; !st && i + 1 < m->n; i++)
            if (strcmp(m->name[i], m->name[m->n - 1]) == 0)
                st = mc_error_set(err, MC_ERR_FORMAT, "%s:%zu: %s is listed twice", m->file, lineno,
                                  m->name[i]);
    }
    free(data);
    if (st) {
        ck_manifest_free(m);
        return st;
    }
    *out = m;
    return MC_OK;
}

mc_status ck_manifest_check(const ck_manifest *m, const char *path, mc_error *err)
{
    if (!m) return MC_OK;
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->name[i], name) != 0) continue;
        char hex[33];
        mc_status st = hash_file(path, hex, err);
        if (st != MC_OK) return st;
        if (strcmp(hex, m->hex[i]) != 0)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s: checksum mismatch with %s (the file is damaged; "
                                "--no-verify skips "
                                "this check)",
                                path, m->file);
        return MC_OK;
    }
    return mc_error_set(err, MC_ERR_FORMAT, "%s: not listed in %s (--no-verify skips this check)",
                        path, m->file);
}
