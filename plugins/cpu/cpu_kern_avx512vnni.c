/*
 * plugins/cpu/cpu_kern_avx512vnni.c — the int8 U4 GEMV on AVX512_VNNI (device option
 * int8_dot with the avx512 table; cpu_isa.c checks the CPU). What it computes, and why it is
 * an option: cpu_internal.h, struct cpu_q4_q8.
 *
 * A step is a chunk of 128 codes of a row (64 bytes, 4 blocks of 32): the low nibbles of the
 * 64 bytes are codes 32b + j of the four blocks, the high nibbles codes 32b + 16 + j, and x's
 * int8 codes are laid out in that order (cpu_q8_quantize), so two vpdpbusd — codes unsigned,
 * x signed, never saturating: 4 · 15 · 127 per lane — give 16 int32 lanes, four per block.
 * Each lane becomes f32 exactly and meets its block's d times its group's scale in one FMA
 * into the row's accumulator: per 128 codes and row, nine vector operations where widening
 * every code to f32 took about thirty.
 *
 * Three digits (int8_dot = 3): the lanes' sums of digits a, b and c are joined in the lane
 * as ((A·256) + B)·256 + C: shift the lanes left by 8 and go on with the next digit's two
 * vpdpbusd. Each sum is at most 8 · 15 · 128 = 15360 in magnitude, so the joined lane is at
 * most 15360 · 65793 ≈ 1.01e9 < 2^31: no overflow, and one conversion to f32 (its only
 * rounding, 2^-24 relative) per lane. Fourteen operations per 128 codes and row, six of them
 * vpdpbusd, which this core issues two a cycle: still above memory's rate of codes.
 */
#include <immintrin.h>
#include <stdbool.h>

#include "cpu_internal.h"

#define Q8_C 128
#define Q8_R 4 /* W rows side by side: 4 accumulators, the x chunk and its d in registers */

/* x row m against R W rows: y[r] = the row sum of cpu_q4_q8, reduced and less the zero
 * points' share. pf: the next block of rows to prefetch, or NULL. */
static inline __attribute__((always_inline)) void
q8_rows_g(const struct cpu_q8_rows *x, int64_t m, int64_t K, const uint8_t *w, int64_t rowb,
          const float *s, const float *z, int64_t ng, const int R, float *y, const uint8_t *pf,
          const bool one_group, const int D, const bool l2)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const int8_t *xq = x->q + m * x->kp * D;
    const float *xd = x->d + m * (x->kp / 8);
    __m512 tot[Q8_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        tot[r] = _mm512_setzero_ps();
    const int64_t nc = x->kp / Q8_C, full = K / Q8_C;
    for (int64_t c = 0; c < nc; c++) {
        __m512i xl[CPU_Q8_MAX_DIGITS], xh[CPU_Q8_MAX_DIGITS];
#pragma GCC unroll 3
        for (int t = 0; t < D; t++) {
            xl[t] = _mm512_load_si512(xq + (c * D + t) * Q8_C);
            xh[t] = _mm512_load_si512(xq + (c * D + t) * Q8_C + Q8_C / 2);
        }
        const __m512 dv = _mm512_load_ps(xd + c * 16);
        const __m512i gi = _mm512_load_si512(x->lg + c * 16);
        const __mmask16 sm = (__mmask16)((1u << x->ch[c].span) - 1);
        /* the last chunk may hold fewer than 128 codes: load only the row's own bytes */
        const __mmask64 wm = c < full ? ~(__mmask64)0
                                      : ((__mmask64)1 << ((K - c * Q8_C) / 2)) - 1;
        const int64_t g0 = x->ch[c].g0;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            if (pf)
                cpu_prefetch_read(pf + r * rowb + c * (Q8_C / 2), l2);
            const __m512i b = _mm512_maskz_loadu_epi8(wm, w + r * rowb + c * (Q8_C / 2));
            const __m512i lo = _mm512_and_si512(b, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
            __m512i is = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl[0]), hi, xh[0]);
#pragma GCC unroll 2
            for (int t = 1; t < D; t++)
                is = _mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(_mm512_slli_epi32(is, 8), lo, xl[t]), hi, xh[t]);
            const __m512 sv = one_group ? _mm512_set1_ps(s[r * ng + g0])
                                        : _mm512_permutexvar_ps(gi, _mm512_maskz_loadu_ps(
                                                                        sm, s + r * ng + g0));
            tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, sv), tot[r]);
        }
    }
    float zc[Q8_R];
    cpu_q4_zero_shares(s, z, x->xsum + m * ng, ng, 1, R, zc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        y[r] = _mm512_reduce_add_ps(tot[r]) - zc[r];
}

/* One whole block of 32 values as cpu_q8_block rounds it: one rounding conversion
 * (_mm512_cvtps_epi32, to nearest even as nearbyintf) of x·(Q / amax), clamped to ±Q as the
 * definition clamps, then split into D digits (D = 1: saturated to int8). Declines NaN, ±inf
 * (max would drop a NaN) and a tiny amax. */
static inline __attribute__((always_inline)) bool
q8_block(const float *x, int8_t *lo, int8_t *hi, float *amax_out, int32_t *sum, const int D)
{
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const __mmask16 bad = _mm512_fpclass_ps_mask(v0, 0x99) | _mm512_fpclass_ps_mask(v1, 0x99);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, absm), _mm512_and_ps(v1, absm)));
    if (bad || !(amax >= CPU_Q8_MIN_SCALED))
        return false;
    const float qf = (float)CPU_Q8_FULL(D);
    const __m512 inv = _mm512_set1_ps(qf / amax);
    const __m512i qmax = _mm512_set1_epi32(CPU_Q8_FULL(D));
    const __m512i qmin = _mm512_set1_epi32(-CPU_Q8_FULL(D));
    __m512i q[2] = { _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)),
                     _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)) };
    int8_t *half[2] = { lo, hi };
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        q[h] = _mm512_max_epi32(_mm512_min_epi32(q[h], qmax), qmin);
        __m512i r = q[h];
        /* the digits from the least significant: c = ((r + 128) & 255) − 128, r = (r − c)/256 */
#pragma GCC unroll 3
        for (int t = D - 1; t >= 0; t--) {
            const __m512i c = _mm512_sub_epi32(
                _mm512_and_si512(_mm512_add_epi32(r, _mm512_set1_epi32(128)),
                                 _mm512_set1_epi32(255)),
                _mm512_set1_epi32(128));
            _mm_storeu_si128((__m128i *)(half[h] + t * Q8_C), _mm512_cvtsepi32_epi8(t ? c : r));
            r = _mm512_srai_epi32(_mm512_sub_epi32(r, c), 8);
        }
    }
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
    *amax_out = amax;
    return true;
}

#include "cpu_kern_q8_gemv.h"

const struct cpu_q4_q8 cpu_q4_q8_avx512vnni = {
    .unit = "avx512_vnni",
    .chunk = Q8_C,
    .digits = 1,
    .quant_row = q8_quant_row1,
    .gemv = q8_gemv1,
    .gemv_l2 = q8_gemv1_l2,
};

const struct cpu_q4_q8 cpu_q4_q8_avx512vnni_3 = {
    .unit = "avx512_vnni",
    .chunk = Q8_C,
    .digits = 3,
    .quant_row = q8_quant_row3,
    .gemv = q8_gemv3,
    .gemv_l2 = q8_gemv3_l2,
};
