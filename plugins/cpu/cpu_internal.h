/*
 * plugins/cpu/cpu_internal.h — what the files of the CPU reference plugin share: the device
 * with its arenas and worker pool, resolved tensor views, argument checks, f16/bf16
 * conversions, the f32 dot product and the kernels.
 *
 * Nothing here crosses the plugin boundary; the only exported symbol is mmrt_plugin_init in
 * cpu_plugin.c. Files:
 *   cpu_plugin.c           entry point, probe, device open/info/close, arenas, transfers
 *   cpu_threads.c          the per-device worker pool (fork/join)
 *   cpu_args.c             argument resolution and checks shared by every kernel
 *   cpu_ops_matmul.c       MATMUL, PATCH_EMBED (one blocked GEMM)
 *   cpu_ops_elementwise.c  ADD, MUL, SCALE, the activations, SWIGLU
 *   cpu_ops_rows.c         LAYERNORM, RMSNORM, SOFTMAX, ARGMAX, L2_NORM, GET_ROWS,
 *                          GATHER_HEADS, SET_ROWS
 *   cpu_ops_attention.c    ROPE, ROPE_MULTI, ATTENTION
 *   cpu_ops_copy.c         COPY, CONCAT
 *   cpu_graph.c            graph capture and replay (option graph = 1), the op dispatcher
 *   cpu_isa.c              run-time CPU feature detection and the choice of kernel table
 *   cpu_kern_avx2.c        GEMM / GEMV / attention kernels for AVX2 + FMA + F16C
 *   cpu_kern_avx512.c      the same for AVX-512 (F, BW, VL, DQ)
 *   cpu_kern_kv_rows.h     decode attention's per-run entry points, shared by those two
 *   cpu_kern_avx512bf16.c  the optional bf16 dot-product GEMM (`bf16_dot`) on AVX512_BF16
 *   cpu_kern_amx.c         the same on AMX-BF16 tiles (CPUs with AMX; also built emulated in C
 *                          as the test-only plugin mmrt_cpu_amxemu, to check it without one)
 *   cpu_kern_avx512vnni.c  the int8 dot-product U4 GEMV (`int8_dot`) on AVX512_VNNI
 *                          (its AVX2 twin is in cpu_kern_avx2.c; the block driver both
 *                          share in cpu_kern_q8_gemv.h)
 *
 * ISA-specific code lives only in the cpu_kern_*.c files, each compiled with its own -m flags
 * (plugins/cpu/CMakeLists.txt); everything else is built for baseline x86-64 (or any other
 * architecture) and reaches those kernels through the function pointers of struct
 * cpu_kernels, chosen once at device_open from what the CPU reports. So one build runs on
 * any x86-64, and a kernel is only ever entered on a CPU that has its instructions.
 *
 * Numerics: the plugin is the in-tree reference, so every kernel accumulates in f32 (double
 * where it is cheap and only makes the statistic more exact: norm moments, softmax sums) and
 * keeps weights in their own dtype, converting them per element or per small block while it
 * computes. No -ffast-math: results do not depend on the thread count. Two device options
 * trade this for speed, each with its own exact definition and measured cost: bf16_dot
 * (activations rounded to bf16 in the GEMM) and int8_dot = 1 (to int8 per block of 32 in the
 * U4 GEMV). The U4 GEMV's default, int8_dot = 3, rounds x to 24 bits per block, as fine as
 * f32 itself, and is held to the exact product as closely as the f32 GEMV is.
 *
 * Summation order: a result may depend on the shape of an op and on the kernel table (the
 * ISA), never on the thread count or on how work is split. The blocked GEMM accumulates each
 * output as one fused multiply-add chain in k order (storing and reloading an f32 partial sum
 * between K panels is exact), the GEMV and the dot products use a fixed set of lanes along k
 * and a fixed reduction tree. The portable table keeps the 8-lane order of cpu_dot_f32.
 */
#ifndef MMRT_CPU_INTERNAL_H
#define MMRT_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "mmrt/plugin.h"

#define CPU_PLUGIN_NAME "cpu"
#define CPU_ALIGN 64          /* arena alignment and the alignment device_info reports */
#define CPU_MAX_THREADS 1024  /* refuse absurd `threads` values instead of failing later */
#define CPU_ERR_MAX 1024
#define CPU_MAX_HEAD_DIM 256  /* ATTENTION's D limit from plugin.h */

/* Portable GEMM tiling (cpu_ops_matmul.c, used when the kernel table has no micro-kernel): a
 * tile is MM_NB rows of W times MM_MB rows of x, walked in panels of MM_KB along K. A converted
 * W panel (MM_NB × MM_KB floats) is per-thread scratch. */
#define CPU_MM_NB 16
#define CPU_MM_MB 32
#define CPU_MM_KB 256

/* Blocked GEMM (cpu_ops_matmul.c with a micro-kernel from cpu_kern_*.c), BLIS-style:
 *   x is packed once per call into panels of MR rows, k-major ([kc][MR]), per K block;
 *   one parallel item is GEMM_NC columns (W rows) × up to GEMM_MC rows of x; for each K block
 *   of GEMM_KC it converts and transposes its W rows into [NC/NR][kc][NR] (per-thread scratch,
 *   ~L2), then runs the MR × NR micro-kernel over every (W micro-panel, x panel) pair, W
 *   micro-panel outermost so it stays in L1 while the x panels stream from L2. The item's
 *   C block ([rows][NC], per-thread scratch) holds the partial sums between K blocks.
 * KC counts k elements; in bf16-dot mode a K block holds 2·GEMM_KC elements (same bytes).
 * KC = 128, 192, 256 and 384 measured within noise of each other (single thread, 577 × 4096
 * × 4096); 256 keeps the W micro-panel (32 KiB) inside a 48 KiB L1. */
#define CPU_GEMM_KC 256
#define CPU_GEMM_NC 128     /* a multiple of every kernel's NR */
#define CPU_GEMM_MC 768     /* rows of x per item when M is larger */
#define CPU_GEMM_MAX_MR 32 /* no micro-tile is taller (AMX: 32; scratch sizing) */
/* M ≤ this runs the bandwidth-bound GEMV instead (decode steps of up to this many sequences,
 * and the last-row lm_head). A contract, relied on by continuous batching (engine.md §5):
 * for every M ≤ CPU_GEMV_MAX_M, each output row of MATMUL is bit-identical to what M = 1
 * gives for that row (same x row, W, bias, kernel table), because the GEMV computes every
 * output with the same lanes along k, the same chain per lane and the same reduction tree
 * whatever the number of x rows or how they are grouped. Above it the blocked GEMM runs, whose
 * rows are also independent of M and of each other (one FMA chain per output in k order), but
 * differ in their last bits from the GEMV's. The portable table (no gemv) has one order for
 * every M. test_cpu_isa checks all of this bit for bit on every table. */
#define CPU_GEMV_MAX_M 32
/* plugin.h's mmrt_device_info.name holds this many characters and its NUL. */
#define CPU_DEVICE_NAME_MAX 127
/* ATTENTION and ATTENTION_PAGED (cpu_ops_attention.c): sequences of at most this many
 * queries (decode) stream K and V once per (sequence, kv head); longer ones run blocked on
 * the GEMM micro-kernel with about this many micro-panels of (query, head) rows per item. The
 * choice is made per sequence, so a sequence's result does not depend on its batch. */
#define CPU_ATTN_DOT_MAX_Q 4
#define CPU_ATTN_BLOCK_PANELS 8

/* The GEMV's widened path (cpu_kern_avx2.c, cpu_kern_avx512.c): the next W block's lines at
 * the current K chunk, prefetched into L2 a few at a time over all the passes of that chunk,
 * so memory keeps streaming while the passes compute (a burst in the first pass left it idle
 * during the others: at M = 8 the step ran at 20 GB/s instead of 23.5). */
struct cpu_gemv_prefetch {
    const char *base; /* next block at the chunk's first k, or NULL: nothing to fetch */
    int64_t rowb;     /* bytes between W rows */
    int64_t total;    /* lines to fetch: R rows × lines per row in the chunk */
    int64_t steps;    /* k steps of all the chunk's passes */
    int64_t next, q;  /* next line; total · steps taken, modulo steps */
};

static inline __attribute__((always_inline)) void
cpu_gemv_prefetch_step(struct cpu_gemv_prefetch *c, const int R)
{
    c->q += c->total;
    while (c->q >= c->steps && c->next < c->total) {
        const int64_t l = c->next++;
        __builtin_prefetch(c->base + (l % R) * c->rowb + (l / R) * 64, 0, 2);
        c->q -= c->steps;
    }
}

/* ---- arenas --------------------------------------------------------------------------- */

/* An allocated arena is a single CPU_ALIGN-aligned allocation: this header padded to
 * CPU_ARENA_HDR bytes, then nbytes of data. An adopted arena (arena_adopt_host: weights used
 * in place from the checkpoint's read-only mapping) is this header alone, pointing at memory
 * the core owns; it is read-only, because the mapping is PROT_READ and a write would be a
 * SIGSEGV instead of an error. The handle given to the core is the header's address. The
 * device keeps its arenas in a doubly linked list so that (1) device_close frees whatever the
 * core left behind and (2) every handle the core passes in is looked up before anything
 * dereferences it, so a stale or foreign handle is an error, not a crash. */
struct cpu_arena {
    struct cpu_arena *prev, *next;
    uint64_t nbytes;
    char *data;    /* first byte: just past the header, or the adopted memory */
    bool readonly; /* adopted: upload, copy and kernels refuse to write into it */
};
#define CPU_ARENA_HDR 64

static inline char *cpu_arena_data(struct cpu_arena *a)
{
    return a->data;
}

/* ---- worker pool (cpu_threads.c) ------------------------------------------------------ */

/* A parallel loop body: processes items [begin, end). `tid` is in [0, n_threads) and is
 * unique among the threads running one loop, so it indexes per-thread scratch. */
typedef void (*cpu_task_fn)(void *ctx, int tid, int64_t begin, int64_t end);

struct cpu_worker;

/* Fork/join pool: n_threads - 1 persistent workers plus the calling thread. One loop runs at
 * a time (a device is driven by one host thread at a time). A loop is published by bumping
 * the atomic `generation` (release) after its fields are written; workers claim chunks of it
 * through the atomic `next` counter (dynamic scheduling, so a causal attention's uneven rows
 * balance); the caller works too and then waits until `n_running` drops to 0. Both waits spin
 * briefly before they sleep on `wake` / `done`: a decode step issues dozens of short loops
 * back to back, and a futex wake-up per loop would cost more than the loops' gaps. */
struct cpu_pool {
    int n_threads;
    struct cpu_worker *workers; /* [n_threads - 1] */
    int n_started;              /* workers whose thread was created */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t generation; /* bumped once per parallel loop */
    _Atomic int n_running;       /* workers still inside the current loop */
    _Atomic bool stop;
    /* The current loop; written before generation is bumped, read after it is seen. */
    cpu_task_fn fn;
    void *ctx;
    int64_t n_items, min_chunk;
    _Atomic int64_t next;
    int spin_rounds; /* pause instructions a wait spins through, about CPU_SPIN_NS */
};

/* Starts n_threads - 1 workers. On failure writes a message into err and stops any started. */
mmrt_status cpu_pool_init(struct cpu_pool *pool, int n_threads, char *err, size_t err_size);
/* Stops and joins the workers. Safe on a zeroed or partially initialised pool. */
void cpu_pool_deinit(struct cpu_pool *pool);
/* Runs fn over [0, n_items) and returns when every item is done. `cost` is the rough work of
 * one item (in multiply-adds); loops too small to repay a wake-up run on the caller alone. */
void cpu_parallel_for(struct cpu_pool *pool, int64_t n_items, double cost, cpu_task_fn fn,
                      void *ctx);

/* ---- the device ----------------------------------------------------------------------- */

/* ---- ISA kernels (cpu_isa.c, cpu_kern_*.c) -------------------------------------------- */

/* GEMM micro-kernel: one full MR × NR tile,
 *     c[i·ldc + j] = (accumulate ? c[i·ldc + j] : 0) + Σ_{k < kc} xp[k·MR + i] · wp[k·ldw + j]
 * as one fused multiply-add chain per output in k order. xp is a packed x panel
 * (cpu_kernels.pack_x layout), wp a packed W micro-panel (ldw = NR) or any k-major f32 block
 * with NR readable columns per row (attention passes V rows directly). */
typedef void (*cpu_micro_fn)(const float *xp, const float *wp, int64_t ldw, int64_t kc,
                             float *c, int64_t ldc, int accumulate);

/* The BF16 GEMV on AMX tiles (device option amx_gemv; cpu_kern_amx.c): MATMUL with BF16
 * weights and M ≤ CPU_GEMV_MAX_M rows, decode over a batch. Each x value is split exactly
 * into three bf16 parts (8 + 8 + 8 significant bits), so every product on the tiles is exact
 * and nothing is rounded to bf16; each part has its own tile column and its own sums, added
 * at the end as p0 + (p1 + p2). A row's result depends on its x row alone, never on M, the
 * other rows or the thread, so the GEMV's bit-identity for every M holds (CPU_GEMV_MAX_M);
 * the bits differ from the f32 GEMV's, as close to the exact product or closer (test_cpu_isa
 * test_amx_gemv; docs/BENCHMARKS.md). */
struct cpu_bf16_gemv {
    const char *unit; /* "amx", "amx-emulated" */
    /* bytes of the packed x for M rows of K values */
    size_t (*xbytes)(int64_t M, int64_t K);
    /* the parts of x's K values in 32-column chunks [c0, c1) into xp (all chunks: xbytes) */
    void (*pack_x)(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t c0, int64_t c1,
                   uint16_t *xp);
    /* y[m·ldy + n] = Σ_k x[m][k]·w[n·ldw + k] for m < M, n0 ≤ n < n1 (no bias) */
    void (*rows)(const uint16_t *xp, int64_t M, int64_t K, const uint16_t *w, int64_t ldw,
                 int64_t n0, int64_t n1, float *y, int64_t ldy);
    void (*begin)(void), (*end)(void); /* around rows on each thread (tile config) */
};

/* The bf16 dot-product GEMM (device option bf16_dot): BF16 weights times activations rounded
 * to bf16, products exact, f32 sums carried from step to step in k order, with steps fixed by
 * the K block and not by M or the thread (so results do not depend on threads or M). A step
 * is one pair on avx512_bf16; on AMX it is one TDPBF16PS, which sums its 32 products among
 * themselves at a precision of its own before adding them (cpu_kern_amx.c), so the two units
 * differ in the last bits. Two units implement it, each with its own x layout:
 *   avx512_bf16 (cpu_kern_avx512bf16.c): vdpbf16ps, x as [kp][mr] pairs (one broadcast per row);
 *   amx (cpu_kern_amx.c): AMX-BF16 tiles, x as [mr][kp] pairs (the A tile's rows).
 * Both take W as [kp][nr] pairs (the VNNI layout: element k of column j in the low half of
 * pair k/2, k+1 in the high half) and zero pairs and rows past the data, so a padded pair or
 * row adds exact zeros. kp is the K block's pair count rounded up to kalign. */
struct cpu_bf16_gemm {
    const char *unit; /* "avx512_bf16", "amx" (the device's name says which one runs) */
    int mr, nr, kalign;
    /* k elements per K block, even and at most 2 · CPU_GEMM_KC (the W scratch holds NC × KC
     * floats, i.e. NC × 2·KC bf16 values). The unit picks it for its caches: AMX's x and W
     * micro-panels (32 rows or columns × kc/2 pairs each) should fit L1 together. */
    int kc;
    /* x rows < rows (zeros up to mr) over kc values into the unit's layout of kp pairs */
    void (*pack_x)(const float *x, int64_t ldx, int64_t rows, int64_t kc, int64_t kp,
                   uint32_t *dst);
    /* W rows < cols (zeros up to nr) over kc values: dst[p·nr + j], p < kp */
    void (*pack_w)(const uint16_t *w, int64_t ldw, int64_t cols, int64_t kc, int64_t kp,
                   uint32_t *dst);
    /* c[i·ldc + j] (+)= Σ_p pair products, i < mr, j < nr */
    void (*micro)(const uint32_t *xp, const uint32_t *wp, int64_t kp, float *c, int64_t ldc,
                  int accumulate);
    /* Around each thread's run of micro calls (AMX: load the tile configuration, then release
     * the tiles so the thread leaves no tile state behind); NULL when not needed. */
    void (*begin)(void);
    void (*end)(void);
};

/* Int8 dot products for U4 weights (device option int8_dot): in the GEMV (M ≤
 * CPU_GEMV_MAX_M, decode), x is rounded per block of 32 values to a fixed-point integer of D
 * signed int8 digits (D = 1 or 3) and the codes meet each digit in integer dot products (VNNI
 * vpdpbusd, or AVX2 vpmaddubsw): far fewer vector operations than widening every code to f32
 * — the one-row INT4 GEMV was bound by them, not by memory. What a row computes is exactly
 * defined (docs/QUANTIZATION.md "int8_dot"):
 *     y = Σ_k ((code_k − zero)·scale) · d_b·q_k,
 * d_b = max_{k∈b}|x_k| / Q_D and q_k = x_k·(Q_D / max) rounded to nearest even (|q| ≤ Q_D),
 * b the k's block of 32, Q_1 = 127 and Q_3 = 127·(65536 + 256 + 1): one digit rounds x to
 * 8 bits, three to 24 (f32 holds 24), q = 65536·a + 256·b + c with a, b, c in [−128, 127]. A
 * block with a NaN or an infinity gives d_b = NaN (q = 0), so the row is NaN as it is without
 * the option. Each output's order depends on K, G and the unit alone, never on M, so a row's
 * result never depends on its batch. */
#define CPU_Q8_BLOCK 32
#define CPU_Q8_LANES_PER_BLOCK 4 /* int32 lanes of a dot product over one block */
#define CPU_Q8_MAX_DIGITS 3
#define CPU_Q8_FULL(digits) ((digits) == 1 ? 127 : 8355711) /* Q_D */

/* A chunk of the unit's codes: the group of its first block and how many groups it touches
 * (the scales a step loads). */
struct cpu_q8_chunk {
    int32_t g0, span;
};

/* x rows as cpu_q8_quantize lays them out for one unit (chunk C codes, kp = K rounded up to
 * C; codes past K are 0, their blocks' d 0). */
struct cpu_q8_rows {
    int64_t kp;
    int digits;       /* D */
    const int8_t *q;  /* [M][kp·D]: per chunk, D planes of C codes, most significant digit
                       * first; a plane holds the low halves of its blocks (codes 32b + j,
                       * j < 16) then the high halves (32b + 16 + j): the order of U4's
                       * nibbles */
    const float *d;   /* [M][kp / 8]: each block's d_b, once per lane of its dot product */
    const int32_t *lg; /* [kp / 8]: each lane's group minus its chunk's g0 */
    const struct cpu_q8_chunk *ch; /* [kp / C] */
    const float *xsum; /* [M][G]: Σ_{b∈g} d_b·Σ_{k∈b} q_k, in b order (the zero points' share) */
};

struct cpu_q4_q8 {
    const char *unit; /* "avx512_vnni", "avx2" (the device's name says which one runs) */
    int chunk;        /* codes per step of a row: 128 (AVX-512) or 64 (AVX2) */
    int digits;       /* D: 1 or 3 int8 digits per value of x */
    /* One x row of K values into kp codes of D digits (a multiple of C; codes past K are 0)
     * in the unit's chunk order, d (4 lanes a block) and each block's Σq in sum[b] — what
     * cpu_q8_block gives block by block, vectorized (the serial quantization before each
     * GEMV was a tenth of a 4096 × 4096 product). */
    void (*quant_row)(const float *x, int64_t K, int64_t kp, int8_t *q, float *d,
                      int32_t *sum);
    /* y[m·ldy + j] = the row sum above for m < M, j < n: W row j's codes at w + j·K/2, its
     * scales and zero points at scale/zero + j·G. */
    void (*gemv)(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                 const float *scale, const float *zero, int64_t G, int64_t n, float *y,
                 int64_t ldy);
    /* gemv prefetching the next block of W rows into L2 only (device option prefetch = l2)
     * instead of L1 as well: the same values. */
    void (*gemv_l2)(const struct cpu_q8_rows *x, int64_t M, int64_t K, const uint8_t *w,
                    const float *scale, const float *zero, int64_t G, int64_t n, float *y,
                    int64_t ldy);
};

/* A read of the line at p soon: into L2 only (l2: _MM_HINT_T1) or into L1 as well (T0).
 * Where the int8 U4 GEMV's next block of rows is better fetched depends on the core, not on
 * the ISA: Ice Lake read its codes fastest with T0, Zen 4 at 1.4× the rate with T1
 * (docs/BENCHMARKS.md, "Where the INT4 GEMV prefetches"). */
static inline __attribute__((always_inline)) void cpu_prefetch_read(const void *p, bool l2)
{
    if (l2)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p, 0, 3);
}

/* The definition of one block's quantization: n ≤ 32 values of x (0 past n) into D-digit
 * codes (digit t of code j at lo[t·plane + j] for j < 16, hi[t·plane + j − 16] otherwise), d
 * 4 times (0 for n ≤ 0, NaN when a value is not finite) and Σq. The units' vector code falls
 * back to it for blocks that are not finite or whose amax is below CPU_Q8_MIN_SCALED. */
#define CPU_Q8_MIN_SCALED 1e-30f
void cpu_q8_block(const float *x, int64_t n, int digits, int64_t plane, int8_t *lo, int8_t *hi,
                  float *d, int32_t *sum);
/* q's D digits, most significant first, each in [−128, 127] (|q| ≤ Q_D). */
static inline void cpu_q8_digits(int32_t q, int digits, int8_t *out)
{
    for (int t = digits - 1; t >= 0; t--) {
        const int32_t c = (int32_t)(((uint32_t)q + 128u) & 255u) - 128;
        out[t] = (int8_t)c;
        q = (q - c) / 256; /* exact: q − c is a multiple of 256 */
    }
}
/* The unit's layout of M x rows (ldx apart) into buffers sized by cpu_q8_bytes. */
size_t cpu_q8_bytes(const struct cpu_q4_q8 *u, int64_t M, int64_t K, int64_t G);
void cpu_q8_quantize(const struct cpu_q4_q8 *u, const float *x, int64_t ldx, int64_t M,
                     int64_t K, int64_t G, void *buf, struct cpu_q8_rows *out);

struct cpu_kernels {
    const char *name;   /* "avx512", "avx2", "portable": the `isa` option's values */
    int mr, nr;         /* micro-tile (0 when there is no micro-kernel: portable GEMM) */
    /* dst[k·NR + j] = (f32) w[j·ldw + k] for j < cols, 0 for cols ≤ j < NR, k < kc. w is a
     * weight-dtype array (F32/F16/BF16, or an F8E4M3 K page) positioned at its first row and
     * column; ldw counts elements. */
    void (*pack_w)(const void *w, int dtype, int64_t ldw, int64_t cols, int64_t kc,
                   float *dst);
    /* pack_w for U4 rows (plugin.h MATMUL layout): dst[k·NR + j] = (code k0 + k of row j −
     * zero[j·ng + g])·scale[j·ng + g], g = (k0 + k) / gs, exactly as cpu_q4_dequant, for
     * j < cols (0 above), k < kc; row j's codes at w + j·ldb. k0 and kc are multiples of 32.
     * NULL: the U4 GEMM dequantizes blocks of W first. */
    void (*pack_w_q4)(const uint8_t *w, int64_t ldb, const float *scale, const float *zero,
                      int64_t ng, int64_t gs, int64_t k0, int64_t cols, int64_t kc, float *dst);
    /* dst[k·NR + j] = (f32) w[k·ldw + j] for j < cols, 0 for cols ≤ j < NR, k < rows: a
     * k-major block (attention's V rows) as a W micro-panel, converted but not transposed. */
    void (*pack_rows)(const void *w, int dtype, int64_t ldw, int64_t rows, int64_t cols,
                      float *dst);
    /* dst[k·MR + i] = x[i·ldx + k] for i < rows, 0 for rows ≤ i < MR, k < kc: an x panel. */
    void (*pack_x)(const float *x, int64_t ldx, int64_t rows, int64_t kc, float *dst);
    cpu_micro_fn micro;
    /* y[m·ldy + n] = Σ_k x[m·ldx + k] · w[n·ldw + k] for m < M ≤ CPU_GEMV_MAX_M and
     * n0 ≤ n < n1 (no bias). Lanes along k, fixed reduction: see the ISA file. */
    void (*gemv)(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w, int dtype,
                 int64_t ldw, int64_t n0, int64_t n1, float *y, int64_t ldy);
    /* gemv with F16, BF16 and I8 weights widened in registers by every pass of x rows
     * instead of once per K chunk into an L1 buffer (device option gemv_widen): the same
     * bits. cpu_kernels_select puts it in gemv when chosen; NULL where gemv is. */
    void (*gemv_regs)(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                      int dtype, int64_t ldw, int64_t n0, int64_t n1, float *y, int64_t ldy);
    /* U4 MATMUL rows (plugin.h layout, K = G·gs codes; no bias): y[m·ldy + j] = Σ_g
     * scale[j·G + g]·(Σ_{k∈g} code·x − zero[j·G + g]·xsum[m·G + g]) for m < M ≤
     * CPU_GEMV_MAX_M and j < n, W row j's codes at w + j·K/2, xsum the x rows' group sums
     * (cpu_q4_xsum). Each output's order depends on G and gs alone, never on M or on which
     * rows share the call, so a row's result never depends on the batch; the ISA file says
     * the order and how one x row and several are read. */
    void (*q4_gemv)(const float *x, int64_t ldx, int64_t M, int64_t K, const uint8_t *w,
                    const float *scale, const float *zero, const float *xsum, int64_t G,
                    int64_t n, float *y, int64_t ldy);
    /* x[i] *= s for i < n; returns the largest result (NaN never chosen; −inf when n = 0
     * or every value is NaN). */
    float (*scale_max)(float *x, float s, int64_t n);
    /* x[i] = (float)((double)x[i] · a), i < n: softmax normalisation as the reference does
     * it (e · (1/Σ) with Σ in double). */
    void (*scale_d)(float *x, double a, int64_t n);
    /* Decode attention's two halves over a run of KV rows (one page's worth), ldb / ldx bytes
     * apart: out[i] = s · Σ_k a[k]·row_i[k] for i < rows, and y[k] += Σ_i p[i]·row_i[k] for
     * k < n. The rows are F32, F16, BF16 or F8E4M3, widened exactly to f32 in registers, so
     * an F16 or FP8 page costs no pass through memory and gives the bits its f32 copy gives;
     * or I8 with scales (an INT8 KV page, plugin.h "I8 with row scales": row i's scale is
     * scales[i · scale_step], and each code becomes code · scale rounded to f32 before it
     * enters as an F32 element would). axpy_rows also takes I8 without scales: the codes as
     * values (an INT8 row's products come out of it with p = {scale} into zeros).
     * Each row's dot product has this table's fixed lanes and reduction, and y[k] takes the
     * rows' products by fused multiply-adds in row order, so the bits never depend on how a
     * key range is cut into runs; the runs only save a call per row and keep y in registers
     * across a run. NULL in a table without micro-kernels (its attention runs the portable
     * path). */
    void (*dot_rows)(const float *a, const void *b, int b_dtype, int64_t ldb,
                     const float *scales, int64_t scale_step, int64_t rows, int64_t n, float s,
                     float *out);
    void (*axpy_rows)(float *y, const float *p, const void *x, int x_dtype, int64_t ldx,
                      const float *scales, int64_t scale_step, int64_t rows, int64_t n);
    /* y[i] = exp(x[i] − m) for i < n and returns their sum in double (softmax). */
    double (*exp_sum)(const float *x, float m, float *y, int64_t n);
    /* dst[i] = x[i]·sigmoid(a·x[i]) (· mul[i] when mul is not NULL), i < n. */
    void (*x_sigmoid)(const float *x, float a, const float *mul, float *dst, int64_t n);
    /* dst[i] = GELU(x[i]) = 0.5·x·(1 + erf(x/√2)), i < n. NULL: the caller's erff loop. */
    void (*gelu)(const float *x, float *dst, int64_t n);
    /* The bf16 dot-product GEMM the device option chose (NULL: off, the default). */
    const struct cpu_bf16_gemm *bf16;
    /* The BF16 GEMV on tiles the device option amx_gemv chose (NULL: the table's gemv). */
    const struct cpu_bf16_gemv *bf16_gemv;
    /* The int8 dot-product U4 GEMV the device option int8_dot chose (NULL: off — `0`, or the
     * portable table — and the U4 GEMV widens every code to f32). */
    const struct cpu_q4_q8 *q4q8;
    bool q4q8_l2;      /* run its gemv_l2 (device option prefetch) */
    bool gemv_in_regs; /* gemv is the table's gemv_regs (device option gemv_widen) */
};

extern const struct cpu_kernels cpu_kernels_portable;
extern const struct cpu_kernels cpu_kernels_avx2;   /* defined only on x86-64 */
extern const struct cpu_kernels cpu_kernels_avx512; /* defined only on x86-64 */
extern const struct cpu_bf16_gemm cpu_bf16_gemm_avx512; /* x86-64 only */
extern const struct cpu_bf16_gemm cpu_bf16_gemm_amx;    /* with CPU_HAVE_AMX only */
extern const struct cpu_bf16_gemv cpu_bf16_gemv_amx;    /* with CPU_HAVE_AMX only */
extern const struct cpu_q4_q8 cpu_q4_q8_avx2;           /* x86-64 only; one digit */
extern const struct cpu_q4_q8 cpu_q4_q8_avx2_3;         /* x86-64 only; three digits */
extern const struct cpu_q4_q8 cpu_q4_q8_avx512vnni;     /* x86-64 only; one digit */
extern const struct cpu_q4_q8 cpu_q4_q8_avx512vnni_3;   /* x86-64 only; three digits */
void cpu_pack_w_bf16_avx512(const uint16_t *w, int64_t ldw, int64_t cols, int64_t kc,
                            int64_t kp, uint32_t *dst);

/* The kernel choices among the device options (cpu_plugin.c): each the option's value as
 * given, NULL where it was not. */
struct cpu_kernel_options {
    const char *isa, *bf16_dot, *int8_dot, *prefetch, *amx_gemv, *gemv_widen;
};

/* Picks the kernel table for the `isa` option value (NULL or "auto": the best this CPU runs),
 * the bf16 dot-product GEMM for the `bf16_dot` value (NULL or "0": none; "1": AMX where
 * the CPU and the kernel allow it, else AVX512_BF16; "amx" or "avx512": that unit) and the
 * int8 U4 GEMV for `int8_dot` ("0": none; "1" or "3", the digits of x; NULL or "auto": 3
 * except with the portable table: AVX512_VNNI with the avx512 table on a CPU that has it,
 * else AVX2), and where that GEMV prefetches (`prefetch`: "l1", "l2"; NULL or "auto": l2 on
 * AMD cores, l1 on others), the BF16 GEMV on tiles for `amx_gemv` (NULL or "0": none;
 * "1": AMX, which needs the avx512 table and a CPU and kernel that allow the tiles), and
 * where the batched GEMV widens its weights (`gemv_widen`: "buffer", "registers"; NULL or
 * "auto": registers on AMD cores, buffer on others; the portable table has neither and takes
 * any value). Refuses an ISA or unit the CPU lacks with a message naming the missing
 * feature. */
mmrt_status cpu_kernels_select(const struct cpu_kernel_options *o, struct cpu_kernels *out,
                               char *err, size_t err_size);
/* "avx512 avx512_bf16 avx2 fma f16c" — what this CPU offers, for the device name and logs. */
void cpu_isa_describe(char *out, size_t size);

/* ---- the device ----------------------------------------------------------------------- */

struct mmrt_device {
    struct cpu_pool pool;
    struct cpu_arena *arenas;   /* list head, NULL when none */
    struct cpu_kernels kern;    /* chosen at device_open (cpu_kernels_select) */
    float *gemm_scratch;        /* [n_threads][gemm_scratch_floats]: W block, C block */
    size_t gemm_scratch_floats; /* per thread */
    void *xpack;                /* the blocked GEMM's packed x; grow-only (cpu_xpack) */
    size_t xpack_bytes;
    uint64_t total_bytes;       /* physical memory; also the largest arena we try */
    bool copy_weights;          /* option weights = copy: arena_adopt_host declines */
    bool graph_enabled;         /* option graph = 1: capture_begin records (cpu_graph.c) */
    struct cpu_graph *recording; /* the graph being captured, NULL when running */
    bool capture_failed;        /* first failure while capturing, reported at capture_end */
    mmrt_status capture_status;
    char capture_why[CPU_ERR_MAX];
    char name[128]; /* "<model> (<n> threads) [<table>+int8_dot[=3]:<unit>+bf16_dot:<unit>]" */
    char err[CPU_ERR_MAX];      /* last failure on this device, "" when none */
};

/* Writes the printf-formatted message into dev->err and returns st. */
mmrt_status cpu_fail(struct mmrt_device *dev, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__ /* returns st: why, at MMRT_RETURNS_STATUS in core/error.h */
#define cpu_fail(dev, st, ...) ((void)(cpu_fail)(dev, st, __VA_ARGS__), (st))
#endif

/* The arena `handle` names on dev, or NULL when it is none of dev's arenas. */
struct cpu_arena *cpu_arena_find(struct mmrt_device *dev, const void *handle);

/* ---- graph capture (cpu_graph.c) ------------------------------------------------------ */

/* The kernels by op; the plugin's public table routes each op through cpu_dispatch with its
 * own slot, which runs cpu_kernel_table[slot] or, while capturing, records the launch. */
extern const mmrt_kernel_fn cpu_kernel_table[MMRT_OP_COUNT];
struct cpu_graph;
mmrt_status cpu_dispatch(struct mmrt_device *dev, const struct mmrt_op_args *args, int slot);
mmrt_status cpu_capture_begin(struct mmrt_device *dev);
mmrt_status cpu_capture_end(struct mmrt_device *dev, void **graph);
mmrt_status cpu_graph_launch(struct mmrt_device *dev, void *graph);
void cpu_graph_destroy(struct mmrt_device *dev, void *graph);
bool cpu_capturing(const struct mmrt_device *dev);
/* Records an upload (the bytes as they are now) or a copy while capturing. */
mmrt_status cpu_capture_upload(struct mmrt_device *dev, void *arena, uint64_t offset,
                               const void *src, uint64_t nbytes);
mmrt_status cpu_capture_copy(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                             void *src_arena, uint64_t src_offset, uint64_t nbytes);
/* Fails the capture: `what` (download, synchronize, graph_launch) needs results. */
mmrt_status cpu_capture_refuse(struct mmrt_device *dev, const char *what);
/* Drops an open capture (device_close). */
void cpu_capture_abandon(struct mmrt_device *dev);

/* ---- tensor views and argument checks (cpu_args.c) ------------------------------------ */

/* A tensor descriptor after validation: its first element's host address, extents and byte
 * strides (only the first n_dims entries are meaningful). Every byte the view can address
 * lies inside its arena; strides and the offset are multiples of the element size, so typed
 * loads are aligned. */
struct cpu_view {
    char *data;       /* NULL for an absent optional input */
    int dtype;
    int n_dims;
    int64_t ne[MMRT_MAX_DIMS];
    int64_t nb[MMRT_MAX_DIMS];
    int64_t numel;
    uint64_t span;    /* bytes from data to one past the last addressable byte; 0 if empty */
};

/* One kernel launch after cpu_op_begin: its views, name and raw params. */
struct cpu_op {
    struct mmrt_device *dev;
    const char *name; /* "MATMUL" … */
    int n_src;
    struct cpu_view src[MMRT_MAX_SRC_ALL];
    struct cpu_view dst;
    const void *params;
    uint32_t params_size;
};

/* Copies args (honouring its struct_size), checks that it is a launch of `op` with
 * n_required ≤ n_src ≤ n_max, that sources below n_required and dst are present, resolves
 * every present tensor into o and holds the launch to plugin.h's contract
 * (plugins/common/op_contract.h), so an op function may assume its operands' ranks, dtypes,
 * extents, contiguity and param values. A source slot at or beyond n_src is absent. */
mmrt_status cpu_op_begin(struct mmrt_device *dev, const struct mmrt_op_args *args, int op,
                         int n_required, int n_max, struct cpu_op *o);
/* Copies the op's params into *out (size bytes, zero-filled first). Every field of today's
 * params structs belongs to the minor that introduced its op (mmrt_rope_multi_params: 1.1,
 * the rest 1.0), so a launch must supply at least `size` bytes; fields appended by later
 * minors would be read only as far as params_size reaches (zero default). */
mmrt_status cpu_op_params(struct cpu_op *o, void *out, size_t size);
/* A refusal with the message "OP: what …". */
mmrt_status cpu_bad(struct cpu_op *o, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__ /* returns st: why, at MMRT_RETURNS_STATUS in core/error.h */
#define cpu_bad(o, st, ...) ((void)(cpu_bad)(o, st, __VA_ARGS__), (st))
#endif

/* Extent of the innermost dim, and the number of rows (all other dims together). */
static inline int64_t cpu_inner(const struct cpu_view *v)
{
    return v->ne[v->n_dims - 1];
}
static inline int64_t cpu_rows(const struct cpu_view *v)
{
    int64_t n = 1; /* cannot overflow: cpu_op_begin checked every partial product */
    for (int i = 0; i < v->n_dims - 1; i++)
        n *= v->ne[i];
    return n;
}

/* ---- f16 / bf16 ----------------------------------------------------------------------- */

static inline uint32_t cpu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float cpu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Exact f16 → f32 without branches (so loops over it vectorise): move exponent and mantissa
 * into f32 position and rescale by 2^-112 to re-bias the exponent; subnormal halves are
 * rebuilt as (0.5 + m·2^-24) − 0.5 with a fixed exponent. Inf and NaN survive the rescale.
 * (The rescale-by-multiplication idea is the one Marat Dukhan's FP16 library uses.) */
static inline float cpu_f16_to_f32(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w; /* exponent and mantissa, sign shifted out */
    float normal = cpu_bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float subnormal = cpu_bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t mag = two_w < (1u << 27) ? cpu_f32_bits(subnormal) : cpu_f32_bits(normal);
    return cpu_bits_f32(sign | mag);
}

static inline float cpu_bf16_to_f32(uint16_t h)
{
    return cpu_bits_f32((uint32_t)h << 16);
}

/* f32 → f16, round to nearest even; overflow gives ±inf, NaN a quiet NaN with its sign. */
static inline uint16_t cpu_f32_to_f16(float f)
{
    uint32_t x = cpu_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00u;
    if (ax >= 0x477ff000u) /* ≥ 65520 (halfway above 65504) rounds to infinity */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {
        /* Below 2^-14 the result is subnormal: adding 0.5 leaves an ulp of 2^-24, so the FPU's
         * own round-to-nearest-even produces the subnormal mantissa (0x400 when it rounds
         * up to the smallest normal, which is the right encoding too). */
        float t = cpu_bits_f32(ax) + 0.5f;
        return sign | (uint16_t)(cpu_f32_bits(t) - cpu_f32_bits(0.5f));
    }
    /* Re-bias the exponent (127 → 15) and round the 13 dropped bits to nearest even; a carry
     * out of the mantissa correctly bumps the exponent. */
    uint32_t odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return sign | (uint16_t)(ax >> 13);
}

/* f32 → bf16, round to nearest even; NaN stays a quiet NaN with its sign. */
static inline uint16_t cpu_f32_to_bf16(float f)
{
    uint32_t x = cpu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Element i of a weight-dtype array (F32, F16 or BF16; the caller checked the dtype). */
static inline float cpu_load_weight(const void *p, int dtype, int64_t i)
{
    switch (dtype) {
    case MMRT_DTYPE_F16: return cpu_f16_to_f32(((const uint16_t *)p)[i]);
    case MMRT_DTYPE_BF16: return cpu_bf16_to_f32(((const uint16_t *)p)[i]);
    case MMRT_DTYPE_I8: return (float)((const int8_t *)p)[i];
    case MMRT_DTYPE_F8E4M3: return mmrt_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* dst[0..n) = (float)src[0..n) for a weight-dtype source. */
void cpu_weight_to_f32(const void *src, int dtype, float *dst, int64_t n);

/* Code k of a U4 row (plugin.h: blocks of 32 codes in 16 bytes, byte j holding code j low
 * and code j + 16 high). */
static inline unsigned cpu_q4_code(const uint8_t *row, int64_t k)
{
    const uint8_t b = row[(k / 32) * 16 + (k % 16)];
    return (k % 32) < 16 ? b & 0xFu : (unsigned)(b >> 4);
}

/* dst[i] = the weight that code k0 + i of a U4 row stands for, (code − zero[g])·scale[g] with
 * g = (k0 + i) / gs, for i < n (the dequantized panel of the GEMM paths). */
void cpu_q4_dequant(const uint8_t *row, const float *scale, const float *zero, int64_t gs,
                    int64_t k0, int64_t n, float *dst);

/* xsum[m·G + g] = Σ_{k ∈ group g} x[m·ldx + k], summed in k order, for m < M. */
void cpu_q4_xsum(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t G, float *xsum);

/* The zero-point shares of the U4 row sum: zc[m·R + r] = Σ_g zero·scale·xsum, summed in g
 * order, for x rows m < M and W rows r < R (scale and zero rows G apart, xsum rows G apart).
 * One definition for every path of a table, so they agree bit for bit; the M · R sums run
 * as independent chains (one after another they took as long as the products). */
static inline __attribute__((always_inline)) void
cpu_q4_zero_shares(const float *scale, const float *zero, const float *xsum, int64_t G, int64_t M,
                   const int R, float *zc)
{
    for (int64_t i = 0; i < M * R; i++)
        zc[i] = 0;
    for (int64_t g = 0; g < G; g++)
        for (int64_t m = 0; m < M; m++)
            for (int r = 0; r < R; r++)
                zc[m * R + r] += zero[r * G + g] * scale[r * G + g] * xsum[m * G + g];
}

/* The portable table's q4_gemv (see struct cpu_kernels). */
void cpu_q4_gemv_portable(const float *x, int64_t ldx, int64_t M, int64_t K, const uint8_t *w,
                          const float *scale, const float *zero, const float *xsum, int64_t G,
                          int64_t n, float *y, int64_t ldy);

/* ---- f32 dot product ------------------------------------------------------------------ */

/* GCC/Clang generic vectors (no intrinsics, no -march): 4 lanes map onto SSE2 on any x86-64
 * and onto NEON on arm64; wider units are a later tuning step. */
typedef float cpu_v4f __attribute__((vector_size(16)));
typedef uint32_t cpu_v4u __attribute__((vector_size(16)));
typedef uint16_t cpu_v4h __attribute__((vector_size(8)));

static inline cpu_v4f cpu_v4f_load(const float *p)
{
    cpu_v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Four halves at p widened exactly: cpu_f16_to_f32's arithmetic in vector form. */
static inline cpu_v4f cpu_f16x4_to_f32(const uint16_t *p)
{
    cpu_v4h h;
    memcpy(&h, p, sizeof h);
    cpu_v4u w = __builtin_convertvector(h, cpu_v4u) << 16;
    cpu_v4u sign = w & 0x80000000u, two_w = w + w;
    cpu_v4f normal = (cpu_v4f)((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    cpu_v4f subnormal = (cpu_v4f)((two_w >> 17) | (126u << 23)) - 0.5f;
    cpu_v4u is_sub = (cpu_v4u)(two_w < (1u << 27));
    return (cpu_v4f)(sign | (is_sub & (cpu_v4u)subnormal) | (~is_sub & (cpu_v4u)normal));
}

/* Four bf16 values at p widened (exact: the bits move up). */
static inline cpu_v4f cpu_bf16x4_to_f32(const uint16_t *p)
{
    cpu_v4h h;
    memcpy(&h, p, sizeof h);
    return (cpu_v4f)(__builtin_convertvector(h, cpu_v4u) << 16);
}

/* Sum of eight partial sums in a fixed order, so results do not depend on anything but n. */
static inline float cpu_hsum8(const float a[8])
{
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* Σ a[k]·b[k] in f32 over eight lanes (lane l takes the k ≡ l mod 8 terms, the tail goes to
 * lanes 0…), then cpu_hsum8. Independent lanes vectorise without reassociating (no
 * -ffast-math); every f32 dot in the plugin uses exactly this order. */
static inline float cpu_dot_f32(const float *restrict a, const float *restrict b, int64_t n)
{
    cpu_v4f lo = { 0 }, hi = { 0 };
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        lo += cpu_v4f_load(a + k) * cpu_v4f_load(b + k);
        hi += cpu_v4f_load(a + k + 4) * cpu_v4f_load(b + k + 4);
    }
    float acc[8];
    memcpy(acc, &lo, sizeof lo);
    memcpy(acc + 4, &hi, sizeof hi);
    for (int l = 0; l < 8 && k + l < n; l++)
        acc[l] += a[k + l] * b[k + l];
    return cpu_hsum8(acc);
}

/* ---- the GEMM shared by MATMUL and PATCH_EMBED (cpu_ops_matmul.c) -------------------- */

/* y[M, N] = x[M, K] · w[N, K]ᵀ (+ b[N]); x and y contiguous f32, w and b (may be NULL) of
 * their own weight dtype, all contiguous; an I8 w comes with its per-row scales (scale[N],
 * else NULL), applied to each finished sum before the bias. Runs on dev's pool. Fails only
 * when the packing scratch cannot be allocated (MMRT_ERR_NO_MEMORY, message in dev->err). */
mmrt_status cpu_gemm(struct mmrt_device *dev, const float *x, int64_t M, int64_t K,
                     const void *w, int w_dtype, const float *scale, int64_t N, const void *b,
                     int b_dtype, float *y);

/* dev->xpack with at least nbytes (64-byte aligned), grown if needed; NULL after writing a
 * message into dev->err when it cannot be allocated. Valid until the next call. */
void *cpu_xpack(struct mmrt_device *dev, size_t nbytes, const char *what);

/* ---- kernels (one per enum mmrt_op) --------------------------------------------------- */

mmrt_status cpu_op_matmul(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_add(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_mul(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_scale(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_layernorm(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_rmsnorm(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_gelu_tanh(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_quick_gelu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_silu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_swiglu(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_relu2(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_softmax(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_attention(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_get_rows(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_patch_embed(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_concat(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_copy(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_argmax(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_rope_multi(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_set_rows(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_gather_heads(struct mmrt_device *dev, const struct mmrt_op_args *args);
mmrt_status cpu_op_l2_norm(struct mmrt_device *dev, const struct mmrt_op_args *args);

#endif /* MMRT_CPU_INTERNAL_H */
