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
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>

#include "cpu_internal.h"
#include "op_contract.h"

mmrt_status(cpu_bad)(struct cpu_op *o, mmrt_status st, const char *fmt, ...)
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

void cpu_q8_block(const float *x, int64_t n, int digits, int64_t plane, int8_t *lo, int8_t *hi,
                  float *d, int32_t *sum)
{
    const int32_t full = CPU_Q8_FULL(digits);
    const float qf = (float)full;
    float amax = 0;
    bool finite = true;
    for (int64_t k = 0; k < n; k++) {
        const float a = fabsf(x[k]);
        finite = finite && a <= FLT_MAX;
        amax = a > amax ? a : amax;
    }
    /* Q / amax overflows for the smallest amax; those blocks divide instead. */
    const bool scaled = finite && amax >= CPU_Q8_MIN_SCALED, tiny = finite && amax > 0 && !scaled;
    const float inv = scaled ? qf / amax : 0.0f;
    int32_t isum = 0;
    for (int j = 0; j < CPU_Q8_BLOCK; j++) {
        float v = j >= n || !finite ? 0.0f
                  : tiny            ? nearbyintf(x[j] / amax * qf)
                                    : nearbyintf(x[j] * inv);
        v = v > qf ? qf : v < -qf ? -qf : v;
        const int32_t c = (int32_t)v;
        int8_t dg[CPU_Q8_MAX_DIGITS];
        cpu_q8_digits(c, digits, dg);
        for (int t = 0; t < digits; t++)
            (j < 16 ? lo : hi)[t * plane + j % 16] = dg[t];
        isum += c;
    }
    for (int t = 0; t < CPU_Q8_LANES_PER_BLOCK; t++)
        d[t] = n <= 0 ? 0.0f : finite ? amax / qf : NAN;
    *sum = isum;
}

/* cpu_q8_quantize's buffer: d, lg, q, xsum, chunks, each section 64-byte aligned. */
static size_t q8_up(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

size_t cpu_q8_bytes(const struct cpu_q4_q8 *u, int64_t M, int64_t K, int64_t G)
{
    const size_t kp = (size_t)((K + u->chunk - 1) / u->chunk * u->chunk);
    return q8_up((size_t)M * kp / 8 * sizeof(float)) + q8_up(kp / 8 * sizeof(int32_t)) +
           q8_up((size_t)M * kp * (size_t)u->digits) + q8_up((size_t)(M * G) * sizeof(float)) +
           q8_up(kp / (size_t)u->chunk * sizeof(struct cpu_q8_chunk));
}

void cpu_q8_quantize(const struct cpu_q4_q8 *u, const float *x, int64_t ldx, int64_t M,
                     int64_t K, int64_t G, void *buf, struct cpu_q8_rows *out)
{
    const int64_t C = u->chunk, kp = (K + C - 1) / C * C, gs = K / G, lanes = kp / 8;
    const int64_t D = u->digits;
    char *p = buf;
    float *d = (float *)p;
    p += q8_up((size_t)(M * lanes) * sizeof(float));
    int32_t *lg = (int32_t *)p;
    p += q8_up((size_t)lanes * sizeof(int32_t));
    int8_t *q = (int8_t *)p;
    p += q8_up((size_t)(M * kp * D));
    float *xsum = (float *)p;
    p += q8_up((size_t)(M * G) * sizeof(float));
    struct cpu_q8_chunk *ch = (struct cpu_q8_chunk *)p;
    for (int64_t c = 0; c < kp / C; c++) {
        const int64_t k0 = c * C, last = (k0 + C < K ? k0 + C : K) - 1;
        ch[c].g0 = (int32_t)(k0 / gs);
        ch[c].span = (int32_t)(last / gs - k0 / gs + 1);
        for (int64_t l = 0; l < C / 8; l++) {
            const int64_t k = k0 + l / CPU_Q8_LANES_PER_BLOCK * CPU_Q8_BLOCK;
            lg[k0 / 8 + l] = k < K ? (int32_t)(k / gs - k0 / gs) : 0;
        }
    }
    const int64_t nb = kp / CPU_Q8_BLOCK;
    for (int64_t m = 0; m < M; m++) {
        int32_t bsum[512]; /* the blocks' Σq, a slice of the row at a time */
        float *dr = d + m * lanes, *sr = xsum + m * G;
        for (int64_t g = 0; g < G; g++)
            sr[g] = 0;
        for (int64_t b0 = 0; b0 < nb; b0 += 512) {
            /* slices start on a chunk: 512 blocks are whole chunks of every unit */
            const int64_t nbs = nb - b0 < 512 ? nb - b0 : 512, k0 = b0 * CPU_Q8_BLOCK;
            const int64_t kr = K - k0 < nbs * CPU_Q8_BLOCK ? K - k0 : nbs * CPU_Q8_BLOCK;
            u->quant_row(x + m * ldx + k0, kr, nbs * CPU_Q8_BLOCK, q + (m * kp + k0) * D,
                         dr + k0 / 8, bsum);
            for (int64_t b = 0; b < nbs && (b0 + b) * CPU_Q8_BLOCK < K; b++)
                sr[(b0 + b) * CPU_Q8_BLOCK / gs] += dr[(b0 + b) * CPU_Q8_LANES_PER_BLOCK] *
                                                    (float)bsum[b];
        }
    }
    out->kp = kp;
    out->digits = u->digits;
    out->q = q;
    out->d = d;
    out->lg = lg;
    out->ch = ch;
    out->xsum = xsum;
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
