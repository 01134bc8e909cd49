/* tests/plugin_harness.c — see plugin_harness.h. */
#include "plugin_harness.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void harness_log(void *user, enum mmrt_log_level level, const char *plugin,
                        const char *message)
{
    (void)user;
    if (level >= MMRT_LOG_WARN || getenv("MMRT_TEST_VERBOSE"))
        fprintf(stderr, "[%s] %s\n", plugin, message);
}

static const struct mmrt_host harness_host = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_host),
    .user = NULL,
    .log = harness_log,
};

const char *harness_plugin_path(const char *name)
{
    static char path[4096 + 64];
    const char *dir = getenv("MMRT_PLUGIN_PATH");
    char first[4096] = ".";
    if (dir && *dir) {
        snprintf(first, sizeof first, "%s", dir);
        char *colon = strchr(first, ':');
        if (colon)
            *colon = '\0';
    }
    snprintf(path, sizeof path, "%s/libmmrt_%s.so", first, name);
    return path;
}

mmrt_status harness_open(struct harness *h, const char *path, const struct mmrt_option *opts,
                         int n_opts)
{
    memset(h, 0, sizeof *h);
    h->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h->dl) {
        fprintf(stderr, "harness: %s\n", dlerror());
        return MMRT_ERR_PLUGIN;
    }
    mmrt_plugin_entry_fn entry;
    *(void **)&entry = dlsym(h->dl, MMRT_PLUGIN_ENTRY_NAME);
    if (!entry || !(h->plugin = entry(&harness_host))) {
        fprintf(stderr, "harness: %s: no usable entry point\n", path);
        harness_close(h);
        return MMRT_ERR_PLUGIN;
    }
    mmrt_status st = h->plugin->probe(&h->n_devices, h->why, sizeof h->why);
    if (st != MMRT_OK || h->n_devices == 0) {
        harness_close(h);
        return MMRT_ERR_NO_DEVICE;
    }
    char err[512] = "";
    st = h->plugin->device_open(0, opts, n_opts, &h->dev, err, sizeof err);
    if (st != MMRT_OK) {
        fprintf(stderr, "harness: device_open: %s\n", err);
        harness_close(h);
        return st;
    }
    return MMRT_OK;
}

void harness_close(struct harness *h)
{
    if (h->dev)
        h->plugin->device_close(h->dev);
    if (h->plugin && h->plugin->shutdown)
        h->plugin->shutdown();
    if (h->dl)
        dlclose(h->dl);
    h->dev = NULL;
    h->plugin = NULL;
    h->dl = NULL;
}

mmrt_status harness_tensor_new(struct harness *h, enum mmrt_dtype dtype, int n_dims,
                               const int64_t *ne, struct harness_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->t.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_tensor);
    out->t.dtype = dtype;
    out->t.n_dims = n_dims;
    for (int i = 0; i < MMRT_MAX_DIMS; i++)
        out->t.ne[i] = i < n_dims ? ne[i] : 1;
    uint64_t stride = mmrt_dtype_size(dtype);
    for (int i = MMRT_MAX_DIMS - 1; i >= 0; i--) {
        out->t.nb[i] = (int64_t)stride;
        stride *= (uint64_t)out->t.ne[i];
    }
    out->nbytes = stride;
    /* Never ask for zero bytes: empty tensors still need a valid handle. */
    mmrt_status st = h->plugin->arena_alloc(h->dev, stride ? stride : 1, &out->t.buffer);
    if (st != MMRT_OK)
        fprintf(stderr, "harness: arena_alloc(%llu): %s\n", (unsigned long long)stride,
                h->plugin->last_error(h->dev));
    return st;
}

void harness_tensor_free(struct harness *h, struct harness_tensor *t)
{
    if (t->t.buffer)
        h->plugin->arena_free(h->dev, t->t.buffer);
    t->t.buffer = NULL;
}

mmrt_status harness_upload(struct harness *h, struct harness_tensor *t, const void *src)
{
    return h->plugin->upload(h->dev, t->t.buffer, t->t.offset, src, t->nbytes);
}

mmrt_status harness_download(struct harness *h, struct harness_tensor *t, void *dst)
{
    return h->plugin->download(h->dev, dst, t->t.buffer, t->t.offset, t->nbytes);
}

mmrt_status harness_run(struct harness *h, enum mmrt_op op, struct harness_tensor *const *src,
                        int n_src, struct harness_tensor *dst, const void *params,
                        uint32_t params_size)
{
    if ((uint32_t)op >= h->plugin->n_ops || !h->plugin->ops[op])
        return MMRT_ERR_UNSUPPORTED;
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
        .op = op,
        .n_src = n_src,
        .dst = &dst->t,
        .params = params,
        .params_size = params_size,
    };
    for (int i = 0; i < n_src && i < MMRT_MAX_SRC_ALL; i++) {
        const struct mmrt_tensor *t = src[i] ? &src[i]->t : NULL;
        if (i < MMRT_MAX_SRC)
            args.src[i] = t;
        else
            args.src_ext[i - MMRT_MAX_SRC] = t;
    }
    mmrt_status st = h->plugin->ops[op](h->dev, &args);
    if (st != MMRT_OK)
        fprintf(stderr, "harness: op %d: %s\n", (int)op, h->plugin->last_error(h->dev));
    return st;
}

