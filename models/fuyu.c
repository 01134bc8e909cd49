/*
 * models/fuyu.c — Fuyu-8B (FuyuForCausalLM, model_type "fuyu"): no vision tower; each 30×30
 * patch is projected by one Linear (vision stage), and the Persimmon decoder reads the patch
 * embeddings in place of the |SPEAKER| tokens (language stage). models.md §5, tokenizer §7.4.
 *
 * Request path: decode image → resize to fit the processor's target size (PIL filter, only
 * when larger) → pad right/bottom with the uint8 padding value up to whole patches → rescale,
 * normalize → patches (ph, pw, c) in row order → vision_embed_tokens → host → language device
 * → [per patch row: ncols × |SPEAKER|, |NEWLINE|] <s> prompt <0x04> → embed, overwrite the
 * |SPEAKER| rows with the patch embeddings in order → prefill → sample → streaming decode.
 *
 * Padding to the full target and cropping back to ceil(size/patch)·patch (what the processor
 * does) equals padding only up to whole patches, so the full target is never materialized.
 *
 * Token budget (checked after decoding, before any resampling): the image span,
 * rows · (cols + 1) positions, must fit [model] max_image_tokens (when set) and the context
 * (less <s>, <0x04> and one new token). Over either the request is refused; with
 * oversize_images = downscale an image over max_image_tokens is shrunk instead, as if the
 * user had sent it smaller: the largest size with its aspect ratio whose span fits
 * (image_budget.h), made by one Pillow resize with the processor's filter, then processed
 * as any image of that size (one still larger than the target is then fitted to it, as the
 * processor does with every image).
 *
 * Hand-off layout: struct mmrt_vision_output has no field for a patch grid, and generate()
 * needs the number of columns to place the |NEWLINE| tokens. Fuyu therefore hands over one
 * "image" per patch row: n_images = rows, n_tokens = cols + 1, where the last token of each
 * row is the |NEWLINE| slot (zeros; generate() keeps the text embedding there). The features
 * are thus exactly the image span of the input sequence, row by row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "formats/image.h"
#include "formats/json.h"
#include "formats/tokenizer.h"
#include "image_budget.h"
#include "llava_common.h" /* mmrt_llava_read_eos: end ids, as Qwen2-VL reads them */
#include "log.h"
#include "model.h"
#include "ops.h"
#include "persimmon.h"
#include "preprocess.h"
#include "sampler.h"
#include "weights.h"

struct mmrt_model {
    struct mmrt_dev *vision, *language;
    struct mmrt_weights *w;
    struct mmrt_persimmon lm;
    struct mmrt_weight proj_w;          /* vision_embed_tokens [D, P·P·C] */
    struct mmrt_tensor proj_b;          /* [D] */
    int64_t patch, channels;
    int32_t image_token_id, newline_id, bos_image_id, boa_id;
    int32_t eos[MMRT_LLAVA_MAX_EOS];
    int n_eos;
    struct mmrt_tokenizer *tok;
    struct mmrt_fuyu_preprocess_config pp;
    struct mmrt_model_options opts;
};

static void fuyu_destroy(struct mmrt_model *m)
{
    if (!m)
        return;
    mmrt_persimmon_unload(&m->lm);
    mmrt_weights_close(m->w);
    mmrt_tokenizer_destroy(m->tok);
    free(m);
}

/* preprocessor_config.json (hub layout), else processor_config.json's "image_processor". */
static mmrt_status load_pp(const char *dir, int64_t patch, struct mmrt_fuyu_preprocess_config *pp,
                           struct mmrt_error *err)
{
    char path[4200];
    json_t *root = NULL;
    const json_t *obj;
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
    obj = hub_layout ? root : json_object_get(root, "image_processor");
    if (!json_is_object(obj))
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: no \"image_processor\" object", path);
    else
        st = mmrt_fuyu_preprocess_config_from_json(obj, path, patch, pp, err);
    json_decref(root);
    return st;
}

static mmrt_status find_token(const struct mmrt_tokenizer *tok, const char *piece,
                              const char *path, int32_t *out, struct mmrt_error *err)
{
    int32_t id = mmrt_tokenizer_token_to_id(tok, piece, strlen(piece));
    if (id < 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: the Fuyu token '%s' is not in the vocabulary", path, piece);
    *out = id;
    return MMRT_OK;
}

static mmrt_status fuyu_load(const char *dir, const json_t *config,
                             const struct mmrt_model_options *opts, struct mmrt_dev *vision,
                             struct mmrt_dev *language, struct mmrt_model **out,
                             struct mmrt_error *err)
{
    char what[4200], twhat[4300], path[4200];
    snprintf(what, sizeof what, "%s/config.json", dir);
    struct mmrt_model *m = calloc(1, sizeof *m);
    if (!m)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
    m->vision = vision;
    m->language = language;
    if (opts)
        m->opts = *opts;
    mmrt_status st;
    /* Hub configs are flat; configs saved by newer transformers nest text_config (§1.6.2). */
    const json_t *tcfg = json_object_get(config, "text_config");
    if (tcfg && !json_is_null(tcfg) && !json_is_object(tcfg)) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: text_config must be an object", what);
        goto fail;
    }
    if (!json_is_object(tcfg))
        tcfg = config;
    snprintf(twhat, sizeof twhat, "%s%s", what, tcfg == config ? "" : ": text_config");
    struct mmrt_persimmon_config lcfg;
    st = mmrt_persimmon_config_parse(tcfg, config, twhat, &lcfg, err);
    if (st != MMRT_OK)
        goto fail;
    long long patch, channels, image_token;
    st = mmrt_json_opt_int(config, "patch_size", what, 1, 1024, 30, &patch, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_int(config, "num_channels", what, 1, 16, 3, &channels, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_int(config, "image_token_id", what, 0, INT32_MAX, 71011, &image_token,
                               err);
    if (st != MMRT_OK)
        goto fail;
    if (channels != 3) {
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                            "%s: num_channels %lld is not supported (RGB images, 3)", what,
                            channels);
        goto fail;
    }
    if (image_token >= lcfg.vocab) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: image_token_id %lld is not below the vocab_size %lld", what,
                            image_token, (long long)lcfg.vocab);
        goto fail;
    }
    m->patch = patch;
    m->channels = channels;
    m->image_token_id = (int32_t)image_token;

    /* Preprocessing and tokenizer, before any device memory is touched. */
    st = load_pp(dir, patch, &m->pp, err);
    if (st != MMRT_OK)
        goto fail;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    st = mmrt_tokenizer_load(path, NULL, &m->tok, err);
    if (st != MMRT_OK)
        goto fail;
    if (mmrt_tokenizer_vocab_size(m->tok) > (uint32_t)lcfg.vocab) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: the tokenizer has %u ids, more than the model's vocab_size %lld",
                            path, mmrt_tokenizer_vocab_size(m->tok), (long long)lcfg.vocab);
        goto fail;
    }
    /* The processor looks these up by piece, not by config (§5.5). */
    st = find_token(m->tok, "|NEWLINE|", path, &m->newline_id, err);
    if (st == MMRT_OK)
        st = find_token(m->tok, "<s>", path, &m->bos_image_id, err);
    if (st == MMRT_OK)
        st = find_token(m->tok, "<0x04>", path, &m->boa_id, err);
    if (st != MMRT_OK)
        goto fail;

    /* Placement checks, then weights. */
    static const enum mmrt_op vis_ops[] = { MMRT_OP_MATMUL };
    st = mmrt_dev_require_ops(vision, "the vision stage", vis_ops, 1, err);
    if (st == MMRT_OK)
        st = mmrt_dev_require_ops(language, "the language stage", mmrt_persimmon_ops,
                                  mmrt_persimmon_n_ops, err);
    if (st == MMRT_OK)
        st = mmrt_weights_open(dir, false, &m->w, err);
    if (st != MMRT_OK)
        goto fail;
    mmrt_weights_set_options(m->w, &m->opts);
    const int64_t D = lcfg.hidden, K = patch * patch * channels;
    st = mmrt_weights_load_matrix(m->w, vision, D, K, &m->proj_w, err,
                                  "vision_embed_tokens.weight");
    if (st == MMRT_OK)
        st = mmrt_weights_load(m->w, vision, 1, (const int64_t[]){ D }, &m->proj_b, err,
                               "vision_embed_tokens.bias");
    if (st == MMRT_OK)
        st = mmrt_persimmon_load(&m->lm, m->w, language, &lcfg, &m->opts, err);
    if (st == MMRT_OK)
        st = mmrt_llava_read_eos(dir, lcfg.eos_id, lcfg.vocab, m->tok,
                                 /* Fuyu has no chat template: generation_config's ids */
                                 MMRT_CHAT_TEMPLATE_AUTO, m->eos, &m->n_eos, err);
    if (st != MMRT_OK)
        goto fail;
    *out = m;
    return MMRT_OK;
fail:
    fuyu_destroy(m);
    return st;
}

/* Resized size of a W×H image and its patch grid (§5.4 steps 1 and 4). */
static mmrt_status plan_image(const struct mmrt_fuyu_preprocess_config *pp, uint32_t W, uint32_t H, uint32_t *rw,
                              uint32_t *rh, int64_t *rows, int64_t *cols, struct mmrt_error *err)
{
    uint32_t nw = W, nh = H;
    if (W > pp->target_w || H > pp->target_h) {
        if (!pp->do_resize)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "image %u×%u is larger than the processor's %u×%u and "
                                  "do_resize is off", W, H, pp->target_w, pp->target_h);
        /* The Python expressions in double: scale = min(th/H, tw/W), int(H·s), int(W·s). */
        double sh = (double)pp->target_h / (double)H, sw = (double)pp->target_w / (double)W;
        double s = sh < sw ? sh : sw;
        nh = (uint32_t)((double)H * s);
        nw = (uint32_t)((double)W * s);
        if (nh < 1 || nw < 1)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "image %u×%u would be resized to %u×%u (aspect ratio too "
                                  "extreme)", W, H, nw, nh);
    }
    const uint32_t P = pp->patch;
    uint32_t ch = (nh + P - 1) / P * P, cw = (nw + P - 1) / P * P;
    if (ch > pp->target_h)
        ch = pp->target_h;
    if (cw > pp->target_w)
        cw = pp->target_w;
    *rw = nw;
    *rh = nh;
    *rows = ch / P;
    *cols = cw / P;
    return MMRT_OK;
}

/* The image span of a W × H image, −1 when the processor refuses that size. */
static int64_t image_tokens(const void *ctx, uint32_t W, uint32_t H)
{
    const struct mmrt_fuyu_preprocess_config *pp = ctx;
    uint32_t rw, rh;
    int64_t rows = 0, cols = 0; /* set on MMRT_OK; -O3 cannot see that (maybe-uninitialized) */
    if (plan_image(pp, W, H, &rw, &rh, &rows, &cols, NULL) != MMRT_OK)
        return -1;
    return rows * (cols + 1);
}

/* Decoded image → patches [rows·cols][P·P·3] (host, malloc'ed). */
static mmrt_status make_patches(const struct mmrt_model *m, const struct mmrt_image *img,
                                uint32_t rw, uint32_t rh, int64_t rows, int64_t cols,
                                float **out, struct mmrt_error *err)
{
    const uint32_t P = m->pp.patch, cw = (uint32_t)cols * P, ch = (uint32_t)rows * P;
    struct mmrt_image *resized = NULL, *padded = NULL;
    const struct mmrt_image *cur = img;
    float *chw = NULL, *patches = NULL;
    mmrt_status st = MMRT_OK;
    if (rw != img->width || rh != img->height) {
        st = mmrt_preprocess_resize(img, rw, rh, m->pp.filter, &resized, err);
        if (st != MMRT_OK)
            goto out;
        cur = resized;
    }
    if (cw > cur->width || ch > cur->height) {
        const uint8_t fill[3] = { m->pp.pad_value, m->pp.pad_value, m->pp.pad_value };
        st = mmrt_preprocess_pad(cur, 0, 0, cw - cur->width, ch - cur->height, fill, &padded,
                                 err);
        if (st != MMRT_OK)
            goto out;
        cur = padded;
    }
    const size_t n = (size_t)3 * cw * ch;
    chw = malloc(n * sizeof *chw);
    patches = malloc(n * sizeof *patches);
    if (!chw || !patches) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image: out of memory");
        goto out;
    }
    st = mmrt_preprocess_to_chw(cur, &m->pp.norm, chw, n, err);
    if (st == MMRT_OK)
        st = mmrt_preprocess_patchify(chw, 3, ch, cw, P, P, MMRT_PATCH_HWC, patches, n, err);
    if (st == MMRT_OK) {
        *out = patches;
        patches = NULL;
    }
out:
    mmrt_image_destroy(resized);
    mmrt_image_destroy(padded);
    free(chw);
    free(patches);
    return st;
}

/* patches [N, K] on the host → embeddings [N, D] on the host, on the vision device. */
static mmrt_status project(struct mmrt_model *m, const float *patches, int64_t N, float *emb,
                           struct mmrt_error *err)
{
    const int64_t K = m->patch * m->patch * m->channels, D = m->lm.cfg.hidden;
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, m->vision);
    struct mmrt_tensor x, y;
    mmrt_status st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, K }, &x,
                                         err);
    if (st == MMRT_OK)
        st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (const int64_t[]){ N, D }, &y, err);
    if (st == MMRT_OK)
        st = mmrt_dev_upload(m->vision, &x, patches, (uint64_t)(N * K) * sizeof(float), err);
    if (st == MMRT_OK)
        st = mmrt_op_matmul(m->vision, &x, &m->proj_w, &m->proj_b, &y, err);
    if (st == MMRT_OK)
        st = mmrt_dev_download(m->vision, &y, emb, (uint64_t)(N * D) * sizeof(float), err);
    mmrt_scratch_release(&s);
    return st;
}

/* Vision stage: the image → its patch embeddings, laid out as the image span (see top). */
static mmrt_status fuyu_encode(struct mmrt_model *m, const struct mmrt_request *req,
                               const struct mmrt_model_trace *trace,
                               struct mmrt_vision_output *out, struct mmrt_error *err)
{
    const int64_t D = m->lm.cfg.hidden, K = m->patch * m->patch * m->channels;
    memset(out, 0, sizeof *out);
    if (req->n_images == 0)
        return MMRT_OK;
    double t0 = mmrt_now_ms();
    char name_buf[64];
    const char *name = mmrt_request_image_name(req, 0, name_buf, sizeof name_buf);
    struct mmrt_image *img = NULL;
    float *patches = NULL, *emb = NULL, *span = NULL;
    struct mmrt_image_limits lim;
    mmrt_model_image_limits(&m->opts, &lim);
    mmrt_status st = mmrt_request_image_load(req, 0, &lim, &img, err);
    if (st != MMRT_OK)
        return st;
    uint32_t rw = 0, rh = 0;
    int64_t rows = 0, cols = 0;
    st = plan_image(&m->pp, img->width, img->height, &rw, &rh, &rows, &cols, err);
    if (st != MMRT_OK)
        goto out;
    /* Token budget before any resampling: the image span must fit max_image_tokens, and
     * with <s>, <0x04> and one new token the context. */
    struct mmrt_token_budget b;
    mmrt_token_budget_init(&b, &m->opts);
    const int64_t context_bound = m->lm.cfg.max_positions - 3;
    int64_t n_span = rows * (cols + 1);
    if (mmrt_token_budget_exceeded(&b, n_span) && !b.downscale && b.tokens <= context_bound) {
        st = mmrt_token_budget_refuse(&b, 1, 1, name, img->width, img->height,
                                      rw != img->width || rh != img->height ? rw : 0, rh, n_span,
                                      0, "oversize_images = downscale would shrink it to fit",
                                      err);
        goto out;
    }
    if (mmrt_token_budget_exceeded(&b, n_span) && b.downscale) {
        uint32_t w, h;
        int64_t t;
        if (!mmrt_image_shrink_to_fit(img->width, img->height, b.tokens, image_tokens, &m->pp,
                                      &w, &h, &t)) {
            char hint[256];
            snprintf(hint, sizeof hint, "oversize_images = downscale cannot help: no smaller "
                     "size of this aspect ratio has at most %lld image tokens",
                     (long long)b.tokens);
            st = mmrt_token_budget_refuse(&b, 1, 1, name, img->width, img->height,
                                          0, 0, n_span, 0, hint, err);
            goto out;
        }
        struct mmrt_image *small = NULL;
        st = mmrt_preprocess_resize(img, w, h, m->pp.filter, &small, err);
        if (st != MMRT_OK)
            goto out;
        char budget[160];
        mmrt_log(MMRT_LOG_INFO, "fuyu", "image 1 of 1 (%s, %u×%u): %lld tokens; downscaled to "
                 "%u×%u (%lld tokens) to fit %s", name, img->width, img->height,
                 (long long)n_span, w, h, (long long)t,
                 mmrt_token_budget_describe(&b, budget, sizeof budget));
        mmrt_image_destroy(img);
        img = small;
        st = plan_image(&m->pp, img->width, img->height, &rw, &rh, &rows, &cols, err);
        if (st != MMRT_OK)
            goto out;
        n_span = rows * (cols + 1);
    }
    if (n_span > context_bound) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT,
                            "image %u×%u needs %lld image tokens (%lld×%lld patches of %lld px "
                            "plus row ends), more than the model's context of %lld positions "
                            "allows", img->width, img->height, (long long)n_span, (long long)rows,
                            (long long)cols, (long long)m->patch,
                            (long long)m->lm.cfg.max_positions);
        goto out;
    }
    st = make_patches(m, img, rw, rh, rows, cols, &patches, err);
    if (st != MMRT_OK)
        goto out;
    const int64_t N = rows * cols;
    if (trace && trace->pixel_values)
        trace->pixel_values(trace->user, 0, patches, 2, (const int64_t[]){ N, K });
    double t1 = mmrt_now_ms();
    emb = malloc((size_t)(N * D) * sizeof *emb);
    span = calloc((size_t)(n_span * D), sizeof *span);
    if (!emb || !span) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image: out of memory");
        goto out;
    }
    st = project(m, patches, N, emb, err);
    if (st != MMRT_OK)
        goto out;
    if (trace && trace->image_features)
        trace->image_features(trace->user, 0, emb, N, D);
    for (int64_t r = 0; r < rows; r++)
        memcpy(span + r * (cols + 1) * D, emb + r * cols * D, (size_t)(cols * D) * sizeof *span);
    out->features = span;
    span = NULL;
    out->n_images = (int)rows;
    out->n_tokens = cols + 1;
    out->dim = D;
    out->preprocess_ms = t1 - t0;
    out->vision_ms = mmrt_now_ms() - t1;
out:
    mmrt_image_destroy(img);
    free(patches);
    free(emb);
    free(span);
    return st;
}

/* [image span] <s> prompt <0x04> with an image (§5.5); the tokenizer's own template
 * (|ENDOFTEXT| first) without one. */
static mmrt_status build_prompt(struct mmrt_model *m, const char *prompt, int64_t rows,
                                int64_t cols, int32_t **ids_out, int64_t *n_out,
                                struct mmrt_error *err)
{
    int32_t *ids = NULL, *full = NULL;
    size_t n = 0;
    const bool image = rows > 0;
    mmrt_status st = mmrt_tokenizer_encode(m->tok, prompt, strlen(prompt),
                                           image ? 0 : MMRT_TOKENIZE_ADD_SPECIAL, &ids, &n, err);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "prompt");
    /* The model scatters patches into every |SPEAKER| position; one in the text would take a
     * patch (transformers refuses the count mismatch). */
    for (size_t i = 0; i < n; i++)
        if (ids[i] == m->image_token_id) {
            free(ids);
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "prompt contains the image placeholder token %d at position "
                                  "%zu; Fuyu places image tokens itself", m->image_token_id, i);
        }
    const int64_t n_span = rows * (cols + 1);
    const int64_t total = n_span + (int64_t)n + (image ? 2 : 0);
    full = malloc((size_t)(total ? total : 1) * sizeof *full);
    if (!full) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    int64_t k = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            full[k++] = m->image_token_id;
        full[k++] = m->newline_id;
    }
    if (image)
        full[k++] = m->bos_image_id;
    for (size_t i = 0; i < n; i++)
        full[k++] = ids[i];
    if (image)
        full[k++] = m->boa_id;
    free(ids);
    *ids_out = full;
    *n_out = total;
    return MMRT_OK;
}

/* Language stage: the sequence layout; each row's patches replace its |SPEAKER| embeddings
 * and the |NEWLINE| slot keeps its text embedding. */
static mmrt_status fuyu_prepare(struct mmrt_model *m, const struct mmrt_request *req,
                                const struct mmrt_vision_output *vis, struct mmrt_prompt *out,
                                struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    const int64_t D = m->lm.cfg.hidden;
    const int64_t rows = vis->features ? vis->n_images : 0;
    const int64_t cols = vis->features ? vis->n_tokens - 1 : 0;
    if (vis->features && (cols < 1 || vis->dim != D))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "image features of %lld×%lld do not fit the Fuyu layout "
                              "(rows of cols+1 tokens of %lld)",
                              (long long)vis->n_tokens, (long long)vis->dim, (long long)D);
    /* Fuyu has no chat template (models.md §7.5): one user turn, its raw text. */
    for (int i = 0; i < req->n_messages; i++)
        if (req->n_messages > 1 || strcmp(req->messages[i].role, "user") != 0)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "message %d (%s): Fuyu has no chat template; send one user "
                                  "turn", i, req->messages[i].role);
    const char *text = req->n_messages && req->messages[0].text ? req->messages[0].text : "";
    mmrt_status st = build_prompt(m, text, rows, cols, &out->ids, &out->n_ids, err);
    /* The span starts at position 0, one row of cols patches and a |NEWLINE| per patch row. */
    for (int64_t r = 0; st == MMRT_OK && r < rows; r++)
        st = mmrt_prompt_add_splice(out, r * (cols + 1), cols, r * (cols + 1), err);
    if (st == MMRT_OK && rows > 0)
        st = mmrt_prompt_add_grid(out, 0, rows, cols, cols + 1, err);
    if (st != MMRT_OK)
        mmrt_prompt_free(out);
    return st;
}

static void fuyu_language(struct mmrt_model *m, struct mmrt_language *out)
{
    *out = (struct mmrt_language){ .decoder = &m->lm.dec, .tok = m->tok, .eos = m->eos,
                                   .n_eos = m->n_eos };
}

const struct mmrt_model_type mmrt_fuyu_model_type = {
    .model_type = "fuyu",
    .load = fuyu_load,
    .destroy = fuyu_destroy,
    .encode = fuyu_encode,
    .prepare = fuyu_prepare,
    .image_grids = true,
    .language = fuyu_language,
};
