/* models/image_budget.c — the image-token budget shared by the models (image_budget.h). */
#include "image_budget.h"

#include <stdio.h>

void mmrt_token_budget_init(struct mmrt_token_budget *b, const struct mmrt_model_options *opts)
{
    *b = (struct mmrt_token_budget){
        .tokens = opts && opts->max_image_tokens > 0 ? opts->max_image_tokens : 0,
        .downscale = opts && opts->oversize_images == MMRT_OVERSIZE_DOWNSCALE,
    };
}

bool mmrt_token_budget_exceeded(const struct mmrt_token_budget *b, int64_t tokens)
{
    return b->tokens > 0 && tokens > b->tokens;
}

const char *mmrt_token_budget_describe(const struct mmrt_token_budget *b, char *buf,
                                       size_t size)
{
    snprintf(buf, size, "max_image_tokens = %lld ([model] max_image_tokens)",
             (long long)b->tokens);
    return buf;
}

mmrt_status mmrt_token_budget_refuse(const struct mmrt_token_budget *b, int index, int n,
                                     const char *path, uint32_t w, uint32_t h, uint32_t rw,
                                     uint32_t rh, int64_t tokens, int64_t total,
                                     const char *hint, struct mmrt_error *err)
{
    char budget[160], resized[64] = "", sum[96] = "";
    if (rw)
        snprintf(resized, sizeof resized, ", resized to %u×%u", rw, rh);
    if (total > tokens)
        snprintf(sum, sizeof sum, ", bringing the request to %lld,", (long long)total);
    return mmrt_error_set(err, MMRT_ERR_LIMIT,
                          "image %d of %d (%s, %u×%u%s) needs %lld image tokens%s more than "
                          "%s%s%s", index, n, path, w, h, resized, (long long)tokens,
                          sum[0] ? sum : ",", mmrt_token_budget_describe(b, budget, sizeof budget),
                          hint ? "; " : "", hint ? hint : "");
}

void mmrt_image_scaled_size(uint32_t w, uint32_t h, uint32_t side, uint32_t *out_w,
                            uint32_t *out_h)
{
    const uint64_t lo = w < h ? w : h, hi = w < h ? h : w;
    uint64_t s = (2 * lo * side + hi) / (2 * hi);
    s = s < 1 ? 1 : s;
    *out_w = w >= h ? side : (uint32_t)s;
    *out_h = w >= h ? (uint32_t)s : side;
}

bool mmrt_image_shrink_to_fit(uint32_t w, uint32_t h, int64_t budget, mmrt_image_tokens_fn tokens,
                              const void *ctx, uint32_t *out_w, uint32_t *out_h,
                              int64_t *out_tokens)
{
    const uint32_t longer = w > h ? w : h;
    for (uint32_t side = longer - 1; side >= 1 && side < longer; side--) {
        uint32_t sw, sh;
        mmrt_image_scaled_size(w, h, side, &sw, &sh);
        const int64_t t = tokens(ctx, sw, sh);
        if (t >= 0 && t <= budget) {
            *out_w = sw;
            *out_h = sh;
            *out_tokens = t;
            return true;
        }
    }
    return false;
}
