/*
 * plugins/opencl/ocl_ops_matmul.c — host side of MATMUL and PATCH_EMBED (kernels/matmul.cl).
 *
 * MATMUL picks the kernel by M: up to OCL_MM_SMALL_M rows (decode, a few tokens) the small-M
 * kernel streams W once with coalesced reads; beyond that the 64 × 64 local-memory tile. Both
 * exist once per W dtype. Up to OCL_MM_INVARIANT_M rows (a batched decode step) the small-M
 * kernel runs over groups of OCL_MM_SMALL_M rows, so every row gets the arithmetic it gets
 * alone (plugin.h batch invariance: a row may depend on M only across M = 32). An I8 W comes
 * with its scales (src3), which its kernels apply to each finished sum before the bias; a U4
 * W with its group scales and zero points (src3, src4), which its kernels apply per 32-code
 * block (small M) or while staging W tiles (tiled), so W stays packed in device memory; the
 * float kernels take the same arguments and ignore them. PATCH_EMBED gathers the
 * non-overlapping patches into rows (k_im2col; for stride = kernel that is a permutation of
 * the image, so the scratch is exactly the image's size) and runs the same GEMM against the
 * weight seen as [O, C·P·P].
 */
#include <inttypes.h>

#include "ocl_internal.h"

/* A MATMUL weight as the kernels take it: W, and for I8 its scales, for U4 its scales and
 * zero points [N, G] (absent views, mem NULL, where the dtype has none; G 1 then). */
struct mm_weight {
    const struct ocl_view *w, *s, *z;
    int64_t G;
};

/* y[M, N] = x[M, K] · w[N, K]ᵀ (+ b[N]) with x, y contiguous F32 given as (buffer, byte
 * offset), q->w and b contiguous (b->mem NULL when absent). */
static mmrt_status gemm_launch(struct mmrt_device *dev, const char *op, cl_mem x,
                               uint64_t x_off, int64_t M, int64_t K, const struct mm_weight *q,
                               int64_t N, const struct ocl_view *b, const struct ocl_view *y)
{
    bool small = M <= OCL_MM_SMALL_M;
    const int dt = q->w->dtype;
    int which = dt == MMRT_DTYPE_F16    ? 1
                : dt == MMRT_DTYPE_BF16 ? 2
                : dt == MMRT_DTYPE_I8   ? 3
                : dt == MMRT_DTYPE_U4   ? 4
                                        : 0;
    enum ocl_kernel id = (enum ocl_kernel)((small ? OCL_K_MM_SMALL_F32 : OCL_K_MM_TILED_F32) +
                                           which);
    struct ocl_call c;
    mmrt_status st = ocl_call_begin(&c, dev, op, id);
    if (st != MMRT_OK)
        return st;
    ocl_arg_mem(&c, x);
    ocl_arg_long(&c, (int64_t)x_off);
    ocl_arg_view(&c, q->w);
    ocl_arg_view(&c, q->s);
    ocl_arg_view(&c, q->z);
    ocl_arg_long(&c, q->G);
    ocl_arg_view(&c, b);
    ocl_arg_int(&c, b->dtype);
    ocl_arg_int(&c, b->mem != NULL);
    ocl_arg_view(&c, y);
    ocl_arg_long(&c, M);
    ocl_arg_long(&c, K);
    ocl_arg_long(&c, N);
    if (small) {
        size_t local = OCL_MM_SMALL_WG;
        size_t global = (size_t)((N + OCL_MM_SMALL_N - 1) / OCL_MM_SMALL_N) * local;
        return ocl_call_run(&c, 1, &global, &local, false);
    }
    size_t edge = OCL_MM_T / 4;
    size_t local[2] = {edge, edge};
    size_t global[2] = {(size_t)((N + OCL_MM_T - 1) / OCL_MM_T) * edge,
                        (size_t)((M + OCL_MM_T - 1) / OCL_MM_T) * edge};
    return ocl_call_run(&c, 2, global, local, false);
}

static mmrt_status gemm(struct mmrt_device *dev, const char *op, cl_mem x, uint64_t x_off,
                        int64_t M, int64_t K, const struct mm_weight *q, int64_t N,
                        const struct ocl_view *b, const struct ocl_view *y)
{
    if (M == 0 || N == 0)
        return MMRT_OK;
    if (M <= OCL_MM_SMALL_M || M > OCL_MM_INVARIANT_M)
        return gemm_launch(dev, op, x, x_off, M, K, q, N, b, y);
    mmrt_status st = MMRT_OK;
    for (int64_t m0 = 0; st == MMRT_OK && m0 < M; m0 += OCL_MM_SMALL_M) {
        const int64_t rows = M - m0 < OCL_MM_SMALL_M ? M - m0 : OCL_MM_SMALL_M;
        struct ocl_view yr = *y;
        yr.offset += (uint64_t)(m0 * N) * sizeof(float);
        st = gemm_launch(dev, op, x, x_off + (uint64_t)(m0 * K) * sizeof(float), rows, K, q,
                         N, b, &yr);
    }
    return st;
}

mmrt_status ocl_op_matmul(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_MATMUL, 2, 5, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *x = &o.src[0], *w = &o.src[1], *b = &o.src[2], *s = &o.src[3],
                          *z = &o.src[4], *y = &o.dst;
    /* op_contract.h has matched the operands to W's dtype: scales only for I8 and U4, zero
     * points only for U4, whose scales are [N, G]. */
    int64_t K = ocl_inner(x), M = ocl_rows(x), N = w->ne[0];
    int64_t G = w->dtype == MMRT_DTYPE_U4 ? s->ne[1] : 1;
    const struct mm_weight q = {w, s, z, G};
    return gemm(dev, o.name, x->mem, x->offset, M, K, &q, N, b, y);
}

mmrt_status ocl_op_patch_embed(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_patch_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_PATCH_EMBED, 2, 3, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *img = &o.src[0], *w = &o.src[1], *b = &o.src[2], *y = &o.dst;
    if ((st = ocl_op_params(&o, &p, sizeof p)))
        return st;
    int64_t B = img->ne[0], C = img->ne[1], H = img->ne[2], W = img->ne[3], P = p.patch;
    int64_t O = w->ne[0], n_patches = (H / P) * (W / P);
    if (P > INT32_MAX)
        return ocl_bad(&o, MMRT_ERR_UNSUPPORTED, "patch %" PRId64 " exceeds k_im2col's I32", P);
    if (y->numel == 0)
        return MMRT_OK;

    cl_mem cols = NULL;
    if ((st = ocl_scratch(dev, o.name, (uint64_t)img->numel * sizeof(float), &cols)))
        return st;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_IM2COL)))
        return st;
    ocl_arg_view(&c, img);
    ocl_arg_mem(&c, cols);
    ocl_arg_long(&c, 0);
    ocl_arg_long(&c, C);
    ocl_arg_long(&c, H);
    ocl_arg_long(&c, W);
    ocl_arg_int(&c, (int32_t)P);
    int64_t plen = C * P * P;
    size_t local[2] = {OCL_WG_1D, 1}, global[2] = {(size_t)plen, (size_t)(B * n_patches)};
    if ((st = ocl_call_run(&c, 2, global, local, false)))
        return st;
    struct ocl_view w2 = *w; /* the weight as [O, C·P·P] */
    w2.n_dims = 2;
    w2.ne[1] = plen;
    w2.nb[0] = plen * (int64_t)mmrt_dtype_size((enum mmrt_dtype)w->dtype);
    w2.nb[1] = (int64_t)mmrt_dtype_size((enum mmrt_dtype)w->dtype);
    const struct ocl_view none = { .mem = NULL };
    const struct mm_weight q = {&w2, &none, &none, 1};
    return gemm(dev, o.name, cols, 0, B * n_patches, plen, &q, O, b, y);
}
