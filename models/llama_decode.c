/*
 * models/llama_decode.c — the LLaMA-family decoder's one-token step on buffers that live for
 * a whole generation, replayable as a device graph (decode_step.h says how).
 */
#include <math.h>
#include <stdlib.h>

#include "decode_step.h"
#include "llama.h"
#include "ops.h"

struct mmrt_llama_decoder {
    struct mmrt_llama *m;
    struct mmrt_kv_cache *cache;
    struct mmrt_scratch s; /* every buffer of the step, alive until destroy */
    struct mmrt_tensor h, x, q, k, v, att, o, g, u, lg;
    struct mmrt_decode_step *step;
};

static const struct mmrt_tensor *opt(const struct mmrt_tensor *t)
{
    return t->buffer ? t : NULL;
}

static mmrt_status issue_step(void *decoder, const struct mmrt_decode_ctrl *ctrl,
                              struct mmrt_error *err)
{
    struct mmrt_llama_decoder *d = decoder;
    struct mmrt_llama *m = d->m;
    const struct mmrt_llama_config *c = &m->cfg;
    struct mmrt_dev *dev = m->dev;
    struct mmrt_kv_cache *cache = d->cache;
    const int64_t H = c->n_heads, KH = c->n_kv_heads, hd = c->head_dim;
    const struct mmrt_rope_params rope = { (float)c->rope_theta, (int32_t)hd, MMRT_ROPE_NEOX };
    struct mmrt_rope_multi_params mrope = {
        .theta = (float)c->rope_theta, .n_rot = (int32_t)hd, .freq_dim = (int32_t)hd,
        .restart = 0, .n_axes = c->n_mrope_axes,
    };
    for (int a = 0; a < c->n_mrope_axes && a < MMRT_ROPE_MAX_AXES; a++)
        mrope.sections[a] = c->mrope_section[a];
    struct mmrt_tensor q2 = mmrt_tensor_reshape(&d->q, 2, (const int64_t[]){ 1, H * hd });
    struct mmrt_tensor k2 = mmrt_tensor_reshape(&d->k, 2, (const int64_t[]){ 1, KH * hd });
    struct mmrt_tensor v2 = mmrt_tensor_reshape(&d->v, 2, (const int64_t[]){ 1, KH * hd });
    struct mmrt_tensor att2 = mmrt_tensor_reshape(&d->att, 2, (const int64_t[]){ 1, H * hd });
    mmrt_status st;
#define TRY(call)                                                                              \
    do {                                                                                       \
        st = (call);                                                                           \
        if (st != MMRT_OK)                                                                     \
            return st;                                                                         \
    } while (0)
    TRY(mmrt_op_get_rows(dev, &m->embed, &ctrl->id, &d->h, err));
    for (int64_t l = 0; l < c->n_layers; l++) {
        const struct mmrt_llama_layer *L = &m->layers[l];
        TRY(mmrt_op_rmsnorm(dev, &d->h, &L->attn_norm, (float)c->rms_eps, &d->x, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wq, opt(&L->bq), &q2, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wk, opt(&L->bk), &k2, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wv, opt(&L->bv), &v2, err));
        if (c->n_mrope_axes > 0) {
            TRY(mmrt_op_rope_multi(dev, &d->q, &ctrl->pos, &mrope, &d->q, err));
            TRY(mmrt_op_rope_multi(dev, &d->k, &ctrl->pos, &mrope, &d->k, err));
        } else {
            TRY(mmrt_op_rope(dev, &d->q, &ctrl->pos, &rope, &d->q, err));
            TRY(mmrt_op_rope(dev, &d->k, &ctrl->pos, &rope, &d->k, err));
        }
        TRY(mmrt_kv_cache_attend(cache, l, &d->q, &d->k, &d->v, &ctrl->slot, &ctrl->cu_q,
                                 &ctrl->kv_len, 0, &d->att, err));
        TRY(mmrt_op_matmul(dev, &att2, &L->wo, opt(&L->bo), &d->o, err));
        TRY(mmrt_op_add(dev, &d->h, &d->o, &d->h, err));
        TRY(mmrt_op_rmsnorm(dev, &d->h, &L->mlp_norm, (float)c->rms_eps, &d->x, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wg, NULL, &d->g, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wu, NULL, &d->u, err));
        TRY(mmrt_op_swiglu(dev, &d->g, &d->u, &d->g, err));
        TRY(mmrt_op_matmul(dev, &d->g, &L->wd, NULL, &d->o, err));
        TRY(mmrt_op_add(dev, &d->h, &d->o, &d->h, err));
    }
    TRY(mmrt_op_rmsnorm(dev, &d->h, &m->norm, (float)c->rms_eps, &d->x, err));
    TRY(mmrt_op_matmul(dev, &d->x, &m->lm_head, NULL, &d->lg, err));
#undef TRY
    return MMRT_OK;
}

void mmrt_llama_decoder_destroy(struct mmrt_llama_decoder *d)
{
    if (!d)
        return;
    mmrt_decode_step_destroy(d->step);
    mmrt_scratch_release(&d->s);
    free(d);
}

mmrt_status mmrt_llama_decoder_create(struct mmrt_llama *m, struct mmrt_kv_cache *cache,
                                      bool use_graph, struct mmrt_llama_decoder **out,
                                      struct mmrt_error *err)
{
    *out = NULL;
    const struct mmrt_llama_config *c = &m->cfg;
    struct mmrt_llama_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "decoder: out of memory");
    d->m = m;
    d->cache = cache;
    mmrt_scratch_init(&d->s, m->dev);
    const int64_t D = c->hidden, H = c->n_heads, KH = c->n_kv_heads, hd = c->head_dim;
    mmrt_status st = MMRT_OK;
#define ALLOC(t, nd, ...)                                                                      \
    do {                                                                                       \
        if (st == MMRT_OK)                                                                     \
            st = mmrt_scratch_tensor(&d->s, MMRT_DTYPE_F32, nd,                                \
                                     (const int64_t[]){ __VA_ARGS__ }, &d->t, err);           \
    } while (0)
    ALLOC(h, 2, 1, D);
    ALLOC(x, 2, 1, D);
    ALLOC(q, 3, 1, H, hd);
    ALLOC(k, 3, 1, KH, hd);
    ALLOC(v, 3, 1, KH, hd);
    ALLOC(att, 3, 1, H, hd);
    ALLOC(o, 2, 1, D);
    ALLOC(g, 2, 1, c->intermediate);
    ALLOC(u, 2, 1, c->intermediate);
    ALLOC(lg, 2, 1, c->vocab);
#undef ALLOC
    if (st == MMRT_OK)
        st = mmrt_decode_step_create(m->dev, cache, c->n_mrope_axes, c->vocab, &d->lg,
                                     issue_step, d, use_graph, &d->step, err);
    if (st != MMRT_OK) {
        mmrt_llama_decoder_destroy(d);
        return mmrt_error_prefix(err, st, "decode buffers");
    }
    *out = d;
    return MMRT_OK;
}

struct mmrt_decode_step *mmrt_llama_decoder_step(struct mmrt_llama_decoder *d)
{
    return d->step;
}
