/*
 * plugins/opencl/opencl_plugin.c — libmmrt_opencl.so: OpenCL 1.2 devices behind the mmrt
 * plugin ABI. This file covers discovery and memory (probe, open, info, arenas, transfers) and
 * the plugin table; the operators are embedded .cl kernels driven by the ocl_ops_*.c files
 * (see ocl_internal.h for the map).
 *
 * Device numbering: platforms in the order the ICD loader returns them, and within each
 * platform its devices in clGetDeviceIDs(CL_DEVICE_TYPE_ALL) order. With the `platform`
 * option the index counts only the devices of the matching platform(s). A platform whose
 * device query fails counts as having no devices in probe and device_open alike, so the two
 * never disagree about the numbering.
 *
 * Each device owns one context and one in-order queue, which is the ABI's ordering rule for
 * free: every command sees the results of everything issued before it.
 *
 * Arenas: the handle is the cl_mem itself, so kernels pass tensor->buffer straight to
 * clSetKernelArg (with the byte offset as a separate argument, never a sub-buffer). The
 * device keeps a table {cl_mem, nbytes} for bounds checks and so that device_close can release
 * what the core left allocated. Arenas are few large blocks that the core's pool carves up,
 * so a linear scan of that table is all the lookup needs.
 *
 * synchronize() and download() also report what a kernel found in data only the device sees
 * (an out-of-range GET_ROWS id, bad cu_seqlens): see ocl_internal.h.
 */
#include "ocl_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* From cl_ext.h (cl_khr_icd); spelled out so the value does not depend on header version. */
#define OCL_PLATFORM_NOT_FOUND_KHR (-1001)
/* An overlapping copy inside one arena is split into at most this many pieces that do not
 * overlap themselves; a shorter move distance bounces through a scratch buffer instead. */
#define OCL_MAX_MOVE_PIECES 16

/* Sizes cross the ABI as uint64_t and go to OpenCL as size_t unchecked. */
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "64-bit host required");

/* Zeroed copy of the host table (see mmrt_plugin_init); members the host lacks stay NULL. */
static struct mmrt_host ocl_host;

void ocl_log(enum mmrt_log_level level, const char *fmt, ...)
{
    if (!ocl_host.log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ocl_host.log(ocl_host.user, level, OCL_NAME, line);
}

const char *ocl_error_name(cl_int rc)
{
    /* Numeric values rather than macros: the header hides names newer than the target
     * version, but a newer driver may still return them. */
    static const struct {
        cl_int code;
        const char *name;
    } names[] = {
        {0, "CL_SUCCESS"},
        {-1, "CL_DEVICE_NOT_FOUND"},
        {-2, "CL_DEVICE_NOT_AVAILABLE"},
        {-3, "CL_COMPILER_NOT_AVAILABLE"},
        {-4, "CL_MEM_OBJECT_ALLOCATION_FAILURE"},
        {-5, "CL_OUT_OF_RESOURCES"},
        {-6, "CL_OUT_OF_HOST_MEMORY"},
        {-7, "CL_PROFILING_INFO_NOT_AVAILABLE"},
        {-8, "CL_MEM_COPY_OVERLAP"},
        {-9, "CL_IMAGE_FORMAT_MISMATCH"},
        {-10, "CL_IMAGE_FORMAT_NOT_SUPPORTED"},
        {-11, "CL_BUILD_PROGRAM_FAILURE"},
        {-12, "CL_MAP_FAILURE"},
        {-13, "CL_MISALIGNED_SUB_BUFFER_OFFSET"},
        {-14, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"},
        {-15, "CL_COMPILE_PROGRAM_FAILURE"},
        {-16, "CL_LINKER_NOT_AVAILABLE"},
        {-17, "CL_LINK_PROGRAM_FAILURE"},
        {-18, "CL_DEVICE_PARTITION_FAILED"},
        {-19, "CL_KERNEL_ARG_INFO_NOT_AVAILABLE"},
        {-30, "CL_INVALID_VALUE"},
        {-31, "CL_INVALID_DEVICE_TYPE"},
        {-32, "CL_INVALID_PLATFORM"},
        {-33, "CL_INVALID_DEVICE"},
        {-34, "CL_INVALID_CONTEXT"},
        {-35, "CL_INVALID_QUEUE_PROPERTIES"},
        {-36, "CL_INVALID_COMMAND_QUEUE"},
        {-37, "CL_INVALID_HOST_PTR"},
        {-38, "CL_INVALID_MEM_OBJECT"},
        {-39, "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR"},
        {-40, "CL_INVALID_IMAGE_SIZE"},
        {-41, "CL_INVALID_SAMPLER"},
        {-42, "CL_INVALID_BINARY"},
        {-43, "CL_INVALID_BUILD_OPTIONS"},
        {-44, "CL_INVALID_PROGRAM"},
        {-45, "CL_INVALID_PROGRAM_EXECUTABLE"},
        {-46, "CL_INVALID_KERNEL_NAME"},
        {-47, "CL_INVALID_KERNEL_DEFINITION"},
        {-48, "CL_INVALID_KERNEL"},
        {-49, "CL_INVALID_ARG_INDEX"},
        {-50, "CL_INVALID_ARG_VALUE"},
        {-51, "CL_INVALID_ARG_SIZE"},
        {-52, "CL_INVALID_KERNEL_ARGS"},
        {-53, "CL_INVALID_WORK_DIMENSION"},
        {-54, "CL_INVALID_WORK_GROUP_SIZE"},
        {-55, "CL_INVALID_WORK_ITEM_SIZE"},
        {-56, "CL_INVALID_GLOBAL_OFFSET"},
        {-57, "CL_INVALID_EVENT_WAIT_LIST"},
        {-58, "CL_INVALID_EVENT"},
        {-59, "CL_INVALID_OPERATION"},
        {-60, "CL_INVALID_GL_OBJECT"},
        {-61, "CL_INVALID_BUFFER_SIZE"},
        {-62, "CL_INVALID_MIP_LEVEL"},
        {-63, "CL_INVALID_GLOBAL_WORK_SIZE"},
        {-64, "CL_INVALID_PROPERTY"},
        {-65, "CL_INVALID_IMAGE_DESCRIPTOR"},
        {-66, "CL_INVALID_COMPILER_OPTIONS"},
        {-67, "CL_INVALID_LINKER_OPTIONS"},
        {-68, "CL_INVALID_DEVICE_PARTITION_COUNT"},
        {-69, "CL_INVALID_PIPE_SIZE"},
        {-70, "CL_INVALID_DEVICE_QUEUE"},
        {-71, "CL_INVALID_SPEC_ID"},
        {-72, "CL_MAX_SIZE_RESTRICTION_EXCEEDED"},
        {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == rc)
            return names[i].name;
    return "unknown OpenCL error";
}

/* CL_OUT_OF_RESOURCES means "no room" only while allocating; elsewhere some drivers use it
 * for a faulting kernel, which is a device error. */
static mmrt_status ocl_status(cl_int rc, bool allocating)
{
    switch (rc) {
    case CL_OUT_OF_HOST_MEMORY: return MMRT_ERR_NO_MEMORY;
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return MMRT_ERR_OUT_OF_POOL;
    case CL_OUT_OF_RESOURCES:
    case CL_INVALID_BUFFER_SIZE: return allocating ? MMRT_ERR_OUT_OF_POOL : MMRT_ERR_DEVICE;
    default: return MMRT_ERR_DEVICE;
    }
}

mmrt_status(ocl_fail)(struct mmrt_device *dev, mmrt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dev->err, sizeof dev->err, fmt, ap);
    va_end(ap);
    return st;
}

mmrt_status ocl_fail_cl(struct mmrt_device *dev, cl_int rc, bool allocating, const char *where,
                        const char *call)
{
    return ocl_fail(dev, ocl_status(rc, allocating), "%s: %s failed: %s (%d)", where, call,
                    ocl_error_name(rc), (int)rc);
}

static void ocl_say(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void ocl_say(char *buf, size_t size, const char *fmt, ...)
{
    if (!buf || !size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

/* A string property of a platform (device == NULL) or a device, truncated to fit buf;
 * "" when the driver cannot say. */
static void ocl_info_string(cl_platform_id platform, cl_device_id device, cl_uint param,
                            char *buf, size_t size)
{
    size_t need = 0;
    cl_int rc;
    buf[0] = '\0';
    rc = device ? clGetDeviceInfo(device, param, 0, NULL, &need)
                : clGetPlatformInfo(platform, param, 0, NULL, &need);
    if (rc != CL_SUCCESS || need == 0)
        return;
    char *tmp = malloc(need);
    if (!tmp)
        return;
    rc = device ? clGetDeviceInfo(device, param, need, tmp, NULL)
                : clGetPlatformInfo(platform, param, need, tmp, NULL);
    if (rc == CL_SUCCESS) {
        tmp[need - 1] = '\0';
        snprintf(buf, size, "%s", tmp);
    }
    free(tmp);
}

/* All platforms in ICD order; none (and CL_SUCCESS) when the loader finds no ICD. */
static cl_int ocl_platforms(cl_platform_id **out, cl_uint *n)
{
    *out = NULL;
    *n = 0;
    cl_uint count = 0;
    cl_int rc = clGetPlatformIDs(0, NULL, &count);
    if (rc == OCL_PLATFORM_NOT_FOUND_KHR || (rc == CL_SUCCESS && count == 0))
        return CL_SUCCESS;
    if (rc != CL_SUCCESS)
        return rc;
    cl_platform_id *ids = calloc(count, sizeof *ids);
    if (!ids)
        return CL_OUT_OF_HOST_MEMORY;
    /* The second call reports how many platforms there are now, which an ICD loader whose
     * list changed between the calls can give as more than it wrote: use the smaller. */
    cl_uint now = 0;
    rc = clGetPlatformIDs(count, ids, &now);
    if (rc != CL_SUCCESS || now == 0) {
        free(ids);
        return rc;
    }
    *out = ids;
    *n = now < count ? now : count;
    return CL_SUCCESS;
}

static cl_uint ocl_device_count(cl_platform_id platform)
{
    cl_uint n = 0;
    if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n) != CL_SUCCESS)
        return 0;
    return n;
}

static mmrt_status ocl_probe(int *n_devices, char *why, size_t why_size)
{
    if (!n_devices)
        return MMRT_ERR_INVALID_ARG;
    cl_platform_id *plats;
    cl_uint n_plats;
    cl_int rc = ocl_platforms(&plats, &n_plats);
    if (rc == CL_OUT_OF_HOST_MEMORY)
        return MMRT_ERR_NO_MEMORY;
    if (rc != CL_SUCCESS) {
        /* A broken ICD setup means no usable device, not a failed runtime. */
        ocl_say(why, why_size, "no OpenCL platform (clGetPlatformIDs failed: %s (%d))",
                ocl_error_name(rc), (int)rc);
        *n_devices = 0;
        return MMRT_OK;
    }
    uint64_t total = 0;
    for (cl_uint i = 0; i < n_plats; i++)
        total += ocl_device_count(plats[i]);
    free(plats);
    if (n_plats == 0)
        ocl_say(why, why_size, "no OpenCL platform");
    else if (total == 0)
        ocl_say(why, why_size, "no OpenCL device on %u platform(s)", (unsigned)n_plats);
    else
        ocl_say(why, why_size, "%s", "");
    *n_devices = total > INT32_MAX ? INT32_MAX : (int)total;
    return MMRT_OK;
}

static void CL_CALLBACK ocl_context_notify(const char *errinfo, const void *private_info,
                                           size_t cb, void *user_data)
{
    (void)private_info;
    (void)cb;
    (void)user_data;
    /* Called from driver threads; the host's log sink is thread-safe. */
    ocl_log(MMRT_LOG_WARN, "driver: %s", errinfo ? errinfo : "(no detail)");
}

/* Reads the properties device_info reports once: none of them change while the device is
 * open. */
static mmrt_status ocl_query_device(struct mmrt_device *dev, cl_platform_id platform,
                                    char *err, size_t err_size)
{
    cl_device_type type = 0;
    cl_ulong global = 0, max_alloc = 0, local = 0;
    size_t max_wg = 0;
    cl_uint align_bits = 0;
    cl_device_fp_config fp32 = 0, fp64 = 0;
    cl_int rc = clGetDeviceInfo(dev->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (rc == CL_SUCCESS)
        rc = clGetDeviceInfo(dev->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global,
                             NULL);
    if (rc == CL_SUCCESS)
        rc = clGetDeviceInfo(dev->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc,
                             &max_alloc, NULL);
    if (rc == CL_SUCCESS)
        rc = clGetDeviceInfo(dev->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits,
                             &align_bits, NULL);
    if (rc == CL_SUCCESS)
        rc = clGetDeviceInfo(dev->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
    if (rc == CL_SUCCESS)
        rc = clGetDeviceInfo(dev->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg,
                             NULL);
    if (rc == CL_SUCCESS)
        rc = clGetDeviceInfo(dev->device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp32, &fp32, NULL);
    /* A device without fp64 may refuse the query rather than answer 0. */
    if (rc == CL_SUCCESS &&
        clGetDeviceInfo(dev->device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64, &fp64, NULL) !=
            CL_SUCCESS)
        fp64 = 0;
    if (rc != CL_SUCCESS) {
        ocl_say(err, err_size, "device_open: clGetDeviceInfo failed: %s (%d)",
                ocl_error_name(rc), (int)rc);
        return ocl_status(rc, false);
    }
    char dname[128], pname[48];
    ocl_info_string(NULL, dev->device, CL_DEVICE_NAME, dname, sizeof dname);
    ocl_info_string(platform, NULL, CL_PLATFORM_NAME, pname, sizeof pname);
    /* "DEVICE (PLATFORM)"; a long device name is cut so the platform stays readable. */
    int w = snprintf(dev->name, sizeof dev->name, "%s (%s)", dname, pname);
    if (w >= (int)sizeof dev->name)
        snprintf(dev->name, sizeof dev->name, "%.*s (%s)",
                 (int)(sizeof dev->name - strlen(pname) - 4), dname, pname);
    const char *kind = (type & CL_DEVICE_TYPE_GPU) ? "gpu"
                       : (type & CL_DEVICE_TYPE_CPU) ? "cpu"
                                                     : "accelerator";
    snprintf(dev->kind, sizeof dev->kind, "%s", kind);
    dev->total_bytes = global;
    dev->max_alloc_bytes = max_alloc;
    dev->local_mem_bytes = local;
    dev->max_work_group = max_wg;
    dev->fp32_div_sqrt = (fp32 & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    dev->fp32_denorm = (fp32 & CL_FP_DENORM) != 0;
    /* OpenCL 1.2 reports a double config only with cl_khr_fp64; 0 means none. */
    dev->fp64 = fp64 != 0;
    /* The ABI wants bytes; the core's pool also wants cache-line granularity at least. */
    dev->alignment = align_bits / 8 < 64 ? 64 : align_bits / 8;
    return MMRT_OK;
}

static void ocl_device_close(struct mmrt_device *dev);

static mmrt_status ocl_device_open(int index, const struct mmrt_option *options,
                                   int n_options, struct mmrt_device **out, char *err,
                                   size_t err_size)
{
    const char *want = NULL;
    cl_platform_id *plats = NULL;
    cl_device_id *ids = NULL;
    struct mmrt_device *dev = NULL;
    mmrt_status st = MMRT_OK;

    if (!out || (n_options > 0 && !options)) {
        ocl_say(err, err_size, "device_open: NULL argument");
        return MMRT_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_options; i++) {
        const char *key = options[i].key ? options[i].key : "";
        if (strcmp(key, "platform") != 0) {
            ocl_say(err, err_size, "unknown option '%s' (the OpenCL plugin knows: platform)",
                    key);
            return MMRT_ERR_CONFIG;
        }
        if (want) {
            ocl_say(err, err_size, "option 'platform' given twice");
            return MMRT_ERR_CONFIG;
        }
        if (!options[i].value || !*options[i].value) {
            ocl_say(err, err_size, "option 'platform' needs a value (part of a platform name)");
            return MMRT_ERR_CONFIG;
        }
        want = options[i].value;
    }
    if (index < 0) {
        ocl_say(err, err_size, "OpenCL device index %d is negative", index);
        return MMRT_ERR_INVALID_ARG;
    }

    cl_uint n_plats;
    cl_int rc = ocl_platforms(&plats, &n_plats);
    if (rc != CL_SUCCESS) {
        ocl_say(err, err_size, "device_open: clGetPlatformIDs failed: %s (%d)",
                ocl_error_name(rc), (int)rc);
        return rc == CL_OUT_OF_HOST_MEMORY ? MMRT_ERR_NO_MEMORY : MMRT_ERR_NO_DEVICE;
    }
    if (n_plats == 0) {
        ocl_say(err, err_size, "no OpenCL platform");
        return MMRT_ERR_NO_DEVICE;
    }

    /* Walk the numbering described at the top; `found` lists platform names for messages. */
    char found[256] = "";
    size_t found_len = 0;
    cl_platform_id platform = NULL;
    cl_device_id device = NULL;
    uint64_t seen = 0;
    bool matched = false;
    for (cl_uint p = 0; p < n_plats; p++) {
        char pname[96];
        ocl_info_string(plats[p], NULL, CL_PLATFORM_NAME, pname, sizeof pname);
        if (found_len < sizeof found) {
            int w = snprintf(found + found_len, sizeof found - found_len, "%s'%s'",
                             p ? ", " : "", pname);
            found_len += w > 0 ? (size_t)w : 0;
        }
        if (want && !strcasestr(pname, want))
            continue;
        matched = true;
        cl_uint n = ocl_device_count(plats[p]);
        /* Asked for once: a platform whose device went away since it was counted leaves
         * `device` unset, and the numbering must not be retried on a later platform. */
        if (!ids && (uint64_t)index < seen + n) {
            ids = calloc(n, sizeof *ids);
            if (!ids) {
                ocl_say(err, err_size, "device_open: out of host memory");
                st = MMRT_ERR_NO_MEMORY;
                goto fail;
            }
            cl_uint got = 0;
            rc = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, n, ids, &got);
            if (rc != CL_SUCCESS) {
                ocl_say(err, err_size, "device_open: clGetDeviceIDs failed: %s (%d)",
                        ocl_error_name(rc), (int)rc);
                st = ocl_status(rc, false);
                goto fail;
            }
            uint64_t at = (uint64_t)index - seen;
            if (at >= (got < n ? got : n) || !ids[at]) {
                ocl_say(err, err_size,
                        "device_open: platform '%s' listed %u device(s) after counting %u; "
                        "device index %d is gone",
                        pname, (unsigned)got, (unsigned)n, index);
                st = MMRT_ERR_NO_DEVICE;
                goto fail;
            }
            platform = plats[p];
            device = ids[at];
        }
        seen += n;
    }
    if (want && !matched) {
        ocl_say(err, err_size, "platform '%s' matches no OpenCL platform (found: %s)", want,
                found);
        st = MMRT_ERR_NO_DEVICE;
        goto fail;
    }
    if (!device) {
        if (want)
            ocl_say(err, err_size,
                    "OpenCL device index %d out of range: platform '%s' has %" PRIu64
                    " device(s)",
                    index, want, seen);
        else
            ocl_say(err, err_size,
                    "OpenCL device index %d out of range: %" PRIu64 " device(s) found", index,
                    seen);
        st = MMRT_ERR_NO_DEVICE;
        goto fail;
    }

    dev = calloc(1, sizeof *dev);
    if (!dev) {
        ocl_say(err, err_size, "device_open: out of host memory");
        st = MMRT_ERR_NO_MEMORY;
        goto fail;
    }
    dev->device = device;
    st = ocl_query_device(dev, platform, err, err_size);
    if (st != MMRT_OK)
        goto fail;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
    dev->context = clCreateContext(props, 1, &device, ocl_context_notify, NULL, &rc);
    if (rc != CL_SUCCESS) {
        dev->context = NULL;
        ocl_say(err, err_size, "device_open: clCreateContext failed: %s (%d)",
                ocl_error_name(rc), (int)rc);
        st = ocl_status(rc, false);
        goto fail;
    }
    dev->queue = clCreateCommandQueue(dev->context, device, 0, &rc);
    if (rc != CL_SUCCESS) {
        dev->queue = NULL;
        ocl_say(err, err_size, "device_open: clCreateCommandQueue failed: %s (%d)",
                ocl_error_name(rc), (int)rc);
        st = ocl_status(rc, false);
        goto fail;
    }
    free(ids);
    free(plats);
    ocl_log(MMRT_LOG_DEBUG, "opened device %d: %s", index, dev->name);
    *out = dev;
    return MMRT_OK;

fail:
    ocl_device_close(dev);
    free(ids);
    free(plats);
    return st;
}

static void ocl_device_close(struct mmrt_device *dev)
{
    if (!dev)
        return;
    if (dev->queue)
        clFinish(dev->queue);
    ocl_program_release(dev);
    for (size_t i = 0; i < dev->n_arenas; i++)
        clReleaseMemObject(dev->arenas[i].mem);
    if (dev->queue)
        clReleaseCommandQueue(dev->queue);
    if (dev->context)
        clReleaseContext(dev->context);
    free(dev->arenas);
    free(dev);
}

static mmrt_status ocl_device_info(struct mmrt_device *dev, struct mmrt_device_info *info)
{
    if (!dev || !info)
        return MMRT_ERR_INVALID_ARG;
    if (info->hdr.struct_size < sizeof info->hdr)
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "device_info: struct_size %u too small",
                        (unsigned)info->hdr.struct_size);
    struct mmrt_device_info full;
    memset(&full, 0, sizeof full);
    full.hdr = info->hdr;
    snprintf(full.name, sizeof full.name, "%s", dev->name);
    snprintf(full.kind, sizeof full.kind, "%s", dev->kind);
    full.total_bytes = dev->total_bytes;
    /* OpenCL 1.2 has no query for free memory (only vendor extensions do), so the best
     * honest figure is the total; the core's pool accounting is what tracks use. */
    full.free_bytes = dev->total_bytes;
    full.max_arena_bytes = dev->max_alloc_bytes;
    full.alignment = dev->alignment;
    size_t n = info->hdr.struct_size < sizeof full ? info->hdr.struct_size : sizeof full;
    memcpy(info, &full, n);
    return MMRT_OK;
}

struct ocl_arena *ocl_find(struct mmrt_device *dev, const void *handle)
{
    for (size_t i = 0; i < dev->n_arenas; i++)
        if ((const void *)dev->arenas[i].mem == handle)
            return &dev->arenas[i];
    return NULL;
}

static mmrt_status ocl_arena_alloc(struct mmrt_device *dev, uint64_t nbytes, void **arena)
{
    if (!dev || !arena)
        return MMRT_ERR_INVALID_ARG;
    if (nbytes == 0)
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "arena_alloc: zero bytes requested");
    if (nbytes > dev->max_alloc_bytes)
        return ocl_fail(dev, MMRT_ERR_OUT_OF_POOL,
                        "arena_alloc: %" PRIu64 " bytes exceeds the device's largest single "
                        "allocation of %" PRIu64 " bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                        nbytes, dev->max_alloc_bytes);
    /* Grow the table first, so nothing can fail after the buffer exists. */
    if (dev->n_arenas == dev->cap_arenas) {
        size_t cap = dev->cap_arenas ? dev->cap_arenas * 2 : 8;
        struct ocl_arena *grown = realloc(dev->arenas, cap * sizeof *grown);
        if (!grown)
            return ocl_fail(dev, MMRT_ERR_NO_MEMORY, "arena_alloc: out of host memory");
        dev->arenas = grown;
        dev->cap_arenas = cap;
    }
    char where[96];
    snprintf(where, sizeof where, "arena_alloc(%" PRIu64 " bytes)", nbytes);
    cl_int rc;
    cl_mem mem = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, (size_t)nbytes, NULL, &rc);
    if (rc != CL_SUCCESS)
        return ocl_fail_cl(dev, rc, true, where, "clCreateBuffer");
    /* OpenCL allocates on first use, so a buffer that does not fit would only fail at some
     * later kernel. Writing its last byte makes the driver back the whole buffer now, and
     * the blocking write returns that failure here, where it is an ordinary
     * MMRT_ERR_OUT_OF_POOL. (On PoCL the backing is host memory under Linux overcommit, so
     * there the real limit is CL_DEVICE_MAX_MEM_ALLOC_SIZE, checked above.) */
    const unsigned char zero = 0;
    rc = clEnqueueWriteBuffer(dev->queue, mem, CL_TRUE, (size_t)(nbytes - 1), 1, &zero, 0, NULL,
                              NULL);
    if (rc != CL_SUCCESS) {
        clReleaseMemObject(mem);
        return ocl_fail_cl(dev, rc, true, where, "first write");
    }
    dev->arenas[dev->n_arenas++] = (struct ocl_arena){mem, nbytes};
    *arena = mem;
    return MMRT_OK;
}

static void ocl_arena_free(struct mmrt_device *dev, void *arena)
{
    if (!dev || !arena)
        return;
    struct ocl_arena *a = ocl_find(dev, arena);
    if (!a) {
        ocl_log(MMRT_LOG_ERROR, "arena_free: %p is not an arena of device %s", arena,
                dev->name);
        return;
    }
    /* Releasing never cancels queued work: OpenCL frees the buffer once the commands that
     * use it have finished, which is the ABI's "waits for work that uses it". */
    clReleaseMemObject(a->mem);
    *a = dev->arenas[--dev->n_arenas];
}

/* Resolves (arena, offset, nbytes) to its cl_mem after checking the range lies inside. */
static mmrt_status ocl_range(struct mmrt_device *dev, const char *what, void *arena,
                             uint64_t offset, uint64_t nbytes, cl_mem *mem)
{
    struct ocl_arena *a = arena ? ocl_find(dev, arena) : NULL;
    if (!a)
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "%s: %p is not an arena of this device",
                        what, arena);
    if (offset > a->nbytes || nbytes > a->nbytes - offset)
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG,
                        "%s: %" PRIu64 " bytes at offset %" PRIu64
                        " overrun the arena of %" PRIu64 " bytes",
                        what, nbytes, offset, a->nbytes);
    *mem = a->mem;
    return MMRT_OK;
}

static mmrt_status ocl_upload(struct mmrt_device *dev, void *arena, uint64_t offset,
                              const void *src, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    cl_mem mem = NULL;
    mmrt_status st = ocl_range(dev, "upload", arena, offset, nbytes, &mem);
    if (st != MMRT_OK || nbytes == 0)
        return st;
    if (!src)
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "upload: NULL source");
    /* Blocking, so `src` is free the moment we return. A later issue may stage through a
     * pinned buffer to let uploads overlap kernels. */
    cl_int rc = clEnqueueWriteBuffer(dev->queue, mem, CL_TRUE, (size_t)offset, (size_t)nbytes,
                                     src, 0, NULL, NULL);
    return rc == CL_SUCCESS ? MMRT_OK
                            : ocl_fail_cl(dev, rc, false, "upload", "clEnqueueWriteBuffer");
}

static mmrt_status ocl_download(struct mmrt_device *dev, void *dst, void *arena,
                                uint64_t offset, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    cl_mem mem = NULL;
    mmrt_status st = ocl_range(dev, "download", arena, offset, nbytes, &mem);
    if (st != MMRT_OK || nbytes == 0)
        return st;
    if (!dst)
        return ocl_fail(dev, MMRT_ERR_INVALID_ARG, "download: NULL destination");
    /* An error a kernel found is reported here, before any data is written to dst. */
    if ((st = ocl_check_async(dev)) != MMRT_OK)
        return st;
    /* Blocking on an in-order queue: returns after everything issued before it. */
    cl_int rc = clEnqueueReadBuffer(dev->queue, mem, CL_TRUE, (size_t)offset, (size_t)nbytes,
                                    dst, 0, NULL, NULL);
    return rc == CL_SUCCESS ? MMRT_OK
                            : ocl_fail_cl(dev, rc, false, "download", "clEnqueueReadBuffer");
}

/* memmove inside one buffer: clEnqueueCopyBuffer refuses overlapping ranges. */
static mmrt_status ocl_move(struct mmrt_device *dev, cl_mem mem, uint64_t dst_offset,
                            uint64_t src_offset, uint64_t nbytes)
{
    uint64_t dist = dst_offset > src_offset ? dst_offset - src_offset : src_offset - dst_offset;
    cl_int rc = CL_SUCCESS;
    if ((nbytes + dist - 1) / dist <= OCL_MAX_MOVE_PIECES) {
        /* A piece no longer than the distance cannot overlap itself, and walking away from
         * the destination side (forward when moving down, backward when moving up) only
         * overwrites bytes an earlier piece has already read. The queue is in order. */
        for (uint64_t done = 0; done < nbytes && rc == CL_SUCCESS;) {
            uint64_t piece = nbytes - done < dist ? nbytes - done : dist;
            uint64_t at = dst_offset < src_offset ? done : nbytes - done - piece;
            rc = clEnqueueCopyBuffer(dev->queue, mem, mem, (size_t)(src_offset + at),
                                     (size_t)(dst_offset + at), (size_t)piece, 0, NULL, NULL);
            done += piece;
        }
        return rc == CL_SUCCESS ? MMRT_OK
                                : ocl_fail_cl(dev, rc, false, "copy", "clEnqueueCopyBuffer");
    }
    /* Short distance: bounce through a scratch buffer. Releasing it right away is safe,
     * OpenCL keeps it until the queued copies that use it have finished. */
    cl_mem tmp = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, (size_t)nbytes, NULL, &rc);
    if (rc != CL_SUCCESS)
        return ocl_fail_cl(dev, rc, true, "copy (scratch buffer for an overlapping move)",
                           "clCreateBuffer");
    rc = clEnqueueCopyBuffer(dev->queue, mem, tmp, (size_t)src_offset, 0, (size_t)nbytes, 0,
                             NULL, NULL);
    if (rc == CL_SUCCESS)
        rc = clEnqueueCopyBuffer(dev->queue, tmp, mem, 0, (size_t)dst_offset, (size_t)nbytes,
                                 0, NULL, NULL);
    clReleaseMemObject(tmp);
    return rc == CL_SUCCESS ? MMRT_OK : ocl_fail_cl(dev, rc, true, "copy", "clEnqueueCopyBuffer");
}

static mmrt_status ocl_copy(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                            void *src_arena, uint64_t src_offset, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    cl_mem dst = NULL, src = NULL;
    mmrt_status st = ocl_range(dev, "copy (destination)", dst_arena, dst_offset, nbytes, &dst);
    if (st == MMRT_OK)
        st = ocl_range(dev, "copy (source)", src_arena, src_offset, nbytes, &src);
    if (st != MMRT_OK || nbytes == 0)
        return st;
    if (dst == src) {
        if (dst_offset == src_offset)
            return MMRT_OK;
        uint64_t dist =
            dst_offset > src_offset ? dst_offset - src_offset : src_offset - dst_offset;
        if (dist < nbytes)
            return ocl_move(dev, dst, dst_offset, src_offset, nbytes);
    }
    cl_int rc = clEnqueueCopyBuffer(dev->queue, src, dst, (size_t)src_offset,
                                    (size_t)dst_offset, (size_t)nbytes, 0, NULL, NULL);
    return rc == CL_SUCCESS ? MMRT_OK : ocl_fail_cl(dev, rc, false, "copy", "clEnqueueCopyBuffer");
}

static mmrt_status ocl_synchronize(struct mmrt_device *dev)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    cl_int rc = clFinish(dev->queue);
    if (rc != CL_SUCCESS)
        return ocl_fail_cl(dev, rc, false, "synchronize", "clFinish");
    return ocl_check_async(dev);
}

static const char *ocl_last_error(struct mmrt_device *dev)
{
    return dev ? dev->err : "";
}

static const char *const ocl_option_keys[] = {"platform", NULL};

static const mmrt_kernel_fn ocl_ops[MMRT_OP_COUNT] = {
    [MMRT_OP_MATMUL] = ocl_op_matmul,
    [MMRT_OP_ADD] = ocl_op_add,
    [MMRT_OP_MUL] = ocl_op_mul,
    [MMRT_OP_SCALE] = ocl_op_scale,
    [MMRT_OP_LAYERNORM] = ocl_op_layernorm,
    [MMRT_OP_RMSNORM] = ocl_op_rmsnorm,
    [MMRT_OP_GELU] = ocl_op_gelu,
    [MMRT_OP_GELU_TANH] = ocl_op_gelu_tanh,
    [MMRT_OP_QUICK_GELU] = ocl_op_quick_gelu,
    [MMRT_OP_SILU] = ocl_op_silu,
    [MMRT_OP_SWIGLU] = ocl_op_swiglu,
    [MMRT_OP_RELU2] = ocl_op_relu2,
    [MMRT_OP_SOFTMAX] = ocl_op_softmax,
    [MMRT_OP_ROPE] = ocl_op_rope,
    [MMRT_OP_ATTENTION] = ocl_op_attention,
    [MMRT_OP_GET_ROWS] = ocl_op_get_rows,
    [MMRT_OP_PATCH_EMBED] = ocl_op_patch_embed,
    [MMRT_OP_CONCAT] = ocl_op_concat,
    [MMRT_OP_COPY] = ocl_op_copy,
    [MMRT_OP_ARGMAX] = ocl_op_argmax,
    [MMRT_OP_ROPE_MULTI] = ocl_op_rope_multi,
    [MMRT_OP_SET_ROWS] = ocl_op_set_rows,
    [MMRT_OP_ATTENTION_PAGED] = ocl_op_attention_paged,
    [MMRT_OP_GATHER_HEADS] = ocl_op_gather_heads,
    [MMRT_OP_L2_NORM] = ocl_op_l2_norm,
};

static const struct mmrt_plugin ocl_plugin = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_plugin),
    .name = OCL_NAME,
    .version = MMRT_PLUGIN_VERSION,
    .probe = ocl_probe,
    .device_open = ocl_device_open,
    .device_close = ocl_device_close,
    .device_info = ocl_device_info,
    .arena_alloc = ocl_arena_alloc,
    .arena_free = ocl_arena_free,
    .upload = ocl_upload,
    .download = ocl_download,
    .copy = ocl_copy,
    .synchronize = ocl_synchronize,
    .last_error = ocl_last_error,
    .ops = ocl_ops,
    .n_ops = MMRT_OP_COUNT,
    .option_keys = ocl_option_keys,
    .shutdown = NULL,
    .prepare = ocl_program_prepare,
};

MMRT_PLUGIN_EXPORT const struct mmrt_plugin *mmrt_plugin_init(const struct mmrt_host *host)
{
    return mmrt_plugin_adopt_host(host, &ocl_host, OCL_NAME) ? &ocl_plugin : NULL;
}
