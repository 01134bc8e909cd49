/*
 * models/kv_cache.h — what every decoder keeps per sequence, and how token ids become
 * embeddings: the K/V cache ([n_ctx, n_kv_heads, head_dim] F32 per layer, in the language
 * device's pool) and GET_ROWS of an embedding table after checking the ids on the host.
 */
#ifndef MMRT_MODELS_KV_CACHE_H
#define MMRT_MODELS_KV_CACHE_H

#include "device.h"

struct mmrt_kv_cache {
    int64_t n_ctx;              /* capacity in positions */
    int64_t n_past;             /* positions filled */
    int64_t rope_delta;         /* rotary position of slot n is n + rope_delta (0 unless
                                   M-RoPE; set by the caller after the prefill) */
    int64_t n_layers;
    struct mmrt_dev_tensor *k;  /* [n_layers] each [n_ctx, n_kv_heads, head_dim] F32 */
    struct mmrt_dev_tensor *v;
};

/* Reserves a cache for n_ctx positions on dev (MMRT_ERR_OUT_OF_POOL names the bytes). */
mmrt_status mmrt_kv_cache_alloc(struct mmrt_dev *dev, int64_t n_layers, int64_t n_ctx,
                                int64_t n_kv_heads, int64_t head_dim, struct mmrt_kv_cache *out,
                                struct mmrt_error *err);
/* Frees what alloc reserved; a zeroed cache is a no-op. */
void mmrt_kv_cache_free(struct mmrt_dev *dev, struct mmrt_kv_cache *c);

/* out[i] = table[ids[i]] ([n, hidden] F32 on dev). An id outside [0, vocab) is refused on
 * the host with its position, before anything runs. */
mmrt_status mmrt_embed_tokens(struct mmrt_dev *dev, const struct mmrt_tensor *table,
                              int64_t vocab, const int32_t *ids, int64_t n,
                              const struct mmrt_tensor *out, struct mmrt_error *err);

#endif
