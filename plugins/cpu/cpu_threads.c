/*
 * plugins/cpu/cpu_threads.c — the per-device worker pool (see struct cpu_pool).
 *
 * Fork/join with persistent threads: a parallel loop writes (fn, ctx, n_items, min_chunk),
 * resets the counters and bumps the atomic `generation` (release); every thread, the caller
 * included, claims chunks from the atomic `next` counter until the items run out (guided:
 * each claim takes a fixed share of what is left, so chunks shrink towards the end); the caller
 * then waits until every worker has checked back in (`n_running`). Because one host thread
 * drives a device at a time, no loop ever overlaps another and this single barrier is all the
 * synchronisation needed.
 *
 * Waiting: a worker that finished a loop spins on `generation` for about CPU_SPIN_NS before
 * it sleeps on `wake`; the caller spins on `n_running` the same way before it sleeps on
 * `done`. Sleeping and waking go through the
 * mutex, and both counters are re-checked under it, so no wake-up is lost: a publisher bumps
 * `generation` before it takes the mutex to broadcast, and the last worker drops `n_running`
 * to 0 before it takes the mutex to signal.
 *
 * Which thread runs which chunk never changes what a chunk computes, so results are identical
 * for any thread count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_internal.h"

/* Below this much work per chunk (multiply-adds), a wake-up costs more than it saves. */
#define CPU_MIN_CHUNK_WORK 16384.0
/* A claim takes 1 / (CPU_GUIDED_SHARE · threads) of the items left (at least the loop's
 * minimum chunk). Equal chunks of an eighth of the loop each (the pool until 2026-12) left a
 * thread waiting at the join for up to one chunk whenever the cores ran at different speeds,
 * as they do on a shared host: the caller spent 3-5 % of a one-sequence decode waiting
 * there. Shrinking chunks end the loop with small ones, for ~3.5·ln(items) claims a loop. */
#define CPU_GUIDED_SHARE 2
/* How long a waiting thread spins before it sleeps. A decode step is some 60 parallel loops
 * with serial work between them (norms, RoPE, sampling); a worker that slept in those gaps
 * paid a futex wake-up each time: with 2048 pause instructions (27 µs on the machine of
 * docs/BENCHMARKS.md, "INT4 decode on int8 dot products") INT4 decode ran at 71–77 % of its
 * read limit, with 16384 (214 µs) at 77–81 %. A pause takes 10 to 140 cycles depending on
 * the CPU, so the pool times a run of them once at start and spins that many for about
 * CPU_SPIN_NS. (Reading the clock inside the spin instead measured slower: 73–77 %.) */
#define CPU_SPIN_NS 200000.0

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Pause instructions that take about CPU_SPIN_NS on this CPU (at least 2048). */
static int spin_rounds(void)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 4096; i++)
        cpu_relax();
    clock_gettime(CLOCK_MONOTONIC, &b);
    const double ns =
        ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 4096;
    const double n = ns > 0 ? CPU_SPIN_NS / ns : 2048;
    return n < 2048 ? 2048 : n > 1048576 ? 1048576 : (int)n;
}

struct cpu_worker {
    struct cpu_pool *pool;
    int tid;
    pthread_t thread;
};

static void run_chunks(struct cpu_pool *p, int tid)
{
    const int64_t share = (int64_t)CPU_GUIDED_SHARE * p->n_threads;
    int64_t begin = atomic_load_explicit(&p->next, memory_order_relaxed);
    for (;;) {
        const int64_t left = p->n_items - begin;
        if (left <= 0)
            return;
        int64_t take = left / share > p->min_chunk ? left / share : p->min_chunk;
        if (take > left)
            take = left;
        /* On failure begin is reloaded with the claim another thread made. */
        if (atomic_compare_exchange_weak_explicit(&p->next, &begin, begin + take,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            p->fn(p->ctx, tid, begin, begin + take);
            begin = atomic_load_explicit(&p->next, memory_order_relaxed);
        }
    }
}

static void *worker_main(void *arg)
{
    struct cpu_worker *w = arg;
    struct cpu_pool *p = w->pool;
    /* Generation 0 is the pool's state at creation, before any loop. It must not be read
     * here: a loop may already have been published (and counted on this worker) before this
     * thread first runs, and reading the bumped value would make it skip that loop. */
    uint64_t seen = 0;

    for (;;) {
        uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; g == seen && i < p->spin_rounds && !atomic_load(&p->stop); i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->stop) &&
                   (g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            break;
        seen = g;
        run_chunks(p, w->tid);
        if (atomic_fetch_sub_explicit(&p->n_running, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

mmrt_status cpu_pool_init(struct cpu_pool *pool, int n_threads, char *err, size_t err_size)
{
    mmrt_status st = MMRT_OK;

    memset(pool, 0, sizeof *pool);
    pool->n_threads = n_threads;
    pool->spin_rounds = spin_rounds();
    atomic_init(&pool->next, 0);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_running, 0);
    atomic_init(&pool->stop, false);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    if (n_threads <= 1)
        return MMRT_OK;
    pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
    if (!pool->workers) {
        snprintf(err, err_size, "cannot allocate %d worker records", n_threads - 1);
        st = MMRT_ERR_NO_MEMORY;
        goto fail;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        struct cpu_worker *w = &pool->workers[i];
        w->pool = pool;
        w->tid = i + 1;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            snprintf(err, err_size, "cannot start worker thread %d of %d (pthread_create error %d)",
                     i + 1, n_threads - 1, rc);
            st = MMRT_ERR_DEVICE;
            goto fail;
        }
        pool->n_started++;
    }
    return MMRT_OK;

fail:
    cpu_pool_deinit(pool);
    return st;
}

void cpu_pool_deinit(struct cpu_pool *pool)
{
    if (!pool || pool->n_threads == 0)
        return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, true);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->n_started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    free(pool->workers);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    memset(pool, 0, sizeof *pool);
}

void cpu_parallel_for(struct cpu_pool *pool, int64_t n_items, double cost, cpu_task_fn fn,
                      void *ctx)
{
    if (n_items <= 0)
        return;
    int64_t min_chunk = 1;
    if (cost > 0 && cost < CPU_MIN_CHUNK_WORK)
        min_chunk = (int64_t)(CPU_MIN_CHUNK_WORK / cost) + 1;
    if (pool->n_started == 0 || n_items <= min_chunk) {
        fn(ctx, 0, 0, n_items);
        return;
    }

    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_items = n_items;
    pool->min_chunk = min_chunk;
    atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->n_running, pool->n_started, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);

    run_chunks(pool, 0);

    for (int i = 0; i < pool->spin_rounds &&
                    atomic_load_explicit(&pool->n_running, memory_order_acquire) > 0; i++)
        cpu_relax();
    if (atomic_load_explicit(&pool->n_running, memory_order_acquire) > 0) {
        pthread_mutex_lock(&pool->mu);
        while (atomic_load_explicit(&pool->n_running, memory_order_acquire) > 0)
            pthread_cond_wait(&pool->done, &pool->mu);
        pthread_mutex_unlock(&pool->mu);
    }
}
