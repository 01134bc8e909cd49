/*
 * mmrt/plugin.h — the device plugin ABI. This is the only header a vendor plugin includes
 * (it pulls in mmrt/common.h for statuses and dtypes).
 *
 * A plugin is a shared object that exports exactly one symbol, MMRT_PLUGIN_ENTRY_NAME:
 *
 *     const struct mmrt_plugin *mmrt_plugin_init(const struct mmrt_host *host);
 *
 * Build it with -fvisibility=hidden and mark the entry with MMRT_PLUGIN_EXPORT. The entry
 * returns a pointer to a static, immutable struct mmrt_plugin (or NULL after logging why
 * through host->log). The core never calls into a plugin before the entry returns, and the
 * plugin never links against core symbols: everything it needs from the host arrives in
 * struct mmrt_host.
 *
 * Versioning (the SQLite VFS / ONNX Runtime way)
 *   Every struct that crosses the boundary starts with struct mmrt_abi_header. A plugin whose
 *   abi_major differs from the host's is refused. Minor versions only append members at the
 *   end of a struct; the reader copies min(struct_size, its own sizeof) into a zeroed copy, so
 *   a member the writer did not know reads as NULL / 0 and gets its documented default.
 *   Op parameter structs are versioned the same way through mmrt_op_args.params_size.
 *   Operators are added by appending to enum mmrt_op; an op whose semantics change gets a new
 *   enum value, so a plugin built against an older header can never silently compute the old
 *   meaning of an op. Such a plugin's n_ops is its header's MMRT_OP_COUNT, so the ops added
 *   since read as NULL (not supported) and a placement or launch that needs them is refused
 *   by name; nothing else changes for it.
 *
 * Memory addressing
 *   Device memory is a set of arenas that the plugin hands out (arena_alloc). The core
 *   sub-allocates them with its buddy pool, so every device address is a pair
 *   (arena handle, byte offset) — a host pointer for the CPU plugin, a cl_mem for OpenCL, a
 *   device pointer for CUDA. The core never dereferences an arena handle.
 *
 * Ordering and threads
 *   Each device is an in-order queue: uploads, copies and kernels are executed in the order
 *   they are issued, and each sees the results of everything issued before it. They may run
 *   asynchronously; download() and synchronize() return only when everything issued before
 *   them is complete. upload() may return before the copy is done but must not read `src`
 *   after returning (stage it if needed). A device is used by one host thread at a time (the
 *   core serialises); different devices may be driven from different threads concurrently.
 *
 * Errors
 *   Every fallible member returns mmrt_status and, on failure, leaves a human-readable detail
 *   retrievable with last_error(dev) until the next call on that device. An error raised
 *   asynchronously by a kernel is reported by the next synchronize() or download(). The two
 *   members that run before a device exists, probe() and device_open(), have no device to
 *   hold the detail, so they write it into the caller's buffer instead; that is the only
 *   other channel. A launch refused for breaking the operator contract carries
 *   op_contract.h's message, the same one the core would have given.
 */
#ifndef MMRT_PLUGIN_H
#define MMRT_PLUGIN_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "mmrt/common.h"

#ifdef __cplusplus
extern "C" {
#define MMRT_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define MMRT_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define MMRT_ABI_MAJOR 1
#define MMRT_ABI_MINOR 7

#define MMRT_PLUGIN_ENTRY_NAME "mmrt_plugin_init"

#if defined(__GNUC__)
#define MMRT_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define MMRT_PLUGIN_EXPORT
#endif

/* First member of every struct that crosses the plugin boundary. */
struct mmrt_abi_header {
    uint16_t abi_major;   /* MMRT_ABI_MAJOR the writer was built against */
    uint16_t abi_minor;   /* MMRT_ABI_MINOR the writer was built against */
    uint32_t struct_size; /* sizeof the struct as the writer knew it, in bytes */
};

#define MMRT_ABI_HEADER_INIT(type) \
    { MMRT_ABI_MAJOR, MMRT_ABI_MINOR, (uint32_t)sizeof(type) }

/* ----------------------------------------------------------------------------------------
 * Host services, passed to the entry point. Valid until the plugin is unloaded.
 */
struct mmrt_host {
    struct mmrt_abi_header hdr;
    /* Opaque host pointer, passed back as the first argument of every host callback. */
    void *user;
    /* Log sink (required, never NULL). `plugin` is the plugin's name, `message` one line
     * without a trailing newline. Thread-safe. Plugins never print on their own. */
    void (*log)(void *user, enum mmrt_log_level level, const char *plugin, const char *message);
};

/* ----------------------------------------------------------------------------------------
 * Tensors as kernels see them: a strided view of device memory.
 */
#define MMRT_MAX_DIMS 4
#define MMRT_MAX_SRC 6     /* slots of mmrt_op_args.src (ABI 1.0): sources 0 … 5 */
#define MMRT_MAX_SRC_EXT 2 /* slots of mmrt_op_args.src_ext (ABI 1.7): sources 6 and 7 */
#define MMRT_MAX_SRC_ALL (MMRT_MAX_SRC + MMRT_MAX_SRC_EXT)

struct mmrt_tensor {
    struct mmrt_abi_header hdr;
    void *buffer;           /* arena handle returned by arena_alloc */
    uint64_t offset;        /* byte offset of the first element inside the arena */
    int32_t dtype;          /* enum mmrt_dtype */
    int32_t n_dims;         /* 1 … MMRT_MAX_DIMS */
    int64_t ne[MMRT_MAX_DIMS]; /* extents, outermost first (PyTorch order); unused dims are 1 */
    int64_t nb[MMRT_MAX_DIMS]; /* byte stride of each dim, same order; contiguous when
                                  nb[n_dims-1] == dtype size and nb[i] == nb[i+1]*ne[i+1] */
};

/* ----------------------------------------------------------------------------------------
 * Operators. Shapes are written outermost first. "rows" means the product of all dims but
 * the last. Unless stated otherwise: activations and outputs are F32 and contiguous;
 * "weight" inputs may be F32, F16 or BF16 (converted to f32 on load into registers);
 * arithmetic accumulates in f32 at least; dst may be exactly src[0] (same arena, offset and
 * shape) for elementwise ops, and never partially overlaps any source otherwise. The core
 * validates shapes and dtypes before calling a kernel; a kernel may still refuse with
 * MMRT_ERR_UNSUPPORTED (e.g. a dtype it does not implement) and a message naming it.
 *
 * F8E4M3 (ABI 1.6) is a KV-cache storage dtype, the OCP FP8 "E4M3" (e4m3fn) format: sign,
 * 4 exponent bits with bias 7, 3 mantissa bits; exponent 0 is subnormal (m · 2^-9); no
 * infinities; 0x7F and 0xFF are NaN; the largest finite value is ±448 (0x7E / 0xFE). Reading
 * widens exactly to f32 (every code is an f32 value). Writing from f32 rounds to nearest even
 * and saturates: a value whose magnitude is ≥ 448 — infinity included — becomes ±448, so a
 * large activation is clipped rather than turned into NaN; NaN stays NaN (0x7F with its
 * sign). It is accepted only where the op says so: SET_ROWS (dst), ATTENTION and
 * ATTENTION_PAGED (k and v) and GATHER_HEADS (table). COPY does not take it (the cache is
 * written through SET_ROWS and read by the attention ops, so no conversion path needs it).
 * The core never hands an F8E4M3 tensor to a plugin built before ABI 1.6: such a launch is
 * MMRT_ERR_UNSUPPORTED naming the device.
 *
 * I8 with row scales (ABI 1.7) is the INT8 KV-cache store: I8 codes, and beside them an F32
 * scale for every innermost row of D codes (one token's head), in a separate contiguous
 * tensor with one element per row, in row order. Code c of a row with scale s stands for
 * the f32 product c · s, rounded once (no contraction into a later operation); a reader
 * widens each element to that value and then computes as it would on an F32 copy of them.
 * SET_ROWS writes a row from f32 values x₀ … x_{D−1}:
 *   amax  = the largest |xᵢ| (NaNs ignored; 0 when there is none),
 *   s     = amax / 127 (one correctly rounded f32 division),
 *   cᵢ    = xᵢ / s (correctly rounded) rounded to the nearest integer, ties to even, then
 *           clamped to [−127, 127]; a quotient that is NaN (0 / 0, ∞ / ∞, a NaN xᵢ) is 0.
 * So an all-zero row stores s = 0 and zero codes, and a row holding an infinity stores
 * s = +∞ and reads back as NaN, as attention over it would give anyway. Every plugin gets the
 * same codes and scales bit for bit. The scales go in extra sources: SET_ROWS src2 (written),
 * ATTENTION_PAGED src6 (k) and src7 (v), GATHER_HEADS src2; an I8 store without them, or
 * scales with a store of another dtype, is MMRT_ERR_INVALID_ARG. ATTENTION and COPY do not
 * take I8 K/V. The core never hands an I8 store to a plugin built before ABI 1.7.
 */
enum mmrt_op {
    /* y[M,N] = x[M,K] · W[N,K]ᵀ (+ b[N]). src: x (F32, rows × K), W (weight), b (weight,
     * optional). dst F32 [rows, N]. No params.
     * Batch invariance (specs/engine.md): output row m depends only on x row m, W and b, and
     * on whether M ≤ 32 (a plugin may use one reduction order for up to 32 rows, e.g. a
     * GEMV, and another above) — never on M otherwise, the other rows or the thread count.
     * The engine keeps a request's rows on one side of that line whatever runs with it.
     * Quantized weights (ABI 1.3): W may be I8 [N, K] with src3 = scales, F32 [N], contiguous;
     * W's element (n, k) stands for W[n, k] · scales[n] (symmetric, one scale per output
     * channel). A plugin may form Σₖ x·W[n, k] first and scale the sum (the scale is exact
     * to factor out in real arithmetic; only the rounding differs). src3 is present exactly
     * when W is I8. A plugin without an I8 kernel refuses with MMRT_ERR_UNSUPPORTED naming
     * it.
     * Or W may be U4 (ABI 1.3), 4-bit codes in groups with a scale and a zero point each:
     * W is [N, K/2] bytes, K a multiple of 32; each row is K/32 blocks of 16 bytes, byte j
     * of a block holding code j of the block in its low nibble and code j + 16 in its high
     * one (codes 0 … 15). src3 = scales and src4 = zero points, both F32 [N, G], contiguous,
     * G ≥ 1 with a group size gs = K / G that is a multiple of 32; code c at (n, k) stands
     * for (c − zero[n, k / gs]) · scale[n, k / gs]. src3 and src4 are present exactly when W
     * is U4; U4 is a MATMUL weight dtype only (and I8 otherwise only a KV store, with row
     * scales: see above). */
    MMRT_OP_MATMUL = 0,
    /* dst = src0 + src1. src1 (F32 or weight dtype) has the shape of src0, or is one row
     * [N] broadcast over every row of src0. */
    MMRT_OP_ADD = 1,
    /* dst = src0 * src1, broadcast as for ADD. */
    MMRT_OP_MUL = 2,
    /* dst = src0 * p.scale. Params: struct mmrt_scale_params. */
    MMRT_OP_SCALE = 3,
    /* Per row of src0 [rows, N]: (x − mean) / sqrt(var + eps) · w + b, var biased.
     * src1 = w [N], src2 = b [N], both optional (weight dtype). Params: mmrt_norm_params. */
    MMRT_OP_LAYERNORM = 4,
    /* Per row: x · 1/sqrt(mean(x²) + eps) · w. src1 = w [N] optional. Params: norm. */
    MMRT_OP_RMSNORM = 5,
    /* Unary activations, dst same shape as src0:
     * GELU = 0.5·x·(1+erf(x/√2)); GELU_TANH = 0.5x(1+tanh(√(2/π)(x+0.044715x³)));
     * QUICK_GELU = x·sigmoid(1.702x); SILU = x·sigmoid(x); RELU2 = max(x,0)². */
    MMRT_OP_GELU = 6,
    MMRT_OP_GELU_TANH = 7,
    MMRT_OP_QUICK_GELU = 8,
    MMRT_OP_SILU = 9,
    /* dst = silu(src0) · src1 (SwiGLU gate · up), same shapes. */
    MMRT_OP_SWIGLU = 10,
    MMRT_OP_RELU2 = 11,
    /* Per row of src0 [rows, N]: softmax(x · p.scale): each x · scale is rounded to f32
     * first, then the row max is subtracted and the exponentials summed in f32 or better.
     * -INFINITY inputs give exactly 0; a row that is all -INFINITY gives zeros.
     * Params: mmrt_scale_params. */
    MMRT_OP_SOFTMAX = 12,
    /* Rotary embedding. src0 = x [T, H, D] (innermost dim contiguous), src1 = positions
     * I32 [T]; dst [T, H, D] (may be src0). Params: mmrt_rope_params. Only the first n_rot
     * dims of each head rotate; the rest are copied. inv_freq[i] = 1 / powf(theta,
     * (float)(2i) / n_rot) with a correctly rounded f32 pow (as PyTorch's CPU computes it;
     * a device whose pow is less exact computes the table on the host), and
     * angle = (float)pos · inv_freq[i] rounded to f32, as Hugging Face computes them. dst is
     * contiguous or exactly src0.
     * NEOX layout pairs dim i with i + n_rot/2 (rotate_half); INTERLEAVED pairs 2i, 2i+1. */
    MMRT_OP_ROPE = 13,
    /* Scaled dot-product attention over one or more sequences packed along the token dim.
     * src0 = q [T, Hq, D] (contiguous), src1 = k [S, Hkv, D], src2 = v [S, Hkv, D] (k and
     * v F32, F16 or F8E4M3 (ABI 1.6), any token and head stride, innermost dim contiguous), src3 = cu_seqlens_q I32 [n_seq+1] and
     * src4 = cu_seqlens_k I32 [n_seq+1] (both optional: absent means one sequence holding
     * all T queries and all S keys). dst = [T, Hq, D] F32.
     * Query head h reads kv head h / (Hq/Hkv) (contiguous groups, Hq % Hkv == 0). D ≤ 256.
     * Causal: query i of a sequence with Lq queries and Lk keys sees keys j ≤ i + (Lk − Lq)
     * (the queries are the last Lq positions). A query that sees no key gets zeros.
     * Sliding window (ABI 1.5, p.window > 0, causal only): query i at position
     * p = i + (Lk − Lq) sees keys p − window < j ≤ p, i.e. the last `window` keys up to and
     * including its own position (Mistral's sliding_window; a query with p < window sees all
     * keys 0 … p, as without a window). window is counted in key positions of the sequence,
     * never in cache rows. Keys before every window of a sequence must not affect any row
     * even when they hold NaN (the in-tree conformance cases put NaN there): skip them rather
     * than read and mask them, which also makes a long context cost only the window. window
     * 0 means no window; window > 0 with causal 0 is MMRT_ERR_INVALID_ARG (no bidirectional
     * window is defined). A caller whose params_size stops before `window` (an ABI ≤ 1.4
     * caller) asks for no window.
     * Batch invariance (specs/engine.md), as ATTENTION_PAGED: a query row's result depends
     * only on that row, its sequence's Lq and Lk, the window and that sequence's keys and
     * values — not on T, S or the other sequences of the launch — so a sequence packed with
     * others gives the bits it gets alone without cu_seqlens. The runtime packs the images of
     * a vision batch this way. (The CUDA plugin splits long key ranges by the launch's size and does
     * not keep this yet: docs/CUDA.md.)
     * Params: mmrt_attention_params. */
    MMRT_OP_ATTENTION = 14,
    /* dst[t, :] = table[ids[t], :]. src0 = table [V, N] (weight dtype), src1 = ids I32 [T];
     * dst F32 [T, N]. An id outside [0, V) is MMRT_ERR_INVALID_ARG. */
    MMRT_OP_GET_ROWS = 15,
    /* Conv2d with stride = kernel = P and no padding, emitted token-major.
     * src0 = image F32 [B, C, H, W] (H, W multiples of P), src1 = weight [O, C, P, P],
     * src2 = bias [O] (optional). dst F32 [B, (H/P)·(W/P), O], patches in row-major
     * (patch row, patch column) order. Params: mmrt_patch_params. */
    MMRT_OP_PATCH_EMBED = 16,
    /* dst = concat(src0, src1) along p.axis; all three share dtype, ranks and every other
     * extent. Sources may be strided; dst is contiguous. Params: mmrt_concat_params. */
    MMRT_OP_CONCAT = 17,
    /* Strided copy with dtype conversion: dst[i…] = (dst dtype) src0[i…]. src0 and dst have
     * equal extents and any strides (this is how transpose/permute and KV-cache writes are
     * expressed: the core passes a permuted or offset view). F32 ↔ F16 ↔ BF16 round to
     * nearest even; I32 copies only to I32; F8E4M3 is not accepted on either side. No
     * params. */
    MMRT_OP_COPY = 18,
    /* dst[r] = index of the largest element of row r of src0 [rows, N] (F32), the first one
     * on ties; NaN is never chosen; a row that is all NaN gives 0. dst I32 [rows]. */
    MMRT_OP_ARGMAX = 19,
    /* Rotary embedding whose pairs turn by positions along several axes (ABI 1.1): Qwen2-VL's
     * M-RoPE in the decoder (axes t, h, w) and the 2-D rotary of its vision tower (h, w).
     * src0 = x [T, H, D] (innermost dim contiguous), src1 = positions I32 [T, n_axes]
     * (contiguous); dst as for ROPE. NEOX pairing: dim i with i + n_rot/2 for i < n_rot/2;
     * dims ≥ n_rot are copied. The pairs are split into n_axes consecutive sections of
     * p.sections[a] pairs (summing to n_rot/2); pair i of section a turns by
     * angle = (float)pos[t, a] · inv_freq[j] rounded to f32, where j = i, or i minus the first
     * pair of its section when p.restart, and inv_freq[j] = 1 / powf(theta,
     * (float)(2j) / p.freq_dim), computed as at ROPE. So M-RoPE is {n_rot = D, freq_dim = D,
     * restart 0, sections (16, 24, 24)} and the vision rotary {n_rot = D, freq_dim = D/2,
     * restart 1, sections (D/4, D/4)}. Params: mmrt_rope_multi_params. */
    MMRT_OP_ROPE_MULTI = 20,
    /* Row scatter (ABI 1.1): dst[idx[t], …] = (dst dtype) src0[t, …] for every t < T.
     * src0 = values F32 [T, …] (contiguous), src1 = idx I32 [T] (contiguous, in device
     * memory, so a captured graph writes the rows a later upload names); dst [R, …]
     * contiguous F32, F16, BF16, F8E4M3 (ABI 1.6) or I8 (ABI 1.7) with src0's inner extents.
     * Conversion rounds to nearest even; to F8E4M3 it also saturates at ±448 (see above). An
     * I8 dst (rank ≥ 2) is a store with row scales: src2 = its scales, F32, contiguous, one
     * per innermost row of dst (dst's rows in row order), disjoint from every other operand,
     * is written too — each written row gets its codes and its scale as described above —
     * and is required exactly when dst is I8. An index outside [0, R) writes nothing: a device cannot report it without a
     * synchronisation, so the caller owns the indices (the KV cache's write position). Two
     * equal indices leave either row. No params. */
    MMRT_OP_SET_ROWS = 21,
    /* Attention over a paged K/V cache (ABI 1.2). The keys and values of every sequence live
     * in fixed-size pages of one page pool; a sequence's row of the page table names its
     * pages in key order. src0 = q [T, Hq, D] F32 contiguous (the queries of n_seq sequences
     * packed along T); src1 = k_pages and src2 = v_pages [n_pages, page_tokens, Hkv, D]
     * (contiguous, both F32, both F16, both F8E4M3 or (ABI 1.7) both I8 with row scales:
     * src6 = k_scales and src7 = v_scales, F32 contiguous, n_pages · page_tokens · Hkv each,
     * the scale of (page, row r, kv head g) at (page · page_tokens + r) · Hkv + g, present
     * exactly when the pages are I8); src3 = cu_seqlens_q I32 [n_seq + 1]; src4 = kv_lens
     * I32 [n_seq] (keys of each sequence); src5 = page_table I32 [n_seq, max_pages]. All
     * three index tensors are contiguous and in device memory, so a captured graph reads what
     * a later upload wrote. Key j of sequence s is row j % page_tokens of page
     * page_table[s, j / page_tokens]; entries past the last page a sequence uses are never
     * read. A page may appear in several rows (shared prefixes) and pages may come in any
     * order. dst = [T, Hq, D] F32. Heads, D ≤ 256, causality and the sliding window as for
     * ATTENTION, with Lq = cu_seqlens_q[s+1] − cu_seqlens_q[s] and Lk = kv_lens[s] (Lk = 0:
     * zeros). The window counts key positions j, i.e. places in the sequence's page table
     * order, so it may start in the middle of a page; the pages wholly before it are never
     * read (their table entries must still be valid ids: the checks below do not depend on
     * the window).
     * cu_seqlens_q must run from 0 to T without decreasing, 0 ≤ Lk ≤ max_pages·page_tokens,
     * and every page read must lie in [0, n_pages); anything else is MMRT_ERR_INVALID_ARG,
     * reported by the launch where the plugin can see the values and otherwise by the next
     * synchronize or download (as ATTENTION's cu_seqlens are).
     * Batch invariance (specs/engine.md): a query row's result depends only on that row, its
     * sequence's Lq and Lk, the window, and the contents of that sequence's keys and values
     * 0 … Lk−1 (with a window, of those it sees). It
     * must not change with the page ids, the page size, T or the other sequences of the
     * launch, bit for bit: reduce over a sequence's keys in key order with a blocking that
     * does not depend on any of those. Params: mmrt_attention_params (n_seq ≥ 1). */
    MMRT_OP_ATTENTION_PAGED = 22,
    /* Per-head row gather with averaging (ABI 1.4), for image-token KV-cache compression:
     * after prefill the engine keeps, per layer and KV head, a subset of the image tokens'
     * K/V rows (G = 1) or averages of groups of them (2×2 pooling: G = 4), chosen by score.
     * src0 = table [R, H, D], F32, F16, BF16, F8E4M3 (ABI 1.6) or I8 with row scales (ABI
     * 1.7: src2 = scales F32 [R · H], contiguous, present exactly when the table is I8; each
     * row is widened to code · scale), contiguous (in use a KV page store
     * [n_pages, page_tokens, Hkv, D] viewed as [n_pages·page_tokens, Hkv, D]); src1 = idx
     * I32 [N, H, G], G ≥ 1, contiguous and in device memory (so the rows a later upload
     * names are read, as SET_ROWS's indices); dst F32 [N, H, D] contiguous, overlapping
     * neither source. No params.
     *   dst[n, h, :] = (Σ over the kept g of table[idx[n, h, g], h, :]) / c
     * where an entry is kept when 0 ≤ idx[n, h, g] < R and c counts the kept entries.
     * Bit-exact on every plugin (mmrt-plugin-check compares exactly), so the arithmetic is
     * fixed: each kept row is widened to f32 (exact), the sum starts from the first kept row
     * and adds the others in g order with rounded f32 additions (no other order, no
     * contraction), then, only when c ≥ 2, is divided by (float)c with one correctly rounded
     * f32 division (not a multiplication by a reciprocal, no fast-math). So c = 1 copies the
     * row exactly (−0 stays −0) and c = 0 gives +0. NaN payloads are not specified.
     * Negative entries are padding for ragged groups (fewer than G rows to average); an
     * entry ≥ R is the caller's error and is skipped like padding, because a device cannot
     * report it without a synchronisation (the same reasoning as SET_ROWS). */
    MMRT_OP_GATHER_HEADS = 23,
    /* Row L2 norms (ABI 1.4): dst[r] = sqrt(Σₖ x[r, k]²) for every row r of src0 [rows, N]
     * (F32, contiguous, any rank; rows is the product of all dims but the last, so a 1-D
     * src0 is one row). dst is F32 [rows], always 1-D and contiguous whatever src0's rank
     * (a caller wanting [T, H] views those bytes so), and does not overlap src0. N = 0 gives
     * 0; NaN propagates. Accumulated in f32 or better in any order, so plugins agree only to
     * a tolerance; an f32 accumulation overflows to +inf where Σ x² exceeds FLT_MAX, a
     * double one does not. The engine scores image-token K rows with it. No params. */
    MMRT_OP_L2_NORM = 24,
    MMRT_OP_COUNT /* number of ops this header knows; never stored in a plugin struct */
};

/* Op parameter structs. Append-only; readers handle a shorter params_size (zero default). */
struct mmrt_scale_params { float scale; };
struct mmrt_norm_params { float eps; };

enum mmrt_rope_mode { MMRT_ROPE_NEOX = 0, MMRT_ROPE_INTERLEAVED = 1 };
struct mmrt_rope_params {
    float theta;    /* base, e.g. 10000 */
    int32_t n_rot;  /* rotated dims per head, even, 2 … D */
    int32_t mode;   /* enum mmrt_rope_mode */
};

#define MMRT_ROPE_MAX_AXES 4
struct mmrt_rope_multi_params {
    float theta;      /* base */
    int32_t n_rot;    /* rotated dims per head, even, 2 … D */
    int32_t freq_dim; /* denominator of the inv_freq exponent, ≥ 1 */
    int32_t restart;  /* 1: the frequency index restarts at each section */
    int32_t n_axes;   /* 1 … MMRT_ROPE_MAX_AXES; positions are [T, n_axes] */
    int32_t sections[MMRT_ROPE_MAX_AXES]; /* pairs per axis, each ≥ 0, summing to n_rot/2 */
};

struct mmrt_attention_params {
    float scale;    /* multiplies q·k, usually 1/sqrt(D) */
    int32_t causal; /* 0 = bidirectional, 1 = causal as described at MMRT_OP_ATTENTION */
    int32_t n_seq;  /* number of packed sequences; 1 when cu_seqlens are absent */
    /* ABI 1.5: sliding window in key positions (MMRT_OP_ATTENTION); 0 = none, ≥ 0, causal
     * only. Readers treat a params_size that ends before it as 0. */
    int32_t window;
};
/* params_size of an ABI ≤ 1.4 writer: everything before `window`. */
#define MMRT_ATTENTION_PARAMS_V14_SIZE 12u
MMRT_STATIC_ASSERT(offsetof(struct mmrt_attention_params, window) ==
                       MMRT_ATTENTION_PARAMS_V14_SIZE,
                   "window must follow the ABI 1.4 members");

struct mmrt_patch_params { int32_t patch; };
struct mmrt_concat_params { int32_t axis; };

/* Everything one kernel launch needs. Built by the core, valid only during the call. */
struct mmrt_op_args {
    struct mmrt_abi_header hdr;
    int32_t op;                                /* enum mmrt_op */
    int32_t n_src;                             /* number of src slots used */
    const struct mmrt_tensor *src[MMRT_MAX_SRC]; /* NULL for an absent optional input */
    const struct mmrt_tensor *dst;
    const void *params;                        /* op's params struct, or NULL */
    uint32_t params_size;                      /* sizeof params as the core knew it */
    /* ABI 1.7: sources 6 … MMRT_MAX_SRC_ALL − 1 (n_src counts them with src[]). A writer
     * whose struct_size ends before this member passes n_src ≤ MMRT_MAX_SRC. Read sources
     * through mmrt_op_args_src(). */
    const struct mmrt_tensor *src_ext[MMRT_MAX_SRC_EXT];
};

/* Source i of a launch (0 ≤ i < n_src), wherever the writer put it; NULL when absent or
 * when the writer's struct ends before the slot. */
static inline const struct mmrt_tensor *mmrt_op_args_src(const struct mmrt_op_args *a, int i)
{
    if (i < 0 || i >= a->n_src || i >= MMRT_MAX_SRC_ALL)
        return NULL;
    if (i < MMRT_MAX_SRC)
        return a->src[i];
    const size_t end = offsetof(struct mmrt_op_args, src_ext) +
                       (size_t)(i - MMRT_MAX_SRC + 1) * sizeof(a->src_ext[0]);
    return a->hdr.struct_size >= end ? a->src_ext[i - MMRT_MAX_SRC] : NULL;
}

struct mmrt_device; /* opaque, owned by the plugin */

/* The one kernel signature. Adding an op never changes it. */
typedef mmrt_status (*mmrt_kernel_fn)(struct mmrt_device *dev, const struct mmrt_op_args *args);

/* ----------------------------------------------------------------------------------------
 * Devices.
 */
struct mmrt_device_info {
    struct mmrt_abi_header hdr;
    char name[128];           /* e.g. "AMD EPYC 9B14 (2 threads)" or "NVIDIA H200" */
    char kind[16];            /* "cpu", "gpu" or "accelerator" */
    uint64_t total_bytes;     /* device memory */
    uint64_t free_bytes;      /* device memory free now, as the driver reports it */
    uint64_t max_arena_bytes; /* largest single arena_alloc that may succeed */
    uint32_t alignment;       /* byte alignment the plugin needs for tensor offsets */
};

struct mmrt_plugin {
    struct mmrt_abi_header hdr;
    const char *name;    /* short name, e.g. "cpu"; the file is libmmrt_<name>.so */
    const char *version; /* the plugin's own version string */

    /* Counts the devices this plugin can drive (required). Finding none is not an error:
     * return MMRT_OK with *n_devices = 0 and a reason in `why` ("no CUDA device"); the core
     * then skips the plugin with an info line. */
    mmrt_status (*probe)(int *n_devices, char *why, size_t why_size);

    /* Opens device `index` (required). `options` are the plugin-specific keys of the
     * device's INI section (n_options may be 0). On failure returns a status and writes a
     * message naming the key or driver error into err. */
    mmrt_status (*device_open)(int index, const struct mmrt_option *options, int n_options,
                               struct mmrt_device **out, char *err, size_t err_size);
    /* Releases the device and everything still allocated on it (required). NULL is a no-op. */
    void (*device_close)(struct mmrt_device *dev);
    /* Fills *info (required); info->hdr is set by the caller, the plugin honours its size. */
    mmrt_status (*device_info)(struct mmrt_device *dev, struct mmrt_device_info *info);

    /* Allocates one arena of nbytes (required). Running out is MMRT_ERR_OUT_OF_POOL, never an
     * abort. The handle is opaque to the core. */
    mmrt_status (*arena_alloc)(struct mmrt_device *dev, uint64_t nbytes, void **arena);
    /* Frees an arena (required); waits for work that uses it. NULL arena is a no-op. */
    void (*arena_free)(struct mmrt_device *dev, void *arena);

    /* Host → device, device → host, device → device on one device (all required).
     * Ranges are bounds-checked against the arena (MMRT_ERR_INVALID_ARG otherwise); copy()
     * allows the two ranges to overlap in the same arena, with memmove semantics. */
    mmrt_status (*upload)(struct mmrt_device *dev, void *arena, uint64_t offset,
                          const void *src, uint64_t nbytes);
    mmrt_status (*download)(struct mmrt_device *dev, void *dst, void *arena, uint64_t offset,
                            uint64_t nbytes);
    mmrt_status (*copy)(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                        void *src_arena, uint64_t src_offset, uint64_t nbytes);
    /* Waits until all issued work is complete (required). */
    mmrt_status (*synchronize)(struct mmrt_device *dev);
    /* Detail of the last failure on dev (required; never NULL, "" when none). */
    const char *(*last_error)(struct mmrt_device *dev);

    /* Op table (optional): ops[op] for op < n_ops; a NULL entry or op ≥ n_ops means the
     * plugin does not support that op, and the scheduler refuses a placement that needs it. */
    const mmrt_kernel_fn *ops;
    uint32_t n_ops;

    /* NULL-terminated list of the [device.NAME] keys device_open understands (optional;
     * NULL means none). The config reader refuses any other key with its FILE:LINE. */
    const char *const *option_keys;

    /* Called once before the plugin is unloaded (optional). */
    void (*shutdown)(void);

    /* Graph capture (optional; all four or none). Between capture_begin and capture_end the
     * device records the uploads, copies and kernels issued instead of running them;
     * capture_end returns an opaque graph that graph_launch replays with the same arguments
     * (same arenas, offsets, shapes and params). Values a step changes — positions, KV
     * lengths — must therefore live in device memory (ROPE positions, ATTENTION
     * cu_seqlens_k), written by an upload issued before the launch. If capture fails the
     * plugin returns an error, leaves nothing recorded and the core runs eagerly (the CUDA
     * plugin implements this with CUDA Graphs for the decode step). */
    mmrt_status (*capture_begin)(struct mmrt_device *dev);
    mmrt_status (*capture_end)(struct mmrt_device *dev, void **graph);
    mmrt_status (*graph_launch)(struct mmrt_device *dev, void *graph);
    void (*graph_destroy)(struct mmrt_device *dev, void *graph);

    /* Compiles or loads whatever the device's kernels need (optional; NULL means nothing to
     * do). The runtime calls it once after opening a device and before any weights are
     * loaded, so a kernel that cannot be built is reported at start-up with the compiler's
     * log, not in the middle of the first request. Listing devices does not call it. */
    mmrt_status (*prepare)(struct mmrt_device *dev);

    /* Adopts nbytes of host memory at `host` as a read-only arena (optional, ABI 1.2). The core
     * uses it to run on weights in place from a read-only mapping of the checkpoint file (zero
     * copy: the page cache is shared by every process that maps the file), so only a plugin
     * whose kernels read host memory directly implements it. The memory stays valid and
     * unchanged until arena_free(dev, *arena), which releases the handle and leaves the memory
     * to its owner. The arena may be read by every op, download and copy; an upload or copy
     * into it, or a kernel whose dst lies in it, is MMRT_ERR_INVALID_ARG. `host` is page-aligned;
     * a tensor read from it is aligned to its element size but not necessarily to
     * device_info.alignment (safetensors promises no more), so a plugin that adopts must accept
     * such offsets. Declining (NULL, or MMRT_ERR_UNSUPPORTED with a reason in last_error) makes
     * the core copy the weights into ordinary arenas instead. */
    mmrt_status (*arena_adopt_host)(struct mmrt_device *dev, const void *host, uint64_t nbytes,
                                    void **arena);
};

/* The oldest mmrt_plugin layout the loader accepts: everything up to last_error. */
#define MMRT_PLUGIN_MIN_SIZE \
    (offsetof(struct mmrt_plugin, last_error) + sizeof(((struct mmrt_plugin *)0)->last_error))

typedef const struct mmrt_plugin *(*mmrt_plugin_entry_fn)(const struct mmrt_host *host);

/* ----------------------------------------------------------------------------------------
 * Helpers every plugin needs, inline so that a plugin still links against nothing of mmrt.
 */

/* "MATMUL", "ROPE_MULTI", …; "unknown op" outside this header's operators. */
static inline const char *mmrt_op_name_of(int op)
{
    static const char *const names[] = {
        "MATMUL", "ADD", "MUL", "SCALE", "LAYERNORM", "RMSNORM", "GELU", "GELU_TANH",
        "QUICK_GELU", "SILU", "SWIGLU", "RELU2", "SOFTMAX", "ROPE", "ATTENTION", "GET_ROWS",
        "PATCH_EMBED", "CONCAT", "COPY", "ARGMAX", "ROPE_MULTI", "SET_ROWS",
        "ATTENTION_PAGED", "GATHER_HEADS", "L2_NORM",
    };
    MMRT_STATIC_ASSERT(sizeof names / sizeof names[0] == MMRT_OP_COUNT, "every op needs a name");
    return op >= 0 && op < MMRT_OP_COUNT ? names[op] : "unknown op";
}

/* "F32", "F16", "BF16", "I32", "I8", "U4", "F8E4M3"; "an unknown dtype" otherwise. */
static inline const char *mmrt_dtype_name_of(int dtype)
{
    static const char *const names[] = { "F32", "F16", "BF16", "I32", "I8", "U4", "F8E4M3" };
    MMRT_STATIC_ASSERT(sizeof names / sizeof names[0] == MMRT_DTYPE_COUNT, "every dtype a name");
    return dtype >= 0 && dtype < MMRT_DTYPE_COUNT ? names[dtype] : "an unknown dtype";
}

/* FP8 E4M3 (F8E4M3) code → f32, exactly. The 7 magnitude bits placed at f32 bits 20…26 with
 * 120 added to the exponent re-bias a normal code (exponent 1…15, bias 7 → 127); a subnormal
 * code (exponent 0) is its mantissa · 2^-9, an exact small-integer product, so no f32
 * subnormal (which flush-to-zero modes would lose) is ever formed; 0x7F / 0xFF are NaN. */
static inline float mmrt_f8e4m3_to_f32(uint8_t c)
{
    const uint32_t mag = c & 0x7Fu, sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t bits;
    if (mag == 0x7Fu) {
        bits = 0x7FC00000u;
    } else if (mag < 8u) {
        float sub = (float)mag * 0.001953125f; /* 2^-9, written in decimal for C++ before 17 */
        memcpy(&bits, &sub, 4);
    } else {
        bits = (mag << 20) + (120u << 23);
    }
    bits |= sign;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* f32 → FP8 E4M3 as plugin.h asks: round to nearest even, magnitudes ≥ 448 (infinity too)
 * saturate to ±448 (0x7E), NaN gives 0x7F with its sign. */
static inline uint8_t mmrt_f32_to_f8e4m3(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u)
        return (uint8_t)(sign | 0x7Fu);
    if (ax >= 0x43E00000u) /* 448 */
        return (uint8_t)(sign | 0x7Eu);
    if (ax < 0x3C800000u) {
        /* Below 2^-6 the code is subnormal, in steps of 2^-9: adding 2^14 (whose ulp is 2^-9)
         * lets the FPU round to nearest even; 8 steps is the smallest normal, 0x08. */
        float a, t;
        memcpy(&a, &ax, 4);
        t = a + 16384.0f;
        uint32_t tb;
        memcpy(&tb, &t, 4);
        return (uint8_t)(sign | (tb - 0x46800000u));
    }
    /* Re-bias the exponent (127 → 7) and round the 20 dropped mantissa bits to nearest even;
     * a carry out of the mantissa bumps the exponent, which is the right code (below 448 no
     * carry reaches the NaN code: the largest value rounding there, 464, was caught above). */
    ax += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((ax >> 20) & 1u);
    return (uint8_t)(sign | (ax >> 20));
}

/* The F16 and BF16 storage formats' reference conversions, exact, round to nearest even:
 * what plugin.h means by an F16 / BF16 element, for hosts, tools and tests (a plugin may use
 * them or its own faster form, as the CPU plugin does; mmrt-plugin-check holds either to
 * these). f32 → f16: magnitudes from 65520 up give ±inf, NaN a quiet NaN with its sign;
 * f16 → f32 is exact, subnormals, infinities and NaN payloads included. */
static inline uint16_t mmrt_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t exp = (x >> 23) & 0xFFu;
    uint32_t mant = x & 0x7FFFFFu;
    if (exp == 0xFFu)
        return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u : 0u));
    const int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        const int shift = 14 - e;
        const uint32_t half = 1u << (shift - 1), rem = mant & ((1u << shift) - 1u);
        uint32_t r = mant >> shift;
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++; /* a carry into the exponent is the right rounding, up to infinity */
    return (uint16_t)(sign | r);
}

static inline float mmrt_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    uint32_t x;
    if (exp == 0) { /* zero or subnormal: mant · 2^-24, exact in f32 (no loop to normalise) */
        const float f = (float)mant * 5.9604644775390625e-08f; /* 2^-24, in decimal for C++ */
        memcpy(&x, &f, 4);
        x |= sign;
    } else if (exp == 31) {
        x = sign | 0x7F800000u | (mant << 13); /* infinity, or NaN with its payload */
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13); /* re-bias 15 → 127 */
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* f32 → bf16, round to nearest even; NaN stays a quiet NaN with its sign. */
static inline uint16_t mmrt_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu))
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float mmrt_bf16_to_f32(uint16_t h)
{
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* An operator's mmrt_attention_params as this header knows them: the caller's bytes up to
 * min(size, sizeof *out), the members past them zero (an ABI 1.4 caller's 12 bytes read as
 * window 0). Returns 0, leaving *out zeroed, when params is NULL or shorter than the ABI 1.0
 * members; 1 otherwise. Every plugin reads attention params through it, so none rejects an
 * older caller or reads past a shorter struct. */
static inline int mmrt_attention_params_read(const void *params, uint32_t size,
                                             struct mmrt_attention_params *out)
{
    memset(out, 0, sizeof *out);
    if (!params || size < MMRT_ATTENTION_PARAMS_V14_SIZE)
        return 0;
    memcpy(out, params, size < sizeof *out ? size : sizeof *out);
    return 1;
}

/* The first thing mmrt_plugin_init does: refuse a host of another ABI major (saying why
 * through its log when the table is recent enough to have one) and otherwise keep a copy of
 * the host table zero-extended to this header's layout, so members the host lacks read as
 * NULL. Returns 1 when *copy was filled, 0 when the plugin must return NULL. */
static inline int mmrt_plugin_adopt_host(const struct mmrt_host *host, struct mmrt_host *copy,
                                         const char *plugin_name)
{
    if (!host)
        return 0;
    const int has_log = host->hdr.struct_size >= offsetof(struct mmrt_host, log) +
                                                     sizeof host->log &&
                        host->log != NULL;
    if (host->hdr.abi_major != MMRT_ABI_MAJOR) {
        if (has_log) {
            char line[160];
            snprintf(line, sizeof line,
                     "host ABI %u.%u, but this plugin was built for ABI %d.%d; refusing to load",
                     (unsigned)host->hdr.abi_major, (unsigned)host->hdr.abi_minor,
                     MMRT_ABI_MAJOR, MMRT_ABI_MINOR);
            host->log(host->user, MMRT_LOG_ERROR, plugin_name, line);
        }
        return 0;
    }
    memset(copy, 0, sizeof *copy);
    memcpy(copy, host,
           host->hdr.struct_size < sizeof *copy ? host->hdr.struct_size : sizeof *copy);
    return 1;
}

#ifdef __cplusplus
}
#endif

#endif /* MMRT_PLUGIN_H */
