/*
 * plugins/cpu/cpu_kern_q8_gemv.h — the int8 U4 GEMV's block driver (struct cpu_q4_q8.gemv),
 * and its x quantization (struct cpu_q4_q8.quant_row), written once for both units:
 * cpu_kern_avx2.c and cpu_kern_avx512vnni.c each include it after their own q8_rows_g (one x
 * row against R W rows side by side, ending in the rows' outputs; one_group: every chunk in
 * one group), q8_block (one block of 32 values rounded in vectors), Q8_R (W rows side by side)
 * and Q8_C; each unit then defines one struct cpu_q4_q8 per digit count.
 *
 * Each block of W rows meets every x row in turn: after the first x row its codes come from
 * L1/L2, and each (x row, W row) pair is computed by the same code whatever M, so a row's
 * result never depends on its batch. The first pass over a block prefetches the next one;
 * the rows left over run one at a time. l2: where that prefetch puts the lines
 * (cpu_prefetch_read).
 */
#ifndef MMRT_CPU_KERN_Q8_GEMV_H
#define MMRT_CPU_KERN_Q8_GEMV_H

/* cpu_q8_block for every block of the row: the unit's q8_block for whole blocks, which
 * declines (false) a block that is not finite or whose amax is below CPU_Q8_MIN_SCALED;
 * cpu_q8_block for those and for the row's last, partial block. */
static inline __attribute__((always_inline)) void
q8_quant_row_d(const float *x, int64_t K, int64_t kp, int8_t *q, float *d, int32_t *sum,
               const int D)
{
    for (int64_t b = 0; b < kp / CPU_Q8_BLOCK; b++) {
        const int64_t k = b * CPU_Q8_BLOCK, c0 = k / Q8_C * Q8_C, bi = (k - c0) / CPU_Q8_BLOCK;
        int8_t *lo = q + c0 * D + bi * 16, *hi = lo + Q8_C / 2;
        float *db = d + b * CPU_Q8_LANES_PER_BLOCK, amax;
        if (K - k < CPU_Q8_BLOCK || !q8_block(x + k, lo, hi, &amax, sum + b, D)) {
            cpu_q8_block(x + k, K - k < CPU_Q8_BLOCK ? K - k : CPU_Q8_BLOCK, D, Q8_C, lo, hi,
                         db, sum + b);
            continue;
        }
        for (int t = 0; t < CPU_Q8_LANES_PER_BLOCK; t++)
            db[t] = amax / (float)CPU_Q8_FULL(D);
    }
}

/* Groups of a multiple of Q8_C codes (the usual 128) put every chunk in one group: one
 * scale, broadcast, instead of the lanes' gather or permutation. The same values either way. */
static inline __attribute__((always_inline)) void
q8_rows(const struct cpu_q8_rows *x, int64_t m, int64_t K, const uint8_t *w, int64_t rowb,
        const float *s, const float *z, int64_t ng, const int R, float *y, const uint8_t *pf,
        const int D, const bool l2)
{
    if ((K / ng) % Q8_C == 0)
        q8_rows_g(x, m, K, w, rowb, s, z, ng, R, y, pf, true, D, l2);
    else
        q8_rows_g(x, m, K, w, rowb, s, z, ng, R, y, pf, false, D, l2);
}

static inline __attribute__((always_inline)) void
q8_gemv_d(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w, const float *s,
          const float *z, int64_t G, int64_t n, float *y, int64_t ldy, const int D,
          const bool l2)
{
    const int64_t rowb = K / 2;
    const int R = Q8_R;
    int64_t j = 0;
    for (; j + R <= n; j += R)
        for (int64_t m = 0; m < M; m++)
            q8_rows(x, m, K, w + j * rowb, rowb, s + j * G, z + j * G, G, R, y + m * ldy + j,
                    m == 0 && j + 2 * R <= n ? w + (j + R) * rowb : NULL, D, l2);
    for (; j < n; j++)
        for (int64_t m = 0; m < M; m++)
            q8_rows(x, m, K, w + j * rowb, rowb, s + j * G, z + j * G, G, 1, y + m * ldy + j,
                    NULL, D, l2);
}

/* The two digit counts, each its own code (D is a constant inside). */
static void q8_quant_row1(const float *x, int64_t K, int64_t kp, int8_t *q, float *d,
                          int32_t *sum)
{
    q8_quant_row_d(x, K, kp, q, d, sum, 1);
}

static void q8_quant_row3(const float *x, int64_t K, int64_t kp, int8_t *q, float *d,
                          int32_t *sum)
{
    q8_quant_row_d(x, K, kp, q, d, sum, 3);
}

static void q8_gemv1(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                     const float *s, const float *z, int64_t G, int64_t n, float *y, int64_t ldy)
{
    q8_gemv_d(x, M, K, w, s, z, G, n, y, ldy, 1, false);
}

static void q8_gemv3(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                     const float *s, const float *z, int64_t G, int64_t n, float *y, int64_t ldy)
{
    q8_gemv_d(x, M, K, w, s, z, G, n, y, ldy, 3, false);
}

static void q8_gemv1_l2(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                        const float *s, const float *z, int64_t G, int64_t n, float *y,
                        int64_t ldy)
{
    q8_gemv_d(x, M, K, w, s, z, G, n, y, ldy, 1, true);
}

static void q8_gemv3_l2(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                        const float *s, const float *z, int64_t G, int64_t n, float *y,
                        int64_t ldy)
{
    q8_gemv_d(x, M, K, w, s, z, G, n, y, ldy, 3, true);
}

#endif
