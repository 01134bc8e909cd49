/* models/decode_loop.c — the shared sample / stream / stop loop (see decode_loop.h). */
#include "decode_loop.h"

#include <string.h>
#include <time.h>

double mmrt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool is_eos(const struct mmrt_decode_loop *l, int32_t id)
{
    for (int i = 0; i < l->n_eos; i++)
        if (l->eos[i] == id)
            return true;
    return false;
}

/* The callback receives NUL-terminated text; a piece longer than the buffer (a pathological
 * tokenizer entry) is cut rather than allocated per token. */
static bool emit(const struct mmrt_decode_loop *l, int32_t id, const char *text, size_t len)
{
    if (!l->on_token)
        return true;
    char buf[1024];
    size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return l->on_token(l->user, id, buf);
}

mmrt_status mmrt_decode_loop_run(const struct mmrt_decode_loop *l, struct mmrt_sampler *sampler,
                                 float *logits, struct mmrt_result *res, struct mmrt_error *err)
{
    const double t0 = mmrt_now_ms();
    struct mmrt_tokenizer_stream *stream = NULL;
    mmrt_status st = mmrt_tokenizer_stream_create(l->tok, MMRT_DECODE_SKIP_SPECIAL, &stream, err);
    for (int step = 0; st == MMRT_OK && step < l->req->max_tokens; step++) {
        if (l->trace && l->trace->logits)
            l->trace->logits(l->trace->user, step, logits, l->vocab);
        int32_t tok;
        st = mmrt_sampler_next(sampler, logits, &tok, err);
        if (st != MMRT_OK)
            break;
        res->n_tokens++;
        const char *piece = "";
        size_t plen = 0;
        st = mmrt_tokenizer_decode_stream(stream, tok, &piece, &plen, err);
        if (st != MMRT_OK)
            break;
        bool go_on = emit(l, tok, piece, plen);
        if (!go_on || is_eos(l, tok) || step + 1 == l->req->max_tokens)
            break;
        st = mmrt_decode_step_run(l->step, tok, logits, err);
    }
    if (st == MMRT_OK) {
        const char *tail = "";
        size_t tlen = 0;
        st = mmrt_tokenizer_stream_finish(stream, &tail, &tlen, err);
        if (st == MMRT_OK && tlen)
            emit(l, -1, tail, tlen);
    }
    mmrt_tokenizer_stream_destroy(stream);
    res->decode_graph = mmrt_decode_step_uses_graph(l->step);
    res->decode_ms = mmrt_now_ms() - t0;
    if (res->n_tokens > 1 && res->decode_ms > 0)
        res->decode_tokens_per_s = (res->n_tokens - 1) / (res->decode_ms / 1e3);
    return st;
}

mmrt_status mmrt_prompt_accept(const struct mmrt_request *req, const int32_t *ids,
                               int64_t n_ids, int64_t max_positions,
                               const struct mmrt_model_trace *trace, struct mmrt_result *res,
                               struct mmrt_error *err)
{
    if (n_ids + req->max_tokens > max_positions)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "prompt of %lld tokens plus %d new tokens exceeds the model's "
                              "context of %lld positions",
                              (long long)n_ids, req->max_tokens, (long long)max_positions);
    if (trace && trace->prompt_ids)
        trace->prompt_ids(trace->user, ids, (int)n_ids);
    res->n_prompt_tokens = (int)n_ids;
    return MMRT_OK;
}
