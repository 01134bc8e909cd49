/*
 * core/quant.c — weight quantization (see quant.h for the rules).
 */
#include "quant.h"

#include <math.h>

const char *mmrt_weight_format_name(enum mmrt_weight_format f)
{
    switch (f) {
    case MMRT_WEIGHTS_CHECKPOINT: return "checkpoint";
    case MMRT_WEIGHTS_INT8: return "int8";
    }
    return "an unknown weight format";
}

bool mmrt_quant_i8_rows(const float *w, int64_t rows, int64_t k, int8_t *q, float *scale,
                        int64_t *bad)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * k;
        float amax = 0.0f;
        for (int64_t i = 0; i < k; i++) {
            if (!isfinite(row[i])) {
                *bad = r * k + i;
                return false;
            }
            float a = fabsf(row[i]);
            amax = a > amax ? a : amax;
        }
        const float s = (float)((double)amax / 127.0);
        scale[r] = s;
        int8_t *qr = q + r * k;
        if (s == 0.0f) { /* all zero, or so small that max|w| / 127 underflows */
            for (int64_t i = 0; i < k; i++)
                qr[i] = 0;
            continue;
        }
        for (int64_t i = 0; i < k; i++) {
            double v = round((double)row[i] / (double)s);
            qr[i] = (int8_t)(v > 127.0 ? 127 : v < -127.0 ? -127 : v);
        }
    }
    return true;
}
