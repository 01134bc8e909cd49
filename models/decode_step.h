/*
 * models/decode_step.h — a decoder's one-token step made replayable as a device graph.
 *
 * A graph replays the same arenas, offsets, shapes and params every time, so nothing that
 * changes between steps may be an argument. Everything that does — the token id, the cache
 * slot the new K/V rows go to, the rotary positions and the length of the cache the query
 * sees — lives in one small I32 control block uploaded before each step, and the decoder's
 * step reads it only through these device views:
 *
 *   id     [1]          GET_ROWS of the embedding
 *   slot   [1]          SET_ROWS of K and V into the page store: the row of position n_past
 *   pos    [1] or [1, A] ROPE (A = 1) / ROPE_MULTI positions (n_past + rope_delta, every axis)
 *   cu_q   {0, 1}       ATTENTION_PAGED of the one query over the sequence's page table
 *   kv_len {L}          (itself device data, uploaded when a page is added): keys [0, L),
 *                       L = n_past + 1
 *
 * On a device that captures (CUDA; the CPU plugin with graph = 1) the first step is captured
 * and every step launches the graph; otherwise, or when capture fails (logged once), the
 * step is issued op by op. Either way the same ops run, so the CPU golden tests prove the
 * step the GPU replays.
 */
#ifndef MMRT_MODELS_DECODE_STEP_H
#define MMRT_MODELS_DECODE_STEP_H

#include <stdbool.h>

#include "kv_cache.h"

struct mmrt_decode_ctrl {
    struct mmrt_tensor id, slot, pos, cu_q, kv_len;
};

/* Issues the decoder's ops for one token, writing logits into the decoder's own [1, vocab]
 * device tensor. Must read step-dependent values only through ctrl. */
typedef mmrt_status (*mmrt_decode_issue_fn)(void *decoder, const struct mmrt_decode_ctrl *ctrl,
                                            struct mmrt_error *err);

struct mmrt_decode_step;

/* n_axes: 0 for plain RoPE (pos is [1]), else ROPE_MULTI's axes (pos is [1, n_axes]).
 * logits: the [1, vocab] F32 tensor `issue` writes. dev, cache and the decoder are borrowed
 * until destroy. */
mmrt_status mmrt_decode_step_create(struct mmrt_dev *dev, struct mmrt_kv_cache *cache,
                                    int n_axes, int64_t vocab, const struct mmrt_tensor *logits,
                                    mmrt_decode_issue_fn issue, void *decoder, bool use_graph,
                                    struct mmrt_decode_step **out, struct mmrt_error *err);
/* Appends `token` at cache slot n_past and writes the next logits[vocab] on the host. */
mmrt_status mmrt_decode_step_run(struct mmrt_decode_step *d, int32_t token, float *logits,
                                 struct mmrt_error *err);
/* True once the step runs as a captured graph. */
bool mmrt_decode_step_uses_graph(const struct mmrt_decode_step *d);
void mmrt_decode_step_destroy(struct mmrt_decode_step *d);

#endif
