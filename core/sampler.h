/*
 * core/sampler.h — picks the next token from a logits row on the host.
 *
 * temperature 0 is greedy (the first largest logit, as torch.argmax). Otherwise the order is
 * Hugging Face's logits processors: divide by temperature, keep the top_k largest (0 = all),
 * keep the smallest set whose probability reaches top_p (1 = all; the most likely token is
 * always kept), then draw from the softmax with a seeded xoshiro256** generator, so one seed
 * gives one answer on every machine.
 *
 * "Largest" is the order (logit descending, id ascending), so ties are cut the same way
 * everywhere. Neither cut sorts the vocabulary: each is a selection in expected O(vocab) (a
 * full sort of Qwen2-VL's 151,936 logits cost more per token than a small batch's decode
 * step), and the draw walks the kept tokens in the order the selection left them in.
 */
#ifndef MMRT_CORE_SAMPLER_H
#define MMRT_CORE_SAMPLER_H

#include "error.h"

struct mmrt_sampler_cand {
    float logit;   /* as the model gave it; the temperature is applied to differences */
    int32_t id;
    float p;       /* exp((logit − the largest logit) / temperature): its unnormalised
                      probability */
};

struct mmrt_sampler {
    float temperature;
    int top_k;
    float top_p;
    uint64_t s[4];      /* generator state */
    int64_t vocab;
    struct mmrt_sampler_cand *cands; /* [vocab] work space, owned (NULL when greedy) */
};

/* Checks the settings (temperature finite in [0, 100], top_k ≥ 0, top_p in (0, 1]; the
 * message names the field) and reserves work space for `vocab` logits. */
mmrt_status mmrt_sampler_init(struct mmrt_sampler *s, int64_t vocab, float temperature,
                              int top_k, float top_p, uint64_t seed, struct mmrt_error *err);
void mmrt_sampler_deinit(struct mmrt_sampler *s);

/* The next token for logits[vocab]. A row with no finite logit is MMRT_ERR_INTERNAL. */
mmrt_status mmrt_sampler_next(struct mmrt_sampler *s, const float *logits, int32_t *token,
                              struct mmrt_error *err);

#endif
