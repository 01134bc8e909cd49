/*
 * tests/op_cases.h — what the operator tests of the plugins (test_cpu_ops.c,
 * test_opencl_ops.c, test_cuda_ops.c) share: per-case bookkeeping of host buffers and device
 * tensors, the seeded random values, dtype rounding, the closeness measure, a tensor held on
 * two plugins at once (the device under test and the CPU plugin, the same bytes on both), and
 * the case tables with their runners that the two device tests run alike (ROPE_MULTI,
 * SET_ROWS).
 *
 * Every helper fails the current cmocka test on error (assert_*, fail_msg), so callers never
 * see a NULL. Everything a helper allocates lives until op_release_all(), which each case
 * calls when it is done. Not thread-safe: the bookkeeping, the random state and the pair of
 * harnesses (op_pair_init) are process globals, one test program each.
 *
 * Include <setjmp.h>, <stdarg.h>, <stddef.h> and <cmocka.h> first, as every cmocka test does.
 */
#ifndef MMRT_TEST_OP_CASES_H
#define MMRT_TEST_OP_CASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plugin_harness.h"

/* SHAPE(2, 3, 4) expands to "n_dims, ne" for the helpers that take a shape. */
#define SHAPE(...)                                                                             \
    (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }

/* F32, F16, BF16: the dtypes a weight (and a SET_ROWS destination) may have. */
extern const enum mmrt_dtype op_weight_dtypes[3];
/* What a KV cache table may be (SET_ROWS dst, GATHER_HEADS table): the weight dtypes, then
 * F8E4M3 (ABI 1.6; run only where op_checks.kv_f8). */
extern const enum mmrt_dtype op_kv_table_dtypes[4];

/* ---- bookkeeping ------------------------------------------------------------------------ */

/* A zeroed host buffer of nbytes (at least 1), freed by op_release_all. */
void *op_alloc(size_t nbytes);

/* A contiguous tensor on harness h that owns its arena, freed by op_release_all. */
struct harness_tensor *op_tensor_new(struct harness *h, enum mmrt_dtype dt, int n_dims,
                                     const int64_t *ne);

/* Frees every buffer and tensor allocated since the last call (tensors first). */
void op_release_all(void);

/* A view into base's arena (freed with base, never on its own): extents ne, byte strides nb,
 * byte offset added to base's. Returned by value; the harness only reads the descriptor. */
struct harness_tensor op_view(const struct harness_tensor *base, enum mmrt_dtype dt, int n_dims,
                              const int64_t *ne, const int64_t *nb, uint64_t offset);

/* Number of elements of t's extents. */
int64_t op_numel(const struct harness_tensor *t);

/* A double buffer of n (at least 1) for a reference result. */
double *op_ref_buf(int64_t n);

/* ---- random values: splitmix64, fixed seeds --------------------------------------------- */

/* Restarts the stream: state = seed · 0x9E3779B97F4A7C15 + stream, stream 1 unless
 * op_rng_stream changed it (test_cuda_ops draws stream 7, as it always has). */
void op_rng_seed(uint64_t seed);
void op_rng_stream(uint64_t stream);
/* The stream's state, to resume it after a helper that reseeds. */
uint64_t op_rng_save(void);
void op_rng_restore(uint64_t state);
uint64_t op_rng_u64(void);
float op_rng_f(float lo, float hi);          /* [lo, hi) */
int op_rng_int(int lo, int hi);              /* [lo, hi] */
float *op_rand_f(int64_t n, float lo, float hi); /* n values in [lo, hi), op_alloc'ed */

/* ---- values in a dtype ------------------------------------------------------------------- */

/* Rounds v[0..n) in place to what a tensor of dtype dt stores (F16, BF16; others unchanged). */
void op_round_to(enum mmrt_dtype dt, float *v, int64_t n);

/* Host bytes of v[0..n) in dtype dt: F32 and I32 copied as they are, F16/BF16 converted
 * (round to nearest even); op_alloc'ed. */
void *op_encode(enum mmrt_dtype dt, const float *v, int64_t n);

/* Values an I8 store with row scales (plugin.h) holds exactly: each of the `rows` rows of D
 * in v gets random codes (one of them ±127) times a scale near amp / 127 for which
 * mmrt_ref_i8_row_quantize gives back that scale and those codes, so the floats, their codes and
 * scales, and every reference on the floats agree bit for bit. */
void op_i8_exact_rows(float *v, int64_t rows, int64_t D, float amp);
/* The codes (returned) and scales (*scales, rows of them) of v's rows by
 * mmrt_ref_i8_row_quantize; a row holding NaN (the cases' poison) becomes codes 0 and scale NaN,
 * which reads back as NaN. Fails unless each row reads back as v bit for bit (v from
 * op_i8_exact_rows). op_alloc'ed. */
int8_t *op_i8_encode(const float *v, int64_t rows, int64_t D, float **scales);

/* A quantized MATMUL weight (plugin.h: I8 codes with one F32 scale per row), made by the
 * runtime's own quantizer (core/quant.h) from random values whose rows differ in magnitude
 * (row r in ±(hi · 2^-(r mod 7))), with every seventh row all zero; op_alloc'ed host copies of
 * the codes [N·K], the scales [N] and the values they stand for, q·s [N·K] (what a
 * reference multiplies by). */
struct op_qmatrix {
    int8_t *q;
    float *scale;
    float *deq;
};
void op_quantize_i8(int64_t N, int64_t K, float hi, struct op_qmatrix *out);

/* The same for a U4 weight (plugin.h: packed 4-bit codes with an F32 scale and zero point
 * per group of gs weights of a row), made by core/quant.h from the same kind of rows; the
 * codes [N·K/2] bytes, scales and zero points [N·K/gs], and what they stand for (ref_ops.c's
 * ref_u4_dequant) [N·K]. */
struct op_q4matrix {
    uint8_t *q;
    float *scale, *zero;
    float *deq;
};
void op_quantize_u4(int64_t N, int64_t K, int64_t gs, float hi, struct op_q4matrix *out);

/* What COPY stores for one element converted from sdt to ddt (the harness conversions; I32
 * only to I32). */
void op_convert_one(enum mmrt_dtype sdt, const void *s, enum mmrt_dtype ddt, void *d);
/* Equal bits, or both NaN (NaN payloads are not specified). */
bool op_same_value(enum mmrt_dtype dt, const void *a, const void *b);

/* Closeness of a case: max |got − want| / max |want| (1 when want is all zero); NaN must
 * match NaN. Fails the test, naming `what`, the worst element and the tolerance, when the
 * ratio is above tol; returns it otherwise. */
double op_check_close(const char *what, const float *got, const double *want, int64_t n,
                      double tol);

/* The view test shapes use for "heads of a fused buffer": x [T, H, D] as heads [1, 1 + H) of
 * a [T, H + 2, D] f32 buffer whose other heads hold NaN (so a read outside the view poisons
 * the result). op_fused_heads builds that buffer's host values; op_heads_view views heads
 * [1, 1 + H) of the buffer's tensor. */
float *op_fused_heads(const float *x, int64_t T, int64_t H, int64_t D);
struct harness_tensor op_heads_view(const struct harness_tensor *buf, int64_t T, int64_t H,
                                    int64_t D);

/* ---- one tensor on two plugins ------------------------------------------------------------ */

enum { OP_DUT = 0, OP_CPU = 1 };

/* t[OP_DUT] on the device under test, t[OP_CPU] on the CPU plugin: the same shape, dtype,
 * strides and (after op_pair_upload) bytes. */
struct op_pair {
    struct harness_tensor t[2];
};

/* The two harnesses every op_pair_* call uses, opened by the caller; dut_name names the
 * device under test in failure messages ("opencl", "cuda", …). Borrowed until the end. */
void op_pair_init(struct harness *dut, struct harness *cpu, const char *dut_name);
const char *op_pair_dut_name(void);

struct op_pair *op_pair_new(enum mmrt_dtype dt, int n_dims, const int64_t *ne);
struct op_pair op_pair_view(const struct op_pair *base, enum mmrt_dtype dt, int n_dims,
                            const int64_t *ne, const int64_t *nb, uint64_t offset);
struct op_pair op_pair_heads_view(const struct op_pair *buf, int64_t T, int64_t H, int64_t D);
int64_t op_pair_numel(const struct op_pair *p);

/* The same host bytes (p's dtype, contiguous) to both plugins. */
void op_pair_upload(struct op_pair *p, const void *bytes);
/* Rounds v to p's dtype in place (so a reference sees the device's values) and uploads. */
void op_pair_upload_f32(struct op_pair *p, float *v);
/* A new pair of random values in [lo, hi) rounded to dt; *host gets the values. */
struct op_pair *op_pair_rand(enum mmrt_dtype dt, float lo, float hi, float **host, int n_dims,
                             const int64_t *ne);
/* A new 1-D I32 pair holding v[0..n). */
struct op_pair *op_pair_i32(const int32_t *v, int64_t n);

/* The whole base tensor of plugin d (OP_DUT / OP_CPU), op_alloc'ed; both at once. */
void *op_pair_download(int d, struct op_pair *p);
void op_pair_download_both(struct op_pair *p, void **dut, void **cpu);

/* Launches op on plugin d with that plugin's halves of the pairs (NULL sources stay NULL). */
mmrt_status op_pair_run_on(int d, enum mmrt_op op, struct op_pair *const *src, int n_src,
                           struct op_pair *dst, const void *params, uint32_t params_size);
/* Launches on both plugins; fails with the plugin's last_error unless both succeed. */
void op_pair_run(enum mmrt_op op, struct op_pair *const *src, int n_src, struct op_pair *dst,
                 const void *params, uint32_t params_size);

/* ---- cases both device tests run ----------------------------------------------------------- */

/* How a device test judges a case, so each keeps its own measure and closing table. */
struct op_checks {
    /* dut and cpu (n floats) against the double reference, held to tol. */
    void (*close)(enum mmrt_op op, const char *what, const float *dut, const float *cpu,
                  const double *ref, int64_t n, double tol);
    /* dut and cpu must both equal want, byte for byte. */
    void (*bytes)(enum mmrt_op op, const char *what, const void *dut, const void *cpu,
                  const void *want, size_t nbytes);
    bool big; /* also the model-sized cases (seconds on a CPU-side device) */
    bool kv_f8; /* the device under test takes F8E4M3 K/V (ABI 1.6): its FP8 cases run too */
    bool kv_i8; /* … and I8 stores with row scales (ABI 1.7): SET_ROWS, GATHER_HEADS and
                   ATTENTION_PAGED run their I8 cases */
};

/* ROPE over op_pair, held to tol: NEOX and INTERLEAVED, partial rotation (Persimmon-like),
 * positions up to 131072 and not monotonic (like packed sequences), head dims 2 … 256, a
 * tail wider than a work-group, in place and a head view of a fused buffer. */
void op_case_rope(const struct op_checks *chk, double tol);

/* ROPE_MULTI over op_pair: Qwen2-VL's decoder M-RoPE and vision 2-D rotary, empty sections,
 * four axes, a copied tail wider than a work-group, in place and a head view of a fused
 * buffer (whose other heads must stay NaN), held to tol; then one axis with sections
 * {n_rot/2} and freq_dim n_rot, bit for bit equal to ROPE NEOX on the device under test. */
void op_case_rope_multi(const struct op_checks *chk, double tol);

/* SET_ROWS over op_pair, exact, into every dst dtype: KV-cache shapes, one decode token, rows
 * longer than a work-group or block, a 1-D dst, a prefill-sized scatter; indices out of
 * range (nothing written) and repeated (the last row wins whole); a sentinel in every row
 * nobody writes. Then the decode pattern: the same launch after a new index upload. */
void op_case_set_rows(const struct op_checks *chk);

/* An I8 MATMUL weight on both plugins: op_quantize_i8(N, K, hi, qm), the codes uploaded as an
 * I8 [N, K] pair (returned) and the scales as an F32 [N] pair (*scales). */
struct op_pair *op_pair_quantized(int64_t N, int64_t K, float hi, struct op_qmatrix *qm,
                                  struct op_pair **scales);

/* MATMUL with I8 weights over op_pair (plugin.h, ABI 1.3), against the double reference on
 * the dequantized weights: shapes on both sides of every small-M line (4, 8, 32), K and N tails
 * off every vector width and tile, rows of different scales and zero rows, bias none / F16 /
 * F32, K = 0, W and scales at odd offsets inside bigger arenas; held to tol_small for M ≤ 32
 * and tol_large above (big cases only with checks.big). Then batch invariance: for
 * 1 < M ≤ 32, rows launched alone give the bits of the batch on the device under test and on
 * the CPU plugin. Then the launches the contract forbids, refused on both plugins with
 * MMRT_ERR_INVALID_ARG and a message naming MATMUL and the operand: an I8 W without scales,
 * scales with an F16 W, scales of the wrong length and of the wrong dtype. */
void op_case_matmul_i8(const struct op_checks *chk, double tol_small, double tol_large);

/* A U4 MATMUL weight on both plugins: op_quantize_u4(N, K, gs, hi, qm), the codes uploaded as
 * a U4 [N, K/2] pair (returned), scales and zero points as F32 [N, K/gs] pairs. */
struct op_pair *op_pair_quantized_u4(int64_t N, int64_t K, int64_t gs, float hi,
                                     struct op_q4matrix *qm, struct op_pair **scales,
                                     struct op_pair **zeros);

/* MATMUL with U4 weights over op_pair (plugin.h, ABI 1.3), against the double reference on
 * the dequantized weights: groups of 32, 64 and 128 (and one group per row), M on both sides
 * of every small-M line (1, 3, 4, 5, 8, 32, 33, 70 …), N off every tile and work-group, bias
 * none / F16 / F32, W, scales and zero points at odd offsets inside bigger arenas; held to
 * tol_small for M ≤ 32 and tol_large above (big cases only with checks.big). Rows of an
 * M ≤ 32 launch give the bits of the row alone on both plugins. Then the launches the
 * contract forbids, refused on both plugins with MMRT_ERR_INVALID_ARG and a message naming
 * MATMUL and the operand: scales or zero points absent, a group size that is not a multiple
 * of 32 or does not divide K, K not a multiple of 32, scales or zero points of the wrong
 * shape or dtype, zero points with a float W. */
void op_case_matmul_u4(const struct op_checks *chk, double tol_small, double tol_large);

/* ATTENTION's batch invariance (plugin.h): each sequence of a packed launch (images of a
 * vision batch; prefill chunks with a past, GQA, decode rows) run again alone, without
 * cu_seqlens, gives the bits of its rows in the packed launch, on the device under test and
 * on the CPU plugin. */
void op_case_attention_packed(void);

/* ---- ATTENTION_PAGED ------------------------------------------------------------------------ */

/* How a case places its sequences' keys in the page pool. */
enum op_page_order {
    OP_PAGES_IN_ORDER, /* sequence after sequence, pages in key order, table rows full */
    OP_PAGES_SHUFFLED, /* the same pages at random places of the pool */
    OP_PAGES_SHARED,   /* shuffled, and every odd sequence starts with the full pages of
                          sequence 0 (a shared prefix: the same page ids, the same keys) */
};

struct op_paged_case {
    int Hq, Hkv, D, page_tokens;
    int n_seq;
    int32_t lq[8], lk[8]; /* queries and keys of each sequence */
    int causal;
    enum mmrt_dtype kv_dtype; /* both pools: F32, F16, F8E4M3 or I8 (with row scales) */
    enum op_page_order order;
    float q_amp;              /* |q| range: larger makes softmax peakier */
    int window;               /* sliding window (causal only); 0 = none */
};

/* A case's host values. The pool's spare pages and the rows past each sequence's last key
 * hold NaN and the table's entries past a sequence's last page hold INT32_MAX, so reading
 * anything the op must not read poisons the result. With a window, so do (k and v alike)
 * each sequence's keys before the first one its first query sees, which no query sees: a
 * plugin must skip them, not read and mask them (except in OP_PAGES_SHARED cases, whose
 * sequences share the prefix pages). k and v hold the same keys gathered in
 * key order, cu_k their sequence offsets: what ATTENTION (and ref_attention) take. All
 * buffers are op_alloc'ed. */
struct op_paged_data {
    int64_t T, S, n_pages, max_pages;
    int32_t cu_q[9], cu_k[9], kv_lens[8];
    int32_t *table;            /* [n_seq, max_pages] */
    float *q;                  /* [T, Hq, D] */
    float *k_pages, *v_pages;  /* [n_pages, page_tokens, Hkv, D], rounded to kv_dtype */
    const float *k, *v;        /* [S, Hkv, D] */
    float scale;               /* 1 / sqrt(D) */
};

/* Draws a case's values from seed and lays them out (n_seq ≤ 8). */
void op_paged_build(const struct op_paged_case *pc, uint64_t seed, struct op_paged_data *d);
/* Sequence seq of (pc, d) alone: its queries and keys, the same values, in a pool of
 * page_tokens-token pages in shuffled order; *apc and *ad get the case and its data. */
void op_paged_alone(const struct op_paged_case *pc, const struct op_paged_data *d, int seq,
                    int page_tokens, struct op_paged_case *apc, struct op_paged_data *ad);
/* The cases every plugin's test runs: page sizes 1, 3 and 16, ragged last pages, pages
 * shared by two sequences, shuffled tables, decode and prefill-chunk sequences in one launch,
 * sequences without queries or without keys, F32 and F16 pools, GQA, causal and
 * bidirectional, odd and generic head dims. Each names a sequence to run again alone in
 * pages of alone_pt tokens (batch invariance); big ones are skipped when checks.big is off. */
struct op_paged_entry {
    struct op_paged_case pc;
    int alone_seq, alone_pt;
    bool big;
};
extern const struct op_paged_entry op_paged_cases[];
extern const size_t op_n_paged_cases;

/* Fails unless every element whose reference is exactly 0 (a query that sees no key) is
 * exactly 0. */
void op_paged_zero_rows(const char *what, const float *got, const double *ref, int64_t n);

/* Fails the test, naming `what`, unless n floats are equal bit for bit. */
void op_paged_same_bits(const char *what, const float *batch, const float *alone, int64_t n);

/* A case's tensors on both plugins (q, k_pages, v_pages, cu_seqlens_q, kv_lens, page_table;
 * dst) and its params, uploaded but not run. */
struct op_paged_pairs {
    struct op_pair *src[8], *y; /* src[6], src[7]: an I8 case's k and v scales */
    int n_src;
    struct mmrt_attention_params p;
};
void op_paged_pairs(const struct op_paged_case *pc, const struct op_paged_data *d,
                    struct op_paged_pairs *pp);

/* Index values a plugin must refuse, fed to a launch of op_paged_bad_case (two sequences of
 * 6 and 5 keys in pages of 4, so each table row is [p, p, unused]): the tensor (3
 * cu_seqlens_q, 4 kv_lens, 5 page_table), the entry (sequence, and column for the table) set
 * to value, and what every plugin's message must contain. The last one is a kv_len of
 * max_pages · page_tokens, which makes the unused column a page read. */
struct op_paged_bad {
    int which, seq, col;
    int32_t value;
    const char *needle;
};
extern const struct op_paged_case op_paged_bad_case;
extern const struct op_paged_bad op_paged_bad[];
extern const size_t op_n_paged_bad;
/* A launch of op_paged_bad_case on one harness, dst holding a sentinel; set_bad uploads
 * op_paged_bad[b]'s indices (b = op_n_paged_bad: the valid ones), untouched fails unless dst
 * still holds the sentinel. */
struct op_paged_bad_run {
    struct op_paged_data d;
    struct harness_tensor *src[8], *y;
    struct mmrt_attention_params p;
    float *sentinel;
    int64_t n; /* dst elements */
};
void op_paged_bad_setup(struct harness *h, struct op_paged_bad_run *r);
void op_paged_bad_set(struct harness *h, struct op_paged_bad_run *r, size_t b);
void op_paged_bad_untouched(struct harness *h, const struct op_paged_bad_run *r);

/* The tensors of a paged launch of (pc, d) on harness h alone, all uploaded: src = q,
 * k_pages, v_pages, cu_seqlens_q, kv_lens, page_table, and (src has room for 8) the k and v
 * scales of I8 pages, NULL for other dtypes; *y the dst. */
void op_paged_tensors(struct harness *h, const struct op_paged_case *pc,
                      const struct op_paged_data *d, struct harness_tensor **src,
                      struct harness_tensor **y);

/* A paged launch captured as a graph on h (a device with graphs on) must read its index
 * tensors at every replay: new cu_seqlens_q, kv_lens and table rows uploaded before
 * graph_launch give the bits an eager launch with them gives, in any order, and a bad page id
 * uploaded before a replay fails that replay (at graph_launch or the next synchronize) and is
 * then cleared. Works on h alone; releases what it allocated. */
void op_paged_graph_replay(struct harness *h);

/* op_paged_cases over op_pair, held to tol (rows that see no key exactly 0); then batch
 * invariance: each case's named sequence run alone, with another page size and another page
 * order, must give the same bits on the device under test (and on the CPU plugin). */
void op_case_attention_paged(const struct op_checks *chk, double tol);

/* ---- GATHER_HEADS, L2_NORM (ABI 1.4) ------------------------------------------------------ */

/* A GATHER_HEADS case: table [R, H, D], idx [N, H, G]. reversed (G = 1, N = 2R): the groups
 * of head h name rows R−1, R−2, …, 0 and then the same again — every row twice, in an order
 * unlike the table's. big cases only with checks.big. */
struct op_gather_case {
    int64_t R, H, D, N, G;
    bool reversed, big;
};
extern const struct op_gather_case op_gather_cases[];
extern const size_t op_n_gather_cases;

/* A case's host values, op_alloc'ed: table [(R + 2)·H·D] rounded to dt, its first value −0
 * (which a G = 1 copy keeps) and its two rows past R NaN (read only by a kernel that fails to
 * skip an entry ≥ R); idx [N·H·G]: G = 1 draws rows with repeats (group H, the next token of
 * head 0, repeats group 0), G > 1 keeps 1 … G rows per group with −1 padding in random places;
 * group 2 is padding only (−1 and INT32_MIN: zeros), every seventh group holds an entry R or
 * R + 1 and every eleventh INT32_MAX, −1 or INT32_MIN in turn, all skipped like padding (the
 * reversed case has none of these: it reads every row twice); want [N·H·D] is
 * ref_gather_heads, the bits every plugin must give. */
struct op_gather_data {
    float *table;
    int32_t *idx;
    float *want;
};
void op_gather_build(const struct op_gather_case *gc, enum mmrt_dtype dt, uint64_t seed,
                     struct op_gather_data *d);

/* GATHER_HEADS over op_pair, bit-exact against want for every case and table dtype (the
 * table a view of the first R rows of its allocation, dst prefilled with NaN so a group of
 * padding must write its zeros); then one launch again after a new idx upload (the indices
 * are read from device memory at each launch). */
void op_case_gather_heads(const struct op_checks *chk);

/* L2_NORM shapes; src [ne…], dst [rows]. */
struct op_l2_case {
    int n_dims;
    int64_t ne[3];
    bool big;
};
extern const struct op_l2_case op_l2_cases[];
extern const size_t op_n_l2_cases;
/* rows·n values from the random stream: row r in ±2^((r mod 41) − 20), every fifth row
 * zero; op_alloc'ed. */
float *op_l2_values(int64_t rows, int64_t n);
/* Fails unless every got[r] is within tol · ref[r] of ref[r] (so rows of every magnitude are
 * judged on their own scale) and exactly 0 where ref[r] is 0. */
void op_l2_rows_close(const char *what, const float *got, const double *ref, int64_t rows,
                      double tol);

/* L2_NORM over op_pair: chk->close against ref_l2_norm with tol, then op_l2_rows_close on
 * the device under test. */
void op_case_l2_norm(const struct op_checks *chk, double tol);

/* Launches of GATHER_HEADS and L2_NORM that plugin.h rules out, on h alone: each must be
 * MMRT_ERR_INVALID_ARG with a message naming the op and the operand (the in-tree plugins
 * word them alike). Releases what it allocated. */
void op_gather_l2_refusals(struct harness *h);

#endif
