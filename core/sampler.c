/*
 * core/sampler.c — greedy and temperature / top-k / top-p sampling (see sampler.h).
 * Generator: xoshiro256** seeded through splitmix64 (Blackman and Vigna).
 */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
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

mmrt_status mmrt_sampler_init(struct mmrt_sampler *s, int64_t vocab,
                              const struct mmrt_sampling *cfg, struct mmrt_error *err)
{
    memset(s, 0, sizeof *s);
    const float temperature = cfg->temperature, rep = cfg->repetition_penalty;
    if (!isfinite(temperature) || temperature < 0 || temperature > 100)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "temperature %g must be a number in [0, 100]", temperature);
    if (cfg->top_k < 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "top_k %d must be ≥ 0", cfg->top_k);
    if (!(cfg->top_p > 0 && cfg->top_p <= 1))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "top_p %g must be in (0, 1]",
                              cfg->top_p);
    if (!(rep >= 0 && rep <= 100))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "repetition_penalty %g must be in "
                              "(0, 100] (0 or 1: off)", rep);
    if (!(cfg->presence_penalty >= -2 && cfg->presence_penalty <= 2))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "presence_penalty %g must be in "
                              "[-2, 2]", cfg->presence_penalty);
    if (!(cfg->frequency_penalty >= -2 && cfg->frequency_penalty <= 2))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "frequency_penalty %g must be in "
                              "[-2, 2]", cfg->frequency_penalty);
    if (vocab < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "vocabulary of %lld", (long long)vocab);
    if (cfg->n_logit_bias < 0 || cfg->n_logit_bias > MMRT_MAX_LOGIT_BIAS ||
        (cfg->n_logit_bias > 0 && !cfg->logit_bias))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "logit_bias: %d entries; at most %d",
                              cfg->n_logit_bias, MMRT_MAX_LOGIT_BIAS);
    for (int i = 0; i < cfg->n_logit_bias; i++) {
        const struct mmrt_logit_bias *b = &cfg->logit_bias[i];
        if (b->token_id < 0 || b->token_id >= vocab)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "logit_bias[%d]: token %d is not "
                                  "in the model's vocabulary of %lld", i, (int)b->token_id,
                                  (long long)vocab);
        if (!(b->bias >= -100 && b->bias <= 100))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "logit_bias[%d]: bias %g must be "
                                  "in [-100, 100]", i, (double)b->bias);
    }
    s->temperature = temperature;
    s->top_k = cfg->top_k;
    s->top_p = cfg->top_p;
    s->repetition = rep == 0 ? 1.0f : rep;
    s->presence = cfg->presence_penalty;
    s->frequency = cfg->frequency_penalty;
    s->vocab = vocab;
    uint64_t x = cfg->seed;
    for (int i = 0; i < 4; i++)
        s->s[i] = splitmix64(&x);
    const bool penalties = s->repetition != 1 || s->presence != 0 || s->frequency != 0 ||
                           cfg->n_logit_bias > 0;
    if ((temperature > 0 && !(s->cands = malloc((size_t)vocab * sizeof *s->cands))) ||
        (penalties && !(s->penalised = malloc((size_t)vocab * sizeof *s->penalised))) ||
        (cfg->n_logit_bias > 0 &&
         !(s->bias = malloc((size_t)cfg->n_logit_bias * sizeof *s->bias)))) {
        mmrt_sampler_deinit(s);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "sampler: out of memory");
    }
    if (cfg->n_logit_bias > 0)
        memcpy(s->bias, cfg->logit_bias, (size_t)cfg->n_logit_bias * sizeof *s->bias);
    s->n_bias = cfg->n_logit_bias;
    return MMRT_OK;
}

void mmrt_sampler_deinit(struct mmrt_sampler *s)
{
    free(s->cands);
    free(s->penalised);
    free(s->bias);
    s->cands = NULL;
    s->penalised = NULL;
    s->bias = NULL;
    s->n_bias = 0;
}

/* Hugging Face's repetition penalty of one logit: towards zero on both sides. */
static inline float repeated(float logit, float r)
{
    return logit > 0 ? logit / r : logit * r;
}

/* s->penalised = logits with the penalties of sampler.h, then the logit biases. Each step recomputes from the
 * model's row, so an id met twice in the prompt is penalised once (the assignment repeats),
 * and the frequency term accumulates once per occurrence in the answer. */
static const float *penalise(struct mmrt_sampler *s, const float *logits,
                             const int32_t *tokens, int64_t n_prompt, int64_t n_tokens)
{
    float *p = s->penalised;
    memcpy(p, logits, (size_t)s->vocab * sizeof *p);
    const float r = s->repetition;
    for (int64_t i = 0; r != 1 && i < n_tokens; i++) {
        const int32_t t = tokens[i];
        if (t >= 0 && t < s->vocab)
            p[t] = repeated(logits[t], r);
    }
    /* The answer's ids: presence sets (idempotent) from the repetition-penalised value, then
     * frequency subtracts per occurrence. */
    for (int64_t i = n_prompt; s->presence != 0 && i < n_tokens; i++) {
        const int32_t t = tokens[i];
        if (t >= 0 && t < s->vocab)
            p[t] = repeated(logits[t], r) - s->presence;
    }
    for (int64_t i = n_prompt; s->frequency != 0 && i < n_tokens; i++) {
        const int32_t t = tokens[i];
        if (t >= 0 && t < s->vocab)
            p[t] -= s->frequency;
    }
    for (int i = 0; i < s->n_bias; i++) /* ids were checked against vocab by init */
        p[s->bias[i].token_id] += s->bias[i].bias;
    return p;
}

/* The sampler's order: larger logit first, then smaller id, so ties are deterministic. */
static inline bool before(const struct mmrt_sampler_cand *a, const struct mmrt_sampler_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *a, const void *b)
{
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

static inline void swap(struct mmrt_sampler_cand *c, int64_t i, int64_t j)
{
    const struct mmrt_sampler_cand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* Ranges this short are sorted rather than partitioned. */
#define SMALL_RANGE 32
/* Partitions after which a selection sorts what is left: a median-of-three pivot halves a
 * range in expectation, so only an adversarial row gets here, and it then costs a sort. */
#define MAX_PARTITIONS 64

/* Partitions c[lo, hi) (hi − lo ≥ 3) around the median of its first, middle and last
 * candidates: returns m with c[lo, m) before c[m] and c[m + 1, hi) after it. */
static int64_t partition(struct mmrt_sampler_cand *c, int64_t lo, int64_t hi)
{
    const int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (before(&c[mid], &c[lo]))
        swap(c, mid, lo);
    if (before(&c[last], &c[lo]))
        swap(c, last, lo);
    if (before(&c[last], &c[mid]))
        swap(c, last, mid);
    swap(c, mid, last);
    int64_t m = lo;
    for (int64_t i = lo; i < last; i++)
        if (before(&c[i], &c[last]))
            swap(c, i, m++);
    swap(c, m, last);
    return m;
}

/* Moves the first k candidates of c[0, n) in the sampler's order (0 < k < n) to c[0, k),
 * in no particular order. Invariant: c[0, lo) precede c[lo, hi), which precede c[hi, n),
 * and lo ≤ k ≤ hi. */
static void select_first(struct mmrt_sampler_cand *c, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n;
    for (int round = 0; hi - lo > SMALL_RANGE && round < MAX_PARTITIONS; round++) {
        const int64_t m = partition(c, lo, hi);
        if (m == k || m + 1 == k)
            return;
        if (m > k)
            hi = m;
        else
            lo = m + 1;
    }
    qsort(c + lo, (size_t)(hi - lo), sizeof *c, cand_cmp);
}

/* The length of the shortest prefix of c[0, n) in the sampler's order whose p add up to
 * `need`, moved to c[0, length) in no particular order; n when rounding leaves even the
 * whole row short of it. Same invariant as select_first, with `need` what c[lo, hi) must
 * still supply. */
static int64_t select_mass(struct mmrt_sampler_cand *c, int64_t n, double need)
{
    int64_t lo = 0, hi = n;
    for (int round = 0; hi - lo > SMALL_RANGE && round < MAX_PARTITIONS; round++) {
        const int64_t m = partition(c, lo, hi);
        double ahead = 0;
        for (int64_t i = lo; i < m; i++)
            ahead += c[i].p;
        if (ahead >= need) {
            hi = m;
            continue;
        }
        need -= ahead;
        if ((double)c[m].p >= need)
            return m + 1;
        need -= c[m].p;
        lo = m + 1;
    }
    qsort(c + lo, (size_t)(hi - lo), sizeof *c, cand_cmp);
    for (int64_t i = lo; i < hi; i++) {
        if ((double)c[i].p >= need)
            return i + 1;
        need -= c[i].p;
    }
    return hi; /* rounding: c[lo, hi) was found to reach it summed in another order */
}

mmrt_status mmrt_sampler_next(struct mmrt_sampler *s, const float *logits,
                              const int32_t *tokens, int64_t n_prompt, int64_t n_tokens,
                              int32_t *token, struct mmrt_error *err)
{
    if (s->penalised)
        logits = penalise(s, logits, tokens, n_prompt < 0 ? 0 : n_prompt, n_tokens);
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
    /* Candidates: the finite logits, cut to the top_k first. Dividing by a positive
     * temperature keeps the order, so the division is done on differences from the largest
     * logit, in double: logit / 1e-45 overflows float (inf − inf made every probability NaN
     * and the draw fell through to the least likely candidate), while (l_i − l_0) / T is at
     * worst −inf in double and its probability exactly 0, which is the greedy limit T → 0
     * (ties at the top share it, as the limit does). */
    struct mmrt_sampler_cand *c = s->cands;
    int64_t n = 0;
    for (int64_t i = 0; i < s->vocab; i++)
        if (isfinite(logits[i]))
            c[n++] = (struct mmrt_sampler_cand){ .logit = logits[i], .id = (int32_t)i };
    if (s->top_k > 0 && s->top_k < n) {
        select_first(c, n, s->top_k);
        n = s->top_k;
    }
    const double top = (double)logits[best], t = (double)s->temperature;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = ((double)c[i].logit - top) / t;
        /* Below −104 the float exp is 0 (as it is for −inf): the call is skipped, not the
         * token. expf rather than exp: half the time, and a probability is a float anyway. */
        c[i].p = d < -104.0 ? 0.0f : expf((float)d);
        sum += c[i].p;
    }
    /* top_p: the shortest run of first candidates whose probability reaches top_p. */
    int64_t keep = n;
    double mass = sum;
    if (s->top_p < 1) {
        keep = select_mass(c, n, (double)s->top_p * sum);
        mass = 0;
        for (int64_t i = 0; i < keep; i++)
            mass += c[i].p;
    }
    double r = (double)(next_u64(s->s) >> 11) * 0x1.0p-53 * mass;
    int64_t pick = -1, last = 0;
    for (int64_t i = 0; i < keep; i++) {
        if (c[i].p > 0)
            last = i;
        r -= c[i].p;
        if (r < 0) {
            pick = i;
            break;
        }
    }
    *token = c[pick >= 0 ? pick : last].id; /* rounding left r ≥ 0: the last likely one */
    return MMRT_OK;
}

/* Whether (la, a) comes before (lb, b) in the sampler's order. */
static inline bool ahead(float la, int32_t a, float lb, int32_t b)
{
    return la > lb || (la == lb && a < b);
}

mmrt_status mmrt_sampler_logprobs(const float *logits, int64_t vocab, int32_t id, int k,
                                  float *lp, struct mmrt_logprob *top, int *n_top,
                                  struct mmrt_error *err)
{
    *n_top = 0;
    if (k < 0 || k > MMRT_MAX_TOP_LOGPROBS)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "top_logprobs %d must be 0 … %d", k,
                              MMRT_MAX_TOP_LOGPROBS);
    float max = -INFINITY;
    for (int64_t i = 0; i < vocab; i++)
        if (isfinite(logits[i]) && logits[i] > max)
            max = logits[i];
    if (!isfinite(max))
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "sampler: no finite logit in the row");
    /* The sum in double from the largest logit down: every term is ≤ 1 and one is 1, so it
     * neither overflows nor loses the tokens that carry the mass. */
    double sum = 0;
    int n = 0;
    for (int64_t i = 0; i < vocab; i++) {
        const float l = logits[i];
        if (!isfinite(l))
            continue;
        sum += exp((double)l - (double)max);
        /* The k best so far, kept in order by insertion: a logit that does not beat the
         * k-th costs one comparison, so the pass stays O(vocab) in practice. */
        if (k == 0 || (n == k && !ahead(l, (int32_t)i, top[k - 1].logprob, top[k - 1].token_id)))
            continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && ahead(l, (int32_t)i, top[at - 1].logprob, top[at - 1].token_id)) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = (struct mmrt_logprob){ .token_id = (int32_t)i, .logprob = l };
    }
    const double lse = (double)max + log(sum);
    for (int i = 0; i < n; i++)
        top[i].logprob = (float)((double)top[i].logprob - lse);
    *n_top = n;
    *lp = id >= 0 && id < vocab && isfinite(logits[id]) ? (float)((double)logits[id] - lse)
                                                        : -INFINITY;
    return MMRT_OK;
}
