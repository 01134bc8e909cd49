/*
 * core/pool.c — the two-level device pool (see pool.h).
 *
 * Level 2 is the binary buddy system (Knowlton 1965; Knuth, TAOCP vol. 1, §2.5, Algorithm R
 * and S), one independent buddy system per arena. Unlike SQLite's mem5.c, which keeps its
 * free-list links inside the managed memory, every piece of metadata here is in host
 * memory, since the managed memory is on a device and is addressed only by offset. Level 1
 * is a slab layer in the manner of Bonwick's slab allocator (USENIX 1994), with classes of
 * exact request sizes instead of fixed object types, and slabs that grow into their free
 * buddy and shrink back as their live slots need.
 *
 * Level 2, per arena of 2^m units (a unit is min_block bytes):
 *   state[u]  one byte per unit. The first unit of every block (its "head") holds
 *             HEAD | order, plus FREE when the block is free; every other unit is 0.
 *   bits      for each order k = 0 … m, a hierarchical bitset of 2^(m−k) bits: bit i set
 *             ⇔ the block of order k at unit i·2^k is free. Level 0 is the bitset itself,
 *             level j+1 has one bit per word of level j (set ⇔ that word is non-zero),
 *             up to a single top word. find-first-set then costs one ctz per level, which
 *             gives the lowest free offset of an order in O(log64 units) — these bitsets
 *             are the free lists. The bitsets of all orders sit in one array; the one of
 *             order k starts at word hb_off[m − k] (hb_off depends only on the bit count).
 * Level 2, per pool:
 *   avail     for each order, a hierarchical bitset over arenas: bit a set ⇔ arena a has
 *             a free block of that order. Best fit is then the first non-empty order
 *             >= the one needed, and in it the first arena, and in that the first block.
 *   n_free[k] free blocks of order k in all arenas, for stats.
 *   by_handle arenas sorted by handle, so mmrt_pool_free finds an arena by binary search.
 * Level 1 (struct l1, one host allocation made at create):
 *   cls[]     class records; a record with size 0 is unused. The unused ones are chained
 *             through first_slab. cls_ix is an open-addressing index size → record.
 *   slabs[]   slab records; an unused one has cls == NONE and is chained through next.
 *             A slab is an allocated level-2 block (arena, head unit, order) whose slots
 *             are [unit·min_block + i·size, +size) for i < n_slots; bit i of `used` says
 *             slot i is handed out. slab_ix is an index (arena, unit) → record, which is
 *             how mmrt_pool_free tells a slot from a level-2 block: it finds the level-2
 *             block holding the offset and asks whether that block is a slab.
 *   slack     the slabs holding memory no live slot needs — empty ones, and ones whose
 *             upper half no live slot reaches into — doubly linked through slack_prev/next.
 *             l1_flush, called before every level-2 allocation, returns empty slabs and
 *             shrinks the others to what their live slots need.
 *
 * Invariants (all verified by mmrt_pool_check):
 *   - the heads of each arena tile it: from unit 0, each head's block ends where the next
 *     head starts, the last ends at the arena's end, and a block of order k starts at a
 *     multiple of 2^k units;
 *   - a block is in the order-k bitset ⇔ its head is HEAD | FREE | k;
 *   - a free block's buddy is never a free block of the same order (coalescing is eager);
 *   - upper bitset levels summarise lower ones exactly; avail and n_free agree with bits;
 *   - every slab is an allocated level-2 block and is in slab_ix and in its class's list;
 *     popcount(used) = n_used; a slab is on slack ⇔ it holds memory no live slot needs,
 *     and slack_bytes is the sum of that memory;
 *   - l2_in_use = the sum over allocated heads; bytes_in_use = l2_in_use − l1_bytes +
 *     l1_used_bytes; n_allocs = allocated heads − slabs + used slots.
 * Split sets one new head (the upper half) and coalescing clears one, so no operation
 * touches more than O(orders) state bytes.
 */
#include "pool.h"

#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
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

#define NONE UINT32_MAX
#define L1_CLASS_IX (2 * MMRT_POOL_L1_MAX_CLASSES) /* index slots: at most half full */
#define L1_SLAB_IX (2 * MMRT_POOL_L1_MAX_SLABS)
#define L1_MAX_SPAN 6 /* a slab is at most 2^6 = 64 times the power of two of its size */

_Static_assert(MMRT_POOL_L1_MAX_SLOTS == 1 << L1_MAX_SPAN, "slot limit and slab span agree");
_Static_assert(MMRT_POOL_L1_MAX_SLOTS <= 64, "a slab's slot bitmap is one word");
_Static_assert((L1_CLASS_IX & (L1_CLASS_IX - 1)) == 0 && (L1_SLAB_IX & (L1_SLAB_IX - 1)) == 0,
               "index sizes are powers of two");

struct l1_class {
    uint64_t size;        /* slot bytes, a multiple of min_block; 0 = unused record */
    uint64_t last_use;    /* l1.tick of its last request: eviction takes the oldest */
    uint32_t n_seen;      /* requests seen, saturating at 2: slabs only from the second */
    uint32_t first_slab;  /* its slab list; for an unused record, the next unused one */
    uint32_t n_slabs, n_slots, n_live;
    unsigned block_order; /* order of the level-2 block one slot would get */
};

struct l1_slab {
    uint64_t unit;        /* head unit of its level-2 block */
    uint64_t used;        /* bit i set ⇔ slot i is handed out */
    uint32_t arena;
    uint32_t cls;         /* NONE for an unused record */
    uint32_t prev, next;  /* its class's slab list; an unused record chains through next */
    uint32_t slack_prev, slack_next;
    uint8_t order, n_slots, n_used;
    bool on_slack;        /* on the slack list (⇔ slab_slack() > 0) */
};

struct l1 {
    struct l1_class cls[MMRT_POOL_L1_MAX_CLASSES];
    struct l1_slab slabs[MMRT_POOL_L1_MAX_SLABS];
    uint32_t cls_ix[L1_CLASS_IX];   /* record index or NONE; linear probing */
    uint32_t slab_ix[L1_SLAB_IX];
    uint32_t free_cls, free_slab;   /* unused records */
    uint32_t slack_head, slack_tail;
    uint32_t n_classes, n_slabs, n_empty;
    unsigned max_slab_order;        /* largest slab: min_block << max_slab_order */
    uint64_t bytes, used_bytes;     /* of slabs; of the slots in use */
    uint64_t slack_bytes;           /* what l1_flush would give back to level 2 */
    uint64_t tick, hits, misses, flushes;
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
    struct l1 *l1;           /* NULL when level 1 is off */

    uint64_t l2_in_use;      /* bytes of allocated level-2 blocks, slabs included */
    uint64_t bytes_in_use, peak_bytes_in_use, bytes_requested_in_use, peak_held;
    uint64_t n_allocs, n_allocs_total, n_out_of_pool, n_bad_frees;
    struct mmrt_pool_trace trace; /* zero unless a tool asked (mmrt_pool_trace_new_pools) */
};

static struct mmrt_pool_trace g_trace;

void mmrt_pool_trace_new_pools(const struct mmrt_pool_trace *trace)
{
    g_trace = trace ? *trace : (struct mmrt_pool_trace){ 0 };
}

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

/* ---- level 2: blocks ----------------------------------------------------------------- */

/* Takes a block of order `need` (best fit, see pool.h); false when none is free. */
static bool l2_alloc(struct mmrt_pool *pool, unsigned need, uint32_t *arena, uint64_t *unit_out)
{
    unsigned k;
    uint64_t a = 0, unit = 0;
    for (k = need; k < pool->n_orders; k++)
        if (hb_first(avail_bits(pool, k), pool->n_arenas, &a))
            break;
    if (k == pool->n_orders)
        return false;
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
    pool->l2_in_use += pool->min_block << need;
    *arena = (uint32_t)a;
    *unit_out = unit;
    return true;
}

/* Frees the allocated block of order k at unit and coalesces it with its free buddies. */
static void l2_free(struct mmrt_pool *pool, uint32_t a, uint64_t unit, unsigned k)
{
    struct arena *ar = &pool->arenas[a];
    pool->l2_in_use -= pool->min_block << k;
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

/* The block (free or not) that holds unit: its head and order. Only a corrupted arena has
 * none. */
static bool block_around(const struct arena *ar, uint64_t unit, uint64_t *head, unsigned *order)
{
    for (unsigned k = 0; k <= ar->max_order; k++) {
        uint64_t h = unit & ~((UINT64_C(1) << k) - 1);
        unsigned s = ar->state[h];
        if ((s & ST_HEAD) && (s & ST_ORDER) == k) {
            *head = h;
            *order = k;
            return true;
        }
    }
    return false;
}

/* ---- level 1: indexes ---------------------------------------------------------------- */

static uint32_t ix_hash(uint64_t key, uint32_t n_slots)
{
    key ^= key >> 31;
    key *= UINT64_C(0x9e3779b97f4a7c15);
    return (uint32_t)(key >> 32) & (n_slots - 1);
}

static uint32_t cls_home(const struct mmrt_pool *pool, uint64_t size)
{
    return ix_hash(size >> pool->min_shift, L1_CLASS_IX);
}

static uint32_t slab_home(uint32_t arena, uint64_t unit)
{
    return ix_hash(unit ^ ((uint64_t)arena << 44) ^ ((uint64_t)arena >> 20), L1_SLAB_IX);
}

/* Position in cls_ix of the class of `size`, or NONE. */
static uint32_t cls_pos(const struct mmrt_pool *pool, uint64_t size)
{
    const struct l1 *l1 = pool->l1;
    for (uint32_t i = cls_home(pool, size), n = 0; n < L1_CLASS_IX; i = (i + 1) & (L1_CLASS_IX - 1), n++) {
        uint32_t r = l1->cls_ix[i];
        if (r == NONE)
            return NONE;
        if (r < MMRT_POOL_L1_MAX_CLASSES && l1->cls[r].size == size)
            return i;
    }
    return NONE;
}

/* Position in slab_ix of the slab at (arena, unit), or NONE. */
static uint32_t slab_pos(const struct mmrt_pool *pool, uint32_t arena, uint64_t unit)
{
    const struct l1 *l1 = pool->l1;
    for (uint32_t i = slab_home(arena, unit), n = 0; n < L1_SLAB_IX; i = (i + 1) & (L1_SLAB_IX - 1), n++) {
        uint32_t r = l1->slab_ix[i];
        if (r == NONE)
            return NONE;
        if (r < MMRT_POOL_L1_MAX_SLABS && l1->slabs[r].cls != NONE &&
            l1->slabs[r].arena == arena && l1->slabs[r].unit == unit)
            return i;
    }
    return NONE;
}

static uint32_t slab_find(const struct mmrt_pool *pool, uint32_t arena, uint64_t unit)
{
    uint32_t i = slab_pos(pool, arena, unit);
    return i == NONE ? NONE : pool->l1->slab_ix[i];
}

static void ix_insert(uint32_t *ix, uint32_t n_slots, uint32_t home, uint32_t r)
{
    uint32_t i = home;
    while (ix[i] != NONE)
        i = (i + 1) & (n_slots - 1);
    ix[i] = r;
}

/* Empties slot i of a linear-probing index, then moves later entries of the same probe run
 * back so that no lookup stops early (Knuth, TAOCP vol. 3, §6.4, Algorithm R). */
static void cls_ix_remove(struct mmrt_pool *pool, uint32_t i)
{
    uint32_t *ix = pool->l1->cls_ix, mask = L1_CLASS_IX - 1;
    ix[i] = NONE;
    for (uint32_t j = (i + 1) & mask; ix[j] != NONE; j = (j + 1) & mask) {
        uint32_t h = cls_home(pool, pool->l1->cls[ix[j]].size);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            ix[i] = ix[j];
            ix[j] = NONE;
            i = j;
        }
    }
}

static void slab_ix_remove(struct mmrt_pool *pool, uint32_t i)
{
    uint32_t *ix = pool->l1->slab_ix, mask = L1_SLAB_IX - 1;
    ix[i] = NONE;
    for (uint32_t j = (i + 1) & mask; ix[j] != NONE; j = (j + 1) & mask) {
        const struct l1_slab *sl = &pool->l1->slabs[ix[j]];
        uint32_t h = slab_home(sl->arena, sl->unit);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            ix[i] = ix[j];
            ix[j] = NONE;
            i = j;
        }
    }
}

/* ---- level 1: slabs ------------------------------------------------------------------ */

static uint64_t slots_for(const struct mmrt_pool *pool, uint64_t size, unsigned order)
{
    uint64_t n = (pool->min_block << order) / size;
    return n < MMRT_POOL_L1_MAX_SLOTS ? n : MMRT_POOL_L1_MAX_SLOTS;
}

static uint64_t slot_mask(unsigned n_slots)
{
    return n_slots == 64 ? ~UINT64_C(0) : (UINT64_C(1) << n_slots) - 1;
}

/* The order slab sl needs for its live slots: its class's block order, or more while a live
 * slot reaches into an upper half. */
static unsigned slab_need(const struct mmrt_pool *pool, const struct l1_slab *sl)
{
    const struct l1_class *c = &pool->l1->cls[sl->cls];
    unsigned m = sl->order;
    while (m > c->block_order && (sl->used >> slots_for(pool, c->size, m - 1)) == 0)
        m--;
    return m;
}

/* Bytes of slab sl that no live slot needs: all of an empty one, else the upper halves
 * above what slab_need() keeps. */
static uint64_t slab_slack(const struct mmrt_pool *pool, const struct l1_slab *sl)
{
    uint64_t bytes = pool->min_block << sl->order;
    return sl->n_used == 0 ? bytes : bytes - (pool->min_block << slab_need(pool, sl));
}

static void slack_link(struct l1 *l1, uint32_t r)
{
    struct l1_slab *sl = &l1->slabs[r];
    sl->on_slack = true;
    sl->slack_next = NONE;
    sl->slack_prev = l1->slack_tail;
    if (l1->slack_tail != NONE)
        l1->slabs[l1->slack_tail].slack_next = r;
    else
        l1->slack_head = r;
    l1->slack_tail = r;
}

static void slack_unlink(struct l1 *l1, uint32_t r)
{
    struct l1_slab *sl = &l1->slabs[r];
    if (sl->slack_prev != NONE)
        l1->slabs[sl->slack_prev].slack_next = sl->slack_next;
    else
        l1->slack_head = sl->slack_next;
    if (sl->slack_next != NONE)
        l1->slabs[sl->slack_next].slack_prev = sl->slack_prev;
    else
        l1->slack_tail = sl->slack_prev;
    sl->on_slack = false;
    sl->slack_prev = sl->slack_next = NONE;
}

/* What slab sl counts for in slack_bytes (the list holds exactly the slabs with slack). */
static uint64_t slack_counted(const struct mmrt_pool *pool, const struct l1_slab *sl)
{
    return sl->on_slack ? slab_slack(pool, sl) : 0;
}

/* After a change to slab r that counted for `before` in slack_bytes: counts it again and
 * puts it on, or takes it off, the slack list. */
static void slack_note(struct mmrt_pool *pool, uint32_t r, uint64_t before)
{
    struct l1 *l1 = pool->l1;
    struct l1_slab *sl = &l1->slabs[r];
    uint64_t now = slab_slack(pool, sl);
    l1->slack_bytes = l1->slack_bytes - before + now;
    if (now && !sl->on_slack)
        slack_link(l1, r);
    else if (!now && sl->on_slack)
        slack_unlink(l1, r);
}

/* Returns the empty slab r to level 2 and its record to the unused list. */
static void slab_release(struct mmrt_pool *pool, uint32_t r)
{
    struct l1 *l1 = pool->l1;
    struct l1_slab *sl = &l1->slabs[r];
    struct l1_class *c = &l1->cls[sl->cls];
    assert(sl->n_used == 0);
    if (sl->on_slack) {
        l1->slack_bytes -= slab_slack(pool, sl);
        slack_unlink(l1, r);
    }
    l1->n_empty--;
    if (sl->prev != NONE)
        l1->slabs[sl->prev].next = sl->next;
    else
        c->first_slab = sl->next;
    if (sl->next != NONE)
        l1->slabs[sl->next].prev = sl->prev;
    c->n_slabs--;
    c->n_slots -= sl->n_slots;
    uint32_t pos = slab_pos(pool, sl->arena, sl->unit);
    assert(pos != NONE);
    slab_ix_remove(pool, pos);
    l2_free(pool, sl->arena, sl->unit, sl->order);
    l1->bytes -= pool->min_block << sl->order;
    l1->n_slabs--;
    sl->cls = NONE;
    sl->next = l1->free_slab;
    l1->free_slab = r;
}

/* Gives the upper halves of slab r that no live slot reaches into back to level 2. */
static void slab_shrink(struct mmrt_pool *pool, uint32_t r)
{
    struct l1 *l1 = pool->l1;
    struct l1_slab *sl = &l1->slabs[r];
    struct l1_class *c = &l1->cls[sl->cls];
    struct arena *ar = &pool->arenas[sl->arena];
    for (unsigned need = slab_need(pool, sl); sl->order > need;) {
        unsigned m = sl->order - 1u;
        uint64_t upper = sl->unit + (UINT64_C(1) << m), n_low = slots_for(pool, c->size, m);
        ar->state[sl->unit] = (uint8_t)(ST_HEAD | m);
        ar->state[upper] = (uint8_t)(ST_HEAD | m);
        c->n_slots -= sl->n_slots - (uint32_t)n_low;
        sl->order = (uint8_t)m;
        sl->n_slots = (uint8_t)n_low;
        l1->bytes -= pool->min_block << m;
        l2_free(pool, sl->arena, upper, m);
    }
}

/* Gives level 2 back everything no live slot needs: empty slabs go, the others shrink.
 * Called before every level-2 allocation; false when there was nothing to give. */
static bool l1_flush(struct mmrt_pool *pool)
{
    struct l1 *l1 = pool->l1;
    if (!l1 || l1->slack_head == NONE)
        return false;
    while (l1->slack_head != NONE) {
        uint32_t r = l1->slack_head;
        struct l1_slab *sl = &l1->slabs[r];
        if (sl->n_used == 0) {
            slab_release(pool, r);
        } else {
            l1->slack_bytes -= slab_slack(pool, sl);
            slack_unlink(l1, r);
            slab_shrink(pool, r);
        }
    }
    l1->flushes++;
    return true;
}

/* The class of `size`, made when new (evicting the least recently asked-for class with no
 * live slot when the table is full); NULL when every class has live slots. */
static struct l1_class *class_get(struct mmrt_pool *pool, uint64_t size, unsigned block_order)
{
    struct l1 *l1 = pool->l1;
    uint32_t pos = cls_pos(pool, size);
    if (pos != NONE) {
        struct l1_class *c = &l1->cls[l1->cls_ix[pos]];
        c->last_use = l1->tick;
        if (c->n_seen < 2)
            c->n_seen++;
        return c;
    }
    if (l1->free_cls == NONE) {
        uint32_t victim = NONE;
        for (uint32_t i = 0; i < MMRT_POOL_L1_MAX_CLASSES; i++)
            if (l1->cls[i].n_live == 0 &&
                (victim == NONE || l1->cls[i].last_use < l1->cls[victim].last_use))
                victim = i;
        if (victim == NONE)
            return NULL;
        struct l1_class *v = &l1->cls[victim];
        while (v->first_slab != NONE)
            slab_release(pool, v->first_slab);
        cls_ix_remove(pool, cls_pos(pool, v->size));
        v->size = 0;
        v->first_slab = NONE;
        l1->free_cls = victim;
        l1->n_classes--;
    }
    uint32_t r = l1->free_cls;
    struct l1_class *c = &l1->cls[r];
    l1->free_cls = c->first_slab;
    *c = (struct l1_class){.size = size, .last_use = l1->tick, .n_seen = 1, .first_slab = NONE,
                           .block_order = block_order};
    ix_insert(l1->cls_ix, L1_CLASS_IX, cls_home(pool, size), r);
    l1->n_classes++;
    return c;
}

/* The slab of class c to take a slot from: the partly used one with the fewest free slots,
 * else an empty one; lowest (arena, offset) on ties. NONE when every slot is live. */
static uint32_t slab_pick(const struct mmrt_pool *pool, const struct l1_class *c)
{
    const struct l1 *l1 = pool->l1;
    uint32_t best = NONE;
    for (uint32_t r = c->first_slab; r != NONE; r = l1->slabs[r].next) {
        const struct l1_slab *sl = &l1->slabs[r];
        if (sl->n_used == sl->n_slots)
            continue;
        if (best == NONE) {
            best = r;
            continue;
        }
        const struct l1_slab *b = &l1->slabs[best];
        /* rank: partly used before empty, then fewer free slots first */
        unsigned rs = sl->n_used ? 1u + 64u - (sl->n_slots - sl->n_used) : 0u;
        unsigned rb = b->n_used ? 1u + 64u - (b->n_slots - b->n_used) : 0u;
        if (rs > rb || (rs == rb && (sl->arena < b->arena ||
                                     (sl->arena == b->arena && sl->unit < b->unit))))
            best = r;
    }
    return best;
}

static void slot_take(struct mmrt_pool *pool, uint32_t r, uint64_t nbytes,
                      struct mmrt_pool_block *out)
{
    struct l1 *l1 = pool->l1;
    struct l1_slab *sl = &l1->slabs[r];
    struct l1_class *c = &l1->cls[sl->cls];
    unsigned i = (unsigned)__builtin_ctzll(~sl->used & slot_mask(sl->n_slots));
    uint64_t before = slack_counted(pool, sl);
    if (sl->n_used == 0)
        l1->n_empty--;
    sl->used |= UINT64_C(1) << i;
    sl->n_used++;
    c->n_live++;
    l1->used_bytes += c->size;
    slack_note(pool, r, before);
    *out = (struct mmrt_pool_block){pool->arenas[sl->arena].handle,
                                    (sl->unit << pool->min_shift) + i * c->size, c->size, nbytes};
}

/* Grows full slab r of class c into its buddy when that buddy is a free level-2 block and
 * the doubled slab costs no more than level 2 would for its slots plus one more: a slab is
 * only ever as large as the demand it has met. Only a slab that is the lower half of its
 * parent can grow, so that its slots keep their offsets. */
static bool slab_can_grow(const struct mmrt_pool *pool, const struct l1_class *c, uint32_t r)
{
    const struct l1_slab *sl = &pool->l1->slabs[r];
    const struct arena *ar = &pool->arenas[sl->arena];
    unsigned m = sl->order;
    return c->size != pool->min_block << c->block_order && /* a power of two saves nothing */
           m + 1 <= pool->l1->max_slab_order && m + 1 <= ar->max_order &&
           (sl->unit & ((UINT64_C(1) << (m + 1)) - 1)) == 0 &&
           ar->state[sl->unit + (UINT64_C(1) << m)] == (ST_HEAD | ST_FREE | m) &&
           (UINT64_C(1) << (m + 1 - c->block_order)) <= (uint64_t)sl->n_slots + 1 &&
           slots_for(pool, c->size, m + 1) > sl->n_slots;
}

static void slab_grow(struct mmrt_pool *pool, const struct l1_class *c, uint32_t r)
{
    struct l1 *l1 = pool->l1;
    struct l1_slab *sl = &l1->slabs[r];
    struct arena *ar = &pool->arenas[sl->arena];
    unsigned m = sl->order;
    uint64_t buddy = sl->unit + (UINT64_C(1) << m), n = slots_for(pool, c->size, m + 1);
    free_list_remove(pool, sl->arena, m, buddy);
    ar->state[buddy] = 0;
    ar->state[sl->unit] = (uint8_t)(ST_HEAD | (m + 1));
    pool->l2_in_use += pool->min_block << m;
    l1->bytes += pool->min_block << m;
    l1->cls[sl->cls].n_slots += (uint32_t)n - sl->n_slots;
    sl->order = (uint8_t)(m + 1);
    sl->n_slots = (uint8_t)n;
}

/* Serves nbytes from class c: from a free slot (*hit), else by growing a full slab, else
 * from a new slab of one slot. Empty slabs go back to level 2 before level 2 is asked for
 * anything. Returns MMRT_ERR_OUT_OF_POOL when level 2 has no block for the new slab, and
 * MMRT_ERR_LIMIT when no slab record is free (the caller then goes to level 2). */
static mmrt_status l1_alloc(struct mmrt_pool *pool, struct l1_class *c, uint64_t nbytes,
                            struct mmrt_pool_block *out, bool *hit)
{
    struct l1 *l1 = pool->l1;
    uint32_t r = slab_pick(pool, c);
    *hit = r != NONE;
    if (r != NONE) {
        slot_take(pool, r, nbytes, out);
        return MMRT_OK;
    }
    l1_flush(pool);
    uint32_t grow = NONE; /* the lowest (arena, offset) slab that can grow */
    for (uint32_t q = c->first_slab; q != NONE; q = l1->slabs[q].next) {
        const struct l1_slab *sq = &l1->slabs[q];
        if ((grow == NONE || sq->arena < l1->slabs[grow].arena ||
             (sq->arena == l1->slabs[grow].arena && sq->unit < l1->slabs[grow].unit)) &&
            slab_can_grow(pool, c, q))
            grow = q;
    }
    if (grow != NONE) {
        slab_grow(pool, c, grow);
        slot_take(pool, grow, nbytes, out);
        return MMRT_OK;
    }
    if (l1->free_slab == NONE)
        return MMRT_ERR_LIMIT;
    uint32_t a;
    uint64_t unit;
    unsigned k = c->block_order;
    if (!l2_alloc(pool, k, &a, &unit))
        return MMRT_ERR_OUT_OF_POOL;
    r = l1->free_slab;
    struct l1_slab *sl = &l1->slabs[r];
    l1->free_slab = sl->next;
    *sl = (struct l1_slab){.unit = unit, .arena = a, .cls = (uint32_t)(c - l1->cls),
                           .prev = NONE, .next = c->first_slab, .slack_prev = NONE,
                           .slack_next = NONE, .order = (uint8_t)k,
                           .n_slots = (uint8_t)slots_for(pool, c->size, k)};
    if (c->first_slab != NONE)
        l1->slabs[c->first_slab].prev = r;
    c->first_slab = r;
    c->n_slabs++;
    c->n_slots += sl->n_slots;
    l1->n_slabs++;
    l1->n_empty++; /* until slot_take */
    l1->bytes += pool->min_block << k;
    ix_insert(l1->slab_ix, L1_SLAB_IX, slab_home(a, unit), r);
    slot_take(pool, r, nbytes, out);
    return MMRT_OK;
}

/* Gives slot i of slab r back. The slab keeps its size, so that its size coming back before
 * anything else needs level 2 finds it as it was; l1_flush shrinks it otherwise. */
static void slot_free(struct mmrt_pool *pool, uint32_t r, unsigned i)
{
    struct l1 *l1 = pool->l1;
    struct l1_slab *sl = &l1->slabs[r];
    struct l1_class *c = &l1->cls[sl->cls];
    uint64_t before = slack_counted(pool, sl);
    sl->used &= ~(UINT64_C(1) << i);
    sl->n_used--;
    c->n_live--;
    l1->used_bytes -= c->size;
    if (sl->n_used == 0)
        l1->n_empty++;
    slack_note(pool, r, before);
}

/* ---- free memory as a request of any size sees it ------------------------------------ */

/* Whether unit u, inside the allocated or free level-2 block at head, is free once level 1
 * has given back what no live slot needs. */
static bool free_after_flush(const struct mmrt_pool *pool, uint32_t a, uint64_t head, uint64_t u)
{
    if (pool->arenas[a].state[head] & ST_FREE)
        return true;
    uint32_t r = pool->l1 && pool->l1->slack_head != NONE ? slab_find(pool, a, head) : NONE;
    if (r == NONE)
        return false;
    const struct l1_slab *sl = &pool->l1->slabs[r];
    return sl->n_used == 0 || u >= head + (UINT64_C(1) << slab_need(pool, sl));
}

/* Whether units [u, u + 2^j) of arena a (u a multiple of 2^j) are all free once level 1
 * has given back what no live slot needs. */
static bool region_free(const struct mmrt_pool *pool, uint32_t a, uint64_t u, unsigned j)
{
    uint64_t head;
    unsigned k;
    if (!block_around(&pool->arenas[a], u, &head, &k))
        return false;
    if (k >= j)
        return free_after_flush(pool, a, head, u);
    /* Smaller blocks: the region starts with one (head == u) and is split in halves. */
    return region_free(pool, a, u, j - 1) &&
           region_free(pool, a, u + (UINT64_C(1) << (j - 1)), j - 1);
}

/* The block that region (u, j), free after a flush, coalesces into. */
static uint64_t climb(const struct mmrt_pool *pool, uint32_t a, uint64_t u, unsigned j)
{
    const struct arena *ar = &pool->arenas[a];
    while (j < ar->max_order && region_free(pool, a, u ^ (UINT64_C(1) << j), j)) {
        u &= ~(UINT64_C(1) << j);
        j++;
    }
    return pool->min_block << j;
}

/* The largest block a request of any size can get: level 2's largest free block after the
 * flush that precedes every level-2 allocation. Only a block holding memory the flush
 * returns can be larger than today's largest, and climbing from that memory through
 * buddies that are wholly free reaches it. */
static uint64_t largest_free_any(const struct mmrt_pool *pool)
{
    uint64_t best = largest_free(pool);
    if (!pool->l1)
        return best;
    const struct l1 *l1 = pool->l1;
    for (uint32_t r = l1->slack_head; r != NONE; r = l1->slabs[r].slack_next) {
        const struct l1_slab *sl = &l1->slabs[r];
        if ((pool->min_block << pool->arenas[sl->arena].max_order) <= best)
            continue;
        if (sl->n_used == 0) {
            uint64_t b = climb(pool, sl->arena, sl->unit, sl->order);
            best = b > best ? b : best;
            continue;
        }
        for (unsigned m = slab_need(pool, sl); m < sl->order; m++) {
            uint64_t b = climb(pool, sl->arena, sl->unit + (UINT64_C(1) << m), m);
            best = b > best ? b : best;
        }
    }
    return best;
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
    if (cfg->level1 != MMRT_POOL_LEVEL1_DEFAULT && cfg->level1 != MMRT_POOL_LEVEL1_ON &&
        cfg->level1 != MMRT_POOL_LEVEL1_OFF)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "pool: level1 %d is not one of "
                              "MMRT_POOL_LEVEL1_DEFAULT (0), _ON (1) or _OFF (2)",
                              (int)cfg->level1);

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
    pool->trace = g_trace;
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

    if (cfg->level1 != MMRT_POOL_LEVEL1_OFF) {
        struct l1 *l1 = pool->l1 = malloc(sizeof *pool->l1);
        if (!l1) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "pool: out of host memory for the "
                                "level-1 records (%zu bytes)", sizeof *pool->l1);
            goto fail;
        }
        memset(l1, 0, sizeof *l1);
        memset(l1->cls_ix, 0xff, sizeof l1->cls_ix);
        memset(l1->slab_ix, 0xff, sizeof l1->slab_ix);
        for (uint32_t i = 0; i < MMRT_POOL_L1_MAX_CLASSES; i++)
            l1->cls[i].first_slab = i + 1 < MMRT_POOL_L1_MAX_CLASSES ? i + 1 : NONE;
        for (uint32_t i = 0; i < MMRT_POOL_L1_MAX_SLABS; i++) {
            l1->slabs[i].cls = NONE;
            l1->slabs[i].next = i + 1 < MMRT_POOL_L1_MAX_SLABS ? i + 1 : NONE;
            l1->slabs[i].prev = l1->slabs[i].slack_prev = l1->slabs[i].slack_next = NONE;
        }
        l1->free_cls = l1->free_slab = 0;
        l1->slack_head = l1->slack_tail = NONE;
        /* A slab is at most 1/8 of the pool, so one class can never take most of it. */
        uint64_t eighth = floor_pow2(pool->capacity / 8);
        l1->max_slab_order = eighth <= min_block ? 0 : (unsigned)__builtin_ctzll(eighth) - pool->min_shift;
        if (l1->max_slab_order > pool->n_orders - 1)
            l1->max_slab_order = pool->n_orders - 1;
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
    free(pool->l1);
    free(pool);
}

/* ---- alloc / free -------------------------------------------------------------------- */

/* `why` and `block` say what was needed, e.g. "block of " 4096 "". */
static mmrt_status out_of_pool(struct mmrt_pool *pool, uint64_t nbytes, const char *why,
                               uint64_t block, const char *unit, struct mmrt_error *err)
{
    pool->n_out_of_pool++;
    char l1_note[160] = "";
    if (pool->l1 && pool->l1->bytes)
        snprintf(l1_note, sizeof l1_note, "; level 1 holds %" PRIu64 " bytes in slabs, %" PRIu64
                 " of them not in live slots", pool->l1->bytes,
                 pool->l1->bytes - pool->l1->used_bytes);
    return mmrt_error_set(err, MMRT_ERR_OUT_OF_POOL, "pool: cannot allocate %" PRIu64 " bytes (%s%"
                          PRIu64 "%s): largest free block is %" PRIu64 " bytes, %" PRIu64 " in use "
                          "of %" PRIu64 "%s", nbytes, why, block, unit, largest_free_any(pool),
                          pool->bytes_in_use, pool->capacity, l1_note);
}

mmrt_status mmrt_pool_alloc(struct mmrt_pool *pool, uint64_t nbytes, struct mmrt_pool_block *out,
                            struct mmrt_error *err)
{
    if (!pool || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pool: alloc: NULL %s",
                              !pool ? "pool" : "out");
    if (nbytes == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pool: cannot allocate 0 bytes");
    uint64_t largest_arena = pool->min_block << (pool->n_orders - 1);
    if (nbytes > largest_arena)
        return out_of_pool(pool, nbytes, "larger than the largest arena, ", largest_arena,
                           " bytes", err);
    unsigned need = order_for(pool, nbytes);
    struct l1 *l1 = pool->l1;
    mmrt_status st = MMRT_ERR_LIMIT; /* "level 1 does not serve it" */
    bool hit = false;
    if (l1) {
        l1->tick++;
        if (need <= l1->max_slab_order) {
            uint64_t size = (nbytes + pool->min_block - 1) & ~(pool->min_block - 1);
            struct l1_class *c = class_get(pool, size, need);
            if (c && c->n_seen >= 2)
                st = l1_alloc(pool, c, nbytes, out, &hit);
        }
    }
    if (st == MMRT_ERR_LIMIT) {
        uint32_t a;
        uint64_t unit;
        l1_flush(pool);
        if (l2_alloc(pool, need, &a, &unit)) {
            *out = (struct mmrt_pool_block){pool->arenas[a].handle, unit << pool->min_shift,
                                            pool->min_block << need, nbytes};
            st = MMRT_OK;
        } else {
            st = MMRT_ERR_OUT_OF_POOL;
        }
    }
    if (st != MMRT_OK)
        return out_of_pool(pool, nbytes, "block of ", pool->min_block << need, "", err);

    pool->bytes_in_use += out->nbytes;
    pool->bytes_requested_in_use += nbytes;
    if (pool->bytes_in_use > pool->peak_bytes_in_use)
        pool->peak_bytes_in_use = pool->bytes_in_use;
    uint64_t held = pool->l2_in_use - (l1 ? l1->slack_bytes : 0);
    if (held > pool->peak_held)
        pool->peak_held = held;
    pool->n_allocs++;
    pool->n_allocs_total++;
    if (l1) {
        if (hit)
            l1->hits++;
        else
            l1->misses++;
    }
    if (pool->trace.alloc)
        pool->trace.alloc(pool->trace.user, out);
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
    uint64_t unit = block->offset >> pool->min_shift, head;
    unsigned k;
    if ((block->offset & (pool->min_block - 1)) != 0 || block->offset >= ar->nbytes ||
        !block_around(ar, unit, &head, &k) || (ar->state[head] & ST_FREE)) {
        pool->n_bad_frees++;
        return;
    }
    uint32_t r = pool->l1 && pool->l1->n_slabs ? slab_find(pool, a, head) : NONE;
    if (r != NONE) {
        const struct l1_slab *sl = &pool->l1->slabs[r];
        uint64_t size = pool->l1->cls[sl->cls].size, rel = block->offset - (head << pool->min_shift);
        uint64_t i = rel / size;
        if (block->nbytes != size || block->requested == 0 || block->requested > size ||
            block->requested <= size - pool->min_block || rel % size != 0 || i >= sl->n_slots ||
            !((sl->used >> i) & 1)) {
            pool->n_bad_frees++;
            return;
        }
        if (pool->trace.free)
            pool->trace.free(pool->trace.user, block);
        pool->bytes_in_use -= size;
        pool->bytes_requested_in_use -= block->requested;
        pool->n_allocs--;
        slot_free(pool, r, (unsigned)i);
        return;
    }
    if (head != unit || block->nbytes != pool->min_block << k || block->requested == 0 ||
        block->requested > block->nbytes || order_for(pool, block->requested) != k) {
        pool->n_bad_frees++;
        return;
    }
    if (pool->trace.free)
        pool->trace.free(pool->trace.user, block);
    pool->bytes_in_use -= block->nbytes;
    pool->bytes_requested_in_use -= block->requested;
    pool->n_allocs--;
    l2_free(pool, a, unit, k);
}

/* ---- stats / check ------------------------------------------------------------------- */

void mmrt_pool_stats(const struct mmrt_pool *pool, struct mmrt_pool_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!pool)
        return;
    const struct l1 *l1 = pool->l1;
    uint64_t empty = l1 ? l1->slack_bytes : 0;
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
    out->total_free_bytes = pool->capacity - pool->l2_in_use + empty;
    out->largest_free_block = largest_free_any(pool);
    if (out->total_free_bytes > 0)
        out->fragmentation = 1.0 - (double)out->largest_free_block / (double)out->total_free_bytes;
    out->bytes_held = pool->l2_in_use - empty;
    out->peak_bytes_held = pool->peak_held;
    if (l1) {
        out->level1_enabled = 1;
        out->level1_n_classes = l1->n_classes;
        out->level1_n_slabs = l1->n_slabs;
        out->level1_n_empty_slabs = l1->n_empty;
        out->level1_hits = l1->hits;
        out->level1_misses = l1->misses;
        out->level1_bytes = l1->bytes;
        out->level1_free_bytes = l1->bytes - l1->used_bytes;
        out->level1_returnable_bytes = l1->slack_bytes;
        out->level1_n_flushes = l1->flushes;
    }
}

void mmrt_pool_reset_peak(struct mmrt_pool *pool)
{
    if (!pool)
        return;
    pool->peak_bytes_in_use = pool->bytes_in_use;
    pool->peak_held = pool->l2_in_use - (pool->l1 ? pool->l1->slack_bytes : 0);
}

#define CHECK_FAIL(...) return mmrt_error_set(err, MMRT_ERR_INTERNAL, "pool check: " __VA_ARGS__)

/* Level 1's records, lists and indexes against each other and against level 2. Adds what
 * the slabs hold to the totals mmrt_pool_check compares. */
static mmrt_status check_l1(const struct mmrt_pool *pool, uint64_t *slab_bytes,
                            uint64_t *slot_bytes, uint64_t *slots, uint64_t *n_slabs,
                            struct mmrt_error *err)
{
    const struct l1 *l1 = pool->l1;
    uint64_t slack_bytes = 0;
    uint32_t n_empty = 0, n_slack = 0, n_live_slabs = 0, n_classes = 0, listed = 0;
    for (uint32_t r = 0; r < MMRT_POOL_L1_MAX_SLABS; r++) {
        const struct l1_slab *sl = &l1->slabs[r];
        if (sl->cls == NONE)
            continue;
        n_live_slabs++;
        if (sl->arena >= pool->n_arenas)
            CHECK_FAIL("slab record %" PRIu32 ": arena index %" PRIu32 " out of range", r,
                       sl->arena);
        const struct arena *ar = &pool->arenas[sl->arena];
        uint64_t off = sl->unit << pool->min_shift;
        unsigned k = sl->order;
        if (k > ar->max_order || (sl->unit & ((UINT64_C(1) << k) - 1)) != 0 ||
            sl->unit >= UINT64_C(1) << ar->max_order)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: misaligned or "
                       "beyond its arena (order %u)", sl->arena, off, k, ar->max_order);
        if (ar->state[sl->unit] != (ST_HEAD | k))
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: not a live "
                       "level-2 block of that order (state 0x%02x)", sl->arena, off, k,
                       ar->state[sl->unit]);
        if (sl->cls >= MMRT_POOL_L1_MAX_CLASSES || l1->cls[sl->cls].size == 0)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: class record %"
                       PRIu32 " is not in use", sl->arena, off, k, sl->cls);
        uint64_t size = l1->cls[sl->cls].size, want = slots_for(pool, size, k);
        if (sl->n_slots != want || want == 0)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: %u slots, but "
                       "%" PRIu64 "-byte slots in it make %" PRIu64, sl->arena, off, k,
                       sl->n_slots, size, want);
        if ((sl->used & ~slot_mask(sl->n_slots)) != 0)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: slot bitmap "
                       "0x%016" PRIx64 " marks slots beyond its %u", sl->arena, off, k,
                       sl->used, sl->n_slots);
        if (__builtin_popcountll(sl->used) != sl->n_used)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: %u slots counted "
                       "used, the bitmap marks %d (a slot both free and used)", sl->arena, off,
                       k, sl->n_used, __builtin_popcountll(sl->used));
        if (slab_find(pool, sl->arena, sl->unit) != r)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: not found at its "
                       "place in the slab index", sl->arena, off, k);
        if (k < l1->cls[sl->cls].block_order)
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: smaller than one "
                       "%" PRIu64 "-byte slot needs (order %u)", sl->arena, off, k, size,
                       l1->cls[sl->cls].block_order);
        uint64_t slack = slab_slack(pool, sl);
        if (sl->on_slack != (slack > 0))
            CHECK_FAIL("slab at arena %" PRIu32 " offset %" PRIu64 " order %u: %s the slack list "
                       "with %" PRIu64 " bytes no live slot needs (%u slots used)", sl->arena,
                       off, k, sl->on_slack ? "on" : "not on", slack, sl->n_used);
        *slab_bytes += pool->min_block << k;
        *slot_bytes += sl->n_used * size;
        *slots += sl->n_used;
        slack_bytes += slack;
        n_empty += sl->n_used == 0;
    }
    uint32_t n_unused = 0;
    for (uint32_t r = l1->free_slab; r != NONE; r = l1->slabs[r].next) {
        if (r >= MMRT_POOL_L1_MAX_SLABS || l1->slabs[r].cls != NONE ||
            ++n_unused > MMRT_POOL_L1_MAX_SLABS)
            CHECK_FAIL("unused slab list: record %" PRIu32 " is in use, out of range or in a "
                       "cycle", r);
    }
    if (n_unused + n_live_slabs != MMRT_POOL_L1_MAX_SLABS)
        CHECK_FAIL("%" PRIu32 " unused and %" PRIu32 " live slab records, not %d", n_unused,
                   n_live_slabs, MMRT_POOL_L1_MAX_SLABS);
    uint32_t prev = NONE;
    for (uint32_t r = l1->slack_head; r != NONE; prev = r, r = l1->slabs[r].slack_next) {
        const struct l1_slab *sl = r < MMRT_POOL_L1_MAX_SLABS ? &l1->slabs[r] : NULL;
        if (!sl || sl->cls == NONE || !sl->on_slack || sl->slack_prev != prev ||
            ++n_slack > n_live_slabs)
            CHECK_FAIL("slack list: record %" PRIu32 " is not a live slab on it linked back to %"
                       PRIu32, r, prev);
    }
    if (prev != l1->slack_tail)
        CHECK_FAIL("slack list ends at record %" PRIu32 ", its tail is %" PRIu32, prev,
                   l1->slack_tail);
    if (n_empty != l1->n_empty || slack_bytes != l1->slack_bytes)
        CHECK_FAIL("%" PRIu32 " empty slabs and %" PRIu64 " bytes of slack counted, %" PRIu32
                   " and %" PRIu64 " found", l1->n_empty, l1->slack_bytes, n_empty, slack_bytes);

    for (uint32_t i = 0; i < MMRT_POOL_L1_MAX_CLASSES; i++) {
        const struct l1_class *c = &l1->cls[i];
        if (c->size == 0)
            continue;
        n_classes++;
        if ((c->size & (pool->min_block - 1)) != 0 || c->block_order != order_for(pool, c->size) ||
            c->block_order > l1->max_slab_order)
            CHECK_FAIL("class of %" PRIu64 " bytes: not a multiple of %" PRIu64 " bytes, or its "
                       "block order %u is wrong or beyond the largest slab", c->size,
                       pool->min_block, c->block_order);
        uint32_t pos = cls_pos(pool, c->size);
        if (pos == NONE || l1->cls_ix[pos] != i)
            CHECK_FAIL("class of %" PRIu64 " bytes: not found at its place in the class index",
                       c->size);
        uint32_t n_slabs_c = 0, n_slots = 0, n_live = 0;
        prev = NONE;
        for (uint32_t r = c->first_slab; r != NONE; prev = r, r = l1->slabs[r].next) {
            const struct l1_slab *sl = r < MMRT_POOL_L1_MAX_SLABS ? &l1->slabs[r] : NULL;
            if (!sl || sl->cls != i || sl->prev != prev || ++n_slabs_c > n_live_slabs)
                CHECK_FAIL("class of %" PRIu64 " bytes: slab record %" PRIu32 " in its list is "
                           "not its slab linked back to %" PRIu32, c->size, r, prev);
            n_slots += sl->n_slots;
            n_live += sl->n_used;
        }
        if (n_slabs_c != c->n_slabs || n_slots != c->n_slots || n_live != c->n_live)
            CHECK_FAIL("class of %" PRIu64 " bytes: %" PRIu32 " slabs, %" PRIu32 " slots, %" PRIu32
                       " live counted; its list has %" PRIu32 ", %" PRIu32 ", %" PRIu32, c->size,
                       c->n_slabs, c->n_slots, c->n_live, n_slabs_c, n_slots, n_live);
        if (c->n_seen < 1 || c->n_seen > 2 || (c->n_seen < 2 && c->n_slabs > 0))
            CHECK_FAIL("class of %" PRIu64 " bytes: seen %" PRIu32 " times with %" PRIu32
                       " slabs", c->size, c->n_seen, c->n_slabs);
        listed += n_slabs_c;
    }
    uint32_t n_unused_cls = 0;
    for (uint32_t i = l1->free_cls; i != NONE; i = l1->cls[i].first_slab)
        if (i >= MMRT_POOL_L1_MAX_CLASSES || l1->cls[i].size != 0 ||
            ++n_unused_cls > MMRT_POOL_L1_MAX_CLASSES)
            CHECK_FAIL("unused class list: record %" PRIu32 " is in use, out of range or in a "
                       "cycle", i);
    if (n_classes != l1->n_classes || n_unused_cls + n_classes != MMRT_POOL_L1_MAX_CLASSES)
        CHECK_FAIL("%" PRIu32 " classes counted, %" PRIu32 " found and %" PRIu32 " unused records",
                   l1->n_classes, n_classes, n_unused_cls);
    if (listed != n_live_slabs || n_live_slabs != l1->n_slabs)
        CHECK_FAIL("%" PRIu32 " slabs counted, %" PRIu32 " live records, %" PRIu32 " in class "
                   "lists", l1->n_slabs, n_live_slabs, listed);
    uint32_t in_cls_ix = 0, in_slab_ix = 0;
    for (uint32_t i = 0; i < L1_CLASS_IX; i++)
        if (l1->cls_ix[i] != NONE && (l1->cls_ix[i] >= MMRT_POOL_L1_MAX_CLASSES ||
                                      l1->cls[l1->cls_ix[i]].size == 0 || ++in_cls_ix == 0))
            CHECK_FAIL("class index entry %" PRIu32 " names unused record %" PRIu32, i,
                       l1->cls_ix[i]);
    for (uint32_t i = 0; i < L1_SLAB_IX; i++)
        if (l1->slab_ix[i] != NONE && (l1->slab_ix[i] >= MMRT_POOL_L1_MAX_SLABS ||
                                       l1->slabs[l1->slab_ix[i]].cls == NONE || ++in_slab_ix == 0))
            CHECK_FAIL("slab index entry %" PRIu32 " names unused record %" PRIu32, i,
                       l1->slab_ix[i]);
    if (in_cls_ix != n_classes || in_slab_ix != n_live_slabs)
        CHECK_FAIL("the indexes hold %" PRIu32 " classes and %" PRIu32 " slabs, not %" PRIu32
                   " and %" PRIu32, in_cls_ix, in_slab_ix, n_classes, n_live_slabs);
    if (*slab_bytes != l1->bytes || *slot_bytes != l1->used_bytes)
        CHECK_FAIL("level 1: %" PRIu64 " bytes of slabs, %" PRIu64 " in live slots counted; %"
                   PRIu64 " and %" PRIu64 " found", l1->bytes, l1->used_bytes, *slab_bytes,
                   *slot_bytes);
    if (l1->hits + l1->misses != pool->n_allocs_total)
        CHECK_FAIL("level 1: %" PRIu64 " hits and %" PRIu64 " misses for %" PRIu64 " allocations",
                   l1->hits, l1->misses, pool->n_allocs_total);
    *n_slabs = n_live_slabs;
    return MMRT_OK;
}

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
    if (in_use != pool->l2_in_use)
        CHECK_FAIL("%" PRIu64 " bytes of level-2 blocks counted allocated, %" PRIu64 " found",
                   pool->l2_in_use, in_use);
    uint64_t slab_bytes = 0, slot_bytes = 0, slots = 0, n_slabs = 0;
    if (pool->l1) {
        mmrt_status st = check_l1(pool, &slab_bytes, &slot_bytes, &slots, &n_slabs, err);
        if (st != MMRT_OK)
            return st;
    }
    /* Live blocks: the level-2 blocks that are not slabs, and the slots in use. */
    uint64_t blocks = live - n_slabs + slots, bytes = in_use - slab_bytes + slot_bytes;
    if (bytes != pool->bytes_in_use || blocks != pool->n_allocs)
        CHECK_FAIL("%" PRIu64 " bytes in %" PRIu64 " blocks counted in use, %" PRIu64 " bytes in %"
                   PRIu64 " blocks found", pool->bytes_in_use, pool->n_allocs, bytes, blocks);
    if (pool->bytes_requested_in_use > pool->bytes_in_use ||
        pool->bytes_requested_in_use < pool->n_allocs)
        CHECK_FAIL("%" PRIu64 " bytes requested in use do not fit %" PRIu64 " live blocks of %"
                   PRIu64 " bytes", pool->bytes_requested_in_use, pool->n_allocs,
                   pool->bytes_in_use);
    uint64_t held = in_use - (pool->l1 ? pool->l1->slack_bytes : 0);
    if (pool->peak_bytes_in_use < pool->bytes_in_use || pool->peak_held < held)
        CHECK_FAIL("peak %" PRIu64 " below bytes in use %" PRIu64 ", or peak held %" PRIu64
                   " below %" PRIu64 " held", pool->peak_bytes_in_use, pool->bytes_in_use,
                   pool->peak_held, held);
    return MMRT_OK;
}
