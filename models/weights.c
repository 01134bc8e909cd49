/*
 * models/weights.c — canonical names over a safetensors set, and weights placed at their
 * exact size.
 *
 * Index: an array of (canonical name, tensor) sorted by name, searched with bsearch.
 *
 * Loading is two steps, as llama.cpp's loader does it, because a weight region can only be
 * sized once every tensor placed on its device is known: mmrt_weights_load checks a tensor
 * and records where its descriptor goes; mmrt_weights_commit then places every recorded
 * tensor per device — in place in the checkpoint's mapping where the plugin adopts host
 * memory and the stored bytes are what the kernels read, otherwise packed (each tensor at the
 * device's alignment) into arenas of exactly the bytes needed — uploads them and fills the
 * descriptors. Arenas are split only where the device caps one allocation
 * (max_arena_bytes). The set owns those arenas and returns them in mmrt_weights_close.
 */
#include "weights.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "quant.h"

struct entry {
    char *name;
    const struct mmrt_st_tensor *t;
    bool read;  /* loaded, or known to the model and skipped (mmrt_weights_skip) */
};

/* What a pending tensor's device bytes are made of. */
enum conversion {
    CONV_NONE,      /* the stored bytes (mappable) */
    CONV_CODES,     /* the stored bytes of a pre-quantized matrix's I8 or U4 codes */
    CONV_F32,       /* widened to F32 */
    CONV_I8_VALUES, /* a matrix's INT8 codes (core/quant.h) */
    CONV_I8_SCALES, /* the same matrix's per-row scales */
    CONV_Q4_CODES,  /* a matrix's INT4 codes (plugin.h U4 layout) */
    CONV_Q4_SCALES, /* its group scales [N, G] */
    CONV_Q4_ZEROS,  /* its group zero points [N, G] */
    CONV_PACKED_CODES, /* an AWQ or GPTQ matrix repacked (qweight, qzeros, scales): U4 codes */
    CONV_PACKED_SCALES,
    CONV_PACKED_ZEROS,
    CONV_PACKED_PERM, /* act-order GPTQ: I32 [K], the input each repacked column reads */
};

/* A loaded tensor waiting for mmrt_weights_commit. */
struct pending {
    struct mmrt_dev *dev;
    const struct mmrt_st_tensor *t;
    struct mmrt_tensor *out;  /* the caller's descriptor, filled by commit */
    enum conversion conv;
    enum mmrt_dtype dtype;    /* on the device */
    int n_dims;
    int64_t ne[MMRT_MAX_DIMS];
    uint64_t nbytes;          /* on the device */
    enum mmrt_weight_format format; /* a matrix quantized at load: how */
    const struct mmrt_st_tensor *pk_zeros, *pk_scales; /* CONV_PACKED_*: with t = qweight */
    const struct mmrt_st_tensor *pk_gidx; /* act-order GPTQ's g_idx, else NULL */
};

/* A weight arena the set holds, with what it accounted on its device. */
struct held {
    struct mmrt_dev *dev;
    void *arena;
    uint64_t reserved;        /* arena bytes (0 when adopted) */
    const void *host;         /* adopted: the mapping it names, so a shard is adopted once */
};

struct mmrt_weights {
    char *path;
    struct mmrt_safetensors *st;
    struct entry *entries;
    size_t n_entries;
    struct pending *pending;
    size_t n_pending, cap_pending;
    struct held *held;
    size_t n_held, cap_held;
    /* What commit placed, per tensor, so close can take it off the devices' counts. */
    struct placed { struct mmrt_dev *dev; uint64_t nbytes; bool mapped; } *placed;
    size_t n_placed, cap_placed;
    enum mmrt_weight_format format; /* of the matrices loaded by mmrt_weights_load_matrix */
    mmrt_quantized_fn on_quantized; /* told every matrix quantized at load (mmrt-quantize) */
    void *on_quantized_user;
    struct mmrt_packed_format packed; /* a published 4-bit packing (AWQ, GPTQ), or none */
    mmrt_format_fn format_of;       /* a matrix's own format, overriding `format` */
    void *format_of_user;
    enum mmrt_weight_format matrix_format; /* of the matrix mmrt_weights_load_matrix loads */
    /* The quantized form of the matrix last quantized, so its codes, scales and zero points
     * (tensors committed one after the other) come from one pass over it. */
    struct q_cache {
        const struct mmrt_st_tensor *t;
        uint8_t *codes;     /* I8 or U4 codes */
        float *scale, *zero; /* zero: U4 only */
        int32_t *perm;      /* act-order GPTQ: the input of each repacked column */
    } q;
};

static void q_cache_drop(struct mmrt_weights *w)
{
    free(w->q.codes);
    free(w->q.scale);
    free(w->q.zero);
    free(w->q.perm);
    memset(&w->q, 0, sizeof w->q);
}

static int starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

void mmrt_weights_canonical_name(const char *name, bool bare_model_is_lm, char *buf,
                                 size_t size)
{
    static const char *const after_model[] = {
        "language_model.", "vision_tower.", "visual.", "multi_modal_projector.",
        "image_newline", "vision_embed_tokens",
    };
    const char *s = name;
    int stripped = 0;
    if (starts(s, "model.")) {
        for (size_t i = 0; i < sizeof after_model / sizeof after_model[0]; i++) {
            if (starts(s + 6, after_model[i])) {
                s += 6;
                stripped = 1;
                break;
            }
        }
    }
    if (starts(s, "language_model.lm_head."))
        snprintf(buf, size, "lm_head.%s", s + strlen("language_model.lm_head."));
    else if (starts(s, "language_model.model."))
        snprintf(buf, size, "language_model.%s", s + strlen("language_model.model."));
    else if (bare_model_is_lm && !stripped && starts(s, "model."))
        snprintf(buf, size, "language_model.%s", s + strlen("model."));
    else if (starts(s, "vision_tower.vision_model."))
        snprintf(buf, size, "vision_tower.%s", s + strlen("vision_tower.vision_model."));
    else
        snprintf(buf, size, "%s", s);
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

void mmrt_weights_close(struct mmrt_weights *w)
{
    if (!w)
        return;
    q_cache_drop(w);
    for (size_t i = 0; i < w->n_placed; i++) {
        struct mmrt_dev_weight_stats *ws = &w->placed[i].dev->weights;
        ws->tensor_bytes -= w->placed[i].nbytes;
        *(w->placed[i].mapped ? &ws->mapped_bytes : &ws->copied_bytes) -= w->placed[i].nbytes;
        ws->n_tensors--;
    }
    for (size_t i = w->n_held; i-- > 0;)
        mmrt_dev_weight_arena_free(w->held[i].dev, w->held[i].arena, w->held[i].reserved);
    free(w->placed);
    free(w->held);
    free(w->pending);
    for (size_t i = 0; i < w->n_entries; i++)
        free(w->entries[i].name);
    free(w->entries);
    mmrt_safetensors_close(w->st);
    free(w->path);
    free(w);
}

mmrt_status mmrt_weights_open(const char *dir, bool bare_model_is_lm,
                              struct mmrt_weights **out, struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    struct mmrt_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(dir))) {
        free(w);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
    }
    st = mmrt_safetensors_open(dir, NULL, &w->st, err);
    if (st != MMRT_OK)
        goto fail;
    size_t n = mmrt_safetensors_count(w->st);
    w->entries = calloc(n ? n : 1, sizeof *w->entries);
    if (!w->entries) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const struct mmrt_st_tensor *t = mmrt_safetensors_at(w->st, i);
        char canon[1100];
        mmrt_weights_canonical_name(t->name, bare_model_is_lm, canon, sizeof canon);
        w->entries[i].t = t;
        w->entries[i].name = strdup(canon);
        if (!w->entries[i].name) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
            goto fail;
        }
        w->n_entries++;
    }
    qsort(w->entries, w->n_entries, sizeof *w->entries, entry_cmp);
    for (size_t i = 1; i < w->n_entries; i++) {
        if (strcmp(w->entries[i - 1].name, w->entries[i].name) == 0) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                                "%s: tensors '%s' and '%s' are the same weight in two "
                                "layouts (both map to '%s')",
                                dir, w->entries[i - 1].t->name, w->entries[i].t->name,
                                w->entries[i].name);
            goto fail;
        }
    }
    *out = w;
    return MMRT_OK;
fail:
    mmrt_weights_close(w);
    return st;
}

static struct entry *find_entry(const struct mmrt_weights *w, const char *name)
{
    struct entry key = { .name = (char *)name };
    return bsearch(&key, w->entries, w->n_entries, sizeof *w->entries, entry_cmp);
}

const struct mmrt_st_tensor *mmrt_weights_find(const struct mmrt_weights *w, const char *name)
{
    const struct entry *e = find_entry(w, name);
    return e ? e->t : NULL;
}

void mmrt_weights_skip(struct mmrt_weights *w, const char *fmt, ...)
{
    char prefix[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    const size_t n = strlen(prefix);
    /* entries are sorted: those starting with prefix are one run from its lower bound */
    size_t lo = 0, hi = w->n_entries;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(w->entries[mid].name, prefix) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < w->n_entries && strncmp(w->entries[i].name, prefix, n) == 0; i++)
        w->entries[i].read = true;
}

/* "PREFIX.layers.N.REST" → the length of "PREFIX.layers" and N; 0 for other names. */
static size_t layer_of(const char *name, long *layer)
{
    const char *p = strstr(name, ".layers.");
    if (!p || p[8] < '0' || p[8] > '9')
        return 0;
    char *end;
    *layer = strtol(p + 8, &end, 10);
    return *end == '.' ? (size_t)(p + 7 - name) : 0;
}

void mmrt_weights_report_unused(const struct mmrt_weights *w)
{
    size_t n_unused = 0;
    for (size_t i = 0; i < w->n_entries; i++)
        n_unused += !w->entries[i].read;
    if (n_unused == 0)
        return;
    /* One line: layer runs as "PREFIX.layers.A-B.* (N tensors)", other names one by one,
     * the first few of each kind. */
    char line[1600];
    size_t used = 0, shown = 0;
    const size_t cap = sizeof line - 64;
    for (size_t i = 0; i < w->n_entries && used < cap; i++) {
        const struct entry *e = &w->entries[i];
        if (e->read)
            continue;
        long a, b, l;
        const size_t plen = layer_of(e->name, &a);
        if (plen) {
            /* names sort as strings (layers.10 before layers.2): collect this prefix's
             * unread layers, then skip them */
            bool seen = false;
            for (size_t k = 0; k < i && !seen; k++)
                seen = !w->entries[k].read && layer_of(w->entries[k].name, &l) == plen &&
                       strncmp(w->entries[k].name, e->name, plen) == 0;
            if (seen)
                continue;
            size_t count = 0;
            b = a;
            for (size_t k = i; k < w->n_entries; k++)
                if (!w->entries[k].read && layer_of(w->entries[k].name, &l) == plen &&
                    strncmp(w->entries[k].name, e->name, plen) == 0) {
                    count++;
                    a = l < a ? l : a;
                    b = l > b ? l : b;
                }
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%.*s.%ld%s%.0ld.* "
                                     "(%zu tensors)", shown ? ", " : "", (int)plen, e->name,
                                     a, a == b ? "" : "-", a == b ? 0L : b, count);
            shown += count;
        } else if (shown < 12) {
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%s",
                                     shown ? ", " : "", e->name);
            shown++;
        }
    }
    if (used >= cap)
        used = cap;
    if (shown < n_unused)
        snprintf(line + used, sizeof line - used, ", and %zu more", n_unused - shown);
    mmrt_log(MMRT_LOG_WARN, "weights", "%s: %zu checkpoint tensor%s that nothing reads: %s",
             w->path, n_unused, n_unused == 1 ? "" : "s", line);
}

mmrt_status mmrt_weights_load_embed_head(struct mmrt_weights *w, struct mmrt_dev *dev,
                                         int64_t vocab, int64_t hidden, bool tie,
                                         struct mmrt_tensor *embed, struct mmrt_weight *head,
                                         bool *tied, struct mmrt_error *err)
{
    mmrt_status st = mmrt_weights_load(w, dev, 2, (const int64_t[]){ vocab, hidden }, embed,
                                       err, "language_model.embed_tokens.weight");
    if (st != MMRT_OK)
        return st;
    *tied = !mmrt_weights_find(w, "lm_head.weight") && tie;
    if (*tied)
        return MMRT_OK;
    return mmrt_weights_load_matrix(w, dev, vocab, hidden, head, err, "lm_head.weight");
}

mmrt_status mmrt_weights_decoder_done(struct mmrt_weights *w, int64_t n_layers, bool tied,
                                      const struct mmrt_tensor *embed,
                                      struct mmrt_weight *head, struct mmrt_error *err)
{
    /* The tied head is a copy of the embedding's descriptor, which only commit completes. */
    mmrt_status st = mmrt_weights_commit(w, err);
    if (st != MMRT_OK)
        return st;
    mmrt_weights_check_layers(w, "language_model.layers", n_layers, "input_layernorm.weight",
                              "num_hidden_layers");
    mmrt_weights_report_unused(w);
    if (tied)
        head->t = *embed; /* stays in the checkpoint's dtype: GET_ROWS reads it too */
    return MMRT_OK;
}

void mmrt_weights_check_layers(const struct mmrt_weights *w, const char *prefix,
                               int64_t n_layers, const char *probe, const char *key)
{
    char name[1200];
    int64_t n = n_layers;
    while (n < (int64_t)w->n_entries) {
        snprintf(name, sizeof name, "%s.%lld.%s", prefix, (long long)n, probe);
        if (!find_entry(w, name))
            break;
        n++;
    }
    if (n > n_layers)
        mmrt_log(MMRT_LOG_WARN, "weights", "%s: config.json %s = %lld uses %lld of the "
                 "checkpoint's %lld layers (%s.%lld%s%.0lld are not read)", w->path, key,
                 (long long)n_layers, (long long)n_layers, (long long)n, prefix,
                 (long long)n_layers, n - 1 > n_layers ? "-" : "",
                 n - 1 > n_layers ? (long long)(n - 1) : 0LL);
}

static void shape_str(int n_dims, const int64_t *shape, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* Grows *arr (of *cap elements of size `size`) to hold at least n + 1. */
static int reserve(void **arr, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 1;
    size_t c = *cap ? *cap : 64;
    while (c <= n)
        c *= 2;
    void *grown = realloc(*arr, c * size);
    if (!grown)
        return 0;
    *arr = grown;
    *cap = c;
    return 1;
}

/* Whether any lane of the 64-bit words d[BLOCK] has all of its exponent bits `m` set
 * (lanes of 16 or 32 bits; L and H are each lane's lowest and highest bit). y = (x & m) ^ m
 * is zero exactly in such a lane, and (y - L) & ~y & H is non-zero iff a lane of y is zero
 * (the sign bit is never in m, so y's top lane bits are clear). A fixed trip count with no
 * exit lets GCC and clang vectorise it at -O2: ~0.05-0.1 s per GiB here, so a 7B
 * checkpoint's 13 GB cost about a second once in the page cache, which its first forward
 * would read anyway. */
enum { SCAN_WORDS = 512 };

static bool block_non_finite(const uint8_t *d, uint64_t m, uint64_t L, uint64_t H)
{
    uint64_t acc = 0;
    for (int i = 0; i < SCAN_WORDS; i++) {
        uint64_t x;
        memcpy(&x, d + (size_t)i * 8, 8); /* unaligned (S7) */
        const uint64_t y = (x & m) ^ m;
        acc |= (y - L) & ~y & H;
    }
    return acc != 0;
}

/* Index of the first element of t whose exponent bits (mask, elements of `size` bytes,
 * little endian) are all ones — a NaN or an infinity — or t->n_elements. */
static uint64_t first_non_finite(const struct mmrt_st_tensor *t, uint32_t mask, size_t size)
{
    const uint8_t *d = t->data;
    const uint64_t m = size == 4 ? (uint64_t)mask << 32 | mask
                                 : (uint64_t)mask * 0x0001000100010001ull;
    const uint64_t L = size == 4 ? 0x0000000100000001ull : 0x0001000100010001ull;
    const uint64_t H = L << (size * 8 - 1);
    const uint64_t step = SCAN_WORDS * 8 / size; /* elements per block */
    uint64_t i0 = 0;
    for (; i0 + step <= t->n_elements; i0 += step)
        if (block_non_finite(d + i0 * size, m, L, H))
            break;
    for (uint64_t i = i0; i < t->n_elements; i++) {
        uint32_t x = 0;
        memcpy(&x, d + i * size, size);
        if ((x & mask) == mask)
            return i;
    }
    return t->n_elements;
}

/* A weight holding NaN or ±Inf is refused at load, naming it: otherwise it surfaces only as
 * a sampler without a finite logit, with nothing to say where it came from. */
static mmrt_status check_finite(const struct mmrt_st_tensor *t, struct mmrt_error *err)
{
    uint32_t mask;
    size_t size;
    switch (t->dtype) {
    case MMRT_DTYPE_F32: mask = 0x7f800000u; size = 4; break;
    case MMRT_DTYPE_F16: mask = 0x7c00u; size = 2; break;
    case MMRT_DTYPE_BF16: mask = 0x7f80u; size = 2; break;
    default: return MMRT_OK;
    }
    const uint64_t i = first_non_finite(t, mask, size);
    if (i == t->n_elements)
        return MMRT_OK;
    uint32_t x = 0;
    memcpy(&x, (const uint8_t *)t->data + i * size, size);
    const uint32_t frac = x & (size == 4 ? 0x007fffffu : mask == 0x7c00u ? 0x3ffu : 0x7fu);
    const bool neg = x >> (size * 8 - 1);
    return mmrt_error_set(err, MMRT_ERR_FORMAT,
                          "%s: tensor '%s' holds %s at element %llu of %llu (byte offset %llu "
                          "in the file): the checkpoint's weights must be finite",
                          t->file, t->name, frac ? "NaN" : neg ? "-Inf" : "+Inf",
                          (unsigned long long)i, (unsigned long long)t->n_elements,
                          (unsigned long long)(t->file_offset + i * size));
}

/* Records e's tensor for commit as a device tensor of `dtype` [ne] made by `conv` (its
 * descriptor's shape filled now); false when out of memory. */
static bool push_pending(struct mmrt_weights *w, struct entry *e, struct mmrt_dev *dev,
                         struct mmrt_tensor *out, enum conversion conv, enum mmrt_dtype dtype,
                         int n_dims, const int64_t *ne, struct mmrt_error *err)
{
    (void)err;
    if (!reserve((void **)&w->pending, &w->cap_pending, w->n_pending, sizeof *w->pending))
        return false;
    e->read = true;
    struct pending *p = &w->pending[w->n_pending];
    *p = (struct pending){ .dev = dev, .t = e->t, .out = out, .conv = conv, .dtype = dtype,
                           .n_dims = n_dims, .format = w->matrix_format };
    uint64_t n = 1;
    for (int i = 0; i < n_dims; i++)
        n *= (uint64_t)(p->ne[i] = ne[i]);
    p->nbytes = n * mmrt_dtype_size(dtype);
    /* The shape is known now; the storage (buffer NULL until commit) is not, so any use of
     * the descriptor before commit is refused by the operator checks. */
    mmrt_tensor_init(out, NULL, 0, dtype, n_dims, p->ne);
    w->n_pending++;
    return true;
}

/* Checks the checkpoint tensor `name` against ckpt_shape[ckpt_dims] and records it for
 * commit as a device tensor of shape[n_dims] (the same element count). */
static mmrt_status load(struct mmrt_weights *w, struct mmrt_dev *dev, int ckpt_dims,
                        const int64_t *ckpt_shape, int n_dims, const int64_t *shape,
                        enum conversion conv, struct mmrt_tensor *out, struct mmrt_error *err,
                        const char *name)
{
    struct entry *e = find_entry(w, name);
    const struct mmrt_st_tensor *t = e ? e->t : NULL;
    char want[128], got[128];
    shape_str(ckpt_dims, ckpt_shape, want, sizeof want);
    if (!t)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: checkpoint has no tensor '%s' (expected shape %s)", w->path,
                              name, want);
    shape_str(t->n_dims, t->shape, got, sizeof got);
    int same = t->n_dims == ckpt_dims;
    for (int i = 0; same && i < ckpt_dims; i++)
        same = t->shape[i] == ckpt_shape[i];
    if (!same)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: tensor '%s' has shape %s, config.json implies %s", t->file,
                              t->name, got, want);
    if (n_dims > MMRT_MAX_DIMS)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: tensor '%s' has rank %d",
                              t->file, t->name, n_dims);
    uint64_t n_view = 1;
    for (int i = 0; i < n_dims; i++)
        n_view *= (uint64_t)shape[i];
    if (n_view != t->n_elements)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL,
                              "%s: tensor '%s' of %llu elements cannot be viewed as %d-D "
                              "with %llu", t->file, t->name,
                              (unsigned long long)t->n_elements, n_dims,
                              (unsigned long long)n_view);
    const bool integer = t->dtype == MMRT_DTYPE_I8 || t->dtype == MMRT_DTYPE_U4 ||
                         t->dtype == MMRT_DTYPE_I32 || t->dtype == MMRT_ST_DTYPE_I64;
    if (integer != (conv == CONV_CODES))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              integer ? "%s: tensor '%s' holds %s codes, but mmrt reads it as "
                                        "weights of its own (codes are read only as a "
                                        "quantized matrix, docs/QUANTIZATION.md)"
                                      : "%s: tensor '%s' holds %s values where the codes of "
                                        "a quantized matrix belong",
                              t->file, t->name, t->dtype == MMRT_DTYPE_I8    ? "I8"
                                                : t->dtype == MMRT_DTYPE_I32 ? "I32"
                                                : t->dtype == MMRT_ST_DTYPE_I64 ? "I64"
                                                : integer ? "U8 (4-bit)"
                                                          : mmrt_dtype_name_of(t->dtype));
    mmrt_status st = check_finite(t, err);
    if (st != MMRT_OK)
        return st;
    const enum mmrt_dtype dtype = conv == CONV_NONE || conv == CONV_CODES
                                      ? (enum mmrt_dtype)t->dtype
                                  : conv == CONV_I8_VALUES ? MMRT_DTYPE_I8
                                  : conv == CONV_Q4_CODES  ? MMRT_DTYPE_U4
                                                           : MMRT_DTYPE_F32;
    int dims = n_dims;
    int64_t ne[MMRT_MAX_DIMS];
    for (int i = 0; i < n_dims; i++)
        ne[i] = shape[i];
    if (n_dims == 0) { /* a scalar becomes a one-element vector */
        ne[0] = 1;
        dims = 1;
    }
    if (conv == CONV_I8_SCALES) /* one per row of the [N, K] matrix */
        dims = 1;
    else if (conv == CONV_Q4_CODES) /* two codes a byte */
        ne[1] = shape[1] / 2;
    else if (conv == CONV_Q4_SCALES || conv == CONV_Q4_ZEROS) /* [N, G] */
        ne[1] = shape[1] / mmrt_weight_format_group(w->matrix_format);
    return push_pending(w, e, dev, out, conv, dtype, dims, ne, err) ? MMRT_OK
           : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
}

/* Adopted arena of the mapping `base` on dev, adopting it the first time. 0 with *arena NULL
 * when the plugin declines (the caller copies). */
static mmrt_status adopted_arena(struct mmrt_weights *w, struct mmrt_dev *dev, const void *base,
                                 uint64_t size, void **arena, struct mmrt_error *err)
{
    *arena = NULL;
    for (size_t i = 0; i < w->n_held; i++) {
        if (w->held[i].dev == dev && w->held[i].host == base) {
            *arena = w->held[i].arena;
            return MMRT_OK;
        }
    }
    if (!reserve((void **)&w->held, &w->cap_held, w->n_held, sizeof *w->held))
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    struct mmrt_error why = { 0 };
    mmrt_status st = mmrt_dev_adopt_host(dev, base, size, arena, &why);
    if (st == MMRT_ERR_UNSUPPORTED) {
        mmrt_log(MMRT_LOG_INFO, "weights", "%s: copying the weights (%s)", dev->name, why.msg);
        *arena = NULL;
        return MMRT_OK;
    }
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "%s: %s", w->path, why.msg);
    w->held[w->n_held++] = (struct held){ dev, *arena, 0, base };
    return MMRT_OK;
}

/* Whether p's device bytes are the stored ones (so they can stay in the mapping). */
static bool stored_bytes(const struct pending *p)
{
    return p->conv == CONV_NONE || p->conv == CONV_CODES ||
           (p->conv == CONV_F32 && p->t->dtype == MMRT_DTYPE_F32);
}

/* The quantized form of p's matrix in w->q (made once for its two or three tensors, which
 * commit uploads one after the other), a few rows at a time so that even an LM head never
 * needs a float copy of itself. */
/* The published 4-bit packings, both W[n, k] = (q − z) · s with z and s of k's group, so both
 * exactly mmrt's U4 (plugin.h), transposed and repacked:
 *   AWQ (AutoAWQ's GEMM layout, what transformers loads): qweight I32 [K, N/8] holds input
 *     k's outputs 8c … 8c + 7 in one int32, output 8c + AWQ_ORDER[i] in bits 4i … 4i + 3;
 *     qzeros I32 [G, N/8] the zero points packed the same way.
 *   GPTQ: qweight I32 [K/8, N] holds inputs 8r … 8r + 7 of output n, input 8r + i in bits
 *     4i … 4i + 3; qzeros I32 [G, N/8] outputs 8c + i in bits 4i, each zero point minus one
 *     (mod 16) in its first checkpoint format.
 *   compressed-tensors pack-quantized: weight_packed I32 [N, K/8] holds inputs 8w … 8w + 7
 *     of output n, input 8w + i in bits 4i (codes offset by 8 from the signed values, the same
 *     thing); weight_zero_point I32 [N/8, G] outputs 8w + i in bits 4i, or none when
 *     symmetric (every zero point 8).
 * scales [G, N] for AWQ and GPTQ, weight_scale [N, G] for compressed-tensors. */
static const int awq_order[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };

static uint32_t le32(const struct mmrt_st_tensor *t, uint64_t i)
{
    const uint8_t *b = (const uint8_t *)t->data + 4 * i;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Inputs and outputs of a packed matrix, from its qweight's shape. */
static void packed_dims(const struct mmrt_weights *w, const struct mmrt_st_tensor *qw,
                        int64_t *K, int64_t *N)
{
    switch (w->packed.kind) {
    case MMRT_PACKED_AWQ: *K = qw->shape[0]; *N = qw->shape[1] * 8; break;
    case MMRT_PACKED_GPTQ: *K = qw->shape[0] * 8; *N = qw->shape[1]; break;
    default: *K = qw->shape[1] * 8; *N = qw->shape[0]; break;
    }
}

/* Input k and output n of nibble i of word word_i of a packed qweight [K, N]. */
static void packed_code_at(const struct mmrt_weights *w, uint64_t word_i, int i, int64_t K,
                           int64_t N, int64_t *k, int64_t *n)
{
    switch (w->packed.kind) {
    case MMRT_PACKED_AWQ:
        *k = (int64_t)(word_i / (uint64_t)(N / 8));
        *n = (int64_t)(word_i % (uint64_t)(N / 8)) * 8 + awq_order[i];
        break;
    case MMRT_PACKED_GPTQ:
        *k = (int64_t)(word_i / (uint64_t)N) * 8 + i;
        *n = (int64_t)(word_i % (uint64_t)N);
        break;
    default:
        *n = (int64_t)(word_i / (uint64_t)(K / 8));
        *k = (int64_t)(word_i % (uint64_t)(K / 8)) * 8 + i;
        break;
    }
}

static int64_t packed_group(const struct mmrt_weights *w, int64_t K)
{
    return w->packed.group > 0 ? w->packed.group : K;
}

static mmrt_status repack(struct mmrt_weights *w, const struct pending *p, struct mmrt_error *err)
{
    const struct mmrt_st_tensor *qw = p->t, *qz = p->pk_zeros, *sc = p->pk_scales;
    const bool awq = w->packed.kind == MMRT_PACKED_AWQ, ct = w->packed.kind == MMRT_PACKED_CT;
    int64_t K, N;
    packed_dims(w, qw, &K, &N);
    const int64_t G = K / packed_group(w, K);
    const unsigned zero_add = w->packed.kind == MMRT_PACKED_GPTQ && w->packed.zero_minus_one;
    /* Act-order: column j of the repacked matrix holds input perm[j], the inputs of group 0
     * first (in input order), then group 1's, …, so each group is a run of g columns as U4
     * needs (load_packed checked that every group has exactly g inputs). */
    int64_t *col = NULL; /* input k → its column */
    if (p->pk_gidx) {
        const int64_t g = packed_group(w, K);
        w->q.perm = malloc((size_t)K * sizeof *w->q.perm);
        col = malloc((size_t)K * sizeof *col);
        int64_t *fill = calloc((size_t)G, sizeof *fill);
        if (w->q.perm && col && fill)
            for (int64_t k = 0; k < K; k++) {
                const int64_t gi = (int32_t)le32(p->pk_gidx, (uint64_t)k);
                const int64_t j = gi * g + fill[gi]++;
                w->q.perm[j] = (int32_t)k;
                col[k] = j;
            }
        const bool ok = w->q.perm && col && fill;
        free(fill);
        if (!ok) {
            free(col);
            q_cache_drop(w);
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
        }
    }
    w->q.codes = calloc((size_t)(N * K / 2) + 1, 1);
    w->q.scale = malloc((size_t)(N * G) * sizeof(float) + 1);
    w->q.zero = malloc((size_t)(N * G) * sizeof(float) + 1);
    float *s = malloc((size_t)(N * G) * sizeof(float) + 1);
    mmrt_status st = w->q.codes && w->q.scale && w->q.zero && s
                         ? mmrt_safetensors_read_f32(sc, s, (size_t)(N * G), err)
                         : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    for (uint64_t word_i = 0; st == MMRT_OK && word_i < qw->n_elements; word_i++) {
        const uint32_t word = le32(qw, word_i);
        for (int i = 0; i < 8; i++) {
            int64_t k, n; /* the code of input k, output n */
            packed_code_at(w, word_i, i, K, N, &k, &n);
            if (col)
                k = col[k];
            const uint8_t code = (uint8_t)((word >> (4 * i)) & 0xFu);
            uint8_t *b = w->q.codes + n * (K / 2) + (k / 32) * 16 + k % 16;
            *b |= (uint8_t)(k % 32 < 16 ? code : code << 4);
        }
    }
    for (int64_t gi = 0; st == MMRT_OK && gi < G; gi++)
        for (int64_t c = 0; c < N / 8; c++) {
            /* AWQ and GPTQ: qzeros [G, N/8]; compressed-tensors: [N/8, G], or none */
            const uint32_t word = !qz ? 0x88888888u
                                  : le32(qz, ct ? (uint64_t)(c * G + gi)
                                                : (uint64_t)(gi * (N / 8) + c));
            for (int i = 0; i < 8; i++) {
                const int64_t n = 8 * c + (awq ? awq_order[i] : i);
                w->q.zero[n * G + gi] = (float)((((word >> (4 * i)) & 0xFu) + zero_add) & 0xFu);
                w->q.scale[n * G + gi] = ct ? s[n * G + gi] : s[gi * N + n];
            }
        }
    free(s);
    free(col);
    if (st != MMRT_OK) {
        q_cache_drop(w);
        return st;
    }
    w->q.t = p->t;
    return MMRT_OK;
}

/* mmrt_quant_read_fn over a checkpoint tensor [N, K]: rows as floats. */
static mmrt_status read_rows(void *user, int64_t r0, int64_t n, float *dst,
                             struct mmrt_error *err)
{
    const struct mmrt_st_tensor *t = user;
    const int64_t K = t->shape[1];
    return mmrt_safetensors_read_f32_range(t, (uint64_t)(r0 * K), dst, (size_t)(n * K), err);
}

static mmrt_status quantize_matrix(struct mmrt_weights *w, const struct pending *p,
                                   struct mmrt_error *err)
{
    if (w->q.t == p->t)
        return MMRT_OK;
    q_cache_drop(w);
    if (p->conv == CONV_PACKED_CODES || p->conv == CONV_PACKED_SCALES ||
        p->conv == CONV_PACKED_ZEROS || p->conv == CONV_PACKED_PERM)
        return repack(w, p, err);
    const bool q4 = p->conv == CONV_Q4_CODES || p->conv == CONV_Q4_SCALES ||
                    p->conv == CONV_Q4_ZEROS;
    const int64_t N = p->t->shape[0], K = p->t->shape[1];
    const int64_t group = q4 ? mmrt_weight_format_group(p->format) : K;
    const int64_t G = K / group, code_bytes = q4 ? K / 2 : K;
    const int threads = mmrt_quant_threads(); /* asked once: sysconf reads /sys */
    w->q.codes = malloc((size_t)(N * code_bytes) + 1);
    w->q.scale = malloc((size_t)(N * G) * sizeof(float) + 1);
    w->q.zero = q4 ? malloc((size_t)(N * G) * sizeof(float) + 1) : NULL;
    mmrt_status st = w->q.codes && w->q.scale && (w->q.zero || !q4)
                         ? MMRT_OK
                         : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    int64_t bad = 0;
    float bad_value = 0.0f;
    struct mmrt_error read_err = { 0 };
    if (st == MMRT_OK &&
        !mmrt_quant_rows_read(read_rows, (void *)p->t, N, K, q4 ? group : 0, w->q.codes,
                              w->q.scale, w->q.zero, threads, &bad, &bad_value, &read_err)) {
        if (bad >= 0)
            st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                                "%s: tensor '%s' holds %g at [%lld, %lld]: a weight must be "
                                "finite to be quantized", p->t->file, p->t->name,
                                (double)bad_value, (long long)(bad / K), (long long)(bad % K));
        else if (read_err.status == MMRT_ERR_NO_MEMORY) /* a read's error names the tensor */
            st = mmrt_error_set(err, read_err.status, "%s: tensor '%s': %s", p->t->file,
                                p->t->name, read_err.msg);
        else
            st = mmrt_error_set(err, read_err.status, "%s", read_err.msg);
    }
    if (st != MMRT_OK) {
        q_cache_drop(w);
        return st;
    }
    w->q.t = p->t;
    if (w->on_quantized)
        w->on_quantized(w->on_quantized_user, &(const struct mmrt_quantized_matrix){
            .tensor = p->t, .rows = N, .cols = K, .group = q4 ? group : 0,
            .codes = w->q.codes, .scale = w->q.scale, .zero = w->q.zero });
    return MMRT_OK;
}

/* Uploads the part of p's quantized matrix that p is (codes, scales or zero points). */
static mmrt_status upload_quantized(struct mmrt_weights *w, const struct pending *p,
                                    const struct mmrt_tensor *dst, struct mmrt_error *err)
{
    mmrt_status st = quantize_matrix(w, p, err);
    if (st != MMRT_OK)
        return st;
    const void *src = w->q.scale;
    if (p->conv == CONV_I8_VALUES || p->conv == CONV_Q4_CODES || p->conv == CONV_PACKED_CODES)
        src = w->q.codes;
    else if (p->conv == CONV_Q4_ZEROS || p->conv == CONV_PACKED_ZEROS)
        src = w->q.zero;
    else if (p->conv == CONV_PACKED_PERM)
        src = w->q.perm;
    return mmrt_dev_upload(p->dev, dst, src, p->nbytes, err);
}

static mmrt_status upload_tensor(struct mmrt_weights *w, const struct pending *p,
                                 const struct mmrt_tensor *dst, struct mmrt_error *err)
{
    if (p->conv != CONV_NONE && p->conv != CONV_F32 && p->conv != CONV_CODES)
        return upload_quantized(w, p, dst, err);
    if (stored_bytes(p))
        return mmrt_dev_upload(p->dev, dst, p->t->data, p->t->nbytes, err);
    float *tmp = malloc(p->t->n_elements ? p->t->n_elements * sizeof(float) : 1);
    if (!tmp)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    mmrt_status st = mmrt_safetensors_read_f32(p->t, tmp, p->t->n_elements, err);
    if (st == MMRT_OK)
        st = mmrt_dev_upload(p->dev, dst, tmp, p->nbytes, err);
    free(tmp);
    return st;
}

/* Storage only: the caller may have reshaped the descriptor since load (a view of the same
 * contiguous bytes), and that stays. */
static void bind(const struct pending *p, void *arena, uint64_t offset)
{
    p->out->buffer = arena;
    p->out->offset = offset;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return a > 1 ? (x + a - 1) / a * a : x;
}

/* Places the pending tensors of one device: mapped where possible, the rest packed into
 * exact-size arenas, then uploaded. `mapped[i]` says how pending i went. */
static mmrt_status commit_device(struct mmrt_weights *w, struct mmrt_dev *dev, bool *mapped,
                                 struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    uint64_t align = dev->info.alignment ? dev->info.alignment : 1;
    uint64_t cap = dev->info.max_arena_bytes ? dev->info.max_arena_bytes : UINT64_MAX;
    /* Pass 1: what stays in the mapping. */
    for (size_t i = 0; i < w->n_pending && st == MMRT_OK; i++) {
        struct pending *p = &w->pending[i];
        const void *base;
        uint64_t size;
        if (p->dev != dev || !stored_bytes(p) || p->nbytes == 0 ||
            p->t->file_offset % mmrt_dtype_size(p->dtype) != 0 || !mmrt_dev_can_adopt(dev) ||
            !mmrt_safetensors_mapping(w->st, p->t, &base, &size))
            continue;
        void *arena;
        st = adopted_arena(w, dev, base, size, &arena, err);
        if (st != MMRT_OK || !arena)
            continue;
        bind(p, arena, p->t->file_offset);
        mapped[i] = true;
    }
    /* Pass 2: the copies, in load order, packed into as few arenas as the device allows. */
    size_t first = 0;
    while (st == MMRT_OK) {
        while (first < w->n_pending && (w->pending[first].dev != dev || mapped[first]))
            first++;
        if (first == w->n_pending)
            break;
        uint64_t used = 0;
        size_t last = first;
        for (size_t i = first; i < w->n_pending; i++) {
            const struct pending *p = &w->pending[i];
            if (p->dev != dev || mapped[i])
                continue;
            uint64_t at = align_up(used, align), need = p->nbytes ? p->nbytes : 1;
            if (at + need > cap && used > 0)
                break;
            used = at + need;
            last = i + 1;
        }
        if (!reserve((void **)&w->held, &w->cap_held, w->n_held, sizeof *w->held))
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
        void *arena;
        st = mmrt_dev_weight_arena_alloc(dev, used, &arena, err);
        if (st != MMRT_OK)
            return mmrt_error_prefix(err, st, "loading %s", w->path);
        w->held[w->n_held++] = (struct held){ dev, arena, used, NULL };
        uint64_t at = 0;
        for (size_t i = first; i < last && st == MMRT_OK; i++) {
            struct pending *p = &w->pending[i];
            if (p->dev != dev || mapped[i])
                continue;
            at = align_up(at, align);
            struct mmrt_tensor t;
            mmrt_tensor_init(&t, arena, at, p->dtype, p->n_dims, p->ne);
            st = upload_tensor(w, p, &t, err);
            if (st != MMRT_OK)
                return mmrt_error_prefix(err, st, "loading '%s'", p->t->name);
            bind(p, arena, at);
            at += p->nbytes ? p->nbytes : 1;
        }
        first = last;
    }
    return st;
}

mmrt_status mmrt_weights_commit(struct mmrt_weights *w, struct mmrt_error *err)
{
    if (w->n_pending == 0)
        return MMRT_OK;
    if (!reserve((void **)&w->placed, &w->cap_placed, w->n_placed + w->n_pending - 1,
                 sizeof *w->placed))
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    bool *mapped = calloc(w->n_pending, sizeof *mapped);
    if (!mapped)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    mmrt_status st = MMRT_OK;
    for (size_t i = 0; i < w->n_pending && st == MMRT_OK; i++) {
        struct mmrt_dev *dev = w->pending[i].dev;
        size_t j = 0;
        while (j < i && w->pending[j].dev != dev)
            j++;
        if (j == i) /* the first pending tensor of its device */
            st = commit_device(w, dev, mapped, err);
    }
    if (st == MMRT_OK) {
        for (size_t i = 0; i < w->n_pending; i++) {
            const struct pending *p = &w->pending[i];
            struct mmrt_dev_weight_stats *ws = &p->dev->weights;
            ws->tensor_bytes += p->nbytes;
            *(mapped[i] ? &ws->mapped_bytes : &ws->copied_bytes) += p->nbytes;
            ws->n_tensors++;
            w->placed[w->n_placed++] = (struct placed){ p->dev, p->nbytes, mapped[i] };
        }
        w->n_pending = 0;
    }
    q_cache_drop(w);
    free(mapped);
    return st;
}

mmrt_status mmrt_weights_load(struct mmrt_weights *w, struct mmrt_dev *dev, int n_dims,
                              const int64_t *shape, struct mmrt_tensor *out,
                              struct mmrt_error *err, const char *name, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, name);
    vsnprintf(buf, sizeof buf, name, ap);
    va_end(ap);
    return load(w, dev, n_dims, shape, n_dims, shape, CONV_NONE, out, err, buf);
}

mmrt_status mmrt_weights_load_f32(struct mmrt_weights *w, struct mmrt_dev *dev, int n_dims,
                                  const int64_t *shape, struct mmrt_tensor *out,
                                  struct mmrt_error *err, const char *name, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, name);
    vsnprintf(buf, sizeof buf, name, ap);
    va_end(ap);
    return load(w, dev, n_dims, shape, n_dims, shape, CONV_F32, out, err, buf);
}

mmrt_status mmrt_weights_load_as(struct mmrt_weights *w, struct mmrt_dev *dev, int ckpt_dims,
                                 const int64_t *ckpt_shape, int n_dims, const int64_t *shape,
                                 struct mmrt_tensor *out, struct mmrt_error *err,
                                 const char *name, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, name);
    vsnprintf(buf, sizeof buf, name, ap);
    va_end(ap);
    return load(w, dev, ckpt_dims, ckpt_shape, n_dims, shape, CONV_NONE, out, err, buf);
}

void mmrt_weights_set_options(struct mmrt_weights *w, const struct mmrt_model_options *opts)
{
    w->format = opts ? opts->weights : MMRT_WEIGHTS_CHECKPOINT;
    w->on_quantized = opts ? opts->on_quantized : NULL;
    w->on_quantized_user = opts ? opts->on_quantized_user : NULL;
    w->packed = opts ? opts->packed : (struct mmrt_packed_format){ .kind = MMRT_PACKED_NONE };
    w->format_of = opts ? opts->format_of : NULL;
    w->format_of_user = opts ? opts->format_of_user : NULL;
}

/* A zero-point tensor must hold whole numbers 0 … 15 (what a 4-bit code can be offset by):
 * anything else is a broken or hostile file, refused by name before it reaches a kernel. */
static mmrt_status check_zero_points(const struct mmrt_st_tensor *t, struct mmrt_error *err)
{
    for (uint64_t i = 0; i < t->n_elements; i++) {
        float z;
        memcpy(&z, (const uint8_t *)t->data + i * sizeof z, sizeof z);
        if (!(z >= 0.0f && z <= 15.0f) || z != (float)(int)z)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: tensor '%s' holds %g at element %llu (byte offset %llu "
                                  "in the file): a zero point must be a whole number 0 … 15",
                                  t->file, t->name, (double)z, (unsigned long long)i,
                                  (unsigned long long)(t->file_offset + i * sizeof z));
    }
    return MMRT_OK;
}

/* GPTQ's g_idx [K] (the group of each input): k / g without act-order. With act-order
 * (desc_act) the groups are any partition of the inputs into G sets of g, which repack()
 * turns into runs by permuting the columns (and x, at each product: mmrt_weight.perm). Sets
 * *act_order when g_idx is not k / g; a group index outside [0, G) or a group of another
 * size is refused by tensor, input and group. */
static mmrt_status check_gidx(const struct mmrt_st_tensor *t, int64_t K, int64_t g,
                              bool *act_order, struct mmrt_error *err)
{
    *act_order = false;
    if (t->dtype != MMRT_DTYPE_I32 || t->n_dims != 1 || t->shape[0] != K)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor '%s' must be I32 [%lld] (GPTQ, "
                              "one group index per input)", t->file, t->name, (long long)K);
    const int64_t G = K / g;
    int64_t *count = calloc((size_t)G, sizeof *count);
    if (!count)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", t->file);
    mmrt_status st = MMRT_OK;
    for (int64_t k = 0; k < K && st == MMRT_OK; k++) {
        const int64_t gi = (int32_t)le32(t, (uint64_t)k);
        if (gi < 0 || gi >= G)
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor '%s' puts input %lld in group "
                                "%lld, outside the %lld groups of %lld inputs", t->file, t->name,
                                (long long)k, (long long)gi, (long long)G, (long long)g);
        else if (++count[gi] > g)
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor '%s' puts more than %lld "
                                "inputs in group %lld (input %lld is one too many): every group "
                                "holds group_size inputs", t->file, t->name, (long long)g,
                                (long long)gi, (long long)k);
        *act_order |= gi != k / g;
    }
    free(count);
    return st;
}

/* compressed-tensors' weight_shape: the original [N, K] as two integers (I32 or I64). */
static mmrt_status check_shape_tensor(const struct mmrt_st_tensor *t, int64_t N, int64_t K,
                                      struct mmrt_error *err)
{
    int64_t v[2] = { -1, -1 };
    const bool ok_type = t->n_dims == 1 && t->shape[0] == 2 &&
                         (t->dtype == MMRT_DTYPE_I32 || t->dtype == MMRT_ST_DTYPE_I64);
    for (int i = 0; ok_type && i < 2; i++) {
        const uint8_t *b = (const uint8_t *)t->data + i * (t->dtype == MMRT_DTYPE_I32 ? 4 : 8);
        uint64_t x = 0;
        for (int j = (t->dtype == MMRT_DTYPE_I32 ? 3 : 7); j >= 0; j--)
            x = x << 8 | b[j];
        v[i] = t->dtype == MMRT_DTYPE_I32 ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x;
    }
    if (ok_type && v[0] == N && v[1] == K)
        return MMRT_OK;
    return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor '%s' must be the integers [%lld, "
                          "%lld] (compressed-tensors' weight_shape, as config.json implies)",
                          t->file, t->name, (long long)N, (long long)K);
}

/* A matrix packed as published (AWQ, GPTQ, compressed-tensors): `name` is "X.weight" and the
 * checkpoint holds its codes, zero points (unless symmetric) and scales (and GPTQ's g_idx,
 * compressed-tensors' weight_shape). Every shape is checked by name before anything is
 * placed; they become one U4 matrix at commit (repack). */
static mmrt_status load_packed(struct mmrt_weights *w, struct mmrt_dev *dev, int64_t N,
                               int64_t K, struct mmrt_weight *out, struct mmrt_error *err,
                               const char *name)
{
    const int kind = w->packed.kind;
    const bool ct = kind == MMRT_PACKED_CT;
    static const char *const methods[] = { "", "AWQ", "GPTQ", "compressed-tensors" };
    static const char *const a_methods[] = { "", "an AWQ", "a GPTQ", "a compressed-tensors" };
    static const char *const parts[] = {
        "", ".qweight, .qzeros and .scales", ".qweight, .qzeros, .scales and .g_idx",
        ".weight_packed, .weight_scale, .weight_shape and, unless symmetric, .weight_zero_point",
    };
    const char *method = methods[kind], *a_method = a_methods[kind];
    /* the tensors' suffixes: codes, zero points, scales, and the extra one (GPTQ's g_idx,
     * compressed-tensors' weight_shape) */
    const char *const sfx[4] = { ct ? "weight_packed" : "qweight",
                                 ct ? "weight_zero_point" : "qzeros",
                                 ct ? "weight_scale" : "scales", ct ? "weight_shape" : "g_idx" };
    const size_t len = strlen(name);
    char qn[560], zn[560], sn[560], gn[560];
    snprintf(qn, sizeof qn, "%.*s.%s", (int)(len - 7), name, sfx[0]);
    snprintf(zn, sizeof zn, "%.*s.%s", (int)(len - 7), name, sfx[1]);
    snprintf(sn, sizeof sn, "%.*s.%s", (int)(len - 7), name, sfx[2]);
    snprintf(gn, sizeof gn, "%.*s.%s", (int)(len - 7), name, sfx[3]);
    const bool no_zeros = ct && w->packed.symmetric;
    struct entry *eq = find_entry(w, qn), *ez = no_zeros ? NULL : find_entry(w, zn);
    struct entry *es = find_entry(w, sn);
    struct entry *eg = kind == MMRT_PACKED_AWQ ? NULL : find_entry(w, gn);
    const int64_t g = packed_group(w, K), G = K / g;
    if (!eq || (!ez && !no_zeros) || !es || (ct && !eg))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: checkpoint has no '%s' (%s matrix "
                              "is its %s)", w->path, !eq ? qn : !es ? sn : !eg && ct ? gn : zn,
                              a_method, parts[kind]);
    if (K % g != 0 || K % 32 != 0 || N % 8 != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: '%s' [%lld, %lld]: its %lld inputs "
                              "are not whole groups of %lld (quantization_config.group_size) "
                              "of whole 32-weight blocks, or its outputs not whole int32 words",
                              eq->t->file, qn, (long long)N, (long long)K, (long long)K,
                              (long long)g);
    const struct {
        const struct entry *e;
        bool integer;
        int64_t rows, cols;
    } want[3] = {
        { eq, true, kind == MMRT_PACKED_AWQ ? K : kind == MMRT_PACKED_GPTQ ? K / 8 : N,
          kind == MMRT_PACKED_AWQ ? N / 8 : kind == MMRT_PACKED_GPTQ ? N : K / 8 },
        { ez, true, ct ? N / 8 : G, ct ? G : N / 8 },
        { es, false, ct ? N : G, ct ? G : N },
    };
    for (int i = 0; i < 3; i++) {
        if (!want[i].e)
            continue;
        const struct mmrt_st_tensor *t = want[i].e->t;
        const bool is_int = t->dtype == MMRT_DTYPE_I32;
        const bool is_float = t->dtype == MMRT_DTYPE_F32 || t->dtype == MMRT_DTYPE_F16 ||
                              t->dtype == MMRT_DTYPE_BF16;
        if (t->n_dims != 2 || t->shape[0] != want[i].rows || t->shape[1] != want[i].cols ||
            (want[i].integer ? !is_int : !is_float))
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: tensor '%s' must be %s [%lld, %lld] (%s, %lld inputs, "
                                  "%lld outputs, groups of %lld)", t->file, t->name,
                                  want[i].integer ? "I32" : "F16, BF16 or F32",
                                  (long long)want[i].rows, (long long)want[i].cols, method,
                                  (long long)K, (long long)N, (long long)g);
    }
    mmrt_status st = check_finite(es->t, err);
    bool act_order = false;
    if (st == MMRT_OK && eg)
        st = ct ? check_shape_tensor(eg->t, N, K, err)
                : check_gidx(eg->t, K, g, &act_order, err);
    if (st != MMRT_OK)
        return st;
    const int64_t codes[2] = { N, K / 2 }, groups[2] = { N, G }, inputs[1] = { K };
    w->matrix_format = MMRT_WEIGHTS_INT4; /* what its codes are; the group is the checkpoint's */
    if (!push_pending(w, eq, dev, &out->t, CONV_PACKED_CODES, MMRT_DTYPE_U4, 2, codes, err) ||
        !push_pending(w, eq, dev, &out->scale, CONV_PACKED_SCALES, MMRT_DTYPE_F32, 2, groups,
                      err) ||
        !push_pending(w, eq, dev, &out->zero, CONV_PACKED_ZEROS, MMRT_DTYPE_F32, 2, groups,
                      err) ||
        (act_order && !push_pending(w, eq, dev, &out->perm, CONV_PACKED_PERM, MMRT_DTYPE_I32, 1,
                                    inputs, err)))
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
    es->read = true;
    if (ez)
        ez->read = true;
    if (eg)
        eg->read = true;
    for (size_t i = w->n_pending - (act_order ? 4 : 3); i < w->n_pending; i++) {
        w->pending[i].pk_zeros = ez ? ez->t : NULL;
        w->pending[i].pk_scales = es->t;
        w->pending[i].pk_gidx = act_order ? eg->t : NULL;
    }
    return MMRT_OK;
}

/* A matrix stored quantized (docs/QUANTIZATION.md "Checkpoint layout"): codes `name` (I8
 * [N, K], or U8 [N, K/2] for 4-bit), F32 scales `name`_scale ([N], or [N, G]) and, for 4-bit,
 * F32 zero points `name`_zero [N, G]; K / G a multiple of 32 that divides K. Every shape and
 * zero point is checked before anything is placed; the bytes stay in the mapping. */
static mmrt_status load_stored_codes(struct mmrt_weights *w, struct mmrt_dev *dev, int64_t N,
                                     int64_t K, const struct mmrt_st_tensor *codes,
                                     struct mmrt_weight *out, struct mmrt_error *err,
                                     const char *name)
{
    char sname[560], zname[560];
    snprintf(sname, sizeof sname, "%s_scale", name);
    snprintf(zname, sizeof zname, "%s_zero", name);
    const struct mmrt_st_tensor *sc = mmrt_weights_find(w, sname);
    const bool q4 = codes->dtype == MMRT_DTYPE_U4;
    if (!sc)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor '%s' holds %s codes but the "
                              "checkpoint has no '%s' (its scales)", codes->file, codes->name,
                              q4 ? "4-bit" : "I8", sname);
    if (!q4) {
        const int64_t cs[2] = { N, K }, ss[1] = { N };
        mmrt_status st = load(w, dev, 2, cs, 2, cs, CONV_CODES, &out->t, err, name);
        return st == MMRT_OK ? load(w, dev, 1, ss, 1, ss, CONV_NONE, &out->scale, err, sname)
                             : st;
    }
    const int64_t G = sc->n_dims == 2 ? sc->shape[1] : 0;
    if (G < 1 || K % G != 0 || (K / G) % 32 != 0 || K % 32 != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: tensor '%s' has %lld groups per row: groups of 4-bit codes "
                              "must be a multiple of 32 weights dividing the %lld inputs of "
                              "'%s'", sc->file, sc->name, (long long)G, (long long)K, name);
    const struct mmrt_st_tensor *zp = mmrt_weights_find(w, zname);
    if (!zp)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor '%s' holds 4-bit codes but "
                              "the checkpoint has no '%s' (its zero points)", codes->file,
                              codes->name, zname);
    const int64_t cs[2] = { N, K / 2 }, gs[2] = { N, G };
    mmrt_status st = load(w, dev, 2, cs, 2, cs, CONV_CODES, &out->t, err, name);
    if (st == MMRT_OK)
        st = load(w, dev, 2, gs, 2, gs, CONV_NONE, &out->scale, err, sname);
    if (st == MMRT_OK)
        st = load(w, dev, 2, gs, 2, gs, CONV_NONE, &out->zero, err, zname);
    if (st == MMRT_OK && (sc->dtype != MMRT_DTYPE_F32 || zp->dtype != MMRT_DTYPE_F32))
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: the scales and zero points of '%s' must "
                            "be F32", codes->file, name);
    return st == MMRT_OK ? check_zero_points(zp, err) : st;
}

mmrt_status mmrt_weights_load_matrix(struct mmrt_weights *w, struct mmrt_dev *dev, int64_t N,
                                     int64_t K, struct mmrt_weight *out, struct mmrt_error *err,
                                     const char *name, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, name);
    vsnprintf(buf, sizeof buf, name, ap);
    va_end(ap);
    memset(out, 0, sizeof *out);
    const int64_t shape[2] = { N, K };
    const struct mmrt_st_tensor *stored = mmrt_weights_find(w, buf);
    const size_t len = strlen(buf);
    const bool codes = stored && (stored->dtype == MMRT_DTYPE_I8 ||
                                  stored->dtype == MMRT_DTYPE_U4);
    const bool packed = !stored && w->packed.kind != MMRT_PACKED_NONE && len > 7 &&
                        strcmp(buf + len - 7, ".weight") == 0;
    if ((codes || packed) && dev->api->hdr.abi_minor < 3)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: '%s' is stored quantized: device %s has a plugin of ABI "
                              "%u.%u, quantized weights need 1.3", w->path, buf, dev->name,
                              (unsigned)dev->api->hdr.abi_major,
                              (unsigned)dev->api->hdr.abi_minor);
    if (codes)
        return load_stored_codes(w, dev, N, K, stored, out, err, buf);
    if (packed)
        return load_packed(w, dev, N, K, out, err, buf);
    const enum mmrt_weight_format f =
        w->format_of ? w->format_of(w->format_of_user, buf, w->format) : w->format;
    if (f < MMRT_WEIGHTS_CHECKPOINT || f > MMRT_WEIGHTS_INT4_G32)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "%s: format %d for '%s'", w->path, (int)f,
                              buf);
    w->matrix_format = f;
    if (f == MMRT_WEIGHTS_CHECKPOINT)
        return load(w, dev, 2, shape, 2, shape, CONV_NONE, &out->t, err, buf);
    if (dev->api->hdr.abi_minor < 3) /* I8 MATMUL weights came with ABI 1.3 */
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "[model] weights = %s: device %s has a plugin of ABI %u.%u, "
                              "quantized weights need 1.3", mmrt_weight_format_name(f),
                              dev->name, (unsigned)dev->api->hdr.abi_major,
                              (unsigned)dev->api->hdr.abi_minor);
    if (f == MMRT_WEIGHTS_INT8) {
        mmrt_status st = load(w, dev, 2, shape, 2, shape, CONV_I8_VALUES, &out->t, err, buf);
        return st == MMRT_OK
                   ? load(w, dev, 2, shape, 2, shape, CONV_I8_SCALES, &out->scale, err, buf)
                   : st;
    }
    /* INT4: the U4 layout needs K in whole blocks of 32 and whole groups. */
    const int64_t group = mmrt_weight_format_group(f);
    if (K % 32 != 0 || K % group != 0) {
        mmrt_log(MMRT_LOG_INFO, "weights", "%s: '%s' [%lld, %lld] stays as stored: its %lld "
                 "inputs are not whole groups of %lld", w->path, buf, (long long)N, (long long)K,
                 (long long)K, (long long)group);
        return load(w, dev, 2, shape, 2, shape, CONV_NONE, &out->t, err, buf);
    }
    mmrt_status st = load(w, dev, 2, shape, 2, shape, CONV_Q4_CODES, &out->t, err, buf);
    if (st == MMRT_OK)
        st = load(w, dev, 2, shape, 2, shape, CONV_Q4_SCALES, &out->scale, err, buf);
    if (st == MMRT_OK)
        st = load(w, dev, 2, shape, 2, shape, CONV_Q4_ZEROS, &out->zero, err, buf);
    return st;
}
