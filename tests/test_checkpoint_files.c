/*
 * tests/test_checkpoint_files.c — a whole checkpoint as the runtime opens it, with one file
 * made hostile at a time: every file each model type reads (config.json, tokenizer.json,
 * the processor config, generation_config.json, model.safetensors) replaced by a FIFO with
 * no writer, a config.json whose top level is not an object, and eos_token_id values that
 * do not fit 32 bits or are negative in generation_config.json (config.json: beyond its
 * range, or below -1, its "none").
 *
 * Each case runs on a fresh copy of a tiny fixture (golden_scratch_make), so one case cannot
 * hide another. An alarm turns a reader that blocks on a FIFO into a failed test, not a hung
 * one; nothing here measures time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "golden.h"

struct fixture {
    const char *name;
    const char *processor;  /* the processor config file it ships */
    const char *eos_key;    /* where config.json keeps the text model's eos_token_id */
};

static const struct fixture fixtures[] = {
    { "llava-tiny", "processor_config.json", "text_config/eos_token_id" },
    { "fuyu-tiny", "preprocessor_config.json", "text_config/eos_token_id" },
    { "qwen2vl-tiny", "processor_config.json", "text_config/eos_token_id" },
};

static void replace_with_fifo(const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", golden_scratch, file);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
}

static void write_scratch(const char *file, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", golden_scratch, file);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_fifos_are_named(void **state)
{
    (void)state;
    const char *files[] = { "config.json", "tokenizer.json", NULL, "generation_config.json",
                            "model.safetensors" };
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        files[2] = fixtures[f].processor;
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            golden_scratch_make(fixtures[f].name);
            replace_with_fifo(files[i]);
            char want[600];
            snprintf(want, sizeof want, "%s/%s: not a regular file (it is a FIFO)",
                     golden_scratch, files[i]);
            golden_expect_load_error(MMRT_ERR_IO, want);
            golden_scratch_drop(NULL);
        }
    }
}

/* pool_mb = auto sizes the pools from config.json and the processor config before any
 * model code runs: those readers too must name a FIFO instead of waiting on it. */
static void test_fifos_with_auto_pool(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        golden_scratch_make(fixtures[f].name);
        replace_with_fifo(fixtures[f].processor);
        struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 0 };
        struct mmrt_config cfg = { .model_path = golden_scratch, .devices = &dev,
                                   .n_devices = 1 };
        struct mmrt_runtime *rt = NULL;
        char err[2048] = "", want[600];
        mmrt_status st = mmrt_create(&cfg, &rt, err, sizeof err);
        mmrt_destroy(rt);
        snprintf(want, sizeof want, "%s/%s: not a regular file (it is a FIFO)", golden_scratch,
                 fixtures[f].processor);
        if (st != MMRT_ERR_IO || !strstr(err, want))
            fail_msg("%s: got %d: %s", fixtures[f].name, st, err);
        golden_scratch_drop(NULL);
    }
}

static void test_config_not_an_object(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        golden_scratch_make(fixtures[f].name);
        write_scratch("config.json", "[{\"model_type\": \"llava\"}]");
        golden_expect_load_error(MMRT_ERR_FORMAT, "config.json: the top level is an array, "
                                                  "not an object");
        golden_scratch_drop(NULL);
        /* generation_config.json too, on a fresh copy. */
        golden_scratch_make(fixtures[f].name);
        write_scratch("generation_config.json", "[2]");
        golden_expect_load_error(MMRT_ERR_FORMAT, "generation_config.json: the top level is "
                                                  "an array, not an object");
        golden_scratch_drop(NULL);
    }
}

/* 4294967298 = 2^32 + 2 used to load as eos 2; now refused naming file and key. */
static void test_eos_not_wrapped(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        golden_scratch_make(fixtures[f].name);
        golden_set_json("generation_config.json", "eos_token_id", json_integer(4294967298ll));
        golden_expect_load_error(MMRT_ERR_FORMAT, "generation_config.json: \"eos_token_id\" = "
                                                  "4294967298 is outside");
        golden_set_json("generation_config.json", "eos_token_id", json_integer(-1));
        golden_expect_load_error(MMRT_ERR_FORMAT, "generation_config.json: \"eos_token_id\" = "
                                                  "-1 is outside");
        golden_set_json("generation_config.json", "eos_token_id",
                        json_pack("[iI]", 2, (json_int_t)4294967298ll));
        golden_expect_load_error(MMRT_ERR_FORMAT, "generation_config.json: \"eos_token_id\"[1] "
                                                  "= 4294967298 is outside");
        golden_set_json("generation_config.json", "eos_token_id", json_pack("[is]", 2, "3"));
        golden_expect_load_error(MMRT_ERR_FORMAT, "\"eos_token_id\"[1] is a string");
        golden_set_json("generation_config.json", "eos_token_id", NULL);

        golden_set_config(fixtures[f].eos_key, json_integer(4294967298ll));
        golden_expect_load_error(MMRT_ERR_FORMAT, "\"eos_token_id\" = 4294967298 is outside");
        /* config.json keeps -1 as "no eos" (mmrt-bench writes it so runs never stop
         * early); anything below is refused. */
        golden_set_config(fixtures[f].eos_key, json_integer(-2));
        golden_expect_load_error(MMRT_ERR_FORMAT, "\"eos_token_id\" = -2 is outside");
        golden_set_config(fixtures[f].eos_key, json_integer(-1));
        golden_expect_loads();
        golden_scratch_drop(NULL);
    }
}

static int arm_alarm(void **state)
{
    (void)state;
    alarm(300); /* a blocked reader fails the run instead of hanging it */
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifos_are_named),
        cmocka_unit_test(test_fifos_with_auto_pool),
        cmocka_unit_test(test_config_not_an_object),
        cmocka_unit_test(test_eos_not_wrapped),
    };
    return cmocka_run_group_tests(tests, arm_alarm, NULL);
}
