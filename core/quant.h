/*
 * core/quant.h — how mmrt turns float weights into quantized ones, in one place: the loader
 * ([model] weights, models/weights.c), mmrt-bench and the tests all quantize through here, so a
 * weight quantized at load is bit for bit the one the tests reason about.
 *
 * INT8 (plugin.h MMRT_OP_MATMUL, I8 weights): symmetric, one scale per output channel (row):
 * scale = max|w| / 127 (in double, rounded once to f32), q = w / scale rounded to nearest
 * (ties away from zero) and clamped to ±127, so -128 is never used and the code is symmetric.
 * A row of zeros gets scale 0 and zero codes. The relative error of a weight is at most
 * half a step, max|w| / 254.
 *
 * INT4 (plugin.h, U4 weights): asymmetric, per group of `group` consecutive weights of a row
 * (32, 64 or 128 …, a multiple of 32 dividing K), codes 0 … 15 packed as plugin.h lays them
 * out. The range [lo, hi] of a group always holds 0 (so 0 is exact and a constant group is
 * exact); the clipping range is chosen to minimise the group's squared error: for
 * α = 1, 0.95, …, 0.55, the range α·[lo, hi] gives scale = α(hi − lo) / 15, zero =
 * round(−α·lo / scale) in [0, 15], code = clamp(round(w / scale) + zero, 0, 15), and the α
 * with the least Σ (w − (code − zero)·scale)² wins (the first on a tie). Zero points are
 * whole numbers held as floats.
 */
#ifndef MMRT_CORE_QUANT_H
#define MMRT_CORE_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "mmrt/mmrt.h" /* enum mmrt_weight_format */

/* The [model] weights spelling of f ("checkpoint", "int8", "int4", "int4-g64", …). */
const char *mmrt_weight_format_name(enum mmrt_weight_format f);

/* Weights per INT4 group of f (0 when f is not INT4). */
int64_t mmrt_weight_format_group(enum mmrt_weight_format f);

/* Which code computes the rules below. Every path gives the same bits (tests/test_quant.c
 * holds each to the definition): MMRT_QUANT_FAST is the fastest this CPU runs (AVX2 and FMA
 * where present: core/quant_avx2.c), MMRT_QUANT_PLAIN the plain C loops. */
enum mmrt_quant_path { MMRT_QUANT_FAST, MMRT_QUANT_PLAIN };

/* Quantizes rows × k floats (row-major) into q (rows × k) and scale (rows). Returns false,
 * with *bad the index of the first one, when a value is not finite (nothing sensible can be
 * quantized from it); q and scale are then partly written. */
bool mmrt_quant_i8_rows(const float *w, int64_t rows, int64_t k, int8_t *q, float *scale,
                        int64_t *bad);
bool mmrt_quant_i8_rows_on(enum mmrt_quant_path path, const float *w, int64_t rows, int64_t k,
                           int8_t *q, float *scale, int64_t *bad);

/* Quantizes rows × k floats into codes (rows × k/2 bytes, plugin.h's U4 layout), scale and
 * zero (rows × k/group each). k and group must be multiples of 32 with group dividing k, and
 * group at most 4096.
 * False, with *bad the index of the first one, on a value that is not finite. */
bool mmrt_quant_q4_rows(const float *w, int64_t rows, int64_t k, int64_t group, uint8_t *codes,
                        float *scale, float *zero, int64_t *bad);
bool mmrt_quant_q4_rows_on(enum mmrt_quant_path path, const float *w, int64_t rows, int64_t k,
                           int64_t group, uint8_t *codes, float *scale, float *zero,
                           int64_t *bad);

/* Either of the two above over `threads` threads (group 0: INT8, codes int8_t and zero
 * unused; else INT4 with that group), each quantizing a contiguous run of rows: the outputs
 * and *bad are exactly those of one call. Quantizing at load is one pass over every weight,
 * and on a 7B model it took minutes on one core. */
#define MMRT_QUANT_MAX_THREADS 16
bool mmrt_quant_rows(const float *w, int64_t rows, int64_t k, int64_t group, void *codes,
                     float *scale, float *zero, int threads, int64_t *bad);

/* mmrt_quant_rows for a matrix that is not in memory as floats (a checkpoint's F16 or BF16
 * tensor): each thread reads its own rows through `read` (rows [r0, r0 + n) into dst, a
 * buffer of its own; called from several threads at once) a slice at a time, so converting
 * runs in parallel too. False on the first non-finite value in row-major order (*bad its
 * index, *bad_value the value), or, *bad then −1, when a read fails or a buffer cannot be
 * had (err says which; with several, the one of the earliest rows). */
typedef mmrt_status (*mmrt_quant_read_fn)(void *user, int64_t r0, int64_t n, float *dst,
                                          struct mmrt_error *err);
bool mmrt_quant_rows_read(mmrt_quant_read_fn read, void *user, int64_t rows, int64_t k,
                          int64_t group, void *codes, float *scale, float *zero, int threads,
                          int64_t *bad, float *bad_value, struct mmrt_error *err);

/* The threads mmrt_quant_rows is given at load: the online CPUs, at most
 * MMRT_QUANT_MAX_THREADS. */
int mmrt_quant_threads(void);

/* Code k of a U4 row (plugin.h's layout). */
static inline unsigned mmrt_q4_code(const uint8_t *row, int64_t k)
{
    const uint8_t b = row[(k / 32) * 16 + (k % 16)];
    return (k % 32) < 16 ? b & 0xFu : b >> 4;
}

#endif
