/*
 * tests/test_opencl_device.c — libmmrt_opencl.so through the plugin harness: the shared
 * device contract (tools/plugin_check/contract.h, the checks mmrt-plugin-check runs, here at
 * the strictest level through device_contract.h) on OpenCL device 0 (PoCL on the CPU here),
 * plus what only this plugin has: the `platform` option, device numbering and their error
 * messages. A machine with no OpenCL platform at all skips (exit 77); one with a platform
 * must work.
 */
#include "device_contract.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static int setup(void **state) { return contract_setup(state, "opencl"); }

static void test_entry_versions(void **state)
{
    (void)state;
    contract_entry_versions("opencl");
}

static void test_probe(void **state)
{
    struct contract *c = *state;
    if (!c->have_device) {
        if (strstr(c->h.why, "no OpenCL platform"))
            skip();
        fail_msg("an OpenCL platform exists but probe found no device: %s", c->h.why);
    }
    int n = -1;
    char why[128] = "stale";
    assert_int_equal(c->h.plugin->probe(&n, why, sizeof why), MMRT_OK);
    assert_int_equal(n, c->h.n_devices);
    assert_true(n >= 1);
    assert_string_equal(why, "");
    const char *const *keys = c->h.plugin->option_keys;
    assert_non_null(keys);
    assert_string_equal(keys[0], "platform");
    assert_null(keys[1]);
}

/* The platform part of device_info's "DEVICE (PLATFORM)" name. */
static void platform_of(const struct contract *c, char *out, size_t size)
{
    const char *open = strrchr(c->info.name, '(');
    const char *close = strrchr(c->info.name, ')');
    assert_true(open && close && close > open + 1);
    snprintf(out, size, "%.*s", (int)(close - open - 1), open + 1);
}

static mmrt_status open_with(struct contract *c, int index, const char *key, const char *value,
                             struct mmrt_device **dev, char *err, size_t err_size)
{
    struct mmrt_option opt = {key, value};
    *dev = NULL;
    err[0] = '\0';
    return c->h.plugin->device_open(index, &opt, 1, dev, err, err_size);
}

static void test_platform_option(void **state)
{
    contract_harness(state);
    struct contract *c = *state;
    char pname[128], want[16], err[512];
    platform_of(c, pname, sizeof pname);
    /* A piece from inside the name, in the opposite case: matching ignores case. */
    size_t len = strlen(pname), from = len > 2 ? 1 : 0, n = len - from < 8 ? len - from : 8;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)pname[from + i];
        want[i] = (char)(isupper(ch) ? tolower(ch) : toupper(ch));
    }
    want[n] = '\0';

    struct mmrt_device *dev;
    mmrt_status st = open_with(c, 0, "platform", want, &dev, err, sizeof err);
    if (st != MMRT_OK)
        fail_msg("platform=%s: %s", want, err);
    /* A second device handle on the same hardware is independent of the first. */
    struct mmrt_device_info info;
    memset(&info, 0, sizeof info);
    info.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_device_info);
    assert_int_equal(c->h.plugin->device_info(dev, &info), MMRT_OK);
    assert_string_equal(info.name, c->info.name);
    void *arena = NULL;
    unsigned char out[5] = "abcd", back[5] = {0};
    assert_int_equal(c->h.plugin->arena_alloc(dev, sizeof out, &arena), MMRT_OK);
    assert_int_equal(c->h.plugin->upload(dev, arena, 0, out, sizeof out), MMRT_OK);
    assert_int_equal(c->h.plugin->download(dev, back, arena, 0, sizeof back), MMRT_OK);
    assert_memory_equal(out, back, sizeof out);
    c->h.plugin->arena_free(dev, arena);
    c->h.plugin->device_close(dev);

    /* Out of range within the platform: the message names the index, platform and count. */
    int index = 99;
    st = open_with(c, index, "platform", want, &dev, err, sizeof err);
    assert_int_equal(st, MMRT_ERR_NO_DEVICE);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "index 99"));
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, "device(s)"));
}

static void test_platform_no_match(void **state)
{
    contract_harness(state);
    struct contract *c = *state;
    char pname[128], err[512];
    platform_of(c, pname, sizeof pname);
    struct mmrt_device *dev;
    mmrt_status st = open_with(c, 0, "platform", "no-such-platform-xyz", &dev, err, sizeof err);
    assert_int_equal(st, MMRT_ERR_NO_DEVICE);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "'no-such-platform-xyz'"));
    assert_non_null(strstr(err, "found:"));
    assert_non_null(strstr(err, pname));
}

static void test_index_out_of_range(void **state)
{
    contract_harness(state);
    struct contract *c = *state;
    char err[512], want[64];
    struct mmrt_device *dev = NULL;
    mmrt_status st = c->h.plugin->device_open(c->h.n_devices, NULL, 0, &dev, err, sizeof err);
    assert_int_equal(st, MMRT_ERR_NO_DEVICE);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    snprintf(want, sizeof want, "index %d", c->h.n_devices);
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof want, "%d device(s)", c->h.n_devices);
    assert_non_null(strstr(err, want));

    st = c->h.plugin->device_open(-1, NULL, 0, &dev, err, sizeof err);
    assert_int_equal(st, MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "-1"));
}

/* Option errors are found before any driver call, so these run without a device too. */
static void test_option_errors(void **state)
{
    struct contract *c = *state;
    char err[512];
    struct mmrt_device *dev;
    assert_int_equal(open_with(c, 0, "device", "0", &dev, err, sizeof err), MMRT_ERR_CONFIG);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "'device'"));
    assert_non_null(strstr(err, "platform"));

    assert_int_equal(open_with(c, 0, "platform", "", &dev, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "needs a value"));

    struct mmrt_option twice[2] = {{"platform", "a"}, {"platform", "b"}};
    assert_int_equal(c->h.plugin->device_open(0, twice, 2, &dev, err, sizeof err),
                     MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "twice"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_versions),
        cmocka_unit_test(test_probe),
        CONTRACT_TESTS,
        cmocka_unit_test(test_platform_option),
        cmocka_unit_test(test_platform_no_match),
        cmocka_unit_test(test_index_out_of_range),
        cmocka_unit_test(test_option_errors),
    };
    return contract_exit_code(cmocka_run_group_tests(tests, setup, contract_teardown));
}
