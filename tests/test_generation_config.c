/*
 * tests/test_generation_config.c — the sampling defaults of generation_config.json
 * (core/generation_config.c, mmrt_generation_defaults): what each key means, transformers'
 * do_sample rules, bad values refused by key, and the runtime handing them out.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generation_config.h"
#include "golden.h"

static void write_config(const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/generation_config.json", golden_scratch);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static struct mmrt_generation_defaults read_ok(const char *text)
{
    write_config(text);
    struct mmrt_generation_defaults d;
    memset(&d, 0xA5, sizeof d);
    struct mmrt_error e = { 0 };
    if (mmrt_generation_config_read(golden_scratch, &d, &e) != MMRT_OK)
        fail_msg("%s: %s", text, e.msg);
    return d;
}

static void read_refused(const char *text, const char *part)
{
    write_config(text);
    struct mmrt_generation_defaults d = { 0 };
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_generation_config_read(golden_scratch, &d, &e), MMRT_ERR_FORMAT);
    if (!strstr(e.msg, "generation_config.json") || !strstr(e.msg, part))
        fail_msg("%s: expected a message with the file and '%s', got: %s", text, part, e.msg);
}

static int make_scratch(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny");
    return 0;
}

static void test_keys_and_do_sample(void **state)
{
    (void)state;
    /* The fixture's own file: ids only, so nothing to default. */
    struct mmrt_error e = { 0 };
    struct mmrt_generation_defaults d;
    assert_int_equal(mmrt_generation_config_read(golden_scratch, &d, &e), MMRT_OK);
    assert_true(!d.has_temperature && !d.has_top_k && !d.has_top_p &&
                !d.has_repetition_penalty);
    assert_int_equal(d.struct_size, sizeof d);

    /* Qwen2-VL-7B-Instruct's file as published. */
    d = read_ok("{\"bos_token_id\": 151643, \"pad_token_id\": 151643, \"do_sample\": true, "
                "\"eos_token_id\": [151645, 151643], \"repetition_penalty\": 1.05, "
                "\"temperature\": 0.1, \"top_k\": 1, \"top_p\": 0.001, "
                "\"transformers_version\": \"4.45.0.dev0\"}");
    assert_true(d.has_temperature && d.temperature == 0.1f);
    assert_true(d.has_top_k && d.top_k == 1);
    assert_true(d.has_top_p && d.top_p == 0.001f);
    assert_true(d.has_repetition_penalty && d.repetition_penalty == 1.05f);

    /* do_sample true alone: GenerationConfig's defaults for what it turns on. */
    d = read_ok("{\"do_sample\": true}");
    assert_true(d.has_temperature && d.temperature == 1.0f && d.has_top_k && d.top_k == 50 &&
                d.has_top_p && d.top_p == 1.0f && !d.has_repetition_penalty);
    /* do_sample false: greedy whatever the temperature says; the penalty still applies. */
    d = read_ok("{\"do_sample\": false, \"temperature\": 0.7, \"repetition_penalty\": 1.2}");
    assert_true(d.has_temperature && d.temperature == 0.0f);
    assert_true(d.has_repetition_penalty && d.repetition_penalty == 1.2f);
    /* Without do_sample only the keys present; nulls are absent; integers beyond 64 bits
     * elsewhere in the file do not matter; top_p 0 keeps the most likely token only. */
    d = read_ok("{\"temperature\": 0.6, \"top_p\": 0, \"top_k\": null, "
                "\"max_length\": 1000000000000000019884624838656}");
    assert_true(d.has_temperature && d.temperature == 0.6f);
    assert_true(d.has_top_p && d.top_p == FLT_MIN);
    assert_true(!d.has_top_k && !d.has_repetition_penalty);
}

static void test_bad_values(void **state)
{
    (void)state;
    read_refused("{\"temperature\": -0.5}", "\"temperature\" must be a number in [0, 100]");
    read_refused("{\"temperature\": \"0.7\"}", "\"temperature\"");
    read_refused("{\"top_p\": 1.5}", "\"top_p\"");
    read_refused("{\"top_k\": -1}", "\"top_k\"");
    read_refused("{\"top_k\": 2.5}", "\"top_k\" must be a whole number");
    read_refused("{\"repetition_penalty\": 0}", "\"repetition_penalty\" must be greater");
    read_refused("{\"repetition_penalty\": 1e9}", "\"repetition_penalty\"");
    read_refused("{\"do_sample\": \"yes\"}", "\"do_sample\" must be true or false");
    read_refused("[1, 2]", "not an object");
    read_refused("{\"temperature\": 0.5", "invalid JSON");
}

/* The runtime reads the file before loading the model and hands it out; a bad one fails the
 * load naming the key. */
static void test_runtime(void **state)
{
    (void)state;
    write_config("{\"do_sample\": true, \"temperature\": 0.25, \"top_k\": 7}");
    char err[2048] = "";
    mmrt_status st;
    struct mmrt_runtime *rt = golden_open(golden_scratch, NULL, err, sizeof err, &st);
    if (st != MMRT_OK)
        fail_msg("%s", err);
    struct mmrt_generation_defaults d = { .struct_size = sizeof d };
    mmrt_generation_defaults(rt, &d);
    assert_true(d.has_temperature && d.temperature == 0.25f && d.has_top_k && d.top_k == 7 &&
                d.has_top_p && d.top_p == 1.0f && !d.has_repetition_penalty);
    assert_int_equal(d.struct_size, sizeof d);
    /* A caller's shorter struct is written no further than its struct_size. */
    unsigned char buf[sizeof d];
    memset(buf, 0xA5, sizeof buf);
    const uint32_t short_size = offsetof(struct mmrt_generation_defaults, has_top_k);
    memcpy(buf, &short_size, sizeof short_size);
    mmrt_generation_defaults(rt, (struct mmrt_generation_defaults *)(void *)buf);
    for (size_t i = short_size; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xA5);
    mmrt_destroy(rt);
    mmrt_generation_defaults(NULL, &d);
    assert_true(!d.has_temperature && !d.has_top_k);

    write_config("{\"top_p\": 2}");
    golden_expect_load_error(MMRT_ERR_FORMAT, "generation_config.json: \"top_p\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keys_and_do_sample, make_scratch,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_bad_values, make_scratch, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_runtime, make_scratch, golden_scratch_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
