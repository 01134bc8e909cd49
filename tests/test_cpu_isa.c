/*
 * tests/test_cpu_isa.c — every kernel table of the CPU plugin (device option `isa`: portable,
 * avx2, avx512, each only where this CPU has it) and the bf16 dot-product GEMM
 * (`bf16_dot = 1`), held to the double-precision reference of ref_ops.c.
 *
 * test_cpu_ops runs the whole operator suite on the table the CPU picks by itself; this file
 * makes sure the others stay correct too (a CI machine without AVX-512 runs avx2, a developer
 * machine with it still checks avx2 and portable), over the shapes where the tables differ:
 * MATMUL on both sides of the GEMV / blocked-GEMM switch with edge tiles in every direction,
 * ATTENTION on its streaming (≤ 4 queries) and blocked paths with GQA, F16 K/V, causal
 * offsets, several sequences and empty ones, and the sigmoid-family activations and GELU
 * (vectorised exp and erfc) over ordinary and extreme inputs. Tolerances are those of
 * test_cpu_ops: MATMUL and ATTENTION 1e-5, activations 1e-6, as max |got − ref| / max |ref|.
 *
 * Per table it also checks that 1 and 3 threads give bit-identical results on every path,
 * and the batch-invariance contract of MATMUL (CPU_GEMV_MAX_M): for M = 1…32 every row is
 * bit-identical to that row computed alone, for M > 32 every row is bit-identical whatever
 * M (and, on the portable table, still equal to M = 1).
 * I8 weights (plugin.h, quantized by core/quant.h) go through the same shapes on every table,
 * with the same row invariance for M ≤ 32.
 * bf16_dot rounds the activations to bf16, so its MATMUL is held to a measured bound instead
 * (BF16_DOT_TOL, about 8 times the worst error seen on these shapes, 1.8e-3); the error it reaches is
 * printed so docs/BENCHMARKS.md can quote it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin_harness.h"
#include "quant.h"
#include "ref_ops.h"

#define BF16_DOT_TOL 1.5e-2
/* The plugin's CPU_GEMV_MAX_M (its header is private): up to this many rows, every row of
 * MATMUL is bit-identical to M = 1 (the batch-invariance contract, engine.md §5). */
#define ROW_INV_MAX_M 32

/* ---- helpers ----------------------------------------------------------------------------- */

static uint64_t g_rng;

static float rnd(float lo, float hi)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((double)(z >> 11) / 9007199254740992.0);
}

static float *rand_vec(int64_t n, float lo, float hi, enum mmrt_dtype dt)
{
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) {
        v[i] = rnd(lo, hi);
        if (dt == MMRT_DTYPE_F16)
            v[i] = mmrt_f16_to_f32(mmrt_f32_to_f16(v[i]));
        else if (dt == MMRT_DTYPE_BF16)
            v[i] = mmrt_bf16_to_f32(mmrt_f32_to_bf16(v[i]));
        else if (dt == MMRT_DTYPE_F8E4M3)
            v[i] = ref_f8e4m3_value(ref_f8e4m3_encode(v[i]));
    }
    return v;
}

/* A device tensor of dtype dt holding the (already rounded) f32 values v. */
static struct harness_tensor put(struct harness *h, enum mmrt_dtype dt, int n_dims,
                                 const int64_t *ne, const float *v)
{
    struct harness_tensor t;
    assert_int_equal(harness_tensor_new(h, dt, n_dims, ne, &t), MMRT_OK);
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++)
        n *= ne[i];
    if (dt == MMRT_DTYPE_F32 || dt == MMRT_DTYPE_I32) {
        assert_int_equal(harness_upload(h, &t, v), MMRT_OK);
    } else if (dt == MMRT_DTYPE_F8E4M3) {
        uint8_t *b = malloc((size_t)(n ? n : 1));
        assert_non_null(b);
        for (int64_t i = 0; i < n; i++)
            b[i] = ref_f8e4m3_encode(v[i]);
        assert_int_equal(harness_upload(h, &t, b), MMRT_OK);
        free(b);
    } else {
        uint16_t *b = malloc((size_t)(n ? n : 1) * 2);
        assert_non_null(b);
        for (int64_t i = 0; i < n; i++)
            b[i] = dt == MMRT_DTYPE_F16 ? mmrt_f32_to_f16(v[i]) : mmrt_f32_to_bf16(v[i]);
        assert_int_equal(harness_upload(h, &t, b), MMRT_OK);
        free(b);
    }
    return t;
}

static float *get(struct harness *h, struct harness_tensor *t)
{
    float *v = malloc((size_t)t->nbytes + 4);
    assert_non_null(v);
    assert_int_equal(harness_download(h, t, v), MMRT_OK);
    return v;
}

/* max |got − ref| / max |ref| (NaN must match NaN). */
static double rel_err(const float *got, const double *ref, int64_t n)
{
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (isnan(ref[i]) != isnan(got[i]))
                return INFINITY;
            continue;
        }
        max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
        double e = fabs((double)got[i] - ref[i]);
        max_err = e > max_err ? e : max_err;
    }
    return max_err / (max_ref > 0 ? max_ref : 1.0);
}

/* rel_err over the outputs whose reference is finite (a row with an infinity in x is NaN in
 * the plugin, ±inf in a double reference). */
static double finite_rel_err(const float *got, const double *ref, int64_t n)
{
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]))
            continue;
        max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
        const double e = fabs((double)got[i] - ref[i]);
        max_err = e > max_err ? e : max_err;
    }
    return max_err / (max_ref > 0 ? max_ref : 1.0);
}

/* Opens the plugin with isa (and bf16_dot); false when this CPU lacks it (the harness prints
 * the plugin's refusal). The portable table must always open. */
/* widen: the device option gemv_widen ("buffer", "registers"), or NULL for its default. A
 * table with a registers GEMV says so in the device's name. */
static bool open_isa_widen(struct harness *h, const char *isa, const char *threads,
                           bool bf16_dot, const char *widen)
{
    struct mmrt_option opts[4] = { { "isa", isa }, { "threads", threads } };
    int n = 2;
    if (bf16_dot)
        opts[n++] = (struct mmrt_option){ "bf16_dot", "1" };
    if (widen)
        opts[n++] = (struct mmrt_option){ "gemv_widen", widen };
    mmrt_status st = harness_open(h, harness_plugin_path("cpu"), opts, n);
    if (strcmp(isa, "portable") == 0 && !bf16_dot)
        assert_int_equal(st, MMRT_OK);
    if (st == MMRT_OK && widen && strcmp(isa, "portable") != 0) {
        struct mmrt_device_info info = { .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_device_info) };
        assert_int_equal(h->plugin->device_info(h->dev, &info), MMRT_OK);
        if ((strstr(info.name, "+gemv_regs") != NULL) != (widen[0] == 'r'))
            fail_msg("isa %s gemv_widen=%s: the device name \"%s\" says the other", isa, widen,
                     info.name);
    }
    return st == MMRT_OK;
}

static bool open_isa(struct harness *h, const char *isa, const char *threads, bool bf16_dot)
{
    return open_isa_widen(h, isa, threads, bf16_dot, NULL);
}

/* Both ways the batched GEMV widens its weights (gemv_widen): the same bits are asked of
 * each, whichever the CPU's default is. */
static const char *const widens[] = { "buffer", "registers" };

static const char *const isas[] = { "portable", "avx2", "avx512" };
static const enum mmrt_dtype wdts[3] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16 };

/* ---- MATMUL ------------------------------------------------------------------------------ */

static const int64_t mm_cases[][3] = { /* M, K, N */
    { 1, 1, 1 },    { 1, 4099, 3 }, { 2, 300, 513 },  { 3, 17, 33 },   { 4, 1000, 45 },
    { 5, 1000, 130 }, { 17, 65, 33 }, { 64, 257, 96 }, { 37, 31, 19 }, { 15, 512, 64 },
    { 29, 769, 100 }, { 2, 0, 5 },   { 9, 0, 3 },   { 32, 1100, 37 }, { 33, 1100, 37 },
    { 12, 2051, 9 },
};

/* Runs MATMUL on h; returns the output and (when ref is not NULL) the reference. */
static float *matmul_case(struct harness *h, int64_t M, int64_t K, int64_t N, enum mmrt_dtype wdt,
                          bool bias, uint64_t seed, double **ref)
{
    g_rng = seed;
    float *x = rand_vec(M * K, -1, 1, MMRT_DTYPE_F32), *w = rand_vec(N * K, -1, 1, wdt);
    float *b = bias ? rand_vec(N, -1, 1, wdt) : NULL;
    struct harness_tensor tx = put(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, K }, x);
    struct harness_tensor tw = put(h, wdt, 2, (const int64_t[]){ N, K }, w);
    struct harness_tensor tb, ty;
    if (bias)
        tb = put(h, wdt, 1, (const int64_t[]){ N }, b);
    assert_int_equal(harness_tensor_new(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, N }, &ty),
                     MMRT_OK);
    struct harness_tensor *src[3] = { &tx, &tw, bias ? &tb : NULL };
    assert_int_equal(harness_run(h, MMRT_OP_MATMUL, src, bias ? 3 : 2, &ty, NULL, 0), MMRT_OK);
    float *y = get(h, &ty);
    if (ref) {
        *ref = malloc((size_t)(M * N + 1) * sizeof(double));
        assert_non_null(*ref);
        ref_matmul(x, w, b, M, K, N, *ref);
    }
    harness_tensor_free(h, &tx);
    harness_tensor_free(h, &tw);
    if (bias)
        harness_tensor_free(h, &tb);
    harness_tensor_free(h, &ty);
    free(x);
    free(w);
    free(b);
    return y;
}

static void test_matmul_all_isas(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness h;
        if (!open_isa(&h, isas[i], "3", false))
            continue;
        for (size_t c = 0; c < sizeof mm_cases / sizeof mm_cases[0]; c++)
            for (int d = 0; d < 3; d++) {
                double *ref;
                int64_t M = mm_cases[c][0], K = mm_cases[c][1], N = mm_cases[c][2];
                float *y = matmul_case(&h, M, K, N, wdts[d], (c + (size_t)d) % 2, 7 + c, &ref);
                double e = rel_err(y, ref, M * N);
                if (!(e <= 1e-5))
                    fail_msg("isa %s MATMUL M=%lld K=%lld N=%lld dtype %d: error %.3g > 1e-5",
                             isas[i], (long long)M, (long long)K, (long long)N, (int)wdts[d], e);
                free(y);
                free(ref);
            }
        harness_close(&h);
    }
}

/* I8 weights (per-row scales, core/quant.h) on every table: the mm_cases against the
 * dequantized reference, and each row of an M ≤ 32 launch bit-identical to that row alone. */
static void test_matmul_i8_all_isas(void **state)
{
    (void)state;
    for (size_t iw = 0; iw < 2 * (sizeof isas / sizeof isas[0]); iw++) {
        const size_t i = iw / 2;
        const char *widen = widens[iw % 2];
        struct harness h;
        if ((strcmp(isas[i], "portable") == 0 && iw % 2) ||
            !open_isa_widen(&h, isas[i], "3", false, widen))
            continue;
        for (size_t c = 0; c < sizeof mm_cases / sizeof mm_cases[0]; c++) {
            int64_t M = mm_cases[c][0], K = mm_cases[c][1], N = mm_cases[c][2];
            g_rng = 300 + c;
            float *x = rand_vec(M * K, -1, 1, MMRT_DTYPE_F32), *w = rand_vec(N * K, -1, 1,
                                                                             MMRT_DTYPE_F32);
            int8_t *q = malloc((size_t)(N * K) + 1);
            float *scale = malloc((size_t)N * sizeof *scale + 1);
            float *deq = malloc((size_t)(N * K) * sizeof *deq + 1);
            assert_true(q && scale && deq);
            int64_t bad;
            assert_true(mmrt_quant_i8_rows(w, N, K, q, scale, &bad));
            for (int64_t j = 0; j < N * K; j++)
                deq[j] = (float)q[j] * scale[j / (K ? K : 1)];
            struct harness_tensor tx = put(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, K }, x);
            struct harness_tensor tw, ts, ty;
            assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_I8, 2, (const int64_t[]){ N, K },
                                                &tw), MMRT_OK);
            assert_int_equal(harness_upload(&h, &tw, q), MMRT_OK);
            ts = put(&h, MMRT_DTYPE_F32, 1, (const int64_t[]){ N }, scale);
            assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, N },
                                                &ty), MMRT_OK);
            struct harness_tensor *src[4] = { &tx, &tw, NULL, &ts };
            assert_int_equal(harness_run(&h, MMRT_OP_MATMUL, src, 4, &ty, NULL, 0), MMRT_OK);
            float *y = get(&h, &ty);
            double *ref = malloc((size_t)(M * N + 1) * sizeof *ref);
            assert_non_null(ref);
            ref_matmul(x, deq, NULL, M, K, N, ref);
            double e = rel_err(y, ref, M * N);
            if (!(e <= 1e-5))
                fail_msg("isa %s gemv_widen=%s MATMUL I8 M=%lld K=%lld N=%lld: error %.3g > "
                         "1e-5", isas[i], widen, (long long)M, (long long)K, (long long)N, e);
            for (int64_t r = 0; M <= ROW_INV_MAX_M && r < M; r++) {
                struct harness_tensor t1 = put(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ 1, K },
                                               x + r * K), y1;
                assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 2,
                                                    (const int64_t[]){ 1, N }, &y1), MMRT_OK);
                struct harness_tensor *s1[4] = { &t1, &tw, NULL, &ts };
                assert_int_equal(harness_run(&h, MMRT_OP_MATMUL, s1, 4, &y1, NULL, 0), MMRT_OK);
                float *g1 = get(&h, &y1);
                if (memcmp(g1, y + r * N, (size_t)N * sizeof(float)) != 0)
                    fail_msg("isa %s gemv_widen=%s MATMUL I8 M=%lld K=%lld N=%lld: row %lld "
                             "differs from the row alone", isas[i], widen, (long long)M,
                             (long long)K, (long long)N, (long long)r);
                free(g1);
                harness_tensor_free(&h, &t1);
                harness_tensor_free(&h, &y1);
            }
            harness_tensor_free(&h, &tx);
            harness_tensor_free(&h, &tw);
            harness_tensor_free(&h, &ts);
            harness_tensor_free(&h, &ty);
            free(x);
            free(w);
            free(q);
            free(scale);
            free(deq);
            free(y);
            free(ref);
        }
        harness_close(&h);
    }
}

/* A U4 MATMUL's operands on h (x [M, K], the packed codes, bias, scales and zero points)
 * and its output [M, N]. */
struct u4_case {
    struct harness_tensor x, w, b, s, z, y;
    int64_t M, K, N;
};

static struct u4_case u4_put(struct harness *h, int64_t M, int64_t K, int64_t N, int64_t G,
                             const float *x, const uint8_t *q, const float *b,
                             const float *scale, const float *zero)
{
    struct u4_case u = { .M = M, .K = K, .N = N };
    u.x = put(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, K }, x);
    u.b = put(h, MMRT_DTYPE_F32, 1, (const int64_t[]){ N }, b);
    u.s = put(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, G }, scale);
    u.z = put(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, G }, zero);
    assert_int_equal(harness_tensor_new(h, MMRT_DTYPE_U4, 2, (const int64_t[]){ N, K / 2 }, &u.w),
                     MMRT_OK);
    assert_int_equal(harness_upload(h, &u.w, q), MMRT_OK);
    assert_int_equal(harness_tensor_new(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, N }, &u.y),
                     MMRT_OK);
    return u;
}

/* Runs the MATMUL and returns its output. */
static float *u4_run(struct harness *h, struct u4_case *u)
{
    struct harness_tensor *src[5] = { &u->x, &u->w, &u->b, &u->s, &u->z };
    assert_int_equal(harness_run(h, MMRT_OP_MATMUL, src, 5, &u->y, NULL, 0), MMRT_OK);
    return get(h, &u->y);
}

/* Fails unless each row of y (u4_run's output for the x rows at x) is bit-identical to
 * that row run alone. */
static void u4_rows_alone(struct harness *h, struct u4_case *u, const float *x, const float *y,
                          const char *what)
{
    for (int64_t r = 0; r < u->M; r++) {
        struct harness_tensor t1 = put(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ 1, u->K },
                                       x + r * u->K), y1;
        assert_int_equal(harness_tensor_new(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ 1, u->N },
                                            &y1), MMRT_OK);
        struct harness_tensor *s1[5] = { &t1, &u->w, &u->b, &u->s, &u->z };
        assert_int_equal(harness_run(h, MMRT_OP_MATMUL, s1, 5, &y1, NULL, 0), MMRT_OK);
        float *g1 = get(h, &y1);
        if (memcmp(g1, y + r * u->N, (size_t)u->N * sizeof(float)) != 0)
            fail_msg("%s MATMUL U4 M=%lld K=%lld N=%lld: row %lld differs from the row alone",
                     what, (long long)u->M, (long long)u->K, (long long)u->N, (long long)r);
        free(g1);
        harness_tensor_free(h, &t1);
        harness_tensor_free(h, &y1);
    }
}

static void u4_free(struct harness *h, struct u4_case *u)
{
    harness_tensor_free(h, &u->x);
    harness_tensor_free(h, &u->b);
    harness_tensor_free(h, &u->s);
    harness_tensor_free(h, &u->z);
    harness_tensor_free(h, &u->w);
    harness_tensor_free(h, &u->y);
}

/* A U4 case's host data: x [M, K], W [N, K] and the bias drawn from g_rng = seed in that
 * order, W quantized in groups of gs (core/quant.h). */
struct u4_data {
    float *x, *w, *b, *scale, *zero;
    uint8_t *q;
};

static struct u4_data u4_data_make(int64_t M, int64_t K, int64_t N, int64_t gs, uint64_t seed)
{
    const int64_t G = K / gs;
    g_rng = seed;
    struct u4_data d = { .x = rand_vec(M * K, -1, 1, MMRT_DTYPE_F32),
                         .w = rand_vec(N * K, -1, 1, MMRT_DTYPE_F32),
                         .b = rand_vec(N, -1, 1, MMRT_DTYPE_F32),
                         .q = malloc((size_t)(N * K / 2)),
                         .scale = malloc((size_t)(N * G) * sizeof(float)),
                         .zero = malloc((size_t)(N * G) * sizeof(float)) };
    assert_true(d.q && d.scale && d.zero);
    int64_t bad;
    assert_true(mmrt_quant_q4_rows(d.w, N, K, gs, d.q, d.scale, d.zero, &bad));
    return d;
}

static void u4_data_free(struct u4_data *d)
{
    free(d->x);
    free(d->w);
    free(d->b);
    free(d->q);
    free(d->scale);
    free(d->zero);
}

/* U4 weights (groups of 32 and 64, core/quant.h) on every table, with its default GEMV (three
 * int8 digits where the table has the unit) and with int8_dot = 0 (every code widened to
 * f32): against the dequantized reference, on both sides of the GEMV line, and each row of an
 * M ≤ 32 launch bit-identical to that row alone. */
static void test_matmul_u4_all_isas(void **state)
{
    (void)state;
    static const int64_t cases[][4] = { /* M, K, N, group */
        { 1, 32, 1, 32 },   { 1, 256, 13, 64 }, { 3, 128, 33, 32 }, { 17, 512, 45, 64 },
        { 32, 96, 20, 32 }, { 33, 128, 19, 32 }, { 64, 320, 70, 64 }, { 2, 4096, 9, 128 },
        { 40, 640, 37, 32 }, { 70, 1024, 45, 128 }, /* K blocks of the GEMM, ragged panels */
        { 1, 512, 37, 128 }, { 5, 1536, 29, 512 },  /* blocks of one-row and widened paths */
        { 4, 960, 11, 96 }, /* groups across the widened path's K chunks */
    };
    for (size_t i = 0; i < 2 * sizeof isas / sizeof isas[0]; i++) {
        struct harness h;
        const bool widen = i % 2 == 1;
        struct mmrt_option opts[3] = { { "isa", isas[i / 2] }, { "threads", "3" },
                                       { "int8_dot", "0" } };
        if (harness_open(&h, harness_plugin_path("cpu"), opts, widen ? 3 : 2) != MMRT_OK) {
            assert_string_not_equal(isas[i / 2], "portable");
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "%s%s", isas[i / 2], widen ? " int8_dot=0" : "");
        /* the default is three digits wherever the table has a unit, and says so */
        struct mmrt_device_info info = { .hdr = { .struct_size = sizeof info } };
        assert_int_equal(h.plugin->device_info(h.dev, &info), MMRT_OK);
        const bool unit = strstr(info.name, "+int8_dot") != NULL;
        const bool want = !widen && strcmp(isas[i / 2], "portable") != 0;
        if (unit != want || (want && !strstr(info.name, "+int8_dot=3:")))
            fail_msg("isa %s: device name \"%s\"; expected %s", what, info.name,
                     want ? "+int8_dot=3:<unit>" : "no int8_dot unit");
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const int64_t M = cases[c][0], K = cases[c][1], N = cases[c][2], gs = cases[c][3];
            const int64_t G = K / gs;
            struct u4_data dt = u4_data_make(M, K, N, gs, 500 + c);
            const float *x = dt.x, *b = dt.b, *scale = dt.scale, *zero = dt.zero;
            const uint8_t *q = dt.q;
            float *deq = malloc((size_t)(N * K) * sizeof *deq);
            assert_non_null(deq);
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    deq[n * K + k] = ((float)mmrt_q4_code(q + n * (K / 2), k) -
                                      zero[n * G + k / gs]) * scale[n * G + k / gs];
            struct u4_case u = u4_put(&h, M, K, N, G, x, q, b, scale, zero);
            float *y = u4_run(&h, &u);
            double *ref = malloc((size_t)(M * N) * sizeof *ref);
            assert_non_null(ref);
            ref_matmul(x, deq, b, M, K, N, ref);
            double e = rel_err(y, ref, M * N);
            if (!(e <= 1e-5))
                fail_msg("isa %s MATMUL U4 M=%lld K=%lld N=%lld g%lld: error %.3g > 1e-5",
                         what, (long long)M, (long long)K, (long long)N, (long long)gs, e);
            if (M <= ROW_INV_MAX_M) {
                u4_rows_alone(&h, &u, x, y, what);
            } else {
                /* Above the GEMV the blocked GEMM packs W from the codes: the very weights
                 * an F32 W of the dequantized values gives, so the very same bits. */
                struct harness_tensor tf = put(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, K },
                                               deq), yf;
                assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 2,
                                                    (const int64_t[]){ M, N }, &yf), MMRT_OK);
                struct harness_tensor *sf[3] = { &u.x, &tf, &u.b };
                assert_int_equal(harness_run(&h, MMRT_OP_MATMUL, sf, 3, &yf, NULL, 0), MMRT_OK);
                float *gf = get(&h, &yf);
                if (memcmp(gf, y, (size_t)(M * N) * sizeof(float)) != 0)
                    fail_msg("isa %s MATMUL U4 M=%lld K=%lld N=%lld g%lld: differs from the F32 "
                             "product of its dequantized weights", what, (long long)M,
                             (long long)K, (long long)N, (long long)gs);
                free(gf);
                harness_tensor_free(&h, &tf);
                harness_tensor_free(&h, &yf);
            }
            struct harness_tensor *bad_src[4] = { &u.x, &u.w, &u.b, &u.s }; /* no zero points */
            assert_int_equal(harness_run(&h, MMRT_OP_MATMUL, bad_src, 4, &u.y, NULL, 0),
                             MMRT_ERR_INVALID_ARG);
            u4_free(&h, &u);
            u4_data_free(&dt);
            free(deq);
            free(y);
            free(ref);
        }
        harness_close(&h);
    }
}

/* int8_dot's x, as docs/QUANTIZATION.md defines it (written here again, not taken from the
 * plugin): per block of 32 values, d = amax / Q and q = x·(Q / amax) rounded to nearest even
 * (divided instead below 1e-30), Q = 127 for one digit and 127·65793 for three; xhat = d·q.
 * NaN for a block that is not finite. */
static void q8_reference_x(const float *x, int64_t K, int digits, double *xhat)
{
    const float qf = digits == 1 ? 127.0f : 8355711.0f;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        const int64_t n = K - k0 < 32 ? K - k0 : 32;
        float amax = 0;
        bool finite = true;
        for (int64_t k = k0; k < k0 + n; k++) {
            finite = finite && isfinite(x[k]);
            amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        }
        const float d = amax / qf, inv = qf / amax;
        for (int64_t k = k0; k < k0 + n; k++) {
            float q = !finite || amax == 0 ? 0.0f
                      : amax < 1e-30f      ? nearbyintf(x[k] / amax * qf)
                                           : nearbyintf(x[k] * inv);
            xhat[k] = finite ? (double)d * (double)q : NAN;
        }
    }
}

/* int8_dot = 1 and 3 (each unit this CPU runs: AVX512_VNNI with the avx512 table, vpmaddubsw
 * with the avx2 one): for M ≤ 32 the U4 product of the dequantized W and the rounded x
 * (q8_reference_x), within float summation (1e-5 of max |ref|); within the rounding's own
 * bound of the exact product (Σ |w|·d/2 per output); every row bit-identical alone; a row
 * with a NaN or an infinity NaN throughout, the others untouched; tiny and zero blocks. Three
 * digits must also be as close to the exact product as the f32 GEMV without the option. Above
 * 32 rows the float GEMM runs as without the option (test_matmul_u4_all_isas). The other
 * prefetch (l1 or l2, whichever auto did not pick) gives every output bit for bit. */
static void test_matmul_u4_int8_dot(void **state)
{
    (void)state;
    static const int64_t cases[][4] = { /* M, K, N, group */
        { 1, 32, 1, 32 },    { 1, 256, 13, 64 },  { 3, 128, 33, 32 },  { 17, 512, 45, 64 },
        { 32, 96, 20, 32 },  { 2, 4096, 9, 128 }, { 1, 512, 37, 128 }, { 5, 1536, 29, 512 },
        { 4, 960, 11, 96 },  { 1, 160, 7, 160 },  { 6, 4160, 10, 2080 }, /* groups not of whole chunks */
        { 2, 224, 9, 32 },   { 1, 4096, 40, 128 },
    };
    static const char *const tables[] = { "avx2", "avx512" };
    static const char *const digit_values[] = { "1", "3" };
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        for (size_t dv = 0; dv < 2; dv++) {
            const int digits = dv == 0 ? 1 : 3;
            const double qd = digits == 1 ? 127.0 : 8355711.0;
            struct harness h, h0;
            struct mmrt_option opts[3] = { { "isa", tables[i] }, { "threads", "3" },
                                           { "int8_dot", digit_values[dv] } };
            if (harness_open(&h, harness_plugin_path("cpu"), opts, 3) != MMRT_OK) {
                print_message("int8_dot=%d with isa %s: not on this CPU; skipped\n", digits,
                              tables[i]);
                continue;
            }
            /* the same table with int8_dot = 0: the f32 GEMV three digits are held to */
            struct mmrt_option opts0[3] = { opts[0], opts[1], { "int8_dot", "0" } };
            assert_int_equal(harness_open(&h0, harness_plugin_path("cpu"), opts0, 3), MMRT_OK);
            struct mmrt_device_info info = { .hdr = { .struct_size = sizeof info } };
            assert_int_equal(h.plugin->device_info(h.dev, &info), MMRT_OK);
            const char *unit = strstr(info.name, digits == 1 ? "+int8_dot:" : "+int8_dot=3:");
            if (!unit)
                fail_msg("isa %s int8_dot=%d: the device name \"%s\" does not say the unit",
                         tables[i], digits, info.name);
            /* the prefetch auto did not pick, and the name saying which runs */
            const bool l2 = strstr(unit, "/l2") != NULL;
            struct harness hp;
            struct mmrt_option optsp[4] = { opts[0], opts[1], opts[2],
                                            { "prefetch", l2 ? "l1" : "l2" } };
            assert_int_equal(harness_open(&hp, harness_plugin_path("cpu"), optsp, 4), MMRT_OK);
            struct mmrt_device_info infop = { .hdr = { .struct_size = sizeof infop } };
            assert_int_equal(hp.plugin->device_info(hp.dev, &infop), MMRT_OK);
            if ((strstr(infop.name, "/l2") != NULL) == l2)
                fail_msg("isa %s int8_dot=%d prefetch=%s: the device name \"%s\" says the other",
                         tables[i], digits, l2 ? "l1" : "l2", infop.name);
            print_message("int8_dot=%d with isa %s: %s\n", digits, tables[i], unit);
            double worst = 0, worst_bound = 0, worst_exact = 0, worst_f32 = 0;
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                const int64_t M = cases[c][0], K = cases[c][1], N = cases[c][2], gs = cases[c][3];
                const int64_t G = K / gs;
                struct u4_data dt = u4_data_make(M, K, N, gs, 900 + c);
                float *x = dt.x;
                const float *b = dt.b, *scale = dt.scale, *zero = dt.zero;
                const uint8_t *q = dt.q;
                /* the special blocks: zeros, a tiny range (the divided path), a NaN row, an
                 * infinity row (rows 1 and 2 when there are 3 or more) */
                for (int64_t k = 0; k < 32 && K >= 64; k++) {
                    x[k] = 0.0f;
                    x[32 + k] *= 1e-33f;
                }
                if (M >= 3) {
                    x[1 * K + K / 2] = NAN;
                    x[2 * K + K - 1] = INFINITY;
                }
                double *xhat = malloc((size_t)(M * K) * sizeof *xhat);
                double *ref = malloc((size_t)(M * N) * sizeof *ref);
                double *exact = malloc((size_t)(M * N) * sizeof *exact);
                double *bound = malloc((size_t)(M * N) * sizeof *bound);
                assert_true(xhat && ref && exact && bound);
                for (int64_t m = 0; m < M; m++)
                    q8_reference_x(x + m * K, K, digits, xhat + m * K);
                for (int64_t m = 0; m < M; m++)
                    for (int64_t n = 0; n < N; n++) {
                        double r = b[n], e = b[n], bd = 0;
                        for (int64_t k = 0; k < K; k++) {
                            const int64_t g = n * G + k / gs;
                            const double wv = (double)(((float)mmrt_q4_code(q + n * (K / 2), k) -
                                                        zero[g]) * scale[g]);
                            r += wv * xhat[m * K + k];
                            e += wv * (double)x[m * K + k];
                            /* |x − xhat| ≤ d/2 = amax/(2Q), amax ≤ 1 here */
                            bd += fabs(wv) * (0.5 / qd);
                        }
                        ref[m * N + n] = r;
                        exact[m * N + n] = e;
                        bound[m * N + n] = bd;
                    }
                struct u4_case u = u4_put(&h, M, K, N, G, x, q, b, scale, zero);
                float *y = u4_run(&h, &u);
                double e = rel_err(y, ref, M * N);
                if (!(e <= 1e-5))
                    fail_msg("isa %s int8_dot=%d MATMUL U4 M=%lld K=%lld N=%lld g%lld: error "
                             "%.3g > 1e-5 against the rounded x", tables[i], digits,
                             (long long)M, (long long)K, (long long)N, (long long)gs, e);
                worst = e > worst ? e : worst;
                for (int64_t o = 0; o < M * N; o++) {
                    if (isnan(ref[o]))
                        continue; /* rel_err held NaN to NaN */
                    const double slack = 1e-5 * (fabs(exact[o]) + 1.0);
                    const double dev = fabs((double)y[o] - exact[o]);
                    if (!(dev <= bound[o] + slack))
                        fail_msg("isa %s int8_dot=%d M=%lld K=%lld N=%lld: output %lld is "
                                 "%.9g, the exact product %.9g: off by %.3g, more than x's "
                                 "rounding allows (%.3g)", tables[i], digits, (long long)M,
                                 (long long)K, (long long)N, (long long)o, (double)y[o],
                                 exact[o], dev, bound[o]);
                    worst_bound = dev / bound[o] > worst_bound ? dev / bound[o] : worst_bound;
                }
                if (digits == 3) {
                    /* as exact as f32: against the exact product, within twice the f32 GEMV's
                     * own error (each relative to max |exact|) plus 1e-6 for a case of one or
                     * two outputs, where the f32 GEMV may be exact by luck; over all cases
                     * within twice its worst (below). One digit is ~1e-3 off. */
                    struct u4_case u0 = u4_put(&h0, M, K, N, G, x, q, b, scale, zero);
                    float *y0 = u4_run(&h0, &u0);
                    const double e3 = finite_rel_err(y, exact, M * N);
                    const double e0 = finite_rel_err(y0, exact, M * N);
                    if (!(e3 <= 2 * e0 + 1e-6))
                        fail_msg("isa %s int8_dot=3 M=%lld K=%lld N=%lld g%lld: %.3g of max "
                                 "|exact| off the exact product, the f32 GEMV %.3g",
                                 tables[i], (long long)M, (long long)K, (long long)N,
                                 (long long)gs, e3, e0);
                    worst_exact = e3 > worst_exact ? e3 : worst_exact;
                    worst_f32 = e0 > worst_f32 ? e0 : worst_f32;
                    u4_free(&h0, &u0);
                    free(y0);
                }
                if (M >= 3)
                    for (int64_t n = 0; n < N; n++)
                        if (!isnan(y[1 * N + n]) || !isnan(y[2 * N + n]))
                            fail_msg("isa %s int8_dot=%d M=%lld K=%lld: a row with a NaN or an "
                                     "infinity gave a number at column %lld", tables[i], digits,
                                     (long long)M, (long long)K, (long long)n);
                struct u4_case up = u4_put(&hp, M, K, N, G, x, q, b, scale, zero);
                float *yp = u4_run(&hp, &up);
                if (memcmp(y, yp, (size_t)(M * N) * sizeof *y) != 0)
                    fail_msg("isa %s int8_dot=%d M=%lld K=%lld N=%lld: prefetch %s changed "
                             "the outputs", tables[i], digits, (long long)M, (long long)K,
                             (long long)N, l2 ? "l1" : "l2");
                u4_free(&hp, &up);
                free(yp);
                char what[64];
                snprintf(what, sizeof what, "isa %s int8_dot=%d", tables[i], digits);
                u4_rows_alone(&h, &u, x, y, what);
                u4_free(&h, &u);
                u4_data_free(&dt);
                free(xhat);
                free(ref);
                free(exact);
                free(bound);
                free(y);
            }
            print_message("int8_dot=%d with isa %s: worst error %.3g of max |ref| against the "
                          "rounded x; against the exact x at most %.2f of the rounding's "
                          "bound\n", digits, tables[i], worst, worst_bound);
            if (digits == 3) {
                print_message("int8_dot=3 with isa %s: worst error against the exact product "
                              "%.3g of max |exact|, the f32 GEMV's %.3g\n", tables[i],
                              worst_exact, worst_f32);
                if (!(worst_exact <= 2 * worst_f32))
                    fail_msg("isa %s int8_dot=3: worst error against the exact product %.3g, "
                             "more than twice the f32 GEMV's %.3g", tables[i], worst_exact,
                             worst_f32);
            }
            harness_close(&hp);
            harness_close(&h0);
            harness_close(&h);
        }
}

/* K = 0 is a U4 MATMUL the contract accepts (W [N, 0], one group of no codes): an empty sum,
 * so y is the bias, on the GEMV (M ≤ 32) and the blocked path alike. The blocked path once
 * divided by K, and the widened GEMV would have summed nothing into uninitialised state. */
static void test_matmul_u4_empty_k(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness h;
        if (!open_isa(&h, isas[i], "3", false))
            continue;
        static const int64_t Ms[] = { 1, 5, 40 };
        const int64_t N = 19;
        for (size_t c = 0; c < sizeof Ms / sizeof Ms[0]; c++) {
            const int64_t M = Ms[c];
            g_rng = 900 + c;
            float *b = rand_vec(N, -1, 1, MMRT_DTYPE_F32);
            float *sz = rand_vec(N, 1, 2, MMRT_DTYPE_F32);
            struct harness_tensor tx, tw, ty;
            assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, 0 },
                                                &tx), MMRT_OK);
            assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_U4, 2, (const int64_t[]){ N, 0 },
                                                &tw), MMRT_OK);
            struct harness_tensor tb = put(&h, MMRT_DTYPE_F32, 1, (const int64_t[]){ N }, b);
            struct harness_tensor ts = put(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, 1 }, sz);
            struct harness_tensor tz = put(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, 1 }, sz);
            assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, N },
                                                &ty), MMRT_OK);
            struct harness_tensor *src[5] = { &tx, &tw, &tb, &ts, &tz };
            assert_int_equal(harness_run(&h, MMRT_OP_MATMUL, src, 5, &ty, NULL, 0), MMRT_OK);
            float *y = get(&h, &ty);
            for (int64_t m = 0; m < M; m++)
                if (memcmp(y + m * N, b, (size_t)N * sizeof(float)) != 0)
                    fail_msg("isa %s MATMUL U4 K=0 M=%lld: row %lld is not the bias", isas[i],
                             (long long)M, (long long)m);
            free(y);
            free(b);
            free(sz);
            harness_tensor_free(&h, &tx);
            harness_tensor_free(&h, &tw);
            harness_tensor_free(&h, &tb);
            harness_tensor_free(&h, &ts);
            harness_tensor_free(&h, &tz);
            harness_tensor_free(&h, &ty);
        }
        harness_close(&h);
    }
}

/* ---- ATTENTION --------------------------------------------------------------------------- */

struct acase {
    int64_t Hq, Hkv, D;
    int n_seq;
    int32_t lq[4], lk[4];
    int causal;
    enum mmrt_dtype kv;
    int window; /* sliding window; 0 = none */
};

static const struct acase attn_cases[] = {
    { 4, 2, 128, 1, { 1 }, { 37 }, 1, MMRT_DTYPE_F16, 0 },          /* decode, GQA 2 */
    { 8, 1, 64, 1, { 3 }, { 50 }, 1, MMRT_DTYPE_F32, 0 },           /* 3 queries, GQA 8 */
    { 4, 4, 64, 1, { 40 }, { 40 }, 0, MMRT_DTYPE_F32, 0 },          /* vision-like */
    { 8, 2, 80, 1, { 33 }, { 33 }, 1, MMRT_DTYPE_F16, 0 },          /* blocked, D not ÷ NR */
    { 4, 1, 64, 1, { 5 }, { 20 }, 1, MMRT_DTYPE_F32, 0 },           /* chunked prefill */
    { 2, 2, 256, 3, { 5, 1, 12 }, { 5, 1, 12 }, 0, MMRT_DTYPE_F32, 0 },
    { 6, 3, 8, 4, { 3, 1, 0, 5 }, { 10, 1, 0, 2 }, 1, MMRT_DTYPE_F16, 0 }, /* empty rows */
    { 1, 1, 3, 1, { 4 }, { 9 }, 0, MMRT_DTYPE_F32, 0 },             /* odd D */
    { 2, 1, 16, 1, { 2 }, { 0 }, 0, MMRT_DTYPE_F32, 0 },            /* no keys */
    { 2, 1, 64, 1, { 130 }, { 130 }, 1, MMRT_DTYPE_F32, 0 },        /* several blocks */
    /* sliding windows on every path: decode (streaming), 3 queries, blocks */
    { 4, 2, 128, 1, { 1 }, { 37 }, 1, MMRT_DTYPE_F16, 6 },
    { 8, 1, 64, 1, { 3 }, { 50 }, 1, MMRT_DTYPE_F32, 2 },
    { 2, 1, 64, 1, { 130 }, { 130 }, 1, MMRT_DTYPE_F32, 17 },
    { 8, 2, 80, 2, { 33, 1 }, { 60, 9 }, 1, MMRT_DTYPE_F16, 1 },
    /* FP8 E4M3 K/V (ABI 1.6): decode (streaming), 3 queries, blocked with D not ÷ NR, a
     * window, empty rows */
    { 4, 2, 128, 1, { 1 }, { 37 }, 1, MMRT_DTYPE_F8E4M3, 0 },
    { 8, 1, 64, 1, { 3 }, { 50 }, 1, MMRT_DTYPE_F8E4M3, 0 },
    { 8, 2, 80, 1, { 33 }, { 33 }, 1, MMRT_DTYPE_F8E4M3, 0 },
    { 8, 2, 80, 2, { 33, 1 }, { 60, 9 }, 1, MMRT_DTYPE_F8E4M3, 5 },
    { 6, 3, 8, 4, { 3, 1, 0, 5 }, { 10, 1, 0, 2 }, 1, MMRT_DTYPE_F8E4M3, 0 },
};

/* ATTENTION on ac with K and V drawn rounded to value_dt but stored as ac->kv. */
static float *attention_case_dt(struct harness *h, const struct acase *ac,
                                enum mmrt_dtype value_dt, uint64_t seed, double **ref)
{
    int32_t cu_q[5] = { 0 }, cu_k[5] = { 0 };
    for (int s = 0; s < ac->n_seq; s++) {
        cu_q[s + 1] = cu_q[s] + ac->lq[s];
        cu_k[s + 1] = cu_k[s] + ac->lk[s];
    }
    int64_t T = cu_q[ac->n_seq], S = cu_k[ac->n_seq], Hq = ac->Hq, Hkv = ac->Hkv, D = ac->D;
    g_rng = seed;
    float *q = rand_vec(T * Hq * D, -1, 1, MMRT_DTYPE_F32);
    float *k = rand_vec(S * Hkv * D, -1, 1, value_dt), *v = rand_vec(S * Hkv * D, -1, 1, value_dt);
    struct harness_tensor tq = put(h, MMRT_DTYPE_F32, 3, (const int64_t[]){ T, Hq, D }, q);
    struct harness_tensor tk = put(h, ac->kv, 3, (const int64_t[]){ S, Hkv, D }, k);
    struct harness_tensor tv = put(h, ac->kv, 3, (const int64_t[]){ S, Hkv, D }, v);
    struct harness_tensor tcq = put(h, MMRT_DTYPE_I32, 1, (const int64_t[]){ ac->n_seq + 1 },
                                    (const float *)cu_q);
    struct harness_tensor tck = put(h, MMRT_DTYPE_I32, 1, (const int64_t[]){ ac->n_seq + 1 },
                                    (const float *)cu_k);
    struct harness_tensor ty;
    assert_int_equal(harness_tensor_new(h, MMRT_DTYPE_F32, 3, (const int64_t[]){ T, Hq, D }, &ty),
                     MMRT_OK);
    struct mmrt_attention_params p = { 1.0f / sqrtf((float)D), ac->causal, ac->n_seq,
                                       ac->window };
    struct harness_tensor *src[5] = { &tq, &tk, &tv, &tcq, &tck };
    assert_int_equal(harness_run(h, MMRT_OP_ATTENTION, src, 5, &ty, &p, sizeof p), MMRT_OK);
    float *y = get(h, &ty);
    if (ref) {
        *ref = malloc((size_t)(T * Hq * D + 1) * sizeof(double));
        assert_non_null(*ref);
        ref_attention(q, k, v, T, S, Hq, Hkv, D, cu_q, cu_k, ac->n_seq, p.scale, ac->causal,
                      ac->window, *ref);
    }
    struct harness_tensor *all[6] = { &tq, &tk, &tv, &tcq, &tck, &ty };
    for (int i = 0; i < 6; i++)
        harness_tensor_free(h, all[i]);
    free(q);
    free(k);
    free(v);
    return y;
}

static float *attention_case(struct harness *h, const struct acase *ac, uint64_t seed,
                             double **ref)
{
    return attention_case_dt(h, ac, ac->kv, seed, ref);
}

/* The same launch as attention_case(h, ac with kv = value_dt, seed) but with K and V stored
 * as ac->kv (the values value_dt holds, so F32 stores an exact copy). */
static float *attention_case_values_of(struct harness *h, const struct acase *ac,
                                       enum mmrt_dtype value_dt, uint64_t seed)
{
    return attention_case_dt(h, ac, value_dt, seed, NULL);
}

static int64_t attn_numel(const struct acase *ac)
{
    int64_t T = 0;
    for (int s = 0; s < ac->n_seq; s++)
        T += ac->lq[s];
    return T * ac->Hq * ac->D;
}

static void test_attention_all_isas(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness h;
        if (!open_isa(&h, isas[i], "3", false))
            continue;
        for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
            double *ref;
            float *y = attention_case(&h, &attn_cases[c], 50 + c, &ref);
            double e = rel_err(y, ref, attn_numel(&attn_cases[c]));
            if (!(e <= 1e-5))
                fail_msg("isa %s ATTENTION case %zu: error %.3g > 1e-5", isas[i], c, e);
            free(y);
            free(ref);
        }
        harness_close(&h);
    }
}

/* F16 and F8E4M3 K/V are widened exactly in registers (dot / axpy on the streaming path,
 * pack_w / pack_rows on the blocked one), so every ISA must give the bits it gives on an F32
 * copy of the same values: the narrow dtypes change what is stored, never the arithmetic. */
static void test_attention_narrow_kv_is_f32_copy_all_isas(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness h;
        if (!open_isa(&h, isas[i], "3", false))
            continue;
        for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
            if (attn_cases[c].kv == MMRT_DTYPE_F32)
                continue;
            struct acase as_f32 = attn_cases[c];
            as_f32.kv = MMRT_DTYPE_F32;
            /* The same draws (seed, rounding to the narrow dtype), stored once in that dtype
             * and once as their exact F32 copy. */
            float *narrow = attention_case(&h, &attn_cases[c], 70 + c, NULL);
            float *wide = attention_case_values_of(&h, &as_f32, attn_cases[c].kv, 70 + c);
            int64_t n = attn_numel(&attn_cases[c]);
            for (int64_t e = 0; e < n; e++)
                if (memcmp(&narrow[e], &wide[e], sizeof(float)) != 0)
                    fail_msg("isa %s ATTENTION case %zu (%s K/V): element %lld is %.9g, %.9g on "
                             "an F32 copy (must be the same bits)", isas[i], c,
                             mmrt_dtype_name_of(attn_cases[c].kv), (long long)e,
                             (double)narrow[e], (double)wide[e]);
            free(narrow);
            free(wide);
        }
        harness_close(&h);
    }
}

/* ---- activations ------------------------------------------------------------------------- */

static void test_activations_all_isas(void **state)
{
    (void)state;
    static const float specials[] = { 0.0f, -0.0f, 1e-3f, -1e-3f, 20.0f, -20.0f, 50.0f, -50.0f,
                                      88.0f, -88.0f, 100.0f, -100.0f, 1e30f, -1e30f };
    const int64_t n = 1037;
    g_rng = 3;
    float *x = rand_vec(n, -12, 12, MMRT_DTYPE_F32), *u = rand_vec(n, -2, 2, MMRT_DTYPE_F32);
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        x[3 + 61 * i] = specials[i];
    double *ref = malloc((size_t)n * sizeof(double));
    assert_non_null(ref);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness h;
        if (!open_isa(&h, isas[i], "3", false))
            continue;
        static const int ops[4] = { MMRT_OP_QUICK_GELU, MMRT_OP_SILU, MMRT_OP_GELU,
                                    MMRT_OP_SWIGLU };
        for (int o = 0; o < 4; o++) {
            struct harness_tensor tx = put(&h, MMRT_DTYPE_F32, 1, &n, x);
            struct harness_tensor tu = put(&h, MMRT_DTYPE_F32, 1, &n, u), ty;
            assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 1, &n, &ty), MMRT_OK);
            struct harness_tensor *src[2] = { &tx, &tu };
            assert_int_equal(harness_run(&h, ops[o], src, o == 3 ? 2 : 1, &ty, NULL, 0), MMRT_OK);
            float *y = get(&h, &ty);
            if (o == 3)
                ref_swiglu(x, u, n, ref);
            else
                ref_unary(ops[o], x, n, ref);
            double e = rel_err(y, ref, n);
            if (!(e <= 1e-6))
                fail_msg("isa %s op %d: error %.3g > 1e-6", isas[i], ops[o], e);
            for (int64_t k = 0; k < n; k++)
                if (!isfinite(y[k]))
                    fail_msg("isa %s op %d: element %lld (x = %g) is %g", isas[i], ops[o],
                             (long long)k, (double)x[k], (double)y[k]);
            free(y);
            harness_tensor_free(&h, &tx);
            harness_tensor_free(&h, &tu);
            harness_tensor_free(&h, &ty);
        }
        harness_close(&h);
    }
    free(ref);
    free(x);
    free(u);
}

/* ---- thread-count invariance per table ---------------------------------------------------- */

static void test_thread_invariance_all_isas(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness one, three;
        if (!open_isa(&one, isas[i], "1", false))
            continue;
        assert_true(open_isa(&three, isas[i], "3", false));
        static const int64_t shapes[][3] = { { 3, 700, 45 }, { 70, 300, 97 } };
        for (int s = 0; s < 2; s++) {
            int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
            float *a = matmul_case(&one, M, K, N, MMRT_DTYPE_F16, true, 11, NULL);
            float *b = matmul_case(&three, M, K, N, MMRT_DTYPE_F16, true, 11, NULL);
            assert_memory_equal(a, b, (size_t)(M * N) * sizeof(float));
            free(a);
            free(b);
        }
        for (int c = 0; c < 4; c++) {
            float *a = attention_case(&one, &attn_cases[c], 90, NULL);
            float *b = attention_case(&three, &attn_cases[c], 90, NULL);
            assert_memory_equal(a, b, (size_t)attn_numel(&attn_cases[c]) * sizeof(float));
            free(a);
            free(b);
        }
        harness_close(&one);
        harness_close(&three);
    }
}

/* ---- batch invariance of MATMUL rows ------------------------------------------------------- */

/* y = x[0..M) · Wᵀ + b on h, with W and b already on the device. */
static float *matmul_rows(struct harness *h, const float *x, int64_t M, int64_t K,
                          struct harness_tensor *tw, struct harness_tensor *tb, int64_t N)
{
    struct harness_tensor tx = put(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, K }, x), ty;
    assert_int_equal(harness_tensor_new(h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, N }, &ty),
                     MMRT_OK);
    struct harness_tensor *src[3] = { &tx, tw, tb };
    assert_int_equal(harness_run(h, MMRT_OP_MATMUL, src, 3, &ty, NULL, 0), MMRT_OK);
    float *y = get(h, &ty);
    harness_tensor_free(h, &tx);
    harness_tensor_free(h, &ty);
    return y;
}

/* A decode step over B sequences is one MATMUL with M = B rows; a sequence's logits must not
 * change with B. K = 2053 is not a multiple of 8 or 16 and spans five of the GEMV's K
 * chunks; N = 45 leaves edge blocks of 8, 4 and 1 W rows; 3 threads split the rows. */
static void test_row_invariance_all_isas(void **state)
{
    (void)state;
    const int64_t K = 2053, N = 45, MAX_M = 48;
    for (size_t iw = 0; iw < 2 * (sizeof isas / sizeof isas[0] + 1); iw++) {
        const size_t i = iw / 2;
        const char *widen = widens[iw % 2];
        bool bf16_dot = i == sizeof isas / sizeof isas[0];
        const char *isa = bf16_dot ? "avx512" : isas[i];
        struct harness h;
        if ((strcmp(isa, "portable") == 0 && iw % 2) ||
            !open_isa_widen(&h, isa, "3", bf16_dot, widen))
            continue;
        bool portable = strcmp(isa, "portable") == 0;
        for (int d = 0; d < 3; d++) {
            g_rng = 100 + (uint64_t)d;
            float *x = rand_vec(MAX_M * K, -1, 1, MMRT_DTYPE_F32);
            float *w = rand_vec(N * K, -1, 1, wdts[d]), *b = rand_vec(N, -1, 1, wdts[d]);
            struct harness_tensor tw = put(&h, wdts[d], 2, (const int64_t[]){ N, K }, w);
            struct harness_tensor tb = put(&h, wdts[d], 1, (const int64_t[]){ N }, b);
            float *alone = malloc((size_t)(MAX_M * N) * sizeof(float));
            assert_non_null(alone);
            for (int64_t r = 0; r < MAX_M; r++) {
                float *y = matmul_rows(&h, x + r * K, 1, K, &tw, &tb, N);
                memcpy(alone + r * N, y, (size_t)N * sizeof(float));
                free(y);
            }
            /* Rows of the blocked GEMM (M > 32), from the largest M. */
            float *big = matmul_rows(&h, x, MAX_M, K, &tw, &tb, N);
            for (int64_t M = 1; M <= ROW_INV_MAX_M + 1; M++) {
                float *y = matmul_rows(&h, x, M, K, &tw, &tb, N);
                const float *want = M <= ROW_INV_MAX_M || portable ? alone : big;
                for (int64_t r = 0; r < M; r++)
                    if (memcmp(y + r * N, want + r * N, (size_t)N * sizeof(float)) != 0)
                        fail_msg("isa %s%s gemv_widen=%s dtype %d: row %lld of M = %lld "
                                 "differs from %s", isa, bf16_dot ? " bf16_dot" : "", widen,
                                 (int)wdts[d], (long long)r, (long long)M,
                                 want == alone ? "M = 1" : "M = 48");
                free(y);
            }
            /* The two paths agree to the MATMUL tolerance (they differ only in order). */
            double *ref = malloc((size_t)N * sizeof(double));
            assert_non_null(ref);
            for (int64_t j = 0; j < N; j++)
                ref[j] = alone[(MAX_M - 1) * N + j];
            double e = rel_err(big + (MAX_M - 1) * N, ref, N);
            if (!(e <= (bf16_dot && wdts[d] == MMRT_DTYPE_BF16 ? BF16_DOT_TOL : 1e-5)))
                fail_msg("isa %s dtype %d: GEMV and blocked GEMM rows differ by %.3g", isa,
                         (int)wdts[d], e);
            free(ref);
            free(big);
            free(alone);
            harness_tensor_free(&h, &tw);
            harness_tensor_free(&h, &tb);
            free(x);
            free(w);
            free(b);
        }
        harness_close(&h);
    }
}

/* ---- bf16 dot products -------------------------------------------------------------------- */

/* Blocked-GEMM shapes (M > 32) where the bf16 units' tiles meet edges: one row past a 32-row
 * panel, odd K (a half pair), K blocks of 512 with a 76-value tail (AMX pads it to 48 pairs),
 * N past a 32-column tile, more rows than one row block (CPU_GEMM_MC = 768). */
static const int64_t bf16_cases[][3] = { /* M, K, N */
    { 33, 1100, 37 }, { 64, 257, 96 }, { 37, 31, 19 }, { 45, 1, 70 }, { 800, 40, 33 },
    { 96, 512, 32 }, { 50, 1025, 5 },
};

/* What the AMX unit computes (the instruction set reference's TDPBF16PS, as the emulator does
 * it): for each output one f32 sum over k in order, each term bf16(x)·bf16(w) with denormal
 * inputs read as zero (exact in f32), then the bias. Padding adds exact zeros and a K block's
 * sum is stored and reloaded exactly, so the GEMM is bit-for-bit this loop. */
static float daz_bf16(float v)
{
    float r = mmrt_bf16_to_f32(mmrt_f32_to_bf16(v));
    return fpclassify(r) == FP_SUBNORMAL ? copysignf(0.0f, r) : r;
}

static float *amx_model(int64_t M, int64_t K, int64_t N, bool bias, uint64_t seed)
{
    g_rng = seed; /* the draws of matmul_case */
    float *x = rand_vec(M * K, -1, 1, MMRT_DTYPE_F32), *w = rand_vec(N * K, -1, 1, MMRT_DTYPE_BF16);
    float *b = bias ? rand_vec(N, -1, 1, MMRT_DTYPE_BF16) : NULL;
    float *y = malloc((size_t)(M * N) * sizeof(float));
    assert_non_null(y);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                float t = daz_bf16(x[m * K + k]) * daz_bf16(w[n * K + k]);
                acc += t;
            }
            y[m * N + n] = b ? acc + b[n] : acc;
        }
    free(x);
    free(w);
    free(b);
    return y;
}

/* One bf16 unit (plugin file and bf16_dot value): the MATMUL cases against the reference
 * within BF16_DOT_TOL (f32 paths within 1e-5) and thread-count invariance. With model_tol 0
 * every blocked-GEMM output is bit for bit amx_model's; above 0, within model_tol of the
 * case's largest |output| (the real tiles, see test_bf16_dot); below 0 the model is not asked.
 * Returns false when the unit is refused. */
static bool bf16_unit_checks(const char *path, const char *value, double model_tol)
{
    struct harness h;
    struct mmrt_option opts[3] = { { "isa", "avx512" }, { "threads", "3" }, { "bf16_dot", value } };
    if (harness_open(&h, path, opts, 3) != MMRT_OK)
        return false;
    double worst = 0, model_worst = 0;
    for (size_t c = 0; c < sizeof mm_cases / sizeof mm_cases[0] + sizeof bf16_cases /
                                                                     sizeof bf16_cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            size_t nm = sizeof mm_cases / sizeof mm_cases[0];
            const int64_t *sh = c < nm ? mm_cases[c] : bf16_cases[c - nm];
            int64_t M = sh[0], K = sh[1], N = sh[2];
            double *ref;
            float *y = matmul_case(&h, M, K, N, wdts[d], c % 2, 21 + c, &ref);
            double e = rel_err(y, ref, M * N);
            /* Only BF16 weights in the blocked GEMM take the bf16 path; the rest keep the
             * accurate tolerance. */
            bool bf = wdts[d] == MMRT_DTYPE_BF16 && M > ROW_INV_MAX_M && K > 0;
            if (!(e <= (bf ? BF16_DOT_TOL : 1e-5)))
                fail_msg("bf16_dot=%s MATMUL M=%lld K=%lld N=%lld dtype %d: error %.3g", value,
                         (long long)M, (long long)K, (long long)N, (int)wdts[d], e);
            if (bf && e > worst)
                worst = e;
            if (bf && model_tol >= 0) {
                float *want = amx_model(M, K, N, c % 2, 21 + c);
                double top = 0;
                for (int64_t i = 0; i < M * N; i++)
                    top = fmax(top, fabs((double)want[i]));
                for (int64_t i = 0; i < M * N; i++) {
                    double diff = fabs((double)y[i] - (double)want[i]);
                    if (diff > model_worst * top)
                        model_worst = diff / top;
                    if (model_tol == 0 ? memcmp(&y[i], &want[i], sizeof(float)) != 0
                                       : !(diff <= model_tol * top))
                        fail_msg("bf16_dot=%s M=%lld K=%lld N=%lld: output (%lld, %lld) is %.9g, "
                                 "the tile arithmetic gives %.9g", value, (long long)M,
                                 (long long)K, (long long)N, (long long)(i / N),
                                 (long long)(i % N), y[i], want[i]);
                }
                free(want);
            }
            free(y);
            free(ref);
        }
    print_message("bf16_dot=%s (%s): worst MATMUL error %.3g of max |ref| (f32 path: ≤ 1e-5)\n",
                  value, strstr(path, "amxemu") ? "emulated AMX" : "cpu", worst);
    if (model_tol >= 0)
        print_message("bf16_dot=%s (%s): worst distance from the tile model %.3g of max |model|\n",
                      value, strstr(path, "amxemu") ? "emulated AMX" : "cpu", model_worst);
    /* Thread-count invariance holds for the bf16 path too. */
    struct harness one;
    opts[1].value = "1";
    assert_int_equal(harness_open(&one, path, opts, 3), MMRT_OK);
    float *a = matmul_case(&one, 70, 300, 97, MMRT_DTYPE_BF16, true, 5, NULL);
    float *b = matmul_case(&h, 70, 300, 97, MMRT_DTYPE_BF16, true, 5, NULL);
    assert_memory_equal(a, b, 70 * 97 * sizeof(float));
    free(a);
    free(b);
    harness_close(&one);
    harness_close(&h);
    return true;
}

/* The tiles' inputs are amx_model's, but real TDPBF16PS does not add its 32 products to the
 * sum one at a time as the instruction set reference's pseudo-code (and so the emulated twin)
 * does: on Sapphire Rapids it adds them with more precision first, dropping the bits of terms
 * far below the largest (docs/BENCHMARKS.md, 2026-12-07). Real tiles are therefore held to the
 * model within 1e-5 of the largest output, as tight as the f32 paths are held to the exact
 * product (measured 4.3e-7); a lost or misplaced k term is orders of magnitude above it. */
#define AMX_MODEL_TOL 1e-5

/* Both units on this CPU where it has them: bf16_dot = avx512 (vdpbf16ps), amx (tiles). */
static void test_bf16_dot(void **state)
{
    (void)state;
    if (!bf16_unit_checks(harness_plugin_path("cpu"), "avx512", -1))
        print_message("bf16_dot=avx512: this CPU lacks AVX512_BF16; skipped\n");
    if (!bf16_unit_checks(harness_plugin_path("cpu"), "amx", AMX_MODEL_TOL))
        print_message("bf16_dot=amx: no AMX here (the plugin's refusal is above); skipped\n");
}

/* The AMX unit on any CPU with the avx512 table: the test-only plugin whose tile operations
 * are plain C (plugins/cpu/cpu_kern_amx.c, CPU_AMX_EMULATE), held bit for bit to amx_model,
 * so the packing, the zero padding and the tile walk are right before a CPU with AMX runs
 * them. bf16_dot = 1 picks it there, as it picks real tiles on such a CPU. */
static void test_bf16_amx_emulated(void **state)
{
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/test-plugins/libmmrt_cpu_amxemu.so",
             getenv("MMRT_BUILD_DIR") ? getenv("MMRT_BUILD_DIR") : "build");
    if (access(path, R_OK) != 0) {
        print_message("emulated AMX: %s not built (the compiler lacks -mamx-tile); skipped\n",
                      path);
        return;
    }
    if (!bf16_unit_checks(path, "amx", 0)) {
        print_message("emulated AMX: needs the avx512 kernels, which this CPU lacks; skipped\n");
        return;
    }
    assert_true(bf16_unit_checks(path, "1", 0));
}

/* The BF16 GEMV on AMX tiles (device option amx_gemv = 1) through one plugin file: returns
 * false when the plugin refuses it. K = 3000 ends in a partial 32-column chunk and N = 45 in
 * a block of 13 W rows, so both zero-padded stages run; from 27 rows on its 94 chunks are
 * taken in two ranges (cpu_kern_amx.c, GV_RANGE_KIB); 3 threads split the blocks. Checked:
 * every row of every M ≤ 32 bit for bit its M = 1 result (the GEMV contract), the same bits
 * with one thread, and the error against the exact product no worse than the f32 GEMV's (the
 * same plugin with amx_gemv = 0) — the split of x into three bf16 parts is exact, so only
 * the sums round. The emulated twin sums each tile column in one f32 chain, as the SDM's
 * pseudo-code says, which is coarser than the GEMV's 16 lanes (and than real tiles): it is
 * held to the f32 paths' MATMUL tolerance instead (emulated). */
static bool amx_gemv_checks(const char *path, const char *label, bool emulated)
{
    const int64_t K = 3000, N = 45, MAX_M = 33;
    struct mmrt_option on[3] = { { "isa", "avx512" }, { "threads", "3" }, { "amx_gemv", "1" } };
    struct harness h, f32, one;
    if (harness_open(&h, path, on, 3) != MMRT_OK)
        return false;
    on[2].value = "0";
    assert_int_equal(harness_open(&f32, path, on, 3), MMRT_OK);
    on[1].value = "1";
    on[2].value = "1";
    assert_int_equal(harness_open(&one, path, on, 3), MMRT_OK);
    g_rng = 4242;
    float *x = rand_vec(MAX_M * K, -1, 1, MMRT_DTYPE_F32);
    float *w = rand_vec(N * K, -1, 1, MMRT_DTYPE_BF16), *b = rand_vec(N, -1, 1, MMRT_DTYPE_BF16);
    /* a row of tiny and huge values too: the parts must stay exact across the range */
    for (int64_t k = 0; k < K; k++)
        x[2 * K + k] *= k % 3 == 0 ? 1e-30f : k % 3 == 1 ? 1e30f : 1.0f;
    struct harness_tensor tw[3], tb[3];
    struct harness *hs[3] = { &h, &f32, &one };
    for (int i = 0; i < 3; i++) {
        tw[i] = put(hs[i], MMRT_DTYPE_BF16, 2, (const int64_t[]){ N, K }, w);
        tb[i] = put(hs[i], MMRT_DTYPE_BF16, 1, (const int64_t[]){ N }, b);
    }
    float *alone = malloc((size_t)(MAX_M * N) * sizeof(float));
    assert_non_null(alone);
    double worst = 0, worst_f32 = 0;
    for (int64_t r = 0; r < MAX_M; r++) {
        float *y = matmul_rows(&h, x + r * K, 1, K, &tw[0], &tb[0], N);
        float *yf = matmul_rows(&f32, x + r * K, 1, K, &tw[1], &tb[1], N);
        memcpy(alone + r * N, y, (size_t)N * sizeof(float));
        double ref[45];
        for (int64_t n = 0; n < N; n++) {
            double acc = b[n];
            for (int64_t k = 0; k < K; k++)
                acc += (double)x[r * K + k] * (double)w[n * K + k];
            ref[n] = acc;
        }
        worst = fmax(worst, rel_err(y, ref, N));
        worst_f32 = fmax(worst_f32, rel_err(yf, ref, N));
        free(y);
        free(yf);
    }
    print_message("amx_gemv=1 (%s): worst error against the exact product %.3g of max |exact|, "
                  "the f32 GEMV's %.3g\n", label, worst, worst_f32);
    if (!(worst <= (emulated ? 1e-5 : 2 * worst_f32 + 1e-7)))
        fail_msg("amx_gemv (%s): error %.3g against the f32 GEMV's %.3g", label, worst,
                 worst_f32);
    for (int64_t M = 2; M <= MAX_M; M++) {
        float *y = matmul_rows(&h, x, M, K, &tw[0], &tb[0], N);
        for (int64_t r = 0; M <= ROW_INV_MAX_M && r < M; r++)
            if (memcmp(y + r * N, alone + r * N, (size_t)N * sizeof(float)) != 0)
                fail_msg("amx_gemv (%s): row %lld of M = %lld differs from M = 1", label,
                         (long long)r, (long long)M);
        if (M == 17 || M == ROW_INV_MAX_M) {
            float *y1 = matmul_rows(&one, x, M, K, &tw[2], &tb[2], N);
            assert_memory_equal(y, y1, (size_t)(M * N) * sizeof(float));
            free(y1);
        }
        free(y);
    }
    free(alone);
    for (int i = 0; i < 3; i++) {
        harness_tensor_free(hs[i], &tw[i]);
        harness_tensor_free(hs[i], &tb[i]);
        harness_close(hs[i]);
    }
    free(x);
    free(w);
    free(b);
    return true;
}

static void test_amx_gemv(void **state)
{
    (void)state;
    if (!amx_gemv_checks(harness_plugin_path("cpu"), "cpu", false))
        print_message("amx_gemv=1: no AMX here (the plugin's refusal is above); skipped\n");
    char path[4200];
    snprintf(path, sizeof path, "%s/test-plugins/libmmrt_cpu_amxemu.so",
             getenv("MMRT_BUILD_DIR") ? getenv("MMRT_BUILD_DIR") : "build");
    if (access(path, R_OK) != 0)
        print_message("emulated AMX: %s not built; skipped\n", path);
    else if (!amx_gemv_checks(path, "emulated AMX", true))
        print_message("emulated AMX: needs the avx512 kernels, which this CPU lacks; skipped\n");
}

static void test_option_refusals(void **state)
{
    (void)state;
    struct harness h;
    assert_int_equal(harness_open(&h, harness_plugin_path("cpu"), NULL, 0), MMRT_OK);
    static const struct { const char *key, *value, *needle; } bad[] = {
        { "isa", "sse9", "isa=\"sse9\"" },
        { "isa", "", "isa=\"\"" },
        { "bf16_dot", "2", "bf16_dot=\"2\"" },
        { "bf16_dot", "yes", "expected 0, 1, amx or avx512" },
        { "int8_dot", "2", "int8_dot=\"2\": expected auto, 0, 1 or 3" },
        { "prefetch", "l3", "prefetch=\"l3\": expected auto, l1 or l2" },
        { "amx_gemv", "2", "amx_gemv=\"2\": expected 0 or 1" },
        { "amx_gemv", "auto", "amx_gemv=\"auto\": expected 0 or 1" },
        { "amx_gemv", "", "amx_gemv=\"\": expected 0 or 1" },
        { "gemv_widen", "regs", "gemv_widen=\"regs\": expected auto, buffer or registers" },
        { "gemv_widen", "", "gemv_widen=\"\": expected auto, buffer or registers" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct mmrt_option o = { bad[i].key, bad[i].value };
        struct mmrt_device *d = NULL;
        char err[256] = "";
        assert_int_equal(h.plugin->device_open(0, &o, 1, &d, err, sizeof err), MMRT_ERR_CONFIG);
        assert_null(d);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s=%s: message \"%s\" lacks \"%s\"", bad[i].key, bad[i].value, err,
                     bad[i].needle);
    }
    struct mmrt_option twice[2] = { { "isa", "portable" }, { "isa", "portable" } };
    struct mmrt_device *d = NULL;
    char err[256] = "";
    assert_int_equal(h.plugin->device_open(0, twice, 2, &d, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "twice"));
    /* bf16_dot with the portable table is refused, naming what it needs. */
    struct mmrt_option pb[2] = { { "isa", "portable" }, { "bf16_dot", "1" } };
    assert_int_equal(h.plugin->device_open(0, pb, 2, &d, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "bf16_dot=1 needs the avx512 kernels"));
    pb[1] = (struct mmrt_option){ "amx_gemv", "1" };
    assert_int_equal(h.plugin->device_open(0, pb, 2, &d, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "amx_gemv=1: it needs the avx512 kernels (isa: portable)"));
    struct mmrt_option pi[2] = { { "isa", "portable" }, { "int8_dot", "1" } };
    assert_int_equal(h.plugin->device_open(0, pi, 2, &d, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "int8_dot=1 needs the avx2 or avx512 kernels"));
    pi[1].value = "3";
    assert_int_equal(h.plugin->device_open(0, pi, 2, &d, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "int8_dot=3 needs the avx2 or avx512 kernels"));
    /* auto is the default's name: none with the portable table, three digits elsewhere */
    pi[1].value = "auto";
    assert_int_equal(h.plugin->device_open(0, pi, 2, &d, err, sizeof err), MMRT_OK);
    h.plugin->device_close(d);
    d = NULL;
    pi[0].value = "avx2";
    if (h.plugin->device_open(0, pi, 2, &d, err, sizeof err) == MMRT_OK) {
        struct mmrt_device_info info = { .hdr = { .struct_size = sizeof info } };
        assert_int_equal(h.plugin->device_info(d, &info), MMRT_OK);
        /* the unit's name ends there: a prefetch or another choice may follow */
        const char *u = strstr(info.name, "+int8_dot=3:avx2");
        const char next = u ? u[strlen("+int8_dot=3:avx2")] : '\0';
        if (!next || !strchr("]/+", next))
            fail_msg("isa avx2 int8_dot=auto: device name \"%s\"", info.name);
        h.plugin->device_close(d);
        d = NULL;
    }
    /* bf16_dot = amx where the tiles are not usable names the reason (CPU, OS or kernel). */
    struct mmrt_option amx = { "bf16_dot", "amx" };
    err[0] = '\0';
    mmrt_status st = h.plugin->device_open(0, &amx, 1, &d, err, sizeof err);
    if (st == MMRT_OK) {
        h.plugin->device_close(d);
        d = NULL;
    } else {
        assert_int_equal(st, MMRT_ERR_CONFIG);
        if (!strstr(err, "bf16_dot=amx") || !(strstr(err, "AMX") || strstr(err, "avx512")))
            fail_msg("bf16_dot=amx refused without a reason: \"%s\"", err);
    }
    harness_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_all_isas),
        cmocka_unit_test(test_matmul_i8_all_isas),
        cmocka_unit_test(test_matmul_u4_all_isas),
        cmocka_unit_test(test_matmul_u4_empty_k),
        cmocka_unit_test(test_matmul_u4_int8_dot),
        cmocka_unit_test(test_attention_all_isas),
        cmocka_unit_test(test_attention_narrow_kv_is_f32_copy_all_isas),
        cmocka_unit_test(test_activations_all_isas),
        cmocka_unit_test(test_thread_invariance_all_isas),
        cmocka_unit_test(test_row_invariance_all_isas),
        cmocka_unit_test(test_bf16_dot),
        cmocka_unit_test(test_bf16_amx_emulated),
        cmocka_unit_test(test_amx_gemv),
        cmocka_unit_test(test_option_refusals),
    };
    return cmocka_run_group_tests_name("cpu_isa", tests, NULL, NULL);
}
