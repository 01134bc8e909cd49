/*
 * tools/plugin_check/grid.c — the cases tried for every operator.
 *
 * The grid aims at the places kernels go wrong: sizes of 1, odd and prime sizes that are not
 * a multiple of any tile, inner dims off every vector width, long and short sequences, every
 * weight dtype, every strided layout plugin.h allows (K/V caches read with a token stride,
 * fused QKV buffers, permuted COPY sources and destinations, strided CONCAT sources), in-place
 * runs where the op allows dst == src0, and the exact rounding cases of the dtype conversions.
 * Shapes stay moderate so the full grid runs in well under 30 s on PoCL on two cores; the
 * cases marked Q form --quick (a few seconds).
 *
 * Each op function walks its table; `serial` numbers every case of the op, run or not, so a
 * case keeps its inputs whatever --quick selects (kase_begin seeds from it).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kase.h"
#include "kv_i8_ref.h"

#define Q 1 /* in --quick */

static const enum mmrt_dtype weight_dts[3] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16};
/* What a KV-cache table may be (SET_ROWS dst, GATHER_HEADS table): the weight dtypes, F8E4M3
 * (ABI 1.6) and I8 with row scales (ABI 1.7); the core refuses either to an older plugin,
 * which then reads as refused. */
static const enum mmrt_dtype kv_table_dts[5] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                                MMRT_DTYPE_F8E4M3, MMRT_DTYPE_I8};

static bool want(const struct chk *c, int quick)
{
    return !c->quick || quick;
}

#define END_CASE()                                                                             \
    do {                                                                                       \
        mmrt_status st_ = kase_end(&k, err);                                                   \
        if (st_ != MMRT_OK)                                                                    \
            return st_;                                                                        \
    } while (0)

/* A view of shape ne inside an allocation padded by `pad` elements at the end of every dim
 * (and one element of offset), so every stride but the innermost differs from contiguous. */
static struct kt *kt_padded(struct kase *k, enum mmrt_dtype dt, int n, const int64_t *ne,
                            int pad)
{
    int64_t be[MMRT_MAX_DIMS], nb[MMRT_MAX_DIMS], stride = 1;
    for (int i = 0; i < n; i++)
        be[i] = ne[i] + pad;
    for (int i = n - 1; i >= 0; i--) {
        nb[i] = stride;
        stride *= be[i];
    }
    struct kt *base = kt_new(k, dt, n, be);
    return base ? kt_view(k, base, n, ne, nb, pad ? 1 : 0) : NULL;
}

/* A view of shape ne whose memory is laid out in the order `perm` (dim perm[j] of the view
 * is dim j of the contiguous allocation): a transposed / permuted source or destination. */
static struct kt *kt_permuted(struct kase *k, enum mmrt_dtype dt, int n, const int64_t *ne,
                              const int *perm)
{
    int64_t be[MMRT_MAX_DIMS], bs[MMRT_MAX_DIMS], nb[MMRT_MAX_DIMS], stride = 1;
    for (int j = 0; j < n; j++)
        be[j] = ne[perm[j]];
    for (int j = n - 1; j >= 0; j--) {
        bs[j] = stride;
        stride *= be[j];
    }
    for (int j = 0; j < n; j++)
        nb[perm[j]] = bs[j];
    struct kt *base = kt_new(k, dt, n, be);
    return base ? kt_view(k, base, n, ne, nb, 0) : NULL;
}

/* ---- MATMUL ------------------------------------------------------------------------------ */

static mmrt_status grid_matmul(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t M, K, N;
        int quick;
    } cases[] = {
        {1, 1, 1, Q},      {1, 13, 7, Q},      {3, 64, 5, 0},       {7, 257, 33, Q},
        {17, 1000, 130, 0}, {2, 1, 3, 0},      {5, 4099, 3, 0},     {64, 1031, 257, 0},
        {1, 4096, 1031, 0}, {129, 768, 131, 0}, {577, 1024, 97, 0}, {33, 2048, 2053, 0},
        {1, 11008, 127, 0}, {37, 31, 19, Q},     {128, 4096, 1031, 0},
    };
    static const char *const bias_names[] = {"none", "W dtype", "F32"};
    uint64_t serial = 0;
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
            if (!want(c, cases[i].quick))
                continue;
            int64_t M = cases[i].M, K = cases[i].K, N = cases[i].N;
            enum mmrt_dtype wdt = weight_dts[d];
            int bias = (int)((i + (size_t)d) % 3); /* none, W's dtype, F32 */
            struct kase k;
            kase_begin(&k, c, MMRT_OP_MATMUL, mmrt_dtype_name_of(wdt), serial,
                       "M=%lld K=%lld N=%lld bias=%s", (long long)M, (long long)K, (long long)N,
                       bias_names[bias]);
            struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(M, K));
            struct kt *w = kt_new(&k, wdt, SHAPE(N, K));
            struct kt *b = bias ? kt_new(&k, bias == 1 ? wdt : MMRT_DTYPE_F32, SHAPE(N)) : NULL;
            struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(M, N));
            kt_rand(&k, x, -1, 1);
            kt_rand(&k, w, -1, 1);
            if (b)
                kt_rand(&k, b, -1, 1);
            kase_run(&k, (const struct kt *[]){x, w, b}, b ? 3 : 2, y, NULL, 0);
            kase_check(&k, y);
            END_CASE();
        }
    /* x with more than two dims: rows are everything but the last dim. */
    for (int d = 0; d < 3; d++, serial++) {
        if (!want(c, d == 2))
            continue;
        struct kase k;
        kase_begin(&k, c, MMRT_OP_MATMUL, mmrt_dtype_name_of(weight_dts[d]), serial,
                   "x [2, 3, 40] W [9, 40] bias=none");
        struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(2, 3, 40));
        struct kt *w = kt_new(&k, weight_dts[d], SHAPE(9, 40));
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(2, 3, 9));
        kt_rand(&k, x, -1, 1);
        kt_rand(&k, w, -1, 1);
        kase_run(&k, (const struct kt *[]){x, w}, 2, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* I8 weights (plugin.h, ABI 1.3), the row (MATMUL, I8): codes and per-row scales from the
 * runtime's quantizer, rows of different magnitudes and zero rows; M on both sides of the
 * small-M lines plugins use (4, 8, 32), K off every vector width (1, 13, 31 … 4099), N off
 * every tile, with and without a bias. */
static mmrt_status grid_matmul_i8(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t M, K, N;
        int quick;
    } cases[] = {
        {1, 1, 1, Q},       {1, 13, 7, Q},       {4, 64, 5, 0},       {5, 257, 33, Q},
        {8, 1000, 130, 0},  {9, 129, 128, 0},    {32, 4099, 3, 0},    {33, 1031, 257, Q},
        {1, 4096, 1031, 0}, {17, 768, 131, 0},   {129, 768, 131, 0},  {37, 31, 19, Q},
        {2, 1, 3, 0},       {64, 2048, 97, 0},   {1, 11008, 127, 0},  {3, 48, 9, 0},
    };
    static const char *const bias_names[] = {"none", "F16", "F32"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!want(c, cases[i].quick))
            continue;
        int64_t M = cases[i].M, K = cases[i].K, N = cases[i].N;
        int bias = (int)(i % 3);
        struct kase k;
        kase_begin(&k, c, MMRT_OP_MATMUL, "I8", i, "M=%lld K=%lld N=%lld bias=%s",
                   (long long)M, (long long)K, (long long)N, bias_names[bias]);
        struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(M, K));
        struct kt *w = kt_new(&k, MMRT_DTYPE_I8, SHAPE(N, K));
        struct kt *s = kt_new(&k, MMRT_DTYPE_F32, SHAPE(N));
        struct kt *b =
            bias ? kt_new(&k, bias == 1 ? MMRT_DTYPE_F16 : MMRT_DTYPE_F32, SHAPE(N)) : NULL;
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(M, N));
        kt_rand(&k, x, -1, 1);
        kt_quantize(&k, w, s, 2.0f);
        if (b)
            kt_rand(&k, b, -1, 1);
        kase_run(&k, (const struct kt *[]){x, w, b, s}, 4, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* U4 weights (plugin.h, ABI 1.3), the row (MATMUL, U4): packed codes, scales and zero points
 * from the runtime's quantizer in groups of 32, 64 and 128 (and one group per row), rows of
 * different magnitudes and zero rows; M on both sides of the small-M lines (4, 8, 32), N off
 * every tile and warp, with and without a bias. */
static mmrt_status grid_matmul_u4(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t M, K, N, group;
        int quick;
    } cases[] = {
        {1, 32, 1, 32, Q},      {1, 256, 7, 64, Q},     {3, 128, 33, 128, 0},
        {4, 64, 5, 32, 0},      {5, 384, 65, 128, Q},   {8, 1024, 130, 64, 0},
        {9, 192, 129, 64, 0},   {32, 4096, 3, 128, 0},  {33, 1024, 257, 128, Q},
        {1, 4096, 1031, 128, 0}, {17, 768, 131, 32, 0}, {70, 512, 67, 64, Q},
        {129, 768, 131, 128, 0}, {2, 96, 3, 32, 0},     {64, 2048, 97, 64, 0},
        {1, 11008, 127, 128, 0}, {3, 320, 9, 320, 0},
    };
    static const char *const bias_names[] = {"none", "F16", "F32"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!want(c, cases[i].quick))
            continue;
        int64_t M = cases[i].M, K = cases[i].K, N = cases[i].N, gs = cases[i].group;
        int bias = (int)(i % 3);
        struct kase k;
        kase_begin(&k, c, MMRT_OP_MATMUL, "U4", i, "M=%lld K=%lld N=%lld group=%lld bias=%s",
                   (long long)M, (long long)K, (long long)N, (long long)gs, bias_names[bias]);
        struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(M, K));
        struct kt *w = kt_new(&k, MMRT_DTYPE_U4, SHAPE(N, K / 2));
        struct kt *s = kt_new(&k, MMRT_DTYPE_F32, SHAPE(N, K / gs));
        struct kt *z = kt_new(&k, MMRT_DTYPE_F32, SHAPE(N, K / gs));
        struct kt *b =
            bias ? kt_new(&k, bias == 1 ? MMRT_DTYPE_F16 : MMRT_DTYPE_F32, SHAPE(N)) : NULL;
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(M, N));
        kt_rand(&k, x, -1, 1);
        kt_quantize_u4(&k, w, s, z, gs, 2.0f);
        if (b)
            kt_rand(&k, b, -1, 1);
        kase_run(&k, (const struct kt *[]){x, w, b, s, z}, 5, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- ADD, MUL ---------------------------------------------------------------------------- */

static mmrt_status grid_binary(struct chk *c, enum mmrt_op op, struct mmrt_error *err)
{
    static const struct {
        int64_t R, N;
        int quick;
    } cases[] = {{1, 1, Q}, {7, 13, Q}, {64, 257, 0}, {3, 4099, 0}, {577, 1031, 0}};
    static const char *const mode_names[] = {"same shape", "one row broadcast", "in place",
                                             "in place, one row broadcast"};
    uint64_t serial = 0;
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int mode = 0; mode < 4; mode++, serial++) {
                if (!want(c, cases[i].quick && mode < 2))
                    continue;
                int64_t R = cases[i].R, N = cases[i].N;
                bool bcast = mode % 2 == 1;
                struct kase k;
                kase_begin(&k, c, op, mmrt_dtype_name_of(weight_dts[d]), serial, "[%lld, %lld] %s",
                           (long long)R, (long long)N, mode_names[mode]);
                struct kt *a = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
                struct kt *b = bcast ? kt_new(&k, weight_dts[d], SHAPE(N))
                                     : kt_new(&k, weight_dts[d], SHAPE(R, N));
                struct kt *y = mode >= 2 ? a : kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
                kt_rand(&k, a, -4, 4);
                kt_rand(&k, b, -4, 4);
                kase_run(&k, (const struct kt *[]){a, b}, 2, y, NULL, 0);
                kase_check(&k, y);
                END_CASE();
            }
    /* A 3-D src0 with a one-row [1, 1, N] src1 of its own rank. */
    for (int d = 0; d < 3; d++, serial++) {
        if (!want(c, d == 0))
            continue;
        struct kase k;
        kase_begin(&k, c, op, mmrt_dtype_name_of(weight_dts[d]), serial,
                   "[2, 5, 11] with [1, 1, 11]");
        struct kt *a = kt_new(&k, MMRT_DTYPE_F32, SHAPE(2, 5, 11));
        struct kt *b = kt_new(&k, weight_dts[d], SHAPE(1, 1, 11));
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(2, 5, 11));
        kt_rand(&k, a, -1, 1);
        kt_rand(&k, b, -1, 1);
        kase_run(&k, (const struct kt *[]){a, b}, 2, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- SCALE ------------------------------------------------------------------------------- */

static mmrt_status grid_scale(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t n;
        int quick;
    } sizes[] = {{1, Q}, {7, Q}, {4099, 0}, {100003, 0}};
    static const float scales[] = {0.125f, -3.5f, 0.0f};
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t s = 0; s < 3; s++)
            for (int in_place = 0; in_place < 2; in_place++, serial++) {
                if (!want(c, sizes[i].quick && s != 2))
                    continue;
                int64_t n = sizes[i].n;
                struct kase k;
                kase_begin(&k, c, MMRT_OP_SCALE, "F32", serial, "[%lld] scale %g%s",
                           (long long)n, (double)scales[s], in_place ? " in place" : "");
                struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(n));
                struct kt *y = in_place ? x : kt_new(&k, MMRT_DTYPE_F32, SHAPE(n));
                kt_rand(&k, x, -10, 10);
                struct mmrt_scale_params p = {scales[s]};
                kase_run(&k, (const struct kt *[]){x}, 1, y, &p, sizeof p);
                kase_check(&k, y);
                END_CASE();
            }
    return MMRT_OK;
}

/* ---- activations ------------------------------------------------------------------------- */

static mmrt_status grid_unary(struct chk *c, enum mmrt_op op, struct mmrt_error *err)
{
    static const struct {
        int64_t R, N;
        int quick;
    } cases[] = {{1, 1, Q}, {3, 4099, Q}, {64, 1031, 0}, {7, 11008, 0}};
    /* Tails where naive formulas overflow or lose the limit, and signed zeros. */
    static const float specials[] = {0.0f,  -0.0f, 1e-3f, -1e-3f, 20.0f, -20.0f,
                                     50.0f, -50.0f, -100.0f, 3.0f, -3.0f, 88.0f, -88.0f};
    const int64_t n_special = sizeof specials / sizeof specials[0];
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int in_place = 0; in_place < 2; in_place++, serial++) {
            if (!want(c, cases[i].quick && !in_place))
                continue;
            int64_t R = cases[i].R, N = cases[i].N;
            struct kase k;
            kase_begin(&k, c, op, "F32", serial, "[%lld, %lld]%s", (long long)R, (long long)N,
                       in_place ? " in place" : "");
            struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            struct kt *y = in_place ? x : kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            float *v = kase_floats(&k, R * N);
            if (v) {
                for (int64_t j = 0; j < R * N; j++)
                    v[j] = j < n_special ? specials[j] : kase_float(&k, -8, 8);
                kt_set(&k, x, v);
            }
            kase_run(&k, (const struct kt *[]){x}, 1, y, NULL, 0);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

static mmrt_status grid_swiglu(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t R, N;
        int quick;
    } cases[] = {{1, 1, Q}, {3, 37, Q}, {16, 688, 0}, {7, 11008, 0}};
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int in_place = 0; in_place < 2; in_place++, serial++) {
            if (!want(c, cases[i].quick && !in_place))
                continue;
            int64_t R = cases[i].R, N = cases[i].N;
            struct kase k;
            kase_begin(&k, c, MMRT_OP_SWIGLU, "F32", serial, "[%lld, %lld]%s", (long long)R,
                       (long long)N, in_place ? " in place" : "");
            struct kt *g = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            struct kt *u = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            struct kt *y = in_place ? g : kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            kt_rand(&k, g, -6, 6);
            kt_rand(&k, u, -3, 3);
            kase_run(&k, (const struct kt *[]){g, u}, 2, y, NULL, 0);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- LAYERNORM, RMSNORM ------------------------------------------------------------------ */

static mmrt_status grid_norm(struct chk *c, enum mmrt_op op, struct mmrt_error *err)
{
    static const struct {
        int64_t R, N;
        int quick;
    } cases[] = {{1, 1, Q},   {3, 7, Q},    {17, 64, 0},  {2, 257, 0},
                 {5, 1000, 0}, {2, 4096, Q}, {577, 1024, 0}, {7, 5120, 0}};
    bool ln = op == MMRT_OP_LAYERNORM;
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int mode = 0; mode < 5; mode++, serial++) {
            /* 0 no weights; 1-3 weight (and LN bias) in F32/F16/BF16; 4 in place with an
             * F32 weight only. The data sit at an offset from 0, so the mean matters. */
            if (!want(c, cases[i].quick && (mode == 0 || mode == 2)))
                continue;
            int64_t R = cases[i].R, N = cases[i].N;
            enum mmrt_dtype wdt = mode >= 1 && mode <= 3 ? weight_dts[mode - 1] : MMRT_DTYPE_F32;
            struct mmrt_norm_params p = {mode % 2 ? 1e-5f : 1e-6f};
            struct kase k;
            kase_begin(&k, c, op, mmrt_dtype_name_of(wdt), serial, "[%lld, %lld] %s eps %g",
                       (long long)R, (long long)N,
                       mode == 0 ? "no weight" : mode == 4 ? "in place, weight only"
                       : ln ? "weight and bias" : "weight", (double)p.eps);
            struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            struct kt *w = mode >= 1 ? kt_new(&k, wdt, SHAPE(N)) : NULL;
            struct kt *b = ln && mode >= 1 && mode <= 3 ? kt_new(&k, wdt, SHAPE(N)) : NULL;
            struct kt *y = mode == 4 ? x : kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            kt_rand(&k, x, 1, 5);
            if (w)
                kt_rand(&k, w, -2, 2);
            if (b)
                kt_rand(&k, b, -1, 1);
            kase_run(&k, (const struct kt *[]){x, w, b}, ln ? 3 : 2, y, &p, sizeof p);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- SOFTMAX ----------------------------------------------------------------------------- */

static mmrt_status grid_softmax(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t R, N;
        int quick;
    } cases[] = {{1, 1, Q}, {3, 7, Q}, {5, 64, 0}, {2, 1000, 0}, {1, 4099, Q},
                 {64, 577, 0}, {2, 32000, 0}};
    static const char *const mode_names[] = {"plain", "30% masked with -inf",
                                             "logits near 100", "masked, in place"};
    static const float scales[] = {1.0f, 0.125f, 2.5f};
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int mode = 0; mode < 4; mode++, serial++) {
            if (!want(c, cases[i].quick && mode < 2))
                continue;
            int64_t R = cases[i].R, N = cases[i].N;
            /* Large logits run with scale 1: plugin.h leaves open whether x·scale is rounded
             * before the max is subtracted, which moves outputs by |x·scale|·2⁻²⁴ relative. */
            float scale = mode == 2 ? 1.0f : scales[(i + (size_t)mode) % 3];
            struct kase k;
            kase_begin(&k, c, MMRT_OP_SOFTMAX, "F32", serial, "[%lld, %lld] %s, scale %g",
                       (long long)R, (long long)N, mode_names[mode], (double)scale);
            k.zeros_exact = true; /* -inf inputs give exactly 0 */
            struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            struct kt *y = mode == 3 ? x : kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
            float *v = kase_floats(&k, R * N);
            if (v) {
                float lo = mode == 2 ? 95.0f : -10.0f, hi = mode == 2 ? 105.0f : 10.0f;
                for (int64_t j = 0; j < R * N; j++) {
                    v[j] = kase_float(&k, lo, hi);
                    /* Never a whole row: column 0 stays. */
                    if ((mode == 1 || mode == 3) && j % N != 0 && kase_int(&k, 0, 9) < 3)
                        v[j] = -INFINITY;
                }
                kt_set(&k, x, v);
            }
            struct mmrt_scale_params p = {scale};
            kase_run(&k, (const struct kt *[]){x}, 1, y, &p, sizeof p);
            kase_check(&k, y);
            END_CASE();
        }
    /* A row masked entirely has no distribution: zeros, never NaN. */
    if (want(c, Q)) {
        struct kase k;
        kase_begin(&k, c, MMRT_OP_SOFTMAX, "F32", serial++, "[3, 5] one row all -inf");
        k.zeros_exact = true;
        struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(3, 5));
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(3, 5));
        float v[15] = {1, 2, 3, 4, 5, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -1, -INFINITY, 0.5f, -INFINITY, 2};
        kt_set(&k, x, v);
        struct mmrt_scale_params p = {1.0f};
        kase_run(&k, (const struct kt *[]){x}, 1, y, &p, sizeof p);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- ROPE -------------------------------------------------------------------------------- */

static mmrt_status grid_rope(struct chk *c, struct mmrt_error *err)
{
    enum { CONTIG, IN_PLACE, X_VIEW, VIEW_IN_PLACE };
    static const char *const layout_names[] = {"contiguous", "in place",
                                               "x a view of a fused QKV buffer",
                                               "in place on a view of a fused QKV buffer"};
    static const struct {
        int64_t T, H, D;
        int n_rot, mode, layout;
        float theta;
        int max_pos, quick;
    } cases[] = {
        {5, 4, 64, 64, MMRT_ROPE_NEOX, CONTIG, 10000.0f, 16, Q},
        {3, 2, 8, 4, MMRT_ROPE_NEOX, CONTIG, 25000.0f, 100, Q}, /* partial, Persimmon-like */
        {7, 3, 128, 128, MMRT_ROPE_INTERLEAVED, IN_PLACE, 1e6f, 5000, 0},
        {1, 1, 2, 2, MMRT_ROPE_NEOX, CONTIG, 10000.0f, 3, Q},
        {9, 5, 80, 40, MMRT_ROPE_INTERLEAVED, X_VIEW, 10000.0f, 40000, 0},
        {33, 2, 96, 64, MMRT_ROPE_NEOX, X_VIEW, 500000.0f, 32768, Q},
        {4, 3, 256, 256, MMRT_ROPE_NEOX, IN_PLACE, 10000.0f, 32768, 0},
        {129, 8, 128, 128, MMRT_ROPE_NEOX, VIEW_IN_PLACE, 1e6f, 4096, 0},
        {577, 4, 64, 32, MMRT_ROPE_INTERLEAVED, CONTIG, 10000.0f, 600, 0},
        {17, 7, 96, 96, MMRT_ROPE_INTERLEAVED, VIEW_IN_PLACE, 10000.0f, 1000, 0},
    };
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
        if (!want(c, cases[i].quick))
            continue;
        int64_t T = cases[i].T, H = cases[i].H, D = cases[i].D;
        int layout = cases[i].layout;
        struct kase k;
        kase_begin(&k, c, MMRT_OP_ROPE, "F32", serial,
                   "T=%lld H=%lld D=%lld n_rot=%d %s theta %g pos <= %d, %s", (long long)T,
                   (long long)H, (long long)D, cases[i].n_rot,
                   cases[i].mode == MMRT_ROPE_NEOX ? "NEOX" : "INTERLEAVED",
                   (double)cases[i].theta, cases[i].max_pos, layout_names[layout]);
        struct kt *x, *y;
        if (layout == X_VIEW || layout == VIEW_IN_PLACE) {
            /* x is heads [1, 1 + H) of a [T, H + 2, D] buffer. */
            struct kt *buf = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, H + 2, D));
            x = buf ? kt_view(&k, buf, SHAPE(T, H, D), (const int64_t[]){(H + 2) * D, D, 1}, D)
                    : NULL;
        } else {
            x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, H, D));
        }
        if (layout == IN_PLACE || layout == VIEW_IN_PLACE) {
            y = x;
        } else {
            y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, H, D));
        }
        struct kt *pos = kt_new(&k, MMRT_DTYPE_I32, SHAPE(T));
        int32_t *pv = kase_ints(&k, T);
        if (pv) {
            for (int64_t t = 0; t < T; t++)
                pv[t] = kase_int(&k, 0, cases[i].max_pos); /* not monotonic, like packing */
            pv[0] = cases[i].max_pos;
            kt_set_raw(&k, pos, pv);
        }
        if (x)
            kt_rand(&k, x, -2, 2);
        struct mmrt_rope_params p = {cases[i].theta, cases[i].n_rot, cases[i].mode};
        kase_run(&k, (const struct kt *[]){x, pos}, 2, y, &p, sizeof p);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- ROPE_MULTI -------------------------------------------------------------------------- */

/* Qwen2-VL's M-RoPE (sections 16/24/24 of D = 128, freq_dim D, no restart) and its vision
 * rotary (sections D/4, D/4, freq_dim D/2, restart), then the corners: partial rotation, one
 * and four axes, sections of 0 pairs, odd freq_dim, tiny and odd shapes, large positions,
 * in place and on a view of a fused QKV buffer. Each axis gets its own random positions, so
 * a pair charged to the wrong section or turned at the wrong frequency index fails. */
static mmrt_status grid_rope_multi(struct chk *c, struct mmrt_error *err)
{
    enum { CONTIG, IN_PLACE, X_VIEW, VIEW_IN_PLACE };
    static const char *const layout_names[] = {"contiguous", "in place",
                                               "x a view of a fused QKV buffer",
                                               "in place on a view of a fused QKV buffer"};
    static const struct {
        int64_t T, H, D;
        int n_rot, freq_dim, restart, n_axes, sections[MMRT_ROPE_MAX_AXES];
        float theta;
        int max_pos, layout, quick;
    } cases[] = {
        {7, 4, 128, 128, 128, 0, 3, {16, 24, 24}, 1e6f, 30000, CONTIG, Q},   /* M-RoPE */
        {129, 4, 128, 128, 128, 0, 3, {16, 24, 24}, 1e6f, 4096, VIEW_IN_PLACE, 0},
        {1, 28, 128, 128, 128, 0, 3, {16, 24, 24}, 1e6f, 32768, IN_PLACE, Q}, /* decode */
        {19, 5, 80, 80, 40, 1, 2, {20, 20}, 1e4f, 64, CONTIG, Q},             /* vision */
        {577, 4, 80, 80, 40, 1, 2, {20, 20}, 1e4f, 24, X_VIEW, 0},
        {33, 16, 64, 64, 32, 1, 2, {16, 16}, 1e4f, 30000, IN_PLACE, 0},
        {5, 3, 8, 8, 8, 0, 3, {2, 1, 1}, 1e4f, 100, CONTIG, Q},
        {3, 1, 12, 12, 12, 0, 3, {2, 2, 2}, 1e4f, 30000, IN_PLACE, 0},
        {4, 2, 12, 12, 6, 1, 2, {3, 3}, 1e4f, 50, CONTIG, 0},
        {1, 1, 2, 2, 2, 0, 1, {1}, 1e4f, 3, CONTIG, 0},
        {5, 2, 64, 32, 32, 0, 3, {4, 6, 6}, 1e4f, 1000, CONTIG, Q},          /* partial */
        {3, 3, 24, 16, 8, 1, 2, {4, 4}, 1e4f, 30000, X_VIEW, 0},
        {6, 2, 32, 32, 32, 0, 1, {16}, 1e4f, 30000, CONTIG, 0},               /* one axis */
        {11, 3, 40, 40, 7, 1, 4, {3, 5, 7, 5}, 1e4f, 2000, VIEW_IN_PLACE, Q}, /* four axes */
        {4, 2, 16, 16, 16, 0, 3, {0, 5, 3}, 1e4f, 300, CONTIG, 0},            /* empty section */
        {7, 1, 16, 16, 8, 1, 3, {4, 0, 4}, 1e4f, 300, IN_PLACE, 0},
        {9, 5, 96, 40, 40, 0, 4, {5, 5, 5, 5}, 5e5f, 70000, X_VIEW, 0},
    };
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
        if (!want(c, cases[i].quick))
            continue;
        int64_t T = cases[i].T, H = cases[i].H, D = cases[i].D;
        int layout = cases[i].layout, n_axes = cases[i].n_axes;
        const int *s = cases[i].sections;
        struct kase k;
        kase_begin(&k, c, MMRT_OP_ROPE_MULTI, "F32", serial,
                   "T=%lld H=%lld D=%lld n_rot=%d freq_dim=%d restart=%d sections %d,%d,%d,%d "
                   "theta %g pos <= %d, %s", (long long)T, (long long)H, (long long)D,
                   cases[i].n_rot, cases[i].freq_dim, cases[i].restart, s[0], s[1], s[2], s[3],
                   (double)cases[i].theta, cases[i].max_pos, layout_names[layout]);
        struct kt *x, *y;
        if (layout == X_VIEW || layout == VIEW_IN_PLACE) {
            /* x is heads [1, 1 + H) of a [T, H + 2, D] buffer. */
            struct kt *buf = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, H + 2, D));
            x = buf ? kt_view(&k, buf, SHAPE(T, H, D), (const int64_t[]){(H + 2) * D, D, 1}, D)
                    : NULL;
        } else {
            x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, H, D));
        }
        if (layout == IN_PLACE || layout == VIEW_IN_PLACE)
            y = x;
        else
            y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, H, D));
        struct kt *pos = kt_new(&k, MMRT_DTYPE_I32, SHAPE(T, n_axes));
        int32_t *pv = kase_ints(&k, T * n_axes);
        if (pv) {
            for (int64_t j = 0; j < T * n_axes; j++)
                pv[j] = kase_int(&k, 0, cases[i].max_pos);
            pv[0] = cases[i].max_pos;
            kt_set_raw(&k, pos, pv);
        }
        if (x)
            kt_rand(&k, x, -2, 2);
        struct mmrt_rope_multi_params p = {cases[i].theta, cases[i].n_rot, cases[i].freq_dim,
                                           cases[i].restart, n_axes, {s[0], s[1], s[2], s[3]}};
        kase_run(&k, (const struct kt *[]){x, pos}, 2, y, &p, sizeof p);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- ATTENTION --------------------------------------------------------------------------- */

enum kv_layout {
    KV_DENSE,      /* [S, Hkv, D] */
    KV_CACHE,      /* tokens [3, 3 + S) of a [S + 8, Hkv, D] cache */
    KV_HEAD_MAJOR, /* a [Hkv, S + 5, D] cache seen as [S, Hkv, D] (token stride D) */
    KV_FUSED,      /* k and v interleaved per token in one [S, 2, Hkv, D] buffer */
    KV_QKV,        /* k, v views of one F32 [T, Hq + 2·Hkv, D] QKV buffer (S == T); q, which
                      plugin.h wants contiguous, is a copy of its own */
};

static const char *const kv_layout_names[] = {"dense", "cache view", "head-major cache",
                                              "fused kv", "fused qkv"};

struct attn_case {
    int64_t Hq, Hkv, D;
    int n_seq;            /* 0: no cu_seqlens */
    int32_t lq[5], lk[5]; /* per-sequence lengths (lq[0], lk[0] when n_seq == 0) */
    int causal;
    enum mmrt_dtype kv;
    enum kv_layout layout;
    float q_amp; /* |q| range: larger makes softmax peakier */
    float scale; /* 0: 1/sqrt(D) */
    int quick;
    int window;  /* sliding window (ABI 1.5, causal only); 0 = none */
};

#define F32 MMRT_DTYPE_F32
#define F16 MMRT_DTYPE_F16
#define F8 MMRT_DTYPE_F8E4M3
static const struct attn_case attn_cases[] = {
    /* Hq Hkv D  n_seq lq                lk                 causal kv  layout        amp sc  */
    {4, 4, 64, 0, {7}, {7}, 0, F32, KV_DENSE, 1, 0, Q, 0},
    {8, 2, 80, 0, {33}, {33}, 1, F16, KV_DENSE, 1, 0, 0, 0},
    {4, 2, 128, 0, {1}, {37}, 1, F16, KV_CACHE, 1, 0, Q, 0},              /* decode */
    {32, 8, 128, 0, {1}, {1000}, 1, F16, KV_CACHE, 1, 0, 0, 0},           /* decode, long */
    {28, 4, 128, 0, {1}, {999}, 1, F32, KV_HEAD_MAJOR, 1, 0, 0, 0},       /* GQA 7 */
    {8, 1, 64, 0, {1}, {513}, 1, F32, KV_FUSED, 1, 0, 0, 0},              /* GQA 8 */
    {4, 1, 64, 0, {5}, {20}, 1, F32, KV_HEAD_MAJOR, 1, 0, 0, 0},          /* chunked prefill */
    {2, 2, 256, 3, {5, 1, 12}, {5, 1, 12}, 0, F32, KV_FUSED, 1, 0, 0, 0}, /* vision blocks */
    {6, 3, 8, 5, {3, 1, 0, 4, 5}, {10, 1, 0, 4, 2}, 1, F16, KV_CACHE, 1, 0, Q, 0}, /* empty */
    {2, 1, 64, 0, {300}, {300}, 1, F32, KV_DENSE, 1, 0, 0, 0},            /* long */
    {1, 1, 3, 0, {4}, {9}, 0, F32, KV_DENSE, 1, 0, 0, 0},                 /* odd D */
    {4, 2, 64, 0, {9}, {9}, 1, F32, KV_FUSED, 4, 0.3f, Q, 0},             /* peaky */
    {2, 1, 16, 0, {2}, {0}, 0, F32, KV_DENSE, 1, 0, Q, 0},                /* no keys */
    {8, 2, 128, 0, {16}, {16}, 1, F16, KV_HEAD_MAJOR, 1, 0, 0, 0},        /* GQA 4 */
    {4, 4, 256, 2, {3, 2}, {40, 7}, 1, F16, KV_FUSED, 1, 0, 0, 0},
    {4, 4, 64, 0, {577}, {577}, 0, F32, KV_QKV, 1, 0, 0, 0},              /* CLIP-L/14 @336 */
    {8, 8, 96, 0, {129}, {129}, 1, F16, KV_DENSE, 1, 0, 0, 0},
    {12, 2, 80, 0, {129}, {193}, 1, F32, KV_CACHE, 1, 0, 0, 0},           /* GQA 6, with past */
    {4, 1, 128, 4, {1, 1, 1, 1}, {17, 256, 1, 700}, 1, F16, KV_CACHE, 1, 0, 0, 0}, /* batch */
    {16, 2, 64, 3, {100, 129, 7}, {100, 129, 7}, 1, F32, KV_QKV, 1, 0, 0, 0}, /* packed */
    {8, 8, 256, 0, {7}, {7}, 1, F32, KV_HEAD_MAJOR, 1, 0, 0, 0},
    {2, 2, 96, 2, {7, 7}, {7, 7}, 0, F16, KV_DENSE, 2, 0, Q, 0},
    {16, 16, 64, 0, {577}, {577}, 0, F16, KV_FUSED, 1, 0, 0, 0},          /* all CLIP-L heads */
    /* sliding windows: decode with the window mid-cache, long decode, a prefill with a past
     * over several blocks, window 1, packed sequences with an empty one, GQA 7 */
    {4, 2, 128, 0, {1}, {37}, 1, F16, KV_CACHE, 1, 0, Q, 5},
    {32, 8, 128, 0, {1}, {1000}, 1, F16, KV_CACHE, 1, 0, 0, 257},
    {12, 2, 80, 0, {129}, {193}, 1, F32, KV_CACHE, 1, 0, 0, 31},
    {2, 1, 64, 0, {9}, {9}, 1, F32, KV_FUSED, 1, 0, Q, 1},
    {6, 3, 8, 5, {3, 1, 0, 4, 5}, {10, 1, 0, 4, 2}, 1, F16, KV_CACHE, 1, 0, 0, 3},
    {28, 4, 128, 0, {64}, {999}, 1, F32, KV_HEAD_MAJOR, 1, 0, 0, 100},
    /* FP8 E4M3 K/V (ABI 1.6): decode in a cache, prefill blocks, GQA 4 head-major, a fused
     * buffer with a window, a batch with an empty sequence */
    {4, 2, 128, 0, {1}, {37}, 1, F8, KV_CACHE, 1, 0, Q, 0},
    {8, 2, 80, 0, {33}, {33}, 1, F8, KV_DENSE, 1, 0, Q, 0},
    {8, 2, 128, 0, {16}, {16}, 1, F8, KV_HEAD_MAJOR, 1, 0, 0, 0},
    {4, 4, 256, 2, {3, 2}, {40, 7}, 1, F8, KV_FUSED, 1, 0, 0, 5},
    {6, 3, 8, 5, {3, 1, 0, 4, 5}, {10, 1, 0, 4, 2}, 1, F8, KV_CACHE, 1, 0, 0, 0},
};
#undef F32
#undef F16
#undef F8

/* k or v as the layout places it; `fused` holds the shared allocation between the calls. */
static struct kt *kv_view(struct kase *k, const struct attn_case *ac, int64_t S, int which,
                          struct kt **fused)
{
    int64_t Hkv = ac->Hkv, D = ac->D;
    switch (ac->layout) {
    case KV_DENSE:
        return kt_new(k, ac->kv, SHAPE(S, Hkv, D));
    case KV_CACHE: {
        struct kt *t = kt_new(k, ac->kv, SHAPE(S + 8, Hkv, D));
        return t ? kt_view(k, t, SHAPE(S, Hkv, D), (const int64_t[]){Hkv * D, D, 1}, 3 * Hkv * D)
                 : NULL;
    }
    case KV_HEAD_MAJOR: {
        struct kt *t = kt_new(k, ac->kv, SHAPE(Hkv, S + 5, D));
        return t ? kt_view(k, t, SHAPE(S, Hkv, D), (const int64_t[]){D, (S + 5) * D, 1}, 0)
                 : NULL;
    }
    case KV_FUSED:
        if (!*fused)
            *fused = kt_new(k, ac->kv, SHAPE(S, 2, Hkv, D));
        return *fused ? kt_view(k, *fused, SHAPE(S, Hkv, D),
                                (const int64_t[]){2 * Hkv * D, D, 1}, which * Hkv * D)
                      : NULL;
    case KV_QKV:
    default: {
        int64_t W = ac->Hq + 2 * Hkv;
        return *fused ? kt_view(k, *fused, SHAPE(S, Hkv, D), (const int64_t[]){W * D, D, 1},
                                (ac->Hq + which * Hkv) * D)
                      : NULL;
    }
    }
}

static mmrt_status grid_attention(struct chk *c, struct mmrt_error *err)
{
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++, serial++) {
        const struct attn_case *ac = &attn_cases[i];
        if (!want(c, ac->quick))
            continue;
        int n_seq = ac->n_seq ? ac->n_seq : 1;
        int32_t cu_q[6] = {0}, cu_k[6] = {0};
        char lens[96] = "";
        size_t used = 0;
        for (int s = 0; s < n_seq; s++) {
            cu_q[s + 1] = cu_q[s] + ac->lq[s];
            cu_k[s + 1] = cu_k[s] + ac->lk[s];
            used += (size_t)snprintf(lens + used, sizeof lens - used, "%s%d/%d", s ? "," : "",
                                     ac->lq[s], ac->lk[s]);
        }
        int64_t T = cu_q[n_seq], S = cu_k[n_seq], Hq = ac->Hq, Hkv = ac->Hkv, D = ac->D;
        float scale = ac->scale != 0 ? ac->scale : 1.0f / sqrtf((float)D);
        struct kase k;
        char win[32] = "";
        if (ac->window)
            snprintf(win, sizeof win, ", window %d", ac->window);
        kase_begin(&k, c, MMRT_OP_ATTENTION, mmrt_dtype_name_of(ac->kv), serial,
                   "Hq=%lld Hkv=%lld D=%lld Lq/Lk=%s%s %s%s, %s%s", (long long)Hq, (long long)Hkv,
                   (long long)D, lens, ac->n_seq ? " (cu_seqlens)" : "",
                   ac->causal ? "causal" : "bidirectional", win, kv_layout_names[ac->layout],
                   ac->q_amp > 1 ? ", peaky" : "");
        k.zeros_exact = true; /* a query that sees no key gets exactly 0 */
        struct kt *q, *kk, *vv, *fused = NULL;
        if (ac->layout == KV_QKV)
            fused = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, Hq + 2 * Hkv, D));
        q = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, Hq, D));
        kk = kv_view(&k, ac, S, 0, &fused);
        vv = kv_view(&k, ac, S, 1, &fused);
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, Hq, D));
        struct kt *cq = NULL, *ck = NULL;
        if (ac->n_seq) {
            cq = kt_new(&k, MMRT_DTYPE_I32, SHAPE(n_seq + 1));
            ck = kt_new(&k, MMRT_DTYPE_I32, SHAPE(n_seq + 1));
            if (cq && ck) {
                kt_set_raw(&k, cq, cu_q);
                kt_set_raw(&k, ck, cu_k);
            }
        }
        if (q && kk && vv) {
            kt_rand(&k, q, -ac->q_amp, ac->q_amp);
            kt_rand(&k, kk, -1, 1);
            kt_rand(&k, vv, -1, 1);
        }
        struct mmrt_attention_params p = {scale, ac->causal, n_seq, ac->window};
        kase_run(&k, (const struct kt *[]){q, kk, vv, cq, ck}, ac->n_seq ? 5 : 3, y, &p,
                 sizeof p);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- ATTENTION_PAGED ---------------------------------------------------------------------- */

enum page_order {
    PAGES_IN_ORDER, /* sequence after sequence, in key order */
    PAGES_SHUFFLED, /* every page at a random place of the pool */
    PAGES_SHARED,   /* shuffled, and sequence 1 starts with sequence 0's full pages */
};

struct paged_case {
    int64_t Hq, Hkv, D, pt;
    int n_seq;
    int32_t lq[5], lk[5];
    int causal;
    enum mmrt_dtype kv;
    enum page_order order;
    int quick;
    int window; /* sliding window (ABI 1.5, causal only); 0 = none */
};

#define F32 MMRT_DTYPE_F32
#define F16 MMRT_DTYPE_F16
#define F8 MMRT_DTYPE_F8E4M3
#define I8 MMRT_DTYPE_I8
static const struct paged_case paged_cases[] = {
    /* Hq Hkv D pt n_seq lq               lk                  causal kv order            quick */
    {4, 2, 64, 16, 3, {1, 1, 1}, {37, 16, 1}, 1, F16, PAGES_SHUFFLED, Q, 0}, /* decode, ragged */
    {4, 4, 64, 1, 2, {1, 6}, {5, 6}, 1, F32, PAGES_SHUFFLED, Q, 0},          /* pages of 1 */
    {8, 2, 80, 3, 4, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, F32, PAGES_SHARED, Q, 0}, /* mixed, shared */
    {2, 1, 128, 16, 3, {5, 1, 3}, {0, 40, 3}, 1, F16, PAGES_SHARED, 0, 0},   /* Lk = 0 */
    {6, 3, 8, 3, 2, {7, 4}, {7, 11}, 0, F16, PAGES_IN_ORDER, Q, 0},          /* bidirectional */
    {4, 1, 256, 16, 2, {33, 1}, {70, 129}, 1, F32, PAGES_SHUFFLED, 0, 0},
    {1, 1, 3, 3, 1, {4}, {9}, 0, F32, PAGES_IN_ORDER, 0, 0},                 /* odd D */
    {8, 1, 100, 16, 3, {1, 1, 40}, {300, 17, 64}, 1, F16, PAGES_SHARED, 0, 0},  /* GQA 8 */
    {2, 2, 64, 16, 2, {70, 1}, {200, 90}, 0, F32, PAGES_SHARED, 0, 0},
    {32, 8, 128, 16, 4, {1, 1, 1, 64}, {1000, 513, 37, 200}, 1, F16, PAGES_SHUFFLED, 0, 0},
    {12, 2, 96, 7, 5, {1, 3, 0, 17, 1}, {129, 3, 0, 140, 64}, 1, F32, PAGES_SHUFFLED, 0, 0},
    /* sliding windows: decode rows whose window starts mid-page and one that covers all
     * keys; window 1 over decode and a prefill chunk with shared prefix pages; GQA 8 with a
     * window ≥ some sequences' keys; long decode with a batch */
    {4, 2, 64, 16, 3, {1, 1, 1}, {37, 16, 1}, 1, F16, PAGES_SHUFFLED, Q, 7},
    {8, 2, 80, 3, 4, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, F32, PAGES_SHARED, Q, 1},
    {8, 1, 100, 16, 3, {1, 1, 40}, {300, 17, 64}, 1, F16, PAGES_SHUFFLED, 0, 33},
    {32, 8, 128, 16, 4, {1, 1, 1, 64}, {1000, 513, 37, 200}, 1, F16, PAGES_SHUFFLED, 0, 100},
    /* FP8 E4M3 pages (ABI 1.6): decode over ragged pages, a mixed batch over shared prefix
     * pages, GQA 8 with a window, long decode */
    {4, 2, 64, 16, 3, {1, 1, 1}, {37, 16, 1}, 1, F8, PAGES_SHUFFLED, Q, 0},
    {8, 2, 80, 3, 4, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, F8, PAGES_SHARED, Q, 0},
    {8, 1, 100, 16, 3, {1, 1, 40}, {300, 17, 64}, 1, F8, PAGES_SHUFFLED, 0, 33},
    {32, 8, 128, 16, 4, {1, 1, 1, 64}, {1000, 513, 37, 200}, 1, F8, PAGES_SHUFFLED, 0, 0},
    /* I8 pages with row scales (ABI 1.7): decode over ragged pages, a mixed batch over shared
     * prefix pages, decode with a window that starts mid-page, GQA 8 with a window over shared
     * prefix pages, bidirectional rows with a head dim off every vector width, long decode.
     * Rows nobody reads have a NaN scale, with a window also the pages wholly before it. */
    {4, 2, 64, 16, 3, {1, 1, 1}, {37, 16, 1}, 1, I8, PAGES_SHUFFLED, Q, 0},
    {8, 2, 80, 3, 4, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, I8, PAGES_SHARED, Q, 0},
    {4, 2, 64, 16, 3, {1, 1, 1}, {37, 16, 1}, 1, I8, PAGES_SHUFFLED, Q, 7},
    {8, 1, 100, 16, 3, {1, 1, 40}, {300, 17, 64}, 1, I8, PAGES_SHARED, 0, 33},
    {6, 3, 13, 3, 2, {7, 4}, {7, 11}, 0, I8, PAGES_IN_ORDER, 0, 0},
    {32, 8, 128, 16, 4, {1, 1, 1, 64}, {1000, 513, 37, 200}, 1, I8, PAGES_SHUFFLED, 0, 0},
};

/* The batch-invariance cases: sequence `seq` of a batch (pages of pt, shuffled) run again
 * alone in pages of alone_pt in another order; its rows must be the same bits. */
static const struct {
    struct paged_case batch;
    int seq;
    int64_t alone_pt;
} paged_invariance[] = {
    {{8, 2, 64, 16, 3, {1, 20, 1}, {50, 60, 9}, 1, F16, PAGES_SHUFFLED, Q, 0}, 1, 3},
    {{8, 2, 64, 3, 3, {1, 20, 1}, {50, 60, 9}, 1, F32, PAGES_SHUFFLED, Q, 0}, 0, 1},
    {{4, 4, 128, 1, 2, {40, 1}, {40, 300}, 0, F32, PAGES_SHUFFLED, 0, 0}, 0, 16},
    {{12, 2, 80, 16, 4, {2, 1, 33, 1}, {100, 7, 80, 1}, 1, F16, PAGES_SHUFFLED, 0, 0}, 2, 5},
    {{8, 2, 64, 5, 3, {1, 20, 1}, {50, 60, 9}, 1, F16, PAGES_SHUFFLED, Q, 12}, 1, 16},
    {{12, 2, 80, 16, 4, {2, 1, 33, 1}, {100, 7, 80, 1}, 1, F32, PAGES_SHUFFLED, 0, 9}, 2, 3},
    {{8, 2, 64, 16, 3, {1, 20, 1}, {50, 60, 9}, 1, F8, PAGES_SHUFFLED, Q, 0}, 1, 3},
    {{8, 2, 64, 16, 3, {1, 20, 1}, {50, 60, 9}, 1, I8, PAGES_SHUFFLED, Q, 0}, 1, 3},
    {{12, 2, 80, 16, 4, {2, 1, 33, 1}, {100, 7, 80, 1}, 1, I8, PAGES_SHUFFLED, 0, 9}, 2, 5},
};
#undef F32
#undef F16
#undef F8
#undef I8

/* A case's page table [n_seq, max_pages]: sequence s has ceil(Lk / pt) pages, sequence 1 of a
 * PAGES_SHARED case starts with sequence 0's full pages, entries past a sequence's last page
 * hold INT32_MAX (never read). Ids are 0 … n_pages − 1 with two spare pages, shuffled unless
 * in order. Returns n_pages; *max_pages gets the table's width. NULL table after an error. */
static int64_t paged_table(struct kase *k, const struct paged_case *pc, int64_t *max_pages,
                           int32_t **table)
{
    int64_t used[5], shared[5], distinct = 0;
    *max_pages = 1;
    for (int s = 0; s < pc->n_seq; s++) {
        used[s] = (pc->lk[s] + pc->pt - 1) / pc->pt;
        shared[s] = pc->order == PAGES_SHARED && s == 1
                        ? (pc->lk[1] < pc->lk[0] ? pc->lk[1] : pc->lk[0]) / pc->pt
                        : 0;
        distinct += used[s] - shared[s];
        *max_pages = used[s] + 1 > *max_pages ? used[s] + 1 : *max_pages;
    }
    int64_t n_pages = distinct + 2;
    int32_t *ids = kase_ints(k, n_pages), *t = kase_ints(k, pc->n_seq * *max_pages);
    *table = t;
    if (!ids || !t)
        return n_pages;
    for (int64_t i = 0; i < n_pages; i++)
        ids[i] = (int32_t)i;
    for (int64_t i = n_pages - 1; pc->order != PAGES_IN_ORDER && i > 0; i--) {
        int j = kase_int(k, 0, (int)i);
        int32_t x = ids[i];
        ids[i] = ids[j];
        ids[j] = x;
    }
    int64_t next = 0;
    for (int s = 0; s < pc->n_seq; s++)
        for (int64_t i = 0; i < *max_pages; i++)
            t[s * *max_pages + i] = i < shared[s] ? t[i] : i < used[s] ? ids[next++] : INT32_MAX;
    return n_pages;
}

/* The tensors of one paged launch: q and the index tensors as views of the caller's bases,
 * K and V pools of their own whose rows no sequence reads hold NaN, and for I8 pools their
 * row scales (src6, src7; NULL otherwise). keys(s, j) gives the Hkv · D values of key j of
 * sequence s, or NULL for random ones. */
struct paged_launch {
    struct kt *q, *kp, *vp, *cq, *lens, *table, *y, *ks, *vs;
    int32_t cu[6];
    struct mmrt_attention_params p;
};

/* An I8 page pool: each row of D values (one token's head) quantized by plugin.h's rule into
 * codes and scales, except that a row no sequence reads (NaN in the F32 pool, which the
 * quantizer would store as zeros with scale 0) gets scale NaN, so reading it poisons the
 * result as it does for the float pools. */
static void kt_set_i8_pool(struct kase *k, struct kt *codes, struct kt *scales, const float *v,
                           int64_t rows, int64_t D)
{
    int8_t *q = (int8_t *)kase_ints(k, (rows * D + 3) / 4); /* bytes in int-sized storage */
    float *s = kase_floats(k, rows);
    if (!q || !s)
        return;
    for (int64_t r = 0; r < rows; r++) {
        mmrt_ref_i8_row_quantize(v + r * D, D, q + r * D, &s[r]);
        if (isnan(v[r * D]))
            s[r] = NAN;
    }
    kt_set_raw(k, codes, q);
    kt_set_raw(k, scales, s);
}

/* With a window, a page wholly before the window of every row that could read it is never read
 * (plugin.h); its rows become NaN in the F32 pools (for an I8 pool: a NaN scale). A page is
 * kept when any sequence listing it has a key there at or after its first query's window
 * start, Lk − Lq + 1 − window; a sequence without queries keeps all its pages, since plugin.h
 * promises nothing for it. */
static void paged_poison_unseen(struct kase *k, const struct paged_case *pc, const int32_t *table,
                                int64_t max_pages, int64_t n_pages, float *const *kv)
{
    const int64_t rows = pc->pt * pc->Hkv * pc->D; /* floats per page */
    int32_t *seen = kase_ints(k, n_pages);
    if (!seen)
        return;
    for (int s = 0; s < pc->n_seq; s++) {
        const int64_t j0 = pc->lq[s] ? pc->lk[s] - pc->lq[s] + 1 - pc->window : 0;
        for (int64_t i = 0; i * pc->pt < pc->lk[s]; i++)
            if ((i + 1) * pc->pt > j0)
                seen[table[s * max_pages + i]] = 1;
    }
    for (int64_t pg = 0; pg < n_pages; pg++)
        for (int64_t e = 0; !seen[pg] && e < rows; e++)
            kv[0][pg * rows + e] = kv[1][pg * rows + e] = NAN;
}

static void paged_place(struct kase *k, const struct paged_case *pc, struct kt *q, struct kt *idx,
                        int64_t idx_off, const float *const *kx, const float *const *vx,
                        struct paged_launch *L)
{
    const int64_t row = pc->Hkv * pc->D;
    int64_t max_pages = 1, T = 0;
    int32_t *table = NULL;
    int64_t n_pages = paged_table(k, pc, &max_pages, &table);
    L->cu[0] = 0;
    for (int s = 0; s < pc->n_seq; s++)
        L->cu[s + 1] = L->cu[s] + pc->lq[s];
    T = L->cu[pc->n_seq];
    L->q = q;
    L->kp = kt_new(k, pc->kv, SHAPE(n_pages, pc->pt, pc->Hkv, pc->D));
    L->vp = kt_new(k, pc->kv, SHAPE(n_pages, pc->pt, pc->Hkv, pc->D));
    L->ks = L->vs = NULL;
    if (pc->kv == MMRT_DTYPE_I8) {
        L->ks = kt_new(k, MMRT_DTYPE_F32, SHAPE(n_pages * pc->pt * pc->Hkv));
        L->vs = kt_new(k, MMRT_DTYPE_F32, SHAPE(n_pages * pc->pt * pc->Hkv));
    }
    L->cq = kt_view(k, idx, SHAPE(pc->n_seq + 1), (const int64_t[]){1}, idx_off);
    L->lens = kt_view(k, idx, SHAPE(pc->n_seq), (const int64_t[]){1}, idx_off + pc->n_seq + 1);
    L->table = kt_view(k, idx, SHAPE(pc->n_seq, max_pages), (const int64_t[]){max_pages, 1},
                       idx_off + 2 * pc->n_seq + 1);
    L->y = kt_new(k, MMRT_DTYPE_F32, SHAPE(T, pc->Hq, pc->D));
    float *kv[2] = {kase_floats(k, n_pages * pc->pt * row), kase_floats(k, n_pages * pc->pt * row)};
    if (!table || !kv[0] || !kv[1] || !L->y)
        return;
    for (int w = 0; w < 2; w++)
        for (int64_t i = 0; i < n_pages * pc->pt * row; i++)
            kv[w][i] = NAN;
    for (int s = 0; s < pc->n_seq; s++)
        for (int64_t j = 0; j < pc->lk[s]; j++) {
            float *dst[2];
            for (int w = 0; w < 2; w++)
                dst[w] = kv[w] + ((int64_t)table[s * max_pages + j / pc->pt] * pc->pt + j % pc->pt) * row;
            for (int64_t e = 0; e < row; e++) {
                dst[0][e] = kx && kx[s] ? kx[s][j * row + e] : kase_float(k, -1, 1);
                dst[1][e] = vx && vx[s] ? vx[s][j * row + e] : kase_float(k, -1, 1);
            }
        }
    if (pc->kv == MMRT_DTYPE_I8 && pc->window > 0 && pc->causal)
        paged_poison_unseen(k, pc, table, max_pages, n_pages, kv);
    if (pc->kv == MMRT_DTYPE_I8) {
        kt_set_i8_pool(k, L->kp, L->ks, kv[0], n_pages * pc->pt * pc->Hkv, pc->D);
        kt_set_i8_pool(k, L->vp, L->vs, kv[1], n_pages * pc->pt * pc->Hkv, pc->D);
    } else {
        kt_set(k, L->kp, kv[0]);
        kt_set(k, L->vp, kv[1]);
    }
    int32_t lens[5];
    for (int s = 0; s < pc->n_seq; s++)
        lens[s] = pc->lk[s];
    kt_set_raw(k, L->cq, L->cu);
    kt_set_raw(k, L->lens, lens);
    kt_set_raw(k, L->table, table);
    L->p = (struct mmrt_attention_params){1.0f / sqrtf((float)pc->D), pc->causal, pc->n_seq,
                                          pc->window};
}

static void paged_run(struct kase *k, const struct paged_launch *L)
{
    kase_run(k, (const struct kt *[]){L->q, L->kp, L->vp, L->cq, L->lens, L->table, L->ks, L->vs},
             L->ks ? 8 : 6, L->y, &L->p, sizeof L->p);
}

/* I32 elements the index tensors of a case need: cu_seqlens_q, kv_lens and a table of up to
 * max used pages + 1 columns. */
static int64_t paged_idx_elems(const struct paged_case *pc)
{
    int64_t mp = 1;
    for (int s = 0; s < pc->n_seq; s++)
        mp = (pc->lk[s] + pc->pt - 1) / pc->pt + 1 > mp ? (pc->lk[s] + pc->pt - 1) / pc->pt + 1 : mp;
    return 2 * pc->n_seq + 1 + pc->n_seq * mp;
}

static int paged_desc(char *buf, size_t size, const struct paged_case *pc)
{
    static const char *const orders[] = {"in order", "shuffled", "shared prefix"};
    int used = snprintf(buf, size, "Hq=%lld Hkv=%lld D=%lld pages of %lld (%s) Lq/Lk=",
                        (long long)pc->Hq, (long long)pc->Hkv, (long long)pc->D,
                        (long long)pc->pt, orders[pc->order]);
    for (int s = 0; s < pc->n_seq && used > 0 && (size_t)used < size; s++)
        used += snprintf(buf + used, size - (size_t)used, "%s%d/%d", s ? "," : "", pc->lq[s],
                         pc->lk[s]);
    if (used > 0 && (size_t)used < size)
        used += snprintf(buf + used, size - (size_t)used, " %s",
                         pc->causal ? "causal" : "bidirectional");
    if (pc->window && used > 0 && (size_t)used < size)
        used += snprintf(buf + used, size - (size_t)used, ", window %d", pc->window);
    return used;
}

/* Downloads dst's allocation from device d into a temp buffer (NULL after an error). */
static float *paged_download(struct kase *k, int d, const struct kt *y)
{
    if (k->st != MMRT_OK)
        return NULL;
    const struct kase_base *b = &k->bases[y->base];
    float *v = kase_floats(k, (int64_t)(b->nbytes / sizeof(float)));
    struct mmrt_error e;
    if (v && mmrt_dev_download(k->c->dev[d], &b->dt[d].t, v, b->nbytes, &e) != MMRT_OK) {
        k->st = MMRT_ERR_PLUGIN;
        k->verdict_on_error = d ? CHK_FAIL : CHK_ERROR;
        snprintf(k->res.detail, sizeof k->res.detail, "%.380s", e.msg);
        return NULL;
    }
    return v;
}

static mmrt_status grid_attention_paged(struct chk *c, struct mmrt_error *err)
{
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof paged_cases / sizeof paged_cases[0]; i++, serial++) {
        const struct paged_case *pc = &paged_cases[i];
        if (!want(c, pc->quick))
            continue;
        int64_t T = 0;
        for (int s = 0; s < pc->n_seq; s++)
            T += pc->lq[s];
        char desc[192];
        paged_desc(desc, sizeof desc, pc);
        struct kase k;
        kase_begin(&k, c, MMRT_OP_ATTENTION_PAGED, mmrt_dtype_name_of(pc->kv), serial, "%s", desc);
        k.zeros_exact = true; /* a query that sees no key gets exactly 0 */
        struct kt *q = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, pc->Hq, pc->D));
        struct kt *idx = kt_new(&k, MMRT_DTYPE_I32, SHAPE(paged_idx_elems(pc)));
        kt_rand(&k, q, -1, 1);
        struct paged_launch L;
        paged_place(&k, pc, q, idx, 0, NULL, NULL, &L);
        paged_run(&k, &L);
        kase_check(&k, L.y);
        END_CASE();
    }
    for (size_t i = 0; i < sizeof paged_invariance / sizeof paged_invariance[0]; i++, serial++) {
        const struct paged_case *pb = &paged_invariance[i].batch;
        if (!want(c, pb->quick))
            continue;
        const int x = paged_invariance[i].seq;
        struct paged_case pa = *pb;
        pa.n_seq = 1;
        pa.lq[0] = pb->lq[x];
        pa.lk[0] = pb->lk[x];
        pa.pt = paged_invariance[i].alone_pt;
        char desc[192];
        int used = paged_desc(desc, sizeof desc, pb);
        if (used > 0 && (size_t)used < sizeof desc)
            snprintf(desc + used, sizeof desc - (size_t)used, "; invariance: sequence %d alone in "
                     "pages of %lld", x, (long long)pa.pt);
        struct kase k;
        kase_begin(&k, c, MMRT_OP_ATTENTION_PAGED, mmrt_dtype_name_of(pb->kv), serial, "%s", desc);
        k.zeros_exact = true;
        int64_t T = 0, row = pb->Hkv * pb->D, qrow = pb->Hq * pb->D;
        for (int s = 0; s < pb->n_seq; s++)
            T += pb->lq[s];
        struct kt *qb = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, pb->Hq, pb->D));
        int64_t nb_idx = paged_idx_elems(pb);
        struct kt *idx = kt_new(&k, MMRT_DTYPE_I32, SHAPE(nb_idx + paged_idx_elems(&pa)));
        kt_rand(&k, qb, -1, 1);
        /* Sequence x's keys, the same values in both pools. */
        float *kx = kase_floats(&k, pb->lk[x] * row), *vx = kase_floats(&k, pb->lk[x] * row);
        for (int64_t e = 0; kx && vx && e < pb->lk[x] * row; e++) {
            kx[e] = kase_float(&k, -1, 1);
            vx[e] = kase_float(&k, -1, 1);
        }
        const float *kb[5] = {NULL}, *vb[5] = {NULL}, *ka[1] = {kx}, *va[1] = {vx};
        kb[x] = kx;
        vb[x] = vx;
        struct paged_launch B, A;
        paged_place(&k, pb, qb, idx, 0, kb, vb, &B);
        int64_t q0 = 0;
        for (int s = 0; s < x; s++)
            q0 += pb->lq[s];
        struct kt *qa = qb ? kt_view(&k, qb, SHAPE(pa.lq[0], pa.Hq, pa.D),
                                     (const int64_t[]){qrow, pa.D, 1}, q0 * qrow)
                           : NULL;
        paged_place(&k, &pa, qa, idx, nb_idx, ka, va, &A);
        paged_run(&k, &B);
        paged_run(&k, &A);
        kase_check(&k, B.y);
        kase_check(&k, A.y);
        for (int d = 1; d >= 0; d--) {
            float *yb = paged_download(&k, d, B.y), *ya = paged_download(&k, d, A.y);
            if (!yb || !ya)
                break;
            if (memcmp(yb + q0 * qrow, ya, (size_t)(pa.lq[0] * qrow) * sizeof(float)) != 0) {
                int64_t e = 0;
                while (memcmp(yb + q0 * qrow + e, ya + e, sizeof(float)) == 0)
                    e++;
                k.st = MMRT_ERR_PLUGIN;
                k.verdict_on_error = d ? CHK_FAIL : CHK_ERROR;
                snprintf(k.res.detail, sizeof k.res.detail, "%s: sequence %d's element %lld is "
                         "%.9g in the batch but %.9g alone (must be bit for bit the same)",
                         d ? "plugin" : "reference", x, (long long)e,
                         (double)yb[q0 * qrow + e], (double)ya[e]);
            }
        }
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- GET_ROWS ---------------------------------------------------------------------------- */

static mmrt_status grid_get_rows(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t V, N, T;
        int quick;
    } cases[] = {{1, 1, 1, Q},     {10, 7, 5, Q},     {1000, 64, 33, 0},
                 {32, 4096, 3, 0}, {32000, 64, 17, 0}, {5003, 96, 129, 0}};
    uint64_t serial = 0;
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
            if (!want(c, cases[i].quick))
                continue;
            int64_t V = cases[i].V, N = cases[i].N, T = cases[i].T;
            struct kase k;
            kase_begin(&k, c, MMRT_OP_GET_ROWS, mmrt_dtype_name_of(weight_dts[d]), serial,
                       "table [%lld, %lld], %lld ids", (long long)V, (long long)N, (long long)T);
            struct kt *tab = kt_new(&k, weight_dts[d], SHAPE(V, N));
            struct kt *ids = kt_new(&k, MMRT_DTYPE_I32, SHAPE(T));
            struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(T, N));
            int32_t *iv = kase_ints(&k, T);
            if (iv) {
                for (int64_t t = 0; t < T; t++)
                    iv[t] = kase_int(&k, 0, (int)V - 1);
                iv[0] = (int32_t)V - 1; /* both ends, and a repeat */
                if (T > 2)
                    iv[1] = 0, iv[2] = iv[0];
                kt_set_raw(&k, ids, iv);
            }
            kt_rand(&k, tab, -3, 3);
            kase_run(&k, (const struct kt *[]){tab, ids}, 2, y, NULL, 0);
            kase_check(&k, y);
            END_CASE();
        }
    /* Every F16 / BF16 bit pattern (NaNs, infinities, subnormals) widened to F32. */
    for (int d = 1; d < 3; d++, serial++) {
        if (!want(c, 0))
            continue;
        struct kase k;
        kase_begin(&k, c, MMRT_OP_GET_ROWS, mmrt_dtype_name_of(weight_dts[d]), serial,
                   "every 16-bit pattern: table [1024, 64], 1024 ids reversed");
        struct kt *tab = kt_new(&k, weight_dts[d], SHAPE(1024, 64));
        struct kt *ids = kt_new(&k, MMRT_DTYPE_I32, SHAPE(1024));
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(1024, 64));
        uint16_t *all = (uint16_t *)kase_ints(&k, 65536 / 2);
        int32_t *iv = kase_ints(&k, 1024);
        if (all && iv) {
            for (int j = 0; j < 65536; j++)
                all[j] = (uint16_t)j;
            for (int t = 0; t < 1024; t++)
                iv[t] = 1023 - t;
            kt_set_raw(&k, tab, all);
            kt_set_raw(&k, ids, iv);
        }
        kase_run(&k, (const struct kt *[]){tab, ids}, 2, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- PATCH_EMBED ------------------------------------------------------------------------- */

static mmrt_status grid_patch_embed(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t B, C, H, W, P, O;
        int quick;
    } cases[] = {
        {1, 3, 28, 28, 14, 32, Q}, {2, 3, 14, 21, 7, 5, 0},   {1, 3, 30, 60, 30, 8, 0},
        {1, 1, 4, 4, 1, 3, Q},     {2, 2, 6, 6, 3, 1, 0},     {1, 3, 224, 224, 14, 64, 0},
        {1, 3, 336, 336, 14, 48, 0},
    };
    static const char *const bias_names[] = {"none", "W dtype", "F32"};
    uint64_t serial = 0;
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
            if (!want(c, cases[i].quick))
                continue;
            int64_t B = cases[i].B, C = cases[i].C, H = cases[i].H, W = cases[i].W;
            int64_t P = cases[i].P, O = cases[i].O, nP = (H / P) * (W / P);
            int bias = (int)((i + (size_t)d) % 3);
            enum mmrt_dtype wdt = weight_dts[d];
            struct kase k;
            kase_begin(&k, c, MMRT_OP_PATCH_EMBED, mmrt_dtype_name_of(wdt), serial,
                       "image [%lld, %lld, %lld, %lld] P=%lld O=%lld bias=%s", (long long)B,
                       (long long)C, (long long)H, (long long)W, (long long)P, (long long)O,
                       bias_names[bias]);
            struct kt *img = kt_new(&k, MMRT_DTYPE_F32, SHAPE(B, C, H, W));
            struct kt *w = kt_new(&k, wdt, SHAPE(O, C, P, P));
            struct kt *b = bias ? kt_new(&k, bias == 1 ? wdt : MMRT_DTYPE_F32, SHAPE(O)) : NULL;
            struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(B, nP, O));
            kt_rand(&k, img, -1, 1);
            kt_rand(&k, w, -1, 1);
            if (b)
                kt_rand(&k, b, -1, 1);
            struct mmrt_patch_params p = {(int32_t)P};
            kase_run(&k, (const struct kt *[]){img, w, b}, 3, y, &p, sizeof p);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- CONCAT ------------------------------------------------------------------------------ */

static void fill_any(struct kase *k, struct kt *t, enum mmrt_dtype dt)
{
    if (dt == MMRT_DTYPE_I32)
        kt_rand(k, t, -100000.0f, 100000.0f); /* put_elem truncates to int */
    else
        kt_rand(k, t, -4, 4);
}

static mmrt_status grid_concat(struct chk *c, struct mmrt_error *err)
{
    enum { CONTIG, PADDED, TRANSPOSED };
    static const char *const lay[] = {"contiguous", "padded view", "transposed view"};
    static const struct {
        int n;
        int64_t a[4];
        int64_t b_len; /* src1's extent on the axis */
        int axis, la, lb, quick;
    } cases[] = {
        {2, {3, 7}, 5, 0, CONTIG, CONTIG, Q},
        {2, {4, 3}, 9, 1, CONTIG, PADDED, Q},
        {1, {5}, 3, 0, PADDED, CONTIG, 0},
        {3, {2, 3, 5}, 1, 1, PADDED, TRANSPOSED, 0},
        {3, {2, 3, 5}, 4, 2, TRANSPOSED, PADDED, 0},
        {4, {2, 3, 2, 7}, 2, 3, PADDED, PADDED, 0},
        {4, {2, 3, 2, 7}, 5, 0, CONTIG, TRANSPOSED, 0},
        {2, {100, 1024}, 37, 0, CONTIG, PADDED, 0}, /* image embeddings spliced into text */
        {2, {0, 7}, 5, 0, CONTIG, CONTIG, 0},        /* an empty source */
    };
    static const enum mmrt_dtype dts[] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                          MMRT_DTYPE_I32};
    uint64_t serial = 0;
    for (int d = 0; d < 4; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
            if (!want(c, cases[i].quick))
                continue;
            int n = cases[i].n, axis = cases[i].axis;
            int64_t na[4], nb[4], ny[4];
            for (int j = 0; j < n; j++)
                na[j] = nb[j] = ny[j] = cases[i].a[j];
            nb[axis] = cases[i].b_len;
            ny[axis] = na[axis] + nb[axis];
            enum mmrt_dtype dt = dts[d];
            struct kase k;
            kase_begin(&k, c, MMRT_OP_CONCAT, mmrt_dtype_name_of(dt), serial,
                       "rank %d axis %d, %lld + %lld on the axis, src0 %s, src1 %s", n, axis,
                       (long long)na[axis], (long long)nb[axis], lay[cases[i].la],
                       lay[cases[i].lb]);
            struct kt *src[2];
            for (int s = 0; s < 2; s++) {
                const int64_t *ne = s ? nb : na;
                int l = s ? cases[i].lb : cases[i].la;
                int perm[4] = {0, 1, 2, 3};
                if (n >= 2) { /* swap the last two dims */
                    perm[n - 1] = n - 2;
                    perm[n - 2] = n - 1;
                }
                src[s] = l == CONTIG ? kt_new(&k, dt, n, ne)
                         : l == PADDED ? kt_padded(&k, dt, n, ne, 2)
                                       : kt_permuted(&k, dt, n, ne, perm);
                if (src[s])
                    fill_any(&k, src[s], dt);
            }
            struct kt *y = kt_new(&k, dt, n, ny);
            struct mmrt_concat_params p = {axis};
            kase_run(&k, (const struct kt *[]){src[0], src[1]}, 2, y, &p, sizeof p);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- COPY -------------------------------------------------------------------------------- */

/* F32 values whose conversions are easy to get wrong: signed zero, F16 subnormals and
 * overflow, round-to-nearest-even ties for F16 (1 + 2⁻¹¹, 1 + 3·2⁻¹¹) and BF16 (1 + 2⁻⁸,
 * 1 + 3·2⁻⁸), values that vanish in F16 but not in BF16, BF16 overflow. */
static const float copy_specials[] = {
    0.0f, -0.0f, 1e-6f, -3e-7f, 6.1e-5f, 65504.0f, 65519.0f, 65520.0f, -70000.0f,
    1.00048828125f, 1.00146484375f, 1.00390625f, 1.01171875f, -1.00048828125f,
    1e-30f, 3.4e38f, -3.39e38f, 0.1f, 1.0f / 3.0f, 2048.5f,
};

enum copy_layout {
    CP_CONTIG,      /* [37, 129] → [37, 129] */
    CP_TRANSPOSE,   /* src [37, 129] read transposed from a [129, 37] allocation */
    CP_PERMUTE3,    /* [T, H, D] seen as [H, T, D] → contiguous [H, T, D] */
    CP_PERMUTE4,    /* [2, 5, 3, 7] read from [2, 3, 5, 7] */
    CP_REVERSE4,    /* all four dims reversed: the innermost source stride is not 1 */
    CP_KV_WRITE,    /* contiguous [S, Hkv, D] into tokens [11, 11 + S) of a cache */
    CP_KV_HEADMAJ,  /* contiguous [S, Hkv, D] into a head-major [Hkv, cap, D] cache */
    CP_DST_STRIDED, /* contiguous [33, 65] into a transposed dst */
    CP_PADDED,      /* padded source and padded destination */
    CP_ONE,         /* a single element */
    CP_EMPTY,       /* zero elements */
    CP_N
};
static const char *const copy_layout_names[] = {
    "contiguous [37, 129]", "transposed source [37, 129]", "[T, H, D] -> [H, T, D] (17, 6, 80)",
    "4-D permute (0, 2, 1, 3)", "4-D reversed dims", "KV-cache write [9, 4, 64] at token 11",
    "head-major KV-cache write [9, 4, 64]", "transposed destination [33, 65]",
    "padded source and destination [3, 5, 7, 11]", "one element", "empty [0, 5]",
};

static mmrt_status grid_copy(struct chk *c, struct mmrt_error *err)
{
    static const enum mmrt_dtype dts[] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16};
    uint64_t serial = 0;
    for (int sd = 0; sd < 4; sd++)
        for (int dd = 0; dd < 4; dd++)
            for (int l = 0; l < CP_N; l++, serial++) {
                /* I32 copies only to I32. */
                if ((sd == 3) != (dd == 3))
                    continue;
                enum mmrt_dtype sdt = sd == 3 ? MMRT_DTYPE_I32 : dts[sd];
                enum mmrt_dtype ddt = dd == 3 ? MMRT_DTYPE_I32 : dts[dd];
                if (!want(c, (l == CP_CONTIG || (l == CP_KV_WRITE && sd == 0 && dd == 1))))
                    continue;
                char label[48];
                snprintf(label, sizeof label, "%s->%s", mmrt_dtype_name_of(sdt),
                         mmrt_dtype_name_of(ddt));
                struct kase k;
                kase_begin(&k, c, MMRT_OP_COPY, label, serial, "%s", copy_layout_names[l]);
                struct kt *s = NULL, *y = NULL;
                switch ((enum copy_layout)l) {
                case CP_CONTIG:
                    s = kt_new(&k, sdt, SHAPE(37, 129));
                    y = kt_new(&k, ddt, SHAPE(37, 129));
                    break;
                case CP_TRANSPOSE:
                    s = kt_permuted(&k, sdt, SHAPE(37, 129), (const int[]){1, 0});
                    y = kt_new(&k, ddt, SHAPE(37, 129));
                    break;
                case CP_PERMUTE3:
                    s = kt_permuted(&k, sdt, SHAPE(6, 17, 80), (const int[]){1, 0, 2});
                    y = kt_new(&k, ddt, SHAPE(6, 17, 80));
                    break;
                case CP_PERMUTE4:
                    s = kt_permuted(&k, sdt, SHAPE(2, 5, 3, 7), (const int[]){0, 2, 1, 3});
                    y = kt_new(&k, ddt, SHAPE(2, 5, 3, 7));
                    break;
                case CP_REVERSE4:
                    s = kt_permuted(&k, sdt, SHAPE(3, 4, 5, 6), (const int[]){3, 2, 1, 0});
                    y = kt_new(&k, ddt, SHAPE(3, 4, 5, 6));
                    break;
                case CP_KV_WRITE: {
                    s = kt_new(&k, sdt, SHAPE(9, 4, 64));
                    struct kt *cache = kt_new(&k, ddt, SHAPE(32, 4, 64));
                    y = cache ? kt_view(&k, cache, SHAPE(9, 4, 64),
                                        (const int64_t[]){4 * 64, 64, 1}, 11 * 4 * 64)
                              : NULL;
                    break;
                }
                case CP_KV_HEADMAJ: {
                    s = kt_new(&k, sdt, SHAPE(9, 4, 64));
                    struct kt *cache = kt_new(&k, ddt, SHAPE(4, 20, 64));
                    y = cache ? kt_view(&k, cache, SHAPE(9, 4, 64),
                                        (const int64_t[]){64, 20 * 64, 1}, 5 * 64)
                              : NULL;
                    break;
                }
                case CP_DST_STRIDED:
                    s = kt_new(&k, sdt, SHAPE(33, 65));
                    y = kt_permuted(&k, ddt, SHAPE(33, 65), (const int[]){1, 0});
                    break;
                case CP_PADDED:
                    s = kt_padded(&k, sdt, SHAPE(3, 5, 7, 11), 1);
                    y = kt_padded(&k, ddt, SHAPE(3, 5, 7, 11), 2);
                    break;
                case CP_ONE:
                    s = kt_new(&k, sdt, SHAPE(1));
                    y = kt_new(&k, ddt, SHAPE(1));
                    break;
                case CP_EMPTY:
                case CP_N:
                    s = kt_new(&k, sdt, SHAPE(0, 5));
                    y = kt_new(&k, ddt, SHAPE(0, 5));
                    break;
                }
                if (s && sdt == MMRT_DTYPE_I32) {
                    int32_t *iv = kase_ints(&k, kt_numel(s));
                    if (iv) {
                        for (int64_t j = 0; j < kt_numel(s); j++) {
                            uint32_t u = (uint32_t)kase_bits(&k);
                            memcpy(&iv[j], &u, 4);
                        }
                        if (kt_numel(s) >= 2)
                            iv[0] = INT32_MIN, iv[1] = INT32_MAX;
                        kt_set_raw(&k, s, iv);
                    }
                } else if (s) {
                    int64_t n = kt_numel(s), ns = sizeof copy_specials / sizeof copy_specials[0];
                    float *v = kase_floats(&k, n);
                    if (v) {
                        for (int64_t j = 0; j < n; j++)
                            v[j] = j < ns ? copy_specials[j] : kase_float(&k, -4, 4);
                        kt_set(&k, s, v);
                    }
                }
                kase_run(&k, (const struct kt *[]){s}, 1, y, NULL, 0);
                kase_check(&k, y);
                END_CASE();
            }
    /* Every F16 / BF16 bit pattern converted to the other two float dtypes. */
    for (int sd = 1; sd < 3; sd++)
        for (int dd = 0; dd < 3; dd++, serial++) {
            if (sd == dd || !want(c, 0))
                continue;
            char label[48];
            snprintf(label, sizeof label, "%s->%s", mmrt_dtype_name_of(dts[sd]),
                     mmrt_dtype_name_of(dts[dd]));
            struct kase k;
            kase_begin(&k, c, MMRT_OP_COPY, label, serial, "every 16-bit pattern [256, 256]");
            struct kt *s = kt_new(&k, dts[sd], SHAPE(256, 256));
            struct kt *y = kt_new(&k, dts[dd], SHAPE(256, 256));
            uint16_t *all = (uint16_t *)kase_ints(&k, 65536 / 2);
            if (all) {
                for (int j = 0; j < 65536; j++)
                    all[j] = (uint16_t)j;
                kt_set_raw(&k, s, all);
            }
            kase_run(&k, (const struct kt *[]){s}, 1, y, NULL, 0);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- ARGMAX ------------------------------------------------------------------------------ */

static mmrt_status grid_argmax(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t R, N;
        int quick;
    } cases[] = {{1, 1, Q},     {3, 7, Q},      {9, 1000, Q},
                 {2, 32000, 0}, {3, 151936, 0}, {64, 4099, 0}};
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
        if (!want(c, cases[i].quick))
            continue;
        int64_t R = cases[i].R, N = cases[i].N;
        struct kase k;
        kase_begin(&k, c, MMRT_OP_ARGMAX, "F32", serial,
                   "[%lld, %lld]: distinct values, exact ties, NaN, -inf, max at either end",
                   (long long)R, (long long)N);
        struct kt *x = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
        struct kt *y = kt_new(&k, MMRT_DTYPE_I32, SHAPE(R));
        float *v = kase_floats(&k, R * N);
        if (v) {
            for (int64_t r = 0; r < R; r++) {
                float *row = v + r * N;
                for (int64_t j = 0; j < N; j++)
                    row[j] = kase_float(&k, -10, 10);
                int64_t at = kase_int(&k, 0, (int)N - 1);
                switch (r % 6) {
                case 1: at = 0; break;
                case 2: at = N - 1; break;
                default: break;
                }
                row[at] = 11.0f + (float)r; /* a clear maximum … */
                if (r % 6 == 3 && N > 2) {  /* … or an exact tie: the first one wins */
                    int64_t second = kase_int(&k, 0, (int)N - 1);
                    if (second != at)
                        row[second] = row[at];
                }
                if (r % 6 == 4) /* NaN is never chosen, wherever it sits */
                    for (int64_t j = 0; j < N; j += 3)
                        if (j != at)
                            row[j] = NAN;
                if (r % 6 == 5)
                    for (int64_t j = 1; j < N; j += 2)
                        if (j != at)
                            row[j] = -INFINITY;
            }
            kt_set(&k, x, v);
        }
        kase_run(&k, (const struct kt *[]){x}, 1, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

/* ---- SET_ROWS ---------------------------------------------------------------------------- */

/* The KV-cache write: one decode token, a prefill's worth of rows, every row of a small dst
 * in permuted order, scalar rows and a 4-D row; indices one past the end, negative and at
 * the int32 limits must write nothing (dst starts with random values, so an untouched row
 * is checked too). Values start with the F16/BF16 rounding edge cases. Indices are distinct:
 * plugin.h leaves equal indices' winner open. */
static const float set_rows_specials[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.00048828125f /* 1 + 2^-11: to even */,
    1.00146484375f /* 1 + 3·2^-11: up */, 65504.0f, 65519.99f, 65520.0f /* → inf in F16 */,
    6.0975552e-05f /* just below 2^-14 */, 2.9802322e-08f /* 2^-25: to 0 */,
    1.0039062f /* 1 + 2^-8: BF16 halfway */, 1.0117188f /* 1 + 3·2^-8 */, 3.4028235e38f,
    /* F8E4M3: 448, the tie above it (→ 448), 480 (saturates), 1 + 2^-4 (tie → 1), 2^-10
     * (tie → 0), 3·2^-10 (tie → 2·2^-9), just below 2^-6 (→ the smallest normal) */
    448.0f, 464.0f, 480.0f, 1.0625f, 0.0009765625f, 0.0029296875f, 0.015624999f,
};

/* dst [R, …] of each case, the T rows written; the first R indices are distinct (a shuffled
 * prefix), and for T > 2 indices 1 and 2 lie outside [0, R). */
static const struct {
    int n_dims;
    int64_t ne[4];
    int64_t T;
    int quick;
} set_rows_cases[] = {
    {3, {16, 4, 8}, 1, Q},   {3, {4096, 8, 128}, 1, 0}, {2, {7, 33}, 5, Q},
    {1, {9}, 6, 0},          {4, {40, 2, 3, 5}, 9, 0},  {2, {64, 128}, 64, Q},
    {3, {300, 2, 64}, 129, 0}, {2, {1, 1}, 1, 0},
};

static void set_rows_indices(struct kase *k, int32_t *iv, int64_t R, int64_t T, size_t i)
{
    static const int32_t outside[] = {-1, INT32_MIN, INT32_MAX, -1000};
    for (int64_t r = 0; r < R; r++)
        iv[r] = (int32_t)r;
    for (int64_t r = R - 1; r > 0; r--) {
        int64_t j = kase_int(k, 0, (int)r);
        int32_t t = iv[r];
        iv[r] = iv[j];
        iv[j] = t;
    }
    if (T > 2) {
        iv[1] = (int32_t)R;
        iv[2] = outside[i % 4];
    }
}

/* Row number w of those an I8 SET_ROWS writes (x: D random values in ±5) turned into one of
 * the quantizer's edges, w taking them in turn, or scaled to a magnitude from 2^-30 to 2^10. */
static void i8_edge_row(struct kase *k, float *x, int64_t D, int64_t w)
{
    static const float tie[] = {127.0f, 2.5f, 3.5f, -0.5f, -1.5f, 126.5f, -126.5f, 0.5f};
    switch (w % 13) {
    case 0: /* zeros of both signs: scale +0, codes 0 */
        for (int64_t i = 0; i < D; i++)
            x[i] = i % 2 ? -0.0f : 0.0f;
        break;
    case 1: /* a NaN is left out of amax and gets code 0 */
        x[D / 2] = NAN;
        break;
    case 2: /* an infinity: scale +inf and every code 0, so the row reads back as NaN */
        x[D - 1] = w % 2 ? -INFINITY : INFINITY;
        break;
    case 3: /* amax 127: the scale is exactly 1 and x / s lands on halves (ties to even) */
        for (int64_t i = 0; i < D; i++)
            x[i] = i < 8 ? tie[i] : (float)(i % 254 - 127) + 0.5f;
        break;
    case 4: /* amax 381: scale 3, halves again, through a division that is not a shift */
        for (int64_t i = 0; i < D; i++)
            x[i] = i == 0 ? -381.0f : 3.0f * ((float)(i % 254 - 127) + 0.5f);
        break;
    case 5: /* a subnormal amax, so a subnormal scale */
        for (int64_t i = 0; i < D; i++)
            x[i] = (float)(i % 5 - 2) * 0x1p-133f;
        break;
    case 6: /* amax 2^-148: amax / 127 underflows to 0, x / 0 is ±inf (±127) or NaN (0) */
        for (int64_t i = 0; i < D; i++)
            x[i] = (float)(i % 5 - 2) * 0x1p-149f;
        break;
    case 7: /* near FLT_MAX, amax FLT_MAX itself */
        for (int64_t i = 0; i < D; i++)
            x[i] = kase_float(k, -1, 1) * 3.4e38f;
        x[0] = FLT_MAX;
        break;
    case 8: /* nothing but NaN: amax 0, scale 0, codes 0 */
        for (int64_t i = 0; i < D; i++)
            x[i] = NAN;
        break;
    case 9: /* both infinities and a NaN */
        if (D > 2)
            x[D / 2] = NAN;
        x[0] = -INFINITY;
        x[D - 1] = INFINITY;
        break;
    default:
        for (int64_t i = 0; i < D; i++)
            x[i] = ldexpf(x[i], (int)(w % 41) - 30);
    }
}

/* SET_ROWS into an I8 store with row scales (plugin.h, ABI 1.7), the row (SET_ROWS, I8): the
 * shapes of rank ≥ 2 above (the scales are per innermost row). The scales, src2, are a view
 * one element into an F32 allocation two longer, so a write past them shows; the rows written
 * take turns at the quantizer's edges (i8_edge_row), and those left alone — by an index
 * outside [0, R) or by none — must keep their random codes and scales. Codes and scales are
 * plugin.h's bits: the reference's are held to the checker's quantizer, the plugin's to the
 * reference's. */
static mmrt_status set_rows_i8(struct chk *c, size_t i, uint64_t serial, struct mmrt_error *err)
{
    const int nd = set_rows_cases[i].n_dims;
    const int64_t *ne = set_rows_cases[i].ne, R = ne[0], T = set_rows_cases[i].T, D = ne[nd - 1];
    int64_t n = 1, vne[4], sne[3], snb[3];
    for (int j = 1; j < nd; j++)
        n *= ne[j];
    const int64_t per = n / D; /* scales per dst row */
    memcpy(vne, ne, sizeof vne);
    vne[0] = T;
    for (int64_t j = nd - 2, stride = 1; j >= 0; stride *= ne[j], j--) {
        sne[j] = ne[j];
        snb[j] = stride;
    }
    struct kase k;
    kase_begin(&k, c, MMRT_OP_SET_ROWS, mmrt_dtype_name_of(MMRT_DTYPE_I8), serial,
               "%lld rows of %lld into [%lld, …] (%d dims), %lld row scales%s", (long long)T,
               (long long)n, (long long)R, nd, (long long)(R * per),
               T > 2 ? ", 2 out of range" : "");
    struct kt *v = kt_new(&k, MMRT_DTYPE_F32, nd, vne);
    struct kt *idx = kt_new(&k, MMRT_DTYPE_I32, SHAPE(T));
    struct kt *y = kt_new(&k, MMRT_DTYPE_I8, nd, ne);
    struct kt *sbase = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R * per + 2));
    struct kt *sc = sbase ? kt_view(&k, sbase, nd - 1, sne, snb, 1) : NULL;
    int32_t *iv = kase_ints(&k, R > T ? R : T);
    float *vv = kase_floats(&k, T * n), *old_s = kase_floats(&k, R * per),
          *want_s = kase_floats(&k, R * per);
    int8_t *old_q = (int8_t *)kase_ints(&k, (R * n + 3) / 4), /* bytes in int-sized storage */
        *want_q = (int8_t *)kase_ints(&k, (R * n + 3) / 4);
    if (iv && vv && old_s && want_s && old_q && want_q) {
        set_rows_indices(&k, iv, R, T, i);
        kt_set_raw(&k, idx, iv);
        for (int64_t j = 0; j < R * n; j++)
            old_q[j] = (int8_t)kase_int(&k, -127, 127);
        for (int64_t j = 0; j < R * per; j++)
            old_s[j] = kase_float(&k, -4, 4);
        memcpy(want_q, old_q, (size_t)(R * n));
        memcpy(want_s, old_s, (size_t)(R * per) * sizeof(float));
        for (int64_t j = 0; j < T * n; j++)
            vv[j] = kase_float(&k, -5, 5);
        for (int64_t t = 0, w = (int64_t)i; t < T; t++) {
            if (iv[t] < 0 || iv[t] >= R)
                continue;
            for (int64_t j = 0; j < per; j++, w++) {
                float *x = vv + (t * per + j) * D;
                i8_edge_row(&k, x, D, w);
                mmrt_ref_i8_row_quantize(x, D, want_q + (iv[t] * per + j) * D,
                                    &want_s[iv[t] * per + j]);
            }
        }
        kt_set(&k, v, vv);
        kt_set_raw(&k, y, old_q);
        kt_set_raw(&k, sc, old_s);
    }
    kase_run(&k, (const struct kt *[]){v, idx, sc}, 3, y, NULL, 0);
    kase_expect(&k, y, want_q);
    kase_expect(&k, sc, want_s);
    kase_check(&k, y);
    kase_check(&k, sc);
    return kase_end(&k, err);
}

static mmrt_status grid_set_rows(struct chk *c, struct mmrt_error *err)
{
    const size_t n_cases = sizeof set_rows_cases / sizeof set_rows_cases[0];
    uint64_t serial = 0;
    for (int d = 0; d < 5; d++)
        for (size_t i = 0; i < n_cases; i++, serial++) {
            if (!want(c, set_rows_cases[i].quick))
                continue;
            if (kv_table_dts[d] == MMRT_DTYPE_I8) {
                mmrt_status st = set_rows_cases[i].n_dims < 2 ? MMRT_OK
                                                              : set_rows_i8(c, i, serial, err);
                if (st != MMRT_OK)
                    return st;
                continue;
            }
            int nd = set_rows_cases[i].n_dims;
            int64_t R = set_rows_cases[i].ne[0], T = set_rows_cases[i].T, n = 1, vne[4];
            for (int j = 1; j < nd; j++)
                n *= set_rows_cases[i].ne[j];
            memcpy(vne, set_rows_cases[i].ne, sizeof vne);
            vne[0] = T;
            struct kase k;
            kase_begin(&k, c, MMRT_OP_SET_ROWS, mmrt_dtype_name_of(kv_table_dts[d]), serial,
                       "%lld rows of %lld into [%lld, …] (%d dims)%s", (long long)T,
                       (long long)n, (long long)R, nd, T > 2 ? ", 2 out of range" : "");
            struct kt *v = kt_new(&k, MMRT_DTYPE_F32, nd, vne);
            struct kt *idx = kt_new(&k, MMRT_DTYPE_I32, SHAPE(T));
            struct kt *y = kt_new(&k, kv_table_dts[d], nd, set_rows_cases[i].ne);
            int32_t *iv = kase_ints(&k, R > T ? R : T);
            float *vv = kase_floats(&k, T * n);
            if (iv && vv) {
                set_rows_indices(&k, iv, R, T, i);
                kt_set_raw(&k, idx, iv);
                int64_t ns = sizeof set_rows_specials / sizeof set_rows_specials[0];
                for (int64_t j = 0; j < T * n; j++)
                    vv[j] = j < ns ? set_rows_specials[j] : kase_float(&k, -5, 5);
                if (kv_table_dts[d] == MMRT_DTYPE_F8E4M3) /* a third among FP8 subnormals */
                    for (int64_t j = ns; j < T * n; j += 3)
                        vv[j] *= 0x1.0p-10f;
                kt_set(&k, v, vv);
            }
            if (y)
                kt_rand(&k, y, -100, 100);
            kase_run(&k, (const struct kt *[]){v, idx}, 2, y, NULL, 0);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- GATHER_HEADS ------------------------------------------------------------------------ */

/* Table rows (R · H of D values) to codes and scales; row r, in turn: all zero (scale 0),
 * tiny (a subnormal scale: products the device must not flush), holding an infinity (scale
 * +inf: the row reads as NaN), or scaled by 2^-4 … 2^4 so the rows' scales differ. */
static void gather_i8_table(float *v, int64_t rows, int64_t D, int8_t *q, float *s)
{
    for (int64_t r = 0; r < rows; r++) {
        float *x = v + r * D;
        for (int64_t i = 0; i < D; i++)
            x[i] = r % 11 == 5 ? 0.0f : r % 13 == 7 ? x[i] * 0x1p-130f
                                                     : ldexpf(x[i], (int)(r % 9) - 4);
        if (r % 17 == 9)
            x[D / 2] = INFINITY;
        mmrt_ref_i8_row_quantize(x, D, q + r * D, &s[r]);
    }
}

/* plugin.h's GATHER_HEADS on an I8 table, as the checker reads it: each kept element widened
 * to (float)code · scale, one rounded product (a statement of its own, which ISO C does not
 * contract into the sum), the rows added in g order, one division by the count when it is 2 or
 * more, and +0 for a group that keeps nothing. */
static void gather_i8_want(const int8_t *q, const float *s, const int32_t *idx, int64_t R,
                           int64_t H, int64_t D, int64_t N, int64_t G, float *y)
{
    for (int64_t nh = 0; nh < N * H; nh++) {
        float *out = y + nh * D;
        int kept = 0;
        for (int64_t g = 0; g < G; g++) {
            const int32_t r = idx[nh * G + g];
            if (r < 0 || r >= R)
                continue;
            const int64_t row = (int64_t)r * H + nh % H;
            for (int64_t e = 0; e < D; e++) {
                const float x = (float)q[row * D + e] * s[row];
                out[e] = kept ? out[e] + x : x;
            }
            kept++;
        }
        for (int64_t e = 0; e < D; e++)
            out[e] = kept == 0 ? 0.0f : kept == 1 ? out[e] : out[e] / (float)kept;
    }
}

/* Image-token KV compression: rows kept one by one (G = 1: any order, repeats) and pooled
 * groups (G = 2, 4, 9) that are ragged (−1 and INT32_MIN padding), one group that is all
 * padding (zeros), and entries R, R + 1 and INT32_MAX that must be skipped like padding. The
 * table is the first R rows of an allocation whose two rows past R are never written (NaN),
 * so reading an entry that should have been skipped poisons the result; its first value is −0,
 * which a G = 1 copy keeps. Head dims 1, 7, 40 (off every vector width), 64, 128, 257.
 * Bit-exact: plugin.h fixes the order of the f32 additions and the one division.
 *
 * An I8 table (ABI 1.7) holds such values reshaped by rows and quantized (gather_i8_table),
 * with its scales as src2: the first R · H of an allocation whose 2 · H past them stay NaN, so
 * a row past R reads as NaN here too (an I8 row has no −0). plugin.h fixes every bit from the
 * codes and scales, so the reference is held to the checker's model (gather_i8_want) too. */
static mmrt_status grid_gather_heads(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int64_t R, H, D, N, G;
        int quick;
    } cases[] = {
        {1, 1, 1, 1, 1, Q},     {64, 8, 128, 40, 1, Q}, {64, 2, 40, 17, 4, Q},
        {300, 4, 128, 33, 9, 0}, {16, 3, 7, 9, 4, 0},   {576, 8, 128, 144, 4, 0},
        {50, 1, 257, 5, 2, 0},   {5, 2, 64, 8, 9, 0},
    };
    uint64_t serial = 0;
    for (int d = 0; d < 5; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
            if (!want(c, cases[i].quick))
                continue;
            const int64_t R = cases[i].R, H = cases[i].H, D = cases[i].D, N = cases[i].N,
                          G = cases[i].G;
            const bool i8 = kv_table_dts[d] == MMRT_DTYPE_I8;
            struct kase k;
            kase_begin(&k, c, MMRT_OP_GATHER_HEADS, mmrt_dtype_name_of(kv_table_dts[d]), serial,
                       "table [%lld, %lld, %lld], idx [%lld, %lld, %lld]%s", (long long)R,
                       (long long)H, (long long)D, (long long)N, (long long)H, (long long)G,
                       G > 1 ? ", ragged" : "");
            struct kt *base = kt_new(&k, kv_table_dts[d], SHAPE(R + 2, H, D));
            struct kt *tab =
                base ? kt_view(&k, base, SHAPE(R, H, D), (const int64_t[]){H * D, D, 1}, 0) : NULL;
            struct kt *sbase = i8 ? kt_new(&k, MMRT_DTYPE_F32, SHAPE((R + 2) * H)) : NULL;
            struct kt *sc =
                sbase ? kt_view(&k, sbase, SHAPE(R * H), (const int64_t[]){1}, 0) : NULL;
            struct kt *idx = kt_new(&k, MMRT_DTYPE_I32, SHAPE(N, H, G));
            struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(N, H, D));
            float *tv = kase_floats(&k, R * H * D);
            int32_t *iv = kase_ints(&k, N * H * G);
            int8_t *tq = i8 ? (int8_t *)kase_ints(&k, (R * H * D + 3) / 4) : NULL;
            float *ts = i8 ? kase_floats(&k, R * H) : NULL, *want_y = NULL;
            if (tv && iv && (!i8 || (tq && ts))) {
                for (int64_t j = 0; j < R * H * D; j++)
                    tv[j] = kase_float(&k, -100, 100);
                tv[0] = -0.0f;
                if (i8) {
                    gather_i8_table(tv, R * H, D, tq, ts);
                    kt_set_raw(&k, tab, tq);
                    kt_set_raw(&k, sc, ts);
                } else {
                    kt_set(&k, tab, tv);
                }
                static const int32_t skipped[] = {-1, INT32_MIN, -1, INT32_MAX};
                for (int64_t r = 0; r < N * H; r++) {
                    int32_t *grp = iv + r * G;
                    int keep = G > 1 ? kase_int(&k, 1, (int)G) : 1;
                    for (int64_t g = 0; g < G; g++)
                        grp[g] = g < keep ? kase_int(&k, 0, (int)R - 1) : -1;
                    for (int64_t g = G - 1; g > 0; g--) { /* padding anywhere in the group */
                        int64_t j = kase_int(&k, 0, (int)g);
                        int32_t t = grp[g];
                        grp[g] = grp[j];
                        grp[j] = t;
                    }
                    if (G > 1 && r % 5 == 2)
                        grp[kase_int(&k, 0, (int)G - 1)] = skipped[(r / 5) % 4];
                    if (r % 7 == 3)
                        grp[kase_int(&k, 0, (int)G - 1)] = (int32_t)(R + r % 2);
                }
                iv[0] = 0; /* row 0 of head 0 (its −0) first, and again for n = 1 when G = 1 */
                if (G == 1 && N > 1)
                    iv[H * G] = 0;
                if (N * H > 2)
                    for (int64_t g = 0; g < G; g++) /* a group of nothing but padding */
                        iv[2 * G + g] = g % 2 ? INT32_MIN : -1;
                kt_set_raw(&k, idx, iv);
                if (i8 && (want_y = kase_floats(&k, N * H * D)) != NULL)
                    gather_i8_want(tq, ts, iv, R, H, D, N, G, want_y);
            }
            kase_run(&k, (const struct kt *[]){tab, idx, sc}, i8 ? 3 : 2, y, NULL, 0);
            if (want_y)
                kase_expect(&k, y, want_y);
            kase_check(&k, y);
            END_CASE();
        }
    return MMRT_OK;
}

/* ---- L2_NORM ----------------------------------------------------------------------------- */

/* Norms of K rows ([T, H, D] and [rows, N]): N of 1, 7, 40, 128 and 4099 (off every vector
 * width and work-group), rows that are all zero (exactly 0), a row of N = 0 (0), wide value
 * ranges within f32's squares. */
static mmrt_status grid_l2_norm(struct chk *c, struct mmrt_error *err)
{
    static const struct {
        int n_dims;
        int64_t ne[3];
        int quick;
    } cases[] = {
        {2, {1, 1}, Q},   {2, {7, 128}, Q}, {3, {33, 8, 128}, Q}, {3, {5, 3, 40}, 0},
        {2, {5, 4099}, 0}, {1, {7}, 0},     {2, {300, 8}, 0},     {2, {4, 0}, 0},
        {3, {576, 8, 128}, 0},
    };
    uint64_t serial = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, serial++) {
        if (!want(c, cases[i].quick))
            continue;
        const int nd = cases[i].n_dims;
        int64_t rows = 1, n = cases[i].ne[nd - 1];
        for (int j = 0; j < nd - 1; j++)
            rows *= cases[i].ne[j];
        struct kase k;
        kase_begin(&k, c, MMRT_OP_L2_NORM, "F32", serial, "%lld rows of %lld (%d dims)",
                   (long long)rows, (long long)n, nd);
        k.zeros_exact = true; /* a row of zeros has norm exactly 0 */
        struct kt *x = kt_new(&k, MMRT_DTYPE_F32, nd, cases[i].ne);
        struct kt *y = kt_new(&k, MMRT_DTYPE_F32, SHAPE(rows));
        float *v = kase_floats(&k, rows * n);
        if (v) {
            for (int64_t r = 0; r < rows; r++) {
                /* magnitudes from 2^-20 to 2^20 by row, zeros every fifth row */
                float amp = r % 5 == 4 ? 0.0f : ldexpf(1.0f, (int)(r % 41) - 20);
                for (int64_t j = 0; j < n; j++)
                    v[r * n + j] = amp * kase_float(&k, -1, 1);
            }
            kt_set(&k, x, v);
        }
        kase_run(&k, (const struct kt *[]){x}, 1, y, NULL, 0);
        kase_check(&k, y);
        END_CASE();
    }
    return MMRT_OK;
}

mmrt_status chk_run_op(struct chk *c, enum mmrt_op op, struct mmrt_error *err)
{
    switch (op) {
    case MMRT_OP_MATMUL: {
        mmrt_status st = grid_matmul(c, err);
        if (st == MMRT_OK)
            st = grid_matmul_i8(c, err);
        return st == MMRT_OK ? grid_matmul_u4(c, err) : st;
    }
    case MMRT_OP_ADD:
    case MMRT_OP_MUL: return grid_binary(c, op, err);
    case MMRT_OP_SCALE: return grid_scale(c, err);
    case MMRT_OP_LAYERNORM:
    case MMRT_OP_RMSNORM: return grid_norm(c, op, err);
    case MMRT_OP_GELU:
    case MMRT_OP_GELU_TANH:
    case MMRT_OP_QUICK_GELU:
    case MMRT_OP_SILU:
    case MMRT_OP_RELU2: return grid_unary(c, op, err);
    case MMRT_OP_SWIGLU: return grid_swiglu(c, err);
    case MMRT_OP_SOFTMAX: return grid_softmax(c, err);
    case MMRT_OP_ROPE: return grid_rope(c, err);
    case MMRT_OP_ATTENTION: return grid_attention(c, err);
    case MMRT_OP_GET_ROWS: return grid_get_rows(c, err);
    case MMRT_OP_PATCH_EMBED: return grid_patch_embed(c, err);
    case MMRT_OP_CONCAT: return grid_concat(c, err);
    case MMRT_OP_COPY: return grid_copy(c, err);
    case MMRT_OP_ARGMAX: return grid_argmax(c, err);
    case MMRT_OP_ROPE_MULTI: return grid_rope_multi(c, err);
    case MMRT_OP_SET_ROWS: return grid_set_rows(c, err);
    case MMRT_OP_ATTENTION_PAGED: return grid_attention_paged(c, err);
    case MMRT_OP_GATHER_HEADS: return grid_gather_heads(c, err);
    case MMRT_OP_L2_NORM: return grid_l2_norm(c, err);
    case MMRT_OP_COUNT: break;
    }
    return mmrt_error_set(err, MMRT_ERR_INTERNAL, "no cases for operator %d", (int)op);
}
