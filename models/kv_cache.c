/* models/kv_cache.c — the decoders' K/V cache and token embedding (see kv_cache.h). */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "ops.h"

void mmrt_kv_cache_free(struct mmrt_dev *dev, struct mmrt_kv_cache *c)
{
    for (int64_t i = 0; c->k && i < c->n_layers; i++) {
        mmrt_dev_tensor_free(dev, &c->v[i]);
        mmrt_dev_tensor_free(dev, &c->k[i]);
    }
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

mmrt_status mmrt_kv_cache_alloc(struct mmrt_dev *dev, int64_t n_layers, int64_t n_ctx,
                                int64_t n_kv_heads, int64_t head_dim, struct mmrt_kv_cache *out,
                                struct mmrt_error *err)
{
    struct mmrt_kv_cache c = { .n_ctx = n_ctx, .n_layers = n_layers };
    c.k = calloc((size_t)n_layers, sizeof *c.k);
    c.v = calloc((size_t)n_layers, sizeof *c.v);
    if (!c.k || !c.v) {
        free(c.k);
        free(c.v);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "KV cache: out of memory");
    }
    const int64_t ne[3] = { n_ctx, n_kv_heads, head_dim };
    for (int64_t i = 0; i < n_layers; i++) {
        mmrt_status st = mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 3, ne, &c.k[i], err);
        if (st == MMRT_OK)
            st = mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 3, ne, &c.v[i], err);
        if (st != MMRT_OK) {
            mmrt_kv_cache_free(dev, &c);
            return mmrt_error_prefix(err, st, "KV cache for %lld positions × %lld layers",
                                     (long long)n_ctx, (long long)n_layers);
        }
    }
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_embed_tokens(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                              int64_t vocab, const int32_t *ids, int64_t n,
                              const struct mmrt_tensor *out, struct mmrt_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "token id %d at position %lld is outside the vocabulary (%lld)",
                                  ids[i], (long long)i, (long long)vocab);
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, dev);
    struct mmrt_tensor t_ids;
    mmrt_status st = mmrt_scratch_tensor(&s, MMRT_DTYPE_I32, 1, (const int64_t[]){ n }, &t_ids,
                                         err);
    if (st == MMRT_OK)
        st = mmrt_dev_upload(dev, &t_ids, ids, (uint64_t)n * sizeof(int32_t), err);
    if (st == MMRT_OK)
        st = mmrt_op_get_rows(dev, table, &t_ids, out, err);
    mmrt_scratch_release(&s);
    return st;
}
