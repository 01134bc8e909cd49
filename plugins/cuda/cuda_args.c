/*
 * plugins/cuda/cuda_args.c — turning a launch's mmrt_op_args into checked views, for the CUDA
 * plugin's ops. The contract is the CPU plugin's (plugins/cpu/cpu_args.c), since both are held
 * to the same plugin.h: after cu_op_begin, each present tensor names one of this device's
 * arenas, every byte it can address (offset + Σ (ne−1)·nb + element size) lies inside that
 * arena, strides and offset are non-negative multiples of the element size, the element count
 * did not overflow, and dst's elements do not alias one another. Kernels then trust their
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

mmrt_status cu_bad(struct cu_op *o, mmrt_status st, const char *fmt, ...)
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

static const char *shape_str(const struct cu_view *v, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < v->n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "", v->ne[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

static mmrt_status resolve(struct cu_op *o, const char *what, const struct mmrt_tensor *t,
                           struct cu_view *v)
{
    if (t->hdr.abi_major != MMRT_ABI_MAJOR || t->hdr.struct_size < sizeof *t)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: descriptor has ABI %u (%u bytes), expected "
                      "%d (≥ %zu bytes)", what, t->hdr.abi_major, t->hdr.struct_size,
                      MMRT_ABI_MAJOR, sizeof *t);
    size_t es = mmrt_dtype_size((enum mmrt_dtype)t->dtype);
    if (es == 0)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: unknown dtype %d", what, (int)t->dtype);
    if (t->n_dims < 1 || t->n_dims > MMRT_MAX_DIMS)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: n_dims %d is outside 1…%d", what,
                      (int)t->n_dims, MMRT_MAX_DIMS);
    struct cu_arena *a = t->buffer ? cu_find(o->dev, t->buffer) : NULL;
    if (!a)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: buffer %p is not an arena of this device",
                      what, t->buffer);
    if (t->offset % es != 0)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: offset %" PRIu64 " is not a multiple of the "
                      "%s element size %zu", what, t->offset, mmrt_dtype_name_of(t->dtype), es);
    memset(v, 0, sizeof *v);
    v->dtype = t->dtype;
    v->n_dims = t->n_dims;
    int64_t numel = 1, nonzero = 1; /* nonzero: product of the non-zero extents, so partial
                                        products (rows, …) are known not to overflow */
    uint64_t last = 0;
    for (int i = 0; i < t->n_dims; i++) {
        v->ne[i] = t->ne[i];
        v->nb[i] = t->nb[i];
        if (t->ne[i] < 0 || t->nb[i] < 0 || t->nb[i] % (int64_t)es != 0)
            return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: dim %d has extent %" PRId64 " and stride "
                          "%" PRId64 " (need extent ≥ 0 and a stride that is a non-negative "
                          "multiple of %zu)", what, i, t->ne[i], t->nb[i], es);
        if (__builtin_mul_overflow(numel, t->ne[i], &numel) ||
            __builtin_mul_overflow(nonzero, t->ne[i] ? t->ne[i] : 1, &nonzero))
            goto too_big;
    }
    for (int i = 0; numel > 0 && i < t->n_dims; i++) {
        uint64_t step;
        if (__builtin_mul_overflow((uint64_t)(t->ne[i] - 1), (uint64_t)t->nb[i], &step) ||
            __builtin_add_overflow(last, step, &last))
            goto too_big;
    }
    v->numel = numel;
    if (numel > 0 && __builtin_add_overflow(last, (uint64_t)es, &v->span))
        goto too_big;
    if (t->offset > a->nbytes || v->span > a->nbytes - t->offset)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64
                      ") lie outside its arena of %" PRIu64 " bytes", what, t->offset, t->offset,
                      v->span, a->nbytes);
    v->data = (char *)a->ptr + t->offset;
    return MMRT_OK;

too_big:
    return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: extents and strides overflow 64 bits", what);
}

/* No two index tuples address one element: sorted by stride, each dim steps over everything
 * the finer dims span (sufficient, and exact for contiguous, permuted and sliced views). */
static bool view_injective(const struct cu_view *v)
{
    int idx[MMRT_MAX_DIMS], n = 0;
    for (int i = 0; i < v->n_dims; i++)
        if (v->ne[i] > 1)
            idx[n++] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v->nb[idx[j]] < v->nb[idx[j - 1]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    int64_t covered = (int64_t)mmrt_dtype_size((enum mmrt_dtype)v->dtype);
    for (int i = 0; i < n; i++) {
        if (v->nb[idx[i]] < covered)
            return false;
        covered = v->nb[idx[i]] * (v->ne[idx[i]] - 1) + covered;
    }
    return true;
}

mmrt_status cu_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                        int n_required, int n_max, struct cu_op *o)
{
    memset(o, 0, sizeof *o);
    o->dev = dev;
    o->name = mmrt_op_name_of(op);
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!args)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "no arguments");
    struct mmrt_op_args a;
    memset(&a, 0, sizeof a);
    if (args->hdr.abi_major != MMRT_ABI_MAJOR || args->hdr.struct_size < sizeof a)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "op_args has ABI %u (%u bytes), expected %d "
                      "(≥ %zu bytes)", args->hdr.abi_major, args->hdr.struct_size,
                      MMRT_ABI_MAJOR, sizeof a);
    memcpy(&a, args, sizeof a);
    if (a.op != op)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "launched as op %d (%s)", (int)a.op,
                      mmrt_op_name_of(a.op));
    if (a.n_src < n_required || a.n_src > n_max)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "n_src is %d, expected %d…%d", (int)a.n_src,
                      n_required, n_max);
    o->n_src = a.n_src;
    for (int i = 0; i < a.n_src; i++) {
        char what[16];
        snprintf(what, sizeof what, "src%d", i);
        if (!a.src[i]) {
            if (i < n_required)
                return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s is required but NULL", what);
            continue;
        }
        mmrt_status st = resolve(o, what, a.src[i], &o->src[i]);
        if (st != MMRT_OK)
            return st;
    }
    if (!a.dst)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst is NULL");
    mmrt_status st = resolve(o, "dst", a.dst, &o->dst);
    if (st != MMRT_OK)
        return st;
    if (!view_injective(&o->dst))
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst: its strides make elements overlap");
    o->params = a.params;
    o->params_size = a.params_size;
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

mmrt_status cu_need_dtype(struct cu_op *o, const char *what, const struct cu_view *v,
                          unsigned mask)
{
    if (mask & (1u << v->dtype))
        return MMRT_OK;
    char want[64] = "";
    size_t used = 0;
    for (int d = 0; d < MMRT_DTYPE_COUNT; d++)
        if (mask & (1u << d))
            used += (size_t)snprintf(want + used, sizeof want - used, "%s%s", used ? "/" : "",
                                     mmrt_dtype_name_of(d));
    return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s has dtype %s, expected %s", what,
                  mmrt_dtype_name_of(v->dtype), want);
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

bool cu_same_shape(const struct cu_view *a, const struct cu_view *b)
{
    if (a->n_dims != b->n_dims)
        return false;
    for (int i = 0; i < a->n_dims; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

mmrt_status cu_need_contig(struct cu_op *o, const char *what, const struct cu_view *v)
{
    return cu_view_contig(v) ? MMRT_OK
                             : cu_bad(o, MMRT_ERR_INVALID_ARG, "%s must be contiguous", what);
}

mmrt_status cu_need_inner_contig(struct cu_op *o, const char *what, const struct cu_view *v)
{
    int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)v->dtype);
    if (cu_inner(v) <= 1 || v->nb[v->n_dims - 1] == es)
        return MMRT_OK;
    return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s: innermost dim must be contiguous (stride %" PRId64
                  ", element size %" PRId64 ")", what, v->nb[v->n_dims - 1], es);
}

mmrt_status cu_need_rank(struct cu_op *o, const char *what, const struct cu_view *v, int n_dims)
{
    if (v->n_dims == n_dims)
        return MMRT_OK;
    char s[96];
    return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s must have %d dims, got %s", what, n_dims,
                  shape_str(v, s, sizeof s));
}

mmrt_status cu_need_disjoint(struct cu_op *o, const char *what, const struct cu_view *src,
                             bool identical_ok)
{
    const struct cu_view *d = &o->dst;
    if (!src->data || src->span == 0 || d->span == 0)
        return MMRT_OK;
    uintptr_t s0 = (uintptr_t)src->data, s1 = s0 + src->span;
    uintptr_t d0 = (uintptr_t)d->data, d1 = d0 + d->span;
    if (s1 <= d0 || d1 <= s0)
        return MMRT_OK;
    if (identical_ok && s0 == d0 && src->dtype == d->dtype && cu_same_shape(src, d) &&
        memcmp(src->nb, d->nb, sizeof(int64_t) * (size_t)d->n_dims) == 0)
        return MMRT_OK;
    return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst overlaps %s%s", what,
                  identical_ok ? " (only dst == src exactly is allowed)" : "");
}
