/*
 * tests/test_sampler.c — core/sampler.c: greedy, the temperature limit, top-k / top-p, and
 * the draw's distribution on fixed seeds (deterministic: the same seeds give the same
 * tokens on every machine, so the frequency bounds below cannot flake).
 *
 * sampler.c is compiled into this file (not linked from the library) so that its two
 * selections are checked directly against a full sort.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "sampler.c"

static int32_t draw(const float *logits, int64_t n, float temperature, int top_k, float top_p,
                    uint64_t seed)
{
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    const struct mmrt_sampling cfg = { .temperature = temperature, .top_k = top_k,
                                       .top_p = top_p, .seed = seed };
    assert_int_equal(mmrt_sampler_init(&s, n, &cfg, &err), MMRT_OK);
    int32_t tok = -1;
    assert_int_equal(mmrt_sampler_next(&s, logits, NULL, 0, 0, &tok, &err), MMRT_OK);
    mmrt_sampler_deinit(&s);
    return tok;
}

/* Temperatures whose 1/T overflows float once it meets a logit: each must act as greedy,
 * never pick the least likely token (which NaN probabilities used to do). */
static void test_tiny_temperature_is_greedy(void **state)
{
    (void)state;
    const float temps[] = { 1e-45f, 0x1p-149f, 1e-42f, 1e-40f, 1e-38f, 0x1p-126f, 1e-30f };
    const float rows[][5] = {
        { 1.0f, 3.0f, 2.0f, -5.0f, 2.999f },
        { -1e30f, 0.5f, -0.5f, 0.25f, 0.0f },
        { 3e38f, -3e38f, 1e38f, 2.9e38f, 0.0f },
        { -3e38f, -2e38f, -2.5e38f, -3.4e38f, -2.0000002e38f },
    };
    const int32_t want[] = { 1, 1, 0, 1 };
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
        for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
            for (uint64_t seed = 0; seed < 64; seed++) {
                int32_t tok = draw(rows[r], 5, temps[t], 0, 1.0f, seed);
                if (tok != want[r])
                    fail_msg("row %zu, temperature %g, seed %llu: token %d, greedy is %d", r,
                             (double)temps[t], (unsigned long long)seed, tok, want[r]);
                assert_int_equal(draw(rows[r], 5, temps[t], 2, 0.5f, seed), want[r]);
            }
}

/* A tie at the top shares the limit: both tied tokens come up, nothing else does. */
static void test_tiny_temperature_tie(void **state)
{
    (void)state;
    const float row[4] = { 0.0f, 5.0f, 5.0f, 4.0f };
    int seen[4] = { 0 };
    for (uint64_t seed = 0; seed < 200; seed++)
        seen[draw(row, 4, 1e-45f, 0, 1.0f, seed)]++;
    assert_int_equal(seen[0], 0);
    assert_int_equal(seen[3], 0);
    assert_true(seen[1] > 50 && seen[2] > 50);
}

static void test_greedy_and_distribution(void **state)
{
    (void)state;
    const float row[3] = { 0.0f, logf(3.0f), -INFINITY };
    assert_int_equal(draw(row, 3, 0.0f, 0, 1.0f, 7), 1);
    /* p(1) = 3/4 at T = 1; at T = 2 it is sqrt(3) / (1 + sqrt(3)) = 0.634. */
    int ones = 0, ones_t2 = 0;
    for (uint64_t seed = 0; seed < 4000; seed++) {
        int32_t tok = draw(row, 3, 1.0f, 0, 1.0f, seed);
        assert_true(tok == 0 || tok == 1);
        ones += tok == 1;
        ones_t2 += draw(row, 3, 2.0f, 0, 1.0f, seed) == 1;
    }
    assert_true(ones > 2850 && ones < 3150);
    assert_true(ones_t2 > 2380 && ones_t2 < 2690);
    /* top_k = 1 and a small top_p both leave only the most likely token. */
    for (uint64_t seed = 0; seed < 100; seed++) {
        assert_int_equal(draw(row, 3, 1.0f, 1, 1.0f, seed), 1);
        assert_int_equal(draw(row, 3, 1.0f, 0, 0.5f, seed), 1);
    }
}

/* A reproducible row generator (not the sampler's): few distinct logits, so ties are many. */
static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static void random_row(struct mmrt_sampler_cand *c, int64_t n, int distinct, uint64_t *x)
{
    for (int64_t i = 0; i < n; i++)
        c[i] = (struct mmrt_sampler_cand){ .logit = (float)(lcg(x) % (uint64_t)distinct) - 7,
                                           .id = (int32_t)((i * 7919) % n),
                                           /* whole numbers: every sum below is exact */
                                           .p = (float)(lcg(x) % 1000) };
}

static int id_cmp(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The ids of c[0, k), sorted, into ids. */
static void id_set(const struct mmrt_sampler_cand *c, int64_t k, int32_t *ids)
{
    for (int64_t i = 0; i < k; i++)
        ids[i] = c[i].id;
    qsort(ids, (size_t)k, sizeof *ids, id_cmp);
}

/* Rows sorted every way a median-of-three pivot can do badly on, and random ones with ties:
 * select_first keeps exactly the k first of a full sort, and select_mass exactly the shortest
 * sorted prefix reaching the mass. */
static void test_selection_matches_sort(void **state)
{
    (void)state;
    const int64_t sizes[] = { 1, 2, 3, 31, 32, 33, 100, 1000, 5000, 151936 };
    struct mmrt_sampler_cand *row = malloc(151936 * sizeof *row);
    struct mmrt_sampler_cand *ref = malloc(151936 * sizeof *ref);
    struct mmrt_sampler_cand *got = malloc(151936 * sizeof *got);
    int32_t *want_ids = malloc(151936 * sizeof *want_ids);
    int32_t *got_ids = malloc(151936 * sizeof *got_ids);
    assert_true(row && ref && got && want_ids && got_ids);
    uint64_t x = 12345;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        for (int shape = 0; shape < 5; shape++) {
            random_row(row, n, shape == 4 ? 1 : 50, &x);
            if (shape == 1 || shape == 2) /* ascending, descending */
                qsort(row, (size_t)n, sizeof *row, cand_cmp);
            if (shape == 2)
                for (int64_t i = 0; i < n / 2; i++)
                    swap(row, i, n - 1 - i);
            if (shape == 3) /* organ pipe */
                for (int64_t i = 0; i < n; i++)
                    row[i].logit = (float)(i < n / 2 ? i : n - i);
            memcpy(ref, row, (size_t)n * sizeof *row);
            qsort(ref, (size_t)n, sizeof *ref, cand_cmp);
            const int64_t ks[] = { 1, 2, 31, 33, n / 2, n - 1 };
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
                const int64_t k = ks[ki];
                if (k < 1 || k >= n)
                    continue;
                memcpy(got, row, (size_t)n * sizeof *row);
                select_first(got, n, k);
                id_set(ref, k, want_ids);
                id_set(got, k, got_ids);
                if (memcmp(want_ids, got_ids, (size_t)k * sizeof *got_ids) != 0)
                    fail_msg("n %lld, shape %d: the top %lld differ from a sort's",
                             (long long)n, shape, (long long)k);
            }
            double total = 0;
            for (int64_t i = 0; i < n; i++)
                total += ref[i].p;
            const double fractions[] = { 1e-9, 0.1, 0.5, 0.9, 0.999, 1.0 };
            for (size_t fi = 0; fi < sizeof fractions / sizeof *fractions; fi++) {
                const double need = fractions[fi] * total;
                int64_t want = n;
                double cum = 0;
                for (int64_t i = 0; i < n; i++) {
                    cum += ref[i].p;
                    if (cum >= need) {
                        want = i + 1;
                        break;
                    }
                }
                memcpy(got, row, (size_t)n * sizeof *row);
                const int64_t len = select_mass(got, n, need);
                if (len != want)
                    fail_msg("n %lld, shape %d, mass %g: a prefix of %lld, a sort gives %lld",
                             (long long)n, shape, fractions[fi], (long long)len,
                             (long long)want);
                id_set(ref, want, want_ids);
                id_set(got, len, got_ids);
                assert_memory_equal(want_ids, got_ids, (size_t)want * sizeof *got_ids);
            }
        }
    }
    free(row);
    free(ref);
    free(got);
    free(want_ids);
    free(got_ids);
}

/* Over a vocabulary of Qwen2-VL's size with many tied logits, every draw lies in the set a
 * full sort keeps for top_k and top_p, and the most likely kept token comes up about as often
 * as its probability says. */
static void test_draws_stay_in_the_kept_set(void **state)
{
    (void)state;
    const int64_t n = 151936;
    float *logits = malloc((size_t)n * sizeof *logits);
    struct mmrt_sampler_cand *ref = malloc((size_t)n * sizeof *ref);
    char *kept = malloc((size_t)n);
    assert_true(logits && ref && kept);
    uint64_t x = 99;
    for (int64_t i = 0; i < n; i++)
        logits[i] = (float)(lcg(&x) % 400) / 40.0f; /* 0 … 9.975 in steps of 1/40 */
    logits[777] = NAN;
    logits[778] = -INFINITY;
    const struct { int top_k; float top_p; } cuts[] = { { 40, 1.0f }, { 0, 0.5f },
                                                        { 1000, 0.9f }, { 0, 1.0f } };
    for (size_t ci = 0; ci < sizeof cuts / sizeof *cuts; ci++) {
        /* The reference: sort, cut to top_k, then the top_p prefix, as sampler.h says. */
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (isfinite(logits[i]))
                ref[m++] = (struct mmrt_sampler_cand){ .logit = logits[i], .id = (int32_t)i };
        qsort(ref, (size_t)m, sizeof *ref, cand_cmp);
        if (cuts[ci].top_k > 0)
            m = cuts[ci].top_k;
        double sum = 0;
        for (int64_t i = 0; i < m; i++)
            sum += exp((double)ref[i].logit - (double)ref[0].logit);
        int64_t keep = m;
        double cum = 0;
        for (int64_t i = 0; i < m && cuts[ci].top_p < 1; i++) {
            cum += exp((double)ref[i].logit - (double)ref[0].logit) / sum;
            if (cum >= cuts[ci].top_p) {
                keep = i + 1;
                break;
            }
        }
        memset(kept, 0, (size_t)n);
        double kept_mass = 0;
        for (int64_t i = 0; i < keep; i++) {
            kept[ref[i].id] = 1;
            kept_mass += exp((double)ref[i].logit - (double)ref[0].logit);
        }
        const double p_top = 1.0 / kept_mass; /* ref[0]'s share of the kept set */
        int top_hits = 0;
        const int draws = 400;
        struct mmrt_sampler s;
        struct mmrt_error err = { 0 };
        for (uint64_t seed = 0; seed < (uint64_t)draws; seed++) {
            const struct mmrt_sampling cfg = { .temperature = 1.0f, .top_k = cuts[ci].top_k,
                                               .top_p = cuts[ci].top_p, .seed = seed };
            assert_int_equal(mmrt_sampler_init(&s, n, &cfg, &err), MMRT_OK);
            int32_t tok = -1;
            assert_int_equal(mmrt_sampler_next(&s, logits, NULL, 0, 0, &tok, &err), MMRT_OK);
            mmrt_sampler_deinit(&s);
            if (tok < 0 || tok >= n || !kept[tok])
                fail_msg("cut %zu, seed %llu: token %d is not in the kept set", ci,
                         (unsigned long long)seed, tok);
            top_hits += tok == ref[0].id;
        }
        const double mean = draws * p_top, sd = sqrt(draws * p_top * (1 - p_top));
        if (fabs(top_hits - mean) > 5 * sd + 2)
            fail_msg("cut %zu: the top token came up %d times in %d, expected %.1f", ci,
                     top_hits, draws, mean);
    }
    free(logits);
    free(ref);
    free(kept);
}

/* Refused with the field named. */
static void expect_refused(struct mmrt_sampling cfg, const char *field)
{
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_sampler_init(&s, 4, &cfg, &err), MMRT_ERR_INVALID_ARG);
    if (!strstr(err.msg, field))
        fail_msg("expected a message naming %s, got: %s", field, err.msg);
}

static void test_settings_refused(void **state)
{
    (void)state;
    const struct mmrt_sampling ok = { .temperature = 1.0f, .top_p = 1.0f };
    struct mmrt_sampling c = ok;
    c.temperature = -1e-45f;
    expect_refused(c, "temperature");
    c.temperature = NAN;
    expect_refused(c, "temperature");
    c = ok;
    c.top_p = 0.0f;
    expect_refused(c, "top_p");
    c = ok;
    c.top_k = -1;
    expect_refused(c, "top_k");
    const float bad_rep[] = { -0.5f, 100.5f, NAN, INFINITY };
    for (size_t i = 0; i < sizeof bad_rep / sizeof *bad_rep; i++) {
        c = ok;
        c.repetition_penalty = bad_rep[i];
        expect_refused(c, "repetition_penalty");
    }
    const float bad_pf[] = { -2.01f, 2.01f, NAN, -INFINITY };
    for (size_t i = 0; i < sizeof bad_pf / sizeof *bad_pf; i++) {
        c = ok;
        c.presence_penalty = bad_pf[i];
        expect_refused(c, "presence_penalty");
        c = ok;
        c.frequency_penalty = bad_pf[i];
        expect_refused(c, "frequency_penalty");
    }
    const float none[2] = { NAN, INFINITY };
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    c = ok;
    c.temperature = 1e-45f;
    assert_int_equal(mmrt_sampler_init(&s, 2, &c, &err), MMRT_OK);
    int32_t tok;
    assert_int_equal(mmrt_sampler_next(&s, none, NULL, 0, 0, &tok, &err), MMRT_ERR_INTERNAL);
    mmrt_sampler_deinit(&s);
}

/* The penalised row, checked value by value, and the choices made from it. */
static void test_penalties(void **state)
{
    (void)state;
    /* ids:                  0     1      2     3     4 */
    const float row[5] = { 2.0f, -1.0f, 1.5f, 0.5f, 1.9f };
    /* The prompt holds 1 and 3 (3 twice), the answer 0, 0 and 2, and 99 (outside). */
    const int32_t toks[] = { 1, 3, 3, 0, 0, 2, 99 };
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    struct mmrt_sampling c = { .repetition_penalty = 2.0f, .top_p = 1.0f };
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_OK);
    const float *p = penalise(&s, row, toks, 3, 7);
    const float rep[5] = { 1.0f, -2.0f, 0.75f, 0.25f, 1.9f };
    assert_memory_equal(p, rep, sizeof rep);
    int32_t tok;
    assert_int_equal(mmrt_sampler_next(&s, row, toks, 3, 7, &tok, &err), MMRT_OK);
    assert_int_equal(tok, 4); /* 0 would win without the penalty */
    assert_int_equal(mmrt_sampler_next(&s, row, NULL, 0, 0, &tok, &err), MMRT_OK);
    assert_int_equal(tok, 0);
    mmrt_sampler_deinit(&s);

    /* Presence once per id of the answer, frequency once per occurrence; the prompt's ids
     * are not touched by either. */
    c = (struct mmrt_sampling){ .presence_penalty = 0.5f, .frequency_penalty = 0.25f,
                                .top_p = 1.0f };
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_OK);
    p = penalise(&s, row, toks, 3, 7);
    const float pf[5] = { 2.0f - 0.5f - 0.5f, -1.0f, 1.5f - 0.5f - 0.25f, 0.5f, 1.9f };
    assert_memory_equal(p, pf, sizeof pf);
    mmrt_sampler_deinit(&s);

    /* All three: repetition first, then presence and frequency on top. */
    c.repetition_penalty = 2.0f;
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_OK);
    p = penalise(&s, row, toks, 3, 7);
    const float all[5] = { 1.0f - 0.5f - 0.5f, -2.0f, 0.75f - 0.5f - 0.25f, 0.25f, 1.9f };
    assert_memory_equal(p, all, sizeof all);
    /* Sampling sees the same row: with a tiny temperature it is the greedy choice. */
    mmrt_sampler_deinit(&s);
    c.temperature = 1e-30f;
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_OK);
    assert_int_equal(mmrt_sampler_next(&s, row, toks, 3, 7, &tok, &err), MMRT_OK);
    assert_int_equal(tok, 4);
    mmrt_sampler_deinit(&s);
    /* repetition_penalty 1 and 0 are off: no copy is made. */
    c = (struct mmrt_sampling){ .repetition_penalty = 1.0f, .top_p = 1.0f };
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_OK);
    assert_null(s.penalised);
    mmrt_sampler_deinit(&s);
}

/* Biases after the penalties, on a copy the sampler owns; refused out of range. */
static void test_logit_bias(void **state)
{
    (void)state;
    const float row[5] = { 2.0f, -1.0f, 1.5f, 0.5f, 1.9f };
    const int32_t toks[] = { 0 };
    struct mmrt_logit_bias b[3] = { { 3, 1.0f }, { 3, 0.75f }, { 0, -100.0f } };
    struct mmrt_sampling c = { .repetition_penalty = 2.0f, .top_p = 1.0f, .logit_bias = b,
                               .n_logit_bias = 3 };
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_OK);
    b[0].bias = 50.0f; /* the caller's array may change or go once init returns */
    const float *p = penalise(&s, row, toks, 0, 1);
    const float want[5] = { 1.0f - 100.0f, -1.0f, 1.5f, 0.5f + 1.75f, 1.9f };
    assert_memory_equal(p, want, sizeof want);
    int32_t tok;
    assert_int_equal(mmrt_sampler_next(&s, row, toks, 0, 1, &tok, &err), MMRT_OK);
    assert_int_equal(tok, 3);
    mmrt_sampler_deinit(&s);

    b[0] = (struct mmrt_logit_bias){ 5, 1.0f };
    c = (struct mmrt_sampling){ .top_p = 1.0f, .logit_bias = b, .n_logit_bias = 1 };
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "logit_bias[0]: token 5 is not in the model's vocabulary"));
    b[0] = (struct mmrt_logit_bias){ 1, NAN };
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "logit_bias[0]: bias nan must be in [-100, 100]"));
    c.n_logit_bias = MMRT_MAX_LOGIT_BIAS + 1;
    assert_int_equal(mmrt_sampler_init(&s, 5, &c, &err), MMRT_ERR_INVALID_ARG);
}

/* The log-softmax against a sum in long double, the top ids in order (ties by id, −inf
 * last, fewer than asked when fewer are finite), and the row without a finite logit. */
static void test_logprobs(void **state)
{
    (void)state;
    const float row[7] = { 1.0f, 3.0f, -INFINITY, 3.0f, NAN, -2.0f, 1.0f };
    long double sum = 0;
    for (int i = 0; i < 7; i++)
        if (isfinite(row[i]))
            sum += expl((long double)row[i] - 3.0L);
    const long double lse = 3.0L + logl(sum);
    struct mmrt_logprob top[MMRT_MAX_TOP_LOGPROBS];
    struct mmrt_error err = { 0 };
    float lp;
    int n;
    assert_int_equal(mmrt_sampler_logprobs(row, 7, 6, 4, &lp, top, &n, &err), MMRT_OK);
    assert_true(fabsl((long double)lp - (1.0L - lse)) < 1e-6L);
    assert_int_equal(n, 4);
    const int32_t ids[4] = { 1, 3, 0, 6 };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(top[i].token_id, ids[i]);
        assert_true(fabsl((long double)top[i].logprob - ((long double)row[ids[i]] - lse)) <
                    1e-6L);
        assert_null(top[i].text);
    }
    assert_int_equal(mmrt_sampler_logprobs(row, 7, 2, 20, &lp, top, &n, &err), MMRT_OK);
    assert_int_equal(n, 5); /* the finite ones */
    assert_int_equal(top[4].token_id, 5);
    assert_true(isinf(lp) && lp < 0);
    assert_int_equal(mmrt_sampler_logprobs(row, 7, 1, 0, &lp, top, &n, &err), MMRT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(mmrt_sampler_logprobs(row, 7, 1, 21, &lp, top, &n, &err),
                     MMRT_ERR_INVALID_ARG);
    const float none[2] = { NAN, -INFINITY };
    assert_int_equal(mmrt_sampler_logprobs(none, 2, 0, 1, &lp, top, &n, &err),
                     MMRT_ERR_INTERNAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_tiny_temperature_tie),
        cmocka_unit_test(test_greedy_and_distribution),
        cmocka_unit_test(test_selection_matches_sort),
        cmocka_unit_test(test_draws_stay_in_the_kept_set),
        cmocka_unit_test(test_settings_refused),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logprobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
