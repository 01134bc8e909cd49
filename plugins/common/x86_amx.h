/*
 * plugins/common/x86_amx.h — whether this process may use AMX tiles: the CPU plugin's AMX
 * unit (plugins/cpu/cpu_kern_amx.c) and mmrt-bench's AMX probe ask the same two questions,
 * so they cannot disagree on what the machine has.
 *
 * Three things must hold. The CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24
 * and 22). The OS enables the tile state (XCR0 bits 17, XTILECFG, and 18, XTILEDATA; Linux
 * 5.16+). And, on Linux, the process has asked for it: the 8 KiB tile data is given only after
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), whose permission then holds for all the
 * process's threads (asking again is harmless). A tile instruction without it is SIGILL.
 */
#ifndef MMRT_X86_AMX_H
#define MMRT_X86_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
#define MMRT_X86_AMX_CHECKS 1
#include <cpuid.h>
#include <errno.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define MMRT_X86_AMX_CHECKS 0
#endif

/* The CPU has AMX-BF16 tiles and the OS saves their state; otherwise why says which is
 * missing. */
static inline bool mmrt_x86_amx_present(char *why, size_t why_size)
{
#if MMRT_X86_AMX_CHECKS
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
        snprintf(why, why_size, "this CPU has no AMX-BF16");
        return false;
    }
    uint32_t lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) {
        snprintf(why, why_size, "the OS does not enable the AMX tile state (no OSXSAVE)");
        return false;
    }
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        snprintf(why, why_size, "the OS does not enable the AMX tile state (XCR0 %#x)", lo);
        return false;
    }
    (void)hi;
    return true;
#else
    snprintf(why, why_size, "AMX is an x86-64 feature");
    return false;
#endif
}

/* Asks the kernel for the tile state (Linux); false with the reason when it refuses. */
static inline bool mmrt_x86_amx_permit(char *why, size_t why_size)
{
#if MMRT_X86_AMX_CHECKS && defined(__linux__) && defined(SYS_arch_prctl)
    const long req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    if (syscall(SYS_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0)
        return true;
    snprintf(why, why_size, "the kernel refused the AMX tile state (arch_prctl: %s)",
             strerror(errno));
    return false;
#else
    snprintf(why, why_size, "no way to request the AMX tile state on this OS");
    return false;
#endif
}

/* LDTILECFG's 64-byte operand. */
struct mmrt_x86_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Palette 1 with tiles 0–7 each 16 rows of 64 bytes (16 f32 or 32 bf16 per row): the one
 * shape the CPU plugin's AMX unit and mmrt-bench's AMX probe use. */
static inline void mmrt_x86_amx_config_16x64(struct mmrt_x86_tile_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->colsb[t] = 64;
        cfg->rows[t] = 16;
    }
}

/* LDTILECFG with the whole 64-byte operand. GCC 12's _tile_loadconfig names only the first 8
 * bytes as read, so at -O2 and above GCC dropped the stores that fill rows[] and colsb[] and
 * loaded a garbage palette: #GP, a SIGSEGV on the first tile use (found on the first AMX CPU
 * these kernels met). Its _tile_loadd names no memory at all, so whoever fills a buffer a tile
 * is loaded from must put mmrt_x86_amx_fence() between the stores and the loads. */
static inline void mmrt_x86_amx_load_config(const struct mmrt_x86_tile_config *cfg)
{
#if MMRT_X86_AMX_CHECKS
    __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
#else
    (void)cfg;
#endif
}

/* A compiler barrier: every store before it is in memory before a tile load after it. */
static inline void mmrt_x86_amx_fence(void)
{
#if defined(__GNUC__)
    __asm__ volatile("" : : : "memory");
#endif
}

#endif
