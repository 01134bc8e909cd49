/*
 * tests/test_engine.c — the generation engine (core/engine.h) on the tiny fixtures of all four
 * model types: requests batched together, prefilled in chunks, preempted when KV pages run
 * out, failed or stopped in the middle of a batch, each give exactly what they give alone.
 *
 * "Exactly" is bit for bit: every logits row of every step, and every token, of a request
 * run in company equals the same request run alone on the same runtime (specs/engine.md §5,
 * batch invariance). Chunked prefill changes how a prompt's attention is blocked, so chunked
 * against unchunked is held to the golden tolerance and identical tokens instead.
 */
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "formats/file.h"
#include "formats/tokenizer.h"
#include "golden.h"
#include "json_grammar.h"

#define MAX_CASES GOLDEN_MAX_CASES
/* Bound on the worst relative logits error of an FP8 KV cache against F32 on fuyu-tiny:
 * 0.074 measured on the CPU plugin, twice that allowed (F16 measures 0.00075). */
#define FP8_KV_WORST_REL_ERR 0.15
/* The same for an INT8 KV cache (a scale per token and head): 0.016 measured, 2.5 × that
 * allowed. */
#define INT8_KV_WORST_REL_ERR 0.04

struct setup {
    const char *vision_plugin; /* NULL: both stages on one CPU device */
    bool graph;                /* CPU devices capture the decode step */
    int max_batch;
    int64_t prefill_chunk, max_kv_tokens, kv_page_tokens;
    enum mmrt_kv_dtype kv_dtype;
    double image_kv_keep;      /* 0: no image-token KV compression */
    enum mmrt_image_kv_policy image_kv_policy;
    bool no_prefix_cache;
    int draft_tokens, draft_rows;
};

static struct mmrt_runtime *open_rt(const char *fixture, const struct setup *s)
{
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, fixture);
    static const struct mmrt_option graph_on = { .key = "graph", .value = "1" };
    /* MMRT_TEST_PLUGIN moves the language stage (tools/gpu-check.sh: cuda). */
    const char *lang = getenv("MMRT_TEST_PLUGIN") && *getenv("MMRT_TEST_PLUGIN")
                           ? getenv("MMRT_TEST_PLUGIN") : "cpu";
    struct mmrt_device_config devs[2] = {
        { .name = "l", .plugin = lang, .pool_mb = 64 },
        { .name = "v", .plugin = s->vision_plugin ? s->vision_plugin : "cpu", .pool_mb = 64 },
    };
    for (int i = 0; i < 2 && s->graph; i++)
        if (strcmp(devs[i].plugin, "cpu") == 0)
            devs[i].options = &graph_on, devs[i].n_options = 1;
    struct mmrt_config cfg = {
        .struct_size = sizeof cfg,
        .model_path = dir, .devices = devs, .n_devices = s->vision_plugin ? 2 : 1,
        .vision_device = s->vision_plugin ? "v" : NULL, .max_batch = s->max_batch,
        .prefill_chunk = s->prefill_chunk, .max_kv_tokens = s->max_kv_tokens,
        .kv_page_tokens = s->kv_page_tokens,
        .kv_dtype = s->kv_dtype,
        .image_kv_keep = s->image_kv_keep, .image_kv_policy = s->image_kv_policy,
        .prefix_cache = s->no_prefix_cache ? -1 : 0,
        .draft_tokens = s->draft_tokens, .draft_rows = s->draft_rows,
    };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", fixture, err);
    return rt;
}

/* Each request alone, traced. */
static void run_solo(struct mmrt_runtime *rt, const struct golden_cases *c, struct golden_capture *caps)
{
    for (int i = 0; i < c->n; i++) {
        struct mmrt_model_trace trace;
        golden_trace(&caps[i], &trace);
        struct mmrt_result res = { 0 };
        if (mmrt_run_traced(rt, &c->req[i], &trace, golden_on_token, &caps[i], &res) != MMRT_OK)
            fail_msg("solo request %d: %s", i, mmrt_last_error(rt));
    }
}

struct batch_user {
    struct golden_capture *caps;
    int stop_request, stop_after; /* the callback of stop_request says stop at that token */
};

static bool on_batch_token(void *user, int request, int32_t id, const char *text)
{
    struct batch_user *u = user;
    golden_on_token(&u->caps[request], id, text);
    return !(request == u->stop_request && u->caps[request].n_tokens == u->stop_after);
}

/* All requests through one mmrt_run_batch, traced; returns its status. */
static mmrt_status run_batch(struct mmrt_runtime *rt, const struct mmrt_request *reqs, int n,
                             struct golden_capture *caps, struct mmrt_result *res,
                             int stop_request, int stop_after)
{
    struct mmrt_model_trace traces[MAX_CASES];
    for (int i = 0; i < n; i++)
        golden_trace(&caps[i], &traces[i]);
    struct batch_user u = { caps, stop_request, stop_after };
    return mmrt_run_batch_traced(rt, reqs, n, traces, on_batch_token, &u, res);
}

static void same_run(const char *what, int i, const struct golden_capture *a,
                     const struct golden_capture *b, bool bitwise)
{
    if (a->n_tokens != b->n_tokens || memcmp(a->tokens, b->tokens,
                                             (size_t)a->n_tokens * sizeof a->tokens[0]) != 0)
        fail_msg("%s: request %d: %d tokens, alone %d (or different ids)", what, i,
                 a->n_tokens, b->n_tokens);
    for (int s = 0; s < GOLDEN_MAX_STEPS; s++) {
        if (!a->logits[s] || !b->logits[s]) {
            assert_true(!a->logits[s] && !b->logits[s]);
            break;
        }
        if (bitwise) {
            if (memcmp(a->logits[s], b->logits[s], (size_t)a->vocab * sizeof(float)) != 0)
                fail_msg("%s: request %d: the logits of step %d differ from its solo run "
                         "(rel %.3g)", what, i, s,
                         golden_rel_err(a->logits[s], b->logits[s], a->vocab));
        } else if (golden_rel_err(a->logits[s], b->logits[s], a->vocab) > GOLDEN_REL_TOL) {
            fail_msg("%s: request %d: step %d logits off by %.3g", what, i, s,
                     golden_rel_err(a->logits[s], b->logits[s], a->vocab));
        }
    }
}

static void free_caps(struct golden_capture *caps, int n)
{
    for (int i = 0; i < n; i++)
        golden_capture_free(&caps[i]);
}

static void assert_pages_back(struct mmrt_runtime *rt)
{
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    assert_int_equal(mr.kv_pages_used, 0);
}

/* Every case of the fixture batched against alone, on one runtime. */
static void check_batch(const char *fixture, const struct setup *s, bool expect_preemption)
{
    struct golden_cases c;
    golden_cases_load(fixture, &c);
    struct mmrt_runtime *rt = open_rt(fixture, s);
    struct golden_capture solo[MAX_CASES] = { { 0 } }, batch[MAX_CASES] = { { 0 } };
    struct mmrt_result res[MAX_CASES] = { { 0 } };
    run_solo(rt, &c, solo);
    struct mmrt_engine_stats before, after;
    mmrt_runtime_engine_stats(rt, &before);
    if (run_batch(rt, c.req, c.n, batch, res, -1, 0) != MMRT_OK)
        fail_msg("%s batch: %s", fixture, mmrt_last_error(rt));
    mmrt_runtime_engine_stats(rt, &after);
    for (int i = 0; i < c.n; i++)
        same_run(fixture, i, &batch[i], &solo[i], true);
    /* The requests really ran together (unless the vision stage, on its own device, is
     * slower than the language stage: then each request is done before the next arrives),
     * and preempted ones were recomputed. */
    if (!s->vision_plugin) {
        assert_true(after.max_running > 1);
        assert_true(after.decode_forwards - before.decode_forwards <
                    after.decode_rows - before.decode_rows);
    }
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "%s: steps %llu decode fwd %llu rows %llu prefill fwd %llu rows %llu "
                "preempt %llu replay %llu max_running %d prefix hits %llu reused %llu\n", fixture,
                (unsigned long long)(after.steps - before.steps),
                (unsigned long long)(after.decode_forwards - before.decode_forwards),
                (unsigned long long)(after.decode_rows - before.decode_rows),
                (unsigned long long)(after.prefill_forwards - before.prefill_forwards),
                (unsigned long long)(after.prefill_rows - before.prefill_rows),
                (unsigned long long)(after.preemptions - before.preemptions),
                (unsigned long long)(after.replay_rows - before.replay_rows), after.max_running,
                (unsigned long long)(after.prefix_hits - before.prefix_hits),
                (unsigned long long)(after.prefix_reused_tokens - before.prefix_reused_tokens));
    if (s->image_kv_keep > 0 && s->image_kv_keep < 1) {
        assert_true(after.image_kv_compressions > before.image_kv_compressions);
        assert_true(after.image_kv_dropped_tokens > before.image_kv_dropped_tokens);
    }
    if (expect_preemption) {
        assert_true(after.preemptions > before.preemptions);
        assert_true(after.replay_rows > before.replay_rows);
    }
    assert_pages_back(rt);
    free_caps(solo, c.n);
    free_caps(batch, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

static void test_batch_llava(void **state)
{
    (void)state;
    check_batch("llava-tiny", &(struct setup){ 0 }, false);
}

static void test_batch_llava_next(void **state)
{
    (void)state;
    check_batch("llava-next-tiny", &(struct setup){ 0 }, false);
}

static void test_batch_fuyu(void **state)
{
    (void)state;
    check_batch("fuyu-tiny", &(struct setup){ 0 }, false);
}

static void test_batch_qwen2vl(void **state)
{
    (void)state;
    check_batch("qwen2vl-tiny", &(struct setup){ 0 }, false);
}

/* Prompts cut into chunks of 8 (several chunks each, merged forwards of chunks above
 * MMRT_SMALL_M rows do not happen at 8: each chunk runs alone) and of 40 (merged). */
static void test_batch_chunked(void **state)
{
    (void)state;
    check_batch("llava-next-tiny", &(struct setup){ .prefill_chunk = 8 }, false);
    check_batch("llava-next-tiny", &(struct setup){ .prefill_chunk = 40 }, false);
    check_batch("qwen2vl-tiny", &(struct setup){ .prefill_chunk = 40 }, false);
}

/* The batched decode step captured as a graph per batch size and replayed. */
static void test_batch_graph(void **state)
{
    (void)state;
    check_batch("qwen2vl-tiny", &(struct setup){ .graph = true }, false);
    check_batch("fuyu-tiny", &(struct setup){ .graph = true, .max_batch = 3 }, false);
}

/* A KV store too small for every request at once: the youngest is preempted, recomputed on
 * resume, and still gives its solo bits. */
static void test_batch_preempted(void **state)
{
    (void)state;
    /* llava-tiny prompts are 33 … 45 tokens plus 16 generated: 96 positions hold two. */
    check_batch("llava-tiny", &(struct setup){ .max_kv_tokens = 96, .kv_page_tokens = 4 },
                true);
    check_batch("qwen2vl-tiny",
                &(struct setup){ .max_kv_tokens = 136, .kv_page_tokens = 8,
                                 .prefill_chunk = 16 },
                true);
}

/* Mistral's sliding window (llava-tiny-swa, window 12): batched requests give their solo bits
 * (the window is per sequence, in positions), also with prompts in chunks shorter than the
 * window and pages of 4 (windows start mid-page), with the decode step captured, with the
 * solo runs' cached prompt prefixes shared by the batch, and when the youngest is preempted
 * and recomputed. */
static void test_batch_sliding_window(void **state)
{
    (void)state;
    check_batch("llava-tiny-swa", &(struct setup){ 0 }, false);
    check_batch("llava-tiny-swa",
                &(struct setup){ .prefill_chunk = 5, .kv_page_tokens = 4, .graph = true }, false);
    /* prompts of 33 … 45 positions plus 16 generated: 96 positions hold two */
    check_batch("llava-tiny-swa",
                &(struct setup){ .max_kv_tokens = 96, .kv_page_tokens = 4, .prefill_chunk = 16 },
                true);
    check_batch("llava-tiny-swa", &(struct setup){ .kv_dtype = MMRT_KV_F16, .no_prefix_cache = true },
                false);
}

/* Image-token KV compression: every policy on every model type, batched against alone (the
 * compacted cache is the sequence's own business), with a captured decode step, with the
 * prompt prefixes cached by the solo runs shared by the batch (their pages are copied, not
 * rewritten), and preempted sequences that compress again on resume. */
static void test_batch_image_kv(void **state)
{
    (void)state;
    check_batch("llava-tiny", &(struct setup){ .image_kv_keep = 0.5,
                                               .image_kv_policy = MMRT_IMAGE_KV_RANDOM }, false);
    check_batch("llava-next-tiny",
                &(struct setup){ .image_kv_keep = 0.25,
                                 .image_kv_policy = MMRT_IMAGE_KV_POOL2X2 }, false);
    check_batch("qwen2vl-tiny",
                &(struct setup){ .image_kv_keep = 0.25, .prefill_chunk = 16,
                                 .image_kv_policy = MMRT_IMAGE_KV_KEY_NORM_LOW }, false);
    check_batch("fuyu-tiny", &(struct setup){ .image_kv_keep = 0.1, .graph = true,
                                              .image_kv_policy = MMRT_IMAGE_KV_KEY_NORM_HIGH },
                false);
    check_batch("llava-tiny",
                &(struct setup){ .max_kv_tokens = 96, .kv_page_tokens = 4,
                                 .image_kv_keep = 0.75, .prefill_chunk = 8,
                                 .image_kv_policy = MMRT_IMAGE_KV_KEY_NORM_HIGH }, true);
    /* The store of the model's context only: the copies of shared pages run short of free
     * pages in the batch and take them from cached prefixes and younger sequences. */
    check_batch("llava-tiny", &(struct setup){ .kv_page_tokens = 4, .image_kv_keep = 0.75,
                                               .prefill_chunk = 8,
                                               .image_kv_policy = MMRT_IMAGE_KV_RANDOM },
                false);
    check_batch("qwen2vl-tiny",
                &(struct setup){ .kv_dtype = MMRT_KV_F16, .image_kv_keep = 0.5, .kv_page_tokens = 8,
                                 .prefill_chunk = 8, .image_kv_policy = MMRT_IMAGE_KV_POOL2X2 },
                false);
}

/* Compression changes what decode attends to, and nothing before it: the first token comes
 * from the prefill's logits, bit for bit those of the uncompressed run; later steps differ
 * (at a keep ratio this low on the tiny fixtures, somewhere). The pages it frees are back in
 * the store while the request decodes. */
static void test_image_kv_effect(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct mmrt_runtime *full = open_rt("llava-tiny", &(struct setup){ 0 });
    struct mmrt_runtime *cut = open_rt("llava-tiny",
                                       &(struct setup){ .image_kv_keep = 0.1,
                                                        .image_kv_policy =
                                                            MMRT_IMAGE_KV_KEY_NORM_HIGH });
    struct golden_capture a[MAX_CASES] = { { 0 } }, b[MAX_CASES] = { { 0 } };
    run_solo(full, &c, a);
    run_solo(cut, &c, b);
    bool differ = false;
    for (int i = 0; i < c.n; i++) {
        assert_non_null(a[i].logits[0]);
        assert_memory_equal(a[i].logits[0], b[i].logits[0], (size_t)a[i].vocab * sizeof(float));
        for (int s = 1; s < GOLDEN_MAX_STEPS && a[i].logits[s] && b[i].logits[s]; s++)
            differ |= memcmp(a[i].logits[s], b[i].logits[s],
                             (size_t)a[i].vocab * sizeof(float)) != 0;
    }
    assert_true(differ);
    struct mmrt_engine_stats st;
    mmrt_runtime_engine_stats(cut, &st);
    assert_true(st.image_kv_dropped_tokens > 0);
    free_caps(a, c.n);
    free_caps(b, c.n);
    mmrt_destroy(full);
    mmrt_destroy(cut);
    json_decref(c.json);
}

static void test_batch_vision_on_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    check_batch("llava-tiny", &(struct setup){ .vision_plugin = "opencl" }, false);
    check_batch("qwen2vl-tiny", &(struct setup){ .vision_plugin = "opencl" }, false);
}

/* fuyu-tiny with the KV cache stored as kv (printed as name) against the F32 cache: the store
 * takes bytes_num / bytes_den of F32's bytes per position, and the worst relative logits
 * error over the golden cases is above 0 (the cache really is narrow) and below bound. */
static void kv_dtype_against_f32(enum mmrt_kv_dtype kv, const char *name, int64_t bytes_num,
                                 int64_t bytes_den, double bound)
{
    struct golden_cases c;
    golden_cases_load("fuyu-tiny", &c);
    struct mmrt_runtime *f32 = open_rt("fuyu-tiny", &(struct setup){ 0 });
    struct mmrt_runtime *nar = open_rt("fuyu-tiny", &(struct setup){ .kv_dtype = kv });
    struct mmrt_memory_report a = { .struct_size = sizeof a }, b = { .struct_size = sizeof b };
    assert_int_equal(mmrt_device_memory(f32, 0, &a), MMRT_OK);
    assert_int_equal(mmrt_device_memory(nar, 0, &b), MMRT_OK);
    assert_int_equal(b.kv_bytes * bytes_den * (a.kv_pages_total * a.kv_page_tokens),
                     a.kv_bytes * bytes_num * (b.kv_pages_total * b.kv_page_tokens));
    struct golden_capture x[MAX_CASES] = { { 0 } }, y[MAX_CASES] = { { 0 } };
    run_solo(f32, &c, x);
    run_solo(nar, &c, y);
    double worst = 0;
    for (int i = 0; i < c.n; i++)
        for (int st = 0; st < GOLDEN_MAX_STEPS && x[i].logits[st] && y[i].logits[st]; st++) {
            double e = golden_rel_err(y[i].logits[st], x[i].logits[st], x[i].vocab);
            worst = e > worst ? e : worst;
        }
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "fuyu-tiny: %s KV against F32: worst logits rel err %.3g\n", name, worst);
    assert_true(worst > 0);
    assert_true(worst < bound);
    free_caps(x, c.n);
    free_caps(y, c.n);
    mmrt_destroy(nar);
    mmrt_destroy(f32);
    json_decref(c.json);
}

/* An F16 KV cache: batched requests still give their solo bits (the rounding is per row), and
 * against the F32 cache the logits move by what rounding K and V to F16 costs. */
static void test_kv_f16(void **state)
{
    (void)state;
    check_batch("llava-tiny", &(struct setup){ .kv_dtype = MMRT_KV_F16 }, false);
    check_batch("qwen2vl-tiny", &(struct setup){ .kv_dtype = MMRT_KV_F16, .prefill_chunk = 16 }, false);
    kv_dtype_against_f32(MMRT_KV_F16, "F16", 1, 2, 0.05);
}

/* An INT8 KV cache (ABI 1.7, row scales): batched, preempted and chunked requests give their
 * solo bits (each row is quantized alone, and attention reads code · scale), with a captured
 * decode step, a sliding window and image-token KV compression (which gathers dequantized
 * rows and writes them back through SET_ROWS); the store holds a byte a value plus a scale
 * per token and head; the logits stay within a bound of the F32 cache's. */
static void test_kv_int8(void **state)
{
    (void)state;
    check_batch("llava-tiny", &(struct setup){ .kv_dtype = MMRT_KV_INT8 }, false);
    check_batch("qwen2vl-tiny", &(struct setup){ .kv_dtype = MMRT_KV_INT8, .prefill_chunk = 16 },
                false);
    check_batch("llava-tiny-swa", &(struct setup){ .kv_dtype = MMRT_KV_INT8,
                                                   .no_prefix_cache = true }, false);
    check_batch("llava-tiny", &(struct setup){ .kv_dtype = MMRT_KV_INT8, .max_kv_tokens = 96,
                                               .kv_page_tokens = 4, .prefill_chunk = 8 },
                true);
    check_batch("fuyu-tiny", &(struct setup){ .kv_dtype = MMRT_KV_INT8, .image_kv_keep = 0.5,
                                              .graph = true,
                                              .image_kv_policy = MMRT_IMAGE_KV_KEY_NORM_HIGH },
                false);
    check_batch("llava-next-tiny", &(struct setup){ .kv_dtype = MMRT_KV_INT8,
                                                    .image_kv_keep = 0.25,
                                                    .image_kv_policy = MMRT_IMAGE_KV_POOL2X2 },
                false);
    /* Per position: a quarter of F32's bytes, plus a 4-byte scale per head_dim = 8 codes
     * (fuyu-tiny: hidden 32 in 4 heads), 12/32; a 7B model's head_dim of 128 pays 3 %. */
    kv_dtype_against_f32(MMRT_KV_INT8, "INT8", 8 + 4, 4 * 8, INT8_KV_WORST_REL_ERR);
}

/* An FP8 E4M3 KV cache (ABI 1.6): batched requests give their solo bits (conversion is per
 * element, attention widens exactly), the store is a quarter of F32's bytes per position, and
 * the logits move from the F32 cache's by what 3 mantissa bits cost — more than F16, still
 * bounded (the demo model's answer accuracy is test_demo_accuracy's). */
static void test_kv_fp8(void **state)
{
    (void)state;
    check_batch("llava-tiny", &(struct setup){ .kv_dtype = MMRT_KV_FP8 }, false);
    check_batch("qwen2vl-tiny", &(struct setup){ .kv_dtype = MMRT_KV_FP8, .prefill_chunk = 16 },
                false);
    check_batch("llava-tiny-swa", &(struct setup){ .kv_dtype = MMRT_KV_FP8,
                                                   .no_prefix_cache = true }, false);
    kv_dtype_against_f32(MMRT_KV_FP8, "FP8", 1, 4, FP8_KV_WORST_REL_ERR);
}

/* Chunked prefill against one chunk: the same tokens, logits within the golden tolerance. */
static void test_chunked_matches_whole(void **state)
{
    (void)state;
    const char *fixtures[] = { "llava-next-tiny", "fuyu-tiny", "qwen2vl-tiny" };
    for (int f = 0; f < 3; f++) {
        struct golden_cases c;
        golden_cases_load(fixtures[f], &c);
        struct mmrt_runtime *whole = open_rt(fixtures[f], &(struct setup){ 0 });
        struct mmrt_runtime *cut = open_rt(fixtures[f], &(struct setup){ .prefill_chunk = 5 });
        struct golden_capture a[MAX_CASES] = { { 0 } }, b[MAX_CASES] = { { 0 } };
        run_solo(whole, &c, a);
        run_solo(cut, &c, b);
        for (int i = 0; i < c.n; i++)
            same_run(fixtures[f], i, &b[i], &a[i], false);
        free_caps(a, c.n);
        free_caps(b, c.n);
        mmrt_destroy(cut);
        mmrt_destroy(whole);
        json_decref(c.json);
    }
}

/* A request that fails (an image that does not exist, a prompt over the context) or is
 * stopped by its callback in the middle of a batch leaves the others exactly as alone. */
static void test_batch_failures_stay_local(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct mmrt_runtime *rt = open_rt("llava-tiny", &(struct setup){ .max_batch = 4 });
    const int n = 6;
    struct golden_capture solo[MAX_CASES] = { { 0 } }, batch[MAX_CASES] = { { 0 } };
    run_solo(rt, &c, solo);
    struct mmrt_request reqs[MAX_CASES];
    memcpy(reqs, c.req, sizeof reqs);
    reqs[1].images = TEST_FILE("/nonexistent/cat.png");
    reqs[1].n_images = 1;
    reqs[3].max_tokens = 1 << 20; /* prompt + max_tokens beyond the context */
    struct mmrt_result res[MAX_CASES] = { { 0 } };
    mmrt_status st = run_batch(rt, reqs, n, batch, res, 4, 3);
    assert_int_not_equal(st, MMRT_OK);
    assert_non_null(strstr(mmrt_last_error(rt), "request 1: "));
    assert_int_not_equal(res[1].status, MMRT_OK);
    assert_non_null(strstr(res[1].error, "/nonexistent/cat.png"));
    assert_int_equal(res[3].status, MMRT_ERR_LIMIT);
    assert_non_null(strstr(res[3].error, "context"));
    assert_int_equal(batch[1].n_tokens, 0);
    assert_int_equal(batch[3].n_tokens, 0);
    /* request 4 stopped itself after 3 tokens: those are its solo run's first 3 */
    assert_int_equal(res[4].status, MMRT_OK);
    assert_int_equal(res[4].n_tokens, 3);
    assert_int_equal(batch[4].n_tokens, 3);
    assert_memory_equal(batch[4].tokens, solo[4].tokens, 3 * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        if (i != 1 && i != 3 && i != 4) {
            assert_int_equal(res[i].status, MMRT_OK);
            same_run("llava-tiny with failures", i, &batch[i], &solo[i], true);
        }
    assert_pages_back(rt);
    free_caps(solo, c.n);
    free_caps(batch, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* ---- asynchronous jobs ---- */

struct submitter {
    struct mmrt_runtime *rt;
    const struct golden_cases *c;
    int first, n;                 /* cases [first, first + n) */
    struct golden_capture *caps;
    struct mmrt_job *jobs[MAX_CASES];
    mmrt_status st;
};

static void *submit_some(void *arg)
{
    struct submitter *s = arg;
    for (int i = s->first; i < s->first + s->n && s->st == MMRT_OK; i++)
        s->st = mmrt_submit(s->rt, &s->c->req[i], golden_on_token, &s->caps[i], &s->jobs[i],
                            NULL, 0);
    return NULL;
}

/* Jobs submitted from three threads at once run together on the worker and give the tokens
 * of their solo runs. */
static void test_submit_from_threads(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct mmrt_runtime *rt = open_rt("llava-tiny", &(struct setup){ 0 });
    struct golden_capture solo[MAX_CASES] = { { 0 } }, got[MAX_CASES] = { { 0 } };
    run_solo(rt, &c, solo);
    struct submitter sub[3];
    pthread_t th[3];
    const int per = (c.n + 2) / 3;
    for (int t = 0; t < 3; t++) {
        const int first = t * per, n = first + per > c.n ? c.n - first : per;
        sub[t] = (struct submitter){ rt, &c, first, n, got, { NULL }, MMRT_OK };
        assert_int_equal(pthread_create(&th[t], NULL, submit_some, &sub[t]), 0);
    }
    for (int t = 0; t < 3; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(sub[t].st, MMRT_OK);
    }
    for (int t = 0; t < 3; t++)
        for (int i = sub[t].first; i < sub[t].first + sub[t].n; i++) {
            struct mmrt_result res = { 0 };
            assert_int_equal(mmrt_wait(sub[t].jobs[i], &res), MMRT_OK);
            assert_int_equal(res.n_tokens, solo[i].n_tokens);
            assert_int_equal(got[i].n_tokens, solo[i].n_tokens);
            assert_memory_equal(got[i].tokens, solo[i].tokens,
                                (size_t)solo[i].n_tokens * sizeof(int32_t));
        }
    assert_pages_back(rt);
    free_caps(solo, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* A job cancelled from another thread while it streams ends with MMRT_ERR_CANCELLED after
 * the tokens it had delivered, and its neighbours are untouched. */
struct cancel_user {
    struct golden_capture cap;
    sem_t reached, cancelled;
    int at;                       /* tokens before the callback waits for the cancel */
};

static bool cancel_token(void *user, int32_t id, const char *text)
{
    struct cancel_user *u = user;
    golden_on_token(&u->cap, id, text);
    if (id >= 0 && u->cap.n_tokens == u->at) {
        sem_post(&u->reached);
        sem_wait(&u->cancelled);
    }
    return true;
}

static void test_cancel_job(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("qwen2vl-tiny", &c);
    struct mmrt_runtime *rt = open_rt("qwen2vl-tiny", &(struct setup){ 0 });
    struct golden_capture solo[MAX_CASES] = { { 0 } }, got[MAX_CASES] = { { 0 } };
    run_solo(rt, &c, solo);
    struct cancel_user cu = { .at = 2 };
    sem_init(&cu.reached, 0, 0);
    sem_init(&cu.cancelled, 0, 0);
    struct mmrt_job *jobs[MAX_CASES];
    for (int i = 0; i < 3; i++)
        assert_int_equal(mmrt_submit(rt, &c.req[i], i == 1 ? cancel_token : golden_on_token,
                                     i == 1 ? (void *)&cu : (void *)&got[i], &jobs[i], NULL,
                                     0),
                         MMRT_OK);
    sem_wait(&cu.reached);
    mmrt_cancel(jobs[1]);
    sem_post(&cu.cancelled);
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_wait(jobs[1], &res), MMRT_ERR_CANCELLED);
    assert_int_equal(res.status, MMRT_ERR_CANCELLED);
    assert_int_equal(cu.cap.n_tokens, 2);
    assert_memory_equal(cu.cap.tokens, solo[1].tokens, 2 * sizeof(int32_t));
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(mmrt_wait(jobs[i], &res), MMRT_OK);
        assert_int_equal(got[i].n_tokens, solo[i].n_tokens);
        assert_memory_equal(got[i].tokens, solo[i].tokens,
                            (size_t)solo[i].n_tokens * sizeof(int32_t));
    }
    /* A job that fails (an image that does not exist) reports it through its result. */
    struct mmrt_request bad = c.req[0];
    bad.images = TEST_FILE("/nonexistent/x.png");
    bad.n_images = 1;
    struct mmrt_job *j;
    assert_int_equal(mmrt_submit(rt, &bad, NULL, NULL, &j, NULL, 0), MMRT_OK);
    assert_int_not_equal(mmrt_wait(j, &res), MMRT_OK);
    assert_non_null(strstr(res.error, "/nonexistent/x.png"));
    assert_pages_back(rt);
    /* A message longer than the first layout's error[512] (a 700-byte path) arrives whole in
     * `message` for a caller of this layout; `error` holds its first 511 bytes. */
    char long_path[720] = "/nonexistent/";
    memset(long_path + 13, 'a', 690);
    strcpy(long_path + 703, "/y.png");
    bad.images = TEST_FILE(long_path);
    assert_int_equal(mmrt_submit(rt, &bad, NULL, NULL, &j, NULL, 0), MMRT_OK);
    res.struct_size = sizeof res; /* the layout with `message` */
    assert_int_not_equal(mmrt_wait(j, &res), MMRT_OK);
    if (!strstr(res.message, long_path))
        fail_msg("message lacks the path: %s", res.message);
    assert_int_equal(strlen(res.error), sizeof res.error - 1);
    assert_memory_equal(res.error, res.message, sizeof res.error - 1);
    assert_pages_back(rt);
    /* A job left un-waited is cancelled and freed by mmrt_destroy. */
    /* A malformed request is refused at submission, its message in the caller's buffer. */
    char msg[256];
    const struct mmrt_message tool = { .role = "tool", .text = "x" };
    struct mmrt_request malformed = { .messages = &tool, .n_messages = 1, .max_tokens = 2 };
    assert_int_equal(mmrt_submit(rt, &malformed, NULL, NULL, &j, msg, sizeof msg),
                     MMRT_ERR_INVALID_ARG);
    assert_null(j);
    assert_non_null(strstr(msg, "message 0 has role 'tool'"));
    const struct mmrt_image_input huge = { .data = "x", .size = (size_t)1 << 40 };
    malformed = (struct mmrt_request){ .images = &huge, .n_images = 1, .max_tokens = 2 };
    assert_int_equal(mmrt_submit(rt, &malformed, NULL, NULL, &j, msg, sizeof msg),
                     MMRT_ERR_LIMIT);
    assert_non_null(strstr(msg, "images[0] has 1099511627776 bytes"));
    assert_int_equal(mmrt_submit(rt, &c.req[2], NULL, NULL, &j, NULL, 0), MMRT_OK);
    sem_destroy(&cu.reached);
    sem_destroy(&cu.cancelled);
    golden_capture_free(&cu.cap);
    free_caps(solo, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* ---- the request: images in memory, chats, struct sizes ---- */

static void run_tokens(struct mmrt_runtime *rt, const struct mmrt_request *req,
                       struct golden_capture *cap)
{
    struct mmrt_model_trace trace;
    golden_trace(cap, &trace);
    struct mmrt_result res = { 0 };
    if (mmrt_run_traced(rt, req, &trace, golden_on_token, cap, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
}

static void expect_invalid(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           const char *part)
{
    struct mmrt_result res = { 0 };
    mmrt_status st = mmrt_run(rt, req, NULL, NULL, &res);
    if (st != MMRT_ERR_INVALID_ARG || !strstr(mmrt_last_error(rt), part))
        fail_msg("expected MMRT_ERR_INVALID_ARG with '%s', got %d: %s", part, st,
                 mmrt_last_error(rt));
}

/* An image as bytes in memory, a prompt as a one-turn chat, and the same request with an
 * explicit struct_size all give the file-and-prompt request's tokens; chats render through
 * the model's template; malformed chats are refused naming the message. */
static void test_request_forms(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("qwen2vl-tiny", &c);
    struct mmrt_runtime *rt = open_rt("qwen2vl-tiny", &(struct setup){ 0 });
    const struct mmrt_request *base = &c.req[0];
    struct golden_capture want = { 0 }, got = { 0 };
    run_tokens(rt, base, &want);

    size_t size;
    char *bytes = NULL;
    struct mmrt_error ferr = { 0 };
    assert_int_equal(mmrt_file_read(base->images[0].path, 1 << 24, 0, NULL, &bytes, &size,
                                    &ferr), MMRT_OK);
    const struct mmrt_image_input mem = { .data = bytes, .size = size };
    struct mmrt_request r = *base;
    r.images = &mem;
    run_tokens(rt, &r, &got);
    same_run("image in memory", 0, &got, &want, true);
    golden_capture_free(&got);

    const struct mmrt_message user = { .role = "user", .text = base->prompt, .n_images = 1 };
    r = *base;
    r.prompt = NULL;
    r.messages = &user;
    r.n_messages = 1;
    r.struct_size = sizeof r;
    run_tokens(rt, &r, &got);
    same_run("one-turn chat", 0, &got, &want, true);
    assert_int_equal(got.n_prompt, want.n_prompt);
    assert_memory_equal(got.prompt, want.prompt, (size_t)want.n_prompt * sizeof(int32_t));
    golden_capture_free(&got);

    /* A multi-turn chat with its own system turn: Qwen2-VL's template keeps it (no default
     * system turn) and the earlier answer is part of the prompt. */
    const struct mmrt_message chat[4] = {
        { .role = "system", .text = "Be brief." },
        { .role = "user", .text = base->prompt, .n_images = 1 },
        { .role = "assistant", .text = "A gradient." },
        { .role = "user", .text = "Which colours?" },
    };
    r.messages = chat;
    r.n_messages = 4;
    run_tokens(rt, &r, &got);
    assert_true(got.n_prompt > want.n_prompt);
    assert_true(got.n_tokens > 0);
    golden_capture_free(&got);

    /* What the chat must not be. */
    const struct mmrt_message bad_role[2] = { { .role = "user", .text = "hi", .n_images = 1 },
                                              { .role = "tool", .text = "x" } };
    r.messages = bad_role;
    r.n_messages = 2;
    expect_invalid(rt, &r, "message 1 has role 'tool'");
    const struct mmrt_message img_in_answer[2] = {
        { .role = "user", .text = "hi" }, { .role = "assistant", .text = "x", .n_images = 1 } };
    r.messages = img_in_answer;
    expect_invalid(rt, &r, "message 1 (assistant) carries 1 images");
    const struct mmrt_message ends_with_answer[2] = {
        { .role = "user", .text = "hi", .n_images = 1 }, { .role = "assistant", .text = "x" } };
    r.messages = ends_with_answer;
    expect_invalid(rt, &r, "message 1 is an assistant turn");
    const struct mmrt_message two_images[1] = { { .role = "user", .text = "hi", .n_images = 2 } };
    r.messages = two_images;
    r.n_messages = 1;
    expect_invalid(rt, &r, "the messages carry 2 images, the request has 1");
    r.messages = &user;
    r.prompt = "hi";
    expect_invalid(rt, &r, "give prompt or messages, not both");
    r = *base;
    r.struct_size = 4;
    expect_invalid(rt, &r, "struct_size 4 is smaller than the first layout");
    struct mmrt_result small = { .struct_size = 8 };
    assert_int_equal(mmrt_run(rt, base, NULL, NULL, &small), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "result: struct_size 8"));
    const struct mmrt_image_input neither = { 0 };
    r.struct_size = 0;
    r.images = &neither;
    expect_invalid(rt, &r, "images[0] needs a path or data (exactly one)");

    free(bytes);
    golden_capture_free(&want);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* The greedy token after step k's raw logits with the penalties of sampler.h, recomputed
 * here from the prompt and the tokens before k. */
static int32_t penalised_argmax(const struct golden_capture *cap, int k, float rep, float pres,
                                float freq)
{
    float *row = malloc((size_t)cap->vocab * sizeof *row);
    assert_non_null(row);
    const float *raw = cap->logits[k];
    memcpy(row, raw, (size_t)cap->vocab * sizeof *row);
    for (int i = 0; i < cap->n_prompt + k; i++) {
        const int32_t t = i < cap->n_prompt ? cap->prompt[i] : cap->tokens[i - cap->n_prompt];
        row[t] = raw[t] > 0 ? raw[t] / rep : raw[t] * rep;
    }
    for (int i = 0; i < k; i++) {
        const int32_t t = cap->tokens[i];
        row[t] = (raw[t] > 0 ? raw[t] / rep : raw[t] * rep) - pres;
    }
    for (int i = 0; i < k; i++)
        row[cap->tokens[i]] -= freq;
    int32_t best = 0;
    for (int32_t v = 1; v < cap->vocab; v++)
        if (row[v] > row[best])
            best = v;
    free(row);
    return best;
}

/* Penalties through the engine: each greedy token is the argmax of its step's logits
 * penalised by the prompt and the answer before it; every case batched gives what it gives
 * alone (a sequence is penalised by its own history); the answers differ from the plain
 * ones; out-of-range values are refused naming the field. */
static void test_penalties(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct mmrt_runtime *rt = open_rt("llava-tiny", &(struct setup){ .max_batch = 4 });
    struct golden_capture plain[MAX_CASES] = { 0 }, alone[MAX_CASES] = { 0 },
                          batched[MAX_CASES] = { 0 };
    run_solo(rt, &c, plain);
    struct golden_cases pc = c;
    for (int i = 0; i < c.n; i++) {
        pc.req[i].struct_size = sizeof pc.req[i]; /* the penalties are past the first layout */
        pc.req[i].repetition_penalty = 100.0f;
        pc.req[i].presence_penalty = 0.25f;
        pc.req[i].frequency_penalty = 0.5f;
    }
    run_solo(rt, &pc, alone);
    struct mmrt_result res[MAX_CASES] = { 0 };
    assert_int_equal(run_batch(rt, pc.req, pc.n, batched, res, -1, 0), MMRT_OK);
    bool changed = false;
    for (int i = 0; i < c.n; i++) {
        same_run("penalties, batched", i, &batched[i], &alone[i], true);
        for (int k = 0; k < alone[i].n_tokens && k < GOLDEN_MAX_STEPS && alone[i].logits[k];
             k++) {
            const int32_t want = penalised_argmax(&alone[i], k, 100.0f, 0.25f, 0.5f);
            if (alone[i].tokens[k] != want)
                fail_msg("case %d, step %d: token %d, the penalised argmax is %d", i, k,
                         alone[i].tokens[k], want);
        }
        changed |= alone[i].n_tokens != plain[i].n_tokens ||
                   memcmp(alone[i].tokens, plain[i].tokens,
                          (size_t)plain[i].n_tokens * sizeof plain[i].tokens[0]) != 0;
    }
    assert_true(changed);
    for (const char *const *f = (const char *const[]){ "repetition_penalty", "presence_penalty",
                                                       "frequency_penalty", NULL };
         *f; f++) {
        struct mmrt_request r = pc.req[0];
        if (strcmp(*f, "repetition_penalty") == 0)
            r.repetition_penalty = -1.0f;
        else if (strcmp(*f, "presence_penalty") == 0)
            r.presence_penalty = 3.0f;
        else
            r.frequency_penalty = -2.5f;
        expect_invalid(rt, &r, *f);
    }
    assert_pages_back(rt);
    free_caps(plain, c.n);
    free_caps(alone, c.n);
    free_caps(batched, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* What a job's callbacks saw: for each token its logprobs report and then its on_token. */
struct lp_record {
    struct mmrt_tokenizer *tok;
    int n;                       /* reports */
    int32_t id[GOLDEN_MAX_TOKENS];
    float lp[GOLDEN_MAX_TOKENS];
    int n_top[GOLDEN_MAX_TOKENS];
    struct mmrt_logprob top[GOLDEN_MAX_TOKENS][MMRT_MAX_TOP_LOGPROBS];
    int n_tokens;                /* on_token calls with an id */
    bool order_ok, text_ok;
};

/* text is what mmrt_tokenizer_decode gives id alone. */
static bool decoded_alone(const struct mmrt_tokenizer *tok, int32_t id, const char *text)
{
    char *want = NULL;
    size_t len = 0;
    struct mmrt_error e = { 0 };
    if (mmrt_tokenizer_decode(tok, &id, 1, 0, &want, &len, &e) != MMRT_OK)
        return false;
    /* A C string: a token whose text holds a NUL byte (<0x00>) is cut there. */
    const bool same = text && strcmp(text, want) == 0;
    free(want);
    return same;
}

static void lp_report(void *user, const struct mmrt_token_logprobs *lp)
{
    struct lp_record *r = user;
    r->order_ok &= r->n == r->n_tokens && lp->struct_size == sizeof *lp;
    r->text_ok &= decoded_alone(r->tok, lp->token.token_id, lp->token.text);
    for (int i = 0; i < lp->n_top; i++)
        r->text_ok &= decoded_alone(r->tok, lp->top[i].token_id, lp->top[i].text);
    if (r->n >= GOLDEN_MAX_TOKENS)
        return;
    r->id[r->n] = lp->token.token_id;
    r->lp[r->n] = lp->token.logprob;
    r->n_top[r->n] = lp->n_top;
    memcpy(r->top[r->n], lp->top, (size_t)lp->n_top * sizeof *lp->top);
    r->n++;
}

static bool lp_token(void *user, int32_t id, const char *text)
{
    (void)text;
    struct lp_record *r = user;
    if (id >= 0) {
        r->order_ok &= r->n == r->n_tokens + 1 && r->id[r->n_tokens] == id;
        r->n_tokens++;
    }
    return true;
}

static const float *g_row; /* the row lp_order sorts by */
static int lp_order(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_row[i] != g_row[j])
        return g_row[i] > g_row[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* Runs req as a job into *r and the result. */
static mmrt_status run_job(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           struct lp_record *r, struct mmrt_result *res)
{
    struct mmrt_tokenizer *tok = r->tok;
    memset(r, 0, sizeof *r);
    r->tok = tok;
    r->order_ok = r->text_ok = true;
    const struct mmrt_job_callbacks cb = { .struct_size = sizeof cb, .on_token = lp_token,
                                           .on_logprobs = lp_report, .user = r };
    struct mmrt_job *job = NULL;
    char err[1024];
    mmrt_status st = mmrt_submit_with(rt, req, &cb, &job, err, sizeof err);
    if (st != MMRT_OK)
        fail_msg("submit: %s", err);
    *res = (struct mmrt_result){ .struct_size = sizeof *res };
    return mmrt_wait(job, res);
}

/* Log-probabilities: each generated token's is the log-softmax of its step's raw logits
 * (those a traced solo run saw), the top ones are the largest logits in order (ties by id),
 * the texts are each token decoded alone, and each report comes just before the token's
 * on_token. logit_bias moves greedy choice: +100 on one id makes every token that id, −100
 * on the plain first token makes it another. Out-of-range settings are refused by name. */
static void test_logprobs_and_bias(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct mmrt_runtime *rt = open_rt("llava-tiny", &(struct setup){ .max_batch = 4 });
    struct golden_capture plain[MAX_CASES] = { 0 };
    run_solo(rt, &c, plain);
    char path[4096];
    golden_fixture_path(path, sizeof path, "llava-tiny/tokenizer.json");
    struct lp_record *rec = calloc(1, sizeof *rec);
    assert_non_null(rec);
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_tokenizer_load(path, NULL, &rec->tok, &e), MMRT_OK);
    const int64_t V = plain[0].vocab;
    int32_t *order = malloc((size_t)V * sizeof *order);
    assert_non_null(order);

    for (int i = 0; i < c.n; i++) {
        struct mmrt_request r = c.req[i];
        r.struct_size = sizeof r;
        r.logprobs = 1;
        r.top_logprobs = i == 0 ? MMRT_MAX_TOP_LOGPROBS : 3;
        struct mmrt_result res;
        assert_int_equal(run_job(rt, &r, rec, &res), MMRT_OK);
        assert_true(rec->order_ok);
        assert_true(rec->text_ok);
        assert_int_equal(rec->n, plain[i].n_tokens);
        assert_int_equal(rec->n_tokens, plain[i].n_tokens);
        for (int k = 0; k < rec->n && k < GOLDEN_MAX_STEPS && plain[i].logits[k]; k++) {
            const float *row = plain[i].logits[k];
            assert_int_equal(rec->id[k], plain[i].tokens[k]);
            double max = -INFINITY, sum = 0;
            for (int64_t v = 0; v < V; v++)
                max = row[v] > max ? row[v] : max;
            for (int64_t v = 0; v < V; v++)
                sum += exp((double)row[v] - max);
            const double lse = max + log(sum);
            assert_true(fabs(rec->lp[k] - (row[rec->id[k]] - lse)) < 1e-5);
            for (int64_t v = 0; v < V; v++)
                order[v] = (int32_t)v;
            g_row = row;
            qsort(order, (size_t)V, sizeof *order, lp_order);
            assert_int_equal(rec->n_top[k], r.top_logprobs);
            for (int t = 0; t < rec->n_top[k]; t++) {
                assert_int_equal(rec->top[k][t].token_id, order[t]);
                assert_true(fabs(rec->top[k][t].logprob - (row[order[t]] - lse)) < 1e-5);
            }
            assert_int_equal(rec->top[k][0].token_id, rec->id[k]); /* greedy */
        }
    }

    /* Biases. Token 100 is an ordinary piece of the fixture's vocabulary, not an end. */
    struct mmrt_request r = c.req[0];
    r.struct_size = sizeof r;
    r.max_tokens = 5;
    const struct mmrt_logit_bias force = { .token_id = 100, .bias = 100 };
    r.logit_bias = &force;
    r.n_logit_bias = 1;
    struct mmrt_result res;
    assert_int_equal(run_job(rt, &r, rec, &res), MMRT_OK);
    assert_int_equal(res.n_tokens, 5);
    for (int k = 0; k < rec->n; k++)
        assert_int_equal(rec->id[k], 100);
    const struct mmrt_logit_bias ban = { .token_id = plain[0].tokens[0], .bias = -100 };
    r.logit_bias = &ban;
    assert_int_equal(run_job(rt, &r, rec, &res), MMRT_OK);
    assert_true(res.n_tokens >= 1);
    assert_int_not_equal(rec->id[0], plain[0].tokens[0]);
    assert_int_equal(rec->n, 0); /* logprobs off: no reports */

    /* Refusals, naming the setting. */
    struct mmrt_request bad = r;
    bad.logit_bias = NULL;
    bad.n_logit_bias = 0;
    bad.logprobs = 2;
    expect_invalid(rt, &bad, "logprobs 2 must be 0 (off) or 1");
    bad.logprobs = 0;
    bad.top_logprobs = 3;
    expect_invalid(rt, &bad, "top_logprobs 3 must be 0 … 20, and needs logprobs = 1");
    bad.logprobs = 1;
    bad.top_logprobs = 21;
    expect_invalid(rt, &bad, "top_logprobs 21");
    bad.top_logprobs = 0;
    const struct mmrt_logit_bias far = { .token_id = 100, .bias = 101 };
    bad.logit_bias = &far;
    bad.n_logit_bias = 1;
    expect_invalid(rt, &bad, "logit_bias[0]: bias 101 must be in [-100, 100]");
    const struct mmrt_logit_bias outside = { .token_id = (int32_t)V, .bias = 1 };
    bad.logit_bias = &outside;
    expect_invalid(rt, &bad, "logit_bias[0]: token");
    bad.n_logit_bias = MMRT_MAX_LOGIT_BIAS + 1;
    expect_invalid(rt, &bad, "n_logit_bias 1025");
    assert_pages_back(rt);

    free(order);
    mmrt_tokenizer_destroy(rec->tok);
    free(rec);
    free_caps(plain, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* An answer's text, gathered by on_token. */
struct answer {
    char text[8192];
    size_t len;
    int n_tokens;
};

static bool answer_token(void *user, int32_t id, const char *text)
{
    struct answer *a = user;
    a->n_tokens += id >= 0;
    const size_t n = strlen(text);
    if (a->len + n < sizeof a->text) {
        memcpy(a->text + a->len, text, n);
        a->len += n;
        a->text[a->len] = '\0';
    }
    return true;
}

static void run_answer(struct mmrt_runtime *rt, const struct mmrt_request *req, struct answer *a,
                       struct mmrt_result *res)
{
    memset(a, 0, sizeof *a);
    *res = (struct mmrt_result){ .struct_size = sizeof *res };
    if (mmrt_run(rt, req, answer_token, a, res) != MMRT_OK)
        fail_msg("%s (after '%s')", mmrt_last_error(rt), a->text);
}

/* The id of "}" in fixture's tokenizer: its own token, or its byte token. */
static int32_t close_brace_id(const char *fixture)
{
    char path[4096], rel[256];
    snprintf(rel, sizeof rel, "%s/tokenizer.json", fixture);
    golden_fixture_path(path, sizeof path, rel);
    struct mmrt_tokenizer *tok = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_tokenizer_load(path, NULL, &tok, &e), MMRT_OK);
    int32_t id = mmrt_tokenizer_token_to_id(tok, "}", 1);
    if (id < 0)
        id = mmrt_tokenizer_token_to_id(tok, "<0x7D>", 6);
    mmrt_tokenizer_destroy(tok);
    assert_true(id >= 0);
    return id;
}

/* JSON answers on one fixture (see test_json_answers); with_batch adds the batch check. */
static void json_answers_on(const char *fixture, struct answer *a, bool with_batch)
{
    struct golden_cases c;
    golden_cases_load(fixture, &c);
    struct mmrt_runtime *rt = open_rt(fixture, &(struct setup){ .max_batch = 4 });
    const struct mmrt_logit_bias close = { .token_id = close_brace_id(fixture), .bias = 100 };
    struct mmrt_result res;
    for (int k = 0; k < 3; k++) {
        struct mmrt_request r = c.req[0];
        r.struct_size = sizeof r;
        r.response_format = MMRT_RESPONSE_JSON_OBJECT;
        r.max_tokens = 120;
        r.temperature = k == 0 ? 0.0f : 1.0f;
        r.seed = (uint64_t)k;
        if (k == 2) {
            r.logit_bias = &close;
            r.n_logit_bias = 1;
        }
        run_answer(rt, &r, a, &res);
        struct mmrt_json_schema *object = NULL;
        assert_int_equal(mmrt_json_schema_any_object(&object, NULL), MMRT_OK);
        struct mmrt_json_grammar g;
        mmrt_json_grammar_init(&g, object);
        const bool fed = mmrt_json_grammar_feed(&g, a->text, a->len);
        mmrt_json_schema_free(object);
        if (!fed)
            fail_msg("%s: JSON answer %d is not a prefix of a JSON object: %s", fixture, k,
                     a->text);
        if (res.finish_reason == MMRT_FINISH_EOS) {
            json_error_t je;
            json_t *v = json_loads(a->text, 0, &je);
            if (!json_is_object(v))
                fail_msg("%s: JSON answer %d ended but is not an object: %s (%s)", fixture, k,
                         a->text, je.text);
            json_decref(v);
        } else {
            assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
            assert_int_equal(res.n_tokens, 120);
        }
        if (k == 2) {
            assert_int_equal(res.finish_reason, MMRT_FINISH_EOS);
            assert_true(a->len >= 2 && strcmp(a->text + a->len - 2, "{}") == 0);
        }
    }
    if (with_batch) {
        /* In company: the plain request is unchanged, the JSON one still JSON. */
        struct golden_capture plain[MAX_CASES] = { 0 }, batched[MAX_CASES] = { 0 };
        run_solo(rt, &c, plain);
        struct mmrt_request both[2] = { c.req[0], c.req[1 % c.n] };
        both[0].struct_size = sizeof both[0];
        both[0].response_format = MMRT_RESPONSE_JSON_OBJECT;
        struct mmrt_result br[2] = { 0 };
        assert_int_equal(run_batch(rt, both, 2, batched, br, -1, 0), MMRT_OK);
        same_run("next to a JSON answer", 1, &batched[1], &plain[1 % c.n], true);
        free_caps(plain, c.n);
        free_caps(batched, 2);
        /* A response_format that is not one. */
        struct mmrt_request bad = c.req[0];
        bad.struct_size = sizeof bad;
        bad.response_format = 3;
        expect_invalid(rt, &bad, "response_format 3 is not an enum mmrt_response_format");
        /* A schema missing, or one mmrt cannot hold an answer to: refused by its place. */
        bad.response_format = MMRT_RESPONSE_JSON_SCHEMA;
        expect_invalid(rt, &bad, "response_format json_schema needs json_schema");
        bad.json_schema = "{\"type\": \"object\", \"properties\": {\"a\": {\"pattern\": "
                          "\"(?=x)\"}}}";
        expect_invalid(rt, &bad, "json_schema /properties/a/pattern: pattern byte 1: "
                                 "look-arounds");
        bad.json_schema = "{\"type\": ";
        expect_invalid(rt, &bad, "json_schema: invalid JSON");
    }
    assert_pages_back(rt);
    mmrt_destroy(rt);
    json_decref(c.json);
}

/* JSON answers, on each tokenizer kind (LLaMA's byte fallback, Qwen2's byte level, Fuyu's
 * Unigram): whatever the model prefers, the text is always a prefix of a JSON object, and a
 * whole object (jansson parses it) when the answer ends by itself. Greedy and sampled; a
 * +100 bias on "}" closes the object as soon as the grammar lets it. On llava-tiny, a plain
 * request in the same batch as a JSON one gives its solo tokens (the mask is per
 * sequence). */
/* Answers held to a schema whose every document is short (each string, count and value
 * bounded), greedy and sampled: each is a prefix of one, and an ended one parses and
 * satisfies it, checked here by hand (not by the recogniser that made it). */
static void json_schema_answers_on(const char *fixture, struct answer *a)
{
    static const char schema[] =
        "{\"type\": \"object\", \"properties\": {"
        "\"name\": {\"type\": \"string\", \"maxLength\": 6},"
        "\"n\": {\"enum\": [1, 2, 3]},"
        "\"ok\": {\"type\": \"boolean\"},"
        "\"code\": {\"type\": \"string\", \"pattern\": \"^[a-z]{2}-[0-9]$\"},"
        "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"red\", \"blue\"]}, "
        "\"maxItems\": 2}},"
        "\"required\": [\"name\", \"n\", \"code\"], \"additionalProperties\": false}";
    struct golden_cases c;
    golden_cases_load(fixture, &c);
    struct mmrt_runtime *rt = open_rt(fixture, &(struct setup){ .max_batch = 4 });
    struct mmrt_json_schema *compiled = NULL;
    assert_int_equal(mmrt_json_schema_parse(schema, strlen(schema), &compiled, NULL), MMRT_OK);
    struct mmrt_result res;
    int ended = 0;
    for (int k = 0; k < 4; k++) {
        struct mmrt_request r = c.req[0];
        r.struct_size = sizeof r;
        r.response_format = MMRT_RESPONSE_JSON_SCHEMA;
        r.json_schema = schema;
        r.max_tokens = 0; /* until the document closes or the context is full */
        r.temperature = k == 0 ? 0.0f : 1.0f;
        r.seed = (uint64_t)k;
        run_answer(rt, &r, a, &res);
        struct mmrt_json_grammar g;
        mmrt_json_grammar_init(&g, compiled);
        if (!mmrt_json_grammar_feed(&g, a->text, a->len))
            fail_msg("%s: answer %d is not a prefix of a document: %s", fixture, k, a->text);
        if (res.finish_reason != MMRT_FINISH_EOS) {
            assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
            continue;
        }
        ended++;
        json_error_t je;
        json_t *v = json_loads(a->text, 0, &je);
        const json_t *name = json_object_get(v, "name"), *n = json_object_get(v, "n");
        const json_t *ok = json_object_get(v, "ok"), *tags = json_object_get(v, "tags");
        const json_t *code = json_object_get(v, "code");
        bool good = json_is_string(name) && json_is_integer(n) &&
                    json_integer_value(n) >= 1 && json_integer_value(n) <= 3 &&
                    (!ok || json_is_boolean(ok)) && json_is_string(code) &&
                    json_object_size(v) == 3u + (ok != NULL) + (tags != NULL);
        /* The pattern by libc's matcher, not mmrt's. */
        regex_t re;
        assert_int_equal(regcomp(&re, "^[a-z]{2}-[0-9]$", REG_EXTENDED | REG_NOSUB), 0);
        good = good && regexec(&re, json_string_value(code), 0, NULL, 0) == 0;
        regfree(&re);
        size_t chars = 0;
        for (const char *p = name ? json_string_value(name) : ""; *p; p++)
            chars += ((unsigned char)*p & 0xc0) != 0x80;
        good = good && chars <= 6;
        if (tags) {
            good = good && json_is_array(tags) && json_array_size(tags) <= 2;
            for (size_t i = 0; good && i < json_array_size(tags); i++) {
                const char *t = json_string_value(json_array_get(tags, i));
                good = t && (strcmp(t, "red") == 0 || strcmp(t, "blue") == 0);
            }
        }
        if (!good)
            fail_msg("%s: answer %d ended but does not satisfy the schema: %s", fixture, k,
                     a->text);
        json_decref(v);
    }
    /* Every document is short, but a random model may pad it with whitespace runs until the
     * context is full: most must end. */
    if (ended < 3)
        fail_msg("%s: %d of 4 schema answers ended", fixture, ended);
    mmrt_json_schema_free(compiled);
    assert_pages_back(rt);
    mmrt_destroy(rt);
    json_decref(c.json);
}

static void test_json_answers(void **state)
{
    (void)state;
    struct answer *a = calloc(1, sizeof *a);
    assert_non_null(a);
    json_answers_on("llava-tiny", a, true);
    json_answers_on("qwen2vl-tiny", a, false);
    json_answers_on("fuyu-tiny", a, false);
    json_schema_answers_on("llava-tiny", a);
    json_schema_answers_on("qwen2vl-tiny", a);
    json_schema_answers_on("fuyu-tiny", a);
    free(a);
}

/* Speculative decoding: with drafts every request, alone and batched, gives every logit of
 * every step and every token it gives on a runtime without them, bit for bit; *rows and
 * *taken add up the drafts checked and taken. */
static void check_drafts(const char *fixture, const struct setup *s, uint64_t *rows,
                         uint64_t *taken)
{
    struct golden_cases c;
    golden_cases_load(fixture, &c);
    struct setup plain = *s;
    plain.draft_tokens = plain.draft_rows = 0;
    struct mmrt_runtime *rt0 = open_rt(fixture, &plain), *rt = open_rt(fixture, s);
    struct golden_capture ref[MAX_CASES] = { { 0 } }, solo[MAX_CASES] = { { 0 } },
                          batch[MAX_CASES] = { { 0 } };
    struct mmrt_result res[MAX_CASES] = { { 0 } };
    run_solo(rt0, &c, ref);
    struct mmrt_engine_stats before, after;
    mmrt_runtime_engine_stats(rt, &before);
    run_solo(rt, &c, solo);
    if (run_batch(rt, c.req, c.n, batch, res, -1, 0) != MMRT_OK)
        fail_msg("%s batch: %s", fixture, mmrt_last_error(rt));
    mmrt_runtime_engine_stats(rt, &after);
    for (int i = 0; i < c.n; i++) {
        same_run("drafts, alone", i, &solo[i], &ref[i], true);
        same_run("drafts, batched", i, &batch[i], &ref[i], true);
    }
    *rows += after.draft_rows - before.draft_rows;
    *taken += after.draft_accepted - before.draft_accepted;
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "%s: drafts %llu taken %llu, decode forwards %llu rows %llu, "
                "preemptions %llu\n", fixture,
                (unsigned long long)(after.draft_rows - before.draft_rows),
                (unsigned long long)(after.draft_accepted - before.draft_accepted),
                (unsigned long long)(after.decode_forwards - before.decode_forwards),
                (unsigned long long)(after.decode_rows - before.decode_rows),
                (unsigned long long)(after.preemptions - before.preemptions));
    /* A taken draft saves a decode forward: fewer forwards than tokens after the first. */
    assert_true(after.draft_accepted == before.draft_accepted ||
                after.decode_forwards - before.decode_forwards <
                    after.decode_rows - before.decode_rows - (after.draft_rows -
                                                              before.draft_rows));
    assert_pages_back(rt);
    free_caps(ref, c.n);
    free_caps(solo, c.n);
    free_caps(batch, c.n);
    mmrt_destroy(rt);
    mmrt_destroy(rt0);
    json_decref(c.json);
}

/* The same held to on all four model types, with the decode step captured, with pages
 * running out (preemption, and drafts finding no free page), with a sliding window, with
 * more rows for drafts than sequences and with image-token KV compression (draft rows
 * after dropped positions). Drafts were taken and refused along the way. */
static void test_drafts(void **state)
{
    (void)state;
    uint64_t rows = 0, taken = 0;
    check_drafts("llava-tiny", &(struct setup){ .draft_tokens = 3 }, &rows, &taken);
    check_drafts("llava-next-tiny", &(struct setup){ .draft_tokens = 4, .draft_rows = 20 },
                 &rows, &taken);
    check_drafts("fuyu-tiny", &(struct setup){ .draft_tokens = 2, .graph = true }, &rows,
                 &taken);
    check_drafts("qwen2vl-tiny",
                 &(struct setup){ .draft_tokens = 3, .max_kv_tokens = 136,
                                  .kv_page_tokens = 8, .prefill_chunk = 16 },
                 &rows, &taken);
    check_drafts("llava-tiny-swa",
                 &(struct setup){ .draft_tokens = 5, .draft_rows = 8, .kv_page_tokens = 4,
                                  .max_batch = 3 },
                 &rows, &taken);
    check_drafts("llava-next-tiny", &(struct setup){ .draft_tokens = 3, .image_kv_keep = 0.5 },
                 &rows, &taken);
    assert_true(taken > 0);
    assert_true(rows > taken);
}

/* Predictions (mmrt_request.prediction), drafted with drafts otherwise off: every request,
 * alone and batched, gives every logit of every step it gives without one, bit for bit,
 * whether its prediction is its own answer, that answer edited, unrelated text, or its
 * answer after 40 KB of other text. Its own
 * answer is mostly taken; the results count what was taken and refused. */
static void check_prediction(const char *fixture, const struct setup *setup)
{
    struct golden_cases c;
    golden_cases_load(fixture, &c);
    struct mmrt_runtime *rt = open_rt(fixture, setup);
    struct golden_capture ref[MAX_CASES] = { { 0 } }, solo[MAX_CASES] = { { 0 } },
                          batch[MAX_CASES] = { { 0 } };
    run_solo(rt, &c, ref);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", fixture);
    char full[4096];
    golden_fixture_path(full, sizeof full, path);
    struct mmrt_tokenizer *tok = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_tokenizer_load(full, NULL, &tok, &e), MMRT_OK);
    char *text[MAX_CASES] = { 0 };
    bool canonical[MAX_CASES] = { 0 };
    int n_canonical = 0;
    for (int i = 0; i < c.n; i++) {
        size_t len = 0, n = 0;
        assert_int_equal(mmrt_tokenizer_decode(tok, ref[i].tokens, ref[i].n_tokens,
                                               MMRT_DECODE_SKIP_SPECIAL, &text[i], &len, &e),
                         MMRT_OK);
        /* Whether the answer's text encodes to the answer's tokens (a random-weight model
         * often picks pieces the tokenizer would merge): then every token but the first,
         * which comes from the prefill, is drafted right. */
        int32_t *ids = NULL;
        assert_int_equal(mmrt_tokenizer_encode(tok, text[i], len, 0, &ids, &n, &e), MMRT_OK);
        canonical[i] = n == (size_t)ref[i].n_tokens &&
                       memcmp(ids, ref[i].tokens, n * sizeof *ids) == 0;
        n_canonical += canonical[i];
        free(ids);
    }
    /* Form 3: 40 KB of other text, then the answer (past predict()'s reach). */
    enum { LONG = 40000 };
    char *long_text = malloc(LONG + 4096);
    assert_non_null(long_text);
    int accepted[4] = { 0 }, rejected[4] = { 0 }, generated = 0;
    for (int form = 0; form < 4; form++) {
        struct mmrt_request reqs[MAX_CASES];
        char edited[MAX_CASES][512];
        for (int i = 0; i < c.n; i++) {
            reqs[i] = c.req[i];
            reqs[i].struct_size = sizeof reqs[i];
            /* The answer with its middle third replaced by other words (cut between
             * characters). */
            const char *t = text[i];
            size_t a = strlen(t) / 3, b = 2 * strlen(t) / 3;
            while (a > 0 && ((unsigned char)t[a] & 0xC0) == 0x80)
                a--;
            while (b > 0 && ((unsigned char)t[b] & 0xC0) == 0x80)
                b--;
            snprintf(edited[i], sizeof edited[i], "%.*s and then some %s", (int)a, t, t + b);
            reqs[i].prediction = form == 0 ? text[i] : form == 1 ? edited[i]
                                                                 : "Nothing like the answer.";
            if (form == 3) {
                for (size_t b = 0; b < LONG; b++)
                    long_text[b] = "the quick brown fox "[b % 20];
                assert_true(strlen(text[i]) < 4096);
                snprintf(long_text + LONG, 4096, "%s", text[i]);
                reqs[i].prediction = long_text;
            }
        }
        struct mmrt_result res[MAX_CASES];
        for (int i = 0; i < c.n; i++) {
            struct mmrt_model_trace trace;
            golden_trace(&solo[i], &trace);
            res[i] = (struct mmrt_result){ .struct_size = sizeof res[i] };
            if (mmrt_run_traced(rt, &reqs[i], &trace, golden_on_token, &solo[i], &res[i]) !=
                MMRT_OK)
                fail_msg("%s, prediction %d, request %d: %s", fixture, form, i,
                         mmrt_last_error(rt));
            same_run("prediction, alone", i, &solo[i], &ref[i], true);
            accepted[form] += res[i].prediction_accepted;
            rejected[form] += res[i].prediction_rejected;
            generated += form == 0 ? ref[i].n_tokens : 0;
            /* Taken drafts are tokens the answer has. */
            assert_true(res[i].prediction_accepted < res[i].n_tokens ||
                        res[i].prediction_accepted == 0);
            if (form == 0 && canonical[i] && res[i].n_tokens == ref[i].n_tokens &&
                res[i].prediction_accepted != res[i].n_tokens - 1)
                fail_msg("%s, request %d: %d of its %d tokens taken from its own answer",
                         fixture, i, res[i].prediction_accepted, res[i].n_tokens);
        }
        for (int i = 0; i < c.n; i++)
            res[i] = (struct mmrt_result){ .struct_size = sizeof res[i] };
        if (run_batch(rt, reqs, c.n, batch, res, -1, 0) != MMRT_OK)
            fail_msg("%s batch, prediction %d: %s", fixture, form, mmrt_last_error(rt));
        for (int i = 0; i < c.n; i++)
            same_run("prediction, batched", i, &batch[i], &ref[i], true);
        free_caps(solo, c.n);
        free_caps(batch, c.n);
    }
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "%s: %d tokens, %d of %d answers canonical; prediction taken/refused: "
                "answer %d/%d, edited %d/%d, unrelated %d/%d, long %d/%d\n", fixture,
                generated, n_canonical, c.n, accepted[0], rejected[0], accepted[1],
                rejected[1], accepted[2], rejected[2], accepted[3], rejected[3]);
    assert_true(accepted[0] > 0 && accepted[1] > 0 && accepted[1] <= accepted[0]);
    /* A prediction that is not text is refused by name. */
    struct mmrt_request bad = c.req[0];
    bad.struct_size = sizeof bad;
    bad.prediction = "\xff";
    struct mmrt_result r = { .struct_size = sizeof r };
    assert_int_equal(mmrt_run(rt, &bad, NULL, NULL, &r), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "prediction"));
    /* So is one over the tokenizer's input bound (1 MiB), before anything runs. */
    char *huge = malloc((1u << 20) + 2);
    assert_non_null(huge);
    memset(huge, 'a', (1u << 20) + 1);
    huge[(1u << 20) + 1] = '\0';
    bad.prediction = huge;
    assert_int_equal(mmrt_run(rt, &bad, NULL, NULL, &r), MMRT_ERR_LIMIT);
    assert_non_null(strstr(mmrt_last_error(rt), "prediction"));
    free(huge);
    assert_pages_back(rt);
    for (int i = 0; i < c.n; i++)
        free(text[i]);
    free(long_text);
    mmrt_tokenizer_destroy(tok);
    free_caps(ref, c.n);
    mmrt_destroy(rt);
    json_decref(c.json);
}

static void test_prediction(void **state)
{
    (void)state;
    check_prediction("llava-tiny", &(struct setup){ 0 });
    check_prediction("qwen2vl-tiny", &(struct setup){ .max_kv_tokens = 136, .kv_page_tokens = 8,
                                                      .prefill_chunk = 16 });
    check_prediction("fuyu-tiny", &(struct setup){ .graph = true });
    check_prediction("llava-next-tiny", &(struct setup){ .draft_tokens = 2 });
}

/* Drafts under the other request settings: a seeded sampled answer (its draws are the
 * ones it makes without drafts), log-probabilities, stop strings and JSON answers each give
 * the same tokens, reports and finish as without drafts. */
static void test_drafts_request_forms(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct mmrt_runtime *rt0 = open_rt("llava-tiny", &(struct setup){ 0 });
    struct mmrt_runtime *rt = open_rt("llava-tiny", &(struct setup){ .draft_tokens = 4 });
    char path[4096];
    golden_fixture_path(path, sizeof path, "llava-tiny/tokenizer.json");
    struct lp_record *want = calloc(1, sizeof *want), *got = calloc(1, sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_tokenizer_load(path, NULL, &want->tok, &e), MMRT_OK);
    got->tok = want->tok;
    static const char *const stops[] = { "ab", "e" };
    struct mmrt_engine_stats before, after;
    mmrt_runtime_engine_stats(rt, &before);
    for (int form = 0; form < 4; form++) {
        struct mmrt_engine_stats f0, f1;
        mmrt_runtime_engine_stats(rt, &f0);
        for (int i = 0; i < c.n; i++) {
            struct mmrt_request r = c.req[i];
            r.struct_size = sizeof r;
            r.max_tokens = 24;
            if (form == 0) {
                r.temperature = 0.9f;
                r.top_p = 0.95f;
                r.seed = 7 + (uint64_t)i;
            } else if (form == 1) {
                r.logprobs = 1;
                r.top_logprobs = 3;
            } else if (form == 2) {
                r.stop = stops;
                r.n_stop = 2;
            } else {
                r.response_format = MMRT_RESPONSE_JSON_OBJECT;
            }
            struct mmrt_result a, b;
            assert_int_equal(run_job(rt0, &r, want, &a), MMRT_OK);
            assert_int_equal(run_job(rt, &r, got, &b), MMRT_OK);
            if (a.n_tokens != b.n_tokens || a.finish_reason != b.finish_reason ||
                want->n_tokens != got->n_tokens || want->n != got->n ||
                memcmp(want->id, got->id, (size_t)want->n * sizeof want->id[0]) != 0 ||
                memcmp(want->lp, got->lp, (size_t)want->n * sizeof want->lp[0]) != 0)
                fail_msg("form %d, case %d: %d tokens (finish %d), without drafts %d (%d)", form,
                         i, b.n_tokens, (int)b.finish_reason, a.n_tokens, (int)a.finish_reason);
            for (int k = 0; k < want->n && k < GOLDEN_MAX_TOKENS; k++) {
                assert_int_equal(want->n_top[k], got->n_top[k]);
                for (int t = 0; t < want->n_top[k]; t++) {
                    assert_int_equal(want->top[k][t].token_id, got->top[k][t].token_id);
                    assert_true(want->top[k][t].logprob == got->top[k][t].logprob);
                }
            }
        }
        mmrt_runtime_engine_stats(rt, &f1);
        if (getenv("MMRT_TEST_VERBOSE"))
            fprintf(stderr, "form %d: drafts %llu taken %llu\n", form,
                    (unsigned long long)(f1.draft_rows - f0.draft_rows),
                    (unsigned long long)(f1.draft_accepted - f0.draft_accepted));
    }
    mmrt_runtime_engine_stats(rt, &after);
    assert_true(after.draft_accepted > before.draft_accepted);
    assert_pages_back(rt);
    mmrt_tokenizer_destroy(want->tok);
    free(want);
    free(got);
    mmrt_destroy(rt);
    mmrt_destroy(rt0);
    json_decref(c.json);
}

/* Fuyu has no chat template: anything but one user turn is refused by name. */
static void test_fuyu_refuses_chats(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = open_rt("fuyu-tiny", &(struct setup){ 0 });
    const struct mmrt_message chat[2] = { { .role = "system", .text = "Be brief." },
                                          { .role = "user", .text = "hi" } };
    struct mmrt_request r = { .messages = chat, .n_messages = 2, .max_tokens = 2,
                              .top_p = 1.0f };
    expect_invalid(rt, &r, "message 0 (system): Fuyu has no chat template");
    mmrt_destroy(rt);
}

static void test_bad_scheduler_config(void **state)
{
    (void)state;
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, "llava-tiny");
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .model_path = dir, .devices = &dev, .n_devices = 1,
                               .max_batch = 33 };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "max_batch 33"));
    cfg.max_batch = 0;
    cfg.prefill_chunk = -1;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "prefill_chunk -1"));
    cfg.prefill_chunk = 0;
    cfg.struct_size = sizeof cfg; /* the members below came after the first layout */
    cfg.image_kv_keep = 1.5;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "image_kv_keep 1.5 must be in (0, 1]"));
    cfg.image_kv_keep = 0.5;
    cfg.image_kv_policy = (enum mmrt_image_kv_policy)9;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "image_kv_policy 9"));
    cfg.image_kv_policy = MMRT_IMAGE_KV_DEFAULT;
    cfg.image_kv_keep = 0;
    cfg.draft_tokens = 32;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "draft_tokens 32 must be 0 … 31"));
    cfg.draft_tokens = 3;
    cfg.draft_rows = 33;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "draft_rows 33 must be 2 … 32"));
    cfg.draft_tokens = 0;
    cfg.draft_rows = 0;
    cfg.image_kv_keep = 0;
    cfg.image_kv_policy = MMRT_IMAGE_KV_DEFAULT;
    cfg.struct_size = 4; /* a layout older than the first */
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "struct_size 4 is smaller than the first layout"));
    assert_null(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_llava),
        cmocka_unit_test(test_batch_llava_next),
        cmocka_unit_test(test_batch_fuyu),
        cmocka_unit_test(test_batch_qwen2vl),
        cmocka_unit_test(test_batch_chunked),
        cmocka_unit_test(test_batch_graph),
        cmocka_unit_test(test_batch_preempted),
        cmocka_unit_test(test_batch_sliding_window),
        cmocka_unit_test(test_batch_image_kv),
        cmocka_unit_test(test_image_kv_effect),
        cmocka_unit_test(test_batch_vision_on_opencl),
        cmocka_unit_test(test_chunked_matches_whole),
        cmocka_unit_test(test_kv_f16),
        cmocka_unit_test(test_kv_fp8),
        cmocka_unit_test(test_kv_int8),
        cmocka_unit_test(test_batch_failures_stay_local),
        cmocka_unit_test(test_submit_from_threads),
        cmocka_unit_test(test_cancel_job),
        cmocka_unit_test(test_request_forms),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs_and_bias),
        cmocka_unit_test(test_json_answers),
        cmocka_unit_test(test_drafts),
        cmocka_unit_test(test_drafts_request_forms),
        cmocka_unit_test(test_prediction),
        cmocka_unit_test(test_fuyu_refuses_chats),
        cmocka_unit_test(test_bad_scheduler_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
