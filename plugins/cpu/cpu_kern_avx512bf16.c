/*
 * plugins/cpu/cpu_kern_avx512bf16.c — the bf16 dot-product GEMM on AVX512_BF16 (vdpbf16ps),
 * used for BF16 weights in the blocked GEMM (M > CPU_GEMV_MAX_M) when the device option
 * bf16_dot asks for it (cpu_isa.c checks the CPU; on a CPU with AMX, bf16_dot = 1 runs
 * cpu_kern_amx.c instead, which shares the W packing here). Smaller M run the f32 GEMV of
 * cpu_kern_avx512.c, bandwidth-bound and exact in the activations, so a decode row is the
 * same with or without the option and whatever the batch.
 *
 * Same blocking as the f32 micro-kernel of cpu_kern_avx512.c (MR = 14 × NR = 32), but every
 * step consumes a pair of k: W is packed as [k/2][NR][2] bf16 (a 16 × 16 transpose of 32-bit
 * pairs, no conversion — the weights are BF16 already), x as [k/2][MR] pairs of bf16 rounded
 * from f32 (pack_x). vdpbf16ps multiplies the pairs exactly and adds both products to
 * the f32 accumulator, so one instruction does 32 multiply-adds: twice the f32 FMA rate.
 *
 * The price is the rounding of the activations to bf16 (8 significant bits), which is why
 * this path is an option and not the default: see docs/BENCHMARKS.md for its measured loss.
 * Weights are exact (they are BF16 in the checkpoint). Results are still independent of the
 * thread count: each output is one chain of pair-steps in k order.
 */
#include <immintrin.h>

#include "cpu_internal.h"
#include "cpu_kern_avx512_transpose.h"

#define MR 14
#define NR 32

void cpu_pack_w_bf16_avx512(const uint16_t *w, int64_t ldw, int64_t cols, int64_t kc,
                            int64_t kp, uint32_t *dst)
{
    for (int64_t p = (kc + 1) / 2; p < kp; p++) /* the unit's padding: exact zeros */
        for (int j = 0; j < NR; j += 16)
            _mm512_storeu_si512(dst + p * NR + j, _mm512_setzero_si512());
    for (int jb = 0; jb < NR; jb += 16) {
        int64_t rows = cols - jb < 0 ? 0 : cols - jb > 16 ? 16 : cols - jb;
        for (int64_t k0 = 0; k0 < kc; k0 += 32) {
            int64_t kl = kc - k0 < 32 ? kc - k0 : 32; /* bf16 elements in this step */
            __mmask32 m = kl >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << kl) - 1u);
            __m512 r[16];
            for (int t = 0; t < 16; t++)
                r[t] = t < rows ? _mm512_castsi512_ps(
                                      _mm512_maskz_loadu_epi16(m, w + (jb + t) * ldw + k0))
                                : _mm512_setzero_ps();
            transpose16(r);
            int64_t np = (kl + 1) / 2; /* pairs; an odd tail pairs with the masked-in zero */
            for (int t = 0; t < np; t++)
                _mm512_storeu_ps((float *)(dst + (k0 / 2 + t) * NR + jb), r[t]);
        }
    }
}

/* dst[p·MR + i] = bf16(x[i][2p]) | bf16(x[i][2p+1]) << 16, zeros past rows and kc. */
static void pack_x(const float *x, int64_t ldx, int64_t rows, int64_t kc, int64_t kp,
                   uint32_t *dst)
{
    for (int64_t i = 0; i < MR; i++) {
        for (int64_t q = 0; q < kp; q++) {
            uint32_t lo = 0, hi = 0;
            if (i < rows && 2 * q < kc) {
                const float *xr = x + i * ldx;
                lo = cpu_f32_to_bf16(xr[2 * q]);
                hi = 2 * q + 1 < kc ? cpu_f32_to_bf16(xr[2 * q + 1]) : 0;
            }
            dst[q * MR + i] = lo | hi << 16;
        }
    }
}

#define REP14(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13)
#define DECL(i) __m512 a##i##0, a##i##1;
#define ZERO(i) a##i##0 = _mm512_setzero_ps(); a##i##1 = _mm512_setzero_ps();
#define LOADC(i)                                                                               \
    a##i##0 = _mm512_loadu_ps(c + (i) * ldc);                                                  \
    a##i##1 = _mm512_loadu_ps(c + (i) * ldc + 16);
#define STEP(i)                                                                                \
    {                                                                                          \
        __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[i]);                                 \
        a##i##0 = _mm512_dpbf16_ps(a##i##0, w0, xb);                                           \
        a##i##1 = _mm512_dpbf16_ps(a##i##1, w1, xb);                                           \
    }
#define STOREC(i)                                                                              \
    _mm512_storeu_ps(c + (i) * ldc, a##i##0);                                                  \
    _mm512_storeu_ps(c + (i) * ldc + 16, a##i##1);

static void micro(const uint32_t *xp, const uint32_t *wp, int64_t kp, float *c, int64_t ldc,
                  int accumulate)
{
    REP14(DECL)
    if (accumulate) {
        REP14(LOADC)
    } else {
        REP14(ZERO)
    }
    for (int64_t k = 0; k < kp; k++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 16);
        REP14(STEP)
        xp += MR;
        wp += NR;
    }
    REP14(STOREC)
}

const struct cpu_bf16_gemm cpu_bf16_gemm_avx512 = {
    .unit = "avx512_bf16",
    .mr = MR,
    .nr = NR,
    .kalign = 1,
    .kc = 2 * CPU_GEMM_KC,
    .pack_x = pack_x,
    .pack_w = cpu_pack_w_bf16_avx512,
    .micro = micro,
};
