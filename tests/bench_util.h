/*
 * tests/bench_util.h — what the plugin micro-benchmarks (cpu-gemm-bench, cpu-attn-bench)
 * share: a monotonic clock and a seeded splitmix64 stream, header-only so each stays one
 * file linked against the harness alone (op_cases' stream needs cmocka and the core).
 */
#ifndef MMRT_TESTS_BENCH_UTIL_H
#define MMRT_TESTS_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: the state advances by the golden-ratio increment, the output is mixed. */
static inline uint64_t bench_rng_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float bench_rng_f(uint64_t *state)
{
    return (float)((double)(bench_rng_u64(state) >> 11) / 4503599627370496.0) - 1.0f;
}

#endif
