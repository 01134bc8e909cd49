/*
 * plugins/cuda/cuda_kernels.cu — the memory-bound kernels of the CUDA plugin: the overlapping
 * byte move, elementwise ops, row ops (norms, softmax, argmax, l2_norm, get_rows,
 * gather_heads), strided COPY, ROPE / ROPE_MULTI and SET_ROWS. GEMM support lives in
 * cuda_gemm.cu, attention in cuda_attention.cu.
 *
 * Numerics follow the CPU reference plugin operation for operation wherever that is cheap, so
 * that the two plugins differ only by summation order: statistics (norm moments, softmax
 * sums) accumulate in double like the CPU's, each normalised value is formed in f32 in the
 * same order with explicit _rn intrinsics (no FMA contraction), and conversions are the
 * bit-exact ones of cuda_common.cuh. Transcendentals use CUDA's accurate (non-fast-math)
 * functions, within 2 ulp of glibc's.
 *
 * Launch shapes: elementwise and copies are grid-stride loops of 256 threads; row ops run
 * one block of 256 threads per row (rows are hidden sizes or vocabularies, thousands wide),
 * except GATHER_HEADS, L2_NORM and SET_ROWS into I8, whose rows are head dims (~128): one
 * warp per row there.
 *
 * cu_move_bytes: one block walks the range in tiles, in the direction that only overwrites
 * bytes already read (forward when dst < src, backward otherwise). A barrier between loading
 * a tile into registers and storing it orders every read of the tile before any write that
 * could clobber it; a multi-block grid would need a grid-wide barrier for that, so this runs
 * on one SM. It only serves overlapping copies, which are rare; disjoint copies take
 * cudaMemcpyAsync at full bandwidth.
 */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

using namespace cu;

namespace {

constexpr int kThreads = 256;

/* ---- move ------------------------------------------------------------------------------ */

constexpr int kMoveThreads = 512;
constexpr int kMovePerThread = 16; /* bytes each thread holds per tile */
constexpr size_t kMoveTile = (size_t)kMoveThreads * kMovePerThread;

__global__ void __launch_bounds__(kMoveThreads)
move_bytes_kernel(unsigned char *dst, const unsigned char *src, size_t nbytes, bool backward)
{
    const size_t n_tiles = (nbytes + kMoveTile - 1) / kMoveTile;
    for (size_t k = 0; k < n_tiles; k++) {
        const size_t base = (backward ? n_tiles - 1 - k : k) * kMoveTile;
        unsigned char v[kMovePerThread];
        /* Consecutive threads touch consecutive bytes, so each access coalesces. */
#pragma unroll
        for (int j = 0; j < kMovePerThread; j++) {
            size_t i = base + (size_t)j * kMoveThreads + threadIdx.x;
            if (i < nbytes)
                v[j] = src[i];
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kMovePerThread; j++) {
            size_t i = base + (size_t)j * kMoveThreads + threadIdx.x;
            if (i < nbytes)
                dst[i] = v[j];
        }
        /* Keeps tiles from overlapping in time, so correctness never depends on how far
         * apart dst and src are. */
        __syncthreads();
    }
}

/* ---- elementwise ----------------------------------------------------------------------- */

/* d may be a (in place): each element is read before the same thread writes it. */
template <int BDT, bool BCAST, bool MUL>
__global__ void __launch_bounds__(kThreads)
binary_kernel(float *d, const float *a, const void *b, int64_t n, int64_t period)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float bv = load_w<BDT>(b, BCAST ? i % period : i);
        d[i] = MUL ? __fmul_rn(a[i], bv) : __fadd_rn(a[i], bv);
    }
}

template <int BDT>
cudaError_t launch_binary_dt(float *d, const float *a, const void *b, int64_t n, int64_t period,
                             int mul, cudaStream_t stream)
{
    unsigned grid = grid_for(n, kThreads);
    bool bcast = period != n;
    if (mul) {
        if (bcast) {
            auto k = binary_kernel<BDT, true, true>;
            CU_LAUNCH(k, grid, kThreads, 0, stream, d, a, b, n, period);
        } else {
            auto k = binary_kernel<BDT, false, true>;
            CU_LAUNCH(k, grid, kThreads, 0, stream, d, a, b, n, period);
        }
    } else {
        if (bcast) {
            auto k = binary_kernel<BDT, true, false>;
            CU_LAUNCH(k, grid, kThreads, 0, stream, d, a, b, n, period);
        } else {
            auto k = binary_kernel<BDT, false, false>;
            CU_LAUNCH(k, grid, kThreads, 0, stream, d, a, b, n, period);
        }
    }
    return cudaGetLastError();
}

/* x / (1 + e^(−a·x)): for very negative x the exponential overflows to inf and the result
 * is −0, the limit, rather than NaN (the CPU plugin's formulation). */
__device__ __forceinline__ float x_sigmoid(float x, float a)
{
    return x / __fadd_rn(1.0f, expf(__fmul_rn(-a, x)));
}

template <int OP> __device__ __forceinline__ float activate(float x, float u, float scale)
{
    if (OP == MMRT_OP_SCALE)
        return __fmul_rn(x, scale);
    if (OP == MMRT_OP_GELU)
        return __fmul_rn(__fmul_rn(0.5f, x),
                         __fadd_rn(1.0f, erff(__fmul_rn(x, 0.70710678118654752f))));
    if (OP == MMRT_OP_GELU_TANH) {
        const float k = 0.7978845608028654f; /* sqrt(2/pi) */
        float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
        return __fmul_rn(__fmul_rn(0.5f, x),
                         __fadd_rn(1.0f, tanhf(__fmul_rn(k, __fadd_rn(x, cube)))));
    }
    if (OP == MMRT_OP_QUICK_GELU)
        return x_sigmoid(x, 1.702f);
    if (OP == MMRT_OP_SILU)
        return x_sigmoid(x, 1.0f);
    if (OP == MMRT_OP_SWIGLU)
        return __fmul_rn(x_sigmoid(x, 1.0f), u);
    /* RELU2; NaN stays NaN. */
    float r = x > 0.0f ? x : 0.0f;
    return x != x ? x : __fmul_rn(r, r);
}

template <int OP>
__global__ void __launch_bounds__(kThreads)
unary_kernel(float *d, const float *a, const float *b, int64_t n, float scale)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        d[i] = activate<OP>(a[i], OP == MMRT_OP_SWIGLU ? b[i] : 0.0f, scale);
}

template <int OP>
cudaError_t launch_unary_op(float *d, const float *a, const float *b, int64_t n, float scale,
                            cudaStream_t stream)
{
    auto k = unary_kernel<OP>;
    CU_LAUNCH(k, grid_for(n, kThreads), kThreads, 0, stream, d, a, b, n, scale);
    return cudaGetLastError();
}

/* ---- row ops --------------------------------------------------------------------------- */

__device__ __forceinline__ float load_wr(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case MMRT_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t *>(p)[i]);
    case MMRT_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

/* One block per row. Moments in double, the normalised value in f32 exactly as the CPU
 * plugin forms it: RMSNorm (x · rstd) · w; LayerNorm ((x − mean) · rstd in double) · w + b.
 * In place is safe: a row's statistics are complete (barrier) before any element of it is
 * written, and each element is written by the thread that last read it. */
template <bool RMS>
__global__ void __launch_bounds__(kThreads)
norm_kernel(float *y, const float *x, const void *w, int w_dt, const void *b, int b_dt,
            int64_t rows, int64_t n, double eps)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        if (RMS) {
            double ss = 0.0;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                ss += (double)xr[i] * (double)xr[i];
            ss = block_sum(ss);
            float rstd = (float)(1.0 / sqrt(ss / (double)n + eps));
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                float v = __fmul_rn(xr[i], rstd);
                yr[i] = w ? __fmul_rn(v, load_wr(w, w_dt, i)) : v;
            }
        } else {
            double s = 0.0;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                s += (double)xr[i];
            double mean = block_sum(s) / (double)n;
            double ss = 0.0;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                double dv = (double)xr[i] - mean; /* two passes: no cancellation */
                ss += dv * dv;
            }
            ss = block_sum(ss);
            double rstd = 1.0 / sqrt(ss / (double)n + eps);
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                float v = (float)(((double)xr[i] - mean) * rstd);
                if (w)
                    v = __fmul_rn(v, load_wr(w, w_dt, i));
                if (b)
                    v = __fadd_rn(v, load_wr(b, b_dt, i));
                yr[i] = v;
            }
        }
    }
}

/* softmax(x · scale) per row: max, then Σ e in double, then e · (1/Σ) in f32. A row whose
 * every entry is −inf gives zeros. In place: the last pass reads x[i] and writes y[i] in the
 * same thread, after the barrier that ends the sum. */
__global__ void __launch_bounds__(kThreads)
softmax_kernel(float *y, const float *x, int64_t rows, int64_t n, float scale)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float m = -CU_INF;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = __fmul_rn(xr[i], scale);
            m = v > m ? v : m;
        }
        m = block_max(m);
        if (m == -CU_INF) { /* uniform across the block: m is the same on every thread */
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                yr[i] = 0.0f;
            continue;
        }
        double s = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            s += (double)expf(__fsub_rn(__fmul_rn(xr[i], scale), m));
        s = block_sum(s);
        float inv = (float)(1.0 / s);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            yr[i] = __fmul_rn(expf(__fsub_rn(__fmul_rn(xr[i], scale), m)), inv);
    }
}

/* (value, index) order for argmax: larger value first, then smaller index; idx < 0 (nothing
 * seen, or only NaN) loses to everything. A total order, so the butterfly gives the same
 * winner on every lane. */
__device__ __forceinline__ bool arg_better(float v, int i, float bv, int bi)
{
    return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

__global__ void __launch_bounds__(kThreads)
argmax_kernel(int32_t *y, const float *x, int64_t rows, int64_t n)
{
    __shared__ float part_v[32];
    __shared__ int part_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        float bv = 0.0f;
        int bi = -1;
        for (int i = threadIdx.x; i < (int)n; i += blockDim.x) {
            float v = xr[i];
            if (v == v && (bi < 0 || v > bv)) { /* strict: the first maximum of this thread */
                bv = v;
                bi = i;
            }
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, m);
            int oi = __shfl_xor_sync(0xffffffffu, bi, m);
            if (arg_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            part_v[warp] = bv;
            part_i[warp] = bi;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < n_warps ? part_v[lane] : 0.0f;
            bi = lane < n_warps ? part_i[lane] : -1;
#pragma unroll
            for (int m = 16; m >= 1; m >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, m);
                int oi = __shfl_xor_sync(0xffffffffu, bi, m);
                if (arg_better(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
            if (lane == 0)
                y[r] = bi < 0 ? 0 : bi; /* an all-NaN row answers 0, like the CPU */
        }
        __syncthreads(); /* part_* are reused by the next row */
    }
}

__device__ __forceinline__ void report(cu_err_word *e, uint32_t code, int op, int64_t a,
                                       int64_t b, int64_t c)
{
    if (atomicCAS(&e->code, 0u, code) == 0u) {
        e->op = op;
        e->v[0] = a;
        e->v[1] = b;
        e->v[2] = c;
    }
}

/* One block per output row; an id outside [0, V) leaves the row untouched and is reported
 * through the error word (the core sees MMRT_ERR_INVALID_ARG at the next synchronisation). */
template <int DT>
__global__ void __launch_bounds__(kThreads)
get_rows_kernel(float *y, const void *table, int64_t V, int64_t n, const int32_t *ids,
                int64_t T, cu_err_word *err)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        int32_t id = ids[t];
        if (id < 0 || id >= V) {
            if (threadIdx.x == 0)
                report(err, CU_ERRC_ROW_ID, MMRT_OP_GET_ROWS, id, t, V);
            continue;
        }
        float *yr = y + t * n;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            int64_t j = (int64_t)id * n + i;
            if (DT == MMRT_DTYPE_F16)
                yr[i] = f16_to_f32_exact(static_cast<const uint16_t *>(table)[j]);
            else if (DT == MMRT_DTYPE_BF16)
                yr[i] = bf16_to_f32(static_cast<const uint16_t *>(table)[j]);
            else
                yr[i] = static_cast<const float *>(table)[j];
        }
    }
}

/* ---- COPY ------------------------------------------------------------------------------ */

enum { CONV_RAW = 0, CONV_F32_F16, CONV_F32_BF16, CONV_F16_F32, CONV_BF16_F32, CONV_F16_BF16,
       CONV_BF16_F16 };

template <int CONV, typename S, typename D> __device__ __forceinline__ D convert(S s)
{
    if (CONV == CONV_F32_F16) return (D)f32_to_f16_exact(__uint_as_float((uint32_t)s));
    if (CONV == CONV_F32_BF16) return (D)f32_to_bf16_exact(__uint_as_float((uint32_t)s));
    if (CONV == CONV_F16_F32) return (D)__float_as_uint(f16_to_f32_exact((uint16_t)s));
    if (CONV == CONV_BF16_F32) return (D)__float_as_uint(bf16_to_f32((uint16_t)s));
    if (CONV == CONV_F16_BF16) return (D)f32_to_bf16_exact(f16_to_f32_exact((uint16_t)s));
    if (CONV == CONV_BF16_F16) return (D)f32_to_f16_exact(bf16_to_f32((uint16_t)s));
    return (D)s;
}

/* Rows of the three outer dims over blockIdx.x, the innermost dim over threads and
 * blockIdx.y (so a long 1-D copy still spreads over many blocks). Element types are raw bit
 * containers: float data travels as uint32_t so that F32 → F32 keeps NaN payloads. */
template <int CONV, typename S, typename D>
__global__ void __launch_bounds__(kThreads) copy_kernel(cu_copy_desc d)
{
    const int64_t rows = d.ne[0] * d.ne[1] * d.ne[2];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t i2 = r % d.ne[2], t = r / d.ne[2];
        int64_t i1 = t % d.ne[1], i0 = t / d.ne[1];
        const S *s = static_cast<const S *>(d.src) + i0 * d.snb[0] + i1 * d.snb[1] +
                     i2 * d.snb[2];
        D *o = static_cast<D *>(d.dst) + i0 * d.dnb[0] + i1 * d.dnb[1] + i2 * d.dnb[2];
        for (int64_t i3 = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; i3 < d.ne[3];
             i3 += (int64_t)gridDim.y * blockDim.x)
            o[i3 * d.dnb[3]] = convert<CONV, S, D>(s[i3 * d.snb[3]]);
    }
}

template <int CONV, typename S, typename D>
cudaError_t launch_copy_t(const cu_copy_desc *d, cudaStream_t stream)
{
    int64_t rows = d->ne[0] * d->ne[1] * d->ne[2];
    dim3 grid(grid_for(rows, 1, 65536), grid_for(d->ne[3], (int64_t)kThreads * 4, 1024));
    auto k = copy_kernel<CONV, S, D>;
    cu_copy_desc v = *d;
    CU_LAUNCH(k, grid, kThreads, 0, stream, v);
    return cudaGetLastError();
}

/* ---- ROPE, ROPE_MULTI ------------------------------------------------------------------ */

/* One block per token: its cos/sin table (shared by all heads) in shared memory, then one
 * thread per (head, pair). cos and sin are taken in double of the f32 angle and rounded
 * once, i.e. correctly rounded almost always, like glibc's cosf/sinf that the CPU uses.
 * In place is safe: a pair is read and written by the same thread. Pair i reads the position
 * of its section's axis (one axis for ROPE); the host mapped restart into inv_freq. */
__global__ void __launch_bounds__(kThreads) rope_kernel(cu_rope_desc d)
{
    __shared__ float cs[CU_ROPE_MAX_HALF], sn[CU_ROPE_MAX_HALF];
    const int half = d.n_rot / 2;
    const int n_axes = d.n_axes > 0 ? d.n_axes : 1;
    const int64_t rest = d.D - d.n_rot;
    for (int64_t t = blockIdx.x; t < d.T; t += gridDim.x) {
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            int a = 0;
            while (a + 1 < n_axes && i >= d.sec_end[a])
                a++;
            float p = (float)d.pos[t * n_axes + a];
            double angle = (double)__fmul_rn(p, d.inv_freq[i]);
            cs[i] = (float)cos(angle);
            sn[i] = (float)sin(angle);
        }
        __syncthreads();
        for (int64_t k = threadIdx.x; k < d.H * half; k += blockDim.x) {
            int64_t h = k / half;
            int i = (int)(k % half);
            const float *x = d.x + t * d.xs0 + h * d.xs1;
            float *y = d.y + t * d.ys0 + h * d.ys1;
            int i0 = d.mode == MMRT_ROPE_NEOX ? i : 2 * i;
            int i1 = d.mode == MMRT_ROPE_NEOX ? i + half : 2 * i + 1;
            float a = x[i0], b = x[i1];
            y[i0] = __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, sn[i]));
            y[i1] = __fadd_rn(__fmul_rn(b, cs[i]), __fmul_rn(a, sn[i]));
        }
        if (rest > 0 && d.y != d.x)
            for (int64_t k = threadIdx.x; k < d.H * rest; k += blockDim.x) {
                int64_t h = k / rest, j = d.n_rot + k % rest;
                d.y[t * d.ys0 + h * d.ys1 + j] = d.x[t * d.xs0 + h * d.xs1 + j];
            }
        __syncthreads(); /* cs/sn are rewritten for the next token */
    }
}

/* ---- SET_ROWS -------------------------------------------------------------------------- */

constexpr int kWarpRows = kThreads / 32; /* rows per block where a warp serves a row */

/* Rows t over blockIdx.x, each row's n elements over threads and blockIdx.y. Before writing
 * row t the block looks for the same index later in idx (a block-wide OR, all threads take
 * part whatever their t, k): if there is one, that later row owns the destination and t is
 * skipped, so duplicates never mix elements of two rows. For the one-token decode step the
 * scan is empty. Element types are raw bits: F32 → F32 keeps NaN payloads. */
/* Whether token t of a block's SET_ROWS writes: its index is in [0, R) and no later token
 * names the same row. Every thread of the block must call it (a block-wide sum). */
__device__ __forceinline__ bool set_rows_owns(const int32_t *idx, int64_t t, int64_t T,
                                              int64_t R)
{
    const int32_t r = idx[t];
    int later = 0;
    for (int64_t u = t + 1 + threadIdx.x; u < T && !later; u += blockDim.x)
        later = idx[u] == r;
    return block_sum<int>(later) == 0 && r >= 0 && r < R;
}

template <int DT>
__global__ void __launch_bounds__(kThreads)
set_rows_kernel(void *dst, int64_t R, const uint32_t *src, const int32_t *idx, int64_t T,
                int64_t n)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int32_t r = idx[t];
        if (!set_rows_owns(idx, t, T, R))
            continue;
        const uint32_t *s = src + t * n;
        for (int64_t k = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; k < n;
             k += (int64_t)gridDim.y * blockDim.x) {
            const int64_t o = (int64_t)r * n + k;
            if (DT == MMRT_DTYPE_F8E4M3)
                static_cast<uint8_t *>(dst)[o] = f32_to_f8e4m3(__uint_as_float(s[k]));
            else if (DT == MMRT_DTYPE_F16)
                static_cast<uint16_t *>(dst)[o] = f32_to_f16_exact(__uint_as_float(s[k]));
            else if (DT == MMRT_DTYPE_BF16)
                static_cast<uint16_t *>(dst)[o] = f32_to_bf16_exact(__uint_as_float(s[k]));
            else
                static_cast<uint32_t *>(dst)[o] = s[k];
        }
    }
}

/* I8 rows with scales (plugin.h, ABI 1.7): blocks over tokens as set_rows_kernel (the same
 * duplicate scan), and inside a block one warp per innermost row of D, grid.y and the warps
 * walking the per rows of token t. A row's amax is a warp_max after each lane has folded
 * every 32nd element, so rows of any length (head dims, or thousands) take one pass. A
 * maximum is exact in any order and NaN never wins (a > m is false, from m = 0), so s is the
 * reference's bit for bit; each code is its own division (f32_to_i8_code). */
__global__ void __launch_bounds__(kThreads)
set_rows_i8_kernel(int8_t *dst, float *scales, int64_t R, const float *src, const int32_t *idx,
                   int64_t T, int64_t per, int64_t D)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int32_t r = idx[t];
        if (!set_rows_owns(idx, t, T, R))
            continue;
        for (int64_t i = (int64_t)blockIdx.y * kWarpRows + warp; i < per;
             i += (int64_t)gridDim.y * kWarpRows) {
            const float *x = src + (t * per + i) * D;
            float amax = 0.0f;
            for (int64_t k = lane; k < D; k += 32) {
                const float a = fabsf(x[k]);
                amax = a > amax ? a : amax;
            }
            const float s = __fdiv_rn(warp_max(amax), 127.0f);
            const int64_t row = (int64_t)r * per + i;
            int8_t *y = dst + row * D;
            for (int64_t k = lane; k < D; k += 32)
                y[k] = f32_to_i8_code(x[k], s);
            if (lane == 0)
                scales[row] = s;
        }
    }
}

template <int DT>
cudaError_t launch_set_rows_t(void *dst, int64_t R, const float *src, const int32_t *idx,
                              int64_t T, int64_t n, cudaStream_t stream)
{
    dim3 grid(grid_for(T, 1, 65536), grid_for(n, (int64_t)kThreads * 4, 64));
    auto k = set_rows_kernel<DT>;
    const uint32_t *s = reinterpret_cast<const uint32_t *>(src);
    CU_LAUNCH(k, grid, kThreads, 0, stream, dst, R, s, idx, T, n);
    return cudaGetLastError();
}

/* ---- GATHER_HEADS, L2_NORM --------------------------------------------------------------- */

/* Lane l of a row's warp forms elements l, l + 32, … of it, each in exactly the f32
 * operations plugin.h fixes: no warp-level arithmetic, so no order to get wrong. The
 * explicit _rn intrinsics keep nvcc from contracting or reassociating anything; the
 * division is IEEE (__fdiv_rn), never a reciprocal. */
template <int DT>
__global__ void __launch_bounds__(kThreads)
gather_heads_kernel(float *y, const void *table, const float *scales, int64_t R, int64_t H,
                    int64_t D, const int32_t *idx, int64_t rows, int64_t G)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t it = (int64_t)blockIdx.x * kWarpRows + warp; it < rows;
         it += (int64_t)gridDim.x * kWarpRows) {
        const int64_t h = it % H;
        const int32_t *ix = idx + it * G;
        float *yr = y + it * D;
        for (int64_t d = lane; d < D; d += 32) {
            float s = 0.0f;
            int c = 0;
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = ix[g];
                if (r < 0 || r >= R)
                    continue; /* padding, or an entry past the table: skipped alike */
                const int64_t j = (r * H + h) * D + d;
                float v;
                if (DT == MMRT_DTYPE_I8)
                    v = i8_to_f32(static_cast<const int8_t *>(table)[j], scales[r * H + h]);
                else if (DT == MMRT_DTYPE_F8E4M3)
                    v = f8e4m3_to_f32(static_cast<const uint8_t *>(table)[j]);
                else if (DT == MMRT_DTYPE_F16)
                    v = f16_to_f32_exact(static_cast<const uint16_t *>(table)[j]);
                else if (DT == MMRT_DTYPE_BF16)
                    v = bf16_to_f32(static_cast<const uint16_t *>(table)[j]);
                else
                    v = static_cast<const float *>(table)[j];
                s = c == 0 ? v : __fadd_rn(s, v);
                c++;
            }
            yr[d] = c == 0 ? 0.0f : c == 1 ? s : __fdiv_rn(s, (float)c);
        }
    }
}

template <int DT>
cudaError_t launch_gather_heads_t(float *y, const void *table, const float *scales, int64_t R,
                                  int64_t H, int64_t D, const int32_t *idx, int64_t rows,
                                  int64_t G, cudaStream_t stream)
{
    auto k = gather_heads_kernel<DT>;
    CU_LAUNCH(k, grid_for(rows, kWarpRows, 65536), kThreads, 0, stream, y, table, scales, R, H,
              D, idx, rows, G);
    return cudaGetLastError();
}

/* Every lane of a warp works on the same row, so all 32 reach the butterfly together. */
__global__ void __launch_bounds__(kThreads)
l2_norm_kernel(float *y, const float *x, int64_t rows, int64_t n)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * kWarpRows + warp; r < rows;
         r += (int64_t)gridDim.x * kWarpRows) {
        const float *xr = x + r * n;
        double s = 0.0;
        for (int64_t i = lane; i < n; i += 32) {
            const double v = xr[i];
            s += v * v; /* exact square: a contracted fma gives the same sum */
        }
        s = warp_sum(s);
        if (lane == 0)
            y[r] = (float)sqrt(s);
    }
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------- */

extern "C" cudaError_t cu_move_bytes(void *dst, const void *src, size_t nbytes,
                                     cudaStream_t stream)
{
    if (nbytes == 0 || dst == src)
        return cudaSuccess;
    auto k = move_bytes_kernel;
    unsigned char *d = static_cast<unsigned char *>(dst);
    const unsigned char *s = static_cast<const unsigned char *>(src);
    bool backward = dst > src;
    CU_LAUNCH(k, 1, kMoveThreads, 0, stream, d, s, nbytes, backward);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_binary(float *d, const float *a, const void *b, int b_dtype,
                                        int64_t n, int64_t b_period, int mul,
                                        cudaStream_t stream)
{
    if (n <= 0)
        return cudaSuccess;
    switch (b_dtype) {
    case MMRT_DTYPE_F16: return launch_binary_dt<MMRT_DTYPE_F16>(d, a, b, n, b_period, mul, stream);
    case MMRT_DTYPE_BF16: return launch_binary_dt<MMRT_DTYPE_BF16>(d, a, b, n, b_period, mul, stream);
    default: return launch_binary_dt<MMRT_DTYPE_F32>(d, a, b, n, b_period, mul, stream);
    }
}

extern "C" cudaError_t cu_launch_unary(int op, float *d, const float *a, const float *b,
                                       int64_t n, float scale, cudaStream_t stream)
{
    if (n <= 0)
        return cudaSuccess;
    switch (op) {
    case MMRT_OP_SCALE: return launch_unary_op<MMRT_OP_SCALE>(d, a, b, n, scale, stream);
    case MMRT_OP_GELU: return launch_unary_op<MMRT_OP_GELU>(d, a, b, n, scale, stream);
    case MMRT_OP_GELU_TANH: return launch_unary_op<MMRT_OP_GELU_TANH>(d, a, b, n, scale, stream);
    case MMRT_OP_QUICK_GELU: return launch_unary_op<MMRT_OP_QUICK_GELU>(d, a, b, n, scale, stream);
    case MMRT_OP_SILU: return launch_unary_op<MMRT_OP_SILU>(d, a, b, n, scale, stream);
    case MMRT_OP_SWIGLU: return launch_unary_op<MMRT_OP_SWIGLU>(d, a, b, n, scale, stream);
    case MMRT_OP_RELU2: return launch_unary_op<MMRT_OP_RELU2>(d, a, b, n, scale, stream);
    default: return cudaSuccess; /* the host never passes another op */
    }
}

extern "C" cudaError_t cu_launch_norm(float *y, const float *x, const void *w, int w_dtype,
                                      const void *b, int b_dtype, int64_t rows, int64_t n,
                                      float eps, int rms, cudaStream_t stream)
{
    if (rows <= 0 || n <= 0)
        return cudaSuccess;
    unsigned grid = grid_for(rows, 1, 65536);
    double e = eps;
    if (rms) {
        auto k = norm_kernel<true>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, w_dtype, b, b_dtype, rows, n, e);
    } else {
        auto k = norm_kernel<false>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, x, w, w_dtype, b, b_dtype, rows, n, e);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_softmax(float *y, const float *x, int64_t rows, int64_t n,
                                         float scale, cudaStream_t stream)
{
    if (rows <= 0 || n <= 0)
        return cudaSuccess;
    auto k = softmax_kernel;
    CU_LAUNCH(k, grid_for(rows, 1, 65536), kThreads, 0, stream, y, x, rows, n, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_argmax(int32_t *y, const float *x, int64_t rows, int64_t n,
                                        cudaStream_t stream)
{
    if (rows <= 0)
        return cudaSuccess;
    auto k = argmax_kernel;
    CU_LAUNCH(k, grid_for(rows, 1, 65536), kThreads, 0, stream, y, x, rows, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_get_rows(float *y, const void *table, int dtype, int64_t V,
                                          int64_t n, const int32_t *ids, int64_t T,
                                          struct cu_err_word *err, cudaStream_t stream)
{
    if (T <= 0)
        return cudaSuccess;
    unsigned grid = grid_for(T, 1, 65536);
    switch (dtype) {
    case MMRT_DTYPE_F16: {
        auto k = get_rows_kernel<MMRT_DTYPE_F16>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, table, V, n, ids, T, err);
        break;
    }
    case MMRT_DTYPE_BF16: {
        auto k = get_rows_kernel<MMRT_DTYPE_BF16>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, table, V, n, ids, T, err);
        break;
    }
    default: {
        auto k = get_rows_kernel<MMRT_DTYPE_F32>;
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, table, V, n, ids, T, err);
        break;
    }
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_copy(const struct cu_copy_desc *d, cudaStream_t stream)
{
    if (d->ne[0] * d->ne[1] * d->ne[2] * d->ne[3] <= 0)
        return cudaSuccess;
    const int F32 = MMRT_DTYPE_F32, F16 = MMRT_DTYPE_F16, BF16 = MMRT_DTYPE_BF16;
    int s = d->sdt, t = d->ddt;
    if (s == t)
        return mmrt_dtype_size((enum mmrt_dtype)s) == 4
                   ? launch_copy_t<CONV_RAW, uint32_t, uint32_t>(d, stream)
                   : launch_copy_t<CONV_RAW, uint16_t, uint16_t>(d, stream);
    if (s == F32 && t == F16) return launch_copy_t<CONV_F32_F16, uint32_t, uint16_t>(d, stream);
    if (s == F32 && t == BF16) return launch_copy_t<CONV_F32_BF16, uint32_t, uint16_t>(d, stream);
    if (s == F16 && t == F32) return launch_copy_t<CONV_F16_F32, uint16_t, uint32_t>(d, stream);
    if (s == BF16 && t == F32) return launch_copy_t<CONV_BF16_F32, uint16_t, uint32_t>(d, stream);
    if (s == F16 && t == BF16) return launch_copy_t<CONV_F16_BF16, uint16_t, uint16_t>(d, stream);
    if (s == BF16 && t == F16) return launch_copy_t<CONV_BF16_F16, uint16_t, uint16_t>(d, stream);
    return cudaSuccess; /* the host refuses every other pair first */
}

extern "C" cudaError_t cu_launch_rope(const struct cu_rope_desc *d, cudaStream_t stream)
{
    if (d->T <= 0 || d->H <= 0)
        return cudaSuccess;
    auto k = rope_kernel;
    cu_rope_desc v = *d;
    CU_LAUNCH(k, grid_for(d->T, 1, 65536), kThreads, 0, stream, v);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_launch_set_rows(void *dst, int dtype, int64_t R, const float *src,
                                          const int32_t *idx, int64_t T, int64_t n,
                                          float *scales, int64_t per, int64_t D,
                                          cudaStream_t stream)
{
    if (dtype == MMRT_DTYPE_I8) {
        /* per, not n: a row of D = 0 still has a scale to write (0). */
        if (T <= 0 || per <= 0 || R <= 0)
            return cudaSuccess;
        dim3 grid(grid_for(T, 1, 65536), grid_for(per, kWarpRows, 64));
        auto k = set_rows_i8_kernel;
        int8_t *y = static_cast<int8_t *>(dst);
        CU_LAUNCH(k, grid, kThreads, 0, stream, y, scales, R, src, idx, T, per, D);
        return cudaGetLastError();
    }
    if (T <= 0 || n <= 0 || R <= 0)
        return cudaSuccess;
    switch (dtype) {
    case MMRT_DTYPE_F16: return launch_set_rows_t<MMRT_DTYPE_F16>(dst, R, src, idx, T, n, stream);
    case MMRT_DTYPE_F8E4M3:
        return launch_set_rows_t<MMRT_DTYPE_F8E4M3>(dst, R, src, idx, T, n, stream);
    case MMRT_DTYPE_BF16: return launch_set_rows_t<MMRT_DTYPE_BF16>(dst, R, src, idx, T, n, stream);
    default: return launch_set_rows_t<MMRT_DTYPE_F32>(dst, R, src, idx, T, n, stream);
    }
}

extern "C" cudaError_t cu_launch_gather_heads(float *y, const void *table, int dtype,
                                              const float *scales, int64_t R, int64_t H,
                                              int64_t D, const int32_t *idx, int64_t rows,
                                              int64_t G, cudaStream_t stream)
{
    if (rows <= 0 || D <= 0)
        return cudaSuccess;
    switch (dtype) {
    case MMRT_DTYPE_I8:
        return launch_gather_heads_t<MMRT_DTYPE_I8>(y, table, scales, R, H, D, idx, rows, G,
                                                    stream);
    case MMRT_DTYPE_F16:
        return launch_gather_heads_t<MMRT_DTYPE_F16>(y, table, scales, R, H, D, idx, rows, G,
                                                     stream);
    case MMRT_DTYPE_F8E4M3:
        return launch_gather_heads_t<MMRT_DTYPE_F8E4M3>(y, table, scales, R, H, D, idx, rows, G,
                                                        stream);
    case MMRT_DTYPE_BF16:
        return launch_gather_heads_t<MMRT_DTYPE_BF16>(y, table, scales, R, H, D, idx, rows, G,
                                                      stream);
    default:
        return launch_gather_heads_t<MMRT_DTYPE_F32>(y, table, scales, R, H, D, idx, rows, G,
                                                     stream);
    }
}

extern "C" cudaError_t cu_launch_l2_norm(float *y, const float *x, int64_t rows, int64_t n,
                                         cudaStream_t stream)
{
    if (rows <= 0)
        return cudaSuccess;
    auto k = l2_norm_kernel;
    CU_LAUNCH(k, grid_for(rows, kWarpRows, 65536), kThreads, 0, stream, y, x, rows, n);
    return cudaGetLastError();
}
