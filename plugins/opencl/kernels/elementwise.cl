/*
 * elementwise.cl — ADD, MUL, SCALE, SWIGLU and the unary activations: one work-item per
 * element of a contiguous F32 tensor, WG_1D items per group, the tail masked.
 *
 * In place (dst == src0, or dst == src1 of the same shape) is safe: each work-item reads its
 * element before writing it, and no item touches another's element.
 *
 * Contraction is off, so each product and sum rounds separately, exactly as the CPU plugin's
 * ISO C does; the activations use OpenCL's full-precision builtins (exp ≤ 3 ulp, erf and tanh
 * ≤ 16 ulp by the spec, about 1 ulp in PoCL's SLEEF), never the native_ variants.
 */
#pragma OPENCL FP_CONTRACT OFF

#define OP_GELU 6
#define OP_GELU_TANH 7
#define OP_QUICK_GELU 8
#define OP_SILU 9
#define OP_SWIGLU 10
#define OP_RELU2 11
#define OP_SCALE 3

/* dst = src0 (+ or ·) src1[i % period]; src1 F32/F16/BF16 (a full tensor when period == n). */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_binary(__global const uchar *ab, long a_off, __global const uchar *bb, long b_off,
              int b_dt, long period, __global uchar *yb, long y_off, long n, int mul)
{
    long i = get_global_id(0);
    if (i >= n)
        return;
    __global const float *a = (__global const float *)(ab + a_off);
    __global float *y = (__global float *)(yb + y_off);
    float bv = load_w(bb + b_off, b_dt, period == n ? i : i % period);
    float av = a[i];
    y[i] = mul ? av * bv : av + bv;
}

/* x·sigmoid(k·x) written as x / (1 + e^(−k·x)): for very negative x the exponential
 * overflows to inf and the result is −0, the limit, rather than NaN. */
float x_sigmoid(float x, float k)
{
    return x / (1.0f + exp(-k * x));
}

/* dst = act(src0) (· src1 for SWIGLU) or src0 · scale for SCALE. */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_unary(__global const uchar *xb, long x_off, __global const uchar *ub, long u_off,
             __global uchar *yb, long y_off, long n, int op, float scale)
{
    long i = get_global_id(0);
    if (i >= n)
        return;
    float x = ((__global const float *)(xb + x_off))[i];
    float r;
    switch (op) {
    case OP_SCALE:
        r = x * scale;
        break;
    case OP_GELU:
        r = 0.5f * x * (1.0f + erf(x * M_SQRT1_2_F));
        break;
    case OP_GELU_TANH: {
        /* Beyond |u| = 10, tanh(u) is ±1 in f32; said explicitly because some tanh (PoCL's)
         * return 1 − 2⁻²⁴ there, and the far negative tail must be exactly 0. */
        float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        float t = fabs(u) >= 10.0f ? copysign(1.0f, u) : tanh(u);
        r = 0.5f * x * (1.0f + t);
        break;
    }
    case OP_QUICK_GELU:
        r = x_sigmoid(x, 1.702f);
        break;
    case OP_SILU:
        r = x_sigmoid(x, 1.0f);
        break;
    case OP_SWIGLU:
        r = x_sigmoid(x, 1.0f) * ((__global const float *)(ub + u_off))[i];
        break;
    case OP_RELU2: {
        float p = x > 0.0f ? x : 0.0f;
        r = isnan(x) ? x : p * p;
        break;
    }
    default:
        r = x;
        break;
    }
    ((__global float *)(yb + y_off))[i] = r;
}
