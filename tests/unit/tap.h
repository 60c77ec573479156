/*
 * tap.h - a minimal Test Anything Protocol emitter for the C unit tests.
 *
 * Each test program prints "1..N" at the end (plan at the end is valid TAP),
 * one "ok"/"not ok" line per check, and exits non-zero if any check failed.
 * Diagnostics go to stdout as "# ..." lines, which automake's TAP driver
 * copies into the test log.
 */
#ifndef MC_TAP_H
#define MC_TAP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_n = 0, tap_failed = 0;

#define TAP_OK(cond, ...)                                                   \
    do {                                                                    \
        int tap_c_ = !!(cond);                                              \
        tap_n++;                                                            \
        printf("%s %d - ", tap_c_ ? "ok" : "not ok", tap_n);                \
        printf(__VA_ARGS__);                                                \
        printf("\n");                                                       \
        if (!tap_c_) {                                                      \
            tap_failed++;                                                   \
            printf("#   failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                   \
        fflush(stdout);                                                     \
    } while (0)

#define TAP_DIAG(...)        \
    do {                     \
        printf("# ");        \
        printf(__VA_ARGS__); \
        printf("\n");        \
    } while (0)

#define TAP_SKIP(reason)                              \
    do {                                              \
        tap_n++;                                      \
        printf("ok %d # SKIP %s\n", tap_n, (reason)); \
    } while (0)

static inline int tap_done(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

#endif
