/*
 * plugins/cpu/cpu_kern_q8_gemv.h — the int8 U4 GEMV's block driver (struct cpu_q4_q8.gemv),
 * written once for both units: cpu_kern_avx2.c and cpu_kern_avx512vnni.c each include it
 * after their own q8_rows (one x row against R W rows side by side, ending in the rows'
 * outputs) and Q8_R.
 *
 * Each block of W rows meets every x row in turn: after the first x row its codes come from
 * L1/L2, and each (x row, W row) pair is computed by the same code whatever M, so a row's
 * result never depends on its batch. The first pass over a block prefetches the next one;
 * the rows left over run one at a time.
 */
#ifndef MMRT_CPU_KERN_Q8_GEMV_H
#define MMRT_CPU_KERN_Q8_GEMV_H

static void q8_gemv(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                    const float *s, const float *z, int64_t G, int64_t n, float *y, int64_t ldy)
{
    const int64_t rowb = K / 2;
    int64_t j = 0;
    for (; j + Q8_R <= n; j += Q8_R)
        for (int64_t m = 0; m < M; m++)
            q8_rows(x, m, K, w + j * rowb, rowb, s + j * G, z + j * G, G, Q8_R,
                    y + m * ldy + j, m == 0 && j + 2 * Q8_R <= n ? w + (j + Q8_R) * rowb : NULL);
    for (; j < n; j++)
        for (int64_t m = 0; m < M; m++)
            q8_rows(x, m, K, w + j * rowb, rowb, s + j * G, z + j * G, G, 1, y + m * ldy + j,
                    NULL);
}

#endif
