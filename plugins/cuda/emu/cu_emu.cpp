/* plugins/cuda/emu/cu_emu.cpp — see cu_emu.h. */
#include "cu_emu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <thread>
#include <vector>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
dim3 blockDim, gridDim;
void *cu_emu_dyn_smem;

static pthread_barrier_t g_block_bar;
static pthread_barrier_t g_warp_bar[32];
static uint64_t g_exch[32][32];
static thread_local int t_flat; /* flat thread index within the block */

void __syncthreads(void) { pthread_barrier_wait(&g_block_bar); }
void __syncwarp(unsigned) { pthread_barrier_wait(&g_warp_bar[t_flat >> 5]); }
int cu_emu_lane(void) { return t_flat & 31; }

uint64_t cu_emu_exchange(uint64_t v, int arg, bool is_xor)
{
    int w = t_flat >> 5, lane = t_flat & 31;
    g_exch[w][lane] = v;
    pthread_barrier_wait(&g_warp_bar[w]);
    uint64_t r = g_exch[w][is_xor ? (lane ^ arg) & 31 : arg & 31];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}

void cu_emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
    unsigned n = block.x * block.y * block.z;
    if (n == 0 || n > 1024 || n % 32 != 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fprintf(stderr, "cu_emu: bad launch grid (%u,%u,%u) block (%u,%u,%u)\n", grid.x, grid.y,
                grid.z, block.x, block.y, block.z);
        abort();
    }
    if (smem > 227 * 1024) {
        fprintf(stderr, "cu_emu: %zu bytes of dynamic shared memory exceed any GPU\n", smem);
        abort();
    }
    blockDim = block;
    gridDim = grid;
    void *buf = NULL;
    if (posix_memalign(&buf, 64, smem ? smem : 64) != 0)
        abort();
    /* Garbage, not zeros: a kernel must not rely on shared memory starting cleared. */
    memset(buf, 0xa5, smem ? smem : 64);
    cu_emu_dyn_smem = buf;
    pthread_barrier_init(&g_block_bar, NULL, n);
    for (unsigned w = 0; w < n / 32; w++)
        pthread_barrier_init(&g_warp_bar[w], NULL, 32);
    std::vector<std::thread> th;
    for (unsigned t = 0; t < n; t++)
        th.emplace_back([&, t]() {
            t_flat = (int)t;
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = {x, y, z};
                        body();
                        pthread_barrier_wait(&g_block_bar);
                    }
        });
    for (auto &t : th)
        t.join();
    pthread_barrier_destroy(&g_block_bar);
    for (unsigned w = 0; w < n / 32; w++)
        pthread_barrier_destroy(&g_warp_bar[w]);
    free(buf);
}
