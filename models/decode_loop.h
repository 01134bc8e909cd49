/*
 * models/decode_loop.h — the token loop every model's generate() shares: sample from the
 * current logits, report the logits to the trace, stream the token's text, stop at an EOS
 * id, at max_tokens or when the callback says so, and otherwise ask the model for the next
 * logits. Models differ only in how a token becomes the next logits (`next`).
 */
#ifndef MMRT_MODELS_DECODE_LOOP_H
#define MMRT_MODELS_DECODE_LOOP_H

#include "decode_step.h"
#include "formats/tokenizer.h"
#include "model.h"
#include "sampler.h"

struct mmrt_decode_loop {
    const struct mmrt_request *req;       /* max_tokens */
    const struct mmrt_model_trace *trace; /* may be NULL */
    mmrt_token_fn on_token;               /* may be NULL */
    void *user;
    const struct mmrt_tokenizer *tok;     /* for the streamed text */
    const int32_t *eos;                   /* ids that end the answer (reported, then stop) */
    int n_eos;
    int64_t vocab;
    struct mmrt_decode_step *step;        /* feeds each token, gives the next logits */
};

/* Runs the loop from the prefill's logits (in logits[vocab], overwritten as it goes). Fills
 * res->n_tokens, decode_ms, decode_tokens_per_s and decode_graph. */
mmrt_status mmrt_decode_loop_run(const struct mmrt_decode_loop *l, struct mmrt_sampler *sampler,
                                 float *logits, struct mmrt_result *res, struct mmrt_error *err);

/* The checks and bookkeeping between building a prompt and prefilling it: the prompt plus
 * max_tokens must fit the model's context (MMRT_ERR_LIMIT naming both), the trace sees the
 * ids, and res->n_prompt_tokens is set. */
mmrt_status mmrt_prompt_accept(const struct mmrt_request *req, const int32_t *ids,
                               int64_t n_ids, int64_t max_positions,
                               const struct mmrt_model_trace *trace, struct mmrt_result *res,
                               struct mmrt_error *err);

/* Monotonic milliseconds, for the per-stage timings of mmrt_result. */
double mmrt_now_ms(void);

#endif
