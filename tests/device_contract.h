/*
 * tests/device_contract.h — the device contract (tools/plugin_check/contract.h, the same
 * checks mmrt-plugin-check runs on vendor plugins) as cmocka test bodies, run against every
 * plugin that drives real hardware (OpenCL, CUDA) at the strictest level: besides what
 * plugin.h requires, our own plugins keep the in-tree conventions (NULL pointers and foreign
 * handles refused, an entry point that refuses another ABI major) and word their messages
 * the same way ("offset 99", "not an arena").
 *
 * Use: the test file's group setup calls contract_setup(state, "opencl"); every test body
 * takes the same state. When the plugin finds no device, each contract test calls cmocka's
 * skip() and contract_exit_code() turns the run into exit status 77, which the test's
 * SKIP_RETURN_CODE makes ctest report as "Skipped" rather than "Passed". A check that does not
 * apply to the plugin (ops_in_order before the plugin claims any operator) is skipped too.
 */
#ifndef MMRT_TEST_DEVICE_CONTRACT_H
#define MMRT_TEST_DEVICE_CONTRACT_H

#include "plugin_harness.h"

#include <stdbool.h>

#define CONTRACT_SKIP_CODE 77

struct contract {
    struct harness h;
    bool have_device;
    struct mmrt_device_info info; /* of device 0, when have_device */
};

/* Group setup / teardown. contract_setup opens libmmrt_<plugin>.so and its device 0; finding
 * no device is not a failure (the reason is printed as "SKIPPED: …" and stays in h.why), and
 * the plugin stays loaded (h.plugin set, h.dev NULL) for checks that need no device. */
int contract_setup(void **state, const char *plugin);
int contract_teardown(void **state);

/* The open device, or skip() the calling test when there is none. */
struct harness *contract_harness(void **state);

/* What main returns: cmocka's failure count, or CONTRACT_SKIP_CODE when nothing failed and
 * the device tests were skipped. */
int contract_exit_code(int failures);

/* Test bodies; each runs the mmrt_contract_<name> check of the same name, strictest level. */
void contract_device_info(void **state);
void contract_round_trip(void **state);
void contract_copy(void **state);
void contract_overlapping_copy(void **state);
void contract_in_order(void **state);
void contract_ops_in_order(void **state);
void contract_bounds(void **state);
void contract_refusals(void **state);
void contract_alloc_too_large(void **state);
void contract_null_handles(void **state);

/* Runs even without a device: mmrt_contract_entry_versions, strict (the entry point refuses
 * a host of another ABI major and accepts a newer, longer host table). */
void contract_entry_versions(const char *plugin);

#define CONTRACT_TESTS                                   \
    cmocka_unit_test(contract_device_info),              \
        cmocka_unit_test(contract_round_trip),           \
        cmocka_unit_test(contract_copy),                 \
        cmocka_unit_test(contract_overlapping_copy),     \
        cmocka_unit_test(contract_in_order),             \
        cmocka_unit_test(contract_ops_in_order),         \
        cmocka_unit_test(contract_bounds),               \
        cmocka_unit_test(contract_refusals),             \
        cmocka_unit_test(contract_alloc_too_large),      \
        cmocka_unit_test(contract_null_handles)

#endif
