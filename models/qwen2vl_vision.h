/*
 * models/qwen2vl_vision.h — the Qwen2-VL vision tower and patch merger
 * (Qwen2VisionTransformerPretrainedModel), the vision stage of Qwen2-VL. models.md §4.2.
 *
 * Input: the processor's pixel_values of every image of a request, one after the other,
 * [N, C·T·P·P] (patches in merge-window order, inner order channel, frame, row, column), and
 * each image's grid (t, h, w) in patches.
 *
 *   x = pixel_values · patch_embedᵀ                (Conv3d with kernel = stride, no bias)
 *   per block: x += proj(attn(rot(q), rot(k), v))  q, k, v = split(qkv(LN1(x))), per-head
 *              x += fc2(act(fc1(LN2(x))))          act = hidden_act (quick_gelu)
 *   y = mlp.2(gelu(mlp.0(view(LN_q(x), [N/m², m²·E]))))   exact-erf GELU, m = merge size
 *
 * Attention is bidirectional within each frame of each image and never across: one packed
 * sequence per frame (cu_seqlens of ATTENTION). The rotary embedding is 2-D: head dims
 * [0, hd/4) pair with [hd/2, 3hd/4) and turn by the patch's row, [hd/4, hd/2) with
 * [3hd/4, hd) by its column, frequencies 1/θ^(2i/(hd/2)) restarting for the column half
 * (ROPE_MULTI {n_rot hd, freq_dim hd/2, restart 1, sections (hd/4, hd/4)}). Row and column
 * are the patch's coordinates in the image's patch grid, taken in the merge-window order of
 * the pixels. LayerNorm eps is 1e-6 everywhere (hard-coded in transformers).
 *
 * Weights (canonical names, models.md §4.6): visual.patch_embed.proj.weight [E, C, T, P, P]
 * (used as [E, C·T·P·P]), visual.blocks.{i}.{norm1,norm2}.{weight,bias},
 * visual.blocks.{i}.attn.qkv [3E, E] (+bias), attn.proj [E, E] (+bias),
 * mlp.fc1 [I, E], mlp.fc2 [E, I] (+biases), visual.merger.ln_q [E], visual.merger.mlp.0
 * [m²E, m²E], visual.merger.mlp.2 [D, m²E] (+biases); D = hidden_size (the decoder's).
 */
#ifndef MMRT_MODELS_QWEN2VL_VISION_H
#define MMRT_MODELS_QWEN2VL_VISION_H

#include <jansson.h>

#include "device.h"
#include "weights.h"

struct mmrt_qwen2vl_vision_config {
    int64_t depth;        /* blocks */
    int64_t embed_dim;    /* E */
    int64_t hidden;       /* D: merger output, the decoder's hidden size */
    int64_t n_heads;      /* E / n_heads = head dim, a multiple of 4, at most 256 */
    int64_t mlp_hidden;   /* I = int(E · mlp_ratio) */
    int64_t channels;     /* in_channels (in_chans in hub files); 3 */
    int64_t patch;        /* P */
    int64_t merge;        /* spatial_merge_size m */
    int64_t temporal;     /* temporal_patch_size T */
    double rope_theta;    /* rope_parameters.rope_theta, default 10000 */
    enum mmrt_op act;     /* hidden_act of the block MLP: QUICK_GELU, GELU, GELU_TANH, SILU */
};

/* Reads vision_config with the Qwen2VLVisionConfig defaults of models.md §4.1 (depth 32,
 * embed_dim 1280, hidden_size 3584, quick_gelu, mlp_ratio 4, 16 heads, 3 channels, patch
 * 14, merge 2, temporal 2). MMRT_ERR_FORMAT / MMRT_ERR_UNSUPPORTED naming `what` and the
 * key for sizes out of range, a head size that is not a multiple of 4 (the 2-D rotary
 * splits it in quarters), channels other than 3, an unknown activation. */
mmrt_status mmrt_qwen2vl_vision_config_parse(const json_t *cfg, const char *what,
                                             struct mmrt_qwen2vl_vision_config *out,
                                             struct mmrt_error *err);

struct mmrt_qwen2vl_vision_block {
    struct mmrt_tensor norm1_w, norm1_b, qkv_b, proj_b, norm2_w, norm2_b, fc1_b, fc2_b;
    struct mmrt_weight qkv_w, proj_w, fc1_w, fc2_w;
};

struct mmrt_qwen2vl_vision {
    struct mmrt_qwen2vl_vision_config cfg;
    struct mmrt_dev *dev;
    struct mmrt_weight patch_w;                 /* [E, C·T·P·P], as stored */
    struct mmrt_qwen2vl_vision_block *blocks;   /* [depth] */
    struct mmrt_tensor ln_q_w, ln_q_b;          /* [E] */
    struct mmrt_weight mlp0_w, mlp2_w;          /* [m²E, m²E], [D, m²E] */
    struct mmrt_tensor mlp0_b, mlp2_b;          /* [m²E], [D] */
};

/* Loads the tower's weights (canonical names visual.*) onto dev, each shape checked against
 * cfg first. The blocks belong to w; mmrt_qwen2vl_vision_unload frees only the table. */
mmrt_status mmrt_qwen2vl_vision_load(struct mmrt_qwen2vl_vision *v, struct mmrt_weights *w,
                                     struct mmrt_dev *dev,
                                     const struct mmrt_qwen2vl_vision_config *cfg,
                                     struct mmrt_error *err);
void mmrt_qwen2vl_vision_unload(struct mmrt_qwen2vl_vision *v);

/* Runs the tower and the merger on n_images images.
 *   pixels    host [N][C·T·P·P], N = Σ t·h·w over grid_thw
 *   grid_thw  host [n_images][3], each h and w a multiple of the merge size
 *   features  host [N / m²][D], written on success
 * Activations live in the device pool for the call only. */
mmrt_status mmrt_qwen2vl_vision_forward(struct mmrt_qwen2vl_vision *v, const float *pixels,
                                        int n_images, const int32_t *grid_thw, float *features,
                                        struct mmrt_error *err);

/* The operators the tower launches (besides cfg.act), for placement checks. */
extern const enum mmrt_op mmrt_qwen2vl_vision_ops[];
extern const int mmrt_qwen2vl_vision_n_ops;

#endif
