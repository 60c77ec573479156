/*
 * nccl1.c - lib/comm/nccl.c on one GPU (issue 11, section 5): one GPU cannot
 * hold two NCCL ranks, so this runs every NCCL operation mc uses over a
 * communicator of one rank (each group of a world of one) on device
 * memory: the bootstrap (the unique id over MPI, ncclCommInitRank), the
 * streams and events, and the results, which for one member are the input
 * itself. Built and run by tests/cuda/run.sh under `mpirun -np 1` (with
 * mpicc, against the build's libmc; CUDA builds only). Exit 77 without a
 * GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/comm_internal.h"
#include "mc/kern.h"

static int checks, fails;

static void report(int ok, const char *what)
{
    checks++;
    fails += !ok;
    printf("%s %d - %s\n", ok ? "ok" : "not ok", checks, what);
}

/* the device buffer's floats equal want's, bit for bit */
static int same(mc_backend *be, const float *dev, const float *want, size_t n)
{
    float *h = malloc(n * sizeof *h + 1);
    mc_bcopy_to_host(be, h, dev, n * sizeof *h);
    int ok = !memcmp(h, want, n * sizeof *h);
    free(h);
    return ok;
}

int main(int argc, char **argv)
{
    mc_grid g;
    mc_error err;
    if (mc_grid_init_mpi(&argc, &argv, 1, 1, 1, 1, &g, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    mc_backend *be;
    if (mc_backend_cuda_devices() == 0 || mc_backend_cuda_new(-1, &be, &err)) {
        printf("no GPU: skipped\n");
        mc_grid_finalize(&g);
        return 77;
    }
    mc_comm *cm = g.impl;
    const size_t n = 1000;
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = (float)sin((double)i) * 1e3f;
    float *x = mc_balloc(be, n * sizeof *h, &err), *y = mc_balloc(be, n * sizeof *h, &err);
    if (!x || !y) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    static const struct {
        mc_nccl_op op;
        mc_group_kind k;
        const char *name;
    } ops[] = {{MC_NCCL_ALLREDUCE_SUM, MC_GROUP_WORLD, "all-reduce (sum), world"},
               {MC_NCCL_ALLREDUCE_MAX, MC_GROUP_TP, "all-reduce (max), tensor-parallel group"},
               {MC_NCCL_REDUCE_SCATTER, MC_GROUP_DP, "reduce-scatter, data-parallel group"},
               {MC_NCCL_ALLGATHER, MC_GROUP_DP, "all-gather, data-parallel group"},
               {MC_NCCL_BROADCAST, MC_GROUP_EP, "broadcast, expert-parallel group"}};
    for (size_t t = 0; t < sizeof ops / sizeof *ops; t++) {
        mc_bcopy_from_host(be, x, h, n * sizeof *h);
        mc_k_fill(be, y, NAN, n);
        int inplace = ops[t].op == MC_NCCL_ALLREDUCE_SUM || ops[t].op == MC_NCCL_ALLREDUCE_MAX ||
                      ops[t].op == MC_NCCL_BROADCAST;
        mc_status st = mc_nccl_run(cm, ops[t].k, be, ops[t].op, x, inplace ? x : y, n, 0, NULL,
                                   &err);
        char w[sizeof err.msg + 80];
        snprintf(w, sizeof w, "%s: %s", ops[t].name, st ? err.msg : "the input, bit for bit");
        report(!st && same(be, inplace ? x : y, h, n), w);
    }
    /* non-blocking: the event the compute stream waits for */
    mc_bcopy_from_host(be, x, h, n * sizeof *h);
    void *ev = NULL;
    mc_status st = mc_nccl_run(cm, MC_GROUP_DP, be, MC_NCCL_ALLREDUCE_SUM, x, x, n, 0, &ev, &err);
    if (!st) st = mc_nccl_wait(be, ev, "all-reduce", MC_GROUP_DP, &err);
    report(!st && ev && same(be, x, h, n), "non-blocking all-reduce and its event");
    /* the MoE dispatch's all-to-all: the member's own block only */
    size_t sc = n - 10, sd = 4, rc = n - 10, rd = 7;
    mc_k_fill(be, y, NAN, n);
    mc_bcopy_from_host(be, x, h, n * sizeof *h);
    st = mc_nccl_alltoallv(cm, MC_GROUP_EP, be, x, &sc, &sd, y, &rc, &rd, &err);
    float *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) want[i] = NAN;
    memcpy(want + rd, h + sd, sc * sizeof *h);
    float *got = malloc(n * sizeof *got);
    mc_bcopy_to_host(be, got, y, n * sizeof *got);
    int ok = !st;
    for (size_t i = 0; i < n && ok; i++)
        ok = isnan(want[i]) ? isnan(got[i]) : !memcmp(&want[i], &got[i], sizeof *got);
    report(ok, "all-to-all (counts and offsets): the block at its offset, the rest untouched");
    printf("1..%d\n# %d of %d checks failed\n", checks, fails, checks);
    free(want);
    free(got);
    free(h);
    mc_bfree(be, x);
    mc_bfree(be, y);
    mc_backend_free(be);
    mc_grid_finalize(&g);
    return fails ? 1 : 0;
}
