/*
 * core/kv_cache.h — what every decoder keeps per sequence, and how token ids become
 * embeddings.
 *
 * The K/V cache is paged (DESIGN.md "Memory", specs/engine.md): a decoder owns one page
 * store on its device — per layer one K and one V tensor [n_pages, page_tokens, n_kv_heads,
 * head_dim] F32, reserved from the device pool when the model loads (packed into a few
 * power-of-two blocks, mmrt_kv_store_plan) and sized by `[model] max_kv_tokens` — and every
 * sequence a page table naming, in position order, the
 * pages that hold its keys. A sequence takes pages as it grows (mmrt_kv_cache_reserve) and
 * gives them back when it ends, so many sequences share the store and nothing is reserved for
 * a worst case. New K/V rows go in with SET_ROWS at the rows mmrt_kv_cache_rows names;
 * attention reads them through the page table with ATTENTION_PAGED. Both only ever see device
 * data (the row indices, the key count and the table), so a captured decode step replays.
 */
#ifndef MMRT_MODELS_KV_CACHE_H
#define MMRT_MODELS_KV_CACHE_H

#include "device.h"

/* Default and bounds of [model] kv_page_tokens (a power of two). 16 is vLLM's block size:
 * large enough that a page of a 7B layer (16 × 32 × 128 × 4 B = 256 KiB per K or V) streams
 * at full bandwidth, small enough that a sequence wastes at most 15 positions. */
#define MMRT_KV_DEFAULT_PAGE_TOKENS 16
#define MMRT_KV_MAX_PAGE_TOKENS 4096

/* Most pool blocks one page store is packed into (see mmrt_kv_store_plan). */
#define MMRT_KV_MAX_BLOCKS 64

/* Where an INT8 store's row scales start after its codes, in bytes (a multiple of every
 * in-tree plugin's tensor alignment). */
#define MMRT_KV_SCALES_ALIGN 256

/* Bytes of one K (or V) tensor of `rows` store rows (tokens) of n_kv_heads heads of head_dim
 * in `dtype`: the elements, and for I8 (plugin.h "I8 with row scales") the codes padded to
 * MMRT_KV_SCALES_ALIGN followed by one f32 scale per (row, head). *scales_at gets that
 * offset (0 for other dtypes); it may be NULL. */
uint64_t mmrt_kv_tensor_bytes(enum mmrt_dtype dtype, int64_t rows, int64_t n_kv_heads,
                              int64_t head_dim, uint64_t *scales_at);

/* How a store of n_tensors equal tensors of tensor_bytes each (2 per layer, K and V) is
 * packed into pool blocks. Why: the pool gives power-of-two blocks (core/pool.h), so a
 * tensor per block holds up to twice its bytes (a 7B layer's K for 768 positions is 12 MiB
 * and would take 16). Instead the tensors fill blocks of the binary decomposition of their
 * total: each block is the largest power of two ≤ the bytes still to place, holding as many
 * whole tensors as fit, and a last tensor that fits no such block gets its own; 768 MiB of
 * 64 tensors take 512 + 256 + 16 MiB. The largest block is capped at max_block (0 = none).
 * Fills counts[b] (tensors in block b) and returns the number of blocks (≤
 * MMRT_KV_MAX_BLOCKS; the last absorbs the rest if more would be needed); *pool_bytes gets
 * the blocks' total. tensor_bytes is first rounded up to min_block. */
int mmrt_kv_store_plan(uint64_t tensor_bytes, int64_t n_tensors, uint64_t min_block,
                       uint64_t max_block, int64_t *counts, uint64_t *pool_bytes);

/* The page store of one decoder. */
struct mmrt_kv_pages {
    struct mmrt_dev *dev;
    int64_t n_layers, n_kv_heads, head_dim;
    int64_t page_tokens, n_pages;
    int64_t max_tokens;         /* n_pages · page_tokens: what max_kv_tokens bought */
    bool max_tokens_configured; /* false: the default (for messages) */
    struct mmrt_dev_tensor *k;  /* [n_layers] each [n_pages, page_tokens, n_kv_heads, hd],
                                   views into blocks[] (their own block field is empty) */
    struct mmrt_dev_tensor *v;
    /* An I8 store's row scales, [n_layers] each F32 [n_pages · page_tokens · n_kv_heads]
     * right after its codes (mmrt_kv_tensor_bytes); NULL for other dtypes. */
    struct mmrt_dev_tensor *k_scales, *v_scales;
    int64_t seq_pages;          /* the widest page table one sequence can need:
                                   ceil(min(context, max_tokens) / page_tokens) */
    struct mmrt_dev_tensor blocks[MMRT_KV_MAX_BLOCKS]; /* the pool blocks that hold them */
    int n_blocks;
    int32_t *free_pages;        /* stack of free page ids */
    int64_t n_free;
    /* Holders of each page (prefix sharing, docs/ENGINE.md "Prefix reuse"): refs[id] counts
     * the sequences whose page table names it, pins[id] the engine's cached prefixes. A page
     * is on the free stack exactly when both are 0; dev->kv.pages_used counts the pages with
     * refs > 0 (what requests hold), n_pinned those with pins > 0. */
    int32_t *refs, *pins;
    int64_t n_pinned;
};

/* Reserves the store. max_tokens 0 = the default: with pool_mb = auto the positions the pool
 * was sized for (dev->auto_kv_tokens: the model's context), else the model's context
 * (max_positions) but at most what half of the device's pool holds, so activations keep room. A configured value is
 * used as given: if the pool cannot hold it, MMRT_ERR_OUT_OF_POOL names max_kv_tokens, the
 * bytes and the pool. page_tokens 0 = MMRT_KV_DEFAULT_PAGE_TOKENS. */
mmrt_status mmrt_kv_pages_create(struct mmrt_dev *dev, int64_t n_layers, int64_t n_kv_heads,
                                 int64_t head_dim, int64_t max_positions, int64_t max_tokens,
                                 int64_t page_tokens, enum mmrt_dtype dtype,
                                 struct mmrt_kv_pages *out, struct mmrt_error *err);
/* Frees the store; a zeroed one is a no-op. Every sequence must be freed first. */
void mmrt_kv_pages_destroy(struct mmrt_kv_pages *p);

/* One sequence's pages, on the host: the engine gathers the page tables of a step's
 * sequences into the step's control block (core/engine.c), so a sequence owns no device
 * memory of its own. */
struct mmrt_kv_cache {
    struct mmrt_kv_pages *pages;
    int64_t n_ctx;              /* positions this sequence may reach (prompt + generation) */
    int64_t n_past;             /* positions filled */
    int64_t max_pages;          /* ceil(n_ctx / page_tokens) */
    int64_t n_held;             /* pages taken so far: [0, n_held) of page_ids */
    int32_t *page_ids;          /* [max_pages], in position order */
};

/* Starts a sequence that may grow to n_ctx positions; takes no page yet. A sequence longer
 * than the whole store is refused (MMRT_ERR_LIMIT naming max_kv_tokens and both numbers). */
mmrt_status mmrt_kv_cache_alloc(struct mmrt_kv_pages *pages, int64_t n_ctx,
                                struct mmrt_kv_cache *out, struct mmrt_error *err);
/* Gives up the sequence's hold on its pages (each returns to the store unless another
 * sequence or a cached prefix holds it) and frees its table; a zeroed cache is a no-op. */
void mmrt_kv_cache_free(struct mmrt_kv_cache *c);
/* Gives up every page but keeps the sequence (preemption: it is recomputed later). */
void mmrt_kv_cache_drop(struct mmrt_kv_cache *c);

/* Starts c's page table with n shared pages (ids, in position order), which some other
 * holder keeps: a reference is taken on each and positions [0, n · page_tokens) count as
 * filled. c must hold no page. The sequence never writes these positions (it writes only
 * from n_past on, in pages of its own), so the pages need no copy. */
void mmrt_kv_cache_share(struct mmrt_kv_cache *c, const int32_t *ids, int64_t n);

/* The prefix store's hold on a page (pins above): a pinned page outlives its sequences and
 * returns to the free stack with its last holder. */
void mmrt_kv_page_pin(struct mmrt_kv_pages *p, int32_t id);
void mmrt_kv_page_unpin(struct mmrt_kv_pages *p, int32_t id);

/* Copies page src's contents over page dst, as bytes: K and V of every layer and an I8
 * store's row scales. MMRT_ERR_UNSUPPORTED when a page's bytes are not whole 4-byte words
 * (mmrt_kv_page_copyable: the copy moves words, exact for every dtype). */
bool mmrt_kv_page_copyable(const struct mmrt_kv_pages *p);
mmrt_status mmrt_kv_page_copy(struct mmrt_kv_pages *p, int32_t src, int32_t dst,
                              struct mmrt_error *err);

/* Makes pages [from, to) of c's table the sequence's own, for rewriting them in place
 * (image-token KV compression): each page another sequence or a cached prefix also holds is
 * replaced in the table by a free page. old[j − from] gets the id the table had, and c keeps
 * its hold on a replaced page until mmrt_kv_cache_unshare_done(), so the old contents stay
 * readable meanwhile. Not enough free pages is MMRT_ERR_LIMIT and changes nothing. */
mmrt_status mmrt_kv_cache_unshare(struct mmrt_kv_cache *c, int64_t from, int64_t to,
                                  int32_t *old, struct mmrt_error *err);
/* Gives up the holds mmrt_kv_cache_unshare() kept (old as it filled it). */
void mmrt_kv_cache_unshare_done(struct mmrt_kv_cache *c, int64_t from, int64_t to,
                                const int32_t *old);
/* Keeps positions [0, n_tokens) only: the pages past them go back (compression). */
void mmrt_kv_cache_truncate(struct mmrt_kv_cache *c, int64_t n_tokens);

/* Pages positions [0, n_tokens) need beyond what the sequence holds. */
int64_t mmrt_kv_cache_pages_needed(const struct mmrt_kv_cache *c, int64_t n_tokens);

/* Makes sure positions [0, n_tokens) have pages, taking free ones. Beyond n_ctx is
 * MMRT_ERR_LIMIT; no free page is MMRT_ERR_LIMIT naming max_kv_tokens (the sequence keeps
 * what it had). */
mmrt_status mmrt_kv_cache_reserve(struct mmrt_kv_cache *c, int64_t n_tokens,
                                  struct mmrt_error *err);

/* rows[i] = the store row (page · page_tokens + offset) of position first + i, for SET_ROWS
 * into mmrt_kv_pages_rows_view(); the positions must be reserved. */
void mmrt_kv_cache_rows(const struct mmrt_kv_cache *c, int64_t first, int64_t n, int32_t *rows);

/* Layer l's K or V store as SET_ROWS's destination: [n_pages · page_tokens, kv heads, hd]. */
struct mmrt_tensor mmrt_kv_pages_rows_view(const struct mmrt_kv_pages *p, int64_t layer,
                                           bool values);
/* Layer l's K or V row scales (an I8 store), NULL for other dtypes: what every op on the
 * store takes beside it. */
const struct mmrt_tensor *mmrt_kv_pages_scales(const struct mmrt_kv_pages *p, int64_t layer,
                                               bool values);

/* Where one forward's K/V rows go and what its queries see, all device data (a captured
 * step replays with new values): rows [M] (store rows of the new tokens), cu_q [B + 1],
 * kv_len [B] and table [B, width] (each sequence's page ids) for B sequences. */
struct mmrt_kv_step {
    struct mmrt_tensor rows, cu_q, kv_len, table;
};

/* Writes k and v ([M, kv heads, hd] F32) at the step's store rows of layer l, then attends q
 * ([M, heads, hd]) over each sequence's pages: causal, var-length, scale 1/sqrt(hd) unless
 * `scale` is given (> 0), and with window > 0 each query sees only the last `window` positions
 * up to its own (Mistral's sliding window, plugin.h MMRT_OP_ATTENTION; 0 = every earlier
 * position). The window counts positions, which are page-table places: a sequence's cache
 * rows must hold positions 0 … kv_len − 1 in order (image-token KV compression, which moves
 * rows, is refused with a window: core/runtime.c). One definition for prefill chunks and
 * batched decode. */
mmrt_status mmrt_kv_attend(struct mmrt_kv_pages *p, int64_t layer, const struct mmrt_tensor *q,
                           const struct mmrt_tensor *k, const struct mmrt_tensor *v,
                           const struct mmrt_kv_step *s, float scale, int32_t window,
                           const struct mmrt_tensor *out, struct mmrt_error *err);

#endif
