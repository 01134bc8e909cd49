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
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "formats/image.h"
#include "formats/json.h"
#include "formats/safetensors.h"
#include "model.h"
#include "mmrt/mmrt.h"
#include "preprocess.h"

#define REL_TOL 1e-4
#define PIXEL_TOL 1e-5
#define MAX_STEPS 16
#define MAX_IDS 512

static const char *src_dir(void)
{
    const char *d = getenv("MMRT_SOURCE_DIR");
    return d ? d : ".";
}

static void quiet(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)who;
    if (level >= MMRT_LOG_WARN)
        fprintf(stderr, "%s\n", msg);
}

/* What one request produced, gathered by the trace and the token callback. */
struct capture {
    float *pixels;
    int64_t n_pixels;
    float *features;
    int64_t n_features;
    float *logits[MAX_STEPS];
    int64_t vocab;
    int32_t tokens[64];
    int n_tokens;
    int32_t ids[MAX_IDS];
    int n_ids;
};

static float *dup_floats(const float *x, int64_t n)
{
    float *y = malloc((size_t)n * sizeof *y);
    assert_non_null(y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

static void on_pixels(void *user, int image, const float *data, int n_dims, const int64_t *shape)
{
    struct capture *c = user;
    (void)image;
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++)
        n *= shape[i];
    c->pixels = dup_floats(data, n);
    c->n_pixels = n;
}

static void on_features(void *user, int image, const float *data, int64_t n_tokens, int64_t dim)
{
    struct capture *c = user;
    (void)image;
    c->features = dup_floats(data, n_tokens * dim);
    c->n_features = n_tokens * dim;
}

static void on_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct capture *c = user;
    if (step < MAX_STEPS)
        c->logits[step] = dup_floats(logits, vocab);
    c->vocab = vocab;
}

static void on_ids(void *user, const int32_t *ids, int n_ids)
{
    struct capture *c = user;
    c->n_ids = n_ids < MAX_IDS ? n_ids : MAX_IDS;
    memcpy(c->ids, ids, (size_t)c->n_ids * sizeof *ids);
}

static bool on_token(void *user, int32_t id, const char *text)
{
    struct capture *c = user;
    (void)text;
    if (id >= 0 && c->n_tokens < 64)
        c->tokens[c->n_tokens++] = id;
    return true;
}

static void capture_free(struct capture *c)
{
    free(c->pixels);
    free(c->features);
    for (int i = 0; i < MAX_STEPS; i++)
        free(c->logits[i]);
    memset(c, 0, sizeof *c);
}

/* max|got − want| / max|want|, the fixtures' tolerance rule. */
static double rel_err(const float *got, const float *want, int64_t n)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        diff = d > diff ? d : diff;
        scale = fabs((double)want[i]) > scale ? fabs((double)want[i]) : scale;
    }
    return scale > 0 ? diff / scale : diff;
}

static float *expected_tensor(struct mmrt_safetensors *st, const char *name, int64_t n)
{
    const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, name);
    if (!t)
        fail_msg("expected.safetensors has no %s", name);
    assert_int_equal(t->n_elements, (uint64_t)n);
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_safetensors_read_f32(t, x, (size_t)n, &err), MMRT_OK);
    return x;
}

/* One device (cpu, or MMRT_TEST_PLUGIN: the GPU check script sets it to cuda), or the vision
 * stage on `vision_plugin` and the language stage on cpu. */
static struct mmrt_runtime *open_model(const char *model_dir, const char *vision_plugin,
                                       char *err, size_t err_size, mmrt_status *status)
{
    const char *plugin = getenv("MMRT_TEST_PLUGIN");
    struct mmrt_device_config devs[2] = {
        { .name = "v", .plugin = vision_plugin ? vision_plugin
                                               : plugin && *plugin ? plugin : "cpu",
          .pool_mb = 64 },
        { .name = "l", .plugin = "cpu", .pool_mb = 64 },
    };
    struct mmrt_config cfg = { .model_path = model_dir, .devices = devs,
                               .n_devices = vision_plugin ? 2 : 1 };
    if (vision_plugin) {
        cfg.vision_device = "v";
        cfg.language_device = "l";
    }
    struct mmrt_runtime *rt = NULL;
    *status = mmrt_create(&cfg, &rt, err, err_size);
    return rt;
}

/* Runs every case of one fixture directory and holds it to the reference. */
static void check_fixture(const char *name, const char *vision_plugin)
{
    char dir[4096], path[4200], err[2048] = "";
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", src_dir(), name);
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(dir, vision_plugin, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("%s: %s", name, err);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_t *exp = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_json_load_file(path, 64 << 20, 0, &exp, &e), MMRT_OK);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    struct mmrt_safetensors *ref = NULL;
    assert_int_equal(mmrt_safetensors_open(path, NULL, &ref, &e), MMRT_OK);

    const json_t *cases = json_object_get(exp, "cases");
    double worst_px = 0, worst_feat = 0, worst_logit = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *cname = json_string_value(json_object_get(c, "name"));
        char image[4096];
        snprintf(image, sizeof image, "%s/%s", src_dir(),
                 json_string_value(json_object_get(c, "image")));
        struct mmrt_request req = {
            .image_path = image,
            .prompt = json_string_value(json_object_get(c, "prompt")),
            .max_tokens = MAX_STEPS,
            .top_p = 1.0f,
        };
        struct capture cap = { 0 };
        struct mmrt_model_trace trace = { .user = &cap, .pixel_values = on_pixels,
                                          .image_features = on_features, .logits = on_logits,
                                          .prompt_ids = on_ids };
        struct mmrt_result res;
        st = mmrt_run_traced(rt, &req, &trace, on_token, &cap, &res);
        if (st != MMRT_OK)
            fail_msg("%s %s: %s", name, cname, mmrt_last_error(rt));

        const json_t *ids = json_object_get(c, "input_ids");
        assert_int_equal(cap.n_ids, (int)json_array_size(ids));
        for (int k = 0; k < cap.n_ids; k++)
            if (cap.ids[k] != (int32_t)json_integer_value(json_array_get(ids, (size_t)k)))
                fail_msg("%s %s: input id %d is %d, transformers has %d", name, cname, k,
                         cap.ids[k], (int)json_integer_value(json_array_get(ids, (size_t)k)));
        char tname[128];
        snprintf(tname, sizeof tname, "%s.patches", cname);
        float *want = expected_tensor(ref, tname, cap.n_pixels);
        double px = rel_err(cap.pixels, want, cap.n_pixels);
        free(want);
        snprintf(tname, sizeof tname, "%s.image_features", cname);
        want = expected_tensor(ref, tname, cap.n_features);
        double feat = rel_err(cap.features, want, cap.n_features);
        free(want);
        snprintf(tname, sizeof tname, "%s.logits_steps", cname);
        want = expected_tensor(ref, tname, MAX_STEPS * cap.vocab);
        double lg = 0;
        for (int s = 0; s < MAX_STEPS && cap.logits[s]; s++) {
            double r = rel_err(cap.logits[s], want + s * cap.vocab, cap.vocab);
            lg = r > lg ? r : lg;
        }
        free(want);
        worst_px = px > worst_px ? px : worst_px;
        worst_feat = feat > worst_feat ? feat : worst_feat;
        worst_logit = lg > worst_logit ? lg : worst_logit;
        if (px > PIXEL_TOL || feat > REL_TOL || lg > REL_TOL)
            fail_msg("%s %s: patches %.3g, features %.3g, logits %.3g (tolerances %g, %g)", name,
                     cname, px, feat, lg, PIXEL_TOL, REL_TOL);

        const json_t *greedy = json_object_get(c, "greedy_tokens");
        assert_int_equal(cap.n_tokens, (int)json_array_size(greedy));
        for (int k = 0; k < cap.n_tokens; k++) {
            int32_t want_id = (int32_t)json_integer_value(json_array_get(greedy, (size_t)k));
            if (cap.tokens[k] != want_id)
                fail_msg("%s %s: token %d is %d, transformers chose %d", name, cname, k,
                         cap.tokens[k], want_id);
        }
        capture_free(&cap);
    }
    print_message("%s%s%s: %zu cases, worst relative error: patches %.2g, patch embeddings "
                  "%.2g, logits %.2g; input ids and greedy tokens identical\n",
                  name, vision_plugin ? " vision on " : "", vision_plugin ? vision_plugin : "",
                  json_array_size(cases), worst_px, worst_feat, worst_logit);
    mmrt_safetensors_close(ref);
    json_decref(exp);
    mmrt_destroy(rt);
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

/* The patch projection on OpenCL, the Persimmon decoder on the CPU. */
static void test_vision_on_opencl(void **state)
{
    (void)state;
    struct mmrt_device_config dev = { .name = "o", .plugin = "opencl", .pool_mb = 1 };
    struct mmrt_config cfg = { .devices = &dev, .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    char err[1024];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK) {
        print_message("no OpenCL device, skipped: %s\n", err);
        skip();
    }
    mmrt_destroy(rt);
    check_fixture("fuyu-tiny", "opencl");
    check_fixture("fuyu-tiny-alt", "opencl");
}

/* ---- bad checkpoints and requests: a copy of fuyu-tiny with one file changed ---- */

static char scratch[256];

static int make_scratch(void **state)
{
    (void)state;
    mmrt_set_log_sink(quiet, NULL, MMRT_LOG_WARN);
    snprintf(scratch, sizeof scratch, "/tmp/mmrt_fuyu_XXXXXX");
    assert_non_null(mkdtemp(scratch));
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/fixtures/fuyu-tiny/.' '%s/'", src_dir(), scratch);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static int drop_scratch(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    assert_int_equal(system(cmd), 0);
    return 0;
}

/* Rewrites `file` with obj[key] = value, obj = text_config when text, else the top level. */
static void set_json(const char *file, const char *key, json_t *value, bool text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", scratch, file);
    struct mmrt_error e = { 0 };
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_file(path, 1 << 20, 0, &root, &e), MMRT_OK);
    json_object_set_new(text ? json_object_get(root, "text_config") : root, key, value);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
}

static void set_config(const char *key, json_t *value, bool text)
{
    set_json("config.json", key, value, text);
}

static void expect_load_error(mmrt_status want, const char *part)
{
    char err[2048] = "";
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(scratch, NULL, err, sizeof err, &st);
    mmrt_destroy(rt);
    assert_int_equal(st, want);
    if (!strstr(err, part))
        fail_msg("expected '%s' in: %s", part, err);
}

static void expect_loads(void)
{
    char err[2048];
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("checkpoint should load: %s", err);
    mmrt_destroy(rt);
}

static void test_bad_configs(void **state)
{
    (void)state;
    set_config("num_attention_heads", json_integer(5), true);
    expect_load_error(MMRT_ERR_FORMAT, "not divisible by num_attention_heads 5");
    set_config("num_attention_heads", json_integer(4), true);
    set_config("hidden_act", json_string("gelu"), true);
    expect_load_error(MMRT_ERR_UNSUPPORTED, "hidden_act 'gelu' is not supported");
    set_config("hidden_act", json_string("relu2"), true);
    /* 8 · 0.1 = 0.8 rotary dims. */
    set_config("rope_parameters", json_pack("{s:s, s:f, s:f}", "rope_type", "default",
                                            "rope_theta", 25000.0, "partial_rotary_factor", 0.1),
               true);
    expect_load_error(MMRT_ERR_FORMAT, "partial_rotary_factor 0.1 gives 0 rotary dims");
    set_config("rope_parameters", json_pack("{s:s, s:f}", "rope_type", "yarn", "rope_theta", 5e3),
               true);
    expect_load_error(MMRT_ERR_UNSUPPORTED, "rope type 'yarn' is not supported");
    set_config("rope_parameters", json_pack("{s:s, s:f, s:f}", "rope_type", "default",
                                            "rope_theta", 25000.0, "partial_rotary_factor", 0.5),
               true);
    set_config("image_token_id", json_integer(100000), false);
    expect_load_error(MMRT_ERR_FORMAT, "image_token_id 100000 is not below the vocab_size 376");
    set_config("image_token_id", json_integer(259), false);
    /* The processor's patch size must be the model's. */
    set_config("patch_size", json_integer(15), false);
    expect_load_error(MMRT_ERR_FORMAT, "differs from the model's patch_size 15");
    set_config("patch_size", json_integer(10), false);
    set_json("preprocessor_config.json", "size", json_pack("{s:i, s:i}", "height", 65, "width",
                                                           90), false);
    expect_load_error(MMRT_ERR_FORMAT, "size 65×90 is not a multiple of the patch size 10");
    set_json("preprocessor_config.json", "size", json_pack("{s:i, s:i}", "height", 60, "width",
                                                           90), false);
    /* A config that disagrees with the weights: the shape check names the tensor. */
    set_config("intermediate_size", json_integer(48), true);
    expect_load_error(MMRT_ERR_FORMAT, "layers.0.mlp.dense_h_to_4h.weight' has shape [64, 32], "
                                       "config.json implies [48, 32]");
    set_config("intermediate_size", json_integer(64), true);
    expect_loads();
}

/* The hub layout: text fields at the top level, no text_config (FuyuConfig builds one). */
static void test_flat_config(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", scratch);
    struct mmrt_error e = { 0 };
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_file(path, 1 << 20, 0, &root, &e), MMRT_OK);
    json_t *text = json_incref(json_object_get(root, "text_config"));
    json_object_del(root, "text_config");
    const char *key;
    json_t *value;
    json_object_foreach(text, key, value) {
        if (strcmp(key, "model_type") != 0)
            json_object_set(root, key, value);
    }
    json_decref(text);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
    /* Same numbers as the nested form: run case 0 of the fixture against it. */
    char err[2048];
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("flat config: %s", err);
    char image[4096];
    snprintf(image, sizeof image, "%s/tests/fixtures/llava-images/grad_80x60.png", src_dir());
    struct mmrt_request req = { .image_path = image, .prompt = "Generate a coco-style caption.\n",
                                .max_tokens = 4, .top_p = 1.0f };
    struct capture cap = { 0 };
    struct mmrt_result res;
    assert_int_equal(mmrt_run(rt, &req, on_token, &cap, &res), MMRT_OK);
    static const int32_t want[4] = { 331, 319, 17, 169 };
    assert_int_equal(cap.n_tokens, 4);
    assert_memory_equal(cap.tokens, want, sizeof want);
    mmrt_destroy(rt);
}

static void expect_run_error(struct mmrt_runtime *rt, const struct mmrt_request *req,
                             mmrt_status want, const char *part)
{
    struct mmrt_result res;
    mmrt_status st = mmrt_run(rt, req, NULL, NULL, &res);
    assert_int_equal(st, want);
    if (!strstr(mmrt_last_error(rt), part))
        fail_msg("expected '%s' in: %s", part, mmrt_last_error(rt));
}

/* Counts image-stage work: a refused image must not reach the patch projection. */
static int n_feature_calls;
static void count_features(void *user, int image, const float *data, int64_t n, int64_t dim)
{
    (void)user;
    (void)image;
    (void)data;
    (void)n;
    (void)dim;
    n_feature_calls++;
}

static void test_bad_requests(void **state)
{
    (void)state;
    /* A context of 40 positions: the 64×64 image needs 6 rows × 7 = 42 image tokens. */
    set_config("max_position_embeddings", json_integer(40), true);
    char err[2048];
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("%s", err);
    char image[4096], small[4096];
    snprintf(image, sizeof image, "%s/tests/fixtures/llava-images/grad_64x64.png", src_dir());
    snprintf(small, sizeof small, "%s/tests/fixtures/llava-images/grad_45x90.png", src_dir());
    struct mmrt_request req = { .image_path = image, .prompt = "hi", .max_tokens = 4,
                                .top_p = 1.0f };
    struct mmrt_model_trace trace = { .image_features = count_features };
    struct mmrt_result res;
    n_feature_calls = 0;
    assert_int_equal(mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res), MMRT_ERR_LIMIT);
    if (!strstr(mmrt_last_error(rt), "needs 42 image tokens"))
        fail_msg("unexpected: %s", mmrt_last_error(rt));
    assert_int_equal(n_feature_calls, 0);
    /* The 45×90 image (24 image tokens) fits, the prompt plus new tokens does not. */
    req.image_path = small;
    req.max_tokens = 20;
    expect_run_error(rt, &req, MMRT_ERR_LIMIT, "exceeds the model's context of 40 positions");
    /* The image placeholder typed into the prompt. */
    req.max_tokens = 2;
    req.prompt = "look |SPEAKER| here";
    expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "prompt contains the image placeholder");
    /* Images that cannot be used. */
    req.prompt = "hi";
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", scratch);
    req.image_path = path;
    expect_run_error(rt, &req, MMRT_ERR_UNSUPPORTED, "unsupported image format");
    req.image_path = "/nonexistent.png";
    expect_run_error(rt, &req, MMRT_ERR_IO, "/nonexistent.png");
    req.image_path = small;
    req.max_tokens = 0;
    expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "max_tokens");
    /* And a good request still works afterwards: nothing leaked into the pool. */
    req.max_tokens = 3;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(res.n_tokens, 3);
    struct mmrt_pool_report pr;
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    uint64_t weights = pr.bytes_in_use;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    assert_int_equal(pr.bytes_in_use, weights);
    /* Text only: the tokenizer's own template, no image span. */
    req.image_path = NULL;
    req.prompt = "What is shown?";
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(res.n_tokens, 3);
    mmrt_destroy(rt);
}

static void test_sampling_is_seeded(void **state)
{
    (void)state;
    char err[2048];
    mmrt_status st;
    char dir[4096], image[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/fuyu-tiny", src_dir());
    snprintf(image, sizeof image, "%s/tests/fixtures/llava-images/grad_80x60.png", src_dir());
    struct mmrt_runtime *rt = open_model(dir, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("%s", err);
    struct mmrt_request req = { .image_path = image, .prompt = "What is this?\n",
                                .max_tokens = 12, .seed = 7, .temperature = 1.5f, .top_k = 50,
                                .top_p = 0.95f };
    struct capture a = { 0 }, b = { 0 }, c = { 0 };
    struct mmrt_result res;
    assert_int_equal(mmrt_run(rt, &req, on_token, &a, &res), MMRT_OK);
    assert_int_equal(mmrt_run(rt, &req, on_token, &b, &res), MMRT_OK);
    req.seed = 8;
    assert_int_equal(mmrt_run(rt, &req, on_token, &c, &res), MMRT_OK);
    assert_int_equal(a.n_tokens, b.n_tokens);
    assert_memory_equal(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof a.tokens[0]);
    assert_true(a.n_tokens != c.n_tokens ||
                memcmp(a.tokens, c.tokens, (size_t)a.n_tokens * sizeof a.tokens[0]) != 0);
    mmrt_destroy(rt);
}

/* ---- the image-token budget ([model] max_image_tokens, oversize_images) ---- */

static struct mmrt_runtime *open_budget(const char *dir, int64_t max_image_tokens,
                                        enum mmrt_oversize_images mode)
{
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .model_path = dir, .devices = &dev, .n_devices = 1,
                               .max_image_tokens = max_image_tokens, .oversize_images = mode };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s", err);
    return rt;
}

/* A refusal is exactly `want` and comes before any preprocessing (no pixels traced). */
static void expect_refused(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           const char *want)
{
    struct capture cap = { 0 };
    struct mmrt_model_trace trace = { .user = &cap, .pixel_values = on_pixels };
    struct mmrt_result res;
    mmrt_status st = mmrt_run_traced(rt, req, &trace, NULL, NULL, &res);
    if (st != MMRT_ERR_LIMIT || strcmp(mmrt_last_error(rt), want) != 0)
        fail_msg("want MMRT_ERR_LIMIT \"%s\"\ngot  %d \"%s\"", want, st, mmrt_last_error(rt));
    assert_null(cap.pixels);
}

/* Tiny Fuyu: target 60×90 (height × width), 10-px patches, an image's tokens are
 * rows × (cols + 1). 80×60 → 6 × 9 = 54; 100×40 is fitted to 90×36 → 4 × 10 = 40. */
static void test_image_budget(void **state)
{
    (void)state;
    char fixture[4096], a[4096], b[4096], c[4096], d[4096], want[8192];
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/fuyu-tiny", src_dir());
    snprintf(a, sizeof a, "%s/tests/fixtures/llava-images/grad_80x60.png", src_dir());
    snprintf(b, sizeof b, "%s/tests/fixtures/llava-next-images/grad_100x40.png", src_dir());
    snprintf(c, sizeof c, "%s/tests/fixtures/llava-images/grad_45x90.png", src_dir());
    snprintf(d, sizeof d, "%s/tests/fixtures/llava-images/grad_64x64.png", src_dir());
    struct mmrt_request req = { .image_path = a, .prompt = "hi", .max_tokens = 2, .top_p = 1.0f };
    struct mmrt_result res;

    struct mmrt_runtime *rt = open_budget(fixture, 30, MMRT_OVERSIZE_REFUSE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 80×60) needs 54 image tokens, more than "
             "max_image_tokens = 30 ([model] max_image_tokens); oversize_images = downscale "
             "would shrink it to fit", a);
    expect_refused(rt, &req, want);
    req.image_path = b;
    snprintf(want, sizeof want, "image 1 of 1 (%s, 100×40, resized to 90×36) needs 40 image "
             "tokens, more than max_image_tokens = 30 ([model] max_image_tokens); "
             "oversize_images = downscale would shrink it to fit", b);
    expect_refused(rt, &req, want);
    req.image_path = c; /* 6 × 4 = 24 */
    if (mmrt_run(rt, &req, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    mmrt_destroy(rt);

    /* downscale: the largest 4:3 size with at most 30 tokens is 53×40 (4 × 7 = 28), and the
     * processor then pads that Pillow-resized image to 60×40 and cuts 24 patches. */
    rt = open_budget(fixture, 30, MMRT_OVERSIZE_DOWNSCALE);
    req.image_path = a;
    struct capture cap = { 0 };
    struct mmrt_model_trace trace = { .user = &cap, .pixel_values = on_pixels,
                                      .image_features = on_features };
    if (mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
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
    capture_free(&cap);
    mmrt_destroy(rt);

    /* downscale that cannot fit: the smallest image is one patch and its |NEWLINE|. */
    rt = open_budget(fixture, 1, MMRT_OVERSIZE_DOWNSCALE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 80×60) needs 54 image tokens, more than "
             "max_image_tokens = 1 ([model] max_image_tokens); oversize_images = downscale "
             "cannot help: no smaller size of this aspect ratio has at most 1 image tokens", a);
    expect_refused(rt, &req, want);
    mmrt_destroy(rt);

    /* The context's own bound (40 positions hold 37 image tokens) still refuses with its
     * message when the configured budget is larger; a smaller one downscales within it. */
    set_config("max_position_embeddings", json_integer(40), true);
    rt = open_budget(scratch, 100, MMRT_OVERSIZE_DOWNSCALE);
    req.image_path = d;
    struct mmrt_result r2;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &r2), MMRT_ERR_LIMIT);
    if (!strstr(mmrt_last_error(rt), "image 64×64 needs 42 image tokens (6×6 patches of 10 px "
                                     "plus row ends), more than the model's context of 40 "
                                     "positions allows"))
        fail_msg("unexpected: %s", mmrt_last_error(rt));
    mmrt_destroy(rt);
    rt = open_budget(scratch, 30, MMRT_OVERSIZE_DOWNSCALE); /* 64×64 → 50×50: 5 × 6 = 30 */
    if (mmrt_run(rt, &req, NULL, NULL, &r2) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    assert_int_equal(r2.n_tokens, 2);
    mmrt_destroy(rt);
}

int main(void)
{
    mmrt_set_log_sink(quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_alt_configuration),
        cmocka_unit_test(test_vision_on_opencl),
        cmocka_unit_test_setup_teardown(test_bad_configs, make_scratch, drop_scratch),
        cmocka_unit_test_setup_teardown(test_flat_config, make_scratch, drop_scratch),
        cmocka_unit_test_setup_teardown(test_bad_requests, make_scratch, drop_scratch),
        cmocka_unit_test(test_sampling_is_seeded),
        cmocka_unit_test_setup_teardown(test_image_budget, make_scratch, drop_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
