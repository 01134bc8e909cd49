/*
 * attention.cl — scaled dot-product attention over packed variable-length sequences, in one
 * pass with an online softmax (Milakov & Gimelshein 2018; the FlashAttention loop): no score
 * matrix exists beyond one K/V tile. k_attention reads each sequence's keys from strided K/V
 * tensors, k_attention_paged from the pages its table row names; both run att_block.
 *
 * Grid: (query blocks × ATT_BQ items, Hq). A work-group owns ATT_BQ consecutive queries of ONE
 * sequence and one query head; work-item l owns query l of the block and keeps its q row, its
 * output accumulator, running max m and running sum l in private memory. The group walks the
 * keys its last query may see in tiles of `bk` keys: all items load the tile's K and V rows
 * (converted to f32) into local memory, then each item scores its query against the tile,
 * rescales its accumulator once by e^(m_old − m_new) and adds p·v. The output is acc / l.
 *
 * Sequences: cu_seqlens live in device memory (a decode step rewrites them without the host
 * reading them back), so the host cannot size the grid per sequence. It launches
 * ceil(T / ATT_BQ) + n_seq blocks — an upper bound on Σ ceil(Lq_s / ATT_BQ) — and block b finds
 * its sequence by walking the per-sequence block counts; blocks past the end return at once.
 * k_check_cu validates the cu_seqlens first (0 at the start, totals at the end, never
 * decreasing); when they are invalid it raises OCL_ERR_CU_SEQLENS and this kernel does nothing.
 *
 * Causal: query i of a sequence with Lq queries and Lk keys sees keys j < i + (Lk − Lq) + 1,
 * and with a sliding window (ABI 1.5) only the last `window` of those: one range
 * [first, limit) per item, both ends growing with i. A query that sees no key writes zeros.
 * The group walks the keys from its first query's first key to its last query's last; the
 * tiles stay at multiples of bk (the first one is cut at the front: keys before the group's
 * first are never loaded), so a long context with a window costs the window.
 *
 * Paged (ATTENTION_PAGED): key j of sequence s is row j % page_tokens of page
 * table[s][j / page_tokens]; only the tile loads look the page up. k_check_paged validates
 * cu_seqlens_q, kv_lens and every page id a sequence will read before the kernel runs, and
 * raises OCL_ERR_PAGED; k_attention_paged then does nothing, so no read leaves the pool.
 * An I8 pool (ABI 1.7) is widened as a tile is loaded, each code to code · its row's scale
 * (one rounded f32 product), so from the tile on the arithmetic is that of an F32 pool
 * holding those products, bit for bit.
 *
 * Batch invariance: an item's arithmetic depends only on its own query, its sequence's Lq and
 * Lk, the window and the tile size bk, which the host derives from the head dim and the
 * device alone. The tiles lie at multiples of bk of the sequence's keys whatever the page size,
 * and a tile the item sees no key of changes nothing, so the result does not depend on the
 * other queries of its group, the other sequences of the launch, the page ids or the page
 * size.
 *
 * Cost model: one query per item suits prefill and vision encoders (many queries share each
 * K/V tile). A decode step has one query per sequence, so one item of each group computes
 * while the others only help load tiles; on a CPU device that is still within 1.5× of the
 * CPU plugin (PoCL, 2 cores). Splitting the keys of a single query across items is the next
 * step if a GPU ever runs this plugin's decode.
 */
#pragma OPENCL FP_CONTRACT ON

/* ATT_BQ (queries = work-items per group) and ATT_BK (most keys per tile, the private score
 * row) come from the host. */
#define ATT_DMAX 256 /* plugin.h's head-dim limit */
#ifndef OCL_ERR_PAGED
#error "build option OCL_ERR_PAGED from ocl_program.c missing"
#endif

/* Element i of a K or V array of dtype dt (DT_F32, DT_F16, DT_F8E4M3 or DT_I8), widened:
 * exactly, or for an I8 code to code · sc, sc the scale of its row, which the caller reads
 * once per row (i8_widen: the rounded product, never fused with the score or p · v). */
float att_load(__global const uchar *p, int dt, long i, float sc)
{
    return dt == DT_F16      ? f16_to_f32(((__global const ushort *)p)[i])
           : dt == DT_F8E4M3 ? f8e4m3_to_f32(p[i])
           : dt == DT_I8     ? i8_widen(((__global const char *)p)[i], sc)
                             : ((__global const float *)p)[i];
}

/* Bytes of one K / V element of dtype dt. */
int att_size(int dt)
{
    return dt == DT_F16 ? 2 : dt == DT_F8E4M3 || dt == DT_I8 ? 1 : 4;
}

/* Validates cu_seqlens_q [n_seq + 1] (total T) and cu_seqlens_k (total S). One work-item. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void k_check_cu(__global const uchar *cqb, long cq_off, __global const uchar *ckb, long ck_off,
                int n_seq, long T, long S, __global int *err)
{
    for (int which = 0; which < 2; which++) {
        __global const int *cu = (__global const int *)(which ? ckb + ck_off : cqb + cq_off);
        long total = which ? S : T;
        int bad = -1;
        if (cu[0] != 0)
            bad = 0;
        for (int s = 0; s < n_seq && bad < 0; s++)
            if (cu[s + 1] < cu[s])
                bad = s + 1;
        if (bad < 0 && cu[n_seq] != total)
            bad = n_seq;
        if (bad >= 0) {
            if (atomic_cmpxchg(&err[0], 0, OCL_ERR_CU_SEQLENS) == 0) {
                err[1] = which;
                err[2] = bad;
                err[3] = cu[bad];
            }
            return;
        }
    }
}

/* The sequence block blk belongs to (n_seq: none, a spare block) and, in *qs, its first
 * query within that sequence: each sequence owns ceil(Lq / ATT_BQ) consecutive blocks. */
int att_locate(__global const int *cq, int n_seq, long blk, long *qs)
{
    long first = 0;
    int s = 0;
    for (; s < n_seq; s++) {
        long nb = (cq[s + 1] - cq[s] + ATT_BQ - 1) / ATT_BQ;
        if (blk < first + nb)
            break;
        first += nb;
    }
    *qs = (blk - first) * ATT_BQ;
    return s;
}

/* Key j's row, counted in rows of the K / V tensor from the sequence's first: j for a
 * strided tensor, or through the sequence's row of the page table (row j % page_tokens of its
 * page). Its elements start at row · nb0 from the sequence's base; an I8 pool's scale lies at
 * row · Hkv from the kv head's first. */
long att_row(long j, int paged, __global const int *pages, long page_tokens)
{
    return paged ? (long)pages[j / page_tokens] * page_tokens + j % page_tokens : j;
}

/* One work-group's block: queries [qs, qs + ATT_BQ) of a sequence with lq queries (the first
 * at token q0) and lk keys, query head h; kbase and vbase point at the sequence's rows of
 * its kv head, ksc and vsc at its scales when K / V are I8 (row r's at r · sc_nb0; never
 * read otherwise). */
void att_block(__global const float *qall, __global float *yall,
               __global const uchar *kbase, long k_nb0, int k_dt,
               __global const uchar *vbase, long v_nb0, int v_dt,
               __global const float *ksc, __global const float *vsc, long sc_nb0,
               int paged, __global const int *pages, long page_tokens,
               long q0, long lq, long lk, long qs, int h, int Hq, int D, float scale,
               int causal, int window, int bk, __local float *ks, __local float *vs)
{
    int lid = get_local_id(0);
    long i = qs + lid; /* this item's query, within the sequence */
    bool active = i < lq;
    long last = min(qs + ATT_BQ, lq) - 1;
    /* Keys visible to this item, [first, limit); the block reads [kmin, kmax), from its first
     * query's first key to its last (most-seeing) query's last. */
    long limit = causal ? clamp(i + (lk - lq) + 1, 0L, lk) : lk;
    long kmax = causal ? clamp(last + (lk - lq) + 1, 0L, lk) : lk;
    long kfirst = causal ? clamp(qs + (lk - lq) + 1, 0L, lk) : lk;
    long first = window > 0 && limit > window ? limit - window : 0;
    long kmin = window > 0 && kfirst > window ? kfirst - window : 0;

    /* q and the accumulator as float4 lanes over the head dim padded to DP = 4·D4 with zeros
     * (the tile rows are padded the same way, so the padding adds exact zeros): the inner
     * loops are then vector multiply-adds. */
    int D4 = (D + 3) / 4, DP = 4 * D4;
    float4 q[ATT_DMAX / 4], acc[ATT_DMAX / 4];
    float sc[ATT_BK];
    float m = -INFINITY, l = 0.0f;
    long t = q0 + (active ? i : 0);
    __global const float *qr = qall + (t * Hq + h) * D;
    for (int d4 = 0; d4 < D4; d4++) {
        int d = 4 * d4;
        float4 v = (float4)0.0f;
        if (active) {
            v.s0 = qr[d];
            v.s1 = d + 1 < D ? qr[d + 1] : 0.0f;
            v.s2 = d + 2 < D ? qr[d + 2] : 0.0f;
            v.s3 = d + 3 < D ? qr[d + 3] : 0.0f;
        }
        q[d4] = v;
        acc[d4] = (float4)0.0f;
    }

    for (long j0 = kmin / bk * bk; j0 < kmax; j0 += bk) {
        int nt = (int)min((long)bk, kmax - j0);
        int lead = (int)max(kmin - j0, 0L); /* keys of the first tile before kmin: not read */
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is no longer read */
        for (int jj = lead; jj < nt; jj++) {
            long row = att_row(j0 + jj, paged, pages, page_tokens);
            long kr = row * k_nb0, vr = row * v_nb0;
            float kf = k_dt == DT_I8 ? ksc[row * sc_nb0] : 1.0f;
            float vf = v_dt == DT_I8 ? vsc[row * sc_nb0] : 1.0f;
            for (int d = lid; d < DP; d += ATT_BQ) {
                ks[jj * DP + d] = d < D ? att_load(kbase, k_dt, kr + d, kf) : 0.0f;
                vs[jj * DP + d] = d < D ? att_load(vbase, v_dt, vr + d, vf) : 0.0f;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* Barriers stay outside this branch: every item runs every iteration. This item's
         * keys in the tile are [ja, nv) (ja ≥ lead: its first key is at or after kmin). */
        int ja = active ? (int)clamp(first - j0, 0L, (long)nt) : 0;
        int nv = active ? (int)clamp(limit - j0, 0L, (long)nt) : 0;
        float mt = -INFINITY;
        for (int jj = ja; jj < nv; jj++) {
            __local const float *kr = ks + jj * DP;
            float4 dot4 = (float4)0.0f;
            for (int d4 = 0; d4 < D4; d4++)
                dot4 += q[d4] * vload4(d4, kr);
            sc[jj] = ((dot4.s0 + dot4.s1) + (dot4.s2 + dot4.s3)) * scale;
            mt = fmax(mt, sc[jj]);
        }
        float mn = fmax(m, mt);
        if (nv > ja && mn != -INFINITY) { /* else nothing visible, or every score −inf */
            float corr = exp(m - mn);     /* 0 on the first visible tile (m = −inf) */
            l *= corr;
            for (int d4 = 0; d4 < D4; d4++)
                acc[d4] *= corr;
            for (int jj = ja; jj < nv; jj++) {
                float p = exp(sc[jj] - mn);
                __local const float *vr = vs + jj * DP;
                l += p;
                for (int d4 = 0; d4 < D4; d4++)
                    acc[d4] += p * vload4(d4, vr);
            }
            m = mn;
        }
    }
    if (!active)
        return;
    __global float *out = yall + (t * Hq + h) * D;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d4 = 0; d4 < D4; d4++) {
        float4 r = acc[d4] * inv;
        int d = 4 * d4;
        if (d + 4 <= D) {
            vstore4(r, d4, out);
        } else {
            out[d] = r.s0;
            if (d + 1 < D)
                out[d + 1] = r.s1;
            if (d + 2 < D)
                out[d + 2] = r.s2;
        }
    }
}

__kernel __attribute__((reqd_work_group_size(ATT_BQ, 1, 1)))
void k_attention(__global const uchar *qb, long q_off,
                 __global const uchar *kb, long k_off, long k_nb0, long k_nb1, int k_dt,
                 __global const uchar *vb, long v_off, long v_nb0, long v_nb1, int v_dt,
                 __global const uchar *cqb, long cq_off, __global const uchar *ckb, long ck_off,
                 int has_cu, int n_seq, __global uchar *yb, long y_off,
                 __global const int *err, long T, long S, int Hq, int n_rep, int D, float scale,
                 int causal, int window, int bk)
{
    __local float ks[OCL_KV_FLOATS / 2], vs[OCL_KV_FLOATS / 2];
    long blk = get_group_id(0);
    int h = get_group_id(1);
    if (has_cu && err[0] != 0)
        return; /* invalid cu_seqlens (or an earlier unreported error): do nothing */

    /* This block's sequence: queries [q0, q0 + lq), keys [k0, k0 + lk), block start qs. */
    long q0 = 0, lq = T, k0 = 0, lk = S, qs = blk * ATT_BQ;
    if (has_cu) {
        __global const int *cq = (__global const int *)(cqb + cq_off);
        __global const int *ck = (__global const int *)(ckb + ck_off);
        int s = att_locate(cq, n_seq, blk, &qs);
        if (s == n_seq)
            return;
        q0 = cq[s];
        lq = cq[s + 1] - q0;
        k0 = ck[s];
        lk = ck[s + 1] - k0;
    }
    if (qs >= lq)
        return;
    int kvh = h / n_rep;
    __global const uchar *kbase = kb + k_off + (k0 * k_nb0 + kvh * k_nb1) * att_size(k_dt);
    __global const uchar *vbase = vb + v_off + (k0 * v_nb0 + kvh * v_nb1) * att_size(v_dt);
    /* ATTENTION takes no I8 K / V, so the scale pointers are placeholders never read. */
    __global const float *no_sc = (__global const float *)err;
    att_block((__global const float *)(qb + q_off), (__global float *)(yb + y_off), kbase, k_nb0,
              k_dt, vbase, v_nb0, v_dt, no_sc, no_sc, 0, 0, err, 1, q0, lq, lk, qs, h, Hq, D,
              scale, causal, window, bk, ks, vs);
}

/* Validates a paged launch's index tensors (one work-item): cu_seqlens_q [n_seq + 1] from 0
 * to T without decreasing, kv_lens [n_seq] within 0 … max_pages · page_tokens, and the
 * first ceil(kv_len / page_tokens) entries of each table row within [0, n_pages). The first
 * violation raises OCL_ERR_PAGED: [1] 0 = cu_seqlens_q, 1 = kv_lens, 2 = page_table, [2]
 * entry (sequence), [3] value, [4] table column, [5] max_pages, [6] page_tokens, [7] n_pages
 * (the sizes clamped to INT_MAX). */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void k_check_paged(__global const uchar *cqb, long cq_off, __global const uchar *lb, long l_off,
                   __global const uchar *tb, long t_off, int n_seq, long T, long max_pages,
                   long page_tokens, long n_pages, __global int *err)
{
    __global const int *cu = (__global const int *)(cqb + cq_off);
    __global const int *lens = (__global const int *)(lb + l_off);
    __global const int *table = (__global const int *)(tb + t_off);
    int which = -1, entry = 0, value = 0, col = 0;
    if (cu[0] != 0)
        which = 0;
    for (int s = 0; s < n_seq && which < 0; s++)
        if (cu[s + 1] < cu[s]) {
            which = 0;
            entry = s + 1;
        }
    if (which < 0 && cu[n_seq] != T) {
        which = 0;
        entry = n_seq;
    }
    if (which == 0)
        value = cu[entry];
    for (int s = 0; s < n_seq && which < 0; s++) {
        long used = ((long)lens[s] + page_tokens - 1) / page_tokens;
        if (lens[s] < 0 || used > max_pages) {
            which = 1;
            entry = s;
            value = lens[s];
        }
        for (long c = 0; c < used && which < 0; c++) {
            int page = table[s * max_pages + c];
            if (page < 0 || page >= n_pages) {
                which = 2;
                entry = s;
                col = (int)c;
                value = page;
            }
        }
    }
    if (which >= 0 && atomic_cmpxchg(&err[0], 0, OCL_ERR_PAGED) == 0) {
        err[1] = which;
        err[2] = entry;
        err[3] = value;
        err[4] = col;
        err[5] = (int)min(max_pages, (long)INT_MAX);
        err[6] = (int)min(page_tokens, (long)INT_MAX);
        err[7] = (int)min(n_pages, (long)INT_MAX);
    }
}

/* Grid as k_attention's with cu_seqlens; K and V are [n_pages, page_tokens, Hkv, D]
 * contiguous of one dtype, and when that is I8 their scales (ksb, vsb) [n_pages, page_tokens,
 * Hkv] contiguous F32 (placeholders otherwise). */
__kernel __attribute__((reqd_work_group_size(ATT_BQ, 1, 1)))
void k_attention_paged(__global const uchar *qb, long q_off, __global const uchar *kb, long k_off,
                       __global const uchar *vb, long v_off, int kv_dt,
                       __global const uchar *ksb, long ks_off, __global const uchar *vsb,
                       long vs_off,
                       __global const uchar *cqb, long cq_off, __global const uchar *lb,
                       long l_off, __global const uchar *tb, long t_off, int n_seq,
                       long max_pages, long page_tokens, __global uchar *yb, long y_off,
                       __global const int *err, int Hq, int Hkv, int D, float scale, int causal,
                       int window, int bk)
{
    __local float ks[OCL_KV_FLOATS / 2], vs[OCL_KV_FLOATS / 2];
    long blk = get_group_id(0);
    int h = get_group_id(1);
    if (err[0] != 0)
        return; /* invalid indices (or an earlier unreported error): do nothing */
    __global const int *cq = (__global const int *)(cqb + cq_off);
    __global const int *lens = (__global const int *)(lb + l_off);
    long qs;
    int s = att_locate(cq, n_seq, blk, &qs);
    if (s == n_seq)
        return;
    long q0 = cq[s], lq = cq[s + 1] - q0;
    int kvh = h / (Hq / Hkv), es = att_size(kv_dt);
    long row = (long)Hkv * D;
    __global const int *pages = (__global const int *)(tb + t_off) + s * max_pages;
    att_block((__global const float *)(qb + q_off), (__global float *)(yb + y_off),
              kb + k_off + kvh * D * es, row, kv_dt, vb + v_off + kvh * D * es, row, kv_dt,
              (__global const float *)(ksb + ks_off) + kvh,
              (__global const float *)(vsb + vs_off) + kvh, Hkv, 1, pages, page_tokens, q0, lq,
              lens[s], qs, h, Hq, D, scale, causal, window, bk, ks, vs);
}
