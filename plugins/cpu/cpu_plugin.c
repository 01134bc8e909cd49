/*
 * plugins/cpu/cpu_plugin.c — libmmrt_cpu.so: the entry point, the one device, its arenas
 * and transfers, and the op table.
 *
 * The device is this machine: arenas are host allocations (see struct cpu_arena), transfers
 * are memcpy, and kernels run synchronously on the calling thread plus the device's worker
 * pool, so everything issued is complete when a call returns and synchronize() has nothing to
 * wait for. State: the host table copied at init (for logging) and, per device, its pool,
 * arena list and last-error string. Nothing here is shared between devices.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_build_info.h"
#include "cpu_internal.h"

/* The host table as this plugin knows it, zero-extended (see mmrt_plugin_init). */
static struct mmrt_host g_host;

static void cpu_log(enum mmrt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void cpu_log(enum mmrt_log_level level, const char *fmt, ...)
{
    if (!g_host.log)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_host.log(g_host.user, level, CPU_PLUGIN_NAME, msg);
}

mmrt_status(cpu_fail)(struct mmrt_device *dev, mmrt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dev->err, sizeof dev->err, fmt, ap);
    va_end(ap);
    return st;
}

static void set_err(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t err_size, const char *fmt, ...)
{
    if (!err || err_size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

/* ---- machine facts -------------------------------------------------------------------- */

static uint64_t phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* MemAvailable from /proc/meminfo (what the kernel could hand out without swapping), or the
 * free page count where that file is missing. */
static uint64_t avail_bytes(void)
{
    uint64_t kb = 0;
    int found = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (!found && fgets(line, sizeof line, f))
            found = sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1;
        fclose(f);
    }
    if (found)
        return kb * 1024u;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* The processor's "model name" from /proc/cpuinfo, or "CPU" where there is none (some ARM
 * kernels do not print one). */
static void cpu_model_name(char *out, size_t size)
{
    snprintf(out, size, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *v = strchr(line, ':');
        if (!v)
            continue;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\r\n")] = '\0';
        if (*v)
            snprintf(out, size, "%s", v);
        break;
    }
    fclose(f);
}

/* ---- probe and devices ---------------------------------------------------------------- */

/* threads: worker count (default: every online CPU). isa: auto (default), avx512, avx2 or
 * portable — the kernel table (cpu_isa.c); a lower one than auto compares kernels or tests a
 * path. bf16_dot: 0 (default), 1, amx or avx512 — BF16 weights use the bf16 dot-product
 * GEMM (1: on AMX tiles where the CPU and kernel allow, else AVX512_BF16; amx, avx512: that
 * unit), which rounds activations to bf16 (faster prefill and vision, measured loss in
 * BENCHMARKS.md).
 * int8_dot: auto (default: 3, or 0 with the portable table), 0, 1 or 3 — U4 weights in the
 * GEMV (decode) meet x rounded per block of 32 to three int8 digits (3: 24 bits, as fine as
 * f32) or one (1: 8 bits) in integer dot products (AVX512_VNNI, else AVX2), which the one-row
 * INT4 GEMV needs to keep up with memory; 0 widens every code to f32 instead
 * (cpu_internal.h, struct cpu_q4_q8; accuracy in QUANTIZATION.md).
 * prefetch: auto (default: l2 on AMD cores, l1 on others), l1 or l2 — where that int8 GEMV
 * prefetches the next block of weight rows (cpu_prefetch_read; the same values either way).
 * amx_gemv: 0 (default) or 1 — BF16 weights in the GEMV (decode, up to 32 rows) run on AMX
 * tiles with x split exactly into three bf16 parts (cpu_internal.h, struct cpu_bf16_gemv):
 * as exact as the f32 GEMV, a batch's rows nearly free, one row alone 0–3 % slower.
 * gemv_widen: auto (default: registers on AMD cores, buffer on others), buffer or registers —
 * how the GEMV over more x rows than one pass takes widens F16, BF16 and I8 weights to f32:
 * once per K chunk into an L1 buffer, or in registers by every pass (the same bits).
 * weights: map (default) — run on the checkpoint's mapping in place (arena_adopt_host) — or
 * copy — decline, so the core copies them into anonymous memory (huge pages where the system
 * gives them; for a checkpoint on a slow or network file system, and to measure the two). */
static const char *const cpu_option_keys[] = { "threads",  "isa",      "bf16_dot",
                                               "int8_dot", "graph",    "weights",
                                               "prefetch", "amx_gemv", "gemv_widen",
                                               NULL };

static mmrt_status cpu_probe(int *n_devices, char *why, size_t why_size)
{
    if (!n_devices)
        return MMRT_ERR_INVALID_ARG;
    *n_devices = 1;
    set_err(why, why_size, "%s", "");
    return MMRT_OK;
}

/* `threads`: a decimal integer in [1, CPU_MAX_THREADS], nothing else (no sign, no spaces). */
static mmrt_status parse_threads(const char *value, int *out, char *err, size_t err_size)
{
    int64_t v = 0;
    const char *c = value;
    if (!*c)
        goto bad;
    for (; *c; c++) {
        if (*c < '0' || *c > '9')
            goto bad;
        v = v * 10 + (*c - '0');
        if (v > CPU_MAX_THREADS)
            goto bad;
    }
    if (v < 1)
        goto bad;
    *out = (int)v;
    return MMRT_OK;

bad:
    set_err(err, err_size, "cpu: device option threads=\"%s\": expected an integer from 1 to %d",
            value, CPU_MAX_THREADS);
    return MMRT_ERR_CONFIG;
}

static void cpu_device_close(struct mmrt_device *dev);

static mmrt_status cpu_device_open(int index, const struct mmrt_option *options, int n_options,
                                   struct mmrt_device **out, char *err, size_t err_size)
{
    struct mmrt_device *dev = NULL;
    mmrt_status st = MMRT_OK;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = online < 1 ? 1 : online > CPU_MAX_THREADS ? CPU_MAX_THREADS : (int)online;
    bool have_threads = false;
    const char *graph_value = NULL, *weights_value = NULL;
    struct cpu_kernel_options ko = { 0 };
    struct cpu_kernels kern;

    if (!out || n_options < 0 || (n_options > 0 && !options)) {
        set_err(err, err_size, "cpu: device_open: invalid arguments");
        return MMRT_ERR_INVALID_ARG;
    }
    if (index != 0) {
        set_err(err, err_size, "cpu: no device %d (the cpu plugin has only device 0)", index);
        return MMRT_ERR_NOT_FOUND;
    }
    for (int i = 0; i < n_options; i++) {
        const char *key = options[i].key, *value = options[i].value;
        if (!key || !value) {
            set_err(err, err_size, "cpu: device option %d has no key or no value", i);
            return MMRT_ERR_CONFIG;
        }
        const char **slot = strcmp(key, "isa") == 0          ? &ko.isa
                            : strcmp(key, "bf16_dot") == 0   ? &ko.bf16_dot
                            : strcmp(key, "int8_dot") == 0   ? &ko.int8_dot
                            : strcmp(key, "graph") == 0      ? &graph_value
                            : strcmp(key, "weights") == 0    ? &weights_value
                            : strcmp(key, "prefetch") == 0   ? &ko.prefetch
                            : strcmp(key, "amx_gemv") == 0   ? &ko.amx_gemv
                            : strcmp(key, "gemv_widen") == 0 ? &ko.gemv_widen
                                                             : NULL;
        if (slot) {
            if (*slot) {
                set_err(err, err_size, "cpu: device option %s given twice (second: \"%s\")",
                        key, value);
                return MMRT_ERR_CONFIG;
            }
            *slot = value;
            continue;
        }
        if (strcmp(key, "threads") != 0) {
            set_err(err, err_size,
                    "cpu: unknown device option %s=\"%s\" (the cpu plugin knows: threads, isa, "
                    "bf16_dot, int8_dot, graph, weights, prefetch, amx_gemv, gemv_widen)",
                    key, value);
            return MMRT_ERR_CONFIG;
        }
        if (have_threads) {
            set_err(err, err_size, "cpu: device option threads given twice (second: \"%s\")",
                    value);
            return MMRT_ERR_CONFIG;
        }
        have_threads = true;
        st = parse_threads(value, &n_threads, err, err_size);
        if (st != MMRT_OK)
            return st;
    }

    if (graph_value && strcmp(graph_value, "0") != 0 && strcmp(graph_value, "1") != 0) {
        set_err(err, err_size, "cpu: device option graph=\"%s\": expected 0 or 1", graph_value);
        return MMRT_ERR_CONFIG;
    }
    if (weights_value && strcmp(weights_value, "map") != 0 &&
        strcmp(weights_value, "copy") != 0) {
        set_err(err, err_size, "cpu: device option weights=\"%s\": expected map or copy",
                weights_value);
        return MMRT_ERR_CONFIG;
    }
    st = cpu_kernels_select(&ko, &kern, err, err_size);
    if (st != MMRT_OK)
        return st;

    dev = calloc(1, sizeof *dev);
    if (!dev) {
        set_err(err, err_size, "cpu: cannot allocate the device");
        return MMRT_ERR_NO_MEMORY;
    }
    char why[256] = "";
    st = cpu_pool_init(&dev->pool, n_threads, why, sizeof why);
    if (st != MMRT_OK) {
        set_err(err, err_size, "cpu: %s", why);
        goto fail;
    }
    dev->kern = kern;
    dev->graph_enabled = graph_value && graph_value[0] == '1';
    dev->copy_weights = weights_value && strcmp(weights_value, "copy") == 0;
    /* Per thread: a converted W block (blocked: NC × KC; portable: MM_NB × MM_KB) and a C
     * block of up to GEMM_MC (+ one panel) rows × NC (cpu_ops_matmul.c); both sizes are
     * multiples of 16 floats, so threads never share a cache line. */
    dev->gemm_scratch_floats = (size_t)CPU_GEMM_NC * CPU_GEMM_KC +
                               (size_t)(CPU_GEMM_MC + CPU_GEMM_MAX_MR) * CPU_GEMM_NC;
    size_t scratch = (size_t)n_threads * dev->gemm_scratch_floats * sizeof(float);
    if (posix_memalign((void **)&dev->gemm_scratch, CPU_ALIGN, scratch) != 0) {
        dev->gemm_scratch = NULL;
        set_err(err, err_size, "cpu: cannot allocate %zu bytes of GEMM scratch", scratch);
        st = MMRT_ERR_NO_MEMORY;
        goto fail;
    }
    char model[80], caps[64];
    cpu_model_name(model, sizeof model);
    /* The kernels' part ends the name and must survive plugin.h's 128-byte name (mmrt-bench
     * reads the units from it): a long model name gives way instead. */
    char tail[96];
    snprintf(tail, sizeof tail, " (%d thread%s) [%s%s%s%s%s%s%s%s]", n_threads,
             n_threads == 1 ? "" : "s", kern.name,
             !kern.q4q8 ? "" : kern.q4q8->digits == 1 ? "+int8_dot:" : "+int8_dot=3:",
             kern.q4q8 ? kern.q4q8->unit : "", kern.q4q8 && kern.q4q8_l2 ? "/l2" : "",
             kern.bf16 ? "+bf16_dot:" : "", kern.bf16 ? kern.bf16->unit : "",
             kern.bf16_gemv ? "+amx_gemv" : "", kern.gemv_in_regs ? "+gemv_regs" : "");
    snprintf(dev->name, sizeof dev->name, "%.*s%s", (int)(CPU_DEVICE_NAME_MAX - strlen(tail)),
             model, tail);
    dev->total_bytes = phys_bytes();
    cpu_isa_describe(caps, sizeof caps);
    cpu_log(MMRT_LOG_DEBUG, "device 0: %s; CPU features: %s", dev->name, caps);
    *out = dev;
    return MMRT_OK;

fail:
    cpu_device_close(dev);
    return st;
}

static void cpu_device_close(struct mmrt_device *dev)
{
    if (!dev)
        return;
    cpu_capture_abandon(dev);
    cpu_pool_deinit(&dev->pool);
    int n_left = 0;
    while (dev->arenas) {
        struct cpu_arena *a = dev->arenas;
        dev->arenas = a->next;
        free(a);
        n_left++;
    }
    if (n_left)
        cpu_log(MMRT_LOG_DEBUG, "device_close freed %d arena%s still allocated", n_left,
                n_left == 1 ? "" : "s");
    free(dev->gemm_scratch);
    free(dev->xpack);
    free(dev);
}

static mmrt_status cpu_device_info(struct mmrt_device *dev, struct mmrt_device_info *info)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!info || info->hdr.struct_size < sizeof info->hdr)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "device_info: no info struct or a struct_size "
                        "smaller than its header");
    struct mmrt_device_info full;
    memset(&full, 0, sizeof full);
    full.hdr = info->hdr;
    snprintf(full.name, sizeof full.name, "%s", dev->name);
    snprintf(full.kind, sizeof full.kind, "cpu");
    full.total_bytes = dev->total_bytes;
    full.free_bytes = avail_bytes();
    if (full.free_bytes > full.total_bytes)
        full.free_bytes = full.total_bytes;
    full.max_arena_bytes = dev->total_bytes;
    full.alignment = CPU_ALIGN;
    size_t n = info->hdr.struct_size < sizeof full ? info->hdr.struct_size : sizeof full;
    memcpy(info, &full, n);
    return MMRT_OK;
}

/* ---- arenas and transfers ------------------------------------------------------------- */

struct cpu_arena *cpu_arena_find(struct mmrt_device *dev, const void *handle)
{
    for (struct cpu_arena *a = dev->arenas; a; a = a->next)
        if ((const void *)a == handle)
            return a;
    return NULL;
}

static void arena_link(struct mmrt_device *dev, struct cpu_arena *a)
{
    a->prev = NULL;
    a->next = dev->arenas;
    if (dev->arenas)
        dev->arenas->prev = a;
    dev->arenas = a;
}

static mmrt_status cpu_arena_alloc(struct mmrt_device *dev, uint64_t nbytes, void **arena)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!arena)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "arena_alloc: no output pointer");
    /* Refuse what cannot fit before asking the allocator: a request far beyond memory would
     * otherwise reach malloc (where sanitizer runtimes abort instead of returning NULL). */
    if (nbytes > dev->total_bytes || nbytes > SIZE_MAX - CPU_ARENA_HDR)
        return cpu_fail(dev, MMRT_ERR_OUT_OF_POOL,
                        "arena_alloc: %" PRIu64 " bytes is more than this machine's %" PRIu64
                        " bytes of memory", nbytes, dev->total_bytes);
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGN, CPU_ARENA_HDR + (size_t)nbytes) != 0)
        return cpu_fail(dev, MMRT_ERR_OUT_OF_POOL,
                        "arena_alloc: cannot allocate %" PRIu64 " bytes of host memory", nbytes);
    struct cpu_arena *a = p;
    a->nbytes = nbytes;
    a->data = (char *)a + CPU_ARENA_HDR;
    a->readonly = false;
#ifdef MADV_HUGEPAGE
    /* Large arenas hold weights that decode streams every step: ask for transparent huge
     * pages (where the system has them in "madvise" mode) so the stream is not slowed by a
     * TLB miss every 4 KiB. Only the 2 MiB-aligned interior can be backed by huge pages; a
     * refusal changes nothing but speed, so the result is ignored. */
    if (nbytes >= (8u << 20)) {
        const uintptr_t huge = 2u << 20;
        uintptr_t lo = ((uintptr_t)cpu_arena_data(a) + huge - 1) & ~(huge - 1);
        uintptr_t hi = ((uintptr_t)cpu_arena_data(a) + nbytes) & ~(huge - 1);
        if (hi > lo)
            (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    }
#endif
    arena_link(dev, a);
    *arena = a;
    return MMRT_OK;
}

/* The mapping is the core's; the arena is only a header naming it, so the kernels see the
 * checkpoint's bytes where the page cache holds them. */
static mmrt_status cpu_arena_adopt_host(struct mmrt_device *dev, const void *host,
                                        uint64_t nbytes, void **arena)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!arena || (!host && nbytes))
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "arena_adopt_host: no %s",
                        arena ? "host memory" : "output pointer");
    if (dev->copy_weights)
        return cpu_fail(dev, MMRT_ERR_UNSUPPORTED, "weights = copy was asked for");
    if (nbytes > (uint64_t)(UINTPTR_MAX - (uintptr_t)host))
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "arena_adopt_host: %" PRIu64 " bytes at %p "
                        "wrap the address space", nbytes, host);
    struct cpu_arena *a = NULL;
    if (posix_memalign((void **)&a, CPU_ALIGN, CPU_ARENA_HDR) != 0)
        return cpu_fail(dev, MMRT_ERR_NO_MEMORY, "arena_adopt_host: out of host memory");
    a->nbytes = nbytes;
    a->data = (char *)(uintptr_t)host; /* never written through: readonly is checked first */
    a->readonly = true;
    arena_link(dev, a);
    *arena = a;
    return MMRT_OK;
}

static void cpu_arena_free(struct mmrt_device *dev, void *arena)
{
    if (!dev || !arena)
        return;
    struct cpu_arena *a = cpu_arena_find(dev, arena);
    if (!a) {
        cpu_log(MMRT_LOG_WARN, "arena_free: %p is not an arena of this device; ignored", arena);
        return;
    }
    if (a->prev)
        a->prev->next = a->next;
    else
        dev->arenas = a->next;
    if (a->next)
        a->next->prev = a->prev;
    free(a);
}

/* The host address of bytes [offset, offset + nbytes) of `arena`, after checking both. */
static mmrt_status arena_range(struct mmrt_device *dev, const char *fn, void *arena,
                               uint64_t offset, uint64_t nbytes, bool write, char **out)
{
    struct cpu_arena *a = arena ? cpu_arena_find(dev, arena) : NULL;
    if (!a)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "%s: %p is not an arena of this device", fn,
                        arena);
    if (write && a->readonly)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "%s: arena %p is adopted read-only memory",
                        fn, arena);
    if (offset > a->nbytes || nbytes > a->nbytes - offset)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG,
                        "%s: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64 ") lie outside the arena "
                        "of %" PRIu64 " bytes", fn, offset, offset, nbytes, a->nbytes);
    *out = cpu_arena_data(a) + offset;
    return MMRT_OK;
}

static mmrt_status cpu_upload(struct mmrt_device *dev, void *arena, uint64_t offset,
                              const void *src, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    char *p = NULL; /* set by arena_range; initialised for -O3's flow analysis */
    mmrt_status st = arena_range(dev, "upload", arena, offset, nbytes, true, &p);
    if (st != MMRT_OK)
        return st;
    if (nbytes && !src)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "upload: no source buffer");
    if (cpu_capturing(dev))
        return cpu_capture_upload(dev, arena, offset, src, nbytes);
    if (nbytes)
        memcpy(p, src, nbytes);
    return MMRT_OK;
}

static mmrt_status cpu_download(struct mmrt_device *dev, void *dst, void *arena, uint64_t offset,
                                uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (cpu_capturing(dev))
        return cpu_capture_refuse(dev, "download");
    char *p = NULL;
    mmrt_status st = arena_range(dev, "download", arena, offset, nbytes, false, &p);
    if (st != MMRT_OK)
        return st;
    if (nbytes && !dst)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "download: no destination buffer");
    if (nbytes)
        memcpy(dst, p, nbytes);
    return MMRT_OK;
}

static mmrt_status cpu_copy(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                            void *src_arena, uint64_t src_offset, uint64_t nbytes)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    char *d = NULL, *s = NULL;
    mmrt_status st = arena_range(dev, "copy (dst)", dst_arena, dst_offset, nbytes, true, &d);
    if (st == MMRT_OK)
        st = arena_range(dev, "copy (src)", src_arena, src_offset, nbytes, false, &s);
    if (st != MMRT_OK)
        return st;
    if (cpu_capturing(dev))
        return cpu_capture_copy(dev, dst_arena, dst_offset, src_arena, src_offset, nbytes);
    if (nbytes)
        memmove(d, s, nbytes); /* the ranges may overlap within one arena */
    return MMRT_OK;
}

static mmrt_status cpu_synchronize(struct mmrt_device *dev)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    return cpu_capturing(dev) ? cpu_capture_refuse(dev, "synchronize") : MMRT_OK;
}

static const char *cpu_last_error(struct mmrt_device *dev)
{
    return dev ? dev->err : "no device";
}

/* ---- op table and entry point --------------------------------------------------------- */

const mmrt_kernel_fn cpu_kernel_table[MMRT_OP_COUNT] = {
    [MMRT_OP_MATMUL] = cpu_op_matmul,
    [MMRT_OP_ADD] = cpu_op_add,
    [MMRT_OP_MUL] = cpu_op_mul,
    [MMRT_OP_SCALE] = cpu_op_scale,
    [MMRT_OP_LAYERNORM] = cpu_op_layernorm,
    [MMRT_OP_RMSNORM] = cpu_op_rmsnorm,
    [MMRT_OP_GELU] = cpu_op_gelu,
    [MMRT_OP_GELU_TANH] = cpu_op_gelu_tanh,
    [MMRT_OP_QUICK_GELU] = cpu_op_quick_gelu,
    [MMRT_OP_SILU] = cpu_op_silu,
    [MMRT_OP_SWIGLU] = cpu_op_swiglu,
    [MMRT_OP_RELU2] = cpu_op_relu2,
    [MMRT_OP_SOFTMAX] = cpu_op_softmax,
    [MMRT_OP_ROPE] = cpu_op_rope,
    [MMRT_OP_ATTENTION] = cpu_op_attention,
    [MMRT_OP_GET_ROWS] = cpu_op_get_rows,
    [MMRT_OP_PATCH_EMBED] = cpu_op_patch_embed,
    [MMRT_OP_CONCAT] = cpu_op_concat,
    [MMRT_OP_COPY] = cpu_op_copy,
    [MMRT_OP_ARGMAX] = cpu_op_argmax,
    [MMRT_OP_ROPE_MULTI] = cpu_op_rope_multi,
    [MMRT_OP_SET_ROWS] = cpu_op_set_rows,
    [MMRT_OP_ATTENTION_PAGED] = cpu_op_attention_paged,
    [MMRT_OP_GATHER_HEADS] = cpu_op_gather_heads,
    [MMRT_OP_L2_NORM] = cpu_op_l2_norm,
};

/* What the core calls: each op enters through cpu_dispatch with its own slot, which runs the
 * kernel or, while a graph is being captured, records the launch (cpu_graph.c). */
#define CPU_ENTRY(OP, fn)                                                                      \
    static mmrt_status fn(struct mmrt_device *dev, const struct mmrt_op_args *args)          \
    {                                                                                      \
        return cpu_dispatch(dev, args, OP);                                                \
    }
CPU_ENTRY(MMRT_OP_MATMUL, entry_matmul)
CPU_ENTRY(MMRT_OP_ADD, entry_add)
CPU_ENTRY(MMRT_OP_MUL, entry_mul)
CPU_ENTRY(MMRT_OP_SCALE, entry_scale)
CPU_ENTRY(MMRT_OP_LAYERNORM, entry_layernorm)
CPU_ENTRY(MMRT_OP_RMSNORM, entry_rmsnorm)
CPU_ENTRY(MMRT_OP_GELU, entry_gelu)
CPU_ENTRY(MMRT_OP_GELU_TANH, entry_gelu_tanh)
CPU_ENTRY(MMRT_OP_QUICK_GELU, entry_quick_gelu)
CPU_ENTRY(MMRT_OP_SILU, entry_silu)
CPU_ENTRY(MMRT_OP_SWIGLU, entry_swiglu)
CPU_ENTRY(MMRT_OP_RELU2, entry_relu2)
CPU_ENTRY(MMRT_OP_SOFTMAX, entry_softmax)
CPU_ENTRY(MMRT_OP_ROPE, entry_rope)
CPU_ENTRY(MMRT_OP_ATTENTION, entry_attention)
CPU_ENTRY(MMRT_OP_GET_ROWS, entry_get_rows)
CPU_ENTRY(MMRT_OP_PATCH_EMBED, entry_patch_embed)
CPU_ENTRY(MMRT_OP_CONCAT, entry_concat)
CPU_ENTRY(MMRT_OP_COPY, entry_copy)
CPU_ENTRY(MMRT_OP_ARGMAX, entry_argmax)
CPU_ENTRY(MMRT_OP_ROPE_MULTI, entry_rope_multi)
CPU_ENTRY(MMRT_OP_SET_ROWS, entry_set_rows)
CPU_ENTRY(MMRT_OP_ATTENTION_PAGED, entry_attention_paged)
CPU_ENTRY(MMRT_OP_GATHER_HEADS, entry_gather_heads)
CPU_ENTRY(MMRT_OP_L2_NORM, entry_l2_norm)
#undef CPU_ENTRY

static const mmrt_kernel_fn cpu_ops[MMRT_OP_COUNT] = {
    [MMRT_OP_MATMUL] = entry_matmul,
    [MMRT_OP_ADD] = entry_add,
    [MMRT_OP_MUL] = entry_mul,
    [MMRT_OP_SCALE] = entry_scale,
    [MMRT_OP_LAYERNORM] = entry_layernorm,
    [MMRT_OP_RMSNORM] = entry_rmsnorm,
    [MMRT_OP_GELU] = entry_gelu,
    [MMRT_OP_GELU_TANH] = entry_gelu_tanh,
    [MMRT_OP_QUICK_GELU] = entry_quick_gelu,
    [MMRT_OP_SILU] = entry_silu,
    [MMRT_OP_SWIGLU] = entry_swiglu,
    [MMRT_OP_RELU2] = entry_relu2,
    [MMRT_OP_SOFTMAX] = entry_softmax,
    [MMRT_OP_ROPE] = entry_rope,
    [MMRT_OP_ATTENTION] = entry_attention,
    [MMRT_OP_GET_ROWS] = entry_get_rows,
    [MMRT_OP_PATCH_EMBED] = entry_patch_embed,
    [MMRT_OP_CONCAT] = entry_concat,
    [MMRT_OP_COPY] = entry_copy,
    [MMRT_OP_ARGMAX] = entry_argmax,
    [MMRT_OP_ROPE_MULTI] = entry_rope_multi,
    [MMRT_OP_SET_ROWS] = entry_set_rows,
    [MMRT_OP_ATTENTION_PAGED] = entry_attention_paged,
    [MMRT_OP_GATHER_HEADS] = entry_gather_heads,
    [MMRT_OP_L2_NORM] = entry_l2_norm,
};

static const struct mmrt_plugin cpu_plugin = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_plugin),
    .name = CPU_PLUGIN_NAME,
#if defined(CPU_AMX_EMULATE)
    .version = "0.1.0 (" CPU_BUILD_INFO "; AMX emulated in C, a test build)",
#else
    .version = "0.1.0 (" CPU_BUILD_INFO ")",
#endif
    .probe = cpu_probe,
    .device_open = cpu_device_open,
    .device_close = cpu_device_close,
    .device_info = cpu_device_info,
    .arena_alloc = cpu_arena_alloc,
    .arena_free = cpu_arena_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .last_error = cpu_last_error,
    .ops = cpu_ops,
    .n_ops = MMRT_OP_COUNT,
    .option_keys = cpu_option_keys,
    .shutdown = NULL,
    .capture_begin = cpu_capture_begin,
    .capture_end = cpu_capture_end,
    .graph_launch = cpu_graph_launch,
    .graph_destroy = cpu_graph_destroy,
    .prepare = NULL,
    .arena_adopt_host = cpu_arena_adopt_host,
};

MMRT_PLUGIN_EXPORT const struct mmrt_plugin *mmrt_plugin_init(const struct mmrt_host *host)
{
    /* Without a log member there is nowhere to say why we refuse. */
    size_t need = offsetof(struct mmrt_host, log) + sizeof host->log;
    if (!host || host->hdr.struct_size < need || !host->log)
        return NULL;
    return mmrt_plugin_adopt_host(host, &g_host, CPU_PLUGIN_NAME) ? &cpu_plugin : NULL;
}
