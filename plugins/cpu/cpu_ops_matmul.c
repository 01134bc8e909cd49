/*
 * plugins/cpu/cpu_ops_matmul.c — MATMUL and PATCH_EMBED, both on one GEMM front (cpu_gemm).
 *
 * y[M, N] = x[M, K] · w[N, K]ᵀ: both operands are row-major along K. cpu_gemm picks one of
 * three paths by shape and kernel table (cpu_isa.c), never by thread count:
 *
 *   GEMV (M ≤ CPU_GEMV_MAX_M = 32, a table with a gemv kernel): decode, also over a batch of
 *     up to 32 sequences, is bound by reading the weights, so each W row is streamed once,
 *     converted in registers and dotted with every x row while it is in cache; threads take
 *     disjoint ranges of W rows. Each row's result is bit-identical for every M ≤ 32 (see
 *     CPU_GEMV_MAX_M), which continuous batching relies on. With int8_dot and U4 weights
 *     the x rows are rounded to int8 blocks once per call and the option's unit (struct
 *     cpu_q4_q8) runs instead, with the same per-row invariance.
 *   Blocked GEMM (a table with a micro-kernel): BLIS-style, see CPU_GEMM_* in cpu_internal.h.
 *     x is packed once ([K block][MR panel][kc][MR]); each parallel item owns GEMM_NC columns
 *     and up to GEMM_MC rows, converts and transposes its W rows per K block into per-thread
 *     scratch and runs the MR × NR micro-kernel over it, accumulating into a per-thread C
 *     block of whole tiles (so edge tiles need no special case) that is written to y, with
 *     the bias, at the end. Each output is one FMA chain in k order, continued across K
 *     blocks through the C block, so the result does not depend on the blocking or the
 *     thread count. With bf16_dot and BF16 weights the same loops drive the bf16 unit the
 *     option chose (struct cpu_bf16_gemm: AMX tiles or vdpbf16ps) on bf16 pairs, with its
 *     own micro-tile and x layout.
 *   Portable (no micro-kernel): tiles of CPU_MM_MB x rows × CPU_MM_NB W rows, K in panels of
 *     CPU_MM_KB; an F16/BF16 W panel is converted once into per-thread scratch and reused by
 *     all x rows of the tile; every output is cpu_dot_f32's 8-lane dot, summed panel by panel.
 *
 * Weights stay in their checkpoint dtype in memory in every path: conversion happens in
 * registers (GEMV) or into a per-thread panel of at most GEMM_NC × GEMM_KC floats.
 * PATCH_EMBED gathers the non-overlapping patches into rows (im2col, which for stride =
 * kernel is a permutation of the image) and runs the same GEMM against the weight seen as
 * [O, C·P·P].
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_internal.h"

void *cpu_xpack(struct mmrt_device *dev, size_t nbytes, const char *what)
{
    if (nbytes <= dev->xpack_bytes)
        return dev->xpack;
    free(dev->xpack);
    dev->xpack = NULL;
    dev->xpack_bytes = 0;
    /* Grow geometrically so a slowly growing context does not reallocate every step. */
    size_t want = nbytes + nbytes / 4;
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGN, want) != 0) {
        cpu_fail(dev, MMRT_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes of packing scratch",
                 what, want);
        return NULL;
    }
    dev->xpack = p;
    dev->xpack_bytes = want;
    return p;
}

/* ---- portable path ------------------------------------------------------------------------ */

struct gemm_ctx {
    struct mmrt_device *dev;
    const float *x;
    const char *w;
    const float *scale;
    const char *b;
    float *y;
    int64_t M, K, N, n_mtiles;
    int w_dtype, b_dtype;
    size_t w_es;
};

/* Four dot products of x against four w rows ldw apart, in cpu_dot_f32's exact lane order;
 * sharing the x loads is what makes this faster than four separate dots. */
static void dot_1x4(const float *restrict x, const float *restrict w, int64_t ldw, int64_t n,
                    float out[4])
{
    const float *wr[4] = { w, w + ldw, w + 2 * ldw, w + 3 * ldw };
    cpu_v4f lo[4] = { { 0 } }, hi[4] = { { 0 } };
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        cpu_v4f xl = cpu_v4f_load(x + k), xh = cpu_v4f_load(x + k + 4);
        for (int r = 0; r < 4; r++) {
            lo[r] += xl * cpu_v4f_load(wr[r] + k);
            hi[r] += xh * cpu_v4f_load(wr[r] + k + 4);
        }
    }
    for (int r = 0; r < 4; r++) {
        float acc[8];
        memcpy(acc, &lo[r], sizeof lo[r]);
        memcpy(acc + 4, &hi[r], sizeof hi[r]);
        for (int l = 0; l < 8 && k + l < n; l++)
            acc[l] += x[k + l] * wr[r][k + l];
        out[r] = cpu_hsum8(acc);
    }
}

static void gemm_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct gemm_ctx *c = vctx;
    float *panel = c->dev->gemm_scratch + (size_t)tid * c->dev->gemm_scratch_floats;
    int64_t K = c->K, N = c->N;

    for (int64_t t = begin; t < end; t++) {
        int64_t n0 = (t / c->n_mtiles) * CPU_MM_NB, m0 = (t % c->n_mtiles) * CPU_MM_MB;
        int64_t nn = N - n0 < CPU_MM_NB ? N - n0 : CPU_MM_NB;
        int64_t m1 = c->M - m0 < CPU_MM_MB ? c->M : m0 + CPU_MM_MB;

        for (int64_t m = m0; m < m1; m++)
            memset(c->y + m * N + n0, 0, (size_t)nn * sizeof(float));
        for (int64_t k0 = 0; k0 < K; k0 += CPU_MM_KB) {
            int64_t kl = K - k0 < CPU_MM_KB ? K - k0 : CPU_MM_KB;
            const float *wp;
            int64_t ldw;
            if (c->w_dtype == MMRT_DTYPE_F32) {
                wp = (const float *)c->w + n0 * K + k0;
                ldw = K;
            } else {
                for (int64_t j = 0; j < nn; j++)
                    cpu_weight_to_f32(c->w + (size_t)((n0 + j) * K + k0) * c->w_es, c->w_dtype,
                                      panel + j * CPU_MM_KB, kl);
                wp = panel;
                ldw = CPU_MM_KB;
            }
            for (int64_t m = m0; m < m1; m++) {
                const float *xr = c->x + m * K + k0;
                float *yr = c->y + m * N + n0;
                int64_t j = 0;
                for (; j + 4 <= nn; j += 4) {
                    float o[4];
                    dot_1x4(xr, wp + j * ldw, ldw, kl, o);
                    for (int l = 0; l < 4; l++)
                        yr[j + l] += o[l];
                }
                for (; j < nn; j++)
                    yr[j] += cpu_dot_f32(xr, wp + j * ldw, kl);
            }
        }
        if (c->scale)
            for (int64_t m = m0; m < m1; m++)
                for (int64_t j = 0; j < nn; j++)
                    c->y[m * N + n0 + j] *= c->scale[n0 + j];
        if (c->b) {
            for (int64_t m = m0; m < m1; m++)
                for (int64_t j = 0; j < nn; j++)
                    c->y[m * N + n0 + j] += cpu_load_weight(c->b, c->b_dtype, n0 + j);
        }
    }
}

/* ---- GEMV path ------------------------------------------------------------------------------ */

#define GEMV_ROWS 4 /* W rows per parallel item */

struct gemv_ctx {
    const struct cpu_kernels *kt;
    const float *x;
    const void *w, *b;
    const float *scale;
    float *y;
    int64_t M, K, N;
    int w_dtype, b_dtype;
};

/* Columns [n0, n1) of a GEMV's M rows: times the per-row scale (I8), plus the bias. */
static void gemv_finish(float *y, int64_t M, int64_t N, int64_t n0, int64_t n1,
                        const float *scale, const void *b, int b_dtype)
{
    if (scale)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = n0; n < n1; n++)
                y[m * N + n] *= scale[n];
    if (b)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = n0; n < n1; n++)
                y[m * N + n] += cpu_load_weight(b, b_dtype, n);
}

static void gemv_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct gemv_ctx *c = vctx;
    (void)tid;
    int64_t n0 = begin * GEMV_ROWS, n1 = end * GEMV_ROWS < c->N ? end * GEMV_ROWS : c->N;
    c->kt->gemv(c->x, c->K, c->M, c->K, c->w, c->w_dtype, c->K, n0, n1, c->y, c->N);
    gemv_finish(c->y, c->M, c->N, n0, n1, c->scale, c->b, c->b_dtype);
}

/* BF16 weights on AMX tiles (struct cpu_bf16_gemv): x is split into its packed parts once,
 * chunk ranges in parallel, then threads take blocks of 16 W rows. */
#define AMX_GEMV_ROWS 16

struct amx_gemv_ctx {
    const struct cpu_bf16_gemv *u;
    const float *x;
    const void *w, *b;
    const float *scale;
    float *y;
    uint16_t *xp;
    int64_t M, K, N;
    int b_dtype;
};

static void amx_gemv_pack_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct amx_gemv_ctx *c = vctx;
    (void)tid;
    c->u->pack_x(c->x, c->K, c->M, c->K, begin, end, c->xp);
}

static void amx_gemv_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct amx_gemv_ctx *c = vctx;
    (void)tid;
    int64_t n0 = begin * AMX_GEMV_ROWS;
    int64_t n1 = end * AMX_GEMV_ROWS < c->N ? end * AMX_GEMV_ROWS : c->N;
    c->u->begin();
    c->u->rows(c->xp, c->M, c->K, c->w, c->K, n0, n1, c->y, c->N);
    c->u->end();
    gemv_finish(c->y, c->M, c->N, n0, n1, c->scale, c->b, c->b_dtype);
}

static mmrt_status amx_gemv(struct mmrt_device *dev, const float *x, int64_t M, int64_t K,
                            const void *w, const float *scale, int64_t N, const void *b,
                            int b_dtype, float *y)
{
    const struct cpu_bf16_gemv *u = dev->kern.bf16_gemv;
    struct amx_gemv_ctx c = {
        .u = u, .x = x, .w = w, .b = b, .scale = scale, .y = y, .M = M, .K = K, .N = N,
        .b_dtype = b_dtype,
    };
    if (!(c.xp = cpu_xpack(dev, u->xbytes(M, K), "MATMUL")))
        return MMRT_ERR_NO_MEMORY;
    cpu_parallel_for(&dev->pool, (K + 31) / 32, (double)(32 * M * 3), amx_gemv_pack_task, &c);
    cpu_parallel_for(&dev->pool, (N + AMX_GEMV_ROWS - 1) / AMX_GEMV_ROWS,
                     (double)AMX_GEMV_ROWS * (double)K * 4.0, amx_gemv_task, &c);
    return MMRT_OK;
}

/* ---- blocked path --------------------------------------------------------------------------- */

struct blk_ctx {
    struct mmrt_device *dev;
    const struct cpu_kernels *kt;
    const float *x;
    const char *w, *b;
    const float *scale;     /* I8: per W row, applied to the sums */
    const float *q4_scale, *q4_zero; /* U4: per W row and group, applied when packing W */
    int64_t q4_groups;
    float *y;
    void *xp;               /* packed x: [n_kb][n_panels][panel_elems] (f32 or u32 pairs) */
    int64_t M, K, N;
    int64_t kcb;            /* k elements per K block */
    int64_t n_kb, n_panels, panel_elems;
    int64_t n_mb, mb_panels; /* row blocks per column block, panels per row block */
    int w_dtype, b_dtype, mr, nr;
    size_t w_es;
    const struct cpu_bf16_gemm *bf; /* the bf16 unit, or NULL: f32 micro-kernel */
};

/* Rows of a packed micro-panel for kc values of k: f32 values, or the bf16 unit's pairs
 * padded to its alignment. */
static int64_t blk_kunits(const struct blk_ctx *c, int64_t kc)
{
    if (!c->bf)
        return kc;
    int64_t a = c->bf->kalign;
    return ((kc + 1) / 2 + a - 1) / a * a;
}

static void xpack_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct blk_ctx *c = vctx;
    (void)tid;
    for (int64_t it = begin; it < end; it++) {
        int64_t kb = it / c->n_panels, p = it % c->n_panels;
        int64_t k0 = kb * c->kcb, kc = c->K - k0 < c->kcb ? c->K - k0 : c->kcb;
        int64_t rows = c->M - p * c->mr < c->mr ? c->M - p * c->mr : c->mr;
        const float *src = c->x + p * c->mr * c->K + k0;
        uint32_t *dst = (uint32_t *)c->xp + (size_t)it * (size_t)c->panel_elems;
        if (c->bf)
            c->bf->pack_x(src, c->K, rows, kc, blk_kunits(c, kc), dst);
        else
            c->kt->pack_x(src, c->K, rows, kc, (float *)dst);
    }
}

/* The W lines the next pack of this thread reads, fetched into L2 a few at a time while the
 * micro-kernel runs on the current block. Packing is a transpose over NC rows of W that lie
 * K elements apart; read cold it waits on memory row by row (8 % of prefill's samples in a
 * profile, 2026-12-06), while the micro-kernel between two packs is bound by FMAs and leaves
 * the memory system idle. */
struct w_prefetch {
    const char *row;  /* next row to fetch */
    int64_t ld;       /* bytes from one row to the next */
    int64_t bytes;    /* of each row */
    int64_t rows_left, per_call;
};

static void w_prefetch_plan(const struct blk_ctx *c, int64_t it, int64_t kb, int64_t end,
                            int64_t n_calls, struct w_prefetch *pf)
{
    *pf = (struct w_prefetch){ .row = c->w };
    if (++kb == c->n_kb) {
        kb = 0;
        if (++it == end)
            return;
    }
    int64_t n0 = it / c->n_mb * CPU_GEMM_NC;
    int64_t k0 = kb * c->kcb, kc = c->K - k0 < c->kcb ? c->K - k0 : c->kcb;
    if (c->w_dtype == MMRT_DTYPE_U4) {
        pf->row = c->w + n0 * (c->K / 2) + k0 / 2;
        pf->ld = c->K / 2;
        pf->bytes = kc / 2;
    } else {
        pf->row = c->w + (size_t)(n0 * c->K + k0) * c->w_es;
        pf->ld = c->K * (int64_t)c->w_es;
        pf->bytes = kc * (int64_t)c->w_es;
    }
    pf->rows_left = c->N - n0 < CPU_GEMM_NC ? c->N - n0 : CPU_GEMM_NC;
    pf->per_call = (pf->rows_left + n_calls - 1) / (n_calls > 0 ? n_calls : 1);
}

/* The next per_call rows, every line of each (the last byte too: a row may end mid-line). */
static void w_prefetch_some(struct w_prefetch *pf)
{
    for (int64_t n = 0; n < pf->per_call && pf->rows_left > 0; n++, pf->rows_left--) {
        for (int64_t off = 0; off < pf->bytes; off += 64)
            __builtin_prefetch(pf->row + off, 0, 2);
        __builtin_prefetch(pf->row + pf->bytes - 1, 0, 2);
        pf->row += pf->ld;
    }
}

static void blk_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct blk_ctx *c = vctx;
    const struct cpu_kernels *kt = c->kt;
    const int mr = c->mr, nr = c->nr;
    /* Per-thread scratch: the converted W block [NC/NR][kc][NR], then the item's C block
     * [mb_panels·MR][NC]. C accumulates in this block rather than in y: y's rows are N floats
     * apart, often a multiple of 4 KiB, so the rows of a tile would all fall into one L1 set
     * every time a K block reloads them; here they are NC floats apart. The block is always
     * whole tiles, so no edge case reaches the micro-kernel. */
    float *wpack = c->dev->gemm_scratch + (size_t)tid * c->dev->gemm_scratch_floats;
    float *cblk = wpack + (size_t)CPU_GEMM_NC * CPU_GEMM_KC;
    const int64_t N = c->N;
    if (c->bf && c->bf->begin)
        c->bf->begin();

    for (int64_t it = begin; it < end; it++) {
        int64_t nb = it / c->n_mb, mb = it % c->n_mb;
        int64_t n0 = nb * CPU_GEMM_NC, ncols = N - n0 < CPU_GEMM_NC ? N - n0 : CPU_GEMM_NC;
        int64_t p0 = mb * c->mb_panels;
        int64_t p1 = p0 + c->mb_panels < c->n_panels ? p0 + c->mb_panels : c->n_panels;
        int64_t n_jr = (ncols + nr - 1) / nr;

        for (int64_t kb = 0; kb < c->n_kb; kb++) {
            int64_t k0 = kb * c->kcb, kc = c->K - k0 < c->kcb ? c->K - k0 : c->kcb;
            int64_t kunits = blk_kunits(c, kc);
            for (int64_t jr = 0; jr < n_jr; jr++) {
                int64_t cols = ncols - jr * nr < nr ? ncols - jr * nr : nr, row = n0 + jr * nr;
                float *dst = wpack + jr * nr * kunits;
                if (c->w_dtype == MMRT_DTYPE_U4) {
                    const int64_t ng = c->q4_groups;
                    kt->pack_w_q4((const uint8_t *)c->w + row * (c->K / 2), c->K / 2,
                                  c->q4_scale + row * ng, c->q4_zero + row * ng, ng, c->K / ng,
                                  k0, cols, kc, dst);
                    continue;
                }
                const char *wsrc = c->w + (size_t)(row * c->K + k0) * c->w_es;
                if (c->bf)
                    c->bf->pack_w((const uint16_t *)wsrc, c->K, cols, kc, kunits, (uint32_t *)dst);
                else
                    kt->pack_w(wsrc, c->w_dtype, c->K, cols, kc, dst);
            }
            struct w_prefetch pf;
            w_prefetch_plan(c, it, kb, end, n_jr * (p1 - p0), &pf);
            for (int64_t jr = 0; jr < n_jr; jr++) {
                const float *wp = wpack + jr * nr * kunits;
                for (int64_t p = p0; p < p1; p++) {
                    w_prefetch_some(&pf);
                    const uint32_t *xpp =
                        (const uint32_t *)c->xp + (size_t)(kb * c->n_panels + p) * c->panel_elems;
                    float *ct = cblk + (p - p0) * mr * CPU_GEMM_NC + jr * nr;
                    if (c->bf)
                        c->bf->micro(xpp, (const uint32_t *)wp, kunits, ct, CPU_GEMM_NC, kb > 0);
                    else
                        kt->micro((const float *)xpp, wp, nr, kc, ct, CPU_GEMM_NC, kb > 0);
                }
            }
        }
        /* The valid part of the block into y, with the bias (converted once per item). */
        int64_t m0 = p0 * mr, m1 = p1 * mr < c->M ? p1 * mr : c->M;
        float bias[CPU_GEMM_NC];
        if (c->b)
            cpu_weight_to_f32(c->b + (size_t)n0 * mmrt_dtype_size((enum mmrt_dtype)c->b_dtype),
                              c->b_dtype, bias, ncols);
        const float *sc = c->scale ? c->scale + n0 : NULL;
        for (int64_t m = m0; m < m1; m++) {
            float *yr = c->y + m * N + n0;
            const float *cr = cblk + (m - m0) * CPU_GEMM_NC;
            if (sc && c->b)
                for (int64_t j = 0; j < ncols; j++)
                    yr[j] = cr[j] * sc[j] + bias[j];
            else if (sc)
                for (int64_t j = 0; j < ncols; j++)
                    yr[j] = cr[j] * sc[j];
            else if (c->b)
                for (int64_t j = 0; j < ncols; j++)
                    yr[j] = cr[j] + bias[j];
            else
                memcpy(yr, cr, (size_t)ncols * sizeof(float));
        }
    }
    if (c->bf && c->bf->end)
        c->bf->end();
}

static mmrt_status gemm_blocked(struct blk_ctx *c);

mmrt_status cpu_gemm(struct mmrt_device *dev, const float *x, int64_t M, int64_t K,
                     const void *w, int w_dtype, const float *scale, int64_t N, const void *b,
                     int b_dtype, float *y)
{
    const struct cpu_kernels *kt = &dev->kern;
    if (M == 0 || N == 0)
        return MMRT_OK;
    if (K == 0 || (M <= CPU_GEMV_MAX_M && kt->gemv)) {
        if (K == 0) {
            /* An empty sum: y is the bias (or zero) on every path. */
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++)
                    y[m * N + n] = b ? cpu_load_weight(b, b_dtype, n) : 0.0f;
            return MMRT_OK;
        }
        if (w_dtype == MMRT_DTYPE_BF16 && kt->bf16_gemv)
            return amx_gemv(dev, x, M, K, w, scale, N, b, b_dtype, y);
        struct gemv_ctx c = {
            .kt = kt, .x = x, .w = w, .b = b, .scale = scale, .y = y, .M = M, .K = K, .N = N,
            .w_dtype = w_dtype, .b_dtype = b_dtype,
        };
        cpu_parallel_for(&dev->pool, (N + GEMV_ROWS - 1) / GEMV_ROWS,
                         (double)GEMV_ROWS * (double)K * (double)M, gemv_task, &c);
        return MMRT_OK;
    }
    if (!kt->micro) {
        struct gemm_ctx c = {
            .dev = dev, .x = x, .w = w, .scale = scale, .b = b, .y = y, .M = M, .K = K, .N = N,
            .n_mtiles = (M + CPU_MM_MB - 1) / CPU_MM_MB,
            .w_dtype = w_dtype, .b_dtype = b_dtype,
            .w_es = mmrt_dtype_size((enum mmrt_dtype)w_dtype),
        };
        int64_t n_tiles = c.n_mtiles * ((N + CPU_MM_NB - 1) / CPU_MM_NB);
        double cost = (double)(M < CPU_MM_MB ? M : CPU_MM_MB) * CPU_MM_NB * (double)(K + 1);
        cpu_parallel_for(&dev->pool, n_tiles, cost, gemm_task, &c);
        return MMRT_OK;
    }

    const struct cpu_bf16_gemm *bf = w_dtype == MMRT_DTYPE_BF16 ? kt->bf16 : NULL;
    struct blk_ctx c = {
        .dev = dev, .kt = kt, .x = x, .w = w, .b = b, .scale = scale, .y = y,
        .M = M, .K = K, .N = N,
        .kcb = bf ? bf->kc : CPU_GEMM_KC,
        .w_dtype = w_dtype, .b_dtype = b_dtype, .mr = bf ? bf->mr : kt->mr,
        .nr = bf ? bf->nr : kt->nr, .w_es = mmrt_dtype_size((enum mmrt_dtype)w_dtype), .bf = bf,
    };
    return gemm_blocked(&c);
}

/* The blocked path for a prepared context: x packed once, then the items. */
static mmrt_status gemm_blocked(struct blk_ctx *cp)
{
    struct blk_ctx c = *cp;
    struct mmrt_device *dev = c.dev;
    const int64_t M = c.M, K = c.K, N = c.N;
    c.n_kb = (K + c.kcb - 1) / c.kcb;
    c.n_panels = (M + c.mr - 1) / c.mr;
    c.panel_elems = blk_kunits(&c, c.kcb) * c.mr;
    c.mb_panels = CPU_GEMM_MC / c.mr;
    c.n_mb = (c.n_panels + c.mb_panels - 1) / c.mb_panels;
    size_t xbytes = (size_t)(c.n_kb * c.n_panels * c.panel_elems) * sizeof(float);
    if (!(c.xp = cpu_xpack(dev, xbytes, "MATMUL")))
        return MMRT_ERR_NO_MEMORY;
    cpu_parallel_for(&dev->pool, c.n_kb * c.n_panels, (double)(c.kcb * c.mr), xpack_task, &c);
    int64_t n_items = ((N + CPU_GEMM_NC - 1) / CPU_GEMM_NC) * c.n_mb;
    double cost = (double)CPU_GEMM_NC * (double)(M < CPU_GEMM_MC ? M : CPU_GEMM_MC) * (double)K;
    cpu_parallel_for(&dev->pool, n_items, cost, blk_task, &c);
    return MMRT_OK;
}

/* ---- MATMUL with U4 weights ------------------------------------------------------------- */

struct q4_ctx {
    struct mmrt_device *dev;
    const float *x, *scale, *zero, *xsum;
    const struct cpu_q8_rows *xq; /* int8_dot: x as the unit's int8 blocks, else NULL */
    const uint8_t *w;
    const char *b;
    float *y;
    int64_t M, K, N, G;
    int b_dtype;
};

/* GEMV (M ≤ CPU_GEMV_MAX_M): the table's U4 rows over a range of W rows, then the bias. */
static void q4_gemv_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct q4_ctx *c = vctx;
    (void)tid;
    int64_t n0 = begin * GEMV_ROWS, n1 = end * GEMV_ROWS < c->N ? end * GEMV_ROWS : c->N;
    const int64_t G = c->G;
    if (c->xq) {
        const struct cpu_kernels *k = &c->dev->kern;
        (k->q4q8_l2 ? k->q4q8->gemv_l2 : k->q4q8->gemv)(c->xq, c->M, c->K,
                                                        c->w + n0 * (c->K / 2),
                                                        c->scale + n0 * G, c->zero + n0 * G,
                                                        G, n1 - n0, c->y + n0, c->N);
    }
    else
        c->dev->kern.q4_gemv(c->x, c->K, c->M, c->K, c->w + n0 * (c->K / 2),
                             c->scale + n0 * G, c->zero + n0 * G, c->xsum, G, n1 - n0,
                             c->y + n0, c->N);
    if (c->b)
        for (int64_t m = 0; m < c->M; m++)
            for (int64_t n = n0; n < n1; n++)
                c->y[m * c->N + n] += cpu_load_weight(c->b, c->b_dtype, n);
}

/* Larger M (prefill, vision): W is dequantized once into F32 in per-call scratch and the
 * float GEMM runs on it; the dequantization is O(N·K), the product O(M·N·K). */
static void q4_dequant_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct q4_ctx *c = vctx;
    (void)tid;
    float *dst = (float *)c->y; /* the scratch, see matmul_u4 */
    const int64_t gs = c->K / c->G;
    for (int64_t n = begin; n < end; n++)
        cpu_q4_dequant(c->w + n * (c->K / 2), c->scale + n * c->G, c->zero + n * c->G, gs, 0,
                       c->K, dst + n * c->K);
}

static mmrt_status matmul_u4(struct cpu_op *o, const struct cpu_view *x, const struct cpu_view *w,
                             const struct cpu_view *b, const struct cpu_view *s,
                             const struct cpu_view *z, const struct cpu_view *y, int64_t M,
                             int64_t K, int64_t N)
{
    /* op_contract.h checked the operands (cpu_op_begin); G is the scales' group count. */
    mmrt_status st = MMRT_OK;
    const int64_t G = s->ne[1];
    struct mmrt_device *dev = o->dev;
    struct q4_ctx c = {
        .dev = dev, .x = (const float *)x->data, .scale = (const float *)s->data,
        .zero = (const float *)z->data, .w = (const uint8_t *)w->data, .b = b->data,
        .y = (float *)y->data, .M = M, .K = K, .N = N, .G = G, .b_dtype = b->dtype,
    };
    if (M == 0 || N == 0)
        return MMRT_OK;
    if (K == 0) /* an empty sum (the contract allows it): the bias or zero, as cpu_gemm gives */
        return cpu_gemm(dev, c.x, M, 0, NULL, MMRT_DTYPE_F32, NULL, N, c.b, c.b_dtype, c.y);
    if (M <= CPU_GEMV_MAX_M && dev->kern.q4q8) {
        const struct cpu_q4_q8 *u = dev->kern.q4q8;
        size_t bytes = cpu_q8_bytes(u, M, K, G);
        void *buf = NULL;
        if (posix_memalign(&buf, CPU_ALIGN, bytes) != 0)
            return cpu_bad(o, MMRT_ERR_NO_MEMORY, "cannot allocate %zu bytes of int8 x blocks",
                           bytes);
        struct cpu_q8_rows xq;
        cpu_q8_quantize(u, c.x, K, M, K, G, buf, &xq);
        c.xq = &xq;
        cpu_parallel_for(&dev->pool, (N + GEMV_ROWS - 1) / GEMV_ROWS,
                         (double)GEMV_ROWS * (double)K * (double)M / 4, q4_gemv_task, &c);
        free(buf);
        return MMRT_OK;
    }
    if (M <= CPU_GEMV_MAX_M) {
        float *xsum = malloc((size_t)(M * G) * sizeof *xsum);
        if (!xsum)
            return cpu_bad(o, MMRT_ERR_NO_MEMORY, "cannot allocate %" PRId64 " group sums", M * G);
        cpu_q4_xsum(c.x, K, M, K, G, xsum);
        c.xsum = xsum;
        cpu_parallel_for(&dev->pool, (N + GEMV_ROWS - 1) / GEMV_ROWS,
                         (double)GEMV_ROWS * (double)K * (double)M, q4_gemv_task, &c);
        free(xsum);
        return MMRT_OK;
    }
    if (dev->kern.micro && dev->kern.pack_w_q4) {
        /* The blocked GEMM packs its W panels straight from the codes: the same weights as
         * the dequantized copy below gives, converted once per panel. */
        struct blk_ctx bc = {
            .dev = dev, .kt = &dev->kern, .x = c.x, .w = (const char *)c.w, .b = c.b,
            .q4_scale = c.scale, .q4_zero = c.zero, .q4_groups = G, .y = c.y,
            .M = M, .K = K, .N = N, .kcb = CPU_GEMM_KC, .w_dtype = MMRT_DTYPE_U4,
            .b_dtype = c.b_dtype, .mr = dev->kern.mr, .nr = dev->kern.nr,
        };
        return gemm_blocked(&bc);
    }
    /* Tables without it: W rows in blocks of at most 16 MiB of floats, dequantized, each
     * block's columns of y through a scratch [M, nb] (each output is the GEMM's one FMA chain
     * in k order whatever the block). */
    int64_t nb = ((int64_t)1 << 22) / K;
    nb = nb < 64 ? 64 : nb;
    nb = nb > N ? N : nb;
    float *wf = malloc((size_t)(nb * K) * sizeof *wf);
    float *yb = nb < N ? malloc((size_t)(M * nb) * sizeof *yb) : NULL;
    if (!wf || (nb < N && !yb)) {
        free(wf);
        free(yb);
        return cpu_bad(o, MMRT_ERR_NO_MEMORY, "cannot allocate the dequantized U4 block (%" PRId64
                       " × %" PRId64 " floats)", nb, K);
    }
    const size_t bes = b->data ? mmrt_dtype_size((enum mmrt_dtype)b->dtype) : 0;
    for (int64_t n0 = 0; n0 < N && st == MMRT_OK; n0 += nb) {
        const int64_t n = N - n0 < nb ? N - n0 : nb;
        struct q4_ctx d = c;
        d.w = c.w + n0 * (K / 2);
        d.scale = c.scale + n0 * G;
        d.zero = c.zero + n0 * G;
        d.y = wf;
        cpu_parallel_for(&dev->pool, n, (double)K, q4_dequant_task, &d);
        float *dst = yb ? yb : c.y;
        st = cpu_gemm(dev, c.x, M, K, wf, MMRT_DTYPE_F32, NULL, n,
                      b->data ? b->data + (size_t)n0 * bes : NULL, b->dtype, dst);
        for (int64_t m = 0; yb && st == MMRT_OK && m < M; m++)
            memcpy(c.y + m * N + n0, yb + m * n, (size_t)n * sizeof(float));
    }
    free(wf);
    free(yb);
    return st;
}

/* ---- MATMUL --------------------------------------------------------------------------- */

mmrt_status cpu_op_matmul(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_MATMUL, 2, 5, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *x = &o.src[0], *w = &o.src[1], *b = &o.src[2], *s = &o.src[3],
                          *z = &o.src[4], *y = &o.dst;
    int64_t K = cpu_inner(x), M = cpu_rows(x), N = w->ne[0];
    if (w->dtype == MMRT_DTYPE_U4)
        return matmul_u4(&o, x, w, b, s, z, y, M, K, N);
    return cpu_gemm(dev, (const float *)x->data, M, K, w->data, w->dtype,
                    (const float *)s->data, N, b->data, b->dtype, (float *)y->data);
}

/* ---- PATCH_EMBED ---------------------------------------------------------------------- */

struct im2col_ctx {
    const float *img; /* [B, C, H, W] */
    float *cols;      /* [B · nP, C · P · P] */
    int64_t C, H, W, P, n_px, n_patches;
};

/* One item per patch (b, py, px): row b·nP + py·n_px + px, in (c, kh, kw) order like the
 * flattened conv weight. */
static void im2col_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct im2col_ctx *c = vctx;
    (void)tid;
    int64_t P = c->P, patch_len = c->C * P * P;
    for (int64_t r = begin; r < end; r++) {
        int64_t bi = r / c->n_patches, p = r % c->n_patches;
        int64_t py = p / c->n_px, px = p % c->n_px;
        float *out = c->cols + r * patch_len;
        for (int64_t ch = 0; ch < c->C; ch++) {
            const float *plane = c->img + (bi * c->C + ch) * c->H * c->W;
            for (int64_t kh = 0; kh < P; kh++) {
                memcpy(out, plane + (py * P + kh) * c->W + px * P, (size_t)P * sizeof(float));
                out += P;
            }
        }
    }
}

mmrt_status cpu_op_patch_embed(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_patch_params p;
    float *cols = NULL;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_PATCH_EMBED, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *img = &o.src[0], *w = &o.src[1], *b = &o.src[2], *y = &o.dst;

    if ((st = cpu_op_params(&o, &p, sizeof p)))
        return st;
    int64_t B = img->ne[0], C = img->ne[1], H = img->ne[2], W = img->ne[3], P = p.patch;
    int64_t O = w->ne[0], n_patches = (H / P) * (W / P);
    if (y->numel == 0)
        return MMRT_OK;

    /* The gathered patches are exactly as many floats as the image. */
    cols = malloc((size_t)img->numel * sizeof(float) + 1);
    if (!cols)
        return cpu_bad(&o, MMRT_ERR_NO_MEMORY, "cannot allocate %" PRId64 " bytes for the "
                       "gathered patches", img->numel * (int64_t)sizeof(float));
    struct im2col_ctx ic = {
        .img = (const float *)img->data, .cols = cols, .C = C, .H = H, .W = W, .P = P,
        .n_px = W / P, .n_patches = n_patches,
    };
    cpu_parallel_for(&dev->pool, B * n_patches, (double)(C * P * P), im2col_task, &ic);
    st = cpu_gemm(dev, cols, B * n_patches, C * P * P, w->data, w->dtype, NULL, O, b->data,
                  b->dtype,
                  (float *)y->data);
    free(cols);
    return st;
}
