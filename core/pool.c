/*
 * core/pool.c — buddy allocator over device arenas (see pool.h).
 *
 * Algorithm: the binary buddy system (Knowlton 1965; Knuth, TAOCP vol. 1, §2.5, Algorithm R
 * and S), one independent buddy system per arena. Unlike SQLite's mem5.c, which keeps its
 * free-list links inside the managed memory, every piece of metadata here is in host
 * memory, since the managed memory is on a device and is addressed only by offset.
 *
 * Data structure, per arena of 2^m units (a unit is min_block bytes):
 *   state[u]  one byte per unit. The first unit of every block (its "head") holds
 *             HEAD | order, plus FREE when the block is free; every other unit is 0.
 *   bits      for each order k = 0 … m, a hierarchical bitset of 2^(m−k) bits: bit i set
 *             ⇔ the block of order k at unit i·2^k is free. Level 0 is the bitset itself,
 *             level j+1 has one bit per word of level j (set ⇔ that word is non-zero),
 *             up to a single top word. find-first-set then costs one ctz per level, which
 *             gives the lowest free offset of an order in O(log64 units) — these bitsets
 *             are the free lists. The bitsets of all orders sit in one array; the one of
 *             order k starts at word hb_off[m − k] (hb_off depends only on the bit count).
 * Per pool:
 *   avail     for each order, a hierarchical bitset over arenas: bit a set ⇔ arena a has
 *             a free block of that order. Best fit is then the first non-empty order
 *             >= the one needed, and in it the first arena, and in that the first block.
 *   n_free[k] free blocks of order k in all arenas, for stats.
 *   by_handle arenas sorted by handle, so mmrt_pool_free finds an arena by binary search.
 *
 * Invariants (all verified by mmrt_pool_check):
 *   - the heads of each arena tile it: from unit 0, each head's block ends where the next
 *     head starts, the last ends at the arena's end, and a block of order k starts at a
 *     multiple of 2^k units;
 *   - a block is in the order-k bitset ⇔ its head is HEAD | FREE | k;
 *   - a free block's buddy is never a free block of the same order (coalescing is eager);
 *   - upper bitset levels summarise lower ones exactly; avail and n_free agree with bits;
 *   - bytes_in_use and n_allocs are the sums over allocated heads.
 * Split sets one new head (the upper half) and coalescing clears one, so no operation
 * touches more than O(orders) state bytes.
 */
#include "pool.h"

#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define ST_HEAD 0x80u  /* this unit starts a block */
#define ST_FREE 0x40u  /* that block is free */
#define ST_ORDER 0x3fu /* that block's order */

#define HB_MAX_LEVELS 12 /* log64(2^64) rounded up, plus one */

_Static_assert(MMRT_POOL_MAX_ORDERS - 1 <= ST_ORDER, "order must fit in the state byte");

struct arena {
    void *handle;      /* from ops.alloc; NULL until obtained */
    uint64_t nbytes;   /* min_block << max_order */
    unsigned max_order;
    uint64_t *bits;    /* free-block bitsets of all orders, hb_off[max_order + 1] words */
    uint8_t *state;    /* [2^max_order] state bytes; lives in the same allocation as bits */
};

struct handle_ix {
    uintptr_t handle;
    uint32_t arena;
};

struct mmrt_pool {
    struct mmrt_pool_arena_ops ops;
    uint64_t capacity;       /* sum of arena sizes */
    uint64_t min_block;
    unsigned min_shift;      /* log2(min_block) */
    unsigned n_orders;       /* arenas[0].max_order + 1 (arenas are largest first) */
    uint32_t n_arenas;
    struct arena *arenas;    /* [n_arenas] */
    struct handle_ix *by_handle; /* [n_arenas], sorted by handle */
    uint64_t *avail;         /* [n_orders][avail_words] */
    uint64_t avail_words;
    uint64_t hb_off[MMRT_POOL_MAX_ORDERS + 1]; /* hb_off[e]: words of bitsets of 2^0 … 2^(e−1) bits */
    uint64_t n_free[MMRT_POOL_MAX_ORDERS];

    uint64_t bytes_in_use, peak_bytes_in_use, bytes_requested_in_use;
    uint64_t n_allocs, n_allocs_total, n_out_of_pool, n_bad_frees;
};

/* ---- hierarchical bitsets ------------------------------------------------------------ */

static uint64_t hb_words(uint64_t nbits)
{
    uint64_t total = 0;
    for (;;) {
        uint64_t nw = (nbits + 63) / 64;
        total += nw;
        if (nw == 1)
            return total;
        nbits = nw;
    }
}

/* Sets bit i; returns true when the set was empty before. */
static bool hb_set(uint64_t *w, uint64_t nbits, uint64_t i)
{
    for (;;) {
        uint64_t nw = (nbits + 63) / 64;
        uint64_t was = w[i >> 6];
        w[i >> 6] = was | (UINT64_C(1) << (i & 63));
        if (was != 0)
            return false;
        if (nw == 1)
            return true;
        w += nw;
        nbits = nw;
        i >>= 6;
    }
}

/* Clears bit i (which is set); returns true when the set is now empty. */
static bool hb_clear(uint64_t *w, uint64_t nbits, uint64_t i)
{
    for (;;) {
        uint64_t nw = (nbits + 63) / 64;
        w[i >> 6] &= ~(UINT64_C(1) << (i & 63));
        if (w[i >> 6] != 0)
            return false;
        if (nw == 1)
            return true;
        w += nw;
        nbits = nw;
        i >>= 6;
    }
}

static bool hb_test(const uint64_t *w, uint64_t i)
{
    return (w[i >> 6] >> (i & 63)) & 1;
}

/* Lowest set bit into *out; false when the set is empty. */
static bool hb_first(const uint64_t *w, uint64_t nbits, uint64_t *out)
{
    const uint64_t *level[HB_MAX_LEVELS];
    int n_levels = 0;
    for (;;) {
        uint64_t nw = (nbits + 63) / 64;
        level[n_levels++] = w;
        if (nw == 1)
            break;
        w += nw;
        nbits = nw;
    }
    uint64_t i = 0;
    for (int l = n_levels - 1; l >= 0; l--) {
        uint64_t word = level[l][i];
        if (word == 0) {
            assert(l == n_levels - 1); /* a set summary bit means a non-zero word below */
            return false;
        }
        i = i * 64 + (uint64_t)__builtin_ctzll(word);
    }
    *out = i;
    return true;
}

/* Verifies the summary levels and that no bit beyond nbits is set. Returns the number of
 * set bits of level 0, or −1 (with *bad_level) when the structure is inconsistent. */
static int64_t hb_verify(const uint64_t *w, uint64_t nbits, int *bad_level)
{
    int64_t count = 0;
    for (int l = 0;; l++) {
        uint64_t nw = (nbits + 63) / 64;
        if (nbits % 64 != 0 && (w[nw - 1] >> (nbits % 64)) != 0) {
            *bad_level = l;
            return -1;
        }
        for (uint64_t j = 0; j < nw; j++) {
            if (l == 0)
                count += __builtin_popcountll(w[j]);
            if (nw > 1 && hb_test(w + nw, j) != (w[j] != 0)) {
                *bad_level = l + 1;
                return -1;
            }
        }
        if (nw == 1)
            return count;
        w += nw;
        nbits = nw;
    }
}

/* ---- free lists ---------------------------------------------------------------------- */

static uint64_t *arena_bits(const struct mmrt_pool *pool, const struct arena *ar, unsigned k)
{
    return ar->bits + pool->hb_off[ar->max_order - k];
}

static uint64_t *avail_bits(const struct mmrt_pool *pool, unsigned k)
{
    return pool->avail + (uint64_t)k * pool->avail_words;
}

static void free_list_add(struct mmrt_pool *pool, uint32_t a, unsigned k, uint64_t unit)
{
    struct arena *ar = &pool->arenas[a];
    ar->state[unit] = (uint8_t)(ST_HEAD | ST_FREE | k);
    if (hb_set(arena_bits(pool, ar, k), UINT64_C(1) << (ar->max_order - k), unit >> k))
        hb_set(avail_bits(pool, k), pool->n_arenas, a);
    pool->n_free[k]++;
}

static void free_list_remove(struct mmrt_pool *pool, uint32_t a, unsigned k, uint64_t unit)
{
    struct arena *ar = &pool->arenas[a];
    if (hb_clear(arena_bits(pool, ar, k), UINT64_C(1) << (ar->max_order - k), unit >> k))
        hb_clear(avail_bits(pool, k), pool->n_arenas, a);
    pool->n_free[k]--;
}

static uint64_t largest_free(const struct mmrt_pool *pool)
{
    for (unsigned k = pool->n_orders; k-- > 0;)
        if (pool->n_free[k] > 0)
            return pool->min_block << k;
    return 0;
}

/* Smallest order whose blocks hold nbytes; nbytes <= the largest arena. */
static unsigned order_for(const struct mmrt_pool *pool, uint64_t nbytes)
{
    if (nbytes <= pool->min_block)
        return 0;
    return (unsigned)(64 - __builtin_clzll(nbytes - 1)) - pool->min_shift;
}

static bool find_arena(const struct mmrt_pool *pool, const void *handle, uint32_t *a)
{
    uintptr_t h = (uintptr_t)handle;
    uint32_t lo = 0, hi = pool->n_arenas;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pool->by_handle[mid].handle < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == pool->n_arenas || pool->by_handle[lo].handle != h)
        return false;
    *a = pool->by_handle[lo].arena;
    return true;
}

static int cmp_handle(const void *x, const void *y)
{
    uintptr_t a = ((const struct handle_ix *)x)->handle, b = ((const struct handle_ix *)y)->handle;
    return (a > b) - (a < b);
}

/* ---- create / destroy ---------------------------------------------------------------- */

static uint64_t floor_pow2(uint64_t x)
{
    return UINT64_C(1) << (63 - __builtin_clzll(x));
}

static bool is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

mmrt_status mmrt_pool_create(const struct mmrt_pool_config *cfg,
                             const struct mmrt_pool_arena_ops *ops, struct mmrt_pool **out,
                             struct mmrt_error *err)
{
    if (!cfg || !ops || !out || !ops->alloc || !ops->free)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pool: create: NULL %s",
                              !cfg ? "config" : !ops ? "arena ops" : !out ? "out"
                              : "arena ops callback");
    uint64_t min_block = cfg->min_block_bytes ? cfg->min_block_bytes : MMRT_POOL_DEFAULT_MIN_BLOCK;
    if (!is_pow2(min_block) || min_block < 64)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "pool: min_block_bytes %" PRIu64
                              " is not a power of two >= 64", min_block);
    if (cfg->capacity_bytes < min_block)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "pool: capacity_bytes %" PRIu64
                              " is smaller than min_block_bytes %" PRIu64,
                              cfg->capacity_bytes, min_block);
    if (cfg->max_arena_bytes != 0 && cfg->max_arena_bytes < min_block)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "pool: max_arena_bytes %" PRIu64
                              " is smaller than min_block_bytes %" PRIu64,
                              cfg->max_arena_bytes, min_block);

    /* Carve: capacity / cap full arenas, then one per set bit of the rest >= min_block. */
    uint64_t cap = cfg->max_arena_bytes ? floor_pow2(cfg->max_arena_bytes) : UINT64_C(1) << 63;
    uint64_t n_full = cfg->capacity_bytes / cap;
    uint64_t rest = (cfg->capacity_bytes % cap) & ~(min_block - 1);
    uint64_t n_arenas = n_full + (uint64_t)__builtin_popcountll(rest);
    if (n_arenas > MMRT_POOL_MAX_ARENAS)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "pool: %" PRIu64 " bytes in arenas of at most %"
                              PRIu64 " bytes would need %" PRIu64 " arenas (limit %d); raise "
                              "max_arena_bytes", cfg->capacity_bytes, cap, n_arenas,
                              MMRT_POOL_MAX_ARENAS);

    mmrt_status st = MMRT_OK;
    struct mmrt_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "pool: out of host memory for the pool");
    pool->ops = *ops;
    pool->min_block = min_block;
    pool->min_shift = (unsigned)__builtin_ctzll(min_block);
    pool->n_arenas = (uint32_t)n_arenas;
    for (unsigned e = 0; e < MMRT_POOL_MAX_ORDERS; e++)
        pool->hb_off[e + 1] = pool->hb_off[e] + hb_words(UINT64_C(1) << e);

    pool->arenas = calloc(n_arenas, sizeof *pool->arenas);
    pool->by_handle = calloc(n_arenas, sizeof *pool->by_handle);
    if (!pool->arenas || !pool->by_handle) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "pool: out of host memory for %" PRIu64
                            " arena records", n_arenas);
        goto fail;
    }
    uint64_t left = cfg->capacity_bytes;
    for (uint32_t a = 0; a < pool->n_arenas; a++) {
        struct arena *ar = &pool->arenas[a];
        ar->nbytes = floor_pow2(left < cap ? left : cap);
        left -= ar->nbytes;
        ar->max_order = (unsigned)__builtin_ctzll(ar->nbytes) - pool->min_shift;
        pool->capacity += ar->nbytes;
    }
    pool->n_orders = pool->arenas[0].max_order + 1;
    pool->avail_words = hb_words(n_arenas);
    pool->avail = calloc(pool->n_orders * pool->avail_words, sizeof *pool->avail);
    if (!pool->avail) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "pool: out of host memory for the "
                            "free-block summary");
        goto fail;
    }

    /* All host metadata first, so a host shortage never costs a device allocation. */
    for (uint32_t a = 0; a < pool->n_arenas; a++) {
        struct arena *ar = &pool->arenas[a];
        uint64_t n_units = UINT64_C(1) << ar->max_order;
        uint64_t words = pool->hb_off[ar->max_order + 1];
        if (words > (SIZE_MAX - n_units) / sizeof(uint64_t) ||
            !(ar->bits = calloc(1, (size_t)(words * sizeof(uint64_t) + n_units)))) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "pool: out of host memory for the "
                                "metadata of arena %" PRIu32 " (%" PRIu64 " bytes, %" PRIu64
                                " blocks of %" PRIu64 ")", a, ar->nbytes, n_units, min_block);
            goto fail;
        }
        ar->state = (uint8_t *)(ar->bits + words);
    }

    for (uint32_t a = 0; a < pool->n_arenas; a++) {
        struct arena *ar = &pool->arenas[a];
        struct mmrt_error aerr = {MMRT_OK, ""};
        void *handle = NULL;
        st = ops->alloc(ops->user, ar->nbytes, &handle, &aerr);
        if (st != MMRT_OK) {
            st = mmrt_error_set(err, st, "pool: arena %" PRIu32 " of %" PRIu32 " (%" PRIu64
                                " bytes): %s", a, pool->n_arenas, ar->nbytes,
                                aerr.msg[0] ? aerr.msg : mmrt_status_message(st));
            goto fail;
        }
        if (!handle) {
            st = mmrt_error_set(err, MMRT_ERR_DEVICE, "pool: arena %" PRIu32 " of %" PRIu32
                                " (%" PRIu64 " bytes): allocator returned success with a NULL "
                                "handle", a, pool->n_arenas, ar->nbytes);
            goto fail;
        }
        ar->handle = handle;
        pool->by_handle[a] = (struct handle_ix){(uintptr_t)handle, a};
    }
    qsort(pool->by_handle, pool->n_arenas, sizeof *pool->by_handle, cmp_handle);
    for (uint32_t i = 1; i < pool->n_arenas; i++) {
        if (pool->by_handle[i].handle == pool->by_handle[i - 1].handle) {
            st = mmrt_error_set(err, MMRT_ERR_DEVICE, "pool: allocator returned the same "
                                "handle for arenas %" PRIu32 " and %" PRIu32,
                                pool->by_handle[i - 1].arena < pool->by_handle[i].arena
                                    ? pool->by_handle[i - 1].arena : pool->by_handle[i].arena,
                                pool->by_handle[i - 1].arena < pool->by_handle[i].arena
                                    ? pool->by_handle[i].arena : pool->by_handle[i - 1].arena);
            goto fail;
        }
    }

    for (uint32_t a = 0; a < pool->n_arenas; a++)
        free_list_add(pool, a, pool->arenas[a].max_order, 0);
    *out = pool;
    return MMRT_OK;

fail:
    mmrt_pool_destroy(pool);
    return st;
}

void mmrt_pool_destroy(struct mmrt_pool *pool)
{
    if (!pool)
        return;
    if (pool->arenas) {
        for (uint32_t a = pool->n_arenas; a-- > 0;) {
            if (pool->arenas[a].handle)
                pool->ops.free(pool->ops.user, pool->arenas[a].handle);
            free(pool->arenas[a].bits);
        }
    }
    free(pool->arenas);
    free(pool->by_handle);
    free(pool->avail);
    free(pool);
}

/* ---- alloc / free -------------------------------------------------------------------- */

mmrt_status mmrt_pool_alloc(struct mmrt_pool *pool, uint64_t nbytes, struct mmrt_pool_block *out,
                            struct mmrt_error *err)
{
    if (!pool || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pool: alloc: NULL %s",
                              !pool ? "pool" : "out");
    if (nbytes == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pool: cannot allocate 0 bytes");
    uint64_t largest_arena = pool->min_block << (pool->n_orders - 1);
    if (nbytes > largest_arena) {
        pool->n_out_of_pool++;
        return mmrt_error_set(err, MMRT_ERR_OUT_OF_POOL, "pool: cannot allocate %" PRIu64
                              " bytes (larger than the largest arena, %" PRIu64 " bytes): "
                              "largest free block is %" PRIu64 " bytes, %" PRIu64 " in use of %"
                              PRIu64, nbytes, largest_arena, largest_free(pool),
                              pool->bytes_in_use, pool->capacity);
    }
    unsigned need = order_for(pool, nbytes), k;
    uint64_t a = 0, unit = 0;
    for (k = need; k < pool->n_orders; k++)
        if (hb_first(avail_bits(pool, k), pool->n_arenas, &a))
            break;
    if (k == pool->n_orders) {
        pool->n_out_of_pool++;
        return mmrt_error_set(err, MMRT_ERR_OUT_OF_POOL, "pool: cannot allocate %" PRIu64
                              " bytes (block of %" PRIu64 "): largest free block is %" PRIu64
                              " bytes, %" PRIu64 " in use of %" PRIu64, nbytes,
                              pool->min_block << need, largest_free(pool), pool->bytes_in_use,
                              pool->capacity);
    }
    struct arena *ar = &pool->arenas[a];
    bool found = hb_first(arena_bits(pool, ar, k), UINT64_C(1) << (ar->max_order - k), &unit);
    assert(found); /* avail said this arena has a free block of order k */
    (void)found;
    unit <<= k;
    free_list_remove(pool, (uint32_t)a, k, unit);
    while (k > need) { /* keep the lower half, free the upper */
        k--;
        free_list_add(pool, (uint32_t)a, k, unit + (UINT64_C(1) << k));
    }
    ar->state[unit] = (uint8_t)(ST_HEAD | need);

    uint64_t size = pool->min_block << need;
    pool->bytes_in_use += size;
    pool->bytes_requested_in_use += nbytes;
    if (pool->bytes_in_use > pool->peak_bytes_in_use)
        pool->peak_bytes_in_use = pool->bytes_in_use;
    pool->n_allocs++;
    pool->n_allocs_total++;
    *out = (struct mmrt_pool_block){ar->handle, unit << pool->min_shift, size, nbytes};
    return MMRT_OK;
}

void mmrt_pool_free(struct mmrt_pool *pool, const struct mmrt_pool_block *block)
{
    if (!pool)
        return;
    uint32_t a;
    if (!block || !find_arena(pool, block->arena, &a)) {
        pool->n_bad_frees++;
        return;
    }
    struct arena *ar = &pool->arenas[a];
    if ((block->offset & (pool->min_block - 1)) != 0 || block->offset >= ar->nbytes) {
        pool->n_bad_frees++;
        return;
    }
    uint64_t unit = block->offset >> pool->min_shift;
    unsigned s = ar->state[unit], k = s & ST_ORDER;
    if ((s & (ST_HEAD | ST_FREE)) != ST_HEAD || block->nbytes != pool->min_block << k ||
        block->requested == 0 || block->requested > block->nbytes ||
        order_for(pool, block->requested) != k) {
        pool->n_bad_frees++;
        return;
    }
    pool->bytes_in_use -= block->nbytes;
    pool->bytes_requested_in_use -= block->requested;
    pool->n_allocs--;

    while (k < ar->max_order) {
        uint64_t buddy = unit ^ (UINT64_C(1) << k);
        if (ar->state[buddy] != (ST_HEAD | ST_FREE | k))
            break;
        free_list_remove(pool, a, k, buddy);
        ar->state[unit > buddy ? unit : buddy] = 0; /* the upper head disappears */
        unit = unit < buddy ? unit : buddy;
        k++;
    }
    free_list_add(pool, a, k, unit);
}

/* ---- stats / check ------------------------------------------------------------------- */

void mmrt_pool_stats(const struct mmrt_pool *pool, struct mmrt_pool_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!pool)
        return;
    out->capacity_bytes = pool->capacity;
    out->min_block_bytes = pool->min_block;
    out->n_arenas = pool->n_arenas;
    out->n_orders = pool->n_orders;
    out->bytes_in_use = pool->bytes_in_use;
    out->peak_bytes_in_use = pool->peak_bytes_in_use;
    out->bytes_requested_in_use = pool->bytes_requested_in_use;
    out->n_allocs = pool->n_allocs;
    out->n_allocs_total = pool->n_allocs_total;
    out->n_out_of_pool = pool->n_out_of_pool;
    out->n_bad_frees = pool->n_bad_frees;
    memcpy(out->free_blocks_per_order, pool->n_free, sizeof pool->n_free);
    out->total_free_bytes = pool->capacity - pool->bytes_in_use;
    out->largest_free_block = largest_free(pool);
    if (out->total_free_bytes > 0)
        out->fragmentation = 1.0 - (double)out->largest_free_block / (double)out->total_free_bytes;
}

void mmrt_pool_reset_peak(struct mmrt_pool *pool)
{
    if (pool)
        pool->peak_bytes_in_use = pool->bytes_in_use;
}

#define CHECK_FAIL(...) return mmrt_error_set(err, MMRT_ERR_INTERNAL, "pool check: " __VA_ARGS__)

mmrt_status mmrt_pool_check(const struct mmrt_pool *pool, struct mmrt_error *err)
{
    if (!pool)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pool: check: NULL pool");
    uint64_t in_use = 0, live = 0, n_free[MMRT_POOL_MAX_ORDERS] = {0};
    for (uint32_t a = 0; a < pool->n_arenas; a++) {
        const struct arena *ar = &pool->arenas[a];
        uint64_t n_units = UINT64_C(1) << ar->max_order, arena_free[MMRT_POOL_MAX_ORDERS] = {0};
        for (uint64_t u = 0; u < n_units;) {
            unsigned s = ar->state[u], k = s & ST_ORDER;
            uint64_t off = u << pool->min_shift, span = UINT64_C(1) << k;
            if (!(s & ST_HEAD))
                CHECK_FAIL("arena %" PRIu32 " offset %" PRIu64 ": no block starts here (gap in "
                           "the tiling)", a, off);
            if (k > ar->max_order || (u & (span - 1)) != 0)
                CHECK_FAIL("arena %" PRIu32 " offset %" PRIu64 " order %u: block misaligned or "
                           "larger than its arena (order %u)", a, off, k, ar->max_order);
            for (uint64_t v = u + 1; v < u + span; v++)
                if (ar->state[v] != 0)
                    CHECK_FAIL("arena %" PRIu32 " offset %" PRIu64 " order %u: offset %" PRIu64
                               " inside the block is marked 0x%02x (overlapping blocks)", a,
                               off, k, v << pool->min_shift, ar->state[v]);
            if (s & ST_FREE) {
                if (!hb_test(arena_bits(pool, ar, k), u >> k))
                    CHECK_FAIL("arena %" PRIu32 " offset %" PRIu64 " order %u: free block is not "
                               "on the free list of its order", a, off, k);
                if (k < ar->max_order && ar->state[u ^ span] == (ST_HEAD | ST_FREE | k))
                    CHECK_FAIL("arena %" PRIu32 " offset %" PRIu64 " order %u: free block and its "
                               "free buddy at offset %" PRIu64 " are not coalesced", a, off, k,
                               (u ^ span) << pool->min_shift);
                arena_free[k]++;
            } else {
                in_use += pool->min_block << k;
                live++;
            }
            u += span;
        }
        for (unsigned k = 0; k <= ar->max_order; k++) {
            int bad_level = 0;
            int64_t on_list = hb_verify(arena_bits(pool, ar, k),
                                        UINT64_C(1) << (ar->max_order - k), &bad_level);
            if (on_list < 0)
                CHECK_FAIL("arena %" PRIu32 " offset 0 order %u: free-list bitset level %d is "
                           "inconsistent", a, k, bad_level);
            if ((uint64_t)on_list != arena_free[k]) {
                /* Every free head is on the list (checked above), so the list holds an
                 * extra entry: name the first one that is not a free block of order k. */
                uint64_t i = 0, n = UINT64_C(1) << (ar->max_order - k);
                while (i < n && !(hb_test(arena_bits(pool, ar, k), i) &&
                                  ar->state[i << k] != (ST_HEAD | ST_FREE | k)))
                    i++;
                CHECK_FAIL("arena %" PRIu32 " offset %" PRIu64 " order %u: on the free list of "
                           "its order but not a free block of that order (state 0x%02x)", a,
                           (i << k) << pool->min_shift, k, i < n ? ar->state[i << k] : 0u);
            }
            if (hb_test(avail_bits(pool, k), a) != (on_list > 0))
                CHECK_FAIL("arena %" PRIu32 " offset 0 order %u: pool summary says the arena %s "
                           "free blocks of this order", a, k, on_list > 0 ? "has no" : "has");
            n_free[k] += arena_free[k];
        }
        for (unsigned k = ar->max_order + 1; k < pool->n_orders; k++)
            if (hb_test(avail_bits(pool, k), a))
                CHECK_FAIL("arena %" PRIu32 " offset 0 order %u: pool summary lists a free block "
                           "larger than the arena", a, k);
    }
    for (unsigned k = 0; k < pool->n_orders; k++) {
        int bad_level = 0;
        if (hb_verify(avail_bits(pool, k), pool->n_arenas, &bad_level) < 0)
            CHECK_FAIL("arena summary, order %u: bitset level %d is inconsistent", k, bad_level);
        if (n_free[k] != pool->n_free[k])
            CHECK_FAIL("order %u: %" PRIu64 " free blocks counted, %" PRIu64 " found", k,
                       pool->n_free[k], n_free[k]);
    }
    if (in_use != pool->bytes_in_use || live != pool->n_allocs)
        CHECK_FAIL("%" PRIu64 " bytes in %" PRIu64 " blocks counted in use, %" PRIu64 " bytes in %"
                   PRIu64 " blocks found", pool->bytes_in_use, pool->n_allocs, in_use, live);
    if (pool->bytes_requested_in_use > pool->bytes_in_use ||
        pool->bytes_requested_in_use < pool->n_allocs)
        CHECK_FAIL("%" PRIu64 " bytes requested in use do not fit %" PRIu64 " live blocks of %"
                   PRIu64 " bytes", pool->bytes_requested_in_use, pool->n_allocs,
                   pool->bytes_in_use);
    if (pool->peak_bytes_in_use < pool->bytes_in_use)
        CHECK_FAIL("peak %" PRIu64 " below bytes in use %" PRIu64, pool->peak_bytes_in_use,
                   pool->bytes_in_use);
    return MMRT_OK;
}
