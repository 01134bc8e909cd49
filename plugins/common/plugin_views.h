/*
 * plugins/common/plugin_views.h — the descriptor checks every in-tree plugin makes before a
 * kernel touches memory, written once (what each op asks of its operands is op_contract.h): a tensor descriptor's header, dtype, rank, offset
 * alignment, extents and strides (overflow-checked), and that every byte it can address lies
 * inside its arena; whether a destination's strides make elements overlap; and the wording
 * of the messages, so the three plugins refuse bad launches identically.
 *
 * Header-only (static inline) so that each plugin still links against nothing of mmrt; it
 * knows nothing of how a device addresses memory: the plugin looks the arena up through a
 * callback and turns the checked shape into its own view. A vendor plugin may include it too.
 */
#ifndef MMRT_PLUGIN_VIEWS_H
#define MMRT_PLUGIN_VIEWS_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "mmrt/plugin.h"

/* A descriptor after checking: the device-independent part of a plugin's view. */
struct mmrt_pv_shape {
    int dtype;
    int n_dims;
    int64_t ne[MMRT_MAX_DIMS];
    int64_t nb[MMRT_MAX_DIMS]; /* bytes */
    int64_t numel;
    uint64_t span;             /* bytes from the first element to one past the last; 0 if empty */
    const void *buffer;        /* the arena handle and the byte offset in it: where the bytes */
    uint64_t offset;           /* lie, for op_contract.h's overlap checks */
};

/* Looks up the arena a descriptor names: returns false when `buffer` is not an arena of the
 * device, else its size in *nbytes. Never dereferences `buffer`. */
typedef bool (*mmrt_pv_arena_fn)(void *ctx, const void *buffer, uint64_t *nbytes);

/* Checks descriptor t (role `what`, e.g. "src1") on its own — header, dtype, rank, offset
 * alignment, extents and strides, overflow — and fills *s; where it lies is not checked (the
 * core, which holds no arena sizes, stops here). On failure returns MMRT_ERR_INVALID_ARG with
 * the reason, starting with `what`, in why[why_size]. */
static inline mmrt_status mmrt_pv_describe(const char *what, const struct mmrt_tensor *t,
                                           struct mmrt_pv_shape *s, char *why, size_t why_size)
{
#define MMRT_PV_BAD(...) (snprintf(why, why_size, __VA_ARGS__), MMRT_ERR_INVALID_ARG)
    /* Every member of mmrt_tensor is ABI 1.0, so a descriptor must be at least this big. */
    if (t->hdr.abi_major != MMRT_ABI_MAJOR || t->hdr.struct_size < sizeof *t)
        return MMRT_PV_BAD("%s: descriptor has ABI %u (%u bytes), expected %d (≥ %zu bytes)",
                           what, t->hdr.abi_major, t->hdr.struct_size, MMRT_ABI_MAJOR,
                           sizeof *t);
    size_t es = mmrt_dtype_size((enum mmrt_dtype)t->dtype);
    if (es == 0)
        return MMRT_PV_BAD("%s: unknown dtype %d", what, (int)t->dtype);
    if (t->n_dims < 1 || t->n_dims > MMRT_MAX_DIMS)
        return MMRT_PV_BAD("%s: n_dims %d is outside 1…%d", what, (int)t->n_dims,
                           MMRT_MAX_DIMS);
    if (!t->buffer)
        return MMRT_PV_BAD("%s: buffer is NULL", what);
    if (t->offset % es != 0)
        return MMRT_PV_BAD("%s: offset %" PRIu64 " is not a multiple of the %s element size %zu",
                           what, t->offset, mmrt_dtype_name_of(t->dtype), es);
    memset(s, 0, sizeof *s);
    s->dtype = t->dtype;
    s->n_dims = t->n_dims;
    s->buffer = t->buffer;
    s->offset = t->offset;
    int64_t numel = 1, nonzero = 1; /* nonzero: product of the non-zero extents, so that any
                                        partial product (rows, …) is known not to overflow */
    uint64_t last = 0; /* byte offset of the last element from the first */
    for (int i = 0; i < t->n_dims; i++) {
        s->ne[i] = t->ne[i];
        s->nb[i] = t->nb[i];
        if (t->ne[i] < 0 || t->nb[i] < 0 || t->nb[i] % (int64_t)es != 0)
            return MMRT_PV_BAD("%s: dim %d has extent %" PRId64 " and stride %" PRId64
                               " (need extent ≥ 0 and a stride that is a non-negative multiple "
                               "of %zu)", what, i, t->ne[i], t->nb[i], es);
        if (__builtin_mul_overflow(numel, t->ne[i], &numel) ||
            __builtin_mul_overflow(nonzero, t->ne[i] ? t->ne[i] : 1, &nonzero))
            return MMRT_PV_BAD("%s: extents and strides overflow 64 bits", what);
    }
    for (int i = 0; numel > 0 && i < t->n_dims; i++) {
        uint64_t step;
        if (__builtin_mul_overflow((uint64_t)(t->ne[i] - 1), (uint64_t)t->nb[i], &step) ||
            __builtin_add_overflow(last, step, &last))
            return MMRT_PV_BAD("%s: extents and strides overflow 64 bits", what);
    }
    s->numel = numel;
    if (numel > 0 && (__builtin_add_overflow(last, (uint64_t)es, &s->span) ||
                      s->span > UINT64_MAX - t->offset))
        return MMRT_PV_BAD("%s: extents and strides overflow 64 bits", what);
    return MMRT_OK;
#undef MMRT_PV_BAD
}

/* mmrt_pv_describe, then that every byte t can address lies inside the arena of this device
 * that it names. */
static inline mmrt_status mmrt_pv_check(const char *what, const struct mmrt_tensor *t,
                                        mmrt_pv_arena_fn arena, void *ctx,
                                        struct mmrt_pv_shape *s, char *why, size_t why_size)
{
    mmrt_status st = mmrt_pv_describe(what, t, s, why, why_size);
    if (st != MMRT_OK)
        return st;
    uint64_t arena_bytes = 0;
    if (!arena(ctx, t->buffer, &arena_bytes)) {
        snprintf(why, why_size, "%s: buffer %p is not an arena of this device", what, t->buffer);
        return MMRT_ERR_INVALID_ARG;
    }
    if (t->offset > arena_bytes || s->span > arena_bytes - t->offset) {
        snprintf(why, why_size, "%s: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64 ") lie outside "
                 "its arena of %" PRIu64 " bytes", what, t->offset, t->offset, s->span,
                 arena_bytes);
        return MMRT_ERR_INVALID_ARG;
    }
    return MMRT_OK;
}

/* True when no two index tuples address the same element: sorted by stride, each dim must
 * step over everything the finer dims span. Sufficient, and exact for the layouts the core
 * builds (contiguous, permuted, sliced); a kernel writing such a dst never races. */
static inline bool mmrt_pv_injective(int dtype, int n_dims, const int64_t *ne,
                                     const int64_t *nb)
{
    int idx[MMRT_MAX_DIMS], n = 0;
    for (int i = 0; i < n_dims; i++)
        if (ne[i] > 1)
            idx[n++] = i;
    for (int i = 1; i < n; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && nb[idx[j]] < nb[idx[j - 1]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    int64_t covered = (int64_t)mmrt_dtype_size((enum mmrt_dtype)dtype);
    for (int i = 0; i < n; i++) {
        if (nb[idx[i]] < covered)
            return false;
        covered = nb[idx[i]] * (ne[idx[i]] - 1) + covered;
    }
    return true;
}

/* "[2, 3, 5]", for messages. */
static inline const char *mmrt_pv_shape_str(int n_dims, const int64_t *ne, char *buf,
                                            size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "", ne[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

/* "F32/F16/BF16" for a mask of (1 << dtype) bits, for messages. */
static inline const char *mmrt_pv_dtype_list(unsigned mask, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < MMRT_DTYPE_COUNT && used < size; d++)
        if (mask & (1u << d))
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? "/" : "",
                                     mmrt_dtype_name_of(d));
    return buf;
}

#endif
