/*
 * models/llama.h — the LLaMA-family decoder (LLaMA, Vicuna, Mistral math): the language
 * stage of LLaVA-1.5 and LLaVA-NeXT. models.md §2.4.
 *
 *   h = embeddings
 *   per layer: h += Wo·attn(rope(Wq·rms(h)), rope(Wk·rms(h)), Wv·rms(h))   (causal, GQA)
 *              h += Wd·(silu(Wg·rms(h)) ⊙ Wu·rms(h))
 *   logits = lm_head · rms(h)   (last position only)
 *
 * The KV cache holds, per layer, K and V as [n_ctx, n_kv_heads, head_dim] F32 in the
 * language device's pool; one cache serves one sequence.
 */
#ifndef MMRT_MODELS_LLAMA_H
#define MMRT_MODELS_LLAMA_H

#include <jansson.h>
#include <stdbool.h>

#include "device.h"
#include "weights.h"

struct mmrt_llama_config {
    int64_t vocab, hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim;
    int64_t max_positions;
    double rms_eps, rope_theta;
    bool attention_bias, mlp_bias, tie_word_embeddings;
    int64_t bos_id, eos_id, pad_id; /* -1 when absent */
};

/* Reads a llama/mistral text config (`cfg`, e.g. config.json's text_config) with the
 * class defaults of models.md §2.1 for missing keys; `top` (may be NULL) is consulted for
 * tie_word_embeddings. Refuses zero or huge sizes, hidden % heads != 0, heads % kv_heads
 * != 0, non-finite or non-positive theta/eps, unsupported rope scaling. `what` names the
 * source in messages. */
mmrt_status mmrt_llama_config_parse(const json_t *cfg, const json_t *top, const char *what,
                                    struct mmrt_llama_config *out, struct mmrt_error *err);

struct mmrt_llama_layer {
    struct mmrt_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo;
    struct mmrt_tensor mlp_norm, wg, wu, wd;
};

struct mmrt_llama {
    struct mmrt_llama_config cfg;
    struct mmrt_dev *dev;
    struct mmrt_tensor embed;   /* [vocab, hidden] */
    struct mmrt_tensor norm;    /* [hidden] */
    struct mmrt_tensor lm_head; /* [vocab, hidden]; the embedding when tied */
    struct mmrt_llama_layer *layers;
};

/* Loads the decoder's weights (canonical names language_model.*, lm_head.weight) onto dev.
 * The weight blocks belong to w; mmrt_llama_unload frees only the layer table. */
mmrt_status mmrt_llama_load(struct mmrt_llama *m, struct mmrt_weights *w, struct mmrt_dev *dev,
                            const struct mmrt_llama_config *cfg, struct mmrt_error *err);
void mmrt_llama_unload(struct mmrt_llama *m);

struct mmrt_kv_cache {
    int64_t n_ctx;              /* capacity in positions */
    int64_t n_past;             /* positions filled */
    int64_t n_layers;
    struct mmrt_dev_tensor *k;  /* [n_layers] each [n_ctx, n_kv_heads, head_dim] F32 */
    struct mmrt_dev_tensor *v;
};

/* Reserves a cache for n_ctx positions from the decoder device's pool
 * (MMRT_ERR_OUT_OF_POOL names the bytes). */
mmrt_status mmrt_kv_cache_create(const struct mmrt_llama *m, int64_t n_ctx,
                                 struct mmrt_kv_cache *out, struct mmrt_error *err);
void mmrt_kv_cache_destroy(const struct mmrt_llama *m, struct mmrt_kv_cache *c);

/* Token embeddings of ids[n] into out ([n, hidden] F32 on the decoder device). */
mmrt_status mmrt_llama_embed(struct mmrt_llama *m, const int32_t *ids, int64_t n,
                             const struct mmrt_tensor *out, struct mmrt_error *err);

/* Runs embeddings [S, hidden] (on the decoder device) at positions n_past … n_past+S−1,
 * appends them to the cache and writes the last position's logits to logits[vocab]. */
mmrt_status mmrt_llama_forward(struct mmrt_llama *m, struct mmrt_kv_cache *cache,
                               const struct mmrt_tensor *embeds, float *logits,
                               struct mmrt_error *err);

/* The operators the decoder launches, for placement checks. */
extern const enum mmrt_op mmrt_llama_ops[];
extern const int mmrt_llama_n_ops;

#endif
