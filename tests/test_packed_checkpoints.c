/*
 * tests/test_packed_checkpoints.c — AWQ, GPTQ and compressed-tensors checkpoints loaded as
 * published.
 *
 * tests/fixtures/packed-awq, packed-gptq and packed-ct are the demo model with its language
 * model's 28 linear layers quantized once (groups of 64) and packed in AWQ's GEMM layout, in
 * GPTQ's (zero points minus one, g_idx) and in compressed-tensors' pack-quantized, written by
 * tools/make_packed_fixtures.py, which checks the AWQ and compressed-tensors packings against
 * the libraries' own unpacking; packed-dequant is the same model with
 * those weights dequantized to f32 by the script. mmrt repacks both into its U4 layout at
 * load, so all three must give the same answers: every logit of every step within 1e-5
 * (relative to the step's largest) and the same tokens, on the CPU plugin and with the
 * language stage on OpenCL. Then the configurations and tensors mmrt cannot run are refused
 * by key and value or by tensor name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "golden.h"
#include "model.h"
#include "mmrt/mmrt.h"
#include "request_util.h"

#define N_ITEMS 12
#define MAX_STEPS 24

/* Every step's logits and the tokens of one greedy answer. */
struct answer {
    float *logits; /* [MAX_STEPS][vocab] */
    int64_t vocab;
    int n_steps;
    struct tokens t;
};

static void on_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct answer *a = user;
    if (step >= MAX_STEPS)
        return;
    if (!a->logits) {
        a->vocab = vocab;
        a->logits = calloc((size_t)(MAX_STEPS * vocab), sizeof *a->logits);
        assert_non_null(a->logits);
    }
    assert_int_equal(vocab, a->vocab);
    memcpy(a->logits + step * vocab, logits, (size_t)vocab * sizeof *logits);
    a->n_steps = step + 1 > a->n_steps ? step + 1 : a->n_steps;
}

static struct mmrt_runtime *open_fixture(const char *fixture, const char *language_plugin)
{
    char dir[4096], err[2048] = "";
    golden_fixture_path(dir, sizeof dir, fixture);
    struct mmrt_device_config devs[2] = {
        { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 },
        { .name = "lang", .plugin = language_plugin, .pool_mb = 64 },
    };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = devs,
                               .n_devices = language_plugin ? 2 : 1,
                               .language_device = language_plugin ? "lang" : NULL };
    struct mmrt_runtime *rt = NULL;
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", fixture, err);
    return rt;
}

static void answer(struct mmrt_runtime *rt, int item, struct answer *a)
{
    char img[4200];
    snprintf(img, sizeof img, "%s/demo/heldout/%03d.png", golden_src_dir(), item);
    static const char *const prompts[] = { "Describe the picture.", "How many shapes are there?",
                                           "Which shape is red?" };
    struct mmrt_request req = { .struct_size = sizeof req, .prompt = prompts[item % 3],
                                .images = TEST_FILE(img), .n_images = 1,
                                .max_tokens = MAX_STEPS, .top_p = 1.0f };
    memset(a, 0, sizeof *a);
    const struct mmrt_model_trace trace = { .user = a, .logits = on_logits };
    struct mmrt_result res = { .struct_size = sizeof res };
    if (mmrt_run_traced(rt, &req, &trace, test_collect, &a->t, &res) != MMRT_OK)
        fail_msg("item %d: %s", item, res.error);
}

/* A packed checkpoint on `language_plugin` against the dequantized one on the CPU plugin. */
static void packed_against_dequantized(const char *fixture, const char *language_plugin)
{
    struct mmrt_runtime *awq = open_fixture(fixture, language_plugin);
    struct mmrt_runtime *ref = open_fixture("packed-dequant", NULL);
    double worst = 0;
    for (int i = 0; i < N_ITEMS; i++) {
        struct answer a, b;
        answer(awq, i, &a);
        answer(ref, i, &b);
        assert_int_equal(a.t.n, b.t.n);
        assert_memory_equal(a.t.ids, b.t.ids, (size_t)a.t.n * sizeof a.t.ids[0]);
        assert_int_equal(a.n_steps, b.n_steps);
        for (int s = 0; s < a.n_steps; s++) {
            const double e = golden_rel_err(a.logits + s * a.vocab, b.logits + s * b.vocab,
                                            a.vocab);
            worst = e > worst ? e : worst;
        }
        free(a.logits);
        free(b.logits);
    }
    print_message("%s (language on %s) against the dequantized weights: worst logit rel %.2g "
                  "over %d items\n", fixture, language_plugin ? language_plugin : "cpu", worst,
                  N_ITEMS);
    assert_true(worst <= 1e-5);
    /* the codes are repacked copies, not the file's int32 words */
    struct mmrt_memory_report m = { .struct_size = sizeof m };
    assert_int_equal(mmrt_device_memory(awq, language_plugin ? 1 : 0, &m), MMRT_OK);
    assert_true(m.weight_copied_bytes > 0);
    mmrt_destroy(ref);
    mmrt_destroy(awq);
}

static void test_cpu(void **state)
{
    (void)state;
    packed_against_dequantized("packed-awq", NULL);
    packed_against_dequantized("packed-gptq", NULL);
    packed_against_dequantized("packed-ct", NULL);
}

static void test_language_on_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    packed_against_dequantized("packed-awq", "opencl");
    packed_against_dequantized("packed-gptq", "opencl");
    packed_against_dequantized("packed-ct", "opencl");
}

/* What mmrt cannot run is refused before anything is loaded, by key and value. */
static void test_config_refused(void **state)
{
    (void)state;
    static const struct {
        const char *key;
        mmrt_status st;
        const char *part;
    } cases[] = {
        { "bits", MMRT_ERR_UNSUPPORTED, "quantization_config.bits 8 is not one mmrt runs" },
        { "version", MMRT_ERR_UNSUPPORTED,
          "quantization_config.version \"gemv\" is not one mmrt runs (expected \"gemm\")" },
        { "zero_point", MMRT_ERR_UNSUPPORTED,
          "quantization_config.zero_point false is not one mmrt runs" },
        { "group_size", MMRT_ERR_UNSUPPORTED,
          "quantization_config.group_size 48 is not one mmrt runs" },
    };
    golden_scratch_make("packed-awq");
    golden_set_config("quantization_config", json_string("awq"));
    golden_expect_load_error(MMRT_ERR_FORMAT, "quantization_config is a string, not an "
                                              "object");
    golden_scratch_drop(NULL);
    json_t *values[4] = { json_integer(8), json_string("gemv"), json_false(), json_integer(48) };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        golden_scratch_make("packed-awq");
        char key[64];
        snprintf(key, sizeof key, "quantization_config/%s", cases[i].key);
        golden_set_config(key, values[i]);
        golden_expect_load_error(cases[i].st, cases[i].part);
        golden_scratch_drop(NULL);
    }
}

/* Tensors that do not fit the configuration: a group size the scales do not have (named by
 * tensor), a missing zero-point tensor. */
static void test_tensors_refused_by_name(void **state)
{
    (void)state;
    golden_scratch_make("packed-awq");
    golden_set_config("quantization_config/group_size", json_integer(32));
    golden_expect_load_error(MMRT_ERR_FORMAT, ".qzeros' must be I32 [4, 16]");
    golden_scratch_drop(NULL);
    /* the fixture's first layer's gate projection without its qzeros: renamed in the header */
    golden_scratch_make("packed-awq");
    golden_st_replace(golden_scratch, "layers.0.mlp.gate_proj.qzeros", "qzeros", "qzeroX");
    golden_expect_load_error(MMRT_ERR_FORMAT, "has no 'language_model.layers.0.mlp.gate_proj."
                                              "qzeros' (an AWQ matrix is its .qweight, .qzeros "
                                              "and .scales)");
    golden_scratch_drop(NULL);
}

/* GPTQ: another width or checkpoint format refused by key and value; a g_idx that reorders
 * the inputs (act-order) refused by tensor name, input and group; one group per row (-1)
 * read as such (so the fixture's 64-input groups no longer fit its scales, named). */
static void test_gptq_refused(void **state)
{
    (void)state;
    golden_scratch_make("packed-gptq");
    golden_set_config("quantization_config/bits", json_integer(3));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "quantization_config.bits 3 is not one mmrt "
                                                   "runs (expected 4)");
    golden_scratch_drop(NULL);
    golden_scratch_make("packed-gptq");
    golden_set_config("quantization_config/checkpoint_format", json_string("marlin"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "quantization_config.checkpoint_format "
                                                   "\"marlin\" is not one mmrt runs");
    golden_scratch_drop(NULL);
    golden_scratch_make("packed-gptq");
    golden_set_config("quantization_config/group_size", json_integer(-1));
    golden_expect_load_error(MMRT_ERR_FORMAT, ".qzeros' must be I32 [1, 16]");
    golden_scratch_drop(NULL);
    /* act-order: input 0 of the first layer's gate projection moved to group 1 */
    golden_scratch_make("packed-gptq");
    const int32_t one = 1;
    golden_st_write(golden_scratch,
                    golden_st_offset(golden_scratch,
                                     "language_model.model.layers.0.mlp.gate_proj.g_idx"),
                    &one, sizeof one);
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "gate_proj.g_idx' puts input 0 in group 1, "
                                                   "not 0: act-order GPTQ");
    golden_scratch_drop(NULL);
}

/* compressed-tensors: another width, format or activation quantization refused by key and
 * value; a weight_shape that disagrees with config.json by tensor name. */
static void test_compressed_tensors_refused(void **state)
{
    (void)state;
    static const struct {
        const char *key;
        const char *text;
        long long number;
        const char *part;
    } cases[] = {
        { "config_groups/group_0/weights/num_bits", NULL, 8,
          "quantization_config.config_groups.group_0.weights.num_bits 8 is not one mmrt runs" },
        { "format", "float-quantized", 0,
          "quantization_config.format \"float-quantized\" is not one mmrt runs" },
        { "config_groups/group_0/input_activations", "x", 0,
          "input_activations: activations quantized too are not one mmrt runs" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        golden_scratch_make("packed-ct");
        char key[160];
        snprintf(key, sizeof key, "quantization_config/%s", cases[i].key);
        golden_set_config(key, cases[i].text ? json_string(cases[i].text)
                                             : json_integer(cases[i].number));
        golden_expect_load_error(MMRT_ERR_UNSUPPORTED, cases[i].part);
        golden_scratch_drop(NULL);
    }
    golden_scratch_make("packed-ct");
    const int64_t wrong = 385;
    golden_st_write(golden_scratch,
                    golden_st_offset(golden_scratch,
                                     "language_model.model.layers.0.mlp.gate_proj.weight_shape"),
                    &wrong, sizeof wrong);
    golden_expect_load_error(MMRT_ERR_FORMAT, "gate_proj.weight_shape' must be the integers "
                                              "[384, 128]");
    golden_scratch_drop(NULL);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_language_on_opencl),
        cmocka_unit_test(test_config_refused),
        cmocka_unit_test(test_tensors_refused_by_name),
        cmocka_unit_test(test_gptq_refused),
        cmocka_unit_test(test_compressed_tensors_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
