/*
 * tests/test_sampler.c — core/sampler.c: greedy, the temperature limit, top-k / top-p, and
 * the draw's distribution on fixed seeds (deterministic: the same seeds give the same
 * tokens on every machine, so the frequency bounds below cannot flake).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>

#include <cmocka.h>

#include "sampler.h"

static int32_t draw(const float *logits, int64_t n, float temperature, int top_k, float top_p,
                    uint64_t seed)
{
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_sampler_init(&s, n, temperature, top_k, top_p, seed, &err), MMRT_OK);
    int32_t tok = -1;
    assert_int_equal(mmrt_sampler_next(&s, logits, &tok, &err), MMRT_OK);
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

static void test_settings_refused(void **state)
{
    (void)state;
    struct mmrt_sampler s;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_sampler_init(&s, 4, -1e-45f, 0, 1.0f, 0, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_sampler_init(&s, 4, NAN, 0, 1.0f, 0, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_sampler_init(&s, 4, 1.0f, 0, 0.0f, 0, &err), MMRT_ERR_INVALID_ARG);
    const float none[2] = { NAN, INFINITY };
    assert_int_equal(mmrt_sampler_init(&s, 2, 1e-45f, 0, 1.0f, 0, &err), MMRT_OK);
    int32_t tok;
    assert_int_equal(mmrt_sampler_next(&s, none, &tok, &err), MMRT_ERR_INTERNAL);
    mmrt_sampler_deinit(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_tiny_temperature_tie),
        cmocka_unit_test(test_greedy_and_distribution),
        cmocka_unit_test(test_settings_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
