/*
 * core/engine.h — the one generation engine: every model's language stage runs here.
 *
 * A model hands the engine a prepared prompt (model.h prepare(): ids, image splices,
 * positions) and its decoder (decoder.h); the engine owns everything else: the sequences and
 * their KV pages, prefill, batched decode, sampling, stop conditions, streaming and results.
 *
 * Iteration-level scheduling (specs/engine.md, docs/ENGINE.md). Each mmrt_engine_step():
 *   1. admits waiting requests in arrival order while fewer than max_batch run and the KV
 *      store has pages for the whole prompt (taken at admission, so a prefill never stalls);
 *   2. gives every decoding sequence a page for its next position; when none is free the
 *      youngest running sequence is preempted: its pages return to the store and it waits
 *      again at its old place in line, to be recomputed on resume;
 *   3. runs one decode forward over all decoding sequences (M = B rows, one token each),
 *      with draft_tokens on also one row per token guessed from the sequence itself, while
 *      the step has at most draft_rows rows (docs/ENGINE.md "Drafts"): each is a decode row
 *      of its own (one query, the sequence's pages), and the sequence takes each guess its
 *      sampler picks anyway, so its tokens and logits are what it gives without drafts;
 *   4. runs prefill chunks of prefill_chunk tokens, while step_tokens lasts.
 * So a new request joins between two decode steps and a long prompt never stalls the
 * others for more than one chunk.
 *
 * Batch invariance: a request's logits are bit-identical whatever else runs with it. The
 * engine keeps to what the kernels promise (plugin.h: a MATMUL row's arithmetic may depend on
 * whether M ≤ MMRT_SMALL_M and on nothing else; attention depends on the sequence's own
 * query count and keys): decode rows and prefill rows never share a forward; chunk
 * boundaries are multiples of prefill_chunk from position 0, so a prompt is cut the same way
 * alone or in company; prefill chunks of at most MMRT_SMALL_M rows run alone; a preempted
 * sequence recomputes its prompt in the same chunks and replays its generated tokens as
 * decode rows, so its K/V are the bits it had before.
 *
 * Prefix reuse (docs/ENGINE.md "Prefix reuse"): the K/V of a prompt's first b positions,
 * b a multiple of prefill_chunk and of the page size, are kept in the page store after the
 * sequence that computed them, keyed by SHA-256 over what determines them (the token ids,
 * the image feature rows spliced in, the rotary positions); a later prompt that starts the
 * same way shares those pages and prefills from b. Those K/V are the bits the later prompt
 * would compute itself: the same rows, cut into the same chunks from position 0, whose
 * queries attend only keys inside the prefix.
 *
 * Image-token KV compression (kv_compress.h): with opts.image_kv on, a sequence's image rows
 * are compacted right after its prompt's last prefill chunk. From then on its cache holds
 * fewer rows than its slots: `dropped` of them are gone, so slot n (its rotary position is
 * still n's) is cache row n − dropped, and attention sees n + 1 − dropped keys.
 *
 * Threads: the engine is driven by one thread at a time (its caller's); token callbacks run
 * on that thread, inside mmrt_engine_step(). mmrt_engine_cancel() is safe from any thread.
 */
#ifndef MMRT_CORE_ENGINE_H
#define MMRT_CORE_ENGINE_H

#include <stdbool.h>

#include "decoder.h"
#include "kv_compress.h"
#include "model.h"

/* Rows up to which a decode forward is guaranteed the kernels' small-M path (plugin.h
 * MMRT_OP_MATMUL: the one place a row's arithmetic may depend on M), and so the most
 * sequences that decode together. */
#define MMRT_SMALL_M 32

#define MMRT_ENGINE_DEFAULT_BATCH 16
/* [scheduler] vision_batch when not set: the waiting requests the runtime's worker starts per
 * step, their vision stages together (docs/ENGINE.md "The vision stage"). One: on the CPU
 * plugin, shared passes of a 7B-class tower measured a few per cent slower than one pass per
 * image (docs/BENCHMARKS.md), and the first request of a burst would wait for the whole
 * batch; a deployment whose measurement says otherwise (a GPU, a small tower) sets it. */
#define MMRT_DEFAULT_VISION_BATCH 1
#define MMRT_ENGINE_DEFAULT_CHUNK 512
#define MMRT_ENGINE_DEFAULT_PREFIXES 256

struct mmrt_engine_options {
    int max_batch;          /* sequences running at once, 1 … MMRT_SMALL_M; 0 = 16 */
    int64_t prefill_chunk;  /* prompt tokens per prefill chunk, ≥ 1; 0 = 512 */
    int64_t step_tokens;    /* token rows one step runs (decode rows + prefill rows); at least
                               one chunk always runs; 0 = prefill_chunk + max_batch */
    bool use_graph;         /* decode steps as captured device graphs where the device can */
    int prefix_entries;     /* prompt prefixes whose K/V pages are kept for reuse (LRU; their
                               pages also go, oldest first, whenever a request needs them):
                               0 = MMRT_ENGINE_DEFAULT_PREFIXES, < 0 = no reuse */
    /* Image-token KV compression after each prefill (kv_compress.h); keep 0 = off. */
    struct mmrt_kv_compress_opts image_kv;
    /* Speculative decoding with drafts looked up in the sequence itself (docs/ENGINE.md
     * "Drafts"): up to draft_tokens tokens per sequence and step, 0 … MMRT_SMALL_M − 1
     * (0 = off), while the decode step has at most draft_rows rows, 2 … MMRT_SMALL_M
     * (0: mmrt_engine_draft_rows). A request's prediction is drafted from whatever
     * draft_tokens says (MMRT_ENGINE_PREDICTION_DRAFTS when it is 0). */
    int draft_tokens;
    int draft_rows;
};

/* Tokens a request's prediction (mmrt_request.prediction) drafts a step when draft_tokens
 * is 0: three more rows cost about what one does in a decode step bound by reading the
 * weights (docs/BENCHMARKS.md "Drafts"). */
#define MMRT_ENGINE_PREDICTION_DRAFTS 3

/* draft_rows as the engine resolves it (0: one more than the tokens drafted a step). */
static inline int mmrt_engine_draft_rows(int draft_tokens, int draft_rows)
{
    return draft_rows ? draft_rows
                      : (draft_tokens > 0 ? draft_tokens : MMRT_ENGINE_PREDICTION_DRAFTS) + 1;
}

/* Counters since creation, for mmrt-bench and the tests. */
struct mmrt_engine_stats {
    uint64_t steps, decode_forwards, prefill_forwards;
    uint64_t decode_rows, prefill_rows; /* token rows run */
    uint64_t replay_rows;               /* decode rows that recomputed a preempted sequence */
    uint64_t preemptions;
    int max_running;                    /* most sequences running in one step */
    int waiting, running;               /* now: queued for admission, prefilling/decoding */
    uint64_t prefix_hits;               /* admissions that shared a cached prefix */
    uint64_t prefix_reused_tokens;      /* prompt positions those shared (not prefilled) */
    uint64_t prompt_hits;               /* of those, whole prompts: nothing prefilled */
    uint64_t prefix_evictions;          /* cached prefixes dropped (LRU or for pages) */
    int prefix_entries;                 /* now: cached prefixes */
    int64_t prefix_pages;               /* now: pages the cached prefixes hold */
    uint64_t image_kv_compressions;     /* sequences whose image K/V were compressed */
    uint64_t image_kv_dropped_tokens;   /* image rows those gave up (per layer and head) */
    uint64_t draft_rows;                /* decode rows that checked a drafted token */
    uint64_t draft_accepted;            /* of those, drafts the sequence took */
};

struct mmrt_engine;
struct mmrt_seq;

/* The engine borrows lang (its decoder, tokenizer and eos ids) until destroy. */
mmrt_status mmrt_engine_create(const struct mmrt_language *lang,
                               const struct mmrt_engine_options *opts, struct mmrt_engine **out,
                               struct mmrt_error *err);
/* Every sequence must have been released first. NULL is a no-op. */
void mmrt_engine_destroy(struct mmrt_engine *e);

/* One request for the engine. prompt and vision move into the engine (zeroed in the caller)
 * whether or not the submission succeeds. req is copied (its strings are not used; its
 * logit_bias is copied); trace, the callbacks, user and result are borrowed until the
 * sequence is released. */
struct mmrt_engine_request {
    const struct mmrt_request *req;       /* sampling settings, max_tokens */
    struct mmrt_prompt *prompt;
    struct mmrt_vision_output *vision;    /* features the prompt's splices read */
    /* The compiled schema of a JSON answer (req->response_format json_object or
     * json_schema; core/schema_cache.h): the sequence takes a hold of its own. */
    struct mmrt_json_schema *schema;
    const struct mmrt_model_trace *trace; /* may be NULL */
    mmrt_token_fn on_token;               /* may be NULL */
    mmrt_logprobs_fn on_logprobs;         /* may be NULL; called when req->logprobs */
    void *user;
    struct mmrt_result *result;           /* filled when the sequence finishes */
};

/* Checks the request (max_tokens ≥ 1, a prompt that fits the model's context and the KV
 * store, ids in the vocabulary, splices inside the prompt and the features, sampling
 * settings) and queues it. A refusal is returned here and nothing is queued. */
mmrt_status mmrt_engine_submit(struct mmrt_engine *e, struct mmrt_engine_request *r,
                               struct mmrt_seq **out, struct mmrt_error *err);

/* One iteration (see above). Failures of a forward fail the sequences in it (their results
 * say why) and do not stop the others; the return value is MMRT_OK unless the engine itself
 * cannot go on. */
mmrt_status mmrt_engine_step(struct mmrt_engine *e, struct mmrt_error *err);

/* True when no sequence waits or runs. */
bool mmrt_engine_idle(const struct mmrt_engine *e);

/* True once s has finished (its result is filled and its pages are back in the store). */
bool mmrt_engine_done(const struct mmrt_seq *s);

/* Asks s to stop: it finishes with MMRT_ERR_CANCELLED at the start of the next step (tokens
 * already streamed stay streamed). Safe from any thread while s is not released. */
void mmrt_engine_cancel(struct mmrt_seq *s);

/* Frees a sequence; one still running is cancelled and finished first. NULL is a no-op. */
void mmrt_engine_release(struct mmrt_seq *s);

/* Writes a result's status and its detail (nothing when st is MMRT_OK): whole in `message`,
 * cut to fit in the first layout's `error`. */
void mmrt_result_set_status(struct mmrt_result *r, mmrt_status st, const char *msg);

void mmrt_engine_get_stats(const struct mmrt_engine *e, struct mmrt_engine_stats *out);

#endif
