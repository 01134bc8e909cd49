/*
 * plugins/opencl/ocl_ops_elementwise.c — host side of ADD, MUL, SCALE, the activations,
 * SWIGLU (kernels/elementwise.cl) and of LAYERNORM, RMSNORM, SOFTMAX, ARGMAX, L2_NORM
 * (kernels/rows.cl): one launch each — one work-item per element, or one work-group per row.
 * ocl_op_begin has held the launch to plugin.h's contract (op_contract.h), so the shapes,
 * dtypes and aliasing the kernels index by are already known to be valid.
 */
#include "ocl_internal.h"

/* ---- ADD, MUL ------------------------------------------------------------------------- */

static mmrt_status binary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, op, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *a = &o.src[0], *b = &o.src[1];
    /* b has a's shape or is one row broadcast over a's rows (op_contract.h): as many
     * elements means a one-to-one walk either way. */
    bool same = b->numel == a->numel;
    if (a->numel == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_BINARY)))
        return st;
    ocl_arg_view(&c, a);
    ocl_arg_view(&c, b);
    ocl_arg_int(&c, b->dtype);
    ocl_arg_long(&c, same ? a->numel : b->numel);
    ocl_arg_view(&c, &o.dst);
    ocl_arg_long(&c, a->numel);
    ocl_arg_int(&c, op == MMRT_OP_MUL);
    size_t global = (size_t)a->numel, local = OCL_WG_1D;
    return ocl_call_run(&c, 1, &global, &local, false);
}

mmrt_status ocl_op_add(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return binary(dev, args, MMRT_OP_ADD);
}

mmrt_status ocl_op_mul(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return binary(dev, args, MMRT_OP_MUL);
}

/* ---- SCALE, the activations, SWIGLU --------------------------------------------------- */

static mmrt_status unary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct ocl_op o;
    int n_src = op == MMRT_OP_SWIGLU ? 2 : 1;
    mmrt_status st = ocl_op_begin(dev, args, op, n_src, n_src, &o);
    if (st != MMRT_OK)
        return st;
    struct mmrt_scale_params p = {0};
    if (op == MMRT_OP_SCALE && (st = ocl_op_params(&o, &p, sizeof p)))
        return st;
    if (o.dst.numel == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_UNARY)))
        return st;
    ocl_arg_view(&c, &o.src[0]);
    ocl_arg_view(&c, &o.src[1]); /* SWIGLU's up projection; absent otherwise */
    ocl_arg_view(&c, &o.dst);
    ocl_arg_long(&c, o.dst.numel);
    ocl_arg_int(&c, op);
    ocl_arg_float(&c, p.scale);
    size_t global = (size_t)o.dst.numel, local = OCL_WG_1D;
    return ocl_call_run(&c, 1, &global, &local, false);
}

mmrt_status ocl_op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SCALE);
}

mmrt_status ocl_op_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_GELU);
}

mmrt_status ocl_op_gelu_tanh(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_GELU_TANH);
}

mmrt_status ocl_op_quick_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_QUICK_GELU);
}

mmrt_status ocl_op_silu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SILU);
}

mmrt_status ocl_op_swiglu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SWIGLU);
}

mmrt_status ocl_op_relu2(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_RELU2);
}

/* ---- row ops -------------------------------------------------------------------------- */

/* One work-group per row. */
static mmrt_status run_rows(struct ocl_call *c, int64_t rows)
{
    size_t local = OCL_WG_ROW, global = (size_t)rows * local;
    return ocl_call_run(c, 1, &global, &local, false);
}

static mmrt_status norm(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct ocl_op o;
    struct mmrt_norm_params p;
    bool rms = op == MMRT_OP_RMSNORM;
    mmrt_status st = ocl_op_begin(dev, args, op, 1, rms ? 2 : 3, &o);
    if (st != MMRT_OK)
        return st;
    int64_t n = ocl_inner(&o.src[0]);
    const struct ocl_view *w = &o.src[1], *b = &o.src[2];
    if ((st = ocl_op_params(&o, &p, sizeof p)))
        return st;
    if (n == 0 || o.dst.numel == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, rms ? OCL_K_RMSNORM : OCL_K_LAYERNORM)))
        return st;
    ocl_arg_view(&c, &o.src[0]);
    ocl_arg_view(&c, &o.dst);
    ocl_arg_view(&c, w);
    ocl_arg_int(&c, w->dtype);
    ocl_arg_int(&c, w->mem != NULL);
    if (!rms) {
        ocl_arg_view(&c, b);
        ocl_arg_int(&c, b->dtype);
        ocl_arg_int(&c, b->mem != NULL);
    }
    ocl_arg_long(&c, n);
    ocl_arg_float(&c, p.eps);
    return run_rows(&c, ocl_rows(&o.src[0]));
}

mmrt_status ocl_op_layernorm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return norm(dev, args, MMRT_OP_LAYERNORM);
}

mmrt_status ocl_op_rmsnorm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return norm(dev, args, MMRT_OP_RMSNORM);
}

mmrt_status ocl_op_softmax(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_scale_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_SOFTMAX, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = ocl_op_params(&o, &p, sizeof p)))
        return st;
    int64_t n = ocl_inner(&o.src[0]);
    if (n == 0 || o.dst.numel == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_SOFTMAX)))
        return st;
    ocl_arg_view(&c, &o.src[0]);
    ocl_arg_view(&c, &o.dst);
    ocl_arg_long(&c, n);
    ocl_arg_float(&c, p.scale);
    return run_rows(&c, ocl_rows(&o.src[0]));
}

mmrt_status ocl_op_argmax(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ARGMAX, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *x = &o.src[0], *y = &o.dst;
    int64_t rows = ocl_rows(x), n = ocl_inner(x);
    if (rows == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ARGMAX)))
        return st;
    ocl_arg_view(&c, x);
    ocl_arg_view(&c, y);
    ocl_arg_long(&c, n);
    return run_rows(&c, rows);
}

mmrt_status ocl_op_l2_norm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_L2_NORM, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *x = &o.src[0], *y = &o.dst;
    int64_t rows = ocl_rows(x), n = ocl_inner(x);
    if (rows == 0)
        return MMRT_OK;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_L2_NORM)))
        return st;
    ocl_arg_view(&c, x);
    ocl_arg_view(&c, y);
    ocl_arg_long(&c, n); /* n = 0 still launches: those rows get 0 */
    return run_rows(&c, rows);
}
