/*
 * tests/test_llava_next.c — LLaVA-NeXT (1.6) against Hugging Face transformers (float32,
 * eager attention) on the tiny checkpoints tools/fixtures_llava_next.py wrote into
 * tests/fixtures/llava-next-*: the anyres pixel values of every tile, the packed image
 * features (base, unpadded grid, image_newline column) and the logits of every greedy step
 * within 1e-4 of the largest reference magnitude, greedy tokens identical. On the CPU plugin,
 * and with the vision stage on OpenCL when a device exists. Also bad configs and requests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "formats/image.h"
#include "golden.h"
#include "preprocess.h"

/* The prompt grew by the token count of §3.4, which the fixture records. */
static void check_case(const struct golden_case *gc)
{
    const json_t *ids = json_object_get(gc->json, "input_ids");
    assert_int_equal(gc->res->n_prompt_tokens, (int)json_array_size(ids));
}

static const struct golden_model llava_next = { .pixel_tensor = "pixel_values",
                                                .check_case = check_case };

/* Runs every case of one fixture directory and holds it to the reference; the vision stage
 * on vision_plugin when not NULL. */
static void check_fixture(const char *name, const char *vision_plugin)
{
    struct golden_summary s;
    golden_check_fixture(&llava_next, name, vision_plugin, &s);
    print_message("%s (vision on %s): %zu cases, worst relative error: pixels %.2g, image "
                  "features %.2g, logits %.2g; greedy tokens identical\n",
                  name, s.vision_on, s.n_cases, s.pixels, s.features, s.logits);
}

static void test_tiny(void **state)
{
    (void)state;
    check_fixture("llava-next-tiny", NULL);
}

static void test_alt_configuration(void **state)
{
    (void)state;
    check_fixture("llava-next-tiny-alt", NULL);
}

/* The vision stage (tiling, tower, projector, packing) on OpenCL, the decoder on the CPU. */
static void test_vision_on_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    check_fixture("llava-next-tiny", "opencl");
    check_fixture("llava-next-tiny-alt", "opencl");
}

/* ---- bad checkpoints and requests: a copy of llava-next-tiny with one file changed ---- */

static int make_scratch(void **state)
{
    (void)state;
    golden_scratch_make("llava-next-tiny");
    return 0;
}

static void test_bad_configs(void **state)
{
    (void)state;
    golden_set_config("image_grid_pinpoints", json_string("anyres"));
    golden_expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints must be a list of 1…64");
    golden_set_config("image_grid_pinpoints", json_pack("[[i,i],[i]]", 28, 56, 56));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "image_grid_pinpoints[1] is not a [height, width] pair");
    golden_set_config("image_grid_pinpoints", json_pack("[[i,s]]", 28, "56"));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "image_grid_pinpoints[0] is not a [height, width] pair");
    golden_set_config("image_grid_pinpoints", json_pack("[[i,i],[i,i]]", 28, 56, 30, 56));
    golden_expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints[1] = [30, 56] must be positive "
                                              "multiples of the vision image_size 28");
    golden_set_config("image_grid_pinpoints", json_pack("[[i,i]]", 0, 56));
    golden_expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints[0] = [0, 56]");
    golden_set_config("image_grid_pinpoints", json_pack("[[i,i]]", 28 * 9, 28 * 9));
    golden_expect_load_error(MMRT_ERR_FORMAT, "with at most 64 tiles");
    /* Valid, but not the processor's: the two would count image tokens differently. */
    golden_set_config("image_grid_pinpoints", json_pack("[[i,i]]", 28, 56));
    golden_expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints differ from config.json's");
    golden_set_config("image_grid_pinpoints",
                      json_pack("[[i,i],[i,i],[i,i]]", 28, 56, 56, 28, 56, 56));
    golden_set_config("vision_feature_select_strategy", json_string("full"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "only 'default' is supported");
    golden_set_config("vision_feature_select_strategy", json_string("default"));
    /* Everything restored: it loads again. */
    golden_expect_loads();
}

static void test_bad_requests(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    char image[4096];
    golden_fixture_path(image, sizeof image, "llava-images/grad_64x64.png");
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = "compare <image> please",
                                .max_tokens = 4, .top_p = 1.0f };
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "2 image placeholders but 1 image was given");
    req.images = NULL;
    req.n_images = 0;
    req.prompt = "what is <image>?";
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "1 image placeholder but 0 images were given");
    req.images = TEST_FILE("/nonexistent.png");
    req.n_images = 1;
    golden_expect_run_error(rt, &req, MMRT_ERR_IO, "/nonexistent.png");
    /* A good request still works afterwards, and nothing stays in the pool. */
    req.images = TEST_FILE(image);
    req.n_images = 1;
    req.prompt = "hi";
    golden_expect_pool_steady(rt, &req, 4);
    mmrt_destroy(rt);
}

/* ---- the image-token budget ([model] max_image_tokens, oversize_images) ---- */

/* Tiny NeXT: 28-px tiles of 4×4 patches (16 base tokens), pinpoints 28×56, 56×28, 56×56.
 * 64×64 takes the 56×56 grid: 16 + 8 × 9 = 88 tokens; 36×100 takes 56×28: 40 tokens. */
static void test_image_budget(void **state)
{
    (void)state;
    char fixture[4096], a[4096], b[4096], want[8192];
    golden_fixture_path(fixture, sizeof fixture, "llava-next-tiny");
    golden_fixture_path(a, sizeof a, "llava-images/grad_64x64.png");
    golden_fixture_path(b, sizeof b, "llava-images/grad_36x100.png");
    struct mmrt_request req = { .images = TEST_FILE(a), .n_images = 1,
                                .prompt = "hi", .max_tokens = 2, .top_p = 1.0f };
    struct mmrt_result res = { 0 };

    struct mmrt_runtime *rt = golden_open_budget(fixture, 50, MMRT_OVERSIZE_REFUSE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 64×64) needs 88 image tokens, more than "
             "max_image_tokens = 50 ([model] max_image_tokens); oversize_images = downscale "
             "would shrink it to fit", a);
    golden_expect_refused(rt, &req, want, &res);
    req.images = TEST_FILE(b);
    req.n_images = 1; /* 40 tokens */
    golden_run(rt, &req, NULL, &res);
    mmrt_destroy(rt);
    rt = golden_open_budget(fixture, 40, MMRT_OVERSIZE_REFUSE); /* exactly at the budget */
    golden_run(rt, &req, NULL, &res);
    mmrt_destroy(rt);

    /* downscale: the largest square under 64 px with at most 50 tokens is 28×28 — it fits
     * one 28×56 tile pair, unpadded to 4 columns: 16 + 4 × 5 = 36 — and the processor then
     * sees the Pillow-resized 28×28 image: its base patch is that image, normalised. */
    rt = golden_open_budget(fixture, 50, MMRT_OVERSIZE_DOWNSCALE);
    req.images = TEST_FILE(a);
    req.n_images = 1;
    struct golden_capture cap = { 0 };
    golden_run(rt, &req, &cap, &res);
    assert_int_equal(res.n_tokens, 2);
    const int64_t per = 3 * 28 * 28;
    assert_int_equal(cap.n_pixels, 3 * per); /* base + 2 tiles */
    assert_int_equal(cap.n_features, 36 * 32); /* text hidden_size 32 */
    struct mmrt_error e = { 0 };
    struct mmrt_image *img = NULL, *small = NULL;
    assert_int_equal(mmrt_image_load_file(a, NULL, &img, &e), MMRT_OK);
    assert_int_equal(mmrt_preprocess_resize(img, 28, 28, MMRT_RESAMPLE_BICUBIC, &small, &e),
                     MMRT_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/processor_config.json", fixture);
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_file(path, 1 << 20, 0, &root, &e), MMRT_OK);
    struct mmrt_clip_preprocess_config pp;
    assert_int_equal(mmrt_clip_preprocess_config_from_json(json_object_get(root,
                                                           "image_processor"), path, &pp, &e),
                     MMRT_OK);
    json_decref(root);
    float *base = malloc((size_t)per * sizeof *base);
    assert_non_null(base);
    assert_int_equal(mmrt_preprocess_clip(small, &pp, base, (size_t)per, &e), MMRT_OK);
    assert_memory_equal(base, cap.pixels, (size_t)per * sizeof *base);
    free(base);
    mmrt_image_destroy(small);
    mmrt_image_destroy(img);
    golden_capture_free(&cap);
    mmrt_destroy(rt);

    /* downscale that cannot fit: every smaller size still needs more than 30. */
    rt = golden_open_budget(fixture, 30, MMRT_OVERSIZE_DOWNSCALE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 64×64) needs 88 image tokens, more than "
             "max_image_tokens = 30 ([model] max_image_tokens); oversize_images = downscale "
             "cannot help: no smaller size of this aspect ratio has at most 30 image tokens "
             "(the base image alone takes 16)", a);
    golden_expect_refused(rt, &req, want, &res);
    mmrt_destroy(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_alt_configuration),
        cmocka_unit_test(test_vision_on_opencl),
        cmocka_unit_test_setup_teardown(test_bad_configs, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_requests, make_scratch, golden_scratch_drop),
        cmocka_unit_test(test_image_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
