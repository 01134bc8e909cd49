/*
 * tools/bench/synth.c — the synthetic checkpoint mmrt-bench runs, written once per shape,
 * depth and dtype and reused after (the cache key is the folder name).
 *
 * What it writes, in the layout Hugging Face transformers reads (the ForConditionalGeneration
 * / ForCausalLM class and AutoProcessor.from_pretrained load the folder as is, which
 * tools/bench_transformers.py relies on for LLaVA):
 *   config.json            the shape's exact dimensions as transformers 5 saves them (nested
 *                          text_config / vision_config, rope_parameters), num_hidden_layers
 *                          (and Qwen2-VL's vision depth) cut to --layers; eos_token_id −1, so
 *                          generation never stops early and every run decodes exactly the
 *                          tokens asked for
 *   model.safetensors      every tensor of the model, in the hub's (legacy) key spelling
 *                          (models.md §2.7, §4.6, §5.6), random values of the scale of a
 *                          trained model (linear and embedding weights uniform with std 0.02,
 *                          HF's initializer_range; norm weights 1 ± 0.02, biases ± 0.02), each
 *                          tensor from its own seeded generator
 *   tokenizer.json         padded to the real vocabulary size so the embedding and LM head keep
 *                          their real shapes, and built so the prompt "a a … a" of n words is
 *                          exactly n tokens (bench_synth_prompt):
 *                            LLaVA     LLaMA-style BPE (▁ prefix, byte fallback), merges
 *                                      "▁" + "a" and the chains that build "▁w1" ... (the
 *                                      filler pieces); <image>, <pad> after the 32000 pieces
 *                            Qwen2-VL  byte-level BPE (NFC, the Qwen2 split regex, ByteLevel),
 *                                      one merge "Ġ" + "a"; <|endoftext|> … <|video_pad|> at
 *                                      151643 … 151656
 *                            Fuyu      SentencePiece Unigram with byte fallback, "▁a" the best
 *                                      piece; |SPEAKER| 71011, |ENDOFTEXT| 71013, |NEWLINE| 71019
 *   tokenizer_config.json  and the processor settings: LLaVA processor_config.json; Qwen2-VL
 *                          the hub's preprocessor_config.json (min_pixels, max_pixels), the
 *                          same in processor_config.json and chat_template.jinja; Fuyu the
 *                          hub's preprocessor_config.json
 *   image-<size>-<seed>.png  synthetic pictures (bench_synth_image)
 *
 * Everything goes into "<dir>.tmp-<pid>" first and is renamed into place at the end, so a
 * killed run leaves no half-written checkpoint behind for the next one to trust.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bench.h"
#include "mmrt/plugin.h" /* mmrt_f32_to_f16 / _bf16: the checkpoint's elements */

int bench_mkdirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* dir + "/" + name into out; −1 (and an empty string) when it does not fit. */
static int path_join(char *out, size_t size, const char *dir, const char *name)
{
    int n = snprintf(out, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size) {
        out[0] = '\0';
        return -1;
    }
    return 0;
}

/* ---- random values ------------------------------------------------------------------------ */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* xorshift64*: fast, and good enough for weights nobody reads. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

/* Uniform in [−1, 1). */
static inline float rng_unit(uint64_t *s)
{
    return (float)(int32_t)(rng_next(s) >> 32) * (1.0f / 2147483648.0f);
}

/* ---- the tensor list --------------------------------------------------------------------- */

struct tlist {
    struct bench_tensor *t;
    int n, cap;
};

static int tl_add(struct tlist *l, bool vision, enum bench_init init, int n_dims,
                  const int64_t *shape, const char *fmt, long long layer)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        struct bench_tensor *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        l->t = t;
        l->cap = cap;
    }
    struct bench_tensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims && i < BENCH_MAX_DIMS; i++)
        t->shape[i] = shape[i];
    t->init = init;
    t->vision = vision;
    return 0;
}

/* SH(a, b) expands to "n_dims, shape" for tl_add. */
#define SH(...)                                                                                \
    (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }
#define LIN BENCH_INIT_LINEAR
#define ONES BENCH_INIT_ONES
#define BIAS BENCH_INIT_BIAS

static int llava_tensors(const struct bench_shape *s, int64_t vl, int64_t tl, struct tlist *l)
{
    const int64_t D = s->t_hidden, I = s->t_inter, V = s->t_vocab;
    const int64_t QD = s->t_heads * s->t_head_dim, KD = s->t_kv_heads * s->t_head_dim;
    const int64_t Dv = s->v_hidden, Iv = s->v_inter, P = s->v_patch;
    const int64_t grid = s->v_image / P;
    int r = 0;
    r |= tl_add(l, false, LIN, SH(V, D), "language_model.lm_head.weight", 0);
    r |= tl_add(l, false, LIN, SH(V, D), "language_model.model.embed_tokens.weight", 0);
    for (long long i = 0; i < tl; i++) {
#define LM(init, name, ...)                                                                    \
    r |= tl_add(l, false, init, SH(__VA_ARGS__), "language_model.model.layers.%lld." name, i)
        LM(ONES, "input_layernorm.weight", D);
        LM(LIN, "mlp.down_proj.weight", D, I);
        LM(LIN, "mlp.gate_proj.weight", I, D);
        LM(LIN, "mlp.up_proj.weight", I, D);
        LM(ONES, "post_attention_layernorm.weight", D);
        LM(LIN, "self_attn.k_proj.weight", KD, D);
        LM(LIN, "self_attn.o_proj.weight", D, QD);
        LM(LIN, "self_attn.q_proj.weight", QD, D);
        LM(LIN, "self_attn.v_proj.weight", KD, D);
#undef LM
    }
    r |= tl_add(l, false, ONES, SH(D), "language_model.model.norm.weight", 0);
    r |= tl_add(l, true, BIAS, SH(D), "multi_modal_projector.linear_1.bias", 0);
    r |= tl_add(l, true, LIN, SH(D, Dv), "multi_modal_projector.linear_1.weight", 0);
    r |= tl_add(l, true, BIAS, SH(D), "multi_modal_projector.linear_2.bias", 0);
    r |= tl_add(l, true, LIN, SH(D, D), "multi_modal_projector.linear_2.weight", 0);
    r |= tl_add(l, true, LIN, SH(Dv), "vision_tower.embeddings.class_embedding", 0);
    r |= tl_add(l, true, LIN, SH(Dv, s->v_channels, P, P),
                "vision_tower.embeddings.patch_embedding.weight", 0);
    r |= tl_add(l, true, LIN, SH(grid * grid + 1, Dv),
                "vision_tower.embeddings.position_embedding.weight", 0);
    for (long long i = 0; i < vl; i++) {
#define VT(init, name, ...)                                                                    \
    r |= tl_add(l, true, init, SH(__VA_ARGS__), "vision_tower.encoder.layers.%lld." name, i)
        VT(BIAS, "layer_norm1.bias", Dv);
        VT(ONES, "layer_norm1.weight", Dv);
        VT(BIAS, "layer_norm2.bias", Dv);
        VT(ONES, "layer_norm2.weight", Dv);
        VT(BIAS, "mlp.fc1.bias", Iv);
        VT(LIN, "mlp.fc1.weight", Iv, Dv);
        VT(BIAS, "mlp.fc2.bias", Dv);
        VT(LIN, "mlp.fc2.weight", Dv, Iv);
        VT(BIAS, "self_attn.k_proj.bias", Dv);
        VT(LIN, "self_attn.k_proj.weight", Dv, Dv);
        VT(BIAS, "self_attn.out_proj.bias", Dv);
        VT(LIN, "self_attn.out_proj.weight", Dv, Dv);
        VT(BIAS, "self_attn.q_proj.bias", Dv);
        VT(LIN, "self_attn.q_proj.weight", Dv, Dv);
        VT(BIAS, "self_attn.v_proj.bias", Dv);
        VT(LIN, "self_attn.v_proj.weight", Dv, Dv);
#undef VT
    }
    r |= tl_add(l, true, BIAS, SH(Dv), "vision_tower.post_layernorm.bias", 0);
    r |= tl_add(l, true, ONES, SH(Dv), "vision_tower.post_layernorm.weight", 0);
    r |= tl_add(l, true, BIAS, SH(Dv), "vision_tower.pre_layrnorm.bias", 0);
    r |= tl_add(l, true, ONES, SH(Dv), "vision_tower.pre_layrnorm.weight", 0);
    return r ? -1 : 0;
}

/* Qwen2-VL in the hub's (legacy) names, models.md §4.6: visual.*, model.*, lm_head.weight. */
static int qwen2vl_tensors(const struct bench_shape *s, int64_t vl, int64_t tl, struct tlist *l)
{
    const int64_t D = s->t_hidden, I = s->t_inter, V = s->t_vocab;
    const int64_t QD = s->t_heads * s->t_head_dim, KD = s->t_kv_heads * s->t_head_dim;
    const int64_t E = s->v_hidden, Iv = s->v_inter, P = s->v_patch;
    const int64_t E4 = E * s->v_merge * s->v_merge;
    int r = 0;
    r |= tl_add(l, false, LIN, SH(V, D), "lm_head.weight", 0);
    r |= tl_add(l, false, LIN, SH(V, D), "model.embed_tokens.weight", 0);
    for (long long i = 0; i < tl; i++) {
#define LM(init, name, ...)                                                                    \
    r |= tl_add(l, false, init, SH(__VA_ARGS__), "model.layers.%lld." name, i)
        LM(ONES, "input_layernorm.weight", D);
        LM(LIN, "mlp.down_proj.weight", D, I);
        LM(LIN, "mlp.gate_proj.weight", I, D);
        LM(LIN, "mlp.up_proj.weight", I, D);
        LM(ONES, "post_attention_layernorm.weight", D);
        LM(BIAS, "self_attn.k_proj.bias", KD);
        LM(LIN, "self_attn.k_proj.weight", KD, D);
        LM(LIN, "self_attn.o_proj.weight", D, QD);
        LM(BIAS, "self_attn.q_proj.bias", QD);
        LM(LIN, "self_attn.q_proj.weight", QD, D);
        LM(BIAS, "self_attn.v_proj.bias", KD);
        LM(LIN, "self_attn.v_proj.weight", KD, D);
#undef LM
    }
    r |= tl_add(l, false, ONES, SH(D), "model.norm.weight", 0);
    for (long long i = 0; i < vl; i++) {
#define VT(init, name, ...)                                                                    \
    r |= tl_add(l, true, init, SH(__VA_ARGS__), "visual.blocks.%lld." name, i)
        VT(BIAS, "attn.proj.bias", E);
        VT(LIN, "attn.proj.weight", E, E);
        VT(BIAS, "attn.qkv.bias", 3 * E);
        VT(LIN, "attn.qkv.weight", 3 * E, E);
        VT(BIAS, "mlp.fc1.bias", Iv);
        VT(LIN, "mlp.fc1.weight", Iv, E);
        VT(BIAS, "mlp.fc2.bias", E);
        VT(LIN, "mlp.fc2.weight", E, Iv);
        VT(BIAS, "norm1.bias", E);
        VT(ONES, "norm1.weight", E);
        VT(BIAS, "norm2.bias", E);
        VT(ONES, "norm2.weight", E);
#undef VT
    }
    r |= tl_add(l, true, BIAS, SH(E), "visual.merger.ln_q.bias", 0);
    r |= tl_add(l, true, ONES, SH(E), "visual.merger.ln_q.weight", 0);
    r |= tl_add(l, true, BIAS, SH(E4), "visual.merger.mlp.0.bias", 0);
    r |= tl_add(l, true, LIN, SH(E4, E4), "visual.merger.mlp.0.weight", 0);
    r |= tl_add(l, true, BIAS, SH(D), "visual.merger.mlp.2.bias", 0);
    r |= tl_add(l, true, LIN, SH(D, E4), "visual.merger.mlp.2.weight", 0);
    /* Conv3d(3 → E, kernel = stride = (temporal, 14, 14), no bias). */
    r |= tl_add(l, true, LIN, SH(E, s->v_channels, s->v_temporal_patch, P, P),
                "visual.patch_embed.proj.weight", 0);
    return r ? -1 : 0;
}

/* Fuyu in the hub's (legacy) names, models.md §5.6. */
static int fuyu_tensors(const struct bench_shape *s, int64_t tl, struct tlist *l)
{
    const int64_t D = s->t_hidden, I = s->t_inter, V = s->t_vocab, hd = s->t_head_dim;
    const int64_t K = s->v_channels * s->v_patch * s->v_patch;
    int r = 0;
    r |= tl_add(l, false, LIN, SH(V, D), "language_model.lm_head.weight", 0);
    r |= tl_add(l, false, LIN, SH(V, D), "language_model.model.embed_tokens.weight", 0);
    r |= tl_add(l, false, BIAS, SH(D), "language_model.model.final_layernorm.bias", 0);
    r |= tl_add(l, false, ONES, SH(D), "language_model.model.final_layernorm.weight", 0);
    for (long long i = 0; i < tl; i++) {
#define LM(init, name, ...)                                                                    \
    r |= tl_add(l, false, init, SH(__VA_ARGS__), "language_model.model.layers.%lld." name, i)
        LM(BIAS, "input_layernorm.bias", D);
        LM(ONES, "input_layernorm.weight", D);
        LM(BIAS, "mlp.dense_4h_to_h.bias", D);
        LM(LIN, "mlp.dense_4h_to_h.weight", D, I);
        LM(BIAS, "mlp.dense_h_to_4h.bias", I);
        LM(LIN, "mlp.dense_h_to_4h.weight", I, D);
        LM(BIAS, "post_attention_layernorm.bias", D);
        LM(ONES, "post_attention_layernorm.weight", D);
        LM(BIAS, "self_attn.dense.bias", D);
        LM(LIN, "self_attn.dense.weight", D, D);
        LM(BIAS, "self_attn.k_layernorm.bias", hd);
        LM(ONES, "self_attn.k_layernorm.weight", hd);
        LM(BIAS, "self_attn.q_layernorm.bias", hd);
        LM(ONES, "self_attn.q_layernorm.weight", hd);
        LM(BIAS, "self_attn.query_key_value.bias", 3 * D);
        LM(LIN, "self_attn.query_key_value.weight", 3 * D, D);
#undef LM
    }
    r |= tl_add(l, true, BIAS, SH(D), "vision_embed_tokens.bias", 0);
    r |= tl_add(l, true, LIN, SH(D, K), "vision_embed_tokens.weight", 0);
    return r ? -1 : 0;
}

#undef LIN
#undef ONES
#undef BIAS

int bench_synth_tensors(const struct bench_shape *s, int64_t layers, struct bench_tensor **out,
                        int *n)
{
    int64_t vl, tl;
    bench_shape_depth(s, layers, &vl, &tl);
    struct tlist l = { 0 };
    int rc = s->family == BENCH_LLAVA     ? llava_tensors(s, vl, tl, &l)
             : s->family == BENCH_QWEN2VL ? qwen2vl_tensors(s, vl, tl, &l)
                                          : fuyu_tensors(s, tl, &l);
    if (rc != 0) {
        free(l.t);
        return -1;
    }
    *out = l.t;
    *n = l.n;
    return 0;
}

int64_t bench_tensor_numel(const struct bench_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}

/* ---- files ---------------------------------------------------------------------------------- */

static int write_json(const char *dir, const char *name, json_t *obj, size_t flags, char *err,
                      size_t err_size)
{
    char path[4200] = "";
    int rc = obj && path_join(path, sizeof path, dir, name) == 0
                 ? json_dump_file(obj, path, flags | JSON_PRESERVE_ORDER)
                 : -1;
    json_decref(obj);
    if (rc != 0)
        snprintf(err, err_size, "%s/%s: cannot write", dir, name);
    return rc == 0 ? 0 : -1;
}

static const char *dtype_st(enum bench_dtype dt)
{
    return dt == BENCH_F32 ? "F32" : dt == BENCH_F16 ? "F16" : "BF16";
}

static const char *dtype_torch(enum bench_dtype dt)
{
    return dt == BENCH_F32 ? "float32" : dt == BENCH_F16 ? "float16" : "bfloat16";
}

static int write_safetensors(const char *dir, const struct bench_tensor *ts, int n_ts,
                             enum bench_dtype dt,
                             void (*progress)(const char *), char *err, size_t err_size)
{
    const size_t es = dt == BENCH_F32 ? 4 : 2;
    char path[4200];
    if (path_join(path, sizeof path, dir, "model.safetensors") != 0) {
        snprintf(err, err_size, "%s: path too long", dir);
        return -1;
    }
    json_t *hdr = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    if (!hdr || !meta || json_object_set_new(hdr, "__metadata__", meta) != 0) {
        json_decref(hdr);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    uint64_t off = 0;
    for (int i = 0; i < n_ts; i++) {
        const struct bench_tensor *t = &ts[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->n_dims; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t nb = (uint64_t)bench_tensor_numel(t) * es;
        json_t *e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype_st(dt), "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + nb));
        if (!e || json_object_set_new(hdr, t->name, e) != 0) {
            json_decref(hdr);
            snprintf(err, err_size, "out of memory");
            return -1;
        }
        off += nb;
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    if (!text) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        snprintf(err, err_size, "%s: %s", path, strerror(errno));
        return -1;
    }
    uint8_t n8[8];
    for (int i = 0; i < 8; i++)
        n8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(n8, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    free(text);

    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK * 4);
    if (!buf)
        ok = 0;
    uint64_t done = 0, next_report = 1ull << 30;
    for (int i = 0; ok && i < n_ts; i++) {
        const struct bench_tensor *t = &ts[i];
        uint64_t seed = fnv1a(t->name) | 1u;
        const float scale = 0.0346410162f; /* uniform on ±0.02·√3 has std 0.02 */
        int64_t n = bench_tensor_numel(t);
        for (int64_t k0 = 0; ok && k0 < n; k0 += CHUNK) {
            int64_t kn = n - k0 < CHUNK ? n - k0 : CHUNK;
            for (int64_t k = 0; k < kn; k++) {
                float v = rng_unit(&seed) * scale;
                if (t->init == BENCH_INIT_ONES)
                    v += 1.0f;
                else if (t->init == BENCH_INIT_BIAS)
                    v *= 0.5773503f; /* ± 0.02 */
                if (dt == BENCH_F32)
                    memcpy(buf + k * 4, &v, 4);
                else {
                    uint16_t h = dt == BENCH_F16 ? mmrt_f32_to_f16(v) : mmrt_f32_to_bf16(v);
                    memcpy(buf + k * 2, &h, 2);
                }
            }
            ok = fwrite(buf, es, (size_t)kn, f) == (size_t)kn;
            done += (uint64_t)kn * es;
            if (progress && done >= next_report) {
                char line[128];
                snprintf(line, sizeof line, "  %.1f of %.1f GB written", (double)done / 1e9,
                         (double)off / 1e9);
                progress(line);
                next_report += 1ull << 30;
            }
        }
    }
    free(buf);
    if (fclose(f) != 0)
        ok = 0;
    if (!ok) {
        snprintf(err, err_size, "%s: write failed (%s)", path, strerror(errno));
        return -1;
    }
    return 0;
}

static json_t *llava_config(const struct bench_shape *s, int64_t vl, int64_t tl,
                            enum bench_dtype dt)
{
    const int64_t grid = s->v_image / s->v_patch;
    json_t *text = json_pack(
        "{s:b,s:f,s:I,s:s,s:I,s:s,s:I,s:f,s:I,s:I,s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:f,"
        "s:{s:f,s:s},s:b,s:b,s:I}",
        "attention_bias", 0, "attention_dropout", 0.0, "bos_token_id", (json_int_t)1,
        "dtype", dtype_torch(dt), "eos_token_id", (json_int_t)-1, "hidden_act", "silu",
        "hidden_size", (json_int_t)s->t_hidden, "initializer_range", 0.02,
        "intermediate_size", (json_int_t)s->t_inter,
        "max_position_embeddings", (json_int_t)s->t_max_pos, "mlp_bias", 0,
        "model_type", "llama", "num_attention_heads", (json_int_t)s->t_heads,
        "num_hidden_layers", (json_int_t)tl, "num_key_value_heads", (json_int_t)s->t_kv_heads,
        "pad_token_id", (json_int_t)(s->image_token_id + 1),
        "pretraining_tp", (json_int_t)1, "rms_norm_eps", s->t_rms_eps,
        "rope_parameters", "rope_theta", s->t_rope_theta, "rope_type", "default",
        "tie_word_embeddings", 0, "use_cache", 1, "vocab_size", (json_int_t)s->t_vocab);
    if (text && s->t_head_dim * s->t_heads != s->t_hidden)
        json_object_set_new(text, "head_dim", json_integer(s->t_head_dim));
    json_t *vision = json_pack(
        "{s:f,s:s,s:s,s:I,s:I,s:f,s:f,s:I,s:f,s:s,s:I,s:I,s:I,s:I,s:I}",
        "attention_dropout", 0.0, "dtype", dtype_torch(dt), "hidden_act", s->v_act,
        "hidden_size", (json_int_t)s->v_hidden, "image_size", (json_int_t)s->v_image,
        "initializer_factor", 1.0, "initializer_range", 0.02,
        "intermediate_size", (json_int_t)s->v_inter, "layer_norm_eps", s->v_ln_eps,
        "model_type", "clip_vision_model", "num_attention_heads", (json_int_t)s->v_heads,
        "num_channels", (json_int_t)s->v_channels, "num_hidden_layers", (json_int_t)vl,
        "patch_size", (json_int_t)s->v_patch, "projection_dim", (json_int_t)768);
    json_t *cfg = json_pack(
        "{s:[s],s:s,s:I,s:I,s:s,s:b,s:I,s:s,s:o,s:b,s:o,s:I,s:s,s:s}",
        "architectures", "LlavaForConditionalGeneration", "dtype", dtype_torch(dt),
        "image_seq_length", (json_int_t)(grid * grid),
        "image_token_index", (json_int_t)s->image_token_id, "model_type", "llava",
        "multimodal_projector_bias", 1, "pad_token_id", (json_int_t)(s->image_token_id + 1),
        "projector_hidden_act", s->proj_act, "text_config", text, "tie_word_embeddings", 0,
        "vision_config", vision, "vision_feature_layer", (json_int_t)-2,
        "vision_feature_select_strategy", "default",
        "transformers_version", "5.24.0");
    if (cfg)
        json_object_set_new(cfg, "torch_dtype", json_string(dtype_torch(dt)));
    return cfg;
}

static json_t *special_token(int64_t id, const char *content)
{
    return json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *llama_tokenizer(const struct bench_shape *s)
{
    json_t *vocab = json_object();
    if (!vocab)
        return NULL;
    int64_t id = 0;
    json_object_set_new(vocab, "<unk>", json_integer(id++));
    json_object_set_new(vocab, "<s>", json_integer(id++));
    json_object_set_new(vocab, "</s>", json_integer(id++));
    char piece[32];
    for (int b = 0; b < 256; b++) {
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        json_object_set_new(vocab, piece, json_integer(id++));
    }
    json_object_set_new(vocab, "\xe2\x96\x81", json_integer(id++)); /* ▁ */
    for (int c = 0x21; c < 0x7f; c++) {
        piece[0] = (char)c;
        piece[1] = '\0';
        json_object_set_new(vocab, piece, json_integer(id++));
    }
    json_object_set_new(vocab, "\xe2\x96\x81" "a", json_integer(id++));
    /* Filler pieces, "▁w1", "▁w2", ..., give the vocabulary its real size. Each is merged from
     * the one its number without its last digit names and that digit ("▁w" + "5", "▁w5" +
     * "0", "▁w50" + "9"), so that an answer's text encodes back to the pieces the synthetic
     * model chose (mmrt-bench --prediction). */
    json_t *merges = json_pack("[[s,s],[s,s]]", "\xe2\x96\x81", "a", "\xe2\x96\x81", "w");
    if (!merges) {
        json_decref(vocab);
        return NULL;
    }
    json_object_set_new(vocab, "\xe2\x96\x81" "w", json_integer(id++));
    for (long long n = 1; id < s->tok_vocab; n++) {
        char head[32], digit[2] = { (char)('0' + n % 10), '\0' };
        snprintf(piece, sizeof piece, "\xe2\x96\x81w%lld", n);
        if (n < 10)
            snprintf(head, sizeof head, "\xe2\x96\x81w");
        else
            snprintf(head, sizeof head, "\xe2\x96\x81w%lld", n / 10);
        json_object_set_new(vocab, piece, json_integer(id++));
        if (json_array_append_new(merges, json_pack("[s,s]", head, digit)) != 0) {
            json_decref(merges); /* a merge missing would encode text differently */
            json_decref(vocab);
            return NULL;
        }
    }
    json_t *tok = json_pack(
        "{s:s,s:n,s:n,s:[o,o,o,o,o],"
        "s:{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]},s:n,"
        "s:{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],s:[{s:{s:s,s:i}},{s:{s:s,s:i}},"
        "{s:{s:s,s:i}},{s:{s:s,s:i}}],s:{s:{s:s,s:[i],s:[s]}}},"
        "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]},"
        "s:{s:s,s:n,s:s,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
        "version", "1.0", "truncation", "padding",
        "added_tokens", special_token(0, "<unk>"), special_token(1, "<s>"),
        special_token(2, "</s>"), special_token(s->image_token_id, "<image>"),
        special_token(s->image_token_id + 1, "<pad>"),
        "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend",
        "\xe2\x96\x81", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81",
        "pre_tokenizer",
        "post_processor", "type", "TemplateProcessing",
        "single", "SpecialToken", "id", "<s>", "type_id", 0, "Sequence", "id", "A", "type_id", 0,
        "pair", "SpecialToken", "id", "<s>", "type_id", 0, "Sequence", "id", "A", "type_id", 0,
        "SpecialToken", "id", "<s>", "type_id", 1, "Sequence", "id", "B", "type_id", 1,
        "special_tokens", "<s>", "id", "<s>", "ids", 1, "tokens", "<s>",
        "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
        "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
        "content", " ", "start", 1, "stop", 0,
        "model", "type", "BPE", "dropout", "unk_token", "<unk>", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0, "vocab",
        vocab, "merges", merges);
    return tok;
}

static json_t *llava_processor_config(const struct bench_shape *s)
{
    return json_pack(
        "{s:{s:{s:I,s:I},s:b,s:b,s:b,s:b,s:b,s:[f,f,f],s:s,s:[f,f,f],s:i,s:f,s:{s:I}},"
        "s:s,s:i,s:I,s:s,s:s}",
        "image_processor", "crop_size", "height", (json_int_t)s->v_image, "width",
        (json_int_t)s->v_image, "do_center_crop", 1, "do_convert_rgb", 1, "do_normalize", 1,
        "do_rescale", 1, "do_resize", 1, "image_mean", 0.48145466, 0.4578275, 0.40821073,
        "image_processor_type", "CLIPImageProcessor", "image_std", 0.26862954, 0.26130258,
        0.27577711, "resample", 3, "rescale_factor", 0.00392156862745098, "size",
        "shortest_edge", (json_int_t)s->v_image,
        "image_token", "<image>", "num_additional_image_tokens", 1,
        "patch_size", (json_int_t)s->v_patch, "processor_class", "LlavaProcessor",
        "vision_feature_select_strategy", "default");
}

static json_t *llava_tokenizer_config(void)
{
    return json_pack("{s:s,s:s,s:s,s:[],s:s,s:I,s:s,s:s,s:s,s:s}", "backend", "tokenizers",
                     "bos_token", "<s>", "eos_token", "</s>", "extra_special_tokens",
                     "image_token", "<image>", "model_max_length", (json_int_t)1000000,
                     "pad_token", "<pad>", "processor_class", "LlavaProcessor",
                     "tokenizer_class", "TokenizersBackend", "unk_token", "<unk>");
}

/* ---- Qwen2-VL ------------------------------------------------------------------------------- */

/* The special tokens after the byte-level BPE vocabulary, in the published order
 * (<|endoftext|> 151643 … <|video_pad|> 151656 for the real tokenizer; models.md §7.3). */
static const char *const qwen2_specials[] = {
    "<|endoftext|>",   "<|im_start|>",   "<|im_end|>",        "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",     "<|quad_start|>",
    "<|quad_end|>",    "<|vision_start|>", "<|vision_end|>",  "<|vision_pad|>",
    "<|image_pad|>",   "<|video_pad|>",
};
enum { QWEN2_N_SPECIAL = 14, QWEN2_IMAGE_PAD = 12 };

/* The tokens from the specials' block that config.json names: <|image_pad|> is
 * s->image_token_id, the others sit at their published offsets from it. */
static int64_t qwen2_special_id(const struct bench_shape *s, int k)
{
    return s->image_token_id - QWEN2_IMAGE_PAD + k;
}

/* Qwen2-VL's config.json as transformers 5 saves it (nested text_config and vision_config,
 * rope_parameters), with the published values; text eos −1 as for LLaVA. */
static json_t *qwen2vl_config(const struct bench_shape *s, int64_t vl, int64_t tl,
                              enum bench_dtype dt)
{
    json_t *layer_types = json_array();
    for (int64_t i = 0; layer_types && i < tl; i++)
        json_array_append_new(layer_types, json_string("full_attention"));
    json_t *text = json_pack(
        "{s:f,s:I,s:s,s:I,s:s,s:I,s:f,s:I,s:o,s:I,s:I,s:s,s:I,s:I,s:I,s:f,"
        "s:{s:[I,I,I],s:f,s:s},s:I,s:b,s:b,s:b,s:I}",
        "attention_dropout", 0.0, "bos_token_id", (json_int_t)qwen2_special_id(s, 0),
        "dtype", dtype_torch(dt), "eos_token_id", (json_int_t)-1, "hidden_act", "silu",
        "hidden_size", (json_int_t)s->t_hidden, "initializer_range", 0.02,
        "intermediate_size", (json_int_t)s->t_inter, "layer_types", layer_types,
        "max_position_embeddings", (json_int_t)s->t_max_pos,
        "max_window_layers", (json_int_t)s->t_layers, "model_type", "qwen2_vl_text",
        "num_attention_heads", (json_int_t)s->t_heads, "num_hidden_layers", (json_int_t)tl,
        "num_key_value_heads", (json_int_t)s->t_kv_heads, "rms_norm_eps", s->t_rms_eps,
        "rope_parameters", "mrope_section", (json_int_t)s->t_mrope[0],
        (json_int_t)s->t_mrope[1], (json_int_t)s->t_mrope[2], "rope_theta", s->t_rope_theta,
        "rope_type", "default", "sliding_window", (json_int_t)s->t_max_pos,
        "tie_word_embeddings", 0, "use_cache", 1, "use_sliding_window", 0,
        "vocab_size", (json_int_t)s->t_vocab);
    json_t *vision = json_pack(
        "{s:I,s:s,s:I,s:s,s:I,s:I,s:f,s:I,s:s,s:I,s:I,s:{s:f,s:s},s:I,s:I}",
        "depth", (json_int_t)vl, "dtype", dtype_torch(dt), "embed_dim", (json_int_t)s->v_hidden,
        "hidden_act", s->v_act, "hidden_size", (json_int_t)s->t_hidden,
        "in_channels", (json_int_t)s->v_channels, "initializer_range", 0.02,
        "mlp_ratio", (json_int_t)(s->v_inter / s->v_hidden), "model_type", "qwen2_vl_vision",
        "num_heads", (json_int_t)s->v_heads, "patch_size", (json_int_t)s->v_patch,
        "rope_parameters", "rope_theta", 10000.0, "rope_type", "axial",
        "spatial_merge_size", (json_int_t)s->v_merge,
        "temporal_patch_size", (json_int_t)s->v_temporal_patch);
    json_t *cfg = json_pack(
        "{s:[s],s:s,s:I,s:s,s:o,s:b,s:s,s:I,s:o,s:I,s:I,s:I}",
        "architectures", "Qwen2VLForConditionalGeneration", "dtype", dtype_torch(dt),
        "image_token_id", (json_int_t)s->image_token_id, "model_type", "qwen2_vl",
        "text_config", text, "tie_word_embeddings", 0, "transformers_version", "5.24.0",
        "video_token_id", (json_int_t)qwen2_special_id(s, 13), "vision_config", vision,
        "vision_end_token_id", (json_int_t)qwen2_special_id(s, 10),
        "vision_start_token_id", (json_int_t)qwen2_special_id(s, 9),
        "vision_token_id", (json_int_t)qwen2_special_id(s, 11));
    if (cfg)
        json_object_set_new(cfg, "torch_dtype", json_string(dtype_torch(dt)));
    return cfg;
}

/* UTF-8 of code point cp (< 0x800) into out; returns its length. */
static int utf8_put(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* A Qwen2-style byte-level BPE (models.md §6.4, §7.3): the 256 characters of GPT-2's
 * bytes_to_unicode first (printable bytes as themselves, the other 68 from U+0100 on, in
 * byte order), then "Ġa" with its one merge, so the prompt "a a … a" of n words is "a" plus
 * n − 1 "Ġa", exactly n tokens; fillers up to the real size; the special tokens after. */
static json_t *qwen2_tokenizer(const struct bench_shape *s)
{
    json_t *vocab = json_object();
    if (!vocab)
        return NULL;
    int64_t id = 0;
    char piece[32];
    for (unsigned b = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        if (!self)
            continue;
        piece[utf8_put(piece, b)] = '\0';
        json_object_set_new(vocab, piece, json_integer(id++));
    }
    for (unsigned b = 0, k = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        if (self)
            continue;
        piece[utf8_put(piece, 0x100 + k++)] = '\0';
        json_object_set_new(vocab, piece, json_integer(id++));
    }
    json_object_set_new(vocab, "\xc4\xa0" "a", json_integer(id++)); /* Ġa */
    while (id < s->tok_vocab) {
        snprintf(piece, sizeof piece, "\xc4\xa0w%lld", (long long)id); /* Ġw<id> */
        json_object_set_new(vocab, piece, json_integer(id++));
    }
    json_t *added = json_array();
    for (int k = 0; added && k < QWEN2_N_SPECIAL; k++)
        json_array_append_new(added, special_token(qwen2_special_id(s, k), qwen2_specials[k]));
    return json_pack(
        "{s:s,s:n,s:n,s:o,s:{s:s},"
        "s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]},"
        "s:{s:s,s:b,s:b,s:b},s:{s:s,s:b,s:b,s:b},"
        "s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:[[s,s]]}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added,
        "normalizer", "type", "NFC",
        "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern",
        "Regex",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
        "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 1, "use_regex", 0,
        "post_processor", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0,
        "use_regex", 1,
        "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1,
        "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab",
        vocab, "merges", "\xc4\xa0", "a");
}

static json_t *qwen2vl_tokenizer_config(void)
{
    return json_pack("{s:s,s:n,s:s,s:[],s:s,s:I,s:s,s:s,s:s,s:n,s:s,s:s,s:s}",
                     "backend", "tokenizers", "bos_token", "eos_token", "<|im_end|>",
                     "extra_special_tokens", "image_token", "<|image_pad|>",
                     "model_max_length", (json_int_t)32768, "pad_token", "<|endoftext|>",
                     "processor_class", "Qwen2VLProcessor", "tokenizer_class",
                     "TokenizersBackend", "unk_token", "video_token", "<|video_pad|>",
                     "vision_bos_token", "<|vision_start|>", "vision_eos_token",
                     "<|vision_end|>");
}

/* The hub's preprocessor_config.json (min_pixels / max_pixels at the top level). */
static json_t *qwen2vl_preprocessor_config(const struct bench_shape *s)
{
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:[f,f,f],s:[f,f,f],s:s,s:s}",
                     "min_pixels", (json_int_t)s->v_min_pixels,
                     "max_pixels", (json_int_t)s->v_max_pixels,
                     "patch_size", (json_int_t)s->v_patch,
                     "temporal_patch_size", (json_int_t)s->v_temporal_patch,
                     "merge_size", (json_int_t)s->v_merge,
                     "image_mean", 0.48145466, 0.4578275, 0.40821073,
                     "image_std", 0.26862954, 0.26130258, 0.27577711,
                     "image_processor_type", "Qwen2VLImageProcessor",
                     "processor_class", "Qwen2VLProcessor");
}

/* The same settings in the layout transformers 5 saves (processor_config.json). */
static json_t *qwen2vl_processor_config(const struct bench_shape *s)
{
    return json_pack(
        "{s:{s:b,s:b,s:b,s:b,s:[f,f,f],s:s,s:[f,f,f],s:I,s:I,s:i,s:f,s:{s:I,s:I},s:I},"
        "s:s,s:n}",
        "image_processor", "do_convert_rgb", 1, "do_normalize", 1, "do_rescale", 1,
        "do_resize", 1, "image_mean", 0.48145466, 0.4578275, 0.40821073,
        "image_processor_type", "Qwen2VLImageProcessor",
        "image_std", 0.26862954, 0.26130258, 0.27577711, "merge_size", (json_int_t)s->v_merge,
        "patch_size", (json_int_t)s->v_patch, "resample", 3,
        "rescale_factor", 0.00392156862745098, "size",
        "longest_edge", (json_int_t)s->v_max_pixels, "shortest_edge",
        (json_int_t)s->v_min_pixels, "temporal_patch_size", (json_int_t)s->v_temporal_patch,
        "processor_class", "Qwen2VLProcessor", "video_processor");
}

/* Qwen2-VL-Instruct's chat template (models.md §7.5), as processor.save_pretrained writes
 * it. */
static const char qwen2vl_chat_template[] =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

static int write_text(const char *dir, const char *name, const char *text, char *err,
                      size_t err_size)
{
    char path[4200];
    FILE *f = path_join(path, sizeof path, dir, name) == 0 ? fopen(path, "wb") : NULL;
    size_t n = strlen(text);
    int ok = f && fwrite(text, 1, n, f) == n;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok)
        snprintf(err, err_size, "%s: cannot write", path);
    return ok ? 0 : -1;
}

/* ---- Fuyu ----------------------------------------------------------------------------------- */

/* Fuyu's config.json as transformers 5 saves it (persimmon text_config), with adept/fuyu-8b's
 * values; eos −1 so generation never stops early. */
static json_t *fuyu_config(const struct bench_shape *s, int64_t tl, enum bench_dtype dt)
{
    json_t *text = json_pack(
        "{s:f,s:I,s:I,s:s,s:f,s:I,s:f,s:I,s:f,s:I,s:s,s:I,s:I,s:b,"
        "s:{s:f,s:f,s:s},s:b,s:b,s:I}",
        "attention_dropout", 0.0, "bos_token_id", (json_int_t)1, "eos_token_id",
        (json_int_t)-1, "hidden_act", "relu2", "hidden_dropout", 0.0,
        "hidden_size", (json_int_t)s->t_hidden, "initializer_range", 0.02,
        "intermediate_size", (json_int_t)s->t_inter, "layer_norm_eps", s->t_rms_eps,
        "max_position_embeddings", (json_int_t)s->t_max_pos, "model_type", "persimmon",
        "num_attention_heads", (json_int_t)s->t_heads, "num_hidden_layers", (json_int_t)tl,
        "qk_layernorm", 1, "rope_parameters", "partial_rotary_factor", s->t_partial_rotary,
        "rope_theta", s->t_rope_theta, "rope_type", "default", "tie_word_embeddings", 0,
        "use_cache", 1, "vocab_size", (json_int_t)s->t_vocab);
    json_t *cfg = json_pack(
        "{s:[s],s:I,s:s,s:I,s:I,s:I,s:f,s:s,s:I,s:I,s:o,s:b,s:s}",
        "architectures", "FuyuForCausalLM", "bos_token_id", (json_int_t)1,
        "dtype", dtype_torch(dt), "eos_token_id", (json_int_t)-1,
        "image_size", (json_int_t)s->v_image_cfg, "image_token_id",
        (json_int_t)s->image_token_id, "initializer_range", 0.02, "model_type", "fuyu",
        "num_channels", (json_int_t)s->v_channels, "patch_size", (json_int_t)s->v_patch,
        "text_config", text, "tie_word_embeddings", 0, "transformers_version", "5.24.0");
    if (cfg)
        json_object_set_new(cfg, "torch_dtype", json_string(dtype_torch(dt)));
    return cfg;
}

static json_t *unigram_piece(const char *piece, double score)
{
    return json_pack("[s,f]", piece, score);
}

/* A Fuyu-style SentencePiece Unigram with byte fallback (models.md §6.4, §7.4): <unk>, <s>,
 * </s>, the 256 byte pieces, "▁", the printable ASCII characters and "▁a" (the best-scored
 * piece, so "a a … a" of n words is n "▁a"); |SPEAKER|, |ENDOFTEXT| and |NEWLINE| as ordinary
 * pieces at their published ids (71011, +2, +8); fillers up to the real size. Legacy
 * normalizer and decoder; the post-processor puts |ENDOFTEXT| first, as the hub's does. */
static json_t *fuyu_tokenizer(const struct bench_shape *s)
{
    json_t *vocab = json_array();
    if (!vocab)
        return NULL;
    const int64_t speaker = s->image_token_id, eot = speaker + 2, newline = speaker + 8;
    char piece[32];
    json_array_append_new(vocab, unigram_piece("<unk>", 0.0));
    json_array_append_new(vocab, unigram_piece("<s>", 0.0));
    json_array_append_new(vocab, unigram_piece("</s>", 0.0));
    for (int b = 0; b < 256; b++) {
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        json_array_append_new(vocab, unigram_piece(piece, 0.0));
    }
    json_array_append_new(vocab, unigram_piece("\xe2\x96\x81", -3.0));
    for (int c = 0x21; c < 0x7f; c++) {
        piece[0] = (char)c;
        piece[1] = '\0';
        json_array_append_new(vocab, unigram_piece(piece, -5.0));
    }
    json_array_append_new(vocab, unigram_piece("\xe2\x96\x81" "a", -1.0));
    for (int64_t id = (int64_t)json_array_size(vocab); id < s->tok_vocab; id++) {
        if (id == speaker || id == eot || id == newline) {
            const char *p = id == speaker ? "|SPEAKER|" : id == eot ? "|ENDOFTEXT|" : "|NEWLINE|";
            json_array_append_new(vocab, unigram_piece(p, -2.0));
            continue;
        }
        snprintf(piece, sizeof piece, "\xe2\x96\x81w%lld", (long long)id);
        json_array_append_new(vocab, unigram_piece(piece, -20.0));
    }
    return json_pack(
        "{s:s,s:n,s:n,s:[o,o],"
        "s:{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]},s:n,"
        "s:{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],"
        "s:{s:{s:s,s:[I],s:[s]}}},"
        "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]},"
        "s:{s:s,s:i,s:o,s:b}}",
        "version", "1.0", "truncation", "padding",
        "added_tokens", special_token(0, "<unk>"), special_token(eot, "|ENDOFTEXT|"),
        "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend",
        "\xe2\x96\x81", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81",
        "pre_tokenizer",
        "post_processor", "type", "TemplateProcessing",
        "single", "SpecialToken", "id", "|ENDOFTEXT|", "type_id", 0, "Sequence", "id", "A",
        "type_id", 0,
        "pair", "Sequence", "id", "A", "type_id", 0, "Sequence", "id", "B", "type_id", 1,
        "special_tokens", "|ENDOFTEXT|", "id", "|ENDOFTEXT|", "ids", (json_int_t)eot, "tokens",
        "|ENDOFTEXT|",
        "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
        "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
        "content", " ", "start", 1, "stop", 0,
        "model", "type", "Unigram", "unk_id", 0, "vocab", vocab, "byte_fallback", 1);
}

static json_t *fuyu_tokenizer_config(void)
{
    return json_pack("{s:s,s:s,s:s,s:I,s:s,s:s,s:s}", "backend", "tokenizers",
                     "bos_token", "|ENDOFTEXT|", "eos_token", "|ENDOFTEXT|",
                     "model_max_length", (json_int_t)1000000, "pad_token", "|ENDOFTEXT|",
                     "tokenizer_class", "TokenizersBackend", "unk_token", "<unk>");
}

/* adept/fuyu-8b's preprocessor_config.json. */
static json_t *fuyu_preprocessor_config(const struct bench_shape *s)
{
    return json_pack("{s:b,s:b,s:b,s:b,s:f,s:s,s:f,s:s,s:f,s:{s:I,s:I},s:s,s:i,s:f,"
                     "s:{s:I,s:I}}",
                     "do_normalize", 1, "do_pad", 1, "do_rescale", 1, "do_resize", 1,
                     "image_mean", 0.5, "image_processor_type", "FuyuImageProcessor",
                     "image_std", 0.5, "padding_mode", "constant", "padding_value", 1.0,
                     "patch_size", "height", (json_int_t)s->v_patch, "width",
                     (json_int_t)s->v_patch, "processor_class", "FuyuProcessor", "resample", 2,
                     "rescale_factor", 0.00392156862745098, "size", "height",
                     (json_int_t)s->v_target_h, "width", (json_int_t)s->v_target_w);
}

/* ---- the checkpoint ------------------------------------------------------------------------- */

void *bench_synth_config(const struct bench_shape *s, int64_t layers, enum bench_dtype dt)
{
    int64_t vl, tl;
    bench_shape_depth(s, layers, &vl, &tl);
    switch (s->family) {
    case BENCH_LLAVA: return llava_config(s, vl, tl, dt);
    case BENCH_QWEN2VL: return qwen2vl_config(s, vl, tl, dt);
    case BENCH_FUYU: return fuyu_config(s, tl, dt);
    }
    return NULL;
}

/* The processor file the family's loader reads (its presence completes a checkpoint). */
static const char *processor_file(const struct bench_shape *s)
{
    return s->family == BENCH_LLAVA ? "processor_config.json" : "preprocessor_config.json";
}

static int file_exists(const char *dir, const char *name)
{
    char path[4200];
    struct stat st;
    return path_join(path, sizeof path, dir, name) == 0 && stat(path, &st) == 0 &&
           S_ISREG(st.st_mode);
}

bool bench_synth_exists(const char *dir, const struct bench_shape *s)
{
    return file_exists(dir, "config.json") && file_exists(dir, "model.safetensors") &&
           file_exists(dir, "tokenizer.json") && file_exists(dir, processor_file(s));
}

/* What a checkpoint folder holds; the weights are the first. */
static const char *const synth_files[] = {
    "model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
    "processor_config.json", "preprocessor_config.json", "chat_template.jinja", "synth-version",
};

/* The small files' layout, kept in "synth-version": a folder written before a change to
 * them gets them again (its weights kept). 2: the LLaVA tokenizer's pieces merge. */
#define SYNTH_FILES_VERSION "2\n"

static bool files_current(const char *dir)
{
    char path[4200], got[8] = "";
    if (path_join(path, sizeof path, dir, "synth-version") != 0)
        return false;
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    const size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = '\0';
    return strcmp(got, SYNTH_FILES_VERSION) == 0;
}

static int write_version(const char *dir, char *err, size_t err_size)
{
    char path[4200];
    FILE *f = path_join(path, sizeof path, dir, "synth-version") == 0 ? fopen(path, "w") : NULL;
    if (!f || fputs(SYNTH_FILES_VERSION, f) < 0 || fclose(f) != 0) {
        if (f)
            fclose(f);
        snprintf(err, err_size, "%s/synth-version: cannot write (%s)", dir, strerror(errno));
        return -1;
    }
    return 0;
}

static void remove_tree(const char *dir)
{
    char path[4200];
    for (size_t i = 0; i < sizeof synth_files / sizeof synth_files[0]; i++)
        if (path_join(path, sizeof path, dir, synth_files[i]) == 0)
            unlink(path);
    rmdir(dir);
}

/* The small files of the family (everything but the weights) into dir. */
static int write_small_files(const char *dir, const struct bench_shape *s, int64_t layers,
                             enum bench_dtype dt, char *err, size_t err_size)
{
    int rc = write_json(dir, "config.json", bench_synth_config(s, layers, dt), JSON_INDENT(1),
                        err, err_size);
    switch (s->family) {
    case BENCH_LLAVA:
        if (rc == 0)
            rc = write_json(dir, "tokenizer.json", llama_tokenizer(s), JSON_INDENT(1), err,
                            err_size);
        if (rc == 0)
            rc = write_json(dir, "tokenizer_config.json", llava_tokenizer_config(),
                            JSON_INDENT(1), err, err_size);
        if (rc == 0)
            rc = write_json(dir, "processor_config.json", llava_processor_config(s),
                            JSON_INDENT(1), err, err_size);
        break;
    case BENCH_QWEN2VL:
        if (rc == 0)
            rc = write_json(dir, "tokenizer.json", qwen2_tokenizer(s), JSON_COMPACT, err,
                            err_size);
        if (rc == 0)
            rc = write_json(dir, "tokenizer_config.json", qwen2vl_tokenizer_config(),
                            JSON_INDENT(1), err, err_size);
        if (rc == 0)
            rc = write_json(dir, "processor_config.json", qwen2vl_processor_config(s),
                            JSON_INDENT(1), err, err_size);
        if (rc == 0)
            rc = write_text(dir, "chat_template.jinja", qwen2vl_chat_template, err, err_size);
        if (rc == 0)
            rc = write_json(dir, "preprocessor_config.json", qwen2vl_preprocessor_config(s),
                            JSON_INDENT(1), err, err_size);
        break;
    case BENCH_FUYU:
        if (rc == 0)
            rc = write_json(dir, "tokenizer.json", fuyu_tokenizer(s), JSON_COMPACT, err,
                            err_size);
        if (rc == 0)
            rc = write_json(dir, "tokenizer_config.json", fuyu_tokenizer_config(),
                            JSON_INDENT(1), err, err_size);
        if (rc == 0)
            rc = write_json(dir, "preprocessor_config.json", fuyu_preprocessor_config(s),
                            JSON_INDENT(1), err, err_size);
        break;
    }
    return rc;
}

int bench_synth_checkpoint(const char *dir, const struct bench_shape *s, int64_t layers,
                           enum bench_dtype dt, void (*progress)(const char *line),
                           char *err, size_t err_size)
{
    const bool have = bench_synth_exists(dir, s);
    if (have && files_current(dir))
        return 0;
    char tmp[4200];
    int tn = snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid());
    if (tn < 0 || (size_t)tn >= sizeof tmp) {
        snprintf(err, err_size, "%s: path too long", dir);
        return -1;
    }
    if (bench_mkdirs(tmp) != 0) {
        snprintf(err, err_size, "%s: cannot create (%s)", tmp, strerror(errno));
        return -1;
    }
    if (progress) {
        char line[4400];
        snprintf(line, sizeof line, "writing synthetic checkpoint %s (once; reused after)", dir);
        progress(line);
    }
    if (have) {
        /* Older small files beside good weights: new ones, each renamed into place. */
        int rc = write_small_files(tmp, s, layers, dt, err, err_size);
        if (rc == 0)
            rc = write_version(tmp, err, err_size);
        char from[4200], to[4200];
        for (size_t i = 1; rc == 0 && i < sizeof synth_files / sizeof synth_files[0]; i++)
            if (file_exists(tmp, synth_files[i]) &&
                (path_join(from, sizeof from, tmp, synth_files[i]) != 0 ||
                 path_join(to, sizeof to, dir, synth_files[i]) != 0 || rename(from, to) != 0)) {
                snprintf(err, err_size, "%s: cannot replace (%s)", to, strerror(errno));
                rc = -1;
            }
        remove_tree(tmp);
        return rc;
    }
    struct bench_tensor *ts = NULL;
    int n_ts = 0;
    int rc = bench_synth_tensors(s, layers, &ts, &n_ts);
    if (rc != 0)
        snprintf(err, err_size, "out of memory");
    if (rc == 0)
        rc = write_small_files(tmp, s, layers, dt, err, err_size);
    if (rc == 0)
        rc = write_version(tmp, err, err_size);
    if (rc == 0)
        rc = write_safetensors(tmp, ts, n_ts, dt, progress, err, err_size);
    free(ts);
    if (rc == 0 && rename(tmp, dir) != 0) {
        /* Another run may have finished the same checkpoint first: use that one. */
        if (bench_synth_exists(dir, s)) {
            remove_tree(tmp);
            return 0;
        }
        snprintf(err, err_size, "rename %s → %s: %s", tmp, dir, strerror(errno));
        rc = -1;
    }
    if (rc != 0)
        remove_tree(tmp);
    return rc;
}

/* ---- images and prompts ------------------------------------------------------------------ */

static int png_chunk(FILE *f, const char *type, const unsigned char *data, uint32_t len)
{
    unsigned char hdr[8] = { (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                             (unsigned char)(len >> 8), (unsigned char)len,
                             (unsigned char)type[0], (unsigned char)type[1],
                             (unsigned char)type[2], (unsigned char)type[3] };
    uLong crc = crc32(0L, hdr + 4, 4);
    if (len)
        crc = crc32(crc, data, len);
    unsigned char c[4] = { (unsigned char)(crc >> 24), (unsigned char)(crc >> 16),
                           (unsigned char)(crc >> 8), (unsigned char)crc };
    return fwrite(hdr, 1, 8, f) == 8 && (len == 0 || fwrite(data, 1, len, f) == len) &&
                   fwrite(c, 1, 4, f) == 4
               ? 0
               : -1;
}

int bench_synth_image(const char *path, int size, uint32_t seed, char *err, size_t err_size)
{
    struct stat st;
    if (stat(path, &st) == 0)
        return 0;
    size_t row = (size_t)size * 3 + 1, raw_len = row * (size_t)size;
    unsigned char *raw = malloc(raw_len);
    uLongf z_len = compressBound((uLong)raw_len);
    unsigned char *z = malloc(z_len);
    if (!raw || !z) {
        free(raw);
        free(z);
        snprintf(err, err_size, "image %dx%d: out of memory", size, size);
        return -1;
    }
    uint64_t rs = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (int y = 0; y < size; y++) {
        unsigned char *r = raw + (size_t)y * row;
        r[0] = 0; /* filter: none */
        for (int x = 0; x < size; x++) {
            int noise = (int)(rng_next(&rs) >> 59); /* 0 … 31 */
            r[1 + 3 * x] = (unsigned char)(x * 223 / (size > 1 ? size - 1 : 1) + noise);
            r[2 + 3 * x] = (unsigned char)(y * 223 / (size > 1 ? size - 1 : 1) + noise);
            r[3 + 3 * x] = (unsigned char)(((x + y) * 111 / (size > 1 ? size - 1 : 1)) + noise);
        }
    }
    int rc = compress2(z, &z_len, raw, (uLong)raw_len, 6) == Z_OK ? 0 : -1;
    char tmp[4200];
    int tn = snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = rc == 0 && tn > 0 && (size_t)tn < sizeof tmp ? fopen(tmp, "wb") : NULL;
    if (f) {
        static const unsigned char sig[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
        unsigned char ihdr[13] = { (unsigned char)(size >> 24), (unsigned char)(size >> 16),
                                   (unsigned char)(size >> 8), (unsigned char)size,
                                   (unsigned char)(size >> 24), (unsigned char)(size >> 16),
                                   (unsigned char)(size >> 8), (unsigned char)size,
                                   8, 2, 0, 0, 0 };
        rc = fwrite(sig, 1, 8, f) == 8 ? 0 : -1;
        if (rc == 0)
            rc = png_chunk(f, "IHDR", ihdr, 13);
        if (rc == 0)
            rc = png_chunk(f, "IDAT", z, (uint32_t)z_len);
        if (rc == 0)
            rc = png_chunk(f, "IEND", NULL, 0);
        if (fclose(f) != 0)
            rc = -1;
        if (rc == 0 && rename(tmp, path) != 0)
            rc = -1;
        if (rc != 0)
            unlink(tmp);
    } else {
        rc = -1;
    }
    free(raw);
    free(z);
    if (rc != 0)
        snprintf(err, err_size, "%s: cannot write the synthetic image", path);
    return rc;
}

char *bench_synth_prompt(int n)
{
    size_t len = n > 0 ? (size_t)n * 2 : 1;
    char *p = malloc(len);
    if (!p)
        return NULL;
    for (int i = 0; i < n; i++) {
        p[2 * i] = 'a';
        p[2 * i + 1] = i + 1 < n ? ' ' : '\0';
    }
    if (n <= 0)
        p[0] = '\0';
    return p;
}
