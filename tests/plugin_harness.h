/*
 * tests/plugin_harness.h — drives one plugin directly through plugin.h, with no core
 * runtime in between: dlopen a plugin file, open a device, give every tensor its own arena,
 * upload, launch an op, download. Used by the per-plugin operator and device tests, so a
 * plugin can be tested before (and independently of) the loader, pool and scheduler.
 */
#ifndef MMRT_TEST_PLUGIN_HARNESS_H
#define MMRT_TEST_PLUGIN_HARNESS_H

#include "mmrt/plugin.h"

struct harness {
    void *dl;
    const struct mmrt_plugin *plugin;
    struct mmrt_device *dev;
    int n_devices;
    char why[256]; /* probe's reason when n_devices == 0 */
};

/* A tensor with its own arena (contiguous unless the test rewrites nb). */
struct harness_tensor {
    struct mmrt_tensor t;
    uint64_t nbytes;
};

/* Path of libmmrt_<name>.so in $MMRT_PLUGIN_PATH (first entry) or ./; static buffer. */
const char *harness_plugin_path(const char *name);

/* Opens the plugin file and device 0 with the given options. Returns MMRT_OK, or
 * MMRT_ERR_NO_DEVICE with h->why set when the plugin found no device (the test skips), or
 * another status with a message printed to stderr. */
mmrt_status harness_open(struct harness *h, const char *path, const struct mmrt_option *opts,
                         int n_opts);
void harness_close(struct harness *h);

/* Allocates a contiguous tensor of `dtype` with the given shape (outermost first). */
mmrt_status harness_tensor_new(struct harness *h, enum mmrt_dtype dtype, int n_dims,
                               const int64_t *ne, struct harness_tensor *out);
void harness_tensor_free(struct harness *h, struct harness_tensor *t);

/* Upload / download the whole tensor (host data in the tensor's dtype, contiguous). */
mmrt_status harness_upload(struct harness *h, struct harness_tensor *t, const void *src);
mmrt_status harness_download(struct harness *h, struct harness_tensor *t, void *dst);

/* Launches `op` with up to MMRT_MAX_SRC_ALL sources (NULL for absent ones). */
mmrt_status harness_run(struct harness *h, enum mmrt_op op, struct harness_tensor *const *src,
                        int n_src, struct harness_tensor *dst, const void *params,
                        uint32_t params_size);

/* F16 / BF16 inputs and references: plugin.h's mmrt_f32_to_f16 and the rest. */

#endif
