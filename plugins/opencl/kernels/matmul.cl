/*
 * matmul.cl — y[M, N] = x[M, K] · W[N, K]ᵀ (+ b[N]) with x and y contiguous F32, W F32, F16,
 * BF16, I8 or U4 (one kernel per W dtype, so the inner loops carry no dtype branch), b any float
 * weight dtype. An I8 W (plugin.h, ABI 1.3) holds codes that stand for W[n, k] · s[n] with
 * the F32 scales s[N]: its kernels convert the codes to f32 exactly (char / char4 loads), sum
 * x · code like any other dtype, and multiply each finished sum by s[n] before the bias — one
 * rounding more than a float W, and W read as 1 byte per weight. A U4 W (plugin.h) is packed
 * 4-bit codes [N, K/2] with F32 scales and zero points [N, G]: the tiled kernel dequantizes
 * while it stages W (a K panel of 16 lies inside one group, gs being a multiple of 32), the
 * small-M one has its own loop over packed 16-byte blocks (k_mm_small_u4). Every kernel takes
 * the scales, zero points and G (MM_ARGS); the float ones never read them.
 * PATCH_EMBED runs the same kernels on the gathered patches (k_im2col).
 *
 * k_mm_tiled_*: a work-group of MM_L × MM_L (16 × 16) items computes an MM_T × MM_T (64 × 64)
 * tile of y. Item (tx, ty) owns rows ty + 16·i (i < 4) and the 4 consecutive columns 4·tx …
 * 4·tx + 3, held as one float4 per row, so its inner step is 4 vector multiply-adds — what
 * turns into SIMD on a CPU device (PoCL) and into 16-byte accesses on a GPU. K is walked in
 * panels of MM_KP (16): the group stages the x panel [64 rows × 16] and the W panel
 * [64 rows × 16] in local memory, k-major and converted to f32 once, then every item reads
 * one float4 of W and 4 floats of x per k. Out-of-range rows, columns and k are staged as 0.
 *
 * k_mm_small_*: for M ≤ MM_SMALL_M (decode: a tile would be mostly padding). A work-group of
 * MM_SMALL_WG items computes MM_SMALL_N consecutive outputs for all M rows: item l takes the
 * 4-element chunks k = 4l, 4l + 4·WG, … of the W rows (contiguous vector loads on a CPU,
 * coalesced on a GPU: per step the group reads 4·WG consecutive elements of a row, 256 bytes
 * for I8), the K % 4 tail goes one element per item, and a local tree sums the partials. A
 * row's arithmetic does not depend on how many rows the launch has.
 *
 * Accumulation is f32 with contraction allowed (fma where the device has it); the summation
 * order differs from the CPU plugin's, so results agree to f32 rounding over K, not bit for bit.
 */
#pragma OPENCL FP_CONTRACT ON

/* MM_T (tile edge), MM_SMALL_M/N/WG come from the host. The staging loop has every item load
 * 4 elements of each panel, which ties the panel depth to the work-group edge. */
#define MM_L (MM_T / 4) /* work-group edge: MM_L × MM_L items */
#define MM_KP MM_L      /* K panel: MM_T × MM_KP = 4 · MM_L² elements per panel */
#define MM_PAD 4        /* keeps each local line 16-byte aligned */

#define LOAD_F32(w, i) ((w)[i])
#define LOAD_F16(w, i) f16_to_f32((w)[i])
#define LOAD_BF16(w, i) bf16_to_f32((w)[i])
#define LOAD4_F32(w, i) vload4(0, (w) + (i))
#define LOAD4_F16(w, i) f16x4_to_f32(vload4(0, (w) + (i)))
#define LOAD4_BF16(w, i) as_float4(convert_uint4(vload4(0, (w) + (i))) << 16)
#define LOAD_I8(w, i) ((float)(w)[i]) /* the code; its scale multiplies the finished sum */
#define LOAD4_I8(w, i) convert_float4(vload4(0, (w) + (i)))

/* Every MATMUL kernel has the same arguments: x, W, the scales (I8: [N]; U4: [N, G]), the zero
 * points (U4 only) with G, the bias, y, and M, K, N. A kernel ignores what its W dtype lacks. */
#define MM_ARGS                                                                                \
    __global const uchar *xb, long x_off, __global const uchar *wb, long w_off,                \
        __global const uchar *sb, long s_off, __global const uchar *zb, long z_off, long G,    \
        __global const uchar *bb, long b_off, int b_dt, int has_b, __global uchar *yb,         \
        long y_off, long M, long K, long N

/* W element (n, k) as f32 before any per-row scale, for the tiled kernels' staging; w, K, sc,
 * zp and G are the kernel's. */
#define LOADNK_F32(n, k) ((w)[(n) * K + (k)])
#define LOADNK_F16(n, k) f16_to_f32((w)[(n) * K + (k)])
#define LOADNK_BF16(n, k) bf16_to_f32((w)[(n) * K + (k)])
#define LOADNK_I8(n, k) ((float)(w)[(n) * K + (k)])
#define LOADNK_U4(n, k) u4_weight(w, (n), (k), K, sc, zp, G)

/* What code k of U4 row n stands for (plugin.h's layout: byte k % 16 of block k / 32, low
 * nibble for the first 16 codes of the block). The value is rounded once, as (code − zero) ·
 * scale in f32, which is how the reference dequantizes too. */
float u4_weight(__global const uchar *w, long n, long k, long K, __global const float *sc,
                __global const float *zp, long G)
{
    uchar b = w[n * (K / 2) + (k / 32) * 16 + (k % 16)];
    float c = (float)((k % 32) < 16 ? (b & 0xF) : (b >> 4));
    long g = n * G + k / (K / G);
    return (c - zp[g]) * sc[g];
}

#define DEFINE_MM_TILED(SUFFIX, WT, LOADNK, SCALED)                                            \
__kernel __attribute__((reqd_work_group_size(MM_L, MM_L, 1)))                                  \
void k_mm_tiled_##SUFFIX(MM_ARGS)                                                              \
{                                                                                              \
    __local float xs[MM_KP][MM_T + MM_PAD], ws[MM_KP][MM_T + MM_PAD];                          \
    __global const float *x = (__global const float *)(xb + x_off);                           \
    __global const WT *w = (__global const WT *)(wb + w_off);                                 \
    __global const float *sc = (__global const float *)(sb + s_off);                          \
    __global const float *zp = (__global const float *)(zb + z_off);                          \
    (void)zp;                                                                                  \
    int tx = get_local_id(0), ty = get_local_id(1), lid = ty * MM_L + tx;                      \
    long n0 = get_group_id(0) * MM_T, m0 = get_group_id(1) * MM_T;                             \
    float4 acc[4] = { (float4)0.0f, (float4)0.0f, (float4)0.0f, (float4)0.0f };               \
    for (long k0 = 0; k0 < K; k0 += MM_KP) {                                                   \
        for (int r = 0; r < 4; r++) {                                                          \
            int e = lid + r * MM_L * MM_L, row = e / MM_KP, kk = e % MM_KP;                    \
            long gk = k0 + kk, gm = m0 + row, gn = n0 + row;                                   \
            xs[kk][row] = gm < M && gk < K ? x[gm * K + gk] : 0.0f;                            \
            ws[kk][row] = gn < N && gk < K ? LOADNK(gn, gk) : 0.0f;                            \
        }                                                                                      \
        barrier(CLK_LOCAL_MEM_FENCE);                                                          \
        for (int kk = 0; kk < MM_KP; kk++) {                                                   \
            float4 b = vload4(0, &ws[kk][4 * tx]);                                             \
            for (int i = 0; i < 4; i++)                                                        \
                acc[i] += xs[kk][ty + MM_L * i] * b;                                           \
        }                                                                                      \
        barrier(CLK_LOCAL_MEM_FENCE);                                                          \
    }                                                                                          \
    __global float *y = (__global float *)(yb + y_off);                                       \
    long n = n0 + 4 * tx;                                                                      \
    float bias[4], scale[4], out[4];                                                           \
    for (int j = 0; j < 4; j++) {                                                              \
        bias[j] = has_b && n + j < N ? load_w(bb + b_off, b_dt, n + j) : 0.0f;                 \
        scale[j] = SCALED && n + j < N ? sc[n + j] : 1.0f;                                     \
    }                                                                                          \
    for (int i = 0; i < 4; i++) {                                                              \
        long m = m0 + ty + MM_L * i;                                                           \
        if (m >= M)                                                                            \
            continue;                                                                          \
        vstore4(acc[i], 0, out);                                                               \
        for (int j = 0; j < 4 && n + j < N; j++)                                               \
            y[m * N + n + j] = (SCALED ? out[j] * scale[j] : out[j]) + bias[j];                \
    }                                                                                          \
}

/* The small-M kernels' last step: a local tree over the items' partial sums, then · scale
 * (I8) and + bias per output. `red` and the partials are the kernel's. */
#define MM_SMALL_FINISH(SCALED)                                                                \
    barrier(CLK_LOCAL_MEM_FENCE);                                                              \
    for (int stride = MM_SMALL_WG / 2; stride > 0; stride >>= 1) {                             \
        if (lid < stride)                                                                      \
            for (int q = 0; q < MM_SMALL_M * MM_SMALL_N; q++)                                  \
                red[q][lid] += red[q][lid + stride];                                           \
        barrier(CLK_LOCAL_MEM_FENCE);                                                          \
    }                                                                                          \
    if (lid < MM_SMALL_M * MM_SMALL_N) {                                                       \
        int m = lid / MM_SMALL_N, j = lid % MM_SMALL_N;                                        \
        long n = n0 + j;                                                                       \
        if (m < M && n < N) {                                                                  \
            float sum = red[lid][0];                                                           \
            if (SCALED)                                                                        \
                sum *= ((__global const float *)(sb + s_off))[n];                              \
            ((__global float *)(yb + y_off))[m * N + n] =                                      \
                sum + (has_b ? load_w(bb + b_off, b_dt, n) : 0.0f);                            \
        }                                                                                      \
    }

#define DEFINE_MM_SMALL(SUFFIX, WT, LOADW, LOADW4, SCALED)                                     \
__kernel __attribute__((reqd_work_group_size(MM_SMALL_WG, 1, 1)))                              \
void k_mm_small_##SUFFIX(MM_ARGS)                                                              \
{                                                                                              \
    __local float red[MM_SMALL_M * MM_SMALL_N][MM_SMALL_WG];                                   \
    __global const float *x = (__global const float *)(xb + x_off);                           \
    __global const WT *w = (__global const WT *)(wb + w_off);                                 \
    int lid = get_local_id(0);                                                                 \
    long n0 = get_group_id(0) * MM_SMALL_N;                                                    \
    float4 acc[MM_SMALL_M][MM_SMALL_N];                                                        \
    for (int m = 0; m < MM_SMALL_M; m++)                                                       \
        for (int j = 0; j < MM_SMALL_N; j++)                                                   \
            acc[m][j] = (float4)0.0f;                                                          \
    long k4 = K & ~3L;                                                                         \
    for (long k = 4 * lid; k < k4; k += 4 * MM_SMALL_WG) {                                     \
        float4 wv[MM_SMALL_N];                                                                 \
        for (int j = 0; j < MM_SMALL_N; j++)                                                   \
            wv[j] = n0 + j < N ? LOADW4(w, (n0 + j) * K + k) : (float4)0.0f;                   \
        for (int m = 0; m < MM_SMALL_M && m < M; m++) {                                        \
            float4 xv = vload4(0, x + m * K + k);                                              \
            for (int j = 0; j < MM_SMALL_N; j++)                                               \
                acc[m][j] += xv * wv[j];                                                       \
        }                                                                                      \
    }                                                                                          \
    long kt = k4 + lid; /* the K % 4 tail, one element per item */                             \
    for (int m = 0; m < MM_SMALL_M; m++)                                                       \
        for (int j = 0; j < MM_SMALL_N; j++) {                                                 \
            float4 a = acc[m][j];                                                              \
            float s = (a.s0 + a.s1) + (a.s2 + a.s3);                                           \
            if (kt < K && m < M && n0 + j < N)                                                 \
                s += x[m * K + kt] * LOADW(w, (n0 + j) * K + kt);                              \
            red[m * MM_SMALL_N + j][lid] = s;                                                  \
        }                                                                                      \
    MM_SMALL_FINISH(SCALED)                                                                    \
}

DEFINE_MM_TILED(f32, float, LOADNK_F32, 0)
DEFINE_MM_TILED(f16, ushort, LOADNK_F16, 0)
DEFINE_MM_TILED(bf16, ushort, LOADNK_BF16, 0)
DEFINE_MM_TILED(i8, char, LOADNK_I8, 1)
DEFINE_MM_TILED(u4, uchar, LOADNK_U4, 0)
DEFINE_MM_SMALL(f32, float, LOAD_F32, LOAD4_F32, 0)
DEFINE_MM_SMALL(f16, ushort, LOAD_F16, LOAD4_F16, 0)
DEFINE_MM_SMALL(bf16, ushort, LOAD_BF16, LOAD4_BF16, 0)
DEFINE_MM_SMALL(i8, char, LOAD_I8, LOAD4_I8, 1)

/* U4, M ≤ MM_SMALL_M: the float kernels' work split with the U4 block as the unit. Item l
 * takes the 16-byte blocks l, l + WG, … of each of the group's MM_SMALL_N W rows (one
 * vload16 of packed codes: per step the group reads WG · 16 consecutive bytes of a row, so W
 * is streamed once at its packed size), turns the block's 32 codes into code − zero in f32
 * (exact for whole zero points) and multiplies them into the matching 32 floats of each x
 * row; the block's sum, in a fixed order, is scaled once by the group's scale. K is a
 * multiple of 32, so there is no tail; the reduction and the bias are the float kernels'. */
__kernel __attribute__((reqd_work_group_size(MM_SMALL_WG, 1, 1)))
void k_mm_small_u4(MM_ARGS)
{
    __local float red[MM_SMALL_M * MM_SMALL_N][MM_SMALL_WG];
    __global const float *x = (__global const float *)(xb + x_off);
    __global const uchar *w = wb + w_off;
    __global const float *sc = (__global const float *)(sb + s_off);
    __global const float *zp = (__global const float *)(zb + z_off);
    int lid = get_local_id(0);
    long n0 = get_group_id(0) * MM_SMALL_N;
    long n_blocks = K / 32, gs = K / G, row_bytes = K / 2;
    float4 acc[MM_SMALL_M][MM_SMALL_N];
    for (int m = 0; m < MM_SMALL_M; m++)
        for (int j = 0; j < MM_SMALL_N; j++)
            acc[m][j] = (float4)0.0f;
    for (long blk = lid; blk < n_blocks; blk += MM_SMALL_WG) {
        long k = blk * 32, g = k / gs;
        for (int j = 0; j < MM_SMALL_N && n0 + j < N; j++) {
            long n = n0 + j;
            uchar16 q = vload16(0, w + n * row_bytes + blk * 16);
            float z = zp[n * G + g], s = sc[n * G + g];
            float16 lo = convert_float16(q & (uchar16)0xF) - z;
            float16 hi = convert_float16(q >> (uchar16)4) - z;
            for (int m = 0; m < MM_SMALL_M && m < M; m++) {
                __global const float *xr = x + m * K + k;
                float16 p = vload16(0, xr) * lo + vload16(1, xr) * hi;
                float4 t = (p.s0123 + p.s4567) + (p.s89ab + p.scdef);
                acc[m][j] += t * s;
            }
        }
    }
    for (int m = 0; m < MM_SMALL_M; m++)
        for (int j = 0; j < MM_SMALL_N; j++) {
            float4 a = acc[m][j];
            red[m * MM_SMALL_N + j][lid] = (a.s0 + a.s1) + (a.s2 + a.s3);
        }
    MM_SMALL_FINISH(0)
}

/* PATCH_EMBED's gather: row r = (b, py, px) of cols [B·nP, C·P·P] holds that patch in
 * (c, kh, kw) order, the order of the flattened conv weight [O, C·P·P]. Item (k, r). */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_im2col(__global const uchar *ib, long i_off, __global uchar *cb, long c_off, long C,
              long H, long W, int P)
{
    long k = get_global_id(0), r = get_global_id(1);
    long plen = C * P * P;
    if (k >= plen)
        return;
    long npx = W / P, n_patches = (H / P) * npx;
    long bi = r / n_patches, p = r % n_patches, py = p / npx, px = p % npx;
    long ch = k / (P * P), kh = (k / P) % P, kw = k % P;
    __global const float *img = (__global const float *)(ib + i_off);
    ((__global float *)(cb + c_off))[r * plen + k] =
        img[((bi * C + ch) * H + py * P + kh) * W + px * P + kw];
}
