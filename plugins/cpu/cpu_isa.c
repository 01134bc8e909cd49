/*
 * plugins/cpu/cpu_isa.c — which kernels this CPU can run, decided at run time.
 *
 * The plugin is built once for baseline x86-64 (or any other target); the ISA-specific kernels
 * sit in cpu_kern_*.c, each compiled with its own -m flags. Here, at device_open, the CPU's
 * features (cpuid through __builtin_cpu_supports, which also checks that the OS saves the
 * wider registers) choose the table: AVX-512 (F+BW+VL+DQ, plus AVX2/FMA/F16C) > AVX2 (+FMA
 * +F16C) > portable. The `isa` device option may ask for a lower table (to compare kernels or
 * test every path on one machine), never for one the CPU lacks. The bf16 dot-product GEMM
 * (`bf16_dot`) runs on AMX tiles or on AVX512_BF16, both with the AVX-512 table. AMX needs
 * the CPU's bits, the OS's tile state and this process's permission (plugins/common/
 * x86_amx.h); where the kernel refuses, bf16_dot = 1 runs on AVX512_BF16.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_internal.h"

/* ---- the portable table: plain C, the reference summation orders ---------------------- */

static double exp_sum_portable(const float *x, float m, float *y, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - m);
        sum += y[i];
    }
    return sum;
}

/* x / (1 + e^(−a·x)): for very negative x the exponential overflows to inf and the result is
 * −0, the limit, rather than NaN. */
static void x_sigmoid_portable(const float *x, float a, const float *mul, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] / (1.0f + expf(-a * x[i]));
        dst[i] = mul ? v * mul[i] : v;
    }
}

static float scale_max_portable(float *x, float s, int64_t n)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        x[i] *= s;
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

static void scale_d_portable(float *x, double a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(x[i] * a);
}

const struct cpu_kernels cpu_kernels_portable = {
    .name = "portable",
    .scale_max = scale_max_portable,
    .scale_d = scale_d_portable,
    .q4_gemv = cpu_q4_gemv_portable,
    .exp_sum = exp_sum_portable,
    .x_sigmoid = x_sigmoid_portable,
};

#if defined(__x86_64__) || defined(_M_X64)
#define CPU_X86 1
#include <cpuid.h>
#else
#define CPU_X86 0
#endif

#include "x86_amx.h"

struct isa_caps {
    bool avx2, avx512, avx512_bf16, avx512_vnni;
    bool amx;          /* AMX-BF16 tiles with their state enabled by the OS (x86_amx.h) */
    char amx_why[128]; /* why amx is false, for a refusal */
};

static void amx_caps(struct isa_caps *c)
{
#if defined(CPU_AMX_EMULATE)
    /* The test-only build: tiles in memory, on any CPU with the avx512 table (whose W packing
     * the AMX unit shares). */
    snprintf(c->amx_why, sizeof c->amx_why, "emulated AMX needs the avx512 kernels");
    c->amx = c->avx512;
#else
    c->amx = c->avx512 && mmrt_x86_amx_present(c->amx_why, sizeof c->amx_why);
    if (!c->avx512)
        snprintf(c->amx_why, sizeof c->amx_why, "this CPU has no AVX-512");
#endif
}

#if defined(CPU_HAVE_AMX)
static bool amx_permit(char *why, size_t why_size)
{
#if defined(CPU_AMX_EMULATE)
    (void)why;
    (void)why_size;
    return true;
#else
    return mmrt_x86_amx_permit(why, why_size);
#endif
}
#endif

static struct isa_caps isa_caps(void)
{
    struct isa_caps c;
    memset(&c, 0, sizeof c);
#if CPU_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    /* f16c from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for
     * __builtin_cpu_supports and refuses to compile it. */
    unsigned a, b, ecx, d;
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __get_cpuid(1, &a, &b, &ecx, &d) && (ecx & bit_F16C);
    c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
    c.avx512_vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
#endif
    amx_caps(&c);
    return c;
}

void cpu_isa_describe(char *out, size_t size)
{
    struct isa_caps c = isa_caps();
    snprintf(out, size, "%s%s%s%s%s", c.avx512 ? "avx512 " : "",
             c.avx512_bf16 ? "avx512_bf16 " : "", c.avx512_vnni ? "avx512_vnni " : "",
             c.amx ? "amx_bf16 " : "", c.avx2 ? "avx2 fma f16c" : "no avx2");
}

/* The bf16 unit for the option value, or a refusal naming what is missing. */
static mmrt_status bf16_unit(const char *want, const struct isa_caps *c, const char *table,
                             const struct cpu_bf16_gemm **out, char *err, size_t err_size)
{
    *out = NULL;
    (void)c; /* read only on x86-64 */
    if (!want || strcmp(want, "0") == 0)
        return MMRT_OK;
    bool best = strcmp(want, "1") == 0, amx = strcmp(want, "amx") == 0;
    if (!best && !amx && strcmp(want, "avx512") != 0) {
        snprintf(err, err_size, "cpu: device option bf16_dot=\"%s\": expected 0, 1, amx or "
                 "avx512", want);
        return MMRT_ERR_CONFIG;
    }
    if (strcmp(table, "avx512") != 0) {
        snprintf(err, err_size, "cpu: device option bf16_dot=%s needs the avx512 kernels "
                 "(isa: %s)", want, table);
        return MMRT_ERR_CONFIG;
    }
#if CPU_X86
#if defined(CPU_HAVE_AMX)
    if (best || amx) {
        char why[160];
        snprintf(why, sizeof why, "%s", c->amx_why);
        if (c->amx && amx_permit(why, sizeof why)) {
            *out = &cpu_bf16_gemm_amx;
            return MMRT_OK;
        }
        if (amx) {
            snprintf(err, err_size, "cpu: device option bf16_dot=amx: %s", why);
            return MMRT_ERR_CONFIG;
        }
    }
#else
    if (amx) {
        snprintf(err, err_size, "cpu: device option bf16_dot=amx: this plugin was built "
                 "without AMX (the compiler lacks -mamx-tile)");
        return MMRT_ERR_CONFIG;
    }
#endif
    if (c->avx512_bf16) {
        *out = &cpu_bf16_gemm_avx512;
        return MMRT_OK;
    }
#endif
    snprintf(err, err_size, "cpu: device option bf16_dot=%s needs AMX-BF16 or AVX512_BF16 "
             "(this CPU has neither)", want);
    return MMRT_ERR_CONFIG;
}

/* The int8 U4 GEMV for the option value ("1" or "3": that many digits of x; NULL or "auto":
 * three where the table has a unit, else none): VNNI with the avx512 table where the CPU has
 * it, else the AVX2 one (every AVX-512 CPU runs AVX2); the portable table has none. Three
 * digits are the default because they are as exact as the f32 GEMV (docs/QUANTIZATION.md
 * "int8_dot") and faster. */
static mmrt_status q8_unit(const char *want, const struct isa_caps *c, const char *table,
                           const struct cpu_q4_q8 **out, char *err, size_t err_size)
{
    *out = NULL;
    (void)c; /* read only on x86-64 */
    const bool automatic = !want || strcmp(want, "auto") == 0;
    if (automatic && strcmp(table, "portable") == 0)
        return MMRT_OK;
    if (!automatic && strcmp(want, "0") == 0)
        return MMRT_OK;
    if (!automatic && strcmp(want, "1") != 0 && strcmp(want, "3") != 0) {
        snprintf(err, err_size, "cpu: device option int8_dot=\"%s\": expected auto, 0, 1 or 3",
                 want);
        return MMRT_ERR_CONFIG;
    }
#if CPU_X86
    const bool three = automatic || want[0] == '3';
    if (strcmp(table, "avx512") == 0 && c->avx512_vnni) {
        *out = three ? &cpu_q4_q8_avx512vnni_3 : &cpu_q4_q8_avx512vnni;
        return MMRT_OK;
    }
    if (strcmp(table, "portable") != 0) {
        *out = three ? &cpu_q4_q8_avx2_3 : &cpu_q4_q8_avx2;
        return MMRT_OK;
    }
#endif
    snprintf(err, err_size, "cpu: device option int8_dot=%s needs the avx2 or avx512 kernels "
             "(isa: %s)", want ? want : "auto", table);
    return MMRT_ERR_CONFIG;
}

/* A device option of two values and auto, where auto takes the second on AMD cores and the
 * first elsewhere (what each was measured best on): *second says which was chosen.
 * - prefetch (where the int8 U4 GEMV prefetches, cpu_prefetch_read): l1 or l2. L2 on AMD
 *   (Zen 4: 35 GB/s against 24 with L1), L1 elsewhere (what Ice Lake measured best).
 * - gemv_widen (where the batched GEMV widens F16, BF16 and I8 weights): buffer or
 *   registers. Registers on AMD, whose conversions issue beside the FMAs (Zen 4: the F16
 *   GEMV of 8 rows 4.6–5.3 → 3.4–4.3 ms for 11008 × 4096), the buffer elsewhere (on Intel
 *   cores vcvtph2ps takes the FMA ports: the reason the buffer was built; BENCHMARKS.md). */
static mmrt_status amd_choice(const char *key, const char *want, const char *first,
                              const char *second, bool *is_second, char *err, size_t err_size)
{
    if (!want || strcmp(want, "auto") == 0) {
#if CPU_X86 && defined(__GNUC__)
        __builtin_cpu_init();
        *is_second = __builtin_cpu_is("amd");
#else
        *is_second = false;
#endif
        return MMRT_OK;
    }
    if (strcmp(want, first) == 0 || strcmp(want, second) == 0) {
        *is_second = strcmp(want, second) == 0;
        return MMRT_OK;
    }
    snprintf(err, err_size, "cpu: device option %s=\"%s\": expected auto, %s or %s", key, want,
             first, second);
    return MMRT_ERR_CONFIG;
}

/* The BF16 GEMV on tiles for the option value: NULL or "0" none (the default); "1" AMX, or a
 * refusal saying why not. Not the default although it is as exact as the f32 GEMV: one
 * sequence alone decoded up to 3 % slower on the Qwen2-VL shape (2026-12-07), and the choice
 * must hold for every batch size, so it is the device's, for those who decode batches. */
static mmrt_status gemv_unit(const char *want, const struct isa_caps *c, const char *table,
                             const struct cpu_bf16_gemv **out, char *err, size_t err_size)
{
    *out = NULL;
    (void)c; /* read only with AMX */
    if (!want || strcmp(want, "0") == 0)
        return MMRT_OK;
    if (strcmp(want, "1") != 0) {
        snprintf(err, err_size, "cpu: device option amx_gemv=\"%s\": expected 0 or 1", want);
        return MMRT_ERR_CONFIG;
    }
    char why[160] = "";
    if (strcmp(table, "avx512") != 0) {
        snprintf(why, sizeof why, "it needs the avx512 kernels (isa: %s)", table);
    } else {
#if CPU_X86 && defined(CPU_HAVE_AMX)
        snprintf(why, sizeof why, "%s", c->amx_why);
        if (c->amx && amx_permit(why, sizeof why)) {
            *out = &cpu_bf16_gemv_amx;
            return MMRT_OK;
        }
#else
        snprintf(why, sizeof why, "this plugin was built without AMX");
#endif
    }
    snprintf(err, err_size, "cpu: device option amx_gemv=1: %s", why);
    return MMRT_ERR_CONFIG;
}

mmrt_status cpu_kernels_select(const struct cpu_kernel_options *o, struct cpu_kernels *out,
                               char *err, size_t err_size)
{
    const char *isa = o->isa;
    struct isa_caps c = isa_caps();
    const struct cpu_kernels *k = &cpu_kernels_portable;
    if (!isa || strcmp(isa, "auto") == 0) {
#if CPU_X86
        k = c.avx512 ? &cpu_kernels_avx512 : c.avx2 ? &cpu_kernels_avx2 : &cpu_kernels_portable;
#endif
    } else if (strcmp(isa, "portable") == 0) {
        k = &cpu_kernels_portable;
    } else if (strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0) {
        bool is512 = strcmp(isa, "avx512") == 0;
        if (!(is512 ? c.avx512 : c.avx2)) {
            snprintf(err, err_size, "cpu: device option isa=\"%s\": this CPU lacks %s", isa,
                     is512 ? "AVX-512 (F, BW, VL, DQ)" : "AVX2 with FMA and F16C");
            return MMRT_ERR_CONFIG;
        }
#if CPU_X86
        k = is512 ? &cpu_kernels_avx512 : &cpu_kernels_avx2;
#endif
    } else {
        snprintf(err, err_size, "cpu: device option isa=\"%s\": expected auto, avx512, avx2 or "
                 "portable", isa);
        return MMRT_ERR_CONFIG;
    }
    struct cpu_kernels t = *k;
    bool regs = false;
    mmrt_status st = bf16_unit(o->bf16_dot, &c, k->name, &t.bf16, err, err_size);
    if (st == MMRT_OK)
        st = q8_unit(o->int8_dot, &c, k->name, &t.q4q8, err, err_size);
    if (st == MMRT_OK)
        st = amd_choice("prefetch", o->prefetch, "l1", "l2", &t.q4q8_l2, err, err_size);
    if (st == MMRT_OK)
        st = gemv_unit(o->amx_gemv, &c, k->name, &t.bf16_gemv, err, err_size);
    if (st == MMRT_OK)
        st = amd_choice("gemv_widen", o->gemv_widen, "buffer", "registers", &regs, err,
                        err_size);
    if (st != MMRT_OK)
        return st;
    if (regs && k->gemv_regs) {
        t.gemv = k->gemv_regs;
        t.gemv_in_regs = true;
    }
    *out = t;
    return MMRT_OK;
}
