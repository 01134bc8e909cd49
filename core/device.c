/*
 * core/device.c — opening a device through its plugin and giving it a pool.
 *
 * The pool asks for arenas through two small adapters that call the plugin's
 * arena_alloc/arena_free, so pool.c never knows what a plugin is.
 */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static mmrt_status dev_arena_alloc(void *user, uint64_t nbytes, void **arena,
                                   struct mmrt_error *err)
{
    struct mmrt_dev *dev = user;
    mmrt_status st = dev->api->arena_alloc(dev->handle, nbytes, arena);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: cannot allocate an arena of %llu bytes: %s",
                              dev->name, (unsigned long long)nbytes,
                              dev->api->last_error(dev->handle));
    return MMRT_OK;
}

static void dev_arena_free(void *user, void *arena)
{
    struct mmrt_dev *dev = user;
    dev->api->arena_free(dev->handle, arena);
}

mmrt_status mmrt_dev_open_plugin(const char *name, struct mmrt_loaded_plugin *plugin, int index,
                                 uint64_t pool_bytes, enum mmrt_pool_level1 level1,
                                 const struct mmrt_option *options, int n_options,
                                 struct mmrt_dev **out, struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    if (plugin->n_devices == 0)
        return mmrt_error_set(err, MMRT_ERR_NO_DEVICE, "device %s: plugin %s has no device: %s",
                              name, plugin->api.name, plugin->skip_reason);
    if (index < 0 || index >= plugin->n_devices)
        return mmrt_error_set(err, MMRT_ERR_NO_DEVICE,
                              "device %s: index %d out of range, plugin %s has %d device%s",
                              name, index, plugin->api.name, plugin->n_devices,
                              plugin->n_devices == 1 ? "" : "s");
    struct mmrt_dev *dev = calloc(1, sizeof *dev);
    if (!dev)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "device %s: out of memory", name);
    snprintf(dev->name, sizeof dev->name, "%s", name);
    dev->index = index;
    dev->plugin = plugin;
    dev->api = &plugin->api;
    mmrt_plugin_retain(plugin); /* released by mmrt_dev_close */

    char msg[512] = "";
    st = dev->api->device_open(index, options, n_options, &dev->handle, msg, sizeof msg);
    if (st != MMRT_OK) {
        msg[sizeof msg - 1] = '\0';
        mmrt_error_set(err, st, "device %s (plugin %s, index %d): %s", name, dev->api->name,
                       index, msg[0] ? msg : mmrt_status_message(st));
        goto fail;
    }
    dev->info.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_device_info);
    st = dev->api->device_info(dev->handle, &dev->info);
    if (st != MMRT_OK) {
        mmrt_error_set(err, st, "device %s: device_info failed: %s", name,
                       dev->api->last_error(dev->handle));
        goto fail;
    }
    dev->info.name[sizeof dev->info.name - 1] = '\0';
    dev->info.kind[sizeof dev->info.kind - 1] = '\0';
    if (dev->api->prepare && (st = dev->api->prepare(dev->handle)) != MMRT_OK) {
        mmrt_error_set(err, st, "device %s (plugin %s): %s", name, dev->api->name,
                       dev->api->last_error(dev->handle));
        goto fail;
    }

    /* The pool is reserved up front (pool.h), so one larger than the device can only fail
     * later, or on the CPU succeed as virtual memory and then be killed: say so now. */
    if (dev->info.total_bytes && pool_bytes > dev->info.total_bytes) {
        st = mmrt_error_set(err, MMRT_ERR_OUT_OF_POOL,
                            "device %s: pool_mb %llu is more than the %llu MiB of memory %s has",
                            name, (unsigned long long)(pool_bytes >> 20),
                            (unsigned long long)(dev->info.total_bytes >> 20), dev->info.name);
        goto fail;
    }
    struct mmrt_pool_config pcfg = {
        .capacity_bytes = pool_bytes,
        .max_arena_bytes = dev->info.max_arena_bytes,
        .min_block_bytes = dev->info.alignment > 256 ? dev->info.alignment : 256,
        .level1 = level1,
    };
    /* min_block must be a power of two: round a strange alignment up. */
    uint64_t mb = 256;
    while (mb < pcfg.min_block_bytes)
        mb <<= 1;
    pcfg.min_block_bytes = mb;
    struct mmrt_pool_arena_ops ops = { .user = dev, .alloc = dev_arena_alloc,
                                       .free = dev_arena_free };
    st = mmrt_pool_create(&pcfg, &ops, &dev->pool, err);
    if (st != MMRT_OK) {
        mmrt_error_prefix(err, st, "device %s: reserving a pool of %llu MiB", name,
                          (unsigned long long)(pool_bytes >> 20));
        goto fail;
    }
    mmrt_log(MMRT_LOG_INFO, "core", "device %s: %s (%s), pool %llu MiB%s", name, dev->info.name,
             dev->api->name, (unsigned long long)(pool_bytes >> 20),
             level1 == MMRT_POOL_LEVEL1_OFF ? " (level 1 off)" : "");
    *out = dev;
    return MMRT_OK;

fail:
    mmrt_dev_close(dev);
    return st;
}

mmrt_status mmrt_dev_open(const char *name, const char *plugin_name, int index,
                          uint64_t pool_bytes, const struct mmrt_option *options, int n_options,
                          struct mmrt_dev **out, struct mmrt_error *err)
{
    struct mmrt_loaded_plugin *plugin = NULL;
    mmrt_status st = mmrt_plugin_load(plugin_name, &plugin, err);
    if (st != MMRT_OK)
        return st;
    st = mmrt_dev_open_plugin(name, plugin, index, pool_bytes, MMRT_POOL_LEVEL1_DEFAULT, options,
                              n_options, out, err);
    mmrt_plugin_release(plugin); /* the device holds its own reference */
    return st;
}

void mmrt_dev_close(struct mmrt_dev *dev)
{
    if (!dev)
        return;
    mmrt_pool_destroy(dev->pool);
    if (dev->handle)
        dev->api->device_close(dev->handle);
    mmrt_plugin_release(dev->plugin);
    free(dev);
}

mmrt_status mmrt_dev_weight_arena_alloc(struct mmrt_dev *dev, uint64_t nbytes, void **arena,
                                        struct mmrt_error *err)
{
    void *a = NULL;
    mmrt_status st = dev->api->arena_alloc(dev->handle, nbytes, &a);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: cannot allocate %llu bytes for weights: %s",
                              dev->name, (unsigned long long)nbytes,
                              dev->api->last_error(dev->handle));
    if (!a)
        return mmrt_error_set(err, MMRT_ERR_DEVICE, "device %s: plugin %s gave no arena for "
                              "%llu bytes of weights", dev->name, dev->api->name,
                              (unsigned long long)nbytes);
    dev->weights.reserved_bytes += nbytes;
    dev->weights.n_arenas++;
    *arena = a;
    return MMRT_OK;
}

bool mmrt_dev_can_adopt(const struct mmrt_dev *dev)
{
    /* the loader zero-extends a plugin struct older than ABI 1.2 */
    return dev->api->arena_adopt_host != NULL;
}

mmrt_status mmrt_dev_adopt_host(struct mmrt_dev *dev, const void *host, uint64_t nbytes,
                                void **arena, struct mmrt_error *err)
{
    if (!mmrt_dev_can_adopt(dev))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s (plugin %s) cannot adopt host memory", dev->name,
                              dev->api->name);
    void *a = NULL;
    mmrt_status st = dev->api->arena_adopt_host(dev->handle, host, nbytes, &a);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: cannot adopt %llu bytes of host memory: %s",
                              dev->name, (unsigned long long)nbytes,
                              dev->api->last_error(dev->handle));
    if (!a)
        return mmrt_error_set(err, MMRT_ERR_DEVICE, "device %s: plugin %s adopted host memory "
                              "but gave no arena", dev->name, dev->api->name);
    dev->weights.n_arenas++;
    *arena = a;
    return MMRT_OK;
}

void mmrt_dev_weight_arena_free(struct mmrt_dev *dev, void *arena, uint64_t reserved)
{
    if (!dev || !arena)
        return;
    dev->api->arena_free(dev->handle, arena);
    dev->weights.reserved_bytes -= reserved;
    dev->weights.n_arenas--;
}

mmrt_status mmrt_dev_tensor_alloc(struct mmrt_dev *dev, enum mmrt_dtype dtype, int n_dims,
                                  const int64_t *ne, struct mmrt_dev_tensor *out,
                                  struct mmrt_error *err)
{
    uint64_t nbytes;
    mmrt_status st = mmrt_tensor_nbytes(dtype, n_dims, ne, &nbytes, err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_pool_block block;
    /* An empty tensor still gets a (minimum) block so its address is valid. */
    st = mmrt_pool_alloc(dev->pool, nbytes ? nbytes : 1, &block, err);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "device %s", dev->name);
    mmrt_tensor_init(&out->t, block.arena, block.offset, dtype, n_dims, ne);
    out->block = block;
    return MMRT_OK;
}

void mmrt_dev_tensor_free(struct mmrt_dev *dev, struct mmrt_dev_tensor *t)
{
    if (!t || !t->block.arena)
        return;
    mmrt_pool_free(dev->pool, &t->block);
    memset(t, 0, sizeof *t);
}

mmrt_status mmrt_dev_upload(struct mmrt_dev *dev, const struct mmrt_tensor *t, const void *src,
                            uint64_t nbytes, struct mmrt_error *err)
{
    mmrt_status st = dev->api->upload(dev->handle, t->buffer, t->offset, src, nbytes);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: upload of %llu bytes: %s", dev->name,
                              (unsigned long long)nbytes, dev->api->last_error(dev->handle));
    return MMRT_OK;
}

mmrt_status mmrt_dev_download(struct mmrt_dev *dev, const struct mmrt_tensor *t, void *dst,
                              uint64_t nbytes, struct mmrt_error *err)
{
    mmrt_status st = dev->api->download(dev->handle, dst, t->buffer, t->offset, nbytes);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: download of %llu bytes: %s", dev->name,
                              (unsigned long long)nbytes, dev->api->last_error(dev->handle));
    return MMRT_OK;
}

bool mmrt_dev_can_capture(const struct mmrt_dev *dev)
{
    /* the loader zero-extends a shorter plugin struct and accepts all four members or none */
    return dev->api->capture_begin != NULL;
}

mmrt_status mmrt_dev_capture_begin(struct mmrt_dev *dev, struct mmrt_error *err)
{
    if (!mmrt_dev_can_capture(dev))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s (plugin %s) does not capture graphs", dev->name,
                              dev->api->name);
    mmrt_status st = dev->api->capture_begin(dev->handle);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: graph capture: %s", dev->name,
                              dev->api->last_error(dev->handle));
    dev->capturing = true;
    return MMRT_OK;
}

mmrt_status mmrt_dev_capture_end(struct mmrt_dev *dev, void **graph, struct mmrt_error *err)
{
    *graph = NULL;
    if (!mmrt_dev_can_capture(dev))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s (plugin %s) does not capture graphs", dev->name,
                              dev->api->name);
    mmrt_status st = dev->api->capture_end(dev->handle, graph);
    dev->capturing = false;
    if (st == MMRT_OK && !*graph)
        st = mmrt_error_set(err, MMRT_ERR_INTERNAL,
                            "device %s: capture_end succeeded without a graph", dev->name);
    else if (st != MMRT_OK)
        st = mmrt_error_set(err, st, "device %s: graph capture: %s", dev->name,
                            dev->api->last_error(dev->handle));
    return st;
}

mmrt_status mmrt_dev_graph_launch(struct mmrt_dev *dev, void *graph, struct mmrt_error *err)
{
    if (!mmrt_dev_can_capture(dev) || !graph)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "device %s: no graph to launch",
                              dev->name);
    mmrt_status st = dev->api->graph_launch(dev->handle, graph);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "device %s: graph launch: %s", dev->name,
                              dev->api->last_error(dev->handle));
    return MMRT_OK;
}

void mmrt_dev_graph_destroy(struct mmrt_dev *dev, void *graph)
{
    if (graph && mmrt_dev_can_capture(dev))
        dev->api->graph_destroy(dev->handle, graph);
}

mmrt_status mmrt_dev_require_ops(const struct mmrt_dev *dev, const char *purpose,
                                 const enum mmrt_op *ops, int n_ops, struct mmrt_error *err)
{
    char missing[512] = "";
    size_t used = 0;
    int n_missing = 0;
    for (int i = 0; i < n_ops; i++) {
        if ((unsigned)ops[i] < MMRT_OP_COUNT && dev->api->ops[ops[i]])
            continue;
        /* List each missing op once even if `ops` repeats it. */
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= ops[j] == ops[i];
        if (seen)
            continue;
        int w = snprintf(missing + used, sizeof missing - used, "%s%s", n_missing ? ", " : "",
                         mmrt_op_name(ops[i]));
        if (w > 0 && used + (size_t)w < sizeof missing)
            used += (size_t)w;
        n_missing++;
    }
    if (n_missing)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "device %s (plugin %s) lacks operator%s needed by %s: %s",
                              dev->name, dev->api->name, n_missing == 1 ? "" : "s", purpose,
                              missing);
    return MMRT_OK;
}

void mmrt_scratch_init(struct mmrt_scratch *s, struct mmrt_dev *dev)
{
    s->dev = dev;
    s->n = 0;
}

mmrt_status mmrt_scratch_tensor(struct mmrt_scratch *s, enum mmrt_dtype dtype, int n_dims,
                                const int64_t *ne, struct mmrt_tensor *out,
                                struct mmrt_error *err)
{
    if (s->n == MMRT_SCRATCH_MAX)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "device %s: more than %d scratch tensors",
                              s->dev->name, MMRT_SCRATCH_MAX);
    mmrt_status st = mmrt_dev_tensor_alloc(s->dev, dtype, n_dims, ne, &s->t[s->n], err);
    if (st != MMRT_OK)
        return st;
    *out = s->t[s->n++].t;
    return MMRT_OK;
}

void mmrt_scratch_release(struct mmrt_scratch *s)
{
    while (s->n > 0) {
        s->n--;
        mmrt_dev_tensor_free(s->dev, &s->t[s->n]);
    }
}
