/*
 * plugins/cuda/cuda_ops.c — host side of every op but MATMUL and PATCH_EMBED: check the launch
 * exactly as the CPU reference does (same contract, same refusals), then enqueue the kernel of
 * cuda_kernels.cu / cuda_attention.cu on the device's stream. Nothing here waits for the GPU.
 *
 * Values in device memory cannot be checked before the launch without a round trip that
 * would also break graph capture, so two checks move onto the GPU: GET_ROWS ids and ATTENTION
 * cu_seqlens. Their violations reach the caller as MMRT_ERR_INVALID_ARG from the next
 * synchronize() or download(), with the offending value in last_error (see cuda_plugin.c).
 * SET_ROWS and GATHER_HEADS need no such check: plugin.h makes an index outside [0, R) a
 * no-op for one and padding for the other.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "cuda_internal.h"
#include "plugin_views.h"

/* ---- elementwise ---------------------------------------------------------------------- */

static mmrt_status check_dst_f32(struct cu_op *o)
{
    mmrt_status st = cu_need_dtype(o, "dst", &o->dst, CU_DT_F32);
    return st ? st : cu_need_contig(o, "dst", &o->dst);
}

/* dst and s of one shape, contiguous F32; identical views allowed. */
static mmrt_status check_same_f32(struct cu_op *o, const char *what, const struct cu_view *s)
{
    mmrt_status st;
    if ((st = cu_need_dtype(o, what, s, CU_DT_F32)) || (st = cu_need_contig(o, what, s)))
        return st;
    if (!cu_same_shape(s, &o->dst))
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst and %s must have the same shape", what);
    return cu_need_disjoint(o, what, s, true);
}

static mmrt_status binary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, op, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *a = &o.src[0], *b = &o.src[1];
    if ((st = check_dst_f32(&o)) || (st = check_same_f32(&o, "src0", a)) ||
        (st = cu_need_dtype(&o, "src1", b, CU_DT_WEIGHT)) || (st = cu_need_contig(&o, "src1", b)))
        return st;
    bool same = cu_same_shape(a, b);
    bool row = !same && b->numel == cu_inner(a) && cu_inner(b) == cu_inner(a);
    if (!same && !row)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (%" PRId64 " elements, inner %" PRId64
                      ") must have src0's shape or be one row of its inner size %" PRId64,
                      b->numel, cu_inner(b), cu_inner(a));
    if ((st = cu_need_disjoint(&o, "src1", b, same)))
        return st;
    cudaError_t e = cu_launch_binary((float *)o.dst.data, (const float *)a->data, b->data,
                                     b->dtype, a->numel, same ? a->numel : b->numel,
                                     op == MMRT_OP_MUL, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "binary");
}

mmrt_status cu_op_add(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return binary(dev, args, MMRT_OP_ADD);
}

mmrt_status cu_op_mul(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return binary(dev, args, MMRT_OP_MUL);
}

static mmrt_status unary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cu_op o;
    int n_src = op == MMRT_OP_SWIGLU ? 2 : 1;
    mmrt_status st = cu_op_begin(dev, args, op, n_src, n_src, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = check_dst_f32(&o)) || (st = check_same_f32(&o, "src0", &o.src[0])))
        return st;
    if (op == MMRT_OP_SWIGLU && (st = check_same_f32(&o, "src1", &o.src[1])))
        return st;
    float scale = 0.0f;
    if (op == MMRT_OP_SCALE) {
        struct mmrt_scale_params p;
        if ((st = cu_op_params(&o, &p, sizeof p)))
            return st;
        scale = p.scale;
    }
    cudaError_t e = cu_launch_unary(op, (float *)o.dst.data, (const float *)o.src[0].data,
                                    (const float *)o.src[1].data, o.dst.numel, scale, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "unary");
}

mmrt_status cu_op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SCALE);
}
mmrt_status cu_op_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_GELU);
}
mmrt_status cu_op_gelu_tanh(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_GELU_TANH);
}
mmrt_status cu_op_quick_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_QUICK_GELU);
}
mmrt_status cu_op_silu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SILU);
}
mmrt_status cu_op_swiglu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SWIGLU);
}
mmrt_status cu_op_relu2(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_RELU2);
}

/* ---- row ops -------------------------------------------------------------------------- */

static mmrt_status check_row_weight(struct cu_op *o, const char *what, const struct cu_view *w,
                                    int64_t n)
{
    mmrt_status st;
    if (!w->data)
        return MMRT_OK;
    if ((st = cu_need_dtype(o, what, w, CU_DT_WEIGHT)) || (st = cu_need_contig(o, what, w)))
        return st;
    if (w->numel != n)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s has %" PRId64 " elements, rows have %" PRId64,
                      what, w->numel, n);
    return cu_need_disjoint(o, what, w, false);
}

static mmrt_status check_rows_f32(struct cu_op *o)
{
    mmrt_status st;
    const struct cu_view *x = &o->src[0];
    if ((st = cu_need_dtype(o, "src0", x, CU_DT_F32)) || (st = cu_need_contig(o, "src0", x)) ||
        (st = check_dst_f32(o)))
        return st;
    if (!cu_same_shape(x, &o->dst))
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst and src0 must have the same shape");
    return cu_need_disjoint(o, "src0", x, true);
}

static mmrt_status norm(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cu_op o;
    struct mmrt_norm_params p;
    bool rms = op == MMRT_OP_RMSNORM;
    mmrt_status st = cu_op_begin(dev, args, op, 1, rms ? 2 : 3, &o);
    if (st != MMRT_OK)
        return st;
    int64_t n = cu_inner(&o.src[0]);
    if ((st = cu_op_params(&o, &p, sizeof p)) || (st = check_rows_f32(&o)) ||
        (st = check_row_weight(&o, "src1 (weight)", &o.src[1], n)) ||
        (st = check_row_weight(&o, "src2 (bias)", &o.src[2], n)))
        return st;
    char why[96];
    if (mmrt_pv_norm_eps(p.eps, why, sizeof why) != MMRT_OK)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "%s", why);
    cudaError_t e = cu_launch_norm((float *)o.dst.data, (const float *)o.src[0].data,
                                   o.src[1].data, o.src[1].dtype, o.src[2].data, o.src[2].dtype,
                                   cu_rows(&o.src[0]), n, p.eps, rms, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "norm");
}

mmrt_status cu_op_layernorm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return norm(dev, args, MMRT_OP_LAYERNORM);
}

mmrt_status cu_op_rmsnorm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return norm(dev, args, MMRT_OP_RMSNORM);
}

mmrt_status cu_op_softmax(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_scale_params p;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_SOFTMAX, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = cu_op_params(&o, &p, sizeof p)) || (st = check_rows_f32(&o)))
        return st;
    cudaError_t e = cu_launch_softmax((float *)o.dst.data, (const float *)o.src[0].data,
                                      cu_rows(&o.src[0]), cu_inner(&o.src[0]), p.scale,
                                      dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "softmax");
}

mmrt_status cu_op_argmax(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_ARGMAX, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *x = &o.src[0], *y = &o.dst;
    if ((st = cu_need_dtype(&o, "src0", x, CU_DT_F32)) || (st = cu_need_contig(&o, "src0", x)) ||
        (st = cu_need_dtype(&o, "dst", y, CU_DT_I32)) || (st = cu_need_contig(&o, "dst", y)) ||
        (st = cu_need_disjoint(&o, "src0", x, false)))
        return st;
    int64_t rows = cu_rows(x), n = cu_inner(x);
    if (y->numel != rows)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dst has %" PRId64 " elements, src0 has %" PRId64
                      " rows", y->numel, rows);
    if (n == 0 && rows > 0)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src0 rows are empty: no maximum to find");
    if (n > INT32_MAX)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "rows of %" PRId64 " elements do not fit I32 "
                      "indices", n);
    cudaError_t e = cu_launch_argmax((int32_t *)y->data, (const float *)x->data, rows, n,
                                     dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "argmax");
}

mmrt_status cu_op_get_rows(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_GET_ROWS, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *tab = &o.src[0], *ids = &o.src[1], *y = &o.dst;
    if ((st = cu_need_rank(&o, "src0 (table)", tab, 2)) ||
        (st = cu_need_dtype(&o, "src0 (table)", tab, CU_DT_WEIGHT)) ||
        (st = cu_need_contig(&o, "src0 (table)", tab)) ||
        (st = cu_need_dtype(&o, "src1 (ids)", ids, CU_DT_I32)) ||
        (st = cu_need_contig(&o, "src1 (ids)", ids)) || (st = check_dst_f32(&o)) ||
        (st = cu_need_disjoint(&o, "src0 (table)", tab, false)) ||
        (st = cu_need_disjoint(&o, "src1 (ids)", ids, false)))
        return st;
    int64_t V = tab->ne[0], n = tab->ne[1], T = ids->numel;
    if (cu_rows(y) != T || cu_inner(y) != n)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dst must be [%" PRId64 " rows, %" PRId64 "], got "
                      "%" PRId64 " rows of %" PRId64, T, n, cu_rows(y), cu_inner(y));
    /* The ids are checked on the device (error word): a bad one leaves its row untouched. */
    cudaError_t e = cu_launch_get_rows((float *)y->data, tab->data, tab->dtype, V, n,
                                       (const int32_t *)ids->data, T, dev->err_dev, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "get_rows");
}

/* ---- ROPE, ROPE_MULTI ----------------------------------------------------------------- */

/* What ROPE and ROPE_MULTI share: x [T, H, D] F32 and dst of its shape (x itself or
 * disjoint), both with a contiguous inner dim and any token and head strides, positions I32
 * contiguous with `pos_per_token` entries per token, n_rot and theta as plugin.h says. Fills
 * the geometry of *d; the caller adds mode, axes and inv_freq. */
static mmrt_status check_rotary(struct cu_op *o, float theta, int32_t n_rot,
                                int64_t pos_per_token, struct cu_rope_desc *d)
{
    const struct cu_view *x = &o->src[0], *pos = &o->src[1], *y = &o->dst;
    mmrt_status st;
    if ((st = cu_need_rank(o, "src0 (x)", x, 3)) ||
        (st = cu_need_dtype(o, "src0 (x)", x, CU_DT_F32)) ||
        (st = cu_need_inner_contig(o, "src0 (x)", x)) ||
        (st = cu_need_dtype(o, "src1 (positions)", pos, CU_DT_I32)) ||
        (st = cu_need_contig(o, "src1 (positions)", pos)) ||
        (st = cu_need_dtype(o, "dst", y, CU_DT_F32)) ||
        (st = cu_need_inner_contig(o, "dst", y)) ||
        (st = cu_need_disjoint(o, "src0 (x)", x, true)) ||
        (st = cu_need_disjoint(o, "src1 (positions)", pos, false)))
        return st;
    int64_t T = x->ne[0], H = x->ne[1], D = x->ne[2];
    if (!cu_same_shape(x, y))
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst must have x's shape [%" PRId64 ", %" PRId64
                      ", %" PRId64 "]", T, H, D);
    if (pos->numel != T * pos_per_token)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "src1 (positions) has %" PRId64 " entries for %"
                      PRId64 " tokens × %" PRId64, pos->numel, T, pos_per_token);
    char why[160];
    if (mmrt_pv_rope_rot(n_rot, D, theta, why, sizeof why) != MMRT_OK)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    if (n_rot / 2 > CU_ROPE_MAX_HALF)
        return cu_bad(o, MMRT_ERR_UNSUPPORTED, "n_rot %" PRId32 " exceeds the CUDA plugin's %d",
                      n_rot, 2 * CU_ROPE_MAX_HALF);
    *d = (struct cu_rope_desc){
        .x = (const float *)x->data, .y = (float *)y->data, .pos = (const int32_t *)pos->data,
        .T = T, .H = H, .D = D,
        .xs0 = x->nb[0] / 4, .xs1 = x->nb[1] / 4, .ys0 = y->nb[0] / 4, .ys1 = y->nb[1] / 4,
        .n_rot = n_rot, .mode = MMRT_ROPE_NEOX, .n_axes = 1, .sec_end = { n_rot / 2 },
    };
    return MMRT_OK;
}

mmrt_status cu_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_rope_params p;
    struct cu_rope_desc d;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_ROPE, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = cu_op_params(&o, &p, sizeof p)) || (st = check_rotary(&o, p.theta, p.n_rot, 1, &d)))
        return st;
    char why[96];
    if (mmrt_pv_rope_mode(p.mode, why, sizeof why) != MMRT_OK)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "%s", why);
    d.mode = p.mode;
    /* Exactly the CPU plugin's expression, through the same C library (see cu_rope_desc). */
    for (int32_t i = 0; i < p.n_rot / 2; i++)
        d.inv_freq[i] = 1.0f / powf(p.theta, (float)(2 * i) / (float)p.n_rot);
    cudaError_t e = cu_launch_rope(&d, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "rope");
}

mmrt_status cu_op_rope_multi(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_rope_multi_params p;
    struct cu_rope_desc d;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_ROPE_MULTI, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = cu_op_params(&o, &p, sizeof p)))
        return st;
    if (p.n_axes < 1 || p.n_axes > MMRT_ROPE_MAX_AXES)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "n_axes %" PRId32 " is outside 1…%d", p.n_axes,
                      MMRT_ROPE_MAX_AXES);
    if ((st = check_rotary(&o, p.theta, p.n_rot, p.n_axes, &d)) ||
        (st = cu_need_rank(&o, "src1 (positions)", &o.src[1], 2)))
        return st;
    if (o.src[1].ne[1] != p.n_axes)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (positions) must be [T, n_axes = %" PRId32
                      "], got [%" PRId64 ", %" PRId64 "]", p.n_axes, o.src[1].ne[0],
                      o.src[1].ne[1]);
    if (p.freq_dim < 1)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "freq_dim %" PRId32 " must be ≥ 1", p.freq_dim);
    if (p.restart != 0 && p.restart != 1)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "restart %" PRId32 " must be 0 or 1", p.restart);
    int64_t sum = 0;
    for (int a = 0; a < p.n_axes; a++) {
        if (p.sections[a] < 0)
            return cu_bad(&o, MMRT_ERR_INVALID_ARG, "sections[%d] = %" PRId32 " is negative", a,
                          p.sections[a]);
        sum += p.sections[a];
    }
    if (sum != p.n_rot / 2)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "sections sum to %" PRId64 ", n_rot / 2 is %"
                      PRId32, sum, p.n_rot / 2);
    d.n_axes = p.n_axes;
    /* Per pair, the CPU plugin's expression with the frequency index of plugin.h: i, or i
     * minus its section's start when restart. */
    int32_t start = 0, i = 0;
    for (int a = 0; a < p.n_axes; a++) {
        for (int32_t k = 0; k < p.sections[a]; k++, i++) {
            int32_t j = p.restart ? i - start : i;
            d.inv_freq[i] = 1.0f / powf(p.theta, (float)(2 * j) / (float)p.freq_dim);
        }
        start = i;
        d.sec_end[a] = i;
    }
    cudaError_t e = cu_launch_rope(&d, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "rope");
}

/* ---- SET_ROWS ------------------------------------------------------------------------- */

mmrt_status cu_op_set_rows(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_SET_ROWS, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *val = &o.src[0], *idx = &o.src[1], *y = &o.dst;
    if ((st = cu_need_dtype(&o, "src0 (values)", val, CU_DT_F32)) ||
        (st = cu_need_contig(&o, "src0 (values)", val)) ||
        (st = cu_need_dtype(&o, "src1 (idx)", idx, CU_DT_I32)) ||
        (st = cu_need_contig(&o, "src1 (idx)", idx)) ||
        (st = cu_need_dtype(&o, "dst", y, CU_DT_WEIGHT | CU_DT_F8)) ||
        (st = cu_need_contig(&o, "dst", y)) ||
        (st = cu_need_disjoint(&o, "src0 (values)", val, false)) ||
        (st = cu_need_disjoint(&o, "src1 (idx)", idx, false)))
        return st;
    int64_t T = val->ne[0], R = y->ne[0];
    if (idx->numel != T)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (idx) has %" PRId64 " entries for %" PRId64
                      " rows of values", idx->numel, T);
    if (y->n_dims != val->n_dims)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dst has %d dims, src0 (values) %d", y->n_dims,
                      val->n_dims);
    int64_t n = 1; /* elements per row; cannot overflow, numel did not */
    for (int i = 1; i < val->n_dims; i++) {
        if (y->ne[i] != val->ne[i])
            return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dim %d: dst has %" PRId64 ", src0 (values) %"
                          PRId64 " (the inner extents must match)", i, y->ne[i], val->ne[i]);
        n *= val->ne[i];
    }
    /* The indices stay on the device (a captured step writes where a later upload says); one
     * outside [0, R) writes nothing, as plugin.h allows. */
    cudaError_t e = cu_launch_set_rows(y->data, y->dtype, R, (const float *)val->data,
                                       (const int32_t *)idx->data, T, n, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "set_rows");
}

/* ---- GATHER_HEADS, L2_NORM -------------------------------------------------------------- */

mmrt_status cu_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_GATHER_HEADS, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *tab = &o.src[0], *idx = &o.src[1], *y = &o.dst;
    if ((st = cu_need_rank(&o, "src0 (table)", tab, 3)) ||
        (st = cu_need_dtype(&o, "src0 (table)", tab, CU_DT_WEIGHT | CU_DT_F8)) ||
        (st = cu_need_contig(&o, "src0 (table)", tab)) ||
        (st = cu_need_rank(&o, "src1 (idx)", idx, 3)) ||
        (st = cu_need_dtype(&o, "src1 (idx)", idx, CU_DT_I32)) ||
        (st = cu_need_contig(&o, "src1 (idx)", idx)) || (st = cu_need_rank(&o, "dst", y, 3)) ||
        (st = check_dst_f32(&o)) || (st = cu_need_disjoint(&o, "src0 (table)", tab, false)) ||
        (st = cu_need_disjoint(&o, "src1 (idx)", idx, false)))
        return st;
    const int64_t R = tab->ne[0], H = tab->ne[1], D = tab->ne[2], N = idx->ne[0], G = idx->ne[2];
    if (idx->ne[1] != H)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (idx) has %" PRId64 " heads, src0 (table) %"
                      PRId64, idx->ne[1], H);
    if (G < 1)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (idx) has no entries per group (G = 0; "
                      "G must be ≥ 1)");
    if (y->ne[0] != N || y->ne[1] != H || y->ne[2] != D)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dst must be [N %" PRId64 ", H %" PRId64 ", D %"
                      PRId64 "], got [%" PRId64 ", %" PRId64 ", %" PRId64 "]", N, H, D, y->ne[0],
                      y->ne[1], y->ne[2]);
    /* The entries stay on the device (a captured step reads what a later upload wrote); one
     * outside [0, R) is skipped like padding, as plugin.h says. */
    cudaError_t e = cu_launch_gather_heads((float *)y->data, tab->data, tab->dtype, R, H, D,
                                           (const int32_t *)idx->data, N * H, G, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "gather_heads");
}

mmrt_status cu_op_l2_norm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_L2_NORM, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *x = &o.src[0], *y = &o.dst;
    if ((st = cu_need_dtype(&o, "src0", x, CU_DT_F32)) || (st = cu_need_contig(&o, "src0", x)) ||
        (st = cu_need_rank(&o, "dst", y, 1)) || (st = check_dst_f32(&o)) ||
        (st = cu_need_disjoint(&o, "src0", x, false)))
        return st;
    const int64_t rows = cu_rows(x), n = cu_inner(x);
    if (y->ne[0] != rows)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dst has %" PRId64 " elements, src0 has %" PRId64
                      " rows", y->ne[0], rows);
    cudaError_t e = cu_launch_l2_norm((float *)y->data, (const float *)x->data, rows, n,
                                      dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "l2_norm");
}

/* ---- ATTENTION ------------------------------------------------------------------------ */

/* Host-side checks of a cu_seqlens tensor; its values are checked by the kernel. */
static mmrt_status check_cu(struct cu_op *o, const char *what, const struct cu_view *cu,
                            int64_t n_seq)
{
    mmrt_status st;
    if ((st = cu_need_dtype(o, what, cu, CU_DT_I32)) || (st = cu_need_contig(o, what, cu)) ||
        (st = cu_need_disjoint(o, what, cu, false)))
        return st;
    if (cu->numel != n_seq + 1)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s has %" PRId64 " entries, n_seq + 1 = %" PRId64,
                      what, cu->numel, n_seq + 1);
    return MMRT_OK;
}

/* What ATTENTION and ATTENTION_PAGED check alike once q, K and V have their ranks and
 * dtypes: head dim, head grouping, dst's shape and the params. */
static mmrt_status check_heads(struct cu_op *o, const struct mmrt_attention_params *p,
                               int64_t Hq, int64_t Hkv, int64_t D)
{
    char why[256];
    if (mmrt_pv_attention_heads(Hq, Hkv, D, why, sizeof why) != MMRT_OK)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    if (!cu_same_shape(&o->src[0], &o->dst))
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "dst must have q's shape");
    if (mmrt_pv_attention_values(p, why, sizeof why) != MMRT_OK)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    return MMRT_OK;
}

/* The attention params of a launch: ABI 1.4 callers' 12 bytes read as window 0. */
static mmrt_status attention_params(struct cu_op *o, struct mmrt_attention_params *p)
{
    char why[128];
    if (mmrt_pv_attention_params(o->params, o->params_size, p, why, sizeof why) != MMRT_OK)
        return cu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    return MMRT_OK;
}

mmrt_status cu_op_attention(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_attention_params p;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_ATTENTION, 3, 5, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2], *y = &o.dst;
    const struct cu_view *cq = &o.src[3], *ck = &o.src[4];
    if ((st = attention_params(&o, &p)) || (st = cu_need_rank(&o, "src0 (q)", q, 3)) ||
        (st = cu_need_dtype(&o, "src0 (q)", q, CU_DT_F32)) ||
        (st = cu_need_contig(&o, "src0 (q)", q)) || (st = cu_need_rank(&o, "src1 (k)", k, 3)) ||
        (st = cu_need_dtype(&o, "src1 (k)", k, CU_DT_KV)) ||
        (st = cu_need_inner_contig(&o, "src1 (k)", k)) ||
        (st = cu_need_rank(&o, "src2 (v)", v, 3)) ||
        (st = cu_need_dtype(&o, "src2 (v)", v, CU_DT_KV)) ||
        (st = cu_need_inner_contig(&o, "src2 (v)", v)) || (st = check_dst_f32(&o)) ||
        (st = cu_need_disjoint(&o, "src0 (q)", q, false)) ||
        (st = cu_need_disjoint(&o, "src1 (k)", k, false)) ||
        (st = cu_need_disjoint(&o, "src2 (v)", v, false)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], S = k->ne[0], Hkv = k->ne[1];
    if (D >= 1 && D <= 256 && (!cu_same_shape(k, v) || k->ne[2] != D))
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "k [%" PRId64 ", %" PRId64 ", %" PRId64 "] and v "
                      "[%" PRId64 ", %" PRId64 ", %" PRId64 "] must both be [S, Hkv, %" PRId64 "]",
                      k->ne[0], k->ne[1], k->ne[2], v->ne[0], v->ne[1], v->ne[2], D);
    if ((st = check_heads(&o, &p, Hq, Hkv, D)))
        return st;
    if ((cq->data == NULL) != (ck->data == NULL))
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "give both cu_seqlens_q and cu_seqlens_k, or "
                      "neither");
    if (cq->data) {
        if (p.n_seq < 1)
            return cu_bad(&o, MMRT_ERR_INVALID_ARG, "n_seq %" PRId32 " must be ≥ 1", p.n_seq);
        if ((st = check_cu(&o, "src3 (cu_seqlens_q)", cq, p.n_seq)) ||
            (st = check_cu(&o, "src4 (cu_seqlens_k)", ck, p.n_seq)))
            return st;
    } else if (p.n_seq != 1) {
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "n_seq %" PRId32 " must be 1 without cu_seqlens",
                      p.n_seq);
    }
    if (T > INT32_MAX || S > INT32_MAX)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "%" PRId64 " queries / %" PRId64 " keys exceed "
                      "I32 sequence offsets", T, S);
    /* Grid limits: x counts row tiles (+ one per sequence), y the kv heads. */
    if (T * (Hq / (Hkv ? Hkv : 1)) / 16 + p.n_seq >= INT32_MAX || Hkv > 65535)
        return cu_bad(&o, MMRT_ERR_UNSUPPORTED, "%" PRId64 " tokens × %" PRId64 " heads exceed "
                      "the CUDA grid", T, Hq);
    int64_t kes = (int64_t)mmrt_dtype_size((enum mmrt_dtype)k->dtype);
    int64_t ves = (int64_t)mmrt_dtype_size((enum mmrt_dtype)v->dtype);
    struct cu_attn_desc d = {
        .q = (const float *)q->data, .k = k->data, .v = v->data, .y = (float *)y->data,
        .cu_q = (const int32_t *)cq->data, .cu_k = (const int32_t *)ck->data,
        .T = T, .S = S,
        .k_s0 = k->nb[0] / kes, .k_s1 = k->nb[1] / kes, .v_s0 = v->nb[0] / ves,
        .v_s1 = v->nb[1] / ves,
        .Hq = (int32_t)Hq, .Hkv = (int32_t)Hkv, .D = (int32_t)D,
        .n_seq = cq->data ? p.n_seq : 1,
        .k_dtype = k->dtype, .v_dtype = v->dtype, .causal = p.causal, .window = p.window,
        .scale = p.scale, .ws = dev->attn_ws, .ws_floats = (int64_t)(CU_ATTN_WS_BYTES / sizeof(float)),
        .n_sm = dev->n_sm, .err = dev->err_dev,
    };
    cudaError_t e = cu_launch_attention(&d, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "attention");
}

/* Host-side checks of an index tensor: I32, contiguous, not overlapping dst. */
static mmrt_status check_index(struct cu_op *o, const char *what, const struct cu_view *t)
{
    mmrt_status st;
    if ((st = cu_need_dtype(o, what, t, CU_DT_I32)) || (st = cu_need_contig(o, what, t)) ||
        (st = cu_need_disjoint(o, what, t, false)))
        return st;
    return MMRT_OK;
}

mmrt_status cu_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_attention_params p;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_ATTENTION_PAGED, 6, 6, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2];
    const struct cu_view *cq = &o.src[3], *lens = &o.src[4], *table = &o.src[5];
    if ((st = attention_params(&o, &p)) || (st = cu_need_rank(&o, "src0 (q)", q, 3)) ||
        (st = cu_need_dtype(&o, "src0 (q)", q, CU_DT_F32)) ||
        (st = cu_need_contig(&o, "src0 (q)", q)) ||
        (st = cu_need_rank(&o, "src1 (k_pages)", k, 4)) ||
        (st = cu_need_dtype(&o, "src1 (k_pages)", k, CU_DT_KV)) ||
        (st = cu_need_contig(&o, "src1 (k_pages)", k)) ||
        (st = cu_need_contig(&o, "src2 (v_pages)", v)) || (st = check_dst_f32(&o)) ||
        (st = cu_need_disjoint(&o, "src0 (q)", q, false)) ||
        (st = cu_need_disjoint(&o, "src1 (k_pages)", k, false)) ||
        (st = cu_need_disjoint(&o, "src2 (v_pages)", v, false)))
        return st;
    if (!cu_same_shape(k, v) || v->dtype != k->dtype)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src2 (v_pages) must have k_pages' shape and "
                      "dtype");
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2];
    int64_t n_pages = k->ne[0], page_tokens = k->ne[1], Hkv = k->ne[2];
    if (k->ne[3] != D)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "the pages' head dim %" PRId64 " differs from "
                      "q's %" PRId64, k->ne[3], D);
    if (page_tokens < 1)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "pages of %" PRId64 " tokens", page_tokens);
    if ((st = check_heads(&o, &p, Hq, Hkv, D)))
        return st;
    if (p.n_seq < 1)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "n_seq %" PRId32 " must be ≥ 1", p.n_seq);
    if ((st = check_index(&o, "src3 (cu_seqlens_q)", cq)) ||
        (st = check_index(&o, "src4 (kv_lens)", lens)) ||
        (st = cu_need_rank(&o, "src5 (page_table)", table, 2)) ||
        (st = check_index(&o, "src5 (page_table)", table)))
        return st;
    if (cq->numel != (int64_t)p.n_seq + 1 || lens->numel != p.n_seq || table->ne[0] != p.n_seq ||
        table->ne[1] < 1)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "cu_seqlens_q [%" PRId64 "], kv_lens [%" PRId64
                      "] and page_table [%" PRId64 ", %" PRId64 "] must be [n_seq + 1], [n_seq] "
                      "and [n_seq, max_pages ≥ 1] for n_seq = %" PRId32, cq->numel, lens->numel,
                      table->ne[0], table->ne[1], p.n_seq);
    if (T > INT32_MAX || T * (Hq / Hkv) / 16 + p.n_seq >= INT32_MAX || Hkv > 65535)
        return cu_bad(&o, MMRT_ERR_UNSUPPORTED, "%" PRId64 " tokens × %" PRId64 " heads exceed "
                      "the CUDA grid", T, Hq);
    int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)k->dtype);
    struct cu_attn_desc d = {
        .q = (const float *)q->data, .k = k->data, .v = v->data, .y = (float *)o.dst.data,
        .cu_q = (const int32_t *)cq->data, .T = T,
        .k_s0 = k->nb[1] / es, .k_s1 = k->nb[2] / es, .v_s0 = v->nb[1] / es,
        .v_s1 = v->nb[2] / es,
        .Hq = (int32_t)Hq, .Hkv = (int32_t)Hkv, .D = (int32_t)D, .n_seq = p.n_seq,
        .k_dtype = k->dtype, .v_dtype = v->dtype, .causal = p.causal, .window = p.window,
        .scale = p.scale, .n_sm = dev->n_sm, .err = dev->err_dev,
        .kv_lens = (const int32_t *)lens->data, .page_table = (const int32_t *)table->data,
        .max_pages = table->ne[1], .page_tokens = page_tokens, .n_pages = n_pages,
        .k_sp = k->nb[0] / es, .v_sp = v->nb[0] / es,
    };
    /* The indices stay on the device (a captured step reads what a later upload wrote). */
    cudaError_t e = cu_launch_attention(&d, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "attention_paged");
}

/* ---- COPY, CONCAT --------------------------------------------------------------------- */

/* Enqueues dst[i…] = src[i…] for two views of equal extents. */
static mmrt_status strided_copy(struct cu_op *o, const struct cu_view *src,
                                const struct cu_view *dst)
{
    struct mmrt_device *dev = o->dev;
    if (src->numel == 0)
        return MMRT_OK;
    bool same_dt = src->dtype == dst->dtype;
    if (same_dt && src->data == dst->data &&
        memcmp(src->nb, dst->nb, sizeof(int64_t) * (size_t)src->n_dims) == 0)
        return MMRT_OK; /* a view copied onto itself */
    if (same_dt && cu_view_contig(src) && cu_view_contig(dst)) {
        size_t nbytes = (size_t)src->numel * mmrt_dtype_size((enum mmrt_dtype)src->dtype);
        cudaError_t e = cudaMemcpyAsync(dst->data, src->data, nbytes, cudaMemcpyDeviceToDevice,
                                        dev->stream);
        return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "memcpy");
    }
    struct cu_copy_desc d = { .src = src->data, .dst = dst->data, .sdt = src->dtype,
                              .ddt = dst->dtype };
    int pad = MMRT_MAX_DIMS - src->n_dims;
    int64_t ses = (int64_t)mmrt_dtype_size((enum mmrt_dtype)src->dtype);
    int64_t des = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dst->dtype);
    for (int i = 0; i < MMRT_MAX_DIMS; i++) {
        bool real = i >= pad;
        d.ne[i] = real ? src->ne[i - pad] : 1;
        d.snb[i] = real ? src->nb[i - pad] / ses : 0;
        d.dnb[i] = real ? dst->nb[i - pad] / des : 0;
    }
    cudaError_t e = cu_launch_copy(&d, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "copy");
}

static bool copy_pair_ok(int s, int d)
{
    if (s == MMRT_DTYPE_I32 || d == MMRT_DTYPE_I32)
        return s == d;
    if (s == MMRT_DTYPE_F8E4M3 || d == MMRT_DTYPE_F8E4M3)
        return false; /* plugin.h: COPY does not take it */
    return s >= 0 && s < MMRT_DTYPE_COUNT && d >= 0 && d < MMRT_DTYPE_COUNT;
}

mmrt_status cu_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_COPY, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *s = &o.src[0], *d = &o.dst;
    if (!cu_same_shape(s, d))
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dst must have src0's extents");
    if (!copy_pair_ok(s->dtype, d->dtype))
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "cannot convert %s to %s (I32 copies only to I32)",
                      mmrt_dtype_name_of(s->dtype), mmrt_dtype_name_of(d->dtype));
    /* Same-size dtypes may convert in place (F16 ↔ BF16): each element is read, then written
     * by the same thread. */
    bool in_place_ok = mmrt_dtype_size((enum mmrt_dtype)s->dtype) ==
                       mmrt_dtype_size((enum mmrt_dtype)d->dtype);
    struct cu_view s_as_d = *s;
    s_as_d.dtype = d->dtype;
    if ((st = cu_need_disjoint(&o, "src0", in_place_ok ? &s_as_d : s, in_place_ok)))
        return st;
    return strided_copy(&o, s, d);
}

mmrt_status cu_op_concat(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_concat_params p;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_CONCAT, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *a = &o.src[0], *b = &o.src[1], *d = &o.dst;
    if ((st = cu_op_params(&o, &p, sizeof p)))
        return st;
    if (a->dtype != d->dtype || b->dtype != d->dtype)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src0 (%s), src1 (%s) and dst (%s) must share one "
                      "dtype", mmrt_dtype_name_of(a->dtype), mmrt_dtype_name_of(b->dtype),
                      mmrt_dtype_name_of(d->dtype));
    if (a->n_dims != d->n_dims || b->n_dims != d->n_dims)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "src0, src1 and dst must share one rank");
    if (p.axis < 0 || p.axis >= d->n_dims)
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "axis %" PRId32 " is outside 0…%d", p.axis,
                      d->n_dims - 1);
    for (int i = 0; i < d->n_dims; i++) {
        bool ok = i == p.axis ? d->ne[i] == a->ne[i] + b->ne[i]
                              : a->ne[i] == d->ne[i] && b->ne[i] == d->ne[i];
        if (!ok)
            return cu_bad(&o, MMRT_ERR_INVALID_ARG, "dim %d: src0 %" PRId64 " + src1 %" PRId64
                          " vs dst %" PRId64 " (axis %" PRId32 ")", i, a->ne[i], b->ne[i],
                          d->ne[i], p.axis);
    }
    if ((st = cu_need_disjoint(&o, "src0", a, false)) ||
        (st = cu_need_disjoint(&o, "src1", b, false)))
        return st;
    /* Each source into its slice of dst: src1's starts a->ne[axis] steps along the axis. */
    struct cu_view part = *d;
    part.ne[p.axis] = a->ne[p.axis];
    if ((st = strided_copy(&o, a, &part)))
        return st;
    part.data = d->data + a->ne[p.axis] * d->nb[p.axis];
    part.ne[p.axis] = b->ne[p.axis];
    return strided_copy(&o, b, &part);
}
