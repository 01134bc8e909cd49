/*
 * attention.cl — scaled dot-product attention over packed variable-length sequences, in one
 * pass with an online softmax (Milakov & Gimelshein 2018; the FlashAttention loop): no score
 * matrix exists beyond one K/V tile.
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
 * a prefix, so a tile is visible to an item up to some count. A query that sees no key
 * writes zeros.
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

float att_load(__global const uchar *p, int f16, long i)
{
    return f16 ? f16_to_f32(((__global const ushort *)p)[i]) : ((__global const float *)p)[i];
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

__kernel __attribute__((reqd_work_group_size(ATT_BQ, 1, 1)))
void k_attention(__global const uchar *qb, long q_off,
                 __global const uchar *kb, long k_off, long k_nb0, long k_nb1, int k_f16,
                 __global const uchar *vb, long v_off, long v_nb0, long v_nb1, int v_f16,
                 __global const uchar *cqb, long cq_off, __global const uchar *ckb, long ck_off,
                 int has_cu, int n_seq, __global uchar *yb, long y_off,
                 __global const int *err, long T, long S, int Hq, int n_rep, int D, float scale,
                 int causal, int bk)
{
    __local float ks[OCL_KV_FLOATS / 2], vs[OCL_KV_FLOATS / 2];
    int lid = get_local_id(0);
    long blk = get_group_id(0);
    int h = get_group_id(1);
    if (has_cu && err[0] != 0)
        return; /* invalid cu_seqlens (or an earlier unreported error): do nothing */

    /* This block's sequence: queries [q0, q0 + lq), keys [k0, k0 + lk), block start qs. */
    long q0 = 0, lq = T, k0 = 0, lk = S, qs = blk * ATT_BQ;
    if (has_cu) {
        __global const int *cq = (__global const int *)(cqb + cq_off);
        __global const int *ck = (__global const int *)(ckb + ck_off);
        long first = 0;
        int s = 0;
        for (; s < n_seq; s++) {
            long nb = (cq[s + 1] - cq[s] + ATT_BQ - 1) / ATT_BQ;
            if (blk < first + nb)
                break;
            first += nb;
        }
        if (s == n_seq)
            return;
        q0 = cq[s];
        lq = cq[s + 1] - q0;
        k0 = ck[s];
        lk = ck[s + 1] - k0;
        qs = (blk - first) * ATT_BQ;
    }
    if (qs >= lq)
        return;

    long i = qs + lid; /* this item's query, within the sequence */
    bool active = i < lq;
    long last = min(qs + ATT_BQ, lq) - 1;
    /* Keys visible to this item, and to the block's last (most-seeing) query. */
    long limit = causal ? clamp(i + (lk - lq) + 1, 0L, lk) : lk;
    long kmax = causal ? clamp(last + (lk - lq) + 1, 0L, lk) : lk;
    int kvh = h / n_rep;
    __global const uchar *kbase = kb + k_off + (k0 * k_nb0 + kvh * k_nb1) * (k_f16 ? 2 : 4);
    __global const uchar *vbase = vb + v_off + (k0 * v_nb0 + kvh * v_nb1) * (v_f16 ? 2 : 4);

    /* q and the accumulator as float4 lanes over the head dim padded to DP = 4·D4 with zeros
     * (the tile rows are padded the same way, so the padding adds exact zeros): the inner
     * loops are then vector multiply-adds. */
    int D4 = (D + 3) / 4, DP = 4 * D4;
    float4 q[ATT_DMAX / 4], acc[ATT_DMAX / 4];
    float sc[ATT_BK];
    float m = -INFINITY, l = 0.0f;
    long t = q0 + (active ? i : 0);
    __global const float *qr = (__global const float *)(qb + q_off) + (t * Hq + h) * D;
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

    for (long j0 = 0; j0 < kmax; j0 += bk) {
        int nt = (int)min((long)bk, kmax - j0);
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is no longer read */
        for (int jj = 0; jj < nt; jj++) {
            long kr = (j0 + jj) * k_nb0, vr = (j0 + jj) * v_nb0;
            for (int d = lid; d < DP; d += ATT_BQ) {
                ks[jj * DP + d] = d < D ? att_load(kbase, k_f16, kr + d) : 0.0f;
                vs[jj * DP + d] = d < D ? att_load(vbase, v_f16, vr + d) : 0.0f;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* Barriers stay outside this branch: every item runs every iteration. */
        int nv = active ? (int)clamp(limit - j0, 0L, (long)nt) : 0;
        float mt = -INFINITY;
        for (int jj = 0; jj < nv; jj++) {
            __local const float *kr = ks + jj * DP;
            float4 dot4 = (float4)0.0f;
            for (int d4 = 0; d4 < D4; d4++)
                dot4 += q[d4] * vload4(d4, kr);
            sc[jj] = ((dot4.s0 + dot4.s1) + (dot4.s2 + dot4.s3)) * scale;
            mt = fmax(mt, sc[jj]);
        }
        float mn = fmax(m, mt);
        if (nv > 0 && mn != -INFINITY) { /* else nothing visible, or every score −inf */
            float corr = exp(m - mn);    /* 0 on the first visible tile (m = −inf) */
            l *= corr;
            for (int d4 = 0; d4 < D4; d4++)
                acc[d4] *= corr;
            for (int jj = 0; jj < nv; jj++) {
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
    __global float *out = (__global float *)(yb + y_off) + (t * Hq + h) * D;
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
