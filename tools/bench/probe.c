/*
 * tools/bench/probe.c — the limits a benchmark figure is held to, measured on this machine in
 * the same run (so a neighbour eating bandwidth lowers the limit too, not only the figure).
 *
 *   read bandwidth: every thread streams its own slice of one big buffer (allocated like the
 *     CPU plugin's arenas: 64-byte aligned, transparent huge pages requested), several passes
 *     alternating one sequential stream per thread and four (decode's GEMV reads four weight
 *     rows at a time, and more streams in flight can draw more from memory); the best pass
 *     counts; bytes / wall time from the first thread's start to the last one's
 *     end. The buffer is written once before timing so no page fault is measured.
 *   f32 peak: every thread runs independent FMA chains (enough to cover latency × ports);
 *     2 flop per lane per FMA; a few rounds of ~40 ms, best round.
 *   bf16 peak: the same with vdpbf16ps (AVX512_BF16), 2 flop per bf16 pair product.
 *   AMX peak: TDPBF16PS tile products (probe_amx.c), where plugins/common/x86_amx.h says this
 *     process may use the tiles, as the CPU plugin's AMX unit decides.
 *
 * The loops come from probe_avx512.c / probe_avx2.c, chosen at run time by
 * __builtin_cpu_supports like the CPU plugin's kernels; elsewhere a plain C loop is used (its
 * FMA figure is then only what the compiler makes of it, marked "scalar").
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench.h"
#include "x86_amx.h"

#if defined(__x86_64__)
#define BENCH_X86 1
#else
#define BENCH_X86 0
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum probe_kind { PROBE_READ, PROBE_FMA, PROBE_BF16, PROBE_AMX };

struct isa {
    bool avx2, avx512, bf16, amx;
};

static struct isa isa_now(char *amx_why, size_t amx_why_size)
{
    struct isa i = { false, false, false, false };
    snprintf(amx_why, amx_why_size, "this mmrt-bench was built without the AMX probe");
#if BENCH_X86
    __builtin_cpu_init();
    i.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    i.avx512 = __builtin_cpu_supports("avx512f");
    i.bf16 = i.avx512 && __builtin_cpu_supports("avx512bf16");
#if defined(BENCH_HAVE_AMX)
    i.amx = mmrt_x86_amx_present(amx_why, amx_why_size) &&
            mmrt_x86_amx_permit(amx_why, amx_why_size);
#endif
#endif
    return i;
}

static uint64_t read_scalar(const void *p, size_t nbytes, int streams, uint64_t *sink)
{
    (void)streams;
    const uint64_t *q = p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t n = nbytes / 32 * 4;
    for (size_t i = 0; i < n; i += 4) {
        a0 += q[i];
        a1 += q[i + 1];
        a2 += q[i + 2];
        a3 += q[i + 3];
    }
    *sink += a0 + a1 + a2 + a3;
    return n * 8;
}

static uint64_t fma_scalar(uint64_t iters, float *sink)
{
    float a[16];
    for (int j = 0; j < 16; j++)
        a[j] = 0.5f + 0.01f * (float)j;
    for (uint64_t it = 0; it < iters; it++)
        for (int j = 0; j < 16; j++)
            a[j] = a[j] * 0.9999999f + 1e-7f;
    for (int j = 0; j < 16; j++)
        *sink += a[j];
    return iters * 16 * 2;
}

struct job {
    enum probe_kind kind;
    struct isa isa;
    const char *buf;
    size_t nbytes;     /* this thread's slice (read) */
    uint64_t iters;    /* FMA / bf16 */
    int streams;       /* read: 1 or 4 sequential streams per thread */
    pthread_barrier_t *bar;
    double t0, t1;
    uint64_t work;
    uint64_t isink;
    float fsink;
};

static void *job_main(void *arg)
{
    struct job *j = arg;
    pthread_barrier_wait(j->bar);
    j->t0 = now_s();
    switch (j->kind) {
    case PROBE_READ:
#if BENCH_X86
        if (j->isa.avx512)
            j->work = bench_read_avx512(j->buf, j->nbytes, j->streams, &j->isink);
        else if (j->isa.avx2)
            j->work = bench_read_avx2(j->buf, j->nbytes, j->streams, &j->isink);
        else
#endif
            j->work = read_scalar(j->buf, j->nbytes, j->streams, &j->isink);
        break;
    case PROBE_FMA:
#if BENCH_X86
        if (j->isa.avx512)
            j->work = bench_fma_avx512(j->iters, &j->fsink);
        else if (j->isa.avx2)
            j->work = bench_fma_avx2(j->iters, &j->fsink);
        else
#endif
            j->work = fma_scalar(j->iters, &j->fsink);
        break;
    case PROBE_BF16:
#if BENCH_X86
        j->work = bench_bf16_avx512(j->iters, &j->fsink);
#endif
        break;
    case PROBE_AMX:
#if defined(BENCH_HAVE_AMX)
        j->work = bench_amx_bf16(j->iters, &j->fsink);
#endif
        break;
    }
    j->t1 = now_s();
    return NULL;
}

/* Runs one round on n threads; returns work per second over the union of their intervals,
 * or −1 when a thread cannot be started. */
static double round_rate(int n, enum probe_kind kind, struct isa isa, const char *buf,
                         size_t total, uint64_t iters, int streams)
{
    struct job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    pthread_barrier_t bar;
    double rate = -1;
    if (!jobs || !th)
        goto out;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    size_t slice = total / (size_t)n / 256 * 256;
    int started = 0;
    for (int i = 0; i < n; i++) {
        jobs[i] = (struct job){ .kind = kind, .isa = isa,
                                .buf = buf ? buf + (size_t)i * slice : NULL, .nbytes = slice,
                                .iters = iters, .streams = streams, .bar = &bar };
        if (pthread_create(&th[i], NULL, job_main, &jobs[i]) != 0)
            break;
        started++;
    }
    if (started < n) {
        /* The barrier can never fill: nothing else to do but report. Threads already
         * started stay blocked; this only happens when the process is out of threads. */
        free(th);
        return -1;
    }
    double t0 = 1e300, t1 = 0;
    uint64_t work = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        t0 = jobs[i].t0 < t0 ? jobs[i].t0 : t0;
        t1 = jobs[i].t1 > t1 ? jobs[i].t1 : t1;
        work += jobs[i].work;
    }
    pthread_barrier_destroy(&bar);
    rate = t1 > t0 ? (double)work / (t1 - t0) : -1;
out:
    free(jobs);
    free(th);
    return rate;
}

/* Iterations that take about `seconds` on one thread, from a short calibration round. */
static uint64_t calibrate(enum probe_kind kind, struct isa isa, double seconds)
{
    uint64_t iters = 1u << 16;
    for (;;) {
        double rate = round_rate(1, kind, isa, NULL, 0, iters, 1);
        if (rate <= 0)
            return iters;
        double per_iter_flop = kind == PROBE_AMX    ? 4.0 * 16384
                               : kind == PROBE_BF16 ? 20.0 * 64
                               : isa.avx512         ? 20.0 * 32
                               : isa.avx2           ? 12.0 * 16
                                                    : 32.0;
        double t = (double)iters * per_iter_flop / rate;
        if (t > 0.005)
            return (uint64_t)((double)iters * seconds / t) + 1;
        iters *= 8;
    }
}

int bench_probe(int n_threads, size_t buffer_mb, int passes, struct bench_limits *lim,
                char *err, size_t err_size)
{
    struct isa isa = isa_now(lim->amx_why, sizeof lim->amx_why);
    if (lim->max_isa && strcmp(lim->max_isa, "avx2") == 0) {
        isa.avx512 = isa.bf16 = isa.amx = false;
        snprintf(lim->amx_why, sizeof lim->amx_why, "isa = avx2");
    } else if (lim->max_isa && strcmp(lim->max_isa, "portable") == 0) {
        isa = (struct isa){ false, false, false, false };
        snprintf(lim->amx_why, sizeof lim->amx_why, "isa = portable");
    }
    double read = 0, f32 = 0, bf16 = 0, amx = 0;
    lim->isa = isa.avx512 ? "avx512" : isa.avx2 ? "avx2" : "scalar";
    if (n_threads < 1)
        n_threads = 1;

    size_t nbytes = buffer_mb << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 64, nbytes) != 0) {
        snprintf(err, err_size, "read probe: cannot allocate %zu MiB", buffer_mb);
        return -1;
    }
#ifdef MADV_HUGEPAGE
    madvise(buf, nbytes, MADV_HUGEPAGE); /* as the CPU plugin does for its arenas */
#endif
    memset(buf, 1, nbytes);
    for (int p = 0; p < passes; p++) {
        /* Alternate one and four streams per thread; the best pass of either counts. */
        double r = round_rate(n_threads, PROBE_READ, isa, buf, nbytes, 0, p % 2 ? 4 : 1);
        if (r < 0) {
            free(buf);
            snprintf(err, err_size, "read probe: cannot start %d threads", n_threads);
            return -1;
        }
        read = r / 1e9 > read ? r / 1e9 : read;
    }
    free(buf);

    uint64_t iters = calibrate(PROBE_FMA, isa, 0.04);
    for (int r = 0; r < 4; r++) {
        double rate = round_rate(n_threads, PROBE_FMA, isa, NULL, 0, iters, 1);
        f32 = rate / 1e9 > f32 ? rate / 1e9 : f32;
    }
    if (isa.bf16) {
        iters = calibrate(PROBE_BF16, isa, 0.04);
        for (int r = 0; r < 4; r++) {
            double rate = round_rate(n_threads, PROBE_BF16, isa, NULL, 0, iters, 1);
            bf16 = rate / 1e9 > bf16 ? rate / 1e9 : bf16;
        }
    }
    if (isa.amx) {
        iters = calibrate(PROBE_AMX, isa, 0.04);
        for (int r = 0; r < 4; r++) {
            double rate = round_rate(n_threads, PROBE_AMX, isa, NULL, 0, iters, 1);
            amx = rate / 1e9 > amx ? rate / 1e9 : amx;
        }
    }
    bool first = lim->n_calls++ == 0;
#define FOLD(hi, lo, v)                                                                        \
    do {                                                                                       \
        lim->hi = (v) > lim->hi ? (v) : lim->hi;                                               \
        lim->lo = first || (v) < lim->lo ? (v) : lim->lo;                                      \
    } while (0)
    FOLD(read_gbs, read_gbs_low, read);
    FOLD(f32_gflops, f32_gflops_low, f32);
    FOLD(bf16_gflops, bf16_gflops_low, bf16);
    FOLD(amx_gflops, amx_gflops_low, amx);
#undef FOLD
    return 0;
}
