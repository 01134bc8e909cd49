/*
 * models/llama.c — LLaMA-family decoder on core ops (see llama.h).
 *
 * Every forward allocates its activations from the device pool as one scratch set and
 * frees them at the end, so the pool statistics show exactly what a step needs.
 */
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"
#include "ops.h"

const enum mmrt_op mmrt_llama_ops[] = {
    MMRT_OP_GET_ROWS, MMRT_OP_RMSNORM, MMRT_OP_MATMUL, MMRT_OP_ROPE,
    MMRT_OP_ATTENTION_PAGED, MMRT_OP_ADD, MMRT_OP_SWIGLU, MMRT_OP_SET_ROWS,
};
const int mmrt_llama_n_ops = (int)(sizeof mmrt_llama_ops / sizeof mmrt_llama_ops[0]);

struct mmrt_decoder_ws;
static mmrt_status ws_create(void *self, int64_t R, int64_t max_out,
                             struct mmrt_decoder_ws **out, struct mmrt_error *err);
static mmrt_status issue(void *self, struct mmrt_decoder_ws *ws, const struct mmrt_step_io *io,
                         struct mmrt_error *err);

int mmrt_llama_required_ops(const struct mmrt_llama_config *c, enum mmrt_op *ops)
{
    for (int i = 0; i < mmrt_llama_n_ops; i++)
        ops[i] = mmrt_llama_ops[i] == MMRT_OP_ROPE && c->n_mrope_axes > 0 ? MMRT_OP_ROPE_MULTI
                                                                         : mmrt_llama_ops[i];
    return mmrt_llama_n_ops;
}

/* rope: rope_parameters.rope_theta, then rope_theta, then the default; the type from
 * rope_parameters.rope_type, then rope_scaling.rope_type / type, then "default" (models.md
 * §1.4, §1.6). *type is borrowed from cfg; *section_dict is the dict that carries
 * mrope_section, or NULL. */
static mmrt_status parse_rope(const json_t *cfg, const char *what, double def_theta,
                              double *theta, const char **type_out,
                              const json_t **section_dict, struct mmrt_error *err)
{
    const json_t *params = json_object_get(cfg, "rope_parameters");
    const json_t *scaling = json_object_get(cfg, "rope_scaling");
    *section_dict = NULL;
    if (params && !json_is_null(params) && !json_is_object(params))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"rope_parameters\" must be an object",
                              what);
    mmrt_status st = mmrt_json_opt_number(cfg, "rope_theta", what, 1e-3, 1e12, def_theta, theta,
                                          err);
    if (st != MMRT_OK)
        return st;
    const char *type = "default";
    if (json_is_object(params)) {
        st = mmrt_json_opt_number(params, "rope_theta", what, 1e-3, 1e12, *theta, theta, err);
        if (st == MMRT_OK)
            st = mmrt_json_opt_string(params, "rope_type", what, type, &type, err);
        if (json_object_get(params, "mrope_section"))
            *section_dict = params;
    } else if (json_is_object(scaling)) {
        st = mmrt_json_opt_string(scaling, "rope_type", what, NULL, &type, err);
        if (st == MMRT_OK && !type)
            st = mmrt_json_opt_string(scaling, "type", what, "default", &type, err);
    } else if (scaling && !json_is_null(scaling)) {
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"rope_scaling\" must be an object",
                              what);
    }
    if (!*section_dict && json_is_object(scaling) && json_object_get(scaling, "mrope_section"))
        *section_dict = scaling;
    if (st != MMRT_OK)
        return st;
    *type_out = type;
    return MMRT_OK;
}

/* mrope_section: three non-negative integers summing to head_dim / 2 (HF splits the cos/sin
 * table by 2 × the sections and fails otherwise). */
static mmrt_status parse_mrope_section(const json_t *dict, const char *what, int64_t head_dim,
                                       struct mmrt_llama_config *c, struct mmrt_error *err)
{
    const json_t *v = dict ? json_object_get(dict, "mrope_section") : NULL;
    if (!v || json_is_null(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: Qwen2-VL needs \"mrope_section\" in rope_parameters or "
                              "rope_scaling", what);
    if (!json_is_array(v) || json_array_size(v) != 3)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: \"mrope_section\" must be a list of 3 integers", what);
    int64_t sum = 0;
    for (size_t i = 0; i < 3; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > 1 << 16)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: mrope_section[%zu] must be a non-negative integer", what,
                                  i);
        c->mrope_section[i] = (int32_t)json_integer_value(e);
        sum += c->mrope_section[i];
    }
    if (sum != head_dim / 2)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: mrope_section [%d, %d, %d] sums to %lld, head_dim / 2 is %lld",
                              what, c->mrope_section[0], c->mrope_section[1],
                              c->mrope_section[2], (long long)sum, (long long)head_dim / 2);
    c->n_mrope_axes = 3;
    return MMRT_OK;
}

/* Qwen2-VL's decoder has no sliding-window attention in any published checkpoint; a config
 * that turns it on is refused rather than run with full attention. */
static mmrt_status check_qwen2_attention(const json_t *cfg, const char *what,
                                         struct mmrt_error *err)
{
    bool sliding;
    const char *act;
    mmrt_status st = mmrt_json_opt_bool(cfg, "use_sliding_window", what, false, &sliding, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(cfg, "hidden_act", what, "silu", &act, err);
    if (st != MMRT_OK)
        return st;
    if (sliding)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: use_sliding_window is not supported", what);
    if (strcmp(act, "silu") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: hidden_act '%s' is not supported (silu)", what, act);
    const json_t *lt = json_object_get(cfg, "layer_types");
    if (lt && !json_is_null(lt) && !json_is_array(lt))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"layer_types\" must be a list", what);
    for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        if (!t || strcmp(t, "full_attention") != 0)
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                  "%s: layer_types[%zu] is not \"full_attention\" (sliding "
                                  "windows are not supported)", what, i);
    }
    return MMRT_OK;
}

/* MistralConfig.sliding_window: every layer of MistralModel attends through it (transformers'
 * sliding-window causal mask: key j is seen from position p when p − window < j ≤ p). An
 * absent key is the class default, 4096, as transformers reads such a config.json; null is no
 * window. 0 or less would hide every key (transformers then softmaxes a row of masked
 * scores into garbage), so it is refused; so is anything but an integer. */
#define MISTRAL_DEFAULT_SLIDING_WINDOW 4096
static mmrt_status parse_sliding_window(const json_t *cfg, const char *what, int32_t *out,
                                        struct mmrt_error *err)
{
    const json_t *v = json_object_get(cfg, "sliding_window");
    *out = 0;
    if (!v) {
        *out = MISTRAL_DEFAULT_SLIDING_WINDOW;
        return MMRT_OK;
    }
    if (json_is_null(v))
        return MMRT_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > INT32_MAX) {
        char got[64] = "not an integer";
        if (json_is_integer(v))
            snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: \"sliding_window\" must be an integer from 1 to %d (positions "
                              "each query sees), or null for none; got %s", what, INT32_MAX, got);
    }
    *out = (int32_t)json_integer_value(v);
    return MMRT_OK;
}

/* The fields of one text config; qwen2 selects the Qwen2VLTextConfig defaults and rules. */
static mmrt_status parse_fields(const json_t *cfg, const json_t *top, const char *what,
                                bool qwen2, bool mistral, struct mmrt_llama_config *out,
                                struct mmrt_error *err)
{
    struct mmrt_llama_config c = { 0 };
    long long v;
    mmrt_status st;
#define INT(key, lo, hi, def, field)                                                           \
    do {                                                                                       \
        st = mmrt_json_opt_int(cfg, key, what, lo, hi, def, &v, err);                          \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
        c.field = v;                                                                           \
    } while (0)
    /* Defaults: LlamaConfig / MistralConfig (§2.1), Qwen2VLTextConfig (§4.1). */
    INT("vocab_size", 1, 1 << 24, qwen2 ? 152064 : 32000, vocab);
    INT("hidden_size", 1, 1 << 17, qwen2 ? 8192 : 4096, hidden);
    INT("intermediate_size", 1, 1 << 20, qwen2 ? 29568 : mistral ? 14336 : 11008, intermediate);
    INT("num_hidden_layers", 1, 1024, qwen2 ? 80 : 32, n_layers);
    INT("num_attention_heads", 1, 1024, qwen2 ? 64 : 32, n_heads);
    INT("num_key_value_heads", 1, 1024, qwen2 ? 8 : mistral ? 8 : c.n_heads, n_kv_heads);
    INT("max_position_embeddings", 1, 1 << 24, qwen2 || mistral ? 32768 : 2048, max_positions);
    /* Qwen2's tokenizer adds no BOS and its special ids come from generation_config.json;
     * absent (or null) ids stay absent rather than default to ids of the full vocabulary. */
    INT("bos_token_id", -1, 1 << 24, qwen2 ? -1 : 1, bos_id);
    INT("eos_token_id", -1, 1 << 24, qwen2 ? -1 : 2, eos_id);
    INT("pad_token_id", -1, 1 << 24, -1, pad_id);
    if (c.hidden % c.n_heads != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: hidden_size %lld is not divisible by num_attention_heads %lld",
                              what, (long long)c.hidden, (long long)c.n_heads);
    INT("head_dim", 1, 256, c.hidden / c.n_heads, head_dim);
#undef INT
    /* The default (hidden / heads) is not range-checked by the getter: hold it to the same
     * attention limit as an explicit head_dim. */
    if (c.head_dim > 256)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: head dim %lld (hidden_size %lld / num_attention_heads %lld) is "
                              "above the attention limit of 256; set head_dim", what,
                              (long long)c.head_dim, (long long)c.hidden, (long long)c.n_heads);
    if (c.n_heads % c.n_kv_heads != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: num_attention_heads %lld is not a multiple of "
                              "num_key_value_heads %lld",
                              what, (long long)c.n_heads, (long long)c.n_kv_heads);
    if (c.head_dim % 2 != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: head_dim %lld must be even for RoPE",
                              what, (long long)c.head_dim);
    const char *rope_type = "default";
    const json_t *section_dict = NULL;
    st = mmrt_json_opt_number(cfg, "rms_norm_eps", what, 0, 1, qwen2 ? 1e-5 : 1e-6, &c.rms_eps,
                              err);
    if (st == MMRT_OK)
        st = parse_rope(cfg, what, qwen2 || mistral ? 1e6 : 1e4, &c.rope_theta, &rope_type,
                        &section_dict, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(rope_type, "default") != 0 && !(qwen2 && strcmp(rope_type, "mrope") == 0))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: rope type '%s' is not supported (only default%s)", what,
                              rope_type, qwen2 ? " and mrope" : "");
    if (!(c.rope_theta > 0))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: rope theta must be positive", what);
    /* rms(h) = h / sqrt(mean(h²) + eps): an eps of 0 divides a zero row by zero. */
    if (!(c.rms_eps > 0))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: \"rms_norm_eps\" = %g must be positive", what, c.rms_eps);
    if (mistral) {
        st = parse_sliding_window(cfg, what, &c.sliding_window, err);
        if (st != MMRT_OK)
            return st;
    }
    if (qwen2) {
        /* Qwen2VLAttention: q/k/v with bias, o_proj without; no attention_bias key. */
        c.qkv_bias = true;
        st = parse_mrope_section(section_dict, what, c.head_dim, &c, err);
        if (st == MMRT_OK)
            st = check_qwen2_attention(cfg, what, err);
    } else {
        st = mmrt_json_opt_bool(cfg, "attention_bias", what, false, &c.attention_bias, err);
        if (st == MMRT_OK)
            st = mmrt_json_opt_bool(cfg, "mlp_bias", what, false, &c.mlp_bias, err);
    }
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(cfg, "tie_word_embeddings", what, false,
                                &c.tie_word_embeddings, err);
    if (st == MMRT_OK && top && json_object_get(top, "tie_word_embeddings"))
        st = mmrt_json_opt_bool(top, "tie_word_embeddings", what, c.tie_word_embeddings,
                                &c.tie_word_embeddings, err);
    if (st != MMRT_OK)
        return st;
    if (c.bos_id >= c.vocab || c.eos_id >= c.vocab || c.pad_id >= c.vocab)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: a special token id (bos %lld, eos %lld, pad %lld) is not "
                              "below vocab_size %lld",
                              what, (long long)c.bos_id, (long long)c.eos_id,
                              (long long)c.pad_id, (long long)c.vocab);
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_llama_config_parse(const json_t *cfg, const json_t *top, const char *what,
                                    struct mmrt_llama_config *out, struct mmrt_error *err)
{
    const char *type = NULL;
    mmrt_status st = mmrt_json_opt_string(cfg, "model_type", what, "llama", &type, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "qwen2_vl") == 0) {
        /* A whole Qwen2-VL config: its text part is text_config when present (transformers
         * builds the text config from it alone), else the top level (hub files). */
        const json_t *t = json_object_get(cfg, "text_config");
        if (t && !json_is_null(t) && !json_is_object(t))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: text_config must be an object",
                                  what);
        if (!json_is_object(t))
            return parse_fields(cfg, top, what, true, false, out, err);
        char twhat[1024];
        snprintf(twhat, sizeof twhat, "%s: text_config", what);
        st = mmrt_json_opt_string(t, "model_type", twhat, "qwen2_vl_text", &type, err);
        if (st != MMRT_OK)
            return st;
        if (strcmp(type, "qwen2_vl_text") != 0 && strcmp(type, "qwen2_vl") != 0)
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                  "%s: text model_type '%s' is not supported (qwen2_vl_text)",
                                  twhat, type);
        return parse_fields(t, top ? top : cfg, twhat, true, false, out, err);
    }
    const bool mistral = strcmp(type, "mistral") == 0, qwen2 = strcmp(type, "qwen2_vl_text") == 0;
    if (!mistral && !qwen2 && strcmp(type, "llama") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: text model_type '%s' is not supported (llama, mistral, "
                              "qwen2_vl_text)", what, type);
    return parse_fields(cfg, top, what, qwen2, mistral, out, err);
}

mmrt_status mmrt_llama_load(struct mmrt_llama *m, struct mmrt_weights *w, struct mmrt_dev *dev,
                            const struct mmrt_llama_config *cfg,
                            const struct mmrt_model_options *opts, struct mmrt_error *err)
{
    memset(m, 0, sizeof *m);
    /* A plugin older than ABI 1.5 reads no window from the attention params and would attend
     * to every earlier position. */
    if (cfg->sliding_window > 0 && dev->api->hdr.abi_minor < 5)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "decoder: sliding_window %d needs sliding-window attention "
                              "(plugin ABI 1.5); device %s has a plugin of ABI %u.%u",
                              (int)cfg->sliding_window, dev->name,
                              (unsigned)dev->api->hdr.abi_major,
                              (unsigned)dev->api->hdr.abi_minor);
    if (cfg->mlp_bias)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "decoder: mlp_bias is not supported");
    m->cfg = *cfg;
    m->dev = dev;
    const int64_t D = cfg->hidden, V = cfg->vocab, I = cfg->intermediate;
    const int64_t QD = cfg->n_heads * cfg->head_dim, KD = cfg->n_kv_heads * cfg->head_dim;
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "decoder: out of memory");
    mmrt_status st;
#define LOAD(dst, nd, name, ...)                                                               \
    do {                                                                                       \
        st = mmrt_weights_load(w, dev, nd, (const int64_t[]){ __VA_ARGS__ }, &(dst), err,      \
                               "%s", name);                                                    \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
#define MATRIX(dst, name, n, k)                                                                \
    do {                                                                                       \
        st = mmrt_weights_load_matrix(w, dev, n, k, &(dst), err, "%s", name);                  \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
    char name[256];
    bool tied;
    st = mmrt_weights_load_embed_head(w, dev, V, D, cfg->tie_word_embeddings, &m->embed,
                                      &m->lm_head, &tied, err);
    if (st != MMRT_OK)
        goto fail;
    LOAD(m->norm, 1, "language_model.norm.weight", D);
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        struct mmrt_llama_layer *L = &m->layers[i];
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
        LAYER(L->attn_norm, 1, "input_layernorm.weight", D);
        LAYER_MATRIX(L->wq, "self_attn.q_proj.weight", QD, D);
        LAYER_MATRIX(L->wk, "self_attn.k_proj.weight", KD, D);
        LAYER_MATRIX(L->wv, "self_attn.v_proj.weight", KD, D);
        LAYER_MATRIX(L->wo, "self_attn.o_proj.weight", D, QD);
        if (cfg->attention_bias || cfg->qkv_bias) {
            LAYER(L->bq, 1, "self_attn.q_proj.bias", QD);
            LAYER(L->bk, 1, "self_attn.k_proj.bias", KD);
            LAYER(L->bv, 1, "self_attn.v_proj.bias", KD);
        }
        if (cfg->attention_bias)
            LAYER(L->bo, 1, "self_attn.o_proj.bias", D);
        LAYER(L->mlp_norm, 1, "post_attention_layernorm.weight", D);
        LAYER_MATRIX(L->wg, "mlp.gate_proj.weight", I, D);
        LAYER_MATRIX(L->wu, "mlp.up_proj.weight", I, D);
        LAYER_MATRIX(L->wd, "mlp.down_proj.weight", D, I);
#undef LAYER
#undef LAYER_MATRIX
    }
#undef LOAD
#undef MATRIX
    st = mmrt_weights_decoder_done(w, cfg->n_layers, tied, &m->embed, &m->lm_head, err);
    if (st != MMRT_OK)
        goto fail;
    st = mmrt_decoder_kv_create(dev, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, cfg->max_positions,
                                opts, &m->kv, err);
    if (st != MMRT_OK)
        goto fail;
    m->dec = (struct mmrt_decoder){
        .self = m, .dev = dev, .kv = &m->kv, .embed = &m->embed, .vocab = V, .hidden = D,
        .max_positions = cfg->max_positions, .n_axes = cfg->n_mrope_axes,
        .window = cfg->sliding_window, .ws_create = ws_create,
        .ws_destroy = mmrt_decoder_ws_free, .issue = issue,
    };
    return MMRT_OK;
fail:
    mmrt_llama_unload(m);
    return st;
}

void mmrt_llama_unload(struct mmrt_llama *m)
{
    mmrt_kv_pages_destroy(&m->kv);
    free(m->layers);
    m->layers = NULL;
}

static const struct mmrt_tensor *opt(const struct mmrt_tensor *t)
{
    return t->buffer ? t : NULL;
}

/* The decoder's activations (decoder.h workspace), by name. */
enum { WS_X, WS_Q, WS_K, WS_V, WS_ATT, WS_O, WS_G, WS_U, WS_COUNT };

static mmrt_status ws_create(void *self, int64_t R, int64_t max_out,
                             struct mmrt_decoder_ws **out, struct mmrt_error *err)
{
    const struct mmrt_llama *m = self;
    const struct mmrt_llama_config *c = &m->cfg;
    (void)max_out; /* the head's rows reuse o and x, R ≥ max_out */
    const int64_t D = c->hidden, H = c->n_heads, KH = c->n_kv_heads, hd = c->head_dim;
    const struct mmrt_ws_shape shapes[WS_COUNT] = {
        [WS_X] = { 1, { D } },      [WS_Q] = { 2, { H, hd } },   [WS_K] = { 2, { KH, hd } },
        [WS_V] = { 2, { KH, hd } }, [WS_ATT] = { 2, { H, hd } }, [WS_O] = { 1, { D } },
        [WS_G] = { 1, { c->intermediate } },                    [WS_U] = { 1, { c->intermediate } },
    };
    return mmrt_decoder_ws_alloc(m->dev, R, shapes, WS_COUNT, out, err);
}

/* The decoder: every layer over the step's M rows, then the head over the io->out rows. One
 * definition for prefill chunks, batched decode and the captured decode graph. */
static mmrt_status issue(void *self, struct mmrt_decoder_ws *ws, const struct mmrt_step_io *io,
                         struct mmrt_error *err)
{
    struct mmrt_llama *m = self;
    const struct mmrt_llama_config *c = &m->cfg;
    struct mmrt_dev *dev = m->dev;
    const int64_t M = io->M, H = c->n_heads, KH = c->n_kv_heads;
    const int64_t hd = c->head_dim, O = io->n_out;
    const float eps = (float)c->rms_eps;
    const struct mmrt_rope_params rope = { (float)c->rope_theta, (int32_t)hd, MMRT_ROPE_NEOX };
    struct mmrt_rope_multi_params mrope = {
        .theta = (float)c->rope_theta, .n_rot = (int32_t)hd, .freq_dim = (int32_t)hd,
        .restart = 0, .n_axes = c->n_mrope_axes,
    };
    for (int a = 0; a < c->n_mrope_axes && a < MMRT_ROPE_MAX_AXES; a++)
        mrope.sections[a] = c->mrope_section[a];
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
    const struct mmrt_tensor *h = &io->h;
    struct mmrt_tensor x = mmrt_decoder_ws_rows(ws, WS_X, M), q = mmrt_decoder_ws_rows(ws, WS_Q, M);
    struct mmrt_tensor k = mmrt_decoder_ws_rows(ws, WS_K, M), v = mmrt_decoder_ws_rows(ws, WS_V, M);
    struct mmrt_tensor att = mmrt_decoder_ws_rows(ws, WS_ATT, M);
    struct mmrt_tensor o = mmrt_decoder_ws_rows(ws, WS_O, M), g = mmrt_decoder_ws_rows(ws, WS_G, M);
    struct mmrt_tensor u = mmrt_decoder_ws_rows(ws, WS_U, M);
    /* 2-D views of the [M, heads, hd] projections, for the matmuls */
    struct mmrt_tensor q2 = mmrt_tensor_reshape(&q, 2, NE(M, H * hd));
    struct mmrt_tensor k2 = mmrt_tensor_reshape(&k, 2, NE(M, KH * hd));
    struct mmrt_tensor v2 = mmrt_tensor_reshape(&v, 2, NE(M, KH * hd));
    struct mmrt_tensor att2 = mmrt_tensor_reshape(&att, 2, NE(M, H * hd));
#undef NE
    mmrt_status st;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
    } while (0)
    for (int64_t l = 0; l < c->n_layers; l++) {
        const struct mmrt_llama_layer *L = &m->layers[l];
        TRY(mmrt_op_rmsnorm(dev, h, &L->attn_norm, eps, &x, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wq, opt(&L->bq), &q2, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wk, opt(&L->bk), &k2, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wv, opt(&L->bv), &v2, err));
        if (c->n_mrope_axes > 0) {
            TRY(mmrt_op_rope_multi(dev, &q, &io->pos, &mrope, &q, err));
            TRY(mmrt_op_rope_multi(dev, &k, &io->pos, &mrope, &k, err));
        } else {
            TRY(mmrt_op_rope(dev, &q, &io->pos, &rope, &q, err));
            TRY(mmrt_op_rope(dev, &k, &io->pos, &rope, &k, err));
        }
        /* Mistral's window (0 otherwise) goes into every layer's attention, whichever kind of
         * step this is: the kernels count it in positions of the sequence. */
        TRY(mmrt_kv_attend(&m->kv, l, &q, &k, &v, &io->kv, 0, c->sliding_window, &att, err));
        TRY(mmrt_op_matmul(dev, &att2, &L->wo, opt(&L->bo), &o, err));
        TRY(mmrt_op_add(dev, h, &o, h, err));
        TRY(mmrt_op_rmsnorm(dev, h, &L->mlp_norm, eps, &x, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wg, NULL, &g, err));
        TRY(mmrt_op_matmul(dev, &x, &L->wu, NULL, &u, err));
        TRY(mmrt_op_swiglu(dev, &g, &u, &g, err));
        TRY(mmrt_op_matmul(dev, &g, &L->wd, NULL, &o, err));
        TRY(mmrt_op_add(dev, h, &o, h, err));
    }
    if (O > 0) {
        struct mmrt_tensor hl = mmrt_decoder_ws_rows(ws, WS_O, O);
        struct mmrt_tensor xl = mmrt_decoder_ws_rows(ws, WS_X, O);
        TRY(mmrt_op_get_rows(dev, h, &io->out, &hl, err));
        TRY(mmrt_op_rmsnorm(dev, &hl, &m->norm, eps, &xl, err));
        TRY(mmrt_op_matmul(dev, &xl, &m->lm_head, NULL, &io->logits, err));
    }
#undef TRY
    return MMRT_OK;
}
