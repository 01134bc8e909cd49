/*
 * rows.cl — LAYERNORM, RMSNORM, SOFTMAX, ARGMAX and L2_NORM: one work-group of WG_ROW items
 * per row of a contiguous [rows, n] tensor. Item l handles elements l, l + WG_ROW, … in every
 * pass, so an element is only ever read and written by the same item and in-place runs need
 * no global fences; the row statistics come from tree reductions in local memory (wg_sum,
 * wg_max). Also GATHER_HEADS, one work-item per output element (no reduction across items).
 *
 * Statistics accumulate in acc_t (double where the device has fp64, see common.cl) and each
 * output is then formed in f32 the way the CPU reference writes it: LayerNorm
 * (f32)((x − mean)·rstd) · w + b, RMSNorm (x · rstd) · w, softmax e · (1/Σ).
 */
#pragma OPENCL FP_CONTRACT OFF

__kernel __attribute__((reqd_work_group_size(WG_ROW, 1, 1)))
void k_layernorm(__global const uchar *xb, long x_off, __global uchar *yb, long y_off,
                 __global const uchar *wb, long w_off, int w_dt, int has_w,
                 __global const uchar *bb, long b_off, int b_dt, int has_b, long n, float eps)
{
    __local acc_t red[WG_ROW];
    long row = get_group_id(0);
    int lid = get_local_id(0);
    __global const float *x = (__global const float *)(xb + x_off) + row * n;
    __global float *y = (__global float *)(yb + y_off) + row * n;
    __global const uchar *w = wb + w_off, *b = bb + b_off;

    acc_t s = 0;
    for (long i = lid; i < n; i += WG_ROW)
        s += x[i];
    acc_t mean = wg_sum(red, s) / (acc_t)n;
    acc_t ss = 0;
    for (long i = lid; i < n; i += WG_ROW) {
        acc_t d = x[i] - mean; /* two passes: no cancellation for data far from 0 */
        ss += d * d;
    }
    acc_t rstd = (acc_t)1 / sqrt(wg_sum(red, ss) / (acc_t)n + (acc_t)eps);
    for (long i = lid; i < n; i += WG_ROW) {
        float v = (float)((x[i] - mean) * rstd);
        if (has_w)
            v *= load_w(w, w_dt, i);
        if (has_b)
            v += load_w(b, b_dt, i);
        y[i] = v;
    }
}

__kernel __attribute__((reqd_work_group_size(WG_ROW, 1, 1)))
void k_rmsnorm(__global const uchar *xb, long x_off, __global uchar *yb, long y_off,
               __global const uchar *wb, long w_off, int w_dt, int has_w, long n, float eps)
{
    __local acc_t red[WG_ROW];
    long row = get_group_id(0);
    int lid = get_local_id(0);
    __global const float *x = (__global const float *)(xb + x_off) + row * n;
    __global float *y = (__global float *)(yb + y_off) + row * n;
    __global const uchar *w = wb + w_off;

    acc_t ss = 0;
    for (long i = lid; i < n; i += WG_ROW)
        ss += (acc_t)x[i] * x[i];
    float rstd = (float)((acc_t)1 / sqrt(wg_sum(red, ss) / (acc_t)n + (acc_t)eps));
    for (long i = lid; i < n; i += WG_ROW) {
        float v = x[i] * rstd;
        y[i] = has_w ? v * load_w(w, w_dt, i) : v;
    }
}

/* softmax(x · scale) per row, max subtracted. −inf entries give exactly 0; a row that is −inf
 * throughout has no distribution and gives zeros (as a fully masked attention row does). */
__kernel __attribute__((reqd_work_group_size(WG_ROW, 1, 1)))
void k_softmax(__global const uchar *xb, long x_off, __global uchar *yb, long y_off, long n,
               float scale)
{
    __local acc_t red[WG_ROW];
    __local float redm[WG_ROW];
    long row = get_group_id(0);
    int lid = get_local_id(0);
    __global const float *x = (__global const float *)(xb + x_off) + row * n;
    __global float *y = (__global float *)(yb + y_off) + row * n;

    float m = -INFINITY;
    for (long i = lid; i < n; i += WG_ROW)
        m = fmax(m, x[i] * scale);
    m = wg_max(redm, m);
    /* Every item saw the same reduced max. A row that is −inf throughout gives zeros; it still
     * walks the same barriers as the others (no early return between barriers). */
    bool masked = m == -INFINITY;
    acc_t s = 0;
    for (long i = lid; i < n; i += WG_ROW) {
        float e = masked ? 0.0f : exp(x[i] * scale - m); /* −inf − m gives exactly 0 */
        y[i] = e;
        s += e;
    }
    acc_t sum = wg_sum(red, s);
    float inv = masked ? 0.0f : (float)((acc_t)1 / sum);
    for (long i = lid; i < n; i += WG_ROW)
        y[i] *= inv;
}

/* Index of the first maximum of each row; NaN is skipped, an all-NaN row answers 0. Each item
 * keeps the first maximum of its elements, the tree then prefers the larger value and, on a
 * tie, the smaller index. */
__kernel __attribute__((reqd_work_group_size(WG_ROW, 1, 1)))
void k_argmax(__global const uchar *xb, long x_off, __global uchar *yb, long y_off, long n)
{
    __local float sv[WG_ROW];
    __local int si[WG_ROW];
    long row = get_group_id(0);
    int lid = get_local_id(0);
    __global const float *x = (__global const float *)(xb + x_off) + row * n;

    float bv = 0.0f;
    int bi = -1;
    for (long i = lid; i < n; i += WG_ROW) {
        float v = x[i];
        if (!isnan(v) && (bi < 0 || v > bv)) {
            bv = v;
            bi = (int)i;
        }
    }
    sv[lid] = bv;
    si[lid] = bi;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG_ROW / 2; stride > 0; stride >>= 1) {
        if (lid < stride) {
            float ov = sv[lid + stride];
            int oi = si[lid + stride];
            int mi = si[lid];
            if (oi >= 0 && (mi < 0 || ov > sv[lid] || (ov == sv[lid] && oi < mi))) {
                sv[lid] = ov;
                si[lid] = oi;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        ((__global int *)(yb + y_off))[row] = si[0] < 0 ? 0 : si[0];
}

/* L2_NORM: y[row] = sqrt(Σ x²), the squares summed in acc_t (double where the device has
 * fp64: each square of an f32 is then exact). A row of n = 0 gives 0. */
__kernel __attribute__((reqd_work_group_size(WG_ROW, 1, 1)))
void k_l2_norm(__global const uchar *xb, long x_off, __global uchar *yb, long y_off, long n)
{
    __local acc_t red[WG_ROW];
    long row = get_group_id(0);
    int lid = get_local_id(0);
    __global const float *x = (__global const float *)(xb + x_off) + row * n;

    acc_t ss = 0;
    for (long i = lid; i < n; i += WG_ROW)
        ss += (acc_t)x[i] * x[i];
    acc_t s = wg_sum(red, ss);
    if (lid == 0)
        ((__global float *)(yb + y_off))[row] = (float)sqrt(s);
}

/* GATHER_HEADS: item (d, n·H + h) forms dst[n, h, d] in exactly the f32 operations plugin.h
 * fixes: the first kept row's element, then + each later kept one in g order (FP_CONTRACT is
 * off), then one correctly rounded division by the count when it is ≥ 2 (div_rn). An I8
 * table's element is first widened with its row's scale, sc[r·H + h] (i8_widen). Entries
 * < 0 (padding) or ≥ R are skipped; none kept gives +0. */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_gather_heads(__global const uchar *tb, long t_off, int t_dt, __global const uchar *cb,
                    long c_off, __global const uchar *ib, long i_off, __global uchar *yb,
                    long y_off, long R, long H, long D, long G)
{
    long d = get_global_id(0), it = get_global_id(1);
    if (d >= D)
        return;
    long h = it % H;
    __global const int *ix = (__global const int *)(ib + i_off) + it * G;
    __global const uchar *t = tb + t_off;
    __global const float *sc = (__global const float *)(cb + c_off);
    float s = 0.0f;
    int c = 0;
    for (long g = 0; g < G; g++) {
        long r = ix[g];
        if (r < 0 || r >= R)
            continue;
        long e = (r * H + h) * D + d;
        float v = t_dt == DT_I8 ? i8_widen(((__global const char *)t)[e], sc[r * H + h])
                                : load_w(t, t_dt, e);
        s = c == 0 ? v : s + v;
        c++;
    }
    float out = s;
    if (c == 0)
        out = 0.0f;
    else if (c > 1)
        out = div_rn(s, (float)c);
    ((__global float *)(yb + y_off))[it * D + d] = out;
}
