/*
 * models/weights.c — canonical names over a safetensors set, and uploads with shape checks.
 *
 * Index: an array of (canonical name, tensor) sorted by name, searched with bsearch. Loaded
 * blocks are kept in a growing array (device + pool block) and freed together.
 */
#include "weights.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    char *name;
    const struct mmrt_st_tensor *t;
};

struct loaded {
    struct mmrt_dev *dev;
    struct mmrt_dev_tensor t;
};

struct mmrt_weights {
    char *path;
    struct mmrt_safetensors *st;
    struct entry *entries;
    size_t n_entries;
    struct loaded *loaded;
    size_t n_loaded, cap_loaded;
};

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
    for (size_t i = w->n_loaded; i-- > 0;)
        mmrt_dev_tensor_free(w->loaded[i].dev, &w->loaded[i].t);
    free(w->loaded);
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

const struct mmrt_st_tensor *mmrt_weights_find(const struct mmrt_weights *w, const char *name)
{
    struct entry key = { .name = (char *)name };
    const struct entry *e = bsearch(&key, w->entries, w->n_entries, sizeof *w->entries,
                                    entry_cmp);
    return e ? e->t : NULL;
}

const char *mmrt_weights_path(const struct mmrt_weights *w)
{
    return w->path;
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

/* Checks the checkpoint tensor `name` against ckpt_shape[ckpt_dims], then allocates the
 * device tensor as shape[n_dims] (the same element count) and uploads it. */
static mmrt_status load(struct mmrt_weights *w, struct mmrt_dev *dev, int ckpt_dims,
                        const int64_t *ckpt_shape, int n_dims, const int64_t *shape,
                        bool to_f32, struct mmrt_tensor *out, struct mmrt_error *err,
                        const char *name)
{
    const struct mmrt_st_tensor *t = mmrt_weights_find(w, name);
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
    if (w->n_loaded == w->cap_loaded) {
        size_t cap = w->cap_loaded ? 2 * w->cap_loaded : 64;
        struct loaded *grown = realloc(w->loaded, cap * sizeof *grown);
        if (!grown)
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
        w->loaded = grown;
        w->cap_loaded = cap;
    }
    struct loaded *l = &w->loaded[w->n_loaded];
    enum mmrt_dtype dtype = to_f32 ? MMRT_DTYPE_F32 : (enum mmrt_dtype)t->dtype;
    int64_t ne[MMRT_MAX_DIMS];
    int nd = n_dims;
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
    for (int i = 0; i < n_dims; i++)
        ne[i] = shape[i];
    if (nd == 0) { /* a scalar becomes a one-element vector */
        ne[0] = 1;
        nd = 1;
    }
    mmrt_status st = mmrt_dev_tensor_alloc(dev, dtype, nd, ne, &l->t, err);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "loading '%s'", name);
    if (to_f32 && t->dtype != MMRT_DTYPE_F32) {
        float *tmp = malloc(t->n_elements ? t->n_elements * sizeof(float) : 1);
        if (!tmp) {
            mmrt_dev_tensor_free(dev, &l->t);
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", w->path);
        }
        st = mmrt_safetensors_read_f32(t, tmp, t->n_elements, err);
        if (st == MMRT_OK)
            st = mmrt_dev_upload(dev, &l->t.t, tmp, t->n_elements * sizeof(float), err);
        free(tmp);
    } else {
        st = mmrt_dev_upload(dev, &l->t.t, t->data, t->nbytes, err);
    }
    if (st != MMRT_OK) {
        mmrt_dev_tensor_free(dev, &l->t);
        return st;
    }
    l->dev = dev;
    w->n_loaded++;
    *out = l->t.t;
    return MMRT_OK;
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
    return load(w, dev, n_dims, shape, n_dims, shape, false, out, err, buf);
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
    return load(w, dev, n_dims, shape, n_dims, shape, true, out, err, buf);
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
    return load(w, dev, ckpt_dims, ckpt_shape, n_dims, shape, false, out, err, buf);
}
