/* models/clip.c — CLIP vision tower on core ops (see clip.h). */
#include "clip.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"
#include "ops.h"

const enum mmrt_op mmrt_clip_ops[] = {
    MMRT_OP_PATCH_EMBED, MMRT_OP_CONCAT, MMRT_OP_ADD, MMRT_OP_LAYERNORM, MMRT_OP_MATMUL,
    MMRT_OP_ATTENTION, MMRT_OP_QUICK_GELU, MMRT_OP_GELU, MMRT_OP_COPY,
};
const int mmrt_clip_n_ops = (int)(sizeof mmrt_clip_ops / sizeof mmrt_clip_ops[0]);

mmrt_status mmrt_clip_config_parse(const json_t *cfg, const char *what,
                                   struct mmrt_clip_config *out, struct mmrt_error *err)
{
    struct mmrt_clip_config c = { 0 };
    long long v;
    mmrt_status st;
    const char *type = NULL, *act = NULL;
    st = mmrt_json_opt_string(cfg, "model_type", what, "clip_vision_model", &type, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "clip_vision_model") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: vision model_type '%s' is not supported (clip_vision_model)",
                              what, type);
#define INT(key, lo, hi, def, field)                                                           \
    do {                                                                                       \
        st = mmrt_json_opt_int(cfg, key, what, lo, hi, def, &v, err);                          \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
        c.field = v;                                                                           \
    } while (0)
    INT("hidden_size", 1, 1 << 16, 768, hidden);
    INT("intermediate_size", 1, 1 << 18, 3072, intermediate);
    INT("num_hidden_layers", 1, 1024, 12, n_layers);
    INT("num_attention_heads", 1, 1024, 12, n_heads);
    INT("num_channels", 1, 16, 3, channels);
    INT("image_size", 1, 8192, 224, image_size);
    INT("patch_size", 1, 1024, 32, patch);
#undef INT
    if (c.hidden % c.n_heads != 0 || c.hidden / c.n_heads > 256)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: hidden_size %lld / num_attention_heads %lld must be a whole "
                              "head size of at most 256",
                              what, (long long)c.hidden, (long long)c.n_heads);
    if (c.image_size % c.patch != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: image_size %lld is not a multiple of patch_size %lld", what,
                              (long long)c.image_size, (long long)c.patch);
    st = mmrt_json_opt_number(cfg, "layer_norm_eps", what, 0, 1, 1e-5, &c.ln_eps, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(cfg, "hidden_act", what, "quick_gelu", &act, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(act, "quick_gelu") == 0)
        c.act = MMRT_OP_QUICK_GELU;
    else if (strcmp(act, "gelu") == 0)
        c.act = MMRT_OP_GELU;
    else if (strcmp(act, "gelu_pytorch_tanh") == 0 || strcmp(act, "gelu_new") == 0)
        c.act = MMRT_OP_GELU_TANH;
    else
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported",
                              what, act);
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_clip_load(struct mmrt_clip *m, struct mmrt_weights *w, struct mmrt_dev *dev,
                           const struct mmrt_clip_config *cfg, int64_t n_layers,
                           struct mmrt_error *err)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->dev = dev;
    const int64_t D = cfg->hidden, I = cfg->intermediate, P = cfg->patch;
    const int64_t N = (cfg->image_size / P) * (cfg->image_size / P);
    m->layers = calloc((size_t)(n_layers ? n_layers : 1), sizeof *m->layers);
    if (!m->layers)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "vision tower: out of memory");
    mmrt_status st;
    char name[256];
#define LOAD(fn, dst, nd, ...)                                                                 \
    do {                                                                                       \
        st = fn(w, dev, nd, (const int64_t[]){ __VA_ARGS__ }, &(dst), err, "%s", name);        \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
#define NAMED(fn, dst, nd, n, ...)                                                             \
    do {                                                                                       \
        snprintf(name, sizeof name, "%s", n);                                                  \
        LOAD(fn, dst, nd, __VA_ARGS__);                                                        \
    } while (0)
    /* The class embedding is concatenated with F32 activations, so it is kept in F32. */
    NAMED(mmrt_weights_load_f32, m->class_emb, 1, "vision_tower.embeddings.class_embedding", D);
    m->class_emb = mmrt_tensor_reshape(&m->class_emb, 2, (const int64_t[]){ 1, D });
    NAMED(mmrt_weights_load, m->patch_w, 4, "vision_tower.embeddings.patch_embedding.weight", D,
          cfg->channels, P, P);
    NAMED(mmrt_weights_load, m->pos_emb, 2, "vision_tower.embeddings.position_embedding.weight",
          N + 1, D);
    NAMED(mmrt_weights_load, m->pre_ln_w, 1, "vision_tower.pre_layrnorm.weight", D);
    NAMED(mmrt_weights_load, m->pre_ln_b, 1, "vision_tower.pre_layrnorm.bias", D);
    for (int64_t i = 0; i < n_layers; i++) {
        struct mmrt_clip_layer *L = &m->layers[i];
#define LAYER(dst, nd, suffix, ...)                                                            \
        do {                                                                                   \
            snprintf(name, sizeof name, "vision_tower.encoder.layers.%lld.%s", (long long)i,   \
                     suffix);                                                                  \
            LOAD(mmrt_weights_load, dst, nd, __VA_ARGS__);                                     \
        } while (0)
#define MATRIX(dst, suffix, n, k)                                                              \
        do {                                                                                   \
            snprintf(name, sizeof name, "vision_tower.encoder.layers.%lld.%s", (long long)i,   \
                     suffix);                                                                  \
            st = mmrt_weights_load_matrix(w, dev, n, k, &(dst), err, "%s", name);              \
            if (st != MMRT_OK)                                                                 \
                goto fail;                                                                     \
        } while (0)
        LAYER(L->ln1_w, 1, "layer_norm1.weight", D);
        LAYER(L->ln1_b, 1, "layer_norm1.bias", D);
        MATRIX(L->wq, "self_attn.q_proj.weight", D, D);
        LAYER(L->bq, 1, "self_attn.q_proj.bias", D);
        MATRIX(L->wk, "self_attn.k_proj.weight", D, D);
        LAYER(L->bk, 1, "self_attn.k_proj.bias", D);
        MATRIX(L->wv, "self_attn.v_proj.weight", D, D);
        LAYER(L->bv, 1, "self_attn.v_proj.bias", D);
        MATRIX(L->wo, "self_attn.out_proj.weight", D, D);
        LAYER(L->bo, 1, "self_attn.out_proj.bias", D);
        LAYER(L->ln2_w, 1, "layer_norm2.weight", D);
        LAYER(L->ln2_b, 1, "layer_norm2.bias", D);
        MATRIX(L->fc1_w, "mlp.fc1.weight", I, D);
        LAYER(L->fc1_b, 1, "mlp.fc1.bias", I);
        MATRIX(L->fc2_w, "mlp.fc2.weight", D, I);
        LAYER(L->fc2_b, 1, "mlp.fc2.bias", D);
#undef LAYER
#undef MATRIX
        m->n_loaded = i + 1;
    }
#undef NAMED
#undef LOAD
    /* The layers after the last one whose hidden states the model reads, and the final
     * layer norm, belong to the tower (transformers loads them) but change nothing here. */
    for (int64_t i = n_layers; i < cfg->n_layers; i++)
        mmrt_weights_skip(w, "vision_tower.encoder.layers.%lld.", (long long)i);
    mmrt_weights_skip(w, "vision_tower.post_layernorm.");
    return MMRT_OK;
fail:
    mmrt_clip_unload(m);
    return st;
}

void mmrt_clip_unload(struct mmrt_clip *m)
{
    free(m->layers);
    m->layers = NULL;
    m->n_loaded = 0;
}

mmrt_status mmrt_clip_forward(struct mmrt_clip *m, const struct mmrt_tensor *pixels,
                              int64_t n_layers, const struct mmrt_tensor *out,
                              struct mmrt_error *err)
{
    const struct mmrt_clip_config *c = &m->cfg;
    struct mmrt_dev *dev = m->dev;
    if (n_layers < 0 || n_layers > m->n_loaded)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "vision tower: %lld layers asked, %lld "
                              "loaded", (long long)n_layers, (long long)m->n_loaded);
    const int64_t D = c->hidden, H = c->n_heads, hd = D / H, B = pixels->ne[0];
    const int64_t N = (c->image_size / c->patch) * (c->image_size / c->patch), T = N + 1;
    const int64_t R = B * T; /* rows of every product: the images one after the other */
    if (B < 1 || B > MMRT_CLIP_MAX_BATCH)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "vision tower: %lld images in one pass "
                              "(1 … %d)", (long long)B, MMRT_CLIP_MAX_BATCH);
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, dev);
    struct mmrt_tensor patches, x, q, k, v, att, o, f, cu;
    mmrt_status st = MMRT_OK;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            goto done;                                                                         \
    } while (0)
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(B, N, D), &patches, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(R, D), &x, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(R, H, hd), &q, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(R, H, hd), &k, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(R, H, hd), &v, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(R, H, hd), &att, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(R, D), &o, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(R, c->intermediate), &f, err));
    /* Several images attend each within itself: one packed sequence per image. One image
     * passes no cu_seqlens, as before; ATTENTION gives a sequence the same bits either way
     * (plugin.h, batch invariance). */
    const struct mmrt_tensor *cu_q = NULL;
    if (B > 1) {
        int32_t bounds[MMRT_CLIP_MAX_BATCH + 1];
        for (int64_t b = 0; b <= B; b++)
            bounds[b] = (int32_t)(b * T);
        TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_I32, 1, NE(B + 1), &cu, err));
        TRY(mmrt_dev_upload(dev, &cu, bounds, (uint64_t)(B + 1) * sizeof bounds[0], err));
        cu_q = &cu;
    }
    const struct mmrt_tensor *h = out; /* the residual stream lives in the output */
    TRY(mmrt_op_patch_embed(dev, pixels, &m->patch_w, NULL, (int)c->patch, &patches, err));
    struct mmrt_tensor p2 = mmrt_tensor_reshape(&patches, 2, NE(B * N, D));
    for (int64_t b = 0; b < B; b++) {
        struct mmrt_tensor xb = mmrt_tensor_rows(&x, b * T, T);
        struct mmrt_tensor pb = mmrt_tensor_rows(&p2, b * N, N);
        TRY(mmrt_op_concat(dev, &m->class_emb, &pb, 0, &xb, err));
        TRY(mmrt_op_add(dev, &xb, &m->pos_emb, &xb, err));
    }
    TRY(mmrt_op_layernorm(dev, &x, &m->pre_ln_w, &m->pre_ln_b, (float)c->ln_eps, h, err));
    const struct mmrt_attention_params ap = { 1.0f / sqrtf((float)hd), 0, (int32_t)B, 0 };
    struct mmrt_tensor q2 = mmrt_tensor_reshape(&q, 2, NE(R, D));
    struct mmrt_tensor k2 = mmrt_tensor_reshape(&k, 2, NE(R, D));
    struct mmrt_tensor v2 = mmrt_tensor_reshape(&v, 2, NE(R, D));
    struct mmrt_tensor att2 = mmrt_tensor_reshape(&att, 2, NE(R, D));
    for (int64_t l = 0; l < n_layers; l++) {
        const struct mmrt_clip_layer *L = &m->layers[l];
        TRY(mmrt_op_layernorm(dev, h, &L->ln1_w, &L->ln1_b, (float)c->ln_eps, &x, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wq, &L->bq, &q2, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wk, &L->bk, &k2, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wv, &L->bv, &v2, err));
        TRY(mmrt_op_attention(dev, &q, &k, &v, cu_q, cu_q, &ap, &att, err));
        TRY(mmrt_op_matmul(dev, &att2, &L->wo, &L->bo, &o, err));
        TRY(mmrt_op_add(dev, h, &o, h, err));
        TRY(mmrt_op_layernorm(dev, h, &L->ln2_w, &L->ln2_b, (float)c->ln_eps, &x, err));
        TRY(mmrt_op_matmul(dev, &x, &L->fc1_w, &L->fc1_b, &f, err));
        TRY(mmrt_op_unary(dev, c->act, &f, &f, err));
        TRY(mmrt_op_matmul(dev, &f, &L->fc2_w, &L->fc2_b, &o, err));
        TRY(mmrt_op_add(dev, h, &o, h, err));
    }
#undef TRY
#undef NE
done:
    mmrt_scratch_release(&s);
    return st;
}
