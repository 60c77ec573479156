/*
 * bench/avx2/gemm_calls.c - where mc's GEMM time goes, by shape: a shared
 * library that mc loads as its OpenBLAS (MC_OPENBLAS=.../gemm_calls.so).
 * It is linked against the system's OpenBLAS, so mc finds every other
 * routine it looks up (cblas_sgemv, openblas_set_num_threads, ...) through
 * it, and it puts its own cblas_sgemm in front: each call is passed on
 * unchanged and timed. At exit it writes one line per distinct call (order,
 * transposes, M, N, K, beta) with its count, seconds and GFLOP/s, and a
 * total, to the file GEMM_CALLS_OUT names (stderr without it).
 *
 * The times are wall-clock around each call, taken under a lock: calls made
 * from several threads at once (mc's grouped MoE GEMM) are counted, but
 * their seconds overlap. The dense models bench/avx2/gemm_calls.sh runs
 * make every call from one thread, which OpenBLAS then spreads over its own.
 *
 * Built by bench/avx2/gemm_calls.sh. Not part of mc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);

typedef struct {
    int order, ta, tb, m, n, k;
    float beta;
    long calls;
    double sec;
} shape;

#define MAX_SHAPES 4096
static shape shapes[MAX_SHAPES];
static int nshapes, overflow;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    static sgemm_fn next;
    if (!next) next = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!next) {
        fprintf(stderr, "gemm_calls.so: no cblas_sgemm after it (not linked to OpenBLAS?)\n");
        abort();
    }
    double t0 = now();
    next(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    double dt = now() - t0;
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < nshapes &&
           !(shapes[i].order == order && shapes[i].ta == ta && shapes[i].tb == tb &&
             shapes[i].m == m && shapes[i].n == n && shapes[i].k == k && shapes[i].beta == beta))
        i++;
    if (i == nshapes && nshapes < MAX_SHAPES)
        shapes[nshapes++] = (shape){order, ta, tb, m, n, k, beta, 0, 0.0};
    if (i < nshapes) {
        shapes[i].calls++;
        shapes[i].sec += dt;
    } else {
        overflow = 1;
    }
    pthread_mutex_unlock(&lock);
}

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("GEMM_CALLS_OUT");
    FILE *f = path && *path ? fopen(path, "w") : stderr;
    if (!f) {
        perror(path);
        return;
    }
    double total = 0.0;
    long calls = 0;
    for (int i = 0; i < nshapes; i++) {
        const shape *s = &shapes[i];
        double flop = 2.0 * s->m * s->n * (double)s->k * s->calls;
        fprintf(f, "gemm %c%c M=%d N=%d K=%d beta=%g calls %ld seconds %.4f GFLOP/s %.1f\n",
                s->ta == 112 ? 'T' : 'N', s->tb == 112 ? 'T' : 'N', s->m, s->n, s->k, s->beta,
                s->calls, s->sec, s->sec > 0 ? flop / s->sec / 1e9 : 0.0);
        total += s->sec;
        calls += s->calls;
    }
    fprintf(f, "total calls %ld seconds %.4f%s\n", calls, total,
            overflow ? " (more shapes than the table holds: some calls not counted)" : "");
    if (f != stderr) fclose(f);
}
