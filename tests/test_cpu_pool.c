/*
 * tests/test_cpu_pool.c — the CPU plugin's worker pool (plugins/cpu/cpu_threads.c), built into
 * the test directly: every item of a parallel loop runs exactly once, in chunks that tile the
 * range, no chunk smaller than the loop's minimum except the one that ends it, and the guided
 * claims shrink so a loop ends on a small chunk (what keeps a fast core from waiting on a slow
 * one at the join).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cpu_internal.h"

#define MAX_CHUNKS 8192

struct record {
    pthread_mutex_t mu;
    int64_t n_items;
    _Atomic int *hits; /* [n_items] */
    int64_t begin[MAX_CHUNKS], end[MAX_CHUNKS];
    int n_chunks;
    bool tid_bad;
    int n_threads;
};

static void record_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    struct record *r = vctx;
    for (int64_t i = begin; i < end; i++)
        atomic_fetch_add(&r->hits[i], 1);
    pthread_mutex_lock(&r->mu);
    if (tid < 0 || tid >= r->n_threads)
        r->tid_bad = true;
    if (r->n_chunks < MAX_CHUNKS) {
        r->begin[r->n_chunks] = begin;
        r->end[r->n_chunks] = end;
    }
    r->n_chunks++;
    pthread_mutex_unlock(&r->mu);
}

static int cmp_begin(const void *a, const void *b)
{
    const int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* Runs one loop and checks it: items once each, chunks tiling [0, n), each at least min_chunk
 * items unless it is the last. Returns the size of the chunk that ends the range. */
static int64_t run_loop(struct cpu_pool *pool, struct record *r, int64_t n, double cost,
                        int64_t min_chunk, int *n_chunks)
{
    r->n_items = n;
    r->n_chunks = 0;
    r->tid_bad = false;
    r->hits = calloc((size_t)n + 1, sizeof *r->hits);
    assert_non_null(r->hits);
    cpu_parallel_for(pool, n, cost, record_task, r);
    for (int64_t i = 0; i < n; i++)
        if (r->hits[i] != 1)
            fail_msg("n %lld cost %g threads %d: item %lld ran %d times", (long long)n, cost,
                     r->n_threads, (long long)i, (int)r->hits[i]);
    free((void *)r->hits);
    assert_false(r->tid_bad);
    assert_true(r->n_chunks <= MAX_CHUNKS);
    int64_t pairs[MAX_CHUNKS][2];
    for (int c = 0; c < r->n_chunks; c++) {
        pairs[c][0] = r->begin[c];
        pairs[c][1] = r->end[c];
    }
    qsort(pairs, (size_t)r->n_chunks, sizeof pairs[0], cmp_begin);
    int64_t at = 0;
    for (int c = 0; c < r->n_chunks; c++) {
        assert_int_equal(pairs[c][0], at);
        assert_true(pairs[c][1] > pairs[c][0]);
        if (pairs[c][1] != n && pairs[c][1] - pairs[c][0] < min_chunk)
            fail_msg("n %lld: chunk [%lld, %lld) is below the minimum %lld", (long long)n,
                     (long long)pairs[c][0], (long long)pairs[c][1], (long long)min_chunk);
        at = pairs[c][1];
    }
    assert_int_equal(at, n);
    *n_chunks = r->n_chunks;
    return r->n_chunks ? pairs[r->n_chunks - 1][1] - pairs[r->n_chunks - 1][0] : 0;
}

static void test_items_once(void **state)
{
    (void)state;
    static struct record r;
    pthread_mutex_init(&r.mu, NULL);
    const int threads[] = { 1, 2, 3, 5 };
    const int64_t sizes[] = { 1, 2, 3, 7, 8, 9, 64, 100, 1000, 4097 };
    /* cost 0: minimum chunk 1; 100 multiply-adds an item: chunks of at least 164 items */
    const double costs[] = { 0, 100, 1e6 };
    const int64_t mins[] = { 1, 164, 1 };
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        struct cpu_pool pool;
        char err[128];
        assert_int_equal(cpu_pool_init(&pool, threads[t], err, sizeof err), MMRT_OK);
        r.n_threads = threads[t];
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t c = 0; c < sizeof costs / sizeof costs[0]; c++)
                for (int rep = 0; rep < 3; rep++) {
                    int n_chunks;
                    run_loop(&pool, &r, sizes[s], costs[c], mins[c], &n_chunks);
                    /* a loop of at most one minimum chunk runs on the caller in one go */
                    if (threads[t] == 1 || sizes[s] <= mins[c])
                        assert_int_equal(n_chunks, 1);
                }
        cpu_pool_deinit(&pool);
    }
    pthread_mutex_destroy(&r.mu);
}

static void test_chunks_shrink(void **state)
{
    (void)state;
    static struct record r;
    pthread_mutex_init(&r.mu, NULL);
    struct cpu_pool pool;
    char err[128];
    assert_int_equal(cpu_pool_init(&pool, 2, err, sizeof err), MMRT_OK);
    r.n_threads = 2;
    int n_chunks;
    /* 4096 items: the claims take a quarter of what is left (two threads) until fewer than
     * four remain, so the range ends on a single item, after a few dozen claims rather than
     * thousands (a claim is one contended atomic). */
    const int64_t last = run_loop(&pool, &r, 4096, 1e6, 1, &n_chunks);
    assert_int_equal(last, 1);
    assert_true(n_chunks >= 8 && n_chunks <= 40);
    /* no chunk takes more than a quarter of the loop */
    for (int c = 0; c < r.n_chunks; c++)
        assert_true(r.end[c] - r.begin[c] <= 1024);
    cpu_pool_deinit(&pool);
    pthread_mutex_destroy(&r.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_once),
        cmocka_unit_test(test_chunks_shrink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
