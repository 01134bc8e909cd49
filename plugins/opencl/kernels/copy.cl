/*
 * copy.cl — COPY and CONCAT (strided element copy with dtype conversion) and GET_ROWS.
 *
 * k_copy: the tensors are seen as 4-D (leading extents of 1) with byte strides; work-item i is
 * element i of the index space in row-major order, so a launch is 1-D whatever the shape
 * (some drivers cap the second and third grid dims at 65535). Conversions are the exact bit
 * routines of common.cl: F32 → F16/BF16 round to nearest even, F16 ↔ BF16 go through f32
 * (exact on the way in), same dtype copies bits (NaN payloads included).
 *
 * GET_ROWS is two launches. k_get_rows_check (one work-group) finds the first id outside
 * [0, V) and raises OCL_ERR_GET_ROWS in the device error buffer with the row and the id;
 * k_get_rows then copies nothing when the buffer holds an error, so a bad launch leaves dst
 * untouched. The host reports the error at the next synchronize() or download().
 */
#pragma OPENCL FP_CONTRACT OFF

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_copy(__global const uchar *sb, long s_off, long s0, long s1, long s2, long s3,
            __global uchar *db, long d_off, long d0, long d1, long d2, long d3,
            long n1, long n2, long n3, long n, int sdt, int ddt)
{
    long i = get_global_id(0);
    if (i >= n)
        return;
    long i3 = i % n3, r = i / n3, i2 = r % n2;
    r /= n2;
    long i1 = r % n1, i0 = r / n1;
    __global const uchar *s = sb + s_off + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3;
    __global uchar *d = db + d_off + i0 * d0 + i1 * d1 + i2 * d2 + i3 * d3;
    if (sdt == ddt) {
        if (sdt == DT_F32 || sdt == DT_I32)
            *(__global uint *)d = *(__global const uint *)s;
        else
            *(__global ushort *)d = *(__global const ushort *)s;
        return;
    }
    float f;
    if (sdt == DT_F16)
        f = f16_to_f32(*(__global const ushort *)s);
    else if (sdt == DT_BF16)
        f = bf16_to_f32(*(__global const ushort *)s);
    else
        f = *(__global const float *)s;
    if (ddt == DT_F16)
        *(__global ushort *)d = f32_to_f16(f);
    else if (ddt == DT_BF16)
        *(__global ushort *)d = f32_to_bf16(f);
    else
        *(__global float *)d = f;
}

/* One work-group: item l checks ids l, l + WG_1D, …; the group keeps the smallest bad row. */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_get_rows_check(__global const uchar *ib, long i_off, int T, long V, __global int *err)
{
    __local int first[WG_1D];
    __global const int *ids = (__global const int *)(ib + i_off);
    int lid = get_local_id(0), bad = T;
    for (int t = lid; t < T; t += WG_1D)
        if (ids[t] < 0 || ids[t] >= V) {
            bad = t;
            break;
        }
    first[lid] = bad;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG_1D / 2; stride > 0; stride >>= 1) {
        if (lid < stride)
            first[lid] = min(first[lid], first[lid + stride]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    /* An earlier unreported error keeps its place: the first failure is the one to report. */
    if (lid == 0 && first[0] < T && atomic_cmpxchg(&err[0], 0, OCL_ERR_GET_ROWS) == 0) {
        err[1] = first[0];
        err[2] = ids[first[0]];
        err[3] = (int)min(V, (long)INT_MAX);
    }
}

/* dst[t, k] = table[ids[t], k] as f32. Item (k, t). */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_get_rows(__global const uchar *tb, long t_off, int t_dt, __global const uchar *ib,
                long i_off, __global uchar *yb, long y_off, long N, __global const int *err)
{
    long k = get_global_id(0), t = get_global_id(1);
    if (k >= N || err[0] != 0)
        return;
    long id = ((__global const int *)(ib + i_off))[t];
    ((__global float *)(yb + y_off))[t * N + k] = load_w(tb + t_off, t_dt, id * N + k);
}

/* SET_ROWS: dst[idx[t], k] = (dst dtype) src[t, k] for k < n. Work-group (g, t) writes
 * elements [g·WG_1D, (g+1)·WG_1D) of row t. An index outside [0, R) writes nothing, and a row
 * whose index appears again later in idx is skipped — the group scans idx[t+1 …] first — so
 * with duplicates the last row wins whole, as a sequential loop leaves it (never a mix of
 * elements from two rows). The scan is empty for the one-token decode step. Conversion as
 * k_copy: raw bits for F32, round to nearest even for F16 / BF16; F8E4M3 also saturates. */
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void k_set_rows(__global const uchar *sb, long s_off, __global const uchar *ib, long i_off,
                __global uchar *db, long d_off, int ddt, long n, int T, long R)
{
    __local int later;
    int lid = get_local_id(0), t = get_global_id(1);
    long k = get_global_id(0);
    __global const int *idx = (__global const int *)(ib + i_off);
    long r = idx[t];
    if (lid == 0)
        later = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = t + 1 + lid; u < T; u += WG_1D)
        if (idx[u] == r) {
            atomic_or(&later, 1);
            break;
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (later || r < 0 || r >= R || k >= n)
        return;
    __global const uint *s = (__global const uint *)(sb + s_off) + t * n + k;
    long o = r * n + k;
    if (ddt == DT_F8E4M3)
        (db + d_off)[o] = f32_to_f8e4m3(as_float(*s));
    else if (ddt == DT_F16)
        ((__global ushort *)(db + d_off))[o] = f32_to_f16(as_float(*s));
    else if (ddt == DT_BF16)
        ((__global ushort *)(db + d_off))[o] = f32_to_bf16(as_float(*s));
    else
        ((__global uint *)(db + d_off))[o] = *s;
}

/* SET_ROWS into an I8 store (plugin.h "I8 with row scales"): work-group (h, t) quantizes
 * innermost row h (of nh, D values each) of values row t into row h of dst row idx[t], codes
 * into db and the scale into sc[idx[t]·nh + h]. The group spans the whole row, however long:
 * amax is the fmax over it (exact in any order; fmax passes over NaN), s = amax / 127 and
 * each code rint(x / s) clamped to ±127, 0 for a NaN quotient, both divisions correctly
 * rounded (div_rn; the host refuses a device that cannot, or that flushes subnormal scales).
 * Indices outside [0, R) and rows overwritten later in idx are skipped as in k_set_rows, so
 * the last row wins with its scale. */
__kernel __attribute__((reqd_work_group_size(WG_ROW, 1, 1)))
void k_set_rows_i8(__global const uchar *sb, long s_off, __global const uchar *ib, long i_off,
                   __global uchar *db, long d_off, __global uchar *cb, long c_off, long D,
                   long nh, int T, long R)
{
    __local int later;
    __local float red[WG_ROW];
    int lid = get_local_id(0), t = get_global_id(1);
    long h = get_group_id(0);
    __global const int *idx = (__global const int *)(ib + i_off);
    long r = idx[t];
    if (lid == 0)
        later = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = t + 1 + lid; u < T; u += WG_ROW)
        if (idx[u] == r) {
            atomic_or(&later, 1);
            break;
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (later || r < 0 || r >= R)
        return; /* the whole group: wg_max's barriers are met by all items or none */
    __global const float *x = (__global const float *)(sb + s_off) + ((long)t * nh + h) * D;
    __global char *q = (__global char *)(db + d_off) + (r * nh + h) * D;
    float amax = 0.0f;
    for (long i = lid; i < D; i += WG_ROW)
        amax = fmax(amax, fabs(x[i]));
    amax = wg_max(red, amax);
    float s = div_rn(amax, 127.0f);
    for (long i = lid; i < D; i += WG_ROW) {
        float c = rint(div_rn(x[i], s));
        q[i] = isnan(c) ? 0 : (char)clamp(c, -127.0f, 127.0f);
    }
    if (lid == 0)
        ((__global float *)(cb + c_off))[r * nh + h] = s;
}
