/*
 * tools/plugin_check/contract.h — the device contract of plugin.h, checked once, for every
 * plugin: the memory and ordering rules every operator relies on.
 *
 * These checks drive a plugin directly through struct mmrt_plugin (no pool, no operator
 * front), so they run on any device handle: mmrt-plugin-check runs them on a vendor plugin,
 * and tests/test_opencl_device.c and tests/test_cuda_device.c run the same functions inside
 * cmocka (through tests/device_contract.c). Nothing here uses cmocka or prints.
 *
 * What is checked, one function per rule (see each declaration):
 *   device_info        sane numbers, and a shorter (older) struct_size is honoured
 *   round_trip         upload/download at odd offsets and sizes, nothing outside the range
 *   copy               device-to-device copies between and inside arenas
 *   overlapping_copy   copy() within one arena has memmove semantics, both directions
 *   in_order           upload → copy → upload → copy → download with no synchronize sees
 *                      exactly what was issued before each step; upload may reuse its source
 *   ops_in_order       the same with kernels: upload → op → upload → op → op → download
 *   bounds             out-of-range transfers are MMRT_ERR_INVALID_ARG, device unharmed
 *   refusals           (strict) launches that break the operator contract are refused with
 *                      the core's own message (op_contract.h), device unharmed
 *   alloc_too_large    an absurd arena is MMRT_ERR_OUT_OF_POOL, device still usable after
 *   null_handles       NULL no-ops, last_error never NULL, arenas left at close are freed
 *   graph_replay       (plugins that capture) a recorded upload is replayed with its bytes as
 *                      captured, while an index uploaded before each launch is read fresh
 *                      (SET_ROWS), and a download while capturing makes the capture fail
 * and, without a device, entry_versions (the entry point and host-table versioning).
 *
 * Three levels. By default a check holds the plugin to what plugin.h says. With
 * MMRT_CONTRACT_STRICT it also holds it to the conventions of the in-tree plugins, which
 * plugin.h does not require of a vendor: NULL host pointers and handles that are not arenas
 * refused with MMRT_ERR_INVALID_ARG, outputs untouched on failure,
 * last_error(NULL) answered, device_info refusing a struct_size shorter than its header, and
 * an entry point that refuses a host table of another ABI major (the checker's --strict).
 * MMRT_CONTRACT_WORDING adds what the OpenCL and CUDA plugins chose where plugin.h leaves a
 * choice, which their device tests pin down: the exact phrases of their messages ("offset
 * 99", "101 bytes", "not an arena", the refused arena size) and refusing a zero-byte arena
 * (the CPU plugin hands one out; both are allowed).
 *
 * Every check returns MMRT_OK, or MMRT_ERR_PLUGIN with one line in err naming the call, its
 * arguments and what was wrong ("copy(b+1001 ← a+3, 4097): byte 1004 of b is 0x3a, want
 * 0x91"), or MMRT_ERR_UNSUPPORTED when the check does not apply to this plugin (ops_in_order
 * on a plugin that claims none of the ops it uses; err says why), or MMRT_ERR_NO_MEMORY.
 * Whatever the outcome, the check frees every arena and host buffer it allocated.
 * A check may allocate up to ~30 MiB of device memory in arenas of its own.
 */
#ifndef MMRT_PLUGIN_CHECK_CONTRACT_H
#define MMRT_PLUGIN_CHECK_CONTRACT_H

#include "error.h"
#include "mmrt/plugin.h"

/* Also hold the plugin to the in-tree conventions listed above. */
#define MMRT_CONTRACT_STRICT 1u
/* Also require the OpenCL / CUDA plugins' own choices above (implies nothing else: combine
 * with MMRT_CONTRACT_STRICT). */
#define MMRT_CONTRACT_WORDING 2u

/* The device a check runs on: the plugin's struct as the loader or a test harness sees it,
 * an open device of that plugin, and MMRT_CONTRACT_* flags. */
struct mmrt_contract_target {
    const struct mmrt_plugin *plugin;
    struct mmrt_device *dev;
    unsigned flags;
};

typedef mmrt_status (*mmrt_contract_fn)(const struct mmrt_contract_target *t,
                                        struct mmrt_error *err);

mmrt_status mmrt_contract_device_info(const struct mmrt_contract_target *t,
                                      struct mmrt_error *err);
mmrt_status mmrt_contract_round_trip(const struct mmrt_contract_target *t,
                                     struct mmrt_error *err);
mmrt_status mmrt_contract_copy(const struct mmrt_contract_target *t, struct mmrt_error *err);
mmrt_status mmrt_contract_overlapping_copy(const struct mmrt_contract_target *t,
                                           struct mmrt_error *err);
mmrt_status mmrt_contract_in_order(const struct mmrt_contract_target *t,
                                   struct mmrt_error *err);
/* Uses the first of COPY, SCALE, ADD, MUL the plugin claims (exact on the small integers it
 * feeds them); MMRT_ERR_UNSUPPORTED when it claims none. Launches are checked with
 * mmrt_op_validate first, so they are exactly what the operator front would pass. */
mmrt_status mmrt_contract_ops_in_order(const struct mmrt_contract_target *t,
                                       struct mmrt_error *err);
mmrt_status mmrt_contract_bounds(const struct mmrt_contract_target *t, struct mmrt_error *err);
/* MMRT_ERR_UNSUPPORTED when the plugin has no graph members, lacks SCALE or SET_ROWS, or
 * its capture_begin says MMRT_ERR_UNSUPPORTED (capture switched off by an option). */
mmrt_status mmrt_contract_graph_replay(const struct mmrt_contract_target *t,
                                       struct mmrt_error *err);
/* With MMRT_CONTRACT_STRICT: launches that break plugin.h's operator contract (a dst of
 * another shape, a non-finite or missing param, a refused dtype, a partly overlapping dst, a
 * broadcast of the wrong size) are refused with MMRT_ERR_INVALID_ARG and the very message
 * mmrt_op_validate gives (both come from op_contract.h), leaving the device unharmed.
 * MMRT_ERR_UNSUPPORTED without the flag (plugin.h leaves the checks to the core) or when the
 * plugin claims none of the ops used. */
mmrt_status mmrt_contract_refusals(const struct mmrt_contract_target *t, struct mmrt_error *err);
mmrt_status mmrt_contract_alloc_too_large(const struct mmrt_contract_target *t,
                                          struct mmrt_error *err);
/* Leaves one arena allocated on purpose: device_close must free it (the sanitizer build's
 * leak report is what catches a plugin that does not). Run it last on a handle. */
mmrt_status mmrt_contract_null_handles(const struct mmrt_contract_target *t,
                                       struct mmrt_error *err);

/* Every device check above, in the order to run them (null_handles last). */
struct mmrt_contract_check {
    const char *name;    /* "round_trip" */
    const char *summary; /* one line for reports */
    mmrt_contract_fn run;
};
extern const struct mmrt_contract_check mmrt_contract_checks[];
extern const int mmrt_contract_n_checks;

/* The entry point's side of versioning, no device needed. Calls `entry` (the plugin's
 * MMRT_PLUGIN_ENTRY_NAME) with a host table of a newer minor that appends a member the
 * plugin cannot know: it must return a plugin struct of this ABI major, at least
 * MMRT_PLUGIN_MIN_SIZE bytes, named `name` when name is not NULL, with every required
 * member set. Strict: it must also return NULL for a host of another major, after exactly
 * one log line that mentions "ABI". Plugins keep the host table of their latest init, so the
 * function finally calls entry(restore) — restore must outlive the plugin (a static table).
 * Statuses as for the device checks. */
mmrt_status mmrt_contract_entry_versions(mmrt_plugin_entry_fn entry, const char *name,
                                         const struct mmrt_host *restore, unsigned flags,
                                         struct mmrt_error *err);

#endif
