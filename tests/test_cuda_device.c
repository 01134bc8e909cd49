/*
 * tests/test_cuda_device.c — libmmrt_cuda.so through the plugin harness: the shared device
 * contract (tools/plugin_check/contract.h, the checks mmrt-plugin-check runs, here at the
 * strictest level through device_contract.h) on CUDA device 0, plus probe and option
 * handling (the one option, gemm_precision). The operators are tested in test_cuda_ops.c.
 * Without a GPU or driver the plugin must still load and say why; the device tests then
 * skip and the run exits 77, which ctest shows as "Skipped" (the reason is printed as
 * "SKIPPED: …").
 */
#include "device_contract.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

static int setup(void **state) { return contract_setup(state, "cuda"); }

static void test_entry_versions(void **state)
{
    (void)state;
    contract_entry_versions("cuda");
}

/* Runs with or without a GPU: either devices, or a reason quoting the CUDA runtime. */
static void test_probe(void **state)
{
    struct contract *c = *state;
    int n = -1;
    char why[256] = "stale";
    assert_int_equal(c->h.plugin->probe(&n, why, sizeof why), MMRT_OK);
    assert_int_equal(n, c->h.n_devices);
    if (n == 0) {
        printf("probe: %s\n", why);
        assert_true(strncmp(why, "no CUDA device (", 16) == 0);
        assert_true(strlen(why) > 17 && why[strlen(why) - 1] == ')');
    } else {
        assert_string_equal(why, "");
    }
    /* One option: gemm_precision (high | fast). */
    const char *const *keys = c->h.plugin->option_keys;
    assert_non_null(keys);
    assert_string_equal(keys[0], "gemm_precision");
    assert_null(keys[1]);
}

static void test_option_errors(void **state)
{
    struct contract *c = *state;
    char err[512];
    struct mmrt_device *dev = NULL;
    struct mmrt_option opt = {"platform", "x"};
    assert_int_equal(c->h.plugin->device_open(0, &opt, 1, &dev, err, sizeof err),
                     MMRT_ERR_CONFIG);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "'platform'"));

    /* A known key with a bad value is refused before any device is touched. */
    struct mmrt_option bad = {"gemm_precision", "turbo"};
    assert_int_equal(c->h.plugin->device_open(0, &bad, 1, &dev, err, sizeof err),
                     MMRT_ERR_CONFIG);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    assert_non_null(strstr(err, "'turbo'"));

    assert_int_equal(c->h.plugin->device_open(-1, NULL, 0, &dev, err, sizeof err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "-1"));

    /* One past the last device (device 0 when there is none). */
    assert_int_equal(c->h.plugin->device_open(c->h.n_devices, NULL, 0, &dev, err, sizeof err),
                     MMRT_ERR_NO_DEVICE);
    assert_null(dev);
    printf("refused as expected: %s\n", err);
    if (c->h.n_devices > 0) {
        char want[64];
        snprintf(want, sizeof want, "index %d out of range: %d device(s)", c->h.n_devices,
                 c->h.n_devices);
        assert_non_null(strstr(err, want));
    } else {
        assert_non_null(strstr(err, "no CUDA device ("));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_versions),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_option_errors),
        CONTRACT_TESTS,
    };
    return contract_exit_code(cmocka_run_group_tests(tests, setup, contract_teardown));
}
