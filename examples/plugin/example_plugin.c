/*
 * examples/plugin/example_plugin.c — the smallest complete mmrt device plugin.
 *
 * One "device" whose memory is host memory, with every required member of struct
 * mmrt_plugin and no operators (an empty op table: the scheduler refuses to place a stage
 * on it, naming the missing operators; add kernels to `ops` as plugin.h describes each
 * operator). It compiles from the installed headers alone — mmrt/plugin.h, nothing else
 * of mmrt, and it links nothing of mmrt — which tests/install_test.sh proves by building it
 * against an installed tree with pkg-config and with find_package(mmrt), then listing it
 * with `mmrt --list-devices`. docs/PLUGINS.md is the guide; mmrt-plugin-check the proof.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmrt/plugin.h"

struct arena {
    uint64_t nbytes;
    unsigned char bytes[];
};

struct mmrt_device {
    char err[256]; /* last_error: one line naming the call and the values */
};

static struct mmrt_host g_host; /* the host table, zero-extended to this header's layout */

static mmrt_status fail(struct mmrt_device *d, mmrt_status st, const char *what, uint64_t off,
                        uint64_t n, uint64_t size)
{
    snprintf(d->err, sizeof d->err, "%s: offset %llu + %llu bytes is past the end of a "
             "%llu-byte arena", what, (unsigned long long)off, (unsigned long long)n,
             (unsigned long long)size);
    return st;
}

static int in_range(const struct arena *a, uint64_t off, uint64_t n)
{
    return off <= a->nbytes && n <= a->nbytes - off;
}

static mmrt_status ex_probe(int *n_devices, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    *n_devices = 1;
    return MMRT_OK;
}

static mmrt_status ex_open(int index, const struct mmrt_option *options, int n_options,
                           struct mmrt_device **out, char *err, size_t err_size)
{
    (void)options;
    if (index != 0 || n_options != 0) {
        snprintf(err, err_size, "example: device %d / %d options: only device 0, no options",
                 index, n_options);
        return MMRT_ERR_INVALID_ARG;
    }
    struct mmrt_device *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, err_size, "example: out of memory");
        return MMRT_ERR_NO_MEMORY;
    }
    *out = d;
    return MMRT_OK;
}

static void ex_close(struct mmrt_device *d)
{
    free(d); /* a real plugin also frees the arenas still allocated on d */
}

static mmrt_status ex_info(struct mmrt_device *d, struct mmrt_device_info *info)
{
    (void)d;
    struct mmrt_device_info full;
    memset(&full, 0, sizeof full);
    full.hdr = info->hdr;
    snprintf(full.name, sizeof full.name, "example host-memory device");
    snprintf(full.kind, sizeof full.kind, "cpu");
    full.total_bytes = full.free_bytes = full.max_arena_bytes = 1ull << 30;
    full.alignment = 64;
    /* honour the caller's struct_size: write nothing past it */
    size_t n = info->hdr.struct_size < sizeof full ? info->hdr.struct_size : sizeof full;
    memcpy(info, &full, n);
    return MMRT_OK;
}

static mmrt_status ex_alloc(struct mmrt_device *d, uint64_t nbytes, void **arena)
{
    struct arena *a = nbytes <= (1ull << 30) ? malloc(sizeof *a + nbytes) : NULL;
    if (!a) {
        snprintf(d->err, sizeof d->err, "arena_alloc: %llu bytes not available",
                 (unsigned long long)nbytes);
        return MMRT_ERR_OUT_OF_POOL;
    }
    a->nbytes = nbytes;
    *arena = a;
    return MMRT_OK;
}

static void ex_free(struct mmrt_device *d, void *arena)
{
    (void)d;
    free(arena);
}

static mmrt_status ex_upload(struct mmrt_device *d, void *arena, uint64_t off, const void *src,
                             uint64_t n)
{
    struct arena *a = arena;
    if (!in_range(a, off, n))
        return fail(d, MMRT_ERR_INVALID_ARG, "upload", off, n, a->nbytes);
    memcpy(a->bytes + off, src, n);
    return MMRT_OK;
}

static mmrt_status ex_download(struct mmrt_device *d, void *dst, void *arena, uint64_t off,
                               uint64_t n)
{
    struct arena *a = arena;
    if (!in_range(a, off, n))
        return fail(d, MMRT_ERR_INVALID_ARG, "download", off, n, a->nbytes);
    memcpy(dst, a->bytes + off, n);
    return MMRT_OK;
}

static mmrt_status ex_copy(struct mmrt_device *d, void *dst_arena, uint64_t dst_off,
                           void *src_arena, uint64_t src_off, uint64_t n)
{
    struct arena *da = dst_arena, *sa = src_arena;
    if (!in_range(sa, src_off, n))
        return fail(d, MMRT_ERR_INVALID_ARG, "copy (source)", src_off, n, sa->nbytes);
    if (!in_range(da, dst_off, n))
        return fail(d, MMRT_ERR_INVALID_ARG, "copy (destination)", dst_off, n, da->nbytes);
    memmove(da->bytes + dst_off, sa->bytes + src_off, n);
    return MMRT_OK;
}

static mmrt_status ex_sync(struct mmrt_device *d)
{
    (void)d; /* everything above ran synchronously */
    return MMRT_OK;
}

static const char *ex_last_error(struct mmrt_device *d)
{
    return d ? d->err : "";
}

static const struct mmrt_plugin g_plugin = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_plugin),
    .name = "example", /* the file is libmmrt_example.so */
    .version = "1.0.0",
    .probe = ex_probe,
    .device_open = ex_open,
    .device_close = ex_close,
    .device_info = ex_info,
    .arena_alloc = ex_alloc,
    .arena_free = ex_free,
    .upload = ex_upload,
    .download = ex_download,
    .copy = ex_copy,
    .synchronize = ex_sync,
    .last_error = ex_last_error,
};

MMRT_PLUGIN_EXPORT const struct mmrt_plugin *mmrt_plugin_init(const struct mmrt_host *host)
{
    return mmrt_plugin_adopt_host(host, &g_host, "example") ? &g_plugin : NULL;
}
