/*
 * tests/test_prefix_cache.c — prefix reuse (core/engine.c, docs/ENGINE.md "Prefix reuse"):
 * a prompt that starts like an earlier one shares that prefix's K/V pages instead of
 * prefilling it, and every logit of every step is the bit pattern a runtime without the
 * prefix cache gives (memcmp). The same request twice, a chat's next turn, another image
 * behind the same token ids (no reuse across the image), eviction from a tiny KV store,
 * preemption of sequences that share pages, a batch of requests sharing one prefix, and
 * Qwen2-VL's M-RoPE positions; and the [cache] prefix key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "formats/conf.h"
#include "golden.h"
#include "request_util.h"

#define MAX_CASES GOLDEN_MAX_CASES
struct setup {
    int64_t chunk, page, kv_tokens;
    int max_batch;
    bool off;           /* [cache] prefix = off */
    const char *plugin; /* NULL: cpu */
    enum mmrt_kv_dtype kv_dtype;
};

static struct mmrt_runtime *open_rt(const char *fixture, const struct setup *s)
{
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, fixture);
    struct mmrt_device_config dev = { .name = "d", .plugin = s->plugin ? s->plugin : "cpu",
                                      .pool_mb = 64 };
    struct mmrt_config cfg = {
        .struct_size = sizeof cfg, .model_path = dir, .devices = &dev, .n_devices = 1,
        .max_batch = s->max_batch, .prefill_chunk = s->chunk, .max_kv_tokens = s->kv_tokens,
        .kv_page_tokens = s->page, .prefix_cache = s->off ? -1 : 0, .kv_dtype = s->kv_dtype,
    };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", fixture, err);
    return rt;
}

static struct mmrt_engine_stats stats(struct mmrt_runtime *rt)
{
    struct mmrt_engine_stats es;
    mmrt_runtime_engine_stats(rt, &es);
    return es;
}

/* Every generated token and every logits row of a against b, bit for bit. */
static void same_bits(const char *what, const struct golden_capture *a,
                      const struct golden_capture *b)
{
    if (a->n_tokens != b->n_tokens ||
        memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof a->tokens[0]) != 0)
        fail_msg("%s: %d tokens, without the prefix cache %d (or other ids)", what,
                 a->n_tokens, b->n_tokens);
    int s = 0;
    for (; s < GOLDEN_MAX_STEPS && a->logits[s] && b->logits[s]; s++)
        if (memcmp(a->logits[s], b->logits[s], (size_t)a->vocab * sizeof(float)) != 0)
            fail_msg("%s: the logits of step %d differ from the run without the prefix cache "
                     "(rel %.3g)", what, s, golden_rel_err(a->logits[s], b->logits[s],
                                                           a->vocab));
    assert_true(s > 0);
    assert_true(s == GOLDEN_MAX_STEPS || (!a->logits[s] && !b->logits[s]));
}

static void run(struct mmrt_runtime *rt, const struct mmrt_request *req,
                struct golden_capture *cap)
{
    struct mmrt_result res = { 0 };
    golden_run(rt, req, cap, &res);
}

static void assert_pages_back(struct mmrt_runtime *rt)
{
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    assert_int_equal(mr.kv_pages_used, 0); /* cached prefixes are not a request's pages */
}


/* The largest multiple of chunk and page ≤ min(limit, n_prompt − 1). */
static int64_t reusable(int64_t n_prompt, int64_t limit, int64_t chunk, int64_t page)
{
    int64_t b = (n_prompt - 1 < limit ? n_prompt - 1 : limit) / chunk * chunk;
    while (b > 0 && b % page != 0)
        b -= chunk;
    return b;
}

/* ---- the same request again ---- */

static void check_repeat(const char *fixture, const struct setup *s)
{
    struct golden_cases c;
    golden_cases_load(fixture, &c);
    struct setup off = *s;
    off.off = true;
    struct mmrt_runtime *on = open_rt(fixture, s), *ref = open_rt(fixture, &off);
    for (int i = 0; i < c.n; i++) {
        struct golden_capture want = { 0 }, first = { 0 }, again = { 0 };
        struct golden_capture other_want = { 0 }, other = { 0 };
        run(ref, &c.req[i], &want);
        const struct mmrt_engine_stats s0 = stats(on);
        run(on, &c.req[i], &first);
        const struct mmrt_engine_stats s1 = stats(on);
        run(on, &c.req[i], &again);
        const struct mmrt_engine_stats s2 = stats(on);
        /* Another answer to the same prompt (another of n choices, a regenerated answer):
         * sampled with another seed, the bits of its own run without the cache. */
        struct mmrt_request alt = c.req[i];
        alt.seed = 1000 + (uint64_t)i;
        alt.temperature = 0.9f;
        run(ref, &alt, &other_want);
        run(on, &alt, &other);
        const struct mmrt_engine_stats s3 = stats(on);
        char what[128];
        snprintf(what, sizeof what, "%s case %d, first run", fixture, i);
        same_bits(what, &first, &want);
        snprintf(what, sizeof what, "%s case %d, again", fixture, i);
        same_bits(what, &again, &want);
        snprintf(what, sizeof what, "%s case %d, another seed", fixture, i);
        same_bits(what, &other, &other_want);
        /* The first run keeps its whole prompt; the second takes it (every full page shared,
         * the last one copied, the first token from the kept logits) and prefills nothing,
         * and so does the third. The first may share a chunk prefix when another case
         * starts the same way. */
        assert_true(reusable(first.n_prompt, first.n_prompt, s->chunk, s->page) > 0);
        assert_int_equal(s2.prefix_hits - s1.prefix_hits, 1);
        assert_int_equal(s2.prompt_hits - s1.prompt_hits, 1);
        assert_int_equal(s2.prefix_reused_tokens - s1.prefix_reused_tokens, first.n_prompt);
        assert_int_equal(s2.prefill_rows - s1.prefill_rows, 0);
        assert_int_equal(s3.prompt_hits - s2.prompt_hits, 1);
        assert_int_equal(s3.prefill_rows - s2.prefill_rows, 0);
        assert_true(s2.prefix_entries > 0 && s2.prefix_pages > 0);
        assert_true(s1.prefill_rows - s0.prefill_rows > 0);
        golden_capture_free(&want);
        golden_capture_free(&first);
        golden_capture_free(&again);
        golden_capture_free(&other_want);
        golden_capture_free(&other);
    }
    /* The runtime's figures, for /metrics; nothing reused without the cache. */
    struct mmrt_runtime_stats rs = { .struct_size = sizeof rs };
    assert_int_equal(mmrt_stats(on, &rs), MMRT_OK);
    assert_true(rs.prefix_cache_hits >= (uint64_t)c.n);
    assert_true(rs.prefix_cache_reused_tokens > 0);
    assert_int_equal(rs.prefix_cache_hits, stats(on).prefix_hits);
    assert_int_equal(rs.prefix_cache_prompt_hits, stats(on).prompt_hits);
    assert_true(rs.prefix_cache_prompt_hits >= 2 * (uint64_t)c.n);
    assert_int_equal(mmrt_stats(ref, &rs), MMRT_OK);
    assert_int_equal(rs.prefix_cache_hits, 0);
    assert_int_equal(stats(ref).prefix_entries, 0);
    assert_pages_back(on);
    mmrt_destroy(ref);
    mmrt_destroy(on);
    json_decref(c.json);
}

static void test_repeat_llava(void **state)
{
    (void)state;
    check_repeat("llava-tiny", &(struct setup){ .chunk = 8, .page = 4 });
    /* the copied last page of a whole prompt carries an INT8 store's row scales, and FP8's
     * one-byte codes */
    check_repeat("llava-tiny", &(struct setup){ .chunk = 8, .page = 4, .kv_dtype = MMRT_KV_INT8 });
    check_repeat("llava-tiny", &(struct setup){ .chunk = 8, .page = 4, .kv_dtype = MMRT_KV_FP8 });
    /* pages larger than chunks: only every other boundary can be shared */
    check_repeat("llava-tiny", &(struct setup){ .chunk = 8, .page = 16 });
}

static void test_repeat_llava_next(void **state)
{
    (void)state;
    /* chunks above MMRT_SMALL_M rows */
    check_repeat("llava-next-tiny", &(struct setup){ .chunk = 40, .page = 8 });
}

static void test_repeat_fuyu(void **state)
{
    (void)state;
    check_repeat("fuyu-tiny", &(struct setup){ .chunk = 16, .page = 16 });
}

/* The whole model on the OpenCL plugin: the last page's copy goes through its COPY. */
static void test_repeat_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    check_repeat("llava-tiny", &(struct setup){ .chunk = 8, .page = 4, .plugin = "opencl" });
}

/* Qwen2-VL: M-RoPE positions are part of the key and of the K/V. */
static void test_repeat_qwen2vl(void **state)
{
    (void)state;
    check_repeat("qwen2vl-tiny", &(struct setup){ .chunk = 8, .page = 8 });
}

/* ---- a chat's next turn ---- */

static void check_follow_up(const char *fixture, const char *image, const struct setup *s)
{
    struct setup off = *s;
    off.off = true;
    struct mmrt_runtime *on = open_rt(fixture, s), *ref = open_rt(fixture, &off);
    const struct mmrt_message turn1[] = {
        { .role = "user", .text = "What is in the picture?", .n_images = 1 },
    };
    const struct mmrt_message turn2[] = {
        { .role = "user", .text = "What is in the picture?", .n_images = 1 },
        { .role = "assistant", .text = "A gradient." },
        { .role = "user", .text = "Which colours?" },
    };
    char path[4096];
    golden_fixture_path(path, sizeof path, image);
    const struct mmrt_image_input *img = TEST_FILE(path);
    const struct mmrt_request r1 = { .messages = turn1, .n_messages = 1, .images = img,
                                     .n_images = 1, .max_tokens = 4, .top_p = 1 };
    const struct mmrt_request r2 = { .messages = turn2, .n_messages = 3, .images = img,
                                     .n_images = 1, .max_tokens = 4, .top_p = 1 };
    struct golden_capture a = { 0 }, b = { 0 }, want = { 0 };
    run(on, &r1, &a);
    const struct mmrt_engine_stats s1 = stats(on);
    run(on, &r2, &b);
    const struct mmrt_engine_stats s2 = stats(on);
    run(ref, &r2, &want);
    same_bits("the follow-up turn", &b, &want);
    /* What the turns have in common, and the part of it that may be shared. */
    int common = 0;
    while (common < a.n_prompt && common < b.n_prompt && a.prompt[common] == b.prompt[common])
        common++;
    const int64_t shared = reusable(b.n_prompt, common, s->chunk, s->page);
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "%s: turn 1 %d tokens, turn 2 %d, common %d, shared %lld\n", fixture,
                a.n_prompt, b.n_prompt, common, (long long)shared);
    assert_true(shared > 0);
    assert_int_equal(s2.prefix_hits - s1.prefix_hits, 1);
    /* turn 1 cached every boundary of its prompt, so the longest common one is found */
    assert_int_equal(s2.prefix_reused_tokens - s1.prefix_reused_tokens, shared);
    golden_capture_free(&a);
    golden_capture_free(&b);
    golden_capture_free(&want);
    assert_pages_back(on);
    mmrt_destroy(ref);
    mmrt_destroy(on);
}

static void test_follow_up_llava(void **state)
{
    (void)state;
    check_follow_up("llava-tiny", "llava-images/grad_64x64.png",
                    &(struct setup){ .chunk = 8, .page = 4 });
}

static void test_follow_up_qwen2vl(void **state)
{
    (void)state;
    check_follow_up("qwen2vl-tiny", "qwen2vl-images/grad_98x70.png",
                    &(struct setup){ .chunk = 8, .page = 8 });
}

/* ---- another image behind the same token ids ----
 * The two images are 24×16 each (the same token count) with other pixels: the same
 * pattern as a JPEG and as a lossless PNG (their EXIF tags are ignored, as by default). */

static int first_row_of(const struct golden_capture *c, int32_t id)
{
    for (int i = 0; i < c->n_prompt; i++)
        if (c->prompt[i] == id)
            return i;
    return c->n_prompt;
}

static void check_other_image(const char *fixture, const char *img_a, const char *img_b,
                              int32_t image_id, const struct setup *s)
{
    struct setup off = *s;
    off.off = true;
    struct mmrt_runtime *on = open_rt(fixture, s), *ref = open_rt(fixture, &off);
    char pa[4096], pb[4096];
    golden_fixture_path(pa, sizeof pa, img_a);
    golden_fixture_path(pb, sizeof pb, img_b);
    const struct mmrt_request ra = { .prompt = "Describe it.", .images = TEST_FILE(pa),
                                     .n_images = 1, .max_tokens = 4, .top_p = 1 };
    struct mmrt_request rb = ra;
    rb.images = TEST_FILE(pb);
    struct golden_capture a = { 0 }, b = { 0 }, want = { 0 };
    run(on, &ra, &a);
    const struct mmrt_engine_stats s1 = stats(on);
    run(on, &rb, &b);
    const struct mmrt_engine_stats s2 = stats(on);
    run(ref, &rb, &want);
    /* the same ids: only the spliced features differ */
    assert_int_equal(a.n_prompt, b.n_prompt);
    assert_memory_equal(a.prompt, b.prompt, (size_t)a.n_prompt * sizeof *a.prompt);
    assert_int_equal(a.n_features, b.n_features);
    assert_true(memcmp(a.features, b.features, (size_t)a.n_features * sizeof(float)) != 0);
    same_bits("another image", &b, &want);
    /* Only text before the image may be shared. */
    const int img_row = first_row_of(&b, image_id);
    assert_true(img_row < b.n_prompt);
    const int64_t text_only = reusable(b.n_prompt, img_row, s->chunk, s->page);
    assert_int_equal(s2.prefix_reused_tokens - s1.prefix_reused_tokens, text_only);
    assert_int_equal(s2.prefix_hits - s1.prefix_hits, text_only > 0);
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "%s: %d tokens, image from row %d, shared %lld\n", fixture, b.n_prompt,
                img_row, (long long)text_only);
    golden_capture_free(&a);
    golden_capture_free(&b);
    golden_capture_free(&want);
    mmrt_destroy(ref);
    mmrt_destroy(on);
}

static void test_other_image_llava(void **state)
{
    (void)state;
    check_other_image("llava-tiny", "images/orient1_24x16.jpg", "images/orient8_24x16.png", 384,
                      &(struct setup){ .chunk = 4, .page = 4 });
}

static void test_other_image_qwen2vl(void **state)
{
    (void)state;
    /* Qwen2-VL's system turn comes before the image: that much is shared, no more. */
    check_other_image("qwen2vl-tiny", "images/orient1_24x16.jpg", "images/orient8_24x16.png",
                      332 /* <|image_pad|> */, &(struct setup){ .chunk = 8, .page = 8 });
}

/* ---- memory pressure ---- */

/* A KV store that holds one request and little more: cached prefixes go to admit the next
 * request (LRU), nothing fails, and every request still gives its bits. */
static void test_eviction_tiny_store(void **state)
{
    (void)state;
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    const struct setup s = { .chunk = 8, .page = 4, .kv_tokens = 96, .max_batch = 1 };
    struct setup off = s;
    off.off = true;
    struct mmrt_runtime *on = open_rt("llava-tiny", &s), *ref = open_rt("llava-tiny", &off);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < c.n; i++) {
            struct golden_capture got = { 0 }, want = { 0 };
            run(on, &c.req[i], &got);
            run(ref, &c.req[i], &want);
            same_bits("tiny store", &got, &want);
            golden_capture_free(&got);
            golden_capture_free(&want);
            assert_pages_back(on);
        }
    const struct mmrt_engine_stats es = stats(on);
    assert_true(es.prefix_evictions > 0);
    assert_true(es.prefix_pages <= 24); /* the store's 96 positions */
    assert_int_equal(es.preemptions, 0); /* one request at a time: none needed */
    mmrt_destroy(ref);
    mmrt_destroy(on);
    json_decref(c.json);
}

/* Requests batched in a store too small for all of them: sequences that share a cached
 * prefix are preempted (their shared pages stay with the other holders), resume, share
 * again, and give the bits of the run without the cache. */
static void check_batch(const struct setup *s, int warm, bool want_preemption)
{
    struct golden_cases c;
    golden_cases_load("llava-tiny", &c);
    struct setup off = *s;
    off.off = true;
    struct mmrt_runtime *on = open_rt("llava-tiny", s), *ref = open_rt("llava-tiny", &off);
    /* 6 requests: case 0 four times, then cases 1 and 2 */
    struct mmrt_request reqs[6];
    for (int i = 0; i < 6; i++)
        reqs[i] = c.req[i < 4 ? 0 : i - 3];
    struct golden_capture want[6] = { { 0 } }, got[6] = { { 0 } };
    for (int i = 0; i < 6; i++)
        run(ref, &reqs[i], &want[i]);
    for (int i = 0; i < warm; i++) {
        struct golden_capture w = { 0 };
        run(on, &reqs[0], &w);
        golden_capture_free(&w);
    }
    const struct mmrt_engine_stats s0 = stats(on);
    struct mmrt_model_trace traces[6];
    struct mmrt_result res[6] = { { 0 } };
    for (int i = 0; i < 6; i++)
        golden_trace(&got[i], &traces[i]);
    if (mmrt_run_batch_traced(on, reqs, 6, traces, NULL, NULL, res) != MMRT_OK)
        fail_msg("batch: %s", mmrt_last_error(on));
    const struct mmrt_engine_stats s1 = stats(on);
    for (int i = 0; i < 6; i++) {
        char what[64];
        snprintf(what, sizeof what, "batched request %d", i);
        assert_int_equal(res[i].status, MMRT_OK);
        for (int st = 0; st < GOLDEN_MAX_STEPS && want[i].logits[st]; st++) {
            assert_non_null(got[i].logits[st]);
            if (memcmp(got[i].logits[st], want[i].logits[st],
                       (size_t)want[i].vocab * sizeof(float)) != 0)
                fail_msg("%s: step %d logits differ from the run without the prefix cache",
                         what, st);
        }
        assert_int_equal(res[i].n_tokens, want[i].n_tokens);
    }
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "batch: hits %llu reused %llu preemptions %llu evictions %llu "
                "max_running %d\n", (unsigned long long)(s1.prefix_hits - s0.prefix_hits),
                (unsigned long long)(s1.prefix_reused_tokens - s0.prefix_reused_tokens),
                (unsigned long long)(s1.preemptions - s0.preemptions),
                (unsigned long long)(s1.prefix_evictions - s0.prefix_evictions),
                s1.max_running);
    if (warm)
        assert_true(s1.prefix_hits - s0.prefix_hits >= 4);
    assert_true(s1.max_running > 1);
    if (want_preemption)
        assert_true(s1.preemptions > s0.preemptions);
    assert_pages_back(on);
    for (int i = 0; i < 6; i++) {
        golden_capture_free(&want[i]);
        golden_capture_free(&got[i]);
    }
    mmrt_destroy(ref);
    mmrt_destroy(on);
    json_decref(c.json);
}

static void test_batch_sharing_prefix(void **state)
{
    (void)state;
    check_batch(&(struct setup){ .chunk = 8, .page = 4 }, 1, false);
    /* not warmed: the copies admitted together compute the prefix themselves */
    check_batch(&(struct setup){ .chunk = 8, .page = 4, .max_batch = 2 }, 0, false);
}

static void test_preemption_shared_pages(void **state)
{
    (void)state;
    /* llava-tiny prompts are 33 … 45 tokens plus 16 generated: 96 positions hold two */
    check_batch(&(struct setup){ .chunk = 8, .page = 4, .kv_tokens = 96 }, 1, true);
    check_batch(&(struct setup){ .chunk = 4, .page = 4, .kv_tokens = 100 }, 2, true);
}

/* ---- configuration ---- */

static void test_conf_key(void **state)
{
    (void)state;
    struct mmrt_conf *c = NULL;
    struct mmrt_error err = { 0 };
    const char *text = "[device.d]\nplugin = cpu\n[cache]\nprefix = off\n";
    assert_int_equal(mmrt_conf_parse(text, strlen(text), "t.ini", &c, &err), MMRT_OK);
    assert_int_equal(c->cache.prefix, -1);
    assert_int_equal(c->cache.prefix_line, 4);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[cache]\nprefix = on\n";
    assert_int_equal(mmrt_conf_parse(text, strlen(text), "t.ini", &c, &err), MMRT_OK);
    assert_int_equal(c->cache.prefix, 1);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n";
    assert_int_equal(mmrt_conf_parse(text, strlen(text), "t.ini", &c, &err), MMRT_OK);
    assert_int_equal(c->cache.prefix, 0);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[cache]\nprefix = maybe\n";
    assert_int_equal(mmrt_conf_parse(text, strlen(text), "t.ini", &c, &err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "prefix"));
    assert_non_null(strstr(err.msg, "on or off"));
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conf_key),
        cmocka_unit_test(test_repeat_llava),
        cmocka_unit_test(test_repeat_llava_next),
        cmocka_unit_test(test_repeat_fuyu),
        cmocka_unit_test(test_repeat_qwen2vl),
        cmocka_unit_test(test_repeat_opencl),
        cmocka_unit_test(test_follow_up_llava),
        cmocka_unit_test(test_follow_up_qwen2vl),
        cmocka_unit_test(test_other_image_llava),
        cmocka_unit_test(test_other_image_qwen2vl),
        cmocka_unit_test(test_eviction_tiny_store),
        cmocka_unit_test(test_batch_sharing_prefix),
        cmocka_unit_test(test_preemption_shared_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
