/*
 * rank_check.h - the check macro of the multi-rank test programs.
 *
 * Every rank counts its checks and failures in a context `c` that has an
 * mc_grid `g` and ints `checks`, `failed`; a failure prints the rank and the
 * place on stderr, and the program's summary (after a reduction over the
 * ranks) decides the exit status.
 */
#ifndef MC_TESTS_RANK_CHECK_H
#define MC_TESTS_RANK_CHECK_H

#include <stdio.h>

#define CHECK(c, cond, ...)                                                              \
    do {                                                                                 \
        (c)->checks++;                                                                   \
        if (!(cond)) {                                                                   \
            (c)->failed++;                                                               \
            fprintf(stderr, "rank %d: FAILED %s:%d: ", (c)->g.rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
        }                                                                                \
    } while (0)

#endif
