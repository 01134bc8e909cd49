/*
 * core/quant.c — weight quantization (see quant.h for the rules).
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#include "quant.h"
#include "quant_simd.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
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

#if defined(__x86_64__) || defined(_M_X64)
#define QUANT_AVX2 1 /* core/quant_avx2.c is built */
#else
#define QUANT_AVX2 0
#endif

/* Whether this call may use quant_avx2.c. */
static bool use_avx2(enum mmrt_quant_path path)
{
#if QUANT_AVX2
    return path == MMRT_QUANT_FAST && mmrt_quant_avx2_usable();
#else
    (void)path;
    return false;
#endif
}

bool mmrt_quant_i8_rows_on(enum mmrt_quant_path path, const float *w, int64_t rows, int64_t k,
                           int8_t *q, float *scale, int64_t *bad)
{
    const bool avx2 = use_avx2(path);
    (void)avx2;
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
#if QUANT_AVX2
        if (avx2) {
            mmrt_quant_avx2_i8_row(row, k, s, qr);
            continue;
        }
#endif
        for (int64_t i = 0; i < k; i++) {
            double v = round((double)row[i] / (double)s);
            qr[i] = (int8_t)(v > 127.0 ? 127 : v < -127.0 ? -127 : v);
        }
    }
    return true;
}

bool mmrt_quant_i8_rows(const float *w, int64_t rows, int64_t k, int8_t *q, float *scale,
                        int64_t *bad)
{
    return mmrt_quant_i8_rows_on(MMRT_QUANT_FAST, w, rows, k, q, scale, bad);
}

#define Q4_TRIALS MMRT_QUANT_Q4_TRIALS

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
 * zero point, each α's squared error summed in weight order, the first least error wins and
 * its codes go to code (one per byte). A trial whose scale is 0 (every weight 0, or a range
 * so small that α(hi − lo) / 15 underflows) counts as error 0 with codes and zero point 0,
 * and so do all later ones (their scales are smaller still). */
static void q4_group(const float *w, int64_t n, float lo, float hi, bool avx2, uint8_t *code,
                     float *scale, float *zero)
{
    (void)avx2; /* without quant_avx2.c */
    double s[Q4_TRIALS], z[Q4_TRIALS], err[Q4_TRIALS] = { 0 };
    int trials = 0; /* the trials with a scale: the first `trials` α */
    for (; trials < Q4_TRIALS; trials++) {
        const double alpha = 1.0 - 0.05 * trials, l = alpha * lo, h = alpha * hi;
        const float sf = (float)((h - l) / 15.0);
        if (sf == 0.0f)
            break;
        const double zt = round(-l / (double)sf);
        s[trials] = sf;
        z[trials] = zt <= 0 ? 0 : zt > 15 ? 15 : zt; /* −0 (lo = 0) too: zero points are +0 */
    }
#if QUANT_AVX2
    if (avx2 && trials == Q4_TRIALS)
        mmrt_quant_avx2_q4_errors(w, n, s, z, err);
    else
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
#if QUANT_AVX2
    if (avx2) {
        mmrt_quant_avx2_q4_codes(w, n, s[bt], z[bt], code);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        double e;
        code[i] = (uint8_t)q4_code(w[i], s[bt], z[bt], &e);
    }
}

/* The group's range, both ends starting at 0; false, with *bad its index, on a value that is
 * not finite. */
static bool q4_range(const float *w, int64_t n, bool avx2, float *lo, float *hi, int64_t *bad)
{
    (void)avx2;
    bool finite = false;
#if QUANT_AVX2
    if (avx2)
        mmrt_quant_avx2_range(w, n, lo, hi, &finite);
#endif
    if (finite)
        return true;
    float l = 0.0f, h = 0.0f; /* the plain loop, which also finds the first bad value */
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(w[i])) {
            *bad = i;
            return false;
        }
        l = w[i] < l ? w[i] : l;
        h = w[i] > h ? w[i] : h;
    }
    *lo = l;
    *hi = h;
    return true;
}

bool mmrt_quant_q4_rows_on(enum mmrt_quant_path path, const float *w, int64_t rows, int64_t k,
                           int64_t group, uint8_t *codes, float *scale, float *zero,
                           int64_t *bad)
{
    const bool avx2 = use_avx2(path);
    const int64_t G = k / group;
    uint8_t best[4096]; /* one group's codes: groups are at most 4096 wide */
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * k;
        uint8_t *out = codes + r * (k / 2);
        for (int64_t g = 0; g < G; g++) {
            const float *gw = row + g * group;
            float lo, hi;
            int64_t at;
            if (!q4_range(gw, group, avx2, &lo, &hi, &at)) {
                *bad = r * k + g * group + at;
                return false;
            }
            q4_group(gw, group, lo, hi, avx2, best, &scale[r * G + g], &zero[r * G + g]);
            /* plugin.h's layout: byte j of a block of 32 holds codes j and j + 16 */
            uint8_t *blk = out + g * group / 2;
            for (int64_t b = 0; b < group; b += 32)
                for (int j = 0; j < 16; j++)
                    blk[b / 2 + j] = (uint8_t)(best[b + j] | best[b + 16 + j] << 4);
        }
    }
    return true;
}

bool mmrt_quant_q4_rows(const float *w, int64_t rows, int64_t k, int64_t group, uint8_t *codes,
                        float *scale, float *zero, int64_t *bad)
{
    return mmrt_quant_q4_rows_on(MMRT_QUANT_FAST, w, rows, k, group, codes, scale, zero, bad);
}

/* ---- many rows at once ------------------------------------------------------------------ */

/* One thread's contiguous share of mmrt_quant_rows(_read): rows [r0, r0 + rows) of the
 * matrix, in memory (w) or read a slice at a time into a buffer of its own. */
struct quant_share {
    const float *w; /* the share's first row, or NULL: read */
    mmrt_quant_read_fn read;
    void *user;
    int64_t r0, rows, k, group;
    void *codes;
    float *scale, *zero;
    bool ok;
    int64_t bad; /* in the share's rows; −1: the read failed (err) */
    float bad_value;
    struct mmrt_error err;
};

/* Rows per slice read: about 4 MiB of floats, so the buffer stays in the caches' reach. */
static int64_t slice_rows(int64_t k)
{
    return k < (1 << 20) ? (1 << 20) / k + 1 : 1;
}

static bool quant_slice(struct quant_share *q, const float *w, int64_t r, int64_t n)
{
    const int64_t G = q->group ? q->k / q->group : 1, cb = q->group ? q->k / 2 : q->k;
    int64_t bad = 0;
    const bool ok =
        q->group ? mmrt_quant_q4_rows(w, n, q->k, q->group, (uint8_t *)q->codes + r * cb,
                                      q->scale + r * G, q->zero + r * G, &bad)
                 : mmrt_quant_i8_rows(w, n, q->k, (int8_t *)q->codes + r * cb,
                                      q->scale + r * G, &bad);
    if (!ok) {
        q->bad = r * q->k + bad;
        q->bad_value = w[bad];
    }
    return ok;
}

static void *quant_share_run(void *arg)
{
    struct quant_share *q = arg;
    if (q->w) {
        q->ok = quant_slice(q, q->w, 0, q->rows);
        return NULL;
    }
    const int64_t slice = slice_rows(q->k) < q->rows ? slice_rows(q->k) : q->rows;
    float *buf = malloc((size_t)(slice * q->k) * sizeof *buf + 1);
    if (!buf) {
        q->ok = false;
        q->bad = -1;
        mmrt_error_set(&q->err, MMRT_ERR_NO_MEMORY, "quantizing: out of memory for %lld rows",
                       (long long)slice);
        return NULL;
    }
    for (int64_t r = 0; q->ok && r < q->rows; r += slice) {
        const int64_t n = q->rows - r < slice ? q->rows - r : slice;
        if (q->read(q->user, q->r0 + r, n, buf, &q->err) != MMRT_OK) {
            q->ok = false;
            q->bad = -1;
        } else {
            q->ok = quant_slice(q, buf, r, n);
        }
    }
    free(buf);
    return NULL;
}

int mmrt_quant_threads(void)
{
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MMRT_QUANT_MAX_THREADS ? MMRT_QUANT_MAX_THREADS : (int)n;
}

/* Rows are independent, so each thread takes a contiguous run of them and writes only its
 * own outputs; the results are those of one call. A thread that cannot start leaves its
 * share to this one. The first share that failed has the first failure. */
static bool quant_shares(const float *w, mmrt_quant_read_fn read, void *user, int64_t rows,
                         int64_t k, int64_t group, void *codes, float *scale, float *zero,
                         int threads, int64_t *bad, float *bad_value, struct mmrt_error *err)
{
    threads = threads < 1 ? 1 : threads > MMRT_QUANT_MAX_THREADS ? MMRT_QUANT_MAX_THREADS
                                                                  : threads;
    if (threads > rows)
        threads = rows > 0 ? (int)rows : 1;
    const int64_t G = group ? k / group : 1, cb = group ? k / 2 : k;
    struct quant_share share[MMRT_QUANT_MAX_THREADS];
    pthread_t tid[MMRT_QUANT_MAX_THREADS];
    bool started[MMRT_QUANT_MAX_THREADS] = { false };
    for (int t = 0; t < threads; t++) {
        const int64_t r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
        share[t] = (struct quant_share){
            .w = w ? w + r0 * k : NULL, .read = read, .user = user, .r0 = r0,
            .rows = r1 - r0, .k = k, .group = group, .codes = (uint8_t *)codes + r0 * cb,
            .scale = scale + r0 * G, .zero = zero ? zero + r0 * G : NULL, .ok = true,
        };
        started[t] = t > 0 && pthread_create(&tid[t], NULL, quant_share_run, &share[t]) == 0;
    }
    for (int t = 0; t < threads; t++)
        if (!started[t])
            quant_share_run(&share[t]);
    for (int t = 0; t < threads; t++)
        if (started[t])
            pthread_join(tid[t], NULL);
    bool ok = true;
    for (int t = 0; ok && t < threads; t++)
        if (!share[t].ok) {
            ok = false;
            if (share[t].bad < 0) {
                *bad = -1;
                if (err)
                    *err = share[t].err;
            } else {
                *bad = share[t].r0 * k + share[t].bad;
                if (bad_value)
                    *bad_value = share[t].bad_value;
            }
        }
    return ok;
}

bool mmrt_quant_rows(const float *w, int64_t rows, int64_t k, int64_t group, void *codes,
                     float *scale, float *zero, int threads, int64_t *bad)
{
    return quant_shares(w, NULL, NULL, rows, k, group, codes, scale, zero, threads, bad, NULL,
                        NULL);
}

bool mmrt_quant_rows_read(mmrt_quant_read_fn read, void *user, int64_t rows, int64_t k,
                          int64_t group, void *codes, float *scale, float *zero, int threads,
                          int64_t *bad, float *bad_value, struct mmrt_error *err)
{
    return quant_shares(NULL, read, user, rows, k, group, codes, scale, zero, threads, bad,
                        bad_value, err);
}
