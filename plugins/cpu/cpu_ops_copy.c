/*
 * plugins/cpu/cpu_ops_copy.c — COPY (strided, with dtype conversion) and CONCAT.
 *
 * Both reduce to one strided element copy: tensors are seen as 4-D (leading extents of 1),
 * the three outer dims form the parallel items, and each item converts one innermost line
 * with whatever strides source and destination have — that is how permutes, transposes and
 * KV-cache writes arrive. Same dtype on both sides with contiguous lines is a memcpy.
 * Conversions round to nearest even (cpu_f32_to_f16 / cpu_f32_to_bf16); F16 ↔ BF16 goes
 * through f32, which is exact on the way in. CONCAT copies each source into its slice of dst.
 */
#include <inttypes.h>

#include "cpu_internal.h"

typedef void (*line_fn)(const char *s, int64_t ss, char *d, int64_t ds, int64_t n);

#define LINE_FN(name, STYPE, DTYPE, CONVERT)                                                   \
    static void name(const char *s, int64_t ss, char *d, int64_t ds, int64_t n)               \
    {                                                                                          \
        for (int64_t i = 0; i < n; i++)                                                        \
            *(DTYPE *)(d + i * ds) = CONVERT(*(const STYPE *)(s + i * ss));                    \
    }

#define SAME(v) (v)
#define F16_BF16(v) cpu_f32_to_bf16(cpu_f16_to_f32(v))
#define BF16_F16(v) cpu_f32_to_f16(cpu_bf16_to_f32(v))

LINE_FN(line_4, uint32_t, uint32_t, SAME)
LINE_FN(line_2, uint16_t, uint16_t, SAME)
LINE_FN(line_f32_f16, float, uint16_t, cpu_f32_to_f16)
LINE_FN(line_f32_bf16, float, uint16_t, cpu_f32_to_bf16)
LINE_FN(line_f16_f32, uint16_t, float, cpu_f16_to_f32)
LINE_FN(line_bf16_f32, uint16_t, float, cpu_bf16_to_f32)
LINE_FN(line_f16_bf16, uint16_t, uint16_t, F16_BF16)
LINE_FN(line_bf16_f16, uint16_t, uint16_t, BF16_F16)

/* The line converter for a dtype pair, or NULL when the pair is not allowed. */
static line_fn line_for(int sdt, int ddt)
{
    if (sdt == ddt)
        return mmrt_dtype_size((enum mmrt_dtype)sdt) == 4 ? line_4 : line_2;
    if (sdt == MMRT_DTYPE_F32 && ddt == MMRT_DTYPE_F16) return line_f32_f16;
    if (sdt == MMRT_DTYPE_F32 && ddt == MMRT_DTYPE_BF16) return line_f32_bf16;
    if (sdt == MMRT_DTYPE_F16 && ddt == MMRT_DTYPE_F32) return line_f16_f32;
    if (sdt == MMRT_DTYPE_BF16 && ddt == MMRT_DTYPE_F32) return line_bf16_f32;
    if (sdt == MMRT_DTYPE_F16 && ddt == MMRT_DTYPE_BF16) return line_f16_bf16;
    if (sdt == MMRT_DTYPE_BF16 && ddt == MMRT_DTYPE_F16) return line_bf16_f16;
    return NULL;
}

struct copy_ctx {
    const char *s;
    char *d;
    int64_t ne[4], snb[4], dnb[4]; /* as 4-D, outermost first */
    line_fn line;
    size_t es;
    bool memcpy_lines;
};

static void copy_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct copy_ctx *c = vctx;
    (void)tid;
    for (int64_t r = begin; r < end; r++) {
        int64_t i2 = r % c->ne[2], i1 = (r / c->ne[2]) % c->ne[1], i0 = r / (c->ne[2] * c->ne[1]);
        const char *s = c->s + i0 * c->snb[0] + i1 * c->snb[1] + i2 * c->snb[2];
        char *d = c->d + i0 * c->dnb[0] + i1 * c->dnb[1] + i2 * c->dnb[2];
        if (c->memcpy_lines)
            memcpy(d, s, (size_t)c->ne[3] * c->es);
        else
            c->line(s, c->snb[3], d, c->dnb[3], c->ne[3]);
    }
}

/* Copies the view `src` into the view `dst` of the same extents (any strides). */
static void strided_copy(struct mmrt_device *dev, const struct cpu_view *src,
                         const struct cpu_view *dst, line_fn line)
{
    struct copy_ctx c = { .s = src->data, .d = dst->data, .line = line };
    int pad = MMRT_MAX_DIMS - src->n_dims;
    for (int i = 0; i < 4; i++) {
        bool real = i >= pad;
        c.ne[i] = real ? src->ne[i - pad] : 1;
        c.snb[i] = real ? src->nb[i - pad] : 0;
        c.dnb[i] = real ? dst->nb[i - pad] : 0;
    }
    c.es = mmrt_dtype_size((enum mmrt_dtype)src->dtype);
    c.memcpy_lines = src->dtype == dst->dtype &&
                     (c.ne[3] <= 1 || (c.snb[3] == (int64_t)c.es && c.dnb[3] == (int64_t)c.es));
    int64_t rows = c.ne[0] * c.ne[1] * c.ne[2];
    if (src->numel == 0 || (src->data == dst->data && memcmp(c.snb, c.dnb, sizeof c.snb) == 0 &&
                            src->dtype == dst->dtype))
        return; /* empty, or a copy of a view onto itself */
    cpu_parallel_for(&dev->pool, rows, (double)c.ne[3], copy_task, &c);
}

mmrt_status cpu_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_COPY, 1, 1, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *s = &o.src[0], *d = &o.dst;
    /* Same-size dtypes may convert in place (F16 ↔ BF16, op_contract.h): each element is
     * read, then written. */
    line_fn line = line_for(s->dtype, d->dtype);
    if (!line)
        return cpu_bad(&o, MMRT_ERR_UNSUPPORTED, "no conversion from %s to %s",
                       mmrt_dtype_name_of(s->dtype), mmrt_dtype_name_of(d->dtype));
    strided_copy(dev, s, d, line);
    return MMRT_OK;
}

mmrt_status cpu_op_concat(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_concat_params p;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_CONCAT, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *a = &o.src[0], *b = &o.src[1], *d = &o.dst;
    if ((st = cpu_op_params(&o, &p, sizeof p)))
        return st;
    line_fn line = line_for(d->dtype, d->dtype);
    if (!line)
        return cpu_bad(&o, MMRT_ERR_UNSUPPORTED, "no %s copy", mmrt_dtype_name_of(d->dtype));
    struct cpu_view part = *d;
    part.ne[p.axis] = a->ne[p.axis];
    strided_copy(dev, a, &part, line);
    part.data = d->data + a->ne[p.axis] * d->nb[p.axis];
    part.ne[p.axis] = b->ne[p.axis];
    strided_copy(dev, b, &part, line);
    return MMRT_OK;
}
