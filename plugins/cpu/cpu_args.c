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

/* The descriptor's arena, found once for both the check and the view. */
struct arena_lookup {
    struct mmrt_device *dev;
    struct cpu_arena *found;
};

static bool arena_bytes(void *ctx, const void *buffer, uint64_t *nbytes)
{
    struct arena_lookup *l = ctx;
    l->found = cpu_arena_find(l->dev, buffer);
    if (l->found)
        *nbytes = l->found->nbytes;
    return l->found != NULL;
}

static mmrt_status resolve(struct cpu_op *o, const char *what, const struct mmrt_tensor *t,
                           struct cpu_view *v, struct mmrt_pv_shape *shape)
{
    struct mmrt_pv_shape sh;
    char why[512];
    struct arena_lookup l = { o->dev, NULL };
    if (mmrt_pv_check(what, t, arena_bytes, &l, &sh, why, sizeof why) != MMRT_OK)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    struct cpu_arena *a = l.found;
    memset(v, 0, sizeof *v);
    v->dtype = sh.dtype;
    v->n_dims = sh.n_dims;
    memcpy(v->ne, sh.ne, sizeof v->ne);
    memcpy(v->nb, sh.nb, sizeof v->nb);
    v->numel = sh.numel;
    v->span = sh.span;
    v->data = cpu_arena_data(a) + t->offset;
    *shape = sh;
    return MMRT_OK;
}

mmrt_status cpu_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                         int n_required, int n_max, struct cpu_op *o)
{
    memset(o, 0, sizeof *o);
    o->dev = dev;
    o->name = mmrt_op_name_of(op);
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!args)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "no arguments");
    /* All of mmrt_op_args is ABI 1.0; copy only what the caller's struct holds. */
    struct mmrt_op_args a;
    memset(&a, 0, sizeof a);
    if (args->hdr.abi_major != MMRT_ABI_MAJOR || args->hdr.struct_size < sizeof a)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "op_args has ABI %u (%u bytes), expected %d "
                       "(≥ %zu bytes)", args->hdr.abi_major, args->hdr.struct_size,
                       MMRT_ABI_MAJOR, sizeof a);
    memcpy(&a, args, sizeof a);
    if (a.op != op)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "launched as op %d (%s)", (int)a.op,
                       mmrt_op_name_of(a.op));
    if (a.n_src < n_required || a.n_src > n_max)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "n_src is %d, expected %d…%d", (int)a.n_src,
                       n_required, n_max);
    o->n_src = a.n_src;
    struct mmrt_pv_shape shapes[MMRT_MAX_SRC], dshape;
    const struct mmrt_pv_shape *s[MMRT_MAX_SRC] = { 0 };
    for (int i = 0; i < a.n_src; i++) {
        char what[16];
        snprintf(what, sizeof what, "src%d", i);
        if (!a.src[i]) {
            if (i < n_required)
                return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s is required but NULL", what);
            continue;
        }
        mmrt_status st = resolve(o, what, a.src[i], &o->src[i], &shapes[i]);
        if (st != MMRT_OK)
            return st;
        s[i] = &shapes[i];
    }
    if (!a.dst)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "dst is NULL");
    mmrt_status st = resolve(o, "dst", a.dst, &o->dst, &dshape);
    if (st != MMRT_OK)
        return st;
    const struct cpu_arena *dst_arena = cpu_arena_find(dev, a.dst->buffer);
    if (dst_arena && dst_arena->readonly)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "dst lies in adopted read-only memory");
    if (!mmrt_pv_injective(o->dst.dtype, o->dst.n_dims, o->dst.ne, o->dst.nb))
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "dst: its strides make elements overlap");
    o->params = a.params;
    o->params_size = a.params_size;
    /* plugin.h's contract, in op_contract.h's one copy: what the op functions may assume. */
    char why[CPU_ERR_MAX - 64];
    if (mmrt_op_check(op, a.n_src, s, &dshape, a.params, a.params_size, why, sizeof why) !=
        MMRT_OK)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
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

float cpu_q4_dot_portable(const float *x, const uint8_t *w, const float *scale,
                          const float *zero, const float *xsum, int64_t G, int64_t gs)
{
    float tot = 0;
    for (int64_t g = 0; g < G; g++) {
        float acc = 0;
        for (int64_t k = g * gs; k < (g + 1) * gs; k++)
            acc += (float)cpu_q4_code(w, k) * x[k];
        tot += scale[g] * (acc - zero[g] * xsum[g]);
    }
    return tot;
}
