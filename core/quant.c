/*
 * core/quant.c — weight quantization (see quant.h for the rules).
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#include "quant.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

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

#if defined(__SSE2__)
#include <emmintrin.h>
#define QUANT_SSE2 1

/* round() — to nearest, ties away from zero — for two quotients, without a library call or
 * a branch: adding and subtracting 1.5·2^52 rounds x to the nearest integer, ties to even
 * (the default rounding mode; without -ffast-math both operations are kept); x − r is then
 * exact, and a tie that went towards zero moves one away. Only for |x| < 2^51: see `small`
 * in q4_group. SSE2 is part of every x86-64; elsewhere the scalar loop runs. */
static inline __m128d round_away2(__m128d x)
{
    const __m128d magic = _mm_set1_pd(0x1.8p52), zero = _mm_setzero_pd(),
                  one = _mm_set1_pd(1.0);
    const __m128d r = _mm_sub_pd(_mm_add_pd(x, magic), magic), d = _mm_sub_pd(x, r);
    const __m128d up = _mm_and_pd(_mm_cmpeq_pd(d, _mm_set1_pd(0.5)), _mm_cmpgt_pd(x, zero));
    const __m128d down = _mm_and_pd(_mm_cmpeq_pd(d, _mm_set1_pd(-0.5)), _mm_cmplt_pd(x, zero));
    return _mm_sub_pd(_mm_add_pd(r, _mm_and_pd(up, one)), _mm_and_pd(down, one));
}

/* Whole numbers c clamped to [0, 15]. */
static inline __m128d clamp15_2(__m128d c)
{
    const __m128d fifteen = _mm_set1_pd(15.0);
    const __m128d neg = _mm_cmplt_pd(c, _mm_setzero_pd()), big = _mm_cmpgt_pd(c, fifteen);
    return _mm_or_pd(_mm_andnot_pd(_mm_or_pd(neg, big), c), _mm_and_pd(big, fifteen));
}
#endif

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
        int64_t i = 0;
#if QUANT_SSE2
        /* Two at a time with round_away2: |w / s| stays near 127 (a few times more when s
         * is subnormal), far inside its 2^51; the same bits as the loop below. */
        const __m128d sv = _mm_set1_pd(s), lim = _mm_set1_pd(127.0);
        for (; i + 2 <= k; i += 2) {
            const __m128d v = round_away2(_mm_div_pd(_mm_set_pd(row[i + 1], row[i]), sv));
            const __m128i c = _mm_cvttpd_epi32(_mm_max_pd(_mm_min_pd(v, lim), _mm_set1_pd(-127.0)));
            qr[i] = (int8_t)_mm_cvtsi128_si32(c);
            qr[i + 1] = (int8_t)_mm_cvtsi128_si32(_mm_srli_si128(c, 4));
        }
#endif
        for (; i < k; i++) {
            double v = round((double)row[i] / (double)s);
            qr[i] = (int8_t)(v > 127.0 ? 127 : v < -127.0 ? -127 : v);
        }
    }
    return true;
}

#define Q4_TRIALS 10 /* α = 1, 0.95, …, 0.55 */

/* The code of w for scale s and zero point z, and its squared error, as quant.h defines
 * them. */
static inline double q4_code(double w, double s, double z, double *err)
{
    double c = round(w / s) + z;
    c = c < 0 ? 0 : c > 15 ? 15 : c;
    const double d = w - (c - z) * s;
    *err = d * d;
    return c;
}

/* One group of n weights in [lo, hi] (lo ≤ 0 ≤ hi), quant.h's search: every α's scale and
 * zero point, then one pass over the weights that sums all the trials' squared errors side by
 * side, each in weight order as one trial at a time would. The first least error wins; its
 * codes go to code (one per byte). A trial whose scale is 0 (every weight 0, or a range so
 * small that α(hi − lo) / 15 underflows) counts as error 0 with codes and zero point 0, and
 * so do all later ones (their scales are smaller still). */
static void q4_group(const float *w, int64_t n, float lo, float hi, uint8_t *code,
                     float *scale, float *zero)
{
    double s[Q4_TRIALS], z[Q4_TRIALS], err[Q4_TRIALS];
    int trials = 0; /* the trials with a scale: the first `trials` α */
    for (; trials < Q4_TRIALS; trials++) {
        const double alpha = 1.0 - 0.05 * trials, l = alpha * lo, h = alpha * hi;
        const float sf = (float)((h - l) / 15.0);
        if (sf == 0.0f)
            break;
        const double zt = round(-l / (double)sf);
        s[trials] = sf;
        z[trials] = zt < 0 ? 0 : zt > 15 ? 15 : zt;
        err[trials] = 0.0;
    }
    /* round_away2 needs |w / s| < 2^51. A finite group's quotients stay within 15 / α of 0
     * (a few times more when the scale is subnormal), but the check costs nothing; groups
     * that fail it, and those with a scale-0 trial, take the scalar loop with round(). */
    const double amax = -lo > hi ? -(double)lo : (double)hi;
    const bool small = trials > 0 && amax / s[trials - 1] < 0x1p30;
#if QUANT_SSE2
    if (trials == Q4_TRIALS && small) {
        /* The trials side by side, two to a vector; each lane's operations are the scalar
         * loop's, in its order, so the sums are bit for bit the same. */
        __m128d sv[Q4_TRIALS / 2], zv[Q4_TRIALS / 2], ev[Q4_TRIALS / 2];
        for (int t = 0; t < Q4_TRIALS / 2; t++) {
            sv[t] = _mm_set_pd(s[2 * t + 1], s[2 * t]);
            zv[t] = _mm_set_pd(z[2 * t + 1], z[2 * t]);
            ev[t] = _mm_setzero_pd();
        }
        for (int64_t i = 0; i < n; i++) {
            const __m128d wi = _mm_set1_pd(w[i]);
            for (int t = 0; t < Q4_TRIALS / 2; t++) {
                const __m128d c =
                    clamp15_2(_mm_add_pd(round_away2(_mm_div_pd(wi, sv[t])), zv[t]));
                const __m128d d = _mm_sub_pd(wi, _mm_mul_pd(_mm_sub_pd(c, zv[t]), sv[t]));
                ev[t] = _mm_add_pd(ev[t], _mm_mul_pd(d, d));
            }
        }
        for (int t = 0; t < Q4_TRIALS / 2; t++) {
            _mm_storel_pd(&err[2 * t], ev[t]);
            _mm_storeh_pd(&err[2 * t + 1], ev[t]);
        }
    } else
#endif
    {
        for (int t = 0; t < trials; t++)
            for (int64_t i = 0; i < n; i++) {
                double e;
                (void)q4_code(w[i], s[t], z[t], &e);
                err[t] += e;
            }
    }
    int bt = -1; /* -1: the scale-0 trial */
    double berr = trials < Q4_TRIALS ? 0.0 : INFINITY;
    for (int t = trials - 1; t >= 0; t--) /* backwards, so the first of equals wins */
        if (err[t] <= berr) {
            berr = err[t];
            bt = t;
        }
    if (bt < 0) {
        *scale = 0.0f;
        *zero = 0.0f;
        for (int64_t i = 0; i < n; i++)
            code[i] = 0;
        return;
    }
    *scale = (float)s[bt];
    *zero = (float)z[bt];
    int64_t i = 0;
#if QUANT_SSE2
    if (small) { /* two weights at a time, as above */
        const __m128d sb = _mm_set1_pd(s[bt]), zb = _mm_set1_pd(z[bt]);
        for (; i + 2 <= n; i += 2) {
            const __m128d c = clamp15_2(
                _mm_add_pd(round_away2(_mm_div_pd(_mm_set_pd(w[i + 1], w[i]), sb)), zb));
            double cc[2];
            _mm_storeu_pd(cc, c);
            code[i] = (uint8_t)cc[0];
            code[i + 1] = (uint8_t)cc[1];
        }
    }
#endif
    for (; i < n; i++) {
        double e;
        code[i] = (uint8_t)q4_code(w[i], s[bt], z[bt], &e);
    }
}

bool mmrt_quant_q4_rows(const float *w, int64_t rows, int64_t k, int64_t group, uint8_t *codes,
                        float *scale, float *zero, int64_t *bad)
{
    const int64_t G = k / group;
    uint8_t best[4096]; /* one group's codes: groups are at most 4096 wide */
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
            q4_group(gw, group, lo, hi, best, &scale[r * G + g], &zero[r * G + g]);
            for (int64_t i = 0; i < group; i++) {
                const int64_t kk = g * group + i;
                uint8_t *byte = out + (kk / 32) * 16 + (kk % 16);
                *byte |= (kk % 32) < 16 ? best[i] : (uint8_t)(best[i] << 4);
            }
        }
    }
    return true;
}

/* ---- many rows at once ------------------------------------------------------------------ */

/* One thread's contiguous share of mmrt_quant_rows. */
struct quant_share {
    const float *w;
    int64_t rows, k, group;
    void *codes;
    float *scale, *zero;
    bool ok;
    int64_t bad;
};

static void *quant_share_run(void *arg)
{
    struct quant_share *q = arg;
    q->ok = q->group ? mmrt_quant_q4_rows(q->w, q->rows, q->k, q->group, q->codes, q->scale,
                                          q->zero, &q->bad)
                     : mmrt_quant_i8_rows(q->w, q->rows, q->k, q->codes, q->scale, &q->bad);
    return NULL;
}

int mmrt_quant_threads(void)
{
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MMRT_QUANT_MAX_THREADS ? MMRT_QUANT_MAX_THREADS : (int)n;
}

bool mmrt_quant_rows(const float *w, int64_t rows, int64_t k, int64_t group, void *codes,
                     float *scale, float *zero, int threads, int64_t *bad)
{
    /* Rows are independent, so each thread takes a contiguous run of them and writes only
     * its own outputs; the results are those of one call. A thread that cannot start leaves
     * its share to this one. */
    threads = threads < 1 ? 1 : threads > MMRT_QUANT_MAX_THREADS ? MMRT_QUANT_MAX_THREADS
                                                                  : threads;
    if (threads > rows)
        threads = rows > 0 ? (int)rows : 1;
    const int64_t G = group ? k / group : 1, code_bytes = group ? k / 2 : k;
    struct quant_share share[MMRT_QUANT_MAX_THREADS];
    pthread_t tid[MMRT_QUANT_MAX_THREADS];
    bool started[MMRT_QUANT_MAX_THREADS] = { false };
    for (int t = 0; t < threads; t++) {
        const int64_t r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
        share[t] = (struct quant_share){
            .w = w + r0 * k, .rows = r1 - r0, .k = k, .group = group,
            .codes = (uint8_t *)codes + r0 * code_bytes, .scale = scale + r0 * G,
            .zero = zero ? zero + r0 * G : NULL, .ok = true, .bad = 0,
        };
        started[t] = t > 0 && pthread_create(&tid[t], NULL, quant_share_run, &share[t]) == 0;
    }
    for (int t = 0; t < threads; t++)
        if (!started[t])
            quant_share_run(&share[t]);
    for (int t = 0; t < threads; t++)
        if (started[t])
            pthread_join(tid[t], NULL);
    for (int t = 0; t < threads; t++) /* the first share with a bad value has the first one */
        if (!share[t].ok) {
            *bad = rows * t / threads * k + share[t].bad;
            return false;
        }
    return true;
}
