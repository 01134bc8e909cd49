/*
 * core/device.h — one opened device: its plugin, the plugin's device handle, and the buddy
 * pool that sub-allocates the arenas the plugin hands out.
 *
 * Ownership: plugin > device > pool > blocks. A device holds one reference on its plugin;
 * closing the device frees the pool (and with it every arena) before releasing the plugin.
 * A device is used by one thread at a time.
 */
#ifndef MMRT_CORE_DEVICE_H
#define MMRT_CORE_DEVICE_H

#include <stdbool.h>

#include "error.h"
#include "mmrt/plugin.h"
#include "plugin_loader.h"
#include "pool.h"
#include "tensor.h"

/* Weight memory of one device. Weights live outside the pool (DESIGN.md "Memory"): in arenas
 * of exactly the bytes asked for, straight from the plugin, or in place in host memory the
 * plugin adopted read-only (the checkpoint's mapping). models/weights.c keeps these counts. */
struct mmrt_dev_weight_stats {
    uint64_t tensor_bytes;   /* bytes of the weight tensors placed on the device */
    uint64_t mapped_bytes;   /* of those, used in place from the checkpoint's mapping */
    uint64_t copied_bytes;   /* of those, copied (or converted) into weight arenas */
    uint64_t reserved_bytes; /* device memory the weight arenas hold: copied_bytes plus the
                                padding that aligns each tensor */
    uint64_t n_tensors, n_arenas;
};

/* The paged KV cache of the decoder on this device (core/kv_cache.c keeps these). */
struct mmrt_dev_kv_stats {
    uint64_t page_tokens;    /* positions per page; 0 when no decoder runs here */
    uint64_t pages_total;    /* pages of the store */
    uint64_t pages_used;     /* held by live sequences */
    uint64_t bytes;          /* the store's bytes, all layers, K and V (in the pool) */
    int32_t dtype;           /* what the store holds (enum mmrt_dtype) when page_tokens > 0 */
};

struct mmrt_dev {
    char name[32];                      /* configured name, e.g. "cpu0" */
    int index;                          /* index within the plugin */
    struct mmrt_loaded_plugin *plugin;  /* one reference held */
    const struct mmrt_plugin *api;      /* == &plugin->api */
    struct mmrt_device *handle;         /* the plugin's device */
    struct mmrt_device_info info;
    struct mmrt_pool *pool;
    struct mmrt_dev_weight_stats weights;
    struct mmrt_dev_kv_stats kv;
    int64_t auto_kv_tokens;             /* KV positions pool_mb = auto sized this pool for
                                           (models/pool_budget.h), the KV store's default;
                                           0 when pool_mb was given */
    bool capturing;                     /* between capture_begin and capture_end */
};

/* Loads `plugin_name`, opens device `index` with the plugin-specific options and reserves a
 * pool of pool_bytes. Statuses: those of mmrt_plugin_load, MMRT_ERR_NO_DEVICE (the plugin
 * has no device, or fewer than index+1; the message gives the plugin's reason), the
 * plugin's device_open status, MMRT_ERR_OUT_OF_POOL when the pool cannot be reserved or is
 * larger than the device's memory (the message gives both figures). */
mmrt_status mmrt_dev_open(const char *name, const char *plugin_name, int index,
                          uint64_t pool_bytes, const struct mmrt_option *options, int n_options,
                          struct mmrt_dev **out, struct mmrt_error *err);

/* Same with an already loaded plugin (takes its own reference), and the pool's level 1 on or
 * off (pool.h; mmrt_dev_open keeps the default, on). An invalid level1 is MMRT_ERR_CONFIG. */
mmrt_status mmrt_dev_open_plugin(const char *name, struct mmrt_loaded_plugin *plugin, int index,
                                 uint64_t pool_bytes, enum mmrt_pool_level1 level1,
                                 const struct mmrt_option *options, int n_options,
                                 struct mmrt_dev **out, struct mmrt_error *err);

/* Frees the pool and closes the device; NULL is a no-op. Every block must be freed or
 * simply abandoned (the arenas go away with the pool). */
void mmrt_dev_close(struct mmrt_dev *dev);

/* An arena of exactly nbytes from the plugin, outside the pool, for weights (counted in
 * dev->weights.reserved_bytes and n_arenas). MMRT_ERR_OUT_OF_POOL names the device and the
 * plugin's reason. Return it with mmrt_dev_weight_arena_free(dev, arena, nbytes). */
mmrt_status mmrt_dev_weight_arena_alloc(struct mmrt_dev *dev, uint64_t nbytes, void **arena,
                                        struct mmrt_error *err);
/* The plugin adopts host[0, nbytes) as a read-only arena (plugin.h arena_adopt_host); the
 * memory must outlive the arena. MMRT_ERR_UNSUPPORTED when the plugin cannot (then the caller
 * copies). Counted in n_arenas; return it with mmrt_dev_weight_arena_free(dev, arena, 0). */
mmrt_status mmrt_dev_adopt_host(struct mmrt_dev *dev, const void *host, uint64_t nbytes,
                                void **arena, struct mmrt_error *err);
/* True when the plugin implements arena_adopt_host. */
bool mmrt_dev_can_adopt(const struct mmrt_dev *dev);
/* Returns a weight arena; `reserved` is what alloc was asked for (0 for an adopted one). */
void mmrt_dev_weight_arena_free(struct mmrt_dev *dev, void *arena, uint64_t reserved);

/* A tensor that owns a pool block. t describes the whole block contiguously. */
struct mmrt_dev_tensor {
    struct mmrt_tensor t;
    struct mmrt_pool_block block;
};

/* Allocates a contiguous tensor of dtype and shape (outermost first, 1…MMRT_MAX_DIMS dims,
 * every extent ≥ 0) from the device pool. MMRT_ERR_OUT_OF_POOL names the device. */
mmrt_status mmrt_dev_tensor_alloc(struct mmrt_dev *dev, enum mmrt_dtype dtype, int n_dims,
                                  const int64_t *ne, struct mmrt_dev_tensor *out,
                                  struct mmrt_error *err);
/* Returns the block to the pool; a zeroed struct is a no-op. */
void mmrt_dev_tensor_free(struct mmrt_dev *dev, struct mmrt_dev_tensor *t);

/* Short-lived tensors of one computation (a forward pass), freed together. */
#define MMRT_SCRATCH_MAX 48
struct mmrt_scratch {
    struct mmrt_dev *dev;
    int n;
    struct mmrt_dev_tensor t[MMRT_SCRATCH_MAX];
};

/* Starts an empty scratch set on dev. */
void mmrt_scratch_init(struct mmrt_scratch *s, struct mmrt_dev *dev);
/* Allocates a contiguous tensor that lives until mmrt_scratch_release(). */
mmrt_status mmrt_scratch_tensor(struct mmrt_scratch *s, enum mmrt_dtype dtype, int n_dims,
                                const int64_t *ne, struct mmrt_tensor *out,
                                struct mmrt_error *err);
/* Frees every tensor of the set (in reverse order, which keeps the buddy pool tidy). */
void mmrt_scratch_release(struct mmrt_scratch *s);

/* Host ↔ device for a contiguous tensor (nbytes = whole tensor). */
mmrt_status mmrt_dev_upload(struct mmrt_dev *dev, const struct mmrt_tensor *t, const void *src,
                            uint64_t nbytes, struct mmrt_error *err);
mmrt_status mmrt_dev_download(struct mmrt_dev *dev, const struct mmrt_tensor *t, void *dst,
                              uint64_t nbytes, struct mmrt_error *err);
/* Graph capture (plugin.h): true when the plugin records graphs (and the plugin struct
 * is new enough to carry the members). */
bool mmrt_dev_can_capture(const struct mmrt_dev *dev);
/* Between capture_begin and capture_end the device records instead of running; end hands
 * back an opaque graph for mmrt_dev_graph_launch (same arenas, offsets and shapes on every
 * replay). A failed capture leaves nothing recorded; the caller then runs eagerly.
 * MMRT_ERR_UNSUPPORTED when the device cannot capture. */
mmrt_status mmrt_dev_capture_begin(struct mmrt_dev *dev, struct mmrt_error *err);
mmrt_status mmrt_dev_capture_end(struct mmrt_dev *dev, void **graph, struct mmrt_error *err);
mmrt_status mmrt_dev_graph_launch(struct mmrt_dev *dev, void *graph, struct mmrt_error *err);
/* NULL graph is a no-op. */
void mmrt_dev_graph_destroy(struct mmrt_dev *dev, void *graph);

/* Succeeds when the device's plugin has every op in `ops`; otherwise MMRT_ERR_UNSUPPORTED
 * with a message listing all the missing ones, e.g.
 * "device ocl0 (plugin opencl) lacks operators needed by stage language: ROPE, ATTENTION". */
mmrt_status mmrt_dev_require_ops(const struct mmrt_dev *dev, const char *purpose,
                                 const enum mmrt_op *ops, int n_ops, struct mmrt_error *err);

#endif
