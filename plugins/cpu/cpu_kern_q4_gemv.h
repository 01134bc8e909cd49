/*
 * plugins/cpu/cpu_kern_q4_gemv.h — the U4 GEMV's block driver (struct cpu_kernels.q4_gemv),
 * written once for every ISA file: cpu_kern_avx2.c and cpu_kern_avx512.c each include it after
 * their own q4_rows_one (one x row, R W rows side by side), q4_rows_wide (several x rows over
 * R widened W rows) and block sizes Q4_R1 and Q4_R, so it compiles into each with that file's
 * kernels and target flags.
 *
 * Each full block prefetches the next one (pf); the rows left over run one at a time.
 */
#ifndef MMRT_CPU_KERN_Q4_GEMV_H
#define MMRT_CPU_KERN_Q4_GEMV_H

static void q4_gemv(const float *x, int64_t ldx, int64_t M, int64_t K, const uint8_t *w,
                    const float *s, const float *z, const float *xs, int64_t ng, int64_t n,
                    float *y, int64_t ldy)
{
    const int64_t rowb = K / 2;
    int64_t j = 0;
    if (M == 1) {
        for (; j + Q4_R1 <= n; j += Q4_R1)
            q4_rows_one(x, w + j * rowb, rowb, s + j * ng, z + j * ng, xs, ng, K / ng, Q4_R1,
                        y + j, j + 2 * Q4_R1 <= n ? w + (j + Q4_R1) * rowb : NULL);
        for (; j < n; j++)
            q4_rows_one(x, w + j * rowb, rowb, s + j * ng, z + j * ng, xs, ng, K / ng, 1, y + j,
                        NULL);
        return;
    }
    for (; j + Q4_R <= n; j += Q4_R)
        q4_rows_wide(x, ldx, M, K, w + j * rowb, s + j * ng, z + j * ng, xs, ng, Q4_R, y + j,
                     ldy, j + 2 * Q4_R <= n ? w + (j + Q4_R) * rowb : NULL);
    for (; j < n; j++)
        q4_rows_wide(x, ldx, M, K, w + j * rowb, s + j * ng, z + j * ng, xs, ng, 1, y + j, ldy,
                     NULL);
}

#endif
