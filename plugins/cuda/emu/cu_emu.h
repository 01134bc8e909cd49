/*
 * plugins/cuda/emu/cu_emu.h — a host emulation of the small CUDA subset the plugin's kernels
 * use (see cuda_common.cuh), so that the kernels can be run and checked on machines without
 * a GPU. Compiled as C++17 with -DMMRT_CU_EMU; never part of libmmrt_cuda.so.
 *
 * Model: a launch runs its blocks one after another; the threads of a block are real host
 * threads (one per CUDA thread), so __syncthreads is a barrier and data races between threads
 * behave as races. __shared__ becomes `static`: one block at a time means one copy of the
 * shared arrays is exactly right. Warp shuffles go through a per-warp exchange slot and a
 * per-warp barrier, which is why every lane of a warp must take part in each shuffle (the
 * kernels obey that; the emulator deadlocks rather than guess otherwise).
 */
#ifndef MMRT_CU_EMU_H
#define MMRT_CU_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaSuccess = 0 };
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern dim3 blockDim, gridDim;
extern void *cu_emu_dyn_smem;
#define CU_DYN_SMEM(T) (reinterpret_cast<T *>(cu_emu_dyn_smem))

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* Exchanges 8 bytes through the warp's slot: returns what lane `src` deposited. */
uint64_t cu_emu_exchange(uint64_t v, int src_lane_of_me_xor, bool is_xor);
int cu_emu_lane(void);

template <typename T> T __shfl_xor_sync(unsigned, T v, int mask, int = 32)
{
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = cu_emu_exchange(u, mask, true);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
template <typename T> T __shfl_sync(unsigned, T v, int src, int = 32)
{
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = cu_emu_exchange(u, src, false);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}

static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
template <typename T> static inline T __ldg(const T *p) { return *p; }

static inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned val)
{
    __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp; /* the old value either way */
}
static inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* Runs `body` as a grid of blocks; smem bytes of dynamic shared memory. */
void cu_emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

#define CU_LAUNCH(kernel, grid, block, smem, stream, ...)                                       \
    ((void)(stream), cu_emu_launch(dim3(grid), dim3(block), (smem), [=]() { kernel(__VA_ARGS__); }))

#endif
