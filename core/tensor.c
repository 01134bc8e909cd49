/* core/tensor.c — descriptor arithmetic (see tensor.h). */
#include "tensor.h"

#include <string.h>

mmrt_status mmrt_tensor_nbytes(enum mmrt_dtype dtype, int n_dims, const int64_t *ne,
                               uint64_t *out, struct mmrt_error *err)
{
    uint64_t n = mmrt_dtype_size(dtype);
    if (n == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "unknown dtype %d", (int)dtype);
    if (n_dims < 1 || n_dims > MMRT_MAX_DIMS)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tensor rank %d is outside 1…%d",
                              n_dims, MMRT_MAX_DIMS);
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] < 0 || __builtin_mul_overflow(n, (uint64_t)ne[i], &n))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "tensor extent %lld (dim %d) is negative or too large",
                                  (long long)ne[i], i);
    }
    *out = n;
    return MMRT_OK;
}

void mmrt_tensor_init(struct mmrt_tensor *t, void *buffer, uint64_t offset,
                      enum mmrt_dtype dtype, int n_dims, const int64_t *ne)
{
    memset(t, 0, sizeof *t);
    t->hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_tensor);
    t->buffer = buffer;
    t->offset = offset;
    t->dtype = dtype;
    t->n_dims = n_dims;
    int64_t stride = (int64_t)mmrt_dtype_size(dtype);
    for (int i = MMRT_MAX_DIMS - 1; i >= 0; i--) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        t->nb[i] = stride;
        stride *= t->ne[i];
    }
}

struct mmrt_tensor mmrt_tensor_reshape(const struct mmrt_tensor *t, int n_dims,
                                       const int64_t *ne)
{
    struct mmrt_tensor v;
    mmrt_tensor_init(&v, t->buffer, t->offset, (enum mmrt_dtype)t->dtype, n_dims, ne);
    return v;
}

struct mmrt_tensor mmrt_tensor_rows(const struct mmrt_tensor *t, int64_t first, int64_t n)
{
    struct mmrt_tensor v = *t;
    v.offset += (uint64_t)(first * t->nb[0]);
    v.ne[0] = n;
    return v;
}
