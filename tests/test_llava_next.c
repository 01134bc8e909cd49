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

/* One device (cpu, or MMRT_TEST_PLUGIN as in test_llava.c, for the GPU check script), or the
 * vision stage on `vision_plugin` and the language stage on cpu. */
static struct mmrt_runtime *open_model(const char *model_dir, const char *vision_plugin,
                                       char *err, size_t err_size, mmrt_status *status)
{
    const char *one = getenv("MMRT_TEST_PLUGIN");
    struct mmrt_device_config devs[2] = {
        { .name = "v", .plugin = vision_plugin ? vision_plugin : one && *one ? one : "cpu",
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
                                          .image_features = on_features, .logits = on_logits };
        struct mmrt_result res;
        st = mmrt_run_traced(rt, &req, &trace, on_token, &cap, &res);
        if (st != MMRT_OK)
            fail_msg("%s %s: %s", name, cname, mmrt_last_error(rt));
        /* The prompt grew by the token count of §3.4, which the fixture records. */
        const json_t *ids = json_object_get(c, "input_ids");
        assert_int_equal(res.n_prompt_tokens, (int)json_array_size(ids));

        char tname[128];
        snprintf(tname, sizeof tname, "%s.pixel_values", cname);
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
            fail_msg("%s %s: pixel %.3g, features %.3g, logits %.3g (tolerances %g, %g)", name,
                     cname, px, feat, lg, PIXEL_TOL, REL_TOL);

        /* The reference ran with EOS stopping off; mmrt stops at the first EOS. */
        const json_t *greedy = json_object_get(c, "greedy_tokens");
        const json_t *eos_at = json_object_get(c, "natural_eos_index");
        int n_want = json_is_integer(eos_at) ? (int)json_integer_value(eos_at) + 1
                                             : (int)json_array_size(greedy);
        assert_int_equal(cap.n_tokens, n_want);
        for (int k = 0; k < cap.n_tokens; k++) {
            int32_t want_id = (int32_t)json_integer_value(json_array_get(greedy, (size_t)k));
            if (cap.tokens[k] != want_id)
                fail_msg("%s %s: token %d is %d, transformers chose %d", name, cname, k,
                         cap.tokens[k], want_id);
        }
        capture_free(&cap);
    }
    print_message("%s (vision on %s): %zu cases, worst relative error: pixels %.2g, image "
                  "features %.2g, logits %.2g; greedy tokens identical\n",
                  name, vision_plugin  ? vision_plugin
                        : getenv("MMRT_TEST_PLUGIN") ? getenv("MMRT_TEST_PLUGIN") : "cpu",
                  json_array_size(cases), worst_px,
                  worst_feat, worst_logit);
    mmrt_safetensors_close(ref);
    json_decref(exp);
    mmrt_destroy(rt);
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
    struct mmrt_device_config dev = { .name = "o", .plugin = "opencl", .pool_mb = 1 };
    struct mmrt_config cfg = { .devices = &dev, .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    char err[1024];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK) {
        print_message("no OpenCL device, skipped: %s\n", err);
        skip();
    }
    mmrt_destroy(rt);
    check_fixture("llava-next-tiny", "opencl");
    check_fixture("llava-next-tiny-alt", "opencl");
}

/* ---- bad checkpoints and requests: a copy of llava-next-tiny with one file changed ---- */

static char scratch[256];

static int make_scratch(void **state)
{
    (void)state;
    snprintf(scratch, sizeof scratch, "/tmp/mmrt_llava_next_XXXXXX");
    assert_non_null(mkdtemp(scratch));
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/fixtures/llava-next-tiny/.' '%s/'", src_dir(),
             scratch);
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

/* Rewrites `file` with root[key] set (value NULL: removed). */
static void set_json(const char *file, const char *key, json_t *value)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", scratch, file);
    struct mmrt_error e = { 0 };
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_file(path, 1 << 20, 0, &root, &e), MMRT_OK);
    if (value)
        json_object_set_new(root, key, value);
    else
        json_object_del(root, key);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
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

static void test_bad_configs(void **state)
{
    (void)state;
    set_json("config.json", "image_grid_pinpoints", json_string("anyres"));
    expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints must be a list of 1…64");
    set_json("config.json", "image_grid_pinpoints", json_pack("[[i,i],[i]]", 28, 56, 56));
    expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints[1] is not a [height, width] pair");
    set_json("config.json", "image_grid_pinpoints", json_pack("[[i,s]]", 28, "56"));
    expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints[0] is not a [height, width] pair");
    set_json("config.json", "image_grid_pinpoints", json_pack("[[i,i],[i,i]]", 28, 56, 30, 56));
    expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints[1] = [30, 56] must be positive "
                                       "multiples of the vision image_size 28");
    set_json("config.json", "image_grid_pinpoints", json_pack("[[i,i]]", 0, 56));
    expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints[0] = [0, 56]");
    set_json("config.json", "image_grid_pinpoints", json_pack("[[i,i]]", 28 * 9, 28 * 9));
    expect_load_error(MMRT_ERR_FORMAT, "with at most 64 tiles");
    /* Valid, but not the processor's: the two would count image tokens differently. */
    set_json("config.json", "image_grid_pinpoints", json_pack("[[i,i]]", 28, 56));
    expect_load_error(MMRT_ERR_FORMAT, "image_grid_pinpoints differ from config.json's");
    set_json("config.json", "image_grid_pinpoints",
             json_pack("[[i,i],[i,i],[i,i]]", 28, 56, 56, 28, 56, 56));
    set_json("config.json", "vision_feature_select_strategy", json_string("full"));
    expect_load_error(MMRT_ERR_UNSUPPORTED, "only 'default' is supported");
    set_json("config.json", "vision_feature_select_strategy", json_string("default"));
    /* Everything restored: it loads again. */
    char err[2048];
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("restored checkpoint: %s", err);
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

static void test_bad_requests(void **state)
{
    (void)state;
    char err[2048];
    mmrt_status st;
    struct mmrt_runtime *rt = open_model(scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("%s", err);
    char image[4096];
    snprintf(image, sizeof image, "%s/tests/fixtures/llava-images/grad_64x64.png", src_dir());
    struct mmrt_request req = { .image_path = image, .prompt = "compare <image> please",
                                .max_tokens = 4, .top_p = 1.0f };
    expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "2 image placeholders but 1 image was given");
    req.image_path = NULL;
    req.prompt = "what is <image>?";
    expect_run_error(rt, &req, MMRT_ERR_INVALID_ARG, "1 image placeholder but 0 images were given");
    req.image_path = "/nonexistent.png";
    expect_run_error(rt, &req, MMRT_ERR_IO, "/nonexistent.png");
    /* A good request still works afterwards, and nothing stays in the pool. */
    req.image_path = image;
    req.prompt = "hi";
    struct mmrt_result res;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(res.n_tokens, 4);
    struct mmrt_pool_report pr;
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    uint64_t weights = pr.bytes_in_use;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    assert_int_equal(pr.bytes_in_use, weights);
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

/* Tiny NeXT: 28-px tiles of 4×4 patches (16 base tokens), pinpoints 28×56, 56×28, 56×56.
 * 64×64 takes the 56×56 grid: 16 + 8 × 9 = 88 tokens; 36×100 takes 56×28: 40 tokens. */
static void test_image_budget(void **state)
{
    (void)state;
    char fixture[4096], a[4096], b[4096], want[8192];
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/llava-next-tiny", src_dir());
    snprintf(a, sizeof a, "%s/tests/fixtures/llava-images/grad_64x64.png", src_dir());
    snprintf(b, sizeof b, "%s/tests/fixtures/llava-images/grad_36x100.png", src_dir());
    struct mmrt_request req = { .image_path = a, .prompt = "hi", .max_tokens = 2, .top_p = 1.0f };
    struct mmrt_result res;

    struct mmrt_runtime *rt = open_budget(fixture, 50, MMRT_OVERSIZE_REFUSE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 64×64) needs 88 image tokens, more than "
             "max_image_tokens = 50 ([model] max_image_tokens); oversize_images = downscale "
             "would shrink it to fit", a);
    expect_refused(rt, &req, want);
    req.image_path = b; /* 40 tokens */
    if (mmrt_run(rt, &req, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    mmrt_destroy(rt);
    rt = open_budget(fixture, 40, MMRT_OVERSIZE_REFUSE); /* exactly at the budget */
    if (mmrt_run(rt, &req, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    mmrt_destroy(rt);

    /* downscale: the largest square under 64 px with at most 50 tokens is 28×28 — it fits
     * one 28×56 tile pair, unpadded to 4 columns: 16 + 4 × 5 = 36 — and the processor then
     * sees the Pillow-resized 28×28 image: its base patch is that image, normalised. */
    rt = open_budget(fixture, 50, MMRT_OVERSIZE_DOWNSCALE);
    req.image_path = a;
    struct capture cap = { 0 };
    struct mmrt_model_trace trace = { .user = &cap, .pixel_values = on_pixels,
                                      .image_features = on_features };
    if (mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
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
    capture_free(&cap);
    mmrt_destroy(rt);

    /* downscale that cannot fit: every smaller size still needs more than 30. */
    rt = open_budget(fixture, 30, MMRT_OVERSIZE_DOWNSCALE);
    snprintf(want, sizeof want, "image 1 of 1 (%s, 64×64) needs 88 image tokens, more than "
             "max_image_tokens = 30 ([model] max_image_tokens); oversize_images = downscale "
             "cannot help: no smaller size of this aspect ratio has at most 30 image tokens "
             "(the base image alone takes 16)", a);
    expect_refused(rt, &req, want);
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
        cmocka_unit_test_setup_teardown(test_bad_requests, make_scratch, drop_scratch),
        cmocka_unit_test(test_image_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
