/*
 * models/qwen2vl.c — Qwen2-VL (Qwen2VLForConditionalGeneration, model_type "qwen2_vl"):
 * dynamic-resolution images through a ViT with 2-D rotary positions and a 2×2 patch merger
 * (qwen2vl_vision.c), spliced into a Qwen2 decoder with multimodal rotary positions
 * (llama.c with M-RoPE). models.md §4, chat template §7.5.
 *
 * Vision stage, per request (one or more images, each its own size):
 *   decode → smart_resize plan → the token budget (below), before any resampling
 *   → PIL bicubic resize → rescale, normalize → frame
 *   repeated to temporal_patch_size → patches in merge-window order (core/preprocess.c)
 *   → the images through the tower (q_tower: packed together where each image keeps the
 *   bits it gets alone; attention never crosses images)
 *   → features [Σ tokens_i, hidden] with tokens_i = t·h·w / merge², handed over with each
 *   image's count and grid (struct mmrt_vision_output, per-image layout).
 *
 * Token budget: the images' tokens together must fit [model] max_image_tokens (when set)
 * and what the context holds (max_position_embeddings − 1). Over either, the request is
 * refused naming the image that crosses it. With oversize_images = downscale, images over
 * max_image_tokens get max_pixels lowered instead (the context bound still refuses), by
 * water-filling: taking the images from the fewest tokens to the most (ties in prompt
 * order), each may keep up to an even share of what is left — floor(remaining budget /
 * images left) — and one over its share has its max_pixels lowered to share · (patch·merge)²
 * and smart_resize run again with the checkpoint's min_pixels (HF's rules, unchanged). When
 * that share is below min_pixels, or smart_resize's min_pixels / aspect rules still give more
 * tokens than the share, the request is refused: the processor allows no smaller image.
 *
 * Language stage:
 *   template (Qwen2-VL-Instruct's, below) → tokens → each <|image_pad|> expanded to its
 *   image's token count → embeddings with the image rows overwritten by the features, in
 *   order → M-RoPE positions (get_rope_index) → prefill → decode, each new token at
 *   cache slot + rope_delta on all three axes.
 *
 * Template (what transformers renders for one user message whose content is the images
 * followed by the text, add_generation_prompt, no add_vision_id):
 *   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n
 *   <|im_start|>user\n{<|vision_start|><|image_pad|><|vision_end|> per image}{prompt}
 *   <|im_end|>\n<|im_start|>assistant\n
 * A prompt that already holds <|image_pad|> placeholders places the images itself: the
 * template then adds none, and the prompt must hold exactly one per image (the processor's
 * rule; with no image, none). Either way a count mismatch is MMRT_ERR_INVALID_ARG naming
 * both counts. <|video_pad|> is refused: videos are not supported.
 *
 * Rotary positions (get_rope_index, models.md §4.3): text tokens count up by one on all
 * three axes; an image of merged grid (t, H, W) starting at position s takes
 * (s + ti, s + hi, s + wi) in t-major order, and the text after it resumes at
 * s + max(t, H, W). rope_delta = (largest position + 1) − prompt length.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "formats/image.h"
#include "formats/json.h"
#include "formats/tokenizer.h"
#include "image_budget.h"
#include "llama.h"
#include "llava_common.h"
#include "text.h"
#include "log.h"
#include "model.h"
#include "ops.h"
#include "preprocess.h"
#include "qwen2vl_vision.h"
#include "sampler.h"
#include "weights.h"

/* Images per request: a bound on work and memory a single request can ask for, well above
 * what a chat turn carries (vLLM's default per-prompt limit for Qwen2-VL is lower). */
#define MAX_IMAGES 32

static const char system_turn[] = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";

struct mmrt_model {
    struct mmrt_dev *vision, *language;
    struct mmrt_weights *w;
    struct mmrt_qwen2vl_vision vt;
    struct mmrt_llama lm;
    struct mmrt_tokenizer *tok;
    struct mmrt_qwen2vl_preprocess_config pp;
    int32_t image_token_id, video_token_id, vision_start_id, vision_end_id;
    const char *image_pad, *video_pad, *vision_start, *vision_end; /* borrowed from tok */
    int32_t eos[MMRT_LLAVA_MAX_EOS];
    int n_eos;
    struct mmrt_model_options opts;
};

static void q_destroy(struct mmrt_model *m)
{
    if (!m)
        return;
    mmrt_qwen2vl_vision_unload(&m->vt);
    mmrt_llama_unload(&m->lm);
    mmrt_weights_close(m->w);
    mmrt_tokenizer_destroy(m->tok);
    free(m);
}

/* preprocessor_config.json (hub layout), else processor_config.json's "image_processor"
 * (transformers 5). The processor's patch geometry must be the tower's: transformers would
 * otherwise cut patches the model cannot read. */
static mmrt_status load_pp(struct mmrt_model *m, const char *dir,
                           const struct mmrt_qwen2vl_vision_config *vc, struct mmrt_error *err)
{
    char path[4200];
    json_t *root = NULL;
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    const bool hub_layout = mmrt_file_exists(path);
    if (!hub_layout)
        snprintf(path, sizeof path, "%s/processor_config.json", dir);
    mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, &root, err);
    if (st == MMRT_ERR_IO && !mmrt_file_exists(path))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: neither preprocessor_config.json nor "
                              "processor_config.json is present", dir);
    if (st != MMRT_OK)
        return st;
    const json_t *obj = hub_layout ? root : json_object_get(root, "image_processor");
    if (!json_is_object(obj))
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: no \"image_processor\" object", path);
    else
        st = mmrt_qwen2vl_preprocess_config_from_json(obj, path, &m->pp, err);
    json_decref(root);
    if (st != MMRT_OK)
        return st;
    if (m->pp.patch_size != vc->patch || m->pp.merge_size != vc->merge ||
        m->pp.temporal_patch_size != vc->temporal)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: patch_size %u, merge_size %u, temporal_patch_size %u differ "
                              "from config.json's vision_config (%lld, %lld, %lld)", path,
                              m->pp.patch_size, m->pp.merge_size, m->pp.temporal_patch_size,
                              (long long)vc->patch, (long long)vc->merge,
                              (long long)vc->temporal);
    return MMRT_OK;
}

/* The token string of a configured special id; it must round-trip through the tokenizer,
 * since the template is rendered as text. */
static mmrt_status special_piece(const struct mmrt_tokenizer *tok, int32_t id, const char *key,
                                 const char *path, const char **out, struct mmrt_error *err)
{
    const char *piece = mmrt_tokenizer_id_to_token(tok, id, NULL);
    if (!piece || mmrt_tokenizer_token_to_id(tok, piece, strlen(piece)) != id ||
        !mmrt_tokenizer_is_special(tok, id))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: %s %d is not a special token of the tokenizer", path, key,
                              id);
    *out = piece;
    return MMRT_OK;
}

static mmrt_status load_tokenizer(struct mmrt_model *m, const char *dir, int64_t vocab,
                                  struct mmrt_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    mmrt_status st = mmrt_tokenizer_load(path, NULL, &m->tok, err);
    if (st != MMRT_OK)
        return st;
    if (mmrt_tokenizer_vocab_size(m->tok) > (uint32_t)vocab)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: the tokenizer has %u ids, more than the model's vocab_size "
                              "%lld", path, mmrt_tokenizer_vocab_size(m->tok), (long long)vocab);
    static const char *const chat[] = { "<|im_start|>", "<|im_end|>" };
    for (int i = 0; i < 2; i++)
        if (mmrt_tokenizer_token_to_id(m->tok, chat[i], strlen(chat[i])) < 0)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: the chat template's token %s is not in the vocabulary",
                                  path, chat[i]);
    st = special_piece(m->tok, m->image_token_id, "image_token_id", path, &m->image_pad, err);
    if (st == MMRT_OK)
        st = special_piece(m->tok, m->video_token_id, "video_token_id", path, &m->video_pad,
                           err);
    if (st == MMRT_OK)
        st = special_piece(m->tok, m->vision_start_id, "vision_start_token_id", path,
                           &m->vision_start, err);
    if (st == MMRT_OK)
        st = special_piece(m->tok, m->vision_end_id, "vision_end_token_id", path,
                           &m->vision_end, err);
    return st;
}

static mmrt_status q_load(const char *dir, const json_t *config,
                          const struct mmrt_model_options *opts, struct mmrt_dev *vision,
                          struct mmrt_dev *language, struct mmrt_model **out,
                          struct mmrt_error *err)
{
    char what[4200], vwhat[4300];
    snprintf(what, sizeof what, "%s/config.json", dir);
    struct mmrt_model *m = calloc(1, sizeof *m);
    if (!m)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
    m->vision = vision;
    m->language = language;
    if (opts)
        m->opts = *opts;
    json_t *empty = json_object();
    mmrt_status st = empty ? MMRT_OK : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    const json_t *vcfg = json_object_get(config, "vision_config");
    if (st == MMRT_OK && vcfg && !json_is_null(vcfg) && !json_is_object(vcfg))
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: vision_config must be an object", what);
    if (st != MMRT_OK)
        goto fail;
    snprintf(vwhat, sizeof vwhat, "%s: vision_config", what);
    struct mmrt_qwen2vl_vision_config vc;
    struct mmrt_llama_config lc;
    st = mmrt_qwen2vl_vision_config_parse(json_is_object(vcfg) ? vcfg : empty, vwhat, &vc, err);
    /* config.json's model_type is qwen2_vl: the reader finds text_config or the flat keys */
    if (st == MMRT_OK)
        st = mmrt_llama_config_parse(config, config, what, &lc, err);
    if (st != MMRT_OK)
        goto fail;
    if (vc.hidden != lc.hidden) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: vision_config.hidden_size %lld (the merger's output) differs "
                            "from the decoder's hidden_size %lld", what, (long long)vc.hidden,
                            (long long)lc.hidden);
        goto fail;
    }
    /* Special ids: top level (both layouts), Qwen2VLConfig defaults (§4.1). */
    static const struct { const char *key; long long def; size_t field; } ids[] = {
        { "image_token_id", 151655, offsetof(struct mmrt_model, image_token_id) },
        { "video_token_id", 151656, offsetof(struct mmrt_model, video_token_id) },
        { "vision_start_token_id", 151652, offsetof(struct mmrt_model, vision_start_id) },
        { "vision_end_token_id", 151653, offsetof(struct mmrt_model, vision_end_id) },
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        long long v;
        st = mmrt_json_opt_int(config, ids[i].key, what, 0, lc.vocab - 1, ids[i].def, &v, err);
        if (st != MMRT_OK)
            goto fail;
        *(int32_t *)((char *)m + ids[i].field) = (int32_t)v;
    }

    /* Processor, tokenizer and placement, before any device memory is touched. */
    st = load_pp(m, dir, &vc, err);
    if (st == MMRT_OK)
        st = load_tokenizer(m, dir, lc.vocab, err);
    if (st == MMRT_OK)
        st = mmrt_llava_read_eos(dir, lc.eos_id, lc.vocab, m->tok,
                                 /* generation_config's ids alone, as published (the
                                    Instruct models' already hold <|im_end|>) */
                                 MMRT_CHAT_TEMPLATE_AUTO, m->eos, &m->n_eos, err);
    if (st != MMRT_OK)
        goto fail;
    enum mmrt_op vis_ops[16], lm_ops[32];
    int n_vis = 0;
    for (int i = 0; i < mmrt_qwen2vl_vision_n_ops; i++)
        vis_ops[n_vis++] = mmrt_qwen2vl_vision_ops[i];
    vis_ops[n_vis++] = vc.act;
    const int n_lm = mmrt_llama_required_ops(&lc, lm_ops);
    st = mmrt_dev_require_ops(vision, "the vision stage", vis_ops, n_vis, err);
    if (st == MMRT_OK)
        st = mmrt_dev_require_ops(language, "the language stage", lm_ops, n_lm, err);
    /* Weights: bare model.X is the decoder (§1.7 rule 4). */
    if (st == MMRT_OK)
        st = mmrt_weights_open(dir, true, &m->w, err);
    if (st == MMRT_OK)
        mmrt_weights_set_options(m->w, &m->opts);
    if (st == MMRT_OK)
        st = mmrt_qwen2vl_vision_load(&m->vt, m->w, vision, &vc, err);
    if (st == MMRT_OK)
        st = mmrt_llama_load(&m->lm, m->w, language, &lc, &m->opts, err);
    if (st != MMRT_OK)
        goto fail;
    json_decref(empty);
    *out = m;
    return MMRT_OK;
fail:
    json_decref(empty);
    q_destroy(m);
    return st;
}

/* ---- vision stage ---- */

/* One image's plan: the max_pixels it is processed with (lowered when downscaled) and the
 * size smart_resize gives it. */
struct plan {
    uint64_t max_pixels;
    uint32_t rw, rh;
};

/* Lowers image k's max_pixels so its tokens fit `share` (see the top of this file). */
static mmrt_status downscale(const struct mmrt_model *m, const struct mmrt_token_budget *b,
                             const struct mmrt_image *img, const char *path, int k, int n,
                             int64_t share, int64_t total, struct plan *p, int32_t *grid,
                             int64_t *tokens, struct mmrt_error *err)
{
    const struct mmrt_qwen2vl_preprocess_config *pp = &m->pp;
    const uint64_t factor = (uint64_t)pp->patch_size * pp->merge_size;
    const int64_t m2 = (int64_t)pp->merge_size * pp->merge_size;
    char hint[400];
    if (!pp->do_resize) {
        snprintf(hint, sizeof hint, "oversize_images = downscale cannot shrink it: the "
                 "checkpoint's image processor has do_resize off");
        return mmrt_token_budget_refuse(b, k + 1, n, path, img->width, img->height, p->rw,
                                        p->rh, *tokens, total, hint, err);
    }
    uint64_t max_px = (uint64_t)share * factor * factor;
    max_px = max_px < pp->max_pixels ? max_px : pp->max_pixels;
    if (max_px < pp->min_pixels) {
        snprintf(hint, sizeof hint, "oversize_images = downscale cannot shrink it to its share "
                 "of %lld tokens (max_pixels %llu): the processor's min_pixels is %llu",
                 (long long)share, (unsigned long long)max_px,
                 (unsigned long long)pp->min_pixels);
        return mmrt_token_budget_refuse(b, k + 1, n, path, img->width, img->height, p->rw,
                                        p->rh, *tokens, total, hint, err);
    }
    struct mmrt_qwen2vl_preprocess_config lowered = *pp;
    lowered.max_pixels = max_px;
    uint32_t rw, rh;
    int32_t g[3];
    mmrt_status st = mmrt_preprocess_qwen2vl_plan(img->width, img->height, &lowered, &rw, &rh,
                                                  g, err);
    if (st != MMRT_OK)
        return st;
    const int64_t t = (int64_t)g[0] * g[1] * g[2] / m2;
    if (t > share) {
        snprintf(hint, sizeof hint, "oversize_images = downscale cannot shrink it to its share "
                 "of %lld tokens: with max_pixels %llu, smart_resize still gives %u×%u (%lld "
                 "tokens; min_pixels %llu)", (long long)share, (unsigned long long)max_px, rw,
                 rh, (long long)t, (unsigned long long)pp->min_pixels);
        return mmrt_token_budget_refuse(b, k + 1, n, path, img->width, img->height, p->rw,
                                        p->rh, *tokens, total, hint, err);
    }
    char budget[160];
    mmrt_log(MMRT_LOG_INFO, "qwen2_vl", "image %d of %d (%s, %u×%u): %lld tokens downscaled "
             "to %lld (max_pixels %llu, resized to %u×%u) to fit %s", k + 1, n, path,
             img->width, img->height, (long long)*tokens, (long long)t,
             (unsigned long long)max_px, rw, rh,
             mmrt_token_budget_describe(b, budget, sizeof budget));
    p->max_pixels = max_px;
    p->rw = rw;
    p->rh = rh;
    memcpy(grid, g, sizeof g);
    *tokens = t;
    return MMRT_OK;
}

/* oversize_images = downscale with the images over the budget: water-filling, fewest tokens
 * first (see the top of this file). */
static mmrt_status fit_budget(const struct mmrt_model *m, const struct mmrt_token_budget *b,
                              struct mmrt_image *const *imgs, const char *const *paths, int n,
                              int64_t total, struct plan *plans, int32_t *grid, int64_t *tokens,
                              struct mmrt_error *err)
{
    int order[MAX_IMAGES];
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && tokens[order[j - 1]] > tokens[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    int64_t remaining = b->tokens;
    for (int j = 0; j < n; j++) {
        const int k = order[j];
        const int64_t share = remaining / (n - j);
        if (tokens[k] > share) {
            mmrt_status st = downscale(m, b, imgs[k], paths[k], k, n, share, total, &plans[k],
                                       grid + 3 * k, &tokens[k], err);
            if (st != MMRT_OK)
                return st;
        }
        remaining -= tokens[k];
    }
    return MMRT_OK;
}

/* A request's images ready for the tower: pixels of every image one after the other, each
 * image's grid and token count. Owned; q_prep_free releases it. */
struct q_prep {
    int n;
    float *pixels;   /* [n_patches, K] */
    int32_t *grid;   /* [n][3] */
    int64_t *tokens; /* [n] */
    int64_t n_patches, n_tokens;
    double preprocess_ms;
};

static void q_prep_free(struct q_prep *p)
{
    free(p->pixels);
    free(p->grid);
    free(p->tokens);
    memset(p, 0, sizeof *p);
}

/* Decoding, the token budget and preprocessing of every image of req (n ≥ 1) into *p. */
static mmrt_status q_pixels(struct mmrt_model *m, const struct mmrt_request *req,
                            const struct mmrt_model_trace *trace, struct q_prep *p,
                            struct mmrt_error *err)
{
    memset(p, 0, sizeof *p);
    const int n = req->n_images;
    if (n > MAX_IMAGES)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request has %d images; Qwen2-VL takes at most %d", n, MAX_IMAGES);
    /* How messages name each image (its path, or its place and size when in memory). */
    char name_buf[MAX_IMAGES][64];
    const char *paths[MAX_IMAGES];
    for (int i = 0; i < n; i++)
        paths[i] = mmrt_request_image_name(req, i, name_buf[i], sizeof name_buf[i]);
    const struct mmrt_qwen2vl_preprocess_config *pp = &m->pp;
    const int64_t m2 = (int64_t)pp->merge_size * pp->merge_size;
    const int64_t K = 3 * (int64_t)pp->temporal_patch_size * pp->patch_size * pp->patch_size;
    /* The prompt needs the template's tokens too; the context bound only refuses what cannot
     * fit at all. */
    const int64_t context_bound = m->lm.cfg.max_positions - 1;
    struct mmrt_token_budget budget;
    mmrt_token_budget_init(&budget, &m->opts);
    const bool configured_first = budget.tokens > 0 && budget.tokens <= context_bound;
    double t0 = mmrt_now_ms();
    struct mmrt_image **imgs = calloc((size_t)n, sizeof *imgs);
    int32_t *grid = calloc((size_t)n * 3, sizeof *grid);
    int64_t *tokens = calloc((size_t)n, sizeof *tokens);
    struct plan *plans = calloc((size_t)n, sizeof *plans);
    float *pixels = NULL;
    mmrt_status st = MMRT_OK;
    if (!imgs || !grid || !tokens || !plans) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "images: out of memory");
        goto out;
    }
    struct mmrt_image_limits lim;
    mmrt_model_image_limits(&m->opts, &lim);
    int64_t n_tokens = 0;
    for (int i = 0; i < n; i++) {
        plans[i].max_pixels = pp->max_pixels;
        st = mmrt_request_image_load(req, i, &lim, &imgs[i], err);
        if (st == MMRT_OK)
            st = mmrt_preprocess_qwen2vl_plan(imgs[i]->width, imgs[i]->height, pp,
                                              &plans[i].rw, &plans[i].rh, grid + 3 * i, err);
        if (st != MMRT_OK) {
            if (n > 1)
                mmrt_error_prefix(err, st, "image %d of %d", i + 1, n);
            goto out;
        }
        tokens[i] = (int64_t)grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2] / m2;
        n_tokens += tokens[i];
        /* The configured budget, checked before any image is resampled (the context's
         * below, after any downscaling). */
        if (!budget.downscale && configured_first &&
            mmrt_token_budget_exceeded(&budget, n_tokens)) {
            st = mmrt_token_budget_refuse(&budget, i + 1, n, paths[i], imgs[i]->width,
                                          imgs[i]->height, plans[i].rw, plans[i].rh, tokens[i],
                                          n_tokens, "oversize_images = downscale would shrink "
                                          "the images to fit", err);
            goto out;
        }
        if (!budget.downscale && n_tokens > context_bound)
            break;
    }
    if (budget.downscale && mmrt_token_budget_exceeded(&budget, n_tokens)) {
        st = fit_budget(m, &budget, imgs, paths, n, n_tokens, plans, grid, tokens, err);
        if (st != MMRT_OK)
            goto out;
    }
    n_tokens = 0;
    for (int i = 0; i < n; i++) {
        n_tokens += tokens[i];
        if (n_tokens > context_bound) {
            st = mmrt_error_set(err, MMRT_ERR_LIMIT,
                                "image %d (%u×%u, resized to %u×%u) brings the request to %lld "
                                "image tokens, more than the model's context of %lld positions "
                                "allows", i + 1, imgs[i]->width, imgs[i]->height, plans[i].rw,
                                plans[i].rh, (long long)n_tokens,
                                (long long)m->lm.cfg.max_positions);
            goto out;
        }
    }
    int64_t n_patches = 0;
    for (int i = 0; i < n; i++)
        n_patches += (int64_t)grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2];
    pixels = malloc((size_t)(n_patches * K) * sizeof *pixels);
    if (!pixels) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "images: out of memory");
        goto out;
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const int64_t np = (int64_t)grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2];
        struct mmrt_qwen2vl_preprocess_config ppi = *pp;
        ppi.max_pixels = plans[i].max_pixels;
        int32_t g[3];
        st = mmrt_preprocess_qwen2vl(imgs[i], &ppi, pixels + at * K, (size_t)(np * K), g, err);
        if (st != MMRT_OK)
            goto out;
        if (trace && trace->pixel_values)
            trace->pixel_values(trace->user, i, pixels + at * K, 2, (const int64_t[]){ np, K });
        mmrt_image_destroy(imgs[i]);
        imgs[i] = NULL;
        at += np;
    }
    *p = (struct q_prep){ .n = n, .pixels = pixels, .grid = grid, .tokens = tokens,
                          .n_patches = n_patches, .n_tokens = n_tokens,
                          .preprocess_ms = mmrt_now_ms() - t0 };
    pixels = NULL;
    grid = NULL;
    tokens = NULL;
out:
    for (int i = 0; imgs && i < n; i++)
        mmrt_image_destroy(imgs[i]);
    free(imgs);
    free(grid);
    free(tokens);
    free(plans);
    free(pixels);
    return st;
}

/* The tower over n images (pixels, grids and token counts one after the other) into
 * features [Σ tokens, D]. An image's features must be a function of that image alone — the
 * vision cache (core/vision_cache.h) hands them out per image, and batched requests must get
 * their solo bits — so images go through a pass together only when each has more than
 * MMRT_SMALL_M merged rows (and 4× as many patch rows): then every matrix product of every
 * image stays on one side of MATMUL's M ≤ 32 line whatever its company, and attention never
 * crosses images (one packed sequence per frame, plugin.h batch invariance). A pass takes
 * at most max_patches (the largest request's own: what pool_mb = auto sized the vision pool
 * for). Smaller images run alone, as does every image when a packed pass fails. */
static mmrt_status q_tower(struct mmrt_model *m, const float *pixels, int n,
                           const int32_t *grid, const int64_t *tokens, int64_t max_patches,
                           float *features, struct mmrt_error *err)
{
    const struct mmrt_qwen2vl_preprocess_config *pp = &m->pp;
    const int64_t D = m->lm.cfg.hidden;
    const int64_t K = 3 * (int64_t)pp->temporal_patch_size * pp->patch_size * pp->patch_size;
    int64_t px = 0, row = 0;
    for (int i = 0; i < n;) {
        /* images [i, j) in one pass: a run of large ones, or one image */
        int j = i + 1;
        int64_t patches = (int64_t)grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2];
        int64_t rows = tokens[i];
        if (tokens[i] > MMRT_SMALL_M) {
            while (j < n && tokens[j] > MMRT_SMALL_M) {
                const int64_t np = (int64_t)grid[3 * j] * grid[3 * j + 1] * grid[3 * j + 2];
                if (patches + np > max_patches)
                    break;
                patches += np;
                rows += tokens[j++];
            }
        }
        struct mmrt_error e = { 0 };
        mmrt_status st = mmrt_qwen2vl_vision_forward(&m->vt, pixels + px * K, j - i,
                                                     grid + 3 * i, features + row * D,
                                                     j - i > 1 ? &e : err);
        if (st != MMRT_OK && j - i == 1)
            return st;
        if (st != MMRT_OK) { /* the packed pass did not fit: one pass each */
            mmrt_log(MMRT_LOG_DEBUG, "qwen2vl", "%d images in one pass failed (%s); one pass "
                     "each", j - i, e.msg);
            j = i + 1;
            patches = (int64_t)grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2];
            rows = tokens[i];
            st = mmrt_qwen2vl_vision_forward(&m->vt, pixels + px * K, 1, grid + 3 * i,
                                             features + row * D, err);
            if (st != MMRT_OK)
                return st;
        }
        px += patches;
        row += rows;
        i = j;
    }
    return MMRT_OK;
}

static mmrt_status q_encode(struct mmrt_model *m, const struct mmrt_request *req,
                            const struct mmrt_model_trace *trace,
                            struct mmrt_vision_output *out, struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    if (req->n_images == 0)
        return MMRT_OK;
    const int64_t D = m->lm.cfg.hidden;
    struct q_prep p;
    mmrt_status st = q_pixels(m, req, trace, &p, err);
    if (st != MMRT_OK)
        return st;
    double t1 = mmrt_now_ms();
    float *features = malloc((size_t)(p.n_tokens * D) * sizeof *features);
    if (!features)
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "images: out of memory");
    else
        st = q_tower(m, p.pixels, p.n, p.grid, p.tokens, p.n_patches, features, err);
    if (st != MMRT_OK) {
        free(features);
        q_prep_free(&p);
        return st;
    }
    int64_t at = 0;
    for (int i = 0; trace && trace->image_features && i < p.n; i++) {
        trace->image_features(trace->user, i, features + at * D, p.tokens[i], D);
        at += p.tokens[i];
    }
    *out = (struct mmrt_vision_output){
        .n_images = p.n, .n_tokens = p.n_tokens, .dim = D, .features = features,
        .tokens_per_image = p.tokens, .grid_thw = p.grid, .preprocess_ms = p.preprocess_ms,
        .vision_ms = mmrt_now_ms() - t1,
    };
    p.tokens = NULL;
    p.grid = NULL;
    q_prep_free(&p);
    return MMRT_OK;
}

/* Vision stage of several requests (model.h encode_batch): each request's images prepared
 * on its own (a bad one fails only its request), then every request's images through the
 * tower together, packed as q_tower allows. */
static void q_encode_batch(struct mmrt_model *m, const struct mmrt_request *const *reqs, int n,
                           struct mmrt_vision_output *outs, mmrt_status *sts,
                           struct mmrt_error *errs)
{
    const int64_t D = m->lm.cfg.hidden;
    const struct mmrt_qwen2vl_preprocess_config *pp = &m->pp;
    const int64_t K = 3 * (int64_t)pp->temporal_patch_size * pp->patch_size * pp->patch_size;
    struct q_prep *p = calloc((size_t)n, sizeof *p);
    if (!p) {
        for (int i = 0; i < n; i++)
            sts[i] = q_encode(m, reqs[i], NULL, &outs[i], &errs[i]);
        return;
    }
    int n_img = 0;
    int64_t n_patches = 0, n_tokens = 0, largest = 0;
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        sts[i] = reqs[i]->n_images ? q_pixels(m, reqs[i], NULL, &p[i], &errs[i]) : MMRT_OK;
        n_img += p[i].n;
        n_patches += p[i].n_patches;
        n_tokens += p[i].n_tokens;
        largest = p[i].n_patches > largest ? p[i].n_patches : largest;
    }
    const double t1 = mmrt_now_ms();
    float *pixels = malloc((size_t)(n_patches * K) * sizeof *pixels + 1);
    int32_t *grid = malloc((size_t)n_img * 3 * sizeof *grid + 1);
    int64_t *tokens = malloc((size_t)n_img * sizeof *tokens + 1);
    float *features = malloc((size_t)(n_tokens * D) * sizeof *features + 1);
    struct mmrt_error e = { 0 };
    mmrt_status st = MMRT_ERR_NO_MEMORY;
    if (pixels && grid && tokens && features) {
        int64_t px = 0;
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (p[i].n == 0) /* no images, or failed */
                continue;
            memcpy(pixels + px * K, p[i].pixels, (size_t)(p[i].n_patches * K) * sizeof *pixels);
            memcpy(grid + 3 * k, p[i].grid, (size_t)p[i].n * 3 * sizeof *grid);
            memcpy(tokens + k, p[i].tokens, (size_t)p[i].n * sizeof *tokens);
            px += p[i].n_patches;
            k += p[i].n;
        }
        st = n_img ? q_tower(m, pixels, n_img, grid, tokens, largest, features, &e) : MMRT_OK;
    }
    const double vision_ms = mmrt_now_ms() - t1;
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        if (sts[i] != MMRT_OK || p[i].n == 0) {
            row += p[i].n_tokens;
            continue;
        }
        float *f = NULL;
        if (st != MMRT_OK) {
            /* The pass over everyone failed (out of memory, a device error): each request
             * alone, in its own words. */
            sts[i] = q_encode(m, reqs[i], NULL, &outs[i], &errs[i]);
        } else if (!(f = malloc((size_t)(p[i].n_tokens * D) * sizeof *f))) {
            sts[i] = mmrt_error_set(&errs[i], MMRT_ERR_NO_MEMORY, "images: out of memory");
        } else {
            memcpy(f, features + row * D, (size_t)(p[i].n_tokens * D) * sizeof *f);
            outs[i] = (struct mmrt_vision_output){
                .n_images = p[i].n, .n_tokens = p[i].n_tokens, .dim = D, .features = f,
                .tokens_per_image = p[i].tokens, .grid_thw = p[i].grid,
                .preprocess_ms = p[i].preprocess_ms, .vision_ms = vision_ms,
            };
            p[i].tokens = NULL;
            p[i].grid = NULL;
        }
        row += p[i].n_tokens;
    }
    for (int i = 0; i < n; i++)
        q_prep_free(&p[i]);
    free(p);
    free(pixels);
    free(grid);
    free(tokens);
    free(features);
}

/* ---- language stage ---- */

/* Appends s to the growing buffer *buf (length *len, capacity *cap). */
static int count_id(const int32_t *ids, size_t n, int32_t id)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += ids[i] == id;
    return k;
}

/* Renders the template, tokenizes, expands image i's placeholder into tokens[i] ids and
 * records where each image's span starts. */
static mmrt_status build_prompt(const struct mmrt_model *m, const struct mmrt_request *req,
                                const struct mmrt_vision_output *vis, int32_t **ids_out,
                                int64_t *n_out, int64_t *span, struct mmrt_error *err)
{
    const int n_images = vis->n_images;
    /* Qwen2-VL-Instruct's chat template (models.md §7.5): the default system turn unless the
     * chat starts with one, then <|im_start|>{role}\n, a vision span per image of the turn
     * (unless the text places the <|image_pad|> itself), the text, <|im_end|>\n; then the
     * generation prompt. */
    struct mmrt_text t = { 0 };
    if (req->n_messages == 0 || strcmp(req->messages[0].role, "system") != 0)
        mmrt_text_add(&t, system_turn);
    for (int i = 0; i < req->n_messages; i++) {
        const struct mmrt_message *msg = &req->messages[i];
        const bool placed = msg->text && strstr(msg->text, m->image_pad) != NULL;
        mmrt_text_add(&t, "<|im_start|>");
        mmrt_text_add(&t, msg->role);
        mmrt_text_add(&t, "\n");
        for (int k = 0; !placed && k < msg->n_images; k++) {
            mmrt_text_add(&t, m->vision_start);
            mmrt_text_add(&t, m->image_pad);
            mmrt_text_add(&t, m->vision_end);
        }
        if (msg->text)
            mmrt_text_add(&t, msg->text);
        mmrt_text_add(&t, "<|im_end|>\n");
    }
    mmrt_text_add(&t, "<|im_start|>assistant\n");
    if (t.failed) {
        free(t.s);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    char *text = t.s;
    const size_t len = t.len;
    int32_t *ids = NULL;
    size_t n = 0;
    mmrt_status st = mmrt_tokenizer_encode(m->tok, text, len, 0, &ids, &n, err);
    free(text);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "prompt");
    const int found = count_id(ids, n, m->image_token_id);
    if (count_id(ids, n, m->video_token_id)) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "prompt contains the video placeholder %s; videos are not "
                              "supported", m->video_pad);
    }
    if (found != n_images) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "prompt has %d image placeholder%s (%s) but %d image%s given",
                              found, found == 1 ? "" : "s", m->image_pad, n_images,
                              n_images == 1 ? " was" : "s were");
    }
    int64_t total = (int64_t)n;
    for (int i = 0; i < n_images; i++)
        total += mmrt_vision_output_tokens(vis, i) - 1;
    int32_t *full = malloc((size_t)(total > 0 ? total : 1) * sizeof *full);
    if (!full) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    int64_t k = 0;
    int img = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != m->image_token_id) {
            full[k++] = ids[i];
            continue;
        }
        span[img] = k;
        for (int64_t j = 0; j < mmrt_vision_output_tokens(vis, img); j++)
            full[k++] = m->image_token_id;
        img++;
    }
    free(ids);
    *ids_out = full;
    *n_out = total;
    return MMRT_OK;
}

/* get_rope_index for one sequence: pos [S][3] (t, h, w) and the rope delta. */
static void rope_index(const struct mmrt_model *m, const struct mmrt_vision_output *vis,
                       int64_t S, const int64_t *span, int32_t *pos, int64_t *delta)
{
    const int64_t merge = m->pp.merge_size;
    int64_t cur = 0, i = 0, max_pos = -1;
    int img = 0;
    while (i < S) {
        if (img < vis->n_images && i == span[img]) {
            const int64_t t = vis->grid_thw[3 * img], H = vis->grid_thw[3 * img + 1] / merge,
                          W = vis->grid_thw[3 * img + 2] / merge;
            for (int64_t a = 0; a < t; a++)
                for (int64_t b = 0; b < H; b++)
                    for (int64_t c = 0; c < W; c++, i++) {
                        pos[3 * i] = (int32_t)(cur + a);
                        pos[3 * i + 1] = (int32_t)(cur + b);
                        pos[3 * i + 2] = (int32_t)(cur + c);
                    }
            int64_t ext = t > H ? t : H;
            ext = ext > W ? ext : W;
            max_pos = cur + ext - 1 > max_pos ? cur + ext - 1 : max_pos;
            cur += ext;
            img++;
        } else {
            pos[3 * i] = pos[3 * i + 1] = pos[3 * i + 2] = (int32_t)cur;
            max_pos = cur > max_pos ? cur : max_pos;
            cur++;
            i++;
        }
    }
    *delta = max_pos + 1 - S;
}

/* The hand-over must be this model's per-image layout, consistent with its grids. */
static mmrt_status check_vision(const struct mmrt_model *m, const struct mmrt_vision_output *v,
                                struct mmrt_error *err)
{
    if (v->n_images == 0)
        return MMRT_OK;
    if (v->n_images < 0 || v->n_images > MAX_IMAGES || !v->features || !v->tokens_per_image ||
        !v->grid_thw || v->dim != m->lm.cfg.hidden)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "image features (%d images of width %lld) are not Qwen2-VL's "
                              "hand-over for a decoder of width %lld", v->n_images,
                              (long long)v->dim, (long long)m->lm.cfg.hidden);
    const int64_t merge = m->pp.merge_size;
    int64_t sum = 0;
    for (int i = 0; i < v->n_images; i++) {
        const int32_t *g = v->grid_thw + 3 * i;
        if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[1] % merge || g[2] % merge ||
            v->tokens_per_image[i] != (int64_t)g[0] * (g[1] / merge) * (g[2] / merge))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "image %d: %lld features do not match its grid %d×%d×%d", i,
                                  (long long)v->tokens_per_image[i], g[0], g[1], g[2]);
        sum += v->tokens_per_image[i];
    }
    if (sum != v->n_tokens)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "image features: %lld rows, the "
                              "images need %lld", (long long)v->n_tokens, (long long)sum);
    return MMRT_OK;
}

/* Language stage: the template, the features of each image in its span, and M-RoPE
 * positions (get_rope_index). */
static mmrt_status q_prepare(struct mmrt_model *m, const struct mmrt_request *req,
                             const struct mmrt_vision_output *vis, struct mmrt_prompt *out,
                             struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    int64_t span[MAX_IMAGES];
    mmrt_status st = check_vision(m, vis, err);
    if (st == MMRT_OK)
        st = build_prompt(m, req, vis, &out->ids, &out->n_ids, span, err);
    if (st == MMRT_OK) {
        out->pos = malloc((size_t)(out->n_ids > 0 ? out->n_ids : 1) * 3 * sizeof *out->pos);
        if (!out->pos)
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    if (st == MMRT_OK)
        rope_index(m, vis, out->n_ids, span, out->pos, &out->rope_delta);
    /* masked_scatter: the features fill the image rows in order, image by image. */
    int64_t src = 0;
    for (int i = 0; st == MMRT_OK && i < vis->n_images; i++) {
        const int64_t nt = mmrt_vision_output_tokens(vis, i);
        st = mmrt_prompt_add_splice(out, span[i], nt, src, err);
        src += nt;
        /* The merged grid, frame after frame (get_rope_index's order). */
        const int64_t merge = m->pp.merge_size, t = vis->grid_thw[3 * i],
                      H = vis->grid_thw[3 * i + 1] / merge, W = vis->grid_thw[3 * i + 2] / merge;
        for (int64_t f = 0; st == MMRT_OK && f < t; f++)
            st = mmrt_prompt_add_grid(out, span[i] + f * H * W, H, W, W, err);
    }
    if (st != MMRT_OK)
        mmrt_prompt_free(out);
    return st;
}

static void q_language(struct mmrt_model *m, struct mmrt_language *out)
{
    *out = (struct mmrt_language){ .decoder = &m->lm.dec, .tok = m->tok, .eos = m->eos,
                                   .n_eos = m->n_eos };
}

const struct mmrt_model_type mmrt_qwen2vl_model_type = {
    .model_type = "qwen2_vl",
    .load = q_load,
    .destroy = q_destroy,
    .encode = q_encode,
    .encode_batch = q_encode_batch,
    .prepare = q_prepare,
    .image_grids = true,
    .language = q_language,
    .max_images = MAX_IMAGES,
};
