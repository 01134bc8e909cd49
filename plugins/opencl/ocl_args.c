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

mmrt_status ocl_bad(struct ocl_op *o, mmrt_status st, const char *fmt, ...)
{
    char what[OCL_ERR_MAX - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ocl_fail(o->dev, st, "%s: %s", o->name, what);
}

/* The descriptor's arena, found once for both the check and the view. */
struct arena_lookup {
    struct mmrt_device *dev;
    struct ocl_arena *found;
};

static bool arena_bytes(void *ctx, const void *buffer, uint64_t *nbytes)
{
    struct arena_lookup *l = ctx;
    l->found = ocl_find(l->dev, buffer);
    if (l->found)
        *nbytes = l->found->nbytes;
    return l->found != NULL;
}

static mmrt_status resolve(struct ocl_op *o, const char *what, const struct mmrt_tensor *t,
                           struct ocl_view *v, struct mmrt_pv_shape *shape)
{
    struct mmrt_pv_shape sh;
    char why[512];
    struct arena_lookup l = { o->dev, NULL };
    if (mmrt_pv_check(what, t, arena_bytes, &l, &sh, why, sizeof why) != MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    const struct ocl_arena *a = l.found;
    memset(v, 0, sizeof *v);
    v->dtype = sh.dtype;
    v->n_dims = sh.n_dims;
    memcpy(v->ne, sh.ne, sizeof v->ne);
    memcpy(v->nb, sh.nb, sizeof v->nb);
    v->numel = sh.numel;
    v->span = sh.span;
    v->mem = a->mem;
    v->offset = t->offset;
    *shape = sh;
    return MMRT_OK;
}

mmrt_status ocl_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                         int n_required, int n_max, struct ocl_op *o)
{
    memset(o, 0, sizeof *o);
    o->dev = dev;
    o->name = mmrt_op_name_of(op);
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!args)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "no arguments");
    struct mmrt_op_args a;
    memset(&a, 0, sizeof a);
    if (args->hdr.abi_major != MMRT_ABI_MAJOR || args->hdr.struct_size < sizeof a)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "op_args has ABI %u (%u bytes), expected %d "
                       "(≥ %zu bytes)", args->hdr.abi_major, args->hdr.struct_size,
                       MMRT_ABI_MAJOR, sizeof a);
    memcpy(&a, args, sizeof a);
    if (a.op != op)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "launched as op %d (%s)", (int)a.op,
                       mmrt_op_name_of(a.op));
    if (a.n_src < n_required || a.n_src > n_max)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "n_src is %d, expected %d…%d", (int)a.n_src,
                       n_required, n_max);
    o->n_src = a.n_src;
    struct mmrt_pv_shape shapes[MMRT_MAX_SRC], dshape;
    const struct mmrt_pv_shape *s[MMRT_MAX_SRC] = { 0 };
    for (int i = 0; i < a.n_src; i++) {
        char what[16];
        snprintf(what, sizeof what, "src%d", i);
        if (!a.src[i]) {
            if (i < n_required)
                return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s is required but NULL", what);
            continue;
        }
        mmrt_status st = resolve(o, what, a.src[i], &o->src[i], &shapes[i]);
        if (st != MMRT_OK)
            return st;
        s[i] = &shapes[i];
    }
    if (!a.dst)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "dst is NULL");
    mmrt_status st = resolve(o, "dst", a.dst, &o->dst, &dshape);
    if (st != MMRT_OK)
        return st;
    if (!mmrt_pv_injective(o->dst.dtype, o->dst.n_dims, o->dst.ne, o->dst.nb))
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "dst: its strides make elements overlap");
    o->params = a.params;
    o->params_size = a.params_size;
    /* plugin.h's contract, in op_contract.h's one copy: what the op functions may assume. */
    char why[OCL_ERR_MAX - 64];
    if (mmrt_op_check(op, a.n_src, s, &dshape, a.params, a.params_size, why, sizeof why) !=
        MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
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

bool ocl_same_shape(const struct ocl_view *a, const struct ocl_view *b)
{
    if (a->n_dims != b->n_dims)
        return false;
    for (int i = 0; i < a->n_dims; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

bool ocl_same_view(const struct ocl_view *a, const struct ocl_view *b)
{
    return a->mem == b->mem && a->offset == b->offset && a->dtype == b->dtype &&
           ocl_same_shape(a, b) &&
           memcmp(a->nb, b->nb, sizeof(int64_t) * (size_t)a->n_dims) == 0;
}
