/*
 * tools/bench/probe_avx2.c — the AVX2/FMA loops of the limit probes (compiled with -mavx2
 * -mfma; probe.c calls them only on a CPU that has those instructions). Same shape as
 * probe_avx512.c: a four-accumulator read loop (one stream or four) and 12 independent FMA
 * chains.
 */
#include <immintrin.h>

#include "bench.h"

uint64_t bench_read_avx2(const void *p, size_t nbytes, int streams, uint64_t *sink)
{
    const char *c = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    if (streams == 4) {
        size_t q = nbytes / 4 / 64 * 64;
        for (; i + 64 <= q; i += 64) {
            a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(c + i)));
            a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(c + q + i)));
            a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(c + 2 * q + i)));
            a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(c + 3 * q + i)));
            a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(c + i + 32)));
            a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(c + q + i + 32)));
            a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(c + 2 * q + i + 32)));
            a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(c + 3 * q + i + 32)));
        }
        i *= 4;
        nbytes = 0; /* skip the single-stream loop */
    }
    for (; i + 128 <= nbytes; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(c + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(c + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(c + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(c + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a0);
    *sink += v[0] + v[1] + v[2] + v[3];
    return i;
}

/* Named accumulators (see probe_avx512.c for why not an array). */
#define REP12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define DECL(i) __m256 a##i = _mm256_set1_ps(0.5f + 0.01f * (float)(i));
#define FMA(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm256_add_ps(s, a##i);

uint64_t bench_fma_avx2(uint64_t iters, float *sink)
{
    const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
    REP12(DECL)
    for (uint64_t it = 0; it < iters; it++) {
        REP12(FMA)
    }
    __m256 s = _mm256_setzero_ps();
    REP12(SUM)
    float v[8];
    _mm256_storeu_ps(v, s);
    *sink += v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    return iters * 12 * 8 * 2;
}
