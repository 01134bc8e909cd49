/*
 * plugins/cpu/cpu_ops_rows.c — the row-wise ops: LAYERNORM, RMSNORM, SOFTMAX, ARGMAX,
 * L2_NORM, GET_ROWS and GATHER_HEADS, each parallel over rows, and SET_ROWS (the row scatter),
 * parallel over columns.
 *
 * Norm moments and softmax sums are accumulated in double: cheap here, and it makes the
 * statistic itself exact to f32 precision, so the result stays within an ulp or two of what
 * PyTorch's float32 kernels produce. Each normalised value is formed in f32 the way Hugging
 * Face writes it (RMSNorm: (x · rsqrt) · w; softmax: e · (1/Σ)). Row-wise ops may run in
 * place: a row's statistics are complete before any element of it is written.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"

/* ---- LAYERNORM, RMSNORM --------------------------------------------------------------- */

struct norm_ctx {
    const float *x;
    float *y;
    const void *w, *b; /* optional, weight dtype */
    int w_dtype, b_dtype;
    int64_t n;
    double eps;
    bool rms;
};

/* Row statistics in double over eight interleaved partial sums, added in a fixed order: one
 * serial chain of double adds per row was the whole cost of a LayerNorm (a CLIP-L row of
 * 1024 took ~4 µs); eight chains let the adds overlap, and the order still depends only on
 * n, never on threads. With mean given, sums (x − mean)²; otherwise x (or x² when sq). */
static double row_sum(const float *x, int64_t n, bool sq, const double *mean)
{
    double a[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            double v = mean ? (double)x[i + k] - *mean : (double)x[i + k];
            a[k] += sq || mean ? v * v : v;
        }
    for (int k = 0; i < n; i++, k++) {
        double v = mean ? (double)x[i] - *mean : (double)x[i];
        a[k] += sq || mean ? v * v : v;
    }
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static void norm_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct norm_ctx *c = vctx;
    int64_t n = c->n;
    (void)tid;
    /* The weight and bias as f32 once per task rather than per element: the per-element
     * dtype switch kept the output loop scalar. Values are the same floats either way. */
    float *wb = malloc((size_t)(2 * n) * sizeof *wb);
    const float *w = NULL, *b = NULL;
    if (wb) {
        if (c->w) {
            cpu_weight_to_f32(c->w, c->w_dtype, wb, n);
            w = wb;
        }
        if (c->b) {
            cpu_weight_to_f32(c->b, c->b_dtype, wb + n, n);
            b = wb + n;
        }
    }
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * n;
        float *y = c->y + r * n;
        if (c->rms) {
            double ss = row_sum(x, n, true, NULL);
            float rstd = (float)(1.0 / sqrt(ss / (double)n + c->eps));
            if (w)
                for (int64_t i = 0; i < n; i++)
                    y[i] = (x[i] * rstd) * w[i];
            else
                for (int64_t i = 0; i < n; i++) {
                    float v = x[i] * rstd;
                    y[i] = c->w ? v * cpu_load_weight(c->w, c->w_dtype, i) : v;
                }
        } else {
            double mean = row_sum(x, n, false, NULL) / (double)n;
            /* two passes: no cancellation for offset data */
            double ss = row_sum(x, n, true, &mean);
            double rstd = 1.0 / sqrt(ss / (double)n + c->eps);
            if (wb && (w || !c->w) && (b || !c->b)) {
                for (int64_t i = 0; i < n; i++) {
                    float v = (float)((x[i] - mean) * rstd);
                    if (w)
                        v *= w[i];
                    if (b)
                        v += b[i];
                    y[i] = v;
                }
            } else {
                for (int64_t i = 0; i < n; i++) {
                    float v = (float)((x[i] - mean) * rstd);
                    if (c->w)
                        v *= cpu_load_weight(c->w, c->w_dtype, i);
                    if (c->b)
                        v += cpu_load_weight(c->b, c->b_dtype, i);
                    y[i] = v;
                }
            }
        }
    }
    free(wb);
}

static mmrt_status norm(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cpu_op o;
    struct mmrt_norm_params p;
    bool rms = op == MMRT_OP_RMSNORM;
    mmrt_status st = cpu_op_begin(dev, args, op, 1, rms ? 2 : 3, &o);
    if (st != MMRT_OK)
        return st;
    int64_t n = cpu_inner(&o.src[0]);
    if ((st = cpu_op_params(&o, &p, sizeof p)))
        return st;
    if (n == 0)
        return MMRT_OK;
    struct norm_ctx c = {
        .x = (const float *)o.src[0].data, .y = (float *)o.dst.data,
        .w = o.src[1].data, .b = o.src[2].data, .w_dtype = o.src[1].dtype,
        .b_dtype = o.src[2].dtype, .n = n, .eps = p.eps, .rms = rms,
    };
    cpu_parallel_for(&dev->pool, cpu_rows(&o.src[0]), 4.0 * (double)n, norm_task, &c);
    return MMRT_OK;
}

mmrt_status cpu_op_layernorm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return norm(dev, args, MMRT_OP_LAYERNORM);
}

mmrt_status cpu_op_rmsnorm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return norm(dev, args, MMRT_OP_RMSNORM);
}

/* ---- SOFTMAX -------------------------------------------------------------------------- */

struct softmax_ctx {
    const float *x;
    float *y;
    int64_t n;
    float scale;
};

static void softmax_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct softmax_ctx *c = vctx;
    int64_t n = c->n;
    (void)tid;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * n;
        float *y = c->y + r * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i] * c->scale;
            m = v > m ? v : m;
        }
        if (m == -INFINITY) {
            /* Every entry masked: no distribution exists; give zeros, like a fully masked
             * attention row, instead of the NaNs of 0/0. */
            memset(y, 0, (size_t)n * sizeof(float));
            continue;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            float e = expf(x[i] * c->scale - m); /* −inf − m gives exactly 0 */
            y[i] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++)
            y[i] *= inv;
    }
}

mmrt_status cpu_op_softmax(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_scale_params p;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_SOFTMAX, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = cpu_op_params(&o, &p, sizeof p)))
        return st;
    int64_t n = cpu_inner(&o.src[0]);
    if (n == 0)
        return MMRT_OK;
    struct softmax_ctx c = {
        .x = (const float *)o.src[0].data, .y = (float *)o.dst.data, .n = n, .scale = p.scale,
    };
    cpu_parallel_for(&dev->pool, cpu_rows(&o.src[0]), 20.0 * (double)n, softmax_task, &c);
    return MMRT_OK;
}

/* ---- ARGMAX --------------------------------------------------------------------------- */

struct argmax_ctx {
    const float *x;
    int32_t *y;
    int64_t n;
};

static void argmax_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct argmax_ctx *c = vctx;
    (void)tid;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * c->n;
        int64_t best = -1;
        float bv = 0.0f;
        for (int64_t i = 0; i < c->n; i++) {
            if (isnan(x[i]))
                continue;
            if (best < 0 || x[i] > bv) { /* strict: the first maximum wins ties */
                best = i;
                bv = x[i];
            }
        }
        c->y[r] = best < 0 ? 0 : (int32_t)best; /* an all-NaN row answers 0 */
    }
}

mmrt_status cpu_op_argmax(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_ARGMAX, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *x = &o.src[0], *y = &o.dst;
    int64_t rows = cpu_rows(x), n = cpu_inner(x);
    struct argmax_ctx c = { .x = (const float *)x->data, .y = (int32_t *)y->data, .n = n };
    cpu_parallel_for(&dev->pool, rows, (double)n, argmax_task, &c);
    return MMRT_OK;
}

/* ---- GET_ROWS ------------------------------------------------------------------------- */

struct get_rows_ctx {
    const char *table;
    const int32_t *ids;
    float *y;
    int64_t n;
    size_t row_bytes;
    int dtype;
};

static void get_rows_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct get_rows_ctx *c = vctx;
    (void)tid;
    for (int64_t t = begin; t < end; t++)
        cpu_weight_to_f32(c->table + (size_t)c->ids[t] * c->row_bytes, c->dtype, c->y + t * c->n,
                          c->n);
}

mmrt_status cpu_op_get_rows(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_GET_ROWS, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *tab = &o.src[0], *ids = &o.src[1], *y = &o.dst;
    int64_t V = tab->ne[0], n = tab->ne[1], T = ids->numel;
    /* Check every id before writing anything, so a refused call leaves dst untouched. */
    const int32_t *id = (const int32_t *)ids->data;
    for (int64_t t = 0; t < T; t++)
        if (id[t] < 0 || id[t] >= V)
            return cpu_bad(&o, MMRT_ERR_INVALID_ARG, "id %" PRId32 " at row %" PRId64 " is outside "
                           "the table's rows [0, %" PRId64 ")", id[t], t, V);
    struct get_rows_ctx c = {
        .table = tab->data, .ids = id, .y = (float *)y->data, .n = n,
        .row_bytes = (size_t)n * mmrt_dtype_size((enum mmrt_dtype)tab->dtype),
        .dtype = tab->dtype,
    };
    cpu_parallel_for(&dev->pool, T, (double)n, get_rows_task, &c);
    return MMRT_OK;
}

/* ---- SET_ROWS ------------------------------------------------------------------------- */

/* One item is one element column of a row: every item walks the rows t in order, so when
 * two indices are equal the later row wins whole (never a mix of both), and no two threads
 * write the same element. Rows with an index outside [0, R) are skipped (plugin.h). */
struct set_rows_ctx {
    const float *v;       /* [T][n] */
    const int32_t *idx;   /* [T] */
    char *d;              /* [R][n], dtype */
    int64_t T, n, R;
    int dtype;
};

/* plugin.h "I8 with row scales": one row of D values to codes and its scale, with the f32
 * operations the header fixes (a correctly rounded division, ties to even), so every plugin
 * writes these bytes. */
static void quantize_row_i8(const float *x, int64_t D, int8_t *codes, float *scale)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < D; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax; /* false for NaN: ignored */
    }
    const float s = amax / 127.0f;
    for (int64_t i = 0; i < D; i++) {
        const float q = rintf(x[i] / s);
        codes[i] = q != q ? 0 : q > 127.0f ? 127 : q < -127.0f ? -127 : (int8_t)q;
    }
    *scale = s;
}

/* An I8 dst: one item is one innermost row (D values, one scale) of every index row, each
 * walking t in order as above. */
struct set_rows_i8_ctx {
    const float *v;       /* [T][n] */
    const int32_t *idx;   /* [T] */
    int8_t *d;            /* [R][n] */
    float *scales;        /* [R][n / D] */
    int64_t T, n, R, D;
};

static void set_rows_i8_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct set_rows_i8_ctx *c = vctx;
    const int64_t per = c->n / c->D;
    (void)tid;
    for (int64_t t = 0; t < c->T; t++) {
        const int64_t r = c->idx[t];
        if (r < 0 || r >= c->R)
            continue;
        for (int64_t j = begin; j < end; j++)
            quantize_row_i8(c->v + t * c->n + j * c->D, c->D, c->d + r * c->n + j * c->D,
                            c->scales + r * per + j);
    }
}

static void set_rows_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct set_rows_ctx *c = vctx;
    (void)tid;
    for (int64_t t = 0; t < c->T; t++) {
        int64_t r = c->idx[t];
        if (r < 0 || r >= c->R)
            continue;
        const float *s = c->v + t * c->n;
        int64_t o = r * c->n;
        switch (c->dtype) {
        case MMRT_DTYPE_F16:
            for (int64_t k = begin; k < end; k++)
                ((uint16_t *)c->d)[o + k] = cpu_f32_to_f16(s[k]);
            break;
        case MMRT_DTYPE_BF16:
            for (int64_t k = begin; k < end; k++)
                ((uint16_t *)c->d)[o + k] = cpu_f32_to_bf16(s[k]);
            break;
        case MMRT_DTYPE_F8E4M3:
            for (int64_t k = begin; k < end; k++)
                ((uint8_t *)c->d)[o + k] = mmrt_f32_to_f8e4m3(s[k]);
            break;
        default:
            memcpy((float *)c->d + o + begin, s + begin, (size_t)(end - begin) * sizeof(float));
            break;
        }
    }
}

mmrt_status cpu_op_set_rows(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_SET_ROWS, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *v = &o.src[0], *idx = &o.src[1], *d = &o.dst;
    int64_t T = v->ne[0], n = 1;
    for (int i = 1; i < v->n_dims; i++)
        n *= v->ne[i];
    if (T == 0 || n == 0)
        return MMRT_OK;
    if (d->dtype == MMRT_DTYPE_I8) {
        struct set_rows_i8_ctx c = {
            .v = (const float *)v->data, .idx = (const int32_t *)idx->data,
            .d = (int8_t *)d->data, .scales = (float *)o.src[2].data, .T = T, .n = n,
            .R = d->ne[0], .D = cpu_inner(d),
        };
        cpu_parallel_for(&dev->pool, n / c.D, (double)(T * c.D), set_rows_i8_task, &c);
        return MMRT_OK;
    }
    struct set_rows_ctx c = {
        .v = (const float *)v->data, .idx = (const int32_t *)idx->data, .d = d->data, .T = T,
        .n = n, .R = d->ne[0], .dtype = d->dtype,
    };
    cpu_parallel_for(&dev->pool, n, (double)T, set_rows_task, &c);
    return MMRT_OK;
}

/* ---- GATHER_HEADS ---------------------------------------------------------------------- */

/* One item is one output row (n, h). Its D floats in dst are the accumulator: the first kept
 * table row is widened into them, each later one added in g order, then they are divided
 * once by the count when it is ≥ 2 — the exact sequence of f32 operations plugin.h fixes, so
 * every plugin gives these bits. Four elements at a time with the table's F16 / BF16 widened
 * in registers; the lanes are separate elements, so vectorising changes no bit. */
struct gather_ctx {
    const char *table;  /* [R][H][D], dtype */
    const int32_t *idx; /* [N][H][G] */
    float *y;           /* [N][H][D] */
    int64_t R, H, D, G;
    size_t row_bytes;   /* D elements of the table */
    int dtype;
    const float *scales; /* an I8 table's [R][H] */
};

/* y[0, D) = row widened to f32, or y += it when add; an I8 row's codes widen to code · scale
 * (one rounded product: ISO C mode does not contract it into the addition). */
static void gather_row(float *restrict y, const char *restrict row, int dtype, float scale,
                       int64_t D, bool add)
{
    int64_t d = 0;
    if (dtype == MMRT_DTYPE_I8) {
        for (; d < D; d++) {
            const float v = (float)((const int8_t *)row)[d] * scale;
            y[d] = add ? y[d] + v : v;
        }
        return;
    }
    if (dtype == MMRT_DTYPE_F32) {
        const float *r = (const float *)row;
        if (!add) {
            memcpy(y, r, (size_t)D * sizeof(float));
            return;
        }
        for (; d + 4 <= D; d += 4) {
            cpu_v4f v = cpu_v4f_load(y + d) + cpu_v4f_load(r + d);
            memcpy(y + d, &v, sizeof v);
        }
        for (; d < D; d++)
            y[d] += r[d];
        return;
    }
    if (dtype == MMRT_DTYPE_F8E4M3) {
        /* Widened one code at a time: exact, and the lanes are separate elements anyway. */
        for (; d < D; d++) {
            float v = mmrt_f8e4m3_to_f32(((const uint8_t *)row)[d]);
            y[d] = add ? y[d] + v : v;
        }
        return;
    }
    const uint16_t *r = (const uint16_t *)row;
    const bool f16 = dtype == MMRT_DTYPE_F16;
    for (; d + 4 <= D; d += 4) {
        cpu_v4f v = f16 ? cpu_f16x4_to_f32(r + d) : cpu_bf16x4_to_f32(r + d);
        if (add)
            v = cpu_v4f_load(y + d) + v;
        memcpy(y + d, &v, sizeof v);
    }
    for (; d < D; d++) {
        float v = f16 ? cpu_f16_to_f32(r[d]) : cpu_bf16_to_f32(r[d]);
        y[d] = add ? y[d] + v : v;
    }
}

static void gather_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct gather_ctx *c = vctx;
    const int64_t D = c->D;
    (void)tid;
    for (int64_t it = begin; it < end; it++) {
        const int64_t h = it % c->H;
        const int32_t *ix = c->idx + it * c->G;
        float *y = c->y + it * D;
        int64_t kept = 0;
        for (int64_t g = 0; g < c->G; g++) {
            const int64_t r = ix[g];
            if (r < 0 || r >= c->R)
                continue; /* padding, or the caller's out-of-range entry: skipped alike */
            gather_row(y, c->table + (size_t)(r * c->H + h) * c->row_bytes, c->dtype,
                       c->scales ? c->scales[r * c->H + h] : 1.0f, D, kept > 0);
            kept++;
        }
        if (kept == 0) {
            memset(y, 0, (size_t)D * sizeof(float));
        } else if (kept > 1) {
            const float n = (float)kept; /* a correctly rounded division, never 1/n */
            int64_t d = 0;
            for (; d + 4 <= D; d += 4) {
                cpu_v4f v = cpu_v4f_load(y + d) / n;
                memcpy(y + d, &v, sizeof v);
            }
            for (; d < D; d++)
                y[d] /= n;
        }
    }
}

mmrt_status cpu_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_GATHER_HEADS, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *tab = &o.src[0], *idx = &o.src[1], *y = &o.dst;
    const int64_t R = tab->ne[0], H = tab->ne[1], D = tab->ne[2], N = idx->ne[0], G = idx->ne[2];
    if (N == 0 || H == 0 || D == 0)
        return MMRT_OK;
    struct gather_ctx c = {
        .table = tab->data, .idx = (const int32_t *)idx->data, .y = (float *)y->data,
        .R = R, .H = H, .D = D, .G = G,
        .row_bytes = (size_t)D * mmrt_dtype_size((enum mmrt_dtype)tab->dtype),
        .dtype = tab->dtype,
        .scales = tab->dtype == MMRT_DTYPE_I8 ? (const float *)o.src[2].data : NULL,
    };
    cpu_parallel_for(&dev->pool, N * H, (double)(G * D), gather_task, &c);
    return MMRT_OK;
}

/* ---- L2_NORM ------------------------------------------------------------------------------ */

typedef double rows_v4d __attribute__((vector_size(32)));

/* Σ x[i]² in double over eight lanes (lane l takes i ≡ l mod 8, the tail goes to lanes 0…),
 * added in a fixed tree: each square of an f32 is exact in double, so the sum is within an
 * ulp or so of exact, and the order depends on n alone. */
static double sum_squares(const float *x, int64_t n)
{
    rows_v4d lo = { 0 }, hi = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        rows_v4d a = __builtin_convertvector(cpu_v4f_load(x + i), rows_v4d);
        rows_v4d b = __builtin_convertvector(cpu_v4f_load(x + i + 4), rows_v4d);
        lo += a * a;
        hi += b * b;
    }
    double acc[8];
    memcpy(acc, &lo, sizeof lo);
    memcpy(acc + 4, &hi, sizeof hi);
    for (int l = 0; i < n; i++, l++)
        acc[l] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

struct l2_ctx {
    const float *x;
    float *y;
    int64_t n;
};

static void l2_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct l2_ctx *c = vctx;
    (void)tid;
    for (int64_t r = begin; r < end; r++)
        c->y[r] = (float)sqrt(sum_squares(c->x + r * c->n, c->n));
}

mmrt_status cpu_op_l2_norm(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_L2_NORM, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *x = &o.src[0], *y = &o.dst;
    const int64_t rows = cpu_rows(x), n = cpu_inner(x);
    struct l2_ctx c = { .x = (const float *)x->data, .y = (float *)y->data, .n = n };
    cpu_parallel_for(&dev->pool, rows, (double)n, l2_task, &c);
    return MMRT_OK;
}
