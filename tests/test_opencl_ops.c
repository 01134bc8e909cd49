/*
 * tests/test_opencl_ops.c — every operator of libmmrt_opencl.so, driven directly through
 * plugin.h next to the CPU reference plugin (two harness instances, the same launches on
 * both): each result is held to the double-precision reference in ref_ops.c AND to the CPU
 * plugin's output, over odd and prime sizes, sizes off every work-group and tile, strided
 * views, in-place runs and every weight dtype, plus seeded random MATMUL and ATTENTION
 * configurations. Then the error paths: synchronous (argument checks), asynchronous (an id
 * or cu_seqlens that only the kernel sees) and a kernel build that fails.
 *
 * Closeness is max |got − want| / max |want| over a case, held to the per-op tolerance stated
 * at each test; the worst value measured per op is printed at the end. Ops that move bits
 * (GET_ROWS, CONCAT, COPY, ARGMAX) must match exactly. Cells a view must not read hold NaN.
 *
 * No OpenCL platform: every test skips and the program exits 77 (ctest "Skipped"). PoCL
 * compiles kernels on first use (cached in ~/.cache/pocl); the test does not rely on that
 * cache, it only keeps the number of distinct launches small.
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

#include "kv_i8_ref.h"
#include "op_cases.h"
#include "plugin_harness.h"
#include "ref_ops.h"

#define SKIP_CODE 77

enum { OCL = OP_DUT, CPU = OP_CPU, NDEV = 2 };
static struct harness H[NDEV];
static bool g_have_ocl;
static char g_why[256];

/* ---- comparison and the per-op record ------------------------------------------------- */

/* Worst relative error seen per op, against the reference and against the CPU plugin, and
 * the tolerance it was held to (-1: compared exactly). */
static double g_worst_ref[MMRT_OP_COUNT], g_worst_cpu[MMRT_OP_COUNT], g_tol[MMRT_OP_COUNT];
static int g_cases[MMRT_OP_COUNT];

/* OpenCL output against the double reference and against the CPU plugin's output. */
static void check_both(enum mmrt_op op, const char *what, const float *got, const float *cpu,
                       const double *ref, int64_t n, double tol)
{
    char w[256];
    snprintf(w, sizeof w, "%s vs reference", what);
    double r = op_check_close(w, got, ref, n, tol);
    double *c = op_alloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        c[i] = cpu[i];
    snprintf(w, sizeof w, "%s vs CPU plugin", what);
    double rc = op_check_close(w, got, c, n, tol);
    if (r > g_worst_ref[op])
        g_worst_ref[op] = r;
    if (rc > g_worst_cpu[op])
        g_worst_cpu[op] = rc;
    if (tol > g_tol[op])
        g_tol[op] = tol; /* SOFTMAX's depends on the case: the largest is shown */
    g_cases[op]++;
}

static void note_exact(int op)
{
    g_tol[op] = -1;
    g_cases[op]++;
}

/* OpenCL output equal to want byte for byte, and to the CPU plugin's. */
static void check_exact(enum mmrt_op op, const char *what, const void *got, const void *cpu,
                        const void *want, size_t nbytes)
{
    const uint8_t *g = got, *w = want;
    for (size_t i = 0; i < nbytes; i++)
        if (g[i] != w[i])
            fail_msg("%s: byte %zu is 0x%02x, want 0x%02x", what, i, g[i], w[i]);
    assert_memory_equal(got, cpu, nbytes);
    note_exact(op);
}

static const struct op_checks g_checks = { check_both, check_exact, false, true, true };

static void need_device(void)
{
    if (!g_have_ocl)
        skip();
}

/* ---- MATMUL ---------------------------------------------------------------------------
 * Tolerance 1e-5: both plugins accumulate K products in f32, in different orders (the OpenCL
 * tile sums 16-wide panels, possibly with fma; the CPU 8 lanes); for K ≤ 4099 random terms
 * that differs from the exact sum by a few 1e-7 of the largest output. */

static void test_matmul(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][3] = { /* M, K, N; M ≤ 4 takes the small-M kernel */
        { 1, 1, 1 },     { 1, 13, 7 },   { 3, 8, 5 },    { 4, 100, 9 },   { 5, 64, 65 },
        { 17, 65, 33 },  { 64, 257, 96 }, { 2, 4099, 3 }, { 33, 256, 16 }, { 1, 300, 513 },
        { 2, 0, 3 },     { 37, 31, 19 },  { 131, 129, 67 }, { 4, 1000, 257 }, { 65, 17, 1 },
    };
    op_rng_seed(1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            int64_t M = cases[c][0], K = cases[c][1], N = cases[c][2];
            enum mmrt_dtype wdt = op_weight_dtypes[d];
            int bias_mode = (int)((c + (size_t)d) % 3); /* none, W's dtype, F32 */
            float *x, *w, *b = NULL;
            struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
            struct op_pair *tw = op_pair_rand(wdt, -1, 1, &w, SHAPE(N, K));
            struct op_pair *tb = NULL;
            if (bias_mode)
                tb = op_pair_rand(bias_mode == 1 ? wdt : MMRT_DTYPE_F32, -1, 1, &b, SHAPE(N));
            struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(M, N));
            struct op_pair *src[3] = { tx, tw, tb };
            op_pair_run(MMRT_OP_MATMUL, src, tb ? 3 : 2, ty, NULL, 0);
            double *ref = op_ref_buf(M * N);
            ref_matmul(x, w, b, M, K, N, ref);
            char what[128];
            snprintf(what, sizeof what, "MATMUL M=%lld K=%lld N=%lld W %s bias %d", (long long)M,
                     (long long)K, (long long)N, mmrt_dtype_name_of(wdt), bias_mode);
            check_both(MMRT_OP_MATMUL, what, op_pair_download(OCL, ty), op_pair_download(CPU, ty),
                       ref, M * N, 1e-5);
            op_release_all();
        }

    /* Random shapes around the tile and work-group edges. */
    for (int c = 0; c < 20; c++) {
        static const int64_t edges[] = { 1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 127, 129 };
        int64_t M = edges[op_rng_int(0, 11)], N = edges[op_rng_int(0, 11)], K = op_rng_int(1, 700);
        enum mmrt_dtype wdt = op_weight_dtypes[op_rng_int(0, 2)];
        float *x, *w, *b;
        struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        struct op_pair *tw = op_pair_rand(wdt, -1, 1, &w, SHAPE(N, K));
        struct op_pair *tb = op_pair_rand(op_weight_dtypes[op_rng_int(0, 2)], -1, 1, &b, SHAPE(N));
        struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(M, N));
        struct op_pair *src[3] = { tx, tw, tb };
        op_pair_run(MMRT_OP_MATMUL, src, 3, ty, NULL, 0);
        double *ref = op_ref_buf(M * N);
        ref_matmul(x, w, b, M, K, N, ref);
        char what[128];
        snprintf(what, sizeof what, "MATMUL random M=%lld K=%lld N=%lld W %s", (long long)M,
                 (long long)K, (long long)N, mmrt_dtype_name_of(wdt));
        check_both(MMRT_OP_MATMUL, what, op_pair_download(OCL, ty), op_pair_download(CPU, ty), ref,
                   M * N, 1e-5);
        op_release_all();
    }

    /* x with more than two dims, placed at an odd offset inside a bigger arena. */
    float *x = op_rand_f(2 * 3 * 40, -1, 1), *w;
    struct op_pair *big = op_pair_new(MMRT_DTYPE_F32, SHAPE(7 + 240));
    float *bx = op_alloc(247 * sizeof(float));
    for (int i = 0; i < 247; i++)
        bx[i] = NAN;
    memcpy(bx + 7, x, 240 * sizeof(float));
    op_pair_upload_f32(big, bx);
    struct op_pair tx =
        op_pair_view(big, MMRT_DTYPE_F32, SHAPE(2, 3, 40), (const int64_t[]){ 480, 160, 4 }, 28);
    struct op_pair *tw = op_pair_rand(MMRT_DTYPE_BF16, -1, 1, &w, SHAPE(9, 40));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 3, 9));
    struct op_pair *src[2] = { &tx, tw };
    op_pair_run(MMRT_OP_MATMUL, src, 2, ty, NULL, 0);
    double *ref = op_ref_buf(6 * 9);
    ref_matmul(x, w, NULL, 6, 40, 9, ref);
    check_both(MMRT_OP_MATMUL, "MATMUL x [2, 3, 40] at offset 28", op_pair_download(OCL, ty),
               op_pair_download(CPU, ty), ref, 6 * 9, 1e-5);
    op_release_all();
}

/* ---- MATMUL with I8 weights (plugin.h, ABI 1.3): op_cases.c's op_case_matmul_i8 -------
 * Tolerance 1e-5 on both sides of the small-M line, against the reference on the dequantized
 * weights: the kernels sum x · code in f32 as for a float W (the codes convert exactly) and
 * round once more when the sum is scaled. Rows of an M ≤ 32 launch equal the row alone bit
 * for bit (OCL_MM_INVARIANT_M). */

static void test_matmul_i8(void **state)
{
    (void)state;
    need_device();
    op_case_matmul_i8(&g_checks, 1e-5, 1e-5);
}

/* ---- MATMUL with U4 weights (plugin.h, ABI 1.3): op_cases.c's op_case_matmul_u4 -------
 * Tolerance 1e-5 on both sides of the small-M line, against the reference on the dequantized
 * weights: the tiled kernel stages exactly the reference's (code − zero) · scale, the small-M
 * kernel sums x · (code − zero) over each 32-code block and scales the block's sum (one
 * rounding more per block). Rows of an M ≤ 32 launch equal the row alone bit for bit. */

static void test_matmul_u4(void **state)
{
    (void)state;
    need_device();
    op_case_matmul_u4(&g_checks, 1e-5, 1e-5);
}

/* ---- ADD, MUL: tolerance 1e-6 (one IEEE rounding per element on both plugins) --------- */

static void test_add_mul(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][2] = { { 1, 1 },    { 7, 13 },   { 64, 257 },
                                        { 3, 1000 }, { 1, 4099 } };
    op_rng_seed(2);
    for (int op = MMRT_OP_ADD; op <= MMRT_OP_MUL; op++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int mode = 0; mode < 7; mode++) {
                /* 0: same shape F32; 1: same shape F16; 2-4: broadcast row F32/F16/BF16;
                 * 5: in place (dst == src0); 6: in place on src1 (dst == src1). */
                int64_t R = cases[c][0], N = cases[c][1];
                bool bcast = mode >= 2 && mode <= 4;
                enum mmrt_dtype bdt = mode == 1 ? MMRT_DTYPE_F16
                                      : bcast   ? op_weight_dtypes[mode - 2]
                                                : MMRT_DTYPE_F32;
                float *a, *b;
                struct op_pair *ta = op_pair_rand(MMRT_DTYPE_F32, -4, 4, &a, SHAPE(R, N));
                struct op_pair *tb = bcast ? op_pair_rand(bdt, -4, 4, &b, SHAPE(N))
                                        : op_pair_rand(bdt, -4, 4, &b, SHAPE(R, N));
                struct op_pair *ty = mode == 5   ? ta
                                  : mode == 6 ? tb
                                              : op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
                struct op_pair *src[2] = { ta, tb };
                op_pair_run(op, src, 2, ty, NULL, 0);
                double *ref = op_ref_buf(R * N);
                ref_binary(a, b, R * N, bcast ? N : R * N, op == MMRT_OP_MUL, ref);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d", mmrt_op_name_of(op),
                         (long long)R, (long long)N, mode);
                check_both(op, what, op_pair_download(OCL, ty), op_pair_download(CPU, ty), ref,
                           R * N, 1e-6);
                op_release_all();
            }
}

/* ---- SCALE: tolerance 1e-6 ------------------------------------------------------------ */

static void test_scale(void **state)
{
    (void)state;
    need_device();
    static const int64_t sizes[] = { 1, 7, 1024, 100003 };
    static const float scales[] = { 0.125f, -3.5f, 0.0f };
    op_rng_seed(3);
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++)
        for (size_t s = 0; s < 3; s++) {
            int64_t n = sizes[c];
            bool in_place = (c + s) % 2;
            float *a;
            struct op_pair *ta = op_pair_rand(MMRT_DTYPE_F32, -10, 10, &a, SHAPE(n));
            struct op_pair *ty = in_place ? ta : op_pair_new(MMRT_DTYPE_F32, SHAPE(n));
            struct mmrt_scale_params p = { scales[s] };
            struct op_pair *src[1] = { ta };
            op_pair_run(MMRT_OP_SCALE, src, 1, ty, &p, sizeof p);
            double *ref = op_ref_buf(n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = (double)a[i] * scales[s];
            check_both(MMRT_OP_SCALE, "SCALE", op_pair_download(OCL, ty), op_pair_download(CPU, ty),
                       ref, n, 1e-6);
            op_release_all();
        }
}

/* ---- activations and SWIGLU -----------------------------------------------------------
 * Tolerance 4e-6: OpenCL allows erf and tanh 16 ulp and exp 3 ulp (≈ 1e-6 of the value at
 * most), and each formula adds three or four f32 roundings. */

static void test_unary(void **state)
{
    (void)state;
    need_device();
    static const int ops[] = { MMRT_OP_GELU, MMRT_OP_GELU_TANH, MMRT_OP_QUICK_GELU,
                               MMRT_OP_SILU, MMRT_OP_RELU2 };
    static const float specials[] = { 0.0f, -0.0f, 1e-3f, -1e-3f, 20.0f, -20.0f, 50.0f,
                                      -50.0f, -100.0f, 3.0f, -3.0f };
    const int64_t n_special = sizeof specials / sizeof specials[0];
    op_rng_seed(4);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int in_place = 0; in_place < 2; in_place++) {
            int64_t n = in_place ? 4099 : 257;
            float *a = op_rand_f(n, -8, 8);
            memcpy(a, specials, sizeof specials);
            struct op_pair *ta = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, n));
            op_pair_upload_f32(ta, a);
            struct op_pair *ty = in_place ? ta : op_pair_new(MMRT_DTYPE_F32, SHAPE(1, n));
            struct op_pair *src[1] = { ta };
            op_pair_run(ops[o], src, 1, ty, NULL, 0);
            double *ref = op_ref_buf(n);
            ref_unary(ops[o], a, n, ref);
            float *got = op_pair_download(OCL, ty);
            char what[64];
            snprintf(what, sizeof what, "%s n=%lld", mmrt_op_name_of(ops[o]), (long long)n);
            check_both(ops[o], what, got, op_pair_download(CPU, ty), ref, n, 4e-6);
            /* Far tails are exact limits: 0 for the gates at −50 and below, x for x ≥ 20. */
            for (int64_t i = 0; i < n_special; i++) {
                if (ops[o] != MMRT_OP_RELU2 && specials[i] <= -50.0f && !(fabsf(got[i]) < 1e-20f))
                    fail_msg("%s(%g) = %g, want 0", mmrt_op_name_of(ops[o]), (double)specials[i],
                             (double)got[i]);
                if (specials[i] >= 20.0f && ops[o] != MMRT_OP_RELU2 && got[i] != specials[i])
                    fail_msg("%s(%g) = %.9g, want x", mmrt_op_name_of(ops[o]), (double)specials[i],
                             (double)got[i]);
            }
            op_release_all();
        }
    /* RELU2 keeps a NaN. */
    float a[3] = { NAN, -1.0f, 2.0f };
    struct op_pair *ta = op_pair_new(MMRT_DTYPE_F32, SHAPE(3));
    op_pair_upload_f32(ta, a);
    struct op_pair *src[1] = { ta };
    op_pair_run(MMRT_OP_RELU2, src, 1, ta, NULL, 0);
    float *got = op_pair_download(OCL, ta);
    assert_true(isnan(got[0]) && got[1] == 0.0f && got[2] == 4.0f);
    op_release_all();
}

static void test_swiglu(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][2] = { { 1, 1 }, { 3, 37 }, { 16, 688 } };
    op_rng_seed(5);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int in_place = 0; in_place < 2; in_place++) {
            int64_t R = cases[c][0], N = cases[c][1];
            float *g, *u;
            struct op_pair *tg = op_pair_rand(MMRT_DTYPE_F32, -6, 6, &g, SHAPE(R, N));
            struct op_pair *tu = op_pair_rand(MMRT_DTYPE_F32, -3, 3, &u, SHAPE(R, N));
            struct op_pair *ty = in_place ? tg : op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
            struct op_pair *src[2] = { tg, tu };
            op_pair_run(MMRT_OP_SWIGLU, src, 2, ty, NULL, 0);
            double *ref = op_ref_buf(R * N);
            ref_swiglu(g, u, R * N, ref);
            check_both(MMRT_OP_SWIGLU, "SWIGLU", op_pair_download(OCL, ty),
                       op_pair_download(CPU, ty), ref, R * N, 4e-6);
            op_release_all();
        }
}

/* ---- LAYERNORM, RMSNORM ---------------------------------------------------------------
 * Tolerance 1e-5: the statistics are tree reductions (in double where the device has fp64,
 * else f32: a relative error of about log2(N)·2⁻²⁴ in the mean and variance), then three or
 * four f32 roundings per output. */

static void test_norms(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][2] = { { 1, 1 },    { 3, 7 },    { 17, 64 },  { 2, 257 },
                                        { 5, 1000 }, { 2, 4096 }, { 3, 8191 } };
    op_rng_seed(6);
    for (int op = MMRT_OP_LAYERNORM; op <= MMRT_OP_RMSNORM; op++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int mode = 0; mode < 5; mode++) {
                /* 0 no weights; 1-3 weight (and LN bias) in F32/F16/BF16; 4 in place, weight
                 * only. Data sit at an offset, so the mean matters. */
                int64_t R = cases[c][0], N = cases[c][1];
                enum mmrt_dtype wdt = mode >= 1 && mode <= 3 ? op_weight_dtypes[mode - 1]
                                                             : MMRT_DTYPE_F32;
                bool ln = op == MMRT_OP_LAYERNORM;
                float *x, *w = NULL, *b = NULL;
                struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, 1, 5, &x, SHAPE(R, N));
                struct op_pair *tw = NULL, *tb = NULL;
                if (mode >= 1)
                    tw = op_pair_rand(wdt, -2, 2, &w, SHAPE(N));
                if (ln && mode >= 1 && mode <= 3)
                    tb = op_pair_rand(wdt, -1, 1, &b, SHAPE(N));
                struct op_pair *ty = mode == 4 ? tx : op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
                struct mmrt_norm_params p = { mode % 2 ? 1e-5f : 1e-6f };
                struct op_pair *src[3] = { tx, tw, tb };
                double *ref = op_ref_buf(R * N);
                if (ln)
                    ref_layernorm(x, w, b, R, N, p.eps, ref);
                else
                    ref_rmsnorm(x, w, R, N, p.eps, ref);
                op_pair_run(op, src, ln ? 3 : 2, ty, &p, sizeof p);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d", mmrt_op_name_of(op),
                         (long long)R, (long long)N, mode);
                check_both(op, what, op_pair_download(OCL, ty), op_pair_download(CPU, ty), ref,
                           R * N, 1e-5);
                op_release_all();
            }
}

/* ---- SOFTMAX --------------------------------------------------------------------------
 * Tolerance 2e-6 of the largest output plus the f32 rounding of x·scale, which alone moves
 * an output by |x·scale|·2⁻²⁴ of itself (the CPU test's bound; exp may be 3 ulp here). */

static void test_softmax(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][2] = { { 1, 1 }, { 3, 7 }, { 5, 64 }, { 2, 1000 }, { 1, 4099 } };
    static const float scales[] = { 1.0f, 0.125f, 2.5f };
    op_rng_seed(7);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int mode = 0; mode < 4; mode++) {
            /* 0 plain; 1 about 30% −inf (never a whole row); 2 values near 100; 3 like 1, in
             * place. */
            int64_t R = cases[c][0], N = cases[c][1];
            float lo = mode == 2 ? 95.0f : -10.0f, hi = mode == 2 ? 105.0f : 10.0f;
            float *x = op_rand_f(R * N, lo, hi);
            if (mode == 1 || mode == 3)
                for (int64_t i = 0; i < R * N; i++)
                    if (i % N != 0 && op_rng_int(0, 9) < 3)
                        x[i] = -INFINITY;
            struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
            op_pair_upload_f32(tx, x);
            struct op_pair *ty = mode == 3 ? tx : op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
            struct mmrt_scale_params p = { scales[(c + (size_t)mode) % 3] };
            struct op_pair *src[1] = { tx };
            op_pair_run(MMRT_OP_SOFTMAX, src, 1, ty, &p, sizeof p);
            double *ref = op_ref_buf(R * N);
            ref_softmax(x, R, N, p.scale, ref);
            float *got = op_pair_download(OCL, ty);
            double max_logit = 0;
            for (int64_t i = 0; i < R * N; i++)
                if (isfinite(x[i]) && fabs(x[i] * p.scale) > max_logit)
                    max_logit = fabs(x[i] * p.scale);
            char what[64];
            snprintf(what, sizeof what, "SOFTMAX [%lld, %lld] mode %d", (long long)R,
                     (long long)N, mode);
            check_both(MMRT_OP_SOFTMAX, what, got, op_pair_download(CPU, ty), ref, R * N,
                       2e-6 + 1.2e-7 * max_logit);
            for (int64_t i = 0; i < R * N; i++)
                if (x[i] == -INFINITY)
                    assert_true(got[i] == 0.0f); /* exactly 0, not tiny */
            op_release_all();
        }

    /* A row masked entirely has no distribution: zeros (never NaN). */
    float x[6] = { -INFINITY, -INFINITY, -INFINITY, 1, 2, 3 };
    struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 3));
    op_pair_upload_f32(tx, x);
    struct op_pair *src[1] = { tx };
    struct mmrt_scale_params p = { 1.0f };
    op_pair_run(MMRT_OP_SOFTMAX, src, 1, tx, &p, sizeof p);
    float *got = op_pair_download(OCL, tx);
    for (int i = 0; i < 3; i++)
        assert_true(got[i] == 0.0f);
    assert_true(fabsf(got[3] + got[4] + got[5] - 1.0f) < 1e-6f);
    op_release_all();
}

/* ---- ROPE -----------------------------------------------------------------------------
 * Tolerance 1e-6: inv_freq is bit-identical to the CPU plugin's (computed on the host), the
 * angle is one exact f32 multiply, cos/sin are within an ulp (double on fp64 devices). */

static void test_rope(void **state)
{
    (void)state;
    need_device();
    op_case_rope(&g_checks, 1e-6);
}

/* ---- ROPE_MULTI -----------------------------------------------------------------------
 * Tolerance 1e-6, as ROPE: the inv_freq table is the CPU plugin's expression over freq_dim,
 * computed on the host; the angle is one exact f32 multiply. Qwen2-VL's two configurations
 * (decoder M-RoPE, vision 2-D rotary), then empty sections, four axes, a copied tail wider
 * than a work-group, in place and a head view of a fused buffer. One axis is also held to
 * ROPE NEOX bit for bit. */

static void test_rope_multi(void **state)
{
    (void)state;
    need_device();
    op_case_rope_multi(&g_checks, 1e-6);
}

/* ---- ATTENTION ------------------------------------------------------------------------
 * Tolerance 2e-5: q·k over D ≤ 256 and the weighted sum over up to 700 keys accumulate in f32
 * in a different order from the CPU plugin (online softmax: tile maxima, one rescale per
 * tile, normalisation at the end instead of per probability). */

enum kv_layout {
    KV_DENSE,      /* [S, Hkv, D] */
    KV_CACHE,      /* tokens [off, off + S) of a [cap, Hkv, D] cache */
    KV_HEAD_MAJOR, /* a [Hkv, cap, D] cache seen as [S, Hkv, D] (token stride D) */
    KV_FUSED,      /* k and v interleaved per token in one [S, 2, Hkv, D] buffer */
};

struct attn_case {
    int64_t Hq, Hkv, D;
    int n_seq;             /* 0: no cu_seqlens */
    int32_t lq[6], lk[6];  /* per-sequence lengths (lq[0], lk[0] when n_seq == 0) */
    int causal;
    enum mmrt_dtype kv_dtype;
    enum kv_layout layout;
    float q_amp;
    float scale;           /* 0: 1/sqrt(D) */
    int mixed;             /* v in the other KV dtype than k (not with KV_FUSED) */
    int window;            /* sliding window (causal only); 0 = none */
};

/* k or v values [S, Hkv, D] placed in a fresh base tensor with the given layout; returns the
 * view. Cells outside it hold NaN. KV_FUSED is built by the caller. */
static struct op_pair kv_place(const struct attn_case *ac, int64_t S, const float *dense,
                           enum mmrt_dtype dt)
{
    int64_t Hkv = ac->Hkv, D = ac->D, es = dt == MMRT_DTYPE_F32 ? 4 : 2;
    int64_t cap = S + 5, off = 3;
    const int64_t *ne = (const int64_t[]){ S, Hkv, D };
    float *buf = op_alloc((size_t)(cap * Hkv * D) * sizeof(float));
    for (int64_t i = 0; i < cap * Hkv * D; i++)
        buf[i] = NAN;
    switch (ac->layout) {
    case KV_CACHE: {
        memcpy(buf + off * Hkv * D, dense, (size_t)(S * Hkv * D) * sizeof(float));
        struct op_pair *t = op_pair_new(dt, SHAPE(cap, Hkv, D));
        op_pair_upload(t, op_encode(dt, buf, cap * Hkv * D));
        return op_pair_view(t, dt, 3, ne, (const int64_t[]){ Hkv * D * es, D * es, es },
                     (uint64_t)(off * Hkv * D * es));
    }
    case KV_HEAD_MAJOR: {
        for (int64_t s = 0; s < S; s++)
            for (int64_t g = 0; g < Hkv; g++)
                memcpy(buf + (g * cap + s) * D, dense + (s * Hkv + g) * D,
                       (size_t)D * sizeof(float));
        struct op_pair *t = op_pair_new(dt, SHAPE(Hkv, cap, D));
        op_pair_upload(t, op_encode(dt, buf, cap * Hkv * D));
        return op_pair_view(t, dt, 3, ne, (const int64_t[]){ D * es, cap * D * es, es }, 0);
    }
    default: {
        struct op_pair *t = op_pair_new(dt, SHAPE(S, Hkv, D));
        op_pair_upload(t, op_encode(dt, dense, S * Hkv * D));
        return *t;
    }
    }
}

/* Runs one case on both devices, checks it, and returns the OpenCL output. */
static float *attention_case(const struct attn_case *ac, uint64_t seed)
{
    int n_seq = ac->n_seq ? ac->n_seq : 1;
    int32_t cu_q[7] = { 0 }, cu_k[7] = { 0 };
    for (int s = 0; s < n_seq; s++) {
        cu_q[s + 1] = cu_q[s] + ac->lq[s];
        cu_k[s + 1] = cu_k[s] + ac->lk[s];
    }
    int64_t T = cu_q[n_seq], S = cu_k[n_seq], Hq = ac->Hq, Hkv = ac->Hkv, D = ac->D;
    op_rng_seed(seed);
    enum mmrt_dtype vdt = !ac->mixed                      ? ac->kv_dtype
                          : ac->kv_dtype == MMRT_DTYPE_F32 ? MMRT_DTYPE_F16
                                                           : MMRT_DTYPE_F32;
    float *q, *k = op_rand_f(S * Hkv * D, -1, 1), *v = op_rand_f(S * Hkv * D, -1, 1);
    op_round_to(ac->kv_dtype, k, S * Hkv * D);
    op_round_to(vdt, v, S * Hkv * D);
    struct op_pair *tq = op_pair_rand(MMRT_DTYPE_F32, -ac->q_amp, ac->q_amp, &q, SHAPE(T, Hq, D));
    struct op_pair kv_k, kv_v;
    if (ac->layout == KV_FUSED) {
        float *fused = op_alloc((size_t)(S * 2 * Hkv * D) * sizeof(float));
        for (int64_t s = 0; s < S; s++) {
            memcpy(fused + (s * 2 + 0) * Hkv * D, k + s * Hkv * D, (size_t)(Hkv * D) * 4);
            memcpy(fused + (s * 2 + 1) * Hkv * D, v + s * Hkv * D, (size_t)(Hkv * D) * 4);
        }
        struct op_pair *base = op_pair_new(ac->kv_dtype, SHAPE(S, 2, Hkv, D));
        op_pair_upload(base, op_encode(ac->kv_dtype, fused, S * 2 * Hkv * D));
        int64_t es = ac->kv_dtype == MMRT_DTYPE_F32 ? 4 : 2;
        const int64_t nb[3] = { 2 * Hkv * D * es, D * es, es };
        kv_k = op_pair_view(base, ac->kv_dtype, SHAPE(S, Hkv, D), nb, 0);
        kv_v = op_pair_view(base, ac->kv_dtype, SHAPE(S, Hkv, D), nb, (uint64_t)(Hkv * D * es));
    } else {
        kv_k = kv_place(ac, S, k, ac->kv_dtype);
        kv_v = kv_place(ac, S, v, vdt);
    }
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, Hq, D));
    struct op_pair *tcq = NULL, *tck = NULL;
    if (ac->n_seq) {
        tcq = op_pair_i32(cu_q, n_seq + 1);
        tck = op_pair_i32(cu_k, n_seq + 1);
    }
    float scale = ac->scale != 0 ? ac->scale : 1.0f / sqrtf((float)D);
    struct mmrt_attention_params p = { scale, ac->causal, n_seq, ac->window };
    struct op_pair *src[5] = { tq, &kv_k, &kv_v, tcq, tck };
    op_pair_run(MMRT_OP_ATTENTION, src, ac->n_seq ? 5 : 3, ty, &p, sizeof p);
    float *got = op_pair_download(OCL, ty);
    double *ref = op_ref_buf(T * Hq * D);
    ref_attention(q, k, v, T, S, Hq, Hkv, D, ac->n_seq ? cu_q : NULL, ac->n_seq ? cu_k : NULL,
                  n_seq, scale, ac->causal, ac->window, ref);
    char what[224];
    snprintf(what, sizeof what, "ATTENTION seed %llu (T %lld S %lld Hq %lld Hkv %lld D %lld "
             "n_seq %d causal %d window %d k %s v %s layout %d)", (unsigned long long)seed,
             (long long)T, (long long)S, (long long)Hq, (long long)Hkv, (long long)D, ac->n_seq,
             ac->causal, ac->window, mmrt_dtype_name_of(ac->kv_dtype), mmrt_dtype_name_of(vdt),
             (int)ac->layout);
    check_both(MMRT_OP_ATTENTION, what, got, op_pair_download(CPU, ty), ref, T * Hq * D, 2e-5);
    return got;
}

static const struct attn_case attn_cases[] = {
    /* Hq Hkv D  n_seq lq                  lk                   causal kv          layout   q_amp scale mixed window */
    { 4, 4, 64,  0, { 7 },               { 7 },               0, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0, 0 },
    { 8, 2, 80,  0, { 33 },              { 33 },              1, MMRT_DTYPE_F16, KV_DENSE,      1, 0, 0, 0 },
    { 4, 2, 128, 0, { 1 },               { 37 },              1, MMRT_DTYPE_F16, KV_CACHE,      1, 0, 0, 0 }, /* decode */
    { 4, 1, 64,  0, { 5 },               { 20 },              1, MMRT_DTYPE_F32, KV_HEAD_MAJOR, 1, 0, 0, 0 }, /* chunked prefill */
    { 2, 2, 256, 3, { 5, 1, 12 },        { 5, 1, 12 },        0, MMRT_DTYPE_F32, KV_FUSED,      1, 0, 0, 0 }, /* vision blocks */
    { 6, 3, 8,   5, { 3, 1, 0, 4, 5 },   { 10, 1, 0, 4, 2 },  1, MMRT_DTYPE_F16, KV_CACHE,      1, 0, 0, 0 },
    { 2, 1, 64,  0, { 300 },             { 300 },             1, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0, 0 }, /* long */
    { 1, 1, 3,   0, { 4 },               { 9 },               0, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0, 0 }, /* odd D */
    { 4, 2, 64,  0, { 9 },               { 9 },               1, MMRT_DTYPE_F32, KV_FUSED,      4, 0.3f, 0, 0 }, /* peaky */
    { 2, 1, 16,  0, { 2 },               { 0 },               0, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0, 0 }, /* no keys */
    { 8, 2, 128, 0, { 16 },              { 16 },              1, MMRT_DTYPE_F16, KV_HEAD_MAJOR, 1, 0, 0, 0 }, /* GQA 4 */
    { 4, 4, 256, 2, { 3, 2 },            { 40, 7 },           1, MMRT_DTYPE_F16, KV_FUSED,      1, 0, 0, 0 },
    /* Beyond the CPU suite: tiles and blocks. */
    { 8, 1, 128, 0, { 1 },               { 700 },             1, MMRT_DTYPE_F16, KV_CACHE,      1, 0, 0, 0 }, /* GQA 8 decode, long */
    { 2, 2, 80,  0, { 97 },              { 131 },             1, MMRT_DTYPE_F32, KV_HEAD_MAJOR, 2, 0, 0, 0 }, /* Lq < Lk, 4 blocks */
    { 3, 3, 64,  6, { 1, 1, 1, 1, 1, 1 }, { 50, 3, 129, 1, 64, 9 }, 1, MMRT_DTYPE_F16, KV_DENSE, 1, 0, 0, 0 }, /* batched decode */
    { 4, 2, 256, 4, { 33, 31, 65, 2 },   { 33, 31, 65, 2 },   1, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0, 0 }, /* packed prefill */
    { 2, 1, 128, 2, { 64, 40 },          { 64, 40 },          0, MMRT_DTYPE_F32, KV_FUSED,      1, 0, 0, 0 }, /* bidirectional */
    { 16, 2, 64, 0, { 37 },              { 37 },              0, MMRT_DTYPE_F16, KV_DENSE,      1, 0, 0, 0 }, /* GQA 8 */
    { 1, 1, 256, 0, { 40 },              { 200 },             0, MMRT_DTYPE_F32, KV_CACHE,      3, 0, 0, 0 },
    { 4, 2, 64,  2, { 20, 9 },           { 30, 9 },           1, MMRT_DTYPE_F16, KV_HEAD_MAJOR, 1, 0, 1, 0 }, /* k F16, v F32 */
    /* Sliding windows: decode with the window mid-tile, several query blocks with a window
     * shorter than a block and one longer than a tile, window 1, batched decode of varied
     * lengths, mixed K/V dtypes. */
    { 8, 1, 128, 0, { 1 },               { 700 },             1, MMRT_DTYPE_F16, KV_CACHE,      1, 0, 0, 77 },
    { 2, 2, 80,  0, { 97 },              { 131 },             1, MMRT_DTYPE_F32, KV_HEAD_MAJOR, 2, 0, 0, 9 },
    { 4, 2, 64,  0, { 70 },              { 200 },             1, MMRT_DTYPE_F32, KV_DENSE,      1, 0, 0, 150 },
    { 2, 1, 32,  0, { 20 },              { 20 },              1, MMRT_DTYPE_F32, KV_FUSED,      1, 0, 0, 1 },
    { 3, 3, 64,  6, { 1, 1, 1, 1, 1, 1 }, { 50, 3, 129, 1, 64, 9 }, 1, MMRT_DTYPE_F16, KV_DENSE, 1, 0, 0, 8 },
    { 4, 2, 64,  2, { 20, 9 },           { 30, 9 },           1, MMRT_DTYPE_F16, KV_HEAD_MAJOR, 1, 0, 1, 4 },
};

static void test_attention(void **state)
{
    (void)state;
    need_device();
    for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
        attention_case(&attn_cases[c], 100 + c);
        op_release_all();
    }
}

/* Random configurations, fixed seed, the way mmrt-plugin-check draws them: up to 5 packed
 * sequences of 0…70 queries and keys, any D in 1…256, GQA ratios 1…4, every KV layout. */
static void test_attention_random(void **state)
{
    (void)state;
    need_device();
    op_rng_seed(77);
    for (int c = 0; c < 24; c++) {
        struct attn_case ac = { 0 };
        int ratio = op_rng_int(1, 4);
        ac.Hkv = op_rng_int(1, 3);
        ac.Hq = ac.Hkv * ratio;
        ac.D = c % 4 == 0 ? 256 : op_rng_int(1, 160);
        ac.n_seq = op_rng_int(0, 5);
        for (int s = 0; s < (ac.n_seq ? ac.n_seq : 1); s++) {
            ac.lq[s] = op_rng_int(0, 70);
            ac.lk[s] = op_rng_int(0, 3) == 0 ? ac.lq[s] : op_rng_int(0, 70);
        }
        ac.causal = op_rng_int(0, 1);
        ac.window = ac.causal && c % 3 == 1 ? op_rng_int(1, 40) : 0;
        ac.kv_dtype = op_rng_int(0, 1) ? MMRT_DTYPE_F16 : MMRT_DTYPE_F32;
        ac.layout = (enum kv_layout)op_rng_int(0, 3);
        ac.mixed = ac.layout != KV_FUSED && op_rng_int(0, 3) == 0;
        ac.q_amp = op_rng_f(0.5f, 3.0f);
        uint64_t keep = op_rng_save();
        attention_case(&ac, 1000 + (uint64_t)c);
        op_rng_restore(keep); /* attention_case reseeds; keep drawing configurations from here */
        op_release_all();
    }
}

/* A query that sees no key (causal with Lq > Lk) must be exactly zero. */
static void test_attention_empty_rows(void **state)
{
    (void)state;
    need_device();
    const struct attn_case *ac = &attn_cases[5]; /* sequence 4 has Lq 5, Lk 2 */
    float *got = attention_case(ac, 7);
    int64_t t0 = 3 + 1 + 0 + 4; /* first query of sequence 4 */
    for (int64_t t = t0; t < t0 + 3; t++)
        for (int64_t i = 0; i < ac->Hq * ac->D; i++)
            assert_true(got[t * ac->Hq * ac->D + i] == 0.0f);
    bool nonzero = false;
    for (int64_t i = 0; i < ac->Hq * ac->D; i++)
        nonzero |= got[(t0 + 3) * ac->Hq * ac->D + i] != 0.0f;
    assert_true(nonzero);
    op_release_all();
}

/* ---- ATTENTION_PAGED: tolerance 2e-5 as ATTENTION (the same kernel body), and the same bits
 * for a sequence alone as in its batch ---------------------------------------------------- */

static void test_attention_paged(void **state)
{
    (void)state;
    need_device();
    op_case_attention_paged(&g_checks, 2e-5);
}

/* ATTENTION: a sequence packed with others gives its bits alone (the vision batch's rule). */
static void test_attention_packed(void **state)
{
    (void)state;
    need_device();
    op_case_attention_packed();
}

/* ---- GET_ROWS: exact ------------------------------------------------------------------ */

static void test_get_rows(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][3] = { { 1, 1, 1 }, { 10, 7, 5 }, { 1000, 64, 33 },
                                        { 32, 4096, 3 }, { 5, 300, 600 } };
    op_rng_seed(9);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            int64_t V = cases[c][0], N = cases[c][1], T = cases[c][2];
            float *tab;
            struct op_pair *tt = op_pair_rand(op_weight_dtypes[d], -3, 3, &tab, SHAPE(V, N));
            int32_t *ids = op_alloc((size_t)T * 4);
            for (int64_t t = 0; t < T; t++)
                ids[t] = op_rng_int(0, (int)V - 1);
            ids[0] = (int32_t)V - 1;
            if (T > 2)
                ids[1] = 0, ids[2] = ids[0];
            struct op_pair *ti = op_pair_i32(ids, T);
            struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, N));
            struct op_pair *src[2] = { tt, ti };
            op_pair_run(MMRT_OP_GET_ROWS, src, 2, ty, NULL, 0);
            float *got = op_pair_download(OCL, ty);
            for (int64_t t = 0; t < T; t++)
                assert_memory_equal(got + t * N, tab + ids[t] * N, (size_t)N * sizeof(float));
            assert_memory_equal(got, op_pair_download(CPU, ty), (size_t)(T * N) * sizeof(float));
            note_exact(MMRT_OP_GET_ROWS);
            op_release_all();
        }
}

/* ---- SET_ROWS: exact -------------------------------------------------------------------
 * Every dst dtype; KV-cache shapes [R, Hkv, D], a single token (decode), rows longer than a
 * work-group, a 1-D dst; indices out of range (which write nothing) and repeated (the last
 * row wins whole). dst starts with a sentinel, so rows nobody writes are checked too. The
 * expectation is ref_set_rows rounded to dst's dtype; the CPU plugin must match byte for
 * byte. Then the decode-step pattern: the same launch again after a new index upload. */

static void test_set_rows(void **state)
{
    (void)state;
    need_device();
    op_case_set_rows(&g_checks);
}

/* ---- GATHER_HEADS: exact; L2_NORM: 1e-5 ----------------------------------------------
 * GATHER_HEADS: op_cases.c's cases (G = 1 copies in any order with repeats, ragged 2×2 and
 * 3×3 pools, a group of padding, entries ≥ R skipped, D = 1, 7, 40, 64, 128, 257) for every
 * table dtype, byte for byte against ref_gather_heads and the CPU plugin: the kernel does the
 * f32 additions in g order and one correctly rounded division, as plugin.h fixes. L2_NORM:
 * the squares summed in double (fp64) or f32 by a work-group tree, within 1e-5 of the
 * reference on every row. Then the launches both must refuse, worded as on the CPU. */

static void test_gather_heads(void **state)
{
    (void)state;
    need_device();
    op_case_gather_heads(&g_checks);
}

static void test_l2_norm(void **state)
{
    (void)state;
    need_device();
    op_case_l2_norm(&g_checks, 1e-5);
}

static void test_gather_l2_refusals(void **state)
{
    (void)state;
    need_device();
    op_gather_l2_refusals(&H[OCL]);
}

/* ---- I8 KV stores (plugin.h "I8 with row scales", ABI 1.7): exact -----------------------
 * The shared cases (op_checks.kv_i8) quantize with mmrt_ref_i8_row_quantize and read stores whose
 * codes times scales give back the case's floats. These add a rank-4 SET_ROWS dst (several
 * innermost rows per written row, D = 1, off every vector width, longer than a work-group)
 * against the header's definition, and stores of any codes and scales — the
 * products c · s then mostly inexact, some scales subnormal or 0 — which ATTENTION_PAGED and
 * GATHER_HEADS must read exactly as an F32 copy holding those products: bit for bit the same
 * result, so the widening is one rounded product, never fused into the sum that follows. */

static void test_kv_i8_set_rows(void **state)
{
    (void)state;
    need_device();
    static const int64_t Ds[] = { 1, 13, 300 };
    const int64_t T = 7, R = 5, A = 2, B = 3;
    op_rng_seed(31);
    for (size_t k = 0; k < sizeof Ds / sizeof Ds[0]; k++) {
        const int64_t D = Ds[k], n = A * B * D, per = A * B;
        float *v = op_rand_f(T * n, -1, 1);
        for (int64_t r = 0; r < T * per; r++) { /* each innermost row its own magnitude */
            float *x = v + r * D;
            for (int64_t i = 0; i < D; i++)
                x[i] = r % 5 == 4 ? NAN : ldexpf(x[i], (int)(r % 23) * 6 - 140);
        }
        struct op_pair *tv = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, A, B, D));
        op_pair_upload(tv, v);
        int8_t *want = op_alloc((size_t)(R * n));
        float *want_s = op_alloc((size_t)(R * per) * sizeof(float));
        memset(want, 0x7f, (size_t)(R * n));
        for (int64_t i = 0; i < R * per; i++)
            want_s[i] = (float)i + 0.25f;
        struct op_pair *ty = op_pair_new(MMRT_DTYPE_I8, SHAPE(R, A, B, D));
        struct op_pair *ts = op_pair_new(MMRT_DTYPE_F32, SHAPE(R * per));
        op_pair_upload(ty, want);
        op_pair_upload(ts, want_s);
        const int32_t idx[7] = { 3, -1, 0, 5, 3, 4, INT32_MAX }; /* row 4 of the values wins 3 */
        struct op_pair *ti = op_pair_i32(idx, T), *src[3] = { tv, ti, ts };
        for (int64_t t = 0; t < T; t++)
            if (idx[t] >= 0 && idx[t] < R)
                for (int64_t j = 0; j < per; j++)
                    mmrt_ref_i8_row_quantize(v + (t * per + j) * D, D, want + (idx[t] * per + j) * D,
                                    want_s + idx[t] * per + j);
        op_pair_run(MMRT_OP_SET_ROWS, src, 3, ty, NULL, 0);
        void *g, *c;
        char what[96];
        snprintf(what, sizeof what, "SET_ROWS I8 dst [%lld, %lld, %lld, %lld]: codes",
                 (long long)R, (long long)A, (long long)B, (long long)D);
        op_pair_download_both(ty, &g, &c);
        check_exact(MMRT_OP_SET_ROWS, what, g, c, want, (size_t)(R * n));
        snprintf(what, sizeof what, "SET_ROWS I8 dst [%lld, %lld, %lld, %lld]: scales",
                 (long long)R, (long long)A, (long long)B, (long long)D);
        op_pair_download_both(ts, &g, &c);
        check_exact(MMRT_OP_SET_ROWS, what, g, c, want_s, (size_t)(R * per) * sizeof(float));
        op_release_all();
    }
}

/* Random codes and scales for `rows` rows of D, and the products c · s they stand for
 * (*deq); a row of `like` holding NaN (the paged cases' poison) gets scale NaN, which keeps
 * it poison. Scales lie in [2^-10, 2), every thirteenth row's 2^-120 times that (subnormal
 * products, some subnormal scales) and every eleventh 0; codes include ±127. */
static int8_t *i8_any_rows(const float *like, int64_t rows, int64_t D, float **scales,
                           float **deq)
{
    int8_t *q = op_alloc((size_t)(rows * D));
    *scales = op_alloc((size_t)rows * sizeof(float));
    *deq = op_alloc((size_t)(rows * D) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        bool poison = false;
        for (int64_t i = 0; like && i < D; i++)
            poison = poison || isnan(like[r * D + i]);
        float s = r % 11 == 10 ? 0.0f : ldexpf(op_rng_f(1.0f, 2.0f), op_rng_int(-10, 0));
        if (r % 13 == 12)
            s = ldexpf(s, -120); /* subnormal products, and some subnormal scales */
        (*scales)[r] = poison ? NAN : s;
        for (int64_t i = 0; i < D; i++) {
            q[r * D + i] = (int8_t)(i % 17 == 3 ? (r % 2 ? -127 : 127) : op_rng_int(-127, 127));
            (*deq)[r * D + i] = (float)q[r * D + i] * (*scales)[r];
        }
    }
    return q;
}

static void test_kv_i8_widening(void **state)
{
    (void)state;
    need_device();
    static const struct op_paged_case paged[] = {
        /* Hq Hkv D  pt n_seq lq          lk            causal kv  order             amp window */
        { 4, 2, 64, 16, 3, { 1, 1, 1 }, { 37, 16, 1 }, 1, MMRT_DTYPE_F32, OP_PAGES_SHUFFLED, 1, 0 },
        { 8, 2, 40, 3, 2, { 40, 1 }, { 60, 25 }, 1, MMRT_DTYPE_F32, OP_PAGES_SHARED, 2, 0 },
        { 6, 3, 13, 5, 2, { 7, 4 }, { 7, 11 }, 0, MMRT_DTYPE_F32, OP_PAGES_IN_ORDER, 1, 0 },
        { 4, 1, 256, 4, 2, { 33, 1 }, { 70, 29 }, 1, MMRT_DTYPE_F32, OP_PAGES_SHUFFLED, 1, 9 },
    };
    op_rng_seed(32);
    for (size_t c = 0; c < sizeof paged / sizeof paged[0]; c++) {
        const struct op_paged_case *pc = &paged[c];
        struct op_paged_data d;
        op_paged_build(pc, 700 + c, &d);
        const int64_t rows = d.n_pages * pc->page_tokens * pc->Hkv, D = pc->D;
        float *ks, *vs, *kd, *vd;
        int8_t *kq = i8_any_rows(d.k_pages, rows, D, &ks, &kd);
        int8_t *vq = i8_any_rows(d.v_pages, rows, D, &vs, &vd);
        d.k_pages = kd; /* the F32 pools hold what the I8 ones stand for */
        d.v_pages = vd;
        struct op_paged_pairs pp;
        op_paged_pairs(pc, &d, &pp);
        op_pair_run(MMRT_OP_ATTENTION_PAGED, pp.src, 6, pp.y, &pp.p, sizeof pp.p);
        const int64_t pool[4] = { d.n_pages, pc->page_tokens, pc->Hkv, D };
        struct op_pair *src[8] = { pp.src[0], op_pair_new(MMRT_DTYPE_I8, 4, pool),
                                   op_pair_new(MMRT_DTYPE_I8, 4, pool), pp.src[3], pp.src[4],
                                   pp.src[5], op_pair_new(MMRT_DTYPE_F32, SHAPE(rows)),
                                   op_pair_new(MMRT_DTYPE_F32, SHAPE(rows)) };
        op_pair_upload(src[1], kq);
        op_pair_upload(src[2], vq);
        op_pair_upload(src[6], ks);
        op_pair_upload(src[7], vs);
        struct op_pair *y8 = op_pair_new(MMRT_DTYPE_F32, SHAPE(d.T, pc->Hq, D));
        op_pair_run(MMRT_OP_ATTENTION_PAGED, src, 8, y8, &pp.p, sizeof pp.p);
        const int64_t n = d.T * pc->Hq * D;
        for (int dev = 0; dev < NDEV; dev++) {
            const float *f32 = op_pair_download(dev, pp.y), *i8 = op_pair_download(dev, y8);
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&f32[i], &i8[i], sizeof(float)) != 0)
                    fail_msg("ATTENTION_PAGED case %zu on %s: element %lld is %.9g from the F32 "
                             "copies but %.9g from the I8 pools (must be the same bits)", c,
                             dev == OCL ? "OpenCL" : "the CPU plugin", (long long)i,
                             (double)f32[i], (double)i8[i]);
        }
        g_cases[MMRT_OP_ATTENTION_PAGED]++; /* its table row keeps the shared cases' tolerance */
        op_release_all();
    }

    /* GATHER_HEADS: 2×2 pools with padding and an entry ≥ R, against the header's arithmetic
     * in f32 C on the products. */
    const int64_t R = 30, Hh = 3, Dg = 71, N = 12, G = 4;
    float *sc, *deq;
    int8_t *tq = i8_any_rows(NULL, R * Hh, Dg, &sc, &deq);
    int32_t *idx = op_alloc((size_t)(N * Hh * G) * sizeof(int32_t));
    for (int64_t i = 0; i < N * Hh * G; i++)
        idx[i] = i % 9 == 4 ? -1 : i % 23 == 7 ? (int32_t)R : op_rng_int(0, (int)R - 1);
    float *want = op_alloc((size_t)(N * Hh * Dg) * sizeof(float));
    for (int64_t grp = 0; grp < N * Hh; grp++)
        for (int64_t e = 0; e < Dg; e++) {
            float s = 0.0f;
            int cnt = 0;
            for (int64_t g = 0; g < G; g++) {
                const int32_t r = idx[grp * G + g];
                if (r < 0 || r >= R)
                    continue;
                const float v = deq[(r * Hh + grp % Hh) * Dg + e];
                s = cnt++ == 0 ? v : s + v;
            }
            want[grp * Dg + e] = cnt == 0 ? 0.0f : cnt == 1 ? s : s / (float)cnt;
        }
    struct op_pair *tt = op_pair_new(MMRT_DTYPE_I8, SHAPE(R, Hh, Dg));
    struct op_pair *ts = op_pair_new(MMRT_DTYPE_F32, SHAPE(R * Hh));
    struct op_pair *ti = op_pair_new(MMRT_DTYPE_I32, SHAPE(N, Hh, G));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(N, Hh, Dg));
    op_pair_upload(tt, tq);
    op_pair_upload(ts, sc);
    op_pair_upload(ti, idx);
    struct op_pair *src[3] = { tt, ti, ts };
    op_pair_run(MMRT_OP_GATHER_HEADS, src, 3, ty, NULL, 0);
    void *g, *c;
    op_pair_download_both(ty, &g, &c);
    check_exact(MMRT_OP_GATHER_HEADS, "GATHER_HEADS I8 table of any codes and scales", g, c,
                want, (size_t)(N * Hh * Dg) * sizeof(float));
    op_release_all();
}

/* ---- PATCH_EMBED: tolerance 1e-5 (the MATMUL kernels over K = C·P·P ≤ 2352) ----------- */

static void test_patch_embed(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][6] = { /* B, C, H, W, P, O */
        { 1, 3, 28, 28, 7, 32 }, { 2, 3, 14, 21, 7, 5 }, { 1, 3, 30, 60, 30, 8 },
        { 1, 1, 4, 4, 1, 3 },    { 2, 2, 6, 6, 3, 1 },   { 1, 3, 56, 42, 14, 67 },
        { 1, 3, 28, 28, 28, 2 }, /* one patch: M = 1, the small-M kernel */
    };
    op_rng_seed(10);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            int64_t B = cases[c][0], C = cases[c][1], Hh = cases[c][2], W = cases[c][3];
            int64_t P = cases[c][4], O = cases[c][5], nP = (Hh / P) * (W / P);
            bool bias = (c + (size_t)d) % 2 == 0;
            float *img, *w, *b = NULL;
            struct op_pair *ti = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &img, SHAPE(B, C, Hh, W));
            struct op_pair *tw = op_pair_rand(op_weight_dtypes[d], -1, 1, &w, SHAPE(O, C, P, P));
            struct op_pair *tb =
                bias ? op_pair_rand(op_weight_dtypes[d], -1, 1, &b, SHAPE(O)) : NULL;
            struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(B, nP, O));
            struct op_pair *src[3] = { ti, tw, tb };
            struct mmrt_patch_params p = { (int32_t)P };
            op_pair_run(MMRT_OP_PATCH_EMBED, src, 3, ty, &p, sizeof p);
            double *ref = op_ref_buf(B * nP * O);
            ref_patch_embed(img, w, b, B, C, Hh, W, P, O, ref);
            char what[96];
            snprintf(what, sizeof what, "PATCH_EMBED case %zu W %s bias %d", c,
                     mmrt_dtype_name_of(op_weight_dtypes[d]), bias);
            check_both(MMRT_OP_PATCH_EMBED, what, op_pair_download(OCL, ty),
                       op_pair_download(CPU, ty), ref, B * nP * O, 1e-5);
            op_release_all();
        }
}

/* ---- CONCAT: exact -------------------------------------------------------------------- */

static int64_t idx4(const int64_t *ne, const int64_t *i)
{
    return ((i[0] * ne[1] + i[1]) * ne[2] + i[2]) * ne[3] + i[3];
}

static void test_concat(void **state)
{
    (void)state;
    need_device();
    static const int64_t shapes[][4] = { { 5, 1, 1, 1 }, { 3, 4, 1, 1 }, { 2, 3, 5, 1 },
                                         { 2, 3, 2, 7 } };
    static const enum mmrt_dtype dts[] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                           MMRT_DTYPE_I32 };
    op_rng_seed(11);
    for (int nd = 1; nd <= 4; nd++)
        for (int axis = 0; axis < nd; axis++)
            for (int d = 0; d < 4; d++) {
                enum mmrt_dtype dt = dts[d];
                int64_t es = (int64_t)mmrt_dtype_size(dt);
                int64_t na[4], nb_[4], ny[4];
                for (int i = 0; i < 4; i++)
                    na[i] = nb_[i] = ny[i] = shapes[nd - 1][i];
                nb_[axis] = shapes[nd - 1][axis] + 2; /* src1 is longer on the axis */
                ny[axis] = na[axis] + nb_[axis];
                int64_t n_a = na[0] * na[1] * na[2] * na[3];
                int64_t n_b = nb_[0] * nb_[1] * nb_[2] * nb_[3];
                /* src0 contiguous; src1 a view with its innermost rows padded by 3. */
                uint8_t *ha = op_alloc((size_t)(n_a * es)), *hb = op_alloc((size_t)(n_b * es));
                for (int64_t i = 0; i < n_a * es; i++)
                    ha[i] = (uint8_t)op_rng_u64();
                for (int64_t i = 0; i < n_b * es; i++)
                    hb[i] = (uint8_t)op_rng_u64();
                struct op_pair *ta = op_pair_new(dt, nd, na);
                op_pair_upload(ta, ha);
                int64_t inner = nb_[nd - 1], padded = inner + 3, outer = n_b / inner;
                struct op_pair *tbb = op_pair_new(dt, SHAPE(outer, padded));
                uint8_t *hbp = op_alloc((size_t)(outer * padded * es));
                for (int64_t o = 0; o < outer; o++)
                    memcpy(hbp + o * padded * es, hb + o * inner * es, (size_t)(inner * es));
                op_pair_upload(tbb, hbp);
                int64_t vnb[4];
                vnb[nd - 1] = es;
                if (nd >= 2)
                    vnb[nd - 2] = padded * es;
                for (int i = nd - 3; i >= 0; i--)
                    vnb[i] = vnb[i + 1] * nb_[i + 1];
                struct op_pair tb = op_pair_view(tbb, dt, nd, nb_, vnb, 0);
                struct op_pair *ty = op_pair_new(dt, nd, ny);
                struct mmrt_concat_params p = { axis };
                struct op_pair *src[2] = { ta, &tb };
                /* The OpenCL result is checked against the definition; the CPU plugin's is
                 * compared with it afterwards, so a disagreement says which side is wrong. */
                assert_int_equal(op_pair_run_on(OCL, MMRT_OP_CONCAT, src, 2, ty, &p, sizeof p),
                                 MMRT_OK);
                assert_int_equal(op_pair_run_on(CPU, MMRT_OP_CONCAT, src, 2, ty, &p, sizeof p),
                                 MMRT_OK);
                uint8_t *got = op_pair_download(OCL, ty);
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
                uint8_t *cpu = op_pair_download(CPU, ty);
                if (memcmp(got, cpu, (size_t)ty->t[0].nbytes) != 0)
                    fail_msg("CONCAT rank %d axis %d %s: OpenCL matches the definition, the CPU "
                             "plugin does not", nd, axis, mmrt_dtype_name_of(dt));
                note_exact(MMRT_OP_CONCAT);
                op_release_all();
            }
}

/* ---- COPY: exact ---------------------------------------------------------------------- */

/* Copies n values (host bytes in sdt) through both devices into ddt and compares each with
 * the definition and with the CPU plugin. */
static void check_conversion(enum mmrt_dtype sdt, enum mmrt_dtype ddt, const void *src, int64_t n)
{
    struct op_pair *ts = op_pair_new(sdt, SHAPE(n)), *td = op_pair_new(ddt, SHAPE(n));
    op_pair_upload(ts, src);
    struct op_pair *srcs[1] = { ts };
    op_pair_run(MMRT_OP_COPY, srcs, 1, td, NULL, 0);
    size_t ses = mmrt_dtype_size(sdt), des = mmrt_dtype_size(ddt);
    uint8_t *got = op_pair_download(OCL, td), *cpu = op_pair_download(CPU, td);
    for (int64_t i = 0; i < n; i++) {
        uint8_t want[4];
        op_convert_one(sdt, (const uint8_t *)src + i * (int64_t)ses, ddt, want);
        if (!op_same_value(ddt, got + i * (int64_t)des, want) ||
            !op_same_value(ddt, got + i * (int64_t)des, cpu + i * (int64_t)des)) {
            uint32_t s = 0, g = 0, w = 0, c = 0;
            memcpy(&s, (const uint8_t *)src + i * (int64_t)ses, ses);
            memcpy(&g, got + i * (int64_t)des, des);
            memcpy(&w, want, des);
            memcpy(&c, cpu + i * (int64_t)des, des);
            fail_msg("COPY %s→%s: source bits 0x%x gave 0x%x, want 0x%x (CPU plugin 0x%x)",
                     mmrt_dtype_name_of(sdt), mmrt_dtype_name_of(ddt), s, g, w, c);
        }
    }
    note_exact(MMRT_OP_COPY);
}

static void test_copy_conversions(void **state)
{
    (void)state;
    need_device();
    uint16_t *all = op_alloc(65536 * 2);
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    check_conversion(MMRT_DTYPE_F16, MMRT_DTYPE_F32, all, 65536);
    check_conversion(MMRT_DTYPE_BF16, MMRT_DTYPE_F32, all, 65536);
    check_conversion(MMRT_DTYPE_F16, MMRT_DTYPE_BF16, all, 65536);
    check_conversion(MMRT_DTYPE_BF16, MMRT_DTYPE_F16, all, 65536);
    check_conversion(MMRT_DTYPE_F16, MMRT_DTYPE_F16, all, 65536);

    static const uint32_t edge[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
        0x3f801000, 0x3f803000, 0x477fe000, 0x477fefff, 0x477ff000, 0x38800000, 0x387fffff,
        0x387fe000, 0x33800000, 0x33000000, 0x33000001, 0x33c00000, 0x3f808000, 0x3f818000,
        0x7f7fffff, 0xff7fffff, 0x00000001, 0x007fffff, 0xb3000001, 0x337fffff, 0x38000000,
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
    need_device();
    static const enum mmrt_dtype dts[] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16 };
    static const int perms[][4] = { { 0, 2, 1, 3 }, { 3, 1, 0, 2 }, { 0, 1, 2, 3 },
                                    { 2, 3, 0, 1 } };
    const int64_t base_ne[4] = { 2, 3, 5, 7 };
    op_rng_seed(13);
    for (int pi = 0; pi < 4; pi++)
        for (int s = 0; s < 3; s++)
            for (int d = 0; d < 3; d++) {
                enum mmrt_dtype sdt = dts[s], ddt = dts[d];
                int64_t ses = (int64_t)mmrt_dtype_size(sdt), des = (int64_t)mmrt_dtype_size(ddt);
                float *vals = op_rand_f(210, -100, 100);
                struct op_pair *tb = op_pair_new(sdt, 4, base_ne);
                op_pair_upload_f32(tb, vals);
                int64_t bnb[4], ne[4], nb[4];
                bnb[3] = ses;
                for (int i = 2; i >= 0; i--)
                    bnb[i] = bnb[i + 1] * base_ne[i + 1];
                for (int i = 0; i < 4; i++) {
                    ne[i] = base_ne[perms[pi][i]];
                    nb[i] = bnb[perms[pi][i]];
                }
                struct op_pair sv = op_pair_view(tb, sdt, 4, ne, nb, 0);
                struct op_pair *td = op_pair_new(ddt, 4, ne);
                struct op_pair *src[1] = { &sv };
                op_pair_run(MMRT_OP_COPY, src, 1, td, NULL, 0);
                uint8_t *got = op_pair_download(OCL, td);
                int64_t i[4];
                for (i[0] = 0; i[0] < ne[0]; i[0]++)
                    for (i[1] = 0; i[1] < ne[1]; i[1]++)
                        for (i[2] = 0; i[2] < ne[2]; i[2]++)
                            for (i[3] = 0; i[3] < ne[3]; i[3]++) {
                                int64_t bi[4];
                                for (int k = 0; k < 4; k++)
                                    bi[perms[pi][k]] = i[k];
                                uint8_t sbytes[4], want[4];
                                float f = vals[idx4(base_ne, bi)];
                                op_convert_one(MMRT_DTYPE_F32, &f, sdt, sbytes);
                                op_convert_one(sdt, sbytes, ddt, want);
                                if (memcmp(got + idx4(ne, i) * des, want, (size_t)des) != 0)
                                    fail_msg("COPY perm %d %s→%s differs at %lld", pi,
                                             mmrt_dtype_name_of(sdt), mmrt_dtype_name_of(ddt),
                                             (long long)idx4(ne, i));
                            }
                assert_memory_equal(got, op_pair_download(CPU, td), (size_t)td->t[0].nbytes);
                note_exact(MMRT_OP_COPY);
                op_release_all();
            }

    /* A KV-cache write: [T, Hkv, D] F32 into tokens [off, off + T) of an F16 cache; the rest
     * of the cache keeps its contents. Then the same slot converted in place F16 → BF16. */
    int64_t T = 3, Hkv = 2, D = 300, cap = 10, off = 4;
    float *kv = op_rand_f(T * Hkv * D, -2, 2);
    struct op_pair *tkv = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, Hkv, D));
    op_pair_upload_f32(tkv, kv);
    struct op_pair *cache = op_pair_new(MMRT_DTYPE_F16, SHAPE(cap, Hkv, D));
    uint16_t *old = op_alloc((size_t)cache->t[0].nbytes);
    for (int64_t i = 0; i < cap * Hkv * D; i++)
        old[i] = (uint16_t)(0x3c00 + i % 1000);
    op_pair_upload(cache, old);
    struct op_pair slot = op_pair_view(cache, MMRT_DTYPE_F16, SHAPE(T, Hkv, D),
                             (const int64_t[]){ Hkv * D * 2, D * 2, 2 },
                             (uint64_t)(off * Hkv * D * 2));
    struct op_pair *src[1] = { tkv };
    op_pair_run(MMRT_OP_COPY, src, 1, &slot, NULL, 0);
    uint16_t *now = op_pair_download(OCL, cache);
    for (int64_t i = 0; i < cap * Hkv * D; i++) {
        int64_t t = i / (Hkv * D);
        uint16_t want =
            t >= off && t < off + T ? mmrt_f32_to_f16(kv[i - off * Hkv * D]) : old[i];
        assert_int_equal(now[i], want);
    }
    assert_memory_equal(now, op_pair_download(CPU, cache), (size_t)cache->t[0].nbytes);
    struct op_pair as_bf16 = slot;
    for (int d = 0; d < NDEV; d++)
        as_bf16.t[d].t.dtype = MMRT_DTYPE_BF16;
    struct op_pair *self[1] = { &slot };
    op_pair_run(MMRT_OP_COPY, self, 1, &as_bf16, NULL, 0);
    uint16_t *conv = op_pair_download(OCL, cache);
    for (int64_t i = off * Hkv * D; i < (off + T) * Hkv * D; i++)
        assert_int_equal(conv[i], mmrt_f32_to_bf16(mmrt_f16_to_f32(now[i])));
    assert_memory_equal(conv, op_pair_download(CPU, cache), (size_t)cache->t[0].nbytes);
    op_release_all();
}

/* ---- ARGMAX: exact -------------------------------------------------------------------- */

static void test_argmax(void **state)
{
    (void)state;
    need_device();
    static const int64_t cases[][2] = { { 1, 1 }, { 4, 7 }, { 3, 1000 }, { 2, 32000 }, { 9, 2 },
                                        { 10, 513 } };
    op_rng_seed(14);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c][0], N = cases[c][1];
        float *x = op_rand_f(R * N, -5, 5);
        for (int64_t r = 0; r < R; r++) {
            float *row = x + r * N;
            int kind = (int)(r % 6);
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
            } else if (kind == 5 && N > 300) { /* ties that different work-items hold */
                row[299] = row[43] = row[N - 1] = 11.0f;
            }
        }
        struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
        op_pair_upload_f32(tx, x);
        struct op_pair *ty = op_pair_new(MMRT_DTYPE_I32, SHAPE(R));
        struct op_pair *src[1] = { tx };
        op_pair_run(MMRT_OP_ARGMAX, src, 1, ty, NULL, 0);
        int32_t *got = op_pair_download(OCL, ty), *cpu = op_pair_download(CPU, ty);
        for (int64_t r = 0; r < R; r++)
            if (got[r] != ref_argmax(x + r * N, N) || got[r] != cpu[r])
                fail_msg("ARGMAX [%lld, %lld] row %lld: got %d, want %d (CPU plugin %d)",
                         (long long)R, (long long)N, (long long)r, (int)got[r],
                         (int)ref_argmax(x + r * N, N), (int)cpu[r]);
        note_exact(MMRT_OP_ARGMAX);
        op_release_all();
    }
}

/* ---- errors --------------------------------------------------------------------------- */

static const char *ocl_err(void)
{
    return H[OCL].plugin->last_error(H[OCL].dev);
}

/* The device still computes after an error: SCALE in place on a fresh tensor. */
static void expect_usable(void)
{
    float x[5] = { 1, -2, 3, -4, 5 };
    struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(5));
    op_pair_upload_f32(tx, x);
    struct op_pair *src[1] = { tx };
    struct mmrt_scale_params p = { 2.0f };
    assert_int_equal(op_pair_run_on(OCL, MMRT_OP_SCALE, src, 1, tx, &p, sizeof p), MMRT_OK);
    float *y = op_pair_download(OCL, tx);
    for (int i = 0; i < 5; i++)
        assert_true(y[i] == 2 * x[i]);
}

static void expect_refusal(mmrt_status got, mmrt_status want, const char *op, const char *needle)
{
    const char *msg = ocl_err();
    if (got != want)
        fail_msg("%s: status %d, want %d (%s)", op, (int)got, (int)want, msg);
    if (!strstr(msg, op) || (needle && !strstr(msg, needle)))
        fail_msg("%s: message \"%s\" should name the op%s%s", op, msg, needle ? " and " : "",
                 needle ? needle : "");
    expect_usable();
}

/* GET_ROWS with an id outside the table: the launch succeeds (the ids are on the device), the
 * next download reports the id and its row and dst is untouched; the error is then cleared
 * and GET_ROWS works again. The same through synchronize(). */
static void test_get_rows_async_error(void **state)
{
    (void)state;
    need_device();
    op_rng_seed(15);
    float *tab;
    struct op_pair *tt = op_pair_rand(MMRT_DTYPE_F16, -1, 1, &tab, SHAPE(6, 8));
    float *sentinel = op_rand_f(600 * 8, 7, 8);
    struct op_pair *rows = op_pair_new(MMRT_DTYPE_F32, SHAPE(600, 8));
    op_pair_upload_f32(rows, sentinel);
    int32_t *ids = op_alloc(600 * 4);
    for (int k = 0; k < 3; k++) {
        for (int t = 0; t < 600; t++)
            ids[t] = t % 6;
        int bad_row = k == 0 ? 1 : k == 1 ? 599 : 300;
        int bad_id = k == 0 ? 6 : k == 1 ? -1 : 1 << 30;
        ids[bad_row] = bad_id;
        if (k == 2)
            ids[500] = -7; /* two bad ids: the first row is the one reported */
        struct op_pair *ti = op_pair_i32(ids, 600), *src[2] = { tt, ti };
        assert_int_equal(op_pair_run_on(OCL, MMRT_OP_GET_ROWS, src, 2, rows, NULL, 0), MMRT_OK);
        float *got = op_alloc(600 * 8 * sizeof(float));
        mmrt_status st = k == 1 ? H[OCL].plugin->synchronize(H[OCL].dev)
                                : harness_download(&H[OCL], &rows->t[OCL], got);
        assert_int_equal(st, MMRT_ERR_INVALID_ARG);
        char want[96];
        snprintf(want, sizeof want, "id %d at row %d", bad_id, bad_row);
        printf("reported as expected: %s\n", ocl_err());
        assert_non_null(strstr(ocl_err(), "GET_ROWS"));
        assert_non_null(strstr(ocl_err(), want));
        assert_non_null(strstr(ocl_err(), "[0, 6)"));
        /* Reported once: the buffer is clear now, and dst was never written. */
        assert_int_equal(H[OCL].plugin->synchronize(H[OCL].dev), MMRT_OK);
        assert_memory_equal(op_pair_download(OCL, rows), sentinel, 600 * 8 * sizeof(float));
        expect_usable();
    }
    /* Valid ids work again on the same tensors. */
    for (int t = 0; t < 600; t++)
        ids[t] = (t * 7) % 6;
    struct op_pair *ti = op_pair_i32(ids, 600), *src[2] = { tt, ti };
    assert_int_equal(op_pair_run_on(OCL, MMRT_OP_GET_ROWS, src, 2, rows, NULL, 0), MMRT_OK);
    float *got = op_pair_download(OCL, rows);
    for (int t = 0; t < 600; t++)
        assert_memory_equal(got + t * 8, tab + ids[t] * 8, 8 * sizeof(float));
    op_release_all();
}

/* ATTENTION with cu_seqlens that do not add up: reported at the next synchronize, naming the
 * entry; the output is untouched. */
static void test_attention_async_error(void **state)
{
    (void)state;
    need_device();
    float *q, *k, *v;
    struct op_pair *tq = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &q, SHAPE(6, 2, 16));
    struct op_pair *tk = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &k, SHAPE(8, 1, 16));
    struct op_pair *tv = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &v, SHAPE(8, 1, 16));
    float *sentinel = op_rand_f(6 * 2 * 16, 5, 6);
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(6, 2, 16));
    op_pair_upload_f32(ty, sentinel);
    static const int32_t cases[3][2][3] = {
        { { 0, 4, 6 }, { 0, 5, 9 } }, /* cu_k ends at 9, S is 8 */
        { { 0, 4, 3 }, { 0, 5, 8 } }, /* cu_q decreases */
        { { 1, 4, 6 }, { 0, 5, 8 } }, /* cu_q does not start at 0 */
    };
    static const char *const needles[3] = { "cu_seqlens_k) entry 2 is 9",
                                            "cu_seqlens_q) entry 2 is 3",
                                            "cu_seqlens_q) entry 0 is 1" };
    for (int c = 0; c < 3; c++) {
        struct op_pair *cq = op_pair_i32(cases[c][0], 3), *ck = op_pair_i32(cases[c][1], 3);
        struct mmrt_attention_params p = { 0.25f, 1, 2, 0 };
        struct op_pair *src[5] = { tq, tk, tv, cq, ck };
        assert_int_equal(op_pair_run_on(OCL, MMRT_OP_ATTENTION, src, 5, ty, &p, sizeof p), MMRT_OK);
        assert_int_equal(H[OCL].plugin->synchronize(H[OCL].dev), MMRT_ERR_INVALID_ARG);
        printf("reported as expected: %s\n", ocl_err());
        assert_non_null(strstr(ocl_err(), "ATTENTION"));
        assert_non_null(strstr(ocl_err(), needles[c]));
        assert_memory_equal(op_pair_download(OCL, ty), sentinel, 6 * 2 * 16 * sizeof(float));
        expect_usable();
    }
    op_release_all();
}

/* ATTENTION_PAGED with a page id outside the pool, a kv_len beyond the table or negative,
 * cu_seqlens_q that do not run from 0 to T: the launch succeeds (the indices are on the
 * device), the next synchronize reports the entry, dst is untouched, the device still
 * works; then the same tensors with valid indices compute again. */
static void test_attention_paged_async_error(void **state)
{
    (void)state;
    need_device();
    struct op_paged_bad_run r;
    op_paged_bad_setup(&H[OCL], &r);
    for (size_t b = 0; b <= op_n_paged_bad; b++) {
        op_paged_bad_set(&H[OCL], &r, b);
        assert_int_equal(harness_run(&H[OCL], MMRT_OP_ATTENTION_PAGED, r.src, 6, r.y, &r.p,
                                     sizeof r.p), MMRT_OK);
        if (b == op_n_paged_bad)
            break; /* the valid indices: checked below */
        assert_int_equal(H[OCL].plugin->synchronize(H[OCL].dev), MMRT_ERR_INVALID_ARG);
        printf("reported as expected: %s\n", ocl_err());
        assert_non_null(strstr(ocl_err(), "ATTENTION_PAGED"));
        if (!strstr(ocl_err(), op_paged_bad[b].needle))
            fail_msg("message \"%s\" should contain \"%s\"", ocl_err(), op_paged_bad[b].needle);
        op_paged_bad_untouched(&H[OCL], &r);
        expect_usable();
    }
    const struct op_paged_case *pc = &op_paged_bad_case;
    double *ref = op_ref_buf(r.n);
    ref_attention_paged(r.d.q, r.d.k_pages, r.d.v_pages, r.d.T, pc->Hq, pc->Hkv, pc->D,
                        pc->page_tokens, r.d.cu_q, r.d.kv_lens, r.d.table, r.d.max_pages,
                        pc->n_seq, r.d.scale, pc->causal, 0, ref);
    float *got = op_alloc((size_t)r.n * sizeof(float));
    assert_int_equal(harness_download(&H[OCL], r.y, got), MMRT_OK);
    op_check_close("ATTENTION_PAGED after the errors", got, ref, r.n, 2e-5);
    op_release_all();
}

/* Argument errors are refused at launch with a message naming the op and the operand. */
/* I8 stores without their scales, and scales beside a float store, are refused by name (the
 * checks op_contract.h shares with the core), and so is a writer of the pre-1.7 op_args that
 * claims sources past the sixth. */
static void test_kv_i8_refusals(void **state)
{
    (void)state;
    need_device();
    struct op_pair *tv = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 3, 8));
    struct op_pair *ti = op_pair_i32((const int32_t[]){ 0, 1 }, 2);
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_I8, SHAPE(4, 3, 8));
    struct op_pair *ts = op_pair_new(MMRT_DTYPE_F32, SHAPE(12));
    struct op_pair *sr[3] = { tv, ti, ts };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SET_ROWS, sr, 2, ty, NULL, 0),
                   MMRT_ERR_INVALID_ARG, "SET_ROWS", "needs its row scales as src2");
    struct op_pair *yf = op_pair_new(MMRT_DTYPE_F16, SHAPE(4, 3, 8));
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SET_ROWS, sr, 3, yf, NULL, 0),
                   MMRT_ERR_INVALID_ARG, "SET_ROWS", "scales go with an I8 store only");
    struct op_pair *ts11 = op_pair_new(MMRT_DTYPE_F32, SHAPE(11)), *sr11[3] = { tv, ti, ts11 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SET_ROWS, sr11, 3, ty, NULL, 0),
                   MMRT_ERR_INVALID_ARG, "SET_ROWS", "src2 (scales)");

    const struct op_paged_case pc = { 2, 1, 16, 4, 1, { 1 }, { 6 }, 1, MMRT_DTYPE_F32,
                                      OP_PAGES_IN_ORDER, 1, 0 };
    struct op_paged_data d;
    op_paged_build(&pc, 9, &d);
    struct op_paged_pairs pp;
    op_paged_pairs(&pc, &d, &pp);
    const int64_t rows = d.n_pages * pc.page_tokens * pc.Hkv;
    struct op_pair *kq = op_pair_new(MMRT_DTYPE_I8, SHAPE(d.n_pages, pc.page_tokens, pc.Hkv, pc.D));
    struct op_pair *sc = op_pair_new(MMRT_DTYPE_F32, SHAPE(rows));
    struct op_pair *ap[8] = { pp.src[0], kq, kq, pp.src[3], pp.src[4], pp.src[5], sc, sc };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION_PAGED, ap, 6, pp.y, &pp.p, sizeof pp.p),
                   MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", "src6 (k_scales)");
    ap[1] = pp.src[1];
    ap[2] = pp.src[2];
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION_PAGED, ap, 8, pp.y, &pp.p, sizeof pp.p),
                   MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", "scales go with an I8 store only");

    /* An ABI 1.6 writer's op_args ends before src_ext: n_src 8 names slots it does not have. */
    struct mmrt_op_args a = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
        .op = MMRT_OP_ATTENTION_PAGED,
        .n_src = 8,
        .dst = &pp.y->t[OCL].t,
        .params = &pp.p,
        .params_size = sizeof pp.p,
    };
    a.hdr.struct_size = (uint32_t)offsetof(struct mmrt_op_args, src_ext);
    for (int i = 0; i < 6; i++)
        a.src[i] = &ap[i]->t[OCL].t;
    expect_refusal(H[OCL].plugin->ops[MMRT_OP_ATTENTION_PAGED](H[OCL].dev, &a),
                   MMRT_ERR_INVALID_ARG, "ATTENTION_PAGED", "no src_ext");

    struct op_pair *tab = op_pair_new(MMRT_DTYPE_I8, SHAPE(5, 2, 4));
    struct op_pair *gi = op_pair_new(MMRT_DTYPE_I32, SHAPE(3, 2, 1));
    struct op_pair *gy = op_pair_new(MMRT_DTYPE_F32, SHAPE(3, 2, 4)), *gh[3] = { tab, gi, NULL };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_GATHER_HEADS, gh, 2, gy, NULL, 0),
                   MMRT_ERR_INVALID_ARG, "GATHER_HEADS", "needs its row scales as src2");
    op_release_all();
}

static void test_refusals(void **state)
{
    (void)state;
    need_device();
    op_rng_seed(16);
    float *h;
    struct op_pair *x = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &h, SHAPE(4, 8));
    struct op_pair *w = op_pair_rand(MMRT_DTYPE_F16, -1, 1, &h, SHAPE(6, 8));
    struct op_pair *y = op_pair_new(MMRT_DTYPE_F32, SHAPE(4, 6));
    struct op_pair *xi = op_pair_new(MMRT_DTYPE_I32, SHAPE(4, 8));
    struct op_pair *y48 = op_pair_new(MMRT_DTYPE_F32, SHAPE(4, 8));

    struct op_pair *mm_bad_x[2] = { xi, w };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_MATMUL, mm_bad_x, 2, y, NULL, 0),
                   MMRT_ERR_INVALID_ARG, "MATMUL", "I32");
    struct op_pair *ydt = op_pair_new(MMRT_DTYPE_F16, SHAPE(4, 6)), *mm[2] = { x, w };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_MATMUL, mm, 2, ydt, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "MATMUL", "dst");
    struct op_pair *w9 = op_pair_new(MMRT_DTYPE_F32, SHAPE(6, 9)), *mm9[2] = { x, w9 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_MATMUL, mm9, 2, y, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "MATMUL", NULL);
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_MATMUL, mm, 1, y, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "MATMUL", "n_src");
    struct op_pair *b3 = op_pair_new(MMRT_DTYPE_F32, SHAPE(3)), *add[2] = { x, b3 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ADD, add, 2, y48, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "ADD", NULL);
    struct op_pair *y47 = op_pair_new(MMRT_DTYPE_F32, SHAPE(4, 7)), *sm[1] = { x };
    struct mmrt_scale_params sp = { 1.0f };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SOFTMAX, sm, 1, y47, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SOFTMAX", NULL);
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SOFTMAX, sm, 1, y48, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SOFTMAX", "params");
    struct mmrt_norm_params np = { -1.0f };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_RMSNORM, sm, 1, y48, &np, sizeof np),
                   MMRT_ERR_INVALID_ARG, "RMSNORM", "eps");

    /* ROPE and ATTENTION parameters. */
    struct op_pair *xr = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 2, 8));
    int32_t pos[2] = { 0, 1 };
    struct op_pair *tp = op_pair_i32(pos, 2), *rp[2] = { xr, tp };
    struct mmrt_rope_params rpp = { 10000.0f, 9, MMRT_ROPE_NEOX };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ROPE, rp, 2, xr, &rpp, sizeof rpp),
                   MMRT_ERR_INVALID_ARG, "ROPE", "n_rot 9");
    struct op_pair *tp2 = op_pair_new(MMRT_DTYPE_I32, SHAPE(2, 2)), *rm[2] = { xr, tp2 };
    struct mmrt_rope_multi_params rmp = { 10000.0f, 8, 8, 0, 2, { 2, 1 } };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ROPE_MULTI, rm, 2, xr, &rmp, sizeof rmp),
                   MMRT_ERR_INVALID_ARG, "ROPE_MULTI", "sections sum to 3");
    rmp.sections[1] = 2;
    rmp.n_axes = 3;
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ROPE_MULTI, rm, 2, xr, &rmp, sizeof rmp),
                   MMRT_ERR_INVALID_ARG, "ROPE_MULTI", "positions");
    rmp.n_axes = 2;
    rmp.freq_dim = 0;
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ROPE_MULTI, rm, 2, xr, &rmp, sizeof rmp),
                   MMRT_ERR_INVALID_ARG, "ROPE_MULTI", "freq_dim");
    struct op_pair *sv = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 8)),
                   *sd = op_pair_new(MMRT_DTYPE_F16, SHAPE(5, 7));
    struct op_pair *si = op_pair_i32(pos, 2), *sr[2] = { sv, si };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SET_ROWS, sr, 2, sd, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SET_ROWS", "inner extents");
    struct op_pair *sdi = op_pair_new(MMRT_DTYPE_I32, SHAPE(5, 8));
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SET_ROWS, sr, 2, sdi, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "SET_ROWS", "dst");
    struct op_pair *q300 = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 1, 300));
    struct op_pair *k300 = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 1, 300));
    struct op_pair *o300 = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 1, 300)),
                   *at[3] = { q300, k300, k300 };
    struct mmrt_attention_params ap = { 1.0f, 0, 1, 0 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION, at, 3, o300, &ap, sizeof ap),
                   MMRT_ERR_INVALID_ARG, "ATTENTION", "head dim 300");
    struct op_pair *kb = op_pair_new(MMRT_DTYPE_BF16, SHAPE(2, 1, 300)), *atb[3] = { q300, kb, kb };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION, atb, 3, o300, &ap, sizeof ap),
                   MMRT_ERR_INVALID_ARG, "ATTENTION", "BF16");
    struct op_pair *q16 = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 1, 16));
    struct op_pair *cu3 = op_pair_new(MMRT_DTYPE_I32, SHAPE(3)),
                   *atc[5] = { q16, q16, q16, cu3, NULL };
    struct op_pair *o16 = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 1, 16));
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION, atc, 5, o16, &ap, sizeof ap),
                   MMRT_ERR_INVALID_ARG, "ATTENTION", "both");
    /* A sliding window: bidirectional or negative is refused. */
    struct op_pair *at16[3] = { q16, q16, q16 };
    struct mmrt_attention_params apw = { 1.0f, 0, 1, 3 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION, at16, 3, o16, &apw, sizeof apw),
                   MMRT_ERR_INVALID_ARG, "ATTENTION", "window 3 needs causal = 1");
    apw.causal = 1;
    apw.window = -2;
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ATTENTION, at16, 3, o16, &apw, sizeof apw),
                   MMRT_ERR_INVALID_ARG, "ATTENTION", "window -2 must be ≥ 0");

    /* Views: odd offset, foreign buffer, overlap, rank, dtype. */
    struct op_pair odd = op_pair_view(x, MMRT_DTYPE_F32, SHAPE(7), (const int64_t[]){ 4 }, 2);
    struct op_pair *y7 = op_pair_new(MMRT_DTYPE_F32, SHAPE(7)), *sc_odd[1] = { &odd };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SCALE, sc_odd, 1, y7, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SCALE", "offset 2");
    float not_an_arena[8];
    struct op_pair foreign = *y7;
    foreign.t[OCL].t.buffer = not_an_arena;
    struct op_pair *sc_for[1] = { &foreign };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SCALE, sc_for, 1, y7, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SCALE", "not an arena");
    struct op_pair past = op_pair_view(y7, MMRT_DTYPE_F32, SHAPE(8), (const int64_t[]){ 4 }, 0);
    struct op_pair *sc_past[1] = { &past };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SCALE, sc_past, 1, &past, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SCALE", "outside its arena");
    struct op_pair x31 = op_pair_view(x, MMRT_DTYPE_F32, SHAPE(31), (const int64_t[]){ 4 }, 0);
    struct op_pair y31 = op_pair_view(x, MMRT_DTYPE_F32, SHAPE(31), (const int64_t[]){ 4 }, 4);
    struct op_pair *sc_ov[1] = { &x31 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SCALE, sc_ov, 1, &y31, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SCALE", "overlaps");
    struct op_pair bcast_dst =
        op_pair_view(y48, MMRT_DTYPE_F32, SHAPE(4, 8), (const int64_t[]){ 0, 4 }, 0);
    struct op_pair *cp[1] = { x };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_COPY, cp, 1, &bcast_dst, NULL, 0),
                   MMRT_ERR_INVALID_ARG, "COPY", "overlap");
    struct op_pair bad_rank = *x;
    bad_rank.t[OCL].t.n_dims = 5;
    struct op_pair *sc_rank[1] = { &bad_rank };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SCALE, sc_rank, 1, y48, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SCALE", "n_dims");
    struct op_pair bad_dt = *x;
    bad_dt.t[OCL].t.dtype = 9;
    struct op_pair *sc_dt[1] = { &bad_dt };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_SCALE, sc_dt, 1, y48, &sp, sizeof sp),
                   MMRT_ERR_INVALID_ARG, "SCALE", "dtype 9");

    /* Other contracts: COPY I32 → F32, CONCAT axis, PATCH_EMBED size, args for another op. */
    struct op_pair *cpi[1] = { xi };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_COPY, cpi, 1, y48, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "COPY", "I32");
    struct mmrt_concat_params cc = { 2 };
    struct op_pair *y88 = op_pair_new(MMRT_DTYPE_F32, SHAPE(8, 8)), *cat[2] = { x, x };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_CONCAT, cat, 2, y88, &cc, sizeof cc),
                   MMRT_ERR_INVALID_ARG, "CONCAT", "axis 2");
    struct op_pair *img = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, 1, 6, 7));
    struct op_pair *pw = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 1, 3, 3));
    struct op_pair *py = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, 4, 2)), *pe[2] = { img, pw };
    struct mmrt_patch_params pp = { 3 };
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_PATCH_EMBED, pe, 2, py, &pp, sizeof pp),
                   MMRT_ERR_INVALID_ARG, "PATCH_EMBED", "divide");
    struct op_pair *am[1] = { x }, *ai = op_pair_new(MMRT_DTYPE_F32, SHAPE(4));
    expect_refusal(op_pair_run_on(OCL, MMRT_OP_ARGMAX, am, 1, ai, NULL, 0), MMRT_ERR_INVALID_ARG,
                   "ARGMAX", "I32");
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args), .op = MMRT_OP_MUL, .n_src = 2,
        .src = { &x->t[OCL].t, &x->t[OCL].t }, .dst = &y48->t[OCL].t,
    };
    expect_refusal(H[OCL].plugin->ops[MMRT_OP_ADD](H[OCL].dev, &args), MMRT_ERR_INVALID_ARG,
                   "ADD", "MUL");
    args.op = MMRT_OP_ADD;
    args.hdr.struct_size = 8;
    expect_refusal(H[OCL].plugin->ops[MMRT_OP_ADD](H[OCL].dev, &args), MMRT_ERR_INVALID_ARG,
                   "ADD", "ABI");
    op_release_all();
}

/* A program that does not build: every op fails with MMRT_ERR_DEVICE and the compiler's log
 * (which names the .cl file), the failure is remembered, and memory still works. The build is
 * broken through MMRT_OPENCL_BUILD_OPTIONS on a second device handle (the build is per
 * device and happens at the first op). */
static void test_build_failure(void **state)
{
    (void)state;
    need_device();
    struct harness h2;
    setenv("MMRT_OPENCL_BUILD_OPTIONS", "-Dk_copy=+", 1);
    assert_int_equal(harness_open(&h2, harness_plugin_path("opencl"), NULL, 0), MMRT_OK);
    struct harness_tensor t;
    assert_int_equal(harness_tensor_new(&h2, MMRT_DTYPE_F32, SHAPE(4), &t), MMRT_OK);
    float v[4] = { 1, 2, 3, 4 }, back[4];
    assert_int_equal(harness_upload(&h2, &t, v), MMRT_OK);
    struct harness_tensor *src[1] = { &t };
    struct mmrt_scale_params p = { 2.0f };
    for (int attempt = 0; attempt < 2; attempt++) {
        assert_int_equal(harness_run(&h2, MMRT_OP_SCALE, src, 1, &t, &p, sizeof p),
                         MMRT_ERR_DEVICE);
        const char *msg = h2.plugin->last_error(h2.dev);
        if (!strstr(msg, "clBuildProgram") || !strstr(msg, "build log") || !strstr(msg, "copy.cl"))
            fail_msg("attempt %d: message lacks the build log: %s", attempt, msg);
    }
    unsetenv("MMRT_OPENCL_BUILD_OPTIONS");
    assert_int_equal(harness_download(&h2, &t, back), MMRT_OK);
    assert_memory_equal(back, v, sizeof v);
    harness_tensor_free(&h2, &t);
    harness_close(&h2);
}

/* Every op of this header is in the table, and empty tensors are no-ops. */
static void test_plugin_table(void **state)
{
    (void)state;
    need_device();
    const struct mmrt_plugin *p = H[OCL].plugin;
    assert_int_equal(p->n_ops, MMRT_OP_COUNT);
    for (int op = 0; op < MMRT_OP_COUNT; op++)
        if (!p->ops[op])
            fail_msg("op %s missing from the OpenCL op table", mmrt_op_name_of(op));
    struct op_pair *e = op_pair_new(MMRT_DTYPE_F32, SHAPE(0, 5)), *src[1] = { e };
    struct mmrt_scale_params sp = { 2.0f };
    assert_int_equal(op_pair_run_on(OCL, MMRT_OP_SCALE, src, 1, e, &sp, sizeof sp), MMRT_OK);
    assert_int_equal(op_pair_run_on(OCL, MMRT_OP_SOFTMAX, src, 1, e, &sp, sizeof sp), MMRT_OK);
    assert_int_equal(p->synchronize(H[OCL].dev), MMRT_OK);
    op_release_all();
}

/* ---- setup ---------------------------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    mmrt_status st = harness_open(&H[OCL], harness_plugin_path("opencl"), NULL, 0);
    if (st == MMRT_ERR_NO_DEVICE) {
        snprintf(g_why, sizeof g_why, "%s", H[OCL].why);
        printf("SKIPPED: no OpenCL device (%s)\n", g_why);
        return 0;
    }
    if (st != MMRT_OK)
        return -1;
    g_have_ocl = true;
    if (harness_open(&H[CPU], harness_plugin_path("cpu"), NULL, 0) != MMRT_OK)
        return -1;
    op_pair_init(&H[OCL], &H[CPU], "OpenCL");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (g_have_ocl) {
        printf("\n%-15s %6s %11s %12s %12s\n", "op", "cases", "tolerance", "worst vs ref",
               "worst vs CPU");
        for (int op = 0; op < MMRT_OP_COUNT; op++) {
            if (!g_cases[op])
                continue;
            if (g_tol[op] < 0)
                printf("%-15s %6d %11s %12s %12s\n", mmrt_op_name_of(op), g_cases[op], "exact", "0",
                       "0");
            else
                printf("%-15s %6d %11.1e %12.2e %12.2e\n", mmrt_op_name_of(op), g_cases[op],
                       g_tol[op], g_worst_ref[op], g_worst_cpu[op]);
        }
    }
    op_release_all();
    harness_close(&H[CPU]);
    harness_close(&H[OCL]);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin_table),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_i8),
        cmocka_unit_test(test_matmul_u4),
        cmocka_unit_test(test_add_mul),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_multi),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_random),
        cmocka_unit_test(test_attention_empty_rows),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_packed),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_set_rows),
        cmocka_unit_test(test_gather_heads),
        cmocka_unit_test(test_l2_norm),
        cmocka_unit_test(test_gather_l2_refusals),
        cmocka_unit_test(test_kv_i8_set_rows),
        cmocka_unit_test(test_kv_i8_widening),
        cmocka_unit_test(test_kv_i8_refusals),
        cmocka_unit_test(test_patch_embed),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_copy_conversions),
        cmocka_unit_test(test_copy_strided),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_get_rows_async_error),
        cmocka_unit_test(test_attention_async_error),
        cmocka_unit_test(test_attention_paged_async_error),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_build_failure),
    };
    const char *filter = getenv("MMRT_TEST_FILTER"); /* e.g. "test_matmul*", as test_cuda_ops */
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    int failures = cmocka_run_group_tests(tests, group_setup, group_teardown);
    return failures == 0 && !g_have_ocl ? SKIP_CODE : failures;
}
