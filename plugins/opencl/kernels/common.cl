/*
 * common.cl — what every kernel of libmmrt_opencl shares. The plugin builds all .cl files as
 * one program, this one first.
 *
 * Addressing: every tensor reaches a kernel as (__global uchar *buffer, long byte offset),
 * never as a sub-buffer — sub-buffer origins must be aligned to CL_DEVICE_MEM_BASE_ADDR_ALIGN
 * and tensor offsets need not be. The host has checked that offsets and strides are multiples
 * of the element size, so the typed casts below are aligned.
 *
 * Weights: F16 and BF16 are read as raw ushort and widened here, so no kernel needs
 * cl_khr_fp16. Both widenings are exact.
 *
 * Build options set by the host (ocl_program.c):
 *   OCL_FP64        1 when the device has cl_khr_fp64: ROPE's cos/sin and the statistics of
 *                   the norms and softmax then use double, which makes them agree with the
 *                   CPU reference (glibc's f32 functions, double statistics) to the last bit
 *                   or two instead of to OpenCL's few-ulp bounds.
 *   OCL_KV_FLOATS   floats of local memory ATTENTION may use for one K/V tile.
 *   WG_*, ATT_*, MM_*  work-group shapes, see below.
 */
#if OCL_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t; /* statistics of row reductions (norm moments, softmax sums) */
#else
typedef float acc_t;
#endif

/* enum mmrt_dtype (frozen ABI values) */
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_I8 4
#define DT_F8E4M3 6

/* OCL_ERR_GET_ROWS and OCL_ERR_CU_SEQLENS, the codes a checking kernel writes into err[0]
 * of the device error buffer, also come from the host, which turns them into messages. */

/* Work-group shapes come from the host as build options (ocl_internal.h), so grids and
 * kernel loops cannot drift apart. They are fixed per kernel (reqd_work_group_size): PoCL
 * specialises a kernel's work-group function on its local size, so one size means one
 * compile. */
#if !defined(WG_1D) || !defined(WG_ROW) || !defined(WG_ROPE) || !defined(ATT_BQ) ||             \
    !defined(ATT_BK) || !defined(MM_T) || !defined(MM_SMALL_M) || !defined(MM_SMALL_N) ||      \
    !defined(MM_SMALL_WG) || !defined(OCL_KV_FLOATS) || !defined(OCL_FP64) ||                     \
    !defined(OCL_ERR_GET_ROWS) || !defined(OCL_ERR_CU_SEQLENS)
#error "build options from ocl_program.c missing"
#endif

/* Exact f16 → f32 without branches: exponent and mantissa moved into f32 position and
 * rescaled by 2^-112; subnormal halves rebuilt as (0.5 + m·2^-24) − 0.5. Inf and NaN survive
 * the rescale. Every intermediate is an f32 normal, so flush-to-zero devices agree. */
float f16_to_f32(ushort h)
{
    uint w = (uint)h << 16;
    uint sign = w & 0x80000000u;
    uint two_w = w + w;
    float normal = as_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float sub = as_float((two_w >> 17) | (126u << 23)) - 0.5f;
    uint mag = two_w < (1u << 27) ? as_uint(sub) : as_uint(normal);
    return as_float(sign | mag);
}

/* f16_to_f32 on four halves at once, for the MATMUL kernels' vector loads. */
float4 f16x4_to_f32(ushort4 h)
{
    uint4 w = convert_uint4(h) << 16;
    uint4 sign = w & 0x80000000u;
    uint4 two_w = w + w;
    float4 normal = as_float4((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float4 sub = as_float4((two_w >> 17) | (126u << 23)) - 0.5f;
    uint4 mag = select(as_uint4(normal), as_uint4(sub), two_w < (uint4)(1u << 27));
    return as_float4(sign | mag);
}

float bf16_to_f32(ushort h)
{
    return as_float((uint)h << 16);
}

/* f32 → f16 bits, round to nearest even, in integer arithmetic only (no dependence on the
 * device's denormal mode): overflow gives ±inf, NaN a quiet NaN with its sign. */
ushort f32_to_f16(float f)
{
    uint x = as_uint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (ushort)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* ≥ 65520, halfway above 65504 */
        return (ushort)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        /* Subnormal half (or zero): the value is m·2^(e−150); in units of 2^-24 that is
         * m >> (126 − e), rounded to nearest even. ≤ 2^-25 rounds to zero. Rounding up to
         * 0x400 gives the smallest normal, which is the right encoding too. */
        if (ax <= 0x33000000u)
            return (ushort)sign;
        uint e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint shift = 126u - e; /* 14 … 24 */
        uint r = m >> shift, rem = m & ((1u << shift) - 1u), tie = 1u << (shift - 1u);
        if (rem > tie || (rem == tie && (r & 1u)))
            r++;
        return (ushort)(sign | r);
    }
    /* Re-bias the exponent (127 → 15) and round the 13 dropped bits to nearest even; a carry
     * out of the mantissa correctly bumps the exponent. */
    uint odd = (ax >> 13) & 1u;
    ax += ((uint)(15 - 127) << 23) + 0xfffu + odd;
    return (ushort)(sign | (ax >> 13));
}

/* f32 → bf16 bits, round to nearest even; NaN stays a quiet NaN with its sign. */
ushort f32_to_bf16(float f)
{
    uint x = as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (ushort)(x >> 16);
}

/* FP8 E4M3 code → f32, exactly (plugin.h mmrt_f8e4m3_to_f32): a normal code's 7 magnitude
 * bits moved to f32 bits 20…26 with 120 added to the exponent, a subnormal one as its
 * mantissa · 2^-9 (an exact product and an f32 normal, so flush-to-zero devices agree),
 * 0x7F the NaN, then the sign. */
float f8e4m3_to_f32(uchar c)
{
    uint mag = c & 0x7Fu, sign = (uint)(c & 0x80u) << 24;
    uint bits = mag == 0x7Fu ? 0x7FC00000u
                : mag < 8u   ? as_uint((float)mag * 0x1.0p-9f)
                             : (mag << 20) + (120u << 23);
    return as_float(bits | sign);
}

/* f32 → FP8 E4M3 (plugin.h mmrt_f32_to_f8e4m3), in integer arithmetic only so no device
 * flush or rounding mode enters: round to nearest even, magnitudes ≥ 448 (infinity too)
 * saturate to 0x7E, NaN gives 0x7F, the sign kept. */
uchar f32_to_f8e4m3(float f)
{
    uint x = as_uint(f);
    uchar sign = (uchar)((x >> 24) & 0x80u);
    uint ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u)
        return sign | 0x7Fu;
    if (ax >= 0x43E00000u) /* 448 */
        return sign | 0x7Eu;
    if (ax < 0x3C800000u) {
        /* Subnormal codes count 2^-9 steps: the f32 significand (implicit bit included) is
         * shifted by s = 141 − exponent and rounded to nearest even; s ≥ 25 leaves less than
         * half a step (an f32 subnormal's exponent field is 0, which lands there too). */
        uint e = ax >> 23;
        uint s = 141u - e;
        if (e == 0u || s >= 25u)
            return sign;
        uint m = (ax & 0x7FFFFFu) | 0x800000u;
        uint q = m >> s, rem = m & ((1u << s) - 1u), tie = 1u << (s - 1u);
        q += rem > tie || (rem == tie && (q & 1u));
        return sign | (uchar)q;
    }
    ax += ((uint)(7 - 127) << 23) + 0x7FFFFu + ((ax >> 20) & 1u);
    return sign | (uchar)(ax >> 20);
}

/* An I8 KV-store code widened with its row's scale (plugin.h "I8 with row scales"): the f32
 * product c · sc rounded once. The pragma keeps the product from being fused with whatever
 * the caller adds it to, which would skip that rounding and give other bits than an F32 copy
 * of the store holding c · sc. */
float i8_widen(char c, float sc)
{
#pragma OPENCL FP_CONTRACT OFF
    return (float)c * sc;
}

/* The correctly rounded f32 quotient a / b, which GATHER_HEADS and the I8 quantizer need
 * bit for bit on every plugin. With fp64 it is formed in double and rounded once to f32,
 * which gives the same result (53 ≥ 2·24 + 2 bits, so the double rounding is innocuous);
 * without fp64 the host launches its users only when the program was built with
 * -cl-fp32-correctly-rounded-divide-sqrt (OpenCL's f32 division may otherwise be 2.5 ulp
 * off). */
float div_rn(float a, float b)
{
#if OCL_FP64
    return (float)((double)a / (double)b);
#else
    return a / b;
#endif
}

/* Element i of a weight-dtype array (F32, F16 or BF16, or an F8E4M3 KV table) starting at
 * byte address p. The branch is uniform across a launch; hot loops use the typed variants
 * instead. */
float load_w(__global const uchar *p, int dt, long i)
{
    if (dt == DT_F8E4M3)
        return f8e4m3_to_f32(p[i]);
    if (dt == DT_F16)
        return f16_to_f32(((__global const ushort *)p)[i]);
    if (dt == DT_BF16)
        return bf16_to_f32(((__global const ushort *)p)[i]);
    return ((__global const float *)p)[i];
}

/* Sum of v over the work-group (WG_ROW items), returned to every item. Ends with a barrier,
 * so the scratch may be reused right away. */
acc_t wg_sum(__local acc_t *s, acc_t v)
{
    int lid = get_local_id(0);
    s[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG_ROW / 2; stride > 0; stride >>= 1) {
        if (lid < stride)
            s[lid] += s[lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    acc_t r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

float wg_max(__local float *s, float v)
{
    int lid = get_local_id(0);
    s[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG_ROW / 2; stride > 0; stride >>= 1) {
        if (lid < stride)
            s[lid] = fmax(s[lid], s[lid + stride]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
