/*
 * tests/test_quant.c — quantized weights end to end: the quantizer's rules (core/quant.h),
 * [model] weights = int8 on every model type against the same checkpoint as stored, and the
 * checkpoints it must refuse.
 *
 * Accuracy is measured the way docs/QUANTIZATION.md reports it: for every case of the four
 * fixtures, the next-token distributions of the INT8 run against those of the run as stored,
 * step by step while the two greedy continuations agree (a step after they part would compare
 * different contexts): top-1 agreement over those steps and the mean KL(stored ‖ int8).
 * The mean KL is held to the bound docs/QUANTIZATION.md sets for INT8 (≤ 0.005). Top-1 is
 * held to 95 % here, not the 99 % the docs set for a trained model: these are random-weight
 * models with hidden size 32, whose best two logits are often within 0.1 of each other (the
 * test prints the largest margin that flipped), so a near tie flips on an error far below
 * what KL shows; the 99 % bound is the demo model's (a trained distribution). The figures
 * are printed for the docs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "golden.h"
#include "quant.h"

/* ---- the quantizer ---------------------------------------------------------------------- */

static void test_quant_rules(void **state)
{
    (void)state;
    /* Row 0: max 127 → scale 1, codes exact; ties round away from zero. Row 1: all zero.
     * Row 2: max |−2.54| → scale 0.02; −2.54 → −127 and 2.53 → 127 (126.5 rounds up). */
    const float w[3][4] = { { 127.0f, -0.5f, 0.5f, 1.5f },
                            { 0.0f, 0.0f, 0.0f, 0.0f },
                            { -2.54f, 2.53f, 0.01f, -0.03f } };
    int8_t q[12];
    float s[3];
    int64_t bad = -1;
    assert_true(mmrt_quant_i8_rows(&w[0][0], 3, 4, q, s, &bad));
    assert_true(s[0] == 1.0f);
    assert_int_equal(q[0], 127);
    assert_int_equal(q[1], -1);
    assert_int_equal(q[2], 1);
    assert_int_equal(q[3], 2);
    assert_true(s[1] == 0.0f);
    for (int i = 4; i < 8; i++)
        assert_int_equal(q[i], 0);
    assert_true(fabsf(s[2] - 0.02f) < 1e-9f);
    assert_int_equal(q[8], -127);
    assert_int_equal(q[9], 127);
    assert_int_equal(q[10], 1);
    assert_int_equal(q[11], -2);
    /* Every weight within half a step of its code, over random rows of every magnitude. */
    enum { R = 64, K = 200 };
    static float rw[R * K];
    static int8_t rq[R * K];
    float rs[R];
    uint64_t x = 7;
    for (int i = 0; i < R * K; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        rw[i] = ldexpf((float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1), -(i / K % 40));
    }
    assert_true(mmrt_quant_i8_rows(rw, R, K, rq, rs, &bad));
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            double e = fabs((double)rq[r * K + k] * rs[r] - rw[r * K + k]);
            if (!(e <= 0.5000001 * rs[r]))
                fail_msg("row %d col %d: %.9g quantized to %d × %.9g", r, k,
                         (double)rw[r * K + k], rq[r * K + k], (double)rs[r]);
        }
    /* A non-finite value is refused at its index. */
    float nan_row[5] = { 1, 2, 3, NAN, 5 };
    assert_false(mmrt_quant_i8_rows(nan_row, 1, 5, q, s, &bad));
    assert_int_equal(bad, 3);
    float inf_rows[2][2] = { { 1, 2 }, { -INFINITY, 0 } };
    assert_false(mmrt_quant_i8_rows(&inf_rows[0][0], 2, 2, q, s, &bad));
    assert_int_equal(bad, 2);
}

/* INT4: a group's range holds 0, so a constant group and zeros are exact; every weight lies
 * within half a step of its code unless the chosen clipping cut it, and the clipping never
 * makes a group's squared error worse than the full range would. */
static void test_quant_q4_rules(void **state)
{
    (void)state;
    enum { R = 9, K = 128, GS = 32, G = K / GS };
    static float w[R * K];
    uint64_t x = 11;
    for (int i = 0; i < R * K; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1) * (float)(1 + i / K);
    }
    for (int k = 0; k < GS; k++) {
        w[0 * K + k] = 0.75f;  /* constant group */
        w[1 * K + k] = 0.0f;   /* zero group */
        w[2 * K + k] = -3.0f;  /* negative constant */
    }
    w[3 * K + 7] = 40.0f; /* an outlier the clipping may cut */
    static uint8_t q[R * K / 2];
    float sc[R * G], zp[R * G];
    int64_t bad;
    assert_true(mmrt_quant_q4_rows(w, R, K, GS, q, sc, zp, &bad));
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) {
            double err = 0, full = 0;
            float lo = 0, hi = 0;
            for (int k = g * GS; k < (g + 1) * GS; k++) {
                lo = fminf(lo, w[r * K + k]);
                hi = fmaxf(hi, w[r * K + k]);
            }
            const double fs = (hi - lo) / 15.0;
            const double fz = fs > 0 ? fmin(15, fmax(0, round(-lo / fs))) : 0;
            for (int k = g * GS; k < (g + 1) * GS; k++) {
                const unsigned c = mmrt_q4_code(q + r * (K / 2), k);
                const double v = ((double)c - zp[r * G + g]) * sc[r * G + g];
                err += (v - w[r * K + k]) * (v - w[r * K + k]);
                double fc = fs > 0 ? fmin(15, fmax(0, round(w[r * K + k] / fs) + fz)) : 0;
                double fv = (fc - fz) * fs;
                full += (fv - w[r * K + k]) * (fv - w[r * K + k]);
            }
            if (!(err <= full * (1 + 1e-6) + 1e-12 * GS * (double)(hi - lo) * (hi - lo)))
                fail_msg("row %d group %d: error %.3g worse than the full range's %.3g", r, g,
                         err, full);
            assert_true(zp[r * G + g] == floorf(zp[r * G + g]) && zp[r * G + g] >= 0 &&
                        zp[r * G + g] <= 15);
        }
    for (int k = 0; k < GS; k++) {
        const unsigned c0 = mmrt_q4_code(q, k), c2 = mmrt_q4_code(q + 2 * (K / 2), k);
        assert_true(((float)c0 - zp[0]) * sc[0] == 0.75f);
        assert_true(sc[G] == 0.0f && mmrt_q4_code(q + K / 2, k) == 0);
        assert_true(((float)c2 - zp[2 * G]) * sc[2 * G] == -3.0f);
    }
    float nan_w[64] = { 0 };
    nan_w[40] = NAN;
    assert_false(mmrt_quant_q4_rows(nan_w, 1, 64, 32, q, sc, zp, &bad));
    assert_int_equal(bad, 40);
}

/* ---- INT8 against the checkpoint as stored ---------------------------------------------- */

static struct mmrt_runtime *open_with(const char *dir, enum mmrt_weight_format f)
{
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .weights = f };
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s (%s): %s", dir, mmrt_weight_format_name(f), err);
    return rt;
}

static double softmax_kl(const float *p_logits, const float *q_logits, int64_t n)
{
    double pm = -INFINITY, qm = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        pm = fmax(pm, p_logits[i]);
        qm = fmax(qm, q_logits[i]);
    }
    double ps = 0, qs = 0;
    for (int64_t i = 0; i < n; i++) {
        ps += exp(p_logits[i] - pm);
        qs += exp(q_logits[i] - qm);
    }
    double kl = 0;
    for (int64_t i = 0; i < n; i++) {
        double lp = p_logits[i] - pm - log(ps), lq = q_logits[i] - qm - log(qs);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

static int64_t argmax(const float *v, int64_t n)
{
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

struct agreement {
    int steps, agree;
    double kl_sum, kl_max;
    double flip_margin; /* the largest top-1 − top-2 logit margin (stored run) that flipped */
};

/* The stored run's margin between its best logit and the INT8 run's choice. */
static double margin(const float *ref, int64_t n, int64_t other)
{
    return (double)ref[argmax(ref, n)] - (double)ref[other];
}

static uint64_t weight_bytes(struct mmrt_runtime *rt)
{
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    return mr.weight_bytes;
}

static void compare_fixture(const char *fixture, enum mmrt_weight_format fmt,
                            struct agreement *a)
{
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, fixture);
    struct mmrt_runtime *ref = open_with(dir, MMRT_WEIGHTS_CHECKPOINT);
    struct mmrt_runtime *q8 = open_with(dir, fmt);
    const uint64_t b_ref = weight_bytes(ref), b_q8 = weight_bytes(q8);
    struct golden_cases cases;
    golden_cases_load(fixture, &cases);
    struct agreement f = { 0 };
    for (int c = 0; c < cases.n; c++) {
        struct golden_capture cr = { 0 }, cq = { 0 };
        struct mmrt_result rr = { 0 }, rq = { 0 };
        golden_run(ref, &cases.req[c], &cr, &rr);
        golden_run(q8, &cases.req[c], &cq, &rq);
        assert_int_equal(cr.vocab, cq.vocab);
        for (int s = 0; s < GOLDEN_MAX_STEPS && cr.logits[s] && cq.logits[s]; s++) {
            const bool same = argmax(cr.logits[s], cr.vocab) == argmax(cq.logits[s], cq.vocab);
            const double kl = softmax_kl(cr.logits[s], cq.logits[s], cr.vocab);
            f.steps++;
            f.agree += same;
            f.kl_sum += kl;
            f.kl_max = fmax(f.kl_max, kl);
            if (!same)
                f.flip_margin = fmax(f.flip_margin, margin(cr.logits[s], cr.vocab,
                                                           argmax(cq.logits[s], cq.vocab)));
            if (!same || s >= cr.n_tokens || s >= cq.n_tokens || cr.tokens[s] != cq.tokens[s])
                break; /* the continuations part here: later contexts differ */
        }
        golden_capture_free(&cr);
        golden_capture_free(&cq);
    }
    json_decref(cases.json);
    print_message("%-16s %s: %d/%d steps top-1 agree (flips at margins ≤ %.2g), mean KL "
                  "%.2e (max %.2e); weights %llu → %llu bytes (%.3f×)\n",
                  fixture, mmrt_weight_format_name(fmt), f.agree, f.steps, f.flip_margin,
                  f.kl_sum / f.steps, f.kl_max,
                  (unsigned long long)b_ref, (unsigned long long)b_q8,
                  (double)b_q8 / (double)b_ref);
    /* The matrices shrink to a byte per element; what stays (embeddings, norms, biases and
     * the per-row scales) keeps the total above a quarter of F32, under the stored size. */
    assert_true(b_q8 < b_ref);
    a->steps += f.steps;
    a->agree += f.agree;
    a->kl_sum += f.kl_sum;
    a->kl_max = fmax(a->kl_max, f.kl_max);
    a->flip_margin = fmax(a->flip_margin, f.flip_margin);
    mmrt_destroy(ref);
    mmrt_destroy(q8);
}

static const char *const fixtures[] = { "llava-tiny", "llava-tiny-bf16", "llava-next-tiny",
                                        "qwen2vl-tiny", "fuyu-tiny" };

static void check_format(enum mmrt_weight_format fmt, double min_top1, double max_kl)
{
    struct agreement a = { 0 };
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        compare_fixture(fixtures[i], fmt, &a);
    const double top1 = (double)a.agree / a.steps, kl = a.kl_sum / a.steps;
    print_message("all fixtures %s: top-1 agreement %.4f over %d steps, mean KL %.2e\n",
                  mmrt_weight_format_name(fmt), top1, a.steps, kl);
    if (!(top1 >= min_top1) || !(kl <= max_kl))
        fail_msg("%s: top-1 agreement %.4f (want ≥ %.2f), mean KL %.3g (want ≤ %.3g)",
                 mmrt_weight_format_name(fmt), top1, min_top1, kl, max_kl);
}

/* quant.h's INT4 rule for one group, written out plainly: one α at a time, round() from
 * the library, the first least squared error, a scale that rounds to 0 meaning codes and
 * zero point 0 with error 0. quant.c computes the same thing with all α side by side in
 * vectors and its own rounding; this pins it to the definition bit for bit. */
static void q4_group_by_definition(const float *w, int n, uint8_t *code, float *scale,
                                   float *zero)
{
    float lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
    }
    double best = INFINITY;
    for (int step = 0; step < 10; step++) {
        const double alpha = 1.0 - 0.05 * step, l = alpha * lo, h = alpha * hi;
        const float s = (float)((h - l) / 15.0);
        double err = 0, z = 0;
        if (s != 0.0f) {
            z = fmin(15, fmax(0, round(-l / (double)s)));
            for (int i = 0; i < n; i++) {
                const double c = fmin(15, fmax(0, round((double)w[i] / (double)s) + z));
                const double d = (double)w[i] - (c - z) * (double)s;
                err += d * d;
            }
        }
        if (err < best) {
            best = err;
            *scale = s;
            *zero = (float)z;
            for (int i = 0; i < n; i++)
                code[i] = s == 0.0f ? 0
                                    : (uint8_t)fmin(15, fmax(0, round((double)w[i] / s) + z));
        }
        if (err == 0)
            break;
    }
}

static void test_quant_q4_definition(void **state)
{
    (void)state;
    enum { K = 256 };
    static float w[K];
    uint64_t x = 5;
    for (int kind = 0; kind < 11; kind++)
        for (int gs = 32; gs <= K; gs *= 2)
            for (int rep = 0; rep < 40; rep++) {
                for (int i = 0; i < K; i++) {
                    x = x * 6364136223846793005ull + 1442695040888963407ull;
                    const double u = (double)(x >> 11) / 9007199254740992.0 - 0.5;
                    switch (kind) {
                    case 0: w[i] = (float)(u * 0.05); break;
                    case 1: w[i] = (float)(u * 1e-40); break; /* subnormal ranges */
                    case 2: w[i] = i % 7 ? (float)(u * 3) : 0.0f; break;
                    case 3: w[i] = (float)((int)(u * 31)) * 0.5f; break; /* halves: below */
                    case 4: w[i] = (i / 32) % 3 ? (float)(u * 1e30) : 0.0f; break;
                    case 5: w[i] = u > 0 ? (float)(u * 1e-44) : (float)u; break;
                    case 6: w[i] = (float)(u * 2e-44); break; /* scales underflow to 0 */
                    case 7: w[i] = (float)((int)(u * 16)) * 0.0123f; break; /* on a grid */
                    case 8: w[i] = (float)fabs(u); break; /* lo = 0: the zero point's sign */
                    case 9: w[i] = (float)-fabs(u * 0.1); break; /* hi = 0 */
                    default: w[i] = i == 3 ? 40.0f : (float)u; break; /* an outlier */
                    }
                }
                /* Halves in [−7.5, 7.5]: at α = 1 the scale is 1 and every weight a tie,
                 * which round() sends away from zero and an even rounding would not. */
                for (int g = 0; kind == 3 && g < K / gs; g++) {
                    w[g * gs] = -7.5f;
                    w[g * gs + 1] = 7.5f;
                }
                /* Both paths, each against the definition. */
                for (int path = 0; path < 2; path++) {
                    uint8_t q[K / 2], ref[K];
                    float sc[K / 32], zp[K / 32], rs, rz;
                    int64_t bad;
                    assert_true(mmrt_quant_q4_rows_on(path ? MMRT_QUANT_PLAIN : MMRT_QUANT_FAST,
                                                      w, 1, K, gs, q, sc, zp, &bad));
                    for (int g = 0; g < K / gs; g++) {
                        q4_group_by_definition(w + g * gs, gs, ref, &rs, &rz);
                        if (memcmp(&rs, &sc[g], sizeof rs) || memcmp(&rz, &zp[g], sizeof rz))
                            fail_msg("path %d kind %d group %d of %d: scale %a zero %g, by "
                                     "definition %a %g", path, kind, g, gs, (double)sc[g],
                                     (double)zp[g], (double)rs, (double)rz);
                        for (int i = 0; i < gs; i++)
                            if (mmrt_q4_code(q, g * gs + i) != ref[i])
                                fail_msg("path %d kind %d group %d of %d: code %d is %u, by "
                                         "definition %u", path, kind, g, gs, i,
                                         mmrt_q4_code(q, g * gs + i), ref[i]);
                    }
                }
            }
}

/* quant.h's INT8 rule written out plainly (round() from the library), against quant.c's
 * vector loop, bit for bit: rows whose scale is a power of two, so that half of the weights
 * are ties, subnormal rows, and rows with an outlier. */
static void test_quant_i8_definition(void **state)
{
    (void)state;
    enum { R = 6, K = 203 };
    static float w[R * K];
    uint64_t x = 3;
    for (int rep = 0; rep < 100; rep++) {
        const enum mmrt_quant_path path = rep % 2 ? MMRT_QUANT_PLAIN : MMRT_QUANT_FAST;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < K; i++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                const double u = (double)(x >> 11) / 9007199254740992.0 - 0.5;
                float *v = &w[r * K + i];
                switch (r) {
                case 0: *v = (float)((int)(u * 254)) * 0.5f * 0x1p-7f; break; /* ties */
                case 1: *v = (float)(u * 1e-42); break;
                case 2: *v = i == 5 ? 300.0f : (float)u; break;
                default: *v = (float)(u * (r * 3.0)); break;
                }
            }
        w[0] = 127.0f * 0x1p-7f; /* row 0's scale: exactly 2^-7 */
        int8_t q[R * K];
        float sc[R];
        int64_t bad;
        assert_true(mmrt_quant_i8_rows_on(path, w, R, K, q, sc, &bad));
        for (int r = 0; r < R; r++) {
            float amax = 0;
            for (int i = 0; i < K; i++)
                amax = fmaxf(amax, fabsf(w[r * K + i]));
            const float s = (float)((double)amax / 127.0);
            assert_memory_equal(&s, &sc[r], sizeof s);
            for (int i = 0; i < K; i++) {
                const double v = s == 0.0f ? 0 : round((double)w[r * K + i] / (double)s);
                const int want = (int)fmin(127, fmax(-127, v));
                if (q[r * K + i] != want)
                    fail_msg("path %d row %d weight %d (%a): code %d, by definition %d",
                             (int)path, r, i, (double)w[r * K + i], q[r * K + i], want);
            }
        }
    }
}

/* mmrt_quant_rows over any number of threads gives one call's outputs, and the first bad
 * value in row-major order when a later thread's share holds one too. */
static void test_quant_rows_threads(void **state)
{
    (void)state;
    enum { R = 37, K = 96 };
    static float w[R * K];
    uint64_t x = 9;
    for (int i = 0; i < R * K; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + i % 5);
    }
    for (int group = 0; group <= 32; group += 32) {
        const int G = group ? K / group : 1, cb = group ? K / 2 : K;
        static uint8_t c1[R * K], c2[R * K];
        float s1[R * K / 32], s2[R * K / 32], z1[R * K / 32], z2[R * K / 32];
        int64_t bad1 = -1, bad2 = -1;
        assert_true(group ? mmrt_quant_q4_rows(w, R, K, group, c1, s1, z1, &bad1)
                          : mmrt_quant_i8_rows(w, R, K, (int8_t *)c1, s1, &bad1));
        for (int threads = 0; threads <= 40; threads += threads < 6 ? 1 : 17) {
            memset(c2, 0xAB, sizeof c2);
            assert_true(mmrt_quant_rows(w, R, K, group, c2, s2, group ? z2 : NULL, threads,
                                        &bad2));
            assert_memory_equal(c1, c2, (size_t)(R * cb));
            assert_memory_equal(s1, s2, (size_t)(R * G) * sizeof(float));
            if (group)
                assert_memory_equal(z1, z2, (size_t)(R * G) * sizeof(float));
        }
        w[20 * K + 5] = NAN; /* in a middle share */
        w[33 * K + 1] = INFINITY; /* and in a later one */
        for (int threads = 1; threads <= 5; threads++) {
            assert_false(mmrt_quant_rows(w, R, K, group, c2, s2, group ? z2 : NULL, threads,
                                         &bad2));
            assert_int_equal(bad2, 20 * K + 5);
        }
        w[20 * K + 5] = 0.25f;
        w[33 * K + 1] = -0.25f;
    }
    assert_true(mmrt_quant_threads() >= 1 && mmrt_quant_threads() <= MMRT_QUANT_MAX_THREADS);
}

/* A matrix read through mmrt_quant_rows_read: rows from `w`, counted, failing from row
 * `fail_at` on (−1: never). */
struct row_reader {
    const float *w;
    int64_t k, fail_at;
};

static mmrt_status read_rows(void *user, int64_t r0, int64_t n, float *dst,
                             struct mmrt_error *err)
{
    const struct row_reader *rd = user;
    if (rd->fail_at >= 0 && r0 + n > rd->fail_at)
        return mmrt_error_set(err, MMRT_ERR_IO, "cannot read rows %lld..%lld", (long long)r0,
                              (long long)(r0 + n));
    memcpy(dst, rd->w + r0 * rd->k, (size_t)(n * rd->k) * sizeof *dst);
    return MMRT_OK;
}

/* Reading the rows a slice at a time in each thread gives mmrt_quant_rows's outputs; a read
 * that fails, and a non-finite weight, are reported as the earliest rows' failure. */
static void test_quant_rows_read(void **state)
{
    (void)state;
    enum { R = 600, K = 4096 }; /* several slices of rows per thread */
    float *w = malloc(sizeof(float) * R * K);
    uint8_t *c1 = malloc(R * K), *c2 = malloc(R * K);
    float *s1 = malloc(sizeof(float) * R * K / 32), *s2 = malloc(sizeof(float) * R * K / 32);
    float *z1 = malloc(sizeof(float) * R * K / 32), *z2 = malloc(sizeof(float) * R * K / 32);
    assert_non_null(w && c1 && c2 && s1 && s2 && z1 && z2);
    uint64_t x = 11;
    for (int64_t i = 0; i < (int64_t)R * K; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.03f;
    }
    struct row_reader rd = { .w = w, .k = K, .fail_at = -1 };
    for (int group = 0; group <= 128; group += 128) {
        const int64_t G = group ? K / group : 1, cb = group ? K / 2 : K;
        int64_t bad = 0;
        float bad_value = 0;
        struct mmrt_error err = { 0 };
        assert_true(mmrt_quant_rows(w, R, K, group, c1, s1, group ? z1 : NULL, 1, &bad));
        for (int threads = 1; threads <= 3; threads++) {
            memset(c2, 0xAB, (size_t)(R * cb));
            rd.fail_at = -1;
            assert_true(mmrt_quant_rows_read(read_rows, &rd, R, K, group, c2, s2,
                                             group ? z2 : NULL, threads, &bad, &bad_value,
                                             &err));
            assert_memory_equal(c1, c2, (size_t)(R * cb));
            assert_memory_equal(s1, s2, (size_t)(R * G) * sizeof(float));
            if (group)
                assert_memory_equal(z1, z2, (size_t)(R * G) * sizeof(float));
            /* a read failing in the last thread's rows, after a weight that is not finite
             * in the first thread's: the weight is the earlier failure */
            rd.fail_at = R - 5;
            const float keep = w[3 * K + 7];
            w[3 * K + 7] = -INFINITY;
            assert_false(mmrt_quant_rows_read(read_rows, &rd, R, K, group, c2, s2,
                                              group ? z2 : NULL, threads, &bad, &bad_value,
                                              &err));
            assert_int_equal(bad, 3 * K + 7);
            assert_true(isinf(bad_value) && bad_value < 0);
            w[3 * K + 7] = keep;
            /* now the read is the only failure */
            err = (struct mmrt_error){ 0 };
            assert_false(mmrt_quant_rows_read(read_rows, &rd, R, K, group, c2, s2,
                                              group ? z2 : NULL, threads, &bad, &bad_value,
                                              &err));
            assert_int_equal(bad, -1);
            assert_int_equal(err.status, MMRT_ERR_IO);
            assert_non_null(strstr(err.msg, "cannot read rows"));
        }
    }
    free(w);
    free(c1);
    free(c2);
    free(s1);
    free(s2);
    free(z1);
    free(z2);
}

static void test_int8_matches_checkpoint(void **state)
{
    (void)state;
    check_format(MMRT_WEIGHTS_INT8, 0.95, 0.005);
}

/* ---- INT4: exactly the quantizer's weights, end to end ------------------------------------
 * On hidden-32 random models 4-bit noise does not average out (each weight is off by about
 * 7 % of its group's spread), so their distance from the stored model says little (it is
 * printed for docs/QUANTIZATION.md: top-1 0.50 and mean KL 0.11 at groups of 32, the same
 * ratio to INT8's KL as the squared steps). What the test holds instead is that the INT4
 * runtime computes exactly with the weights the quantizer made: a copy of the checkpoint
 * whose matrices are replaced by their dequantized INT4 values, run as stored, must give the
 * INT4 run's logits to 1e-4 and its tokens. */

/* golden_scratch/model.safetensors opened for writing: its header as JSON, *fd, and *data0 the
 * file offset of the data section (tensor offsets count from there). */
static json_t *scratch_header(int *fd, uint64_t *data0)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    *fd = open(path, O_RDWR);
    assert_true(*fd >= 0);
    uint8_t len8[8];
    assert_int_equal(pread(*fd, len8, 8, 0), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    char *hdr = calloc(1, (size_t)hlen + 1);
    assert_non_null(hdr);
    assert_int_equal(pread(*fd, hdr, (size_t)hlen, 8), (ssize_t)hlen);
    json_error_t je;
    json_t *h = json_loads(hdr, 0, &je);
    free(hdr);
    assert_non_null(h);
    *data0 = 8 + hlen;
    return h;
}

/* The matrices the loader quantizes in a LLaVA checkpoint: 2-D weights other than the token
 * and position embeddings. */
static bool quantized_name(const char *name, const json_t *t)
{
    const size_t n = strlen(name);
    return json_array_size(json_object_get(t, "shape")) == 2 && n > 7 &&
           strcmp(name + n - 7, ".weight") == 0 && !strstr(name, "embed_tokens") &&
           !strstr(name, "position_embedding");
}

/* Rewrites every matrix of golden_scratch/model.safetensors (F32) as its INT4 values. */
static void dequantize_scratch(int64_t group)
{
    uint64_t data0;
    int fd;
    json_t *h = scratch_header(&fd, &data0);
    const char *name;
    json_t *t;
    int n_done = 0;
    json_object_foreach(h, name, t) {
        if (strcmp(name, "__metadata__") == 0 || !quantized_name(name, t))
            continue;
        assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F32");
        const int64_t N = json_integer_value(json_array_get(json_object_get(t, "shape"), 0));
        const int64_t K = json_integer_value(json_array_get(json_object_get(t, "shape"), 1));
        if (K % 32 != 0 || K % group != 0)
            continue; /* stays as stored, as the loader leaves it */
        const off_t at = (off_t)(data0 + (uint64_t)json_integer_value(json_array_get(
                                             json_object_get(t, "data_offsets"), 0)));
        const int64_t G = K / group;
        float *w = malloc((size_t)(N * K) * sizeof *w);
        uint8_t *q = malloc((size_t)(N * K / 2));
        float *sc = malloc((size_t)(N * G) * sizeof *sc);
        float *zp = malloc((size_t)(N * G) * sizeof *zp);
        assert_true(w && q && sc && zp);
        assert_int_equal(pread(fd, w, (size_t)(N * K) * 4, at), (ssize_t)(N * K) * 4);
        int64_t bad;
        assert_true(mmrt_quant_q4_rows(w, N, K, group, q, sc, zp, &bad));
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                w[n * K + k] = ((float)mmrt_q4_code(q + n * (K / 2), k) - zp[n * G + k / group]) *
                               sc[n * G + k / group];
        assert_int_equal(pwrite(fd, w, (size_t)(N * K) * 4, at), (ssize_t)(N * K) * 4);
        free(w);
        free(q);
        free(sc);
        free(zp);
        n_done++;
    }
    assert_true(n_done > 10);
    json_decref(h);
    close(fd);
}

static void test_int4_computes_its_weights(void **state)
{
    (void)state;
    struct agreement a = { 0 };
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        compare_fixture(fixtures[i], MMRT_WEIGHTS_INT4_G32, &a);
    print_message("all fixtures int4-g32: top-1 agreement %.4f over %d steps, mean KL %.2e "
                  "(measured, not bounded: see above)\n", (double)a.agree / a.steps, a.steps,
                  a.kl_sum / a.steps);

    golden_scratch_make("llava-tiny");
    dequantize_scratch(32);
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, "llava-tiny");
    struct mmrt_runtime *q4 = open_with(dir, MMRT_WEIGHTS_INT4_G32);
    struct mmrt_runtime *deq = open_with(golden_scratch, MMRT_WEIGHTS_CHECKPOINT);
    struct golden_cases cases;
    golden_cases_load("llava-tiny", &cases);
    double worst = 0;
    for (int c = 0; c < cases.n; c++) {
        struct golden_capture cq = { 0 }, cd = { 0 };
        struct mmrt_result rq = { 0 }, rd = { 0 };
        golden_run(q4, &cases.req[c], &cq, &rq);
        golden_run(deq, &cases.req[c], &cd, &rd);
        assert_int_equal(cq.n_tokens, cd.n_tokens);
        assert_memory_equal(cq.tokens, cd.tokens, (size_t)cq.n_tokens * sizeof(int32_t));
        for (int s = 0; s < GOLDEN_MAX_STEPS && cd.logits[s]; s++) {
            assert_non_null(cq.logits[s]);
            worst = fmax(worst, golden_rel_err(cq.logits[s], cd.logits[s], cd.vocab));
        }
        golden_capture_free(&cq);
        golden_capture_free(&cd);
    }
    json_decref(cases.json);
    mmrt_destroy(q4);
    mmrt_destroy(deq);
    print_message("int4-g32 against its dequantized checkpoint: worst logits error %.2e\n",
                  worst);
    if (!(worst <= 1e-4))
        fail_msg("int4-g32 logits differ from the dequantized checkpoint's by %.3g", worst);
}

/* ---- what quantizing refuses ------------------------------------------------------------ */

/* Writes a NaN over element `index` of tensor `name` in golden_scratch/model.safetensors. */
static void poison(const char *name, int64_t index)
{
    uint64_t data0;
    int fd;
    json_t *h = scratch_header(&fd, &data0);
    json_t *t = json_object_get(h, name);
    assert_non_null(t);
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    const uint64_t start = (uint64_t)json_integer_value(
        json_array_get(json_object_get(t, "data_offsets"), 0));
    const uint64_t at = data0 + start;
    if (strcmp(dt, "F32") == 0) {
        const float v = NAN;
        assert_int_equal(pwrite(fd, &v, 4, (off_t)(at + (uint64_t)index * 4)), 4);
    } else { /* F16 / BF16: both spell a quiet NaN 0x7e00 / 0x7fc0 */
        const uint16_t v = strcmp(dt, "F16") == 0 ? 0x7e00 : 0x7fc0;
        assert_int_equal(pwrite(fd, &v, 2, (off_t)(at + (uint64_t)index * 2)), 2);
    }
    json_decref(h);
    close(fd);
}

static void test_int8_refuses_non_finite(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny");
    poison("language_model.model.layers.1.mlp.up_proj.weight", 3 * 32 + 5);
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = golden_scratch,
                               .devices = &dev, .n_devices = 1, .weights = MMRT_WEIGHTS_INT8 };
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_FORMAT);
    assert_null(rt);
    /* The load's own finiteness scan (weights.c) names it first, by element and byte offset;
     * the quantizer's message ("… at [3, 5] …") is the backstop. */
    if (!strstr(err, "language_model.model.layers.1.mlp.up_proj.weight") ||
        (!strstr(err, "element 101") && !strstr(err, "[3, 5]")) || !strstr(err, "finite"))
        fail_msg("message does not name the tensor and the element: %s", err);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_rules),
        cmocka_unit_test(test_quant_q4_rules),
        cmocka_unit_test(test_quant_q4_definition),
        cmocka_unit_test(test_quant_i8_definition),
        cmocka_unit_test(test_quant_rows_threads),
        cmocka_unit_test(test_quant_rows_read),
        cmocka_unit_test(test_int8_matches_checkpoint),
        cmocka_unit_test_teardown(test_int4_computes_its_weights, golden_scratch_drop),
        cmocka_unit_test_teardown(test_int8_refuses_non_finite, golden_scratch_drop),
    };
    return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
}
