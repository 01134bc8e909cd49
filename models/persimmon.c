/*
 * models/persimmon.c — Persimmon decoder on core ops (see persimmon.h).
 *
 * query_key_value produces [S, heads, 3, head_dim] (q, k, v interleaved per head, §5.2); the
 * q, k and v slices are strided views of that one output, made contiguous with COPY, so the
 * checkpoint's fused weight is used as it is. Every forward allocates its activations from
 * the device pool as one scratch set and frees them at the end.
 */
#include "persimmon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"
#include "ops.h"

const enum mmrt_op mmrt_persimmon_ops[] = {
    MMRT_OP_GET_ROWS, MMRT_OP_LAYERNORM, MMRT_OP_MATMUL, MMRT_OP_ROPE, MMRT_OP_COPY,
    MMRT_OP_ATTENTION_PAGED, MMRT_OP_ADD, MMRT_OP_RELU2, MMRT_OP_SET_ROWS,
};
const int mmrt_persimmon_n_ops = (int)(sizeof mmrt_persimmon_ops / sizeof mmrt_persimmon_ops[0]);

struct mmrt_decoder_ws;
static mmrt_status ws_create(void *self, int64_t R, int64_t max_out,
                             struct mmrt_decoder_ws **out, struct mmrt_error *err);
static mmrt_status issue(void *self, struct mmrt_decoder_ws *ws, const struct mmrt_step_io *io,
                         struct mmrt_error *err);

/* theta and partial_rotary_factor: rope_parameters first, then the top-level keys, then the
 * class defaults (25000, 0.5); only the default rope type (models.md §1.6.3). */
static mmrt_status parse_rope(const json_t *cfg, const char *what,
                              struct mmrt_persimmon_config *c, struct mmrt_error *err)
{
    const json_t *params = json_object_get(cfg, "rope_parameters");
    const json_t *scaling = json_object_get(cfg, "rope_scaling");
    const char *type = "default";
    mmrt_status st = mmrt_json_opt_number(cfg, "rope_theta", what, 1e-3, 1e12, 25000.0,
                                          &c->rope_theta, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_number(cfg, "partial_rotary_factor", what, 0, 1, 0.5,
                                  &c->partial_rotary_factor, err);
    if (st != MMRT_OK)
        return st;
    if (params && !json_is_null(params)) {
        if (!json_is_object(params))
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: \"rope_parameters\" must be an object", what);
        st = mmrt_json_opt_number(params, "rope_theta", what, 1e-3, 1e12, c->rope_theta,
                                  &c->rope_theta, err);
        if (st == MMRT_OK)
            st = mmrt_json_opt_number(params, "partial_rotary_factor", what, 0, 1,
                                      c->partial_rotary_factor, &c->partial_rotary_factor, err);
        if (st == MMRT_OK)
            st = mmrt_json_opt_string(params, "rope_type", what, type, &type, err);
    } else if (json_is_object(scaling)) {
        st = mmrt_json_opt_string(scaling, "rope_type", what, NULL, &type, err);
        if (st == MMRT_OK && !type)
            st = mmrt_json_opt_string(scaling, "type", what, "default", &type, err);
    } else if (scaling && !json_is_null(scaling)) {
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"rope_scaling\" must be an object",
                              what);
    }
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "default") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: rope type '%s' is not supported (only default)", what, type);
    return MMRT_OK;
}

mmrt_status mmrt_persimmon_config_parse(const json_t *cfg, const json_t *top, const char *what,
                                        struct mmrt_persimmon_config *out,
                                        struct mmrt_error *err)
{
    struct mmrt_persimmon_config c = { 0 };
    const char *type = NULL, *act = NULL;
    long long v;
    mmrt_status st = mmrt_json_opt_string(cfg, "model_type", what, "persimmon", &type, err);
    if (st != MMRT_OK)
        return st;
    /* A flat hub config carries "fuyu" at the level the text fields live on. */
    if (strcmp(type, "persimmon") != 0 && strcmp(type, "fuyu") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: text model_type '%s' is not supported (persimmon)", what, type);
#define INT(key, lo, hi, def, field)                                                           \
    do {                                                                                       \
        st = mmrt_json_opt_int(cfg, key, what, lo, hi, def, &v, err);                          \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
        c.field = v;                                                                           \
    } while (0)
    INT("vocab_size", 1, 1 << 24, 262144, vocab);
    INT("hidden_size", 1, 1 << 17, 4096, hidden);
    INT("intermediate_size", 1, 1 << 20, 16384, intermediate);
    INT("num_hidden_layers", 1, 1024, 36, n_layers);
    INT("num_attention_heads", 1, 1024, 64, n_heads);
    INT("max_position_embeddings", 1, 1 << 24, 16384, max_positions);
    INT("bos_token_id", -1, 1 << 24, 1, bos_id);
    INT("eos_token_id", -1, 1 << 24, 2, eos_id);
#undef INT
    if (c.hidden % c.n_heads != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: hidden_size %lld is not divisible by num_attention_heads %lld",
                              what, (long long)c.hidden, (long long)c.n_heads);
    /* Persimmon has no head_dim key: the fused qkv projection is 3·hidden wide. */
    c.head_dim = c.hidden / c.n_heads;
    if (c.head_dim > 256)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: head dim %lld is above the attention limit of 256", what,
                              (long long)c.head_dim);
    st = mmrt_json_opt_string(cfg, "hidden_act", what, "relu2", &act, err);
    if (st == MMRT_OK && strcmp(act, "relu2") != 0)
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                            "%s: hidden_act '%s' is not supported (relu2)", what, act);
    if (st == MMRT_OK)
        st = mmrt_json_opt_number(cfg, "layer_norm_eps", what, 0, 1, 1e-5, &c.ln_eps, err);
    if (st == MMRT_OK)
        st = parse_rope(cfg, what, &c, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(cfg, "qk_layernorm", what, true, &c.qk_layernorm, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(cfg, "tie_word_embeddings", what, false, &c.tie_word_embeddings,
                                err);
    if (st == MMRT_OK && top && json_object_get(top, "tie_word_embeddings"))
        st = mmrt_json_opt_bool(top, "tie_word_embeddings", what, c.tie_word_embeddings,
                                &c.tie_word_embeddings, err);
    if (st != MMRT_OK)
        return st;
    if (!(c.rope_theta > 0) || !(c.ln_eps > 0))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: rope theta (%g) and layer_norm_eps (%g) must be positive", what,
                              c.rope_theta, c.ln_eps);
    /* int(head_dim · factor), as PersimmonAttention computes it (truncation). */
    c.n_rot = (int64_t)((double)c.head_dim * c.partial_rotary_factor);
    if (c.n_rot < 2 || c.n_rot % 2 != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: partial_rotary_factor %g gives %lld rotary dims of a head of "
                              "%lld; it must be an even number ≥ 2",
                              what, c.partial_rotary_factor, (long long)c.n_rot,
                              (long long)c.head_dim);
    if (c.bos_id >= c.vocab || c.eos_id >= c.vocab)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: a special token id (bos %lld, eos %lld) is not below "
                              "vocab_size %lld",
                              what, (long long)c.bos_id, (long long)c.eos_id, (long long)c.vocab);
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_persimmon_load(struct mmrt_persimmon *m, struct mmrt_weights *w,
                                struct mmrt_dev *dev, const struct mmrt_persimmon_config *cfg,
                                const struct mmrt_model_options *opts, struct mmrt_error *err)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->dev = dev;
    const int64_t D = cfg->hidden, V = cfg->vocab, I = cfg->intermediate, hd = cfg->head_dim;
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "decoder: out of memory");
    mmrt_status st;
    char name[256];
#define LOAD(dst, nd, nm, ...)                                                                 \
    do {                                                                                       \
        st = mmrt_weights_load(w, dev, nd, (const int64_t[]){ __VA_ARGS__ }, &(dst), err,      \
                               "%s", nm);                                                      \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
#define MATRIX(dst, nm, n, k)                                                                  \
    do {                                                                                       \
        st = mmrt_weights_load_matrix(w, dev, n, k, &(dst), err, "%s", nm);                    \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
    bool tied;
    st = mmrt_weights_load_embed_head(w, dev, V, D, cfg->tie_word_embeddings, &m->embed,
                                      &m->lm_head, &tied, err);
    if (st != MMRT_OK)
        goto fail;
    LOAD(m->final_w, 1, "language_model.final_layernorm.weight", D);
    LOAD(m->final_b, 1, "language_model.final_layernorm.bias", D);
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        struct mmrt_persimmon_layer *L = &m->layers[i];
#define LAYER(dst, nd, suffix, ...)                                                            \
        do {                                                                                   \
            snprintf(name, sizeof name, "language_model.layers.%lld.%s", (long long)i, suffix); \
            LOAD(dst, nd, name, __VA_ARGS__);                                                  \
        } while (0)
#define LAYER_MATRIX(dst, suffix, n, k)                                                        \
        do {                                                                                   \
            snprintf(name, sizeof name, "language_model.layers.%lld.%s", (long long)i, suffix); \
            MATRIX(dst, name, n, k);                                                           \
        } while (0)
        LAYER(L->ln_in_w, 1, "input_layernorm.weight", D);
        LAYER(L->ln_in_b, 1, "input_layernorm.bias", D);
        LAYER_MATRIX(L->qkv_w, "self_attn.query_key_value.weight", 3 * D, D);
        LAYER(L->qkv_b, 1, "self_attn.query_key_value.bias", 3 * D);
        if (cfg->qk_layernorm) {
            LAYER(L->q_ln_w, 1, "self_attn.q_layernorm.weight", hd);
            LAYER(L->q_ln_b, 1, "self_attn.q_layernorm.bias", hd);
            LAYER(L->k_ln_w, 1, "self_attn.k_layernorm.weight", hd);
            LAYER(L->k_ln_b, 1, "self_attn.k_layernorm.bias", hd);
        }
        LAYER_MATRIX(L->dense_w, "self_attn.dense.weight", D, D);
        LAYER(L->dense_b, 1, "self_attn.dense.bias", D);
        LAYER(L->ln_post_w, 1, "post_attention_layernorm.weight", D);
        LAYER(L->ln_post_b, 1, "post_attention_layernorm.bias", D);
        LAYER_MATRIX(L->up_w, "mlp.dense_h_to_4h.weight", I, D);
        LAYER(L->up_b, 1, "mlp.dense_h_to_4h.bias", I);
        LAYER_MATRIX(L->down_w, "mlp.dense_4h_to_h.weight", D, I);
        LAYER(L->down_b, 1, "mlp.dense_4h_to_h.bias", D);
#undef LAYER
#undef LAYER_MATRIX
    }
#undef LOAD
#undef MATRIX
    st = mmrt_weights_decoder_done(w, cfg->n_layers, tied, &m->embed, &m->lm_head, err);
    if (st != MMRT_OK)
        goto fail;
    st = mmrt_decoder_kv_create(dev, cfg->n_layers, cfg->n_heads, cfg->head_dim, cfg->max_positions,
                                opts, &m->kv, err);
    if (st != MMRT_OK)
        goto fail;
    m->dec = (struct mmrt_decoder){
        .self = m, .dev = dev, .kv = &m->kv, .embed = &m->embed, .vocab = cfg->vocab,
        .hidden = cfg->hidden, .max_positions = cfg->max_positions, .n_axes = 0,
        .ws_create = ws_create, .ws_destroy = mmrt_decoder_ws_free, .issue = issue,
    };
    return MMRT_OK;
fail:
    mmrt_persimmon_unload(m);
    return st;
}

void mmrt_persimmon_unload(struct mmrt_persimmon *m)
{
    mmrt_kv_pages_destroy(&m->kv);
    free(m->layers);
    m->layers = NULL;
}

/* Head slice `which` (0 q, 1 k, 2 v) of qkv [S, H, 3, hd], as a strided [S, H, hd] view. */
struct mmrt_tensor mmrt_persimmon_qkv_part(const struct mmrt_tensor *qkv, int which)
{
    struct mmrt_tensor t = *qkv;
    t.n_dims = 3;
    t.ne[0] = qkv->ne[0];
    t.ne[1] = qkv->ne[1];
    t.ne[2] = qkv->ne[3];
    t.nb[0] = qkv->nb[0];
    t.nb[1] = qkv->nb[1];
    t.nb[2] = qkv->nb[3];
    t.ne[3] = 1;
    t.nb[3] = qkv->nb[3];
    t.offset += (uint64_t)which * (uint64_t)qkv->nb[2];
    return t;
}

/* The decoder's activations (decoder.h workspace), by name. */
enum { WS_X, WS_QKV, WS_Q, WS_K, WS_V, WS_ATT, WS_O, WS_U, WS_COUNT };

static mmrt_status ws_create(void *self, int64_t R, int64_t max_out,
                             struct mmrt_decoder_ws **out, struct mmrt_error *err)
{
    const struct mmrt_persimmon *m = self;
    const struct mmrt_persimmon_config *c = &m->cfg;
    (void)max_out; /* the head's rows reuse o and x, R ≥ max_out */
    const int64_t D = c->hidden, H = c->n_heads, hd = c->head_dim;
    const struct mmrt_ws_shape shapes[WS_COUNT] = {
        [WS_X] = { 1, { D } },     [WS_QKV] = { 3, { H, 3, hd } }, [WS_Q] = { 2, { H, hd } },
        [WS_K] = { 2, { H, hd } }, [WS_V] = { 2, { H, hd } },      [WS_ATT] = { 2, { H, hd } },
        [WS_O] = { 1, { D } },     [WS_U] = { 1, { c->intermediate } },
    };
    return mmrt_decoder_ws_alloc(m->dev, R, shapes, WS_COUNT, out, err);
}

/* Every layer over the step's M rows, then the head over the io->out rows: prefill chunks,
 * batched decode and the captured decode graph all run this. Positions are plain over the
 * whole sequence, image tokens included (§5.2). */
static mmrt_status issue(void *self, struct mmrt_decoder_ws *ws, const struct mmrt_step_io *io,
                         struct mmrt_error *err)
{
    struct mmrt_persimmon *m = self;
    const struct mmrt_persimmon_config *c = &m->cfg;
    struct mmrt_dev *dev = m->dev;
    const int64_t M = io->M, D = c->hidden, H = c->n_heads, hd = c->head_dim, O = io->n_out;
    const struct mmrt_rope_params rope = { (float)c->rope_theta, (int32_t)c->n_rot,
                                           MMRT_ROPE_NEOX };
    const float scale = 1.0f / sqrtf((float)hd), eps = (float)c->ln_eps;
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
    const struct mmrt_tensor *h = &io->h;
    struct mmrt_tensor x = mmrt_decoder_ws_rows(ws, WS_X, M);
    struct mmrt_tensor qkv = mmrt_decoder_ws_rows(ws, WS_QKV, M);
    struct mmrt_tensor q = mmrt_decoder_ws_rows(ws, WS_Q, M), k = mmrt_decoder_ws_rows(ws, WS_K, M);
    struct mmrt_tensor v = mmrt_decoder_ws_rows(ws, WS_V, M);
    struct mmrt_tensor att = mmrt_decoder_ws_rows(ws, WS_ATT, M);
    struct mmrt_tensor o = mmrt_decoder_ws_rows(ws, WS_O, M), u = mmrt_decoder_ws_rows(ws, WS_U, M);
    struct mmrt_tensor qkv2 = mmrt_tensor_reshape(&qkv, 2, NE(M, 3 * D));
    struct mmrt_tensor qv = mmrt_persimmon_qkv_part(&qkv, 0), kv = mmrt_persimmon_qkv_part(&qkv, 1),
                       vv = mmrt_persimmon_qkv_part(&qkv, 2);
    /* q/k LayerNorm is over head_dim: a LAYERNORM over [M·H, hd] rows. */
    struct mmrt_tensor q_rows = mmrt_tensor_reshape(&q, 2, NE(M * H, hd));
    struct mmrt_tensor k_rows = mmrt_tensor_reshape(&k, 2, NE(M * H, hd));
    struct mmrt_tensor att2 = mmrt_tensor_reshape(&att, 2, NE(M, D));
#undef NE
    mmrt_status st;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
    } while (0)
    for (int64_t l = 0; l < c->n_layers; l++) {
        const struct mmrt_persimmon_layer *L = &m->layers[l];
        TRY(mmrt_op_layernorm(dev, h, &L->ln_in_w, &L->ln_in_b, eps, &x, err));
        TRY(mmrt_op_matmul(dev, &x, &L->qkv_w, &L->qkv_b, &qkv2, err));
        TRY(mmrt_op_copy(dev, &qv, &q, err));
        TRY(mmrt_op_copy(dev, &kv, &k, err));
        TRY(mmrt_op_copy(dev, &vv, &v, err));
        if (c->qk_layernorm) {
            TRY(mmrt_op_layernorm(dev, &q_rows, &L->q_ln_w, &L->q_ln_b, eps, &q_rows, err));
            TRY(mmrt_op_layernorm(dev, &k_rows, &L->k_ln_w, &L->k_ln_b, eps, &k_rows, err));
        }
        TRY(mmrt_op_rope(dev, &q, &io->pos, &rope, &q, err));
        TRY(mmrt_op_rope(dev, &k, &io->pos, &rope, &k, err));
        TRY(mmrt_kv_attend(&m->kv, l, &q, &k, &v, &io->kv, scale, 0, &att, err));
        TRY(mmrt_op_matmul(dev, &att2, &L->dense_w, &L->dense_b, &o, err));
        TRY(mmrt_op_add(dev, h, &o, h, err));
        TRY(mmrt_op_layernorm(dev, h, &L->ln_post_w, &L->ln_post_b, eps, &x, err));
        TRY(mmrt_op_matmul(dev, &x, &L->up_w, &L->up_b, &u, err));
        TRY(mmrt_op_unary(dev, MMRT_OP_RELU2, &u, &u, err));
        TRY(mmrt_op_matmul(dev, &u, &L->down_w, &L->down_b, &o, err));
        TRY(mmrt_op_add(dev, h, &o, h, err));
    }
    if (O > 0) {
        struct mmrt_tensor hl = mmrt_decoder_ws_rows(ws, WS_O, O);
        struct mmrt_tensor xl = mmrt_decoder_ws_rows(ws, WS_X, O);
        TRY(mmrt_op_get_rows(dev, h, &io->out, &hl, err));
        TRY(mmrt_op_layernorm(dev, &hl, &m->final_w, &m->final_b, eps, &xl, err));
        TRY(mmrt_op_matmul(dev, &xl, &m->lm_head, NULL, &io->logits, err));
    }
#undef TRY
    return MMRT_OK;
}
