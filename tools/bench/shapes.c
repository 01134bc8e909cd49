/*
 * tools/bench/shapes.c — the published shapes mmrt-bench knows, and the work of a request.
 *
 * Dimensions are copied from the models' config.json on the Hugging Face hub (hf_id); the
 * `tiny` shape is a LLaVA small enough for a CI smoke test. Qwen2-VL and Fuyu are listed with
 * their exact dimensions although this build cannot run them yet (main.c says so, exit 2).
 *
 * Work accounting (bench_work_compute) counts multiply-adds of the matrix products as 2 flop
 * and ignores norms, activations and softmax (well under 1% of the flops of these shapes):
 *   vision   = patch embedding + per CLIP layer run (q, k, v, o, fc1, fc2 and the attention's
 *              QKᵀ and PV over all T = patches + 1 tokens) + the 2-layer projector
 *   prefill  = per decoder layer (q, k, v, o, gate, up, down) × S tokens + causal attention
 *              (query i sees i + 1 keys) + the LM head for the last position
 *   decode   = every language weight read once per token (layers, final norm, LM head, one
 *              embedding row) + K and V of every cached position (at the mean position of
 *              the decode steps)
 */
#include <string.h>

#include "bench.h"

static const struct bench_shape shapes[] = {
    {
        .name = "llava-1.5-7b", .hf_id = "llava-hf/llava-1.5-7b-hf", .family = BENCH_LLAVA,
        .model_type = "llava", .runnable = true,
        .v_hidden = 1024, .v_inter = 4096, .v_layers = 24, .v_heads = 16, .v_patch = 14,
        .v_image = 336, .v_channels = 3, .v_act = "quick_gelu", .v_ln_eps = 1e-5,
        .proj_act = "gelu",
        .t_hidden = 4096, .t_inter = 11008, .t_layers = 32, .t_heads = 32, .t_kv_heads = 32,
        .t_head_dim = 128, .t_vocab = 32064, .t_max_pos = 4096, .t_rope_theta = 10000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 32000, .image_token_id = 32000,
    },
    {
        .name = "llava-1.5-13b", .hf_id = "llava-hf/llava-1.5-13b-hf", .family = BENCH_LLAVA,
        .model_type = "llava", .runnable = true,
        .v_hidden = 1024, .v_inter = 4096, .v_layers = 24, .v_heads = 16, .v_patch = 14,
        .v_image = 336, .v_channels = 3, .v_act = "quick_gelu", .v_ln_eps = 1e-5,
        .proj_act = "gelu",
        .t_hidden = 5120, .t_inter = 13824, .t_layers = 40, .t_heads = 40, .t_kv_heads = 40,
        .t_head_dim = 128, .t_vocab = 32064, .t_max_pos = 4096, .t_rope_theta = 10000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 32000, .image_token_id = 32000,
    },
    {
        /* Vision: 32 blocks of 1280 (16 heads, MLP 5120, QuickGELU), 14-px patches over 2
         * frames, 2×2 patch merger into the 3584-wide LM; image tokens depend on the image. */
        .name = "qwen2-vl-7b", .hf_id = "Qwen/Qwen2-VL-7B-Instruct", .family = BENCH_QWEN2VL,
        .model_type = "qwen2_vl", .runnable = false,
        .v_hidden = 1280, .v_inter = 5120, .v_layers = 32, .v_heads = 16, .v_patch = 14,
        .v_image = 448, .v_channels = 3, .v_temporal_patch = 2, .v_merge = 2,
        .v_act = "quick_gelu", .v_ln_eps = 1e-6, .proj_act = "gelu",
        .t_hidden = 3584, .t_inter = 18944, .t_layers = 28, .t_heads = 28, .t_kv_heads = 4,
        .t_head_dim = 128, .t_vocab = 152064, .t_max_pos = 32768, .t_rope_theta = 1000000.0,
        .t_rms_eps = 1e-6, .tok_vocab = 151643, .image_token_id = 151655,
    },
    {
        /* Persimmon decoder (partial rotary 0.5, qk-layernorm, relu²); the "vision encoder" is
         * one linear projection of 30×30 patches straight into the decoder. */
        .name = "fuyu-8b", .hf_id = "adept/fuyu-8b", .family = BENCH_FUYU,
        .model_type = "fuyu", .runnable = false,
        .v_hidden = 4096, .v_patch = 30, .v_image = 1080, .v_channels = 3,
        .t_hidden = 4096, .t_inter = 16384, .t_layers = 36, .t_heads = 64, .t_kv_heads = 64,
        .t_head_dim = 64, .t_vocab = 262144, .t_max_pos = 16384, .t_rope_theta = 25000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 262144, .image_token_id = 71011,
    },
    {
        /* A LLaVA small enough to build and run in well under a second (CI smoke test). */
        .name = "tiny", .hf_id = "(synthetic)", .family = BENCH_LLAVA, .model_type = "llava",
        .runnable = true,
        .v_hidden = 64, .v_inter = 128, .v_layers = 2, .v_heads = 4, .v_patch = 14,
        .v_image = 56, .v_channels = 3, .v_act = "quick_gelu", .v_ln_eps = 1e-5,
        .proj_act = "gelu",
        .t_hidden = 64, .t_inter = 160, .t_layers = 2, .t_heads = 4, .t_kv_heads = 2,
        .t_head_dim = 16, .t_vocab = 576, .t_max_pos = 2048, .t_rope_theta = 10000.0,
        .t_rms_eps = 1e-5, .tok_vocab = 512, .image_token_id = 512,
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
    return "llava-1.5-7b|llava-1.5-13b|qwen2-vl-7b|fuyu-8b|tiny";
}

void bench_work_compute(const struct bench_shape *s, int64_t layers, int64_t n_prompt,
                        int64_t n_gen, int w_bytes, int kv_bytes, struct bench_work *out)
{
    memset(out, 0, sizeof *out);
    int64_t vl = layers > 0 && layers < s->v_layers ? layers : s->v_layers;
    int64_t tl = layers > 0 && layers < s->t_layers ? layers : s->t_layers;
    const double D = (double)s->t_hidden, I = (double)s->t_inter, V = (double)s->t_vocab;
    const double QD = (double)(s->t_heads * s->t_head_dim);
    const double KD = (double)(s->t_kv_heads * s->t_head_dim);

    /* Vision (LLaVA: CLIP up to vision_feature_layer −2, i.e. all but the last layer). */
    const double Dv = (double)s->v_hidden, Iv = (double)s->v_inter;
    const int64_t grid = s->v_patch ? s->v_image / s->v_patch : 0;
    const double n_patch = (double)(grid * grid), T = n_patch + 1;
    const double patch_k = (double)(s->v_channels * s->v_patch * s->v_patch);
    out->v_layers_run = vl - 1;
    out->n_image_tokens = grid * grid;
    double v_layer_params = 4 * Dv * Dv + 2 * Dv * Iv;
    out->vision_flop = 2 * n_patch * patch_k * Dv +
                       (double)out->v_layers_run * (2 * T * v_layer_params + 4 * T * T * Dv) +
                       2 * n_patch * (Dv * D + D * D);
    out->vision_weight_bytes =
        (uint64_t)(((double)vl * (v_layer_params + 9 * Dv + Iv) + patch_k * Dv + (T + 4) * Dv +
                    Dv * D + D * D + 2 * D) * w_bytes);

    /* Prefill and decode. */
    double layer_params = D * QD + 2 * D * KD + QD * D + 3 * D * I;
    double Sp = (double)n_prompt;
    out->prefill_flop = (double)tl * (2 * Sp * layer_params + 2 * QD * Sp * (Sp + 1)) +
                        2 * D * V;
    double weights = (double)tl * (layer_params + 2 * D) + D + V * D;
    out->decode_weight_bytes = (weights + D) * w_bytes; /* + the one embedding row */
    /* Decode step j (j = 1 … n_gen−1) runs at position n_prompt + j − 1 and reads that many
     * cached positions plus its own. */
    double mean_ctx = n_gen > 1 ? Sp + (double)(n_gen - 1) / 2.0 : Sp;
    out->decode_bytes = out->decode_weight_bytes + (double)tl * 2 * mean_ctx * KD * kv_bytes;
    out->language_weight_bytes = (uint64_t)((weights + V * D) * w_bytes);
}
