/*
 * core/kv_compress.h — image-token KV compression (docs/ENGINE.md "Image-token KV
 * compression"): after a sequence's prefill, every layer and KV head keeps only a fraction of
 * its image tokens' keys and values, and the pages that frees go back to the store.
 *
 * Image tokens dominate a vision-language prompt and every decode step reads all of their
 * K/V. Which of them can go is an open question (the brief keeps the keys of largest L2
 * norm, Devoto et al. 2024 the smallest, and pruning studies find random selection hard to
 * beat), so the mechanism is one and the policy a setting, chosen by measurement.
 *
 * What holds whatever the policy:
 *   - only the rows of the prompt's patch grids (model.h mmrt_prompt_grid) are candidates;
 *     text rows, and grid rows a stride skips (newline tokens), are always kept;
 *   - every head of every layer keeps the same number of rows, so a sequence still has one
 *     key count, and its later tokens keep their rotary positions (the engine numbers
 *     positions by slot, not by cache row; cached keys were rotated when written);
 *   - kept rows stay in prompt order, and attention over what remains is exact: the cache
 *     holds those rows' bits, moved (GATHER_HEADS with one source is a copy);
 *   - the result depends only on the sequence's own K/V and the settings, never on what else
 *     runs, so a preempted sequence recomputes to the same cache.
 */
#ifndef MMRT_CORE_KV_COMPRESS_H
#define MMRT_CORE_KV_COMPRESS_H

#include "kv_cache.h"
#include "model.h"

/* What MMRT_IMAGE_KV_DEFAULT stands for: the policy docs/BENCHMARKS.md ("Image-token KV
 * compression") measured best on the demo model's held-out answers and the fixtures' next-
 * token agreement. */
#define MMRT_IMAGE_KV_DEFAULT_POLICY MMRT_IMAGE_KV_KEY_NORM_HIGH

struct mmrt_kv_compress_opts {
    double keep;                      /* fraction of image rows kept; ≤ 0 or ≥ 1 = off */
    enum mmrt_image_kv_policy policy; /* DEFAULT = MMRT_IMAGE_KV_DEFAULT_POLICY */
};

/* Whether o compresses at all. */
bool mmrt_kv_compress_on(const struct mmrt_kv_compress_opts *o);

/* The policy's name as the INI spells it ("key_norm_high", …); DEFAULT names the one it
 * stands for. */
const char *mmrt_image_kv_policy_name(enum mmrt_image_kv_policy policy);

/* Rows of an h × w grid that survive: round(keep · h · w) at least 1 for the selecting
 * policies; the pooled grid's cells for POOL2X2 (mmrt_kv_compress_pool_dims). */
int64_t mmrt_kv_compress_grid_kept(const struct mmrt_kv_compress_opts *o, int64_t h, int64_t w);

/* POOL2X2's output grid for an h × w grid: round(h · √keep) × round(w · √keep), each at least
 * 1 (12 × 12 for 24 × 24 at keep 0.25: every 2 × 2 neighbourhood). Output cell (i, j) averages
 * input rows [⌊i·h/oh⌋, ⌈(i+1)·h/oh⌉) × columns [⌊j·w/ow⌋, ⌈(j+1)·w/ow⌉), as PyTorch's
 * adaptive average pooling bins them. */
void mmrt_kv_compress_pool_dims(int64_t h, int64_t w, double keep, int64_t *oh, int64_t *ow);

/* One layer's compaction of a sequence of n_rows cache rows: rows [0, first) stay; row
 * first + d of head h becomes the mean of the rows src[(d · H + h) · G + g] (g < G, −1 =
 * none), d < n_out − first. Every source row of d is ≥ first + d, so the rows can be moved in
 * place, front to back. */
struct mmrt_kv_plan {
    int64_t first, n_rows, n_out;
    int64_t H, G;
    int32_t *src; /* malloc'ed */
};

void mmrt_kv_plan_free(struct mmrt_kv_plan *plan);

/* Plans layer `layer` of a sequence of n_rows rows whose patch grids are grids[n_grids]
 * (in row order, disjoint, inside the rows; the engine checks prompts at submission). first
 * is the page boundary at or below the first patch row (page_tokens P). scores: the key
 * norms of the patches, [Σ h · w][H] in grid and raster order, for the key-norm policies
 * (NULL for the others). The random policy draws from a generator seeded by the layer, head
 * and grid, so a plan is reproducible. A plan that drops nothing has n_out = n_rows. */
mmrt_status mmrt_kv_plan_layer(const struct mmrt_kv_compress_opts *o,
                               const struct mmrt_prompt_grid *grids, int n_grids,
                               int64_t n_rows, int64_t page_tokens, int64_t H, int64_t layer,
                               const float *scores, struct mmrt_kv_plan *plan,
                               struct mmrt_error *err);

/* Compresses sequence c (every layer of its store) whose cache holds the prompt's n_ids rows
 * (c->n_past == prompt->n_ids), in chunks of at most chunk_rows rows of device scratch.
 * Pages the sequence shares (a cached prefix) are copied first, never written. On success
 * *dropped gets the rows removed (c->n_past shrinks by as much and the pages past the new
 * end go back to the store). MMRT_ERR_LIMIT: too few free pages for those copies; nothing
 * changed (the engine frees pages and calls again). Any other failure fails the sequence;
 * *ruined says whether its cache was already being rewritten. */
mmrt_status mmrt_kv_compress(struct mmrt_kv_pages *p, struct mmrt_kv_cache *c,
                             const struct mmrt_prompt *prompt,
                             const struct mmrt_kv_compress_opts *o, int64_t chunk_rows,
                             int64_t *dropped, bool *ruined, struct mmrt_error *err);

#endif
