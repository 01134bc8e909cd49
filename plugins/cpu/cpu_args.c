/*
 * plugins/cpu/cpu_args.c — turning a launch's mmrt_op_args into checked views.
 *
 * The core validates shapes before it calls a kernel, but the plugin is also driven directly
 * (mmrt-plugin-check, tests, vendors' harnesses), so every launch is checked again here.
 * The invariant a kernel may assume after cpu_op_begin: each present tensor names one of this
 * device's arenas, every byte it can address (offset + Σ (ne−1)·nb + element size) lies inside
 * that arena, strides and offset are non-negative multiples of the element size, its element
 * count did not overflow, and the launch meets plugin.h's operator contract (ranks, dtypes,
 * extents, contiguity, aliasing, param values: op_contract.h, the core's own check).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "cpu_internal.h"
#include "op_contract.h"

mmrt_status cpu_bad(struct cpu_op *o, mmrt_status st, const char *fmt, ...)
{
    char what[CPU_ERR_MAX - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cpu_fail(o->dev, st, "%s: %s", o->name, what);
}

static const void *find_arena(void *ctx, const void *buffer, uint64_t *nbytes)
{
    struct cpu_arena *a = cpu_arena_find(ctx, buffer);
    if (a)
        *nbytes = a->nbytes;
    return a;
}

static void view_of(const struct mmrt_pv_shape *sh, const void *arena, struct cpu_view *v)
{
    memset(v, 0, sizeof *v);
    v->dtype = sh->dtype;
    v->n_dims = sh->n_dims;
    memcpy(v->ne, sh->ne, sizeof v->ne);
    memcpy(v->nb, sh->nb, sizeof v->nb);
    v->numel = sh->numel;
    v->span = sh->span;
    v->data = cpu_arena_data((struct cpu_arena *)arena) + sh->offset;
}

mmrt_status cpu_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                         int n_required, int n_max, struct cpu_op *o)
{
    memset(o, 0, sizeof *o);
    o->dev = dev;
    o->name = mmrt_op_name_of(op);
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    struct mmrt_oc_launch l;
    char why[CPU_ERR_MAX - 64];
    if (mmrt_op_begin(args, op, n_required, n_max, find_arena, dev, &l, why, sizeof why) !=
        MMRT_OK)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    if (((const struct cpu_arena *)l.dst_arena)->readonly)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "dst lies in adopted read-only memory");
    /* SET_ROWS writes an I8 store's scales through src2. */
    if (op == MMRT_OP_SET_ROWS && l.src[2] &&
        ((const struct cpu_arena *)l.src_arena[2])->readonly)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "src2 (scales) lies in adopted read-only memory");
    o->n_src = l.n_src;
    for (int i = 0; i < l.n_src; i++)
        if (l.src[i])
            view_of(l.src[i], l.src_arena[i], &o->src[i]);
    view_of(&l.dst, l.dst_arena, &o->dst);
    o->params = l.params;
    o->params_size = l.params_size;
    return MMRT_OK;
}

mmrt_status cpu_op_params(struct cpu_op *o, void *out, size_t size)
{
    memset(out, 0, size);
    if (!o->params || o->params_size < size)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "params %s (%u bytes, need %zu)",
                       o->params ? "too short" : "missing", o->params_size, size);
    memcpy(out, o->params, size);
    return MMRT_OK;
}

/* Four halves at a time with cpu_f16_to_f32's arithmetic in vector form; the scalar loop
 * finishes the tail. Kept out of line: callers convert whole panels or rows at once. */
void cpu_weight_to_f32(const void *src, int dtype, float *dst, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    switch (dtype) {
    case MMRT_DTYPE_F16:
        for (; i + 4 <= n; i += 4) {
            cpu_v4f v = cpu_f16x4_to_f32(s + i);
            memcpy(dst + i, &v, sizeof v);
        }
        for (; i < n; i++)
            dst[i] = cpu_f16_to_f32(s[i]);
        break;
    case MMRT_DTYPE_BF16:
        for (; i + 4 <= n; i += 4) {
            cpu_v4f v = cpu_bf16x4_to_f32(s + i);
            memcpy(dst + i, &v, sizeof v);
        }
        for (; i < n; i++)
            dst[i] = cpu_bf16_to_f32(s[i]);
        break;
    case MMRT_DTYPE_I8:
        for (; i < n; i++)
            dst[i] = (float)((const int8_t *)src)[i];
        break;
    case MMRT_DTYPE_F8E4M3:
        for (; i < n; i++)
            dst[i] = mmrt_f8e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    }
}

void cpu_q4_dequant(const uint8_t *row, const float *scale, const float *zero, int64_t gs,
                    int64_t k0, int64_t n, float *dst)
{
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = k0 + i, g = k / gs;
        dst[i] = ((float)cpu_q4_code(row, k) - zero[g]) * scale[g];
    }
}

void cpu_q4_xsum(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t G, float *xsum)
{
    const int64_t gs = K / G;
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < G; g++) {
            float s = 0;
            for (int64_t k = g * gs; k < (g + 1) * gs; k++)
                s += x[m * ldx + k];
            xsum[m * G + g] = s;
        }
}

void cpu_q4_gemv_portable(const float *x, int64_t ldx, int64_t M, int64_t K, const uint8_t *w,
                          const float *scale, const float *zero, const float *xsum, int64_t G,
                          int64_t n, float *y, int64_t ldy)
{
    const int64_t gs = K / G;
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *wr = w + j * (K / 2);
            const float *xr = x + m * ldx;
            float tot = 0;
            for (int64_t g = 0; g < G; g++) {
                float acc = 0;
                for (int64_t k = g * gs; k < (g + 1) * gs; k++)
                    acc += (float)cpu_q4_code(wr, k) * xr[k];
                tot += scale[j * G + g] * (acc - zero[j * G + g] * xsum[m * G + g]);
            }
            y[m * ldy + j] = tot;
        }
}
