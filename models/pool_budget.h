/*
 * models/pool_budget.h — what `pool_mb = auto` reserves: the working pool each stage needs
 * for the largest request the configuration allows, computed from the checkpoint's
 * config.json (and its image processor settings) before any device is opened.
 *
 * Why an estimate from the configuration and not a measured dry run: the pool is reserved
 * up front (core/pool.h) and its size must be known when the device opens; measuring would
 * mean running the largest shapes (a whole-context prefill, the largest image) at start,
 * which on a CPU takes minutes for a 7B model. The activations of a transformer stage are
 * few and regular — a handful of [rows, width] F32 tensors per forward, rows = the tokens
 * or patches of the request — so they are counted here tensor by tensor, each rounded up to
 * the power-of-two block the buddy allocator (level 2) gives it; level 1 never needs more
 * capacity than level 2 for the same calls (core/pool.h, "Why not more"). The count covers
 * the union of what the model code allocates per forward (models/llama.c, persimmon.c,
 * clip.c, llava.c, llava_next.c, qwen2vl_vision.c, fuyu.c). tests/test_memory.c runs the
 * largest request of every fixture under `auto` and holds the measured peak to this
 * estimate, so a model change that allocates more fails there, not in production.
 *
 * What counts as the largest request:
 *   language rows = min(context, KV positions): the longest prompt the KV store admits,
 *                   prefilled in one forward; KV positions = max_kv_tokens, or the context.
 *   vision rows   = LLaVA-1.5: its fixed patches, times vision_batch (the images one pass
 *                   of the tower takes); LLaVA-NeXT: the base tile plus the tiles of its
 *                   largest image_grid_pinpoints entry, times vision_batch (the tower takes
 *                   that many tiles per pass, their requests' features gathered); Qwen2-VL
 *                   (whose shared passes never exceed the largest request's patches): the
 *                   image tokens a
 *                   request may carry, all its images in one forward: min(language rows,
 *                   max_image_tokens, images per request × the processor's max_pixels /
 *                   (patch · merge)²), times merge²;
 *                   Fuyu: the patches of the processor's target size, at most the language
 *                   rows (and max_image_tokens).
 *                   Image tokens are prompt positions, so an image with more tokens than
 *                   the KV store holds can never be answered; with a small max_kv_tokens
 *                   its vision stage may then fail for want of pool (MMRT_ERR_OUT_OF_POOL)
 *                   before the prompt is refused (MMRT_ERR_LIMIT).
 *   KV store      = its 2 · layers tensors packed as mmrt_kv_store_plan packs them.
 * The stages on one device are summed (a batch overlaps the vision stage of one request
 * with the decoding of another), then the pool is that plus 1/8 (fragmentation between
 * requests of different shapes) plus MMRT_POOL_BUDGET_SMALL_MB for the small tensors (page
 * tables, token ids, control blocks).
 */
#ifndef MMRT_MODELS_POOL_BUDGET_H
#define MMRT_MODELS_POOL_BUDGET_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "model.h"

/* Pool of a device that runs no stage (or of any device when no model is configured). */
#define MMRT_POOL_BUDGET_IDLE_MB 16
/* Added to every automatic pool of a device that runs a stage. */
#define MMRT_POOL_BUDGET_SMALL_MB 16

struct mmrt_pool_budget {
    int64_t vision_rows;     /* rows of the vision stage's largest forward (patches) */
    int64_t language_rows;   /* rows of the longest prefill forward (a chunk) */
    int64_t positions;       /* positions one request may fill: the context, at most the
                                KV store (what bounds its image tokens, not the chunk) */
    int64_t kv_tokens;       /* positions of the KV store it was sized for */
    uint64_t kv_bytes;       /* the KV store, as the pool holds it (power-of-two blocks) */
    uint64_t vision_bytes;   /* peak activations of the vision stage (power-of-two blocks) */
    uint64_t language_bytes; /* peak activations of the language stage, KV store excluded */
};

/* Fills *out for a checkpoint of `model_type` in `dir` (config.json already parsed into
 * `config`; the image processor settings are read from dir's preprocessor_config.json or
 * processor_config.json when the model has any, and their defaults are used when `dir` is
 * NULL or has neither). `opts` as for load (NULL = defaults). Statuses: MMRT_ERR_UNSUPPORTED
 * for an unknown model type, and those of the models' config readers (MMRT_ERR_FORMAT naming
 * the file and key). */
mmrt_status mmrt_pool_budget_estimate(const char *model_type, const char *dir,
                                      const json_t *config,
                                      const struct mmrt_model_options *opts,
                                      struct mmrt_pool_budget *out, struct mmrt_error *err);

/* The pool in MiB for a device running the vision stage, the language stage, both or
 * neither, as described at the top of this file. */
uint64_t mmrt_pool_budget_mb(const struct mmrt_pool_budget *b, bool vision, bool language);

#endif
