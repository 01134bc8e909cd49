/*
 * tools/bench/shapes.c — the published shapes mmrt-bench knows, and the work of a request.
 *
 * Dimensions are copied from the models' config.json on the Hugging Face hub (hf_id;
 * models.md §2.1, §4.1, §5.1); the `tiny*` shapes are one small model per family, quick
 * enough for a CI smoke test.
 *
 * Work accounting (bench_work_compute) counts multiply-adds of the matrix products as 2 flop
 * and bias additions as 1, and ignores norms, activations, rotary and softmax (well under 1%
 * of the flops of these shapes). Attention over T keys costs 4·T·width per query (QKᵀ and
 * PV); causal attention over a prompt of S tokens therefore 2·S·(S + 1)·width in all.
 *   vision, LLaVA     patch embedding + per CLIP layer run (q, k, v, o, fc1, fc2 and the
 *                     attention over all T = patches + 1 tokens) + the 2-layer projector
 *   vision, Qwen2-VL  patch embedding (Conv3d over 3·2·14·14) + per block (qkv, proj, fc1,
 *                     fc2, bidirectional attention over the image's N patches) + the merger
 *                     (N/4 rows of 4E → 4E → hidden)
 *   vision, Fuyu      the patch projection (N patches of 3·30·30 → hidden)
 *   prefill           per decoder layer its projections × S tokens (+ Qwen2's q/k/v biases,
 *                     + all of Persimmon's biases) + causal attention over the query width
 *                     (GQA shares K and V, not the query-side work) + the LM head for the
 *                     last position
 *   decode            every language weight read once per token (layers with their norms
 *                     and biases, final norm, LM head, one embedding row) + K and V of every
 *                     cached position (at the mean position of the decode steps)
 */
#include <math.h>
#include <string.h>

#include "bench.h"

static const struct bench_shape shapes[] = {
    {
        .name = "llava-1.5-7b", .hf_id = "llava-hf/llava-1.5-7b-hf", .family = BENCH_LLAVA,
        .model_type = "llava",
        .v_hidden = 1024, .v_inter = 4096, .v_layers = 24, .v_heads = 16, .v_patch = 14,
        .v_image = 336, .v_channels = 3, .v_act = "quick_gelu", .v_ln_eps = 1e-5,
        .proj_act = "gelu",
        .t_hidden = 4096, .t_inter = 11008, .t_layers = 32, .t_heads = 32, .t_kv_heads = 32,
        .t_head_dim = 128, .t_vocab = 32064, .t_max_pos = 4096, .t_rope_theta = 10000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 32000, .image_token_id = 32000,
    },
    {
        .name = "llava-1.5-13b", .hf_id = "llava-hf/llava-1.5-13b-hf", .family = BENCH_LLAVA,
        .model_type = "llava",
        .v_hidden = 1024, .v_inter = 4096, .v_layers = 24, .v_heads = 16, .v_patch = 14,
        .v_image = 336, .v_channels = 3, .v_act = "quick_gelu", .v_ln_eps = 1e-5,
        .proj_act = "gelu",
        .t_hidden = 5120, .t_inter = 13824, .t_layers = 40, .t_heads = 40, .t_kv_heads = 40,
        .t_head_dim = 128, .t_vocab = 32064, .t_max_pos = 4096, .t_rope_theta = 10000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 32000, .image_token_id = 32000,
    },
    {
        /* Vision: 32 blocks of 1280 (16 heads of 80, MLP 5120 = mlp_ratio 4, QuickGELU,
         * LayerNorm eps 1e-6), 14-px patches over 2 frames, a 2×2 patch merger (exact GELU)
         * into the 3584-wide LM. Text: Qwen2 with q/k/v biases, GQA 28/4, M-RoPE [16,24,24],
         * untied LM head. Image tokens depend on the image (smart resize between 3136 and
         * 12845056 pixels, the hub's preprocessor_config.json); 448² → 1024 patches → 256. */
        .name = "qwen2-vl-7b", .hf_id = "Qwen/Qwen2-VL-7B-Instruct", .family = BENCH_QWEN2VL,
        .model_type = "qwen2_vl",
        .v_hidden = 1280, .v_inter = 5120, .v_layers = 32, .v_heads = 16, .v_patch = 14,
        .v_image = 448, .v_channels = 3, .v_temporal_patch = 2, .v_merge = 2,
        .v_min_pixels = 3136, .v_max_pixels = 12845056,
        .v_act = "quick_gelu", .v_ln_eps = 1e-6, .proj_act = "gelu",
        .t_hidden = 3584, .t_inter = 18944, .t_layers = 28, .t_heads = 28, .t_kv_heads = 4,
        .t_head_dim = 128, .t_vocab = 152064, .t_max_pos = 32768, .t_rope_theta = 1000000.0,
        .t_rms_eps = 1e-6, .t_mrope = { 16, 24, 24 }, .tok_vocab = 151643,
        .image_token_id = 151655,
    },
    {
        /* Persimmon decoder (LayerNorm with biases, q/k LayerNorm, partial rotary 0.5 with
         * theta 25000, relu², every Linear biased but the LM head, no GQA); the "vision
         * encoder" is one linear projection of 30×30×3 patches straight into the decoder.
         * The processor takes images up to 1080×1920 as they are; 1080² is 36×36 patches,
         * 1332 image tokens with the row ends. */
        .name = "fuyu-8b", .hf_id = "adept/fuyu-8b", .family = BENCH_FUYU,
        .model_type = "fuyu",
        .v_hidden = 4096, .v_patch = 30, .v_image = 1080, .v_channels = 3,
        .v_target_h = 1080, .v_target_w = 1920, .v_image_cfg = 300,
        .t_hidden = 4096, .t_inter = 16384, .t_layers = 36, .t_heads = 64, .t_kv_heads = 64,
        .t_head_dim = 64, .t_vocab = 262144, .t_max_pos = 16384, .t_rope_theta = 25000.0,
        .t_rms_eps = 1e-5, .t_partial_rotary = 0.5, .tok_vocab = 262144,
        .image_token_id = 71011,
    },
    {
        /* A LLaVA small enough to build and run in well under a second (CI smoke test). */
        .name = "tiny", .hf_id = "(synthetic)", .family = BENCH_LLAVA, .model_type = "llava",
        .v_hidden = 64, .v_inter = 128, .v_layers = 2, .v_heads = 4, .v_patch = 14,
        .v_image = 56, .v_channels = 3, .v_act = "quick_gelu", .v_ln_eps = 1e-5,
        .proj_act = "gelu",
        .t_hidden = 64, .t_inter = 160, .t_layers = 2, .t_heads = 4, .t_kv_heads = 2,
        .t_head_dim = 16, .t_vocab = 576, .t_max_pos = 2048, .t_rope_theta = 10000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 512, .image_token_id = 512,
    },
    {
        /* Qwen2-VL's structure at CI size: 56² → 4×4 patches → 4 image tokens. */
        .name = "tiny-qwen2vl", .hf_id = "(synthetic)", .family = BENCH_QWEN2VL,
        .model_type = "qwen2_vl",
        .v_hidden = 32, .v_inter = 128, .v_layers = 2, .v_heads = 2, .v_patch = 14,
        .v_image = 56, .v_channels = 3, .v_temporal_patch = 2, .v_merge = 2,
        .v_min_pixels = 3136, .v_max_pixels = 12845056,
        .v_act = "quick_gelu", .v_ln_eps = 1e-6, .proj_act = "gelu",
        .t_hidden = 64, .t_inter = 160, .t_layers = 2, .t_heads = 4, .t_kv_heads = 2,
        .t_head_dim = 16, .t_vocab = 352, .t_max_pos = 2048, .t_rope_theta = 1000000.0,
        .t_rms_eps = 1e-6, .t_mrope = { 2, 3, 3 }, .tok_vocab = 320, .image_token_id = 332,
    },
    {
        /* Fuyu's structure at CI size: 60² → 2×2 patches → 6 image tokens. */
        .name = "tiny-fuyu", .hf_id = "(synthetic)", .family = BENCH_FUYU, .model_type = "fuyu",
        .v_hidden = 64, .v_patch = 30, .v_image = 60, .v_channels = 3,
        .v_target_h = 1080, .v_target_w = 1920, .v_image_cfg = 300,
        .t_hidden = 64, .t_inter = 256, .t_layers = 2, .t_heads = 4, .t_kv_heads = 4,
        .t_head_dim = 16, .t_vocab = 448, .t_max_pos = 2048, .t_rope_theta = 25000.0,
        .t_rms_eps = 1e-5, .t_partial_rotary = 0.5, .tok_vocab = 448, .image_token_id = 400,
    },
};

const struct bench_shape *bench_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, name) == 0)
            return &shapes[i];
    return NULL;
}

const char *bench_shape_names(void)
{
    return "llava-1.5-7b|llava-1.5-13b|qwen2-vl-7b|fuyu-8b|tiny|tiny-qwen2vl|tiny-fuyu";
}

void bench_shape_depth(const struct bench_shape *s, int64_t layers, int64_t *v_layers,
                       int64_t *t_layers)
{
    *v_layers = layers > 0 && layers < s->v_layers ? layers : s->v_layers;
    *t_layers = layers > 0 && layers < s->t_layers ? layers : s->t_layers;
}

/* Qwen2-VL smart_resize of one side pair (models.md §4.4.1), with the newer ≥ factor clamp. */
static void smart_resize(int64_t h, int64_t w, int64_t factor, int64_t min_px, int64_t max_px,
                         int64_t *oh, int64_t *ow)
{
    const double f = (double)factor;
    /* nearbyint rounds half to even in the default rounding mode, as Python's round(). */
    double hb = nearbyint((double)h / f) * f, wb = nearbyint((double)w / f) * f;
    if (hb * wb > (double)max_px) {
        double beta = sqrt((double)h * (double)w / (double)max_px);
        hb = floor((double)h / beta / f) * f;
        wb = floor((double)w / beta / f) * f;
    } else if (hb * wb < (double)min_px) {
        double beta = sqrt((double)min_px / ((double)h * (double)w));
        hb = ceil((double)h * beta / f) * f;
        wb = ceil((double)w * beta / f) * f;
    }
    *oh = hb < f ? factor : (int64_t)hb;
    *ow = wb < f ? factor : (int64_t)wb;
}

void bench_image_plan(const struct bench_shape *s, int64_t image_size,
                      struct bench_image_plan *out)
{
    memset(out, 0, sizeof *out);
    const int64_t P = s->v_patch;
    switch (s->family) {
    case BENCH_LLAVA:
        out->height = out->width = s->v_image;
        out->rows = out->cols = s->v_image / P;
        out->n_patches = out->rows * out->cols;
        out->n_image_tokens = out->n_patches;
        break;
    case BENCH_QWEN2VL:
        smart_resize(image_size, image_size, P * s->v_merge, s->v_min_pixels, s->v_max_pixels,
                     &out->height, &out->width);
        out->rows = out->height / P;
        out->cols = out->width / P;
        out->n_patches = out->rows * out->cols;
        out->n_image_tokens = out->n_patches / (s->v_merge * s->v_merge);
        break;
    case BENCH_FUYU: {
        int64_t h = image_size, w = image_size;
        if (h > s->v_target_h || w > s->v_target_w) {
            /* The processor's Python in double: s = min(th/H, tw/W); int(H·s), int(W·s). */
            double sh = (double)s->v_target_h / (double)h, sw = (double)s->v_target_w / (double)w;
            double sc = sh < sw ? sh : sw;
            h = (int64_t)((double)h * sc);
            w = (int64_t)((double)w * sc);
        }
        out->height = h;
        out->width = w;
        int64_t ch = (h + P - 1) / P * P, cw = (w + P - 1) / P * P;
        out->rows = (ch < s->v_target_h ? ch : s->v_target_h) / P;
        out->cols = (cw < s->v_target_w ? cw : s->v_target_w) / P;
        out->n_patches = out->rows * out->cols;
        out->n_image_tokens = out->rows * (out->cols + 1);
        break;
    }
    }
}

/* Decoder weights of one layer and the flops of one token through its projections
 * (biases included), per family. */
static void decoder_layer(const struct bench_shape *s, double *params, double *token_flop)
{
    const double D = (double)s->t_hidden, I = (double)s->t_inter;
    const double QD = (double)(s->t_heads * s->t_head_dim);
    const double KD = (double)(s->t_kv_heads * s->t_head_dim);
    const double hd = (double)s->t_head_dim;
    double mm, bias, norms;
    switch (s->family) {
    case BENCH_FUYU:
        /* query_key_value [3D, D] + bias, dense [D, D] + bias, dense_h_to_4h [I, D] + bias,
         * dense_4h_to_h [D, I] + bias; input/post LayerNorms (weight + bias) and the q/k
         * LayerNorms over one head. No GQA: QD = KD = D. */
        mm = 3 * D * D + D * D + 2 * D * I;
        bias = 3 * D + D + I + D;
        norms = 4 * D + 4 * hd;
        break;
    case BENCH_QWEN2VL:
        /* q, k, v with bias, o without; SiLU-gated MLP without biases; two RMSNorms. */
        mm = D * QD + 2 * D * KD + QD * D + 3 * D * I;
        bias = QD + 2 * KD;
        norms = 2 * D;
        break;
    default: /* LLaMA */
        mm = D * QD + 2 * D * KD + QD * D + 3 * D * I;
        bias = 0;
        norms = 2 * D;
        break;
    }
    *params = mm + bias + norms;
    *token_flop = 2 * mm + bias;
}

void bench_work_compute(const struct bench_shape *s, int64_t layers, int64_t image_size,
                        int64_t n_prompt, int64_t n_gen, int w_bytes, double mm_bytes,
                        double kv_bytes, struct bench_work *out)
{
    memset(out, 0, sizeof *out);
    int64_t vl, tl;
    bench_shape_depth(s, layers, &vl, &tl);
    const double D = (double)s->t_hidden, V = (double)s->t_vocab;
    const double QD = (double)(s->t_heads * s->t_head_dim);
    const double KD = (double)(s->t_kv_heads * s->t_head_dim);
    struct bench_image_plan ip;
    bench_image_plan(s, image_size, &ip);
    out->n_patches = ip.n_patches;
    out->n_image_tokens = ip.n_image_tokens;

    /* Vision. */
    const double Dv = (double)s->v_hidden, Iv = (double)s->v_inter;
    const double N = (double)ip.n_patches;
    const double patch_k = (double)(s->v_channels * s->v_patch * s->v_patch *
                                    (s->v_temporal_patch ? s->v_temporal_patch : 1));
    double vision_params = 0;
    switch (s->family) {
    case BENCH_LLAVA: {
        /* CLIP up to vision_feature_layer −2, i.e. all but the last layer. */
        const double T = N + 1;
        double v_layer = 4 * Dv * Dv + 2 * Dv * Iv;
        out->v_layers_run = vl - 1;
        out->vision_flop = 2 * N * patch_k * Dv +
                           (double)out->v_layers_run * (2 * T * v_layer + 4 * T * T * Dv) +
                           2 * N * (Dv * D + D * D);
        /* + class and position embeddings, pre and post LayerNorm (the checkpoint's). */
        vision_params = (double)vl * (v_layer + 9 * Dv + Iv) + patch_k * Dv + (T + 5) * Dv +
                        Dv * D + D * D + 2 * D;
        break;
    }
    case BENCH_QWEN2VL: {
        /* Blocks: qkv [3E, E], proj [E, E], fc1 [Iv, E], fc2 [E, Iv], all biased; the merger
         * on N/merge² rows of merge²·E. */
        const double M = (double)(s->v_merge * s->v_merge), Nm = N / M, E4 = M * Dv;
        double v_mm = 4 * Dv * Dv + 2 * Dv * Iv, v_bias = 5 * Dv + Iv;
        out->v_layers_run = vl;
        out->vision_flop = 2 * N * patch_k * Dv +
                           (double)vl * (N * (2 * v_mm + v_bias) + 4 * N * N * Dv) +
                           Nm * (2 * E4 * E4 + E4 + 2 * E4 * D + D);
        vision_params = patch_k * Dv + (double)vl * (v_mm + v_bias + 4 * Dv) + 2 * Dv +
                        E4 * E4 + E4 + E4 * D + D;
        break;
    }
    case BENCH_FUYU:
        out->v_layers_run = 0;
        out->vision_flop = N * (2 * patch_k * D + D);
        vision_params = patch_k * D + D;
        break;
    }
    /* Every weight counted as a matrix one: the vectors (norms, biases) are < 0.1 %. */
    out->vision_weight_bytes = (uint64_t)(vision_params * mm_bytes);

    /* Prefill and decode. */
    double layer_params, token_flop;
    decoder_layer(s, &layer_params, &token_flop);
    const double final_norm = s->family == BENCH_FUYU ? 2 * D : D;
    double Sp = (double)n_prompt;
    out->prefill_flop = (double)tl * (Sp * token_flop + 2 * QD * Sp * (Sp + 1)) + 2 * D * V;
    double weights = (double)tl * layer_params + final_norm + V * D; /* + LM head */
    out->decode_weight_bytes = weights * mm_bytes + D * w_bytes; /* + one embedding row */
    /* Decode step j (j = 1 … n_gen−1) runs at position n_prompt + j − 1 and reads that many
     * cached positions plus its own. */
    double mean_ctx = n_gen > 1 ? Sp + (double)(n_gen - 1) / 2.0 : Sp;
    out->decode_bytes = out->decode_weight_bytes + (double)tl * 2 * mean_ctx * KD * kv_bytes;
    out->language_weight_bytes = (uint64_t)(weights * mm_bytes + V * D * w_bytes);
}
