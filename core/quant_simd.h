/*
 * core/quant_simd.h — the pieces of quant.c's rules that core/quant_avx2.c does in vectors
 * (x86-64 only: quant.c calls them when mmrt_quant_avx2_usable() says the CPU can). Each
 * gives exactly the bits of quant.c's plain loop for the same piece.
 */
#ifndef MMRT_CORE_QUANT_SIMD_H
#define MMRT_CORE_QUANT_SIMD_H

#include <stdbool.h>
#include <stdint.h>

#define MMRT_QUANT_Q4_TRIALS 10 /* α = 1, 0.95, …, 0.55 (quant.h) */

/* Whether this CPU (and its OS) runs AVX2 and FMA. */
bool mmrt_quant_avx2_usable(void);

/* The group's range [lo, hi] (both start at 0, so lo ≤ 0 ≤ hi) and whether every value is
 * finite (lo and hi mean nothing when one is not). */
void mmrt_quant_avx2_range(const float *w, int64_t n, float *lo, float *hi, bool *finite);

/* The squared error of each of the MMRT_QUANT_Q4_TRIALS trials (scale s[t] > 0, zero point
 * z[t]) over the n weights, each summed in weight order. */
void mmrt_quant_avx2_q4_errors(const float *w, int64_t n, const double *s, const double *z,
                               double *err);

/* The n codes of scale s > 0 and zero point z, one per byte. */
void mmrt_quant_avx2_q4_codes(const float *w, int64_t n, double s, double z, uint8_t *code);

/* The n INT8 codes of scale s > 0. */
void mmrt_quant_avx2_i8_row(const float *w, int64_t n, float s, int8_t *q);

#endif
