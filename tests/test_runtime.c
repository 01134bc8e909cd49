/*
 * tests/test_runtime.c — mmrt.h end to end without hardware: deploy.ini → plugins → devices
 * → pools, with the recording stub plugin. Every configuration error must come back as
 * FILE:LINE with the status the CLI maps to exit code 2.
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

#include "mmrt/mmrt.h"
#include "mmrt/plugin.h"

/* What the loader says it speaks, whatever this header's minor is. */
#define ABI_STR_(x) #x
#define ABI_STR(x) ABI_STR_(x)
#define HOST_ABI "ABI " ABI_STR(MMRT_ABI_MAJOR) "." ABI_STR(MMRT_ABI_MINOR)

static char tmpdir[256];
static char ini[512];

static void quiet(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)level;
    (void)who;
    (void)msg;
}

static int setup(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test-plugins", getenv("MMRT_BUILD_DIR"));
    setenv("MMRT_PLUGIN_PATH", dir, 1);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mmrt_rt_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(ini, sizeof ini, "%s/deploy.ini", tmpdir);
    mmrt_set_log_sink(quiet, NULL, MMRT_LOG_DEBUG);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Creates from `text`; returns the status and leaves the message in err. */
static mmrt_status create_from(const char *text, char *err, size_t size,
                               struct mmrt_runtime **rt)
{
    write_file(ini, text);
    *rt = NULL;
    return mmrt_create_from_file(ini, rt, err, size);
}

static void expect_error(const char *text, mmrt_status want, int line, const char *msg_part)
{
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    assert_int_equal(create_from(text, err, sizeof err, &rt), want);
    assert_null(rt);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s:%d: ", ini, line);
    if (strncmp(err, prefix, strlen(prefix)) != 0)
        fail_msg("expected prefix '%s' in '%s'", prefix, err);
    if (!strstr(err, msg_part))
        fail_msg("expected '%s' in '%s'", msg_part, err);
}

static void test_good_config(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    mmrt_status st = create_from("[device.a]\nplugin = stub\npool_mb = 2\nmode = x\n"
                                 "[device.b]\nplugin = stub\nindex = 1\npool_mb = 3\n"
                                 "[stage.vision]\ndevice = b\n[stage.language]\ndevice = a\n",
                                 err, sizeof err, &rt);
    if (st != MMRT_OK)
        fail_msg("%s", err);
    assert_int_equal(mmrt_device_count(rt), 2);
    struct mmrt_device_desc d;
    assert_int_equal(mmrt_device_describe(rt, 1, &d), MMRT_OK);
    assert_string_equal(d.name, "b");
    assert_string_equal(d.plugin, "stub");
    assert_int_equal(d.index, 1);
    assert_string_equal(d.device_name, "Stub device 1");
    assert_int_equal(d.pool_bytes, 3u << 20);
    assert_string_equal(mmrt_device_plugin_version(rt, 1), "stub-1");
    assert_null(mmrt_device_plugin_version(rt, 2));
    assert_null(mmrt_device_plugin_version(rt, -1));
    assert_null(mmrt_device_plugin_version(NULL, 0));
    struct mmrt_pool_report pr;
    assert_int_equal(mmrt_device_pool_stats(rt, 0, &pr), MMRT_OK);
    assert_int_equal(pr.capacity_bytes, 2u << 20);
    assert_int_equal(pr.bytes_in_use, 0);
    assert_int_equal(pr.largest_free_block, 2u << 20);
    assert_true(pr.fragmentation == 0.0);
    assert_int_equal(mmrt_device_pool_stats(rt, 5, &pr), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "device index 5 out of range"));

    struct mmrt_request req = { .prompt = "hi", .max_tokens = 4, .top_p = 1 };
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_ERR_CONFIG);
    assert_non_null(strstr(mmrt_last_error(rt), "no [model] configured"));
    mmrt_destroy(rt);
}

/* mmrt_run_defaults writes as much of the request as the caller's struct holds: [run]'s
 * values, and never a byte past a first-layout struct. */
static void test_run_defaults(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    mmrt_status st = create_from("[device.a]\nplugin = stub\npool_mb = 2\n[run]\n"
                                 "max_tokens = 7\ntop_p = 0.5\nfrequency_penalty = 1.5\n",
                                 err, sizeof err, &rt);
    if (st != MMRT_OK)
        fail_msg("%s", err);
    struct mmrt_request full = { .struct_size = sizeof full };
    mmrt_run_defaults(rt, &full);
    assert_int_equal(full.struct_size, sizeof full);
    assert_int_equal(full.max_tokens, 7);
    assert_true(full.top_p == 0.5f && full.frequency_penalty == 1.5f);
    /* A first-layout caller: struct_size 0, the struct ending after top_p. */
    const size_t v1 = offsetof(struct mmrt_request, top_p) + sizeof(float);
    unsigned char buf[sizeof(struct mmrt_request)];
    memset(buf, 0xA5, sizeof buf);
    memset(buf, 0, sizeof(uint32_t)); /* struct_size 0 */
    mmrt_run_defaults(rt, (struct mmrt_request *)(void *)buf);
    for (size_t i = v1; i < sizeof buf; i++)
        if (buf[i] != 0xA5)
            fail_msg("byte %zu past the first layout (%zu bytes) was written", i, v1);
    struct mmrt_request got;
    memcpy(&got, buf, v1);
    assert_int_equal(got.struct_size, 0);
    assert_int_equal(got.max_tokens, 7);
    assert_true(got.top_p == 0.5f);
    mmrt_destroy(rt);
}

static void test_unknown_plugin_key(void **state)
{
    (void)state;
    expect_error("[device.a]\nplugin = stub\n\ncolour = red\n", MMRT_ERR_CONFIG, 4,
                 "[device.a]: unknown key 'colour' (plugin stub knows: plugin, index, pool_mb, "
                 "level1, mode, fail)");
}

static void test_plugin_refused(void **state)
{
    (void)state;
    expect_error("[device.a]\npool_mb = 1\nplugin = badmajor\n", MMRT_ERR_PLUGIN, 3,
                 "plugin ABI 2.0, this mmrt speaks " HOST_ABI " (the major versions must match)");
    expect_error("[device.a]\nplugin = nosuchplugin\n", MMRT_ERR_NOT_FOUND, 2,
                 "libmmrt_nosuchplugin.so not found");
    expect_error("[device.a]\nplugin = nullmember\n", MMRT_ERR_PLUGIN, 2,
                 "required member 'download' is NULL");
}

static void test_device_problems(void **state)
{
    (void)state;
    expect_error("[device.a]\nplugin = nodevice\n", MMRT_ERR_NO_DEVICE, 1,
                 "plugin stub has no device: no stub device (test variant)");
    expect_error("\n[device.zz]\nplugin = stub\nindex = 7\n", MMRT_ERR_NO_DEVICE, 2,
                 "index 7 out of range, plugin stub has 2 devices");
    expect_error("[device.a]\nplugin = stub\nfail = 1\n", MMRT_ERR_CONFIG, 1,
                 "option fail = 1: refused as asked");
    /* A pool beyond the device's memory is refused at start with both figures. */
    expect_error("[device.a]\nplugin = stub\npool_mb = 16777216\n", MMRT_ERR_CONFIG, 3,
                 "pool_mb 16777216 is more than the 64 MiB of memory Stub device 0 has");
}

static void test_conf_errors_pass_through(void **state)
{
    (void)state;
    expect_error("[device.a]\nplugin = stub\n[devices]\n", MMRT_ERR_CONFIG, 3, "devices");
    expect_error("[device.a]\nplugin = stub\n[stage.vision]\ndevice = nope\n", MMRT_ERR_CONFIG,
                 4, "nope");
    expect_error("[model]\npath = m\nmax_image_tokens = -5\n[device.a]\nplugin = stub\n",
                 MMRT_ERR_CONFIG, 3, "max_image_tokens = '-5': outside [0, 2147483647]");
    expect_error("[model]\npath = m\noversize_images = crop\n[device.a]\nplugin = stub\n",
                 MMRT_ERR_CONFIG, 3, "oversize_images = 'crop': expected 'refuse' or 'downscale'");
}

static void test_model_type_refused(void **state)
{
    (void)state;
    char model[600], cfg[700];
    snprintf(model, sizeof model, "%s/model", tmpdir);
    assert_int_equal(mkdir(model, 0700), 0);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    write_file(cfg, "{\"model_type\": \"no_such_model\"}");
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    assert_int_equal(create_from("[model]\npath = model\n[device.a]\nplugin = stub\npool_mb = 2\n", err,
                                 sizeof err, &rt),
                     MMRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "model_type 'no_such_model' is not supported"));
    write_file(cfg, "{\"model_type\": \"a\", \"model_type\": \"b\"}");
    assert_int_equal(create_from("[model]\npath = model\n[device.a]\nplugin = stub\npool_mb = 2\n", err,
                                 sizeof err, &rt),
                     MMRT_ERR_FORMAT);
    assert_non_null(strstr(err, "config.json"));
}

static void test_struct_config(void **state)
{
    (void)state;
    struct mmrt_device_config devs[2] = {
        { .name = "a", .plugin = "stub", .index = 0, .pool_mb = 1 },
        { .name = "a", .plugin = "stub", .index = 1, .pool_mb = 1 },
    };
    struct mmrt_config cfg = { .devices = devs, .n_devices = 2 };
    struct mmrt_runtime *rt = NULL;
    char err[1024];
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: device 'a' is defined twice");
    devs[1].name = "b";
    cfg.vision_device = "c";
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [stage.vision]: device 'c' is not defined");
    cfg.vision_device = "b";
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_OK);
    assert_int_equal(mmrt_device_count(rt), 2);
    mmrt_destroy(rt);
    cfg.n_devices = 0;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    /* The image-token budget: checked before any device is opened. */
    cfg.n_devices = 2;
    cfg.max_image_tokens = -1;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [model] max_image_tokens -1 must be at least 0 "
                             "(0 = no limit beyond the model's context)");
    cfg.max_image_tokens = 100;
    cfg.oversize_images = (enum mmrt_oversize_images)7;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [model] oversize_images 7 is neither "
                             "MMRT_OVERSIZE_REFUSE nor MMRT_OVERSIZE_DOWNSCALE");
    cfg.oversize_images = MMRT_OVERSIZE_DOWNSCALE;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_OK);
    mmrt_destroy(rt);
}

struct listing {
    char text[8192];
    size_t len;
};

static void collect(void *user, const struct mmrt_plugin_report *p,
                    const struct mmrt_device_desc *d)
{
    struct listing *l = user;
    int n = d ? snprintf(l->text + l->len, sizeof l->text - l->len, "  %s:%d %s\n", d->plugin,
                         d->index, d->device_name)
              : snprintf(l->text + l->len, sizeof l->text - l->len, "%s n=%d skip=%s err=%s\n",
                         p->name, p->n_devices, p->skip_reason ? p->skip_reason : "-",
                         p->error ? p->error : "-");
    if (n > 0 && l->len + (size_t)n < sizeof l->text)
        l->len += (size_t)n;
}

static void test_list_devices(void **state)
{
    (void)state;
    struct listing l = { .len = 0 };
    char err[256];
    assert_int_equal(mmrt_list_devices(collect, &l, err, sizeof err), MMRT_OK);
    assert_non_null(strstr(l.text, "stub n=2 skip=- err=-\n  stub:0 Stub device 0\n"
                                   "  stub:1 Stub device 1\n"));
    assert_non_null(strstr(l.text, "nodevice n=0 skip=no stub device (test variant) err=-"));
    assert_non_null(strstr(l.text, "plugin ABI 2.0, this mmrt speaks " HOST_ABI));
    assert_non_null(strstr(l.text, "noentry n=0 skip=- err="));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_good_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_plugin_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_problems, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conf_errors_pass_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_type_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_struct_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_devices, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
