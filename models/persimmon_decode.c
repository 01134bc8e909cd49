/*
 * models/persimmon_decode.c — the Persimmon decoder's (Fuyu's) one-token step on buffers
 * that live for a whole generation, replayable as a device graph (decode_step.h says how).
 * The same math as mmrt_persimmon_forward with S = 1.
 */
#include <math.h>
#include <stdlib.h>

#include "decode_step.h"
#include "ops.h"
#include "persimmon.h"

struct mmrt_persimmon_decoder {
    struct mmrt_persimmon *m;
    struct mmrt_kv_cache *cache;
    struct mmrt_scratch s; /* every buffer of the step, alive until destroy */
    struct mmrt_tensor h, x, qkv, q, k, v, att, o, u, lg;
    struct mmrt_decode_step *step;
};

static mmrt_status issue_step(void *decoder, const struct mmrt_decode_ctrl *ctrl,
                              struct mmrt_error *err)
{
    struct mmrt_persimmon_decoder *d = decoder;
    struct mmrt_persimmon *m = d->m;
    const struct mmrt_persimmon_config *c = &m->cfg;
    struct mmrt_dev *dev = m->dev;
    struct mmrt_kv_cache *cache = d->cache;
    const int64_t D = c->hidden, H = c->n_heads, hd = c->head_dim;
    const struct mmrt_rope_params rope = { (float)c->rope_theta, (int32_t)c->n_rot,
                                           MMRT_ROPE_NEOX };
    const struct mmrt_attention_params ap = { 1.0f / sqrtf((float)hd), 1, 2 };
    const float eps = (float)c->ln_eps;
    struct mmrt_tensor qkv2 = mmrt_tensor_reshape(&d->qkv, 2, (const int64_t[]){ 1, 3 * D });
    struct mmrt_tensor qv = mmrt_persimmon_qkv_part(&d->qkv, 0);
    struct mmrt_tensor kv = mmrt_persimmon_qkv_part(&d->qkv, 1);
    struct mmrt_tensor vv = mmrt_persimmon_qkv_part(&d->qkv, 2);
    struct mmrt_tensor q_rows = mmrt_tensor_reshape(&d->q, 2, (const int64_t[]){ H, hd });
    struct mmrt_tensor k_rows = mmrt_tensor_reshape(&d->k, 2, (const int64_t[]){ H, hd });
    struct mmrt_tensor att2 = mmrt_tensor_reshape(&d->att, 2, (const int64_t[]){ 1, D });
    mmrt_status st;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
    } while (0)
    TRY(mmrt_op_get_rows(dev, &m->embed, &ctrl->id, &d->h, err));
    for (int64_t l = 0; l < c->n_layers; l++) {
        const struct mmrt_persimmon_layer *L = &m->layers[l];
        TRY(mmrt_op_layernorm(dev, &d->h, &L->ln_in_w, &L->ln_in_b, eps, &d->x, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->qkv_w, &L->qkv_b, &qkv2, err));
        TRY(mmrt_op_copy(dev, &qv, &d->q, err));
        TRY(mmrt_op_copy(dev, &kv, &d->k, err));
        TRY(mmrt_op_copy(dev, &vv, &d->v, err));
        if (c->qk_layernorm) {
            TRY(mmrt_op_layernorm(dev, &q_rows, &L->q_ln_w, &L->q_ln_b, eps, &q_rows, err));
            TRY(mmrt_op_layernorm(dev, &k_rows, &L->k_ln_w, &L->k_ln_b, eps, &k_rows, err));
        }
        TRY(mmrt_op_rope(dev, &d->q, &ctrl->pos, &rope, &d->q, err));
        TRY(mmrt_op_rope(dev, &d->k, &ctrl->pos, &rope, &d->k, err));
        TRY(mmrt_kv_cache_attend(cache, l, &d->q, &d->k, &d->v, &ctrl->slot, &ctrl->cu_q,
                                 &ctrl->kv_len, ap.scale, &d->att, err));
        TRY(mmrt_op_matmul(dev, &att2, &L->dense_w, &L->dense_b, &d->o, err));
        TRY(mmrt_op_add(dev, &d->h, &d->o, &d->h, err));
        TRY(mmrt_op_layernorm(dev, &d->h, &L->ln_post_w, &L->ln_post_b, eps, &d->x, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->up_w, &L->up_b, &d->u, err));
        TRY(mmrt_op_unary(dev, MMRT_OP_RELU2, &d->u, &d->u, err));
        TRY(mmrt_op_matmul(dev, &d->u, &L->down_w, &L->down_b, &d->o, err));
        TRY(mmrt_op_add(dev, &d->h, &d->o, &d->h, err));
    }
    TRY(mmrt_op_layernorm(dev, &d->h, &m->final_w, &m->final_b, eps, &d->x, err));
    TRY(mmrt_op_matmul(dev, &d->x, &m->lm_head, NULL, &d->lg, err));
#undef TRY
    return MMRT_OK;
}

void mmrt_persimmon_decoder_destroy(struct mmrt_persimmon_decoder *d)
{
    if (!d)
        return;
    mmrt_decode_step_destroy(d->step);
    mmrt_scratch_release(&d->s);
    free(d);
}

mmrt_status mmrt_persimmon_decoder_create(struct mmrt_persimmon *m, struct mmrt_kv_cache *cache,
                                          bool use_graph, struct mmrt_persimmon_decoder **out,
                                          struct mmrt_error *err)
{
    *out = NULL;
    const struct mmrt_persimmon_config *c = &m->cfg;
    struct mmrt_persimmon_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "decoder: out of memory");
    d->m = m;
    d->cache = cache;
    mmrt_scratch_init(&d->s, m->dev);
    const int64_t D = c->hidden, H = c->n_heads, hd = c->head_dim;
    mmrt_status st = MMRT_OK;
#define ALLOC(t, nd, ...)                                                                      \
    do {                                                                                       \
        if (st == MMRT_OK)                                                                     \
            st = mmrt_scratch_tensor(&d->s, MMRT_DTYPE_F32, nd,                                \
                                     (const int64_t[]){ __VA_ARGS__ }, &d->t, err);           \
    } while (0)
    ALLOC(h, 2, 1, D);
    ALLOC(x, 2, 1, D);
    ALLOC(qkv, 4, 1, H, 3, hd);
    ALLOC(q, 3, 1, H, hd);
    ALLOC(k, 3, 1, H, hd);
    ALLOC(v, 3, 1, H, hd);
    ALLOC(att, 3, 1, H, hd);
    ALLOC(o, 2, 1, D);
    ALLOC(u, 2, 1, c->intermediate);
    ALLOC(lg, 2, 1, c->vocab);
#undef ALLOC
    if (st == MMRT_OK)
        st = mmrt_decode_step_create(m->dev, cache, 0, c->vocab, &d->lg, issue_step, d,
                                     use_graph, &d->step, err);
    if (st != MMRT_OK) {
        mmrt_persimmon_decoder_destroy(d);
        return mmrt_error_prefix(err, st, "decode buffers");
    }
    *out = d;
    return MMRT_OK;
}

struct mmrt_decode_step *mmrt_persimmon_decoder_step(struct mmrt_persimmon_decoder *d)
{
    return d->step;
}
