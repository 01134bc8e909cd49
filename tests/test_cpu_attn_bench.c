/*
 * tests/test_cpu_attn_bench.c — cpu-attn-bench: the CPU plugin's decode attention
 * (ATTENTION_PAGED, one query per sequence) timed over B sequences, through plugin.h exactly
 * as the engine calls it (page pool, page table and lengths in the plugin's arenas).
 *
 * It answers the other half of a batched decode step's cost (docs/BENCHMARKS.md, "Decode over
 * B rows"; cpu-gemm-bench measures the weights' half): how fast are B sequences' K/V pages
 * read? Every sequence has --keys keys in pages of --page tokens scattered over the pool in
 * shuffled order, as a long-running server's store ends up; --copies C keeps C sets of B
 * sequences and cycles through them, one per call, so the pages come from memory rather than
 * from the last-level cache. For each B it prints the best of --repeat calls, the K/V bytes
 * read per second, and the time relative to B = 1 when B = 1 was listed before it.
 *
 * It also checks that each sequence's output is bit-identical to the same sequence run alone
 * (engine.md §5, batch invariance) and exits 1 if not, and prints a digest of those outputs,
 * so that two builds can be compared bit for bit; ctest runs it on a tiny shape as a
 * smoke test (never a timing assertion). Keep --copies × B sequences' K/V above the last-level
 * cache, B = 1 included (LLaVA-7B's 629 keys are 82 MiB of F32 K/V per sequence: --copies 4
 * against a 260 MiB L3), or B = 1 reads from cache and flatters the small batches.
 *
 * usage: cpu-attn-bench [--isa auto|avx512|avx2|portable] [--threads N]
 *                       [--kv f32|f16|fp8|int8] [--heads H] [--kv-heads G] [--d D]
 *                       [--keys L] [--page P] [--window W] [--copies C] [--repeat R] B…
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "plugin_harness.h"

static int usage(void)
{
    fprintf(stderr, "usage: cpu-attn-bench [--isa auto|avx512|avx2|portable] [--threads N] "
                    "[--kv f32|f16|fp8|int8] [--heads H] [--kv-heads G] [--d D] [--keys L] "
                    "[--page P] [--window W] [--copies C] [--repeat R] B…\n");
    return 2;
}

/* One launch's tensors: B query rows, their lengths and page-table rows. */
struct launch {
    struct harness_tensor q, y, cu, lens, table;
};

static int launch_new(struct harness *h, int64_t B, int64_t H, int64_t D, int64_t max_pages,
                      struct launch *l)
{
    return harness_tensor_new(h, MMRT_DTYPE_F32, 3, (const int64_t[]){ B, H, D }, &l->q) ||
           harness_tensor_new(h, MMRT_DTYPE_F32, 3, (const int64_t[]){ B, H, D }, &l->y) ||
           harness_tensor_new(h, MMRT_DTYPE_I32, 1, (const int64_t[]){ B + 1 }, &l->cu) ||
           harness_tensor_new(h, MMRT_DTYPE_I32, 1, (const int64_t[]){ B }, &l->lens) ||
           harness_tensor_new(h, MMRT_DTYPE_I32, 2, (const int64_t[]){ B, max_pages },
                              &l->table);
}

static void launch_free(struct harness *h, struct launch *l)
{
    harness_tensor_free(h, &l->q);
    harness_tensor_free(h, &l->y);
    harness_tensor_free(h, &l->cu);
    harness_tensor_free(h, &l->lens);
    harness_tensor_free(h, &l->table);
}

/* Uploads sequences [s0, s0 + B) of the pool into l: their queries, lengths and tables. */
static int launch_fill(struct harness *h, struct launch *l, int64_t s0, int64_t B, int64_t HD,
                       int64_t keys, int64_t max_pages, const float *q, const int32_t *table)
{
    int32_t *cu = malloc((size_t)(B + 1) * sizeof *cu), *lens = malloc((size_t)B * sizeof *lens);
    if (!cu || !lens) {
        free(cu);
        free(lens);
        return 1;
    }
    for (int64_t b = 0; b <= B; b++)
        cu[b] = (int32_t)b;
    for (int64_t b = 0; b < B; b++)
        lens[b] = (int32_t)keys;
    int bad = harness_upload(h, &l->q, q + s0 * HD) || harness_upload(h, &l->cu, cu) ||
              harness_upload(h, &l->lens, lens) ||
              harness_upload(h, &l->table, table + s0 * max_pages);
    free(cu);
    free(lens);
    return bad;
}

/* kv[0], kv[1]: the K and V pages; kv[2], kv[3]: their row scales (I8 pages only). */
static int launch_run(struct harness *h, struct launch *l, struct harness_tensor *kv,
                      bool scaled, int64_t B, float scale, int32_t window)
{
    struct harness_tensor *src[8] = { &l->q, &kv[0], &kv[1], &l->cu, &l->lens, &l->table,
                                      &kv[2], &kv[3] };
    struct mmrt_attention_params p = { scale, 1, (int32_t)B, window };
    return harness_run(h, MMRT_OP_ATTENTION_PAGED, src, scaled ? 8 : 6, &l->y, &p,
                       sizeof p) != MMRT_OK;
}

int main(int argc, char **argv)
{
    uint64_t rng = 7; /* the values' stream, fixed */
    const char *isa = "auto", *threads = NULL, *kvname = "f32";
    int64_t H = 32, G = 0, D = 128, keys = 629, page = 16, Bs[32];
    int32_t window = 0;
    int n_b = 0, repeat = 5, copies = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (strcmp(a, "--isa") == 0 && more)
            isa = argv[++i];
        else if (strcmp(a, "--threads") == 0 && more)
            threads = argv[++i];
        else if (strcmp(a, "--kv") == 0 && more)
            kvname = argv[++i];
        else if (strcmp(a, "--heads") == 0 && more)
            H = atoll(argv[++i]);
        else if (strcmp(a, "--kv-heads") == 0 && more)
            G = atoll(argv[++i]);
        else if (strcmp(a, "--d") == 0 && more)
            D = atoll(argv[++i]);
        else if (strcmp(a, "--keys") == 0 && more)
            keys = atoll(argv[++i]);
        else if (strcmp(a, "--page") == 0 && more)
            page = atoll(argv[++i]);
        else if (strcmp(a, "--window") == 0 && more)
            window = (int32_t)atoi(argv[++i]);
        else if (strcmp(a, "--copies") == 0 && more)
            copies = atoi(argv[++i]);
        else if (strcmp(a, "--repeat") == 0 && more)
            repeat = atoi(argv[++i]);
        else if (a[0] != '-' && n_b < 32 && atoll(a) > 0 && atoll(a) <= 256)
            Bs[n_b++] = atoll(a);
        else
            return usage();
    }
    if (G == 0)
        G = H;
    enum mmrt_dtype kv = strcmp(kvname, "f32") == 0   ? MMRT_DTYPE_F32
                         : strcmp(kvname, "f16") == 0 ? MMRT_DTYPE_F16
                         : strcmp(kvname, "fp8") == 0 ? MMRT_DTYPE_F8E4M3
                         : strcmp(kvname, "int8") == 0 ? MMRT_DTYPE_I8
                                                      : (enum mmrt_dtype)-1;
    if ((int)kv < 0 || H < 1 || G < 1 || H % G != 0 || D < 1 || D > 256 || keys < 1 ||
        page < 1 || window < 0 || repeat < 1 || copies < 1 || copies > 64)
        return usage();
    if (n_b == 0) {
        Bs[0] = 1, Bs[1] = 8, Bs[2] = 16;
        n_b = 3;
    }
    int64_t max_b = 1;
    for (int i = 0; i < n_b; i++)
        max_b = Bs[i] > max_b ? Bs[i] : max_b;

    struct mmrt_option opts[2];
    int n_opts = 0;
    opts[n_opts++] = (struct mmrt_option){ "isa", isa };
    if (threads)
        opts[n_opts++] = (struct mmrt_option){ "threads", threads };
    struct harness h;
    if (harness_open(&h, harness_plugin_path("cpu"), opts, n_opts) != MMRT_OK) {
        fprintf(stderr, "cpu-attn-bench: cannot open the cpu plugin\n");
        return 1;
    }

    /* The pool: copies × max_b sequences of `keys` keys, every page in shuffled order. */
    const int64_t n_seq = (int64_t)copies * max_b, max_pages = (keys + page - 1) / page;
    const int64_t n_pages = n_seq * max_pages, row = G * D, HD = H * D;
    const size_t es = mmrt_dtype_size(kv);
    const size_t pool_bytes = (size_t)(n_pages * page * row) * es;
    char *pool = malloc(pool_bytes);
    int32_t *perm = malloc((size_t)n_pages * sizeof *perm);
    float *q = malloc((size_t)(n_seq * HD) * sizeof(float));
    float *alone = malloc((size_t)(n_seq * HD) * sizeof(float));
    float *y = malloc((size_t)(max_b * HD) * sizeof(float));
    if (!pool || !perm || !q || !alone || !y) {
        fprintf(stderr, "cpu-attn-bench: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n_pages; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = n_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(bench_rng_u64(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < n_seq * HD; i++)
        q[i] = bench_rng_f(&rng);
    /* K, V, and for INT8 pages their row scales (codes of ±127 · scale in ±1). */
    struct harness_tensor kvt[4];
    const bool scaled = kv == MMRT_DTYPE_I8;
    const int64_t n_rows = n_pages * page * G;
    float *scales = malloc((size_t)n_rows * sizeof *scales);
    if (!scales) {
        fprintf(stderr, "cpu-attn-bench: out of memory\n");
        return 1;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < n_pages * page * row; i++) {
            float v = bench_rng_f(&rng);
            if (kv == MMRT_DTYPE_F32)
                ((float *)pool)[i] = v;
            else if (kv == MMRT_DTYPE_F8E4M3)
                ((uint8_t *)pool)[i] = mmrt_f32_to_f8e4m3(v);
            else if (kv == MMRT_DTYPE_I8)
                ((int8_t *)pool)[i] = (int8_t)lrintf(v * 127.0f);
            else
                ((uint16_t *)pool)[i] = mmrt_f32_to_f16(v);
        }
        for (int64_t i = 0; i < n_rows; i++)
            scales[i] = (0.75f + 0.25f * bench_rng_f(&rng)) / 127.0f;
        struct harness_tensor *t = &kvt[pass];
        if (harness_tensor_new(&h, kv, 4, (const int64_t[]){ n_pages, page, G, D }, t) ||
            harness_upload(&h, t, pool) ||
            (scaled && (harness_tensor_new(&h, MMRT_DTYPE_F32, 1, (const int64_t[]){ n_rows },
                                           &kvt[2 + pass]) ||
                        harness_upload(&h, &kvt[2 + pass], scales)))) {
            fprintf(stderr, "cpu-attn-bench: cannot upload the page pool\n");
            return 1;
        }
    }
    free(pool);
    free(scales);

    const float scale = 1.0f / sqrtf((float)D);
    /* K/V bytes one decode query reads per sequence: its window's keys. */
    const int64_t read_keys = window > 0 && window < keys ? window : keys;
    const double kv_bytes = 2.0 * (double)read_keys * (double)row * (double)es +
                            (scaled ? 2.0 * (double)read_keys * (double)G * 4.0 : 0.0);
    printf("cpu-attn-bench: isa %s, threads %s, %lld heads (%lld kv) × %lld, %lld keys in "
           "pages of %lld, %s K/V (%.1f MiB per sequence), %d copies, best of %d\n", isa,
           threads ? threads : "default", (long long)H, (long long)G, (long long)D,
           (long long)keys, (long long)page, kvname, kv_bytes / 1048576.0, copies, repeat);
    printf("%6s %10s %10s %12s %8s\n", "B", "ms", "K/V GB/s", "ms per seq", "vs B=1");

    /* Every sequence alone first: the reference bits. */
    int bad = 0;
    double t_one = 0;
    struct launch one;
    if (launch_new(&h, 1, H, D, max_pages, &one))
        return 1;
    for (int64_t s = 0; s < n_seq; s++)
        if (launch_fill(&h, &one, s, 1, HD, keys, max_pages, q, perm) ||
            launch_run(&h, &one, kvt, scaled, 1, scale, window) ||
            harness_download(&h, &one.y, alone + s * HD))
            return 1;
    launch_free(&h, &one);
    for (int bi = 0; bi < n_b; bi++) {
        const int64_t B = Bs[bi];
        struct launch l[64];
        for (int c = 0; c < copies; c++)
            if (launch_new(&h, B, H, D, max_pages, &l[c]) ||
                launch_fill(&h, &l[c], (int64_t)c * max_b, B, HD, keys, max_pages, q, perm))
                return 1;
        double best = 1e30;
        for (int rep = 0; rep <= repeat * copies; rep++) { /* rep 0 warms up */
            double t0 = bench_now_s();
            if (launch_run(&h, &l[rep % copies], kvt, scaled, B, scale, window))
                return 1;
            double t = bench_now_s() - t0;
            if (rep > 0 && t < best)
                best = t;
        }
        for (int c = 0; c < copies; c++) {
            if (harness_download(&h, &l[c].y, y))
                return 1;
            if (memcmp(y, alone + (int64_t)c * max_b * HD, (size_t)(B * HD) * sizeof(float))) {
                fprintf(stderr, "B = %lld: rows differ from their sequences alone\n",
                        (long long)B);
                bad = 1;
            }
            launch_free(&h, &l[c]);
        }
        if (B == 1)
            t_one = best;
        printf("%6lld %10.3f %10.2f %12.4f", (long long)B, best * 1e3,
               kv_bytes * (double)B / best / 1e9, best * 1e3 / (double)B);
        if (t_one > 0)
            printf(" %7.2fx", best / t_one);
        printf("\n");
    }
    printf("rows bit-identical to each sequence alone: %s\n", bad ? "NO" : "yes");
    /* FNV-1a over every sequence's output bits: two builds of the plugin compute the same
     * attention exactly when their digests agree for the same arguments. */
    uint64_t digest = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < (size_t)(n_seq * HD) * sizeof(float); i++)
        digest = (digest ^ ((const unsigned char *)alone)[i]) * 0x100000001b3ull;
    printf("output digest: %016llx\n", (unsigned long long)digest);
    for (int i = 0; i < (scaled ? 4 : 2); i++)
        harness_tensor_free(&h, &kvt[i]);
    harness_close(&h);
    free(perm);
    free(q);
    free(alone);
    free(y);
    return bad;
}
