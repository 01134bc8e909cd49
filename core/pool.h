/*
 * core/pool.h — the device memory pool: two levels over the arenas of one device.
 *
 * Every byte of working memory the core uses on a device (activations, scratch, KV pages,
 * transfer buffers) is a block of that device's pool. The pool does not know plugins: it
 * obtains its arenas through two callbacks (struct mmrt_pool_arena_ops), which the device
 * owner wires to the plugin's arena_alloc / arena_free. Device memory is addressed as (arena
 * handle, byte offset); the pool never dereferences an arena handle, and all of its
 * bookkeeping lives in host memory, because device memory cannot hold free-list links.
 *
 * Level 2: a buddy allocator
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
 *   size. A request is rounded up to the smallest order that holds it; the pool takes the
 *   smallest free block of at least that order across all arenas (best fit, so large blocks
 *   stay whole), preferring the lowest arena index and then the lowest offset on ties, and
 *   splits it, keeping the lower half, until it has the order asked for. A freed block
 *   coalesces with its buddy as long as the buddy is free and whole.
 *
 * Level 1: exact-size slots for the sizes that recur
 *   Why: a step of a model asks for the same shapes every time (a decode step every token,
 *   a prefill of a given prompt length each time it is run), and the buddy rounds each of
 *   them up to a power of two: a 2.1 MiB activation holds 4 MiB. Level 1 serves such sizes
 *   from slabs, so that several of them share what level 2 would round up separately, and
 *   hands a freed slot to the next request of its size without going back to level 2.
 *
 *   A size class is one request size rounded up to a multiple of min_block_bytes, s, with
 *   P = the power of two level 2 would give it. A slab is one level-2 block of 2^m bytes
 *   carved into n = min(2^m / s, MMRT_POOL_L1_MAX_SLOTS) slots of exactly s bytes at
 *   s-byte steps from its start: three 2.1 MiB slots share an 8 MiB slab where level 2
 *   would hold 12 MiB, seven share 16 MiB.
 *   - A size becomes a class the second time it is asked for; the first request is served
 *     by level 2 and only recorded, so a size seen once (an odd prompt length) costs no
 *     slab. Sizes whose P is above the largest slab (1/8 of the capacity, rounded down to
 *     a power of two) always go to level 2: one class's slab can never hold most of the
 *     pool.
 *   - Slabs follow demand, never predict it. A new slab is one P block with one slot, taken
 *     where level 2 would have put the block anyway (best fit). When its class needs a slot
 *     and has none free, a full slab that is the lower half of its parent doubles into its
 *     buddy if that buddy is a free level-2 block and the doubled slab costs no more than
 *     level 2 would for the slab's slots plus the new one (2^(m+1) <= (n + 1) · P): 4 MiB
 *     (one 2.1 MiB slot) grows to 8 MiB (three), to 16 MiB (seven). A power-of-two size
 *     never grows past one slot (sharing cannot save anything there); its slabs are
 *     cached blocks.
 *     Why not more: measured on synthetic vision-language request streams (the one of
 *     tests/test_pool.c, test_mixed_workload, at five model widths), slabs sized in
 *     advance from each class's peak concurrency held up to 20% less at steady state but,
 *     since a slab commits all its slots at once and stays whole while any slot lives,
 *     needed up to 10% more capacity than level 2 alone at two of the widths; keeping
 *     empty slabs from step to step (returning them only when level 2 ran out) needed up
 *     to 14% more, and trimming every block to its exact size 40% more (small blocks
 *     settle in the freed tails and large ones stop coalescing). Growing only into free
 *     buddies keeps level 2's placement, and with it level 2's capacity needs.
 *   - A slot is taken from the fullest partly used slab of its class (so the others can
 *     empty), then from an empty one, lowest (arena, offset) first on ties; in a slab, the
 *     lowest free slot.
 *   - Giving memory back: freeing a slot leaves its slab as it is, so that requests of its
 *     size coming back before anything else needs level 2 find it as it was (the layers of
 *     a step, a decode loop that allocates nothing new: all hits). Before level 2 is asked
 *     for memory — a new slab, a growth, a request level 1 does not serve — level 1 gives
 *     back everything no live slot needs: every empty slab, and every upper half that no
 *     live slot of its slab reaches into (repeatedly, so a slab shrinks to what its
 *     highest live slot needs). So level 2 never places a block around memory that is
 *     free, and never fails while level 1 holds a wholly free slab. Only the free slots
 *     below a live slot stay with level 1; they serve their own size only.
 *   - Limits: at most MMRT_POOL_L1_MAX_CLASSES classes (sizes seen once included) and
 *     MMRT_POOL_L1_MAX_SLABS slabs. A new size evicts the least recently asked-for class
 *     with no live slot (its empty slabs go back to level 2); when every class has live
 *     slots, or every slab record is in use, the request goes to level 2.
 *   - A block from level 1 is an ordinary struct mmrt_pool_block: its arena and offset lead
 *     mmrt_pool_free to the level-2 block around it, which is a slab, and to the slot.
 *
 *   mmrt_pool_config.level1 switches level 1 off, so the same workload can be measured
 *   with the buddy alone; with it off the pool behaves exactly as level 2 alone.
 *
 *   Given the same configuration and the same sequence of calls, the pool hands out the
 *   same (arena index, offset, nbytes) blocks: placement is deterministic with both levels
 *   (every choice depends on sizes, offsets and call order, never on host addresses).
 *
 * Cost
 *   mmrt_pool_alloc and mmrt_pool_free never allocate host memory: all metadata is
 *   allocated in mmrt_pool_create. Level 2 needs about 1.25 bytes of host memory per
 *   min_block_bytes of capacity (one state byte per unit plus one free bit per possible
 *   block), so a 64 GiB pool with 256-byte blocks needs ~320 MiB of host memory and with
 *   64 KiB blocks ~1.3 MiB: choose min_block_bytes accordingly. Level 1 adds a fixed
 *   ~70 KiB per pool (its class and slab records and their hash indexes), none when off.
 *   Level 2 operations are O(n_orders · log64(units)). A level-1 hit is O(slabs of the
 *   class); a free is O(n_orders) to find the block around the offset. Rarer events cost
 *   more: evicting a class scans the MMRT_POOL_L1_MAX_CLASSES records, and giving memory
 *   back before a level-2 allocation is O(n_orders) per slab that has some to give.
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

/* Level-1 bounds (see "Level 1" above): size classes remembered (including sizes seen
 * once), slabs held, and slots in one slab. */
#define MMRT_POOL_L1_MAX_CLASSES 256
#define MMRT_POOL_L1_MAX_SLABS 1024
#define MMRT_POOL_L1_MAX_SLOTS 64

/* mmrt_pool_config.level1. The zero value is the default, so a zero-initialised config
 * gets level 1. */
enum mmrt_pool_level1 {
    MMRT_POOL_LEVEL1_DEFAULT = 0, /* on */
    MMRT_POOL_LEVEL1_ON = 1,
    MMRT_POOL_LEVEL1_OFF = 2,     /* level 2 alone: every request is a power-of-two block */
};

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
    /* Whether level 1 serves recurring sizes (enum mmrt_pool_level1); any other value is
     * MMRT_ERR_CONFIG. */
    enum mmrt_pool_level1 level1;
};

/* One allocated block, filled by mmrt_pool_alloc; hand it back to mmrt_pool_free as is. */
struct mmrt_pool_block {
    void *arena;        /* arena handle (from arena_ops.alloc); address = (arena, offset) */
    uint64_t offset;    /* byte offset inside the arena; a multiple of min_block_bytes (and,
                           for a level-2 block, of nbytes) */
    uint64_t nbytes;    /* bytes reserved, >= requested: requested rounded up to a multiple
                           of min_block_bytes for a level-1 slot, min_block_bytes << order
                           for a level-2 block */
    uint64_t requested; /* bytes asked for; kept so the pool can account internal
                           fragmentation exactly without storing it per block */
};

/* A snapshot of the pool's accounting. All sizes in bytes; every figure is exact.
 *
 * Where the capacity is, at any moment:
 *   capacity_bytes = bytes_in_use                       live blocks (slots and level-2 blocks)
 *                  + level1_free_bytes                  in slabs, not in a live slot
 *                  + level-2 free blocks                (free_blocks_per_order)
 * and level1_free_bytes splits into level1_returnable_bytes (free to any request: level 1
 * gives that memory back before level 2 allocates anything) and the free slots and tails
 * that live slots of the same slab keep (free only to their own size). So:
 *   total_free_bytes = level-2 free blocks + level1_returnable_bytes
 *                                                  (free to a request of any size)
 *   bytes_held       = capacity_bytes − total_free_bytes   (what a workload needs)
 * With level 1 off, level1_* are 0, bytes_held = bytes_in_use and total_free_bytes =
 * capacity_bytes − bytes_in_use, as in a plain buddy allocator. */
struct mmrt_pool_stats {
    uint64_t capacity_bytes;    /* sum of the arena sizes (<= the configured capacity) */
    uint64_t min_block_bytes;   /* size of an order-0 block; order k is min_block_bytes << k */
    uint32_t n_arenas;          /* arenas held */
    uint32_t n_orders;          /* orders 0 … n_orders−1 exist (the largest arena's order + 1) */
    uint64_t bytes_in_use;      /* sum of nbytes (reserved sizes) of live blocks */
    uint64_t peak_bytes_in_use; /* largest bytes_in_use since create or mmrt_pool_reset_peak */
    uint64_t bytes_requested_in_use; /* sum of requested of live blocks; bytes_in_use minus
                                        this is the internal fragmentation of live blocks */
    uint64_t n_allocs;          /* live blocks */
    uint64_t n_allocs_total;    /* successful mmrt_pool_alloc calls since create */
    uint64_t n_out_of_pool;     /* mmrt_pool_alloc calls that failed with MMRT_ERR_OUT_OF_POOL */
    uint64_t n_bad_frees;       /* mmrt_pool_free calls ignored because the block was not
                                   live (double free, wrong offset/size, foreign arena) */
    uint64_t free_blocks_per_order[MMRT_POOL_MAX_ORDERS]; /* level 2's free blocks of each
                                                             order, all arenas; 0 beyond
                                                             n_orders (what level 1 would
                                                             give back is not counted here) */
    uint64_t total_free_bytes;  /* free to a request of any size (see above) */
    uint64_t largest_free_block;/* the largest block a request of any size can get now:
                                   level 2's largest free block once level 1 has given back
                                   level1_returnable_bytes (and it coalesced); 0 when none
                                   is free */
    /* 1 − largest_free_block / total_free_bytes, 0 when nothing is free: the external
     * fragmentation of the memory free to any request. 0 means all of it is one block;
     * note that a fully free pool of several arenas is already fragmented by this
     * measure, since no block spans two arenas. Free slots of partly used slabs are not
     * in it (they serve only their size): their cost shows in bytes_held. */
    double fragmentation;
    uint64_t bytes_held;        /* capacity_bytes − total_free_bytes */
    uint64_t peak_bytes_held;   /* largest bytes_held since create or mmrt_pool_reset_peak:
                                   the capacity the workload needed, external fragmentation
                                   aside */

    /* Level 1 (all 0 when it is off). */
    uint32_t level1_enabled;    /* 1 when level 1 is on */
    uint32_t level1_n_classes;  /* size classes remembered, sizes seen once included */
    uint32_t level1_n_slabs;    /* slabs held, used or not */
    uint32_t level1_n_empty_slabs; /* of those, slabs with no live slot */
    uint64_t level1_hits;       /* allocations served from a free slot, without level 2 */
    uint64_t level1_misses;     /* allocations that reached level 2 (a new slab, a growth
                                   or a block of their own); hits + misses = n_allocs_total */
    uint64_t level1_bytes;      /* bytes of the level-2 blocks held as slabs */
    uint64_t level1_free_bytes; /* of those, bytes not in a live slot (free slots, slab
                                   tails, empty slabs) */
    uint64_t level1_returnable_bytes; /* of those, what level 1 gives back before level 2's
                                         next allocation: empty slabs, and upper halves of
                                         slabs that no live slot reaches into */
    uint64_t level1_n_flushes;  /* times level 1 gave memory back because level 2 was about
                                   to be asked for some */
};

struct mmrt_pool; /* opaque */

/* An observer of every successful mmrt_pool_alloc and every accepted mmrt_pool_free of a
 * pool, so a tool can record the calls a real workload makes and replay them against other
 * capacities or level-1 settings (tools/bench/frag.c). Called after an allocation and
 * before a free takes effect, with the block as the caller sees it. */
struct mmrt_pool_trace {
    void *user;
    void (*alloc)(void *user, const struct mmrt_pool_block *block);
    void (*free)(void *user, const struct mmrt_pool_block *block);
};

/* Pools created after this call report to *trace (copied; NULL: pools created afterwards
 * report to nothing). Process-wide and not synchronised: for tools and tests that set it
 * before creating a runtime, never for the library itself. */
void mmrt_pool_trace_new_pools(const struct mmrt_pool_trace *trace);

/* Builds a pool: validates cfg, carves the capacity into arenas (see the top of this file),
 * allocates all host metadata, then obtains every arena through ops->alloc.
 * Statuses: MMRT_ERR_INVALID_ARG (NULL cfg/ops/out, NULL callback), MMRT_ERR_CONFIG
 * (min_block_bytes not a power of two >= 64, capacity_bytes or max_arena_bytes smaller
 * than min_block_bytes, level1 not an enum mmrt_pool_level1 value), MMRT_ERR_LIMIT (more than MMRT_POOL_MAX_ARENAS arenas),
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

/* Reserves a block of at least nbytes: *out gets its arena, offset, reserved size and
 * nbytes as `requested`. The reserved size is nbytes rounded up to a multiple of
 * min_block_bytes when level 1 serves it (a slot), else the next power of two >=
 * max(nbytes, min_block_bytes) (a level-2 block). Never allocates host memory and never
 * reaches the device.
 * Statuses: MMRT_ERR_INVALID_ARG (NULL pool or out, nbytes == 0); MMRT_ERR_OUT_OF_POOL
 * when no free block is large enough even after level 1 gave back all it could — an
 * ordinary condition, the pool is fully usable (only those returns have changed it); the
 * message names the bytes asked, the level-2 block size needed, the largest free block,
 * and bytes in use of capacity, e.g. "pool: cannot allocate 123456789 bytes (block of
 * 134217728): largest free block is 67108864 bytes, 98765 in use of 1073741824", followed,
 * when level 1 holds slabs, by "; level 1 holds N bytes in slabs, M of them in free
 * slots". *out is written only on success. */
mmrt_status mmrt_pool_alloc(struct mmrt_pool *pool, uint64_t nbytes, struct mmrt_pool_block *out,
                            struct mmrt_error *err);

/* Returns a block to the pool: a level-2 block coalesces with its free buddies, a slot
 * goes back to its slab (and an emptied slab is kept or returned as described under
 * "Level 1"). `block` must be a block this pool handed out and has not taken back, with
 * every field as mmrt_pool_alloc wrote it. Anything else — NULL block, an arena this pool
 * does not own (NULL included), an offset that does not start a live block or live slot,
 * a wrong nbytes or requested, a second free of the same block — is detected, ignored
 * (the pool is not modified) and counted in stats.n_bad_frees. (A stale copy of a block whose memory was
 * since handed out again with the same offset and size cannot be told apart and frees the
 * new block.) NULL pool is a no-op. */
void mmrt_pool_free(struct mmrt_pool *pool, const struct mmrt_pool_block *block);

/* Fills *out with the current accounting (see struct mmrt_pool_stats). O(n_orders), plus,
 * for largest_free_block, a walk from the memory level 1 would give back over the blocks
 * it would coalesce with. NULL pool gives all zeros; NULL out is a no-op. */
void mmrt_pool_stats(const struct mmrt_pool *pool, struct mmrt_pool_stats *out);

/* Starts a new peak window: peak_bytes_in_use = bytes_in_use and peak_bytes_held =
 * bytes_held. NULL is a no-op. */
void mmrt_pool_reset_peak(struct mmrt_pool *pool);

/* Walks all metadata and verifies the invariants.
 * Level 2: in every arena the blocks tile it exactly (no overlap, no gap), each block is
 * aligned to its size and within its arena, every free block is on the free list of its
 * order and the lists hold nothing else, no two free buddies coexist un-coalesced, the
 * per-order and per-arena summaries agree with the lists.
 * Level 1: every slab is a live (allocated) level-2 block of its recorded order, at least
 * the order one slot needs, found at its place by the slab index, of a live class whose
 * size it is carved for; its slot count is what that size and order give; its used-slot
 * bitmap sets no bit beyond its slots and agrees with its used count (so no slot is both
 * free and handed out); each class's slab list holds exactly the slabs that name it, and
 * its slab, slot and live counts agree with them; a size seen once has no slabs; the
 * slack list holds exactly the slabs with memory no live slot needs, and the empty-slab
 * and returnable-byte counts agree with the slabs; the class and slab indexes point only
 * at live records; the unused and live records add up to the limits.
 * Both: bytes and blocks in use, level-1 bytes (total, in live slots, returnable),
 * the peaks, and hits + misses agree with the walk. O(capacity / min_block_bytes +
 * level-1 records); meant for tests and debug builds.
 * Statuses: MMRT_ERR_INVALID_ARG (NULL pool); MMRT_ERR_INTERNAL on the first violation,
 * with a message naming the arena index, byte offset and order involved, or the slab
 * (its arena, offset and order) or class (its size). */
mmrt_status mmrt_pool_check(const struct mmrt_pool *pool, struct mmrt_error *err);

#endif /* MMRT_CORE_POOL_H */
