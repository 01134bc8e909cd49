/*
 * tests/test_cpu_ops.c — the CPU reference plugin (libmmrt_cpu.so) driven directly through
 * plugin.h: every operator against the double-precision reference in ref_ops.c, its error
 * paths, and the device functions (options, info, arenas, transfers, ABI refusal).
 *
 * Inputs are random with fixed seeds, over shapes chosen to hit odd and prime sizes, size 1,
 * K off every block size, strided views, in-place runs and every weight dtype. Values the
 * device stores in F16/BF16 are rounded on the host first, so the reference sees the same
 * numbers. Closeness is measured as max |got − ref| / max |ref| over a case and held to a
 * per-op tolerance stated at each test. Cells a view must not read are filled with NaN, so an
 * out-of-view read poisons the result instead of passing unnoticed.
 *
 * The device under test runs 3 worker threads (odd on purpose, so splits are uneven);
 * test_thread_count_invariance checks that 1 thread gives bit-identical results.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_cases.h"
#include "plugin_harness.h"
#include "ref_ops.h"

static struct harness H;

/* ---- the helpers of op_cases.h, on the one device under test ---------------------------- */

static struct harness_tensor *tnew(enum mmrt_dtype dt, int n_dims, const int64_t *ne)
{
    return op_tensor_new(&H, dt, n_dims, ne);
}

/* Rounds v to t's dtype (so the caller's reference sees the device's values) and uploads. */
static void upload(struct harness_tensor *t, float *v)
{
    int64_t n = op_numel(t);
    op_round_to((enum mmrt_dtype)t->t.dtype, v, n);
    assert_int_equal(harness_upload(&H, t, op_encode((enum mmrt_dtype)t->t.dtype, v, n)), MMRT_OK);
}

/* A new contiguous tensor holding random values in [lo, hi), rounded; *host gets them. */
static struct harness_tensor *trand(enum mmrt_dtype dt, float lo, float hi, float **host,
                                    int n_dims, const int64_t *ne)
{
    struct harness_tensor *t = tnew(dt, n_dims, ne);
    float *v = op_rand_f(op_numel(t), lo, hi);
    upload(t, v);
    *host = v;
    return t;
}

static void upload_i32(struct harness_tensor *t, const int32_t *v)
{
    assert_int_equal(harness_upload(&H, t, v), MMRT_OK);
}

static struct harness_tensor *tnew_i32(const int32_t *v, int64_t n)
{
    struct harness_tensor *t = tnew(MMRT_DTYPE_I32, SHAPE(n));
    upload_i32(t, v);
    return t;
}

static float *download_f32(struct harness_tensor *t)
{
    float *v = op_alloc((size_t)t->nbytes);
    assert_int_equal(harness_download(&H, t, v), MMRT_OK);
    return v;
}

static mmrt_status run(enum mmrt_op op, struct harness_tensor *const *src, int n_src,
                       struct harness_tensor *dst, const void *params, uint32_t params_size)
{
    return harness_run(&H, op, src, n_src, dst, params, params_size);
}

/* ---- MATMUL: tolerance 1e-5 (f32 accumulation over K ≤ 4099) -------------------------- */

static void test_matmul(void **state)
{
    (void)state;
    static const int64_t cases[][3] = { /* M, K, N */
        { 1, 1, 1 },   { 1, 13, 7 },   { 3, 8, 5 },     { 17, 65, 33 },  { 64, 257, 96 },
        { 5, 1000, 130 }, { 2, 4099, 3 }, { 33, 256, 16 }, { 1, 300, 513 }, { 2, 0, 3 },
        { 37, 31, 19 },
    };
    op_rng_seed(1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            int64_t M = cases[c][0], K = cases[c][1], N = cases[c][2];
            enum mmrt_dtype wdt = op_weight_dtypes[d];
            int bias_mode = (int)((c + (size_t)d) % 3); /* none, W's dtype, F32 */
            float *x, *w, *b = NULL;
            struct harness_tensor *tx = trand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
            struct harness_tensor *tw = trand(wdt, -1, 1, &w, SHAPE(N, K));
            struct harness_tensor *tb = NULL;
            if (bias_mode)
                tb = trand(bias_mode == 1 ? wdt : MMRT_DTYPE_F32, -1, 1, &b, SHAPE(N));
            struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(M, N));
            struct harness_tensor *src[3] = { tx, tw, tb };
            assert_int_equal(run(MMRT_OP_MATMUL, src, tb ? 3 : 2, ty, NULL, 0), MMRT_OK);
            double *ref = op_ref_buf(M * N);
            ref_matmul(x, w, b, M, K, N, ref);
            char what[128];
            snprintf(what, sizeof what, "MATMUL M=%lld K=%lld N=%lld W %s bias %d", (long long)M,
                     (long long)K, (long long)N, mmrt_dtype_name_of(wdt), bias_mode);
            op_check_close(what, download_f32(ty), ref, M * N, 1e-5);
            op_release_all();
        }

    /* x with more than two dims: rows are everything but the last dim. */
    float *x, *w;
    struct harness_tensor *tx = trand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(2, 3, 40));
    struct harness_tensor *tw = trand(MMRT_DTYPE_BF16, -1, 1, &w, SHAPE(9, 40));
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(2, 3, 9));
    struct harness_tensor *src[2] = { tx, tw };
    assert_int_equal(run(MMRT_OP_MATMUL, src, 2, ty, NULL, 0), MMRT_OK);
    double *ref = op_ref_buf(6 * 9);
    ref_matmul(x, w, NULL, 6, 40, 9, ref);
    op_check_close("MATMUL x [2, 3, 40]", download_f32(ty), ref, 6 * 9, 1e-5);
    op_release_all();
}

/* ---- MATMUL with I8 weights (plugin.h): tolerance 1e-5 against the dequantized weights -----
 * Shapes on both sides of the GEMV/GEMM line (M ≤ 32 / M > 32), K tails of every width, rows
 * of different scales and zero rows; every row of an M ≤ 32 launch bit-identical to the same
 * row launched alone (continuous batching relies on it, as for the float weights); the
 * launches the contract forbids refused. */

static struct harness_tensor *tq8(int64_t N, int64_t K, struct op_qmatrix *qm,
                                  struct harness_tensor **scales)
{
    op_quantize_i8(N, K, 2.0f, qm);
    struct harness_tensor *t = tnew(MMRT_DTYPE_I8, SHAPE(N, K));
    assert_int_equal(harness_upload(&H, t, qm->q), MMRT_OK);
    *scales = tnew(MMRT_DTYPE_F32, SHAPE(N));
    assert_int_equal(harness_upload(&H, *scales, qm->scale), MMRT_OK);
    return t;
}

static void test_matmul_i8(void **state)
{
    (void)state;
    static const int64_t cases[][3] = { /* M, K, N */
        { 1, 1, 1 },    { 1, 13, 7 },     { 3, 8, 5 },    { 17, 65, 33 }, { 64, 257, 96 },
        { 5, 1000, 130 }, { 2, 4099, 3 }, { 33, 256, 16 }, { 1, 300, 513 }, { 32, 72, 40 },
        { 37, 31, 19 }, { 100, 130, 70 },
    };
    op_rng_seed(11);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t M = cases[c][0], K = cases[c][1], N = cases[c][2];
        int bias_mode = (int)(c % 3); /* none, F16, F32 */
        float *x, *b = NULL;
        struct op_qmatrix qm;
        struct harness_tensor *ts, *tx = trand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        struct harness_tensor *tw = tq8(N, K, &qm, &ts), *tb = NULL;
        if (bias_mode)
            tb = trand(bias_mode == 1 ? MMRT_DTYPE_F16 : MMRT_DTYPE_F32, -1, 1, &b, SHAPE(N));
        struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(M, N));
        struct harness_tensor *src[4] = { tx, tw, tb, ts };
        assert_int_equal(run(MMRT_OP_MATMUL, src, 4, ty, NULL, 0), MMRT_OK);
        double *ref = op_ref_buf(M * N);
        ref_matmul(x, qm.deq, b, M, K, N, ref);
        char what[128];
        snprintf(what, sizeof what, "MATMUL I8 M=%lld K=%lld N=%lld bias %d", (long long)M,
                 (long long)K, (long long)N, bias_mode);
        const float *y = download_f32(ty);
        op_check_close(what, y, ref, M * N, 1e-5);
        if (M > 1 && M <= 32) { /* the small-M path: each row as if alone */
            for (int64_t m = 0; m < M; m += M - 1) {
                struct harness_tensor *x1 = tnew(MMRT_DTYPE_F32, SHAPE(1, K));
                assert_int_equal(harness_upload(&H, x1, x + m * K), MMRT_OK);
                struct harness_tensor *y1 = tnew(MMRT_DTYPE_F32, SHAPE(1, N));
                struct harness_tensor *s1[4] = { x1, tw, tb, ts };
                assert_int_equal(run(MMRT_OP_MATMUL, s1, 4, y1, NULL, 0), MMRT_OK);
                const float *got = download_f32(y1);
                for (int64_t n = 0; n < N; n++)
                    if (memcmp(&got[n], &y[m * N + n], sizeof(float)) != 0)
                        fail_msg("%s: row %lld alone gave %.9g at column %lld, %.9g in the "
                                 "batch", what, (long long)m, (double)got[n], (long long)n,
                                 (double)y[m * N + n]);
            }
        }
        op_release_all();
    }

    /* What the contract refuses: an I8 W without scales, scales with a float W, scales of the
     * wrong length or dtype. */
    float *x, *wf;
    struct op_qmatrix qm;
    struct harness_tensor *ts, *tx = trand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(2, 16));
    struct harness_tensor *tw = tq8(8, 16, &qm, &ts);
    struct harness_tensor *twf = trand(MMRT_DTYPE_F16, -1, 1, &wf, SHAPE(8, 16));
    struct harness_tensor *short_s = tnew(MMRT_DTYPE_F32, SHAPE(7));
    struct harness_tensor *f16_s = tnew(MMRT_DTYPE_F16, SHAPE(8));
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(2, 8));
    struct harness_tensor *no_s[2] = { tx, tw }, *float_s[4] = { tx, twf, NULL, ts },
                          *bad_n[4] = { tx, tw, NULL, short_s }, *bad_t[4] = { tx, tw, NULL, f16_s };
    assert_int_equal(run(MMRT_OP_MATMUL, no_s, 2, ty, NULL, 0), MMRT_ERR_INVALID_ARG);
    assert_int_equal(run(MMRT_OP_MATMUL, float_s, 4, ty, NULL, 0), MMRT_ERR_INVALID_ARG);
    assert_int_equal(run(MMRT_OP_MATMUL, bad_n, 4, ty, NULL, 0), MMRT_ERR_INVALID_ARG);
    assert_int_equal(run(MMRT_OP_MATMUL, bad_t, 4, ty, NULL, 0), MMRT_ERR_INVALID_ARG);
    op_release_all();
}

/* ---- ADD, MUL: tolerance 1e-6 (one rounding per element) ------------------------------ */

static void test_add_mul(void **state)
{
    (void)state;
    static const int64_t cases[][2] = { { 1, 1 }, { 7, 13 }, { 64, 257 }, { 3, 1000 }, { 1, 4099 } };
    op_rng_seed(2);
    for (int op = MMRT_OP_ADD; op <= MMRT_OP_MUL; op++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int mode = 0; mode < 6; mode++) {
                /* 0: same shape F32; 1: same shape F16; 2-4: broadcast row F32/F16/BF16;
                 * 5: same shape, in place (dst == src0). */
                int64_t R = cases[c][0], N = cases[c][1];
                bool bcast = mode >= 2 && mode <= 4;
                enum mmrt_dtype bdt = mode == 1 ? MMRT_DTYPE_F16
                                      : bcast   ? op_weight_dtypes[mode - 2]
                                                : MMRT_DTYPE_F32;
                float *a, *b;
                struct harness_tensor *ta = trand(MMRT_DTYPE_F32, -4, 4, &a, SHAPE(R, N));
                struct harness_tensor *tb = bcast ? trand(bdt, -4, 4, &b, SHAPE(N))
                                                  : trand(bdt, -4, 4, &b, SHAPE(R, N));
                struct harness_tensor *ty = mode == 5 ? ta : tnew(MMRT_DTYPE_F32, SHAPE(R, N));
                struct harness_tensor *src[2] = { ta, tb };
                assert_int_equal(run(op, src, 2, ty, NULL, 0), MMRT_OK);
                double *ref = op_ref_buf(R * N);
                ref_binary(a, b, R * N, bcast ? N : R * N, op == MMRT_OP_MUL, ref);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d",
                         op == MMRT_OP_ADD ? "ADD" : "MUL", (long long)R, (long long)N, mode);
                op_check_close(what, download_f32(ty), ref, R * N, 1e-6);
                op_release_all();
            }

    /* A 3-D src0 with a one-row [1, N] src1 of its own rank. */
    float *a, *b;
    struct harness_tensor *ta = trand(MMRT_DTYPE_F32, -1, 1, &a, SHAPE(2, 5, 11));
    struct harness_tensor *tb = trand(MMRT_DTYPE_F32, -1, 1, &b, SHAPE(1, 1, 11));
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(2, 5, 11));
    struct harness_tensor *src[2] = { ta, tb };
    assert_int_equal(run(MMRT_OP_ADD, src, 2, ty, NULL, 0), MMRT_OK);
    double *ref = op_ref_buf(110);
    ref_binary(a, b, 110, 11, 0, ref);
    op_check_close("ADD [2, 5, 11] + [1, 1, 11]", download_f32(ty), ref, 110, 1e-6);
    op_release_all();
}

/* ---- SCALE: tolerance 1e-6 ------------------------------------------------------------ */

static void test_scale(void **state)
{
    (void)state;
    static const int64_t sizes[] = { 1, 7, 1024, 100003 };
    static const float scales[] = { 0.125f, -3.5f, 0.0f };
    op_rng_seed(3);
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++)
        for (size_t s = 0; s < 3; s++)
            for (int in_place = 0; in_place < 2; in_place++) {
                int64_t n = sizes[c];
                float *a;
                struct harness_tensor *ta = trand(MMRT_DTYPE_F32, -10, 10, &a, SHAPE(n));
                struct harness_tensor *ty = in_place ? ta : tnew(MMRT_DTYPE_F32, SHAPE(n));
                struct mmrt_scale_params p = { scales[s] };
                struct harness_tensor *src[1] = { ta };
                assert_int_equal(run(MMRT_OP_SCALE, src, 1, ty, &p, sizeof p), MMRT_OK);
                double *ref = op_ref_buf(n);
                for (int64_t i = 0; i < n; i++)
                    ref[i] = (double)a[i] * scales[s];
                op_check_close("SCALE", download_f32(ty), ref, n, 1e-6);
                op_release_all();
            }
}

/* ---- activations: tolerance 1e-6 (f32 libm is within a few ulp) ----------------------- */

static void test_unary(void **state)
{
    (void)state;
    static const int ops[] = { MMRT_OP_GELU, MMRT_OP_GELU_TANH, MMRT_OP_QUICK_GELU,
                               MMRT_OP_SILU, MMRT_OP_RELU2 };
    static const char *const names[] = { "GELU", "GELU_TANH", "QUICK_GELU", "SILU", "RELU2" };
    static const float specials[] = { 0.0f, -0.0f, 1e-3f, -1e-3f, 20.0f, -20.0f, 50.0f,
                                      -50.0f, -100.0f, 3.0f, -3.0f };
    const int64_t n_special = sizeof specials / sizeof specials[0];
    op_rng_seed(4);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int in_place = 0; in_place < 2; in_place++) {
            int64_t n = 4099;
            float *a = op_rand_f(n, -8, 8);
            memcpy(a, specials, sizeof specials);
            struct harness_tensor *ta = tnew(MMRT_DTYPE_F32, SHAPE(1, n));
            upload(ta, a);
            struct harness_tensor *ty = in_place ? ta : tnew(MMRT_DTYPE_F32, SHAPE(1, n));
            struct harness_tensor *src[1] = { ta };
            assert_int_equal(run(ops[o], src, 1, ty, NULL, 0), MMRT_OK);
            double *ref = op_ref_buf(n);
            ref_unary(ops[o], a, n, ref);
            float *got = download_f32(ty);
            op_check_close(names[o], got, ref, n, 1e-6);
            /* Far tails reach their limits without overflow to NaN: below 1e-15 at −50 and
             * under (−0 once e^(−x) overflows), exactly x from 20 up. */
            for (int64_t i = 0; i < n_special; i++) {
                if (ops[o] != MMRT_OP_RELU2 && specials[i] <= -50.0f)
                    assert_true(fabsf(got[i]) < 1e-15f);
                if (specials[i] >= 20.0f && ops[o] != MMRT_OP_RELU2)
                    assert_true(got[i] == specials[i]);
            }
            op_release_all();
        }
}

/* ---- SWIGLU: tolerance 1e-6 ----------------------------------------------------------- */

static void test_swiglu(void **state)
{
    (void)state;
    static const int64_t cases[][2] = { { 1, 1 }, { 3, 37 }, { 16, 688 } };
    op_rng_seed(5);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int in_place = 0; in_place < 2; in_place++) {
            int64_t R = cases[c][0], N = cases[c][1];
            float *g, *u;
            struct harness_tensor *tg = trand(MMRT_DTYPE_F32, -6, 6, &g, SHAPE(R, N));
            struct harness_tensor *tu = trand(MMRT_DTYPE_F32, -3, 3, &u, SHAPE(R, N));
            struct harness_tensor *ty = in_place ? tg : tnew(MMRT_DTYPE_F32, SHAPE(R, N));
            struct harness_tensor *src[2] = { tg, tu };
            assert_int_equal(run(MMRT_OP_SWIGLU, src, 2, ty, NULL, 0), MMRT_OK);
            double *ref = op_ref_buf(R * N);
            ref_swiglu(g, u, R * N, ref);
            op_check_close("SWIGLU", download_f32(ty), ref, R * N, 1e-6);
            op_release_all();
        }
}

/* ---- LAYERNORM, RMSNORM: tolerance 1e-5 ----------------------------------------------- */

static void test_norms(void **state)
{
    (void)state;
    static const int64_t cases[][2] = { { 1, 1 },  { 3, 7 },    { 17, 64 },
                                        { 2, 257 }, { 5, 1000 }, { 2, 4096 } };
    op_rng_seed(6);
    for (int op = MMRT_OP_LAYERNORM; op <= MMRT_OP_RMSNORM; op++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int mode = 0; mode < 6; mode++) {
                /* mode: 0 no weights; 1-3 weight (and LN bias) in F32/F16/BF16; 4 in place,
                 * weight only; 5 tiny values, where eps dominates the variance. Other data
                 * sit at an offset, so the mean matters. */
                int64_t R = cases[c][0], N = cases[c][1];
                enum mmrt_dtype wdt = mode >= 1 && mode <= 3 ? op_weight_dtypes[mode - 1]
                                                             : MMRT_DTYPE_F32;
                bool ln = op == MMRT_OP_LAYERNORM;
                float *x, *w = NULL, *b = NULL;
                struct harness_tensor *tx =
                    mode == 5 ? trand(MMRT_DTYPE_F32, -2e-3f, 2e-3f, &x, SHAPE(R, N))
                              : trand(MMRT_DTYPE_F32, 1, 5, &x, SHAPE(R, N));
                struct harness_tensor *tw = NULL, *tb = NULL;
                if (mode >= 1 && mode <= 4)
                    tw = trand(wdt, -2, 2, &w, SHAPE(N));
                if (ln && mode >= 1 && mode <= 3)
                    tb = trand(wdt, -1, 1, &b, SHAPE(N));
                struct harness_tensor *ty = mode == 4 ? tx : tnew(MMRT_DTYPE_F32, SHAPE(R, N));
                struct mmrt_norm_params p = { mode % 2 ? 1e-5f : 1e-6f };
                if (mode == 5)
                    p.eps = 1e-5f;
                struct harness_tensor *src[3] = { tx, tw, tb };
                int n_src = ln ? 3 : 2;
                double *ref = op_ref_buf(R * N);
                if (ln)
                    ref_layernorm(x, w, b, R, N, p.eps, ref);
                else
                    ref_rmsnorm(x, w, R, N, p.eps, ref);
                assert_int_equal(run(op, src, n_src, ty, &p, sizeof p), MMRT_OK);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d", ln ? "LAYERNORM" : "RMSNORM",
                         (long long)R, (long long)N, mode);
                op_check_close(what, download_f32(ty), ref, R * N, 1e-5);
                op_release_all();
            }
}

/* ---- SOFTMAX: tolerance 1e-6 of the largest output, plus the f32 rounding of x·scale ---- */

static void test_softmax(void **state)
{
    (void)state;
    static const int64_t cases[][2] = { { 1, 1 }, { 3, 7 }, { 5, 64 }, { 2, 1000 }, { 1, 4099 } };
    static const float scales[] = { 1.0f, 0.125f, 2.5f };
    op_rng_seed(7);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int mode = 0; mode < 4; mode++) {
            /* 0 plain; 1 about 30% masked with −inf (never a whole row); 2 large values near
             * 100 (exp would overflow without the max); 3 like 1, in place. */
            int64_t R = cases[c][0], N = cases[c][1];
            float lo = mode == 2 ? 95.0f : -10.0f, hi = mode == 2 ? 105.0f : 10.0f;
            float *x = op_rand_f(R * N, lo, hi);
            if (mode == 1 || mode == 3)
                for (int64_t i = 0; i < R * N; i++)
                    if (i % N != 0 && op_rng_int(0, 9) < 3)
                        x[i] = -INFINITY;
            struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(R, N));
            upload(tx, x);
            struct harness_tensor *ty = mode == 3 ? tx : tnew(MMRT_DTYPE_F32, SHAPE(R, N));
            struct mmrt_scale_params p = { scales[(c + (size_t)mode) % 3] };
            struct harness_tensor *src[1] = { tx };
            assert_int_equal(run(MMRT_OP_SOFTMAX, src, 1, ty, &p, sizeof p), MMRT_OK);
            double *ref = op_ref_buf(R * N);
            ref_softmax(x, R, N, p.scale, ref);
            float *got = download_f32(ty);
            char what[64];
            snprintf(what, sizeof what, "SOFTMAX [%lld, %lld] mode %d", (long long)R,
                     (long long)N, mode);
            /* Rounding x·scale to f32 (as every f32 softmax does) alone moves an output by
             * up to |x·scale|·2⁻²⁴ of itself: 1.6e-5 for the logits near 260 of mode 2. */
            double max_logit = 0;
            for (int64_t i = 0; i < R * N; i++)
                if (isfinite(x[i]) && fabs(x[i] * p.scale) > max_logit)
                    max_logit = fabs(x[i] * p.scale);
            op_check_close(what, got, ref, R * N, 1e-6 + 1.2e-7 * max_logit);
            for (int64_t i = 0; i < R * N; i++)
                if (x[i] == -INFINITY)
                    assert_true(got[i] == 0.0f); /* exactly 0, not tiny */
            op_release_all();
        }

    /* A row masked entirely has no distribution: zeros (never NaN). */
    float x[6] = { -INFINITY, -INFINITY, -INFINITY, 1, 2, 3 };
    struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(2, 3));
    upload(tx, x);
    struct harness_tensor *src[1] = { tx };
    struct mmrt_scale_params p = { 1.0f };
    assert_int_equal(run(MMRT_OP_SOFTMAX, src, 1, tx, &p, sizeof p), MMRT_OK);
    float *got = download_f32(tx);
    for (int i = 0; i < 3; i++)
        assert_true(got[i] == 0.0f);
    assert_true(fabsf(got[3] + got[4] + got[5] - 1.0f) < 1e-6f);
    op_release_all();
}

/* ---- ROPE: tolerance 1e-6 (the reference uses the same f32 angles) -------------------- */

static void test_rope(void **state)
{
    (void)state;
    static const struct {
        int64_t T, H, D;
        int n_rot, mode, layout; /* layout 0 contiguous, 1 in place, 2 a view in a fused buffer */
        float theta;
        int max_pos;
    } cases[] = {
        { 5, 4, 64, 64, MMRT_ROPE_NEOX, 0, 10000.0f, 16 },
        { 3, 2, 8, 4, MMRT_ROPE_NEOX, 0, 25000.0f, 100 },          /* partial, Persimmon-like */
        { 7, 3, 128, 128, MMRT_ROPE_INTERLEAVED, 1, 1e6f, 5000 },
        { 1, 1, 2, 2, MMRT_ROPE_NEOX, 0, 10000.0f, 3 },
        { 9, 5, 80, 40, MMRT_ROPE_INTERLEAVED, 2, 10000.0f, 70000 }, /* large positions */
        { 33, 2, 96, 64, MMRT_ROPE_NEOX, 2, 500000.0f, 40000 },
        { 4, 3, 256, 256, MMRT_ROPE_NEOX, 1, 10000.0f, 32768 },
    };
    op_rng_seed(8);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t T = cases[c].T, H = cases[c].H, D = cases[c].D;
        int32_t *pos = op_alloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++)
            pos[t] = op_rng_int(0, cases[c].max_pos); /* not monotonic, like packed sequences */
        pos[0] = cases[c].max_pos;
        float *x = op_rand_f(T * H * D, -2, 2);
        struct harness_tensor *tx, xv, *ty;
        if (cases[c].layout == 2) {
            /* x is heads [1, 1 + H) of a [T, H + 2, D] buffer whose other heads are NaN. */
            tx = tnew(MMRT_DTYPE_F32, SHAPE(T, H + 2, D));
            upload(tx, op_fused_heads(x, T, H, D));
            xv = op_heads_view(tx, T, H, D);
            ty = tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        } else {
            tx = tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
            upload(tx, x);
            xv = *tx;
            ty = cases[c].layout == 1 ? tx : tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        }
        struct harness_tensor *tp = tnew_i32(pos, T);
        struct mmrt_rope_params p = { cases[c].theta, cases[c].n_rot, cases[c].mode };
        struct harness_tensor *src[2] = { &xv, tp };
        assert_int_equal(run(MMRT_OP_ROPE, src, 2, ty, &p, sizeof p), MMRT_OK);
        double *ref = op_ref_buf(T * H * D);
        ref_rope(x, pos, T, H, D, cases[c].n_rot, cases[c].mode, cases[c].theta, ref);
        char what[96];
        snprintf(what, sizeof what, "ROPE case %zu (T %lld H %lld D %lld n_rot %d mode %d)", c,
                 (long long)T, (long long)H, (long long)D, cases[c].n_rot, cases[c].mode);
        op_check_close(what, download_f32(ty), ref, T * H * D, 1e-6);
        op_release_all();
    }
}

/* ---- ROPE_MULTI: tolerance 1e-6, as ROPE ----------------------------------------------
 * The reference computes inv_freq and the angle in the same f32 steps the op defines, so a
 * kernel differs from it only by cosf/sinf (an ulp or two) and the rounding of two f32
 * products and a sum: a few 1e-7 of max |x|. Anything the parameters select wrongly — a pair
 * in the wrong section (the wrong axis's position), a frequency index that does or does not
 * restart, the wrong freq_dim, positions read [n_axes, T] instead of [T, n_axes] — moves
 * angles by whole radians at these positions; each Qwen2-VL case also proves that by
 * requiring the output to be at least 1e-3 away from the reference run with each mistake. */

enum { RM_CONTIG, RM_IN_PLACE, RM_VIEW };

struct rope_multi_case {
    int64_t T, H, D;
    int n_rot, freq_dim, restart, n_axes, sections[MMRT_ROPE_MAX_AXES];
    float theta;
    int max_pos, layout;
    bool mutants; /* also check that each parameter mistake is caught */
};

/* Fails unless the output is far (≥ 1e-3 of max |ref|) from a reference with a mistake. */
static void check_far(const char *what, const float *got, const double *ref, int64_t n)
{
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < n; i++) {
        max_ref = fmax(max_ref, fabs(ref[i]));
        max_err = fmax(max_err, fabs((double)got[i] - ref[i]));
    }
    if (!(max_err >= 1e-3 * max_ref))
        fail_msg("%s: output is within %.3g of max |ref| %.4g of the mistaken reference, so "
                 "the test could not tell them apart", what, max_err / max_ref, max_ref);
}

/* Runs one case (x random in [-2, 2], positions random per axis, the first token at max_pos
 * on axis 0) and returns the downloaded output; *x_out and *pos_out get the inputs. */
static float *rope_multi_run(const struct rope_multi_case *rc, float **x_out, int32_t **pos_out)
{
    int64_t T = rc->T, H = rc->H, D = rc->D;
    int32_t *pos = op_alloc((size_t)(T * rc->n_axes) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int a = 0; a < rc->n_axes; a++)
            pos[t * rc->n_axes + a] = op_rng_int(0, rc->max_pos);
    for (int a = 0; a < rc->n_axes; a++)
        pos[a] = rc->max_pos - 7 * a; /* the largest position, distinct per axis */
    float *x = op_rand_f(T * H * D, -2, 2);
    struct harness_tensor *tx, xv, *ty;
    if (rc->layout == RM_VIEW) {
        /* x is heads [1, 1 + H) of a [T, H + 2, D] buffer whose other heads are NaN; the
         * rotation runs in place on that view. */
        tx = tnew(MMRT_DTYPE_F32, SHAPE(T, H + 2, D));
        upload(tx, op_fused_heads(x, T, H, D));
        xv = op_heads_view(tx, T, H, D);
        ty = &xv;
    } else {
        tx = tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        upload(tx, x);
        xv = *tx;
        ty = rc->layout == RM_IN_PLACE ? tx : tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
    }
    struct harness_tensor *tp = tnew(MMRT_DTYPE_I32, SHAPE(T, rc->n_axes));
    upload_i32(tp, pos);
    struct mmrt_rope_multi_params p = { rc->theta, rc->n_rot, rc->freq_dim, rc->restart,
                                        rc->n_axes, { 0 } };
    memcpy(p.sections, rc->sections, sizeof p.sections);
    struct harness_tensor *src[2] = { &xv, tp };
    assert_int_equal(run(MMRT_OP_ROPE_MULTI, src, 2, ty, &p, sizeof p), MMRT_OK);
    float *got;
    if (rc->layout == RM_VIEW) {
        int64_t Hb = H + 2;
        float *all = download_f32(tx);
        got = op_alloc((size_t)(T * H * D) * sizeof(float));
        for (int64_t t = 0; t < T; t++) {
            memcpy(got + t * H * D, all + (t * Hb + 1) * D, (size_t)(H * D) * sizeof(float));
            for (int64_t i = 0; i < D; i++) /* the heads around the view stay NaN */
                assert_true(isnan(all[t * Hb * D + i]) && isnan(all[(t * Hb + H + 1) * D + i]));
        }
    } else {
        got = download_f32(ty);
    }
    *x_out = x;
    *pos_out = pos;
    return got;
}

static void test_rope_multi(void **state)
{
    (void)state;
    static const struct rope_multi_case cases[] = {
        /* Qwen2-VL decoder M-RoPE: sections (t, h, w) = (16, 24, 24), theta 1e6. */
        { 7, 4, 128, 128, 128, 0, 3, { 16, 24, 24 }, 1e6f, 30000, RM_CONTIG, true },
        { 33, 3, 128, 128, 128, 0, 3, { 16, 24, 24 }, 1e6f, 4000, RM_IN_PLACE, true },
        { 5, 7, 128, 128, 128, 0, 3, { 16, 24, 24 }, 1e6f, 30000, RM_VIEW, false },
        /* Qwen2-VL vision rotary, head_dim 80: (h, w) sections of 20, freq_dim 40, restart. */
        { 19, 5, 80, 80, 40, 1, 2, { 20, 20 }, 1e4f, 30000, RM_CONTIG, true },
        { 9, 3, 80, 80, 40, 1, 2, { 20, 20 }, 1e4f, 63, RM_IN_PLACE, true },
        { 4, 16, 80, 80, 40, 1, 2, { 20, 20 }, 1e4f, 1000, RM_VIEW, false },
        /* Tiny shapes. */
        { 5, 3, 8, 8, 8, 0, 3, { 2, 1, 1 }, 1e4f, 100, RM_CONTIG, true },
        { 3, 1, 12, 12, 12, 0, 3, { 2, 2, 2 }, 1e4f, 30000, RM_IN_PLACE, true },
        { 4, 2, 12, 12, 6, 1, 2, { 3, 3 }, 1e4f, 50, RM_CONTIG, true },
        { 1, 1, 2, 2, 2, 0, 1, { 1 }, 1e4f, 3, RM_CONTIG, false },
        /* Partial rotation (dims ≥ n_rot copied), with and without restart. */
        { 5, 2, 64, 32, 32, 0, 3, { 4, 6, 6 }, 1e4f, 1000, RM_CONTIG, true },
        { 3, 3, 24, 16, 8, 1, 2, { 4, 4 }, 1e4f, 30000, RM_IN_PLACE, true },
        { 6, 5, 96, 40, 40, 0, 4, { 5, 5, 5, 5 }, 5e5f, 30000, RM_VIEW, false },
        /* One axis (plain NEOX with its own freq_dim) and four axes. */
        { 6, 2, 32, 32, 32, 0, 1, { 16 }, 1e4f, 30000, RM_CONTIG, false },
        { 11, 3, 40, 40, 7, 1, 4, { 3, 5, 7, 5 }, 1e4f, 2000, RM_CONTIG, true },
        /* A section of 0 pairs: that axis is never read. */
        { 4, 2, 16, 16, 16, 0, 3, { 0, 5, 3 }, 1e4f, 300, RM_CONTIG, true },
        { 7, 1, 16, 16, 8, 1, 3, { 4, 0, 4 }, 1e4f, 300, RM_IN_PLACE, true },
        { 2, 3, 16, 16, 16, 0, 4, { 3, 5, 0, 0 }, 1e4f, 30000, RM_CONTIG, true },
    };
    op_rng_seed(18);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct rope_multi_case *rc = &cases[c];
        int64_t T = rc->T, H = rc->H, D = rc->D, n = T * H * D;
        float *x;
        int32_t *pos;
        float *got = rope_multi_run(rc, &x, &pos);
        double *ref = op_ref_buf(n);
        ref_rope_multi(x, pos, T, H, D, rc->n_rot, rc->freq_dim, rc->restart, rc->n_axes,
                       rc->sections, rc->theta, ref);
        char what[160];
        snprintf(what, sizeof what, "ROPE_MULTI case %zu (T %lld H %lld D %lld n_rot %d "
                 "freq_dim %d restart %d sections %d,%d,%d,%d)", c, (long long)T, (long long)H,
                 (long long)D, rc->n_rot, rc->freq_dim, rc->restart, rc->sections[0],
                 rc->sections[1], rc->sections[2], rc->sections[3]);
        op_check_close(what, got, ref, n, 1e-6);
        /* Dims ≥ n_rot are copied bit for bit. */
        for (int64_t r = 0; r < T * H; r++)
            assert_memory_equal(got + r * D + rc->n_rot, x + r * D + rc->n_rot,
                                (size_t)(D - rc->n_rot) * sizeof(float));
        if (!rc->mutants) {
            op_release_all();
            continue;
        }
        /* The mistakes a kernel could make, each of which the tolerance must catch. */
        char mwhat[200];
        int first = -1, second = -1; /* the first two sections with pairs */
        for (int a = 0; a < rc->n_axes; a++)
            if (rc->sections[a] > 0) {
                if (first < 0)
                    first = a;
                else if (second < 0)
                    second = a;
            }
        if (second >= 0) {
            /* The boundary between two sections off by one pair. */
            int s[MMRT_ROPE_MAX_AXES];
            memcpy(s, rc->sections, sizeof s);
            s[first]--, s[second]++;
            ref_rope_multi(x, pos, T, H, D, rc->n_rot, rc->freq_dim, rc->restart, rc->n_axes, s,
                           rc->theta, ref);
            snprintf(mwhat, sizeof mwhat, "%s vs a section boundary one pair early", what);
            check_far(mwhat, got, ref, n);
            /* restart flipped (changes every pair after the first section). */
            ref_rope_multi(x, pos, T, H, D, rc->n_rot, rc->freq_dim, !rc->restart, rc->n_axes,
                           rc->sections, rc->theta, ref);
            snprintf(mwhat, sizeof mwhat, "%s vs restart %d", what, !rc->restart);
            check_far(mwhat, got, ref, n);
            /* Positions read axis-major ([n_axes, T]) instead of [T, n_axes]. */
            int32_t *tp = op_alloc((size_t)(T * rc->n_axes) * 4);
            for (int64_t t = 0; t < T; t++)
                for (int a = 0; a < rc->n_axes; a++)
                    tp[a * T + t] = pos[t * rc->n_axes + a];
            ref_rope_multi(x, tp, T, H, D, rc->n_rot, rc->freq_dim, rc->restart, rc->n_axes,
                           rc->sections, rc->theta, ref);
            snprintf(mwhat, sizeof mwhat, "%s vs positions read [n_axes, T]", what);
            if (T > 1)
                check_far(mwhat, got, ref, n);
        }
        /* freq_dim: n_rot where it is n_rot/2 (the vision rotary's), else n_rot/2. */
        int wrong_fd = rc->freq_dim == rc->n_rot ? rc->n_rot / 2 : rc->n_rot;
        ref_rope_multi(x, pos, T, H, D, rc->n_rot, wrong_fd, rc->restart, rc->n_axes,
                       rc->sections, rc->theta, ref);
        snprintf(mwhat, sizeof mwhat, "%s vs freq_dim %d", what, wrong_fd);
        check_far(mwhat, got, ref, n);
        op_release_all();
    }
}

/* With every axis at the same position, restart 0 and freq_dim = n_rot, ROPE_MULTI is ROPE
 * NEOX, bit for bit: same inv_freq, same f32 angle, same products. */
static void test_rope_multi_is_rope(void **state)
{
    (void)state;
    static const struct {
        int64_t T, H, D;
        int n_rot, n_axes, sections[MMRT_ROPE_MAX_AXES];
        float theta;
        int max_pos;
    } cases[] = {
        { 7, 4, 128, 128, 3, { 16, 24, 24 }, 1e6f, 30000 },
        { 5, 3, 64, 32, 1, { 16 }, 1e4f, 100 },
        { 9, 2, 80, 80, 2, { 20, 20 }, 1e4f, 32768 },
        { 3, 5, 40, 24, 4, { 3, 0, 4, 5 }, 5e5f, 70000 },
        { 1, 1, 2, 2, 1, { 1 }, 1e4f, 3 },
    };
    op_rng_seed(19);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t T = cases[c].T, H = cases[c].H, D = cases[c].D;
        int n_axes = cases[c].n_axes;
        int32_t *pos = op_alloc((size_t)T * 4), *pos_m = op_alloc((size_t)(T * n_axes) * 4);
        for (int64_t t = 0; t < T; t++) {
            pos[t] = t ? op_rng_int(0, cases[c].max_pos) : cases[c].max_pos;
            for (int a = 0; a < n_axes; a++)
                pos_m[t * n_axes + a] = pos[t];
        }
        float *x;
        struct harness_tensor *tx = trand(MMRT_DTYPE_F32, -2, 2, &x, SHAPE(T, H, D));
        struct harness_tensor *y1 = tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        struct harness_tensor *y2 = tnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        struct harness_tensor *tp = tnew_i32(pos, T), *tpm = tnew(MMRT_DTYPE_I32, SHAPE(T, n_axes));
        upload_i32(tpm, pos_m);
        struct mmrt_rope_params p = { cases[c].theta, cases[c].n_rot, MMRT_ROPE_NEOX };
        struct mmrt_rope_multi_params pm = { cases[c].theta, cases[c].n_rot, cases[c].n_rot, 0,
                                             n_axes, { 0 } };
        memcpy(pm.sections, cases[c].sections, sizeof pm.sections);
        struct harness_tensor *s1[2] = { tx, tp }, *s2[2] = { tx, tpm };
        assert_int_equal(run(MMRT_OP_ROPE, s1, 2, y1, &p, sizeof p), MMRT_OK);
        assert_int_equal(run(MMRT_OP_ROPE_MULTI, s2, 2, y2, &pm, sizeof pm), MMRT_OK);
        assert_memory_equal(download_f32(y1), download_f32(y2), (size_t)(T * H * D) * 4);
        op_release_all();
    }
}

/* ---- ATTENTION: tolerance 1e-5 -------------------------------------------------------- */

enum kv_layout {
    KV_DENSE,      /* [S, Hkv, D] */
    KV_CACHE,      /* tokens [off, off + S) of a [cap, Hkv, D] cache */
    KV_HEAD_MAJOR, /* a [Hkv, cap, D] cache seen as [S, Hkv, D] (token stride D) */
    KV_FUSED,      /* k and v interleaved per token in one [S, 2, Hkv, D] buffer */
};

struct attn_case {
    int64_t Hq, Hkv, D;
    int n_seq;             /* 0: no cu_seqlens */
    int32_t lq[5], lk[5];  /* per-sequence lengths (lq[0], lk[0] when n_seq == 0) */
    int causal;
    enum mmrt_dtype kv_dtype;
    enum kv_layout layout;
    float q_amp;           /* |q| range: larger makes softmax peakier */
    float scale;           /* 0: 1/sqrt(D) */
    int window;            /* sliding window (causal only); 0 = none */
};

/* Places dense kv values [S, Hkv, D] into a base tensor with the given layout and returns the
 * view; cells outside the view hold NaN. which = 0 for k, 1 for v (KV_FUSED shares one base). */
static struct harness_tensor kv_place(const struct attn_case *ac, int64_t S, const float *dense,
                                      int which, float *fused_host,
                                      struct harness_tensor **fused_base)
{
    int64_t Hkv = ac->Hkv, D = ac->D, es = ac->kv_dtype == MMRT_DTYPE_F32 ? 4 : 2;
    int64_t cap = S + 5, off = 3;
    const int64_t *ne = (const int64_t[]){ S, Hkv, D };
    switch (ac->layout) {
    case KV_DENSE: {
        struct harness_tensor *t = tnew(ac->kv_dtype, SHAPE(S, Hkv, D));
        assert_int_equal(harness_upload(&H, t, op_encode(ac->kv_dtype, dense, S * Hkv * D)),
                         MMRT_OK);
        return *t;
    }
    case KV_CACHE: {
        float *buf = op_alloc((size_t)(cap * Hkv * D) * sizeof(float));
        for (int64_t i = 0; i < cap * Hkv * D; i++)
            buf[i] = NAN;
        memcpy(buf + off * Hkv * D, dense, (size_t)(S * Hkv * D) * sizeof(float));
        struct harness_tensor *t = tnew(ac->kv_dtype, SHAPE(cap, Hkv, D));
        assert_int_equal(harness_upload(&H, t, op_encode(ac->kv_dtype, buf, cap * Hkv * D)),
                         MMRT_OK);
        return op_view(t, ac->kv_dtype, 3, ne, (const int64_t[]){ Hkv * D * es, D * es, es },
                     (uint64_t)(off * Hkv * D * es));
    }
    case KV_HEAD_MAJOR: {
        float *buf = op_alloc((size_t)(cap * Hkv * D) * sizeof(float));
        for (int64_t i = 0; i < cap * Hkv * D; i++)
            buf[i] = NAN;
        for (int64_t s = 0; s < S; s++)
            for (int64_t g = 0; g < Hkv; g++)
                memcpy(buf + (g * cap + s) * D, dense + (s * Hkv + g) * D,
                       (size_t)D * sizeof(float));
        struct harness_tensor *t = tnew(ac->kv_dtype, SHAPE(Hkv, cap, D));
        assert_int_equal(harness_upload(&H, t, op_encode(ac->kv_dtype, buf, cap * Hkv * D)),
                         MMRT_OK);
        return op_view(t, ac->kv_dtype, 3, ne, (const int64_t[]){ D * es, cap * D * es, es }, 0);
    }
    case KV_FUSED:
    default: {
        for (int64_t s = 0; s < S; s++)
            memcpy(fused_host + ((s * 2 + which) * Hkv) * D, dense + s * Hkv * D,
                   (size_t)(Hkv * D) * sizeof(float));
        if (which == 1) {
            *fused_base = tnew(ac->kv_dtype, SHAPE(S, 2, Hkv, D));
            assert_int_equal(harness_upload(&H, *fused_base,
                                            op_encode(ac->kv_dtype, fused_host, S * 2 * Hkv * D)),
                             MMRT_OK);
        }
        return (struct harness_tensor){ 0 }; /* the caller builds both views afterwards */
    }
    }
}

/* Runs one attention case on device `h` and returns the output (T · Hq · D floats), after
 * checking it against the reference when check is set. */
static float *attention_case(const struct attn_case *ac, uint64_t seed, bool check)
{
    int n_seq = ac->n_seq ? ac->n_seq : 1;
    int32_t cu_q[6] = { 0 }, cu_k[6] = { 0 };
    for (int s = 0; s < n_seq; s++) {
        cu_q[s + 1] = cu_q[s] + ac->lq[s];
        cu_k[s + 1] = cu_k[s] + ac->lk[s];
    }
    int64_t T = cu_q[n_seq], S = cu_k[n_seq], Hq = ac->Hq, Hkv = ac->Hkv, D = ac->D;
    op_rng_seed(seed);
    float *q, *k = op_rand_f(S * Hkv * D, -1, 1), *v = op_rand_f(S * Hkv * D, -1, 1);
    op_round_to(ac->kv_dtype, k, S * Hkv * D);
    op_round_to(ac->kv_dtype, v, S * Hkv * D);
    struct harness_tensor *tq = trand(MMRT_DTYPE_F32, -ac->q_amp, ac->q_amp, &q, SHAPE(T, Hq, D));
    struct harness_tensor kv_k, kv_v, *fused = NULL;
    float *fused_host = NULL;
    if (ac->layout == KV_FUSED) {
        fused_host = op_alloc((size_t)(S * 2 * Hkv * D) * sizeof(float));
        kv_place(ac, S, k, 0, fused_host, &fused);
        kv_place(ac, S, v, 1, fused_host, &fused);
        int64_t es = ac->kv_dtype == MMRT_DTYPE_F32 ? 4 : 2;
        const int64_t nb[3] = { 2 * Hkv * D * es, D * es, es };
        kv_k = op_view(fused, ac->kv_dtype, SHAPE(S, Hkv, D), nb, 0);
        kv_v = op_view(fused, ac->kv_dtype, SHAPE(S, Hkv, D), nb, (uint64_t)(Hkv * D * es));
    } else {
        kv_k = kv_place(ac, S, k, 0, NULL, NULL);
        kv_v = kv_place(ac, S, v, 1, NULL, NULL);
    }
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(T, Hq, D));
    struct harness_tensor *tcq = NULL, *tck = NULL;
    if (ac->n_seq) {
        tcq = tnew_i32(cu_q, n_seq + 1);
        tck = tnew_i32(cu_k, n_seq + 1);
    }
    float scale = ac->scale != 0 ? ac->scale : 1.0f / sqrtf((float)D);
    struct mmrt_attention_params p = { scale, ac->causal, n_seq, ac->window };
    struct harness_tensor *src[5] = { tq, &kv_k, &kv_v, tcq, tck };
    assert_int_equal(run(MMRT_OP_ATTENTION, src, ac->n_seq ? 5 : 3, ty, &p, sizeof p), MMRT_OK);
    float *got = download_f32(ty);
    if (check) {
        double *ref = op_ref_buf(T * Hq * D);
        ref_attention(q, k, v, T, S, Hq, Hkv, D, ac->n_seq ? cu_q : NULL,
                      ac->n_seq ? cu_k : NULL, n_seq, scale, ac->causal, ac->window, ref);
        char what[192];
        snprintf(what, sizeof what, "ATTENTION seed %llu (T %lld S %lld Hq %lld Hkv %lld D %lld "
                 "n_seq %d causal %d window %d kv %s layout %d)", (unsigned long long)seed,
                 (long long)T, (long long)S, (long long)Hq, (long long)Hkv, (long long)D,
                 ac->n_seq, ac->causal, ac->window, mmrt_dtype_name_of(ac->kv_dtype),
                 (int)ac->layout);
        op_check_close(what, got, ref, T * Hq * D, 1e-5);
    }
    return got;
}

static const struct attn_case attn_cases[] = {
    /* Hq Hkv D  n_seq lq            lk             causal kv                layout      q_amp scale window */
    { 4, 4, 64,  0, { 7 },          { 7 },          0, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0 },
    { 8, 2, 80,  0, { 33 },         { 33 },         1, MMRT_DTYPE_F16, KV_DENSE,      1, 0, 0 },
    { 4, 2, 128, 0, { 1 },          { 37 },         1, MMRT_DTYPE_F16, KV_CACHE,      1, 0, 0 }, /* decode */
    { 4, 1, 64,  0, { 5 },          { 20 },         1, MMRT_DTYPE_F32, KV_HEAD_MAJOR, 1, 0, 0 }, /* chunked prefill */
    { 2, 2, 256, 3, { 5, 1, 12 },   { 5, 1, 12 },   0, MMRT_DTYPE_F32, KV_FUSED,      1, 0, 0 }, /* vision blocks */
    { 6, 3, 8,   5, { 3, 1, 0, 4, 5 }, { 10, 1, 0, 4, 2 }, 1, MMRT_DTYPE_F16, KV_CACHE, 1, 0, 0 },
    { 2, 1, 64,  0, { 300 },        { 300 },        1, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0 }, /* long */
    { 1, 1, 3,   0, { 4 },          { 9 },          0, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0 }, /* odd D */
    { 4, 2, 64,  0, { 9 },          { 9 },          1, MMRT_DTYPE_F32, KV_FUSED,      4, 0.3f, 0 }, /* peaky */
    { 2, 1, 16,  0, { 2 },          { 0 },          0, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0 }, /* no keys */
    { 8, 2, 128, 0, { 16 },         { 16 },         1, MMRT_DTYPE_F16, KV_HEAD_MAJOR, 1, 0, 0 }, /* GQA 4 */
    { 4, 4, 256, 2, { 3, 2 },       { 40, 7 },      1, MMRT_DTYPE_F16, KV_FUSED,      1, 0, 0 },
    /* Sliding windows: decode from a cache (window mid-range, and ≥ Lk), a prefill with a
     * past over several query blocks, window 1, packed sequences with an empty one, GQA. */
    { 4, 2, 128, 0, { 1 },          { 37 },         1, MMRT_DTYPE_F16, KV_CACHE,      1, 0, 5 },
    { 4, 2, 128, 0, { 1 },          { 37 },         1, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 40 },
    { 8, 2, 64,  0, { 70 },         { 100 },        1, MMRT_DTYPE_F32, KV_HEAD_MAJOR, 1, 0, 13 },
    { 2, 1, 64,  0, { 9 },          { 9 },          1, MMRT_DTYPE_F32, KV_FUSED,      1, 0, 1 },
    { 6, 3, 8,   5, { 3, 1, 0, 4, 5 }, { 10, 1, 0, 4, 2 }, 1, MMRT_DTYPE_F16, KV_CACHE, 1, 0, 3 },
    { 8, 1, 96,  2, { 2, 33 },      { 50, 40 },     1, MMRT_DTYPE_F16, KV_DENSE,      1, 0, 8 },
};

static void test_attention(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
        attention_case(&attn_cases[c], 100 + c, true);
        op_release_all();
    }
}

/* Decode rows of one sequence (Lq queries, Lk keys) with window w, on the CPU plugin, params
 * of `size` bytes: the output. */
static float *window_run(float *q, const float *k, const float *v, int64_t Lq, int64_t Lk,
                         int64_t Hq, int64_t Hkv, int64_t D, int32_t w, uint32_t size)
{
    struct harness_tensor *tq = tnew(MMRT_DTYPE_F32, SHAPE(Lq, Hq, D));
    struct harness_tensor *tk = tnew(MMRT_DTYPE_F16, SHAPE(Lk, Hkv, D));
    struct harness_tensor *tv = tnew(MMRT_DTYPE_F16, SHAPE(Lk, Hkv, D));
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(Lq, Hq, D));
    upload(tq, q);
    assert_int_equal(harness_upload(&H, tk, op_encode(MMRT_DTYPE_F16, k, Lk * Hkv * D)), MMRT_OK);
    assert_int_equal(harness_upload(&H, tv, op_encode(MMRT_DTYPE_F16, v, Lk * Hkv * D)), MMRT_OK);
    struct mmrt_attention_params p = { 1.0f / sqrtf((float)D), 1, 1, w };
    struct harness_tensor *src[3] = { tq, tk, tv };
    assert_int_equal(run(MMRT_OP_ATTENTION, src, 3, ty, &p, size), MMRT_OK);
    return download_f32(ty);
}

/* The window's bits: a decode query with window w gives exactly what it gives without one over
 * its last w keys alone (the keys before are skipped, not masked), on the streaming and the
 * blocked path (1 and 9 queries; the blocked rows compared with a cut of the same length); a
 * window ≥ Lk changes nothing; and an ABI 1.4 caller's 12-byte params read as no window
 * whatever follows them. */
static void test_attention_window_bits(void **state)
{
    (void)state;
    const int64_t Hq = 8, Hkv = 2, D = 64, Lk = 300, w = 37;
    op_rng_seed(41);
    float *q = op_rand_f(9 * Hq * D, -1, 1), *k = op_rand_f(Lk * Hkv * D, -1, 1);
    float *v = op_rand_f(Lk * Hkv * D, -1, 1);
    op_round_to(MMRT_DTYPE_F16, k, Lk * Hkv * D);
    op_round_to(MMRT_DTYPE_F16, v, Lk * Hkv * D);
    const size_t full = sizeof(struct mmrt_attention_params);
    /* One query: position Lk − 1 sees keys Lk − w … Lk − 1. */
    float *win = window_run(q, k, v, 1, Lk, Hq, Hkv, D, (int32_t)w, full);
    const int64_t cut = (Lk - w) * Hkv * D;
    float *alone = window_run(q, k + cut, v + cut, 1, w, Hq, Hkv, D, 0, full);
    op_paged_same_bits("ATTENTION decode with window 37 vs its 37 keys alone", win, alone, Hq * D);
    float *wide = window_run(q, k, v, 1, Lk, Hq, Hkv, D, (int32_t)Lk, full);
    float *none = window_run(q, k, v, 1, Lk, Hq, Hkv, D, 0, full);
    op_paged_same_bits("ATTENTION decode with window Lk vs none", wide, none, Hq * D);
    float *old = window_run(q, k, v, 1, Lk, Hq, Hkv, D, 5, MMRT_ATTENTION_PARAMS_V14_SIZE);
    op_paged_same_bits("ATTENTION with 12-byte params vs window 0", old, none, Hq * D);
    bool differs = false;
    for (int64_t i = 0; i < Hq * D; i++)
        differs |= win[i] != none[i];
    assert_true(differs);
    /* Nine queries (the blocked path with the micro-kernel table): the last sees the same
     * 37 keys as a decode over them alone. */
    float *win9 = window_run(q, k, v, 9, Lk, Hq, Hkv, D, (int32_t)w, full);
    float *ref = op_alloc((size_t)(9 * Hq * D) * sizeof(float));
    for (int64_t i = 0; i < 9; i++) {
        const int64_t first = (Lk - 9 + i + 1 - w) * Hkv * D;
        float *one = window_run(q + i * Hq * D, k + first, v + first, 1, w, Hq, Hkv, D, 0, full);
        memcpy(ref + i * Hq * D, one, (size_t)(Hq * D) * sizeof(float));
    }
    double *dref = op_ref_buf(9 * Hq * D);
    for (int64_t i = 0; i < 9 * Hq * D; i++)
        dref[i] = ref[i];
    op_check_close("ATTENTION 9 queries with window 37 vs each query over its keys", win9, dref,
                   9 * Hq * D, 1e-6);
    op_release_all();
}

/* A query that sees no key (causal with Lq > Lk) must be exactly zero. */
static void test_attention_empty_rows(void **state)
{
    (void)state;
    const struct attn_case *ac = &attn_cases[5]; /* sequence 4 has Lq 5, Lk 2 */
    float *got = attention_case(ac, 7, false);
    int64_t t0 = 3 + 1 + 0 + 4; /* first query of sequence 4 */
    for (int64_t t = t0; t < t0 + 3; t++) /* i + (2 − 5) < 0 for i = 0, 1, 2 */
        for (int64_t i = 0; i < ac->Hq * ac->D; i++)
            assert_true(got[t * ac->Hq * ac->D + i] == 0.0f);
    bool nonzero = false;
    for (int64_t i = 0; i < ac->Hq * ac->D; i++)
        nonzero |= got[(t0 + 3) * ac->Hq * ac->D + i] != 0.0f;
    assert_true(nonzero);
    op_release_all();
}

/* ---- GET_ROWS: exact ------------------------------------------------------------------ */

static void test_get_rows(void **state)
{
    (void)state;
    static const int64_t cases[][3] = { { 1, 1, 1 }, { 10, 7, 5 }, { 1000, 64, 33 }, { 32, 4096, 3 } };
    op_rng_seed(9);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            int64_t V = cases[c][0], N = cases[c][1], T = cases[c][2];
            float *tab;
            struct harness_tensor *tt = trand(op_weight_dtypes[d], -3, 3, &tab, SHAPE(V, N));
            int32_t *ids = op_alloc((size_t)T * 4);
            for (int64_t t = 0; t < T; t++)
                ids[t] = op_rng_int(0, (int)V - 1);
            ids[0] = (int32_t)V - 1;
            if (T > 2)
                ids[1] = 0, ids[2] = ids[0];
            struct harness_tensor *ti = tnew_i32(ids, T);
            struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(T, N));
            struct harness_tensor *src[2] = { tt, ti };
            assert_int_equal(run(MMRT_OP_GET_ROWS, src, 2, ty, NULL, 0), MMRT_OK);
            float *got = download_f32(ty);
            for (int64_t t = 0; t < T; t++)
                assert_memory_equal(got + t * N, tab + ids[t] * N, (size_t)N * sizeof(float));
            op_release_all();
        }
}

/* Every f16 and bf16 bit pattern through GET_ROWS, i.e. through the block conversion that
 * MATMUL and GET_ROWS use (COPY converts element by element). Exact, NaN matching NaN. */
static void test_get_rows_all_halves(void **state)
{
    (void)state;
    for (int d = 1; d < 3; d++) {
        enum mmrt_dtype dt = op_weight_dtypes[d];
        uint16_t *all = op_alloc(65536 * 2);
        for (int i = 0; i < 65536; i++)
            all[i] = (uint16_t)i;
        struct harness_tensor *tt = tnew(dt, SHAPE(1024, 64));
        assert_int_equal(harness_upload(&H, tt, all), MMRT_OK);
        int32_t ids[1024];
        for (int t = 0; t < 1024; t++)
            ids[t] = 1023 - t;
        struct harness_tensor *ti = tnew_i32(ids, 1024);
        struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(1024, 64)), *src[2] = { tt, ti };
        assert_int_equal(run(MMRT_OP_GET_ROWS, src, 2, ty, NULL, 0), MMRT_OK);
        float *got = download_f32(ty);
        for (int t = 0; t < 1024; t++)
            for (int i = 0; i < 64; i++) {
                uint16_t h = all[ids[t] * 64 + i];
                float want = dt == MMRT_DTYPE_F16 ? mmrt_f16_to_f32(h) : mmrt_bf16_to_f32(h);
                if (!op_same_value(MMRT_DTYPE_F32, &got[t * 64 + i], &want))
                    fail_msg("GET_ROWS %s 0x%04x gave %.9g, want %.9g", mmrt_dtype_name_of(dt), h,
                             (double)got[t * 64 + i], (double)want);
            }
        op_release_all();
    }
}

/* ---- PATCH_EMBED: tolerance 1e-5 ------------------------------------------------------ */

static void test_patch_embed(void **state)
{
    (void)state;
    static const int64_t cases[][6] = { /* B, C, H, W, P, O */
        { 1, 3, 28, 28, 7, 32 }, { 2, 3, 14, 21, 7, 5 }, { 1, 3, 30, 60, 30, 8 },
        { 1, 1, 4, 4, 1, 3 },    { 2, 2, 6, 6, 3, 1 },
    };
    op_rng_seed(10);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            int64_t B = cases[c][0], C = cases[c][1], Hh = cases[c][2], W = cases[c][3];
            int64_t P = cases[c][4], O = cases[c][5], nP = (Hh / P) * (W / P);
            bool bias = (c + (size_t)d) % 2 == 0;
            float *img, *w, *b = NULL;
            struct harness_tensor *ti = trand(MMRT_DTYPE_F32, -1, 1, &img, SHAPE(B, C, Hh, W));
            struct harness_tensor *tw = trand(op_weight_dtypes[d], -1, 1, &w, SHAPE(O, C, P, P));
            struct harness_tensor *tb =
                bias ? trand(op_weight_dtypes[d], -1, 1, &b, SHAPE(O)) : NULL;
            struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(B, nP, O));
            struct harness_tensor *src[3] = { ti, tw, tb };
            struct mmrt_patch_params p = { (int32_t)P };
            assert_int_equal(run(MMRT_OP_PATCH_EMBED, src, 3, ty, &p, sizeof p), MMRT_OK);
            double *ref = op_ref_buf(B * nP * O);
            ref_patch_embed(img, w, b, B, C, Hh, W, P, O, ref);
            char what[96];
            snprintf(what, sizeof what, "PATCH_EMBED case %zu W %s bias %d", c,
                     mmrt_dtype_name_of(op_weight_dtypes[d]), bias);
            op_check_close(what, download_f32(ty), ref, B * nP * O, 1e-5);
            op_release_all();
        }
}

/* ---- CONCAT: exact -------------------------------------------------------------------- */

/* Element (i0..i3) of a dense 4-D index space, for building expected layouts. */
static int64_t idx4(const int64_t *ne, const int64_t *i)
{
    return ((i[0] * ne[1] + i[1]) * ne[2] + i[2]) * ne[3] + i[3];
}

static void test_concat(void **state)
{
    (void)state;
    static const int64_t shapes[][4] = { { 5, 1, 1, 1 }, { 3, 4, 1, 1 }, { 2, 3, 5, 1 },
                                         { 2, 3, 2, 7 } };
    static const int ranks[] = { 1, 2, 3, 4 };
    static const enum mmrt_dtype dts[] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                           MMRT_DTYPE_I32 };
    op_rng_seed(11);
    for (int r = 0; r < 4; r++)
        for (int axis = 0; axis < ranks[r]; axis++)
            for (int d = 0; d < 4; d++) {
                int nd = ranks[r];
                enum mmrt_dtype dt = dts[d];
                int64_t es = (int64_t)mmrt_dtype_size(dt);
                int64_t na[4], nb_[4], ny[4];
                for (int i = 0; i < 4; i++)
                    na[i] = nb_[i] = ny[i] = shapes[r][i];
                nb_[axis] = shapes[r][axis] + 2; /* src1 is longer on the axis */
                ny[axis] = na[axis] + nb_[axis];
                int64_t n_a = na[0] * na[1] * na[2] * na[3],
                        n_b = nb_[0] * nb_[1] * nb_[2] * nb_[3];
                /* src0 contiguous; src1 a view with its innermost rows padded by 3 elements. */
                uint8_t *ha = op_alloc((size_t)(n_a * es)), *hb = op_alloc((size_t)(n_b * es));
                for (int64_t i = 0; i < n_a * es; i++)
                    ha[i] = (uint8_t)op_rng_u64();
                for (int64_t i = 0; i < n_b * es; i++)
                    hb[i] = (uint8_t)op_rng_u64();
                struct harness_tensor *ta = tnew(dt, nd, na);
                assert_int_equal(harness_upload(&H, ta, ha), MMRT_OK);
                int64_t inner = nb_[nd - 1], padded = inner + 3, outer = n_b / inner;
                struct harness_tensor *tbb = tnew(dt, SHAPE(outer, padded));
                uint8_t *hbp = op_alloc((size_t)(outer * padded * es));
                for (int64_t o = 0; o < outer; o++)
                    memcpy(hbp + o * padded * es, hb + o * inner * es, (size_t)(inner * es));
                assert_int_equal(harness_upload(&H, tbb, hbp), MMRT_OK);
                int64_t vnb[4];
                vnb[nd - 1] = es;
                if (nd >= 2)
                    vnb[nd - 2] = padded * es;
                for (int i = nd - 3; i >= 0; i--)
                    vnb[i] = vnb[i + 1] * nb_[i + 1];
                struct harness_tensor tb = op_view(tbb, dt, nd, nb_, vnb, 0);
                struct harness_tensor *ty = tnew(dt, nd, ny);
                struct mmrt_concat_params p = { axis };
                struct harness_tensor *src[2] = { ta, &tb };
                assert_int_equal(run(MMRT_OP_CONCAT, src, 2, ty, &p, sizeof p), MMRT_OK);
                uint8_t *got = op_alloc((size_t)ty->nbytes);
                assert_int_equal(harness_download(&H, ty, got), MMRT_OK);
                /* Expected: walk dst's index space in 4-D with leading 1s. */
                int64_t e4[4], a4[4], b4[4], pad = 4 - nd;
                for (int i = 0; i < 4; i++) {
                    e4[i] = i < pad ? 1 : ny[i - pad];
                    a4[i] = i < pad ? 1 : na[i - pad];
                    b4[i] = i < pad ? 1 : nb_[i - pad];
                }
                int ax4 = axis + (int)pad;
                int64_t i[4];
                for (i[0] = 0; i[0] < e4[0]; i[0]++)
                    for (i[1] = 0; i[1] < e4[1]; i[1]++)
                        for (i[2] = 0; i[2] < e4[2]; i[2]++)
                            for (i[3] = 0; i[3] < e4[3]; i[3]++) {
                                int64_t j[4] = { i[0], i[1], i[2], i[3] };
                                const uint8_t *want;
                                if (i[ax4] < a4[ax4]) {
                                    want = ha + idx4(a4, j) * es;
                                } else {
                                    j[ax4] -= a4[ax4];
                                    want = hb + idx4(b4, j) * es;
                                }
                                if (memcmp(got + idx4(e4, i) * es, want, (size_t)es) != 0)
                                    fail_msg("CONCAT rank %d axis %d %s: element %lld differs", nd,
                                             axis, mmrt_dtype_name_of(dt), (long long)idx4(e4, i));
                            }
                op_release_all();
            }
}

/* ---- COPY: exact ---------------------------------------------------------------------- */

/* Copies n values (host bytes in sdt) through the device into ddt and compares each. */
static void check_conversion(enum mmrt_dtype sdt, enum mmrt_dtype ddt, const void *src, int64_t n)
{
    struct harness_tensor *ts = tnew(sdt, SHAPE(n)), *td = tnew(ddt, SHAPE(n));
    assert_int_equal(harness_upload(&H, ts, src), MMRT_OK);
    struct harness_tensor *srcs[1] = { ts };
    assert_int_equal(run(MMRT_OP_COPY, srcs, 1, td, NULL, 0), MMRT_OK);
    size_t ses = mmrt_dtype_size(sdt), des = mmrt_dtype_size(ddt);
    uint8_t *got = op_alloc((size_t)n * des);
    assert_int_equal(harness_download(&H, td, got), MMRT_OK);
    for (int64_t i = 0; i < n; i++) {
        uint8_t want[4];
        op_convert_one(sdt, (const uint8_t *)src + i * (int64_t)ses, ddt, want);
        if (!op_same_value(ddt, got + i * (int64_t)des, want)) {
            uint32_t s = 0, g = 0, w = 0;
            memcpy(&s, (const uint8_t *)src + i * (int64_t)ses, ses);
            memcpy(&g, got + i * (int64_t)des, des);
            memcpy(&w, want, des);
            fail_msg("COPY %s→%s: source bits 0x%x gave 0x%x, want 0x%x", mmrt_dtype_name_of(sdt),
                     mmrt_dtype_name_of(ddt), s, g, w);
        }
    }
}

static void test_copy_conversions(void **state)
{
    (void)state;
    /* Every f16 and every bf16 bit pattern, to F32 and to the other 16-bit type. */
    uint16_t *all = op_alloc(65536 * 2);
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    check_conversion(MMRT_DTYPE_F16, MMRT_DTYPE_F32, all, 65536);
    check_conversion(MMRT_DTYPE_BF16, MMRT_DTYPE_F32, all, 65536);
    check_conversion(MMRT_DTYPE_F16, MMRT_DTYPE_BF16, all, 65536);
    check_conversion(MMRT_DTYPE_BF16, MMRT_DTYPE_F16, all, 65536);
    check_conversion(MMRT_DTYPE_F16, MMRT_DTYPE_F16, all, 65536);

    /* f32 → f16/bf16: rounding boundaries, specials, then random bit patterns. */
    static const uint32_t edge[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
        0x3f801000, /* 1 + 2^-11: halfway, rounds to even (1) */
        0x3f803000, /* 1 + 3·2^-11: halfway, rounds up */
        0x477fe000, /* 65504, the largest half */
        0x477fefff, 0x477ff000, /* just below / at 65520: last finite / infinity */
        0x38800000, 0x387fffff, 0x387fe000, /* 2^-14 and just below: normal/subnormal edge */
        0x33800000, /* 2^-24, smallest subnormal */
        0x33000000, /* 2^-25: halfway to it, rounds to 0 */
        0x33000001, 0x33c00000, /* just above half; 1.5·2^-24 rounds to 2·2^-24 */
        0x3f808000, 0x3f818000, /* bf16 halfway cases */
        0x7f7fffff, 0xff7fffff, /* FLT_MAX: infinity in both */
        0x00000001, 0x007fffff, /* f32 subnormals */
    };
    int64_t n = 200000;
    uint32_t *bits = op_alloc((size_t)n * 4);
    memcpy(bits, edge, sizeof edge);
    op_rng_seed(12);
    for (int64_t i = (int64_t)(sizeof edge / 4); i < n; i++) {
        bits[i] = (uint32_t)op_rng_u64();
        if (i % 2) /* half of them in the f16 range, where rounding is interesting */
            bits[i] = (bits[i] & 0x807fffffu) | ((uint32_t)op_rng_int(100, 143) << 23);
    }
    check_conversion(MMRT_DTYPE_F32, MMRT_DTYPE_F16, bits, n);
    check_conversion(MMRT_DTYPE_F32, MMRT_DTYPE_BF16, bits, n);
    check_conversion(MMRT_DTYPE_F32, MMRT_DTYPE_F32, bits, n);
    check_conversion(MMRT_DTYPE_I32, MMRT_DTYPE_I32, bits, n);
    op_release_all();
}

static void test_copy_strided(void **state)
{
    (void)state;
    static const enum mmrt_dtype dts[] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16 };
    static const int perms[][4] = { { 0, 2, 1, 3 }, { 3, 1, 0, 2 }, { 0, 1, 2, 3 }, { 2, 3, 0, 1 } };
    const int64_t base_ne[4] = { 2, 3, 5, 7 };
    op_rng_seed(13);
    for (int pi = 0; pi < 4; pi++)
        for (int s = 0; s < 3; s++)
            for (int d = 0; d < 3; d++) {
                enum mmrt_dtype sdt = dts[s], ddt = dts[d];
                int64_t ses = (int64_t)mmrt_dtype_size(sdt), des = (int64_t)mmrt_dtype_size(ddt);
                float *vals = op_rand_f(210, -100, 100);
                struct harness_tensor *tb = tnew(sdt, 4, base_ne);
                upload(tb, vals);
                /* The source is base permuted: dim i of the view is dim perms[pi][i] of base. */
                int64_t bnb[4], ne[4], nb[4];
                bnb[3] = ses;
                for (int i = 2; i >= 0; i--)
                    bnb[i] = bnb[i + 1] * base_ne[i + 1];
                for (int i = 0; i < 4; i++) {
                    ne[i] = base_ne[perms[pi][i]];
                    nb[i] = bnb[perms[pi][i]];
                }
                struct harness_tensor sv = op_view(tb, sdt, 4, ne, nb, 0);
                struct harness_tensor *td = tnew(ddt, 4, ne);
                struct harness_tensor *src[1] = { &sv };
                assert_int_equal(run(MMRT_OP_COPY, src, 1, td, NULL, 0), MMRT_OK);
                uint8_t *got = op_alloc((size_t)td->nbytes);
                assert_int_equal(harness_download(&H, td, got), MMRT_OK);
                int64_t i[4];
                for (i[0] = 0; i[0] < ne[0]; i[0]++)
                    for (i[1] = 0; i[1] < ne[1]; i[1]++)
                        for (i[2] = 0; i[2] < ne[2]; i[2]++)
                            for (i[3] = 0; i[3] < ne[3]; i[3]++) {
                                int64_t bi[4];
                                for (int k = 0; k < 4; k++)
                                    bi[perms[pi][k]] = i[k];
                                uint8_t sbytes[4], want[4];
                                float f = vals[idx4(base_ne, bi)]; /* already rounded to sdt */
                                op_convert_one(MMRT_DTYPE_F32, &f, sdt, sbytes);
                                op_convert_one(sdt, sbytes, ddt, want);
                                if (memcmp(got + idx4(ne, i) * des, want, (size_t)des) != 0)
                                    fail_msg("COPY perm %d %s→%s differs at %lld", pi,
                                             mmrt_dtype_name_of(sdt), mmrt_dtype_name_of(ddt),
                                             (long long)idx4(ne, i));
                            }
                op_release_all();
            }

    /* A KV-cache write: [T, Hkv, D] F32 into tokens [off, off + T) of an F16 cache; the rest
     * of the cache must keep its old contents. */
    int64_t T = 3, Hkv = 2, D = 8, cap = 10, off = 4;
    float *kv = op_rand_f(T * Hkv * D, -2, 2);
    struct harness_tensor *tkv = tnew(MMRT_DTYPE_F32, SHAPE(T, Hkv, D));
    upload(tkv, kv);
    struct harness_tensor *cache = tnew(MMRT_DTYPE_F16, SHAPE(cap, Hkv, D));
    uint16_t *old = op_alloc((size_t)cache->nbytes);
    for (int64_t i = 0; i < cap * Hkv * D; i++)
        old[i] = (uint16_t)(0x3c00 + i); /* distinct finite halves */
    assert_int_equal(harness_upload(&H, cache, old), MMRT_OK);
    struct harness_tensor slot = op_view(cache, MMRT_DTYPE_F16, SHAPE(T, Hkv, D),
                                       (const int64_t[]){ Hkv * D * 2, D * 2, 2 },
                                       (uint64_t)(off * Hkv * D * 2));
    struct harness_tensor *src[1] = { tkv };
    assert_int_equal(run(MMRT_OP_COPY, src, 1, &slot, NULL, 0), MMRT_OK);
    uint16_t *now = op_alloc((size_t)cache->nbytes);
    assert_int_equal(harness_download(&H, cache, now), MMRT_OK);
    for (int64_t i = 0; i < cap * Hkv * D; i++) {
        int64_t t = i / (Hkv * D);
        uint16_t want =
            t >= off && t < off + T ? mmrt_f32_to_f16(kv[i - off * Hkv * D]) : old[i];
        assert_int_equal(now[i], want);
    }
    op_release_all();
}

/* ---- SET_ROWS: exact ------------------------------------------------------------------ */

/* Values whose F16/BF16 rounding is delicate (halfway cases, overflow, subnormals, NaN). */
static const uint32_t set_rows_edge[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x3f801000, 0x3f803000,
    0x477fe000, 0x477fefff, 0x477ff000, 0x387fffff, 0x33000000, 0x33c00000, 0x3f808000,
    0x3f818000, 0x7f7fffff,
    /* FP8 E4M3: 448, 464 (the tie above 448), 480 and 1e6 (saturate), 2^-10 (a tie to 0),
     * 3·2^-10 (a tie to 2·2^-9), 1.0625 (a tie to 1), 2^-6 − ε (rounds up to the smallest
     * normal), −inf */
    0x43e00000, 0x43e80000, 0x43f00000, 0x49742400, 0x3a800000, 0x3b400000, 0x3f880000,
    0x3c7fffff, 0xff800000,
};

/* Each of mmrt_f8e4m3_to_f32 / mmrt_f32_to_f8e4m3 (plugin.h, what every plugin uses) against
 * ref_ops' definition-based ones: all 256 codes, then f32 patterns every 251 bit patterns
 * plus every code's value, its neighbours and the midpoints between codes (the ties). The
 * whole 2^32 comparison with torch.float8_e4m3fn is tools/check_fp8_e4m3.py. */
static void test_f8e4m3_conversions(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        float a = mmrt_f8e4m3_to_f32((uint8_t)c), b = ref_f8e4m3_value((uint8_t)c);
        if (memcmp(&a, &b, 4) != 0 && !(isnan(a) && isnan(b)))
            fail_msg("code 0x%02x decodes to %.9g, want %.9g", c, (double)a, (double)b);
        if (!isnan(a) && mmrt_f32_to_f8e4m3(a) != c)
            fail_msg("code 0x%02x: %.9g encodes to 0x%02x", c, (double)a, mmrt_f32_to_f8e4m3(a));
    }
    assert_true(mmrt_f8e4m3_to_f32(0x7E) == 448.0f && mmrt_f8e4m3_to_f32(0x01) == 0x1.0p-9f);
    assert_true(isnan(mmrt_f8e4m3_to_f32(0x7F)) && isnan(mmrt_f8e4m3_to_f32(0xFF)));
    assert_int_equal(mmrt_f32_to_f8e4m3(INFINITY), 0x7E);
    assert_int_equal(mmrt_f32_to_f8e4m3(-1e30f), 0xFE);
    assert_int_equal(mmrt_f32_to_f8e4m3(-NAN) & 0x7F, 0x7F);
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        if (mmrt_f32_to_f8e4m3(f) != ref_f8e4m3_encode(f))
            fail_msg("f32 0x%08x (%.9g) encodes to 0x%02x, want 0x%02x", b, (double)f,
                     mmrt_f32_to_f8e4m3(f), ref_f8e4m3_encode(f));
    }
    for (int c = 0; c < 0x7E; c++) {
        const float lo = ref_f8e4m3_value((uint8_t)c), hi = ref_f8e4m3_value((uint8_t)(c + 1));
        const float probes[] = { lo, nextafterf(lo, 0), nextafterf(lo, 1000), (lo + hi) / 2,
                                 nextafterf((lo + hi) / 2, 0), nextafterf((lo + hi) / 2, 1000) };
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
            for (int sgn = 0; sgn < 2; sgn++) {
                float f = sgn ? -probes[i] : probes[i];
                if (mmrt_f32_to_f8e4m3(f) != ref_f8e4m3_encode(f))
                    fail_msg("%.9g encodes to 0x%02x, want 0x%02x", (double)f,
                             mmrt_f32_to_f8e4m3(f), ref_f8e4m3_encode(f));
            }
    }
}


static void test_set_rows(void **state)
{
    (void)state;
    static const struct {
        int n_dims;
        int64_t ne[MMRT_MAX_DIMS]; /* dst [R, …] */
        int64_t T;
    } cases[] = {
        { 3, { 16, 4, 8 }, 1 },      /* one decode token into a [R, H, D] KV cache */
        { 3, { 37, 2, 64 }, 1 },
        { 2, { 7, 33 }, 5 },
        { 1, { 9 }, 6 },             /* scalar rows */
        { 4, { 40, 2, 3, 5 }, 9 },
        { 2, { 64, 128 }, 64 },      /* every row, permuted */
        { 2, { 1, 1 }, 1 },
        { 3, { 30, 8, 80 }, 30 },
    };
    op_rng_seed(20);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 4; d++) {
            enum mmrt_dtype dt = op_kv_table_dtypes[d];
            int nd = cases[c].n_dims;
            int64_t R = cases[c].ne[0], T = cases[c].T, n = 1, vne[MMRT_MAX_DIMS];
            for (int i = 1; i < nd; i++)
                n *= cases[c].ne[i];
            memcpy(vne, cases[c].ne, sizeof vne);
            vne[0] = T;
            /* Distinct in-range indices (a permutation's prefix), then some out of range. */
            int32_t *perm = op_alloc((size_t)R * 4), *idx = op_alloc((size_t)T * 4);
            for (int64_t r = 0; r < R; r++)
                perm[r] = (int32_t)r;
            for (int64_t r = R - 1; r > 0; r--) {
                int64_t j = op_rng_int(0, (int)r);
                int32_t tmp = perm[r];
                perm[r] = perm[j];
                perm[j] = tmp;
            }
            static const int32_t outside[] = { -1, INT32_MIN, INT32_MAX };
            for (int64_t t = 0; t < T; t++)
                idx[t] = perm[t];
            if (T > 2) {
                idx[1] = (int32_t)R;            /* one past the end */
                idx[2] = outside[c % 3];
            } else if (T == 1 && c == 1) {
                idx[0] = (int32_t)R - 1;        /* the last row */
            }
            float *v = op_rand_f(T * n, -5, 5);
            memcpy(v, set_rows_edge, sizeof set_rows_edge < (size_t)(T * n) * 4
                                         ? sizeof set_rows_edge : (size_t)(T * n) * 4);
            float *old;
            struct harness_tensor *tv = tnew(MMRT_DTYPE_F32, nd, vne);
            upload(tv, v);
            struct harness_tensor *ti = tnew(MMRT_DTYPE_I32, SHAPE(T));
            upload_i32(ti, idx);
            struct harness_tensor *ty = trand(dt, -100, 100, &old, nd, cases[c].ne);
            struct harness_tensor *src[2] = { tv, ti };
            assert_int_equal(run(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0), MMRT_OK);
            double *ref = op_ref_buf(R * n);
            for (int64_t i = 0; i < R * n; i++)
                ref[i] = old[i];
            ref_set_rows(v, idx, T, n, R, ref);
            size_t es = mmrt_dtype_size(dt);
            uint8_t *got = op_alloc((size_t)ty->nbytes);
            assert_int_equal(harness_download(&H, ty, got), MMRT_OK);
            for (int64_t i = 0; i < R * n; i++) {
                uint8_t want[4];
                float f = (float)ref[i];
                op_convert_one(MMRT_DTYPE_F32, (const uint8_t *)&f, dt, want);
                if (!op_same_value(dt, got + i * (int64_t)es, want)) {
                    uint32_t g = 0, w = 0;
                    memcpy(&g, got + i * (int64_t)es, es);
                    memcpy(&w, want, es);
                    fail_msg("SET_ROWS case %zu %s: dst row %lld element %lld is 0x%x, want 0x%x "
                             "(f32 %.9g)", c, mmrt_dtype_name_of(dt), (long long)(i / n),
                             (long long)(i % n), g, w, (double)f);
                }
            }
            op_release_all();
        }
}

/* Equal indices leave one of the rows whole (plugin.h: "either row"), never a mix; the
 * other rows are untouched. */
static void test_set_rows_duplicates(void **state)
{
    (void)state;
    op_rng_seed(21);
    for (int d = 0; d < 3; d++) {
        enum mmrt_dtype dt = op_weight_dtypes[d];
        int64_t R = 6, T = 5, n = 3000; /* rows long enough to be split across the threads */
        int32_t idx[5] = { 2, 4, 2, 2, 0 };
        float *v, *old;
        struct harness_tensor *tv = trand(MMRT_DTYPE_F32, -1, 1, &v, SHAPE(T, n));
        op_round_to(dt, v, T * n); /* so each candidate row is exactly representable */
        upload(tv, v);
        struct harness_tensor *ti = tnew_i32(idx, T);
        struct harness_tensor *ty = trand(dt, 10, 20, &old, SHAPE(R, n)), *src[2] = { tv, ti };
        assert_int_equal(run(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0), MMRT_OK);
        float *got = op_alloc((size_t)(R * n) * 4);
        uint8_t *raw = op_alloc((size_t)ty->nbytes);
        assert_int_equal(harness_download(&H, ty, raw), MMRT_OK);
        for (int64_t i = 0; i < R * n; i++) {
            uint16_t h;
            if (dt == MMRT_DTYPE_F32) {
                memcpy(&got[i], raw + 4 * i, 4);
                continue;
            }
            memcpy(&h, raw + 2 * i, 2);
            got[i] = dt == MMRT_DTYPE_F16 ? mmrt_f16_to_f32(h) : mmrt_bf16_to_f32(h);
        }
        bool some = false;
        for (int t = 0; t < 5; t++)
            if (idx[t] == 2)
                some |= memcmp(got + 2 * n, v + t * n, (size_t)n * 4) == 0;
        if (!some)
            fail_msg("SET_ROWS %s: row 2 is not one of the three rows written to it",
                     mmrt_dtype_name_of(dt));
        assert_memory_equal(got + 4 * n, v + 1 * n, (size_t)n * 4);
        assert_memory_equal(got + 0 * n, v + 4 * n, (size_t)n * 4);
        for (int r = 0; r < R; r++)
            if (r != 0 && r != 2 && r != 4)
                assert_memory_equal(got + r * n, old + r * n, (size_t)n * 4);
        op_release_all();
    }
}

/* ---- ARGMAX: exact -------------------------------------------------------------------- */

static void test_argmax(void **state)
{
    (void)state;
    static const int64_t cases[][2] = { { 1, 1 }, { 4, 7 }, { 3, 1000 }, { 2, 32000 }, { 9, 2 } };
    op_rng_seed(14);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c][0], N = cases[c][1];
        float *x = op_rand_f(R * N, -5, 5);
        for (int64_t r = 0; r < R; r++) {
            float *row = x + r * N;
            int kind = (int)(r % 5);
            if (kind == 1 && N > 2) { /* a tie: the first of two maxima wins */
                int64_t a = op_rng_int(0, (int)N - 2), b = op_rng_int((int)a + 1, (int)N - 1);
                row[a] = row[b] = 10.0f;
            } else if (kind == 2) { /* NaNs, one in front; never chosen */
                row[0] = NAN;
                row[N - 1] = NAN;
            } else if (kind == 3) { /* all NaN: answer 0 */
                for (int64_t i = 0; i < N; i++)
                    row[i] = NAN;
            } else if (kind == 4) { /* all −inf: the first */
                for (int64_t i = 0; i < N; i++)
                    row[i] = -INFINITY;
            }
        }
        struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(R, N));
        upload(tx, x);
        struct harness_tensor *ty = tnew(MMRT_DTYPE_I32, SHAPE(R));
        struct harness_tensor *src[1] = { tx };
        assert_int_equal(run(MMRT_OP_ARGMAX, src, 1, ty, NULL, 0), MMRT_OK);
        int32_t *got = op_alloc((size_t)R * 4);
        assert_int_equal(harness_download(&H, ty, got), MMRT_OK);
        for (int64_t r = 0; r < R; r++)
            assert_int_equal(got[r], ref_argmax(x + r * N, N));
        op_release_all();
    }
}

/* ---- GATHER_HEADS: exact, L2_NORM: 1e-6 per row ---------------------------------------- */

/* Every case of op_cases.c for every table dtype, bit for bit against ref_gather_heads (the
 * f32 operations plugin.h fixes), on the default kernel table and with 1 and 3 threads: the
 * result must not depend on how the rows are split. dst starts as NaN, so a group of padding
 * must write its zeros; the table's rows past R are NaN, so an entry ≥ R must be skipped. */
static void gather_on(struct harness *h, const char *label)
{
    for (size_t k = 0; k < op_n_gather_cases; k++)
        for (int t = 0; t < 4; t++) {
            const struct op_gather_case *gc = &op_gather_cases[k];
            const int64_t R = gc->R, H_ = gc->H, D = gc->D, N = gc->N, G = gc->G;
            enum mmrt_dtype dt = op_kv_table_dtypes[t];
            const int64_t es = (int64_t)mmrt_dtype_size(dt);
            struct op_gather_data d;
            op_gather_build(gc, dt, 230 + k, &d);
            struct harness_tensor *base = op_tensor_new(h, dt, SHAPE(R + 2, H_, D));
            assert_int_equal(harness_upload(h, base, op_encode(dt, d.table, (R + 2) * H_ * D)),
                             MMRT_OK);
            struct harness_tensor tab = op_view(base, dt, SHAPE(R, H_, D),
                                                (const int64_t[]){ H_ * D * es, D * es, es }, 0);
            struct harness_tensor *idx = op_tensor_new(h, MMRT_DTYPE_I32, SHAPE(N, H_, G));
            assert_int_equal(harness_upload(h, idx, d.idx), MMRT_OK);
            struct harness_tensor *y = op_tensor_new(h, MMRT_DTYPE_F32, SHAPE(N, H_, D));
            float *got = op_alloc((size_t)(N * H_ * D) * 4);
            for (int64_t i = 0; i < N * H_ * D; i++)
                got[i] = NAN;
            assert_int_equal(harness_upload(h, y, got), MMRT_OK);
            struct harness_tensor *src[2] = { &tab, idx };
            assert_int_equal(harness_run(h, MMRT_OP_GATHER_HEADS, src, 2, y, NULL, 0), MMRT_OK);
            assert_int_equal(harness_download(h, y, got), MMRT_OK);
            for (int64_t i = 0; i < N * H_ * D; i++)
                if (memcmp(&got[i], &d.want[i], 4) != 0)
                    fail_msg("GATHER_HEADS (%s) case %zu %s: element %lld (n %lld, h %lld) is "
                             "%.9g, want %.9g", label, k, mmrt_dtype_name_of(dt), (long long)i,
                             (long long)(i / (H_ * D)), (long long)(i / D % H_), (double)got[i],
                             (double)d.want[i]);
            op_release_all();
        }
}

static void test_gather_heads(void **state)
{
    (void)state;
    gather_on(&H, "3 threads");
    struct harness one;
    struct mmrt_option opt = { "threads", "1" };
    assert_int_equal(harness_open(&one, harness_plugin_path("cpu"), &opt, 1), MMRT_OK);
    gather_on(&one, "1 thread");
    harness_close(&one);
}

/* Σ x² in double, then one rounding of its square root: within an ulp or so of the exact
 * norm on every row, whatever its magnitude. */
static void test_l2_norm(void **state)
{
    (void)state;
    op_rng_seed(24);
    for (size_t k = 0; k < op_n_l2_cases; k++) {
        const struct op_l2_case *lc = &op_l2_cases[k];
        int64_t rows = 1, n = lc->ne[lc->n_dims - 1];
        for (int i = 0; i < lc->n_dims - 1; i++)
            rows *= lc->ne[i];
        float *v = op_l2_values(rows, n);
        struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, lc->n_dims, lc->ne);
        upload(tx, v);
        struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(rows)), *src[1] = { tx };
        assert_int_equal(run(MMRT_OP_L2_NORM, src, 1, ty, NULL, 0), MMRT_OK);
        double *ref = op_ref_buf(rows);
        ref_l2_norm(v, rows, n, ref);
        char what[96];
        snprintf(what, sizeof what, "L2_NORM case %zu: %lld rows of %lld", k, (long long)rows,
                 (long long)n);
        op_l2_rows_close(what, download_f32(ty), ref, rows, 1e-6);
        op_release_all();
    }
    /* NaN propagates, ±inf gives +inf. */
    float odd[3][4] = { { 1, NAN, 2, 3 }, { -INFINITY, 1, 2, 3 }, { -3, 4, 0, 0 } };
    struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(3, 4)), *src[1] = { tx };
    upload(tx, &odd[0][0]);
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(3));
    assert_int_equal(run(MMRT_OP_L2_NORM, src, 1, ty, NULL, 0), MMRT_OK);
    float *got = download_f32(ty);
    assert_true(isnan(got[0]));
    assert_true(isinf(got[1]) && got[1] > 0);
    assert_true(got[2] == 5.0f);
    op_release_all();
}

/* The shared refusals of op_cases.c, on the reference plugin. */
static void test_gather_l2_refusals(void **state)
{
    (void)state;
    op_gather_l2_refusals(&H);
    /* The device still computes after them. */
    float x[4] = { 3, 4, 0, 0 };
    struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(1, 4)), *src[1] = { tx };
    upload(tx, x);
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(1));
    assert_int_equal(run(MMRT_OP_L2_NORM, src, 1, ty, NULL, 0), MMRT_OK);
    assert_true(download_f32(ty)[0] == 5.0f);
    op_release_all();
}

/* ---- refusals ------------------------------------------------------------------------- */

/* After every refusal: the error names the op, and the device still computes correctly. */
static void expect_refusal(mmrt_status got, mmrt_status want, const char *op, const char *needle)
{
    const char *msg = H.plugin->last_error(H.dev);
    if (got != want)
        fail_msg("%s: status %d, want %d (%s)", op, (int)got, (int)want, msg);
    if (!strstr(msg, op) || (needle && !strstr(msg, needle)))
        fail_msg("%s: message \"%s\" should name the op%s%s", op, msg, needle ? " and " : "",
                 needle ? needle : "");

    float x[5] = { 1, -2, 3, -4, 5 };
    struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(5));
    upload(tx, x);
    struct harness_tensor *src[1] = { tx };
    struct mmrt_scale_params p = { 2.0f };
    assert_int_equal(run(MMRT_OP_SCALE, src, 1, tx, &p, sizeof p), MMRT_OK);
    float *y = download_f32(tx);
    for (int i = 0; i < 5; i++)
        assert_true(y[i] == 2 * x[i]);
}

static void test_refusals(void **state)
{
    (void)state;
    op_rng_seed(15);
    float *h;
    struct harness_tensor *x = trand(MMRT_DTYPE_F32, -1, 1, &h, SHAPE(4, 8));
    struct harness_tensor *w = trand(MMRT_DTYPE_F16, -1, 1, &h, SHAPE(6, 8));
    struct harness_tensor *y = tnew(MMRT_DTYPE_F32, SHAPE(4, 6));
    struct harness_tensor *xi = tnew(MMRT_DTYPE_I32, SHAPE(4, 8));

    /* GET_ROWS: an id out of range names the id and the row, and writes nothing. */
    float *sentinel = op_rand_f(2 * 8, 7, 8);
    struct harness_tensor *rows = tnew(MMRT_DTYPE_F32, SHAPE(2, 8));
    upload(rows, sentinel);
    for (int k = 0; k < 2; k++) {
        int32_t ids[2] = { 1, k ? -1 : 6 };
        struct harness_tensor *ti = tnew_i32(ids, 2), *src[2] = { w, ti };
        expect_refusal(run(MMRT_OP_GET_ROWS, src, 2, rows, NULL, 0), MMRT_ERR_INVALID_ARG,
                       "GET_ROWS", k ? "id -1 at row 1" : "id 6 at row 1");
        assert_memory_equal(download_f32(rows), sentinel, 16 * sizeof(float));
    }

    /* Wrong dtypes. */
    struct harness_tensor *mm_bad_x[2] = { xi, w };
    expect_refusal(run(MMRT_OP_MATMUL, mm_bad_x, 2, y, NULL, 0), MMRT_ERR_INVALID_ARG, "MATMUL",
                   "I32");
    struct harness_tensor *ydt = tnew(MMRT_DTYPE_F16, SHAPE(4, 6)), *mm[2] = { x, w };
    expect_refusal(run(MMRT_OP_MATMUL, mm, 2, ydt, NULL, 0), MMRT_ERR_INVALID_ARG, "MATMUL", "dst");

    /* Mismatched shapes. */
    struct harness_tensor *w9 = tnew(MMRT_DTYPE_F32, SHAPE(6, 9)), *mm9[2] = { x, w9 };
    expect_refusal(run(MMRT_OP_MATMUL, mm9, 2, y, NULL, 0), MMRT_ERR_INVALID_ARG, "MATMUL", NULL);
    struct harness_tensor *b3 = tnew(MMRT_DTYPE_F32, SHAPE(3)), *add[2] = { x, b3 };
    struct harness_tensor *y48 = tnew(MMRT_DTYPE_F32, SHAPE(4, 8));
    expect_refusal(run(MMRT_OP_ADD, add, 2, y48, NULL, 0), MMRT_ERR_INVALID_ARG, "ADD", NULL);
    struct harness_tensor *col = tnew(MMRT_DTYPE_F32, SHAPE(8, 1)), *add_col[2] = { x, col };
    expect_refusal(run(MMRT_OP_ADD, add_col, 2, y48, NULL, 0), MMRT_ERR_INVALID_ARG, "ADD",
                   "one row");
    struct harness_tensor *y47 = tnew(MMRT_DTYPE_F32, SHAPE(4, 7)), *sm[1] = { x };
    struct mmrt_scale_params sp = { 1.0f };
    expect_refusal(run(MMRT_OP_SOFTMAX, sm, 1, y47, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SOFTMAX", NULL);
    expect_refusal(run(MMRT_OP_MATMUL, mm, 1, y, NULL, 0), MMRT_ERR_INVALID_ARG, "MATMUL", "n_src");

    /* Params too short or missing. */
    struct harness_tensor *q = trand(MMRT_DTYPE_F32, -1, 1, &h, SHAPE(3, 4, 8));
    struct harness_tensor *kv = trand(MMRT_DTYPE_F32, -1, 1, &h, SHAPE(5, 2, 8));
    struct harness_tensor *yq = tnew(MMRT_DTYPE_F32, SHAPE(3, 4, 8));
    int32_t pos[3] = { 0, 1, 2 };
    struct harness_tensor *tp = tnew_i32(pos, 3), *rope[2] = { q, tp };
    struct mmrt_rope_params rp = { 10000.0f, 8, MMRT_ROPE_NEOX };
    expect_refusal(run(MMRT_OP_ROPE, rope, 2, yq, &rp, sizeof(float)), MMRT_ERR_INVALID_ARG,
                   "ROPE", "params");
    expect_refusal(run(MMRT_OP_SOFTMAX, sm, 1, y48, NULL, 0), MMRT_ERR_INVALID_ARG, "SOFTMAX",
                   "params");
    struct harness_tensor *att[3] = { q, kv, kv };
    struct mmrt_attention_params ap = { 0.35f, 1, 1, 0 };
    expect_refusal(run(MMRT_OP_ATTENTION, att, 3, yq, &ap, 8), MMRT_ERR_INVALID_ARG, "ATTENTION",
                   "params");
    rp.n_rot = 7;
    expect_refusal(run(MMRT_OP_ROPE, rope, 2, yq, &rp, sizeof rp), MMRT_ERR_INVALID_ARG, "ROPE",
                   "n_rot 7");
    rp.n_rot = 10;
    expect_refusal(run(MMRT_OP_ROPE, rope, 2, yq, &rp, sizeof rp), MMRT_ERR_INVALID_ARG, "ROPE",
                   "n_rot 10");

    /* Attention limits: head_dim 300; Hq not a multiple of Hkv; bad cu_seqlens; BF16 K. */
    struct harness_tensor *q300 = tnew(MMRT_DTYPE_F32, SHAPE(2, 1, 300));
    struct harness_tensor *k300 = tnew(MMRT_DTYPE_F32, SHAPE(2, 1, 300));
    struct harness_tensor *y300 = tnew(MMRT_DTYPE_F32, SHAPE(2, 1, 300));
    struct harness_tensor *att300[3] = { q300, k300, k300 };
    expect_refusal(run(MMRT_OP_ATTENTION, att300, 3, y300, &ap, sizeof ap), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "300");
    struct harness_tensor *q6 = tnew(MMRT_DTYPE_F32, SHAPE(3, 6, 8));
    struct harness_tensor *k4 = tnew(MMRT_DTYPE_F32, SHAPE(5, 4, 8));
    struct harness_tensor *y6 = tnew(MMRT_DTYPE_F32, SHAPE(3, 6, 8)), *att64[3] = { q6, k4, k4 };
    expect_refusal(run(MMRT_OP_ATTENTION, att64, 3, y6, &ap, sizeof ap), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "multiple");
    struct harness_tensor *kbf = tnew(MMRT_DTYPE_BF16, SHAPE(5, 2, 8)), *attbf[3] = { q, kbf, kbf };
    expect_refusal(run(MMRT_OP_ATTENTION, attbf, 3, yq, &ap, sizeof ap), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "BF16");
    int32_t cuq[3] = { 0, 2, 3 }, cuk_bad[3] = { 0, 3, 4 }, cuk_dec[3] = { 0, 6, 5 };
    struct harness_tensor *tcq = tnew_i32(cuq, 3), *tck = tnew_i32(cuk_bad, 3);
    struct harness_tensor *tcd = tnew_i32(cuk_dec, 3);
    struct mmrt_attention_params ap2 = { 0.35f, 1, 2, 0 };
    struct harness_tensor *attcu[5] = { q, kv, kv, tcq, tck };
    expect_refusal(run(MMRT_OP_ATTENTION, attcu, 5, yq, &ap2, sizeof ap2), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "cu_seqlens_k");
    attcu[4] = tcd;
    expect_refusal(run(MMRT_OP_ATTENTION, attcu, 5, yq, &ap2, sizeof ap2), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "cu_seqlens_k");
    attcu[4] = NULL;
    expect_refusal(run(MMRT_OP_ATTENTION, attcu, 5, yq, &ap2, sizeof ap2), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "both");
    /* A sliding window: bidirectional or negative is refused. */
    struct mmrt_attention_params apw = { 0.35f, 0, 1, 3 };
    expect_refusal(run(MMRT_OP_ATTENTION, att, 3, yq, &apw, sizeof apw), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "window 3 needs causal = 1");
    apw.causal = 1;
    apw.window = -2;
    expect_refusal(run(MMRT_OP_ATTENTION, att, 3, yq, &apw, sizeof apw), MMRT_ERR_INVALID_ARG,
                   "ATTENTION", "window -2 must be ≥ 0");

    /* Descriptors that do not fit their arena, misaligned, foreign or self-overlapping. */
    struct harness_tensor big =
        op_view(x, MMRT_DTYPE_F32, SHAPE(5, 8), (const int64_t[]){ 32, 4 }, 0);
    struct harness_tensor *sc_big[1] = { &big };
    expect_refusal(run(MMRT_OP_SCALE, sc_big, 1, y48, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SCALE", "outside");
    struct harness_tensor odd = op_view(x, MMRT_DTYPE_F32, SHAPE(7), (const int64_t[]){ 4 }, 2);
    struct harness_tensor *sc_odd[1] = { &odd };
    struct harness_tensor *y7 = tnew(MMRT_DTYPE_F32, SHAPE(7));
    expect_refusal(run(MMRT_OP_SCALE, sc_odd, 1, y7, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SCALE", "offset 2");
    float not_an_arena[8];
    struct harness_tensor foreign = *y7;
    foreign.t.buffer = not_an_arena;
    struct harness_tensor *sc_for[1] = { &foreign };
    expect_refusal(run(MMRT_OP_SCALE, sc_for, 1, y7, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SCALE", "not an arena");
    struct harness_tensor x31 = op_view(x, MMRT_DTYPE_F32, SHAPE(31), (const int64_t[]){ 4 }, 0);
    struct harness_tensor y31 = op_view(x, MMRT_DTYPE_F32, SHAPE(31), (const int64_t[]){ 4 }, 4);
    struct harness_tensor *sc_ov[1] = { &x31 };
    expect_refusal(run(MMRT_OP_SCALE, sc_ov, 1, &y31, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SCALE", "overlaps");
    struct harness_tensor bcast_dst = op_view(y48, MMRT_DTYPE_F32, SHAPE(4, 8),
                                            (const int64_t[]){ 0, 4 }, 0);
    struct harness_tensor *cp[1] = { x };
    expect_refusal(run(MMRT_OP_COPY, cp, 1, &bcast_dst, NULL, 0), MMRT_ERR_INVALID_ARG, "COPY",
                   "overlap");
    struct harness_tensor bad_rank = *x;
    bad_rank.t.n_dims = 5;
    struct harness_tensor *sc_rank[1] = { &bad_rank };
    expect_refusal(run(MMRT_OP_SCALE, sc_rank, 1, y48, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SCALE", "n_dims");
    struct harness_tensor bad_dt = *x;
    bad_dt.t.dtype = 9;
    struct harness_tensor *sc_dt[1] = { &bad_dt };
    expect_refusal(run(MMRT_OP_SCALE, sc_dt, 1, y48, &sp, sizeof sp), MMRT_ERR_INVALID_ARG,
                   "SCALE", "dtype 9");

    /* Other contracts: COPY I32 → F32, CONCAT axis, PATCH_EMBED size, args for another op. */
    struct harness_tensor *cpi[1] = { xi };
    expect_refusal(run(MMRT_OP_COPY, cpi, 1, y48, NULL, 0), MMRT_ERR_INVALID_ARG, "COPY", "I32");
    struct mmrt_concat_params cc = { 2 };
    struct harness_tensor *y88 = tnew(MMRT_DTYPE_F32, SHAPE(8, 8)), *cat[2] = { x, x };
    expect_refusal(run(MMRT_OP_CONCAT, cat, 2, y88, &cc, sizeof cc), MMRT_ERR_INVALID_ARG,
                   "CONCAT", "axis 2");
    struct harness_tensor *img = tnew(MMRT_DTYPE_F32, SHAPE(1, 1, 6, 7));
    struct harness_tensor *pw = tnew(MMRT_DTYPE_F32, SHAPE(2, 1, 3, 3));
    struct harness_tensor *py = tnew(MMRT_DTYPE_F32, SHAPE(1, 4, 2)), *pe[2] = { img, pw };
    struct mmrt_patch_params pp = { 3 };
    expect_refusal(run(MMRT_OP_PATCH_EMBED, pe, 2, py, &pp, sizeof pp), MMRT_ERR_INVALID_ARG,
                   "PATCH_EMBED", "divide");
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args), .op = MMRT_OP_MUL, .n_src = 2,
        .src = { &x->t, &x->t }, .dst = &y48->t,
    };
    expect_refusal(H.plugin->ops[MMRT_OP_ADD](H.dev, &args), MMRT_ERR_INVALID_ARG, "ADD", "MUL");
    args.op = MMRT_OP_ADD;
    args.hdr.struct_size = 8;
    expect_refusal(H.plugin->ops[MMRT_OP_ADD](H.dev, &args), MMRT_ERR_INVALID_ARG, "ADD", "ABI");
    op_release_all();
}

/* ROPE_MULTI and SET_ROWS refuse what plugin.h rules out, naming the operand or parameter;
 * SET_ROWS with an index outside [0, R) is no error and writes nothing. */
static void test_rope_multi_set_rows_refusals(void **state)
{
    (void)state;
    op_rng_seed(22);
    float *h;
    struct harness_tensor *q = trand(MMRT_DTYPE_F32, -1, 1, &h, SHAPE(3, 4, 8));
    struct harness_tensor *yq = tnew(MMRT_DTYPE_F32, SHAPE(3, 4, 8));
    int32_t pos3[9] = { 0, 1, 2, 3, 4, 5, 6, 7, 8 };
    struct harness_tensor *tp = tnew(MMRT_DTYPE_I32, SHAPE(3, 3));
    upload_i32(tp, pos3);
    struct harness_tensor *rm[2] = { q, tp };
    const struct mmrt_rope_multi_params good = { 1e4f, 8, 8, 0, 3, { 2, 1, 1 } };
    assert_int_equal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &good, sizeof good), MMRT_OK);
    struct mmrt_rope_multi_params p = good;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof(struct mmrt_rope_params)),
                   MMRT_ERR_INVALID_ARG, "ROPE_MULTI", "params");
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "params");
    p.n_axes = 0;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "n_axes 0");
    p.n_axes = MMRT_ROPE_MAX_AXES + 1;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "n_axes 5");
    p = good;
    p.sections[2] = 0;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "sections sum to 3 pairs, n_rot/2 is 4");
    p = good;
    p.sections[3] = -7; /* not an axis when n_axes is 3: never read */
    assert_int_equal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_OK);
    p = good;
    p.sections[0] = 4, p.sections[1] = -1, p.sections[2] = 1;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "section 1 has -1 pairs");
    p = good;
    p.freq_dim = 0;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "freq_dim 0");
    p = good;
    p.restart = 2;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "restart 2");
    p = good;
    p.n_rot = 9;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "n_rot 9");
    p = good;
    p.theta = 0.0f;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "theta");
    p = good;
    p.n_axes = 2, p.sections[0] = 2, p.sections[1] = 2, p.sections[2] = 0;
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yq, &p, sizeof p), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "[T, n_axes] = [3, 2]");
    struct harness_tensor *tp1 = tnew_i32(pos3, 3), *rm1[2] = { q, tp1 };
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm1, 2, yq, &good, sizeof good), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "[T, n_axes] = [3, 3]");
    struct harness_tensor *tpf = tnew(MMRT_DTYPE_F32, SHAPE(3, 3)), *rmf[2] = { q, tpf };
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rmf, 2, yq, &good, sizeof good), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "src1 (positions) has dtype F32");
    struct harness_tensor *yh = tnew(MMRT_DTYPE_F16, SHAPE(3, 4, 8));
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, yh, &good, sizeof good), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "dst has dtype F16");
    struct harness_tensor *y2 = tnew(MMRT_DTYPE_F32, SHAPE(3, 4, 6));
    expect_refusal(run(MMRT_OP_ROPE_MULTI, rm, 2, y2, &good, sizeof good), MMRT_ERR_INVALID_ARG,
                   "ROPE_MULTI", "x's shape");

    /* SET_ROWS. */
    float *v;
    struct harness_tensor *tv = trand(MMRT_DTYPE_F32, -1, 1, &v, SHAPE(2, 4, 8));
    int32_t idx[2] = { 3, 0 };
    struct harness_tensor *ti = tnew_i32(idx, 2), *sr[2] = { tv, ti };
    struct harness_tensor *cache = tnew(MMRT_DTYPE_F16, SHAPE(5, 4, 8));
    assert_int_equal(run(MMRT_OP_SET_ROWS, sr, 2, cache, NULL, 0), MMRT_OK);
    struct harness_tensor *ci = tnew(MMRT_DTYPE_I32, SHAPE(5, 4, 8));
    expect_refusal(run(MMRT_OP_SET_ROWS, sr, 2, ci, NULL, 0), MMRT_ERR_INVALID_ARG, "SET_ROWS",
                   "dst has dtype I32");
    struct harness_tensor *vh = tnew(MMRT_DTYPE_F16, SHAPE(2, 4, 8)), *srh[2] = { vh, ti };
    expect_refusal(run(MMRT_OP_SET_ROWS, srh, 2, cache, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SET_ROWS", "src0 (values) has dtype F16");
    struct harness_tensor *ti3 = tnew_i32(pos3, 3), *sr3[2] = { tv, ti3 };
    expect_refusal(run(MMRT_OP_SET_ROWS, sr3, 2, cache, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SET_ROWS", "src1 (idx) has 3 entries, expected 2");
    struct harness_tensor *tif = tnew(MMRT_DTYPE_F32, SHAPE(2)), *srf[2] = { tv, tif };
    expect_refusal(run(MMRT_OP_SET_ROWS, srf, 2, cache, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SET_ROWS", "src1 (idx) has dtype F32");
    struct harness_tensor *c9 = tnew(MMRT_DTYPE_F32, SHAPE(5, 4, 9));
    expect_refusal(run(MMRT_OP_SET_ROWS, sr, 2, c9, NULL, 0), MMRT_ERR_INVALID_ARG, "SET_ROWS",
                   "dim 2");
    struct harness_tensor *c2 = tnew(MMRT_DTYPE_F32, SHAPE(5, 32));
    expect_refusal(run(MMRT_OP_SET_ROWS, sr, 2, c2, NULL, 0), MMRT_ERR_INVALID_ARG, "SET_ROWS",
                   "dst must have 3 dims");
    struct harness_tensor strided = op_view(cache, MMRT_DTYPE_F16, SHAPE(2, 4, 8),
                                          (const int64_t[]){ 2 * 32 * 2, 8 * 2, 2 }, 0);
    expect_refusal(run(MMRT_OP_SET_ROWS, sr, 2, &strided, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SET_ROWS", "dst must be contiguous");
    struct harness_tensor *big = tnew(MMRT_DTYPE_F32, SHAPE(6, 4, 8));
    struct harness_tensor vin = op_view(big, MMRT_DTYPE_F32, SHAPE(2, 4, 8),
                                      (const int64_t[]){ 32 * 4, 8 * 4, 4 }, 32 * 4);
    struct harness_tensor *sro[2] = { &vin, ti };
    expect_refusal(run(MMRT_OP_SET_ROWS, sro, 2, big, NULL, 0), MMRT_ERR_INVALID_ARG, "SET_ROWS",
                   "overlaps");

    /* Indices outside [0, R): OK, nothing written. */
    float *before;
    struct harness_tensor *tc = trand(MMRT_DTYPE_BF16, -1, 1, &before, SHAPE(5, 4, 8));
    for (int k = 0; k < 4; k++) {
        static const int32_t outside[4][2] = { { 5, -1 }, { INT32_MIN, INT32_MAX }, { 6, 5 },
                                               { -5, 1000 } };
        struct harness_tensor *to = tnew_i32(outside[k], 2), *sro2[2] = { tv, to };
        assert_int_equal(run(MMRT_OP_SET_ROWS, sro2, 2, tc, NULL, 0), MMRT_OK);
        uint16_t *raw = op_alloc(5 * 32 * 2);
        assert_int_equal(harness_download(&H, tc, raw), MMRT_OK);
        for (int i = 0; i < 5 * 32; i++)
            assert_true(mmrt_bf16_to_f32(raw[i]) == before[i]);
    }
    /* T = 1, out of range: the decode step with a stale index writes nothing. */
    struct harness_tensor *t1 = trand(MMRT_DTYPE_F32, -1, 1, &v, SHAPE(1, 4, 8));
    int32_t one = 5;
    struct harness_tensor *to1 = tnew_i32(&one, 1), *sr1[2] = { t1, to1 };
    assert_int_equal(run(MMRT_OP_SET_ROWS, sr1, 2, tc, NULL, 0), MMRT_OK);
    uint16_t *raw = op_alloc(5 * 32 * 2);
    assert_int_equal(harness_download(&H, tc, raw), MMRT_OK);
    for (int i = 0; i < 5 * 32; i++)
        assert_true(mmrt_bf16_to_f32(raw[i]) == before[i]);
    op_release_all();
}

/* ---- ATTENTION_PAGED: tolerance 1e-5, ATTENTION's bits, batch invariance -------------------
 * The CPU plugin reads a sequence's keys in key order through one row-address function
 * whichever op delivers them, so ATTENTION_PAGED must equal ATTENTION over the same keys
 * gathered contiguously bit for bit, on the micro-kernel table and on the portable one. */

/* The tensors of a paged launch on H, and its params. */
struct paged_tensors {
    struct harness_tensor *src[8], *y; /* src[6], src[7]: an I8 case's scales */
    struct mmrt_attention_params p;
};

static void paged_tensors(const struct op_paged_case *pc, const struct op_paged_data *d,
                          struct paged_tensors *pt)
{
    op_paged_tensors(&H, pc, d, pt->src, &pt->y);
    pt->p = (struct mmrt_attention_params){ d->scale, pc->causal, pc->n_seq, pc->window };
}

static float *paged_run_cpu(const struct op_paged_case *pc, const struct op_paged_data *d)
{
    struct paged_tensors pt;
    paged_tensors(pc, d, &pt);
    const int n_src = pc->kv_dtype == MMRT_DTYPE_I8 ? 8 : 6;
    assert_int_equal(run(MMRT_OP_ATTENTION_PAGED, pt.src, n_src, pt.y, &pt.p, sizeof pt.p),
                     MMRT_OK);
    return download_f32(pt.y);
}

/* The same queries and keys through ATTENTION, K and V gathered into [S, Hkv, D]. I8 pages
 * stand for code · scale, so they go as an F32 copy of those values: the bits must agree. */
static float *paged_as_attention(const struct op_paged_case *pc, const struct op_paged_data *d)
{
    const int64_t Hq = pc->Hq, Hkv = pc->Hkv, D = pc->D, S = d->S;
    const enum mmrt_dtype kv = pc->kv_dtype == MMRT_DTYPE_I8 ? MMRT_DTYPE_F32 : pc->kv_dtype;
    assert_true(S > 0);
    struct harness_tensor *tq = tnew(MMRT_DTYPE_F32, SHAPE(d->T, Hq, D));
    assert_int_equal(harness_upload(&H, tq, d->q), MMRT_OK);
    struct harness_tensor *tk = tnew(kv, SHAPE(S, Hkv, D));
    struct harness_tensor *tv = tnew(kv, SHAPE(S, Hkv, D));
    assert_int_equal(harness_upload(&H, tk, op_encode(kv, d->k, d->S * Hkv * D)), MMRT_OK);
    assert_int_equal(harness_upload(&H, tv, op_encode(kv, d->v, d->S * Hkv * D)), MMRT_OK);
    struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(d->T, Hq, D));
    struct harness_tensor *src[5] = { tq, tk, tv, tnew_i32(d->cu_q, pc->n_seq + 1),
                                      tnew_i32(d->cu_k, pc->n_seq + 1) };
    struct mmrt_attention_params p = { d->scale, pc->causal, pc->n_seq, pc->window };
    assert_int_equal(run(MMRT_OP_ATTENTION, src, 5, ty, &p, sizeof p), MMRT_OK);
    return download_f32(ty);
}

/* Beyond the shared cases: the streaming / blocked boundary (4 and 5 queries) with pages
 * smaller than a micro-panel, many query blocks, GQA 8 with 64 queries; and decode batches
 * of many sequences of ragged lengths (GQA with F16 pages of 5; MHA with F32), whose rows must
 * be the bits each sequence gets alone. */
static const struct op_paged_entry cpu_paged_cases[] = {
    { { 14, 7, 64, 5, 8, { 1, 1, 2, 1, 4, 1, 3, 1 }, { 40, 7, 33, 1, 50, 19, 24, 64 }, 1, MMRT_DTYPE_F16, OP_PAGES_SHUFFLED, 1, 0 }, 4, 3, false },
    { { 32, 32, 32, 16, 4, { 1, 1, 1, 1 }, { 30, 17, 45, 2 }, 1, MMRT_DTYPE_F32, OP_PAGES_SHUFFLED, 1, 0 }, 2, 1, false },
    { { 16, 2, 64, 5, 3, { 4, 5, 2 }, { 60, 61, 2 }, 1, MMRT_DTYPE_F16, OP_PAGES_SHUFFLED, 1, 0 }, 1, 16, false },
    { { 8, 8, 96, 7, 2, { 1, 129 }, { 1, 129 }, 1, MMRT_DTYPE_F32, OP_PAGES_SHUFFLED, 1, 0 }, 1, 1, false },
    { { 8, 1, 64, 16, 2, { 64, 3 }, { 100, 3 }, 0, MMRT_DTYPE_F16, OP_PAGES_SHARED, 2, 0 }, 0, 5, false },
    /* FP8 E4M3 GQA 7 decode batch over pages of 5 (the shared table has its other cases). */
    { { 14, 7, 64, 5, 8, { 1, 1, 2, 1, 4, 1, 3, 1 }, { 40, 7, 33, 1, 50, 19, 24, 64 }, 1, MMRT_DTYPE_F8E4M3, OP_PAGES_SHUFFLED, 1, 0 }, 4, 3, false },
};

static const struct op_paged_entry *paged_entry(size_t c)
{
    return c < op_n_paged_cases ? &op_paged_cases[c] : &cpu_paged_cases[c - op_n_paged_cases];
}

static const size_t n_paged_entries =
    sizeof cpu_paged_cases / sizeof cpu_paged_cases[0];

static void paged_checks_on(const char *isa)
{
    for (size_t c = 0; c < op_n_paged_cases + n_paged_entries; c++) {
        const struct op_paged_entry *e = paged_entry(c);
        const struct op_paged_case *pc = &e->pc;
        struct op_paged_data d;
        op_paged_build(pc, 500 + c, &d);
        float *got = paged_run_cpu(pc, &d);
        int64_t n = d.T * pc->Hq * pc->D;
        double *ref = op_ref_buf(n);
        ref_attention_paged(d.q, d.k_pages, d.v_pages, d.T, pc->Hq, pc->Hkv, pc->D,
                            pc->page_tokens, d.cu_q, d.kv_lens, d.table, d.max_pages, pc->n_seq,
                            d.scale, pc->causal, pc->window, ref);
        char what[128];
        snprintf(what, sizeof what, "ATTENTION_PAGED case %zu (isa %s)", c, isa);
        op_check_close(what, got, ref, n, 1e-5);
        op_paged_zero_rows(what, got, ref, n);
        char same[160];
        snprintf(same, sizeof same, "%s vs ATTENTION", what);
        op_paged_same_bits(same, paged_as_attention(pc, &d), got, n);
        op_release_all();
    }
}

static void test_attention_paged(void **state)
{
    (void)state;
    paged_checks_on("default");
    /* The other tables (an ISA this CPU lacks is refused at open and skipped). */
    static const char *const isas[] = { "portable", "avx2" };
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness saved = H, other;
        struct mmrt_option opts[2] = { { "isa", isas[i] }, { "threads", "3" } };
        if (harness_open(&other, harness_plugin_path("cpu"), opts, 2) != MMRT_OK)
            continue;
        H = other;
        paged_checks_on(isas[i]);
        harness_close(&other);
        H = saved;
    }
}

/* A sequence's rows are the same bits alone as in its batch, whatever the page size and
 * order: every case's named sequence, and every other sequence with queries too. */
static void test_attention_paged_invariance(void **state)
{
    (void)state;
    static const int alone_pt[] = { 1, 3, 16, 64 };
    for (size_t c = 0; c < op_n_paged_cases + n_paged_entries; c++) {
        const struct op_paged_entry *e = paged_entry(c);
        const struct op_paged_case *pc = &e->pc;
        struct op_paged_data d;
        op_paged_build(pc, 600 + c, &d);
        float *batch = paged_run_cpu(pc, &d);
        for (int s = 0; s < pc->n_seq; s++) {
            if (pc->lq[s] == 0)
                continue;
            int pt = s == e->alone_seq ? e->alone_pt : alone_pt[(c + (size_t)s) % 4];
            struct op_paged_case apc;
            struct op_paged_data ad;
            op_paged_alone(pc, &d, s, pt, &apc, &ad);
            float *alone = paged_run_cpu(&apc, &ad);
            char what[128];
            snprintf(what, sizeof what, "ATTENTION_PAGED case %zu sequence %d alone in pages of %d",
                     c, s, pt);
            int64_t row = (int64_t)pc->Hq * pc->D;
            op_paged_same_bits(what, batch + d.cu_q[s] * row, alone, pc->lq[s] * row);
        }
        op_release_all();
    }
}

/* How many neighbouring kv heads a decode item reads together follows the thread count and
 * the other sequences' lengths (stream_heads in cpu_ops_attention.c); a row's bits must not.
 * Every case on one thread (each item takes all kv heads) against the same on three. */
static void test_attention_paged_threads(void **state)
{
    (void)state;
    struct harness saved = H, one;
    struct mmrt_option opt = { "threads", "1" };
    assert_int_equal(harness_open(&one, harness_plugin_path("cpu"), &opt, 1), MMRT_OK);
    for (size_t c = 0; c < op_n_paged_cases + n_paged_entries; c++) {
        const struct op_paged_case *pc = &paged_entry(c)->pc;
        struct op_paged_data d;
        op_paged_build(pc, 700 + c, &d);
        float *three = paged_run_cpu(pc, &d);
        H = one;
        float *single = paged_run_cpu(pc, &d);
        H = saved;
        char what[96];
        snprintf(what, sizeof what, "ATTENTION_PAGED case %zu, 3 threads vs 1", c);
        op_paged_same_bits(what, three, single, d.T * pc->Hq * pc->D);
        op_release_all();
    }
    harness_close(&one);
}

/* Values only the launch can see (op_paged_bad): a page id outside the pool, a kv_len beyond
 * the table's capacity or negative, cu_seqlens_q that do not run from 0 to T; each is refused
 * at the launch with the entry named and dst untouched, while table entries past a sequence's
 * last page are never looked at. Then shapes the plugin refuses itself. */
static void test_attention_paged_bad_values(void **state)
{
    (void)state;
    struct op_paged_bad_run r;
    op_paged_bad_setup(&H, &r);
    for (size_t b = 0; b < op_n_paged_bad; b++) {
        op_paged_bad_set(&H, &r, b);
        expect_refusal(run(MMRT_OP_ATTENTION_PAGED, r.src, 6, r.y, &r.p, sizeof r.p),
                       MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", op_paged_bad[b].needle);
        op_paged_bad_untouched(&H, &r);
    }
    op_paged_bad_set(&H, &r, op_n_paged_bad);
    assert_int_equal(run(MMRT_OP_ATTENTION_PAGED, r.src, 6, r.y, &r.p, sizeof r.p), MMRT_OK);

    /* Shapes the core refuses too, refused by the plugin itself. */
    struct harness_tensor *v16 = tnew(MMRT_DTYPE_F16, SHAPE(r.d.n_pages, 4, 1, 16));
    struct harness_tensor *mixed[6] = { r.src[0], r.src[1], v16, r.src[3], r.src[4],
                                        r.src[5] };
    expect_refusal(run(MMRT_OP_ATTENTION_PAGED, mixed, 6, r.y, &r.p, sizeof r.p),
                   MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", "v_pages");
    struct harness_tensor strided =
        op_view(r.src[1], MMRT_DTYPE_F32, SHAPE(r.d.n_pages, 2, 1, 16),
                (const int64_t[]){ 4 * 16 * 4, 16 * 4, 16 * 4, 4 }, 0);
    struct harness_tensor *gap[6] = { r.src[0], &strided, &strided, r.src[3], r.src[4],
                                      r.src[5] };
    expect_refusal(run(MMRT_OP_ATTENTION_PAGED, gap, 6, r.y, &r.p, sizeof r.p),
                   MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", "contiguous");
    struct harness_tensor *five[6] = { r.src[0], r.src[1], r.src[2], r.src[3], r.src[4],
                                       NULL };
    expect_refusal(run(MMRT_OP_ATTENTION_PAGED, five, 5, r.y, &r.p, sizeof r.p),
                   MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", "n_src");
    op_release_all();
}

/* The shared cases of the three ops an INT8 KV store goes through (plugin.h "I8 with row
 * scales"), the portable and avx2 tables against the default one: SET_ROWS codes and scales and
 * GATHER_HEADS bit for bit against the references, ATTENTION_PAGED to the reference and
 * each named sequence alone bit for bit. */
static void kv_i8_close(enum mmrt_op op, const char *what, const float *dut, const float *cpu,
                        const double *ref, int64_t n, double tol)
{
    (void)op;
    op_check_close(what, dut, ref, n, tol);
    op_check_close(what, cpu, ref, n, tol);
}

static void kv_i8_bytes(enum mmrt_op op, const char *what, const void *dut, const void *cpu,
                        const void *want, size_t nbytes)
{
    (void)op;
    if (memcmp(dut, want, nbytes) != 0 || memcmp(cpu, want, nbytes) != 0)
        fail_msg("%s: the bytes differ from the reference (portable %s, default %s)", what,
                 memcmp(dut, want, nbytes) ? "differs" : "agrees",
                 memcmp(cpu, want, nbytes) ? "differs" : "agrees");
}

static void test_kv_i8_shared_cases(void **state)
{
    (void)state;
    static const char *const isas[] = { "portable", "avx2" };
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct harness other;
        struct mmrt_option opts[2] = { { "isa", isas[i] }, { "threads", "3" } };
        if (harness_open(&other, harness_plugin_path("cpu"), opts, 2) != MMRT_OK) {
            assert_string_equal(isas[i], "avx2"); /* only a table this CPU lacks */
            continue;
        }
        op_pair_init(&other, &H, isas[i]);
        const struct op_checks chk = { kv_i8_close, kv_i8_bytes, false, true, true };
        op_case_set_rows(&chk);
        op_case_gather_heads(&chk);
        op_case_attention_paged(&chk, 1e-5);
        harness_close(&other);
    }
}

/* A captured paged launch reads its index tensors at every replay (op_paged_graph_replay). */
static void test_attention_paged_graph(void **state)
{
    (void)state;
    struct harness g;
    struct mmrt_option on = { "graph", "1" };
    assert_int_equal(harness_open(&g, harness_plugin_path("cpu"), &on, 1), MMRT_OK);
    op_paged_graph_replay(&g);
    harness_close(&g);
}

/* ---- graph capture (option graph = 1) ------------------------------------------------- */

/* Capture records, launch replays: a recorded upload rewrites its bytes as they were at
 * capture, while values uploaded before each launch (here the SET_ROWS index) are read
 * fresh, which is what keeps a decode graph valid from step to step. */
static void test_graph_capture(void **state)
{
    (void)state;
    const struct mmrt_plugin *P = H.plugin;
    assert_non_null(P->capture_begin);
    /* off by default */
    assert_int_equal(P->capture_begin(H.dev), MMRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(P->last_error(H.dev), "graph = 1"));
    struct harness bad;
    struct mmrt_option two = { "graph", "2" };
    assert_int_equal(harness_open(&bad, harness_plugin_path("cpu"), &two, 1), MMRT_ERR_CONFIG);

    struct harness saved = H, g;
    struct mmrt_option on = { "graph", "1" };
    assert_int_equal(harness_open(&g, harness_plugin_path("cpu"), &on, 1), MMRT_OK);
    H = g;
    const float a[4] = { 1, -2, 3.5f, 8 }, b[4] = { 100, 100, 100, 100 };
    struct harness_tensor *x = tnew(MMRT_DTYPE_F32, SHAPE(1, 4)),
                          *y = tnew(MMRT_DTYPE_F32, SHAPE(1, 4));
    struct harness_tensor *cache = tnew(MMRT_DTYPE_F32, SHAPE(3, 4));
    struct harness_tensor *idx = tnew_i32((const int32_t[]){ 0 }, 1);
    assert_int_equal(harness_upload(&H, x, b), MMRT_OK);
    assert_int_equal(harness_upload(&H, cache, (const float[12]){ 0 }), MMRT_OK);

    void *graph = NULL;
    assert_int_equal(P->capture_begin(H.dev), MMRT_OK);
    assert_int_equal(harness_upload(&H, x, a), MMRT_OK); /* recorded with a's bytes */
    const struct mmrt_scale_params two_x = { 2.0f };
    struct harness_tensor *sx[1] = { x }, *sr[2] = { y, idx };
    assert_int_equal(run(MMRT_OP_SCALE, sx, 1, y, &two_x, sizeof two_x), MMRT_OK);
    assert_int_equal(run(MMRT_OP_SET_ROWS, sr, 2, cache, NULL, 0), MMRT_OK);
    assert_int_equal(P->capture_end(H.dev, &graph), MMRT_OK);
    assert_non_null(graph);
    /* nothing ran while capturing */
    float *c = download_f32(cache);
    for (int i = 0; i < 12; i++)
        assert_true(c[i] == 0.0f);
    assert_int_equal(harness_upload(&H, x, b), MMRT_OK); /* overwritten again by the replay */
    for (int slot = 2; slot >= 0; slot -= 2) {
        upload_i32(idx, (const int32_t[]){ slot });
        assert_int_equal(P->graph_launch(H.dev, graph), MMRT_OK);
    }
    c = download_f32(cache);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++)
            assert_true(c[r * 4 + i] == (r == 1 ? 0.0f : 2.0f * a[i]));

    /* a download while capturing fails the capture: nothing is kept */
    void *none = (void *)1;
    assert_int_equal(P->capture_begin(H.dev), MMRT_OK);
    assert_int_equal(run(MMRT_OP_SCALE, sx, 1, y, &two_x, sizeof two_x), MMRT_OK);
    float tmp[4];
    assert_int_not_equal(harness_download(&H, y, tmp), MMRT_OK);
    assert_int_not_equal(P->synchronize(H.dev), MMRT_OK);
    assert_int_not_equal(P->capture_end(H.dev, &none), MMRT_OK);
    assert_null(none);
    assert_non_null(strstr(P->last_error(H.dev), "download during graph capture"));
    /* capture_end without begin */
    assert_int_not_equal(P->capture_end(H.dev, &none), MMRT_OK);

    /* a graph that outlives one of its arenas fails at launch instead of touching freed
     * memory; destroying it is still fine */
    op_release_all();
    assert_int_equal(P->graph_launch(H.dev, graph), MMRT_ERR_INVALID_ARG);
    P->graph_destroy(H.dev, graph);
    harness_close(&g);
    H = saved;
}

/* ---- determinism across thread counts ------------------------------------------------- */

static void test_thread_count_invariance(void **state)
{
    (void)state;
    /* The same launches on a 1-thread device must give the same bits as on the 3-thread one. */
    struct harness one;
    struct mmrt_option opt = { "threads", "1" };
    assert_int_equal(harness_open(&one, harness_plugin_path("cpu"), &opt, 1), MMRT_OK);
    struct harness three = H;
    float *out[2][3];
    for (int pass = 0; pass < 2; pass++) {
        H = pass ? one : three;
        op_rng_seed(16);
        float *x, *w;
        struct harness_tensor *tx = trand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(70, 300));
        struct harness_tensor *tw = trand(MMRT_DTYPE_F16, -1, 1, &w, SHAPE(45, 300));
        struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(70, 45)), *src[2] = { tx, tw };
        assert_int_equal(run(MMRT_OP_MATMUL, src, 2, ty, NULL, 0), MMRT_OK);
        float *y = download_f32(ty);
        out[pass][0] = malloc((size_t)ty->nbytes);
        memcpy(out[pass][0], y, (size_t)ty->nbytes);
        float *a = attention_case(&attn_cases[1], 1, false);
        out[pass][1] = malloc(33 * 8 * 80 * sizeof(float));
        memcpy(out[pass][1], a, 33 * 8 * 80 * sizeof(float));
        float *a2 = attention_case(&attn_cases[5], 2, false);
        out[pass][2] = malloc(13 * 6 * 8 * sizeof(float));
        memcpy(out[pass][2], a2, 13 * 6 * 8 * sizeof(float));
        op_release_all();
    }
    H = three;
    harness_close(&one);
    assert_memory_equal(out[0][0], out[1][0], 70 * 45 * sizeof(float));
    assert_memory_equal(out[0][1], out[1][1], 33 * 8 * 80 * sizeof(float));
    assert_memory_equal(out[0][2], out[1][2], 13 * 6 * 8 * sizeof(float));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            free(out[i][j]);
}

/* A loop issued right after device_open, before the workers have first run, must still be
 * joined by all of them (a worker that read the pool's generation late once skipped it and
 * the caller waited forever). Many fresh devices make that window likely to be hit. */
static void test_fresh_device_first_loop(void **state)
{
    (void)state;
    struct harness fresh;
    struct mmrt_option opt = { "threads", "4" };
    struct harness saved = H;
    for (int i = 0; i < 40; i++) {
        op_rng_seed(17); /* the same launch every time */
        float *x = op_rand_f(64 * 64, -1, 1), *w = op_rand_f(64 * 64, -1, 1);
        double *ref = op_ref_buf(64 * 64);
        ref_matmul(x, w, NULL, 64, 64, 64, ref);
        assert_int_equal(harness_open(&fresh, harness_plugin_path("cpu"), &opt, 1), MMRT_OK);
        H = fresh;
        struct harness_tensor *tx = tnew(MMRT_DTYPE_F32, SHAPE(64, 64));
        struct harness_tensor *tw = tnew(MMRT_DTYPE_F32, SHAPE(64, 64));
        struct harness_tensor *ty = tnew(MMRT_DTYPE_F32, SHAPE(64, 64)), *src[2] = { tx, tw };
        upload(tx, x);
        upload(tw, w);
        assert_int_equal(run(MMRT_OP_MATMUL, src, 2, ty, NULL, 0), MMRT_OK);
        op_check_close("MATMUL on a fresh device", download_f32(ty), ref, 64 * 64, 1e-5);
        op_release_all(); /* while H is still this device */
        harness_close(&fresh);
        H = saved;
    }
}

/* ---- the device functions ------------------------------------------------------------- */

static void test_plugin_table(void **state)
{
    (void)state;
    const struct mmrt_plugin *p = H.plugin;
    assert_int_equal(p->hdr.abi_major, MMRT_ABI_MAJOR);
    assert_int_equal(p->hdr.struct_size, sizeof *p);
    assert_string_equal(p->name, "cpu");
    assert_int_equal(p->n_ops, MMRT_OP_COUNT);
    for (int op = 0; op < MMRT_OP_COUNT; op++)
        if (!p->ops[op])
            fail_msg("op %d has no kernel", op);
    assert_non_null(p->option_keys);
    assert_string_equal(p->option_keys[0], "threads");
    assert_string_equal(p->option_keys[1], "isa");
    assert_string_equal(p->option_keys[2], "bf16_dot");
    assert_string_equal(p->option_keys[3], "int8_dot");
    assert_string_equal(p->option_keys[4], "graph");
    assert_string_equal(p->option_keys[5], "weights");
    assert_string_equal(p->option_keys[6], "prefetch");
    assert_string_equal(p->option_keys[7], "amx_gemv");
    assert_string_equal(p->option_keys[8], "gemv_widen");
    assert_null(p->option_keys[9]);
    int n = -1;
    char why[64] = "x";
    assert_int_equal(p->probe(&n, why, sizeof why), MMRT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(why, "");
}

static void test_device_info(void **state)
{
    (void)state;
    struct mmrt_device_info info;
    memset(&info, 0xAB, sizeof info);
    info.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_device_info);
    assert_int_equal(H.plugin->device_info(H.dev, &info), MMRT_OK);
    assert_string_equal(info.kind, "cpu");
    assert_non_null(strstr(info.name, "(3 threads)"));
    assert_true(info.total_bytes > 0);
    assert_true(info.free_bytes > 0 && info.free_bytes <= info.total_bytes);
    assert_true(info.max_arena_bytes > 0 && info.max_arena_bytes <= info.total_bytes);
    assert_int_equal(info.alignment, 64);

    /* An older, shorter struct: only what it holds is written. */
    memset(&info, 0xAB, sizeof info);
    info.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_device_info);
    info.hdr.struct_size = (uint32_t)offsetof(struct mmrt_device_info, kind);
    assert_int_equal(H.plugin->device_info(H.dev, &info), MMRT_OK);
    assert_non_null(strstr(info.name, "threads"));
    assert_int_equal((unsigned char)info.kind[0], 0xAB);
    assert_int_equal(info.hdr.struct_size, offsetof(struct mmrt_device_info, kind));
}

static void test_device_options(void **state)
{
    (void)state;
    const struct mmrt_plugin *p = H.plugin;
    static const struct {
        const char *key, *value, *needle;
    } bad[] = {
        { "thread", "2", "thread=\"2\"" },   { "threads", "0", "threads=\"0\"" },
        { "threads", "abc", "\"abc\"" },     { "threads", "-1", "\"-1\"" },
        { "threads", "", "threads=\"\"" },   { "threads", "2x", "\"2x\"" },
        { "threads", "99999999999999999999", "99999999999999999999" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct mmrt_option opt = { bad[i].key, bad[i].value };
        struct mmrt_device *dev = NULL;
        char err[256] = "";
        assert_int_equal(p->device_open(0, &opt, 1, &dev, err, sizeof err), MMRT_ERR_CONFIG);
        assert_null(dev);
        if (!strstr(err, bad[i].needle))
            fail_msg("option %s=%s: message \"%s\" lacks %s", bad[i].key, bad[i].value, err,
                     bad[i].needle);
    }
    struct mmrt_option twice[2] = { { "threads", "2" }, { "threads", "3" } };
    struct mmrt_device *dev = NULL;
    char err[256] = "";
    assert_int_equal(p->device_open(0, twice, 2, &dev, err, sizeof err), MMRT_ERR_CONFIG);
    assert_int_not_equal(p->device_open(1, NULL, 0, &dev, err, sizeof err), MMRT_OK);
    assert_non_null(strstr(err, "device 1"));

    /* Defaults, and a device closed with arenas still allocated (the sanitizer build checks
     * that they are freed). */
    assert_int_equal(p->device_open(0, NULL, 0, &dev, err, sizeof err), MMRT_OK);
    void *a = NULL, *b = NULL;
    assert_int_equal(p->arena_alloc(dev, 4096, &a), MMRT_OK);
    assert_int_equal(p->arena_alloc(dev, 10, &b), MMRT_OK);
    p->device_close(dev);
    p->device_close(NULL);
}

static void test_device_memory(void **state)
{
    (void)state;
    const struct mmrt_plugin *p = H.plugin;
    struct mmrt_device *dev = H.dev;
    void *a = NULL, *b = NULL, *z = NULL;
    assert_int_equal(p->arena_alloc(dev, 1000, &a), MMRT_OK);
    assert_int_equal(p->arena_alloc(dev, 333, &b), MMRT_OK);
    assert_int_equal(p->arena_alloc(dev, 0, &z), MMRT_OK);
    assert_true(a != b && z != NULL);

    uint8_t src[1000], got[1000];
    for (int i = 0; i < 1000; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(p->upload(dev, a, 0, src, 1000), MMRT_OK);
    /* Odd offsets and lengths. */
    uint8_t patch[13];
    for (int i = 0; i < 13; i++)
        patch[i] = (uint8_t)(200 + i);
    assert_int_equal(p->upload(dev, a, 7, patch, 13), MMRT_OK);
    memcpy(src + 7, patch, 13);
    assert_int_equal(p->download(dev, got, a, 3, 21), MMRT_OK);
    assert_memory_equal(got, src + 3, 21);
    assert_int_equal(p->download(dev, got, a, 999, 1), MMRT_OK);
    assert_int_equal(got[0], src[999]);
    assert_int_equal(p->upload(dev, a, 1000, src, 0), MMRT_OK); /* empty at the very end */

    /* Copies between arenas and overlapping within one. */
    assert_int_equal(p->copy(dev, b, 11, a, 5, 17), MMRT_OK);
    assert_int_equal(p->download(dev, got, b, 11, 17), MMRT_OK);
    assert_memory_equal(got, src + 5, 17);
    assert_int_equal(p->copy(dev, a, 1, a, 0, 100), MMRT_OK);
    memmove(src + 1, src, 100);
    assert_int_equal(p->download(dev, got, a, 0, 1000), MMRT_OK);
    assert_memory_equal(got, src, 1000);
    assert_int_equal(p->synchronize(dev), MMRT_OK);

    /* Out of range, foreign handles, huge requests: errors, never crashes. */
    assert_int_equal(p->upload(dev, a, 995, src, 10), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(p->last_error(dev), "outside"));
    assert_int_equal(p->download(dev, got, b, 334, 0), MMRT_ERR_INVALID_ARG);
    assert_int_equal(p->copy(dev, b, 330, a, 0, 4), MMRT_ERR_INVALID_ARG);
    assert_int_equal(p->upload(dev, a, UINT64_MAX, src, 2), MMRT_ERR_INVALID_ARG);
    assert_int_equal(p->upload(dev, src, 0, src, 1), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(p->last_error(dev), "not an arena"));
    void *huge = NULL;
    assert_int_equal(p->arena_alloc(dev, (uint64_t)1 << 60, &huge), MMRT_ERR_OUT_OF_POOL);
    assert_null(huge);
    assert_non_null(strstr(p->last_error(dev), "1152921504606846976"));
    assert_int_equal(p->arena_alloc(dev, UINT64_MAX, &huge), MMRT_ERR_OUT_OF_POOL);
    p->arena_free(dev, NULL);

    /* Still fine afterwards. */
    assert_int_equal(p->download(dev, got, a, 0, 1000), MMRT_OK);
    assert_memory_equal(got, src, 1000);
    p->arena_free(dev, a);
    p->arena_free(dev, b);
    p->arena_free(dev, z);
}

/* ---- the entry point's ABI check (runs last: it replaces the plugin's host table) ------ */

static char g_logged[512];

static void capture_log(void *user, enum mmrt_log_level level, const char *plugin,
                        const char *message)
{
    (void)user;
    (void)level;
    snprintf(g_logged, sizeof g_logged, "[%s] %s", plugin, message);
}

static void test_entry_abi(void **state)
{
    (void)state;
    void *dl = dlopen(harness_plugin_path("cpu"), RTLD_NOW | RTLD_LOCAL);
    assert_non_null(dl);
    mmrt_plugin_entry_fn entry;
    *(void **)&entry = dlsym(dl, MMRT_PLUGIN_ENTRY_NAME);
    assert_non_null(entry);
    /* Only the entry point is exported. */
    assert_null(dlsym(dl, "cpu_gemm"));
    assert_null(dlsym(dl, "cpu_op_matmul"));
    assert_null(dlsym(dl, "cpu_parallel_for"));

    struct mmrt_host host = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_host), .user = NULL, .log = capture_log,
    };
    host.hdr.abi_major = MMRT_ABI_MAJOR + 1;
    g_logged[0] = '\0';
    assert_null(entry(&host));
    char want[64];
    snprintf(want, sizeof want, "host ABI %d.%d", MMRT_ABI_MAJOR + 1, MMRT_ABI_MINOR);
    if (!strstr(g_logged, want) || !strstr(g_logged, "[cpu]"))
        fail_msg("refusal logged \"%s\", expected it to contain \"%s\"", g_logged, want);
    assert_null(entry(NULL));
    host.hdr.abi_major = MMRT_ABI_MAJOR;
    host.hdr.struct_size = 4; /* too short to hold the log member */
    assert_null(entry(&host));
    host.hdr.struct_size = sizeof host;
    assert_ptr_equal(entry(&host), H.plugin);
    dlclose(dl);
}

/* ---- runner --------------------------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    struct mmrt_option opt = { "threads", "3" };
    return harness_open(&H, harness_plugin_path("cpu"), &opt, 1) == MMRT_OK ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    op_release_all();
    harness_close(&H);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin_table),
        cmocka_unit_test(test_device_info),
        cmocka_unit_test(test_device_options),
        cmocka_unit_test(test_device_memory),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_i8),
        cmocka_unit_test(test_add_mul),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_multi),
        cmocka_unit_test(test_rope_multi_is_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_empty_rows),
        cmocka_unit_test(test_attention_window_bits),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_paged_invariance),
        cmocka_unit_test(test_attention_paged_threads),
        cmocka_unit_test(test_attention_paged_bad_values),
        cmocka_unit_test(test_attention_paged_graph),
        cmocka_unit_test(test_kv_i8_shared_cases),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_get_rows_all_halves),
        cmocka_unit_test(test_patch_embed),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_copy_conversions),
        cmocka_unit_test(test_copy_strided),
        cmocka_unit_test(test_f8e4m3_conversions),
        cmocka_unit_test(test_set_rows),
        cmocka_unit_test(test_set_rows_duplicates),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_gather_heads),
        cmocka_unit_test(test_l2_norm),
        cmocka_unit_test(test_gather_l2_refusals),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rope_multi_set_rows_refusals),
        cmocka_unit_test(test_thread_count_invariance),
        cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_fresh_device_first_loop),
        cmocka_unit_test(test_entry_abi),
    };
    return cmocka_run_group_tests_name("cpu_ops", tests, group_setup, group_teardown);
}
