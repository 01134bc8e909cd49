/*
 * plugins/cpu/cpu_kern_avx512bf16.c — the bf16 dot-product GEMM (AVX512_BF16 vdpbf16ps),
 * used for BF16 weights in the blocked GEMM (M > CPU_GEMV_MAX_M) when the device option
 * bf16_dot = 1 (cpu_isa.c checks the CPU). Smaller M run the f32 GEMV of cpu_kern_avx512.c,
 * bandwidth-bound and exact in the activations, so a decode row is the same with or without
 * the option and whatever the batch.
 *
 * Same blocking as the f32 micro-kernel of cpu_kern_avx512.c (MR = 14 × NR = 32), but every
 * step consumes a pair of k: W is packed as [k/2][NR][2] bf16 (a 16 × 16 transpose of 32-bit
 * pairs, no conversion — the weights are BF16 already), x as [k/2][MR] pairs of bf16 rounded
 * from f32 (cpu_pack_x_bf16). vdpbf16ps multiplies the pairs exactly and adds both products to
 * the f32 accumulator, so one instruction does 32 multiply-adds: twice the f32 FMA rate.
 *
 * The price is the rounding of the activations to bf16 (8 significant bits), which is why
 * this path is an option and not the default: see docs/BENCHMARKS.md for its measured loss.
 * Weights are exact (they are BF16 in the checkpoint). Results are still independent of the
 * thread count: each output is one chain of pair-steps in k order.
 */
#include <immintrin.h>

#include "cpu_internal.h"

#define MR 14
#define NR 32

static inline void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

void cpu_pack_w_bf16_avx512(const uint16_t *w, int64_t ldw, int64_t cols, int64_t kc,
                            uint32_t *dst)
{
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

void cpu_micro_bf16_avx512(const uint32_t *xp, const uint32_t *wp, int64_t kp, float *c,
                           int64_t ldc, int accumulate)
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
