/*
 * core/decoder.h — what a language model's decoder gives the generation engine (engine.h).
 *
 * The engine owns sequences, their KV pages, scheduling, sampling and results; a decoder owns
 * only its weights and the math of one forward over a step's token rows. One forward serves
 * every kind of step: a prefill chunk of one or several sequences, and the batched decode of
 * B sequences with one token each. The rows of all sequences of a step are concatenated
 * (M rows in all), so every weight is applied once to an [M, hidden] activation and attention
 * runs var-length over each sequence's pages (kv_cache.h). There is no second copy of the
 * layer for decode: the replayed device graph of a decode step is this same issue() captured.
 *
 * Everything that changes from step to step reaches issue() as device data in `io` (token
 * rows already embedded, positions, KV rows, page tables, which rows to turn into logits), so
 * a captured step replays with new values uploaded before the launch.
 */
#ifndef MMRT_CORE_DECODER_H
#define MMRT_CORE_DECODER_H

#include "device.h"
#include "kv_cache.h"

/* One forward's inputs and outputs, all on the decoder's device. */
struct mmrt_step_io {
    int64_t M;                /* token rows of the step */
    int64_t B;                /* sequences */
    int64_t n_out;            /* rows whose logits are wanted (≤ M) */
    struct mmrt_tensor h;     /* [M, hidden] F32: the input embeddings; the decoder may
                                 overwrite them (the residual stream) */
    struct mmrt_tensor pos;   /* [M] I32 (plain RoPE) or [M, n_axes] I32 (M-RoPE) */
    struct mmrt_kv_step kv;   /* where the new K/V rows go, what each query sees */
    struct mmrt_tensor out;   /* [n_out] I32: rows of h whose logits are wanted */
    struct mmrt_tensor logits;/* [n_out, vocab] F32 */
};

/* A decoder's activations for steps of up to `rows` rows: F32 tensors [rows, inner…] from one
 * scratch set of the device pool, named by the decoder's own indices. */
#define MMRT_WS_MAX 12
struct mmrt_ws_shape {
    int n_inner;        /* extents after the row dimension, 0 … 3 */
    int64_t inner[3];
};
struct mmrt_decoder_ws {
    struct mmrt_scratch s;
    int n;
    struct mmrt_tensor t[MMRT_WS_MAX];
};

/* The decoder's page store as the [model] KV settings in opts ask (NULL = the defaults):
 * max_kv_tokens, kv_page_tokens, kv_dtype (kv_cache.h mmrt_kv_pages_create). */
struct mmrt_model_options;
mmrt_status mmrt_decoder_kv_create(struct mmrt_dev *dev, int64_t n_layers, int64_t n_kv_heads,
                                   int64_t head_dim, int64_t max_positions,
                                   const struct mmrt_model_options *opts,
                                   struct mmrt_kv_pages *out, struct mmrt_error *err);

/* Allocates n (≤ MMRT_WS_MAX) tensors of `rows` rows with the given inner extents. */
mmrt_status mmrt_decoder_ws_alloc(struct mmrt_dev *dev, int64_t rows,
                                  const struct mmrt_ws_shape *shapes, int n,
                                  struct mmrt_decoder_ws **out, struct mmrt_error *err);
/* Frees ws (NULL is a no-op); its signature fits mmrt_decoder.ws_destroy. */
void mmrt_decoder_ws_free(void *self, struct mmrt_decoder_ws *ws);
/* Rows [0, M) of tensor i. */
struct mmrt_tensor mmrt_decoder_ws_rows(const struct mmrt_decoder_ws *ws, int i, int64_t M);

struct mmrt_decoder {
    void *self;
    struct mmrt_dev *dev;
    struct mmrt_kv_pages *kv;      /* the store every sequence's pages come from */
    const struct mmrt_tensor *embed; /* [vocab, hidden]: GET_ROWS of the token ids */
    int64_t vocab, hidden;
    int64_t max_positions;         /* the model's context */
    int n_axes;                    /* 0: plain RoPE (pos [M]); else pos is [M, n_axes] */
    /* Sliding-window attention of every layer, in positions (a query at p sees p − window <
     * j ≤ p; 0 = none). It needs cache row = position, so the runtime refuses features that
     * move rows (image-token KV compression) with a window (core/runtime.c). */
    int32_t window;
    /* Activations for steps of at most max_rows rows and max_out logits rows, from the
     * device pool; they live until ws_destroy. */
    mmrt_status (*ws_create)(void *self, int64_t max_rows, int64_t max_out,
                             struct mmrt_decoder_ws **out, struct mmrt_error *err);
    void (*ws_destroy)(void *self, struct mmrt_decoder_ws *ws);
    /* Issues the forward: layers over io->h, then the final norm and the LM head over the
     * io->out rows into io->logits. Reads step-dependent values only through io, and takes
     * its buffers from ws (row prefixes when io->M is below what ws was made for). */
    mmrt_status (*issue)(void *self, struct mmrt_decoder_ws *ws, const struct mmrt_step_io *io,
                         struct mmrt_error *err);
};

#endif
