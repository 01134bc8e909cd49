/* models/decode_step.c — the replayable one-token step (see decode_step.h). */
#include "decode_step.h"

#include <stdlib.h>

#include "log.h"

enum { CTRL_ID = 0, CTRL_SLOT = 1, CTRL_POS = 2 };

struct mmrt_decode_step {
    struct mmrt_dev *dev;
    struct mmrt_kv_cache *cache;
    int64_t vocab;
    const struct mmrt_tensor *logits;
    mmrt_decode_issue_fn issue;
    void *decoder;
    int n_pos;                   /* positions per token */
    int64_t n_ctrl;              /* I32 entries in the control block */
    struct mmrt_dev_tensor ctrl; /* [n_ctrl] I32 */
    struct mmrt_decode_ctrl views;
    int32_t *ctrl_host;          /* [n_ctrl] */
    void *graph;                 /* NULL until captured, or when running eagerly */
    bool try_graph;              /* capture on the next step */
};

static struct mmrt_tensor view(const struct mmrt_tensor *ctrl, int64_t first, int n_dims,
                               const int64_t *ne)
{
    struct mmrt_tensor v;
    mmrt_tensor_init(&v, ctrl->buffer, ctrl->offset + (uint64_t)first * sizeof(int32_t),
                     MMRT_DTYPE_I32, n_dims, ne);
    return v;
}

void mmrt_decode_step_destroy(struct mmrt_decode_step *d)
{
    if (!d)
        return;
    mmrt_dev_graph_destroy(d->dev, d->graph);
    mmrt_dev_tensor_free(d->dev, &d->ctrl);
    free(d->ctrl_host);
    free(d);
}

mmrt_status mmrt_decode_step_create(struct mmrt_dev *dev, struct mmrt_kv_cache *cache,
                                    int n_axes, int64_t vocab, const struct mmrt_tensor *logits,
                                    mmrt_decode_issue_fn issue, void *decoder, bool use_graph,
                                    struct mmrt_decode_step **out, struct mmrt_error *err)
{
    *out = NULL;
    struct mmrt_decode_step *d = calloc(1, sizeof *d);
    if (!d)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "decoder: out of memory");
    *d = (struct mmrt_decode_step){
        .dev = dev, .cache = cache, .vocab = vocab, .logits = logits, .issue = issue,
        .decoder = decoder, .n_pos = n_axes > 0 ? n_axes : 1,
        .try_graph = use_graph && mmrt_dev_can_capture(dev),
    };
    d->n_ctrl = CTRL_POS + d->n_pos + 2 + 1;
    d->ctrl_host = calloc((size_t)d->n_ctrl, sizeof *d->ctrl_host);
    mmrt_status st = d->ctrl_host ? mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_I32, 1,
                                                          (const int64_t[]){ d->n_ctrl },
                                                          &d->ctrl, err)
                                  : mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                                                   "decoder: out of memory");
    if (st != MMRT_OK) {
        mmrt_decode_step_destroy(d);
        return st;
    }
    const struct mmrt_tensor *c = &d->ctrl.t;
    d->views.id = view(c, CTRL_ID, 1, (const int64_t[]){ 1 });
    d->views.slot = view(c, CTRL_SLOT, 1, (const int64_t[]){ 1 });
    d->views.pos = n_axes > 0 ? view(c, CTRL_POS, 2, (const int64_t[]){ 1, n_axes })
                              : view(c, CTRL_POS, 1, (const int64_t[]){ 1 });
    d->views.cu_q = view(c, CTRL_POS + d->n_pos, 1, (const int64_t[]){ 2 });
    d->views.kv_len = view(c, CTRL_POS + d->n_pos + 2, 1, (const int64_t[]){ 1 });
    *out = d;
    return MMRT_OK;
}

bool mmrt_decode_step_uses_graph(const struct mmrt_decode_step *d)
{
    return d->graph != NULL;
}

/* Records the step once. A failure is not an error of the request: the step runs eagerly
 * from then on, and the reason is logged once. */
static void capture(struct mmrt_decode_step *d)
{
    struct mmrt_error cerr = { 0 };
    d->try_graph = false;
    mmrt_status st = mmrt_dev_capture_begin(d->dev, &cerr);
    if (st == MMRT_ERR_UNSUPPORTED) {
        mmrt_log(MMRT_LOG_DEBUG, "decoder", "decode step runs eagerly: %s", cerr.msg);
        return;
    }
    if (st == MMRT_OK) {
        struct mmrt_error ierr = { 0 };
        mmrt_status ist = d->issue(d->decoder, &d->views, &ierr);
        st = mmrt_dev_capture_end(d->dev, &d->graph, &cerr);
        if (ist != MMRT_OK) {
            mmrt_dev_graph_destroy(d->dev, d->graph);
            st = ist;
            cerr = ierr;
        }
    }
    if (st != MMRT_OK) {
        d->graph = NULL;
        mmrt_log(MMRT_LOG_WARN, "decoder",
                 "device %s: decode-step graph capture failed, running eagerly: %s",
                 d->dev->name, cerr.msg);
        return;
    }
    mmrt_log(MMRT_LOG_DEBUG, "decoder", "device %s: decode step captured as a graph",
             d->dev->name);
}

mmrt_status mmrt_decode_step_run(struct mmrt_decode_step *d, int32_t token, float *logits,
                                 struct mmrt_error *err)
{
    struct mmrt_kv_cache *cache = d->cache;
    const int64_t n_past = cache->n_past;
    if (token < 0 || token >= d->vocab)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "decoder: token id %d is outside the vocabulary (%lld)", token,
                              (long long)d->vocab);
    /* A new page, when this position starts one, goes into the page table before the step
     * (a device tensor the step reads, like the control block). */
    mmrt_status st = mmrt_kv_cache_reserve(cache, n_past + 1, err);
    if (st != MMRT_OK)
        return st;
    int32_t *cb = d->ctrl_host;
    cb[CTRL_ID] = token;
    mmrt_kv_cache_rows(cache, n_past, 1, &cb[CTRL_SLOT]);
    for (int a = 0; a < d->n_pos; a++)
        cb[CTRL_POS + a] = (int32_t)(n_past + cache->rope_delta);
    int32_t *cq = cb + CTRL_POS + d->n_pos;
    cq[0] = 0, cq[1] = 1;
    cq[2] = (int32_t)(n_past + 1);
    st = mmrt_dev_upload(d->dev, &d->ctrl.t, cb,
                                     (uint64_t)d->n_ctrl * sizeof(int32_t), err);
    if (st != MMRT_OK)
        return st;
    if (d->try_graph)
        capture(d);
    st = d->graph ? mmrt_dev_graph_launch(d->dev, d->graph, err)
                  : d->issue(d->decoder, &d->views, err);
    if (st == MMRT_OK)
        st = mmrt_dev_download(d->dev, d->logits, logits, (uint64_t)d->vocab * sizeof(float),
                               err);
    if (st == MMRT_OK)
        cache->n_past = n_past + 1;
    return st;
}
