/*
 * plugins/cpu/cpu_ops_attention.c — ROPE, ROPE_MULTI, ATTENTION and ATTENTION_PAGED.
 *
 * ROPE follows Hugging Face's float32 arithmetic step by step (specs/models.md §1.4):
 * inv_freq[i] = 1 / theta^((2i)/n_rot) with the exponent divided in f32, angle = (f32)pos ·
 * inv_freq[i] in f32, then cosf/sinf, and x' = x·cos − x_pair·sin / x_pair·cos + x·sin with
 * each product rounded to f32 — the same values torch gets from q·cos + rotate_half(q)·sin.
 * The angle must stay f32: computed in double it differs by up to pos·2⁻²⁴ rad, which at
 * position 10⁴ is already visible in the output. One item per token: its cos/sin table
 * (per-thread scratch) is shared by all heads.
 *
 * ROPE_MULTI (Qwen2-VL's M-RoPE and vision rotary) is the same NEOX rotation with a per-pair
 * table: pair i takes the position of its section's axis and inv_freq[j] = 1 / theta^((2j) /
 * freq_dim), j = i or i minus its section's first pair (restart) — HF's cat(freqs, freqs)
 * split by mrope_section, and its vision rotary's outer(pos_h | pos_w, inv_freq).
 *
 * ATTENTION and ATTENTION_PAGED follow the order of HF's eager attention in every path:
 * scores = (q·k) · scale in f32, softmax with the row max subtracted (sum of the exponentials
 * in double), probabilities normalised before the weighted sum of v rows, accumulated in f32.
 * Query t of sequence s sees keys j < (t − cu_q[s]) + (Lk − Lq) + 1 when causal, and with a
 * sliding window only the last `window` of those (key_range): a row's keys are always one
 * contiguous range [lo, hi) in key order, and nothing before lo is read — a path reads from
 * the smallest lo of the rows it serves, so a long context with a window costs the window,
 * not the context. The two ops
 * differ only in where key j of a sequence lives (struct kv_tensor, kv_rows): row cu_k[s] + j
 * of a strided tensor, or row j % page_tokens of page page_table[s][j / page_tokens]. Every
 * path walks a sequence's keys in key order and reaches them only through kv_rows, so the
 * same keys give the same bits whichever op, page ids or page size deliver them. Three
 * paths, chosen per sequence by the kernel table and that sequence's own query count (never
 * by the thread count, T or the other sequences — the batch invariance of specs/engine.md):
 *
 *   blocked (a table with a GEMM micro-kernel, a sequence of more than CPU_ATTN_DOT_MAX_Q
 *     queries: prefill and vision): one item is a block of query tokens × the query heads of
 *     one kv head (GQA groups share their K and V), so the K and V of a kv head are read once
 *     per block and every FLOP runs on the GEMM micro-kernel: K is converted and transposed
 *     into micro-panels (pack_w), QKᵀ and P·V are micro-kernel products, the softmax runs on
 *     the vectorised exp (exp_sum). A micro-panel of K rows that straddles a page boundary
 *     is gathered into scratch first; V is packed run by run (a run: rows of one page).
 *   streaming (a table with a micro-kernel, a sequence of at most CPU_ATTN_DOT_MAX_Q queries:
 *     decode): one item is a sequence and a few neighbouring kv heads (stream_heads: about a
 *     thread's share of the work, however many that makes); each K row is read once and dotted
 *     with the few query rows of its group, then each V row once for the weighted sums — the
 *     KV cache is streamed from memory exactly once per step, pages included. How many heads
 *     an item takes changes only which rows a thread reads together, never a row's sums.
 *   portable (the portable table): per (query token, head) item with the plain dot product
 *     and one score row of per-thread scratch; the reference the others are tested against.
 *
 * A row's arithmetic depends only on its path and, on the blocked path, on its place in its
 * sequence's query blocks (keys other rows of its block see but this one does not add exact
 * zeros, before or after its own range), so one launch may mix decode and prefill sequences
 * and each gets what it would get alone. With a window, each row's softmax and sums start at
 * its own first key whatever the block, stream or page layout around it.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "op_contract.h"

/* ---- ROPE, ROPE_MULTI ------------------------------------------------------------------ */

/* One rotation serves both ops: pair i turns by (float)pos[t][axis[i]] · inv_freq[i]. ROPE has
 * one axis and inv_freq[i] of its own i; ROPE_MULTI gives each pair its section's axis and
 * frequency (counted from its section's start with restart), so the two share every rounding
 * step and ROPE_MULTI with equal axes is ROPE NEOX bit for bit. */
struct rope_ctx {
    const char *x;
    char *y;
    const int32_t *pos;    /* [T][n_axes] */
    const float *inv_freq; /* [n_rot / 2]: the frequency of each pair */
    const int32_t *axis;   /* [n_rot / 2]: the position axis of each pair; NULL: axis 0 */
    float *scratch;        /* [n_threads][n_rot]: cos then sin */
    int64_t H, D, n_rot, n_axes;
    int64_t x_nb0, x_nb1, y_nb0, y_nb1;
    int mode;
};

static void rope_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct rope_ctx *c = vctx;
    int64_t half = c->n_rot / 2;
    float *cs = c->scratch + (size_t)tid * (size_t)c->n_rot, *sn = cs + half;
    for (int64_t t = begin; t < end; t++) {
        const int32_t *pt = c->pos + t * c->n_axes;
        for (int64_t i = 0; i < half; i++) {
            float angle = (float)pt[c->axis ? c->axis[i] : 0] * c->inv_freq[i];
            cs[i] = cosf(angle);
            sn[i] = sinf(angle);
        }
        for (int64_t h = 0; h < c->H; h++) {
            const float *x = (const float *)(c->x + t * c->x_nb0 + h * c->x_nb1);
            float *y = (float *)(c->y + t * c->y_nb0 + h * c->y_nb1);
            /* Pairs are read before they are written, so y == x is fine. */
            if (c->mode == MMRT_ROPE_NEOX) {
                for (int64_t i = 0; i < half; i++) {
                    float a = x[i], b = x[i + half];
                    y[i] = a * cs[i] - b * sn[i];
                    y[i + half] = b * cs[i] + a * sn[i];
                }
            } else {
                for (int64_t i = 0; i < half; i++) {
                    float a = x[2 * i], b = x[2 * i + 1];
                    y[2 * i] = a * cs[i] - b * sn[i];
                    y[2 * i + 1] = b * cs[i] + a * sn[i];
                }
            }
            if (y != x)
                memcpy(y + c->n_rot, x + c->n_rot, (size_t)(c->D - c->n_rot) * sizeof(float));
        }
    }
}

/* One allocation for a rotation of n_rot/2 pairs: inv_freq [half], the threads' cos/sin
 * scratch [n_threads][n_rot], then (with_axis) the pairs' axes [half] as int32. */
static float *rope_alloc(struct cpu_op *o, int64_t n_rot, bool with_axis)
{
    size_t half = (size_t)n_rot / 2;
    size_t n_floats = half + (size_t)o->dev->pool.n_threads * (size_t)n_rot;
    size_t nbytes = n_floats * sizeof(float) + (with_axis ? half * sizeof(int32_t) : 0);
    float *buf = malloc(nbytes);
    if (!buf)
        cpu_bad(o, MMRT_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch", nbytes);
    return buf;
}

static void rope_launch(struct cpu_op *o, struct rope_ctx *c)
{
    const struct cpu_view *x = &o->src[0], *y = &o->dst;
    c->x = x->data;
    c->y = y->data;
    c->pos = (const int32_t *)o->src[1].data;
    c->H = x->ne[1];
    c->D = x->ne[2];
    c->x_nb0 = x->nb[0];
    c->x_nb1 = x->nb[1];
    c->y_nb0 = y->nb[0];
    c->y_nb1 = y->nb[1];
    int64_t half = c->n_rot / 2;
    cpu_parallel_for(&o->dev->pool, x->ne[0], (double)(c->H * c->D + 20 * half), rope_task, c);
}

mmrt_status cpu_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_rope_params p;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_ROPE, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = cpu_op_params(&o, &p, sizeof p)))
        return st;
    if (o.src[0].numel == 0)
        return MMRT_OK;

    int64_t half = p.n_rot / 2;
    float *buf = rope_alloc(&o, p.n_rot, false);
    if (!buf)
        return MMRT_ERR_NO_MEMORY;
    for (int64_t i = 0; i < half; i++)
        buf[i] = 1.0f / powf(p.theta, (float)(2 * i) / (float)p.n_rot);
    struct rope_ctx c = {
        .inv_freq = buf, .axis = NULL, .scratch = buf + half, .n_rot = p.n_rot, .n_axes = 1,
        .mode = p.mode,
    };
    rope_launch(&o, &c);
    free(buf);
    return MMRT_OK;
}

mmrt_status cpu_op_rope_multi(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_rope_multi_params p;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_ROPE_MULTI, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = cpu_op_params(&o, &p, sizeof p)))
        return st;
    if (o.src[0].numel == 0)
        return MMRT_OK;

    int64_t half = p.n_rot / 2;
    float *buf = rope_alloc(&o, p.n_rot, true);
    if (!buf)
        return MMRT_ERR_NO_MEMORY;
    int32_t *axis = (int32_t *)(buf + half + (size_t)dev->pool.n_threads * (size_t)p.n_rot);
    for (int a = 0, i = 0; a < p.n_axes; a++)
        for (int k = 0; k < p.sections[a]; k++, i++) {
            int j = p.restart ? k : i;
            axis[i] = a;
            buf[i] = 1.0f / powf(p.theta, (float)(2 * j) / (float)p.freq_dim);
        }
    struct rope_ctx c = {
        .inv_freq = buf, .axis = axis, .scratch = buf + half, .n_rot = p.n_rot,
        .n_axes = p.n_axes, .mode = MMRT_ROPE_NEOX,
    };
    rope_launch(&o, &c);
    free(buf);
    return MMRT_OK;
}

/* ---- ATTENTION, ATTENTION_PAGED ------------------------------------------------------- */

/* K or V as the kernels read it. Row j of sequence s, kv head g lies at
 *   data + (cu_k[s] + j)·nb0 + g·nb1                                        ATTENTION
 *   data + table[s][j / page_tokens]·page_nb + (j % page_tokens)·nb0 + g·nb1  PAGED
 * (byte strides). */
struct kv_tensor {
    const char *data;
    int64_t nb0, nb1, page_nb;
    int dtype;
    const float *scales; /* I8 pages' row scales (plugin.h), one per D codes; else NULL */
    int64_t scale_step;  /* between the scales of a head's consecutive rows: Hkv */
};

/* The D values of an I8 row with scale s as f32: code · s, one rounded product each, so
 * every path below computes what it would on an F32 copy of them. Other dtypes are widened
 * by the kernels. With a kernel table the products come from its axpy into zeros: a fused
 * multiply-add of 0 rounds the product once, so the bits are the same, in the table's vector
 * width. */
static void kv_dequant(const struct cpu_kernels *kt, const char *row, float s, int64_t D,
                       float *out)
{
    if (kt) {
        memset(out, 0, (size_t)D * sizeof(float));
        kt->axpy_rows(out, &s, row, MMRT_DTYPE_I8, 0, NULL, 0, 1, D);
        return;
    }
    const int8_t *c = (const int8_t *)row;
    for (int64_t i = 0; i < D; i++)
        out[i] = (float)c[i] * s;
}

/* A block of query tokens [q0, q0 + nq) of sequence seq with the query heads of kv head g,
 * run on the streaming path (the whole sequence) or the blocked one. */
struct attn_item {
    int64_t seq, g, q0, nq;
    int64_t ng; /* kv heads g … g + ng − 1: several on the streaming path, else 1 */
    bool stream;
};

struct attn_ctx {
    const struct cpu_kernels *kt; /* the micro-kernel paths; NULL: portable */
    const float *q;
    float *y;
    struct kv_tensor kv[2];       /* K, V */
    const int32_t *cu_q;          /* [n_seq + 1] */
    const int32_t *cu_k;          /* ATTENTION [n_seq + 1]; NULL when paged */
    const int32_t *kv_lens;       /* PAGED [n_seq] */
    const int32_t *table;         /* PAGED [n_seq][max_pages] */
    int64_t max_pages, page_tokens;
    const struct attn_item *items;
    float *scratch;               /* [n_threads][per_thread] */
    size_t per_thread;            /* floats */
    int64_t n_seq, Hq, D, n_rep, max_lk;
    int64_t max_span;             /* most keys one item (or portable row) reads: max_lk, or
                                     less with a window */
    int64_t window;               /* sliding window in key positions; 0: none */
    float scale;
    bool causal;
};

static int64_t seq_keys(const struct attn_ctx *c, int64_t s)
{
    return c->table ? c->kv_lens[s] : c->cu_k[s + 1] - c->cu_k[s];
}

/* Keys visible to query token t of sequence s: [*lo, hi), hi returned. Causal: hi is the
 * query's position p + 1 = (t − cu_q[s]) + (Lk − Lq) + 1 clamped to [0, Lk], and a window
 * keeps the last `window` of them (p − window < j ≤ p). Both ends never decrease with t. */
static int64_t key_range(const struct attn_ctx *c, int64_t s, int64_t t, int64_t *lo)
{
    int64_t lq = c->cu_q[s + 1] - c->cu_q[s], lk = seq_keys(c, s);
    *lo = 0;
    if (!c->causal)
        return lk;
    int64_t lim = (t - c->cu_q[s]) + (lk - lq) + 1;
    lim = lim < 0 ? 0 : lim < lk ? lim : lk;
    if (c->window > 0 && lim > c->window)
        *lo = lim - c->window;
    return lim;
}

/* Row j of (sequence s, kv head g) of x, and in *run how many rows from j on follow it
 * x->nb0 bytes apart: the rest of its page, or all of them when x is not paged. */
static const char *kv_rows(const struct attn_ctx *c, const struct kv_tensor *x, int64_t s,
                           int64_t g, int64_t j, int64_t *run)
{
    if (!c->table) {
        *run = INT64_MAX;
        return x->data + (c->cu_k[s] + j) * x->nb0 + g * x->nb1;
    }
    int64_t page = c->table[s * c->max_pages + j / c->page_tokens], r = j % c->page_tokens;
    *run = c->page_tokens - r;
    return x->data + page * x->page_nb + r * x->nb0 + g * x->nb1;
}

/* Where an I8 row's scale is (NULL for other dtypes): the pages are contiguous with one-byte
 * codes, so a row's scale sits at its byte offset / D (nb1). */
static const float *kv_row_scale(const struct kv_tensor *x, const char *row)
{
    return x->scales ? x->scales + (row - x->data) / x->nb1 : NULL;
}

/* The rows of one (sequence, kv head) in key order, with a table lookup per page only; for
 * I8 pages, scale points at the current row's. */
struct kv_walk {
    const struct attn_ctx *c;
    const struct kv_tensor *x;
    int64_t s, g, j, left;
    const char *row;
    const float *scale;
};

static void kv_walk_init(struct kv_walk *w, const struct attn_ctx *c, const struct kv_tensor *x,
                         int64_t s, int64_t g, int64_t j0)
{
    *w = (struct kv_walk){ c, x, s, g, j0, 0, NULL, NULL };
}

static const char *kv_walk_next(struct kv_walk *w)
{
    const struct kv_tensor *x = w->x;
    if (w->left == 0) {
        w->row = kv_rows(w->c, x, w->s, w->g, w->j, &w->left);
        /* found once per page; the next row's is Hkv (scale_step) on */
        w->scale = kv_row_scale(x, w->row);
    } else {
        w->row += x->nb0;
        if (x->scales)
            w->scale += x->scale_step;
    }
    w->left--;
    w->j++;
    return w->row;
}

/* Rows j … j + n − 1 of (s, g) of x as one block of rows *ld elements apart: in place when
 * they lie in one run, else copied unconverted into tmp (n · D elements of x's dtype); I8
 * rows always dequantized into tmp (n · D floats), *dtype then F32. */
static const char *kv_block(const struct attn_ctx *c, const struct kv_tensor *x, int64_t s,
                            int64_t g, int64_t j, int64_t n, char *tmp, int64_t *ld, int *dtype)
{
    const int64_t es = (int64_t)mmrt_dtype_size((enum mmrt_dtype)x->dtype);
    int64_t run;
    *dtype = x->dtype;
    if (x->scales) {
        struct kv_walk w;
        kv_walk_init(&w, c, x, s, g, j);
        for (int64_t i = 0; i < n; i++) {
            const char *row = kv_walk_next(&w);
            kv_dequant(c->kt, row, *w.scale, c->D, (float *)tmp + i * c->D);
        }
        *ld = c->D;
        *dtype = MMRT_DTYPE_F32;
        return tmp;
    }
    const char *p = kv_rows(c, x, s, g, j, &run);
    if (run >= n) {
        *ld = x->nb0 / es;
        return p;
    }
    struct kv_walk w;
    kv_walk_init(&w, c, x, s, g, j);
    for (int64_t i = 0; i < n; i++)
        memcpy(tmp + i * c->D * es, kv_walk_next(&w), (size_t)(c->D * es));
    *ld = c->D;
    return tmp;
}

/* The next K or V row of w's walk, its first d elements as f32: the row itself, or its
 * conversion in tmp. */
static const float *kv_row_f32(struct kv_walk *w, int64_t d, float *tmp)
{
    const char *p = kv_walk_next(w);
    const int dtype = w->x->dtype;
    if (dtype == MMRT_DTYPE_F32)
        return (const float *)p;
    if (w->x->scales) {
        kv_dequant(NULL, p, *w->scale, d, tmp);
        return tmp;
    }
    for (int64_t i = 0; i < d; i++)
        tmp[i] = cpu_load_weight(p, dtype, i); /* F16 or F8E4M3, widened exactly */
    return tmp;
}

/* Portable path: item u is (token u / Hq, head u % Hq). */
static void attn_portable_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct attn_ctx *c = vctx;
    int64_t D = c->D;
    float *sc = c->scratch + (size_t)tid * c->per_thread;
    float acc[CPU_MAX_HEAD_DIM], tmp[CPU_MAX_HEAD_DIM];

    for (int64_t u = begin; u < end; u++) {
        int64_t t = u / c->Hq, h = u % c->Hq;
        /* Last s with cu_q[s] ≤ t; empty sequences share a bound and are skipped over. */
        int64_t lo = 0, hi = c->n_seq;
        while (hi - lo > 1) {
            int64_t mid = (lo + hi) / 2;
            if (c->cu_q[mid] <= t)
                lo = mid;
            else
                hi = mid;
        }
        int64_t j0;
        const int64_t n_keys = key_range(c, lo, t, &j0) - j0; /* keys j0 … j0 + n_keys − 1 */
        float *out = c->y + u * D;
        if (n_keys == 0) {
            memset(out, 0, (size_t)D * sizeof(float));
            continue;
        }
        const float *qr = c->q + u * D;
        int64_t kvh = h / c->n_rep;
        struct kv_walk w;
        kv_walk_init(&w, c, &c->kv[0], lo, kvh, j0);
        float m = -INFINITY;
        for (int64_t j = 0; j < n_keys; j++) {
            const float *kr = kv_row_f32(&w, D, tmp);
            float s = cpu_dot_f32(qr, kr, D) * c->scale;
            sc[j] = s;
            m = s > m ? s : m;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; j++) {
            sc[j] = expf(sc[j] - m);
            sum += sc[j];
        }
        double inv = 1.0 / sum;
        for (int64_t i = 0; i < D; i++)
            acc[i] = 0.0f;
        kv_walk_init(&w, c, &c->kv[1], lo, kvh, j0);
        for (int64_t j = 0; j < n_keys; j++) {
            float pj = (float)(sc[j] * inv);
            const float *vr = kv_row_f32(&w, D, tmp);
            for (int64_t i = 0; i < D; i++)
                acc[i] += pj * vr[i];
        }
        memcpy(out, acc, (size_t)D * sizeof(float));
    }
}

/* ---- kernel-table paths (blocked and streaming) --------------------------------------- */

static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* Row r of an item: kv head g + r / (nq · n_rep); within it, token q0 + (r / n_rep) mod nq
 * and query head (its kv head)·n_rep + r % n_rep. Its q and y rows. */
static int64_t row_offset(const struct attn_ctx *c, const struct attn_item *it, int64_t r)
{
    const int64_t per = it->nq * c->n_rep, rr = r % per;
    int64_t t = it->q0 + rr / c->n_rep, h = (it->g + r / per) * c->n_rep + rr % c->n_rep;
    return (t * c->Hq + h) * c->D;
}

/* Floats of per-thread scratch a blocked item of up to R rows needs (attn_blocked_item's
 * layout, plus one micro-panel of gathered K rows). */
static size_t blocked_scratch(const struct attn_ctx *c, int64_t R)
{
    const int64_t MR = c->kt->mr, NR = c->kt->nr, D = c->D;
    int64_t Rp = round_up(R, MR), Kn = round_up(c->max_span, NR), Dp = round_up(D, NR);
    return (size_t)(Rp * D + Kn * D + 2 * Rp * Kn + Dp * Kn + Rp * Dp + NR * D + 16);
}

static void attn_blocked_item(const struct attn_ctx *c, const struct attn_item *it, float *base)
{
    const struct cpu_kernels *kt = c->kt;
    const struct kv_tensor *K = &c->kv[0], *V = &c->kv[1];
    const int64_t MR = kt->mr, NR = kt->nr, D = c->D;
    const int64_t R = it->nq * c->n_rep, Rp = round_up(R, MR), Dp = round_up(D, NR);
    /* The block reads keys [j0, j0 + n_keys): from its first query's first key to its last
     * query's last (both ends grow with the query). */
    int64_t j0, unused;
    key_range(c, it->seq, it->q0, &j0);
    const int64_t n_keys = key_range(c, it->seq, it->q0 + it->nq - 1, &unused) - j0;
    if (n_keys <= 0) {
        for (int64_t r = 0; r < R; r++)
            memset(c->y + row_offset(c, it, r), 0, (size_t)D * sizeof(float));
        return;
    }
    const int64_t Kn = round_up(n_keys, NR);
    float *xq = base, *kp = xq + Rp * D, *sc = kp + Kn * D, *pp = sc + Rp * Kn;
    float *vp = pp + Rp * Kn, *o = vp + Dp * Kn;
    char *gathered = (char *)(o + Rp * Dp);

    /* Q rows into micro-kernel x panels (a GQA group's rows are gathered into o first,
     * which is free until the end), K rows transposed into W micro-panels. */
    const float *qsrc = c->q + row_offset(c, it, 0);
    int64_t ldq = c->Hq * D;
    if (c->n_rep > 1) {
        for (int64_t r = 0; r < R; r++)
            memcpy(o + r * D, c->q + row_offset(c, it, r), (size_t)D * sizeof(float));
        qsrc = o;
        ldq = D;
    }
    for (int64_t p = 0; p < Rp; p += MR)
        kt->pack_x(qsrc + p * ldq, ldq, R - p < MR ? R - p : MR, D, xq + p * D);
    for (int64_t j = 0; j < Kn; j += NR) {
        int64_t cols = n_keys - j < NR ? n_keys - j : NR, ld;
        int dt;
        const char *rows = kv_block(c, K, it->seq, it->g, j0 + j, cols, gathered, &ld, &dt);
        kt->pack_w(rows, dt, ld, cols, D, kp + j * D);
    }
    /* S = Q·Kᵀ, tile by tile. */
    for (int64_t p = 0; p < Rp; p += MR)
        for (int64_t j = 0; j < Kn; j += NR)
            kt->micro(xq + p * D, kp + j * D, NR, D, sc + p * Kn + j, Kn, 0);
    /* Softmax per row in place over its own keys [lo, hi) (zero outside them), then the
     * rows become the x panels of P·V. */
    for (int64_t r = 0; r < R; r++) {
        int64_t lo, hi = key_range(c, it->seq, it->q0 + r / c->n_rep, &lo);
        lo -= j0; /* a row that sees no key has lo = hi = 0, and so has the block's first */
        hi -= j0;
        float *row = sc + r * Kn;
        if (hi > lo) {
            float m = kt->scale_max(row + lo, c->scale, hi - lo);
            kt->scale_d(row + lo, 1.0 / kt->exp_sum(row + lo, m, row + lo, hi - lo), hi - lo);
        }
        memset(row, 0, (size_t)lo * sizeof(float));
        memset(row + hi, 0, (size_t)(Kn - hi) * sizeof(float));
    }
    for (int64_t p = 0; p < Rp; p += MR)
        kt->pack_x(sc + p * Kn, Kn, R - p < MR ? R - p : MR, n_keys, pp + p * Kn);
    /* V rows, converted, into NR-wide micro-panels [Dp/NR][n_keys][NR], one run of rows at
     * a time. (Feeding f32 V rows to the micro-kernel in place was measured slower: their
     * stride is often a multiple of 4 KiB, so the rows share one L1 set, and no prefetcher
     * follows them.) */
    const int64_t ves = (int64_t)mmrt_dtype_size((enum mmrt_dtype)V->dtype);
    for (int64_t j = 0, run; j < n_keys; j += run) {
        const char *rows = kv_rows(c, V, it->seq, it->g, j0 + j, &run);
        run = n_keys - j < run ? n_keys - j : run;
        if (V->scales) { /* I8: up to NR rows at a time dequantized into `gathered` */
            run = run < NR ? run : NR;
            int dt;
            int64_t unused;
            const float *f = (const float *)kv_block(c, V, it->seq, it->g, j0 + j, run,
                                                     gathered, &unused, &dt);
            for (int64_t d = 0; d < Dp; d += NR)
                kt->pack_rows(f + d, dt, D, run, D - d < NR ? D - d : NR, vp + d * Kn + j * NR);
            continue;
        }
        for (int64_t d = 0; d < Dp; d += NR)
            kt->pack_rows(rows + d * ves, V->dtype, V->nb0 / ves, run, D - d < NR ? D - d : NR,
                          vp + d * Kn + j * NR);
    }
    for (int64_t p = 0; p < Rp; p += MR)
        for (int64_t d = 0; d < Dp; d += NR)
            kt->micro(pp + p * Kn, vp + d * Kn, NR, n_keys, o + p * Dp + d, Dp, 0);
    for (int64_t r = 0; r < R; r++)
        memcpy(c->y + row_offset(c, it, r), o + r * Dp, (size_t)D * sizeof(float));
}

/* Keys per dot_rows / axpy_rows call: a page of 16, or 16 keys of a contiguous cache. */
#define CPU_ATTN_RUN 16

/* Query rows of one streaming item at most (kv heads · tokens · n_rep): attn_stream_item's
 * reciprocal sums. */
#define CPU_ATTN_STREAM_ROWS (CPU_ATTN_DOT_MAX_Q * 64)

/* Bytes of neighbouring heads' rows per token from which the walk leaves the next run to the
 * hardware prefetcher: software prefetches of 1 KiB and more per token were slower than none
 * (a prefetch waits for a line fill buffer; the L2 streamer does not). */
#define CPU_ATTN_HW_PREFETCH 1024

/* Up to CPU_ATTN_RUN rows of (s, g) of x from key j on, all in one page and before `end`
 * (j < end): the first row, their count in *n, and for I8 pages their scales in *scales
 * (x->scale_step apart). */
static const char *kv_run(const struct attn_ctx *c, const struct kv_tensor *x, int64_t s,
                          int64_t g, int64_t j, int64_t end, int64_t *n, const float **scales)
{
    int64_t run;
    const char *row = kv_rows(c, x, s, g, j, &run);
    run = end - j < run ? end - j : run;
    *n = run < CPU_ATTN_RUN ? run : CPU_ATTN_RUN;
    *scales = kv_row_scale(x, row);
    return row;
}

/* Prefetches n tokens' rows, ld bytes apart, of ng heads hs bytes apart, row_bytes each. One
 * kv head's rows of a KV cache are n_kv_heads · head_dim elements apart — 16 KiB for
 * LLaMA-7B — and pages lie anywhere, so where a run reads only a few heads no hardware
 * prefetcher follows them from one 4 KiB page to the next; without this the streaming path
 * would wait on memory latency rather than bandwidth. */
static void prefetch_rows(const char *row, int64_t n, int64_t ld, int64_t ng, int64_t hs,
                          int64_t row_bytes)
{
    for (int64_t i = 0; i < n; i++, row += ld)
        for (int64_t h = 0; h < ng; h++)
            for (int64_t b = 0; b < row_bytes; b += 64)
                __builtin_prefetch(row + h * hs + b, 0, 3);
}

/* The keys [j0, j1) of sequence s of x as runs (kv_run) of kv head g's rows; kv heads
 * g + 1 … g + ng − 1 lie nb1, 2·nb1, … after them. The next run is prefetched while the
 * current one computes, unless its heads are wide enough for the hardware to
 * (CPU_ATTN_HW_PREFETCH). */
struct kv_runs {
    const struct attn_ctx *c;
    const struct kv_tensor *x;
    int64_t s, g, ng, end, row_bytes; /* row_bytes: one head's row */
    int64_t j, n; /* the current run: keys [j, j + n) */
    const char *rows;
    const float *scales;
    int64_t next_n; /* the run after it (next_rows NULL: none) */
    const char *next_rows;
    const float *next_scales;
};

static void kv_runs_fetch_next(struct kv_runs *w)
{
    w->next_rows = NULL;
    if (w->j + w->n < w->end) {
        w->next_rows = kv_run(w->c, w->x, w->s, w->g, w->j + w->n, w->end, &w->next_n,
                              &w->next_scales);
        if (w->ng * w->row_bytes < CPU_ATTN_HW_PREFETCH)
            prefetch_rows(w->next_rows, w->next_n, w->x->nb0, w->ng, w->x->nb1, w->row_bytes);
    }
}

/* Starts at the first run; false when the range is empty. */
static bool kv_runs_start(struct kv_runs *w, const struct attn_ctx *c,
                          const struct kv_tensor *x, int64_t s, int64_t g, int64_t ng,
                          int64_t j0, int64_t j1)
{
    *w = (struct kv_runs){
        .c = c, .x = x, .s = s, .g = g, .ng = ng, .end = j1, .j = j0,
        .row_bytes = c->D * (int64_t)mmrt_dtype_size((enum mmrt_dtype)x->dtype),
    };
    if (j0 >= j1)
        return false;
    w->rows = kv_run(c, x, s, g, j0, j1, &w->n, &w->scales);
    kv_runs_fetch_next(w);
    return true;
}

/* Moves to the next run; false past the last. */
static bool kv_runs_next(struct kv_runs *w)
{
    if (!w->next_rows)
        return false;
    w->j += w->n;
    w->rows = w->next_rows;
    w->n = w->next_n;
    w->scales = w->next_scales;
    kv_runs_fetch_next(w);
    return true;
}

/* The part [*a, *b) of the current run that a query seeing keys [lo, hi) meets; false if none. */
static bool kv_runs_part(const struct kv_runs *w, int64_t lo, int64_t hi, int64_t *a, int64_t *b)
{
    *a = lo > w->j ? lo : w->j;
    *b = hi < w->j + w->n ? hi : w->j + w->n;
    return *a < *b;
}

/* Floats of per-thread scratch a streaming item of up to R rows needs. */
static size_t stream_scratch(const struct attn_ctx *c, int64_t R)
{
    return (size_t)(R * c->D + R * c->max_span + 16);
}

/* One item's queries against its keys in two passes over the key range, a run at a time:
 * the scores (dot_rows), softmax per query, then the weighted V rows (axpy_rows). Query r
 * meets only the keys [lo, hi) of its token, a contiguous part of each run. */
static void attn_stream_item(const struct attn_ctx *c, const struct attn_item *it, float *base)
{
    const struct cpu_kernels *kt = c->kt;
    const struct kv_tensor *K = &c->kv[0], *V = &c->kv[1];
    const int64_t D = c->D, nr = c->n_rep, per = it->nq * nr, R = it->ng * per;
    float *acc = base, *sc = acc + R * D;
    /* Query tl sees keys [lo[tl], hi[tl]); the item walks [j0, j1), the union (both ends grow
     * with the query). Scores are stored at j − j0. */
    int64_t lo[CPU_ATTN_DOT_MAX_Q], hi[CPU_ATTN_DOT_MAX_Q], j0 = INT64_MAX, j1 = 0;
    for (int64_t tl = 0; tl < it->nq; tl++) {
        hi[tl] = key_range(c, it->seq, it->q0 + tl, &lo[tl]);
        j0 = lo[tl] < j0 ? lo[tl] : j0;
        j1 = hi[tl] > j1 ? hi[tl] : j1;
    }
    const int64_t ld = c->max_span;
    /* Row r: its q and y rows, its token's place tlr[r] in the item and its kv head's place
     * hr[r] (its rows lie hr[r]·nb1 after the run's), found once: a division per row and run
     * cost as much as a short row's dot. */
    int64_t qof[CPU_ATTN_STREAM_ROWS], tlr[CPU_ATTN_STREAM_ROWS], hr[CPU_ATTN_STREAM_ROWS];
    for (int64_t r = 0; r < R; r++) {
        qof[r] = row_offset(c, it, r);
        tlr[r] = r % per / nr;
        hr[r] = r / per;
    }
    struct kv_runs w;
    for (bool more = kv_runs_start(&w, c, K, it->seq, it->g, it->ng, j0, j1); more;
         more = kv_runs_next(&w))
        for (int64_t r = 0, a, b; r < R; r++)
            if (kv_runs_part(&w, lo[tlr[r]], hi[tlr[r]], &a, &b))
                kt->dot_rows(c->q + qof[r], w.rows + (a - w.j) * K->nb0 + hr[r] * K->nb1,
                             K->dtype, K->nb0,
                             w.scales ? w.scales + (a - w.j) * K->scale_step + hr[r] : NULL,
                             K->scale_step, b - a, D, c->scale, sc + r * ld + a - j0);
    double inv[CPU_ATTN_STREAM_ROWS];
    for (int64_t r = 0; r < R; r++) {
        const int64_t n = hi[tlr[r]] - lo[tlr[r]];
        float *row = sc + r * ld + (lo[tlr[r]] - j0), m = kt->scale_max(row, 1.0f, n);
        inv[r] = n ? 1.0 / kt->exp_sum(row, m, row, n) : 0.0;
    }
    memset(acc, 0, (size_t)(R * D) * sizeof(float));
    float p[CPU_ATTN_RUN];
    for (bool more = kv_runs_start(&w, c, V, it->seq, it->g, it->ng, j0, j1); more;
         more = kv_runs_next(&w))
        for (int64_t r = 0, a, b; r < R; r++) {
            if (!kv_runs_part(&w, lo[tlr[r]], hi[tlr[r]], &a, &b))
                continue;
            for (int64_t i = a; i < b; i++)
                p[i - a] = (float)(sc[r * ld + i - j0] * inv[r]);
            kt->axpy_rows(acc + r * D, p, w.rows + (a - w.j) * V->nb0 + hr[r] * V->nb1,
                          V->dtype, V->nb0,
                          w.scales ? w.scales + (a - w.j) * V->scale_step + hr[r] : NULL,
                          V->scale_step, b - a, D);
        }
    for (int64_t r = 0; r < R; r++)
        memcpy(c->y + qof[r], acc + r * D, (size_t)D * sizeof(float));
}

static void attn_items_task(void *vctx, int tid, int64_t begin, int64_t end)
{
    const struct attn_ctx *c = vctx;
    float *base = c->scratch + (size_t)tid * c->per_thread;
    for (int64_t u = begin; u < end; u++) {
        if (c->items[u].stream)
            attn_stream_item(c, &c->items[u], base);
        else
            attn_blocked_item(c, &c->items[u], base);
    }
}

/* The keys a streaming item of sequence s walks: from its first query's first visible key to
 * its last query's last (with a window, fewer than the sequence holds). */
static int64_t stream_span(const struct attn_ctx *c, int64_t s)
{
    int64_t j0, unused;
    key_range(c, s, c->cu_q[s], &j0);
    return key_range(c, s, c->cu_q[s + 1] - 1, &unused) - j0;
}

/* The kv heads of one streaming item of sequence s (1 … Hkv): about `share` of kv heads × keys,
 * a thread's part of the launch's streaming work, so there are about as many items as threads
 * and each reads the neighbouring heads of a run together: one token's K (or V) rows of
 * several heads lie side by side, a stretch the hardware prefetcher follows, where one head's
 * 128–512 bytes of each row, 8–16 KiB apart, left the walk bound by the misses its software
 * prefetches keep in flight (docs/BENCHMARKS.md, "Decode attention over neighbouring heads").
 * A row's arithmetic does not depend on the grouping, so neither do its bits. */
static int64_t stream_heads(const struct attn_ctx *c, int64_t s, double share)
{
    const int64_t Hkv = c->Hq / c->n_rep, lq = c->cu_q[s + 1] - c->cu_q[s];
    double want = share / (double)(stream_span(c, s) + 1);
    int64_t ng = want >= (double)Hkv ? Hkv : want < 1 ? 1 : (int64_t)want;
    const int64_t cap = CPU_ATTN_STREAM_ROWS / (lq * c->n_rep);
    ng = ng < cap ? ng : cap;
    /* equal groups: 32 heads by at most 12 as 11 + 11 + 10, not 12 + 12 + 8 */
    const int64_t groups = (Hkv + ng - 1) / ng;
    return (Hkv + groups - 1) / groups;
}

/* Runs the blocked and streaming paths, each sequence on the one its query count picks;
 * fails only when scratch cannot be allocated. */
static mmrt_status attention_kernels(struct mmrt_device *dev, struct cpu_op *o,
                                     struct attn_ctx *c)
{
    const struct cpu_kernels *kt = c->kt;
    const int64_t Hkv = c->Hq / c->n_rep;
    const bool can_stream = c->n_rep <= 64; /* attn_stream_item's inv[] */
    double stream_work = 0; /* kv heads × keys over the streaming sequences */
    /* Blocked: about CPU_ATTN_BLOCK_PANELS micro-panels of rows per item. */
    int64_t qb = kt->mr * CPU_ATTN_BLOCK_PANELS / c->n_rep;
    if (qb < 1)
        qb = 1;
    int64_t n_items = 0, stream_rows = 0, blocked_rows = 0;
    c->max_span = 0; /* the widest key range of any item, for the score scratch */
    for (int64_t s = 0; s < c->n_seq; s++) {
        int64_t lq = c->cu_q[s + 1] - c->cu_q[s];
        if (lq == 0)
            continue;
        /* An item's queries [b, b + n) read keys from b's first to the last one's last. */
        const int64_t step = can_stream && lq <= CPU_ATTN_DOT_MAX_Q ? lq : qb;
        for (int64_t b = c->cu_q[s]; b < c->cu_q[s + 1]; b += step) {
            int64_t e = b + step < c->cu_q[s + 1] ? b + step : c->cu_q[s + 1], j0, unused;
            key_range(c, s, b, &j0);
            int64_t span = key_range(c, s, e - 1, &unused) - j0;
            c->max_span = span > c->max_span ? span : c->max_span;
        }
        if (can_stream && lq <= CPU_ATTN_DOT_MAX_Q) {
            stream_work += (double)Hkv * (double)(stream_span(c, s) + 1);
        } else {
            int64_t rows = (lq < qb ? lq : qb) * c->n_rep;
            n_items += Hkv * ((lq + qb - 1) / qb);
            blocked_rows = rows > blocked_rows ? rows : blocked_rows;
        }
    }
    if (c->max_span < 1)
        c->max_span = 1;
    size_t n_threads = (size_t)dev->pool.n_threads;
    const double share = stream_work / (double)n_threads;
    for (int64_t s = 0; s < c->n_seq; s++) {
        int64_t lq = c->cu_q[s + 1] - c->cu_q[s];
        if (lq == 0 || !can_stream || lq > CPU_ATTN_DOT_MAX_Q)
            continue;
        int64_t ng = stream_heads(c, s, share);
        n_items += (Hkv + ng - 1) / ng;
        stream_rows = ng * lq * c->n_rep > stream_rows ? ng * lq * c->n_rep : stream_rows;
    }
    size_t per_stream = stream_rows ? stream_scratch(c, stream_rows) : 0;
    size_t per_blocked = blocked_rows ? blocked_scratch(c, blocked_rows) : 0;
    c->per_thread = per_stream > per_blocked ? per_stream : per_blocked;
    size_t nbytes = n_threads * c->per_thread * sizeof(float);
    struct attn_item *items = malloc((size_t)(n_items ? n_items : 1) * sizeof *items);
    c->scratch = malloc(nbytes ? nbytes : 1);
    mmrt_status st = MMRT_OK;
    if (!items || !c->scratch) {
        st = cpu_bad(o, MMRT_ERR_NO_MEMORY, "cannot allocate %zu bytes of attention scratch",
                     nbytes);
        goto out;
    }
    int64_t n = 0;
    for (int64_t s = 0; s < c->n_seq; s++) {
        int64_t q0 = c->cu_q[s], lq = c->cu_q[s + 1] - q0;
        bool stream = can_stream && lq <= CPU_ATTN_DOT_MAX_Q;
        const int64_t ng = stream && lq > 0 ? stream_heads(c, s, share) : 1;
        for (int64_t g = 0; g < Hkv && lq > 0; g += ng) {
            if (stream) {
                items[n++] = (struct attn_item){ s, g, q0, lq, Hkv - g < ng ? Hkv - g : ng, true };
                continue;
            }
            for (int64_t b = q0; b < q0 + lq; b += qb) {
                int64_t nq = q0 + lq - b < qb ? q0 + lq - b : qb;
                items[n++] = (struct attn_item){ s, g, b, nq, 1, false };
            }
        }
    }
    c->items = items;
    int64_t rows = stream_rows > blocked_rows ? stream_rows : blocked_rows;
    cpu_parallel_for(&dev->pool, n_items, 4.0 * (double)c->D * (double)(c->max_span + 1) *
                     (double)rows, attn_items_task, c);
out:
    free(items);
    free(c->scratch);
    return st;
}

/* Runs either op once its ctx holds the tensors and checked index values. */
static mmrt_status attention_run(struct mmrt_device *dev, struct cpu_op *o, struct attn_ctx *c,
                                 int64_t T)
{
    c->max_lk = 1;
    for (int64_t s = 0; s < c->n_seq; s++)
        if (seq_keys(c, s) > c->max_lk)
            c->max_lk = seq_keys(c, s);
    if (T == 0 || c->Hq == 0)
        return MMRT_OK;
    if (dev->kern.micro) {
        c->kt = &dev->kern;
        return attention_kernels(dev, o, c);
    }
    /* A portable row scores at most its window's keys. */
    c->max_span = c->window > 0 && c->window < c->max_lk ? c->window : c->max_lk;
    c->per_thread = (size_t)c->max_span;
    size_t nbytes = (size_t)dev->pool.n_threads * c->per_thread * sizeof(float);
    c->scratch = malloc(nbytes);
    if (!c->scratch)
        return cpu_bad(o, MMRT_ERR_NO_MEMORY, "cannot allocate %zu bytes of score rows", nbytes);
    /* Per item: a full score row and weighted sum; causal rows without a window average half
     * of that. */
    double cost = 2.0 * (double)c->D * (double)(c->max_span + 1) *
                  (c->causal && c->max_span == c->max_lk ? 0.5 : 1.0);
    cpu_parallel_for(&dev->pool, T * c->Hq, cost, attn_portable_task, c);
    free(c->scratch);
    return MMRT_OK;
}

/* cu_seqlens: I32 [n_seq + 1], starting at 0, non-decreasing, ending at `total`. */
static mmrt_status check_cu(struct cpu_op *o, const char *what, const struct cpu_view *cu,
                            int64_t n_seq, int64_t total)
{
    const int32_t *v = (const int32_t *)cu->data;
    if (v[0] != 0 || v[n_seq] != total)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s must run from 0 to %" PRId64 ", got %" PRId32
                       " … %" PRId32, what, total, v[0], v[n_seq]);
    for (int64_t s = 0; s < n_seq; s++)
        if (v[s + 1] < v[s])
            return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s decreases at entry %" PRId64 " (%" PRId32
                           " after %" PRId32 ")", what, s + 1, v[s + 1], v[s]);
    return MMRT_OK;
}

/* The attention params of a launch: ABI 1.4 callers' 12 bytes read as window 0. */
static mmrt_status attention_params(struct cpu_op *o, struct mmrt_attention_params *p)
{
    char why[128];
    if (mmrt_pv_attention_params(o->params, o->params_size, p, why, sizeof why) != MMRT_OK)
        return cpu_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    return MMRT_OK;
}

static struct kv_tensor kv_of(const struct cpu_view *x, int64_t page_nb,
                              const struct cpu_view *scales)
{
    int rank = x->n_dims;
    return (struct kv_tensor){ x->data, x->nb[rank - 3], x->nb[rank - 2], page_nb, x->dtype,
                               scales ? (const float *)scales->data : NULL, x->ne[rank - 2] };
}

mmrt_status cpu_op_attention(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_attention_params p;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_ATTENTION, 3, 5, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2], *y = &o.dst;
    const struct cpu_view *cq = &o.src[3], *ck = &o.src[4];
    if ((st = attention_params(&o, &p)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], S = k->ne[0], Hkv = k->ne[1];
    int32_t whole_q[2] = { 0, (int32_t)T }, whole_k[2] = { 0, (int32_t)S };
    const int32_t *cu_q = whole_q, *cu_k = whole_k;
    if (cq->data) {
        if ((st = check_cu(&o, "src3 (cu_seqlens_q)", cq, p.n_seq, T)) ||
            (st = check_cu(&o, "src4 (cu_seqlens_k)", ck, p.n_seq, S)))
            return st;
        cu_q = (const int32_t *)cq->data;
        cu_k = (const int32_t *)ck->data;
    }
    struct attn_ctx c = {
        .q = (const float *)q->data, .y = (float *)y->data, .kv = { kv_of(k, 0, NULL), kv_of(v, 0, NULL) },
        .cu_q = cu_q, .cu_k = cu_k, .n_seq = cq->data ? p.n_seq : 1, .Hq = Hq, .D = D,
        .n_rep = Hq / Hkv, .scale = p.scale, .causal = p.causal == 1, .window = p.window,
    };
    return attention_run(dev, &o, &c, T);
}

/* kv_lens [n_seq] within 0 … max_pages · page_tokens, and every page a sequence reads (the
 * first ceil(Lk / page_tokens) of its table row) inside the pool's n_pages. */
static mmrt_status check_pages(struct cpu_op *o, int64_t n_seq, int64_t n_pages,
                               int64_t page_tokens)
{
    const struct cpu_view *lens = &o->src[4], *table = &o->src[5];
    int64_t max_pages = table->ne[1];
    const int32_t *lk = (const int32_t *)lens->data, *tab = (const int32_t *)table->data;
    for (int64_t s = 0; s < n_seq; s++) {
        /* Counted in pages, so max_pages · page_tokens cannot overflow. */
        int64_t used = ((int64_t)lk[s] + page_tokens - 1) / page_tokens;
        if (lk[s] < 0 || used > max_pages)
            return cpu_bad(o, MMRT_ERR_INVALID_ARG, "src4 (kv_lens) entry %" PRId64 " is %" PRId32
                           ": must lie within 0 … max_pages · page_tokens = %" PRId64 " · %"
                           PRId64, s, lk[s], max_pages, page_tokens);
        for (int64_t i = 0; i < used; i++) {
            int32_t page = tab[s * max_pages + i];
            if (page < 0 || page >= n_pages)
                return cpu_bad(o, MMRT_ERR_INVALID_ARG, "src5 (page_table) entry [%" PRId64 ", %"
                               PRId64 "] is %" PRId32 ", outside the %" PRId64 " pages of k_pages",
                               s, i, page, n_pages);
        }
    }
    return MMRT_OK;
}

mmrt_status cpu_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct cpu_op o;
    struct mmrt_attention_params p;
    mmrt_status st = cpu_op_begin(dev, args, MMRT_OP_ATTENTION_PAGED, 6, 8, &o);
    if (st != MMRT_OK)
        return st;
    const struct cpu_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2], *y = &o.dst;
    if ((st = attention_params(&o, &p)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2];
    int64_t n_pages = k->ne[0], page_tokens = k->ne[1], Hkv = k->ne[2];
    if ((st = check_cu(&o, "src3 (cu_seqlens_q)", &o.src[3], p.n_seq, T)) ||
        (st = check_pages(&o, p.n_seq, n_pages, page_tokens)))
        return st;
    struct attn_ctx c = {
        .q = (const float *)q->data, .y = (float *)y->data,
        .kv = { kv_of(k, k->nb[0], k->dtype == MMRT_DTYPE_I8 ? &o.src[6] : NULL),
                kv_of(v, v->nb[0], v->dtype == MMRT_DTYPE_I8 ? &o.src[7] : NULL) },
        .cu_q = (const int32_t *)o.src[3].data, .kv_lens = (const int32_t *)o.src[4].data,
        .table = (const int32_t *)o.src[5].data, .max_pages = o.src[5].ne[1],
        .page_tokens = page_tokens, .n_seq = p.n_seq, .Hq = Hq, .D = D, .n_rep = Hq / Hkv,
        .scale = p.scale, .causal = p.causal == 1, .window = p.window,
    };
    return attention_run(dev, &o, &c, T);
}
