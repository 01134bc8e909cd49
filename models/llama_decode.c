/*
 * models/llama_decode.c — the one-token decode step of the LLaMA-family decoder, on buffers
 * that live for a whole generation, captured once as a device graph and replayed where the
 * device can (see llama.h, mmrt_llama_decoder).
 *
 * A graph replays the same arenas, offsets, shapes and params every time, so nothing that
 * changes between steps may be an argument. Everything that does — the token id, the cache
 * slot the new K/V rows go to, the rotary positions and the length of the cache the query
 * sees — lives in one small I32 control block that is uploaded before each launch:
 *
 *   [0] token id          GET_ROWS of the embedding
 *   [1] cache slot        SET_ROWS of K and V (= n_past)
 *   [2, 2+A) positions    ROPE / ROPE_MULTI, A = max(1, n_mrope_axes)
 *   cu_q = {0, 1, 1}      ATTENTION over the whole cache as two packed sequences: the
 *   cu_k = {0, L, n_ctx}  query sees keys [0, L) (L = n_past + 1); the second sequence holds
 *                         the unused rest of the cache and no query, so it costs nothing
 *
 * The same op sequence runs eagerly on devices without graphs, so the CPU golden tests prove
 * the step that the CUDA plugin captures; the CPU plugin can also capture it (`graph = 1`).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "log.h"
#include "ops.h"

enum { CTRL_ID = 0, CTRL_SLOT = 1, CTRL_POS = 2 };

struct mmrt_llama_decoder {
    struct mmrt_llama *m;
    struct mmrt_kv_cache *cache;
    struct mmrt_scratch s;   /* every buffer of the step, alive until destroy */
    int n_axes;              /* positions per token */
    int64_t n_ctrl;          /* I32 entries in the control block */
    struct mmrt_tensor ctrl; /* [n_ctrl] I32 */
    struct mmrt_tensor id, slot, pos, cu_q, cu_k; /* views into ctrl */
    struct mmrt_tensor h, x, q, k, v, att, o, g, u, lg;
    void *graph;             /* NULL until captured, or when running eagerly */
    bool try_graph;          /* capture on the next step */
    int32_t *ctrl_host;      /* [n_ctrl] */
};

static struct mmrt_tensor ctrl_view(const struct mmrt_tensor *ctrl, int64_t first, int n_dims,
                                    const int64_t *ne)
{
    struct mmrt_tensor v;
    mmrt_tensor_init(&v, ctrl->buffer, ctrl->offset + (uint64_t)first * sizeof(int32_t),
                     MMRT_DTYPE_I32, n_dims, ne);
    return v;
}

void mmrt_llama_decoder_destroy(struct mmrt_llama_decoder *d)
{
    if (!d)
        return;
    mmrt_dev_graph_destroy(d->m->dev, d->graph);
    mmrt_scratch_release(&d->s);
    free(d->ctrl_host);
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
    d->n_axes = c->n_mrope_axes > 0 ? c->n_mrope_axes : 1;
    d->n_ctrl = CTRL_POS + d->n_axes + 3 + 3;
    d->try_graph = use_graph && mmrt_dev_can_capture(m->dev);
    mmrt_scratch_init(&d->s, m->dev);
    d->ctrl_host = calloc((size_t)d->n_ctrl, sizeof *d->ctrl_host);
    mmrt_status st = d->ctrl_host ? MMRT_OK
                                  : mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                                                   "decoder: out of memory");
    const int64_t D = c->hidden, H = c->n_heads, KH = c->n_kv_heads, hd = c->head_dim;
#define NE(...) ((const int64_t[]){ __VA_ARGS__ })
#define ALLOC(t, dtype, nd, ...)                                                               \
    do {                                                                                       \
        if (st == MMRT_OK)                                                                     \
            st = mmrt_scratch_tensor(&d->s, dtype, nd, NE(__VA_ARGS__), &d->t, err);           \
    } while (0)
    ALLOC(ctrl, MMRT_DTYPE_I32, 1, d->n_ctrl);
    ALLOC(h, MMRT_DTYPE_F32, 2, 1, D);
    ALLOC(x, MMRT_DTYPE_F32, 2, 1, D);
    ALLOC(q, MMRT_DTYPE_F32, 3, 1, H, hd);
    ALLOC(k, MMRT_DTYPE_F32, 3, 1, KH, hd);
    ALLOC(v, MMRT_DTYPE_F32, 3, 1, KH, hd);
    ALLOC(att, MMRT_DTYPE_F32, 3, 1, H, hd);
    ALLOC(o, MMRT_DTYPE_F32, 2, 1, D);
    ALLOC(g, MMRT_DTYPE_F32, 2, 1, c->intermediate);
    ALLOC(u, MMRT_DTYPE_F32, 2, 1, c->intermediate);
    ALLOC(lg, MMRT_DTYPE_F32, 2, 1, c->vocab);
#undef ALLOC
    if (st != MMRT_OK) {
        mmrt_llama_decoder_destroy(d);
        return mmrt_error_prefix(err, st, "decode buffers");
    }
    d->id = ctrl_view(&d->ctrl, CTRL_ID, 1, NE(1));
    d->slot = ctrl_view(&d->ctrl, CTRL_SLOT, 1, NE(1));
    if (c->n_mrope_axes > 0)
        d->pos = ctrl_view(&d->ctrl, CTRL_POS, 2, NE(1, d->n_axes));
    else
        d->pos = ctrl_view(&d->ctrl, CTRL_POS, 1, NE(1));
    d->cu_q = ctrl_view(&d->ctrl, CTRL_POS + d->n_axes, 1, NE(3));
    d->cu_k = ctrl_view(&d->ctrl, CTRL_POS + d->n_axes + 3, 1, NE(3));
#undef NE
    *out = d;
    return MMRT_OK;
}

static const struct mmrt_tensor *opt(const struct mmrt_tensor *t)
{
    return t->buffer ? t : NULL;
}

/* The step itself: reads only the control block, so it is the same launch sequence for
 * every token and may be recorded once. */
static mmrt_status issue_step(struct mmrt_llama_decoder *d, struct mmrt_error *err)
{
    struct mmrt_llama *m = d->m;
    const struct mmrt_llama_config *c = &m->cfg;
    struct mmrt_dev *dev = m->dev;
    struct mmrt_kv_cache *cache = d->cache;
    const int64_t H = c->n_heads, KH = c->n_kv_heads, hd = c->head_dim;
    const struct mmrt_rope_params rope = { (float)c->rope_theta, (int32_t)hd, MMRT_ROPE_NEOX };
    struct mmrt_rope_multi_params mrope = {
        .theta = (float)c->rope_theta, .n_rot = (int32_t)hd, .freq_dim = (int32_t)hd,
        .restart = 0, .n_axes = d->n_axes,
    };
    for (int a = 0; a < c->n_mrope_axes && a < MMRT_ROPE_MAX_AXES; a++)
        mrope.sections[a] = c->mrope_section[a];
    const struct mmrt_attention_params ap = { 1.0f / sqrtf((float)hd), 1, 2 };
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
    TRY(mmrt_op_get_rows(dev, &m->embed, &d->id, &d->h, err));
    for (int64_t l = 0; l < c->n_layers; l++) {
        const struct mmrt_llama_layer *L = &m->layers[l];
        TRY(mmrt_op_rmsnorm(dev, &d->h, &L->attn_norm, (float)c->rms_eps, &d->x, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wq, opt(&L->bq), &q2, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wk, opt(&L->bk), &k2, err));
        TRY(mmrt_op_matmul(dev, &d->x, &L->wv, opt(&L->bv), &v2, err));
        if (c->n_mrope_axes > 0) {
            TRY(mmrt_op_rope_multi(dev, &d->q, &d->pos, &mrope, &d->q, err));
            TRY(mmrt_op_rope_multi(dev, &d->k, &d->pos, &mrope, &d->k, err));
        } else {
            TRY(mmrt_op_rope(dev, &d->q, &d->pos, &rope, &d->q, err));
            TRY(mmrt_op_rope(dev, &d->k, &d->pos, &rope, &d->k, err));
        }
        TRY(mmrt_op_set_rows(dev, &d->k, &d->slot, &cache->k[l].t, err));
        TRY(mmrt_op_set_rows(dev, &d->v, &d->slot, &cache->v[l].t, err));
        TRY(mmrt_op_attention(dev, &d->q, &cache->k[l].t, &cache->v[l].t, &d->cu_q, &d->cu_k,
                              &ap, &d->att, err));
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

/* Records the step once. A failure is not an error of the request: the step runs eagerly
 * from then on, and the reason is logged once. */
static void capture(struct mmrt_llama_decoder *d)
{
    struct mmrt_dev *dev = d->m->dev;
    struct mmrt_error cerr = { 0 };
    d->try_graph = false;
    mmrt_status st = mmrt_dev_capture_begin(dev, &cerr);
    if (st == MMRT_ERR_UNSUPPORTED) {
        mmrt_log(MMRT_LOG_DEBUG, "decoder", "decode step runs eagerly: %s", cerr.msg);
        return;
    }
    if (st == MMRT_OK) {
        struct mmrt_error ierr = { 0 };
        mmrt_status ist = issue_step(d, &ierr);
        st = mmrt_dev_capture_end(dev, &d->graph, &cerr);
        if (ist != MMRT_OK) {
            mmrt_dev_graph_destroy(dev, d->graph);
            d->graph = NULL;
            st = ist;
            cerr = ierr;
        }
    }
    if (st != MMRT_OK) {
        d->graph = NULL;
        mmrt_log(MMRT_LOG_WARN, "decoder",
                 "device %s: decode-step graph capture failed, running eagerly: %s", dev->name,
                 cerr.msg);
        return;
    }
    mmrt_log(MMRT_LOG_DEBUG, "decoder", "device %s: decode step captured as a graph",
             dev->name);
}

bool mmrt_llama_decoder_uses_graph(const struct mmrt_llama_decoder *d)
{
    return d->graph != NULL;
}

mmrt_status mmrt_llama_decode(struct mmrt_llama_decoder *d, int32_t token, float *logits,
                              struct mmrt_error *err)
{
    struct mmrt_llama *m = d->m;
    struct mmrt_kv_cache *cache = d->cache;
    const int64_t n_past = cache->n_past;
    if (token < 0 || token >= m->cfg.vocab)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "decoder: token id %d is outside the vocabulary (%lld)", token,
                              (long long)m->cfg.vocab);
    if (n_past + 1 > cache->n_ctx)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "decoder: position %lld does not fit the KV cache of %lld",
                              (long long)n_past, (long long)cache->n_ctx);
    int32_t *cb = d->ctrl_host;
    cb[CTRL_ID] = token;
    cb[CTRL_SLOT] = (int32_t)n_past;
    for (int a = 0; a < d->n_axes; a++)
        cb[CTRL_POS + a] = (int32_t)(n_past + cache->rope_delta);
    int32_t *cq = cb + CTRL_POS + d->n_axes, *ck = cq + 3;
    cq[0] = 0, cq[1] = 1, cq[2] = 1;
    ck[0] = 0, ck[1] = (int32_t)(n_past + 1), ck[2] = (int32_t)cache->n_ctx;
    mmrt_status st = mmrt_dev_upload(m->dev, &d->ctrl, cb,
                                     (uint64_t)d->n_ctrl * sizeof(int32_t), err);
    if (st != MMRT_OK)
        return st;
    if (d->try_graph)
        capture(d);
    st = d->graph ? mmrt_dev_graph_launch(m->dev, d->graph, err) : issue_step(d, err);
    if (st == MMRT_OK)
        st = mmrt_dev_download(m->dev, &d->lg, logits,
                               (uint64_t)m->cfg.vocab * sizeof(float), err);
    if (st == MMRT_OK)
        cache->n_past = n_past + 1;
    return st;
}
