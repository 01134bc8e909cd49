/*
 * models/persimmon.h — the Persimmon decoder: the language stage of Fuyu. models.md §5.2.
 *
 *   h = embeddings
 *   per layer: x = LN_in(h); [q|k|v] per head = Wqkv·x + b     (rows interleaved per head)
 *              q = LN_q(q), k = LN_k(k) over head_dim            (when qk_layernorm)
 *              rope (NeoX) on the first n_rot = int(head_dim · partial_rotary_factor) dims
 *              h += Wo·attn(q, k, v) + bo                        (causal, no GQA)
 *              h += W2·relu(W1·LN_post(h) + b1)² + b2
 *   logits = lm_head · LN_final(h)   (each sequence's last row of a step, no bias)
 *
 * The K/V of every sequence live in the decoder's page store (kv_cache.h); the generation
 * engine (engine.h) runs the decoder through m->dec.
 */
#ifndef MMRT_MODELS_PERSIMMON_H
#define MMRT_MODELS_PERSIMMON_H

#include <jansson.h>
#include <stdbool.h>

#include "decoder.h"
#include "device.h"
#include "kv_cache.h"
#include "model.h"
#include "weights.h"

struct mmrt_persimmon_config {
    int64_t vocab, hidden, intermediate, n_layers, n_heads, head_dim, n_rot;
    int64_t max_positions;
    double ln_eps, rope_theta, partial_rotary_factor;
    bool qk_layernorm, tie_word_embeddings;
    int64_t bos_id, eos_id; /* -1 when absent */
};

/* Reads a persimmon text config (`cfg`: config.json's text_config, or the top level of a flat
 * Fuyu hub config) with the FuyuConfig/PersimmonConfig defaults of models.md §5.1 for missing
 * keys; `top` (may be NULL) is consulted for tie_word_embeddings. Refuses zero or huge sizes,
 * hidden % heads != 0, a rotary dim count that is odd or zero, activations other than relu2,
 * rope types other than default, non-positive eps/theta. `what` names the source. */
mmrt_status mmrt_persimmon_config_parse(const json_t *cfg, const json_t *top, const char *what,
                                        struct mmrt_persimmon_config *out,
                                        struct mmrt_error *err);

struct mmrt_persimmon_layer {
    struct mmrt_tensor ln_in_w, ln_in_b;
    struct mmrt_weight qkv_w;               /* [3·hidden, hidden]; per-head q,k,v */
    struct mmrt_tensor qkv_b;               /* [3·hidden] */
    struct mmrt_tensor q_ln_w, q_ln_b, k_ln_w, k_ln_b; /* [head_dim]; absent without qk LN */
    struct mmrt_weight dense_w;
    struct mmrt_tensor dense_b;
    struct mmrt_tensor ln_post_w, ln_post_b;
    struct mmrt_weight up_w, down_w;
    struct mmrt_tensor up_b, down_b;
};

struct mmrt_persimmon {
    struct mmrt_persimmon_config cfg;
    struct mmrt_dev *dev;
    struct mmrt_tensor embed;                /* [vocab, hidden] */
    struct mmrt_tensor final_w, final_b;     /* [hidden] */
    struct mmrt_weight lm_head;              /* [vocab, hidden]; the embedding when tied */
    struct mmrt_persimmon_layer *layers;
    struct mmrt_kv_pages kv;                 /* the paged K/V store */
    struct mmrt_decoder dec;                 /* what the engine runs (decoder.h) */
};

/* Loads the decoder's weights (canonical names language_model.*, lm_head.weight) onto dev.
 * The weight blocks belong to w; mmrt_persimmon_unload frees only the layer table. */
mmrt_status mmrt_persimmon_load(struct mmrt_persimmon *m, struct mmrt_weights *w,
                                struct mmrt_dev *dev, const struct mmrt_persimmon_config *cfg,
                                const struct mmrt_model_options *opts, struct mmrt_error *err);
void mmrt_persimmon_unload(struct mmrt_persimmon *m);

/* Head slice `which` (0 q, 1 k, 2 v) of the fused qkv output [S, H, 3, hd], as a strided
 * [S, H, hd] view. */
struct mmrt_tensor mmrt_persimmon_qkv_part(const struct mmrt_tensor *qkv, int which);

/* The operators the decoder launches, for placement checks. */
extern const enum mmrt_op mmrt_persimmon_ops[];
extern const int mmrt_persimmon_n_ops;

#endif
