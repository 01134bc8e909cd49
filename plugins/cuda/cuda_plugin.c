/*
 * plugins/cuda/cuda_plugin.c — libmmrt_cuda.so: NVIDIA GPUs behind the mmrt plugin ABI,
 * through the CUDA runtime API and cuBLAS. This file holds the entry point, discovery, device
 * open/close, memory and transfers, the device error word, graph capture and the op table;
 * the ops are in cuda_ops.c / cuda_ops_gemm.c, their kernels in the .cu files.
 *
 * Devices are numbered as the CUDA runtime numbers them (CUDA_VISIBLE_DEVICES applies). A
 * machine without a driver or GPU is a clean "0 devices" with the runtime's reason.
 *
 * Each device owns one non-blocking stream and issues everything on it, so the stream is the
 * ABI's in-order queue. The current CUDA device is per host thread and a device may be driven
 * from different threads over time, so every entry point selects its device first. Besides
 * the arenas the core asks for, a device holds for its lifetime a cuBLAS handle with its own
 * workspace, the GEMM operand scratch, the split-attention workspace and the error word
 * (sizes in cuda_internal.h, ~112 MiB together): fixed buffers, so no op ever allocates and
 * every op can be captured into a graph.
 *
 * Arenas: the handle is the cudaMalloc pointer, so kernels address (char *)buffer + offset
 * directly. The device keeps a table {pointer, nbytes} for bounds checks and so that
 * device_close can free what the core left allocated; arenas are few, a linear scan serves.
 *
 * Uploads go through two pinned staging buffers used in turn: copying into staging is a host
 * memcpy, so `src` is free when upload returns, while the DMA from staging overlaps whatever
 * the host does next; an event per buffer says when it may be refilled. Large uploads
 * pipeline the memcpy of one chunk with the DMA of the other. Downloads copy straight into
 * the caller's memory and wait for the stream.
 *
 * Device error word: kernels that read values from device memory (GET_ROWS ids, ATTENTION
 * cu_seqlens) report a bad one there (cuda_kernels.h). synchronize() and download() copy the
 * word back in the same stream before they wait — no extra round trip — and turn a non-zero
 * word into MMRT_ERR_INVALID_ARG naming the op and the value, then clear it. A download that
 * reports such an error has still copied its bytes.
 *
 * Graph capture (capture_begin … capture_end, graph_launch, graph_destroy) uses CUDA stream
 * capture in relaxed mode, so that other threads driving other devices are not restricted
 * and an upload may allocate pinned memory while recording. What each call does meanwhile:
 *   upload     cannot use the staging ring: a captured copy node reads its host buffer at
 *              every replay, and the ring is refilled by later uploads (and waiting on its
 *              events is illegal while capturing). So each upload gets a pinned block of its
 *              own, filled now and owned by the graph: a replay re-uploads the bytes as they
 *              were at capture. Values a step changes are uploaded eagerly before the launch.
 *   copy, ops  recorded (cuBLAS included: it has its own workspace and never allocates).
 *   download, synchronize, graph_launch   refused (MMRT_ERR_INVALID_ARG): they need the
 *              stream to run.
 *   arena_free, graph_destroy   deferred to capture_end (freeing waits for the stream).
 * The first failure of anything issued while capturing is kept; capture_end then ends the
 * capture, discards everything recorded, logs why and returns that status, so the core can
 * run the same steps eagerly.
 *
 * Stage hand-off between devices (vision on one GPU, language on another) is wired later by
 * the scheduler. On-GPU ordering needs two more optional members, e.g.
 *   event_record(dev, &event)  cudaEventRecord on the producer's stream
 *   event_wait(dev, event)     cudaStreamWaitEvent on the consumer's stream
 * plus a peer copy (cudaMemcpyPeerAsync) between arenas of two devices of this plugin; until
 * then the hand-off goes through download / upload, which synchronise on the host.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define CU_STAGE_BYTES ((size_t)4 << 20)
/* cudaMalloc returns 256-byte aligned blocks; cuBLAS and vector loads are fastest when
 * sub-allocations keep that alignment too. */
#define CU_ALIGNMENT 256

_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "64-bit host required");

/* Zeroed copy of the host table (see mmrt_plugin_init); members the host lacks stay NULL. */
static struct mmrt_host cu_host;

static void cu_log(enum mmrt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void cu_log(enum mmrt_log_level level, const char *fmt, ...)
{
    if (!cu_host.log)
        return;
    char line[CU_ERR_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cu_host.log(cu_host.user, level, CU_NAME, line);
}

static void cu_say(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cu_say(char *buf, size_t size, const char *fmt, ...)
{
    if (!buf || !size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

mmrt_status(cu_fail)(struct mmrt_device *dev, mmrt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dev->err, sizeof dev->err, fmt, ap);
    va_end(ap);
    return st;
}

mmrt_status cu_fail_cuda(struct mmrt_device *dev, cudaError_t e, mmrt_status oom,
                         const char *where, const char *call)
{
    (void)cudaGetLastError();
    return cu_fail(dev, e == cudaErrorMemoryAllocation ? oom : MMRT_ERR_DEVICE,
                   "%s: %s failed: %s (%s)", where, call, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

static mmrt_status cu_select(struct mmrt_device *dev, const char *where)
{
    cudaError_t e = cudaSetDevice(dev->ordinal);
    return e == cudaSuccess ? MMRT_OK
                            : cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, where, "cudaSetDevice");
}

/* ---- small helpers -------------------------------------------------------------------- */

static bool cu_ptrs_reserve(struct cu_ptrs *a, size_t n)
{
    if (n <= a->cap)
        return true;
    size_t cap = a->cap ? a->cap * 2 : 8;
    while (cap < n)
        cap *= 2;
    void **p = realloc(a->p, cap * sizeof *p);
    if (!p)
        return false;
    a->p = p;
    a->cap = cap;
    return true;
}

static void cu_free_pinned(struct cu_ptrs *a)
{
    for (size_t i = 0; i < a->n; i++)
        cudaFreeHost(a->p[i]);
    free(a->p);
    memset(a, 0, sizeof *a);
}

/* While capturing: remember the first failure (dev->err holds its detail). Returns st. */
static mmrt_status cu_note(struct mmrt_device *dev, mmrt_status st)
{
    if (st != MMRT_OK && dev->capturing && !dev->capture_failed) {
        dev->capture_failed = true;
        dev->capture_status = st;
        snprintf(dev->capture_why, sizeof dev->capture_why, "%s", dev->err);
    }
    return st;
}

static mmrt_status cu_not_while_capturing(struct mmrt_device *dev, const char *what)
{
    return cu_note(dev, cu_fail(dev, MMRT_ERR_INVALID_ARG,
                                "%s during graph capture: the stream records instead of running, "
                                "so there is nothing to wait for", what));
}

/* ---- probe and devices ---------------------------------------------------------------- */

static const char *const cu_option_keys[] = { "gemm_precision", NULL };

static mmrt_status cu_probe(int *n_devices, char *why, size_t why_size)
{
    if (!n_devices)
        return MMRT_ERR_INVALID_ARG;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver, no GPU or a driver older than the runtime: nothing to drive here. */
        (void)cudaGetLastError();
        cu_say(why, why_size, "no CUDA device (%s)", cudaGetErrorString(e));
        *n_devices = 0;
        return MMRT_OK;
    }
    if (n == 0)
        cu_say(why, why_size, "no CUDA device (none visible)");
    else
        cu_say(why, why_size, "%s", "");
    *n_devices = n;
    return MMRT_OK;
}

static void cu_graph_free(struct cu_graph *g)
{
    if (!g)
        return;
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    cu_free_pinned(&g->pinned);
    free(g);
}

/* Frees what arena_free / graph_destroy deferred during a capture, once work is done. */
static void cu_run_deferred(struct mmrt_device *dev)
{
    if (dev->deferred_arenas.n == 0 && dev->deferred_graphs.n == 0)
        return;
    if (cudaStreamSynchronize(dev->stream) != cudaSuccess)
        (void)cudaGetLastError();
    for (size_t i = 0; i < dev->deferred_arenas.n; i++)
        cudaFree(dev->deferred_arenas.p[i]);
    for (size_t i = 0; i < dev->deferred_graphs.n; i++)
        cu_graph_free(dev->deferred_graphs.p[i]);
    dev->deferred_arenas.n = dev->deferred_graphs.n = 0;
    (void)cudaGetLastError();
}

static void cu_device_close(struct mmrt_device *dev)
{
    if (!dev)
        return;
    /* Teardown cannot fail the caller; a device that is already gone just frees host state. */
    if (cudaSetDevice(dev->ordinal) == cudaSuccess) {
        if (dev->capturing) {
            cudaGraph_t g = NULL;
            if (cudaStreamEndCapture(dev->stream, &g) == cudaSuccess && g)
                cudaGraphDestroy(g);
            dev->capturing = false;
        }
        if (dev->stream)
            cudaStreamSynchronize(dev->stream);
        cu_free_pinned(&dev->capture_pinned);
        cu_run_deferred(dev);
        for (size_t i = 0; i < dev->n_arenas; i++)
            cudaFree(dev->arenas[i].ptr);
        if (dev->blas)
            cublasDestroy(dev->blas);
        cudaFree(dev->blas_ws);
        cudaFree(dev->gemm_scratch);
        cudaFree(dev->attn_ws);
        cudaFree(dev->err_dev);
        if (dev->err_host)
            cudaFreeHost(dev->err_host);
        for (int i = 0; i < 2; i++) {
            if (dev->stage[i].done)
                cudaEventDestroy(dev->stage[i].done);
            if (dev->stage[i].host)
                cudaFreeHost(dev->stage[i].host);
        }
        if (dev->stream)
            cudaStreamDestroy(dev->stream);
    }
    (void)cudaGetLastError();
    free(dev->deferred_arenas.p);
    free(dev->deferred_graphs.p);
    free(dev->arenas);
    free(dev);
}

static mmrt_status cu_parse_options(const struct mmrt_option *options, int n_options,
                                    bool *gemm_split, char *err, size_t err_size)
{
    for (int i = 0; i < n_options; i++) {
        const char *key = options[i].key ? options[i].key : "";
        const char *value = options[i].value ? options[i].value : "";
        if (strcmp(key, "gemm_precision") != 0) {
            cu_say(err, err_size, "unknown option '%s' (the CUDA plugin knows gemm_precision)",
                   key);
            return MMRT_ERR_CONFIG;
        }
        if (strcmp(value, "high") == 0) {
            *gemm_split = true;
        } else if (strcmp(value, "fast") == 0) {
            *gemm_split = false;
        } else {
            cu_say(err, err_size, "gemm_precision '%s': expected high or fast", value);
            return MMRT_ERR_CONFIG;
        }
    }
    return MMRT_OK;
}

/* Allocates nbytes of device memory into *p, or records why not. */
static mmrt_status cu_dev_alloc(struct mmrt_device *dev, void **p, size_t nbytes,
                                const char *what)
{
    cudaError_t e = cudaMalloc(p, nbytes);
    if (e == cudaSuccess)
        return MMRT_OK;
    *p = NULL;
    char where[96];
    snprintf(where, sizeof where, "device_open (%s, %zu bytes)", what, nbytes);
    return cu_fail_cuda(dev, e, MMRT_ERR_OUT_OF_POOL, where, "cudaMalloc");
}

static mmrt_status cu_blas_setup(struct mmrt_device *dev)
{
    cublasStatus_t s = cublasCreate(&dev->blas);
    const char *call = "cublasCreate";
    if (s != CUBLAS_STATUS_SUCCESS) {
        dev->blas = NULL;
    } else if ((s = cublasSetStream(dev->blas, dev->stream)) != CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetStream";
    } else if ((s = cublasSetWorkspace(dev->blas, dev->blas_ws, CU_BLAS_WS_BYTES)) !=
               CUBLAS_STATUS_SUCCESS) {
        /* After SetStream, which resets the workspace to cuBLAS's own pool. */
        call = "cublasSetWorkspace";
    } else if ((s = cublasSetMathMode(dev->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetMathMode";
    }
    if (s == CUBLAS_STATUS_SUCCESS)
        return MMRT_OK;
    return cu_fail(dev, s == CUBLAS_STATUS_ALLOC_FAILED ? MMRT_ERR_NO_MEMORY : MMRT_ERR_DEVICE,
                   "device_open: %s failed: %s", call, cublasGetStatusString(s));
}

static mmrt_status cu_device_open(int index, const struct mmrt_option *options, int n_options,
                                  struct mmrt_device **out, char *err, size_t err_size)
{
    if (!out || (n_options > 0 && !options)) {
        cu_say(err, err_size, "device_open: NULL argument");
        return MMRT_ERR_INVALID_ARG;
    }
    bool gemm_split = true;
    mmrt_status st = cu_parse_options(options, n_options, &gemm_split, err, err_size);
    if (st != MMRT_OK)
        return st;
    if (index < 0) {
        cu_say(err, err_size, "CUDA device index %d is negative", index);
        return MMRT_ERR_INVALID_ARG;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cu_say(err, err_size, "no CUDA device (%s)", cudaGetErrorString(e));
        return MMRT_ERR_NO_DEVICE;
    }
    if (index >= count) {
        cu_say(err, err_size, "CUDA device index %d out of range: %d device(s) found", index,
               count);
        return MMRT_ERR_NO_DEVICE;
    }

    struct mmrt_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        cu_say(err, err_size, "device_open: out of host memory");
        return MMRT_ERR_NO_MEMORY;
    }
    dev->ordinal = index;
    dev->gemm_split = gemm_split;
    struct cudaDeviceProp prop;
    st = cu_select(dev, "device_open");
    if (st == MMRT_OK && (e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess)
        st = cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "device_open", "cudaGetDeviceProperties");
    if (st == MMRT_OK &&
        (e = cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking)) != cudaSuccess)
        st = cu_fail_cuda(dev, e, MMRT_ERR_NO_MEMORY, "device_open", "cudaStreamCreate");
    for (int i = 0; i < 2 && st == MMRT_OK; i++) {
        e = cudaHostAlloc(&dev->stage[i].host, CU_STAGE_BYTES, cudaHostAllocDefault);
        if (e != cudaSuccess) {
            dev->stage[i].host = NULL;
            st = cu_fail_cuda(dev, e, MMRT_ERR_NO_MEMORY, "device_open", "cudaHostAlloc");
        } else if ((e = cudaEventCreateWithFlags(&dev->stage[i].done,
                                                 cudaEventDisableTiming)) != cudaSuccess) {
            dev->stage[i].done = NULL;
            st = cu_fail_cuda(dev, e, MMRT_ERR_NO_MEMORY, "device_open", "cudaEventCreate");
        }
    }
    if (st == MMRT_OK)
        st = cu_dev_alloc(dev, &dev->blas_ws, CU_BLAS_WS_BYTES, "cuBLAS workspace");
    if (st == MMRT_OK)
        st = cu_dev_alloc(dev, &dev->gemm_scratch, CU_GEMM_SCRATCH_BYTES, "GEMM scratch");
    if (st == MMRT_OK)
        st = cu_dev_alloc(dev, (void **)&dev->attn_ws, CU_ATTN_WS_BYTES, "attention workspace");
    if (st == MMRT_OK)
        st = cu_dev_alloc(dev, (void **)&dev->err_dev, sizeof *dev->err_dev, "error word");
    if (st == MMRT_OK && (e = cudaMemset(dev->err_dev, 0, sizeof *dev->err_dev)) != cudaSuccess)
        st = cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "device_open", "cudaMemset");
    if (st == MMRT_OK && (e = cudaHostAlloc((void **)&dev->err_host, sizeof *dev->err_host,
                                            cudaHostAllocDefault)) != cudaSuccess) {
        dev->err_host = NULL;
        st = cu_fail_cuda(dev, e, MMRT_ERR_NO_MEMORY, "device_open", "cudaHostAlloc");
    }
    if (st == MMRT_OK)
        st = cu_blas_setup(dev);
    if (st == MMRT_OK && (e = cu_attention_init()) != cudaSuccess)
        st = cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "device_open", "cudaFuncSetAttribute");
    if (st != MMRT_OK) {
        cu_say(err, err_size, "%s", dev->err);
        cu_device_close(dev);
        return st;
    }
    memset(dev->err_host, 0, sizeof *dev->err_host);
    snprintf(dev->name, sizeof dev->name, "%.*s", (int)sizeof dev->name - 1, prop.name);
    dev->total_bytes = prop.totalGlobalMem;
    dev->n_sm = prop.multiProcessorCount;
    cu_log(MMRT_LOG_DEBUG, "opened device %d: %s (sm_%d%d, %d SMs), gemm_precision %s", index,
           dev->name, prop.major, prop.minor, dev->n_sm, gemm_split ? "high" : "fast");
    *out = dev;
    return MMRT_OK;
}

static mmrt_status cu_device_info(struct mmrt_device *dev, struct mmrt_device_info *info)
{
    if (!dev || !info)
        return MMRT_ERR_INVALID_ARG;
    if (info->hdr.struct_size < sizeof info->hdr)
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "device_info: struct_size %u too small",
                       (unsigned)info->hdr.struct_size);
    mmrt_status st = cu_select(dev, "device_info");
    if (st != MMRT_OK)
        return st;
    size_t free_bytes = 0, total_bytes = 0;
    cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (e != cudaSuccess)
        return cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "device_info", "cudaMemGetInfo");
    struct mmrt_device_info full;
    memset(&full, 0, sizeof full);
    full.hdr = info->hdr;
    snprintf(full.name, sizeof full.name, "%s", dev->name);
    snprintf(full.kind, sizeof full.kind, "gpu");
    full.total_bytes = dev->total_bytes;
    full.free_bytes = free_bytes;
    full.max_arena_bytes = free_bytes; /* cudaMalloc has no per-allocation cap below that */
    full.alignment = CU_ALIGNMENT;
    size_t n = info->hdr.struct_size < sizeof full ? info->hdr.struct_size : sizeof full;
    memcpy(info, &full, n);
    return MMRT_OK;
}

/* ---- arenas and transfers ------------------------------------------------------------- */

struct cu_arena *cu_find(struct mmrt_device *dev, const void *handle)
{
    for (size_t i = 0; i < dev->n_arenas; i++)
        if (dev->arenas[i].ptr == handle)
            return &dev->arenas[i];
    return NULL;
}

static mmrt_status cu_arena_alloc(struct mmrt_device *dev, uint64_t nbytes, void **arena)
{
    if (!dev || !arena)
        return MMRT_ERR_INVALID_ARG;
    if (nbytes == 0)
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "arena_alloc: zero bytes requested");
    /* Grow the table first, so nothing can fail after the memory exists. */
    if (dev->n_arenas == dev->cap_arenas) {
        size_t cap = dev->cap_arenas ? dev->cap_arenas * 2 : 8;
        struct cu_arena *grown = realloc(dev->arenas, cap * sizeof *grown);
        if (!grown)
            return cu_fail(dev, MMRT_ERR_NO_MEMORY, "arena_alloc: out of host memory");
        dev->arenas = grown;
        dev->cap_arenas = cap;
    }
    mmrt_status st = cu_select(dev, "arena_alloc");
    if (st != MMRT_OK)
        return st;
    void *ptr = NULL;
    cudaError_t e = cudaMalloc(&ptr, (size_t)nbytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_bytes = 0, total_bytes = 0;
        if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
            (void)cudaGetLastError();
        return cu_fail(dev, MMRT_ERR_OUT_OF_POOL,
                       "arena_alloc: cudaMalloc of %" PRIu64 " bytes failed: out of device "
                       "memory (%zu of %zu bytes free)",
                       nbytes, free_bytes, total_bytes);
    }
    if (e != cudaSuccess) {
        char where[96];
        snprintf(where, sizeof where, "arena_alloc(%" PRIu64 " bytes)", nbytes);
        return cu_fail_cuda(dev, e, MMRT_ERR_OUT_OF_POOL, where, "cudaMalloc");
    }
    dev->arenas[dev->n_arenas++] = (struct cu_arena){ptr, nbytes};
    *arena = ptr;
    return MMRT_OK;
}

static void cu_arena_free(struct mmrt_device *dev, void *arena)
{
    if (!dev || !arena)
        return;
    struct cu_arena *a = cu_find(dev, arena);
    if (!a) {
        cu_log(MMRT_LOG_ERROR, "arena_free: %p is not an arena of device %s", arena, dev->name);
        return;
    }
    if (dev->capturing) {
        /* Freeing waits for the stream, which is recording: free at capture_end. Without
         * room to remember it the arena stays allocated until device_close. */
        if (!cu_ptrs_reserve(&dev->deferred_arenas, dev->deferred_arenas.n + 1)) {
            cu_log(MMRT_LOG_ERROR, "arena_free during capture: out of host memory, the arena "
                   "is freed at device_close");
            return;
        }
        dev->deferred_arenas.p[dev->deferred_arenas.n++] = a->ptr;
        *a = dev->arenas[--dev->n_arenas];
        return;
    }
    cudaError_t e = cudaSetDevice(dev->ordinal);
    /* Work queued on our stream may still use the arena. */
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(dev->stream);
    if (e == cudaSuccess)
        e = cudaFree(a->ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cu_log(MMRT_LOG_ERROR, "arena_free on %s: %s", dev->name, cudaGetErrorString(e));
    }
    *a = dev->arenas[--dev->n_arenas];
}

/* Resolves (arena, offset, nbytes) to a device address after checking it lies inside. */
static mmrt_status cu_range(struct mmrt_device *dev, const char *what, void *arena,
                            uint64_t offset, uint64_t nbytes, char **addr)
{
    struct cu_arena *a = arena ? cu_find(dev, arena) : NULL;
    if (!a)
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "%s: %p is not an arena of this device",
                       what, arena);
    if (offset > a->nbytes || nbytes > a->nbytes - offset)
        return cu_fail(dev, MMRT_ERR_INVALID_ARG,
                       "%s: %" PRIu64 " bytes at offset %" PRIu64
                       " overrun the arena of %" PRIu64 " bytes",
                       what, nbytes, offset, a->nbytes);
    *addr = (char *)a->ptr + offset;
    return MMRT_OK;
}

/* An upload while capturing: a pinned block of its own, owned by the graph to be. */
static mmrt_status cu_upload_captured(struct mmrt_device *dev, char *dst, const void *src,
                                      uint64_t nbytes)
{
    /* Room in the list first: once the block exists nothing may fail before it is listed
     * (freeing pinned memory while capturing is not allowed). */
    if (!cu_ptrs_reserve(&dev->capture_pinned, dev->capture_pinned.n + 1))
        return cu_fail(dev, MMRT_ERR_NO_MEMORY, "upload during capture: out of host memory");
    void *block = NULL;
    cudaError_t e = cudaHostAlloc(&block, (size_t)nbytes, cudaHostAllocDefault);
    if (e != cudaSuccess)
        return cu_fail_cuda(dev, e, MMRT_ERR_NO_MEMORY, "upload during capture", "cudaHostAlloc");
    dev->capture_pinned.p[dev->capture_pinned.n++] = block;
    memcpy(block, src, (size_t)nbytes);
    e = cudaMemcpyAsync(dst, block, (size_t)nbytes, cudaMemcpyHostToDevice, dev->stream);
    return e == cudaSuccess ? MMRT_OK
                            : cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "upload during capture",
                                           "cudaMemcpyAsync");
}

static mmrt_status cu_upload(struct mmrt_device *dev, void *arena, uint64_t offset,
                             const void *src, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    char *dst = NULL;
    mmrt_status st = cu_range(dev, "upload", arena, offset, nbytes, &dst);
    if (st != MMRT_OK || nbytes == 0)
        return cu_note(dev, st);
    if (!src)
        return cu_note(dev, cu_fail(dev, MMRT_ERR_INVALID_ARG, "upload: NULL source"));
    if ((st = cu_select(dev, "upload")) != MMRT_OK)
        return cu_note(dev, st);
    if (dev->capturing)
        return cu_note(dev, cu_upload_captured(dev, dst, src, nbytes));
    const char *from = src;
    for (uint64_t done = 0; done < nbytes;) {
        size_t piece = nbytes - done < CU_STAGE_BYTES ? (size_t)(nbytes - done) : CU_STAGE_BYTES;
        struct cu_stage *s = &dev->stage[dev->next_stage];
        /* The DMA that last read this buffer must be finished before we refill it; an event
         * never recorded counts as complete. */
        cudaError_t e = cudaEventSynchronize(s->done);
        if (e != cudaSuccess)
            return cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "upload", "cudaEventSynchronize");
        memcpy(s->host, from + done, piece);
        e = cudaMemcpyAsync(dst + done, s->host, piece, cudaMemcpyHostToDevice, dev->stream);
        if (e == cudaSuccess)
            e = cudaEventRecord(s->done, dev->stream);
        if (e != cudaSuccess)
            return cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "upload", "cudaMemcpyAsync");
        dev->next_stage ^= 1;
        done += piece;
    }
    return MMRT_OK;
}

/* After the stream has drained: a non-zero device error word becomes the call's status. */
static mmrt_status cu_take_device_error(struct mmrt_device *dev)
{
    struct cu_err_word w = *dev->err_host;
    if (w.code == CU_ERRC_NONE)
        return MMRT_OK;
    memset(dev->err_host, 0, sizeof *dev->err_host);
    /* Cleared in stream order: kernels issued after this see a clean word. */
    if (cudaMemsetAsync(dev->err_dev, 0, sizeof *dev->err_dev, dev->stream) != cudaSuccess)
        (void)cudaGetLastError();
    switch (w.code) {
    case CU_ERRC_ROW_ID:
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "GET_ROWS: id %" PRId64 " at row %" PRId64
                       " is outside the table's rows [0, %" PRId64 ") (found on the device by "
                       "a launch issued before this call)", w.v[0], w.v[1], w.v[2]);
    case CU_ERRC_SEQLENS:
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION: %s entry %" PRId64 " is %" PRId64
                       ": cu_seqlens must start at 0, never decrease and end at the number of "
                       "%s (found on the device by a launch issued before this call)",
                       w.v[0] ? "src4 (cu_seqlens_k)" : "src3 (cu_seqlens_q)", w.v[1], w.v[2],
                       w.v[0] ? "keys" : "queries");
    case CU_ERRC_PAGED:
        if (w.v[0] == 0)
            return cu_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED: src3 (cu_seqlens_q) entry "
                           "%" PRId64 " is %" PRId64 ": it must start at 0, never decrease and end "
                           "at the number of queries (found on the device by a launch issued "
                           "before this call)", w.v[1], w.v[2]);
        if (w.v[0] == 1)
            return cu_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED: src4 (kv_lens) entry %"
                           PRId64 " is %" PRId64 ": must lie within 0 … max_pages · page_tokens = %"
                           PRId64 " · %" PRId64 " (found on the device by a launch issued before "
                           "this call)", w.v[1], w.v[2], w.v[3], w.v[4]);
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED: src5 (page_table) entry [%"
                       PRId64 ", %" PRId64 "] is %" PRId64 ", outside the %" PRId64 " pages of "
                       "k_pages (found on the device by a launch issued before this call)",
                       w.v[1], w.v[3], w.v[2], w.v[4]);
    default:
        return cu_fail(dev, MMRT_ERR_INTERNAL, "device error word holds unknown code %u (op %d)",
                       (unsigned)w.code, (int)w.op);
    }
}

/* Fetches the error word behind everything issued, waits, and reports. */
static mmrt_status cu_drain(struct mmrt_device *dev, const char *where)
{
    cudaError_t e = cudaMemcpyAsync(dev->err_host, dev->err_dev, sizeof *dev->err_host,
                                    cudaMemcpyDeviceToHost, dev->stream);
    if (e != cudaSuccess)
        return cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, where, "cudaMemcpyAsync (error word)");
    e = cudaStreamSynchronize(dev->stream);
    if (e != cudaSuccess)
        return cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, where, "cudaStreamSynchronize");
    return cu_take_device_error(dev);
}

static mmrt_status cu_download(struct mmrt_device *dev, void *dst, void *arena,
                               uint64_t offset, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    char *src = NULL;
    mmrt_status st = cu_range(dev, "download", arena, offset, nbytes, &src);
    if (st != MMRT_OK || nbytes == 0)
        return cu_note(dev, st);
    if (!dst)
        return cu_note(dev, cu_fail(dev, MMRT_ERR_INVALID_ARG, "download: NULL destination"));
    if (dev->capturing)
        return cu_not_while_capturing(dev, "download");
    if ((st = cu_select(dev, "download")) != MMRT_OK)
        return st;
    cudaError_t e =
        cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyDeviceToHost, dev->stream);
    if (e != cudaSuccess)
        return cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "download", "cudaMemcpyAsync");
    return cu_drain(dev, "download");
}

static mmrt_status cu_copy(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                           void *src_arena, uint64_t src_offset, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    char *dst = NULL, *src = NULL;
    mmrt_status st = cu_range(dev, "copy (destination)", dst_arena, dst_offset, nbytes, &dst);
    if (st == MMRT_OK)
        st = cu_range(dev, "copy (source)", src_arena, src_offset, nbytes, &src);
    if (st != MMRT_OK || nbytes == 0 || dst == src)
        return cu_note(dev, st);
    if ((st = cu_select(dev, "copy")) != MMRT_OK)
        return cu_note(dev, st);
    /* Distinct cudaMalloc blocks never overlap, so only a move inside one arena can. */
    uint64_t dist = dst > src ? (uint64_t)(dst - src) : (uint64_t)(src - dst);
    cudaError_t e;
    if (dst_arena == src_arena && dist < nbytes) {
        e = cu_move_bytes(dst, src, (size_t)nbytes, dev->stream);
        if (e != cudaSuccess)
            return cu_note(dev, cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "copy", "move kernel launch"));
        return MMRT_OK;
    }
    e = cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyDeviceToDevice, dev->stream);
    return e == cudaSuccess
               ? MMRT_OK
               : cu_note(dev, cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "copy", "cudaMemcpyAsync"));
}

static mmrt_status cu_synchronize(struct mmrt_device *dev)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (dev->capturing)
        return cu_not_while_capturing(dev, "synchronize");
    mmrt_status st = cu_select(dev, "synchronize");
    return st != MMRT_OK ? st : cu_drain(dev, "synchronize");
}

static const char *cu_last_error(struct mmrt_device *dev)
{
    return dev ? dev->err : "";
}

/* ---- graph capture -------------------------------------------------------------------- */

static mmrt_status cu_capture_begin(struct mmrt_device *dev)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (dev->capturing)
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "capture_begin: a capture is already in "
                       "progress");
    mmrt_status st = cu_select(dev, "capture_begin");
    if (st != MMRT_OK)
        return st;
    cudaError_t e = cudaStreamBeginCapture(dev->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        st = cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "capture_begin", "cudaStreamBeginCapture");
        cu_log(MMRT_LOG_WARN, "%s: graph capture unavailable, running eagerly: %s", dev->name,
               dev->err);
        return st;
    }
    dev->capturing = true;
    dev->capture_failed = false;
    dev->capture_status = MMRT_OK;
    dev->capture_why[0] = '\0';
    return MMRT_OK;
}

static mmrt_status cu_capture_end(struct mmrt_device *dev, void **graph)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!dev->capturing)
        return cu_fail(dev, MMRT_ERR_INVALID_ARG, "capture_end: no capture in progress");
    if (cu_select(dev, "capture_end") != MMRT_OK)
        cu_note(dev, MMRT_ERR_DEVICE);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(dev->stream, &g);
    if (e != cudaSuccess)
        cu_note(dev, cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "capture_end",
                                  "cudaStreamEndCapture"));
    dev->capturing = false; /* from here on, cu_note no longer records */
    struct cu_graph *cg = NULL;
    if (!dev->capture_failed && !graph) {
        dev->capture_failed = true;
        dev->capture_status = MMRT_ERR_INVALID_ARG;
        snprintf(dev->capture_why, sizeof dev->capture_why, "capture_end: NULL graph pointer");
    }
    if (!dev->capture_failed && !(cg = calloc(1, sizeof *cg))) {
        dev->capture_failed = true;
        dev->capture_status = MMRT_ERR_NO_MEMORY;
        snprintf(dev->capture_why, sizeof dev->capture_why, "capture_end: out of host memory");
    }
    if (!dev->capture_failed && (e = cudaGraphInstantiate(&cg->exec, g, 0)) != cudaSuccess) {
        cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "capture_end", "cudaGraphInstantiate");
        cg->exec = NULL;
        dev->capture_failed = true;
        dev->capture_status = MMRT_ERR_DEVICE;
        snprintf(dev->capture_why, sizeof dev->capture_why, "%s", dev->err);
    }
    if (g)
        cudaGraphDestroy(g); /* the executable graph does not need it */
    (void)cudaGetLastError();
    if (dev->capture_failed) {
        cu_graph_free(cg);
        cu_free_pinned(&dev->capture_pinned);
        cu_run_deferred(dev);
        mmrt_status st = dev->capture_status != MMRT_OK ? dev->capture_status : MMRT_ERR_DEVICE;
        cu_fail(dev, st, "graph capture failed, nothing was recorded: %s", dev->capture_why);
        cu_log(MMRT_LOG_WARN, "%s: %s", dev->name, dev->err);
        dev->capture_failed = false;
        return st;
    }
    cg->pinned = dev->capture_pinned;
    memset(&dev->capture_pinned, 0, sizeof dev->capture_pinned);
    cu_run_deferred(dev);
    *graph = cg;
    return MMRT_OK;
}

static mmrt_status cu_graph_launch(struct mmrt_device *dev, void *graph)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!graph)
        return cu_note(dev, cu_fail(dev, MMRT_ERR_INVALID_ARG, "graph_launch: NULL graph"));
    if (dev->capturing)
        return cu_note(dev, cu_fail(dev, MMRT_ERR_INVALID_ARG, "graph_launch during graph "
                                    "capture is not supported"));
    mmrt_status st = cu_select(dev, "graph_launch");
    if (st != MMRT_OK)
        return st;
    cudaError_t e = cudaGraphLaunch(((struct cu_graph *)graph)->exec, dev->stream);
    return e == cudaSuccess ? MMRT_OK
                            : cu_fail_cuda(dev, e, MMRT_ERR_DEVICE, "graph_launch",
                                           "cudaGraphLaunch");
}

static void cu_graph_destroy(struct mmrt_device *dev, void *graph)
{
    if (!dev || !graph)
        return;
    if (dev->capturing) {
        if (cu_ptrs_reserve(&dev->deferred_graphs, dev->deferred_graphs.n + 1))
            dev->deferred_graphs.p[dev->deferred_graphs.n++] = graph;
        else
            cu_log(MMRT_LOG_ERROR, "graph_destroy during capture: out of host memory, the "
                   "graph is leaked");
        return;
    }
    /* A replay still in flight reads the graph's pinned blocks: let it finish first. */
    if (cudaSetDevice(dev->ordinal) != cudaSuccess ||
        cudaStreamSynchronize(dev->stream) != cudaSuccess)
        (void)cudaGetLastError();
    cu_graph_free(graph);
    (void)cudaGetLastError();
}

/* ---- op table ------------------------------------------------------------------------- */

/* Every op: select the device, run, and remember a failure inside a capture. */
static mmrt_status cu_run_op(struct mmrt_device *dev, const struct mmrt_op_args *args,
                             mmrt_kernel_fn fn)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    mmrt_status st = cu_select(dev, "op launch");
    if (st == MMRT_OK)
        st = fn(dev, args);
    return cu_note(dev, st);
}

#define CU_ENTRY(fn)                                                                           \
    static mmrt_status fn##_entry(struct mmrt_device *dev, const struct mmrt_op_args *args)  \
    {                                                                                          \
        return cu_run_op(dev, args, fn);                                                       \
    }
CU_ENTRY(cu_op_matmul)
CU_ENTRY(cu_op_add)
CU_ENTRY(cu_op_mul)
CU_ENTRY(cu_op_scale)
CU_ENTRY(cu_op_layernorm)
CU_ENTRY(cu_op_rmsnorm)
CU_ENTRY(cu_op_gelu)
CU_ENTRY(cu_op_gelu_tanh)
CU_ENTRY(cu_op_quick_gelu)
CU_ENTRY(cu_op_silu)
CU_ENTRY(cu_op_swiglu)
CU_ENTRY(cu_op_relu2)
CU_ENTRY(cu_op_softmax)
CU_ENTRY(cu_op_rope)
CU_ENTRY(cu_op_attention)
CU_ENTRY(cu_op_get_rows)
CU_ENTRY(cu_op_patch_embed)
CU_ENTRY(cu_op_concat)
CU_ENTRY(cu_op_copy)
CU_ENTRY(cu_op_argmax)
CU_ENTRY(cu_op_rope_multi)
CU_ENTRY(cu_op_set_rows)
CU_ENTRY(cu_op_attention_paged)
CU_ENTRY(cu_op_gather_heads)
CU_ENTRY(cu_op_l2_norm)

static const mmrt_kernel_fn cu_ops[MMRT_OP_COUNT] = {
    [MMRT_OP_MATMUL] = cu_op_matmul_entry,
    [MMRT_OP_ADD] = cu_op_add_entry,
    [MMRT_OP_MUL] = cu_op_mul_entry,
    [MMRT_OP_SCALE] = cu_op_scale_entry,
    [MMRT_OP_LAYERNORM] = cu_op_layernorm_entry,
    [MMRT_OP_RMSNORM] = cu_op_rmsnorm_entry,
    [MMRT_OP_GELU] = cu_op_gelu_entry,
    [MMRT_OP_GELU_TANH] = cu_op_gelu_tanh_entry,
    [MMRT_OP_QUICK_GELU] = cu_op_quick_gelu_entry,
    [MMRT_OP_SILU] = cu_op_silu_entry,
    [MMRT_OP_SWIGLU] = cu_op_swiglu_entry,
    [MMRT_OP_RELU2] = cu_op_relu2_entry,
    [MMRT_OP_SOFTMAX] = cu_op_softmax_entry,
    [MMRT_OP_ROPE] = cu_op_rope_entry,
    [MMRT_OP_ATTENTION] = cu_op_attention_entry,
    [MMRT_OP_GET_ROWS] = cu_op_get_rows_entry,
    [MMRT_OP_PATCH_EMBED] = cu_op_patch_embed_entry,
    [MMRT_OP_CONCAT] = cu_op_concat_entry,
    [MMRT_OP_COPY] = cu_op_copy_entry,
    [MMRT_OP_ARGMAX] = cu_op_argmax_entry,
    [MMRT_OP_ROPE_MULTI] = cu_op_rope_multi_entry,
    [MMRT_OP_SET_ROWS] = cu_op_set_rows_entry,
    [MMRT_OP_ATTENTION_PAGED] = cu_op_attention_paged_entry,
    [MMRT_OP_GATHER_HEADS] = cu_op_gather_heads_entry,
    [MMRT_OP_L2_NORM] = cu_op_l2_norm_entry,
};

static const struct mmrt_plugin cu_plugin = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_plugin),
    .name = CU_NAME,
    .version = MMRT_PLUGIN_VERSION,
    .probe = cu_probe,
    .device_open = cu_device_open,
    .device_close = cu_device_close,
    .device_info = cu_device_info,
    .arena_alloc = cu_arena_alloc,
    .arena_free = cu_arena_free,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .synchronize = cu_synchronize,
    .last_error = cu_last_error,
    .ops = cu_ops,
    .n_ops = MMRT_OP_COUNT,
    .option_keys = cu_option_keys,
    .shutdown = NULL,
    .capture_begin = cu_capture_begin,
    .capture_end = cu_capture_end,
    .graph_launch = cu_graph_launch,
    .graph_destroy = cu_graph_destroy,
};

MMRT_PLUGIN_EXPORT const struct mmrt_plugin *mmrt_plugin_init(const struct mmrt_host *host)
{
    return mmrt_plugin_adopt_host(host, &cu_host, CU_NAME) ? &cu_plugin : NULL;
}
