/*
 * plugins/common/op_contract.h — what plugin.h's operator comments require of a launch, checked
 * in one place: the number of sources, each operand's rank, dtype, extents and contiguity, which
 * operands may share bytes with dst, and the param values. The core checks every launch with it
 * before calling a plugin (core/ops.c), and each in-tree plugin checks every launch with it on
 * entry, because a plugin is also driven directly (mmrt-plugin-check, tests, vendors'
 * harnesses) and must not trust its caller. One copy means one wording: a launch is refused
 * with the same message whoever refuses it.
 *
 * Left to the plugin: what needs device memory to see (ids, cu_seqlens and page-table
 * contents) and what it does not implement (MMRT_ERR_UNSUPPORTED).
 *
 * Header-only, like plugin_views.h, so a plugin links against nothing of mmrt. Messages have
 * no op name: the caller prefixes it ("MATMUL: src1 (W) …").
 */
#ifndef MMRT_OP_CONTRACT_H
#define MMRT_OP_CONTRACT_H

#include "plugin_views.h"

/* The shapes of a U4 MATMUL's operands (plugin.h): W [N, K/2] with K a multiple of 32
 * (mmrt_pv_u4_w), then the scales and zero points [N, G] with K / G a multiple of 32
 * (mmrt_pv_u4_groups, which sets *G). */
#define MMRT_PV_BAD(...) (snprintf(why, why_size, __VA_ARGS__), MMRT_ERR_INVALID_ARG)
static inline mmrt_status mmrt_pv_u4_w(int64_t K, const int64_t *w_ne, char *why,
                                       size_t why_size)
{
    if (K % 32 != 0 || w_ne[1] * 2 != K)
        return MMRT_PV_BAD("src1 (W) is U4 [%" PRId64 ", %" PRId64 "] but x's inner dim is %"
                           PRId64 " (U4 wants [N, K/2] with K a multiple of 32)", w_ne[0],
                           w_ne[1], K);
    return MMRT_OK;
}

static inline mmrt_status mmrt_pv_u4_groups(int64_t K, int64_t N, const int64_t *s_ne,
                                            const int64_t *z_ne, int64_t *G, char *why,
                                            size_t why_size)
{
    const int64_t g = s_ne[1];
    if (s_ne[0] != N || g < 1 || K % g != 0 || (K / g) % 32 != 0)
        return MMRT_PV_BAD("src3 (scales) is [%" PRId64 ", %" PRId64 "]: want [%" PRId64
                           ", G] with K / G a multiple of 32 (K = %" PRId64 ")", s_ne[0],
                           s_ne[1], N, K);
    if (z_ne[0] != N || z_ne[1] != g)
        return MMRT_PV_BAD("src4 (zero points) is [%" PRId64 ", %" PRId64 "], the scales [%"
                           PRId64 ", %" PRId64 "]", z_ne[0], z_ne[1], N, g);
    *G = g;
    return MMRT_OK;
}

/* An attention launch's params (plugin.h, MMRT_OP_ATTENTION / _PAGED): read, an ABI 1.4
 * caller's 12 bytes meaning window 0 (mmrt_pv_attention_params), and then, once the plugin
 * has checked the shapes, the values every plugin holds them to (mmrt_pv_attention_values). */
static inline mmrt_status mmrt_pv_attention_params(const void *params, uint32_t size,
                                                   struct mmrt_attention_params *p, char *why,
                                                   size_t why_size)
{
    if (!mmrt_attention_params_read(params, size, p))
        return MMRT_PV_BAD("params %s (%u bytes, need %u)", params ? "too short" : "missing",
                           size, (unsigned)MMRT_ATTENTION_PARAMS_V14_SIZE);
    return MMRT_OK;
}

/* Attention's head shapes (plugin.h: D ≤ 256, query heads in contiguous groups per kv head). */
static inline mmrt_status mmrt_pv_attention_heads(int64_t Hq, int64_t Hkv, int64_t D, char *why,
                                                  size_t why_size)
{
    if (D < 1 || D > 256)
        return MMRT_PV_BAD("head dim %" PRId64 " is outside 1…256", D);
    if (Hkv < 1 || Hq % Hkv != 0)
        return MMRT_PV_BAD("%" PRId64 " query heads are not a multiple of %" PRId64 " kv heads",
                           Hq, Hkv);
    return MMRT_OK;
}

static inline mmrt_status mmrt_pv_attention_values(const struct mmrt_attention_params *p,
                                                   char *why, size_t why_size)
{
    if (p->causal != 0 && p->causal != 1)
        return MMRT_PV_BAD("causal is %" PRId32 ", expected 0 or 1", p->causal);
    if (!isfinite(p->scale))
        return MMRT_PV_BAD("scale %g is not finite", (double)p->scale);
    if (p->window < 0)
        return MMRT_PV_BAD("window %" PRId32 " must be ≥ 0 (0 = none)", p->window);
    if (p->window > 0 && p->causal != 1)
        return MMRT_PV_BAD("window %" PRId32 " needs causal = 1 (no bidirectional window is "
                           "defined)", p->window);
    return MMRT_OK;
}
/* The parameter values of ROPE / ROPE_MULTI and the norms that the core and every plugin hold a
 * launch to, with one wording: the rotated dims of a head of D and the base (both rotaries),
 * ROPE's pairing mode, LAYERNORM / RMSNORM's eps. */
static inline mmrt_status mmrt_pv_rope_rot(int32_t n_rot, int64_t D, float theta, char *why,
                                           size_t why_size)
{
    if (n_rot < 2 || n_rot % 2 != 0 || n_rot > D)
        return MMRT_PV_BAD("n_rot %" PRId32 " must be even and within 2…D (D = %" PRId64 ")",
                           n_rot, D);
    if (!(theta > 0.0f) || isinf(theta))
        return MMRT_PV_BAD("theta %g must be finite and > 0", (double)theta);
    return MMRT_OK;
}

static inline mmrt_status mmrt_pv_rope_mode(int32_t mode, char *why, size_t why_size)
{
    if (mode != MMRT_ROPE_NEOX && mode != MMRT_ROPE_INTERLEAVED)
        return MMRT_PV_BAD("mode %" PRId32 " is neither NEOX (0) nor INTERLEAVED (1)", mode);
    return MMRT_OK;
}

static inline mmrt_status mmrt_pv_norm_eps(float eps, char *why, size_t why_size)
{
    if (!(eps >= 0.0f) || isinf(eps))
        return MMRT_PV_BAD("eps %g must be finite and ≥ 0", (double)eps);
    return MMRT_OK;
}
#undef MMRT_PV_BAD

/* Dtype masks, (1 << dtype). */
#define MMRT_OC_F32 (1u << MMRT_DTYPE_F32)
#define MMRT_OC_I32 (1u << MMRT_DTYPE_I32)
#define MMRT_OC_WEIGHT ((1u << MMRT_DTYPE_F32) | (1u << MMRT_DTYPE_F16) | (1u << MMRT_DTYPE_BF16))
#define MMRT_OC_KV ((1u << MMRT_DTYPE_F32) | (1u << MMRT_DTYPE_F16) | (1u << MMRT_DTYPE_F8E4M3))
#define MMRT_OC_I8 (1u << MMRT_DTYPE_I8)
/* What SET_ROWS writes and GATHER_HEADS reads; I8 only with row scales (plugin.h). */
#define MMRT_OC_STORE (MMRT_OC_WEIGHT | (1u << MMRT_DTYPE_F8E4M3) | MMRT_OC_I8)
/* ATTENTION_PAGED's pages. */
#define MMRT_OC_KV_PAGES (MMRT_OC_KV | MMRT_OC_I8)

/* The failure buffer every check writes. */
struct mmrt_oc {
    char *why;
    size_t size;
};

#define MMRT_OC_BAD(c, ...) (snprintf((c)->why, (c)->size, __VA_ARGS__), MMRT_ERR_INVALID_ARG)
#define MMRT_OC_TRY(expr)                                                                      \
    do {                                                                                       \
        mmrt_status mmrt_oc_st_ = (expr);                                                      \
        if (mmrt_oc_st_ != MMRT_OK)                                                            \
            return mmrt_oc_st_;                                                                \
    } while (0)

/* How many sources an op takes: the first `min` are required, up to `max` may be given. */
static inline bool mmrt_oc_arity(int op, int *min, int *max)
{
    switch (op) {
    case MMRT_OP_MATMUL: *min = 2; *max = 5; return true;
    case MMRT_OP_ADD: case MMRT_OP_MUL: case MMRT_OP_SWIGLU: case MMRT_OP_ROPE:
    case MMRT_OP_GET_ROWS: case MMRT_OP_CONCAT: case MMRT_OP_ROPE_MULTI:
        *min = 2; *max = 2; return true;
    case MMRT_OP_SET_ROWS: case MMRT_OP_GATHER_HEADS: /* src2: an I8 store's row scales */
        *min = 2; *max = 3; return true;
    case MMRT_OP_SCALE: case MMRT_OP_SOFTMAX: case MMRT_OP_GELU: case MMRT_OP_GELU_TANH:
    case MMRT_OP_QUICK_GELU: case MMRT_OP_SILU: case MMRT_OP_RELU2: case MMRT_OP_COPY:
    case MMRT_OP_ARGMAX: case MMRT_OP_L2_NORM:
        *min = 1; *max = 1; return true;
    case MMRT_OP_LAYERNORM: *min = 1; *max = 3; return true;
    case MMRT_OP_RMSNORM: *min = 1; *max = 2; return true;
    case MMRT_OP_PATCH_EMBED: *min = 2; *max = 3; return true;
    case MMRT_OP_ATTENTION: *min = 3; *max = 5; return true;
    case MMRT_OP_ATTENTION_PAGED: *min = 6; *max = 8; return true; /* 6, 7: I8 scales */
    default: return false;
    }
}

static inline int64_t mmrt_oc_inner(const struct mmrt_pv_shape *s)
{
    return s->ne[s->n_dims - 1];
}

/* Product of every extent but the innermost (so an [M, 0] tensor still has M rows). */
static inline int64_t mmrt_oc_rows(const struct mmrt_pv_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->n_dims - 1; i++)
        n *= s->ne[i];
    return n;
}

static inline bool mmrt_oc_same_shape(const struct mmrt_pv_shape *a, const struct mmrt_pv_shape *b)
{
    if (a->n_dims != b->n_dims)
        return false;
    for (int i = 0; i < a->n_dims; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

static inline bool mmrt_oc_contig(const struct mmrt_pv_shape *s)
{
    int64_t stride = (int64_t)mmrt_dtype_size((enum mmrt_dtype)s->dtype);
    for (int i = s->n_dims - 1; i >= 0; i--) {
        if (s->ne[i] != 1 && s->nb[i] != stride)
            return false; /* a dim of extent 1 may carry any stride */
        stride *= s->ne[i];
    }
    return true;
}

static inline mmrt_status mmrt_oc_dtype(struct mmrt_oc *c, const char *what,
                                        const struct mmrt_pv_shape *s, unsigned mask)
{
    if (mask & (1u << s->dtype))
        return MMRT_OK;
    char want[64];
    mmrt_pv_dtype_list(mask, want, sizeof want);
    return MMRT_OC_BAD(c, "%s has dtype %s, expected %s", what, mmrt_dtype_name_of(s->dtype),
                       want);
}

static inline mmrt_status mmrt_oc_contiguous(struct mmrt_oc *c, const char *what,
                                             const struct mmrt_pv_shape *s)
{
    return mmrt_oc_contig(s) ? MMRT_OK : MMRT_OC_BAD(c, "%s must be contiguous", what);
}

static inline mmrt_status mmrt_oc_inner_contig(struct mmrt_oc *c, const char *what,
                                               const struct mmrt_pv_shape *s)
{
    int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)s->dtype);
    if (mmrt_oc_inner(s) <= 1 || s->nb[s->n_dims - 1] == es)
        return MMRT_OK;
    return MMRT_OC_BAD(c, "%s: innermost dim must be contiguous (stride %" PRId64 ", element "
                       "size %" PRId64 ")", what, s->nb[s->n_dims - 1], es);
}

static inline mmrt_status mmrt_oc_rank(struct mmrt_oc *c, const char *what,
                                       const struct mmrt_pv_shape *s, int n_dims)
{
    if (s->n_dims == n_dims)
        return MMRT_OK;
    char sh[96];
    return MMRT_OC_BAD(c, "%s must have %d dims, got %s", what, n_dims,
                       mmrt_pv_shape_str(s->n_dims, s->ne, sh, sizeof sh));
}

/* Dtype, then contiguity: the two checks most operands get. */
static inline mmrt_status mmrt_oc_dense(struct mmrt_oc *c, const char *what,
                                        const struct mmrt_pv_shape *s, unsigned mask)
{
    MMRT_OC_TRY(mmrt_oc_dtype(c, what, s, mask));
    return mmrt_oc_contiguous(c, what, s);
}

/* dst must not share a byte with source s — except, where identical_ok, when it is exactly s
 * (same arena, offset, extents, strides and element size), which elementwise ops allow. */
static inline mmrt_status mmrt_oc_disjoint(struct mmrt_oc *c, const char *what,
                                           const struct mmrt_pv_shape *s,
                                           const struct mmrt_pv_shape *d, bool identical_ok)
{
    if (!s || s->buffer != d->buffer || s->span == 0 || d->span == 0)
        return MMRT_OK;
    if (s->offset + s->span <= d->offset || d->offset + d->span <= s->offset)
        return MMRT_OK;
    if (identical_ok && s->offset == d->offset && mmrt_oc_same_shape(s, d) &&
        mmrt_dtype_size((enum mmrt_dtype)s->dtype) == mmrt_dtype_size((enum mmrt_dtype)d->dtype) &&
        memcmp(s->nb, d->nb, sizeof(int64_t) * (size_t)d->n_dims) == 0)
        return MMRT_OK;
    return MMRT_OC_BAD(c, "dst overlaps %s%s", what,
                       identical_ok ? " (only dst == src exactly is allowed)" : "");
}

/* Params at least `size` bytes long. */
static inline mmrt_status mmrt_oc_params(struct mmrt_oc *c, const void *params, uint32_t got,
                                         size_t size)
{
    if (params && got >= size)
        return MMRT_OK;
    return MMRT_OC_BAD(c, "params %s (%u bytes, need %zu)", params ? "too short" : "missing",
                       got, size);
}

/* src0 and dst: contiguous F32 of one shape, dst possibly exactly src0 (elementwise ops). */
static inline mmrt_status mmrt_oc_same_f32(struct mmrt_oc *c, const char *what,
                                           const struct mmrt_pv_shape *s,
                                           const struct mmrt_pv_shape *d)
{
    MMRT_OC_TRY(mmrt_oc_dense(c, what, s, MMRT_OC_F32));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", d, MMRT_OC_F32));
    if (!mmrt_oc_same_shape(s, d)) {
        char a[96], b[96];
        return MMRT_OC_BAD(c, "dst %s and %s %s must have the same shape",
                           mmrt_pv_shape_str(d->n_dims, d->ne, a, sizeof a), what,
                           mmrt_pv_shape_str(s->n_dims, s->ne, b, sizeof b));
    }
    return mmrt_oc_disjoint(c, what, s, d, true);
}

/* An optional per-column weight (norm weight and bias, a MATMUL or PATCH_EMBED bias): weight
 * dtype, contiguous, n elements, apart from dst. */
static inline mmrt_status mmrt_oc_row_weight(struct mmrt_oc *c, const char *what,
                                             const struct mmrt_pv_shape *w, int64_t n,
                                             const struct mmrt_pv_shape *d)
{
    if (!w)
        return MMRT_OK;
    MMRT_OC_TRY(mmrt_oc_dense(c, what, w, MMRT_OC_WEIGHT));
    if (w->numel != n)
        return MMRT_OC_BAD(c, "%s has %" PRId64 " elements, expected %" PRId64, what, w->numel, n);
    return mmrt_oc_disjoint(c, what, w, d, false);
}

/* ---- per op --------------------------------------------------------------------------- */

static inline mmrt_status mmrt_oc_matmul(struct mmrt_oc *c, const struct mmrt_pv_shape *const *s,
                                         const struct mmrt_pv_shape *y)
{
    const struct mmrt_pv_shape *x = s[0], *w = s[1], *b = s[2], *sc = s[3], *z = s[4];
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0 (x)", x, MMRT_OC_F32));
    MMRT_OC_TRY(mmrt_oc_rank(c, "src1 (W)", w, 2));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1 (W)", w,
                              MMRT_OC_WEIGHT | (1u << MMRT_DTYPE_I8) | (1u << MMRT_DTYPE_U4)));
    const int64_t K = mmrt_oc_inner(x), N = w->ne[0];
    if (w->dtype == MMRT_DTYPE_U4) {
        int64_t G;
        if (!sc || !z)
            return MMRT_OC_BAD(c, "src1 (W) is U4 but src%d (%s) is absent", sc ? 4 : 3,
                               sc ? "zero points" : "scales");
        if (mmrt_pv_u4_w(K, w->ne, c->why, c->size) != MMRT_OK)
            return MMRT_ERR_INVALID_ARG;
        MMRT_OC_TRY(mmrt_oc_dense(c, "src3 (scales)", sc, MMRT_OC_F32));
        MMRT_OC_TRY(mmrt_oc_rank(c, "src3 (scales)", sc, 2));
        MMRT_OC_TRY(mmrt_oc_dense(c, "src4 (zero points)", z, MMRT_OC_F32));
        MMRT_OC_TRY(mmrt_oc_rank(c, "src4 (zero points)", z, 2));
        if (mmrt_pv_u4_groups(K, N, sc->ne, z->ne, &G, c->why, c->size) != MMRT_OK)
            return MMRT_ERR_INVALID_ARG;
    } else {
        if (w->ne[1] != K)
            return MMRT_OC_BAD(c, "src1 (W) is [%" PRId64 ", %" PRId64 "] but x's inner dim is %"
                               PRId64, N, w->ne[1], K);
        if (z)
            return MMRT_OC_BAD(c, "src4 (zero points) goes only with a U4 W");
        if (w->dtype == MMRT_DTYPE_I8) {
            if (!sc)
                return MMRT_OC_BAD(c, "src1 (W) is I8 but src3 (scales) is absent");
            MMRT_OC_TRY(mmrt_oc_dense(c, "src3 (scales)", sc, MMRT_OC_F32));
            if (sc->numel != N)
                return MMRT_OC_BAD(c, "src3 (scales) has %" PRId64 " elements, W has %" PRId64
                                   " rows", sc->numel, N);
        } else if (sc) {
            return MMRT_OC_BAD(c, "src3 (scales) goes only with an I8 or U4 W");
        }
    }
    MMRT_OC_TRY(mmrt_oc_row_weight(c, "src2 (bias)", b, N, y));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_F32));
    if (mmrt_oc_rows(y) != mmrt_oc_rows(x) || mmrt_oc_inner(y) != N)
        return MMRT_OC_BAD(c, "dst must be [%" PRId64 " rows, %" PRId64 "], got %" PRId64
                           " rows of %" PRId64, mmrt_oc_rows(x), N, mmrt_oc_rows(y),
                           mmrt_oc_inner(y));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (x)", x, y, false));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src1 (W)", w, y, false));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src3 (scales)", sc, y, false));
    return mmrt_oc_disjoint(c, "src4 (zero points)", z, y, false);
}

/* ADD / MUL: src1 has src0's shape, or is one row of its inner size broadcast over the rows. */
static inline mmrt_status mmrt_oc_binary(struct mmrt_oc *c, const struct mmrt_pv_shape *const *s,
                                         const struct mmrt_pv_shape *y)
{
    const struct mmrt_pv_shape *a = s[0], *b = s[1];
    MMRT_OC_TRY(mmrt_oc_same_f32(c, "src0", a, y));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1", b, MMRT_OC_WEIGHT));
    bool same = mmrt_oc_same_shape(a, b);
    if (!same && !(b->numel == mmrt_oc_inner(a) && mmrt_oc_inner(b) == mmrt_oc_inner(a)))
        return MMRT_OC_BAD(c, "src1 (%" PRId64 " elements, inner %" PRId64 ") must have src0's "
                           "shape or be one row of its inner size %" PRId64, b->numel,
                           mmrt_oc_inner(b), mmrt_oc_inner(a));
    return mmrt_oc_disjoint(c, "src1", b, y, same);
}

static inline mmrt_status mmrt_oc_norm(struct mmrt_oc *c, int op,
                                       const struct mmrt_pv_shape *const *s,
                                       const struct mmrt_pv_shape *y, const void *params,
                                       uint32_t params_size)
{
    MMRT_OC_TRY(mmrt_oc_params(c, params, params_size, sizeof(struct mmrt_norm_params)));
    struct mmrt_norm_params p;
    memcpy(&p, params, sizeof p);
    if (mmrt_pv_norm_eps(p.eps, c->why, c->size) != MMRT_OK)
        return MMRT_ERR_INVALID_ARG;
    MMRT_OC_TRY(mmrt_oc_same_f32(c, "src0", s[0], y));
    const int64_t n = mmrt_oc_inner(s[0]);
    MMRT_OC_TRY(mmrt_oc_row_weight(c, "src1 (weight)", s[1], n, y));
    return op == MMRT_OP_LAYERNORM ? mmrt_oc_row_weight(c, "src2 (bias)", s[2], n, y) : MMRT_OK;
}

/* The operands ROPE and ROPE_MULTI share: x F32 [T, H, D] with a contiguous inner dim,
 * positions contiguous I32 [T] (n_axes 0: ROPE) or [T, n_axes], dst of x's shape, contiguous
 * or exactly x; then n_rot and theta. */
static inline mmrt_status mmrt_oc_rope_operands(struct mmrt_oc *c,
                                                const struct mmrt_pv_shape *const *s,
                                                const struct mmrt_pv_shape *y, int n_axes,
                                                int32_t n_rot, float theta)
{
    const struct mmrt_pv_shape *x = s[0], *pos = s[1];
    MMRT_OC_TRY(mmrt_oc_rank(c, "src0 (x)", x, 3));
    MMRT_OC_TRY(mmrt_oc_dtype(c, "src0 (x)", x, MMRT_OC_F32));
    MMRT_OC_TRY(mmrt_oc_inner_contig(c, "src0 (x)", x));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1 (positions)", pos, MMRT_OC_I32));
    MMRT_OC_TRY(mmrt_oc_dtype(c, "dst", y, MMRT_OC_F32));
    const int64_t T = x->ne[0];
    if (!mmrt_oc_same_shape(x, y))
        return MMRT_OC_BAD(c, "dst must have x's shape [%" PRId64 ", %" PRId64 ", %" PRId64 "]",
                           T, x->ne[1], x->ne[2]);
    bool in_place = x->buffer == y->buffer && x->offset == y->offset &&
                    memcmp(x->nb, y->nb, sizeof x->nb) == 0;
    if (!in_place)
        MMRT_OC_TRY(mmrt_oc_contiguous(c, "dst (unless it is x itself)", y));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (x)", x, y, true));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src1 (positions)", pos, y, false));
    if (n_axes == 0 && pos->numel != T)
        return MMRT_OC_BAD(c, "src1 (positions) has %" PRId64 " entries for %" PRId64 " tokens",
                           pos->numel, T);
    if (n_axes > 0 && (pos->n_dims != 2 || pos->ne[0] != T || pos->ne[1] != n_axes))
        return MMRT_OC_BAD(c, "src1 (positions) must be [T, n_axes] = [%" PRId64 ", %d]", T,
                           n_axes);
    return mmrt_pv_rope_rot(n_rot, x->ne[2], theta, c->why, c->size) == MMRT_OK
               ? MMRT_OK
               : MMRT_ERR_INVALID_ARG;
}

static inline mmrt_status mmrt_oc_rope_multi(struct mmrt_oc *c,
                                             const struct mmrt_pv_shape *const *s,
                                             const struct mmrt_pv_shape *y, const void *params,
                                             uint32_t params_size)
{
    MMRT_OC_TRY(mmrt_oc_params(c, params, params_size, sizeof(struct mmrt_rope_multi_params)));
    struct mmrt_rope_multi_params p;
    memcpy(&p, params, sizeof p);
    if (p.n_axes < 1 || p.n_axes > MMRT_ROPE_MAX_AXES)
        return MMRT_OC_BAD(c, "n_axes %" PRId32 " is outside 1…%d", p.n_axes, MMRT_ROPE_MAX_AXES);
    MMRT_OC_TRY(mmrt_oc_rope_operands(c, s, y, p.n_axes, p.n_rot, p.theta));
    if (p.freq_dim < 1)
        return MMRT_OC_BAD(c, "freq_dim %" PRId32 " must be ≥ 1", p.freq_dim);
    if (p.restart != 0 && p.restart != 1)
        return MMRT_OC_BAD(c, "restart %" PRId32 " must be 0 or 1", p.restart);
    int64_t pairs = 0;
    for (int a = 0; a < p.n_axes; a++) {
        if (p.sections[a] < 0)
            return MMRT_OC_BAD(c, "section %d has %" PRId32 " pairs (must be ≥ 0)", a,
                               p.sections[a]);
        pairs += p.sections[a];
    }
    if (pairs != p.n_rot / 2)
        return MMRT_OC_BAD(c, "sections sum to %" PRId64 " pairs, n_rot/2 is %" PRId32, pairs,
                           p.n_rot / 2);
    return MMRT_OK;
}

/* An I32 index vector of n entries, contiguous, apart from dst. */
static inline mmrt_status mmrt_oc_index(struct mmrt_oc *c, const char *what,
                                        const struct mmrt_pv_shape *s, int64_t n,
                                        const struct mmrt_pv_shape *y)
{
    MMRT_OC_TRY(mmrt_oc_dense(c, what, s, MMRT_OC_I32));
    if (s->numel != n)
        return MMRT_OC_BAD(c, "%s has %" PRId64 " entries, expected %" PRId64, what, s->numel, n);
    return mmrt_oc_disjoint(c, what, s, y, false);
}

/* The row scales of an I8 store (plugin.h "I8 with row scales"): present exactly when the
 * store is I8, then F32, contiguous, one per row of `rows`, and apart from y. */
static inline mmrt_status mmrt_oc_row_scales(struct mmrt_oc *c, const char *what,
                                             const struct mmrt_pv_shape *sc,
                                             const char *store_what,
                                             const struct mmrt_pv_shape *store, int64_t rows,
                                             const struct mmrt_pv_shape *y)
{
    if (store->dtype != MMRT_DTYPE_I8) {
        if (sc)
            return MMRT_OC_BAD(c, "%s is given but %s is %s (scales go with an I8 store only)",
                               what, store_what, mmrt_dtype_name_of(store->dtype));
        return MMRT_OK;
    }
    if (!sc)
        return MMRT_OC_BAD(c, "%s is I8 and needs its row scales as %s", store_what, what);
    MMRT_OC_TRY(mmrt_oc_dense(c, what, sc, MMRT_OC_F32));
    if (sc->numel != rows)
        return MMRT_OC_BAD(c, "%s has %" PRId64 " scales, %s has %" PRId64 " rows", what,
                           sc->numel, store_what, rows);
    return mmrt_oc_disjoint(c, what, sc, y, false);
}

/* What ATTENTION and ATTENTION_PAGED share: q, dst, the heads, the param values. */
static inline mmrt_status mmrt_oc_attention_common(struct mmrt_oc *c,
                                                   const struct mmrt_pv_shape *q,
                                                   const struct mmrt_pv_shape *y,
                                                   const struct mmrt_attention_params *p,
                                                   int64_t Hkv, int64_t Dk)
{
    MMRT_OC_TRY(mmrt_oc_rank(c, "src0 (q)", q, 3));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0 (q)", q, MMRT_OC_F32));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_F32));
    if (!mmrt_oc_same_shape(q, y))
        return MMRT_OC_BAD(c, "dst must have q's shape");
    if (Dk != q->ne[2])
        return MMRT_OC_BAD(c, "the keys' head dim %" PRId64 " differs from q's %" PRId64, Dk,
                           q->ne[2]);
    if (mmrt_pv_attention_heads(q->ne[1], Hkv, q->ne[2], c->why, c->size) != MMRT_OK ||
        mmrt_pv_attention_values(p, c->why, c->size) != MMRT_OK)
        return MMRT_ERR_INVALID_ARG;
    if (p->n_seq < 1)
        return MMRT_OC_BAD(c, "n_seq %" PRId32 " must be ≥ 1", p->n_seq);
    return mmrt_oc_disjoint(c, "src0 (q)", q, y, false);
}

static inline mmrt_status mmrt_oc_attention(struct mmrt_oc *c,
                                            const struct mmrt_pv_shape *const *s,
                                            const struct mmrt_pv_shape *y,
                                            const struct mmrt_attention_params *p)
{
    const struct mmrt_pv_shape *q = s[0], *k = s[1], *v = s[2], *cq = s[3], *ck = s[4];
    static const char *const names[2] = { "src1 (k)", "src2 (v)" };
    for (int i = 0; i < 2; i++) {
        MMRT_OC_TRY(mmrt_oc_rank(c, names[i], s[1 + i], 3));
        MMRT_OC_TRY(mmrt_oc_dtype(c, names[i], s[1 + i], MMRT_OC_KV));
        MMRT_OC_TRY(mmrt_oc_inner_contig(c, names[i], s[1 + i]));
    }
    if (!mmrt_oc_same_shape(k, v)) {
        char a[96], b[96];
        return MMRT_OC_BAD(c, "src1 (k) %s and src2 (v) %s must have one shape [S, Hkv, D]",
                           mmrt_pv_shape_str(3, k->ne, a, sizeof a),
                           mmrt_pv_shape_str(3, v->ne, b, sizeof b));
    }
    MMRT_OC_TRY(mmrt_oc_attention_common(c, q, y, p, k->ne[1], k->ne[2]));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src1 (k)", k, y, false));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src2 (v)", v, y, false));
    if (!cq != !ck)
        return MMRT_OC_BAD(c, "give both cu_seqlens_q and cu_seqlens_k, or neither");
    if (!cq) {
        if (p->n_seq != 1)
            return MMRT_OC_BAD(c, "n_seq %" PRId32 " must be 1 without cu_seqlens", p->n_seq);
        if (q->ne[0] > INT32_MAX || k->ne[0] > INT32_MAX)
            return MMRT_OC_BAD(c, "%" PRId64 " queries / %" PRId64 " keys exceed I32 sequence "
                               "offsets", q->ne[0], k->ne[0]);
        return MMRT_OK;
    }
    MMRT_OC_TRY(mmrt_oc_index(c, "src3 (cu_seqlens_q)", cq, (int64_t)p->n_seq + 1, y));
    return mmrt_oc_index(c, "src4 (cu_seqlens_k)", ck, (int64_t)p->n_seq + 1, y);
}

static inline mmrt_status mmrt_oc_attention_paged(struct mmrt_oc *c,
                                                  const struct mmrt_pv_shape *const *s,
                                                  const struct mmrt_pv_shape *y,
                                                  const struct mmrt_attention_params *p)
{
    const struct mmrt_pv_shape *q = s[0], *k = s[1], *v = s[2], *table = s[5];
    MMRT_OC_TRY(mmrt_oc_rank(c, "src1 (k_pages)", k, 4));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1 (k_pages)", k, MMRT_OC_KV_PAGES));
    MMRT_OC_TRY(mmrt_oc_contiguous(c, "src2 (v_pages)", v));
    if (!mmrt_oc_same_shape(k, v) || v->dtype != k->dtype)
        return MMRT_OC_BAD(c, "src2 (v_pages) must have k_pages' shape and dtype");
    if (k->ne[0] < 1 || k->ne[1] < 1)
        return MMRT_OC_BAD(c, "src1 (k_pages) holds %" PRId64 " pages of %" PRId64 " tokens "
                           "(need ≥ 1 of ≥ 1)", k->ne[0], k->ne[1]);
    MMRT_OC_TRY(mmrt_oc_attention_common(c, q, y, p, k->ne[2], k->ne[3]));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src1 (k_pages)", k, y, false));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src2 (v_pages)", v, y, false));
    MMRT_OC_TRY(mmrt_oc_index(c, "src3 (cu_seqlens_q)", s[3], (int64_t)p->n_seq + 1, y));
    MMRT_OC_TRY(mmrt_oc_index(c, "src4 (kv_lens)", s[4], p->n_seq, y));
    MMRT_OC_TRY(mmrt_oc_rank(c, "src5 (page_table)", table, 2));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src5 (page_table)", table, MMRT_OC_I32));
    if (table->ne[0] != p->n_seq || table->ne[1] < 1)
        return MMRT_OC_BAD(c, "src5 (page_table) must be [n_seq = %" PRId32 ", max_pages ≥ 1], "
                           "got [%" PRId64 ", %" PRId64 "]", p->n_seq, table->ne[0],
                           table->ne[1]);
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src5 (page_table)", table, y, false));
    MMRT_OC_TRY(mmrt_oc_row_scales(c, "src6 (k_scales)", s[6], "src1 (k_pages)", k,
                                   mmrt_oc_rows(k), y));
    return mmrt_oc_row_scales(c, "src7 (v_scales)", s[7], "src2 (v_pages)", v,
                              mmrt_oc_rows(v), y);
}

static inline mmrt_status mmrt_oc_patch_embed(struct mmrt_oc *c,
                                              const struct mmrt_pv_shape *const *s,
                                              const struct mmrt_pv_shape *y, const void *params,
                                              uint32_t params_size)
{
    const struct mmrt_pv_shape *img = s[0], *w = s[1];
    MMRT_OC_TRY(mmrt_oc_params(c, params, params_size, sizeof(struct mmrt_patch_params)));
    struct mmrt_patch_params p;
    memcpy(&p, params, sizeof p);
    MMRT_OC_TRY(mmrt_oc_rank(c, "src0 (image)", img, 4));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0 (image)", img, MMRT_OC_F32));
    MMRT_OC_TRY(mmrt_oc_rank(c, "src1 (weight)", w, 4));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1 (weight)", w, MMRT_OC_WEIGHT));
    const int64_t P = p.patch;
    if (P < 1 || img->ne[2] % P != 0 || img->ne[3] % P != 0)
        return MMRT_OC_BAD(c, "patch %" PRId64 " must be ≥ 1 and divide the image's H %" PRId64
                           " and W %" PRId64, P, img->ne[2], img->ne[3]);
    if (w->ne[1] != img->ne[1] || w->ne[2] != P || w->ne[3] != P)
        return MMRT_OC_BAD(c, "src1 (weight) is [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                           "], expected [O, C = %" PRId64 ", %" PRId64 ", %" PRId64 "]", w->ne[0],
                           w->ne[1], w->ne[2], w->ne[3], img->ne[1], P, P);
    MMRT_OC_TRY(mmrt_oc_row_weight(c, "src2 (bias)", s[2], w->ne[0], y));
    MMRT_OC_TRY(mmrt_oc_rank(c, "dst", y, 3));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_F32));
    const int64_t np = (img->ne[2] / P) * (img->ne[3] / P);
    if (y->ne[0] != img->ne[0] || y->ne[1] != np || y->ne[2] != w->ne[0])
        return MMRT_OC_BAD(c, "dst must be [%" PRId64 ", %" PRId64 ", %" PRId64 "] (B, patches, "
                           "O)", img->ne[0], np, w->ne[0]);
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (image)", img, y, false));
    return mmrt_oc_disjoint(c, "src1 (weight)", w, y, false);
}

static inline mmrt_status mmrt_oc_concat(struct mmrt_oc *c, const struct mmrt_pv_shape *const *s,
                                         const struct mmrt_pv_shape *d, const void *params,
                                         uint32_t params_size)
{
    const struct mmrt_pv_shape *a = s[0], *b = s[1];
    MMRT_OC_TRY(mmrt_oc_params(c, params, params_size, sizeof(struct mmrt_concat_params)));
    struct mmrt_concat_params p;
    memcpy(&p, params, sizeof p);
    if (a->dtype != d->dtype || b->dtype != d->dtype)
        return MMRT_OC_BAD(c, "src0 (%s), src1 (%s) and dst (%s) must share one dtype",
                           mmrt_dtype_name_of(a->dtype), mmrt_dtype_name_of(b->dtype),
                           mmrt_dtype_name_of(d->dtype));
    MMRT_OC_TRY(mmrt_oc_dtype(c, "dst", d, MMRT_OC_WEIGHT | MMRT_OC_I32));
    MMRT_OC_TRY(mmrt_oc_contiguous(c, "dst", d));
    if (a->n_dims != d->n_dims || b->n_dims != d->n_dims)
        return MMRT_OC_BAD(c, "src0, src1 and dst must share one rank");
    if (p.axis < 0 || p.axis >= d->n_dims)
        return MMRT_OC_BAD(c, "axis %" PRId32 " is outside 0…%d", p.axis, d->n_dims - 1);
    for (int i = 0; i < d->n_dims; i++) {
        bool ok = i == p.axis ? d->ne[i] == a->ne[i] + b->ne[i]
                              : a->ne[i] == d->ne[i] && b->ne[i] == d->ne[i];
        if (!ok)
            return MMRT_OC_BAD(c, "dim %d: src0 %" PRId64 " + src1 %" PRId64 " vs dst %" PRId64
                               " (axis %" PRId32 ")", i, a->ne[i], b->ne[i], d->ne[i], p.axis);
    }
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0", a, d, false));
    return mmrt_oc_disjoint(c, "src1", b, d, false);
}

/* COPY converts between F32, F16 and BF16 and copies I32 to I32; same-size dtypes may convert
 * in place (each element is read, then written). */
static inline mmrt_status mmrt_oc_copy(struct mmrt_oc *c, const struct mmrt_pv_shape *const *s,
                                       const struct mmrt_pv_shape *d)
{
    const struct mmrt_pv_shape *a = s[0];
    if (!mmrt_oc_same_shape(a, d))
        return MMRT_OC_BAD(c, "dst must have src0's extents");
    const unsigned ok = MMRT_OC_WEIGHT | MMRT_OC_I32;
    if (!(ok & (1u << a->dtype)) || !(ok & (1u << d->dtype)) ||
        (a->dtype == MMRT_DTYPE_I32) != (d->dtype == MMRT_DTYPE_I32))
        return MMRT_OC_BAD(c, "cannot convert %s to %s (COPY converts among F32/F16/BF16 and "
                           "copies I32 only to I32)", mmrt_dtype_name_of(a->dtype),
                           mmrt_dtype_name_of(d->dtype));
    bool same_size = mmrt_dtype_size((enum mmrt_dtype)a->dtype) ==
                     mmrt_dtype_size((enum mmrt_dtype)d->dtype);
    return mmrt_oc_disjoint(c, "src0", a, d, same_size);
}

static inline mmrt_status mmrt_oc_rows_op(struct mmrt_oc *c, int op,
                                          const struct mmrt_pv_shape *const *s,
                                          const struct mmrt_pv_shape *y)
{
    const struct mmrt_pv_shape *x = s[0];
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0", x, MMRT_OC_F32));
    const int64_t rows = mmrt_oc_rows(x), n = mmrt_oc_inner(x);
    if (op == MMRT_OP_ARGMAX) {
        MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_I32));
        if (n == 0 && rows > 0)
            return MMRT_OC_BAD(c, "src0 rows are empty: no maximum to find");
        if (n > INT32_MAX)
            return MMRT_OC_BAD(c, "rows of %" PRId64 " elements do not fit I32 indices", n);
    } else { /* L2_NORM: dst always 1-D */
        MMRT_OC_TRY(mmrt_oc_rank(c, "dst", y, 1));
        MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_F32));
    }
    if (y->numel != rows)
        return MMRT_OC_BAD(c, "dst has %" PRId64 " elements, src0 has %" PRId64 " rows", y->numel,
                           rows);
    return mmrt_oc_disjoint(c, "src0", x, y, false);
}

static inline mmrt_status mmrt_oc_get_rows(struct mmrt_oc *c,
                                           const struct mmrt_pv_shape *const *s,
                                           const struct mmrt_pv_shape *y)
{
    const struct mmrt_pv_shape *tab = s[0], *ids = s[1];
    MMRT_OC_TRY(mmrt_oc_rank(c, "src0 (table)", tab, 2));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0 (table)", tab, MMRT_OC_WEIGHT));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1 (ids)", ids, MMRT_OC_I32));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_F32));
    if (mmrt_oc_rows(y) != ids->numel || mmrt_oc_inner(y) != tab->ne[1])
        return MMRT_OC_BAD(c, "dst must be [%" PRId64 " rows, %" PRId64 "], got %" PRId64
                           " rows of %" PRId64, ids->numel, tab->ne[1], mmrt_oc_rows(y),
                           mmrt_oc_inner(y));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (table)", tab, y, false));
    return mmrt_oc_disjoint(c, "src1 (ids)", ids, y, false);
}

static inline mmrt_status mmrt_oc_set_rows(struct mmrt_oc *c,
                                           const struct mmrt_pv_shape *const *s,
                                           const struct mmrt_pv_shape *d)
{
    const struct mmrt_pv_shape *v = s[0];
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0 (values)", v, MMRT_OC_F32));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", d, MMRT_OC_STORE));
    MMRT_OC_TRY(mmrt_oc_rank(c, "dst", d, v->n_dims));
    for (int i = 1; i < v->n_dims; i++)
        if (d->ne[i] != v->ne[i])
            return MMRT_OC_BAD(c, "dim %d: dst has %" PRId64 ", src0 (values) %" PRId64 " (the "
                               "inner extents must match)", i, d->ne[i], v->ne[i]);
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (values)", v, d, false));
    MMRT_OC_TRY(mmrt_oc_index(c, "src1 (idx)", s[1], v->ne[0], d));
    if (d->dtype == MMRT_DTYPE_I8 && d->n_dims < 2)
        return MMRT_OC_BAD(c, "an I8 dst needs rank ≥ 2 (its scales are per innermost row)");
    MMRT_OC_TRY(mmrt_oc_row_scales(c, "src2 (scales)", s[2], "dst", d, mmrt_oc_rows(d), d));
    if (s[2]) { /* written too: apart from what is read */
        MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (values)", v, s[2], false));
        MMRT_OC_TRY(mmrt_oc_disjoint(c, "src1 (idx)", s[1], s[2], false));
    }
    return MMRT_OK;
}

static inline mmrt_status mmrt_oc_gather_heads(struct mmrt_oc *c,
                                               const struct mmrt_pv_shape *const *s,
                                               const struct mmrt_pv_shape *y)
{
    const struct mmrt_pv_shape *tab = s[0], *idx = s[1];
    MMRT_OC_TRY(mmrt_oc_rank(c, "src0 (table)", tab, 3));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src0 (table)", tab, MMRT_OC_STORE));
    MMRT_OC_TRY(mmrt_oc_rank(c, "src1 (idx)", idx, 3));
    MMRT_OC_TRY(mmrt_oc_dense(c, "src1 (idx)", idx, MMRT_OC_I32));
    MMRT_OC_TRY(mmrt_oc_rank(c, "dst", y, 3));
    MMRT_OC_TRY(mmrt_oc_dense(c, "dst", y, MMRT_OC_F32));
    const int64_t H = tab->ne[1], D = tab->ne[2], N = idx->ne[0];
    if (idx->ne[1] != H)
        return MMRT_OC_BAD(c, "src1 (idx) has %" PRId64 " heads, src0 (table) %" PRId64,
                           idx->ne[1], H);
    if (idx->ne[2] < 1)
        return MMRT_OC_BAD(c, "src1 (idx) has no entries per group (G = 0; G must be ≥ 1)");
    if (y->ne[0] != N || y->ne[1] != H || y->ne[2] != D)
        return MMRT_OC_BAD(c, "dst must be [N %" PRId64 ", H %" PRId64 ", D %" PRId64 "], got [%"
                           PRId64 ", %" PRId64 ", %" PRId64 "]", N, H, D, y->ne[0], y->ne[1],
                           y->ne[2]);
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src0 (table)", tab, y, false));
    MMRT_OC_TRY(mmrt_oc_disjoint(c, "src1 (idx)", idx, y, false));
    return mmrt_oc_row_scales(c, "src2 (scales)", s[2], "src0 (table)", tab, mmrt_oc_rows(tab),
                              y);
}

/* Checks one launch of `op` against plugin.h: n_src sources (src[i] NULL for an absent
 * optional one), dst, the params. On failure returns MMRT_ERR_INVALID_ARG with the reason in
 * why[why_size] (without the op's name). */
static inline mmrt_status mmrt_op_check(int op, int n_src, const struct mmrt_pv_shape *const *src,
                                        const struct mmrt_pv_shape *dst, const void *params,
                                        uint32_t params_size, char *why, size_t why_size)
{
    struct mmrt_oc c = { why, why_size };
    int min, max;
    if (!mmrt_oc_arity(op, &min, &max))
        return MMRT_OC_BAD(&c, "unknown operator %d", op);
    if (n_src < min || n_src > MMRT_MAX_SRC_ALL)
        return MMRT_OC_BAD(&c, "n_src is %d, expected %d…%d", n_src, min, max);
    const struct mmrt_pv_shape *s[MMRT_MAX_SRC_ALL] = { 0 };
    for (int i = 0; i < n_src; i++) {
        if (!src[i] && i < min)
            return MMRT_OC_BAD(&c, "src%d is required but absent", i);
        if (src[i] && i >= max)
            return MMRT_OC_BAD(&c, "src%d is given but the op takes %d sources at most", i, max);
        s[i] = src[i];
    }
    if (!dst)
        return MMRT_OC_BAD(&c, "dst is absent");
    struct mmrt_attention_params ap;
    switch (op) {
    case MMRT_OP_MATMUL:
        return mmrt_oc_matmul(&c, s, dst);
    case MMRT_OP_ADD:
    case MMRT_OP_MUL:
        return mmrt_oc_binary(&c, s, dst);
    case MMRT_OP_SCALE:
    case MMRT_OP_SOFTMAX: {
        MMRT_OC_TRY(mmrt_oc_params(&c, params, params_size, sizeof(struct mmrt_scale_params)));
        struct mmrt_scale_params p;
        memcpy(&p, params, sizeof p);
        if (!isfinite(p.scale))
            return MMRT_OC_BAD(&c, "scale %g is not finite", (double)p.scale);
        return mmrt_oc_same_f32(&c, "src0", s[0], dst);
    }
    case MMRT_OP_LAYERNORM:
    case MMRT_OP_RMSNORM:
        return mmrt_oc_norm(&c, op, s, dst, params, params_size);
    case MMRT_OP_GELU:
    case MMRT_OP_GELU_TANH:
    case MMRT_OP_QUICK_GELU:
    case MMRT_OP_SILU:
    case MMRT_OP_RELU2:
        return mmrt_oc_same_f32(&c, "src0", s[0], dst);
    case MMRT_OP_SWIGLU:
        MMRT_OC_TRY(mmrt_oc_same_f32(&c, "src0", s[0], dst));
        return mmrt_oc_same_f32(&c, "src1", s[1], dst);
    case MMRT_OP_ROPE: {
        MMRT_OC_TRY(mmrt_oc_params(&c, params, params_size, sizeof(struct mmrt_rope_params)));
        struct mmrt_rope_params p;
        memcpy(&p, params, sizeof p);
        MMRT_OC_TRY(mmrt_oc_rope_operands(&c, s, dst, 0, p.n_rot, p.theta));
        return mmrt_pv_rope_mode(p.mode, why, why_size) == MMRT_OK ? MMRT_OK
                                                                   : MMRT_ERR_INVALID_ARG;
    }
    case MMRT_OP_ROPE_MULTI:
        return mmrt_oc_rope_multi(&c, s, dst, params, params_size);
    case MMRT_OP_ATTENTION:
    case MMRT_OP_ATTENTION_PAGED:
        /* An ABI 1.4 caller's params end before window, which then reads as 0. */
        if (mmrt_pv_attention_params(params, params_size, &ap, why, why_size) != MMRT_OK)
            return MMRT_ERR_INVALID_ARG;
        return op == MMRT_OP_ATTENTION ? mmrt_oc_attention(&c, s, dst, &ap)
                                       : mmrt_oc_attention_paged(&c, s, dst, &ap);
    case MMRT_OP_GET_ROWS:
        return mmrt_oc_get_rows(&c, s, dst);
    case MMRT_OP_PATCH_EMBED:
        return mmrt_oc_patch_embed(&c, s, dst, params, params_size);
    case MMRT_OP_CONCAT:
        return mmrt_oc_concat(&c, s, dst, params, params_size);
    case MMRT_OP_COPY:
        return mmrt_oc_copy(&c, s, dst);
    case MMRT_OP_ARGMAX:
    case MMRT_OP_L2_NORM:
        return mmrt_oc_rows_op(&c, op, s, dst);
    case MMRT_OP_SET_ROWS:
        return mmrt_oc_set_rows(&c, s, dst);
    case MMRT_OP_GATHER_HEADS:
        return mmrt_oc_gather_heads(&c, s, dst);
    default:
        return MMRT_OC_BAD(&c, "unknown operator %d", op);
    }
}

/* ---- a launch as a plugin receives it ---------------------------------------------------- */

/* Finds the arena a descriptor names: NULL when `buffer` is none of the device's, else the
 * plugin's own handle for it (opaque here) with its size in *nbytes. Never dereferences
 * `buffer`. */
typedef const void *(*mmrt_oc_find_fn)(void *ctx, const void *buffer, uint64_t *nbytes);

/* A launch after mmrt_op_begin: every operand checked on its own and against the op. */
struct mmrt_oc_launch {
    int n_src;
    const struct mmrt_pv_shape *src[MMRT_MAX_SRC_ALL]; /* NULL: absent (or past n_src) */
    const void *src_arena[MMRT_MAX_SRC_ALL];          /* find()'s handle for each present one */
    struct mmrt_pv_shape dst;
    const void *dst_arena;
    const void *params;
    uint32_t params_size;
    struct mmrt_pv_shape shapes_[MMRT_MAX_SRC_ALL]; /* what src[] points into */
};

struct mmrt_oc_lookup_ {
    mmrt_oc_find_fn find;
    void *ctx;
    const void *found;
};

static inline bool mmrt_oc_lookup_(void *ctx, const void *buffer, uint64_t *nbytes)
{
    struct mmrt_oc_lookup_ *l = ctx;
    l->found = l->find(l->ctx, buffer, nbytes);
    return l->found != NULL;
}

/* What every in-tree plugin does on entry to an op, written once: reads args (honouring its
 * struct_size), checks it is a launch of `op` with n_required ≤ n_src ≤ n_max, that the
 * required sources and dst are present, each descriptor (plugin_views.h: mmrt_pv_check) and
 * that dst's strides do not make elements overlap, then holds the launch to the operator
 * contract (mmrt_op_check). On failure returns MMRT_ERR_INVALID_ARG with the reason in
 * why[why_size]; the plugin then turns *l into its own views. */
static inline mmrt_status mmrt_op_begin(const struct mmrt_op_args *args, int op, int n_required,
                                        int n_max, mmrt_oc_find_fn find, void *ctx,
                                        struct mmrt_oc_launch *l, char *why, size_t why_size)
{
    struct mmrt_oc c = { why, why_size };
    memset(l, 0, sizeof *l);
    if (!args)
        return MMRT_OC_BAD(&c, "no arguments");
    /* Everything before src_ext is ABI 1.0; copy only what the caller's struct holds, so
     * sources 6 and 7 read as NULL from an older writer (whose n_src is then ≤ 6). */
    struct mmrt_op_args a;
    memset(&a, 0, sizeof a);
    const size_t v10 = offsetof(struct mmrt_op_args, src_ext);
    if (args->hdr.abi_major != MMRT_ABI_MAJOR || args->hdr.struct_size < v10)
        return MMRT_OC_BAD(&c, "op_args has ABI %u (%u bytes), expected %d (≥ %zu bytes)",
                           args->hdr.abi_major, args->hdr.struct_size, MMRT_ABI_MAJOR, v10);
    memcpy(&a, args, args->hdr.struct_size < sizeof a ? args->hdr.struct_size : sizeof a);
    a.hdr.struct_size = (uint32_t)sizeof a;
    if (a.n_src > MMRT_MAX_SRC && args->hdr.struct_size < sizeof a)
        return MMRT_OC_BAD(&c, "n_src is %d but op_args (%u bytes) has no src_ext",
                           (int)a.n_src, args->hdr.struct_size);
    if (a.op != op)
        return MMRT_OC_BAD(&c, "launched as op %d (%s)", (int)a.op, mmrt_op_name_of(a.op));
    if (a.n_src < n_required || a.n_src > n_max)
        return MMRT_OC_BAD(&c, "n_src is %d, expected %d…%d", (int)a.n_src, n_required, n_max);
    l->n_src = a.n_src;
    struct mmrt_oc_lookup_ look = { find, ctx, NULL };
    for (int i = 0; i < a.n_src; i++) {
        char what[16];
        snprintf(what, sizeof what, "src%d", i);
        const struct mmrt_tensor *t = mmrt_op_args_src(&a, i);
        if (!t) {
            if (i < n_required)
                return MMRT_OC_BAD(&c, "%s is required but NULL", what);
            continue;
        }
        if (mmrt_pv_check(what, t, mmrt_oc_lookup_, &look, &l->shapes_[i], why,
                          why_size) != MMRT_OK)
            return MMRT_ERR_INVALID_ARG;
        l->src[i] = &l->shapes_[i];
        l->src_arena[i] = look.found;
    }
    if (!a.dst)
        return MMRT_OC_BAD(&c, "dst is NULL");
    if (mmrt_pv_check("dst", a.dst, mmrt_oc_lookup_, &look, &l->dst, why, why_size) != MMRT_OK)
        return MMRT_ERR_INVALID_ARG;
    l->dst_arena = look.found;
    if (!mmrt_pv_injective(l->dst.dtype, l->dst.n_dims, l->dst.ne, l->dst.nb))
        return MMRT_OC_BAD(&c, "dst: its strides make elements overlap");
    l->params = a.params;
    l->params_size = a.params_size;
    return mmrt_op_check(op, a.n_src, l->src, &l->dst, a.params, a.params_size, why, why_size);
}

#undef MMRT_OC_TRY
#undef MMRT_OC_BAD

#endif
