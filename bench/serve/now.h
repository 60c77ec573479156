/* bench/serve/now.h - the micro-benchmarks' clock: CLOCK_MONOTONIC in
 * seconds (include after defining _POSIX_C_SOURCE). */
#ifndef MC_BENCH_NOW_H
#define MC_BENCH_NOW_H
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#endif
