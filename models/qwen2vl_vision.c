/* models/qwen2vl_vision.c — the Qwen2-VL vision tower and merger on core ops (see
 * qwen2vl_vision.h). One forward runs every image of a request as packed sequences. */
#include "qwen2vl_vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"
#include "ops.h"

const enum mmrt_op mmrt_qwen2vl_vision_ops[] = {
    MMRT_OP_MATMUL, MMRT_OP_LAYERNORM, MMRT_OP_ROPE_MULTI, MMRT_OP_ATTENTION, MMRT_OP_ADD,
    MMRT_OP_GELU,
};
const int mmrt_qwen2vl_vision_n_ops =
    (int)(sizeof mmrt_qwen2vl_vision_ops / sizeof mmrt_qwen2vl_vision_ops[0]);

#define LN_EPS 1e-6f /* transformers hard-codes it for the blocks and ln_q */

static mmrt_status act_from_name(const char *name, const char *what, enum mmrt_op *out,
                                 struct mmrt_error *err)
{
    if (strcmp(name, "quick_gelu") == 0)
        *out = MMRT_OP_QUICK_GELU;
    else if (strcmp(name, "gelu") == 0)
        *out = MMRT_OP_GELU;
    else if (strcmp(name, "gelu_pytorch_tanh") == 0 || strcmp(name, "gelu_new") == 0)
        *out = MMRT_OP_GELU_TANH;
    else if (strcmp(name, "silu") == 0)
        *out = MMRT_OP_SILU;
    else
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: vision hidden_act '%s' is not supported", what, name);
    return MMRT_OK;
}

mmrt_status mmrt_qwen2vl_vision_config_parse(const json_t *cfg, const char *what,
                                             struct mmrt_qwen2vl_vision_config *out,
                                             struct mmrt_error *err)
{
    struct mmrt_qwen2vl_vision_config c = { 0 };
    const char *type = NULL, *act = NULL;
    long long v;
    double ratio;
    mmrt_status st = mmrt_json_opt_string(cfg, "model_type", what, "qwen2_vl_vision", &type,
                                          err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "qwen2_vl_vision") != 0 && strcmp(type, "qwen2_vl") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: vision model_type '%s' is not supported (qwen2_vl_vision)",
                              what, type);
#define INT(key, lo, hi, def, field)                                                           \
    do {                                                                                       \
        st = mmrt_json_opt_int(cfg, key, what, lo, hi, def, &v, err);                          \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
        c.field = v;                                                                           \
    } while (0)
    INT("depth", 1, 1024, 32, depth);
    INT("embed_dim", 1, 1 << 16, 1280, embed_dim);
    INT("hidden_size", 1, 1 << 17, 3584, hidden);
    INT("num_heads", 1, 1024, 16, n_heads);
    INT("in_chans", 1, 16, 3, channels);
    INT("in_channels", 1, 16, c.channels, channels);
    INT("patch_size", 1, 1024, 14, patch);
    INT("spatial_merge_size", 1, 16, 2, merge);
    INT("temporal_patch_size", 1, 16, 2, temporal);
#undef INT
    st = mmrt_json_opt_number(cfg, "mlp_ratio", what, 1e-3, 1e3, 4.0, &ratio, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(cfg, "hidden_act", what, "quick_gelu", &act, err);
    if (st == MMRT_OK)
        st = act_from_name(act, what, &c.act, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_number(cfg, "rope_theta", what, 1e-3, 1e12, 10000.0, &c.rope_theta,
                                  err);
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    if (st == MMRT_OK && json_is_object(rp))
        st = mmrt_json_opt_number(rp, "rope_theta", what, 1e-3, 1e12, c.rope_theta,
                                  &c.rope_theta, err);
    if (st != MMRT_OK)
        return st;
    c.mlp_hidden = (int64_t)((double)c.embed_dim * ratio); /* Python int(): truncation */
    const int64_t hd = c.embed_dim / c.n_heads;
    if (c.embed_dim % c.n_heads != 0 || hd % 4 != 0 || hd > 256)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: embed_dim %lld / num_heads %lld must be a whole head size "
                              "that is a multiple of 4 (2-D rotary) and at most 256",
                              what, (long long)c.embed_dim, (long long)c.n_heads);
    if (c.mlp_hidden < 1 || c.mlp_hidden > 1 << 20)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: embed_dim × mlp_ratio = %lld is out of "
                              "range", what, (long long)c.mlp_hidden);
    if (c.channels != 3)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: in_channels %lld is not supported (RGB images, 3)", what,
                              (long long)c.channels);
    if (c.patch * c.patch * c.channels * c.temporal > 1 << 24)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: patch_size %lld is too large", what,
                              (long long)c.patch);
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_qwen2vl_vision_load(struct mmrt_qwen2vl_vision *v, struct mmrt_weights *w,
                                     struct mmrt_dev *dev,
                                     const struct mmrt_qwen2vl_vision_config *cfg,
                                     struct mmrt_error *err)
{
    memset(v, 0, sizeof *v);
    v->cfg = *cfg;
    v->dev = dev;
    const int64_t E = cfg->embed_dim, D = cfg->hidden, I = cfg->mlp_hidden;
    const int64_t C = cfg->channels, T = cfg->temporal, P = cfg->patch;
    const int64_t ME = cfg->merge * cfg->merge * E;
    v->blocks = calloc((size_t)cfg->depth, sizeof *v->blocks);
    if (!v->blocks)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "vision tower: out of memory");
    mmrt_status st;
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
#define LOAD(dst, nd, ...)                                                                     \
    do {                                                                                       \
        st = mmrt_weights_load(w, dev, nd, NE(__VA_ARGS__), &(dst), err, "%s", name);          \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
#define MATRIX(dst, n, k)                                                                      \
    do {                                                                                       \
        st = mmrt_weights_load_matrix(w, dev, n, k, &(dst), err, "%s", name);                  \
        if (st != MMRT_OK)                                                                     \
            goto fail;                                                                         \
    } while (0)
    char name[256];
    /* The Conv3d kernel [E, C, T, P, P] is a matmul weight over the flattened patch. */
    st = mmrt_weights_load_as(w, dev, 5, NE(E, C, T, P, P), 2, NE(E, C * T * P * P),
                              &v->patch_w.t, err, "visual.patch_embed.proj.weight");
    if (st != MMRT_OK)
        goto fail;
    for (int64_t i = 0; i < cfg->depth; i++) {
        struct mmrt_qwen2vl_vision_block *B = &v->blocks[i];
#define BLOCK(dst, suffix, nd, ...)                                                            \
        do {                                                                                   \
            snprintf(name, sizeof name, "visual.blocks.%lld.%s", (long long)i, suffix);         \
            LOAD(dst, nd, __VA_ARGS__);                                                        \
        } while (0)
#define BLOCK_MATRIX(dst, suffix, n, k)                                                        \
        do {                                                                                   \
            snprintf(name, sizeof name, "visual.blocks.%lld.%s", (long long)i, suffix);         \
            MATRIX(dst, n, k);                                                                 \
        } while (0)
        BLOCK(B->norm1_w, "norm1.weight", 1, E);
        BLOCK(B->norm1_b, "norm1.bias", 1, E);
        BLOCK_MATRIX(B->qkv_w, "attn.qkv.weight", 3 * E, E);
        BLOCK(B->qkv_b, "attn.qkv.bias", 1, 3 * E);
        BLOCK_MATRIX(B->proj_w, "attn.proj.weight", E, E);
        BLOCK(B->proj_b, "attn.proj.bias", 1, E);
        BLOCK(B->norm2_w, "norm2.weight", 1, E);
        BLOCK(B->norm2_b, "norm2.bias", 1, E);
        BLOCK_MATRIX(B->fc1_w, "mlp.fc1.weight", I, E);
        BLOCK(B->fc1_b, "mlp.fc1.bias", 1, I);
        BLOCK_MATRIX(B->fc2_w, "mlp.fc2.weight", E, I);
        BLOCK(B->fc2_b, "mlp.fc2.bias", 1, E);
#undef BLOCK
#undef BLOCK_MATRIX
    }
#define MERGER(dst, suffix, nd, ...)                                                           \
    do {                                                                                       \
        snprintf(name, sizeof name, "visual.merger.%s", suffix);                               \
        LOAD(dst, nd, __VA_ARGS__);                                                            \
    } while (0)
    MERGER(v->ln_q_w, "ln_q.weight", 1, E);
    MERGER(v->ln_q_b, "ln_q.bias", 1, E);
    snprintf(name, sizeof name, "visual.merger.mlp.0.weight");
    MATRIX(v->mlp0_w, ME, ME);
    MERGER(v->mlp0_b, "mlp.0.bias", 1, ME);
    snprintf(name, sizeof name, "visual.merger.mlp.2.weight");
    MATRIX(v->mlp2_w, D, ME);
    MERGER(v->mlp2_b, "mlp.2.bias", 1, D);
#undef MERGER
#undef LOAD
#undef MATRIX
#undef NE
    return MMRT_OK;
fail:
    mmrt_qwen2vl_vision_unload(v);
    return st;
}

void mmrt_qwen2vl_vision_unload(struct mmrt_qwen2vl_vision *v)
{
    free(v->blocks);
    v->blocks = NULL;
}

/* (row, column) of every patch in the pixels' merge-window order, and the cumulative patch
 * count at each frame boundary. pos [N][2], cu [n_frames + 1]. */
static void patch_positions(int n_images, const int32_t *grid, int64_t merge, int32_t *pos,
                            int32_t *cu)
{
    int64_t k = 0, f = 0;
    cu[0] = 0;
    for (int i = 0; i < n_images; i++) {
        const int64_t t = grid[3 * i], h = grid[3 * i + 1], w = grid[3 * i + 2];
        for (int64_t ti = 0; ti < t; ti++) {
            for (int64_t br = 0; br < h / merge; br++)
                for (int64_t bc = 0; bc < w / merge; bc++)
                    for (int64_t r = 0; r < merge; r++)
                        for (int64_t c = 0; c < merge; c++) {
                            pos[2 * k] = (int32_t)(br * merge + r);
                            pos[2 * k + 1] = (int32_t)(bc * merge + c);
                            k++;
                        }
            cu[f + 1] = (int32_t)(cu[f] + h * w);
            f++;
        }
    }
}

/* The [N, H, hd] view of q, k or v (part 0, 1, 2) inside qkv [N, 3E]: rows [q | k | v],
 * each head-contiguous (transformers reshapes to (N, 3, H, hd)). */
static struct mmrt_tensor qkv_part(const struct mmrt_tensor *qkv, int part, int64_t H,
                                   int64_t hd)
{
    struct mmrt_tensor t = *qkv;
    t.n_dims = 3;
    t.ne[0] = qkv->ne[0];
    t.ne[1] = H;
    t.ne[2] = hd;
    t.ne[3] = 1;
    t.nb[0] = qkv->nb[0];
    t.nb[1] = hd * (int64_t)sizeof(float);
    t.nb[2] = sizeof(float);
    t.nb[3] = sizeof(float);
    t.offset += (uint64_t)(part * H * hd) * sizeof(float);
    return t;
}

mmrt_status mmrt_qwen2vl_vision_forward(struct mmrt_qwen2vl_vision *v, const float *pixels,
                                        int n_images, const int32_t *grid_thw, float *features,
                                        struct mmrt_error *err)
{
    const struct mmrt_qwen2vl_vision_config *c = &v->cfg;
    struct mmrt_dev *dev = v->dev;
    const int64_t E = c->embed_dim, H = c->n_heads, hd = E / H, D = c->hidden;
    const int64_t m2 = c->merge * c->merge, K = c->channels * c->temporal * c->patch * c->patch;
    int64_t N = 0, n_frames = 0;
    for (int i = 0; i < n_images; i++) {
        const int64_t t = grid_thw[3 * i], h = grid_thw[3 * i + 1], w = grid_thw[3 * i + 2];
        if (t < 1 || h < 1 || w < 1 || h % c->merge || w % c->merge)
            return mmrt_error_set(err, MMRT_ERR_INTERNAL,
                                  "vision tower: image %d has grid %lld×%lld×%lld", i,
                                  (long long)t, (long long)h, (long long)w);
        N += t * h * w;
        n_frames += t;
    }
    if (n_images < 1 || N > INT32_MAX || n_frames > INT32_MAX)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "vision tower: %d images, %lld patches",
                              n_images, (long long)N);
    int32_t *pos = malloc((size_t)N * 2 * sizeof *pos);
    int32_t *cu = malloc((size_t)(n_frames + 1) * sizeof *cu);
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, dev);
    mmrt_status st = MMRT_OK;
    if (!pos || !cu) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "vision tower: out of memory");
        goto out;
    }
    patch_positions(n_images, grid_thw, c->merge, pos, cu);
    struct mmrt_tensor px, x, h, qkv, q, k, att, o, f, t_pos, t_cu, m1, y;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            goto out;                                                                          \
    } while (0)
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, K), &px, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, E), &x, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, E), &h, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, 3 * E), &qkv, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(N, H, hd), &q, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(N, H, hd), &k, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, NE(N, H, hd), &att, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, E), &o, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(N, c->mlp_hidden), &f, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_I32, 2, NE(N, 2), &t_pos, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_I32, 1, NE(n_frames + 1), &t_cu, err));
    TRY(mmrt_dev_upload(dev, &px, pixels, (uint64_t)(N * K) * sizeof(float), err));
    TRY(mmrt_dev_upload(dev, &t_pos, pos, (uint64_t)N * 2 * sizeof(int32_t), err));
    TRY(mmrt_dev_upload(dev, &t_cu, cu, (uint64_t)(n_frames + 1) * sizeof(int32_t), err));
    TRY(mmrt_op_matmul(dev, &px, &v->patch_w, NULL, &x, err));
    const struct mmrt_rope_multi_params rope = {
        .theta = (float)c->rope_theta, .n_rot = (int32_t)hd, .freq_dim = (int32_t)(hd / 2),
        .restart = 1, .n_axes = 2, .sections = { (int32_t)(hd / 4), (int32_t)(hd / 4) },
    };
    const struct mmrt_attention_params ap = { 1.0f / sqrtf((float)hd), 0, (int32_t)n_frames, 0 };
    const struct mmrt_tensor qv = qkv_part(&qkv, 0, H, hd), kv = qkv_part(&qkv, 1, H, hd);
    const struct mmrt_tensor vv = qkv_part(&qkv, 2, H, hd);
    const struct mmrt_tensor att2 = mmrt_tensor_reshape(&att, 2, NE(N, E));
    for (int64_t b = 0; b < c->depth; b++) {
        const struct mmrt_qwen2vl_vision_block *B = &v->blocks[b];
        TRY(mmrt_op_layernorm(dev, &x, &B->norm1_w, &B->norm1_b, LN_EPS, &h, err));
        TRY(mmrt_op_matmul(dev, &h, &B->qkv_w, &B->qkv_b, &qkv, err));
        TRY(mmrt_op_rope_multi(dev, &qv, &t_pos, &rope, &q, err));
        TRY(mmrt_op_rope_multi(dev, &kv, &t_pos, &rope, &k, err));
        TRY(mmrt_op_attention(dev, &q, &k, &vv, &t_cu, &t_cu, &ap, &att, err));
        TRY(mmrt_op_matmul(dev, &att2, &B->proj_w, &B->proj_b, &o, err));
        TRY(mmrt_op_add(dev, &x, &o, &x, err));
        TRY(mmrt_op_layernorm(dev, &x, &B->norm2_w, &B->norm2_b, LN_EPS, &h, err));
        TRY(mmrt_op_matmul(dev, &h, &B->fc1_w, &B->fc1_b, &f, err));
        TRY(mmrt_op_unary(dev, c->act, &f, &f, err));
        TRY(mmrt_op_matmul(dev, &f, &B->fc2_w, &B->fc2_b, &o, err));
        TRY(mmrt_op_add(dev, &x, &o, &x, err));
    }
    /* Merger: each m² consecutive patches (one merge window) become one row. */
    const int64_t M = N / m2;
    TRY(mmrt_op_layernorm(dev, &x, &v->ln_q_w, &v->ln_q_b, LN_EPS, &h, err));
    const struct mmrt_tensor hm = mmrt_tensor_reshape(&h, 2, NE(M, m2 * E));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(M, m2 * E), &m1, err));
    TRY(mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 2, NE(M, D), &y, err));
    TRY(mmrt_op_matmul(dev, &hm, &v->mlp0_w, &v->mlp0_b, &m1, err));
    TRY(mmrt_op_unary(dev, MMRT_OP_GELU, &m1, &m1, err));
    TRY(mmrt_op_matmul(dev, &m1, &v->mlp2_w, &v->mlp2_b, &y, err));
    TRY(mmrt_dev_download(dev, &y, features, (uint64_t)(M * D) * sizeof(float), err));
#undef TRY
#undef NE
out:
    mmrt_scratch_release(&s);
    free(pos);
    free(cu);
    return st;
}
