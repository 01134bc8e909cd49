/*
 * tests/op_cases.c — the operator tests' shared helpers and the ROPE_MULTI, SET_ROWS,
 * ATTENTION_PAGED, GATHER_HEADS and L2_NORM cases of the device tests (see op_cases.h). Bookkeeping is two fixed arrays, host buffers and
 * (harness, tensor) pairs, emptied together by op_release_all; op_pair structs are host
 * buffers themselves, so they outlive the tensors they hold until the same release.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_i8_ref.h"
#include "op_cases.h"
#include "quant.h"
#include "ref_ops.h"

const enum mmrt_dtype op_weight_dtypes[3] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16 };
const enum mmrt_dtype op_kv_table_dtypes[4] = { MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16,
                                                MMRT_DTYPE_F8E4M3 };

/* ---- bookkeeping ------------------------------------------------------------------------ */

#define MAX_TRACKED 2048

static void *g_host[MAX_TRACKED];
static int g_n_host;
static struct {
    struct harness *h;
    struct harness_tensor *t;
} g_dev[MAX_TRACKED];
static int g_n_dev;

void *op_alloc(size_t nbytes)
{
    assert_true(g_n_host < MAX_TRACKED);
    void *p = calloc(1, nbytes ? nbytes : 1);
    assert_non_null(p);
    g_host[g_n_host++] = p;
    return p;
}

static void track(struct harness *h, enum mmrt_dtype dt, int n_dims, const int64_t *ne,
                  struct harness_tensor *t)
{
    assert_true(g_n_dev < MAX_TRACKED);
    assert_int_equal(harness_tensor_new(h, dt, n_dims, ne, t), MMRT_OK);
    g_dev[g_n_dev].h = h;
    g_dev[g_n_dev++].t = t;
}

struct harness_tensor *op_tensor_new(struct harness *h, enum mmrt_dtype dt, int n_dims,
                                     const int64_t *ne)
{
    struct harness_tensor *t = op_alloc(sizeof *t);
    track(h, dt, n_dims, ne, t);
    return t;
}

void op_release_all(void)
{
    for (int i = 0; i < g_n_dev; i++)
        harness_tensor_free(g_dev[i].h, g_dev[i].t);
    for (int i = 0; i < g_n_host; i++)
        free(g_host[i]);
    g_n_host = g_n_dev = 0;
}

struct harness_tensor op_view(const struct harness_tensor *base, enum mmrt_dtype dt, int n_dims,
                              const int64_t *ne, const int64_t *nb, uint64_t offset)
{
    struct harness_tensor v = *base;
    v.t.dtype = dt;
    v.t.n_dims = n_dims;
    v.t.offset = base->t.offset + offset;
    for (int i = 0; i < MMRT_MAX_DIMS; i++) {
        v.t.ne[i] = i < n_dims ? ne[i] : 1;
        v.t.nb[i] = i < n_dims ? nb[i] : v.t.nb[i];
    }
    return v;
}

int64_t op_numel(const struct harness_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->t.n_dims; i++)
        n *= t->t.ne[i];
    return n;
}

double *op_ref_buf(int64_t n)
{
    return op_alloc((size_t)(n ? n : 1) * sizeof(double));
}

/* ---- random values ------------------------------------------------------------------------ */

static uint64_t g_rng, g_stream = 1;

void op_rng_stream(uint64_t stream)
{
    g_stream = stream;
}

void op_rng_seed(uint64_t seed)
{
    g_rng = seed * 0x9E3779B97F4A7C15ull + g_stream;
}

uint64_t op_rng_save(void)
{
    return g_rng;
}

void op_rng_restore(uint64_t state)
{
    g_rng = state;
}

uint64_t op_rng_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float op_rng_f(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(op_rng_u64() >> 11) / 9007199254740992.0);
}

int op_rng_int(int lo, int hi)
{
    return lo + (int)(op_rng_u64() % (uint64_t)(hi - lo + 1));
}

float *op_rand_f(int64_t n, float lo, float hi)
{
    float *v = op_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = op_rng_f(lo, hi);
    return v;
}

/* ---- values in a dtype ------------------------------------------------------------------- */

void op_round_to(enum mmrt_dtype dt, float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == MMRT_DTYPE_F16)
            v[i] = mmrt_f16_to_f32(mmrt_f32_to_f16(v[i]));
        else if (dt == MMRT_DTYPE_BF16)
            v[i] = mmrt_bf16_to_f32(mmrt_f32_to_bf16(v[i]));
        else if (dt == MMRT_DTYPE_F8E4M3)
            v[i] = ref_f8e4m3_value(ref_f8e4m3_encode(v[i]));
    }
}

void op_i8_exact_rows(float *v, int64_t rows, int64_t D, float amp)
{
    int8_t *codes = op_alloc((size_t)D);
    for (int64_t r = 0; r < rows; r++) {
        float *x = v + r * D, s, back;
        do { /* almost every scale comes back; the loop skips the rare one that does not */
            s = op_rng_f(0.25f, 1.0f) * amp / 127.0f;
            for (int64_t i = 0; i < D; i++)
                x[i] = (float)op_rng_int(-127, 127) * s;
            x[op_rng_int(0, (int)D - 1)] = (r % 2 ? -127.0f : 127.0f) * s;
            mmrt_ref_i8_row_quantize(x, D, codes, &back);
        } while (back != s);
    }
}

int8_t *op_i8_encode(const float *v, int64_t rows, int64_t D, float **scales)
{
    int8_t *codes = op_alloc((size_t)(rows * D) + 1);
    *scales = op_alloc((size_t)rows * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *x = v + r * D;
        bool poison = false;
        for (int64_t i = 0; i < D; i++)
            poison = poison || isnan(x[i]);
        if (poison) {
            memset(codes + r * D, 0, (size_t)D);
            (*scales)[r] = NAN;
            continue;
        }
        mmrt_ref_i8_row_quantize(x, D, codes + r * D, &(*scales)[r]);
        for (int64_t i = 0; i < D; i++) {
            const float back = (float)codes[r * D + i] * (*scales)[r];
            if (memcmp(&back, &x[i], sizeof back) != 0)
                fail_msg("op_i8_encode: row %lld element %lld is %.9g, its code and scale "
                         "give %.9g (not an op_i8_exact_rows value)", (long long)r, (long long)i,
                         (double)x[i], (double)back);
        }
    }
    return codes;
}

void *op_encode(enum mmrt_dtype dt, const float *v, int64_t n)
{
    if (dt == MMRT_DTYPE_F32 || dt == MMRT_DTYPE_I32) {
        void *p = op_alloc((size_t)n * 4);
        memcpy(p, v, (size_t)n * 4);
        return p;
    }
    if (dt == MMRT_DTYPE_F8E4M3) {
        uint8_t *b = op_alloc((size_t)n);
        for (int64_t i = 0; i < n; i++)
            b[i] = ref_f8e4m3_encode(v[i]);
        return b;
    }
    uint16_t *h = op_alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == MMRT_DTYPE_F16 ? mmrt_f32_to_f16(v[i]) : mmrt_f32_to_bf16(v[i]);
    return h;
}

void op_quantize_i8(int64_t N, int64_t K, float hi, struct op_qmatrix *out)
{
    float *w = op_rand_f(N * K, -hi, hi);
    for (int64_t r = 0; r < N; r++)
        for (int64_t k = 0; k < K; k++)
            w[r * K + k] = r % 7 == 6 ? 0.0f : ldexpf(w[r * K + k], -(int)(r % 7));
    out->q = op_alloc((size_t)(N * K));
    out->scale = op_alloc((size_t)N * sizeof(float));
    out->deq = op_alloc((size_t)(N * K) * sizeof(float));
    int64_t bad = 0;
    assert_true(mmrt_quant_i8_rows(w, N, K, out->q, out->scale, &bad));
    for (int64_t r = 0; r < N; r++)
        for (int64_t k = 0; k < K; k++)
            out->deq[r * K + k] = (float)out->q[r * K + k] * out->scale[r];
}

void op_quantize_u4(int64_t N, int64_t K, int64_t gs, float hi, struct op_q4matrix *out)
{
    float *w = op_rand_f(N * K, -hi, hi);
    for (int64_t r = 0; r < N; r++)
        for (int64_t k = 0; k < K; k++)
            w[r * K + k] = r % 7 == 6 ? 0.0f : ldexpf(w[r * K + k], -(int)(r % 7));
    const int64_t G = K / gs;
    out->q = op_alloc((size_t)(N * K / 2));
    out->scale = op_alloc((size_t)(N * G) * sizeof(float));
    out->zero = op_alloc((size_t)(N * G) * sizeof(float));
    out->deq = op_alloc((size_t)(N * K) * sizeof(float));
    int64_t bad = 0;
    assert_true(mmrt_quant_q4_rows(w, N, K, gs, out->q, out->scale, out->zero, &bad));
    ref_u4_dequant(out->q, out->scale, out->zero, N, K, gs, out->deq);
}

void op_convert_one(enum mmrt_dtype sdt, const void *s, enum mmrt_dtype ddt, void *d)
{
    float f;
    if (sdt == MMRT_DTYPE_I32) {
        memcpy(d, s, 4);
        return;
    }
    if (sdt == MMRT_DTYPE_F32)
        memcpy(&f, s, 4);
    else if (sdt == MMRT_DTYPE_F8E4M3)
        f = ref_f8e4m3_value(*(const uint8_t *)s);
    else {
        uint16_t h;
        memcpy(&h, s, 2);
        f = sdt == MMRT_DTYPE_F16 ? mmrt_f16_to_f32(h) : mmrt_bf16_to_f32(h);
    }
    if (ddt == MMRT_DTYPE_F32)
        memcpy(d, &f, 4);
    else if (ddt == MMRT_DTYPE_F8E4M3)
        *(uint8_t *)d = ref_f8e4m3_encode(f);
    else {
        uint16_t h = ddt == MMRT_DTYPE_F16 ? mmrt_f32_to_f16(f) : mmrt_f32_to_bf16(f);
        memcpy(d, &h, 2);
    }
}

bool op_same_value(enum mmrt_dtype dt, const void *a, const void *b)
{
    if (memcmp(a, b, mmrt_dtype_size(dt)) == 0)
        return true;
    float fa, fb;
    if (dt == MMRT_DTYPE_I32)
        return false;
    if (dt == MMRT_DTYPE_F32) {
        memcpy(&fa, a, 4);
        memcpy(&fb, b, 4);
    } else if (dt == MMRT_DTYPE_F8E4M3) {
        fa = ref_f8e4m3_value(*(const uint8_t *)a);
        fb = ref_f8e4m3_value(*(const uint8_t *)b);
    } else {
        uint16_t ha, hb;
        memcpy(&ha, a, 2);
        memcpy(&hb, b, 2);
        fa = dt == MMRT_DTYPE_F16 ? mmrt_f16_to_f32(ha) : mmrt_bf16_to_f32(ha);
        fb = dt == MMRT_DTYPE_F16 ? mmrt_f16_to_f32(hb) : mmrt_bf16_to_f32(hb);
    }
    return isnan(fa) && isnan(fb);
}

double op_check_close(const char *what, const float *got, const double *want, int64_t n,
                      double tol)
{
    double max_ref = 0, max_err = 0;
    int64_t worst = -1;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i]) || isnan(got[i])) {
            if (isnan(want[i]) != isnan(got[i]))
                fail_msg("%s: element %lld is %g, want %g", what, (long long)i, (double)got[i],
                         want[i]);
            continue;
        }
        if (fabs(want[i]) > max_ref)
            max_ref = fabs(want[i]);
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= max_err)) {
            max_err = err;
            worst = i;
        }
    }
    double rel = max_err / (max_ref > 0 ? max_ref : 1.0);
    if (rel > tol)
        fail_msg("%s: max error %.3g at element %lld (got %.9g, want %.9g) is %.3g of max |want| "
                 "%.4g; tolerance %.1g", what, max_err, (long long)worst, (double)got[worst],
                 want[worst], rel, max_ref, tol);
    return rel;
}

float *op_fused_heads(const float *x, int64_t T, int64_t H, int64_t D)
{
    int64_t Hb = H + 2;
    float *buf = op_alloc((size_t)(T * Hb * D) * sizeof(float));
    for (int64_t i = 0; i < T * Hb * D; i++)
        buf[i] = NAN;
    for (int64_t t = 0; t < T; t++)
        memcpy(buf + (t * Hb + 1) * D, x + t * H * D, (size_t)(H * D) * sizeof(float));
    return buf;
}

struct harness_tensor op_heads_view(const struct harness_tensor *buf, int64_t T, int64_t H,
                                    int64_t D)
{
    return op_view(buf, MMRT_DTYPE_F32, SHAPE(T, H, D),
                   (const int64_t[]){ (H + 2) * D * 4, D * 4, 4 }, (uint64_t)D * 4);
}

/* ---- one tensor on two plugins ------------------------------------------------------------ */

static struct harness *g_h[2];
static const char *g_dut_name = "device";

void op_pair_init(struct harness *dut, struct harness *cpu, const char *dut_name)
{
    g_h[OP_DUT] = dut;
    g_h[OP_CPU] = cpu;
    g_dut_name = dut_name;
}

const char *op_pair_dut_name(void)
{
    return g_dut_name;
}

struct op_pair *op_pair_new(enum mmrt_dtype dt, int n_dims, const int64_t *ne)
{
    struct op_pair *p = op_alloc(sizeof *p);
    for (int d = 0; d < 2; d++)
        track(g_h[d], dt, n_dims, ne, &p->t[d]);
    return p;
}

struct op_pair op_pair_view(const struct op_pair *base, enum mmrt_dtype dt, int n_dims,
                            const int64_t *ne, const int64_t *nb, uint64_t offset)
{
    struct op_pair v;
    for (int d = 0; d < 2; d++)
        v.t[d] = op_view(&base->t[d], dt, n_dims, ne, nb, offset);
    return v;
}

struct op_pair op_pair_heads_view(const struct op_pair *buf, int64_t T, int64_t H, int64_t D)
{
    struct op_pair v;
    for (int d = 0; d < 2; d++)
        v.t[d] = op_heads_view(&buf->t[d], T, H, D);
    return v;
}

int64_t op_pair_numel(const struct op_pair *p)
{
    return op_numel(&p->t[OP_DUT]);
}

void op_pair_upload(struct op_pair *p, const void *bytes)
{
    for (int d = 0; d < 2; d++)
        assert_int_equal(harness_upload(g_h[d], &p->t[d], bytes), MMRT_OK);
}

void op_pair_upload_f32(struct op_pair *p, float *v)
{
    int64_t n = op_pair_numel(p);
    enum mmrt_dtype dt = (enum mmrt_dtype)p->t[OP_DUT].t.dtype;
    op_round_to(dt, v, n);
    op_pair_upload(p, op_encode(dt, v, n));
}

struct op_pair *op_pair_rand(enum mmrt_dtype dt, float lo, float hi, float **host, int n_dims,
                             const int64_t *ne)
{
    struct op_pair *p = op_pair_new(dt, n_dims, ne);
    float *v = op_rand_f(op_pair_numel(p), lo, hi);
    op_pair_upload_f32(p, v);
    *host = v;
    return p;
}

struct op_pair *op_pair_i32(const int32_t *v, int64_t n)
{
    struct op_pair *p = op_pair_new(MMRT_DTYPE_I32, SHAPE(n));
    op_pair_upload(p, v);
    return p;
}

void *op_pair_download(int d, struct op_pair *p)
{
    void *v = op_alloc((size_t)p->t[d].nbytes);
    assert_int_equal(harness_download(g_h[d], &p->t[d], v), MMRT_OK);
    return v;
}

void op_pair_download_both(struct op_pair *p, void **dut, void **cpu)
{
    *dut = op_pair_download(OP_DUT, p);
    *cpu = op_pair_download(OP_CPU, p);
}

mmrt_status op_pair_run_on(int d, enum mmrt_op op, struct op_pair *const *src, int n_src,
                           struct op_pair *dst, const void *params, uint32_t params_size)
{
    struct harness_tensor *s[MMRT_MAX_SRC_ALL] = { 0 };
    for (int i = 0; i < n_src && i < MMRT_MAX_SRC_ALL; i++)
        s[i] = src[i] ? &src[i]->t[d] : NULL;
    return harness_run(g_h[d], op, s, n_src, &dst->t[d], params, params_size);
}

void op_pair_run(enum mmrt_op op, struct op_pair *const *src, int n_src, struct op_pair *dst,
                 const void *params, uint32_t params_size)
{
    for (int d = 0; d < 2; d++) {
        mmrt_status st = op_pair_run_on(d, op, src, n_src, dst, params, params_size);
        if (st != MMRT_OK)
            fail_msg("%s %s: status %d: %s", d == OP_DUT ? g_dut_name : "CPU plugin",
                     mmrt_op_name_of(op), (int)st, g_h[d]->plugin->last_error(g_h[d]->dev));
    }
}

/* ---- ROPE, ROPE_MULTI ------------------------------------------------------------------ */

/* x [T, H, D] on both plugins in a rotation's layout: 0 contiguous into a new dst, 1 in place,
 * 2 heads [1, 1 + H) of a fused buffer (*tx) into a new dst. *xv is the source to launch on. */
static void rope_input(const float *x, int64_t T, int64_t H, int64_t D, int layout,
                       struct op_pair **tx, struct op_pair *xv, struct op_pair **ty)
{
    if (layout == 2) {
        *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, H + 2, D));
        op_pair_upload(*tx, op_fused_heads(x, T, H, D));
        *xv = op_pair_heads_view(*tx, T, H, D);
        *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, H, D));
    } else {
        *tx = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, H, D));
        op_pair_upload(*tx, x);
        *xv = **tx;
        *ty = layout == 1 ? *tx : op_pair_new(MMRT_DTYPE_F32, SHAPE(T, H, D));
    }
}

/* ---- ROPE ------------------------------------------------------------------------------- */

void op_case_rope(const struct op_checks *chk, double tol)
{
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
        { 300, 8, 128, 128, MMRT_ROPE_NEOX, 0, 10000.0f, 4095 },
        { 65, 32, 80, 80, MMRT_ROPE_NEOX, 2, 1000000.0f, 131072 },
        { 70, 3, 200, 130, MMRT_ROPE_NEOX, 2, 10000.0f, 4096 },      /* tail wider than WG */
        { 2, 1, 6, 2, MMRT_ROPE_INTERLEAVED, 1, 10000.0f, 9 },       /* in place, partial */
    };
    op_rng_seed(8);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t T = cases[k].T, H = cases[k].H, D = cases[k].D;
        int32_t *pos = op_alloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++)
            pos[t] = op_rng_int(0, cases[k].max_pos); /* not monotonic, like packed sequences */
        pos[0] = cases[k].max_pos;
        float *x = op_rand_f(T * H * D, -2, 2);
        struct op_pair *tx, xv, *ty;
        rope_input(x, T, H, D, cases[k].layout, &tx, &xv, &ty);
        struct op_pair *tp = op_pair_i32(pos, T);
        struct mmrt_rope_params p = { cases[k].theta, cases[k].n_rot, cases[k].mode };
        struct op_pair *src[2] = { &xv, tp };
        op_pair_run(MMRT_OP_ROPE, src, 2, ty, &p, sizeof p);
        double *ref = op_ref_buf(T * H * D);
        ref_rope(x, pos, T, H, D, cases[k].n_rot, cases[k].mode, cases[k].theta, ref);
        void *g, *c;
        op_pair_download_both(ty, &g, &c);
        char what[96];
        snprintf(what, sizeof what, "ROPE case %zu (T %lld H %lld D %lld n_rot %d mode %d)", k,
                 (long long)T, (long long)H, (long long)D, cases[k].n_rot, cases[k].mode);
        chk->close(MMRT_OP_ROPE, what, g, c, ref, T * H * D, tol);
        op_release_all();
    }
}

/* ---- ROPE_MULTI ------------------------------------------------------------------------ */

void op_case_rope_multi(const struct op_checks *chk, double tol)
{
    static const struct {
        int64_t T, H, D;
        int n_rot, freq_dim, restart, n_axes, sections[MMRT_ROPE_MAX_AXES];
        int layout; /* 0 contiguous, 1 in place, 2 a view in a fused buffer */
        float theta;
        int max_pos;
        bool big;
    } cases[] = {
        { 7, 4, 128, 128, 128, 0, 3, { 16, 24, 24 }, 0, 1e6f, 5000, false }, /* M-RoPE */
        { 33, 2, 80, 80, 40, 1, 2, { 20, 20 }, 2, 10000.0f, 60, false },      /* vision */
        { 5, 3, 64, 64, 64, 0, 3, { 8, 12, 12 }, 1, 10000.0f, 70000, false },
        { 4, 3, 200, 130, 130, 1, 4, { 20, 0, 30, 15 }, 2, 10000.0f, 4096, false },
        { 3, 5, 40, 32, 32, 0, 3, { 0, 12, 4 }, 0, 500000.0f, 32768, false },
        { 2, 2, 256, 256, 128, 1, 2, { 64, 64 }, 1, 10000.0f, 100, false },
        { 70, 1, 6, 2, 2, 1, 2, { 1, 0 }, 0, 10000.0f, 9, false },
        { 600, 28, 128, 128, 128, 0, 3, { 16, 24, 24 }, 2, 1e6f, 32768, true },
        { 1024, 16, 80, 80, 40, 1, 2, { 20, 20 }, 1, 10000.0f, 63, true },
    };
    op_rng_seed(21);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].big && !chk->big)
            continue;
        int64_t T = cases[k].T, H = cases[k].H, D = cases[k].D;
        int n_axes = cases[k].n_axes;
        int32_t *pos = op_alloc((size_t)(T * n_axes) * 4);
        for (int64_t i = 0; i < T * n_axes; i++)
            pos[i] = op_rng_int(0, cases[k].max_pos);
        pos[0] = cases[k].max_pos;
        float *x = op_rand_f(T * H * D, -2, 2);
        struct op_pair *tx, xv, *ty;
        rope_input(x, T, H, D, cases[k].layout, &tx, &xv, &ty);
        struct op_pair *tp = op_pair_new(MMRT_DTYPE_I32, SHAPE(T, n_axes));
        op_pair_upload(tp, pos);
        struct mmrt_rope_multi_params p = { cases[k].theta, cases[k].n_rot, cases[k].freq_dim,
                                            cases[k].restart, n_axes, { 0 } };
        memcpy(p.sections, cases[k].sections, sizeof p.sections);
        struct op_pair *src[2] = { &xv, tp };
        op_pair_run(MMRT_OP_ROPE_MULTI, src, 2, ty, &p, sizeof p);
        double *ref = op_ref_buf(T * H * D);
        ref_rope_multi(x, pos, T, H, D, cases[k].n_rot, cases[k].freq_dim, cases[k].restart,
                       n_axes, cases[k].sections, cases[k].theta, ref);
        void *g, *c;
        op_pair_download_both(ty, &g, &c);
        char what[128];
        snprintf(what, sizeof what, "ROPE_MULTI case %zu (T %lld H %lld D %lld n_rot %d "
                 "freq_dim %d restart %d axes %d)", k, (long long)T, (long long)H, (long long)D,
                 cases[k].n_rot, cases[k].freq_dim, cases[k].restart, n_axes);
        chk->close(MMRT_OP_ROPE_MULTI, what, g, c, ref, T * H * D, tol);
        if (cases[k].layout == 2) { /* the fused buffer's other heads were not written */
            const float *all = op_pair_download(OP_DUT, tx);
            for (int64_t t = 0; t < T; t++) {
                const float *b = all + t * (H + 2) * D;
                assert_true(isnan(b[0]) && isnan(b[(H + 1) * D + D - 1]));
            }
        }
        op_release_all();
    }

    /* One axis, sections {n_rot/2}, freq_dim n_rot: ROPE NEOX exactly. */
    int64_t T = 9, Hh = 3, D = 48;
    int32_t pos[9];
    for (int t = 0; t < 9; t++)
        pos[t] = op_rng_int(0, 40000);
    float *x;
    struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, -2, 2, &x, SHAPE(T, Hh, D));
    struct op_pair *tp1 = op_pair_i32(pos, T), *tp2 = op_pair_new(MMRT_DTYPE_I32, SHAPE(T, 1));
    op_pair_upload(tp2, pos);
    struct op_pair *ya = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, Hh, D));
    struct op_pair *yb = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, Hh, D));
    struct mmrt_rope_params rp = { 10000.0f, 40, MMRT_ROPE_NEOX };
    struct mmrt_rope_multi_params mp = { 10000.0f, 40, 40, 0, 1, { 20 } };
    struct op_pair *sa[2] = { tx, tp1 }, *sb[2] = { tx, tp2 };
    assert_int_equal(op_pair_run_on(OP_DUT, MMRT_OP_ROPE, sa, 2, ya, &rp, sizeof rp), MMRT_OK);
    assert_int_equal(op_pair_run_on(OP_DUT, MMRT_OP_ROPE_MULTI, sb, 2, yb, &mp, sizeof mp),
                     MMRT_OK);
    assert_memory_equal(op_pair_download(OP_DUT, ya), op_pair_download(OP_DUT, yb),
                        (size_t)(T * Hh * D) * sizeof(float));
    op_release_all();
}

/* ---- SET_ROWS ---------------------------------------------------------------------------- */

/* ref_set_rows (dst's old contents in, rows written in order) rounded to dst's dtype. */
static void *set_rows_expect(enum mmrt_dtype dt, const double *ref, int64_t n)
{
    if (dt == MMRT_DTYPE_F8E4M3) {
        uint8_t *b = op_alloc((size_t)n);
        for (int64_t i = 0; i < n; i++)
            b[i] = ref_f8e4m3_encode((float)ref[i]);
        return b;
    }
    if (dt == MMRT_DTYPE_F32) {
        float *f = op_alloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)ref[i];
        return f;
    }
    uint16_t *h = op_alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == MMRT_DTYPE_F16 ? mmrt_f32_to_f16((float)ref[i])
                                    : mmrt_f32_to_bf16((float)ref[i]);
    return h;
}

/* SET_ROWS shapes every dst dtype runs: values [T, inner…] into dst [R, inner…]. */
struct set_rows_case {
    int64_t T, R;
    int n_inner;
    int64_t inner[2];
    bool big;
};
static const struct set_rows_case set_rows_cases[] = {
    { 1, 40, 2, { 2, 64 }, false },      /* one decode token into a KV cache */
    { 5, 9, 2, { 3, 7 }, false },
    { 300, 512, 2, { 2, 40 }, false },
    { 4, 4, 1, { 2500 }, false },        /* rows longer than a CUDA block's slice */
    { 10, 6, 0, { 0 }, false },          /* 1-D: rows of one element */
    { 70, 64, 1, { 5 }, false },
    { 4, 4, 1, { 1100 }, false },        /* rows across several OpenCL work-groups */
    { 9, 12, 2, { 8, 128 }, false },     /* a 7B-like decode batch */
    { 4096, 8192, 2, { 8, 128 }, true }, /* a prefill-sized scatter */
};
static const size_t n_set_rows_cases = sizeof set_rows_cases / sizeof set_rows_cases[0];

/* A case's extents: *n elements a row, vne / dne the values' and dst's; returns the rank. */
static int set_rows_shapes(const struct set_rows_case *c, int64_t *n, int64_t *vne, int64_t *dne)
{
    *n = 1;
    vne[0] = c->T;
    dne[0] = c->R;
    for (int i = 0; i < c->n_inner; i++) {
        vne[i + 1] = dne[i + 1] = c->inner[i];
        *n *= c->inner[i];
    }
    return 1 + c->n_inner;
}

/* T destination rows of R for a SET_ROWS case, from the random stream: some outside [0, R)
 * (they write nothing: −1, R, INT32_MIN), and with T ≥ 4 rows 1 and 3 to the same place (the
 * later one wins whole). op_alloc'ed. */
static int32_t *set_rows_indices(int64_t T, int64_t R)
{
    int32_t *idx = op_alloc((size_t)T * 4);
    for (int64_t t = 0; t < T; t++)
        idx[t] = op_rng_int(-1, (int)R);
    if (T == 1)
        idx[0] = (int32_t)(R / 2 + 3);
    if (T >= 4) {
        idx[0] = INT32_MIN;
        idx[1] = (int32_t)R - 1;
        idx[3] = idx[1];
    }
    return idx;
}

/* SET_ROWS into I8 stores with row scales (ABI 1.7): codes and scales bit for bit against
 * mmrt_ref_i8_row_quantize, with rows of zeros, a NaN, an infinity, exact ties, subnormals whose
 * scale underflows, and values near FLT_MAX; rows nobody writes keep their old codes and
 * scales, and repeated indices leave the last row whole. */
static void set_rows_i8(const struct op_checks *chk)
{
    const struct set_rows_case *cases = set_rows_cases;
    op_rng_seed(23);
    for (size_t k = 0; k < n_set_rows_cases; k++) {
        /* an I8 dst has rank ≥ 2: its scales are per innermost row */
        if ((cases[k].big && !chk->big) || cases[k].n_inner == 0)
            continue;
        int64_t n, vne[3], dne[3];
        const int nd = set_rows_shapes(&cases[k], &n, vne, dne);
        const int64_t T = cases[k].T, R = cases[k].R, D = cases[k].inner[cases[k].n_inner - 1];
        const int64_t per = n / D, rows = T * per;
        float *v = op_rand_f(T * n, -70000, 70000);
        for (int64_t r = 0; r < rows; r++) { /* edge rows, then rows of every magnitude */
            float *x = v + r * D;
            static const float tie[] = { 127.0f, 2.5f, 3.5f, -0.5f, -1.5f, 126.5f, -126.5f };
            switch (r % 9) {
            case 0: memset(x, 0, (size_t)D * sizeof(float)); break;
            case 1: x[D / 2] = NAN; break;
            case 2: x[D - 1] = r % 2 ? -INFINITY : INFINITY; break;
            case 3: /* amax 127 makes the scale exactly 1: x / s lands on .5 */
                for (int64_t i = 0; i < D; i++)
                    x[i] = i < 7 ? tie[i] : (float)(i % 255 - 127) + 0.5f;
                break;
            case 4: /* the scale is subnormal, or 0 for the smallest amax */
                for (int64_t i = 0; i < D; i++)
                    x[i] = (float)(i % 5 - 2) * (r % 2 ? 1e-40f : 1e-45f);
                break;
            case 5:
                for (int64_t i = 0; i < D; i++)
                    x[i] *= 4.8e33f;
                break;
            default:
                for (int64_t i = 0; i < D; i++)
                    x[i] = ldexpf(x[i], (int)(r % 41) - 30);
            }
        }
        struct op_pair *tv = op_pair_new(MMRT_DTYPE_F32, nd, vne);
        op_pair_upload(tv, v);
        struct op_pair *ty = op_pair_new(MMRT_DTYPE_I8, nd, dne);
        struct op_pair *ts = op_pair_new(MMRT_DTYPE_F32, SHAPE(R * per));
        int8_t *want = op_alloc((size_t)(R * n));
        float *want_s = op_alloc((size_t)(R * per) * sizeof(float));
        memset(want, 0x55, (size_t)(R * n));
        for (int64_t i = 0; i < R * per; i++)
            want_s[i] = -(float)(i % 1000 + 1);
        op_pair_upload(ty, want);
        op_pair_upload(ts, want_s);
        int32_t *idx = set_rows_indices(T, R);
        struct op_pair *ti = op_pair_i32(idx, T);
        for (int64_t t = 0; t < T; t++)
            if (idx[t] >= 0 && idx[t] < R)
                for (int64_t j = 0; j < per; j++)
                    mmrt_ref_i8_row_quantize(v + (t * per + j) * D, D, want + (idx[t] * per + j) * D,
                                        want_s + idx[t] * per + j);
        struct op_pair *src[3] = { tv, ti, ts };
        op_pair_run(MMRT_OP_SET_ROWS, src, 3, ty, NULL, 0);
        void *g, *c;
        char what[96];
        snprintf(what, sizeof what, "SET_ROWS I8 case %zu T %lld n %lld R %lld: codes", k,
                 (long long)T, (long long)n, (long long)R);
        op_pair_download_both(ty, &g, &c);
        chk->bytes(MMRT_OP_SET_ROWS, what, g, c, want, (size_t)(R * n));
        snprintf(what, sizeof what, "SET_ROWS I8 case %zu T %lld n %lld R %lld: scales", k,
                 (long long)T, (long long)n, (long long)R);
        op_pair_download_both(ts, &g, &c);
        chk->bytes(MMRT_OP_SET_ROWS, what, g, c, want_s, (size_t)(R * per) * sizeof(float));
        op_release_all();
    }
}

void op_case_set_rows(const struct op_checks *chk)
{
    const struct set_rows_case *cases = set_rows_cases;
    static const uint32_t edge[] = { /* rounding edges of F32 → F16 / BF16 / F8E4M3 */
        0x3f801000, 0x3f803000, 0x477fe000, 0x477ff000, 0x38800000, 0x387fe000, 0x33000001,
        0x3f808000, 0x3f818000, 0x7f7fffff, 0x00000001, 0x80000000, 0x7f800000, 0x7fc00000,
        0x43e80000, 0x3a800000, 0x3b400000, 0x3f880000, 0x3c7fffff, 0xbb400000,
    };
    op_rng_seed(22);
    for (size_t k = 0; k < n_set_rows_cases; k++)
        for (int d = 0; d < 4; d++) {
            if ((cases[k].big && !chk->big) || (d == 3 && !chk->kv_f8))
                continue;
            enum mmrt_dtype dt = op_kv_table_dtypes[d];
            const int64_t T = cases[k].T, R = cases[k].R;
            int64_t n, vne[3], dne[3];
            const int nd = set_rows_shapes(&cases[k], &n, vne, dne);
            struct op_pair *tv = op_pair_new(MMRT_DTYPE_F32, nd, vne);
            struct op_pair *ty = op_pair_new(dt, nd, dne);
            float *v = op_rand_f(T * n, -70000, 70000);
            if (dt == MMRT_DTYPE_F8E4M3) /* mostly within ±448, a third down among subnormals */
                for (int64_t i = 0; i < T * n; i++)
                    v[i] = i % 3 == 2 ? v[i] * 0x1.0p-22f : v[i] / 128.0f;
            for (int64_t i = 0; i < T * n && i < (int64_t)(sizeof edge / 4); i++)
                memcpy(&v[i], &edge[i], 4);
            op_pair_upload(tv, v);
            int32_t *idx = set_rows_indices(T, R);
            struct op_pair *ti = op_pair_i32(idx, T);
            double *ref = op_ref_buf(R * n);
            float *old = op_alloc((size_t)(R * n) * 4);
            for (int64_t i = 0; i < R * n; i++)
                ref[i] = old[i] = -(float)(i % 1000 + 1) / 8.0f; /* exact in every dtype */
            op_pair_upload(ty, op_encode(dt, old, R * n));
            struct op_pair *src[2] = { tv, ti };
            op_pair_run(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0);
            ref_set_rows(v, idx, T, n, R, ref);
            void *g, *c;
            op_pair_download_both(ty, &g, &c);
            char what[96];
            snprintf(what, sizeof what, "SET_ROWS case %zu T %lld n %lld R %lld dst %s", k,
                     (long long)T, (long long)n, (long long)R, mmrt_dtype_name_of(dt));
            chk->bytes(MMRT_OP_SET_ROWS, what, g, c, set_rows_expect(dt, ref, R * n),
                       (size_t)(R * n) * mmrt_dtype_size(dt));
            op_release_all();
        }

    if (chk->kv_i8)
        set_rows_i8(chk);

    /* The decode step: descriptors fixed, the index re-uploaded between two launches. */
    struct op_pair *tv = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, 2, 8));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F16, SHAPE(6, 2, 8));
    float *v = op_rand_f(16, -1, 1), *zero = op_alloc(6 * 16 * 4);
    op_pair_upload(tv, v);
    op_pair_upload(ty, op_encode(MMRT_DTYPE_F16, zero, 6 * 16));
    int32_t at = 2;
    struct op_pair *ti = op_pair_i32(&at, 1), *src[2] = { tv, ti };
    op_pair_run(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0);
    at = 5;
    op_pair_upload(ti, &at);
    op_pair_run(MMRT_OP_SET_ROWS, src, 2, ty, NULL, 0);
    void *g, *c;
    op_pair_download_both(ty, &g, &c);
    const uint16_t *gh = g;
    for (int r = 0; r < 6; r++)
        for (int e = 0; e < 16; e++)
            assert_int_equal(gh[r * 16 + e], r == 2 || r == 5 ? mmrt_f32_to_f16(v[e]) : 0);
    assert_memory_equal(g, c, 6 * 16 * 2);
    op_release_all();
}

/* ---- ATTENTION_PAGED ------------------------------------------------------------------------ */

/* Places d's keys (k, v, cu_k) into a new pool of pc's page size and order: d gets n_pages,
 * max_pages, table and the pools. The shuffled placement comes from the random stream. */
static void paged_layout(const struct op_paged_case *pc, struct op_paged_data *d)
{
    const int64_t pt = pc->page_tokens, row = (int64_t)pc->Hkv * pc->D;
    int64_t used[8], shared[8], distinct = 0;
    d->max_pages = 1;
    for (int s = 0; s < pc->n_seq; s++) {
        used[s] = (pc->lk[s] + pt - 1) / pt;
        shared[s] = 0;
        if (pc->order == OP_PAGES_SHARED && s % 2 == 1)
            shared[s] = (pc->lk[s] < pc->lk[0] ? pc->lk[s] : pc->lk[0]) / pt;
        distinct += used[s] - shared[s];
        if (used[s] > d->max_pages)
            d->max_pages = used[s];
    }
    if (pc->order != OP_PAGES_IN_ORDER)
        d->max_pages++; /* every row then has an entry the op must not read */
    d->n_pages = distinct + 2; /* two spare pages nobody names */
    int32_t *ids = op_alloc((size_t)d->n_pages * sizeof(int32_t));
    for (int64_t i = 0; i < d->n_pages; i++)
        ids[i] = (int32_t)i;
    for (int64_t i = d->n_pages - 1; pc->order != OP_PAGES_IN_ORDER && i > 0; i--) {
        int j = op_rng_int(0, (int)i);
        int32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    d->table = op_alloc((size_t)(pc->n_seq * d->max_pages) * sizeof(int32_t));
    int64_t next = 0;
    for (int s = 0; s < pc->n_seq; s++)
        for (int64_t i = 0; i < d->max_pages; i++)
            d->table[s * d->max_pages + i] = i < shared[s] ? d->table[i]
                                             : i < used[s] ? ids[next++]
                                                           : INT32_MAX;
    int64_t n = d->n_pages * pt * row;
    d->k_pages = op_alloc((size_t)n * sizeof(float));
    d->v_pages = op_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        d->k_pages[i] = d->v_pages[i] = NAN;
    for (int s = 0; s < pc->n_seq; s++)
        for (int64_t j = 0; j < pc->lk[s]; j++) {
            int64_t at = ((int64_t)d->table[s * d->max_pages + j / pt] * pt + j % pt) * row;
            memcpy(d->k_pages + at, d->k + (d->cu_k[s] + j) * row, (size_t)row * sizeof(float));
            memcpy(d->v_pages + at, d->v + (d->cu_k[s] + j) * row, (size_t)row * sizeof(float));
        }
}

static void paged_offsets(const struct op_paged_case *pc, struct op_paged_data *d)
{
    d->cu_q[0] = d->cu_k[0] = 0;
    for (int s = 0; s < pc->n_seq; s++) {
        d->cu_q[s + 1] = d->cu_q[s] + pc->lq[s];
        d->cu_k[s + 1] = d->cu_k[s] + pc->lk[s];
        d->kv_lens[s] = pc->lk[s];
    }
    d->T = d->cu_q[pc->n_seq];
    d->S = d->cu_k[pc->n_seq];
    d->scale = 1.0f / sqrtf((float)pc->D);
}

void op_paged_build(const struct op_paged_case *pc, uint64_t seed, struct op_paged_data *d)
{
    assert_true(pc->n_seq >= 1 && pc->n_seq <= 8);
    memset(d, 0, sizeof *d);
    paged_offsets(pc, d);
    const int64_t row = (int64_t)pc->Hkv * pc->D;
    op_rng_seed(seed);
    d->q = op_rand_f(d->T * pc->Hq * pc->D, -pc->q_amp, pc->q_amp);
    float *k = op_rand_f(d->S * row, -1, 1), *v = op_rand_f(d->S * row, -1, 1);
    if (pc->kv_dtype == MMRT_DTYPE_I8) {
        op_i8_exact_rows(k, d->S * pc->Hkv, pc->D, 1.0f);
        op_i8_exact_rows(v, d->S * pc->Hkv, pc->D, 1.0f);
    }
    op_round_to(pc->kv_dtype, k, d->S * row);
    op_round_to(pc->kv_dtype, v, d->S * row);
    for (int s = 0; pc->window > 0 && pc->causal && pc->order != OP_PAGES_SHARED &&
                    s < pc->n_seq; s++) {
        /* The first query sits at position Lk − Lq and sees from Lk − Lq + 1 − window on. */
        int64_t unseen = pc->lq[s] ? pc->lk[s] - pc->lq[s] + 1 - pc->window : pc->lk[s];
        for (int64_t i = 0; i < unseen * row; i++)
            k[d->cu_k[s] * row + i] = v[d->cu_k[s] * row + i] = NAN;
    }
    for (int s = 1; pc->order == OP_PAGES_SHARED && s < pc->n_seq; s += 2) {
        int64_t lk = pc->lk[s] < pc->lk[0] ? pc->lk[s] : pc->lk[0];
        size_t nbytes = (size_t)(lk / pc->page_tokens * pc->page_tokens * row) * sizeof(float);
        memcpy(k + d->cu_k[s] * row, k, nbytes);
        memcpy(v + d->cu_k[s] * row, v, nbytes);
    }
    d->k = k;
    d->v = v;
    paged_layout(pc, d);
}

void op_paged_alone(const struct op_paged_case *pc, const struct op_paged_data *d, int seq,
                    int page_tokens, struct op_paged_case *apc, struct op_paged_data *ad)
{
    *apc = *pc;
    apc->n_seq = 1;
    apc->lq[0] = pc->lq[seq];
    apc->lk[0] = pc->lk[seq];
    apc->page_tokens = page_tokens;
    apc->order = OP_PAGES_SHUFFLED;
    memset(ad, 0, sizeof *ad);
    paged_offsets(apc, ad);
    const int64_t row = (int64_t)pc->Hkv * pc->D;
    ad->q = d->q + (int64_t)d->cu_q[seq] * pc->Hq * pc->D;
    ad->k = d->k + d->cu_k[seq] * row;
    ad->v = d->v + d->cu_k[seq] * row;
    paged_layout(apc, ad);
}

void op_paged_same_bits(const char *what, const float *batch, const float *alone, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&batch[i], &alone[i], sizeof(float)) != 0)
            fail_msg("%s: element %lld is %.9g in the batch but %.9g alone (must be bit for "
                     "bit the same)", what, (long long)i, (double)batch[i], (double)alone[i]);
}

void op_paged_pairs(const struct op_paged_case *pc, const struct op_paged_data *d,
                    struct op_paged_pairs *pp)
{
    const int64_t Hq = pc->Hq, Hkv = pc->Hkv, D = pc->D, pt = pc->page_tokens;
    const int64_t n = d->n_pages * pt * Hkv * D;
    pp->src[0] = op_pair_new(MMRT_DTYPE_F32, SHAPE(d->T, Hq, D));
    op_pair_upload(pp->src[0], d->q);
    pp->n_src = pc->kv_dtype == MMRT_DTYPE_I8 ? 8 : 6;
    for (int i = 1; i <= 2; i++) {
        const float *pool = i == 1 ? d->k_pages : d->v_pages;
        pp->src[i] = op_pair_new(pc->kv_dtype, SHAPE(d->n_pages, pt, Hkv, D));
        if (pc->kv_dtype != MMRT_DTYPE_I8) {
            op_pair_upload(pp->src[i], op_encode(pc->kv_dtype, pool, n));
            continue;
        }
        float *s; /* poisoned rows read back as NaN through their scale */
        op_pair_upload(pp->src[i], op_i8_encode(pool, n / D, D, &s));
        pp->src[5 + i] = op_pair_new(MMRT_DTYPE_F32, SHAPE(n / D));
        op_pair_upload(pp->src[5 + i], s);
    }
    pp->src[3] = op_pair_i32(d->cu_q, pc->n_seq + 1);
    pp->src[4] = op_pair_i32(d->kv_lens, pc->n_seq);
    pp->src[5] = op_pair_new(MMRT_DTYPE_I32, SHAPE(pc->n_seq, d->max_pages));
    op_pair_upload(pp->src[5], d->table);
    pp->y = op_pair_new(MMRT_DTYPE_F32, SHAPE(d->T, Hq, D));
    pp->p = (struct mmrt_attention_params){ d->scale, pc->causal, pc->n_seq, pc->window };
}

static void paged_indices_on(struct harness *h, struct harness_tensor **src, const int32_t *cu_q,
                             const int32_t *lens, const int32_t *table);

void op_paged_tensors(struct harness *h, const struct op_paged_case *pc,
                      const struct op_paged_data *d, struct harness_tensor **src,
                      struct harness_tensor **y)
{
    const int64_t Hq = pc->Hq, Hkv = pc->Hkv, D = pc->D, pt = pc->page_tokens;
    const int64_t n = d->n_pages * pt * Hkv * D;
    src[0] = op_tensor_new(h, MMRT_DTYPE_F32, SHAPE(d->T, Hq, D));
    assert_int_equal(harness_upload(h, src[0], d->q), MMRT_OK);
    src[6] = src[7] = NULL;
    for (int i = 1; i <= 2; i++) {
        src[i] = op_tensor_new(h, pc->kv_dtype, SHAPE(d->n_pages, pt, Hkv, D));
        const float *pool = i == 1 ? d->k_pages : d->v_pages;
        if (pc->kv_dtype != MMRT_DTYPE_I8) {
            assert_int_equal(harness_upload(h, src[i], op_encode(pc->kv_dtype, pool, n)),
                             MMRT_OK);
            continue;
        }
        float *s;
        assert_int_equal(harness_upload(h, src[i], op_i8_encode(pool, n / D, D, &s)), MMRT_OK);
        src[5 + i] = op_tensor_new(h, MMRT_DTYPE_F32, SHAPE(n / D));
        assert_int_equal(harness_upload(h, src[5 + i], s), MMRT_OK);
    }
    src[3] = op_tensor_new(h, MMRT_DTYPE_I32, SHAPE(pc->n_seq + 1));
    src[4] = op_tensor_new(h, MMRT_DTYPE_I32, SHAPE(pc->n_seq));
    src[5] = op_tensor_new(h, MMRT_DTYPE_I32, SHAPE(pc->n_seq, d->max_pages));
    *y = op_tensor_new(h, MMRT_DTYPE_F32, SHAPE(d->T, Hq, D));
    paged_indices_on(h, src, d->cu_q, d->kv_lens, d->table);
}

static void paged_indices_on(struct harness *h, struct harness_tensor **src, const int32_t *cu_q,
                             const int32_t *lens, const int32_t *table)
{
    assert_int_equal(harness_upload(h, src[3], cu_q), MMRT_OK);
    assert_int_equal(harness_upload(h, src[4], lens), MMRT_OK);
    assert_int_equal(harness_upload(h, src[5], table), MMRT_OK);
}

static float *paged_download_on(struct harness *h, struct harness_tensor *y)
{
    float *v = op_alloc((size_t)y->nbytes);
    assert_int_equal(harness_download(h, y, v), MMRT_OK);
    return v;
}

void op_paged_graph_replay(struct harness *h)
{
    const struct mmrt_plugin *pl = h->plugin;
    const struct op_paged_case pc = { 4, 2, 32, 3, 3, { 1, 5, 1 }, { 9, 12, 4 }, 1,
                                      MMRT_DTYPE_F16, OP_PAGES_SHUFFLED, 1, 0 };
    struct op_paged_data d;
    op_paged_build(&pc, 8, &d);
    struct harness_tensor *src[8], *y;
    op_paged_tensors(h, &pc, &d, src, &y);
    const int64_t mp = d.max_pages, n = d.T * pc.Hq * pc.D;
    /* The second step: another split of the queries, the table rows rotated, each length
     * within the pages its new row names. */
    int32_t cu_q2[4] = { 0, 3, 4, 7 }, lens2[3] = { d.kv_lens[1] - 3, d.kv_lens[2], 1 };
    int32_t *table2 = op_alloc((size_t)(3 * mp) * sizeof(int32_t));
    for (int s = 0; s < 3; s++)
        memcpy(table2 + s * mp, d.table + ((s + 1) % 3) * mp, (size_t)mp * sizeof(int32_t));
    const int32_t *cu[2] = { d.cu_q, cu_q2 }, *lens[2] = { d.kv_lens, lens2 };
    const int32_t *table[2] = { d.table, table2 };
    struct mmrt_attention_params p = { d.scale, pc.causal, pc.n_seq, pc.window };
    float *eager[2];
    for (int step = 0; step < 2; step++) {
        paged_indices_on(h, src, cu[step], lens[step], table[step]);
        assert_int_equal(harness_run(h, MMRT_OP_ATTENTION_PAGED, src, 6, y, &p, sizeof p),
                         MMRT_OK);
        eager[step] = paged_download_on(h, y);
    }
    void *graph = NULL;
    assert_int_equal(pl->capture_begin(h->dev), MMRT_OK);
    assert_int_equal(harness_run(h, MMRT_OP_ATTENTION_PAGED, src, 6, y, &p, sizeof p), MMRT_OK);
    if (pl->capture_end(h->dev, &graph) != MMRT_OK)
        fail_msg("capture_end: %s", pl->last_error(h->dev));
    for (int rep = 0; rep < 2; rep++)
        for (int step = 1; step >= 0; step--) {
            paged_indices_on(h, src, cu[step], lens[step], table[step]);
            assert_int_equal(pl->graph_launch(h->dev, graph), MMRT_OK);
            op_paged_same_bits(step ? "ATTENTION_PAGED replay of step 2"
                                    : "ATTENTION_PAGED replay of step 1",
                               eager[step], paged_download_on(h, y), n);
        }
    /* A bad page id uploaded before a replay fails it (at the launch or the next sync). */
    table2[0] = (int32_t)d.n_pages;
    paged_indices_on(h, src, cu_q2, lens2, table2);
    mmrt_status st = pl->graph_launch(h->dev, graph);
    if (st == MMRT_OK)
        st = pl->synchronize(h->dev);
    assert_int_equal(st, MMRT_ERR_INVALID_ARG);
    if (!strstr(pl->last_error(h->dev), "src5 (page_table) entry [0, 0]"))
        fail_msg("bad page id at replay: \"%s\"", pl->last_error(h->dev));
    assert_int_equal(pl->synchronize(h->dev), MMRT_OK);
    pl->graph_destroy(h->dev, graph);
    op_release_all();
}

/* Uploads a case to both plugins and runs it there; returns dst. */
static struct op_pair *paged_run(const struct op_paged_case *pc, const struct op_paged_data *d)
{
    struct op_paged_pairs pp;
    op_paged_pairs(pc, d, &pp);
    op_pair_run(MMRT_OP_ATTENTION_PAGED, pp.src, pp.n_src, pp.y, &pp.p, sizeof pp.p);
    return pp.y;
}

static void paged_describe(char *what, size_t size, const char *prefix,
                           const struct op_paged_case *pc)
{
    int used = snprintf(what, size, "%s Hq %d Hkv %d D %d pages of %d, %s, %s, window %d, "
                        "order %d, Lq/Lk", prefix, pc->Hq, pc->Hkv, pc->D, pc->page_tokens,
                        mmrt_dtype_name_of(pc->kv_dtype), pc->causal ? "causal" : "bidirectional",
                        pc->window, (int)pc->order);
    for (int s = 0; s < pc->n_seq && used > 0 && (size_t)used < size; s++)
        used += snprintf(what + used, size - (size_t)used, " %d/%d", pc->lq[s], pc->lk[s]);
}

#define F32 MMRT_DTYPE_F32
#define F16 MMRT_DTYPE_F16
#define F8 MMRT_DTYPE_F8E4M3
#define I8 MMRT_DTYPE_I8
const struct op_paged_entry op_paged_cases[] = {
    /* Hq Hkv D  pt n_seq lq             lk                    causal kv  order       amp  alone */
    { { 4, 2, 64, 16, 3, { 1, 1, 1 }, { 37, 16, 1 }, 1, F16, OP_PAGES_SHUFFLED, 1, 0 }, 0, 3, false },
    { { 4, 4, 64, 1, 2, { 1, 6 }, { 5, 6 }, 1, F32, OP_PAGES_SHUFFLED, 1, 0 }, 1, 16, false },
    { { 8, 2, 80, 3, 4, { 1, 9, 1, 0 }, { 20, 30, 7, 5 }, 1, F32, OP_PAGES_SHARED, 1, 0 }, 1, 16, false },
    { { 2, 1, 128, 16, 3, { 5, 1, 3 }, { 0, 40, 3 }, 1, F16, OP_PAGES_SHARED, 1, 0 }, 1, 1, false },
    { { 6, 3, 8, 3, 2, { 7, 4 }, { 7, 11 }, 0, F16, OP_PAGES_IN_ORDER, 1, 0 }, 1, 16, false },
    { { 4, 1, 256, 16, 2, { 33, 1 }, { 70, 129 }, 1, F32, OP_PAGES_SHUFFLED, 1, 0 }, 0, 3, false },
    { { 2, 2, 3, 3, 1, { 4 }, { 9 }, 0, F32, OP_PAGES_IN_ORDER, 1, 0 }, 0, 1, false },
    { { 8, 1, 100, 16, 3, { 1, 1, 40 }, { 300, 17, 64 }, 1, F16, OP_PAGES_SHARED, 3, 0 }, 2, 3, false },
    { { 2, 2, 64, 16, 2, { 70, 1 }, { 200, 90 }, 0, F32, OP_PAGES_SHARED, 1, 0 }, 0, 1, false },
    { { 32, 8, 128, 16, 4, { 1, 1, 1, 64 }, { 1000, 513, 37, 200 }, 1, F16, OP_PAGES_SHUFFLED, 1, 0 }, 3, 3, true },
    /* Sliding windows (ABI 1.5). Decode rows whose window starts mid-page (keys 30…, 9…) and
     * one whose window covers all its keys; then window 1 (a query sees itself) over a mix of
     * decode and a prefill chunk; windows ≥ Lk (no key dropped); GQA 8 with shared prefix
     * pages; a prefill over several query blocks with a window shorter than a block; rows
     * that see no key (Lq > Lk); and long decode. */
    { { 4, 2, 64, 16, 3, { 1, 1, 1 }, { 37, 16, 1 }, 1, F16, OP_PAGES_SHUFFLED, 1, 7 }, 0, 3, false },
    { { 8, 2, 80, 3, 4, { 1, 9, 1, 0 }, { 20, 30, 7, 5 }, 1, F32, OP_PAGES_SHUFFLED, 1, 1 }, 1, 16, false },
    { { 4, 4, 64, 5, 2, { 6, 12 }, { 6, 12 }, 1, F32, OP_PAGES_IN_ORDER, 1, 12 }, 1, 3, false },
    { { 8, 1, 100, 16, 3, { 1, 1, 40 }, { 300, 17, 64 }, 1, F16, OP_PAGES_SHARED, 3, 33 }, 2, 5, false },
    { { 16, 2, 64, 7, 2, { 70, 3 }, { 150, 3 }, 1, F32, OP_PAGES_SHUFFLED, 1, 20 }, 0, 16, false },
    { { 2, 1, 32, 4, 2, { 6, 2 }, { 3, 9 }, 1, F32, OP_PAGES_SHUFFLED, 1, 2 }, 0, 1, false },
    { { 32, 8, 128, 16, 4, { 1, 1, 1, 64 }, { 1000, 513, 37, 200 }, 1, F16, OP_PAGES_SHUFFLED, 1, 100 }, 0, 3, true },
    /* FP8 E4M3 pages (ABI 1.6; where op_checks.kv_f8): decode over shuffled pages, decode
     * and a prefill chunk over shared prefix pages, a window starting mid-page. */
    { { 4, 2, 64, 16, 3, { 1, 1, 1 }, { 37, 16, 1 }, 1, F8, OP_PAGES_SHUFFLED, 1, 0 }, 0, 3, false },
    { { 8, 1, 100, 16, 3, { 1, 1, 40 }, { 300, 17, 64 }, 1, F8, OP_PAGES_SHARED, 3, 0 }, 2, 3, false },
    { { 16, 2, 64, 5, 3, { 4, 5, 2 }, { 60, 61, 2 }, 1, F8, OP_PAGES_SHUFFLED, 1, 9 }, 1, 16, false },
    /* I8 pages with row scales (ABI 1.7; where op_checks.kv_i8): the same three, then a
     * prefill over several query blocks (the blocked path) with GQA, bidirectional rows, and
     * a head dim off every vector width. */
    { { 4, 2, 64, 16, 3, { 1, 1, 1 }, { 37, 16, 1 }, 1, I8, OP_PAGES_SHUFFLED, 1, 0 }, 0, 3, false },
    { { 8, 1, 100, 16, 3, { 1, 1, 40 }, { 300, 17, 64 }, 1, I8, OP_PAGES_SHARED, 3, 0 }, 2, 3, false },
    { { 16, 2, 64, 5, 3, { 4, 5, 2 }, { 60, 61, 2 }, 1, I8, OP_PAGES_SHUFFLED, 1, 9 }, 1, 16, false },
    { { 8, 2, 128, 16, 2, { 70, 1 }, { 200, 90 }, 1, I8, OP_PAGES_SHUFFLED, 2, 0 }, 0, 3, false },
    { { 6, 3, 13, 3, 2, { 7, 4 }, { 7, 11 }, 0, I8, OP_PAGES_IN_ORDER, 1, 0 }, 1, 16, false },
};
#undef F32
#undef F16
#undef F8
#undef I8
const size_t op_n_paged_cases = sizeof op_paged_cases / sizeof op_paged_cases[0];

void op_paged_zero_rows(const char *what, const float *got, const double *ref, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (ref[i] == 0.0 && got[i] != 0.0f)
            fail_msg("%s: element %lld is %g; a query that sees no key must give exactly 0",
                     what, (long long)i, (double)got[i]);
}

const struct op_paged_case op_paged_bad_case = { 2, 1, 16, 4, 2, { 2, 1 }, { 6, 5 }, 1,
                                                 MMRT_DTYPE_F32, OP_PAGES_SHUFFLED, 1, 0 };
const struct op_paged_bad op_paged_bad[] = {
    { 5, 0, 1, 9, "src5 (page_table) entry [0, 1] is 9" },
    { 5, 1, 0, -1, "src5 (page_table) entry [1, 0] is -1" },
    { 4, 1, 0, 13, "src4 (kv_lens) entry 1 is 13" },
    { 4, 0, 0, -2, "src4 (kv_lens) entry 0 is -2" },
    { 3, 2, 0, 2, "src3 (cu_seqlens_q)" },  /* ends short of T = 3 */
    { 3, 1, 0, 4, "src3 (cu_seqlens_q)" },  /* decreases */
    { 3, 0, 0, 1, "src3 (cu_seqlens_q)" },  /* does not start at 0 */
    { 4, 0, 0, 12, "src5 (page_table) entry [0, 2] is 2147483647" },
};
const size_t op_n_paged_bad = sizeof op_paged_bad / sizeof op_paged_bad[0];

void op_paged_bad_setup(struct harness *h, struct op_paged_bad_run *r)
{
    const struct op_paged_case *pc = &op_paged_bad_case;
    op_paged_build(pc, 7, &r->d);
    op_paged_tensors(h, pc, &r->d, r->src, &r->y);
    r->p = (struct mmrt_attention_params){ r->d.scale, pc->causal, pc->n_seq, 0 };
    r->n = r->d.T * pc->Hq * pc->D;
    r->sentinel = op_rand_f(r->n, 5, 6);
    assert_int_equal(harness_upload(h, r->y, r->sentinel), MMRT_OK);
}

void op_paged_bad_set(struct harness *h, struct op_paged_bad_run *r, size_t b)
{
    const struct op_paged_case *pc = &op_paged_bad_case;
    int32_t cu_q[9], lens[8], *table = op_alloc((size_t)(pc->n_seq * r->d.max_pages) * 4);
    memcpy(cu_q, r->d.cu_q, sizeof cu_q);
    memcpy(lens, r->d.kv_lens, sizeof lens);
    memcpy(table, r->d.table, (size_t)(pc->n_seq * r->d.max_pages) * sizeof(int32_t));
    const struct op_paged_bad *bad = b < op_n_paged_bad ? &op_paged_bad[b] : NULL;
    if (bad && bad->which == 3)
        cu_q[bad->seq] = bad->value;
    else if (bad && bad->which == 4)
        lens[bad->seq] = bad->value;
    else if (bad)
        table[bad->seq * r->d.max_pages + bad->col] = bad->value;
    paged_indices_on(h, r->src, cu_q, lens, table);
}

void op_paged_bad_untouched(struct harness *h, const struct op_paged_bad_run *r)
{
    assert_memory_equal(paged_download_on(h, r->y), r->sentinel, (size_t)r->n * sizeof(float));
}

void op_case_attention_paged(const struct op_checks *chk, double tol)
{
    for (size_t c = 0; c < op_n_paged_cases; c++) {
        const struct op_paged_entry *e = &op_paged_cases[c];
        if ((e->big && !chk->big) || (e->pc.kv_dtype == MMRT_DTYPE_F8E4M3 && !chk->kv_f8) ||
            (e->pc.kv_dtype == MMRT_DTYPE_I8 && !chk->kv_i8))
            continue;
        const struct op_paged_case *pc = &e->pc;
        struct op_paged_data d;
        op_paged_build(pc, 400 + c, &d);
        struct op_pair *ty = paged_run(pc, &d);
        const int64_t row = (int64_t)pc->Hq * pc->D;
        double *ref = op_ref_buf(d.T * row);
        ref_attention_paged(d.q, d.k_pages, d.v_pages, d.T, pc->Hq, pc->Hkv, pc->D,
                            pc->page_tokens, d.cu_q, d.kv_lens, d.table, d.max_pages, pc->n_seq,
                            d.scale, pc->causal, pc->window, ref);
        void *g, *cpu;
        op_pair_download_both(ty, &g, &cpu);
        char what[256];
        paged_describe(what, sizeof what, "ATTENTION_PAGED", pc);
        chk->close(MMRT_OP_ATTENTION_PAGED, what, g, cpu, ref, d.T * row, tol);
        op_paged_zero_rows(what, g, ref, d.T * row);

        int s = e->alone_seq;
        struct op_paged_case apc;
        struct op_paged_data ad;
        op_paged_alone(pc, &d, s, e->alone_pt, &apc, &ad);
        struct op_pair *ta = paged_run(&apc, &ad);
        void *ga, *ca;
        op_pair_download_both(ta, &ga, &ca);
        int64_t first = (int64_t)d.cu_q[s] * row, n = (int64_t)pc->lq[s] * row;
        char inv[sizeof what + 96];
        snprintf(inv, sizeof inv, "%s: sequence %d alone in pages of %d on %s", what, s,
                 e->alone_pt, op_pair_dut_name());
        op_paged_same_bits(inv, (const float *)g + first, ga, n);
        snprintf(inv, sizeof inv, "%s: sequence %d alone in pages of %d on the CPU plugin", what,
                 s, e->alone_pt);
        op_paged_same_bits(inv, (const float *)cpu + first, ca, n);
        op_release_all();
    }
}

/* ---- ATTENTION: a packed sequence gives its bits alone ------------------------------------ */

void op_case_attention_packed(void)
{
    static const struct {
        int Hq, Hkv, D, n_seq, causal;
        int32_t lq[4], lk[4];
        enum mmrt_dtype kv;
        int window;
    } cases[] = {
        /* images of a vision batch: CLIP-like rows per image, bidirectional */
        { 4, 4, 32, 3, 0, { 65, 17, 129 }, { 65, 17, 129 }, MMRT_DTYPE_F32, 0 },
        { 16, 16, 64, 2, 0, { 257, 577 }, { 257, 577 }, MMRT_DTYPE_F16, 0 },
        /* prefill chunks with a past, GQA, decode rows among them; then with a window */
        { 8, 2, 64, 4, 1, { 40, 1, 33, 7 }, { 90, 300, 33, 7 }, MMRT_DTYPE_F32, 0 },
        { 8, 2, 64, 4, 1, { 40, 1, 33, 7 }, { 90, 300, 33, 7 }, MMRT_DTYPE_F16, 16 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int Hq = cases[c].Hq, Hkv = cases[c].Hkv, D = cases[c].D, n = cases[c].n_seq;
        int32_t cu_q[5] = { 0 }, cu_k[5] = { 0 };
        for (int s = 0; s < n; s++) {
            cu_q[s + 1] = cu_q[s] + cases[c].lq[s];
            cu_k[s + 1] = cu_k[s] + cases[c].lk[s];
        }
        const int64_t T = cu_q[n], S = cu_k[n], qrow = (int64_t)Hq * D, krow = (int64_t)Hkv * D;
        op_rng_seed(900 + c);
        float *q, *k, *v;
        struct op_pair *tq = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &q, SHAPE(T, Hq, D));
        struct op_pair *tk = op_pair_rand(cases[c].kv, -1, 1, &k, SHAPE(S, Hkv, D));
        struct op_pair *tv = op_pair_rand(cases[c].kv, -1, 1, &v, SHAPE(S, Hkv, D));
        struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(T, Hq, D));
        struct op_pair *cq = op_pair_i32(cu_q, n + 1), *ck = op_pair_i32(cu_k, n + 1);
        struct mmrt_attention_params p = { 1.0f / sqrtf((float)D), cases[c].causal, n,
                                           cases[c].window };
        op_pair_run(MMRT_OP_ATTENTION, (struct op_pair *const[]){ tq, tk, tv, cq, ck }, 5, ty,
                    &p, sizeof p);
        void *packed[2];
        op_pair_download_both(ty, &packed[OP_DUT], &packed[OP_CPU]);
        for (int s = 0; s < n; s++) {
            const int64_t lq = cases[c].lq[s], lk = cases[c].lk[s];
            struct op_pair *aq = op_pair_new(MMRT_DTYPE_F32, SHAPE(lq, Hq, D));
            struct op_pair *ak = op_pair_new(cases[c].kv, SHAPE(lk, Hkv, D));
            struct op_pair *av = op_pair_new(cases[c].kv, SHAPE(lk, Hkv, D));
            struct op_pair *ay = op_pair_new(MMRT_DTYPE_F32, SHAPE(lq, Hq, D));
            op_pair_upload(aq, op_encode(MMRT_DTYPE_F32, q + cu_q[s] * qrow, lq * qrow));
            op_pair_upload(ak, op_encode(cases[c].kv, k + cu_k[s] * krow, lk * krow));
            op_pair_upload(av, op_encode(cases[c].kv, v + cu_k[s] * krow, lk * krow));
            struct mmrt_attention_params pa = { p.scale, p.causal, 1, p.window };
            op_pair_run(MMRT_OP_ATTENTION, (struct op_pair *const[]){ aq, ak, av }, 3, ay, &pa,
                        sizeof pa);
            void *alone[2];
            op_pair_download_both(ay, &alone[OP_DUT], &alone[OP_CPU]);
            for (int d = 0; d < 2; d++) {
                char what[160];
                snprintf(what, sizeof what, "ATTENTION case %zu: sequence %d of %d (%lld "
                         "queries, %lld keys) alone on %s", c, s, n, (long long)lq,
                         (long long)lk, d == OP_DUT ? op_pair_dut_name() : "the CPU plugin");
                op_paged_same_bits(what, (const float *)packed[d] + cu_q[s] * qrow, alone[d],
                                   lq * qrow);
            }
        }
        op_release_all();
    }
}

/* ---- MATMUL with I8 weights ------------------------------------------------------------- */

struct op_pair *op_pair_quantized(int64_t N, int64_t K, float hi, struct op_qmatrix *qm,
                                  struct op_pair **scales)
{
    op_quantize_i8(N, K, hi, qm);
    struct op_pair *w = op_pair_new(MMRT_DTYPE_I8, SHAPE(N, K));
    op_pair_upload(w, qm->q);
    *scales = op_pair_new(MMRT_DTYPE_F32, SHAPE(N));
    op_pair_upload(*scales, qm->scale);
    return w;
}

/* One launch of x [M, K] against a quantized W (w, s and, for U4, z) with bias mode 0 none,
 * 1 F16, 2 F32, checked against the reference on deq [N, K]; the M ≤ 32 rows first, middle
 * and last again alone, on both plugins. */
static void matmul_q_run(const struct op_checks *chk, const char *what, const float *x,
                         struct op_pair *tx, struct op_pair *tw, struct op_pair *ts,
                         struct op_pair *tz, const float *deq, int64_t M, int64_t K, int64_t N,
                         int bias_mode, double tol)
{
    float *b = NULL;
    struct op_pair *tb = NULL;
    if (bias_mode)
        tb = op_pair_rand(bias_mode == 1 ? MMRT_DTYPE_F16 : MMRT_DTYPE_F32, -1, 1, &b, SHAPE(N));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(M, N));
    const int n_src = tz ? 5 : 4;
    struct op_pair *src[5] = { tx, tw, tb, ts, tz };
    op_pair_run(MMRT_OP_MATMUL, src, n_src, ty, NULL, 0);
    double *ref = op_ref_buf(M * N);
    ref_matmul(x, deq, b, M, K, N, ref);
    void *g, *c;
    op_pair_download_both(ty, &g, &c);
    chk->close(MMRT_OP_MATMUL, what, g, c, ref, M * N, tol);
    if (M < 2 || M > 32)
        return;
    const int64_t rows[3] = { 0, M / 2, M - 1 };
    for (int i = 0; i < 3; i++) {
        if (i > 0 && rows[i] == rows[i - 1])
            continue;
        struct op_pair *x1 = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, K));
        op_pair_upload(x1, x + rows[i] * K);
        struct op_pair *y1 = op_pair_new(MMRT_DTYPE_F32, SHAPE(1, N));
        struct op_pair *s1[5] = { x1, tw, tb, ts, tz };
        op_pair_run(MMRT_OP_MATMUL, s1, n_src, y1, NULL, 0);
        void *g1, *c1;
        op_pair_download_both(y1, &g1, &c1);
        char inv[256];
        snprintf(inv, sizeof inv, "%s: row %lld alone on %s", what, (long long)rows[i],
                 op_pair_dut_name());
        op_paged_same_bits(inv, (const float *)g + rows[i] * N, g1, N);
        snprintf(inv, sizeof inv, "%s: row %lld alone on the CPU plugin", what,
                 (long long)rows[i]);
        op_paged_same_bits(inv, (const float *)c + rows[i] * N, c1, N);
    }
}

/* A refusal on plugin d: the status and a message naming MATMUL and `needle`. */
static void matmul_q_refused(int d, struct op_pair *const *src, int n_src, struct op_pair *dst,
                              const char *needle)
{
    mmrt_status st = op_pair_run_on(d, MMRT_OP_MATMUL, src, n_src, dst, NULL, 0);
    const char *who = d == OP_DUT ? g_dut_name : "CPU plugin";
    const char *msg = g_h[d]->plugin->last_error(g_h[d]->dev);
    if (st != MMRT_ERR_INVALID_ARG)
        fail_msg("%s MATMUL quantized W (%s): status %d, want %d (%s)", who, needle, (int)st,
                 (int)MMRT_ERR_INVALID_ARG, msg);
    if (!strstr(msg, "MATMUL") || !strstr(msg, needle))
        fail_msg("%s MATMUL quantized W: message \"%s\" should name MATMUL and \"%s\"", who, msg,
                 needle);
}

void op_case_matmul_i8(const struct op_checks *chk, double tol_small, double tol_large)
{
    static const struct {
        int64_t M, K, N;
        bool big;
    } cases[] = {
        { 1, 1, 1, false },     { 1, 13, 7, false },     { 3, 8, 5, false },
        { 4, 100, 9, false },   { 5, 64, 65, false },    { 8, 128, 129, false },
        { 9, 129, 128, false }, { 17, 65, 33, false },   { 32, 72, 40, false },
        { 33, 256, 16, false }, { 64, 257, 96, false },  { 2, 4099, 3, false },
        { 1, 300, 513, false }, { 37, 31, 19, false },   { 100, 130, 70, false },
        { 131, 129, 67, false }, { 2, 0, 3, false },     { 65, 17, 1, false },
        { 31, 48, 24, false },  { 1, 4096, 256, true },  { 300, 1000, 200, true },
        { 129, 4096, 65, true },
    };
    op_rng_seed(31);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t M = cases[c].M, K = cases[c].K, N = cases[c].N;
        if (cases[c].big && !chk->big)
            continue;
        int bias_mode = (int)(c % 3);
        float *x;
        struct op_qmatrix qm;
        struct op_pair *ts, *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        struct op_pair *tw = op_pair_quantized(N, K, 2.0f, &qm, &ts);
        char what[128];
        snprintf(what, sizeof what, "MATMUL I8 M=%lld K=%lld N=%lld bias %d", (long long)M,
                 (long long)K, (long long)N, bias_mode);
        matmul_q_run(chk, what, x, tx, tw, ts, NULL, qm.deq, M, K, N, bias_mode,
                      M <= 32 ? tol_small : tol_large);
        op_release_all();
    }

    /* Random shapes around the tile, warp and work-group edges. */
    for (int c = 0; c < 12; c++) {
        static const int64_t edges[] = { 1, 3, 4, 5, 8, 9, 16, 31, 32, 33, 64, 65, 129 };
        int64_t M = edges[op_rng_int(0, 12)], N = edges[op_rng_int(0, 12)];
        int64_t K = op_rng_int(1, 700);
        float *x;
        struct op_qmatrix qm;
        struct op_pair *ts, *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        struct op_pair *tw = op_pair_quantized(N, K, 4.0f, &qm, &ts);
        int bias_mode = op_rng_int(0, 2);
        char what[128];
        snprintf(what, sizeof what, "MATMUL I8 random M=%lld K=%lld N=%lld bias %d",
                 (long long)M, (long long)K, (long long)N, bias_mode);
        matmul_q_run(chk, what, x, tx, tw, ts, NULL, qm.deq, M, K, N, bias_mode,
                      M <= 32 ? tol_small : tol_large);
        op_release_all();
    }

    /* W at an odd byte offset (no vector alignment) and the scales one float in, each inside
     * a bigger arena; K a multiple of 16, so only the offset stops a 16-byte path. */
    for (int big_m = 0; big_m < 2; big_m++) {
        const int64_t M = big_m ? 40 : 3, K = 48, N = 9;
        float *x;
        struct op_qmatrix qm;
        op_quantize_i8(N, K, 1.0f, &qm);
        struct op_pair *wbuf = op_pair_new(MMRT_DTYPE_I8, SHAPE(N * K + 5));
        int8_t *wb = op_alloc((size_t)(N * K + 5));
        memset(wb, 0x7f, (size_t)(N * K + 5));
        memcpy(wb + 5, qm.q, (size_t)(N * K));
        op_pair_upload(wbuf, wb);
        struct op_pair *sbuf = op_pair_new(MMRT_DTYPE_F32, SHAPE(N + 2));
        float *sb = op_alloc((size_t)(N + 2) * sizeof(float));
        sb[0] = sb[N + 1] = NAN;
        memcpy(sb + 1, qm.scale, (size_t)N * sizeof(float));
        op_pair_upload(sbuf, sb);
        struct op_pair tw = op_pair_view(wbuf, MMRT_DTYPE_I8, SHAPE(N, K),
                                         (const int64_t[]){ K, 1 }, 5);
        struct op_pair ts = op_pair_view(sbuf, MMRT_DTYPE_F32, SHAPE(N), (const int64_t[]){ 4 }, 4);
        struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        char what[128];
        snprintf(what, sizeof what, "MATMUL I8 M=%lld W at byte offset 5", (long long)M);
        matmul_q_run(chk, what, x, tx, &tw, &ts, NULL, qm.deq, M, K, N, 2,
                      M <= 32 ? tol_small : tol_large);
        op_release_all();
    }

    /* What the contract refuses, on both plugins. */
    float *x, *wf;
    struct op_qmatrix qm;
    struct op_pair *ts, *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(2, 16));
    struct op_pair *tw = op_pair_quantized(8, 16, 1.0f, &qm, &ts);
    struct op_pair *twf = op_pair_rand(MMRT_DTYPE_F16, -1, 1, &wf, SHAPE(8, 16));
    struct op_pair *short_s = op_pair_new(MMRT_DTYPE_F32, SHAPE(7));
    struct op_pair *f16_s = op_pair_new(MMRT_DTYPE_F16, SHAPE(8));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 8));
    struct op_pair *no_s[4] = { tx, tw, NULL, NULL }, *float_s[4] = { tx, twf, NULL, ts },
                   *bad_n[4] = { tx, tw, NULL, short_s }, *bad_t[4] = { tx, tw, NULL, f16_s };
    for (int d = 0; d < 2; d++) {
        matmul_q_refused(d, no_s, 2, ty, "src3 (scales) is absent");
        matmul_q_refused(d, no_s, 4, ty, "src3 (scales) is absent");
        matmul_q_refused(d, float_s, 4, ty, "src3 (scales) goes only with an I8 or U4 W");
        matmul_q_refused(d, bad_n, 4, ty, "src3 (scales) has 7 elements");
        matmul_q_refused(d, bad_t, 4, ty, "src3 (scales) has dtype F16");
    }
    op_release_all();
}

/* ---- MATMUL with U4 weights ------------------------------------------------------------- */

struct op_pair *op_pair_quantized_u4(int64_t N, int64_t K, int64_t gs, float hi,
                                     struct op_q4matrix *qm, struct op_pair **scales,
                                     struct op_pair **zeros)
{
    op_quantize_u4(N, K, gs, hi, qm);
    struct op_pair *w = op_pair_new(MMRT_DTYPE_U4, SHAPE(N, K / 2));
    op_pair_upload(w, qm->q);
    *scales = op_pair_new(MMRT_DTYPE_F32, SHAPE(N, K / gs));
    op_pair_upload(*scales, qm->scale);
    *zeros = op_pair_new(MMRT_DTYPE_F32, SHAPE(N, K / gs));
    op_pair_upload(*zeros, qm->zero);
    return w;
}

void op_case_matmul_u4(const struct op_checks *chk, double tol_small, double tol_large)
{
    static const struct {
        int64_t M, K, N, gs;
        bool big;
    } cases[] = {
        { 1, 32, 1, 32, false },    { 1, 64, 7, 32, false },    { 3, 128, 5, 64, false },
        { 4, 256, 9, 128, false },  { 5, 96, 65, 32, false },   { 8, 128, 129, 128, false },
        { 9, 192, 33, 64, false },  { 17, 64, 31, 64, false },  { 32, 256, 40, 32, false },
        { 33, 128, 16, 128, false }, { 33, 96, 67, 32, false }, { 70, 320, 70, 64, false },
        { 70, 256, 3, 256, false }, { 1, 1024, 513, 128, false }, { 64, 160, 96, 32, false },
        { 100, 384, 130, 128, false }, { 2, 4096, 3, 128, false }, { 31, 64, 1, 64, false },
        { 65, 32, 1, 32, false },   { 1, 4096, 256, 128, true }, { 300, 1024, 200, 64, true },
        { 129, 4096, 65, 128, true },
    };
    op_rng_seed(41);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t M = cases[c].M, K = cases[c].K, N = cases[c].N, gs = cases[c].gs;
        if (cases[c].big && !chk->big)
            continue;
        int bias_mode = (int)(c % 3);
        float *x;
        struct op_q4matrix qm;
        struct op_pair *ts, *tz, *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        struct op_pair *tw = op_pair_quantized_u4(N, K, gs, 2.0f, &qm, &ts, &tz);
        char what[128];
        snprintf(what, sizeof what, "MATMUL U4 M=%lld K=%lld N=%lld g%lld bias %d",
                 (long long)M, (long long)K, (long long)N, (long long)gs, bias_mode);
        matmul_q_run(chk, what, x, tx, tw, ts, tz, qm.deq, M, K, N, bias_mode,
                     M <= 32 ? tol_small : tol_large);
        op_release_all();
    }

    /* Random shapes around the tile, warp and work-group edges, every group size. */
    for (int c = 0; c < 12; c++) {
        static const int64_t edges[] = { 1, 3, 4, 5, 8, 9, 16, 31, 32, 33, 64, 65, 70, 129 };
        static const int64_t groups[] = { 32, 64, 128 };
        int64_t M = edges[op_rng_int(0, 13)], N = edges[op_rng_int(0, 13)];
        int64_t gs = groups[op_rng_int(0, 2)], K = gs * op_rng_int(1, 6);
        float *x;
        struct op_q4matrix qm;
        struct op_pair *ts, *tz, *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        struct op_pair *tw = op_pair_quantized_u4(N, K, gs, 4.0f, &qm, &ts, &tz);
        int bias_mode = op_rng_int(0, 2);
        char what[128];
        snprintf(what, sizeof what, "MATMUL U4 random M=%lld K=%lld N=%lld g%lld bias %d",
                 (long long)M, (long long)K, (long long)N, (long long)gs, bias_mode);
        matmul_q_run(chk, what, x, tx, tw, ts, tz, qm.deq, M, K, N, bias_mode,
                     M <= 32 ? tol_small : tol_large);
        op_release_all();
    }

    /* W at an odd byte offset (no 16-byte loads), scales and zero points one float in, each
     * inside a bigger arena whose other bytes would poison a stray read. */
    for (int big_m = 0; big_m < 2; big_m++) {
        const int64_t M = big_m ? 40 : 3, K = 128, N = 9, gs = 64, G = K / gs;
        float *x;
        struct op_q4matrix qm;
        op_quantize_u4(N, K, gs, 1.0f, &qm);
        struct op_pair *wbuf = op_pair_new(MMRT_DTYPE_U4, SHAPE(N * K / 2 + 5));
        uint8_t *wb = op_alloc((size_t)(N * K / 2 + 5));
        memset(wb, 0xff, (size_t)(N * K / 2 + 5));
        memcpy(wb + 5, qm.q, (size_t)(N * K / 2));
        op_pair_upload(wbuf, wb);
        struct op_pair *sbuf = op_pair_new(MMRT_DTYPE_F32, SHAPE(N * G + 2));
        struct op_pair *zbuf = op_pair_new(MMRT_DTYPE_F32, SHAPE(N * G + 2));
        float *sb = op_alloc((size_t)(N * G + 2) * sizeof(float));
        float *zb = op_alloc((size_t)(N * G + 2) * sizeof(float));
        sb[0] = sb[N * G + 1] = zb[0] = zb[N * G + 1] = NAN;
        memcpy(sb + 1, qm.scale, (size_t)(N * G) * sizeof(float));
        memcpy(zb + 1, qm.zero, (size_t)(N * G) * sizeof(float));
        op_pair_upload(sbuf, sb);
        op_pair_upload(zbuf, zb);
        struct op_pair tw = op_pair_view(wbuf, MMRT_DTYPE_U4, SHAPE(N, K / 2),
                                         (const int64_t[]){ K / 2, 1 }, 5);
        struct op_pair ts = op_pair_view(sbuf, MMRT_DTYPE_F32, SHAPE(N, G),
                                         (const int64_t[]){ G * 4, 4 }, 4);
        struct op_pair tz = op_pair_view(zbuf, MMRT_DTYPE_F32, SHAPE(N, G),
                                         (const int64_t[]){ G * 4, 4 }, 4);
        struct op_pair *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(M, K));
        char what[128];
        snprintf(what, sizeof what, "MATMUL U4 M=%lld W at byte offset 5", (long long)M);
        matmul_q_run(chk, what, x, tx, &tw, &ts, &tz, qm.deq, M, K, N, 2,
                     M <= 32 ? tol_small : tol_large);
        op_release_all();
    }

    /* K = 0, an empty sum the contract accepts (W [N, 0], one group): y is the bias, on the
     * GEMV (M = 1) and on the blocked path (M = 40). */
    for (int64_t M = 1; M <= 40; M += 39) {
        float *sv;
        struct op_pair *tx0 = op_pair_new(MMRT_DTYPE_F32, SHAPE(M, 0));
        struct op_pair *tw0 = op_pair_new(MMRT_DTYPE_U4, SHAPE(9, 0));
        struct op_pair *ts0 = op_pair_rand(MMRT_DTYPE_F32, 1, 2, &sv, SHAPE(9, 1));
        char what[64];
        snprintf(what, sizeof what, "MATMUL U4 K=0 M=%lld", (long long)M);
        matmul_q_run(chk, what, NULL, tx0, tw0, ts0, ts0, NULL, M, 0, 9, 2, 0.0);
        op_release_all();
    }

    /* What the contract refuses, on both plugins. x is [2, 64] against W [8, 64/2]. */
    float *x, *wf;
    struct op_q4matrix qm;
    struct op_pair *ts, *tz, *tx = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &x, SHAPE(2, 64));
    struct op_pair *tw = op_pair_quantized_u4(8, 64, 32, 1.0f, &qm, &ts, &tz);
    struct op_pair *twf = op_pair_rand(MMRT_DTYPE_F16, -1, 1, &wf, SHAPE(8, 64));
    struct op_pair *x48 = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &wf, SHAPE(2, 48));
    struct op_pair *w48 = op_pair_new(MMRT_DTYPE_U4, SHAPE(8, 24));
    struct op_pair *s48 = op_pair_new(MMRT_DTYPE_F32, SHAPE(8, 1));
    struct op_pair *x96 = op_pair_rand(MMRT_DTYPE_F32, -1, 1, &wf, SHAPE(2, 96));
    struct op_pair *w96 = op_pair_new(MMRT_DTYPE_U4, SHAPE(8, 48));
    struct op_pair *s96 = op_pair_new(MMRT_DTYPE_F32, SHAPE(8, 2)); /* groups of 48 */
    struct op_pair *s3 = op_pair_new(MMRT_DTYPE_F32, SHAPE(8, 3));  /* 3 does not divide 64 */
    struct op_pair *s7 = op_pair_new(MMRT_DTYPE_F32, SHAPE(7, 2));
    struct op_pair *z1 = op_pair_new(MMRT_DTYPE_F32, SHAPE(8, 1));
    struct op_pair *f16_s = op_pair_new(MMRT_DTYPE_F16, SHAPE(8, 2));
    struct op_pair *ty = op_pair_new(MMRT_DTYPE_F32, SHAPE(2, 8));
    struct op_pair *no_z[5] = { tx, tw, NULL, ts, NULL }, *no_s[5] = { tx, tw, NULL, NULL, tz },
                   *k48[5] = { x48, w48, NULL, s48, s48 },
                   *g48[5] = { x96, w96, NULL, s96, s96 }, *g3[5] = { tx, tw, NULL, s3, s3 },
                   *bad_n[5] = { tx, tw, NULL, s7, s7 }, *bad_z[5] = { tx, tw, NULL, ts, z1 },
                   *bad_t[5] = { tx, tw, NULL, f16_s, tz },
                   *float_z[5] = { tx, twf, NULL, NULL, tz };
    for (int d = 0; d < 2; d++) {
        matmul_q_refused(d, no_z, 4, ty, "src4 (zero points) is absent");
        matmul_q_refused(d, no_z, 5, ty, "src4 (zero points) is absent");
        matmul_q_refused(d, no_s, 5, ty, "src3 (scales) is absent");
        matmul_q_refused(d, no_s, 2, ty, "src3 (scales) is absent");
        matmul_q_refused(d, k48, 5, ty, "K a multiple of 32");
        matmul_q_refused(d, g48, 5, ty, "K / G a multiple of 32");
        matmul_q_refused(d, g3, 5, ty, "K / G a multiple of 32");
        matmul_q_refused(d, bad_n, 5, ty, "want [8, G]");
        matmul_q_refused(d, bad_z, 5, ty, "src4 (zero points) is [8, 1]");
        matmul_q_refused(d, bad_t, 5, ty, "src3 (scales) has dtype F16");
        matmul_q_refused(d, float_z, 5, ty, "src4 (zero points) goes only with a U4 W");
    }
    op_release_all();
}

/* ---- GATHER_HEADS ------------------------------------------------------------------------ */

const struct op_gather_case op_gather_cases[] = {
    { 1, 1, 1, 1, 1, false, false },
    { 64, 8, 128, 40, 1, false, false },   /* keep rows one by one (D = 128, 8 KV heads) */
    { 24, 2, 40, 48, 1, true, false },     /* every row twice, reversed */
    { 64, 2, 40, 17, 4, false, false },    /* 2×2 pooling, ragged */
    { 300, 4, 128, 33, 9, false, false },  /* 3×3 pooling, ragged */
    { 16, 3, 7, 9, 4, false, false },      /* D off every vector width */
    { 50, 1, 257, 5, 2, false, false },    /* a row wider than a warp's or work-group's pass */
    { 5, 2, 64, 8, 9, false, false },      /* more entries than table rows */
    { 2304, 8, 128, 576, 4, false, true }, /* a 48×48 image pooled 2×2 */
};
const size_t op_n_gather_cases = sizeof op_gather_cases / sizeof op_gather_cases[0];

void op_gather_build(const struct op_gather_case *gc, enum mmrt_dtype dt, uint64_t seed,
                     struct op_gather_data *d)
{
    const int64_t R = gc->R, H = gc->H, D = gc->D, N = gc->N, G = gc->G;
    op_rng_seed(seed);
    d->table = op_rand_f((R + 2) * H * D, -100, 100);
    d->table[0] = -0.0f; /* an I8 code times its scale is never −0: */
    if (dt == MMRT_DTYPE_I8)
        op_i8_exact_rows(d->table, R * H, D, 100);
    op_round_to(dt, d->table, R * H * D);
    for (int64_t i = R * H * D; i < (R + 2) * H * D; i++)
        d->table[i] = NAN;
    d->idx = op_alloc((size_t)(N * H * G) * sizeof(int32_t));
    static const int32_t skipped[] = { INT32_MAX, -1, INT32_MIN };
    for (int64_t grp = 0; grp < N * H; grp++) {
        int32_t *ix = d->idx + grp * G;
        const int64_t n = grp / H;
        if (gc->reversed) {
            ix[0] = (int32_t)(R - 1 - n % R);
            continue;
        }
        const int keep = G > 1 ? op_rng_int(1, (int)G) : 1;
        for (int64_t g = 0; g < G; g++)
            ix[g] = g < keep ? op_rng_int(0, (int)R - 1) : -1;
        for (int64_t g = G - 1; g > 0; g--) { /* the padding anywhere in the group */
            int64_t j = op_rng_int(0, (int)g);
            int32_t t = ix[g];
            ix[g] = ix[j];
            ix[j] = t;
        }
        if (grp % 7 == 5)
            ix[op_rng_int(0, (int)G - 1)] = (int32_t)(R + grp % 2);
        if (grp % 11 == 10)
            ix[op_rng_int(0, (int)G - 1)] = skipped[(grp / 11) % 3];
    }
    if (!gc->reversed) {
        d->idx[0] = 0; /* the −0 goes first */
        if (G == 1 && N > 1)
            d->idx[H] = d->idx[0];
        if (N * H > 2)
            for (int64_t g = 0; g < G; g++)
                d->idx[2 * G + g] = g % 2 ? INT32_MIN : -1;
    }
    d->want = op_alloc((size_t)(N * H * D) * sizeof(float));
    ref_gather_heads(d->table, d->idx, R, H, D, N, G, d->want);
}

/* The case's tensors on both plugins, uploaded: the table a view of its allocation's first R
 * rows, dst filled with NaN. */
static void gather_pairs(const struct op_gather_case *gc, enum mmrt_dtype dt,
                         const struct op_gather_data *d, struct op_pair *tab, struct op_pair **idx,
                         struct op_pair **y, struct op_pair **scales)
{
    const int64_t R = gc->R, H = gc->H, D = gc->D, N = gc->N, G = gc->G;
    const int64_t es = (int64_t)mmrt_dtype_size(dt);
    struct op_pair *base = op_pair_new(dt, SHAPE(R + 2, H, D));
    *scales = NULL;
    if (dt == MMRT_DTYPE_I8) { /* the NaN rows past R become scale NaN */
        float *s;
        op_pair_upload(base, op_i8_encode(d->table, (R + 2) * H, D, &s));
        *scales = op_pair_new(MMRT_DTYPE_F32, SHAPE(R * H));
        op_pair_upload(*scales, s);
    } else {
        op_pair_upload(base, op_encode(dt, d->table, (R + 2) * H * D));
    }
    *tab = op_pair_view(base, dt, SHAPE(R, H, D), (const int64_t[]){ H * D * es, D * es, es }, 0);
    *idx = op_pair_new(MMRT_DTYPE_I32, SHAPE(N, H, G));
    op_pair_upload(*idx, d->idx);
    *y = op_pair_new(MMRT_DTYPE_F32, SHAPE(N, H, D));
    float *nan = op_alloc((size_t)(N * H * D) * sizeof(float));
    for (int64_t i = 0; i < N * H * D; i++)
        nan[i] = NAN;
    op_pair_upload(*y, nan);
}

void op_case_gather_heads(const struct op_checks *chk)
{
    for (size_t k = 0; k < op_n_gather_cases; k++)
        for (int t = 0; t < 5; t++) { /* t = 4: an I8 table with row scales */
            const struct op_gather_case *gc = &op_gather_cases[k];
            if ((gc->big && !chk->big) || (t == 3 && !chk->kv_f8) || (t == 4 && !chk->kv_i8))
                continue;
            enum mmrt_dtype dt = t == 4 ? MMRT_DTYPE_I8 : op_kv_table_dtypes[t];
            struct op_gather_data d;
            op_gather_build(gc, dt, 230 + k, &d);
            struct op_pair tab, *idx, *y, *scales;
            gather_pairs(gc, dt, &d, &tab, &idx, &y, &scales);
            struct op_pair *src[3] = { &tab, idx, scales };
            op_pair_run(MMRT_OP_GATHER_HEADS, src, scales ? 3 : 2, y, NULL, 0);
            void *g, *c;
            op_pair_download_both(y, &g, &c);
            char what[128];
            snprintf(what, sizeof what, "GATHER_HEADS case %zu table [%lld, %lld, %lld] %s G %lld",
                     k, (long long)gc->R, (long long)gc->H, (long long)gc->D,
                     mmrt_dtype_name_of(dt), (long long)gc->G);
            chk->bytes(MMRT_OP_GATHER_HEADS, what, g, c, d.want,
                       (size_t)(gc->N * gc->H * gc->D) * sizeof(float));
            op_release_all();
        }

    /* The indices live in device memory: the same launch after a new upload reads them. */
    const struct op_gather_case *gc = &op_gather_cases[3];
    struct op_gather_data d, d2;
    op_gather_build(gc, MMRT_DTYPE_F16, 77, &d);
    op_gather_build(gc, MMRT_DTYPE_F16, 77, &d2); /* the same table… */
    for (int64_t i = 0; i < gc->N * gc->H * gc->G; i++) /* … other rows */
        d2.idx[i] = d.idx[gc->N * gc->H * gc->G - 1 - i];
    ref_gather_heads(d2.table, d2.idx, gc->R, gc->H, gc->D, gc->N, gc->G, d2.want);
    struct op_pair tab, *idx, *y, *no_scales;
    gather_pairs(gc, MMRT_DTYPE_F16, &d, &tab, &idx, &y, &no_scales);
    struct op_pair *src[2] = { &tab, idx };
    op_pair_run(MMRT_OP_GATHER_HEADS, src, 2, y, NULL, 0);
    op_pair_upload(idx, d2.idx);
    op_pair_run(MMRT_OP_GATHER_HEADS, src, 2, y, NULL, 0);
    void *g, *c;
    op_pair_download_both(y, &g, &c);
    chk->bytes(MMRT_OP_GATHER_HEADS, "GATHER_HEADS after a new idx upload", g, c, d2.want,
               (size_t)(gc->N * gc->H * gc->D) * sizeof(float));
    op_release_all();
}

/* ---- L2_NORM ----------------------------------------------------------------------------- */

const struct op_l2_case op_l2_cases[] = {
    { 2, { 1, 1 }, false },    { 2, { 7, 128 }, false },  { 3, { 33, 8, 128 }, false },
    { 3, { 5, 3, 40 }, false }, { 2, { 9, 7 }, false },   { 2, { 5, 4099 }, false },
    { 1, { 7 }, false },       { 2, { 300, 8 }, false },  { 2, { 4, 0 }, false },
    { 2, { 3, 1000 }, false }, { 2, { 0, 128 }, false }, { 3, { 2304, 8, 128 }, true },
};
const size_t op_n_l2_cases = sizeof op_l2_cases / sizeof op_l2_cases[0];

float *op_l2_values(int64_t rows, int64_t n)
{
    float *v = op_alloc((size_t)(rows * n) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float amp = r % 5 == 4 ? 0.0f : ldexpf(1.0f, (int)(r % 41) - 20);
        for (int64_t k = 0; k < n; k++)
            v[r * n + k] = amp * op_rng_f(-1, 1);
    }
    return v;
}

void op_l2_rows_close(const char *what, const float *got, const double *ref, int64_t rows,
                      double tol)
{
    for (int64_t r = 0; r < rows; r++) {
        double e = fabs((double)got[r] - ref[r]);
        if (ref[r] == 0 ? got[r] != 0 : !(e <= tol * ref[r]))
            fail_msg("%s: row %lld is %.9g, reference %.9g (relative error %.3g, tolerance %.1g)",
                     what, (long long)r, (double)got[r], ref[r], ref[r] ? e / ref[r] : e, tol);
    }
}

void op_case_l2_norm(const struct op_checks *chk, double tol)
{
    op_rng_seed(24);
    for (size_t k = 0; k < op_n_l2_cases; k++) {
        const struct op_l2_case *lc = &op_l2_cases[k];
        if (lc->big && !chk->big)
            continue;
        int64_t rows = 1, n = lc->ne[lc->n_dims - 1];
        for (int i = 0; i < lc->n_dims - 1; i++)
            rows *= lc->ne[i];
        struct op_pair *x = op_pair_new(MMRT_DTYPE_F32, lc->n_dims, lc->ne);
        float *v = op_l2_values(rows, n);
        op_pair_upload(x, v);
        struct op_pair *y = op_pair_new(MMRT_DTYPE_F32, SHAPE(rows)), *src[1] = { x };
        op_pair_run(MMRT_OP_L2_NORM, src, 1, y, NULL, 0);
        double *ref = op_ref_buf(rows);
        ref_l2_norm(v, rows, n, ref);
        void *g, *c;
        op_pair_download_both(y, &g, &c);
        char what[96];
        snprintf(what, sizeof what, "L2_NORM case %zu: %lld rows of %lld (%d dims)", k,
                 (long long)rows, (long long)n, lc->n_dims);
        chk->close(MMRT_OP_L2_NORM, what, g, c, ref, rows, tol);
        op_l2_rows_close(what, g, ref, rows, tol);
        op_release_all();
    }
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void expect_refused(struct harness *h, mmrt_status st, const char *op, const char *needle)
{
    const char *msg = h->plugin->last_error(h->dev);
    if (st != MMRT_ERR_INVALID_ARG)
        fail_msg("%s (%s): status %d, want MMRT_ERR_INVALID_ARG (%s)", op, needle, (int)st, msg);
    if (!strstr(msg, op) || !strstr(msg, needle))
        fail_msg("%s: message \"%s\" should name the op and say \"%s\"", op, msg, needle);
}

void op_gather_l2_refusals(struct harness *h)
{
    const enum mmrt_dtype F32 = MMRT_DTYPE_F32, I32 = MMRT_DTYPE_I32;
    const enum mmrt_op GH = MMRT_OP_GATHER_HEADS, L2 = MMRT_OP_L2_NORM;
    const char *gh = "GATHER_HEADS", *l2 = "L2_NORM";
    struct harness_tensor *tab = op_tensor_new(h, MMRT_DTYPE_F16, SHAPE(6, 2, 8));
    struct harness_tensor *idx = op_tensor_new(h, I32, SHAPE(4, 2, 3));
    struct harness_tensor *y = op_tensor_new(h, F32, SHAPE(4, 2, 8));
    int32_t iv[24];
    for (int i = 0; i < 24; i++)
        iv[i] = i % 7 - 1;
    assert_int_equal(harness_upload(h, idx, iv), MMRT_OK);
    struct harness_tensor *ok[2] = { tab, idx };
    assert_int_equal(harness_run(h, GH, ok, 2, y, NULL, 0), MMRT_OK);

    struct harness_tensor *tab2 = op_tensor_new(h, F32, SHAPE(12, 8)), *s1[2] = { tab2, idx };
    expect_refused(h, harness_run(h, GH, s1, 2, y, NULL, 0), gh, "src0 (table) must have 3 dims");
    struct harness_tensor *tabi = op_tensor_new(h, I32, SHAPE(6, 2, 8)), *s2[2] = { tabi, idx };
    expect_refused(h, harness_run(h, GH, s2, 2, y, NULL, 0), gh, "src0 (table) has dtype I32");
    struct harness_tensor *wide = op_tensor_new(h, MMRT_DTYPE_F16, SHAPE(6, 2, 9));
    struct harness_tensor strided =
        op_view(wide, MMRT_DTYPE_F16, SHAPE(6, 2, 8), (const int64_t[]){ 18 * 2, 9 * 2, 2 }, 0);
    struct harness_tensor *s3[2] = { &strided, idx };
    expect_refused(h, harness_run(h, GH, s3, 2, y, NULL, 0), gh,
                   "src0 (table) must be contiguous");
    struct harness_tensor *idxf = op_tensor_new(h, F32, SHAPE(4, 2, 3)), *s4[2] = { tab, idxf };
    expect_refused(h, harness_run(h, GH, s4, 2, y, NULL, 0), gh, "src1 (idx) has dtype F32");
    struct harness_tensor *idx3 = op_tensor_new(h, I32, SHAPE(4, 3, 1)), *s5[2] = { tab, idx3 };
    expect_refused(h, harness_run(h, GH, s5, 2, y, NULL, 0), gh,
                   "src1 (idx) has 3 heads, src0 (table) 2");
    struct harness_tensor *idx0 = op_tensor_new(h, I32, SHAPE(4, 2, 0)), *s6[2] = { tab, idx0 };
    expect_refused(h, harness_run(h, GH, s6, 2, y, NULL, 0), gh, "G = 0");
    struct harness_tensor *y5 = op_tensor_new(h, F32, SHAPE(5, 2, 8));
    expect_refused(h, harness_run(h, GH, ok, 2, y5, NULL, 0), gh, "dst must be [N 4, H 2, D 8]");
    struct harness_tensor *yh = op_tensor_new(h, MMRT_DTYPE_F16, SHAPE(4, 2, 8));
    expect_refused(h, harness_run(h, GH, ok, 2, yh, NULL, 0), gh, "dst has dtype F16");
    /* dst over the table's own bytes (an F32 table read as its own output) */
    struct harness_tensor *tf = op_tensor_new(h, F32, SHAPE(6, 2, 8)), *s7[2] = { tf, idx };
    struct harness_tensor yin =
        op_view(tf, F32, SHAPE(4, 2, 8), (const int64_t[]){ 16 * 4, 8 * 4, 4 }, 16 * 4);
    expect_refused(h, harness_run(h, GH, s7, 2, &yin, NULL, 0), gh, "dst overlaps src0 (table)");

    struct harness_tensor *x = op_tensor_new(h, F32, SHAPE(4, 8));
    struct harness_tensor *n4 = op_tensor_new(h, F32, SHAPE(4)), *sx[1] = { x };
    assert_int_equal(harness_run(h, L2, sx, 1, n4, NULL, 0), MMRT_OK);
    struct harness_tensor *xh = op_tensor_new(h, MMRT_DTYPE_F16, SHAPE(4, 8)), *sh[1] = { xh };
    expect_refused(h, harness_run(h, L2, sh, 1, n4, NULL, 0), l2, "src0 has dtype F16");
    struct harness_tensor *n41 = op_tensor_new(h, F32, SHAPE(4, 1));
    expect_refused(h, harness_run(h, L2, sx, 1, n41, NULL, 0), l2, "dst must have 1 dims");
    struct harness_tensor *n5 = op_tensor_new(h, F32, SHAPE(5));
    expect_refused(h, harness_run(h, L2, sx, 1, n5, NULL, 0), l2,
                   "dst has 5 elements, src0 has 4 rows");
    struct harness_tensor *ni = op_tensor_new(h, I32, SHAPE(4));
    expect_refused(h, harness_run(h, L2, sx, 1, ni, NULL, 0), l2, "dst has dtype I32");
    struct harness_tensor xin =
        op_view(x, F32, SHAPE(4), (const int64_t[]){ 4 }, 0); /* dst = x's first row */
    expect_refused(h, harness_run(h, L2, sx, 1, &xin, NULL, 0), l2, "dst overlaps src0");
    op_release_all();
}
