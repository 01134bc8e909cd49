/*
 * core/pool.h — the device memory pool: a buddy allocator over the arenas of one device.
 *
 * Every byte of device memory the core uses (weights, activations, KV blocks, transfer
 * buffers) is a block of some device's pool. The pool does not know plugins: it obtains its
 * arenas through two callbacks (struct mmrt_pool_arena_ops), which the device owner wires to
 * the plugin's arena_alloc / arena_free. Device memory is addressed as (arena handle, byte
 * offset); the pool never dereferences an arena handle, and all of its bookkeeping lives in
 * host memory, because device memory cannot hold free-list links.
 *
 * How the memory is laid out
 *   At create time the configured capacity is carved into power-of-two arenas, greedily:
 *   each is the largest power of two <= min(bytes remaining, max_arena_bytes), until fewer
 *   than min_block_bytes remain (that remainder is dropped; stats report the real capacity).
 *   E.g. 3 GiB with no arena limit gives arenas of 2 GiB and 1 GiB; 3 GiB with a 1 GiB
 *   limit gives three of 1 GiB. All arenas are requested eagerly, in that order (largest
 *   first), so a device's pool is reserved up front and later allocations never reach the
 *   plugin.
 *
 *   Each arena is an independent binary buddy system. A block of order k is
 *   min_block_bytes << k bytes and starts at a byte offset that is a multiple of its own
 *   size (so every block is aligned to min_block_bytes, and to more when it is larger). A
 *   request is rounded up to the smallest order that holds it; the pool takes the smallest
 *   free block of at least that order across all arenas (best fit, so large blocks stay
 *   whole), preferring the lowest arena index and then the lowest offset on ties, and
 *   splits it, keeping the lower half, until it has the order asked for. A freed block
 *   coalesces with its buddy as long as the buddy is free and whole.
 *
 *   Given the same configuration and the same sequence of calls, the pool hands out the
 *   same (arena index, offset) pairs: placement is deterministic.
 *
 * Cost
 *   mmrt_pool_alloc and mmrt_pool_free are O(n_orders · log64(units)) and never allocate
 *   host memory: all metadata is allocated in mmrt_pool_create. That metadata is about
 *   1.25 bytes of host memory per min_block_bytes of capacity (one state byte per unit plus
 *   one free bit per possible block), so a 64 GiB pool with 256-byte blocks needs ~320 MiB
 *   of host memory and with 64 KiB blocks ~1.3 MiB: choose min_block_bytes accordingly.
 *
 * Thread-safety
 *   A pool is NOT internally locked. Every call on one pool, including mmrt_pool_stats and
 *   mmrt_pool_check, must be serialised by the caller — in mmrt that is the owner of the
 *   device, which already serialises all work on a device (see plugin.h, "Ordering and
 *   threads"). Different pools are independent and may be used from different threads.
 *
 * Ownership
 *   The pool owns its arenas from create to destroy: mmrt_pool_destroy returns every arena
 *   through arena_ops.free, whether or not blocks are still allocated in it. Blocks are
 *   plain values (struct mmrt_pool_block) that the caller keeps and hands back to
 *   mmrt_pool_free unchanged; they are invalid once the pool is destroyed.
 */
#ifndef MMRT_CORE_POOL_H
#define MMRT_CORE_POOL_H

#include <stdint.h>

#include "error.h"

/* Orders 0 … MMRT_POOL_MAX_ORDERS−1 can exist: the smallest block is 64 = 2^6 bytes and the
 * largest arena 2^63 bytes, so 63 − 6 + 1 = 58 orders. */
#define MMRT_POOL_MAX_ORDERS 58

/* Default for mmrt_pool_config.min_block_bytes when it is 0. */
#define MMRT_POOL_DEFAULT_MIN_BLOCK 256

/* Most arenas one pool may hold. Only reached by a tiny max_arena_bytes with a large
 * capacity; create then fails with MMRT_ERR_LIMIT instead of asking the device for
 * hundreds of thousands of arenas. */
#define MMRT_POOL_MAX_ARENAS 65536

/* Where the pool gets its arenas. Copied by mmrt_pool_create; `user` must outlive the pool. */
struct mmrt_pool_arena_ops {
    /* Passed back as the first argument of both callbacks. */
    void *user;
    /* Obtains one arena of exactly nbytes (a power of two) and stores its opaque handle in
     * *arena (required). On failure returns a non-OK status (typically MMRT_ERR_OUT_OF_POOL
     * or MMRT_ERR_DEVICE) and may describe it in err; the pool prefixes that line with the
     * arena it was asking for. A NULL handle with MMRT_OK is treated as a device error. */
    mmrt_status (*alloc)(void *user, uint64_t nbytes, void **arena, struct mmrt_error *err);
    /* Returns one arena obtained from alloc (required). Called exactly once per arena, by
     * mmrt_pool_destroy or by a failing mmrt_pool_create. */
    void (*free)(void *user, void *arena);
};

struct mmrt_pool_config {
    /* Total bytes the pool may reserve on the device, e.g. pool_mb << 20. Must be at least
     * min_block_bytes. Need not be a power of two (it becomes several arenas). */
    uint64_t capacity_bytes;
    /* Largest arena the device can give in one allocation, in bytes (e.g. OpenCL's
     * CL_DEVICE_MAX_MEM_ALLOC_SIZE); 0 = no limit. It is rounded down to a power of two and
     * must be at least min_block_bytes. It also bounds the largest block. */
    uint64_t max_arena_bytes;
    /* Size of an order-0 block in bytes: a power of two >= 64, or 0 for
     * MMRT_POOL_DEFAULT_MIN_BLOCK. Every block offset is a multiple of it, so it doubles as
     * the alignment guarantee; every request is rounded up to at least this size. */
    uint64_t min_block_bytes;
};

/* One allocated block, filled by mmrt_pool_alloc; hand it back to mmrt_pool_free as is. */
struct mmrt_pool_block {
    void *arena;        /* arena handle (from arena_ops.alloc); address = (arena, offset) */
    uint64_t offset;    /* byte offset inside the arena; a multiple of nbytes */
    uint64_t nbytes;    /* bytes reserved: min_block_bytes << order, >= requested */
    uint64_t requested; /* bytes asked for; kept so the pool can account internal
                           fragmentation exactly without storing it per block */
};

/* A snapshot of the pool's accounting. All sizes in bytes; every figure is exact. */
struct mmrt_pool_stats {
    uint64_t capacity_bytes;    /* sum of the arena sizes (<= the configured capacity) */
    uint64_t min_block_bytes;   /* size of an order-0 block; order k is min_block_bytes << k */
    uint32_t n_arenas;          /* arenas held */
    uint32_t n_orders;          /* orders 0 … n_orders−1 exist (the largest arena's order + 1) */
    uint64_t bytes_in_use;      /* sum of nbytes (reserved sizes) of live blocks */
    uint64_t peak_bytes_in_use; /* largest bytes_in_use since create or mmrt_pool_reset_peak */
    uint64_t bytes_requested_in_use; /* sum of requested of live blocks; bytes_in_use minus
                                        this is the internal fragmentation */
    uint64_t n_allocs;          /* live blocks */
    uint64_t n_allocs_total;    /* successful mmrt_pool_alloc calls since create */
    uint64_t n_out_of_pool;     /* mmrt_pool_alloc calls that failed with MMRT_ERR_OUT_OF_POOL */
    uint64_t n_bad_frees;       /* mmrt_pool_free calls ignored because the block was not
                                   live (double free, wrong offset/size, foreign arena) */
    uint64_t free_blocks_per_order[MMRT_POOL_MAX_ORDERS]; /* free blocks of each order, all
                                                             arenas; 0 beyond n_orders */
    uint64_t total_free_bytes;  /* capacity_bytes − bytes_in_use */
    uint64_t largest_free_block;/* size of the largest free block, 0 when none is free */
    /* 1 − largest_free_block / total_free_bytes, 0 when nothing is free. 0 means all free
     * memory is one block; note that a fully free pool of several arenas is already
     * fragmented by this measure, since no block spans two arenas. */
    double fragmentation;
};

struct mmrt_pool; /* opaque */

/* Builds a pool: validates cfg, carves the capacity into arenas (see the top of this file),
 * allocates all host metadata, then obtains every arena through ops->alloc.
 * Statuses: MMRT_ERR_INVALID_ARG (NULL cfg/ops/out, NULL callback), MMRT_ERR_CONFIG
 * (min_block_bytes not a power of two >= 64, capacity_bytes or max_arena_bytes smaller
 * than min_block_bytes), MMRT_ERR_LIMIT (more than MMRT_POOL_MAX_ARENAS arenas),
 * MMRT_ERR_NO_MEMORY (host metadata), MMRT_ERR_DEVICE (ops->alloc gave a NULL or
 * duplicate handle), or whatever ops->alloc returned. On failure every arena obtained so
 * far has been returned through ops->free, nothing leaks, and *out is untouched.
 * On success *out owns the pool; release it with mmrt_pool_destroy. */
mmrt_status mmrt_pool_create(const struct mmrt_pool_config *cfg,
                             const struct mmrt_pool_arena_ops *ops, struct mmrt_pool **out,
                             struct mmrt_error *err);

/* Returns every arena through arena_ops.free (live blocks included) and frees the pool.
 * NULL is a no-op. */
void mmrt_pool_destroy(struct mmrt_pool *pool);

/* Reserves a block of at least nbytes: *out gets its arena, offset, reserved size (the
 * next power of two >= max(nbytes, min_block_bytes)) and nbytes as `requested`.
 * Never allocates host memory and never reaches the device.
 * Statuses: MMRT_ERR_INVALID_ARG (NULL pool or out, nbytes == 0); MMRT_ERR_OUT_OF_POOL
 * when no free block is large enough — an ordinary condition, the pool is unchanged and
 * fully usable; the message names the bytes asked, the block size needed, the largest
 * free block, and bytes in use of capacity, e.g. "pool: cannot allocate 123456789 bytes
 * (block of 134217728): largest free block is 67108864 bytes, 98765 in use of
 * 1073741824". *out is written only on success. */
mmrt_status mmrt_pool_alloc(struct mmrt_pool *pool, uint64_t nbytes, struct mmrt_pool_block *out,
                            struct mmrt_error *err);

/* Returns a block to the pool and coalesces it with its free buddies. `block` must be a
 * block this pool handed out and has not taken back, with every field as
 * mmrt_pool_alloc wrote it. Anything else — NULL block, an arena this pool does not own
 * (NULL included), an offset that does not start a live block, a wrong nbytes or
 * requested, a second free of the same block — is detected, ignored (the pool is not
 * modified) and counted in stats.n_bad_frees. (A stale copy of a block whose memory was
 * since handed out again with the same offset and size cannot be told apart and frees the
 * new block.) NULL pool is a no-op. */
void mmrt_pool_free(struct mmrt_pool *pool, const struct mmrt_pool_block *block);

/* Fills *out with the current accounting (see struct mmrt_pool_stats). O(n_orders).
 * NULL pool gives all zeros; NULL out is a no-op. */
void mmrt_pool_stats(const struct mmrt_pool *pool, struct mmrt_pool_stats *out);

/* Starts a new peak window: peak_bytes_in_use = bytes_in_use. NULL is a no-op. */
void mmrt_pool_reset_peak(struct mmrt_pool *pool);

/* Walks all metadata and verifies the invariants: in every arena the blocks tile it
 * exactly (no overlap, no gap), each block is aligned to its size and within its arena,
 * every free block is on the free list of its order and the lists hold nothing else, no
 * two free buddies coexist un-coalesced, the per-order and per-arena summaries agree with
 * the lists, and the byte and block counts agree with the walk. O(capacity /
 * min_block_bytes); meant for tests and debug builds.
 * Statuses: MMRT_ERR_INVALID_ARG (NULL pool); MMRT_ERR_INTERNAL on the first violation,
 * with a message naming the arena index, byte offset and order involved. */
mmrt_status mmrt_pool_check(const struct mmrt_pool *pool, struct mmrt_error *err);

#endif /* MMRT_CORE_POOL_H */
