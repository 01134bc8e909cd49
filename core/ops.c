/*
 * core/ops.c — argument checks for every operator, then dispatch (see ops.h).
 *
 * The checks follow plugin.h's operator comments one for one; when an op's contract
 * changes there it changes here. Messages name the op, the operand ("src1 (w)") and the
 * extents involved, e.g. "MATMUL: w [64, 96] does not match x's inner dim 80".
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plugin_loader.h"
#include "plugin_views.h"

static int64_t numel(const struct mmrt_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

static int64_t inner(const struct mmrt_tensor *t)
{
    return t->ne[t->n_dims - 1];
}

/* Product of every extent but the innermost (so an [M, 0] tensor still has M rows). */
static int64_t rows(const struct mmrt_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims - 1; i++)
        n *= t->ne[i];
    return n;
}

static int contiguous(const struct mmrt_tensor *t)
{
    int64_t stride = (int64_t)mmrt_dtype_size((enum mmrt_dtype)t->dtype);
    for (int i = t->n_dims - 1; i >= 0; i--) {
        if (t->ne[i] != 1 && t->nb[i] != stride)
            return 0;
        stride *= t->ne[i];
    }
    return 1;
}

static int same_shape(const struct mmrt_tensor *a, const struct mmrt_tensor *b)
{
    if (a->n_dims != b->n_dims)
        return 0;
    for (int i = 0; i < a->n_dims; i++)
        if (a->ne[i] != b->ne[i])
            return 0;
    return 1;
}

static int is_weight_dtype(int32_t dt)
{
    return dt == MMRT_DTYPE_F32 || dt == MMRT_DTYPE_F16 || dt == MMRT_DTYPE_BF16;
}

/* The dtypes a KV cache may be stored in: what SET_ROWS writes and the attention ops read. */
static int is_kv_dtype(int32_t dt)
{
    return dt == MMRT_DTYPE_F32 || dt == MMRT_DTYPE_F16 || dt == MMRT_DTYPE_F8E4M3;
}

static void shape_str(const struct mmrt_tensor *t, char *buf, size_t size)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "%s [", mmrt_dtype_name_of(t->dtype));
    for (int i = 0; i < t->n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)t->ne[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* One failure message: "OP: what (operand shapes)". */
static mmrt_status bad(struct mmrt_error *err, enum mmrt_op op, const char *what,
                       const struct mmrt_tensor *t)
{
    char shape[160] = "";
    if (t)
        shape_str(t, shape, sizeof shape);
    return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: %s%s%s%s", mmrt_op_name(op), what,
                          t ? " (got " : "", shape, t ? ")" : "");
}

/* The structural checks every tensor gets: a sane descriptor. */
static mmrt_status check_tensor(enum mmrt_op op, const char *role, const struct mmrt_tensor *t,
                                struct mmrt_error *err)
{
    char what[96];
    if (t->hdr.abi_major != MMRT_ABI_MAJOR || t->n_dims < 1 || t->n_dims > MMRT_MAX_DIMS ||
        mmrt_dtype_size((enum mmrt_dtype)t->dtype) == 0 || !t->buffer) {
        snprintf(what, sizeof what, "%s is not a valid tensor descriptor", role);
        return bad(err, op, what, NULL);
    }
    for (int i = 0; i < t->n_dims; i++) {
        if (t->ne[i] < 0 || t->nb[i] < 0) {
            snprintf(what, sizeof what, "%s has a negative extent or stride", role);
            return bad(err, op, what, t);
        }
    }
    return MMRT_OK;
}

#define REQUIRE(cond, what, t)                                                                 \
    do {                                                                                       \
        if (!(cond))                                                                           \
            return bad(err, op, what, t);                                                      \
    } while (0)

static mmrt_status need_params(enum mmrt_op op, const void *params, uint32_t size,
                               uint32_t want, struct mmrt_error *err)
{
    if (!params || size < want) {
        char what[96];
        snprintf(what, sizeof what, "params missing or shorter than %u bytes", want);
        return bad(err, op, what, NULL);
    }
    return MMRT_OK;
}

static mmrt_status check_elementwise_binary(enum mmrt_op op, const struct mmrt_tensor *a,
                                            const struct mmrt_tensor *b,
                                            const struct mmrt_tensor *y, struct mmrt_error *err)
{
    REQUIRE(a->dtype == MMRT_DTYPE_F32 && contiguous(a), "src0 must be contiguous F32", a);
    REQUIRE(is_weight_dtype(b->dtype) && contiguous(b), "src1 must be contiguous F32/F16/BF16",
            b);
    REQUIRE(numel(b) == numel(a) || (numel(b) == inner(a) && inner(b) == inner(a)),
            "src1 must have src0's shape or be one row of its inner size", b);
    REQUIRE(y->dtype == MMRT_DTYPE_F32 && contiguous(y) && same_shape(a, y),
            "dst must be contiguous F32 with src0's shape", y);
    return MMRT_OK;
}

static mmrt_status check_same_f32(enum mmrt_op op, const struct mmrt_tensor *x,
                                  const struct mmrt_tensor *y, struct mmrt_error *err)
{
    REQUIRE(x->dtype == MMRT_DTYPE_F32 && contiguous(x), "src0 must be contiguous F32", x);
    REQUIRE(y->dtype == MMRT_DTYPE_F32 && contiguous(y) && same_shape(x, y),
            "dst must be contiguous F32 with src0's shape", y);
    return MMRT_OK;
}

static mmrt_status check_row_weight(enum mmrt_op op, const char *role,
                                    const struct mmrt_tensor *w, int64_t n,
                                    struct mmrt_error *err)
{
    char what[96];
    snprintf(what, sizeof what, "%s must be contiguous F32/F16/BF16 with %lld elements", role,
             (long long)n);
    REQUIRE(!w || (is_weight_dtype(w->dtype) && contiguous(w) && numel(w) == n), what, w);
    return MMRT_OK;
}

static int n_required_src(enum mmrt_op op)
{
    switch (op) {
    case MMRT_OP_MATMUL: case MMRT_OP_ADD: case MMRT_OP_MUL: case MMRT_OP_SWIGLU:
    case MMRT_OP_ROPE: case MMRT_OP_GET_ROWS: case MMRT_OP_PATCH_EMBED: case MMRT_OP_CONCAT:
    case MMRT_OP_ROPE_MULTI: case MMRT_OP_SET_ROWS: case MMRT_OP_GATHER_HEADS:
        return 2;
    case MMRT_OP_ATTENTION:
        return 3;
    case MMRT_OP_ATTENTION_PAGED:
        return 6;
    default:
        return 1;
    }
}

mmrt_status mmrt_op_validate(enum mmrt_op op, const struct mmrt_tensor *const *src, int n_src,
                             const struct mmrt_tensor *dst, const void *params,
                             uint32_t params_size, struct mmrt_error *err)
{
    if ((unsigned)op >= MMRT_OP_COUNT)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "unknown operator %d", (int)op);
    int need = n_required_src(op);
    if (n_src < need || n_src > MMRT_MAX_SRC || !dst)
        return bad(err, op, "too few sources or no dst", NULL);
    for (int i = 0; i < n_src; i++) {
        char role[16];
        snprintf(role, sizeof role, "src%d", i);
        if (!src[i]) {
            if (i < need)
                return bad(err, op, "a required source is NULL", NULL);
            continue;
        }
        mmrt_status st = check_tensor(op, role, src[i], err);
        if (st != MMRT_OK)
            return st;
    }
    mmrt_status st = check_tensor(op, "dst", dst, err);
    if (st != MMRT_OK)
        return st;

    const struct mmrt_tensor *a = src[0], *b = n_src > 1 ? src[1] : NULL,
                             *c = n_src > 2 ? src[2] : NULL, *y = dst;
    char why[160]; /* a parameter value the shared contract (plugin_views.h) refuses */
    switch (op) {
    case MMRT_OP_MATMUL:
        REQUIRE(a->dtype == MMRT_DTYPE_F32 && contiguous(a), "x must be contiguous F32", a);
        REQUIRE(b->n_dims == 2 && (is_weight_dtype(b->dtype) || b->dtype == MMRT_DTYPE_I8 ||
                                   b->dtype == MMRT_DTYPE_U4) && contiguous(b),
                "w must be a contiguous 2-D F32/F16/BF16/I8 [N, K] or U4 [N, K/2]", b);
        if (b->dtype == MMRT_DTYPE_U4)
            REQUIRE(inner(a) % 32 == 0 && b->ne[1] * 2 == inner(a),
                    "a U4 w must be [N, K/2] for an x inner dim K that is a multiple of 32", b);
        else
            REQUIRE(b->ne[1] == inner(a), "w's inner dim must equal x's inner dim", b);
        st = check_row_weight(op, "bias", c, b->ne[0], err);
        if (st != MMRT_OK)
            return st;
        {
            const struct mmrt_tensor *s = n_src > 3 ? src[3] : NULL;
            const struct mmrt_tensor *z = n_src > 4 ? src[4] : NULL;
            if (b->dtype == MMRT_DTYPE_I8) {
                REQUIRE(s && s->dtype == MMRT_DTYPE_F32 && contiguous(s) &&
                            numel(s) == b->ne[0],
                        "an I8 w needs src3 = its scales, contiguous F32 [N]", s);
                REQUIRE(!z, "src4 (zero points) goes only with a U4 w", z);
            } else if (b->dtype == MMRT_DTYPE_U4) {
                const int64_t K = inner(a);
                REQUIRE(s && s->dtype == MMRT_DTYPE_F32 && contiguous(s) && s->n_dims == 2 &&
                            s->ne[0] == b->ne[0] && s->ne[1] >= 1 && K % s->ne[1] == 0 &&
                            (K / s->ne[1]) % 32 == 0,
                        "a U4 w needs src3 = its group scales, contiguous F32 [N, G] with K / G "
                        "a multiple of 32", s);
                REQUIRE(z && z->dtype == MMRT_DTYPE_F32 && contiguous(z) && z->n_dims == 2 &&
                            z->ne[0] == s->ne[0] && z->ne[1] == s->ne[1],
                        "a U4 w needs src4 = its zero points, contiguous F32 of the scales' "
                        "shape", z);
            } else {
                REQUIRE(!s, "src3 (scales) goes only with an I8 or U4 w", s);
                REQUIRE(!z, "src4 (zero points) goes only with a U4 w", z);
            }
        }
        REQUIRE(y->dtype == MMRT_DTYPE_F32 && contiguous(y) && rows(y) == rows(a) &&
                    inner(y) == b->ne[0],
                "dst must be contiguous F32 [rows of x, N]", y);
        return MMRT_OK;
    case MMRT_OP_ADD:
    case MMRT_OP_MUL:
        return check_elementwise_binary(op, a, b, y, err);
    case MMRT_OP_SCALE:
    case MMRT_OP_SOFTMAX:
        st = need_params(op, params, params_size, sizeof(struct mmrt_scale_params), err);
        if (st != MMRT_OK)
            return st;
        REQUIRE(isfinite(((const struct mmrt_scale_params *)params)->scale),
                "scale must be finite", NULL);
        return check_same_f32(op, a, y, err);
    case MMRT_OP_LAYERNORM:
    case MMRT_OP_RMSNORM: {
        st = need_params(op, params, params_size, sizeof(struct mmrt_norm_params), err);
        if (st != MMRT_OK)
            return st;
        float eps = ((const struct mmrt_norm_params *)params)->eps;
        if (mmrt_pv_norm_eps(eps, why, sizeof why) != MMRT_OK)
            return bad(err, op, why, NULL);
        st = check_same_f32(op, a, y, err);
        if (st == MMRT_OK)
            st = check_row_weight(op, "weight", b, inner(a), err);
        if (st == MMRT_OK && op == MMRT_OP_LAYERNORM)
            st = check_row_weight(op, "bias", c, inner(a), err);
        return st;
    }
    case MMRT_OP_GELU:
    case MMRT_OP_GELU_TANH:
    case MMRT_OP_QUICK_GELU:
    case MMRT_OP_SILU:
    case MMRT_OP_RELU2:
        return check_same_f32(op, a, y, err);
    case MMRT_OP_SWIGLU:
        st = check_same_f32(op, a, y, err);
        if (st == MMRT_OK)
            st = check_same_f32(op, b, y, err);
        return st;
    case MMRT_OP_ROPE: {
        st = need_params(op, params, params_size, sizeof(struct mmrt_rope_params), err);
        if (st != MMRT_OK)
            return st;
        const struct mmrt_rope_params *p = params;
        REQUIRE(a->n_dims == 3 && a->dtype == MMRT_DTYPE_F32 && a->nb[2] == 4,
                "x must be F32 [T, H, D] with a contiguous inner dim", a);
        REQUIRE(b->dtype == MMRT_DTYPE_I32 && contiguous(b) && numel(b) == a->ne[0],
                "positions must be contiguous I32 [T]", b);
        REQUIRE(y->dtype == MMRT_DTYPE_F32 && same_shape(a, y) &&
                    (contiguous(y) || (y->buffer == a->buffer && y->offset == a->offset &&
                                       memcmp(y->nb, a->nb, sizeof y->nb) == 0)),
                "dst must be contiguous F32 with x's shape, or x itself", y);
        if (mmrt_pv_rope_rot(p->n_rot, a->ne[2], p->theta, why, sizeof why) != MMRT_OK ||
            mmrt_pv_rope_mode(p->mode, why, sizeof why) != MMRT_OK)
            return bad(err, op, why, NULL);
        return MMRT_OK;
    }
    case MMRT_OP_ROPE_MULTI: {
        st = need_params(op, params, params_size, sizeof(struct mmrt_rope_multi_params), err);
        if (st != MMRT_OK)
            return st;
        const struct mmrt_rope_multi_params *p = params;
        REQUIRE(p->n_axes >= 1 && p->n_axes <= MMRT_ROPE_MAX_AXES,
                "n_axes must be within 1…MMRT_ROPE_MAX_AXES", NULL);
        REQUIRE(a->n_dims == 3 && a->dtype == MMRT_DTYPE_F32 && a->nb[2] == 4,
                "x must be F32 [T, H, D] with a contiguous inner dim", a);
        REQUIRE(b->dtype == MMRT_DTYPE_I32 && contiguous(b) && b->n_dims == 2 &&
                    b->ne[0] == a->ne[0] && b->ne[1] == p->n_axes,
                "positions must be contiguous I32 [T, n_axes]", b);
        REQUIRE(y->dtype == MMRT_DTYPE_F32 && same_shape(a, y) &&
                    (contiguous(y) || (y->buffer == a->buffer && y->offset == a->offset &&
                                       memcmp(y->nb, a->nb, sizeof y->nb) == 0)),
                "dst must be contiguous F32 with x's shape, or x itself", y);
        if (mmrt_pv_rope_rot(p->n_rot, a->ne[2], p->theta, why, sizeof why) != MMRT_OK)
            return bad(err, op, why, NULL);
        REQUIRE(p->freq_dim >= 1, "freq_dim must be ≥ 1", NULL);
        REQUIRE(p->restart == 0 || p->restart == 1, "restart must be 0 or 1", NULL);
        int64_t pairs = 0;
        for (int i = 0; i < p->n_axes; i++) {
            REQUIRE(p->sections[i] >= 0, "sections must be ≥ 0", NULL);
            pairs += p->sections[i];
        }
        REQUIRE(pairs == p->n_rot / 2, "sections must sum to n_rot/2", NULL);
        return MMRT_OK;
    }
    case MMRT_OP_SET_ROWS:
        REQUIRE(a->dtype == MMRT_DTYPE_F32 && contiguous(a) && a->n_dims >= 1,
                "values must be contiguous F32 [T, …]", a);
        REQUIRE(b->dtype == MMRT_DTYPE_I32 && contiguous(b) && numel(b) == a->ne[0],
                "idx must be contiguous I32 [T]", b);
        REQUIRE((is_weight_dtype(y->dtype) || y->dtype == MMRT_DTYPE_F8E4M3) && contiguous(y) &&
                    y->n_dims == a->n_dims &&
                    memcmp(y->ne + 1, a->ne + 1, sizeof(int64_t) * (size_t)(a->n_dims - 1)) == 0,
                "dst must be contiguous F32/F16/BF16/F8E4M3 [R, …] with the values' inner extents",
                y);
        return MMRT_OK;
    case MMRT_OP_ATTENTION: {
        /* An ABI 1.4 caller's params end before window, which then reads as 0. */
        st = need_params(op, params, params_size, MMRT_ATTENTION_PARAMS_V14_SIZE, err);
        if (st != MMRT_OK)
            return st;
        struct mmrt_attention_params pv;
        mmrt_attention_params_read(params, params_size, &pv);
        const struct mmrt_attention_params *p = &pv;
        const struct mmrt_tensor *cq = n_src > 3 ? src[3] : NULL, *ck = n_src > 4 ? src[4] : NULL;
        REQUIRE(a->n_dims == 3 && a->dtype == MMRT_DTYPE_F32 && contiguous(a),
                "q must be contiguous F32 [T, Hq, D]", a);
        for (int i = 1; i <= 2; i++) {
            const struct mmrt_tensor *t = src[i];
            REQUIRE(t->n_dims == 3 && is_kv_dtype(t->dtype) &&
                        t->nb[2] == (int64_t)mmrt_dtype_size((enum mmrt_dtype)t->dtype),
                    "k and v must be F32/F16/F8E4M3 [S, Hkv, D] with a contiguous inner dim", t);
        }
        REQUIRE(same_shape(b, c), "v must have k's shape", c);
        REQUIRE(b->ne[2] == a->ne[2], "k's head dim must equal q's", b);
        REQUIRE(a->ne[2] >= 1 && a->ne[2] <= 256, "head dim must be within 1…256", a);
        REQUIRE(b->ne[1] >= 1 && a->ne[1] % b->ne[1] == 0,
                "q heads must be a multiple of kv heads", b);
        REQUIRE(y->dtype == MMRT_DTYPE_F32 && contiguous(y) && same_shape(a, y),
                "dst must be contiguous F32 with q's shape", y);
        REQUIRE((cq == NULL) == (ck == NULL), "cu_seqlens_q and cu_seqlens_k go together", NULL);
        if (mmrt_pv_attention_values(p, why, sizeof why) != MMRT_OK)
            return bad(err, op, why, NULL);
        if (cq) {
            REQUIRE(p->n_seq >= 1, "n_seq must be ≥ 1", NULL);
            REQUIRE(cq->dtype == MMRT_DTYPE_I32 && contiguous(cq) && numel(cq) == p->n_seq + 1,
                    "cu_seqlens_q must be contiguous I32 [n_seq + 1]", cq);
            REQUIRE(ck->dtype == MMRT_DTYPE_I32 && contiguous(ck) && numel(ck) == p->n_seq + 1,
                    "cu_seqlens_k must be contiguous I32 [n_seq + 1]", ck);
        } else {
            REQUIRE(p->n_seq == 1, "n_seq must be 1 without cu_seqlens", NULL);
        }
        return MMRT_OK;
    }
    case MMRT_OP_ATTENTION_PAGED: {
        /* An ABI 1.4 caller's params end before window, which then reads as 0. */
        st = need_params(op, params, params_size, MMRT_ATTENTION_PARAMS_V14_SIZE, err);
        if (st != MMRT_OK)
            return st;
        struct mmrt_attention_params pv;
        mmrt_attention_params_read(params, params_size, &pv);
        const struct mmrt_attention_params *p = &pv;
        const struct mmrt_tensor *cq = src[3], *lens = src[4], *table = src[5];
        REQUIRE(a->n_dims == 3 && a->dtype == MMRT_DTYPE_F32 && contiguous(a),
                "q must be contiguous F32 [T, Hq, D]", a);
        REQUIRE(b->n_dims == 4 && is_kv_dtype(b->dtype) && contiguous(b) && b->ne[0] >= 1 &&
                    b->ne[1] >= 1,
                "k_pages must be contiguous F32/F16/F8E4M3 [n_pages, page_tokens, Hkv, D]", b);
        REQUIRE(same_shape(b, c) && c->dtype == b->dtype && contiguous(c),
                "v_pages must be contiguous with k_pages' shape and dtype", c);
        REQUIRE(b->ne[3] == a->ne[2], "the pages' head dim must equal q's", b);
        REQUIRE(a->ne[2] >= 1 && a->ne[2] <= 256, "head dim must be within 1…256", a);
        REQUIRE(b->ne[2] >= 1 && a->ne[1] % b->ne[2] == 0,
                "q heads must be a multiple of kv heads", b);
        REQUIRE(y->dtype == MMRT_DTYPE_F32 && contiguous(y) && same_shape(a, y),
                "dst must be contiguous F32 with q's shape", y);
        if (mmrt_pv_attention_values(p, why, sizeof why) != MMRT_OK)
            return bad(err, op, why, NULL);
        REQUIRE(p->n_seq >= 1, "n_seq must be ≥ 1", NULL);
        REQUIRE(cq->dtype == MMRT_DTYPE_I32 && contiguous(cq) && numel(cq) == p->n_seq + 1,
                "cu_seqlens_q must be contiguous I32 [n_seq + 1]", cq);
        REQUIRE(lens->dtype == MMRT_DTYPE_I32 && contiguous(lens) && numel(lens) == p->n_seq,
                "kv_lens must be contiguous I32 [n_seq]", lens);
        REQUIRE(table->dtype == MMRT_DTYPE_I32 && contiguous(table) && table->n_dims == 2 &&
                    table->ne[0] == p->n_seq && table->ne[1] >= 1,
                "page_table must be contiguous I32 [n_seq, max_pages]", table);
        return MMRT_OK;
    }
    case MMRT_OP_GET_ROWS:
        REQUIRE(a->n_dims == 2 && is_weight_dtype(a->dtype) && contiguous(a),
                "table must be a contiguous 2-D F32/F16/BF16 [V, N]", a);
        REQUIRE(b->dtype == MMRT_DTYPE_I32 && contiguous(b), "ids must be contiguous I32", b);
        REQUIRE(y->dtype == MMRT_DTYPE_F32 && contiguous(y) && rows(y) == numel(b) &&
                    inner(y) == a->ne[1],
                "dst must be contiguous F32 [T, N]", y);
        return MMRT_OK;
    case MMRT_OP_PATCH_EMBED: {
        st = need_params(op, params, params_size, sizeof(struct mmrt_patch_params), err);
        if (st != MMRT_OK)
            return st;
        int64_t P = ((const struct mmrt_patch_params *)params)->patch;
        REQUIRE(a->n_dims == 4 && a->dtype == MMRT_DTYPE_F32 && contiguous(a),
                "image must be contiguous F32 [B, C, H, W]", a);
        REQUIRE(P >= 1 && a->ne[2] % P == 0 && a->ne[3] % P == 0,
                "H and W must be multiples of the patch size", a);
        REQUIRE(b->n_dims == 4 && is_weight_dtype(b->dtype) && contiguous(b) &&
                    b->ne[1] == a->ne[1] && b->ne[2] == P && b->ne[3] == P,
                "weight must be contiguous [O, C, P, P]", b);
        st = check_row_weight(op, "bias", c, b->ne[0], err);
        if (st != MMRT_OK)
            return st;
        REQUIRE(y->n_dims == 3 && y->dtype == MMRT_DTYPE_F32 && contiguous(y) &&
                    y->ne[0] == a->ne[0] && y->ne[1] == (a->ne[2] / P) * (a->ne[3] / P) &&
                    y->ne[2] == b->ne[0],
                "dst must be contiguous F32 [B, (H/P)·(W/P), O]", y);
        return MMRT_OK;
    }
    case MMRT_OP_CONCAT: {
        st = need_params(op, params, params_size, sizeof(struct mmrt_concat_params), err);
        if (st != MMRT_OK)
            return st;
        int axis = ((const struct mmrt_concat_params *)params)->axis;
        REQUIRE(a->dtype == b->dtype && a->dtype == y->dtype, "all operands share one dtype", y);
        REQUIRE(contiguous(y), "dst must be contiguous", y);
        REQUIRE(a->n_dims == b->n_dims && a->n_dims == y->n_dims, "all operands share a rank", y);
        REQUIRE(axis >= 0 && axis < a->n_dims, "axis out of range", a);
        for (int i = 0; i < a->n_dims; i++) {
            if (i == axis)
                REQUIRE(y->ne[i] == a->ne[i] + b->ne[i], "dst extent on axis must be the sum", y);
            else
                REQUIRE(a->ne[i] == b->ne[i] && a->ne[i] == y->ne[i],
                        "extents off the axis must agree", b);
        }
        return MMRT_OK;
    }
    case MMRT_OP_COPY:
        REQUIRE(same_shape(a, y), "dst must have src's extents", y);
        REQUIRE((a->dtype == MMRT_DTYPE_I32) == (y->dtype == MMRT_DTYPE_I32),
                "I32 copies only to I32", y);
        /* The KV cache is written by SET_ROWS and read by the attention ops; no conversion
         * path needs F8E4M3, so COPY keeps its dtype list rather than grow one more pair. */
        REQUIRE(a->dtype != MMRT_DTYPE_F8E4M3, "src must not be F8E4M3 (COPY does not take it)", a);
        REQUIRE(y->dtype != MMRT_DTYPE_F8E4M3, "dst must not be F8E4M3 (COPY does not take it)", y);
        return MMRT_OK;
    case MMRT_OP_ARGMAX:
        REQUIRE(a->dtype == MMRT_DTYPE_F32 && contiguous(a), "src must be contiguous F32", a);
        REQUIRE(y->dtype == MMRT_DTYPE_I32 && contiguous(y) && numel(y) == rows(a),
                "dst must be contiguous I32 [rows]", y);
        return MMRT_OK;
    case MMRT_OP_GATHER_HEADS:
        REQUIRE(a->n_dims == 3 && (is_weight_dtype(a->dtype) || a->dtype == MMRT_DTYPE_F8E4M3) &&
                    contiguous(a),
                "table must be a contiguous F32/F16/BF16/F8E4M3 [R, H, D]", a);
        REQUIRE(b->n_dims == 3 && b->dtype == MMRT_DTYPE_I32 && contiguous(b) &&
                    b->ne[1] == a->ne[1] && b->ne[2] >= 1,
                "idx must be contiguous I32 [N, H, G] with the table's H and G ≥ 1", b);
        REQUIRE(y->n_dims == 3 && y->dtype == MMRT_DTYPE_F32 && contiguous(y) &&
                    y->ne[0] == b->ne[0] && y->ne[1] == a->ne[1] && y->ne[2] == a->ne[2],
                "dst must be contiguous F32 [N, H, D] (N from idx, H and D from the table)", y);
        return MMRT_OK;
    case MMRT_OP_L2_NORM:
        REQUIRE(a->dtype == MMRT_DTYPE_F32 && contiguous(a), "src must be contiguous F32", a);
        REQUIRE(y->n_dims == 1 && y->dtype == MMRT_DTYPE_F32 && contiguous(y) &&
                    y->ne[0] == rows(a),
                "dst must be contiguous F32 [rows], 1-D, one norm per row of src", y);
        return MMRT_OK;
    case MMRT_OP_COUNT:
        break;
    }
    return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "unknown operator %d", (int)op);
}

mmrt_status mmrt_op_launch(struct mmrt_dev *dev, enum mmrt_op op,
                           const struct mmrt_tensor *const *src, int n_src,
                           const struct mmrt_tensor *dst, const void *params,
                           uint32_t params_size, struct mmrt_error *err)
{
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
    if (dev->api->hdr.abi_minor < 6) {
        const struct mmrt_tensor *f8 = dst->dtype == MMRT_DTYPE_F8E4M3 ? dst : NULL;
        for (int i = 0; i < n_src && !f8; i++)
            if (src[i] && src[i]->dtype == MMRT_DTYPE_F8E4M3)
                f8 = src[i];
        if (f8)
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                  "device %s: plugin %s has ABI %u.%u; %s with an F8E4M3 "
                                  "operand needs 1.6", dev->name, dev->api->name,
                                  (unsigned)dev->api->hdr.abi_major,
                                  (unsigned)dev->api->hdr.abi_minor, mmrt_op_name(op));
    }
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
        .op = op,
        .n_src = n_src,
        .dst = dst,
        .params = params,
        .params_size = params_size,
    };
    for (int i = 0; i < n_src; i++)
        args.src[i] = src[i];
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

mmrt_status mmrt_op_matmul(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                           const struct mmrt_weight *w, const struct mmrt_tensor *b,
                           const struct mmrt_tensor *y, struct mmrt_error *err)
{
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
                                    const struct mmrt_attention_params *p,
                                    const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_ATTENTION_PAGED, p, q, k_pages, v_pages, cu_q, kv_lens, page_table);
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
                             struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_SET_ROWS, no_params, values, idx);
}

mmrt_status mmrt_op_gather_heads(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                                 const struct mmrt_tensor *idx, const struct mmrt_tensor *y,
                                 struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_GATHER_HEADS, no_params, table, idx);
}

mmrt_status mmrt_op_l2_norm(struct mmrt_dev *dev, const struct mmrt_tensor *x,
                            const struct mmrt_tensor *y, struct mmrt_error *err)
{
    LAUNCH(MMRT_OP_L2_NORM, no_params, x);
}
