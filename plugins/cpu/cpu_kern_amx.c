/*
 * plugins/cpu/cpu_kern_amx.c — the bf16 dot-product GEMM on AMX-BF16 tiles (Sapphire Rapids
 * and later), chosen by the device option bf16_dot = 1 (or amx) on a CPU whose kernel lets
 * this process use the tile state (cpu_isa.c asks Linux for it). Same contract as the
 * AVX512_BF16 unit of cpu_kern_avx512bf16.c (cpu_internal.h, struct cpu_bf16_gemm): BF16
 * weights exact, activations rounded to bf16, products exact, f32 sums carried in k order, so
 * the blocked GEMM's loops (cpu_ops_matmul.c) drive both units and results do not depend on
 * threads or M.
 *
 * What one TDPBF16PS does inside is not what the instruction set reference's pseudo-code says
 * (each product added to the f32 sum in turn). Probed on Sapphire Rapids (2026-12-07), the 32
 * products of one row and column are summed among themselves, aligned to the largest and with
 * the low bits of the others cut, and that sum is then added to the tile's value with one
 * rounding: a sum of 1 with 32 products of 2^-25 is exactly 1 + 2^-20 (in turn it stays 1),
 * while products 1, 2^-24 and 2^-24 onto 0 give 1, not 1 + 2^-23. The emulated twin follows
 * the pseudo-code, so it checks the packing and the tile walk exactly; test_cpu_isa holds real
 * tiles to it within 1e-5 of the largest output.
 *
 * Why tiles: TDPBF16PS multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16 f32 sums,
 * 16 384 flop per instruction, several times what the vector FMA ports do on the same core. A
 * micro-tile is MR = 32 × NR = 32 outputs in four C tiles (tmm0–3); each step over 16 pairs
 * of k loads two A tiles (tmm4–5: x rows 0–15 and 16–31) and two B tiles (tmm6–7: W columns
 * 0–15 and 16–31) and issues four products, so every loaded tile is used twice.
 *
 * Layouts: x as [MR][kp] pairs (the A tile's rows are x rows; pack_x), W as [kp][NR] pairs
 * (the B tile's rows are pairs of k, the VNNI layout the AVX512_BF16 unit packs already;
 * cpu_pack_w_bf16_avx512). kp is a multiple of 16 (kalign): pack_x and pack_w write zero
 * pairs past the data, and x rows past M are zero, so every tile is whole and no edge case
 * reaches the kernel.
 *
 * Built two ways. Normally with -mamx-tile -mamx-bf16, the tile operations being the
 * compiler's intrinsics. With CPU_AMX_EMULATE (the test-only plugin mmrt_cpu_amxemu), the same
 * code runs on tiles held in memory, each operation in plain C as the instruction set
 * reference describes it (TDPBF16PS: bf16 inputs with denormals read as zero, each pair's two
 * products added in turn to the f32 sum, results flushed to zero when subnormal), so a machine
 * without AMX tests the packing, the tile walk and the blocked loops around them.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

#define MR 32
#define NR 32
#define KP_STEP 16 /* pairs of k per tile step: 64-byte tile rows */

#ifdef CPU_AMX_EMULATE

struct emu_tile {
    unsigned char row[16][64];
};

static void emu_load(struct emu_tile *t, const void *p, size_t stride)
{
    for (int r = 0; r < 16; r++)
        memcpy(t->row[r], (const unsigned char *)p + (size_t)r * stride, 64);
}

static void emu_store(const struct emu_tile *t, void *p, size_t stride)
{
    for (int r = 0; r < 16; r++)
        memcpy((unsigned char *)p + (size_t)r * stride, t->row[r], 64);
}

static float emu_bf16(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7f800000u) == 0)
        u &= 0x80000000u; /* a denormal input reads as zero */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void emu_dp(struct emu_tile *c, const struct emu_tile *a, const struct emu_tile *b)
{
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float acc;
            memcpy(&acc, &c->row[m][4 * n], 4);
            for (int k = 0; k < 16; k++) {
                acc += emu_bf16(&a->row[m][4 * k]) * emu_bf16(&b->row[k][4 * n]);
                acc += emu_bf16(&a->row[m][4 * k + 2]) * emu_bf16(&b->row[k][4 * n + 2]);
            }
            if (fpclassify(acc) == FP_SUBNORMAL)
                acc = copysignf(0.0f, acc);
            memcpy(&c->row[m][4 * n], &acc, 4);
        }
}

#define TILES struct emu_tile tmm[8]
#define T_LOAD(t, p, stride) emu_load(&tmm[t], (p), (size_t)(stride))
#define T_STORE(t, p, stride) emu_store(&tmm[t], (p), (size_t)(stride))
#define T_ZERO(t) memset(&tmm[t], 0, sizeof tmm[t])
#define T_DP(c, a, b) emu_dp(&tmm[c], &tmm[a], &tmm[b])

static void tiles_begin(void)
{
}

static void tiles_end(void)
{
}

#define FENCE() (void)0
#define UNIT_NAME "amx-emulated"

#else /* the real instructions */

#include <immintrin.h>

#include "x86_amx.h"

#define TILES (void)0
#define T_LOAD(t, p, stride) _tile_loadd(t, (p), (long)(stride))
#define T_STORE(t, p, stride) _tile_stored(t, (p), (long)(stride))
#define T_ZERO(t) _tile_zero(t)
#define T_DP(c, a, b) _tile_dpbf16ps(c, a, b)

static void tiles_begin(void)
{
    struct mmrt_x86_tile_config cfg;
    mmrt_x86_amx_config_16x64(&cfg);
    mmrt_x86_amx_load_config(&cfg);
}

static void tiles_end(void)
{
    _tile_release();
}

#define FENCE() mmrt_x86_amx_fence()
#define UNIT_NAME "amx"

#endif

/* dst[i·kp + p] = bf16(x[i][2p]) | bf16(x[i][2p+1]) << 16 (the A tile's rows), zeros past
 * rows and kc. */
static void pack_x(const float *x, int64_t ldx, int64_t rows, int64_t kc, int64_t kp,
                   uint32_t *dst)
{
    for (int64_t i = 0; i < MR; i++) {
        uint32_t *d = dst + i * kp;
        int64_t q = 0;
        if (i < rows) {
            const float *xr = x + i * ldx;
            for (; 2 * q + 1 < kc; q++)
                d[q] = cpu_f32_to_bf16(xr[2 * q]) | (uint32_t)cpu_f32_to_bf16(xr[2 * q + 1]) << 16;
            if (2 * q < kc) {
                d[q] = cpu_f32_to_bf16(xr[2 * q]);
                q++;
            }
        }
        for (; q < kp; q++)
            d[q] = 0;
    }
}

static void micro(const uint32_t *xp, const uint32_t *wp, int64_t kp, float *c, int64_t ldc,
                  int accumulate)
{
    TILES;
    const int64_t sc = ldc * (int64_t)sizeof(float), sa = kp * 4, sb = NR * 4;
    FENCE(); /* the packed panels and c are stored before the tile loads read them */
    if (accumulate) {
        T_LOAD(0, c, sc);
        T_LOAD(1, c + 16, sc);
        T_LOAD(2, c + 16 * ldc, sc);
        T_LOAD(3, c + 16 * ldc + 16, sc);
    } else {
        T_ZERO(0);
        T_ZERO(1);
        T_ZERO(2);
        T_ZERO(3);
    }
    for (int64_t p = 0; p < kp; p += KP_STEP) {
        T_LOAD(4, xp + p, sa);
        T_LOAD(5, xp + 16 * kp + p, sa);
        T_LOAD(6, wp + p * NR, sb);
        T_LOAD(7, wp + p * NR + 16, sb);
        T_DP(0, 4, 6);
        T_DP(1, 4, 7);
        T_DP(2, 5, 6);
        T_DP(3, 5, 7);
    }
    T_STORE(0, c, sc);
    T_STORE(1, c + 16, sc);
    T_STORE(2, c + 16 * ldc, sc);
    T_STORE(3, c + 16 * ldc + 16, sc);
}

/* ---- The BF16 GEMV (struct cpu_bf16_gemv) ----------------------------------------------
 *
 * Decode's MATMUL over up to 32 sequences with BF16 weights. The f32 GEMV is bound by its
 * FMA ports from about 8 rows on (16 rows ran at 47 % of the FMA peak, 2026-12-07), while a
 * TDPBF16PS does 16 × 16 × 32 multiply-adds. Here the A tile is 16 W rows × 32 columns read
 * straight from the weights (they are already bf16 pairs in k order, so there is nothing to
 * convert or pack), and the B tiles hold x: each x value split exactly into three bf16 parts
 * (p0 = x cut to 8 significant bits, p1 the same cut of the rest, p2 what is left, at most 8
 * bits), one tile column per (row, part), 16 columns a tile, so M ≤ 5 rows take one tile and
 * 32 rows six. Every product is then exact, each (row, part) column has its own sums, and the
 * row's result is p0's sum + (p1's + p2's). No column depends on another, so a row's bits do
 * not depend on M or on the rows beside it, as the GEMV contract requires (CPU_GEMV_MAX_M).
 * What the tile unit adds inside one instruction is its own (see the file comment); measured
 * against the exact product the result is as close as the f32 GEMV's or closer (test_cpu_isa:
 * 4.4e-7 of the largest output against 6.4e-7; docs/BENCHMARKS.md, 2026-12-07). Limits of the split: bf16 values below 2^-126 read as zero
 * on the tiles (parts of |x| < 2^-110, weights below 2^-126), and a non-finite x is one part.
 *
 * Packed x: [tile][chunk][16 pairs of k][16 columns][2], zeros past K and past 3·M columns.
 * A W block of fewer than 16 rows (the end of a thread's range) or the last chunk of a K that
 * is not a multiple of 32 is copied into a zero-padded 16 × 32 stage, so a tile never reads
 * past the weights and a padded column multiplies zeros only. */
#define GV_PARTS 3
#define GV_MAX_TILES ((GV_PARTS * CPU_GEMV_MAX_M + 15) / 16)
#define GV_PF 4 /* chunks ahead that the current block's rows are prefetched */

static int64_t gv_tiles(int64_t M)
{
    return (GV_PARTS * M + 15) / 16;
}

static size_t gv_xbytes(int64_t M, int64_t K)
{
    return (size_t)gv_tiles(M) * (size_t)((K + 31) / 32) * 1024;
}

static float cut_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u &= 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

static void gv_pack_x(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t c0, int64_t c1,
                      uint16_t *xp)
{
    const int64_t nch = (K + 31) / 32, nt = gv_tiles(M);
    for (int64_t t = 0; t < nt; t++)
        memset(xp + ((size_t)t * (size_t)nch + (size_t)c0) * 512, 0,
               (size_t)(c1 - c0) * 1024);
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * ldx;
        for (int64_t k = c0 * 32; k < K && k < c1 * 32; k++) {
            float v = xr[k], part[GV_PARTS] = { v, 0.0f, 0.0f };
            if (isfinite(v)) {
                part[0] = cut_bf16(v);
                float r = v - part[0]; /* exact: the low 16 bits of v */
                part[1] = cut_bf16(r);
                part[2] = r - part[1]; /* exact, at most 8 significant bits */
            }
            for (int q = 0; q < GV_PARTS; q++) {
                int64_t col = m * GV_PARTS + q, t = col / 16;
                size_t at = (((size_t)t * (size_t)nch + (size_t)(k / 32)) * 16 +
                             (size_t)(k % 32 / 2)) * 32 + (size_t)(col % 16) * 2 +
                            (size_t)(k % 2);
                xp[at] = cpu_f32_to_bf16(part[q]);
            }
        }
    }
}

/* The B tile of tile column t for chunk c into tmm7 and its products into C tile t. */
#define GV_STEP(t)                                                                           \
    do {                                                                                     \
        T_LOAD(7, xc + (size_t)(t) * (size_t)nch * 512, 64);                                \
        T_DP(t, 6, 7);                                                                       \
    } while (0)

/* K is taken in ranges whose packed x (tiles × chunks × 1 KiB) is at most GV_RANGE_KIB, so
 * it stays in L2 while GV_GROUP blocks of W rows go over it; their C tiles wait in memory
 * between ranges, an exact f32 round trip, so the ranges change no bit and may depend on M.
 * With the whole K at once, 32 rows over K = 18944 streamed 3.6 MiB of x from L3 for every
 * block (14.4 ms; 8.7 in ranges). Ranges are no shorter than needed: a block's rows are read
 * in runs of a range, and runs of 64 chunks made one row 13-40 % slower than whole rows. */
#define GV_RANGE_KIB 512
#define GV_GROUP 8

/* The C tiles in use, nt of the six (tile numbers must be constants for the instructions),
 * and what is done to each: zeroed, or loaded from / stored to the block's place in cb. */
#define GV_EACH_C(X)                                                                         \
    do {                                                                                     \
        X(0);                                                                                \
        if (nt > 1)                                                                          \
            X(1);                                                                            \
        if (nt > 2)                                                                          \
            X(2);                                                                            \
        if (nt > 3)                                                                          \
            X(3);                                                                            \
        if (nt > 4)                                                                          \
            X(4);                                                                            \
        if (nt > 5)                                                                          \
            X(5);                                                                            \
    } while (0)
#define GV_ZERO_C(t) T_ZERO(t)
#define GV_LOAD_C(t) T_LOAD(t, cbb[t], 64)
#define GV_STORE_C(t) T_STORE(t, cbb[t], 64)

static void gv_rows(const uint16_t *xp, int64_t M, int64_t K, const uint16_t *w, int64_t ldw,
                    int64_t n0, int64_t n1, float *y, int64_t ldy)
{
    TILES;
    const int64_t nt = gv_tiles(M), nch = (K + 31) / 32, full = K / 32;
    const int64_t sw = ldw * (int64_t)sizeof(uint16_t), range = GV_RANGE_KIB / nt;
    uint16_t stage[16 * 32] __attribute__((aligned(64)));
    _Static_assert(GV_MAX_TILES == 6, "gv_rows names C tiles 0-5");
    float cb[GV_GROUP][GV_MAX_TILES][256] __attribute__((aligned(64)));
    for (int64_t g0 = n0; g0 < n1; g0 += 16 * GV_GROUP) {
        const int64_t g1 = n1 - g0 < 16 * GV_GROUP ? n1 : g0 + 16 * GV_GROUP;
        for (int64_t r0 = 0; r0 < nch; r0 += range) {
            const int64_t r1 = nch - r0 < range ? nch : r0 + range;
            const int64_t rf = r1 < full ? r1 : full; /* chunks read in place: [r0, rf) */
            for (int64_t b0 = g0; b0 < g1; b0 += 16) {
                const int64_t rows = g1 - b0 < 16 ? g1 - b0 : 16;
                float(*cbb)[256] = cb[(b0 - g0) / 16];
                const uint16_t *wb = w + b0 * ldw;
                /* the next block of this group, when whole: where prefetching goes on */
                const uint16_t *wn = b0 + 32 <= g1 ? wb + 16 * ldw : NULL;
                if (r0 == 0) {
                    GV_EACH_C(GV_ZERO_C);
                } else {
                    FENCE();
                    GV_EACH_C(GV_LOAD_C);
                }
                for (int64_t c = r0; c < r1; c++) {
                    const uint16_t *a = wb + c * 32;
                    int64_t sa = sw;
                    if (rows < 16 || c >= full) {
                        const int64_t kk = K - c * 32 < 32 ? K - c * 32 : 32;
                        memset(stage, 0, sizeof stage);
                        for (int64_t r = 0; r < rows; r++)
                            memcpy(stage + r * 32, wb + r * ldw + c * 32, (size_t)kk * 2);
                        a = stage;
                        sa = 64;
                    } else {
                        /* GV_PF chunks ahead: in this block, or past its end the next
                         * block's first ones, so no block starts cold */
                        const int64_t t = c + GV_PF;
                        const uint16_t *pf = t < rf                  ? wb + t * 32
                                             : wn && t - rf + r0 < rf ? wn + (t - rf + r0) * 32
                                                                     : NULL;
                        if (pf)
                            for (int64_t r = 0; r < 16; r++)
                                __builtin_prefetch(pf + r * ldw, 0, 3);
                    }
                    FENCE(); /* the stage (and the packed x) are stored before tile loads */
                    T_LOAD(6, a, sa);
                    const uint16_t *xc = xp + (size_t)c * 512;
                    GV_EACH_C(GV_STEP);
                }
                GV_EACH_C(GV_STORE_C);
            }
        }
        FENCE(); /* the C tiles are in cb before it is read */
        for (int64_t b0 = g0; b0 < g1; b0 += 16) {
            float(*cbb)[256] = cb[(b0 - g0) / 16];
            const int64_t rows = g1 - b0 < 16 ? g1 - b0 : 16;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t m = 0; m < M; m++) {
                    float v[GV_PARTS];
                    for (int q = 0; q < GV_PARTS; q++) {
                        int64_t col = m * GV_PARTS + q;
                        v[q] = cbb[col / 16][r * 16 + col % 16];
                    }
                    y[m * ldy + b0 + r] = v[0] + (v[1] + v[2]);
                }
        }
    }
}

const struct cpu_bf16_gemv cpu_bf16_gemv_amx = {
    .unit = UNIT_NAME,
    .xbytes = gv_xbytes,
    .pack_x = gv_pack_x,
    .rows = gv_rows,
    .begin = tiles_begin,
    .end = tiles_end,
};

const struct cpu_bf16_gemm cpu_bf16_gemm_amx = {
    .unit = UNIT_NAME,
    .mr = MR,
    .nr = NR,
    /* 256 values, 128 pairs: the x and W micro-panels are 16 KiB each and stay in L1 together.
     * With 512 values (the AVX512_BF16 unit's block) they did not, and a 629 × 4096 × 11008 MATMUL took
     * 41.7 ms instead of 33.3 (2026-12-07, Sapphire Rapids, 2 threads; 1024: 40.5). */
    .kalign = KP_STEP,
    .kc = 256,
    .pack_x = pack_x,
    .pack_w = cpu_pack_w_bf16_avx512,
    .micro = micro,
    .begin = tiles_begin,
    .end = tiles_end,
};
