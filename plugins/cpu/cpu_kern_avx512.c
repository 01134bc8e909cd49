/*
 * plugins/cpu/cpu_kern_avx512.c — the AVX-512 kernel table (F, BW, VL, DQ; compiled with
 * those -m flags plus AVX2/FMA/F16C, see CMakeLists.txt; entered only when cpu_isa.c found
 * them on this CPU).
 *
 * GEMM micro-kernel: MR = 14 rows of x × NR = 32 columns (two zmm of W columns), 28 zmm
 * accumulators; per k it loads the two W vectors of the packed micro-panel and broadcasts the
 * 14 x values of the packed x panel (folded into the FMAs). Every output is one FMA chain in k
 * order. W packing converts F16 (vcvtph2ps) or BF16 (shift) to f32 in registers and transposes
 * 16 × 16 blocks in registers (the usual unpack / shuffle_f32x4 network), so a W element costs
 * a fraction of an instruction to pack; each packed element then serves every x row.
 *
 * GEMV (M ≤ CPU_GEMV_MAX_M = 32): blocks of four W rows (eight when M = 1), 16 lanes along k,
 * one accumulator per (x row, W row). Up to four x rows take one pass over K that reads the W
 * rows from memory, converting F16/BF16/I8 in registers and prefetching the next block's rows
 * into L2. More x rows (a decode step over a batch) would convert every W vector once per
 * group of four, and on Intel cores the conversions take the FMA ports: there each block is
 * widened to f32 once per K chunk of 512 into an L1 buffer, and passes of up to six x rows (24
 * accumulators) run over it, the partial sums waiting in a stack buffer between chunks; the
 * next block is prefetched a few lines per k step over all of a chunk's passes. AMD cores
 * convert beside the FMAs, and there (device option gemv_widen, auto) the groups of up to
 * four rows each widen in registers, as one pass does, the block coming from L2 after the
 * first group (gemv_rows_regs). Lane l of an accumulator sums the terms k ≡ l (mod 16) in k
 * order (the K tail is read with a mask, so it lands in lanes 0…), then _mm512_reduce_add_ps
 * sums the lanes in its fixed tree order. Widening is exact and none of this depends on M or
 * on which x rows share a pass, so each row's result is bit-identical for every M ≤ 32 (the
 * contract of CPU_GEMV_MAX_M), either way of widening. The dtype is dispatched once per call
 * to one instantiation per dtype and way (cpu_kern_gemv.h); in the loops both are constants.
 *
 * Elementwise helpers: exp is the Cephes expf scheme (round x·log2 e to n, reduce with a
 * two-part ln 2, degree-6 polynomial, scale by 2^n with vscalefps, which also gives 0 for
 * −inf and +inf on overflow); measured within 1.25 ulp of the exact value over the normal
 * range. GELU goes through erfc (see gelu below): relative error below 1e-6 for |x| < 4 and
 * below 5e-6 everywhere (the f32 rounding of the exponent −z² sets that floor).
 * All loads and stores are unaligned-safe (loadu / masked), so views at any 4-byte offset work.
 */
#include <immintrin.h>
#include <math.h>

#include "cpu_internal.h"
#include "cpu_kern_avx512_transpose.h"

#define MR 14
#define NR 32

/* ---- loading a weight-dtype vector ------------------------------------------------------ */

/* 16 FP8 E4M3 codes as f32, exactly as mmrt_f8e4m3_to_f32 (plugin.h): a normal code's 7
 * magnitude bits moved to f32 bits 20…26 with 120 added to the exponent, a subnormal one as
 * mantissa · 2^-9 (an exact product, never an f32 subnormal), 0x7F the NaN, then the sign. */
static inline __attribute__((always_inline)) __m512 f8x16(__m128i codes)
{
    const __m512i v = _mm512_cvtepu8_epi32(codes);
    const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7F));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
    __m512 r = _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
    r = _mm512_mask_blend_ps(_mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8)), r,
                             _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1.0p-9f)));
    r = _mm512_mask_blend_ps(_mm512_cmpeq_epu32_mask(mag, _mm512_set1_epi32(0x7F)), r,
                             _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
}

/* 16 elements (mask m) of a F32, F16, BF16, I8 or F8E4M3 array starting at p, as f32. */
static inline __attribute__((always_inline)) __m512 load16(const void *p, int dt, __mmask16 m)
{
    switch (dt) {
    case MMRT_DTYPE_F8E4M3: /* a KV page's codes */
        return f8x16(_mm_maskz_loadu_epi8(m, p));
    case MMRT_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    case MMRT_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
    case MMRT_DTYPE_I8: /* a quantized weight's codes; its scale is applied to the sums */
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
    default:
        return _mm512_maskz_loadu_ps(m, p);
    }
}

static inline __mmask16 tail_mask(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* ---- W packing: convert + transpose ----------------------------------------------------- */

static void pack_w(const void *w, int dtype, int64_t ldw, int64_t cols, int64_t kc, float *dst)
{
    const size_t es = mmrt_dtype_size((enum mmrt_dtype)dtype);
    for (int jb = 0; jb < NR; jb += 16) {
        int64_t rows = cols - jb < 0 ? 0 : cols - jb > 16 ? 16 : cols - jb;
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
            int64_t kl = kc - k0 < 16 ? kc - k0 : 16;
            __mmask16 m = tail_mask(kl);
            __m512 r[16];
            for (int t = 0; t < 16; t++)
                r[t] = t < rows ? load16((const char *)w + ((jb + t) * ldw + k0) * (int64_t)es,
                                         dtype, m)
                                : _mm512_setzero_ps();
            transpose16(r);
            for (int t = 0; t < kl; t++)
                _mm512_storeu_ps(dst + (k0 + t) * NR + jb, r[t]);
        }
    }
}

static void pack_rows(const void *w, int dtype, int64_t ldw, int64_t rows, int64_t cols,
                      float *dst)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dtype);
    __mmask16 m0 = tail_mask(cols), m1 = tail_mask(cols > 16 ? cols - 16 : 0);
    for (int64_t k = 0; k < rows; k++) {
        const char *src = (const char *)w + k * ldw * es;
        _mm512_storeu_ps(dst + k * NR, load16(src, dtype, m0));
        _mm512_storeu_ps(dst + k * NR + 16, load16(src + 16 * es, dtype, m1));
    }
}

static void pack_x(const float *x, int64_t ldx, int64_t rows, int64_t kc, float *dst)
{
    const __mmask16 out = (__mmask16)((1u << MR) - 1u);
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        int64_t kl = kc - k0 < 16 ? kc - k0 : 16;
        __mmask16 m = tail_mask(kl);
        __m512 r[16];
        for (int t = 0; t < 16; t++)
            r[t] = t < rows && t < MR ? _mm512_maskz_loadu_ps(m, x + t * ldx + k0)
                                      : _mm512_setzero_ps();
        transpose16(r);
        for (int t = 0; t < kl; t++)
            _mm512_mask_storeu_ps(dst + (k0 + t) * MR, out, r[t]);
    }
}

/* ---- the micro-kernel -------------------------------------------------------------------- */

#define REP14(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13)
#define DECL(i) __m512 a##i##0, a##i##1;
#define ZERO(i) a##i##0 = _mm512_setzero_ps(); a##i##1 = _mm512_setzero_ps();
#define LOADC(i)                                                                               \
    a##i##0 = _mm512_loadu_ps(c + (i) * ldc);                                                  \
    a##i##1 = _mm512_loadu_ps(c + (i) * ldc + 16);
#define STEP(i)                                                                                \
    {                                                                                          \
        __m512 xb = _mm512_set1_ps(xp[i]);                                                     \
        a##i##0 = _mm512_fmadd_ps(xb, w0, a##i##0);                                            \
        a##i##1 = _mm512_fmadd_ps(xb, w1, a##i##1);                                            \
    }
#define STOREC(i)                                                                              \
    _mm512_storeu_ps(c + (i) * ldc, a##i##0);                                                  \
    _mm512_storeu_ps(c + (i) * ldc + 16, a##i##1);

static void micro(const float *xp, const float *wp, int64_t ldw, int64_t kc, float *c,
                  int64_t ldc, int accumulate)
{
    REP14(DECL)
    if (accumulate) {
        REP14(LOADC)
    } else {
        REP14(ZERO)
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_loadu_ps(wp), w1 = _mm512_loadu_ps(wp + 16);
        REP14(STEP)
        xp += MR;
        wp += ldw;
    }
    REP14(STOREC)
}

/* ---- GEMV -------------------------------------------------------------------------------- */

/* See the file comment. GV_R W rows per block (8 for M = 1), up to GV_G x rows in the one
 * pass over K; more x rows take the widened path below. */
#define GV_R 4
#define GV_G 4

/* One pass: acc[g][r] over all K for G x rows and R W rows (G, R, dt constant after
 * inlining, so the accumulators are registers and the conversion is resolved at compile
 * time), reduced into y. pf, when not NULL, is the next W block: its rows are prefetched
 * into L2 while this block streams, so twice as many rows have misses in flight
 * (1 × 4096 × 11008 F16, one thread, alternating builds on the shared machine: 4.2–4.8 ms per
 * call with it, 6.3 without). */
static inline __attribute__((always_inline)) void
gemv_pass(const float *x, int64_t ldx, const char *w, const int dt, int64_t rowb, const int R,
          const int G, int64_t K, float *y, int64_t ldy, const char *pf)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    __m512 acc[GV_G][8];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[g][r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (pf) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                _mm_prefetch(pf + r * rowb + k * es, _MM_HINT_T1);
        }
        __m512 xv[GV_G];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            xv[g] = _mm512_loadu_ps(x + g * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = load16(w + r * rowb + k * es, dt, 0xffff);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm512_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
    if (k < K) { /* the tail lands in lanes 0…, the rest of each lane adds 0 · 0 */
        __mmask16 mk = tail_mask(K - k);
        __m512 xv[GV_G];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            xv[g] = _mm512_maskz_loadu_ps(mk, x + g * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = load16(w + r * rowb + k * es, dt, mk);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm512_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            y[g * ldy + r] = _mm512_reduce_add_ps(acc[g][r]);
}

/* ---- GEMV over more x rows than one pass takes (M > GV_G) --------------------------------
 *
 * Re-running the 4 × 4 pass over every group of four x rows converts each F16/BF16/I8 W vector
 * once per group: vcvtph2ps is two uops on the ports the FMAs use, so at M = 16 a quarter of
 * those ports went to conversions and the kernel reached about half of the FMA peak. Here each
 * block of GW_R W rows is widened to f32 once per K chunk into a buffer that stays in L1, and
 * passes of up to GW_G x rows (GW_G · GW_R = 24 accumulators, 6 x vectors and one W vector:
 * 31 zmm) read it from there, so the ports do FMAs only. The widening is exact and every
 * accumulator still sums lane l = k mod 16 in k order (chunks are multiples of 16), so the
 * results are the bits of the single-pass path above, whatever M or the grouping. */
#define GW_R 4
#define GW_G 6
#define GW_KC 512

/* buf[r · GW_KC + (k − k0)] = W[r, k] as f32 for k in [k0, k1); the last vector of a chunk
 * that ends inside one is zero-filled, as the masked loads of gemv_pass give. */
static inline __attribute__((always_inline)) void
gemv_widen(const char *w, const int dt, int64_t rowb, const int R, int64_t k0, int64_t k1,
           float *buf)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const char *wr = w + r * rowb;
        float *br = buf + r * GW_KC - k0;
        int64_t k = k0;
        for (; k + 16 <= k1; k += 16)
            _mm512_storeu_ps(br + k, load16(wr + k * es, dt, 0xffff));
        if (k < k1)
            _mm512_storeu_ps(br + k, load16(wr + k * es, dt, tail_mask(k1 - k)));
    }
}

/* One pass of G x rows over a widened chunk of n columns (x already offset to the chunk).
 * pf, when not NULL, is the next W block at this chunk: its lines are prefetched into L2
 * while this pass computes, so the next block's widening reads from L2. */
static inline __attribute__((always_inline)) void
gemv_wide_pass(const float *x, int64_t ldx, const float *buf, const int R, const int G,
               int64_t n, int first, int last, __m512 *save, float *y, int64_t ldy,
               struct cpu_gemv_prefetch *pf)
{
    __m512 acc[GW_G][GW_R];
#pragma GCC unroll 6
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[g][r] = first ? _mm512_setzero_ps() : save[g * GW_R + r];
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        if (pf->base)
            cpu_gemv_prefetch_step(pf, R);
        __m512 xv[GW_G];
#pragma GCC unroll 6
        for (int g = 0; g < G; g++)
            xv[g] = _mm512_loadu_ps(x + g * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_loadu_ps(buf + r * GW_KC + k);
#pragma GCC unroll 6
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm512_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
    if (k < n) {
        __mmask16 mk = tail_mask(n - k);
        __m512 xv[GW_G];
#pragma GCC unroll 6
        for (int g = 0; g < G; g++)
            xv[g] = _mm512_maskz_loadu_ps(mk, x + g * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_loadu_ps(buf + r * GW_KC + k);
#pragma GCC unroll 6
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm512_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
#pragma GCC unroll 6
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            if (last)
                y[g * ldy + r] = _mm512_reduce_add_ps(acc[g][r]);
            else
                save[g * GW_R + r] = acc[g][r];
        }
}

/* One block of R ≤ GW_R W rows against M > GV_G x rows, chunk by chunk. The x rows are split
 * into passes of near-equal size (16 rows: 6 + 5 + 5, not 6 + 6 + 4) so no pass is left with
 * a row or two. F32 W is read in place: there is nothing to widen. */
static inline __attribute__((always_inline)) void
gemv_rows_wide(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
               int64_t rowb, const int R, float *y, int64_t ldy, const char *pf)
{
    __m512 save[CPU_GEMV_MAX_M * GW_R];
    float buf[GW_R * GW_KC] __attribute__((aligned(64)));
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    const int64_t passes = (M + GW_G - 1) / GW_G;
    for (int64_t k0 = 0; k0 < K; k0 += GW_KC) {
        const int64_t k1 = K - k0 < GW_KC ? K : k0 + GW_KC;
        const int first = k0 == 0, last = k1 == K;
        gemv_widen(w, dt, rowb, R, k0, k1, buf);
        struct cpu_gemv_prefetch pfc = {
            .base = pf ? pf + k0 * es : NULL, .rowb = rowb,
            .total = R * (((k1 - k0) * es + 63) / 64), .steps = passes * ((k1 - k0) / 16),
        };
        for (int64_t p = 0, m0 = 0; p < passes; p++) {
            const int64_t g = (M - m0) / (passes - p) + ((M - m0) % (passes - p) != 0);
            const float *xg = x + m0 * ldx + k0;
            float *yg = y + m0 * ldy;
            __m512 *sg = save + m0 * GW_R;
#define GW_PASS(G)                                                                              \
    gemv_wide_pass(xg, ldx, buf, R, G, k1 - k0, first, last, sg, yg, ldy, &pfc)
            switch (g) {
            case 1: GW_PASS(1); break;
            case 2: GW_PASS(2); break;
            case 3: GW_PASS(3); break;
            case 4: GW_PASS(4); break;
            case 5: GW_PASS(5); break;
            default: GW_PASS(6); break;
            }
#undef GW_PASS
            m0 += g;
        }
    }
}

/* One block of R W rows against M ≤ GV_G x rows in one pass over K, reading W from memory
 * (no chunks, nothing saved). */
static inline __attribute__((always_inline)) void
gemv_rows_one(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
              int64_t rowb, const int R, float *y, int64_t ldy, const char *pf)
{
#define GV_PASS(G) gemv_pass(x, ldx, w, dt, rowb, R, G, K, y, ldy, pf)
    switch (M) {
    case 1: GV_PASS(1); break;
    case 2: GV_PASS(2); break;
    case 3: GV_PASS(3); break;
    default: GV_PASS(4); break;
    }
#undef GV_PASS
}

/* One block of R W rows against M > GV_G x rows without the buffer (device option
 * gemv_widen = registers): passes of near-equal size, at most GV_G rows each, every pass
 * widening the W vectors it reads in registers. The first pass streams the block from memory
 * and prefetches the next one; the later ones find the block in L2. On cores where
 * vcvtph2ps issues beside the FMAs (Zen 4: 12 FMAs and 3 conversions a step take the time of
 * the 12 FMAs) this beats the buffer, whose stores and reloads cost more than the
 * conversions they save. */
static inline __attribute__((always_inline)) void
gemv_rows_regs(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
               int64_t rowb, const int R, float *y, int64_t ldy, const char *pf)
{
    const int64_t passes = (M + GV_G - 1) / GV_G;
    for (int64_t p = 0, m0 = 0; p < passes; p++) {
        const int64_t g = (M - m0) / (passes - p) + ((M - m0) % (passes - p) != 0);
        gemv_rows_one(x + m0 * ldx, ldx, g, K, w, dt, rowb, R, y + m0 * ldy, ldy,
                      p == 0 ? pf : NULL);
        m0 += g;
    }
}

/* One block of R W rows against all M x rows. regs: gemv_widen = registers, for the dtypes
 * that have something to widen. */
static inline __attribute__((always_inline)) void
gemv_rows(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
          int64_t rowb, const int R, float *y, int64_t ldy, const char *pf, const bool regs)
{
    if (M <= GV_G)
        gemv_rows_one(x, ldx, M, K, w, dt, rowb, R, y, ldy, pf);
    else if (regs && dt != MMRT_DTYPE_F32)
        gemv_rows_regs(x, ldx, M, K, w, dt, rowb, R, y, ldy, pf);
    else
        gemv_rows_wide(x, ldx, M, K, w, dt, rowb, R, y, ldy, pf);
}

/* W rows [0, n) of w for one dtype. */
static inline __attribute__((always_inline)) void
gemv_dt(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w, const int dt,
        int64_t rowb, int64_t n, float *y, int64_t ldy, const bool regs)
{
    int64_t j = 0;
    /* One x row (decode): 8 W rows per pass. Measured 22-26 GB/s against 16-18 GB/s with 4
     * (plugin MATMUL 1 x 4096 x 11008 F16, 2 threads, interleaved A/B runs): more
     * independent streams keep more misses in flight. 12 rows was no better. */
    for (; M == 1 && j + 8 <= n; j += 8)
        gemv_pass(x, ldx, w + j * rowb, dt, rowb, 8, 1, K, y + j, ldy,
                  j + 16 <= n ? w + (j + 8) * rowb : NULL);
    /* Blocks of the widened path's GW_R rows; gemv_rows decides buffer or registers. */
    for (; M > GV_G && j + GW_R <= n; j += GW_R)
        gemv_rows(x, ldx, M, K, w + j * rowb, dt, rowb, GW_R, y + j, ldy,
                  j + 2 * GW_R <= n ? w + (j + GW_R) * rowb : NULL, regs);
    for (; j + GV_R <= n; j += GV_R)
        gemv_rows(x, ldx, M, K, w + j * rowb, dt, rowb, GV_R, y + j, ldy,
                  j + 2 * GV_R <= n ? w + (j + GV_R) * rowb : NULL, regs);
    for (; j < n; j++)
        gemv_rows(x, ldx, M, K, w + j * rowb, dt, rowb, 1, y + j, ldy, NULL, regs);
}

#include "cpu_kern_gemv.h"

/* ---- U4 GEMV ------------------------------------------------------------------------------ */

/* The U4 row sum (struct cpu_kernels.q4_gemv), for one W row and one x row: per group, each
 * 16 bytes give 32 codes (low nibbles = codes j…j+15 of the block, high = j+16…j+31), exactly
 * widened to f32; one chain over the group in k order, an FMA for the low and one for the
 * high codes of each 32; the group's sum times its scale into a running vector; at the end
 * its lanes summed and the zero points' share (cpu_q4_zero_shares, scalar, in group order)
 * subtracted. The order depends on K and the group size alone. Both paths below compute
 * exactly this for every pair, so a row's result never depends on the batch. */

/* pack_w for U4 rows (struct cpu_kernels.pack_w_q4): the GEMM's W micro-panel straight from
 * the codes, each weight (code − zero)·scale as cpu_q4_dequant computes it (the same two
 * roundings), so the blocked U4 product neither writes nor reads a dequantized copy of W. A
 * run of 16 codes at k (a multiple of 16) is the low (k mod 32 < 16) or the high nibbles of
 * the 16 bytes at (k − k mod 32) / 2, all in one group (gs is a multiple of 32). */
static void pack_w_q4(const uint8_t *w, int64_t ldb, const float *scale, const float *zero,
                      int64_t ng, int64_t gs, int64_t k0, int64_t cols, int64_t kc, float *dst)
{
    const __m512i m4 = _mm512_set1_epi32(15);
    for (int jb = 0; jb < NR; jb += 16) {
        int64_t rows = cols - jb < 0 ? 0 : cols - jb > 16 ? 16 : cols - jb;
        for (int64_t kk = 0; kk < kc; kk += 16) {
            const int64_t k = k0 + kk, g = k / gs;
            __m512 r[16];
            for (int t = 0; t < 16; t++) {
                if (t >= rows) {
                    r[t] = _mm512_setzero_ps();
                    continue;
                }
                const uint8_t *b = w + (jb + t) * ldb + (k - (k & 31)) / 2;
                __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
                c = (k & 16) ? _mm512_srli_epi32(c, 4) : _mm512_and_si512(c, m4);
                const int64_t i = (jb + t) * ng + g;
                r[t] = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(c),
                                                   _mm512_set1_ps(zero[i])),
                                     _mm512_set1_ps(scale[i]));
            }
            transpose16(r);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_ps(dst + (kk + t) * NR + jb, r[t]);
        }
    }
}

/* ---- U4 GEMV over several x rows ---------------------------------------------------------- */

/* More than one x row: converting every W row's codes once per x row made 16 rows cost 11–14 ×
 * one. Instead each block of Q4_R W rows is widened once per chunk of Q4_KC codes, to the
 * codes themselves as f32 (exact), into an L1 buffer in k order, and passes of up to Q4_G x
 * rows run the row sum over it: 16 chains in registers with 8 x and 2 W vectors; the running
 * sums stay in memory (one update a group). */
#define Q4_R 4
#define Q4_G 4
#define Q4_KC 512
#define Q4_R1 8 /* W rows side by side for one x row */

/* buf[r · Q4_KC + (k − k0)] = code k of W row r as f32, for k in [k0, k1); the same chunk of
 * the next block (pf, or NULL) is prefetched meanwhile. */
static inline __attribute__((always_inline)) void
q4_widen(const uint8_t *w, int64_t rowb, const int R, int64_t k0, int64_t k1, float *buf,
         const uint8_t *pf)
{
    const __m512i m4 = _mm512_set1_epi32(15);
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + r * rowb;
        float *br = buf + r * Q4_KC - k0;
        for (int64_t k = k0; pf && k < k1; k += 128)
            _mm_prefetch((const char *)pf + r * rowb + k / 2, _MM_HINT_T0);
        for (int64_t k = k0; k < k1; k += 32) {
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr + k / 2)));
            _mm512_store_ps(br + k, _mm512_cvtepi32_ps(_mm512_and_si512(b, m4)));
            _mm512_store_ps(br + k + 16, _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)));
        }
    }
}

/* R W rows (widened in buf) × G x rows over codes [k0, k1) of one chunk; per pair, save
 * holds the group's chain and the running sum between chunks (zeroed by the first). */
static inline __attribute__((always_inline)) void
q4_wide_pass(const float *x, int64_t ldx, const float *buf, const int R, const int G,
             int64_t k0, int64_t k1, int64_t gs, const float *s, int64_t ng, __m512 *save,
             int first)
{
    __m512 acc[Q4_G][Q4_R];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 *sv = save + (g * Q4_R + r) * 2;
            if (first)
                sv[1] = _mm512_setzero_ps();
            acc[g][r] = first ? _mm512_setzero_ps() : sv[0];
        }
    /* The group and where it ends advance by addition: a division per group cost as much
     * as the group's products. */
    int64_t gi = k0 / gs, ge = (gi + 1) * gs;
    for (int64_t k = k0; k < k1;) {
        const int64_t e = ge < k1 ? ge : k1;
        for (; k < e; k += 32) {
            __m512 xl[Q4_G], xh[Q4_G];
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                xl[g] = _mm512_loadu_ps(x + g * ldx + k);
                xh[g] = _mm512_loadu_ps(x + g * ldx + k + 16);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 wl = _mm512_load_ps(buf + r * Q4_KC + (k - k0));
                __m512 wh = _mm512_load_ps(buf + r * Q4_KC + (k - k0) + 16);
                /* in registers: GCC otherwise folds them into every FMA, a load each */
                __asm__("" : "+v"(wl), "+v"(wh));
#pragma GCC unroll 4
                for (int g = 0; g < G; g++)
                    acc[g][r] = _mm512_fmadd_ps(wh, xh[g], _mm512_fmadd_ps(wl, xl[g], acc[g][r]));
            }
        }
        if (k == ge) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512 sv = _mm512_set1_ps(s[r * ng + gi]);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++) {
                    __m512 *tot = save + (g * Q4_R + r) * 2 + 1;
                    *tot = _mm512_fmadd_ps(acc[g][r], sv, *tot);
                    acc[g][r] = _mm512_setzero_ps();
                }
            }
            gi++;
            ge += gs;
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            save[(g * Q4_R + r) * 2] = acc[g][r];
}

/* One block of R W rows against all M x rows, chunk by chunk. */
static inline __attribute__((always_inline)) void
q4_rows_wide(const float *x, int64_t ldx, int64_t M, int64_t K, const uint8_t *w,
             const float *s, const float *z, const float *xs, int64_t ng, const int R,
             float *y, int64_t ldy, const uint8_t *pf)
{
    __m512 save[CPU_GEMV_MAX_M * Q4_R * 2];
    float buf[Q4_R * Q4_KC] __attribute__((aligned(64)));
    const int64_t rowb = K / 2, gs = K / ng;
    for (int64_t k0 = 0; k0 < K; k0 += Q4_KC) {
        const int64_t k1 = K - k0 < Q4_KC ? K : k0 + Q4_KC;
        q4_widen(w, rowb, R, k0, k1, buf, pf);
        for (int64_t m = 0; m < M; m += Q4_G) {
            __m512 *sg = save + m * Q4_R * 2;
#define Q4_PASS(G) q4_wide_pass(x + m * ldx, ldx, buf, R, G, k0, k1, gs, s, ng, sg, k0 == 0)
            switch (M - m) {
            case 1: Q4_PASS(1); break;
            case 2: Q4_PASS(2); break;
            case 3: Q4_PASS(3); break;
            default: Q4_PASS(4); break;
            }
#undef Q4_PASS
        }
    }
    float zc[CPU_GEMV_MAX_M * Q4_R];
    cpu_q4_zero_shares(s, z, xs, ng, M, R, zc);
    for (int64_t m = 0; m < M; m++)
        for (int r = 0; r < R; r++)
            y[m * ldy + r] = _mm512_reduce_add_ps(save[(m * Q4_R + r) * 2 + 1]) - zc[m * R + r];
}

/* One x row (decode) against R W rows at once, the codes widened in registers: the rows' code
 * streams read side by side, each prefetching its place in the next block of R rows (pf, or
 * NULL at the last block). One row at a time, prefetching 1–8 KiB ahead, read 15–17 GB/s;
 * eight side by side, 20–22 (docs/BENCHMARKS.md, "The INT4 GEMV"). A code becomes its float
 * by a 16-entry table lookup (vpermps reads only the index's low 4 bits, so the low nibble
 * needs no mask), on the shuffle port instead of the conversion's: 11 % faster than mask and
 * convert — the same values, so the same bits. */
static inline __attribute__((always_inline)) void
q4_rows_one(const float *x, const uint8_t *w, int64_t rowb, const float *s, const float *z,
            const float *xs, int64_t ng, int64_t gs, const int R, float *y, const uint8_t *pf)
{
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 tot[Q4_R1];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        tot[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512 acc[Q4_R1];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_setzero_ps();
            for (int64_t k = g * gs; pf && k < (g + 1) * gs; k += 128)
                _mm_prefetch((const char *)pf + r * rowb + k / 2, _MM_HINT_T0);
        }
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
            const __m512 xl = _mm512_loadu_ps(x + k), xh = _mm512_loadu_ps(x + k + 16);
            const uint8_t *lo = w + k / 2, *hi = lo + 4 * rowb;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512i b = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)((r < 4 ? lo : hi) + (r & 3) * rowb)));
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(b, lut), xl, acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut), xh,
                                         acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            tot[r] = _mm512_fmadd_ps(acc[r], _mm512_set1_ps(s[r * ng + g]), tot[r]);
    }
    float zc[Q4_R1];
    cpu_q4_zero_shares(s, z, xs, ng, 1, R, zc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        y[r] = _mm512_reduce_add_ps(tot[r]) - zc[r];
}

#include "cpu_kern_q4_gemv.h"


/* ---- dot and axpy over a run of KV rows ---------------------------------------------------- */

/* The dtype of the rows is a constant after inlining. For F32 these are the loads of an f32
 * row; for F16, BF16 and FP8 the same lanes get the exactly widened values. */
/* 16 elements of a row as the dot and axpy take them: an INT8 KV row's codes (I8 with `scaled`)
 * times its scale, one rounded product each, the other dtypes as load16 widens them. */
static inline __attribute__((always_inline)) __m512 kv16(const char *b, const int dt,
                                                        __mmask16 m, const bool scaled,
                                                        __m512 sc)
{
    const __m512 v = load16(b, dt, m);
    return scaled ? _mm512_mul_ps(v, sc) : v;
}

/* One row's dot product: lanes k mod 32 in two accumulators, then one fixed reduction. */
static inline __attribute__((always_inline)) float dot_dt(const float *a, const char *b,
                                                          const int dt, int64_t n,
                                                          const bool scaled, float scale)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), kv16(b + k * es, dt, 0xffff, scaled, sc),
                             s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16),
                             kv16(b + (k + 16) * es, dt, 0xffff, scaled, sc), s1);
    }
    for (; k < n; k += 16) {
        __mmask16 m = tail_mask(n - k);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), kv16(b + k * es, dt, m, scaled, sc),
                             s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* axpy_rows for one dtype: y[k] = fma(p[i], x_i[k], y[k]) for i in order, as one axpy call per
 * row would compute it, but with AXPY_COLS values of y held in registers over all the rows
 * rather than loaded and stored once per row. */
#define AXPY_COLS 128
static inline __attribute__((always_inline)) void
axpy_rows_dt(float *y, const float *p, const char *x, const int dt, int64_t ldx,
             const bool scaled, const float *scales, int64_t scale_step, int64_t rows, int64_t n)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dt);
    int64_t k = 0;
    for (; k + AXPY_COLS <= n; k += AXPY_COLS) {
        __m512 acc[AXPY_COLS / 16];
#pragma GCC unroll 8
        for (int u = 0; u < AXPY_COLS / 16; u++)
            acc[u] = _mm512_loadu_ps(y + k + 16 * u);
        for (int64_t i = 0; i < rows; i++) {
            const __m512 av = _mm512_set1_ps(p[i]);
            const __m512 sc = _mm512_set1_ps(scaled ? scales[i * scale_step] : 1.0f);
            const char *xr = x + i * ldx + k * es;
#pragma GCC unroll 8
            for (int u = 0; u < AXPY_COLS / 16; u++)
                acc[u] = _mm512_fmadd_ps(av, kv16(xr + 16 * u * es, dt, 0xffff, scaled, sc),
                                         acc[u]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < AXPY_COLS / 16; u++)
            _mm512_storeu_ps(y + k + 16 * u, acc[u]);
    }
    for (; k < n; k += 16) {
        const __mmask16 m = tail_mask(n - k);
        __m512 acc = _mm512_maskz_loadu_ps(m, y + k);
        for (int64_t i = 0; i < rows; i++) {
            const __m512 sc = _mm512_set1_ps(scaled ? scales[i * scale_step] : 1.0f);
            acc = _mm512_fmadd_ps(_mm512_set1_ps(p[i]),
                                  kv16(x + i * ldx + k * es, dt, m, scaled, sc), acc);
        }
        _mm512_mask_storeu_ps(y + k, m, acc);
    }
}

#include "cpu_kern_kv_rows.h"

static float scale_max(float *x, float s, int64_t n)
{
    __m512 sv = _mm512_set1_ps(s), m = _mm512_set1_ps(-INFINITY);
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 mk = tail_mask(n - k);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + k), sv);
        _mm512_mask_storeu_ps(x + k, mk, v);
        /* max returns its second operand when one is NaN: a NaN never replaces m. */
        m = _mm512_mask_max_ps(m, mk, v, m);
    }
    return _mm512_reduce_max_ps(m);
}

static void scale_d(float *x, double a, int64_t n)
{
    __m512d av = _mm512_set1_pd(a);
    for (int64_t k = 0; k < n; k += 8) {
        __mmask8 mk = (__mmask8)(n - k >= 8 ? 0xff : (1u << (n - k)) - 1u);
        __m256 v = _mm256_maskz_loadu_ps(mk, x + k);
        _mm256_mask_storeu_ps(x + k, mk, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(v), av)));
    }
}

/* ---- exp and friends ----------------------------------------------------------------------- */

/* e^x for 16 lanes: NaN stays NaN, −inf and x < −110 give exactly 0, x > 89 gives +inf. */
static inline __m512 exp16(__m512 x)
{
    /* min/max return their second operand when one is NaN, so x (NaN) survives both. */
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static double exp_sum(const float *x, float m, float *y, int64_t n)
{
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    __m512 mv = _mm512_set1_ps(m);
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 mk = tail_mask(n - k);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + k), mv));
        e = _mm512_maskz_mov_ps(mk, e);
        _mm512_mask_storeu_ps(y + k, mk, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

static void x_sigmoid(const float *x, float a, const float *mul, float *dst, int64_t n)
{
    __m512 na = _mm512_set1_ps(-a), one = _mm512_set1_ps(1.0f);
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 mk = tail_mask(n - k);
        __m512 xv = _mm512_maskz_loadu_ps(mk, x + k);
        __m512 v = _mm512_div_ps(xv, _mm512_add_ps(one, exp16(_mm512_mul_ps(na, xv))));
        if (mul)
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mk, mul + k));
        _mm512_mask_storeu_ps(dst + k, mk, v);
    }
}

/* GELU through erfc (Numerical Recipes' erfcc, fractional error < 1.2e-7 everywhere):
 * with z = |x|/√2, t = 1/(1 + z/2) and e = t·exp(−z² + P(t)) = erfc(z),
 * GELU(x) = 0.5·x·(2 − e) for x ≥ 0 and 0.5·x·e for x < 0 — the second form also avoids the
 * cancellation of 1 + erf(x/√2) for negative x. */
static inline __m512 erfc_pos16(__m512 z)
{
    __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f),
                             _mm512_fmadd_ps(z, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(0.17087277f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
    return _mm512_mul_ps(t, exp16(_mm512_fnmadd_ps(z, z, p)));
}

static void gelu(const float *x, float *dst, int64_t n)
{
    const __m512 half = _mm512_set1_ps(0.5f), two = _mm512_set1_ps(2.0f);
    const __m512 rsqrt2 = _mm512_set1_ps(0.70710678118654752f);
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 mk = tail_mask(n - k);
        __m512 xv = _mm512_maskz_loadu_ps(mk, x + k);
        __m512 e = erfc_pos16(_mm512_mul_ps(_mm512_abs_ps(xv), rsqrt2));
        __mmask16 neg = _mm512_cmp_ps_mask(xv, _mm512_setzero_ps(), _CMP_LT_OQ);
        __m512 f = _mm512_mask_blend_ps(neg, _mm512_sub_ps(two, e), e);
        _mm512_mask_storeu_ps(dst + k, mk, _mm512_mul_ps(_mm512_mul_ps(half, xv), f));
    }
}

const struct cpu_kernels cpu_kernels_avx512 = {
    .name = "avx512",
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
