/*
 * core/sampler.h — picks the next token from a logits row on the host.
 *
 * temperature 0 is greedy (the first largest logit, as torch.argmax). Otherwise the order is
 * Hugging Face's logits processors: divide by temperature, keep the top_k largest (0 = all),
 * keep the smallest set whose probability reaches top_p (1 = all; the most likely token is
 * always kept), then draw from the softmax with a seeded xoshiro256** generator, so one seed
 * gives one answer on every machine.
 *
 * Penalties come first, on a copy of the row, as vLLM applies them (and Hugging Face's
 * RepetitionPenaltyLogitsProcessor for the first): repetition_penalty r ≠ 1 divides a
 * positive logit by r and multiplies a negative one by r, once for every token id that
 * appears in the prompt or the answer so far; then presence_penalty is subtracted once from
 * every id the answer holds and frequency_penalty once per time it holds it (OpenAI's
 * definitions). Greedy decoding takes the largest penalised logit.
 *
 * "Largest" is the order (logit descending, id ascending), so ties are cut the same way
 * everywhere. Neither cut sorts the vocabulary: each is a selection in expected O(vocab) (a
 * full sort of Qwen2-VL's 151,936 logits cost more per token than a small batch's decode
 * step), and the draw walks the kept tokens in the order the selection left them in.
 */
#ifndef MMRT_CORE_SAMPLER_H
#define MMRT_CORE_SAMPLER_H

#include <stdint.h>

#include "error.h"
#include "mmrt/mmrt.h"

struct mmrt_sampler_cand {
    float logit;   /* as the model gave it; the temperature is applied to differences */
    int32_t id;
    float p;       /* exp((logit − the largest logit) / temperature): its unnormalised
                      probability */
};

/* A request's sampling settings (mmrt.h struct mmrt_request has the same members). */
struct mmrt_sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    uint64_t seed;
    float repetition_penalty; /* 0 or 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    const struct mmrt_logit_bias *logit_bias; /* [n_logit_bias], copied by init */
    int n_logit_bias;
};

struct mmrt_sampler {
    float temperature;
    int top_k;
    float top_p;
    float repetition, presence, frequency; /* repetition 1 = off */
    uint64_t s[4];      /* generator state */
    int64_t vocab;
    struct mmrt_sampler_cand *cands; /* [vocab] work space, owned (NULL when greedy) */
    float *penalised;                /* [vocab] the row with penalties and biases (NULL
                                        without any) */
    struct mmrt_logit_bias *bias;    /* [n_bias] owned */
    int n_bias;
};

/* Checks the settings (temperature finite in [0, 100], top_k ≥ 0, top_p in (0, 1],
 * repetition_penalty 0 or in (0, 100], presence and frequency penalties in [−2, 2], at most
 * MMRT_MAX_LOGIT_BIAS biases in [−100, 100] on ids below vocab; the message names the field)
 * and reserves work space for `vocab` logits. */
mmrt_status mmrt_sampler_init(struct mmrt_sampler *s, int64_t vocab,
                              const struct mmrt_sampling *cfg, struct mmrt_error *err);
void mmrt_sampler_deinit(struct mmrt_sampler *s);

/* The next token for logits[vocab], after tokens[n_tokens]: the prompt's n_prompt ids, then
 * the answer so far (only penalties read them; ids outside the vocabulary are skipped). A
 * row with no finite logit is MMRT_ERR_INTERNAL. */
mmrt_status mmrt_sampler_next(struct mmrt_sampler *s, const float *logits,
                              const int32_t *tokens, int64_t n_prompt, int64_t n_tokens,
                              int32_t *token, struct mmrt_error *err);

/* Log-softmax of logits[vocab] (as the model gave them): *lp for `id`, and the k (≤
 * MMRT_MAX_TOP_LOGPROBS) most likely ids with theirs in top[0 … k) in the sampler's order
 * (logit descending, id ascending; fewer when fewer logits are finite). A non-finite logit
 * has −INFINITY. Sets *n_top. A row with no finite logit is MMRT_ERR_INTERNAL. text members
 * are left NULL. */
mmrt_status mmrt_sampler_logprobs(const float *logits, int64_t vocab, int32_t id, int k,
                                  float *lp, struct mmrt_logprob *top, int *n_top,
                                  struct mmrt_error *err);

#endif
