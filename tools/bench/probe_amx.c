/*
 * tools/bench/probe_amx.c — the AMX-BF16 loop of the limit probes (compiled with -mamx-tile
 * -mamx-bf16; probe.c calls it only after plugins/common/x86_amx.h says this process may use
 * the tiles).
 *
 *   amx: four independent TDPBF16PS chains (C tiles 0–3) over two A and two B tiles loaded
 *        once, the CPU plugin's AMX micro-tile without its loads, so the figure is the tile
 *        unit's peak: 16 × 16 × 32 multiply-adds (16 384 flop) per instruction.
 */
#include <immintrin.h>
#include <stdint.h>

#include "bench.h"
#include "x86_amx.h"

uint64_t bench_amx_bf16(uint64_t iters, float *sink)
{
    struct mmrt_x86_tile_config cfg;
    mmrt_x86_amx_config_16x64(&cfg);
    /* bf16 1.0 (0x3f80) times 2^-20 (0x3580): the sums grow slowly and stay normal. Every
     * probe thread has its own. */
    uint16_t a[16 * 32], b[16 * 32];
    for (int i = 0; i < 16 * 32; i++) {
        a[i] = 0x3f80;
        b[i] = 0x3580;
    }
    float c[16 * 16];
    mmrt_x86_amx_load_config(&cfg);
    mmrt_x86_amx_fence(); /* a and b are stored before the tile loads read them */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    for (uint64_t it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float s = 0;
    _tile_stored(0, c, 64);
    s += c[0];
    _tile_stored(3, c, 64);
    s += c[255];
    _tile_release();
    *sink += s;
    return iters * 4 * 16 * 16 * 32 * 2;
}
