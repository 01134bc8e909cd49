/*
 * models/pool_budget.c — the working pool `pool_mb = auto` reserves (see pool_budget.h).
 *
 * Every tensor is counted as the power-of-two block level 2 would give it (blk()). The
 * lists below follow the scratch sets of the model code: one prefill forward of the decoder
 * (its scratch set plus the prompt embeddings and the logits of the decode step), one
 * forward of the vision tower with its projector. Where two model families differ the
 * larger is taken (e.g. the fused QKV of Persimmon and Qwen2-VL's vision blocks).
 */
#include "pool_budget.h"

#include <stdio.h>
#include <string.h>

#include "clip.h"
#include "formats/file.h"
#include "formats/json.h"
#include "llama.h"
#include "kv_cache.h"
#include "llava_common.h"
#include "persimmon.h"
#include "preprocess.h"
#include "qwen2vl_vision.h"

/* Images one Qwen2-VL request may carry (its model type says). */
static int64_t qwen2vl_max_images(void)
{
    const struct mmrt_model_type *t = mmrt_model_type_find("qwen2_vl");
    return t && t->max_images > 0 ? t->max_images : 1;
}

static uint64_t blk(int64_t rows, int64_t width, int64_t elem)
{
    uint64_t n = (uint64_t)(rows > 0 ? rows : 1) * (uint64_t)(width > 0 ? width : 1) *
                 (uint64_t)elem;
    uint64_t b = 256; /* the smallest block of every device pool (core/device.c) */
    while (b < n)
        b <<= 1;
    return b;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* A decoder, as llama.c and persimmon.c allocate it. */
struct lm_dims {
    int64_t hidden, q_width, kv_width, kv_heads, inter, vocab, n_layers, context;
    bool fused_qkv; /* Persimmon: one [S, 3·q_width] projection */
};

/* One engine forward of S rows and O logits rows (core/engine.c): the embedded rows, the
 * decoder's scratch (x, o; q, att; k, v; gate and up; Persimmon's fused qkv), the control
 * block (ids, KV rows, positions, page tables: a generous 8 + W per row) and the logits. */
static uint64_t lm_forward(const struct lm_dims *d, int64_t S, int64_t O, int64_t W)
{
    uint64_t b = blk(S, d->hidden, 4);                       /* embeddings (image spliced) */
    b += 2 * blk(S, d->hidden, 4) + 2 * blk(S, d->q_width, 4) + 2 * blk(S, d->kv_width, 4);
    if (d->fused_qkv)
        b += blk(S, 3 * d->q_width, 4);
    b += 2 * blk(S, d->inter, 4) + blk(S, 8 + W, 4);
    b += blk(O, d->vocab, 4);
    return b;
}

static void lm_budget(const struct lm_dims *d, const struct mmrt_model_options *opts,
                      struct mmrt_pool_budget *out)
{
    const int64_t page = opts && opts->kv_page_tokens > 0 ? opts->kv_page_tokens : 16;
    int64_t kv = opts && opts->max_kv_tokens > 0 ? opts->max_kv_tokens : d->context;
    kv = (kv + page - 1) / page * page;
    out->kv_tokens = kv;
    int64_t counts[MMRT_KV_MAX_BLOCKS];
    const enum mmrt_dtype kv_dt = mmrt_kv_store_dtype(opts ? opts->kv_dtype : MMRT_KV_F32);
    const int64_t heads = d->kv_heads > 0 ? d->kv_heads : 1;
    mmrt_kv_store_plan(mmrt_kv_tensor_bytes(kv_dt, kv, heads, d->kv_width / heads, NULL),
                       2 * d->n_layers, 256, 0,
                       counts, &out->kv_bytes);
    /* The engine cuts prompts into chunks: a prefill forward has at most max_prefill_rows
     * rows (0: a whole prompt at once). Its decode forward's buffers, for max_decode_rows
     * sequences, live as long as the engine. */
    int64_t rows = min64(d->context, kv);
    if (opts && opts->max_prefill_rows > 0)
        rows = min64(rows, opts->max_prefill_rows);
    const int64_t B = opts && opts->max_decode_rows > 0 ? opts->max_decode_rows : 1;
    const int64_t W = (min64(d->context, kv) + page - 1) / page;
    out->language_rows = rows;
    out->positions = min64(d->context, kv);
    out->language_bytes = lm_forward(d, rows, min64(rows, B), W) + lm_forward(d, B, B, W);
}

static struct lm_dims llama_dims(const struct mmrt_llama_config *c)
{
    return (struct lm_dims){ .hidden = c->hidden, .q_width = c->n_heads * c->head_dim,
                             .kv_width = c->n_kv_heads * c->head_dim, .kv_heads = c->n_kv_heads,
                             .inter = c->intermediate,
                             .vocab = c->vocab, .n_layers = c->n_layers,
                             .context = c->max_positions };
}

/* One CLIP layer over T rows of width D (clip.c): patches, x, q, k, v, att, o, the MLP. */
static uint64_t clip_forward(const struct mmrt_clip_config *c, int64_t T)
{
    return blk(T, c->hidden, 4) * 7 + blk(T, c->intermediate, 4);
}

/* The image processor object of dir (preprocessor_config.json, else processor_config.json's
 * "image_processor"); *root NULL and *obj NULL when dir is NULL or has neither. */
static mmrt_status load_processor(const char *dir, json_t **root, const json_t **obj,
                                  char *path, size_t size, struct mmrt_error *err)
{
    *root = NULL;
    *obj = NULL;
    if (!dir)
        return MMRT_OK;
    static const char *const names[2] = { "preprocessor_config.json", "processor_config.json" };
    for (int i = 0; i < 2; i++) {
        snprintf(path, size, "%s/%s", dir, names[i]);
        /* lstat only: an fopen probe would wait forever on a FIFO; the reader below
         * refuses whatever is not a regular file, by name. */
        if (!mmrt_file_exists(path))
            continue;
        mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, root, err);
        if (st != MMRT_OK)
            return st;
        *obj = i == 0 ? *root : json_object_get(*root, "image_processor");
        if (!json_is_object(*obj))
            *obj = NULL;
        return MMRT_OK;
    }
    return MMRT_OK;
}

static mmrt_status llava_budget(bool next, const char *what, const json_t *config,
                                const struct mmrt_model_options *opts,
                                struct mmrt_pool_budget *out, struct mmrt_error *err)
{
    struct mmrt_llava_config lc;
    mmrt_status st = mmrt_llava_config_parse(config, what, &lc, err);
    if (st != MMRT_OK)
        return st;
    const struct mmrt_clip_config *c = &lc.clip;
    const int64_t S = c->image_size, side = S / c->patch, T = side * side + 1;
    int64_t tiles = 1;
    if (next) {
        /* The largest pinpoint's tiles plus the base image; llava-v1.6's default list
         * tops out at 2×2 (672²). */
        int64_t most = 4;
        const json_t *pins = json_object_get(config, "image_grid_pinpoints");
        for (size_t i = 0; json_is_array(pins) && i < json_array_size(pins); i++) {
            const json_t *p = json_array_get(pins, i);
            const int64_t h = json_integer_value(json_array_get(p, 0));
            const int64_t w = json_integer_value(json_array_get(p, 1));
            if (i == 0)
                most = 1;
            if (h > 0 && w > 0 && (h / S) * (w / S) > most)
                most = (h / S) * (w / S);
        }
        tiles = 1 + most;
    }
    const int64_t Dv = c->hidden, Dt = lc.text.hidden, K = lc.n_feature_layers;
    /* A pass of the tower takes up to vision_batch images (LLaVA-1.5, each with its
     * projector rows) or tiles (NeXT: the tiles of up to vision_batch requests have their
     * features gathered, and each request's projector runs on its own). */
    const int64_t vb = opts && opts->vision_batch > 1 ? opts->vision_batch : 1;
    const int64_t feat_rows = vb * tiles * T, proj_rows = (next ? tiles : vb) * T;
    out->vision_rows = vb * tiles * T;
    /* llava.c / llava_next.c: pixels, the tower's hidden states, the selected features and
     * the projector's two outputs, with one CLIP layer's scratch. */
    out->vision_bytes = blk(vb * c->channels * S, S, 4) + blk(vb * T, Dv, 4) +
                        blk(feat_rows, Dv * K, 4) + 2 * blk(proj_rows, Dt, 4) +
                        clip_forward(c, vb * T);
    const struct lm_dims d = llama_dims(&lc.text);
    lm_budget(&d, opts, out);
    return MMRT_OK;
}

static mmrt_status qwen2vl_budget(const char *dir, int64_t max_images, const char *what, const json_t *config,
                                  const struct mmrt_model_options *opts,
                                  struct mmrt_pool_budget *out, struct mmrt_error *err)
{
    struct mmrt_llama_config tc;
    mmrt_status st = mmrt_llama_config_parse(config, config, what, &tc, err);
    if (st != MMRT_OK)
        return st;
    const json_t *vcfg = json_object_get(config, "vision_config");
    struct mmrt_qwen2vl_vision_config vc;
    char vwhat[4300];
    snprintf(vwhat, sizeof vwhat, "%s: vision_config", what);
    json_t *empty = json_object();
    if (!empty)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    st = mmrt_qwen2vl_vision_config_parse(json_is_object(vcfg) ? vcfg : empty, vwhat, &vc, err);
    json_decref(empty);
    if (st != MMRT_OK)
        return st;
    const struct lm_dims d = llama_dims(&tc);
    lm_budget(&d, opts, out);
    /* A request's images may go through the tower in one forward, and requests share a
     * forward only up to the largest one's patches (qwen2vl.c q_tower), so the bound is on
     * the request: the positions it may fill (the context and the KV store),
     * max_image_tokens ... */
    int64_t tokens = out->positions;
    if (opts && opts->max_image_tokens > 0)
        tokens = min64(tokens, opts->max_image_tokens);
    /* ... and the images a request may carry, each at most the processor's max_pixels. */
    struct mmrt_qwen2vl_preprocess_config pp;
    mmrt_qwen2vl_preprocess_config_default(&pp);
    json_t *root = NULL;
    const json_t *obj = NULL;
    char path[4200];
    st = load_processor(dir, &root, &obj, path, sizeof path, err);
    if (st == MMRT_OK && obj)
        st = mmrt_qwen2vl_preprocess_config_from_json(obj, path, &pp, err);
    json_decref(root);
    if (st != MMRT_OK)
        return st;
    const uint64_t unit = (uint64_t)vc.patch * (uint64_t)vc.merge;
    const int64_t per_image = (int64_t)(pp.max_pixels / (unit * unit));
    if (max_images > 0 && per_image > 0 && per_image <= INT64_MAX / max_images)
        tokens = min64(tokens, per_image * max_images);
    const int64_t m2 = vc.merge * vc.merge;
    const int64_t N = tokens * m2, E = vc.embed_dim;
    const int64_t K = vc.channels * vc.temporal * vc.patch * vc.patch;
    out->vision_rows = N;
    /* qwen2vl_vision.c: px, x, h, qkv, q, k, att, o, the MLP, positions, the merger's two. */
    out->vision_bytes = blk(N, K, 4) + 6 * blk(N, E, 4) + blk(N, 3 * E, 4) +
                        blk(N, vc.mlp_hidden, 4) + blk(N, 2, 4) + blk(tokens + 1, 1, 4) +
                        blk(tokens, m2 * E, 4) + blk(tokens, vc.hidden, 4);
    return MMRT_OK;
}

static mmrt_status fuyu_budget(const char *dir, const char *what, const json_t *config,
                               const struct mmrt_model_options *opts,
                               struct mmrt_pool_budget *out, struct mmrt_error *err)
{
    const json_t *tcfg = json_object_get(config, "text_config");
    if (!json_is_object(tcfg))
        tcfg = config;
    struct mmrt_persimmon_config pc;
    mmrt_status st = mmrt_persimmon_config_parse(tcfg, config, what, &pc, err);
    long long patch = 30, channels = 3, th = 1080, tw = 1920;
    if (st == MMRT_OK)
        st = mmrt_json_opt_int(config, "patch_size", what, 1, 1024, 30, &patch, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_int(config, "num_channels", what, 1, 16, 3, &channels, err);
    json_t *root = NULL;
    const json_t *obj = NULL;
    char path[4200];
    if (st == MMRT_OK)
        st = load_processor(dir, &root, &obj, path, sizeof path, err);
    const json_t *size = obj ? json_object_get(obj, "size") : NULL;
    if (st == MMRT_OK && json_is_object(size)) {
        st = mmrt_json_opt_int(size, "height", path, 1, 1 << 15, th, &th, err);
        if (st == MMRT_OK)
            st = mmrt_json_opt_int(size, "width", path, 1, 1 << 15, tw, &tw, err);
    }
    json_decref(root);
    if (st != MMRT_OK)
        return st;
    const struct lm_dims d = { .hidden = pc.hidden, .q_width = pc.n_heads * pc.head_dim,
                               .kv_width = pc.n_heads * pc.head_dim, .kv_heads = pc.n_heads,
                               .inter = pc.intermediate,
                               .vocab = pc.vocab, .n_layers = pc.n_layers,
                               .context = pc.max_positions, .fused_qkv = true };
    lm_budget(&d, opts, out);
    /* The patches of the target size (an image is fitted into it), at most the positions a
     * request may fill (the context and the KV store) and max_image_tokens. */
    int64_t N = ((th + patch - 1) / patch) * ((tw + patch - 1) / patch);
    N = min64(N, out->positions);
    if (opts && opts->max_image_tokens > 0)
        N = min64(N, opts->max_image_tokens);
    out->vision_rows = N;
    out->vision_bytes = blk(N, channels * patch * patch, 4) + blk(N, pc.hidden, 4);
    return MMRT_OK;
}

mmrt_status mmrt_pool_budget_estimate(const char *model_type, const char *dir,
                                      const json_t *config,
                                      const struct mmrt_model_options *opts,
                                      struct mmrt_pool_budget *out, struct mmrt_error *err)
{
    char what[4200];
    snprintf(what, sizeof what, "%s/config.json", dir ? dir : ".");
    struct mmrt_pool_budget b = { 0 };
    mmrt_status st;
    if (strcmp(model_type, "llava") == 0)
        st = llava_budget(false, what, config, opts, &b, err);
    else if (strcmp(model_type, "llava_next") == 0)
        st = llava_budget(true, what, config, opts, &b, err);
    else if (strcmp(model_type, "qwen2_vl") == 0)
        st = qwen2vl_budget(dir, qwen2vl_max_images(), what, config, opts, &b, err);
    else if (strcmp(model_type, "fuyu") == 0)
        st = fuyu_budget(dir, what, config, opts, &b, err);
    else
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "pool_mb = auto: no memory estimate for "
                            "model_type '%s'; set pool_mb", model_type);
    if (st == MMRT_OK)
        *out = b;
    return st;
}

uint64_t mmrt_pool_budget_mb(const struct mmrt_pool_budget *b, bool vision, bool language)
{
    if (!vision && !language)
        return MMRT_POOL_BUDGET_IDLE_MB;
    uint64_t bytes = 0;
    if (vision)
        bytes += b->vision_bytes;
    if (language)
        bytes += b->kv_bytes + b->language_bytes;
    bytes += bytes / 8;
    return ((bytes + (1u << 20) - 1) >> 20) + MMRT_POOL_BUDGET_SMALL_MB;
}
