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
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clip.h"
#include "formats/image.h"
#include "formats/json.h"
#include "formats/tokenizer.h"
#include "llama.h"
#include "model.h"
#include "ops.h"
#include "preprocess.h"
#include "sampler.h"
#include "weights.h"

#define MAX_FEATURE_LAYERS 8
#define MAX_EOS 8

struct mmrt_model {
    char *dir;
    struct mmrt_dev *vision, *language;
    struct mmrt_weights *w;
    struct mmrt_clip clip;
    struct mmrt_llama lm;
    struct mmrt_tensor proj1_w, proj1_b, proj2_w, proj2_b; /* biases absent when disabled */
    enum mmrt_op proj_act;
    int64_t feature_layers[MAX_FEATURE_LAYERS]; /* hidden_states indices, 0 … L */
    int n_feature_layers;
    bool keep_cls;                              /* strategy "full" */
    int64_t n_image_tokens;                     /* per image */
    int32_t image_token_id;
    int32_t eos[MAX_EOS];
    int n_eos;
    struct mmrt_tokenizer *tok;
    struct mmrt_clip_preprocess_config pp;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

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

static mmrt_status act_from_name(const char *name, const char *what, enum mmrt_op *out,
                                 struct mmrt_error *err)
{
    if (strcmp(name, "gelu") == 0)
        *out = MMRT_OP_GELU;
    else if (strcmp(name, "quick_gelu") == 0)
        *out = MMRT_OP_QUICK_GELU;
    else if (strcmp(name, "gelu_pytorch_tanh") == 0 || strcmp(name, "gelu_new") == 0)
        *out = MMRT_OP_GELU_TANH;
    else if (strcmp(name, "silu") == 0)
        *out = MMRT_OP_SILU;
    else
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: projector_hidden_act '%s' is not supported", what, name);
    return MMRT_OK;
}

/* vision_feature_layer: an int or a list of ints, Python-indexed into L+1 hidden states. */
static mmrt_status parse_feature_layers(struct mmrt_model *m, const json_t *cfg,
                                        const char *what, int64_t n_layers,
                                        struct mmrt_error *err)
{
    const json_t *v = json_object_get(cfg, "vision_feature_layer");
    long long idx[MAX_FEATURE_LAYERS];
    int n = 0;
    if (!v || json_is_null(v)) {
        idx[n++] = -2;
    } else if (json_is_integer(v)) {
        idx[n++] = json_integer_value(v);
    } else if (json_is_array(v) && json_array_size(v) >= 1 &&
               json_array_size(v) <= MAX_FEATURE_LAYERS) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_integer(e))
                return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                      "%s: vision_feature_layer[%zu] is not an integer", what, i);
            idx[n++] = json_integer_value(e);
        }
    } else {
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: vision_feature_layer must be an integer or a list of 1…%d "
                              "integers", what, MAX_FEATURE_LAYERS);
    }
    for (int i = 0; i < n; i++) {
        long long k = idx[i] < 0 ? idx[i] + n_layers + 1 : idx[i];
        if (k < 0 || k > n_layers)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: vision_feature_layer %lld is outside the %lld hidden "
                                  "states of a %lld-layer tower",
                                  what, idx[i], (long long)n_layers + 1, (long long)n_layers);
        m->feature_layers[i] = k;
    }
    m->n_feature_layers = n;
    return MMRT_OK;
}

/* eos ids: generation_config.json when present (int or list), else the text config's. */
static mmrt_status read_eos(struct mmrt_model *m, const char *dir, int64_t vocab,
                            struct mmrt_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        m->eos[0] = (int32_t)m->lm.cfg.eos_id;
        m->n_eos = m->lm.cfg.eos_id >= 0;
        return MMRT_OK;
    }
    fclose(f);
    json_t *root = NULL;
    mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, &root, err);
    if (st != MMRT_OK)
        return st;
    const json_t *e = json_object_get(root, "eos_token_id");
    m->n_eos = 0;
    if (json_is_integer(e)) {
        m->eos[m->n_eos++] = (int32_t)json_integer_value(e);
    } else if (json_is_array(e)) {
        for (size_t i = 0; i < json_array_size(e) && m->n_eos < MAX_EOS; i++)
            if (json_is_integer(json_array_get(e, i)))
                m->eos[m->n_eos++] = (int32_t)json_integer_value(json_array_get(e, i));
    } else if (!e || json_is_null(e)) {
        m->eos[0] = (int32_t)m->lm.cfg.eos_id;
        m->n_eos = m->lm.cfg.eos_id >= 0;
    } else {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: eos_token_id must be an integer or a list",
                            path);
    }
    for (int i = 0; st == MMRT_OK && i < m->n_eos; i++)
        if (m->eos[i] < 0 || m->eos[i] >= vocab)
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: eos_token_id %d is outside the "
                                "vocabulary of %lld", path, m->eos[i], (long long)vocab);
    json_decref(root);
    return st;
}

/* Image settings: preprocessor_config.json (hub layout), else the "image_processor" object
 * of processor_config.json (what transformers 5 writes). `path` receives the file used. */
static mmrt_status load_preprocessor_config(const char *dir, char *path, size_t size,
                                            json_t **root, struct mmrt_clip_preprocess_config *pp,
                                            struct mmrt_error *err)
{
    snprintf(path, size, "%s/preprocessor_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, root, err);
        return st == MMRT_OK ? mmrt_clip_preprocess_config_from_json(*root, path, pp, err) : st;
    }
    snprintf(path, size, "%s/processor_config.json", dir);
    mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, root, err);
    if (st == MMRT_ERR_IO)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: neither preprocessor_config.json nor "
                              "processor_config.json is present", dir);
    if (st != MMRT_OK)
        return st;
    const json_t *ip = json_object_get(*root, "image_processor");
    if (!json_is_object(ip))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: no \"image_processor\" object", path);
    return mmrt_clip_preprocess_config_from_json(ip, path, pp, err);
}

static mmrt_status llava_load(const char *dir, const json_t *config, struct mmrt_dev *vision,
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
    mmrt_status st;
    json_t *empty = json_object();
    json_t *pp_json = NULL;
    if (!empty) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", dir);
        goto fail;
    }
    const json_t *vcfg = json_object_get(config, "vision_config");
    const json_t *tcfg = json_object_get(config, "text_config");
    if ((vcfg && !json_is_object(vcfg)) || (tcfg && !json_is_object(tcfg))) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: vision_config and text_config must be objects", what);
        goto fail;
    }
    char vwhat[4300], twhat[4300];
    snprintf(vwhat, sizeof vwhat, "%s: vision_config", what);
    snprintf(twhat, sizeof twhat, "%s: text_config", what);
    struct mmrt_clip_config ccfg;
    struct mmrt_llama_config lcfg;
    st = mmrt_clip_config_parse(vcfg ? vcfg : empty, vwhat, &ccfg, err);
    if (st == MMRT_OK)
        st = mmrt_llama_config_parse(tcfg ? tcfg : empty, config, twhat, &lcfg, err);
    if (st != MMRT_OK)
        goto fail;

    long long image_token;
    st = mmrt_json_opt_int(config, "image_token_index", what, 0, INT32_MAX, 32000, &image_token,
                           err);
    if (st == MMRT_OK && json_object_get(config, "image_token_id"))
        st = mmrt_json_opt_int(config, "image_token_id", what, 0, INT32_MAX, image_token,
                               &image_token, err);
    if (st != MMRT_OK)
        goto fail;
    if (image_token >= lcfg.vocab) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: image_token_index %lld is not below the vocab_size %lld", what,
                            image_token, (long long)lcfg.vocab);
        goto fail;
    }
    m->image_token_id = (int32_t)image_token;
    const char *act = NULL, *strategy = NULL;
    bool proj_bias;
    st = mmrt_json_opt_string(config, "projector_hidden_act", what, "gelu", &act, err);
    if (st == MMRT_OK)
        st = act_from_name(act, what, &m->proj_act, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(config, "vision_feature_select_strategy", what, "default",
                                  &strategy, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(config, "multimodal_projector_bias", what, true, &proj_bias, err);
    if (st == MMRT_OK)
        st = parse_feature_layers(m, config, what, ccfg.n_layers, err);
    if (st != MMRT_OK)
        goto fail;
    if (strcmp(strategy, "default") != 0 && strcmp(strategy, "full") != 0) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: vision_feature_select_strategy '%s' (default or full)", what,
                            strategy);
        goto fail;
    }
    m->keep_cls = strcmp(strategy, "full") == 0;
    const int64_t grid = ccfg.image_size / ccfg.patch;
    m->n_image_tokens = grid * grid + (m->keep_cls ? 1 : 0);

    /* Preprocessing and tokenizer, before any device memory is touched. */
    st = load_preprocessor_config(dir, path, sizeof path, &pp_json, &m->pp, err);
    if (st != MMRT_OK)
        goto fail;
    uint32_t ow, oh;
    st = mmrt_preprocess_clip_output_size((uint32_t)ccfg.image_size, (uint32_t)ccfg.image_size,
                                          &m->pp, &ow, &oh, err);
    if (st != MMRT_OK)
        goto fail;
    if (!m->pp.do_center_crop || ow != ccfg.image_size || oh != ccfg.image_size) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT,
                            "%s: preprocessing must produce %lld×%lld images (the vision "
                            "tower's image_size), it produces %u×%u", path,
                            (long long)ccfg.image_size, (long long)ccfg.image_size, ow, oh);
        goto fail;
    }
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

    /* Placement checks, then weights. */
    enum mmrt_op vis_ops[32];
    int n_vis = 0;
    for (int i = 0; i < mmrt_clip_n_ops; i++)
        vis_ops[n_vis++] = mmrt_clip_ops[i];
    vis_ops[n_vis++] = m->proj_act;
    vis_ops[n_vis++] = ccfg.act;
    st = mmrt_dev_require_ops(vision, "the vision stage", vis_ops, n_vis, err);
    if (st == MMRT_OK)
        st = mmrt_dev_require_ops(language, "the language stage", mmrt_llama_ops,
                                  mmrt_llama_n_ops, err);
    if (st != MMRT_OK)
        goto fail;
    st = mmrt_weights_open(dir, false, &m->w, err);
    if (st != MMRT_OK)
        goto fail;
    int64_t max_layer = 0;
    for (int i = 0; i < m->n_feature_layers; i++)
        if (m->feature_layers[i] > max_layer)
            max_layer = m->feature_layers[i];
    st = mmrt_clip_load(&m->clip, m->w, vision, &ccfg, max_layer, err);
    if (st != MMRT_OK)
        goto fail;
    const int64_t Dv = ccfg.hidden * m->n_feature_layers, Dt = lcfg.hidden;
    st = mmrt_weights_load(m->w, vision, 2, (const int64_t[]){ Dt, Dv }, &m->proj1_w, err,
                           "multi_modal_projector.linear_1.weight");
    if (st == MMRT_OK)
        st = mmrt_weights_load(m->w, vision, 2, (const int64_t[]){ Dt, Dt }, &m->proj2_w, err,
                               "multi_modal_projector.linear_2.weight");
    if (st == MMRT_OK && proj_bias)
        st = mmrt_weights_load(m->w, vision, 1, (const int64_t[]){ Dt }, &m->proj1_b, err,
                               "multi_modal_projector.linear_1.bias");
    if (st == MMRT_OK && proj_bias)
        st = mmrt_weights_load(m->w, vision, 1, (const int64_t[]){ Dt }, &m->proj2_b, err,
                               "multi_modal_projector.linear_2.bias");
    if (st == MMRT_OK)
        st = mmrt_llama_load(&m->lm, m->w, language, &lcfg, err);
    if (st == MMRT_OK)
        st = read_eos(m, dir, lcfg.vocab, err);
    if (st != MMRT_OK)
        goto fail;
    json_decref(pp_json);
    json_decref(empty);
    *out = m;
    return MMRT_OK;
fail:
    json_decref(pp_json);
    json_decref(empty);
    llava_destroy(m);
    return st;
}

static const struct mmrt_tensor *opt(const struct mmrt_tensor *t)
{
    return t->buffer ? t : NULL;
}

/* Vision stage: pixels [3, S, S] on the host → features [n_image_tokens, Dt] on the host. */
static mmrt_status encode_image(struct mmrt_model *m, const float *pixels, float *features,
                                struct mmrt_error *err)
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
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 4, NE(1, c->channels, S, S), &px, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(T, Dv), &hid, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, Dv * K), &feat, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, Dt), &y1, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, Dt), &y2, err));
    TRY(mmrt_dev_upload(dev, &px, pixels, (uint64_t)(c->channels * S * S) * sizeof(float),
                        err));
    for (int64_t i = 0; i < K; i++) {
        /* Each selected hidden state lands in its channel slice of feat. A list of layers
         * re-runs the tower per entry; LLaVA checkpoints use a single layer. */
        TRY(mmrt_clip_forward(&m->clip, &px, m->feature_layers[i], &hid, err));
        struct mmrt_tensor sel = mmrt_tensor_rows(&hid, m->keep_cls ? 0 : 1, N);
        struct mmrt_tensor dst = feat;
        dst.ne[1] = Dv;
        dst.offset += (uint64_t)(i * Dv) * sizeof(float);
        TRY(mmrt_op_copy(dev, &sel, &dst, err));
    }
    TRY(mmrt_op_matmul(dev, &feat, &m->proj1_w, opt(&m->proj1_b), &y1, err));
    TRY(mmrt_op_unary(dev, m->proj_act, &y1, &y1, err));
    TRY(mmrt_op_matmul(dev, &y1, &m->proj2_w, opt(&m->proj2_b), &y2, err));
    TRY(mmrt_dev_download(dev, &y2, features, (uint64_t)(N * Dt) * sizeof(float), err));
#undef TRY
#undef NE
out:
    mmrt_scratch_release(&s);
    return st;
}

/* Renders the LLaVA-1.5 template, tokenizes, and expands each <image> id. */
static mmrt_status build_prompt(struct mmrt_model *m, const char *prompt, int n_images,
                                int32_t **ids_out, int64_t *n_out, int64_t *image_pos,
                                struct mmrt_error *err)
{
    size_t len = strlen(prompt) + 64;
    char *text = malloc(len);
    if (!text)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    snprintf(text, len, "USER: %s%s ASSISTANT:", n_images ? "<image>\n" : "", prompt);
    int32_t *ids = NULL, *full = NULL;
    size_t n = 0;
    mmrt_status st = mmrt_tokenizer_encode(m->tok, text, strlen(text), MMRT_TOKENIZE_ADD_SPECIAL,
                                           &ids, &n, err);
    free(text);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "prompt");
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found += ids[i] == m->image_token_id;
    if (found != n_images) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "prompt has %d image placeholder%s but %d image%s given", found,
                              found == 1 ? "" : "s", n_images, n_images == 1 ? " was" : "s were");
    }
    int64_t total = (int64_t)n + (int64_t)found * (m->n_image_tokens - 1);
    full = malloc((size_t)(total ? total : 1) * sizeof *full);
    if (!full) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    int64_t k = 0;
    *image_pos = -1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == m->image_token_id) {
            *image_pos = k;
            for (int64_t j = 0; j < m->n_image_tokens; j++)
                full[k++] = m->image_token_id;
        } else {
            full[k++] = ids[i];
        }
    }
    free(ids);
    *ids_out = full;
    *n_out = total;
    return MMRT_OK;
}

static bool is_eos(const struct mmrt_model *m, int32_t id)
{
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == id)
            return true;
    return false;
}

/* Vision stage: every image of the request → features on the host. */
static mmrt_status llava_encode(struct mmrt_model *m, const struct mmrt_request *req,
                                const struct mmrt_model_trace *trace,
                                struct mmrt_vision_output *out, struct mmrt_error *err)
{
    const int64_t S_img = m->clip.cfg.image_size, Dt = m->lm.cfg.hidden;
    memset(out, 0, sizeof *out);
    if (!req->image_path)
        return MMRT_OK;
    double t0 = now_ms();
    struct mmrt_image *img = NULL;
    float *pixels = NULL, *features = NULL;
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    mmrt_status st = mmrt_image_load_file(req->image_path, &lim, &img, err);
    if (st != MMRT_OK)
        return st;
    size_t n_px = (size_t)(3 * S_img * S_img);
    pixels = malloc(n_px * sizeof *pixels);
    features = malloc((size_t)(m->n_image_tokens * Dt) * sizeof *features);
    if (!pixels || !features) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "image: out of memory");
        goto out;
    }
    st = mmrt_preprocess_clip(img, &m->pp, pixels, n_px, err);
    if (st != MMRT_OK)
        goto out;
    if (trace && trace->pixel_values)
        trace->pixel_values(trace->user, 0, pixels, 4, (const int64_t[]){ 1, 3, S_img, S_img });
    double t1 = now_ms();
    st = encode_image(m, pixels, features, err);
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
    out->vision_ms = now_ms() - t1;
out:
    mmrt_image_destroy(img);
    free(pixels);
    free(features);
    return st;
}

/* Language stage: template, splice the features, prefill, decode. */
static mmrt_status llava_generate(struct mmrt_model *m, const struct mmrt_request *req,
                                  const struct mmrt_vision_output *vis,
                                  const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                                  void *user, struct mmrt_result *res, struct mmrt_error *err)
{
    const int64_t Dt = m->lm.cfg.hidden, V = m->lm.cfg.vocab;
    float *logits = NULL;
    int32_t *ids = NULL;
    int64_t n_ids = 0, image_pos = -1;
    struct mmrt_kv_cache cache = { 0 };
    struct mmrt_sampler sampler = { 0 };
    struct mmrt_tokenizer_stream *stream = NULL;
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, m->language);
    mmrt_status st;
    memset(res, 0, sizeof *res);
    res->preprocess_ms = vis->preprocess_ms;
    res->vision_ms = vis->vision_ms;
    if (req->max_tokens < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "max_tokens %d must be at least 1",
                              req->max_tokens);
    st = mmrt_sampler_init(&sampler, V, req->temperature, req->top_k, req->top_p, req->seed,
                           err);
    if (st != MMRT_OK)
        return st;
    st = build_prompt(m, req->prompt ? req->prompt : "", vis->n_images, &ids, &n_ids,
                      &image_pos, err);
    if (st != MMRT_OK)
        goto out;
    if (n_ids + req->max_tokens > m->lm.cfg.max_positions) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT,
                            "prompt of %lld tokens plus %d new tokens exceeds the model's "
                            "context of %lld positions",
                            (long long)n_ids, req->max_tokens,
                            (long long)m->lm.cfg.max_positions);
        goto out;
    }
    if (trace && trace->prompt_ids)
        trace->prompt_ids(trace->user, ids, (int)n_ids);
    res->n_prompt_tokens = (int)n_ids;

    double t2 = now_ms();
    struct mmrt_tensor emb;
    logits = malloc((size_t)V * sizeof *logits);
    if (!logits) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "logits: out of memory");
        goto out;
    }
    st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (const int64_t[]){ n_ids, Dt }, &emb, err);
    if (st == MMRT_OK)
        st = mmrt_llama_embed(&m->lm, ids, n_ids, &emb, err);
    if (st == MMRT_OK && image_pos >= 0) {
        struct mmrt_tensor rows = mmrt_tensor_rows(&emb, image_pos, m->n_image_tokens);
        st = mmrt_dev_upload(m->language, &rows, vis->features,
                             (uint64_t)(m->n_image_tokens * Dt) * sizeof(float), err);
    }
    if (st == MMRT_OK)
        st = mmrt_kv_cache_create(&m->lm, n_ids + req->max_tokens, &cache, err);
    if (st == MMRT_OK)
        st = mmrt_llama_forward(&m->lm, &cache, &emb, logits, err);
    if (st == MMRT_OK)
        st = mmrt_tokenizer_stream_create(m->tok, MMRT_DECODE_SKIP_SPECIAL, &stream, err);
    if (st != MMRT_OK)
        goto out;
    mmrt_scratch_release(&s);
    double t3 = now_ms();
    res->prefill_ms = t3 - t2;

    struct mmrt_tensor one;
    st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, (const int64_t[]){ 1, Dt }, &one, err);
    for (int step = 0; st == MMRT_OK && step < req->max_tokens; step++) {
        if (trace && trace->logits)
            trace->logits(trace->user, step, logits, V);
        int32_t tok;
        st = mmrt_sampler_next(&sampler, logits, &tok, err);
        if (st != MMRT_OK)
            break;
        res->n_tokens++;
        const char *piece = "";
        size_t plen = 0;
        st = mmrt_tokenizer_decode_stream(stream, tok, &piece, &plen, err);
        if (st != MMRT_OK)
            break;
        char buf[1024];
        size_t n = plen < sizeof buf - 1 ? plen : sizeof buf - 1;
        memcpy(buf, piece, n);
        buf[n] = '\0';
        bool go_on = on_token ? on_token(user, tok, buf) : true;
        if (!go_on || is_eos(m, tok) || step + 1 == req->max_tokens)
            break;
        st = mmrt_llama_embed(&m->lm, &tok, 1, &one, err);
        if (st == MMRT_OK)
            st = mmrt_llama_forward(&m->lm, &cache, &one, logits, err);
    }
    if (st == MMRT_OK) {
        const char *tail = "";
        size_t tlen = 0;
        st = mmrt_tokenizer_stream_finish(stream, &tail, &tlen, err);
        if (st == MMRT_OK && tlen && on_token) {
            char buf[64];
            size_t n = tlen < sizeof buf - 1 ? tlen : sizeof buf - 1;
            memcpy(buf, tail, n);
            buf[n] = '\0';
            on_token(user, -1, buf);
        }
    }
    res->decode_ms = now_ms() - t3;
    if (res->n_tokens > 1 && res->decode_ms > 0)
        res->decode_tokens_per_s = (res->n_tokens - 1) / (res->decode_ms / 1e3);
out:
    mmrt_scratch_release(&s);
    mmrt_tokenizer_stream_destroy(stream);
    mmrt_kv_cache_destroy(&m->lm, &cache);
    mmrt_sampler_deinit(&sampler);
    free(ids);
    free(logits);
    return st;
}

const struct mmrt_model_type mmrt_llava_model_type = {
    .model_type = "llava",
    .load = llava_load,
    .destroy = llava_destroy,
    .encode = llava_encode,
    .generate = llava_generate,
};
