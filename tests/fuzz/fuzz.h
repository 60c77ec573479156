/*
 * fuzz.h - what the libFuzzer harnesses of tests/fuzz share: a scratch
 * directory per process, writing an input (or a part of it) to a file,
 * splitting an input into the files of a multi-file format at a separator,
 * and a byte reader for the harnesses that build their input from choices.
 * Each harness is one LLVMFuzzerTestOneInput over libmc's public API; they
 * are built by configure --enable-fuzzing and run by make fuzz
 * (tests/fuzz/run.sh; doc/ARCHITECTURE.md, "Tests").
 */
#ifndef MC_FUZZ_H
#define MC_FUZZ_H

#include <fcntl.h>
#include <sys/stat.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where a multi-file input is cut into its files (the seeds are built with
 * it by tests/fuzz/run.sh). */
#define FUZZ_SEP "\n--mc-fuzz-file--\n"

/* This process's scratch directory (made once, under $TMPDIR or /tmp). */
static inline const char *fuzz_dir(void)
{
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/mc-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

/* dir/name, in a static buffer per slot (0..7). */
static inline const char *fuzz_path(int slot, const char *name)
{
    static char p[8][640];
    snprintf(p[slot & 7], sizeof p[0], "%s/%s", fuzz_dir(), name);
    return p[slot & 7];
}

/* Replace the file at path with n bytes of d. */
static inline void fuzz_write(const char *path, const void *d, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const char *p = d;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) {
            perror(path);
            abort();
        }
        p += k;
        n -= (size_t)k;
    }
    close(fd);
}

/* Cut d[0..n) at FUZZ_SEP into at most max parts; returns how many. A
 * missing separator leaves the later parts empty. */
static inline int fuzz_split(const uint8_t *d, size_t n, const uint8_t **part, size_t *len, int max)
{
    size_t sl = strlen(FUZZ_SEP);
    int k = 0;
    for (int i = 0; i < max; i++) part[i] = d + n, len[i] = 0;
    while (k < max) {
        const uint8_t *at = k + 1 < max ? memmem(d, n, FUZZ_SEP, sl) : NULL;
        part[k] = d;
        len[k] = at ? (size_t)(at - d) : n;
        k++;
        if (!at) break;
        n -= (size_t)(at - d) + sl;
        d = at + sl;
    }
    return k;
}

/* Choices drawn from the input's bytes; zeros once it is used up, so an
 * empty input makes every first choice. */
typedef struct fuzz_bytes {
    const uint8_t *p;
    size_t n;
} fuzz_bytes;

static inline uint8_t fuzz_u8(fuzz_bytes *b)
{
    if (!b->n) return 0;
    b->n--;
    return *b->p++;
}

static inline uint64_t fuzz_u64(fuzz_bytes *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)fuzz_u8(b) << (8 * i);
    return v;
}

/* A string of the input: a length byte, then that many bytes (malloc'd,
 * NUL-terminated; embedded NULs end it early, as a C string). */
static inline char *fuzz_str(fuzz_bytes *b)
{
    size_t k = fuzz_u8(b);
    if (k == 255) k = fuzz_u8(b) * 16u; /* now and then a longer one */
    if (k > b->n) k = b->n;
    char *s = malloc(k + 1);
    if (!s) abort();
    memcpy(s, b->p, k);
    s[k] = 0;
    b->p += k;
    b->n -= k;
    return s;
}

#endif
