/*
 * plugins/cpu/cpu_ops_elementwise.c — ADD, MUL, SCALE, SWIGLU and the unary activations.
 *
 * All are computed element by element in f32 over contiguous tensors, split into flat index
 * ranges across the pool. dst may be exactly src0 (or any source of dst's shape): each element
 * is read before the same element is written, so in place is safe. A broadcast src1 is one
 * row of src0's inner size, indexed by position modulo that size.
 */
#include <inttypes.h>
#include <math.h>

#include "cpu_internal.h"

/* ---- ADD, MUL ------------------------------------------------------------------------- */

struct binary_ctx {
    const float *a;
    const char *b;
    float *d;
    int64_t n_inner; /* length of b's period: the row for a broadcast, else numel */
    int b_dtype;
    bool mul;
};

#define BINARY_LOOP(LOAD)                                                                      \
    do {                                                                                       \
        if (c->mul)                                                                            \
            for (int64_t k = 0; k < len; k++)                                                  \
                d[k] = a[k] * LOAD(k);                                                         \
        else                                                                                   \
            for (int64_t k = 0; k < len; k++)                                                  \
                d[k] = a[k] + LOAD(k);                                                         \
    } while (0)

static void binary_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct binary_ctx *c = vctx;
    (void)tid;
    for (int64_t i = begin; i < end;) {
        int64_t j = i % c->n_inner;
        int64_t len = c->n_inner - j < end - i ? c->n_inner - j : end - i;
        const float *a = c->a + i;
        float *d = c->d + i;
        switch (c->b_dtype) {
        case MMRT_DTYPE_F16: {
            const uint16_t *b = (const uint16_t *)c->b + j;
#define LOAD_F16(k) cpu_f16_to_f32(b[k])
            BINARY_LOOP(LOAD_F16);
            break;
        }
        case MMRT_DTYPE_BF16: {
            const uint16_t *b = (const uint16_t *)c->b + j;
#define LOAD_BF16(k) cpu_bf16_to_f32(b[k])
            BINARY_LOOP(LOAD_BF16);
            break;
        }
        default: {
            const float *b = (const float *)c->b + j;
#define LOAD_F32(k) b[k]
            BINARY_LOOP(LOAD_F32);
            break;
        }
        }
        i += len;
    }
}

static mmrt_status binary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, op, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *a = &o.src[0], *b = &o.src[1];
    /* b has a's shape or is one row broadcast over a's rows (op_contract.h): as many
     * elements means a one-to-one walk either way. */
    bool same = b->numel == a->numel;
    if (a->numel == 0)
        return MMRT_OK;
    struct binary_ctx c = {
        .a = (const float *)a->data, .b = b->data, .d = (float *)o.dst.data,
        .n_inner = same ? a->numel : b->numel, .b_dtype = b->dtype, .mul = op == MMRT_OP_MUL,
    };
    cpu_parallel_for(&dev->pool, a->numel, 1.0, binary_task, &c);
    return MMRT_OK;
}

mmrt_status cpu_op_add(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return binary(dev, args, MMRT_OP_ADD);
}

mmrt_status cpu_op_mul(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return binary(dev, args, MMRT_OP_MUL);
}

/* ---- unary: SCALE and the activations ------------------------------------------------- */

struct unary_ctx {
    const struct cpu_kernels *kt;
    const float *a;
    const float *b; /* SWIGLU's up projection */
    float *d;
    float scale;
    int op;
};

static inline float gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
}

static inline float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static inline float relu2(float x)
{
    float r = x > 0.0f ? x : 0.0f;
    return isnan(x) ? x : r * r;
}

static void unary_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct unary_ctx *c = vctx;
    const float *a = c->a;
    float *d = c->d;
    (void)tid;
    switch (c->op) {
    case MMRT_OP_SCALE:
        for (int64_t i = begin; i < end; i++)
            d[i] = a[i] * c->scale;
        break;
    case MMRT_OP_GELU:
        if (c->kt->gelu) {
            c->kt->gelu(a + begin, d + begin, end - begin);
            break;
        }
        for (int64_t i = begin; i < end; i++)
            d[i] = gelu_erf(a[i]);
        break;
    case MMRT_OP_GELU_TANH:
        for (int64_t i = begin; i < end; i++)
            d[i] = gelu_tanh(a[i]);
        break;
    /* The sigmoid family goes through the kernel table (a vectorised exp on AVX2/AVX-512;
     * the portable table runs exactly the scalar x_sigmoid below). */
    case MMRT_OP_QUICK_GELU:
        c->kt->x_sigmoid(a + begin, 1.702f, NULL, d + begin, end - begin);
        break;
    case MMRT_OP_SILU:
        c->kt->x_sigmoid(a + begin, 1.0f, NULL, d + begin, end - begin);
        break;
    case MMRT_OP_SWIGLU:
        c->kt->x_sigmoid(a + begin, 1.0f, c->b + begin, d + begin, end - begin);
        break;
    case MMRT_OP_RELU2:
        for (int64_t i = begin; i < end; i++)
            d[i] = relu2(a[i]);
        break;
    default:
        break;
    }
}

static mmrt_status unary(struct mmrt_device *dev, const struct mmrt_op_args *args, int op)
{
    struct cpu_op o;
    int n_src = op == MMRT_OP_SWIGLU ? 2 : 1;
    mmrt_status st = cpu_op_begin(dev, args, op, n_src, n_src, &o);
    if (st != MMRT_OK)
        return st;
    struct unary_ctx c = { .kt = &dev->kern, .op = op };
    if (op == MMRT_OP_SCALE) {
        struct mmrt_scale_params p;
        if ((st = cpu_op_params(&o, &p, sizeof p)))
            return st;
        c.scale = p.scale;
    }
    c.a = (const float *)o.src[0].data;
    c.b = (const float *)o.src[1].data;
    c.d = (float *)o.dst.data;
    /* Transcendentals cost tens of multiply-adds; the rest one. */
    double cost = op == MMRT_OP_SCALE || op == MMRT_OP_RELU2 ? 1.0 : 20.0;
    cpu_parallel_for(&dev->pool, o.dst.numel, cost, unary_task, &c);
    return MMRT_OK;
}

mmrt_status cpu_op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SCALE);
}

mmrt_status cpu_op_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_GELU);
}

mmrt_status cpu_op_gelu_tanh(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_GELU_TANH);
}

mmrt_status cpu_op_quick_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_QUICK_GELU);
}

mmrt_status cpu_op_silu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SILU);
}

mmrt_status cpu_op_swiglu(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_SWIGLU);
}

mmrt_status cpu_op_relu2(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    return unary(dev, args, MMRT_OP_RELU2);
}
