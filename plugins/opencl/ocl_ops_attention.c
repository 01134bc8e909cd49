/*
 * plugins/opencl/ocl_ops_attention.c — host side of ROPE (kernels/rope.cl) and ATTENTION
 * (kernels/attention.cl).
 *
 * ROPE's inv_freq[i] = 1 / theta^((2i)/n_rot) is computed here, on the host, with the
 * expression and libm powf the CPU reference uses, and kept on the device in a small cache
 * keyed by (theta, n_rot) — a model has one or two — so the device sees bit-identical
 * frequencies without depending on the accuracy of OpenCL's pow (16 ulp allowed).
 *
 * ATTENTION cannot see cu_seqlens on the host (they live in device memory and a decode step
 * rewrites them there), so their values are checked by k_check_cu on the device and a bad one
 * is reported asynchronously (see ocl_internal.h); everything else is checked here.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ocl_internal.h"

/* ---- ROPE ----------------------------------------------------------------------------- */

static mmrt_status rope_table(struct mmrt_device *dev, float theta, int32_t n_rot, cl_mem *out)
{
    for (int i = 0; i < OCL_ROPE_TABLES; i++)
        if (dev->rope[i].mem && dev->rope[i].theta == theta && dev->rope[i].n_rot == n_rot) {
            *out = dev->rope[i].mem;
            return MMRT_OK;
        }
    int64_t half = n_rot / 2;
    float *inv = malloc((size_t)half * sizeof(float));
    if (!inv)
        return ocl_fail(dev, MMRT_ERR_NO_MEMORY, "ROPE: out of host memory for inv_freq");
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
    cl_int rc;
    cl_mem mem = clCreateBuffer(dev->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                (size_t)half * sizeof(float), inv, &rc);
    free(inv);
    if (rc != CL_SUCCESS)
        return ocl_fail_cl(dev, rc, true, "ROPE (inv_freq table)", "clCreateBuffer");
    /* Evict round-robin. Releasing a table queued kernels still use is safe: OpenCL frees it
     * after them. */
    struct ocl_rope_table *slot = &dev->rope[dev->rope_next];
    dev->rope_next = (dev->rope_next + 1) % OCL_ROPE_TABLES;
    if (slot->mem)
        clReleaseMemObject(slot->mem);
    *slot = (struct ocl_rope_table){theta, n_rot, mem};
    *out = mem;
    return MMRT_OK;
}

mmrt_status ocl_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_rope_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ROPE, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *x = &o.src[0], *pos = &o.src[1], *y = &o.dst;
    if ((st = ocl_op_params(&o, &p, sizeof p)) || (st = ocl_need_rank(&o, "src0 (x)", x, 3)) ||
        (st = ocl_need_dtype(&o, "src0 (x)", x, OCL_DT_F32)) ||
        (st = ocl_need_inner_contig(&o, "src0 (x)", x)) ||
        (st = ocl_need_dtype(&o, "src1 (positions)", pos, OCL_DT_I32)) ||
        (st = ocl_need_contig(&o, "src1 (positions)", pos)) ||
        (st = ocl_need_dtype(&o, "dst", y, OCL_DT_F32)) ||
        (st = ocl_need_inner_contig(&o, "dst", y)) ||
        (st = ocl_need_disjoint(&o, "src0 (x)", x, true)) ||
        (st = ocl_need_disjoint(&o, "src1 (positions)", pos, false)))
        return st;
    int64_t T = x->ne[0], H = x->ne[1], D = x->ne[2];
    if (!ocl_same_shape(x, y))
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "dst must have x's shape [%" PRId64 ", %" PRId64
                       ", %" PRId64 "]", T, H, D);
    if (pos->numel != T)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (positions) has %" PRId64 " entries for %"
                       PRId64 " tokens", pos->numel, T);
    if (p.n_rot < 2 || p.n_rot % 2 != 0 || p.n_rot > D)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "n_rot %" PRId32 " must be even and within 2…D "
                       "(D = %" PRId64 ")", p.n_rot, D);
    if (p.mode != MMRT_ROPE_NEOX && p.mode != MMRT_ROPE_INTERLEAVED)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "mode %" PRId32 " is neither NEOX (0) nor "
                       "INTERLEAVED (1)", p.mode);
    if (!(p.theta > 0.0f) || isinf(p.theta))
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "theta %g must be finite and > 0",
                       (double)p.theta);
    if (D > INT32_MAX)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "head dim %" PRId64 " exceeds I32", D);
    if (T == 0 || H == 0)
        return MMRT_OK;
    cl_mem inv = NULL;
    if ((st = rope_table(dev, p.theta, p.n_rot, &inv)))
        return st;
    int64_t es = (int64_t)sizeof(float);
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ROPE)))
        return st;
    ocl_arg_view(&c, x);
    ocl_arg_long(&c, x->nb[0] / es);
    ocl_arg_long(&c, x->nb[1] / es);
    ocl_arg_view(&c, y);
    ocl_arg_long(&c, y->nb[0] / es);
    ocl_arg_long(&c, y->nb[1] / es);
    ocl_arg_view(&c, pos);
    ocl_arg_mem(&c, inv);
    ocl_arg_long(&c, H);
    ocl_arg_int(&c, (int32_t)D);
    ocl_arg_int(&c, p.n_rot);
    ocl_arg_int(&c, p.mode == MMRT_ROPE_INTERLEAVED);
    ocl_arg_int(&c, ocl_same_view(x, y));
    int64_t items = p.n_rot / 2 > D - p.n_rot ? p.n_rot / 2 : D - p.n_rot;
    size_t local[2] = {OCL_WG_ROPE, 1}, global[2] = {(size_t)items, (size_t)T};
    return ocl_call_run(&c, 2, global, local, false);
}

/* ---- ATTENTION ------------------------------------------------------------------------ */

static mmrt_status check_cu(struct ocl_op *o, const char *what, const struct ocl_view *cu,
                            int64_t n_seq)
{
    mmrt_status st;
    if ((st = ocl_need_dtype(o, what, cu, OCL_DT_I32)) || (st = ocl_need_contig(o, what, cu)) ||
        (st = ocl_need_disjoint(o, what, cu, false)))
        return st;
    if (cu->numel != n_seq + 1)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s has %" PRId64 " entries, n_seq + 1 = %" PRId64,
                       what, cu->numel, n_seq + 1);
    return MMRT_OK;
}

mmrt_status ocl_op_attention(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_attention_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ATTENTION, 3, 5, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2], *y = &o.dst;
    const struct ocl_view *cq = &o.src[3], *ck = &o.src[4];
    if ((st = ocl_op_params(&o, &p, sizeof p)) || (st = ocl_need_rank(&o, "src0 (q)", q, 3)) ||
        (st = ocl_need_dtype(&o, "src0 (q)", q, OCL_DT_F32)) ||
        (st = ocl_need_contig(&o, "src0 (q)", q)) || (st = ocl_need_rank(&o, "src1 (k)", k, 3)) ||
        (st = ocl_need_dtype(&o, "src1 (k)", k, OCL_DT_F32 | OCL_DT_F16)) ||
        (st = ocl_need_inner_contig(&o, "src1 (k)", k)) ||
        (st = ocl_need_rank(&o, "src2 (v)", v, 3)) ||
        (st = ocl_need_dtype(&o, "src2 (v)", v, OCL_DT_F32 | OCL_DT_F16)) ||
        (st = ocl_need_inner_contig(&o, "src2 (v)", v)) ||
        (st = ocl_need_dtype(&o, "dst", y, OCL_DT_F32)) || (st = ocl_need_contig(&o, "dst", y)) ||
        (st = ocl_need_disjoint(&o, "src0 (q)", q, false)) ||
        (st = ocl_need_disjoint(&o, "src1 (k)", k, false)) ||
        (st = ocl_need_disjoint(&o, "src2 (v)", v, false)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], S = k->ne[0], Hkv = k->ne[1];
    if (D < 1 || D > 256)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "head dim %" PRId64 " is outside 1…256", D);
    if (!ocl_same_shape(k, v) || k->ne[2] != D)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "k [%" PRId64 ", %" PRId64 ", %" PRId64 "] and "
                       "v [%" PRId64 ", %" PRId64 ", %" PRId64 "] must both be [S, Hkv, %" PRId64
                       "]", k->ne[0], k->ne[1], k->ne[2], v->ne[0], v->ne[1], v->ne[2], D);
    if (Hkv < 1 || Hq % Hkv != 0)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "%" PRId64 " query heads are not a multiple of %"
                       PRId64 " kv heads", Hq, Hkv);
    if (!ocl_same_shape(q, y))
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "dst must have q's shape");
    if (p.causal != 0 && p.causal != 1)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "causal is %" PRId32 ", expected 0 or 1",
                       p.causal);
    if (!isfinite(p.scale))
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "scale %g is not finite", (double)p.scale);
    if ((cq->mem == NULL) != (ck->mem == NULL))
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "give both cu_seqlens_q and cu_seqlens_k, or "
                       "neither");
    bool has_cu = cq->mem != NULL;
    if (has_cu) {
        if (p.n_seq < 1)
            return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "n_seq %" PRId32 " must be ≥ 1", p.n_seq);
        if ((st = check_cu(&o, "src3 (cu_seqlens_q)", cq, p.n_seq)) ||
            (st = check_cu(&o, "src4 (cu_seqlens_k)", ck, p.n_seq)))
            return st;
    } else if (p.n_seq != 1) {
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "n_seq %" PRId32 " must be 1 without "
                       "cu_seqlens", p.n_seq);
    }
    if (T > INT32_MAX || S > INT32_MAX || Hq > 65535)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "%" PRId64 " queries / %" PRId64 " keys / %"
                       PRId64 " heads exceed I32 sequence offsets or the grid", T, S, Hq);

    struct ocl_call c;
    if (has_cu) {
        if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_CHECK_CU)))
            return st;
        ocl_arg_view(&c, cq);
        ocl_arg_view(&c, ck);
        ocl_arg_int(&c, p.n_seq);
        ocl_arg_long(&c, T);
        ocl_arg_long(&c, S);
        ocl_arg_mem(&c, dev->err_mem);
        size_t one = 1;
        if ((st = ocl_call_run(&c, 1, &one, &one, true)))
            return st;
    }
    if (T == 0 || Hq == 0)
        return MMRT_OK;

    int64_t kes = (int64_t)mmrt_dtype_size((enum mmrt_dtype)k->dtype);
    int64_t ves = (int64_t)mmrt_dtype_size((enum mmrt_dtype)v->dtype);
    int64_t bk = dev->kv_floats / 2 / ((D + 3) / 4 * 4); /* tile rows padded to 4 floats */
    if (bk > OCL_ATT_BK)
        bk = OCL_ATT_BK;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ATTENTION)))
        return st;
    ocl_arg_view(&c, q);
    ocl_arg_view(&c, k);
    ocl_arg_long(&c, k->nb[0] / kes);
    ocl_arg_long(&c, k->nb[1] / kes);
    ocl_arg_int(&c, k->dtype == MMRT_DTYPE_F16);
    ocl_arg_view(&c, v);
    ocl_arg_long(&c, v->nb[0] / ves);
    ocl_arg_long(&c, v->nb[1] / ves);
    ocl_arg_int(&c, v->dtype == MMRT_DTYPE_F16);
    ocl_arg_view(&c, cq);
    ocl_arg_view(&c, ck);
    ocl_arg_int(&c, has_cu);
    ocl_arg_int(&c, has_cu ? p.n_seq : 1);
    ocl_arg_view(&c, y);
    ocl_arg_mem(&c, dev->err_mem);
    ocl_arg_long(&c, T);
    ocl_arg_long(&c, S);
    ocl_arg_int(&c, (int32_t)Hq);
    ocl_arg_int(&c, (int32_t)(Hq / Hkv));
    ocl_arg_int(&c, (int32_t)D);
    ocl_arg_float(&c, p.scale);
    ocl_arg_int(&c, p.causal);
    ocl_arg_int(&c, (int32_t)bk);
    /* Σ ceil(Lq_s / BQ) ≤ ceil(T / BQ) + n_seq; the spare blocks return at once. */
    int64_t blocks = (T + OCL_ATT_BQ - 1) / OCL_ATT_BQ + (has_cu ? p.n_seq : 0);
    size_t local[2] = {OCL_ATT_BQ, 1}, global[2] = {(size_t)blocks * OCL_ATT_BQ, (size_t)Hq};
    return ocl_call_run(&c, 2, global, local, false);
}
