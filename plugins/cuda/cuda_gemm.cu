/*
 * plugins/cuda/cuda_gemm.cu — the device half of MATMUL and PATCH_EMBED (the host half,
 * with the cuBLAS calls, is cuda_ops_gemm.c).
 *
 * GEMV (M ≤ CU_GEMV_MAX_M rows, i.e. decode): one warp per output column n. Lanes stride
 * along K reading 16 bytes of W at a time (8 halves or 4 floats, when W and x rows are
 * 16-byte aligned; one element otherwise) and multiply them into every x row, accumulating
 * in f32; a butterfly sum per row ends it. W is read exactly once, in its own dtype, so the
 * kernel runs at memory bandwidth and is as exact as the CPU reference (f32 products of the
 * stored values, f32 sums; only the summation order differs). x rows are re-read by every
 * warp, from L1/L2.
 *
 * I8 GEMV (M ≤ CU_GEMV_I8_MAX_M, the decode of a quantized model): the same warp per column
 * n, now reading 16 codes per 16-byte load, and blockIdx.y picking a group of CU_GEMV_MAX_M
 * rows, so up to 32 rows run in one launch with 8 accumulators per lane. Lane l owns the
 * 16-code chunks l, l + 32, … of the row and sums x · code over each chunk in k order; the
 * codes convert to f32 exactly. When W or K rules the 16-byte loads out, the scalar path
 * walks the very same chunks in the same order (and the K % 16 tail, one code per lane,
 * comes after them), then the fixed butterfly; so a row's sum depends on x, W and K only —
 * not on M, its place in the group, or the alignment of x or W — and every row of an M ≤ 32
 * launch is bit-identical to the row alone (plugin.h batch invariance). The sum is then
 * multiplied by the row's scale and the bias added, both correctly rounded.
 *
 * I8 for larger M goes through cuBLAS (cuda_ops_gemm.c): i8_to_f16 widens a block of codes
 * to f16 — exactly, |code| ≤ 127 — into scratch, the F16 tensor-core route multiplies, and
 * scale_cols applies the scales and the bias to the finished f32 sums.
 *
 * U4 GEMV (M ≤ CU_GEMV_I8_MAX_M): the I8 GEMV's grid with the packed 16-byte block of 32
 * codes as each lane's unit (gemv_u4_kernel); the same batch invariance. U4 for larger M:
 * u4_to_f16 dequantizes a block of rows into f16 scratch, each row divided by a power of two
 * that brings it into [−1, 1] (rowscale), the F16 route multiplies, and scale_cols multiplies
 * the power back and adds the bias.
 *
 * prep: the left operand for cuBLAS. cublasGemmEx wants A and B of one dtype, and the
 * weights must stay in theirs, so the f32 activations (or PATCH_EMBED's im2col rows) are
 * converted to the weight dtype — once (hi), or as a hi + lo pair whose sum carries ~16
 * (bf16) / ~22 (f16) significant bits, which two GEMMs then add up in f32. See
 * cuda_ops_gemm.c for the scales and the resulting accuracy.
 */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

using namespace cu;

namespace {

constexpr int kThreads = 256;
constexpr int kGemvWarps = kThreads / 32;

__device__ __forceinline__ float load_wr(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case MMRT_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t *>(p)[i]);
    case MMRT_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

/* The 4 (F32) or 8 (F16/BF16) weights in one 16-byte word. */
template <int WDT> __device__ __forceinline__ void unpack(const uint4 &raw, float *wf)
{
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (WDT == MMRT_DTYPE_F32) {
            wf[j] = __uint_as_float(u[j]);
        } else if (WDT == MMRT_DTYPE_F16) {
            wf[2 * j] = f16_to_f32((uint16_t)(u[j] & 0xffffu));
            wf[2 * j + 1] = f16_to_f32((uint16_t)(u[j] >> 16));
        } else {
            wf[2 * j] = bf16_to_f32((uint16_t)(u[j] & 0xffffu));
            wf[2 * j + 1] = bf16_to_f32((uint16_t)(u[j] >> 16));
        }
    }
}

template <int WDT, bool VEC>
__global__ void __launch_bounds__(kThreads)
gemv_kernel(float *y, const float *x, const void *w, const void *b, int b_dt, int M, int64_t K,
            int64_t N)
{
    constexpr int VE = WDT == MMRT_DTYPE_F32 ? 4 : 8; /* weights per 16 bytes */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t es = WDT == MMRT_DTYPE_F32 ? 4 : 2;
    /* n is the same on every lane of a warp, so the shuffles below are warp-uniform. */
    for (int64_t n = (int64_t)blockIdx.x * kGemvWarps + warp; n < N;
         n += (int64_t)gridDim.x * kGemvWarps) {
        float acc[CU_GEMV_MAX_M];
#pragma unroll
        for (int m = 0; m < CU_GEMV_MAX_M; m++)
            acc[m] = 0.0f;
        if (VEC) {
            const uint4 *wr =
                reinterpret_cast<const uint4 *>(static_cast<const char *>(w) + (size_t)n * K * es);
            const int64_t n_vec = K / VE;
            for (int64_t v = lane; v < n_vec; v += 32) {
                float wf[VE];
                unpack<WDT>(__ldg(wr + v), wf);
#pragma unroll
                for (int m = 0; m < CU_GEMV_MAX_M; m++) {
                    if (m < M) {
                        const float4 *xr = reinterpret_cast<const float4 *>(x + m * K + v * VE);
#pragma unroll
                        for (int j = 0; j < VE / 4; j++) {
                            float4 xv = __ldg(xr + j);
                            acc[m] = fmaf(xv.x, wf[4 * j], acc[m]);
                            acc[m] = fmaf(xv.y, wf[4 * j + 1], acc[m]);
                            acc[m] = fmaf(xv.z, wf[4 * j + 2], acc[m]);
                            acc[m] = fmaf(xv.w, wf[4 * j + 3], acc[m]);
                        }
                    }
                }
            }
        } else {
            for (int64_t k = lane; k < K; k += 32) {
                float wv = load_w<WDT>(w, n * K + k);
#pragma unroll
                for (int m = 0; m < CU_GEMV_MAX_M; m++)
                    if (m < M)
                        acc[m] = fmaf(x[m * K + k], wv, acc[m]);
            }
        }
        float bias = b ? load_wr(b, b_dt, n) : 0.0f;
#pragma unroll
        for (int m = 0; m < CU_GEMV_MAX_M; m++) {
            if (m < M) { /* uniform: M is a kernel argument */
                float s = warp_sum(acc[m]);
                if (lane == 0)
                    y[m * N + n] = b ? __fadd_rn(s, bias) : s;
            }
        }
    }
}

template <int WDT>
cudaError_t launch_gemv_dt(float *y, const float *x, const void *w, const void *b, int b_dt,
                           int M, int64_t K, int64_t N, bool vec, cudaStream_t stream)
{
    unsigned grid = grid_for(N, kGemvWarps, (int64_t)1 << 30);
    if (vec) {
        auto k = gemv_kernel<WDT, true>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, b, b_dt, M, K, N);
    } else {
        auto k = gemv_kernel<WDT, false>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, b, b_dt, M, K, N);
    }
    return cudaGetLastError();
}

/* The 4 codes in one 32-bit word (little-endian byte order), as f32. */
__device__ __forceinline__ void unpack_i8x4(uint32_t u, float *wf)
{
#pragma unroll
    for (int b = 0; b < 4; b++)
        wf[b] = (float)(int8_t)(uint8_t)(u >> (8 * b));
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads)
gemv_i8_kernel(float *y, const float *x, const int8_t *w, const float *scale, const void *b,
               int b_dt, int M, int64_t K, int64_t N)
{
    constexpr int G = CU_GEMV_MAX_M; /* rows per group, one group per blockIdx.y */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m0 = (int)blockIdx.y * G, rows = M - m0 < G ? M - m0 : G;
    const float *xg = x + (int64_t)m0 * K;
    float *yg = y + (int64_t)m0 * N;
    const int64_t n_chunks = K / 16;
    for (int64_t n = (int64_t)blockIdx.x * kGemvWarps + warp; n < N;
         n += (int64_t)gridDim.x * kGemvWarps) {
        float acc[G];
#pragma unroll
        for (int m = 0; m < G; m++)
            acc[m] = 0.0f;
        const int8_t *wr = w + n * K;
        for (int64_t v = lane; v < n_chunks; v += 32) {
            float wf[16];
            if (VEC) {
                const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(wr) + v);
                unpack_i8x4(raw.x, wf);
                unpack_i8x4(raw.y, wf + 4);
                unpack_i8x4(raw.z, wf + 8);
                unpack_i8x4(raw.w, wf + 12);
            } else {
#pragma unroll
                for (int j = 0; j < 16; j++)
                    wf[j] = (float)wr[v * 16 + j];
            }
#pragma unroll
            for (int m = 0; m < G; m++) {
                if (m < rows) {
                    const float *xr = xg + m * K + v * 16;
                    if (VEC) {
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            float4 xv = __ldg(reinterpret_cast<const float4 *>(xr) + j);
                            acc[m] = fmaf(xv.x, wf[4 * j], acc[m]);
                            acc[m] = fmaf(xv.y, wf[4 * j + 1], acc[m]);
                            acc[m] = fmaf(xv.z, wf[4 * j + 2], acc[m]);
                            acc[m] = fmaf(xv.w, wf[4 * j + 3], acc[m]);
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < 16; j++)
                            acc[m] = fmaf(xr[j], wf[j], acc[m]);
                    }
                }
            }
        }
        const int64_t kt = n_chunks * 16 + lane; /* the K % 16 tail: one code per lane */
        if (kt < K) {
            const float wv = (float)wr[kt];
#pragma unroll
            for (int m = 0; m < G; m++)
                if (m < rows)
                    acc[m] = fmaf(xg[m * K + kt], wv, acc[m]);
        }
        const float sc = scale[n];
        const float bias = b ? load_wr(b, b_dt, n) : 0.0f;
#pragma unroll
        for (int m = 0; m < G; m++) {
            if (m < rows) { /* uniform: rows depends on blockIdx.y only */
                float s = __fmul_rn(warp_sum(acc[m]), sc);
                if (lane == 0)
                    yg[m * N + n] = b ? __fadd_rn(s, bias) : s;
            }
        }
    }
}

/* dst[i] = f16(code i): exact, every code being an integer of magnitude ≤ 128. */
__global__ void __launch_bounds__(kThreads)
i8_to_f16_kernel(uint16_t *dst, const int8_t *src, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f32_to_f16_rn((float)src[i]);
}

/* y[m, n] = y[m, n] · scale[n] (+ b[n]), each step correctly rounded. */
__global__ void __launch_bounds__(kThreads)
scale_cols_kernel(float *y, const float *scale, const void *b, int b_dt, int64_t M, int64_t N)
{
    const int64_t n_all = M * N, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all; i += stride) {
        const int64_t n = i % N;
        float v = __fmul_rn(y[i], scale[n]);
        y[i] = b ? __fadd_rn(v, load_wr(b, b_dt, n)) : v;
    }
}

/* The 8 codes in one 32-bit word of a U4 block, as code − zero in f32 (exact for whole zero
 * points): byte b holds code b in its low nibble and code b + 16 in its high one, so word i
 * (bytes 4i … 4i + 3) gives lo[4i …] and hi[4i …]. */
__device__ __forceinline__ void unpack_u4x8(uint32_t u, float z, float *lo, float *hi)
{
#pragma unroll
    for (int b = 0; b < 4; b++) {
        lo[b] = __fsub_rn((float)((u >> (8 * b)) & 15u), z);
        hi[b] = __fsub_rn((float)((u >> (8 * b + 4)) & 15u), z);
    }
}

/* U4 GEMV: the I8 GEMV's warp per column n and group of CU_GEMV_MAX_M rows per blockIdx.y,
 * with the 16-byte U4 block (32 codes, one scale and zero point) as the lane's unit: lane l
 * takes blocks l, l + 32, … of the packed row, so a warp reads 512 consecutive bytes per step
 * and W is streamed once at its packed size. Per block and x row it sums x · (code − zero)
 * over the 32 codes in k order and adds that sum times the group's scale to the row's
 * accumulator; the scalar path (W or x not 16-byte aligned) loads the same values one by one
 * and computes the very same expression, so a row's result depends on x, W and K only. */
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
gemv_u4_kernel(float *y, const float *x, const uint8_t *w, const float *scale, const float *zero,
               int64_t G, const void *b, int b_dt, int M, int64_t K, int64_t N)
{
    constexpr int R = CU_GEMV_MAX_M; /* rows per group, one group per blockIdx.y */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m0 = (int)blockIdx.y * R, rows = M - m0 < R ? M - m0 : R;
    const float *xg = x + (int64_t)m0 * K;
    float *yg = y + (int64_t)m0 * N;
    const int64_t n_blocks = K / 32, gs = K / G;
    for (int64_t n = (int64_t)blockIdx.x * kGemvWarps + warp; n < N;
         n += (int64_t)gridDim.x * kGemvWarps) {
        float acc[R];
#pragma unroll
        for (int m = 0; m < R; m++)
            acc[m] = 0.0f;
        const uint8_t *wr = w + n * (K / 2);
        for (int64_t v = lane; v < n_blocks; v += 32) {
            const int64_t g = n * G + v * 32 / gs;
            const float z = zero[g], sc = scale[g];
            float lo[16], hi[16];
            if (VEC) {
                const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(wr) + v);
                unpack_u4x8(raw.x, z, lo, hi);
                unpack_u4x8(raw.y, z, lo + 4, hi + 4);
                unpack_u4x8(raw.z, z, lo + 8, hi + 8);
                unpack_u4x8(raw.w, z, lo + 12, hi + 12);
            } else {
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const uint8_t q = wr[v * 16 + j];
                    lo[j] = __fsub_rn((float)(q & 15u), z);
                    hi[j] = __fsub_rn((float)(q >> 4), z);
                }
            }
#pragma unroll
            for (int m = 0; m < R; m++) {
                if (m < rows) {
                    const float *xr = xg + m * K + v * 32;
                    float p = 0.0f;
                    if (VEC) {
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const float4 xv = __ldg(reinterpret_cast<const float4 *>(xr) + j);
                            const float *c = j < 4 ? lo + 4 * j : hi + 4 * (j - 4);
                            p = fmaf(xv.x, c[0], p);
                            p = fmaf(xv.y, c[1], p);
                            p = fmaf(xv.z, c[2], p);
                            p = fmaf(xv.w, c[3], p);
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < 16; j++)
                            p = fmaf(xr[j], lo[j], p);
#pragma unroll
                        for (int j = 0; j < 16; j++)
                            p = fmaf(xr[16 + j], hi[j], p);
                    }
                    acc[m] = fmaf(p, sc, acc[m]);
                }
            }
        }
        const float bias = b ? load_wr(b, b_dt, n) : 0.0f;
#pragma unroll
        for (int m = 0; m < R; m++) {
            if (m < rows) { /* uniform: rows depends on blockIdx.y only */
                float s = warp_sum(acc[m]);
                if (lane == 0)
                    yg[m * N + n] = b ? __fadd_rn(s, bias) : s;
            }
        }
    }
}

/* One block per U4 row: the row's factor p = 2^e ≥ max |(code − zero) · scale| (from the
 * groups' scales and zero points: a power of two, so dividing by it is exact), then every
 * weight as f16((code − zero) · scale / p). The f16 values span at most [−1, 1], so no row
 * overflows f16 or sinks into its subnormals as a whole, whatever its magnitude; each weight
 * is rounded once to 11 bits. rowscale[r] = p, which the epilogue multiplies back. */
__global__ void __launch_bounds__(kThreads)
u4_to_f16_kernel(uint16_t *dst, float *rowscale, const uint8_t *w, const float *scale,
                 const float *zero, int64_t G, int64_t K, int64_t rows)
{
    const int64_t gs = K / G;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *sr = scale + r * G, *zr = zero + r * G;
        float bound = 0.0f;
        for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
            const float z = zr[g];
            bound = max_(bound, fabsf(sr[g]) * max_(fabsf(z), fabsf(15.0f - z)));
        }
        bound = block_max(bound);
        float p = 1.0f;
        if (bound > 0.0f && bound <= 0x1p126f) { /* p and 1 / p stay normal */
            int e;
            frexpf(bound, &e); /* bound = f · 2^e, f in [0.5, 1) */
            p = ldexpf(1.0f, e);
        }
        const float inv = 1.0f / p; /* exact: p is a power of two within f32's range */
        if (threadIdx.x == 0)
            rowscale[r] = p;
        const uint8_t *wr = w + r * (K / 2);
        for (int64_t i = threadIdx.x; i < K / 2; i += blockDim.x) {
            const uint8_t q = wr[i];
            const int64_t k = (i / 16) * 32 + i % 16, g = k / gs;
            const float z = zr[g], sc = sr[g];
            const float lo = __fmul_rn(__fsub_rn((float)(q & 15u), z), sc);
            const float hi = __fmul_rn(__fsub_rn((float)(q >> 4), z), sc);
            dst[r * K + k] = f32_to_f16_rn(__fmul_rn(lo, inv));
            dst[r * K + k + 16] = f32_to_f16_rn(__fmul_rn(hi, inv));
        }
    }
}

/* One block per row of A; threads along K. */
template <int OUT, bool SPLIT, bool PATCH>
__global__ void __launch_bounds__(kThreads) prep_kernel(cu_prep_desc d)
{
    const int64_t K = d.K;
    const float inv_hi = 1.0f / d.hi_scale; /* scales are powers of two: exact */
    for (int64_t r = blockIdx.x; r < d.rows; r += gridDim.x) {
        const int64_t gr = d.r0 + r;
        const float *src;
        int64_t py = 0, px = 0;
        if (PATCH) {
            int64_t bi = gr / d.n_patches, p = gr % d.n_patches;
            py = p / d.n_px;
            px = p % d.n_px;
            src = d.img + bi * d.C * d.H * d.W;
        } else {
            src = d.x + gr * K;
        }
        for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
            float a;
            if (PATCH) {
                /* k runs over (channel, kernel row, kernel column) like the flattened
                 * conv weight [O, C, P, P]. */
                int64_t pp = d.P * d.P, ch = k / pp, rem = k % pp;
                int64_t kh = rem / d.P, kw = rem % d.P;
                a = src[(ch * d.H + py * d.P + kh) * d.W + px * d.P + kw];
            } else {
                a = src[k];
            }
            const int64_t o = r * K + k;
            if (OUT == MMRT_DTYPE_F32) {
                static_cast<float *>(d.hi)[o] = a;
            } else {
                uint16_t h = OUT == MMRT_DTYPE_F16 ? f32_to_f16_rn(__fmul_rn(a, d.hi_scale))
                                                   : f32_to_bf16_rn(__fmul_rn(a, d.hi_scale));
                static_cast<uint16_t *>(d.hi)[o] = h;
                if (SPLIT) {
                    float back = OUT == MMRT_DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
                    /* a − back is exact in f32: back is a rounded to fewer bits. */
                    float rest = __fmul_rn(__fsub_rn(a, __fmul_rn(back, inv_hi)), d.lo_scale);
                    static_cast<uint16_t *>(d.lo)[o] =
                        OUT == MMRT_DTYPE_F16 ? f32_to_f16_rn(rest) : f32_to_bf16_rn(rest);
                }
            }
        }
    }
}

template <int OUT, bool SPLIT>
cudaError_t launch_prep_t(const cu_prep_desc *d, cudaStream_t stream)
{
    cu_prep_desc v = *d;
    unsigned grid = grid_for(d->rows, 1, 65536);
    if (d->x) {
        auto k = prep_kernel<OUT, SPLIT, false>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, v);
    } else {
        auto k = prep_kernel<OUT, SPLIT, true>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, v);
    }
    return cudaGetLastError();
}

__global__ void __launch_bounds__(kThreads)
fill_rows_kernel(float *y, const void *b, int b_dt, int64_t M, int64_t N)
{
    const int64_t n_all = M * N, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all; i += stride)
        y[i] = b ? load_wr(b, b_dt, i % N) : 0.0f;
}

} // namespace

extern "C" cudaError_t cu_launch_gemv(float *y, const float *x, const void *w, int w_dtype,
                                      const void *b, int b_dtype, int64_t M, int64_t K,
                                      int64_t N, cudaStream_t stream)
{
    if (M <= 0 || N <= 0)
        return cudaSuccess;
    /* 16-byte words need every W row and x row to start on a 16-byte boundary. */
    size_t es = mmrt_dtype_size((enum mmrt_dtype)w_dtype);
    bool vec = (uintptr_t)w % 16 == 0 && (K * (int64_t)es) % 16 == 0 && (uintptr_t)x % 16 == 0 &&
               K % 4 == 0;
    int m = (int)M;
    switch (w_dtype) {
    case MMRT_DTYPE_F16:
        return launch_gemv_dt<MMRT_DTYPE_F16>(y, x, w, b, b_dtype, m, K, N, vec, stream);
    case MMRT_DTYPE_BF16:
        return launch_gemv_dt<MMRT_DTYPE_BF16>(y, x, w, b, b_dtype, m, K, N, vec, stream);
    default:
        return launch_gemv_dt<MMRT_DTYPE_F32>(y, x, w, b, b_dtype, m, K, N, vec, stream);
    }
}

extern "C" cudaError_t cu_launch_gemv_i8(float *y, const float *x, const int8_t *w,
                                         const float *scale, const void *b, int b_dtype,
                                         int64_t M, int64_t K, int64_t N, cudaStream_t stream)
{
    if (M <= 0 || N <= 0)
        return cudaSuccess;
    /* 16-byte words of codes and of x: every W row and x row on a 16-byte boundary. The
     * scalar path sums in the same order, so the choice never changes a result. */
    bool vec = (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0 && K % 16 == 0;
    dim3 grid(grid_for(N, kGemvWarps, (int64_t)1 << 30),
              (unsigned)((M + CU_GEMV_MAX_M - 1) / CU_GEMV_MAX_M));
    int m = (int)M;
    if (vec) {
        auto k = gemv_i8_kernel<true>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, scale, b, b_dtype, m, K, N);
    } else {
        auto k = gemv_i8_kernel<false>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, scale, b, b_dtype, m, K, N);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_i8_to_f16(uint16_t *dst, const int8_t *src, int64_t n,
                                           cudaStream_t stream)
{
    if (n <= 0)
        return cudaSuccess;
    auto k = i8_to_f16_kernel;
    CU_LAUNCH(k, grid_for(n, kThreads), kThreads, 0, stream, dst, src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_gemv_u4(float *y, const float *x, const uint8_t *w,
                                         const float *scale, const float *zero, int64_t G,
                                         const void *b, int b_dtype, int64_t M, int64_t K,
                                         int64_t N, cudaStream_t stream)
{
    if (M <= 0 || N <= 0)
        return cudaSuccess;
    /* Every packed row is a multiple of 16 bytes and every x row of 128 (K % 32 == 0), so
     * the bases decide; the scalar path sums in the same order. */
    bool vec = (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
    dim3 grid(grid_for(N, kGemvWarps, (int64_t)1 << 30),
              (unsigned)((M + CU_GEMV_MAX_M - 1) / CU_GEMV_MAX_M));
    int m = (int)M;
    if (vec) {
        auto k = gemv_u4_kernel<true>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, scale, zero, G, b, b_dtype, m, K, N);
    } else {
        auto k = gemv_u4_kernel<false>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, scale, zero, G, b, b_dtype, m, K, N);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_u4_to_f16(uint16_t *dst, float *rowscale, const uint8_t *w,
                                           const float *scale, const float *zero, int64_t G,
                                           int64_t K, int64_t rows, cudaStream_t stream)
{
    if (rows <= 0 || K <= 0)
        return cudaSuccess;
    auto k = u4_to_f16_kernel;
    CU_LAUNCH(k, grid_for(rows, 1, 65536), kThreads, 0, stream, dst, rowscale, w, scale, zero, G,
              K, rows);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_scale_cols(float *y, const float *scale, const void *b,
                                            int b_dtype, int64_t M, int64_t N,
                                            cudaStream_t stream)
{
    if (M <= 0 || N <= 0)
        return cudaSuccess;
    auto k = scale_cols_kernel;
    CU_LAUNCH(k, grid_for(M * N, kThreads), kThreads, 0, stream, y, scale, b, b_dtype, M, N);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_prep(const struct cu_prep_desc *d, cudaStream_t stream)
{
    if (d->rows <= 0 || d->K <= 0)
        return cudaSuccess;
    switch (d->out_dtype) {
    case MMRT_DTYPE_F16:
        return d->split ? launch_prep_t<MMRT_DTYPE_F16, true>(d, stream)
                        : launch_prep_t<MMRT_DTYPE_F16, false>(d, stream);
    case MMRT_DTYPE_BF16:
        return d->split ? launch_prep_t<MMRT_DTYPE_BF16, true>(d, stream)
                        : launch_prep_t<MMRT_DTYPE_BF16, false>(d, stream);
    default:
        return launch_prep_t<MMRT_DTYPE_F32, false>(d, stream);
    }
}

extern "C" cudaError_t cu_launch_fill_rows(float *y, const void *b, int b_dtype, int64_t M,
                                           int64_t N, cudaStream_t stream)
{
    if (M <= 0 || N <= 0)
        return cudaSuccess;
    auto k = fill_rows_kernel;
    CU_LAUNCH(k, grid_for(M * N, kThreads), kThreads, 0, stream, y, b, b_dtype, M, N);
    return cudaGetLastError();
}
