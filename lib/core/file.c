/*
 * file.c - whole-file read-only maps, whole-file reads, atomic file
 * writing (temporary name in the same directory, fsync, rename, fsync of the
 * directory), and fsync and removal of whole paths for directory writers.
 *
 * The promise this file keeps for every tool: nothing half-written ever
 * carries its final name. A failed write (full disk, file-size limit) closes
 * and unlinks the temporary at once, so a tool that then exits on the error
 * leaves nothing behind even if it never calls mc_afile_abort.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/file.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define AFILE_BUF_SIZE ((size_t)1 << 20)

/* ---- maps ---------------------------------------------------------------- */

mc_status mc_map_file(const char *path, mc_map *m, mc_error *err)
{
    m->data = NULL;
    m->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot stat", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mc_error_set(err, MC_ERR_IO, "%s: not a regular file", path);
    }
    if ((uintmax_t)st.st_size > (uintmax_t)SIZE_MAX) {
        close(fd);
        return mc_error_set(err, MC_ERR_LIMIT, "%s: file too large to map", path);
    }
    if (st.st_size == 0) { /* mmap of length 0 is EINVAL; an empty map is fine */
        close(fd);
        return MC_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps its own reference to the file */
    if (p == MAP_FAILED) return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot map", path);
    m->data = p;
    m->len = (size_t)st.st_size;
    return MC_OK;
}

void mc_unmap(mc_map *m)
{
    if (m->data && m->len) munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}

/* ---- whole-file reads ---------------------------------------------------- */

mc_status mc_read_stdin_line(char **out, mc_error *err)
{
    *out = NULL;
    if (isatty(STDIN_FILENO)) return mc_error_set(err, MC_ERR_USAGE, "stdin is a terminal");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
            line[--n] = '\0';
        if (n) {
            *out = line;
            return MC_OK;
        }
    }
    free(line);
    return MC_OK;
}

mc_status mc_read_file(const char *path, char **data, size_t *len, mc_error *err)
{
    *data = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open", path);
    struct stat st;
    size_t cap = 4096;
    if (fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            close(fd);
            return mc_error_set(err, MC_ERR_IO, "%s: is a directory", path);
        }
        /* The size is only a hint: pipes and /proc files report 0. */
        if (S_ISREG(st.st_mode) && st.st_size > 0 &&
            (uintmax_t)st.st_size < (uintmax_t)SIZE_MAX / 2)
            cap = (size_t)st.st_size + 1;
    }
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, cap);
    }
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            size_t ncap = cap * 2;
            char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                free(buf);
                close(fd);
                return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            close(fd);
            return mc_error_errno(err, MC_ERR_IO, e, "%s: read failed", path);
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    if (len) *len = n;
    return MC_OK;
}

/* ---- output directories -------------------------------------------------- */

/* The directory part of path ("." when there is none), malloc'd. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

mc_status mc_check_output_dir(const char *path, mc_error *err)
{
    size_t plen = strlen(path);
    if (plen == 0) return mc_error_set(err, MC_ERR_USAGE, "empty output file name");
    if (path[plen - 1] == '/')
        return mc_error_set(err, MC_ERR_USAGE, "%s: names a directory, not a file", path);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return mc_error_set(err, MC_ERR_USAGE, "%s: is a directory", path);
    char *dir = dir_of(path);
    if (!dir) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status rc = MC_OK;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            rc = mc_error_set(err, MC_ERR_IO, "%s: directory '%s' does not exist", path, dir);
        else
            rc = mc_error_errno(err, MC_ERR_IO, errno, "%s: directory '%s'", path, dir);
    } else if (!S_ISDIR(st.st_mode)) {
        rc = mc_error_set(err, MC_ERR_IO, "%s: '%s' is not a directory", path, dir);
    } else if (access(dir, W_OK | X_OK) != 0) {
        rc = mc_error_errno(err, MC_ERR_IO, errno, "%s: directory '%s' is not writable", path, dir);
    }
    free(dir);
    return rc;
}

/* ---- atomic files -------------------------------------------------------- */

/* The process umask, read without changing it where Linux allows: the
 * umask(0)-and-restore dance would race with other threads creating files. */
static mode_t current_umask(void)
{
    FILE *fp = fopen("/proc/self/status", "re");
    if (fp) {
        char line[256];
        unsigned int mask;
        while (fgets(line, sizeof line, fp)) {
            if (sscanf(line, "Umask: %o", &mask) == 1) {
                fclose(fp);
                return (mode_t)mask;
            }
        }
        fclose(fp);
    }
    mode_t m = umask(022);
    umask(m);
    return m;
}

/* Close and unlink the temporary; keeps path (for messages) and the buffer. */
static void afile_discard(mc_afile *f)
{
    if (f->tmp) {
        if (f->fd >= 0) close(f->fd);
        unlink(f->tmp);
        free(f->tmp);
        f->tmp = NULL;
        mc_temp_end(); /* begun before the temporary was created */
    }
    f->fd = -1;
    f->len = 0;
}

static void afile_release(mc_afile *f)
{
    free(f->path);
    free(f->buf);
    f->path = NULL;
    f->buf = NULL;
    f->cap = 0;
}

/* A write failure: name the final path (the user never sees the temporary
 * name) and drop the temporary at once. */
static mc_status afile_fail(mc_afile *f, int e, const char *what, mc_error *err)
{
    mc_error_errno(err, MC_ERR_IO, e, "%s: %s", f->path ? f->path : "(unnamed)", what);
    afile_discard(f);
    return MC_ERR_IO;
}

mc_status mc_afile_open(mc_afile *f, const char *path, mc_error *err)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    size_t n = strlen(path);
    f->tmp = malloc(n + sizeof ".tmp.XXXXXX");
    f->buf = malloc(AFILE_BUF_SIZE);
    if (!f->path || !f->tmp || !f->buf) {
        free(f->tmp);
        f->tmp = NULL;
        afile_release(f);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    }
    f->cap = AFILE_BUF_SIZE;
    memcpy(f->tmp, path, n);
    memcpy(f->tmp + n, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    /* counted before it exists: a signal from here on is deferred until the
     * temporary is gone (interrupt.c), never lands between */
    mc_temp_begin();
    f->fd = mkostemp(f->tmp, O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        free(f->tmp);
        f->tmp = NULL;
        mc_temp_end();
        afile_release(f);
        if (e == ENOENT) {
            char *dir = dir_of(path);
            mc_error_set(err, MC_ERR_IO, "%s: directory '%s' does not exist", path,
                         dir ? dir : "?");
            free(dir);
            return MC_ERR_IO;
        }
        return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create", path);
    }
    /* mkstemp creates 0600; give the file the mode open(..., 0666) would. */
    if (fchmod(f->fd, 0666 & ~current_umask()) != 0) {
        int e = errno;
        afile_discard(f);
        mc_error_errno(err, MC_ERR_IO, e, "%s: cannot set permissions", path);
        afile_release(f);
        return MC_ERR_IO;
    }
    return MC_OK;
}

/* write() all of p, retrying after EINTR and short writes. */
static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) /* should not happen for regular files; do not spin */
            return EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static mc_status afile_flush(mc_afile *f, mc_error *err)
{
    if (f->len == 0) return MC_OK;
    int e = write_all(f->fd, f->buf, f->len);
    if (e) return afile_fail(f, e, "write failed", err);
    f->len = 0;
    return MC_OK;
}

static mc_status afile_check_open(const mc_afile *f, mc_error *err)
{
    if (!f->tmp || f->fd < 0)
        return mc_error_set(err, MC_ERR_IO,
                            "%s: file is not open for writing (an earlier write failed)",
                            f->path ? f->path : "(unnamed)");
    return MC_OK;
}

/* A pending interrupt fails the write like a full disk would. */
static mc_status afile_interrupted(mc_afile *f, mc_error *err)
{
    mc_status st = mc_interrupt_check(f->path, err);
    if (st) afile_discard(f);
    return st;
}

mc_status mc_afile_write(mc_afile *f, const void *p, size_t n, mc_error *err)
{
    mc_status st = afile_check_open(f, err);
    if (st || (st = afile_interrupted(f, err))) return st;
    const unsigned char *s = p;
    if (f->len + n <= f->cap) {
        memcpy(f->buf + f->len, s, n);
        f->len += n;
        f->written += n;
        return MC_OK;
    }
    /* Fill the buffer, flush it, and write anything larger than a buffer
     * directly: copying it through the buffer would gain nothing. */
    size_t room = f->cap - f->len;
    memcpy(f->buf + f->len, s, room);
    f->len += room;
    s += room;
    n -= room;
    f->written += room;
    if ((st = afile_flush(f, err))) return st;
    if (n >= f->cap) {
        int e = write_all(f->fd, s, n);
        if (e) return afile_fail(f, e, "write failed", err);
    } else {
        memcpy(f->buf, s, n);
        f->len = n;
    }
    f->written += n;
    return MC_OK;
}

mc_status mc_afile_pwrite(mc_afile *f, const void *p, size_t n, uint64_t off, mc_error *err)
{
    mc_status st = afile_check_open(f, err);
    if (st || (st = afile_interrupted(f, err))) return st;
    if (off > f->written || n > f->written - off)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "%s: overwrite of bytes [%llu, %llu) beyond the %llu written", f->path,
                            (unsigned long long)off, (unsigned long long)(off + n),
                            (unsigned long long)f->written);
    if ((st = afile_flush(f, err))) return st;
    const unsigned char *s = p;
    while (n > 0) {
        ssize_t w = pwrite(f->fd, s, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return afile_fail(f, errno, "write failed", err);
        }
        if (w == 0) return afile_fail(f, EIO, "write failed", err);
        s += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return MC_OK;
}

mc_status mc_afile_commit(mc_afile *f, mc_error *err)
{
    mc_status st = afile_check_open(f, err);
    if (st) {
        afile_release(f);
        return st;
    }
    if ((st = afile_flush(f, err))) {
        afile_release(f);
        return st;
    }
    if (fsync(f->fd) != 0) {
        afile_fail(f, errno, "fsync failed", err);
        afile_release(f);
        return MC_ERR_IO;
    }
    /* close() can report a deferred write error (NFS); treat it as one. */
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) {
        afile_fail(f, errno, "close failed", err);
        afile_release(f);
        return MC_ERR_IO;
    }
    if (rename(f->tmp, f->path) != 0) {
        afile_fail(f, errno, "cannot rename into place", err);
        afile_release(f);
        return MC_ERR_IO;
    }
    free(f->tmp);
    f->tmp = NULL;
    mc_temp_end();
    /* Make the rename itself durable. Some file systems cannot fsync a
     * directory (EINVAL); the data is safe in the file either way. */
    char *dir = dir_of(f->path);
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS && errno != ENOTSUP) {
                int e = errno;
                close(dfd);
                mc_error_errno(err, MC_ERR_IO, e, "%s: fsync of directory '%s' failed", f->path,
                               dir);
                free(dir);
                afile_release(f);
                return MC_ERR_IO;
            }
            close(dfd);
        }
        free(dir);
    }
    afile_release(f);
    return MC_OK;
}

void mc_afile_abort(mc_afile *f)
{
    afile_discard(f);
    afile_release(f);
}

/* ---- paths --------------------------------------------------------------- */

mc_status mc_fsync_path(const char *path, mc_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open to fsync", path);
    /* Some file systems cannot fsync a directory; that is not a failure of ours. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS && errno != ENOTSUP) {
        int e = errno;
        close(fd);
        return mc_error_errno(err, MC_ERR_IO, e, "%s: fsync failed", path);
    }
    close(fd);
    return MC_OK;
}

static int remove_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) != 0 ? -1 : 0;
}

int mc_remove_tree(const char *path) { return nftw(path, remove_cb, 16, FTW_DEPTH | FTW_PHYS); }

int mc_next_line(const char *data, size_t len, size_t *pos, const char **line, size_t *n)
{
    if (*pos >= len) return 0;
    const char *s = data + *pos;
    const char *nl = memchr(s, '\n', len - *pos);
    size_t ll = nl ? (size_t)(nl - s) : len - *pos;
    *pos += ll + 1;
    if (ll && s[ll - 1] == '\r') ll--;
    *line = s;
    *n = ll;
    return 1;
}
