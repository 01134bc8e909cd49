/*
 * tests/ref_ops.h — plain double-precision reference implementations of the plugin operators
 * (semantics as documented at enum mmrt_op in plugin.h), used to check plugins.
 *
 * Inputs are host f32 arrays that already hold the exact values the device sees (weights
 * rounded to their dtype by the caller); every tensor is dense and contiguous in the shape
 * written next to it. Arithmetic is in double, so the reference is closer to the exact result
 * than any f32 kernel and a test measures only the kernel's own error. The exceptions are the
 * quantities the op defines in f32 (RoPE's inv_freq and angle, per Hugging Face), which the
 * reference computes in f32 too.
 */
#ifndef MMRT_TEST_REF_OPS_H
#define MMRT_TEST_REF_OPS_H

#include <stdint.h>

/* FP8 E4M3 (plugin.h, OCP e4m3fn) from its definition rather than by bit tricks, so the
 * plugins' conversions and mmrt_f8e4m3_to_f32 / mmrt_f32_to_f8e4m3 are checked against
 * something independent: a code's value is (−1)^s · 2^(e−7) · (1 + m/8), or 2^-6 · m/8 when
 * e = 0, NaN for 0x7F / 0xFF; encoding picks the nearer of the two codes around |f| (the even
 * one on a tie), saturating at ±448 (infinity too), NaN → 0x7F with f's sign. */
float ref_f8e4m3_value(uint8_t code);
uint8_t ref_f8e4m3_encode(float f);

/* y[M, N] = x[M, K] · w[N, K]ᵀ + b[N] (b may be NULL). */
void ref_matmul(const float *x, const float *w, const float *b, int64_t M, int64_t K, int64_t N,
                double *y);

/* What a U4 MATMUL weight stands for (plugin.h): codes [N, K/2] bytes in plugin.h's layout,
 * scale and zero [N, K / gs]; w[n, k] = (code − zero) · scale rounded once to f32, the value
 * the plugins multiply with. The nibbles are decoded here, not by core/quant.h, so a layout
 * mistake in the quantizer and in a kernel cannot cancel out. Written into w [N, K]. */
void ref_u4_dequant(const uint8_t *codes, const float *scale, const float *zero, int64_t N,
                    int64_t K, int64_t gs, float *w);

/* y[i] = a[i] (+ or ·) b[i % b_period]; mul selects ·. */
void ref_binary(const float *a, const float *b, int64_t n, int64_t b_period, int mul, double *y);

/* y = act(x) for op ∈ {GELU, GELU_TANH, QUICK_GELU, SILU, RELU2} (enum mmrt_op values). */
void ref_unary(int op, const float *x, int64_t n, double *y);

/* y = silu(g) · u. */
void ref_swiglu(const float *g, const float *u, int64_t n, double *y);

/* Per row of x [rows, n]: layer norm with biased variance; w, b may be NULL. */
void ref_layernorm(const float *x, const float *w, const float *b, int64_t rows, int64_t n,
                   double eps, double *y);

/* Per row: x / sqrt(mean(x²) + eps) · w; w may be NULL. */
void ref_rmsnorm(const float *x, const float *w, int64_t rows, int64_t n, double eps, double *y);

/* Per row: softmax(x · scale); −inf entries give 0; a row of only −inf gives zeros. */
void ref_softmax(const float *x, int64_t rows, int64_t n, double scale, double *y);

/* RoPE on x [T, H, D] with positions pos [T]; mode 0 = NEOX, 1 = INTERLEAVED. */
void ref_rope(const float *x, const int32_t *pos, int64_t T, int64_t H, int64_t D, int n_rot,
              int mode, float theta, double *y);

/* Multi-axis RoPE (ROPE_MULTI, NEOX pairing) on x [T, H, D] with positions pos [T, n_axes]:
 * pair i < n_rot/2 of section a (sections[0…n_axes) pairs each, in order) turns by
 * (f32)pos[t, a] · inv_freq[j], j = i, or i minus the section's first pair when restart, and
 * inv_freq[j] = 1 / powf(theta, (f32)(2j) / freq_dim) — both in f32 as at ROPE. */
void ref_rope_multi(const float *x, const int32_t *pos, int64_t T, int64_t H, int64_t D,
                    int n_rot, int freq_dim, int restart, int n_axes, const int *sections,
                    float theta, double *y);

/* Attention: q [T, Hq, D], k and v [S, Hkv, D], cu_q / cu_k [n_seq + 1] (NULL: one
 * sequence), y [T, Hq, D]. window > 0 (causal only): query i at position
 * p = i + (Lk − Lq) sees keys p − window < j ≤ p (plugin.h MMRT_OP_ATTENTION); 0 = none. */
void ref_attention(const float *q, const float *k, const float *v, int64_t T, int64_t S,
                   int64_t Hq, int64_t Hkv, int64_t D, const int32_t *cu_q, const int32_t *cu_k,
                   int n_seq, double scale, int causal, int64_t window, double *y);

/* Paged attention (ATTENTION_PAGED): q [T, Hq, D], k_pages and v_pages [n_pages,
 * page_tokens, Hkv, D], cu_q [n_seq + 1], kv_lens [n_seq], page_table [n_seq, max_pages]
 * (only the pages a sequence's kv_len needs are read); y [T, Hq, D]. Inputs must be valid. */
void ref_attention_paged(const float *q, const float *k_pages, const float *v_pages,
                         int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t page_tokens,
                         const int32_t *cu_q, const int32_t *kv_lens, const int32_t *page_table,
                         int64_t max_pages, int n_seq, double scale, int causal,
                         int64_t window, double *y);

/* Patch embedding: img [B, C, H, W], w [O, C, P, P], b [O] or NULL, y [B, (H/P)(W/P), O]. */
void ref_patch_embed(const float *img, const float *w, const float *b, int64_t B, int64_t C,
                     int64_t H, int64_t W, int64_t P, int64_t O, double *y);

/* Row scatter (SET_ROWS): y [R, n] holds dst's old contents on entry; for t = 0, 1, … every
 * in-range idx[t] gets row t of values [T, n] (so with equal indices the last one stays);
 * out-of-range indices write nothing. Rounding to dst's dtype is the caller's. */
void ref_set_rows(const float *values, const int32_t *idx, int64_t T, int64_t n, int64_t R,
                  double *y);

/* GATHER_HEADS, which plugin.h defines as an exact f32 computation, so the reference does
 * it in f32 in that order and its result is what every plugin must give bit for bit:
 * y[n, h, :] = the kept rows table[idx[n, h, g], h, :] (0 ≤ idx < R) summed in g order from
 * the first kept one, divided by their count c when c ≥ 2; +0 when none is kept.
 * table [R, H, D], idx [N, H, G], y [N, H, D]. */
void ref_gather_heads(const float *table, const int32_t *idx, int64_t R, int64_t H, int64_t D,
                      int64_t N, int64_t G, float *y);

/* L2_NORM: y[r] = sqrt(Σ x[r, k]²) over rows of x [rows, n]. */
void ref_l2_norm(const float *x, int64_t rows, int64_t n, double *y);

/* Index of the first maximum of row [n], NaN skipped, 0 when all are NaN. */
int32_t ref_argmax(const float *row, int64_t n);

#endif
