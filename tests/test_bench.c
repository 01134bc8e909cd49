/*
 * tests/test_bench.c — mmrt-bench as CI runs it: the tiny shape end to end with --json into a
 * fresh cache folder, checking that the record has every field (and that a second run reuses
 * the cached checkpoint), plus the exit statuses of a shape this build cannot run and of bad
 * options. Timings are never asserted: they depend on the machine and its neighbours.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

static char out[1 << 20], err_text[1 << 16];
static char cache_dir[256];

/* Runs bin/mmrt-bench with args (NULL-terminated); stdout into out, stderr into err_text.
 * Returns the exit status. */
static int run_bench(const char *const *args)
{
    char exe[4096];
    snprintf(exe, sizeof exe, "%s/bin/mmrt-bench", getenv("MMRT_BUILD_DIR"));
    char out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/stdout", cache_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", cache_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr))
            _exit(126);
        const char *argv[32] = { exe };
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    FILE *f = fopen(out_path, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    f = fopen(err_path, "r");
    n = f ? fread(err_text, 1, sizeof err_text - 1, f) : 0;
    err_text[n] = '\0';
    if (f)
        fclose(f);
    return WEXITSTATUS(status);
}

static const char *const tiny_args[] = {
    "--shape", "tiny", "--repeat", "1", "--gen-tokens", "4", "--prompt-tokens", "5",
    "--probe-mb", "16", "--json", "--quiet", "--cache", cache_dir, NULL,
};

static void need(const json_t *obj, const char *key, const char *where)
{
    if (!json_object_get(obj, key))
        fail_msg("JSON %s has no \"%s\"", where, key);
}

static void test_tiny_json_has_every_field(void **state)
{
    (void)state;
    int rc = run_bench(tiny_args);
    if (rc != 0)
        fail_msg("mmrt-bench exited %d: %s", rc, err_text);
    json_error_t je;
    json_t *rec = json_loads(out, 0, &je);
    if (!rec)
        fail_msg("not JSON (%s): %.200s", je.text, out);
    static const char *const top[] = {
        "tool", "version", "date", "machine", "command", "shape", "hf_id", "model_type",
        "vision_layers", "text_layers", "dtype", "image_size", "prompt_tokens", "gen_tokens",
        "batch", "repeat", "warmup", "checkpoint", "image", "prompt", "n_prompt_tokens",
        "n_tokens", "load_ms", "cpu_share", "limits", "work", "stages", "devices", "runs",
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        need(rec, top[i], "record");
    json_t *m = json_object_get(rec, "machine");
    need(m, "cpu", "machine");
    need(m, "cores", "machine");
    need(m, "threads", "machine");
    static const char *const lim[] = { "read_gbs", "f32_gflops", "bf16_gflops", "probe_isa",
                                       "probe_samples", "read_gbs_low", "f32_gflops_low",
                                       "bf16_gflops_low" };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        need(json_object_get(rec, "limits"), lim[i], "limits");
    static const char *const work[] = { "vision_gflop", "prefill_gflop",
                                        "decode_bytes_per_token", "decode_weight_bytes",
                                        "n_image_tokens" };
    for (size_t i = 0; i < sizeof work / sizeof work[0]; i++)
        need(json_object_get(rec, "work"), work[i], "work");
    static const char *const stages[] = { "preprocess_ms", "vision_ms", "prefill_ms", "ttft_ms",
                                          "decode_ms_per_token", "decode_tokens_per_s" };
    json_t *st = json_object_get(rec, "stages");
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        need(st, stages[i], "stages");
        json_t *f = json_object_get(st, stages[i]);
        static const char *const fig[] = { "value", "limit", "ratio", "basis" };
        for (size_t k = 0; k < sizeof fig / sizeof fig[0]; k++)
            need(f, fig[k], stages[i]);
        assert_true(json_is_number(json_object_get(f, "value")));
    }
    /* On the default placement (cpu) every stage but preprocessing has a limit. */
    assert_true(json_is_number(json_object_get(json_object_get(st, "vision_ms"), "limit")));
    assert_true(json_is_number(json_object_get(json_object_get(st, "decode_ms_per_token"),
                                               "ratio")));
    json_t *devs = json_object_get(rec, "devices");
    assert_true(json_array_size(devs) >= 1);
    static const char *const dev[] = { "name", "plugin", "device_name", "stages",
                                       "pool_capacity_bytes", "pool_weights_bytes",
                                       "pool_peak_bytes", "pool_peak_activation_bytes" };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        need(json_array_get(devs, 0), dev[i], "devices[0]");
    json_t *runs = json_object_get(rec, "runs");
    assert_int_equal(json_array_size(runs), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(runs, 0), "n_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(rec, "n_tokens")), 4);
    assert_string_equal(json_string_value(json_object_get(rec, "shape")), "tiny");
    json_decref(rec);

    /* A second run finds the cached checkpoint (the first one's files are left untouched). */
    char cfg[400];
    struct stat before, after;
    snprintf(cfg, sizeof cfg, "%s/tiny-Lall-f16/model.safetensors", cache_dir);
    assert_int_equal(stat(cfg, &before), 0);
    rc = run_bench(tiny_args);
    assert_int_equal(rc, 0);
    assert_int_equal(stat(cfg, &after), 0);
    assert_true(before.st_mtim.tv_sec == after.st_mtim.tv_sec &&
                before.st_mtim.tv_nsec == after.st_mtim.tv_nsec);
}

static void test_unrunnable_shape_and_bad_options(void **state)
{
    (void)state;
    int rc = run_bench((const char *[]){ "--shape", "qwen2-vl-7b", "--cache", cache_dir, NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "qwen2_vl"));
    assert_non_null(strstr(err_text, "not implement"));
    rc = run_bench((const char *[]){ "--shape", "fuyu-8b", "--cache", cache_dir, NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "fuyu"));
    rc = run_bench((const char *[]){ "--shape", "gpt-9", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "llava-1.5-7b"));
    rc = run_bench((const char *[]){ "--dtype", "f8", NULL });
    assert_int_equal(rc, 2);
    rc = run_bench((const char *[]){ "--gen-tokens", "0", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "--gen-tokens"));
}

static int setup(void **state)
{
    (void)state;
    snprintf(cache_dir, sizeof cache_dir, "/tmp/mmrt-test-bench-XXXXXX");
    return mkdtemp(cache_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_json_has_every_field),
        cmocka_unit_test(test_unrunnable_shape_and_bad_options),
    };
    return cmocka_run_group_tests_name("bench", tests, setup, teardown);
}
