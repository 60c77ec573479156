/*
 * ckpt_dir.c - the directories of a checkpoint (bottom layer): creating the
 * checkpoint directory, the hidden temporary iteration directory, and
 * publishing it (fsync, rename into place, fsync, then the latest
 * pointer), so that a crash at any point leaves the previous checkpoint
 * and pointer intact. fsync and removal of whole paths are lib/core's
 * (mc/file.h).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "mc/file.h"

/* Not mkdtemp: its 0700 would stay on the directory, which is renamed,
 * not copied, into place. */
int ck_make_tmpdir(char *tmpl)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char *x = tmpl + strlen(tmpl) - 6;
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
        for (int i = 0; i < 6; i++) x[i] = abc[r[i] % (sizeof abc - 1)];
        if (mkdir(tmpl, 0777) == 0) return 0;
        if (errno != EEXIST) return -1;
    }
    return -1;
}

mc_status ck_mkdir_p(const char *dir, mc_error *err)
{
    char *p = strdup(dir);
    if (!p) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create directory '%s'", dir, p);
                free(p);
                return MC_ERR_IO;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mc_error_set(err, MC_ERR_IO, "%s: not a directory", dir);
    return MC_OK;
}

mc_status ck_publish(const char *dir, const char *tmp, const char *final, int64_t iteration,
                     int *tmp_gone, mc_error *err)
{
    mc_status st;
    *tmp_gone = 0;
    /* The manifest goes in before the rename, so it is atomic with the files. */
    if ((st = ck_manifest_write(tmp, err)) != MC_OK || (st = mc_fsync_path(tmp, err)) != MC_OK)
        return st;
    /* An existing iteration directory is swapped out atomically (so the
     * pointer never names a missing directory) and removed afterwards. */
    if (rename(tmp, final) != 0) {
        int e = errno;
        if (e != ENOTEMPTY && e != EEXIST)
            return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot rename '%s' to it", final, tmp);
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
            /* No exchange on this file system: remove, then rename. */
            if (mc_remove_tree(final) != 0 || rename(tmp, final) != 0)
                return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot replace it", final);
        } else if (mc_remove_tree(tmp) != 0) {
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot remove the replaced copy '%s'",
                                  final, tmp);
        }
    }
    if ((st = mc_fsync_path(dir, err)) != MC_OK) return st;
    /* The final directory is in place; from here a failure leaves the
     * previous pointer, which still names a complete checkpoint. */
    *tmp_gone = 1;
    char *latest = mc_strprintf("%s/" MC_CKPT_LATEST, dir), num[32];
    if (!latest) return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", dir);
    int len = snprintf(num, sizeof num, "%" PRId64 "\n", iteration);
    mc_afile f;
    if ((st = mc_afile_open(&f, latest, err)) == MC_OK) {
        if ((st = mc_afile_write(&f, num, (size_t)len, err)) == MC_OK)
            st = mc_afile_commit(&f, err);
        mc_afile_abort(&f);
    }
    free(latest);
    return st;
}
