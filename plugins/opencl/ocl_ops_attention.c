/*
 * plugins/opencl/ocl_ops_attention.c — host side of ROPE and ROPE_MULTI (kernels/rope.cl),
 * ATTENTION and ATTENTION_PAGED (kernels/attention.cl).
 *
 * The rotary ops' inv_freq[i] = 1 / theta^((2i)/freq_dim) (freq_dim = n_rot for ROPE) is
 * computed here, on the host, with the expression and libm powf the CPU reference uses, and
 * kept on the device in a small cache keyed by (theta, freq_dim, entries) — a model has one or
 * two — so the device sees bit-identical frequencies without depending on the accuracy of
 * OpenCL's pow (16 ulp allowed).
 *
 * ATTENTION cannot see cu_seqlens on the host (they live in device memory and a decode step
 * rewrites them there), so their values are checked by k_check_cu on the device and a bad one
 * is reported asynchronously (see ocl_internal.h); everything else is checked here. The same
 * holds for ATTENTION_PAGED's cu_seqlens_q, kv_lens and page ids (k_check_paged).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ocl_internal.h"
#include "plugin_views.h"

/* ---- ROPE, ROPE_MULTI ----------------------------------------------------------------- */

/* The n entries of inv_freq for (theta, freq_dim), from the cache or made now. */
static mmrt_status rope_table(struct mmrt_device *dev, const char *op, float theta,
                              int32_t freq_dim, int32_t n, cl_mem *out)
{
    for (int i = 0; i < OCL_ROPE_TABLES; i++)
        if (dev->rope[i].mem && dev->rope[i].theta == theta &&
            dev->rope[i].freq_dim == freq_dim && dev->rope[i].n == n) {
            *out = dev->rope[i].mem;
            return MMRT_OK;
        }
    float *inv = malloc((size_t)n * sizeof(float));
    if (!inv)
        return ocl_fail(dev, MMRT_ERR_NO_MEMORY, "%s: out of host memory for inv_freq", op);
    for (int32_t i = 0; i < n; i++)
        inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)freq_dim);
    cl_int rc;
    cl_mem mem = clCreateBuffer(dev->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                (size_t)n * sizeof(float), inv, &rc);
    free(inv);
    if (rc != CL_SUCCESS) {
        char where[64];
        snprintf(where, sizeof where, "%s (inv_freq table)", op);
        return ocl_fail_cl(dev, rc, true, where, "clCreateBuffer");
    }
    /* Evict round-robin. Releasing a table queued kernels still use is safe: OpenCL frees it
     * after them. */
    struct ocl_rope_table *slot = &dev->rope[dev->rope_next];
    dev->rope_next = (dev->rope_next + 1) % OCL_ROPE_TABLES;
    if (slot->mem)
        clReleaseMemObject(slot->mem);
    *slot = (struct ocl_rope_table){theta, freq_dim, n, mem};
    *out = mem;
    return MMRT_OK;
}

/* What ROPE and ROPE_MULTI share: x [T, H, D] F32 and dst of its shape (x itself or
 * disjoint), both with a contiguous inner dim and any token and head strides, positions I32
 * contiguous with `pos_per_token` entries per token, n_rot and theta as plugin.h says. */
static mmrt_status check_rotary(struct ocl_op *o, float theta, int32_t n_rot,
                                int64_t pos_per_token)
{
    const struct ocl_view *x = &o->src[0], *pos = &o->src[1], *y = &o->dst;
    mmrt_status st;
    if ((st = ocl_need_rank(o, "src0 (x)", x, 3)) ||
        (st = ocl_need_dtype(o, "src0 (x)", x, OCL_DT_F32)) ||
        (st = ocl_need_inner_contig(o, "src0 (x)", x)) ||
        (st = ocl_need_dtype(o, "src1 (positions)", pos, OCL_DT_I32)) ||
        (st = ocl_need_contig(o, "src1 (positions)", pos)) ||
        (st = ocl_need_dtype(o, "dst", y, OCL_DT_F32)) ||
        (st = ocl_need_inner_contig(o, "dst", y)) ||
        (st = ocl_need_disjoint(o, "src0 (x)", x, true)) ||
        (st = ocl_need_disjoint(o, "src1 (positions)", pos, false)))
        return st;
    int64_t T = x->ne[0], H = x->ne[1], D = x->ne[2];
    if (!ocl_same_shape(x, y))
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "dst must have x's shape [%" PRId64 ", %" PRId64
                       ", %" PRId64 "]", T, H, D);
    if (pos->numel != T * pos_per_token)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "src1 (positions) has %" PRId64 " entries for %"
                       PRId64 " tokens × %" PRId64, pos->numel, T, pos_per_token);
    char why[160];
    if (mmrt_pv_rope_rot(n_rot, D, theta, why, sizeof why) != MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    if (D > INT32_MAX)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "head dim %" PRId64 " exceeds I32", D);
    return MMRT_OK;
}

/* Launches k_rope or k_rope_multi: the arguments up to the table are the same. */
static void rotary_args(struct ocl_call *c, const struct ocl_op *o, cl_mem inv)
{
    const struct ocl_view *x = &o->src[0], *y = &o->dst;
    int64_t es = (int64_t)sizeof(float);
    ocl_arg_view(c, x);
    ocl_arg_long(c, x->nb[0] / es);
    ocl_arg_long(c, x->nb[1] / es);
    ocl_arg_view(c, y);
    ocl_arg_long(c, y->nb[0] / es);
    ocl_arg_long(c, y->nb[1] / es);
    ocl_arg_view(c, &o->src[1]);
    ocl_arg_mem(c, inv);
    ocl_arg_long(c, x->ne[1]);
    ocl_arg_int(c, (int32_t)x->ne[2]);
}

/* One work-item per pair (or per copied tail dim, whichever is more) and token. */
static mmrt_status rotary_run(struct ocl_call *c, const struct ocl_op *o, int32_t n_rot)
{
    int64_t D = o->src[0].ne[2];
    int64_t items = n_rot / 2 > D - n_rot ? n_rot / 2 : D - n_rot;
    size_t local[2] = {OCL_WG_ROPE, 1}, global[2] = {(size_t)items, (size_t)o->src[0].ne[0]};
    return ocl_call_run(c, 2, global, local, false);
}

mmrt_status ocl_op_rope(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_rope_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ROPE, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = ocl_op_params(&o, &p, sizeof p)) || (st = check_rotary(&o, p.theta, p.n_rot, 1)))
        return st;
    char why[96];
    if (mmrt_pv_rope_mode(p.mode, why, sizeof why) != MMRT_OK)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "%s", why);
    if (o.src[0].ne[0] == 0 || o.src[0].ne[1] == 0)
        return MMRT_OK;
    cl_mem inv = NULL;
    if ((st = rope_table(dev, o.name, p.theta, p.n_rot, p.n_rot / 2, &inv)))
        return st;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ROPE)))
        return st;
    rotary_args(&c, &o, inv);
    ocl_arg_int(&c, p.n_rot);
    ocl_arg_int(&c, p.mode == MMRT_ROPE_INTERLEAVED);
    ocl_arg_int(&c, ocl_same_view(&o.src[0], &o.dst));
    return rotary_run(&c, &o, p.n_rot);
}

mmrt_status ocl_op_rope_multi(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_rope_multi_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ROPE_MULTI, 2, 2, &o);
    if (st != MMRT_OK)
        return st;
    if ((st = ocl_op_params(&o, &p, sizeof p)))
        return st;
    if (p.n_axes < 1 || p.n_axes > MMRT_ROPE_MAX_AXES)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "n_axes %" PRId32 " is outside 1…%d", p.n_axes,
                       MMRT_ROPE_MAX_AXES);
    if ((st = check_rotary(&o, p.theta, p.n_rot, p.n_axes)))
        return st;
    if ((st = ocl_need_rank(&o, "src1 (positions)", &o.src[1], 2)))
        return st;
    if (o.src[1].ne[1] != p.n_axes)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "src1 (positions) must be [T, n_axes = %" PRId32
                       "], got [%" PRId64 ", %" PRId64 "]", p.n_axes, o.src[1].ne[0],
                       o.src[1].ne[1]);
    if (p.freq_dim < 1)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "freq_dim %" PRId32 " must be ≥ 1", p.freq_dim);
    if (p.restart != 0 && p.restart != 1)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "restart %" PRId32 " must be 0 or 1", p.restart);
    /* Cumulative section ends; the kernel needs the first three (the last is n_rot / 2). */
    int32_t ends[MMRT_ROPE_MAX_AXES] = {0};
    int64_t sum = 0;
    for (int a = 0; a < p.n_axes; a++) {
        if (p.sections[a] < 0)
            return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "sections[%d] = %" PRId32 " is negative", a,
                           p.sections[a]);
        sum += p.sections[a];
        ends[a] = (int32_t)(sum < INT32_MAX ? sum : INT32_MAX);
    }
    if (sum != p.n_rot / 2)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "sections sum to %" PRId64 ", n_rot / 2 is %"
                       PRId32, sum, p.n_rot / 2);
    if (o.src[0].ne[0] == 0 || o.src[0].ne[1] == 0)
        return MMRT_OK;
    cl_mem inv = NULL;
    if ((st = rope_table(dev, o.name, p.theta, p.freq_dim, p.n_rot / 2, &inv)))
        return st;
    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ROPE_MULTI)))
        return st;
    rotary_args(&c, &o, inv);
    ocl_arg_int(&c, p.n_rot);
    ocl_arg_int(&c, p.n_axes);
    ocl_arg_int(&c, p.restart);
    for (int a = 0; a < MMRT_ROPE_MAX_AXES - 1; a++)
        ocl_arg_int(&c, ends[a]);
    ocl_arg_int(&c, ocl_same_view(&o.src[0], &o.dst));
    return rotary_run(&c, &o, p.n_rot);
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

/* What ATTENTION and ATTENTION_PAGED check alike once q, K and V have their ranks and
 * dtypes: head dim, head grouping, dst's shape, the params, and the grid's limits. */
static mmrt_status check_heads(struct ocl_op *o, const struct mmrt_attention_params *p,
                               int64_t Hq, int64_t Hkv, int64_t D)
{
    char why[256];
    if (mmrt_pv_attention_heads(Hq, Hkv, D, why, sizeof why) != MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    if (!ocl_same_shape(&o->src[0], &o->dst))
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "dst must have q's shape");
    if (mmrt_pv_attention_values(p, why, sizeof why) != MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    return MMRT_OK;
}

/* The attention params of a launch: ABI 1.4 callers' 12 bytes read as window 0. */
static mmrt_status attention_params(struct ocl_op *o, struct mmrt_attention_params *p)
{
    char why[128];
    if (mmrt_pv_attention_params(o->params, o->params_size, p, why, sizeof why) != MMRT_OK)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s", why);
    return MMRT_OK;
}

/* Keys per K/V tile: as many as the local-memory budget holds, at most OCL_ATT_BK. It
 * depends on D and the device only, which keeps a query's result independent of its batch. */
static int32_t tile_keys(const struct mmrt_device *dev, int64_t D)
{
    int64_t bk = dev->kv_floats / 2 / ((D + 3) / 4 * 4); /* tile rows padded to 4 floats */
    return (int32_t)(bk > OCL_ATT_BK ? OCL_ATT_BK : bk);
}

/* Enqueues an attention kernel's grid: Σ ceil(Lq_s / BQ) ≤ ceil(T / BQ) + n_seq blocks per
 * query head (the spare blocks return at once). */
static mmrt_status run_blocks(struct ocl_call *c, int64_t T, int64_t n_seq, int64_t Hq)
{
    int64_t blocks = (T + OCL_ATT_BQ - 1) / OCL_ATT_BQ + n_seq;
    size_t local[2] = {OCL_ATT_BQ, 1}, global[2] = {(size_t)blocks * OCL_ATT_BQ, (size_t)Hq};
    return ocl_call_run(c, 2, global, local, false);
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
    if ((st = attention_params(&o, &p)) || (st = ocl_need_rank(&o, "src0 (q)", q, 3)) ||
        (st = ocl_need_dtype(&o, "src0 (q)", q, OCL_DT_F32)) ||
        (st = ocl_need_contig(&o, "src0 (q)", q)) || (st = ocl_need_rank(&o, "src1 (k)", k, 3)) ||
        (st = ocl_need_dtype(&o, "src1 (k)", k, OCL_DT_KV)) ||
        (st = ocl_need_inner_contig(&o, "src1 (k)", k)) ||
        (st = ocl_need_rank(&o, "src2 (v)", v, 3)) ||
        (st = ocl_need_dtype(&o, "src2 (v)", v, OCL_DT_KV)) ||
        (st = ocl_need_inner_contig(&o, "src2 (v)", v)) ||
        (st = ocl_need_dtype(&o, "dst", y, OCL_DT_F32)) || (st = ocl_need_contig(&o, "dst", y)) ||
        (st = ocl_need_disjoint(&o, "src0 (q)", q, false)) ||
        (st = ocl_need_disjoint(&o, "src1 (k)", k, false)) ||
        (st = ocl_need_disjoint(&o, "src2 (v)", v, false)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], S = k->ne[0], Hkv = k->ne[1];
    if (D >= 1 && D <= 256 && (!ocl_same_shape(k, v) || k->ne[2] != D))
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "k [%" PRId64 ", %" PRId64 ", %" PRId64 "] and "
                       "v [%" PRId64 ", %" PRId64 ", %" PRId64 "] must both be [S, Hkv, %" PRId64
                       "]", k->ne[0], k->ne[1], k->ne[2], v->ne[0], v->ne[1], v->ne[2], D);
    if ((st = check_heads(&o, &p, Hq, Hkv, D)))
        return st;
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
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ATTENTION)))
        return st;
    ocl_arg_view(&c, q);
    ocl_arg_view(&c, k);
    ocl_arg_long(&c, k->nb[0] / kes);
    ocl_arg_long(&c, k->nb[1] / kes);
    ocl_arg_int(&c, k->dtype); /* the kernels' DT_ values are enum mmrt_dtype's */
    ocl_arg_view(&c, v);
    ocl_arg_long(&c, v->nb[0] / ves);
    ocl_arg_long(&c, v->nb[1] / ves);
    ocl_arg_int(&c, v->dtype);
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
    ocl_arg_int(&c, p.window);
    ocl_arg_int(&c, tile_keys(dev, D));
    return run_blocks(&c, T, has_cu ? p.n_seq : 0, Hq);
}

/* Host-side checks of an index tensor: I32, contiguous, n entries, not overlapping dst. */
static mmrt_status check_index(struct ocl_op *o, const char *what, const struct ocl_view *t,
                               int64_t n)
{
    mmrt_status st;
    if ((st = ocl_need_dtype(o, what, t, OCL_DT_I32)) || (st = ocl_need_contig(o, what, t)) ||
        (st = ocl_need_disjoint(o, what, t, false)))
        return st;
    if (t->numel != n)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%s has %" PRId64 " entries, expected %" PRId64,
                       what, t->numel, n);
    return MMRT_OK;
}

mmrt_status ocl_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_attention_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ATTENTION_PAGED, 6, 6, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2], *y = &o.dst;
    const struct ocl_view *cq = &o.src[3], *lens = &o.src[4], *table = &o.src[5];
    if ((st = attention_params(&o, &p)) || (st = ocl_need_rank(&o, "src0 (q)", q, 3)) ||
        (st = ocl_need_dtype(&o, "src0 (q)", q, OCL_DT_F32)) ||
        (st = ocl_need_contig(&o, "src0 (q)", q)) ||
        (st = ocl_need_rank(&o, "src1 (k_pages)", k, 4)) ||
        (st = ocl_need_dtype(&o, "src1 (k_pages)", k, OCL_DT_KV)) ||
        (st = ocl_need_contig(&o, "src1 (k_pages)", k)) ||
        (st = ocl_need_contig(&o, "src2 (v_pages)", v)) ||
        (st = ocl_need_dtype(&o, "dst", y, OCL_DT_F32)) || (st = ocl_need_contig(&o, "dst", y)) ||
        (st = ocl_need_disjoint(&o, "src0 (q)", q, false)) ||
        (st = ocl_need_disjoint(&o, "src1 (k_pages)", k, false)) ||
        (st = ocl_need_disjoint(&o, "src2 (v_pages)", v, false)))
        return st;
    if (!ocl_same_shape(k, v) || v->dtype != k->dtype)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "src2 (v_pages) must have k_pages' shape and "
                       "dtype");
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2];
    int64_t n_pages = k->ne[0], page_tokens = k->ne[1], Hkv = k->ne[2];
    if (k->ne[3] != D)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "the pages' head dim %" PRId64 " differs from "
                       "q's %" PRId64, k->ne[3], D);
    if (page_tokens < 1 || n_pages > INT32_MAX)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "%" PRId64 " pages of %" PRId64 " tokens",
                       n_pages, page_tokens);
    if ((st = check_heads(&o, &p, Hq, Hkv, D)))
        return st;
    if (p.n_seq < 1)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "n_seq %" PRId32 " must be ≥ 1", p.n_seq);
    if ((st = check_index(&o, "src3 (cu_seqlens_q)", cq, (int64_t)p.n_seq + 1)) ||
        (st = check_index(&o, "src4 (kv_lens)", lens, p.n_seq)) ||
        (st = ocl_need_rank(&o, "src5 (page_table)", table, 2)) ||
        (st = check_index(&o, "src5 (page_table)", table, table->numel)))
        return st;
    int64_t max_pages = table->ne[1];
    if (table->ne[0] != p.n_seq || max_pages < 1)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "src5 (page_table) must be [n_seq = %" PRId32
                       ", max_pages ≥ 1], got [%" PRId64 ", %" PRId64 "]", p.n_seq,
                       table->ne[0], max_pages);
    if (T > INT32_MAX || Hq > 65535)
        return ocl_bad(&o, MMRT_ERR_INVALID_ARG, "%" PRId64 " queries / %" PRId64 " heads "
                       "exceed I32 sequence offsets or the grid", T, Hq);

    struct ocl_call c;
    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_CHECK_PAGED)))
        return st;
    ocl_arg_view(&c, cq);
    ocl_arg_view(&c, lens);
    ocl_arg_view(&c, table);
    ocl_arg_int(&c, p.n_seq);
    ocl_arg_long(&c, T);
    ocl_arg_long(&c, max_pages);
    ocl_arg_long(&c, page_tokens);
    ocl_arg_long(&c, n_pages);
    ocl_arg_mem(&c, dev->err_mem);
    size_t one = 1;
    if ((st = ocl_call_run(&c, 1, &one, &one, true)))
        return st;
    if (T == 0 || Hq == 0)
        return MMRT_OK;

    if ((st = ocl_call_begin(&c, dev, o.name, OCL_K_ATTENTION_PAGED)))
        return st;
    ocl_arg_view(&c, q);
    ocl_arg_view(&c, k);
    ocl_arg_view(&c, v);
    ocl_arg_int(&c, k->dtype);
    ocl_arg_view(&c, cq);
    ocl_arg_view(&c, lens);
    ocl_arg_view(&c, table);
    ocl_arg_int(&c, p.n_seq);
    ocl_arg_long(&c, max_pages);
    ocl_arg_long(&c, page_tokens);
    ocl_arg_view(&c, y);
    ocl_arg_mem(&c, dev->err_mem);
    ocl_arg_int(&c, (int32_t)Hq);
    ocl_arg_int(&c, (int32_t)Hkv);
    ocl_arg_int(&c, (int32_t)D);
    ocl_arg_float(&c, p.scale);
    ocl_arg_int(&c, p.causal);
    ocl_arg_int(&c, p.window);
    ocl_arg_int(&c, tile_keys(dev, D));
    return run_blocks(&c, T, p.n_seq, Hq);
}
