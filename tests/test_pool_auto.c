/*
 * tests/test_pool_auto.c — pool_mb = auto (models/pool_budget.h) and the [device] level1 key.
 *
 *   - Every fixture model type (LLaVA-1.5, LLaVA-NeXT, Qwen2-VL, Fuyu) runs its largest
 *     request under pool_mb = auto — an image and a prompt that fills nearly all of the KV
 *     store the default gives (the model's context) — with level 1 on and off, and the pool's
 *     measured peak (bytes held) stays within the estimate without its margin: the estimate
 *     covers what the model code allocates, so a change there that allocates more fails here.
 *   - The automatic pool is small for these models, and an automatic pool larger than the
 *     device (a KV budget no machine holds) is refused with the figures and the keys.
 *   - level1 = off reaches the device's pool (no level-1 hit, no slab), on (the default)
 *     serves the decode step's repeated sizes from level 1; a value outside enum mmrt_level1
 *     in the config struct, and a bad INI value, are configuration errors naming the key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.h"
#include "formats/json.h"
#include "kv_cache.h"
#include "mmrt/mmrt.h"
#include "request_util.h"
#include "pool_budget.h"
#include "vision_cache.h"

static const char *src_dir;

/* [scheduler] vision_batch of the runtimes these tests make (the estimate counts it). */
#define POOL_TEST_VISION_BATCH 8

static void quiet(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)who;
    if (level >= MMRT_LOG_WARN)
        fprintf(stderr, "%s\n", msg);
}

struct fixture {
    const char *dir, *model_type, *image;
};

static const struct fixture fixtures[] = {
    { "llava-tiny", "llava", "llava-images/grad_80x60.png" },
    { "llava-next-tiny", "llava_next", "llava-next-images/grad_100x40.png" },
    { "qwen2vl-tiny", "qwen2_vl", "qwen2vl-images/grad_98x70.png" },
    { "fuyu-tiny", "fuyu", "llava-images/grad_80x60.png" },
};

static void path_of(char *out, size_t size, const char *rel)
{
    snprintf(out, size, "%s/tests/fixtures/%s", src_dir, rel);
}

static void estimate(const char *dir, const char *type, struct mmrt_pool_budget *b)
{
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    json_t *root = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_json_load_file(cfg, 1 << 24, 0, &root, &err), MMRT_OK);
    /* What the runtime asks for with the default [scheduler]. */
    const struct mmrt_model_options o = {
        .max_prefill_rows = MMRT_ENGINE_DEFAULT_CHUNK + MMRT_ENGINE_DEFAULT_BATCH,
        .max_decode_rows = MMRT_ENGINE_DEFAULT_BATCH,
        .vision_batch = POOL_TEST_VISION_BATCH,
    };
    assert_int_equal(mmrt_pool_budget_estimate(type, dir, root, &o, b, &err), MMRT_OK);
    json_decref(root);
}

/* A prompt of n words. */
static char *words(int n)
{
    char *p = malloc((size_t)n * 2 + 1);
    assert_non_null(p);
    for (int i = 0; i < n; i++) {
        p[2 * i] = (char)('a' + i % 26);
        p[2 * i + 1] = ' ';
    }
    p[2 * n] = '\0';
    return p;
}

static void run_largest(const struct fixture *f, enum mmrt_level1 level1)
{
    char dir[4096], image[4096], err[1024] = "";
    path_of(dir, sizeof dir, f->dir);
    path_of(image, sizeof image, f->image);
    struct mmrt_pool_budget b;
    estimate(dir, f->model_type, &b);

    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 0,
                                      .level1 = level1 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .vision_batch = POOL_TEST_VISION_BATCH };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_OK);
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    assert_int_equal(mr.pool_capacity_bytes >> 20, mmrt_pool_budget_mb(&b, true, true));
    /* The KV store is the context the pool was sized for, not half the pool. */
    assert_int_equal(mr.kv_pages_total * mr.kv_page_tokens, (uint64_t)b.kv_tokens);

    /* The longest prompt the store admits: shrink until the request is not refused. */
    int n = (int)b.kv_tokens, n_prompt = 0;
    mmrt_status st = MMRT_ERR_LIMIT;
    while (st == MMRT_ERR_LIMIT && n > 8) {
        char *prompt = words(n);
        struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                    .prompt = prompt, .max_tokens = 2,
                                    .top_p = 1.0f };
        struct mmrt_result res = { 0 };
        st = mmrt_run(rt, &req, NULL, NULL, &res);
        n_prompt = res.n_prompt_tokens;
        free(prompt);
        n = n * 9 / 10;
    }
    if (st != MMRT_OK)
        fail_msg("%s: %s", f->dir, mmrt_last_error(rt));
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    /* nearly all of the context, so the prefill was the largest one */
    assert_true((int64_t)n_prompt * 10 >= b.kv_tokens * 7);
    const uint64_t covered = b.kv_bytes + b.language_bytes + b.vision_bytes;
    if (getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "%s level1 %d: pool %llu MiB, prompt %d tokens, peak held %llu, "
                "estimate %llu (KV %llu, language %llu, vision %llu)\n", f->dir, (int)level1,
                (unsigned long long)(mr.pool_capacity_bytes >> 20), n_prompt,
                (unsigned long long)mr.pool_peak_bytes_held, (unsigned long long)covered,
                (unsigned long long)b.kv_bytes, (unsigned long long)b.language_bytes,
                (unsigned long long)b.vision_bytes);
    if (mr.pool_peak_bytes_held > covered)
        fail_msg("%s (level1 %d): peak %llu bytes held, more than the %llu the estimate counts",
                 f->dir, (int)level1, (unsigned long long)mr.pool_peak_bytes_held,
                 (unsigned long long)covered);
    mmrt_destroy(rt);
}

/* The pool's peak after a vision batch of n demo requests with [scheduler] vision_batch vb. */
static uint64_t vision_batch_peak(const char *dir, int vb, int n)
{
    char err[1024] = "", img[POOL_TEST_VISION_BATCH][4200];
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 0 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .vision_cache_entries = -1,
                               .vision_batch = vb };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_OK);
    struct mmrt_image_input in[POOL_TEST_VISION_BATCH];
    struct mmrt_request reqs[POOL_TEST_VISION_BATCH];
    for (int i = 0; i < n; i++) {
        snprintf(img[i], sizeof img[i], "%s/demo/heldout/%03d.png", src_dir, i);
        in[i] = (struct mmrt_image_input){ .path = img[i] };
        reqs[i] = (struct mmrt_request){ .images = &in[i], .n_images = 1, .prompt = "Hi",
                                         .max_tokens = 1, .top_p = 1.0f };
    }
    struct mmrt_vision_output outs[POOL_TEST_VISION_BATCH];
    mmrt_status sts[POOL_TEST_VISION_BATCH];
    struct mmrt_error errs[POOL_TEST_VISION_BATCH];
    mmrt_runtime_vision_batch(rt, reqs, n, outs, sts, errs);
    for (int i = 0; i < n; i++) {
        if (sts[i] != MMRT_OK)
            fail_msg("image %d: %s", i, errs[i].msg);
        mmrt_vision_output_free(&outs[i]);
    }
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    mmrt_destroy(rt);
    return mr.pool_peak_bytes_held;
}

/* A vision batch of eight on the demo model (whose images share passes of the
 * tower: 65 rows each) fits the automatic pool: its peak stays within the estimate, and is
 * above the peak of the same requests one pass each (so the pass was shared). */
static void test_auto_fits_a_vision_batch(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/demo/llava-shapes", src_dir);
    struct mmrt_pool_budget b;
    estimate(dir, "llava", &b);
    const uint64_t shared = vision_batch_peak(dir, POOL_TEST_VISION_BATCH,
                                              POOL_TEST_VISION_BATCH);
    const uint64_t each = vision_batch_peak(dir, 1, POOL_TEST_VISION_BATCH);
    const uint64_t covered = b.kv_bytes + b.language_bytes + b.vision_bytes;
    if (shared > covered)
        fail_msg("vision batch: peak %llu bytes held, more than the %llu the estimate counts",
                 (unsigned long long)shared, (unsigned long long)covered);
    assert_true(shared > each);
}

static void test_auto_fits_the_largest_request(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        run_largest(&fixtures[i], MMRT_LEVEL1_DEFAULT);
        run_largest(&fixtures[i], MMRT_LEVEL1_OFF);
    }
}

/* The vision stage's share is bounded by the image tokens one request may carry (the
 * context, the KV store, max_image_tokens, the processor's largest image), never by how
 * the engine cuts prompts into prefill chunks: a Qwen2-VL image of 1,600 tokens once got a
 * pool sized for a 528-row chunk's worth of patches and failed on the CPU. */
static void test_vision_not_bounded_by_the_chunk(void **state)
{
    (void)state;
    static const char *const models[][2] = { { "qwen2vl-tiny", "qwen2_vl" },
                                             { "fuyu-tiny", "fuyu" } };
    for (size_t m = 0; m < 2; m++) {
        char dir[4096], cfg[4200];
        snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", src_dir, models[m][0]);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        json_t *root = NULL;
        struct mmrt_error err = { 0 };
        assert_int_equal(mmrt_json_load_file(cfg, 1 << 24, 0, &root, &err), MMRT_OK);
        struct mmrt_model_options whole = { .max_decode_rows = 1 };
        struct mmrt_model_options chunked = { .max_prefill_rows = 4, .max_decode_rows = 1 };
        struct mmrt_pool_budget a, b;
        assert_int_equal(mmrt_pool_budget_estimate(models[m][1], dir, root, &whole, &a, &err),
                         MMRT_OK);
        assert_int_equal(mmrt_pool_budget_estimate(models[m][1], dir, root, &chunked, &b, &err),
                         MMRT_OK);
        json_decref(root);
        assert_int_equal(b.language_rows, 4);
        assert_true(a.vision_rows > 4 * 4);
        assert_int_equal(b.vision_rows, a.vision_rows);
        assert_true(b.vision_bytes == a.vision_bytes);
    }
}

/* The KV store's packing: a 7B layer's 12 MiB (768 positions) in 512 + 256 + 16 MiB, not
 * 64 blocks of 16; power-of-two tensors in one block; a cap on the block size. */
static void test_kv_store_plan(void **state)
{
    (void)state;
    int64_t c[MMRT_KV_MAX_BLOCKS];
    uint64_t bytes;
    assert_int_equal(mmrt_kv_store_plan(12ull << 20, 64, 256, 0, c, &bytes), 3);
    assert_int_equal(c[0], 42);
    assert_int_equal(c[1], 21);
    assert_int_equal(c[2], 1);
    assert_int_equal(bytes, 784ull << 20);
    assert_int_equal(mmrt_kv_store_plan(16ull << 20, 64, 256, 0, c, &bytes), 1);
    assert_int_equal(bytes, 1ull << 30);
    assert_int_equal(mmrt_kv_store_plan(16ull << 20, 64, 256, 256ull << 20, c, &bytes), 4);
    assert_int_equal(c[3], 16);
    assert_int_equal(bytes, 1ull << 30);
    /* a tensor of 100 bytes takes a 256-byte step */
    assert_int_equal(mmrt_kv_store_plan(100, 3, 256, 0, c, &bytes), 2);
    assert_int_equal(c[0] + c[1], 3);
    assert_int_equal(bytes, 768);
}

static void test_auto_too_large_is_refused(void **state)
{
    (void)state;
    char dir[4096], err[1024] = "";
    path_of(dir, sizeof dir, "llava-tiny");
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu" };
    /* 2^30 positions of two layers' keys and values: terabytes. */
    struct mmrt_config cfg = { .model_path = dir, .devices = &dev, .n_devices = 1,
                               .max_kv_tokens = 1ll << 30 };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_null(rt);
    if (!strstr(err, "pool_mb = auto is ") || !strstr(err, "for 1073741824 tokens") ||
        !strstr(err, "max_kv_tokens") || !strstr(err, "MiB of memory"))
        fail_msg("unexpected message: %s", err);
}

static void test_level1_key(void **state)
{
    (void)state;
    char dir[4096], image[4096], err[1024] = "";
    path_of(dir, sizeof dir, "llava-tiny");
    path_of(image, sizeof image, "llava-images/grad_80x60.png");
    const enum mmrt_level1 modes[2] = { MMRT_LEVEL1_DEFAULT, MMRT_LEVEL1_OFF };
    for (int m = 0; m < 2; m++) {
        struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 32,
                                          .level1 = modes[m] };
        struct mmrt_config cfg = { .model_path = dir, .devices = &dev, .n_devices = 1 };
        struct mmrt_runtime *rt = NULL;
        assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_OK);
        struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                    .prompt = "What is it?",
                                    .max_tokens = 8, .top_p = 1.0f };
        struct mmrt_result res = { 0 };
        assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
        struct mmrt_memory_report mr = { .struct_size = sizeof mr };
        assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
        if (modes[m] == MMRT_LEVEL1_OFF) {
            assert_int_equal(mr.level1_hits, 0);
            assert_int_equal(mr.level1_bytes, 0);
            assert_int_equal(mr.pool_bytes_held, mr.pool_bytes_in_use);
        } else {
            assert_true(mr.level1_hits > 0);
        }
        mmrt_destroy(rt);
    }

    struct mmrt_device_config bad = { .name = "c", .plugin = "cpu", .level1 = 7 };
    struct mmrt_config cfg = { .devices = &bad, .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [device.c]: level1 7 is not an enum mmrt_level1 value");

    char ini[] = "/tmp/mmrt_level1_XXXXXX";
    int fd = mkstemp(ini);
    assert_true(fd >= 0);
    static const char text[] = "[device.c]\nplugin = cpu\nlevel1 = sometimes\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    assert_int_equal(mmrt_create_from_file(ini, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    char want[256];
    snprintf(want, sizeof want, "%s:3: [device.c] level1 = 'sometimes': expected on or off",
             ini);
    assert_string_equal(err, want);
    unlink(ini);
}

int main(void)
{
    const char *src = getenv("MMRT_SOURCE_DIR");
    src_dir = src ? src : ".";
    mmrt_set_log_sink(quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_fits_the_largest_request),
        cmocka_unit_test(test_vision_not_bounded_by_the_chunk),
        cmocka_unit_test(test_auto_fits_a_vision_batch),
        cmocka_unit_test(test_kv_store_plan),
        cmocka_unit_test(test_auto_too_large_is_refused),
        cmocka_unit_test(test_level1_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
