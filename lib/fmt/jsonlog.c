/*
 * jsonlog.c - the JSON-lines metrics log (--log-json): string and number
 * spelling, and an append-only file written one whole line per write().
 *
 * O_APPEND plus one write() per line means a line is never interleaved with
 * another writer's and a killed run leaves at most one torn last line, which
 * the next run (resuming) closes off before appending.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "fmt/tfevents.h"
#include "mc/file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mc_status mc_jsonlog_string(mc_buf *out, const char *s, mc_error *err)
{
    mc_status st = mc_buf_append(out, "\"", 1, err);
    for (const unsigned char *p = (const unsigned char *)s; st == MC_OK && *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            st = mc_buf_append(out, e, 2, err);
        } else if (*p < 0x20) {
            st = mc_buf_printf(out, err, "\\u%04x", *p);
        } else {
            st = mc_buf_append(out, p, 1, err); /* UTF-8 passes through */
        }
    }
    return st ? st : mc_buf_append(out, "\"", 1, err);
}

mc_status mc_jsonlog_number(mc_buf *out, double v, mc_error *err)
{
    if (!isfinite(v)) return mc_buf_append(out, "null", 4, err);
    /* 17 significant digits always read back exactly; fewer usually do, and
     * 0.0003 reads better than 0.00029999999999999997. */
    char s[32];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v) break;
    }
    /* A decimal comma (a caller's LC_NUMERIC) is not JSON. */
    for (char *c = s; *c; c++)
        if (*c == ',') *c = '.';
    return mc_buf_append(out, s, strlen(s), err);
}

mc_status mc_jsonlog_open(mc_jsonlog *j, const char *path, mc_error *err)
{
    j->fd = -1;
    j->path = NULL;
    mc_status s = mc_check_output_dir(path, err);
    if (s) return s;
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot open JSON log", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        s = mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot stat", path);
        close(fd);
        return s;
    }
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
        close(fd);
        return mc_error_set(err, MC_ERR_IO, "%s: not a regular file", path);
    }
    j->path = strdup(path);
    if (!j->path) {
        close(fd);
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", path);
    }
    j->fd = fd;
    /* A torn last line from a killed run: end it, so the next line parses. */
    char last;
    if (S_ISREG(st.st_mode) && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) == 1 &&
        last != '\n')
        return mc_jsonlog_write(j, "\n", 1, err);
    return MC_OK;
}

mc_status mc_jsonlog_write(mc_jsonlog *j, const char *line, size_t n, mc_error *err)
{
    while (n > 0) {
        ssize_t w = write(j->fd, line, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot write", j->path);
        }
        line += w;
        n -= (size_t)w;
    }
    return MC_OK;
}

mc_status mc_jsonlog_close(mc_jsonlog *j, mc_error *err)
{
    mc_status s = MC_OK;
    if (j->fd >= 0) {
        if (fsync(j->fd) != 0 && errno != EINVAL && errno != EROFS)
            s = mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot fsync", j->path);
        if (close(j->fd) != 0 && s == MC_OK)
            s = mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot close", j->path);
    }
    free(j->path);
    j->fd = -1;
    j->path = NULL;
    return s;
}
