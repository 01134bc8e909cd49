/*
 * tests/test_safetensors.c — core/formats/safetensors.c against valid files (hand-built and
 * written by the Python reference writer, tests/fixtures/safetensors/) and against one
 * hostile file per rule S1–S9 of /work/shared/specs/untrusted-input.md.
 *
 * Every hostile case runs twice: as a file through mmrt_safetensors_open() and as bytes
 * through mmrt_safetensors_parse_header(); both must give the same status, a one-line
 * message naming the file and the expected detail, and leave *out untouched. Headers are
 * written with ' for " to keep them readable; build() swaps them back.
 *
 * Linked with --wrap for the allocators (alloc_fail.c) and for mmap (counted here, so the
 * "each shard is mapped once" rule and the mmap failure path are observable).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc_fail.h"
#include "formats/safetensors.h"

/* ---- mmap wrapper ---- */

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
static int g_mmap_calls;
static bool g_mmap_fail;

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    g_mmap_calls++;
    if (g_mmap_fail) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

/* ---- scratch directory and file builders ---- */

/* snprintf that fails the test instead of truncating (and keeps -Wformat-truncation quiet). */
__attribute__((format(printf, 3, 4))) static int fmt(char *buf, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap)
        fail_msg("fmt: %d bytes do not fit in %zu", n, cap);
    return n;
}

static char g_dir[64];
static uint8_t g_buf[1 << 16];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int setup_dir(void **state)
{
    (void)state;
    fmt(g_dir, sizeof g_dir, "/tmp/mmrt-st-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    return nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *tmp_path(const char *name)
{
    static char p[256];
    fmt(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* header (with ' for ") padded by `lead`/`trail` spaces, then data_len pattern bytes, after
 * the real header length. Returns the file size. */
static size_t build_ex(const char *header, size_t lead, size_t trail, size_t data_len)
{
    size_t h = strlen(header), n = lead + h + trail;
    assert_true(8 + n + data_len <= sizeof g_buf);
    put_le64(g_buf, n);
    memset(g_buf + 8, ' ', n);
    for (size_t i = 0; i < h; i++)
        g_buf[8 + lead + i] = header[i] == '\'' ? '"' : (uint8_t)header[i];
    for (size_t i = 0; i < data_len; i++)
        g_buf[8 + n + i] = (uint8_t)(i * 7 + 1);
    return 8 + n + data_len;
}

static size_t build(const char *header, size_t data_len)
{
    return build_ex(header, 0, 0, data_len);
}

/* The same with a length field that lies: n instead of the header's real length. */
static size_t build_n(const char *header, size_t data_len, uint64_t n)
{
    size_t len = build(header, data_len);
    put_le64(g_buf, n);
    return len;
}

/* Writes header+data as DIR/name (for shards). */
static void write_st(const char *name, const char *header, size_t data_len)
{
    size_t n = build(header, data_len);
    write_bytes(tmp_path(name), g_buf, n);
}

static void write_text(const char *name, const char *text)
{
    char *s = strdup(text);
    for (char *c = s; *c; c++)
        if (*c == '\'')
            *c = '"';
    write_bytes(tmp_path(name), s, strlen(s));
    free(s);
}

/* ---- checking refusals ---- */

static struct mmrt_safetensors *const SENTINEL = (struct mmrt_safetensors *)&g_buf;

static void check_err(const char *label, const char *via, mmrt_status got,
                      const struct mmrt_error *err, struct mmrt_safetensors *out,
                      mmrt_status want, const char *substr, const char *file)
{
    if (got != want || !strstr(err->msg, substr) || !strstr(err->msg, file) ||
        strchr(err->msg, '\n') || out != SENTINEL || err->status != want)
        fail_msg("case %s via %s: want %s containing '%s' and '%s'; got %s '%s'%s", label, via,
                 mmrt_status_name(want), substr, file, mmrt_status_name(got), err->msg,
                 out != SENTINEL ? " (and *out was written)" : "");
}

/* g_buf[0, len) must be refused with `want` and a message containing substr, both as a
 * file and in memory. */
static void refuse_lim(const char *label, size_t len, const struct mmrt_st_limits *lim,
                       mmrt_status want, const char *substr)
{
    const char *path = tmp_path("case.safetensors");
    write_bytes(path, g_buf, len);
    struct mmrt_safetensors *out = SENTINEL;
    struct mmrt_error err = {0};
    mmrt_status st = mmrt_safetensors_open(path, lim, &out, &err);
    check_err(label, "open", st, &err, out, want, substr, path);
    out = SENTINEL;
    memset(&err, 0, sizeof err);
    st = mmrt_safetensors_parse_header(g_buf, len, "mem.safetensors", lim, &out, &err);
    check_err(label, "memory", st, &err, out, want, substr, "mem.safetensors");
}

static void refuse(const char *label, size_t len, mmrt_status want, const char *substr)
{
    refuse_lim(label, len, NULL, want, substr);
}

struct bad_header {
    const char *label;
    const char *header;
    size_t data_len;
    mmrt_status want;
    const char *substr;
};

static void refuse_all(const struct bad_header *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        refuse(c[i].label, build(c[i].header, c[i].data_len), c[i].want, c[i].substr);
}

#define ARRAY_LEN(a) (sizeof(a) / sizeof *(a))

static struct mmrt_safetensors *open_ok(const char *path, const struct mmrt_st_limits *lim)
{
    struct mmrt_safetensors *st = NULL;
    struct mmrt_error err = {0};
    mmrt_status s = mmrt_safetensors_open(path, lim, &st, &err);
    if (s != MMRT_OK)
        fail_msg("open %s: %s %s", path, mmrt_status_name(s), err.msg);
    return st;
}

static struct mmrt_safetensors *parse_ok(size_t len, const struct mmrt_st_limits *lim)
{
    struct mmrt_safetensors *st = NULL;
    struct mmrt_error err = {0};
    mmrt_status s = mmrt_safetensors_parse_header(g_buf, len, "mem", lim, &st, &err);
    if (s != MMRT_OK)
        fail_msg("parse: %s %s", mmrt_status_name(s), err.msg);
    return st;
}

static uint32_t f32_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* Reads tensor `name` as f32 and compares bit patterns (so NaN payloads and -0 count). */
static void expect_bits(const struct mmrt_safetensors *st, const char *name,
                        const uint32_t *want, size_t n)
{
    const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, name);
    if (!t)
        fail_msg("tensor %s not found", name);
    assert_int_equal(t->n_elements, n);
    float got[64];
    struct mmrt_error err = {0};
    assert_true(n <= 64);
    assert_int_equal(mmrt_safetensors_read_f32(t, got, n, &err), MMRT_OK);
    for (size_t i = 0; i < n; i++)
        if (f32_bits(got[i]) != want[i])
            fail_msg("%s[%zu]: got 0x%08x (%g), want 0x%08x", name, i, f32_bits(got[i]),
                     (double)got[i], want[i]);
}

static void expect_values(const struct mmrt_safetensors *st, const char *name,
                          const float *want, size_t n)
{
    uint32_t bits[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        bits[i] = f32_bits(want[i]);
    expect_bits(st, name, bits, n);
}

static void expect_shape(const struct mmrt_st_tensor *t, int32_t dtype, int n_dims, ...)
{
    assert_non_null(t);
    assert_int_equal(t->dtype, dtype);
    assert_int_equal(t->n_dims, n_dims);
    va_list ap;
    va_start(ap, n_dims);
    uint64_t elems = 1;
    for (int i = 0; i < MMRT_ST_MAX_RANK; i++) {
        int64_t d = i < n_dims ? va_arg(ap, int) : 0;
        assert_int_equal(t->shape[i], d);
        if (i < n_dims)
            elems *= (uint64_t)d;
    }
    va_end(ap);
    assert_int_equal(t->n_elements, elems);
    assert_int_equal(t->nbytes, elems * mmrt_dtype_size(t->dtype));
}

/* ---- valid files ---- */

/* F16 patterns and their exact f32 widening (see tools/make_safetensors_fixtures.py). */
static const uint16_t F16_IN[12] = {0x0000, 0x8000, 0x3C00, 0xC000, 0x7BFF, 0x0400,
                                    0x0001, 0x03FF, 0x7C00, 0xFC00, 0x7E00, 0x7D01};
static const uint32_t F16_OUT[12] = {
    0x00000000, 0x80000000, 0x3F800000, 0xC0000000, 0x477FE000, /* 65504 */
    0x38800000,                                                  /* 2^-14, min normal */
    0x33800000,                                                  /* 2^-24, min subnormal */
    0x387FC000,                                                  /* 1023 * 2^-24 */
    0x7F800000, 0xFF800000, 0x7FC00000, 0x7FA02000};             /* ±inf, NaNs */
static const uint16_t BF16_IN[8] = {0x3F80, 0x8000, 0x0001, 0x4049,
                                    0x7F80, 0xFF80, 0xFFC1, 0x7F7F};

static void put_u16s(uint8_t *p, const uint16_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[2 * i] = (uint8_t)v[i];
        p[2 * i + 1] = (uint8_t)(v[i] >> 8);
    }
}

static void put_f32s(uint8_t *p, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b = f32_bits(v[i]);
        for (int k = 0; k < 4; k++)
            p[4 * i + k] = (uint8_t)(b >> (8 * k));
    }
}

/*
 * One file with every shape of valid input: a scalar, ranks 1–4, F32/F16/BF16, two
 * zero-size tensors sharing an offset with each other and with the next tensor, entries
 * not in offset order, __metadata__, whitespace before and after the JSON, and a header
 * length chosen so the data buffer starts at an odd address (nothing is aligned).
 */
static const char VALID_HEADER[] =
    "{'r4':{'dtype':'F32','shape':[1,2,1,2],'data_offsets':[60,76]},"
    "'__metadata__':{'format':'pt','note':'caf\\u00e9'},"
    "'scalar':{'dtype':'F32','shape':[],'data_offsets':[0,4]},"
    "'half':{'dtype':'F16','shape':[12],'data_offsets':[4,28]},"
    "'empty':{'dtype':'F32','shape':[0,3],'data_offsets':[28,28]},"
    "'empty2':{'dtype':'BF16','shape':[4,0],'data_offsets':[28,28]},"
    "'bf':{'dtype':'BF16','shape':[2,4],'data_offsets':[28,44]},"
    "'r3':{'dtype':'F32','shape':[2,1,2],'data_offsets':[44,60]}}";

static size_t build_valid(void)
{
    /* 3 spaces before, enough after that 8 + N is odd. */
    size_t trail = 1;
    while ((8 + 3 + strlen(VALID_HEADER) + trail) % 2 == 0)
        trail++;
    size_t len = build_ex(VALID_HEADER, 3, trail, 76);
    uint8_t *d = g_buf + len - 76;
    const float scalar = 3.5f, r3[4] = {1, -2, 0.25f, 1e-30f}, r4[4] = {-1, 2, -3, 4e30f};
    put_f32s(d + 0, &scalar, 1);
    put_u16s(d + 4, F16_IN, 12);
    put_u16s(d + 28, BF16_IN, 8);
    put_f32s(d + 44, r3, 4);
    put_f32s(d + 60, r4, 4);
    return len;
}

static void check_valid_set(const struct mmrt_safetensors *st, const uint8_t *file_bytes,
                            size_t len, const char *file)
{
    static const char *const names[] = {"bf", "empty", "empty2", "half", "r3", "r4",
                                        "scalar"};
    assert_int_equal(mmrt_safetensors_count(st), ARRAY_LEN(names));
    uint64_t hdr_end = len - 76;
    assert_int_equal(hdr_end % 2, 1);
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        const struct mmrt_st_tensor *t = mmrt_safetensors_at(st, i);
        assert_non_null(t);
        assert_string_equal(t->name, names[i]); /* at() is in name order */
        assert_ptr_equal(mmrt_safetensors_find(st, names[i]), t);
        assert_string_equal(t->file, file);
        /* data really is the bytes at file_offset */
        assert_true(t->file_offset >= hdr_end && t->file_offset + t->nbytes <= len);
        assert_memory_equal(t->data, file_bytes + t->file_offset, t->nbytes);
    }
    assert_null(mmrt_safetensors_at(st, ARRAY_LEN(names)));
    assert_null(mmrt_safetensors_find(st, "nope"));
    assert_null(mmrt_safetensors_find(st, ""));
    assert_null(mmrt_safetensors_find(st, "__metadata__"));

    const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, "scalar");
    expect_shape(t, MMRT_DTYPE_F32, 0);
    assert_int_equal(t->file_offset, hdr_end + 0);
    expect_shape(mmrt_safetensors_find(st, "half"), MMRT_DTYPE_F16, 1, 12);
    expect_shape(mmrt_safetensors_find(st, "empty"), MMRT_DTYPE_F32, 2, 0, 3);
    expect_shape(mmrt_safetensors_find(st, "empty2"), MMRT_DTYPE_BF16, 2, 4, 0);
    expect_shape(mmrt_safetensors_find(st, "bf"), MMRT_DTYPE_BF16, 2, 2, 4);
    expect_shape(mmrt_safetensors_find(st, "r3"), MMRT_DTYPE_F32, 3, 2, 1, 2);
    expect_shape(mmrt_safetensors_find(st, "r4"), MMRT_DTYPE_F32, 4, 1, 2, 1, 2);
    assert_int_equal(mmrt_safetensors_find(st, "r4")->file_offset, hdr_end + 60);
    assert_int_equal(mmrt_safetensors_find(st, "empty2")->file_offset, hdr_end + 28);

    /* S7: the data of 4-byte tensors is genuinely misaligned here, and reading it is fine
     * under UBSan's alignment check because nothing casts it. */
    assert_int_not_equal((uintptr_t)mmrt_safetensors_find(st, "r3")->data % 4, 0);

    const float scalar = 3.5f, r3[4] = {1, -2, 0.25f, 1e-30f}, r4[4] = {-1, 2, -3, 4e30f};
    expect_values(st, "scalar", &scalar, 1);
    expect_values(st, "r3", r3, 4);
    expect_values(st, "r4", r4, 4);
    expect_bits(st, "half", F16_OUT, 12);
    uint32_t bf_out[8];
    for (int i = 0; i < 8; i++)
        bf_out[i] = (uint32_t)BF16_IN[i] << 16;
    expect_bits(st, "bf", bf_out, 8);
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_safetensors_read_f32(mmrt_safetensors_find(st, "empty"), NULL, 0,
                                               &err), MMRT_OK);
}

static void test_valid_single_file(void **state)
{
    (void)state;
    size_t len = build_valid();
    const char *path = tmp_path("valid.safetensors");
    write_bytes(path, g_buf, len);
    char p[256];
    fmt(p, sizeof p, "%s", path);
    struct mmrt_safetensors *st = open_ok(p, NULL);
    check_valid_set(st, g_buf, len, p);
    mmrt_safetensors_close(st);

    st = parse_ok(len, NULL);
    check_valid_set(st, g_buf, len, "mem");
    /* In memory, data points into the caller's bytes. */
    const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, "half");
    assert_ptr_equal(t->data, g_buf + t->file_offset);
    mmrt_safetensors_close(st);
}

static void test_valid_edge_files(void **state)
{
    (void)state;
    struct mmrt_safetensors *st;
    /* The smallest file: "{}" and no data. */
    st = parse_ok(build("{}", 0), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 0);
    assert_null(mmrt_safetensors_at(st, 0));
    assert_null(mmrt_safetensors_find(st, "a"));
    mmrt_safetensors_close(st);
    /* Only metadata, padded the way the Rust writer pads "{}" (to 8 bytes). */
    st = parse_ok(build_ex("{'__metadata__':{}}", 0, 5, 0), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 0);
    mmrt_safetensors_close(st);
    /* S2: JSON whitespace of every kind on both sides. */
    st = parse_ok(build(" \t\r\n{'a':{'dtype':'F16','shape':[1],'data_offsets':[0,2]}}\n\t ",
                        2), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 1);
    mmrt_safetensors_close(st);
    /* Only zero-size tensors: all at offset 0 of an empty buffer. */
    st = parse_ok(build("{'a':{'dtype':'F32','shape':[0],'data_offsets':[0,0]},"
                        "'b':{'dtype':'F16','shape':[3,0,2],'data_offsets':[0,0]}}", 0), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 2);
    assert_int_equal(mmrt_safetensors_at(st, 1)->nbytes, 0);
    assert_non_null(mmrt_safetensors_at(st, 1)->data);
    mmrt_safetensors_close(st);
    /* Zero-size tensors at the very end and at the start. */
    st = parse_ok(build("{'z':{'dtype':'F32','shape':[0],'data_offsets':[4,4]},"
                        "'y':{'dtype':'F32','shape':[0],'data_offsets':[0,0]},"
                        "'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 4), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 3);
    mmrt_safetensors_close(st);
    /* Rank 8 is the default cap, and a zero dim after huge ones that do not overflow. */
    st = parse_ok(build("{'a':{'dtype':'F32','shape':[1,1,1,1,1,1,1,2],'data_offsets':[0,8]},"
                        "'b':{'dtype':'F32','shape':[4294967295,0],'data_offsets':[8,8]}}", 8),
                  NULL);
    expect_shape(mmrt_safetensors_find(st, "a"), MMRT_DTYPE_F32, 8, 1, 1, 1, 1, 1, 1, 1, 2);
    assert_int_equal(mmrt_safetensors_find(st, "b")->shape[0], 4294967295ll);
    mmrt_safetensors_close(st);
    /* Names are arbitrary UTF-8; control characters are allowed (and escaped in messages). */
    st = parse_ok(build("{'a\\nb \\u00e9\\u4e2d':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}",
                        4), NULL);
    assert_non_null(mmrt_safetensors_find(st, "a\nb \xc3\xa9\xe4\xb8\xad"));
    mmrt_safetensors_close(st);
}

static void test_read_f32_args(void **state)
{
    (void)state;
    struct mmrt_safetensors *st =
        parse_ok(build("{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 8), NULL);
    const struct mmrt_st_tensor *t = mmrt_safetensors_at(st, 0);
    float dst[3] = {7, 7, 7};
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_safetensors_read_f32(t, dst, 3, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "has 2 elements, the destination 3"));
    assert_true(dst[0] == 7 && dst[2] == 7); /* nothing written on failure */
    assert_int_equal(mmrt_safetensors_read_f32(t, dst, 1, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_safetensors_read_f32(t, NULL, 2, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_safetensors_read_f32(NULL, dst, 2, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_safetensors_read_f32(t, dst, 2, NULL), MMRT_OK);
    mmrt_safetensors_close(st);
    mmrt_safetensors_close(NULL);
    assert_int_equal(mmrt_safetensors_count(NULL), 0);
    assert_null(mmrt_safetensors_at(NULL, 0));
    assert_null(mmrt_safetensors_find(NULL, "a"));
}

/* ---- S1: the header length ---- */

static void test_s1_header_length(void **state)
{
    (void)state;
    char label[32];
    /* Files shorter than the length field, 0..7 bytes. */
    memset(g_buf, 0, 8);
    for (size_t n = 0; n < 8; n++) {
        fmt(label, sizeof label, "%zu-byte file", n);
        refuse(label, n, MMRT_ERR_FORMAT, "shorter than the 8-byte header length");
    }
    refuse("N = 0", build_n("{}", 0, 0), MMRT_ERR_FORMAT, "header length 0 at byte 0");
    refuse("N = 1", build_n("{}", 0, 1), MMRT_ERR_FORMAT, "header length 1 at byte 0");
    refuse("N past end", build_n("{}", 0, 3), MMRT_ERR_FORMAT,
           "header length 3 at byte 0 runs past the end of the 10-byte file");
    refuse("N past data", build_n("{}", 5, 8), MMRT_ERR_FORMAT,
           "header length 8 at byte 0 runs past the end of the 15-byte file");
    /* Above the cap: refused by the cap before anything else, even if the file is tiny. */
    refuse("N = 100 MB + 1", build_n("{}", 0, 100000001), MMRT_ERR_LIMIT,
           "header length 100000001 at byte 0 is above the limit of 100000000 bytes");
    refuse("N = 2^64 - 1", build_n("{}", 0, UINT64_MAX), MMRT_ERR_LIMIT,
           "is above the limit");
    /* With the cap lifted, 8 + N wraps: the overflow check must catch it. */
    struct mmrt_st_limits lim = {.max_header_bytes = UINT64_MAX};
    refuse_lim("8 + N wraps", build_n("{}", 0, UINT64_MAX - 3), &lim, MMRT_ERR_FORMAT,
               "runs past the end");
    /* A configured cap. */
    lim.max_header_bytes = 16;
    size_t n = build("{'__metadata__':{'a':'b'}}", 0);
    refuse_lim("configured cap", n, &lim, MMRT_ERR_LIMIT, "above the limit of 16 bytes");
    lim.max_header_bytes = 64;
    mmrt_safetensors_close(parse_ok(n, &lim));
}

/* ---- S2: the header is a JSON object ---- */

static void test_s2_json(void **state)
{
    (void)state;
    static const struct bad_header cases[] = {
        {"not JSON", "{abc}", 0, MMRT_ERR_FORMAT, "invalid JSON"},
        {"truncated JSON", "{'a':{'dtype':'F32'", 0, MMRT_ERR_FORMAT, "invalid JSON"},
        {"array", "[]", 0, MMRT_ERR_FORMAT, "header is a JSON array, not an object"},
        /* jansson itself wants an array or object at the top. */
        {"string", "'ab'", 0, MMRT_ERR_FORMAT, "'[' or '{' expected"},
        {"number", "42", 0, MMRT_ERR_FORMAT, "'[' or '{' expected"},
        {"null", "null", 0, MMRT_ERR_FORMAT, "'[' or '{' expected"},
        {"trailing garbage", "{} x", 0, MMRT_ERR_FORMAT, "invalid JSON"},
        {"two objects", "{}{}", 0, MMRT_ERR_FORMAT, "invalid JSON"},
        {"duplicate key", "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                          "'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}",
         8, MMRT_ERR_FORMAT, "duplicate"},
        {"duplicate member", "{'a':{'dtype':'F32','dtype':'F16','shape':[1],"
                             "'data_offsets':[0,4]}}", 4, MMRT_ERR_FORMAT, "duplicate"},
        {"too deep", "{'a':{'dtype':'F32','shape':[[1]],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "nested deeper than 3 levels"},
        {"deep bomb", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 0, MMRT_ERR_FORMAT,
         "nested deeper than 3 levels"},
        {"invalid UTF-8 key", "{'\xff\xfe':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "invalid JSON"},
        {"overlong UTF-8", "{'\xc0\xaf':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "invalid JSON"},
        {"NUL escape in name", "{'a\\u0000b':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}",
         4, MMRT_ERR_FORMAT, "invalid JSON"},
        {"raw control byte", "{'a\x01':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "invalid JSON"},
        {"single quotes", "{\\'a\\':1}", 0, MMRT_ERR_FORMAT, "invalid JSON"},
        /* jansson quotes the bad token raw; the message must still be one line (found by
         * the fuzzer: tests/fuzz/corpus/safetensors/crash-json-newline). */
        {"newline in quoted token", "{'a\\\n\x1b[2J':1}", 0, MMRT_ERR_FORMAT,
         "invalid escape near '\"a\\?"},
    };
    refuse_all(cases, ARRAY_LEN(cases));
    /* A raw NUL inside the header (the JSON text is length-delimited, not NUL-terminated). */
    size_t n = build("{'a':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4);
    g_buf[8 + 2] = 0;
    refuse("raw NUL", n, MMRT_ERR_FORMAT, "invalid JSON");
    /* NUL padding is not JSON whitespace. */
    n = build_ex("{}", 0, 4, 0);
    memset(g_buf + 10, 0, 4);
    refuse("NUL padding", n, MMRT_ERR_FORMAT, "invalid JSON");
}

/* ---- S3: dtype and shape ---- */

/* The integer dtypes of quantized matrices: I8 and U8 one byte an element (U8 read as U4,
 * bytes of two 4-bit codes), I32 four, I64 eight (MMRT_ST_DTYPE_I64); a byte count that does
 * not match the element size is refused as for the float dtypes (S4). */
static void test_s3_integer_dtypes(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int32_t dtype;
        size_t size;
    } d[] = { { "I8", MMRT_DTYPE_I8, 1 }, { "U8", MMRT_DTYPE_U4, 1 },
              { "I32", MMRT_DTYPE_I32, 4 }, { "I64", MMRT_ST_DTYPE_I64, 8 } };
    char hdr[256];
    for (size_t i = 0; i < ARRAY_LEN(d); i++) {
        fmt(hdr, sizeof hdr, "{'t':{'dtype':'%s','shape':[3],'data_offsets':[0,%zu]}}",
            d[i].name, 3 * d[i].size);
        struct mmrt_safetensors *st = parse_ok(build(hdr, 3 * d[i].size), NULL);
        const struct mmrt_st_tensor *t = mmrt_safetensors_at(st, 0);
        assert_int_equal(t->dtype, d[i].dtype);
        assert_int_equal(t->nbytes, 3 * d[i].size);
        assert_int_equal(mmrt_st_dtype_size(t->dtype), d[i].size);
        float f;
        struct mmrt_error err = { 0 };
        assert_int_equal(mmrt_safetensors_read_f32(t, &f, 1, &err), MMRT_ERR_INVALID_ARG);
        mmrt_safetensors_close(st);
        fmt(hdr, sizeof hdr, "{'t':{'dtype':'%s','shape':[3],'data_offsets':[0,%zu]}}",
            d[i].name, 3 * d[i].size + 1);
        refuse(d[i].name, build(hdr, 3 * d[i].size + 1), MMRT_ERR_FORMAT, "tensor \"t\"");
    }
}

static void test_s3_dtype(void **state)
{
    (void)state;
    static const char *const others[] = {"F64", "I16", "U16", "U32",
                                         "U64", "BOOL", "F8_E4M3", "F8_E5M2",
                                         "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
    char hdr[256], want[128];
    for (size_t i = 0; i < ARRAY_LEN(others); i++) {
        fmt(hdr, sizeof hdr, "{'t':{'dtype':'%s','shape':[1],'data_offsets':[0,8]}}",
                 others[i]);
        fmt(want, sizeof want, "tensor \"t\": dtype %s is not supported (F32, F16, BF16, I8, "
                 "U8, I32, I64)", others[i]);
        refuse(others[i], build(hdr, 8), MMRT_ERR_UNSUPPORTED, want);
    }
    static const struct bad_header cases[] = {
        {"unknown", "{'t':{'dtype':'F33','shape':[1],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "tensor \"t\": unknown dtype \"F33\""},
        {"lowercase", "{'t':{'dtype':'f32','shape':[1],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "unknown dtype \"f32\""},
        {"torch name", "{'t':{'dtype':'float32','shape':[1],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "unknown dtype \"float32\""},
        {"empty", "{'t':{'dtype':'','shape':[1],'data_offsets':[0,4]}}", 4, MMRT_ERR_FORMAT,
         "unknown dtype \"\""},
        {"hostile", "{'t':{'dtype':'F32\\n\\u0001','shape':[1],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "unknown dtype \"F32\\x0a\\x01\""},
        {"number", "{'t':{'dtype':4,'shape':[1],'data_offsets':[0,4]}}", 4, MMRT_ERR_FORMAT,
         "\"dtype\" is a JSON integer, not a string"},
        {"missing", "{'t':{'shape':[1],'data_offsets':[0,4]}}", 4, MMRT_ERR_FORMAT,
         "tensor \"t\": missing \"dtype\""},
        {"entry not object", "{'t':[1]}", 0, MMRT_ERR_FORMAT,
         "tensor \"t\": entry is a JSON array, not an object"},
        {"entry string", "{'t':'F32'}", 0, MMRT_ERR_FORMAT, "entry is a JSON string"},
        {"unknown member", "{'t':{'dtype':'F32','shape':[1],'data_offsets':[0,4],'x':1}}", 4,
         MMRT_ERR_FORMAT, "tensor \"t\": unknown member \"x\""},
    };
    refuse_all(cases, ARRAY_LEN(cases));
}

static void test_s3_shape(void **state)
{
    (void)state;
    static const struct bad_header cases[] = {
        {"missing", "{'t':{'dtype':'F32','data_offsets':[0,4]}}", 4, MMRT_ERR_FORMAT,
         "tensor \"t\": missing \"shape\""},
        {"not array", "{'t':{'dtype':'F32','shape':4,'data_offsets':[0,16]}}", 16,
         MMRT_ERR_FORMAT, "\"shape\" is a JSON integer, not an array"},
        {"float", "{'t':{'dtype':'F32','shape':[2.0],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "shape[0] is a JSON real number, not an integer"},
        {"exponent", "{'t':{'dtype':'F32','shape':[1,2e0],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "shape[1] is a JSON real number"},
        {"negative", "{'t':{'dtype':'F32','shape':[-2],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "shape[0] = -2 is negative"},
        {"two negatives", "{'t':{'dtype':'F32','shape':[-2,-1],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "shape[0] = -2 is negative"},
        {"string", "{'t':{'dtype':'F32','shape':['2'],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "shape[0] is a JSON string"},
        {"bool", "{'t':{'dtype':'F32','shape':[true],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "shape[0] is a JSON boolean"},
        {"null", "{'t':{'dtype':'F32','shape':[null],'data_offsets':[0,4]}}", 4,
         MMRT_ERR_FORMAT, "shape[0] is a JSON null"},
        {"above int64", "{'t':{'dtype':'F32','shape':[18446744073709551616],"
                        "'data_offsets':[0,4]}}", 4, MMRT_ERR_FORMAT, "invalid JSON"},
        {"rank 9", "{'t':{'dtype':'F32','shape':[1,1,1,1,1,1,1,1,1],'data_offsets':[0,4]}}",
         4, MMRT_ERR_LIMIT, "tensor \"t\": rank 9 is above the limit of 8"},
        /* The C-port bug: (2^62 + 1) * 4 wraps to 4 elements, which 16 bytes would match. */
        {"product wraps to 4", "{'t':{'dtype':'F32','shape':[4611686018427387905,4],"
                               "'data_offsets':[0,16]}}", 16, MMRT_ERR_FORMAT,
         "element count of shape [4611686018427387905, 4]... overflows 64 bits"},
        {"2^32 squared", "{'t':{'dtype':'F16','shape':[4294967296,4294967296],"
                         "'data_offsets':[0,0]}}", 0, MMRT_ERR_FORMAT, "overflows 64 bits"},
        /* Overflow before a zero dimension is still overflow (as in the reference). */
        {"overflow then 0", "{'t':{'dtype':'F16','shape':[4294967296,4294967296,0],"
                            "'data_offsets':[0,0]}}", 0, MMRT_ERR_FORMAT, "overflows 64 bits"},
        /* 2^62 elements fit, 2^62 * 4 bytes do not. */
        {"bytes overflow", "{'t':{'dtype':'F32','shape':[4611686018427387904],"
                           "'data_offsets':[0,0]}}", 0, MMRT_ERR_FORMAT,
         "byte count of shape [4611686018427387904] (4611686018427387904 elements) overflows"},
        {"huge but fits", "{'t':{'dtype':'F32','shape':[1048576,1048576],"
                          "'data_offsets':[0,16]}}", 16, MMRT_ERR_FORMAT,
         "span 16 bytes but shape [1048576, 1048576] of F32 needs 4398046511104"},
    };
    refuse_all(cases, ARRAY_LEN(cases));
    /* A configured max_rank, and an impossible one. */
    struct mmrt_st_limits lim = {.max_rank = 2};
    refuse_lim("max_rank 2", build("{'t':{'dtype':'F32','shape':[1,1,1],'data_offsets':[0,4]}}",
                                   4), &lim, MMRT_ERR_LIMIT, "rank 3 is above the limit of 2");
    lim.max_rank = 9;
    refuse_lim("max_rank 9", build("{}", 0), &lim, MMRT_ERR_INVALID_ARG, "max_rank 9");
    lim.max_rank = -1;
    refuse_lim("max_rank -1", build("{}", 0), &lim, MMRT_ERR_INVALID_ARG, "max_rank -1");
}

/* ---- S4: data_offsets ---- */

static void test_s4_offsets(void **state)
{
    (void)state;
    static const struct bad_header cases[] = {
        {"missing", "{'t':{'dtype':'F32','shape':[2]}}", 8, MMRT_ERR_FORMAT,
         "tensor \"t\": missing \"data_offsets\""},
        {"not array", "{'t':{'dtype':'F32','shape':[2],'data_offsets':8}}", 8,
         MMRT_ERR_FORMAT, "must be an array of two integers"},
        {"object", "{'t':{'dtype':'F32','shape':[2],'data_offsets':{'a':0}}}", 8,
         MMRT_ERR_FORMAT, "must be an array of two integers"},
        {"one", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[8]}}", 8, MMRT_ERR_FORMAT,
         "must be an array of two integers"},
        {"three", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[0,8,8]}}", 8,
         MMRT_ERR_FORMAT, "must be an array of two integers"},
        {"empty", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[]}}", 8, MMRT_ERR_FORMAT,
         "must be an array of two integers"},
        {"negative begin", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[-8,0]}}", 8,
         MMRT_ERR_FORMAT, "data_offsets[0] = -8 is negative"},
        {"negative end", "{'t':{'dtype':'F32','shape':[0],'data_offsets':[0,-1]}}", 0,
         MMRT_ERR_FORMAT, "data_offsets[1] = -1 is negative"},
        {"int64 min", "{'t':{'dtype':'F32','shape':[2],'data_offsets':"
                      "[-9223372036854775808,-9223372036854775800]}}", 8, MMRT_ERR_FORMAT,
         "data_offsets[0] = -9223372036854775808 is negative"},
        {"real", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[0.0,8]}}", 8,
         MMRT_ERR_FORMAT, "data_offsets[0] is a JSON real number, not an integer"},
        {"string", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[0,'8']}}", 8,
         MMRT_ERR_FORMAT, "data_offsets[1] is a JSON string"},
        {"begin after end", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[8,0]}}", 8,
         MMRT_ERR_FORMAT, "tensor \"t\": data_offsets [8, 0] begin after end"},
        {"end past buffer", "{'t':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 7,
         MMRT_ERR_FORMAT, "data_offsets [0, 8] end past the 7-byte data buffer"},
        {"end huge", "{'t':{'dtype':'F32','shape':[2],'data_offsets':"
                     "[9223372036854775799,9223372036854775807]}}", 8, MMRT_ERR_FORMAT,
         "end past the 8-byte data buffer"},
        {"span short", "{'t':{'dtype':'F32','shape':[2,2],'data_offsets':[0,12]}}", 12,
         MMRT_ERR_FORMAT, "data_offsets [0, 12] span 12 bytes but shape [2, 2] of F32 needs 16"},
        {"span long", "{'t':{'dtype':'F16','shape':[2],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "span 8 bytes but shape [2] of F16 needs 4"},
        {"scalar as zero", "{'t':{'dtype':'BF16','shape':[],'data_offsets':[0,0]}}", 0,
         MMRT_ERR_FORMAT, "span 0 bytes but shape [] of BF16 needs 2"},
    };
    refuse_all(cases, ARRAY_LEN(cases));
}

/* ---- S5: the ranges tile the buffer ---- */

static void test_s5_tiling(void **state)
{
    (void)state;
    static const struct bad_header cases[] = {
        {"gap at start", "{'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}", 8,
         MMRT_ERR_FORMAT, "tensor \"a\": data begins at buffer byte 4 (file byte"},
        {"gap between", "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                        "'b':{'dtype':'F32','shape':[1],'data_offsets':[6,10]}}", 10,
         MMRT_ERR_FORMAT, "leaving a 2-byte gap after \"a\""},
        {"overlap", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                    "'b':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}", 8,
         MMRT_ERR_FORMAT, "tensor \"b\": data [4, 8) overlaps tensor \"a\", which ends at "
                          "buffer byte 8"},
        {"same range", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                       "'b':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 8,
         MMRT_ERR_FORMAT, "tensor \"b\": data [0, 8) overlaps tensor \"a\""},
        {"nested", "{'a':{'dtype':'F32','shape':[4],'data_offsets':[0,16]},"
                   "'b':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}", 16,
         MMRT_ERR_FORMAT, "overlaps tensor \"a\""},
        {"zero-size inside", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                             "'z':{'dtype':'F32','shape':[0],'data_offsets':[4,4]}}", 8,
         MMRT_ERR_FORMAT, "tensor \"z\": data [4, 4) overlaps tensor \"a\""},
        {"zero-size past end", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                               "'z':{'dtype':'F32','shape':[0],'data_offsets':[9,9]}}", 8,
         MMRT_ERR_FORMAT, "tensor \"z\": data_offsets [9, 9] end past the 8-byte data buffer"},
        {"trailing bytes", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 12,
         MMRT_ERR_FORMAT, "4 trailing bytes at file bytes"},
        {"data but no tensors", "{}", 1, MMRT_ERR_FORMAT, "1 trailing bytes"},
        {"only zero-size, data", "{'z':{'dtype':'F32','shape':[0],'data_offsets':[0,0]}}", 3,
         MMRT_ERR_FORMAT, "3 trailing bytes"},
    };
    refuse_all(cases, ARRAY_LEN(cases));
    /* The trailing-bytes message gives absolute file offsets. */
    size_t n = build("{}", 2);
    refuse("trailing offsets", n, MMRT_ERR_FORMAT, "2 trailing bytes at file bytes [10, 12)");
}

/* ---- S6: __metadata__ ---- */

static void test_s6_metadata(void **state)
{
    (void)state;
    static const struct bad_header cases[] = {
        {"number value", "{'__metadata__':{'format':1}}", 0, MMRT_ERR_FORMAT,
         "\"__metadata__\" member \"format\" is a JSON integer, not a string"},
        {"object value", "{'__metadata__':{'format':{}}}", 0, MMRT_ERR_FORMAT,
         "member \"format\" is a JSON object"},
        {"array value", "{'__metadata__':{'k':['v']}}", 0, MMRT_ERR_FORMAT,
         "member \"k\" is a JSON array"},
        {"null value", "{'__metadata__':{'k':null}}", 0, MMRT_ERR_FORMAT,
         "member \"k\" is a JSON null"},
        {"array", "{'__metadata__':['format','pt']}", 0, MMRT_ERR_FORMAT,
         "\"__metadata__\" is a JSON array, not an object of strings"},
        {"string", "{'__metadata__':'pt'}", 0, MMRT_ERR_FORMAT,
         "\"__metadata__\" is a JSON string"},
        {"null", "{'__metadata__':null}", 0, MMRT_ERR_FORMAT, "\"__metadata__\" is a JSON null"},
    };
    refuse_all(cases, ARRAY_LEN(cases));
    /* Size cap: keys + values. {"format":"pt"} is 8 bytes, {"format":"pytorch"} 13. */
    struct mmrt_st_limits lim = {.max_metadata_bytes = 10};
    mmrt_safetensors_close(parse_ok(build("{'__metadata__':{'format':'pt'}}", 0), &lim));
    refuse_lim("over cap", build("{'__metadata__':{'format':'pytorch'}}", 0), &lim,
               MMRT_ERR_LIMIT, "\"__metadata__\" holds more than the 10 bytes allowed");
    refuse_lim("many small", build("{'__metadata__':{'a':'b','c':'d','e':'f','g':'h',"
                                   "'i':'j','k':'l'}}", 0), &lim, MMRT_ERR_LIMIT,
               "at member \"k\"");
    /* The default cap is 1 MiB: a 60 KB value passes. */
    static char hdr[62000];
    int o = fmt(hdr, sizeof hdr, "{'__metadata__':{'big':'");
    memset(hdr + o, 'x', 60000);
    fmt(hdr + o + 60000, sizeof hdr - (size_t)o - 60000, "'}}");
    mmrt_safetensors_close(parse_ok(build(hdr, 0), NULL));
}

/* ---- tensor names ---- */

static void test_names(void **state)
{
    (void)state;
    refuse("empty name", build("{'':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4),
           MMRT_ERR_FORMAT, "a tensor name is empty");
    static char hdr[2200];
    int o = fmt(hdr, sizeof hdr, "{'");
    memset(hdr + o, 'n', 1025);
    fmt(hdr + o + 1025, sizeof hdr - (size_t)o - 1025,
             "':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}");
    refuse("1025-byte name", build(hdr, 4), MMRT_ERR_LIMIT,
           "name is 1025 bytes, more than the 1024 allowed");
    /* The message shows a truncated name, not 1 KB of it. */
    struct mmrt_error err = {0};
    struct mmrt_safetensors *st = NULL;
    assert_int_equal(mmrt_safetensors_parse_header(g_buf, build(hdr, 4), "m", NULL, &st, &err),
                     MMRT_ERR_LIMIT);
    assert_true(strlen(err.msg) < 200);
    assert_non_null(strstr(err.msg, "nnn\"..."));
    /* 1024 bytes is fine; a configured cap of 8 refuses a 9-byte name. */
    hdr[o + 1024] = '\'';
    memmove(hdr + o + 1025, hdr + o + 1026, strlen(hdr + o + 1026) + 1);
    mmrt_safetensors_close(parse_ok(build(hdr, 4), NULL));
    struct mmrt_st_limits lim = {.max_name_bytes = 8};
    refuse_lim("configured name cap",
               build("{'123456789':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4), &lim,
               MMRT_ERR_LIMIT, "tensor \"123456789\": name is 9 bytes, more than the 8 allowed");
    /* A hostile name is escaped: the message stays one line (refuse() checks for '\n'). */
    refuse("newline in name", build("{'a\\nb\\u001b[2J\\\\':{'dtype':'F64','shape':[],"
                                    "'data_offsets':[0,8]}}", 8),
           MMRT_ERR_UNSUPPORTED, "tensor \"a\\x0ab\\x1b[2J\\x5c\": dtype F64");
    /* Truncation does not cut a UTF-8 character in half. */
    o = fmt(hdr, sizeof hdr, "{'");
    for (int i = 0; i < 100; i++)
        o += fmt(hdr + o, sizeof hdr - (size_t)o, "\xc3\xa9");
    fmt(hdr + o, sizeof hdr - (size_t)o, "':{'dtype':'I16','shape':[],'data_offsets':[0,2]}}");
    assert_int_equal(mmrt_safetensors_parse_header(g_buf, build(hdr, 2), "m", NULL, &st, &err),
                     MMRT_ERR_UNSUPPORTED);
    const char *e = strstr(err.msg, "\"...");
    assert_non_null(e);
    assert_int_equal((unsigned char)e[-1], 0xa9); /* ends on a whole é */
    /* Too many tensors for a configured cap. */
    lim = (struct mmrt_st_limits){.max_tensors = 2};
    refuse_lim("max_tensors", build("{'a':{'dtype':'F32','shape':[0],'data_offsets':[0,0]},"
                                    "'b':{'dtype':'F32','shape':[0],'data_offsets':[0,0]},"
                                    "'c':{'dtype':'F32','shape':[0],'data_offsets':[0,0]}}", 0),
               &lim, MMRT_ERR_LIMIT, "3 tensors (0 before this file) exceed the limit of 2");
}

/* ---- S8: files, truncation, mmap ---- */

static void test_s8_files(void **state)
{
    (void)state;
    struct mmrt_safetensors *st = SENTINEL;
    struct mmrt_error err = {0};
    /* Every truncation of a valid file is a clean error (never SIGBUS, never OK). */
    size_t len = build_valid();
    static uint8_t full[1024];
    assert_true(len <= sizeof full);
    memcpy(full, g_buf, len);
    char path[256];
    fmt(path, sizeof path, "%s", tmp_path("trunc.safetensors"));
    for (size_t n = 0; n < len; n++) {
        write_bytes(path, full, n);
        st = SENTINEL;
        mmrt_status s = mmrt_safetensors_open(path, NULL, &st, &err);
        if (s != MMRT_ERR_FORMAT || st != SENTINEL)
            fail_msg("truncated to %zu of %zu bytes: %s %s", n, len, mmrt_status_name(s),
                     err.msg);
    }
    /* One byte too many is trailing data. */
    memcpy(g_buf, full, len);
    g_buf[len] = 0;
    refuse("one extra byte", len + 1, MMRT_ERR_FORMAT, "1 trailing bytes");

    /* Not a regular file: a FIFO is refused at once (O_NONBLOCK: it must not hang). */
    const char *fifo = tmp_path("fifo.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mmrt_safetensors_open(fifo, NULL, &st, &err), MMRT_ERR_IO);
    assert_non_null(strstr(err.msg, "not a regular file"));
    assert_ptr_equal(st, SENTINEL);
    assert_int_equal(mmrt_safetensors_open("/dev/null", NULL, &st, &err), MMRT_ERR_IO);
    assert_non_null(strstr(err.msg, "/dev/null: not a regular file"));
    /* Missing. */
    assert_int_equal(mmrt_safetensors_open(tmp_path("nope.safetensors"), NULL, &st, &err),
                     MMRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "nope.safetensors"));
    /* mmap failing is an I/O error naming the file, and nothing leaks. */
    write_bytes(path, full, len);
    long live = alloc_live();
    g_mmap_fail = true;
    mmrt_status s = mmrt_safetensors_open(path, NULL, &st, &err);
    g_mmap_fail = false;
    assert_int_equal(s, MMRT_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot map"));
    assert_non_null(strstr(err.msg, "trunc.safetensors"));
    assert_ptr_equal(st, SENTINEL);
    assert_int_equal(alloc_live(), live);
    /* Argument checks. */
    assert_int_equal(mmrt_safetensors_open(NULL, NULL, &st, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_safetensors_open(path, NULL, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_safetensors_parse_header(NULL, 4, "m", NULL, &st, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_safetensors_parse_header(NULL, 0, NULL, NULL, &st, &err),
                     MMRT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "<memory>: file is 0 bytes"));
    assert_ptr_equal(st, SENTINEL);
}

/* ---- S9: shard index ---- */

static const char SHARD1[] =
    "{'__metadata__':{'format':'pt'},"
    "'a.weight':{'dtype':'F32','shape':[2,2],'data_offsets':[0,16]},"
    "'a.bias':{'dtype':'F16','shape':[2],'data_offsets':[16,20]},"
    "'a.empty':{'dtype':'BF16','shape':[0],'data_offsets':[20,20]}}";
static const char SHARD2[] =
    "{'b.weight':{'dtype':'BF16','shape':[3],'data_offsets':[0,6]},"
    "'b.bias':{'dtype':'F32','shape':[],'data_offsets':[6,10]}}";
static const char INDEX_OK[] =
    "{'metadata':{'total_size':30,'extra':[1,{'x':null}]},'weight_map':{"
    "'a.weight':'s-1.safetensors','a.bias':'s-1.safetensors','a.empty':'s-1.safetensors',"
    "'b.weight':'s-2.safetensors','b.bias':'s-2.safetensors'}}";

/* Makes DIR/<sub>/ with two shards and index text `index` (with ' for "). */
static const char *make_sharded(const char *sub, const char *index)
{
    static char dir[256];
    fmt(dir, sizeof dir, "%s/%s", g_dir, sub);
    mkdir(dir, 0700);
    char name[300];
    fmt(name, sizeof name, "%s/s-1.safetensors", sub);
    write_st(name, SHARD1, 20);
    fmt(name, sizeof name, "%s/s-2.safetensors", sub);
    write_st(name, SHARD2, 10);
    fmt(name, sizeof name, "%s/model.safetensors.index.json", sub);
    write_text(name, index);
    return dir;
}

static void check_sharded(const struct mmrt_safetensors *st, const char *dir)
{
    static const char *const names[] = {"a.bias", "a.empty", "a.weight", "b.bias",
                                        "b.weight"};
    assert_int_equal(mmrt_safetensors_count(st), 5);
    char s1[300], s2[300];
    fmt(s1, sizeof s1, "%s/s-1.safetensors", dir);
    fmt(s2, sizeof s2, "%s/s-2.safetensors", dir);
    for (size_t i = 0; i < 5; i++) {
        const struct mmrt_st_tensor *t = mmrt_safetensors_at(st, i);
        assert_string_equal(t->name, names[i]);
        assert_ptr_equal(mmrt_safetensors_find(st, names[i]), t);
        assert_string_equal(t->file, names[i][0] == 'a' ? s1 : s2);
    }
    /* One shard record per file: tensors of one file share the path pointer. */
    assert_ptr_equal(mmrt_safetensors_find(st, "a.bias")->file,
                     mmrt_safetensors_find(st, "a.weight")->file);
    assert_ptr_equal(mmrt_safetensors_find(st, "b.bias")->file,
                     mmrt_safetensors_find(st, "b.weight")->file);
    expect_shape(mmrt_safetensors_find(st, "a.weight"), MMRT_DTYPE_F32, 2, 2, 2);
    expect_shape(mmrt_safetensors_find(st, "b.bias"), MMRT_DTYPE_F32, 0);
    size_t h2 = 8 + strlen(SHARD2);
    assert_int_equal(mmrt_safetensors_find(st, "b.bias")->file_offset, h2 + 6);
    /* Data comes from the right file: the pattern of build(), i*7+1 from each buffer start. */
    const uint8_t *d = mmrt_safetensors_find(st, "b.bias")->data;
    assert_int_equal(d[0], (uint8_t)(6 * 7 + 1));
    d = mmrt_safetensors_find(st, "a.bias")->data;
    assert_int_equal(d[0], (uint8_t)(16 * 7 + 1));
}

static void test_s9_index_valid(void **state)
{
    (void)state;
    const char *dir = make_sharded("ok", INDEX_OK);
    char d[256], idx[300];
    fmt(d, sizeof d, "%s", dir);
    fmt(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    /* Through the index path, and through the directory: each shard mapped exactly once. */
    g_mmap_calls = 0;
    struct mmrt_safetensors *st = open_ok(idx, NULL);
    assert_int_equal(g_mmap_calls, 2);
    check_sharded(st, d);
    mmrt_safetensors_close(st);
    g_mmap_calls = 0;
    st = open_ok(d, NULL);
    assert_int_equal(g_mmap_calls, 2);
    check_sharded(st, d);
    mmrt_safetensors_close(st);

    /* A directory with both: model.safetensors wins (what transformers loads). */
    char single[300];
    fmt(single, sizeof single, "%s/model.safetensors", d);
    size_t n = build("{'only':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}", 4);
    write_bytes(single, g_buf, n);
    st = open_ok(d, NULL);
    assert_int_equal(mmrt_safetensors_count(st), 1);
    assert_string_equal(mmrt_safetensors_at(st, 0)->file, single);
    mmrt_safetensors_close(st);
    /* A directory with a single file only. */
    unlink(idx);
    st = open_ok(d, NULL);
    assert_int_equal(mmrt_safetensors_count(st), 1);
    mmrt_safetensors_close(st);
    /* A directory with neither. */
    unlink(single);
    struct mmrt_error err = {0};
    st = SENTINEL;
    assert_int_equal(mmrt_safetensors_open(d, NULL, &st, &err), MMRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "neither model.safetensors nor "
                                    "model.safetensors.index.json"));
    assert_non_null(strstr(err.msg, d));
    assert_ptr_equal(st, SENTINEL);

    /* An index with an empty weight_map is an empty set; "metadata" may be absent. */
    write_text("ok/empty.index.json", "{'weight_map':{}}");
    char e[300];
    fmt(e, sizeof e, "%s/empty.index.json", d);
    st = open_ok(e, NULL);
    assert_int_equal(mmrt_safetensors_count(st), 0);
    mmrt_safetensors_close(st);
    /* Unknown top-level keys are ignored (the index is a transformers convention). */
    write_text("ok/extra.index.json", "{'weight_map':{'b.bias':'s-2.safetensors',"
                                      "'b.weight':'s-2.safetensors'},'other':[1,2]}");
    fmt(e, sizeof e, "%s/extra.index.json", d);
    st = open_ok(e, NULL);
    assert_int_equal(mmrt_safetensors_count(st), 2);
    mmrt_safetensors_close(st);
}

static const char WRONG_SHARD[] =
    "{'weight_map':{'a.weight':'s-1.safetensors','a.bias':'s-1.safetensors',"
    "'a.empty':'s-1.safetensors','b.weight':'s-1.safetensors','b.bias':'s-2.safetensors'}}";

struct bad_index {
    const char *label;
    const char *index;
    mmrt_status want;
    const char *substr;
};

static void test_s9_index_hostile(void **state)
{
    (void)state;
    static const struct bad_index cases[] = {
        {"not JSON", "{'weight_map':", MMRT_ERR_FORMAT, "invalid JSON"},
        {"array", "[]", MMRT_ERR_FORMAT, "index is a JSON array, not an object"},
        {"no weight_map", "{'metadata':{}}", MMRT_ERR_FORMAT, "missing \"weight_map\""},
        {"weight_map array", "{'weight_map':['s-1.safetensors']}", MMRT_ERR_FORMAT,
         "\"weight_map\" is a JSON array, not an object"},
        {"metadata string", "{'metadata':'x','weight_map':{}}", MMRT_ERR_FORMAT,
         "\"metadata\" is a JSON string, not an object"},
        {"duplicate key", "{'weight_map':{'a.bias':'s-1.safetensors',"
                          "'a.bias':'s-1.safetensors'}}", MMRT_ERR_FORMAT, "duplicate"},
        {"file not string", "{'weight_map':{'a.bias':1}}", MMRT_ERR_FORMAT,
         "weight_map[\"a.bias\"] is a JSON integer, not a file name"},
        {"dot-dot path", "{'weight_map':{'a.bias':'../s-1.safetensors'}}", MMRT_ERR_FORMAT,
         "weight_map[\"a.bias\"] = \"../s-1.safetensors\" contains a path separator"},
        {"absolute", "{'weight_map':{'a.bias':'/etc/passwd'}}", MMRT_ERR_FORMAT,
         "contains a path separator"},
        {"subdir", "{'weight_map':{'a.bias':'ok/s-1.safetensors'}}", MMRT_ERR_FORMAT,
         "contains a path separator"},
        {"backslash", "{'weight_map':{'a.bias':'..\\\\s-1.safetensors'}}", MMRT_ERR_FORMAT,
         "contains a path separator"},
        {"dot-dot", "{'weight_map':{'a.bias':'..'}}", MMRT_ERR_FORMAT, "names a directory"},
        {"dot", "{'weight_map':{'a.bias':'.'}}", MMRT_ERR_FORMAT, "names a directory"},
        {"empty file", "{'weight_map':{'a.bias':''}}", MMRT_ERR_FORMAT, "is empty"},
        {"newline in JSON error", "{'weight_map':{'a\\\n':1}}", MMRT_ERR_FORMAT,
         "invalid escape near '\"a\\?'"},
        {"NUL in file", "{'weight_map':{'a.bias':'s-1\\u0000.safetensors'}}", MMRT_ERR_FORMAT,
         "invalid JSON"},
        {"empty tensor name", "{'weight_map':{'':'s-1.safetensors'}}", MMRT_ERR_FORMAT,
         "a tensor name is empty"},
        /* Disagreements between the index and the shards, each naming both. */
        {"index names a missing tensor",
         "{'weight_map':{'a.weight':'s-1.safetensors','a.bias':'s-1.safetensors',"
         "'a.empty':'s-1.safetensors','a.ghost':'s-1.safetensors'}}", MMRT_ERR_FORMAT,
         "maps tensor \"a.ghost\" to "},
        {"shard has an unlisted tensor",
         "{'weight_map':{'a.weight':'s-1.safetensors','a.bias':'s-1.safetensors'}}",
         MMRT_ERR_FORMAT, "does not list tensor \"a.empty\", which shard "},
        {"index puts a tensor in the wrong shard", WRONG_SHARD, MMRT_ERR_FORMAT,
         "maps tensor \"b.weight\" to "},
        {"missing shard file", "{'weight_map':{'a.bias':'s-9.safetensors'}}", MMRT_ERR_IO,
         "s-9.safetensors: cannot open"},
    };
    make_sharded("bad", INDEX_OK);
    char idx[300];
    fmt(idx, sizeof idx, "%s/bad/model.safetensors.index.json", g_dir);
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        write_text("bad/model.safetensors.index.json", cases[i].index);
        struct mmrt_safetensors *st = SENTINEL;
        struct mmrt_error err = {0};
        mmrt_status s = mmrt_safetensors_open(idx, NULL, &st, &err);
        check_err(cases[i].label, "index", s, &err, st, cases[i].want, cases[i].substr, idx);
    }
    /* The wrong-shard message names both shard files. */
    write_text("bad/model.safetensors.index.json", WRONG_SHARD);
    struct mmrt_safetensors *st = SENTINEL;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_safetensors_open(idx, NULL, &st, &err), MMRT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "s-1.safetensors, but it is in "));
    assert_non_null(strstr(err.msg, "s-2.safetensors (file byte"));

    /* The same tensor in two shards. */
    write_st("bad/dup.safetensors", "{'a.bias':{'dtype':'F32','shape':[],"
                                    "'data_offsets':[0,4]}}", 4);
    write_text("bad/model.safetensors.index.json",
               "{'weight_map':{'a.weight':'s-1.safetensors','a.bias':'dup.safetensors',"
               "'a.empty':'s-1.safetensors'}}");
    assert_int_equal(mmrt_safetensors_open(idx, NULL, &st, &err), MMRT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tensor \"a.bias\" is in both "));
    assert_non_null(strstr(err.msg, "dup.safetensors (file byte"));
    assert_non_null(strstr(err.msg, "s-1.safetensors (file byte"));
    assert_ptr_equal(st, SENTINEL);

    /* A broken shard: the message names the index and the shard. */
    write_st("bad/broken.safetensors", "{'x':{'dtype':'F32','shape':[2],"
                                       "'data_offsets':[0,8]}}", 4);
    write_text("bad/model.safetensors.index.json", "{'weight_map':{'x':'broken.safetensors'}}");
    assert_int_equal(mmrt_safetensors_open(idx, NULL, &st, &err), MMRT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "model.safetensors.index.json: shard of tensor \"x\": "));
    assert_non_null(strstr(err.msg, "broken.safetensors: tensor \"x\": data_offsets [0, 8] "
                                    "end past the 4-byte data buffer"));
    /* A shard that is a directory. */
    char sub[300];
    fmt(sub, sizeof sub, "%s/bad/adir", g_dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_text("bad/model.safetensors.index.json", "{'weight_map':{'x':'adir'}}");
    assert_int_equal(mmrt_safetensors_open(idx, NULL, &st, &err), MMRT_ERR_IO);
    assert_non_null(strstr(err.msg, "adir: not a regular file"));
    /* The tensor cap counts all shards together. */
    write_text("bad/model.safetensors.index.json", INDEX_OK);
    struct mmrt_st_limits lim = {.max_tensors = 4};
    assert_int_equal(mmrt_safetensors_open(idx, &lim, &st, &err), MMRT_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "weight_map lists 5 tensors"));
    write_text("bad/model.safetensors.index.json",
               "{'weight_map':{'b.weight':'s-2.safetensors','b.bias':'s-2.safetensors',"
               "'a.weight':'s-1.safetensors'}}");
    lim.max_tensors = 3;
    assert_int_equal(mmrt_safetensors_open(idx, &lim, &st, &err), MMRT_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "(3 before this file) exceed the limit of 3"));
    /* The index file itself is size-capped by max_header_bytes. */
    lim = (struct mmrt_st_limits){.max_header_bytes = 16};
    assert_int_equal(mmrt_safetensors_open(idx, &lim, &st, &err), MMRT_ERR_LIMIT);
    assert_ptr_equal(st, SENTINEL);
}

/* ---- many tiny tensors: refused by count before the header is parsed ---- */

/* A header of n zero-size tensors (names carry ':', '{', '[' and escaped quotes, which the
 * pre-parse count must skip as string content), optionally with __metadata__. Returns a
 * malloc'd file image and its length. */
static uint8_t *many_zero_size(size_t n, bool meta, size_t *len)
{
    size_t cap = 64 + n * 80;
    uint8_t *b = malloc(cap);
    assert_non_null(b);
    size_t o = 8;
    o += (size_t)snprintf((char *)b + o, cap - o, "{%s",
                          meta ? "\"__metadata__\":{\"k:{\":\"v:[\"}" : "");
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf((char *)b + o, cap - o,
                              "%s\"t:{[\\\"%zu\":{\"dtype\":\"F32\",\"shape\":[0],"
                              "\"data_offsets\":[0,0]}", i || meta ? "," : "", i);
    o += (size_t)snprintf((char *)b + o, cap - o, "}");
    assert_true(o < cap);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)(o - 8) >> (8 * i));
    *len = o;
    return b;
}

static void test_many_zero_size_tensors(void **state)
{
    (void)state;
    struct mmrt_safetensors *st = SENTINEL;
    struct mmrt_error err = {0};
    size_t len;
    /* A million: over the default cap, refused by the count (no value built per entry). */
    uint8_t *b = many_zero_size(1000000, false, &len);
    assert_int_equal(mmrt_safetensors_parse_header(b, len, "m", NULL, &st, &err),
                     MMRT_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "1000000 entries (0 before this file) exceed the limit of "
                                    "262144 tensors (counted before parsing)"));
    assert_ptr_equal(st, SENTINEL);
    free(b);

    /* At the boundary of a configured cap, the count is exact: cap entries load, cap + 1
     * are refused after parsing (one might have been __metadata__), cap + 2 before. */
    struct mmrt_st_limits lim = {.max_tensors = 1000};
    for (int meta = 0; meta < 2; meta++) {
        b = many_zero_size(1000, meta, &len);
        st = NULL;
        assert_int_equal(mmrt_safetensors_parse_header(b, len, "m", &lim, &st, &err), MMRT_OK);
        assert_int_equal(mmrt_safetensors_count(st), 1000);
        const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, "t:{[\"999");
        assert_non_null(t);
        assert_int_equal(t->nbytes, 0);
        mmrt_safetensors_close(st);
        free(b);
    }
    b = many_zero_size(1001, false, &len);
    st = SENTINEL;
    assert_int_equal(mmrt_safetensors_parse_header(b, len, "m", &lim, &st, &err),
                     MMRT_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "1001 tensors (0 before this file) exceed the limit"));
    free(b);
    b = many_zero_size(1002, false, &len);
    assert_int_equal(mmrt_safetensors_parse_header(b, len, "m", &lim, &st, &err),
                     MMRT_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "1002 entries (0 before this file) exceed the limit of "
                                    "1000 tensors (counted before parsing)"));
    assert_ptr_equal(st, SENTINEL);
    free(b);
}

/* ---- allocation-failure sweep ---- */

typedef mmrt_status (*open_fn)(const void *arg, struct mmrt_safetensors **out,
                               struct mmrt_error *err);

static mmrt_status open_path(const void *arg, struct mmrt_safetensors **out,
                             struct mmrt_error *err)
{
    return mmrt_safetensors_open(arg, NULL, out, err);
}

static size_t g_sweep_len;
static mmrt_status parse_mem(const void *arg, struct mmrt_safetensors **out,
                             struct mmrt_error *err)
{
    return mmrt_safetensors_parse_header(arg, g_sweep_len, "mem", NULL, out, err);
}

/* Fails allocation n = 1, 2, … until a run succeeds without an injected failure: every
 * failing run must report MMRT_ERR_NO_MEMORY, leave *out alone and leak nothing. */
static void sweep(const char *label, open_fn fn, const void *arg, mmrt_status final)
{
    long base = alloc_live();
    for (long n = 1;; n++) {
        assert_true(n < 10000);
        struct mmrt_safetensors *st = SENTINEL;
        struct mmrt_error err = {0};
        alloc_fail_at(n);
        mmrt_status s = fn(arg, &st, &err);
        int fired = alloc_fail_fired();
        alloc_fail_at(0);
        if (!fired) {
            assert_int_equal(s, final);
            if (s == MMRT_OK)
                mmrt_safetensors_close(st);
            assert_int_equal(alloc_live(), base);
            print_message("%s: %ld allocations swept\n", label, n - 1);
            return;
        }
        if (s != MMRT_ERR_NO_MEMORY || st != SENTINEL || alloc_live() != base)
            fail_msg("%s, allocation %ld failed: %s '%s', out %s, %ld live blocks", label, n,
                     mmrt_status_name(s), err.msg, st == SENTINEL ? "untouched" : "written",
                     alloc_live() - base);
    }
}

static void test_alloc_failure_sweep(void **state)
{
    (void)state;
    size_t len = build_valid();
    char single[300], dir[300], idx[300];
    fmt(single, sizeof single, "%s", tmp_path("sweep.safetensors"));
    write_bytes(single, g_buf, len);
    sweep("single file", open_path, single, MMRT_OK);
    g_sweep_len = len;
    sweep("in memory", parse_mem, g_buf, MMRT_OK);
    fmt(dir, sizeof dir, "%s", make_sharded("sweep", INDEX_OK));
    sweep("checkpoint dir", open_path, dir, MMRT_OK);
    fmt(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    /* Failing paths too: the merge error after everything was allocated. */
    write_text("sweep/model.safetensors.index.json",
               "{'weight_map':{'a.weight':'s-1.safetensors','a.bias':'s-1.safetensors',"
               "'a.empty':'s-1.safetensors','b.weight':'s-2.safetensors'}}");
    sweep("index disagreeing", open_path, idx, MMRT_ERR_FORMAT);
    g_sweep_len = build("{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                        "'b':{'dtype':'F32','shape':[1],'data_offsets':[2,6]}}", 6);
    sweep("overlap", parse_mem, g_buf, MMRT_ERR_FORMAT);
}

/* ---- files written by the Python reference writer ---- */

static const char *fixture(const char *rel)
{
    static char p[512];
    const char *src = getenv("MMRT_SOURCE_DIR");
    fmt(p, sizeof p, "%s/tests/fixtures/safetensors/%s", src ? src : ".", rel);
    return p;
}

static void test_reference_fixtures(void **state)
{
    (void)state;
    struct mmrt_safetensors *st = open_ok(fixture("numpy.safetensors"), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 5);
    float w[24];
    for (int i = 0; i < 24; i++)
        w[i] = (float)i * 0.5f - 3.0f;
    expect_shape(mmrt_safetensors_find(st, "weight"), MMRT_DTYPE_F32, 3, 2, 3, 4);
    expect_values(st, "weight", w, 24);
    const float bias[3] = {-1.25f, 0.0f, 7.0f}, scalar = 2.5f;
    expect_values(st, "bias", bias, 3);
    expect_shape(mmrt_safetensors_find(st, "scalar"), MMRT_DTYPE_F32, 0);
    expect_values(st, "scalar", &scalar, 1);
    expect_shape(mmrt_safetensors_find(st, "half"), MMRT_DTYPE_F16, 1, 12);
    expect_bits(st, "half", F16_OUT, 12);
    expect_shape(mmrt_safetensors_find(st, "empty"), MMRT_DTYPE_F32, 2, 0, 5);
    mmrt_safetensors_close(st);

    st = open_ok(fixture("bf16.safetensors"), NULL);
    assert_int_equal(mmrt_safetensors_count(st), 2);
    expect_shape(mmrt_safetensors_find(st, "bf"), MMRT_DTYPE_BF16, 2, 2, 4);
    uint32_t bf_out[8];
    for (int i = 0; i < 8; i++)
        bf_out[i] = (uint32_t)BF16_IN[i] << 16;
    expect_bits(st, "bf", bf_out, 8);
    const float f[3] = {1.0f, -2.0f, 0.375f};
    expect_values(st, "f32", f, 3);
    mmrt_safetensors_close(st);

    /* The sharded set, through the directory (no model.safetensors there). */
    char dir[512];
    fmt(dir, sizeof dir, "%s", fixture("sharded"));
    g_mmap_calls = 0;
    st = open_ok(dir, NULL);
    assert_int_equal(g_mmap_calls, 2);
    assert_int_equal(mmrt_safetensors_count(st), 5);
    float aw[6];
    for (int i = 0; i < 6; i++)
        aw[i] = (float)i + 0.25f;
    expect_values(st, "a.weight", aw, 6);
    const float ab[2] = {1, 2}, bw[4] = {-0.0f, -1.5f, -3, -4.5f}, bb = 0.5f, cs = -4;
    expect_values(st, "a.bias", ab, 2);
    expect_shape(mmrt_safetensors_find(st, "b.weight"), MMRT_DTYPE_F16, 1, 4);
    expect_values(st, "b.weight", bw, 4);
    expect_values(st, "b.bias", &bb, 1);
    expect_values(st, "c.scale", &cs, 1);
    assert_non_null(strstr(mmrt_safetensors_find(st, "c.scale")->file,
                           "sharded/model-00002-of-00002.safetensors"));
    mmrt_safetensors_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_single_file),
        cmocka_unit_test(test_valid_edge_files),
        cmocka_unit_test(test_read_f32_args),
        cmocka_unit_test(test_s1_header_length),
        cmocka_unit_test(test_s2_json),
        cmocka_unit_test(test_s3_dtype),
        cmocka_unit_test(test_s3_integer_dtypes),
        cmocka_unit_test(test_s3_shape),
        cmocka_unit_test(test_s4_offsets),
        cmocka_unit_test(test_s5_tiling),
        cmocka_unit_test(test_s6_metadata),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_s8_files),
        cmocka_unit_test(test_s9_index_valid),
        cmocka_unit_test(test_s9_index_hostile),
        cmocka_unit_test(test_many_zero_size_tensors),
        cmocka_unit_test(test_alloc_failure_sweep),
        cmocka_unit_test(test_reference_fixtures),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
