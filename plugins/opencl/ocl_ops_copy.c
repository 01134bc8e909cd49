/*
 * plugins/opencl/ocl_ops_copy.c — host side of COPY, CONCAT, GET_ROWS and SET_ROWS
 * (kernels/copy.cl), and of GATHER_HEADS (kernels/rows.cl).
 *
 * COPY and CONCAT are one strided element copy (k_copy): the views are padded to 4-D with
 * leading extents of 1 and passed with byte strides. CONCAT copies each source into its slice
 * of dst: src1 starts src0's extent along the axis further in.
 *
 * GET_ROWS reads its ids from device memory, so the range check runs on the device
 * (k_get_rows_check) and an id outside [0, V) is reported by the next synchronize() or
 * download(); dst is then left untouched (see ocl_internal.h).
 *
 * SET_ROWS also reads its indices from device memory, but plugin.h makes an index outside
 * [0, R) a no-op rather than an error (a captured decode step cannot report one), so it is
 * one launch with nothing to check on the device. Into an I8 store (ABI 1.7) it is another
 * kernel, one work-group per innermost row, since a row's codes depend on its largest
 * element (k_set_rows_i8).
 *
 * GATHER_HEADS skips entries outside [0, R) the same way. Its result must be the bits
 * plugin.h fixes, which takes a correctly rounded division (fp64, or f32 division built with
 * -cl-fp32-correctly-rounded-divide-sqrt) and f32 arithmetic that keeps subnormals; a device
 * without them refuses the op with MMRT_ERR_UNSUPPORTED rather than give other bits. So does
 * SET_ROWS into I8, whose scales and codes plugin.h fixes the same way.
 */
#include <inttypes.h>
#include <string.h>

#include "ocl_internal.h"

/* Copies the view `src` into the view `dst` of the same extents (any strides; F32, F16 and
 * BF16 to any of them, I32 to I32, as op_contract.h allows); dst gets its own byte offset so
 * CONCAT can aim at a slice. */
static mmrt_status strided_copy(struct ocl_op *o, const struct ocl_view *src,
                                const struct ocl_view *dst, uint64_t dst_offset)
{
    if (src->numel == 0)
        return MMRT_OK;
    if (src->mem == dst->mem && src->offset == dst_offset && src->dtype == dst->dtype &&
        memcmp(src->nb, dst->nb, sizeof(int64_t) * (size_t)src->n_dims) == 0)
        return MMRT_OK; /* a copy of a view onto itself */
    int64_t ne[4], snb[4], dnb[4];
    int pad = MMRT_MAX_DIMS - src->n_dims;
    for (int i = 0; i < 4; i++) {
        bool real = i >= pad;
        ne[i] = real ? src->ne[i - pad] : 1;
        snb[i] = real ? src->nb[i - pad] : 0;
        dnb[i] = real ? dst->nb[i - pad] : 0;
    }
    struct ocl_call c;
    mmrt_status st = ocl_call_begin(&c, o->dev, o->name, OCL_K_COPY);
    if (st != MMRT_OK)
        return st;
    ocl_arg_view(&c, src);
    for (int i = 0; i < 4; i++)
        ocl_arg_long(&c, snb[i]);
    ocl_arg_mem(&c, dst->mem);
    ocl_arg_long(&c, (int64_t)dst_offset);
    for (int i = 0; i < 4; i++)
        ocl_arg_long(&c, dnb[i]);
    ocl_arg_long(&c, ne[1]);
    ocl_arg_long(&c, ne[2]);
    ocl_arg_long(&c, ne[3]);
    ocl_arg_long(&c, src->numel);
    ocl_arg_int(&c, src->dtype);
    ocl_arg_int(&c, dst->dtype);
    size_t global = (size_t)src->numel, local = OCL_WG_1D;
    return ocl_call_run(&c, 1, &global, &local, false);
}

mmrt_status ocl_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_COPY, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    /* Same-size dtypes may convert in place (F16 ↔ BF16, op_contract.h): each work-item reads
     * its element, then writes it. */
    return strided_copy(&o, &o.src[0], &o.dst, o.dst.offset);
}

mmrt_status ocl_op_concat(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_concat_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_CONCAT, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *a = &o.src[0], *b = &o.src[1], *d = &o.dst;
    if ((st = ocl_op_params(&o, &p, sizeof p)))
        return st;
    struct ocl_view part = *d;
    part.ne[p.axis] = a->ne[p.axis];
    if ((st = strided_copy(&o, a, &part, d->offset)))
        return st;
    part.ne[p.axis] = b->ne[p.axis];
    return strided_copy(&o, b, &part, d->offset + (uint64_t)(a->ne[p.axis] * d->nb[p.axis]));
}

mmrt_status ocl_op_get_rows(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_GET_ROWS, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *tab = &o.src[0], *ids = &o.src[1], *y = &o.dst;
    int64_t V = tab->ne[0], n = tab->ne[1], T = ids->numel;
    if (T > INT32_MAX)
        return ocl_bad(&o, MMRT_ERR_UNSUPPORTED, "%" PRId64 " ids exceed the kernels' I32 rows",
                       T);
    if (T == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_GET_ROWS_CHECK)))
        return st;
    ocl_arg_view(&c, ids);
    ocl_arg_int(&c, (int32_t)T);
    ocl_arg_long(&c, V);
    ocl_arg_mem(&c, dev->err_mem);
    size_t one_group = OCL_WG_1D;
    if ((st = ocl_call_run(&c, 1, &one_group, &one_group, true)))
        return st;
    if (n == 0)
        return MMRT_OK;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_GET_ROWS)))
        return st;
    ocl_arg_view(&c, tab);
    ocl_arg_int(&c, tab->dtype);
    ocl_arg_view(&c, ids);
    ocl_arg_view(&c, y);
    ocl_arg_long(&c, n);
    ocl_arg_mem(&c, dev->err_mem);
    size_t local[2] = {OCL_WG_1D, 1}, global[2] = {(size_t)n, (size_t)T};
    return ocl_call_run(&c, 2, global, local, false);
}

/* The exact f32 arithmetic plugin.h fixes for GATHER_HEADS and an I8 store: correctly
 * rounded division and subnormals kept. */
static mmrt_status need_exact_f32(struct ocl_op *o, const char *what)
{
    struct mmrt_device *dev = o->dev;
    if (!dev->fp32_denorm || (!dev->fp64 && !dev->fp32_div_sqrt))
        return ocl_bad(o, MMRT_ERR_UNSUPPORTED, "%s %s, so %s could not be the exact f32 "
                       "results plugin.h requires", dev->name,
                       !dev->fp32_denorm ? "flushes f32 subnormals"
                                         : "has neither fp64 nor correctly rounded f32 division",
                       what);
    return MMRT_OK;
}

mmrt_status ocl_op_set_rows(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_SET_ROWS, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *val = &o.src[0], *idx = &o.src[1], *y = &o.dst;
    int64_t T = val->ne[0], R = y->ne[0];
    if (T > INT32_MAX)
        return ocl_bad(&o, MMRT_ERR_UNSUPPORTED, "%" PRId64 " rows exceed the kernel's I32", T);
    bool i8 = y->dtype == MMRT_DTYPE_I8; /* then src2 holds the scales (op_contract.h) */
    if (i8 && (st = need_exact_f32(&o, "the I8 scales and codes")))
        return st;
    int64_t n = 1; /* elements per row; cannot overflow, numel did not */
    for (int i = 1; i < val->n_dims; i++)
        n *= val->ne[i];
    if (T == 0 || n == 0 || R == 0)
        return MMRT_OK;
    struct ocl_call c;
    if (i8) {
        /* An I8 dst has rank ≥ 2, so its rows are nh innermost rows of D > 0 (n > 0). */
        int64_t D = ocl_inner(y), nh = n / D;
        if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_SET_ROWS_I8)))
            return st;
        ocl_arg_view(&c, val);
        ocl_arg_view(&c, idx);
        ocl_arg_view(&c, y);
        ocl_arg_view(&c, &o.src[2]);
        ocl_arg_long(&c, D);
        ocl_arg_long(&c, nh);
        ocl_arg_int(&c, (int32_t)T);
        ocl_arg_long(&c, R);
        size_t local[2] = {OCL_WG_ROW, 1}, global[2] = {(size_t)nh * OCL_WG_ROW, (size_t)T};
        return ocl_call_run(&c, 2, global, local, false);
    }
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_SET_ROWS)))
        return st;
    ocl_arg_view(&c, val);
    ocl_arg_view(&c, idx);
    ocl_arg_view(&c, y);
    ocl_arg_int(&c, y->dtype);
    ocl_arg_long(&c, n);
    ocl_arg_int(&c, (int32_t)T);
    ocl_arg_long(&c, R);
    size_t local[2] = {OCL_WG_1D, 1}, global[2] = {(size_t)n, (size_t)T};
    return ocl_call_run(&c, 2, global, local, false);
}

mmrt_status ocl_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_GATHER_HEADS, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *tab = &o.src[0], *idx = &o.src[1], *y = &o.dst;
    const int64_t R = tab->ne[0], H = tab->ne[1], D = tab->ne[2], N = idx->ne[0], G = idx->ne[2];
    if ((st = need_exact_f32(&o, "the averages")))
        return st;
    if (N == 0 || H == 0 || D == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_GATHER_HEADS)))
        return st;
    ocl_arg_view(&c, tab);
    ocl_arg_int(&c, tab->dtype);
    ocl_arg_view(&c, &o.src[2]); /* an I8 table's scales; absent otherwise, never read */
    ocl_arg_view(&c, idx);
    ocl_arg_view(&c, y);
    ocl_arg_long(&c, R);
    ocl_arg_long(&c, H);
    ocl_arg_long(&c, D);
    ocl_arg_long(&c, G);
    size_t local[2] = {OCL_WG_1D, 1}, global[2] = {(size_t)D, (size_t)(N * H)};
    return ocl_call_run(&c, 2, global, local, false);
}
