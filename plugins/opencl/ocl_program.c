/*
 * plugins/opencl/ocl_program.c — the kernels of libmmrt_opencl.so: building the embedded
 * program, the per-device kernel cache, launches, scratch memory and the device error buffer.
 *
 * The .cl files are compiled into the plugin as byte arrays (embed_cl.cmake) and built as one
 * program per device on the first op, not at device_open: opening a device to probe it or to
 * move memory should not pay for a compiler run, and PoCL compiles each kernel again on its
 * first launch anyway. The program and every cl_kernel are then kept until device_close; a
 * build failure is remembered with its log, so later ops fail the same way at once.
 *
 * Build options carry everything the kernels must agree on with the host: work-group shapes,
 * error codes, the ATTENTION tile budget, and whether the device has fp64. No fast-math
 * options; -cl-fp32-correctly-rounded-divide-sqrt where the device supports it. The
 * environment variable MMRT_OPENCL_BUILD_OPTIONS is appended when set — a debugging aid
 * (e.g. -cl-opt-disable to rule out a compiler bug) that the tests also use to make a build
 * fail on purpose.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"
#include "ocl_kernels_src.h" /* generated: ocl_sources[], OCL_N_SOURCES */

static const char *const kernel_names[OCL_K_COUNT] = {
    [OCL_K_BINARY] = "k_binary",
    [OCL_K_UNARY] = "k_unary",
    [OCL_K_LAYERNORM] = "k_layernorm",
    [OCL_K_RMSNORM] = "k_rmsnorm",
    [OCL_K_SOFTMAX] = "k_softmax",
    [OCL_K_ARGMAX] = "k_argmax",
    [OCL_K_ROPE] = "k_rope",
    [OCL_K_ROPE_MULTI] = "k_rope_multi",
    [OCL_K_CHECK_CU] = "k_check_cu",
    [OCL_K_ATTENTION] = "k_attention",
    [OCL_K_CHECK_PAGED] = "k_check_paged",
    [OCL_K_ATTENTION_PAGED] = "k_attention_paged",
    [OCL_K_MM_TILED_F32] = "k_mm_tiled_f32",
    [OCL_K_MM_TILED_F16] = "k_mm_tiled_f16",
    [OCL_K_MM_TILED_BF16] = "k_mm_tiled_bf16",
    [OCL_K_MM_TILED_I8] = "k_mm_tiled_i8",
    [OCL_K_MM_TILED_U4] = "k_mm_tiled_u4",
    [OCL_K_MM_SMALL_F32] = "k_mm_small_f32",
    [OCL_K_MM_SMALL_F16] = "k_mm_small_f16",
    [OCL_K_MM_SMALL_BF16] = "k_mm_small_bf16",
    [OCL_K_MM_SMALL_I8] = "k_mm_small_i8",
    [OCL_K_MM_SMALL_U4] = "k_mm_small_u4",
    [OCL_K_IM2COL] = "k_im2col",
    [OCL_K_COPY] = "k_copy",
    [OCL_K_GET_ROWS_CHECK] = "k_get_rows_check",
    [OCL_K_GET_ROWS] = "k_get_rows",
    [OCL_K_SET_ROWS] = "k_set_rows",
    [OCL_K_SET_ROWS_I8] = "k_set_rows_i8",
    [OCL_K_L2_NORM] = "k_l2_norm",
    [OCL_K_GATHER_HEADS] = "k_gather_heads",
};

/* Sends the build log to the host's log sink, one line per log line (a long log is cut). */
static void log_build_log(const char *log)
{
    int lines = 0;
    for (const char *p = log; *p && lines < 60; lines++) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        if (len > 0)
            ocl_log(MMRT_LOG_ERROR, "build log: %.*s", len, p);
        p += len + (nl ? 1 : 0);
    }
}

/* The compiler's log for dev's build, malloc'd ("" when the driver has none); NULL only when
 * out of host memory. */
static char *build_log(struct mmrt_device *dev)
{
    size_t size = 0;
    if (clGetProgramBuildInfo(dev->program, dev->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) !=
            CL_SUCCESS)
        size = 0;
    char *log = malloc(size + 1);
    if (!log)
        return NULL;
    log[0] = '\0';
    if (size > 0 && clGetProgramBuildInfo(dev->program, dev->device, CL_PROGRAM_BUILD_LOG, size,
                                          log, NULL) == CL_SUCCESS)
        log[size] = '\0';
    else
        log[0] = '\0';
    return log;
}

static mmrt_status build(struct mmrt_device *dev)
{
    cl_int rc;
    /* The kernels' fixed work-group shapes and the smaller attention tile must fit. */
    size_t need_wg = OCL_WG_1D > OCL_WG_ROW ? OCL_WG_1D : OCL_WG_ROW;
    if ((size_t)(OCL_MM_T / 4) * (OCL_MM_T / 4) > need_wg)
        need_wg = (size_t)(OCL_MM_T / 4) * (OCL_MM_T / 4);
    uint64_t need_local = OCL_KV_FLOATS_SMALL * sizeof(float) + 1024;
    if (dev->max_work_group < need_wg || dev->local_mem_bytes < need_local) {
        ocl_fail(dev, MMRT_ERR_UNSUPPORTED, "%s offers work-groups of %zu items and %" PRIu64
                 " bytes of local memory; this plugin's kernels need %zu and %" PRIu64,
                 dev->name, dev->max_work_group, dev->local_mem_bytes, need_wg, need_local);
        dev->build_error = strdup(dev->err);
        dev->build_status = MMRT_ERR_UNSUPPORTED;
        return MMRT_ERR_UNSUPPORTED;
    }
    size_t lengths[OCL_N_SOURCES];
    for (int i = 0; i < OCL_N_SOURCES; i++)
        lengths[i] = strlen(ocl_sources[i]);
    dev->program = clCreateProgramWithSource(dev->context, OCL_N_SOURCES,
                                             (const char **)ocl_sources, lengths, &rc);
    if (rc != CL_SUCCESS) {
        dev->program = NULL;
        return ocl_fail_cl(dev, rc, false, "building the kernels", "clCreateProgramWithSource");
    }
    /* 32 KiB of K/V tile only where that leaves the rest of the device's local memory free. */
    dev->kv_floats = dev->local_mem_bytes >= 3 * OCL_KV_FLOATS_BIG * sizeof(float) / 2
                         ? OCL_KV_FLOATS_BIG
                         : OCL_KV_FLOATS_SMALL;
    const char *extra = getenv("MMRT_OPENCL_BUILD_OPTIONS");
    char opts[1024];
    int len = snprintf(opts, sizeof opts,
                       "-cl-std=CL1.2%s -DOCL_FP64=%d -DOCL_KV_FLOATS=%d -DWG_1D=%d -DWG_ROW=%d "
                       "-DWG_ROPE=%d -DATT_BQ=%d -DATT_BK=%d -DMM_T=%d -DMM_SMALL_M=%d "
                       "-DMM_SMALL_N=%d -DMM_SMALL_WG=%d -DOCL_ERR_GET_ROWS=%d "
                       "-DOCL_ERR_CU_SEQLENS=%d -DOCL_ERR_PAGED=%d %s",
                       dev->fp32_div_sqrt ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
                       dev->fp64 ? 1 : 0, dev->kv_floats, OCL_WG_1D, OCL_WG_ROW, OCL_WG_ROPE,
                       OCL_ATT_BQ, OCL_ATT_BK, OCL_MM_T, OCL_MM_SMALL_M, OCL_MM_SMALL_N,
                       OCL_MM_SMALL_WG, OCL_ERR_GET_ROWS, OCL_ERR_CU_SEQLENS, OCL_ERR_PAGED,
                       extra ? extra : "");
    if (len < 0 || (size_t)len >= sizeof opts) {
        clReleaseProgram(dev->program);
        dev->program = NULL;
        return ocl_fail(dev, MMRT_ERR_CONFIG, "building the kernels: MMRT_OPENCL_BUILD_OPTIONS "
                        "is too long");
    }
    rc = clBuildProgram(dev->program, 1, &dev->device, opts, NULL, NULL);
    if (rc != CL_SUCCESS) {
        char *log = build_log(dev);
        if (log)
            log_build_log(log);
        ocl_fail(dev, MMRT_ERR_DEVICE, "building the kernels: clBuildProgram failed: %s (%d); "
                 "build log: %s", ocl_error_name(rc), (int)rc, log && *log ? log : "(empty)");
        ocl_log(MMRT_LOG_ERROR, "building the kernels for %s failed: %s (%d)", dev->name,
                ocl_error_name(rc), (int)rc);
        free(log);
        clReleaseProgram(dev->program);
        dev->program = NULL;
        dev->build_error = strdup(dev->err);
        dev->build_status = MMRT_ERR_DEVICE;
        return MMRT_ERR_DEVICE;
    }
    /* The error buffer starts clear; a blocking write so nothing can fail later. */
    static const cl_int zeros[OCL_ERR_WORDS];
    dev->err_mem = clCreateBuffer(dev->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  sizeof zeros, (void *)zeros, &rc);
    if (rc != CL_SUCCESS) {
        dev->err_mem = NULL;
        clReleaseProgram(dev->program);
        dev->program = NULL;
        return ocl_fail_cl(dev, rc, true, "building the kernels (error buffer)",
                           "clCreateBuffer");
    }
    ocl_log(MMRT_LOG_DEBUG, "kernels built for %s (%s)", dev->name, opts);
    return MMRT_OK;
}

mmrt_status ocl_kernel_get(struct mmrt_device *dev, enum ocl_kernel id, cl_kernel *out)
{
    if (dev->build_error)
        return ocl_fail(dev, dev->build_status, "%s", dev->build_error);
    if (!dev->program) {
        mmrt_status st = build(dev);
        if (st != MMRT_OK)
            return st;
    }
    if (!dev->kernels[id]) {
        cl_int rc;
        cl_kernel k = clCreateKernel(dev->program, kernel_names[id], &rc);
        if (rc != CL_SUCCESS) {
            char where[96];
            snprintf(where, sizeof where, "creating kernel %s", kernel_names[id]);
            return ocl_fail_cl(dev, rc, false, where, "clCreateKernel");
        }
        dev->kernels[id] = k;
    }
    *out = dev->kernels[id];
    return MMRT_OK;
}

mmrt_status ocl_program_prepare(struct mmrt_device *dev)
{
    if (dev->build_error)
        return ocl_fail(dev, dev->build_status, "%s", dev->build_error);
    return dev->program ? MMRT_OK : build(dev);
}

void ocl_program_release(struct mmrt_device *dev)
{
    for (int i = 0; i < OCL_K_COUNT; i++)
        if (dev->kernels[i])
            clReleaseKernel(dev->kernels[i]);
    if (dev->program)
        clReleaseProgram(dev->program);
    if (dev->err_mem)
        clReleaseMemObject(dev->err_mem);
    if (dev->scratch)
        clReleaseMemObject(dev->scratch);
    for (int i = 0; i < OCL_ROPE_TABLES; i++)
        if (dev->rope[i].mem)
            clReleaseMemObject(dev->rope[i].mem);
    free(dev->build_error);
}

mmrt_status ocl_check_async(struct mmrt_device *dev)
{
    if (!dev->err_armed)
        return MMRT_OK;
    cl_int e[OCL_ERR_WORDS];
    /* Blocking on the in-order queue: every kernel issued before has finished. */
    cl_int rc = clEnqueueReadBuffer(dev->queue, dev->err_mem, CL_TRUE, 0, sizeof e, e, 0, NULL,
                                    NULL);
    if (rc != CL_SUCCESS)
        return ocl_fail_cl(dev, rc, false, "reading the device error buffer",
                           "clEnqueueReadBuffer");
    dev->err_armed = false;
    if (e[0] == 0)
        return MMRT_OK;
    static const cl_int zeros[OCL_ERR_WORDS];
    rc = clEnqueueWriteBuffer(dev->queue, dev->err_mem, CL_TRUE, 0, sizeof zeros, zeros, 0, NULL,
                              NULL);
    if (rc != CL_SUCCESS)
        return ocl_fail_cl(dev, rc, false, "clearing the device error buffer",
                           "clEnqueueWriteBuffer");
    static const char later[] = " (found by the kernel, reported at this synchronize/download; "
                                "the op wrote nothing)";
    switch (e[0]) {
    case OCL_ERR_GET_ROWS:
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG,
                        "GET_ROWS: id %d at row %d is outside the table's rows [0, %d)%s",
                        (int)e[2], (int)e[1], (int)e[3], later);
    case OCL_ERR_CU_SEQLENS:
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG,
                        "ATTENTION: %s entry %d is %d: cu_seqlens must run from 0 to the "
                        "token count without decreasing%s",
                        e[1] ? "src4 (cu_seqlens_k)" : "src3 (cu_seqlens_q)", (int)e[2],
                        (int)e[3], later);
    case OCL_ERR_PAGED:
        if (e[1] == 0)
            return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED: src3 (cu_seqlens_q) "
                            "entry %d is %d: it must run from 0 to the token count without "
                            "decreasing%s", (int)e[2], (int)e[3], later);
        if (e[1] == 1)
            return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED: src4 (kv_lens) entry %d "
                            "is %d: must lie within 0 … max_pages · page_tokens = %d · %d%s",
                            (int)e[2], (int)e[3], (int)e[5], (int)e[6], later);
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED: src5 (page_table) entry [%d, "
                        "%d] is %d, outside the %d pages of k_pages%s", (int)e[2], (int)e[4],
                        (int)e[3], (int)e[7], later);
    default:
        return ocl_fail(dev, MMRT_ERR_INTERNAL, "device error buffer holds unknown code %d",
                        (int)e[0]);
    }
}

mmrt_status ocl_scratch(struct mmrt_device *dev, const char *op, uint64_t nbytes, cl_mem *out)
{
    if (nbytes == 0)
        nbytes = 1;
    if (dev->scratch && dev->scratch_bytes >= nbytes) {
        *out = dev->scratch;
        return MMRT_OK;
    }
    if (nbytes > dev->max_alloc_bytes)
        return ocl_fail(dev, MMRT_ERR_OUT_OF_POOL, "%s: %" PRIu64 " bytes of scratch exceed the "
                        "device's largest allocation of %" PRIu64 " bytes", op, nbytes,
                        dev->max_alloc_bytes);
    cl_int rc;
    cl_mem mem = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, (size_t)nbytes, NULL, &rc);
    if (rc != CL_SUCCESS) {
        char where[64];
        snprintf(where, sizeof where, "%s (scratch of %" PRIu64 " bytes)", op, nbytes);
        return ocl_fail_cl(dev, rc, true, where, "clCreateBuffer");
    }
    /* Releasing the old one is safe while queued kernels use it: OpenCL frees it after them. */
    if (dev->scratch)
        clReleaseMemObject(dev->scratch);
    dev->scratch = mem;
    dev->scratch_bytes = nbytes;
    *out = mem;
    return MMRT_OK;
}

mmrt_status ocl_call_begin(struct ocl_call *c, struct mmrt_device *dev, const char *op,
                           enum ocl_kernel id)
{
    memset(c, 0, sizeof *c);
    c->dev = dev;
    c->op = op;
    c->id = id;
    return ocl_kernel_get(dev, id, &c->kernel);
}

static void set_arg(struct ocl_call *c, size_t size, const void *value)
{
    if (c->rc == CL_SUCCESS) {
        c->rc = clSetKernelArg(c->kernel, c->n_args, size, value);
        if (c->rc != CL_SUCCESS)
            return; /* n_args stays at the failing index for the message */
    }
    if (c->rc == CL_SUCCESS)
        c->n_args++;
}

void ocl_arg_mem(struct ocl_call *c, cl_mem mem)
{
    set_arg(c, sizeof mem, &mem);
}

void ocl_arg_long(struct ocl_call *c, int64_t v)
{
    cl_long x = v;
    set_arg(c, sizeof x, &x);
}

void ocl_arg_int(struct ocl_call *c, int32_t v)
{
    cl_int x = v;
    set_arg(c, sizeof x, &x);
}

void ocl_arg_float(struct ocl_call *c, float v)
{
    cl_float x = v;
    set_arg(c, sizeof x, &x);
}

void ocl_arg_view(struct ocl_call *c, const struct ocl_view *v)
{
    /* An absent input gets a real buffer rather than NULL (which 1.2 allows, but not every
     * driver handles); the kernel never reads it. */
    ocl_arg_mem(c, v->mem ? v->mem : c->dev->err_mem);
    ocl_arg_long(c, v->mem ? (int64_t)v->offset : 0);
}

mmrt_status ocl_call_run(struct ocl_call *c, cl_uint dims, const size_t *global,
                         const size_t *local, bool checks)
{
    struct mmrt_device *dev = c->dev;
    if (c->rc != CL_SUCCESS)
        return ocl_fail(dev, MMRT_ERR_DEVICE, "%s: clSetKernelArg(%s, argument %u) failed: %s "
                        "(%d)", c->op, kernel_names[c->id], (unsigned)c->n_args,
                        ocl_error_name(c->rc), (int)c->rc);
    size_t g[3];
    for (cl_uint i = 0; i < dims; i++) {
        if (global[i] == 0)
            return MMRT_OK;
        g[i] = ocl_round_up(global[i], local[i]);
    }
    cl_int rc = clEnqueueNDRangeKernel(dev->queue, c->kernel, dims, NULL, g, local, 0, NULL, NULL);
    if (rc != CL_SUCCESS) {
        char where[96];
        snprintf(where, sizeof where, "%s (kernel %s)", c->op, kernel_names[c->id]);
        return ocl_fail_cl(dev, rc, false, where, "clEnqueueNDRangeKernel");
    }
    if (checks)
        dev->err_armed = true;
    return MMRT_OK;
}
