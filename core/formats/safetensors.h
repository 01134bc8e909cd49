/*
 * core/formats/safetensors.h — read-only, validating loader for Hugging Face safetensors
 * checkpoints (a single file, or shards listed in model.safetensors.index.json).
 *
 * The format
 *   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
 *   bytes [8, 8+N)      a UTF-8 JSON object, optionally padded with JSON whitespace:
 *                         { "__metadata__": {"format": "pt", …},          (optional)
 *                           "<tensor name>": { "dtype": "F32",
 *                                              "shape": [d0, d1, …],
 *                                              "data_offsets": [begin, end] }, … }
 *   bytes [8+N, size)   the data buffer; begin/end are relative to its first byte, end is
 *                       one past the last byte, elements are little-endian, row-major.
 *
 * Every file is treated as hostile. A file is accepted only if the reference validator
 * (huggingface/safetensors, Rust) would accept it, and additionally only when (a) every
 * dtype is F32, F16, BF16, I8, U8, I32 or I64 — the other real dtypes are refused by name
 * as unsupported; the integer ones belong to quantized matrices (U8 read as MMRT_DTYPE_U4, a
 * byte of two 4-bit codes; I32 as AWQ, GPTQ and compressed-tensors pack them; I64 as
 * MMRT_ST_DTYPE_I64, their shape bookkeeping) —
 * (b) it stays within struct mmrt_st_limits, (c) every tensor entry has exactly the three
 * members above (the reference ignores extra members; no known writer emits any, and a
 * closed schema leaves nothing for a crafted file to hide in), (d) "__metadata__", when
 * present, is a string → string object (the reference also reads `null` as "absent"; we
 * refuse it). The rules, each a test case in tests/test_safetensors.c
 * (the S-numbers of /work/shared/specs/untrusted-input.md):
 *   S1  8 ≤ file size; 2 ≤ N ≤ max_header_bytes; 8 + N ≤ file size.
 *   S2  the header parses with mmrt_json_parse (UTF-8 checked, depth ≤ 3, duplicate keys
 *       refused, trailing garbage refused, whitespace padding on either side accepted) and
 *       its top level is an object.
 *   S3  dtype is a string from the closed list; shape an array of ≤ max_rank non-negative
 *       JSON integers (1.0, 1e3, -1 refused); element and byte counts overflow-checked.
 *   S4  data_offsets is an array of exactly two non-negative JSON integers, begin ≤ end ≤
 *       buffer size, end − begin == element count × element size.
 *   S5  sorted by (begin, end), the ranges tile [0, buffer size) exactly: each begins where
 *       the previous one ended (no gap, no overlap) and the last ends at the end of the file
 *       (no trailing bytes: what stops a safetensors file being something else as well).
 *       Zero-size tensors (a 0 in the shape) are allowed to share an offset with each
 *       other and with the start of the following tensor — exactly what the reference
 *       allows — but, like any tensor, must sit on a boundary, not inside another range.
 *   S6  "__metadata__" is an object of strings; the sum of its key and value bytes is at
 *       most max_metadata_bytes. Its content is not interpreted.
 *   S7  the format promises no alignment (writers pad the header to 8 bytes, but nothing
 *       enforces it), so tensor data is exposed as `const void *` that is NOT aligned; read
 *       it with memcpy or bytewise (mmrt_safetensors_read_f32 does), never through a cast to
 *       float * / uint16_t *.
 *   S8  files are opened, fstat-ed, refused unless regular, and every bound above is
 *       checked against the fstat size before the mapping is touched, so a truncated file
 *       is a clean MMRT_ERR_FORMAT, never SIGBUS. Files are mapped read-only, MAP_PRIVATE.
 *       A model file MUST NOT be truncated or rewritten while a set that maps it is open:
 *       the mapping then no longer matches what was validated and reading it may SIGBUS.
 *       (Replacing the file by rename, as downloaders do, is safe: the old inode stays.)
 *   S9  a shard index is {"weight_map": {tensor: file, …}, "metadata": {…}?}; "metadata"
 *       must be an object if present and is otherwise ignored, as are other top-level keys;
 *       every file is a plain name in the index's directory (not empty, not "." or "..", no
 *       '/', no '\\', no NUL, at most 255 bytes); each shard is opened once however many
 *       tensors map to it; the index and the shard headers must agree both ways: a tensor
 *       the index names but its shard lacks, a tensor a shard has that the index does not
 *       list, or lists in another shard, is an error naming the index and the shard(s).
 *   Names: non-empty, at most max_name_bytes bytes, valid UTF-8 without NUL (jansson
 *   checks both), unique across all shards of a set.
 *   S10 (shapes against config.json) is the model loader's job, not this file's.
 *
 * Errors: every fallible function returns an mmrt_status and fills `err` with one line that
 * names the file (path, or `what` for in-memory input), the tensor, and the offending value
 * or byte offset. Statuses: MMRT_ERR_FORMAT (the file breaks a rule), MMRT_ERR_UNSUPPORTED
 * (a real safetensors dtype mmrt does not load), MMRT_ERR_LIMIT (a struct mmrt_st_limits
 * bound), MMRT_ERR_IO (open/fstat/mmap failed, not a regular file), MMRT_ERR_NOT_FOUND (a
 * checkpoint directory without safetensors files), MMRT_ERR_NO_MEMORY, MMRT_ERR_INVALID_ARG.
 * Outputs are written only on success.
 *
 * Thread safety: a set is immutable after open; any number of threads may call count, at,
 * find and read_f32 on it concurrently. close must not race with anything else on the set.
 */
#ifndef MMRT_FORMATS_SAFETENSORS_H
#define MMRT_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../error.h"

/* Hard upper bound of a tensor's rank: the size of mmrt_st_tensor.shape. */
#define MMRT_ST_MAX_RANK 8

/* Defaults of struct mmrt_st_limits. The header cap is the reference validator's; a
 * 7B checkpoint's header is ~30 KB, and HF writers store only {"format": "pt"} as metadata. */
#define MMRT_ST_DEFAULT_MAX_HEADER_BYTES 100000000ull
/* 262144 tensors: the largest published checkpoints list about 140k (a 1T-parameter MoE
 * with per-expert FP8 scales); a header with millions of entries is refused by count
 * before it is parsed. */
#define MMRT_ST_DEFAULT_MAX_TENSORS (1ull << 18)
#define MMRT_ST_DEFAULT_MAX_METADATA_BYTES (1ull << 20)
#define MMRT_ST_DEFAULT_MAX_NAME_BYTES 1024u

/*
 * Bounds applied while parsing. A zero member means "use the default", so a caller can
 * zero-initialise the struct and set only what it cares about; pass NULL for all defaults.
 */
struct mmrt_st_limits {
    uint64_t max_header_bytes;   /* cap on N (also on the size of an index file); 100 MB */
    uint64_t max_tensors;        /* per set, all shards together; 1 << 18 */
    uint64_t max_metadata_bytes; /* per file, "__metadata__" keys + values; 1 MiB */
    uint32_t max_name_bytes;     /* per tensor name; 1024 */
    int32_t max_rank;            /* 1 … MMRT_ST_MAX_RANK (default 8); larger is refused */
};

/* An st_tensor dtype beyond enum mmrt_dtype: int64, which no kernel reads; a quantized
 * checkpoint's bookkeeping (compressed-tensors' weight_shape) is the only use. Its element
 * size is mmrt_st_dtype_size's. */
#define MMRT_ST_DTYPE_I64 64

/* Bytes of one element of an st_tensor dtype (an enum mmrt_dtype or MMRT_ST_DTYPE_I64). */
size_t mmrt_st_dtype_size(int32_t dtype);

/*
 * One tensor of an open set. Every pointer is owned by the set and valid until
 * mmrt_safetensors_close().
 */
struct mmrt_st_tensor {
    const char *name;                /* NUL-terminated UTF-8 as in the header */
    int32_t dtype;                   /* enum mmrt_dtype: F32, F16, BF16, I8, I32, or U4 (U8);
                                        or MMRT_ST_DTYPE_I64 */
    int32_t n_dims;                  /* 0 (a scalar, shape []) … MMRT_ST_MAX_RANK */
    int64_t shape[MMRT_ST_MAX_RANK]; /* [n_dims], outermost first (row-major); rest 0 */
    uint64_t n_elements;             /* product of shape (1 for a scalar, 0 if a dim is 0) */
    uint64_t nbytes;                 /* n_elements × mmrt_dtype_size(dtype) */
    const void *data;                /* [nbytes] little-endian, inside the read-only mapping
                                        (or the caller's buffer); NOT aligned to anything —
                                        read with memcpy. Never NULL, even when nbytes is 0. */
    const char *file;                /* path of the shard holding it (`what` when in memory);
                                        tensors of one shard share this pointer */
    uint64_t file_offset;            /* absolute byte offset of data in that file (messages) */
};

/* An open, validated set of tensors: one file or all shards of an index. */
struct mmrt_safetensors;

/*
 * Opens, validates and maps a checkpoint. `path` is one of:
 *   - a directory: uses DIR/model.safetensors if it exists, else
 *     DIR/model.safetensors.index.json, else fails with MMRT_ERR_NOT_FOUND naming both.
 *     (The single file wins when both exist, because that is what transformers'
 *     from_pretrained loads, and mmrt is held to transformers' outputs.)
 *   - a file whose name ends in ".json": a shard index; shards are looked up next to it.
 *   - any other file: a single safetensors file.
 * limits: NULL for the defaults (see struct mmrt_st_limits).
 * On success *out is a new set; release it with mmrt_safetensors_close(). On failure *out
 * is untouched, nothing stays mapped or allocated, and err names the file and the problem.
 */
mmrt_status mmrt_safetensors_open(const char *path, const struct mmrt_st_limits *limits,
                                  struct mmrt_safetensors **out, struct mmrt_error *err);

/*
 * The same validation on a whole safetensors file already in memory: bytes[0, size) is the
 * 8-byte length, the header and the data buffer. `what` names it in messages and becomes
 * every tensor's `file`. The set borrows `bytes` (tensor data points into it), so the
 * buffer must outlive the set and must not change while it is open; `what` is copied.
 * Used by the fuzzer and by unit tests; `bytes` may be NULL only when size is 0.
 */
mmrt_status mmrt_safetensors_parse_header(const uint8_t *bytes, uint64_t size,
                                          const char *what,
                                          const struct mmrt_st_limits *limits,
                                          struct mmrt_safetensors **out,
                                          struct mmrt_error *err);

/* Unmaps the files and frees the set; every pointer obtained from it dies. NULL is a no-op. */
void mmrt_safetensors_close(struct mmrt_safetensors *st);

/* Number of tensors in the set (all shards). */
size_t mmrt_safetensors_count(const struct mmrt_safetensors *st);

/* Tensor i, for 0 ≤ i < count, in ascending bytewise (strcmp) order of name, so iteration
 * is deterministic whatever the order of the header; NULL when i is out of range. */
const struct mmrt_st_tensor *mmrt_safetensors_at(const struct mmrt_safetensors *st, size_t i);

/* The tensor called `name` (exact bytes), or NULL. O(log n): binary search on the sorted
 * names. Canonicalising checkpoint key spellings is the model loader's job. */
const struct mmrt_st_tensor *mmrt_safetensors_find(const struct mmrt_safetensors *st,
                                                   const char *name);

/*
 * The read-only mapping of the whole file that holds tensor t (a tensor of this set): *base
 * is page-aligned and t->data == *base + t->file_offset. For zero-copy weights (the mapping
 * lives until mmrt_safetensors_close). Returns 0 and leaves the outputs untouched when t's
 * bytes are not in a mapping of the set (a set over caller memory, or an empty file).
 */
int mmrt_safetensors_mapping(const struct mmrt_safetensors *st, const struct mmrt_st_tensor *t,
                             const void **base, uint64_t *size);

/*
 * Converts tensor t to n float32 values in dst (host memory, any alignment of float).
 * n must equal t->n_elements (MMRT_ERR_INVALID_ARG otherwise, naming both). F16 and BF16
 * are widened exactly — subnormals, ±0, ±inf and NaN payloads included; F32 is copied.
 * Meant for tests and small tensors; weights go to devices through the loader.
 */
mmrt_status mmrt_safetensors_read_f32(const struct mmrt_st_tensor *t, float *dst, size_t n,
                                      struct mmrt_error *err);

/* Elements [first, first + n) of t (in row-major order) as float32, as above; the range must
 * lie inside the tensor (MMRT_ERR_INVALID_ARG otherwise). For converting a large weight a few
 * rows at a time. */
mmrt_status mmrt_safetensors_read_f32_range(const struct mmrt_st_tensor *t, uint64_t first,
                                            float *dst, size_t n, struct mmrt_error *err);

#endif /* MMRT_FORMATS_SAFETENSORS_H */
