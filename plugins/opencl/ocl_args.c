/*
 * plugins/opencl/ocl_args.c — turning a launch's mmrt_op_args into checked views.
 *
 * The core validates every launch before it calls a kernel, but the plugin is also driven
 * directly (mmrt-plugin-check, tests), and a kernel that indexes past its buffer does not fail
 * cleanly on every driver, so every launch is checked again here. After ocl_op_begin a view
 * names one of this device's arenas, every byte it can address (offset + Σ (ne−1)·nb + element
 * size) lies inside that arena, strides and offset are non-negative multiples of the element
 * size, its element count did not overflow, and the launch meets plugin.h's operator contract
 * (ranks, dtypes, extents, contiguity, aliasing, param values: op_contract.h, the core's own
 * check, so the refusals read the same as the core's and the other plugins').
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ocl_internal.h"
#include "op_contract.h"

mmrt_status(ocl_bad)(struct ocl_op *o, mmrt_status st, const char *fmt, ...)
{
    char what[OCL_ERR_MAX - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ocl_fail(o->dev, st, "%s: %s", o->name, what);
}

static const void *find_arena(void *ctx, const void *buffer, uint64_t *nbytes)
{
    const struct ocl_arena *a = ocl_find(ctx, buffer);
    if (a)
        *nbytes = a->nbytes;
    return a;
}

static void view_of(const struct mmrt_pv_shape *sh, const void *arena, struct ocl_view *v)
{
    memset(v, 0, sizeof *v);
    v->dtype = sh->dtype;
    v->n_dims = sh->n_dims;
    memcpy(v->ne, sh->ne, sizeof v->ne);
    memcpy(v->nb, sh->nb, sizeof v->nb);
    v->numel = sh->numel;
    v->span = sh->span;
    v->mem = ((const struct ocl_arena *)arena)->mem;
    v->offset = sh->offset;
}

mmrt_status ocl_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                         int n_required, int n_max, struct ocl_op *o)
{
    memset(o, 0, sizeof *o);
    o->dev = dev;
    o->name = mmrt_op_name_of(op);
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    struct mmrt_oc_launch l;
    char why[OCL_ERR_MAX - 64];
    if (mmrt_op_begin(args, op, n_required, n_max, find_arena, dev, &l, why, sizeof why) !=
        MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    o->n_src = l.n_src;
    for (int i = 0; i < l.n_src; i++)
        if (l.src[i])
            view_of(l.src[i], l.src_arena[i], &o->src[i]);
    view_of(&l.dst, l.dst_arena, &o->dst);
    o->params = l.params;
    o->params_size = l.params_size;
    return MMRT_OK;
}

mmrt_status ocl_op_params(struct ocl_op *o, void *out, size_t size)
{
    memset(out, 0, size);
    if (!o->params || o->params_size < size)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "params %s (%u bytes, need %zu)",
                       o->params ? "too short" : "missing", o->params_size, size);
    memcpy(out, o->params, size);
    return MMRT_OK;
}

bool ocl_same_view(const struct ocl_view *a, const struct ocl_view *b)
{
    return a->mem == b->mem && a->offset == b->offset && a->dtype == b->dtype &&
           a->n_dims == b->n_dims &&
           memcmp(a->ne, b->ne, sizeof(int64_t) * (size_t)a->n_dims) == 0 &&
           memcmp(a->nb, b->nb, sizeof(int64_t) * (size_t)a->n_dims) == 0;
}
