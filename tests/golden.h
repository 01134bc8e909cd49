/*
 * tests/golden.h — what the golden end-to-end tests (test_llava.c, test_llava_next.c,
 * test_fuyu.c, test_qwen2vl.c) share: opening a tiny checkpoint of tests/fixtures, capturing
 * what one request produced through the model trace, holding every case of a fixture to the
 * reference transformers wrote (expected.json, expected.safetensors), and the scratch copy of
 * a checkpoint that the bad-input cases edit.
 *
 * The reference rule is the fixtures' own: max|got − want| / max|want| (golden_rel_err) within
 * GOLDEN_PIXEL_TOL for the preprocessed pixels and GOLDEN_REL_TOL for image features and the
 * logits of every greedy step; greedy tokens identical. Each test keeps its model's own checks
 * (prompt ids, call counts, …) in a golden_case_fn.
 *
 * Every helper fails the current cmocka test on error (fail_msg, assert_*), so callers never
 * see a NULL. Paths are under $MMRT_SOURCE_DIR (set by ctest), or the working directory.
 * Not thread-safe: golden_cpu_graph and golden_scratch are process globals.
 */
#ifndef MMRT_TEST_GOLDEN_H
#define MMRT_TEST_GOLDEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"
#include "formats/safetensors.h"
#include "model.h"
#include "mmrt/mmrt.h"
#include "request_util.h"

#define GOLDEN_REL_TOL 1e-4   /* image features and logits */
#define GOLDEN_PIXEL_TOL 1e-5 /* preprocessed pixels (or patches) */
#define GOLDEN_MAX_STEPS 16   /* greedy steps a fixture records (max_tokens of every case) */
#define GOLDEN_MAX_TOKENS 64  /* tokens a capture keeps */
#define GOLDEN_MAX_IMAGES 4   /* images one fixture case may carry */

/* $MMRT_SOURCE_DIR, or "." when unset. */
const char *golden_src_dir(void);

/* buf = <golden_src_dir>/tests/fixtures/<rel>. */
void golden_fixture_path(char *buf, size_t size, const char *rel);

/* Log sink for mmrt_set_log_sink: warnings and errors to stderr, nothing else. */
void golden_quiet(void *user, enum mmrt_log_level level, const char *who, const char *msg);

/* ---- capture ---- */

/* What one request produced, gathered by the trace (golden_trace) and the token callback
 * (golden_on_token, user = the capture). Pixels and features arrive once per image and are
 * appended in order, as the fixtures concatenate them; the callbacks assert that image i is
 * the i-th call. Start from { 0 }; release with golden_capture_free. */
struct golden_capture {
    float *pixels;                      /* every image's pixel values, one after the other */
    int64_t n_pixels;
    float *features;                    /* every image's features [tokens][dim], appended */
    int64_t n_features;
    int n_pixel_calls, n_feature_calls; /* images traced */
    float *logits[GOLDEN_MAX_STEPS];    /* [vocab] per step; NULL past the last step */
    int64_t vocab;
    int32_t *prompt;                    /* prompt ids after template and image expansion */
    int n_prompt;
    int32_t tokens[GOLDEN_MAX_TOKENS];  /* generated ids (later ones are dropped) */
    int n_tokens;
};

/* Fills *trace with the four callbacks and user = c. */
void golden_trace(struct golden_capture *c, struct mmrt_model_trace *trace);

/* mmrt_token_fn appending to the golden_capture `user`; always continues. */
bool golden_on_token(void *user, int32_t id, const char *text);

/* Frees what c holds and zeroes it, ready for the next request. */
void golden_capture_free(struct golden_capture *c);

/* Runs req; with cap (not NULL) traced into it, tokens too. Fails the test with
 * mmrt_last_error unless the run succeeds. */
void golden_run(struct mmrt_runtime *rt, const struct mmrt_request *req,
                struct golden_capture *cap, struct mmrt_result *res);

/* ---- reference ---- */

/* max|got − want| / max|want| over n values (max|got − want| when want is all zero); a NaN
 * difference makes the result NaN. */
double golden_rel_err(const float *got, const float *want, int64_t n);

/* Tensor `name` of expected.safetensors as n floats (it must have exactly n elements).
 * free() it. */
float *golden_expected_tensor(struct mmrt_safetensors *st, const char *name, int64_t n);

/* tests/fixtures/<fixture>/expected.json, parsed. json_decref() it. */
json_t *golden_expected_json(const char *fixture);

/* Image paths of one request; golden_case_request points the request into it. */
struct golden_images {
    char path[GOLDEN_MAX_IMAGES][4096];
    struct mmrt_image_input in[GOLDEN_MAX_IMAGES];
};

/* The greedy request of fixture case c (its "prompt", GOLDEN_MAX_STEPS tokens, top_p 1):
 * its "image", or its "images" (1…GOLDEN_MAX_IMAGES), as files. The request points into
 * *images. */
struct mmrt_request golden_case_request(const json_t *c, struct golden_images *images);

/* Every case of a fixture's expected.json as requests (at least two, at most
 * GOLDEN_MAX_CASES; fails the test otherwise). json_decref(c->json) when done. */
#define GOLDEN_MAX_CASES 16
struct golden_cases {
    json_t *json;
    int n;
    struct mmrt_request req[GOLDEN_MAX_CASES];
    struct golden_images images[GOLDEN_MAX_CASES];
};
void golden_cases_load(const char *fixture, struct golden_cases *c);

/* The greedy tokens of case c, as transformers chose them: its "greedy_tokens", up to and
 * including "natural_eos_index" when that is set (the reference ran with EOS stopping off;
 * mmrt stops at the first EOS). fixture and case name the failure. */
void golden_check_tokens(const char *fixture, const char *name, const json_t *c,
                         const int32_t *tokens, int n_tokens);

/* ---- fixtures ---- */

/* Set by a test_cpu_graph: the CPU devices golden_open makes capture the decode step as a
 * graph (graph = 1), and golden_check_fixture requires every request with more than one token
 * to report that its decode ran as one. golden_cpu_graph_off (a cmocka teardown) clears it,
 * also after a failure, so later tests run eagerly. */
extern bool golden_cpu_graph;
int golden_cpu_graph_off(void **state);

/* A runtime for the checkpoint in model_dir: one device "v" (plugin $MMRT_TEST_PLUGIN, which
 * the GPU check script sets, else cpu), or with vision_plugin the vision stage on "v" (that
 * plugin) and the language stage on "l" (cpu); 64 MiB pools. *status and err as
 * mmrt_create's; returns the runtime (NULL on failure). */
struct mmrt_runtime *golden_open(const char *model_dir, const char *vision_plugin, char *err,
                                 size_t err_size, mmrt_status *status);

/* golden_open that fails the test unless the runtime is made. */
struct mmrt_runtime *golden_open_or_fail(const char *model_dir, const char *vision_plugin);

/* The plugin the vision stage runs on under golden_open(…, vision_plugin, …). */
const char *golden_vision_on(const char *vision_plugin);

/* One case of a fixture as golden_check_fixture ran it, for the model's own checks. */
struct golden_case {
    const char *fixture;             /* directory under tests/fixtures, for messages */
    const char *name;                /* the case's "name" */
    const json_t *json;              /* the case's object in expected.json */
    const struct mmrt_request *req;
    const struct mmrt_result *res;
    const struct golden_capture *cap;
};

/* A model's own checks of one case; runs after the request and before the shared ones. */
typedef void (*golden_case_fn)(const struct golden_case *gc);

/* How one model's fixtures are held to the reference. */
struct golden_model {
    /* Reference tensor of the pixels: "<case>.<pixel_tensor>" ("pixel_values", "patches"). */
    const char *pixel_tensor;
    /* (optional) the model's own checks of every case. */
    golden_case_fn check_case;
    /* A vision_plugin that lacks the model's operators skips the fixture (returns false)
     * instead of failing. */
    bool skip_lacking_operators;
};

/* The worst relative errors over a fixture's cases. */
struct golden_summary {
    size_t n_cases;
    double pixels, features, logits;
    const char *vision_on; /* golden_vision_on(vision_plugin) */
};

/* Runs every case of tests/fixtures/<fixture> (golden_open with vision_plugin) and holds it
 * to the reference: model->check_case, then "<case>.<pixel_tensor>" within GOLDEN_PIXEL_TOL,
 * "<case>.image_features" and each step of "<case>.logits_steps" within GOLDEN_REL_TOL, then
 * golden_check_tokens. *summary receives the worst errors. Returns false only when the
 * placement was refused as model->skip_lacking_operators allows (a line says so). */
bool golden_check_fixture(const struct golden_model *model, const char *fixture,
                          const char *vision_plugin, struct golden_summary *summary);

/* The prompt ids the capture holds are case c's "input_ids". */
void golden_check_prompt_ids(const struct golden_case *gc);

/* Whether a runtime with one `plugin` device can be made (the reason is printed when not). */
bool golden_have_plugin(const char *plugin);
/* skip() the current test unless it can. */
void golden_require_plugin(const char *plugin);

/* ---- scratch checkpoints and bad input ---- */

/* The directory golden_scratch_make filled. */
extern char golden_scratch[256];

/* Copies tests/fixtures/<fixture> into a fresh directory under /tmp (golden_scratch). */
void golden_scratch_make(const char *fixture);

/* cmocka teardown: removes golden_scratch. */
int golden_scratch_drop(void **state);

/* Rewrites golden_scratch/<file> with the member at `keys` (a '/'-separated path of object
 * keys) set to value, which it takes (NULL: the member removed). */
void golden_set_json(const char *file, const char *keys, json_t *value);

/* golden_set_json("config.json", keys, value). */
void golden_set_config(const char *keys, json_t *value);

/* ---- editing a checkpoint's model.safetensors in place (broken-file tests) ---- */

/* The parsed header of dir/model.safetensors (the caller json_decref()s it) and, when
 * data_start is not NULL, where its data buffer starts. */
json_t *golden_st_header(const char *dir, uint64_t *data_start);

/* Where tensor `name`'s bytes start in dir/model.safetensors. */
long golden_st_offset(const char *dir, const char *name);

/* Overwrites size bytes of dir/model.safetensors at offset. */
void golden_st_write(const char *dir, long offset, const void *bytes, size_t size);

/* In dir/model.safetensors' header, the first `from` after `anchor` becomes `to`, of the
 * same length (so the file stays valid JSON-wise and every offset stays). */
void golden_st_replace(const char *dir, const char *anchor, const char *from, const char *to);

/* Opening golden_scratch (golden_open, one device) fails with `want`, the message containing
 * `part`. */
void golden_expect_load_error(mmrt_status want, const char *part);

/* Opening golden_scratch succeeds. */
void golden_expect_loads(void);

/* mmrt_run(req) fails with `want`, mmrt_last_error containing `part`. */
void golden_expect_run_error(struct mmrt_runtime *rt, const struct mmrt_request *req,
                             mmrt_status want, const char *part);

/* req with images that cannot be used: golden_scratch/config.json is refused with
 * MMRT_ERR_UNSUPPORTED "unsupported image format", /nonexistent.png with MMRT_ERR_IO. */
void golden_expect_unusable_images(struct mmrt_runtime *rt, const struct mmrt_request *req);

/* Rewrites golden_scratch/config.json in the hub's flat layout: the members of text_config
 * (but its model_type) at the top level and no text_config; then adjust(root, text_config)
 * when not NULL, for what else the model's hub files spell differently. */
void golden_flatten_config(void (*adjust)(json_t *root, const json_t *text));

/* req runs and gives n_tokens, and running it again leaves the device-0 pool as the first
 * run did: nothing leaked into it. */
void golden_expect_pool_steady(struct mmrt_runtime *rt, const struct mmrt_request *req,
                               int n_tokens);

/* Sampling is seeded: req twice gives the same tokens, with seed + 1 different ones. */
void golden_expect_seeded(struct mmrt_runtime *rt, const struct mmrt_request *req);

/* ---- the image-token budget ([model] max_image_tokens, oversize_images) ---- */

/* A runtime for dir on one cpu device with the given budget. */
struct mmrt_runtime *golden_open_budget(const char *dir, int64_t max_image_tokens,
                                        enum mmrt_oversize_images mode);

/* req is refused with MMRT_ERR_LIMIT and exactly `want`, before any preprocessing (no pixels
 * traced). *res receives the request's result. */
void golden_expect_refused(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           const char *want, struct mmrt_result *res);

#endif
