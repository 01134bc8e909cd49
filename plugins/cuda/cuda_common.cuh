/*
 * plugins/cuda/cuda_common.cuh — what every .cu file of the CUDA plugin shares: the few CUDA
 * constructs the kernels use, spelled so that the same source also compiles as plain C++ for
 * the host emulator (emu/cu_emu.h, MMRT_CU_EMU), plus dtype conversions and reductions.
 *
 * Why an emulator: this plugin is developed on machines without a GPU. Compiled with
 * -DMMRT_CU_EMU, each kernel runs on the CPU with one host thread per CUDA thread (blocks one
 * after another, __syncthreads as a barrier, warp shuffles through a per-warp exchange), so
 * emu/emu_kernels_test.cpp (ctest test_cuda_emu) checks indexing, masking, tiling and
 * reductions against the double reference before a GPU ever sees the code. It is not a performance model and it ignores
 * memory-model subtleties a real GPU has; what it catches is wrong arithmetic and indexing.
 *
 * Rules the kernels follow so that both builds agree:
 *   - launches go through CU_LAUNCH, never <<<…>>> directly;
 *   - shared memory is either a __shared__ array declared in a __global__ function or in a
 *     block-wide helper, or the dynamic buffer from CU_DYN_SMEM;
 *   - every thread of a block reaches every __syncthreads (no early return of some threads
 *     before a barrier), and every lane of a warp takes part in each shuffle;
 *   - float arithmetic that must round exactly like the CPU reference (norms, softmax, rope,
 *     conversions) uses the explicit _rn intrinsics, so nvcc cannot contract it into FMAs.
 */
#ifndef MMRT_CUDA_COMMON_CUH
#define MMRT_CUDA_COMMON_CUH

#include <stdint.h>

#ifdef MMRT_CU_EMU
#include "emu/cu_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define CU_LAUNCH(kernel, grid, block, smem, stream, ...)                                       \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define CU_DYN_SMEM(T) (reinterpret_cast<T *>(cu_dyn_smem_raw))
extern __shared__ float4 cu_dyn_smem_raw[]; /* float4: 16-byte alignment for vector access */
#endif

#include "mmrt/plugin.h"

namespace cu {

/* +inf; a macro because __int_as_float is not constexpr. */
#define CU_INF __int_as_float(0x7f800000)

template <typename T> __host__ __device__ __forceinline__ T min_(T a, T b) { return a < b ? a : b; }
template <typename T> __host__ __device__ __forceinline__ T max_(T a, T b) { return a > b ? a : b; }

/* ---- f16 / bf16 ------------------------------------------------------------------------
 * Tensors hold halves as raw uint16_t bits. The *_exact conversions reproduce the CPU
 * plugin bit for bit, NaN payloads included (COPY, GET_ROWS, CONCAT must be exact); the fast
 * ones use the hardware conversion where the value only feeds arithmetic. */

__device__ __forceinline__ float f16_to_f32_exact(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e != 0)
        return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    /* Zero or subnormal: m · 2^-24 is exact in f32. */
    return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)m, 5.9604644775390625e-8f)));
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even; overflow to ±inf, NaN to the quiet NaN sign|0x7e00. */
__device__ __forceinline__ uint16_t f32_to_f16_exact(float f)
{
    uint32_t x = __float_as_uint(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* 65520, halfway above the largest half, and beyond */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        /* Result subnormal (or the smallest normal after rounding up): adding 0.5 makes the
         * FPU round to a multiple of 2^-24, which is exactly the subnormal mantissa unit. */
        float t = __fadd_rn(__uint_as_float(ax), 0.5f);
        return (uint16_t)(sign | (uint16_t)(__float_as_uint(t) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax = ax - (112u << 23) + 0xfffu + odd; /* re-bias 127 → 15, round the 13 dropped bits */
    return (uint16_t)(sign | (uint16_t)(ax >> 13));
}

/* Round to nearest even; NaN stays a quiet NaN with its sign and top payload bits. */
__device__ __forceinline__ uint16_t f32_to_bf16_exact(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#ifdef MMRT_CU_EMU
__device__ __forceinline__ float f16_to_f32(uint16_t h) { return f16_to_f32_exact(h); }
#else
__device__ __forceinline__ float f16_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}
#endif

/* f32 → f16 / bf16 bits, round to nearest even (the hardware conversion on the GPU). */
#ifdef MMRT_CU_EMU
__device__ __forceinline__ uint16_t f32_to_f16_rn(float f) { return f32_to_f16_exact(f); }
__device__ __forceinline__ uint16_t f32_to_bf16_rn(float f) { return f32_to_bf16_exact(f); }
#else
__device__ __forceinline__ uint16_t f32_to_f16_rn(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ uint16_t f32_to_bf16_rn(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
#endif

/* FP8 E4M3 code → f32, exactly (plugin.h mmrt_f8e4m3_to_f32): a normal code's 7 magnitude
 * bits moved to f32 bits 20…26 with 120 added to the exponent, a subnormal one as its
 * mantissa · 2^-9 (exact, and an f32 normal), 0x7F the NaN, then the sign. */
__device__ __forceinline__ float f8e4m3_to_f32(uint8_t c)
{
    const uint32_t mag = c & 0x7Fu, sign = (uint32_t)(c & 0x80u) << 24;
    const uint32_t bits = mag == 0x7Fu ? 0x7FC00000u
                          : mag < 8u   ? __float_as_uint(__fmul_rn((float)mag, 0x1.0p-9f))
                                       : (mag << 20) + (120u << 23);
    return __uint_as_float(bits | sign);
}

/* f32 → FP8 E4M3 as plugin.h asks (mmrt_f32_to_f8e4m3), in integer arithmetic only — the
 * hardware's satfinite conversion exists only on sm_89+, and the host emulator must give
 * the same bits: round to nearest even, magnitudes ≥ 448 (infinity too) → ±448, NaN → 0x7F
 * with its sign. Subnormal codes count 2^-9 steps: the significand shifted by 141 − exponent
 * and rounded to nearest even (a shift of 25 or more leaves less than half a step). */
__device__ __forceinline__ uint8_t f32_to_f8e4m3(float f)
{
    uint32_t x = __float_as_uint(f);
    const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u)
        return (uint8_t)(sign | 0x7Fu);
    if (ax >= 0x43E00000u) /* 448 */
        return (uint8_t)(sign | 0x7Eu);
    if (ax < 0x3C800000u) {
        const uint32_t e = ax >> 23, s = 141u - e;
        if (e == 0u || s >= 25u)
            return sign;
        const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t q = m >> s;
        const uint32_t rem = m & ((1u << s) - 1u), tie = 1u << (s - 1u);
        q += (rem > tie || (rem == tie && (q & 1u))) ? 1u : 0u;
        return (uint8_t)(sign | q);
    }
    ax += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((ax >> 20) & 1u);
    return (uint8_t)(sign | (ax >> 20));
}

/* I8 KV store with row scales (plugin.h, ABI 1.7). A code stands for code · scale rounded
 * once: __fmul_rn, so that nvcc cannot fuse the product into the reader's next FMA and the
 * widened value is the one an F32 copy of the store would hold. */
__device__ __forceinline__ float i8_to_f32(int8_t c, float scale)
{
    return __fmul_rn((float)c, scale);
}

/* The code of x in a row whose scale is s = amax / 127: x / s correctly rounded (__fdiv_rn,
 * never a reciprocal), then to the nearest integer with ties to even (rintf), clamped to
 * ±127; a NaN quotient (0 / 0, ∞ / ∞, NaN x) is 0. The clamp is on floats, before the
 * conversion, because x / s may be ±∞ (s rounded to 0 from a subnormal amax). */
__device__ __forceinline__ int8_t f32_to_i8_code(float x, float s)
{
    const float q = __fdiv_rn(x, s);
    if (q != q)
        return 0;
    return (int8_t)(int)fminf(fmaxf(rintf(q), -127.0f), 127.0f);
}

/* Element i of a weight-dtype array (F32, F16 or BF16, or an F8E4M3 KV table) as f32. */
template <int DT> __device__ __forceinline__ float load_w(const void *p, int64_t i)
{
    if (DT == MMRT_DTYPE_F8E4M3)
        return f8e4m3_to_f32(static_cast<const uint8_t *>(p)[i]);
    if (DT == MMRT_DTYPE_F16)
        return f16_to_f32(static_cast<const uint16_t *>(p)[i]);
    if (DT == MMRT_DTYPE_BF16)
        return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

/* ---- reductions ------------------------------------------------------------------------
 * Butterfly (xor) shuffles: every lane ends with the same value, bit for bit, because each
 * step adds the same two operands on both lanes (addition is commutative). */

template <typename T> __device__ __forceinline__ T warp_sum(T v)
{
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* NaN never wins (v > m is false for NaN), matching the CPU's running maximum. */
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, m);
        v = o > v ? o : v;
    }
    return v;
}

/* Block-wide sum / max for blockDim.x a multiple of 32 (≤ 1024), result on every thread.
 * All threads must call it; it ends with a barrier, so it may be called again at once. */
template <typename T> __device__ T block_sum(T v)
{
    __shared__ T part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < n_warps ? part[lane] : T(0);
        w = warp_sum(w);
        if (lane == 0)
            part[0] = w;
    }
    __syncthreads();
    T r = part[0];
    __syncthreads();
    return r;
}

__device__ inline float block_max(float v)
{
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < n_warps ? part[lane] : -CU_INF;
        w = warp_max(w);
        if (lane == 0)
            part[0] = w;
    }
    __syncthreads();
    float r = part[0];
    __syncthreads();
    return r;
}

/* Grid size for a grid-stride loop over n items with `per_block` items per block pass:
 * enough blocks to fill any current GPU several times over, never more than needed. */
inline unsigned grid_for(int64_t n, int64_t per_block, int64_t cap = 8192)
{
    int64_t g = (n + per_block - 1) / per_block;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

} // namespace cu

#endif
