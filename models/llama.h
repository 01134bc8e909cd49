/*
 * models/llama.h — the LLaMA-family decoder (LLaMA, Vicuna, Mistral math): the language
 * stage of LLaVA-1.5 and LLaVA-NeXT (models.md §2.4), and with two switches the Qwen2
 * decoder of Qwen2-VL (§4.3): biases on q/k/v only (qkv_bias) and multimodal rotary
 * positions (M-RoPE, n_mrope_axes = 3).
 *
 *   h = embeddings
 *   per layer: h += Wo·attn(rope(Wq·rms(h)), rope(Wk·rms(h)), Wv·rms(h))   (causal, GQA)
 *              h += Wd·(silu(Wg·rms(h)) ⊙ Wu·rms(h))
 *   logits = lm_head · rms(h)   (the rows the step asks for: each sequence's last)
 *
 * Positions. Plain RoPE turns every head dim pair by one position per token. M-RoPE gives
 * each token a (t, h, w) position triple and splits the head_dim/2 frequency pairs into
 * mrope_section[0] pairs turned by t, then [1] by h, then [2] by w (ROPE_MULTI with
 * restart 0). Text tokens have t = h = w, so text alone is plain RoPE; image tokens get
 * their grid coordinates. After a prompt whose largest position is P, generation continues
 * at P + 1 on every axis: the prompt (model.h) carries rope_delta = P + 1 − prompt length,
 * and a token at cache slot n gets position n + rope_delta.
 *
 * The K/V of every sequence live in the decoder's page store (kv_cache.h); the generation
 * engine (engine.h) runs the decoder through m->dec over a step's token rows of many
 * sequences at once.
 */
#ifndef MMRT_MODELS_LLAMA_H
#define MMRT_MODELS_LLAMA_H

#include <jansson.h>
#include <stdbool.h>

#include "decoder.h"
#include "device.h"
#include "kv_cache.h"
#include "model.h"
#include "weights.h"

struct mmrt_llama_config {
    int64_t vocab, hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim;
    int64_t max_positions;
    double rms_eps, rope_theta;
    bool attention_bias;  /* q, k, v and o projections have biases (LLaMA attention_bias) */
    bool qkv_bias;        /* q, k, v have biases, o does not (Qwen2) */
    bool mlp_bias, tie_word_embeddings;
    int64_t bos_id, eos_id, pad_id; /* -1 when absent */
    int n_mrope_axes;           /* 0: plain RoPE; 3: M-RoPE over (t, h, w) (Qwen2-VL) */
    int32_t mrope_section[3];   /* frequency pairs per axis, summing to head_dim / 2 */
    int32_t sliding_window;     /* Mistral: every layer's query at position p sees positions
                                   p − sliding_window < j ≤ p; 0 = all earlier positions */
};

/* Reads a text config (`cfg`, e.g. config.json's text_config) with the class defaults of
 * models.md for missing keys:
 *   model_type llama / mistral (§2.1): plain RoPE, attention_bias as configured; mistral
 *     also reads sliding_window: an integer ≥ 1, null for none, and when the key is absent
 *     MistralConfig's default 4096 (transformers 5 applies that default to a config.json
 *     without the key; llava-hf's mistral checkpoints spell null). A llama config has no
 *     window whatever it says (LlamaConfig has no such field);
 *   model_type qwen2_vl_text (§4.1): Qwen2VLTextConfig defaults, qkv_bias, M-RoPE with
 *     mrope_section from rope_parameters or rope_scaling (rope type "mrope" or "default";
 *     required, and must sum to head_dim / 2), hidden_act silu, no sliding window;
 *   model_type qwen2_vl: a whole Qwen2-VL config.json; its text_config (read as
 *     qwen2_vl_text, model_type optional) or, when absent, the top level as hub files have
 *     it (models.md §1.6 rule 2).
 * `top` (may be NULL) is consulted for tie_word_embeddings. Refuses zero or huge sizes,
 * hidden % heads != 0, heads % kv_heads != 0, a head dim above 256 (given, or hidden / heads
 * by default), non-finite or non-positive theta/eps, unsupported rope scaling. `what` names
 * the source in messages. *out is written only on success. */
mmrt_status mmrt_llama_config_parse(const json_t *cfg, const json_t *top, const char *what,
                                    struct mmrt_llama_config *out, struct mmrt_error *err);

struct mmrt_llama_layer {
    struct mmrt_tensor attn_norm, bq, bk, bv, bo, mlp_norm;
    struct mmrt_weight wq, wk, wv, wo, wg, wu, wd;
};

struct mmrt_llama {
    struct mmrt_llama_config cfg;
    struct mmrt_dev *dev;
    struct mmrt_tensor embed;   /* [vocab, hidden] */
    struct mmrt_tensor norm;    /* [hidden] */
    struct mmrt_weight lm_head; /* [vocab, hidden]; the embedding when tied */
    struct mmrt_llama_layer *layers;
    struct mmrt_kv_pages kv;    /* the paged K/V store every sequence draws from */
    struct mmrt_decoder dec;    /* what the engine runs (decoder.h); self = this struct */
};

/* Loads the decoder's weights (canonical names language_model.*, lm_head.weight) onto dev.
 * The weight blocks belong to w; mmrt_llama_unload frees only the layer table. */
mmrt_status mmrt_llama_load(struct mmrt_llama *m, struct mmrt_weights *w, struct mmrt_dev *dev,
                            const struct mmrt_llama_config *cfg,
                            const struct mmrt_model_options *opts, struct mmrt_error *err);
void mmrt_llama_unload(struct mmrt_llama *m);


/* The operators the LLaMA decoder (plain RoPE) launches, for placement checks. */
extern const enum mmrt_op mmrt_llama_ops[];
extern const int mmrt_llama_n_ops;

/* The operators the decoder with configuration c launches (ROPE_MULTI in place of ROPE for
 * M-RoPE) into ops[], which holds at least mmrt_llama_n_ops; returns their count. */
int mmrt_llama_required_ops(const struct mmrt_llama_config *c, enum mmrt_op *ops);

#endif
