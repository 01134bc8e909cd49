/*
 * tests/test_cpu_gemm_bench.c — cpu-gemm-bench: the CPU plugin's MATMUL timed at a few row
 * counts M over one weight, through plugin.h exactly as the runtime calls it (tensors in the
 * plugin's arenas, no core in between).
 *
 * It answers one question for the continuous-batching engine (docs/BENCHMARKS.md, "Decode
 * over B rows"): what does a decode step over B sequences cost next to one sequence, when
 * every weight is applied once to a B-row activation? For each M it prints the best and the
 * median of --repeat × --copies calls (after one warm-up; the median is nearer what a model's
 * step sees on a busy host), the weight bytes read per second and the FLOP rate (both at the
 * best), and the cost relative to M = 1. --copies C uploads C copies of W and cycles through
 * them, one per call, so that C · N · K elements exceed the last-level cache and every call
 * reads W from memory as a decode step does (one 86 MiB weight alone stays in a large L3).
 *
 * It also checks, for every M ≤ GEMV_CONTRACT_M, that each output row is bit-identical to
 * the M = 1 result for that row (engine.md §5, batch invariance; the contract of
 * CPU_GEMV_MAX_M in plugins/cpu/cpu_internal.h) and exits 1 if not: ctest runs it on a tiny
 * shape as a smoke test (never a timing assertion). test_cpu_isa checks the same on every
 * kernel table and dtype.
 *
 * usage: cpu-gemm-bench [--isa auto|avx512|avx2|portable] [--threads N]
 *                       [--dtype f32|f16|bf16|i8|u4]
 *                       [--k K] [--n N] [--copies C] [--repeat R] [--bf16-dot]
 *                       [--int8-dot[=1|3]] M…
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "plugin_harness.h"

#define GEMV_CONTRACT_M 32 /* the plugin's CPU_GEMV_MAX_M (its header is private) */

static int usage(void)
{
    fprintf(stderr, "usage: cpu-gemm-bench [--isa auto|avx512|avx2|portable] [--threads N] "
                    "[--dtype f32|f16|bf16|i8|u4] [--k K] [--n N] [--copies C] [--repeat R] [--bf16-dot] "
                    "[--int8-dot[=1|3]] [--prefetch l1|l2] [--amx-gemv=0|1] [--option KEY=VALUE]… M…\n");
    return 2;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    uint64_t rng = 1; /* the values' stream, fixed */
    const char *isa = "auto", *threads = NULL, *dtname = "f16";
    int64_t K = 4096, N = 11008, Ms[32];
    int n_m = 0, repeat = 5, copies = 1;
    bool bf16_dot = false;
    const char *int8_dot = NULL; /* the device option's value: "1" or "3" digits */
    const char *prefetch = NULL; /* the device option's value: "l1" or "l2" */
    const char *amx_gemv = NULL; /* the device option's value: "0" or "1" */
    /* any other device option, as KEY=VALUE (gemv_widen=registers, ...) */
    char okey[4][32];
    const char *oval[4];
    int n_extra = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (strcmp(a, "--isa") == 0 && more)
            isa = argv[++i];
        else if (strcmp(a, "--threads") == 0 && more)
            threads = argv[++i];
        else if (strcmp(a, "--dtype") == 0 && more)
            dtname = argv[++i];
        else if (strcmp(a, "--k") == 0 && more)
            K = atoll(argv[++i]);
        else if (strcmp(a, "--n") == 0 && more)
            N = atoll(argv[++i]);
        else if (strcmp(a, "--copies") == 0 && more)
            copies = atoi(argv[++i]);
        else if (strcmp(a, "--repeat") == 0 && more)
            repeat = atoi(argv[++i]);
        else if (strcmp(a, "--bf16-dot") == 0)
            bf16_dot = true;
        else if (strcmp(a, "--int8-dot") == 0)
            int8_dot = "1";
        else if (strncmp(a, "--int8-dot=", 11) == 0)
            int8_dot = a + 11;
        else if (strcmp(a, "--prefetch") == 0 && more)
            prefetch = argv[++i];
        else if (strncmp(a, "--amx-gemv=", 11) == 0)
            amx_gemv = a + 11;
        else if (strcmp(a, "--option") == 0 && more && n_extra < 4) {
            const char *kv = argv[++i], *eq = strchr(kv, '=');
            if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof okey[0])
                return usage();
            snprintf(okey[n_extra], sizeof okey[0], "%.*s", (int)(eq - kv), kv);
            oval[n_extra++] = eq + 1;
        }
        else if (a[0] != '-' && n_m < 32 && atoll(a) > 0)
            Ms[n_m++] = atoll(a);
        else
            return usage();
    }
    enum mmrt_dtype dt = strcmp(dtname, "f32") == 0    ? MMRT_DTYPE_F32
                         : strcmp(dtname, "bf16") == 0 ? MMRT_DTYPE_BF16
                         : strcmp(dtname, "f16") == 0  ? MMRT_DTYPE_F16
                         : strcmp(dtname, "u4") == 0   ? MMRT_DTYPE_U4
                         : strcmp(dtname, "i8") == 0   ? MMRT_DTYPE_I8
                                                       : (enum mmrt_dtype)-1;
    /* u4: INT4 as [model] weights = int4 holds it, groups of 128 with a scale and a zero
     * point each (plugin.h MATMUL), so K must be whole groups */
    const int64_t U4_GROUP = 128;
    if ((int)dt < 0 || K < 1 || N < 1 || repeat < 1 || copies < 1 || copies > 64 ||
        (dt == MMRT_DTYPE_U4 && K % U4_GROUP != 0))
        return usage();
    if (n_m == 0) {
        Ms[0] = 1, Ms[1] = 8, Ms[2] = 16;
        n_m = 3;
    }
    int64_t max_m = 1;
    for (int i = 0; i < n_m; i++)
        max_m = Ms[i] > max_m ? Ms[i] : max_m;

    struct mmrt_option opts[10];
    int n_opts = 0;
    opts[n_opts++] = (struct mmrt_option){ "isa", isa };
    if (threads)
        opts[n_opts++] = (struct mmrt_option){ "threads", threads };
    if (bf16_dot)
        opts[n_opts++] = (struct mmrt_option){ "bf16_dot", "1" };
    if (int8_dot)
        opts[n_opts++] = (struct mmrt_option){ "int8_dot", int8_dot };
    if (prefetch)
        opts[n_opts++] = (struct mmrt_option){ "prefetch", prefetch };
    if (amx_gemv)
        opts[n_opts++] = (struct mmrt_option){ "amx_gemv", amx_gemv };
    for (int i = 0; i < n_extra; i++)
        opts[n_opts++] = (struct mmrt_option){ okey[i], oval[i] };
    struct harness h;
    mmrt_status st = harness_open(&h, harness_plugin_path("cpu"), opts, n_opts);
    if (st != MMRT_OK) {
        fprintf(stderr, "cpu-gemm-bench: cannot open the cpu plugin (status %d)\n", (int)st);
        return 1;
    }

    /* W [N, K] in dt, and the largest x; smaller M use its first rows, so every row of every
     * M has one M = 1 counterpart. */
    /* bytes of W: u4 packs two codes a byte, and its scales and zero points add 8 per group */
    /* (i8: one byte a code; its row scales, 4/K, are left out as in mmrt-bench) */
    const bool u4 = dt == MMRT_DTYPE_U4, i8 = dt == MMRT_DTYPE_I8;
    const double es = dt == MMRT_DTYPE_F32 ? 4 : u4 ? 0.5 + 8.0 / U4_GROUP : i8 ? 1 : 2;
    const int64_t G = u4 ? K / U4_GROUP : 1;
    void *w = malloc(u4 ? (size_t)(N * K / 2) : (size_t)((double)(N * K) * es));
    float *sz = u4 || i8 ? malloc((size_t)(2 * N * G) * sizeof(float)) : NULL;
    float *x = malloc((size_t)(max_m * K) * sizeof(float));
    float *y1 = malloc((size_t)(max_m * N) * sizeof(float));
    float *y = malloc((size_t)(max_m * N) * sizeof(float));
    double *times = malloc((size_t)repeat * (size_t)copies * sizeof(double));
    if (!w || !x || !y1 || !y || !times || ((u4 || i8) && !sz)) {
        fprintf(stderr, "cpu-gemm-bench: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; dt == MMRT_DTYPE_U4 && i < N * K / 2; i++)
        ((uint8_t *)w)[i] = (uint8_t)(bench_rng_f(&rng) * 65536.0f);
    for (int64_t i = 0; dt == MMRT_DTYPE_U4 && i < N * G; i++) {
        sz[i] = 0.001f + 0.01f * (bench_rng_f(&rng) + 1.0f);          /* scales */
        sz[N * G + i] = (float)((int)((bench_rng_f(&rng) + 1.0f) * 7.5f)); /* zero points */
    }
    for (int64_t i = 0; i8 && i < N; i++)
        sz[i] = 0.001f + 0.01f * (bench_rng_f(&rng) + 1.0f); /* row scales */
    for (int64_t i = 0; !u4 && i < N * K; i++) {
        float v = bench_rng_f(&rng);
        if (i8)
            ((int8_t *)w)[i] = (int8_t)(v * 127.0f);
        else if (dt == MMRT_DTYPE_F32)
            ((float *)w)[i] = v;
        else
            ((uint16_t *)w)[i] = dt == MMRT_DTYPE_F16 ? mmrt_f32_to_f16(v)
                                                      : mmrt_f32_to_bf16(v);
    }
    for (int64_t i = 0; i < max_m * K; i++)
        x[i] = bench_rng_f(&rng);
    struct harness_tensor tws[64], tsc[64], tzp[64];
    const int64_t wcols = dt == MMRT_DTYPE_U4 ? K / 2 : K;
    for (int c = 0; c < copies; c++) {
        bool ok = harness_tensor_new(&h, dt, 2, (const int64_t[]){ N, wcols }, &tws[c]) ==
                      MMRT_OK &&
                  harness_upload(&h, &tws[c], w) == MMRT_OK;
        if (ok && i8)
            ok = harness_tensor_new(&h, MMRT_DTYPE_F32, 1, (const int64_t[]){ N }, &tsc[c]) ==
                     MMRT_OK &&
                 harness_upload(&h, &tsc[c], sz) == MMRT_OK;
        if (ok && u4)
            ok = harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, G }, &tsc[c]) ==
                     MMRT_OK &&
                 harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, G }, &tzp[c]) ==
                     MMRT_OK &&
                 harness_upload(&h, &tsc[c], sz) == MMRT_OK &&
                 harness_upload(&h, &tzp[c], sz + N * G) == MMRT_OK;
        if (!ok) {
            fprintf(stderr, "cpu-gemm-bench: cannot upload W\n");
            return 1;
        }
    }

    /* the device's name says which kernels the options chose */
    struct mmrt_device_info info = { .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_device_info) };
    if (h.plugin->device_info(h.dev, &info) != MMRT_OK)
        snprintf(info.name, sizeof info.name, "?");
    printf("cpu-gemm-bench: %s, isa %s, threads %s, W [%lld, %lld] %s (%.1f MiB) × %d copies, "
           "best and median of %d calls\n", info.name, isa, threads ? threads : "default",
           (long long)N, (long long)K, dtname, (double)(N * K) * es / 1048576.0, copies,
           repeat * copies);
    printf("%6s %10s %10s %10s %10s %12s %8s\n", "M", "ms", "median ms", "W GB/s", "GFLOP/s",
           "ms per row", "vs M=1");
    /* Item -1 is M = 1 over each row of x alone: the reference rows and the M = 1 time. */
    int bad = 0;
    double t_one = 0;
    for (int mi = -1; mi < n_m; mi++) {
        int64_t M = mi < 0 ? 1 : Ms[mi];
        struct harness_tensor tx, ty;
        if (harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, K }, &tx) ||
            harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ M, N }, &ty)) {
            fprintf(stderr, "cpu-gemm-bench: cannot allocate x/y\n");
            return 1;
        }
        struct harness_tensor *src[5] = { &tx, &tws[0], NULL, u4 || i8 ? &tsc[0] : NULL,
                                          u4 ? &tzp[0] : NULL };
        const int n_src = u4 ? 5 : i8 ? 4 : 2;
        if (mi < 0)
            for (int64_t r = 0; r < max_m; r++)
                if (harness_upload(&h, &tx, x + r * K) ||
                    harness_run(&h, MMRT_OP_MATMUL, src, n_src, &ty, NULL, 0) ||
                    harness_download(&h, &ty, y1 + r * N))
                    return 1;
        if (harness_upload(&h, &tx, x))
            return 1;
        double best = 1e30;
        int n_t = 0;
        for (int rep = 0; rep <= repeat * copies; rep++) { /* rep 0 warms up */
            src[1] = &tws[rep % copies];
            if (u4 || i8)
                src[3] = &tsc[rep % copies];
            if (u4)
                src[4] = &tzp[rep % copies];
            double t0 = bench_now_s();
            if (harness_run(&h, MMRT_OP_MATMUL, src, n_src, &ty, NULL, 0) != MMRT_OK)
                return 1;
            double t = bench_now_s() - t0;
            if (rep > 0 && t < best)
                best = t;
            if (rep > 0)
                times[n_t++] = t;
        }
        qsort(times, (size_t)n_t, sizeof *times, cmp_double);
        const double median = times[n_t / 2];
        /* Every copy holds the same W, so y is the result whichever copy ran last. */
        if (harness_download(&h, &ty, y))
            return 1;
        int64_t n_bad = 0;
        for (int64_t r = 0; M <= GEMV_CONTRACT_M && r < M; r++)
            n_bad += memcmp(y + r * N, y1 + r * N, (size_t)N * sizeof(float)) != 0;
        if (n_bad) {
            fprintf(stderr, "M = %lld: %lld rows differ from their M = 1 result\n",
                    (long long)M, (long long)n_bad);
            bad = 1;
        }
        if (mi < 0) {
            t_one = best;
        } else {
            double wbytes = (double)(N * K) * es;
            printf("%6lld %10.3f %10.3f %10.2f %10.1f %12.4f %7.2fx\n", (long long)M,
                   best * 1e3, median * 1e3, wbytes / best / 1e9,
                   2.0 * (double)(M * N * K) / best / 1e9, best * 1e3 / (double)M,
                   best / t_one);
        }
        harness_tensor_free(&h, &tx);
        harness_tensor_free(&h, &ty);
    }
    printf("rows bit-identical to M = 1: %s\n", bad ? "NO" : "yes");
    for (int c = 0; c < copies; c++) {
        harness_tensor_free(&h, &tws[c]);
        if (u4 || i8)
            harness_tensor_free(&h, &tsc[c]);
        if (u4)
            harness_tensor_free(&h, &tzp[c]);
    }
    free(sz);
    harness_close(&h);
    free(w);
    free(x);
    free(y1);
    free(y);
    free(times);
    return bad;
}
