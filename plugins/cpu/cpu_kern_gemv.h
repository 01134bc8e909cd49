/*
 * plugins/cpu/cpu_kern_gemv.h — the f32-accumulating GEMV's entry points (struct
 * cpu_kernels.gemv and gemv_regs), written once for every ISA file: cpu_kern_avx2.c and
 * cpu_kern_avx512.c each include it after their own gemv_dt (W rows [0, n) of one dtype;
 * regs: widen in registers by every pass instead of into the L1 buffer), so it compiles into
 * each with that file's kernels and target flags.
 */
#ifndef MMRT_CPU_KERN_GEMV_H
#define MMRT_CPU_KERN_GEMV_H

/* One instantiation per dtype and widening (regs), so both are constants in the loops. */
#define GEMV_DT(name, dt, regs)                                                                \
    static void name(const float *x, int64_t ldx, int64_t M, int64_t K, const char *w,         \
                     int64_t rowb, int64_t n, float *y, int64_t ldy)                           \
    {                                                                                          \
        gemv_dt(x, ldx, M, K, w, dt, rowb, n, y, ldy, regs);                                   \
    }
GEMV_DT(gemv_f32, MMRT_DTYPE_F32, false)
GEMV_DT(gemv_f16, MMRT_DTYPE_F16, false)
GEMV_DT(gemv_bf16, MMRT_DTYPE_BF16, false)
GEMV_DT(gemv_i8, MMRT_DTYPE_I8, false)
GEMV_DT(gemv_f16_regs, MMRT_DTYPE_F16, true)
GEMV_DT(gemv_bf16_regs, MMRT_DTYPE_BF16, true)
GEMV_DT(gemv_i8_regs, MMRT_DTYPE_I8, true)
#undef GEMV_DT

static inline __attribute__((always_inline)) void
gemv_any(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w, int dtype,
         int64_t ldw, int64_t n0, int64_t n1, float *y, int64_t ldy, const bool regs)
{
    const int64_t rowb = ldw * (int64_t)mmrt_dtype_size((enum mmrt_dtype)dtype);
    const char *wr = (const char *)w + n0 * rowb;
    float *yr = y + n0;
    /* The dtype is decided here, once per call, never in the loops. */
    switch (dtype) {
    case MMRT_DTYPE_F16:
        (regs ? gemv_f16_regs : gemv_f16)(x, ldx, M, K, wr, rowb, n1 - n0, yr, ldy);
        break;
    case MMRT_DTYPE_BF16:
        (regs ? gemv_bf16_regs : gemv_bf16)(x, ldx, M, K, wr, rowb, n1 - n0, yr, ldy);
        break;
    case MMRT_DTYPE_I8:
        (regs ? gemv_i8_regs : gemv_i8)(x, ldx, M, K, wr, rowb, n1 - n0, yr, ldy);
        break;
    default: gemv_f32(x, ldx, M, K, wr, rowb, n1 - n0, yr, ldy); break;
    }
}

static void gemv(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w, int dtype,
                 int64_t ldw, int64_t n0, int64_t n1, float *y, int64_t ldy)
{
    gemv_any(x, ldx, M, K, w, dtype, ldw, n0, n1, y, ldy, false);
}

static void gemv_regs(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                      int dtype, int64_t ldw, int64_t n0, int64_t n1, float *y, int64_t ldy)
{
    gemv_any(x, ldx, M, K, w, dtype, ldw, n0, n1, y, ldy, true);
}

#endif
