/*
 * tests/test_llava.c — LLaVA-1.5 on the CPU reference plugin against Hugging Face
 * transformers (float32, eager attention), on the tiny checkpoints tools/make_fixtures.py
 * wrote into tests/fixtures/llava-*: pixel values, image features and the logits of every
 * greedy step within 1e-4 of the largest reference magnitude, greedy tokens identical.
 * Also the bad-checkpoint and bad-request cases of the LLaVA issue.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden.h"

static const struct golden_model llava = { .pixel_tensor = "pixel_values" };

/* Runs every case of one fixture directory and holds it to the reference. */
static void check_fixture(const char *name)
{
    struct golden_summary s;
    golden_check_fixture(&llava, name, NULL, &s);
    print_message("%s: %zu cases, worst relative error: pixels %.2g, image features %.2g, "
                  "logits %.2g; greedy tokens identical\n",
                  name, s.n_cases, s.pixels, s.features, s.logits);
}

static void test_tiny(void **state)
{
    (void)state;
    check_fixture("llava-tiny");
}

/* The decode step captured once and replayed on the CPU plugin (graph = 1): token id, cache
 * slot, positions and KV length must reach the kernels through device memory. */
static void test_cpu_graph(void **state)
{
    (void)state;
    golden_cpu_graph = true;
    check_fixture("llava-tiny");
    check_fixture("llava-tiny-bf16");
    golden_cpu_graph = false;
}

static void test_tiny_sharded(void **state)
{
    (void)state;
    check_fixture("llava-tiny-sharded");
}

static void test_tiny_bf16(void **state)
{
    (void)state;
    check_fixture("llava-tiny-bf16");
}

static void test_alt_configuration(void **state)
{
    (void)state;
    check_fixture("llava-tiny-alt");
}

/* ---- Mistral's sliding window: llava-tiny-swa (text_config mistral, sliding_window 12,
 * prompts of 33 … 45 positions and 16 tokens generated) ---- */

static void test_sliding_window(void **state)
{
    (void)state;
    check_fixture("llava-tiny-swa");
}

/* The captured decode step carries the window too (it is the same decoder issue()). */
static void test_sliding_window_graph(void **state)
{
    (void)state;
    golden_cpu_graph = true;
    check_fixture("llava-tiny-swa");
    golden_cpu_graph = false;
}

/* Both stages on OpenCL: the window lives in the language stage's attention. The suite's own
 * MMRT_TEST_PLUGIN (tools/gpu-check.sh sets cuda) comes back in the teardown. */
static char saved_plugin[64];
static bool had_plugin;

static int restore_test_plugin(void **state)
{
    (void)state;
    if (had_plugin)
        setenv("MMRT_TEST_PLUGIN", saved_plugin, 1);
    else
        unsetenv("MMRT_TEST_PLUGIN");
    return 0;
}

static void test_sliding_window_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    const char *was = getenv("MMRT_TEST_PLUGIN");
    had_plugin = was != NULL;
    snprintf(saved_plugin, sizeof saved_plugin, "%s", was ? was : "");
    setenv("MMRT_TEST_PLUGIN", "opencl", 1);
    check_fixture("llava-tiny-swa");
}

static int make_swa_scratch(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny-swa");
    return 0;
}

/* golden_scratch (llava-tiny-swa with its config edited) runs every case the way transformers
 * runs the same files with full attention: each case's greedy tokens are its
 * "full_attention" tokens (up to the first EOS, where mmrt stops), and they are other tokens
 * than the windowed reference's in every case; the first step's logits are far from the
 * windowed ones. So the window the fixture holds is really what makes its answers. */
static void expect_full_attention(const char *what)
{
    struct golden_cases c;
    golden_cases_load("llava-tiny-swa", &c);
    char path[4096];
    golden_fixture_path(path, sizeof path, "llava-tiny-swa/expected.safetensors");
    struct mmrt_safetensors *ref = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_safetensors_open(path, NULL, &ref, &e), MMRT_OK);
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    const json_t *cases = json_object_get(c.json, "cases");
    int other = 0;
    for (int i = 0; i < c.n; i++) {
        const json_t *jc = json_array_get(cases, (size_t)i);
        const json_t *full = json_object_get(json_object_get(jc, "full_attention"),
                                             "greedy_tokens");
        assert_true(json_array_size(full) == GOLDEN_MAX_STEPS);
        int32_t want[GOLDEN_MAX_STEPS];
        int n_want = 0;
        for (size_t k = 0; k < GOLDEN_MAX_STEPS; k++) {
            want[n_want++] = (int32_t)json_integer_value(json_array_get(full, k));
            if (want[n_want - 1] == 2) /* </s>: mmrt stops there */
                break;
        }
        struct golden_capture cap = { 0 };
        struct mmrt_result res = { 0 };
        golden_run(rt, &c.req[i], &cap, &res);
        if (cap.n_tokens != n_want ||
            memcmp(cap.tokens, want, (size_t)n_want * sizeof want[0]) != 0)
            fail_msg("%s: case %d: %d tokens, not the %d of full attention (first %d, want %d)",
                     what, i, cap.n_tokens, n_want, cap.n_tokens ? cap.tokens[0] : -1, want[0]);
        const json_t *windowed = json_object_get(jc, "greedy_tokens");
        for (int k = 0; k < n_want; k++)
            if (json_integer_value(json_array_get(windowed, (size_t)k)) != want[k]) {
                other++;
                break;
            }
        char name[64];
        snprintf(name, sizeof name, "case%d.logits_steps", i);
        float *steps = golden_expected_tensor(ref, name, GOLDEN_MAX_STEPS * cap.vocab);
        double d = golden_rel_err(cap.logits[0], steps, cap.vocab);
        if (!(d > 100 * GOLDEN_REL_TOL))
            fail_msg("%s: case %d: prefill logits only %.3g from the windowed reference", what, i,
                     d);
        free(steps);
        golden_capture_free(&cap);
    }
    assert_int_equal(other, c.n);
    print_message("%s: %d cases as transformers with full attention, all other tokens than "
                  "with the window\n", what, c.n);
    mmrt_destroy(rt);
    mmrt_safetensors_close(ref);
    json_decref(c.json);
}

/* sliding_window as transformers reads it (MistralConfig): null is no window, a missing key
 * the class default 4096 (beyond every position here: full attention), a llama text config
 * has none whatever it says (LlamaConfig has no such field; checked with transformers 5.25),
 * and anything but an integer ≥ 1 is refused naming the key. */
static void test_sliding_window_config(void **state)
{
    (void)state;
    golden_set_config("text_config/sliding_window", json_null());
    expect_full_attention("sliding_window null");
    golden_set_config("text_config/sliding_window", NULL);
    expect_full_attention("sliding_window absent (MistralConfig's 4096)");
    static const char *const bad[] = { "0", "-3", "2147483648", "\"12\"", "2.5", "true", "[12]" };
    static const char *const got[] = { "got 0", "got -3", "got 2147483648", "got not an integer",
                                       "got not an integer", "got not an integer",
                                       "got not an integer" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_error_t je;
        json_t *v = json_loads(bad[i], JSON_DECODE_ANY, &je);
        assert_non_null(v);
        golden_set_config("text_config/sliding_window", v);
        char want[256];
        snprintf(want, sizeof want, "text_config: \"sliding_window\" must be an integer from 1 "
                 "to 2147483647 (positions each query sees), or null for none; %s", got[i]);
        golden_expect_load_error(MMRT_ERR_FORMAT, want);
    }
    golden_set_config("text_config/sliding_window", json_integer(12));
    golden_set_config("text_config/model_type", json_string("llama"));
    expect_full_attention("model_type llama with sliding_window 12");
    golden_set_config("text_config/model_type", json_string("mistral"));
    golden_expect_loads();
}

/* Image-token KV compression moves kept rows over dropped ones, so cache rows stop being
 * positions, and the window counts positions: the combination is refused when the runtime is
 * made, with the INI line of image_kv_keep (exit 2), or "config:" for a config struct. */
static void test_sliding_window_refuses_image_kv(void **state)
{
    (void)state;
    char ini[512], err[2048], want[1024];
    snprintf(ini, sizeof ini, "%s/swa.ini", golden_scratch);
    static const char *const texts[] = {
        "[model]\npath = .\nimage_kv_keep = 0.5\n[device.c]\nplugin = cpu\npool_mb = 64\n",
        "[model]\npath = .\nimage_kv_keep = 1\n[device.c]\nplugin = cpu\npool_mb = 64\n",
    };
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(ini, "w");
        assert_non_null(f);
        fputs(texts[k], f);
        assert_int_equal(fclose(f), 0);
        struct mmrt_runtime *rt = NULL;
        mmrt_status st = mmrt_create_from_file(ini, &rt, err, sizeof err);
        if (k == 1) { /* 1 = off: nothing to refuse */
            if (st != MMRT_OK)
                fail_msg("%s", err);
            mmrt_destroy(rt);
            continue;
        }
        assert_int_equal(st, MMRT_ERR_CONFIG);
        assert_null(rt);
        snprintf(want, sizeof want, "%s:3: [model] image_kv_keep 0.5: the language model attends "
                 "through a sliding window of 12 positions (config.json sliding_window), which "
                 "image-token KV compression would shift onto other tokens; set image_kv_keep = "
                 "1 (off) for this model", ini);
        assert_string_equal(err, want);
    }
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = golden_scratch,
                               .devices = &dev, .n_devices = 1, .image_kv_keep = 0.25 };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_null(rt);
    assert_non_null(strstr(err, "config: [model] image_kv_keep 0.25: the language model attends "
                                "through a sliding window of 12 positions"));
}

/* ---- bad checkpoints: a copy of llava-tiny with one file changed ---- */

static int make_scratch(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny");
    return 0;
}

static void test_bad_configs(void **state)
{
    (void)state;
    golden_set_config("text_config/num_hidden_layers", json_integer(0));
    golden_expect_load_error(MMRT_ERR_FORMAT, "\"num_hidden_layers\" = 0 is outside");
    golden_set_config("text_config/num_hidden_layers", json_integer(100000));
    golden_expect_load_error(MMRT_ERR_FORMAT, "\"num_hidden_layers\" = 100000 is outside");
    golden_set_config("text_config/num_hidden_layers", json_integer(2));
    golden_set_config("text_config/num_attention_heads", json_integer(5));
    golden_expect_load_error(MMRT_ERR_FORMAT, "not divisible by num_attention_heads 5");
    golden_set_config("text_config/num_attention_heads", json_integer(4));
    golden_set_config("text_config/vocab_size", json_integer(300));
    golden_expect_load_error(MMRT_ERR_FORMAT, "pad 385) is not below vocab_size 300");
    golden_set_config("text_config/pad_token_id", json_null());
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "image_token_index 384 is not below the vocab_size 300");
    golden_set_config("text_config/pad_token_id", json_integer(385));
    golden_set_config("text_config/vocab_size", json_integer(392));
    golden_set_config("text_config/rope_parameters",
                      json_pack("{s:s, s:f}", "rope_type", "yarn", "rope_theta", 5e3));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "rope type 'yarn' is not supported");
    golden_set_config("text_config/rope_parameters",
                      json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", -1.0));
    golden_expect_load_error(MMRT_ERR_FORMAT, "rope_theta");
    golden_set_config("text_config/rope_parameters",
                      json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", 5e3));
    /* A config that disagrees with the weights: the shape check names the tensor. */
    golden_set_config("text_config/intermediate_size", json_integer(48));
    golden_expect_load_error(MMRT_ERR_FORMAT, "layers.0.mlp.gate_proj.weight' has shape "
                                              "[64, 32], config.json implies [48, 32]");
    golden_set_config("text_config/intermediate_size", json_integer(64));
    /* Refused before any tensor is loaded. */
    golden_set_config("text_config/mlp_bias", json_true());
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "decoder: mlp_bias is not supported");
    golden_set_config("text_config/mlp_bias", json_false());
    golden_set_config("model_type", json_string("llava_unknown"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "model_type 'llava_unknown' is not supported");
    golden_set_config("model_type", json_string("llava"));
    /* The tower takes one image size: a shortest-edge resize needs the crop after it, an
     * exact resize to the tower's size (the whole picture, as the demo model is trained) does
     * not. */
    golden_set_json("processor_config.json", "image_processor/do_center_crop", json_false());
    golden_expect_load_error(MMRT_ERR_FORMAT, "preprocessing must produce 28×28 images");
    golden_set_json("processor_config.json", "image_processor/size",
                    json_pack("{s:i, s:i}", "height", 28, "width", 28));
    golden_expect_loads();
    golden_set_json("processor_config.json", "image_processor/size",
                    json_pack("{s:i, s:i}", "height", 28, "width", 24));
    golden_expect_load_error(MMRT_ERR_FORMAT, "it produces 24×28");
    golden_set_json("processor_config.json", "image_processor/size",
                    json_pack("{s:i}", "shortest_edge", 28));
    golden_set_json("processor_config.json", "image_processor/do_center_crop", json_true());
    /* Everything restored: it loads again. */
    golden_expect_loads();
}

static void test_bad_checkpoint_files(void **state)
{
    (void)state;
    char path[512], cmd[2048];
    /* A truncated weights file. */
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak' && truncate -s 100000 '%s'", path, path, path);
    assert_int_equal(system(cmd), 0);
    golden_expect_load_error(MMRT_ERR_FORMAT, "model.safetensors");
    snprintf(cmd, sizeof cmd, "mv '%s.bak' '%s'", path, path);
    assert_int_equal(system(cmd), 0);
    /* No tokenizer. */
    snprintf(cmd, sizeof cmd, "mv '%s/tokenizer.json' '%s/tok.bak'", golden_scratch,
             golden_scratch);
    assert_int_equal(system(cmd), 0);
    golden_expect_load_error(MMRT_ERR_IO, "tokenizer.json");
    snprintf(cmd, sizeof cmd, "mv '%s/tok.bak' '%s/tokenizer.json'", golden_scratch,
             golden_scratch);
    assert_int_equal(system(cmd), 0);
}

static void test_bad_requests(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    char image[4096];
    golden_fixture_path(image, sizeof image, "llava-images/grad_64x64.png");
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = "hi", .max_tokens = 4,
                                .top_p = 1.0f };
    /* One image, two placeholders. */
    req.prompt = "compare <image> please";
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "2 image placeholders but 1 image was given");
    /* Longer than the context (512 positions). */
    char *longp = malloc(20000);
    assert_non_null(longp);
    memset(longp, 'a', 19999);
    for (int i = 1; i < 19999; i += 2)
        longp[i] = ' ';
    longp[19999] = '\0';
    req.prompt = longp;
    golden_expect_run_error(rt, &req, MMRT_ERR_LIMIT,
                            "exceeds the model's context of 512 positions");
    free(longp);
    /* Images that cannot be used. */
    req.prompt = "hi";
    golden_expect_unusable_images(rt, &req);
    req.images = TEST_FILE(image);
    req.n_images = 1;
    req.max_tokens = -1; /* 0 means up to the context */
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "max_tokens");
    req.max_tokens = 3;
    req.top_p = 2.0f;
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "top_p");
    /* And a good request still works afterwards: nothing leaked into the pool. */
    req.top_p = 1.0f;
    golden_expect_pool_steady(rt, &req, 3);
    mmrt_destroy(rt);
}

static void test_sampling_is_seeded(void **state)
{
    (void)state;
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, "llava-tiny");
    struct mmrt_runtime *rt = golden_open_or_fail(dir, NULL);
    struct mmrt_request req = { .prompt = "What is this?", .max_tokens = 12, .seed = 7,
                                .temperature = 1.5f, .top_k = 50, .top_p = 0.95f };
    golden_expect_seeded(rt, &req);
    mmrt_destroy(rt);
}

/* ---- the image-token budget ([model] max_image_tokens, oversize_images) ---- */

/* Tiny LLaVA: 28-px images of 7-px patches, 16 tokens for every image. Over the budget it is
 * refused whatever oversize_images says, since no size gives fewer tokens. */
static void test_image_budget(void **state)
{
    (void)state;
    char fixture[4096], image[4096], want[8192];
    golden_fixture_path(fixture, sizeof fixture, "llava-tiny");
    golden_fixture_path(image, sizeof image, "llava-images/grad_64x64.png");
    const struct mmrt_image_input img = { .path = image };
    struct mmrt_request req = { .images = &img, .n_images = 1, .prompt = "hi", .max_tokens = 2,
                                .top_p = 1.0f };
    struct mmrt_result res = { 0 };
    snprintf(want, sizeof want, "image 1 of 1 (%s, 64×64) needs 16 image tokens, more than "
             "max_image_tokens = 15 ([model] max_image_tokens); LLaVA-1.5 gives every image 16 "
             "tokens whatever its size, so oversize_images = downscale cannot help", image);
    for (int mode = 0; mode < 2; mode++) {
        struct mmrt_runtime *rt = golden_open_budget(fixture, 15,
                                                     (enum mmrt_oversize_images)mode);
        golden_expect_refused(rt, &req, want, &res); /* refused before preprocessing */
        /* A request without an image needs no image tokens. */
        req.images = NULL;
        req.n_images = 0;
        golden_run(rt, &req, NULL, &res);
        req.images = &img;
        req.n_images = 1;
        mmrt_destroy(rt);
    }
    /* at the budget */
    struct mmrt_runtime *rt = golden_open_budget(fixture, 16, MMRT_OVERSIZE_REFUSE);
    golden_run(rt, &req, NULL, &res);
    assert_int_equal(res.n_tokens, 2);
    mmrt_destroy(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_tiny_sharded),
        cmocka_unit_test_teardown(test_cpu_graph, golden_cpu_graph_off),
        cmocka_unit_test(test_tiny_bf16),
        cmocka_unit_test(test_alt_configuration),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test_teardown(test_sliding_window_graph, golden_cpu_graph_off),
        cmocka_unit_test_teardown(test_sliding_window_opencl, restore_test_plugin),
        cmocka_unit_test_setup_teardown(test_sliding_window_config, make_swa_scratch,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_sliding_window_refuses_image_kv, make_swa_scratch,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_configs, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_checkpoint_files, make_scratch,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_requests, make_scratch, golden_scratch_drop),
        cmocka_unit_test(test_sampling_is_seeded),
        cmocka_unit_test(test_image_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
