/*
 * core/ops.h — the operator front: every kernel launch in mmrt goes through here.
 *
 * Each call checks the arguments against the operator's contract in plugin.h (ranks, shapes,
 * dtypes, contiguity, parameter ranges) before the plugin sees them, so every plugin —
 * ours or a vendor's — gets only well-formed launches, and a model bug surfaces as an error
 * naming the op and the tensor instead of a wrong answer or a crash on a GPU. Then it
 * dispatches to the device's op table; a NULL entry is MMRT_ERR_UNSUPPORTED naming the
 * device, its plugin and the op.
 *
 * Values that live in device memory (token ids, positions, cu_seqlens) cannot be checked
 * here without a copy; plugins check them (GET_ROWS refuses an id out of range).
 *
 * All tensors must live on `dev`. Statuses: MMRT_ERR_INVALID_ARG (contract violated; the
 * message names op, operand and extents), MMRT_ERR_UNSUPPORTED, or the plugin's status with
 * its last_error text.
 */
#ifndef MMRT_CORE_OPS_H
#define MMRT_CORE_OPS_H

#include "device.h"

/* Generic entry: validates `op` with its sources (NULL for absent optional ones) and
 * parameter struct, then launches it. The typed wrappers below are the usual way in; ops the
 * runtime never launches (MUL, SOFTMAX, ARGMAX: plugins implement them for the ABI and
 * mmrt-plugin-check tests them) have none. */
mmrt_status mmrt_op_launch(struct mmrt_dev *dev, enum mmrt_op op,
                           const struct mmrt_tensor *const *src, int n_src,
                           const struct mmrt_tensor *dst, const void *params,
                           uint32_t params_size, struct mmrt_error *err);

/* Validation alone (what mmrt_op_launch checks), for tools and tests. */
mmrt_status mmrt_op_validate(enum mmrt_op op, const struct mmrt_tensor *const *src, int n_src,
                             const struct mmrt_tensor *dst, const void *params,
                             uint32_t params_size, struct mmrt_error *err);

/* A matrix as MATMUL takes it: t [N, K] in a float dtype, or quantized (t I8 with its
 * per-row F32 scales [N], or t U4 [N, K/2] with group scales and zero points [N, G]; plugin.h
 * MMRT_OP_MATMUL). Models hold every matmul weight in one,
 * so how a weight is stored is decided where it is loaded (models/weights.h), never in model
 * code. */
struct mmrt_weight {
    struct mmrt_tensor t;
    struct mmrt_tensor scale; /* I8: [N]; U4: [N, G] */
    struct mmrt_tensor zero;  /* U4 only: [N, G] */
    /* Act-order GPTQ (desc_act): I32 [K], the input that column j of t reads, so that each
     * group's inputs sit side by side as U4 needs; x is gathered by it before the product.
     * n_dims 0: none (every other matrix). */
    struct mmrt_tensor perm;
};

/* y[rows, N] = x[rows, K] · w[N, K]ᵀ (+ b[N]); b may be NULL. */
mmrt_status mmrt_op_matmul(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                           const struct mmrt_weight *w, const struct mmrt_tensor *b,
                           const struct mmrt_tensor *y, struct mmrt_error *err);
/* y = a + b / y = a * b, b the same shape as a or one row broadcast. */
mmrt_status mmrt_op_add(struct mmrt_dev *dev, const struct mmrt_tensor *a,
                        const struct mmrt_tensor *b, const struct mmrt_tensor *y,
                        struct mmrt_error *err);
mmrt_status mmrt_op_scale(struct mmrt_dev *dev, const struct mmrt_tensor *x, float scale,
                          const struct mmrt_tensor *y, struct mmrt_error *err);
/* w and b may be NULL. */
mmrt_status mmrt_op_layernorm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                              const struct mmrt_tensor *w, const struct mmrt_tensor *b,
                              float eps, const struct mmrt_tensor *y, struct mmrt_error *err);
mmrt_status mmrt_op_rmsnorm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                            const struct mmrt_tensor *w, float eps, const struct mmrt_tensor *y,
                            struct mmrt_error *err);
/* op is one of GELU, GELU_TANH, QUICK_GELU, SILU, RELU2. */
mmrt_status mmrt_op_unary(struct mmrt_dev *dev, enum mmrt_op op, const struct mmrt_tensor *x,
                          const struct mmrt_tensor *y, struct mmrt_error *err);
mmrt_status mmrt_op_swiglu(struct mmrt_dev *dev, const struct mmrt_tensor *gate,
                           const struct mmrt_tensor *up, const struct mmrt_tensor *y,
                           struct mmrt_error *err);
mmrt_status mmrt_op_rope(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                         const struct mmrt_tensor *pos, const struct mmrt_rope_params *p,
                         const struct mmrt_tensor *y, struct mmrt_error *err);
/* cu_q and cu_k are both NULL (one sequence) or both given with n_seq + 1 entries. */
mmrt_status mmrt_op_attention(struct mmrt_dev *dev, const struct mmrt_tensor *q,
                              const struct mmrt_tensor *k, const struct mmrt_tensor *v,
                              const struct mmrt_tensor *cu_q, const struct mmrt_tensor *cu_k,
                              const struct mmrt_attention_params *p,
                              const struct mmrt_tensor *y, struct mmrt_error *err);
/* plugin.h MMRT_OP_ATTENTION_PAGED: attention over the pages that page_table names.
 * k_scales and v_scales are the row scales of I8 pages (ABI 1.7), NULL for any other. */
mmrt_status mmrt_op_attention_paged(struct mmrt_dev *dev, const struct mmrt_tensor *q,
                                    const struct mmrt_tensor *k_pages,
                                    const struct mmrt_tensor *v_pages,
                                    const struct mmrt_tensor *cu_q,
                                    const struct mmrt_tensor *kv_lens,
                                    const struct mmrt_tensor *page_table,
                                    const struct mmrt_tensor *k_scales,
                                    const struct mmrt_tensor *v_scales,
                                    const struct mmrt_attention_params *p,
                                    const struct mmrt_tensor *y, struct mmrt_error *err);
mmrt_status mmrt_op_get_rows(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                             const struct mmrt_tensor *ids, const struct mmrt_tensor *y,
                             struct mmrt_error *err);
mmrt_status mmrt_op_patch_embed(struct mmrt_dev *dev, const struct mmrt_tensor *image,
                                const struct mmrt_tensor *w, const struct mmrt_tensor *b,
                                int patch, const struct mmrt_tensor *y, struct mmrt_error *err);
mmrt_status mmrt_op_concat(struct mmrt_dev *dev, const struct mmrt_tensor *a,
                           const struct mmrt_tensor *b, int axis, const struct mmrt_tensor *y,
                           struct mmrt_error *err);
mmrt_status mmrt_op_copy(struct mmrt_dev *dev, const struct mmrt_tensor *src,
                         const struct mmrt_tensor *dst, struct mmrt_error *err);
/* Multi-axis rotary (M-RoPE, 2-D vision rotary): pos is I32 [T, p->n_axes]. */
mmrt_status mmrt_op_rope_multi(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                               const struct mmrt_tensor *pos,
                               const struct mmrt_rope_multi_params *p,
                               const struct mmrt_tensor *y, struct mmrt_error *err);
/* y[idx[t]] = values[t]: the KV-cache write whose position lives in device memory. An I8
 * y is a store with row scales (plugin.h, ABI 1.7): y_scales gets each written row's scale;
 * NULL for any other dtype. */
mmrt_status mmrt_op_set_rows(struct mmrt_dev *dev, const struct mmrt_tensor *values,
                             const struct mmrt_tensor *idx, const struct mmrt_tensor *y,
                             const struct mmrt_tensor *y_scales, struct mmrt_error *err);
/* plugin.h MMRT_OP_GATHER_HEADS (ABI 1.4): y[n, h, :] = the average of the rows
 * table[idx[n, h, g], h, :] whose index lies in [0, R), summed in g order and divided once;
 * bit-exact on every plugin. table [R, H, D] F32/F16/BF16/F8E4M3, or I8 with its row scales
 * in table_scales [R · H] (NULL otherwise), idx I32 [N, H, G] (G ≥ 1, entries < 0 are
 * padding), y F32 [N, H, D], all contiguous. A device whose plugin predates ABI 1.4 refuses
 * it (MMRT_ERR_UNSUPPORTED, "has no operator GATHER_HEADS"). */
mmrt_status mmrt_op_gather_heads(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                                 const struct mmrt_tensor *idx,
                                 const struct mmrt_tensor *table_scales,
                                 const struct mmrt_tensor *y, struct mmrt_error *err);
/* plugin.h MMRT_OP_L2_NORM (ABI 1.4): y[r] = sqrt(Σ x[r, :]²) for each row of x (F32,
 * contiguous, rows = every dim but the last); y is F32 [rows], 1-D, whatever x's rank. */
mmrt_status mmrt_op_l2_norm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                            const struct mmrt_tensor *y, struct mmrt_error *err);

#endif
