/*
 * plugins/cuda/cuda_ops.c — host side of every op but MATMUL and PATCH_EMBED: enqueue the
 * kernel of cuda_kernels.cu / cuda_attention.cu on the device's stream. Nothing here waits for
 * the GPU. cu_op_begin has held the launch to plugin.h's contract (op_contract.h, the core's
 * and the CPU plugin's one copy), so the ops check only what this plugin adds: kernel limits
 * (MMRT_ERR_UNSUPPORTED) and what the contract leaves to the device.
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
#include "op_contract.h"

/* ---- elementwise ---------------------------------------------------------------------- */

static mmrt_status binary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, op, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *a = &o.src[0], *b = &o.src[1];
    /* b has a's shape or is one row broadcast over a's rows (op_contract.h): as many
     * elements means a one-to-one walk either way. */
    bool same = b->numel == a->numel;
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

static mmrt_status norm(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cu_op o;
    struct mmrt_norm_params p;
    bool rms = op == MMRT_OP_RMSNORM;
    mmrt_status st = cu_op_begin(dev, args, op, 1, rms ? 2 : 3, &o);
    if (st != MMRT_OK)
        return st;
    int64_t n = cu_inner(&o.src[0]);
    if ((st = cu_op_params(&o, &p, sizeof p)))
        return st;
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
    if ((st = cu_op_params(&o, &p, sizeof p)))
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
    int64_t rows = cu_rows(x), n = cu_inner(x);
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
    int64_t V = tab->ne[0], n = tab->ne[1], T = ids->numel;
    /* The ids are checked on the device (error word): a bad one leaves its row untouched. */
    cudaError_t e = cu_launch_get_rows((float *)y->data, tab->data, tab->dtype, V, n,
                                       (const int32_t *)ids->data, T, dev->err_dev, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "get_rows");
}

/* ---- ROPE, ROPE_MULTI ----------------------------------------------------------------- */

/* What ROPE and ROPE_MULTI share: x [T, H, D] and dst of its shape, both with a contiguous
 * inner dim and any token and head strides (dst is x itself or contiguous, op_contract.h).
 * Fills the geometry of *d; the caller adds mode, axes and inv_freq. The contract bounds n_rot
 * by D only, the kernel's inv_freq table by CU_ROPE_MAX_HALF pairs. */
static mmrt_status rope_desc(struct cu_op *o, int32_t n_rot, struct cu_rope_desc *d)
{
    const struct cu_view *x = &o->src[0], *pos = &o->src[1], *y = &o->dst;
    int64_t T = x->ne[0], H = x->ne[1], D = x->ne[2];
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
    if ((st = cu_op_params(&o, &p, sizeof p)) || (st = rope_desc(&o, p.n_rot, &d)))
        return st;
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
    if ((st = cu_op_params(&o, &p, sizeof p)) || (st = rope_desc(&o, p.n_rot, &d)))
        return st;
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
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_SET_ROWS, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *val = &o.src[0], *idx = &o.src[1], *sc = &o.src[2], *y = &o.dst;
    int64_t T = val->ne[0], R = y->ne[0];
    int64_t n = 1; /* elements per row; cannot overflow, numel did not */
    for (int i = 1; i < val->n_dims; i++)
        n *= val->ne[i];
    /* An I8 dst (rank ≥ 2, with src2 = its scales: op_contract.h) quantizes each innermost
     * row of D on its own: per of them make one row of dst. */
    int64_t D = cu_inner(val), per = 1;
    for (int i = 1; i < val->n_dims - 1; i++)
        per *= val->ne[i];
    /* The indices stay on the device (a captured step writes where a later upload says); one
     * outside [0, R) writes nothing, as plugin.h allows. */
    cudaError_t e = cu_launch_set_rows(y->data, y->dtype, R, (const float *)val->data,
                                       (const int32_t *)idx->data, T, n, (float *)sc->data, per,
                                       D, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "set_rows");
}

/* ---- GATHER_HEADS, L2_NORM -------------------------------------------------------------- */

mmrt_status cu_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_GATHER_HEADS, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *tab = &o.src[0], *idx = &o.src[1], *sc = &o.src[2], *y = &o.dst;
    const int64_t R = tab->ne[0], H = tab->ne[1], D = tab->ne[2], N = idx->ne[0], G = idx->ne[2];
    /* The entries stay on the device (a captured step reads what a later upload wrote); one
     * outside [0, R) is skipped like padding, as plugin.h says. src2 (an I8 table's scales)
     * is present exactly when the table is I8 (op_contract.h), NULL otherwise. */
    cudaError_t e = cu_launch_gather_heads((float *)y->data, tab->data, tab->dtype,
                                           (const float *)sc->data, R, H, D,
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
    const int64_t rows = cu_rows(x), n = cu_inner(x);
    cudaError_t e = cu_launch_l2_norm((float *)y->data, (const float *)x->data, rows, n,
                                      dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(&o, e, "l2_norm");
}

/* ---- ATTENTION ------------------------------------------------------------------------ */

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
    if ((st = attention_params(&o, &p)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], S = k->ne[0], Hkv = k->ne[1];
    /* The contract bounds T and S by I32 only without cu_seqlens; with them, offsets in I32
     * cannot reach past INT32_MAX, which the kernel would report only after the launch. */
    if (cq->data && (T > INT32_MAX || S > INT32_MAX))
        return cu_bad(&o, MMRT_ERR_INVALID_ARG, "%" PRId64 " queries / %" PRId64 " keys exceed "
                      "I32 sequence offsets", T, S);
    /* Grid limits: x counts row tiles (+ one per sequence), y the kv heads. */
    if (T * (Hq / Hkv) / 16 + p.n_seq >= INT32_MAX || Hkv > 65535)
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

mmrt_status cu_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_attention_params p;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_ATTENTION_PAGED, 6, 8, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2];
    const struct cu_view *cq = &o.src[3], *lens = &o.src[4], *table = &o.src[5];
    /* I8 pages' row scales (op_contract.h: present exactly then); NULL data otherwise. */
    const struct cu_view *ks = &o.src[6], *vs = &o.src[7];
    if ((st = attention_params(&o, &p)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2];
    int64_t n_pages = k->ne[0], page_tokens = k->ne[1], Hkv = k->ne[2];
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
        .k_scales = (const float *)ks->data, .v_scales = (const float *)vs->data,
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

mmrt_status cu_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_COPY, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    /* Same-size dtypes may convert in place (F16 ↔ BF16, op_contract.h): each element is read,
     * then written by the same thread. */
    return strided_copy(&o, &o.src[0], &o.dst);
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
    /* Each source into its slice of dst: src1's starts a->ne[axis] steps along the axis. */
    struct cu_view part = *d;
    part.ne[p.axis] = a->ne[p.axis];
    if ((st = strided_copy(&o, a, &part)))
        return st;
    part.data = d->data + a->ne[p.axis] * d->nb[p.axis];
    part.ne[p.axis] = b->ne[p.axis];
    return strided_copy(&o, b, &part);
}
