/*
 * core/quant_avx2.c — quant.h's rules on AVX2 and FMA, bit for bit the plain loops' results
 * (quant.c chooses this file's functions when the CPU has both; tests/test_quant.c holds both
 * paths to the definition). Built with -mavx2 -mfma -ffp-contract=off: the squared errors
 * must be rounded and summed exactly as the definition's separate multiply and add.
 *
 * Why it is fast: the definition divides every weight by a scale, ten times per INT4 weight
 * (one per clipping trial), and division is the slowest vector operation there is. Here w is
 * multiplied by r = 1/s instead, and that rounds to the same code unless the quotient is a
 * tie. Why: w and s are floats (24-bit significands), so w/s is either exactly a half-way
 * point n + ½ or at least 2^-26 away from one (write w − (n + ½)s over a common power of
 * two). w·r is within 2^-51 |w/s| of the quotient, far less than 2^-26 wherever the code
 * depends on the rounding (|w/s| < 16 for INT4, ≤ 127.5 for INT8; beyond, both clamp to the
 * same end). So a product within 2^-40 of a half-way point — a tie — is done again by
 * division and rounded half away from zero, as round() does; every other lane keeps w·r
 * rounded to nearest.
 */
#include "quant_simd.h"

#include <immintrin.h>

#define NEAR_HALF (0.5 - 0x1p-40)

/* Each lane to the nearest whole number, ties to even. */
static inline __m256d round_even(__m256d q)
{
    return _mm256_round_pd(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* round() of each lane: to nearest, ties away from zero, for any magnitude, and a zero's
 * sign kept (round(−0.3) is −0). */
static inline __m256d round_away(__m256d q)
{
    const __m256d n = round_even(q);
    const __m256d f = _mm256_sub_pd(q, n); /* exact: |f| ≤ 0.5 */
    const __m256d one = _mm256_set1_pd(1.0), zero = _mm256_setzero_pd();
    /* a tie rounded to even towards zero moves one away */
    const __m256d up = _mm256_and_pd(_mm256_cmp_pd(f, _mm256_set1_pd(0.5), _CMP_EQ_OQ),
                                     _mm256_cmp_pd(q, zero, _CMP_GT_OQ));
    const __m256d down = _mm256_and_pd(_mm256_cmp_pd(f, _mm256_set1_pd(-0.5), _CMP_EQ_OQ),
                                       _mm256_cmp_pd(q, zero, _CMP_LT_OQ));
    return _mm256_blendv_pd(_mm256_blendv_pd(n, _mm256_add_pd(n, one), up),
                            _mm256_sub_pd(n, one), down);
}

/* The lanes whose product q, rounded to n, lies too near a half-way point to be sure of
 * rounding as the quotient would. */
static inline __m256d near_half(__m256d q, __m256d n)
{
    const __m256d absf = _mm256_andnot_pd(_mm256_set1_pd(-0.0), _mm256_sub_pd(q, n));
    return _mm256_cmp_pd(absf, _mm256_set1_pd(NEAR_HALF), _CMP_GE_OQ);
}

/* round(w / s) of each lane by w · r (r = 1 / s), or by the division where the product is
 * too near a half-way point to be sure. */
static inline __m256d round_quotient(__m256d w, __m256d s, __m256d r)
{
    const __m256d q = _mm256_mul_pd(w, r), n = round_even(q), near = near_half(q, n);
    if (__builtin_expect(!_mm256_testz_pd(near, near), 0))
        return round_away(_mm256_div_pd(w, s));
    return n;
}

bool mmrt_quant_avx2_usable(void)
{
#if defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

void mmrt_quant_avx2_range(const float *w, int64_t n, float *lo, float *hi, bool *finite)
{
    __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps();
    __m256i bad = _mm256_setzero_si256();
    const __m256i expo = _mm256_set1_epi32(0x7f800000);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(w + i);
        /* inf and NaN: every exponent bit set */
        bad = _mm256_or_si256(
            bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), expo), expo));
        vlo = _mm256_min_ps(v, vlo); /* v < lo ? v : lo, as the plain loop */
        vhi = _mm256_max_ps(v, vhi);
    }
    float l[8], h[8];
    _mm256_storeu_ps(l, vlo);
    _mm256_storeu_ps(h, vhi);
    float a = 0.0f, b = 0.0f;
    for (int t = 0; t < 8; t++) {
        a = l[t] < a ? l[t] : a;
        b = h[t] > b ? h[t] : b;
    }
    bool ok = _mm256_testz_si256(bad, bad);
    for (; i < n; i++) {
        ok = ok && (w[i] - w[i] == 0.0f);
        a = w[i] < a ? w[i] : a;
        b = w[i] > b ? w[i] : b;
    }
    *lo = a;
    *hi = b;
    *finite = ok;
}

void mmrt_quant_avx2_q4_errors(const float *w, int64_t n, const double *s, const double *z,
                               double *err)
{
    /* The ten trials in three vectors of four, lanes 10 and 11 repeating trial 9; each lane
     * works out one trial's sum in weight order, as the definition's loop does. All three in
     * one loop, so that their sums' dependency chains overlap, and one test of the three for
     * a product too near a half-way point (the rare redo by division). */
    const __m256d one = _mm256_set1_pd(1.0), neg = _mm256_set1_pd(-0.0),
                  fifteen = _mm256_set1_pd(15.0);
    const __m256d s0 = _mm256_loadu_pd(s), s1 = _mm256_loadu_pd(s + 4),
                  s2 = _mm256_set_pd(s[9], s[9], s[9], s[8]), r0 = _mm256_div_pd(one, s0),
                  r1 = _mm256_div_pd(one, s1), r2 = _mm256_div_pd(one, s2);
    /* code − z clamped to [−z, 15 − z] is clamp(code, 0, 15) − z */
    const __m256d z0 = _mm256_loadu_pd(z), z1 = _mm256_loadu_pd(z + 4),
                  z2 = _mm256_set_pd(z[9], z[9], z[9], z[8]);
    const __m256d lo0 = _mm256_xor_pd(z0, neg), lo1 = _mm256_xor_pd(z1, neg),
                  lo2 = _mm256_xor_pd(z2, neg), hi0 = _mm256_sub_pd(fifteen, z0),
                  hi1 = _mm256_sub_pd(fifteen, z1), hi2 = _mm256_sub_pd(fifteen, z2);
    __m256d e0 = _mm256_setzero_pd(), e1 = e0, e2 = e0;
    for (int64_t i = 0; i < n; i++) {
        const __m256d wv = _mm256_set1_pd((double)w[i]);
        const __m256d q0 = _mm256_mul_pd(wv, r0), q1 = _mm256_mul_pd(wv, r1),
                      q2 = _mm256_mul_pd(wv, r2);
        __m256d n0 = round_even(q0), n1 = round_even(q1), n2 = round_even(q2);
        const __m256d near = _mm256_or_pd(_mm256_or_pd(near_half(q0, n0), near_half(q1, n1)),
                                          near_half(q2, n2));
        if (__builtin_expect(!_mm256_testz_pd(near, near), 0)) {
            n0 = round_away(_mm256_div_pd(wv, s0));
            n1 = round_away(_mm256_div_pd(wv, s1));
            n2 = round_away(_mm256_div_pd(wv, s2));
        }
        /* (c − z)·s is exact (4 bits by 24), so the one rounding of the fused
         * w − (c − z)·s is the definition's subtraction */
        const __m256d d0 = _mm256_fnmadd_pd(_mm256_min_pd(_mm256_max_pd(n0, lo0), hi0), s0, wv);
        const __m256d d1 = _mm256_fnmadd_pd(_mm256_min_pd(_mm256_max_pd(n1, lo1), hi1), s1, wv);
        const __m256d d2 = _mm256_fnmadd_pd(_mm256_min_pd(_mm256_max_pd(n2, lo2), hi2), s2, wv);
        e0 = _mm256_add_pd(e0, _mm256_mul_pd(d0, d0));
        e1 = _mm256_add_pd(e1, _mm256_mul_pd(d1, d1));
        e2 = _mm256_add_pd(e2, _mm256_mul_pd(d2, d2));
    }
    double e[12];
    _mm256_storeu_pd(e, e0);
    _mm256_storeu_pd(e + 4, e1);
    _mm256_storeu_pd(e + 8, e2);
    for (int t = 0; t < MMRT_QUANT_Q4_TRIALS; t++)
        err[t] = e[t];
}

void mmrt_quant_avx2_q4_codes(const float *w, int64_t n, double s, double z, uint8_t *code)
{
    const __m256d sv = _mm256_set1_pd(s), rv = _mm256_set1_pd(1.0 / s), zv = _mm256_set1_pd(z),
                  top = _mm256_set1_pd(15.0), zero = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d c = _mm256_min_pd(
            _mm256_max_pd(_mm256_add_pd(round_quotient(_mm256_cvtps_pd(_mm_loadu_ps(w + i)),
                                                       sv, rv),
                                        zv),
                          zero),
            top);
        const __m128i ci = _mm256_cvtpd_epi32(c); /* whole numbers 0 … 15: exact */
        const __m128i b = _mm_packus_epi16(_mm_packs_epi32(ci, ci), _mm_setzero_si128());
        const int32_t four = _mm_cvtsi128_si32(b);
        __builtin_memcpy(code + i, &four, 4);
    }
    for (; i < n; i++) {
        const __m256d c = _mm256_min_pd(
            _mm256_max_pd(
                _mm256_add_pd(round_quotient(_mm256_set1_pd((double)w[i]), sv, rv), zv),
                zero),
            top);
        code[i] = (uint8_t)_mm256_cvtsd_f64(c);
    }
}

void mmrt_quant_avx2_i8_row(const float *w, int64_t n, float s, int8_t *q)
{
    const __m256d sv = _mm256_set1_pd((double)s), rv = _mm256_set1_pd(1.0 / (double)s),
                  lim = _mm256_set1_pd(127.0), nlim = _mm256_set1_pd(-127.0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d v = _mm256_max_pd(
            _mm256_min_pd(round_quotient(_mm256_cvtps_pd(_mm_loadu_ps(w + i)), sv, rv), lim),
            nlim);
        const __m128i ci = _mm256_cvtpd_epi32(v);
        const __m128i b = _mm_packs_epi16(_mm_packs_epi32(ci, ci), _mm_setzero_si128());
        const int32_t four = _mm_cvtsi128_si32(b);
        __builtin_memcpy(q + i, &four, 4);
    }
    for (; i < n; i++) {
        const __m256d v = _mm256_max_pd(
            _mm256_min_pd(round_quotient(_mm256_set1_pd((double)w[i]), sv, rv), lim), nlim);
        q[i] = (int8_t)_mm256_cvtsd_f64(v);
    }
}
