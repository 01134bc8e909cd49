/*
 * tests/test_cuda_ops.c — every operator of libmmrt_cuda.so against the CPU reference plugin
 * (a second harness instance) and the double-precision reference of ref_ops.c, over the
 * shapes that matter on a GPU: tile boundaries (1, 63, 64, 65, 127, 128, 129 …), head dims
 * 64 / 80 / 128 / 256 and odd ones, packed sequences of different lengths, causal Lq < Lk,
 * split-KV decode, every weight dtype, both GEMM precisions; plus the device-side checks
 * (GET_ROWS ids, cu_seqlens) and CUDA graph capture.
 *
 * Every case uploads the same bytes to both devices, runs the op on both, and requires
 *   |gpu − ref| ≤ tol · max|ref|                     (tol stated per op below), and
 *   |gpu − cpu| ≤ (tol + cpu_tol) · max|ref|         (cpu_tol: test_cpu_ops' tolerance),
 * naming the CPU plugin when it is the one off the reference. Exact ops (COPY, CONCAT,
 * GET_ROWS, ARGMAX) compare bytes. A table "op, cases, worst error vs ref, worst vs CPU,
 * tolerance" is printed at the end (tools/gpu-check.sh collects it).
 *
 * Tolerances, relative to the largest reference magnitude:
 *   1e-6  elementwise, SCALE, activations, ROPE (one or two roundings per element)
 *   1e-5  norms, GEMV (M ≤ 8), F32-weight GEMMs: f32 sums, only the order differs
 *   3e-5  F16/BF16 GEMMs on tensor cores (gemm_precision=high): the activations are carried
 *         as hi + lo to 2^-17 (bf16) / 2^-22 (f16), but the tensor cores' f32 accumulation
 *         does not round to nearest at every step; over K ≈ 4096 that costs ~1e-5
 *   2e-5  ATTENTION: online softmax rescales the partial sums once per 32–64 keys and the
 *         split-KV merge adds one more rounding, against the CPU's one-pass softmax;
 *         ATTENTION_PAGED the same without the split, and bit for bit the same for a sequence
 *         alone as in its batch
 *   1e-3 / 8e-3  F16 / BF16 GEMMs with gemm_precision=fast: one rounding of the activations
 *         (2^-11 / 2^-8 relative) per product, averaging out over K to ~3e-4 / 2.5e-3 of the
 *         largest output, with a margin
 *   I8 weights (MATMUL with scales, op_case_matmul_i8), against the dequantized weights:
 *         1e-5 for M ≤ 32 (the I8 GEMV: f32 sums of x · code, then one rounded multiply by
 *         the scale; rows bit-identical alone), 3e-5 above (the codes widen to f16 exactly
 *         and take the F16 tensor-core route, so the F16 GEMM bound applies), 1e-3 with
 *         gemm_precision=fast (the F16 fast bound)
 *   exact GATHER_HEADS (op_case_gather_heads): plugin.h fixes its f32 operations (sum in g
 *         order with __fadd_rn, one __fdiv_rn), so the GPU must give the CPU's bits
 *   1e-6  L2_NORM (op_case_l2_norm), per row: the squares are exact in double and summed
 *         there, so only the final rounding to f32 is left
 *   U4 weights (op_case_matmul_u4), against the dequantized weights: 1e-5 for M ≤ 32 (the U4
 *         GEMV: f32 sums of x · (code − zero) per 32-code block, scaled once per block), 3e-4
 *         above: the dequantized weights are rounded to f16 (2^-12 relative each, row by row
 *         after a power-of-two normalisation), which over K averages to ~1e-4 of the largest
 *         output, on top of the F16 route's 3e-5
 *
 * Without a CUDA device the test prints "SKIPPED: no CUDA device (…)" and exits 77.
 * MMRT_TEST_CUDA_PLUGIN=cpu runs the whole file with the CPU plugin as the device under test,
 * which checks the test itself on a machine without a GPU (with graph = 1, so the graph tests
 * run too).
 * MMRT_TEST_FILTER selects tests by cmocka pattern; MMRT_TEST_QUICK=1 drops the largest cases;
 * MMRT_TEST_VERBOSE=1 prints every case's errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_cases.h"
#include "plugin_harness.h"
#include "ref_ops.h"

#define SKIP_CODE 77

static struct harness G;    /* the device under test (CUDA) */
static struct harness C;    /* the CPU reference plugin */
static bool g_have_dut;
static const char *g_dut = "cuda";
static bool g_dut_is_cpu; /* the CPU plugin stands in (MMRT_TEST_CUDA_PLUGIN=cpu) */
/* MMRT_TEST_QUICK=1 drops the largest cases (for slow runs such as compute-sanitizer). */
static bool g_quick;

/* ---- statistics for the closing table -------------------------------------------------- */

struct op_stat {
    char name[24];
    int cases;
    double err_ref, err_cpu, tol;
};
static struct op_stat g_stats[48];
static int g_n_stats;

static void stat_add(const char *name, double err_ref, double err_cpu, double tol)
{
    struct op_stat *s = NULL;
    for (int i = 0; i < g_n_stats && !s; i++)
        if (strcmp(g_stats[i].name, name) == 0)
            s = &g_stats[i];
    if (!s) {
        if (g_n_stats == (int)(sizeof g_stats / sizeof g_stats[0]))
            return;
        s = &g_stats[g_n_stats++];
        snprintf(s->name, sizeof s->name, "%s", name);
    }
    s->cases++;
    s->err_ref = fmax(s->err_ref, err_ref);
    s->err_cpu = fmax(s->err_cpu, err_cpu);
    s->tol = fmax(s->tol, tol);
}

/* ---- comparison ----------------------------------------------------------------------- */

/* max |a − ref|, its index, and whether NaNs disagree. */
static double max_err(const float *a, const double *ref, int64_t n, int64_t *worst, bool *nan_bad)
{
    double e = 0;
    *worst = 0;
    *nan_bad = false;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(a[i])) {
            if (isnan(ref[i]) != isnan(a[i]) && !*nan_bad) {
                *nan_bad = true;
                *worst = i;
            }
            continue;
        }
        double d = fabs((double)a[i] - ref[i]);
        if (d > e) {
            e = d;
            if (!*nan_bad)
                *worst = i;
        }
    }
    return e;
}

/* The three-way check described at the top. floor: the smallest "largest magnitude" (so that
 * a case whose outputs are all tiny is judged on a unit scale, not on cancellation noise). */
static void check3(const char *op, const char *what, const float *g, const float *c,
                   const double *ref, int64_t n, double tol, double cpu_tol, double floor)
{
    double mr = floor;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(ref[i]) && fabs(ref[i]) > mr)
            mr = fabs(ref[i]);
    if (mr == 0)
        mr = 1;
    int64_t wg, wc;
    bool ng, nc;
    double eg = max_err(g, ref, n, &wg, &ng) / mr, ec = max_err(c, ref, n, &wc, &nc) / mr;
    double *cd = op_alloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        cd[i] = c[i];
    int64_t wgc;
    bool ngc;
    double egc = max_err(g, cd, n, &wgc, &ngc) / mr;
    stat_add(op, eg, egc, tol);
    if (getenv("MMRT_TEST_VERBOSE"))
        printf("  %s: err vs ref %.3g, vs cpu %.3g (tol %.1g)\n", what, eg, egc, tol);
    if (ng)
        fail_msg("%s: %s element %lld is %g, reference %g (NaN mismatch)", what, g_dut,
                 (long long)wg, (double)g[wg], ref[wg]);
    if (eg > tol)
        fail_msg("%s: %s off the reference by %.3g of max |ref| %.4g (tolerance %.1g); worst "
                 "element %lld: got %.9g, want %.9g, cpu %.9g", what, g_dut, eg, mr, tol,
                 (long long)wg, (double)g[wg], ref[wg], (double)c[wg]);
    if (egc > tol + cpu_tol || (ngc && !ng && !nc))
        fail_msg("%s: %s and the CPU plugin differ by %.3g (allowed %.1g) at element %lld "
                 "(%.9g vs %.9g); the CPU plugin is off the reference by %.3g%s", what, g_dut,
                 egc, tol + cpu_tol, (long long)wgc, (double)g[wgc], (double)c[wgc], ec,
                 ec > cpu_tol || nc ? " — beyond its own tolerance: a CPU plugin bug?" : "");
}

/* Byte-exact comparison of both devices' output with the expected bytes. */
static void check_bytes(const char *op, const char *what, const void *g, const void *c,
                        const void *want, size_t nbytes)
{
    const uint8_t *pg = g, *pc = c, *pw = want;
    stat_add(op, memcmp(g, want, nbytes) != 0, memcmp(g, c, nbytes) != 0, 0);
    for (size_t i = 0; i < nbytes; i++)
        if (pg[i] != pw[i])
            fail_msg("%s: %s byte %zu is 0x%02x, want 0x%02x (cpu 0x%02x)", what, g_dut, i, pg[i],
                     pw[i], pc[i]);
    for (size_t i = 0; i < nbytes; i++)
        if (pc[i] != pw[i])
            fail_msg("%s: the CPU plugin's byte %zu is 0x%02x, want 0x%02x (%s matches the "
                     "expectation: a CPU plugin bug?)", what, i, pc[i], pw[i], g_dut);
}

/* check3 and check_bytes for the cases op_cases.c runs (cpu_tol: the op's CPU tolerance,
 * which for those is the GPU's own). */
static void check_close_op(enum mmrt_op op, const char *what, const float *g, const float *c,
                           const double *ref, int64_t n, double tol)
{
    check3(mmrt_op_name_of(op), what, g, c, ref, n, tol, tol, 0);
}

static void check_bytes_op(enum mmrt_op op, const char *what, const void *g, const void *c,
                           const void *want, size_t nbytes)
{
    check_bytes(mmrt_op_name_of(op), what, g, c, want, nbytes);
}

/* big: set in main, false under MMRT_TEST_QUICK. */
static struct op_checks g_checks = { check_close_op, check_bytes_op, true, true, true };

static void need_dut(void)
{
    if (!g_have_dut)
        skip();
}

/* ---- MATMUL, PATCH_EMBED -------------------------------------------------------------- */

/* The GPU tolerance of a GEMM: GEMV and F32 weights 1e-5, tensor cores 3e-5 (see top). */
static double gemm_tol(int64_t M, enum mmrt_dtype wdt, bool gemv_possible, bool fast)
{
    if (wdt == MMRT_DTYPE_F32 || (gemv_possible && M <= 8))
        return 1e-5;
    if (fast)
        return wdt == MMRT_DTYPE_F16 ? 1e-3 : 8e-3;
    return 3e-5;
}

static void matmul_case(int64_t M, int64_t K, int64_t N, enum mmrt_dtype wdt, int bias_mode,
                        const char *op)
{
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
    void *g, *c;
    op_pair_download_both(ty, &g, &c);
    char what[128];
    snprintf(what, sizeof what, "MATMUL M=%lld K=%lld N=%lld W %s bias %d", (long long)M,
             (long long)K, (long long)N, mmrt_dtype_name_of(wdt), bias_mode);
    check3(op, what, g, c, ref, M * N, gemm_tol(M, wdt, true, false), 1e-5, 0);
}

static void test_matmul(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][3] = { /* M, K, N: GEMV (M ≤ 8) and cuBLAS tile edges */
        { 1, 1, 1 },      { 1, 64, 63 },    { 2, 65, 64 },    { 7, 127, 65 },  { 8, 128, 129 },
        { 9, 129, 128 },  { 63, 64, 65 },   { 64, 256, 64 },  { 65, 255, 127 }, { 127, 1000, 33 },
        { 128, 4099, 3 }, { 129, 64, 513 }, { 300, 96, 200 }, { 2, 0, 3 },     { 0, 5, 3 },
        { 1, 4096, 1024 }, { 5, 3, 7 },
    };
    op_rng_seed(1);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            matmul_case(cases[k][0], cases[k][1], cases[k][2], op_weight_dtypes[d],
                        (int)((k + (size_t)d) % 3), "MATMUL");
            op_release_all();
        }
    /* More rows than one scratch chunk (64 MiB / (K · 4 bytes) = 4096 rows at K = 4096). */
    if (!g_quick) {
        matmul_case(4500, 4096, 48, MMRT_DTYPE_BF16, 2, "MATMUL");
        op_release_all();
        matmul_case(4100, 4096, 16, MMRT_DTYPE_F16, 1, "MATMUL");
        op_release_all();
    }

    /* x with more than two dims: rows are everything but the last. */
    float *x, *w;
    struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(2, 3, 40));
    struct op_pair *tw = op_pair_rand(MMRT_DTYPE_BF16, -1, 1, &w, SHAPE(9, 40));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 3, 9));
    struct op_pair *src[2] = { tx, tw };
    op_pair_run(MMRT_OP_MATMUL, src, 2, ty, NULL, 0);
    double *ref = op_ref_buf(54);
    ref_matmul(x, w, NULL, 6, 40, 9, ref);
    void *g, *c;
    op_pair_download_both(ty, &g, &c);
    check3("MATMUL", "MATMUL x [2, 3, 40]", g, c, ref, 54, 1e-5, 1e-5, 0);
    op_release_all();
}

/* MATMUL with I8 weights: the I8 GEMV for M ≤ 32, the F16 route on widened codes above. */
static void test_matmul_i8(void **state)
{
    (void)state;
    need_dut();
    op_case_matmul_i8(&g_checks, 1e-5, 3e-5);
}

/* MATMUL with U4 weights: the U4 GEMV for M ≤ 32, f16-dequantized rows on the F16 route
 * above. */
static void test_matmul_u4(void **state)
{
    (void)state;
    need_dut();
    op_case_matmul_u4(&g_checks, 1e-5, 3e-4);
}

/* gemm_precision=fast on a second device instance: one rounding of the activations. */
static void test_matmul_fast(void **state)
{
    (void)state;
    need_dut();
    if (strcmp(g_dut, "cuda") != 0)
        skip(); /* an option of the CUDA plugin only */
    struct harness F;
    struct mmrt_option opt = { "gemm_precision", "fast" };
    assert_int_equal(harness_open(&F, harness_plugin_path("cuda"), &opt, 1), MMRT_OK);
    static const int64_t cases[][3] = { { 64, 256, 64 }, { 300, 1000, 200 }, { 129, 4096, 65 } };
    op_rng_seed(21);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 1; d < 3; d++) {
            int64_t M = cases[k][0], K = cases[k][1], N = cases[k][2];
            enum mmrt_dtype wdt = op_weight_dtypes[d];
            float *x = op_rand_f(M * K, -1, 1), *w = op_rand_f(N * K, -1, 1);
            op_round_to(wdt, w, N * K);
            struct harness_tensor tx, tw, ty;
            assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(M, K), &tx), MMRT_OK);
            assert_int_equal(harness_tensor_new(&F, wdt, SHAPE(N, K), &tw), MMRT_OK);
            assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(M, N), &ty), MMRT_OK);
            assert_int_equal(harness_upload(&F, &tx, x), MMRT_OK);
            assert_int_equal(harness_upload(&F, &tw, op_encode(wdt, w, N * K)), MMRT_OK);
            struct harness_tensor *src[2] = { &tx, &tw };
            assert_int_equal(harness_run(&F, MMRT_OP_MATMUL, src, 2, &ty, NULL, 0), MMRT_OK);
            float *got = op_alloc((size_t)(M * N) * 4);
            assert_int_equal(harness_download(&F, &ty, got), MMRT_OK);
            double *ref = op_ref_buf(M * N);
            ref_matmul(x, w, NULL, M, K, N, ref);
            /* The CPU has no fast mode: compare with the reference only (as gpu and cpu). */
            double *r2 = ref;
            float *rf = op_alloc((size_t)(M * N) * 4);
            for (int64_t i = 0; i < M * N; i++)
                rf[i] = (float)r2[i];
            char what[128];
            snprintf(what, sizeof what, "MATMUL fast M=%lld K=%lld N=%lld W %s", (long long)M,
                     (long long)K, (long long)N, mmrt_dtype_name_of(wdt));
            check3("MATMUL_FAST", what, got, rf, ref, M * N, gemm_tol(M, wdt, true, true), 1e-6,
                   0);
            harness_tensor_free(&F, &tx);
            harness_tensor_free(&F, &tw);
            harness_tensor_free(&F, &ty);
            op_release_all();
        }
    /* I8 weights on the fast route: codes exact in f16, activations rounded once. */
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t M = cases[k][0], K = cases[k][1], N = cases[k][2];
        float *x = op_rand_f(M * K, -1, 1);
        struct op_qmatrix qm;
        op_quantize_i8(N, K, 2.0f, &qm);
        struct harness_tensor tx, tw, ts, ty;
        assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(M, K), &tx), MMRT_OK);
        assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_I8, SHAPE(N, K), &tw), MMRT_OK);
        assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(N), &ts), MMRT_OK);
        assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(M, N), &ty), MMRT_OK);
        assert_int_equal(harness_upload(&F, &tx, x), MMRT_OK);
        assert_int_equal(harness_upload(&F, &tw, qm.q), MMRT_OK);
        assert_int_equal(harness_upload(&F, &ts, qm.scale), MMRT_OK);
        struct harness_tensor *src[4] = { &tx, &tw, NULL, &ts };
        assert_int_equal(harness_run(&F, MMRT_OP_MATMUL, src, 4, &ty, NULL, 0), MMRT_OK);
        float *got = op_alloc((size_t)(M * N) * 4);
        assert_int_equal(harness_download(&F, &ty, got), MMRT_OK);
        double *ref = op_ref_buf(M * N);
        ref_matmul(x, qm.deq, NULL, M, K, N, ref);
        float *rf = op_alloc((size_t)(M * N) * 4);
        for (int64_t i = 0; i < M * N; i++)
            rf[i] = (float)ref[i];
        char what[128];
        snprintf(what, sizeof what, "MATMUL fast M=%lld K=%lld N=%lld W I8", (long long)M,
                 (long long)K, (long long)N);
        check3("MATMUL_FAST", what, got, rf, ref, M * N, 1e-3, 1e-6, 0);
        harness_tensor_free(&F, &tx);
        harness_tensor_free(&F, &tw);
        harness_tensor_free(&F, &ts);
        harness_tensor_free(&F, &ty);
        op_release_all();
    }
    harness_close(&F);
}

static void test_patch_embed(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][6] = { /* B, C, H, W, P, O */
        { 1, 3, 336, 336, 14, 64 }, { 2, 3, 28, 28, 7, 32 }, { 1, 3, 30, 60, 30, 8 },
        { 1, 1, 4, 4, 1, 3 },       { 2, 2, 6, 6, 3, 1 },    { 1, 3, 224, 224, 32, 129 },
    };
    op_rng_seed(10);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            int64_t B = cases[k][0], Cc = cases[k][1], Hh = cases[k][2], W = cases[k][3];
            int64_t P = cases[k][4], O = cases[k][5], nP = (Hh / P) * (W / P);
            bool bias = (k + (size_t)d) % 2 == 0;
            float *img, *w, *b = NULL;
            struct op_pair *ti = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &img, SHAPE(B, Cc, Hh, W));
            struct op_pair *tw = op_pair_rand(op_weight_dtypes[d], -1, 1, &w, SHAPE(O, Cc, P, P));
            struct op_pair *tb =
                bias ? op_pair_rand(op_weight_dtypes[d], -1, 1, &b, SHAPE(O)) : NULL;
            struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(B, nP, O));
            struct op_pair *src[3] = { ti, tw, tb };
            struct mmrt_patch_params p = { (int32_t)P };
            op_pair_run(MMRT_OP_PATCH_EMBED, src, 3, ty, &p, sizeof p);
            double *ref = op_ref_buf(B * nP * O);
            ref_patch_embed(img, w, b, B, Cc, Hh, W, P, O, ref);
            void *g, *c;
            op_pair_download_both(ty, &g, &c);
            char what[128];
            snprintf(what, sizeof what, "PATCH_EMBED case %zu W %s bias %d", k,
                     mmrt_dtype_name_of(op_weight_dtypes[d]), bias);
            check3("PATCH_EMBED", what, g, c, ref, B * nP * O,
                   gemm_tol(B * nP, op_weight_dtypes[d], false, false), 1e-5, 0);
            op_release_all();
        }
}

/* ---- elementwise ---------------------------------------------------------------------- */

static void test_add_mul(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][2] = { { 1, 1 },   { 1, 63 },  { 1, 65 }, { 7, 64 },
                                        { 3, 1000 }, { 1, 1000003 }, { 129, 127 } };
    op_rng_seed(2);
    for (int op = MMRT_OP_ADD; op <= MMRT_OP_MUL; op++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (int mode = 0; mode < 6; mode++) {
                /* 0: same shape F32; 1: same shape F16; 2-4: broadcast row F32/F16/BF16;
                 * 5: same shape, in place. */
                int64_t R = cases[k][0], N = cases[k][1];
                bool bcast = mode >= 2 && mode <= 4;
                enum mmrt_dtype bdt = mode == 1 ? MMRT_DTYPE_F16
                                      : bcast   ? op_weight_dtypes[mode - 2]
                                                : MMRT_DTYPE_F32;
                float *a, *b;
                struct op_pair *ta = op_pair_rand(MMRT_DTYPE_F32, -4, 4, &a, SHAPE(R, N));
                struct op_pair *tb = bcast ? op_pair_rand(bdt, -4, 4, &b, SHAPE(N))
                                      : op_pair_rand(bdt, -4, 4, &b, SHAPE(R, N));
                struct op_pair *ty = mode == 5 ? ta : op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
                struct op_pair *src[2] = { ta, tb };
                op_pair_run(op, src, 2, ty, NULL, 0);
                double *ref = op_ref_buf(R * N);
                ref_binary(a, b, R * N, bcast ? N : R * N, op == MMRT_OP_MUL, ref);
                void *g, *c;
                op_pair_download_both(ty, &g, &c);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d",
                         op == MMRT_OP_ADD ? "ADD" : "MUL", (long long)R, (long long)N, mode);
                check3(op == MMRT_OP_ADD ? "ADD" : "MUL", what, g, c, ref, R * N, 1e-6, 1e-6, 0);
                op_release_all();
            }
}

static void test_scale_unary(void **state)
{
    (void)state;
    need_dut();
    static const int ops[] = { MMRT_OP_SCALE, MMRT_OP_GELU, MMRT_OP_GELU_TANH,
                               MMRT_OP_QUICK_GELU, MMRT_OP_SILU, MMRT_OP_RELU2, MMRT_OP_SWIGLU };
    static const char *const names[] = { "SCALE", "GELU", "GELU_TANH", "QUICK_GELU", "SILU",
                                         "RELU2", "SWIGLU" };
    static const float specials[] = { 0.0f, -0.0f, 1e-3f, -1e-3f, 20.0f, -20.0f, 50.0f,
                                      -50.0f, -100.0f, 3.0f, -3.0f };
    static const int64_t sizes[] = { 1, 255, 256, 257, 100003 };
    op_rng_seed(4);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int in_place = 0; in_place < 2; in_place++) {
                int64_t n = sizes[s];
                float *a = op_rand_f(n, -8, 8), *u = op_rand_f(n, -3, 3);
                if (n >= 16)
                    memcpy(a, specials, sizeof specials);
                struct op_pair *ta = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, n));
                op_pair_upload(ta, a);
                struct op_pair *tu = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, n));
                op_pair_upload(tu, u);
                struct op_pair *ty = in_place ? ta : op_pair_new(MMRT_DTYPE_F32, SHAPE(1, n));
                struct op_pair *src[2] = { ta, tu };
                struct mmrt_scale_params p = { -0.375f };
                bool swiglu = ops[o] == MMRT_OP_SWIGLU, scale = ops[o] == MMRT_OP_SCALE;
                op_pair_run(ops[o], src, swiglu ? 2 : 1, ty, scale ? &p : NULL,
                            scale ? sizeof p : 0);
                double *ref = op_ref_buf(n);
                if (scale)
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = (double)a[i] * p.scale;
                else if (swiglu)
                    ref_swiglu(a, u, n, ref);
                else
                    ref_unary(ops[o], a, n, ref);
                void *g, *c;
                op_pair_download_both(ty, &g, &c);
                char what[96];
                snprintf(what, sizeof what, "%s n %lld%s", names[o], (long long)n,
                         in_place ? " in place" : "");
                check3(names[o], what, g, c, ref, n, 1e-6, 1e-6, 1.0);
                op_release_all();
            }
}

/* ---- row ops -------------------------------------------------------------------------- */

static void test_norms(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][2] = { { 1, 1 },   { 3, 63 },   { 3, 64 },   { 3, 65 },
                                        { 2, 255 }, { 2, 256 },  { 2, 257 },  { 130, 1000 },
                                        { 4, 4096 }, { 3, 5120 } };
    op_rng_seed(6);
    for (int op = MMRT_OP_LAYERNORM; op <= MMRT_OP_RMSNORM; op++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (int mode = 0; mode < 5; mode++) {
                int64_t R = cases[k][0], N = cases[k][1];
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
                void *g, *c;
                op_pair_download_both(ty, &g, &c);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d", ln ? "LAYERNORM" : "RMSNORM",
                         (long long)R, (long long)N, mode);
                check3(ln ? "LAYERNORM" : "RMSNORM", what, g, c, ref, R * N, 1e-5, 1e-5, 0);
                op_release_all();
            }
}

static void test_softmax(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][2] = { { 1, 1 },   { 3, 31 },   { 3, 32 },   { 3, 33 },
                                        { 2, 255 }, { 2, 256 },  { 2, 257 },  { 5, 1024 },
                                        { 2, 32000 } };
    static const float scales[] = { 1.0f, 0.125f, 2.5f };
    op_rng_seed(7);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int mode = 0; mode < 4; mode++) {
            int64_t R = cases[k][0], N = cases[k][1];
            float lo = mode == 2 ? 95.0f : -10.0f, hi = mode == 2 ? 105.0f : 10.0f;
            float *x = op_rand_f(R * N, lo, hi);
            if (mode == 1 || mode == 3)
                for (int64_t i = 0; i < R * N; i++)
                    if (i % N != 0 && op_rng_int(0, 9) < 3)
                        x[i] = -INFINITY;
            struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
            op_pair_upload(tx, x);
            struct op_pair *ty = mode == 3 ? tx : op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
            struct mmrt_scale_params p = { scales[(k + (size_t)mode) % 3] };
            struct op_pair *src[1] = { tx };
            op_pair_run(MMRT_OP_SOFTMAX, src, 1, ty, &p, sizeof p);
            double *ref = op_ref_buf(R * N);
            ref_softmax(x, R, N, p.scale, ref);
            void *g, *c;
            op_pair_download_both(ty, &g, &c);
            double max_logit = 0;
            for (int64_t i = 0; i < R * N; i++)
                if (isfinite(x[i]) && fabs(x[i] * p.scale) > max_logit)
                    max_logit = fabs(x[i] * p.scale);
            double tol = 1e-6 + 1.2e-7 * max_logit; /* the f32 rounding of x·scale */
            char what[64];
            snprintf(what, sizeof what, "SOFTMAX [%lld, %lld] mode %d", (long long)R,
                     (long long)N, mode);
            check3("SOFTMAX", what, g, c, ref, R * N, tol, tol, 0);
            const float *gf = g;
            for (int64_t i = 0; i < R * N; i++)
                if (x[i] == -INFINITY && gf[i] != 0.0f)
                    fail_msg("%s: masked element %lld is %g, not exactly 0", what, (long long)i,
                             (double)gf[i]);
            op_release_all();
        }
    /* A row masked entirely: zeros. */
    float x[6] = { -INFINITY, -INFINITY, -INFINITY, 1, 2, 3 };
    struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 3));
    op_pair_upload(tx, x);
    struct op_pair *src[1] = { tx };
    struct mmrt_scale_params p = { 1.0f };
    op_pair_run(MMRT_OP_SOFTMAX, src, 1, tx, &p, sizeof p);
    void *g, *c;
    op_pair_download_both(tx, &g, &c);
    const float *gf = g;
    for (int i = 0; i < 3; i++)
        assert_true(gf[i] == 0.0f);
    assert_true(fabsf(gf[3] + gf[4] + gf[5] - 1.0f) < 1e-6f);
    op_release_all();
}

static void test_argmax(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][2] = { { 1, 1 }, { 3, 7 }, { 2, 1024 }, { 4, 32064 },
                                        { 1, 100003 }, { 300, 255 } };
    op_rng_seed(12);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t R = cases[k][0], N = cases[k][1];
        float *x = op_rand_f(R * N, -5, 5);
        for (int64_t r = 0; r < R; r++) {
            float *row = x + r * N;
            int kind = (int)(r % 5);
            if (kind == 1 && N > 3) { /* a tie: the first must win */
                row[N - 1] = 9.0f;
                row[N / 2] = 9.0f;
            } else if (kind == 2) {
                for (int64_t i = 0; i < N; i += 3)
                    row[i] = NAN;
            } else if (kind == 3) {
                for (int64_t i = 0; i < N; i++)
                    row[i] = NAN; /* all NaN: 0 */
            } else if (kind == 4) {
                for (int64_t i = 0; i < N; i++)
                    row[i] = -INFINITY;
                row[N - 1] = -1e30f;
            }
        }
        struct op_pair *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(R, N));
        op_pair_upload(tx, x);
        struct op_pair *ty = op_pair_new(MMRT_DTYPE_I32, SHAPE(R));
        struct op_pair *src[1] = { tx };
        op_pair_run(MMRT_OP_ARGMAX, src, 1, ty, NULL, 0);
        int32_t *want = op_alloc((size_t)R * 4);
        for (int64_t r = 0; r < R; r++)
            want[r] = ref_argmax(x + r * N, N);
        void *g, *c;
        op_pair_download_both(ty, &g, &c);
        char what[64];
        snprintf(what, sizeof what, "ARGMAX [%lld, %lld]", (long long)R, (long long)N);
        check_bytes("ARGMAX", what, g, c, want, (size_t)R * 4);
        op_release_all();
    }
}

/* ---- ROPE ----------------------------------------------------------------------------- */

static void test_rope(void **state)
{
    (void)state;
    need_dut();
    op_case_rope(&g_checks, 1e-6);
}

/* ---- ROPE_MULTI ----------------------------------------------------------------------- */

/* Qwen2-VL's decoder M-RoPE and vision 2-D rotary at model sizes, then the shared cases
 * (op_cases.h); tolerance as ROPE. */
static void test_rope_multi(void **state)
{
    (void)state;
    need_dut();
    op_case_rope_multi(&g_checks, 1e-6);
}

/* ---- ATTENTION ------------------------------------------------------------------------ */

enum kv_layout { KV_DENSE, KV_CACHE, KV_HEAD_MAJOR, KV_FUSED };

struct attn_case {
    int Hq, Hkv, D;
    int n_seq; /* 0: no cu_seqlens */
    int32_t lq[8], lk[8];
    int causal;
    enum mmrt_dtype k_dt, v_dt; /* KV_FUSED uses k_dt for both */
    enum kv_layout layout;
    float q_amp;
    int window; /* sliding window (causal only); 0 = none */
};

/* Places dense values [S, Hkv, D] into a new base tensor of the layout; returns the view.
 * Cells outside the view are NaN. */
static struct op_pair kv_place(enum kv_layout layout, enum mmrt_dtype dt, int64_t S, int64_t Hkv,
                          int64_t D, const float *dense)
{
    int64_t es = dt == MMRT_DTYPE_F32 ? 4 : 2, cap = S + 5, off = 3;
    const int64_t ne[3] = { S, Hkv, D };
    if (layout == KV_DENSE) {
        struct op_pair *t = op_pair_new(dt, SHAPE(S, Hkv, D));
        op_pair_upload(t, op_encode(dt, dense, S * Hkv * D));
        return *t;
    }
    float *buf = op_alloc((size_t)(cap * Hkv * D) * sizeof(float));
    for (int64_t i = 0; i < cap * Hkv * D; i++)
        buf[i] = NAN;
    if (layout == KV_CACHE) {
        memcpy(buf + off * Hkv * D, dense, (size_t)(S * Hkv * D) * sizeof(float));
        struct op_pair *t = op_pair_new(dt, SHAPE(cap, Hkv, D));
        op_pair_upload(t, op_encode(dt, buf, cap * Hkv * D));
        return op_pair_view(t, dt, 3, ne, (const int64_t[]){ Hkv * D * es, D * es, es },
                     (uint64_t)(off * Hkv * D * es));
    }
    for (int64_t s = 0; s < S; s++) /* KV_HEAD_MAJOR: [Hkv, cap, D] */
        for (int64_t g = 0; g < Hkv; g++)
            memcpy(buf + (g * cap + s) * D, dense + (s * Hkv + g) * D, (size_t)D * sizeof(float));
    struct op_pair *t = op_pair_new(dt, SHAPE(Hkv, cap, D));
    op_pair_upload(t, op_encode(dt, buf, cap * Hkv * D));
    return op_pair_view(t, dt, 3, ne, (const int64_t[]){ D * es, cap * D * es, es }, 0);
}

static void attention_case(const struct attn_case *ac, uint64_t seed, bool check, void **gout)
{
    int n_seq = ac->n_seq ? ac->n_seq : 1;
    int32_t cu_q[9] = { 0 }, cu_k[9] = { 0 };
    for (int s = 0; s < n_seq; s++) {
        cu_q[s + 1] = cu_q[s] + ac->lq[s];
        cu_k[s + 1] = cu_k[s] + ac->lk[s];
    }
    int64_t T = cu_q[n_seq], S = cu_k[n_seq], Hq = ac->Hq, Hkv = ac->Hkv, D = ac->D;
    op_rng_seed(seed);
    enum mmrt_dtype kdt = ac->k_dt, vdt = ac->layout == KV_FUSED ? ac->k_dt : ac->v_dt;
    float *k = op_rand_f(S * Hkv * D, -1, 1), *v = op_rand_f(S * Hkv * D, -1, 1);
    op_round_to(kdt, k, S * Hkv * D);
    op_round_to(vdt, v, S * Hkv * D);
    float *q;
    struct op_pair *tq = op_pair_rand(MMRT_DTYPE_F32, -ac->q_amp, ac->q_amp, &q, SHAPE(T, Hq, D));
    struct op_pair vk, vv;
    if (ac->layout == KV_FUSED) {
        int64_t es = kdt == MMRT_DTYPE_F32 ? 4 : 2;
        float *fused = op_alloc((size_t)(S * 2 * Hkv * D) * sizeof(float));
        for (int64_t s = 0; s < S; s++) {
            memcpy(fused + (s * 2 + 0) * Hkv * D, k + s * Hkv * D, (size_t)(Hkv * D) * 4);
            memcpy(fused + (s * 2 + 1) * Hkv * D, v + s * Hkv * D, (size_t)(Hkv * D) * 4);
        }
        struct op_pair *base = op_pair_new(kdt, SHAPE(S, 2, Hkv, D));
        op_pair_upload(base, op_encode(kdt, fused, S * 2 * Hkv * D));
        const int64_t nb[3] = { 2 * Hkv * D * es, D * es, es };
        vk = op_pair_view(base, kdt, SHAPE(S, Hkv, D), nb, 0);
        vv = op_pair_view(base, kdt, SHAPE(S, Hkv, D), nb, (uint64_t)(Hkv * D * es));
    } else {
        vk = kv_place(ac->layout, kdt, S, Hkv, D, k);
        vv = kv_place(ac->layout, vdt, S, Hkv, D, v);
    }
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, Hq, D));
    struct op_pair *tcq = ac->n_seq ? op_pair_i32(cu_q, n_seq + 1) : NULL;
    struct op_pair *tck = ac->n_seq ? op_pair_i32(cu_k, n_seq + 1) : NULL;
    float scale = 1.0f / sqrtf((float)D);
    struct mmrt_attention_params p = { scale, ac->causal, n_seq, ac->window };
    struct op_pair *src[5] = { tq, &vk, &vv, tcq, tck };
    op_pair_run(MMRT_OP_ATTENTION, src, ac->n_seq ? 5 : 3, ty, &p, sizeof p);
    void *g, *c;
    op_pair_download_both(ty, &g, &c);
    if (gout)
        *gout = g;
    if (!check)
        return;
    double *ref = op_ref_buf(T * Hq * D);
    ref_attention(q, k, v, T, S, Hq, Hkv, D, ac->n_seq ? cu_q : NULL, ac->n_seq ? cu_k : NULL,
                  n_seq, scale, ac->causal, ac->window, ref);
    char what[224];
    snprintf(what, sizeof what, "ATTENTION seed %llu (T %lld S %lld Hq %lld Hkv %lld D %lld n_seq "
             "%d causal %d window %d k %s v %s layout %d)", (unsigned long long)seed,
             (long long)T, (long long)S, (long long)Hq, (long long)Hkv, (long long)D, ac->n_seq,
             ac->causal, ac->window, mmrt_dtype_name_of(kdt), mmrt_dtype_name_of(vdt),
             (int)ac->layout);
    check3("ATTENTION", what, g, c, ref, T * Hq * D, 2e-5, 1e-5, 0);
}

#define F32 MMRT_DTYPE_F32
#define F16 MMRT_DTYPE_F16
static const struct attn_case attn_cases[] = {
    /* Hq Hkv D  n_seq lq                    lk                      causal k   v  layout q_amp window */
    { 4, 4, 64,  0, { 7 },                  { 7 },                   0, F32, F32, KV_DENSE, 1, 0 },
    { 8, 2, 80,  0, { 33 },                 { 33 },                  1, F16, F16, KV_DENSE, 1, 0 },
    { 4, 2, 128, 0, { 1 },                  { 37 },                  1, F16, F16, KV_CACHE, 1, 0 },
    { 4, 1, 64,  0, { 5 },                  { 20 },                  1, F32, F32, KV_HEAD_MAJOR, 1, 0 },
    { 2, 2, 256, 3, { 5, 1, 12 },           { 5, 1, 12 },            0, F32, F32, KV_FUSED, 1, 0 },
    { 6, 3, 8,   5, { 3, 1, 0, 4, 5 },      { 10, 1, 0, 4, 2 },      1, F16, F16, KV_CACHE, 1, 0 },
    { 2, 1, 64,  0, { 300 },                { 300 },                 1, F32, F32, KV_DENSE, 1, 0 },
    { 1, 1, 3,   0, { 4 },                  { 9 },                   0, F32, F32, KV_DENSE, 1, 0 },
    { 4, 2, 64,  0, { 9 },                  { 9 },                   1, F32, F32, KV_FUSED, 4, 0 },
    { 2, 1, 16,  0, { 2 },                  { 0 },                   0, F32, F32, KV_DENSE, 1, 0 },
    { 8, 2, 128, 0, { 16 },                 { 16 },                  1, F16, F16, KV_HEAD_MAJOR, 1, 0 },
    { 4, 4, 256, 2, { 3, 2 },               { 40, 7 },               1, F16, F16, KV_FUSED, 1, 0 },
    /* tile edges: 63/64/65 and 127/128/129 rows and keys, packed, every head dim */
    { 2, 2, 64,  7, { 1, 63, 64, 65, 127, 128, 129 }, { 1, 63, 64, 65, 127, 128, 129 }, 1, F32, F32, KV_DENSE, 1, 0 },
    { 4, 2, 80,  7, { 1, 63, 64, 65, 127, 128, 129 }, { 1, 63, 64, 65, 127, 128, 129 }, 0, F16, F16, KV_CACHE, 1, 0 },
    { 2, 1, 128, 4, { 63, 64, 65, 0 },      { 129, 64, 200, 3 },     1, F16, F32, KV_DENSE, 1, 0 },
    { 2, 2, 256, 3, { 65, 33, 1 },          { 65, 100, 257 },        1, F32, F16, KV_HEAD_MAJOR, 1, 0 },
    /* generic head dims */
    { 3, 1, 100, 2, { 17, 40 },             { 17, 40 },              1, F32, F32, KV_DENSE, 1, 0 },
    { 2, 2, 200, 1, { 70 },                 { 70 },                  0, F16, F16, KV_DENSE, 1, 0 },
    { 4, 4, 32,  0, { 129 },                { 129 },                 1, F32, F32, KV_DENSE, 1, 0 },
    /* GQA 8, chunked prefill (Lq < Lk), causal with Lq > Lk (empty rows) */
    { 32, 4, 128, 0, { 65 },                { 300 },                 1, F16, F16, KV_CACHE, 1, 0 },
    { 8, 1, 64,  2, { 40, 10 },             { 20, 10 },              1, F32, F32, KV_DENSE, 1, 0 },
    /* decode against long caches: split-KV on a GPU (few rows, many keys) */
    { 32, 8, 128, 4, { 1, 1, 1, 1 },        { 1000, 37, 513, 2048 }, 1, F16, F16, KV_CACHE, 1, 0 },
    { 32, 32, 128, 1, { 1 },                { 3000 },                1, F16, F16, KV_DENSE, 1, 0 },
    { 16, 16, 80, 2, { 1, 1 },              { 700, 1500 },           1, F32, F32, KV_HEAD_MAJOR, 1, 0 },
    { 8, 8, 256, 1, { 2 },                  { 1200 },                1, F32, F32, KV_DENSE, 1, 0 },
    /* vision-like: bidirectional, one long sequence; and a peaky softmax */
    { 16, 16, 64, 0, { 577 },               { 577 },                 0, F32, F32, KV_DENSE, 1, 0 },
    { 4, 2, 128, 0, { 200 },                { 200 },                 1, F32, F32, KV_FUSED, 6, 0 },
    /* sliding windows: decode mid-tile and split-KV with a window, prefill tiles with windows
     * shorter and longer than a tile, window 1, tile edges, GQA 8 */
    { 32, 8, 128, 4, { 1, 1, 1, 1 },        { 1000, 37, 513, 2048 }, 1, F16, F16, KV_CACHE, 1, 100 },
    { 32, 32, 128, 1, { 1 },                { 3000 },                1, F16, F16, KV_DENSE, 1, 4096 },
    { 2, 1, 64,  0, { 300 },                { 300 },                 1, F32, F32, KV_DENSE, 1, 20 },
    { 2, 2, 96,  0, { 129 },                { 200 },                 1, F16, F32, KV_HEAD_MAJOR, 1, 100 },
    { 2, 1, 16,  0, { 9 },                  { 9 },                   1, F32, F32, KV_FUSED, 1, 1 },
    { 2, 2, 64,  7, { 1, 63, 64, 65, 127, 128, 129 }, { 1, 63, 64, 65, 127, 128, 129 }, 1, F32, F32, KV_DENSE, 1, 64 },
    { 32, 4, 128, 0, { 65 },                { 300 },                 1, F16, F16, KV_CACHE, 1, 33 },
};
#undef F32
#undef F16

static void test_attention(void **state)
{
    (void)state;
    need_dut();
    for (size_t k = 0; k < sizeof attn_cases / sizeof attn_cases[0]; k++) {
        const struct attn_case *ac = &attn_cases[k];
        int64_t tq = 0, tk = 0;
        for (int s = 0; s < (ac->n_seq ? ac->n_seq : 1); s++) {
            tq += ac->lq[s];
            tk += ac->lk[s];
        }
        if (g_quick && tq * tk * ac->Hq * ac->D > 20000000)
            continue;
        attention_case(ac, 100 + k, true, NULL);
        op_release_all();
    }
}

/* Queries that see no key (causal, Lq > Lk) are exactly zero. */
static void test_attention_empty_rows(void **state)
{
    (void)state;
    need_dut();
    const struct attn_case *ac = &attn_cases[5]; /* sequence 4 has Lq 5, Lk 2 */
    void *gv;
    attention_case(ac, 7, false, &gv);
    const float *got = gv;
    int64_t t0 = 3 + 1 + 0 + 4;
    for (int64_t t = t0; t < t0 + 3; t++)
        for (int64_t i = 0; i < ac->Hq * ac->D; i++)
            assert_true(got[t * ac->Hq * ac->D + i] == 0.0f);
    op_release_all();
}

/* ---- GET_ROWS, COPY, CONCAT ------------------------------------------------------------ */

static void test_get_rows(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][3] = { { 1, 1, 1 }, { 10, 7, 5 }, { 1000, 64, 33 },
                                        { 32, 4096, 3 }, { 32064, 100, 7 } };
    op_rng_seed(9);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            int64_t V = cases[k][0], N = cases[k][1], T = cases[k][2];
            float *tab;
            struct op_pair *tt = op_pair_rand(op_weight_dtypes[d], -3, 3, &tab, SHAPE(V, N));
            int32_t *ids = op_alloc((size_t)T * 4);
            for (int64_t t = 0; t < T; t++)
                ids[t] = op_rng_int(0, (int)V - 1);
            ids[0] = (int32_t)V - 1;
            struct op_pair *ti = op_pair_i32(ids, T);
            struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, N));
            struct op_pair *src[2] = { tt, ti };
            op_pair_run(MMRT_OP_GET_ROWS, src, 2, ty, NULL, 0);
            float *want = op_alloc((size_t)(T * N) * 4);
            for (int64_t t = 0; t < T; t++)
                memcpy(want + t * N, tab + ids[t] * N, (size_t)N * 4);
            void *g, *c;
            op_pair_download_both(ty, &g, &c);
            char what[64];
            snprintf(what, sizeof what, "GET_ROWS V %lld N %lld %s", (long long)V, (long long)N,
                     mmrt_dtype_name_of(op_weight_dtypes[d]));
            check_bytes("GET_ROWS", what, g, c, want, (size_t)(T * N) * 4);
            op_release_all();
        }
}

/* ---- SET_ROWS: exact ------------------------------------------------------------------- */

/* The shared cases (op_cases.h), with a prefill-sized scatter unless MMRT_TEST_QUICK. */
static void test_set_rows(void **state)
{
    (void)state;
    need_dut();
    op_case_set_rows(&g_checks);
}

/* ---- GATHER_HEADS: exact; L2_NORM: 1e-6 per row ----------------------------------------- */

/* The shared cases (op_cases.h): every table dtype, G = 1 / 2 / 4 / 9, ragged groups, entries
 * ≥ R skipped, a 48×48 image pooled 2×2 unless MMRT_TEST_QUICK; then a new idx upload. */
static void test_gather_heads(void **state)
{
    (void)state;
    need_dut();
    op_case_gather_heads(&g_checks);
}

static void test_l2_norm(void **state)
{
    (void)state;
    need_dut();
    op_case_l2_norm(&g_checks, 1e-6);
}

/* The launches plugin.h rules out, refused with the CPU plugin's words. */
static void test_gather_l2_refusals(void **state)
{
    (void)state;
    need_dut();
    op_gather_l2_refusals(&G);
}

/* A status the device reports either at the launch or at the next synchronize (the GPU
 * checks device-memory values asynchronously). Returns that status; last_error in err. */
static mmrt_status launch_then_sync(struct harness *h, enum mmrt_op op,
                                    struct harness_tensor *const *src, int n_src,
                                    struct harness_tensor *dst, const void *params,
                                    uint32_t size, char *err, size_t err_size)
{
    mmrt_status st = harness_run(h, op, src, n_src, dst, params, size);
    if (st == MMRT_OK)
        st = h->plugin->synchronize(h->dev);
    snprintf(err, err_size, "%s", h->plugin->last_error(h->dev));
    return st;
}

static void test_device_checks(void **state)
{
    (void)state;
    need_dut();
    char err[600];
    /* GET_ROWS with an id outside the table. */
    float *tab;
    struct op_pair *tt = op_pair_rand(MMRT_DTYPE_F16, -1, 1, &tab, SHAPE(10, 8));
    int32_t ids[3] = { 2, 10, 3 };
    struct op_pair *ti = op_pair_i32(ids, 3);
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(3, 8));
    struct harness_tensor *src[2] = { &tt->t[OP_DUT], &ti->t[OP_DUT] };
    assert_int_equal(launch_then_sync(&G, MMRT_OP_GET_ROWS, src, 2, &ty->t[OP_DUT], NULL, 0, err,
                                      sizeof err),
                     MMRT_ERR_INVALID_ARG);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "GET_ROWS"));
    assert_non_null(strstr(err, "10"));
    /* The error is reported once; the device keeps working. */
    assert_int_equal(G.plugin->synchronize(G.dev), MMRT_OK);
    int32_t good[3] = { 2, 9, 3 };
    assert_int_equal(harness_upload(&G, &ti->t[OP_DUT], good), MMRT_OK);
    assert_int_equal(harness_run(&G, MMRT_OP_GET_ROWS, src, 2, &ty->t[OP_DUT], NULL, 0), MMRT_OK);
    float got[24];
    assert_int_equal(harness_download(&G, &ty->t[OP_DUT], got), MMRT_OK);
    assert_memory_equal(got + 8, tab + 9 * 8, 8 * sizeof(float));

    /* ATTENTION with cu_seqlens_k that does not end at S. */
    float *q, *k;
    struct op_pair *tq = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &q, SHAPE(4, 2, 64));
    struct op_pair *tk = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &k, SHAPE(6, 1, 64));
    struct op_pair *to = op_pair_new(MMRT_DTYPE_F32, SHAPE(4, 2, 64));
    int32_t cq[3] = { 0, 2, 4 }, ck[3] = { 0, 3, 5 }; /* S = 6 */
    struct op_pair *tcq = op_pair_i32(cq, 3), *tck = op_pair_i32(ck, 3);
    struct mmrt_attention_params p = { 0.125f, 1, 2, 0 };
    struct harness_tensor *asrc[5] = { &tq->t[OP_DUT], &tk->t[OP_DUT], &tk->t[OP_DUT],
                                       &tcq->t[OP_DUT], &tck->t[OP_DUT] };
    assert_int_equal(launch_then_sync(&G, MMRT_OP_ATTENTION, asrc, 5, &to->t[OP_DUT], &p, sizeof p,
                                      err, sizeof err),
                     MMRT_ERR_INVALID_ARG);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "cu_seqlens_k"));
    assert_int_equal(G.plugin->synchronize(G.dev), MMRT_OK);
    op_release_all();
}

/* ---- ATTENTION_PAGED ------------------------------------------------------------------ */

static void test_attention_paged(void **state)
{
    (void)state;
    need_dut();
    op_case_attention_paged(&g_checks, 2e-5);
}

/* A page id outside the pool, a kv_len beyond the table or negative, cu_seqlens_q that do not
 * run from 0 to T: reported by the launch or the next synchronize with the entry named,
 * reported once, dst untouched. */
static void test_attention_paged_device_checks(void **state)
{
    (void)state;
    need_dut();
    struct op_paged_bad_run r;
    op_paged_bad_setup(&G, &r);
    char err[600];
    for (size_t b = 0; b < op_n_paged_bad; b++) {
        op_paged_bad_set(&G, &r, b);
        assert_int_equal(launch_then_sync(&G, MMRT_OP_ATTENTION_PAGED, r.src, 6, r.y, &r.p,
                                          sizeof r.p, err, sizeof err),
                         MMRT_ERR_INVALID_ARG);
        printf("refused as expected: %s\n", err);
        if (!strstr(err, "ATTENTION_PAGED") || !strstr(err, op_paged_bad[b].needle))
            fail_msg("message \"%s\" should name ATTENTION_PAGED and \"%s\"", err,
                     op_paged_bad[b].needle);
        assert_int_equal(G.plugin->synchronize(G.dev), MMRT_OK);
        op_paged_bad_untouched(&G, &r);
    }
    op_release_all();
}

static void test_copy(void **state)
{
    (void)state;
    need_dut();
    static const enum mmrt_dtype dts[4] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                            MMRT_DTYPE_I32 };
    static const float specials[] = { NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 65504.0f,
                                      65519.0f, 65520.0f, -1e6f, 6e-8f, 3e-8f, 1e-40f, 1.0009765625f,
                                      3.0e38f };
    op_rng_seed(13);
    /* Layouts over a [3, 5, 7, 9] index space: 0 contiguous → contiguous; 1 dst transposed
     * (dims 1 and 3); 2 src a padded view (KV-cache write); 3 both permuted. */
    const int64_t ne[4] = { 3, 5, 7, 9 };
    int64_t n = 3 * 5 * 7 * 9;
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 4; di++)
            for (int layout = 0; layout < 4; layout++) {
                enum mmrt_dtype sdt = dts[si], ddt = dts[di];
                if ((sdt == MMRT_DTYPE_I32) != (ddt == MMRT_DTYPE_I32))
                    continue;
                int64_t ses = (int64_t)mmrt_dtype_size(sdt), des = (int64_t)mmrt_dtype_size(ddt);
                float *vals = op_rand_f(n * 2, -70000, 70000);
                memcpy(vals, specials, sizeof specials);
                /* Source base: [3, 5, 7, 9 (+3 pad)] for layout 2, else dense. */
                int64_t pad = layout == 2 ? 3 : 0;
                int64_t sne[4] = { 3, 5, 7, 9 + pad };
                struct op_pair *sb = op_pair_new(sdt, 4, sne);
                int64_t sn = 3 * 5 * 7 * (9 + pad);
                op_pair_upload(sb, sdt == MMRT_DTYPE_I32 ? (void *)vals : op_encode(sdt, vals, sn));
                int64_t snb[4] = { 5 * 7 * (9 + pad) * ses, 7 * (9 + pad) * ses, (9 + pad) * ses,
                                   ses };
                if (layout == 3) { /* src seen as the transpose of a [3, 9, 7, 5] buffer */
                    snb[0] = 9 * 7 * 5 * ses;
                    snb[1] = ses;
                    snb[2] = 5 * ses;
                    snb[3] = 7 * 5 * ses;
                }
                struct op_pair sv = op_pair_view(sb, sdt, 4, ne, snb, 0);
                struct op_pair *db = op_pair_new(ddt, SHAPE(n));
                int64_t dnb[4] = { 5 * 7 * 9 * des, 7 * 9 * des, 9 * des, des };
                if (layout == 1 || layout == 3) { /* dst is [3, 9, 7, 5] */
                    dnb[0] = 9 * 7 * 5 * des;
                    dnb[1] = des;
                    dnb[2] = 5 * des;
                    dnb[3] = 7 * 5 * des;
                }
                struct op_pair dv = op_pair_view(db, ddt, 4, ne, dnb, 0);
                struct op_pair *src[1] = { &sv };
                op_pair_run(MMRT_OP_COPY, src, 1, &dv, NULL, 0);
                /* Expected bytes through the harness conversions (round to nearest even). */
                uint8_t *sbytes = op_alloc((size_t)(sn * ses));
                assert_int_equal(harness_download(&C, &sb->t[OP_CPU], sbytes), MMRT_OK);
                uint8_t *want = op_alloc((size_t)(n * des));
                int64_t i[4];
                for (i[0] = 0; i[0] < 3; i[0]++)
                    for (i[1] = 0; i[1] < 5; i[1]++)
                        for (i[2] = 0; i[2] < 7; i[2]++)
                            for (i[3] = 0; i[3] < 9; i[3]++) {
                                int64_t so = 0, dof = 0;
                                for (int d = 0; d < 4; d++) {
                                    so += i[d] * snb[d];
                                    dof += i[d] * dnb[d];
                                }
                                const uint8_t *sp = sbytes + so;
                                uint8_t *dp = want + dof;
                                if (sdt == ddt) {
                                    memcpy(dp, sp, (size_t)ses);
                                    continue;
                                }
                                float f;
                                uint16_t h;
                                if (sdt == MMRT_DTYPE_F32) {
                                    memcpy(&f, sp, 4);
                                } else {
                                    memcpy(&h, sp, 2);
                                    f = sdt == MMRT_DTYPE_F16 ? mmrt_f16_to_f32(h)
                                                              : mmrt_bf16_to_f32(h);
                                }
                                if (ddt == MMRT_DTYPE_F32) {
                                    memcpy(dp, &f, 4);
                                } else {
                                    h = ddt == MMRT_DTYPE_F16 ? mmrt_f32_to_f16(f)
                                                              : mmrt_f32_to_bf16(f);
                                    memcpy(dp, &h, 2);
                                }
                            }
                void *g, *c;
                op_pair_download_both(db, &g, &c);
                char what[80];
                snprintf(what, sizeof what, "COPY %s → %s layout %d", mmrt_dtype_name_of(sdt),
                         mmrt_dtype_name_of(ddt), layout);
                check_bytes("COPY", what, g, c, want, (size_t)(n * des));
                op_release_all();
            }

    /* In place F16 ↔ BF16 on the same bytes. */
    float *v;
    struct op_pair *t = op_pair_rand(MMRT_DTYPE_F16, -100, 100, &v, SHAPE(4, 33));
    struct op_pair as_bf16 =
        op_pair_view(t, MMRT_DTYPE_BF16, SHAPE(4, 33), (const int64_t[]){ 66, 2 }, 0);
    struct op_pair *src[1] = { t };
    op_pair_run(MMRT_OP_COPY, src, 1, &as_bf16, NULL, 0);
    uint16_t want[132];
    for (int j = 0; j < 132; j++)
        want[j] = mmrt_f32_to_bf16(v[j]);
    void *g, *c;
    op_pair_download_both(t, &g, &c);
    check_bytes("COPY", "COPY F16 → BF16 in place", g, c, want, sizeof want);
    op_release_all();
}

static int64_t idx4(const int64_t *ne, const int64_t *i)
{
    return ((i[0] * ne[1] + i[1]) * ne[2] + i[2]) * ne[3] + i[3];
}

static void test_concat(void **state)
{
    (void)state;
    need_dut();
    static const int64_t shapes[][4] = { { 5, 1, 1, 1 }, { 3, 4, 1, 1 }, { 2, 3, 5, 1 },
                                         { 2, 3, 2, 7 }, { 64, 65, 1, 1 } };
    static const int ranks[] = { 1, 2, 3, 4, 2 };
    static const enum mmrt_dtype dts[] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                           MMRT_DTYPE_I32 };
    op_rng_seed(11);
    for (int r = 0; r < 5; r++)
        for (int axis = 0; axis < ranks[r]; axis++)
            for (int d = 0; d < 4; d++) {
                int nd = ranks[r];
                enum mmrt_dtype dt = dts[d];
                int64_t es = (int64_t)mmrt_dtype_size(dt);
                int64_t na[4], nb_[4], ny[4];
                for (int i = 0; i < 4; i++)
                    na[i] = nb_[i] = ny[i] = shapes[r][i];
                nb_[axis] = shapes[r][axis] + 2;
                ny[axis] = na[axis] + nb_[axis];
                int64_t n_a = na[0] * na[1] * na[2] * na[3],
                        n_b = nb_[0] * nb_[1] * nb_[2] * nb_[3];
                uint8_t *ha = op_alloc((size_t)(n_a * es)), *hb = op_alloc((size_t)(n_b * es));
                for (int64_t i = 0; i < n_a * es; i++)
                    ha[i] = (uint8_t)op_rng_u64();
                for (int64_t i = 0; i < n_b * es; i++)
                    hb[i] = (uint8_t)op_rng_u64();
                struct op_pair *ta = op_pair_new(dt, nd, na);
                op_pair_upload(ta, ha);
                /* src1 a view with padded innermost rows. */
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
                op_pair_run(MMRT_OP_CONCAT, src, 2, ty, &p, sizeof p);
                int64_t e4[4], a4[4], b4[4], pad = 4 - nd;
                for (int i = 0; i < 4; i++) {
                    e4[i] = i < pad ? 1 : ny[i - pad];
                    a4[i] = i < pad ? 1 : na[i - pad];
                    b4[i] = i < pad ? 1 : nb_[i - pad];
                }
                int ax4 = axis + (int)pad;
                uint8_t *want = op_alloc((size_t)(e4[0] * e4[1] * e4[2] * e4[3] * es));
                int64_t i[4];
                for (i[0] = 0; i[0] < e4[0]; i[0]++)
                    for (i[1] = 0; i[1] < e4[1]; i[1]++)
                        for (i[2] = 0; i[2] < e4[2]; i[2]++)
                            for (i[3] = 0; i[3] < e4[3]; i[3]++) {
                                int64_t j[4] = { i[0], i[1], i[2], i[3] };
                                const uint8_t *w;
                                if (i[ax4] < a4[ax4]) {
                                    w = ha + idx4(a4, j) * es;
                                } else {
                                    j[ax4] -= a4[ax4];
                                    w = hb + idx4(b4, j) * es;
                                }
                                memcpy(want + idx4(e4, i) * es, w, (size_t)es);
                            }
                void *g, *c;
                op_pair_download_both(ty, &g, &c);
                char what[64];
                snprintf(what, sizeof what, "CONCAT rank %d axis %d %s", nd, axis,
                         mmrt_dtype_name_of(dt));
                check_bytes("CONCAT", what, g, c, want, (size_t)ty->t[OP_DUT].nbytes);
                op_release_all();
            }
}

/* ---- graph capture -------------------------------------------------------------------- */

/* One decode-like step on the device under test: y = W · attention(rope(q, pos), k, v) + b,
 * then argmax. pos and cu_seqlens_k live in device memory, so a graph replays any step. */
struct step {
    struct harness_tensor *q, *pos, *qr, *k, *v, *cq, *ck, *att, attx, *w, *b, *y, *am;
};

static struct harness_tensor *gnew(enum mmrt_dtype dt, int n_dims, const int64_t *ne)
{
    struct harness_tensor *t = op_alloc(sizeof *t);
    assert_int_equal(harness_tensor_new(&G, dt, n_dims, ne, t), MMRT_OK);
    return t;
}

static mmrt_status step_ops(struct step *s, const float *b_host)
{
    mmrt_status st;
    if (b_host && (st = harness_upload(&G, s->b, b_host)) != MMRT_OK)
        return st;
    struct mmrt_rope_params rp = { 10000.0f, 64, MMRT_ROPE_NEOX };
    struct harness_tensor *r[2] = { s->q, s->pos };
    if ((st = harness_run(&G, MMRT_OP_ROPE, r, 2, s->qr, &rp, sizeof rp)) != MMRT_OK)
        return st;
    struct mmrt_attention_params ap = { 0.125f, 1, 2, 0 };
    struct harness_tensor *a[5] = { s->qr, s->k, s->v, s->cq, s->ck };
    if ((st = harness_run(&G, MMRT_OP_ATTENTION, a, 5, s->att, &ap, sizeof ap)) != MMRT_OK)
        return st;
    struct harness_tensor *m[3] = { &s->attx, s->w, s->b };
    if ((st = harness_run(&G, MMRT_OP_MATMUL, m, 3, s->y, NULL, 0)) != MMRT_OK)
        return st;
    struct harness_tensor *x[1] = { s->y };
    return harness_run(&G, MMRT_OP_ARGMAX, x, 1, s->am, NULL, 0);
}

static void test_graph_capture(void **state)
{
    (void)state;
    need_dut();
    const struct mmrt_plugin *pl = G.plugin;
    if (pl->hdr.struct_size < offsetof(struct mmrt_plugin, graph_destroy) + sizeof(void *) ||
        !pl->capture_begin)
        skip(); /* the CPU plugin as device under test has no graphs */
    enum { H = 4, HKV = 2, D = 64, CAP = 96, N = 48 };
    op_rng_seed(31);
    struct step s;
    memset(&s, 0, sizeof s);
    s.q = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D));
    s.pos = gnew(MMRT_DTYPE_I32, SHAPE(1));
    s.qr = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D));
    s.k = gnew(MMRT_DTYPE_F16, SHAPE(CAP, HKV, D));
    s.v = gnew(MMRT_DTYPE_F16, SHAPE(CAP, HKV, D));
    s.cq = gnew(MMRT_DTYPE_I32, SHAPE(3));
    s.ck = gnew(MMRT_DTYPE_I32, SHAPE(3));
    s.att = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D));
    s.attx = *s.att; /* the same bytes seen as x [1, H·D] */
    s.attx.t.n_dims = 2;
    s.attx.t.ne[0] = 1;
    s.attx.t.ne[1] = H * D;
    s.attx.t.nb[0] = H * D * 4;
    s.attx.t.nb[1] = 4;
    s.w = gnew(MMRT_DTYPE_BF16, SHAPE(N, H * D));
    s.b = gnew(MMRT_DTYPE_F32, SHAPE(N));
    s.y = gnew(MMRT_DTYPE_F32, SHAPE(1, N));
    s.am = gnew(MMRT_DTYPE_I32, SHAPE(1));
    float *q = op_rand_f(H * D, -1, 1), *kv = op_rand_f(2 * CAP * HKV * D, -1, 1);
    float *w = op_rand_f(N * H * D, -0.1f, 0.1f), *b = op_rand_f(N, -1, 1);
    assert_int_equal(harness_upload(&G, s.q, q), MMRT_OK);
    assert_int_equal(harness_upload(&G, s.k, op_encode(MMRT_DTYPE_F16, kv, CAP * HKV * D)),
                     MMRT_OK);
    assert_int_equal(harness_upload(&G, s.v, op_encode(MMRT_DTYPE_F16, kv + CAP * HKV * D,
                                                    CAP * HKV * D)), MMRT_OK);
    assert_int_equal(harness_upload(&G, s.w, op_encode(MMRT_DTYPE_BF16, w, N * H * D)), MMRT_OK);
    /* Sequence 0 is the real one (1 query, L keys); sequence 1 takes the rest of the cache
     * with no queries, so that cu_seqlens_k always ends at the cache size. */
    int32_t cq[3] = { 0, 1, 1 };
    assert_int_equal(harness_upload(&G, s.cq, cq), MMRT_OK);
    enum { STEPS = 5 };
    const int32_t L[STEPS] = { 5, 37, 96, 1, 64 }, P[STEPS] = { 4, 36, 95, 0, 63 };
    float eager_y[STEPS][N];
    int32_t eager_am[STEPS];

    /* Eager runs. */
    for (int i = 0; i < STEPS; i++) {
        int32_t ck[3] = { 0, L[i], CAP };
        assert_int_equal(harness_upload(&G, s.pos, &P[i]), MMRT_OK);
        assert_int_equal(harness_upload(&G, s.ck, ck), MMRT_OK);
        assert_int_equal(step_ops(&s, b), MMRT_OK);
        assert_int_equal(harness_download(&G, s.y, eager_y[i]), MMRT_OK);
        assert_int_equal(harness_download(&G, s.am, &eager_am[i]), MMRT_OK);
    }

    /* Capture once (the bias upload inside the capture is a constant of the graph), then
     * spoil the host copy of b: replays must still use the captured bytes. */
    float *b_copy = op_alloc(N * sizeof(float));
    memcpy(b_copy, b, N * sizeof(float));
    void *graph = NULL;
    assert_int_equal(pl->capture_begin(G.dev), MMRT_OK);
    assert_int_equal(step_ops(&s, b_copy), MMRT_OK);
    mmrt_status st = pl->capture_end(G.dev, &graph);
    if (st != MMRT_OK)
        fail_msg("capture_end: %s", pl->last_error(G.dev));
    assert_non_null(graph);
    for (int i = 0; i < N; i++)
        b_copy[i] = 1e6f;
    for (int rep = 0; rep < 2; rep++)
        for (int i = STEPS - 1; i >= 0; i--) { /* another order than the eager runs */
            int32_t ck[3] = { 0, L[i], CAP };
            float y[N];
            int32_t am;
            assert_int_equal(harness_upload(&G, s.pos, &P[i]), MMRT_OK);
            assert_int_equal(harness_upload(&G, s.ck, ck), MMRT_OK);
            assert_int_equal(pl->graph_launch(G.dev, graph), MMRT_OK);
            assert_int_equal(harness_download(&G, s.y, y), MMRT_OK);
            assert_int_equal(harness_download(&G, s.am, &am), MMRT_OK);
            if (memcmp(y, eager_y[i], sizeof y) != 0 || am != eager_am[i])
                fail_msg("graph replay of step %d (L %d, pos %d) differs from the eager run "
                         "(argmax %d vs %d, y[0] %.9g vs %.9g)", i, L[i], P[i], am, eager_am[i],
                         (double)y[0], (double)eager_y[i][0]);
        }
    stat_add("GRAPH", 0, 0, 0);
    pl->graph_destroy(G.dev, graph);
    assert_int_equal(G.plugin->synchronize(G.dev), MMRT_OK);

    /* A failing op inside a capture: capture_end fails, nothing is recorded, eager works.
     * (The CUDA plugin checks a launch's shapes while recording; the CPU plugin standing in
     * for it checks them when the graph runs, so this part is CUDA's own.) */
    graph = NULL;
    if (!g_dut_is_cpu) {
        assert_int_equal(pl->capture_begin(G.dev), MMRT_OK);
        struct harness_tensor *bad[2] = { s.y, s.w }; /* x [1, 48] against W [48, 256] */
        assert_int_equal(harness_run(&G, MMRT_OP_MATMUL, bad, 2, s.y, NULL, 0),
                         MMRT_ERR_INVALID_ARG);
        assert_int_not_equal(pl->capture_end(G.dev, &graph), MMRT_OK);
        printf("capture refused as expected: %s\n", pl->last_error(G.dev));
        assert_null(graph);
    }
    assert_int_equal(step_ops(&s, b), MMRT_OK);
    float y[N];
    assert_int_equal(harness_download(&G, s.y, y), MMRT_OK);
    assert_memory_equal(y, eager_y[0], sizeof y); /* pos and cu_seqlens_k are step 0's */

    /* Waiting inside a capture is refused and spoils the capture. */
    assert_int_equal(pl->capture_begin(G.dev), MMRT_OK);
    assert_int_equal(pl->synchronize(G.dev), MMRT_ERR_INVALID_ARG);
    assert_int_equal(harness_download(&G, s.y, y), MMRT_ERR_INVALID_ARG);
    assert_int_not_equal(pl->capture_end(G.dev, &graph), MMRT_OK);
    assert_int_equal(pl->synchronize(G.dev), MMRT_OK);

    /* arena_free during a capture is deferred, and the capture still succeeds. */
    struct harness_tensor extra;
    assert_int_equal(harness_tensor_new(&G, MMRT_DTYPE_F32, SHAPE(1000), &extra), MMRT_OK);
    assert_int_equal(pl->capture_begin(G.dev), MMRT_OK);
    harness_tensor_free(&G, &extra);
    assert_int_equal(step_ops(&s, NULL), MMRT_OK);
    assert_int_equal(pl->capture_end(G.dev, &graph), MMRT_OK);
    assert_int_equal(pl->graph_launch(G.dev, graph), MMRT_OK);
    pl->graph_destroy(G.dev, graph);
    assert_int_equal(pl->synchronize(G.dev), MMRT_OK);

    struct harness_tensor *all[] = { s.q, s.pos, s.qr, s.k, s.v, s.cq, s.ck, s.att, s.w, s.b,
                                     s.y, s.am };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        harness_tensor_free(&G, all[i]);
    op_release_all();
}

/* A Qwen2-VL decode step captured once and replayed: M-RoPE on q and k with positions [1, 3]
 * in device memory, SET_ROWS of k and v into F16 caches at a slot in device memory, then
 * attention over the first L cache rows. Before every run (eager or replay) the caches are
 * reset to the same contents and the step's positions, slot and cu_seqlens_k are uploaded;
 * each replay must equal its eager run bit for bit, caches included. */
enum { MS_H = 4, MS_HKV = 2, MS_D = 64, MS_CAP = 40, MS_STEPS = 4 };

struct mstep {
    struct harness_tensor *q, *kn, *vn, *qr, *kr, *pos, *slot, *kc, *vc, *cq, *ck, *att;
    const void *k0, *v0; /* the caches' contents before every step */
};

static const int32_t ms_pos[MS_STEPS][3] = { { 7, 7, 7 }, { 30, 12, 19 }, { 1000, 3, 40 },
                                             { 0, 0, 0 } };
static const int32_t ms_len[MS_STEPS] = { 8, 21, 40, 1 };

static void mstep_reset(struct mstep *m, int i)
{
    int32_t s = ms_len[i] - 1, ck[3] = { 0, ms_len[i], MS_CAP };
    assert_int_equal(harness_upload(&G, m->kc, m->k0), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->vc, m->v0), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->pos, ms_pos[i]), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->slot, &s), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->ck, ck), MMRT_OK);
}

static void mstep_ops(struct mstep *m)
{
    struct mmrt_rope_multi_params rp = { 1e6f, MS_D, MS_D, 0, 3, { 8, 12, 12 } };
    /* The whole cache as two packed sequences (plugin.h: cu_seqlens end at the key count):
     * the query's keys [0, len), then the unused rest with no query (the old decode step). */
    struct mmrt_attention_params ap = { 0.125f, 1, 2, 0 };
    struct harness_tensor *r1[2] = { m->q, m->pos }, *r2[2] = { m->kn, m->pos };
    struct harness_tensor *s1[2] = { m->kr, m->slot }, *s2[2] = { m->vn, m->slot };
    struct harness_tensor *a[5] = { m->qr, m->kc, m->vc, m->cq, m->ck };
    assert_int_equal(harness_run(&G, MMRT_OP_ROPE_MULTI, r1, 2, m->qr, &rp, sizeof rp), MMRT_OK);
    assert_int_equal(harness_run(&G, MMRT_OP_ROPE_MULTI, r2, 2, m->kr, &rp, sizeof rp), MMRT_OK);
    assert_int_equal(harness_run(&G, MMRT_OP_SET_ROWS, s1, 2, m->kc, NULL, 0), MMRT_OK);
    assert_int_equal(harness_run(&G, MMRT_OP_SET_ROWS, s2, 2, m->vc, NULL, 0), MMRT_OK);
    assert_int_equal(harness_run(&G, MMRT_OP_ATTENTION, a, 5, m->att, &ap, sizeof ap), MMRT_OK);
}

static void test_graph_capture_mrope(void **state)
{
    (void)state;
    need_dut();
    const struct mmrt_plugin *pl = G.plugin;
    if (pl->hdr.struct_size < offsetof(struct mmrt_plugin, graph_destroy) + sizeof(void *) ||
        !pl->capture_begin)
        skip();
    enum { H = MS_H, HKV = MS_HKV, D = MS_D, CAP = MS_CAP, STEPS = MS_STEPS };
    op_rng_seed(32);
    struct mstep m = {
        .q = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D)), .kn = gnew(MMRT_DTYPE_F32, SHAPE(1, HKV, D)),
        .vn = gnew(MMRT_DTYPE_F32, SHAPE(1, HKV, D)), .qr = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D)),
        .kr = gnew(MMRT_DTYPE_F32, SHAPE(1, HKV, D)), .pos = gnew(MMRT_DTYPE_I32, SHAPE(1, 3)),
        .slot = gnew(MMRT_DTYPE_I32, SHAPE(1)), .kc = gnew(MMRT_DTYPE_F16, SHAPE(CAP, HKV, D)),
        .vc = gnew(MMRT_DTYPE_F16, SHAPE(CAP, HKV, D)), .cq = gnew(MMRT_DTYPE_I32, SHAPE(3)),
        .ck = gnew(MMRT_DTYPE_I32, SHAPE(3)), .att = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D)),
        .k0 = op_encode(MMRT_DTYPE_F16, op_rand_f(CAP * HKV * D, -1, 1), CAP * HKV * D),
        .v0 = op_encode(MMRT_DTYPE_F16, op_rand_f(CAP * HKV * D, -1, 1), CAP * HKV * D),
    };
    assert_int_equal(harness_upload(&G, m.q, op_rand_f(H * D, -1, 1)), MMRT_OK);
    assert_int_equal(harness_upload(&G, m.kn, op_rand_f(HKV * D, -1, 1)), MMRT_OK);
    assert_int_equal(harness_upload(&G, m.vn, op_rand_f(HKV * D, -1, 1)), MMRT_OK);
    int32_t cq[3] = { 0, 1, 1 };
    assert_int_equal(harness_upload(&G, m.cq, cq), MMRT_OK);
    size_t cache_bytes = (size_t)CAP * HKV * D * 2;
    float (*eager)[H * D] = op_alloc(sizeof(float[STEPS][H * D]));
    char *eager_kc = op_alloc(cache_bytes * STEPS), *got_kc = op_alloc(cache_bytes);

    for (int i = 0; i < STEPS; i++) {
        mstep_reset(&m, i);
        mstep_ops(&m);
        assert_int_equal(harness_download(&G, m.att, eager[i]), MMRT_OK);
        assert_int_equal(harness_download(&G, m.kc, eager_kc + cache_bytes * i), MMRT_OK);
        /* The slot row, and only it, changed. */
        for (int r = 0; r < CAP; r++) {
            size_t row = (size_t)HKV * D * 2;
            bool changed = memcmp(eager_kc + cache_bytes * i + r * row,
                                  (const char *)m.k0 + r * row, row) != 0;
            if (changed != (r == ms_len[i] - 1))
                fail_msg("eager step %d: cache row %d %s", i, r,
                         changed ? "changed" : "was not written");
        }
    }

    mstep_reset(&m, 0);
    void *graph = NULL;
    assert_int_equal(pl->capture_begin(G.dev), MMRT_OK);
    mstep_ops(&m);
    mmrt_status st = pl->capture_end(G.dev, &graph);
    if (st != MMRT_OK)
        fail_msg("capture_end: %s", pl->last_error(G.dev));
    for (int rep = 0; rep < 2; rep++)
        for (int i = STEPS - 1; i >= 0; i--) {
            float got[H * D];
            mstep_reset(&m, i);
            assert_int_equal(pl->graph_launch(G.dev, graph), MMRT_OK);
            assert_int_equal(harness_download(&G, m.att, got), MMRT_OK);
            assert_int_equal(harness_download(&G, m.kc, got_kc), MMRT_OK);
            if (memcmp(got, eager[i], sizeof got) != 0 ||
                memcmp(got_kc, eager_kc + cache_bytes * i, cache_bytes) != 0)
                fail_msg("graph replay of M-RoPE step %d (slot %d, pos %d/%d/%d) differs from "
                         "the eager run", i, ms_len[i] - 1, ms_pos[i][0], ms_pos[i][1],
                         ms_pos[i][2]);
        }
    pl->graph_destroy(G.dev, graph);
    stat_add("GRAPH_MROPE", 0, 0, 0);
    assert_int_equal(pl->synchronize(G.dev), MMRT_OK);
    struct harness_tensor *all[] = { m.q, m.kn, m.vn, m.qr, m.kr, m.pos, m.slot, m.kc, m.vc,
                                     m.cq, m.ck, m.att };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        harness_tensor_free(&G, all[i]);
    op_release_all();
}

/* A paged attention step as a graph: the index tensors are read at every replay. */
static void test_graph_capture_paged(void **state)
{
    (void)state;
    need_dut();
    const struct mmrt_plugin *pl = G.plugin;
    if (pl->hdr.struct_size < offsetof(struct mmrt_plugin, graph_destroy) + sizeof(void *) ||
        !pl->capture_begin)
        skip();
    op_paged_graph_replay(&G);
}

/* ---- setup and main ------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    const char *dut = getenv("MMRT_TEST_CUDA_PLUGIN");
    if (dut && *dut)
        g_dut = dut;
    op_rng_stream(7); /* the values this file has always drawn */
    /* The CPU plugin standing in for CUDA records graphs too when asked, so the graph tests
     * run (and are checked) without a GPU. */
    static const struct mmrt_option cpu_graph = { "graph", "1" };
    g_dut_is_cpu = strcmp(g_dut, "cpu") == 0;
    mmrt_status st = harness_open(&G, harness_plugin_path(g_dut),
                                  g_dut_is_cpu ? &cpu_graph : NULL, g_dut_is_cpu ? 1 : 0);
    if (st == MMRT_ERR_NO_DEVICE) {
        printf("SKIPPED: %s\n", G.why[0] ? G.why : "no device");
        return 0;
    }
    if (st != MMRT_OK)
        return -1;
    if (harness_open(&C, harness_plugin_path("cpu"), NULL, 0) != MMRT_OK) {
        harness_close(&G);
        return -1;
    }
    g_have_dut = true;
    op_pair_init(&G, &C, g_dut);
    struct mmrt_device_info info = { .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_device_info) };
    if (G.plugin->device_info(G.dev, &info) == MMRT_OK)
        printf("device under test: %s (plugin %s)\n", info.name, g_dut);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    op_release_all();
    if (g_have_dut) {
        harness_close(&G);
        harness_close(&C);
    }
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_matmul_i8),
        cmocka_unit_test(test_matmul_u4),
        cmocka_unit_test(test_matmul_fast),
        cmocka_unit_test(test_patch_embed),  cmocka_unit_test(test_add_mul),
        cmocka_unit_test(test_scale_unary),  cmocka_unit_test(test_norms),
        cmocka_unit_test(test_softmax),      cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_rope),         cmocka_unit_test(test_rope_multi),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_empty_rows), cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_paged_device_checks),
        cmocka_unit_test(test_graph_capture_paged),
        cmocka_unit_test(test_set_rows),
        cmocka_unit_test(test_gather_heads), cmocka_unit_test(test_l2_norm),
        cmocka_unit_test(test_gather_l2_refusals),
        cmocka_unit_test(test_device_checks), cmocka_unit_test(test_copy),
        cmocka_unit_test(test_concat),       cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_graph_capture_mrope),
    };
    const char *filter = getenv("MMRT_TEST_FILTER"); /* e.g. "test_attention*" */
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const char *quick = getenv("MMRT_TEST_QUICK");
    g_quick = quick && *quick && strcmp(quick, "0") != 0;
    g_checks.big = !g_quick;
    int failures = cmocka_run_group_tests(tests, setup, teardown);
    if (g_n_stats > 0) {
        printf("\n%-15s %6s %12s %12s %10s\n", "op", "cases", "err_vs_ref", "err_vs_cpu", "tol");
        for (int i = 0; i < g_n_stats; i++)
            printf("OPSTAT %-15s %6d %12.3g %12.3g %10.1g\n", g_stats[i].name, g_stats[i].cases,
                   g_stats[i].err_ref, g_stats[i].err_cpu, g_stats[i].tol);
    }
    if (!g_have_dut && failures == 0)
        return SKIP_CODE;
    return failures;
}
