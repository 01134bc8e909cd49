/*
 * plugins/cuda/cuda_kernels.h — the plugin's own device code, callable from the C host code.
 *
 * Each launcher enqueues on `stream` and returns the launch status (cudaGetLastError after the
 * launch); a fault inside a kernel surfaces at the next synchronisation of that stream, as the
 * ABI says asynchronous errors do. Launchers trust their arguments: the host side
 * (cuda_ops*.c) has already checked shapes, dtypes, strides and bounds against the arena, so
 * what is left for the device to check is only what lives in device memory (token ids,
 * cu_seqlens, kv_lens, page ids), reported through struct cu_err_word.
 *
 * Files: cuda_kernels.cu (copies, elementwise, rows, rope, set_rows, gather_heads, l2_norm),
 * cuda_gemm.cu (GEMV, I8
 * and U4 GEMV, operand preparation for cuBLAS), cuda_attention.cu (flash attention).
 * Pointers are device addresses (arena base + offset); strides and extents are in elements
 * unless named nb.
 */
#ifndef MMRT_CUDA_KERNELS_H
#define MMRT_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef MMRT_CU_EMU
#include "emu/cu_emu.h"
#else
#include <cuda_runtime_api.h>
#endif

#include "mmrt/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device error word ------------------------------------------------------------------
 * One per device, in device memory, zero when nothing went wrong. A kernel that finds a bad
 * value in device memory claims the word with atomicCAS(code: 0 → its code) and, if it won,
 * fills in the details; later errors are dropped (the first one is what a user needs). The
 * host copies it back with every synchronize() and download() and turns a non-zero code into
 * MMRT_ERR_INVALID_ARG, then clears it. */
enum cu_err_code {
    CU_ERRC_NONE = 0,
    CU_ERRC_ROW_ID = 1,  /* GET_ROWS: v[0] = id, v[1] = row of ids, v[2] = table rows */
    CU_ERRC_SEQLENS = 2, /* ATTENTION: v[0] = 0 for cu_seqlens_q, 1 for _k; v[1] = entry;
                            v[2] = its value (bad start, decrease, or wrong total) */
    CU_ERRC_PAGED = 3,   /* ATTENTION_PAGED: v[0] = 0 cu_seqlens_q (v[1] entry, v[2] value),
                            1 kv_lens (v[1] sequence, v[2] value, v[3] max_pages,
                            v[4] page_tokens), 2 page_table (v[1] sequence, v[2] page id,
                            v[3] column, v[4] n_pages) */
};
struct cu_err_word {
    uint32_t code; /* enum cu_err_code */
    int32_t op;    /* enum mmrt_op of the kernel that set it */
    int64_t v[5];
};

/* memmove of nbytes on the device: dst and src may overlap in any way and need no
 * alignment. cudaMemcpyAsync leaves overlapping device-to-device copies undefined, and the
 * core moves data inside one arena (e.g. shifting a KV window), so copy() needs this. */
cudaError_t cu_move_bytes(void *dst, const void *src, size_t nbytes, cudaStream_t stream);

/* ---- elementwise (F32 contiguous; d may equal a, and b for SWIGLU) ---------------------- */

/* d[i] = a[i] (+ or ·) b[i % b_period]; b of weight dtype b_dtype. */
cudaError_t cu_launch_binary(float *d, const float *a, const void *b, int b_dtype, int64_t n,
                             int64_t b_period, int mul, cudaStream_t stream);
/* op: MMRT_OP_SCALE (uses scale), GELU, GELU_TANH, QUICK_GELU, SILU, RELU2, or SWIGLU
 * (d = silu(a) · b). */
cudaError_t cu_launch_unary(int op, float *d, const float *a, const float *b, int64_t n,
                            float scale, cudaStream_t stream);

/* ---- row ops (F32 contiguous rows of n; y may equal x) --------------------------------- */

/* LAYERNORM (rms = 0; w, b optional) or RMSNORM (rms = 1; w optional), weights of their own
 * dtype. */
cudaError_t cu_launch_norm(float *y, const float *x, const void *w, int w_dtype, const void *b,
                           int b_dtype, int64_t rows, int64_t n, float eps, int rms,
                           cudaStream_t stream);
cudaError_t cu_launch_softmax(float *y, const float *x, int64_t rows, int64_t n, float scale,
                              cudaStream_t stream);
cudaError_t cu_launch_argmax(int32_t *y, const float *x, int64_t rows, int64_t n,
                             cudaStream_t stream);
/* y[t, :] = table[ids[t], :] as f32; a bad id leaves row t untouched and sets *err. */
cudaError_t cu_launch_get_rows(float *y, const void *table, int dtype, int64_t V, int64_t n,
                               const int32_t *ids, int64_t T, struct cu_err_word *err,
                               cudaStream_t stream);

/* ---- COPY / CONCAT --------------------------------------------------------------------- */

/* dst[i…] = convert(src[i…]) over a 4-D index space (leading extents 1), any strides.
 * Same dtype copies raw bits (F32/I32 as 4 bytes, F16/BF16 as 2); the six float conversions
 * round to nearest even exactly like the CPU plugin. */
struct cu_copy_desc {
    const void *src;
    void *dst;
    int64_t ne[4];  /* extents, outermost first */
    int64_t snb[4]; /* source strides in elements */
    int64_t dnb[4]; /* destination strides in elements */
    int32_t sdt, ddt;
};
cudaError_t cu_launch_copy(const struct cu_copy_desc *d, cudaStream_t stream);

/* ---- ROPE, ROPE_MULTI ------------------------------------------------------------------ */

#define CU_ROPE_MAX_HALF 128 /* n_rot ≤ D ≤ 256 */
/* ROPE is the one-axis case of ROPE_MULTI, so both run one kernel: pair i belongs to the axis
 * a whose section [sec_end[a−1], sec_end[a]) holds it (sec_end cumulative; ROPE: n_axes 1,
 * sec_end[0] = n_rot / 2) and turns by pos[t · n_axes + a] · inv_freq[i]. */
struct cu_rope_desc {
    const float *x;
    float *y;
    const int32_t *pos; /* [T, n_axes] */
    int64_t T, H, D;
    int64_t xs0, xs1, ys0, ys1; /* token and head strides in elements (inner stride 1) */
    int32_t n_rot, mode;        /* ROPE_MULTI: mode NEOX */
    int32_t n_axes;             /* 1 … MMRT_ROPE_MAX_AXES (0 reads as 1) */
    int32_t sec_end[MMRT_ROPE_MAX_AXES];
    /* Per pair: 1/theta^(2j/freq_dim), j = i or i minus its section's start (ROPE_MULTI's
     * restart), computed on the host with the C library's powf: the angle pos · inv_freq
     * must equal the CPU plugin's bit for bit, and at positions near 10^5 one ulp of inv_freq
     * is already visible, so the device's own powf is not good enough. Passed by value, so a
     * captured graph carries its own copy. */
    float inv_freq[CU_ROPE_MAX_HALF];
};
cudaError_t cu_launch_rope(const struct cu_rope_desc *d, cudaStream_t stream);

/* ---- SET_ROWS -------------------------------------------------------------------------- */

/* dst[idx[t], k] = (dtype) src[t, k] for t < T, k < n; dst [R, n] of F32 (raw bits), F16,
 * BF16 (round to nearest even, as COPY) or F8E4M3 (saturating, plugin.h). An index outside
 * [0, R) writes nothing; a row whose index appears again later is skipped, so with
 * duplicates the last row wins whole. Reads idx only on the device: safe to capture.
 * I8 dst (ABI 1.7): each row of n = per · D is per innermost rows of D, each quantized
 * whole as plugin.h says (amax over the row, s = amax / 127, codes x / s rounded to even and
 * clamped to ±127), its scale written to scales[idx[t] · per + i]; scales is NULL and per,
 * D unused for every other dtype. */
cudaError_t cu_launch_set_rows(void *dst, int dtype, int64_t R, const float *src,
                               const int32_t *idx, int64_t T, int64_t n, float *scales,
                               int64_t per, int64_t D, cudaStream_t stream);

/* ---- GATHER_HEADS, L2_NORM (ABI 1.4) ----------------------------------------------------- */

/* For every output row it = n·H + h < rows (= N·H) of y [N, H, D]: the table rows
 * table[idx[it·G + g], h, :] (table [R, H, D] of dtype F32, F16, BF16, F8E4M3, or I8 with
 * scales [R · H]) whose index lies in [0, R), widened (exactly; I8: code · scales[r·H + h],
 * rounded once), summed from the first kept one in g order (__fadd_rn), then divided once by
 * their count when it is ≥ 2 (__fdiv_rn): the bits plugin.h fixes, the CPU plugin's. None
 * kept gives +0. One warp per output row. Reads idx only on the device: safe to capture.
 * scales is NULL unless the table is I8. */
cudaError_t cu_launch_gather_heads(float *y, const void *table, int dtype, const float *scales,
                                   int64_t R, int64_t H, int64_t D, const int32_t *idx,
                                   int64_t rows, int64_t G, cudaStream_t stream);
/* y[r] = sqrt(Σₖ x[r, k]²) for r < rows, x [rows, n] F32: one warp per row, the squares
 * (exact in double) summed in double. n = 0 gives 0. */
cudaError_t cu_launch_l2_norm(float *y, const float *x, int64_t rows, int64_t n,
                              cudaStream_t stream);

/* ---- GEMM support (cuda_gemm.cu) ------------------------------------------------------- */

/* Largest M the GEMV kernel takes; larger M goes to cuBLAS. */
#define CU_GEMV_MAX_M 8
/* y[M, N] = x[M, K] · w[N, K]ᵀ (+ b[N]) for M ≤ CU_GEMV_MAX_M: weights read once, in their
 * own dtype, products accumulated in f32 (decode: bandwidth-bound and as exact as the CPU). */
cudaError_t cu_launch_gemv(float *y, const float *x, const void *w, int w_dtype, const void *b,
                           int b_dtype, int64_t M, int64_t K, int64_t N, cudaStream_t stream);

/* Largest M the I8 GEMV takes (in groups of CU_GEMV_MAX_M rows): the batch-invariance line
 * of plugin.h, so every row of an I8 launch with M ≤ 32 is the row alone, bit for bit. */
#define CU_GEMV_I8_MAX_M 32
/* y[M, N] = (x[M, K] · q[N, K]ᵀ) · scale[N] (+ b[N]) for M ≤ CU_GEMV_I8_MAX_M, q the I8 codes
 * of a quantized weight (plugin.h MATMUL): codes read once per row group, 16 at a time when
 * aligned, sums in f32 in an order fixed by K alone, then one rounded multiply by the row's
 * scale and one rounded add of the bias. */
cudaError_t cu_launch_gemv_i8(float *y, const float *x, const int8_t *w, const float *scale,
                              const void *b, int b_dtype, int64_t M, int64_t K, int64_t N,
                              cudaStream_t stream);
/* dst[i] = the f16 bits of code src[i] for i < n: exact (integers of magnitude ≤ 128), so
 * cuBLAS can multiply a block of an I8 weight on the F16 route with nothing rounded. */
cudaError_t cu_launch_i8_to_f16(uint16_t *dst, const int8_t *src, int64_t n,
                                cudaStream_t stream);
/* y[m, n] = y[m, n] · scale[n] (+ b[n]) for m < M, n < N (b NULL: no bias): the I8 GEMM's
 * epilogue on the finished f32 sums. */
cudaError_t cu_launch_scale_cols(float *y, const float *scale, const void *b, int b_dtype,
                                 int64_t M, int64_t N, cudaStream_t stream);

/* y[M, N] = x[M, K] · W[N, K]ᵀ (+ b[N]) for M ≤ CU_GEMV_I8_MAX_M with W a U4 weight (plugin.h
 * MATMUL): w the packed codes [N, K/2] bytes, K a multiple of 32, scale and zero [N, G] with
 * K / G a multiple of 32. Codes read once per row group, 16 bytes (one block of 32) at a time
 * when aligned; per block Σ x · (code − zero) in k order, times the group's scale, summed in
 * f32 in an order fixed by K; the rows of an M ≤ 32 launch are the rows alone, bit for bit. */
cudaError_t cu_launch_gemv_u4(float *y, const float *x, const uint8_t *w, const float *scale,
                              const float *zero, int64_t G, const void *b, int b_dtype,
                              int64_t M, int64_t K, int64_t N, cudaStream_t stream);
/* dst[r, k] = the f16 bits of (code − zero) · scale / rowscale[r] for rows r < rows of a U4
 * weight (w [rows, K/2], scale and zero [rows, G]), rowscale[r] being the power of two that
 * brings row r into [−1, 1] (1 for a row of zeros), written too: the large-M U4 route's
 * operand for the F16 GEMM, whose epilogue (scale_cols with rowscale) undoes the factor. */
cudaError_t cu_launch_u4_to_f16(uint16_t *dst, float *rowscale, const uint8_t *w,
                                const float *scale, const float *zero, int64_t G, int64_t K,
                                int64_t rows, cudaStream_t stream);

/* Writes rows [r0, r0 + rows) of the GEMM's left operand A [M, K] into hi (and lo), as
 * out_dtype: A is x [M, K] (x != NULL) or the im2col rows of a PATCH_EMBED image (img).
 *   out F32:        hi = a                                   (patches for F32 weights)
 *   out F16 / BF16: hi = round(a · hi_scale)                  (one rounding)
 *          split:   lo = round((a − hi / hi_scale) · lo_scale) (what hi missed)
 * so that a ≈ hi / hi_scale + lo / lo_scale, which the caller undoes with cuBLAS alphas. */
struct cu_prep_desc {
    const float *x;   /* [M, K], or NULL for patches */
    const float *img; /* [B, C, H, W] when x == NULL */
    int64_t C, H, W, P, n_px, n_patches;
    int64_t r0, rows, K;
    int32_t out_dtype, split;
    float hi_scale, lo_scale;
    void *hi, *lo; /* [rows, K] each, contiguous */
};
cudaError_t cu_launch_prep(const struct cu_prep_desc *d, cudaStream_t stream);
/* y[r, :] = b (or 0 when b == NULL) for r < M: the bias the GEMMs then add onto (beta = 1). */
cudaError_t cu_launch_fill_rows(float *y, const void *b, int b_dtype, int64_t M, int64_t N,
                                cudaStream_t stream);

/* ---- ATTENTION, ATTENTION_PAGED (cuda_attention.cu) ------------------------------------- */

/* ATTENTION: k, v [S, Hkv, D] strided. ATTENTION_PAGED (page_table != NULL): k, v
 * [n_pages, page_tokens, Hkv, D] contiguous, k_s0 / k_s1 the token and head strides inside a
 * page and k_sp the page stride; cu_q must be set and cu_k is unused. I8 pages (ABI 1.7)
 * come with k_scales / v_scales, one f32 per row of D: each code is widened to code · scale
 * (one rounded product), then everything is as for F32 pages holding those values. */
struct cu_attn_desc {
    const float *q;           /* [T, Hq, D] contiguous */
    const void *k, *v;        /* [S, Hkv, D] F32, F16 or F8E4M3 (paged also I8), inner dim
                                 contiguous */
    float *y;                 /* [T, Hq, D] contiguous */
    const int32_t *cu_q, *cu_k; /* [n_seq + 1] in device memory, or both NULL */
    int64_t T, S;
    int64_t k_s0, k_s1, v_s0, v_s1; /* token and head strides in elements */
    int32_t Hq, Hkv, D, n_seq;
    int32_t k_dtype, v_dtype, causal;
    int32_t window;     /* sliding window in key positions (causal only); 0 = none */
    float scale;
    float *ws;          /* split-KV workspace, ws_floats floats (may be NULL / 0) */
    int64_t ws_floats;
    int32_t n_sm;       /* multiprocessors, to size the split */
    struct cu_err_word *err;
    /* ATTENTION_PAGED only (device memory): kv_lens [n_seq], page_table [n_seq, max_pages] */
    const int32_t *kv_lens, *page_table;
    int64_t max_pages, page_tokens, n_pages;
    int64_t k_sp, v_sp;  /* page strides in elements */
    /* I8 pages only (device memory): [n_pages · page_tokens · Hkv] each, the scale of (page,
     * row r, kv head g) at (page · page_tokens + r) · Hkv + g; NULL otherwise. */
    const float *k_scales, *v_scales;
};
/* Kernel shared-memory limits are raised once per device (cudaFuncSetAttribute) before the
 * first launch; call after cudaSetDevice. */
cudaError_t cu_attention_init(void);
/* Either op; a paged one first runs the index check that sets CU_ERRC_PAGED, and writes
 * nothing when the error word is set. */
cudaError_t cu_launch_attention(const struct cu_attn_desc *d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
