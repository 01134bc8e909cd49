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
 */
#ifndef MMRT_CORE_QUANT_H
#define MMRT_CORE_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "mmrt/mmrt.h" /* enum mmrt_weight_format */

/* The [model] weights spelling of f ("checkpoint", "int8"). */
const char *mmrt_weight_format_name(enum mmrt_weight_format f);

/* Quantizes rows × k floats (row-major) into q (rows × k) and scale (rows). Returns false,
 * with *bad the index of the first one, when a value is not finite (nothing sensible can be
 * quantized from it); q and scale are then partly written. */
bool mmrt_quant_i8_rows(const float *w, int64_t rows, int64_t k, int8_t *q, float *scale,
                        int64_t *bad);

#endif
