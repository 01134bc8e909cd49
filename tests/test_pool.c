/*
 * tests/test_pool.c — the buddy pool (core/pool.c).
 *
 * Arenas come from a fake arena_ops whose handles are unmapped addresses, so any
 * dereference by the pool would crash the test. The random test replays long alloc/free
 * sequences against a shadow model (per-unit occupancy of every arena) and compares every
 * statistic after every step. The allocation-failure sweep fails the n-th host allocation
 * (malloc/calloc/realloc are --wrap'ed, see tests/CMakeLists.txt) for n = 1, 2, … until a
 * run completes without an injected failure.
 *
 * White box: pool.c is compiled into this test (instead of being taken from the static
 * library; the archive member is then never pulled in, since every symbol is defined here)
 * so that test_check_detects_corruption can break the private metadata on purpose and prove
 * that mmrt_pool_check notices. Everything else uses only the public API of pool.h.
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
    int n_arenas;  /* records below */
    void *handle[FAKE_MAX];
    uint64_t size[FAKE_MAX];
    bool live[FAKE_MAX];
    int n_live;
    int n_bad_free;
};

/* Distinct, unmapped, in no particular order (so sorting by handle is exercised). */
static void *fake_handle(int i)
{
    return (void *)(uintptr_t)(UINT64_C(0x7ead00000000) + (uint64_t)((i * 37) % FAKE_MAX) * 0x10000);
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
    d->handle[i] = (d->n_calls == d->dup_at && i > 0) ? d->handle[i - 1] : fake_handle(i);
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

static struct mmrt_pool *pool_new(struct fake_dev *d, uint64_t capacity, uint64_t max_arena,
                                  uint64_t min_block)
{
    struct mmrt_pool_config cfg = {capacity, max_arena, min_block};
    struct mmrt_pool_arena_ops ops = fake_ops(d);
    struct mmrt_pool *pool = NULL;
    struct mmrt_error err = {MMRT_OK, ""};
    mmrt_status st = mmrt_pool_create(&cfg, &ops, &pool, &err);
    if (st != MMRT_OK)
        fail_msg("create: %s: %s", mmrt_status_name(st), err.msg);
    assert_non_null(pool);
    return pool;
}

static struct mmrt_pool_block must_alloc(struct mmrt_pool *pool, uint64_t nbytes)
{
    struct mmrt_pool_block b;
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
    struct mmrt_pool_config cfg = {MB, 0, 0};

    assert_int_equal(mmrt_pool_create(NULL, &ops, &pool, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_pool_create(&cfg, NULL, &pool, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_pool_create(&cfg, &ops, NULL, &err), MMRT_ERR_INVALID_ARG);
    struct mmrt_pool_arena_ops no_free = {&d, fake_alloc, NULL};
    assert_int_equal(mmrt_pool_create(&cfg, &no_free, &pool, &err), MMRT_ERR_INVALID_ARG);
    assert_contains(err.msg, "callback");

    cfg = (struct mmrt_pool_config){MB, 0, 100};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "min_block_bytes 100 is not a power of two");
    cfg = (struct mmrt_pool_config){MB, 0, 32};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "min_block_bytes 32");
    cfg = (struct mmrt_pool_config){255, 0, 0};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "capacity_bytes 255 is smaller than min_block_bytes 256");
    cfg = (struct mmrt_pool_config){MB, 128, 0};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_CONFIG);
    assert_contains(err.msg, "max_arena_bytes 128");
    cfg = (struct mmrt_pool_config){UINT64_C(1) << 40, 64, 64};
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_LIMIT);
    assert_contains(err.msg, "17179869184 arenas");
    cfg = (struct mmrt_pool_config){MMRT_POOL_MAX_ARENAS * 64 + 64, 64, 64}; /* one too many */
    assert_int_equal(mmrt_pool_create(&cfg, &ops, &pool, &err), MMRT_ERR_LIMIT);

    assert_ptr_equal(pool, sentinel);
    assert_int_equal(d.n_calls, 0);

    /* Exactly the limit is fine (and every arena is a single min block). */
    cfg = (struct mmrt_pool_config){64 * FAKE_MAX, 64, 64};
    pool = pool_new(&d, cfg.capacity_bytes, cfg.max_arena_bytes, cfg.min_block_bytes);
    assert_int_equal(stats_of(pool).n_arenas, FAKE_MAX);
    assert_int_equal(stats_of(pool).n_orders, 1);
    must_check(pool);
    mmrt_pool_destroy(pool);
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
                /* A block with the same place and size that is live again cannot be told
                 * apart (pool.h says so): that would be a real free, so skip the step. */
                bool is_live = false;
                for (size_t i = 0; i < sh.n_live; i++)
                    if (sh.live[i].arena == x.arena && sh.live[i].offset == x.offset &&
                        sh.live[i].nbytes == x.nbytes)
                        is_live = true;
                if (is_live)
                    continue;
                mmrt_pool_free(pool, &x);
                sh.n_bad++;
            } else {
                size_t i = (size_t)((r2 >> 8) % sh.n_live);
                struct mmrt_pool_block b = sh.live[i];
                mmrt_pool_free(pool, &b);
                shadow_mark(&sh, &b, 0);
                sh.live[i] = sh.live[--sh.n_live];
                sh.in_use -= b.nbytes;
                sh.requested -= b.requested;
                last_freed = b;
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

/* One full life of a pool; returns the first failure (after cleaning up) or MMRT_OK. */
static mmrt_status sweep_scenario(struct fake_dev *d, struct mmrt_error *err)
{
    struct mmrt_pool_config cfg = {2 * 512 * KB + 64 * KB + 4 * KB + 10, 512 * KB, 4096};
    struct mmrt_pool_arena_ops ops = fake_ops(d);
    struct mmrt_pool *sentinel = (struct mmrt_pool *)(uintptr_t)0x4321, *pool = sentinel;
    mmrt_status st = mmrt_pool_create(&cfg, &ops, &pool, err);
    if (st != MMRT_OK) {
        assert_ptr_equal(pool, sentinel);
        return st;
    }
    struct mmrt_pool_block b[8] = { { 0 } };
    int n = 0;
    uint64_t sizes[] = {4096, 100000, 512 * KB, 1, 64 * KB, 9000, 300 * KB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        st = mmrt_pool_alloc(pool, sizes[i], &b[n], err);
        if (st != MMRT_OK)
            goto done;
        n++;
        if (i % 3 == 2)
            mmrt_pool_free(pool, &b[--n]);
    }
    struct mmrt_pool_block bogus = b[0];
    bogus.offset += 4096;
    mmrt_pool_free(pool, &bogus);
    struct mmrt_pool_stats s;
    mmrt_pool_stats(pool, &s);
    st = mmrt_pool_check(pool, err);
    if (st != MMRT_OK)
        goto done;
    while (n > 0)
        mmrt_pool_free(pool, &b[--n]);
    st = mmrt_pool_check(pool, err);
done:
    mmrt_pool_destroy(pool);
    return st;
}

static void test_alloc_failure_sweep(void **state)
{
    (void)state;
    int n_failed_runs = 0;
    for (uint64_t n = 1;; n++) {
        assert_true(n < 1000);
        struct fake_dev d = {0};
        struct mmrt_error err = {MMRT_OK, ""};
        heap_arm(n);
        mmrt_status st = sweep_scenario(&d, &err);
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
    /* pool, arena records, handle index, summary, and one metadata block per arena (4). */
    assert_int_equal(n_failed_runs, 8);
}

static void test_arena_failure(void **state)
{
    (void)state;
    struct mmrt_pool_config cfg = {2 * 512 * KB + 64 * KB + 4 * KB, 512 * KB, 4096};
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
