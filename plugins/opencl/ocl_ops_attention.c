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
 * is reported asynchronously (see ocl_internal.h). The same holds for ATTENTION_PAGED's
 * cu_seqlens_q, kv_lens and page ids (k_check_paged). Everything the host can see without
 * reading device memory ocl_op_begin has checked against plugin.h's contract (op_contract.h);
 * what is left here are the kernels' own limits: I32 extents and the grid.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ocl_internal.h"
#include "op_contract.h"

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

/* The rotary kernels take the head dim as an int. */
static mmrt_status check_rotary(struct ocl_op *o)
{
    int64_t D = o->src[0].ne[2];
    if (D > INT32_MAX)
        return ocl_bad(o, MMRT_ERR_UNSUPPORTED, "head dim %" PRId64 " exceeds the kernels' I32",
                       D);
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
    if ((st = ocl_op_params(&o, &p, sizeof p)) || (st = check_rotary(&o)))
        return st;
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
    if ((st = ocl_op_params(&o, &p, sizeof p)) || (st = check_rotary(&o)))
        return st;
    /* Cumulative section ends; the kernel needs the first three (the last is n_rot / 2). The
     * sections are ≥ 0 and sum to n_rot / 2 (op_contract.h), so every end fits an int. */
    int32_t ends[MMRT_ROPE_MAX_AXES] = {0};
    int32_t sum = 0;
    for (int a = 0; a < p.n_axes; a++) {
        sum += p.sections[a];
        ends[a] = sum;
    }
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

/* What both attention ops check beyond the contract: queries (T) and keys (S) that I32
 * cu_seqlens can count — the contract bounds them only where no cu_seqlens are given, and
 * offsets past INT32_MAX are not a valid launch — and query heads that fit the grid's second
 * dimension, a limit of these kernels. */
static mmrt_status check_extents(struct ocl_op *o, int64_t T, int64_t S, int64_t Hq)
{
    if (T > INT32_MAX || S > INT32_MAX)
        return ocl_bad(o, MMRT_ERR_INVALID_ARG, "%" PRId64 " queries / %" PRId64 " keys exceed "
                       "I32 sequence offsets", T, S);
    if (Hq > 65535)
        return ocl_bad(o, MMRT_ERR_UNSUPPORTED, "%" PRId64 " query heads exceed the kernels' "
                       "grid (65535)", Hq);
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
    if ((st = attention_params(&o, &p)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], S = k->ne[0], Hkv = k->ne[1];
    if ((st = check_extents(&o, T, S, Hq)))
        return st;
    bool has_cu = cq->mem != NULL; /* then so is ck (op_contract.h) */

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

mmrt_status ocl_op_attention_paged(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    struct ocl_op o;
    struct mmrt_attention_params p;
    mmrt_status st = ocl_op_begin(dev, args, MMRT_OP_ATTENTION_PAGED, 6, 8, &o);
    if (st != MMRT_OK)
        return st;
    const struct ocl_view *q = &o.src[0], *k = &o.src[1], *v = &o.src[2], *y = &o.dst;
    const struct ocl_view *cq = &o.src[3], *lens = &o.src[4], *table = &o.src[5];
    if ((st = attention_params(&o, &p)))
        return st;
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2];
    int64_t n_pages = k->ne[0], page_tokens = k->ne[1], Hkv = k->ne[2];
    int64_t max_pages = table->ne[1];
    if ((st = check_extents(&o, T, 0, Hq)))
        return st;
    if (n_pages > INT32_MAX)
        return ocl_bad(&o, MMRT_ERR_UNSUPPORTED, "%" PRId64 " pages exceed the kernels' I32 page "
                       "ids", n_pages);

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
    ocl_arg_view(&c, &o.src[6]); /* I8 pages' scales (op_contract.h); absent otherwise */
    ocl_arg_view(&c, &o.src[7]);
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
