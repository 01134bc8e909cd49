/*
 * plugins/cuda/emu/emu_kernels_test.cpp — runs the CUDA plugin's kernels in the host emulator
 * (cu_emu.h) against the double-precision reference of tests/ref_ops.c, so that indexing,
 * masking, tiling, split-KV and reductions are checked on machines without a GPU.
 *
 * It calls the launchers of cuda_kernels.h directly with host memory ("device" pointers are
 * host pointers under the emulator). Shapes are small — every CUDA thread is a host thread —
 * but chosen to cross the tile boundaries of each kernel. cuBLAS is not emulated: the GEMM
 * path is checked here only through its operand preparation (hi + lo must reproduce x) and,
 * for I8 weights, the code widening and the scale epilogue around it, for U4 weights their
 * dequantization into f16 rows with a power of two each.
 *
 * Output: one line per check, then "N passed, N failed"; exit status 1 on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "../cuda_kernels.h"
#include "mmrt/plugin.h"

extern "C" {
#include "kv_i8_ref.h"
#include "ref_ops.h"
}

static int g_pass, g_fail;
static uint64_t g_rng = 1;

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
static std::vector<float> rand_vec(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = rng_f(lo, hi);
    return v;
}

/* Host-side f16 / bf16 (round to nearest even), for inputs and expected values. */
static uint16_t h_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        float t;
        memcpy(&t, &ax, 4);
        t += 0.5f;
        uint32_t tb;
        memcpy(&tb, &t, 4);
        return (uint16_t)(sign | (tb - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax = ax - (112u << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (ax >> 13));
}
static float f16_f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) x = sign | 0x7f800000u | (m << 13);
    else if (e) x = sign | ((e + 112u) << 23) | (m << 13);
    else {
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&x, &f, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t h_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static float bf16_f(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* plugin.h "I8 with row scales" (tools/common/kv_i8_ref.h): writes the D codes, returns s. */
static float ref_i8_row(const float *x, int64_t D, int8_t *codes)
{
    float s;
    mmrt_ref_i8_row_quantize(x, D, codes, &s);
    return s;
}

/* What a reader widens an I8 element to: one rounded f32 product. */
static float i8_value(int8_t code, float scale)
{
    return (float)code * scale;
}

/* max |got − ref| / max |ref| ≤ tol (NaN must match NaN). */
static void check(const char *what, const float *got, const double *ref, size_t n, double tol,
                  double floor = 0.0)
{
    double mr = 0, me = 0;
    size_t worst = 0;
    bool nan_bad = false;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (isnan(ref[i]) != isnan(got[i]) && !nan_bad) {
                nan_bad = true;
                worst = i;
            }
            continue;
        }
        mr = fmax(mr, fabs(ref[i]));
        double e = fabs((double)got[i] - ref[i]);
        if (e > me) {
            me = e;
            worst = i;
        }
    }
    mr = fmax(mr, floor); /* tiny outputs: near-cancellation is judged against a unit scale */
    double rel = me / (mr > 0 ? mr : 1);
    bool ok = !nan_bad && rel <= tol;
    printf("%s %s: rel err %.3g (tol %.1g)%s", ok ? "PASS" : "FAIL", what, rel, tol,
           nan_bad ? " NaN mismatch" : "");
    if (!ok && n)
        printf(" worst [%zu] got %.9g want %.9g", worst, (double)got[worst], ref[worst]);
    printf("\n");
    (ok ? g_pass : g_fail)++;
}

static void expect(const char *what, bool ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    (ok ? g_pass : g_fail)++;
}

/* ---- attention ------------------------------------------------------------------------ */

struct AttnCase {
    int Hq, Hkv, D, n_seq; /* n_seq 0: no cu_seqlens */
    std::vector<int> lq, lk;
    int causal, f16, n_sm; /* f16: K/V 0 F32, 1 F16, 2 F8E4M3; n_sm small forces split-KV
                              when rows are few */
    int layout;            /* 0 dense; 1 head-major cache with padding; 2 fused k|v */
    int window;            /* sliding window (causal only); 0 = none */
};

static void run_attention(const AttnCase &c, int idx)
{
    int n_seq = c.n_seq ? c.n_seq : 1;
    std::vector<int32_t> cq(n_seq + 1, 0), ck(n_seq + 1, 0);
    for (int s = 0; s < n_seq; s++) {
        cq[s + 1] = cq[s] + c.lq[s];
        ck[s + 1] = ck[s] + c.lk[s];
    }
    int64_t T = cq[n_seq], S = ck[n_seq], Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    auto q = rand_vec(T * Hq * D, -1.5f, 1.5f);
    auto k = rand_vec(S * Hkv * D, -1, 1), v = rand_vec(S * Hkv * D, -1, 1);
    /* With a window, the keys no query of a sequence sees (before its first query's window)
     * are NaN: a kernel that loads and masks them, rather than skipping them, fails. */
    for (int s = 0; c.window > 0 && c.causal && s < n_seq; s++) {
        int64_t unseen = c.lq[s] ? c.lk[s] - c.lq[s] + 1 - c.window : c.lk[s];
        for (int64_t i = 0; i < unseen * Hkv * D; i++)
            k[ck[s] * Hkv * D + i] = v[ck[s] * Hkv * D + i] = NAN;
    }
    if (c.f16)
        for (auto *a : {&k, &v})
            for (auto &x : *a)
                x = c.f16 == 2 ? ref_f8e4m3_value(ref_f8e4m3_encode(x)) : f16_f(h_f16(x));
    /* Device copies in the requested layout; cells outside the view hold NaN. */
    int64_t cap = S + 3, es = c.f16 == 2 ? 1 : c.f16 ? 2 : 4;
    std::vector<uint8_t> kbuf, vbuf;
    int64_t ks0, ks1, vs0, vs1, koff = 0, voff = 0;
    auto put = [&](std::vector<uint8_t> &buf, int64_t idx_el, float val) {
        if (c.f16 == 2) {
            buf[idx_el] = ref_f8e4m3_encode(val);
        } else if (c.f16) {
            uint16_t h = h_f16(val);
            memcpy(&buf[idx_el * 2], &h, 2);
        } else {
            memcpy(&buf[idx_el * 4], &val, 4);
        }
    };
    auto fill_nan = [&](std::vector<uint8_t> &buf, int64_t n_el) {
        buf.assign(n_el * es, 0);
        for (int64_t i = 0; i < n_el; i++)
            put(buf, i, NAN);
    };
    if (c.layout == 1) { /* [Hkv, cap, D], tokens from 1 */
        fill_nan(kbuf, Hkv * cap * D);
        fill_nan(vbuf, Hkv * cap * D);
        ks0 = vs0 = D;
        ks1 = vs1 = cap * D;
        koff = voff = D;
    } else if (c.layout == 2) { /* one [S, 2, Hkv, D] buffer */
        fill_nan(kbuf, S * 2 * Hkv * D + 1);
        ks0 = vs0 = 2 * Hkv * D;
        ks1 = vs1 = D;
        koff = 0;
        voff = Hkv * D;
    } else {
        fill_nan(kbuf, S * Hkv * D + 1);
        fill_nan(vbuf, S * Hkv * D + 1);
        ks0 = vs0 = Hkv * D;
        ks1 = vs1 = D;
    }
    for (int64_t s = 0; s < S; s++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t d = 0; d < D; d++) {
                put(kbuf, koff + s * ks0 + g * ks1 + d, k[(s * Hkv + g) * D + d]);
                put(c.layout == 2 ? kbuf : vbuf, voff + s * vs0 + g * vs1 + d,
                    v[(s * Hkv + g) * D + d]);
            }
    std::vector<float> y(T * Hq * D + 1, NAN);
    std::vector<float> ws(1 << 20);
    cu_err_word err = {};
    cu_attn_desc d = {};
    d.q = q.data();
    d.k = kbuf.data() + koff * es;
    d.v = (c.layout == 2 ? kbuf.data() : vbuf.data()) + voff * es;
    d.y = y.data();
    d.cu_q = c.n_seq ? cq.data() : nullptr;
    d.cu_k = c.n_seq ? ck.data() : nullptr;
    d.T = T;
    d.S = S;
    d.k_s0 = ks0;
    d.k_s1 = ks1;
    d.v_s0 = vs0;
    d.v_s1 = vs1;
    d.Hq = (int)Hq;
    d.Hkv = (int)Hkv;
    d.D = (int)D;
    d.n_seq = n_seq;
    d.k_dtype = d.v_dtype = c.f16 == 2   ? MMRT_DTYPE_F8E4M3
                            : c.f16 ? MMRT_DTYPE_F16
                                    : MMRT_DTYPE_F32;
    d.causal = c.causal;
    d.window = c.window;
    d.scale = 1.0f / sqrtf((float)D);
    d.ws = ws.data();
    d.ws_floats = (int64_t)ws.size();
    d.n_sm = c.n_sm;
    d.err = &err;
    cu_launch_attention(&d, nullptr);
    std::vector<double> ref(T * Hq * D + 1, 0.0);
    ref_attention(q.data(), k.data(), v.data(), T, S, Hq, Hkv, D, c.n_seq ? cq.data() : nullptr,
                  c.n_seq ? ck.data() : nullptr, n_seq, d.scale, c.causal, c.window, ref.data());
    char what[220];
    snprintf(what, sizeof what,
             "ATTENTION #%d T %lld S %lld Hq %lld Hkv %lld D %lld n_seq %d causal %d window %d %s "
             "sm %d layout %d",
             idx, (long long)T, (long long)S, (long long)Hq, (long long)Hkv, (long long)D,
             c.n_seq, c.causal, c.window, c.f16 == 2 ? "f8e4m3" : c.f16 ? "f16" : "f32", c.n_sm,
             c.layout);
    check(what, y.data(), ref.data(), T * Hq * D, 2e-5);
    expect("ATTENTION error word clear", err.code == 0);
}

static void test_attention(void)
{
    std::vector<AttnCase> cases = {
        {4, 4, 64, 0, {7}, {7}, 0, 0, 132, 0, 0},
        {8, 2, 80, 0, {33}, {33}, 1, 1, 132, 0, 0},
        {4, 2, 128, 0, {1}, {37}, 1, 1, 132, 1, 0},                   /* decode */
        {4, 1, 64, 0, {5}, {20}, 1, 0, 132, 1, 0},                    /* chunked prefill */
        {2, 2, 256, 3, {5, 1, 12}, {5, 1, 12}, 0, 0, 132, 2, 0},      /* vision blocks */
        {6, 3, 8, 5, {3, 1, 0, 4, 5}, {10, 1, 0, 4, 2}, 1, 1, 132, 1, 0},
        {2, 1, 64, 0, {130}, {130}, 1, 0, 132, 0, 0},                 /* > 2 row tiles */
        {1, 1, 3, 0, {4}, {9}, 0, 0, 132, 0, 0},                      /* odd D */
        {2, 1, 16, 0, {2}, {0}, 0, 0, 132, 0, 0},                     /* no keys */
        {8, 2, 128, 0, {16}, {16}, 1, 1, 132, 1, 0},                  /* GQA 4 */
        {4, 4, 256, 2, {3, 2}, {40, 7}, 1, 1, 132, 2, 0},
        {2, 2, 96, 0, {65}, {129}, 1, 0, 132, 0, 0},                  /* tile edges, Lq < Lk */
        {2, 1, 100, 4, {1, 63, 64, 65}, {1, 63, 64, 65}, 1, 0, 132, 0, 0},
        {3, 1, 200, 2, {17, 33}, {17, 33}, 0, 1, 132, 0, 0},
        {4, 4, 128, 0, {1}, {300}, 1, 0, 4, 1, 0},                    /* split-KV decode */
        {8, 2, 64, 3, {1, 1, 1}, {200, 97, 300}, 1, 1, 4, 1, 0},      /* split, var-len */
        {2, 2, 80, 2, {2, 1}, {260, 130}, 0, 0, 2, 0, 0},             /* split, bidirectional */
        {4, 1, 256, 0, {1}, {150}, 1, 0, 2, 0, 0},                    /* split, D 256 */
        {2, 1, 64, 2, {7, 3}, {2, 300}, 1, 0, 2, 0, 0},               /* split with empty rows */
        {4, 4, 128, 0, {1}, {2000}, 1, 0, 64, 1, 0},                  /* 15 splits */
        {8, 2, 64, 3, {1, 1, 1}, {700, 97, 900}, 1, 1, 64, 1, 0},     /* 4 splits, var-len */
        {2, 1, 64, 0, {40}, {1500}, 1, 0, 64, 0, 0},                  /* prefill tiles, split */
        /* Sliding windows: decode mid-tile, prefill tiles with a window shorter than a tile
         * and one longer, window 1, split-KV with a window (chunks start at the window's
         * tile), var-length batches, GQA. */
        {4, 2, 128, 0, {1}, {300}, 1, 1, 132, 1, 37},
        {2, 1, 64, 0, {130}, {130}, 1, 0, 132, 0, 20},
        {2, 2, 96, 0, {65}, {129}, 1, 0, 132, 0, 100},
        {2, 1, 16, 0, {9}, {9}, 1, 0, 132, 2, 1},
        {4, 4, 128, 0, {1}, {2000}, 1, 0, 64, 1, 500},           /* split + window */
        {8, 2, 64, 3, {1, 1, 1}, {700, 97, 900}, 1, 1, 64, 1, 64},
        {6, 3, 8, 5, {3, 1, 0, 4, 5}, {10, 1, 0, 4, 2}, 1, 1, 132, 1, 3},
        {2, 1, 64, 0, {40}, {1500}, 1, 0, 64, 0, 70},            /* prefill tiles, split */
        /* FP8 E4M3 K/V (ABI 1.6): decode in a head-major cache, prefill tiles, split-KV
         * var-length with GQA, a window, the fused k|v layout. */
        {4, 2, 128, 0, {1}, {37}, 1, 2, 132, 1, 0},
        {8, 2, 80, 0, {33}, {33}, 1, 2, 132, 0, 0},
        {8, 2, 64, 3, {1, 1, 1}, {200, 97, 300}, 1, 2, 4, 1, 0},
        {4, 2, 128, 0, {1}, {300}, 1, 2, 132, 1, 37},
        {2, 2, 256, 3, {5, 1, 12}, {5, 1, 12}, 0, 2, 132, 2, 0},
    };
    for (size_t i = 0; i < cases.size(); i++)
        run_attention(cases[i], (int)i);

    /* Bad cu_seqlens: reported through the error word, no stray access. */
    std::vector<float> q(4 * 64, 1.0f), k(4 * 64, 1.0f), y(4 * 64, 0.0f);
    int32_t cq[3] = {0, 3, 4}, ck[3] = {0, 5, 4}; /* ck decreases at entry 2 */
    cu_err_word err = {};
    cu_attn_desc d = {};
    d.q = q.data();
    d.k = k.data();
    d.v = k.data();
    d.y = y.data();
    d.cu_q = cq;
    d.cu_k = ck;
    d.T = 4;
    d.S = 4;
    d.k_s0 = d.v_s0 = 64;
    d.k_s1 = d.v_s1 = 64;
    d.Hq = d.Hkv = 1;
    d.D = 64;
    d.n_seq = 2;
    d.k_dtype = d.v_dtype = MMRT_DTYPE_F32;
    d.scale = 0.125f;
    d.n_sm = 132;
    d.err = &err;
    cu_launch_attention(&d, nullptr);
    expect("ATTENTION bad cu_seqlens_k reported",
           err.code == CU_ERRC_SEQLENS && err.v[0] == 1 && err.v[1] == 2 && err.v[2] == 4);
}

/* ---- paged attention ------------------------------------------------------------------ */

/* A paged launch on the host: queries and keys per sequence, the pool laid out with one page
 * size and a permutation of page ids (spare pages and rows past a sequence's end are NaN,
 * table entries past its last page INT32_MAX). */
struct Paged {
    int Hq = 0, Hkv = 0, D = 0, pt = 0, causal = 0, window = 0;
    int f16 = 0; /* pages 0 F32, 1 F16, 2 F8E4M3, 3 I8 with row scales */
    std::vector<int> lq, lk;
    std::vector<float> q;                 /* [T, Hq, D] */
    std::vector<std::vector<float>> k, v; /* per sequence [Lk, Hkv, D] */
    std::vector<int32_t> cq, lens, table;
    std::vector<uint8_t> kp, vp;
    std::vector<float> ks, vs;   /* I8: a scale per pool row of D */
    std::vector<float> kpf, vpf; /* the pools as f32 (I8: code · scale), for the reference */
    int64_t n_pages = 0, max_pages = 1, T = 0;
};

static const char *kv_name(int f16)
{
    return f16 == 3 ? "i8" : f16 == 2 ? "f8e4m3" : f16 ? "f16" : "f32";
}

static void paged_layout(Paged &c, uint64_t perm_seed)
{
    int n_seq = (int)c.lq.size();
    int64_t row = (int64_t)c.Hkv * c.D, es = c.f16 >= 2 ? 1 : c.f16 ? 2 : 4, used_total = 0;
    std::vector<int64_t> used(n_seq);
    c.max_pages = 1;
    for (int s = 0; s < n_seq; s++) {
        used[s] = (c.lk[s] + c.pt - 1) / c.pt;
        used_total += used[s];
        c.max_pages = used[s] + 1 > c.max_pages ? used[s] + 1 : c.max_pages;
    }
    c.n_pages = used_total + 2;
    std::vector<int32_t> ids(c.n_pages);
    for (int64_t i = 0; i < c.n_pages; i++)
        ids[i] = (int32_t)i;
    uint64_t keep = g_rng;
    g_rng = perm_seed;
    for (int64_t i = c.n_pages - 1; i > 0; i--)
        std::swap(ids[i], ids[rng_u64() % (uint64_t)(i + 1)]);
    g_rng = keep;
    c.table.assign(n_seq * c.max_pages, INT32_MAX);
    c.cq.assign(n_seq + 1, 0);
    c.lens.assign(n_seq, 0);
    int64_t next = 0;
    for (int s = 0; s < n_seq; s++) {
        c.cq[s + 1] = c.cq[s] + c.lq[s];
        c.lens[s] = c.lk[s];
        for (int64_t i = 0; i < used[s]; i++)
            c.table[s * c.max_pages + i] = ids[next++];
    }
    c.T = c.cq[n_seq];
    int64_t n = c.n_pages * c.pt * row;
    c.kpf.assign(n, NAN);
    c.vpf.assign(n, NAN);
    for (int s = 0; s < n_seq; s++)
        for (int64_t j = 0; j < c.lk[s]; j++) {
            int64_t at = ((int64_t)c.table[s * c.max_pages + j / c.pt] * c.pt + j % c.pt) * row;
            memcpy(&c.kpf[at], &c.k[s][j * row], (size_t)row * 4);
            memcpy(&c.vpf[at], &c.v[s][j * row], (size_t)row * 4);
        }
    c.kp.assign(n * es, 0);
    c.vp.assign(n * es, 0);
    if (c.f16 == 3) {
        /* Each pool row of D quantized on its own; a row that is all NaN (a spare page, a row
         * past a sequence's end, a key before its window) gets codes and a NaN scale instead,
         * so that reading it shows. kpf / vpf then hold what the codes stand for. */
        c.ks.assign(n / c.D, NAN);
        c.vs.assign(n / c.D, NAN);
        std::vector<int8_t> codes(c.D);
        for (int64_t r = 0; r < n / c.D; r++)
            for (int kv = 0; kv < 2; kv++) {
                float *x = &(kv ? c.vpf : c.kpf)[r * c.D];
                float &sc = (kv ? c.vs : c.ks)[r];
                if (isnan(x[0]))
                    for (int64_t e = 0; e < c.D; e++)
                        codes[e] = (int8_t)((r * 31 + e * 7) % 255 - 127);
                else
                    sc = ref_i8_row(x, c.D, codes.data());
                for (int64_t e = 0; e < c.D; e++) {
                    (kv ? c.vp : c.kp)[r * c.D + e] = (uint8_t)codes[e];
                    x[e] = i8_value(codes[e], sc);
                }
            }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        if (c.f16 == 2) {
            c.kp[i] = ref_f8e4m3_encode(c.kpf[i]);
            c.vp[i] = ref_f8e4m3_encode(c.vpf[i]);
        } else if (c.f16) {
            uint16_t hk = h_f16(c.kpf[i]), hv = h_f16(c.vpf[i]);
            memcpy(&c.kp[i * 2], &hk, 2);
            memcpy(&c.vp[i * 2], &hv, 2);
        } else {
            memcpy(&c.kp[i * 4], &c.kpf[i], 4);
            memcpy(&c.vp[i * 4], &c.vpf[i], 4);
        }
    }
}

static Paged paged_make(int Hq, int Hkv, int D, int pt, int causal, int f16, std::vector<int> lq,
                        std::vector<int> lk, int window = 0)
{
    Paged c;
    c.window = window;
    c.Hq = Hq;
    c.Hkv = Hkv;
    c.D = D;
    c.pt = pt;
    c.causal = causal;
    c.f16 = f16;
    c.lq = lq;
    c.lk = lk;
    int64_t T = 0, row = (int64_t)Hkv * D;
    for (int x : lq)
        T += x;
    c.q = rand_vec(T * Hq * D, -1.5f, 1.5f);
    for (size_t s = 0; s < lk.size(); s++) {
        c.k.push_back(rand_vec(lk[s] * row, -1, 1));
        c.v.push_back(rand_vec(lk[s] * row, -1, 1));
        for (auto *a : {&c.k.back(), &c.v.back()})
            for (auto &x : *a)
                x = f16 == 2 ? ref_f8e4m3_value(ref_f8e4m3_encode(x))
                    : f16 == 1 ? f16_f(h_f16(x))
                               : x;
        /* I8 pages quantize per row in paged_layout; here rows get magnitudes 2^-3 … 2^3, so
         * scales differ, and the third key's K and V rows are zero (scale 0). */
        for (int64_t j = 0; f16 == 3 && j < lk[s]; j++)
            for (int64_t e = 0; e < row; e++) {
                const float m = j == 2 ? 0.0f : ldexpf(1.0f, (int)((j + e / D) % 7) - 3);
                c.k.back()[j * row + e] *= m;
                c.v.back()[j * row + e] *= m;
            }
        /* Keys before the sequence's first window are NaN: they must be skipped. */
        int64_t unseen = window > 0 && causal ? (lq[s] ? lk[s] - lq[s] + 1 - window : lk[s]) : 0;
        for (int64_t i = 0; i < unseen * row; i++)
            c.k.back()[i] = c.v.back()[i] = NAN;
    }
    paged_layout(c, 77 + lk.size());
    return c;
}

static std::vector<float> paged_run(const Paged &c, cu_err_word *err)
{
    std::vector<float> y(c.T * c.Hq * c.D + 1, NAN);
    int64_t row = (int64_t)c.Hkv * c.D;
    cu_attn_desc d = {};
    d.q = c.q.data();
    d.k = c.kp.data();
    d.v = c.vp.data();
    d.y = y.data();
    d.cu_q = c.cq.data();
    d.T = c.T;
    d.k_s0 = d.v_s0 = row;
    d.k_s1 = d.v_s1 = c.D;
    d.k_sp = d.v_sp = c.pt * row;
    d.Hq = c.Hq;
    d.Hkv = c.Hkv;
    d.D = c.D;
    d.n_seq = (int)c.lq.size();
    d.k_dtype = d.v_dtype = c.f16 == 3   ? MMRT_DTYPE_I8
                            : c.f16 == 2 ? MMRT_DTYPE_F8E4M3
                            : c.f16      ? MMRT_DTYPE_F16
                                         : MMRT_DTYPE_F32;
    if (c.f16 == 3) {
        d.k_scales = c.ks.data();
        d.v_scales = c.vs.data();
    }
    d.causal = c.causal;
    d.window = c.window;
    d.scale = 1.0f / sqrtf((float)c.D);
    d.n_sm = 2; /* few SMs: ATTENTION would split these keys; the paged op never does */
    d.err = err;
    d.kv_lens = c.lens.data();
    d.page_table = c.table.data();
    d.max_pages = c.max_pages;
    d.page_tokens = c.pt;
    d.n_pages = c.n_pages;
    cu_launch_attention(&d, nullptr);
    return y;
}

static void test_attention_paged(void)
{
    struct PCase {
        int Hq, Hkv, D, pt, causal, f16;
        std::vector<int> lq, lk;
        int alone, alone_pt, window;
    };
    std::vector<PCase> cases = {
        {4, 2, 64, 16, 1, 1, {1, 1, 1}, {37, 16, 1}, 0, 3, 0},       /* decode, ragged pages */
        {4, 4, 64, 1, 1, 0, {1, 6}, {5, 6}, 1, 16, 0},              /* pages of one token */
        {8, 2, 80, 3, 1, 0, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, 16, 0}, /* decode + prefill chunk */
        {2, 1, 128, 16, 1, 1, {5, 1, 3}, {0, 40, 3}, 1, 1, 0},       /* no keys: zeros */
        {6, 3, 8, 3, 0, 1, {7, 4}, {7, 11}, 1, 16, 0},               /* bidirectional */
        {2, 1, 256, 16, 1, 0, {33, 1}, {70, 129}, 0, 3, 0},          /* D 256, > 2 row tiles */
        {2, 2, 3, 3, 0, 0, {4}, {9}, 0, 1, 0},                       /* odd D */
        {4, 1, 100, 16, 1, 1, {1, 40}, {300, 64}, 1, 3, 0},          /* generic D */
        {4, 2, 96, 7, 1, 0, {2, 17}, {90, 40}, 0, 1, 0},             /* D 96 decode tile */
        /* Sliding windows: decode with the window starting mid-page, a prefill chunk and
         * decode rows, window 1, window ≥ Lk, rows that see nothing. */
        {4, 2, 64, 16, 1, 1, {1, 1, 1}, {37, 16, 1}, 0, 3, 7},
        {8, 2, 80, 3, 1, 0, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, 16, 1},
        {4, 1, 100, 16, 1, 1, {1, 40}, {300, 64}, 1, 3, 33},
        {2, 1, 256, 16, 1, 0, {33, 1}, {70, 129}, 0, 3, 200},
        {2, 1, 32, 4, 1, 0, {6, 2}, {3, 9}, 0, 1, 2},
        {4, 2, 96, 7, 1, 0, {2, 70}, {90, 150}, 1, 5, 20},
        /* FP8 E4M3 pages (ABI 1.6): decode over ragged pages, decode + prefill chunk, a window
         * starting mid-page. */
        {4, 2, 64, 16, 1, 2, {1, 1, 1}, {37, 16, 1}, 0, 3, 0},
        {8, 2, 80, 3, 1, 2, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, 16, 0},
        {4, 1, 100, 16, 1, 2, {1, 40}, {300, 64}, 1, 3, 33},
        /* I8 pages with row scales (ABI 1.7): decode over ragged shuffled pages with GQA, decode
         * + prefill chunk, a window starting mid-page, D 256 over several row tiles, odd D
         * bidirectional. Each also bit for bit against F32 pages holding code · scale. */
        {4, 2, 64, 16, 1, 3, {1, 1, 1}, {37, 16, 1}, 0, 3, 0},
        {8, 2, 80, 3, 1, 3, {1, 9, 1, 0}, {20, 30, 7, 5}, 1, 16, 0},
        {4, 1, 100, 16, 1, 3, {1, 40}, {300, 64}, 1, 3, 33},
        {2, 1, 256, 16, 1, 3, {33, 1}, {70, 129}, 0, 3, 0},
        {6, 3, 7, 3, 0, 3, {7, 4}, {7, 11}, 1, 16, 0},
        {8, 8, 128, 4, 1, 3, {1, 1}, {50, 9}, 1, 5, 0},
    };
    for (size_t i = 0; i < cases.size(); i++) {
        const PCase &pc = cases[i];
        Paged c = paged_make(pc.Hq, pc.Hkv, pc.D, pc.pt, pc.causal, pc.f16, pc.lq, pc.lk,
                             pc.window);
        cu_err_word err = {};
        std::vector<float> y = paged_run(c, &err);
        std::vector<double> ref(c.T * c.Hq * c.D + 1, 0.0);
        ref_attention_paged(c.q.data(), c.kpf.data(), c.vpf.data(), c.T, c.Hq, c.Hkv, c.D, c.pt,
                            c.cq.data(), c.lens.data(), c.table.data(), c.max_pages,
                            (int)c.lq.size(), 1.0f / sqrtf((float)c.D), c.causal, c.window,
                            ref.data());
        char what[180];
        snprintf(what, sizeof what, "ATTENTION_PAGED #%zu Hq %d Hkv %d D %d pages of %d %s "
                 "window %d", i, pc.Hq, pc.Hkv, pc.D, pc.pt, kv_name(pc.f16), pc.window);
        check(what, y.data(), ref.data(), c.T * c.Hq * c.D, 2e-5);
        if (pc.f16 == 3) {
            /* plugin.h: an I8 reader widens each element to code · scale and then computes as
             * on an F32 copy of those values — the same kernel on such a copy, same bits. */
            Paged f = c;
            f.f16 = 0;
            f.kp.resize(f.kpf.size() * 4);
            f.vp.resize(f.vpf.size() * 4);
            memcpy(f.kp.data(), f.kpf.data(), f.kp.size());
            memcpy(f.vp.data(), f.vpf.data(), f.vp.size());
            cu_err_word ferr = {};
            std::vector<float> yf = paged_run(f, &ferr);
            snprintf(what, sizeof what, "ATTENTION_PAGED #%zu i8 pages = f32 pages of code · "
                     "scale, bit for bit", i);
            expect(what, memcmp(yf.data(), y.data(), (size_t)(c.T * c.Hq * c.D) * 4) == 0 &&
                             ferr.code == 0);
        }
        bool zeros = true;
        for (int64_t e = 0; e < c.T * c.Hq * c.D; e++)
            zeros &= ref[e] != 0.0 || y[e] == 0.0f;
        expect("ATTENTION_PAGED rows that see no key are exactly 0", zeros);
        expect("ATTENTION_PAGED error word clear", err.code == 0);

        /* The same sequence alone, in pages of another size and order: the same bits. */
        Paged a = c;
        int s = pc.alone;
        int64_t row = (int64_t)c.Hq * c.D;
        a.pt = pc.alone_pt;
        a.lq = {pc.lq[s]};
        a.lk = {pc.lk[s]};
        a.q.assign(c.q.begin() + c.cq[s] * row, c.q.begin() + c.cq[s + 1] * row);
        a.k = {c.k[s]};
        a.v = {c.v[s]};
        paged_layout(a, 1234 + i);
        std::vector<float> ya = paged_run(a, &err);
        snprintf(what, sizeof what, "ATTENTION_PAGED #%zu sequence %d alone in pages of %d: "
                 "bit-identical", i, s, pc.alone_pt);
        expect(what, memcmp(ya.data(), y.data() + c.cq[s] * row,
                            (size_t)(pc.lq[s] * row) * sizeof(float)) == 0);
    }

    /* Bad indices: reported through the error word with the entry, nothing written. */
    Paged c = paged_make(2, 1, 16, 4, 1, 0, {2, 1}, {6, 5});
    struct Bad {
        int which, seq, col;
        int32_t value;
        int64_t want_v1, want_v2;
    } bad[] = {
        {2, 0, 1, 9, 0, 9},  /* page id past the pool */
        {2, 1, 0, -1, 1, -1},
        {1, 1, 0, 13, 1, 13}, /* kv_len beyond max_pages · page_tokens */
        {1, 0, 0, -2, 0, -2},
        {0, 1, 0, 4, 2, 3},  /* cu_seqlens_q decreases at entry 2 */
        {0, 0, 0, 1, 0, 1},  /* does not start at 0 */
    };
    for (const Bad &b : bad) {
        Paged e = c;
        if (b.which == 0)
            e.cq[b.seq] = b.value;
        else if (b.which == 1)
            e.lens[b.seq] = b.value;
        else
            e.table[b.seq * e.max_pages + b.col] = b.value;
        cu_err_word err = {};
        std::vector<float> y = paged_run(e, &err);
        bool untouched = true;
        for (int64_t i = 0; i < e.T * e.Hq * e.D; i++)
            untouched &= isnan(y[i]);
        char what[128];
        snprintf(what, sizeof what, "ATTENTION_PAGED bad %s entry %d = %d reported, dst untouched",
                 b.which == 0 ? "cu_seqlens_q" : b.which == 1 ? "kv_lens" : "page_table", b.seq,
                 (int)b.value);
        expect(what, err.code == CU_ERRC_PAGED && err.op == MMRT_OP_ATTENTION_PAGED &&
                         err.v[0] == b.which && err.v[1] == b.want_v1 && err.v[2] == b.want_v2 &&
                         (b.which != 2 || err.v[3] == b.col) && untouched);
    }
}

/* ---- GEMV and GEMM operand preparation ------------------------------------------------- */

static void encode_w(int dt, const std::vector<float> &v, std::vector<uint8_t> &out,
                     std::vector<float> &rounded, size_t pad_front)
{
    size_t es = dt == MMRT_DTYPE_F32 ? 4 : 2;
    out.assign((v.size() + pad_front) * es + 16, 0);
    rounded = v;
    for (size_t i = 0; i < v.size(); i++) {
        if (dt == MMRT_DTYPE_F32) {
            memcpy(&out[(i + pad_front) * 4], &v[i], 4);
        } else {
            uint16_t h = dt == MMRT_DTYPE_F16 ? h_f16(v[i]) : h_bf16(v[i]);
            rounded[i] = dt == MMRT_DTYPE_F16 ? f16_f(h) : bf16_f(h);
            memcpy(&out[(i + pad_front) * 2], &h, 2);
        }
    }
}

static void test_gemv(void)
{
    const int64_t cases[][3] = {{1, 1, 1},   {1, 64, 63},  {2, 65, 64},  {8, 128, 65},
                                {3, 129, 9}, {1, 256, 33}, {8, 1000, 7}, {5, 4, 130}};
    const int dts[3] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16};
    for (auto &cs : cases)
        for (int di = 0; di < 3; di++)
            for (int misalign = 0; misalign < 2; misalign++) {
                int64_t M = cs[0], K = cs[1], N = cs[2];
                int dt = dts[di];
                auto x = rand_vec(M * K + 4, -1, 1);
                auto w = rand_vec(N * K, -1, 1);
                auto b = rand_vec(N, -1, 1);
                std::vector<uint8_t> wb;
                std::vector<float> wr;
                encode_w(dt, w, wb, wr, misalign ? 1 : 0);
                size_t es = dt == MMRT_DTYPE_F32 ? 4 : 2;
                /* An aligned base (vector path when K allows) or one element off (scalar). */
                std::vector<uint8_t> walign(wb.size() + 64);
                uint8_t *wp = walign.data() + (64 - (uintptr_t)walign.data() % 64) % 64;
                memcpy(wp, wb.data(), wb.size() - 16);
                const void *wdev = wp + (misalign ? es : 0);
                std::vector<float> y(M * N, NAN);
                bool bias = (K + di) % 2 == 0;
                cu_launch_gemv(y.data(), x.data(), wdev, dt, bias ? b.data() : nullptr,
                               MMRT_DTYPE_F32, M, K, N, nullptr);
                std::vector<double> ref(M * N);
                ref_matmul(x.data(), wr.data(), bias ? b.data() : nullptr, M, K, N, ref.data());
                char what[128];
                snprintf(what, sizeof what, "GEMV M %lld K %lld N %lld dt %d %s bias %d",
                         (long long)M, (long long)K, (long long)N, dt,
                         misalign ? "scalar" : "vec", bias);
                check(what, y.data(), ref.data(), M * N, 1e-5);
            }
}

/* The I8 GEMV against the reference on the dequantized weights, with and without the
 * 16-byte path (W one byte off, K off 16), up to 33 rows; then batch invariance: each row
 * alone, with x at an address that rules the 16-byte path out, gives the same bits. Then the
 * large-M helpers: codes widened to f16 exactly, and the scale + bias epilogue. */
static void test_gemv_i8(void)
{
    const int64_t cases[][3] = {{1, 1, 1},   {1, 64, 63},  {2, 65, 64}, {8, 128, 65},
                                {9, 129, 9}, {17, 256, 33}, {32, 48, 7}, {5, 4, 130},
                                {32, 1000, 3}};
    for (auto &cs : cases)
        for (int misalign = 0; misalign < 2; misalign++) {
            int64_t M = cs[0], K = cs[1], N = cs[2];
            auto x = rand_vec(M * K + 4, -1, 1);
            auto wf = rand_vec(N * K, -127.4f, 127.4f);
            auto sc = rand_vec(N, 1e-3f, 2e-2f);
            auto b = rand_vec(N, -1, 1);
            std::vector<uint8_t> walign(N * K + 64);
            uint8_t *base = walign.data() + (64 - (uintptr_t)walign.data() % 64) % 64;
            int8_t *wq = reinterpret_cast<int8_t *>(base + misalign);
            std::vector<float> deq(N * K);
            for (int64_t i = 0; i < N * K; i++) {
                wq[i] = (int8_t)lrintf(wf[i]);
                deq[i] = (float)wq[i] * sc[i / K];
            }
            std::vector<float> y(M * N, NAN);
            bool bias = (K + misalign) % 2 == 0;
            cu_launch_gemv_i8(y.data(), x.data(), wq, sc.data(), bias ? b.data() : nullptr,
                              MMRT_DTYPE_F32, M, K, N, nullptr);
            std::vector<double> ref(M * N);
            ref_matmul(x.data(), deq.data(), bias ? b.data() : nullptr, M, K, N, ref.data());
            char what[128];
            snprintf(what, sizeof what, "GEMV I8 M %lld K %lld N %lld %s bias %d", (long long)M,
                     (long long)K, (long long)N, misalign ? "scalar" : "vec", bias);
            check(what, y.data(), ref.data(), M * N, 1e-5);
            bool same = true;
            for (int64_t m = 0; m < M && same; m += M > 2 ? M / 2 : 1) {
                std::vector<float> x1(K + 4), y1(N, NAN);
                memcpy(x1.data() + 1, x.data() + m * K, (size_t)K * sizeof(float));
                cu_launch_gemv_i8(y1.data(), x1.data() + 1, wq, sc.data(),
                                  bias ? b.data() : nullptr, MMRT_DTYPE_F32, 1, K, N, nullptr);
                same = memcmp(y1.data(), y.data() + m * N, (size_t)N * sizeof(float)) == 0;
            }
            snprintf(what, sizeof what, "GEMV I8 M %lld K %lld N %lld %s: rows alone, same bits",
                     (long long)M, (long long)K, (long long)N, misalign ? "scalar" : "vec");
            expect(what, same);
        }

    std::vector<int8_t> codes(300);
    for (size_t i = 0; i < codes.size(); i++)
        codes[i] = (int8_t)(i % 256 - 128);
    std::vector<uint16_t> h(codes.size(), 0xffff);
    cu_launch_i8_to_f16(h.data(), codes.data(), (int64_t)codes.size(), nullptr);
    bool exact = true;
    for (size_t i = 0; i < codes.size(); i++)
        exact = exact && f16_f(h[i]) == (float)codes[i];
    expect("I8 -> F16 widening is exact for every code", exact);

    const int64_t M = 3, N = 5;
    auto y = rand_vec(M * N, -100, 100), sc = rand_vec(N, 1e-3f, 1e-2f), b = rand_vec(N, -1, 1);
    std::vector<uint16_t> b16(N);
    for (int64_t n = 0; n < N; n++) {
        b16[n] = h_f16(b[n]);
        b[n] = f16_f(b16[n]);
    }
    auto want = y;
    for (int64_t i = 0; i < M * N; i++)
        want[i] = y[i] * sc[i % N] + b[i % N];
    cu_launch_scale_cols(y.data(), sc.data(), b16.data(), MMRT_DTYPE_F16, M, N, nullptr);
    expect("I8 epilogue y * scale + F16 bias, correctly rounded",
           memcmp(y.data(), want.data(), want.size() * sizeof(float)) == 0);
}

/* A random U4 weight [N, K] in groups of gs: codes 0 … 15, whole zero points 0 … 15, scales
 * of different magnitudes per row (every fifth row's groups zero: scale 0), written at byte
 * offset `misalign` of a 64-byte aligned buffer; deq gets what it stands for (ref_ops.c). */
struct U4W {
    std::vector<uint8_t> buf;
    uint8_t *q;
    std::vector<float> scale, zero, deq;
};
static void make_u4(U4W &u, int64_t N, int64_t K, int64_t gs, int misalign)
{
    const int64_t G = K / gs;
    u.buf.assign((size_t)(N * K / 2) + 64, 0);
    u.q = u.buf.data() + (64 - (uintptr_t)u.buf.data() % 64) % 64 + misalign;
    for (int64_t i = 0; i < N * K / 2; i++)
        u.q[i] = (uint8_t)(rng_u64() & 0xff);
    u.scale.resize(N * G);
    u.zero.resize(N * G);
    for (int64_t i = 0; i < N * G; i++) {
        const int64_t r = i / G;
        u.scale[i] = r % 5 == 4 ? 0.0f : ldexpf(rng_f(1e-3f, 2e-2f), -(int)(r % 3) * 6);
        u.zero[i] = (float)(rng_u64() % 16);
    }
    u.deq.resize(N * K);
    ref_u4_dequant(u.q, u.scale.data(), u.zero.data(), N, K, gs, u.deq.data());
}

/* The U4 GEMV against the reference on the dequantized weights, with and without the
 * 16-byte path (W one byte off), groups of 32 / 64 / 128, up to 33 rows; rows alone, with x
 * one float off (scalar path), give the same bits. Then the large-M widening: every f16
 * weight times its row's power of two is the weight to 2^-11, the power brings the row into
 * [−1, 1], and a row of zeros gets 1. */
static void test_gemv_u4(void)
{
    const int64_t cases[][4] = {{1, 32, 1, 32},   {1, 64, 63, 32},  {2, 128, 64, 64},
                                {8, 256, 65, 128}, {9, 96, 9, 32},   {17, 256, 33, 64},
                                {32, 64, 7, 64},  {5, 1024, 13, 128}, {32, 512, 3, 32}};
    for (auto &cs : cases)
        for (int misalign = 0; misalign < 2; misalign++) {
            const int64_t M = cs[0], K = cs[1], N = cs[2], gs = cs[3];
            auto x = rand_vec(M * K + 4, -1, 1);
            auto b = rand_vec(N, -1, 1);
            U4W u;
            make_u4(u, N, K, gs, misalign);
            std::vector<float> y(M * N, NAN);
            bool bias = (K / 32 + misalign) % 2 == 0;
            cu_launch_gemv_u4(y.data(), x.data(), u.q, u.scale.data(), u.zero.data(), K / gs,
                              bias ? b.data() : nullptr, MMRT_DTYPE_F32, M, K, N, nullptr);
            std::vector<double> ref(M * N);
            ref_matmul(x.data(), u.deq.data(), bias ? b.data() : nullptr, M, K, N, ref.data());
            char what[128];
            snprintf(what, sizeof what, "GEMV U4 M %lld K %lld N %lld g%lld %s bias %d",
                     (long long)M, (long long)K, (long long)N, (long long)gs,
                     misalign ? "scalar" : "vec", bias);
            check(what, y.data(), ref.data(), M * N, 1e-5);
            bool same = true;
            for (int64_t m = 0; m < M && same; m += M > 2 ? M / 2 : 1) {
                std::vector<float> x1(K + 4), y1(N, NAN);
                memcpy(x1.data() + 1, x.data() + m * K, (size_t)K * sizeof(float));
                cu_launch_gemv_u4(y1.data(), x1.data() + 1, u.q, u.scale.data(), u.zero.data(),
                                  K / gs, bias ? b.data() : nullptr, MMRT_DTYPE_F32, 1, K, N,
                                  nullptr);
                same = memcmp(y1.data(), y.data() + m * N, (size_t)N * sizeof(float)) == 0;
            }
            snprintf(what, sizeof what, "GEMV U4 M %lld K %lld N %lld %s: rows alone, same bits",
                     (long long)M, (long long)K, (long long)N, misalign ? "scalar" : "vec");
            expect(what, same);
        }

    const int64_t N = 11, K = 256, gs = 64;
    U4W u;
    make_u4(u, N, K, gs, 3);
    std::vector<uint16_t> h(N * K, 0xffff);
    std::vector<float> rs(N, NAN);
    cu_launch_u4_to_f16(h.data(), rs.data(), u.q, u.scale.data(), u.zero.data(), K / gs, K, N,
                        nullptr);
    bool close = true, fits = true, zero_row = true;
    for (int64_t n = 0; n < N; n++) {
        int e;
        fits = fits && frexpf(rs[n], &e) == 0.5f; /* a power of two */
        double amax = 0;
        for (int64_t k = 0; k < K; k++) {
            const double want = u.deq[n * K + k], got = (double)f16_f(h[n * K + k]) * rs[n];
            amax = fmax(amax, fabs(want));
            close = close && fabs(got - want) <= fabs(want) * 0x1p-11 + rs[n] * 0x1p-25;
        }
        fits = fits && amax <= rs[n] && (amax == 0 || amax > rs[n] / 32);
        if (n % 5 == 4)
            zero_row = zero_row && rs[n] == 1.0f && amax == 0;
    }
    expect("U4 -> F16 widening: each weight to 2^-11 of itself", close);
    expect("U4 -> F16 widening: row powers of two bound each row", fits);
    expect("U4 -> F16 widening: a row of zeros gets 1", zero_row);
}

static void test_prep(void)
{
    /* x must be reproduced by hi / hi_scale + lo / lo_scale to the promised precision. */
    int64_t M = 5, K = 77;
    auto x = rand_vec(M * K, -3, 3);
    x[0] = 1e-6f;
    x[1] = -2e-3f;
    x[2] = 60000.0f;
    x[3] = 1e6f;
    struct {
        int dt;
        float hs, ls;
        double tol; /* relative to |x|, plus 2^-28 absolute */
    } modes[] = {{MMRT_DTYPE_BF16, 1.0f, 1.0f, 1.0 / 65536}, {MMRT_DTYPE_F16, 1.0f / 256, 8.0f, 1.0 / 2097152}};
    for (auto &md : modes) {
        std::vector<uint16_t> hi(M * K), lo(M * K);
        cu_prep_desc d = {};
        d.x = x.data();
        d.r0 = 1;
        d.rows = M - 1;
        d.K = K;
        d.out_dtype = md.dt;
        d.split = 1;
        d.hi_scale = md.hs;
        d.lo_scale = md.ls;
        d.hi = hi.data();
        d.lo = lo.data();
        cu_launch_prep(&d, nullptr);
        double worst = 0;
        for (int64_t r = 1; r < M; r++)
            for (int64_t k = 0; k < K; k++) {
                int64_t o = (r - 1) * K + k;
                double a = x[r * K + k];
                double hv = md.dt == MMRT_DTYPE_F16 ? f16_f(hi[o]) : bf16_f(hi[o]);
                double lv = md.dt == MMRT_DTYPE_F16 ? f16_f(lo[o]) : bf16_f(lo[o]);
                double back = hv / md.hs + lv / md.ls;
                double e = fabs(back - a) / (fabs(a) * md.tol + 3.8e-9);
                worst = fmax(worst, e);
            }
        char what[96];
        snprintf(what, sizeof what, "PREP split dt %d reproduces x (worst %.3g of bound)", md.dt,
                 worst);
        expect(what, worst <= 1.0);
    }
    /* Patches: im2col order (c, kh, kw), rows (b, py, px). */
    int64_t B = 2, C = 3, H = 6, W = 9, P = 3, npx = W / P, np = (H / P) * npx;
    auto img = rand_vec(B * C * H * W, -1, 1);
    std::vector<float> cols(B * np * C * P * P, NAN);
    cu_prep_desc d = {};
    d.img = img.data();
    d.C = C;
    d.H = H;
    d.W = W;
    d.P = P;
    d.n_px = npx;
    d.n_patches = np;
    d.r0 = 0;
    d.rows = B * np;
    d.K = C * P * P;
    d.out_dtype = MMRT_DTYPE_F32;
    d.hi_scale = d.lo_scale = 1.0f;
    d.hi = cols.data();
    cu_launch_prep(&d, nullptr);
    bool ok = true;
    for (int64_t b = 0; b < B; b++)
        for (int64_t py = 0; py < H / P; py++)
            for (int64_t px = 0; px < npx; px++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t kh = 0; kh < P; kh++)
                        for (int64_t kw = 0; kw < P; kw++) {
                            float want = img[((b * C + c) * H + py * P + kh) * W + px * P + kw];
                            float got = cols[((b * np + py * npx + px) * C + c) * P * P + kh * P + kw];
                            ok &= got == want;
                        }
    expect("PREP im2col", ok);
    std::vector<float> yb(3 * 5, NAN);
    std::vector<uint16_t> bb(5);
    for (int i = 0; i < 5; i++)
        bb[i] = h_bf16(0.5f * (float)i);
    cu_launch_fill_rows(yb.data(), bb.data(), MMRT_DTYPE_BF16, 3, 5, nullptr);
    ok = true;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 5; i++)
            ok &= yb[r * 5 + i] == 0.5f * (float)i;
    expect("FILL_ROWS bias", ok);
}

/* ---- row ops, elementwise, copy, rope -------------------------------------------------- */

static void test_rows(void)
{
    const int64_t cases[][2] = {{1, 1}, {3, 63}, {2, 64}, {2, 65}, {3, 257}, {2, 1000}};
    for (auto &cs : cases) {
        int64_t R = cs[0], N = cs[1];
        for (int rms = 0; rms < 2; rms++) {
            auto x = rand_vec(R * N, 1, 5), w = rand_vec(N, -2, 2), b = rand_vec(N, -1, 1);
            std::vector<float> y(R * N);
            cu_launch_norm(y.data(), x.data(), w.data(), MMRT_DTYPE_F32, rms ? nullptr : b.data(),
                           MMRT_DTYPE_F32, R, N, 1e-5f, rms, nullptr);
            std::vector<double> ref(R * N);
            if (rms)
                ref_rmsnorm(x.data(), w.data(), R, N, 1e-5f, ref.data());
            else
                ref_layernorm(x.data(), w.data(), b.data(), R, N, 1e-5f, ref.data());
            char what[64];
            snprintf(what, sizeof what, "%s [%lld, %lld]", rms ? "RMSNORM" : "LAYERNORM",
                     (long long)R, (long long)N);
            check(what, y.data(), ref.data(), R * N, 1e-5);
        }
        auto x = rand_vec(R * N, -10, 10);
        for (int64_t i = 0; i < R * N; i++)
            if (i % N && rng_u64() % 4 == 0)
                x[i] = -INFINITY;
        std::vector<float> y(x);
        cu_launch_softmax(y.data(), y.data(), R, N, 0.5f, nullptr); /* in place */
        std::vector<double> ref(R * N);
        ref_softmax(x.data(), R, N, 0.5f, ref.data());
        char what[64];
        snprintf(what, sizeof what, "SOFTMAX in place [%lld, %lld]", (long long)R, (long long)N);
        check(what, y.data(), ref.data(), R * N, 1e-6 + 1.2e-7 * 5);
        /* ARGMAX with ties and NaN. */
        auto a = rand_vec(R * N, -3, 3);
        for (int64_t i = 0; i < R * N; i += 7)
            a[i] = NAN;
        if (N > 10) {
            a[N - 1] = 100.0f;
            a[3] = 100.0f; /* the first maximum must win */
        }
        std::vector<int32_t> am(R, -7);
        cu_launch_argmax(am.data(), a.data(), R, N, nullptr);
        bool ok = true;
        for (int64_t r = 0; r < R; r++)
            ok &= am[r] == ref_argmax(a.data() + r * N, N);
        snprintf(what, sizeof what, "ARGMAX [%lld, %lld]", (long long)R, (long long)N);
        expect(what, ok);
    }
    std::vector<float> allnan(300, NAN), mixed(300, -INFINITY);
    int32_t r1 = -1, r2 = -1;
    mixed[299] = -1e30f;
    cu_launch_argmax(&r1, allnan.data(), 1, 300, nullptr);
    cu_launch_argmax(&r2, mixed.data(), 1, 300, nullptr);
    expect("ARGMAX all NaN → 0, −inf row", r1 == 0 && r2 == 299);
    std::vector<float> masked(70, -INFINITY), out(70, 1.0f);
    cu_launch_softmax(out.data(), masked.data(), 1, 70, 1.0f, nullptr);
    bool zero = true;
    for (float v : out)
        zero &= v == 0.0f;
    expect("SOFTMAX fully masked row → zeros", zero);

    /* GET_ROWS, bad id reported. */
    int64_t V = 50, N = 70, T = 4;
    auto tab = rand_vec(V * N, -3, 3);
    std::vector<uint16_t> tab16(V * N);
    for (int64_t i = 0; i < V * N; i++)
        tab16[i] = h_f16(tab[i]);
    int32_t ids[4] = {49, 0, 17, 49};
    std::vector<float> y(T * N, NAN);
    cu_err_word err = {};
    cu_launch_get_rows(y.data(), tab16.data(), MMRT_DTYPE_F16, V, N, ids, T, &err, nullptr);
    bool ok = err.code == 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < N; i++)
            ok &= y[t * N + i] == f16_f(tab16[ids[t] * N + i]);
    expect("GET_ROWS f16", ok);
    int32_t bad[3] = {1, 50, -1};
    std::vector<float> y2(3 * N, 7.0f);
    cu_launch_get_rows(y2.data(), tab.data(), MMRT_DTYPE_F32, V, N, bad, 3, &err, nullptr);
    expect("GET_ROWS bad id reported (first one wins), rows untouched",
           err.code == CU_ERRC_ROW_ID && (err.v[0] == 50 || err.v[0] == -1) && y2[N] == 7.0f &&
               y2[2 * N] == 7.0f && y2[0] == tab[N]);
}

static void test_elementwise(void)
{
    for (int64_t n : {1, 63, 64, 65, 5000}) {
        auto a = rand_vec(n, -8, 8), b = rand_vec(n, -4, 4);
        for (int op : {MMRT_OP_GELU, MMRT_OP_GELU_TANH, MMRT_OP_QUICK_GELU, MMRT_OP_SILU,
                       MMRT_OP_RELU2}) {
            std::vector<float> y(n);
            cu_launch_unary(op, y.data(), a.data(), nullptr, n, 0.0f, nullptr);
            std::vector<double> ref(n);
            ref_unary(op, a.data(), n, ref.data());
            char what[64];
            snprintf(what, sizeof what, "UNARY op %d n %lld", op, (long long)n);
            check(what, y.data(), ref.data(), n, 1e-6, 1.0);
        }
        std::vector<float> y(n);
        cu_launch_unary(MMRT_OP_SWIGLU, y.data(), a.data(), b.data(), n, 0.0f, nullptr);
        std::vector<double> ref(n);
        ref_swiglu(a.data(), b.data(), n, ref.data());
        check("SWIGLU", y.data(), ref.data(), n, 1e-6);
        /* Broadcast ADD with a bf16 row, MUL same shape. */
        int64_t row = n % 7 + 1;
        if (n % row == 0) {
            std::vector<uint16_t> r16(row);
            std::vector<float> rf(row);
            for (int64_t i = 0; i < row; i++) {
                r16[i] = h_bf16(b[i]);
                rf[i] = bf16_f(r16[i]);
            }
            std::vector<float> yy(a);
            cu_launch_binary(yy.data(), yy.data(), r16.data(), MMRT_DTYPE_BF16, n, row, 0, nullptr);
            ref_binary(a.data(), rf.data(), n, row, 0, ref.data());
            check("ADD bf16 row, in place", yy.data(), ref.data(), n, 1e-6);
        }
        cu_launch_binary(y.data(), a.data(), b.data(), MMRT_DTYPE_F32, n, n, 1, nullptr);
        ref_binary(a.data(), b.data(), n, n, 1, ref.data());
        check("MUL", y.data(), ref.data(), n, 1e-6);
    }
}

static void test_copy(void)
{
    /* A permuted 4-D view, every dtype pair; exact bits against the host conversions. */
    const int64_t ne[4] = {2, 3, 5, 7};
    const int dts[4] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16, MMRT_DTYPE_I32};
    int64_t n = 2 * 3 * 5 * 7;
    auto vals = rand_vec(n, -70000, 70000);
    vals[0] = NAN;
    vals[1] = 1e-7f;
    vals[2] = -65519.0f;
    vals[3] = 65520.0f;
    vals[4] = 3e-39f;
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 4; di++) {
            int sdt = dts[si], ddt = dts[di];
            if ((sdt == MMRT_DTYPE_I32) != (ddt == MMRT_DTYPE_I32))
                continue;
            size_t ses = sdt == MMRT_DTYPE_F16 || sdt == MMRT_DTYPE_BF16 ? 2 : 4;
            size_t des = ddt == MMRT_DTYPE_F16 || ddt == MMRT_DTYPE_BF16 ? 2 : 4;
            /* Source contiguous [2,3,5,7]; destination the transpose of dims 1 and 3. */
            std::vector<uint8_t> src(n * ses), dst(n * des, 0xee);
            for (int64_t i = 0; i < n; i++) {
                if (sdt == MMRT_DTYPE_F16) { uint16_t h = h_f16(vals[i]); memcpy(&src[i * 2], &h, 2); }
                else if (sdt == MMRT_DTYPE_BF16) { uint16_t h = h_bf16(vals[i]); memcpy(&src[i * 2], &h, 2); }
                else memcpy(&src[i * 4], &vals[i], 4);
            }
            cu_copy_desc d = {};
            d.src = src.data();
            d.dst = dst.data();
            memcpy(d.ne, ne, sizeof ne);
            int64_t sn[4] = {105, 35, 7, 1}, dn[4] = {105, 1, 3, 15}; /* dst is [2, 7, 5, 3] */
            memcpy(d.snb, sn, sizeof sn);
            memcpy(d.dnb, dn, sizeof dn);
            d.sdt = sdt;
            d.ddt = ddt;
            cu_launch_copy(&d, nullptr);
            bool ok = true;
            for (int64_t i0 = 0; i0 < 2; i0++)
                for (int64_t i1 = 0; i1 < 3; i1++)
                    for (int64_t i2 = 0; i2 < 5; i2++)
                        for (int64_t i3 = 0; i3 < 7; i3++) {
                            int64_t s = i0 * 105 + i1 * 35 + i2 * 7 + i3;
                            int64_t o = i0 * 105 + i1 * 1 + i2 * 3 + i3 * 15;
                            float f;
                            if (sdt == MMRT_DTYPE_F16) { uint16_t h; memcpy(&h, &src[s * 2], 2); f = f16_f(h); }
                            else if (sdt == MMRT_DTYPE_BF16) { uint16_t h; memcpy(&h, &src[s * 2], 2); f = bf16_f(h); }
                            else memcpy(&f, &src[s * 4], 4);
                            uint8_t want[4];
                            if (ddt == sdt) memcpy(want, &src[s * ses], ses);
                            else if (ddt == MMRT_DTYPE_F16) { uint16_t h = h_f16(f); memcpy(want, &h, 2); }
                            else if (ddt == MMRT_DTYPE_BF16) { uint16_t h = h_bf16(f); memcpy(want, &h, 2); }
                            else memcpy(want, &f, 4);
                            ok &= memcmp(&dst[o * des], want, des) == 0;
                        }
            char what[64];
            snprintf(what, sizeof what, "COPY dt %d → %d, permuted", sdt, ddt);
            expect(what, ok);
        }
}

static void test_rope(void)
{
    struct { int64_t T, H, D; int n_rot, mode; float theta; int max_pos; } cases[] = {
        {5, 4, 64, 64, 0, 10000.0f, 16},   {3, 2, 8, 4, 0, 25000.0f, 100},
        {7, 3, 128, 128, 1, 1e6f, 5000},   {9, 5, 80, 40, 1, 10000.0f, 70000},
        {4, 3, 256, 256, 0, 10000.0f, 32768},
    };
    for (auto &c : cases) {
        auto x = rand_vec(c.T * c.H * c.D, -2, 2);
        std::vector<int32_t> pos(c.T);
        for (auto &p : pos)
            p = (int32_t)(rng_u64() % (uint64_t)(c.max_pos + 1));
        cu_rope_desc d = {};
        std::vector<float> y(x);
        d.x = y.data(); /* in place */
        d.y = y.data();
        d.pos = pos.data();
        d.T = c.T;
        d.H = c.H;
        d.D = c.D;
        d.xs0 = d.ys0 = c.H * c.D;
        d.xs1 = d.ys1 = c.D;
        d.n_rot = c.n_rot;
        d.mode = c.mode;
        for (int i = 0; i < c.n_rot / 2; i++)
            d.inv_freq[i] = 1.0f / powf(c.theta, (float)(2 * i) / (float)c.n_rot);
        cu_launch_rope(&d, nullptr);
        std::vector<double> ref(x.size());
        ref_rope(x.data(), pos.data(), c.T, c.H, c.D, c.n_rot, c.mode, c.theta, ref.data());
        char what[64];
        snprintf(what, sizeof what, "ROPE T %lld D %lld n_rot %d mode %d", (long long)c.T,
                 (long long)c.D, c.n_rot, c.mode);
        check(what, y.data(), ref.data(), x.size(), 1e-6);
    }
}

static void test_rope_multi(void)
{
    /* M-RoPE (decoder), the vision tower's 2-D rotary, and odd section layouts: empty
     * sections, four axes, a copied tail, a separate strided dst. */
    struct {
        int64_t T, H, D;
        int n_rot, freq_dim, restart, n_axes, sections[4];
        float theta;
        int max_pos;
        bool in_place;
    } cases[] = {
        {5, 3, 128, 128, 128, 0, 3, {16, 24, 24, 0}, 1e6f, 5000, true},
        {7, 2, 80, 80, 40, 1, 2, {20, 20, 0, 0}, 10000.0f, 40, false},
        {4, 3, 64, 48, 48, 1, 4, {8, 0, 10, 6}, 10000.0f, 70000, false},
        {3, 5, 40, 32, 32, 0, 3, {0, 12, 4, 0}, 500000.0f, 32768, true},
        {66, 1, 256, 256, 256, 1, 1, {128, 0, 0, 0}, 10000.0f, 100, false},
    };
    for (auto &c : cases) {
        auto x = rand_vec(c.T * c.H * c.D, -2, 2);
        std::vector<int32_t> pos(c.T * c.n_axes);
        for (auto &p : pos)
            p = (int32_t)(rng_u64() % (uint64_t)(c.max_pos + 1));
        pos[0] = c.max_pos;
        /* dst: token stride padded by 3 floats and filled with NaN unless in place. */
        int64_t ys0 = c.in_place ? c.H * c.D : c.H * c.D + 3;
        std::vector<float> xin(x), y(c.in_place ? 0 : c.T * ys0, NAN);
        cu_rope_desc d = {};
        d.x = xin.data();
        d.y = c.in_place ? xin.data() : y.data();
        d.pos = pos.data();
        d.T = c.T;
        d.H = c.H;
        d.D = c.D;
        d.xs0 = c.H * c.D;
        d.xs1 = d.ys1 = c.D;
        d.ys0 = ys0;
        d.n_rot = c.n_rot;
        d.mode = MMRT_ROPE_NEOX;
        d.n_axes = c.n_axes;
        /* What cu_op_rope_multi does on the host: per-pair inv_freq and section ends. */
        for (int a = 0, i = 0, start = 0; a < c.n_axes; a++) {
            for (int k = 0; k < c.sections[a]; k++, i++) {
                int j = c.restart ? i - start : i;
                d.inv_freq[i] = 1.0f / powf(c.theta, (float)(2 * j) / (float)c.freq_dim);
            }
            start = i;
            d.sec_end[a] = i;
        }
        cu_launch_rope(&d, nullptr);
        std::vector<float> got(x.size());
        for (int64_t t = 0; t < c.T; t++)
            memcpy(&got[t * c.H * c.D], d.y + t * ys0, sizeof(float) * c.H * c.D);
        bool pad_ok = true;
        for (int64_t t = 0; !c.in_place && t < c.T; t++)
            for (int k = 0; k < 3; k++)
                pad_ok &= isnan(y[t * ys0 + c.H * c.D + k]);
        std::vector<double> ref(x.size());
        ref_rope_multi(x.data(), pos.data(), c.T, c.H, c.D, c.n_rot, c.freq_dim, c.restart,
                       c.n_axes, c.sections, c.theta, ref.data());
        char what[96];
        snprintf(what, sizeof what, "ROPE_MULTI T %lld D %lld n_rot %d freq_dim %d restart %d "
                 "axes %d%s", (long long)c.T, (long long)c.D, c.n_rot, c.freq_dim, c.restart,
                 c.n_axes, c.in_place ? " in place" : "");
        check(what, got.data(), ref.data(), x.size(), 1e-6);
        if (!c.in_place) {
            snprintf(what, sizeof what, "ROPE_MULTI D %lld: dst padding untouched", (long long)c.D);
            expect(what, pad_ok);
        }
    }
}

static void test_set_rows(void)
{
    /* Each dst dtype; in-range, out-of-range and repeated indices; rows shorter than a block,
     * and longer than one blockIdx.y slice (1024 elements). Exact against the reference
     * rounded to dst's dtype; rows nobody writes keep their sentinel. */
    struct { int64_t T, n, R; } shapes[] = {{1, 256, 8}, {9, 37, 12}, {70, 5, 64}, {3, 2500, 4}};
    const int dts[4] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16, MMRT_DTYPE_F8E4M3};
    for (auto &sh : shapes)
        for (int dt : dts) {
            int64_t T = sh.T, n = sh.n, R = sh.R;
            auto val = rand_vec(T * n, -70000, 70000);
            if (dt == MMRT_DTYPE_F8E4M3) /* mostly within ±448, a third among subnormals */
                for (int64_t i = 0; i < T * n; i++)
                    val[i] = i % 3 == 2 ? val[i] * 0x1.0p-22f : val[i] / 128.0f;
            val[0] = NAN;
            if (T * n > 4) {
                val[1] = 1e-7f;     /* an f16 subnormal */
                val[2] = 65520.0f;  /* rounds to f16 infinity */
                val[3] = -3e-39f;   /* an f32 subnormal */
            }
            std::vector<int32_t> idx(T);
            for (int64_t t = 0; t < T; t++)
                idx[t] = (int32_t)(rng_u64() % (uint64_t)(R + 2)) - 1; /* −1 … R */
            if (T > 3) {
                idx[1] = (int32_t)R - 1;
                idx[3] = idx[1]; /* duplicate: row 3 must win whole */
                idx[2] = INT32_MIN;
            }
            if (T == 1)
                idx[0] = (int32_t)R - 1;
            size_t es = mmrt_dtype_size((enum mmrt_dtype)dt);
            std::vector<uint8_t> dst(R * n * es);
            std::vector<double> ref(R * n);
            for (int64_t i = 0; i < R * n; i++) { /* sentinel: −(i + 1) / 8, exact in all */
                float f = -(float)(i % 1000 + 1) / 8.0f;
                ref[i] = f;
                if (dt == MMRT_DTYPE_F32) memcpy(&dst[i * 4], &f, 4);
                else if (dt == MMRT_DTYPE_F8E4M3) dst[i] = ref_f8e4m3_encode(f);
                else {
                    uint16_t h = dt == MMRT_DTYPE_F16 ? h_f16(f) : h_bf16(f);
                    memcpy(&dst[i * 2], &h, 2);
                }
            }
            cu_launch_set_rows(dst.data(), dt, R, val.data(), idx.data(), T, n, nullptr, 1, n,
                               nullptr);
            ref_set_rows(val.data(), idx.data(), T, n, R, ref.data());
            bool ok = true;
            int64_t bad = -1;
            for (int64_t i = 0; i < R * n && ok; i++) {
                float want = (float)ref[i];
                if (dt == MMRT_DTYPE_F32) {
                    float got;
                    memcpy(&got, &dst[i * 4], 4);
                    ok = isnan(want) ? isnan(got) : memcmp(&got, &want, 4) == 0;
                } else if (dt == MMRT_DTYPE_F8E4M3) {
                    ok = dst[i] == ref_f8e4m3_encode(want);
                } else {
                    uint16_t got, w = dt == MMRT_DTYPE_F16 ? h_f16(want) : h_bf16(want);
                    memcpy(&got, &dst[i * 2], 2);
                    ok = got == w;
                }
                if (!ok)
                    bad = i;
            }
            char what[96];
            snprintf(what, sizeof what, "SET_ROWS T %lld n %lld R %lld dst dt %d%s", (long long)T,
                     (long long)n, (long long)R, dt, ok ? "" : " (first wrong element below)");
            expect(what, ok);
            if (!ok)
                printf("  element %lld (row %lld)\n", (long long)bad, (long long)(bad / n));
        }
}

/* SET_ROWS into an I8 store with row scales (ABI 1.7): codes and scales bit for bit against
 * ref_i8_row. dst [R, per, D]: per innermost rows of D per dst row, each with its own scale
 * at scales[idx · per + i]. Rows of one warp's width and less, of 1100 and 2500 (many lanes'
 * worth each), more rows per token than a block has warps (grid.y), D = 0 (scales only).
 * Edge rows: all zero (s = 0, codes 0), a NaN among values (ignored by amax, code 0), an
 * infinity (s = ∞, every code 0), all NaN, subnormals only (s rounds to 0: codes ±127 or
 * 0), amax 127 and 254 (s = 1, 2) with ties x / s = k + 0.5 both ways, −0. Indices out of
 * range and repeated as in test_set_rows; untouched rows keep their sentinel codes and
 * scales. */
static void test_set_rows_i8(void)
{
    struct { int64_t T, per, D, R; } shapes[] = {
        {1, 8, 128, 8}, {9, 3, 37, 12}, {70, 1, 5, 64}, {3, 1, 2500, 4}, {4, 2, 1100, 5},
        {5, 11, 64, 7}, {2, 3, 0, 4}, {12, 2, 32, 16},
    };
    for (auto &sh : shapes) {
        const int64_t T = sh.T, per = sh.per, D = sh.D, R = sh.R, n = per * D;
        auto val = rand_vec(T * n, -3, 3);
        /* Magnitudes per row 2^-20 … 2^20, so the scales differ widely; the largest |x| of a
         * row is its last element, past the first pass of a warp or block. */
        for (int64_t r = 0; r < T * per; r++)
            for (int64_t k = 0; k < D; k++)
                val[r * D + k] = ldexpf(k == D - 1 && D > 1 ? 4.0f * (float)(1 - 2 * (r & 1))
                                                            : val[r * D + k],
                                        (int)(r * 7 % 41) - 20);
        auto row = [&](int64_t r) { return r < T * per ? val.data() + r * D : nullptr; };
        const float ties[] = {2.5f, -2.5f, 3.5f, -3.5f, 0.5f, -0.5f, 126.5f, -126.5f, 1.5f};
        if (D >= 12) {
            if (float *x = row(1)) /* all zero, one of them −0 */
                for (int64_t k = 0; k < D; k++)
                    x[k] = k == 3 ? -0.0f : 0.0f;
            if (float *x = row(2)) /* a NaN: amax of the rest */
                x[5] = NAN;
            if (float *x = row(3)) /* an infinity */
                x[D - 1] = -INFINITY;
            if (float *x = row(4)) /* all NaN */
                for (int64_t k = 0; k < D; k++)
                    x[k] = NAN;
            if (float *x = row(5)) /* subnormals: amax / 127 rounds to 0 */
                for (int64_t k = 0; k < D; k++)
                    x[k] = k % 3 == 0 ? 0.0f : (k % 2 ? 1 : -1) * 0x1.0p-149f * (float)(k % 4);
            if (float *x = row(6)) { /* s = 1: ties at k + 0.5 round to even */
                for (int64_t k = 0; k < D; k++)
                    x[k] = ties[k % 9];
                x[D - 1] = 127.0f;
            }
            if (float *x = row(7)) { /* s = 2 */
                for (int64_t k = 0; k < D; k++)
                    x[k] = 2.0f * ties[k % 9];
                x[0] = -254.0f;
            }
        }
        std::vector<int32_t> idx(T);
        for (int64_t t = 0; t < T; t++)
            idx[t] = (int32_t)(rng_u64() % (uint64_t)(R + 2)) - 1; /* −1 … R */
        if (T > 3) {
            idx[1] = (int32_t)R - 1;
            idx[3] = idx[1]; /* duplicate: row 3 must win whole, scales too */
            idx[2] = INT32_MIN;
        }
        if (T == 1)
            idx[0] = (int32_t)R - 1;
        if (T > 1 && T <= 3)
            idx[T - 1] = 0;
        if (T >= 12) /* every edge row above is written somewhere */
            for (int64_t t = 0; t < 8; t++)
                idx[t] = (int32_t)t;
        /* Sentinels: codes (i % 200) − 100, scales −(row + 1). */
        std::vector<int8_t> dst(R * n + 1), want(R * n + 1);
        std::vector<float> sc(R * per + 1), want_sc(R * per + 1);
        for (int64_t i = 0; i < R * n + 1; i++)
            dst[i] = want[i] = (int8_t)(i % 200 - 100);
        for (int64_t r = 0; r < R * per + 1; r++)
            sc[r] = want_sc[r] = -(float)(r + 1);
        for (int64_t t = 0; t < T; t++) /* in order: a later duplicate overwrites */
            if (idx[t] >= 0 && idx[t] < R)
                for (int64_t i = 0; i < per; i++)
                    want_sc[idx[t] * per + i] =
                        ref_i8_row(val.data() + (t * per + i) * D, D,
                                   want.data() + (idx[t] * per + i) * D);
        cu_launch_set_rows(dst.data(), MMRT_DTYPE_I8, R, val.data(), idx.data(), T, n, sc.data(),
                           per, D, nullptr);
        int64_t bad = -1, bad_sc = -1;
        for (int64_t i = 0; i < R * n + 1 && bad < 0; i++)
            if (dst[i] != want[i])
                bad = i;
        for (int64_t r = 0; r < R * per + 1 && bad_sc < 0; r++)
            if (memcmp(&sc[r], &want_sc[r], 4) != 0)
                bad_sc = r;
        char what[128];
        snprintf(what, sizeof what, "SET_ROWS i8 T %lld rows of %lld x %lld R %lld: codes and "
                 "scales bit for bit", (long long)T, (long long)per, (long long)D, (long long)R);
        expect(what, bad < 0 && bad_sc < 0);
        if (bad >= 0)
            printf("  code %lld (row %lld): got %d, want %d\n", (long long)bad,
                   (long long)(bad / (D ? D : 1)), dst[bad], want[bad]);
        if (bad_sc >= 0)
            printf("  scale %lld: got %a, want %a\n", (long long)bad_sc, (double)sc[bad_sc],
                   (double)want_sc[bad_sc]);
    }

    /* The reference itself on the edges plugin.h names, so that the comparison above
     * means what it says. */
    float x[6] = {0.0f, -0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int8_t c[6];
    expect("I8 ref: an all-zero row has scale 0 and codes 0",
           ref_i8_row(x, 6, c) == 0.0f && c[0] == 0 && c[1] == 0);
    const float y[6] = {INFINITY, 1.0f, -5.0f, NAN, 0.0f, -INFINITY};
    const float s = ref_i8_row(y, 6, c);
    expect("I8 ref: a row with an infinity has scale +inf and codes 0",
           isinf(s) && s > 0 && c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0 && c[5] == 0);
    const float z[6] = {127.0f, 2.5f, -3.5f, 0.5f, NAN, -126.5f};
    expect("I8 ref: s = 1, ties to even, NaN 0",
           ref_i8_row(z, 6, c) == 1.0f && c[0] == 127 && c[1] == 2 && c[2] == -4 && c[3] == 0 &&
               c[4] == 0 && c[5] == -126);
}

/* ---- GATHER_HEADS, L2_NORM -------------------------------------------------------------- */

static void test_gather_heads(void)
{
    /* Every table dtype; D = 1, 7, 40, 128 and 257 (several lane passes, a tail); G = 1 in any
     * order with repeats, G = 2, 4 and 9 with −1 / INT32_MIN padding in random places, a group
     * of nothing but padding (zeros), entries R, R + 1 and INT32_MAX skipped — the two table
     * rows past R hold NaN, so reading one shows; more output rows than a block's eight warps.
     * Bit for bit against ref_gather_heads, the f32 operations plugin.h fixes; dst starts as
     * NaN, so every element must be written. */
    struct { int64_t R, H, D, N, G; } shapes[] = {
        {1, 1, 1, 1, 1}, {64, 8, 128, 5, 1}, {64, 2, 40, 17, 4}, {30, 4, 128, 3, 9},
        {16, 3, 7, 9, 4}, {9, 1, 257, 5, 2},
    };
    const int dts[5] = {MMRT_DTYPE_F32, MMRT_DTYPE_F16, MMRT_DTYPE_BF16, MMRT_DTYPE_F8E4M3,
                        MMRT_DTYPE_I8};
    for (auto &sh : shapes)
        for (int dt : dts) {
            const int64_t R = sh.R, H = sh.H, D = sh.D, N = sh.N, G = sh.G;
            const int64_t nt = (R + 2) * H * D;
            auto tf = rand_vec(nt, -100, 100);
            tf[0] = -0.0f; /* a G = 1 copy keeps it */
            std::vector<uint16_t> th(nt);
            std::vector<uint8_t> t8(nt);
            /* I8 (ABI 1.7): each row of D quantized with its own scale (rows of differing
             * magnitude, one of zeros; −0 from a code 0 times a negative scale), tf the
             * values the codes stand for, code · scale rounded once; the two rows past R
             * read as NaN through a NaN scale. */
            std::vector<float> ts((R + 2) * H);
            for (int64_t rh = 0; dt == MMRT_DTYPE_I8 && rh < (R + 2) * H; rh++) {
                float *x = &tf[rh * D];
                int8_t *c8 = reinterpret_cast<int8_t *>(&t8[rh * D]);
                for (int64_t e = 0; e < D; e++)
                    x[e] = rh == 1 ? 0.0f : ldexpf(x[e], (int)(rh % 9) - 4);
                ts[rh] = ref_i8_row(x, D, c8);
                if (rh == 0) {
                    c8[0] = 0;
                    ts[0] = -ts[0];
                }
                if (rh >= R * H)
                    ts[rh] = NAN;
                for (int64_t e = 0; e < D; e++)
                    x[e] = i8_value(c8[e], ts[rh]);
            }
            for (int64_t i = 0; i < nt && dt != MMRT_DTYPE_I8; i++) {
                if (i >= R * H * D)
                    tf[i] = NAN;
                if (dt == MMRT_DTYPE_F8E4M3) {
                    t8[i] = ref_f8e4m3_encode(tf[i]);
                    tf[i] = ref_f8e4m3_value(t8[i]);
                } else if (dt == MMRT_DTYPE_F16) {
                    th[i] = h_f16(tf[i]);
                    tf[i] = f16_f(th[i]);
                } else if (dt == MMRT_DTYPE_BF16) {
                    th[i] = h_bf16(tf[i]);
                    tf[i] = bf16_f(th[i]);
                }
            }
            std::vector<int32_t> idx(N * H * G);
            for (int64_t grp = 0; grp < N * H; grp++) {
                int32_t *ix = &idx[grp * G];
                int64_t keep = G > 1 ? 1 + (int64_t)(rng_u64() % (uint64_t)G) : 1;
                for (int64_t g = 0; g < G; g++)
                    ix[g] = g < keep ? (int32_t)(rng_u64() % (uint64_t)R) : -1;
                for (int64_t g = G - 1; g > 0; g--) {
                    int64_t j = (int64_t)(rng_u64() % (uint64_t)(g + 1));
                    int32_t t = ix[g];
                    ix[g] = ix[j];
                    ix[j] = t;
                }
                if (grp % 7 == 5)
                    ix[rng_u64() % (uint64_t)G] = (int32_t)(R + grp % 2);
                if (grp % 11 == 10)
                    ix[rng_u64() % (uint64_t)G] = grp % 2 ? INT32_MAX : INT32_MIN;
            }
            idx[0] = 0;
            if (G == 1 && N > 1)
                idx[H] = 0; /* a repeat */
            if (N * H > 2)
                for (int64_t g = 0; g < G; g++)
                    idx[2 * G + g] = -1;
            std::vector<float> y(N * H * D, NAN), want(N * H * D);
            const void *table = dt == MMRT_DTYPE_F32 ? (const void *)tf.data()
                                : dt == MMRT_DTYPE_F8E4M3 || dt == MMRT_DTYPE_I8
                                    ? (const void *)t8.data()
                                    : (const void *)th.data();
            cu_launch_gather_heads(y.data(), table, dt, dt == MMRT_DTYPE_I8 ? ts.data() : nullptr,
                                   R, H, D, idx.data(), N * H, G, nullptr);
            ref_gather_heads(tf.data(), idx.data(), R, H, D, N, G, want.data());
            int64_t bad = -1;
            for (int64_t i = 0; i < N * H * D && bad < 0; i++)
                if (memcmp(&y[i], &want[i], 4) != 0)
                    bad = i;
            char what[112];
            snprintf(what, sizeof what, "GATHER_HEADS table [%lld, %lld, %lld] dt %d G %lld%s",
                     (long long)R, (long long)H, (long long)D, dt, (long long)G,
                     bad < 0 ? " bit-exact" : " (first wrong element below)");
            expect(what, bad < 0);
            if (bad >= 0)
                printf("  element %lld: got %.9g, want %.9g\n", (long long)bad, (double)y[bad],
                       (double)want[bad]);
        }
}

static void test_l2_norm(void)
{
    /* Rows of 1 … 4099 (off the warp width), rows of every magnitude from 2^-20 to 2^20 and
     * zero rows (exactly 0), n = 0 (0), more rows than a block's eight warps. Each row within
     * 1e-6 of the double reference, relative to itself. */
    const int64_t cases[][2] = {{1, 1}, {3, 7}, {9, 128}, {5, 4099}, {4, 0}, {17, 40}, {41, 33}};
    for (auto &cs : cases) {
        const int64_t rows = cs[0], n = cs[1];
        std::vector<float> x(rows * n + 1);
        for (int64_t r = 0; r < rows; r++) {
            float amp = r % 5 == 4 ? 0.0f : ldexpf(1.0f, (int)(r % 41) - 20);
            for (int64_t k = 0; k < n; k++)
                x[r * n + k] = amp * rng_f(-1, 1);
        }
        std::vector<float> y(rows, NAN);
        std::vector<double> ref(rows);
        cu_launch_l2_norm(y.data(), x.data(), rows, n, nullptr);
        ref_l2_norm(x.data(), rows, n, ref.data());
        bool ok = true;
        for (int64_t r = 0; r < rows; r++)
            ok &= ref[r] == 0 ? y[r] == 0.0f : fabs((double)y[r] - ref[r]) <= 1e-6 * ref[r];
        char what[64];
        snprintf(what, sizeof what, "L2_NORM [%lld, %lld] every row within 1e-6", (long long)rows,
                 (long long)n);
        expect(what, ok);
    }
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || strstr(only, "attention")) test_attention();
    if (!*only || strstr(only, "attention")) test_attention_paged();
    if (!*only || strstr(only, "gemv")) test_gemv();
    if (!*only || strstr(only, "gemv")) test_gemv_i8();
    if (!*only || strstr(only, "gemv")) test_gemv_u4();
    if (!*only || strstr(only, "prep")) test_prep();
    if (!*only || strstr(only, "rows")) test_rows();
    if (!*only || strstr(only, "elementwise")) test_elementwise();
    if (!*only || strstr(only, "copy")) test_copy();
    if (!*only || strstr(only, "rope")) test_rope();
    if (!*only || strstr(only, "rope_multi")) test_rope_multi();
    if (!*only || strstr(only, "set_rows")) test_set_rows();
    if (!*only || strstr(only, "set_rows")) test_set_rows_i8();
    if (!*only || strstr(only, "gather_heads")) test_gather_heads();
    if (!*only || strstr(only, "l2_norm")) test_l2_norm();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
