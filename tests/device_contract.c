/*
 * tests/device_contract.c — see device_contract.h. The checks themselves live in
 * tools/plugin_check/contract.c; this file only opens the device and maps their outcome onto
 * cmocka (MMRT_OK passes, MMRT_ERR_UNSUPPORTED skips, anything else fails with the message).
 */
#include "device_contract.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

static bool contract_skipped;

static void contract_log(void *user, enum mmrt_log_level level, const char *plugin,
                         const char *message)
{
    (void)user;
    if (level >= MMRT_LOG_WARN || getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "[%s] %s\n", plugin, message);
}

static const struct mmrt_host contract_host = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_host),
    .user = NULL,
    .log = contract_log,
};

static int contract_load(struct harness *h, const char *plugin)
{
    h->dl = dlopen(harness_plugin_path(plugin), RTLD_NOW | RTLD_LOCAL);
    if (!h->dl) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return -1;
    }
    mmrt_plugin_entry_fn entry;
    *(void **)&entry = dlsym(h->dl, MMRT_PLUGIN_ENTRY_NAME);
    h->plugin = entry ? entry(&contract_host) : NULL;
    if (!h->plugin) {
        harness_close(h);
        return -1;
    }
    return 0;
}

int contract_setup(void **state, const char *plugin)
{
    struct contract *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    mmrt_status st = harness_open(&c->h, harness_plugin_path(plugin), NULL, 0);
    if (st == MMRT_ERR_NO_DEVICE) {
        printf("SKIPPED: %s\n", c->h.why[0] ? c->h.why : "no device");
        contract_skipped = true;
        /* harness_open unloaded the plugin; keep it loaded so that probe and the option
         * checks that need no device still run. */
        if (contract_load(&c->h, plugin) != 0) {
            free(c);
            return -1;
        }
    } else if (st != MMRT_OK) {
        free(c);
        return -1;
    } else {
        c->have_device = true;
        c->info.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_device_info);
        if (c->h.plugin->device_info(c->h.dev, &c->info) != MMRT_OK) {
            harness_close(&c->h);
            free(c);
            return -1;
        }
        printf("device: %s (%s), %" PRIu64 " bytes, largest arena %" PRIu64 "\n",
               c->info.name, c->info.kind, c->info.total_bytes, c->info.max_arena_bytes);
    }
    *state = c;
    return 0;
}

int contract_teardown(void **state)
{
    struct contract *c = *state;
    if (c) {
        harness_close(&c->h);
        free(c);
    }
    return 0;
}

struct harness *contract_harness(void **state)
{
    struct contract *c = *state;
    if (!c->have_device)
        skip();
    return &c->h;
}

int contract_exit_code(int failures)
{
    return failures == 0 && contract_skipped ? CONTRACT_SKIP_CODE : failures;
}

static void run_check(void **state, mmrt_contract_fn fn)
{
    struct harness *h = contract_harness(state);
    struct mmrt_contract_target t = {h->plugin, h->dev,
                                     MMRT_CONTRACT_STRICT | MMRT_CONTRACT_WORDING};
    struct mmrt_error err;
    mmrt_error_clear(&err);
    mmrt_status st = fn(&t, &err);
    if (st == MMRT_ERR_UNSUPPORTED) {
        printf("not applicable: %s\n", err.msg);
        skip();
    }
    if (st != MMRT_OK)
        fail_msg("%s: %s", mmrt_status_name(st), err.msg);
}

#define CONTRACT_BODY(name)                                                                    \
    void contract_##name(void **state)                                                         \
    {                                                                                          \
        run_check(state, mmrt_contract_##name);                                                \
    }

CONTRACT_BODY(device_info)
CONTRACT_BODY(round_trip)
CONTRACT_BODY(copy)
CONTRACT_BODY(overlapping_copy)
CONTRACT_BODY(in_order)
CONTRACT_BODY(ops_in_order)
CONTRACT_BODY(bounds)
CONTRACT_BODY(refusals)
CONTRACT_BODY(alloc_too_large)
CONTRACT_BODY(null_handles)

void contract_entry_versions(const char *plugin)
{
    void *dl = dlopen(harness_plugin_path(plugin), RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        fail_msg("dlopen: %s", dlerror());
    mmrt_plugin_entry_fn entry;
    *(void **)&entry = dlsym(dl, MMRT_PLUGIN_ENTRY_NAME);
    assert_non_null(entry);
    struct mmrt_error err;
    mmrt_error_clear(&err);
    /* Hands the plugin back a sink that prints, for the tests that follow. */
    mmrt_status st = mmrt_contract_entry_versions(entry, plugin, &contract_host,
                                                  MMRT_CONTRACT_STRICT, &err);
    dlclose(dl);
    if (st != MMRT_OK)
        fail_msg("%s: %s", mmrt_status_name(st), err.msg);
}
