/*
 * plugins/cuda/cuda_internal.h — what the host files of the CUDA plugin share: the device,
 * checked tensor views, argument checks and the op entry points.
 *
 * Files:
 *   cuda_plugin.c     entry point, probe, device open/info/close, arenas, transfers, the device
 *                     error word, graph capture, the op table
 *   cuda_args.c       argument resolution and the launch check every op begins with
 *                     (cf. cpu_args.c; the per-op contract is plugins/common/op_contract.h)
 *   cuda_ops.c        elementwise, row ops, ROPE, ROPE_MULTI, ATTENTION, ATTENTION_PAGED,
 *                     GET_ROWS, SET_ROWS, COPY, CONCAT, GATHER_HEADS, L2_NORM
 *   cuda_ops_gemm.c   MATMUL and PATCH_EMBED: GEMV kernels (float, I8 and U4 weights) or
 *                     cuBLAS
 *   cuda_kernels.cu, cuda_gemm.cu, cuda_attention.cu   the device code (cuda_kernels.h)
 *
 * Threading: a device is driven by one host thread at a time (plugin.h), but not always the
 * same one, and the CUDA current device is per thread; so every entry point that touches the
 * GPU selects its device first (cu_select). Nothing is shared between devices except the host
 * table.
 */
#ifndef MMRT_CUDA_INTERNAL_H
#define MMRT_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "mmrt/plugin.h"

#define CU_NAME "cuda"
#define CU_ERR_MAX 512

/* Device buffers every device owns from open to close (sizes in bytes). The GEMM scratch
 * holds the converted left operand of one cuBLAS call (rows are chunked to fit); the
 * attention workspace holds split-KV partial results; cuBLAS gets its own workspace so that
 * it never allocates, which graph capture requires. */
#define CU_GEMM_SCRATCH_BYTES ((size_t)64 << 20)
#define CU_ATTN_WS_BYTES ((size_t)16 << 20)
#define CU_BLAS_WS_BYTES ((size_t)32 << 20)

struct cu_arena {
    void *ptr;
    uint64_t nbytes;
};

struct cu_stage {
    void *host;       /* pinned, CU_STAGE_BYTES */
    cudaEvent_t done; /* recorded after the DMA that reads `host` */
};

/* A growable array of pointers (pinned blocks owned by a graph, deferred frees). */
struct cu_ptrs {
    void **p;
    size_t n, cap;
};

/* A captured graph: the executable and the pinned blocks its upload nodes read. */
struct cu_graph {
    cudaGraphExec_t exec;
    struct cu_ptrs pinned;
};

struct mmrt_device {
    int ordinal;
    cudaStream_t stream;
    struct cu_stage stage[2];
    int next_stage;
    char name[128];
    uint64_t total_bytes;
    int n_sm;
    struct cu_arena *arenas; /* [n_arenas] live arenas, unordered */
    size_t n_arenas, cap_arenas;

    cublasHandle_t blas;
    void *blas_ws;
    void *gemm_scratch;             /* CU_GEMM_SCRATCH_BYTES */
    float *attn_ws;                 /* CU_ATTN_WS_BYTES */
    struct cu_err_word *err_dev;    /* device error word (see cuda_kernels.h) */
    struct cu_err_word *err_host;   /* pinned mirror it is copied into */
    bool gemm_split;                /* option gemm_precision: high (true) or fast */

    /* Graph capture (cuda_plugin.c). While `capturing`, the stream records instead of
     * running; the first failure of anything issued meanwhile is kept and returned by
     * capture_end, which then discards the capture. */
    bool capturing, capture_failed;
    mmrt_status capture_status;
    char capture_why[CU_ERR_MAX];
    struct cu_ptrs capture_pinned;  /* pinned upload blocks of the capture in progress */
    struct cu_ptrs deferred_arenas; /* arena_free during capture: freed at capture_end */
    struct cu_ptrs deferred_graphs; /* graph_destroy during capture: destroyed then too */

    char err[CU_ERR_MAX];
};

/* Writes the printf-formatted message into dev->err and returns st. */
mmrt_status cu_fail(struct mmrt_device *dev, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__ /* returns st: why, at MMRT_RETURNS_STATUS in core/error.h */
#define cu_fail(dev, st, ...) ((void)(cu_fail)(dev, st, __VA_ARGS__), (st))
#endif
/* A failed CUDA runtime call: `oom` is the status an allocation failure maps to, anything
 * else is MMRT_ERR_DEVICE; the runtime's last-error slot is cleared (sticky errors stay). */
mmrt_status cu_fail_cuda(struct mmrt_device *dev, cudaError_t e, mmrt_status oom,
                         const char *where, const char *call);
/* The arena `handle` names on dev, or NULL. */
struct cu_arena *cu_find(struct mmrt_device *dev, const void *handle);

/* ---- tensor views and argument checks (cuda_args.c) ----------------------------------- */

/* A tensor descriptor after validation: its first element's device address, extents and
 * byte strides. Every byte the view can address lies inside its arena; strides and the offset
 * are multiples of the element size. */
struct cu_view {
    char *data; /* device address; NULL for an absent optional input */
    int dtype;
    int n_dims;
    int64_t ne[MMRT_MAX_DIMS];
    int64_t nb[MMRT_MAX_DIMS];
    int64_t numel;
    uint64_t span; /* bytes from data to one past the last addressable byte; 0 if empty */
};

struct cu_op {
    struct mmrt_device *dev;
    const char *name; /* "MATMUL" … */
    int n_src;
    struct cu_view src[MMRT_MAX_SRC_ALL]; /* 6 and 7 from op_args.src_ext (ABI 1.7) */
    struct cu_view dst;
    const void *params;
    uint32_t params_size;
};

/* Copies args (honouring its struct_size), checks that it is a launch of `op` with
 * n_required ≤ n_src ≤ n_max, that required sources and dst are present, resolves every
 * present tensor into o (arena lookup and bounds) and holds the launch to plugin.h's contract
 * (plugins/common/op_contract.h), so an op function may assume its operands' ranks, dtypes,
 * extents, contiguity and param values. A slot at or beyond n_src is absent. */
mmrt_status cu_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                        int n_required, int n_max, struct cu_op *o);
/* Copies the op's params into *out (size bytes); a launch must supply at least `size`. */
mmrt_status cu_op_params(struct cu_op *o, void *out, size_t size);
/* A refusal with the message "OP: what …". */
mmrt_status cu_bad(struct cu_op *o, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__ /* returns st: why, at MMRT_RETURNS_STATUS in core/error.h */
#define cu_bad(o, st, ...) ((void)(cu_bad)(o, st, __VA_ARGS__), (st))
#endif
/* A launcher returned e: MMRT_ERR_DEVICE naming the op and the CUDA error. */
mmrt_status cu_launch_failed(struct cu_op *o, cudaError_t e, const char *kernel);

/* Whether v's elements are packed in row-major order (strided_copy's memcpy path). */
bool cu_view_contig(const struct cu_view *v);
static inline int64_t cu_inner(const struct cu_view *v)
{
    return v->ne[v->n_dims - 1];
}
static inline int64_t cu_rows(const struct cu_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->n_dims - 1; i++)
        n *= v->ne[i];
    return n;
}

/* ---- ops (one per enum mmrt_op; the op table wraps them, see cuda_plugin.c) ------------ */

mmrt_status cu_op_matmul(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_add(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_mul(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_layernorm(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_rmsnorm(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_gelu_tanh(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_quick_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_silu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_swiglu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_relu2(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_softmax(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_rope_multi(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_attention(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_get_rows(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_patch_embed(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_concat(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_argmax(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_set_rows(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cu_op_l2_norm(struct mmrt_device *dev, const struct mmrt_op_args *args);

#endif /* MMRT_CUDA_INTERNAL_H */
