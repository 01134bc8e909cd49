/*
 * models/clip.h — the CLIP vision tower (CLIPVisionTransformer) as LLaVA uses it.
 * models.md §2.2 and §1.5.
 *
 *   x = patch_embed(pixels) (no bias); x = [class_embedding; x] + position_embedding
 *   hidden[0] = pre_layrnorm(x)
 *   hidden[i+1] = layer_i(hidden[i]),  layer: h += out(MHA(ln1(h))); h += fc2(act(fc1(ln2(h))))
 *
 * Only the layers up to the one a caller needs are loaded and run (LLaVA's default −2
 * never uses the last layer); post_layernorm is never used.
 */
#ifndef MMRT_MODELS_CLIP_H
#define MMRT_MODELS_CLIP_H

#include <jansson.h>

#include "device.h"
#include "weights.h"

struct mmrt_clip_config {
    int64_t hidden, intermediate, n_layers, n_heads, image_size, patch, channels;
    double ln_eps;
    enum mmrt_op act; /* MMRT_OP_QUICK_GELU, GELU or GELU_TANH */
};

/* Reads a clip_vision_model config with the CLIPVisionConfig defaults of models.md §2.1. */
mmrt_status mmrt_clip_config_parse(const json_t *cfg, const char *what,
                                   struct mmrt_clip_config *out, struct mmrt_error *err);

struct mmrt_clip_layer {
    struct mmrt_tensor ln1_w, ln1_b, bq, bk, bv, bo, ln2_w, ln2_b, fc1_b, fc2_b;
    struct mmrt_weight wq, wk, wv, wo, fc1_w, fc2_w;
};

struct mmrt_clip {
    struct mmrt_clip_config cfg;
    struct mmrt_dev *dev;
    int64_t n_loaded;              /* layers loaded and runnable */
    struct mmrt_tensor class_emb;  /* [1, hidden] F32 */
    struct mmrt_tensor patch_w;    /* [hidden, channels, patch, patch] */
    struct mmrt_tensor pos_emb;    /* [n_patches + 1, hidden] */
    struct mmrt_tensor pre_ln_w, pre_ln_b;
    struct mmrt_clip_layer *layers;
};

/* Loads the embeddings, pre_layrnorm and the first n_layers layers (canonical names
 * vision_tower.*). */
mmrt_status mmrt_clip_load(struct mmrt_clip *m, struct mmrt_weights *w, struct mmrt_dev *dev,
                           const struct mmrt_clip_config *cfg, int64_t n_layers,
                           struct mmrt_error *err);
void mmrt_clip_unload(struct mmrt_clip *m);

/* Images one pass of the tower takes together (mmrt_clip_forward). */
#define MMRT_CLIP_MAX_BATCH 32

/* hidden_states[n_layers] for pixels [B, channels, image_size, image_size] F32 (on the
 * tower's device; 1 ≤ B ≤ MMRT_CLIP_MAX_BATCH), into out [B · (n_patches + 1), hidden] F32,
 * image b's rows after image b − 1's. n_layers ≤ m->n_loaded. Each image attends within
 * itself, and the matrix products see B · (n_patches + 1) rows: an image's rows are the bits
 * it gets alone whenever n_patches + 1 > MMRT_SMALL_M (plugin.h, batch invariance). */
mmrt_status mmrt_clip_forward(struct mmrt_clip *m, const struct mmrt_tensor *pixels,
                              int64_t n_layers, const struct mmrt_tensor *out,
                              struct mmrt_error *err);

extern const enum mmrt_op mmrt_clip_ops[];
extern const int mmrt_clip_n_ops;

#endif
