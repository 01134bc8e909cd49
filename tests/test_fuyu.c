/*
 * tests/test_fuyu.c — Fuyu-8B (tiny configurations) on the CPU reference plugin against Hugging
 * Face transformers (float32, eager attention), on the checkpoints tools/fixtures_fuyu.py wrote
 * into tests/fixtures/fuyu-*: patches, projected patch embeddings and the logits of every
 * greedy step within 1e-4 of the largest reference magnitude, input ids and greedy tokens
 * identical. Also with the vision stage on OpenCL when a device exists, and the bad-input
 * cases of the Fuyu issue.
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

static const struct golden_model fuyu = { .pixel_tensor = "patches",
                                          .check_case = golden_check_prompt_ids };

/* Runs every case of one fixture directory and holds it to the reference (input ids too);
 * the vision stage on vision_plugin when not NULL. */
static void check_fixture(const char *name, const char *vision_plugin)
{
    struct golden_summary s;
    golden_check_fixture(&fuyu, name, vision_plugin, &s);
    print_message("%s%s%s: %zu cases, worst relative error: patches %.2g, patch embeddings "
                  "%.2g, logits %.2g; input ids and greedy tokens identical\n",
                  name, vision_plugin ? " vision on " : "", vision_plugin ? vision_plugin : "",
                  s.n_cases, s.pixels, s.features, s.logits);
}

static void test_tiny(void **state)
{
    (void)state;
    check_fixture("fuyu-tiny", NULL);
}

static void test_alt_configuration(void **state)
{
    (void)state;
    check_fixture("fuyu-tiny-alt", NULL);
}

/* The Persimmon decode step captured once and replayed on the CPU plugin (graph = 1): token
 * id, cache slot, position and KV length must reach the kernels through device memory. */
static void test_cpu_graph(void **state)
{
    (void)state;
    golden_cpu_graph = true;
    check_fixture("fuyu-tiny", NULL);
    check_fixture("fuyu-tiny-alt", NULL);
    golden_cpu_graph = false;
}

/* The patch projection on OpenCL, the Persimmon decoder on the CPU. */
static void test_vision_on_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    check_fixture("fuyu-tiny", "opencl");
    check_fixture("fuyu-tiny-alt", "opencl");
}

/* ---- bad checkpoints and requests: a copy of fuyu-tiny with one file changed ---- */

static int make_scratch(void **state)
{
    (void)state;
    golden_scratch_make("fuyu-tiny");
    return 0;
}

static void test_bad_configs(void **state)
{
    (void)state;
    golden_set_config("text_config/num_attention_heads", json_integer(5));
    golden_expect_load_error(MMRT_ERR_FORMAT, "not divisible by num_attention_heads 5");
    golden_set_config("text_config/num_attention_heads", json_integer(4));
    golden_set_config("text_config/hidden_act", json_string("gelu"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "hidden_act 'gelu' is not supported");
    golden_set_config("text_config/hidden_act", json_string("relu2"));
    /* 8 · 0.1 = 0.8 rotary dims. */
    golden_set_config("text_config/rope_parameters",
                      json_pack("{s:s, s:f, s:f}", "rope_type", "default", "rope_theta", 25000.0,
                                "partial_rotary_factor", 0.1));
    golden_expect_load_error(MMRT_ERR_FORMAT, "partial_rotary_factor 0.1 gives 0 rotary dims");
    golden_set_config("text_config/rope_parameters",
                      json_pack("{s:s, s:f}", "rope_type", "yarn", "rope_theta", 5e3));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "rope type 'yarn' is not supported");
    golden_set_config("text_config/rope_parameters",
                      json_pack("{s:s, s:f, s:f}", "rope_type", "default", "rope_theta", 25000.0,
                                "partial_rotary_factor", 0.5));
    golden_set_config("image_token_id", json_integer(100000));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "image_token_id 100000 is not below the vocab_size 376");
    golden_set_config("image_token_id", json_integer(259));
    /* The processor's patch size must be the model's. */
    golden_set_config("patch_size", json_integer(15));
    golden_expect_load_error(MMRT_ERR_FORMAT, "differs from the model's patch_size 15");
    golden_set_config("patch_size", json_integer(10));
    golden_set_json("preprocessor_config.json", "size",
                    json_pack("{s:i, s:i}", "height", 65, "width", 90));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "size 65×90 is not a multiple of the patch size 10");
    golden_set_json("preprocessor_config.json", "size",
                    json_pack("{s:i, s:i}", "height", 60, "width", 90));
    /* A config that disagrees with the weights: the shape check names the tensor. */
    golden_set_config("text_config/intermediate_size", json_integer(48));
    golden_expect_load_error(MMRT_ERR_FORMAT, "layers.0.mlp.dense_h_to_4h.weight' has shape "
                                              "[64, 32], config.json implies [48, 32]");
    golden_set_config("text_config/intermediate_size", json_integer(64));
    golden_expect_loads();
}

/* The hub layout: text fields at the top level, no text_config (FuyuConfig builds one). */
static void test_flat_config(void **state)
{
    (void)state;
    golden_flatten_config(NULL);
    /* Same numbers as the nested form: run case 0 of the fixture against it. */
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    char image[4096];
    golden_fixture_path(image, sizeof image, "llava-images/grad_80x60.png");
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = "Generate a coco-style caption.\n",
                                .max_tokens = 4, .top_p = 1.0f };
    struct golden_capture cap = { 0 };
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run(rt, &req, golden_on_token, &cap, &res), MMRT_OK);
    static const int32_t want[4] = { 331, 319, 17, 169 };
    assert_int_equal(cap.n_tokens, 4);
    assert_memory_equal(cap.tokens, want, sizeof want);
    mmrt_destroy(rt);
}

static void test_bad_requests(void **state)
{
    (void)state;
    /* A context of 40 positions: the 64×64 image needs 6 rows × 7 = 42 image tokens. */
    golden_set_config("text_config/max_position_embeddings", json_integer(40));
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    char image[4096], small[4096];
    golden_fixture_path(image, sizeof image, "llava-images/grad_64x64.png");
    golden_fixture_path(small, sizeof small, "llava-images/grad_45x90.png");
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = "hi", .max_tokens = 4,
                                .top_p = 1.0f };
    /* A refused image must not reach the patch projection. */
    struct golden_capture cap = { 0 };
    struct mmrt_model_trace trace;
    golden_trace(&cap, &trace);
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res), MMRT_ERR_LIMIT);
    if (!strstr(mmrt_last_error(rt), "needs 42 image tokens"))
        fail_msg("unexpected: %s", mmrt_last_error(rt));
    assert_int_equal(cap.n_feature_calls, 0);
    golden_capture_free(&cap);
    /* The 45×90 image (24 image tokens) fits, the prompt plus new tokens does not. */
    req.images = TEST_FILE(small);
    req.n_images = 1;
    req.max_tokens = 20;
    golden_expect_run_error(rt, &req, MMRT_ERR_LIMIT,
                            "exceeds the model's context of 40 positions");
    /* The image placeholder typed into the prompt. */
    req.max_tokens = 2;
    req.prompt = "look |SPEAKER| here";
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "prompt contains the image placeholder");
    /* Images that cannot be used. */
    req.prompt = "hi";
    golden_expect_unusable_images(rt, &req);
    req.images = TEST_FILE(small);
    req.n_images = 1;
    req.max_tokens = -1; /* 0 means up to the context */
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "max_tokens");
    /* And a good request still works afterwards: nothing leaked into the pool. */
    req.max_tokens = 3;
    golden_expect_pool_steady(rt, &req, 3);
    /* Text only: the tokenizer's own template, no image span. */
    req.images = NULL;
    req.n_images = 0;
    req.prompt = "What is shown?";
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(res.n_tokens, 3);
    mmrt_destroy(rt);
}

static void test_sampling_is_seeded(void **state)
{
    (void)state;
    char dir[4096], image[4096];
    golden_fixture_path(dir, sizeof dir, "fuyu-tiny");
    golden_fixture_path(image, sizeof image, "llava-images/grad_80x60.png");
    struct mmrt_runtime *rt = golden_open_or_fail(dir, NULL);
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = "What is this?\n",
                                .max_tokens = 12, .seed = 7, .temperature = 1.5f, .top_k = 50,
                                .top_p = 0.95f };
    golden_expect_seeded(rt, &req);
    mmrt_destroy(rt);
}

/* ---- the image-token budget ([model] max_image_tokens, oversize_images) ---- */

/* Tiny Fuyu: target 60×90 (height × width), 10-px patches, an image's tokens are
 * rows × (cols + 1). 80×60 → 6 × 9 = 54; 100×40 is fitted to 90×36 → 4 × 10 = 40. */
static void test_image_budget(void **state)
{
    (void)state;
    char fixture[4096], a[4096], b[4096], c[4096], d[4096], want[8192];
    golden_fixture_path(fixture, sizeof fixture, "fuyu-tiny");
    golden_fixture_path(a, sizeof a, "llava-images/grad_80x60.png");
    golden_fixture_path(b, sizeof b, "llava-next-images/grad_100x40.png");
    golden_fixture_path(c, sizeof c, "llava-images/grad_45x90.png");
    golden_fixture_path(d, sizeof d, "llava-images/grad_64x64.png");
    struct mmrt_request req = { .images = TEST_FILE(a), .n_images = 1,
                                .prompt = "hi", .max_tokens = 2, .top_p = 1.0f };
    struct mmrt_result res = { 0 };

    struct mmrt_runtime *rt = golden_open_budget(fixture, 30, MMRT_OVERSIZE_REFUSE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 80×60) needs 54 image tokens, more than "
             "max_image_tokens = 30 ([model] max_image_tokens); oversize_images = downscale "
             "would shrink it to fit", a);
    golden_expect_refused(rt, &req, want, &res);
    req.images = TEST_FILE(b);
    req.n_images = 1;
    snprintf(want, sizeof want, "image 1 of 1 (%s, 100×40, resized to 90×36) needs 40 image "
             "tokens, more than max_image_tokens = 30 ([model] max_image_tokens); "
             "oversize_images = downscale would shrink it to fit", b);
    golden_expect_refused(rt, &req, want, &res);
    req.images = TEST_FILE(c);
    req.n_images = 1; /* 6 × 4 = 24 */
    golden_run(rt, &req, NULL, &res);
    mmrt_destroy(rt);

    /* downscale: the largest 4:3 size with at most 30 tokens is 53×40 (4 × 7 = 28), and the
     * processor then pads that Pillow-resized image to 60×40 and cuts 24 patches. */
    rt = golden_open_budget(fixture, 30, MMRT_OVERSIZE_DOWNSCALE);
    req.images = TEST_FILE(a);
    req.n_images = 1;
    struct golden_capture cap = { 0 };
    golden_run(rt, &req, &cap, &res);
    assert_int_equal(res.n_tokens, 2);
    const size_t K = 10 * 10 * 3, n = 24 * K;
    assert_int_equal(cap.n_pixels, (int64_t)n);
    assert_int_equal(cap.n_features, 24 * 32); /* hidden_size 32 */
    struct mmrt_error e = { 0 };
    struct mmrt_image *img = NULL, *small = NULL, *padded = NULL;
    assert_int_equal(mmrt_image_load_file(a, NULL, &img, &e), MMRT_OK);
    assert_int_equal(mmrt_preprocess_resize(img, 53, 40, MMRT_RESAMPLE_BILINEAR, &small, &e),
                     MMRT_OK);
    const uint8_t fill[3] = { 1, 1, 1 }; /* padding_value 1.0 */
    assert_int_equal(mmrt_preprocess_pad(small, 0, 0, 7, 0, fill, &padded, &e), MMRT_OK);
    const struct mmrt_preprocess_normalize norm = {
        .do_rescale = true, .rescale_factor = 1.0 / 255, .do_normalize = true,
        .mean = { 0.5, 0.5, 0.5 }, .std = { 0.5, 0.5, 0.5 },
    };
    float *chw = malloc(n * sizeof *chw), *patches = malloc(n * sizeof *patches);
    assert_true(chw && patches);
    assert_int_equal(mmrt_preprocess_to_chw(padded, &norm, chw, n, &e), MMRT_OK);
    assert_int_equal(mmrt_preprocess_patchify(chw, 3, 40, 60, 10, 10, MMRT_PATCH_HWC, patches, n,
                                              &e), MMRT_OK);
    assert_memory_equal(patches, cap.pixels, n * sizeof *patches);
    free(chw);
    free(patches);
    mmrt_image_destroy(padded);
    mmrt_image_destroy(small);
    mmrt_image_destroy(img);
    golden_capture_free(&cap);
    mmrt_destroy(rt);

    /* downscale that cannot fit: the smallest image is one patch and its |NEWLINE|. */
    rt = golden_open_budget(fixture, 1, MMRT_OVERSIZE_DOWNSCALE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 80×60) needs 54 image tokens, more than "
             "max_image_tokens = 1 ([model] max_image_tokens); oversize_images = downscale "
             "cannot help: no smaller size of this aspect ratio has at most 1 image tokens", a);
    golden_expect_refused(rt, &req, want, &res);
    mmrt_destroy(rt);

    /* The context's own bound (40 positions hold 37 image tokens) still refuses with its
     * message when the configured budget is larger; a smaller one downscales within it. */
    golden_set_config("text_config/max_position_embeddings", json_integer(40));
    rt = golden_open_budget(golden_scratch, 100, MMRT_OVERSIZE_DOWNSCALE);
    req.images = TEST_FILE(d);
    req.n_images = 1;
    struct mmrt_result r2 = { 0 };
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &r2), MMRT_ERR_LIMIT);
    if (!strstr(mmrt_last_error(rt), "image 64×64 needs 42 image tokens (6×6 patches of 10 px "
                                     "plus row ends), more than the model's context of 40 "
                                     "positions allows"))
        fail_msg("unexpected: %s", mmrt_last_error(rt));
    mmrt_destroy(rt);
    /* 64×64 → 50×50: 5 × 6 = 30 */
    rt = golden_open_budget(golden_scratch, 30, MMRT_OVERSIZE_DOWNSCALE);
    golden_run(rt, &req, NULL, &r2);
    assert_int_equal(r2.n_tokens, 2);
    mmrt_destroy(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_alt_configuration),
        cmocka_unit_test_teardown(test_cpu_graph, golden_cpu_graph_off),
        cmocka_unit_test(test_vision_on_opencl),
        cmocka_unit_test_setup_teardown(test_bad_configs, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_flat_config, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_requests, make_scratch, golden_scratch_drop),
        cmocka_unit_test(test_sampling_is_seeded),
        cmocka_unit_test_setup_teardown(test_image_budget, make_scratch, golden_scratch_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
