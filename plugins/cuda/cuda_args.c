/*
 * plugins/cuda/cuda_args.c — turning a launch's mmrt_op_args into checked views, for the CUDA
 * plugin's ops. The core checks a launch before calling the plugin, but the plugin is also
 * driven directly (mmrt-plugin-check, tests, vendors' harnesses), so every launch is checked
 * again here, as the CPU plugin does (plugins/cpu/cpu_args.c): after cu_op_begin, each present
 * tensor names one of this device's arenas, every byte it can address (offset + Σ (ne−1)·nb +
 * element size) lies inside that arena, strides and offset are non-negative multiples of the
 * element size, the element count did not overflow, dst's elements do not alias one another,
 * and the launch meets plugin.h's operator contract (ranks, dtypes, extents, contiguity,
 * aliasing, param values: op_contract.h, the core's own check). Kernels then trust their
 * arguments, so a bad launch is an error here and never a fault on the GPU.
 *
 * What the host cannot check — values in device memory (ids, cu_seqlens) — the kernels
 * report through the device error word (cuda_kernels.h).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"
#include "op_contract.h"

mmrt_status(cu_bad)(struct cu_op *o, mmrt_status st, const char *fmt, ...)
{
    char what[CU_ERR_MAX - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cu_fail(o->dev, st, "%s: %s", o->name, what);
}

mmrt_status cu_launch_failed(struct cu_op *o, cudaError_t e, const char *kernel)
{
    (void)cudaGetLastError(); /* clear a non-sticky launch error */
    return cu_fail(o->dev, MMRT_ERR_DEVICE, "%s: launching the %s kernel failed: %s (%s)",
                   o->name, kernel, cudaGetErrorName(e), cudaGetErrorString(e));
}

static const void *find_arena(void *ctx, const void *buffer, uint64_t *nbytes)
{
    const struct cu_arena *a = cu_find(ctx, buffer);
    if (a)
        *nbytes = a->nbytes;
    return a;
}

static void view_of(const struct mmrt_pv_shape *sh, const void *arena, struct cu_view *v)
{
    memset(v, 0, sizeof *v);
    v->dtype = sh->dtype;
    v->n_dims = sh->n_dims;
    memcpy(v->ne, sh->ne, sizeof v->ne);
    memcpy(v->nb, sh->nb, sizeof v->nb);
    v->numel = sh->numel;
    v->span = sh->span;
    v->data = (char *)((const struct cu_arena *)arena)->ptr + sh->offset;
}

mmrt_status cu_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                        int n_required, int n_max, struct cu_op *o)
{
    memset(o, 0, sizeof *o);
    o->dev = dev;
    o->name = mmrt_op_name_of(op);
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    struct mmrt_oc_launch l;
    char why[CU_ERR_MAX - 64];
    if (mmrt_op_begin(args, op, n_required, n_max, find_arena, dev, &l, why, sizeof why) !=
        MMRT_OK)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    o->n_src = l.n_src;
    for (int i = 0; i < l.n_src; i++)
        if (l.src[i])
            view_of(l.src[i], l.src_arena[i], &o->src[i]);
    view_of(&l.dst, l.dst_arena, &o->dst);
    o->params = l.params;
    o->params_size = l.params_size;
    return MMRT_OK;
}

mmrt_status cu_op_params(struct cu_op *o, void *out, size_t size)
{
    memset(out, 0, size);
    if (!o->params || o->params_size < size)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "params %s (%u bytes, need %zu)",
                      o->params ? "too short" : "missing", o->params_size, size);
    memcpy(out, o->params, size);
    return MMRT_OK;
}

bool cu_view_contig(const struct cu_view *v)
{
    int64_t stride = (int64_t)mmrt_dtype_size((enum mmrt_dtype)v->dtype);
    for (int i = v->n_dims - 1; i >= 0; i--) {
        if (v->ne[i] != 1 && v->nb[i] != stride)
            return false;
        stride *= v->ne[i];
    }
    return true;
}

