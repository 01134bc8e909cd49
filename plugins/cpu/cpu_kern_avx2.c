/*
 * plugins/cpu/cpu_kern_avx2.c — the AVX2 kernel table (AVX2 + FMA + F16C; compiled with those
 * -m flags, see CMakeLists.txt; entered only when cpu_isa.c found them on this CPU).
 *
 * Same structure as cpu_kern_avx512.c at half the width and with 16 ymm registers:
 * micro-kernel MR = 6 rows × NR = 16 columns (two ymm), 12 accumulators, one FMA chain per
 * output in k order; W packing converts (vcvtph2ps for F16, a shift for BF16) and transposes
 * 8 × 8 blocks in registers; GEMV as in the AVX-512 file (blocks of W rows read once, x rows
 * in passes over the block while it is hot, K chunks, one instantiation per dtype, every row
 * bit-identical for every M ≤ 32) with 8 lanes along k, four W rows × two x rows per pass
 * (eight W rows for M = 1; three x rows over a widened block when M > 2) to fit 16
 * registers, and a fixed reduction. AVX2 has no 16-bit masked load, so K tails go through a
 * small zeroed stack buffer (never a read past the end of a row).
 *
 * exp: the same Cephes scheme as the AVX-512 file, but 2^n is built in the exponent field,
 * which covers n ∈ [−126, 128]: below x = −87.33 the result is 0 (expf would give a subnormal
 * below 1.2e-38), above 88.72 it is +inf, NaN stays NaN.
 */
#include <float.h>
#include <immintrin.h>
#include <stdbool.h>

#include "cpu_internal.h"

#define MR 6
#define NR 16

/* 8 FP8 E4M3 codes (the low 8 bytes of codes) as f32, exactly as mmrt_f8e4m3_to_f32
 * (plugin.h): a normal code's 7 magnitude bits moved to f32 bits 20…26 with 120 added to the
 * exponent, a subnormal one as mantissa · 2^-9 (an exact product, never an f32 subnormal),
 * 0x7F the NaN, then the sign. */
static inline __attribute__((always_inline)) __m256 f8x8(__m128i codes)
{
    const __m256i v = _mm256_cvtepu8_epi32(codes);
    const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7F));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    __m256 r = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
    r = _mm256_blendv_ps(r, _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1.0p-9f)),
                         _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    r = _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F))));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(r), sign));
}

/* 8 weight-dtype elements at p as f32 (dt is a constant wherever this is inlined into a
 * loop, so the switch folds away). */
static inline __attribute__((always_inline)) __m256 wload8(const void *p, const int dt)
{
    switch (dt) {
    case MMRT_DTYPE_F8E4M3: /* a KV page's codes */
        return f8x8(_mm_loadl_epi64((const __m128i *)p));
    case MMRT_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case MMRT_DTYPE_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    case MMRT_DTYPE_I8: /* a quantized weight's codes; its scale is applied to the sums */
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    default:
        return _mm256_loadu_ps((const float *)p);
    }
}

/* 8 elements of a weight-dtype array at p as f32; n < 8 reads only n of them (the rest 0). */
static inline __attribute__((always_inline)) __m256 load8(const void *p, int dt, int64_t n)
{
    if (n < 8) {
        uint32_t buf[8] = { 0 };
        memcpy(buf, p, (size_t)n * mmrt_dtype_size((enum mmrt_dtype)dt));
        return wload8(buf, dt);
    }
    return wload8(p, dt);
}

static inline __m256 loadf8(const float *p, int64_t n)
{
    return load8(p, MMRT_DTYPE_F32, n);
}

static inline void storef8(float *p, __m256 v, int64_t n)
{
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
    } else {
        float buf[8];
        _mm256_storeu_ps(buf, v);
        memcpy(p, buf, (size_t)n * sizeof(float));
    }
}

/* Fixed-order sum of the 8 lanes. */
static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- W packing ------------------------------------------------------------------------- */

static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

static void pack_w(const void *w, int dtype, int64_t ldw, int64_t cols, int64_t kc, float *dst)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dtype);
    for (int jb = 0; jb < NR; jb += 8) {
        int64_t rows = cols - jb < 0 ? 0 : cols - jb > 8 ? 8 : cols - jb;
        for (int64_t k0 = 0; k0 < kc; k0 += 8) {
            int64_t kl = kc - k0 < 8 ? kc - k0 : 8;
            __m256 r[8];
            for (int t = 0; t < 8; t++)
                r[t] = t < rows ? load8((const char *)w + ((jb + t) * ldw + k0) * es, dtype, kl)
                                : _mm256_setzero_ps();
            transpose8(r);
            for (int t = 0; t < kl; t++)
                _mm256_storeu_ps(dst + (k0 + t) * NR + jb, r[t]);
        }
    }
}

static void pack_rows(const void *w, int dtype, int64_t ldw, int64_t rows, int64_t cols,
                      float *dst)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dtype);
    int64_t c0 = cols < 8 ? cols : 8, c1 = cols > 8 ? cols - 8 : 0;
    for (int64_t k = 0; k < rows; k++) {
        const char *src = (const char *)w + k * ldw * es;
        _mm256_storeu_ps(dst + k * NR, c0 ? load8(src, dtype, c0) : _mm256_setzero_ps());
        _mm256_storeu_ps(dst + k * NR + 8,
                         c1 ? load8(src + 8 * es, dtype, c1) : _mm256_setzero_ps());
    }
}

static void pack_x(const float *x, int64_t ldx, int64_t rows, int64_t kc, float *dst)
{
    const __m256i out = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0); /* MR = 6 lanes */
    for (int64_t k0 = 0; k0 < kc; k0 += 8) {
        int64_t kl = kc - k0 < 8 ? kc - k0 : 8;
        __m256 r[8];
        for (int t = 0; t < 8; t++)
            r[t] = t < rows && t < MR ? loadf8(x + t * ldx + k0, kl) : _mm256_setzero_ps();
        transpose8(r);
        for (int t = 0; t < kl; t++)
            _mm256_maskstore_ps(dst + (k0 + t) * MR, out, r[t]);
    }
}

/* ---- the micro-kernel ------------------------------------------------------------------- */

#define REP6(M) M(0) M(1) M(2) M(3) M(4) M(5)
#define DECL(i) __m256 a##i##0, a##i##1;
#define ZERO(i) a##i##0 = _mm256_setzero_ps(); a##i##1 = _mm256_setzero_ps();
#define LOADC(i)                                                                               \
    a##i##0 = _mm256_loadu_ps(c + (i) * ldc);                                                  \
    a##i##1 = _mm256_loadu_ps(c + (i) * ldc + 8);
#define STEP(i)                                                                                \
    {                                                                                          \
        __m256 xb = _mm256_broadcast_ss(xp + (i));                                             \
        a##i##0 = _mm256_fmadd_ps(xb, w0, a##i##0);                                            \
        a##i##1 = _mm256_fmadd_ps(xb, w1, a##i##1);                                            \
    }
#define STOREC(i)                                                                              \
    _mm256_storeu_ps(c + (i) * ldc, a##i##0);                                                  \
    _mm256_storeu_ps(c + (i) * ldc + 8, a##i##1);

static void micro(const float *xp, const float *wp, int64_t ldw, int64_t kc, float *c,
                  int64_t ldc, int accumulate)
{
    REP6(DECL)
    if (accumulate) {
        REP6(LOADC)
    } else {
        REP6(ZERO)
    }
    for (int64_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_loadu_ps(wp), w1 = _mm256_loadu_ps(wp + 8);
        REP6(STEP)
        xp += MR;
        wp += ldw;
    }
    REP6(STOREC)
}

/* ---- GEMV ------------------------------------------------------------------------------- */

/* As in cpu_kern_avx512.c at 8 lanes, with 16 ymm registers: GV_R = 4 W rows × up to GV_G = 2
 * x rows in one pass over K (8 accumulators + 2 x + 1 W vector), 8 W rows for M = 1. More x
 * rows take the widened path: blocks of GW_R = 4 W rows widened to f32 once per K chunk of
 * GW_KC (a multiple of 8) into an L1 buffer, passes of up to GW_G = 3 x rows over it (12
 * accumulators, 3 x vectors, W as the FMAs' memory operand), partial sums kept in `save`
 * between chunks (exact). */
#define GV_R 4
#define GV_G 2
#define GW_R 4
#define GW_G 3
#define GW_KC 512

/* One pass over all K for G x rows and R W rows; see gemv_pass in cpu_kern_avx512.c. The K
 * tail goes through zeroed stack buffers, as load8 does. */
static inline __attribute__((always_inline)) void
gemv_pass(const float *x, int64_t ldx, const char *w, const int dt, int64_t rowb, const int R,
          const int G, int64_t K, float *y, int64_t ldy, const char *pf)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    __m256 acc[GV_G][8];
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[g][r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if (pf) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                _mm_prefetch(pf + r * rowb + k * es, _MM_HINT_T1);
        }
        __m256 xv[GV_G];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++)
            xv[g] = _mm256_loadu_ps(x + g * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 wv = wload8(w + r * rowb + k * es, dt);
#pragma GCC unroll 2
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm256_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
    if (k < K) {
        int64_t n = K - k;
        __m256 xv[GV_G];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++)
            xv[g] = loadf8(x + g * ldx + k, n);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 wv = load8(w + r * rowb + k * es, dt, n);
#pragma GCC unroll 2
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm256_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            y[g * ldy + r] = hsum8(acc[g][r]);
}

/* buf[r · GW_KC + (k − k0)] = W[r, k] as f32 for k in [k0, k1), the tail zero-filled. */
static inline __attribute__((always_inline)) void
gemv_widen(const char *w, const int dt, int64_t rowb, const int R, int64_t k0, int64_t k1,
           float *buf)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const char *wr = w + r * rowb;
        float *br = buf + r * GW_KC - k0;
        int64_t k = k0;
        for (; k + 8 <= k1; k += 8)
            _mm256_storeu_ps(br + k, wload8(wr + k * es, dt));
        if (k < k1)
            _mm256_storeu_ps(br + k, load8(wr + k * es, dt, k1 - k));
    }
}

/* One pass of G x rows over a widened chunk of n columns (x already offset to the chunk). */
static inline __attribute__((always_inline)) void
gemv_wide_pass(const float *x, int64_t ldx, const float *buf, const int R, const int G,
               int64_t n, int first, int last, __m256 *save, float *y, int64_t ldy,
               struct cpu_gemv_prefetch *pf)
{
    __m256 acc[GW_G][GW_R];
#pragma GCC unroll 3
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[g][r] = first ? _mm256_setzero_ps() : save[g * GW_R + r];
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        if (pf->base)
            cpu_gemv_prefetch_step(pf, R);
        __m256 xv[GW_G];
#pragma GCC unroll 3
        for (int g = 0; g < G; g++)
            xv[g] = _mm256_loadu_ps(x + g * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = _mm256_loadu_ps(buf + r * GW_KC + k);
#pragma GCC unroll 3
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm256_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
    if (k < n) {
        __m256 xv[GW_G];
#pragma GCC unroll 3
        for (int g = 0; g < G; g++)
            xv[g] = loadf8(x + g * ldx + k, n - k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = _mm256_loadu_ps(buf + r * GW_KC + k);
#pragma GCC unroll 3
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm256_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (last)
                y[g * ldy + r] = hsum8(acc[g][r]);
            else
                save[g * GW_R + r] = acc[g][r];
        }
}

/* One block of R ≤ GW_R W rows against M > GV_G x rows, chunk by chunk, the x rows split into
 * passes of near-equal size. */
static inline __attribute__((always_inline)) void
gemv_rows_wide(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
               int64_t rowb, const int R, float *y, int64_t ldy, const char *pf)
{
    __m256 save[CPU_GEMV_MAX_M * GW_R];
    float buf[GW_R * GW_KC] __attribute__((aligned(32)));
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    const int64_t passes = (M + GW_G - 1) / GW_G;
    for (int64_t k0 = 0; k0 < K; k0 += GW_KC) {
        const int64_t k1 = K - k0 < GW_KC ? K : k0 + GW_KC;
        const int first = k0 == 0, last = k1 == K;
        gemv_widen(w, dt, rowb, R, k0, k1, buf);
        struct cpu_gemv_prefetch pfc = {
            .base = pf ? pf + k0 * es : NULL, .rowb = rowb,
            .total = R * (((k1 - k0) * es + 63) / 64), .steps = passes * ((k1 - k0) / 8),
        };
        for (int64_t p = 0, m0 = 0; p < passes; p++) {
            const int64_t g = (M - m0) / (passes - p) + ((M - m0) % (passes - p) != 0);
            const float *xg = x + m0 * ldx + k0;
            float *yg = y + m0 * ldy;
            __m256 *sg = save + m0 * GW_R;
#define GW_PASS(G) gemv_wide_pass(xg, ldx, buf, R, G, k1 - k0, first, last, sg, yg, ldy, &pfc)
            switch (g) {
            case 1: GW_PASS(1); break;
            case 2: GW_PASS(2); break;
            default: GW_PASS(3); break;
            }
#undef GW_PASS
            m0 += g;
        }
    }
}

/* One block of R W rows against M > GV_G x rows without the buffer (gemv_widen =
 * registers), as gemv_rows_regs in cpu_kern_avx512.c: passes of at most GV_G rows, the first
 * streaming the block and prefetching the next. F16 only: with two x rows a pass, each W
 * vector's widening is shared by two FMAs, and BF16's and I8's take two operations where
 * F16's takes one vcvtph2ps. On Zen 4 (isa = avx2) F16 gained up to 16 rows (8 rows: 4.9–7.9
 * → 4.4–5.0 ms for 11008 × 4096) and held even at 32; BF16 and I8 lost from 16 rows on (32
 * rows: 17–21 → 21–24 ms). */
static inline __attribute__((always_inline)) void
gemv_rows_regs(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
               int64_t rowb, const int R, float *y, int64_t ldy, const char *pf)
{
    for (int64_t m0 = 0; m0 < M; m0 += GV_G) {
        if (M - m0 >= 2)
            gemv_pass(x + m0 * ldx, ldx, w, dt, rowb, R, 2, K, y + m0 * ldy, ldy,
                      m0 == 0 ? pf : NULL);
        else
            gemv_pass(x + m0 * ldx, ldx, w, dt, rowb, R, 1, K, y + m0 * ldy, ldy, NULL);
    }
}

static inline __attribute__((always_inline)) void
gemv_rows(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
          int64_t rowb, const int R, float *y, int64_t ldy, const char *pf, const bool regs)
{
    if (M > GV_G && regs && dt == MMRT_DTYPE_F16)
        gemv_rows_regs(x, ldx, M, K, w, dt, rowb, R, y, ldy, pf);
    else if (M > GV_G)
        gemv_rows_wide(x, ldx, M, K, w, dt, rowb, R, y, ldy, pf);
    else if (M == 2)
        gemv_pass(x, ldx, w, dt, rowb, R, 2, K, y, ldy, pf);
    else
        gemv_pass(x, ldx, w, dt, rowb, R, 1, K, y, ldy, pf);
}

static inline __attribute__((always_inline)) void
gemv_dt(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
        int64_t rowb, int64_t n, float *y, int64_t ldy, const bool regs)
{
    int64_t j = 0;
    for (; M == 1 && j + 8 <= n; j += 8)
        gemv_pass(x, ldx, w + j * rowb, dt, rowb, 8, 1, K, y + j, ldy,
                  j + 16 <= n ? w + (j + 8) * rowb : NULL);
    for (; j + GV_R <= n; j += GV_R)
        gemv_rows(x, ldx, M, K, w + j * rowb, dt, rowb, GV_R, y + j, ldy,
                  j + 2 * GV_R <= n ? w + (j + GV_R) * rowb : NULL, regs);
    for (; j < n; j++)
        gemv_rows(x, ldx, M, K, w + j * rowb, dt, rowb, 1, y + j, ldy, NULL, regs);
}

#include "cpu_kern_gemv.h"

/* ---- U4 GEMV ------------------------------------------------------------------------------ */

/* The U4 row sum (struct cpu_kernels.q4_gemv) at 8 lanes, in this table's own order: each 8
 * bytes of a block give codes j…j+7 (low nibbles) and j+16…j+23 (high), so a block of 32 is
 * two loads and four FMAs into two chains per group — a0 takes codes j…j+7 then j+8…j+15,
 * a1 j+16…j+23 then j+24…j+31; one chain of four would wait on FMA latency — then
 * (a0 + a1)·scale into a running vector, its lanes summed and the zero points' share
 * (cpu_q4_zero_shares) subtracted. Both paths below compute exactly this for every pair. */

/* pack_w for U4 rows, as in cpu_kern_avx512.c at 8 codes a run: codes k…k+7 (k a multiple
 * of 8) are the low (k mod 32 < 16) or high nibbles of the 8 bytes at (k − k mod 32) / 2 +
 * (k mod 16). */
static void pack_w_q4(const uint8_t *w, int64_t ldb, const float *scale, const float *zero,
                      int64_t ng, int64_t gs, int64_t k0, int64_t cols, int64_t kc, float *dst)
{
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int jb = 0; jb < NR; jb += 8) {
        int64_t rows = cols - jb < 0 ? 0 : cols - jb > 8 ? 8 : cols - jb;
        for (int64_t kk = 0; kk < kc; kk += 8) {
            const int64_t k = k0 + kk, g = k / gs;
            __m256 r[8];
            for (int t = 0; t < 8; t++) {
                if (t >= rows) {
                    r[t] = _mm256_setzero_ps();
                    continue;
                }
                const uint8_t *b = w + (jb + t) * ldb + (k - (k & 31)) / 2 + (k & 8);
                __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
                c = (k & 16) ? _mm256_srli_epi32(c, 4) : _mm256_and_si256(c, m4);
                const int64_t i = (jb + t) * ng + g;
                r[t] = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(c),
                                                   _mm256_set1_ps(zero[i])),
                                     _mm256_set1_ps(scale[i]));
            }
            transpose8(r);
            for (int t = 0; t < 8; t++)
                _mm256_storeu_ps(dst + (kk + t) * NR + jb, r[t]);
        }
    }
}

/* ---- U4 GEMV over several x rows ---------------------------------------------------------- */

/* As in cpu_kern_avx512.c: each block of Q4_R W rows widened once per chunk of Q4_KC codes
 * into an L1 buffer in k order, then the row sum for passes of up to Q4_G x rows. With 16
 * ymm registers the running sums stay in memory (one update a group), so 3 × 2 pairs keep
 * their 12 chains in registers — two FMAs a step each, so fewer pairs left the step waiting
 * on FMA latency — with 2 x vectors and one W vector. */
#define Q4_R 3
#define Q4_G 2
#define Q4_KC 512
#define Q4_R1 4 /* W rows side by side for one x row: 12 accumulators */

static inline __attribute__((always_inline)) void
q4_widen(const uint8_t *w, int64_t rowb, const int R, int64_t k0, int64_t k1, float *buf,
         const uint8_t *pf)
{
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + r * rowb;
        float *br = buf + r * Q4_KC - k0;
        for (int64_t k = k0; pf && k < k1; k += 128)
            _mm_prefetch((const char *)pf + r * rowb + k / 2, _MM_HINT_T0);
        for (int64_t k = k0; k < k1; k += 32) {
            const uint8_t *b = wr + k / 2;
            __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
            __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8)));
            _mm256_store_ps(br + k, _mm256_cvtepi32_ps(_mm256_and_si256(b0, m4)));
            _mm256_store_ps(br + k + 8, _mm256_cvtepi32_ps(_mm256_and_si256(b1, m4)));
            _mm256_store_ps(br + k + 16, _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)));
            _mm256_store_ps(br + k + 24, _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)));
        }
    }
}

/* R W rows (widened in buf) × G x rows over codes [k0, k1) of one chunk; per pair, save holds
 * a0, a1 and the running sum between chunks (zeroed by the first). */
static inline __attribute__((always_inline)) void
q4_wide_pass(const float *x, int64_t ldx, const float *buf, const int R, const int G,
             int64_t k0, int64_t k1, int64_t gs, const float *s, int64_t ng, __m256 *save,
             int first)
{
    __m256 a0[Q4_G][Q4_R], a1[Q4_G][Q4_R];
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            __m256 *sv = save + (g * Q4_R + r) * 3;
            if (first)
                sv[2] = _mm256_setzero_ps();
            a0[g][r] = first ? _mm256_setzero_ps() : sv[0];
            a1[g][r] = first ? _mm256_setzero_ps() : sv[1];
        }
    int64_t gi = k0 / gs, ge = (gi + 1) * gs; /* advanced by addition, not division */
    for (int64_t k = k0; k < k1;) {
        const int64_t e = ge < k1 ? ge : k1;
        for (; k < e; k += 32) {
#pragma GCC unroll 4
            for (int j = 0; j < 32; j += 8) {
                __m256 xv[Q4_G];
#pragma GCC unroll 2
                for (int g = 0; g < G; g++) {
                    xv[g] = _mm256_loadu_ps(x + g * ldx + k + j);
                    /* in a register: folded into each FMA it was loaded R times */
                    __asm__("" : "+x"(xv[g]));
                }
#pragma GCC unroll 3
                for (int r = 0; r < R; r++) {
                    const __m256 wv = _mm256_load_ps(buf + r * Q4_KC + (k - k0) + j);
#pragma GCC unroll 2
                    for (int g = 0; g < G; g++) {
                        if (j < 16)
                            a0[g][r] = _mm256_fmadd_ps(wv, xv[g], a0[g][r]);
                        else
                            a1[g][r] = _mm256_fmadd_ps(wv, xv[g], a1[g][r]);
                    }
                }
            }
        }
        if (k == ge) {
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) {
                const __m256 sv = _mm256_set1_ps(s[r * ng + gi]);
#pragma GCC unroll 2
                for (int g = 0; g < G; g++) {
                    __m256 *tot = save + (g * Q4_R + r) * 3 + 2;
                    *tot = _mm256_fmadd_ps(_mm256_add_ps(a0[g][r], a1[g][r]), sv, *tot);
                    a0[g][r] = a1[g][r] = _mm256_setzero_ps();
                }
            }
            gi++;
            ge += gs;
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            __m256 *sv = save + (g * Q4_R + r) * 3;
            sv[0] = a0[g][r];
            sv[1] = a1[g][r];
        }
}

static inline __attribute__((always_inline)) void
q4_rows_wide(const float *x, int64_t ldx, int64_t M, int64_t K, const uint8_t *w,
             const float *s, const float *z, const float *xs, int64_t ng, const int R,
             float *y, int64_t ldy, const uint8_t *pf)
{
    __m256 save[CPU_GEMV_MAX_M * Q4_R * 3];
    float buf[Q4_R * Q4_KC] __attribute__((aligned(32)));
    const int64_t rowb = K / 2, gs = K / ng;
    for (int64_t k0 = 0; k0 < K; k0 += Q4_KC) {
        const int64_t k1 = K - k0 < Q4_KC ? K : k0 + Q4_KC;
        q4_widen(w, rowb, R, k0, k1, buf, pf);
        for (int64_t m = 0; m < M; m += Q4_G) {
            __m256 *sg = save + m * Q4_R * 3;
            if (M - m >= 2)
                q4_wide_pass(x + m * ldx, ldx, buf, R, 2, k0, k1, gs, s, ng, sg, k0 == 0);
            else
                q4_wide_pass(x + m * ldx, ldx, buf, R, 1, k0, k1, gs, s, ng, sg, k0 == 0);
        }
    }
    float zc[CPU_GEMV_MAX_M * Q4_R];
    cpu_q4_zero_shares(s, z, xs, ng, M, R, zc);
    for (int64_t m = 0; m < M; m++)
        for (int r = 0; r < R; r++)
            y[m * ldy + r] = hsum8(save[(m * Q4_R + r) * 3 + 2]) - zc[m * R + r];
}

/* One x row against R W rows at once, as in cpu_kern_avx512.c: the rows' code streams side
 * by side, each prefetching its place in the next block (pf). */
static inline __attribute__((always_inline)) void
q4_rows_one(const float *x, const uint8_t *w, int64_t rowb, const float *s, const float *z,
            const float *xs, int64_t ng, int64_t gs, const int R, float *y, const uint8_t *pf)
{
    const __m256i m4 = _mm256_set1_epi32(15);
    __m256 tot[Q4_R1];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        tot[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 a0[Q4_R1], a1[Q4_R1];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            a0[r] = a1[r] = _mm256_setzero_ps();
            for (int64_t k = g * gs; pf && k < (g + 1) * gs; k += 128)
                _mm_prefetch((const char *)pf + r * rowb + k / 2, _MM_HINT_T0);
        }
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *b = w + r * rowb + k / 2;
                __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
                __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8)));
                a0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b0, m4)),
                                        _mm256_loadu_ps(x + k), a0[r]);
                a1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)),
                                        _mm256_loadu_ps(x + k + 16), a1[r]);
                a0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b1, m4)),
                                        _mm256_loadu_ps(x + k + 8), a0[r]);
                a1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)),
                                        _mm256_loadu_ps(x + k + 24), a1[r]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            tot[r] = _mm256_fmadd_ps(_mm256_add_ps(a0[r], a1[r]), _mm256_set1_ps(s[r * ng + g]),
                                     tot[r]);
    }
    float zc[Q4_R1];
    cpu_q4_zero_shares(s, z, xs, ng, 1, R, zc);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        y[r] = hsum8(tot[r]) - zc[r];
}

#include "cpu_kern_q4_gemv.h"

/* ---- int8 U4 GEMV (int8_dot) ---------------------------------------------------------------- */

/* The unit of cpu_kern_avx512vnni.c at 8 lanes, without VNNI: a step is 64 codes (32 bytes,
 * two blocks); vpmaddubsw multiplies the unsigned codes by x's signed int8 codes and adds
 * pairs to int16 (at most 2 · 15 · 128 each, and the low- and high-nibble halves' sum at most
 * twice that: no saturation), vpmaddwd by ones adds pairs of those to int32 lanes, four per
 * block. Three digits join their lanes' sums as A·65536 + B·256 + C, within 2^31 as in the
 * VNNI unit; B's 256 is vpmaddwd's multiplier instead of ones. 16 ymm registers: 4 rows side
 * by side with the x chunk, its d and the lanes' groups in registers (three digits' x is
 * read from L1 as memory operands instead: 2 rows side by side measured 15 % slower). */
#define Q8_C 64
#define Q8_R 4

static inline __attribute__((always_inline)) void
q8_rows_g(const struct cpu_q8_rows *x, int64_t m, int64_t K, const uint8_t *w, int64_t rowb,
          const float *s, const float *z, int64_t ng, const int R, float *y, const uint8_t *pf,
          const bool one_group, const int D, const bool l2)
{
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int8_t *xq = x->q + m * x->kp * D;
    const float *xd = x->d + m * (x->kp / 8);
    __m256 tot[Q8_R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        tot[r] = _mm256_setzero_ps();
    const int64_t nc = x->kp / Q8_C, full = K / Q8_C;
    for (int64_t c = 0; c < nc; c++) {
        __m256i xl[CPU_Q8_MAX_DIGITS], xh[CPU_Q8_MAX_DIGITS];
#pragma GCC unroll 3
        for (int t = 0; t < D; t++) {
            xl[t] = _mm256_load_si256((const __m256i *)(xq + (c * D + t) * Q8_C));
            xh[t] = _mm256_load_si256((const __m256i *)(xq + (c * D + t) * Q8_C + Q8_C / 2));
        }
        const __m256 dv = _mm256_load_ps(xd + c * 8);
        const __m256i gi = _mm256_load_si256((const __m256i *)(x->lg + c * 8));
        /* a chunk touches one or two groups: load only those scales */
        const __m256i sm = _mm256_setr_epi32(-1, x->ch[c].span > 1 ? -1 : 0, 0, 0, 0, 0, 0, 0);
        const int64_t g0 = x->ch[c].g0;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *wc = w + r * rowb + c * (Q8_C / 2);
            if (pf && (c & 1) == 0)
                cpu_prefetch_read(pf + r * rowb + c * (Q8_C / 2), l2);
            /* the last chunk may hold only one block (16 bytes): read no further */
            const __m256i b = c < full ? _mm256_loadu_si256((const __m256i *)wc)
                                       : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)wc));
            const __m256i lo = _mm256_and_si256(b, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            __m256i p16[CPU_Q8_MAX_DIGITS];
#pragma GCC unroll 3
            for (int t = 0; t < D; t++)
                p16[t] = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[t]),
                                          _mm256_maddubs_epi16(hi, xh[t]));
            __m256i is = _mm256_madd_epi16(p16[0], ones);
            if (D == 3) /* the middle digit's 256 rides in vpmaddwd's second operand */
                is = _mm256_add_epi32(
                    _mm256_add_epi32(_mm256_slli_epi32(is, 16),
                                     _mm256_madd_epi16(p16[1], _mm256_set1_epi16(256))),
                    _mm256_madd_epi16(p16[2], ones));
            const __m256 sv = one_group ? _mm256_set1_ps(s[r * ng + g0])
                                        : _mm256_permutevar8x32_ps(
                                              _mm256_maskload_ps(s + r * ng + g0, sm), gi);
            tot[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv, sv), tot[r]);
        }
    }
    float zc[Q8_R];
    cpu_q4_zero_shares(s, z, x->xsum + m * ng, ng, 1, R, zc);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        y[r] = hsum8(tot[r]) - zc[r];
}

/* One whole block of 32 values as cpu_q8_block rounds it, at 8 lanes as in
 * cpu_kern_avx512vnni.c: the rounding conversion, clamped to ±Q, split into D digits, then
 * two saturating packs per digit whose lane interleave one permutation undoes. Declines NaN,
 * ±inf and a tiny amax. */
static inline __attribute__((always_inline)) bool
q8_block(const float *x, int8_t *lo, int8_t *hi, float *amax_out, int32_t *sum, const int D)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    __m256 v[4], m = _mm256_setzero_ps();
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        const __m256 a = _mm256_and_ps(v[i], absm);
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* NaN or ±inf */
        m = _mm256_max_ps(m, a);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float amax = _mm_cvtss_f32(h);
    if (bad || !(amax >= CPU_Q8_MIN_SCALED))
        return false;
    const __m256 inv = _mm256_set1_ps((float)CPU_Q8_FULL(D) / amax);
    const __m256i qmax = _mm256_set1_epi32(CPU_Q8_FULL(D));
    const __m256i qmin = _mm256_set1_epi32(-CPU_Q8_FULL(D));
    __m256i qi[4], r[4];
    for (int i = 0; i < 4; i++) {
        qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
        qi[i] = r[i] = _mm256_max_epi32(_mm256_min_epi32(qi[i], qmax), qmin);
    }
#pragma GCC unroll 3
    for (int t = D - 1; t >= 0; t--) {
        __m256i dg[4];
        for (int i = 0; i < 4; i++) {
            /* c = ((r + 128) & 255) − 128, r = (r − c) / 256; the last digit is r itself */
            const __m256i c = _mm256_sub_epi32(
                _mm256_and_si256(_mm256_add_epi32(r[i], _mm256_set1_epi32(128)),
                                 _mm256_set1_epi32(255)),
                _mm256_set1_epi32(128));
            dg[i] = t ? c : r[i];
            r[i] = _mm256_srai_epi32(_mm256_sub_epi32(r[i], c), 8);
        }
        const __m256i p = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(dg[0], dg[1]), _mm256_packs_epi32(dg[2], dg[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm_storeu_si128((__m128i *)(lo + t * Q8_C), _mm256_castsi256_si128(p));
        _mm_storeu_si128((__m128i *)(hi + t * Q8_C), _mm256_extracti128_si256(p, 1));
    }
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
    *sum = _mm_cvtsi128_si32(t4);
    *amax_out = amax;
    return true;
}

#include "cpu_kern_q8_gemv.h"

const struct cpu_q4_q8 cpu_q4_q8_avx2 = {
    .unit = "avx2",
    .chunk = Q8_C,
    .digits = 1,
    .quant_row = q8_quant_row1,
    .gemv = q8_gemv1,
    .gemv_l2 = q8_gemv1_l2,
};

const struct cpu_q4_q8 cpu_q4_q8_avx2_3 = {
    .unit = "avx2",
    .chunk = Q8_C,
    .digits = 3,
    .quant_row = q8_quant_row3,
    .gemv = q8_gemv3,
    .gemv_l2 = q8_gemv3_l2,
};


/* ---- dot and axpy over a run of KV rows ------------------------------------------------- */

/* For one dtype of the rows, as in cpu_kern_avx512.c. */
/* An INT8 KV row's widened codes (I8 with `scaled`) times its scale, one rounded product
 * each; the other dtypes as loaded. */
static inline __attribute__((always_inline)) __m256 kv_scaled(__m256 v, const bool scaled,
                                                             __m256 sc)
{
    return scaled ? _mm256_mul_ps(v, sc) : v;
}

/* One row's dot product: lanes k mod 16 in two accumulators, then one fixed reduction. */
static inline __attribute__((always_inline)) float dot_dt(const float *a, const char *b,
                                                          const int dt, int64_t n,
                                                          const bool scaled, float scale)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k),
                             kv_scaled(wload8(b + k * es, dt), scaled, sc), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8),
                             kv_scaled(wload8(b + (k + 8) * es, dt), scaled, sc), s1);
    }
    for (; k < n; k += 8) {
        int64_t m = n - k < 8 ? n - k : 8;
        s0 = _mm256_fmadd_ps(loadf8(a + k, m), kv_scaled(load8(b + k * es, dt, m), scaled, sc),
                             s0);
    }
    return hsum8(_mm256_add_ps(s0, s1));
}

/* axpy_rows for one dtype: y[k] = fma(p[i], x_i[k], y[k]) for i in order, as one axpy per row
 * would compute it, with AXPY_COLS values of y in registers over all the rows. */
#define AXPY_COLS 64
static inline __attribute__((always_inline)) void
axpy_rows_dt(float *y, const float *p, const char *x, const int dt, int64_t ldx,
             const bool scaled, const float *scales, int64_t scale_step, int64_t rows, int64_t n)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    int64_t k = 0;
    for (; k + AXPY_COLS <= n; k += AXPY_COLS) {
        __m256 acc[AXPY_COLS / 8];
#pragma GCC unroll 8
        for (int u = 0; u < AXPY_COLS / 8; u++)
            acc[u] = _mm256_loadu_ps(y + k + 8 * u);
        for (int64_t i = 0; i < rows; i++) {
            const __m256 av = _mm256_set1_ps(p[i]);
            const __m256 sc = _mm256_set1_ps(scaled ? scales[i * scale_step] : 1.0f);
            const char *xr = x + i * ldx + k * es;
#pragma GCC unroll 8
            for (int u = 0; u < AXPY_COLS / 8; u++)
                acc[u] = _mm256_fmadd_ps(av, kv_scaled(wload8(xr + 8 * u * es, dt), scaled, sc),
                                         acc[u]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < AXPY_COLS / 8; u++)
            _mm256_storeu_ps(y + k + 8 * u, acc[u]);
    }
    for (; k < n; k += 8) {
        const int64_t m = n - k < 8 ? n - k : 8;
        __m256 acc = loadf8(y + k, m);
        for (int64_t i = 0; i < rows; i++) {
            const __m256 sc = _mm256_set1_ps(scaled ? scales[i * scale_step] : 1.0f);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[i]),
                                  kv_scaled(load8(x + i * ldx + k * es, dt, m), scaled, sc), acc);
        }
        storef8(y + k, acc, m);
    }
}

#include "cpu_kern_kv_rows.h"

static float scale_max(float *x, float s, int64_t n)
{
    __m256 sv = _mm256_set1_ps(s), m = _mm256_set1_ps(-__builtin_inff());
    for (int64_t k = 0; k < n; k += 8) {
        int64_t c = n - k < 8 ? n - k : 8;
        __m256 v = _mm256_mul_ps(loadf8(x + k, c), sv);
        storef8(x + k, v, c);
        if (c < 8) { /* lanes past the end must not win */
            float buf[8];
            _mm256_storeu_ps(buf, v);
            for (int64_t l = c; l < 8; l++)
                buf[l] = -__builtin_inff();
            v = _mm256_loadu_ps(buf);
        }
        m = _mm256_max_ps(v, m); /* NaN in v: m is kept */
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

static void scale_d(float *x, double a, int64_t n)
{
    __m256d av = _mm256_set1_pd(a);
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        __m256d v = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k)), av);
        _mm_storeu_ps(x + k, _mm256_cvtpd_ps(v));
    }
    for (; k < n; k++)
        x[k] = (float)(x[k] * a);
}

/* ---- exp and friends -------------------------------------------------------------------- */

static inline __m256 exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    __m256 v = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    v = _mm256_blendv_ps(v, _mm256_setzero_ps(), under);
    v = _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_inff()), over);
    return _mm256_blendv_ps(v, x, nan);
}

static double exp_sum(const float *x, float m, float *y, int64_t n)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    __m256 mv = _mm256_set1_ps(m);
    for (int64_t k = 0; k < n; k += 8) {
        int64_t c = n - k < 8 ? n - k : 8;
        __m256 e = exp8(_mm256_sub_ps(loadf8(x + k, c), mv));
        if (c < 8) { /* lanes past the end must add nothing */
            float buf[8] = { 0 };
            storef8(buf, e, c);
            e = _mm256_loadu_ps(buf);
        }
        storef8(y + k, e, c);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

static void x_sigmoid(const float *x, float a, const float *mul, float *dst, int64_t n)
{
    __m256 na = _mm256_set1_ps(-a), one = _mm256_set1_ps(1.0f);
    for (int64_t k = 0; k < n; k += 8) {
        int64_t c = n - k < 8 ? n - k : 8;
        __m256 xv = loadf8(x + k, c);
        __m256 v = _mm256_div_ps(xv, _mm256_add_ps(one, exp8(_mm256_mul_ps(na, xv))));
        if (mul)
            v = _mm256_mul_ps(v, loadf8(mul + k, c));
        storef8(dst + k, v, c);
    }
}

/* GELU through erfc, as in cpu_kern_avx512.c. */
static inline __m256 erfc_pos8(__m256 z)
{
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f),
                             _mm256_fmadd_ps(z, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
    __m256 p = _mm256_set1_ps(0.17087277f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
    return _mm256_mul_ps(t, exp8(_mm256_fnmadd_ps(z, z, p)));
}

static void gelu(const float *x, float *dst, int64_t n)
{
    const __m256 half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.0f);
    const __m256 rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t k = 0; k < n; k += 8) {
        int64_t c = n - k < 8 ? n - k : 8;
        __m256 xv = loadf8(x + k, c);
        __m256 e = erfc_pos8(_mm256_mul_ps(_mm256_and_ps(xv, absmask), rsqrt2));
        __m256 neg = _mm256_cmp_ps(xv, _mm256_setzero_ps(), _CMP_LT_OQ);
        __m256 f = _mm256_blendv_ps(_mm256_sub_ps(two, e), e, neg);
        storef8(dst + k, _mm256_mul_ps(_mm256_mul_ps(half, xv), f), c);
    }
}

const struct cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    .mr = MR,
    .nr = NR,
    .pack_w = pack_w,
    .pack_w_q4 = pack_w_q4,
    .pack_rows = pack_rows,
    .pack_x = pack_x,
    .micro = micro,
    .gemv = gemv,
    .gemv_regs = gemv_regs,
    .q4_gemv = q4_gemv,
    .scale_max = scale_max,
    .scale_d = scale_d,
    .dot_rows = dot_rows,
    .axpy_rows = axpy_rows,
    .exp_sum = exp_sum,
    .x_sigmoid = x_sigmoid,
    .gelu = gelu,
};
