/*
 * nccl.c - collectives on device memory through NCCL, for a CUDA backend
 * (kern.h's "cuda"); the MPI path (reduce.c, async.c) stays as it is for
 * host memory and for point to point. One communicator per group, made on
 * first use; every operation runs on the backend's communication stream,
 * ordered against the compute stream by events. See doc/ARCHITECTURE.md,
 * "Communication".
 */
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include "comm_internal.h"
#include "mc/kern.h"

struct mc_nccl {
    ncclComm_t comm[MC_GROUP_COUNT]; /* NULL until the group's first device collective */
};

int mc_nccl_wanted(const mc_backend *be) { return mc_backend_is_device(be); }

static mc_status nccl_error(mc_error *err, ncclResult_t r, const char *op, mc_group_kind k)
{
    return mc_error_set(err, MC_ERR_IO, "%s on the %s: NCCL: %s", op, mc_group_name(k),
                        ncclGetErrorString(r));
}

void mc_nccl_free(mc_nccl *nc)
{
    if (!nc) return;
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        if (nc->comm[k]) ncclCommDestroy(nc->comm[k]);
    free(nc);
}

/* The group's communicator, made on first use (collective over the group). */
static mc_status get_comm(mc_comm *cm, mc_group_kind k, const char *op, ncclComm_t *out,
                          mc_error *err)
{
    if (!cm->nccl && !(cm->nccl = calloc(1, sizeof *cm->nccl)))
        return mc_error_set(err, MC_ERR_NOMEM, "%s: out of memory", op);
    if (!cm->nccl->comm[k]) {
        MPI_Comm c = cm->comm[k];
        int P, me;
        MPI_Comm_size(c, &P);
        MPI_Comm_rank(c, &me);
        ncclUniqueId id;
        ncclResult_t r = ncclSuccess;
        if (me == 0) r = ncclGetUniqueId(&id);
        /* a failed root still broadcasts, so no member waits forever */
        int ok = r == ncclSuccess;
        int rc = MPI_Bcast(&ok, 1, MPI_INT, 0, c);
        if (rc == MPI_SUCCESS && ok) rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c);
        if (rc != MPI_SUCCESS) return mc_comm_mpi_error(err, rc, op, k);
        if (!ok)
            return mc_error_set(err, MC_ERR_IO, "%s on the %s: NCCL: no unique id at group rank 0",
                                op, mc_group_name(k));
        if ((r = ncclCommInitRank(&cm->nccl->comm[k], P, id, me)) != ncclSuccess) {
            cm->nccl->comm[k] = NULL;
            return nccl_error(err, r, op, k);
        }
    }
    *out = cm->nccl->comm[k];
    return MC_OK;
}

mc_status mc_nccl_run(mc_comm *cm, mc_group_kind k, mc_backend *be, mc_nccl_op op, const float *in,
                      float *out, size_t n, int peer, void **event, mc_error *err)
{
    static const char *names[] = {"all-reduce", "all-reduce (max)", "reduce-scatter", "all-gather",
                                  "broadcast"};
    const char *name = names[op];
    ncclComm_t nc = NULL;
    mc_status st = get_comm(cm, k, name, &nc, err);
    if (st) return st;
    cudaStream_t s = (cudaStream_t)mc_backend_stream(be, MC_STREAM_COMM);
    mc_backend_stream_wait(be, MC_STREAM_COMM, MC_STREAM_COMPUTE); /* after the kernels */
    ncclResult_t r;
    switch (op) {
    case MC_NCCL_ALLREDUCE_SUM: r = ncclAllReduce(out, out, n, ncclFloat32, ncclSum, nc, s); break;
    case MC_NCCL_ALLREDUCE_MAX: r = ncclAllReduce(out, out, n, ncclFloat32, ncclMax, nc, s); break;
    /* in holds P blocks of n; out gets this rank's block, summed */
    case MC_NCCL_REDUCE_SCATTER:
        r = ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, nc, s);
        break;
    /* in-place when in is this rank's block of out, which NCCL allows */
    case MC_NCCL_ALLGATHER: r = ncclAllGather(in, out, n, ncclFloat32, nc, s); break;
    default: r = ncclBroadcast(out, out, n, ncclFloat32, peer, nc, s); break;
    }
    if (r != ncclSuccess) return nccl_error(err, r, name, k);
    if (!event) {
        mc_backend_stream_wait(be, MC_STREAM_COMPUTE, MC_STREAM_COMM); /* kernels after it */
        return MC_OK;
    }
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, s);
    if (e != cudaSuccess)
        return mc_error_set(err, MC_ERR_IO, "%s on the %s: %s", name, mc_group_name(k),
                            cudaGetErrorString(e));
    *event = ev;
    return MC_OK;
}

mc_status mc_nccl_alltoallv(mc_comm *cm, mc_group_kind k, mc_backend *be, const float *send,
                            const size_t *scount, const size_t *sdispl, float *recv,
                            const size_t *rcount, const size_t *rdispl, mc_error *err)
{
    const char *name = "all-to-all";
    ncclComm_t nc = NULL;
    mc_status st = get_comm(cm, k, name, &nc, err);
    if (st) return st;
    int P = 0, me = 0;
    ncclCommCount(nc, &P);
    ncclCommUserRank(nc, &me);
    cudaStream_t s = (cudaStream_t)mc_backend_stream(be, MC_STREAM_COMM);
    mc_backend_stream_wait(be, MC_STREAM_COMM, MC_STREAM_COMPUTE);
    /* this member's own block: a copy; the others' in one NCCL group */
    if (scount[me]) {
        cudaError_t e = cudaMemcpyAsync(recv + rdispl[me], send + sdispl[me],
                                        scount[me] * sizeof(float), cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess)
            return mc_error_set(err, MC_ERR_IO, "%s on the %s: %s", name, mc_group_name(k),
                                cudaGetErrorString(e));
    }
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < P && r == ncclSuccess; j++) {
        if (j == me) continue;
        if (scount[j]) r = ncclSend(send + sdispl[j], scount[j], ncclFloat32, j, nc, s);
        if (r == ncclSuccess && rcount[j])
            r = ncclRecv(recv + rdispl[j], rcount[j], ncclFloat32, j, nc, s);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) return nccl_error(err, r, name, k);
    mc_backend_stream_wait(be, MC_STREAM_COMPUTE, MC_STREAM_COMM);
    return MC_OK;
}

mc_status mc_nccl_wait(mc_backend *be, void *event, const char *op, mc_group_kind k, mc_error *err)
{
    cudaStream_t s = (cudaStream_t)mc_backend_stream(be, MC_STREAM_COMPUTE);
    cudaError_t e = cudaStreamWaitEvent(s, (cudaEvent_t)event, 0);
    cudaEventDestroy((cudaEvent_t)event);
    if (e != cudaSuccess)
        return mc_error_set(err, MC_ERR_IO, "%s on the %s: %s", op, mc_group_name(k),
                            cudaGetErrorString(e));
    return MC_OK;
}
