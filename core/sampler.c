/*
 * core/sampler.c — greedy and temperature / top-k / top-p sampling (see sampler.h).
 * Generator: xoshiro256** seeded through splitmix64 (Blackman and Vigna).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

mmrt_status mmrt_sampler_init(struct mmrt_sampler *s, int64_t vocab, float temperature,
                              int top_k, float top_p, uint64_t seed, struct mmrt_error *err)
{
    memset(s, 0, sizeof *s);
    if (!isfinite(temperature) || temperature < 0 || temperature > 100)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "temperature %g must be a number in [0, 100]", temperature);
    if (top_k < 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "top_k %d must be ≥ 0", top_k);
    if (!(top_p > 0 && top_p <= 1))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "top_p %g must be in (0, 1]", top_p);
    if (vocab < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "vocabulary of %lld", (long long)vocab);
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->vocab = vocab;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s->s[i] = splitmix64(&x);
    if (temperature > 0) {
        s->cands = malloc((size_t)vocab * sizeof *s->cands);
        s->probs = malloc((size_t)vocab * sizeof *s->probs);
        if (!s->cands || !s->probs) {
            mmrt_sampler_deinit(s);
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "sampler: out of memory");
        }
    }
    return MMRT_OK;
}

void mmrt_sampler_deinit(struct mmrt_sampler *s)
{
    free(s->cands);
    free(s->probs);
    s->cands = NULL;
    s->probs = NULL;
}

/* Decreasing logit, then increasing id, so ties are deterministic. */
static int cand_cmp(const void *a, const void *b)
{
    const struct mmrt_sampler_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

mmrt_status mmrt_sampler_next(struct mmrt_sampler *s, const float *logits, int32_t *token,
                              struct mmrt_error *err)
{
    int64_t best = -1;
    for (int64_t i = 0; i < s->vocab; i++)
        if (isfinite(logits[i]) && (best < 0 || logits[i] > logits[best]))
            best = i;
    if (best < 0)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "sampler: no finite logit in the row");
    if (s->temperature == 0) {
        *token = (int32_t)best;
        return MMRT_OK;
    }
    /* Candidates: finite logits, sorted by decreasing logit; cut to top_k. Dividing by a
     * positive temperature keeps the order, so the raw logits are sorted and the division
     * is done on the differences, in double: logit / 1e-45 overflows float (inf - inf made
     * every probability NaN and the draw fell through to the least likely candidate),
     * while (l_i - l_0) / T is at worst -inf in double and exp() of it exactly 0, which is
     * the greedy limit T -> 0 (ties at the top share it, as the limit does). */
    struct mmrt_sampler_cand *c = s->cands;
    int64_t n = 0;
    for (int64_t i = 0; i < s->vocab; i++)
        if (isfinite(logits[i]))
            c[n++] = (struct mmrt_sampler_cand){ logits[i], (int32_t)i };
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    if (s->top_k > 0 && s->top_k < n)
        n = s->top_k;
    double sum = 0;
    const double t = (double)s->temperature;
    for (int64_t i = 0; i < n; i++) {
        s->probs[i] = (float)exp(((double)c[i].logit - (double)c[0].logit) / t);
        sum += s->probs[i];
    }
    /* top_p: keep the shortest prefix whose mass reaches top_p. */
    double cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; i++) {
        cum += s->probs[i] / sum;
        if (cum >= s->top_p) {
            keep = i + 1;
            break;
        }
    }
    double mass = 0;
    for (int64_t i = 0; i < keep; i++)
        mass += s->probs[i];
    double r = (double)(next_u64(s->s) >> 11) * 0x1.0p-53 * mass;
    int64_t pick = keep - 1;
    for (int64_t i = 0; i < keep; i++) {
        r -= s->probs[i];
        if (r < 0) {
            pick = i;
            break;
        }
    }
    *token = c[pick].id;
    return MMRT_OK;
}
