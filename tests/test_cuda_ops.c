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
 *         split-KV merge adds one more rounding, against the CPU's one-pass softmax
 *   1e-3 / 8e-3  F16 / BF16 GEMMs with gemm_precision=fast: one rounding of the activations
 *         (2^-11 / 2^-8 relative) per product, averaging out over K to ~3e-4 / 2.5e-3 of the
 *         largest output, with a margin
 *
 * Without a CUDA device the test prints "SKIPPED: no CUDA device (…)" and exits 77.
 * MMRT_TEST_CUDA_PLUGIN=cpu runs the whole file with the CPU plugin as the device under test,
 * which checks the test itself on a machine without a GPU (graph tests skip: no capture).
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

#include "plugin_harness.h"
#include "ref_ops.h"

#define SKIP_CODE 77

static struct harness G;    /* the device under test (CUDA) */
static struct harness C;    /* the CPU reference plugin */
static bool g_have_dut;
static const char *g_dut = "cuda";
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

/* ---- bookkeeping: every host buffer and tensor pair of a test is released together ----- */

/* One tensor on both devices, holding the same bytes. */
struct pt {
    struct harness_tensor g, c;
};

#define MAX_TRACKED 1024
static void *g_host[MAX_TRACKED];
static int g_n_host;
static struct pt *g_pts[MAX_TRACKED];
static int g_n_pts;

static void *talloc(size_t nbytes)
{
    assert_true(g_n_host < MAX_TRACKED);
    void *p = calloc(1, nbytes ? nbytes : 1);
    assert_non_null(p);
    g_host[g_n_host++] = p;
    return p;
}

static void release_all(void)
{
    for (int i = 0; i < g_n_host; i++)
        free(g_host[i]);
    for (int i = 0; i < g_n_pts; i++) {
        harness_tensor_free(&G, &g_pts[i]->g);
        harness_tensor_free(&C, &g_pts[i]->c);
        free(g_pts[i]);
    }
    g_n_host = g_n_pts = 0;
}

#define SHAPE(...)                                                                             \
    (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }

static struct pt *pnew(enum mmrt_dtype dt, int n_dims, const int64_t *ne)
{
    assert_true(g_n_pts < MAX_TRACKED);
    struct pt *p = calloc(1, sizeof *p);
    assert_non_null(p);
    assert_int_equal(harness_tensor_new(&G, dt, n_dims, ne, &p->g), MMRT_OK);
    assert_int_equal(harness_tensor_new(&C, dt, n_dims, ne, &p->c), MMRT_OK);
    g_pts[g_n_pts++] = p;
    return p;
}

/* A view into base's arenas (never freed on its own). */
static struct pt pview(const struct pt *base, enum mmrt_dtype dt, int n_dims, const int64_t *ne,
                       const int64_t *nb, uint64_t offset)
{
    struct pt v = *base;
    struct harness_tensor *t[2] = { &v.g, &v.c };
    for (int k = 0; k < 2; k++) {
        t[k]->t.dtype = dt;
        t[k]->t.n_dims = n_dims;
        t[k]->t.offset += offset;
        for (int i = 0; i < MMRT_MAX_DIMS; i++) {
            t[k]->t.ne[i] = i < n_dims ? ne[i] : 1;
            t[k]->t.nb[i] = i < n_dims ? nb[i] : t[k]->t.nb[i];
        }
    }
    return v;
}

static int64_t numel(const struct pt *p)
{
    int64_t n = 1;
    for (int i = 0; i < p->g.t.n_dims; i++)
        n *= p->g.t.ne[i];
    return n;
}

static void pupload(struct pt *p, const void *bytes)
{
    assert_int_equal(harness_upload(&G, &p->g, bytes), MMRT_OK);
    assert_int_equal(harness_upload(&C, &p->c, bytes), MMRT_OK);
}

static mmrt_status run_on(int cpu, enum mmrt_op op, struct pt *const *src, int n_src,
                          struct pt *dst, const void *params, uint32_t size)
{
    struct harness_tensor *s[MMRT_MAX_SRC] = { 0 };
    for (int i = 0; i < n_src; i++)
        s[i] = src[i] ? (cpu ? &src[i]->c : &src[i]->g) : NULL;
    return harness_run(cpu ? &C : &G, op, s, n_src, cpu ? &dst->c : &dst->g, params, size);
}

static void prun(enum mmrt_op op, struct pt *const *src, int n_src, struct pt *dst,
                 const void *params, uint32_t size)
{
    assert_int_equal(run_on(0, op, src, n_src, dst, params, size), MMRT_OK);
    assert_int_equal(run_on(1, op, src, n_src, dst, params, size), MMRT_OK);
}

/* Both results of a tensor (nbytes of the base tensor). */
static void pdown(struct pt *p, void **g, void **c)
{
    *g = talloc((size_t)p->g.nbytes);
    *c = talloc((size_t)p->c.nbytes);
    assert_int_equal(harness_download(&G, &p->g, *g), MMRT_OK);
    assert_int_equal(harness_download(&C, &p->c, *c), MMRT_OK);
}

/* ---- random values -------------------------------------------------------------------- */

static uint64_t g_rng;

static void rng_seed(uint64_t seed)
{
    g_rng = seed * 0x9E3779B97F4A7C15ull + 7;
}

static uint64_t rng_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_f(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng_u64() >> 11) / 9007199254740992.0);
}

static int rng_int(int lo, int hi)
{
    return lo + (int)(rng_u64() % (uint64_t)(hi - lo + 1));
}

static float *rand_f(int64_t n, float lo, float hi)
{
    float *v = talloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = rng_f(lo, hi);
    return v;
}

static void round_to(enum mmrt_dtype dt, float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == MMRT_DTYPE_F16)
            v[i] = harness_f16_to_f32(harness_f32_to_f16(v[i]));
        else if (dt == MMRT_DTYPE_BF16)
            v[i] = harness_bf16_to_f32(harness_f32_to_bf16(v[i]));
    }
}

static void *encode(enum mmrt_dtype dt, const float *v, int64_t n)
{
    if (dt == MMRT_DTYPE_F32 || dt == MMRT_DTYPE_I32) {
        void *p = talloc((size_t)n * 4);
        memcpy(p, v, (size_t)n * 4);
        return p;
    }
    uint16_t *h = talloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == MMRT_DTYPE_F16 ? harness_f32_to_f16(v[i]) : harness_f32_to_bf16(v[i]);
    return h;
}

/* A new tensor pair of random values in [lo, hi), rounded to dt; *host gets the values. */
static struct pt *prand(enum mmrt_dtype dt, float lo, float hi, float **host, int n_dims,
                        const int64_t *ne)
{
    struct pt *p = pnew(dt, n_dims, ne);
    int64_t n = numel(p);
    float *v = rand_f(n, lo, hi);
    round_to(dt, v, n);
    pupload(p, encode(dt, v, n));
    *host = v;
    return p;
}

static struct pt *pi32(const int32_t *v, int64_t n)
{
    struct pt *p = pnew(MMRT_DTYPE_I32, SHAPE(n));
    pupload(p, v);
    return p;
}

static double *ref_buf(int64_t n)
{
    return talloc((size_t)(n ? n : 1) * sizeof(double));
}

static const char *dt_name(int dt)
{
    static const char *const names[] = { "F32", "F16", "BF16", "I32" };
    return names[dt];
}

static const enum mmrt_dtype weight_dtypes[3] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16,
                                                   MMRT_DTYPE_BF16 };

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
    double *cd = talloc((size_t)(n ? n : 1) * sizeof(double));
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
    struct pt *tx = prand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
    struct pt *tw = prand(wdt, -1, 1, &w, SHAPE(N, K));
    struct pt *tb = NULL;
    if (bias_mode)
        tb = prand(bias_mode == 1 ? wdt : MMRT_DTYPE_F32, -1, 1, &b, SHAPE(N));
    struct pt *ty = pnew(MMRT_DTYPE_F32, SHAPE(M, N));
    struct pt *src[3] = { tx, tw, tb };
    prun(MMRT_OP_MATMUL, src, tb ? 3 : 2, ty, NULL, 0);
    double *ref = ref_buf(M * N);
    ref_matmul(x, w, b, M, K, N, ref);
    void *g, *c;
    pdown(ty, &g, &c);
    char what[128];
    snprintf(what, sizeof what, "MATMUL M=%lld K=%lld N=%lld W %s bias %d", (long long)M,
             (long long)K, (long long)N, dt_name(wdt), bias_mode);
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
    rng_seed(1);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            matmul_case(cases[k][0], cases[k][1], cases[k][2], weight_dtypes[d],
                        (int)((k + (size_t)d) % 3), "MATMUL");
            release_all();
        }
    /* More rows than one scratch chunk (64 MiB / (K · 4 bytes) = 4096 rows at K = 4096). */
    if (!g_quick) {
        matmul_case(4500, 4096, 48, MMRT_DTYPE_BF16, 2, "MATMUL");
        release_all();
        matmul_case(4100, 4096, 16, MMRT_DTYPE_F16, 1, "MATMUL");
        release_all();
    }

    /* x with more than two dims: rows are everything but the last. */
    float *x, *w;
    struct pt *tx = prand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(2, 3, 40));
    struct pt *tw = prand(MMRT_DTYPE_BF16, -1, 1, &w, SHAPE(9, 40));
    struct pt *ty = pnew(MMRT_DTYPE_F32, SHAPE(2, 3, 9));
    struct pt *src[2] = { tx, tw };
    prun(MMRT_OP_MATMUL, src, 2, ty, NULL, 0);
    double *ref = ref_buf(54);
    ref_matmul(x, w, NULL, 6, 40, 9, ref);
    void *g, *c;
    pdown(ty, &g, &c);
    check3("MATMUL", "MATMUL x [2, 3, 40]", g, c, ref, 54, 1e-5, 1e-5, 0);
    release_all();
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
    rng_seed(21);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 1; d < 3; d++) {
            int64_t M = cases[k][0], K = cases[k][1], N = cases[k][2];
            enum mmrt_dtype wdt = weight_dtypes[d];
            float *x = rand_f(M * K, -1, 1), *w = rand_f(N * K, -1, 1);
            round_to(wdt, w, N * K);
            struct harness_tensor tx, tw, ty;
            assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(M, K), &tx), MMRT_OK);
            assert_int_equal(harness_tensor_new(&F, wdt, SHAPE(N, K), &tw), MMRT_OK);
            assert_int_equal(harness_tensor_new(&F, MMRT_DTYPE_F32, SHAPE(M, N), &ty), MMRT_OK);
            assert_int_equal(harness_upload(&F, &tx, x), MMRT_OK);
            assert_int_equal(harness_upload(&F, &tw, encode(wdt, w, N * K)), MMRT_OK);
            struct harness_tensor *src[2] = { &tx, &tw };
            assert_int_equal(harness_run(&F, MMRT_OP_MATMUL, src, 2, &ty, NULL, 0), MMRT_OK);
            float *got = talloc((size_t)(M * N) * 4);
            assert_int_equal(harness_download(&F, &ty, got), MMRT_OK);
            double *ref = ref_buf(M * N);
            ref_matmul(x, w, NULL, M, K, N, ref);
            /* The CPU has no fast mode: compare with the reference only (as gpu and cpu). */
            double *r2 = ref;
            float *rf = talloc((size_t)(M * N) * 4);
            for (int64_t i = 0; i < M * N; i++)
                rf[i] = (float)r2[i];
            char what[128];
            snprintf(what, sizeof what, "MATMUL fast M=%lld K=%lld N=%lld W %s", (long long)M,
                     (long long)K, (long long)N, dt_name(wdt));
            check3("MATMUL_FAST", what, got, rf, ref, M * N, gemm_tol(M, wdt, true, true), 1e-6,
                   0);
            harness_tensor_free(&F, &tx);
            harness_tensor_free(&F, &tw);
            harness_tensor_free(&F, &ty);
            release_all();
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
    rng_seed(10);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            int64_t B = cases[k][0], Cc = cases[k][1], Hh = cases[k][2], W = cases[k][3];
            int64_t P = cases[k][4], O = cases[k][5], nP = (Hh / P) * (W / P);
            bool bias = (k + (size_t)d) % 2 == 0;
            float *img, *w, *b = NULL;
            struct pt *ti = prand(MMRT_DTYPE_F32, -1, 1, &img, SHAPE(B, Cc, Hh, W));
            struct pt *tw = prand(weight_dtypes[d], -1, 1, &w, SHAPE(O, Cc, P, P));
            struct pt *tb = bias ? prand(weight_dtypes[d], -1, 1, &b, SHAPE(O)) : NULL;
            struct pt *ty = pnew(MMRT_DTYPE_F32, SHAPE(B, nP, O));
            struct pt *src[3] = { ti, tw, tb };
            struct mmrt_patch_params p = { (int32_t)P };
            prun(MMRT_OP_PATCH_EMBED, src, 3, ty, &p, sizeof p);
            double *ref = ref_buf(B * nP * O);
            ref_patch_embed(img, w, b, B, Cc, Hh, W, P, O, ref);
            void *g, *c;
            pdown(ty, &g, &c);
            char what[128];
            snprintf(what, sizeof what, "PATCH_EMBED case %zu W %s bias %d", k,
                     dt_name(weight_dtypes[d]), bias);
            check3("PATCH_EMBED", what, g, c, ref, B * nP * O,
                   gemm_tol(B * nP, weight_dtypes[d], false, false), 1e-5, 0);
            release_all();
        }
}

/* ---- elementwise ---------------------------------------------------------------------- */

static void test_add_mul(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][2] = { { 1, 1 },   { 1, 63 },  { 1, 65 }, { 7, 64 },
                                        { 3, 1000 }, { 1, 1000003 }, { 129, 127 } };
    rng_seed(2);
    for (int op = MMRT_OP_ADD; op <= MMRT_OP_MUL; op++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (int mode = 0; mode < 6; mode++) {
                /* 0: same shape F32; 1: same shape F16; 2-4: broadcast row F32/F16/BF16;
                 * 5: same shape, in place. */
                int64_t R = cases[k][0], N = cases[k][1];
                bool bcast = mode >= 2 && mode <= 4;
                enum mmrt_dtype bdt = mode == 1 ? MMRT_DTYPE_F16
                                      : bcast   ? weight_dtypes[mode - 2]
                                                : MMRT_DTYPE_F32;
                float *a, *b;
                struct pt *ta = prand(MMRT_DTYPE_F32, -4, 4, &a, SHAPE(R, N));
                struct pt *tb = bcast ? prand(bdt, -4, 4, &b, SHAPE(N))
                                      : prand(bdt, -4, 4, &b, SHAPE(R, N));
                struct pt *ty = mode == 5 ? ta : pnew(MMRT_DTYPE_F32, SHAPE(R, N));
                struct pt *src[2] = { ta, tb };
                prun(op, src, 2, ty, NULL, 0);
                double *ref = ref_buf(R * N);
                ref_binary(a, b, R * N, bcast ? N : R * N, op == MMRT_OP_MUL, ref);
                void *g, *c;
                pdown(ty, &g, &c);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d",
                         op == MMRT_OP_ADD ? "ADD" : "MUL", (long long)R, (long long)N, mode);
                check3(op == MMRT_OP_ADD ? "ADD" : "MUL", what, g, c, ref, R * N, 1e-6, 1e-6, 0);
                release_all();
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
    rng_seed(4);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int in_place = 0; in_place < 2; in_place++) {
                int64_t n = sizes[s];
                float *a = rand_f(n, -8, 8), *u = rand_f(n, -3, 3);
                if (n >= 16)
                    memcpy(a, specials, sizeof specials);
                struct pt *ta = pnew(MMRT_DTYPE_F32, SHAPE(1, n));
                pupload(ta, a);
                struct pt *tu = pnew(MMRT_DTYPE_F32, SHAPE(1, n));
                pupload(tu, u);
                struct pt *ty = in_place ? ta : pnew(MMRT_DTYPE_F32, SHAPE(1, n));
                struct pt *src[2] = { ta, tu };
                struct mmrt_scale_params p = { -0.375f };
                bool swiglu = ops[o] == MMRT_OP_SWIGLU, scale = ops[o] == MMRT_OP_SCALE;
                prun(ops[o], src, swiglu ? 2 : 1, ty, scale ? &p : NULL, scale ? sizeof p : 0);
                double *ref = ref_buf(n);
                if (scale)
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = (double)a[i] * p.scale;
                else if (swiglu)
                    ref_swiglu(a, u, n, ref);
                else
                    ref_unary(ops[o], a, n, ref);
                void *g, *c;
                pdown(ty, &g, &c);
                char what[96];
                snprintf(what, sizeof what, "%s n %lld%s", names[o], (long long)n,
                         in_place ? " in place" : "");
                check3(names[o], what, g, c, ref, n, 1e-6, 1e-6, 1.0);
                release_all();
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
    rng_seed(6);
    for (int op = MMRT_OP_LAYERNORM; op <= MMRT_OP_RMSNORM; op++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (int mode = 0; mode < 5; mode++) {
                int64_t R = cases[k][0], N = cases[k][1];
                enum mmrt_dtype wdt = mode >= 1 && mode <= 3 ? weight_dtypes[mode - 1]
                                                             : MMRT_DTYPE_F32;
                bool ln = op == MMRT_OP_LAYERNORM;
                float *x, *w = NULL, *b = NULL;
                struct pt *tx = prand(MMRT_DTYPE_F32, 1, 5, &x, SHAPE(R, N));
                struct pt *tw = NULL, *tb = NULL;
                if (mode >= 1)
                    tw = prand(wdt, -2, 2, &w, SHAPE(N));
                if (ln && mode >= 1 && mode <= 3)
                    tb = prand(wdt, -1, 1, &b, SHAPE(N));
                struct pt *ty = mode == 4 ? tx : pnew(MMRT_DTYPE_F32, SHAPE(R, N));
                struct mmrt_norm_params p = { mode % 2 ? 1e-5f : 1e-6f };
                struct pt *src[3] = { tx, tw, tb };
                double *ref = ref_buf(R * N);
                if (ln)
                    ref_layernorm(x, w, b, R, N, p.eps, ref);
                else
                    ref_rmsnorm(x, w, R, N, p.eps, ref);
                prun(op, src, ln ? 3 : 2, ty, &p, sizeof p);
                void *g, *c;
                pdown(ty, &g, &c);
                char what[96];
                snprintf(what, sizeof what, "%s [%lld, %lld] mode %d", ln ? "LAYERNORM" : "RMSNORM",
                         (long long)R, (long long)N, mode);
                check3(ln ? "LAYERNORM" : "RMSNORM", what, g, c, ref, R * N, 1e-5, 1e-5, 0);
                release_all();
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
    rng_seed(7);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int mode = 0; mode < 4; mode++) {
            int64_t R = cases[k][0], N = cases[k][1];
            float lo = mode == 2 ? 95.0f : -10.0f, hi = mode == 2 ? 105.0f : 10.0f;
            float *x = rand_f(R * N, lo, hi);
            if (mode == 1 || mode == 3)
                for (int64_t i = 0; i < R * N; i++)
                    if (i % N != 0 && rng_int(0, 9) < 3)
                        x[i] = -INFINITY;
            struct pt *tx = pnew(MMRT_DTYPE_F32, SHAPE(R, N));
            pupload(tx, x);
            struct pt *ty = mode == 3 ? tx : pnew(MMRT_DTYPE_F32, SHAPE(R, N));
            struct mmrt_scale_params p = { scales[(k + (size_t)mode) % 3] };
            struct pt *src[1] = { tx };
            prun(MMRT_OP_SOFTMAX, src, 1, ty, &p, sizeof p);
            double *ref = ref_buf(R * N);
            ref_softmax(x, R, N, p.scale, ref);
            void *g, *c;
            pdown(ty, &g, &c);
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
            release_all();
        }
    /* A row masked entirely: zeros. */
    float x[6] = { -INFINITY, -INFINITY, -INFINITY, 1, 2, 3 };
    struct pt *tx = pnew(MMRT_DTYPE_F32, SHAPE(2, 3));
    pupload(tx, x);
    struct pt *src[1] = { tx };
    struct mmrt_scale_params p = { 1.0f };
    prun(MMRT_OP_SOFTMAX, src, 1, tx, &p, sizeof p);
    void *g, *c;
    pdown(tx, &g, &c);
    const float *gf = g;
    for (int i = 0; i < 3; i++)
        assert_true(gf[i] == 0.0f);
    assert_true(fabsf(gf[3] + gf[4] + gf[5] - 1.0f) < 1e-6f);
    release_all();
}

static void test_argmax(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][2] = { { 1, 1 }, { 3, 7 }, { 2, 1024 }, { 4, 32064 },
                                        { 1, 100003 }, { 300, 255 } };
    rng_seed(12);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t R = cases[k][0], N = cases[k][1];
        float *x = rand_f(R * N, -5, 5);
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
        struct pt *tx = pnew(MMRT_DTYPE_F32, SHAPE(R, N));
        pupload(tx, x);
        struct pt *ty = pnew(MMRT_DTYPE_I32, SHAPE(R));
        struct pt *src[1] = { tx };
        prun(MMRT_OP_ARGMAX, src, 1, ty, NULL, 0);
        int32_t *want = talloc((size_t)R * 4);
        for (int64_t r = 0; r < R; r++)
            want[r] = ref_argmax(x + r * N, N);
        void *g, *c;
        pdown(ty, &g, &c);
        char what[64];
        snprintf(what, sizeof what, "ARGMAX [%lld, %lld]", (long long)R, (long long)N);
        check_bytes("ARGMAX", what, g, c, want, (size_t)R * 4);
        release_all();
    }
}

/* ---- ROPE ----------------------------------------------------------------------------- */

static void test_rope(void **state)
{
    (void)state;
    need_dut();
    static const struct {
        int64_t T, H, D;
        int n_rot, mode, layout; /* 0 contiguous, 1 in place, 2 view in a fused buffer */
        float theta;
        int max_pos;
    } cases[] = {
        { 5, 4, 64, 64, MMRT_ROPE_NEOX, 0, 10000.0f, 16 },
        { 3, 2, 8, 4, MMRT_ROPE_NEOX, 0, 25000.0f, 100 },
        { 7, 3, 128, 128, MMRT_ROPE_INTERLEAVED, 1, 1e6f, 5000 },
        { 1, 1, 2, 2, MMRT_ROPE_NEOX, 0, 10000.0f, 3 },
        { 9, 5, 80, 40, MMRT_ROPE_INTERLEAVED, 2, 10000.0f, 70000 },
        { 33, 2, 96, 64, MMRT_ROPE_NEOX, 2, 500000.0f, 40000 },
        { 4, 3, 256, 256, MMRT_ROPE_NEOX, 1, 10000.0f, 32768 },
        { 300, 8, 128, 128, MMRT_ROPE_NEOX, 0, 10000.0f, 4095 },
        { 65, 32, 80, 80, MMRT_ROPE_NEOX, 2, 1000000.0f, 131072 },
    };
    rng_seed(8);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t T = cases[k].T, H = cases[k].H, D = cases[k].D;
        int32_t *pos = talloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++)
            pos[t] = rng_int(0, cases[k].max_pos);
        pos[0] = cases[k].max_pos;
        float *x = rand_f(T * H * D, -2, 2);
        struct pt *tx, xv, *ty;
        if (cases[k].layout == 2) {
            int64_t Hb = H + 2;
            float *buf = talloc((size_t)(T * Hb * D) * sizeof(float));
            for (int64_t i = 0; i < T * Hb * D; i++)
                buf[i] = NAN;
            for (int64_t t = 0; t < T; t++)
                memcpy(buf + (t * Hb + 1) * D, x + t * H * D, (size_t)(H * D) * sizeof(float));
            tx = pnew(MMRT_DTYPE_F32, SHAPE(T, Hb, D));
            pupload(tx, buf);
            xv = pview(tx, MMRT_DTYPE_F32, SHAPE(T, H, D),
                       (const int64_t[]){ Hb * D * 4, D * 4, 4 }, (uint64_t)D * 4);
            ty = pnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        } else {
            tx = pnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
            pupload(tx, x);
            xv = *tx;
            ty = cases[k].layout == 1 ? tx : pnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        }
        struct pt *tp = pi32(pos, T);
        struct mmrt_rope_params p = { cases[k].theta, cases[k].n_rot, cases[k].mode };
        struct pt *src[2] = { &xv, tp };
        prun(MMRT_OP_ROPE, src, 2, ty, &p, sizeof p);
        double *ref = ref_buf(T * H * D);
        ref_rope(x, pos, T, H, D, cases[k].n_rot, cases[k].mode, cases[k].theta, ref);
        void *g, *c;
        pdown(ty, &g, &c);
        char what[96];
        snprintf(what, sizeof what, "ROPE case %zu (T %lld H %lld D %lld n_rot %d mode %d)", k,
                 (long long)T, (long long)H, (long long)D, cases[k].n_rot, cases[k].mode);
        check3("ROPE", what, g, c, ref, T * H * D, 1e-6, 1e-6, 0);
        release_all();
    }
}

/* ---- ROPE_MULTI ----------------------------------------------------------------------- */

/* Qwen2-VL's decoder M-RoPE and vision 2-D rotary at model sizes, then empty sections, four
 * axes, a copied tail, in place and a head view of a fused buffer; tolerance as ROPE. One
 * axis is also held to ROPE NEOX bit for bit (one kernel serves both). */
static void test_rope_multi(void **state)
{
    (void)state;
    need_dut();
    static const struct {
        int64_t T, H, D;
        int n_rot, freq_dim, restart, n_axes, sections[MMRT_ROPE_MAX_AXES];
        int layout; /* 0 contiguous, 1 in place, 2 view in a fused buffer */
        float theta;
        int max_pos;
        bool big;   /* dropped by MMRT_TEST_QUICK */
    } cases[] = {
        { 7, 4, 128, 128, 128, 0, 3, { 16, 24, 24 }, 0, 1e6f, 5000, false },
        { 33, 2, 80, 80, 40, 1, 2, { 20, 20 }, 2, 10000.0f, 60, false },
        { 5, 3, 64, 64, 64, 0, 3, { 8, 12, 12 }, 1, 10000.0f, 70000, false },
        { 4, 3, 200, 130, 130, 1, 4, { 20, 0, 30, 15 }, 2, 10000.0f, 4096, false },
        { 3, 5, 40, 32, 32, 0, 3, { 0, 12, 4 }, 0, 500000.0f, 32768, false },
        { 2, 2, 256, 256, 128, 1, 2, { 64, 64 }, 1, 10000.0f, 100, false },
        { 70, 1, 6, 2, 2, 1, 2, { 1, 0 }, 0, 10000.0f, 9, false },
        { 600, 28, 128, 128, 128, 0, 3, { 16, 24, 24 }, 2, 1e6f, 32768, true },
        { 1024, 16, 80, 80, 40, 1, 2, { 20, 20 }, 1, 10000.0f, 63, true },
    };
    rng_seed(21);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].big && g_quick)
            continue;
        int64_t T = cases[k].T, H = cases[k].H, D = cases[k].D;
        int n_axes = cases[k].n_axes;
        int32_t *pos = talloc((size_t)(T * n_axes) * 4);
        for (int64_t i = 0; i < T * n_axes; i++)
            pos[i] = rng_int(0, cases[k].max_pos);
        pos[0] = cases[k].max_pos;
        float *x = rand_f(T * H * D, -2, 2);
        struct pt *tx, xv, *ty;
        if (cases[k].layout == 2) {
            int64_t Hb = H + 2;
            float *buf = talloc((size_t)(T * Hb * D) * sizeof(float));
            for (int64_t i = 0; i < T * Hb * D; i++)
                buf[i] = NAN;
            for (int64_t t = 0; t < T; t++)
                memcpy(buf + (t * Hb + 1) * D, x + t * H * D, (size_t)(H * D) * sizeof(float));
            tx = pnew(MMRT_DTYPE_F32, SHAPE(T, Hb, D));
            pupload(tx, buf);
            xv = pview(tx, MMRT_DTYPE_F32, SHAPE(T, H, D),
                       (const int64_t[]){ Hb * D * 4, D * 4, 4 }, (uint64_t)D * 4);
            ty = pnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        } else {
            tx = pnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
            pupload(tx, x);
            xv = *tx;
            ty = cases[k].layout == 1 ? tx : pnew(MMRT_DTYPE_F32, SHAPE(T, H, D));
        }
        struct pt *tp = pnew(MMRT_DTYPE_I32, SHAPE(T, n_axes));
        pupload(tp, pos);
        struct mmrt_rope_multi_params p = { cases[k].theta, cases[k].n_rot, cases[k].freq_dim,
                                            cases[k].restart, n_axes, { 0 } };
        memcpy(p.sections, cases[k].sections, sizeof p.sections);
        struct pt *src[2] = { &xv, tp };
        prun(MMRT_OP_ROPE_MULTI, src, 2, ty, &p, sizeof p);
        double *ref = ref_buf(T * H * D);
        ref_rope_multi(x, pos, T, H, D, cases[k].n_rot, cases[k].freq_dim, cases[k].restart,
                       n_axes, cases[k].sections, cases[k].theta, ref);
        void *g, *c;
        pdown(ty, &g, &c);
        char what[128];
        snprintf(what, sizeof what, "ROPE_MULTI case %zu (T %lld H %lld D %lld n_rot %d "
                 "freq_dim %d restart %d axes %d)", k, (long long)T, (long long)H, (long long)D,
                 cases[k].n_rot, cases[k].freq_dim, cases[k].restart, n_axes);
        check3("ROPE_MULTI", what, g, c, ref, T * H * D, 1e-6, 1e-6, 0);
        release_all();
    }

    /* One axis, sections {n_rot/2}, freq_dim n_rot: ROPE NEOX exactly. */
    int64_t T = 9, Hh = 3, D = 48;
    int32_t pos[9];
    for (int t = 0; t < 9; t++)
        pos[t] = rng_int(0, 40000);
    float *x;
    struct pt *tx = prand(MMRT_DTYPE_F32, -2, 2, &x, SHAPE(T, Hh, D)), *tp1 = pi32(pos, T);
    struct pt *tp2 = pnew(MMRT_DTYPE_I32, SHAPE(T, 1));
    pupload(tp2, pos);
    struct pt *ya = pnew(MMRT_DTYPE_F32, SHAPE(T, Hh, D));
    struct pt *yb = pnew(MMRT_DTYPE_F32, SHAPE(T, Hh, D));
    struct mmrt_rope_params rp = { 10000.0f, 40, MMRT_ROPE_NEOX };
    struct mmrt_rope_multi_params mp = { 10000.0f, 40, 40, 0, 1, { 20 } };
    struct pt *sa[2] = { tx, tp1 }, *sb[2] = { tx, tp2 };
    assert_int_equal(run_on(0, MMRT_OP_ROPE, sa, 2, ya, &rp, sizeof rp), MMRT_OK);
    assert_int_equal(run_on(0, MMRT_OP_ROPE_MULTI, sb, 2, yb, &mp, sizeof mp), MMRT_OK);
    void *ga, *ca, *gb, *cb;
    pdown(ya, &ga, &ca);
    pdown(yb, &gb, &cb);
    assert_memory_equal(ga, gb, (size_t)(T * Hh * D) * sizeof(float));
    release_all();
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
};

/* Places dense values [S, Hkv, D] into a new base tensor of the layout; returns the view.
 * Cells outside the view are NaN. */
static struct pt kv_place(enum kv_layout layout, enum mmrt_dtype dt, int64_t S, int64_t Hkv,
                          int64_t D, const float *dense)
{
    int64_t es = dt == MMRT_DTYPE_F32 ? 4 : 2, cap = S + 5, off = 3;
    const int64_t ne[3] = { S, Hkv, D };
    if (layout == KV_DENSE) {
        struct pt *t = pnew(dt, SHAPE(S, Hkv, D));
        pupload(t, encode(dt, dense, S * Hkv * D));
        return *t;
    }
    float *buf = talloc((size_t)(cap * Hkv * D) * sizeof(float));
    for (int64_t i = 0; i < cap * Hkv * D; i++)
        buf[i] = NAN;
    if (layout == KV_CACHE) {
        memcpy(buf + off * Hkv * D, dense, (size_t)(S * Hkv * D) * sizeof(float));
        struct pt *t = pnew(dt, SHAPE(cap, Hkv, D));
        pupload(t, encode(dt, buf, cap * Hkv * D));
        return pview(t, dt, 3, ne, (const int64_t[]){ Hkv * D * es, D * es, es },
                     (uint64_t)(off * Hkv * D * es));
    }
    for (int64_t s = 0; s < S; s++) /* KV_HEAD_MAJOR: [Hkv, cap, D] */
        for (int64_t g = 0; g < Hkv; g++)
            memcpy(buf + (g * cap + s) * D, dense + (s * Hkv + g) * D, (size_t)D * sizeof(float));
    struct pt *t = pnew(dt, SHAPE(Hkv, cap, D));
    pupload(t, encode(dt, buf, cap * Hkv * D));
    return pview(t, dt, 3, ne, (const int64_t[]){ D * es, cap * D * es, es }, 0);
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
    rng_seed(seed);
    enum mmrt_dtype kdt = ac->k_dt, vdt = ac->layout == KV_FUSED ? ac->k_dt : ac->v_dt;
    float *k = rand_f(S * Hkv * D, -1, 1), *v = rand_f(S * Hkv * D, -1, 1);
    round_to(kdt, k, S * Hkv * D);
    round_to(vdt, v, S * Hkv * D);
    float *q;
    struct pt *tq = prand(MMRT_DTYPE_F32, -ac->q_amp, ac->q_amp, &q, SHAPE(T, Hq, D));
    struct pt vk, vv;
    if (ac->layout == KV_FUSED) {
        int64_t es = kdt == MMRT_DTYPE_F32 ? 4 : 2;
        float *fused = talloc((size_t)(S * 2 * Hkv * D) * sizeof(float));
        for (int64_t s = 0; s < S; s++) {
            memcpy(fused + (s * 2 + 0) * Hkv * D, k + s * Hkv * D, (size_t)(Hkv * D) * 4);
            memcpy(fused + (s * 2 + 1) * Hkv * D, v + s * Hkv * D, (size_t)(Hkv * D) * 4);
        }
        struct pt *base = pnew(kdt, SHAPE(S, 2, Hkv, D));
        pupload(base, encode(kdt, fused, S * 2 * Hkv * D));
        const int64_t nb[3] = { 2 * Hkv * D * es, D * es, es };
        vk = pview(base, kdt, SHAPE(S, Hkv, D), nb, 0);
        vv = pview(base, kdt, SHAPE(S, Hkv, D), nb, (uint64_t)(Hkv * D * es));
    } else {
        vk = kv_place(ac->layout, kdt, S, Hkv, D, k);
        vv = kv_place(ac->layout, vdt, S, Hkv, D, v);
    }
    struct pt *ty = pnew(MMRT_DTYPE_F32, SHAPE(T, Hq, D));
    struct pt *tcq = ac->n_seq ? pi32(cu_q, n_seq + 1) : NULL;
    struct pt *tck = ac->n_seq ? pi32(cu_k, n_seq + 1) : NULL;
    float scale = 1.0f / sqrtf((float)D);
    struct mmrt_attention_params p = { scale, ac->causal, n_seq };
    struct pt *src[5] = { tq, &vk, &vv, tcq, tck };
    prun(MMRT_OP_ATTENTION, src, ac->n_seq ? 5 : 3, ty, &p, sizeof p);
    void *g, *c;
    pdown(ty, &g, &c);
    if (gout)
        *gout = g;
    if (!check)
        return;
    double *ref = ref_buf(T * Hq * D);
    ref_attention(q, k, v, T, S, Hq, Hkv, D, ac->n_seq ? cu_q : NULL, ac->n_seq ? cu_k : NULL,
                  n_seq, scale, ac->causal, ref);
    char what[200];
    snprintf(what, sizeof what, "ATTENTION seed %llu (T %lld S %lld Hq %lld Hkv %lld D %lld n_seq "
             "%d causal %d k %s v %s layout %d)", (unsigned long long)seed, (long long)T,
             (long long)S, (long long)Hq, (long long)Hkv, (long long)D, ac->n_seq, ac->causal,
             dt_name(kdt), dt_name(vdt), (int)ac->layout);
    check3("ATTENTION", what, g, c, ref, T * Hq * D, 2e-5, 1e-5, 0);
}

#define F32 MMRT_DTYPE_F32
#define F16 MMRT_DTYPE_F16
static const struct attn_case attn_cases[] = {
    /* Hq Hkv D  n_seq lq                    lk                      causal k   v  layout q_amp */
    { 4, 4, 64,  0, { 7 },                  { 7 },                   0, F32, F32, KV_DENSE, 1 },
    { 8, 2, 80,  0, { 33 },                 { 33 },                  1, F16, F16, KV_DENSE, 1 },
    { 4, 2, 128, 0, { 1 },                  { 37 },                  1, F16, F16, KV_CACHE, 1 },
    { 4, 1, 64,  0, { 5 },                  { 20 },                  1, F32, F32, KV_HEAD_MAJOR, 1 },
    { 2, 2, 256, 3, { 5, 1, 12 },           { 5, 1, 12 },            0, F32, F32, KV_FUSED, 1 },
    { 6, 3, 8,   5, { 3, 1, 0, 4, 5 },      { 10, 1, 0, 4, 2 },      1, F16, F16, KV_CACHE, 1 },
    { 2, 1, 64,  0, { 300 },                { 300 },                 1, F32, F32, KV_DENSE, 1 },
    { 1, 1, 3,   0, { 4 },                  { 9 },                   0, F32, F32, KV_DENSE, 1 },
    { 4, 2, 64,  0, { 9 },                  { 9 },                   1, F32, F32, KV_FUSED, 4 },
    { 2, 1, 16,  0, { 2 },                  { 0 },                   0, F32, F32, KV_DENSE, 1 },
    { 8, 2, 128, 0, { 16 },                 { 16 },                  1, F16, F16, KV_HEAD_MAJOR, 1 },
    { 4, 4, 256, 2, { 3, 2 },               { 40, 7 },               1, F16, F16, KV_FUSED, 1 },
    /* tile edges: 63/64/65 and 127/128/129 rows and keys, packed, every head dim */
    { 2, 2, 64,  7, { 1, 63, 64, 65, 127, 128, 129 }, { 1, 63, 64, 65, 127, 128, 129 }, 1, F32, F32, KV_DENSE, 1 },
    { 4, 2, 80,  7, { 1, 63, 64, 65, 127, 128, 129 }, { 1, 63, 64, 65, 127, 128, 129 }, 0, F16, F16, KV_CACHE, 1 },
    { 2, 1, 128, 4, { 63, 64, 65, 0 },      { 129, 64, 200, 3 },     1, F16, F32, KV_DENSE, 1 },
    { 2, 2, 256, 3, { 65, 33, 1 },          { 65, 100, 257 },        1, F32, F16, KV_HEAD_MAJOR, 1 },
    /* generic head dims */
    { 3, 1, 100, 2, { 17, 40 },             { 17, 40 },              1, F32, F32, KV_DENSE, 1 },
    { 2, 2, 200, 1, { 70 },                 { 70 },                  0, F16, F16, KV_DENSE, 1 },
    { 4, 4, 32,  0, { 129 },                { 129 },                 1, F32, F32, KV_DENSE, 1 },
    /* GQA 8, chunked prefill (Lq < Lk), causal with Lq > Lk (empty rows) */
    { 32, 4, 128, 0, { 65 },                { 300 },                 1, F16, F16, KV_CACHE, 1 },
    { 8, 1, 64,  2, { 40, 10 },             { 20, 10 },              1, F32, F32, KV_DENSE, 1 },
    /* decode against long caches: split-KV on a GPU (few rows, many keys) */
    { 32, 8, 128, 4, { 1, 1, 1, 1 },        { 1000, 37, 513, 2048 }, 1, F16, F16, KV_CACHE, 1 },
    { 32, 32, 128, 1, { 1 },                { 3000 },                1, F16, F16, KV_DENSE, 1 },
    { 16, 16, 80, 2, { 1, 1 },              { 700, 1500 },           1, F32, F32, KV_HEAD_MAJOR, 1 },
    { 8, 8, 256, 1, { 2 },                  { 1200 },                1, F32, F32, KV_DENSE, 1 },
    /* vision-like: bidirectional, one long sequence; and a peaky softmax */
    { 16, 16, 64, 0, { 577 },               { 577 },                 0, F32, F32, KV_DENSE, 1 },
    { 4, 2, 128, 0, { 200 },                { 200 },                 1, F32, F32, KV_FUSED, 6 },
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
        release_all();
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
    release_all();
}

/* ---- GET_ROWS, COPY, CONCAT ------------------------------------------------------------ */

static void test_get_rows(void **state)
{
    (void)state;
    need_dut();
    static const int64_t cases[][3] = { { 1, 1, 1 }, { 10, 7, 5 }, { 1000, 64, 33 },
                                        { 32, 4096, 3 }, { 32064, 100, 7 } };
    rng_seed(9);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            int64_t V = cases[k][0], N = cases[k][1], T = cases[k][2];
            float *tab;
            struct pt *tt = prand(weight_dtypes[d], -3, 3, &tab, SHAPE(V, N));
            int32_t *ids = talloc((size_t)T * 4);
            for (int64_t t = 0; t < T; t++)
                ids[t] = rng_int(0, (int)V - 1);
            ids[0] = (int32_t)V - 1;
            struct pt *ti = pi32(ids, T);
            struct pt *ty = pnew(MMRT_DTYPE_F32, SHAPE(T, N));
            struct pt *src[2] = { tt, ti };
            prun(MMRT_OP_GET_ROWS, src, 2, ty, NULL, 0);
            float *want = talloc((size_t)(T * N) * 4);
            for (int64_t t = 0; t < T; t++)
                memcpy(want + t * N, tab + ids[t] * N, (size_t)N * 4);
            void *g, *c;
            pdown(ty, &g, &c);
            char what[64];
            snprintf(what, sizeof what, "GET_ROWS V %lld N %lld %s", (long long)V, (long long)N,
                     dt_name(weight_dtypes[d]));
            check_bytes("GET_ROWS", what, g, c, want, (size_t)(T * N) * 4);
            release_all();
        }
}

/* ---- SET_ROWS: exact ------------------------------------------------------------------- */

/* ref_set_rows (dst's old contents in, rows written in order) rounded to dst's dtype. */
static void *set_rows_expect(enum mmrt_dtype dt, const double *ref, int64_t n)
{
    if (dt == MMRT_DTYPE_F32) {
        float *f = talloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)ref[i];
        return f;
    }
    uint16_t *h = talloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == MMRT_DTYPE_F16 ? harness_f32_to_f16((float)ref[i])
                                    : harness_f32_to_bf16((float)ref[i]);
    return h;
}

/* Every dst dtype; KV-cache shapes, one decode token, rows longer than a block's slice, a
 * 1-D dst, a prefill-sized scatter; indices out of range (nothing written) and repeated (the
 * last row wins whole); a sentinel in every row nobody writes. Then the decode pattern: the
 * same launch after a new index upload. */
static void test_set_rows(void **state)
{
    (void)state;
    need_dut();
    static const struct {
        int64_t T, R;
        int n_inner;
        int64_t inner[2];
        bool big;
    } cases[] = {
        { 1, 40, 2, { 2, 64 }, false },   { 5, 9, 2, { 3, 7 }, false },
        { 300, 512, 2, { 2, 40 }, false }, { 4, 4, 1, { 2500 }, false },
        { 10, 6, 0, { 0 }, false },        { 70, 64, 1, { 5 }, false },
        { 4096, 8192, 2, { 8, 128 }, true },
    };
    static const uint32_t edge[] = {
        0x3f801000, 0x3f803000, 0x477fe000, 0x477ff000, 0x38800000, 0x387fe000, 0x33000001,
        0x3f808000, 0x3f818000, 0x7f7fffff, 0x00000001, 0x80000000, 0x7f800000, 0x7fc00000,
    };
    rng_seed(22);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 3; d++) {
            if (cases[k].big && g_quick)
                continue;
            enum mmrt_dtype dt = weight_dtypes[d];
            int64_t T = cases[k].T, R = cases[k].R, n = 1;
            int64_t vne[3] = { T }, dne[3] = { R };
            for (int i = 0; i < cases[k].n_inner; i++) {
                vne[i + 1] = dne[i + 1] = cases[k].inner[i];
                n *= cases[k].inner[i];
            }
            int nd = 1 + cases[k].n_inner;
            struct pt *tv = pnew(MMRT_DTYPE_F32, nd, vne), *ty = pnew(dt, nd, dne);
            float *v = rand_f(T * n, -70000, 70000);
            for (int64_t i = 0; i < T * n && i < (int64_t)(sizeof edge / 4); i++)
                memcpy(&v[i], &edge[i], 4);
            pupload(tv, v);
            int32_t *idx = talloc((size_t)T * 4);
            for (int64_t t = 0; t < T; t++)
                idx[t] = rng_int(-1, (int)R);
            if (T == 1)
                idx[0] = (int32_t)(R / 2 + 3);
            if (T >= 4) {
                idx[0] = INT32_MIN;
                idx[1] = (int32_t)R - 1;
                idx[3] = idx[1];
            }
            struct pt *ti = pi32(idx, T);
            double *ref = ref_buf(R * n);
            float *old = talloc((size_t)(R * n) * 4);
            for (int64_t i = 0; i < R * n; i++)
                ref[i] = old[i] = -(float)(i % 1000 + 1) / 8.0f; /* exact in every dtype */
            pupload(ty, encode(dt, old, R * n));
            struct pt *src[2] = { tv, ti };
            prun(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0);
            ref_set_rows(v, idx, T, n, R, ref);
            void *g, *c;
            pdown(ty, &g, &c);
            char what[96];
            snprintf(what, sizeof what, "SET_ROWS T %lld n %lld R %lld dst %s", (long long)T,
                     (long long)n, (long long)R, dt_name(dt));
            check_bytes("SET_ROWS", what, g, c, set_rows_expect(dt, ref, R * n),
                        (size_t)(R * n) * mmrt_dtype_size(dt));
            release_all();
        }

    struct pt *tv = pnew(MMRT_DTYPE_F32, SHAPE(1, 2, 8));
    struct pt *ty = pnew(MMRT_DTYPE_F16, SHAPE(6, 2, 8));
    float *v = rand_f(16, -1, 1), *zero = talloc(6 * 16 * 4);
    pupload(tv, v);
    pupload(ty, encode(MMRT_DTYPE_F16, zero, 6 * 16));
    int32_t at = 2;
    struct pt *ti = pi32(&at, 1), *src[2] = { tv, ti };
    prun(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0);
    at = 5;
    pupload(ti, &at);
    prun(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0);
    void *g, *c;
    pdown(ty, &g, &c);
    const uint16_t *gh = g;
    for (int r = 0; r < 6; r++)
        for (int e = 0; e < 16; e++)
            assert_int_equal(gh[r * 16 + e], r == 2 || r == 5 ? harness_f32_to_f16(v[e]) : 0);
    assert_memory_equal(g, c, 6 * 16 * 2);
    release_all();
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
    struct pt *tt = prand(MMRT_DTYPE_F16, -1, 1, &tab, SHAPE(10, 8));
    int32_t ids[3] = { 2, 10, 3 };
    struct pt *ti = pi32(ids, 3);
    struct pt *ty = pnew(MMRT_DTYPE_F32, SHAPE(3, 8));
    struct harness_tensor *src[2] = { &tt->g, &ti->g };
    assert_int_equal(launch_then_sync(&G, MMRT_OP_GET_ROWS, src, 2, &ty->g, NULL, 0, err,
                                      sizeof err),
                     MMRT_ERR_INVALID_ARG);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "GET_ROWS"));
    assert_non_null(strstr(err, "10"));
    /* The error is reported once; the device keeps working. */
    assert_int_equal(G.plugin->synchronize(G.dev), MMRT_OK);
    int32_t good[3] = { 2, 9, 3 };
    assert_int_equal(harness_upload(&G, &ti->g, good), MMRT_OK);
    assert_int_equal(harness_run(&G, MMRT_OP_GET_ROWS, src, 2, &ty->g, NULL, 0), MMRT_OK);
    float got[24];
    assert_int_equal(harness_download(&G, &ty->g, got), MMRT_OK);
    assert_memory_equal(got + 8, tab + 9 * 8, 8 * sizeof(float));

    /* ATTENTION with cu_seqlens_k that does not end at S. */
    float *q, *k;
    struct pt *tq = prand(MMRT_DTYPE_F32, -1, 1, &q, SHAPE(4, 2, 64));
    struct pt *tk = prand(MMRT_DTYPE_F32, -1, 1, &k, SHAPE(6, 1, 64));
    struct pt *to = pnew(MMRT_DTYPE_F32, SHAPE(4, 2, 64));
    int32_t cq[3] = { 0, 2, 4 }, ck[3] = { 0, 3, 5 }; /* S = 6 */
    struct pt *tcq = pi32(cq, 3), *tck = pi32(ck, 3);
    struct mmrt_attention_params p = { 0.125f, 1, 2 };
    struct harness_tensor *asrc[5] = { &tq->g, &tk->g, &tk->g, &tcq->g, &tck->g };
    assert_int_equal(launch_then_sync(&G, MMRT_OP_ATTENTION, asrc, 5, &to->g, &p, sizeof p, err,
                                      sizeof err),
                     MMRT_ERR_INVALID_ARG);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "cu_seqlens_k"));
    assert_int_equal(G.plugin->synchronize(G.dev), MMRT_OK);
    release_all();
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
    rng_seed(13);
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
                float *vals = rand_f(n * 2, -70000, 70000);
                memcpy(vals, specials, sizeof specials);
                /* Source base: [3, 5, 7, 9 (+3 pad)] for layout 2, else dense. */
                int64_t pad = layout == 2 ? 3 : 0;
                int64_t sne[4] = { 3, 5, 7, 9 + pad };
                struct pt *sb = pnew(sdt, 4, sne);
                int64_t sn = 3 * 5 * 7 * (9 + pad);
                pupload(sb, sdt == MMRT_DTYPE_I32 ? (void *)vals : encode(sdt, vals, sn));
                int64_t snb[4] = { 5 * 7 * (9 + pad) * ses, 7 * (9 + pad) * ses, (9 + pad) * ses,
                                   ses };
                if (layout == 3) { /* src seen as the transpose of a [3, 9, 7, 5] buffer */
                    snb[0] = 9 * 7 * 5 * ses;
                    snb[1] = ses;
                    snb[2] = 5 * ses;
                    snb[3] = 7 * 5 * ses;
                }
                struct pt sv = pview(sb, sdt, 4, ne, snb, 0);
                struct pt *db = pnew(ddt, SHAPE(n));
                int64_t dnb[4] = { 5 * 7 * 9 * des, 7 * 9 * des, 9 * des, des };
                if (layout == 1 || layout == 3) { /* dst is [3, 9, 7, 5] */
                    dnb[0] = 9 * 7 * 5 * des;
                    dnb[1] = des;
                    dnb[2] = 5 * des;
                    dnb[3] = 7 * 5 * des;
                }
                struct pt dv = pview(db, ddt, 4, ne, dnb, 0);
                struct pt *src[1] = { &sv };
                prun(MMRT_OP_COPY, src, 1, &dv, NULL, 0);
                /* Expected bytes through the harness conversions (round to nearest even). */
                uint8_t *sbytes = talloc((size_t)(sn * ses));
                assert_int_equal(harness_download(&C, &sb->c, sbytes), MMRT_OK);
                uint8_t *want = talloc((size_t)(n * des));
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
                                    f = sdt == MMRT_DTYPE_F16 ? harness_f16_to_f32(h)
                                                              : harness_bf16_to_f32(h);
                                }
                                if (ddt == MMRT_DTYPE_F32) {
                                    memcpy(dp, &f, 4);
                                } else {
                                    h = ddt == MMRT_DTYPE_F16 ? harness_f32_to_f16(f)
                                                              : harness_f32_to_bf16(f);
                                    memcpy(dp, &h, 2);
                                }
                            }
                void *g, *c;
                pdown(db, &g, &c);
                char what[80];
                snprintf(what, sizeof what, "COPY %s → %s layout %d", dt_name(sdt), dt_name(ddt),
                         layout);
                check_bytes("COPY", what, g, c, want, (size_t)(n * des));
                release_all();
            }

    /* In place F16 ↔ BF16 on the same bytes. */
    float *v;
    struct pt *t = prand(MMRT_DTYPE_F16, -100, 100, &v, SHAPE(4, 33));
    struct pt as_bf16 = pview(t, MMRT_DTYPE_BF16, SHAPE(4, 33), (const int64_t[]){ 66, 2 }, 0);
    struct pt *src[1] = { t };
    prun(MMRT_OP_COPY, src, 1, &as_bf16, NULL, 0);
    uint16_t want[132];
    for (int j = 0; j < 132; j++)
        want[j] = harness_f32_to_bf16(v[j]);
    void *g, *c;
    pdown(t, &g, &c);
    check_bytes("COPY", "COPY F16 → BF16 in place", g, c, want, sizeof want);
    release_all();
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
    rng_seed(11);
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
                int64_t n_a = na[0] * na[1] * na[2] * na[3], n_b = nb_[0] * nb_[1] * nb_[2] * nb_[3];
                uint8_t *ha = talloc((size_t)(n_a * es)), *hb = talloc((size_t)(n_b * es));
                for (int64_t i = 0; i < n_a * es; i++)
                    ha[i] = (uint8_t)rng_u64();
                for (int64_t i = 0; i < n_b * es; i++)
                    hb[i] = (uint8_t)rng_u64();
                struct pt *ta = pnew(dt, nd, na);
                pupload(ta, ha);
                /* src1 a view with padded innermost rows. */
                int64_t inner = nb_[nd - 1], padded = inner + 3, outer = n_b / inner;
                struct pt *tbb = pnew(dt, SHAPE(outer, padded));
                uint8_t *hbp = talloc((size_t)(outer * padded * es));
                for (int64_t o = 0; o < outer; o++)
                    memcpy(hbp + o * padded * es, hb + o * inner * es, (size_t)(inner * es));
                pupload(tbb, hbp);
                int64_t vnb[4];
                vnb[nd - 1] = es;
                if (nd >= 2)
                    vnb[nd - 2] = padded * es;
                for (int i = nd - 3; i >= 0; i--)
                    vnb[i] = vnb[i + 1] * nb_[i + 1];
                struct pt tb = pview(tbb, dt, nd, nb_, vnb, 0);
                struct pt *ty = pnew(dt, nd, ny);
                struct mmrt_concat_params p = { axis };
                struct pt *src[2] = { ta, &tb };
                prun(MMRT_OP_CONCAT, src, 2, ty, &p, sizeof p);
                int64_t e4[4], a4[4], b4[4], pad = 4 - nd;
                for (int i = 0; i < 4; i++) {
                    e4[i] = i < pad ? 1 : ny[i - pad];
                    a4[i] = i < pad ? 1 : na[i - pad];
                    b4[i] = i < pad ? 1 : nb_[i - pad];
                }
                int ax4 = axis + (int)pad;
                uint8_t *want = talloc((size_t)(e4[0] * e4[1] * e4[2] * e4[3] * es));
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
                pdown(ty, &g, &c);
                char what[64];
                snprintf(what, sizeof what, "CONCAT rank %d axis %d %s", nd, axis, dt_name(dt));
                check_bytes("CONCAT", what, g, c, want, (size_t)ty->g.nbytes);
                release_all();
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
    struct harness_tensor *t = talloc(sizeof *t);
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
    struct mmrt_attention_params ap = { 0.125f, 1, 2 };
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
    rng_seed(31);
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
    float *q = rand_f(H * D, -1, 1), *kv = rand_f(2 * CAP * HKV * D, -1, 1);
    float *w = rand_f(N * H * D, -0.1f, 0.1f), *b = rand_f(N, -1, 1);
    assert_int_equal(harness_upload(&G, s.q, q), MMRT_OK);
    assert_int_equal(harness_upload(&G, s.k, encode(MMRT_DTYPE_F16, kv, CAP * HKV * D)), MMRT_OK);
    assert_int_equal(harness_upload(&G, s.v, encode(MMRT_DTYPE_F16, kv + CAP * HKV * D,
                                                    CAP * HKV * D)), MMRT_OK);
    assert_int_equal(harness_upload(&G, s.w, encode(MMRT_DTYPE_BF16, w, N * H * D)), MMRT_OK);
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
    float *b_copy = talloc(N * sizeof(float));
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

    /* A failing op inside a capture: capture_end fails, nothing is recorded, eager works. */
    graph = NULL;
    assert_int_equal(pl->capture_begin(G.dev), MMRT_OK);
    struct harness_tensor *bad[2] = { s.y, s.w }; /* x [1, 48] against W [48, 256] */
    assert_int_equal(harness_run(&G, MMRT_OP_MATMUL, bad, 2, s.y, NULL, 0), MMRT_ERR_INVALID_ARG);
    assert_int_not_equal(pl->capture_end(G.dev, &graph), MMRT_OK);
    printf("capture refused as expected: %s\n", pl->last_error(G.dev));
    assert_null(graph);
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
    release_all();
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
    int32_t s = ms_len[i] - 1, ck[2] = { 0, ms_len[i] };
    assert_int_equal(harness_upload(&G, m->kc, m->k0), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->vc, m->v0), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->pos, ms_pos[i]), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->slot, &s), MMRT_OK);
    assert_int_equal(harness_upload(&G, m->ck, ck), MMRT_OK);
}

static void mstep_ops(struct mstep *m)
{
    struct mmrt_rope_multi_params rp = { 1e6f, MS_D, MS_D, 0, 3, { 8, 12, 12 } };
    struct mmrt_attention_params ap = { 0.125f, 1, 1 };
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
    rng_seed(32);
    struct mstep m = {
        .q = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D)), .kn = gnew(MMRT_DTYPE_F32, SHAPE(1, HKV, D)),
        .vn = gnew(MMRT_DTYPE_F32, SHAPE(1, HKV, D)), .qr = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D)),
        .kr = gnew(MMRT_DTYPE_F32, SHAPE(1, HKV, D)), .pos = gnew(MMRT_DTYPE_I32, SHAPE(1, 3)),
        .slot = gnew(MMRT_DTYPE_I32, SHAPE(1)), .kc = gnew(MMRT_DTYPE_F16, SHAPE(CAP, HKV, D)),
        .vc = gnew(MMRT_DTYPE_F16, SHAPE(CAP, HKV, D)), .cq = gnew(MMRT_DTYPE_I32, SHAPE(2)),
        .ck = gnew(MMRT_DTYPE_I32, SHAPE(2)), .att = gnew(MMRT_DTYPE_F32, SHAPE(1, H, D)),
        .k0 = encode(MMRT_DTYPE_F16, rand_f(CAP * HKV * D, -1, 1), CAP * HKV * D),
        .v0 = encode(MMRT_DTYPE_F16, rand_f(CAP * HKV * D, -1, 1), CAP * HKV * D),
    };
    assert_int_equal(harness_upload(&G, m.q, rand_f(H * D, -1, 1)), MMRT_OK);
    assert_int_equal(harness_upload(&G, m.kn, rand_f(HKV * D, -1, 1)), MMRT_OK);
    assert_int_equal(harness_upload(&G, m.vn, rand_f(HKV * D, -1, 1)), MMRT_OK);
    int32_t cq[2] = { 0, 1 };
    assert_int_equal(harness_upload(&G, m.cq, cq), MMRT_OK);
    size_t cache_bytes = (size_t)CAP * HKV * D * 2;
    float (*eager)[H * D] = talloc(sizeof(float[STEPS][H * D]));
    char *eager_kc = talloc(cache_bytes * STEPS), *got_kc = talloc(cache_bytes);

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
    release_all();
}

/* ---- setup and main ------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    const char *dut = getenv("MMRT_TEST_CUDA_PLUGIN");
    if (dut && *dut)
        g_dut = dut;
    mmrt_status st = harness_open(&G, harness_plugin_path(g_dut), NULL, 0);
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
    struct mmrt_device_info info = { .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_device_info) };
    if (G.plugin->device_info(G.dev, &info) == MMRT_OK)
        printf("device under test: %s (plugin %s)\n", info.name, g_dut);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    release_all();
    if (g_have_dut) {
        harness_close(&G);
        harness_close(&C);
    }
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_matmul_fast),
        cmocka_unit_test(test_patch_embed),  cmocka_unit_test(test_add_mul),
        cmocka_unit_test(test_scale_unary),  cmocka_unit_test(test_norms),
        cmocka_unit_test(test_softmax),      cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_rope),         cmocka_unit_test(test_rope_multi),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_empty_rows), cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_set_rows),
        cmocka_unit_test(test_device_checks), cmocka_unit_test(test_copy),
        cmocka_unit_test(test_concat),       cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_graph_capture_mrope),
    };
    const char *filter = getenv("MMRT_TEST_FILTER"); /* e.g. "test_attention*" */
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const char *quick = getenv("MMRT_TEST_QUICK");
    g_quick = quick && *quick && strcmp(quick, "0") != 0;
    int failures = cmocka_run_group_tests(tests, setup, teardown);
    if (g_n_stats > 0) {
        printf("\n%-12s %6s %12s %12s %10s\n", "op", "cases", "err_vs_ref", "err_vs_cpu", "tol");
        for (int i = 0; i < g_n_stats; i++)
            printf("OPSTAT %-12s %6d %12.3g %12.3g %10.1g\n", g_stats[i].name, g_stats[i].cases,
                   g_stats[i].err_ref, g_stats[i].err_cpu, g_stats[i].tol);
    }
    if (!g_have_dut && failures == 0)
        return SKIP_CODE;
    return failures;
}
