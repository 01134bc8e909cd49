/*
 * models/llava_next.c — LLaVA-NeXT / 1.6 (LlavaNextForConditionalGeneration, model_type
 * "llava_next"): "anyres" tiling in front of the LLaVA-1.5 pipeline. models.md §3, chat
 * template §7.5.
 *
 * Vision stage, per image (W0 × H0):
 *   best (h, w) = select_best_resolution among image_grid_pinpoints (§3.2 step 1)
 *   resize to fit best keeping the aspect ratio (ceil rule), zero-pad centred to best,
 *   cut into S × S tiles row-major (S = vision image_size); base = the image resized to S × S
 *   patches = [base, tile_0 …]; each → CLIP preprocessing (a no-op resize/crop on S × S, then
 *   rescale + normalize) → CLIP tower → feature layer(s), CLS dropped → projector
 *   → packing (pack_image_features, §3.3): base rows (g² with g = S / patch), then the tiles
 *     laid out as one (g·nph) × (g·npw) map, unpadded by the integer rule of §3.3 step 6, each
 *     remaining map row followed by the image_newline vector.
 * The packed rows go to the host; their count is the number of <image> ids the prompt gets
 * (§3.4 gives the same number without running the tower).
 * Language stage: the LLaVA-1.5 one (llava_common.c), with that per-image count.
 *
 * Token budget ([model] max_image_tokens, checked after decoding and before any resampling):
 * the image's tokens are the packed rows, computed from the geometry alone (§3.4). Over the
 * budget the request is refused, or with oversize_images = downscale the image is shrunk as
 * if the user had sent it smaller: the largest size with its aspect ratio whose tokens fit
 * (image_budget.h), made by one Pillow resize with the processor's filter, after which anyres
 * runs unchanged — a smaller image selects a smaller grid pinpoint and unpads to fewer rows.
 * When even the smallest sizes need more (the base tile alone is g² tokens), it is refused.
 *
 * Only vision_feature_select_strategy "default" is accepted: transformers' pack_image_features
 * views each tile's features as g × g and fails with the CLS row kept ("full").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clip.h"
#include "engine.h"
#include "log.h"
#include "formats/image.h"
#include "formats/json.h"
#include "formats/tokenizer.h"
#include "image_budget.h"
#include "llama.h"
#include "llava_common.h"
#include "log.h"
#include "model.h"
#include "ops.h"
#include "preprocess.h"
#include "weights.h"

#define MAX_PINPOINTS 64
/* Tiles per image: the largest hub grid is 3×3 (llava-v1.6 pinpoints up to 1008²); this bounds
 * a hostile config's memory, not a real checkpoint. */
#define MAX_TILES 64

struct mmrt_model {
    char *dir;
    struct mmrt_dev *vision, *language;
    struct mmrt_weights *w;
    struct mmrt_clip clip;
    struct mmrt_llama lm;
    struct mmrt_weight proj1_w, proj2_w;
    struct mmrt_tensor proj1_b, proj2_b; /* absent when disabled */
    enum mmrt_op proj_act;
    int64_t feature_layers[MMRT_LLAVA_MAX_FEATURE_LAYERS]; /* hidden_states indices, 0 … L */
    int n_feature_layers;
    int64_t pinpoints[MAX_PINPOINTS][2];        /* [height, width], multiples of tile */
    int n_pinpoints;
    int64_t tile;                               /* S: vision image_size */
    int64_t grid;                               /* g: patches per tile side */
    float *newline;                             /* image_newline [Dt], host copy */
    int32_t image_token_id;
    int32_t eos[MMRT_LLAVA_MAX_EOS];
    int n_eos;
    enum mmrt_chat_template chat; /* mmrt_llava_choose_template */
    struct mmrt_tokenizer *tok;
    struct mmrt_clip_preprocess_config pp;
    struct mmrt_model_options opts;
};

static void next_destroy(struct mmrt_model *m)
{
    if (!m)
        return;
    mmrt_clip_unload(&m->clip);
    mmrt_llama_unload(&m->lm);
    mmrt_weights_close(m->w);
    mmrt_tokenizer_destroy(m->tok);
    free(m->newline);
    free(m->dir);
    free(m);
}

/* image_grid_pinpoints: a list of [height, width] pairs (default: the llava-v1.6 list for
 * 336-px tiles). Every side must be a positive multiple of the tile size: transformers views
 * the tile features as (h / S) × (w / S) and would fail (or read past the tiles) otherwise. */
static mmrt_status parse_pinpoints(struct mmrt_model *m, const json_t *cfg, const char *what,
                                   struct mmrt_error *err)
{
    static const int64_t def[5][2] = { { 336, 672 }, { 672, 336 }, { 672, 672 },
                                       { 1008, 336 }, { 336, 1008 } };
    const json_t *v = json_object_get(cfg, "image_grid_pinpoints");
    const int64_t S = m->tile;
    if (!v || json_is_null(v)) {
        memcpy(m->pinpoints, def, sizeof def);
        m->n_pinpoints = 5;
    } else {
        if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > MAX_PINPOINTS)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: image_grid_pinpoints must be a list of 1…%d [height, "
                                  "width] pairs", what, MAX_PINPOINTS);
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *p = json_array_get(v, i);
            if (!json_is_array(p) || json_array_size(p) != 2 ||
                !json_is_integer(json_array_get(p, 0)) || !json_is_integer(json_array_get(p, 1)))
                return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                      "%s: image_grid_pinpoints[%zu] is not a [height, width] "
                                      "pair of integers", what, i);
            m->pinpoints[i][0] = json_integer_value(json_array_get(p, 0));
            m->pinpoints[i][1] = json_integer_value(json_array_get(p, 1));
        }
        m->n_pinpoints = (int)json_array_size(v);
    }
    for (int i = 0; i < m->n_pinpoints; i++) {
        int64_t h = m->pinpoints[i][0], w = m->pinpoints[i][1];
        if (h < S || w < S || h % S || w % S || (h / S) * (w / S) > MAX_TILES)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: image_grid_pinpoints[%d] = [%lld, %lld] must be positive "
                                  "multiples of the vision image_size %lld with at most %d tiles",
                                  what, i, (long long)h, (long long)w, (long long)S, MAX_TILES);
    }
    return MMRT_OK;
}

/* The processor tiles S × S and resizes the base image to S × S; the tower needs exactly S.
 * Anything else would make transformers' processor and model disagree, so refuse it. */
static mmrt_status check_preprocessing(const struct mmrt_model *m, const json_t *ip,
                                       const json_t *config, const char *path,
                                       struct mmrt_error *err)
{
    const struct mmrt_clip_preprocess_config *pp = &m->pp;
    const uint32_t S = (uint32_t)m->tile;
    uint32_t base = pp->resize_mode == MMRT_RESIZE_SHORTEST_EDGE ? pp->shortest_edge
                                                                  : pp->resize_height;
    uint32_t tile = pp->do_center_crop ? pp->crop_height : base;
    bool exact_ok = pp->resize_mode == MMRT_RESIZE_SHORTEST_EDGE ||
                    pp->resize_width == pp->resize_height;
    uint32_t ow, oh;
    mmrt_status st = mmrt_preprocess_clip_output_size(S, S, pp, &ow, &oh, err);
    if (st != MMRT_OK)
        return st;
    if (base != S || tile != S || !exact_ok || ow != S || oh != S)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: the image processor must produce %u×%u tiles and base image "
                              "(the vision tower's image_size); it gives tiles of %u, a base of "
                              "%u and %u×%u patches", path, S, S, tile, base, ow, oh);
    const json_t *pin = json_object_get(ip, "image_grid_pinpoints");
    const json_t *mpin = json_object_get(config, "image_grid_pinpoints");
    if (pin && mpin && !json_equal((json_t *)pin, (json_t *)mpin))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: image_grid_pinpoints differ from config.json's (the "
                              "processor and the model would count image tokens differently)",
                              path);
    return MMRT_OK;
}

static mmrt_status next_load(const char *dir, const json_t *config,
                             const struct mmrt_model_options *opts, struct mmrt_dev *vision,
                             struct mmrt_dev *language, struct mmrt_model **out,
                             struct mmrt_error *err)
{
    char what[4200], path[4200];
    snprintf(what, sizeof what, "%s/config.json", dir);
    struct mmrt_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
    }
    m->vision = vision;
    m->language = language;
    if (opts)
        m->opts = *opts;
    mmrt_status st;
    json_t *pp_json = NULL;
    const json_t *ip = NULL;
    struct mmrt_llava_config lc;
    st = mmrt_llava_config_parse(config, what, &lc, err);
    if (st != MMRT_OK)
        goto fail;
    const struct mmrt_clip_config ccfg = lc.clip;
    const struct mmrt_llama_config lcfg = lc.text;
    m->tile = ccfg.image_size;
    m->grid = ccfg.image_size / ccfg.patch;
    m->image_token_id = lc.image_token_id;
    m->proj_act = lc.proj_act;
    memcpy(m->feature_layers, lc.feature_layers, sizeof m->feature_layers);
    m->n_feature_layers = lc.n_feature_layers;
    st = parse_pinpoints(m, config, what, err);
    if (st != MMRT_OK)
        goto fail;
    if (lc.keep_cls) {
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                            "%s: vision_feature_select_strategy 'full': LLaVA-NeXT packs tiles "
                            "without the CLS token, only 'default' is supported", what);
        goto fail;
    }

    /* Preprocessing and tokenizer, before any device memory is touched. */
    st = mmrt_llava_load_preprocessor_config(dir, path, sizeof path, &pp_json, &ip, &m->pp,
                                                 err);
    if (st == MMRT_OK)
        st = check_preprocessing(m, ip, config, path, err);
    if (st != MMRT_OK)
        goto fail;
    st = mmrt_llava_choose_template(dir, m->opts.chat_template, lc.text_mistral, &m->chat,
                                    err);
    if (st != MMRT_OK)
        goto fail;
    struct mmrt_llava_towers towers = {
        .tok = &m->tok, .w = &m->w, .clip = &m->clip, .proj1_w = &m->proj1_w,
        .proj1_b = &m->proj1_b, .proj2_w = &m->proj2_w, .proj2_b = &m->proj2_b,
        .opts = &m->opts,
    };
    st = mmrt_llava_load_towers(dir, &ccfg, &lcfg, m->proj_act, lc.proj_bias, m->feature_layers,
                                m->n_feature_layers, vision, language, &towers, err);
    const int64_t Dt = lcfg.hidden;
    /* image_newline is only ever copied between feature rows, which happens on the host
     * after the download, so keep an F32 host copy. */
    struct mmrt_tensor nl;
    if (st == MMRT_OK)
        st = mmrt_weights_load_f32(m->w, vision, 1, (const int64_t[]){ Dt }, &nl, err,
                                   "image_newline");
    if (st == MMRT_OK && !(m->newline = malloc((size_t)Dt * sizeof *m->newline)))
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image_newline: out of memory");
    if (st == MMRT_OK) /* commits every tensor loaded so far, image_newline included */
        st = mmrt_llama_load(&m->lm, m->w, language, &lcfg, &m->opts, err);
    if (st == MMRT_OK)
        st = mmrt_dev_download(vision, &nl, m->newline, (uint64_t)Dt * sizeof(float), err);
    if (st == MMRT_OK)
        st = mmrt_llava_read_eos(dir, lcfg.eos_id, lcfg.vocab, m->tok, m->chat, m->eos,
                                     &m->n_eos, err);
    if (st != MMRT_OK)
        goto fail;
    json_decref(pp_json);
    *out = m;
    return MMRT_OK;
fail:
    json_decref(pp_json);
    next_destroy(m);
    return st;
}

/* ---- anyres geometry (transformers' integer and float64 rules, models.md §3.2–3.4) ---- */

/* select_best_resolution: the largest effective resolution, then the least waste, then the
 * first in list order (strict comparisons). */
static void select_best(const struct mmrt_model *m, int64_t H0, int64_t W0, int64_t *bh,
                        int64_t *bw)
{
    int64_t best_eff = 0;
    double best_waste = INFINITY;
    *bh = m->pinpoints[0][0];
    *bw = m->pinpoints[0][1];
    for (int i = 0; i < m->n_pinpoints; i++) {
        int64_t h = m->pinpoints[i][0], w = m->pinpoints[i][1];
        double sw = (double)w / (double)W0, sh = (double)h / (double)H0;
        double s = sw < sh ? sw : sh;
        int64_t dw = (int64_t)((double)W0 * s), dh = (int64_t)((double)H0 * s);
        int64_t eff = dw * dh < W0 * H0 ? dw * dh : W0 * H0;
        double waste = (double)(w * h - eff);
        if (eff > best_eff || (eff == best_eff && waste < best_waste)) {
            best_eff = eff;
            best_waste = waste;
            *bh = h;
            *bw = w;
        }
    }
}

/* int(round(x, 7)) for x ≥ 0. Python rounds the exact decimal value; scaling by 1e7 in
 * double can differ only when x sits within an ulp of a half at the 8th decimal, which the
 * sizes here (ratios of small integers) do not reach. */
static int64_t int_round7(double x)
{
    return (int64_t)nearbyint(x * 1e7) / 10000000;
}

static int64_t floordiv2(int64_t a)
{
    return a >= 0 ? a / 2 : -((-a + 1) / 2);
}

/* unpad_image on a cur_h × cur_w map of an H0 × W0 image: the kept rows [*r0, *r1) and
 * columns [*c0, *c1). */
static void unpad(int64_t H0, int64_t W0, int64_t cur_h, int64_t cur_w, int64_t *r0,
                  int64_t *r1, int64_t *c0, int64_t *c1)
{
    *r0 = 0, *r1 = cur_h, *c0 = 0, *c1 = cur_w;
    if ((double)W0 / (double)H0 > (double)cur_w / (double)cur_h) {
        int64_t new_h = int_round7((double)H0 * ((double)cur_w / (double)W0));
        int64_t pad = floordiv2(cur_h - new_h);
        *r0 = pad, *r1 = cur_h - pad;
    } else {
        int64_t new_w = int_round7((double)W0 * ((double)cur_h / (double)H0));
        int64_t pad = floordiv2(cur_w - new_w);
        *c0 = pad, *c1 = cur_w - pad;
    }
}

/* The packed rows of a W0 × H0 image (pack() gives the same count from the features). */
static int64_t image_tokens(const void *ctx, uint32_t W0, uint32_t H0)
{
    const struct mmrt_model *m = ctx;
    const int64_t g = m->grid;
    int64_t bh, bw, r0, r1, c0, c1;
    select_best(m, H0, W0, &bh, &bw);
    unpad(H0, W0, g * (bh / m->tile), g * (bw / m->tile), &r0, &r1, &c0, &c1);
    return g * g + (r1 - r0) * (c1 - c0 + 1);
}

/* The token budget for the decoded image (see the top): *img may be replaced by a
 * downscaled copy. */
static mmrt_status apply_budget(const struct mmrt_model *m, const char *path,
                                struct mmrt_image **img, struct mmrt_error *err)
{
    struct mmrt_token_budget b;
    mmrt_token_budget_init(&b, &m->opts);
    const uint32_t W0 = (*img)->width, H0 = (*img)->height;
    const int64_t tokens = image_tokens(m, W0, H0);
    if (!mmrt_token_budget_exceeded(&b, tokens))
        return MMRT_OK;
    if (!b.downscale)
        return mmrt_token_budget_refuse(&b, 1, 1, path, W0, H0, 0, 0, tokens, 0,
                                        "oversize_images = downscale would shrink it to fit",
                                        err);
    uint32_t w, h;
    int64_t t;
    if (!mmrt_image_shrink_to_fit(W0, H0, b.tokens, image_tokens, m, &w, &h, &t)) {
        char hint[256];
        snprintf(hint, sizeof hint, "oversize_images = downscale cannot help: no smaller size "
                 "of this aspect ratio has at most %lld image tokens (the base image alone "
                 "takes %lld)", (long long)b.tokens, (long long)(m->grid * m->grid));
        return mmrt_token_budget_refuse(&b, 1, 1, path, W0, H0, 0, 0, tokens, 0, hint, err);
    }
    struct mmrt_image *small = NULL;
    mmrt_status st = mmrt_preprocess_resize(*img, w, h, m->pp.resample, &small, err);
    if (st != MMRT_OK)
        return st;
    char budget[160];
    mmrt_log(MMRT_LOG_INFO, "llava_next", "image 1 of 1 (%s, %u×%u): %lld tokens; downscaled "
             "to %u×%u (%lld tokens) to fit %s", path, W0, H0, (long long)tokens, w, h,
             (long long)t, mmrt_token_budget_describe(&b, budget, sizeof budget));
    mmrt_image_destroy(*img);
    *img = small;
    return MMRT_OK;
}

/* Preprocesses one image into [n_patches][3][S][S] (base first, then tiles row-major). */
static mmrt_status make_patches(const struct mmrt_model *m, const struct mmrt_image *img,
                                int64_t bh, int64_t bw, float *pixels, struct mmrt_error *err)
{
    const int64_t S = m->tile, W0 = img->width, H0 = img->height;
    const size_t per = (size_t)(3 * S * S);
    const uint8_t zero[3] = { 0, 0, 0 };
    struct mmrt_image *resized = NULL, *padded = NULL, *patch = NULL;
    /* get_patch_output_size: fit inside best, ceil on the scaled side. */
    double sw = (double)bw / (double)W0, sh = (double)bh / (double)H0;
    int64_t nw, nh;
    if (sw < sh) {
        nw = bw;
        nh = (int64_t)ceil((double)H0 * sw);
        nh = nh < bh ? nh : bh;
    } else {
        nh = bh;
        nw = (int64_t)ceil((double)W0 * sh);
        nw = nw < bw ? nw : bw;
    }
    mmrt_status st = mmrt_preprocess_resize(img, (uint32_t)nw, (uint32_t)nh, m->pp.resample,
                                            &resized, err);
    /* _pad_for_patching: uint8 zeros, the odd pixel right/bottom. */
    if (st == MMRT_OK)
        st = mmrt_preprocess_crop(resized, -((bw - nw) / 2), -((bh - nh) / 2), (uint32_t)bw,
                                  (uint32_t)bh, zero, &padded, err);
    /* The base image: the whole original squeezed to S × S. */
    if (st == MMRT_OK)
        st = mmrt_preprocess_resize(img, (uint32_t)S, (uint32_t)S, m->pp.resample, &patch, err);
    if (st == MMRT_OK)
        st = mmrt_preprocess_clip(patch, &m->pp, pixels, per, err);
    mmrt_image_destroy(patch);
    patch = NULL;
    const int64_t nph = bh / S, npw = bw / S;
    for (int64_t k = 0; st == MMRT_OK && k < nph * npw; k++) {
        st = mmrt_preprocess_crop(padded, (k % npw) * S, (k / npw) * S, (uint32_t)S,
                                  (uint32_t)S, zero, &patch, err);
        if (st == MMRT_OK)
            st = mmrt_preprocess_clip(patch, &m->pp, pixels + (size_t)(k + 1) * per, per, err);
        mmrt_image_destroy(patch);
        patch = NULL;
    }
    mmrt_image_destroy(resized);
    mmrt_image_destroy(padded);
    return st;
}

static const struct mmrt_tensor *opt(const struct mmrt_tensor *t)
{
    return t->buffer ? t : NULL;
}

/* Tower + projector for the tiles of nr requests: request i's n_tiles[i] tiles [n][3][S][S]
 * follow request i − 1's in pixels; proj[i] receives its [n_tiles[i] · g², Dt] on the host.
 * The tower takes up to the model's vision_batch tiles per pass — tiles of different
 * requests alike — when a tile has more than MMRT_SMALL_M rows (so a tile's hidden states
 * are its bits alone, plugin.h batch invariance); the projector runs per request, over its
 * own tiles, as encode() alone does. */
static mmrt_status encode_tiles(struct mmrt_model *m, const float *pixels, int nr,
                                const int64_t *n_tiles, float *const *proj,
                                struct mmrt_error *err)
{
    const struct mmrt_clip_config *c = &m->clip.cfg;
    const int64_t S = c->image_size, P = m->grid * m->grid, T = P + 1;
    const int64_t Dv = c->hidden, Dt = m->lm.cfg.hidden, K = m->n_feature_layers;
    int64_t n = 0, most = 0;
    for (int r = 0; r < nr; r++) {
        n += n_tiles[r];
        most = n_tiles[r] > most ? n_tiles[r] : most;
    }
    int64_t per_pass = T > MMRT_SMALL_M ? m->opts.vision_batch : 1;
    per_pass = per_pass < 1 ? 1 : per_pass > MMRT_CLIP_MAX_BATCH ? MMRT_CLIP_MAX_BATCH : per_pass;
    per_pass = per_pass > n ? n : per_pass;
    struct mmrt_dev *dev = m->vision;
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, dev);
    struct mmrt_tensor px, hid, feat, y1, y2;
    mmrt_status st;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            goto out;                                                                          \
    } while (0)
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 4, NE(per_pass, c->channels, S, S), &px, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(per_pass * T, Dv), &hid, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(n * P, Dv * K), &feat, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(most * P, Dt), &y1, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(most * P, Dt), &y2, err));
    const uint64_t per = (uint64_t)(c->channels * S * S);
    for (int64_t t = 0; t < n; t += per_pass) {
        const int64_t b = n - t < per_pass ? n - t : per_pass;
        struct mmrt_tensor pxb = mmrt_tensor_rows(&px, 0, b);
        struct mmrt_tensor hidb = mmrt_tensor_rows(&hid, 0, b * T);
        TRY(mmrt_dev_upload(dev, &pxb, pixels + t * (int64_t)per, b * per * sizeof(float),
                            err));
        for (int64_t i = 0; i < K; i++) {
            /* Each selected hidden state (CLS dropped) lands in its channel slice of its
             * tile's rows of feat; the projector then runs over each request's tiles. */
            TRY(mmrt_clip_forward(&m->clip, &pxb, m->feature_layers[i], &hidb, err));
            for (int64_t j = 0; j < b; j++) {
                struct mmrt_tensor sel = mmrt_tensor_rows(&hidb, j * T + 1, P);
                struct mmrt_tensor dst = mmrt_tensor_rows(&feat, (t + j) * P, P);
                dst.ne[1] = Dv;
                dst.offset += (uint64_t)(i * Dv) * sizeof(float);
                TRY(mmrt_op_copy(dev, &sel, &dst, err));
            }
        }
    }
    for (int r = 0, first = 0; r < nr; first += (int)n_tiles[r++]) {
        const int64_t rows = n_tiles[r] * P;
        struct mmrt_tensor fr = mmrt_tensor_rows(&feat, first * P, rows);
        struct mmrt_tensor a = mmrt_tensor_rows(&y1, 0, rows), o = mmrt_tensor_rows(&y2, 0, rows);
        TRY(mmrt_op_matmul(dev, &fr, &m->proj1_w, opt(&m->proj1_b), &a, err));
        TRY(mmrt_op_unary(dev, m->proj_act, &a, &a, err));
        TRY(mmrt_op_matmul(dev, &a, &m->proj2_w, opt(&m->proj2_b), &o, err));
        TRY(mmrt_dev_download(dev, &o, proj[r], (uint64_t)(rows * Dt) * sizeof(float), err));
    }
#undef TRY
#undef NE
out:
    mmrt_scratch_release(&s);
    return st;
}

/* pack_image_features for one image: base rows, then the unpadded tile map row by row with
 * image_newline after each row. Writes *n_tokens rows of Dt to *out and the map's grid
 * (1, rows, columns) to *grid (both malloc'ed): where the patches are for image-token KV
 * compression (next_prepare). */
static mmrt_status pack(const struct mmrt_model *m, const float *proj, int64_t H0, int64_t W0,
                        int64_t nph, int64_t npw, float **out, int64_t *n_tokens, int32_t **grid,
                        struct mmrt_error *err)
{
    const int64_t g = m->grid, P = g * g, Dt = m->lm.cfg.hidden;
    int64_t r0, r1, c0, c1;
    unpad(H0, W0, g * nph, g * npw, &r0, &r1, &c0, &c1);
    const int64_t n = P + (r1 - r0) * (c1 - c0 + 1);
    float *f = malloc((size_t)(n * Dt) * sizeof *f);
    int32_t *thw = malloc(3 * sizeof *thw);
    if (!f || !thw) {
        free(f);
        free(thw);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image features: out of memory");
    }
    thw[0] = 1;
    thw[1] = (int32_t)(r1 - r0);
    thw[2] = (int32_t)(c1 - c0);
    const size_t row = (size_t)Dt * sizeof(float);
    memcpy(f, proj, (size_t)P * row);
    float *dst = f + P * Dt;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = c0; c < c1; c++) {
            /* Map (r, c) is tile (r / g, c / g), tile-local patch (r % g, c % g). */
            int64_t tile = 1 + (r / g) * npw + c / g;
            int64_t idx = tile * P + (r % g) * g + c % g;
            memcpy(dst, proj + idx * Dt, row);
            dst += Dt;
        }
        memcpy(dst, m->newline, row);
        dst += Dt;
    }
    *out = f;
    *n_tokens = n;
    *grid = thw;
    return MMRT_OK;
}

/* A request's image ready for the tower: its tiles' pixels and where they fall. Owned;
 * next_prep_free releases it. */
struct next_prep {
    float *pixels;          /* [n][3][S][S]: the base image, then the grid's tiles */
    int64_t n, nph, npw;    /* tiles, and the grid's rows and columns */
    uint32_t width, height; /* the image's size (after any downscale) */
    double preprocess_ms;
};

static void next_prep_free(struct next_prep *p)
{
    free(p->pixels);
    memset(p, 0, sizeof *p);
}

/* Decoding, the token budget, the best grid and the tiles of req's image into *p. */
static mmrt_status next_pixels(struct mmrt_model *m, const struct mmrt_request *req,
                               struct next_prep *p, struct mmrt_error *err)
{
    const int64_t S = m->tile;
    memset(p, 0, sizeof *p);
    const double t0 = mmrt_now_ms();
    char name_buf[64];
    const char *name = mmrt_request_image_name(req, 0, name_buf, sizeof name_buf);
    struct mmrt_image *img = NULL;
    struct mmrt_image_limits lim;
    mmrt_model_image_limits(&m->opts, &lim);
    mmrt_status st = mmrt_request_image_load(req, 0, &lim, &img, err);
    if (st == MMRT_OK)
        st = apply_budget(m, name, &img, err);
    if (st != MMRT_OK) {
        mmrt_image_destroy(img);
        return st;
    }
    int64_t bh, bw;
    select_best(m, img->height, img->width, &bh, &bw);
    const int64_t nph = bh / S, npw = bw / S, n = 1 + nph * npw;
    float *pixels = malloc((size_t)(n * 3 * S * S) * sizeof *pixels);
    if (!pixels)
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image: out of memory");
    else
        st = make_patches(m, img, bh, bw, pixels, err);
    if (st == MMRT_OK)
        *p = (struct next_prep){ .pixels = pixels, .n = n, .nph = nph, .npw = npw,
                                 .width = img->width, .height = img->height,
                                 .preprocess_ms = mmrt_now_ms() - t0 };
    else
        free(pixels);
    mmrt_image_destroy(img);
    return st;
}

/* Vision stage: the request's image → packed features on the host. */
static mmrt_status next_encode(struct mmrt_model *m, const struct mmrt_request *req,
                               const struct mmrt_model_trace *trace,
                               struct mmrt_vision_output *out, struct mmrt_error *err)
{
    const int64_t S = m->tile, Dt = m->lm.cfg.hidden, P = m->grid * m->grid;
    memset(out, 0, sizeof *out);
    if (req->n_images == 0)
        return MMRT_OK;
    struct next_prep p;
    mmrt_status st = next_pixels(m, req, &p, err);
    if (st != MMRT_OK)
        return st;
    if (trace && trace->pixel_values)
        trace->pixel_values(trace->user, 0, p.pixels, 4, (const int64_t[]){ p.n, 3, S, S });
    double t1 = mmrt_now_ms();
    float *proj = malloc((size_t)(p.n * P * Dt) * sizeof *proj), *features = NULL;
    int32_t *grid = NULL;
    int64_t n_tokens = 0;
    if (!proj)
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image: out of memory");
    if (st == MMRT_OK)
        st = encode_tiles(m, p.pixels, 1, &p.n, &proj, err);
    if (st == MMRT_OK)
        st = pack(m, proj, p.height, p.width, p.nph, p.npw, &features, &n_tokens, &grid, err);
    if (st == MMRT_OK) {
        if (trace && trace->image_features)
            trace->image_features(trace->user, 0, features, n_tokens, Dt);
        *out = (struct mmrt_vision_output){ .n_images = 1, .n_tokens = n_tokens, .dim = Dt,
                                            .features = features, .grid_thw = grid,
                                            .preprocess_ms = p.preprocess_ms,
                                            .vision_ms = mmrt_now_ms() - t1 };
    }
    free(proj);
    next_prep_free(&p);
    return st;
}

/* Vision stage of several requests (model.h encode_batch): each request's image decoded
 * and tiled on its own (a bad one fails only its request), then every tile through the
 * tower in passes of vision_batch tiles (encode_tiles), each request's projector and
 * packing its own. When the shared run fails (a pool too small for it), each request alone. */
static void next_encode_batch(struct mmrt_model *m, const struct mmrt_request *const *reqs,
                              int n, struct mmrt_vision_output *outs, mmrt_status *sts,
                              struct mmrt_error *errs)
{
    const int64_t S = m->tile, Dt = m->lm.cfg.hidden, P = m->grid * m->grid;
    const size_t per = (size_t)(3 * S * S);
    struct next_prep *p = calloc((size_t)n, sizeof *p);
    int64_t *tiles = calloc((size_t)n, sizeof *tiles);
    float **proj = calloc((size_t)n, sizeof *proj);
    int *idx = calloc((size_t)n, sizeof *idx);
    float *pixels = NULL;
    if (!p || !tiles || !proj || !idx) {
        for (int i = 0; i < n; i++)
            sts[i] = next_encode(m, reqs[i], NULL, &outs[i], &errs[i]);
        goto out;
    }
    int k = 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        sts[i] = MMRT_OK;
        if (reqs[i]->n_images == 0)
            continue;
        sts[i] = next_pixels(m, reqs[i], &p[i], &errs[i]);
        if (sts[i] == MMRT_OK && !(proj[k] = malloc((size_t)(p[i].n * P * Dt) * sizeof(float))))
            sts[i] = mmrt_error_set(&errs[i], MMRT_ERR_NO_MEMORY, "image: out of memory");
        if (sts[i] != MMRT_OK)
            continue;
        tiles[k] = p[i].n;
        total += p[i].n;
        idx[k++] = i;
    }
    const double t1 = mmrt_now_ms();
    struct mmrt_error e = { 0 };
    mmrt_status st = MMRT_ERR_NO_MEMORY;
    if (k > 0 && (pixels = malloc((size_t)total * per * sizeof *pixels))) {
        size_t at = 0;
        for (int j = 0; j < k; j++) {
            memcpy(pixels + at, p[idx[j]].pixels, (size_t)tiles[j] * per * sizeof *pixels);
            at += (size_t)tiles[j] * per;
        }
        st = encode_tiles(m, pixels, k, tiles, proj, &e);
    }
    if (k > 0 && st != MMRT_OK)
        mmrt_log(MMRT_LOG_DEBUG, "llava_next", "%d images in shared passes failed (%s); one "
                 "request at a time", k, e.msg);
    const double vision_ms = mmrt_now_ms() - t1;
    for (int j = 0; j < k; j++) {
        const int i = idx[j];
        if (st != MMRT_OK) {
            sts[i] = next_encode(m, reqs[i], NULL, &outs[i], &errs[i]);
            continue;
        }
        float *features = NULL;
        int32_t *grid = NULL;
        int64_t n_tokens = 0;
        sts[i] = pack(m, proj[j], p[i].height, p[i].width, p[i].nph, p[i].npw, &features,
                      &n_tokens, &grid, &errs[i]);
        if (sts[i] == MMRT_OK)
            outs[i] = (struct mmrt_vision_output){ .n_images = 1, .n_tokens = n_tokens,
                                                   .dim = Dt, .features = features,
                                                   .grid_thw = grid,
                                                   .preprocess_ms = p[i].preprocess_ms,
                                                   .vision_ms = vision_ms };
    }
out:
    for (int i = 0; p && i < n; i++)
        next_prep_free(&p[i]);
    for (int j = 0; proj && j < n; j++)
        free(proj[j]);
    free(p);
    free(tiles);
    free(proj);
    free(idx);
    free(pixels);
}

static struct mmrt_llava_lm next_lm(struct mmrt_model *m)
{
    return (struct mmrt_llava_lm){ .lm = &m->lm, .tok = m->tok,
                                   .image_token_id = m->image_token_id, .eos = m->eos,
                                   .n_eos = m->n_eos, .grid = m->grid, .chat = m->chat,
                                   .packed_map = true };
}

/* Language stage: the template and where the features go (llava_common.c). */
static mmrt_status next_prepare(struct mmrt_model *m, const struct mmrt_request *req,
                               const struct mmrt_vision_output *vis, struct mmrt_prompt *out,
                               struct mmrt_error *err)
{
    const struct mmrt_llava_lm l = next_lm(m);
    return mmrt_llava_prepare(&l, req, vis, out, err);
}

static void next_language(struct mmrt_model *m, struct mmrt_language *out)
{
    const struct mmrt_llava_lm l = next_lm(m);
    mmrt_llava_language(&l, out);
}

const struct mmrt_model_type mmrt_llava_next_model_type = {
    .model_type = "llava_next",
    .load = next_load,
    .destroy = next_destroy,
    .encode = next_encode,
    .encode_batch = next_encode_batch,
    .prepare = next_prepare,
    .image_grids = true,
    .chat_templates = true,
    .language = next_language,
};
