/*
 * plugins/cpu/cpu_kern_kv_rows.h — struct cpu_kernels.dot_rows and .axpy_rows (decode
 * attention over a run of KV rows), written once for both vector tables: cpu_kern_avx2.c and
 * cpu_kern_avx512.c each include it after their own dot_dt (one row's dot product in the
 * table's lanes and reduction; `scaled`: I8 codes times the row's scale) and axpy_rows_dt
 * (the rows' fused multiply-adds into y, held in registers). Here only the dtype is resolved
 * once per call, so that in the loops it is a constant.
 */
#ifndef MMRT_CPU_KERN_KV_ROWS_H
#define MMRT_CPU_KERN_KV_ROWS_H

/* dot_rows for one dtype. Each row is dot_dt's sum, so the bits do not depend on how many
 * rows share the call. */
static inline __attribute__((always_inline)) void
dot_rows_dt(const float *a, const char *b, const int dt, int64_t ldb, const bool scaled,
            const float *scales, int64_t scale_step, int64_t rows, int64_t n, float s, float *out)
{
    for (int64_t i = 0; i < rows; i++)
        out[i] = dot_dt(a, b + i * ldb, dt, n, scaled, scaled ? scales[i * scale_step] : 1.0f) *
                 s;
}

static void dot_rows(const float *a, const void *b, int b_dtype, int64_t ldb,
                     const float *scales, int64_t scale_step, int64_t rows, int64_t n, float s,
                     float *out)
{
    const char *bb = b;
    switch (b_dtype) {
    case MMRT_DTYPE_F16:
        dot_rows_dt(a, bb, MMRT_DTYPE_F16, ldb, false, NULL, 0, rows, n, s, out);
        break;
    case MMRT_DTYPE_BF16:
        dot_rows_dt(a, bb, MMRT_DTYPE_BF16, ldb, false, NULL, 0, rows, n, s, out);
        break;
    case MMRT_DTYPE_F8E4M3:
        dot_rows_dt(a, bb, MMRT_DTYPE_F8E4M3, ldb, false, NULL, 0, rows, n, s, out);
        break;
    case MMRT_DTYPE_I8:
        dot_rows_dt(a, bb, MMRT_DTYPE_I8, ldb, true, scales, scale_step, rows, n, s, out);
        break;
    default: dot_rows_dt(a, bb, MMRT_DTYPE_F32, ldb, false, NULL, 0, rows, n, s, out); break;
    }
}

static void axpy_rows(float *y, const float *p, const void *x, int x_dtype, int64_t ldx,
                      const float *scales, int64_t scale_step, int64_t rows, int64_t n)
{
    const char *xb = x;
    switch (x_dtype) {
    case MMRT_DTYPE_F16:
        axpy_rows_dt(y, p, xb, MMRT_DTYPE_F16, ldx, false, NULL, 0, rows, n);
        break;
    case MMRT_DTYPE_BF16:
        axpy_rows_dt(y, p, xb, MMRT_DTYPE_BF16, ldx, false, NULL, 0, rows, n);
        break;
    case MMRT_DTYPE_F8E4M3:
        axpy_rows_dt(y, p, xb, MMRT_DTYPE_F8E4M3, ldx, false, NULL, 0, rows, n);
        break;
    case MMRT_DTYPE_I8: /* with scales: an INT8 KV row; without: the codes as values */
        if (scales)
            axpy_rows_dt(y, p, xb, MMRT_DTYPE_I8, ldx, true, scales, scale_step, rows, n);
        else
            axpy_rows_dt(y, p, xb, MMRT_DTYPE_I8, ldx, false, NULL, 0, rows, n);
        break;
    default: axpy_rows_dt(y, p, xb, MMRT_DTYPE_F32, ldx, false, NULL, 0, rows, n); break;
    }
}

#endif
