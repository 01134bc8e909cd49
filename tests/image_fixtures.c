/* tests/image_fixtures.c — see image_fixtures.h. */
#include "image_fixtures.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jpeglib.h>
#include <zlib.h>

const char *fx_path(const char *name)
{
    static char buf[4096];
    const char *root = getenv("MMRT_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s%stests/fixtures/images/%s", root ? root : "",
             root ? "/" : "", name);
    return buf;
}

uint8_t *fx_read(const char *name, size_t *len)
{
    const char *path = fx_path(name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

float *fx_read_f32(const char *name, size_t n)
{
    /* gzread passes non-gzip files through unchanged */
    gzFile g = gzopen(fx_path(name), "rb");
    if (!g)
        fail_msg("cannot open fixture %s", fx_path(name));
    float *buf = malloc(n * sizeof *buf + 1);
    assert_non_null(buf);
    uint8_t *raw = (uint8_t *)buf;
    size_t got = 0;
    for (;;) {
        int r = gzread(g, raw + got, (unsigned)(n * sizeof *buf + 1 - got));
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got > n * sizeof *buf)
            break;
    }
    gzclose(g);
    if (got != n * sizeof *buf)
        fail_msg("%s: %zu bytes, expected %zu", name, got, n * sizeof *buf);
    for (size_t i = 0; i < n; i++) { /* little-endian on disk */
        uint32_t u = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                     (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
        memcpy(&buf[i], &u, 4);
    }
    return buf;
}

json_t *fx_manifest(void)
{
    json_t *root = NULL;
    struct mmrt_error err = {0};
    if (mmrt_json_load_file(fx_path("manifest.json"), 1 << 20, 16, &root, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    return root;
}

const char *fx_str(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        fail_msg("manifest: missing string \"%s\"", key);
    return json_string_value(v);
}

long long fx_int(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        fail_msg("manifest: missing integer \"%s\"", key);
    return json_integer_value(v);
}

/* A growing byte buffer for hand-built files. */
struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
    if (n == 0)
        return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_be32(struct buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put(b, x, 4);
}

static void put_chunk(struct buf *b, const char *type, const uint8_t *d, size_t n)
{
    put_be32(b, (uint32_t)n);
    put(b, type, 4);
    put(b, d, n);
    uLong crc = crc32(0, (const Bytef *)type, 4);
    if (n)
        crc = crc32(crc, d, (uInt)n);
    put_be32(b, (uint32_t)crc);
}

uint8_t *fx_make_png(uint32_t w, uint32_t h, uint32_t rows, const uint8_t *rgb,
                         const uint8_t *exif, size_t exif_n, size_t *len)
{
    struct buf b = {0};
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    put(&b, sig, 8);
    uint8_t ihdr[13] = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w,
                        (uint8_t)(h >> 24), (uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h,
                        8, 2, 0, 0, 0};
    put_chunk(&b, "IHDR", ihdr, 13);
    if (exif)
        put_chunk(&b, "eXIf", exif, exif_n);
    size_t raw_n = (size_t)rows * (1 + (size_t)w * 3);
    uint8_t *raw = calloc(raw_n ? raw_n : 1, 1);
    assert_non_null(raw);
    for (uint32_t y = 0; y < rows && rgb; y++)
        memcpy(raw + (size_t)y * (1 + w * 3) + 1, rgb + (size_t)y * w * 3, (size_t)w * 3);
    uLongf zn = compressBound(raw_n);
    uint8_t *z = malloc(zn);
    assert_non_null(z);
    assert_int_equal(compress2(z, &zn, raw, raw_n, 9), Z_OK);
    put_chunk(&b, "IDAT", z, zn);
    put_chunk(&b, "IEND", NULL, 0);
    free(raw);
    free(z);
    *len = b.n;
    return b.p;
}

/* libjpeg writes into this buffer (big enough for the small images tests make); a larger
 * image would make jpeg_mem_dest allocate with libjpeg's own malloc, which a test that wraps
 * malloc cannot free, so that fails the test instead. */
#define FX_JPEG_CAP (1u << 20)

uint8_t *fx_make_jpeg(uint32_t w, uint32_t h, const uint8_t *rgb, const uint8_t *app1,
                      size_t app1_n, size_t *len)
{
    assert_true(app1_n <= 65533);
    unsigned char *out = malloc(FX_JPEG_CAP), *given = out;
    assert_non_null(out);
    unsigned long n = FX_JPEG_CAP;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = w;
    c.image_height = h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    for (int i = 0; i < c.num_components; i++) /* 4:4:4 */
        c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    if (app1)
        jpeg_write_marker(&c, JPEG_APP0 + 1, app1, (unsigned)app1_n);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(rgb + (size_t)c.next_scanline * w * 3);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    if (out != given)
        fail_msg("fx_make_jpeg: %ux%u does not fit %u bytes", w, h, FX_JPEG_CAP);
    *len = n;
    return out;
}

size_t fx_exif_orientation(int orientation, bool big_endian, uint8_t *out)
{
    /* "Exif\0\0", then TIFF: byte order, 42, IFD0 at 8; one entry: 0x0112 SHORT count 1 */
    static const uint8_t le[] = {'E', 'x', 'i', 'f', 0, 0, 'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0,
                                 0x12, 0x01, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t be[] = {'E', 'x', 'i', 'f', 0, 0, 'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1,
                                 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    memcpy(out, big_endian ? be : le, sizeof le);
    out[big_endian ? 25 : 24] = (uint8_t)orientation;
    return sizeof le;
}
