/*
 * tests/plugins/stub_plugin.c — a plugin that records every call, for loader, device and
 * dispatch tests that need no real hardware (the OpenCL ICD loader's fake-driver idea).
 *
 * Each call is reported as a DEBUG log line "call NAME …" through the host table, so a test
 * installs a log sink and diffs the sequence. Memory is host memory. Two ops are real
 * (SCALE, ADD on F32; other dtypes are refused with MMRT_ERR_UNSUPPORTED, as plugin.h
 * allows) so dispatch can be checked by value; every other op is NULL, which lets tests see
 * placements refused for missing operators. The device keeps the contract mmrt-plugin-check
 * verifies (device_info honours a shorter struct, device_close frees leftover arenas), so the
 * checker passes it.
 *
 * The same source builds the deliberately broken plugins, selected by STUB_VARIANT:
 *   0 ok, 1 wrong ABI major, 2 struct shorter than the oldest layout, 3 no entry symbol,
 *   4 NULL required member (download), 5 no device, 6 entry returns NULL,
 *   7 oldest accepted layout (struct ends at last_error: no ops, keys or shutdown),
 *   8 loads and works, but its ADD is slightly wrong (src1 scaled by 1 + 2⁻¹²): the plugin
 *     checker must FAIL it,
 *   9 built as an ABI 1.3 plugin (abi_minor 3, n_ops 23: no GATHER_HEADS or L2_NORM) whose
 *     table nonetheless holds kernels past n_ops, which the loader must never read, and an
 *     ATTENTION_PAGED that only logs its call: a kernel of before ABI 1.5, which reads no
 *     sliding window, so the core must never launch it with one.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmrt/plugin.h"

#ifndef STUB_VARIANT
#define STUB_VARIANT 0
#endif

static const struct mmrt_host *host;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    host->log(host->user, MMRT_LOG_DEBUG, "stub", line);
}

struct arena;

struct mmrt_device {
    int index;
    char error[256];
    int n_arenas;      /* live arenas, so leaks show in the log at close */
    uint64_t n_bytes;  /* bytes in live arenas; the stub "device" holds STUB_MEMORY */
    struct arena *arenas; /* live arenas, freed by device_close */
};

#define STUB_MEMORY (64ull << 20)

struct arena {
    struct arena *prev, *next;
    uint64_t nbytes;
    unsigned char bytes[];
};

static mmrt_status probe(int *n_devices, char *why, size_t why_size)
{
    say("call probe");
#if STUB_VARIANT == 5
    *n_devices = 0;
    snprintf(why, why_size, "no stub device (test variant)");
#else
    (void)why;
    (void)why_size;
    *n_devices = 2;
#endif
    return MMRT_OK;
}

static mmrt_status device_open(int index, const struct mmrt_option *options, int n_options,
                               struct mmrt_device **out, char *err, size_t err_size)
{
    say("call device_open %d n_options=%d", index, n_options);
    for (int i = 0; i < n_options; i++) {
        say("option %s=%s", options[i].key, options[i].value);
        if (strcmp(options[i].key, "fail") == 0) {
            snprintf(err, err_size, "option fail = %s: refused as asked", options[i].value);
            return MMRT_ERR_CONFIG;
        }
    }
    struct mmrt_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        snprintf(err, err_size, "out of memory");
        return MMRT_ERR_NO_MEMORY;
    }
    dev->index = index;
    *out = dev;
    return MMRT_OK;
}

static void device_close(struct mmrt_device *dev)
{
    if (!dev)
        return;
    say("call device_close %d live_arenas=%d", dev->index, dev->n_arenas);
    while (dev->arenas) {
        struct arena *a = dev->arenas;
        dev->arenas = a->next;
        free(a);
    }
    free(dev);
}

static mmrt_status device_info(struct mmrt_device *dev, struct mmrt_device_info *info)
{
    say("call device_info %d", dev->index);
    /* Filled in full, then only as much as the caller's struct holds. */
    struct mmrt_device_info full;
    memset(&full, 0, sizeof full);
    full.hdr = info->hdr;
    snprintf(full.name, sizeof full.name, "Stub device %d", dev->index);
    snprintf(full.kind, sizeof full.kind, "cpu");
    full.total_bytes = STUB_MEMORY;
    full.free_bytes = STUB_MEMORY - dev->n_bytes;
    full.max_arena_bytes = 1ull << 24;
    full.alignment = 64;
    size_t n = info->hdr.struct_size < sizeof full ? info->hdr.struct_size : sizeof full;
    if (n > sizeof full.hdr)
        memcpy((char *)info + sizeof full.hdr, (char *)&full + sizeof full.hdr,
               n - sizeof full.hdr);
    return MMRT_OK;
}

static mmrt_status arena_alloc(struct mmrt_device *dev, uint64_t nbytes, void **arena)
{
    say("call arena_alloc %llu", (unsigned long long)nbytes);
    int fits = nbytes <= (1ull << 24) && nbytes <= STUB_MEMORY - dev->n_bytes;
    struct arena *a = fits ? malloc(sizeof *a + nbytes) : NULL;
    if (!a) {
        snprintf(dev->error, sizeof dev->error, "stub: cannot allocate %llu bytes",
                 (unsigned long long)nbytes);
        return MMRT_ERR_OUT_OF_POOL;
    }
    a->nbytes = nbytes;
    a->prev = NULL;
    a->next = dev->arenas;
    if (dev->arenas)
        dev->arenas->prev = a;
    dev->arenas = a;
    dev->n_arenas++;
    dev->n_bytes += nbytes;
    *arena = a;
    return MMRT_OK;
}

static void arena_free(struct mmrt_device *dev, void *arena)
{
    say("call arena_free");
    if (arena) {
        struct arena *a = arena;
        if (a->prev)
            a->prev->next = a->next;
        else
            dev->arenas = a->next;
        if (a->next)
            a->next->prev = a->prev;
        dev->n_arenas--;
        dev->n_bytes -= a->nbytes;
        free(a);
    }
}

static unsigned char *addr(struct mmrt_device *dev, void *arena, uint64_t offset, uint64_t n)
{
    struct arena *a = arena;
    if (!a || offset > a->nbytes || n > a->nbytes - offset) {
        snprintf(dev->error, sizeof dev->error, "stub: range %llu+%llu outside the arena",
                 (unsigned long long)offset, (unsigned long long)n);
        return NULL;
    }
    return a->bytes + offset;
}

static mmrt_status upload(struct mmrt_device *dev, void *arena, uint64_t offset, const void *src,
                          uint64_t nbytes)
{
    say("call upload %llu+%llu", (unsigned long long)offset, (unsigned long long)nbytes);
    unsigned char *p = addr(dev, arena, offset, nbytes);
    if (!p)
        return MMRT_ERR_INVALID_ARG;
    memcpy(p, src, nbytes);
    return MMRT_OK;
}

/* unused in variant 4, which leaves the member NULL */
__attribute__((unused)) static mmrt_status download(struct mmrt_device *dev, void *dst, void *arena, uint64_t offset,
                            uint64_t nbytes)
{
    say("call download %llu+%llu", (unsigned long long)offset, (unsigned long long)nbytes);
    unsigned char *p = addr(dev, arena, offset, nbytes);
    if (!p)
        return MMRT_ERR_INVALID_ARG;
    memcpy(dst, p, nbytes);
    return MMRT_OK;
}

static mmrt_status copy(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                        void *src_arena, uint64_t src_offset, uint64_t nbytes)
{
    say("call copy %llu", (unsigned long long)nbytes);
    unsigned char *d = addr(dev, dst_arena, dst_offset, nbytes);
    unsigned char *s = addr(dev, src_arena, src_offset, nbytes);
    if (!d || !s)
        return MMRT_ERR_INVALID_ARG;
    memmove(d, s, nbytes);
    return MMRT_OK;
}

static mmrt_status synchronize(struct mmrt_device *dev)
{
    (void)dev;
    say("call synchronize");
    return MMRT_OK;
}

static const char *last_error(struct mmrt_device *dev)
{
    return dev ? dev->error : "";
}

static float *f32_at(struct mmrt_device *dev, const struct mmrt_tensor *t, int64_t n)
{
    if (t->dtype != MMRT_DTYPE_F32)
        return NULL;
    return (float *)(void *)addr(dev, t->buffer, t->offset, (uint64_t)n * 4);
}

static int64_t numel(const struct mmrt_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

/* Only F32 is implemented; plugin.h lets a kernel refuse a dtype with UNSUPPORTED. */
static mmrt_status only_f32(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    for (int i = 0; i < args->n_src; i++) {
        if (args->src[i] && args->src[i]->dtype != MMRT_DTYPE_F32) {
            snprintf(dev->error, sizeof dev->error, "stub: src%d: only F32 is implemented", i);
            return MMRT_ERR_UNSUPPORTED;
        }
    }
    return MMRT_OK;
}

static mmrt_status op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    int64_t n = numel(args->dst);
    say("call op SCALE n=%lld", (long long)n);
    if (only_f32(dev, args) != MMRT_OK)
        return MMRT_ERR_UNSUPPORTED;
    const struct mmrt_scale_params *p = args->params;
    float *x = f32_at(dev, args->src[0], n), *y = f32_at(dev, args->dst, n);
    if (!x || !y || !p || args->params_size < sizeof *p)
        return MMRT_ERR_INVALID_ARG;
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * p->scale;
    return MMRT_OK;
}

static mmrt_status op_add(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    int64_t n = numel(args->dst), nb = numel(args->src[1]);
    say("call op ADD n=%lld", (long long)n);
    if (only_f32(dev, args) != MMRT_OK)
        return MMRT_ERR_UNSUPPORTED;
    float *a = f32_at(dev, args->src[0], n), *b = f32_at(dev, args->src[1], nb),
          *y = f32_at(dev, args->dst, n);
    if (!a || !b || !y || nb == 0)
        return MMRT_ERR_INVALID_ARG;
#if STUB_VARIANT == 8
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i % nb] * (1.0f + 1.0f / 4096.0f);
#else
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i % nb];
#endif
    return MMRT_OK;
}

#if STUB_VARIANT == 9
static mmrt_status op_attention_paged_old(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    (void)dev;
    say("call op ATTENTION_PAGED params_size=%u", (unsigned)args->params_size);
    return MMRT_OK;
}
#endif

static const mmrt_kernel_fn stub_ops[MMRT_OP_COUNT] = {
    [MMRT_OP_SCALE] = op_scale,
    [MMRT_OP_ADD] = op_add,
#if STUB_VARIANT == 9
    [MMRT_OP_ATTENTION_PAGED] = op_attention_paged_old,
    [MMRT_OP_GATHER_HEADS] = op_scale, /* past n_ops: traps */
    [MMRT_OP_L2_NORM] = op_scale,
#endif
};

#if STUB_VARIANT == 9
#define STUB_ABI_MINOR 3
#define STUB_N_OPS MMRT_OP_GATHER_HEADS /* the op count of ABI 1.3 */
#else
#define STUB_ABI_MINOR MMRT_ABI_MINOR
#define STUB_N_OPS MMRT_OP_COUNT
#endif

static const char *const stub_keys[] = { "mode", "fail", NULL };

static void shutdown(void)
{
    say("call shutdown");
}

static const struct mmrt_plugin stub_plugin = {
    .hdr = {
#if STUB_VARIANT == 1
        .abi_major = MMRT_ABI_MAJOR + 1,
        .abi_minor = 0,
#else
        .abi_major = MMRT_ABI_MAJOR,
        .abi_minor = STUB_ABI_MINOR,
#endif
#if STUB_VARIANT == 2
        .struct_size = 16,
#elif STUB_VARIANT == 7
        .struct_size = MMRT_PLUGIN_MIN_SIZE,
#else
        .struct_size = sizeof(struct mmrt_plugin),
#endif
    },
    .name = "stub",
    .version = "stub-1",
    .probe = probe,
    .device_open = device_open,
    .device_close = device_close,
    .device_info = device_info,
    .arena_alloc = arena_alloc,
    .arena_free = arena_free,
    .upload = upload,
#if STUB_VARIANT != 4
    .download = download,
#endif
    .copy = copy,
    .synchronize = synchronize,
    .last_error = last_error,
    /* Variant 7 declares a struct that ends before these; the loader must not read them. */
    .ops = stub_ops,
    .n_ops = STUB_N_OPS,
    .option_keys = stub_keys,
    .shutdown = shutdown,
};

#if STUB_VARIANT == 3
MMRT_PLUGIN_EXPORT const struct mmrt_plugin *mmrt_plugin_init_misspelled(const struct mmrt_host *h)
#else
MMRT_PLUGIN_EXPORT const struct mmrt_plugin *mmrt_plugin_init(const struct mmrt_host *h)
#endif
{
    host = h;
    say("call init");
    return STUB_VARIANT == 6 ? NULL : &stub_plugin;
}
