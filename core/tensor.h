/*
 * core/tensor.h — tensor descriptors (struct mmrt_tensor from plugin.h) as plain values:
 * sizes, contiguous layouts and views. Nothing here allocates or touches device memory;
 * a view shares its parent's storage and is valid while the parent's block is.
 */
#ifndef MMRT_CORE_TENSOR_H
#define MMRT_CORE_TENSOR_H

#include "error.h"
#include "mmrt/plugin.h"

/* Byte size of a contiguous tensor of that dtype and shape, with overflow checks. */
mmrt_status mmrt_tensor_nbytes(enum mmrt_dtype dtype, int n_dims, const int64_t *ne,
                               uint64_t *out, struct mmrt_error *err);

/* Fills a contiguous descriptor at (buffer, offset). */
void mmrt_tensor_init(struct mmrt_tensor *t, void *buffer, uint64_t offset,
                      enum mmrt_dtype dtype, int n_dims, const int64_t *ne);

/* The same contiguous storage seen with another shape of equal element count. The caller
 * guarantees t is contiguous (all model activations are). */
struct mmrt_tensor mmrt_tensor_reshape(const struct mmrt_tensor *t, int n_dims,
                                       const int64_t *ne);

/* Rows [first, first + n) of the outermost dimension; strides unchanged. */
struct mmrt_tensor mmrt_tensor_rows(const struct mmrt_tensor *t, int64_t first, int64_t n);

#endif
