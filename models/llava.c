/*
 * models/llava.c — LLaVA-1.5 (LlavaForConditionalGeneration, model_type "llava"):
 * CLIP vision tower → feature selection → 2-layer projector (vision stage), LLaMA decoder
 * with the image features spliced into the token embeddings (language stage).
 * models.md §2, chat template §7.5.
 *
 * Request path: decode image → CLIP preprocessing → tower up to vision_feature_layer →
 * drop CLS ("default") → projector → host → language device → template + tokenize →
 * expand each <image> into n_image_tokens ids → embed, overwrite image rows with features →
 * prefill → sample → decode loop with streaming detokenization.
 *
 * Token budget ([model] max_image_tokens): every image takes n_image_tokens (576 for
 * llava-1.5 at 336 px) whatever its size, so an image over the budget is refused after
 * decoding, before preprocessing, whatever oversize_images says; the message says why
 * downscaling cannot help.
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
#include "model.h"
#include "ops.h"
#include "preprocess.h"
#include "weights.h"


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
    bool keep_cls;                              /* strategy "full" */
    int64_t n_image_tokens;                     /* per image */
    int64_t grid;                               /* patches per side of the image */
    int32_t image_token_id;
    int32_t eos[MMRT_LLAVA_MAX_EOS];
    int n_eos;
    enum mmrt_chat_template chat; /* mmrt_llava_choose_template */
    struct mmrt_tokenizer *tok;
    struct mmrt_clip_preprocess_config pp;
    struct mmrt_model_options opts;
};

static void llava_destroy(struct mmrt_model *m)
{
    if (!m)
        return;
    mmrt_clip_unload(&m->clip);
    mmrt_llama_unload(&m->lm);
    mmrt_weights_close(m->w);
    mmrt_tokenizer_destroy(m->tok);
    free(m->dir);
    free(m);
}

static mmrt_status llava_load(const char *dir, const json_t *config,
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
    struct mmrt_llava_config lc;
    st = mmrt_llava_config_parse(config, what, &lc, err);
    if (st != MMRT_OK)
        goto fail;
    const struct mmrt_clip_config ccfg = lc.clip;
    const struct mmrt_llama_config lcfg = lc.text;
    m->image_token_id = lc.image_token_id;
    m->proj_act = lc.proj_act;
    m->keep_cls = lc.keep_cls;
    memcpy(m->feature_layers, lc.feature_layers, sizeof m->feature_layers);
    m->n_feature_layers = lc.n_feature_layers;
    const int64_t grid = ccfg.image_size / ccfg.patch;
    m->grid = grid;
    m->n_image_tokens = grid * grid + (m->keep_cls ? 1 : 0);

    /* Preprocessing and tokenizer, before any device memory is touched. */
    st = mmrt_llava_load_preprocessor_config(dir, path, sizeof path, &pp_json, NULL, &m->pp,
                                             err);
    if (st != MMRT_OK)
        goto fail;
    uint32_t ow, oh;
    st = mmrt_preprocess_clip_output_size((uint32_t)ccfg.image_size, (uint32_t)ccfg.image_size,
                                          &m->pp, &ow, &oh, err);
    if (st != MMRT_OK)
        goto fail;
    /* Every image must come out at the tower's size whatever its own: a centre crop does
     * that, and so does an exact resize without a crop (the whole picture, squashed). */
    const bool fixed_size = m->pp.do_center_crop ||
                            (m->pp.do_resize && m->pp.resize_mode == MMRT_RESIZE_EXACT);
    if (!fixed_size || ow != ccfg.image_size || oh != ccfg.image_size) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: preprocessing must produce %lld×%lld images (the vision "
                            "tower's image_size) from any input: a centre crop or an exact "
                            "resize; it produces %u×%u", path,
                            (long long)ccfg.image_size, (long long)ccfg.image_size, ow, oh);
        goto fail;
    }
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
    if (st == MMRT_OK)
        st = mmrt_llama_load(&m->lm, m->w, language, &lcfg, &m->opts, err);
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
    llava_destroy(m);
    return st;
}

static const struct mmrt_tensor *opt(const struct mmrt_tensor *t)
{
    return t->buffer ? t : NULL;
}

/* Vision stage of B images: pixels [B, 3, S, S] on the host → features [B · n_image_tokens,
 * Dt] on the host, image b's after image b − 1's. Every product runs over the B images' rows
 * together; with more than MMRT_SMALL_M rows per image in each (the tower's and the
 * projector's) an image's features are the bits it gets alone. */
static mmrt_status encode_images(struct mmrt_model *m, const float *pixels, int64_t B,
                                 float *features, struct mmrt_error *err)
{
    const struct mmrt_clip_config *c = &m->clip.cfg;
    const int64_t S = c->image_size, T = (S / c->patch) * (S / c->patch) + 1;
    const int64_t N = m->n_image_tokens, Dv = c->hidden, Dt = m->lm.cfg.hidden;
    const int64_t K = m->n_feature_layers;
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
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 4, NE(B, c->channels, S, S), &px, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(B * T, Dv), &hid, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(B * N, Dv * K), &feat, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(B * N, Dt), &y1, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(B * N, Dt), &y2, err));
    TRY(mmrt_dev_upload(dev, &px, pixels,
                        (uint64_t)(B * c->channels * S * S) * sizeof(float), err));
    for (int64_t i = 0; i < K; i++) {
        /* Each selected hidden state lands in its channel slice of feat. A list of layers
         * re-runs the tower per entry; LLaVA checkpoints use a single layer. */
        TRY(mmrt_clip_forward(&m->clip, &px, m->feature_layers[i], &hid, err));
        for (int64_t b = 0; b < B; b++) {
            struct mmrt_tensor sel = mmrt_tensor_rows(&hid, b * T + (m->keep_cls ? 0 : 1), N);
            struct mmrt_tensor dst = mmrt_tensor_rows(&feat, b * N, N);
            dst.ne[1] = Dv;
            dst.offset += (uint64_t)(i * Dv) * sizeof(float);
            TRY(mmrt_op_copy(dev, &sel, &dst, err));
        }
    }
    TRY(mmrt_op_matmul(dev, &feat, &m->proj1_w, opt(&m->proj1_b), &y1, err));
    TRY(mmrt_op_unary(dev, m->proj_act, &y1, &y1, err));
    TRY(mmrt_op_matmul(dev, &y1, &m->proj2_w, opt(&m->proj2_b), &y2, err));
    TRY(mmrt_dev_download(dev, &y2, features, (uint64_t)(B * N * Dt) * sizeof(float), err));
#undef TRY
#undef NE
out:
    mmrt_scratch_release(&s);
    return st;
}

/* The request's one image decoded and preprocessed into pixels [3, S, S]; an image over the
 * token budget is refused here, before preprocessing. */
static mmrt_status load_pixels(struct mmrt_model *m, const struct mmrt_request *req,
                               float *pixels, struct mmrt_error *err)
{
    const int64_t S = m->clip.cfg.image_size;
    char name_buf[64];
    const char *name = mmrt_request_image_name(req, 0, name_buf, sizeof name_buf);
    struct mmrt_image *img = NULL;
    struct mmrt_image_limits lim;
    mmrt_model_image_limits(&m->opts, &lim);
    mmrt_status st = mmrt_request_image_load(req, 0, &lim, &img, err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_token_budget b;
    mmrt_token_budget_init(&b, &m->opts);
    if (mmrt_token_budget_exceeded(&b, m->n_image_tokens)) {
        char hint[200];
        snprintf(hint, sizeof hint, "LLaVA-1.5 gives every image %lld tokens whatever its size, "
                 "so oversize_images = downscale cannot help", (long long)m->n_image_tokens);
        st = mmrt_token_budget_refuse(&b, 1, 1, name, img->width, img->height, 0, 0,
                                      m->n_image_tokens, 0, hint, err);
    } else {
        st = mmrt_preprocess_clip(img, &m->pp, pixels, (size_t)(3 * S * S), err);
    }
    mmrt_image_destroy(img);
    return st;
}

/* Vision stage: every image of the request → features on the host. */
static mmrt_status llava_encode(struct mmrt_model *m, const struct mmrt_request *req,
                                const struct mmrt_model_trace *trace,
                                struct mmrt_vision_output *out, struct mmrt_error *err)
{
    const int64_t S_img = m->clip.cfg.image_size, Dt = m->lm.cfg.hidden;
    memset(out, 0, sizeof *out);
    if (req->n_images == 0)
        return MMRT_OK;
    double t0 = mmrt_now_ms();
    size_t n_px = (size_t)(3 * S_img * S_img);
    float *pixels = malloc(n_px * sizeof *pixels);
    float *features = malloc((size_t)(m->n_image_tokens * Dt) * sizeof *features);
    mmrt_status st;
    if (!pixels || !features) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image: out of memory");
        goto out;
    }
    st = load_pixels(m, req, pixels, err);
    if (st != MMRT_OK)
        goto out;
    if (trace && trace->pixel_values)
        trace->pixel_values(trace->user, 0, pixels, 4, (const int64_t[]){ 1, 3, S_img, S_img });
    double t1 = mmrt_now_ms();
    st = encode_images(m, pixels, 1, features, err);
    if (st != MMRT_OK)
        goto out;
    if (trace && trace->image_features)
        trace->image_features(trace->user, 0, features, m->n_image_tokens, Dt);
    out->features = features;
    features = NULL;
    out->n_images = 1;
    out->n_tokens = m->n_image_tokens;
    out->dim = Dt;
    out->preprocess_ms = t1 - t0;
    out->vision_ms = mmrt_now_ms() - t1;
out:
    free(pixels);
    free(features);
    return st;
}

/* Vision stage of several requests (model.h encode_batch): each request's image decoded and
 * preprocessed on its own (a bad one fails only its request), then passes of the tower and
 * the projector over up to vision_batch of them when every image has more than MMRT_SMALL_M
 * rows in each product, so that each gets exactly its encode() features; otherwise, or when
 * a pass fails (a pool too small for it), one pass per image. */
static void llava_encode_batch(struct mmrt_model *m, const struct mmrt_request *const *reqs,
                               int n, struct mmrt_vision_output *outs, mmrt_status *sts,
                               struct mmrt_error *errs)
{
    const struct mmrt_clip_config *c = &m->clip.cfg;
    const int64_t S = c->image_size, T = (S / c->patch) * (S / c->patch) + 1;
    const int64_t N = m->n_image_tokens, Dt = m->lm.cfg.hidden;
    const size_t n_px = (size_t)(3 * S * S), n_feat = (size_t)(N * Dt);
    float *pixels = malloc((size_t)n * n_px * sizeof *pixels);
    int *idx = malloc((size_t)n * sizeof *idx);
    double *pre_ms = malloc((size_t)n * sizeof *pre_ms);
    float **feats = calloc((size_t)n, sizeof *feats);
    if (!pixels || !idx || !pre_ms || !feats) {
        for (int i = 0; i < n; i++)
            sts[i] = llava_encode(m, reqs[i], NULL, &outs[i], &errs[i]);
        goto out;
    }
    int k = 0; /* requests with an image ready for the tower, in pixels' order */
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        sts[i] = MMRT_OK;
        if (reqs[i]->n_images == 0)
            continue;
        const double t = mmrt_now_ms();
        if (!(feats[k] = malloc(n_feat * sizeof(float))))
            sts[i] = mmrt_error_set(&errs[i], MMRT_ERR_NO_MEMORY, "image: out of memory");
        else
            sts[i] = load_pixels(m, reqs[i], pixels + (size_t)k * n_px, &errs[i]);
        if (sts[i] != MMRT_OK) {
            free(feats[k]);
            feats[k] = NULL;
            continue;
        }
        pre_ms[k] = mmrt_now_ms() - t;
        idx[k++] = i;
    }
    const double t1 = mmrt_now_ms();
    bool done = false;
    if (k > 1 && T > MMRT_SMALL_M && N > MMRT_SMALL_M) {
        float *all = malloc((size_t)k * n_feat * sizeof *all);
        struct mmrt_error e = { 0 };
        mmrt_status st = all ? MMRT_OK : MMRT_ERR_NO_MEMORY;
        /* images per pass: what the vision pool was sized for (pool_budget.h) */
        int per_pass = m->opts.vision_batch < 1 ? 1 : m->opts.vision_batch;
        per_pass = per_pass > MMRT_CLIP_MAX_BATCH ? MMRT_CLIP_MAX_BATCH : per_pass;
        for (int j = 0; st == MMRT_OK && j < k; j += per_pass) {
            const int b = k - j < per_pass ? k - j : per_pass;
            st = encode_images(m, pixels + (size_t)j * n_px, b, all + (size_t)j * n_feat, &e);
        }
        if (st == MMRT_OK) {
            for (int j = 0; j < k; j++)
                memcpy(feats[j], all + (size_t)j * n_feat, n_feat * sizeof(float));
            done = true;
        } else {
            mmrt_log(MMRT_LOG_DEBUG, "llava", "%d images in one pass failed (%s); one pass "
                     "each", k, e.msg);
        }
        free(all);
    }
    for (int j = 0; !done && j < k; j++)
        sts[idx[j]] = encode_images(m, pixels + (size_t)j * n_px, 1, feats[j], &errs[idx[j]]);
    const double vision_ms = mmrt_now_ms() - t1;
    for (int j = 0; j < k; j++) {
        if (sts[idx[j]] != MMRT_OK)
            continue;
        outs[idx[j]] = (struct mmrt_vision_output){
            .n_images = 1, .n_tokens = N, .dim = Dt, .features = feats[j],
            .preprocess_ms = pre_ms[j], .vision_ms = vision_ms,
        };
        feats[j] = NULL;
    }
out:
    for (int j = 0; feats && j < n; j++)
        free(feats[j]);
    free(feats);
    free(pixels);
    free(idx);
    free(pre_ms);
}

static struct mmrt_llava_lm llava_lm(struct mmrt_model *m)
{
    return (struct mmrt_llava_lm){ .lm = &m->lm, .tok = m->tok,
                                   .image_token_id = m->image_token_id, .eos = m->eos,
                                   .n_eos = m->n_eos, .grid = m->grid, .chat = m->chat,
                                   .grid_offset = m->keep_cls ? 1 : 0 };
}

/* Language stage: the template and where the features go (llava_common.c). */
static mmrt_status llava_prepare(struct mmrt_model *m, const struct mmrt_request *req,
                               const struct mmrt_vision_output *vis, struct mmrt_prompt *out,
                               struct mmrt_error *err)
{
    const struct mmrt_llava_lm l = llava_lm(m);
    return mmrt_llava_prepare(&l, req, vis, out, err);
}

static void llava_language(struct mmrt_model *m, struct mmrt_language *out)
{
    const struct mmrt_llava_lm l = llava_lm(m);
    mmrt_llava_language(&l, out);
}

const struct mmrt_model_type mmrt_llava_model_type = {
    .model_type = "llava",
    .load = llava_load,
    .destroy = llava_destroy,
    .encode = llava_encode,
    .encode_batch = llava_encode_batch,
    .prepare = llava_prepare,
    .image_grids = true,
    .chat_templates = true,
    .language = llava_language,
};
