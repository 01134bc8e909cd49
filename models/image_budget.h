/*
 * models/image_budget.h — the image-token budget of one request ([model] max_image_tokens
 * and oversize_images, struct mmrt_model_options in core/model.h), as every model's vision
 * stage applies it: after decoding, before any resampling or tower work.
 *
 * Image tokens are the prompt positions an image occupies (core/model.h). Models that also
 * refuse images their context cannot hold (Qwen2-VL, Fuyu) keep that check and its message
 * separately: it always refuses, since an image shrunk to fill the whole context would
 * leave no room for the prompt anyway. Downscaling aims at max_image_tokens only.
 *
 * Downscaling (oversize_images = downscale) means: the image is treated as if the user had
 * sent it smaller — a Pillow-exact resize with the model's own resampling filter to a size
 * with the same aspect ratio (mmrt_image_scaled_size) — and the model's processor then does
 * exactly what it does with any image of that size. Qwen2-VL instead lowers max_pixels for
 * the image, which is the processor's own way of asking for fewer tokens (models/qwen2vl.c).
 */
#ifndef MMRT_MODELS_IMAGE_BUDGET_H
#define MMRT_MODELS_IMAGE_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "model.h"

struct mmrt_token_budget {
    int64_t tokens; /* [model] max_image_tokens; 0 = none */
    bool downscale; /* oversize_images = downscale */
};

/* The budget of a model with options `opts` (NULL = defaults). */
void mmrt_token_budget_init(struct mmrt_token_budget *b, const struct mmrt_model_options *opts);

/* True when `tokens` image tokens are over the budget. */
bool mmrt_token_budget_exceeded(const struct mmrt_token_budget *b, int64_t tokens);

/* "max_image_tokens = N ([model] max_image_tokens)" into buf; returns buf. */
const char *mmrt_token_budget_describe(const struct mmrt_token_budget *b, char *buf,
                                       size_t size);

/*
 * Sets err to MMRT_ERR_LIMIT with the refusal message every model uses:
 *   "image I of N (PATH, W×H[, resized to RW×RH]) needs T image tokens[, bringing the
 *    request to TOTAL,] more than max_image_tokens = B ([model] max_image_tokens)[; HINT]"
 * rw = 0 leaves out the resized size; total ≤ tokens leaves out the request total; hint may
 * be NULL. Returns MMRT_ERR_LIMIT.
 */
mmrt_status mmrt_token_budget_refuse(const struct mmrt_token_budget *b, int index, int n,
                                     const char *path, uint32_t w, uint32_t h, uint32_t rw,
                                     uint32_t rh, int64_t tokens, int64_t total,
                                     const char *hint, struct mmrt_error *err);

/* The size with longer side `side` and the aspect ratio of w × h: the shorter side is
 * round(short · side / long), halves rounded up, at least 1. A square stays square. */
void mmrt_image_scaled_size(uint32_t w, uint32_t h, uint32_t side, uint32_t *out_w,
                            uint32_t *out_h);

/* Image tokens of a width × height image for a model, or −1 when the model cannot take an
 * image of that size. */
typedef int64_t (*mmrt_image_tokens_fn)(const void *ctx, uint32_t width, uint32_t height);

/*
 * The largest downscale of a w × h image that fits `budget`: among the sizes
 * mmrt_image_scaled_size(w, h, side) for side = longer side − 1 down to 1, the first whose
 * tokens(ctx, …) is in [0, budget]. Returns false when none fits (outputs untouched).
 * Linear in the longer side, which the image decoder bounds (32768 by default).
 */
bool mmrt_image_shrink_to_fit(uint32_t w, uint32_t h, int64_t budget, mmrt_image_tokens_fn tokens,
                              const void *ctx, uint32_t *out_w, uint32_t *out_h,
                              int64_t *out_tokens);

#endif /* MMRT_MODELS_IMAGE_BUDGET_H */
