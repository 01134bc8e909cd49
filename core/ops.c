/*
 * core/ops.c — argument checks for every operator, then dispatch (see ops.h).
 *
 * The checks are plugin.h's operator contract as written once in plugins/common/op_contract.h,
 * which every in-tree plugin runs too; messages name the op, the operand and the extents,
 * e.g. "MATMUL: src1 (W) is [64, 96] but x's inner dim is 80".
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plugin_loader.h"
#include "op_contract.h"

mmrt_status mmrt_op_validate(enum mmrt_op op, const struct mmrt_tensor *const *src, int n_src,
                             const struct mmrt_tensor *dst, const void *params,
                             uint32_t params_size, struct mmrt_error *err)
{
    if ((unsigned)op >= MMRT_OP_COUNT)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "unknown operator %d", (int)op);
    if (n_src < 0 || n_src > MMRT_MAX_SRC_ALL)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: n_src is %d, expected 0…%d",
                              mmrt_op_name(op), n_src, MMRT_MAX_SRC_ALL);
    char why[512];
    struct mmrt_pv_shape shapes[MMRT_MAX_SRC_ALL], dshape;
    const struct mmrt_pv_shape *s[MMRT_MAX_SRC_ALL] = { 0 };
    for (int i = 0; i < n_src; i++) {
        if (!src[i])
            continue;
        char role[16];
        snprintf(role, sizeof role, "src%d", i);
        if (mmrt_pv_describe(role, src[i], &shapes[i], why, sizeof why) != MMRT_OK)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: %s", mmrt_op_name(op), why);
        s[i] = &shapes[i];
    }
    if (dst && mmrt_pv_describe("dst", dst, &dshape, why, sizeof why) != MMRT_OK)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: %s", mmrt_op_name(op), why);
    if (mmrt_op_check(op, n_src, s, dst ? &dshape : NULL, params, params_size, why,
                      sizeof why) != MMRT_OK)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: %s", mmrt_op_name(op), why);
    return MMRT_OK;
}

/* Whether dst or a present source has the dtype: what an older plugin must not be handed. */
static bool has_operand_of(enum mmrt_dtype dtype, const struct mmrt_tensor *const *src,
                           int n_src, const struct mmrt_tensor *dst)
{
    if (dst->dtype == (int32_t)dtype)
        return true;
    for (int i = 0; i < n_src; i++)
        if (src[i] && src[i]->dtype == (int32_t)dtype)
            return true;
    return false;
}

mmrt_status mmrt_op_launch(struct mmrt_dev *dev, enum mmrt_op op,
                           const struct mmrt_tensor *const *src, int n_src,
                           const struct mmrt_tensor *dst, const void *params,
                           uint32_t params_size, struct mmrt_error *err)
{
    /* Trailing absent sources are not passed, so a plugin whose op takes fewer (one built
     * before the I8 store's scale sources, say) sees the launch it knows. */
    while (n_src > 0 && !src[n_src - 1])
        n_src--;
    mmrt_status st = mmrt_op_validate(op, src, n_src, dst, params, params_size, err);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "device %s", dev->name);
    mmrt_kernel_fn fn = dev->api->ops[op];
    if (!fn)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s (plugin %s) has no operator %s", dev->name,
                              dev->api->name, mmrt_op_name(op));
    /* A plugin built before ABI 1.5 reads 12 bytes of attention params and would silently
     * attend to every key: a window is refused there rather than ignored. */
    struct mmrt_attention_params ap;
    if ((op == MMRT_OP_ATTENTION || op == MMRT_OP_ATTENTION_PAGED) &&
        mmrt_attention_params_read(params, params_size, &ap) && ap.window > 0 &&
        dev->api->hdr.abi_minor < 5)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s: plugin %s has ABI %u.%u; %s with a sliding window "
                              "needs 1.5", dev->name, dev->api->name,
                              (unsigned)dev->api->hdr.abi_major,
                              (unsigned)dev->api->hdr.abi_minor, mmrt_op_name(op));
    /* A plugin built before ABI 1.6 does not know F8E4M3 and could take its bytes for
     * something else: the dtype is refused for it, like a window before 1.5. */
    if (dev->api->hdr.abi_minor < 6 && has_operand_of(MMRT_DTYPE_F8E4M3, src, n_src, dst))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s: plugin %s has ABI %u.%u; %s with an F8E4M3 operand "
                              "needs 1.6", dev->name, dev->api->name,
                              (unsigned)dev->api->hdr.abi_major,
                              (unsigned)dev->api->hdr.abi_minor, mmrt_op_name(op));
    /* Before ABI 1.7 I8 was a MATMUL weight only, and op_args had no slot past src5: an I8
     * KV store (whose scales are sources too) is refused there. */
    if (dev->api->hdr.abi_minor < 7 && op != MMRT_OP_MATMUL &&
        (has_operand_of(MMRT_DTYPE_I8, src, n_src, dst) || n_src > MMRT_MAX_SRC))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s: plugin %s has ABI %u.%u; %s on an I8 KV store needs "
                              "1.7", dev->name, dev->api->name, (unsigned)dev->api->hdr.abi_major,
                              (unsigned)dev->api->hdr.abi_minor, mmrt_op_name(op));
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
        .op = op,
        .n_src = n_src,
        .dst = dst,
        .params = params,
        .params_size = params_size,
    };
    for (int i = 0; i < n_src; i++) {
        if (i < MMRT_MAX_SRC)
            args.src[i] = src[i];
        else
            args.src_ext[i - MMRT_MAX_SRC] = src[i];
    }
    st = fn(dev->handle, &args);
    if (st != MMRT_OK) {
        /* Plugins usually start their message with the op name already; don't repeat it. */
        const char *why = dev->api->last_error(dev->handle);
        size_t n = strlen(mmrt_op_name(op));
        if (strncmp(why, mmrt_op_name(op), n) == 0 && why[n] == ':')
            return mmrt_error_set(err, st, "device %s: %s", dev->name, why);
        return mmrt_error_set(err, st, "device %s: %s: %s", dev->name, mmrt_op_name(op), why);
    }
    return MMRT_OK;
}

#define LAUNCH(op, params, ...)                                                               \
    do {                                                                                      \
        const struct mmrt_tensor *src_[] = { __VA_ARGS__ };                                   \
        return mmrt_op_launch(dev, op, src_, (int)(sizeof src_ / sizeof src_[0]), y, params,  \
                              params ? (uint32_t)sizeof *params : 0, err);                    \
    } while (0)

#define no_params ((const struct mmrt_scale_params *)NULL)

/* x [M, K] with its columns in w->perm's order: for M > 1 through its transpose, whose rows
 * GET_ROWS gathers (two COPYs and a GET_ROWS; for M = 1 the one row is already a column).
 * The product then runs as for any U4 matrix. Scratch comes from the pool and is gone when
 * this returns, which a captured graph could not replay: capture is refused, and the engine
 * runs those steps eagerly. */
static mmrt_status matmul_permuted(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                                   const struct mmrt_weight *w, const struct mmrt_tensor *b,
                                   const struct mmrt_tensor *y, struct mmrt_error *err)
{
    if (dev->capturing)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "device %s: an act-order (desc_act) "
                              "matrix gathers its inputs through scratch, which a graph does "
                              "not replay", dev->name);
    const int64_t K = x->ne[x->n_dims - 1];
    int64_t M = 1;
    for (int i = 0; i < x->n_dims - 1; i++)
        M *= x->ne[i];
    if (w->perm.n_dims != 1 || w->perm.ne[0] != K)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "MATMUL: the input permutation has %lld "
                              "entries for %lld inputs", (long long)w->perm.ne[0], (long long)K);
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, dev);
    struct mmrt_tensor xt, xg, xp;
    mmrt_status st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (int64_t[]){ K, M }, &xg, err);
    if (st == MMRT_OK && M == 1) {
        const struct mmrt_tensor col = mmrt_tensor_reshape(x, 2, (int64_t[]){ K, 1 });
        st = mmrt_op_get_rows(dev, &col, &w->perm, &xg, err);
        xp = mmrt_tensor_reshape(&xg, 2, (int64_t[]){ 1, K });
    } else if (st == MMRT_OK) {
        st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (int64_t[]){ K, M }, &xt, err);
        struct mmrt_tensor x_t = mmrt_tensor_reshape(x, 2, (int64_t[]){ M, K });
        x_t.ne[0] = K; /* x seen transposed: [K, M] with strides (4, 4K) */
        x_t.ne[1] = M;
        x_t.nb[0] = 4;
        x_t.nb[1] = 4 * K;
        if (st == MMRT_OK)
            st = mmrt_op_copy(dev, &x_t, &xt, err);
        if (st == MMRT_OK)
            st = mmrt_op_get_rows(dev, &xt, &w->perm, &xg, err);
        if (st == MMRT_OK)
            st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (int64_t[]){ M, K }, &xp, err);
        struct mmrt_tensor xg_t = xg;
        xg_t.ne[0] = M;
        xg_t.ne[1] = K;
        xg_t.nb[0] = 4;
        xg_t.nb[1] = 4 * M;
        if (st == MMRT_OK)
            st = mmrt_op_copy(dev, &xg_t, &xp, err);
    }
    if (st == MMRT_OK) {
        const struct mmrt_tensor *src[] = { &xp, &w->t, b, &w->scale, &w->zero };
        st = mmrt_op_launch(dev, MMRT_OP_MATMUL, src, 5, y, NULL, 0, err);
    }
    mmrt_scratch_release(&s);
    return st;
}

mmrt_status mmrt_op_matmul(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                           const struct mmrt_weight *w, const struct mmrt_tensor *b,
                           const struct mmrt_tensor *y, struct mmrt_error *err)
{
    if (w->perm.n_dims)
        return matmul_permuted(dev, x, w, b, y, err);
    if (w->t.dtype == MMRT_DTYPE_I8)
        LAUNCH(MMRT_OP_MATMUL, no_params, x, &w->t, b, &w->scale);
    if (w->t.dtype == MMRT_DTYPE_U4)
        LAUNCH(MMRT_OP_MATMUL, no_params, x, &w->t, b, &w->scale, &w->zero);
    LAUNCH(MMRT_OP_MATMUL, no_params, x, &w->t, b);
}

mmrt_status mmrt_op_add(struct mmrt_dev *dev, const struct mmrt_tensor *a,
                        const struct mmrt_tensor *b, const struct mmrt_tensor *y,
                        struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_ADD, no_params, a, b);
}

mmrt_status mmrt_op_scale(struct mmrt_dev *dev, const struct mmrt_tensor *x, float scale,
                          const struct mmrt_tensor *y, struct mmrt_error *err)
{
    const struct mmrt_scale_params p = { scale }, *pp = &p;
    LAUNCH(MMRT_OP_SCALE, pp, x);
}

mmrt_status mmrt_op_layernorm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                              const struct mmrt_tensor *w, const struct mmrt_tensor *b,
                              float eps, const struct mmrt_tensor *y, struct mmrt_error *err)
{
    const struct mmrt_norm_params p = { eps }, *pp = &p;
    LAUNCH(MMRT_OP_LAYERNORM, pp, x, w, b);
}

mmrt_status mmrt_op_rmsnorm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                            const struct mmrt_tensor *w, float eps, const struct mmrt_tensor *y,
                            struct mmrt_error *err)
{
    const struct mmrt_norm_params p = { eps }, *pp = &p;
    LAUNCH(MMRT_OP_RMSNORM, pp, x, w);
}

mmrt_status mmrt_op_unary(struct mmrt_dev *dev, enum mmrt_op op, const struct mmrt_tensor *x,
                          const struct mmrt_tensor *y, struct mmrt_error *err)
{
    if (op != MMRT_OP_GELU && op != MMRT_OP_GELU_TANH && op != MMRT_OP_QUICK_GELU &&
        op != MMRT_OP_SILU && op != MMRT_OP_RELU2)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s is not a unary activation",
                              mmrt_op_name(op));
    LAUNCH(op, no_params, x);
}

mmrt_status mmrt_op_swiglu(struct mmrt_dev *dev, const struct mmrt_tensor *gate,
                           const struct mmrt_tensor *up, const struct mmrt_tensor *y,
                           struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_SWIGLU, no_params, gate, up);
}

mmrt_status mmrt_op_rope(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                         const struct mmrt_tensor *pos, const struct mmrt_rope_params *p,
                         const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_ROPE, p, x, pos);
}

mmrt_status mmrt_op_attention(struct mmrt_dev *dev, const struct mmrt_tensor *q,
                              const struct mmrt_tensor *k, const struct mmrt_tensor *v,
                              const struct mmrt_tensor *cu_q, const struct mmrt_tensor *cu_k,
                              const struct mmrt_attention_params *p,
                              const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_ATTENTION, p, q, k, v, cu_q, cu_k);
}

mmrt_status mmrt_op_attention_paged(struct mmrt_dev *dev, const struct mmrt_tensor *q,
                                    const struct mmrt_tensor *k_pages,
                                    const struct mmrt_tensor *v_pages,
                                    const struct mmrt_tensor *cu_q,
                                    const struct mmrt_tensor *kv_lens,
                                    const struct mmrt_tensor *page_table,
                                    const struct mmrt_tensor *k_scales,
                                    const struct mmrt_tensor *v_scales,
                                    const struct mmrt_attention_params *p,
                                    const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_ATTENTION_PAGED, p, q, k_pages, v_pages, cu_q, kv_lens, page_table, k_scales,
           v_scales);
}

mmrt_status mmrt_op_get_rows(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                             const struct mmrt_tensor *ids, const struct mmrt_tensor *y,
                             struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_GET_ROWS, no_params, table, ids);
}

mmrt_status mmrt_op_patch_embed(struct mmrt_dev *dev, const struct mmrt_tensor *image,
                                const struct mmrt_tensor *w, const struct mmrt_tensor *b,
                                int patch, const struct mmrt_tensor *y, struct mmrt_error *err)
{
    const struct mmrt_patch_params p = { patch }, *pp = &p;
    LAUNCH(MMRT_OP_PATCH_EMBED, pp, image, w, b);
}

mmrt_status mmrt_op_concat(struct mmrt_dev *dev, const struct mmrt_tensor *a,
                           const struct mmrt_tensor *b, int axis, const struct mmrt_tensor *y,
                           struct mmrt_error *err)
{
    const struct mmrt_concat_params p = { axis }, *pp = &p;
    LAUNCH(MMRT_OP_CONCAT, pp, a, b);
}

mmrt_status mmrt_op_copy(struct mmrt_dev *dev, const struct mmrt_tensor *src,
                         const struct mmrt_tensor *dst, struct mmrt_error *err)
{
    const struct mmrt_tensor *y = dst;
    LAUNCH(MMRT_OP_COPY, no_params, src);
}

mmrt_status mmrt_op_rope_multi(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                               const struct mmrt_tensor *pos,
                               const struct mmrt_rope_multi_params *p,
                               const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_ROPE_MULTI, p, x, pos);
}

mmrt_status mmrt_op_set_rows(struct mmrt_dev *dev, const struct mmrt_tensor *values,
                             const struct mmrt_tensor *idx, const struct mmrt_tensor *y,
                             const struct mmrt_tensor *y_scales, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_SET_ROWS, no_params, values, idx, y_scales);
}

mmrt_status mmrt_op_gather_heads(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                                 const struct mmrt_tensor *idx,
                                 const struct mmrt_tensor *table_scales,
                                 const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_GATHER_HEADS, no_params, table, idx, table_scales);
}

mmrt_status mmrt_op_l2_norm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                            const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_L2_NORM, no_params, x);
}
