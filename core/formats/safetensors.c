/*
 * core/formats/safetensors.c — the safetensors loader of safetensors.h.
 *
 * Validation order, cheapest and most fundamental first, so that no later step can read
 * outside what an earlier step proved is there:
 *   1. fstat (open_mapped): a regular file, and its size; nothing is mapped before this.
 *   2. the 8-byte length N against the cap and against the fstat size (overflow-checked),
 *      before one byte of the header is read.
 *   2b. the header's top-level members counted in one pass over the bytes, against
 *      max_tensors, so a header of millions of tiny entries costs no parse.
 *   3. the header through mmrt_json_parse (depth, UTF-8, duplicates) — jansson never sees
 *      more than those N bytes.
 *   4. each entry: closed schema, dtype, shape and byte count with overflow checks, then
 *      data_offsets against the byte count and the buffer size. Only now is a data pointer
 *      formed, and it lies inside the fstat-sized mapping.
 *   5. per file, the ranges sorted by offset must tile the buffer (S5).
 *   6. per set, names sorted (the lookup order) and checked for duplicates across shards;
 *      for an index, a merge walk of the sorted index against the sorted tensors.
 * Errors found in step k never depend on data that step k−1 did not validate.
 *
 * Data structure: the set owns one st_shard per file (path, mapping, an arena with that
 * file's tensor names) and one array of mmrt_st_tensor sorted by name, so find() is a
 * binary search and at() iterates deterministically.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "json.h"
#include "mmrt/plugin.h" /* the F16 element: mmrt_f16_to_f32 */

/* The header is {name: {dtype, shape: [..], data_offsets: [..]}}: three levels, no more. */
#define ST_HEADER_DEPTH 3
/* The index's "metadata" is ignored but parsed; allow writers some nesting there. */
#define ST_INDEX_DEPTH 16
#define ST_MAX_FILE_NAME 255
/* Room for a quoted, escaped, truncated name in a message. */
#define ST_QUOTE_MAX 96
#define ST_WHAT_MAX 1024

struct st_shard {
    char *path;     /* owned; every tensor's `file` points here */
    void *map;      /* read-only mapping of the whole file; NULL when borrowed or empty */
    size_t map_len;
    char *names;    /* arena of this file's tensor names */
};

struct mmrt_safetensors {
    struct st_shard *shards;
    size_t n_shards;
    struct mmrt_st_tensor *tensors; /* [n_tensors], sorted by name once open succeeds */
    size_t n_tensors;
};

/* One weight_map entry of an index; strings are borrowed from the index's JSON. */
struct st_index_entry {
    const char *tensor;
    const char *file;
    size_t shard;
};

/* The dtypes mmrt reads: the float ones, and the integer codes of quantized matrices
 * (docs/QUANTIZATION.md): I8 codes, U8 bytes of two 4-bit codes each (mmrt's U4), and AWQ's
 * int32 words of eight 4-bit codes. */
static const struct {
    const char *name;
    int32_t dtype;
} supported_dtypes[] = {
    { "F32", MMRT_DTYPE_F32 }, { "F16", MMRT_DTYPE_F16 }, { "BF16", MMRT_DTYPE_BF16 },
    { "I8", MMRT_DTYPE_I8 },   { "U8", MMRT_DTYPE_U4 },   { "I32", MMRT_DTYPE_I32 },
    { "I64", MMRT_ST_DTYPE_I64 },
};

size_t mmrt_st_dtype_size(int32_t dtype)
{
    return dtype == MMRT_ST_DTYPE_I64 ? 8 : mmrt_dtype_size((enum mmrt_dtype)dtype);
}

static const char *const unsupported_dtypes[] = {
    "BOOL", "I16", "U16", "U32", "U64", "F64", "C64",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2",
};

static char *copy_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Writes s in double quotes into buf, escaping control bytes, quotes and backslashes and
 * truncating (on a UTF-8 boundary) so a hostile name keeps the message on one short line. */
static const char *quote(char buf[ST_QUOTE_MAX], const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 8 >= ST_QUOTE_MAX) {
            while (o > 1 && ((unsigned char)buf[o - 1] & 0xc0) == 0x80)
                o--;
            if (o > 1 && ((unsigned char)buf[o - 1] & 0x80))
                o--; /* drop the lead byte of the cut character too */
            memcpy(buf + o, "\"...", 5);
            return buf;
        }
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

/* jansson quotes the offending input in its messages ("near '…'"), raw; a hostile header
 * could put a newline or a terminal escape there. Messages are one line of text. */
static mmrt_status flatten_msg(struct mmrt_error *err, mmrt_status st)
{
    if (err)
        for (char *c = err->msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
    return st;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "value";
}

static mmrt_status resolve_limits(const char *what, const struct mmrt_st_limits *in,
                                  struct mmrt_st_limits *out, struct mmrt_error *err)
{
    struct mmrt_st_limits l = {0};
    if (in)
        l = *in;
    if (l.max_rank < 0 || l.max_rank > MMRT_ST_MAX_RANK)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: limits: max_rank %d is outside "
                              "1..%d", what, l.max_rank, MMRT_ST_MAX_RANK);
    if (!l.max_header_bytes)
        l.max_header_bytes = MMRT_ST_DEFAULT_MAX_HEADER_BYTES;
    if (!l.max_tensors)
        l.max_tensors = MMRT_ST_DEFAULT_MAX_TENSORS;
    if (!l.max_metadata_bytes)
        l.max_metadata_bytes = MMRT_ST_DEFAULT_MAX_METADATA_BYTES;
    if (!l.max_name_bytes)
        l.max_name_bytes = MMRT_ST_DEFAULT_MAX_NAME_BYTES;
    if (!l.max_rank)
        l.max_rank = MMRT_ST_MAX_RANK;
    *out = l;
    return MMRT_OK;
}

static mmrt_status check_name(const char *what, const char *name,
                              const struct mmrt_st_limits *lim, struct mmrt_error *err)
{
    char q[ST_QUOTE_MAX];
    size_t len = strlen(name);
    if (len == 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: a tensor name is empty", what);
    if (len > lim->max_name_bytes)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "%s: tensor %s: name is %zu bytes, more than the %u allowed", what,
                              quote(q, name), len, lim->max_name_bytes);
    return MMRT_OK;
}

static void format_shape(char *buf, size_t cap, const int64_t *shape, int n)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static mmrt_status parse_dtype(const char *what, const char *q, const json_t *v,
                               int32_t *dtype, struct mmrt_error *err)
{
    char qd[ST_QUOTE_MAX];
    if (!v)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: missing \"dtype\"", what, q);
    if (!json_is_string(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: tensor %s: \"dtype\" is a JSON %s, not a string", what, q,
                              json_type_name(v));
    const char *s = json_string_value(v);
    for (size_t i = 0; i < sizeof supported_dtypes / sizeof *supported_dtypes; i++)
        if (!strcmp(s, supported_dtypes[i].name)) {
            *dtype = supported_dtypes[i].dtype;
            return MMRT_OK;
        }
    for (size_t i = 0; i < sizeof unsupported_dtypes / sizeof *unsupported_dtypes; i++)
        if (!strcmp(s, unsupported_dtypes[i]))
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                  "%s: tensor %s: dtype %s is not supported (F32, F16, BF16, "
                                  "I8, U8, I32, I64)",
                                  what, q, s);
    return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: unknown dtype %s", what, q,
                          quote(qd, s));
}

/* Parses a JSON integer that must be >= 0 (jansson has already refused ones that do not
 * fit in long long; a JSON real such as 1.0 or 1e3 is a different type and refused). */
static mmrt_status get_count(const char *what, const char *q, const char *field, size_t i,
                             const json_t *v, uint64_t *out, struct mmrt_error *err)
{
    if (!json_is_integer(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: tensor %s: %s[%zu] is a JSON %s, not an integer", what, q,
                              field, i, json_type_name(v));
    long long x = json_integer_value(v);
    if (x < 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: %s[%zu] = %lld is negative",
                              what, q, field, i, x);
    *out = (uint64_t)x;
    return MMRT_OK;
}

/*
 * Validates one header entry (rules S3, S4) and fills *t. hdr_end is 8 + N (the file offset
 * of the data buffer), buf_size the buffer's size, base its first byte.
 */
static mmrt_status parse_entry(const char *what, const char *name, const json_t *v,
                               uint64_t hdr_end, uint64_t buf_size, const uint8_t *base,
                               const struct mmrt_st_limits *lim, struct mmrt_st_tensor *t,
                               struct mmrt_error *err)
{
    char q[ST_QUOTE_MAX], qk[ST_QUOTE_MAX], shp[200];
    quote(q, name);
    mmrt_status st;
    if (!json_is_object(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: entry is a JSON %s, not an "
                              "object", what, q, json_type_name(v));
    const char *key;
    json_t *member;
    json_object_foreach((json_t *)v, key, member) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: unknown member %s "
                                  "(expected dtype, shape, data_offsets)", what, q,
                                  quote(qk, key));
    }

    int32_t dtype = MMRT_DTYPE_F32; /* set by parse_dtype; silences -Wmaybe-uninitialized */
    st = parse_dtype(what, q, json_object_get(v, "dtype"), &dtype, err);
    if (st != MMRT_OK)
        return st;

    const json_t *shape = json_object_get(v, "shape");
    if (!shape)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: missing \"shape\"", what, q);
    if (!json_is_array(shape))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: \"shape\" is a JSON %s, not "
                              "an array", what, q, json_type_name(shape));
    size_t rank = json_array_size(shape);
    if (rank > (size_t)lim->max_rank)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: tensor %s: rank %zu is above the "
                              "limit of %d", what, q, rank, lim->max_rank);
    int64_t dims[MMRT_ST_MAX_RANK] = {0};
    uint64_t n_elements = 1;
    for (size_t i = 0; i < rank; i++) {
        uint64_t d;
        st = get_count(what, q, "shape", i, json_array_get(shape, i), &d, err);
        if (st != MMRT_OK)
            return st;
        dims[i] = (int64_t)d;
        /* Overflow at any step is refused, even if a later 0 would make the product 0:
         * that is what the reference does, and such a shape is nonsense either way. */
        if (__builtin_mul_overflow(n_elements, d, &n_elements)) {
            format_shape(shp, sizeof shp, dims, (int)i + 1);
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: element count of shape "
                                  "%s... overflows 64 bits", what, q, shp);
        }
    }
    format_shape(shp, sizeof shp, dims, (int)rank);
    uint64_t nbytes;
    if (__builtin_mul_overflow(n_elements, (uint64_t)mmrt_st_dtype_size(dtype), &nbytes))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: byte count of shape %s "
                              "(%llu elements) overflows 64 bits", what, q, shp,
                              (unsigned long long)n_elements);

    const json_t *off = json_object_get(v, "data_offsets");
    if (!off)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: missing \"data_offsets\"",
                              what, q);
    if (!json_is_array(off) || json_array_size(off) != 2)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: \"data_offsets\" must be an "
                              "array of two integers [begin, end]", what, q);
    uint64_t begin, end;
    st = get_count(what, q, "data_offsets", 0, json_array_get(off, 0), &begin, err);
    if (st != MMRT_OK)
        return st;
    st = get_count(what, q, "data_offsets", 1, json_array_get(off, 1), &end, err);
    if (st != MMRT_OK)
        return st;
    if (begin > end)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] "
                              "begin after end", what, q, (unsigned long long)begin,
                              (unsigned long long)end);
    if (end > buf_size)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] "
                              "end past the %llu-byte data buffer (file byte %llu > file size "
                              "%llu)", what, q, (unsigned long long)begin,
                              (unsigned long long)end, (unsigned long long)buf_size,
                              (unsigned long long)(hdr_end + end),
                              (unsigned long long)(hdr_end + buf_size));
    if (end - begin != nbytes)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] "
                              "span %llu bytes but shape %s of %s needs %llu (file byte %llu)",
                              what, q, (unsigned long long)begin, (unsigned long long)end,
                              (unsigned long long)(end - begin), shp,
                              json_string_value(json_object_get(v, "dtype")),
                              (unsigned long long)nbytes, (unsigned long long)(hdr_end + begin));

    t->dtype = dtype;
    t->n_dims = (int32_t)rank;
    memcpy(t->shape, dims, sizeof dims);
    t->n_elements = n_elements;
    t->nbytes = nbytes;
    t->data = base + begin;
    t->file_offset = hdr_end + begin;
    return MMRT_OK;
}

static int cmp_by_offset(const void *pa, const void *pb)
{
    const struct mmrt_st_tensor *a = pa, *b = pb;
    if (a->file_offset != b->file_offset)
        return a->file_offset < b->file_offset ? -1 : 1;
    if (a->nbytes != b->nbytes)
        return a->nbytes < b->nbytes ? -1 : 1;
    return strcmp(a->name, b->name);
}

static int cmp_by_name(const void *pa, const void *pb)
{
    const struct mmrt_st_tensor *a = pa, *b = pb;
    return strcmp(a->name, b->name);
}

/* S5: tensors [n] of one file, any order; sorts them by offset and checks the tiling. */
static mmrt_status check_tiling(const char *what, struct mmrt_st_tensor *t, size_t n,
                                uint64_t hdr_end, uint64_t buf_size, struct mmrt_error *err)
{
    char q[ST_QUOTE_MAX], qp[ST_QUOTE_MAX];
    if (n > 1)
        qsort(t, n, sizeof *t, cmp_by_offset);
    uint64_t expect = 0; /* buffer offset where the next range must begin */
    for (size_t i = 0; i < n; i++) {
        uint64_t begin = t[i].file_offset - hdr_end;
        if (begin > expect)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: data begins at buffer "
                                  "byte %llu (file byte %llu), leaving a %llu-byte gap after %s",
                                  what, quote(q, t[i].name), (unsigned long long)begin,
                                  (unsigned long long)t[i].file_offset,
                                  (unsigned long long)(begin - expect),
                                  i ? quote(qp, t[i - 1].name) : "the start of the buffer");
        if (begin < expect)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: tensor %s: data [%llu, %llu) "
                                  "overlaps tensor %s, which ends at buffer byte %llu (file "
                                  "byte %llu)", what, quote(q, t[i].name),
                                  (unsigned long long)begin,
                                  (unsigned long long)(begin + t[i].nbytes),
                                  quote(qp, t[i - 1].name), (unsigned long long)expect,
                                  (unsigned long long)(hdr_end + expect));
        expect = begin + t[i].nbytes;
    }
    if (expect != buf_size)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %llu trailing bytes at file bytes "
                              "[%llu, %llu) belong to no tensor", what,
                              (unsigned long long)(buf_size - expect),
                              (unsigned long long)(hdr_end + expect),
                              (unsigned long long)(hdr_end + buf_size));
    return MMRT_OK;
}

static mmrt_status check_metadata(const char *what, const json_t *meta,
                                  const struct mmrt_st_limits *lim, struct mmrt_error *err)
{
    char q[ST_QUOTE_MAX];
    if (!json_is_object(meta))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"__metadata__\" is a JSON %s, not an "
                              "object of strings", what, json_type_name(meta));
    uint64_t total = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)meta, key, v) {
        if (!json_is_string(v))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"__metadata__\" member %s is a "
                                  "JSON %s, not a string", what, quote(q, key),
                                  json_type_name(v));
        total += strlen(key) + json_string_length(v);
        if (total > lim->max_metadata_bytes)
            return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: \"__metadata__\" holds more than the "
                                  "%llu bytes allowed (at member %s)", what,
                                  (unsigned long long)lim->max_metadata_bytes, quote(q, key));
    }
    return MMRT_OK;
}

/*
 * Validates bytes[0, size) as one safetensors file (S1–S6) and appends its tensors to the
 * set, pointing them at shard sh. On failure the set may hold a grown array and sh an arena;
 * mmrt_safetensors_close() releases both, and n_tensors is unchanged.
 */
static mmrt_status parse_file(struct mmrt_safetensors *set, struct st_shard *sh,
                              const uint8_t *bytes, uint64_t size,
                              const struct mmrt_st_limits *lim, struct mmrt_error *err)
{
    const char *what = sh->path;
    mmrt_status st = MMRT_OK;
    json_t *root = NULL;
    char hwhat[ST_WHAT_MAX];

    if (size < 8)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: file is %llu bytes, shorter than the "
                              "8-byte header length", what, (unsigned long long)size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | bytes[i];
    if (n < 2)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: header length %llu at byte 0 is below "
                              "2 (the smallest header is {})", what, (unsigned long long)n);
    if (n > lim->max_header_bytes)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: header length %llu at byte 0 is above "
                              "the limit of %llu bytes", what, (unsigned long long)n,
                              (unsigned long long)lim->max_header_bytes);
    uint64_t hdr_end;
    if (__builtin_add_overflow(n, (uint64_t)8, &hdr_end) || hdr_end > size)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: header length %llu at byte 0 runs past "
                              "the end of the %llu-byte file", what, (unsigned long long)n,
                              (unsigned long long)size);
    uint64_t buf_size = size - hdr_end;
    const uint8_t *base = bytes + hdr_end;

    snprintf(hwhat, sizeof hwhat, "%s: header (file bytes 8..%llu)", what,
             (unsigned long long)hdr_end);
    /* The tensor limit, checked before the parse; "+ 1" leaves room for __metadata__, and
     * the exact count is checked again once the header is parsed. */
    /* Counted before parsing (json.h prescan): a header of millions of tiny entries is
     * refused by count before jansson allocates a value for each. */
    struct mmrt_json_prescan_result scan;
    mmrt_json_prescan((const char *)bytes + 8, (size_t)n, INT_MAX, &scan);
    uint64_t members = scan.top_members;
    if (members > lim->max_tensors - set->n_tensors + 1)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %llu entries (%zu before this file) "
                              "exceed the limit of %llu tensors (counted before parsing)",
                              hwhat, (unsigned long long)members, set->n_tensors,
                              (unsigned long long)lim->max_tensors);
    st = mmrt_json_parse((const char *)bytes + 8, (size_t)n, hwhat, ST_HEADER_DEPTH, &root,
                         err);
    if (st != MMRT_OK)
        return flatten_msg(err, st);
    if (!json_is_object(root)) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: header is a JSON %s, not an object",
                            what, json_type_name(root));
        goto out;
    }

    const json_t *meta = json_object_get(root, "__metadata__");
    if (meta) {
        st = check_metadata(what, meta, lim, err);
        if (st != MMRT_OK)
            goto out;
    }
    size_t n_new = json_object_size(root) - (meta ? 1 : 0);
    if (n_new > lim->max_tensors || set->n_tensors + n_new > lim->max_tensors) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %zu tensors (%zu before this file) exceed "
                            "the limit of %llu", what, n_new, set->n_tensors,
                            (unsigned long long)lim->max_tensors);
        goto out;
    }
    if (n_new == 0) {
        st = check_tiling(what, NULL, 0, hdr_end, buf_size, err);
        goto out;
    }

    /* First pass: names, and the size of this file's name arena. */
    size_t names_bytes = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (v == meta)
            continue;
        st = check_name(what, key, lim, err);
        if (st != MMRT_OK)
            goto out;
        names_bytes += strlen(key) + 1; /* bounded by N, cannot overflow */
    }
    size_t total = set->n_tensors + n_new, arr_bytes;
    if (__builtin_mul_overflow(total, sizeof *set->tensors, &arr_bytes)) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %zu tensors do not fit in memory", what,
                            total);
        goto out;
    }
    struct mmrt_st_tensor *grown = realloc(set->tensors, arr_bytes);
    if (!grown) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate %zu tensor records",
                            what, total);
        goto out;
    }
    set->tensors = grown;
    sh->names = malloc(names_bytes);
    if (!sh->names) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes of names",
                            what, names_bytes);
        goto out;
    }

    /* Second pass: each entry. */
    struct mmrt_st_tensor *t = set->tensors + set->n_tensors;
    size_t k = 0, name_off = 0;
    json_object_foreach(root, key, v) {
        if (v == meta)
            continue;
        memset(&t[k], 0, sizeof t[k]);
        size_t len = strlen(key) + 1;
        memcpy(sh->names + name_off, key, len);
        t[k].name = sh->names + name_off;
        t[k].file = sh->path;
        name_off += len;
        st = parse_entry(what, key, v, hdr_end, buf_size, base, lim, &t[k], err);
        if (st != MMRT_OK)
            goto out;
        k++;
    }
    st = check_tiling(what, t, n_new, hdr_end, buf_size, err);
    if (st == MMRT_OK)
        set->n_tensors += n_new;
out:
    json_decref(root);
    return st;
}

/* S8: opens path, refuses anything but a regular file, maps it read-only. The fd is closed
 * again at once; the mapping keeps the inode. An empty file is not mapped (mmap refuses
 * length 0) and left for parse_file to refuse by size. */
static mmrt_status map_file(struct st_shard *sh, const uint8_t **bytes, uint64_t *size,
                            struct mmrt_error *err)
{
    int fd = -1;
    struct stat sb;
    /* Never blocks (a FIFO named as a shard), names a directory, device or link loop. */
    mmrt_status st = mmrt_file_open(sh->path, 0, &fd, &sb, err);
    if (st != MMRT_OK)
        return st;
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %lld bytes cannot be mapped here",
                            sh->path, (long long)sb.st_size);
        goto out;
    }
    *size = (uint64_t)sb.st_size;
    *bytes = NULL;
    if (sb.st_size > 0) {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            st = mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot map %lld bytes: %s", sh->path,
                                (long long)sb.st_size, strerror(errno));
            goto out;
        }
        sh->map = m;
        sh->map_len = (size_t)sb.st_size;
        *bytes = m;
    }
out:
    close(fd);
    return st;
}

/* Sorts the set by name and refuses a name held twice (only possible across shards: jansson
 * refuses duplicate keys within one header). */
static mmrt_status sort_and_check_names(struct mmrt_safetensors *set, struct mmrt_error *err)
{
    char q[ST_QUOTE_MAX];
    if (set->n_tensors < 2)
        return MMRT_OK;
    qsort(set->tensors, set->n_tensors, sizeof *set->tensors, cmp_by_name);
    for (size_t i = 1; i < set->n_tensors; i++) {
        const struct mmrt_st_tensor *a = &set->tensors[i - 1], *b = &set->tensors[i];
        if (!strcmp(a->name, b->name))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "tensor %s is in both %s (file byte "
                                  "%llu) and %s (file byte %llu)", quote(q, a->name), a->file,
                                  (unsigned long long)a->file_offset, b->file,
                                  (unsigned long long)b->file_offset);
    }
    return MMRT_OK;
}

static mmrt_status open_single(const char *path, const struct mmrt_st_limits *lim,
                               struct mmrt_safetensors **out, struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    const uint8_t *bytes;
    uint64_t size;
    struct mmrt_safetensors *set = calloc(1, sizeof *set);
    if (!set)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a tensor set", path);
    set->shards = calloc(1, sizeof *set->shards);
    if (!set->shards || !(set->shards[0].path = copy_str(path))) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a tensor set", path);
        goto out;
    }
    set->n_shards = 1;
    st = map_file(&set->shards[0], &bytes, &size, err);
    if (st == MMRT_OK)
        st = parse_file(set, &set->shards[0], bytes, size, lim, err);
    if (st == MMRT_OK)
        st = sort_and_check_names(set, err);
out:
    if (st == MMRT_OK)
        *out = set;
    else
        mmrt_safetensors_close(set);
    return st;
}

static int cmp_entry_file(const void *pa, const void *pb)
{
    const struct st_index_entry *a = pa, *b = pb;
    return strcmp(a->file, b->file);
}

static int cmp_entry_tensor(const void *pa, const void *pb)
{
    const struct st_index_entry *a = pa, *b = pb;
    return strcmp(a->tensor, b->tensor);
}

/* S9: a shard's file name must stay in the index's directory. */
static mmrt_status check_shard_name(const char *index, const char *tensor, const json_t *v,
                                    struct mmrt_error *err)
{
    char q[ST_QUOTE_MAX], qf[ST_QUOTE_MAX];
    if (!json_is_string(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: weight_map[%s] is a JSON %s, not a "
                              "file name", index, quote(q, tensor), json_type_name(v));
    const char *f = json_string_value(v);
    size_t len = json_string_length(v);
    const char *why = NULL;
    if (len == 0)
        why = "is empty";
    else if (strlen(f) != len)
        why = "contains a NUL byte";
    else if (len > ST_MAX_FILE_NAME)
        why = "is longer than 255 bytes";
    else if (strchr(f, '/') || strchr(f, '\\'))
        why = "contains a path separator";
    else if (!strcmp(f, ".") || !strcmp(f, ".."))
        why = "names a directory";
    if (why)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: weight_map[%s] = %s %s; shards must be "
                              "plain file names next to the index", index, quote(q, tensor),
                              quote(qf, f), why);
    return MMRT_OK;
}

static mmrt_status open_index(const char *index, const struct mmrt_st_limits *lim,
                              struct mmrt_safetensors **out, struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    json_t *root = NULL;
    struct st_index_entry *e = NULL;
    struct mmrt_safetensors *set = NULL;
    char q[ST_QUOTE_MAX];

    if (lim->max_header_bytes > SIZE_MAX)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: max_header_bytes too large", index);
    st = mmrt_json_load_file(index, (size_t)lim->max_header_bytes, ST_INDEX_DEPTH, &root, err);
    if (st != MMRT_OK)
        return flatten_msg(err, st);
    if (!json_is_object(root)) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: index is a JSON %s, not an object", index,
                            json_type_name(root));
        goto out;
    }
    const json_t *meta = json_object_get(root, "metadata");
    if (meta && !json_is_object(meta)) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"metadata\" is a JSON %s, not an object",
                            index, json_type_name(meta));
        goto out;
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!wm) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: missing \"weight_map\"", index);
        goto out;
    }
    if (!json_is_object(wm)) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"weight_map\" is a JSON %s, not an "
                            "object of tensor name -> file", index, json_type_name(wm));
        goto out;
    }
    size_t n = json_object_size(wm);
    if (n > lim->max_tensors) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: weight_map lists %zu tensors, more than "
                            "the limit of %llu", index, n,
                            (unsigned long long)lim->max_tensors);
        goto out;
    }
    set = calloc(1, sizeof *set);
    if (!set) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a tensor set", index);
        goto out;
    }
    if (n > 0) {
        e = calloc(n, sizeof *e);
        if (!e) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate %zu index entries",
                                index, n);
            goto out;
        }
    }
    size_t k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        st = check_name(index, key, lim, err);
        if (st == MMRT_OK)
            st = check_shard_name(index, key, v, err);
        if (st != MMRT_OK)
            goto out;
        e[k].tensor = key;
        e[k].file = json_string_value(v);
        k++;
    }

    /* Distinct files, in name order: each becomes one shard, opened once. */
    size_t n_files = 0;
    if (n > 0)
        qsort(e, n, sizeof *e, cmp_entry_file);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(e[i].file, e[i - 1].file))
            n_files++;
        e[i].shard = n_files - 1;
    }
    if (n_files > 0) {
        set->shards = calloc(n_files, sizeof *set->shards);
        if (!set->shards) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate %zu shards", index,
                                n_files);
            goto out;
        }
    }
    const char *slash = strrchr(index, '/');
    size_t dir_len = slash ? (size_t)(slash - index) + 1 : 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && e[i].shard == e[i - 1].shard)
            continue;
        struct st_shard *sh = &set->shards[e[i].shard];
        size_t flen = strlen(e[i].file);
        sh->path = malloc(dir_len + flen + 1);
        if (!sh->path) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a path", index);
            goto out;
        }
        set->n_shards++;
        memcpy(sh->path, index, dir_len);
        memcpy(sh->path + dir_len, e[i].file, flen + 1);
        const uint8_t *bytes;
        uint64_t size;
        st = map_file(sh, &bytes, &size, err);
        if (st == MMRT_OK)
            st = parse_file(set, sh, bytes, size, lim, err);
        if (st != MMRT_OK) {
            mmrt_error_prefix(err, st, "%s: shard of tensor %s", index, quote(q, e[i].tensor));
            goto out;
        }
    }
    st = sort_and_check_names(set, err);
    if (st != MMRT_OK) {
        mmrt_error_prefix(err, st, "%s", index);
        goto out;
    }

    /* Both lists sorted by name; walk them together so each disagreement names both sides. */
    if (n > 0)
        qsort(e, n, sizeof *e, cmp_entry_tensor);
    size_t i = 0, j = 0;
    while (i < set->n_tensors || j < n) {
        const struct mmrt_st_tensor *t = i < set->n_tensors ? &set->tensors[i] : NULL;
        int c = !t ? 1 : j == n ? -1 : strcmp(t->name, e[j].tensor);
        if (c < 0) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: does not list tensor %s, which shard "
                                "%s holds at file byte %llu", index, quote(q, t->name), t->file,
                                (unsigned long long)t->file_offset);
            goto out;
        }
        const char *want = set->shards[e[j].shard].path;
        if (c > 0) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: maps tensor %s to %s, which has no "
                                "such tensor", index, quote(q, e[j].tensor), want);
            goto out;
        }
        if (t->file != want) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: maps tensor %s to %s, but it is in %s "
                                "(file byte %llu)", index, quote(q, t->name), want, t->file,
                                (unsigned long long)t->file_offset);
            goto out;
        }
        i++;
        j++;
    }
out:
    free(e);
    json_decref(root);
    if (st == MMRT_OK)
        *out = set;
    else
        mmrt_safetensors_close(set);
    return st;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

mmrt_status mmrt_safetensors_open(const char *path, const struct mmrt_st_limits *limits,
                                  struct mmrt_safetensors **out, struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    char *single = NULL, *index = NULL;
    struct mmrt_st_limits lim;
    struct stat sb;
    if (!path || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "safetensors: path and out are "
                              "required");
    st = resolve_limits(path, limits, &lim, err);
    if (st != MMRT_OK)
        return st;
    bool is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    int e = errno;
    if (!is_dir && !mmrt_file_exists(path))
        return mmrt_error_set(err, e == ENOENT ? MMRT_ERR_NOT_FOUND : MMRT_ERR_IO,
                              "%s: %s", path, strerror(e));
    /* A dangling or looping link fails stat but exists: open_single names it. */
    if (!is_dir) {
        if (ends_with(path, ".json"))
            return open_index(path, &lim, out, err);
        return open_single(path, &lim, out, err);
    }

    size_t len = strlen(path);
    single = malloc(len + sizeof "/model.safetensors");
    index = malloc(len + sizeof "/model.safetensors.index.json");
    if (!single || !index) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a path", path);
        goto out;
    }
    snprintf(single, len + sizeof "/model.safetensors", "%s/model.safetensors", path);
    snprintf(index, len + sizeof "/model.safetensors.index.json",
             "%s/model.safetensors.index.json", path);
    /* Whatever is at the name is the checkpoint: a directory, FIFO, device or link loop
     * called model.safetensors is refused as such by map_file, not skipped as if absent. */
    if (mmrt_file_exists(single))
        st = open_single(single, &lim, out, err);
    else if (mmrt_file_exists(index))
        st = open_index(index, &lim, out, err);
    else
        st = mmrt_error_set(err, MMRT_ERR_NOT_FOUND, "%s: checkpoint directory has neither "
                            "model.safetensors nor model.safetensors.index.json", path);
out:
    free(single);
    free(index);
    return st;
}

mmrt_status mmrt_safetensors_parse_header(const uint8_t *bytes, uint64_t size,
                                          const char *what,
                                          const struct mmrt_st_limits *limits,
                                          struct mmrt_safetensors **out,
                                          struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    struct mmrt_st_limits lim;
    if (!what)
        what = "<memory>";
    if ((!bytes && size) || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: bytes and out are required", what);
    st = resolve_limits(what, limits, &lim, err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_safetensors *set = calloc(1, sizeof *set);
    if (!set)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a tensor set", what);
    set->shards = calloc(1, sizeof *set->shards);
    if (!set->shards || !(set->shards[0].path = copy_str(what))) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: cannot allocate a tensor set", what);
        goto out;
    }
    set->n_shards = 1;
    st = parse_file(set, &set->shards[0], bytes, size, &lim, err);
    if (st == MMRT_OK)
        st = sort_and_check_names(set, err);
out:
    if (st == MMRT_OK)
        *out = set;
    else
        mmrt_safetensors_close(set);
    return st;
}

void mmrt_safetensors_close(struct mmrt_safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map)
            munmap(st->shards[i].map, st->shards[i].map_len);
        free(st->shards[i].names);
        free(st->shards[i].path);
    }
    free(st->shards);
    free(st->tensors);
    free(st);
}

size_t mmrt_safetensors_count(const struct mmrt_safetensors *st)
{
    return st ? st->n_tensors : 0;
}

const struct mmrt_st_tensor *mmrt_safetensors_at(const struct mmrt_safetensors *st, size_t i)
{
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const struct mmrt_st_tensor *mmrt_safetensors_find(const struct mmrt_safetensors *st,
                                                   const char *name)
{
    if (!st || !name || st->n_tensors == 0)
        return NULL;
    struct mmrt_st_tensor key = {.name = name};
    return bsearch(&key, st->tensors, st->n_tensors, sizeof key, cmp_by_name);
}

mmrt_status mmrt_safetensors_read_f32(const struct mmrt_st_tensor *t, float *dst, size_t n,
                                      struct mmrt_error *err)
{
    if (!t || (!dst && n))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "safetensors read: tensor and dst are "
                              "required");
    char q[ST_QUOTE_MAX];
    if ((uint64_t)n != t->n_elements)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: tensor %s has %llu elements, the "
                              "destination %zu", t->file, quote(q, t->name),
                              (unsigned long long)t->n_elements, n);
    return mmrt_safetensors_read_f32_range(t, 0, dst, n, err);
}

mmrt_status mmrt_safetensors_read_f32_range(const struct mmrt_st_tensor *t, uint64_t first,
                                            float *dst, size_t n, struct mmrt_error *err)
{
    if (!t || (!dst && n))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "safetensors read: tensor and dst are "
                              "required");
    char q[ST_QUOTE_MAX];
    if (first > t->n_elements || (uint64_t)n > t->n_elements - first)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: tensor %s has %llu elements, not "
                              "[%llu, %llu + %zu)", t->file, quote(q, t->name),
                              (unsigned long long)t->n_elements, (unsigned long long)first,
                              (unsigned long long)first, n);
    /* Bytewise little-endian loads: the data has no alignment (S7) and this works on any
     * host byte order. */
    const uint8_t *p = (const uint8_t *)t->data + first * mmrt_st_dtype_size(t->dtype);
    switch (t->dtype) {
    case MMRT_DTYPE_F32:
        for (size_t i = 0; i < n; i++, p += 4) {
            uint32_t b = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                         (uint32_t)p[3] << 24;
            memcpy(&dst[i], &b, sizeof b);
        }
        return MMRT_OK;
    case MMRT_DTYPE_F16:
        for (size_t i = 0; i < n; i++, p += 2)
            dst[i] = mmrt_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return MMRT_OK;
    case MMRT_DTYPE_BF16:
        for (size_t i = 0; i < n; i++, p += 2) {
            uint32_t b = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
            memcpy(&dst[i], &b, sizeof b);
        }
        return MMRT_OK;
    default:
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: tensor %s has dtype %d, not F32, "
                              "F16 or BF16", t->file, quote(q, t->name), (int)t->dtype);
    }
}

int mmrt_safetensors_mapping(const struct mmrt_safetensors *st, const struct mmrt_st_tensor *t,
                             const void **base, uint64_t *size)
{
    if (!st || !t)
        return 0;
    /* tensors of one shard share its path pointer (see struct mmrt_st_tensor.file) */
    for (size_t i = 0; i < st->n_shards; i++) {
        const struct st_shard *sh = &st->shards[i];
        if (sh->path == t->file && sh->map) {
            *base = sh->map;
            *size = sh->map_len;
            return 1;
        }
    }
    return 0;
}
