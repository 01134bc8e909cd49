/*
 * tests/test_pool.c — the two-level pool (core/pool.c).
 *
 * Arenas come from a fake arena_ops whose handles are unmapped addresses, so any
 * dereference by the pool would crash the test. The level-2 tests run with level 1 off, so
 * that they can assert the buddy's exact placements; the level-1 tests then cover what
 * level 1 adds on top. The random tests replay long alloc/free sequences against a shadow
 * model (per-unit occupancy of every arena) and compare the statistics after every step.
 * The allocation-failure sweeps fail the n-th host allocation (malloc/calloc/realloc are
 * --wrap'ed, see tests/CMakeLists.txt) for n = 1, 2, … until a run completes without an
 * injected failure. The mixed workload prints what level 1 saves on a synthetic request
 * stream.
 *
 * White box: pool.c is compiled into this test (instead of being taken from the static
 * library; the archive member is then never pulled in, since every symbol is defined here)
 * so that test_check_detects_corruption can break the private metadata on purpose and prove
 * that mmrt_pool_check notices, and so that the random test can flush level 1 to confirm
 * the largest free block it reported. Everything else uses only the public API of pool.h.
 */
#include "pool.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define KB (UINT64_C(1) << 10)
#define MB (UINT64_C(1) << 20)

#define assert_contains(hay, needle)                                                      \
    do {                                                                                  \
        if (!strstr((hay), (needle)))                                                     \
            fail_msg("\"%s\" does not contain \"%s\"", (hay), (needle));                  \
    } while (0)

/* ---- host allocation wrappers (linked with -Wl,--wrap=…) ----------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);

/* While armed: counts allocation calls, fails the fail_at-th (1-based; 0 = never), and
 * counts live allocations made while armed. */
static struct {
    bool armed;
    uint64_t calls, fail_at, injected;
    int64_t live;
} g_heap;

static bool heap_inject(void)
{
    if (!g_heap.armed)
        return false;
    if (++g_heap.calls == g_heap.fail_at) {
        g_heap.injected++;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n)
{
    if (heap_inject())
        return NULL;
    void *p = __real_malloc(n);
    if (p && g_heap.armed)
        g_heap.live++;
    return p;
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (heap_inject())
        return NULL;
    void *p = __real_calloc(n, size);
    if (p && g_heap.armed)
        g_heap.live++;
    return p;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (heap_inject())
        return NULL;
    void *q = __real_realloc(p, n);
    if (q && !p && g_heap.armed)
        g_heap.live++;
    return q;
}

void __wrap_free(void *p)
{
    if (p && g_heap.armed)
        g_heap.live--;
    __real_free(p);
}

static void heap_arm(uint64_t fail_at)
{
    g_heap.calls = 0;
    g_heap.fail_at = fail_at;
    g_heap.injected = 0;
    g_heap.live = 0;
    g_heap.armed = true;
}

static void heap_disarm(void)
{
    g_heap.armed = false;
}

/* ---- fake device --------------------------------------------------------------------- */

#define FAKE_MAX 64

struct fake_dev {
    int n_calls;   /* alloc calls so far */
    int fail_at;   /* 1-based alloc call that fails (0 = never) */
    bool fail_silent; /* fail without writing a message */
    int null_at;   /* alloc call that returns OK with a NULL handle */
    int dup_at;    /* alloc call that returns the previous handle again */
    int salt;      /* permutes the handle values (so their order differs between devices) */
    int n_arenas;  /* records below */
    void *handle[FAKE_MAX];
    uint64_t size[FAKE_MAX];
    bool live[FAKE_MAX];
    int n_live;
    int n_bad_free;
};

/* Distinct, unmapped, in no particular order (so sorting by handle is exercised). */
static void *fake_handle_salted(int i, int salt)
{
    return (void *)(uintptr_t)(UINT64_C(0x7ead00000000) +
                               (uint64_t)((i * 37 + salt * 11) % FAKE_MAX) * 0x10000);
}

static void *fake_handle(int i)
{
    return fake_handle_salted(i, 0);
}

static mmrt_status fake_alloc(void *user, uint64_t nbytes, void **arena, struct mmrt_error *err)
{
    struct fake_dev *d = user;
    d->n_calls++;
    if (d->n_calls == d->fail_at) {
        if (d->fail_silent)
            return MMRT_ERR_OUT_OF_POOL;
        return mmrt_error_set(err, MMRT_ERR_OUT_OF_POOL, "fake device: no room for %" PRIu64
                              " bytes", nbytes);
    }
    if (d->n_calls == d->null_at) {
        *arena = NULL;
        return MMRT_OK;
    }
    if (d->n_arenas == FAKE_MAX)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "fake device: too many arenas");
    int i = d->n_arenas++;
    d->handle[i] = (d->n_calls == d->dup_at && i > 0) ? d->handle[i - 1]
                                                      : fake_handle_salted(i, d->salt);
    d->size[i] = nbytes;
    d->live[i] = true;
    d->n_live++;
    *arena = d->handle[i];
    return MMRT_OK;
}

static void fake_free(void *user, void *arena)
{
    struct fake_dev *d = user;
    for (int i = 0; i < d->n_arenas; i++) {
        if (d->live[i] && d->handle[i] == arena) {
            d->live[i] = false;
            d->n_live--;
            return;
        }
    }
    d->n_bad_free++;
}

static struct mmrt_pool_arena_ops fake_ops(struct fake_dev *d)
{
    return (struct mmrt_pool_arena_ops){d, fake_alloc, fake_free};
}

static int fake_index(const struct fake_dev *d, const void *handle)
{
    for (int i = 0; i < d->n_arenas; i++)
        if (d->handle[i] == handle)
            return i;
    return -1;
}

static struct mmrt_pool *pool_make(struct fake_dev *d, uint64_t capacity, uint64_t max_arena,
                                   uint64_t min_block, enum mmrt_pool_level1 level1)
{
    struct mmrt_pool_config cfg = {capacity, max_arena, min_block, level1};
    struct mmrt_pool_arena_ops ops = fake_ops(d);
    struct mmrt_pool *pool = NULL;
    struct mmrt_error err = {MMRT_OK, ""};
    mmrt_status st = mmrt_pool_create(&cfg, &ops, &pool, &err);
    if (st != MMRT_OK)
        fail_msg("create: %s: %s", mmrt_status_name(st), err.msg);
    assert_non_null(pool);
    return pool;
}

/* Level 2 alone: the buddy's placements can be asserted exactly. */
static struct mmrt_pool *pool_new(struct fake_dev *d, uint64_t capacity, uint64_t max_arena,
                                  uint64_t min_block)
{
    return pool_make(d, capacity, max_arena, min_block, MMRT_POOL_LEVEL1_OFF);
}

/* Both levels, as a zero-initialised config gives them. */
static struct mmrt_pool *pool_new_l1(struct fake_dev *d, uint64_t capacity, uint64_t max_arena,
                                     uint64_t min_block)
{
    return pool_make(d, capacity, max_arena, min_block, MMRT_POOL_LEVEL1_DEFAULT);
}

static struct mmrt_pool_block must_alloc(struct mmrt_pool *pool, uint64_t nbytes)
{
    struct mmrt_pool_block b = {0}; /* fail_msg does not return; -O3 cannot tell */
    struct mmrt_error err = {MMRT_OK, ""};
    mmrt_status st = mmrt_pool_alloc(pool, nbytes, &b, &err);
    if (st != MMRT_OK)
        fail_msg("alloc %" PRIu64 ": %s: %s", nbytes, mmrt_status_name(st), err.msg);
    return b;
}

static void must_check(const struct mmrt_pool *pool)
{
    struct mmrt_error err = {MMRT_OK, ""};
    mmrt_status st = mmrt_pool_check(pool, &err);
    if (st != MMRT_OK)
        fail_msg("check: %s: %s", mmrt_status_name(st), err.msg);
}

static struct mmrt_pool_stats stats_of(const struct mmrt_pool *pool)
{
    struct mmrt_pool_stats s;
    mmrt_pool_stats(pool, &s);
    return s;
}

/* ---- tests --------------------------------------------------------------------------- */

static void test_create_validation(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool_arena_ops ops = fake_ops(&d);
    struct mmrt_pool *sentinel = (struct mmrt_pool *)(uintptr_t)0x1234, *pool = sentinel;
    struct mmrt_error err;
    struct mmrt_pool_config cfg = {MB, 0, 0, MMRT_POOL_LEVEL1_DEFAULT};

    assert_int_equal(mmrt_pool_create(NULL, &ops, &pool, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_pool_create(&cfg, NULL, &pool, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_pool_create(&cfg, &ops, NULL, &err), MMRT_ERR_INVALID_ARG);
    struct mmrt_pool_arena_ops no_free = {&d, fake_alloc, NULL};
    assert_int_equal(mmrt_pool_create(&cfg, &no_free, &pool, &err), MMRT_ERR_INVALID_ARG);
    assert_contains(err.msg, "callback");

    cfg = (struct mmrt_pool_config){MB, 0, 100, MMRT_POOL_LEVEL1_DEFAULT};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "min_block_bytes 100 is not a power of two");
    cfg = (struct mmrt_pool_config){MB, 0, 32, MMRT_POOL_LEVEL1_DEFAULT};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "min_block_bytes 32");
    cfg = (struct mmrt_pool_config){255, 0, 0, MMRT_POOL_LEVEL1_DEFAULT};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "capacity_bytes 255 is smaller than min_block_bytes 256");
    cfg = (struct mmrt_pool_config){MB, 128, 0, MMRT_POOL_LEVEL1_DEFAULT};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "max_arena_bytes 128");
    cfg = (struct mmrt_pool_config){MB, 0, 0, (enum mmrt_pool_level1)3};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "level1 3 is not one of");
    cfg = (struct mmrt_pool_config){MB, 0, 0, (enum mmrt_pool_level1)-1};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    cfg = (struct mmrt_pool_config){UINT64_C(1) << 40, 64, 64, MMRT_POOL_LEVEL1_DEFAULT};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_LIMIT);
    assert_contains(err.msg, "17179869184 arenas");
    cfg = (struct mmrt_pool_config){MMRT_POOL_MAX_ARENAS * 64 + 64, 64, 64, MMRT_POOL_LEVEL1_DEFAULT}; /* one too many */
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_LIMIT);

    assert_ptr_equal(pool, sentinel);
    assert_int_equal(d.n_calls, 0);

    /* Exactly the limit is fine (and every arena is a single min block). */
    cfg = (struct mmrt_pool_config){64 * FAKE_MAX, 64, 64, MMRT_POOL_LEVEL1_DEFAULT};
    pool = pool_new(&d, cfg.capacity_bytes, cfg.max_arena_bytes, cfg.min_block_bytes);
    assert_int_equal(stats_of(pool).n_arenas, FAKE_MAX);
    assert_int_equal(stats_of(pool).n_orders, 1);
    must_check(pool);
    mmrt_pool_destroy(pool);
    /* Level 1 explicitly on or off. */
    struct fake_dev d2 = {0};
    pool = pool_make(&d2, MB, 0, 0, MMRT_POOL_LEVEL1_ON);
    assert_int_equal(stats_of(pool).level1_enabled, 1);
    mmrt_pool_destroy(pool);
    pool = pool_make(&d2, MB, 0, 0, MMRT_POOL_LEVEL1_OFF);
    assert_int_equal(stats_of(pool).level1_enabled, 0);
    mmrt_pool_destroy(pool);
    assert_int_equal(d2.n_live, 0);
    assert_int_equal(d.n_live, 0);
    assert_int_equal(d.n_bad_free, 0);

    mmrt_pool_destroy(NULL);
    mmrt_pool_free(NULL, NULL);
    mmrt_pool_reset_peak(NULL);
    struct mmrt_pool_stats s;
    memset(&s, 0xab, sizeof s);
    mmrt_pool_stats(NULL, &s);
    assert_int_equal(s.capacity_bytes, 0);
    assert_int_equal(s.n_arenas, 0);
    mmrt_pool_stats(NULL, NULL);
    assert_int_equal(mmrt_pool_check(NULL, &err), MMRT_ERR_INVALID_ARG);
}

static void test_basic(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, MB, 0, 0); /* default min block: 256 */
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.capacity_bytes, MB);
    assert_int_equal(s.min_block_bytes, 256);
    assert_int_equal(s.n_arenas, 1);
    assert_int_equal(s.n_orders, 13); /* 256 B … 1 MiB */
    assert_int_equal(s.free_blocks_per_order[12], 1);
    assert_int_equal(s.largest_free_block, MB);
    assert_int_equal(s.total_free_bytes, MB);
    assert_true(s.fragmentation == 0.0);
    assert_int_equal(d.n_arenas, 1);
    assert_int_equal(d.size[0], MB);

    struct { uint64_t ask, nbytes, offset; } cases[] = {
        {1, 256, 0},            /* 1 byte → one min block, lowest address */
        {256, 256, 256},        /* exact min block */
        {257, 512, 512},        /* one byte over → next order */
        {4096, 4096, 4096},     /* exact power of two */
        {4097, 8192, 8192},     /* one byte over */
        {1000, 1024, 1024},     /* fills the hole split off earlier: best fit, lowest first */
    };
    struct mmrt_pool_block b[6];
    uint64_t in_use = 0, requested = 0;
    for (int i = 0; i < 6; i++) {
        b[i] = must_alloc(pool, cases[i].ask);
        assert_ptr_equal(b[i].arena, d.handle[0]);
        assert_int_equal(b[i].nbytes, cases[i].nbytes);
        assert_int_equal(b[i].offset, cases[i].offset);
        assert_int_equal(b[i].requested, cases[i].ask);
        in_use += cases[i].nbytes;
        requested += cases[i].ask;
        s = stats_of(pool);
        assert_int_equal(s.bytes_in_use, in_use);
        assert_int_equal(s.bytes_requested_in_use, requested);
        assert_int_equal(s.n_allocs, i + 1);
        must_check(pool);
    }
    assert_int_equal(s.peak_bytes_in_use, in_use);
    assert_int_equal(s.n_allocs_total, 6);
    for (int i = 0; i < 6; i++) {
        mmrt_pool_free(pool, &b[i]);
        must_check(pool);
    }
    s = stats_of(pool);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_requested_in_use, 0);
    assert_int_equal(s.n_allocs, 0);
    assert_int_equal(s.peak_bytes_in_use, in_use);
    assert_int_equal(s.n_bad_frees, 0);
    for (int k = 0; k < MMRT_POOL_MAX_ORDERS; k++)
        assert_int_equal(s.free_blocks_per_order[k], k == 12 ? 1 : 0);

    /* Lowest address first, and a freed hole is reused. */
    struct mmrt_pool_block q[4];
    for (int i = 0; i < 4; i++) {
        q[i] = must_alloc(pool, 200);
        assert_int_equal(q[i].offset, (uint64_t)i * 256);
    }
    mmrt_pool_free(pool, &q[2]);
    mmrt_pool_free(pool, &q[1]);
    q[1] = must_alloc(pool, 256);
    assert_int_equal(q[1].offset, 256);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            mmrt_pool_free(pool, &q[i]);

    /* The whole arena in one block, then nothing is left. */
    struct mmrt_pool_block all = must_alloc(pool, MB);
    assert_int_equal(all.offset, 0);
    assert_int_equal(all.nbytes, MB);
    struct mmrt_pool_block out;
    assert_int_equal(mmrt_pool_alloc(pool, 1, &out, NULL), MMRT_ERR_OUT_OF_POOL);
    s = stats_of(pool);
    assert_int_equal(s.total_free_bytes, 0);
    assert_int_equal(s.largest_free_block, 0);
    assert_true(s.fragmentation == 0.0);
    mmrt_pool_free(pool, &all);
    must_check(pool);

    /* reset_peak starts a new window at the current level. */
    struct mmrt_pool_block x = must_alloc(pool, 3000);
    mmrt_pool_reset_peak(pool);
    assert_int_equal(stats_of(pool).peak_bytes_in_use, 4096);
    mmrt_pool_free(pool, &x);
    assert_int_equal(stats_of(pool).peak_bytes_in_use, 4096);
    mmrt_pool_reset_peak(pool);
    assert_int_equal(stats_of(pool).peak_bytes_in_use, 0);

    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

static void test_alignment_every_order(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, 4 * MB, 0, 64);
    /* One block of every order from 64 B to 1 MiB, then of every odd size around it. */
    struct mmrt_pool_block b[64];
    int n = 0;
    for (uint64_t size = 64; size <= MB; size <<= 1) {
        b[n] = must_alloc(pool, size);
        assert_int_equal(b[n].nbytes, size);
        assert_int_equal(b[n].offset % size, 0);
        n++;
        b[n] = must_alloc(pool, size / 2 + 1);
        assert_int_equal(b[n].nbytes, size);
        assert_int_equal(b[n].offset % size, 0);
        assert_int_equal(b[n].offset % 64, 0);
        n++;
    }
    must_check(pool);
    for (int i = 0; i < n; i++)
        mmrt_pool_free(pool, &b[i]);
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.free_blocks_per_order[16], 1); /* 4 MiB / 64 = 2^16 */
    assert_int_equal(s.bytes_in_use, 0);
    must_check(pool);
    mmrt_pool_destroy(pool);
}

static void test_non_power_of_two_capacity(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, 3 * MB + 64 * KB + 1000, 0, 4096);
    assert_int_equal(d.n_arenas, 3);
    assert_int_equal(d.size[0], 2 * MB);
    assert_int_equal(d.size[1], MB);
    assert_int_equal(d.size[2], 64 * KB);
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.capacity_bytes, 3 * MB + 64 * KB); /* the 1000 bytes are dropped */
    assert_int_equal(s.n_arenas, 3);
    assert_int_equal(s.n_orders, 10);
    assert_int_equal(s.free_blocks_per_order[9], 1);
    assert_int_equal(s.free_blocks_per_order[8], 1);
    assert_int_equal(s.free_blocks_per_order[4], 1);
    assert_int_equal(s.total_free_bytes, 3 * MB + 64 * KB);
    assert_int_equal(s.largest_free_block, 2 * MB);
    assert_true(s.fragmentation == 1.0 - (double)(2 * MB) / (double)(3 * MB + 64 * KB));

    /* Each arena can be filled by one block of its own size. */
    struct mmrt_pool_block a = must_alloc(pool, 2 * MB), b = must_alloc(pool, MB),
                           c = must_alloc(pool, 64 * KB);
    assert_ptr_equal(a.arena, d.handle[0]);
    assert_ptr_equal(b.arena, d.handle[1]);
    assert_ptr_equal(c.arena, d.handle[2]);
    assert_int_equal(stats_of(pool).total_free_bytes, 0);
    mmrt_pool_free(pool, &b);
    mmrt_pool_free(pool, &a);
    mmrt_pool_free(pool, &c);
    must_check(pool);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

static void test_max_arena(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    /* 1.5 MiB rounds down to 1 MiB arenas: 5 of them plus 512 KiB. */
    struct mmrt_pool *pool = pool_new(&d, 5 * MB + 512 * KB, MB + MB / 2, 0);
    assert_int_equal(d.n_arenas, 6);
    for (int i = 0; i < 5; i++)
        assert_int_equal(d.size[i], MB);
    assert_int_equal(d.size[5], 512 * KB);
    assert_int_equal(stats_of(pool).n_orders, 13);

    struct mmrt_pool_block out, sentinel;
    memset(&sentinel, 0x5a, sizeof sentinel);
    out = sentinel;
    struct mmrt_error err;
    assert_int_equal(mmrt_pool_alloc(pool, MB + 1, &out, &err), MMRT_ERR_OUT_OF_POOL);
    assert_contains(err.msg, "cannot allocate 1048577 bytes");
    assert_contains(err.msg, "larger than the largest arena, 1048576 bytes");
    assert_contains(err.msg, "largest free block is 1048576 bytes");
    assert_memory_equal(&out, &sentinel, sizeof out);

    /* Ties between equal arenas go to the lowest arena index. */
    struct mmrt_pool_block b[6];
    for (int i = 0; i < 5; i++) {
        b[i] = must_alloc(pool, MB);
        assert_ptr_equal(b[i].arena, d.handle[i]);
    }
    b[5] = must_alloc(pool, 512 * KB);
    assert_ptr_equal(b[5].arena, d.handle[5]);
    assert_int_equal(mmrt_pool_alloc(pool, 64, &out, &err), MMRT_ERR_OUT_OF_POOL);
    assert_contains(err.msg, "largest free block is 0 bytes");
    for (int i = 0; i < 6; i++)
        mmrt_pool_free(pool, &b[i]);
    must_check(pool);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

static void test_best_fit(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, MB + 64 * KB, 0, 4096);
    void *big = d.handle[0], *small = d.handle[1];

    /* The small arena is the best fit even for a tiny block: the 1 MiB stays whole. */
    struct mmrt_pool_block t = must_alloc(pool, 100);
    assert_ptr_equal(t.arena, small);
    assert_int_equal(t.offset, 0);
    assert_int_equal(stats_of(pool).largest_free_block, MB);

    struct mmrt_pool_block h = must_alloc(pool, 512 * KB);
    assert_ptr_equal(h.arena, big);
    assert_int_equal(h.offset, 0);
    /* Free in small: 4K@4K, 8K@8K, 16K@16K, 32K@32K; in big: 512K@512K. */
    struct mmrt_pool_block e = must_alloc(pool, 8 * KB);
    assert_ptr_equal(e.arena, small);
    assert_int_equal(e.offset, 8 * KB);
    /* 64 KiB fits only in the big arena now. */
    struct mmrt_pool_block f = must_alloc(pool, 64 * KB);
    assert_ptr_equal(f.arena, big);
    assert_int_equal(f.offset, 512 * KB);
    /* A smaller free block in the big arena beats a larger one in the small arena. */
    struct mmrt_pool_block g = must_alloc(pool, 40 * KB); /* 64K: big has 64K@576K */
    assert_ptr_equal(g.arena, big);
    assert_int_equal(g.offset, 576 * KB);
    struct mmrt_pool_block i = must_alloc(pool, 32 * KB); /* small's 32K@32K is smallest */
    assert_ptr_equal(i.arena, small);
    assert_int_equal(i.offset, 32 * KB);
    must_check(pool);

    struct mmrt_pool_block all[] = {t, h, e, f, g, i};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        mmrt_pool_free(pool, &all[k]);
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.free_blocks_per_order[8], 1);
    assert_int_equal(s.free_blocks_per_order[4], 1);
    assert_int_equal(s.n_bad_frees, 0);
    must_check(pool);
    mmrt_pool_destroy(pool);
}

static void test_out_of_pool(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, MB, 0, 256);
    struct mmrt_pool_block out, sentinel, b[4];
    memset(&sentinel, 0x77, sizeof sentinel);
    struct mmrt_error err;

    out = sentinel;
    assert_int_equal(mmrt_pool_alloc(pool, 0, &out, &err), MMRT_ERR_INVALID_ARG);
    assert_contains(err.msg, "0 bytes");
    assert_int_equal(mmrt_pool_alloc(NULL, 10, &out, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_pool_alloc(pool, 10, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_memory_equal(&out, &sentinel, sizeof out);

    b[0] = must_alloc(pool, 512 * KB);
    b[1] = must_alloc(pool, 200 * KB);
    b[2] = must_alloc(pool, 100);
    /* Free now: 256@(768K+256), 512@(768K+512) … 128K@896K; the largest is 128 KiB. */
    out = sentinel;
    assert_int_equal(mmrt_pool_alloc(pool, 140000, &out, &err), MMRT_ERR_OUT_OF_POOL);
    assert_memory_equal(&out, &sentinel, sizeof out);
    assert_int_equal(err.status, MMRT_ERR_OUT_OF_POOL);
    assert_string_equal(err.msg, "pool: cannot allocate 140000 bytes (block of 262144): largest "
                                 "free block is 131072 bytes, 786688 in use of 1048576");
    /* Twice the largest arena: same information. */
    assert_int_equal(mmrt_pool_alloc(pool, 3 * MB, &out, &err), MMRT_ERR_OUT_OF_POOL);
    assert_contains(err.msg, "cannot allocate 3145728 bytes");
    assert_contains(err.msg, "largest free block is 131072 bytes");
    assert_contains(err.msg, "786688 in use of 1048576");
    /* Far beyond anything representable as a block. */
    assert_int_equal(mmrt_pool_alloc(pool, UINT64_MAX, &out, &err), MMRT_ERR_OUT_OF_POOL);
    assert_contains(err.msg, "cannot allocate 18446744073709551615 bytes");
    assert_memory_equal(&out, &sentinel, sizeof out);

    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.n_out_of_pool, 3);
    assert_int_equal(s.n_allocs, 3);
    assert_int_equal(s.bytes_in_use, 512 * KB + 256 * KB + 256);
    must_check(pool);

    /* Still fully usable: the 128 KiB block is there, and freeing makes room. */
    b[3] = must_alloc(pool, 123456);
    assert_int_equal(b[3].offset, 896 * KB);
    mmrt_pool_free(pool, &b[0]);
    struct mmrt_pool_block big = must_alloc(pool, 300 * KB);
    assert_int_equal(big.offset, 0);
    mmrt_pool_free(pool, &big);
    for (int i = 1; i < 4; i++)
        mmrt_pool_free(pool, &b[i]);
    s = stats_of(pool);
    assert_int_equal(s.free_blocks_per_order[12], 1);
    assert_int_equal(s.n_out_of_pool, 3);
    must_check(pool);
    mmrt_pool_destroy(pool);
}

static void test_bad_frees(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, 64 * KB + 4 * KB, 0, 256);
    /* a (1 KiB) and b (512) land in the 4 KiB arena (best fit), c (8 KiB) at 0 of the
     * 64 KiB one, whose free blocks are then 8K@8K, 16K@16K, 32K@32K. */
    struct mmrt_pool_block a = must_alloc(pool, 1000), b = must_alloc(pool, 300),
                           c = must_alloc(pool, 5000);
    assert_ptr_equal(a.arena, d.handle[1]);
    assert_ptr_equal(b.arena, d.handle[1]);
    assert_ptr_equal(c.arena, d.handle[0]);
    assert_int_equal(c.offset, 0);
    struct mmrt_pool_stats before = stats_of(pool);
    uint64_t bad = 0;

#define BAD_FREE(blk)                                                                      \
    do {                                                                                   \
        struct mmrt_pool_block bb_ = (blk);                                                \
        mmrt_pool_free(pool, &bb_);                                                        \
        bad++;                                                                             \
        struct mmrt_pool_stats s_ = stats_of(pool);                                        \
        assert_int_equal(s_.n_bad_frees, bad);                                             \
        assert_int_equal(s_.bytes_in_use, before.bytes_in_use);                            \
        assert_int_equal(s_.bytes_requested_in_use, before.bytes_requested_in_use);        \
        assert_int_equal(s_.n_allocs, before.n_allocs);                                    \
        assert_memory_equal(s_.free_blocks_per_order, before.free_blocks_per_order,        \
                            sizeof s_.free_blocks_per_order);                              \
        must_check(pool);                                                                  \
    } while (0)

    struct mmrt_pool_block x;
    x = a; x.arena = NULL; BAD_FREE(x);                     /* NULL arena */
    x = a; x.arena = fake_handle(40); BAD_FREE(x);          /* foreign arena */
    x = a; x.offset += 1; BAD_FREE(x);                      /* unaligned */
    x = a; x.offset = 64 * KB; BAD_FREE(x);                 /* past the arena's end */
    x = a; x.offset = UINT64_MAX & ~UINT64_C(255); BAD_FREE(x);
    x = c; x.offset += 256; BAD_FREE(x);                    /* inside a live block */
    x = c; x.offset = 32 * KB; BAD_FREE(x);                 /* a free block's head */
    x = a; x.nbytes = 2048; BAD_FREE(x);                    /* wrong size */
    x = a; x.requested = 0; BAD_FREE(x);                    /* impossible requested */
    x = a; x.requested = 2000; BAD_FREE(x);                 /* larger than the block */
    x = a; x.requested = 500; BAD_FREE(x);                  /* would fit a smaller order */
    x = b; x.arena = a.arena; x.offset = a.offset; BAD_FREE(x); /* a's place, b's size */
    mmrt_pool_free(pool, NULL);
    bad++;
    assert_int_equal(stats_of(pool).n_bad_frees, bad);

    /* A real free, then the double free of it. */
    mmrt_pool_free(pool, &b);
    before = stats_of(pool);
    BAD_FREE(b);
    /* a and c are intact and free normally. */
    mmrt_pool_free(pool, &a);
    mmrt_pool_free(pool, &c);
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.n_bad_frees, bad);
    assert_int_equal(s.n_allocs, 0);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.free_blocks_per_order[8], 1);
    assert_int_equal(s.free_blocks_per_order[4], 1);
    must_check(pool);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
#undef BAD_FREE
}

static void test_fragmentation(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, 4096, 0, 256); /* one arena of 16 units */
    struct mmrt_pool_block a = must_alloc(pool, 256), b = must_alloc(pool, 256),
                           c = must_alloc(pool, 512), e = must_alloc(pool, 1024);
    assert_int_equal(a.offset, 0);
    assert_int_equal(b.offset, 256);
    assert_int_equal(c.offset, 512);
    assert_int_equal(e.offset, 1024);
    mmrt_pool_free(pool, &a);
    mmrt_pool_free(pool, &c);
    /* Free: 256@0, 512@512, 2048@2048 → total 2816, largest 2048. */
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.total_free_bytes, 2816);
    assert_int_equal(s.largest_free_block, 2048);
    assert_int_equal(s.free_blocks_per_order[0], 1);
    assert_int_equal(s.free_blocks_per_order[1], 1);
    assert_int_equal(s.free_blocks_per_order[2], 0);
    assert_int_equal(s.free_blocks_per_order[3], 1);
    assert_int_equal(s.free_blocks_per_order[4], 0);
    assert_true(s.fragmentation == 1.0 - 2048.0 / 2816.0);
    assert_true(s.fragmentation > 0.2727 && s.fragmentation < 0.2728);
    /* Freeing b coalesces 256+256 → 512, with c's 512 → 1024. */
    mmrt_pool_free(pool, &b);
    s = stats_of(pool);
    assert_int_equal(s.free_blocks_per_order[0], 0);
    assert_int_equal(s.free_blocks_per_order[1], 0);
    assert_int_equal(s.free_blocks_per_order[2], 1);
    assert_int_equal(s.free_blocks_per_order[3], 1);
    assert_true(s.fragmentation == 1.0 - 2048.0 / 3072.0);
    mmrt_pool_free(pool, &e);
    s = stats_of(pool);
    assert_int_equal(s.free_blocks_per_order[4], 1);
    assert_true(s.fragmentation == 0.0);
    must_check(pool);
    mmrt_pool_destroy(pool);
}

/* ---- random sequences against a shadow model ----------------------------------------- */

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

struct shadow {
    struct fake_dev *dev;
    uint64_t min_block;
    uint8_t *occ[FAKE_MAX];    /* per arena, per unit: 1 = in a live block */
    uint32_t *prefix;          /* scratch for the free-block decomposition */
    struct mmrt_pool_block *live;
    size_t n_live, cap_live;
    uint64_t in_use, requested, peak, n_total, n_oop, n_bad;
};

/* Hands a block that is not live to the pool (a double free or a wrong offset), which must
 * ignore it and count it; false when it happens to match a live block again, which pool.h
 * says cannot be told apart from a real free, so the caller skips the step. */
static bool shadow_bad_free(struct shadow *sh, struct mmrt_pool *pool,
                            const struct mmrt_pool_block *x)
{
    for (size_t i = 0; i < sh->n_live; i++)
        if (sh->live[i].arena == x->arena && sh->live[i].offset == x->offset &&
            sh->live[i].nbytes == x->nbytes)
            return false;
    mmrt_pool_free(pool, x);
    sh->n_bad++;
    return true;
}

static void shadow_mark(struct shadow *sh, const struct mmrt_pool_block *b, uint8_t v);

/* Frees live block i, in the pool and in the shadow; returns it. */
static struct mmrt_pool_block shadow_free_live(struct shadow *sh, struct mmrt_pool *pool,
                                               size_t i)
{
    struct mmrt_pool_block b = sh->live[i];
    mmrt_pool_free(pool, &b);
    shadow_mark(sh, &b, 0);
    sh->live[i] = sh->live[--sh->n_live];
    sh->in_use -= b.nbytes;
    sh->requested -= b.requested;
    return b;
}

static uint64_t next_block(uint64_t nbytes, uint64_t min_block)
{
    uint64_t b = min_block;
    while (b < nbytes)
        b <<= 1;
    return b;
}

/* Is there an aligned, fully free range of `units` units in some arena? */
static bool shadow_fits(const struct shadow *sh, uint64_t units)
{
    for (int a = 0; a < sh->dev->n_arenas; a++) {
        uint64_t n = sh->dev->size[a] / sh->min_block;
        for (uint64_t pos = 0; pos + units <= n; pos += units) {
            uint64_t u = pos;
            while (u < pos + units && !sh->occ[a][u])
                u++;
            if (u == pos + units)
                return true;
        }
    }
    return false;
}

/* The free blocks a fully coalesced buddy system must have: maximal aligned free ranges. */
static void shadow_decompose(const uint32_t *prefix, uint64_t pos, unsigned order,
                             uint64_t *count)
{
    uint64_t n = UINT64_C(1) << order;
    uint32_t used = prefix[pos + n] - prefix[pos];
    if (used == 0)
        count[order]++;
    else if (used < n)
        for (uint64_t half = 0; half < 2; half++)
            shadow_decompose(prefix, pos + half * (n >> 1), order - 1, count);
}

static void shadow_verify_free_blocks(struct shadow *sh, const struct mmrt_pool_stats *s)
{
    uint64_t count[MMRT_POOL_MAX_ORDERS] = {0};
    for (int a = 0; a < sh->dev->n_arenas; a++) {
        uint64_t n = sh->dev->size[a] / sh->min_block;
        sh->prefix[0] = 0;
        for (uint64_t u = 0; u < n; u++)
            sh->prefix[u + 1] = sh->prefix[u] + sh->occ[a][u];
        shadow_decompose(sh->prefix, 0, (unsigned)__builtin_ctzll(n), count);
    }
    for (int k = 0; k < MMRT_POOL_MAX_ORDERS; k++)
        if (count[k] != s->free_blocks_per_order[k])
            fail_msg("order %d: pool has %" PRIu64 " free blocks, the shadow %" PRIu64, k,
                     s->free_blocks_per_order[k], count[k]);
}

static void shadow_compare_stats(const struct shadow *sh, const struct mmrt_pool_stats *s)
{
    assert_int_equal(s->bytes_in_use, sh->in_use);
    assert_int_equal(s->bytes_requested_in_use, sh->requested);
    assert_int_equal(s->peak_bytes_in_use, sh->peak);
    assert_int_equal(s->n_allocs, sh->n_live);
    assert_int_equal(s->n_allocs_total, sh->n_total);
    assert_int_equal(s->n_out_of_pool, sh->n_oop);
    assert_int_equal(s->n_bad_frees, sh->n_bad);
    assert_int_equal(s->total_free_bytes, s->capacity_bytes - sh->in_use);
    uint64_t free_sum = 0, largest = 0;
    for (unsigned k = 0; k < MMRT_POOL_MAX_ORDERS; k++) {
        if (s->free_blocks_per_order[k]) {
            assert_true(k < s->n_orders);
            free_sum += s->free_blocks_per_order[k] * (s->min_block_bytes << k);
            largest = s->min_block_bytes << k;
        }
    }
    assert_int_equal(free_sum, s->total_free_bytes);
    assert_int_equal(largest, s->largest_free_block);
    double frag = s->total_free_bytes
                      ? 1.0 - (double)largest / (double)s->total_free_bytes : 0.0;
    assert_true(s->fragmentation == frag);
}

static void shadow_mark(struct shadow *sh, const struct mmrt_pool_block *b, uint8_t v)
{
    int a = fake_index(sh->dev, b->arena);
    assert_true(a >= 0);
    uint64_t first = b->offset / sh->min_block, n = b->nbytes / sh->min_block;
    for (uint64_t u = first; u < first + n; u++) {
        if (sh->occ[a][u] == v)
            fail_msg("arena %d offset %" PRIu64 ": block [%" PRIu64 ", +%" PRIu64 ") %s",
                     a, u * sh->min_block, b->offset, b->nbytes,
                     v ? "overlaps a live block" : "was not live");
        sh->occ[a][u] = v;
    }
}

static void run_random(uint64_t capacity, uint64_t max_arena, uint64_t min_block, int steps,
                       uint64_t seed)
{
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new(&d, capacity, max_arena, min_block);
    struct shadow sh = {.dev = &d, .min_block = min_block};
    uint64_t max_units = 0, largest = 0;
    for (int a = 0; a < d.n_arenas; a++) {
        uint64_t n = d.size[a] / min_block;
        sh.occ[a] = calloc(n, 1);
        assert_non_null(sh.occ[a]);
        if (n > max_units)
            max_units = n;
        if (d.size[a] > largest)
            largest = d.size[a];
    }
    sh.prefix = calloc(max_units + 1, sizeof *sh.prefix);
    sh.cap_live = 1024;
    sh.live = calloc(sh.cap_live, sizeof *sh.live);
    assert_non_null(sh.prefix);
    assert_non_null(sh.live);
    unsigned top = (unsigned)__builtin_ctzll(largest / min_block); /* largest order */
    struct mmrt_pool_block last_freed = {0};
    bool have_last = false;
    uint64_t rng = seed, n_fail_checked = 0;

    for (int step = 0; step < steps; step++) {
        uint64_t r = rng_next(&rng);
        bool grow = (step / 5000) % 2 == 0; /* alternate filling and draining phases */
        bool do_alloc = sh.n_live == 0 || (r % 100) < (grow ? 65u : 40u);
        if (do_alloc) {
            /* Order skewed towards small blocks; the size inside the order varies. */
            uint64_t r2 = rng_next(&rng);
            unsigned o = (unsigned)((r2 % (top + 1)) * ((r2 >> 16) % (top + 1)) / (top + 1));
            uint64_t size = min_block << o, nbytes;
            switch ((r2 >> 32) % 16) {
            case 0: case 1: case 2: nbytes = size; break;        /* exact power of two */
            case 3: case 4: case 5: nbytes = size + 1; break;    /* one over */
            case 6: nbytes = 1; break;
            case 7: nbytes = largest + 1 + (r2 >> 40) % 1000; break; /* never fits */
            default: nbytes = size / 2 + 1 + (r2 >> 40) % (size / 2); break;
            }
            struct mmrt_pool_block b, sentinel;
            memset(&sentinel, 0xc3, sizeof sentinel);
            b = sentinel;
            struct mmrt_error err = {MMRT_OK, ""};
            mmrt_status st = mmrt_pool_alloc(pool, nbytes, &b, &err);
            uint64_t want = nbytes > largest ? 0 : next_block(nbytes, min_block);
            if (st == MMRT_OK) {
                assert_true(want != 0);
                assert_int_equal(b.nbytes, want);
                assert_int_equal(b.requested, nbytes);
                int a = fake_index(&d, b.arena);
                assert_true(a >= 0);
                assert_int_equal(b.offset % min_block, 0);
                assert_int_equal(b.offset % b.nbytes, 0);
                assert_true(b.offset + b.nbytes <= d.size[a]);
                shadow_mark(&sh, &b, 1);
                if (sh.n_live == sh.cap_live) {
                    sh.cap_live *= 2;
                    sh.live = realloc(sh.live, sh.cap_live * sizeof *sh.live);
                    assert_non_null(sh.live);
                }
                sh.live[sh.n_live++] = b;
                sh.in_use += b.nbytes;
                sh.requested += nbytes;
                if (sh.in_use > sh.peak)
                    sh.peak = sh.in_use;
                sh.n_total++;
            } else {
                assert_int_equal(st, MMRT_ERR_OUT_OF_POOL);
                assert_memory_equal(&b, &sentinel, sizeof b);
                char want_msg[96];
                snprintf(want_msg, sizeof want_msg, "cannot allocate %" PRIu64 " bytes", nbytes);
                assert_contains(err.msg, want_msg);
                assert_contains(err.msg, "largest free block is");
                /* Only legitimate failures: no aligned free range of that size anywhere. */
                if (want != 0 && n_fail_checked++ % 4 == 0)
                    assert_false(shadow_fits(&sh, want / min_block));
                sh.n_oop++;
            }
        } else {
            uint64_t r2 = rng_next(&rng);
            if (r2 % 64 < 2 && (have_last || r2 % 64 == 1)) {
                struct mmrt_pool_block x;
                if (r2 % 64 == 0) {
                    x = last_freed; /* double free */
                } else {
                    x = sh.live[(r2 >> 8) % sh.n_live];
                    x.offset += min_block * (1 + (r2 >> 32) % 3); /* inside or past it */
                }
                if (!shadow_bad_free(&sh, pool, &x))
                    continue;
            } else {
                last_freed = shadow_free_live(&sh, pool, (size_t)((r2 >> 8) % sh.n_live));
                have_last = true;
            }
        }
        struct mmrt_pool_stats s = stats_of(pool);
        shadow_compare_stats(&sh, &s);
        if (step % 1000 == 999) {
            must_check(pool);
            shadow_verify_free_blocks(&sh, &s);
        }
    }
    /* Free everything in random order: everything must coalesce back to whole arenas. */
    while (sh.n_live > 0) {
        size_t i = (size_t)(rng_next(&rng) % sh.n_live);
        mmrt_pool_free(pool, &sh.live[i]);
        shadow_mark(&sh, &sh.live[i], 0);
        sh.in_use -= sh.live[i].nbytes;
        sh.requested -= sh.live[i].requested;
        sh.live[i] = sh.live[--sh.n_live];
    }
    struct mmrt_pool_stats s = stats_of(pool);
    shadow_compare_stats(&sh, &s);
    assert_int_equal(s.bytes_in_use, 0);
    uint64_t per_order[MMRT_POOL_MAX_ORDERS] = {0};
    for (int a = 0; a < d.n_arenas; a++)
        per_order[__builtin_ctzll(d.size[a] / min_block)]++;
    assert_memory_equal(s.free_blocks_per_order, per_order, sizeof per_order);
    must_check(pool);
    assert_true(sh.n_total > (uint64_t)steps / 4);
    assert_true(sh.n_oop > 0);
    assert_true(sh.n_bad > 0);
    assert_true(sh.peak > s.capacity_bytes / 2);

    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
    assert_int_equal(d.n_bad_free, 0);
    for (int a = 0; a < d.n_arenas; a++)
        free(sh.occ[a]);
    free(sh.prefix);
    free(sh.live);
}

static void test_random_single_arena(void **state)
{
    (void)state;
    run_random(2 * MB, 0, 256, 100000, 1);
}

static void test_random_mixed_arenas(void **state)
{
    (void)state;
    /* Arenas of 4 MiB, 1 MiB, 256 KiB and 4 KiB; 100 bytes dropped. */
    run_random(4 * MB + MB + 256 * KB + 4 * KB + 100, 0, 256, 150000, 2);
}

static void test_random_max_arena(void **state)
{
    (void)state;
    /* Six arenas of 512 KiB and one of 128 KiB, 64-byte blocks. */
    run_random(3 * MB + 128 * KB, 512 * KB + 12345, 64, 100000, 3);
}

/* ---- failure injection --------------------------------------------------------------- */

/* One full life of a pool; returns the first failure (after cleaning up) or MMRT_OK, and
 * the last stats in *end. Recurring sizes make level 1 build slabs, keep and reuse them, and
 * the last two 512 KiB blocks only fit once it has returned its empty slabs. */
static mmrt_status sweep_scenario(struct fake_dev *d, enum mmrt_pool_level1 level1,
                                  struct mmrt_pool_stats *end, struct mmrt_error *err)
{
    struct mmrt_pool_config cfg = {2 * 512 * KB + 64 * KB + 4 * KB + 10, 512 * KB, 4096, level1};
    struct mmrt_pool_arena_ops ops = fake_ops(d);
    struct mmrt_pool *sentinel = (struct mmrt_pool *)(uintptr_t)0x4321, *pool = sentinel;
    mmrt_status st = mmrt_pool_create(&cfg, &ops, &pool, err);
    if (st != MMRT_OK) {
        assert_ptr_equal(pool, sentinel);
        return st;
    }
    uint64_t calls_after_create = g_heap.calls;
    struct mmrt_pool_block b[16] = { { 0 } }, hold, big[2];
    int n = 0;
    st = mmrt_pool_alloc(pool, 512 * KB, &hold, err);
    if (st != MMRT_OK)
        goto done;
    uint64_t sizes[] = {9000, 4096, 100000, 9000, 1, 9000, 64 * KB, 9000, 200 * KB, 9000};
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            st = mmrt_pool_alloc(pool, sizes[i], &b[n], err);
            if (st != MMRT_OK)
                goto done;
            n++;
            if (i % 4 == 3)
                mmrt_pool_free(pool, &b[--n]);
        }
        struct mmrt_pool_block bogus = b[0];
        bogus.offset += 4096;
        mmrt_pool_free(pool, &bogus);
        if ((st = mmrt_pool_check(pool, err)) != MMRT_OK)
            goto done;
        while (n > 0)
            mmrt_pool_free(pool, &b[--n]);
    }
    mmrt_pool_free(pool, &hold);
    for (int i = 0; i < 2; i++)
        if ((st = mmrt_pool_alloc(pool, 512 * KB, &big[i], err)) != MMRT_OK)
            goto done;
    if ((st = mmrt_pool_check(pool, err)) != MMRT_OK)
        goto done;
    mmrt_pool_free(pool, &big[0]);
    mmrt_pool_free(pool, &big[1]);
    st = mmrt_pool_check(pool, err);
    /* Neither level allocates host memory after create. */
    if (g_heap.armed && g_heap.calls != calls_after_create)
        fail_msg("%" PRIu64 " host allocations after create", g_heap.calls - calls_after_create);
done:
    mmrt_pool_stats(pool, end);
    mmrt_pool_destroy(pool);
    return st;
}

static void alloc_failure_sweep(enum mmrt_pool_level1 level1, int want_failed_runs)
{
    int n_failed_runs = 0;
    for (uint64_t n = 1;; n++) {
        assert_true(n < 1000);
        struct fake_dev d = {0};
        struct mmrt_error err = {MMRT_OK, ""};
        struct mmrt_pool_stats end;
        heap_arm(n);
        mmrt_status st = sweep_scenario(&d, level1, &end, &err);
        heap_disarm();
        if (g_heap.live != 0)
            fail_msg("run failing allocation %" PRIu64 ": %" PRId64 " host allocations leaked",
                     n, g_heap.live);
        assert_int_equal(d.n_live, 0);
        assert_int_equal(d.n_bad_free, 0);
        if (g_heap.injected == 0) {
            if (st != MMRT_OK)
                fail_msg("run without injected failure: %s: %s", mmrt_status_name(st), err.msg);
            assert_true(g_heap.calls > 0);
            assert_int_equal(end.n_bad_frees, 3);
            assert_int_equal(end.n_allocs, 0);
            if (level1 == MMRT_POOL_LEVEL1_OFF) {
                assert_int_equal(end.level1_enabled, 0);
                assert_int_equal(end.level1_hits, 0);
            } else {
                /* Level 1 was really exercised: reuse, and the flush the last blocks need. */
                assert_int_equal(end.level1_enabled, 1);
                assert_true(end.level1_hits > 0);
                assert_true(end.level1_n_flushes > 0);
            }
            break;
        }
        if (st != MMRT_ERR_NO_MEMORY)
            fail_msg("run failing allocation %" PRIu64 ": %s: %s", n, mmrt_status_name(st),
                     err.msg);
        assert_contains(err.msg, "out of host memory");
        /* Host metadata comes first: a host shortage never cost a device arena. */
        assert_int_equal(d.n_calls, 0);
        n_failed_runs++;
    }
    assert_int_equal(n_failed_runs, want_failed_runs);
}

static void test_alloc_failure_sweep(void **state)
{
    (void)state;
    /* pool, arena records, handle index, summary, and one metadata block per arena (4) … */
    alloc_failure_sweep(MMRT_POOL_LEVEL1_OFF, 8);
    /* … and the level-1 records, in one allocation. */
    alloc_failure_sweep(MMRT_POOL_LEVEL1_DEFAULT, 9);
}

static void test_arena_failure(void **state)
{
    (void)state;
    struct mmrt_pool_config cfg = {2 * 512 * KB + 64 * KB + 4 * KB, 512 * KB, 4096,
                                   MMRT_POOL_LEVEL1_DEFAULT};
    const uint64_t sizes[4] = {512 * KB, 512 * KB, 64 * KB, 4 * KB};
    for (int k = 1; k <= 4; k++) {
        for (int silent = 0; silent < 2; silent++) {
            struct fake_dev d = {.fail_at = k, .fail_silent = silent};
            struct mmrt_pool_arena_ops ops = fake_ops(&d);
            struct mmrt_pool *sentinel = (struct mmrt_pool *)(uintptr_t)0x99, *pool = sentinel;
            struct mmrt_error err = {MMRT_OK, ""};
            heap_arm(0);
            mmrt_status st = mmrt_pool_create(&cfg, &ops, &pool, &err);
            heap_disarm();
            assert_int_equal(st, MMRT_ERR_OUT_OF_POOL);
            assert_int_equal(err.status, MMRT_ERR_OUT_OF_POOL);
            assert_ptr_equal(pool, sentinel);
            assert_int_equal(d.n_calls, k);
            assert_int_equal(d.n_live, 0); /* the k−1 arenas it got were returned */
            assert_int_equal(d.n_bad_free, 0);
            assert_int_equal(g_heap.live, 0);
            char want[128];
            snprintf(want, sizeof want, "pool: arena %d of 4 (%" PRIu64 " bytes): ", k - 1,
                     sizes[k - 1]);
            assert_contains(err.msg, want);
            if (silent)
                assert_contains(err.msg, mmrt_status_message(MMRT_ERR_OUT_OF_POOL));
            else
                assert_contains(err.msg, "fake device: no room for");
        }
    }

    /* OK with a NULL handle, and the same handle twice: both refused as device errors. */
    for (int kind = 0; kind < 2; kind++) {
        struct fake_dev d = {0};
        if (kind == 0)
            d.null_at = 3;
        else
            d.dup_at = 2;
        struct mmrt_pool_arena_ops ops = fake_ops(&d);
        struct mmrt_pool *pool = NULL;
        struct mmrt_error err = {MMRT_OK, ""};
        heap_arm(0);
        mmrt_status st = mmrt_pool_create(&cfg, &ops, &pool, &err);
        heap_disarm();
        assert_int_equal(st, MMRT_ERR_DEVICE);
        assert_null(pool);
        assert_contains(err.msg, kind == 0 ? "arena 2 of 4" : "same handle for arenas 0 and 1");
        assert_int_equal(d.n_live, 0);
        assert_int_equal(d.n_bad_free, 0);
        assert_int_equal(g_heap.live, 0);
    }
}

/* ---- level 1 ------------------------------------------------------------------------- */

/* "2.1 MiB": a 4 MiB block at level 2; three share an 8 MiB slab. */
#define X21 (2 * MB + 100 * KB)

static struct mmrt_pool_block alloc_free_pair(struct mmrt_pool *pool, uint64_t nbytes)
{
    struct mmrt_pool_block b = must_alloc(pool, nbytes);
    mmrt_pool_free(pool, &b);
    must_check(pool);
    return b;
}

static void test_l1_reuse(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new_l1(&d, 64 * MB, 0, 256); /* slabs up to 8 MiB */
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.level1_enabled, 1);
    assert_int_equal(s.level1_n_classes, 0);

    /* First request of a size: level 2 serves it, level 1 only remembers the size. */
    struct mmrt_pool_block a = must_alloc(pool, X21);
    assert_int_equal(a.nbytes, 4 * MB);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_classes, 1);
    assert_int_equal(s.level1_n_slabs, 0);
    assert_int_equal(s.level1_misses, 1);
    mmrt_pool_free(pool, &a);
    must_check(pool);

    /* Second: a slab of one exact-size slot, where level 2 would have put the block. */
    struct mmrt_pool_block b = must_alloc(pool, X21);
    assert_int_equal(b.nbytes, X21);
    assert_int_equal(b.requested, X21);
    assert_int_equal(b.offset, 0);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 1);
    assert_int_equal(s.level1_bytes, 4 * MB);
    assert_int_equal(s.level1_free_bytes, 4 * MB - X21);
    assert_int_equal(s.level1_returnable_bytes, 0);
    assert_int_equal(s.bytes_in_use, X21);
    assert_int_equal(s.bytes_held, 4 * MB);
    must_check(pool);

    /* Freed, the slab stays for the next request of its size; it is free to any request
     * all the same, so the pool counts as one free 64 MiB. */
    mmrt_pool_free(pool, &b);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 1);
    assert_int_equal(s.level1_n_empty_slabs, 1);
    assert_int_equal(s.level1_returnable_bytes, 4 * MB);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_held, 0);
    assert_int_equal(s.total_free_bytes, 64 * MB);
    assert_int_equal(s.largest_free_block, 64 * MB);
    assert_true(s.fragmentation == 0.0);
    assert_int_equal(s.free_blocks_per_order[18], 0); /* though level 2 alone is split */
    must_check(pool);

    /* Requests of the size reuse it in place, without level 2. */
    for (int i = 0; i < 5; i++) {
        struct mmrt_pool_block e = alloc_free_pair(pool, X21 - 50 * (uint64_t)i);
        assert_ptr_equal(e.arena, b.arena);
        assert_int_equal(e.offset, 0);
        assert_int_equal(e.nbytes, X21);
        assert_int_equal(e.requested, X21 - 50 * (uint64_t)i); /* same class: same rounding */
    }
    s = stats_of(pool);
    assert_int_equal(s.level1_hits, 5);
    assert_int_equal(s.level1_misses, 2);
    assert_int_equal(s.n_allocs_total, 7);
    assert_int_equal(s.level1_n_flushes, 0);

    /* The next time level 2 is needed, the slab goes back first. */
    alloc_free_pair(pool, 3000);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_flushes, 1);
    assert_int_equal(s.level1_n_slabs, 0);
    assert_int_equal(s.free_blocks_per_order[18], 1);
    b = alloc_free_pair(pool, X21);
    assert_int_equal(stats_of(pool).level1_misses, 4);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

/* One "step": n blocks of nbytes live at once, then all freed. */
static void run_step(struct mmrt_pool *pool, uint64_t nbytes, int n, struct mmrt_pool_block *b)
{
    for (int i = 0; i < n; i++)
        b[i] = must_alloc(pool, nbytes);
    must_check(pool);
    for (int i = 0; i < n; i++)
        mmrt_pool_free(pool, &b[i]);
    must_check(pool);
}

static void test_l1_exact_slots(void **state)
{
    (void)state;
    struct fake_dev d = {0}, d_off = {0};
    struct mmrt_pool *pool = pool_new_l1(&d, 64 * MB, 0, 256);
    struct mmrt_pool *off = pool_new(&d_off, 64 * MB, 0, 256);
    struct mmrt_pool_block b[8], o[8];
    alloc_free_pair(pool, X21);
    alloc_free_pair(off, X21);
    mmrt_pool_reset_peak(pool);
    mmrt_pool_reset_peak(off);

    /* Three at once: the slab grows into its free buddy (8 MiB for three slots costs no
     * more than two 4 MiB blocks), the third slot is a hit. */
    for (int i = 0; i < 3; i++) {
        b[i] = must_alloc(pool, X21);
        assert_int_equal(b[i].nbytes, X21);
        assert_ptr_equal(b[i].arena, b[0].arena);
        assert_int_equal(b[i].offset, (uint64_t)i * X21);
        o[i] = must_alloc(off, X21);
    }
    struct mmrt_pool_stats s = stats_of(pool), so = stats_of(off);
    assert_int_equal(s.level1_n_slabs, 1);
    assert_int_equal(s.level1_bytes, 8 * MB);
    assert_int_equal(s.level1_free_bytes, 8 * MB - 3 * X21);
    assert_int_equal(s.bytes_in_use, 3 * X21);
    assert_int_equal(s.bytes_requested_in_use, 3 * X21);
    assert_int_equal(s.bytes_held, 8 * MB);
    assert_int_equal(s.level1_hits, 1);
    assert_int_equal(so.bytes_in_use, 12 * MB);
    assert_int_equal(so.bytes_held, 12 * MB);
    must_check(pool);

    /* With the lower slots free and the top one live, nothing can be given back … */
    mmrt_pool_free(pool, &b[0]);
    mmrt_pool_free(pool, &b[1]);
    s = stats_of(pool);
    assert_int_equal(s.level1_returnable_bytes, 0);
    assert_int_equal(s.bytes_held, 8 * MB);
    /* … with only the bottom one live, the upper half can. */
    b[0] = must_alloc(pool, X21);
    mmrt_pool_free(pool, &b[2]);
    s = stats_of(pool);
    assert_int_equal(s.level1_returnable_bytes, 4 * MB);
    assert_int_equal(s.bytes_held, 4 * MB);
    assert_int_equal(s.total_free_bytes, 60 * MB);
    must_check(pool);
    mmrt_pool_free(pool, &b[0]);
    for (int i = 0; i < 3; i++)
        mmrt_pool_free(off, &o[i]);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_empty_slabs, 1);
    assert_int_equal(s.level1_returnable_bytes, 8 * MB);

    /* Every later step: the same three slots, all hits, level 2 never asked. */
    uint64_t hits = s.level1_hits, misses = s.level1_misses;
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < 3; i++) {
            b[i] = must_alloc(pool, X21);
            assert_int_equal(b[i].offset, (uint64_t)i * X21);
        }
        for (int i = 0; i < 3; i++)
            mmrt_pool_free(pool, &b[i]);
        run_step(off, X21, 3, o);
    }
    s = stats_of(pool);
    so = stats_of(off);
    assert_int_equal(s.level1_hits, hits + 12);
    assert_int_equal(s.level1_misses, misses);
    assert_int_equal(s.level1_n_flushes, 0);
    assert_int_equal(s.peak_bytes_held, 8 * MB);
    assert_int_equal(so.peak_bytes_held, 12 * MB);
    assert_int_equal(so.peak_bytes_in_use, 12 * MB);
    assert_int_equal(s.peak_bytes_in_use, 3 * X21);

    /* A fourth at once: 16 MiB would exceed the largest slab (8 MiB), so a new slab. */
    for (int i = 0; i < 4; i++)
        b[i] = must_alloc(pool, X21);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 2);
    assert_int_equal(s.level1_bytes, 12 * MB);
    assert_int_equal(b[3].offset, 8 * MB);
    assert_int_equal(b[3].nbytes, X21);
    for (int i = 0; i < 4; i++)
        mmrt_pool_free(pool, &b[i]);

    /* A slab whose buddy is taken cannot grow: the second slot gets a slab of its own. */
    alloc_free_pair(pool, 3 * MB); /* level 2 is asked: every slab goes back */
    assert_int_equal(stats_of(pool).level1_n_slabs, 0);
    b[0] = must_alloc(pool, X21);  /* a slab at 0 */
    struct mmrt_pool_block other = must_alloc(pool, 3 * MB); /* a slot of its own class … */
    assert_int_equal(other.offset, 4 * MB); /* … where the slab would have grown */
    b[1] = must_alloc(pool, X21);
    assert_int_equal(b[1].offset, 8 * MB);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 3);
    assert_int_equal(s.level1_bytes, 12 * MB);
    mmrt_pool_free(pool, &b[0]);
    mmrt_pool_free(pool, &b[1]);
    mmrt_pool_free(pool, &other);

    /* A power of two can save nothing: one slot per slab, whatever the demand. */
    run_step(pool, MB, 5, b);
    for (int i = 0; i < 5; i++) {
        b[i] = must_alloc(pool, MB);
        assert_int_equal(b[i].nbytes, MB);
        assert_int_equal(b[i].offset % MB, 0);
    }
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 5);
    assert_int_equal(s.level1_bytes, 5 * MB);
    for (int i = 0; i < 5; i++)
        mmrt_pool_free(pool, &b[i]);
    must_check(pool);
    mmrt_pool_destroy(pool);
    mmrt_pool_destroy(off);
    assert_int_equal(d.n_live, 0);
}

static void test_l1_slabs_returned(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new_l1(&d, 64 * MB, 0, 256);
    struct mmrt_pool_block b[1100];

    /* A grown slab with only its bottom slot live shrinks back when level 2 is next
     * asked for memory; empty slabs go back whole. */
    alloc_free_pair(pool, X21);
    for (int i = 0; i < 3; i++)
        b[i] = must_alloc(pool, X21);
    alloc_free_pair(pool, 700 * KB); /* another size seen once: its own block */
    alloc_free_pair(pool, 700 * KB); /* a one-slot slab, empty again */
    mmrt_pool_free(pool, &b[1]);
    mmrt_pool_free(pool, &b[2]);
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 2);
    assert_int_equal(s.level1_bytes, 8 * MB + MB);
    assert_int_equal(s.level1_returnable_bytes, 4 * MB + MB);
    uint64_t flushes = s.level1_n_flushes;
    struct mmrt_pool_block big = must_alloc(pool, 16 * MB); /* level 2 */
    s = stats_of(pool);
    assert_int_equal(s.level1_n_flushes, flushes + 1);
    assert_int_equal(s.level1_n_slabs, 1);
    assert_int_equal(s.level1_bytes, 4 * MB);
    assert_int_equal(s.level1_returnable_bytes, 0);
    assert_int_equal(s.bytes_held, 4 * MB + 16 * MB);
    must_check(pool);
    mmrt_pool_free(pool, &big);
    mmrt_pool_free(pool, &b[0]);
    alloc_free_pair(pool, 5 * MB);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, 0);
    assert_int_equal(s.free_blocks_per_order[18], 1); /* all coalesced again */
    mmrt_pool_destroy(pool);

    /* The class table holds MMRT_POOL_L1_MAX_CLASSES sizes; a new one evicts the least
     * recently asked-for class without live slots, which then starts over. */
    pool = pool_new_l1(&d, 64 * MB, 0, 256);
    alloc_free_pair(pool, 5000);
    assert_int_equal(alloc_free_pair(pool, 5000).nbytes, 5120); /* class 5120 */
    struct mmrt_pool_block pinned0 = must_alloc(pool, 7000);
    struct mmrt_pool_block pinned = must_alloc(pool, 7000); /* class 7168, a live slot */
    assert_int_equal(pinned.nbytes, 7168);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_classes, 2);
    for (uint64_t i = 0; s.level1_n_classes < MMRT_POOL_L1_MAX_CLASSES; i++) {
        alloc_free_pair(pool, 8192 + 256 * i);
        s = stats_of(pool);
    }
    alloc_free_pair(pool, 3 * MB); /* one size too many: class 5120 (oldest) goes */
    s = stats_of(pool);
    assert_int_equal(s.level1_n_classes, MMRT_POOL_L1_MAX_CLASSES);
    assert_int_equal(alloc_free_pair(pool, 5000).nbytes, 8192); /* seen once again */
    assert_int_equal(alloc_free_pair(pool, 7000).nbytes, 7168); /* never evicted */
    mmrt_pool_free(pool, &pinned);
    mmrt_pool_free(pool, &pinned0);
    must_check(pool);
    mmrt_pool_destroy(pool);

    /* Out of slab records: level 2 serves the rest, and all of it comes back. */
    pool = pool_new_l1(&d, 64 * MB, 0, 256);
    alloc_free_pair(pool, 256);
    for (int i = 0; i < 1100; i++)
        b[i] = must_alloc(pool, 256);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_slabs, MMRT_POOL_L1_MAX_SLABS);
    assert_int_equal(s.n_allocs, 1100);
    assert_int_equal(s.bytes_in_use, 1100 * 256);
    must_check(pool);
    for (int i = 0; i < 1100; i++)
        mmrt_pool_free(pool, &b[i]);
    s = stats_of(pool);
    assert_int_equal(s.n_allocs, 0);
    assert_int_equal(s.n_bad_frees, 0);
    assert_int_equal(s.bytes_held, 0);
    must_check(pool);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

static void test_l1_out_of_pool(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new_l1(&d, 16 * MB, 0, 256); /* slabs up to 2 MiB */

    /* A kept empty slab splits level 2, but the whole pool is still free to a request,
     * and the request gets it. */
    for (int k = 0; k < 3; k++)
        alloc_free_pair(pool, MB + 256);
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.level1_n_empty_slabs, 1);
    assert_int_equal(s.total_free_bytes, 16 * MB);
    assert_int_equal(s.largest_free_block, 16 * MB);
    assert_int_equal(s.free_blocks_per_order[15], 1); /* level 2's largest is 8 MiB */
    assert_int_equal(s.free_blocks_per_order[16], 0);
    struct mmrt_pool_block all = must_alloc(pool, 16 * MB);
    s = stats_of(pool);
    assert_int_equal(s.level1_n_flushes, 1);
    assert_int_equal(s.level1_n_slabs, 0);
    assert_int_equal(all.offset, 0);
    assert_int_equal(all.nbytes, 16 * MB);
    mmrt_pool_free(pool, &all);
    must_check(pool);

    /* Fill the pool with 600 KiB blocks (1 MiB each at level 2, three to a 2 MiB slab at
     * level 1) until it refuses: only then, with nothing left to give back. */
    struct mmrt_pool_block b[40];
    int n = 0;
    struct mmrt_error err = {MMRT_OK, ""};
    while (mmrt_pool_alloc(pool, 600 * KB, &b[n], &err) == MMRT_OK) {
        assert_true(++n < 40);
        must_check(pool);
    }
    assert_int_equal(err.status, MMRT_ERR_OUT_OF_POOL);
    assert_contains(err.msg, "pool: cannot allocate 614400 bytes (block of 1048576): largest "
                             "free block is 0 bytes");
    assert_contains(err.msg, "; level 1 holds");
    s = stats_of(pool);
    assert_true(n > 16); /* more than level 2 alone fits (16) */
    assert_int_equal(s.n_out_of_pool, 1);
    assert_int_equal(s.level1_returnable_bytes, 0);
    assert_int_equal(s.total_free_bytes, 0);
    assert_int_equal(s.bytes_held, 16 * MB);
    assert_true(s.level1_free_bytes > 0); /* slab tails: free to no one */
    must_check(pool);
    struct mmrt_pool_block out, sentinel;
    memset(&sentinel, 0x3c, sizeof sentinel);
    out = sentinel;
    assert_int_equal(mmrt_pool_alloc(pool, 100, &out, &err), MMRT_ERR_OUT_OF_POOL);
    assert_memory_equal(&out, &sentinel, sizeof out);
    for (int i = 0; i < n; i++)
        mmrt_pool_free(pool, &b[i]);
    s = stats_of(pool);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_held, 0);
    assert_int_equal(s.largest_free_block, 16 * MB);
    must_check(pool);
    all = must_alloc(pool, 16 * MB); /* everything came back */
    mmrt_pool_free(pool, &all);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

static void test_l1_bad_frees(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new_l1(&d, 64 * MB, 0, 256);
    struct mmrt_pool_block b[3];
    alloc_free_pair(pool, X21);
    for (int i = 0; i < 3; i++)
        b[i] = must_alloc(pool, X21); /* slots 0..2 of one 8 MiB slab */
    mmrt_pool_free(pool, &b[1]);      /* slot 1 free, slots 0 and 2 live */
    struct mmrt_pool_block l2 = must_alloc(pool, 5 * MB); /* a level-2 block */
    assert_int_equal(l2.nbytes, 8 * MB);
    struct mmrt_pool_stats before = stats_of(pool);
    uint64_t bad = before.n_bad_frees;

#define BAD_FREE(blk)                                                                      \
    do {                                                                                   \
        struct mmrt_pool_block bb_ = (blk);                                                \
        mmrt_pool_free(pool, &bb_);                                                        \
        bad++;                                                                             \
        struct mmrt_pool_stats s_ = stats_of(pool);                                        \
        assert_int_equal(s_.n_bad_frees, bad);                                             \
        assert_int_equal(s_.bytes_in_use, before.bytes_in_use);                            \
        assert_int_equal(s_.n_allocs, before.n_allocs);                                    \
        assert_int_equal(s_.level1_free_bytes, before.level1_free_bytes);                  \
        assert_int_equal(s_.level1_n_slabs, before.level1_n_slabs);                        \
        must_check(pool);                                                                  \
    } while (0)

    struct mmrt_pool_block x;
    BAD_FREE(b[1]);                                        /* double free of a slot */
    x = b[0]; x.arena = fake_handle(41); BAD_FREE(x);      /* foreign arena */
    x = b[0]; x.offset += 256; BAD_FREE(x);                /* inside a slot */
    x = b[0]; x.offset += X21 - 256; BAD_FREE(x);
    x = b[0]; x.offset += 3 * X21; BAD_FREE(x);            /* the slab's tail, not a slot */
    x = b[0]; x.nbytes = 4 * MB; BAD_FREE(x);              /* level 2's size for it */
    x = b[0]; x.nbytes = 8 * MB; x.requested = 8 * MB; BAD_FREE(x); /* the slab itself */
    x = b[0]; x.requested = X21 + 1; BAD_FREE(x);          /* larger than the slot */
    x = b[0]; x.requested = X21 - 256; BAD_FREE(x);        /* a smaller class */
    x = b[0]; x.requested = 0; BAD_FREE(x);
    x = l2; x.nbytes = 5 * MB; BAD_FREE(x);                /* level-2 rules still hold */
    x = l2; x.offset += 256; BAD_FREE(x);

    /* The good ones still free; then their double frees are caught too, including once
     * the slab itself has gone (its memory is a free level-2 block again). */
    mmrt_pool_free(pool, &b[0]);
    mmrt_pool_free(pool, &b[2]);
    mmrt_pool_free(pool, &l2);
    must_check(pool);
    before = stats_of(pool);
    BAD_FREE(b[0]);
    BAD_FREE(l2);
    struct mmrt_pool_block all = must_alloc(pool, 64 * MB); /* the empty slab goes back */
    assert_int_equal(stats_of(pool).level1_n_slabs, 0);
    mmrt_pool_free(pool, &all);
    before = stats_of(pool);
    BAD_FREE(b[2]);
    mmrt_pool_free(pool, NULL);
    assert_int_equal(stats_of(pool).n_bad_frees, bad + 1);
#undef BAD_FREE
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
}

/* A request stream with recurring and one-off sizes, replayed on a pool; returns the
 * (arena index, offset, nbytes) of every block and the final stats. */
struct replay_rec {
    int arena;
    uint64_t offset, nbytes;
};

static void replay(struct fake_dev *d, uint64_t seed, struct replay_rec *rec, int n_steps,
                   struct mmrt_pool_stats *end)
{
    struct mmrt_pool *pool = pool_new_l1(d, 8 * MB + MB + 256 * KB, 0, 256);
    struct mmrt_pool_block live[64];
    int n_live = 0;
    uint64_t rng = seed;
    static const uint64_t shapes[] = {X21 / 8, 300 * KB, 70000, 9000, 4096, 123 * 256, 1};
    for (int i = 0; i < n_steps; i++) {
        uint64_t r = rng_next(&rng);
        if (n_live == 64 || (n_live > 0 && r % 5 < 2)) {
            int k = (int)((r >> 8) % (uint64_t)n_live);
            mmrt_pool_free(pool, &live[k]);
            live[k] = live[--n_live];
            rec[i] = (struct replay_rec){-1, 0, 0};
            continue;
        }
        uint64_t nbytes = (r >> 16) % 4 ? shapes[(r >> 24) % 7] : 1 + (r >> 24) % (512 * KB);
        struct mmrt_pool_block b;
        if (mmrt_pool_alloc(pool, nbytes, &b, NULL) != MMRT_OK) {
            rec[i] = (struct replay_rec){-2, 0, 0};
            continue;
        }
        live[n_live++] = b;
        rec[i] = (struct replay_rec){fake_index(d, b.arena), b.offset, b.nbytes};
    }
    must_check(pool);
    mmrt_pool_stats(pool, end);
    mmrt_pool_destroy(pool);
}

static void test_l1_deterministic(void **state)
{
    (void)state;
    enum { N = 20000 };
    struct replay_rec *r1 = calloc(N, sizeof *r1), *r2 = calloc(N, sizeof *r2);
    assert_non_null(r1);
    assert_non_null(r2);
    /* Other handle values (so another handle order), other host addresses: same blocks. */
    struct fake_dev d1 = {0}, d2 = {.salt = 5};
    struct mmrt_pool_stats s1, s2;
    replay(&d1, 77, r1, N, &s1);
    replay(&d2, 77, r2, N, &s2);
    assert_true(d1.handle[0] != d2.handle[0]);
    for (int i = 0; i < N; i++)
        if (r1[i].arena != r2[i].arena || r1[i].offset != r2[i].offset ||
            r1[i].nbytes != r2[i].nbytes)
            fail_msg("step %d: arena %d offset %" PRIu64 " nbytes %" PRIu64 " against arena %d "
                     "offset %" PRIu64 " nbytes %" PRIu64, i, r1[i].arena, r1[i].offset,
                     r1[i].nbytes, r2[i].arena, r2[i].offset, r2[i].nbytes);
    assert_int_equal(s1.level1_hits, s2.level1_hits);
    assert_int_equal(s1.peak_bytes_held, s2.peak_bytes_held);
    assert_true(s1.fragmentation == s2.fragmentation);
    assert_true(s1.level1_hits > N / 10); /* the stream did exercise level 1 */
    assert_true(s1.n_out_of_pool > 0);    /* and its out-of-memory path */
    free(r1);
    free(r2);
}

/* The random test of level 1: every block is checked against a shadow of the arenas (no two
 * live blocks overlap), the accounting identities of pool.h against the pool's stats, and
 * every refusal against what both levels hold. */
static void test_l1_random(void **state)
{
    (void)state;
    const uint64_t min_block = 256;
    struct fake_dev d = {0};
    struct mmrt_pool *pool = pool_new_l1(&d, 8 * MB + MB + 256 * KB, 0, min_block);
    struct shadow sh = {.dev = &d, .min_block = min_block};
    for (int a = 0; a < d.n_arenas; a++) {
        sh.occ[a] = calloc(d.size[a] / min_block, 1);
        assert_non_null(sh.occ[a]);
    }
    sh.cap_live = 4096;
    sh.live = calloc(sh.cap_live, sizeof *sh.live);
    assert_non_null(sh.live);
    /* Sizes that recur (a few "shapes", some just above a power of two), and noise. */
    static const uint64_t shapes[] = {X21 / 4, 300 * KB, 70000, 9000, 4096, 123 * 256, 1,
                                      MB + 256, 48 * KB, 513};
    uint64_t rng = 2024, n_checks = 0, n_flush_checks = 0;
    struct mmrt_pool_block last_freed = {0};
    bool have_last = false;
    for (int step = 0; step < 120000; step++) {
        uint64_t r = rng_next(&rng);
        bool grow = (step / 3000) % 2 == 0;
        if (sh.n_live == 0 || (r % 100) < (grow ? 60u : 42u)) {
            uint64_t r2 = rng_next(&rng), nbytes;
            if (r2 % 8 < 6)
                nbytes = shapes[(r2 >> 8) % (sizeof shapes / sizeof shapes[0])];
            else if (r2 % 8 == 6)
                nbytes = 1 + (r2 >> 16) % (2 * MB);
            else
                nbytes = 1 + (r2 >> 16) % 4096;
            struct mmrt_pool_block b = {0}; /* written on MMRT_OK only (-O3 maybe-uninit) */
            struct mmrt_error err = {MMRT_OK, ""};
            mmrt_status st = mmrt_pool_alloc(pool, nbytes, &b, &err);
            if (st == MMRT_OK) {
                uint64_t exact = (nbytes + min_block - 1) / min_block * min_block;
                assert_true(b.nbytes == exact || b.nbytes == next_block(nbytes, min_block));
                assert_int_equal(b.requested, nbytes);
                int a = fake_index(&d, b.arena);
                assert_true(a >= 0);
                assert_int_equal(b.offset % min_block, 0);
                assert_true(b.offset + b.nbytes <= d.size[a]);
                shadow_mark(&sh, &b, 1);
                if (sh.n_live == sh.cap_live) {
                    sh.cap_live *= 2;
                    sh.live = realloc(sh.live, sh.cap_live * sizeof *sh.live);
                    assert_non_null(sh.live);
                }
                sh.live[sh.n_live++] = b;
                sh.in_use += b.nbytes;
                sh.requested += nbytes;
                if (sh.in_use > sh.peak)
                    sh.peak = sh.in_use;
                sh.n_total++;
            } else {
                assert_int_equal(st, MMRT_ERR_OUT_OF_POOL);
                /* Refused only once level 1 gave back all it could, and only when no
                 * level-2 block of the needed size is left. */
                struct mmrt_pool_stats s = stats_of(pool);
                assert_int_equal(s.level1_returnable_bytes, 0);
                assert_int_equal(s.level1_n_empty_slabs, 0);
                assert_true(s.largest_free_block < next_block(nbytes, min_block));
                sh.n_oop++;
            }
        } else {
            uint64_t r2 = rng_next(&rng);
            if (r2 % 64 < 2 && have_last) {
                struct mmrt_pool_block x = last_freed;
                if (r2 % 64 == 1)
                    x.offset += min_block; /* not the start of any live block */
                if (!shadow_bad_free(&sh, pool, &x))
                    continue;
            } else {
                last_freed = shadow_free_live(&sh, pool, (size_t)((r2 >> 8) % sh.n_live));
                have_last = true;
            }
        }
        struct mmrt_pool_stats s = stats_of(pool);
        assert_int_equal(s.bytes_in_use, sh.in_use);
        assert_int_equal(s.bytes_requested_in_use, sh.requested);
        assert_int_equal(s.peak_bytes_in_use, sh.peak);
        assert_int_equal(s.n_allocs, sh.n_live);
        assert_int_equal(s.n_allocs_total, sh.n_total);
        assert_int_equal(s.n_out_of_pool, sh.n_oop);
        assert_int_equal(s.n_bad_frees, sh.n_bad);
        assert_int_equal(s.level1_hits + s.level1_misses, sh.n_total);
        uint64_t l2_free = 0;
        for (unsigned k = 0; k < MMRT_POOL_MAX_ORDERS; k++)
            l2_free += s.free_blocks_per_order[k] * (min_block << k);
        assert_int_equal(s.capacity_bytes, s.bytes_in_use + s.level1_free_bytes + l2_free);
        assert_int_equal(s.total_free_bytes, l2_free + s.level1_returnable_bytes);
        assert_int_equal(s.bytes_held, s.capacity_bytes - s.total_free_bytes);
        assert_true(s.bytes_held >= s.bytes_in_use);
        assert_true(s.peak_bytes_held >= s.bytes_held);
        assert_true(s.largest_free_block <= s.total_free_bytes);
        if (step % 500 == 499) {
            must_check(pool);
            n_checks++;
        }
        if (step % 1500 == 1499 && s.level1_returnable_bytes > 0) {
            /* The largest block reported must be what a flush really leaves (white box). */
            assert_true(l1_flush(pool));
            struct mmrt_pool_stats f = stats_of(pool);
            assert_int_equal(f.largest_free_block, s.largest_free_block);
            assert_int_equal(largest_free(pool), s.largest_free_block);
            assert_int_equal(f.total_free_bytes, s.total_free_bytes);
            assert_int_equal(f.bytes_held, s.bytes_held);
            must_check(pool);
            n_flush_checks++;
        }
    }
    while (sh.n_live > 0) {
        size_t i = (size_t)(rng_next(&rng) % sh.n_live);
        mmrt_pool_free(pool, &sh.live[i]);
        shadow_mark(&sh, &sh.live[i], 0);
        sh.live[i] = sh.live[--sh.n_live];
    }
    struct mmrt_pool_stats s = stats_of(pool);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_held, 0);
    assert_int_equal(s.n_bad_frees, sh.n_bad);
    print_message("random: %" PRIu64 " allocations, %" PRIu64 " level-1 hits\n", sh.n_total,
                  s.level1_hits);
    assert_true(s.level1_hits > sh.n_total / 10);
    assert_true(sh.n_oop > 0);
    assert_true(sh.n_bad > 0);
    assert_true(n_flush_checks > 10);
    assert_true(n_checks > 200);
    must_check(pool);
    /* Everything is free to any request: a flush leaves every arena whole. */
    l1_flush(pool);
    s = stats_of(pool);
    for (int a = 0; a < d.n_arenas; a++)
        assert_true(s.free_blocks_per_order[__builtin_ctzll(d.size[a] / min_block)] > 0);
    assert_true(s.fragmentation == 1.0 - (double)(8 * MB) / (double)s.capacity_bytes);
    mmrt_pool_destroy(pool);
    assert_int_equal(d.n_live, 0);
    for (int a = 0; a < d.n_arenas; a++)
        free(sh.occ[a]);
    free(sh.live);
}

/* ---- a synthetic mixed workload ------------------------------------------------------ */

/* A request stream in the manner of a vision-language model: four image sizes, varied
 * prompt lengths and decode lengths. Each request runs a vision tower, a projector, a
 * prefill and a decode loop, allocating and freeing activations of sizes derived from its
 * image and prompt; its KV pages (64 KiB) live until the next request has finished, the
 * way two interleaved sequences keep theirs. Everything is f32. */
#define WL_LIVE 8192

struct wl {
    struct mmrt_pool *pool;
    bool failed;                      /* a request was refused: the run stops there */
    bool track;                       /* follow peak_requested and fragmentation */
    struct mmrt_pool_block live[WL_LIVE];
    bool used[WL_LIVE];
    int kv[2][2048], n_kv[2];         /* KV pages of the previous and the current request */
    uint64_t peak_requested;
    double frag_sum, frag_max;
    int n_samples;
};

static int wl_alloc(struct wl *w, uint64_t nbytes)
{
    if (w->failed)
        return -1;
    int i = 0;
    while (w->used[i])
        i++;
    assert_true(i < WL_LIVE - 1);
    if (mmrt_pool_alloc(w->pool, nbytes, &w->live[i], NULL) != MMRT_OK) {
        w->failed = true;
        return -1;
    }
    w->used[i] = true;
    if (w->track) {
        struct mmrt_pool_stats s = stats_of(w->pool);
        if (s.bytes_requested_in_use > w->peak_requested)
            w->peak_requested = s.bytes_requested_in_use;
    }
    return i;
}

static void wl_free(struct wl *w, int i)
{
    if (i < 0)
        return;
    mmrt_pool_free(w->pool, &w->live[i]);
    w->used[i] = false;
}

static void wl_sample(struct wl *w)
{
    if (!w->track)
        return;
    struct mmrt_pool_stats s = stats_of(w->pool);
    w->frag_sum += s.fragmentation;
    if (s.fragmentation > w->frag_max)
        w->frag_max = s.fragmentation;
    w->n_samples++;
}

/* One transformer layer over n tokens: width d, feed-forward width ff, `gated` for SwiGLU,
 * attention scores of `heads` rows of `ctx` (one head's n × ctx block at a time). */
static void wl_layer(struct wl *w, uint64_t n, uint64_t d, uint64_t ff, bool gated,
                     uint64_t score_bytes)
{
    int ln = wl_alloc(w, n * d * 4), qkv = wl_alloc(w, n * 3 * d * 4);
    wl_free(w, ln);
    int sc = wl_alloc(w, score_bytes), att = wl_alloc(w, n * d * 4);
    wl_free(w, sc);
    wl_free(w, qkv);
    int o = wl_alloc(w, n * d * 4);
    wl_free(w, att);
    wl_free(w, o);
    int ln2 = wl_alloc(w, n * d * 4), up = wl_alloc(w, n * ff * 4);
    int gate = gated ? wl_alloc(w, n * ff * 4) : -1;
    wl_free(w, ln2);
    int act = wl_alloc(w, n * ff * 4);
    wl_free(w, up);
    wl_free(w, gate);
    int down = wl_alloc(w, n * d * 4);
    wl_free(w, act);
    wl_free(w, down);
}

static void wl_kv_page(struct wl *w, int cur, int n_layers)
{
    for (int l = 0; l < n_layers; l++) {
        int p = wl_alloc(w, 64 * KB);
        if (p >= 0)
            w->kv[cur][w->n_kv[cur]++] = p;
    }
}

static void wl_request(struct wl *w, int r, uint64_t n_img, uint64_t prompt, int n_decode)
{
    enum { DV = 1024, FFV = 4096, DT = 2048, FFT = 5632, LAYERS = 4, VOCAB = 32000 };
    int cur = r % 2;
    /* vision tower, then the projector into the language model's width */
    int h = wl_alloc(w, n_img * DV * 4);
    for (int l = 0; l < LAYERS; l++)
        wl_layer(w, n_img, DV, FFV, false, n_img * n_img * 4);
    int emb = wl_alloc(w, n_img * DT * 4);
    wl_free(w, h);
    /* prefill */
    uint64_t t = n_img + prompt;
    int x = wl_alloc(w, t * DT * 4);
    wl_free(w, emb);
    for (uint64_t p = 0; p < (t + 15) / 16; p++)
        wl_kv_page(w, cur, LAYERS);
    for (int l = 0; l < LAYERS; l++)
        wl_layer(w, t, DT, FFT, true, t * t * 4);
    wl_sample(w);
    int logits = wl_alloc(w, VOCAB * 4);
    wl_free(w, logits);
    wl_free(w, x);
    /* decode: one token a step over a growing context */
    for (int s = 0; s < n_decode; s++) {
        uint64_t ctx = t + (uint64_t)s + 1;
        if (ctx % 16 == 1)
            wl_kv_page(w, cur, LAYERS);
        x = wl_alloc(w, DT * 4);
        for (int l = 0; l < LAYERS; l++)
            wl_layer(w, 1, DT, FFT, true, 16 * ctx * 4);
        logits = wl_alloc(w, VOCAB * 4);
        wl_free(w, logits);
        wl_free(w, x);
    }
    /* the previous request's KV goes now: two requests' pages overlap */
    for (int i = 0; i < w->n_kv[1 - cur]; i++)
        wl_free(w, w->kv[1 - cur][i]);
    w->n_kv[1 - cur] = 0;
    wl_sample(w);
}

/* Runs the stream `passes` times on a fresh pool; returns whether every request was
 * served, with the final stats in *end, whose peaks are those of the last pass. */
static bool wl_run(struct fake_dev *d, uint64_t capacity, enum mmrt_pool_level1 level1,
                   int passes, bool track, struct wl *w, struct mmrt_pool_stats *end)
{
    static const uint64_t images[4] = {196, 324, 576, 729}; /* 14², 18², 24², 27² patches */
    static const uint64_t prompts[6] = {9, 23, 40, 64, 87, 120};
    static const int decodes[3] = {6, 10, 16};
    memset(w, 0, sizeof *w);
    w->track = track;
    *d = (struct fake_dev){0};
    w->pool = pool_make(d, capacity, 0, 256, level1);
    for (int pass = 0; pass < passes; pass++) {
        uint64_t rng = 99;
        mmrt_pool_reset_peak(w->pool);
        w->peak_requested = 0;
        w->frag_sum = w->frag_max = 0;
        w->n_samples = 0;
        for (int r = 0; r < 40 && !w->failed; r++) {
            uint64_t v = rng_next(&rng);
            wl_request(w, pass * 40 + r, images[v % 4], prompts[(v >> 8) % 6],
                       decodes[(v >> 16) % 3]);
            if (r % 8 == 7)
                must_check(w->pool);
        }
    }
    for (int i = 0; i < WL_LIVE; i++)
        if (w->used[i])
            wl_free(w, i);
    must_check(w->pool);
    mmrt_pool_stats(w->pool, end);
    assert_int_equal(end->n_allocs, 0);
    assert_int_equal(end->n_bad_frees, 0);
    mmrt_pool_destroy(w->pool);
    assert_int_equal(d->n_live, 0);
    return !w->failed;
}

/* The smallest capacity, in MiB steps from lo_mb, on which the whole stream runs. */
static uint64_t wl_min_capacity(enum mmrt_pool_level1 level1, uint64_t lo_mb, struct wl *w)
{
    struct fake_dev d;
    struct mmrt_pool_stats s;
    for (uint64_t mb = lo_mb;; mb++) {
        assert_true(mb < lo_mb + 512);
        if (wl_run(&d, mb * MB, level1, 1, false, w, &s))
            return mb;
    }
}

static void test_mixed_workload(void **state)
{
    (void)state;
    struct wl *w = calloc(1, sizeof *w);
    assert_non_null(w);
    struct fake_dev d;
    const uint64_t big = 1024 * MB; /* room for everything: measure, do not constrain */
    struct {
        struct mmrt_pool_stats first, steady;
        double frag_mean, frag_max;
        uint64_t capacity_mb;
    } m[2];
    uint64_t requested = 0;
    for (int on = 0; on < 2; on++) {
        enum mmrt_pool_level1 l1 = on ? MMRT_POOL_LEVEL1_ON : MMRT_POOL_LEVEL1_OFF;
        assert_true(wl_run(&d, big, l1, 1, true, w, &m[on].first));
        if (on)
            assert_int_equal(w->peak_requested, requested); /* the same stream */
        requested = w->peak_requested;
        /* The stream again on the same pool: what a serving process settles to. */
        assert_true(wl_run(&d, big, l1, 2, false, w, &m[on].steady));
    }
    assert_int_equal(m[1].first.n_allocs_total, m[0].first.n_allocs_total);
    for (int on = 0; on < 2; on++)
        m[on].capacity_mb = wl_min_capacity(on ? MMRT_POOL_LEVEL1_ON : MMRT_POOL_LEVEL1_OFF,
                                            requested / MB, w);
    /* Fragmentation where it matters: in the smallest pool both can run in (in a far
     * larger one it only reflects the buddy splitting that pool for small blocks). */
    uint64_t tight = m[0].capacity_mb > m[1].capacity_mb ? m[0].capacity_mb : m[1].capacity_mb;
    for (int on = 0; on < 2; on++) {
        struct mmrt_pool_stats s;
        assert_true(wl_run(&d, tight * MB, on ? MMRT_POOL_LEVEL1_ON : MMRT_POOL_LEVEL1_OFF, 1,
                           true, w, &s));
        m[on].frag_mean = w->frag_sum / w->n_samples;
        m[on].frag_max = w->frag_max;
    }
    print_message("mixed workload: %" PRIu64 " allocations a pass, peak %.1f MiB requested\n",
                  m[0].first.n_allocs_total, (double)requested / MB);
    for (int on = 0; on < 2; on++)
        print_message("  level 1 %-3s: peak held %.1f MiB (second pass %.1f), peak in use %.1f "
                      "MiB, fragmentation in %" PRIu64 " MiB mean %.3f max %.3f, smallest pool %"
                      PRIu64 " MiB; "
                      "%" PRIu64 " hits, %" PRIu64 " misses\n", on ? "on" : "off",
                      (double)m[on].first.peak_bytes_held / MB,
                      (double)m[on].steady.peak_bytes_held / MB,
                      (double)m[on].first.peak_bytes_in_use / MB, tight, m[on].frag_mean,
                      m[on].frag_max, m[on].capacity_mb, m[on].first.level1_hits,
                      m[on].first.level1_misses);
    /* Must hold: a slot is never larger than the block level 2 would give (so neither is
     * what the stream holds in live blocks), and level 1 gives back everything that is
     * free before level 2 allocates. Measured, and kept by this design: the stream needs
     * no more capacity with level 1, and at steady state holds less. */
    assert_true(m[1].first.peak_bytes_in_use < m[0].first.peak_bytes_in_use);
    assert_true(m[1].capacity_mb <= m[0].capacity_mb);
    assert_true(m[1].first.peak_bytes_held <= m[0].first.peak_bytes_held);
    assert_true(m[1].steady.peak_bytes_held < m[0].steady.peak_bytes_held);
    assert_true(m[1].first.level1_hits > 0);
    free(w);
}

/* ---- white box: mmrt_pool_check must notice broken metadata -------------------------- */

static void expect_corrupt(struct mmrt_pool *pool, const char *what1, const char *what2)
{
    struct mmrt_error err = {MMRT_OK, ""};
    assert_int_equal(mmrt_pool_check(pool, &err), MMRT_ERR_INTERNAL);
    assert_int_equal(err.status, MMRT_ERR_INTERNAL);
    assert_contains(err.msg, "pool check: ");
    assert_contains(err.msg, what1);
    assert_contains(err.msg, what2);
    mmrt_pool_destroy(pool);
}

static void test_check_detects_corruption(void **state)
{
    (void)state;
    struct fake_dev d = {0};
    /* One arena of 16 units of 256 bytes; blocks 1024@0 and 256@1024 live. */
#define SETUP()                                                                            \
    struct mmrt_pool *pool = pool_new(&d, 4096, 0, 256);                                   \
    struct arena *ar = &pool->arenas[0];                                                   \
    struct mmrt_pool_block b0 = must_alloc(pool, 1024), b1 = must_alloc(pool, 200);        \
    assert_int_equal(b0.offset, 0);                                                        \
    assert_int_equal(b1.offset, 1024);                                                     \
    must_check(pool);                                                                      \
    (void)ar

    { /* a free block missing from its list (free 256@1280, order 0) */
        SETUP();
        assert_int_equal(ar->state[5], ST_HEAD | ST_FREE | 0);
        arena_bits(pool, ar, 0)[0] &= ~(UINT64_C(1) << 5);
        expect_corrupt(pool, "arena 0 offset 1280 order 0", "not on the free list");
    }
    { /* a list entry that is not a free block: unit 2 is inside b0 */
        SETUP();
        hb_set(arena_bits(pool, ar, 0), 16, 2);
        expect_corrupt(pool, "arena 0 offset 512 order 0", "not a free block of that order");
    }
    { /* two free buddies left un-coalesced */
        SETUP();
        mmrt_pool_free(pool, &b0);
        mmrt_pool_free(pool, &b1);
        must_check(pool);
        free_list_remove(pool, 0, 4, 0);
        free_list_add(pool, 0, 3, 0);
        free_list_add(pool, 0, 3, 8);
        expect_corrupt(pool, "arena 0 offset 0 order 3", "not coalesced");
    }
    { /* overlap: a head inside b0 */
        SETUP();
        ar->state[1] = ST_HEAD | 0;
        expect_corrupt(pool, "arena 0 offset 0 order 2", "offset 256 inside the block");
    }
    { /* gap: b1's head erased */
        SETUP();
        ar->state[4] = 0;
        expect_corrupt(pool, "arena 0 offset 1024", "no block starts here");
    }
    { /* misaligned: b1 (unit 4) claims order 3 */
        SETUP();
        ar->state[4] = ST_HEAD | 3;
        expect_corrupt(pool, "arena 0 offset 1024 order 3", "misaligned");
    }
    { /* summary bitset disagrees with the arena's list */
        SETUP();
        avail_bits(pool, 0)[0] = 0;
        expect_corrupt(pool, "arena 0 offset 0 order 0", "pool summary");
    }
    { /* per-order free count disagrees with the lists */
        SETUP();
        pool->n_free[1]++;
        expect_corrupt(pool, "order 1: 2 free blocks counted, 1 found", "");
    }
    { /* a summary level of a multi-level bitset disagrees with the level below */
        struct mmrt_pool *pool = pool_new(&d, 64 * KB, 0, 256); /* 256 units: 4 + 1 words */
        must_check(pool);
        uint64_t *bits0 = arena_bits(pool, &pool->arenas[0], 0);
        bits0[4] |= UINT64_C(1) << 3; /* says word 3 of level 0 is non-empty; it is empty */
        expect_corrupt(pool, "arena 0 offset 0 order 0", "bitset level 1 is inconsistent");
    }
    { /* byte counters disagree with the walk */
        SETUP();
        pool->bytes_in_use += 256;
        expect_corrupt(pool, "1536 bytes in 2 blocks counted in use", "1280 bytes in 2 blocks");
    }
    { /* the bad free of a corrupted pool still does not crash, and check still reports */
        SETUP();
        ar->state[4] = 0;
        mmrt_pool_free(pool, &b1);
        assert_int_equal(stats_of(pool).n_bad_frees, 1);
        expect_corrupt(pool, "arena 0 offset 1024", "no block starts here");
    }
#undef SETUP

    /* Level 1: a class of 768-byte slots (600-byte requests) with one slab grown to 2 KiB
     * holding two live slots, at offset 0. */
#define SETUP1()                                                                           \
    struct mmrt_pool *pool = pool_new_l1(&d, MB, 0, 256);                                  \
    alloc_free_pair(pool, 600);                                                            \
    struct mmrt_pool_block s0 = must_alloc(pool, 600), s1 = must_alloc(pool, 600);         \
    assert_int_equal(s0.offset, 0);                                                        \
    assert_int_equal(s1.offset, 768);                                                      \
    struct l1 *l1 = pool->l1;                                                              \
    uint32_t r = slab_find(pool, 0, 0);                                                    \
    assert_true(r != NONE);                                                                \
    struct l1_slab *sl = &l1->slabs[r];                                                    \
    assert_int_equal(sl->order, 3);                                                        \
    must_check(pool)

    { /* the slab's level-2 block freed under it */
        SETUP1();
        l2_free(pool, 0, 0, 3);
        expect_corrupt(pool, "slab at arena 0 offset 0 order 3", "not a live level-2 block");
    }
    { /* a slot marked used beyond the slab's slots */
        SETUP1();
        sl->used |= UINT64_C(1) << 5;
        expect_corrupt(pool, "slab at arena 0 offset 0 order 3", "marks slots beyond its 2");
    }
    { /* the used count disagrees with the bitmap */
        SETUP1();
        sl->used &= ~UINT64_C(2);
        expect_corrupt(pool, "slab at arena 0 offset 0 order 3", "a slot both free and used");
    }
    { /* the slab count of its class is wrong */
        SETUP1();
        l1->cls[sl->cls].n_live++;
        expect_corrupt(pool, "class of 768 bytes", "3 live counted");
    }
    { /* the slab missing from the index (so free would treat its slots as level 2) */
        SETUP1();
        slab_ix_remove(pool, slab_pos(pool, 0, 0));
        expect_corrupt(pool, "slab at arena 0 offset 0 order 3", "not found at its place");
    }
    { /* a slab with memory to give back that is not on the slack list */
        SETUP1();
        mmrt_pool_free(pool, &s1);
        must_check(pool);
        slack_unlink(l1, r);
        expect_corrupt(pool, "slab at arena 0 offset 0 order 3", "not on the slack list");
    }
    { /* the slot count does not match the order */
        SETUP1();
        sl->n_slots = 1;
        expect_corrupt(pool, "slab at arena 0 offset 0 order 3", "1 slots, but 768-byte slots");
    }
    { /* level-1 byte counters */
        SETUP1();
        l1->used_bytes += 768;
        expect_corrupt(pool, "level 1: 2048 bytes of slabs, 2304 in live slots counted", "");
    }
    { /* hits and misses must add up to the allocations */
        SETUP1();
        l1->hits++;
        expect_corrupt(pool, "level 1: 1 hits and 3 misses for 3 allocations", "");
    }
    { /* the caller-level totals are checked across both levels */
        SETUP1();
        pool->bytes_in_use -= 768;
        expect_corrupt(pool, "768 bytes in 2 blocks counted in use, 1536 bytes in 2 blocks", "");
    }
#undef SETUP1
    assert_int_equal(d.n_live, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_validation),
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_alignment_every_order),
        cmocka_unit_test(test_non_power_of_two_capacity),
        cmocka_unit_test(test_max_arena),
        cmocka_unit_test(test_best_fit),
        cmocka_unit_test(test_out_of_pool),
        cmocka_unit_test(test_bad_frees),
        cmocka_unit_test(test_fragmentation),
        cmocka_unit_test(test_random_single_arena),
        cmocka_unit_test(test_random_mixed_arenas),
        cmocka_unit_test(test_random_max_arena),
        cmocka_unit_test(test_alloc_failure_sweep),
        cmocka_unit_test(test_arena_failure),
        cmocka_unit_test(test_check_detects_corruption),
        cmocka_unit_test(test_l1_reuse),
        cmocka_unit_test(test_l1_exact_slots),
        cmocka_unit_test(test_l1_slabs_returned),
        cmocka_unit_test(test_l1_out_of_pool),
        cmocka_unit_test(test_l1_bad_frees),
        cmocka_unit_test(test_l1_deterministic),
        cmocka_unit_test(test_l1_random),
        cmocka_unit_test(test_mixed_workload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
