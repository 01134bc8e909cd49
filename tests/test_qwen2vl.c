/*
 * tests/test_qwen2vl.c — Qwen2-VL against Hugging Face transformers (float32, eager
 * attention) on the tiny checkpoints tools/make_fixtures.py wrote into
 * tests/fixtures/qwen2vl-tiny{,-alt}: for every case (single images over every smart_resize
 * branch, and prompts with two images of different sizes) the prompt ids after the template
 * and the image-pad expansion, the pixel values of every image, the merger's image features
 * and the logits of every greedy step within the fixtures' 1e-4 of the largest reference
 * magnitude, and the 16 greedy tokens identical. On the CPU plugin, and with the vision
 * stage on OpenCL when a device exists and its plugin has the operators. Also: a batch with
 * the stages on two devices (overlapped), --check on two images, the hub's flat config and
 * the newer weight names, and bad configs, weights and requests.
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

/* Template, tokenizer and the expansion of each <|image_pad|> by its grid; one trace call
 * per image. */
static void check_case(const struct golden_case *gc)
{
    golden_check_prompt_ids(gc);
    assert_int_equal(gc->res->n_prompt_tokens, gc->cap->n_prompt);
    const int n_images = gc->req->n_images ? gc->req->n_images : 1;
    assert_int_equal(gc->cap->n_pixel_calls, n_images);
    assert_int_equal(gc->cap->n_feature_calls, n_images);
}

static const struct golden_model qwen2vl = { .pixel_tensor = "pixel_values",
                                             .check_case = check_case,
                                             .skip_lacking_operators = true };

/* Runs every case of one fixture directory and holds it to the reference. Returns false
 * when the placement is refused for lack of operators (skipped by the caller). */
static bool check_fixture(const char *name, const char *vision_plugin)
{
    struct golden_summary s;
    if (!golden_check_fixture(&qwen2vl, name, vision_plugin, &s))
        return false;
    print_message("%s (vision on %s): %zu cases, worst relative error: pixels %.2g, image "
                  "features %.2g, logits %.2g; greedy tokens identical\n",
                  name, s.vision_on, s.n_cases, s.pixels, s.features, s.logits);
    return true;
}

static void test_tiny(void **state)
{
    (void)state;
    check_fixture("qwen2vl-tiny", NULL);
}

static void test_alt_configuration(void **state)
{
    (void)state;
    check_fixture("qwen2vl-tiny-alt", NULL);
}

/* The decode step captured once and replayed (the CPU plugin's graph = 1, which records and
 * replays exactly as the CUDA plugin's graphs do): the M-RoPE positions (slot + rope_delta),
 * the cache slot and the KV length must all come from device memory, or the replayed steps
 * would reuse the first step's and miss the reference. */
static void test_cpu_graph(void **state)
{
    (void)state;
    golden_cpu_graph = true;
    check_fixture("qwen2vl-tiny", NULL);
    check_fixture("qwen2vl-tiny-alt", NULL);
    golden_cpu_graph = false;
}

/* The vision stage (preprocessing, tower, merger) on OpenCL, the decoder on the CPU. */
static void test_vision_on_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    if (!check_fixture("qwen2vl-tiny", "opencl"))
        skip();
    check_fixture("qwen2vl-tiny-alt", "opencl");
}

/* ---- the runtime around a model whose images differ in token count ---- */

struct batch_capture {
    int32_t tokens[4][64];
    int n[4];
};

static bool on_batch_token(void *user, int request, int32_t id, const char *text)
{
    struct batch_capture *b = user;
    (void)text;
    if (id >= 0 && b->n[request] < 64)
        b->tokens[request][b->n[request]++] = id;
    return true;
}

/* Three requests of 2, 1 and 2 images on two CPU devices, so the vision stage of request
 * n+1 overlaps the decode of request n: each must still give transformers' tokens. */
static void test_batch_overlap(void **state)
{
    (void)state;
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, "qwen2vl-tiny-alt");
    struct mmrt_runtime *rt = golden_open_or_fail(dir, "cpu");
    json_t *exp = golden_expected_json("qwen2vl-tiny-alt");
    const json_t *cases = json_object_get(exp, "cases");
    static const int pick[3] = { 6, 2, 5 };
    struct golden_images images[3];
    struct mmrt_request reqs[3];
    for (int i = 0; i < 3; i++)
        reqs[i] = golden_case_request(json_array_get(cases, (size_t)pick[i]), &images[i]);
    struct batch_capture b = { 0 };
    struct mmrt_result res[3] = { { 0 } };
    if (mmrt_run_batch(rt, reqs, 3, on_batch_token, &b, res) != MMRT_OK)
        fail_msg("batch: %s", mmrt_last_error(rt));
    for (int i = 0; i < 3; i++) {
        const json_t *c = json_array_get(cases, (size_t)pick[i]);
        golden_check_tokens("batch", json_string_value(json_object_get(c, "name")), c,
                            b.tokens[i], b.n[i]);
        assert_int_equal(res[i].n_prompt_tokens,
                         (int)json_array_size(json_object_get(c, "input_ids")));
    }
    json_decref(exp);
    mmrt_destroy(rt);
}

/* --check compares the image features of every image (different counts) and the logits. */
static void test_check_two_images(void **state)
{
    (void)state;
    char dir[4096], a[4200], b[4200];
    golden_fixture_path(dir, sizeof dir, "qwen2vl-tiny");
    golden_fixture_path(a, sizeof a, "llava-images/grad_80x60.png");
    golden_fixture_path(b, sizeof b, "qwen2vl-images/grad_98x70.png");
    struct mmrt_runtime *rt = golden_open_or_fail(dir, "cpu");
    assert_int_equal(mmrt_model_max_images(rt), 32);
    const struct mmrt_image_input paths[2] = { { .path = a }, { .path = b } };
    struct mmrt_request req = { .images = paths, .n_images = 2, .prompt = "Compare.",
                                .max_tokens = 4, .top_p = 1.0f };
    struct mmrt_check_report r;
    if (mmrt_check(rt, &req, &r) != MMRT_OK)
        fail_msg("check: %s", mmrt_last_error(rt));
    assert_true(r.pass);
    assert_int_equal(r.first_divergence, -1);
    assert_true(r.features_max_rel <= r.tolerance);
    mmrt_destroy(rt);
}

/* The command line of the issue: `mmrt --conf conf/qwen2vl-tiny.ini --image a --image b
 * --prompt …` asks about both images in one request (fixture case 5), and two prompts make a
 * batch of two requests. */
static void test_cli_two_images(void **state)
{
    (void)state;
    const char *src = golden_src_dir(), *build = getenv("MMRT_BUILD_DIR");
    if (!build)
        skip();
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s/bin/mmrt' --conf '%s/conf/qwen2vl-tiny.ini' --image "
             "'%s/tests/fixtures/llava-images/grad_80x60.png' --image "
             "'%s/tests/fixtures/llava-images/grad_36x100.png' --prompt "
             "'Compare the two pictures.' --json 2>&1",
             build, src, src, src);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char out[1 << 16];
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    assert_int_equal(pclose(p), 0);
    json_error_t je;
    json_t *rec = json_loads(out, 0, &je);
    if (!rec)
        fail_msg("not JSON: %s", out);
    static const int case5[16] = { 31, 325, 37, 35, 39, 29, 37, 38, 154, 178, 216, 216, 216,
                                   308, 178, 42 };
    const json_t *ids = json_object_get(rec, "token_ids");
    assert_int_equal(json_array_size(ids), 16);
    for (size_t i = 0; i < 16; i++)
        assert_int_equal(json_integer_value(json_array_get(ids, i)), case5[i]);
    assert_int_equal(json_integer_value(json_object_get(rec, "n_prompt_tokens")), 61);
    json_decref(rec);
    /* --image / --prompt pairs: a batch, one image each. */
    snprintf(cmd, sizeof cmd,
             "'%s/bin/mmrt' --conf '%s/conf/qwen2vl-tiny.ini' --image "
             "'%s/tests/fixtures/llava-images/grad_80x60.png' --image "
             "'%s/tests/fixtures/qwen2vl-images/grad_98x70.png' --prompt "
             "'What is shown in this image?' --prompt 'What is shown in this image?' --json 2>&1",
             build, src, src, src);
    p = popen(cmd, "r");
    assert_non_null(p);
    len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    assert_int_equal(pclose(p), 0);
    rec = json_loads(out, 0, &je);
    if (!rec)
        fail_msg("not JSON: %s", out);
    const json_t *reqs = json_object_get(rec, "requests");
    assert_int_equal(json_array_size(reqs), 2);
    /* cases 0 and 4: 53 and 55 prompt tokens (6 and 8 image tokens) */
    assert_int_equal(json_integer_value(json_object_get(json_array_get(reqs, 0),
                                                        "n_prompt_tokens")), 53);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(reqs, 1),
                                                        "n_prompt_tokens")), 55);
    json_decref(rec);
}

/* ---- bad checkpoints and requests: a copy of qwen2vl-tiny with one file changed ---- */

static int make_scratch(void **state)
{
    (void)state;
    golden_scratch_make("qwen2vl-tiny");
    return 0;
}

/* Puts the fixture's own copy of `file` back. */
static void restore(const char *file)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp '%s/tests/fixtures/qwen2vl-tiny/%s' '%s/%s'", golden_src_dir(),
             file, golden_scratch, file);
    assert_int_equal(system(cmd), 0);
}

static void test_bad_configs(void **state)
{
    (void)state;
    /* Found by fuzz_config_json: an eps of 0 and a default head dim above the limit. */
    golden_set_config("text_config/rms_norm_eps", json_real(0));
    golden_expect_load_error(MMRT_ERR_FORMAT, "\"rms_norm_eps\" = 0 must be positive");
    restore("config.json");
    golden_set_config("text_config/head_dim", NULL);
    golden_set_config("text_config/hidden_size", json_integer(1024));
    golden_set_config("text_config/num_attention_heads", json_integer(2));
    golden_set_config("text_config/num_key_value_heads", json_integer(2));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "head dim 512 (hidden_size 1024 / "
                             "num_attention_heads 2) is above the attention limit of 256");
    restore("config.json");
    golden_set_config("text_config/rope_parameters/mrope_section", json_pack("[i,i]", 2, 2));
    golden_expect_load_error(MMRT_ERR_FORMAT, "\"mrope_section\" must be a list of 3 integers");
    golden_set_config("text_config/rope_parameters/mrope_section",
                      json_pack("[i,i,i]", 2, 2, 1));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "mrope_section [2, 2, 1] sums to 5, head_dim / 2 is 4");
    golden_set_config("text_config/rope_parameters/mrope_section", NULL);
    golden_expect_load_error(MMRT_ERR_FORMAT, "needs \"mrope_section\"");
    golden_set_config("text_config/rope_parameters/mrope_section",
                      json_pack("[i,i,i]", 2, 1, 1));
    golden_set_config("text_config/rope_parameters/rope_type", json_string("yarn"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "rope type 'yarn' is not supported");
    golden_set_config("text_config/rope_parameters/rope_type", json_string("mrope"));
    golden_expect_loads();
    golden_set_config("text_config/rope_parameters/rope_type", json_string("default"));
    golden_set_config("text_config/model_type", json_string("llama"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "text model_type 'llama' is not supported");
    golden_set_config("text_config/model_type", NULL); /* absent: still Qwen2 */
    golden_expect_loads();
    golden_set_config("text_config/model_type", json_string("qwen2_vl_text"));
    golden_set_config("text_config/num_attention_heads", json_integer(3));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "hidden_size 32 is not divisible by num_attention_heads 3");
    golden_set_config("text_config/num_attention_heads", json_string("4"));
    golden_expect_load_error(MMRT_ERR_FORMAT, "num_attention_heads");
    golden_set_config("text_config/num_attention_heads", json_integer(4));
    golden_set_config("text_config/use_sliding_window", json_true());
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "use_sliding_window is not supported");
    golden_set_config("text_config/use_sliding_window", json_false());
    golden_set_config("vision_config/num_heads", json_integer(3));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "embed_dim 32 / num_heads 3 must be a whole head size");
    golden_set_config("vision_config/num_heads", json_integer(16)); /* head size 2 */
    golden_expect_load_error(MMRT_ERR_FORMAT, "multiple of 4 (2-D rotary)");
    golden_set_config("vision_config/num_heads", json_integer(2));
    golden_expect_loads();
}

/* Same checkpoint, config changes that are valid JSON but wrong for it or for mmrt. */
static void test_bad_configs_more(void **state)
{
    (void)state;
    golden_set_config("vision_config/hidden_size", NULL); /* default 3584 */
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "vision_config.hidden_size 3584 (the merger's output) "
                                              "differs from the decoder's hidden_size 32");
    golden_set_config("vision_config/hidden_size", json_integer(32));
    golden_set_config("vision_config/hidden_act", json_string("swish"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "vision hidden_act 'swish' is not supported");
    golden_set_config("vision_config/hidden_act", json_string("quick_gelu"));
    golden_set_config("vision_config", json_string("none"));
    golden_expect_load_error(MMRT_ERR_FORMAT, "vision_config must be an object");
    restore("config.json");
    golden_set_config("image_token_id", json_integer(336));
    golden_expect_load_error(MMRT_ERR_FORMAT, "image_token_id");
    golden_set_config("image_token_id", json_integer(331)); /* <|vision_pad|>: special */
    golden_expect_loads();
    golden_set_config("image_token_id", json_integer(65)); /* an ordinary token */
    golden_expect_load_error(MMRT_ERR_FORMAT, "image_token_id 65 is not a special token");
    golden_set_config("image_token_id", json_integer(332));
    golden_set_config("text_config", json_integer(1));
    golden_expect_load_error(MMRT_ERR_FORMAT, "text_config must be an object");
    restore("config.json");
    /* The processor config. */
    golden_set_json("processor_config.json", "image_processor/size/longest_edge", NULL);
    golden_expect_load_error(MMRT_ERR_FORMAT, "\"size\" must be an object with shortest_edge and "
                                              "longest_edge");
    golden_set_json("processor_config.json", "image_processor/size/longest_edge", json_integer(0));
    golden_expect_load_error(MMRT_ERR_FORMAT, "longest_edge");
    golden_set_json("processor_config.json", "image_processor/size/longest_edge",
                    json_integer(9408));
    golden_set_json("processor_config.json", "image_processor/patch_size", json_integer(16));
    golden_expect_load_error(MMRT_ERR_FORMAT, "patch_size 16, merge_size 2, temporal_patch_size 2 "
                                              "differ from config.json's vision_config (14, 2, 2)");
    golden_set_json("processor_config.json", "image_processor/patch_size", json_integer(14));
    golden_set_json("processor_config.json", "image_processor/resample", json_integer(0));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "nearest");
    golden_set_json("processor_config.json", "image_processor/resample", json_integer(3));
    golden_set_json("processor_config.json", "image_processor", NULL);
    golden_expect_load_error(MMRT_ERR_FORMAT, "no \"image_processor\" object");
}

/* Rewrites the safetensors header of the scratch checkpoint with the one edit() makes of it
 * (a new reference); the tensor data stays as it is. */
static void rewrite_header(json_t *(*edit)(json_t *hdr, const void *arg), const void *arg)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | buf[i];
    json_error_t je;
    json_t *hdr = json_loadb((const char *)buf + 8, (size_t)n, 0, &je);
    assert_non_null(hdr);
    json_t *edited = edit(hdr, arg);
    char *text = json_dumps(edited, JSON_COMPACT);
    assert_non_null(text);
    uint64_t m = strlen(text);
    f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(m >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(text, 1, m, f), m);
    assert_int_equal(fwrite(buf + 8 + n, 1, (size_t)size - 8 - n, f), (size_t)size - 8 - n);
    fclose(f);
    free(text);
    json_decref(edited);
    json_decref(hdr);
    free(buf);
}

struct retag {
    const char *name;
    json_t *shape;
};

static json_t *retag_edit(json_t *hdr, const void *arg)
{
    const struct retag *r = arg;
    json_t *t = json_object_get(hdr, r->name);
    assert_non_null(t);
    json_object_set_new(t, "shape", r->shape);
    return json_incref(hdr);
}

/* Declares tensor `name` of the scratch checkpoint as `shape` (same element count, so the
 * file stays well-formed and only the shape is wrong). */
static void retag_tensor(const char *name, json_t *shape)
{
    const struct retag r = { name, shape };
    rewrite_header(retag_edit, &r);
}

static void test_bad_weights(void **state)
{
    (void)state;
    /* The Conv3d kernel stored flat: same elements, not the checkpoint layout. */
    retag_tensor("visual.patch_embed.proj.weight", json_pack("[i,i]", 32, 1176));
    golden_expect_load_error(MMRT_ERR_FORMAT, "tensor 'visual.patch_embed.proj.weight' has shape "
                                              "[32, 1176], config.json implies [32, 3, 2, 14, 14]");
    retag_tensor("visual.patch_embed.proj.weight", json_pack("[i,i,i,i,i]", 32, 3, 2, 14, 14));
    golden_expect_loads();
    retag_tensor("model.layers.1.self_attn.k_proj.bias", json_pack("[i,i]", 4, 4));
    golden_expect_load_error(MMRT_ERR_FORMAT,
                             "tensor 'model.layers.1.self_attn.k_proj.bias' has shape "
                                              "[4, 4], config.json implies [16]");
    retag_tensor("model.layers.1.self_attn.k_proj.bias", json_pack("[i]", 16));
    retag_tensor("visual.merger.mlp.0.weight", json_pack("[i,i]", 64, 256));
    golden_expect_load_error(MMRT_ERR_FORMAT, "config.json implies [128, 128]");
}

/* model.X → model.language_model.X, visual.X → model.visual.X, the rest as it is. */
static json_t *v5_names(json_t *hdr, const void *arg)
{
    (void)arg;
    json_t *renamed = json_object();
    assert_non_null(renamed);
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        char name[512];
        if (strncmp(key, "model.", 6) == 0)
            snprintf(name, sizeof name, "model.language_model.%s", key + 6);
        else if (strncmp(key, "visual.", 7) == 0)
            snprintf(name, sizeof name, "model.%s", key);
        else
            snprintf(name, sizeof name, "%s", key);
        json_object_set(renamed, name, val);
    }
    return renamed;
}

/* Renames every tensor of the scratch checkpoint to the layout transformers ≥ 4.52 keeps in
 * memory (models.md §1.7). */
static void rename_to_v5_layout(void)
{
    rewrite_header(v5_names, NULL);
}

/* For golden_flatten_config: config.json as the hub's Qwen/Qwen2-VL-* files have it, with
 * rope_theta and rope_scaling {type "mrope", mrope_section}, vision_config with in_chans. */
static void hub_spellings(json_t *root, const json_t *text)
{
    json_object_del(root, "rope_parameters");
    json_t *rp = json_object_get(text, "rope_parameters");
    json_object_set(root, "rope_theta", json_object_get(rp, "rope_theta"));
    json_object_set_new(root, "rope_scaling",
                        json_pack("{s:s, s:O}", "type", "mrope", "mrope_section",
                                  json_object_get(rp, "mrope_section")));
    json_t *vision = json_object_get(root, "vision_config");
    json_object_set(vision, "in_chans", json_object_get(vision, "in_channels"));
    json_object_del(vision, "in_channels");
    json_object_del(vision, "model_type");
    json_object_del(vision, "rope_parameters");
}

/* Case 5 (two images) of qwen2vl-tiny on the scratch checkpoint: transformers' tokens. */
static void expect_case5_tokens(void)
{
    json_t *exp = golden_expected_json("qwen2vl-tiny");
    const json_t *c = json_array_get(json_object_get(exp, "cases"), 5);
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    struct golden_images images;
    struct mmrt_request req = golden_case_request(c, &images);
    struct golden_capture cap = { 0 };
    struct mmrt_result res = { 0 };
    golden_run(rt, &req, &cap, &res);
    golden_check_tokens("scratch", "case5", c, cap.tokens, cap.n_tokens);
    golden_capture_free(&cap);
    mmrt_destroy(rt);
    json_decref(exp);
}

/* The other spellings of the same checkpoint: hub-style flat config.json, and the weight
 * names newer transformers keep in memory. */
static void test_layouts(void **state)
{
    (void)state;
    golden_flatten_config(hub_spellings);
    expect_case5_tokens();
    rename_to_v5_layout();
    expect_case5_tokens();
    /* A flat config whose mrope_section is missing from rope_scaling. */
    golden_set_config("rope_scaling", json_pack("{s:s}", "type", "mrope"));
    golden_expect_load_error(MMRT_ERR_FORMAT, "needs \"mrope_section\"");
}

static void test_bad_requests(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = golden_open_or_fail(golden_scratch, NULL);
    char a[4096], b[4096], wide[4096];
    golden_fixture_path(a, sizeof a, "llava-images/grad_64x64.png");
    golden_fixture_path(b, sizeof b, "llava-images/grad_36x100.png");
    golden_fixture_path(wide, sizeof wide, "images/rgb_1x5000.png");
    const struct mmrt_image_input two[2] = { { .path = a }, { .path = b } };
    struct mmrt_request req = { .images = TEST_FILE(a), .n_images = 1,
                                .max_tokens = 4, .top_p = 1.0f,
                                .prompt = "<|image_pad|> and <|image_pad|>?" };
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "prompt has 2 image placeholders (<|image_pad|>) but 1 image was "
                            "given");
    req.images = two;
    req.n_images = 2;
    req.prompt = "<|vision_start|><|image_pad|><|vision_end|>What is it?";
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "prompt has 1 image placeholder (<|image_pad|>) but 2 images were "
                            "given");
    req.images = NULL;
    req.n_images = 0;
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "prompt has 1 image placeholder (<|image_pad|>) but 0 images were "
                            "given");
    req.prompt = "<|video_pad|>";
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "videos are not supported");
    /* Aspect ratio over 200 (1×5000): smart_resize refuses it, as transformers does. */
    req.prompt = "hi";
    req.images = TEST_FILE(wide);
    req.n_images = 1;
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "absolute aspect ratio must be smaller than 200, got 5000");
    req.images = TEST_FILE("/nonexistent.png");
    req.n_images = 1;
    golden_expect_run_error(rt, &req, MMRT_ERR_IO, "/nonexistent.png");
    /* The API's own rules about images: a path or bytes, exactly one; at most 32. */
    const struct mmrt_image_input both = { .path = a, .data = "x", .size = 1 };
    req.images = &both;
    req.n_images = 1;
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "images[0] needs a path or data (exactly one)");
    struct mmrt_image_input many[40];
    for (int i = 0; i < 40; i++)
        many[i] = (struct mmrt_image_input){ .path = a };
    req.images = many;
    req.n_images = 33;
    golden_expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG,
                            "33 images given; model type qwen2_vl takes at most 32");
    /* A good request still works afterwards, and nothing stays in the pool. */
    req.images = two;
    req.n_images = 2;
    req.prompt = "Compare <|image_pad|> with <|image_pad|>.";
    struct mmrt_result res = { 0 };
    struct mmrt_pool_report pr;
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    uint64_t weights = pr.bytes_in_use;
    golden_run(rt, &req, NULL, &res);
    assert_int_equal(res.n_tokens, 4);
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    assert_int_equal(pr.bytes_in_use, weights);
    mmrt_destroy(rt);

    /* The token budget: a context of 16 positions holds one 9-token image, not two. */
    golden_set_config("text_config/max_position_embeddings", json_integer(16));
    rt = golden_open_or_fail(golden_scratch, NULL);
    req.prompt = "";
    req.images = (struct mmrt_image_input[]){ { .path = a }, { .path = a } };
    golden_expect_run_error(rt, &req, MMRT_ERR_LIMIT,
                            "image 2 (64×64, resized to 84×84) brings the request to 18 image "
                            "tokens, more than the model's context of 16 positions allows");
    req.images = NULL;
    req.n_images = 0;
    req.images = TEST_FILE(a);
    req.n_images = 1; /* fits the budget, but not with the template around it */
    golden_expect_run_error(rt, &req, MMRT_ERR_LIMIT,
                            "exceeds the model's context of 16 positions");
    mmrt_destroy(rt);
    /* …also when the processor's min_pixels scales a small image up: 64×64 → 168×168. */
    golden_set_config("text_config/max_position_embeddings", json_integer(24));
    golden_set_json("processor_config.json", "image_processor/size/shortest_edge",
                    json_integer(28 * 28 * 30));
    golden_set_json("processor_config.json", "image_processor/size/longest_edge",
                    json_integer(28 * 28 * 40));
    rt = golden_open_or_fail(golden_scratch, NULL);
    golden_expect_run_error(rt, &req, MMRT_ERR_LIMIT,
                            "image 1 (64×64, resized to 168×168) brings the request to 36 image "
                            "tokens");
    mmrt_destroy(rt);
}

/* ---- the image-token budget ([model] max_image_tokens, oversize_images) ---- */

/* What the vision stage produced per image: patches and tokens, and image 1's pixels. */
struct budget_capture {
    int n_images;
    int64_t patches[GOLDEN_MAX_IMAGES], tokens[GOLDEN_MAX_IMAGES];
    float *pixels1;
    int64_t n_pixels1;
};

static void budget_pixels(void *user, int image, const float *data, int n_dims,
                          const int64_t *shape)
{
    struct budget_capture *c = user;
    assert_int_equal(n_dims, 2);
    assert_true(image < GOLDEN_MAX_IMAGES);
    c->patches[image] = shape[0];
    c->n_images = image + 1;
    if (image == 1) {
        c->n_pixels1 = shape[0] * shape[1];
        c->pixels1 = malloc((size_t)c->n_pixels1 * sizeof *c->pixels1);
        assert_non_null(c->pixels1);
        memcpy(c->pixels1, data, (size_t)c->n_pixels1 * sizeof *data);
    }
}

static void budget_features(void *user, int image, const float *data, int64_t n_tokens,
                            int64_t dim)
{
    struct budget_capture *c = user;
    (void)data;
    (void)dim;
    c->tokens[image] = n_tokens;
}

/* A refusal is exactly `want` and comes before any preprocessing (no pixels traced). */
static void expect_refused(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           const char *want)
{
    struct mmrt_result res = { 0 };
    golden_expect_refused(rt, req, want, &res);
    assert_string_equal(res.error, want);
}

/* Patches of a w × h image after smart_resize with the fixture's factor and min_pixels and
 * the given max_pixels. */
static int64_t smart_patches(uint32_t w, uint32_t h, uint64_t max_pixels)
{
    uint32_t rh, rw;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_preprocess_smart_resize(h, w, 28, 3920, max_pixels, &rh, &rw, NULL,
                                                  &e), MMRT_OK);
    return (int64_t)(rh / 14) * (rw / 14);
}

static void test_image_budget(void **state)
{
    (void)state;
    char fixture[4096], a[4096], b[4096], c[4096], d[4096], want[8192];
    golden_fixture_path(fixture, sizeof fixture, "qwen2vl-tiny");
    /* The fixture's processor: min_pixels 3920 (5 tokens), max_pixels 9408 (12 tokens).
     * 64×64 → 84×84 (9 tokens, and never fewer: min_pixels scales it back up), 98×70 →
     * 112×56 (8), 80×60 → 84×56 (6), 45×90 → 56×84 (6). */
    golden_fixture_path(a, sizeof a, "llava-images/grad_64x64.png");
    golden_fixture_path(b, sizeof b, "qwen2vl-images/grad_98x70.png");
    golden_fixture_path(c, sizeof c, "llava-images/grad_80x60.png");
    golden_fixture_path(d, sizeof d, "llava-images/grad_45x90.png");
    struct mmrt_request req = { .max_tokens = 2, .top_p = 1.0f, .prompt = "Compare." };
    struct mmrt_result res = { 0 };

    /* refuse: the image that brings the request over the budget is named. */
    struct mmrt_runtime *rt = golden_open_budget(fixture, 10, MMRT_OVERSIZE_REFUSE);
    req.images = (struct mmrt_image_input[]){ { .path = a }, { .path = a } };
    req.n_images = 2;
    snprintf(want, sizeof want, "image 2 of 2 (%s, 64×64, resized to 84×84) needs 9 image "
             "tokens, bringing the request to 18, more than max_image_tokens = 10 ([model] "
             "max_image_tokens); oversize_images = downscale would shrink the images to fit", a);
    expect_refused(rt, &req, want);
    req.images = (struct mmrt_image_input[]){ { .path = c }, { .path = d } };
    snprintf(want, sizeof want, "image 2 of 2 (%s, 45×90, resized to 56×84) needs 6 image "
             "tokens, bringing the request to 12, more than max_image_tokens = 10 ([model] "
             "max_image_tokens); oversize_images = downscale would shrink the images to fit", d);
    expect_refused(rt, &req, want);
    req.n_images = 1; /* 6 tokens: within */
    golden_run(rt, &req, NULL, &res);
    mmrt_destroy(rt);
    rt = golden_open_budget(fixture, 12, MMRT_OVERSIZE_REFUSE); /* exactly at the budget */
    req.n_images = 2;
    golden_run(rt, &req, NULL, &res);
    mmrt_destroy(rt);

    /* downscale, water-filling from the fewest tokens: 80×60 (6) keeps its share of
     * 19/3 = 6; 98×70 (8) is over its share of 13/2 = 6 and gets max_pixels 6·28² = 4704,
     * so smart_resize gives 56×56 (4); 64×64 (9) then fits the 9 left. Taken in prompt
     * order instead, 64×64 could not go down to 19/3 = 6. */
    rt = golden_open_budget(fixture, 19, MMRT_OVERSIZE_DOWNSCALE);
    req.images = (struct mmrt_image_input[]){ { .path = a }, { .path = b }, { .path = c } };
    req.n_images = 3;
    struct budget_capture cap = { 0 };
    struct mmrt_model_trace trace = { .user = &cap, .pixel_values = budget_pixels,
                                      .image_features = budget_features };
    if (mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    assert_int_equal(res.n_tokens, 2);
    assert_int_equal(cap.n_images, 3);
    assert_int_equal(cap.patches[0], smart_patches(64, 64, 9408));
    assert_int_equal(cap.patches[1], smart_patches(98, 70, 6 * 784));
    assert_int_equal(cap.patches[1], 4 * 4);
    assert_int_equal(cap.patches[2], smart_patches(80, 60, 9408));
    for (int i = 0; i < 3; i++)
        assert_int_equal(cap.tokens[i], cap.patches[i] / 4);
    assert_int_equal(cap.tokens[0] + cap.tokens[1] + cap.tokens[2], 19);
    /* The downscaled image's pixels are the processor's with that max_pixels. */
    struct mmrt_qwen2vl_preprocess_config pp;
    mmrt_qwen2vl_preprocess_config_default(&pp);
    pp.min_pixels = 3920;
    pp.max_pixels = 6 * 784;
    struct mmrt_image *img = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_image_load_file(b, NULL, &img, &e), MMRT_OK);
    float *px = malloc((size_t)cap.n_pixels1 * sizeof *px);
    assert_non_null(px);
    int32_t grid[3];
    assert_int_equal(mmrt_preprocess_qwen2vl(img, &pp, px, (size_t)cap.n_pixels1, grid, &e),
                     MMRT_OK);
    assert_int_equal(grid[0], 1);
    assert_int_equal(grid[1], 4);
    assert_int_equal(grid[2], 4);
    assert_int_equal(cap.n_pixels1, 16 * 3 * 2 * 14 * 14);
    assert_memory_equal(px, cap.pixels1, (size_t)cap.n_pixels1 * sizeof *px);
    free(px);
    mmrt_image_destroy(img);
    free(cap.pixels1);
    /* Within the budget nothing changes: 12 ≤ 19. */
    memset(&cap, 0, sizeof cap);
    req.images = (struct mmrt_image_input[]){ { .path = c }, { .path = d } };
    req.n_images = 2;
    if (mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    assert_int_equal(cap.patches[1], smart_patches(45, 90, 9408));
    free(cap.pixels1);
    mmrt_destroy(rt);

    /* downscale that the processor cannot give: its share below min_pixels, or
     * smart_resize's min_pixels rule scaling the image back up over its share. */
    rt = golden_open_budget(fixture, 7, MMRT_OVERSIZE_DOWNSCALE);
    req.images = (struct mmrt_image_input[]){ { .path = a } };
    req.n_images = 1;
    snprintf(want, sizeof want, "image 1 of 1 (%s, 64×64, resized to 84×84) needs 9 image "
             "tokens, more than max_image_tokens = 7 ([model] max_image_tokens); "
             "oversize_images = downscale cannot shrink it to its share of 7 tokens: with "
             "max_pixels 5488, smart_resize still gives 84×84 (9 tokens; min_pixels 3920)", a);
    expect_refused(rt, &req, want);
    mmrt_destroy(rt);
    rt = golden_open_budget(fixture, 4, MMRT_OVERSIZE_DOWNSCALE);
    req.images = (struct mmrt_image_input[]){ { .path = b } };
    snprintf(want, sizeof want, "image 1 of 1 (%s, 98×70, resized to 112×56) needs 8 image "
             "tokens, more than max_image_tokens = 4 ([model] max_image_tokens); "
             "oversize_images = downscale cannot shrink it to its share of 4 tokens "
             "(max_pixels 3136): the processor's min_pixels is 3920", b);
    expect_refused(rt, &req, want);
    mmrt_destroy(rt);

    /* From the INI, and the context's own bound, which still refuses with its own message
     * when it is the tighter one (downscaling aims at max_image_tokens only). */
    golden_set_config("text_config/max_position_embeddings", json_integer(16));
    char ini[512], err[2048];
    snprintf(ini, sizeof ini, "%s/budget.ini", golden_scratch);
    static const char *const texts[] = {
        "[model]\npath = .\nmax_image_tokens = 10\n[device.c]\nplugin = cpu\npool_mb = 64\n",
        "[model]\npath = .\nmax_image_tokens = 100\noversize_images = downscale\n"
        "[device.c]\nplugin = cpu\npool_mb = 64\n",
    };
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(ini, "w");
        assert_non_null(f);
        fputs(texts[k], f);
        assert_int_equal(fclose(f), 0);
        rt = NULL;
        if (mmrt_create_from_file(ini, &rt, err, sizeof err) != MMRT_OK)
            fail_msg("%s", err);
        req.images = (struct mmrt_image_input[]){ { .path = a }, { .path = a } };
        req.n_images = 2;
        if (k == 0)
            snprintf(want, sizeof want, "image 2 of 2 (%s, 64×64, resized to 84×84) needs 9 "
                     "image tokens, bringing the request to 18, more than max_image_tokens = "
                     "10 ([model] max_image_tokens); oversize_images = downscale would shrink "
                     "the images to fit", a);
        else
            snprintf(want, sizeof want, "image 2 (64×64, resized to 84×84) brings the request "
                     "to 18 image tokens, more than the model's context of 16 positions allows");
        expect_refused(rt, &req, want);
        mmrt_destroy(rt);
    }
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_alt_configuration),
        cmocka_unit_test_teardown(test_cpu_graph, golden_cpu_graph_off),
        cmocka_unit_test(test_vision_on_opencl),
        cmocka_unit_test(test_batch_overlap),
        cmocka_unit_test(test_check_two_images),
        cmocka_unit_test(test_cli_two_images),
        cmocka_unit_test_setup_teardown(test_bad_configs, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_configs_more, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_weights, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_layouts, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_requests, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_image_budget, make_scratch, golden_scratch_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
