/*
 * rope.cl — rotary position embedding on x [T, H, D] (token and head strides in elements,
 * innermost dim contiguous), positions I32 [T] read from device memory.
 *
 * Work-item (i, t) owns pair i of token t for every head: it forms the angle once and applies
 * it to all H heads. Items i < D − n_rot also copy the non-rotated tail of each head (skipped
 * when dst is x itself).
 *
 * Numerics follow Hugging Face's f32 arithmetic, as the CPU plugin does: inv_freq[i] =
 * 1/theta^((2i)/n_rot) is computed on the host with the very expression and libm call the
 * CPU plugin uses and arrives here as a table, because OpenCL's pow may be 16 ulp off and one
 * ulp of inv_freq is pos·2⁻²⁴ rad of angle — visible at position 10⁴. The angle pos·inv_freq
 * is one f32 multiply (exact IEEE in OpenCL). cos and sin are taken in double where the
 * device has fp64 and rounded to f32, which is what glibc's cosf/sinf return; elsewhere the
 * f32 builtins (≤ 4 ulp). Contraction is off so x·cos − x'·sin rounds like the CPU.
 */
#pragma OPENCL FP_CONTRACT OFF

__kernel __attribute__((reqd_work_group_size(WG_ROPE, 1, 1)))
void k_rope(__global const uchar *xb, long x_off, long x_nb0, long x_nb1,
            __global uchar *yb, long y_off, long y_nb0, long y_nb1,
            __global const uchar *pb, long p_off, __global const float *inv_freq,
            long H, int D, int n_rot, int interleaved, int in_place)
{
    int i = get_global_id(0);
    long t = get_global_id(1);
    int n_pairs = n_rot / 2;
    __global const float *x = (__global const float *)(xb + x_off) + t * x_nb0;
    __global float *y = (__global float *)(yb + y_off) + t * y_nb0;
    if (i < n_pairs) {
        float pos = (float)((__global const int *)(pb + p_off))[t];
        float angle = pos * inv_freq[i];
#if OCL_FP64
        float c = (float)cos((double)angle), s = (float)sin((double)angle);
#else
        float c = cos(angle), s = sin(angle);
#endif
        int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + n_pairs;
        for (long h = 0; h < H; h++) {
            float a = x[h * x_nb1 + i0], b = x[h * x_nb1 + i1];
            y[h * y_nb1 + i0] = a * c - b * s;
            y[h * y_nb1 + i1] = b * c + a * s;
        }
    }
    if (!in_place && i < D - n_rot)
        for (long h = 0; h < H; h++)
            y[h * y_nb1 + n_rot + i] = x[h * x_nb1 + n_rot + i];
}

/* ROPE_MULTI: the NEOX rotation of k_rope, with pair i turned by the position of its axis.
 * Pairs [sec_end[a−1], sec_end[a]) belong to axis a (sec_end cumulative, sec_end[−1] = 0,
 * empty sections allowed); the frequency index is i, or i − sec_end[a−1] when restart. The
 * inv_freq table (host-computed as for ROPE, over freq_dim) has n_rot / 2 entries, which
 * covers both. positions are I32 [T, n_axes]. Same work split and numerics as k_rope. */
__kernel __attribute__((reqd_work_group_size(WG_ROPE, 1, 1)))
void k_rope_multi(__global const uchar *xb, long x_off, long x_nb0, long x_nb1,
                  __global uchar *yb, long y_off, long y_nb0, long y_nb1,
                  __global const uchar *pb, long p_off, __global const float *inv_freq,
                  long H, int D, int n_rot, int n_axes, int restart, int e0, int e1, int e2,
                  int in_place)
{
    int i = get_global_id(0);
    long t = get_global_id(1);
    int n_pairs = n_rot / 2;
    __global const float *x = (__global const float *)(xb + x_off) + t * x_nb0;
    __global float *y = (__global float *)(yb + y_off) + t * y_nb0;
    if (i < n_pairs) {
        /* The last section ends at n_pairs, so only the first n_axes − 1 ends are needed. */
        int a = 0, start = 0;
        if (a + 1 < n_axes && i >= e0) { a = 1; start = e0; }
        if (a == 1 && a + 1 < n_axes && i >= e1) { a = 2; start = e1; }
        if (a == 2 && a + 1 < n_axes && i >= e2) { a = 3; start = e2; }
        float pos = (float)((__global const int *)(pb + p_off))[t * n_axes + a];
        float angle = pos * inv_freq[restart ? i - start : i];
#if OCL_FP64
        float c = (float)cos((double)angle), s = (float)sin((double)angle);
#else
        float c = cos(angle), s = sin(angle);
#endif
        int i1 = i + n_pairs;
        for (long h = 0; h < H; h++) {
            float u = x[h * x_nb1 + i], v = x[h * x_nb1 + i1];
            y[h * y_nb1 + i] = u * c - v * s;
            y[h * y_nb1 + i1] = v * c + u * s;
        }
    }
    if (!in_place && i < D - n_rot)
        for (long h = 0; h < H; h++)
            y[h * y_nb1 + n_rot + i] = x[h * x_nb1 + n_rot + i];
}
