/*
 * tests/test_vision_batch.c — vision stages of several requests run together ([scheduler]
 * vision_batch, model.h encode_batch, mmrt_vision_front_encode_batch).
 *
 * The bar is the engine's: a request's features are the bits it gets alone. The demo model
 * (demo/llava-shapes: 65 tower rows and 64 projector rows per image, above MMRT_SMALL_M) runs
 * a batch through one pass of its tower and projector, on the CPU plugin and with the vision
 * stage on OpenCL; the tiny LLaVA fixture (17 tower rows) takes one pass per image. Each is
 * compared by memcmp with the request alone: cache off, cache on with hits and misses mixed,
 * a bad image and a request without images in the batch (each fails or passes exactly as
 * alone). Through the worker, a burst of submitted jobs shares vision stages (counted by
 * mmrt_stats) and every job gives the tokens of its solo run.
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden.h"
#include "image_fixtures.h"
#include "mmrt/mmrt.h"
#include "request_util.h"
#include "vision_cache.h"

#define N_REQ 6

struct rt_opts {
    const char *vision_plugin; /* NULL: the CPU plugin for both stages */
    int64_t cache_entries;     /* as mmrt_config: 0 = default (on), negative = off */
    int vision_batch;
};

static void demo_dir(char *buf, size_t size, const char *rel)
{
    snprintf(buf, size, "%s/demo/%s", golden_src_dir(), rel);
}

static struct mmrt_runtime *open_rt(const char *model_dir, struct rt_opts o)
{
    char err[2048] = "";
    struct mmrt_device_config devs[2] = {
        { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 },
        { .name = "acc", .plugin = o.vision_plugin, .pool_mb = 64 },
    };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = model_dir,
                               .devices = devs, .n_devices = o.vision_plugin ? 2 : 1,
                               .vision_device = o.vision_plugin ? "acc" : NULL,
                               .vision_cache_entries = o.cache_entries,
                               .vision_batch = o.vision_batch };
    struct mmrt_runtime *rt = NULL;
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", model_dir, err);
    return rt;
}

/* Bit for bit the same vision output. */
static void same_vision(int i, const struct mmrt_vision_output *a,
                        const struct mmrt_vision_output *b)
{
    assert_int_equal(a->n_images, b->n_images);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_int_equal(a->dim, b->dim);
    const int64_t rows = mmrt_vision_output_rows(a);
    assert_int_equal(rows, mmrt_vision_output_rows(b));
    if (rows > 0 && memcmp(a->features, b->features, (size_t)(rows * a->dim) * sizeof(float)))
        fail_msg("request %d: features in the batch differ from alone (rel %.3g)", i,
                 golden_rel_err(a->features, b->features, rows * a->dim));
}

/* N_REQ requests on the demo's held-out pictures (heldout/000.png …). */
struct reqs {
    char paths[N_REQ][4200];
    struct mmrt_image_input imgs[N_REQ];
    struct mmrt_request r[N_REQ];
};

static void make_reqs(struct reqs *q, const char *img_dir, const char *const *names)
{
    for (int i = 0; i < N_REQ; i++) {
        snprintf(q->paths[i], sizeof q->paths[i], "%s/%s", img_dir, names[i]);
        q->imgs[i] = (struct mmrt_image_input){ .path = q->paths[i] };
        q->r[i] = (struct mmrt_request){ .struct_size = sizeof q->r[i], .prompt = "Describe "
                                         "the picture.", .images = &q->imgs[i], .n_images = 1,
                                         .max_tokens = 8, .top_p = 1.0f };
    }
}

static const char *const g_heldout[N_REQ] = { "000.png", "001.png", "002.png",
                                              "003.png", "004.png", "005.png" };

/* The demo model's directory, and N_REQ requests on its first held-out pictures. */
static void demo_reqs(char *model, size_t size, struct reqs *q)
{
    char imgs[4096];
    demo_dir(model, size, "llava-shapes");
    demo_dir(imgs, sizeof imgs, "heldout");
    make_reqs(q, imgs, g_heldout);
}

/* Every request of q through mmrt_runtime_vision_batch against mmrt_runtime_vision alone
 * on `alone` (a runtime without the cache, so alone is the model's own work). */
static void batch_matches_alone(struct mmrt_runtime *rt, struct mmrt_runtime *alone,
                                const struct reqs *q)
{
    struct mmrt_vision_output got[N_REQ], want;
    mmrt_status sts[N_REQ];
    struct mmrt_error errs[N_REQ];
    mmrt_runtime_vision_batch(rt, q->r, N_REQ, got, sts, errs);
    for (int i = 0; i < N_REQ; i++) {
        struct mmrt_error e = { 0 };
        const mmrt_status st = mmrt_runtime_vision(alone, &q->r[i], &want, &e);
        assert_int_equal(sts[i], st);
        if (st != MMRT_OK)
            assert_string_equal(errs[i].msg, e.msg);
        else
            same_vision(i, &got[i], &want);
        mmrt_vision_output_free(&got[i]);
        mmrt_vision_output_free(&want);
    }
}

/* One pass of the tower over six pictures: each its own bits, cache off and on (a second
 * batch mixes hits and misses). */
static void demo_batch(const char *vision_plugin)
{
    char model[4096];
    struct reqs q;
    demo_reqs(model, sizeof model, &q);
    struct mmrt_runtime *alone = open_rt(model, (struct rt_opts){ vision_plugin, -1, 1 });
    struct mmrt_runtime *off = open_rt(model, (struct rt_opts){ vision_plugin, -1, 8 });
    batch_matches_alone(off, alone, &q);
    mmrt_destroy(off);
    struct mmrt_runtime *on = open_rt(model, (struct rt_opts){ vision_plugin, 0, 8 });
    struct mmrt_vision_output v;
    struct mmrt_error e = { 0 };
    for (int i = 0; i < N_REQ; i += 2) { /* 0, 2, 4 cached before the batch */
        assert_int_equal(mmrt_runtime_vision(on, &q.r[i], &v, &e), MMRT_OK);
        mmrt_vision_output_free(&v);
    }
    batch_matches_alone(on, alone, &q);
    struct mmrt_runtime_stats s = { .struct_size = sizeof s };
    assert_int_equal(mmrt_stats(on, &s), MMRT_OK);
    assert_int_equal(s.vision_cache_queries, 3 + N_REQ);
    assert_int_equal(s.vision_cache_hits, 3);
    mmrt_destroy(on);
    mmrt_destroy(alone);
}

static void test_demo_batch_cpu(void **state)
{
    (void)state;
    demo_batch(NULL);
}

static void test_demo_batch_vision_on_opencl(void **state)
{
    (void)state;
    demo_batch("opencl");
}

/* A picture that does not decode and a request without images, among good ones: each fails
 * or passes as alone, with the same message, and the others keep their bits. */
static void test_failures_stay_alone(void **state)
{
    (void)state;
    char model[4096];
    struct reqs q;
    demo_reqs(model, sizeof model, &q);
    static const uint8_t junk[] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 1, 2, 3 };
    q.imgs[1] = (struct mmrt_image_input){ .data = junk, .size = sizeof junk };
    q.r[3].images = NULL;
    q.r[3].n_images = 0;
    q.r[3].prompt = "Hello.";
    for (int64_t cache = -1; cache <= 0; cache++) {
        struct mmrt_runtime *alone = open_rt(model, (struct rt_opts){ NULL, -1, 1 });
        struct mmrt_runtime *rt = open_rt(model, (struct rt_opts){ NULL, cache, 8 });
        batch_matches_alone(rt, alone, &q);
        mmrt_destroy(rt);
        mmrt_destroy(alone);
    }
}

/* n in-memory PNGs of the sizes wh (pixels from the index), freed by the caller. */
static void make_pngs(int n_png, const uint32_t (*wh)[2], uint8_t **png, size_t *len)
{
    for (int i = 0; i < n_png; i++) {
        const size_t n = (size_t)wh[i][0] * wh[i][1] * 3;
        uint8_t *rgb = malloc(n);
        assert_non_null(rgb);
        for (size_t b = 0; b < n; b++)
            rgb[b] = (uint8_t)((b * (7 + 2 * (size_t)i)) ^ (b >> 9));
        png[i] = fx_make_png(wh[i][0], wh[i][1], wh[i][1], rgb, NULL, 0, &len[i]);
        free(rgb);
    }
}

/* The tiny fixtures' images and tiles have 17 tower rows: one pass each, the same bits.
 * LLaVA-NeXT's images of several aspect ratios (so grids and tile counts) in one batch,
 * each with its own projector pass and packing. */
static void test_small_images_one_pass_each(void **state)
{
    (void)state;
    char model[4096], imgs[4096];
    golden_fixture_path(model, sizeof model, "llava-tiny");
    golden_fixture_path(imgs, sizeof imgs, "llava-images");
    static const char *const names[N_REQ] = { "grad_80x60.png", "grad_36x100.png",
                                              "grad_64x64.png", "grad_45x90.png",
                                              "grad_80x60.png", "grad_64x64.png" };
    struct reqs q;
    make_reqs(&q, imgs, names);
    struct mmrt_runtime *alone = open_rt(model, (struct rt_opts){ NULL, -1, 1 });
    struct mmrt_runtime *rt = open_rt(model, (struct rt_opts){ NULL, -1, 8 });
    batch_matches_alone(rt, alone, &q);
    mmrt_destroy(rt);
    mmrt_destroy(alone);

    static const uint32_t wh[N_REQ][2] = { { 120, 40 }, { 30, 90 }, { 64, 64 },
                                           { 100, 40 }, { 37, 53 }, { 90, 31 } };
    uint8_t *png[N_REQ];
    size_t len[N_REQ];
    make_pngs(N_REQ, wh, png, len);
    for (int i = 0; i < N_REQ; i++)
        q.imgs[i] = (struct mmrt_image_input){ .data = png[i], .size = len[i] };
    golden_fixture_path(model, sizeof model, "llava-next-tiny");
    alone = open_rt(model, (struct rt_opts){ NULL, -1, 1 });
    rt = open_rt(model, (struct rt_opts){ NULL, -1, 8 });
    batch_matches_alone(rt, alone, &q);
    mmrt_destroy(rt);
    mmrt_destroy(alone);
    for (int i = 0; i < N_REQ; i++)
        free(png[i]);
}

/* Qwen2-VL packs images of different sizes into one pass (attention per image): requests of
 * one and of two images, large (48 … 100 tokens, packed) and small (8 tokens, alone) ones
 * mixed, a request without images and one whose image does not decode, each as alone. The
 * fixture's processor is widened (max_pixels) so that its images can exceed MMRT_SMALL_M
 * tokens. */
static void test_qwen2vl_packs_mixed_sizes(void **state)
{
    (void)state;
    golden_scratch_make("qwen2vl-tiny");
    golden_set_json("processor_config.json", "image_processor/size/longest_edge",
                    json_integer(200704));
    static const uint32_t wh[][2] = { { 224, 168 }, { 98, 70 }, { 280, 280 }, { 196, 252 },
                                      { 168, 224 } };
    enum { N_IMG = sizeof wh / sizeof wh[0] };
    uint8_t *png[N_IMG];
    size_t len[N_IMG];
    make_pngs(N_IMG, wh, png, len);
    static const uint8_t junk[] = { 0x89, 'P', 'N', 'G', 1, 2, 3 };
    struct mmrt_image_input in[] = {
        { .data = png[0], .size = len[0] }, { .data = png[1], .size = len[1] }, /* r0 */
        { .data = png[2], .size = len[2] },                                     /* r1 */
        { .data = png[3], .size = len[3] }, { .data = png[4], .size = len[4] }, /* r2 */
        { .data = junk, .size = sizeof junk },                                  /* r4 */
        { .data = png[1], .size = len[1] },                                     /* r5 */
    };
    struct mmrt_request r[N_REQ];
    static const int first[N_REQ] = { 0, 2, 3, 0, 5, 6 }, count[N_REQ] = { 2, 1, 2, 0, 1, 1 };
    for (int i = 0; i < N_REQ; i++)
        r[i] = (struct mmrt_request){ .struct_size = sizeof r[i], .prompt = "Compare.",
                                      .images = count[i] ? &in[first[i]] : NULL,
                                      .n_images = count[i], .max_tokens = 4, .top_p = 1.0f };
    struct mmrt_runtime *alone = open_rt(golden_scratch, (struct rt_opts){ NULL, -1, 1 });
    for (int64_t cache = -1; cache <= 0; cache++) {
        struct mmrt_runtime *rt = open_rt(golden_scratch, (struct rt_opts){ NULL, cache, 8 });
        struct mmrt_vision_output got[N_REQ], want;
        mmrt_status sts[N_REQ];
        struct mmrt_error errs[N_REQ];
        mmrt_runtime_vision_batch(rt, r, N_REQ, got, sts, errs);
        for (int i = 0; i < N_REQ; i++) {
            struct mmrt_error e = { 0 };
            const mmrt_status st = mmrt_runtime_vision(alone, &r[i], &want, &e);
            assert_int_equal(sts[i], st);
            if (st != MMRT_OK) {
                assert_string_equal(errs[i].msg, e.msg);
            } else {
                same_vision(i, &got[i], &want);
                if (want.n_images) {
                    assert_memory_equal(got[i].tokens_per_image, want.tokens_per_image,
                                        (size_t)want.n_images * sizeof(int64_t));
                    assert_memory_equal(got[i].grid_thw, want.grid_thw,
                                        (size_t)want.n_images * 3 * sizeof(int32_t));
                }
            }
            mmrt_vision_output_free(&got[i]);
            mmrt_vision_output_free(&want);
        }
        mmrt_destroy(rt);
    }
    /* A request of two large images packs them even alone: its features are those of each
     * image in a request of its own, one after the other. */
    struct mmrt_vision_output two, one[2];
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_runtime_vision(alone, &r[2], &two, &e), MMRT_OK);
    int64_t row = 0;
    for (int k = 0; k < 2; k++) {
        struct mmrt_request rk = r[2];
        rk.images = &in[3 + k];
        rk.n_images = 1;
        assert_int_equal(mmrt_runtime_vision(alone, &rk, &one[k], &e), MMRT_OK);
        assert_true(one[k].n_tokens > 32);
        const size_t n = (size_t)(one[k].n_tokens * one[k].dim) * sizeof(float);
        if (memcmp(two.features + row * two.dim, one[k].features, n) != 0)
            fail_msg("image %d packed with another differs from alone", k + 1);
        row += one[k].n_tokens;
        mmrt_vision_output_free(&one[k]);
    }
    assert_int_equal(row, two.n_tokens);
    mmrt_vision_output_free(&two);
    mmrt_destroy(alone);
    for (int i = 0; i < N_IMG; i++)
        free(png[i]);
}

/* ---- through the worker ---- */

struct gate {
    sem_t entered, release;
    bool first;
};

/* The blocking request's token callback: holds its engine step (and with it the runtime's
 * drive lock) until the test has queued its burst. */
static bool gate_token(void *user, int32_t id, const char *text)
{
    (void)id;
    (void)text;
    struct gate *g = user;
    if (g->first) {
        g->first = false;
        sem_post(&g->entered);
        sem_wait(&g->release);
    }
    return true;
}

struct blocker {
    struct mmrt_runtime *rt;
    const struct mmrt_request *req;
    struct gate *gate;
    mmrt_status st;
};

static void *blocker_main(void *arg)
{
    struct blocker *b = arg;
    struct mmrt_result res = { .struct_size = sizeof res };
    b->st = mmrt_run(b->rt, b->req, gate_token, b->gate, &res);
    return NULL;
}

/* Six jobs submitted while an mmrt_run holds the engine: the worker finds them waiting
 * together and runs their vision stages in batches of at most vision_batch (4) — two or
 * three stages, however the worker's wake-up falls, never six — and each job's tokens are
 * those of its solo run. */
static void test_worker_batches_a_burst(void **state)
{
    (void)state;
    char model[4096];
    struct reqs q;
    demo_reqs(model, sizeof model, &q);
    struct tokens solo[N_REQ], got[N_REQ];
    struct mmrt_runtime *rt = open_rt(model, (struct rt_opts){ NULL, -1, 4 });
    for (int i = 0; i < N_REQ; i++) {
        memset(&solo[i], 0, sizeof solo[i]);
        struct mmrt_result res = { .struct_size = sizeof res };
        assert_int_equal(mmrt_run(rt, &q.r[i], test_collect, &solo[i], &res), MMRT_OK);
        assert_true(solo[i].n > 0);
    }
    struct gate g = { .first = true };
    sem_init(&g.entered, 0, 0);
    sem_init(&g.release, 0, 0);
    struct blocker b = { .rt = rt, .req = &q.r[0], .gate = &g };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, blocker_main, &b), 0);
    sem_wait(&g.entered);
    struct mmrt_job *jobs[N_REQ];
    char err[1024];
    for (int i = 0; i < N_REQ; i++) {
        memset(&got[i], 0, sizeof got[i]);
        if (mmrt_submit(rt, &q.r[i], test_collect, &got[i], &jobs[i], err, sizeof err) !=
            MMRT_OK)
            fail_msg("submit %d: %s", i, err);
    }
    sem_post(&g.release);
    for (int i = 0; i < N_REQ; i++) {
        struct mmrt_result res = { .struct_size = sizeof res };
        assert_int_equal(mmrt_wait(jobs[i], &res), MMRT_OK);
        assert_int_equal(got[i].n, solo[i].n);
        assert_memory_equal(got[i].ids, solo[i].ids, (size_t)solo[i].n * sizeof(int32_t));
    }
    pthread_join(th, NULL);
    assert_int_equal(b.st, MMRT_OK);
    struct mmrt_runtime_stats s = { .struct_size = sizeof s };
    assert_int_equal(mmrt_stats(rt, &s), MMRT_OK);
    print_message("%d jobs in %llu vision stages\n", N_REQ,
                  (unsigned long long)s.vision_batches);
    assert_int_equal(s.vision_batch_requests, N_REQ);
    assert_true(s.vision_batches >= 2 && s.vision_batches <= 3);
    mmrt_destroy(rt);
    sem_destroy(&g.entered);
    sem_destroy(&g.release);
}

/* [scheduler] vision_batch outside 1 … 32 is a configuration error. */
static void test_config_refused(void **state)
{
    (void)state;
    char model[4096], err[1024];
    golden_fixture_path(model, sizeof model, "llava-tiny");
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = model, .devices = &dev,
                               .n_devices = 1, .vision_batch = 33 };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [scheduler] vision_batch 33 must be 1 … 32 (0 = 1)");
    cfg.vision_batch = -1;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_null(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_batch_cpu),
        cmocka_unit_test(test_demo_batch_vision_on_opencl),
        cmocka_unit_test(test_failures_stay_alone),
        cmocka_unit_test(test_small_images_one_pass_each),
        cmocka_unit_test_teardown(test_qwen2vl_packs_mixed_sizes, golden_scratch_drop),
        cmocka_unit_test(test_worker_batches_a_burst),
        cmocka_unit_test(test_config_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
