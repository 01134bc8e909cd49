/*
 * plugins/opencl/ocl_internal.h — what the files of libmmrt_opencl.so share: the device, the
 * kernel program and its launch helpers, checked tensor views, and the op entry points.
 *
 * Nothing here crosses the plugin boundary; the only exported symbol is mmrt_plugin_init in
 * opencl_plugin.c. Files:
 *   opencl_plugin.c        entry point, probe, device open/info/close, arenas, transfers
 *   ocl_program.c          the embedded kernels: lazy build, kernel cache, launches, the
 *                          device error buffer behind asynchronous errors
 *   ocl_args.c             argument resolution and the launch check every op begins with
 *   ocl_ops_elementwise.c  ADD, MUL, SCALE, activations, SWIGLU, norms, SOFTMAX, ARGMAX,
 *                          L2_NORM
 *   ocl_ops_matmul.c       MATMUL, PATCH_EMBED
 *   ocl_ops_attention.c    ROPE, ROPE_MULTI, ATTENTION, ATTENTION_PAGED
 *   ocl_ops_copy.c         COPY, CONCAT, GET_ROWS, SET_ROWS, GATHER_HEADS
 *   kernels/NAME.cl        the OpenCL C, embedded at build time by embed_cl.cmake
 *
 * Asynchronous errors: a kernel cannot return a status, so the ops whose validity depends on
 * data in device memory — GET_ROWS (ids), ATTENTION (cu_seqlens) and ATTENTION_PAGED
 * (cu_seqlens_q, kv_lens, page ids) — are checked on the
 * device by a small kernel that writes the first failure into a per-device error buffer
 * (int[OCL_ERR_WORDS], 0 = none). The op itself then does nothing, and so does every later
 * GET_ROWS or attention with device-side indices, until the error is reported: the next synchronize()
 * or download() reads the buffer, clears it and returns MMRT_ERR_INVALID_ARG with a message
 * naming the op and the offending value (plugin.h allows exactly this). Other ops issued in
 * between still run; their results are meaningless if they consumed the failed op's output,
 * and the failing status tells the caller so.
 */
#ifndef MMRT_OCL_INTERNAL_H
#define MMRT_OCL_INTERNAL_H

#include <CL/cl.h>
#include <stdbool.h>
#include <stdint.h>

#include "mmrt/plugin.h"

#define OCL_NAME "opencl"
#define OCL_ERR_MAX 4096 /* room for a compiler build log in last_error */

/* Work-group shapes, passed to the kernels as -D build options so host grids and kernel
 * loops cannot drift apart (see kernels/common.cl). */
#define OCL_WG_1D 256       /* elementwise, COPY, GET_ROWS, SET_ROWS, GATHER_HEADS */
#define OCL_WG_ROW 256      /* one work-group per row: norms, SOFTMAX, ARGMAX, L2_NORM, and
                             SET_ROWS into I8 (per innermost row) */
#define OCL_WG_ROPE 64      /* ROPE, ROPE_MULTI */
#define OCL_ATT_BQ 32       /* ATTENTION queries per work-group */
#define OCL_ATT_BK 64       /* most keys per ATTENTION tile */
#define OCL_MM_T 64         /* MATMUL tile edge; the work-group is (OCL_MM_T/4)² items */
#define OCL_MM_SMALL_M 4    /* MATMUL with M ≤ this uses the small-M kernel */
#define OCL_MM_INVARIANT_M 32 /* …and up to this many rows it in groups of OCL_MM_SMALL_M */
#define OCL_MM_SMALL_N 4    /* outputs per small-M work-group */
#define OCL_MM_SMALL_WG 64
/* Local memory for one ATTENTION K/V tile (floats, K and V together): 32 KiB where the device
 * has room for it next to the rest, 16 KiB on a device with the OpenCL minimum of 32 KiB.
 * The largest work-group above (256) and the small tile are what a device must offer; one
 * that cannot (an embedded-profile part) is refused at the first op with a message. */
#define OCL_KV_FLOATS_BIG 8192
#define OCL_KV_FLOATS_SMALL 4096

#define OCL_ERR_WORDS 8
#define OCL_ERR_GET_ROWS 1   /* [1] row, [2] id, [3] table rows (clamped to INT32_MAX) */
#define OCL_ERR_CU_SEQLENS 2 /* [1] 0 = cu_seqlens_q, 1 = cu_seqlens_k, [2] entry, [3] value */
/* ATTENTION_PAGED: [1] 0 = cu_seqlens_q, 1 = kv_lens, 2 = page_table, [2] entry (sequence),
 * [3] value, [4] table column, [5] max_pages, [6] page_tokens, [7] n_pages */
#define OCL_ERR_PAGED 3

#define OCL_ROPE_TABLES 8 /* cached inv_freq tables, one per (theta, freq_dim, entries) */

enum ocl_kernel {
    OCL_K_BINARY,
    OCL_K_UNARY,
    OCL_K_LAYERNORM,
    OCL_K_RMSNORM,
    OCL_K_SOFTMAX,
    OCL_K_ARGMAX,
    OCL_K_ROPE,
    OCL_K_ROPE_MULTI,
    OCL_K_CHECK_CU,
    OCL_K_ATTENTION,
    OCL_K_CHECK_PAGED,
    OCL_K_ATTENTION_PAGED,
    OCL_K_MM_TILED_F32,
    OCL_K_MM_TILED_F16,
    OCL_K_MM_TILED_BF16,
    OCL_K_MM_TILED_I8,
    OCL_K_MM_TILED_U4,
    OCL_K_MM_SMALL_F32, /* the small-M kernels in the order of the tiled ones */
    OCL_K_MM_SMALL_F16,
    OCL_K_MM_SMALL_BF16,
    OCL_K_MM_SMALL_I8,
    OCL_K_MM_SMALL_U4,
    OCL_K_IM2COL,
    OCL_K_COPY,
    OCL_K_GET_ROWS_CHECK,
    OCL_K_GET_ROWS,
    OCL_K_SET_ROWS,
    OCL_K_SET_ROWS_I8,
    OCL_K_L2_NORM,
    OCL_K_GATHER_HEADS,
    OCL_K_COUNT
};

struct ocl_arena {
    cl_mem mem;
    uint64_t nbytes;
};

/* inv_freq[i] = 1 / theta^((2i) / freq_dim) for i < n, computed on the host (see
 * ocl_ops_attention.c): ROPE's is (theta, n_rot, n_rot / 2), ROPE_MULTI's
 * (theta, freq_dim, n_rot / 2). */
struct ocl_rope_table {
    float theta;
    int32_t freq_dim;
    int32_t n;
    cl_mem mem; /* float[n]; NULL when the slot is free */
};

struct mmrt_device {
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    char name[128];
    char kind[16];
    uint64_t total_bytes;
    uint64_t max_alloc_bytes;
    uint64_t local_mem_bytes;
    size_t max_work_group;        /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    uint32_t alignment;
    bool fp64;                    /* cl_khr_fp64 */
    bool fp32_div_sqrt;           /* CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT */
    bool fp32_denorm;             /* CL_FP_DENORM: f32 subnormals are kept, not flushed */
    struct ocl_arena *arenas;     /* [n_arenas] live arenas, unordered */
    size_t n_arenas, cap_arenas;

    /* ocl_program.c: built on first use, then kept until device_close. */
    cl_program program;           /* NULL until built */
    char *build_error;            /* the failure message when the build failed, else NULL */
    mmrt_status build_status;     /* and its status */
    cl_kernel kernels[OCL_K_COUNT];
    cl_mem err_mem;               /* int[OCL_ERR_WORDS], the device error buffer */
    bool err_armed;               /* a checking kernel ran since the buffer was last read */
    int kv_floats;                /* OCL_KV_FLOATS_* chosen at build time */

    cl_mem scratch;               /* PATCH_EMBED's gathered patches; grows, never shrinks */
    uint64_t scratch_bytes;
    struct ocl_rope_table rope[OCL_ROPE_TABLES];
    int rope_next;                /* slot to evict next */

    char err[OCL_ERR_MAX];
};

/* ---- opencl_plugin.c ------------------------------------------------------------------ */

void ocl_log(enum mmrt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *ocl_error_name(cl_int rc);
/* Writes the message into dev->err and returns st. */
mmrt_status ocl_fail(struct mmrt_device *dev, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__ /* returns st: why, at MMRT_RETURNS_STATUS in core/error.h */
#define ocl_fail(dev, st, ...) ((void)(ocl_fail)(dev, st, __VA_ARGS__), (st))
#endif
/* "<where>: <call> failed: <CL name> (<code>)" with the status the code maps to. */
mmrt_status ocl_fail_cl(struct mmrt_device *dev, cl_int rc, bool allocating, const char *where,
                        const char *call);
/* The arena `handle` names on dev, or NULL. */
struct ocl_arena *ocl_find(struct mmrt_device *dev, const void *handle);

/* ---- ocl_program.c -------------------------------------------------------------------- */

/* Builds the program on first use (MMRT_ERR_DEVICE with the build log on failure, remembered
 * so later calls fail the same way without rebuilding) and returns kernel `id`. */
mmrt_status ocl_kernel_get(struct mmrt_device *dev, enum ocl_kernel id, cl_kernel *out);
/* Releases the program, kernels, error buffer, scratch and ROPE tables. */
void ocl_program_release(struct mmrt_device *dev);
/* Builds the program now (the plugin's `prepare`): a build failure is reported at start-up. */
mmrt_status ocl_program_prepare(struct mmrt_device *dev);
/* Reads and clears the device error buffer if a checking kernel ran since the last read;
 * MMRT_ERR_INVALID_ARG with the op's message when it held an error. Waits for the queue. */
mmrt_status ocl_check_async(struct mmrt_device *dev);
/* A scratch buffer of at least nbytes (reused across ops: the queue is in order). */
mmrt_status ocl_scratch(struct mmrt_device *dev, const char *op, uint64_t nbytes, cl_mem *out);

/* One kernel launch: set arguments in order, then run. Argument errors are collected and
 * reported by ocl_call_run. */
struct ocl_call {
    struct mmrt_device *dev;
    const char *op;
    cl_kernel kernel;
    enum ocl_kernel id;
    cl_uint n_args;
    cl_int rc;
};

mmrt_status ocl_call_begin(struct ocl_call *c, struct mmrt_device *dev, const char *op,
                           enum ocl_kernel id);
void ocl_arg_mem(struct ocl_call *c, cl_mem mem);
void ocl_arg_long(struct ocl_call *c, int64_t v);
void ocl_arg_int(struct ocl_call *c, int32_t v);
void ocl_arg_float(struct ocl_call *c, float v);
/* Enqueues with global sizes rounded up to multiples of local. A zero global size is a no-op.
 * `checks` marks a kernel that may write the device error buffer. */
mmrt_status ocl_call_run(struct ocl_call *c, cl_uint dims, const size_t *global,
                         const size_t *local, bool checks);

static inline size_t ocl_round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

/* ---- ocl_args.c: tensor views and the launch check ------------------------------------ */

/* A tensor after validation: every byte it can address lies inside its arena, offset and
 * strides are non-negative multiples of the element size, the element count did not
 * overflow. */
struct ocl_view {
    cl_mem mem;       /* NULL for an absent optional input */
    uint64_t offset;  /* bytes from the arena start to the first element */
    int dtype;
    int n_dims;
    int64_t ne[MMRT_MAX_DIMS];
    int64_t nb[MMRT_MAX_DIMS]; /* bytes */
    int64_t numel;
    uint64_t span;    /* bytes from the first element to one past the last; 0 if empty */
};

struct ocl_op {
    struct mmrt_device *dev;
    const char *name;
    int n_src;
    struct ocl_view src[MMRT_MAX_SRC_ALL]; /* sources 6 and 7 (ABI 1.7) as the others */
    struct ocl_view dst;
    const void *params;
    uint32_t params_size;
};

/* Copies args (honouring its struct_size), checks it launches `op` with n_required ≤ n_src ≤
 * n_max, that required sources and dst are present, resolves every present tensor and holds
 * the launch to plugin.h's contract (plugins/common/op_contract.h), so an op function may
 * assume its operands' ranks, dtypes, extents, contiguity and param values; what is left to
 * it is what needs device memory to see and its kernels' own limits (MMRT_ERR_UNSUPPORTED). */
mmrt_status ocl_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                         int n_required, int n_max, struct ocl_op *o);
/* Copies the op's params (at least `size` bytes must be supplied) into *out. */
mmrt_status ocl_op_params(struct ocl_op *o, void *out, size_t size);
/* A refusal with the message "OP: …". */
mmrt_status ocl_bad(struct ocl_op *o, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__ /* returns st: why, at MMRT_RETURNS_STATUS in core/error.h */
#define ocl_bad(o, st, ...) ((void)(ocl_bad)(o, st, __VA_ARGS__), (st))
#endif

/* Same arena, offset, dtype, extents and strides. */
bool ocl_same_view(const struct ocl_view *a, const struct ocl_view *b);

static inline int64_t ocl_inner(const struct ocl_view *v)
{
    return v->ne[v->n_dims - 1];
}

static inline int64_t ocl_rows(const struct ocl_view *v)
{
    int64_t n = 1; /* cannot overflow: ocl_op_begin checked the partial products */
    for (int i = 0; i < v->n_dims - 1; i++)
        n *= v->ne[i];
    return n;
}

/* Passes a view as (buffer, byte offset); an absent one as a placeholder buffer that the
 * kernel never reads (its has_* flag is 0). */
void ocl_arg_view(struct ocl_call *c, const struct ocl_view *v);

/* ---- ops ------------------------------------------------------------------------------ */

mmrt_status ocl_op_matmul(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_add(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_mul(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_layernorm(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_rmsnorm(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_gelu_tanh(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_quick_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_silu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_swiglu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_relu2(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_softmax(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_rope_multi(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_attention(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_get_rows(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_patch_embed(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_concat(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_argmax(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_set_rows(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status ocl_op_l2_norm(struct mmrt_device *dev, const struct mmrt_op_args *args);

#endif /* MMRT_OCL_INTERNAL_H */
