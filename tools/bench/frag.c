/*
 * tools/bench/frag.c — mmrt-frag: the pool's two levels against the buddy allocator alone on
 * a stream of mixed requests through the runtime (docs/BENCHMARKS.md, "Fragmentation").
 *
 *   mmrt-frag [--model DIR] [--requests N] [--concurrency C] [--seed S] [--json]
 *
 * The workload: N requests (default 1000), C at a time through mmrt_run_batch (default 1:
 * one after another; more: they decode together in the engine) on one CPU device with
 * pool_mb = auto, each with one of four images of different sizes (the Qwen2-VL fixture's
 * dynamic resolution gives each its own patch grid) and a prompt of 1 … 160 words, 1 … 8
 * new tokens, all drawn from a fixed-seed generator so every run is the same. It runs twice,
 * level1 = on and level1 = off, and reports for each: bytes held at the end, the peak of
 * bytes held, the peak of bytes requested (what the model asked for), fragmentation =
 * 1 − requested / held at the peak (memory the allocator's rounding and free slots cost),
 * external fragmentation at the end (1 − largest free block / free bytes), level-1 hits, and
 * the smallest pool that runs the workload. The last is found by recording every pool call
 * of the run (core/pool.h mmrt_pool_trace_new_pools) and replaying the calls against pools of
 * other capacities, bisected to min_block: the same calls in the same order, which the
 * runtime makes whatever the pool's capacity. Exit status 0, 1 when a request fails, 2 usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmrt/mmrt.h"
#include "pool.h"

struct event {
    uint64_t nbytes; /* 0 for a free */
    uint32_t id;     /* allocation index; a free names the allocation it returns */
};

struct recorder {
    struct event *ev;
    size_t n, cap;
    /* live blocks of the traced pool: (arena, offset) → allocation id */
    struct live { void *arena; uint64_t offset; uint32_t id; } *live;
    size_t n_live, cap_live;
    uint32_t next_id;
    int failed;
};

static void push(struct recorder *r, struct event e)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1 << 16;
        struct event *p = realloc(r->ev, cap * sizeof *p);
        if (!p) {
            r->failed = 1;
            return;
        }
        r->ev = p;
        r->cap = cap;
    }
    r->ev[r->n++] = e;
}

static void on_alloc(void *user, const struct mmrt_pool_block *b)
{
    struct recorder *r = user;
    if (r->n_live == r->cap_live) {
        size_t cap = r->cap_live ? r->cap_live * 2 : 1024;
        struct live *p = realloc(r->live, cap * sizeof *p);
        if (!p) {
            r->failed = 1;
            return;
        }
        r->live = p;
        r->cap_live = cap;
    }
    r->live[r->n_live++] = (struct live){ b->arena, b->offset, r->next_id };
    push(r, (struct event){ b->requested, r->next_id++ });
}

static void on_free(void *user, const struct mmrt_pool_block *b)
{
    struct recorder *r = user;
    for (size_t i = r->n_live; i-- > 0;) /* recent blocks are freed first */
        if (r->live[i].arena == b->arena && r->live[i].offset == b->offset) {
            push(r, (struct event){ 0, r->live[i].id });
            r->live[i] = r->live[--r->n_live];
            return;
        }
    r->failed = 1;
}

/* ---- replay -------------------------------------------------------------------------- */

static uintptr_t g_next_handle;

static mmrt_status fake_alloc(void *user, uint64_t nbytes, void **arena, struct mmrt_error *err)
{
    (void)user;
    (void)nbytes;
    (void)err;
    *arena = (void *)(++g_next_handle * 64);
    return MMRT_OK;
}

static void fake_free(void *user, void *arena)
{
    (void)user;
    (void)arena;
}

/* 1 when the recorded calls all succeed on a pool of `capacity`. */
static int replay(const struct recorder *r, uint64_t capacity, uint64_t min_block,
                  enum mmrt_pool_level1 level1, struct mmrt_pool_block *blocks)
{
    struct mmrt_pool_config cfg = { .capacity_bytes = capacity, .min_block_bytes = min_block,
                                    .level1 = level1 };
    struct mmrt_pool_arena_ops ops = { .alloc = fake_alloc, .free = fake_free };
    struct mmrt_pool *pool = NULL;
    struct mmrt_error err = { 0 };
    if (mmrt_pool_create(&cfg, &ops, &pool, &err) != MMRT_OK)
        return 0;
    int ok = 1;
    for (size_t i = 0; ok && i < r->n; i++) {
        const struct event *e = &r->ev[i];
        if (e->nbytes)
            ok = mmrt_pool_alloc(pool, e->nbytes, &blocks[e->id], &err) == MMRT_OK;
        else
            mmrt_pool_free(pool, &blocks[e->id]);
    }
    mmrt_pool_destroy(pool);
    return ok;
}

/* The smallest capacity (a multiple of min_block) on which the calls succeed, bisected
 * between lo (fails or is the answer) and hi (succeeds). */
static uint64_t smallest_pool(const struct recorder *r, uint64_t lo, uint64_t hi,
                              uint64_t min_block, enum mmrt_pool_level1 level1)
{
    struct mmrt_pool_block *blocks = calloc(r->next_id ? r->next_id : 1, sizeof *blocks);
    if (!blocks)
        return 0;
    lo = lo / min_block;
    hi = (hi + min_block - 1) / min_block;
    while (lo + 1 < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (replay(r, mid * min_block, min_block, level1, blocks))
            hi = mid;
        else
            lo = mid;
    }
    free(blocks);
    return hi * min_block;
}

/* ---- the workload ---------------------------------------------------------------------- */

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct figures {
    uint64_t capacity, held_end, peak_held, peak_requested, min_block, smallest;
    double frag_at_peak, ext_frag_end;
    uint64_t l1_hits, l1_misses, n_events;
};

#define MAX_CONCURRENCY 32

static int run_mode(const char *model, int n_req, int conc, uint64_t seed,
                    enum mmrt_level1 level1, const char *const *images, struct figures *f)
{
    struct recorder rec = { 0 };
    const struct mmrt_pool_trace tr = { &rec, on_alloc, on_free };
    mmrt_pool_trace_new_pools(&tr);
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .level1 = level1 };
    struct mmrt_config cfg = { .model_path = model, .devices = &dev, .n_devices = 1,
                               .max_batch = conc };
    struct mmrt_runtime *rt = NULL;
    char err[1024];
    mmrt_status st = mmrt_create(&cfg, &rt, err, sizeof err);
    mmrt_pool_trace_new_pools(NULL);
    if (st != MMRT_OK) {
        fprintf(stderr, "mmrt-frag: %s\n", err);
        free(rec.ev);
        free(rec.live);
        return 2;
    }
    /* conc requests at a time through mmrt_run_batch: they decode together in the engine, as
     * a server's requests do (conc = 1: one after another). */
    char *prompt[MAX_CONCURRENCY];
    uint64_t s = seed * 2654435761u + 1, live_req = 0, peak_req = 0;
    int rc = 0;
    for (int k = 0; k < conc; k++)
        rc |= !(prompt[k] = malloc(160 * 8 + 1));
    memset(f, 0, sizeof *f);
    for (int i = 0; rc == 0 && i < n_req; i += conc) {
        struct mmrt_request req[MAX_CONCURRENCY];
        struct mmrt_image_input in[MAX_CONCURRENCY];
        struct mmrt_result res[MAX_CONCURRENCY] = { { 0 } };
        const int n = n_req - i < conc ? n_req - i : conc;
        for (int k = 0; k < n; k++) {
            int words = 1 + (int)(rng(&s) % 160);
            size_t used = 0;
            for (int w = 0; w < words; w++)
                used += (size_t)sprintf(prompt[k] + used, "%s ", (rng(&s) & 1) ? "word" : "cat");
            in[k] = (struct mmrt_image_input){ .path = images[rng(&s) % 4] };
            req[k] = (struct mmrt_request){ .images = &in[k], .n_images = 1,
                                            .prompt = prompt[k],
                                            .max_tokens = 1 + (int)(rng(&s) % 8),
                                            .top_p = 1.0f, .seed = (uint64_t)(i + k) };
        }
        if (mmrt_run_batch(rt, req, n, NULL, NULL, res) != MMRT_OK) {
            fprintf(stderr, "mmrt-frag: requests %d…%d: %s\n", i, i + n - 1,
                    mmrt_last_error(rt));
            rc = 1;
        }
    }
    for (int k = 0; k < conc; k++)
        free(prompt[k]);
    /* the peak of requested bytes, from the recording */
    uint64_t *req_of = calloc(rec.next_id ? rec.next_id : 1, sizeof *req_of);
    for (size_t i = 0; req_of && i < rec.n; i++) {
        if (rec.ev[i].nbytes) {
            req_of[rec.ev[i].id] = rec.ev[i].nbytes;
            live_req += rec.ev[i].nbytes;
            if (live_req > peak_req)
                peak_req = live_req;
        } else {
            live_req -= req_of[rec.ev[i].id];
        }
    }
    free(req_of);
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    struct mmrt_pool_report pr;
    if (rc == 0 && !rec.failed && mmrt_device_memory(rt, 0, &mr) == MMRT_OK &&
        mmrt_device_pool_stats(rt, 0, &pr) == MMRT_OK) {
        f->capacity = mr.pool_capacity_bytes;
        f->held_end = mr.pool_bytes_held;
        f->peak_held = mr.pool_peak_bytes_held;
        f->peak_requested = peak_req;
        f->frag_at_peak = 1.0 - (double)peak_req / (double)mr.pool_peak_bytes_held;
        f->ext_frag_end = mr.pool_fragmentation;
        f->l1_hits = mr.level1_hits;
        f->l1_misses = mr.level1_misses;
        f->min_block = pr.min_block_bytes;
        f->n_events = rec.n;
        f->smallest = smallest_pool(&rec, peak_req, mr.pool_capacity_bytes, pr.min_block_bytes,
                                    (enum mmrt_pool_level1)level1);
    } else if (rc == 0) {
        fprintf(stderr, "mmrt-frag: the recording failed (out of host memory or a free of "
                "an unknown block)\n");
        rc = 1;
    }
    mmrt_destroy(rt);
    free(rec.ev);
    free(rec.live);
    return rc;
}

int main(int argc, char **argv)
{
    const char *src = getenv("MMRT_SOURCE_DIR");
    char model[4096], images[4][4200];
    snprintf(model, sizeof model, "%s/tests/fixtures/qwen2vl-tiny", src ? src : ".");
    int n_req = 1000, json = 0, conc = 1;
    long long seed = 1;
    static const struct option longopts[] = {
        { "model", required_argument, NULL, 'm' }, { "requests", required_argument, NULL, 'n' },
        { "seed", required_argument, NULL, 's' },  { "json", no_argument, NULL, 'j' },
        { "concurrency", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },        { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm': snprintf(model, sizeof model, "%s", optarg); break;
        case 'n': n_req = atoi(optarg); break;
        case 's': seed = atoll(optarg); break;
        case 'j': json = 1; break;
        case 'c': conc = atoi(optarg); break;
        default:
            fprintf(opt == 'h' ? stdout : stderr, "usage: mmrt-frag [--model DIR] [--requests "
                    "N] [--concurrency C] [--seed S] [--json]\n"
                    "(images: $MMRT_SOURCE_DIR/tests/fixtures)\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    if (conc < 1 || conc > MAX_CONCURRENCY) {
        fprintf(stderr, "mmrt-frag: --concurrency must be 1 … %d\n", MAX_CONCURRENCY);
        return 2;
    }
    if (n_req < 1 || n_req > 1000000) {
        fprintf(stderr, "mmrt-frag: --requests must be 1 … 1000000\n");
        return 2;
    }
    /* four sizes, four patch grids of the Qwen2-VL fixture's processor: 2×3, 4×2, 2×4, 3×3
     * merged tokens */
    static const char *const names[4] = { "llava-images/grad_45x90.png",
                                          "qwen2vl-images/grad_98x70.png",
                                          "llava-images/grad_36x100.png",
                                          "llava-images/grad_64x64.png" };
    const char *img[4];
    for (int i = 0; i < 4; i++) {
        snprintf(images[i], sizeof images[i], "%s/tests/fixtures/%s", src ? src : ".", names[i]);
        img[i] = images[i];
    }
    struct figures fig[2];
    const enum mmrt_level1 modes[2] = { MMRT_LEVEL1_ON, MMRT_LEVEL1_OFF };
    for (int m = 0; m < 2; m++) {
        int rc = run_mode(model, n_req, conc, (uint64_t)seed, modes[m], img, &fig[m]);
        if (rc)
            return rc;
    }
    if (json) {
        printf("{\"model\": \"%s\", \"requests\": %d, \"concurrency\": %d, \"seed\": %lld, "
               "\"modes\": [", model, n_req, conc, seed);
        for (int m = 0; m < 2; m++)
            printf("%s{\"level1\": \"%s\", \"pool_bytes\": %llu, \"min_block\": %llu, "
                   "\"held_end\": %llu, \"peak_held\": %llu, \"peak_requested\": %llu, "
                   "\"fragmentation_at_peak\": %.4f, \"external_fragmentation_end\": %.4f, "
                   "\"level1_hits\": %llu, \"level1_misses\": %llu, \"pool_calls\": %llu, "
                   "\"smallest_pool\": %llu}", m ? ", " : "", m ? "off" : "on",
                   (unsigned long long)fig[m].capacity, (unsigned long long)fig[m].min_block,
                   (unsigned long long)fig[m].held_end, (unsigned long long)fig[m].peak_held,
                   (unsigned long long)fig[m].peak_requested, fig[m].frag_at_peak,
                   fig[m].ext_frag_end, (unsigned long long)fig[m].l1_hits,
                   (unsigned long long)fig[m].l1_misses, (unsigned long long)fig[m].n_events,
                   (unsigned long long)fig[m].smallest);
        printf("]}\n");
        return 0;
    }
    printf("%d requests (%d at a time), %s, pool %llu KiB (auto), min block %llu B, %llu pool "
           "calls\n", n_req, conc, model, (unsigned long long)(fig[0].capacity >> 10),
           (unsigned long long)fig[0].min_block, (unsigned long long)fig[0].n_events);
    printf("| | level 1 + 2 | buddy alone (level1 = off) |\n|---|---:|---:|\n");
    printf("| bytes held after the last request | %llu | %llu |\n",
           (unsigned long long)fig[0].held_end, (unsigned long long)fig[1].held_end);
    printf("| peak bytes held | %llu | %llu |\n", (unsigned long long)fig[0].peak_held,
           (unsigned long long)fig[1].peak_held);
    printf("| peak bytes requested | %llu | %llu |\n",
           (unsigned long long)fig[0].peak_requested, (unsigned long long)fig[1].peak_requested);
    printf("| fragmentation at the peak (1 − requested / held) | %.1f%% | %.1f%% |\n",
           100 * fig[0].frag_at_peak, 100 * fig[1].frag_at_peak);
    printf("| external fragmentation after the last request | %.1f%% | %.1f%% |\n",
           100 * fig[0].ext_frag_end, 100 * fig[1].ext_frag_end);
    printf("| level-1 hits / misses | %llu / %llu | – |\n", (unsigned long long)fig[0].l1_hits,
           (unsigned long long)fig[0].l1_misses);
    printf("| smallest pool that runs the workload | %llu | %llu |\n",
           (unsigned long long)fig[0].smallest, (unsigned long long)fig[1].smallest);
    return 0;
}
