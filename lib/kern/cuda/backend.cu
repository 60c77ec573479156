/*
 * backend.cu - the CUDA backend object: which GPU (from the local rank), the
 * compute and communication streams, the cuBLASLt handle and workspace,
 * scratch buffers, and the caching allocator behind mc_balloc (mc_cu_pool).
 */
#include <map>
#include <new>
#include <unordered_map>
#include <string.h>
#include "kern/cuda/internal.cuh"

/* The caching allocator: blocks are rounded up (512 B granules below 1 MiB,
 * 2 MiB above) and a freed block goes to a free list of its rounded size
 * instead of back to the driver, so a training loop that allocates and frees
 * the same sizes every step calls cudaMalloc only during its first step.
 * Every allocation and free is ordered on the one compute stream, so a
 * reused block is never touched by work queued before its free. When
 * cudaMalloc fails the cached blocks are released and it is tried once more. */
struct mc_cu_pool {
    std::unordered_map<void *, size_t> live; /* pointer -> rounded size */
    std::multimap<size_t, void *> free;      /* rounded size -> cached block */
    size_t cached = 0, mallocs = 0;
};

static size_t round_block(size_t n)
{
    if (n == 0) n = 1;
    const size_t g = n < ((size_t)1 << 20) ? 512 : ((size_t)2 << 20);
    return (n + g - 1) / g * g;
}

static void pool_release(mc_cu_pool *p)
{
    for (auto &kv : p->free) cudaFree(kv.second);
    p->free.clear();
    p->cached = 0;
}

extern "C" int mc_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver"/"no device" error */
        return 0;
    }
    return n;
}

/* The first of the launchers' local-rank variables that is set. */
static int local_rank(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                                 "MV2_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

extern "C" mc_status mc_cuda_new(int device, mc_cuda **out, mc_error *err)
{
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return mc_error_set(err, MC_ERR_IO, "no CUDA GPU is available (%s)",
                            e == cudaSuccess || e == cudaErrorNoDevice ? "no device found"
                            : e == cudaErrorInsufficientDriver
                                ? "no NVIDIA driver, or one older than this CUDA runtime"
                                : cudaGetErrorString(e));
    }
    if (device < 0) device = local_rank() % n;
    if (device >= n)
        return mc_error_set(err, MC_ERR_IO, "CUDA device %d requested, %d present", device, n);
    mc_cuda *cu = new (std::nothrow) mc_cuda();
    if (!cu) return mc_error_set(err, MC_ERR_NOMEM, "kern/cuda: out of memory");
    cu->device = device;
    const char *fl = getenv("MC_CUDA_FLASH");
    cu->flash_off = fl && !strcmp(fl, "0");
    const char *f8 = getenv("MC_CUDA_FP8_GEMM");
    cu->fp8_gemm_off = f8 && !strcmp(f8, "0");
    cu->pool = new (std::nothrow) mc_cu_pool();
    const char *what = NULL;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        what = "cudaSetDevice";
    else if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        what = "cudaGetDeviceProperties";
    else if ((e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) != cudaSuccess)
        what = "cudaStreamCreate";
    else if ((e = cudaStreamCreateWithFlags(&cu->comm_stream, cudaStreamNonBlocking)) !=
             cudaSuccess)
        what = "cudaStreamCreate";
    else if ((e = cudaEventCreateWithFlags(&cu->ev[0], cudaEventDisableTiming)) != cudaSuccess)
        what = "cudaEventCreate";
    else if ((e = cudaEventCreateWithFlags(&cu->ev[1], cudaEventDisableTiming)) != cudaSuccess)
        what = "cudaEventCreate";
    else if ((e = cudaMallocHost((void **)&cu->host_red, 64 * sizeof(double))) != cudaSuccess)
        what = "cudaMallocHost";
    else {
        cu->lt_ws_bytes = (size_t)32 << 20; /* Hopper's cuBLASLt kernels want 32 MiB */
        if ((e = cudaMalloc(&cu->lt_ws, cu->lt_ws_bytes)) != cudaSuccess) what = "cudaMalloc";
    }
    if (!what && cublasLtCreate(&cu->lt) != CUBLAS_STATUS_SUCCESS) {
        what = "cublasLtCreate";
        e = cudaErrorUnknown;
    }
    if (what || !cu->pool) {
        mc_error_set(err, MC_ERR_IO, "CUDA device %d: %s: %s", device, what ? what : "new",
                     what ? cudaGetErrorString(e) : "out of memory");
        cudaGetLastError();
        mc_cuda_free(cu);
        return err->code;
    }
    cu->sm_count = prop.multiProcessorCount;
    *out = cu;
    return MC_OK;
}

extern "C" void mc_cuda_free(mc_cuda *cu)
{
    if (!cu) return;
    cudaSetDevice(cu->device);
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    if (cu->comm_stream) cudaStreamSynchronize(cu->comm_stream);
    if (cu->lt) cublasLtDestroy(cu->lt);
    cudaFree(cu->lt_ws);
    for (int i = 0; i < MC_CU_SCRATCH_N; i++) cudaFree(cu->scratch[i]);
    if (cu->host_red) cudaFreeHost(cu->host_red);
    if (cu->pool) {
        pool_release(cu->pool);
        for (auto &kv : cu->pool->live) cudaFree(kv.first);
        delete cu->pool;
    }
    for (int i = 0; i < 2; i++)
        if (cu->ev[i]) cudaEventDestroy(cu->ev[i]);
    if (cu->comm_stream) cudaStreamDestroy(cu->comm_stream);
    if (cu->stream) cudaStreamDestroy(cu->stream);
    delete cu;
}

extern "C" int mc_cuda_device(const mc_cuda *cu) { return cu->device; }
extern "C" void *mc_cuda_stream(mc_cuda *cu) { return (void *)cu->stream; }
extern "C" void *mc_cuda_comm_stream(mc_cuda *cu) { return (void *)cu->comm_stream; }

extern "C" void mc_cuda_stream_wait(mc_cuda *cu, int waiter, int signaler)
{
    cudaStream_t s[2] = {cu->stream, cu->comm_stream};
    CU_CHECK(cudaEventRecord(cu->ev[signaler], s[signaler]));
    CU_CHECK(cudaStreamWaitEvent(s[waiter], cu->ev[signaler], 0));
}

void *mc_cuda_scratch(mc_cuda *cu, int slot, size_t bytes)
{
    if (bytes <= cu->scratch_cap[slot]) return cu->scratch[slot];
    size_t cap = round_block(bytes + bytes / 2);
    /* cudaFree waits for the device, so no queued kernel still reads the old one */
    CU_CHECK(cudaFree(cu->scratch[slot]));
    cu->scratch[slot] = NULL;
    cu->scratch_cap[slot] = 0;
    CU_CHECK(cudaMalloc(&cu->scratch[slot], cap));
    cu->scratch_cap[slot] = cap;
    return cu->scratch[slot];
}

extern "C" void *mc_cuda_balloc(mc_cuda *cu, size_t bytes, mc_error *err)
{
    mc_cu_pool *p = cu->pool;
    size_t n = round_block(bytes);
    if (n < bytes) {
        mc_error_set(err, MC_ERR_NOMEM, "kern/cuda: allocation of %zu bytes overflows", bytes);
        return NULL;
    }
    void *ptr = NULL;
    auto it = p->free.find(n);
    if (it != p->free.end()) {
        ptr = it->second;
        p->free.erase(it);
        p->cached -= n;
    } else {
        cudaError_t e = cudaMalloc(&ptr, n);
        if (e != cudaSuccess) {
            cudaGetLastError();
            CU_CHECK(cudaStreamSynchronize(cu->stream));
            pool_release(p);
            e = cudaMalloc(&ptr, n);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            mc_error_set(err, MC_ERR_NOMEM,
                         "kern/cuda: out of GPU memory allocating %zu bytes (%zu MiB free of %zu)",
                         bytes, fr >> 20, tot >> 20);
            return NULL;
        }
        p->mallocs++;
    }
    p->live[ptr] = n;
    /* backend memory starts zero-filled (kern.h) */
    CU_CHECK(cudaMemsetAsync(ptr, 0, n, cu->stream));
    return ptr;
}

extern "C" void mc_cuda_bfree(mc_cuda *cu, void *ptr)
{
    if (!ptr) return;
    mc_cu_pool *p = cu->pool;
    auto it = p->live.find(ptr);
    if (it == p->live.end())
        mc_cu_die(__FILE__, __LINE__, "mc_bfree", "not a block of this backend");
    p->free.emplace(it->second, ptr);
    p->cached += it->second;
    p->live.erase(it);
}

extern "C" void mc_cuda_alloc_stats(mc_cuda *cu, size_t *mallocs, size_t *cached_bytes)
{
    if (mallocs) *mallocs = cu->pool->mallocs;
    if (cached_bytes) *cached_bytes = cu->pool->cached;
}

extern "C" double mc_cuda_mem_available(mc_cuda *cu, char *what, size_t cap)
{
    cudaDeviceProp prop;
    if (cap) {
        if (cudaGetDeviceProperties(&prop, cu->device) == cudaSuccess)
            snprintf(what, cap, "GPU %d (%s)", cu->device, prop.name);
        else
            snprintf(what, cap, "GPU %d", cu->device);
    }
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (double)fr + (double)cu->pool->cached;
}

extern "C" void mc_cuda_bcopy_from_host(mc_cuda *cu, void *dst, const void *host, size_t bytes)
{
    if (!bytes) return;
    /* from pageable memory the call returns once the host buffer is staged,
     * so the caller may reuse it at once (kern.h's contract) */
    CU_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cu->stream));
}

extern "C" void mc_cuda_bcopy_to_host(mc_cuda *cu, void *host, const void *src, size_t bytes)
{
    if (!bytes) return;
    CU_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cu->stream));
    CU_CHECK(cudaStreamSynchronize(cu->stream));
}

extern "C" void mc_cuda_bcopy(mc_cuda *cu, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src) return;
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu->stream));
}

extern "C" void mc_cuda_bsync(mc_cuda *cu)
{
    CU_CHECK(cudaStreamSynchronize(cu->stream));
    CU_CHECK(cudaStreamSynchronize(cu->comm_stream));
}
