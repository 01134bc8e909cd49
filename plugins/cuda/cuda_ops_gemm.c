/*
 * plugins/cuda/cuda_ops_gemm.c — MATMUL and PATCH_EMBED: y[M, N] = A[M, K] · W[N, K]ᵀ (+ b),
 * A being x (MATMUL) or the image's patches in im2col order (PATCH_EMBED).
 *
 * How f32 activations meet F16/BF16 weights (the weights never leave their dtype):
 *
 *   M ≤ CU_GEMV_MAX_M (decode)   GEMV kernel: W read once in its dtype, x in f32, products
 *                                and sums in f32. Bandwidth-bound; error vs the CPU f32
 *                                reference ~1e-7 relative (summation order only).
 *   W F32                        cublasGemmEx F32 × F32 → F32, CUBLAS_COMPUTE_32F (no TF32:
 *                                the default math mode never uses it for F32). Same accuracy.
 *   W F16 / BF16, larger M       the activations are converted to the weight dtype by the
 *                                prep kernel and cublasGemmEx runs the tensor cores with f32
 *                                accumulation (CUBLAS_COMPUTE_32F). Two precisions, chosen by
 *                                the device option gemm_precision:
 *     high (default)   A is split into hi + lo, both in the weight dtype, and two GEMMs add
 *                      W·hiᵀ and W·loᵀ into y. BF16: hi = bf16(a), lo = bf16(a − hi), so a is
 *                      carried to 2^-17 relative. F16: hi = f16(a · 2^-8), lo = f16((a −
 *                      256·hi) · 8), alphas 256 and 1/8: a carried to 2^-22 relative, or 2^-28
 *                      absolute below |a| = 2^-6, and no overflow below |a| ≈ 1.6e7 (f16 alone
 *                      overflows at 65504). Costs two GEMMs; the result is within ~3e-5 of
 *                      the f32 reference — the tensor cores' own f32 accumulation (not
 *                      round-to-nearest at every step) is what is left.
 *     fast             one rounding of A to the weight dtype, one GEMM — what fp16/bf16
 *                      inference engines do. Relative error ~2^-11·√(1/3) per product
 *                      term: expect ~1e-3 (f16) and ~8e-3 (bf16) of the largest output.
 *   The converted A needs scratch; rows are processed in chunks that fit
 *   CU_GEMM_SCRATCH_BYTES, so any M works with fixed memory (and inside a captured graph).
 *   Bias: y is first filled with b (or zeros) and every GEMM adds with beta = 1.
 *
 * I8 weights (plugin.h ABI 1.3: codes q[N, K] and one F32 scale per row):
 *   M ≤ CU_GEMV_I8_MAX_M (32)    the I8 GEMV kernel: codes read 16 at a time, f32 sums in an
 *                                order fixed by K, then · scale (+ b). Rows are bit-identical
 *                                to the row alone for every M ≤ 32 (batch invariance).
 *   larger M                     the F16 route above with the codes as the weight: blocks of
 *                                W rows are widened to f16 into the first half of the scratch
 *                                (exact: |q| ≤ 127, so nothing about W is rounded), A is
 *                                prepared into the second half (hi + lo or hi alone, as
 *                                gemm_precision says), cuBLAS sums x · q into zeroed y, and
 *                                scale_cols multiplies by the scales and adds the bias. The
 *                                accuracy is the F16 route's (~3e-5 high, ~1e-3 fast); scaling
 *                                the codes into f16 instead would round every weight to 11
 *                                bits. W blocks are converted once when all of W fits in half
 *                                the scratch, else once per A chunk.
 *
 * U4 weights (plugin.h ABI 1.3: packed codes [N, K/2], scales and zero points [N, G]):
 *   M ≤ CU_GEMV_I8_MAX_M (32)    the U4 GEMV kernel: 16 bytes (32 codes) per lane and step,
 *                                Σ x · (code − zero) per block times the group's scale, an
 *                                order fixed by K; rows bit-identical to the row alone.
 *   larger M                     the I8 route's structure with u4_to_f16 as the widening:
 *                                each W row is dequantized into f16 after division by a
 *                                power of two p ≥ its largest |weight| (so any magnitude fits
 *                                f16's range), and scale_cols multiplies p back (exact) and
 *                                adds the bias. Unlike the I8 codes, the dequantized weights
 *                                are not integers: each is rounded once to 11 bits (2^-12
 *                                relative), ~1/100 of the INT4 step itself; with gemm_precision
 *                                high the route is within ~1e-4 of the f32 reference.
 */
#include <inttypes.h>
#include <limits.h>
#include <string.h>

#include "cuda_internal.h"

static cudaDataType cu_blas_type(int dtype)
{
    switch (dtype) {
    case MMRT_DTYPE_F16: return CUDA_R_16F;
    case MMRT_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

static mmrt_status blas_failed(struct cu_op *o, cublasStatus_t s)
{
    return cu_fail(o->dev, s == CUBLAS_STATUS_ALLOC_FAILED ? MMRT_ERR_NO_MEMORY : MMRT_ERR_DEVICE,
                   "%s: cublasGemmEx failed: %s", o->name, cublasGetStatusString(s));
}

/* y[rows, N] (+)= alpha · A[rows, K] · W[N, K]ᵀ with beta = 1 (y already holds the bias);
 * y's rows are ldy floats apart (N, or more for a block of columns). */
static mmrt_status gemm_blas(struct cu_op *o, const void *A, int a_dtype, int64_t rows,
                             int64_t K, const void *w, int w_dtype, int64_t N, float alpha,
                             float *y, int64_t ldy)
{
    const float one = 1.0f;
    /* Row-major y = A · Wᵀ is column-major yᵀ[N, rows] = W[K, N]ᵀ · Aᵀ[K, rows]. */
    cublasStatus_t s = cublasGemmEx(o->dev->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)rows,
                                    (int)K, &alpha, w, cu_blas_type(w_dtype), (int)K, A,
                                    cu_blas_type(a_dtype), (int)K, &one, y, CUDA_R_32F,
                                    (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? MMRT_OK : blas_failed(o, s);
}

/* The GEMM shared by both ops. x: MATMUL's activations, or NULL with `patches` describing
 * PATCH_EMBED's image (its x, r0, rows, out fields are filled in here). */
static mmrt_status gemm(struct cu_op *o, const float *x, const struct cu_prep_desc *patches,
                        int64_t M, int64_t K, const void *w, int w_dtype, int64_t N,
                        const void *b, int b_dtype, float *y)
{
    struct mmrt_device *dev = o->dev;
    cudaError_t e;
    if (M == 0 || N == 0)
        return MMRT_OK;
    if (N > INT_MAX || K > INT_MAX)
        return cu_bad(o, MMRT_ERR_UNSUPPORTED, "N %" PRId64 " or K %" PRId64 " exceeds cuBLAS's "
                      "int dimensions", N, K);
    if (x && K > 0 && M <= CU_GEMV_MAX_M) {
        e = cu_launch_gemv(y, x, w, w_dtype, b, b_dtype, M, K, N, dev->stream);
        return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "gemv");
    }
    if ((e = cu_launch_fill_rows(y, b, b_dtype, M, N, dev->stream)) != cudaSuccess)
        return cu_launch_failed(o, e, "fill_rows");
    if (K == 0)
        return MMRT_OK; /* y = b (or 0): an empty sum */

    if (x && w_dtype == MMRT_DTYPE_F32) {
        /* F32 × F32: no conversion, x is the operand; chunk only for cuBLAS's int rows. */
        for (int64_t r0 = 0; r0 < M; r0 += INT_MAX) {
            int64_t rows = M - r0 < INT_MAX ? M - r0 : INT_MAX;
            mmrt_status st = gemm_blas(o, x + r0 * K, MMRT_DTYPE_F32, rows, K, w, w_dtype, N, 1.0f,
                                       y + r0 * N, N);
            if (st != MMRT_OK)
                return st;
        }
        return MMRT_OK;
    }

    bool f32 = w_dtype == MMRT_DTYPE_F32, split = !f32 && dev->gemm_split;
    size_t row_bytes = (size_t)K * (f32 ? 4 : 2) * (split ? 2 : 1);
    /* lo starts on a 256-byte boundary after hi (cuBLAS's fast kernels want aligned
     * operands), which costs at most 256 bytes of the scratch. */
    int64_t chunk = (int64_t)((CU_GEMM_SCRATCH_BYTES - 256) / row_bytes);
    if (chunk < 1)
        return cu_bad(o, MMRT_ERR_UNSUPPORTED, "K %" PRId64 " needs %zu bytes of scratch per row, "
                      "more than the plugin's %zu", K, row_bytes, CU_GEMM_SCRATCH_BYTES);
    if (chunk > INT_MAX)
        chunk = INT_MAX;
    /* F16 with the split keeps hi away from f16's overflow (see the file comment). */
    float hi_scale = 1.0f, lo_scale = 1.0f;
    if (split && w_dtype == MMRT_DTYPE_F16) {
        hi_scale = 1.0f / 256.0f;
        lo_scale = 8.0f;
    }
    char *hi = dev->gemm_scratch;
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
        int64_t rows = M - r0 < chunk ? M - r0 : chunk;
        struct cu_prep_desc d;
        if (patches)
            d = *patches;
        else
            memset(&d, 0, sizeof d);
        d.x = x;
        d.r0 = r0;
        d.rows = rows;
        d.K = K;
        d.out_dtype = w_dtype;
        d.split = split;
        d.hi_scale = hi_scale;
        d.lo_scale = lo_scale;
        d.hi = hi;
        d.lo = hi + (((size_t)rows * K * 2 + 255) & ~(size_t)255);
        if ((e = cu_launch_prep(&d, dev->stream)) != cudaSuccess)
            return cu_launch_failed(o, e, "prep");
        mmrt_status st = gemm_blas(o, d.hi, w_dtype, rows, K, w, w_dtype, N, 1.0f / hi_scale,
                                   y + r0 * N, N);
        if (st == MMRT_OK && split)
            st = gemm_blas(o, d.lo, w_dtype, rows, K, w, w_dtype, N, 1.0f / lo_scale,
                           y + r0 * N, N);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

/* A quantized MATMUL weight: I8 codes [N, K] with scales [N], or U4 codes [N, K/2] with
 * scales and zero points [N, G]. */
struct qweight {
    int dtype;
    const void *w;
    const float *scale, *zero;
    int64_t G;
};

/* MATMUL with a quantized W; see the file comment. */
static mmrt_status gemm_quant(struct cu_op *o, const float *x, int64_t M, int64_t K,
                              const struct qweight *q, int64_t N, const void *b, int b_dtype,
                              float *y)
{
    struct mmrt_device *dev = o->dev;
    const bool u4 = q->dtype == MMRT_DTYPE_U4;
    cudaError_t e;
    if (M == 0 || N == 0)
        return MMRT_OK;
    if (N > INT_MAX || K > INT_MAX)
        return cu_bad(o, MMRT_ERR_UNSUPPORTED, "N %" PRId64 " or K %" PRId64 " exceeds cuBLAS's "
                      "int dimensions", N, K);
    if (K > 0 && M <= CU_GEMV_I8_MAX_M) {
        if (u4) {
            e = cu_launch_gemv_u4(y, x, q->w, q->scale, q->zero, q->G, b, b_dtype, M, K, N,
                                  dev->stream);
            return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "gemv_u4");
        }
        e = cu_launch_gemv_i8(y, x, q->w, q->scale, b, b_dtype, M, K, N, dev->stream);
        return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "gemv_i8");
    }
    if (K == 0) { /* an empty sum: y = 0 · scale + b (U4 has K ≥ 32) */
        e = cu_launch_fill_rows(y, b, b_dtype, M, N, dev->stream);
        return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "fill_rows");
    }
    if ((e = cu_launch_fill_rows(y, NULL, MMRT_DTYPE_F32, M, N, dev->stream)) != cudaSuccess)
        return cu_launch_failed(o, e, "fill_rows");

    const size_t half = CU_GEMM_SCRATCH_BYTES / 2; /* both halves 256-byte aligned */
    /* U4: the rows' powers of two (u4_to_f16) lead the W half, 256-byte aligned. */
    const size_t rs_bytes = u4 ? ((size_t)N * sizeof(float) + 255) & ~(size_t)255 : 0;
    const bool split = dev->gemm_split;
    const size_t row_bytes = (size_t)K * 2 * (split ? 2 : 1);
    int64_t a_chunk = (int64_t)((half - 256) / row_bytes);
    int64_t w_chunk = rs_bytes < half ? (int64_t)((half - rs_bytes) / ((size_t)K * 2)) : 0;
    if (a_chunk < 1 || w_chunk < 1)
        return cu_bad(o, MMRT_ERR_UNSUPPORTED, "K %" PRId64 " and N %" PRId64 " need more than "
                      "the plugin's %zu bytes of scratch (%zu per row of x)", K, N,
                      CU_GEMM_SCRATCH_BYTES, row_bytes * 2);
    if (a_chunk > INT_MAX)
        a_chunk = INT_MAX;
    if (w_chunk > N)
        w_chunk = N;
    const float hi_scale = split ? 1.0f / 256.0f : 1.0f, lo_scale = split ? 8.0f : 1.0f;
    float *rowscale = dev->gemm_scratch;
    uint16_t *wq = (uint16_t *)((char *)dev->gemm_scratch + rs_bytes);
    char *hi = (char *)dev->gemm_scratch + half;
    const bool w_once = w_chunk == N; /* all of W converted once, before the row chunks */
    for (int64_t r0 = 0; r0 < M; r0 += a_chunk) {
        const int64_t rows = M - r0 < a_chunk ? M - r0 : a_chunk;
        struct cu_prep_desc d;
        memset(&d, 0, sizeof d);
        d.x = x;
        d.r0 = r0;
        d.rows = rows;
        d.K = K;
        d.out_dtype = MMRT_DTYPE_F16;
        d.split = split;
        d.hi_scale = hi_scale;
        d.lo_scale = lo_scale;
        d.hi = hi;
        d.lo = hi + (((size_t)rows * K * 2 + 255) & ~(size_t)255);
        if ((e = cu_launch_prep(&d, dev->stream)) != cudaSuccess)
            return cu_launch_failed(o, e, "prep");
        for (int64_t n0 = 0; n0 < N; n0 += w_chunk) {
            const int64_t cols = N - n0 < w_chunk ? N - n0 : w_chunk;
            if (!w_once || r0 == 0) {
                if (u4)
                    e = cu_launch_u4_to_f16(wq, rowscale + n0,
                                            (const uint8_t *)q->w + n0 * (K / 2),
                                            q->scale + n0 * q->G, q->zero + n0 * q->G, q->G, K,
                                            cols, dev->stream);
                else
                    e = cu_launch_i8_to_f16(wq, (const int8_t *)q->w + n0 * K, cols * K,
                                            dev->stream);
                if (e != cudaSuccess)
                    return cu_launch_failed(o, e, u4 ? "u4_to_f16" : "i8_to_f16");
            }
            const uint16_t *wb = w_once ? wq + n0 * K : wq;
            float *yb = y + r0 * N + n0;
            mmrt_status st = gemm_blas(o, d.hi, MMRT_DTYPE_F16, rows, K, wb, MMRT_DTYPE_F16,
                                       cols, 1.0f / hi_scale, yb, N);
            if (st == MMRT_OK && split)
                st = gemm_blas(o, d.lo, MMRT_DTYPE_F16, rows, K, wb, MMRT_DTYPE_F16, cols,
                               1.0f / lo_scale, yb, N);
            if (st != MMRT_OK)
                return st;
        }
    }
    e = cu_launch_scale_cols(y, u4 ? rowscale : q->scale, b, b_dtype, M, N, dev->stream);
    return e == cudaSuccess ? MMRT_OK : cu_launch_failed(o, e, "scale_cols");
}

mmrt_status cu_op_matmul(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_MATMUL, 2, 5, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *x = &o.src[0], *w = &o.src[1], *b = &o.src[2], *s = &o.src[3],
                         *z = &o.src[4], *y = &o.dst;
    int64_t K = cu_inner(x), M = cu_rows(x), N = w->ne[0];
    if (w->dtype == MMRT_DTYPE_I8 || w->dtype == MMRT_DTYPE_U4) {
        /* U4: scales and zero points are [N, G] (op_contract.h); I8 has no groups. */
        const int64_t G = w->dtype == MMRT_DTYPE_U4 ? s->ne[1] : 1;
        const struct qweight q = {w->dtype, w->data, (const float *)s->data,
                                  (const float *)z->data, G};
        return gemm_quant(&o, (const float *)x->data, M, K, &q, N, b->data, b->dtype,
                          (float *)y->data);
    }
    return gemm(&o, (const float *)x->data, NULL, M, K, w->data, w->dtype, N, b->data, b->dtype,
                (float *)y->data);
}

mmrt_status cu_op_patch_embed(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cu_op o;
    struct mmrt_patch_params p;
    mmrt_status st = cu_op_begin(dev, args, MMRT_OP_PATCH_EMBED, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct cu_view *img = &o.src[0], *w = &o.src[1], *b = &o.src[2], *y = &o.dst;
    if ((st = cu_op_params(&o, &p, sizeof p)))
        return st;
    int64_t B = img->ne[0], C = img->ne[1], H = img->ne[2], W = img->ne[3], P = p.patch;
    int64_t O = w->ne[0], n_patches = (H / P) * (W / P);
    struct cu_prep_desc pd = {
        .img = (const float *)img->data, .C = C, .H = H, .W = W, .P = P, .n_px = W / P,
        .n_patches = n_patches,
    };
    return gemm(&o, NULL, &pd, B * n_patches, C * P * P, w->data, w->dtype, O, b->data, b->dtype,
                (float *)y->data);
}
