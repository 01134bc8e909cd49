/*
 * tools/common/kv_i8_ref.h — plugin.h's INT8 KV row quantizer ("I8 with row scales") written
 * from its definition, for the checks that hold plugins to it (the operator tests and
 * mmrt-plugin-check). It is apart from every plugin's f32 code on purpose: the two correctly
 * rounded f32 divisions are a double quotient rounded once to float (a double holds more
 * than twice f32's bits, so that is the correctly rounded f32 quotient), and ties to even are
 * spelled out rather than left to the rounding mode.
 */
#ifndef MMRT_TOOLS_KV_I8_REF_H
#define MMRT_TOOLS_KV_I8_REF_H

#include <math.h>
#include <stdint.h>

/* codes[0..D) and *scale of the row x[0..D): amax over the non-NaN |x|, scale = amax / 127,
 * code = x / scale to the nearest integer (ties to even) clamped to ±127, 0 for a NaN
 * quotient (0 / 0, ∞ / ∞, a NaN x). */
static inline void mmrt_ref_i8_row_quantize(const float *x, int64_t D, int8_t *codes,
                                            float *scale)
{
    double amax = 0.0;
    for (int64_t i = 0; i < D; i++)
        if (!isnan(x[i]) && fabs((double)x[i]) > amax)
            amax = fabs((double)x[i]);
    const float s = (float)(amax / 127.0);
    for (int64_t i = 0; i < D; i++) {
        const double q = (double)(float)((double)x[i] / (double)s);
        double r = floor(q);
        if (q - r > 0.5 || (q - r == 0.5 && fmod(r, 2.0) != 0.0))
            r += 1.0;
        codes[i] = isnan(q) ? 0 : r > 127.0 ? 127 : r < -127.0 ? -127 : (int8_t)r;
    }
    *scale = s;
}

#endif
