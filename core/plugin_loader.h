/*
 * core/plugin_loader.h — finds, loads, version-checks and shares device plugins.
 *
 * The loader is the only code that knows about ABI versions. It dlopen()s a plugin, calls its
 * entry with the host table, refuses anything it cannot trust (other ABI major, a struct
 * shorter than the oldest supported layout, a missing entry symbol, a NULL required member),
 * and keeps a zero-extended copy of the plugin struct so every other module reads it as the
 * current ABI: a member an older plugin lacks is simply NULL.
 *
 * Loaded plugins live in the process-wide registry (the one global mmrt has): a plugin file
 * is opened once and reference-counted, because several devices and several runtimes may
 * use it, and its entry point must be called once. The registry is thread-safe.
 *
 * Search order for a plugin named NAME (file libmmrt_NAME.so):
 *   1. every directory of $MMRT_PLUGIN_PATH (colon-separated), in order;
 *   2. the directory of the running executable;
 *   3. the install directory (MMRT_PLUGIN_INSTALL_DIR, e.g. /usr/local/lib/mmrt).
 */
#ifndef MMRT_CORE_PLUGIN_LOADER_H
#define MMRT_CORE_PLUGIN_LOADER_H

#include "error.h"
#include "mmrt/plugin.h"

#define MMRT_PLUGIN_NAME_MAX 32

struct mmrt_loaded_plugin {
    char *path;                 /* file it came from */
    void *dl;                   /* dlopen handle */
    struct mmrt_plugin api;     /* zero-extended copy of the plugin's struct */
    mmrt_kernel_fn ops[MMRT_OP_COUNT]; /* zero-extended copy of its op table */
    int n_devices;              /* from probe; 0 means skipped */
    char skip_reason[256];      /* probe's reason when n_devices == 0 */
    int refcount;               /* registry-owned */
};

/* Loads plugin `name` ([a-z0-9_], at most MMRT_PLUGIN_NAME_MAX chars) by the search order
 * above, or returns the already loaded one with its count raised. A plugin that loads but
 * finds no device is returned with n_devices == 0 and skip_reason set — that is not an
 * error here; the caller decides (listing skips it, opening a device refuses).
 * Statuses: MMRT_ERR_NOT_FOUND (no file; the message lists the directories searched),
 * MMRT_ERR_PLUGIN (refused; the message names the file and the version or member),
 * MMRT_ERR_NO_MEMORY, MMRT_ERR_INVALID_ARG (bad name). Release with mmrt_plugin_release. */
mmrt_status mmrt_plugin_load(const char *name, struct mmrt_loaded_plugin **out,
                             struct mmrt_error *err);

/* Same, for an explicit file path (used by mmrt-plugin-check and tests). */
mmrt_status mmrt_plugin_load_file(const char *path, struct mmrt_loaded_plugin **out,
                                  struct mmrt_error *err);

/* Takes one more reference on an already loaded plugin. */
void mmrt_plugin_retain(struct mmrt_loaded_plugin *plugin);

/* Drops one reference; the last one calls the plugin's shutdown and dlclose()s it. NULL ok. */
void mmrt_plugin_release(struct mmrt_loaded_plugin *plugin);

/* Calls fn for every libmmrt_*.so in the search directories (first occurrence of each name
 * wins, as for loading), with the plugin name and full path. Stops early when fn returns
 * non-zero. Returns MMRT_OK or MMRT_ERR_NO_MEMORY. */
mmrt_status mmrt_plugin_foreach_file(int (*fn)(void *user, const char *name, const char *path),
                                     void *user, struct mmrt_error *err);

/* The op's name as written in plugin.h ("MATMUL"); "?" when unknown. */
const char *mmrt_op_name(enum mmrt_op op);

#endif
