/*
 * tools/bench/probe_avx512.c — the AVX-512 loops of the limit probes (compiled with
 * -mavx512f -mavx512bf16; probe.c calls them only on a CPU that has those instructions).
 *
 *   read: sums 64-byte aligned vectors, four independent accumulators, so the loop is bound by
 *         memory and not by the add latency; as one sequential stream, or as four (one per
 *         quarter of the slice, like a GEMV reading four weight rows at a time);
 *   fma:  20 independent chains acc = acc·m + c (vfmadd231ps zmm), more than the 2 FMA ports ×
 *         4-cycle latency need, with m < 1 so nothing overflows or turns subnormal;
 *   bf16: 20 independent vdpbf16ps chains (32 bf16 multiply-adds each).
 */
#include <immintrin.h>

#include "bench.h"

uint64_t bench_read_avx512(const void *p, size_t nbytes, int streams, uint64_t *sink)
{
    const char *c = p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    if (streams == 4) {
        /* Four sequential streams, one per quarter, 128 bytes of each per step. */
        size_t q = nbytes / 4 / 128 * 128;
        for (; i + 128 <= q; i += 128) {
            a0 = _mm512_add_epi64(a0, _mm512_load_si512(c + i));
            a1 = _mm512_add_epi64(a1, _mm512_load_si512(c + q + i));
            a2 = _mm512_add_epi64(a2, _mm512_load_si512(c + 2 * q + i));
            a3 = _mm512_add_epi64(a3, _mm512_load_si512(c + 3 * q + i));
            a0 = _mm512_add_epi64(a0, _mm512_load_si512(c + i + 64));
            a1 = _mm512_add_epi64(a1, _mm512_load_si512(c + q + i + 64));
            a2 = _mm512_add_epi64(a2, _mm512_load_si512(c + 2 * q + i + 64));
            a3 = _mm512_add_epi64(a3, _mm512_load_si512(c + 3 * q + i + 64));
        }
        i *= 4;
    } else {
        for (; i + 256 <= nbytes; i += 256) {
            a0 = _mm512_add_epi64(a0, _mm512_load_si512(c + i));
            a1 = _mm512_add_epi64(a1, _mm512_load_si512(c + i + 64));
            a2 = _mm512_add_epi64(a2, _mm512_load_si512(c + i + 128));
            a3 = _mm512_add_epi64(a3, _mm512_load_si512(c + i + 192));
        }
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    *sink += (uint64_t)_mm512_reduce_add_epi64(a0);
    return i;
}

/* The accumulators are named variables, not an array: with an array GCC interchanges the
 * loops and keeps the chains in memory, measuring the store-forwarding latency instead. */
#define REP20(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) \
    M(14) M(15) M(16) M(17) M(18) M(19)
#define DECL(i) __m512 a##i = _mm512_set1_ps(0.5f + 0.01f * (float)(i));
#define FMA(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define DP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
#define SUM(i) s = _mm512_add_ps(s, a##i);

uint64_t bench_fma_avx512(uint64_t iters, float *sink)
{
    const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    REP20(DECL)
    for (uint64_t it = 0; it < iters; it++) {
        REP20(FMA)
    }
    __m512 s = _mm512_setzero_ps();
    REP20(SUM)
    *sink += _mm512_reduce_add_ps(s);
    return iters * 20 * 16 * 2;
}

uint64_t bench_bf16_avx512(uint64_t iters, float *sink)
{
    /* bf16 1.0 = 0x3f80 and 2^-20 ≈ 0x3580: each step adds 32·2^-20 per lane. */
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
    const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3580);
    REP20(DECL)
    for (uint64_t it = 0; it < iters; it++) {
        REP20(DP)
    }
    __m512 s = _mm512_setzero_ps();
    REP20(SUM)
    *sink += _mm512_reduce_add_ps(s);
    return iters * 20 * 32 * 2;
}
