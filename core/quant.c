/*
 * core/quant.c — weight quantization (see quant.h for the rules).
 */
#include "quant.h"

#include <math.h>
#include <string.h>

const char *mmrt_weight_format_name(enum mmrt_weight_format f)
{
    switch (f) {
    case MMRT_WEIGHTS_CHECKPOINT: return "checkpoint";
    case MMRT_WEIGHTS_INT8: return "int8";
    case MMRT_WEIGHTS_INT4: return "int4";
    case MMRT_WEIGHTS_INT4_G64: return "int4-g64";
    case MMRT_WEIGHTS_INT4_G32: return "int4-g32";
    }
    return "an unknown weight format";
}

int64_t mmrt_weight_format_group(enum mmrt_weight_format f)
{
    switch (f) {
    case MMRT_WEIGHTS_INT4: return 128;
    case MMRT_WEIGHTS_INT4_G64: return 64;
    case MMRT_WEIGHTS_INT4_G32: return 32;
    default: return 0;
    }
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

/* Codes, scale and zero point of one group for the clipping factor alpha; returns its
 * squared error. */
static double q4_group(const float *w, int64_t n, float lo, float hi, double alpha,
                       uint8_t *code, float *scale, float *zero)
{
    const double l = alpha * lo, h = alpha * hi;
    const float s = (float)((h - l) / 15.0);
    *scale = s;
    if (s == 0.0f) { /* all zero (the range always holds 0) */
        *zero = 0.0f;
        memset(code, 0, (size_t)n);
        return 0.0;
    }
    double z = round(-l / (double)s);
    z = z < 0 ? 0 : z > 15 ? 15 : z;
    *zero = (float)z;
    double err = 0;
    for (int64_t i = 0; i < n; i++) {
        double c = round((double)w[i] / (double)s) + z;
        c = c < 0 ? 0 : c > 15 ? 15 : c;
        code[i] = (uint8_t)c;
        const double d = (double)w[i] - (c - z) * (double)s;
        err += d * d;
    }
    return err;
}

bool mmrt_quant_q4_rows(const float *w, int64_t rows, int64_t k, int64_t group, uint8_t *codes,
                        float *scale, float *zero, int64_t *bad)
{
    const int64_t G = k / group;
    uint8_t best[4096], trial[4096]; /* one group's codes: groups are at most 4096 wide */
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * k;
        uint8_t *out = codes + r * (k / 2);
        memset(out, 0, (size_t)(k / 2));
        for (int64_t g = 0; g < G; g++) {
            const float *gw = row + g * group;
            float lo = 0.0f, hi = 0.0f;
            for (int64_t i = 0; i < group; i++) {
                if (!isfinite(gw[i])) {
                    *bad = r * k + g * group + i;
                    return false;
                }
                lo = gw[i] < lo ? gw[i] : lo;
                hi = gw[i] > hi ? gw[i] : hi;
            }
            float bs = 0, bz = 0;
            double berr = INFINITY;
            for (int step = 0; step < 10; step++) {
                float s, z;
                double e = q4_group(gw, group, lo, hi, 1.0 - 0.05 * step, trial, &s, &z);
                if (e < berr) {
                    berr = e;
                    bs = s;
                    bz = z;
                    memcpy(best, trial, (size_t)group);
                }
                if (e == 0.0)
                    break;
            }
            scale[r * G + g] = bs;
            zero[r * G + g] = bz;
            for (int64_t i = 0; i < group; i++) {
                const int64_t kk = g * group + i;
                uint8_t *byte = out + (kk / 32) * 16 + (kk % 16);
                *byte |= (kk % 32) < 16 ? best[i] : (uint8_t)(best[i] << 4);
            }
        }
    }
    return true;
}
