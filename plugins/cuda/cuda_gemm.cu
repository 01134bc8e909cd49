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
