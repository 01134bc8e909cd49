/*
 * tests/golden.c — the scaffolding of the golden end-to-end tests (see golden.h): the trace
 * capture, the fixtures' tolerance rule, the per-case loop against expected.json and
 * expected.safetensors, and the scratch checkpoint the bad-input cases edit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "golden.h"

bool golden_cpu_graph;
char golden_scratch[256];

const char *golden_src_dir(void)
{
    const char *d = getenv("MMRT_SOURCE_DIR");
    return d ? d : ".";
}

void golden_fixture_path(char *buf, size_t size, const char *rel)
{
    snprintf(buf, size, "%s/tests/fixtures/%s", golden_src_dir(), rel);
}

void golden_quiet(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)who;
    if (level >= MMRT_LOG_WARN)
        fprintf(stderr, "%s\n", msg);
}

/* ---- capture ---- */

static void append_floats(float **dst, int64_t *n, const float *x, int64_t k)
{
    float *g = realloc(*dst, (size_t)(*n + k) * sizeof *g);
    assert_non_null(g);
    memcpy(g + *n, x, (size_t)k * sizeof *g);
    *dst = g;
    *n += k;
}

static void on_pixels(void *user, int image, const float *data, int n_dims, const int64_t *shape)
{
    struct golden_capture *c = user;
    assert_int_equal(image, c->n_pixel_calls++);
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++)
        n *= shape[i];
    append_floats(&c->pixels, &c->n_pixels, data, n);
}

static void on_features(void *user, int image, const float *data, int64_t n_tokens, int64_t dim)
{
    struct golden_capture *c = user;
    assert_int_equal(image, c->n_feature_calls++);
    append_floats(&c->features, &c->n_features, data, n_tokens * dim);
}

static void on_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct golden_capture *c = user;
    if (step < GOLDEN_MAX_STEPS) {
        int64_t n = 0;
        append_floats(&c->logits[step], &n, logits, vocab);
    }
    c->vocab = vocab;
}

static void on_prompt(void *user, const int32_t *ids, int n_ids)
{
    struct golden_capture *c = user;
    free(c->prompt);
    c->prompt = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *ids);
    assert_non_null(c->prompt);
    memcpy(c->prompt, ids, (size_t)n_ids * sizeof *ids);
    c->n_prompt = n_ids;
}

void golden_trace(struct golden_capture *c, struct mmrt_model_trace *trace)
{
    *trace = (struct mmrt_model_trace){ .user = c, .pixel_values = on_pixels,
                                        .image_features = on_features, .prompt_ids = on_prompt,
                                        .logits = on_logits };
}

bool golden_on_token(void *user, int32_t id, const char *text)
{
    struct golden_capture *c = user;
    (void)text;
    if (id >= 0 && c->n_tokens < GOLDEN_MAX_TOKENS)
        c->tokens[c->n_tokens++] = id;
    return true;
}

void golden_capture_free(struct golden_capture *c)
{
    free(c->pixels);
    free(c->features);
    free(c->prompt);
    for (int i = 0; i < GOLDEN_MAX_STEPS; i++)
        free(c->logits[i]);
    memset(c, 0, sizeof *c);
}

void golden_run(struct mmrt_runtime *rt, const struct mmrt_request *req,
                struct golden_capture *cap, struct mmrt_result *res)
{
    struct mmrt_model_trace trace;
    if (cap)
        golden_trace(cap, &trace);
    if (mmrt_run_traced(rt, req, cap ? &trace : NULL, cap ? golden_on_token : NULL, cap, res) !=
        MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
}

/* ---- reference ---- */

double golden_rel_err(const float *got, const float *want, int64_t n)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        diff = d > diff || d != d ? d : diff;
        scale = fabs((double)want[i]) > scale ? fabs((double)want[i]) : scale;
    }
    return scale > 0 ? diff / scale : diff;
}

float *golden_expected_tensor(struct mmrt_safetensors *st, const char *name, int64_t n)
{
    const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, name);
    if (!t)
        fail_msg("expected.safetensors has no %s", name);
    if (t->n_elements != (uint64_t)n)
        fail_msg("%s: mmrt produced %lld values, the reference has %llu", name, (long long)n,
                 (unsigned long long)t->n_elements);
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_safetensors_read_f32(t, x, (size_t)n, &err), MMRT_OK);
    return x;
}

json_t *golden_expected_json(const char *fixture)
{
    char rel[512], path[4200];
    snprintf(rel, sizeof rel, "%s/expected.json", fixture);
    golden_fixture_path(path, sizeof path, rel);
    json_t *exp = NULL;
    struct mmrt_error e = { 0 };
    if (mmrt_json_load_file(path, 64 << 20, 0, &exp, &e) != MMRT_OK)
        fail_msg("%s: %s", path, e.msg);
    return exp;
}

struct mmrt_request golden_case_request(const json_t *c, struct golden_images *images)
{
    const json_t *list = json_object_get(c, "images");
    const size_t n = list ? json_array_size(list) : 1;
    assert_true(n >= 1 && n <= GOLDEN_MAX_IMAGES);
    for (size_t i = 0; i < n; i++) {
        const json_t *rel = list ? json_array_get(list, i) : json_object_get(c, "image");
        snprintf(images->path[i], sizeof images->path[i], "%s/%s", golden_src_dir(),
                 json_string_value(rel));
        images->in[i] = (struct mmrt_image_input){ .path = images->path[i] };
    }
    struct mmrt_request req = {
        .prompt = json_string_value(json_object_get(c, "prompt")),
        .max_tokens = GOLDEN_MAX_STEPS,
        .top_p = 1.0f,
    };
    req.images = images->in;
    req.n_images = (int)n;
    return req;
}

void golden_check_tokens(const char *fixture, const char *name, const json_t *c,
                         const int32_t *tokens, int n_tokens)
{
    const json_t *greedy = json_object_get(c, "greedy_tokens");
    const json_t *eos_at = json_object_get(c, "natural_eos_index");
    int n_want = json_is_integer(eos_at) ? (int)json_integer_value(eos_at) + 1
                                         : (int)json_array_size(greedy);
    if (n_tokens != n_want)
        fail_msg("%s %s: %d tokens, transformers made %d", fixture, name, n_tokens, n_want);
    for (int k = 0; k < n_tokens; k++) {
        int32_t want = (int32_t)json_integer_value(json_array_get(greedy, (size_t)k));
        if (tokens[k] != want)
            fail_msg("%s %s: token %d is %d, transformers chose %d", fixture, name, k,
                     tokens[k], want);
    }
}

/* ---- fixtures ---- */

int golden_cpu_graph_off(void **state)
{
    (void)state;
    golden_cpu_graph = false;
    return 0;
}

const char *golden_vision_on(const char *vision_plugin)
{
    const char *one = getenv("MMRT_TEST_PLUGIN");
    return vision_plugin ? vision_plugin : one && *one ? one : "cpu";
}

struct mmrt_runtime *golden_open(const char *model_dir, const char *vision_plugin, char *err,
                                 size_t err_size, mmrt_status *status)
{
    static const struct mmrt_option graph_on = { .key = "graph", .value = "1" };
    struct mmrt_device_config devs[2] = {
        { .name = "v", .plugin = golden_vision_on(vision_plugin), .pool_mb = 64 },
        { .name = "l", .plugin = "cpu", .pool_mb = 64 },
    };
    for (int i = 0; i < 2 && golden_cpu_graph; i++)
        if (strcmp(devs[i].plugin, "cpu") == 0) {
            devs[i].options = &graph_on;
            devs[i].n_options = 1;
        }
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

struct mmrt_runtime *golden_open_or_fail(const char *model_dir, const char *vision_plugin)
{
    char err[2048] = "";
    mmrt_status st;
    struct mmrt_runtime *rt = golden_open(model_dir, vision_plugin, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("%s: %s", model_dir, err);
    return rt;
}

/* Reference tensor "<case>.<what>" of n values against got; frees what it read. */
static double tensor_err(struct mmrt_safetensors *ref, const char *name, const char *what,
                         const float *got, int64_t n)
{
    char tname[128];
    snprintf(tname, sizeof tname, "%s.%s", name, what);
    float *want = golden_expected_tensor(ref, tname, n);
    double r = golden_rel_err(got, want, n);
    free(want);
    return r;
}

/* The worst relative error over the steps the capture holds of "<case>.logits_steps". */
static double logits_err(struct mmrt_safetensors *ref, const char *name,
                         const struct golden_capture *cap)
{
    char tname[128];
    snprintf(tname, sizeof tname, "%s.logits_steps", name);
    float *want = golden_expected_tensor(ref, tname, GOLDEN_MAX_STEPS * cap->vocab);
    double lg = 0;
    for (int s = 0; s < GOLDEN_MAX_STEPS && cap->logits[s]; s++) {
        double r = golden_rel_err(cap->logits[s], want + s * cap->vocab, cap->vocab);
        lg = r > lg || r != r ? r : lg; /* a NaN step stays NaN, and fails */
    }
    free(want);
    return lg;
}

static double worse(double a, double b)
{
    return a > b || a != a ? a : b;
}

bool golden_check_fixture(const struct golden_model *model, const char *fixture,
                          const char *vision_plugin, struct golden_summary *summary)
{
    char dir[4096], path[4200], err[2048] = "";
    golden_fixture_path(dir, sizeof dir, fixture);
    mmrt_status st;
    struct mmrt_runtime *rt = golden_open(dir, vision_plugin, err, sizeof err, &st);
    if (st == MMRT_ERR_UNSUPPORTED && vision_plugin && model->skip_lacking_operators &&
        strstr(err, "lacks operators")) {
        print_message("%s on %s skipped: %s\n", fixture, vision_plugin, err);
        return false;
    }
    if (st != MMRT_OK)
        fail_msg("%s: %s", fixture, err);
    json_t *exp = golden_expected_json(fixture);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    struct mmrt_safetensors *ref = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_safetensors_open(path, NULL, &ref, &e), MMRT_OK);

    /* The language device decodes through a graph when it is the CPU plugin with graph = 1,
     * or a plugin that captures by itself (CUDA, under MMRT_TEST_PLUGIN); OpenCL has none. */
    const char *lang = vision_plugin ? "cpu" : golden_vision_on(NULL);
    const bool want_graph = golden_cpu_graph &&
                            (strcmp(lang, "cpu") == 0 || strcmp(lang, "cuda") == 0);
    const json_t *cases = json_object_get(exp, "cases");
    *summary = (struct golden_summary){ .n_cases = json_array_size(cases),
                                        .vision_on = golden_vision_on(vision_plugin) };
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        struct golden_images images;
        struct mmrt_request req = golden_case_request(c, &images);
        struct golden_capture cap = { 0 };
        struct mmrt_model_trace trace;
        golden_trace(&cap, &trace);
        struct mmrt_result res = { 0 };
        st = mmrt_run_traced(rt, &req, &trace, golden_on_token, &cap, &res);
        if (st != MMRT_OK)
            fail_msg("%s %s: %s", fixture, name, mmrt_last_error(rt));
        if (want_graph && res.n_tokens > 1 && !res.decode_graph)
            fail_msg("%s %s: the decode step did not run as a captured graph", fixture, name);
        if (model->check_case) {
            const struct golden_case gc = { .fixture = fixture, .name = name, .json = c,
                                            .req = &req, .res = &res, .cap = &cap };
            model->check_case(&gc);
        }
        double px = tensor_err(ref, name, model->pixel_tensor, cap.pixels, cap.n_pixels);
        double feat = tensor_err(ref, name, "image_features", cap.features, cap.n_features);
        double lg = logits_err(ref, name, &cap);
        summary->pixels = worse(px, summary->pixels);
        summary->features = worse(feat, summary->features);
        summary->logits = worse(lg, summary->logits);
        /* written so that a NaN error fails */
        if (!(px <= GOLDEN_PIXEL_TOL && feat <= GOLDEN_REL_TOL && lg <= GOLDEN_REL_TOL))
            fail_msg("%s %s: %s %.3g, features %.3g, logits %.3g (tolerances %g, %g)", fixture,
                     name, model->pixel_tensor, px, feat, lg, GOLDEN_PIXEL_TOL, GOLDEN_REL_TOL);
        golden_check_tokens(fixture, name, c, cap.tokens, cap.n_tokens);
        golden_capture_free(&cap);
    }
    mmrt_safetensors_close(ref);
    json_decref(exp);
    mmrt_destroy(rt);
    return true;
}

void golden_check_prompt_ids(const struct golden_case *gc)
{
    const json_t *ids = json_object_get(gc->json, "input_ids");
    assert_int_equal(gc->cap->n_prompt, (int)json_array_size(ids));
    for (int k = 0; k < gc->cap->n_prompt; k++) {
        long long want = (long long)json_integer_value(json_array_get(ids, (size_t)k));
        if (gc->cap->prompt[k] != (int32_t)want)
            fail_msg("%s %s: prompt id %d is %d, transformers has %lld", gc->fixture, gc->name,
                     k, gc->cap->prompt[k], want);
    }
}

bool golden_have_plugin(const char *plugin)
{
    struct mmrt_device_config dev = { .name = "o", .plugin = plugin, .pool_mb = 1 };
    struct mmrt_config cfg = { .devices = &dev, .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    char err[1024];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK) {
        print_message("no %s device: %s\n", plugin, err);
        return false;
    }
    mmrt_destroy(rt);
    return true;
}

void golden_require_plugin(const char *plugin)
{
    if (!golden_have_plugin(plugin)) {
        print_message("skipped\n");
        skip();
    }
}

/* ---- scratch checkpoints and bad input ---- */

void golden_scratch_make(const char *fixture)
{
    snprintf(golden_scratch, sizeof golden_scratch, "/tmp/mmrt_%s_XXXXXX", fixture);
    assert_non_null(mkdtemp(golden_scratch));
    char dir[4096], cmd[8192];
    golden_fixture_path(dir, sizeof dir, fixture);
    snprintf(cmd, sizeof cmd, "cp -r '%s/.' '%s/'", dir, golden_scratch);
    assert_int_equal(system(cmd), 0);
}

int golden_scratch_drop(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", golden_scratch);
    assert_int_equal(system(cmd), 0);
    return 0;
}

void golden_set_json(const char *file, const char *keys, json_t *value)
{
    char path[512], buf[256];
    snprintf(path, sizeof path, "%s/%s", golden_scratch, file);
    struct mmrt_error e = { 0 };
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_file(path, 1 << 20, 0, &root, &e), MMRT_OK);
    snprintf(buf, sizeof buf, "%s", keys);
    json_t *obj = root;
    char *key = buf, *slash;
    while ((slash = strchr(key, '/'))) {
        *slash = '\0';
        obj = json_object_get(obj, key);
        assert_non_null(obj);
        key = slash + 1;
    }
    if (value)
        json_object_set_new(obj, key, value);
    else
        json_object_del(obj, key);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
}

void golden_set_config(const char *keys, json_t *value)
{
    golden_set_json("config.json", keys, value);
}

static void st_path(char *buf, size_t size, const char *dir)
{
    snprintf(buf, size, "%s/model.safetensors", dir);
}

json_t *golden_st_header(const char *dir, uint64_t *data_start)
{
    char path[4200];
    st_path(path, sizeof path, dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t len[8];
    assert_int_equal(fread(len, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len[i];
    assert_true(n < (1u << 26));
    char *text = malloc(n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, n, f), n);
    text[n] = '\0';
    fclose(f);
    json_error_t je;
    json_t *h = json_loads(text, 0, &je);
    free(text);
    assert_non_null(h);
    if (data_start)
        *data_start = 8 + n;
    return h;
}

long golden_st_offset(const char *dir, const char *name)
{
    uint64_t data = 0;
    json_t *h = golden_st_header(dir, &data);
    const json_t *e = json_object_get(h, name);
    if (!e)
        fail_msg("%s/model.safetensors has no tensor '%s'", dir, name);
    const long off = (long)data + (long)json_integer_value(
                                      json_array_get(json_object_get(e, "data_offsets"), 0));
    json_decref(h);
    return off;
}

void golden_st_write(const char *dir, long offset, const void *bytes, size_t size)
{
    char path[4200];
    st_path(path, sizeof path, dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    fclose(f);
}

void golden_st_replace(const char *dir, const char *anchor, const char *from, const char *to)
{
    assert_int_equal(strlen(from), strlen(to));
    uint64_t data = 0;
    json_decref(golden_st_header(dir, &data));
    char path[4200];
    st_path(path, sizeof path, dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *head = malloc(data + 1);
    assert_non_null(head);
    assert_int_equal(fread(head, 1, data, f), data);
    fclose(f);
    head[data] = '\0';
    const char *a = strstr(head + 8, anchor);
    assert_non_null(a);
    const char *at = strstr(a, from);
    assert_non_null(at);
    const long off = (long)(at - head);
    free(head);
    golden_st_write(dir, off, to, strlen(to));
}

void golden_expect_load_error(mmrt_status want, const char *part)
{
    char err[2048] = "";
    mmrt_status st;
    struct mmrt_runtime *rt = golden_open(golden_scratch, NULL, err, sizeof err, &st);
    mmrt_destroy(rt);
    if (st != want || !strstr(err, part))
        fail_msg("expected status %d with '%s', got %d: %s", want, part, st, err);
}

void golden_expect_loads(void)
{
    char err[2048] = "";
    mmrt_status st;
    struct mmrt_runtime *rt = golden_open(golden_scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("the checkpoint should load: %s", err);
    mmrt_destroy(rt);
}

void golden_expect_run_error(struct mmrt_runtime *rt, const struct mmrt_request *req,
                             mmrt_status want, const char *part)
{
    struct mmrt_result res = { 0 };
    mmrt_status st = mmrt_run(rt, req, NULL, NULL, &res);
    if (st != want || !strstr(mmrt_last_error(rt), part))
        fail_msg("expected status %d with '%s', got %d: %s", want, part, st,
                 mmrt_last_error(rt));
}

void golden_expect_unusable_images(struct mmrt_runtime *rt, const struct mmrt_request *req)
{
    struct mmrt_request r = *req;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", golden_scratch);
    r.images = TEST_FILE(path);
    r.n_images = 1;
    golden_expect_run_error(rt, &r, MMRT_ERR_UNSUPPORTED, "unsupported image format");
    r.images = TEST_FILE("/nonexistent.png");
    r.n_images = 1;
    golden_expect_run_error(rt, &r, MMRT_ERR_IO, "/nonexistent.png");
}

void golden_flatten_config(void (*adjust)(json_t *root, const json_t *text))
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", golden_scratch);
    struct mmrt_error e = { 0 };
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_file(path, 1 << 20, 0, &root, &e), MMRT_OK);
    json_t *text = json_incref(json_object_get(root, "text_config"));
    assert_non_null(text);
    json_object_del(root, "text_config");
    const char *key;
    json_t *value;
    json_object_foreach(text, key, value) {
        if (strcmp(key, "model_type") != 0)
            json_object_set(root, key, value);
    }
    if (adjust)
        adjust(root, text);
    json_decref(text);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
}

void golden_expect_pool_steady(struct mmrt_runtime *rt, const struct mmrt_request *req,
                               int n_tokens)
{
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run(rt, req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(res.n_tokens, n_tokens);
    struct mmrt_pool_report pr;
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    uint64_t weights = pr.bytes_in_use;
    assert_int_equal(mmrt_run(rt, req, NULL, NULL, &res), MMRT_OK);
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    assert_int_equal(pr.bytes_in_use, weights);
}

void golden_expect_seeded(struct mmrt_runtime *rt, const struct mmrt_request *req)
{
    struct mmrt_request r = *req;
    struct golden_capture a = { 0 }, b = { 0 }, c = { 0 };
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run(rt, &r, golden_on_token, &a, &res), MMRT_OK);
    assert_int_equal(mmrt_run(rt, &r, golden_on_token, &b, &res), MMRT_OK);
    r.seed = req->seed + 1;
    assert_int_equal(mmrt_run(rt, &r, golden_on_token, &c, &res), MMRT_OK);
    assert_int_equal(a.n_tokens, b.n_tokens);
    assert_memory_equal(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof a.tokens[0]);
    assert_true(a.n_tokens != c.n_tokens ||
                memcmp(a.tokens, c.tokens, (size_t)a.n_tokens * sizeof a.tokens[0]) != 0);
}

/* ---- the image-token budget ---- */

struct mmrt_runtime *golden_open_budget(const char *dir, int64_t max_image_tokens,
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

void golden_expect_refused(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           const char *want, struct mmrt_result *res)
{
    struct golden_capture cap = { 0 };
    struct mmrt_model_trace trace;
    golden_trace(&cap, &trace);
    mmrt_status st = mmrt_run_traced(rt, req, &trace, NULL, NULL, res);
    if (st != MMRT_ERR_LIMIT || strcmp(mmrt_last_error(rt), want) != 0)
        fail_msg("want MMRT_ERR_LIMIT \"%s\"\ngot  %d \"%s\"", want, st, mmrt_last_error(rt));
    assert_int_equal(cap.n_pixel_calls, 0);
    golden_capture_free(&cap);
}

void golden_cases_load(const char *fixture, struct golden_cases *c)
{
    memset(c, 0, sizeof *c);
    c->json = golden_expected_json(fixture);
    const json_t *list = json_object_get(c->json, "cases");
    for (size_t i = 0; i < json_array_size(list) && c->n < GOLDEN_MAX_CASES; i++) {
        c->req[c->n] = golden_case_request(json_array_get(list, i), &c->images[c->n]);
        c->n++;
    }
    assert_true(c->n >= 2);
}
